-- :Abx exec: run a command with exec/start and stream its output into a scratch buffer as
-- exec/output notifications arrive; exec/exit ends it with a status line.
local abx = require("abx")
local util = require("abx.util")

local M = {}

local ns = vim.api.nvim_create_namespace("abx_exec")
local counter = 0

-- state per buffer: {sandbox, command, exec_id, done, exit, open}
M.state = {}

local function split_lines(s)
  local out, pos = {}, 1
  while true do
    local i = s:find("\n", pos, true)
    if not i then
      out[#out + 1] = s:sub(pos)
      return out
    end
    out[#out + 1] = s:sub(pos, i - 1)
    pos = i + 1
  end
end

local function set_var(buf, name, value)
  if vim.api.nvim_buf_is_valid(buf) then
    vim.api.nvim_buf_set_var(buf, name, value)
  end
end

--- Append `text` to the buffer: the last line is the one output continues on, unless
--- another stream left it unfinished (then `text` starts a new line).
local function append(buf, text, hl, st, stream)
  if not vim.api.nvim_buf_is_valid(buf) then
    return
  end
  text = text:gsub("\r\n", "\n")
  local parts = split_lines(text)
  local broke = false
  if st then
    local count0 = vim.api.nvim_buf_line_count(buf)
    local last0 = vim.api.nvim_buf_get_lines(buf, count0 - 1, count0, false)[1] or ""
    if last0 ~= "" and st.open_stream and st.open_stream ~= stream then
      table.insert(parts, 1, "")
      broke = true
    end
    st.open_stream = parts[#parts] ~= "" and stream or nil
  end
  -- windows following the end keep following it
  local follow = {}
  local count = vim.api.nvim_buf_line_count(buf)
  for _, win in ipairs(vim.api.nvim_list_wins()) do
    if vim.api.nvim_win_get_buf(win) == buf and vim.api.nvim_win_get_cursor(win)[1] >= count then
      follow[#follow + 1] = win
    end
  end
  vim.api.nvim_buf_set_option(buf, "modifiable", true)
  local last = vim.api.nvim_buf_get_lines(buf, count - 1, count, false)[1] or ""
  parts[1] = last .. parts[1]
  vim.api.nvim_buf_set_lines(buf, count - 1, count, false, parts)
  vim.api.nvim_buf_set_option(buf, "modifiable", false)
  vim.api.nvim_buf_set_option(buf, "modified", false)
  if hl then
    local first_line = count - 1 + (broke and 1 or 0)
    local end_line = count - 1 + #parts - 1
    if parts[#parts] == "" and end_line > first_line then
      end_line = end_line - 1
    end
    for l = first_line, end_line do
      vim.api.nvim_buf_add_highlight(buf, ns, hl, l, 0, -1)
    end
  end
  local new_count = vim.api.nvim_buf_line_count(buf)
  for _, win in ipairs(follow) do
    pcall(vim.api.nvim_win_set_cursor, win, { new_count, 0 })
  end
end

--- The status line of an exec/exit.
function M.exit_line(ex)
  local code = util.v(ex.exitCode)
  local sig = util.v(ex.signal)
  if ex.timedOut then
    return string.format("[timed out%s]", code and (", exit " .. code) or "")
  elseif sig then
    return string.format("[killed by %s%s]", sig, code and (", exit " .. code) or "")
  end
  return string.format("[exit %s]", tostring(code))
end

local function finish(buf, st, line, exit)
  st.done = true
  st.exit = exit
  local count = vim.api.nvim_buf_is_valid(buf) and vim.api.nvim_buf_line_count(buf) or 0
  if count > 0 then
    local last = vim.api.nvim_buf_get_lines(buf, count - 1, count, false)[1]
    if last ~= "" then
      append(buf, "\n")
    end
    append(buf, line)
    vim.api.nvim_buf_add_highlight(buf, ns, (exit and exit.exitCode == 0) and "Comment" or "WarningMsg", vim.api.nvim_buf_line_count(buf) - 1, 0, -1)
  end
  set_var(buf, "abx_exec_done", true)
  if exit then
    set_var(buf, "abx_exit_code", util.v(exit.exitCode) or -1)
  end
  if st.on_exit then
    pcall(st.on_exit, exit, st)
  end
end

--- Run `command` (a shell string) in `sandbox`, streaming into a new scratch buffer that
--- is shown with config.split. opts: cwd, env, timeout (s), on_exit(exit, state).
--- Returns the buffer.
function M.run(sandbox, command, opts)
  opts = opts or {}
  counter = counter + 1
  local buf = util.scratch(string.format("abx-exec://%s/%d", sandbox, counter), "abxexec")
  vim.api.nvim_buf_set_var(buf, "abx_sandbox", sandbox)
  vim.api.nvim_buf_set_option(buf, "undolevels", -1)
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, { "$ " .. command, "" })
  vim.api.nvim_buf_add_highlight(buf, ns, "Title", 0, 0, -1)
  vim.api.nvim_buf_set_option(buf, "modifiable", false)
  local st = { sandbox = sandbox, command = command, done = false, on_exit = opts.on_exit }
  M.state[buf] = st
  abx.set_current(sandbox)

  local client = abx.client()
  local params = {
    sandbox = sandbox,
    command = command,
    cwd = opts.cwd,
    env = not util.is_empty(opts.env) and opts.env or nil,
    timeout = tonumber(opts.timeout),
    stdin = "", -- no input: stdin is closed at once
  }
  client:request("exec/start", params, function(err, res)
    if err then
      util.notify_error(err, "exec")
      finish(buf, st, util.format_error(err), nil)
      return
    end
    st.exec_id = res.execId
    set_var(buf, "abx_exec_id", res.execId)
    client:subscribe_exec(res.execId, {
      on_output = function(p)
        local data = util.decode_data(p.data, util.v(p.encoding))
        append(buf, data, p.stream == "stderr" and "ErrorMsg" or nil, st, p.stream)
      end,
      on_exit = function(ex)
        finish(buf, st, M.exit_line(ex), ex)
      end,
      on_lost = function(e)
        finish(buf, st, "[connection to the broker lost: " .. util.format_error(e):gsub("\n.*", "") .. "]", nil)
      end,
      -- the bridge restarted: the output continues once exec/attach answered; a Ctrl-C
      -- meanwhile is sent then (only the attached connection may signal the exec)
      on_detached = function()
        st.detached = true
      end,
      on_reattach = function()
        st.detached = false
        st.reattached = (st.reattached or 0) + 1
        if st.pending_signal and not st.done then
          abx.call("exec/kill", { execId = st.exec_id, signal = st.pending_signal })
          st.pending_signal = nil
        end
      end,
    })
    if st.pending_signal and not st.done then
      abx.call("exec/kill", { execId = st.exec_id, signal = st.pending_signal })
      st.pending_signal = nil
    end
  end)

  -- Ctrl-C: SIGINT; again: SIGKILL (an INT can be lost, e.g. caught by a shell that is
  -- just starting a child, or ignored by the command)
  local function kill()
    if st.done then
      return
    end
    st.interrupts = (st.interrupts or 0) + 1
    local sig = st.interrupts > 1 and "KILL" or "INT"
    if st.exec_id and not st.detached then
      abx.call("exec/kill", { execId = st.exec_id, signal = sig }, function(e)
        if e and not st.done then -- an exec that just ended is no error
          util.notify_error(e, "exec/kill")
        end
      end)
    else
      st.pending_signal = sig -- sent once exec/start answers
    end
    if sig == "INT" then
      vim.api.nvim_echo({ { "abx: sent SIGINT (Ctrl-C again sends SIGKILL)" } }, false, {})
    end
  end
  vim.api.nvim_buf_set_keymap(buf, "n", "<C-c>", "", { noremap = true, silent = true, callback = kill })
  vim.api.nvim_create_autocmd("BufWipeout", {
    buffer = buf,
    once = true,
    callback = function()
      if st.exec_id and not st.done then
        abx.call("exec/kill", { execId = st.exec_id }, function() end)
        client:unsubscribe_exec(st.exec_id)
      end
      M.state[buf] = nil
    end,
  })
  util.show_buffer(buf, abx.config.split)
  return buf
end

--- Signal the exec of `buf` (default: the current buffer) with `signal` (default INT).
function M.kill(buf, signal)
  buf = (buf == nil or buf == 0) and vim.api.nvim_get_current_buf() or buf
  local st = M.state[buf]
  if st and st.exec_id and not st.done then
    abx.call("exec/kill", { execId = st.exec_id, signal = signal or "INT" })
    return true
  end
  return false
end

return M
