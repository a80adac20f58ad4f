-- Small helpers shared by the plugin: base64, UTF-8 validation, error formatting,
-- notifications and scratch buffers. Works on Neovim 0.7 (no vim.base64, no vim.uv).
local M = {}

local floor = math.floor
local byte, char, find, sub = string.byte, string.char, string.find, string.sub
local concat = table.concat

-- base64 -----------------------------------------------------------------------------

local ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
local enc1, enc2, dec = {}, {}, {}
for i = 0, 63 do
  enc1[i] = sub(ALPHABET, i + 1, i + 1)
  dec[byte(ALPHABET, i + 1)] = i
end
-- two base64 characters per 12 bits: halves the table look-ups of the pure Lua encoder
for i = 0, 4095 do
  enc2[i] = enc1[floor(i / 64)] .. enc1[i % 64]
end

local function b64encode_lua(s)
  local out, k, n = {}, 0, #s
  for i = 1, n - 2, 3 do
    local a, b, c = byte(s, i, i + 2)
    local v = a * 65536 + b * 256 + c
    k = k + 1
    out[k] = enc2[floor(v / 4096)] .. enc2[v % 4096]
  end
  local rem = n % 3
  if rem == 1 then
    local v = byte(s, n) * 65536
    out[k + 1] = enc2[floor(v / 4096)] .. "=="
  elseif rem == 2 then
    local a, b = byte(s, n - 1, n)
    local v = a * 65536 + b * 256
    out[k + 1] = enc2[floor(v / 4096)] .. enc1[floor(v / 64) % 64] .. "="
  end
  return concat(out)
end

local function b64decode_lua(s)
  s = s:gsub("[^%w%+/]", "") -- drops padding and whitespace
  local out, k, n = {}, 0, #s
  local full = n - n % 4
  for i = 1, full, 4 do
    local a, b, c, d = byte(s, i, i + 3)
    local v = dec[a] * 262144 + dec[b] * 4096 + dec[c] * 64 + dec[d]
    k = k + 1
    out[k] = char(floor(v / 65536), floor(v / 256) % 256, v % 256)
  end
  local rem = n - full
  if rem == 2 then
    local a, b = byte(s, full + 1, full + 2)
    local v = dec[a] * 262144 + dec[b] * 4096
    out[k + 1] = char(floor(v / 65536))
  elseif rem == 3 then
    local a, b, c = byte(s, full + 1, full + 3)
    local v = dec[a] * 262144 + dec[b] * 4096 + dec[c] * 64
    out[k + 1] = char(floor(v / 65536), floor(v / 256) % 256)
  elseif rem == 1 then
    error("invalid base64 length")
  end
  return concat(out)
end

M._b64encode_lua, M._b64decode_lua = b64encode_lua, b64decode_lua

function M.b64encode(s)
  if vim.base64 then
    return vim.base64.encode(s)
  end
  return b64encode_lua(s)
end

function M.b64decode(s)
  if vim.base64 then
    local ok, r = pcall(vim.base64.decode, s)
    if ok then
      return r
    end
  end
  return b64decode_lua(s)
end

-- UTF-8 --------------------------------------------------------------------------------

--- Whether `s` is valid UTF-8 (no overlongs, no surrogates, nothing above U+10FFFF).
function M.utf8_valid(s)
  local i, n = 1, #s
  while true do
    i = find(s, "[\128-\255]", i)
    if not i then
      return true
    end
    local c = byte(s, i)
    local len
    if c >= 0xC2 and c <= 0xDF then
      len = 2
    elseif c >= 0xE0 and c <= 0xEF then
      len = 3
    elseif c >= 0xF0 and c <= 0xF4 then
      len = 4
    else
      return false
    end
    if i + len - 1 > n then
      return false
    end
    local c2 = byte(s, i + 1)
    local lo, hi = 0x80, 0xBF
    if c == 0xE0 then
      lo = 0xA0
    elseif c == 0xED then
      hi = 0x9F
    elseif c == 0xF0 then
      lo = 0x90
    elseif c == 0xF4 then
      hi = 0x8F
    end
    if c2 < lo or c2 > hi then
      return false
    end
    for j = i + 2, i + len - 1 do
      local cj = byte(s, j)
      if cj < 0x80 or cj > 0xBF then
        return false
      end
    end
    i = i + len
  end
end

--- `data` as a JSON-safe string plus its encoding name (`utf-8` or `base64`).
function M.encode_data(data)
  if M.utf8_valid(data) then
    return data, "utf-8"
  end
  return M.b64encode(data), "base64"
end

--- The bytes of a `{data, encoding}` pair the broker sent.
function M.decode_data(data, encoding)
  if encoding == "base64" then
    return M.b64decode(data)
  end
  return data
end

-- values -----------------------------------------------------------------------------

