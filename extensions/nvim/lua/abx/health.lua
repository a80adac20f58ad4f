-- :checkhealth abx. Neovim 0.10+ has vim.health.start/ok/...; 0.7-0.9 have the
-- health#report_* functions (0.8/0.9 also vim.health.report_*).
local M = {}

local function reporter()
  local h = vim.health
  if h and h.start then
    return h
  end
  local function vimfn(name)
    return function(...)
      vim.fn["health#report_" .. name](...)
    end
  end
  return {
    start = (h and h.report_start) or vimfn("start"),
    ok = (h and h.report_ok) or vimfn("ok"),
    info = (h and h.report_info) or vimfn("info"),
    warn = (h and h.report_warn) or vimfn("warn"),
    error = (h and h.report_error) or vimfn("error"),
  }
end

function M.check()
  local r = reporter()
  local abx = require("abx")
  local util = require("abx.util")
  local cfg = abx.config

  r.start("Neovim")
  if vim.fn.has("nvim-0.7") == 1 then
    local v = vim.version()
    r.ok(string.format("Neovim %d.%d.%d", v.major, v.minor, v.patch))
  else
    r.error("Neovim 0.7 or later is needed.")
  end

  r.start("The abx binary")
  local exe = vim.fn.exepath(cfg.abx)
  if exe == "" then
    r.error("'" .. cfg.abx .. "' is not executable.", {
      "Install abx (cargo build -p abx-cli) and put it on $PATH, or set require('abx').setup{abx = '/path/to/abx'}.",
    })
    return
  end
  local out = vim.fn.system({ exe, "--version" })
  if vim.v.shell_error ~= 0 then
    r.error(exe .. " --version failed: " .. vim.trim(out))
    return
  end
  r.ok(vim.trim(out) .. " (" .. exe .. ")")
  if cfg.env and next(cfg.env) then
    r.info("Extra environment for 'abx rpc': " .. table.concat(util.keys(cfg.env), ", "))
  end
  if vim.env.ABX_HOME and vim.env.ABX_HOME ~= "" then
    r.info("ABX_HOME=" .. vim.env.ABX_HOME)
  end

  r.start("The broker")
  local st, err = abx.call_sync("broker/status", nil, math.min(cfg.request_timeout, 15000))
  if err then
    r.error("The broker does not answer: " .. util.format_error(err), {
      "Run 'abx broker start' and 'abx broker status'; the log is under $ABX_HOME/data/logs or $XDG_DATA_HOME/abx/logs.",
    })
    return
  end
  r.ok(string.format(
    "broker %s, pid %s, %s connection(s), %s sandbox(es)",
    tostring(util.v(st.version)),
    tostring(util.v(st.pid)),
    tostring(util.v(st.connections)),
    type(util.v(st.sandboxes)) == "table" and tostring(#st.sandboxes) or tostring(util.v(st.sandboxes))
  ))
  if util.v(st.version) and util.v(st.version) ~= abx.version then
    r.info("abx.nvim " .. abx.version .. " talks to broker " .. tostring(st.version) .. " (API abx/1).")
  end
  if util.v(st.logFile) then
    r.info("log: " .. tostring(st.logFile))
  end

  r.start("Providers")
  local pl, perr = abx.call_sync("provider/list", nil, math.min(cfg.request_timeout, 15000))
  if perr then
    r.error("provider/list failed: " .. util.format_error(perr))
    return
  end
  local default
  local actions = require("abx.actions")
  for _, p in ipairs(util.v(pl.providers) or {}) do
    if p.default then
      default = p.id
    end
    local doc, derr = abx.call_sync("provider/doctor", { id = p.id }, math.min(cfg.request_timeout, 30000))
    local line = actions.format_provider(p)
    if derr then
      r.error(line .. ": " .. util.format_error(derr))
    elseif doc.ok then
      r.ok(line)
    else
      local bad = {}
      for _, c in ipairs(util.v(doc.checks) or {}) do
        if not c.ok then
          bad[#bad + 1] = tostring(c.name) .. ": " .. tostring(util.v(c.detail))
        end
      end
      r.warn(line .. " -- doctor: " .. table.concat(bad, "; "), { "Run 'abx provider doctor " .. p.id .. "'." })
    end
  end
  local want = cfg.provider
  if want then
    local found = false
    for _, p in ipairs(util.v(pl.providers) or {}) do
      found = found or p.id == want
    end
    if found then
      r.ok("setup{provider = '" .. want .. "'} is installed")
    else
      r.error("setup{provider = '" .. want .. "'} is not installed", { "Run 'abx provider list'." })
    end
  elseif default then
    r.ok("default provider: " .. default)
  end
end

return M
