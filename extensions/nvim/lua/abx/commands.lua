-- :Abx {subcommand} [args]: parsing and completion.
local abx = require("abx")
local util = require("abx.util")

local M = {}

local function actions()
  return require("abx.actions")
end

--- Words of `s` and, for word n, the text from it to the end (for shell commands).
local function words(s)
  local out, starts = {}, {}
  for start, w in s:gmatch("()(%S+)") do
    out[#out + 1] = w
    starts[#starts + 1] = start
  end
  return out, function(n)
    if not starts[n] then
      return nil
    end
    return (s:sub(starts[n]):gsub("%s+$", ""))
  end
end

-- key=value arguments of create, and the CLI's network flags: --allow HOST (repeatable),
-- --network none|internet|host|allow:HOST,... (also as allow=HOST and network=...)
local function kv_args(ws, from)
  local opts, env, md = {}, {}, {}
  local allow, mode = {}, nil
  local i = from
  while i <= #ws do
    local w = ws[i]
    local flag, fv = w:match("^%-%-(%a+)=(.*)$")
    if not flag then
      flag = w:match("^%-%-(%a+)$")
      if flag then
        i = i + 1
        fv = ws[i]
        if not fv then
          return nil, "--" .. flag .. " needs a value"
        end
      end
    end
    local k, v
    if flag then
      if flag ~= "allow" and flag ~= "network" then
        return nil, "unknown flag '--" .. flag .. "' (--allow HOST, --network MODE)"
      end
      k, v = flag, fv
    else
      k, v = w:match("^([%w_%.%-]+)=(.*)$")
    end
    if not k then
      return nil, "expected key=value, got '" .. w .. "'"
    end
    local ek = k:match("^env%.(.+)$")
    local mk = k:match("^metadata%.(.+)$") or k:match("^meta%.(.+)$")
    if ek then
      env[ek] = v
    elseif mk then
      md[mk] = v
    elseif k == "template" or k == "timeout" or k == "provider" then
      opts[k] = v
    elseif k == "allow" then
      vim.list_extend(allow, require("abx.network").split_hosts(v))
    elseif k == "network" then
      local n, err = require("abx.network").parse_network(v)
      if not n then
        return nil, err
      end
      if type(n) == "table" then
        vim.list_extend(allow, n.allow)
      else
        mode = n
      end
    else
      return nil, "unknown option '" .. k .. "' (template=, timeout=, provider=, env.K=, metadata.K=, --allow HOST, --network MODE)"
    end
    i = i + 1
  end
  if mode and #allow > 0 then
    return nil, "--network " .. mode .. " and --allow cannot go together: the hosts allowed are a policy of their own"
  end
  if #allow > 0 then
    opts.network = { allow = allow }
  elseif mode then
    opts.network = mode
  end
  opts.env, opts.metadata = env, md
  return opts
end

local function usage(msg)
  util.notify_error(util.make_error("E1009", msg, "See :help abx-commands."))
end

-- name -> {run = function(ws, rest), args = completion kinds per position, help}
M.subcommands = {
  create = {
    help = "create [template=T] [timeout=S] [provider=P] [env.K=V] [metadata.K=V] [--allow HOST]... [--network none|internet|host|allow:HOST,...]",
    run = function(ws)
      local opts, err = kv_args(ws, 2)
      if not opts then
        return usage("create: " .. err)
      end
      actions().create(opts)
    end,
    args = { "create_opt" },
  },
  list = {
    help = "list [PROVIDER]",
    run = function(ws)
      actions().list(ws[2])
    end,
    args = { "provider" },
  },
  sandboxes = {
    help = "sandboxes",
    run = function()
      require("abx.sandboxes").open()
    end,
    args = {},
  },
  info = {
    help = "info [SANDBOX]",
    run = function(ws)
      actions().with_sandbox(ws[2], "Info of", actions().info)
    end,
    args = { "sandbox" },
  },
  kill = {
    help = "kill [SANDBOX]",
    run = function(ws)
      if ws[2] then
        return actions().with_sandbox(ws[2], "Kill", actions().kill)
      end
      actions().with_sandbox(nil, "Kill", function(id)
        actions().sandbox_action("kill", id)
      end)
    end,
    args = { "sandbox" },
  },
  pause = {
    help = "pause [SANDBOX]",
    run = function(ws)
      actions().with_sandbox(ws[2], "Pause", actions().pause)
    end,
    args = { "sandbox" },
  },
  resume = {
    help = "resume [SANDBOX]",
    run = function(ws)
      actions().with_sandbox(ws[2], "Resume", actions().resume)
    end,
    args = { "sandbox" },
  },
  timeout = {
    help = "timeout SANDBOX SECONDS",
    run = function(ws)
      if not ws[3] then
        return usage("Usage: :Abx timeout SANDBOX SECONDS")
      end
      actions().with_sandbox(ws[2], "Set the lifetime of", function(id)
        actions().set_timeout(id, ws[3])
      end)
    end,
    args = { "sandbox" },
  },
  exec = {
    help = "exec SANDBOX CMD...",
    run = function(ws, rest)
      local cmd = rest(3)
      local function go(id)
        if cmd and cmd ~= "" then
          return require("abx.exec").run(id, cmd)
        end
        vim.ui.input({ prompt = "Command in " .. id .. ": " }, function(c)
          if c and c ~= "" then
            require("abx.exec").run(id, c)
          end
        end)
      end
      actions().with_sandbox(ws[2], "Run in", go)
    end,
    args = { "sandbox", "shellcmd" },
  },
  terminal = {
    help = "terminal [SANDBOX] [CMD...]",
    run = function(ws, rest)
      actions().with_sandbox(ws[2], "Terminal on", function(id)
        require("abx.terminal").open(id, rest(3))
      end)
    end,
    args = { "sandbox", "shellcmd" },
  },
  code = {
    help = "[range]code [SANDBOX]",
    run = function(ws, _, o)
      require("abx.code").command(ws[2], o)
    end,
    args = { "sandbox" },
  },
  upload = {
    help = "upload SANDBOX LOCAL [REMOTE]",
    run = function(ws)
      local localpath = ws[3] or vim.fn.expand("%:p")
      actions().with_sandbox(ws[2], "Upload to", function(id)
        actions().upload(id, localpath, ws[4])
      end)
    end,
    args = { "sandbox", "file", "remote" },
  },
  download = {
    help = "download SANDBOX REMOTE [LOCAL]",
    run = function(ws)
      if not ws[3] then
        return usage("Usage: :Abx download SANDBOX REMOTE [LOCAL]")
      end
      actions().with_sandbox(ws[2], "Download from", function(id)
        actions().download(id, ws[3], ws[4])
      end)
    end,
    args = { "sandbox", "remote", "file" },
  },
  ports = {
    help = "ports SANDBOX PORT",
    run = function(ws)
      local function go(id, port)
        actions().ports(id, port)
      end
      actions().with_sandbox(ws[2], "Port of", function(id)
        if ws[3] then
          return go(id, ws[3])
        end
        vim.ui.input({ prompt = "Port: " }, function(p)
          if p and p ~= "" then
            go(id, p)
          end
        end)
      end)
    end,
    args = { "sandbox" },
  },
  open = {
    help = "open SANDBOX [PATH]",
    run = function(ws)
      actions().with_sandbox(ws[2], "Browse", function(id)
        actions().open(id, ws[3])
      end)
    end,
    args = { "sandbox", "remote" },
  },
  mount = {
    help = "mount [PATH] [overlay|ro|rw]",
    run = function(ws)
      local dir, mode = ws[2], ws[3]
      if dir and require("abx.workspace").MODES[dir] and not mode then
        dir, mode = nil, dir
      end
      require("abx.workspace").mount(dir, mode)
    end,
    args = { "dir", "mode" },
  },
  diff = {
    help = "diff [SANDBOX]",
    run = function(ws)
      local id = ws[2]
      if not id and abx.current_sandbox() then
        id = "."
      end
      actions().with_sandbox(id, "Changes of", function(sb)
        require("abx.workspace").diff(sb)
      end)
    end,
    args = { "sandbox" },
  },
  apply = {
    help = "apply[!] [PATHS...]",
    bang = true,
    run = function(ws, _, _, bang)
      require("abx.workspace").apply(vim.list_slice(ws, 2), bang)
    end,
    args = { "change", "change", "change", "change", "change", "change", "change", "change" },
  },
  discard = {
    help = "discard [PATHS...]",
    run = function(ws)
      require("abx.workspace").discard(vim.list_slice(ws, 2))
    end,
    args = { "change", "change", "change", "change", "change", "change", "change", "change" },
  },
  log = {
    help = "log [SANDBOX]",
    run = function(ws)
      local id = ws[2]
      if not id and abx.current_sandbox() then
        id = "."
      end
      actions().with_sandbox(id, "Command log of", function(sb)
        require("abx.workspace").log(sb)
      end)
    end,
    args = { "sandbox" },
  },
  network = {
    help = "network [SANDBOX]",
    run = function(ws)
      local id = ws[2]
      if not id and abx.current_sandbox() then
        id = "."
      end
      actions().with_sandbox(id, "Network of", function(sb)
        require("abx.network").show(sb)
      end)
    end,
    args = { "sandbox" },
  },
  allow = {
    help = "allow HOST[,HOST...] [SANDBOX]",
    run = function(ws)
      if not ws[2] then
        return usage("Usage: :Abx allow HOST[,HOST...] [SANDBOX]")
      end
      local hosts = require("abx.network").split_hosts(ws[2])
      local id = ws[3]
      if not id and abx.current_sandbox() then
        id = "."
      end
      actions().with_sandbox(id, "Allow " .. ws[2] .. " for", function(sb)
        require("abx.network").allow(sb, hosts)
      end)
    end,
    args = { "host", "sandbox" },
  },
  providers = {
    help = "providers",
    run = function()
      actions().providers()
    end,
    args = {},
  },
  doctor = {
    help = "doctor [PROVIDER]",
    run = function(ws)
      actions().doctor(ws[2])
    end,
    args = { "provider" },
  },
  test = {
    help = "test PROVIDER [FILTER]",
    run = function(ws)
      if not ws[2] then
        return usage("Usage: :Abx test PROVIDER [FILTER]")
      end
      actions().test(ws[2], ws[3])
    end,
    args = { "provider" },
  },
  status = {
    help = "status",
    run = function()
      actions().status()
    end,
    args = {},
  },
  use = {
    help = "use [SANDBOX]",
    run = function(ws)
      actions().with_sandbox(ws[2], "Use", function(id)
        abx.set_current(id)
        util.notify("Current sandbox: " .. id)
      end)
    end,
    args = { "sandbox" },
  },
  cancel = {
    help = "cancel",
    run = function()
      local n = abx.cancel_all()
      util.notify(n == 0 and "No request in flight." or ("Cancelled " .. n .. " request(s)."))
    end,
    args = {},
  },
}

function M.names()
  return util.keys(M.subcommands)
end

--- Run `:Abx {args}`; `o` is the command's info (its range, for :Abx code).
function M.run(args, o)
  local ws, rest = words(args or "")
  local name = ws[1]
  if not name then
    local lines = { "Usage: :Abx {subcommand}" }
    for _, n in ipairs(M.names()) do
      lines[#lines + 1] = "  " .. M.subcommands[n].help
    end
    return util.notify(table.concat(lines, "\n"))
  end
  -- `:Abx apply! ...` and `:Abx! apply ...` are the same
  local bang = o ~= nil and o.bang == true
  local sub = M.subcommands[name]
  if not sub and name:sub(-1) == "!" and M.subcommands[name:sub(1, -2)] then
    sub, bang = M.subcommands[name:sub(1, -2)], true
  end
  if not sub or (bang and not sub.bang) then
    return usage("Unknown subcommand '" .. name .. (bang and name:sub(-1) ~= "!" and "!" or "") .. "'. Subcommands: " .. table.concat(M.names(), ", ") .. ".")
  end
  sub.run(ws, rest, o, bang)
end

-- completion -------------------------------------------------------------------------

local cache = {} -- key -> {list, at}

--- Forget the cached sandbox and provider ids (after create, kill, ...).
function M.invalidate()
  cache = {}
end

local function cached(key, fetch)
  local now = vim.loop.now()
  local c = cache[key]
  if c and now - c.at < 5000 then
    return vim.deepcopy(c.list)
  end
  local ok, list = pcall(fetch)
  if ok and list then
    cache[key] = { list = list, at = now }
    return vim.deepcopy(list)
  end
  return {}
end

local function sandbox_ids()
  return cached("sandboxes", function()
    local res = abx.call_sync("sandbox/list", nil, 3000)
    local out = {}
    for _, sb in ipairs(res and util.v(res.sandboxes) or {}) do
      out[#out + 1] = sb.id
      out[#out + 1] = abx.qualified(sb)
    end
    return out
  end)
end

local function provider_ids()
  return cached("providers", function()
    local res = abx.call_sync("provider/list", nil, 3000)
    local out = {}
    for _, p in ipairs(res and util.v(res.providers) or {}) do
      out[#out + 1] = p.id
    end
    return out
  end)
end

local function remote_paths(sandbox, lead)
  if not sandbox then
    return {}
  end
  if sandbox == "." then
    sandbox = abx.current_sandbox()
    if not sandbox then
      return {}
    end
  end
  -- "/tmp/x" lists /tmp/; a relative "ma" lists /workspace (relative paths live there)
  local dir = lead:match("^(.*/)")
  local res = abx.call_sync("files/list", { sandbox = sandbox, path = dir or "/workspace" }, 3000)
  local out = {}
  for _, e in ipairs(res and util.v(res.entries) or {}) do
    out[#out + 1] = (dir or "") .. e.name .. (e.type == "directory" and "/" or "")
  end
  if lead == "" then
    table.insert(out, 1, "/workspace/")
    table.insert(out, 2, "/tmp/")
  end
  return out
end

local function filter(items, lead)
  local out, seen = {}, {}
  for _, it in ipairs(items) do
    if it:sub(1, #lead) == lead and not seen[it] then
      seen[it] = true
      out[#out + 1] = it
    end
  end
  return out
end

--- customlist completion of :Abx.
function M.complete(arglead, cmdline, cursorpos)
  local before = cmdline:sub(1, cursorpos)
  before = before:gsub("^%s*%S+", "", 1) -- the command name
  local ws = words(before)
  local index = #ws
  if before == "" or before:match("%s$") then
    index = index + 1
  end
  if index <= 1 then
    return filter(M.names(), arglead)
  end
  local sub = M.subcommands[ws[1]] or M.subcommands[(ws[1]:gsub("!$", ""))]
  if not sub then
    return {}
  end
  local kind = sub.args[index - 1]
  if sub.args[1] == "create_opt" then
    kind = "create_opt"
  end
  if kind == "sandbox" then
    local ids = sandbox_ids()
    table.insert(ids, 1, ".")
    return filter(ids, arglead)
  elseif kind == "provider" then
    return filter(provider_ids(), arglead)
  elseif kind == "create_opt" then
    local p = arglead:match("^provider=(.*)$")
    if p then
      local out = {}
      for _, id in ipairs(provider_ids()) do
        out[#out + 1] = "provider=" .. id
      end
      return filter(out, arglead)
    end
    local n = arglead:match("^network=(.*)$") or arglead:match("^%-%-network=(.*)$")
    if n then
      local prefix = arglead:sub(1, #arglead - #n)
      return filter({ prefix .. "none", prefix .. "internet", prefix .. "host", prefix .. "allow:" }, arglead)
    end
    local prev = before:match("%s$") and ws[#ws] or ws[#ws - 1]
    if prev == "--network" then
      return filter({ "none", "internet", "host", "allow:" }, arglead)
    end
    return filter({ "template=", "timeout=", "provider=", "env.", "metadata.", "--allow", "--network", "allow=", "network=" }, arglead)
  elseif kind == "host" then
    -- the hosts the sandbox (argument or current) was refused, as :Abx allow takes them
    local ok, list = pcall(function()
      local id = abx.current_sandbox()
      if not id then
        return {}
      end
      local sb = abx.call_sync("sandbox/info", { sandbox = id }, 3000)
      local p = require("abx.network").policy_of(sb)
      local out = {}
      for _, b in ipairs(p and util.v(p.blocked) or {}) do
        out[#out + 1] = require("abx.network").allow_entry(tostring(b.host), b.port)
      end
      return out
    end)
    return ok and filter(list, arglead) or {}
  elseif kind == "file" then
    return vim.fn.getcompletion(arglead, "file")
  elseif kind == "dir" then
    local out = vim.fn.getcompletion(arglead, "dir")
    if arglead == "" then
      vim.list_extend(out, { "overlay", "ro", "rw" })
    end
    return filter(out, arglead)
  elseif kind == "mode" then
    return filter({ "overlay", "ro", "rw" }, arglead)
  elseif kind == "change" then
    -- the paths of the last :Abx diff
    local last = require("abx.workspace").last
    local out = {}
    for _, c in ipairs(last and last.changes or {}) do
      out[#out + 1] = c.path
    end
    return filter(out, arglead)
  elseif kind == "remote" then
    local ok, list = pcall(remote_paths, ws[2], arglead)
    return ok and filter(list, arglead) or {}
  end
  return {}
end

--- Define :Abx (plugin/abx.lua does this).
function M.setup_command()
  vim.api.nvim_create_user_command("Abx", function(o)
    local ok, e = pcall(M.run, o.args, o)
    if not ok then
      util.notify("abx: " .. tostring(e), vim.log.levels.ERROR)
    end
  end, {
    nargs = "*",
    range = true,
    bang = true,
    complete = function(a, c, p)
      return M.complete(a, c, p)
    end,
    desc = "abx sandboxes: :Abx {subcommand} (see :help abx)",
  })
end

return M
