-- :checkhealth abx and :help abx.
local T = require("harness")

T.test(":checkhealth abx reports the binary, the broker and the providers", function()
  vim.cmd("checkhealth abx")
  local buf = vim.api.nvim_get_current_buf()
  local text = T.text(buf)
  T.contains(text, "The abx binary")
  T.contains(text, "abx 0.")
  T.contains(text, "The broker")
  T.contains(text, "broker 0.")
  T.contains(text, "local  Local sandboxes")
  T.contains(text, "OK")
  T.not_contains(text, "ERROR")
  T.not_contains(text, "Failed to run healthcheck")
end)

T.test(":checkhealth abx reports a missing binary as an error", function()
  require("abx").setup({ abx = "/nonexistent/abx" })
  vim.cmd("checkhealth abx")
  local text = T.text(vim.api.nvim_get_current_buf())
  T.contains(text, "ERROR")
  T.contains(text, "'/nonexistent/abx' is not executable")
end)

T.test(":help abx opens doc/abx.txt; every tag resolves", function()
  -- helptags into a copy, so the source tree stays clean
  local dir = vim.fn.tempname()
  vim.fn.mkdir(dir .. "/doc", "p")
  vim.fn.writefile(vim.fn.readfile(T.root .. "/doc/abx.txt", "b"), dir .. "/doc/abx.txt", "b")
  vim.cmd("helptags " .. vim.fn.fnameescape(dir .. "/doc"))
  vim.opt.runtimepath:prepend(dir)
  local tags = vim.fn.readfile(dir .. "/doc/tags")
  T.ok(#tags >= 10, "at least ten tags, got " .. #tags)
  for _, want in ipairs({ "abx", "abx.txt", ":Abx", "abx-setup", "abx-commands", "abx://", "abx-health" }) do
    local found = false
    for _, l in ipairs(tags) do
      found = found or vim.startswith(l, want .. "\t")
    end
    T.ok(found, "tag " .. want)
  end
  for _, l in ipairs(tags) do
    local tag = l:match("^([^\t]+)")
    vim.cmd("help " .. vim.fn.escape(tag, " "))
    T.eq("help", vim.bo.buftype, "help " .. tag)
    T.contains(vim.api.nvim_buf_get_name(0), "abx.txt")
    vim.cmd("close")
  end
end)
