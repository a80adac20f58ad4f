-- Pure helpers: base64, UTF-8, line conversion, names, error formatting.
local T = require("harness")
local util = require("abx.util")
local files = require("abx.files")

T.test("base64 matches RFC 4648 vectors (pure Lua and vim.base64 paths)", function()
  local vectors = { [""] = "", f = "Zg==", fo = "Zm8=", foo = "Zm9v", foob = "Zm9vYg==", fooba = "Zm9vYmE=", foobar = "Zm9vYmFy" }
  for plain, b64 in pairs(vectors) do
    T.eq(b64, util._b64encode_lua(plain), "encode " .. plain)
    T.eq(plain, util._b64decode_lua(b64), "decode " .. b64)
    T.eq(b64, util.b64encode(plain))
    T.eq(plain, util.b64decode(b64))
  end
end)

T.test("base64 round-trips every byte value", function()
  local bytes = {}
  for i = 0, 255 do
    bytes[#bytes + 1] = string.char(i)
  end
  local all = table.concat(bytes):rep(3) .. "\0\255"
  T.eq(all, util._b64decode_lua(util._b64encode_lua(all)))
  T.eq(all, util.b64decode(util.b64encode(all)))
  T.eq(util._b64encode_lua(all), util.b64encode(all))
end)

T.test("utf8_valid accepts UTF-8 and rejects the rest", function()
  T.ok(util.utf8_valid("plain ascii"), "ascii")
  T.ok(util.utf8_valid("héllo wörld ✓ 𝄞 日本"), "multibyte")
  T.ok(not util.utf8_valid("\255\254"), "ff fe")
  T.ok(not util.utf8_valid("abc\195"), "truncated sequence")
  T.ok(not util.utf8_valid("\192\175"), "overlong")
  T.ok(not util.utf8_valid("\237\160\128"), "surrogate")
  T.ok(not util.utf8_valid("\244\144\128\128"), "above U+10FFFF")
  T.eq({ "x\255", "base64" }, { util.decode_data(util.encode_data("x\255")), select(2, util.encode_data("x\255")) })
  T.eq({ "é", "utf-8" }, { util.encode_data("é") })
end)

T.test("bytes to lines keep eol, fileformat and NUL bytes", function()
  local lines, ff, eol = files.to_lines("a\nb\n")
  T.eq({ { "a", "b" }, "unix", true }, { lines, ff, eol })
  lines, ff, eol = files.to_lines("a\nb")
  T.eq({ { "a", "b" }, "unix", false }, { lines, ff, eol })
  lines, ff, eol = files.to_lines("a\r\nb\r\n")
  T.eq({ { "a", "b" }, "dos", true }, { lines, ff, eol })
  lines, ff = files.to_lines("a\r\nb\n")
  T.eq({ { "a\r", "b" }, "unix" }, { lines, ff })
  lines = files.to_lines("x\0y\n")
  T.eq({ "x\0y" }, lines)
  T.eq({}, (files.to_lines("")))

  local buf = vim.api.nvim_create_buf(false, true)
  vim.api.nvim_buf_set_option(buf, "fileformat", "dos")
  vim.api.nvim_buf_set_option(buf, "endofline", true)
  T.eq("a\r\nb\r\n", files.from_lines(buf, { "a", "b" }, false))
  vim.api.nvim_buf_set_option(buf, "fileformat", "unix")
  vim.api.nvim_buf_set_option(buf, "fixendofline", false)
  vim.api.nvim_buf_set_option(buf, "endofline", false)
  T.eq("a\nb", files.from_lines(buf, { "a", "b" }, false))
  T.eq("", files.from_lines(buf, { "" }, true))
end)

T.test("abx:// names parse into sandbox and path", function()
  T.eq({ "sb-1", "/workspace/main.py" }, { files.parse("abx://sb-1/workspace/main.py") })
  T.eq({ "local:sb-1", "/tmp/x" }, { files.parse("abx://local:sb-1/tmp//x") })
  T.eq({ "sb-1", "/workspace" }, { files.parse("abx://sb-1/workspace/") })
  T.eq({ "sb-1", "/workspace" }, { files.parse("abx://sb-1") })
  T.eq(nil, files.parse("/tmp/x"))
end)

T.test("errors format as [E-code] message plus suggestion", function()
  local e = { code = 2009, message = "Sandbox 'x' not found.", data = { abx = "E2009", suggestion = "Run 'abx list'." } }
  T.eq("E2009", util.error_code(e))
  T.eq("[E2009] Sandbox 'x' not found.\n  Suggestion: Run 'abx list'.", util.format_error(e))
  T.eq("E1006", util.error_code({ code = -32800, message = "c", data = { abx = "E1006" } }))
  T.eq(nil, util.error_code({ code = -32601, message = "m" }))
  T.eq("E4001", util.error_code({ code = 4001, message = "m", data = vim.NIL }))
  T.eq("sandbox(lifecycle,pause) exec(run)", require("abx.actions").group_features({ "sandbox.lifecycle", "sandbox.pause", "exec.run" }))
end)
