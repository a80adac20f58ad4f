#!/usr/bin/env node
// A stand-in OpenSandbox server for tests (Node >= 18, no dependencies).
//
// It follows the two public specs of alibaba/OpenSandbox, specs/sandbox-lifecycle.yml (the
// lifecycle API) and specs/execd-api.yaml (execd, the daemon inside each sandbox), and the
// behaviour a real server showed (../../shared/reference/opensandbox.md):
//   - lifecycle under /v1 (and /), header OPEN-SANDBOX-API-KEY (401 MISSING_API_KEY /
//     INVALID_API_KEY), errors as {code, message} (FastAPI validation errors as {detail: [...]});
//   - POST /sandboxes answers 202 Pending and the sandbox turns Running shortly after (with
//     no /workspace: that is made by whoever wants one, like the plugin does); timeout
//     >= 60 (or null: no expiry); metadata must be Kubernetes label values; an entrypoint is
//     required with an image; images matching --missing-images fail with
//     DOCKER::SANDBOX_IMAGE_PULL_FAILED;
//   - pause/resume answer 202 and move through Pausing/Resuming asynchronously (409 from the
//     wrong state); paused sandboxes have their processes stopped (SIGSTOP) and execd requests
//     hang until resume, like a frozen container;
//   - renew-expiration takes an absolute RFC 3339 time later than the current one;
//   - endpoints/{port} answers {endpoint, headers} without a scheme; with use_server_proxy=true
//     the endpoint goes through this server's /v1/sandboxes/{id}/proxy/{port};
//   - a deleted or expired sandbox answers 404 (never Terminated), and its open execd streams
//     are cut, like a removed container; a DELETE first kills the container (its streams
//     break) and shows the sandbox as Failed for --delete-ms before it answers and the
//     sandbox is gone (seen on the real server, reference notes 2026-12-04);
//   - execd relays the signals it receives to the process group of each running foreground
//     command's `bash -c` (not to groups its jobs made), SIGKILLs that group when the
//     command's request goes away before the command ends, and interrupts with TERM then KILL
//     after 3 s (execd's runtime/command.go and runtime/interrupt.go); a signal death is
//     evalue "-1" with Go's text in the traceback ("signal: terminated");
//   - through the proxy, an execd that does not accept connections is HTTP 502
//     BACKEND_CONNECTION_FAILED (directly, the connection fails);
//   - execd: POST /command streams bare JSON objects separated by blank lines (no "data:"),
//     init / ping / stdout / stderr (one event per line, terminator stripped, "\n" for a blank
//     line, invalid UTF-8 replaced) / execution_complete or error (evalue = exit code, "-1" for
//     a signal), and keeps the connection open --linger-ms (1 s) after that terminal event;
//     a cwd that does not exist is refused before the stream starts (HTTP 400
//     INVALID_REQUEST_BODY "... working directory does not exist: DIR");
//     background commands with status, logs and interrupt; files (info with type, upload as
//     multipart metadata+file pairs where metadata must be a file part, overwriting an
//     existing file; download with Range; mv, which refuses an existing destination with
//     HTTP 500 RUNTIME_ERROR "error accessing file: destination path already exists: DEST";
//     delete), directories (list, mkdir -p, rm -rf), metrics; an access token
//     (X-EXECD-ACCESS-TOKEN) that the endpoint answer lists in its headers.
//
// Commands really run, on this machine, with `bash -c` in their own session (detached), in a
// per-sandbox directory that plays the sandbox's filesystem root: container paths /workspace/...
// and /tmp/... map to <root>/<id>/fs/workspace/... and <root>/<id>/fs/tmp/... for the file API,
// for cwd, and inside command text (the stand-in rewrites those paths in the commands it runs,
// and maps them back in their output). It is a test double, not an isolation boundary.
//
// Usage: node server.mjs [--port 0] [--host 127.0.0.1] [--root DIR] [--linger-ms 1000]
//          [--start-ms 150] [--pause-ms 200] [--ping-ms 3000] [--max-timeout 86400]
//          [--missing-images REGEX] [--no-file-type] [--host-network] [--delete-ms 300]
// Test controls (not OpenSandbox's): POST /_standin/sandboxes/{id}/signal-commands?signal=SIG
// (execd receives SIG; KILL: its requests are cancelled) and POST
// /_standin/sandboxes/{id}/execd?listening=false|true (execd stops / starts answering).
// --host-network plays a docker runtime with network_mode = "host": every sandbox's execd
// listens on the same host port, so every endpoint of port 44772 (direct or through the
// proxy) reaches one execd, the one of the oldest running sandbox (the first to bind the
// port), and that execd has no access token.
// The API key is read from the environment variable OSB_STANDIN_API_KEY (unset: no key needed).
// Prints "listening http://HOST:PORT" on stdout once it accepts connections.

import { spawn } from "node:child_process";
import { randomBytes, randomUUID } from "node:crypto";
import * as fs from "node:fs";
import * as fsp from "node:fs/promises";
import * as http from "node:http";
import * as os from "node:os";
import * as path from "node:path";

// ---------------------------------------------------------------------------------------------
// Options

const opts = {
  port: 0,
  host: "127.0.0.1",
  root: null,
  lingerMs: 1000,
  deleteMs: 300,
  startMs: 150,
  pauseMs: 200,
  pingMs: 3000,
  maxTimeout: 86400,
  missingImages: "(^|/)does-not-exist|^missing/",
  fileType: true,
  hostNetwork: false,
};
{
  const a = process.argv.slice(2);
  for (let i = 0; i < a.length; i++) {
    const next = () => a[++i];
    switch (a[i]) {
      case "--port": opts.port = Number(next()); break;
      case "--host": opts.host = next(); break;
      case "--root": opts.root = next(); break;
      case "--linger-ms": opts.lingerMs = Number(next()); break;
      case "--delete-ms": opts.deleteMs = Number(next()); break;
      case "--start-ms": opts.startMs = Number(next()); break;
      case "--pause-ms": opts.pauseMs = Number(next()); break;
      case "--ping-ms": opts.pingMs = Number(next()); break;
      case "--max-timeout": opts.maxTimeout = Number(next()); break;
      case "--missing-images": opts.missingImages = next(); break;
      case "--no-file-type": opts.fileType = false; break;
      case "--host-network": opts.hostNetwork = true; break;
      default:
        process.stderr.write(`server.mjs: unknown option ${a[i]}\n`);
        process.exit(2);
    }
  }
}
const API_KEY = process.env.OSB_STANDIN_API_KEY || "";
const EXECD_PORT = 44772;
const ownRoot = opts.root == null;
const ROOT = opts.root ?? fs.mkdtempSync(path.join(os.tmpdir(), "osb-standin-"));
const MISSING = new RegExp(opts.missingImages);
const log = (m) => process.stderr.write(`osb-standin: ${m}\n`);

