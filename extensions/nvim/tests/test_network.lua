-- Egress by name (issue 44) against the real broker: :Abx create --allow HOST / --network
-- (as the CLI takes them), :Abx network (the policy and the blocked hosts), :Abx allow
-- (sandbox/setNetwork), and sandbox/blocked shown with vim.notify naming :Abx allow, once per
-- host. No traffic leaves the machine: the refused requests go to the sandbox's proxy on its
-- loopback, for names under `.invalid` that nothing allows, refused by name before anything
-- is resolved (broker/egress/src/proxy.rs); a host once allowed is not asked for again.
local T = require("harness")
local abx = require("abx")
local net = require("abx.network")

local function info(id)
  local sb, err = abx.call_sync("sandbox/info", { sandbox = id })
  T.ok(sb, "sandbox/info: " .. vim.inspect(err))
  return sb
end

local function allowed(id)
  local p = net.policy_of(info(id))
  return p and p.allow or {}
end

local function curl(id, url)
  return vim.trim(T.sh(id, "curl -s -o /dev/null -w '%{http_code}' " .. url).stdout)
end

local function count_notes(text)
  local n = 0
  for _, note in ipairs(T.notes) do
    if note.msg:find(text, 1, true) then
      n = n + 1
    end
  end
  return n
end

local sb -- the policy sandbox of these tests (qualified)

T.test("helpers: allow lists, --network values, what Allow adds", function()
  T.eq({ "a.example", "*.b.example", "c.example:8443" }, net.split_hosts(" a.example,*.b.example  c.example:8443,"))
  T.eq("internet", net.parse_network("internet"))
  T.eq({ allow = { "a.example", "b.example" } }, net.parse_network("allow:a.example,b.example"))
  T.eq(nil, (net.parse_network("allow:")))
  T.eq(nil, (net.parse_network("vpc")))
  T.eq("a.example", net.allow_entry("a.example", 443))
  T.eq("a.example", net.allow_entry("a.example", 80))
  T.eq("a.example:8080", net.allow_entry("a.example", 8080))
  T.eq("[2001:db8::1]:8443", net.allow_entry("2001:db8::1", 8443))
  local text = net.blocked_text({ sandbox = "sb-1", provider = "local", host = "x.example", port = 8080, count = 2 })
  T.eq("abx: sandbox local:sb-1 tried to reach x.example:8080 (blocked 2 times). To allow it: :Abx allow x.example:8080 local:sb-1", text)
end)

T.test(":Abx create refuses a bad network and a mode with --allow (E1009)", function()
  T.clear_notes()
  vim.cmd("Abx create --network vpc")
  T.wait_note("[E1009] create: unknown network 'vpc'")
  vim.cmd("Abx create --network internet --allow a.example")
  T.wait_note("cannot go together")
  vim.cmd("Abx create --allow")
  T.wait_note("--allow needs a value")
end)

T.test(":Abx create --allow HOST (repeatable) and --network allow:... make a policy", function()
  T.clear_notes()
  vim.cmd("Abx create --allow allowed.example --network allow:api.example:8443,other.example")
  local note = T.wait_note("Created sandbox ")
  sb = abx.current
  table.insert(T.sandboxes, sb)
  T.contains(note.msg, "network: only allowed.example, api.example:8443, other.example")
  T.eq({ "allowed.example", "api.example:8443", "other.example" }, allowed(sb))
  -- the key=value form too
  T.clear_notes()
  vim.cmd("Abx create allow=a.example network=none")
  T.wait_note("cannot go together")
  abx.set_current(sb)
end)

T.test(":Abx network shows the policy; :Abx info says there is one", function()
  vim.cmd("Abx network .")
  local buf = T.wait(function()
    return T.find_buf("abx%-network:")
  end, "the network buffer")
  T.wait(function()
    return T.text(buf):find("Allow", 1, true)
  end, "its lines")
  local text = T.text(buf)
  T.contains(text, "Sandbox  " .. sb)
  T.contains(text, "Network  only these hosts (a policy)")
  T.contains(text, "Allow    allowed.example, api.example:8443, other.example")
  T.contains(text, "Deny     -")
  T.contains(text, "Blocked  nothing yet")
  vim.cmd("Abx info .")
  local ib = T.wait(function()
    return T.find_buf("abx%-info:")
  end, "the info buffer")
  T.wait(function()
    return T.text(ib):find("Network", 1, true)
  end, "the Network row")
  T.contains(T.text(ib), "only these hosts (3 allowed, 0 blocked: :Abx network)")
end)

