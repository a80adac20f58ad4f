-- Egress by name (issue 44): a sandbox's network policy ({allow, deny}) and the attempts it
-- refused. `:Abx network [SANDBOX]` shows them (sandbox/info), `:Abx allow HOST [SANDBOX]`
-- adds a host (sandbox/info, then sandbox/setNetwork: new connections follow it, open ones go
-- on), and `sandbox/blocked` notifications are shown with vim.notify, naming the :Abx allow
-- command; once per host of a sandbox until that host is allowed or `:Abx network` showed it.
--
-- The notifications come on a subscribed connection: `:Abx sandboxes` subscribes, and so does
-- this module (`watch`) once a sandbox with a policy is created, shown or changed here.
local abx = require("abx")
local util = require("abx.util")

local M = {}

M.KEY = "network" -- rpc.lua persist key of this module's sandbox/subscribe

-- "provider:id|host" already notified (until allowed or shown)
M.notified = {}
-- the rpc client whose sandbox/blocked this module listens to, and its remover
local listening = { client = nil, off = nil }

local MODES = { none = true, internet = true, host = true }

--- Patterns from "a,b c" (commas or spaces), empty ones dropped.
function M.split_hosts(s)
  local out = {}
  for h in tostring(s or ""):gmatch("[^,%s]+") do
    out[#out + 1] = h
  end
  return out
end

--- The `network` of sandbox/create for the CLI's `--network` value: a mode, or
--- `allow:HOST,HOST` (a policy); nil and a message when it is neither.
function M.parse_network(v)
  if MODES[v] then
    return v
  end
  local list = v and v:match("^allow:(.*)$")
  if list then
    local hosts = M.split_hosts(list)
    if #hosts == 0 then
      return nil, "'allow:' needs at least one host (allow:example.com,api.example:8443)"
    end
    return { allow = hosts }
  end
  return nil, "unknown network '" .. tostring(v) .. "' (none, internet, host, allow:HOST,...)"
end

--- What "allow" adds for a refused host:port: the host for 80 and 443, else host:port.
function M.allow_entry(host, port)
  port = tonumber(port)
  if not port or port == 80 or port == 443 then
    return host
  end
  if host:find(":", 1, true) and not host:find("^%[") then
    return "[" .. host .. "]:" .. port
  end
  return host .. ":" .. port
end

local function entry_text(e)
  if type(e) == "table" then
    return tostring(util.v(e.host)) .. " (+headers)"
  end
  return tostring(e)
end

local function entry_host(e)
  if type(e) == "table" then
    return tostring(util.v(e.host))
  end
  return tostring(e)
end

local function times(n)
  n = tonumber(n) or 0
  return n == 1 and "once" or (n .. " times")
end

--- The policy of a Sandbox (nil for a mode or nothing said).
function M.policy_of(sb)
  local n = type(sb) == "table" and util.v(sb.network) or nil
  if type(n) == "table" and type(util.v(n.allow)) == "table" then
    return n
  end
  return nil
end

local function key(sandbox, host)
  return tostring(sandbox) .. "|" .. tostring(host)
end

--- Forget what was notified for `sandbox` (its `host` only, when given).
function M.reset(sandbox, host)
  for k in pairs(M.notified) do
    local s, h = k:match("^(.*)|(.*)$")
    if (s == sandbox or s:sub(-#sandbox - 1) == ":" .. sandbox or sandbox:sub(-#s - 1) == ":" .. s) and (not host or h == host) then
      M.notified[k] = nil
    end
  end
end

--- The lines of `:Abx network` for a Sandbox.
function M.lines(id, sb)
  local lines = { "Sandbox  " .. id }
  local n = util.v(sb.network)
  local p = M.policy_of(sb)
  if not p then
    lines[#lines + 1] = "Network  " .. tostring(n or "-") .. " (a mode: no host list; a sandbox created with --allow HOST has one)"
    return lines
  end
  local allow = {}
  for _, e in ipairs(util.v(p.allow) or {}) do
    allow[#allow + 1] = entry_text(e)
  end
  local deny = util.v(p.deny) or {}
  lines[#lines + 1] = "Network  only these hosts (a policy)"
  lines[#lines + 1] = "Allow    " .. (#allow > 0 and table.concat(allow, ", ") or "-")
  lines[#lines + 1] = "Deny     " .. (#deny > 0 and table.concat(deny, ", ") or "-")
  local blocked = util.v(p.blocked) or {}
  if #blocked == 0 then
    lines[#lines + 1] = "Blocked  nothing yet"
  else
    lines[#lines + 1] = "Blocked"
    for _, b in ipairs(blocked) do
      lines[#lines + 1] = string.format(
        "  %s:%s  %s  last %s  (:Abx allow %s %s)",
        tostring(b.host),
        tostring(b.port),
        times(b.count),
        tostring(util.v(b.last) or "-"),
        M.allow_entry(tostring(b.host), b.port),
        id
      )
    end
  end
  return lines
end

--- :Abx network SANDBOX: the policy and what it refused, in a scratch buffer.
function M.show(id, cb)
  abx.call("sandbox/info", { sandbox = id }, function(err, sb)
    if err then
      if cb then
        return cb(err)
      end
      return util.notify_error(err, "network")
    end
    if M.policy_of(sb) then
      M.watch()
    end
    M.reset(id)
    local buf = util.show_lines("abx-network:" .. id, M.lines(id, sb), "abxinfo", abx.config.split)
    if cb then
      cb(nil, sb, buf)
    end
  end)
end

--- Adds `hosts` to the allow list of sandbox `id` (sandbox/info, then sandbox/setNetwork);
--- cb(err, sandbox).
function M.allow(id, hosts, cb)
  local function done(err, res)
    if err then
      if cb then
        return cb(err)
      end
      return util.notify_error(err, "allow")
    end
    if cb then
      cb(nil, res)
    end
  end
  if #hosts == 0 then
    return done(util.make_error("E1009", "Name a host to allow.", "Usage: :Abx allow HOST[,HOST...] [SANDBOX]"))
  end
  abx.call("sandbox/info", { sandbox = id }, function(err, sb)
    if err then
      return done(err)
    end
    local p = M.policy_of(sb)
    if not p then
      return done(util.make_error(
        "E1004",
        "Sandbox " .. id .. " has no host list to add to: its network is '" .. tostring(util.v(sb.network) or "not reported") .. "'.",
        "Hosts can be allowed for a sandbox created with a list of hosts (:Abx create --allow HOST); a network mode cannot become a policy while it runs."
      ))
    end
    local allow, have = {}, {}
    for _, e in ipairs(util.v(p.allow) or {}) do
      allow[#allow + 1] = e
      have[entry_host(e)] = true
    end
    for _, h in ipairs(hosts) do
      if not have[h] then
        allow[#allow + 1] = h
        have[h] = true
      end
    end
    local network = { allow = allow }
    local deny = util.v(p.deny)
    if type(deny) == "table" and #deny > 0 then
      network.deny = deny
    end
    abx.call("sandbox/setNetwork", { sandbox = id, network = network }, function(err2, res)
      if err2 then
        return done(err2)
      end
      M.watch()
      for _, h in ipairs(hosts) do
        M.reset(id, (h:gsub(":%d+$", ""):gsub("^%[(.*)%]$", "%1")))
      end
      util.notify("Sandbox " .. id .. " may now reach " .. table.concat(hosts, ", ") .. ".")
      done(nil, res)
    end)
  end)
end

--- The text of a `sandbox/blocked` notification.
function M.blocked_text(p)
  local id = tostring(util.v(p.sandbox))
  local provider = util.v(p.provider)
  if provider and not id:find(":", 1, true) then
    id = provider .. ":" .. id
  end
  local host, port, count = tostring(util.v(p.host)), util.v(p.port), tonumber(util.v(p.count)) or 1
  return string.format(
    "abx: sandbox %s tried to reach %s:%s (blocked %d %s). To allow it: :Abx allow %s %s",
    id,
    host,
    tostring(port),
    count,
    count == 1 and "time" or "times",
    M.allow_entry(host, port),
    id
  ),
    id
end

local function on_blocked(p)
  if type(p) ~= "table" or type(util.v(p.sandbox)) ~= "string" or type(util.v(p.host)) ~= "string" then
    return
  end
  local text, id = M.blocked_text(p)
  -- once per host of a sandbox: a retry loop is not a stream of messages
  local k = key(id, p.host)
  if M.notified[k] then
    return
  end
  M.notified[k] = true
  util.notify(text, vim.log.levels.WARN)
end

--- Listen to sandbox/blocked on the current client (once per client).
function M.listen()
  local c = abx.client()
  if listening.client == c then
    return c
  end
  if listening.off then
    listening.off()
  end
  listening.client = c
  listening.off = c:on("sandbox/blocked", on_blocked)
  return c
end

--- Listen, and keep this connection subscribed (sandbox/subscribe, again on every new bridge).
function M.watch()
  local c = M.listen()
  if not c.persistent[M.KEY] then
    c:persist(M.KEY, "sandbox/subscribe", nil, function() end)
  end
end

--- Whether this module keeps the connection subscribed (sandboxes.lua then leaves it so).
function M.watching(c)
  return c ~= nil and c.persistent[M.KEY] ~= nil
end

return M
