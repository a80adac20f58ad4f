-- :Abx subcommands against the real broker: create (setup options), list picker and its
-- actions, info, pause/resume, timeout, ports, kill, providers, doctor, status, upload,
-- download, completion, and errors shown with their E-code.
local T = require("harness")
local abx = require("abx")

local function info(id)
  local sb, err = abx.call_sync("sandbox/info", { sandbox = id })
  return sb, err
end

T.test(":Abx create uses setup{} defaults (template, timeout) and sets the current sandbox", function()
  T.reset_config({ template = "base", timeout = 120 })
  abx.current = nil
  vim.cmd("Abx create")
  local note = T.wait_note("Created sandbox ")
  T.ok(abx.current, "current sandbox set")
  T.contains(note.msg, abx.current)
  table.insert(T.sandboxes, abx.current)
  local sb = info(abx.current)
  T.eq(120, sb.timeout)
  T.eq("base", sb.template)
  T.eq("running", sb.status)
end)

T.test(":Abx create key=value options override setup{}", function()
  T.reset_config({ timeout = 120 })
  vim.cmd("Abx create timeout=90 metadata.owner=nvim-test env.GREETING=hi")
  T.wait_note("Created sandbox ")
  local id = abx.current
  table.insert(T.sandboxes, id)
  local sb = info(id)
  T.eq(90, sb.timeout)
  T.eq("nvim-test", sb.metadata.owner)
  T.eq("hi\n", T.sh(id, "echo $GREETING").stdout)
end)

T.test("errors are notified with their E-code and suggestion", function()
  vim.cmd("Abx create timeout=0")
  local n = T.wait_note("[E2004]")
  T.eq(vim.log.levels.ERROR, n.level)
  T.contains(n.msg, "Suggestion:")
  vim.cmd("Abx info no-such-sandbox")
  n = T.wait_note("[E2009] Sandbox 'no-such-sandbox' not found.")
  T.contains(n.msg, "Suggestion: Run 'abx list'")
  vim.cmd("Abx bogus")
  T.wait_note("[E1009] Unknown subcommand 'bogus'")
  vim.cmd("Abx create nonsense")
  T.wait_note("[E1009] create: expected key=value")
end)

T.test(":Abx list picks a sandbox, then an action on it (info)", function()
  local id = T.sandbox()
  T.stub_select({
    function(sb)
      return sb.id == id
    end,
    function(action)
      return action[1] == "info"
    end,
  })
  vim.cmd("Abx list")
  local buf = T.wait(function()
    return T.find_buf("abx%-info:" .. vim.pesc("local:" .. id))
  end, "the info buffer")
  local text = T.text(buf)
  T.contains(text, "ID        local:" .. id)
  T.contains(text, "Status    running")
  T.contains(T.prompts[1].prompt, "Sandboxes")
  T.contains(table.concat(T.prompts[1].items, "\n"), "local:" .. id .. "  running  base  expires ")
  T.contains(table.concat(T.prompts[2].items, "\n"), "Terminal")
  T.eq("local:" .. id, abx.current)
end)

T.test(":Abx pause / resume / timeout change the sandbox", function()
  local id = T.sandbox()
  vim.cmd("Abx pause " .. id)
  T.wait_note("paused.")
  T.eq("paused", info(id).status)
  vim.cmd("Abx resume " .. id)
  T.wait_note("resumed.")
  T.eq("running", info(id).status)
  vim.cmd("Abx timeout " .. id .. " 777")
  T.wait_note("now expires at")
  T.eq(777, info(id).timeout)
end)

T.test(":Abx ports shows the URL of a port", function()
  local id = T.sandbox()
  vim.cmd("Abx ports " .. id .. " 8080")
  local n = T.wait_note("Port 8080 of " .. id .. ": ")
  local url = abx.call_sync("ports/url", { sandbox = id, port = 8080 }).url
  T.contains(n.msg, url)
  vim.cmd("Abx ports " .. id .. " notaport")
  T.wait_note("[E1009] Give a port number")
end)

T.test(":Abx kill with an id, and through the picker with a confirmation", function()
  local a = T.sandbox()
  vim.cmd("Abx kill " .. a)
  T.wait_note("Sandbox " .. a .. " killed")
  local _, err = info(a)
  T.eq("E2009", require("abx.util").error_code(err))

  local b = T.sandbox()
  T.clear_notes()
  T.stub_select({
    function(sb)
      return sb.id == b
    end,
    function(choice)
      return choice == "Yes"
    end,
  })
  vim.cmd("Abx kill")
  T.wait_note("Sandbox local:" .. b .. " killed")
  T.contains(T.prompts[2].prompt, "Kill sandbox local:" .. b .. "?")
  _, err = info(b)
  T.eq("E2009", require("abx.util").error_code(err))

  -- answering No keeps it
  local c = T.sandbox()
  T.stub_select({
    function(sb)
      return sb.id == c
    end,
    function(choice)
      return choice == "No"
    end,
  })
  vim.cmd("Abx kill")
  T.wait(function()
    return #T.prompts == 2
  end, "the confirmation")
  T.eq("running", info(c).status)
end)

T.test(":Abx providers: picker, then provider info", function()
  T.stub_select({
    function(p)
      return p.id == "local"
    end,
    function(action)
      return action[1] == "info"
    end,
  })
  vim.cmd("Abx providers")
  local buf = T.wait(function()
    return T.find_buf("abx%-provider:local")
  end, "the provider buffer")
  local text = T.text(buf)
  T.contains(text, "id")
  T.contains(text, "local")
  T.contains(text, "sandbox(lifecycle")
  T.contains(table.concat(T.prompts[1].items, "\n"), "(default)")
end)

