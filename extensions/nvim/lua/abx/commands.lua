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

-- key=value arguments of create
local function kv_args(ws, from)
  local opts, env, md = {}, {}, {}
  for i = from, #ws do
    local k, v = ws[i]:match("^([%w_%.%-]+)=(.*)$")
    if not k then
      return nil, "expected key=value, got '" .. ws[i] .. "'"
    end
    local ek = k:match("^env%.(.+)$")
    local mk = k:match("^metadata%.(.+)$") or k:match("^meta%.(.+)$")
    if ek then
      env[ek] = v
    elseif mk then
      md[mk] = v
    elseif k == "template" or k == "timeout" or k == "provider" then
      opts[k] = v
    else
      return nil, "unknown option '" .. k .. "' (template=, timeout=, provider=, env.K=, metadata.K=)"
    end
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
    help = "create [template=T] [timeout=S] [provider=P] [env.K=V] [metadata.K=V]",
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
  local sub = M.subcommands[name]
  if not sub then
    return usage("Unknown subcommand '" .. name .. "'. Subcommands: " .. table.concat(M.names(), ", ") .. ".")
  end
  sub.run(ws, rest, o)
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
  local sub = M.subcommands[ws[1]]
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
    return filter({ "template=", "timeout=", "provider=", "env.", "metadata." }, arglead)
  elseif kind == "file" then
    return vim.fn.getcompletion(arglead, "file")
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
    complete = function(a, c, p)
      return M.complete(a, c, p)
    end,
    desc = "abx sandboxes: :Abx {subcommand} (see :help abx)",
  })
end

return M