// ---------------------------------------------------------------------------------------------
// HTTP helpers

function sendJson(res, status, body, headers = {}) {
  const data = body === undefined ? "" : JSON.stringify(body);
  res.writeHead(status, { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(data), ...headers });
  res.end(data);
}
const error = (res, status, code, message) => sendJson(res, status, { code, message });

function readBody(req, limit = 512 * 1024 * 1024) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    let size = 0;
    req.on("data", (c) => {
      size += c.length;
      if (size > limit) {
        reject(new Error("body too large"));
        req.destroy();
        return;
      }
      chunks.push(c);
    });
    req.on("end", () => resolve(Buffer.concat(chunks)));
    req.on("error", reject);
  });
}

async function readJson(req) {
  const buf = await readBody(req);
  if (!buf.length) return undefined;
  return JSON.parse(buf.toString("utf8"));
}

const iso = (ms) => new Date(ms).toISOString();

// ---------------------------------------------------------------------------------------------
// Sandboxes

const sandboxes = new Map();

const LABEL_NAME = /^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$/;
const LABEL_VALUE = /^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$/;
const DNS_SUBDOMAIN = /^(?:[a-z0-9]([-a-z0-9]*[a-z0-9])?\.)*[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;

function labelKeyOk(k) {
  let name = k;
  if (k.includes("/")) {
    const [prefix, rest] = [k.slice(0, k.indexOf("/")), k.slice(k.indexOf("/") + 1)];
    if (!prefix || !rest || prefix.length > 253 || !DNS_SUBDOMAIN.test(prefix)) return false;
    name = rest;
  }
  return name.length <= 63 && LABEL_NAME.test(name);
}

function setState(sb, state, reason = null, message = null) {
  sb.state = state;
  sb.reason = reason;
  sb.message = message;
  sb.lastTransitionAt = Date.now();
}

function view(sb, { full = true } = {}) {
  const v = {
    id: sb.id,
    status: { state: sb.state, reason: sb.reason, message: sb.message, lastTransitionAt: iso(sb.lastTransitionAt) },
    metadata: sb.metadata,
    entrypoint: sb.entrypoint,
    expiresAt: sb.expiresAt == null ? null : iso(sb.expiresAt),
    createdAt: iso(sb.createdAt),
  };
  if (full) v.image = { uri: sb.image };
  return v;
}

function armExpiry(sb) {
  clearTimeout(sb.expiryTimer);
  if (sb.expiresAt == null) return;
  const left = sb.expiresAt - Date.now();
  sb.expiryTimer = setTimeout(() => {
    if (Date.now() >= sb.expiresAt) removeSandbox(sb, "ttl_expiry");
    else armExpiry(sb);
  }, Math.max(0, Math.min(left, 2 ** 31 - 1)));
}

// Every process of a sandbox: the sessions of the commands it started (each command is
// spawned detached, i.e. as the leader of a new session; its jobs stay in that session).
function sandboxPids(sb) {
  const out = [];
  if (sb.sessions.size === 0) return out;
  let names = [];
  try {
    names = fs.readdirSync("/proc");
  } catch {
    return out;
  }
  for (const n of names) {
    if (!/^\d+$/.test(n)) continue;
    let stat;
    try {
      stat = fs.readFileSync(`/proc/${n}/stat`, "utf8");
    } catch {
      continue;
    }
    const rest = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    const session = Number(rest[3]);
    if (sb.sessions.has(session)) out.push(Number(n));
  }
  return out;
}

function signalSandbox(sb, sig) {
  for (const pid of sandboxPids(sb)) {
    try {
      process.kill(pid, sig);
    } catch {
      // gone
    }
  }
}

// The container's processes die and its connections drop (the first step of a delete).
function killContainer(sb) {
  sb.dead = true;
  clearTimeout(sb.expiryTimer);
  clearTimeout(sb.stateTimer);
  signalSandbox(sb, "SIGCONT");
  signalSandbox(sb, "SIGKILL");
  for (const res of sb.streams) res.destroy(); // the container is gone: connections drop
  for (const w of sb.waiting.splice(0)) w.reject();
}

function removeSandbox(sb, why) {
  if (!sandboxes.has(sb.id)) return;
  sandboxes.delete(sb.id);
  sb.deleted = true;
  killContainer(sb);
  fs.rm(sb.dir, { recursive: true, force: true }, () => {});
  log(`sandbox ${sb.id} removed (${why})`);
}

// --host-network: the sandbox whose execd holds the shared port (the oldest running one).
function hostExecd() {
  let best = null;
  for (const sb of sandboxes.values()) if (sb.state === "Running" && (!best || sb.createdAt < best.createdAt)) best = sb;
  return best;
}

// ---------------------------------------------------------------------------------------------
// Lifecycle API

async function createSandbox(req, res) {
  let body;
  try {
    body = await readJson(req);
  } catch {
    return error(res, 400, "INVALID_REQUEST", "request body is not valid JSON");
  }
  if (!body || typeof body !== "object" || Array.isArray(body)) return error(res, 400, "INVALID_REQUEST", "request body must be an object");
  const { image, entrypoint, timeout, env, metadata } = body;
  if (image == null && body.snapshotId == null) return error(res, 400, "SANDBOX::INVALID_PARAMETER", "Either image or snapshotId must be provided.");
  if (image != null && (typeof image !== "object" || typeof image.uri !== "string" || !image.uri)) {
    return sendJson(res, 422, { detail: [{ loc: ["body", "image", "uri"], msg: "Field required", type: "missing" }] });
  }
  if (image?.auth != null && (typeof image.auth.username !== "string" || typeof image.auth.password !== "string")) {
    return sendJson(res, 422, { detail: [{ loc: ["body", "image", "auth"], msg: "username and password are required", type: "missing" }] });
  }
  if (image != null && (!Array.isArray(entrypoint) || entrypoint.length === 0 || entrypoint.some((x) => typeof x !== "string"))) {
    return error(res, 400, "DOCKER::INVALID_ENTRYPOINT", "Entrypoint must contain at least one command.");
  }
  if (timeout != null && (!Number.isInteger(timeout) || timeout < 60)) {
    return sendJson(res, 422, {
      detail: [{ loc: ["body", "timeout"], msg: "Input should be greater than or equal to 60", type: "greater_than_equal", input: timeout }],
    });
  }
  if (timeout != null && timeout > opts.maxTimeout) {
    return error(res, 400, "SANDBOX::INVALID_PARAMETER", `Sandbox timeout ${timeout}s exceeds configured maximum of ${opts.maxTimeout}s.`);
  }
  if (env != null && (typeof env !== "object" || Array.isArray(env) || Object.values(env).some((v) => v != null && typeof v !== "string"))) {
    return sendJson(res, 422, { detail: [{ loc: ["body", "env"], msg: "Input should be a valid dictionary of strings", type: "dict_type" }] });
  }
  if (metadata != null) {
    if (typeof metadata !== "object" || Array.isArray(metadata) || Object.values(metadata).some((v) => typeof v !== "string")) {
      return sendJson(res, 422, { detail: [{ loc: ["body", "metadata"], msg: "Input should be a valid dictionary of strings", type: "dict_type" }] });
    }
    for (const [k, v] of Object.entries(metadata)) {
      if (k.startsWith("opensandbox.io/")) return error(res, 400, "SANDBOX::INVALID_METADATA_LABEL", `Metadata key '${k}' uses the reserved prefix 'opensandbox.io/'.`);
      if (!labelKeyOk(k)) return error(res, 400, "SANDBOX::INVALID_METADATA_LABEL", `Metadata key '${k}' is invalid.`);
      if (v.length > 63 || !LABEL_VALUE.test(v)) {
        return error(res, 400, "SANDBOX::INVALID_METADATA_LABEL", `Metadata value '${v}' is invalid: must be 63 characters or less, start/end with an alphanumeric character, and contain only alphanumeric, '-', '_', or '.' characters.`);
      }
    }
  }
  if (body.platform != null) {
    const { os: pos, arch } = body.platform;
    if (!["linux", "windows"].includes(String(pos).toLowerCase()) || !["amd64", "arm64"].includes(String(arch).toLowerCase())) {
      return error(res, 400, "SANDBOX::INVALID_PARAMETER", `Unsupported platform ${pos}/${arch}.`);
    }
  }
  if (body.networkPolicy != null) {
    const np = body.networkPolicy;
    const okAction = (a) => a === "allow" || a === "deny";
    if (typeof np !== "object" || (np.defaultAction != null && !okAction(np.defaultAction)) || (np.egress != null && (!Array.isArray(np.egress) || np.egress.some((r) => !okAction(r?.action) || typeof r?.target !== "string" || !r.target)))) {
      return sendJson(res, 422, { detail: [{ loc: ["body", "networkPolicy"], msg: "Invalid network policy", type: "value_error" }] });
    }
  }
  const uri = image?.uri ?? `snapshot:${body.snapshotId}`;
  if (MISSING.test(uri)) {
    return error(res, 500, "DOCKER::SANDBOX_IMAGE_PULL_FAILED", `Failed to pull image '${uri}': manifest unknown: manifest unknown`);
  }
  const id = randomUUID();
  const now = Date.now();
  const dir = path.join(ROOT, id);
  const fsroot = path.join(dir, "fs");
  await fsp.mkdir(path.join(fsroot, "tmp"), { recursive: true });
  await fsp.mkdir(path.join(fsroot, "root"), { recursive: true });
  const sb = {
    id,
    image: uri,
    entrypoint: entrypoint ?? ["tail", "-f", "/dev/null"],
    env: Object.fromEntries(Object.entries(env ?? {}).filter(([, v]) => v != null)),
    metadata: metadata ?? {},
    createdAt: now,
    expiresAt: timeout == null ? null : now + timeout * 1000,
    state: "Pending",
    reason: null,
    message: null,
    lastTransitionAt: now,
    dir,
    fsroot,
    token: randomBytes(16).toString("hex"),
    sessions: new Set(),
    streams: new Set(),
    waiting: [],
    execdListening: true,
    commands: new Map(),
    deleted: false,
  };
  setState(sb, "Pending", "CONTAINER_STARTING", "Container is starting");
  sandboxes.set(id, sb);
  armExpiry(sb);
  sb.stateTimer = setTimeout(() => {
    setState(sb, "Running", "CONTAINER_RUNNING", "Container is running");
    for (const w of sb.waiting.splice(0)) w.resolve();
  }, opts.startMs);
  sendJson(res, 202, view(sb, { full: false }), { Location: `/v1/sandboxes/${id}` });
}

function listSandboxes(res, url) {
  const states = url.searchParams.getAll("state");
  const meta = url.searchParams.get("metadata");
  const page = Math.max(1, Number(url.searchParams.get("page") ?? 1) || 1);
  const pageSize = Math.max(1, Number(url.searchParams.get("pageSize") ?? 20) || 20);
  const want = [];
  if (meta) {
    for (const pair of meta.split("&")) {
      const i = pair.indexOf("=");
      if (i > 0) want.push([decodeURIComponent(pair.slice(0, i)), decodeURIComponent(pair.slice(i + 1))]);
    }
  }
  const all = [...sandboxes.values()]
    .filter((sb) => states.length === 0 || states.includes(sb.state))
    .filter((sb) => want.every(([k, v]) => sb.metadata[k] === v))
    .sort((a, b) => a.createdAt - b.createdAt);
  const items = all.slice((page - 1) * pageSize, page * pageSize).map((sb) => view(sb));
  const totalPages = Math.ceil(all.length / pageSize);
  sendJson(res, 200, {
    items,
    pagination: { page, pageSize, totalItems: all.length, totalPages, hasNextPage: page < totalPages },
  });
}

function transition(sb, via, to, after) {
  setState(sb, via);
  clearTimeout(sb.stateTimer);
  sb.stateTimer = setTimeout(() => {
    if (sb.deleted) return;
    after?.();
    setState(sb, to);
    if (to === "Running") for (const w of sb.waiting.splice(0)) w.resolve();
  }, opts.pauseMs);
}

async function lifecycle(req, res, url, parts) {
  // parts: path segments after the optional /v1
  const [root, id, action, arg] = parts;
  if (root !== "sandboxes") return error(res, 404, "NOT_FOUND", `No route for ${req.method} ${url.pathname}`);
  if (id === undefined) {
    if (req.method === "POST") return createSandbox(req, res);
    if (req.method === "GET") return listSandboxes(res, url);
    return error(res, 405, "METHOD_NOT_ALLOWED", `${req.method} is not allowed here`);
  }
  const sb = sandboxes.get(id);
  if (!sb) return error(res, 404, "DOCKER::SANDBOX_NOT_FOUND", `Sandbox ${id} not found.`);
  if (action === undefined) {
    if (req.method === "GET") return sendJson(res, 200, view(sb));
    if (req.method === "DELETE") {
      // As on the real server (opensandbox-server 1.1.1 with docker, reference notes
      // 2026-12-04): the container is killed first, so its execd streams break before the
      // DELETE answers, and a GET while the delete runs shows the sandbox as Failed; then it
      // is gone (404). --delete-ms is how long that takes here.
      if (sb.deleting) {
        await sb.deleting;
      } else {
        sb.deleting = new Promise((resolve) => {
          killContainer(sb);
          setState(sb, "Failed");
          setTimeout(() => {
            removeSandbox(sb, "user_delete");
            resolve();
          }, opts.deleteMs);
        });
        await sb.deleting;
      }
      res.writeHead(204);
      return res.end();
    }
    return error(res, 405, "METHOD_NOT_ALLOWED", `${req.method} is not allowed here`);
  }
  if (action === "pause" && req.method === "POST") {
    if (sb.state !== "Running") return error(res, 409, "DOCKER::SANDBOX_NOT_RUNNING", `Sandbox ${id} is not running (state ${sb.state}).`);
    transition(sb, "Pausing", "Paused", () => signalSandbox(sb, "SIGSTOP"));
    res.writeHead(202);
    return res.end();
  }
  if (action === "resume" && req.method === "POST") {
    if (sb.state !== "Paused") return error(res, 409, "DOCKER::SANDBOX_NOT_PAUSED", `Sandbox ${id} is not paused (state ${sb.state}).`);
    transition(sb, "Resuming", "Running", () => signalSandbox(sb, "SIGCONT"));
    res.writeHead(202);
    return res.end();
  }
  if (action === "renew-expiration" && req.method === "POST") {
    let body;
    try {
      body = await readJson(req);
    } catch {
      return error(res, 400, "INVALID_REQUEST", "request body is not valid JSON");
    }
    const t = typeof body?.expiresAt === "string" ? Date.parse(body.expiresAt) : NaN;
    if (Number.isNaN(t)) return sendJson(res, 422, { detail: [{ loc: ["body", "expiresAt"], msg: "Input should be a valid datetime", type: "datetime_parsing" }] });
    if (t <= Date.now()) return error(res, 400, "DOCKER::INVALID_EXPIRATION", "New expiration time must be in the future.");
    if (sb.expiresAt != null && t <= sb.expiresAt) {
      return error(res, 400, "DOCKER::EXPIRATION_NOT_EXTENDED", `New expiration time must be after the current one (${iso(sb.expiresAt)}).`);
    }
    sb.expiresAt = t;
    armExpiry(sb);
    return sendJson(res, 200, { expiresAt: iso(t) });
  }
  if (action === "metadata" && req.method === "PATCH") {
    let body;
    try {
      body = await readJson(req);
    } catch {
      return error(res, 400, "INVALID_REQUEST", "request body is not valid JSON");
    }
    for (const [k, v] of Object.entries(body ?? {})) {
      if (v === null) delete sb.metadata[k];
      else if (typeof v === "string" && labelKeyOk(k) && LABEL_VALUE.test(v)) sb.metadata[k] = v;
      else return error(res, 400, "SANDBOX::INVALID_METADATA_LABEL", `Metadata '${k}' is invalid.`);
    }
    return sendJson(res, 200, view(sb));
  }
  if (action === "endpoints" && req.method === "GET") {
    const port = Number(arg);
    if (!Number.isInteger(port) || port < 1 || port > 65535) return error(res, 400, "DOCKER::INVALID_PORT", "Port must be between 1 and 65535.");
    const proxy = url.searchParams.get("use_server_proxy") === "true";
    const hostport = `${opts.host}:${server.address().port}`;
    let endpoint = proxy ? `${hostport}/v1/sandboxes/${id}/proxy/${port}` : `${hostport}/sandboxes/${id}/port/${port}`;
    if (opts.hostNetwork && !proxy) endpoint = `${hostport}/hostnet/${port}`;
    const body = { endpoint };
    if (port === EXECD_PORT && !opts.hostNetwork) body.headers = { "X-EXECD-ACCESS-TOKEN": sb.token };
    return sendJson(res, 200, body);
  }
  return error(res, 404, "NOT_FOUND", `No route for ${req.method} ${url.pathname}`);
}

// ---------------------------------------------------------------------------------------------
// execd: paths

// Container path -> host path (the sandbox's directory plays its filesystem root).
function hostPath(sb, p) {
  const norm = path.posix.normalize(path.posix.join("/", String(p)));
  return path.join(sb.fsroot, norm);
}
// Host path -> container path.
function containerPath(sb, h) {
  const rel = path.relative(sb.fsroot, h);
  return `/${rel.split(path.sep).join("/")}`.replace(/^\/$/, "/");
}

// Rewrite /workspace and /tmp in command text to the sandbox's directories.
const PATH_IN_TEXT = /(^|[\s'"=:;(|&<>`{])(\/(?:workspace|tmp|root))(?=$|[/\s'";)|&<>`}])/g;
function rewrite(sb, text) {
  return text.replace(PATH_IN_TEXT, (m, pre, p) => pre + sb.fsroot + p);
}
function unrewrite(sb, text) {
  return text.split(sb.fsroot).join("");
}

async function fileInfo(sb, p) {
  const h = hostPath(sb, p);
  const st = await fsp.lstat(h);
  const type = st.isDirectory() ? "directory" : st.isFile() ? "file" : st.isSymbolicLink() ? "symlink" : "other";
  const info = {
    path: p,
    size: st.size,
    modified_at: st.mtime.toISOString(),
    created_at: st.birthtime.toISOString(),
    owner: String(st.uid === 0 ? "root" : st.uid),
    group: String(st.gid === 0 ? "root" : st.gid),
    mode: Number((st.mode & 0o777).toString(8)),
  };
  if (opts.fileType) info.type = type;
  return info;
}

const notFound = (res, p, e) => error(res, 404, "FILE_NOT_FOUND", `file not found. lstat ${p}: ${e?.code === "ENOENT" ? "no such file or directory" : e?.message}`);

function octalMode(m, fallback) {
  if (m == null || m === 0) return fallback;
  const s = String(m);
  return /^[0-7]+$/.test(s) ? parseInt(s, 8) : fallback;
}

// ---------------------------------------------------------------------------------------------
// execd: commands

// Splits a byte stream into execd's line events: each line without its terminator; \n, \r and
// \r\n end a line; a blank line is sent as "\n"; the rest is flushed at the end.
class LineSplitter {
  constructor(emit) {
    this.emit = emit;
    this.buf = [];
    this.lastWasCR = false;
  }
  push(chunk) {
    let start = 0;
    for (let i = 0; i < chunk.length; i++) {
      const b = chunk[i];
      if (b !== 0x0a && b !== 0x0d) continue;
      if (i > start) this.buf.push(chunk.subarray(start, i));
      if (this.buf.length) {
        this.emit(Buffer.concat(this.buf).toString("utf8"));
        this.buf = [];
      } else if (!(b === 0x0a && this.lastWasCR)) {
        this.emit("\n");
      }
      this.lastWasCR = b === 0x0d;
      start = i + 1;
    }
    if (start < chunk.length) {
      this.buf.push(Buffer.from(chunk.subarray(start)));
      this.lastWasCR = false;
    }
  }
  flush() {
    if (this.buf.length) this.emit(Buffer.concat(this.buf).toString("utf8"));
    this.buf = [];
  }
}

function commandEnv(sb, envs) {
  const env = {
    PATH: process.env.PATH ?? "/usr/local/bin:/usr/bin:/bin",
    LANG: "C.UTF-8",
    HOME: hostPath(sb, "/root"),
    TMPDIR: hostPath(sb, "/tmp"),
    ...sb.env,
  };
  for (const [k, v] of Object.entries(envs ?? {})) if (v != null) env[k] = String(v);
  return env;
}

function startProcess(sb, command, cwdHost, env, stdio) {
  const child = spawn("bash", ["-c", rewrite(sb, command)], { cwd: cwdHost, env, detached: true, stdio });
  if (child.pid) sb.sessions.add(child.pid);
  return child;
}

function killGroup(pid, sig) {
  try {
    process.kill(-pid, sig);
  } catch {
    // gone
  }
}

async function runCommand(sb, req, res) {
  let body;
  try {
    body = await readJson(req);
  } catch (e) {
    return error(res, 400, "INVALID_REQUEST_BODY", `error parsing request, MAYBE invalid body format. ${e.message}`);
  }
  if (!body || typeof body.command !== "string" || !body.command) {
    return error(res, 400, "INVALID_REQUEST_BODY", "invalid request, validation error: command is required");
  }
  // execd validates the request before it starts the stream (RunCommandRequest.Validate ->
  // runtime.ValidateWorkingDir): a missing working directory is a 400, not an error event.
  // Without a cwd the command runs in execd's own working directory (here: the root).
  const cwd = body.cwd ? String(body.cwd) : "/";
  const cwdHost = hostPath(sb, cwd);
  if (body.cwd) {
    let st = null;
    try {
      st = await fsp.stat(cwdHost);
    } catch (e) {
      if (e.code === "ENOENT") {
        return error(res, 400, "INVALID_REQUEST_BODY", `invalid request, validation error working directory does not exist: ${cwd}`);
      }
      return error(res, 400, "INVALID_REQUEST_BODY", `invalid request, validation error cannot access working directory "${cwd}": stat ${cwd}: ${e.code === "ENOTDIR" ? "not a directory" : e.message}`);
    }
    if (!st.isDirectory()) return error(res, 400, "INVALID_REQUEST_BODY", `invalid request, validation error working directory path is not a directory: ${cwd}`);
  }
  const session = randomBytes(8).toString("hex");
  const env = commandEnv(sb, body.envs);
  res.writeHead(200, { "Content-Type": "text/event-stream", "Cache-Control": "no-cache", Connection: "keep-alive", "X-Accel-Buffering": "no" });
  const write = (event) => {
    if (!res.destroyed) res.write(`${JSON.stringify({ ...event, timestamp: Date.now() })}\n\n`);
  };
  sb.streams.add(res);
  res.on("close", () => {
    sb.streams.delete(res);
    // The client went away while the command runs: execd's request context is cancelled and
    // it SIGKILLs the command's group (command.go, runCommand: case <-ctx.Done()).
    if (cmdRef.cmd?.running && !cmdRef.cmd.exited && !sb.dead) killGroup(cmdRef.cmd.pid, "SIGKILL");
  });
  const cmdRef = { cmd: null };
  const end = () => {
    // execd keeps the connection open a while after the terminal event.
    setTimeout(() => {
      sb.streams.delete(res);
      res.end();
    }, opts.lingerMs);
  };
  const started = Date.now();

  if (body.background) {
    const logFile = hostPath(sb, `/tmp/.execd-${session}.output`);
    const fd = fs.openSync(logFile, "w");
    const child = startProcess(sb, body.command, cwdHost, env, ["ignore", fd, fd]);
    fs.closeSync(fd);
    const cmd = { id: session, content: body.command, running: true, exitCode: null, error: null, startedAt: started, finishedAt: null, pid: child.pid, logFile, background: true };
    sb.commands.set(session, cmd);
    child.on("error", (e) => Object.assign(cmd, { running: false, exitCode: 255, error: e.message, finishedAt: Date.now() }));
    child.on("exit", (code, signal) => Object.assign(cmd, { running: false, exitCode: code ?? -1, error: signal ? `signal: ${signal}` : code ? `exit status ${code}` : null, finishedAt: Date.now() }));
    if (Number.isInteger(body.timeout) && body.timeout > 0) setTimeout(() => cmd.running && killGroup(child.pid, "SIGKILL"), body.timeout);
    write({ type: "init", text: session });
    write({ type: "execution_complete", execution_time: Date.now() - started });
    return end();
  }

  const child = startProcess(sb, body.command, cwdHost, env, ["ignore", "pipe", "pipe"]);
  const cmd = { id: session, content: body.command, running: true, exitCode: null, error: null, startedAt: started, finishedAt: null, pid: child.pid, background: false };
  sb.commands.set(session, cmd);
  cmdRef.cmd = cmd;
  write({ type: "init", text: session });
  const ping = setInterval(() => write({ type: "ping", text: "pong" }), opts.pingMs);
  const out = new LineSplitter((text) => write({ type: "stdout", text: unrewrite(sb, text) }));
  const err = new LineSplitter((text) => write({ type: "stderr", text: unrewrite(sb, text) }));
  child.stdout.on("data", (c) => out.push(c));
  child.stderr.on("data", (c) => err.push(c));
  let timeoutTimer = null;
  if (Number.isInteger(body.timeout) && body.timeout > 0) timeoutTimer = setTimeout(() => killGroup(child.pid, "SIGKILL"), body.timeout);
  let closed = false;
  let exit = null;
  const done = () => {
    if (closed || exit == null) return;
    closed = true;
    clearInterval(ping);
    clearTimeout(timeoutTimer);
    out.flush();
    err.flush();
    const { code, signal } = exit;
    Object.assign(cmd, { running: false, exitCode: code ?? -1, finishedAt: Date.now(), error: signal ? `signal: ${signal}` : code ? `exit status ${code}` : null });
    if (code === 0) write({ type: "execution_complete", execution_time: Date.now() - started });
    else {
      // Go's exec.ExitError: ExitCode() is -1 for a signal death, Error() "signal: terminated".
      const evalue = signal ? "-1" : String(code);
      write({ type: "error", error: { ename: "CommandExecError", evalue, traceback: [signal ? `signal: ${goSignal(signal)}` : `exit status ${code}`] } });
    }
    end();
  };
  child.on("error", (e) => {
    exit = { code: 127, signal: null };
    write({ type: "stderr", text: e.message });
    done();
  });
  child.on("exit", (code, signal) => {
    exit = { code, signal };
    cmd.exited = true;
    // Output still in the pipes comes first; a background child holding them open does not
    // delay the end (execd tails files and stops at the exit).
    setTimeout(() => {
      child.stdout.destroy();
      child.stderr.destroy();
      done();
    }, 100);
  });
  child.on("close", () => done());
}

// syscall.Signal.String() of Go, as execd's error texts carry it.
const GO_SIGNAL_TEXT = {
  SIGHUP: "hangup",
  SIGINT: "interrupt",
  SIGQUIT: "quit",
  SIGABRT: "aborted",
  SIGKILL: "killed",
  SIGUSR1: "user defined signal 1",
  SIGUSR2: "user defined signal 2",
  SIGPIPE: "broken pipe",
  SIGALRM: "alarm clock",
  SIGTERM: "terminated",
};
const goSignal = (sig) => GO_SIGNAL_TEXT[sig] ?? sig.replace(/^SIG/, "").toLowerCase();

// What execd does with its running foreground commands when it gets a signal itself, and when
// a command's request context ends (alibaba/OpenSandbox components/execd/pkg/runtime/command.go,
// runCommand): signal.Notify(...) relays each signal it receives to -cmd.Process.Pid, and a
// cancelled context (client gone, timeout) SIGKILLs -cmd.Process.Pid. That pid is the
// `bash -c` execd started (Setpgid: its own group); processes that made a group of their
// own (a wrapper's `set -m` jobs) do not get either.
function signalCommands(sb, sig) {
  let n = 0;
  for (const cmd of sb.commands.values()) {
    if (cmd.background || !cmd.running) continue;
    killGroup(cmd.pid, sig);
    n++;
  }
  return n;
}

// DELETE /command?id= (Controller.Interrupt -> killPid, components/execd/pkg/runtime/interrupt.go):
// SIGTERM to the command's group, SIGKILL after 3 s if the group is still there.
function interrupt(sb, res, id) {
  const cmd = sb.commands.get(id);
  if (!cmd) return error(res, 400, "INVALID_REQUEST", "no such session");
  if (cmd.running) {
    killGroup(cmd.pid, "SIGTERM");
    setTimeout(() => cmd.running && killGroup(cmd.pid, "SIGKILL"), 3000);
  }
  return sendJson(res, 200, null);
}

// ---------------------------------------------------------------------------------------------
// execd: multipart upload

function parseMultipart(buf, contentType) {
  const m = /boundary=(?:"([^"]+)"|([^;]+))/i.exec(contentType ?? "");
  if (!m) return null;
  const boundary = Buffer.from(`--${m[1] ?? m[2].trim()}`);
  const parts = [];
  let pos = buf.indexOf(boundary);
  if (pos < 0) return null;
  for (;;) {
    pos += boundary.length;
    if (buf[pos] === 0x2d && buf[pos + 1] === 0x2d) break; // closing boundary
    if (buf[pos] === 0x0d && buf[pos + 1] === 0x0a) pos += 2;
    const headEnd = buf.indexOf("\r\n\r\n", pos);
    if (headEnd < 0) return null;
    const head = buf.subarray(pos, headEnd).toString("utf8");
    const next = buf.indexOf(Buffer.concat([Buffer.from("\r\n"), boundary]), headEnd + 4);
    if (next < 0) return null;
    const data = buf.subarray(headEnd + 4, next);
    const disp = /content-disposition:([^\r\n]*)/i.exec(head)?.[1] ?? "";
    const name = /\bname="([^"]*)"/i.exec(disp)?.[1] ?? null;
    const filename = /\bfilename="([^"]*)"/i.exec(disp)?.[1] ?? null;
    parts.push({ name, filename, data });
    pos = next + 2;
  }
  return parts;
}

