-- :Abx exec: output streamed into a scratch buffer as it arrives, stderr marked, exit
-- status, kill, errors.
local T = require("harness")
local abx = require("abx")
local exec = require("abx.exec")

local function done(buf)
  return T.bufvar(buf, "abx_exec_done")
end

T.test("output reaches the buffer while the command still runs", function()
  local id = T.sandbox()
  local cmd = "echo first; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo second"
  vim.cmd("Abx exec " .. id .. " " .. cmd)
  local buf = T.wait(function()
    return T.find_buf("^abx%-exec://" .. vim.pesc(id) .. "/")
  end, "the exec buffer")
  T.eq(buf, vim.api.nvim_win_get_buf(0), "shown in the current window")
  T.wait(function()
    return vim.tbl_contains(T.lines(buf), "first")
  end, "'first' in the buffer")
  T.eq(nil, done(buf), "still running after the first line")
  T.ok(not vim.tbl_contains(T.lines(buf), "second"), "'second' before /tmp/go exists")
  T.write_file(id, "/tmp/go", "")
  T.wait(function()
    return done(buf)
  end, "the exit")
  T.eq({ "$ " .. cmd, "first", "second", "[exit 0]" }, T.lines(buf))
  T.eq(0, T.bufvar(buf, "abx_exit_code"))
  T.eq(false, vim.api.nvim_buf_get_option(buf, "modifiable"))
  T.eq("nofile", vim.api.nvim_buf_get_option(buf, "buftype"))
end)

