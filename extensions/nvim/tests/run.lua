-- Entry point: nvim --headless -u NONE -i NONE -n -c "luafile tests/run.lua"
-- with ABX_NVIM_ROOT (plugin dir), ABX_TEST_FILE (a tests/test_*.lua), ABX_BIN, ABX_HOME.
local root = vim.env.ABX_NVIM_ROOT
package.path = root .. "/tests/?.lua;" .. package.path
local T = require("harness")
local file = vim.env.ABX_TEST_FILE
local ok, err = pcall(function()
  T.setup()
  dofile(file)
end)
if not ok then
  T.log("FAILED loading " .. tostring(file) .. ": " .. tostring(err))
  vim.cmd("cquit 1")
end
T.run(vim.fn.fnamemodify(file, ":t"))
