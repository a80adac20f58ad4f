-- :[range]Abx code: the lines run in the sandbox's default context of the buffer's language
-- (code/run), output and results streamed into a scratch buffer, state kept between runs,
-- errors shown with their traceback, <C-c> interrupts and keeps the context.
local T = require("harness")
local code = require("abx.code")

local function done(buf)
  return T.bufvar(buf, "abx_code_done")
end

local function source(ft, lines)
  vim.cmd("enew")
  local b = vim.api.nvim_get_current_buf()
  vim.api.nvim_buf_set_option(b, "buftype", "nofile")
  vim.api.nvim_buf_set_lines(b, 0, -1, false, lines)
  vim.api.nvim_buf_set_option(b, "filetype", ft)
  return b
end

local function run_cmd(cmd, id)
  vim.cmd(cmd)
  return T.wait(function()
    local b = vim.api.nvim_get_current_buf()
    local name = vim.api.nvim_buf_get_name(b)
    return name:match("^abx%-code://" .. vim.pesc(id) .. "/") and b
  end, "the code buffer of " .. cmd)
end

T.test("languages and result text", function()
  T.eq("python", code.language_of("python"))
  T.eq("bash", code.language_of("sh"))
  T.eq("javascript", code.language_of("javascript"))
  T.eq(nil, code.language_of("markdown"))
  T.eq("42", code.result_text({ ["text/plain"] = "42" }))
  T.eq("[image/png]", code.result_text({ ["image/png"] = "iVBO" }))
end)

T.test("a range runs in the default python context; state is kept", function()
  local id = T.sandbox()
  local src = source("python", { "x = 6", "print('hi')", "x * 7", "x = 100" })
  local buf = run_cmd("1,3Abx code " .. id, id)
  T.wait(function()
    return done(buf)
  end, "the run")
  T.eq({ ">>> [" .. id .. " python]", "hi", "42", "[default-python #1]", "" }, T.lines(buf))
  T.eq("", T.bufvar(buf, "abx_code_error"))
  -- the whole buffer without a range: line 4 ran, so x is 100 now
  vim.api.nvim_set_current_buf(src)
  local buf2 = run_cmd("Abx code " .. id, id)
  T.wait(function()
    return done(buf2)
  end, "the second run")
  vim.api.nvim_set_current_buf(src)
  vim.api.nvim_buf_set_lines(src, 0, -1, false, { "x" })
  local buf3 = run_cmd("Abx code " .. id, id)
  T.wait(function()
    return done(buf3)
  end, "the third run")
  T.contains(T.text(buf3), "\n100\n")
  T.contains(T.text(buf3), "[default-python #3]")
end)

T.test("an error shows its traceback; bash keeps its variables", function()
  local id = T.sandbox()
  source("python", { "def f():", "    raise ValueError('bad')", "f()" })
  local buf = run_cmd("Abx code " .. id, id)
  T.wait(function()
    return done(buf)
  end, "the run")
  T.contains(T.text(buf), "Traceback (most recent call last):")
  T.contains(T.text(buf), "ValueError: bad")
  T.eq("ValueError", T.bufvar(buf, "abx_code_error"))
  source("sh", { "V=kept" })
  local b1 = run_cmd("Abx code " .. id, id)
  T.wait(function()
    return done(b1)
  end, "bash 1")
  source("sh", { 'echo "[$V]"' })
  local b2 = run_cmd("Abx code " .. id, id)
  T.wait(function()
    return done(b2)
  end, "bash 2")
  T.contains(T.text(b2), "\n[kept]\n")
  T.contains(T.text(b2), "[default-bash #2]")
end)

T.test("<C-c> interrupts the code and the context keeps its state", function()
  local id = T.sandbox()
  local seen = false
  local buf = code.run(id, "import time\nkept = 1\nprint('go', flush=True)\ntime.sleep(60)\nkept = 2", {
    on_done = function()
      seen = true
    end,
  })
  T.wait(function()
    return T.text(buf):find("\ngo\n", 1, true)
  end, "the cell running")
  T.ok(code.interrupt(buf), "an interrupt was sent")
  T.wait(function()
    return seen
  end, "the cancelled run's answer")
  local buf2 = code.run(id, "kept")
  T.wait(function()
    return done(buf2)
  end, "the next run")
  T.contains(T.text(buf2), "\n1\n")
end)
