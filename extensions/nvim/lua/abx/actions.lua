-- The user-facing operations behind :Abx. Every function takes a callback `cb(err, result)`
-- (optional): with one, the caller handles errors; without, they are notified with their
-- E-code and suggestion. Results are notified or shown in scratch buffers either way.
local abx = require("abx")
local util = require("abx.util")

local M = {}

local INFO = vim.log.levels.INFO

-- completion caches sandbox ids for a few seconds: drop them when the list changes
local function invalidate()
  local commands = package.loaded["abx.commands"]
  if commands then
    commands.invalidate()
  end
end

-- Run `cb(err, res)` if given, else notify the error.
local function finish(cb, context, err, res)
  if err then
    if cb then
      cb(err, nil)
    else
      util.notify_error(err, context)
    end
    return
  end
  if cb then
    cb(nil, res)
  end
end

local function fmt_time(t)
  t = util.v(t)
  if type(t) ~= "string" then
    return "-"
  end
  return (t:gsub("T", " "):gsub("Z$", " UTC"))
end

--- One line per sandbox for pickers: `local:sb-1  running  base  expires 2026-...`.
function M.format_sandbox(sb)
  return string.format(
    "%s  %s  %s  expires %s",
    abx.qualified(sb),
    tostring(util.v(sb.status) or "?"),
    tostring(util.v(sb.template) or "-"),
    fmt_time(sb.expiresAt)
  )
end

