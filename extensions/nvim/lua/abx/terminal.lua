-- :Abx terminal: a terminal buffer (nvim_open_term) on a pty exec/start. Keys typed in the
-- terminal go out with exec/write, output comes in with exec/output, a window resize is
-- sent with exec/resize, and wiping the buffer hangs the session up.
local abx = require("abx")
local util = require("abx.util")

local M = {}

local DEFAULT_SHELL = "if command -v bash >/dev/null 2>&1; then exec bash -i; else exec sh -i; fi"

local counter = 0

-- state per buffer: {sandbox, chan, exec_id, done, exit, cols, rows}
M.state = {}

--- The size of the terminal: the smallest of the windows showing `buf`, as Neovim sizes
--- its own terminals.
function M.size(buf)
  local cols, rows
  for _, win in ipairs(vim.api.nvim_list_wins()) do
    if vim.api.nvim_win_get_buf(win) == buf then
      local info = vim.fn.getwininfo(win)[1] or {}
      local w = vim.api.nvim_win_get_width(win) - (tonumber(info.textoff) or 0)
      local h = vim.api.nvim_win_get_height(win)
      cols = cols and math.min(cols, w) or w
      rows = rows and math.min(rows, h) or h
    end
  end
  if not cols then
    return nil
  end
  return math.max(cols, 1), math.max(rows, 1)
end

local function resize(buf)
  local st = M.state[buf]
  if not st or not st.exec_id or st.done or st.detached then
    return
  end
  local cols, rows = M.size(buf)
  if cols and (cols ~= st.cols or rows ~= st.rows) then
    st.cols, st.rows = cols, rows
    abx.call("exec/resize", { execId = st.exec_id, cols = cols, rows = rows }, function(err)
      if err and not st.done then
        util.notify_error(err, "terminal resize")
      end
    end)
  end
end

local function write(st, data, eof)
  local payload, enc = util.encode_data(data)
  local params = { execId = st.exec_id, data = payload, eof = eof or nil }
  if enc ~= "utf-8" then
    params.encoding = enc
  end
  abx.call("exec/write", params, function(err)
    if err and not st.done and not st.write_error then
      st.write_error = true
      util.notify_error(err, "terminal input")
    end
  end)
end

-- Send what was typed before the session started (or while it was being re-attached), then
-- the window's size, which may have changed meanwhile.
local function flush_queue(buf, st)
  for _, d in ipairs(st.queued) do
    write(st, d)
  end
  st.queued = {}
  resize(buf)
end

--- Send `data` to the terminal's session (as if typed).
function M.send(buf, data)
  local st = M.state[buf]
  if not st then
    return false
  end
  if st.exec_id and not st.detached then
    write(st, data)
  else
    table.insert(st.queued, data)
  end
  return true
end

--- Open a terminal on `sandbox` running `command` (default: config.shell, else the
--- sandbox's bash -i or sh -i). Returns the buffer.
function M.open(sandbox, command, opts)
  opts = opts or {}
  command = (command and command ~= "") and command or abx.config.shell or DEFAULT_SHELL
  counter = counter + 1
  vim.cmd(abx.config.split)
  local win = vim.api.nvim_get_current_win()
  local buf = vim.api.nvim_create_buf(true, false)
  vim.api.nvim_win_set_buf(win, buf)
  pcall(vim.api.nvim_buf_set_name, buf, string.format("abx-term://%s/%d", sandbox, counter))
  vim.api.nvim_buf_set_var(buf, "abx_sandbox", sandbox)
  abx.set_current(sandbox)

  local st = { sandbox = sandbox, command = command, done = false, queued = {} }
  M.state[buf] = st
  st.chan = vim.api.nvim_open_term(buf, {
    on_input = function(_, _, _, data)
      if st.done then
        return
      end
      if st.exec_id and not st.detached then
        write(st, data)
      else
        table.insert(st.queued, data)
      end
    end,
  })

  local cols, rows = M.size(buf)
  st.cols, st.rows = cols or 80, rows or 24
  local client = abx.client()
  local function out(data)
    if vim.api.nvim_buf_is_valid(buf) then
      pcall(vim.api.nvim_chan_send, st.chan, data)
    end
  end
  local function ended(line, exit)
    st.done = true
    st.exit = exit
    out("\r\n[" .. line .. "]\r\n")
    if vim.api.nvim_buf_is_valid(buf) then
      vim.api.nvim_buf_set_var(buf, "abx_exec_done", true)
      if exit then
        vim.api.nvim_buf_set_var(buf, "abx_exit_code", util.v(exit.exitCode) or -1)
      end
    end
  end

  client:request("exec/start", {
    sandbox = sandbox,
    command = command,
    cwd = opts.cwd,
    pty = { cols = st.cols, rows = st.rows },
  }, function(err, res)
    if err then
      util.notify_error(err, "terminal")
      ended(util.format_error(err):gsub("\n", "\r\n"), nil)
      return
    end
    st.exec_id = res.execId
    if vim.api.nvim_buf_is_valid(buf) then
      vim.api.nvim_buf_set_var(buf, "abx_exec_id", res.execId)
    end
    client:subscribe_exec(res.execId, {
      on_output = function(p)
        out(util.decode_data(p.data, util.v(p.encoding)))
      end,
      on_exit = function(ex)
        ended(require("abx.exec").exit_line(ex):gsub("^%[", ""):gsub("%]$", ""), ex)
      end,
      on_lost = function()
        st.detached = false
        ended("connection to the broker lost", nil)
      end,
      -- the bridge restarted: keys typed meanwhile wait until exec/attach made this
      -- connection the session's owner again
      on_detached = function()
        st.detached = true
      end,
      on_reattach = function()
        st.detached = false
        st.reattached = (st.reattached or 0) + 1
        st.cols, st.rows = nil, nil -- sent again: a resize may have gone down with the old bridge
        flush_queue(buf, st)
      end,
    })
    flush_queue(buf, st)
  end)

  local group = vim.api.nvim_create_augroup("abx_term_" .. buf, { clear = true })
  local events = { "VimResized", "WinScrolled", "BufWinEnter", "WinEnter" }
  if vim.fn.exists("##WinResized") == 1 then
    table.insert(events, "WinResized")
  end
  vim.api.nvim_create_autocmd(events, {
    group = group,
    callback = function()
      if vim.api.nvim_buf_is_valid(buf) then
        resize(buf)
      end
    end,
  })
  vim.api.nvim_create_autocmd("BufWipeout", {
    group = group,
    buffer = buf,
    once = true,
    callback = function()
      if st.exec_id and not st.done then
        abx.call("exec/kill", { execId = st.exec_id, signal = "HUP" }, function() end)
        client:unsubscribe_exec(st.exec_id)
      end
      M.state[buf] = nil
      pcall(vim.api.nvim_del_augroup_by_id, group)
    end,
  })
  if opts.insert ~= false then
    vim.cmd("startinsert")
  end
  return buf
end

--- Check sizes now (also done on VimResized / WinScrolled / WinResized).
M.resize = resize

return M
