-- setup({host = ...}): the bridge (`abx rpc`) runs with ABX_HOST set to it, so the CLI
-- reaches the broker of that machine over ssh. An `abx` wrapper records the environment it
-- was started with, then runs the real abx without ABX_HOST (the "remote" is this machine).
local T = require("harness")
local abx = require("abx")

local function recording_abx()
  local dir = vim.fn.tempname()
  vim.fn.mkdir(dir, "p")
  local log = dir .. "/env.log"
  local file = dir .. "/abx-recording"
  local f = assert(io.open(file, "w"))
  f:write("#!/bin/sh\n")
  f:write("printf '%s ABX_HOST=%s\\n' \"$1\" \"${ABX_HOST-unset}\" >> '" .. log .. "'\n")
  f:write("exec env -u ABX_HOST '" .. T.abx_bin .. "' \"$@\"\n")
  f:close()
  vim.fn.setfperm(file, "rwx------")
  return file, log
end

local function read(path)
  local f = io.open(path, "r")
  if not f then
    return ""
  end
  local s = f:read("*a")
  f:close()
  return s
end

T.test("host: abx rpc runs with ABX_HOST; env is kept beside it", function()
  vim.env.ABX_HOST = nil
  local wrapper, log = recording_abx()
  T.reset_config({ abx = wrapper, host = " ssh://dev@build-box:2222 ", env = { ABX_TEST_MARK = "1" } })
  T.eq("ssh://dev@build-box:2222", abx.bridge_env().ABX_HOST)
  T.eq("1", abx.bridge_env().ABX_TEST_MARK)
  T.ok(abx.call_sync("broker/ping"), "ping through the recording abx")
  T.contains(read(log), "rpc ABX_HOST=ssh://dev@build-box:2222\n")
  T.reset_config()
end)

T.test("a changed host starts a new bridge; no host: no ABX_HOST", function()
  vim.env.ABX_HOST = nil
  local wrapper, log = recording_abx()
  T.reset_config({ abx = wrapper, host = "dev@one" })
  T.ok(abx.call_sync("broker/ping"), "first ping")
  local job = abx.client().job
  abx.setup({ abx = wrapper, host = "dev@two" })
  T.ok(abx.call_sync("broker/ping"), "ping on the new bridge")
  T.ok(abx.client().job ~= job, "a new bridge for the new host")
  T.contains(read(log), "rpc ABX_HOST=dev@one\n")
  T.contains(read(log), "rpc ABX_HOST=dev@two\n")
  abx.setup({ abx = wrapper })
  T.eq(nil, abx.bridge_env())
  T.ok(abx.call_sync("broker/ping"), "ping without host")
  T.contains(read(log), "rpc ABX_HOST=unset\n")
  T.reset_config()
end)