T.test(":Abx doctor and :Abx status show reports", function()
  vim.cmd("Abx doctor")
  local buf = T.wait(function()
    return T.find_buf("abx%-doctor$")
  end, "the doctor buffer")
  local text = T.text(buf)
  T.contains(text, "Provider local")
  T.contains(text, "ok    installed")
  T.not_contains(text, "fail")
  vim.cmd("Abx doctor nope")
  T.wait(function()
    return T.text(T.find_buf("abx%-doctor$")):find("E8001", 1, true)
  end, "E8001 for an unknown provider")
  vim.cmd("Abx status")
  buf = T.wait(function()
    return T.find_buf("abx%-status$")
  end, "the status buffer")
  T.contains(T.text(buf), "version")
  T.contains(T.text(buf), "pid")
end)

T.test(":Abx test streams the contract kit's results (provider/testResult) into a buffer", function()
  local notes = 0
  local off = abx.client():on("provider/testResult", function(r)
    if r.id == "local" then
      notes = notes + 1
    end
  end)
  vim.cmd("Abx test local files")
  local buf = T.wait(function()
    return T.find_buf("abx%-test:local$")
  end, "the test buffer")
  T.wait(function()
    return T.bufvar(buf, "abx_test_done")
  end, "the kit to finish")
  off()
  local lines = T.lines(buf)
  T.contains(lines[1], "Contract kit on provider local (filter files)")
  local results = 0
  for _, l in ipairs(lines) do
    if l:match("^passed ") or l:match("^failed ") or l:match("^skipped ") then
      results = results + 1
    end
  end
  T.ok(results > 0, "some results")
  T.eq(notes, results, "one line per provider/testResult notification")
  T.ok(lines[#lines]:match("^%d+ passed, 0 failed, %d+ skipped$"), "summary: " .. lines[#lines])
  T.wait_note("abx test local: ")
end)

T.test(":Abx upload and :Abx download copy files through the broker", function()
  local id = T.sandbox()
  local dir = vim.fn.tempname()
  vim.fn.mkdir(dir, "p")
  local src = dir .. "/up.bin"
  local payload = "line 1\nbinary \0\255 bytes\n" .. string.rep("x", 100000)
  local f = assert(io.open(src, "wb"))
  f:write(payload)
  f:close()
  vim.cmd("Abx upload " .. id .. " " .. vim.fn.fnameescape(src) .. " /workspace/up.bin")
  T.wait_note("Uploaded " .. src .. " -> /workspace/up.bin")
  T.eq(payload, T.read_file(id, "/workspace/up.bin"))

  local out = dir .. "/out"
  vim.fn.mkdir(out, "p")
  vim.cmd("Abx download " .. id .. " /workspace/up.bin " .. vim.fn.fnameescape(out))
  T.wait_note("Downloaded /workspace/up.bin -> " .. out .. "/up.bin")
  local g = assert(io.open(out .. "/up.bin", "rb"))
  local got = g:read("*a")
  g:close()
  T.eq(payload, got)

  vim.cmd("Abx upload " .. id .. " " .. dir .. "/missing.txt")
  T.wait_note("[E4009]")
  vim.cmd("Abx download " .. id .. " /workspace/missing.txt " .. out)
  T.wait_note("[E4001]")
end)

T.test(":Abx use sets the sandbox that '.' stands for", function()
  local id = T.sandbox()
  abx.current = nil
  vim.cmd("Abx info .")
  T.wait_note("No current sandbox")
  vim.cmd("Abx use " .. id)
  T.eq(id, abx.current)
  vim.cmd("Abx info .")
  T.wait(function()
    return T.find_buf("abx%-info:" .. vim.pesc(id))
  end, "the info buffer of the current sandbox")
end)

T.test(":Abx completion: subcommands, sandboxes, providers, options, remote paths", function()
  local id = T.sandbox()
  T.write_file(id, "/workspace/complete_me.py", "x\n")
  local c = require("abx.commands").complete
  local subs = c("", "Abx ", 4)
  for _, s in ipairs({ "create", "list", "kill", "pause", "resume", "exec", "terminal", "upload", "download", "ports", "providers", "doctor" }) do
    T.ok(vim.tbl_contains(subs, s), "subcommand " .. s)
  end
  T.eq({ "kill" }, c("k", "Abx k", 5))
  -- through the command line, as <Tab> does it
  T.eq({ "kill" }, vim.fn.getcompletion("Abx k", "cmdline"))
  T.ok(vim.tbl_contains(vim.fn.getcompletion("Abx pause ", "cmdline"), id), "cmdline sandbox ids")
  local ids = c("", "Abx kill ", 9)
  T.ok(vim.tbl_contains(ids, id), "sandbox id offered")
  T.ok(vim.tbl_contains(ids, "local:" .. id), "qualified id offered")
  T.ok(vim.tbl_contains(c("", "Abx doctor ", 11), "local"), "provider offered")
  T.eq({ "provider=local" }, c("provider=l", "Abx create provider=l", 21))
  T.ok(vim.tbl_contains(c("ti", "Abx create ti", 13), "timeout="), "create options")
  local line = "Abx open " .. id .. " /workspace/comp"
  T.eq({ "/workspace/complete_me.py" }, c("/workspace/comp", line, #line))
  -- a sandbox created through :Abx is offered at once (the id cache is dropped)
  T.clear_notes()
  vim.cmd("Abx create")
  T.wait_note("Created sandbox ")
  table.insert(T.sandboxes, abx.current)
  local bare = abx.current:gsub("^local:", "")
  T.ok(vim.tbl_contains(c("", "Abx kill ", 9), bare), "the new sandbox offered")
end)
