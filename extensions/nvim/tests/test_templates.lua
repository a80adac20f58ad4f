-- :AbxTemplateBuild (issue 49): a Dockerfile built as a template with templates/build, its
-- steps streamed into abx-template://NAME as docker build prints them, the name asked
-- (the directory's name first), a failed step's E-code kept, <C-c> cancelling the build
-- ($/cancelRequest; nothing stored). The base image is busybox (the host's busybox-static) as
-- an OCI layout written by python3's tarfile, imported with templates/import.
local T = require("harness")
local templates = require("abx.templates")
local abx = require("abx")

local LAYOUT = [[
import hashlib, io, json, os, platform, sys, tarfile
out, tag = sys.argv[1], sys.argv[2]
buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
    for d, m in (("bin", 0o755), ("tmp", 0o1777)):
        ti = tarfile.TarInfo(d); ti.type = tarfile.DIRTYPE; ti.mode = m; t.addfile(ti)
    data = open("/bin/busybox", "rb").read()
    ti = tarfile.TarInfo("bin/busybox"); ti.size = len(data); ti.mode = 0o755
    t.addfile(ti, io.BytesIO(data))
    for a in ("sh", "echo", "cat", "sleep"):
        ti = tarfile.TarInfo("bin/" + a); ti.type = tarfile.SYMTYPE; ti.linkname = "/bin/busybox"; t.addfile(ti)
layer = buf.getvalue()
blobs = os.path.join(out, "blobs", "sha256"); os.makedirs(blobs, exist_ok=True)
def put(b):
    h = hashlib.sha256(b).hexdigest()
    open(os.path.join(blobs, h), "wb").write(b)
    return {"digest": "sha256:" + h, "size": len(b)}
arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
config = json.dumps({"architecture": arch, "os": "linux", "config": {"Env": ["PATH=/bin"]},
    "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]}}).encode()
man = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": dict(mediaType="application/vnd.oci.image.config.v1+json", **put(config)),
    "layers": [dict(mediaType="application/vnd.oci.image.layer.v1.tar", **put(layer))]}).encode()
m = put(man)
open(os.path.join(out, "oci-layout"), "w").write(json.dumps({"imageLayoutVersion": "1.0.0"}))
open(os.path.join(out, "index.json"), "w").write(json.dumps({"schemaVersion": 2, "manifests": [dict(
    mediaType="application/vnd.oci.image.manifest.v1+json",
    annotations={"org.opencontainers.image.ref.name": tag}, **m)]}))
]]

local work = vim.fn.tempname()
vim.fn.mkdir(work, "p")
local imported = false

local function base_image()
  if imported then
    return
  end
  local dir = work .. "/bb"
  local out = vim.fn.system({ "python3", "-c", LAYOUT, dir, "v1" })
  T.eq(0, vim.v.shell_error, "the busybox layout: " .. out)
  local _, err = abx.call_sync("templates/import", { path = dir, name = "nv/bb:1" }, 60000)
  T.ok(err == nil, "templates/import: " .. vim.inspect(err))
  imported = true
end

local function context(name, dockerfile, file)
  local dir = work .. "/" .. name
  vim.fn.mkdir(dir, "p")
  vim.fn.writefile({ "hello" }, dir .. "/hello.txt")
  vim.fn.writefile(vim.split(dockerfile, "\n", { plain = true }), dir .. "/" .. (file or "Dockerfile"))
  return dir
end

local function names()
  local l = abx.call_sync("templates/list", {}, 10000)
  local out = {}
  for _, t in ipairs(l and l.templates or {}) do
    for _, n in ipairs(type(t.names) == "table" and t.names or {}) do
      out[n] = true
    end
  end
  return out
end

local function done(buf)
  return T.bufvar(buf, "abx_template_done")
end

local function build_buf(name)
  return T.wait(function()
    local b = vim.fn.bufnr("abx-template://" .. name)
    return b > 0 and b
  end, "the build buffer of " .. name)
end

T.test("Dockerfiles, default names and steps", function()
  T.ok(templates.is_dockerfile("/p/Dockerfile"))
  T.ok(templates.is_dockerfile("/p/app.Dockerfile"))
  T.ok(templates.is_dockerfile("/p/Dockerfile.dev"))
  T.ok(not templates.is_dockerfile("/p/main.py"))
  T.eq("my-app", templates.default_name("/tmp/My App"))
  local s = templates.steps()
  local lines = {}
  for _, p in ipairs({
    { template = "t", step = "[1/2] FROM scratch", cached = true },
    { template = "t", step = "[2/2] RUN make" },
    { template = "t", step = "[2/2] RUN make", line = "cc a.c\n" },
  }) do
    vim.list_extend(lines, s.lines(p))
  end
  T.eq({ "CACHED [1/2] FROM scratch", "[2/2] RUN make", "  cc a.c" }, lines)
  T.eq(2, vim.fn.exists(":AbxTemplateBuild"), ":AbxTemplateBuild is defined")
end)

T.test(":AbxTemplateBuild DIR NAME builds and shows the steps", function()
  base_image()
  local dir = context("app", "FROM nv/bb:1\nCOPY hello.txt /srv/hello.txt\nRUN echo built-here && cat /srv/hello.txt")
  vim.cmd("AbxTemplateBuild " .. dir .. " nv/app:1")
  local buf = build_buf("nv/app:1")
  T.wait(function()
    return done(buf)
  end, "the build")
  local text = T.text(buf)
  T.eq("", T.bufvar(buf, "abx_template_error"), text)
  T.contains(text, ">>> abx template build " .. dir .. " -t nv/app:1\n")
  T.ok(text:find("\n%[%d+/%d+%] COPY hello%.txt /srv/hello%.txt\n") ~= nil, text)
  T.contains(text, "\n  built-here\n")
  T.contains(text, "Built template 'nv/app:1' (")
  T.ok(names()["nv/app:1"], "nv/app:1 is stored")
end)

T.test("the current Dockerfile, the name asked with the directory's name first", function()
  base_image()
  local dir = context("Asked Dir", "FROM nv/bb:1\nCOPY hello.txt /hello.txt", "app.Dockerfile")
  vim.cmd("edit " .. vim.fn.fnameescape(dir .. "/app.Dockerfile"))
  local asked
  vim.ui.input = function(opts, on_confirm)
    asked = opts
    on_confirm("nv/asked:1")
  end
  vim.cmd("AbxTemplateBuild")
  T.restore_ui()
  T.eq("asked-dir", asked and asked.default)
  local buf = build_buf("nv/asked:1")
  T.wait(function()
    return done(buf)
  end, "the build")
  T.eq("", T.bufvar(buf, "abx_template_error"), T.text(buf))
  T.contains(T.text(buf), " -t nv/asked:1 -f app.Dockerfile\n")
  T.ok(names()["nv/asked:1"], "nv/asked:1 is stored")
end)

T.test("a failed step keeps its E-code; nothing is stored", function()
  base_image()
  local dir = context("fails", "FROM nv/bb:1\nRUN echo about-to-fail && exit 3")
  local buf = templates.build(dir, "nv/fails:1")
  T.wait(function()
    return done(buf)
  end, "the failed build")
  T.contains(T.text(buf), "\n  about-to-fail\n")
  T.eq("E2011", T.bufvar(buf, "abx_template_error"), T.text(buf))
  T.ok(not names()["nv/fails:1"], "nothing stored")
end)

T.test("<C-c> cancels the build; nothing is stored", function()
  base_image()
  local dir = context("slow", "FROM nv/bb:1\nRUN echo started-sleeping && busybox sleep 600")
  local buf = templates.build(dir, "nv/slow:1")
  T.wait(function()
    return vim.tbl_contains(T.lines(buf), "  started-sleeping")
  end, "the RUN step running", 120000)
  vim.api.nvim_set_current_buf(buf)
  T.ok(vim.fn.maparg("<C-c>", "n") ~= "" or vim.fn.mapcheck("<C-c>", "n") ~= "" or #vim.api.nvim_buf_get_keymap(buf, "n") > 0, "<C-c> is mapped in the build buffer")
  T.ok(templates.cancel(buf), "a cancel was sent")
  T.wait(function()
    return done(buf)
  end, "the cancelled build's answer")
  T.eq("cancelled", T.bufvar(buf, "abx_template_error"))
  T.contains(T.text(buf), "was cancelled (nothing was stored)")
  T.ok(not names()["nv/slow:1"], "nothing stored")
end)
