-- The JSON-RPC client against the real broker: requests, errors, notifications,
-- cancellation, a bridge that cannot start.
local T = require("harness")
local abx = require("abx")
local rpc = require("abx.rpc")
local util = require("abx.util")

T.test("requests get results: broker/ping, initialize", function()
  local r, e = abx.call_sync("broker/ping")
  T.eq(nil, e)
  T.eq("table", type(r))
  local init = abx.call_sync("initialize", { clientInfo = { name = "abx.nvim-test", version = "0" } })
  T.eq("abx/1", init.protocolVersion)
  T.eq("abx-broker", init.serverInfo.name)
end)

T.test("concurrent requests are matched to their replies", function()
  local got = {}
  for i = 1, 20 do
    abx.call("exec/run", nil, function() end) -- invalid params: answered, not mixed up
    abx.call("broker/ping", nil, function(e, r)
      got[#got + 1] = { i = i, ok = e == nil and type(r) == "table" }
    end)
  end
  T.wait(function()
    return #got == 20
  end, "20 ping replies")
  for _, g in ipairs(got) do
    T.ok(g.ok, "ping " .. g.i)
  end
end)

T.test("broker errors carry their E-code and suggestion", function()
  local r, e = abx.call_sync("sandbox/info", { sandbox = "no-such-sandbox" })
  T.eq(nil, r)
  T.eq(2009, e.code)
  T.eq("E2009", util.error_code(e))
  T.contains(util.format_error(e), "[E2009] Sandbox 'no-such-sandbox' not found.")
  T.contains(util.format_error(e), "Suggestion: ")
  local _, e2 = abx.call_sync("no/such/method")
  T.eq(-32601, e2.code)
  T.eq("E1003", util.error_code(e2))
  local _, e3 = abx.call_sync("sandbox/create", { timeout = 0 })
  T.eq("E2004", util.error_code(e3))
end)

T.test("exec/output and exec/exit notifications reach the exec's handlers in order", function()
  local sb = T.sandbox()
  local c = abx.client()
  local res = abx.call_sync("exec/start", { sandbox = sb, command = "printf 'one\\n'; printf 'two\\n' >&2; printf 'x\\377y'; exit 7", stdin = "" })
  T.ok(res and res.execId, "exec id")
  local outputs, exit = {}, nil
  c:subscribe_exec(res.execId, {
    on_output = function(p)
      table.insert(outputs, { p.stream, util.decode_data(p.data, util.v(p.encoding)) })
    end,
    on_exit = function(p)
      exit = p
    end,
  })
  T.wait(function()
    return exit
  end, "exec/exit")
  T.eq(7, exit.exitCode)
  local stdout, stderr = {}, {}
  for _, o in ipairs(outputs) do
    table.insert(o[1] == "stderr" and stderr or stdout, o[2])
  end
  T.eq("one\nx\255y", table.concat(stdout), "stdout bytes (the non-UTF-8 chunk came base64)")
  T.eq("two\n", table.concat(stderr))
end)

T.test("generic notification listeners get files/changed", function()
  local sb = T.sandbox()
  local seen = {}
  local off = abx.client():on("files/changed", function(p)
    table.insert(seen, p)
  end)
  local w = abx.call_sync("files/watch", { sandbox = sb, path = "/workspace", recursive = true })
  T.ok(w and w.watchId, "watch id")
  T.write_file(sb, "/workspace/watched.txt", "hello\n")
  T.wait(function()
    for _, p in ipairs(seen) do
      if p.watchId == w.watchId and p.path:find("watched.txt", 1, true) then
        return true
      end
    end
  end, "files/changed for watched.txt")
  off()
  abx.call_sync("files/unwatch", { watchId = w.watchId })
end)

T.test("$/cancelRequest cancels a running request (-32800, E1006)", function()
  local sb = T.sandbox()
  local done, err
  local id = abx.call("exec/run", { sandbox = sb, command = "sleep 300" }, function(e)
    done, err = true, e
  end)
  T.ok(id, "request id")
  -- the command is running once the sandbox lists a sleep process
  T.wait(function()
    local r = abx.call_sync("process/list", { sandbox = sb })
    for _, p in ipairs(r and r.processes or {}) do
      if tostring(p.command):find("sleep", 1, true) then
        return true
      end
    end
  end, "sleep to run")
  abx.client():cancel(id)
  T.wait(function()
    return done
  end, "the cancelled reply")
  T.eq(-32800, err.code)
  T.eq("E1006", util.error_code(err))
  T.wait(function()
    local r = abx.call_sync("process/list", { sandbox = sb })
    for _, p in ipairs(r and r.processes or {}) do
      if tostring(p.command):find("sleep", 1, true) then
        return false
      end
    end
    return true
  end, "the sleep to be killed")
end)

T.test(":Abx cancel cancels what is in flight", function()
  local sb = T.sandbox()
  local err
  abx.call("exec/run", { sandbox = sb, command = "sleep 300" }, function(e)
    err = e
  end)
  local runs = vim.tbl_filter(function(r)
    return r.method == "exec/run"
  end, abx.client():in_flight())
  T.eq(1, #runs, "one exec/run in flight")
  vim.cmd("Abx cancel")
  T.ok(T.find_note("Cancelled "), "notified")
  T.wait(function()
    return err
  end, "the cancelled reply")
  T.eq("E1006", util.error_code(err))
end)

T.test("a blocking request past its timeout is cancelled with E1006", function()
  local sb = T.sandbox()
  local r, e = abx.client():request_sync("exec/run", { sandbox = sb, command = "sleep 300" }, 300)
  T.eq(nil, r)
  T.eq("E1006", util.error_code(e))
  T.contains(e.message, "no reply within 300 ms")
  -- the connection is still usable
  T.ok(abx.call_sync("broker/ping"), "ping after cancel")
end)

T.test("a bridge that cannot start gives E1007", function()
  local c = rpc.new({ cmd = { "/nonexistent/abx", "rpc" } })
  local r, e = c:request_sync("broker/ping", nil, 5000)
  T.eq(nil, r)
  T.eq("E1007", util.error_code(e))
  T.contains(util.format_error(e), "Suggestion:")
  -- and through :Abx, the error is notified with its code
  abx.setup({ abx = "/nonexistent/abx" })
  vim.cmd("Abx status")
  T.wait_note("[E1007]")
end)

T.test("the client restarts the bridge after it exits", function()
  T.ok(abx.call_sync("broker/ping"), "first ping")
  local job = abx.client().job
  vim.fn.jobstop(job)
  T.wait(function()
    return not abx.client():is_running()
  end, "the bridge to exit")
  T.ok(abx.call_sync("broker/ping"), "ping on a new bridge")
  T.ok(abx.client().job ~= job, "a new job")
end)
