-- :Abx terminal: a terminal buffer on a pty exec. Keys typed in terminal mode reach the
-- sandbox's shell (exec/write), its output the buffer (exec/output), a window resize the
-- pty (exec/resize), and the exit status shows when the shell ends.
local T = require("harness")
local term = require("abx.terminal")

local function text(buf)
  return T.text(buf)
end

T.test("typed keys reach the sandbox shell and its output the terminal buffer", function()
  local id = T.sandbox()
  T.reset_config({ shell = "exec sh -i" })
  vim.cmd("Abx terminal " .. id)
  local buf = vim.api.nvim_get_current_buf()
  T.eq("terminal", vim.bo[buf].buftype)
  T.contains(vim.api.nvim_buf_get_name(buf), "abx-term://" .. id .. "/")
  T.wait(function()
    return T.bufvar(buf, "abx_exec_id")
  end, "the pty exec to start")
  T.wait(function()
    return vim.api.nvim_get_mode().mode == "t"
  end, "terminal mode")
  -- typed, as a user would: nvim_input goes through terminal mode to on_input
  vim.api.nvim_input("echo abx-$((6*7)) in $PWD<CR>")
  T.wait(function()
    return text(buf):find("abx%-42 in /workspace") ~= nil
  end, "the shell's answer in the terminal buffer")
  vim.api.nvim_input("exit 5<CR>")
  T.wait(function()
    return T.bufvar(buf, "abx_exec_done")
  end, "the shell to exit")
  T.eq(5, T.bufvar(buf, "abx_exit_code"))
  T.wait(function()
    return text(buf):find("[exit 5]", 1, true) ~= nil
  end, "the exit line in the buffer")
end)

T.test("resizing the window resizes the pty (exec/resize)", function()
  local id = T.sandbox()
  local buf = term.open(id, "exec sh -i", { insert = false })
  T.wait(function()
    return T.bufvar(buf, "abx_exec_id")
  end, "the pty exec to start")
  local cols = vim.api.nvim_win_get_width(0)
  vim.cmd("resize 9")
  T.wait(function()
    return term.state[buf].rows == 9
  end, "the resize autocommand to send exec/resize")
  term.send(buf, "stty size\r")
  T.wait(function()
    return text(buf):find("9 " .. cols, 1, true) ~= nil
  end, "stty size to report 9 " .. cols)
  vim.cmd("resize 12")
  T.wait(function()
    return term.state[buf].rows == 12
  end, "the second resize")
  term.send(buf, "stty size\r")
  T.wait(function()
    return text(buf):find("12 " .. cols, 1, true) ~= nil
  end, "stty size to report 12 " .. cols)
end)

T.test("wiping the terminal buffer hangs the session up", function()
  local id = T.sandbox()
  local buf = term.open(id, "exec sh -i", { insert = false })
  T.wait(function()
    return T.bufvar(buf, "abx_exec_id")
  end, "the pty exec to start")
  term.send(buf, "sleep 300\r")
  local abx = require("abx")
  local function sleeping()
    local r = abx.call_sync("process/list", { sandbox = id })
    for _, p in ipairs(r and r.processes or {}) do
      if tostring(p.command):find("sleep 300", 1, true) then
        return true
      end
    end
    return false
  end
  T.wait(sleeping, "sleep to run")
  vim.api.nvim_buf_delete(buf, { force = true })
  T.wait(function()
    return not sleeping()
  end, "the session's processes to end")
end)

T.test("a terminal on a missing sandbox shows the error", function()
  local buf = term.open("no-such-sandbox", nil, { insert = false })
  T.wait_note("[E2009]")
  T.wait(function()
    return T.bufvar(buf, "abx_exec_done")
  end, "the terminal to end")
end)

T.test("a terminal keeps its session when the abx rpc bridge dies (exec/attach)", function()
  local id = T.sandbox()
  local buf = term.open(id, "exec sh -i", { insert = false })
  T.wait(function()
    return T.bufvar(buf, "abx_exec_id")
  end, "the pty exec to start")
  term.send(buf, "echo before-$((1+1))\r")
  T.wait(function()
    return text(buf):find("before-2", 1, true) ~= nil
  end, "the shell's first answer")
  local client = require("abx").client()
  local old = client.job
  vim.loop.kill(vim.fn.jobpid(old), "sigkill")
  -- typed at once: held until the session is re-attached, then sent
  T.wait(function()
    return client.job ~= old
  end, "the old bridge to be gone")
  term.send(buf, "echo after-$((2+2))\r")
  T.wait(function()
    return text(buf):find("after-4", 1, true) ~= nil
  end, "the shell's answer after the restart")
  T.eq(1, term.state[buf].reattached)
  T.eq(nil, T.bufvar(buf, "abx_exec_done"))
  term.send(buf, "exit 3\r")
  T.wait(function()
    return T.bufvar(buf, "abx_exec_done")
  end, "the shell to exit")
  T.eq(3, T.bufvar(buf, "abx_exit_code"))
  T.not_contains(text(buf), "connection to the broker lost")
end)
