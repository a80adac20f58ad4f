-- :AbxTemplateBuild [DIR|DOCKERFILE] [NAME] (issue 49): build a template from a Dockerfile with
-- templates/build {context, dockerfile?, name}. DIR is the build context (default: the
-- directory of the current buffer when it is a Dockerfile, which is then the one built; else
-- the working directory); a Dockerfile path builds that file in its directory. NAME is asked
-- (vim.ui.input, the directory's name first) when not given. The steps stream into a scratch
-- buffer (abx-template://NAME) as docker build prints them (`[2/4] RUN make`, the output
-- indented, `CACHED ...` for a cache hit) from templates/progress; <C-c> there (or wiping it)
-- cancels the build ($/cancelRequest: the broker stops it, nothing is stored).
local abx = require("abx")
local util = require("abx.util")

local M = {}

-- state per buffer: {name, request, done, result, err}
M.state = {}

--- Whether a file name is a Dockerfile (`Dockerfile`, `Dockerfile.dev`, `app.Dockerfile`).
function M.is_dockerfile(path)
  local b = vim.fn.fnamemodify(path, ":t"):lower()
  return b == "dockerfile" or b:match("^dockerfile[%.%-]") ~= nil or b:match("%.dockerfile$") ~= nil
end

--- A template name from a directory's name: lowercase, [a-z0-9._-], others as `-`.
function M.default_name(dir)
  local n = vim.fn.fnamemodify(vim.fn.fnamemodify(dir, ":p"):gsub("/+$", ""), ":t"):lower()
  n = n:gsub("[^a-z0-9%._%-]", "-"):gsub("^[%-%.]+", ""):gsub("[%-%.]+$", "")
  return n ~= "" and n or "template"
end

--- A step printer: `lines(p)` gives the lines a templates/progress notification adds.
function M.steps()
  local st = { step = nil, cached = false }
  function st.lines(p)
    local out = {}
    local step = util.v(p.step) or ""
    local cached = util.v(p.cached) == true
    if step ~= "" and step ~= st.step then
      st.step, st.cached = step, cached
      out[#out + 1] = cached and ("CACHED " .. step) or step
    elseif cached and not st.cached then
      st.cached = true
      out[#out + 1] = "  CACHED"
    end
    local line = util.v(p.line)
    if type(line) == "string" then
      for _, l in ipairs(vim.split((line:gsub("[\r\n]+$", "")), "\n", { plain = true })) do
        out[#out + 1] = "  " .. l
      end
    end
    return out
  end
  return st
end

local function append(buf, lines)
  if not vim.api.nvim_buf_is_valid(buf) or #lines == 0 then
    return
  end
  vim.api.nvim_buf_set_option(buf, "modifiable", true)
  local count = vim.api.nvim_buf_line_count(buf)
  local last = vim.api.nvim_buf_get_lines(buf, count - 1, count, false)[1] or ""
  if count == 1 and last == "" then
    vim.api.nvim_buf_set_lines(buf, 0, 1, false, lines)
  else
    vim.api.nvim_buf_set_lines(buf, count, count, false, lines)
  end
  vim.api.nvim_buf_set_option(buf, "modifiable", false)
  vim.api.nvim_buf_set_option(buf, "modified", false)
end

--- Where a build's context and Dockerfile are, from an argument (a directory, a Dockerfile,
--- or nothing: the current buffer's Dockerfile, else the working directory).
function M.resolve(arg)
  local path = arg
  if path == nil or path == "" then
    local cur = vim.api.nvim_buf_get_name(0)
    if cur ~= "" and M.is_dockerfile(cur) and vim.fn.filereadable(cur) == 1 then
      path = cur
    else
      path = vim.fn.getcwd()
    end
  end
  path = vim.fn.fnamemodify(vim.fn.expand(path), ":p")
  if vim.fn.isdirectory(path) == 1 then
    return (path:gsub("/+$", "")), nil
  end
  if vim.fn.filereadable(path) == 1 then
    return vim.fn.fnamemodify(path, ":h"), vim.fn.fnamemodify(path, ":t")
  end
  return nil, nil, util.make_error("E4009", "Local file '" .. path .. "': not a directory or a Dockerfile (the build context).", "Give a directory with a Dockerfile, or a Dockerfile: :AbxTemplateBuild [DIR] [NAME]")
end

--- Build `context` (its `dockerfile`, default Dockerfile) as template `name`, streaming into
--- a scratch buffer (shown with config.split). opts: buildArgs, target, network, noCache,
--- on_done(result, err). Returns the buffer.
function M.build(context, name, opts)
  opts = opts or {}
  local buf = util.scratch("abx-template://" .. name, "abxbuild")
  vim.api.nvim_buf_set_option(buf, "modifiable", true)
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, {})
  pcall(vim.api.nvim_buf_del_var, buf, "abx_template_done")
  local df = opts.dockerfile
  if df == "Dockerfile" then
    df = nil
  end
  append(buf, { ">>> abx template build " .. context .. " -t " .. name .. (df and (" -f " .. df) or "") })
  local old = M.state[buf]
  if old and old.request and not old.done then
    abx.client():cancel(old.request)
  end
  local st = { name = name, done = false }
  M.state[buf] = st
  local steps = M.steps()
  local client = abx.client()
  local off = client:on("templates/progress", function(p)
    if st.done or util.v(p.template) ~= name then
      return
    end
    append(buf, steps.lines(p))
  end)
  local params = {
    context = context,
    name = name,
    dockerfile = df,
    buildArgs = opts.buildArgs,
    target = opts.target,
    network = opts.network,
    noCache = opts.noCache,
  }
  st.request = client:request("templates/build", params, function(err, res)
    off()
    st.done = true
    if err then
      st.err = err
      if st.cancelled then
        append(buf, { "The build of '" .. name .. "' was cancelled (nothing was stored)." })
        util.notify("abx: the build of '" .. name .. "' was cancelled.", vim.log.levels.WARN)
      else
        append(buf, vim.split(util.format_error(err), "\n", { plain = true }))
        util.notify_error(err, "template build " .. name)
      end
    else
      st.result = res
      local digest = (util.v(res.digest) or ""):gsub("^sha256:", ""):sub(1, 12)
      append(buf, { string.format("Built template '%s' (%s, %s bytes). Use it: abx create --template %s", res.name, digest, tostring(util.v(res.size) or 0), res.name) })
      util.notify("abx: built template '" .. res.name .. "'.")
    end
    if vim.api.nvim_buf_is_valid(buf) then
      vim.api.nvim_buf_set_var(buf, "abx_template_done", true)
      vim.api.nvim_buf_set_var(buf, "abx_template_error", st.cancelled and "cancelled" or (err and (util.error_code(err) or "error") or ""))
    end
    if opts.on_done then
      pcall(opts.on_done, res, err)
    end
  end)
  vim.api.nvim_buf_set_keymap(buf, "n", "<C-c>", "", {
    noremap = true,
    silent = true,
    callback = function()
      M.cancel(buf)
    end,
  })
  vim.api.nvim_create_autocmd("BufWipeout", {
    buffer = buf,
    once = true,
    callback = function()
      M.cancel(buf)
      M.state[buf] = nil
    end,
  })
  util.show_buffer(buf, abx.config.split)
  return buf
end

--- Cancel the build of `buf` (default: the current buffer): $/cancelRequest.
function M.cancel(buf)
  buf = (buf == nil or buf == 0) and vim.api.nvim_get_current_buf() or buf
  local st = M.state[buf]
  if st and st.request and not st.done then
    st.cancelled = true
    abx.client():cancel(st.request)
    return true
  end
  return false
end

--- :AbxTemplateBuild [DIR|DOCKERFILE] [NAME] [--build-arg K=V]... [--network M] [--no-cache]
--- [--target STAGE]
function M.command(fargs)
  local pos, opts = {}, {}
  local npos = 0
  local i = 1
  while i <= #fargs do
    local a = fargs[i]
    local flag, val = a:match("^%-%-([%w%-]+)=(.*)$")
    flag = flag or a:match("^%-%-([%w%-]+)$")
    if flag and not val and flag ~= "no-cache" then
      i = i + 1
      val = fargs[i]
    end
    if flag == "build-arg" and val then
      local k, v = val:match("^([^=]+)=(.*)$")
      if not k then
        return util.notify("abx: --build-arg takes K=V, not '" .. tostring(val) .. "'", vim.log.levels.ERROR)
      end
      opts.buildArgs = opts.buildArgs or {}
      opts.buildArgs[k] = v
    elseif flag == "network" and val then
      opts.network = val
    elseif flag == "target" and val then
      opts.target = val
    elseif flag == "no-cache" then
      opts.noCache = true
    elseif flag == "tag" and val then
      pos[2] = val
    elseif flag then
      return util.notify("abx: unknown option --" .. flag .. " (--build-arg K=V, --network MODE, --target STAGE, --no-cache)", vim.log.levels.ERROR)
    else
      npos = npos + 1
      if npos == 1 then
        pos[1] = a
      elseif npos == 2 and not pos[2] then
        pos[2] = a
      else
        return util.notify("abx: too many arguments: :AbxTemplateBuild [DIR|DOCKERFILE] [NAME]", vim.log.levels.ERROR)
      end
    end
    i = i + 1
  end
  local context, dockerfile, err = M.resolve(pos[1])
  if not context then
    return util.notify_error(err)
  end
  opts.dockerfile = dockerfile
  local function go(name)
    if name == nil or name == "" then
      return
    end
    M.build(context, name, opts)
  end
  if pos[2] then
    return go(pos[2])
  end
  vim.ui.input({ prompt = "Template name: ", default = M.default_name(context) }, go)
end

--- Define :AbxTemplateBuild (plugin/abx.lua does this).
function M.setup_command()
  vim.api.nvim_create_user_command("AbxTemplateBuild", function(o)
    local ok, e = pcall(M.command, o.fargs)
    if not ok then
      util.notify("abx: " .. tostring(e), vim.log.levels.ERROR)
    end
  end, {
    nargs = "*",
    complete = "file",
    desc = "abx: build a template from a Dockerfile: :AbxTemplateBuild [DIR|DOCKERFILE] [NAME]",
  })
end

return M
