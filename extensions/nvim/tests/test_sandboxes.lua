-- :Abx sandboxes: the sandbox list buffer follows the broker's sandbox/changed events (made by
-- another client, the abx CLI, or by a lifetime that ends) with no polling; it subscribes
-- again after the bridge restarts; on a broker without sandbox/subscribe it says so.
local T = require("harness")
local abx = require("abx")
local sandboxes = require("abx.sandboxes")

-- The abx CLI: another client of the same daemon (ABX_HOME comes from the environment).
local function cli(...)
  local out = vim.fn.system({ T.abx_bin, "--json", ... })
  T.eq(0, vim.v.shell_error, "abx " .. table.concat({ ... }, " ") .. ": " .. out)
  if out:match("^%s*$") then
    return {}
  end
  return vim.json.decode(out)
end

-- Counts the sandbox/list requests `client` sends from now on; returns {n} and the undo.
local function count_lists(client)
  local count = { n = 0 }
  local request = client.request
  client.request = function(self, method, ...)
    if method == "sandbox/list" then
      count.n = count.n + 1
    end
    return request(self, method, ...)
  end
  return count, function()
    client.request = request
  end
end

local function line_of(buf, id)
  for _, l in ipairs(T.lines(buf)) do
    if l:find(id, 1, true) then
      return l
    end
  end
end

local function open_live()
  vim.cmd("Abx sandboxes")
  local buf = T.find_buf("abx%-sandboxes$")
  T.ok(buf, "the sandbox list buffer")
  vim.api.nvim_set_current_buf(buf)
  T.wait(function()
    return sandboxes.state().live and sandboxes.state().list and T.lines(buf)[1] == "abx sandboxes (live)"
  end, "the buffer live with a list")
  return buf
end

T.test(":Abx sandboxes follows what the CLI does (create, pause, resume, timeout, kill) without sandbox/list", function()
  local buf = open_live()
  local lists, undo = count_lists(abx.client())
  local sb = cli("create", "--timeout", "600")
  local id = sb.provider .. ":" .. sb.id
  T.wait(function()
    return line_of(buf, id)
  end, id .. " in the buffer")
  T.contains(line_of(buf, id), "running")
  cli("pause", id)
  T.wait(function()
    return (line_of(buf, id) or ""):find("paused", 1, true)
  end, id .. " paused in the buffer")
  cli("resume", id)
  T.wait(function()
    return (line_of(buf, id) or ""):find("running", 1, true)
  end, id .. " running again")
  local before = line_of(buf, id)
  cli("set-timeout", id, "2h")
  T.wait(function()
    return line_of(buf, id) ~= before
  end, "the new expiry in the buffer")
  cli("kill", "--yes", id)
  T.wait(function()
    return line_of(buf, id) == nil
  end, id .. " gone from the buffer")
  undo()
  T.eq(0, lists.n, "no sandbox/list was needed")
  T.eq(false, vim.api.nvim_buf_get_option(buf, "modifiable"))
end)

T.test("a sandbox whose lifetime ends leaves the buffer by itself", function()
  local buf = open_live()
  local lists, undo = count_lists(abx.client())
  local sb = cli("create", "--timeout", "5")
  local id = sb.provider .. ":" .. sb.id
  T.wait(function()
    return line_of(buf, id)
  end, id .. " in the buffer")
  T.wait(function()
    return line_of(buf, id) == nil
  end, id .. " expired and gone", 90000)
  undo()
  T.eq(0, lists.n, "no sandbox/list was needed")
end)

T.test("<CR> on a row offers the actions of that sandbox; x kills it after asking", function()
  local buf = open_live()
  local id = T.sandbox()
  local qualified
  T.wait(function()
    for n, q in pairs(sandboxes.state().rows) do
      if q:find(id, 1, true) then
        qualified = q
        vim.api.nvim_win_set_cursor(0, { n, 0 })
        return true
      end
    end
  end, id .. " in the buffer")
  T.stub_select({})
  vim.api.nvim_feedkeys(vim.api.nvim_replace_termcodes("<CR>", true, false, true), "x", false)
  T.wait(function()
    return T.prompts[1]
  end, "the action picker")
  T.eq("Sandbox " .. qualified, T.prompts[1].prompt)
  T.stub_select({
    function(choice)
      return choice == "Yes"
    end,
  })
  vim.api.nvim_feedkeys("x", "x", false)
  T.wait(function()
    return line_of(buf, id) == nil
  end, id .. " killed and gone from the buffer")
end)