--- The `abx info` layout of a Sandbox.
function M.sandbox_lines(sb)
  local rows = {
    { "ID", abx.qualified(sb) },
    { "Template", util.v(sb.template) or "-" },
    { "Status", util.v(sb.status) or "-" },
    { "Region", util.v(sb.region) or "-" },
    { "Timeout", util.v(sb.timeout) and (tostring(sb.timeout) .. "s") or "-" },
    { "URL", util.v(sb.url) or "-" },
    { "Started", fmt_time(sb.startedAt) },
    { "Provider", util.v(sb.provider) or "-" },
    { "Expires", fmt_time(sb.expiresAt) },
  }
  local md = util.v(sb.metadata)
  if type(md) == "table" and next(md) then
    local parts = {}
    for _, k in ipairs(util.keys(md)) do
      parts[#parts + 1] = k .. "=" .. tostring(md[k])
    end
    rows[#rows + 1] = { "Metadata", table.concat(parts, ", ") }
  end
  local net = util.v(sb.network)
  local policy = require("abx.network").policy_of(sb)
  if policy then
    local blocked = util.v(policy.blocked) or {}
    rows[#rows + 1] = { "Network", "only these hosts (" .. #(util.v(policy.allow) or {}) .. " allowed, " .. #blocked .. " blocked: :Abx network)" }
  elseif type(net) == "string" then
    rows[#rows + 1] = { "Network", net }
  end
  return util.kv_lines(rows)
end

-- sandboxes ------------------------------------------------------------------------

--- sandbox/create. opts: provider, template, timeout (s), env, metadata.
function M.create(opts, cb)
  opts = opts or {}
  local c = abx.config
  local params = {
    provider = opts.provider or c.provider,
    template = opts.template or c.template,
    timeout = tonumber(opts.timeout or c.timeout),
    env = not util.is_empty(opts.env) and opts.env or nil,
    metadata = not util.is_empty(opts.metadata) and opts.metadata or nil,
    -- a mode (none, internet, host) or a policy {allow = {HOST, ...}} (issue 44)
    network = opts.network,
  }
  util.notify("Creating a sandbox...", INFO)
  abx.call("sandbox/create", params, function(err, sb)
    invalidate()
    if not err then
      abx.set_current(abx.qualified(sb))
      local net = ""
      local policy = require("abx.network").policy_of(sb)
      if policy then
        local hosts = {}
        for _, e in ipairs(util.v(policy.allow) or {}) do
          hosts[#hosts + 1] = type(e) == "table" and tostring(util.v(e.host)) or tostring(e)
        end
        net = ", network: only " .. table.concat(hosts, ", ")
        -- its refusals are shown as they come (sandbox/blocked)
        require("abx.network").watch()
      elseif type(util.v(sb.network)) == "string" and sb.network ~= "none" then
        net = ", network: " .. sb.network
      end
      util.notify(
        string.format(
          "Created sandbox %s (template %s, expires %s%s).",
          abx.qualified(sb),
          tostring(util.v(sb.template) or "-"),
          fmt_time(sb.expiresAt),
          net
        ),
        INFO
      )
    end
    finish(cb, "create", err, sb)
  end)
end

--- sandbox/list (every provider, or `provider`); cb(err, sandboxes).
function M.sandboxes(provider, cb)
  abx.call("sandbox/list", { provider = provider }, function(err, res)
    if err then
      return cb(err, nil)
    end
    cb(nil, util.v(res.sandboxes) or {})
  end)
end

--- Pick a sandbox with vim.ui.select (the current one first); cb(id) (nil: none picked).
function M.pick_sandbox(prompt, cb, provider)
  M.sandboxes(provider, function(err, list)
    if err then
      return util.notify_error(err, "list")
    end
    if #list == 0 then
      util.notify("No sandboxes found. Create one with :Abx create.", vim.log.levels.WARN)
      return cb(nil)
    end
    local cur = abx.current
    table.sort(list, function(a, b)
      local qa, qb = abx.qualified(a), abx.qualified(b)
      if (qa == cur) ~= (qb == cur) then
        return qa == cur
      end
      return (util.v(a.startedAt) or "") > (util.v(b.startedAt) or "")
    end)
    vim.ui.select(list, { prompt = prompt or "Sandbox", format_item = M.format_sandbox, kind = "abx.sandbox" }, function(sb)
      if sb then
        abx.set_current(abx.qualified(sb))
        cb(abx.qualified(sb), sb)
      else
        cb(nil)
      end
    end)
  end)
end

--- `id` when given (`.` is the current sandbox), else a picker; then cb(id).
function M.with_sandbox(id, prompt, cb)
  if id == "." then
    id = abx.current_sandbox()
    if not id then
      return util.notify("No current sandbox: create or pick one first (:Abx create, :Abx list).", vim.log.levels.WARN)
    end
  end
  if id and id ~= "" then
    return cb(id)
  end
  M.pick_sandbox(prompt, function(picked)
    if picked then
      cb(picked)
    end
  end)
end

--- :Abx list: a picker of sandboxes, then a picker of actions on the chosen one.
function M.list(provider)
  M.pick_sandbox("Sandboxes", function(id, sb)
    if id then
      M.sandbox_menu(id, sb)
    end
  end, provider)
end

--- Actions on one sandbox (vim.ui.select).
function M.sandbox_menu(id, sb)
  local items = {
    { "info", "Info" },
    { "exec", "Run a command (streamed output)" },
    { "terminal", "Terminal" },
    { "files", "Browse files (abx://" .. id .. "/workspace/)" },
  }
  if sb and util.v(sb.status) == "paused" then
    items[#items + 1] = { "resume", "Resume" }
  else
    items[#items + 1] = { "pause", "Pause" }
  end
  for _, it in ipairs({
    { "timeout", "Set the lifetime" },
    { "ports", "URL of a port" },
    { "upload", "Upload the current file" },
    { "kill", "Kill" },
  }) do
    items[#items + 1] = it
  end
  vim.ui.select(items, {
    prompt = "Sandbox " .. id,
    kind = "abx.action",
    format_item = function(it)
      return it[2]
    end,
  }, function(it)
    if it then
      M.sandbox_action(it[1], id)
    end
  end)
end

function M.sandbox_action(action, id)
  if action == "info" then
    M.info(id)
  elseif action == "exec" then
    vim.ui.input({ prompt = "Command in " .. id .. ": " }, function(cmd)
      if cmd and cmd ~= "" then
        require("abx.exec").run(id, cmd)
      end
    end)
  elseif action == "terminal" then
    require("abx.terminal").open(id)
  elseif action == "files" then
    M.open(id, "/workspace/")
  elseif action == "pause" then
    M.pause(id)
  elseif action == "resume" then
    M.resume(id)
  elseif action == "timeout" then
    vim.ui.input({ prompt = "Lifetime from now (seconds): " }, function(s)
      if s and s ~= "" then
        M.set_timeout(id, s)
      end
    end)
  elseif action == "ports" then
    vim.ui.input({ prompt = "Port: " }, function(p)
      if p and p ~= "" then
        M.ports(id, p)
      end
    end)
  elseif action == "upload" then
    M.upload(id, vim.fn.expand("%:p"), nil)
  elseif action == "kill" then
    vim.ui.select({ "No", "Yes" }, { prompt = "Kill sandbox " .. id .. "?", kind = "abx.confirm" }, function(choice)
      if choice == "Yes" then
        M.kill(id)
      end
    end)
  end
end

--- sandbox/info, shown in a scratch buffer.
function M.info(id, cb)
  abx.call("sandbox/info", { sandbox = id }, function(err, sb)
    if not err then
      util.show_lines("abx-info:" .. id, M.sandbox_lines(sb), "abxinfo", abx.config.split)
    end
    finish(cb, "info", err, sb)
  end)
end

function M.kill(id, cb)
  abx.call("sandbox/kill", { sandbox = id }, function(err, res)
    invalidate()
    if not err then
      if abx.current == id then
        abx.current = nil
      end
      local gone = type(res) == "table" and res.killed == false
      util.notify("Sandbox " .. id .. " killed" .. (gone and " (it was already gone)." or "."), INFO)
    end
    finish(cb, "kill", err, res)
  end)
end

local function lifecycle(method, word)
  return function(id, cb)
    abx.call(method, { sandbox = id }, function(err, sb)
      if not err then
        util.notify("Sandbox " .. abx.qualified(sb) .. " " .. word .. ".", INFO)
      end
      finish(cb, word, err, sb)
    end)
  end
end

M.pause = lifecycle("sandbox/pause", "paused")
M.resume = lifecycle("sandbox/resume", "resumed")

function M.set_timeout(id, seconds, cb)
  abx.call("sandbox/setTimeout", { sandbox = id, timeout = tonumber(seconds) or seconds }, function(err, sb)
    if not err then
      util.notify("Sandbox " .. abx.qualified(sb) .. " now expires at " .. fmt_time(sb.expiresAt) .. ".", INFO)
    end
    finish(cb, "set-timeout", err, sb)
  end)
end

-- files ----------------------------------------------------------------------------

local function basename(p)
  return (p:gsub("/+$", ""):match("([^/]+)$")) or p
end

--- Show files/progress of one transfer in the message area; returns the unsubscribe.
local function progress(id, path, verb)
  local last = -1
  return abx.client():on("files/progress", function(p)
    if p.path ~= path then
      return
    end
    local total = tonumber(p.total) or 0
    if total <= 0 then
      return
    end
    local pct = math.floor(p.bytes * 100 / total)
    if pct ~= last then
      last = pct
      vim.api.nvim_echo({ { string.format("abx: %s %s %d%% (%d/%d bytes)", verb, path, pct, p.bytes, total) } }, false, {})
    end
  end)
end

--- files/upload: the broker streams LOCAL (made absolute) to REMOTE (default
--- /workspace/<basename>).
function M.upload(id, localpath, remote, cb)
  if not localpath or localpath == "" then
    return finish(cb, "upload", util.make_error("E1009", "Give the local file to upload.", "Usage: :Abx upload SANDBOX LOCAL [REMOTE]"))
  end
  local abs = vim.fn.fnamemodify(vim.fn.expand(localpath), ":p")
  remote = (remote and remote ~= "") and remote or ("/workspace/" .. basename(abs))
  local unsub = progress(id, remote, "upload")
  abx.call("files/upload", { sandbox = id, localPath = abs, path = remote }, function(err, res)
    unsub()
    if not err then
      util.notify(string.format("Uploaded %s -> %s (%d bytes)", abs, remote, tonumber(res.size) or 0), INFO)
    end
    finish(cb, "upload", err, res)
  end)
end

--- files/download: REMOTE to LOCAL (default: the working directory; an existing
--- directory gets the remote file's name).
function M.download(id, remote, localpath, cb)
  if not remote or remote == "" then
    return finish(cb, "download", util.make_error("E1009", "Give the sandbox file to download.", "Usage: :Abx download SANDBOX REMOTE [LOCAL]"))
  end
  local target = (localpath and localpath ~= "") and vim.fn.expand(localpath) or "."
  target = vim.fn.fnamemodify(target, ":p")
  if vim.fn.isdirectory(target) == 1 then
    target = target:gsub("/+$", "") .. "/" .. basename(remote)
  end
  local unsub = progress(id, remote, "download")
  abx.call("files/download", { sandbox = id, path = remote, localPath = target }, function(err, res)
    unsub()
    if not err then
      util.notify(string.format("Downloaded %s -> %s (%d bytes)", remote, target, tonumber(res.size) or 0), INFO)
    end
    finish(cb, "download", err, res)
  end)
end

--- Edit abx://ID/PATH (a directory lists its entries).
function M.open(id, path)
  path = path or "/workspace/"
  if path:sub(1, 1) ~= "/" then
    path = "/workspace/" .. path
  end
  vim.cmd("edit " .. vim.fn.fnameescape("abx://" .. id .. path))
end

-- ports ----------------------------------------------------------------------------

function M.ports(id, port, cb)
  local n = tonumber(port)
  if not n then
    return finish(cb, "ports", util.make_error("E1009", "Give a port number (got '" .. tostring(port) .. "').", "Usage: :Abx ports SANDBOX PORT"))
  end
  abx.call("ports/url", { sandbox = id, port = n }, function(err, res)
    if not err then
      local msg = "Port " .. n .. " of " .. id .. ": " .. tostring(res.url)
      local headers = util.v(res.headers)
      if type(headers) == "table" then
        for _, k in ipairs(util.keys(headers)) do
          msg = msg .. "\n  " .. k .. ": " .. tostring(headers[k])
        end
      end
      util.notify(msg, INFO)
    end
    finish(cb, "ports", err, res)
  end)
end

-- providers ------------------------------------------------------------------------

-- `sandbox.lifecycle sandbox.pause exec.run` -> `sandbox(lifecycle,pause) exec(run)`
function M.group_features(features)
  local order, groups = {}, {}
  for _, f in ipairs(features or {}) do
    local g, rest = f:match("^([^.]+)%.(.+)$")
    g = g or f
    if not groups[g] then
      groups[g] = {}
      order[#order + 1] = g
    end
    if rest then
      table.insert(groups[g], rest)
    end
  end
  local out = {}
  for _, g in ipairs(order) do
    if #groups[g] > 0 then
      out[#out + 1] = g .. "(" .. table.concat(groups[g], ",") .. ")"
    else
      out[#out + 1] = g
    end
  end
  return table.concat(out, " ")
end

function M.format_provider(p)
  return string.format(
    "%s  %s %s  %s/%s%s  %s",
    p.id,
    tostring(p.name),
    tostring(p.version),
    tostring(p.kind),
    tostring(p.trust),
    p.default and "  (default)" or "",
    M.group_features(util.v(p.features))
  )
end

function M.provider_list(cb)
  abx.call("provider/list", nil, function(err, res)
    if err then
      return cb(err, nil)
    end
    cb(nil, util.v(res.providers) or {})
  end)
end

--- :Abx providers: pick a provider, then info / doctor / make default / create here.
function M.providers()
  M.provider_list(function(err, list)
    if err then
      return util.notify_error(err, "providers")
    end
    vim.ui.select(list, { prompt = "Providers", format_item = M.format_provider, kind = "abx.provider" }, function(p)
      if not p then
        return
      end
      local items = {
        { "info", "Info" },
        { "doctor", "Doctor" },
        { "test", "Run the contract kit" },
        { "default", "Make it the default" },
        { "create", "Create a sandbox here" },
      }
      vim.ui.select(items, {
        prompt = "Provider " .. p.id,
        kind = "abx.action",
        format_item = function(it)
          return it[2]
        end,
      }, function(it)
        if not it then
          return
        end
        if it[1] == "info" then
          M.provider_info(p.id)
        elseif it[1] == "doctor" then
          M.doctor(p.id)
        elseif it[1] == "test" then
          M.test(p.id)
        elseif it[1] == "default" then
          abx.call("provider/setDefault", { id = p.id }, function(e)
            if e then
              return util.notify_error(e, "provider default")
            end
            util.notify("Default provider is now '" .. p.id .. "'.", INFO)
          end)
        elseif it[1] == "create" then
          M.create({ provider = p.id })
        end
      end)
    end)
  end)
end

local function flat(v)
  v = util.v(v)
  if type(v) == "table" then
    if v[1] ~= nil or next(v) == nil then
      local parts = {}
      for _, x in ipairs(v) do
        parts[#parts + 1] = flat(x)
      end
      return table.concat(parts, ", ")
    end
    local parts = {}
    for _, k in ipairs(util.keys(v)) do
      local x = util.v(v[k])
      if x ~= nil then
        parts[#parts + 1] = k .. "=" .. flat(x)
      end
    end
    return table.concat(parts, ", ")
  end
  return tostring(v)
end

function M.provider_info(id, cb)
  abx.call("provider/info", { id = id }, function(err, info)
    if not err then
      local rows = {}
      local first = { "id", "name", "version", "kind", "default", "trust", "features", "description" }
      local seen = {}
      for _, k in ipairs(first) do
        local v = util.v(info[k])
        if v ~= nil then
          rows[#rows + 1] = { k, k == "features" and M.group_features(v) or flat(v) }
        end
        seen[k] = true
      end
      for _, k in ipairs(util.keys(info)) do
        local v = util.v(info[k])
        if not seen[k] and v ~= nil then
          rows[#rows + 1] = { k, flat(v) }
        end
      end
      util.show_lines("abx-provider:" .. id, util.kv_lines(rows), "abxinfo", abx.config.split)
    end
    finish(cb, "provider info", err, info)
  end)
end

--- :Abx doctor [ID]: provider/doctor of one provider or of all of them, plus the
--- broker's status, in a scratch buffer. cb(nil, {lines, ok}).
function M.doctor(id, cb)
  local function run(ids)
    local lines, all_ok = {}, true
    local i = 0
    local function step()
      i = i + 1
      if i > #ids then
        util.show_lines("abx-doctor", lines, "abxdoctor", abx.config.split)
        if not all_ok then
          util.notify("abx doctor: some checks failed.", vim.log.levels.WARN)
        end
        if cb then
          cb(nil, { lines = lines, ok = all_ok })
        end
        return
      end
      abx.call("provider/doctor", { id = ids[i] }, function(err, res)
        lines[#lines + 1] = "Provider " .. ids[i]
        if err then
          all_ok = false
          for _, l in ipairs(vim.split(util.format_error(err), "\n")) do
            lines[#lines + 1] = "  fail  " .. l
          end
        else
          for _, chk in ipairs(util.v(res.checks) or {}) do
            if not chk.ok then
              all_ok = false
            end
            local code = util.v(chk.code)
            lines[#lines + 1] = string.format(
              "  %-4s  %-12s %s%s",
              chk.ok and "ok" or "fail",
              tostring(chk.name),
              code and ("[" .. code .. "] ") or "",
              tostring(util.v(chk.detail) or "")
            )
          end
        end
        lines[#lines + 1] = ""
        step()
      end)
    end
    step()
  end
  if id and id ~= "" then
    return run({ id })
  end
  M.provider_list(function(err, list)
    if err then
      return finish(cb, "doctor", err)
    end
    local ids = {}
    for _, p in ipairs(list) do
      ids[#ids + 1] = p.id
    end
    run(ids)
  end)
end

--- :Abx test PROVIDER [FILTER]: the contract kit (provider/test); each result is appended
--- to a scratch buffer as its provider/testResult notification arrives, then the totals.
--- cb(err, result).
function M.test(id, filter, cb)
  local name = "abx-test:" .. id
  local buf = util.scratch(name, "abxtest")
  vim.api.nvim_buf_set_option(buf, "modifiable", true)
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, { "Contract kit on provider " .. id .. (filter and (" (filter " .. filter .. ")") or "") })
  vim.api.nvim_buf_set_option(buf, "modifiable", false)
  util.show_buffer(buf, abx.config.split)
  local function add(line)
    if vim.api.nvim_buf_is_valid(buf) then
      vim.api.nvim_buf_set_option(buf, "modifiable", true)
      vim.api.nvim_buf_set_lines(buf, -1, -1, false, { line })
      vim.api.nvim_buf_set_option(buf, "modifiable", false)
    end
  end
  local function result_line(r)
    local detail = util.v(r.detail)
    return string.format(
      "%-8s %s%s%s",
      tostring(r.outcome),
      tostring(r.name),
      r.durationMs and string.format(" (%d ms)", r.durationMs) or "",
      detail and (": " .. tostring(detail):gsub("\n", " ")) or ""
    )
  end
  local seen = 0
  local off = abx.client():on("provider/testResult", function(r)
    if r.id == id then
      seen = seen + 1
      add(result_line(r))
    end
  end)
  abx.call("provider/test", { id = id, filter = (filter and filter ~= "") and filter or nil }, function(err, res)
    off()
    if err then
      add(util.format_error(err))
    else
      if seen == 0 then -- a broker that sends no notifications: the results at the end
        for _, r in ipairs(util.v(res.results) or {}) do
          add(result_line(r))
        end
      end
      add(string.format("%d passed, %d failed, %d skipped", res.passed or 0, res.failed or 0, res.skipped or 0))
      local level = (res.failed or 0) > 0 and vim.log.levels.WARN or INFO
      util.notify(string.format("abx test %s: %d passed, %d failed, %d skipped", id, res.passed or 0, res.failed or 0, res.skipped or 0), level)
    end
    pcall(vim.api.nvim_buf_set_var, buf, "abx_test_done", true)
    finish(cb, "test", err, res)
  end)
  return buf
end

--- broker/status in a scratch buffer.
function M.status(cb)
  abx.call("broker/status", nil, function(err, st)
    if not err then
      local rows = {}
      for _, k in ipairs({ "version", "pid", "uptimeMs", "connections", "inFlight", "socket", "dataDir", "logFile" }) do
        if util.v(st[k]) ~= nil then
          rows[#rows + 1] = { k, flat(st[k]) }
        end
      end
      local sbs = util.v(st.sandboxes)
      if sbs ~= nil then
        rows[#rows + 1] = { "sandboxes", flat(sbs) }
      end
      for _, p in ipairs(util.v(st.providers) or {}) do
        rows[#rows + 1] = { "provider", flat(p) }
      end
      util.show_lines("abx-status", util.kv_lines(rows), "abxinfo", abx.config.split)
    end
    finish(cb, "status", err, st)
  end)
end

return M
