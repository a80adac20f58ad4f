-- The plugin against docs/openrpc.json (generated from the protocol crate's types): every
-- method or notification name written in the plugin's Lua source exists there, so a call no
-- other test reaches still cannot name a method the broker does not have (issue 47; the
-- SDKs have the same check: extensions/sdk/*/test*/*drift*, openrpc.test.mjs).
local T = require("harness")

local function spec_names()
  local path = T.root .. "/../../docs/openrpc.json"
  local spec = vim.fn.json_decode(table.concat(vim.fn.readfile(path), "\n"))
  local names = {}
  for _, m in ipairs(spec.methods) do
    names[m.name] = "method"
  end
  for _, n in ipairs(spec["x-notifications"]) do
    names[n.name] = "notification"
  end
  return names
end

-- Quoted strings that look like a method name: `family/name`, lower-case family.
local function literals()
  local found = {}
  local files = vim.fn.globpath(T.root .. "/lua", "**/*.lua", false, true)
  T.ok(#files >= 5, "the plugin's Lua files, got " .. #files)
  for _, f in ipairs(files) do
    local text = table.concat(vim.fn.readfile(f), "\n")
    for q, name in text:gmatch("([\"'])([a-z]+/[%w]+)%1") do
      found[name] = found[name] or vim.fn.fnamemodify(f, ":t")
    end
  end
  return found
end

-- Strings of that shape that are not method names (MIME types of code results).
local NOT_METHODS = { ["text/plain"] = true, ["image/png"] = true, ["text/html"] = true }

T.test("every method name in the plugin is in docs/openrpc.json", function()
  local names = spec_names()
  T.ok(names["sandbox/create"] == "method", "the spec lists sandbox/create")
  T.ok(names["exec/output"] == "notification", "the spec lists exec/output")
  local unknown, count = {}, 0
  for name, file in pairs(literals()) do
    if not NOT_METHODS[name] then
      count = count + 1
      if not names[name] then
        table.insert(unknown, name .. " (" .. file .. ")")
      end
    end
  end
  T.ok(count >= 30, "method names found in the plugin: " .. count)
  table.sort(unknown)
  T.eq("", table.concat(unknown, ", "), "method names the broker does not have")
end)

T.test("a made-up method name is caught", function()
  local names = spec_names()
  T.ok(names["sandbox/frobnicate"] == nil, "sandbox/frobnicate is not in the spec")
  T.ok(names["exec/run"] ~= nil, "exec/run is in the spec")
end)
