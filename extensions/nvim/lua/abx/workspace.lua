-- Workspaces (issue 43): a host directory mounted into a new sandbox (:Abx mount), what the
-- sandbox changed under its overlay mounts as a quickfix list (:Abx diff; <CR> on an item
-- opens a diff split: the host file against a scratch buffer with the sandbox's version,
-- read with files/read), bringing changes to the host or dropping them (:Abx apply,
-- :Abx apply!, :Abx discard; both ask first) and the commands run in the sandbox
-- (:Abx log, sandbox/log).
local abx = require("abx")
local util = require("abx.util")

local M = {}

local INFO, WARN = vim.log.levels.INFO, vim.log.levels.WARN

M.TARGET = "/workspace"
M.MODES = { overlay = true, ro = true, rw = true }

-- the mounts of sandboxes this Neovim created or asked about: sandbox -> {{source, target, mode}}
M.mounts = {}
-- the quickfix list of the last :Abx diff: {sandbox, id, changes, mounts}
M.last = nil

local function finish(cb, context, err, res)
  if err then
    if cb then
      return cb(err, nil)
    end
    return util.notify_error(err, context)
  end
  if cb then
    cb(nil, res)
  end
end

local function invalidate()
  local commands = package.loaded["abx.commands"]
  if commands then
    commands.invalidate()
  end
end

-- paths ------------------------------------------------------------------------------

local function strip(p)
  if #p > 1 then
    p = p:gsub("/+$", "")
  end
  return p
end

