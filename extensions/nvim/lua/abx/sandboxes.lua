-- :Abx sandboxes: a buffer listing every sandbox of every provider, kept up to date by the
-- broker's events instead of polling.
--
-- While it is open the client is subscribed (`sandbox/subscribe`, sent again on every new
-- bridge: rpc.lua `persist`) and each `sandbox/changed` (created, killed, paused, resumed,
-- expired, timeout; by this Neovim, the CLI, an agent, or the broker when a lifetime ends) is
-- applied to the list; changes that come close together redraw it once. The list is read with
-- `sandbox/list` when the buffer opens and after each (re)subscription (events may have been
-- missed while the bridge was gone); a list still on its way gets the events that came
-- meanwhile applied on top of it. A broker without `sandbox/subscribe` (-32601) is said in
-- the buffer's first line: it is then refreshed with `R` only.
local abx = require("abx")
local util = require("abx.util")

local M = {}

M.NAME = "abx-sandboxes"
-- changes within this many ms redraw the buffer once
M.DEBOUNCE_MS = 50

local KEY = "sandboxes"

local state = {
  client = nil, -- the rpc client subscribed on, and its listener's remover
  off = nil,
  live = nil, -- true: subscribed; false: not (note says why); nil: not asked yet
  note = nil,
  subscribed = 0, -- how many times sandbox/subscribe succeeded (once per bridge)
  list = nil, -- Sandbox objects, nil until read
  errors = {}, -- sandbox/list's errors [{provider, code, message}]
  list_error = nil, -- why the last sandbox/list failed
  lists_in_flight = 0,
  during = {}, -- events received while a list was in flight
  redraw_pending = false,
  reload_pending = false,
  rows = {}, -- line number -> qualified id
}

--- The state (for tests and :checkhealth): live, note, list.
function M.state()
  return state
end

local function qualified(sb)
  return abx.qualified(sb)
end

local function shallow(t)
  local out = {}
  for k, v in pairs(t) do
    out[k] = v
  end
  return out
end

local function change_ref(p)
  local id = tostring(util.v(p.sandbox) or "")
  local provider = util.v(p.provider)
  if id:find(":", 1, true) or not provider then
    return id
  end
  return provider .. ":" .. id
end

local function gone(change)
  return change == "killed" or change == "expired"
end