async function upload(sb, req, res) {
  let buf;
  try {
    buf = await readBody(req);
  } catch (e) {
    return error(res, 400, "INVALID_FILE", e.message);
  }
  const parts = parseMultipart(buf, req.headers["content-type"]);
  if (!parts) return error(res, 400, "INVALID_FILE", "multipart form is empty");
  // Like execd: metadata and file are read from the form's *files*: a metadata part without a
  // filename is not a file part and is not seen.
  const metas = parts.filter((p) => p.name === "metadata" && p.filename != null);
  const files = parts.filter((p) => p.name === "file" && p.filename != null);
  if (metas.length === 0) return error(res, 400, "INVALID_FILE_METADATA", "metadata file is missing");
  if (files.length === 0) return error(res, 400, "INVALID_FILE_CONTENT", "file is missing");
  if (metas.length !== files.length) return error(res, 400, "INVALID_FILE", `metadata and file count mismatch: ${metas.length} vs ${files.length}`);
  for (let i = 0; i < metas.length; i++) {
    let meta;
    try {
      meta = JSON.parse(metas[i].data.toString("utf8"));
    } catch (e) {
      return error(res, 400, "INVALID_FILE_METADATA", `invalid metadata format. ${e.message}`);
    }
    if (!meta?.path) return error(res, 400, "INVALID_FILE_METADATA", "metadata path is empty");
    const h = hostPath(sb, meta.path);
    try {
      await fsp.mkdir(path.dirname(h), { recursive: true });
      await fsp.writeFile(h, files[i].data);
      await fsp.chmod(h, octalMode(meta.mode, 0o755));
    } catch (e) {
      return error(res, 500, "RUNTIME_ERROR", `error writing file ${meta.path}. ${e.code === "EISDIR" ? "is a directory" : e.message}`);
    }
  }
  return sendJson(res, 200, null);
}

