-- A small test harness for headless Neovim (no plenary or mini.test: none is installable
-- here). Tests run in one coroutine; T.wait() yields to Neovim's main loop (timers, job
-- output, typed input, autocommands) until a condition holds or a generous deadline passes.
-- Nothing is asserted about time: the deadline only stops a hung test.
--
-- Environment: ABX_BIN (the abx binary), ABX_HOME (a private broker home),
-- ABX_NVIM_ROOT (the plugin directory), ABX_TEST_FILE (the test file to run).
local T = {}

T.root = vim.env.ABX_NVIM_ROOT
T.abx_bin = vim.env.ABX_BIN or "abx"
T.deadline_ms = tonumber(vim.env.ABX_TEST_DEADLINE_MS or "") or 60000
T.notes = {}
T.tests = {}
T.sandboxes = {}

local out = io.stdout

function T.log(...)
  out:write(table.concat(vim.tbl_map(tostring, { ... }), " "), "\n")
  out:flush()
end

--- Load the plugin as a user would (runtimepath + plugin/abx.lua), capture vim.notify.
function T.setup()
  vim.opt.runtimepath:prepend(T.root)
  vim.opt.swapfile = false
  vim.o.shortmess = vim.o.shortmess .. "AF"
  vim.cmd("runtime plugin/abx.lua")
  vim.notify = function(msg, level, opts)
    table.insert(T.notes, { msg = tostring(msg), level = level or vim.log.levels.INFO })
    if vim.env.ABX_TEST_VERBOSE then
      T.log("  notify:", msg)
    end
  end
  T.reset_config()
end

function T.reset_config(extra)
  local abx = require("abx")
  abx.setup(vim.tbl_extend("force", { abx = T.abx_bin }, extra or {}))
  return abx
end

-- assertions -------------------------------------------------------------------------

local function fail(msg, level)
  error(msg, (level or 1) + 2)
end

function T.ok(cond, msg)
  if not cond then
    fail("assertion failed: " .. (msg or "?"))
  end
  return cond
end

function T.eq(expected, actual, msg)
  if not vim.deep_equal(expected, actual) then
    fail(string.format("%s\n    expected: %s\n    actual:   %s", msg or "not equal", vim.inspect(expected), vim.inspect(actual)))
  end
end

function T.contains(haystack, needle, msg)
  if type(haystack) == "table" then
    haystack = table.concat(haystack, "\n")
  end
  if not tostring(haystack):find(needle, 1, true) then
    fail(string.format("%s\n    %s\n    not found in:\n%s", msg or "missing text", vim.inspect(needle), tostring(haystack)))
  end
end

function T.not_contains(haystack, needle, msg)
  if type(haystack) == "table" then
    haystack = table.concat(haystack, "\n")
  end
  if tostring(haystack):find(needle, 1, true) then
    fail(string.format("%s\n    %s\n    found in:\n%s", msg or "unexpected text", vim.inspect(needle), tostring(haystack)))
  end
end

-- waiting ----------------------------------------------------------------------------

--- Yield to the main loop until cond() is truthy; returns its value. Fails after the
--- deadline (a hang guard, not a timing assertion).
function T.wait(cond, what, ms)
  local co = coroutine.running()
  assert(co, "T.wait outside a test coroutine")
  local deadline = vim.loop.now() + (ms or T.deadline_ms)
  while true do
    local v = cond()
    if v then
      return v
    end
    if vim.loop.now() > deadline then
      fail("gave up waiting for: " .. (what or "condition"))
    end
    vim.defer_fn(function()
      local ok, e = coroutine.resume(co)
      if not ok then
        T.log("coroutine error:", e)
      end
    end, 15)
    coroutine.yield()
  end
end

--- Let the main loop run once (pending callbacks, typeahead, autocommands).
function T.tick()
  local n = 0
  T.wait(function()
    n = n + 1
    return n > 2
  end, "a tick")
end

-- notifications ----------------------------------------------------------------------

function T.clear_notes()
  T.notes = {}
end

--- The first captured notification containing `text` (plain), or nil.
function T.find_note(text)
  for _, n in ipairs(T.notes) do
    if n.msg:find(text, 1, true) then
      return n
    end
  end
end

function T.wait_note(text, what)
  return T.wait(function()
    return T.find_note(text)
  end, what or ("a notification containing " .. vim.inspect(text) .. "; got " .. vim.inspect(vim.tbl_map(function(n)
    return n.msg
  end, T.notes))))
end

-- buffers ----------------------------------------------------------------------------

function T.lines(buf)
  return vim.api.nvim_buf_get_lines(buf or 0, 0, -1, false)
end

function T.text(buf)
  return table.concat(T.lines(buf), "\n")
end

function T.bufvar(buf, name)
  local ok, v = pcall(vim.api.nvim_buf_get_var, buf, name)
  if ok then
    return v
  end
  return nil
end

