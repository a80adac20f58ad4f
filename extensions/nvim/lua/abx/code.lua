-- :[range]Abx code [SANDBOX]: run the lines (the range, else the whole buffer) in a code
-- context of the sandbox with code/run (the default context of the buffer's language:
-- python, javascript or bash), streaming its output, results and error into a scratch
-- buffer as code/output notifications arrive. Variables persist between runs. <C-c> in that
-- buffer interrupts the code ($/cancelRequest; the context keeps its state).
local abx = require("abx")
local util = require("abx.util")

local M = {}

local ns = vim.api.nvim_create_namespace("abx_code")
local counter = 0

-- state per buffer: {sandbox, run_id, request, done, result}
M.state = {}

--- code/run's language for a filetype (nil: the broker's default, python).
function M.language_of(ft)
  if ft == "python" then
    return "python"
  elseif ft == "javascript" or ft == "javascriptreact" then
    return "javascript"
  elseif ft == "sh" or ft == "bash" or ft == "zsh" then
    return "bash"
  end
  return nil
end

--- A result bundle as text: its text/plain, else the MIME types it has.
function M.result_text(b)
  local t = util.v(b["text/plain"])
  if type(t) == "string" then
    return t
  end
  local kinds = {}
  for k, _ in pairs(b) do
    kinds[#kinds + 1] = k
  end
  table.sort(kinds)
  return "[" .. table.concat(kinds, ", ") .. "]"
end

local function append(buf, text, hl)
  if not vim.api.nvim_buf_is_valid(buf) or text == "" then
    return
  end
  local parts = vim.split(text, "\n", { plain = true })
  vim.api.nvim_buf_set_option(buf, "modifiable", true)
  local count = vim.api.nvim_buf_line_count(buf)
  local last = vim.api.nvim_buf_get_lines(buf, count - 1, count, false)[1] or ""
  parts[1] = last .. parts[1]
  vim.api.nvim_buf_set_lines(buf, count - 1, count, false, parts)
  vim.api.nvim_buf_set_option(buf, "modifiable", false)
  vim.api.nvim_buf_set_option(buf, "modified", false)
  if hl then
    for l = count - 1, count - 2 + #parts do
      vim.api.nvim_buf_add_highlight(buf, ns, hl, l, 0, -1)
    end
  end
end

--- A line of its own (after whatever is on the last line).
local function line(buf, text, hl)
  if not vim.api.nvim_buf_is_valid(buf) then
    return
  end
  local count = vim.api.nvim_buf_line_count(buf)
  if (vim.api.nvim_buf_get_lines(buf, count - 1, count, false)[1] or "") ~= "" then
    append(buf, "\n")
  end
  append(buf, text .. "\n", hl)
end

--- Run `code` in `sandbox`, streaming into a new scratch buffer (shown with config.split).
--- opts: language, context, timeout (s), on_done(result, err). Returns the buffer.
function M.run(sandbox, code, opts)
  opts = opts or {}
  counter = counter + 1
  local buf = util.scratch(string.format("abx-code://%s/%d", sandbox, counter), "abxcode")
  vim.api.nvim_buf_set_var(buf, "abx_sandbox", sandbox)
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, { string.format(">>> [%s%s]", sandbox, opts.language and (" " .. opts.language) or ""), "" })
  vim.api.nvim_buf_add_highlight(buf, ns, "Title", 0, 0, -1)
  vim.api.nvim_buf_set_option(buf, "modifiable", false)
  local run_id = string.format("nvim-%d-%d", vim.fn.getpid(), counter)
  local st = { sandbox = sandbox, run_id = run_id, done = false }
  M.state[buf] = st
  abx.set_current(sandbox)
  local client = abx.client()
  local off = client:on("code/output", function(p)
    if p.runId ~= run_id or st.done then
      return
    end
    if p.type == "stdout" then
      append(buf, util.v(p.text) or "")
    elseif p.type == "stderr" then
      append(buf, util.v(p.text) or "", "ErrorMsg")
    elseif p.type == "result" and util.v(p.result) then
      line(buf, M.result_text(p.result))
    elseif p.type == "error" and util.v(p.error) then
      local e = p.error
      local tb = util.v(e.traceback) or ""
      line(buf, (tb ~= "" and tb:gsub("\n$", "") or ((util.v(e.name) or "") .. ": " .. (util.v(e.value) or ""))), "ErrorMsg")
    elseif p.type == "restarted" then
      line(buf, "[" .. (util.v(p.text) or "the context was restarted") .. "]", "WarningMsg")
    end
  end)
  local params = {
    sandbox = sandbox,
    code = code,
    language = opts.language,
    context = opts.context,
    timeout = tonumber(opts.timeout),
    runId = run_id,
  }
  st.request = client:request("code/run", params, function(err, res)
    off()
    st.done = true
    if err then
      line(buf, util.format_error(err), "WarningMsg")
    else
      st.result = res
      local e = util.v(res.error)
      line(
        buf,
        string.format("[%s #%s%s%s]", res.context, tostring(res.executionCount), res.timedOut and ", timed out" or "", e and (", " .. e.name) or ""),
        e and "WarningMsg" or "Comment"
      )
      if vim.api.nvim_buf_is_valid(buf) then
        vim.api.nvim_buf_set_var(buf, "abx_code_error", e and e.name or "")
      end
    end
    if vim.api.nvim_buf_is_valid(buf) then
      vim.api.nvim_buf_set_var(buf, "abx_code_done", true)
    end
    if opts.on_done then
      pcall(opts.on_done, res, err)
    end
  end)
  vim.api.nvim_buf_set_keymap(buf, "n", "<C-c>", "", {
    noremap = true,
    silent = true,
    callback = function()
      M.interrupt(buf)
    end,
  })
  vim.api.nvim_create_autocmd("BufWipeout", {
    buffer = buf,
    once = true,
    callback = function()
      M.interrupt(buf)
      M.state[buf] = nil
    end,
  })
  util.show_buffer(buf, abx.config.split)
  return buf
end

--- Interrupt the code of `buf` (default: the current buffer): $/cancelRequest.
function M.interrupt(buf)
  buf = (buf == nil or buf == 0) and vim.api.nvim_get_current_buf() or buf
  local st = M.state[buf]
  if st and st.request and not st.done then
    abx.client():cancel(st.request)
    return true
  end
  return false
end

--- :[range]Abx code [SANDBOX]: the lines of the current buffer (o.range > 0: o.line1 to
--- o.line2; else all of it).
function M.command(sandbox, o)
  local src = vim.api.nvim_get_current_buf()
  local first, last = 1, vim.api.nvim_buf_line_count(src)
  if o and o.range and o.range > 0 then
    first, last = o.line1, o.line2
  end
  local code = table.concat(vim.api.nvim_buf_get_lines(src, first - 1, last, false), "\n")
  if not code:match("%S") then
    return util.notify("Nothing to run: the lines are empty.", vim.log.levels.WARN)
  end
  local language = M.language_of(vim.api.nvim_buf_get_option(src, "filetype"))
  require("abx.actions").with_sandbox(sandbox, "Run code in", function(id)
    M.run(id, code, { language = language })
  end)
end

return M