T.test(":Abx allow HOST[,HOST] [SANDBOX] adds to the allow list (sandbox/setNetwork)", function()
  T.clear_notes()
  vim.cmd("Abx allow more.example,db.example:5432")
  T.wait_note("may now reach more.example, db.example:5432")
  T.eq({ "allowed.example", "api.example:8443", "other.example", "more.example", "db.example:5432" }, allowed(sb))
  -- again, with the sandbox named: not added twice
  T.clear_notes()
  vim.cmd("Abx allow more.example " .. sb)
  T.wait_note("may now reach more.example")
  T.eq(5, #allowed(sb))
end)

T.test(":Abx allow on a sandbox with a network mode says it has no host list (E1004)", function()
  local id = T.sandbox({ network = "none" })
  T.clear_notes()
  vim.cmd("Abx allow x.example " .. id)
  T.wait_note("[E1004] Sandbox " .. id .. " has no host list to add to: its network is 'none'")
  vim.cmd("Abx network " .. id)
  local buf = T.wait(function()
    return T.find_buf("abx%-network:" .. vim.pesc(id))
  end, "the network buffer")
  T.wait(function()
    return T.text(buf):find("Network", 1, true)
  end, "its lines")
  T.contains(T.text(buf), "Network  none (a mode")
end)

T.test("a refused request: 403, vim.notify names :Abx allow, once per host; :Abx allow clears it", function()
  T.clear_notes()
  T.eq("403", curl(sb, "http://denied.invalid/"))
  local note = T.wait_note("tried to reach denied.invalid:80")
  T.eq("abx: sandbox " .. sb .. " tried to reach denied.invalid:80 (blocked 1 time). To allow it: :Abx allow denied.invalid " .. sb, note.msg)
  T.eq(vim.log.levels.WARN, note.level)
  -- a retry loop: counted, not repeated
  for _ = 1, 3 do
    T.eq("403", curl(sb, "http://denied.invalid/"))
  end
  T.wait(function()
    local p = net.policy_of(info(sb))
    return p and p.blocked[1] and p.blocked[1].count == 4
  end, "four attempts counted")
  T.tick()
  T.eq(1, count_notes("tried to reach denied.invalid"))
  -- a port other than 80/443: the command names host:port
  T.eq("403", curl(sb, "http://loop.invalid:8080/"))
  T.wait_note(":Abx allow loop.invalid:8080 " .. sb)
  -- :Abx network lists them with the command to allow each
  vim.cmd("Abx network " .. sb)
  local buf = T.find_buf("abx%-network:" .. vim.pesc(sb))
  T.wait(function()
    return T.text(buf):find("loop.invalid:8080", 1, true)
  end, "the blocked hosts in the buffer")
  T.contains(T.text(buf), "  denied.invalid:80  4 times  last ")
  T.contains(T.text(buf), "(:Abx allow loop.invalid:8080 " .. sb .. ")")
  T.clear_notes()
  vim.cmd("Abx allow denied.invalid " .. sb)
  T.wait_note("may now reach denied.invalid")
  T.ok(vim.tbl_contains(allowed(sb), "denied.invalid"), "denied.invalid allowed")
  -- shown by :Abx network: a new refusal of that host is said again
  T.eq("403", curl(sb, "http://loop.invalid:8080/"))
  T.wait(function()
    return count_notes("tried to reach loop.invalid:8080") == 1
  end, "the second refusal of loop.invalid said again")
end)

T.test("completion: --allow, --network and its values, blocked hosts for :Abx allow", function()
  local c = require("abx.commands").complete
  T.ok(vim.tbl_contains(c("--", "Abx create --", 13), "--allow"), "--allow")
  T.ok(vim.tbl_contains(c("--", "Abx create --", 13), "--network"), "--network")
  T.eq({ "network=allow:" }, c("network=a", "Abx create network=a", 20))
  T.eq({ "internet" }, c("i", "Abx create --network i", 22))
  T.ok(vim.tbl_contains(c("", "Abx ", 4), "allow"), "the allow subcommand")
  T.ok(vim.tbl_contains(c("", "Abx ", 4), "network"), "the network subcommand")
  abx.set_current(sb)
  T.ok(vim.tbl_contains(c("", "Abx allow ", 10), "loop.invalid:8080"), "a blocked host offered")
end)

T.test("wiping :Abx sandboxes keeps the subscription sandbox/blocked needs", function()
  local sandboxes = require("abx.sandboxes")
  vim.cmd("Abx sandboxes")
  local buf = T.find_buf("abx%-sandboxes$")
  T.wait(function()
    return sandboxes.state().live
  end, "the list subscribed")
  vim.cmd("bwipeout! " .. buf)
  T.eq(nil, sandboxes.state().live)
  T.ok(net.watching(abx.client()), "abx.network still subscribed")
  T.clear_notes()
  T.eq("403", curl(sb, "http://after.invalid/"))
  T.wait_note("tried to reach after.invalid:80")
end)