--- `list` with one sandbox/changed applied (a new table), and whether the event said too
--- little (no sandboxInfo for a sandbox not listed, or a change this version does not know).
function M.apply(list, p)
  local ref = change_ref(p)
  local change = util.v(p.change)
  local out, at = {}, nil
  for i, sb in ipairs(list) do
    out[i] = sb
    if qualified(sb) == ref then
      at = i
    end
  end
  if gone(change) then
    if at then
      table.remove(out, at)
    end
    return out, false
  end
  local info = util.v(p.sandboxInfo)
  if type(info) == "table" and type(util.v(info.id)) == "string" then
    info = shallow(info)
    if not util.v(info.provider) then
      info.provider = util.v(p.provider)
    end
    out[at or (#out + 1)] = info
    return out, false
  end
  if at and (change == "paused" or change == "resumed") then
    local sb = shallow(out[at])
    sb.status = change == "paused" and "paused" or "running"
    out[at] = sb
    return out, false
  end
  return out, true
end

local function buffer()
  local b = vim.fn.bufnr("^" .. M.NAME .. "$")
  if b > 0 and vim.api.nvim_buf_is_valid(b) then
    return b
  end
  return nil
end

local function sorted(list)
  local out = shallow(list)
  table.sort(out, function(a, b)
    local pa, pb = tostring(util.v(a.provider) or ""), tostring(util.v(b.provider) or "")
    if pa ~= pb then
      return pa < pb
    end
    return tostring(a.id) < tostring(b.id)
  end)
  return out
end

--- Redraw the buffer from the state (no request).
function M.render()
  local buf = buffer()
  if not buf then
    return
  end
  local head
  if state.live then
    head = "abx sandboxes (live)"
  elseif state.live == false then
    head = "abx sandboxes (not live: " .. tostring(state.note) .. "; R refreshes)"
  else
    head = "abx sandboxes (connecting...)"
  end
  local lines = { head, "<CR> actions  i info  t terminal  o files  x kill  R refresh  q close", "" }
  state.rows = {}
  if state.list == nil then
    lines[#lines + 1] = "(loading...)"
  elseif #state.list == 0 then
    lines[#lines + 1] = "(no sandboxes: :Abx create)"
  else
    local fmt = require("abx.actions").format_sandbox
    for _, sb in ipairs(sorted(state.list)) do
      lines[#lines + 1] = fmt(sb)
      state.rows[#lines] = qualified(sb)
    end
  end
  if state.list_error then
    lines[#lines + 1] = "! sandbox/list: " .. state.list_error
  end
  for _, e in ipairs(state.errors or {}) do
    lines[#lines + 1] = string.format("! %s: [%s] %s", tostring(util.v(e.provider)), tostring(util.v(e.code)), tostring(util.v(e.message)))
  end
  vim.api.nvim_buf_set_option(buf, "modifiable", true)
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, lines)
  vim.api.nvim_buf_set_option(buf, "modifiable", false)
  vim.api.nvim_buf_set_option(buf, "modified", false)
end

local function redraw_soon()
  if state.redraw_pending then
    return
  end
  state.redraw_pending = true
  vim.defer_fn(function()
    state.redraw_pending = false
    if state.reload_pending then
      state.reload_pending = false
      M.refresh()
    else
      M.render()
    end
  end, M.DEBOUNCE_MS)
end

--- Read the list again (sandbox/list); cb(err) when done.
function M.refresh(cb)
  state.lists_in_flight = state.lists_in_flight + 1
  local seen = #state.during
  abx.call("sandbox/list", nil, function(err, res)
    state.lists_in_flight = state.lists_in_flight - 1
    local later = { unpack(state.during, seen + 1) }
    if state.lists_in_flight == 0 then
      state.during = {}
    end
    if err then
      state.list_error = (util.format_error(err):gsub("\n.*", ""))
      M.render()
      if cb then
        cb(err)
      end
      return
    end
    local list = util.v(res.sandboxes) or {}
    for _, p in ipairs(later) do
      list = M.apply(list, p)
    end
    state.list, state.list_error = list, nil
    state.errors = util.v(res.errors) or {}
    M.render()
    if cb then
      cb(nil)
    end
  end)
end

local function on_changed(p)
  if type(p) ~= "table" or type(util.v(p.sandbox)) ~= "string" then
    return
  end
  if state.lists_in_flight > 0 then
    table.insert(state.during, p)
  end
  if state.list then
    local reload
    state.list, reload = M.apply(state.list, p)
    if reload then
      state.reload_pending = true
    end
  end
  local ref = change_ref(p)
  if gone(util.v(p.change)) and abx.current and (abx.current == ref or ref:sub(-#abx.current - 1) == ":" .. abx.current) then
    abx.current = nil
  end
  -- completion caches sandbox ids: they changed
  local commands = package.loaded["abx.commands"]
  if commands then
    commands.invalidate()
  end
  redraw_soon()
end

local function on_subscribed(err)
  if not err then
    state.live, state.note = true, nil
    state.subscribed = state.subscribed + 1
  else
    state.live = false
    if err.code == -32601 or util.error_code(err) == "E1003" then
      state.note = "the broker has no sandbox/subscribe (an older abx)"
    else
      state.note = (util.format_error(err):gsub("\n.*", ""))
    end
  end
  -- (again) subscribed: what happened meanwhile is read once
  M.refresh()
end

--- Subscribe on the current client (again when it was replaced, e.g. by setup()).
function M.subscribe()
  local c = abx.client()
  if state.client == c and c.persistent[KEY] then
    return
  end
  if state.off then
    state.off()
  end
  state.client = c
  state.live = nil
  state.off = c:on("sandbox/changed", on_changed)
  -- a subscribed connection also gets sandbox/blocked (network policies): shown as they come
  require("abx.network").listen()
  c:persist(KEY, "sandbox/subscribe", nil, on_subscribed)
end

--- No more events: unsubscribed, the listener removed (the buffer went).
function M.unsubscribe()
  if state.client then
    -- abx.network keeps the connection subscribed for sandbox/blocked: then no unsubscribe
    local keep = require("abx.network").watching(state.client)
    state.client:forget(KEY, not keep and { "sandbox/unsubscribe", nil } or nil)
  end
  if state.off then
    state.off()
  end
  state.client, state.off, state.live = nil, nil, nil
  state.list, state.errors, state.during, state.lists_in_flight = nil, {}, {}, 0
end

local function row_id(buf)
  local id = state.rows[vim.api.nvim_win_get_cursor(0)[1]]
  if not id then
    util.notify("No sandbox on this line.", vim.log.levels.WARN)
  end
  return id
end

local function sandbox_of(id)
  for _, sb in ipairs(state.list or {}) do
    if qualified(sb) == id then
      return sb
    end
  end
end

--- Open (or show) the sandbox list buffer; returns it.
function M.open()
  local fresh = buffer() == nil
  local buf = util.scratch(M.NAME, "abxsandboxes")
  if fresh then
    local function map(lhs, fn)
      vim.api.nvim_buf_set_keymap(buf, "n", lhs, "", { noremap = true, silent = true, nowait = true, callback = fn })
    end
    local actions = require("abx.actions")
    map("<CR>", function()
      local id = row_id(buf)
      if id then
        actions.sandbox_menu(id, sandbox_of(id))
      end
    end)
    map("i", function()
      local id = row_id(buf)
      if id then
        actions.info(id)
      end
    end)
    map("t", function()
      local id = row_id(buf)
      if id then
        require("abx.terminal").open(id)
      end
    end)
    map("o", function()
      local id = row_id(buf)
      if id then
        actions.open(id, "/workspace/")
      end
    end)
    map("x", function()
      local id = row_id(buf)
      if id then
        actions.sandbox_action("kill", id)
      end
    end)
    map("R", function()
      M.subscribe()
      M.refresh()
    end)
    vim.api.nvim_create_autocmd("BufWipeout", {
      buffer = buf,
      once = true,
      callback = function()
        M.unsubscribe()
      end,
    })
  end
  M.render()
  util.show_buffer(buf, abx.config.split)
  -- subscribes (then reads the list) unless it follows the events already
  M.subscribe()
  return buf
end

return M
