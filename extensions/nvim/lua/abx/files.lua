-- abx://SANDBOX/path buffers: read with files/read (chunks of config.chunk_size, utf-8 or
-- base64 as the broker sends them), written with files/write (one atomic write up to a
-- chunk; larger files go to a temporary file in chunks and are renamed over the target,
-- keeping the mode). Directories list their entries. With config.watch, an open file is
-- watched (files/watch) and reloaded when it changes in the sandbox and the buffer has no
-- changes of its own.
local abx = require("abx")
local util = require("abx.util")

local M = {}

-- per buffer: {sandbox, path, stat = {size, modifiedAt}, watch_id, busy, dir}
M.state = {}
local watches = {} -- watchId -> buf
local listening = false

--- "abx://SANDBOX/some/path" -> "SANDBOX", "/some/path" (an empty path is /workspace).
function M.parse(name)
  local sandbox, rest = name:match("^abx://([^/]+)(.*)$")
  if not sandbox or sandbox == "" then
    return nil
  end
  if rest == "" or rest == "/" then
    rest = "/workspace"
  end
  -- collapse repeated slashes, keep a trailing one out of the path
  rest = rest:gsub("//+", "/")
  if #rest > 1 then
    rest = rest:gsub("/$", "")
  end
  return sandbox, rest
end

function M.name(sandbox, path)
  return "abx://" .. sandbox .. path
end

local function opt(buf, name, value)
  vim.api.nvim_buf_set_option(buf, name, value)
end

local function code_of(err)
  return util.error_code(err)
end

--- Replace every line of `buf` without an undo step (as reading a file does).
local function set_all_lines(buf, lines)
  local ul = vim.api.nvim_buf_get_option(buf, "undolevels")
  vim.api.nvim_buf_set_option(buf, "undolevels", -1)
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, lines)
  vim.api.nvim_buf_set_option(buf, "undolevels", ul)
end

-- reading ---------------------------------------------------------------------------