-- `p` relative to `dir` ("" for dir itself), or nil when it is not beneath it.
local function under(p, dir)
  dir = strip(dir)
  if p == dir then
    return ""
  end
  local prefix = dir == "/" and "/" or (dir .. "/")
  if p:sub(1, #prefix) == prefix then
    return p:sub(#prefix + 1)
  end
  return nil
end

--- The mount a sandbox path lies in (the deepest target) and the path relative to it.
function M.mount_of(mounts, path)
  local best, rel
  for _, m in ipairs(mounts or {}) do
    local r = under(path, m.target)
    if r and (not best or #m.target > #best.target) then
      best, rel = m, r
    end
  end
  return best, rel
end

--- The host file a sandbox path stands for (nil: under no mount).
function M.host_path(mounts, path)
  local m, rel = M.mount_of(mounts, path)
  if not m then
    return nil
  end
  if rel == "" then
    return m.source
  end
  return strip(m.source) .. "/" .. rel
end

--- The sandbox path of a host file (nil: under no mount).
function M.sandbox_path(mounts, host)
  local best, depth
  for _, m in ipairs(mounts or {}) do
    local r = under(host, m.source)
    if r and (not depth or #m.source > depth) then
      depth = #m.source
      best = r == "" and m.target or (strip(m.target) .. "/" .. r)
    end
  end
  return best
end

--- A path as given to :Abx apply / discard: a sandbox path under a mount stays as it is;
--- anything else is taken as a host path (relative to the working directory) and mapped.
function M.to_sandbox_path(mounts, p)
  if p:sub(1, 1) == "/" and M.mount_of(mounts, strip(p)) then
    return strip(p)
  end
  local abs = strip(vim.fn.fnamemodify(vim.fn.expand(p), ":p"))
  return M.sandbox_path(mounts, abs) or M.sandbox_path(mounts, vim.fn.resolve(abs)) or p
end

--- The mounts of a sandbox (sandbox/info, remembered); nil, err on failure.
function M.mounts_of(sandbox)
  if M.mounts[sandbox] then
    return M.mounts[sandbox]
  end
  local sb, err = abx.call_sync("sandbox/info", { sandbox = sandbox })
  if not sb then
    return nil, err
  end
  local mounts = util.v(sb.mounts) or {}
  M.mounts[sandbox] = mounts
  M.mounts[abx.qualified(sb)] = mounts
  return mounts
end

-- :Abx mount ---------------------------------------------------------------------------

--- sandbox/create with DIR (default: the working directory) mounted at /workspace, MODE
--- overlay (default), ro or rw. The new sandbox becomes the current one. cb(err, sandbox).
function M.mount(dir, mode, cb)
  mode = mode or "overlay"
  if not M.MODES[mode] then
    return finish(cb, "mount", util.make_error("E1009", "Unknown mount mode '" .. tostring(mode) .. "'.", "Usage: :Abx mount [PATH] [overlay|ro|rw] (overlay is the default)."))
  end
  dir = (dir and dir ~= "") and vim.fn.expand(dir) or vim.fn.getcwd()
  local source = strip(vim.fn.fnamemodify(dir, ":p"))
  if vim.fn.isdirectory(source) ~= 1 then
    return finish(cb, "mount", util.make_error("E1009", "'" .. source .. "' is not a directory.", "Usage: :Abx mount [PATH] [overlay|ro|rw]: PATH is a directory (default: the working directory)."))
  end
  local c = abx.config
  local mounts = { { source = source, target = M.TARGET, mode = mode } }
  local params = { provider = c.provider, template = c.template, timeout = tonumber(c.timeout), mounts = mounts }
  util.notify("Creating a sandbox with " .. source .. " at " .. M.TARGET .. " (" .. mode .. ")...", INFO)
  abx.call("sandbox/create", params, function(err, sb)
    invalidate()
    if not err then
      local ref = abx.qualified(sb)
      local got = util.v(sb.mounts)
      M.mounts[ref] = (type(got) == "table" and #got > 0) and got or mounts
      M.mounts[sb.id] = M.mounts[ref]
      abx.set_current(ref)
      if mode == "rw" then
        util.notify(
          "Created sandbox " .. ref .. " with " .. source .. " at " .. M.TARGET .. " read-write: writes in the sandbox go to the host files at once (nothing to review or apply).",
          WARN
        )
      elseif mode == "ro" then
        util.notify("Created sandbox " .. ref .. " with " .. source .. " at " .. M.TARGET .. " read-only.", INFO)
      else
        util.notify(
          "Created sandbox " .. ref .. " with " .. source .. " at " .. M.TARGET .. " (overlay: the host changes only on :Abx apply; :Abx diff lists the changes).",
          INFO
        )
      end
    end
    finish(cb, "mount", err, sb)
  end)
end

-- :Abx diff ------------------------------------------------------------------------------

local function item_text(c)
  local parts = { tostring(c.change) }
  local ty = util.v(c.type)
  if ty and ty ~= "file" then
    parts[#parts + 1] = ty
  end
  if c.binary then
    parts[#parts + 1] = "binary"
  end
  local target = util.v(c.symlinkTarget)
  if target then
    parts[#parts + 1] = "-> " .. target
  end
  if c.explicitOnly then
    parts[#parts + 1] = "(applied only when named)"
  end
  return table.concat(parts, " ")
end

--- Quickfix items of `changes`: one per path, the host file as its file, the kind as text.
function M.qf_items(changes, mounts)
  local items = {}
  for _, c in ipairs(changes) do
    items[#items + 1] = {
      filename = M.host_path(mounts, c.path) or c.path,
      text = item_text(c),
    }
  end
  return items
end

local function title_of(sandbox)
  return "abx diff " .. sandbox
end

-- Whether the current window shows the quickfix list of the last :Abx diff.
local function in_our_qf()
  if not M.last or vim.bo.buftype ~= "quickfix" then
    return false
  end
  local info = vim.fn.getwininfo(vim.api.nvim_get_current_win())[1]
  if info and info.loclist == 1 then
    return false
  end
  return vim.fn.getqflist({ id = 0 }).id == M.last.id
end

--- The change under the cursor in the :Abx diff quickfix window (nil elsewhere).
function M.change_under_cursor()
  if not in_our_qf() then
    return nil
  end
  return M.last.changes[vim.fn.line(".")]
end

--- sandbox/diff of SANDBOX; cb(err, changes, mounts).
function M.changes(sandbox, cb)
  local mounts, merr = M.mounts_of(sandbox)
  if not mounts then
    return cb(merr)
  end
  abx.call("sandbox/diff", { sandbox = sandbox }, function(err, res)
    if err then
      return cb(err)
    end
    cb(nil, util.v(res.changes) or {}, mounts, res.truncated == true)
  end)
end

-- Put `changes` in the quickfix list: the list of the last :Abx diff of this sandbox is
-- replaced in place, else a new list is made.
local function set_qf(sandbox, changes, mounts)
  local what = { title = title_of(sandbox), items = M.qf_items(changes, mounts) }
  if M.last and M.last.sandbox == sandbox and vim.fn.getqflist({ id = M.last.id }).id == M.last.id then
    what.id = M.last.id
    vim.fn.setqflist({}, "r", what)
  else
    vim.fn.setqflist({}, " ", what)
  end
  M.last = { sandbox = sandbox, id = vim.fn.getqflist({ id = 0 }).id, changes = changes, mounts = mounts }
  if what.id then
    M.last.id = what.id
  end
end

local function map_enter(buf)
  vim.api.nvim_buf_set_keymap(buf, "n", "<CR>", "<cmd>lua require('abx.workspace').qf_enter()<cr>", { noremap = true, silent = true })
end

--- <CR> in quickfix windows opens the diff split of an :Abx diff item (the usual jump on
--- other lists); set on every quickfix window, as the quickfix buffer goes when it closes.
function M.setup_qf_mapping()
  if M.qf_mapped then
    return
  end
  M.qf_mapped = true
  vim.api.nvim_create_autocmd("FileType", {
    group = vim.api.nvim_create_augroup("abx_workspace_qf", { clear = true }),
    pattern = "qf",
    callback = function(ev)
      map_enter(ev.buf)
    end,
  })
end

--- :Abx diff [SANDBOX]: the changes in the quickfix list (opened); <CR> on an item opens
--- its diff split. cb(err, changes).
function M.diff(sandbox, cb)
  M.changes(sandbox, function(err, changes, mounts, truncated)
    if err then
      return finish(cb, "diff", err)
    end
    set_qf(sandbox, changes, mounts)
    M.setup_qf_mapping()
    vim.cmd("botright copen")
    map_enter(vim.api.nvim_get_current_buf())
    if #changes == 0 then
      util.notify("Sandbox " .. sandbox .. " has no changes under its overlay mounts.", INFO)
    elseif truncated then
      util.notify("The list of changes of " .. sandbox .. " was cut: ask for fewer paths.", WARN)
    end
    finish(cb, "diff", nil, changes)
  end)
end

--- <CR> in the quickfix window: the diff split of an :Abx diff item, else the usual jump.
function M.qf_enter()
  local idx = vim.fn.line(".")
  local c = M.change_under_cursor()
  if not c then
    local info = vim.fn.getwininfo(vim.api.nvim_get_current_win())[1]
    vim.cmd((info and info.loclist == 1 and "ll " or "cc ") .. idx)
    return
  end
  M.open_diff(M.last.sandbox, c, M.last.mounts)
end

local function sandbox_lines(sandbox, path)
  local bytes, err = require("abx.files").read_bytes(sandbox, path)
  if not bytes then
    return nil, err
  end
  local lines = require("abx.files").to_lines(bytes)
  return lines
end

local function side_buffer(name, lines, ft)
  local buf = util.scratch(name, ft)
  vim.api.nvim_buf_set_option(buf, "modifiable", true)
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, lines)
  vim.api.nvim_buf_set_option(buf, "modifiable", false)
  vim.api.nvim_buf_set_option(buf, "modified", false)
  vim.api.nvim_buf_set_var(buf, "abx_diff_side", true)
  return buf
end

--- The diff split of one change: the host file (left; an empty scratch buffer when the
--- file is new in the sandbox) against a read-only scratch buffer `abx-diff://SANDBOX/PATH`
--- with the sandbox's version (empty when it was deleted there), both with :diffthis.
function M.open_diff(sandbox, change, mounts)
  local path = change.path
  local ty = util.v(change.type)
  if change.binary or ty == "directory" or ty == "symlink" then
    local what = ty == "symlink" and ("a symlink to " .. tostring(util.v(change.symlinkTarget))) or ty == "directory" and "a directory" or "a binary file"
    return util.notify(path .. " (" .. tostring(change.change) .. ") is " .. what .. ": no text to compare.", INFO)
  end
  local host = M.host_path(mounts, path)
  local right = {}
  if change.change ~= "deleted" then
    local lines, err = sandbox_lines(sandbox, path)
    if not lines then
      return util.notify_error(err, "diff " .. path)
    end
    right = lines
  end
  -- the window the quickfix list was entered from, else a new one above it
  if vim.bo.buftype == "quickfix" then
    vim.cmd("wincmd p")
    if vim.bo.buftype == "quickfix" then
      vim.cmd("aboveleft split")
    end
  end
  -- the previous diff split goes
  for _, win in ipairs(vim.api.nvim_tabpage_list_wins(0)) do
    local b = vim.api.nvim_win_get_buf(win)
    if win ~= vim.api.nvim_get_current_win() and pcall(vim.api.nvim_buf_get_var, b, "abx_diff_side") then
      pcall(vim.api.nvim_win_close, win, true)
    end
  end
  vim.cmd("diffoff!")
  if change.change == "added" or not host then
    vim.api.nvim_win_set_buf(0, side_buffer("abx-diff-host://" .. sandbox .. path, {}, nil))
  else
    vim.cmd("edit " .. vim.fn.fnameescape(host))
  end
  local host_win = vim.api.nvim_get_current_win()
  local ft = vim.bo.filetype
  vim.cmd("diffthis")
  vim.cmd("rightbelow vsplit")
  local buf = side_buffer("abx-diff://" .. sandbox .. path, right, ft ~= "" and ft or nil)
  vim.api.nvim_win_set_buf(0, buf)
  vim.api.nvim_buf_set_var(buf, "abx_sandbox", sandbox)
  vim.api.nvim_buf_set_var(buf, "abx_diff_path", path)
  vim.cmd("diffthis")
  vim.api.nvim_set_current_win(host_win)
  return buf
end

-- :Abx apply / :Abx discard ---------------------------------------------------------------

-- The sandbox these commands act on: that of the :Abx diff list when in it, else the
-- current sandbox (:Abx mount, :Abx use), else that of the last :Abx diff.
function M.context_sandbox()
  if in_our_qf() then
    return M.last.sandbox
  end
  return abx.current_sandbox() or (M.last and M.last.sandbox)
end

-- `paths` (as typed) -> sandbox paths; none: the quickfix item under the cursor when in
-- the :Abx diff list, the file of the sandbox side of a diff split, else nil (every change).
local function selected(sandbox, paths)
  if #paths == 0 then
    local c = M.change_under_cursor()
    if c then
      return { c.path }
    end
    -- the sandbox side of a diff split: its file
    local ok, p = pcall(vim.api.nvim_buf_get_var, 0, "abx_diff_path")
    return (ok and type(p) == "string") and { p } or nil
  end
  local mounts, err = M.mounts_of(sandbox)
  if not mounts then
    return nil, err
  end
  local out = {}
  for _, p in ipairs(paths) do
    out[#out + 1] = M.to_sandbox_path(mounts, p)
  end
  return out
end

-- The paths an E4015 names (`...: /workspace/a, /workspace/b.`), else those asked for.
function M.conflict_paths(err, asked)
  local data = type(err) == "table" and util.v(err.data) or nil
  if type(data) == "table" and type(util.v(data.paths)) == "table" then
    return data.paths
  end
  local msg = type(err) == "table" and tostring(util.v(err.message) or "") or ""
  local list = msg:match("created: (.*)$")
  local out = {}
  if list then
    for p in list:gsub("%.$", ""):gmatch("[^,%s]+") do
      if p:sub(1, 1) == "/" then
        out[#out + 1] = p
      end
    end
  end
  if #out > 0 then
    return out
  end
  return asked or {}
end

-- After an apply or discard: the :Abx diff list of the sandbox follows.
local function refresh_qf(sandbox)
  if not (M.last and M.last.sandbox == sandbox) then
    return
  end
  M.changes(sandbox, function(err, changes, mounts)
    if not err then
      set_qf(sandbox, changes, mounts)
    end
  end)
end

local function listing(changes, max)
  local lines = {}
  for i, c in ipairs(changes) do
    if i > max then
      lines[#lines + 1] = "  ... and " .. (#changes - max) .. " more"
      break
    end
    lines[#lines + 1] = "  " .. tostring(c.change) .. "  " .. c.path
  end
  return table.concat(lines, "\n")
end

--- :Abx apply[!] [PATHS...]: write the sandbox's changes (all; the given paths, sandbox
--- paths or host files; the quickfix item under the cursor) to the host, after a
--- confirmation. `force` (:Abx apply!) applies paths the host changed since create too.
--- cb(err, {applied, conflicts, skipped}); nil result when not confirmed.
function M.apply(paths, force, cb, sandbox)
  sandbox = sandbox or M.context_sandbox()
  if not sandbox then
    return finish(cb, "apply", util.make_error("E1009", "No sandbox: :Abx mount one, or :Abx use SANDBOX.", "Usage: :Abx apply[!] [PATHS...]"))
  end
  local sel, serr = selected(sandbox, paths or {})
  if serr then
    return finish(cb, "apply", serr)
  end
  local what
  if sel then
    what = table.concat(sel, "\n  ")
  else
    local res, err = abx.call_sync("sandbox/diff", { sandbox = sandbox })
    if not res then
      return finish(cb, "apply", err)
    end
    local changes = util.v(res.changes) or {}
    if #changes == 0 then
      util.notify("Sandbox " .. sandbox .. " has no changes to apply.", INFO)
      return finish(cb, "apply", nil, { applied = {}, conflicts = {}, skipped = {} })
    end
    what = "every change (" .. #changes .. "):\n" .. listing(changes, 15)
  end
  local msg = "Apply to the host files, from sandbox " .. sandbox .. (force and " (force: over host changes)" or "") .. ":\n  " .. what
  if vim.fn.confirm(msg, "&Apply\n&Cancel", 2) ~= 1 then
    util.notify("Not applied.", INFO)
    return finish(cb, "apply", nil, nil)
  end
  local params = { sandbox = sandbox, paths = sel, force = force or nil }
  abx.call("sandbox/apply", params, function(err, res)
    if err and util.error_code(err) == "E4015" then
      -- every path asked for conflicts: nothing was applied
      local conflicts = {}
      for _, p in ipairs(M.conflict_paths(err, sel)) do
        conflicts[#conflicts + 1] = { path = p, reason = tostring(err.message) }
      end
      err, res = nil, { applied = {}, conflicts = conflicts, skipped = {} }
    end
    if err then
      return finish(cb, "apply", err)
    end
    local applied = util.v(res.applied) or {}
    local conflicts = util.v(res.conflicts) or {}
    local skipped = util.v(res.skipped) or {}
    if #applied > 0 then
      util.notify("Applied " .. #applied .. " change(s) from " .. sandbox .. ": " .. table.concat(applied, ", "), INFO)
    elseif #conflicts == 0 and #skipped == 0 then
      util.notify("Nothing to apply from " .. sandbox .. ".", INFO)
    end
    if #skipped > 0 then
      local parts = {}
      for _, s in ipairs(skipped) do
        parts[#parts + 1] = s.path .. " (" .. tostring(s.reason) .. ")"
      end
      util.notify("Not applied from " .. sandbox .. ": " .. table.concat(parts, "; "), WARN)
    end
    if #conflicts > 0 then
      local names = {}
      for _, c in ipairs(conflicts) do
        names[#names + 1] = c.path
      end
      util.notify(
        "Changed on the host since sandbox " .. sandbox .. " was created, not applied: " .. table.concat(names, ", ") .. "\n  :Abx apply! " .. table.concat(names, " ") .. " writes the sandbox's version over them; :Abx discard keeps the host's.",
        WARN
      )
    end
    refresh_qf(sandbox)
    finish(cb, "apply", nil, res)
  end)
end

--- :Abx discard [PATHS...]: drop the sandbox's changes (all, the given paths, or the
--- quickfix item under the cursor) after a confirmation; the sandbox sees the host's files
--- again. cb(err, discarded paths); nil when not confirmed.
function M.discard(paths, cb, sandbox)
  sandbox = sandbox or M.context_sandbox()
  if not sandbox then
    return finish(cb, "discard", util.make_error("E1009", "No sandbox: :Abx mount one, or :Abx use SANDBOX.", "Usage: :Abx discard [PATHS...]"))
  end
  local sel, serr = selected(sandbox, paths or {})
  if serr then
    return finish(cb, "discard", serr)
  end
  local msg = "Discard the changes of sandbox " .. sandbox .. " (its own version is lost; the host files are not touched):\n  " .. (sel and table.concat(sel, "\n  ") or "every change")
  if vim.fn.confirm(msg, "&Discard\n&Cancel", 2) ~= 1 then
    util.notify("Not discarded.", INFO)
    return finish(cb, "discard", nil, nil)
  end
  abx.call("sandbox/discard", { sandbox = sandbox, paths = sel }, function(err, res)
    if err then
      return finish(cb, "discard", err)
    end
    local gone = util.v(res.discarded) or {}
    util.notify("Discarded " .. #gone .. " change(s) in " .. sandbox .. (#gone > 0 and (": " .. table.concat(gone, ", ")) or "."), INFO)
    refresh_qf(sandbox)
    finish(cb, "discard", nil, gone)
  end)
end

-- :Abx log ---------------------------------------------------------------------------------

local function command_of(e)
  local argv = util.v(e.argv)
  if type(argv) == "table" and #argv > 0 then
    if #argv == 3 and argv[1] == "sh" and argv[2] == "-c" then
      return argv[3]
    end
    local parts = {}
    for _, a in ipairs(argv) do
      parts[#parts + 1] = a:match("^[%w@%%+=:,./_-]+$") and a or ("'" .. a:gsub("'", "'\\''") .. "'")
    end
    return table.concat(parts, " ")
  end
  local code = util.v(e.code)
  if type(code) == "string" then
    return nil, code
  end
  return "(" .. tostring(e.kind) .. ")"
end

local function outcome(e)
  if util.v(e.error) then
    return tostring(e.error)
  end
  if util.v(e.signal) then
    return tostring(e.signal)
  end
  if util.v(e.exitCode) ~= nil then
    return "exit " .. tostring(e.exitCode)
  end
  return util.v(e.durationMs) == nil and "running" or "ended"
end

--- The lines of the :Abx log buffer.
function M.log_lines(sandbox, res)
  local entries = util.v(res.entries) or {}
  local dropped = tonumber(util.v(res.dropped)) or 0
  local lines = {
    string.format("Commands run in sandbox %s: %d%s", sandbox, #entries, dropped > 0 and (" (" .. dropped .. " older dropped)") or ""),
    "",
  }
  for _, e in ipairs(entries) do
    local ms = tonumber(util.v(e.durationMs))
    local took = ms and (ms < 1000 and (ms .. " ms") or string.format("%.1f s", ms / 1000)) or nil
    local cwd = util.v(e.cwd)
    lines[#lines + 1] = string.format(
      "#%d  %s  %s  %s  %s%s%s",
      tonumber(e.seq) or 0,
      tostring(util.v(e.startedAt) or "-"):gsub("T", " "):gsub("Z$", " UTC"),
      tostring(e.client),
      tostring(e.kind),
      outcome(e),
      took and ("  " .. took) or "",
      cwd and ("  cwd " .. cwd) or ""
    )
    local cmd, code = command_of(e)
    if cmd then
      lines[#lines + 1] = "    $ " .. cmd
    else
      for _, l in ipairs(vim.split((code:gsub("\n$", "")), "\n")) do
        lines[#lines + 1] = "    " .. l
      end
    end
  end
  return lines
end

--- :Abx log [SANDBOX]: every command run in the sandbox (sandbox/log: exec, terminals,
--- code cells; by whom; exit) in a scratch buffer `abx-log://SANDBOX`. cb(err, result).
function M.log(sandbox, cb)
  abx.call("sandbox/log", { sandbox = sandbox }, function(err, res)
    if not err then
      local buf = util.show_lines("abx-log://" .. sandbox, M.log_lines(sandbox, res), "abxlog", abx.config.split)
      vim.api.nvim_buf_set_var(buf, "abx_sandbox", sandbox)
    end
    finish(cb, "log", err, res)
  end)
end

return M
