-- abx.nvim: sandboxes in Neovim through the abx broker (`abx rpc`).
--
-- require('abx').setup{...} sets options; everything else is reached through :Abx, the
-- abx:// buffers and the Lua functions below (each takes a callback `cb(err, result)`;
-- without one, errors are shown with vim.notify).
local util = require("abx.util")
local rpc = require("abx.rpc")

local M = {}

M.version = "0.1.0"

local defaults = {
  -- the abx binary (a name on $PATH or a path)
  abx = "abx",
  -- extra environment for `abx rpc` (e.g. {ABX_HOME = "/tmp/x"}); nil: Neovim's own
  env = nil,
  -- a broker on another machine: "ssh://user@host[:port]" (or "user@host"); `abx rpc`
  -- runs with ABX_HOST set to it and reaches that broker through `ssh host abx rpc`
  -- (nil: this machine's broker, or ABX_HOST of Neovim's environment)
  host = nil,
  -- sandbox/create defaults; nil lets the broker choose (default provider, template
  -- `base`, 300 s lifetime)
  provider = nil,
  template = nil,
  timeout = nil,
  -- how long (ms) a blocking request (abx:// reads and writes, completion) may take
  -- before it is cancelled with $/cancelRequest
  request_timeout = 30000,
  -- the Ex command that opens windows for exec output, terminals and info buffers
  split = "botright split",
  -- the command of :Abx terminal (nil: the sandbox's bash -i, else sh -i)
  shell = nil,
  -- watch open abx:// files (files/watch) and reload them when they change in the sandbox
  watch = true,
  -- bytes per files/read and files/write chunk (the broker reads at most 4 MiB at once)
  chunk_size = 4 * 1024 * 1024,
}

M.config = vim.deepcopy(defaults)

local client = nil

--- The environment `abx rpc` gets on top of Neovim's: `env`, and ABX_HOST from `host`.
function M.bridge_env()
  local env = vim.deepcopy(M.config.env or {})
  local host = M.config.host
  if type(host) == "string" and vim.trim(host) ~= "" then
    env.ABX_HOST = vim.trim(host)
  end
  if next(env) == nil then
    return nil
  end
  return env
end

--- Options (see :help abx-setup). May be called again; a changed `abx`, `env` or `host`
--- restarts the bridge on the next request.
function M.setup(opts)
  opts = opts or {}
  local old_cmd, old_env = M.config.abx, vim.inspect(M.bridge_env())
  M.config = vim.tbl_deep_extend("force", vim.deepcopy(defaults), opts)
  if client and (M.config.abx ~= old_cmd or vim.inspect(M.bridge_env()) ~= old_env) then
    client:stop()
    client = nil
  elseif client then
    client.request_timeout = M.config.request_timeout
  end
  return M
end

--- The JSON-RPC client (started on first use).
function M.client()
  if not client then
    client = rpc.new({
      cmd = { M.config.abx, "rpc" },
      env = M.bridge_env(),
      request_timeout = M.config.request_timeout,
      client_info = { name = "abx.nvim", version = M.version },
    })
  end
  return client
end

--- Stop the bridge (`abx rpc`); the next request starts a new one.
function M.stop(silent)
  if client then
    client:stop(silent)
    client = nil
  end
end

--- Send a request. `cb(err, result)`; without cb an error is notified.
function M.call(method, params, cb)
  return M.client():request(method, params, function(err, res)
    if cb then
      cb(err, res)
    elseif err then
      util.notify_error(err, method)
    end
  end)
end

--- Send a request and wait for the reply. Returns result, err.
function M.call_sync(method, params, timeout_ms)
  return M.client():request_sync(method, params, timeout_ms)
end

--- Cancel every request still waiting for a reply ($/cancelRequest). Returns how many.
function M.cancel_all()
  if not client then
    return 0
  end
  local list = client:in_flight()
  for _, r in ipairs(list) do
    client:cancel(r.id)
  end
  return #list
end

-- the current sandbox -----------------------------------------------------------------

-- The sandbox `.` stands for: the one of the current abx:// buffer, else the last one
-- created or picked.
M.current = nil

function M.set_current(id)
  M.current = id
end

function M.current_sandbox()
  local name = vim.api.nvim_buf_get_name(0)
  local sb = name:match("^abx://([^/]+)")
  if sb then
    return sb
  end
  local ok, v = pcall(vim.api.nvim_buf_get_var, 0, "abx_sandbox")
  if ok and type(v) == "string" then
    return v
  end
  return M.current
end

--- `provider:id` of a Sandbox object.
function M.qualified(sb)
  if sb.provider and not tostring(sb.id):find(":", 1, true) then
    return sb.provider .. ":" .. sb.id
  end
  return sb.id
end

return M