async function download(sb, req, res, url) {
  const p = url.searchParams.get("path");
  if (!p) return error(res, 400, "MISSING_QUERY", "missing query parameter 'path'");
  const h = hostPath(sb, p);
  let st;
  try {
    st = await fsp.stat(h);
  } catch (e) {
    return notFound(res, p, e);
  }
  if (st.isDirectory()) return error(res, 400, "INVALID_REQUEST", `${p} is a directory`);
  const size = st.size;
  const range = req.headers.range;
  const headers = { "Content-Type": "application/octet-stream", "Content-Disposition": `attachment; filename="${encodeURIComponent(path.basename(p))}"`, "Accept-Ranges": "bytes" };
  if (range) {
    const m = /^bytes=(\d*)-(\d*)$/.exec(range.trim());
    let start;
    let end;
    if (m && m[1] !== "") {
      start = Number(m[1]);
      end = m[2] === "" ? size - 1 : Math.min(Number(m[2]), size - 1);
    } else if (m && m[2] !== "") {
      start = Math.max(0, size - Number(m[2]));
      end = size - 1;
    }
    if (!m || start > end || start >= size) {
      return sendJson(res, 416, { code: "RANGE_NOT_SATISFIABLE", message: `invalid range ${range} for size ${size}` }, { "Content-Range": `bytes */${size}` });
    }
    res.writeHead(206, { ...headers, "Content-Range": `bytes ${start}-${end}/${size}`, "Content-Length": end - start + 1 });
    fs.createReadStream(h, { start, end }).pipe(res);
    return;
  }
  res.writeHead(200, { ...headers, "Content-Length": size });
  fs.createReadStream(h).pipe(res);
}