T.test("after the abx rpc bridge dies the buffer subscribes again and keeps following", function()
  local buf = open_live()
  local client = abx.client()
  local old = client.job
  local subscribed = sandboxes.state().subscribed
  vim.loop.kill(vim.fn.jobpid(old), "sigkill")
  -- a new bridge at once (nothing else asks for one), subscribed again, the list read again
  T.wait(function()
    return client.job ~= nil and client.job ~= old
  end, "a new bridge")
  T.wait(function()
    local st = sandboxes.state()
    return st.live and st.subscribed > subscribed and st.lists_in_flight == 0
  end, "subscribed again, and the list read")
  local lists, undo = count_lists(client)
  local sb = cli("create", "--timeout", "600")
  local id = sb.provider .. ":" .. sb.id
  T.wait(function()
    return line_of(buf, id)
  end, id .. " in the buffer after the restart")
  cli("kill", "--yes", id)
  T.wait(function()
    return line_of(buf, id) == nil
  end, id .. " gone")
  undo()
  T.eq(0, lists.n, "no sandbox/list was needed")
end)

T.test("wiping the buffer unsubscribes: no more sandbox/subscribe on new bridges", function()
  local buf = open_live()
  local client = abx.client()
  T.ok(client.persistent.sandboxes, "subscribed")
  vim.api.nvim_buf_delete(buf, { force = true })
  T.eq(nil, client.persistent.sandboxes)
  T.eq(nil, sandboxes.state().live)
end)

T.test("wiped and opened again at once: the subscribe waits for the unsubscribe's reply, and events still come", function()
  local buf = open_live()
  local client = abx.client()
  local seen = {}
  local request = client.request
  client.request = function(self, method, params, cb)
    if method == "sandbox/subscribe" or method == "sandbox/unsubscribe" then
      table.insert(seen, "send " .. method)
      local inner = cb
      cb = function(...)
        table.insert(seen, "reply " .. method)
        if inner then
          return inner(...)
        end
      end
    end
    return request(self, method, params, cb)
  end
  -- the broker serves one connection's requests concurrently: sent together, the
  -- unsubscribe could be handled last and undo the subscribe
  vim.api.nvim_buf_delete(buf, { force = true })
  buf = open_live()
  client.request = request
  T.eq({ "send sandbox/unsubscribe", "reply sandbox/unsubscribe", "send sandbox/subscribe", "reply sandbox/subscribe" }, seen)
  local sb = cli("create", "--timeout", "600")
  local id = sb.provider .. ":" .. sb.id
  table.insert(T.sandboxes, id)
  T.wait(function()
    return line_of(buf, id)
  end, id .. " in the buffer opened again")
end)

T.test("on a broker without sandbox/subscribe the buffer says it is not live; R reads the list", function()
  vim.env.ABX_REAL_BIN = T.abx_bin
  abx.setup({ abx = T.root .. "/tests/old_abx.py" })
  vim.cmd("Abx sandboxes")
  local buf = T.find_buf("abx%-sandboxes$")
  T.wait(function()
    return sandboxes.state().live == false and sandboxes.state().list
  end, "not live, with a list")
  T.eq("abx sandboxes (not live: the broker has no sandbox/subscribe (an older abx); R refreshes)", T.lines(buf)[1])
  local sb = cli("create", "--timeout", "600")
  local id = sb.provider .. ":" .. sb.id
  table.insert(T.sandboxes, id)
  T.eq(nil, line_of(buf, id), "not there before R")
  vim.api.nvim_set_current_buf(buf)
  vim.api.nvim_feedkeys("R", "x", false)
  T.wait(function()
    return line_of(buf, id)
  end, id .. " after R")
end)