--- nil for vim.NIL (JSON null), the value otherwise.
function M.v(x)
  if x == vim.NIL then
    return nil
  end
  return x
end

function M.is_empty(t)
  return t == nil or t == vim.NIL or next(t) == nil
end

-- errors -----------------------------------------------------------------------------

--- The E-code of an error object (`E2009`), or nil.
function M.error_code(err)
  if type(err) ~= "table" then
    return nil
  end
  local data = M.v(err.data)
  if type(data) == "table" and type(M.v(data.abx)) == "string" then
    return data.abx
  end
  if type(err.code) == "number" and err.code >= 1000 and err.code <= 9999 then
    return "E" .. err.code
  end
  return nil
end

--- `[E2009] Sandbox 'x' not found.` then `  Suggestion: ...`, as the CLI prints errors.
function M.format_error(err)
  if type(err) ~= "table" then
    return tostring(err)
  end
  local code = M.error_code(err)
  local msg = tostring(M.v(err.message) or "unknown error")
  local s = code and ("[" .. code .. "] " .. msg) or msg
  local data = M.v(err.data)
  local suggestion = type(data) == "table" and M.v(data.suggestion) or nil
  if type(suggestion) == "string" and suggestion ~= "" then
    s = s .. "\n  Suggestion: " .. suggestion
  end
  return s
end

--- A client-side error object shaped like the broker's.
function M.make_error(code, message, suggestion, rpc_code)
  return {
    code = rpc_code or tonumber((code:gsub("^E", ""))),
    message = message,
    data = { abx = code, suggestion = suggestion },
  }
end

-- notifications ----------------------------------------------------------------------

function M.notify(msg, level)
  vim.notify(msg, level or vim.log.levels.INFO, { title = "abx" })
end

function M.notify_error(err, context)
  local text = M.format_error(err)
  if context then
    text = context .. ": " .. text
  end
  vim.notify(text, vim.log.levels.ERROR, { title = "abx" })
end

-- buffers ----------------------------------------------------------------------------

--- Open `buf` in a window made with `split_cmd` (an Ex command such as `botright split`)
--- unless it is already visible in the current tab; returns the window.
function M.show_buffer(buf, split_cmd)
  for _, win in ipairs(vim.api.nvim_tabpage_list_wins(0)) do
    if vim.api.nvim_win_get_buf(win) == buf then
      return win
    end
  end
  vim.cmd(split_cmd or "botright split")
  local win = vim.api.nvim_get_current_win()
  vim.api.nvim_win_set_buf(win, buf)
  return win
end

--- A scratch buffer (nofile, hidden when abandoned) named `name`, reused by name.
function M.scratch(name, filetype)
  local existing = vim.fn.bufnr("^" .. vim.fn.escape(name, "\\/.*$^~[]") .. "$")
  local buf
  if existing > 0 and vim.api.nvim_buf_is_valid(existing) then
    buf = existing
    vim.api.nvim_buf_set_option(buf, "modifiable", true)
  else
    buf = vim.api.nvim_create_buf(false, true)
    pcall(vim.api.nvim_buf_set_name, buf, name)
  end
  vim.api.nvim_buf_set_option(buf, "buftype", "nofile")
  vim.api.nvim_buf_set_option(buf, "bufhidden", "hide")
  vim.api.nvim_buf_set_option(buf, "swapfile", false)
  if filetype then
    vim.api.nvim_buf_set_option(buf, "filetype", filetype)
  end
  vim.api.nvim_buf_set_keymap(buf, "n", "q", "<cmd>close<cr>", { noremap = true, silent = true, nowait = true })
  return buf
end

--- Show `lines` in a read-only scratch buffer named `name`; returns the buffer.
function M.show_lines(name, lines, filetype, split_cmd)
  local buf = M.scratch(name, filetype)
  local clean = {}
  for i, l in ipairs(lines) do
    clean[i] = (tostring(l):gsub("\n", " "))
  end
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, clean)
  vim.api.nvim_buf_set_option(buf, "modifiable", false)
  vim.api.nvim_buf_set_option(buf, "modified", false)
  M.show_buffer(buf, split_cmd)
  return buf
end

--- Sorted keys of a table.
function M.keys(t)
  local ks = {}
  for k in pairs(t) do
    ks[#ks + 1] = k
  end
  table.sort(ks, function(a, b)
    return tostring(a) < tostring(b)
  end)
  return ks
end

--- `key  value` rows, keys padded to one width.
function M.kv_lines(rows)
  local w = 0
  for _, r in ipairs(rows) do
    w = math.max(w, #r[1])
  end
  local out = {}
  for _, r in ipairs(rows) do
    out[#out + 1] = r[1] .. string.rep(" ", w - #r[1] + 2) .. tostring(r[2])
  end
  return out
end

return M