--- The buffer named `pattern` (Lua pattern on the full name), or nil.
function T.find_buf(pattern)
  for _, b in ipairs(vim.api.nvim_list_bufs()) do
    if vim.api.nvim_buf_get_name(b):find(pattern) then
      return b
    end
  end
end

-- UI stubs ---------------------------------------------------------------------------

local real_select, real_input = vim.ui.select, vim.ui.input

--- Answer the next vim.ui.select calls with `choosers` in order: each is a function
--- (item, formatted) -> bool picking the first matching item (or false to cancel).
--- Every prompt is recorded in T.prompts.
function T.stub_select(choosers)
  T.prompts = {}
  local i = 0
  vim.ui.select = function(items, opts, on_choice)
    i = i + 1
    local chooser = choosers[i]
    local formatted = {}
    for k, it in ipairs(items) do
      formatted[k] = opts.format_item and opts.format_item(it) or tostring(it)
    end
    table.insert(T.prompts, { prompt = opts.prompt, items = formatted })
    if not chooser then
      return on_choice(nil, nil)
    end
    for k, it in ipairs(items) do
      if chooser(it, formatted[k]) then
        return on_choice(it, k)
      end
    end
    on_choice(nil, nil)
  end
end

function T.stub_input(answers)
  local i = 0
  vim.ui.input = function(opts, on_confirm)
    i = i + 1
    on_confirm(answers[i])
  end
end

function T.restore_ui()
  vim.ui.select, vim.ui.input = real_select, real_input
  T.prompts = {}
end

-- sandboxes --------------------------------------------------------------------------

--- A fresh sandbox (killed at the end of the file).
function T.sandbox(params)
  local abx = require("abx")
  local sb, err = abx.call_sync("sandbox/create", params or {})
  T.ok(sb, "sandbox/create failed: " .. vim.inspect(err))
  table.insert(T.sandboxes, sb.id)
  return sb.id, sb
end

--- Run a shell command in a sandbox through the broker (exec/run); returns the result.
function T.sh(sandbox, command)
  local res, err = require("abx").call_sync("exec/run", { sandbox = sandbox, command = command })
  T.ok(res, "exec/run failed: " .. vim.inspect(err))
  return res
end

--- The bytes of a sandbox file, through files/read (every chunk).
function T.read_file(sandbox, path)
  local bytes, err = require("abx.files").read_bytes(sandbox, path)
  T.ok(bytes, "files/read failed: " .. vim.inspect(err))
  return bytes
end

function T.write_file(sandbox, path, bytes)
  local util = require("abx.util")
  local data, enc = util.encode_data(bytes)
  local res, err = require("abx").call_sync("files/write", { sandbox = sandbox, path = path, data = data, encoding = enc })
  T.ok(res, "files/write failed: " .. vim.inspect(err))
end

-- running ----------------------------------------------------------------------------

function T.test(name, fn)
  table.insert(T.tests, { name = name, fn = fn })
end

local function cleanup()
  T.restore_ui()
  pcall(vim.cmd, "stopinsert")
  pcall(vim.cmd, "silent! only!")
  pcall(vim.cmd, "silent! enew!")
  local cur = vim.api.nvim_get_current_buf()
  for _, b in ipairs(vim.api.nvim_list_bufs()) do
    if b ~= cur then
      pcall(vim.api.nvim_buf_delete, b, { force = true })
    end
  end
  T.reset_config()
  T.clear_notes()
end

--- Run every registered test (optionally only names containing ABX_TEST_FILTER), then
--- quit with 0 when all passed, 1 otherwise.
function T.run(file)
  local filter = vim.env.ABX_TEST_FILTER
  coroutine.wrap(function()
    local passed, failed = 0, 0
    T.log("# " .. file .. " on Neovim " .. tostring(vim.version and (function()
      local v = vim.version()
      return v.major .. "." .. v.minor .. "." .. v.patch
    end)() or "?"))
    for _, t in ipairs(T.tests) do
      if not filter or filter == "" or t.name:find(filter, 1, true) then
        local ok, err = xpcall(t.fn, debug.traceback)
        if ok then
          passed = passed + 1
          T.log("ok     " .. t.name)
        else
          failed = failed + 1
          T.log("FAILED " .. t.name .. "\n  " .. tostring(err):gsub("\n", "\n  "))
          if T.prompts and #T.prompts > 0 then
            T.log("  pickers: " .. vim.inspect(T.prompts))
          end
          if #T.notes > 0 then
            T.log("  notifications: " .. vim.inspect(vim.tbl_map(function(n)
              return n.msg
            end, T.notes)))
          end
        end
        cleanup()
      end
    end
    for _, id in ipairs(T.sandboxes) do
      require("abx").call_sync("sandbox/kill", { sandbox = id }, 10000)
    end
    T.log(string.format("# %s: %d passed, %d failed", file, passed, failed))
    require("abx").stop(true)
    if failed > 0 then
      vim.cmd("cquit 1")
    else
      vim.cmd("qall!")
    end
  end)()
end

return T