async function listDir(sb, res, url) {
  const p = url.searchParams.get("path");
  if (!p) return error(res, 400, "MISSING_QUERY", "missing query parameter 'path'");
  const depth = Math.max(1, Number(url.searchParams.get("depth") ?? 1) || 1);
  const h = hostPath(sb, p);
  let st;
  try {
    st = await fsp.stat(h);
  } catch (e) {
    return notFound(res, p, e);
  }
  if (!st.isDirectory()) return error(res, 400, "INVALID_REQUEST", `${p} is not a directory`);
  const out = [];
  const walk = async (dirHost, level) => {
    for (const name of (await fsp.readdir(dirHost)).sort()) {
      const child = path.join(dirHost, name);
      let info;
      try {
        info = await fileInfo(sb, containerPath(sb, child));
      } catch {
        continue;
      }
      out.push(info);
      if (level < depth && (await fsp.lstat(child)).isDirectory()) await walk(child, level + 1);
    }
  };
  await walk(h, 1);
  return sendJson(res, 200, out);
}

async function execd(sb, req, res, url, rest) {
  const token = req.headers["x-execd-access-token"];
  if (!opts.hostNetwork && token !== sb.token) return sendJson(res, 401, { error: "Unauthorized: invalid or missing header X-EXECD-ACCESS-TOKEN" });
  const route = `${req.method} /${rest.join("/")}`;
  const paths = () => url.searchParams.getAll("path");
  try {
    switch (route) {
      case "GET /ping":
        return sendJson(res, 200, null);
      case "POST /command":
        return await runCommand(sb, req, res);
      case "DELETE /command":
        return interrupt(sb, res, url.searchParams.get("id"));
      case "GET /files/info": {
        const out = {};
        for (const p of paths()) {
          try {
            out[p] = await fileInfo(sb, p);
          } catch (e) {
            return notFound(res, p, e);
          }
        }
        return sendJson(res, 200, out);
      }
      case "DELETE /files":
        for (const p of paths()) {
          try {
            await fsp.unlink(hostPath(sb, p));
          } catch (e) {
            return error(res, 500, "RUNTIME_ERROR", `error removing file ${p}. remove ${p}: ${e.code === "EISDIR" || e.code === "EPERM" ? "is a directory" : e.code === "ENOENT" ? "no such file or directory" : e.message}`);
          }
        }
        return sendJson(res, 200, null);
      case "POST /files/mv": {
        let items;
        try {
          items = await readJson(req);
        } catch (e) {
          items = null;
        }
        if (!Array.isArray(items)) return error(res, 400, "INVALID_REQUEST_BODY", "error parsing request, MAYBE invalid body format.");
        for (const it of items) {
          // execd's RenameFile (components/execd/pkg/web/controller/utils.go): the source must
          // exist (404), the destination's directory is created, and an existing destination
          // is refused (500 RUNTIME_ERROR): /files/mv never replaces anything.
          const src = hostPath(sb, it.src);
          const dest = hostPath(sb, it.dest);
          try {
            await fsp.stat(src);
          } catch (e) {
            if (e.code === "ENOENT") return error(res, 404, "FILE_NOT_FOUND", `file not found. source path not found: ${it.src}: stat ${it.src}: no such file or directory`);
          }
          try {
            await fsp.mkdir(path.dirname(dest), { recursive: true });
          } catch (e) {
            return error(res, 500, "RUNTIME_ERROR", `error accessing file: failed to create destination directory: mkdir ${path.posix.dirname(it.dest)}: ${e.code === "EEXIST" || e.code === "ENOTDIR" ? "not a directory" : e.message}`);
          }
          let exists = true;
          try {
            await fsp.stat(dest); // os.Stat: follows links, so a dangling link does not count
          } catch {
            exists = false;
          }
          if (exists) return error(res, 500, "RUNTIME_ERROR", `error accessing file: destination path already exists: ${it.dest}`);
          try {
            await fsp.rename(src, dest);
          } catch (e) {
            if (e.code === "ENOENT") return notFound(res, it.src, e);
            return error(res, 500, "RUNTIME_ERROR", `error accessing file: failed to rename file: rename ${it.src} ${it.dest}: ${e.code === "EINVAL" ? "invalid argument" : e.message}`);
          }
        }
        return sendJson(res, 200, null);
      }
      case "POST /files/upload":
        return await upload(sb, req, res);
      case "GET /files/download":
        return await download(sb, req, res, url);
      case "GET /directories/list":
        return await listDir(sb, res, url);
      case "POST /directories": {
        const body = await readJson(req);
        for (const [p, perm] of Object.entries(body ?? {})) {
          try {
            const h = hostPath(sb, p);
            await fsp.mkdir(h, { recursive: true });
            await fsp.chmod(h, octalMode(perm?.mode, 0o755));
          } catch (e) {
            return error(res, 500, "RUNTIME_ERROR", `error creating directory ${p}. ${e.code === "EEXIST" || e.code === "ENOTDIR" ? "not a directory" : e.message}`);
          }
        }
        return sendJson(res, 200, null);
      }
      case "DELETE /directories":
        for (const p of paths()) await fsp.rm(hostPath(sb, p), { recursive: true, force: true });
        return sendJson(res, 200, null);
      case "GET /metrics":
        return sendJson(res, 200, {
          cpu_count: os.cpus().length,
          cpu_used_pct: 0,
          mem_total_mib: Math.round(os.totalmem() / 1048576),
          mem_used_mib: Math.round((os.totalmem() - os.freemem()) / 1048576),
          timestamp: Date.now(),
        });
      default:
        break;
    }
    if (req.method === "GET" && rest[0] === "command" && rest[1] === "status" && rest[2]) {
      const cmd = sb.commands.get(rest[2]);
      if (!cmd) return error(res, 404, "INVALID_REQUEST", `no such session ${rest[2]}`);
      return sendJson(res, 200, {
        id: cmd.id,
        content: cmd.content,
        running: cmd.running,
        exit_code: cmd.running ? null : cmd.exitCode,
        error: cmd.error,
        started_at: iso(cmd.startedAt),
        finished_at: cmd.finishedAt ? iso(cmd.finishedAt) : null,
      });
    }
    if (req.method === "GET" && rest[0] === "command" && rest[2] === "logs") {
      const cmd = sb.commands.get(rest[1]);
      if (!cmd?.logFile) return error(res, 404, "INVALID_REQUEST", `no such background command ${rest[1]}`);
      const cursor = Math.max(0, Number(url.searchParams.get("cursor") ?? 0) || 0);
      let data = Buffer.alloc(0);
      try {
        data = (await fsp.readFile(cmd.logFile)).subarray(cursor);
      } catch {
        // no output yet
      }
      res.writeHead(200, { "Content-Type": "text/plain; charset=utf-8", "EXECD-COMMANDS-TAIL-CURSOR": String(cursor + data.length) });
      return res.end(data);
    }
    return error(res, 404, "NOT_FOUND", `No route for ${route}`);
  } catch (e) {
    if (!res.headersSent) return error(res, 500, "RUNTIME_ERROR", e.message);
    res.destroy();
  }
}