--- The bytes of SANDBOX:PATH (every chunk), or nil, err.
function M.read_bytes(sandbox, path)
  local parts, offset = {}, 0
  local chunk = abx.config.chunk_size
  while true do
    local res, err = abx.call_sync("files/read", { sandbox = sandbox, path = path, offset = offset, length = chunk })
    if err then
      return nil, err
    end
    local data = util.decode_data(res.data, res.encoding)
    parts[#parts + 1] = data
    offset = offset + #data
    if res.eof or #data == 0 then
      break
    end
  end
  return table.concat(parts)
end

--- Write `bytes` to SANDBOX:PATH. Returns size, or nil, err.
function M.write_bytes(sandbox, path, bytes)
  local chunk = abx.config.chunk_size
  if #bytes <= chunk then
    local data, enc = util.encode_data(bytes)
    local res, err = abx.call_sync("files/write", { sandbox = sandbox, path = path, data = data, encoding = enc })
    if err then
      return nil, err
    end
    return res.size
  end
  -- big: chunks into a temporary file beside the target, then one rename (atomic)
  local mode
  local st = abx.call_sync("files/stat", { sandbox = sandbox, path = path })
  if st and type(st.mode) == "string" then
    mode = tonumber(st.mode, 8)
  end
  local tmp = string.format("%s.abx-%d-%d.tmp", path, vim.fn.getpid(), math.random(1, 1e9))
  local pos = 1
  while pos <= #bytes do
    local piece = bytes:sub(pos, pos + chunk - 1)
    local data, enc = util.encode_data(piece)
    local params = { sandbox = sandbox, path = tmp, data = data, encoding = enc }
    if pos == 1 then
      params.mode = mode
    else
      params.append = true
    end
    local _, err = abx.call_sync("files/write", params)
    if err then
      abx.call("files/remove", { sandbox = sandbox, path = tmp }, function() end)
      return nil, err
    end
    pos = pos + chunk
  end
  local _, err = abx.call_sync("files/rename", { sandbox = sandbox, from = tmp, to = path })
  if err then
    abx.call("files/remove", { sandbox = sandbox, path = tmp }, function() end)
    return nil, err
  end
  return #bytes
end

--- Bytes -> buffer lines plus the 'fileformat' and 'endofline' they imply.
function M.to_lines(bytes)
  if bytes == "" then
    return {}, "unix", false
  end
  local ff = "unix"
  if bytes:find("\r\n", 1, true) and not bytes:find("[^\r]\n") and not bytes:find("^\n") then
    if vim.o.fileformats:find("dos", 1, true) then
      ff = "dos"
    end
  end
  local nl = ff == "dos" and "\r\n" or "\n"
  local lines, pos = {}, 1
  while true do
    local i, j = bytes:find(nl, pos, true)
    if not i then
      break
    end
    lines[#lines + 1] = bytes:sub(pos, i - 1)
    pos = j + 1
  end
  local eol = pos > #bytes
  if not eol then
    lines[#lines + 1] = bytes:sub(pos)
  end
  return lines, ff, eol
end

--- The bytes of `lines` as buffer `buf` would write them ('fileformat', 'eol', 'fixeol',
--- 'binary'); `empty` is a buffer without lines (written as 0 bytes).
function M.from_lines(buf, lines, empty)
  if empty then
    return ""
  end
  local ff = vim.api.nvim_buf_get_option(buf, "fileformat")
  local nl = ff == "dos" and "\r\n" or (ff == "mac" and "\r" or "\n")
  local binary = vim.api.nvim_buf_get_option(buf, "binary")
  local eol = vim.api.nvim_buf_get_option(buf, "endofline")
  local fixeol = vim.api.nvim_buf_get_option(buf, "fixendofline")
  local add = eol or (fixeol and not binary)
  return table.concat(lines, nl) .. (add and nl or "")
end

local function buffer_is_empty(buf)
  if vim.api.nvim_buf_line_count(buf) > 1 then
    return false
  end
  local l = vim.api.nvim_buf_get_lines(buf, 0, 1, false)[1]
  if l ~= "" then
    return false
  end
  return vim.api.nvim_buf_call(buf, function()
    return vim.fn.line2byte(vim.fn.line("$") + 1) <= 0
  end)
end

-- Files up to this size are also compared by content when a change event comes with an
-- unchanged stat (modifiedAt has whole seconds).
local KNOWN_MAX = 256 * 1024

local function record_stat(buf, sandbox, path, bytes)
  local st = M.state[buf]
  if not st then
    return
  end
  st.known = (bytes and #bytes <= KNOWN_MAX) and bytes or nil
  local res = abx.call_sync("files/stat", { sandbox = sandbox, path = path })
  if res then
    st.stat = { size = res.size, modifiedAt = res.modifiedAt }
  else
    st.stat = nil
  end
end

local function ensure_listener()
  if listening then
    return
  end
  listening = true
  abx.client():on("files/changed", function(p)
    local buf = watches[p.watchId]
    if buf then
      M.on_changed(buf, p)
    end
  end)
end

local function unwatch(buf)
  local st = M.state[buf]
  if st and st.watch_id then
    watches[st.watch_id] = nil
    abx.call("files/unwatch", { watchId = st.watch_id }, function() end)
    st.watch_id = nil
  end
end

local function watch(buf, sandbox, path)
  local st = M.state[buf]
  if not abx.config.watch or not st or st.watch_id or st.watch_pending then
    return
  end
  st.watch_pending = true
  ensure_listener()
  abx.call("files/watch", { sandbox = sandbox, path = path }, function(err, res)
    st.watch_pending = false
    if err or M.state[buf] ~= st then
      if res and res.watchId then
        abx.call("files/unwatch", { watchId = res.watchId }, function() end)
      end
      return -- a provider without files.watch (E8004): no live reload
    end
    st.watch_id = res.watchId
    watches[res.watchId] = buf
  end)
end

local function setup_buffer(buf, sandbox, path)
  local st = M.state[buf]
  if not st or st.sandbox ~= sandbox or st.path ~= path then
    if st then
      unwatch(buf)
    end
    st = { sandbox = sandbox, path = path }
    M.state[buf] = st
    vim.api.nvim_create_autocmd({ "BufWipeout", "BufDelete" }, {
      buffer = buf,
      once = true,
      callback = function()
        unwatch(buf)
        M.state[buf] = nil
      end,
    })
  end
  vim.api.nvim_buf_set_var(buf, "abx_sandbox", sandbox)
  vim.api.nvim_buf_set_var(buf, "abx_path", path)
  return st
end

local function render_dir(buf, sandbox, path, entries)
  table.sort(entries, function(a, b)
    local da, db = a.type == "directory", b.type == "directory"
    if da ~= db then
      return da
    end
    return a.name < b.name
  end)
  local lines = {}
  if path ~= "/" then
    lines[1] = "../"
  end
  for _, e in ipairs(entries) do
    lines[#lines + 1] = e.name .. (e.type == "directory" and "/" or (e.type == "symlink" and "@" or ""))
  end
  opt(buf, "modifiable", true)
  set_all_lines(buf, lines)
  opt(buf, "modifiable", false)
  opt(buf, "modified", false)
  opt(buf, "buftype", "nofile")
  opt(buf, "bufhidden", "hide")
  opt(buf, "swapfile", false)
  opt(buf, "filetype", "abxdir")
  local function open_line()
    local line = vim.api.nvim_get_current_line()
    local target
    if line == "../" then
      target = path:match("^(.*)/[^/]*$")
      if target == "" then
        target = "/"
      end
    else
      target = (path == "/" and "" or path) .. "/" .. line:gsub("[/@]$", "")
    end
    vim.cmd("edit " .. vim.fn.fnameescape(M.name(sandbox, target)))
  end
  local function up()
    local parent = path:match("^(.*)/[^/]*$")
    vim.cmd("edit " .. vim.fn.fnameescape(M.name(sandbox, (parent == "" or not parent) and "/" or parent)))
  end
  local map = { noremap = true, silent = true, nowait = true }
  vim.api.nvim_buf_set_keymap(buf, "n", "<CR>", "", vim.tbl_extend("force", map, { callback = open_line }))
  vim.api.nvim_buf_set_keymap(buf, "n", "-", "", vim.tbl_extend("force", map, { callback = up }))
  vim.api.nvim_buf_set_keymap(buf, "n", "R", "", vim.tbl_extend("force", map, {
    callback = function()
      vim.cmd("edit")
    end,
  }))
end

--- A change that came while the buffer was busy: looked at again, once it is idle.
local function replay_missed(buf, st)
  local p = st.missed
  if p then
    st.missed = nil
    vim.schedule(function()
      M.on_changed(buf, p)
    end)
  end
end

--- Fill `buf` from SANDBOX:PATH. Returns true, or false and the error (also notified).
function M.load(buf, sandbox, path, opts)
  opts = opts or {}
  local st = setup_buffer(buf, sandbox, path)
  st.busy = true
  local bytes, err = M.read_bytes(sandbox, path)
  if err and code_of(err) == "E4003" then
    local res, lerr = abx.call_sync("files/list", { sandbox = sandbox, path = path })
    st.busy = false
    if lerr then
      util.notify_error(lerr, M.name(sandbox, path))
      return false, lerr
    end
    st.dir = true
    render_dir(buf, sandbox, path, util.v(res.entries) or {})
    return true
  end
  st.dir = false
  opt(buf, "buftype", "acwrite")
  opt(buf, "swapfile", false)
  if err and code_of(err) == "E4001" then
    -- a new file: empty buffer, created by the first write
    opt(buf, "modifiable", true)
    set_all_lines(buf, {})
    opt(buf, "modified", false)
    st.busy = false
    st.stat = nil
    if not opts.silent then
      vim.api.nvim_echo({ { '"' .. M.name(sandbox, path) .. '" [New]' } }, false, {})
    end
    return true
  elseif err then
    st.busy = false
    util.notify_error(err, M.name(sandbox, path))
    return false, err
  end
  local lines, ff, eol = M.to_lines(bytes)
  -- keep cursors where they were (a reload after a change in the sandbox)
  local cursors = {}
  for _, win in ipairs(vim.api.nvim_list_wins()) do
    if vim.api.nvim_win_get_buf(win) == buf then
      cursors[win] = vim.api.nvim_win_get_cursor(win)
    end
  end
  opt(buf, "modifiable", true)
  set_all_lines(buf, lines)
  opt(buf, "fileformat", ff)
  opt(buf, "endofline", eol or #lines == 0)
  opt(buf, "modified", false)
  local count = vim.api.nvim_buf_line_count(buf)
  for win, c in pairs(cursors) do
    pcall(vim.api.nvim_win_set_cursor, win, { math.min(c[1], count), c[2] })
  end
  record_stat(buf, sandbox, path, bytes)
  st.busy = false
  watch(buf, sandbox, path)
  replay_missed(buf, st)
  if not opts.silent then
    vim.api.nvim_echo({ { string.format('"%s" %dL, %dB', M.name(sandbox, path), #lines, #bytes) } }, false, {})
  end
  return true
end

--- A files/changed for the watched file of `buf`: reload an unchanged buffer, warn about a
--- changed one.
function M.on_changed(buf, p)
  local st = M.state[buf]
  if not st or st.dir or not vim.api.nvim_buf_is_valid(buf) then
    return
  end
  if st.busy then
    -- A load or write of ours is under way: look again once it is done (a change that
    -- lands while we read, such as a shell's write after its truncate, is not lost).
    st.missed = p
    return
  end
  abx.call("files/stat", { sandbox = st.sandbox, path = st.path }, function(err, res)
    if M.state[buf] ~= st or not vim.api.nvim_buf_is_valid(buf) then
      return
    end
    if st.busy then
      st.missed = p
      return
    end
    local now = (not err) and { size = res.size, modifiedAt = res.modifiedAt } or nil
    local before = st.stat
    if now and before and now.size == before.size and now.modifiedAt == before.modifiedAt then
      if not st.known then
        return -- our own write, or nothing new
      end
      local bytes = M.read_bytes(st.sandbox, st.path)
      if bytes == nil or bytes == st.known or M.state[buf] ~= st or st.busy then
        return
      end
    end
    if not now and p.kind ~= "removed" then
      return
    end
    local name = M.name(st.sandbox, st.path)
    if vim.api.nvim_buf_get_option(buf, "modified") then
      st.stat, st.known = now, nil
      util.notify(name .. " changed in the sandbox; the buffer has changes too (:e! reloads it).", vim.log.levels.WARN)
    elseif not now then
      st.stat = nil
      util.notify(name .. " was removed in the sandbox.", vim.log.levels.WARN)
    else
      M.load(buf, st.sandbox, st.path, { silent = true })
      util.notify(name .. " changed in the sandbox: reloaded.", vim.log.levels.INFO)
      local ok, n = pcall(vim.api.nvim_buf_get_var, buf, "abx_reloads")
      vim.api.nvim_buf_set_var(buf, "abx_reloads", (ok and n or 0) + 1)
    end
  end)
end

-- autocommands ----------------------------------------------------------------------

--- BufReadCmd abx://*
function M.on_read(ev)
  local buf = ev.buf
  local name = vim.api.nvim_buf_get_name(buf)
  local sandbox, path = M.parse(name)
  if not sandbox then
    util.notify("Not an abx:// name: " .. name .. " (abx://SANDBOX/path)", vim.log.levels.ERROR)
    return
  end
  local ok = M.load(buf, sandbox, path)
  if ok and not M.state[buf].dir then
    -- filetype detection and the user's BufRead autocommands, as for a normal file
    vim.api.nvim_buf_call(buf, function()
      vim.cmd("doautocmd <nomodeline> BufReadPost " .. vim.fn.fnameescape(name))
    end)
  end
end

local function write_lines(buf, target, lines, empty, whole)
  local sandbox, path = M.parse(target)
  if not sandbox then
    util.notify("Not an abx:// name: " .. target, vim.log.levels.ERROR)
    return false
  end
  local st = whole and M.state[buf] or nil
  if st then
    st.busy = true
  end
  local bytes = M.from_lines(buf, lines, empty)
  local size, err = M.write_bytes(sandbox, path, bytes)
  if err then
    if st then
      st.busy = false
    end
    util.notify_error(err, target)
    return false, err
  end
  if whole and st and st.sandbox == sandbox and st.path == path then
    opt(buf, "modified", false)
    record_stat(buf, sandbox, path, bytes)
    st.busy = false
    watch(buf, sandbox, path)
    replay_missed(buf, st)
  elseif st then
    st.busy = false
  end
  vim.api.nvim_echo({ { string.format('"%s" %dL, %dB written', target, #lines, size or #bytes) } }, false, {})
  return true
end

--- BufWriteCmd abx://*: `:w` of an abx:// buffer, or `:w abx://...` of another buffer.
function M.on_write(ev)
  local buf = ev.buf
  local target = ev.match
  local own = vim.api.nvim_buf_get_name(buf) == target
  if own and not M.state[buf] then
    local sandbox, path = M.parse(target)
    if sandbox then
      setup_buffer(buf, sandbox, path)
    end
  end
  local lines = vim.api.nvim_buf_get_lines(buf, 0, -1, false)
  write_lines(buf, target, lines, buffer_is_empty(buf), own)
end

--- FileWriteCmd abx://*: `:'<,'>w abx://...` (a range).
function M.on_file_write(ev)
  local buf = ev.buf
  local first, last = vim.fn.line("'["), vim.fn.line("']")
  local lines = vim.api.nvim_buf_get_lines(buf, first - 1, last, false)
  write_lines(buf, ev.match, lines, false, false)
end

--- FileReadCmd abx://*: `:r abx://...` inserts the file below the cursor line.
function M.on_file_read(ev)
  local sandbox, path = M.parse(ev.match)
  if not sandbox then
    return
  end
  local bytes, err = M.read_bytes(sandbox, path)
  if err then
    return util.notify_error(err, ev.match)
  end
  local lines = M.to_lines(bytes)
  local at = vim.fn.line("'[")
  if at < 0 then
    at = vim.fn.line(".")
  end
  vim.api.nvim_buf_set_lines(0, at, at, false, lines)
end

--- Register the abx:// autocommands (plugin/abx.lua does this).
function M.setup_autocmds()
  local group = vim.api.nvim_create_augroup("abx_files", { clear = true })
  local function cb(fn)
    return function(ev)
      local ok, e = pcall(fn, ev)
      if not ok then
        util.notify("abx: " .. tostring(e), vim.log.levels.ERROR)
      end
    end
  end
  vim.api.nvim_create_autocmd("BufReadCmd", { group = group, pattern = "abx://*", callback = cb(M.on_read) })
  vim.api.nvim_create_autocmd("BufWriteCmd", { group = group, pattern = "abx://*", callback = cb(M.on_write) })
  vim.api.nvim_create_autocmd("FileWriteCmd", { group = group, pattern = "abx://*", callback = cb(M.on_file_write) })
  vim.api.nvim_create_autocmd("FileReadCmd", { group = group, pattern = "abx://*", callback = cb(M.on_file_read) })
end

return M
