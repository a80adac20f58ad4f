-- Workspaces (issue 43) against the real broker: :Abx mount (a folder at /workspace,
-- overlay by default; rw said plainly), :Abx diff (a quickfix list, one item per path, and a
-- diff split per item), :Abx apply (asks first; a path, the item under the cursor, all;
-- conflicts named and :Abx apply! forcing), :Abx discard and :Abx log.
local T = require("harness")
local abx = require("abx")
local ws = require("abx.workspace")
local util = require("abx.util")

local proj = vim.fn.resolve(vim.fn.tempname() .. "-proj")
vim.fn.mkdir(proj, "p")
local function host(name)
  return proj .. "/" .. name
end
local function write_host(name, text)
  vim.fn.writefile(vim.split(text, "\n", true), host(name), "b")
end
local function read_host(name)
  if vim.fn.filereadable(host(name)) ~= 1 then
    return nil
  end
  return table.concat(vim.fn.readfile(host(name), "b"), "\n")
end
write_host("a.txt", "host a\n")
write_host("b.txt", "host b\n")
write_host("c.txt", "host c\n")

-- vim.fn.confirm answered without a terminal: `answers` in order; the messages are kept
local asked = {}
local function stub_confirm(answers)
  asked = {}
  local i = 0
  vim.fn.confirm = function(msg)
    i = i + 1
    asked[#asked + 1] = msg
    return answers[i] or 2
  end
end
local function restore_confirm()
  vim.fn.confirm = nil -- vim.fn makes the real one again on its next use
end

local sb -- the overlay sandbox of these tests

local function changes()
  local res, err = abx.call_sync("sandbox/diff", { sandbox = sb })
  T.ok(res, "sandbox/diff: " .. vim.inspect(err))
  local out = {}
  for _, c in ipairs(res.changes) do
    out[#out + 1] = c.path .. " " .. c.change
  end
  return out
end

local function qf_rows()
  local out = {}
  for _, it in ipairs(vim.fn.getqflist()) do
    out[#out + 1] = vim.api.nvim_buf_get_name(it.bufnr) .. " " .. it.text
  end
  return out
end

T.test("paths: sandbox paths map to host files and back (the deepest mount wins)", function()
  local m = { { source = "/home/u/proj", target = "/workspace", mode = "overlay" } }
  T.eq("/home/u/proj/src/a.rs", ws.host_path(m, "/workspace/src/a.rs"))
  T.eq(nil, ws.host_path(m, "/workspacex/a"))
  T.eq("/workspace/src/a.rs", ws.sandbox_path(m, "/home/u/proj/src/a.rs"))
  T.eq(nil, ws.sandbox_path(m, "/home/u/project/a"))
  T.eq("/workspace/a", ws.to_sandbox_path(m, "/workspace/a/"))
  table.insert(m, { source = "/data/lib", target = "/workspace/lib", mode = "ro" })
  T.eq("/data/lib/x.c", ws.host_path(m, "/workspace/lib/x.c"))
  local e = util.make_error("E4015", "Changed on the host since sandbox 'sb-1' was created: /workspace/a.txt, /workspace/b.txt.")
  T.eq({ "/workspace/a.txt", "/workspace/b.txt" }, ws.conflict_paths(e, nil))
  T.eq({ "/workspace/y" }, ws.conflict_paths(util.make_error("E4015", "conflict"), { "/workspace/y" }))
end)

T.test(":Abx mount refuses a bad mode and a missing directory (E1009)", function()
  vim.cmd("Abx mount " .. proj .. " rwx")
  T.wait_note("[E1009] Unknown mount mode 'rwx'")
  vim.cmd("Abx mount " .. proj .. "/nope")
  T.wait_note("is not a directory")
end)

T.test(":Abx mount of a directory the broker refuses (the home directory): E2010 with why", function()
  vim.cmd("Abx mount " .. vim.fn.fnameescape(vim.loop.os_homedir()))
  local n = T.wait_note("[E2010]")
  T.eq(vim.log.levels.ERROR, n.level)
  T.contains(n.msg, "Suggestion: Mount a project directory of your own")
end)

T.test(":Abx mount PATH: a new sandbox with the folder at /workspace (overlay), the current one", function()
  abx.current = nil
  vim.cmd("Abx mount " .. proj)
  local n = T.wait_note("Created sandbox ")
  T.contains(n.msg, "overlay: the host changes only on :Abx apply")
  sb = abx.current
  T.ok(sb, "the current sandbox")
  table.insert(T.sandboxes, sb)
  local info = abx.call_sync("sandbox/info", { sandbox = sb })
  T.eq({ { source = proj, target = "/workspace", mode = "overlay" } }, info.mounts)
  T.eq("host a\n", T.sh(sb, "cat /workspace/a.txt").stdout)
end)

T.test(":Abx mount rw says that writes go to the host", function()
  local cwd = vim.fn.getcwd()
  vim.cmd("cd " .. vim.fn.fnameescape(proj))
  local ok, e = pcall(function()
    vim.cmd("Abx mount rw") -- the working directory
    local n = T.wait_note("read-write")
    T.eq(vim.log.levels.WARN, n.level)
    T.contains(n.msg, "writes in the sandbox go to the host files at once")
    table.insert(T.sandboxes, abx.current)
    T.eq("rw", abx.call_sync("sandbox/info", { sandbox = abx.current }).mounts[1].mode)
  end)
  vim.cmd("cd " .. vim.fn.fnameescape(cwd))
  abx.set_current(sb)
  assert(ok, e)
end)

T.test(":Abx diff: one quickfix item per changed path, the kind as its text; the host untouched", function()
  T.ok(sb, "the sandbox of :Abx mount")
  local r = T.sh(sb, "echo sandbox a > /workspace/a.txt && echo new > /workspace/new.txt && rm /workspace/c.txt")
  T.eq(0, r.exitCode, r.stderr)
  vim.cmd("Abx diff " .. sb)
  T.wait(function()
    return vim.fn.getqflist({ title = 1 }).title == "abx diff " .. sb
  end, "the quickfix list")
  T.eq({ host("a.txt") .. " modified", host("c.txt") .. " deleted", host("new.txt") .. " added" }, qf_rows())
  T.eq("quickfix", vim.bo.buftype, "the quickfix window is open")
  T.eq("host a\n", read_host("a.txt"))
  T.eq(nil, read_host("new.txt"))
end)

T.test("<CR> on an item: a diff split of the host file against the sandbox's version", function()
  vim.cmd("Abx diff " .. sb)
  T.wait(function()
    return vim.bo.buftype == "quickfix" and #vim.fn.getqflist() == 3
  end, "the quickfix window")
  vim.api.nvim_win_set_cursor(0, { 1, 0 }) -- a.txt
  vim.api.nvim_feedkeys(vim.api.nvim_replace_termcodes("<CR>", true, false, true), "mx", false)
  local left = T.wait(function()
    return T.find_buf(vim.pesc(host("a.txt")) .. "$")
  end, "the host buffer")
  local right = T.wait(function()
    return T.find_buf("^abx%-diff://" .. vim.pesc(sb) .. "/workspace/a%.txt$")
  end, "the sandbox buffer")
  T.eq({ "host a" }, T.lines(left))
  T.eq({ "sandbox a" }, T.lines(right))
  local diffs = 0
  for _, w in ipairs(vim.api.nvim_tabpage_list_wins(0)) do
    local b = vim.api.nvim_win_get_buf(w)
    if (b == left or b == right) and vim.api.nvim_win_get_option(w, "diff") then
      diffs = diffs + 1
    end
  end
  T.eq(2, diffs, "both sides in diff mode")
  T.eq(false, vim.api.nvim_buf_get_option(right, "modifiable"))
  -- a new file: the host side is empty
  vim.cmd("Abx diff " .. sb)
  T.wait(function()
    return vim.bo.buftype == "quickfix"
  end, "the quickfix window again")
  vim.api.nvim_win_set_cursor(0, { 3, 0 }) -- new.txt
  require("abx.workspace").qf_enter()
  local added = T.wait(function()
    return T.find_buf("^abx%-diff://" .. vim.pesc(sb) .. "/workspace/new%.txt$")
  end, "the sandbox side of new.txt")
  T.eq({ "new" }, T.lines(added))
end)

T.test(":Abx apply PATH asks first (declined: nothing written), then writes the host file", function()
  stub_confirm({ 2 })
  vim.cmd("Abx apply /workspace/a.txt")
  T.wait_note("Not applied.")
  T.contains(asked[1], "Apply to the host files, from sandbox " .. sb)
  T.contains(asked[1], "/workspace/a.txt")
  T.eq("host a\n", read_host("a.txt"))
  -- a host path, relative to the working directory, names the same change
  local cwd = vim.fn.getcwd()
  vim.cmd("cd " .. vim.fn.fnameescape(proj))
  stub_confirm({ 1 })
  vim.cmd("Abx apply a.txt")
  vim.cmd("cd " .. vim.fn.fnameescape(cwd))
  T.wait_note("Applied 1 change(s) from " .. sb .. ": /workspace/a.txt")
  restore_confirm()
  T.eq("sandbox a\n", read_host("a.txt"))
  T.eq({ "/workspace/c.txt deleted", "/workspace/new.txt added" }, changes())
end)

T.test(":Abx discard on the quickfix item under the cursor drops that change only", function()
  vim.cmd("Abx diff " .. sb)
  T.wait(function()
    return vim.bo.buftype == "quickfix" and #vim.fn.getqflist() == 2
  end, "the list of two")
  vim.api.nvim_win_set_cursor(0, { 2, 0 }) -- new.txt
  stub_confirm({ 1 })
  vim.cmd("Abx discard")
  T.wait_note("Discarded 1 change(s) in " .. sb .. ": /workspace/new.txt")
  restore_confirm()
  T.contains(asked[1], "/workspace/new.txt")
  T.eq({ "/workspace/c.txt deleted" }, changes())
  T.ok(T.sh(sb, "test -e /workspace/new.txt").exitCode ~= 0, "gone from the sandbox")
  T.eq(nil, read_host("new.txt"))
  -- the quickfix list follows
  T.wait(function()
    return #vim.fn.getqflist() == 1
  end, "the quickfix list refreshed")
end)

T.test("a file changed on the host since create is a conflict, named; :Abx apply! forces it", function()
  T.eq(0, T.sh(sb, "echo sandbox b > /workspace/b.txt").exitCode)
  write_host("b.txt", "host b, edited\n")
  stub_confirm({ 1, 1 })
  vim.cmd("Abx apply /workspace/b.txt")
  local n = T.wait_note("Changed on the host since sandbox")
  T.eq(vim.log.levels.WARN, n.level)
  T.contains(n.msg, "/workspace/b.txt")
  T.contains(n.msg, ":Abx apply! /workspace/b.txt")
  T.eq("host b, edited\n", read_host("b.txt"))
  T.clear_notes()
  vim.cmd("Abx apply! /workspace/b.txt")
  T.wait_note("Applied 1 change(s) from " .. sb .. ": /workspace/b.txt")
  restore_confirm()
  T.contains(asked[2], "force")
  T.eq("sandbox b\n", read_host("b.txt"))
end)

T.test(":Abx apply with no path applies every change (a deletion too)", function()
  stub_confirm({ 1 })
  vim.cmd("Abx apply")
  T.wait_note("Applied 1 change(s) from " .. sb .. ": /workspace/c.txt")
  restore_confirm()
  T.contains(asked[1], "every change (1)")
  T.eq(nil, read_host("c.txt"))
  T.eq({}, changes())
end)

T.test(":Abx log: the commands run in the sandbox, by whom, with their exit", function()
  T.eq(3, T.sh(sb, "exit 3").exitCode)
  vim.cmd("Abx log " .. sb)
  local buf = T.wait(function()
    return T.find_buf("^abx%-log://" .. vim.pesc(sb) .. "$")
  end, "the log buffer")
  local text = T.text(buf)
  T.contains(text, "Commands run in sandbox " .. sb)
  T.contains(text, "abx.nvim  exec  exit 3")
  T.contains(text, "    $ exit 3")
  T.contains(text, "    $ echo sandbox b > /workspace/b.txt")
end)

T.test("completion: mount modes and the paths of the last diff", function()
  T.eq({ "ro", "rw" }, require("abx.commands").complete("r", "Abx mount . r", 13))
  require("abx.workspace").last = { sandbox = "x", id = 0, mounts = {}, changes = { { path = "/workspace/q.txt" } } }
  T.eq({ "/workspace/q.txt" }, require("abx.commands").complete("/w", "Abx apply! /w", 13))
  require("abx.workspace").last = nil
end)