// ---------------------------------------------------------------------------------------------
// Routing

async function handle(req, res) {
  const url = new URL(req.url, "http://x");
  let parts = url.pathname.split("/").filter(Boolean).map(decodeURIComponent);
  const v1 = parts[0] === "v1";
  if (v1) parts = parts.slice(1);

  if (parts[0] === "health") return sendJson(res, 200, { status: "healthy" });

  // Test controls (not part of OpenSandbox), for what tests cannot make happen through the API:
  //   POST /_standin/sandboxes/{id}/signal-commands?signal=TERM  execd receives that signal
  //     (or, with KILL, its requests' contexts end) and acts on its running commands as the
  //     real one does (signalCommands); answers {signalled: N};
  //   POST /_standin/sandboxes/{id}/execd?listening=false|true  execd stops / starts accepting
  //     connections (crashed, or not started yet);
  //   POST /_standin/sandboxes/{id}/commands  answers {running: N}, its foreground commands.
  if (parts[0] === "_standin" && parts[1] === "sandboxes" && parts[2] && req.method === "POST") {
    const sb = sandboxes.get(parts[2]);
    if (!sb) return error(res, 404, "DOCKER::SANDBOX_NOT_FOUND", `Sandbox ${parts[2]} not found.`);
    if (parts[3] === "signal-commands") {
      const sig = `SIG${(url.searchParams.get("signal") ?? "TERM").toUpperCase().replace(/^SIG/, "")}`;
      return sendJson(res, 200, { signalled: signalCommands(sb, sig) });
    }
    if (parts[3] === "commands") {
      // How many foreground commands run now (tests wait on it instead of sleeping).
      const running = [...sb.commands.values()].filter((c) => !c.background && c.running).length;
      return sendJson(res, 200, { running });
    }
    if (parts[3] === "execd") {
      sb.execdListening = url.searchParams.get("listening") !== "false";
      return sendJson(res, 200, { listening: sb.execdListening });
    }
  }

  // --host-network: the one execd on the host's port 44772, whoever asks for it.
  if (opts.hostNetwork && parts[0] === "hostnet" && parts[1]) {
    const sb = hostExecd();
    if (!sb || Number(parts[1]) !== EXECD_PORT) return req.socket.destroy();
    return execd(sb, req, res, url, parts.slice(2));
  }

  // A sandbox port: /sandboxes/{id}/port/{port}/... (direct endpoint) or
  // [/v1]/sandboxes/{id}/proxy/{port}/... (through the server; no API key needed).
  if (parts[0] === "sandboxes" && (parts[2] === "port" || parts[2] === "proxy") && parts[3]) {
    let sb = sandboxes.get(parts[1]);
    const viaProxy = parts[2] === "proxy";
    if (sb && opts.hostNetwork && Number(parts[3]) === EXECD_PORT) sb = hostExecd() ?? sb;
    if (!sb) {
      if (viaProxy) return error(res, 404, "DOCKER::SANDBOX_NOT_FOUND", `Sandbox ${parts[1]} not found.`);
      return req.socket.destroy(); // a removed container's port: nothing answers
    }
    if (Number(parts[3]) !== EXECD_PORT) return error(res, 502, "PROXY_ERROR", `Nothing is listening on port ${parts[3]} of sandbox ${sb.id}.`);
    if (!sb.execdListening || sb.dead) {
      // Nothing accepts the connection: directly, it fails; the server's proxy answers 502
      // BACKEND_CONNECTION_FAILED (seen on the real server, reference notes 2026-12-04; also
      // right after a create, before execd listens).
      if (viaProxy) return error(res, 502, "BACKEND_CONNECTION_FAILED", `Failed to connect to the backend of sandbox ${sb.id} on port ${parts[3]}.`);
      return req.socket.destroy();
    }
    if (sb.state !== "Running") {
      // A paused (frozen) or starting container does not answer; the request waits.
      try {
        await new Promise((resolve, reject) => sb.waiting.push({ resolve, reject }));
      } catch {
        return req.socket.destroy();
      }
    }
    return execd(sb, req, res, url, parts.slice(4));
  }

  if (API_KEY) {
    const key = req.headers["open-sandbox-api-key"];
    if (!key) return error(res, 401, "MISSING_API_KEY", "Authentication credentials are missing. Provide API key via OPEN-SANDBOX-API-KEY header.");
    if (key !== API_KEY) return error(res, 401, "INVALID_API_KEY", "Authentication credentials are invalid. Check your API key and try again.");
  }
  return lifecycle(req, res, url, parts);
}

const server = http.createServer((req, res) => {
  handle(req, res).catch((e) => {
    log(`${req.method} ${req.url}: ${e.stack ?? e}`);
    if (!res.headersSent) error(res, 500, "SANDBOX::UNKNOWN_ERROR", e.message);
    else res.destroy();
  });
});
server.keepAliveTimeout = 5000;

function shutdown() {
  for (const sb of [...sandboxes.values()]) removeSandbox(sb, "server_shutdown");
  server.close();
  if (ownRoot) fs.rmSync(ROOT, { recursive: true, force: true });
  process.exit(0);
}
process.on("SIGTERM", shutdown);
process.on("SIGINT", shutdown);

server.listen(opts.port, opts.host, () => {
  process.stdout.write(`listening http://${opts.host}:${server.address().port}\n`);
});