T.test("stderr lines are highlighted; the exit code is shown", function()
  local id = T.sandbox()
  local buf = exec.run(id, "echo out; echo err >&2; exit 3")
  T.wait(function()
    return done(buf)
  end, "the exit")
  local lines = T.lines(buf)
  T.ok(vim.tbl_contains(lines, "out"), "stdout line")
  T.ok(vim.tbl_contains(lines, "err"), "stderr line")
  T.eq("[exit 3]", lines[#lines])
  T.eq(3, T.bufvar(buf, "abx_exit_code"))
  local errline
  for i, l in ipairs(lines) do
    if l == "err" then
      errline = i - 1
    end
  end
  local ns = vim.api.nvim_create_namespace("abx_exec")
  local marks = vim.api.nvim_buf_get_extmarks(buf, ns, { errline, 0 }, { errline, -1 }, { details = true })
  local hl = {}
  for _, m in ipairs(marks) do
    hl[#hl + 1] = m[4].hl_group
  end
  T.ok(vim.tbl_contains(hl, "ErrorMsg"), "ErrorMsg on the stderr line, got " .. vim.inspect(hl))
end)

T.test("partial lines are joined; bytes that are not UTF-8 arrive intact", function()
  local id = T.sandbox()
  local buf = exec.run(id, "printf 'ab'; printf 'cd\\n'; printf 'x\\377y\\n'; pwd")
  T.wait(function()
    return done(buf)
  end, "the exit")
  T.eq({ "$ printf 'ab'; printf 'cd\\n'; printf 'x\\377y\\n'; pwd", "abcd", "x\255y", "/workspace", "[exit 0]" }, T.lines(buf))
end)

local function running(id, pattern)
  local r = abx.call_sync("process/list", { sandbox = id })
  for _, p in ipairs(r and r.processes or {}) do
    if tostring(p.command):find(pattern, 1, true) then
      return true
    end
  end
  return false
end

local function ctrl_c()
  -- typed through the buffer's mapping (nvim_input's Ctrl-C would be taken as an interrupt)
  vim.api.nvim_feedkeys(vim.api.nvim_replace_termcodes("<C-c>", true, false, true), "mx", false)
end

T.test("Ctrl-C in the buffer interrupts the command", function()
  local id = T.sandbox()
  local buf = exec.run(id, "echo started; sleep 300")
  -- once sleep runs (an INT that lands while sh is still forking it can be lost; a second
  -- Ctrl-C is for that, see the next test)
  T.wait(function()
    return running(id, "sleep 300")
  end, "sleep to run")
  vim.api.nvim_set_current_buf(buf)
  ctrl_c()
  T.eq(1, exec.state[buf].interrupts, "the mapping sent exec/kill")
  T.wait(function()
    return done(buf)
  end, "the exit after Ctrl-C")
  local last = T.lines(buf)[#T.lines(buf)]
  T.ok(last:find("SIGINT", 1, true) or last:find("exit 130", 1, true), "interrupted: " .. last)
end)

T.test("a second Ctrl-C kills a command that ignores SIGINT", function()
  local id = T.sandbox()
  local buf = exec.run(id, "trap '' INT; echo started; sleep 300")
  T.wait(function()
    return running(id, "sleep 300")
  end, "sleep to run")
  vim.api.nvim_set_current_buf(buf)
  ctrl_c()
  ctrl_c()
  T.eq(2, exec.state[buf].interrupts)
  T.wait(function()
    return done(buf)
  end, "the exit after the second Ctrl-C")
  local last = T.lines(buf)[#T.lines(buf)]
  T.ok(last:find("KILL", 1, true) or last:find("exit 137", 1, true), "killed: " .. last)
end)

T.test("a failing exec/start is shown with its E-code", function()
  vim.cmd("Abx exec no-such-sandbox echo hi")
  T.wait_note("[E2009]")
  local buf = T.find_buf("^abx%-exec://no%-such%-sandbox/")
  T.ok(buf, "the exec buffer")
  T.contains(T.text(buf), "[E2009] Sandbox 'no-such-sandbox' not found.")
end)

T.test(":Abx exec without a command asks for one", function()
  local id = T.sandbox()
  T.stub_input({ "echo from-input" })
  vim.cmd("Abx exec " .. id)
  local buf = T.wait(function()
    return T.find_buf("^abx%-exec://" .. vim.pesc(id) .. "/")
  end, "the exec buffer")
  T.wait(function()
    return done(buf)
  end, "the exit")
  T.ok(vim.tbl_contains(T.lines(buf), "from-input"), "output of the asked command")
end)

local function kill_bridge()
  local client = abx.client()
  local old = client.job
  T.ok(old, "a running bridge")
  vim.loop.kill(vim.fn.jobpid(old), "sigkill")
  T.wait(function()
    return client.job ~= nil and client.job ~= old
  end, "a new bridge")
  return client
end

T.test("after the abx rpc bridge dies the exec buffer is re-attached and gets the output made afterwards", function()
  local id = T.sandbox()
  local cmd = "echo first; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo second"
  local buf = exec.run(id, cmd)
  T.wait(function()
    return vim.tbl_contains(T.lines(buf), "first")
  end, "'first' in the buffer")
  kill_bridge()
  T.wait(function()
    return (exec.state[buf].reattached or 0) == 1
  end, "exec/attach to answer")
  T.eq(nil, done(buf), "still running after the bridge restarted")
  T.write_file(id, "/tmp/go", "")
  T.wait(function()
    return done(buf)
  end, "the exit")
  T.eq({ "$ " .. cmd, "first", "second", "[exit 0]" }, T.lines(buf))
  T.eq(0, T.bufvar(buf, "abx_exit_code"))
end)

-- The next bridge waits for a gate file, so the command goes on while none listens; another
-- client (the CLI) drives the command meanwhile.
local function hold_next_bridge(client)
  local gate = vim.fn.tempname()
  local cmd = client.cmd
  client.cmd = { "sh", "-c", 'while [ ! -e "$1" ]; do sleep 0.05; done; exec "$0" rpc', T.abx_bin, gate }
  local old = client.job
  vim.loop.kill(vim.fn.jobpid(old), "sigkill")
  T.wait(function()
    return client.job ~= nil and client.job ~= old
  end, "the next bridge (held at its gate)")
  client.cmd = cmd
  return function()
    vim.fn.writefile({}, gate)
  end
end

local function cli(id, command)
  local out = vim.fn.system({ T.abx_bin, "exec", id, command })
  return vim.v.shell_error, out
end

local function wait_file(id, path)
  T.wait(function()
    return cli(id, "test -e " .. path) == 0
  end, path .. " in the sandbox")
end

T.test("output made while no bridge listened is replayed after the restart", function()
  local id = T.sandbox()
  local client = abx.client()
  local cmd = "echo first; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo second; touch /tmp/mid; "
    .. "while [ ! -e /tmp/go2 ]; do sleep 0.05; done; echo third; echo fourth; touch /tmp/done"
  local buf = exec.run(id, cmd)
  T.wait(function()
    return vim.tbl_contains(T.lines(buf), "first")
  end, "'first' in the buffer")
  local open_gate = hold_next_bridge(client)
  T.eq(0, (cli(id, "touch /tmp/go")))
  wait_file(id, "/tmp/mid")
  -- (the broker hands the first notification after a client died to that dead connection,
  -- where it is lost; what follows is kept for exec/attach: 'second' is not asserted)
  T.eq(0, (cli(id, "touch /tmp/go2")))
  wait_file(id, "/tmp/done")
  T.eq(nil, done(buf), "nothing arrived while detached")
  open_gate()
  T.wait(function()
    return done(buf)
  end, "the exit, replayed")
  local lines = T.lines(buf)
  T.eq({ "third", "fourth", "[exit 0]" }, { lines[#lines - 2], lines[#lines - 1], lines[#lines] })
  T.eq(1, exec.state[buf].reattached)
end)

T.test("an exec that ends silently while no bridge listens still ends its buffer", function()
  local id = T.sandbox()
  local client = abx.client()
  local buf = exec.run(id, "echo first; while [ ! -e /tmp/go ]; do sleep 0.05; done; rm /tmp/go")
  T.wait(function()
    return vim.tbl_contains(T.lines(buf), "first")
  end, "'first' in the buffer")
  local open_gate = hold_next_bridge(client)
  T.eq(0, (cli(id, "touch /tmp/go")))
  T.wait(function()
    return cli(id, "test ! -e /tmp/go") == 0
  end, "the command to reach its end while detached")
  open_gate()
  T.wait(function()
    return done(buf)
  end, "the buffer to end")
  -- (the broker hands an exit sent right after a client died to that dead connection and
  -- forgets the exec, so exec/attach answers E3002: the buffer says so instead of waiting)
  local last = T.lines(buf)[#T.lines(buf)]
  T.ok(last == "[exit 0]" or last:find("^%[connection to the broker lost: ") ~= nil, "ended with: " .. last)
end)
