// The EPP/1 methods of the OpenSandbox provider (docs/epp-1.md §6), on top of the lifecycle API
// and execd (lib/opensandbox.mjs). The wire (framing, dispatch, cancellation) is in
// ../provider.mjs.
//
// What the plugin keeps in ABX_DATA_DIR/sandboxes.json, per sandbox it created: the template
// it was asked for, the create-time env and metadata as given (OpenSandbox's own metadata
// must be Kubernetes label values, so only label-safe pairs are also sent to the server), and
// the lifetime abx reported. OpenSandbox lifetimes have a minimum of 60 s and can only be
// extended (renew-expiration takes an absolute time later than the current one), so the
// server is asked for at least the lifetime abx reports and the plugin itself deletes the
// sandbox when abx's lifetime ends (a timer while the plugin runs, and a check on every call).

import { randomBytes } from "node:crypto";
import * as fs from "node:fs";
import * as fsp from "node:fs/promises";
import * as path from "node:path";
import { imageFor, parseConfig } from "./config.mjs";
import {
  Cancelled,
  HttpError,
  NetworkError,
  RpcError,
  authError,
  fileError,
  fileErrorOfText,
  imageMissing,
  invalidParams,
  looksLikeImageError,
  pathError,
  sandboxNotFound,
  notRunning,
  sharedExecd,
  unreachable,
  isDestinationExists,
  workingDirError,
  workingDirProblem,
} from "./errors.mjs";
import { exitOf, lineText, signalOfTraceback } from "./events.mjs";
import { EXECD_PORT, Execd, Lifecycle, waitForState } from "./opensandbox.mjs";
import { WORKSPACE, baseName, joinPath, parentOf, sandboxPath } from "./paths.mjs";
import {
  EXEC_ROOT,
  MARK_ERROR,
  MARK_NOCMD,
  MARK_PID,
  MARK_SIGNAL,
  SYSTEM_INFO_SCRIPT,
  appendScript,
  killPidScript,
  killScript,
  parseSignal,
  replaceScript,
  signalNumber,
  wrapperScript,
} from "./shell.mjs";

export const PROVIDER = { id: "opensandbox", name: "OpenSandbox (OpenSandbox 开源沙箱)", version: "0.1.0" };
export const FEATURES = [
  "sandbox.lifecycle",
  "sandbox.timeout",
  "sandbox.pause",
  "exec.run",
  "exec.stream",
  "process.manage",
  "files.rw",
  "ports.url",
  "sessions",
];

const MAX_TIMEOUT = 2592000;
const DEFAULT_TIMEOUT = 300;
const SERVER_MIN_TIMEOUT = 60;
const MAX_CHUNK = 4 * 1024 * 1024;
const DEFAULT_MAX_OUTPUT = 16 * 1024 * 1024;
const GONE_STATES = new Set(["Stopping", "Terminated"]);
const EXEC_KEEP_MS = 60000; // an exited exec answers E3005 (not E3002) this long
const TOMBSTONE_MS = 24 * 3600 * 1000; // how long an expired sandbox's id is remembered
// The id of the sandbox an execd belongs to, written when the plugin creates a sandbox: a
// server that gives several sandboxes one execd (docker network_mode = "host") shows there.
const OWNER_FILE = `${EXEC_ROOT}/sandbox`;

// ---------------------------------------------------------------------------------------------
// Small helpers

const rfc3339 = (ms) => new Date(Math.floor(ms / 1000) * 1000).toISOString().replace(".000Z", "Z");
const wholeSecond = (ms) => Math.floor(ms / 1000) * 1000;
const newId = (prefix) => `${prefix}-${randomBytes(6).toString("hex")}`;
const isObj = (v) => v != null && typeof v === "object" && !Array.isArray(v);

function parseTime(s) {
  if (typeof s !== "string" || !s) return null;
  const t = Date.parse(s);
  return Number.isNaN(t) ? null : t;
}

function parseTimeout(v) {
  if (typeof v !== "number" || Number.isNaN(v)) throw new RpcError(2004, `Invalid timeout ${JSON.stringify(v)}: not a number`);
  if (v < 1) throw new RpcError(2004, `Invalid timeout ${v}: must be at least 1 second`);
  if (v > MAX_TIMEOUT) throw new RpcError(2004, `Invalid timeout ${v}: must be at most 30 days (2592000 s)`);
  return Math.round(v);
}

function strictBase64(s) {
  if (s.length % 4 !== 0 || /[^A-Za-z0-9+/=]/.test(s)) return false;
  const pad = s.indexOf("=");
  return pad === -1 || (pad >= s.length - 2 && /^=+$/.test(s.slice(pad)));
}

function decodeData(data, encoding, what = "data") {
  if (typeof data !== "string") throw new RpcError(4007, `Invalid data: '${what}' must be a string.`);
  if (encoding == null || encoding === "utf-8" || encoding === "utf8") return Buffer.from(data, "utf8");
  if (encoding === "base64") {
    if (!strictBase64(data)) throw new RpcError(4007, "Invalid data: invalid base64.");
    return Buffer.from(data, "base64");
  }
  throw new RpcError(4007, `Invalid data: unknown encoding '${encoding}'.`);
}

const strictUtf8 = new TextDecoder("utf-8", { fatal: true });
function tryUtf8(buf) {
  try {
    return strictUtf8.decode(buf);
  } catch {
    return null;
  }
}

// {text, used}: buf as UTF-8 without an incomplete trailing character (unless final); null when
// the bytes are not UTF-8.
export function utf8Prefix(buf, final) {
  const whole = tryUtf8(buf);
  if (whole !== null) return { text: whole, used: buf.length };
  if (final) return null;
  for (let i = buf.length - 1; i >= Math.max(0, buf.length - 3); i--) {
    const b = buf[i];
    if ((b & 0xc0) === 0x80) continue;
    const need = b >= 0xf0 ? 4 : b >= 0xe0 ? 3 : b >= 0xc0 ? 2 : 1;
    if (i > 0 && buf.length - i < need) {
      const text = tryUtf8(buf.subarray(0, i));
      if (text !== null) return { text, used: i };
    }
    return null;
  }
  return null;
}

function strDict(v, method, name, { keys = null } = {}) {
  if (v == null) return {};
  if (!isObj(v)) throw invalidParams(method, `'${name}' must be an object`);
  const out = {};
  for (const [k, val] of Object.entries(v)) {
    if (val == null) continue;
    if (keys && !keys.test(k)) throw invalidParams(method, `'${name}' has an invalid name '${k}'`);
    out[k] = typeof val === "string" ? val : JSON.stringify(val);
  }
  return out;
}

function sandboxParam(p, method) {
  const id = p.sandbox;
  if (typeof id !== "string" || !id) throw invalidParams(method, "missing field `sandbox`");
  return id;
}

// OpenSandbox metadata is validated as Kubernetes labels: pass only pairs that are.
const LABEL_NAME = /^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$/;
const LABEL_VALUE = /^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$/;
export function labelSafe(metadata) {
  const out = {};
  for (const [k, v] of Object.entries(metadata ?? {})) {
    if (typeof v !== "string") continue;
    if (k.length > 63 || !LABEL_NAME.test(k) || k.startsWith("opensandbox.io")) continue;
    if (v.length > 63 || !LABEL_VALUE.test(v)) continue;
    out[k] = v;
  }
  return out;
}

function statusOf(state) {
  switch (state) {
    case "Running":
      return "running";
    case "Paused":
      return "paused";
    default:
      return typeof state === "string" && state ? state.toLowerCase() : "unknown";
  }
}

const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

// Entry (docs/epp-1.md §6.5) from an execd FileInfo (path, size, mode as octal digits,
// modified_at, and in newer execd versions type).
function entryOf(info, p, type) {
  const modeDigits = info.mode == null ? null : String(info.mode);
  const mode = modeDigits && /^[0-7]{1,4}$/.test(modeDigits) ? modeDigits.padStart(4, "0") : null;
  const t = parseTime(info.modified_at ?? info.modifiedAt ?? info.mtime);
  return {
    name: baseName(p),
    path: p,
    type,
    size: typeof info.size === "number" ? info.size : Number(info.size ?? 0),
    mode: mode ?? "0644",
    modifiedAt: t == null ? null : rfc3339(t),
  };
}

function typeOf(info) {
  const t = info.type ?? info.file_type ?? info.fileType ?? info.kind;
  if (typeof t === "string") {
    const l = t.toLowerCase();
    if (l.startsWith("dir")) return "directory";
    if (l.startsWith("file") || l === "regular") return "file";
    if (l.includes("link")) return "symlink";
    return "other";
  }
  if (info.is_dir === true || info.isDir === true || info.is_directory === true) return "directory";
  if (info.is_dir === false || info.isDir === false) return "file";
  return null; // unknown: the caller finds out
}

// ---------------------------------------------------------------------------------------------

export class OpenSandboxProvider {
  constructor({ notify, log }) {
    this.notify = notify;
    this.log = log;
    this.cfg = null;
    this.life = null;
    this.dataDir = null;
    this.records = new Map(); // id -> record (sandboxes this plugin created or set a lifetime on)
    this.timers = new Map(); // id -> reaper timer
    this.endpoints = new Map(); // id -> Promise<Execd>
    this.endpointUrls = new Map(); // id -> its execd endpoint (to see sandboxes that share one execd)
    this.execs = new Map(); // execId -> Exec
    this.tombstones = new Map(); // id -> when abx's lifetime of it ended (E2009 from then on)
    this.killing = new Set(); // ids whose sandbox/kill (DELETE) is in progress: E2009 already
    this.saving = Promise.resolve();
    // sandbox/changed (docs/epp-1.md §7.5): the server's list is polled while the plugin runs
    // (EPP/1 does not tell a plugin whether anyone is subscribed), and what changed there
    // without the broker is reported. `known`: id -> last stable state seen (Running, Paused,
    // or the first state seen), and what the broker's own calls made; the first poll only
    // learns what is there (`baselined` after it). `busy`: ids with a call of the broker in
    // flight that changes them (create, kill, pause, resume), `touched`: when such a call
    // last ended: a poll that started before then does not judge that id.
    this.known = new Map();
    this.baselined = false;
    this.serverExpiry = new Map(); // id -> the server's own expiry of it (ms), from the last poll
    this.busy = new Map();
    this.touched = new Map();
    this.creating = 0;
    this.lastCreateEnd = 0;
    this.pollTimer = null;
    this.polling = false;
    this.pollFailed = false;
    this.stopped = false;
  }

  // -------------------------------------------------------------------------------------------
  // Setup and state

  async initialize(params) {
    this.cfg = parseConfig(params.config ?? {});
    this.life = new Lifecycle(this.cfg);
    this.dataDir = params.dataDir || process.env.ABX_DATA_DIR || null;
    await this.load();
    this.schedulePoll(0);
    return { protocol: "EPP/1", provider: PROVIDER, features: FEATURES };
  }

  // -------------------------------------------------------------------------------------------
  // sandbox/changed

  changed(id, change, sandboxInfo = null) {
    const params = { sandbox: id, change };
    if (sandboxInfo) params.sandboxInfo = sandboxInfo;
    this.notify("sandbox/changed", params);
  }

  schedulePoll(ms = this.cfg?.pollIntervalMs) {
    clearTimeout(this.pollTimer);
    this.pollTimer = null;
    if (this.stopped || !this.cfg?.pollIntervalMs) return;
    this.pollTimer = setTimeout(() => {
      this.poll()
        .catch((e) => {
          if (!this.pollFailed) this.log(`polling ${this.cfg.api} for sandbox changes failed: ${e.message} (logged once until it works again)`);
          this.pollFailed = true;
        })
        .finally(() => this.schedulePoll());
    }, ms);
    this.pollTimer.unref?.();
  }

  // Run a call of the broker that changes sandbox `id` (its change is the broker's to report):
  // the poller does not judge `id` meanwhile, nor with a list it fetched before the end.
  async own(id, fn) {
    this.busy.set(id, (this.busy.get(id) ?? 0) + 1);
    try {
      return await fn();
    } finally {
      const n = this.busy.get(id) - 1;
      if (n > 0) this.busy.set(id, n);
      else this.busy.delete(id);
      this.touched.set(id, Date.now());
    }
  }

  // One look at the server's list: report what changed since the last one without the broker.
  async poll() {
    if (this.polling) return;
    this.polling = true;
    try {
      const t0 = Date.now();
      const creatingAtStart = this.creating > 0;
      const items = await this.life.list();
      this.pollFailed = false;
      const now = new Map();
      for (const sb of items) {
        if (!sb || typeof sb.id !== "string" || GONE_STATES.has(sb?.status?.state)) continue;
        now.set(sb.id, sb);
        this.serverExpiry.set(sb.id, parseTime(sb.expiresAt));
      }
      const first = !this.baselined;
      const known = this.known;
      const judged = (id) => !this.busy.has(id) && !this.killing.has(id) && !this.tombstones.has(id) && !((this.touched.get(id) ?? 0) >= t0);
      // A create of the broker may be between the server making the sandbox and the plugin
      // learning its id: an unknown id is judged on the next poll then.
      const createRace = creatingAtStart || this.creating > 0 || this.lastCreateEnd >= t0;
      for (const [id, sb] of now) {
        const state = sb?.status?.state ?? "Unknown";
        const before = known.get(id);
        if (!judged(id)) continue;
        if (before === undefined) {
          if (createRace && !first) continue;
          known.set(id, state);
          if (!first) this.changed(id, "created", this.view(id, sb, this.records.get(id) ?? null));
          continue;
        }
        if (state === "Paused" && before !== "Paused") {
          known.set(id, state);
          this.syncRecordPaused(id, true);
          this.changed(id, "paused", this.view(id, sb, this.records.get(id) ?? null));
        } else if (state === "Running" && before !== "Running") {
          known.set(id, state);
          if (before === "Paused") {
            this.syncRecordPaused(id, false);
            this.endpoints.delete(id);
            this.changed(id, "resumed", this.view(id, sb, this.records.get(id) ?? null));
          }
        } else if (state === "Running" || state === "Paused") {
          known.set(id, state);
        }
      }
      for (const id of [...known.keys()]) {
        if (now.has(id)) continue;
        if (this.busy.has(id) || this.killing.has(id) || (this.touched.get(id) ?? 0) >= t0) continue;
        known.delete(id);
        if (this.tombstones.has(id) || first) continue; // expired: reported by reap()
        // Deleted on the server by someone else, or expired there (its own lifetime).
        const exp = this.serverExpiry.get(id);
        this.serverExpiry.delete(id);
        this.forget(id);
        this.changed(id, exp != null && Date.now() >= exp - 1000 ? "expired" : "killed");
      }
      this.baselined = true;
      for (const [id, t] of this.touched) if (t < t0 - 60000) this.touched.delete(id);
    } finally {
      this.polling = false;
    }
  }

  syncRecordPaused(id, paused) {
    const rec = this.records.get(id);
    if (rec && rec.paused !== paused) {
      rec.paused = paused;
      this.save();
    }
  }

  get stateFile() {
    return this.dataDir ? path.join(this.dataDir, "sandboxes.json") : null;
  }

  async load() {
    const file = this.stateFile;
    if (!file) return;
    let doc = null;
    try {
      doc = JSON.parse(await fsp.readFile(file, "utf8"));
    } catch (e) {
      if (e.code !== "ENOENT") this.log(`cannot read ${file}: ${e.message}; starting without records`);
    }
    for (const rec of Object.values(doc?.sandboxes ?? {})) {
      if (rec && typeof rec.id === "string" && typeof rec.expiresAt === "number") this.records.set(rec.id, rec);
    }
    for (const [id, at] of Object.entries(doc?.tombstones ?? {})) {
      if (typeof at === "number" && Date.now() - at < TOMBSTONE_MS) this.tombstones.set(id, at);
    }
    for (const rec of this.records.values()) this.arm(rec);
  }

  save() {
    const file = this.stateFile;
    if (!file) return Promise.resolve();
    for (const [id, at] of this.tombstones) if (Date.now() - at >= TOMBSTONE_MS) this.tombstones.delete(id);
    const doc = { version: 1, sandboxes: Object.fromEntries(this.records), tombstones: Object.fromEntries(this.tombstones) };
    this.saving = this.saving
      .catch(() => {})
      .then(async () => {
        await fsp.mkdir(path.dirname(file), { recursive: true });
        const tmp = `${file}.${process.pid}.tmp`;
        await fsp.writeFile(tmp, JSON.stringify(doc), { mode: 0o600 });
        await fsp.rename(tmp, file);
      })
      .catch((e) => this.log(`cannot save ${file}: ${e.message}`));
    return this.saving;
  }

  // Schedule the deletion of a sandbox when abx's lifetime ends.
  arm(rec) {
    clearTimeout(this.timers.get(rec.id));
    const left = rec.expiresAt - Date.now();
    const t = setTimeout(() => {
      if (Date.now() >= rec.expiresAt) this.reap(rec.id).catch(() => {});
      else this.arm(rec);
    }, Math.max(0, Math.min(left, 2 ** 31 - 1)));
    t.unref?.();
    this.timers.set(rec.id, t);
  }

  forget(id) {
    clearTimeout(this.timers.get(id));
    this.timers.delete(id);
    this.endpoints.delete(id);
    this.endpointUrls.delete(id);
    const had = this.records.delete(id);
    for (const ex of this.execs.values()) if (ex.sandbox === id) ex.sandboxGone();
    if (had) this.save();
  }

  // The lifetime abx reported has ended: delete the sandbox. Its id answers E2009 from now on,
  // also while the server still shows it (a delete that failed, or is still in progress).
  async reap(id) {
    const first = !this.tombstones.has(id);
    this.tombstones.set(id, Date.now());
    this.forget(id);
    this.save();
    this.known.delete(id);
    // Nobody asked the broker for this: subscribers learn it from the plugin (§7.5).
    if (first) this.changed(id, "expired");
    try {
      await this.life.delete(id);
      this.log(`sandbox ${id} expired and was deleted`);
    } catch (e) {
      this.log(`deleting expired sandbox ${id} failed: ${e.message}`);
    }
  }

  // The record of a sandbox, after enforcing its lifetime (E2009 when it has ended).
  async liveRecord(id) {
    if (this.tombstones.has(id) || this.killing.has(id)) throw sandboxNotFound(id);
    const rec = this.records.get(id);
    if (rec && Date.now() >= rec.expiresAt) {
      this.reap(id).catch(() => {});
      throw sandboxNotFound(id);
    }
    return rec ?? null;
  }

  // GET the sandbox; E2009 when the server does not know it or it is being deleted.
  async fetch(id, signal) {
    if (this.tombstones.has(id) || this.killing.has(id)) throw sandboxNotFound(id);
    let sb;
    try {
      sb = await this.life.get(id, signal);
    } catch (e) {
      if (e instanceof RpcError && e.code === 2009) this.forget(id);
      throw e;
    }
    if (GONE_STATES.has(sb?.status?.state)) {
      this.forget(id);
      throw sandboxNotFound(id);
    }
    return sb;
  }

  view(id, sb, rec) {
    const created = rec?.createdAt ?? parseTime(sb?.createdAt) ?? Date.now();
    const serverExpires = parseTime(sb?.expiresAt);
    const expires = rec?.expiresAt ?? serverExpires;
    let metadata = rec?.metadata;
    if (metadata == null) metadata = isObj(sb?.metadata) ? { ...sb.metadata } : {};
    return {
      id,
      status: statusOf(sb?.status?.state),
      template: rec?.template ?? sb?.image?.uri ?? "",
      url: `epp://opensandbox/${id}`,
      region: "",
      timeout: rec?.timeout ?? (expires != null ? Math.max(0, Math.round((expires - created) / 1000)) : null),
      startedAt: rfc3339(created),
      expiresAt: expires == null ? null : rfc3339(expires),
      metadata,
    };
  }

  // The execd client of a sandbox that can run commands now (E2009 gone, E2002 paused).
  async execd(id, signal) {
    const rec = await this.liveRecord(id);
    if (rec?.paused) {
      const sb = await this.fetch(id, signal);
      if (sb?.status?.state !== "Running") throw notRunning(id, sb);
      rec.paused = false;
      this.save();
    }
    let ep = this.endpoints.get(id);
    if (!ep) {
      ep = this.life.endpoint(id, EXECD_PORT, signal).then(async (e) => {
        await this.checkShared(id, e, signal);
        const execd = new Execd(e.url, e.headers);
        // A sandbox made without abx has no /workspace, which abx's paths and the commands'
        // default working directory are relative to: make it (best effort).
        if (!rec) await this.ensureWorkspace(execd, signal);
        return execd;
      });
      this.endpoints.set(id, ep);
      ep.catch(() => this.endpoints.delete(id));
      ep.catch((e) => {
        if (e instanceof RpcError && e.code === 2009) this.forget(id);
      });
    }
    return ep;
  }

  // Another live sandbox got the same execd endpoint (URL and headers: a gateway may route
  // by header): they share one execd (E8006).
  async checkShared(id, ep, signal) {
    const key = JSON.stringify([ep.url, Object.entries(ep.headers ?? {}).sort()]);
    for (const [other, k] of [...this.endpointUrls]) {
      if (other === id || k !== key) continue;
      if (await this.stillThere(other, signal)) throw sharedExecd(id, other, ep.url);
      this.endpointUrls.delete(other);
    }
    this.endpointUrls.set(id, key);
  }

  // Whether the server still has sandbox `id` (not deleted, not expired).
  async stillThere(id, signal) {
    try {
      await this.fetch(id, signal);
      return true;
    } catch (e) {
      if (e instanceof RpcError && e.code === 2009) return false;
      throw e;
    }
  }

  // The execd of a sandbox the plugin just created must not be another sandbox's: through the
  // server's proxy the URLs differ although the execd is shared. Checked with OWNER_FILE.
  async claimExecd(id, execd, signal) {
    let owner = null;
    try {
      owner = (await execd.download(OWNER_FILE, { signal, maxBytes: 256 })).data.toString("utf8").trim();
    } catch (e) {
      if (!(e instanceof HttpError && fileError(e, OWNER_FILE).code === 4001)) throw e;
    }
    if (owner && owner !== id && (await this.stillThere(owner, signal))) throw sharedExecd(id, owner, execd.url);
    await execd.upload([{ path: OWNER_FILE, data: Buffer.from(id), mode: 644 }], signal);
  }

  async ensureWorkspace(execd, signal) {
    try {
      await execd.mkdirs([WORKSPACE], 755, signal, { timeoutMs: 5000 });
      return true;
    } catch (e) {
      if (e instanceof Cancelled) throw e;
      this.log(`cannot create ${WORKSPACE} at ${execd.url}: ${e.message}`);
      return false;
    }
  }

  // POST /command. A missing default working directory (/workspace removed, or never made)
  // is made and the command sent again; a missing working directory that was asked for is
  // E3003. execd refuses those before it starts anything, so sending again is safe.
  async startCommand(execd, spec, body, opts) {
    try {
      return await execd.command(body, opts);
    } catch (e) {
      const problem = workingDirProblem(e);
      if (!problem) throw e;
      if (spec.cwdDefaulted && problem === "missing") {
        if (await this.ensureWorkspace(execd, opts.signal)) return execd.command(body, opts);
        return execd.command({ ...body, cwd: undefined }, opts); // execd's own directory then
      }
      throw workingDirError(problem, spec.cwd, e);
    }
  }

  // Rename `src` to `dest`, replacing `dest` when it is an existing non-directory (atomic:
  // rename(2) through the shell, as execd's /files/mv refuses an existing destination).
  async moveOver(execd, src, dest, destExists, signal) {
    if (!destExists) {
      try {
        await execd.move(src, dest, signal);
        return;
      } catch (e) {
        if (!isDestinationExists(e)) throw e; // made meanwhile: replace it
      }
    }
    const r = await this.script(execd, replaceScript(src, dest), { signal });
    if (r.code !== 0) {
      const text = `${r.stderr}${r.stdout}`.trim();
      throw fileErrorOfText(text, dest) ?? new RpcError(9001, `Could not replace '${dest}': ${text || `exit ${r.code}`}`);
    }
  }

  // Why a call to execd failed: the sandbox is gone (E2009), paused or not running yet (E2002),
  // or execd itself cannot be reached (E8006, with the proxy hint).
  async diagnose(id, err, execd) {
    if (err instanceof RpcError || err instanceof Cancelled) return err;
    this.endpoints.delete(id);
    let sb;
    try {
      sb = await this.fetch(id);
    } catch (e) {
      return e;
    }
    const state = sb?.status?.state;
    if (state && state !== "Running") return notRunning(id, sb);
    const where = execd?.url ?? "its endpoint";
    // Unreachable the same way in both modes (E8006): directly, the connection fails; through
    // the server's proxy (use_server_proxy), the proxy answers HTTP 502 BACKEND_CONNECTION_FAILED
    // (or another gateway error) because it could not connect to execd.
    const viaProxy = err instanceof HttpError && err.status >= 502 && err.status <= 504;
    if (err instanceof NetworkError || viaProxy) {
      const why = viaProxy ? `the server's proxy answered HTTP ${err.status}${err.serverCode ? ` ${err.serverCode}` : ""}${err.serverMessage ? ` (${err.serverMessage})` : ""}` : err.message;
      return new RpcError(
        8006,
        `execd of sandbox '${id}' at ${where} is unreachable: ${why}.`,
        this.cfg.useServerProxy
          ? `The OpenSandbox server could not connect to the sandbox's execd: retry in a moment (right after a create or resume it may still be starting); if it persists, check the sandbox (abx info ${id}) and the server's log, or kill it and create a new one.`
          : "If this machine cannot reach sandbox endpoints directly, route through the server: abx provider configure opensandbox use_server_proxy=true",
      );
    }
    if (err instanceof HttpError) {
      if (err.status === 401 || err.status === 403) {
        return new RpcError(8006, `execd of sandbox '${id}' refused the request (HTTP ${err.status}): ${err.serverMessage ?? ""}`.trim(), "The endpoint's access headers were not accepted; check the server's secure_access setting.");
      }
      return new RpcError(9001, `execd of sandbox '${id}': ${err.message}`, "Check the sandbox with 'abx info <sandbox>'.");
    }
    return new RpcError(9001, `execd of sandbox '${id}': ${err?.message ?? err}`);
  }

  // Run fn(execd) and map its failure: an answer about a file -> E4xxx for path `p`; anything
  // else -> diagnose().
  async onExecd(id, fn, { p = null, signal } = {}) {
    const execd = await this.execd(id, signal);
    try {
      return await fn(execd);
    } catch (e) {
      if (e instanceof RpcError || e instanceof Cancelled) throw e;
      if (p != null && e instanceof HttpError && isFileAnswer(e)) throw fileError(e, p);
      throw await this.diagnose(id, e, execd);
    }
  }

  // A short script in the sandbox (kill, append, systemInfo): its exit code and text output.
  async script(execd, command, { signal } = {}) {
    const out = { stdout: "", stderr: "" };
    const terminal = await execd.command(
      { command },
      {
        signal,
        onEvent: (e) => {
          if (e.type === "stdout" || e.type === "stderr") out[e.type] += lineText(e);
        },
      },
    );
    return { ...exitOf(terminal), ...out };
  }

  // -------------------------------------------------------------------------------------------
  // Sandboxes

  async create(p, ctx) {
    this.creating++;
    try {
      const view = await this.createSandbox(p, ctx);
      this.known.set(view.id, "Running"); // the broker reports this one
      this.touched.set(view.id, Date.now());
      return view;
    } finally {
      this.creating--;
      this.lastCreateEnd = Date.now();
    }
  }

  async createSandbox(p, ctx) {
    const timeout = p.timeout == null ? DEFAULT_TIMEOUT : parseTimeout(p.timeout);
    const env = strDict(p.env, "sandbox/create", "env");
    if (p.metadata != null && !isObj(p.metadata)) throw invalidParams("sandbox/create", "'metadata' must be an object");
    const metadata = p.metadata ?? {};
    if (p.template != null && typeof p.template !== "string") throw invalidParams("sandbox/create", "'template' must be a string");
    const template = p.template || null;
    const image = imageFor(this.cfg, template);
    const cfg = this.cfg;

    const body = {
      image: { uri: image },
      entrypoint: cfg.entrypoint,
      timeout: Math.max(SERVER_MIN_TIMEOUT, timeout),
      resourceLimits: {},
      env,
      metadata: labelSafe(metadata),
    };
    if (cfg.registry) body.image.auth = { username: cfg.registry.username, password: cfg.registry.password };
    if (cfg.networkPolicy) body.networkPolicy = cfg.networkPolicy;
    if (cfg.platform) body.platform = cfg.platform;
    if (cfg.secureAccess) body.secureAccess = true;

    const started = Date.now();
    let r;
    try {
      r = await this.life.create(body, { timeoutMs: cfg.readyTimeoutMs, signal: ctx.abort.signal });
    } catch (e) {
      throw this.createError(e, image, timeout);
    }
    const created = r.json ?? {};
    const id = created.id;
    if (typeof id !== "string" || !id) throw new RpcError(2001, `Could not create the sandbox: the server answered HTTP ${r.status} without an id.`);

    // From here on a failure must not leave the sandbox behind.
    const discard = () => this.life.delete(id).catch(() => {});
    let sb = created;
    try {
      if (created?.status?.state !== "Running") {
        const left = Math.max(1000, cfg.readyTimeoutMs - (Date.now() - started));
        sb = await waitForState(() => this.life.get(id, ctx.abort.signal), ["Running"], {
          fail: ["Failed", "Terminated", "Stopping"],
          timeoutMs: left,
          signal: ctx.abort.signal,
          onFail: (s) => this.failedSandbox(s, image),
        });
      }
      const expiresAt = wholeSecond(started + timeout * 1000);
      const rec = {
        id,
        template: template ?? image,
        image,
        timeout,
        createdAt: parseTime(created.createdAt) ?? started,
        expiresAt,
        env,
        metadata,
        paused: false,
      };
      this.records.set(id, rec);
      await this.save();
      this.arm(rec);
      await this.prepare(id, ctx);
      return this.view(id, sb, rec);
    } catch (e) {
      this.forget(id);
      await discard();
      if (e instanceof RpcError && e.code === 3001) {
        throw new RpcError(2001, `Could not create the sandbox: it did not start within ${cfg.readyTimeoutMs / 1000} s (state ${e.lastState}).`, "Raise ready_timeout (abx provider configure opensandbox ready_timeout=300) if the image is large, or check the server's log.");
      }
      throw e;
    }
  }

  createError(e, image, timeout) {
    if (e instanceof Cancelled || e instanceof RpcError) return e;
    if (e instanceof NetworkError) return e.timeout ? new RpcError(2001, `Could not create the sandbox: the server did not answer within ${this.cfg.readyTimeoutMs / 1000} s.`, "Raise ready_timeout if image pulls take long.") : unreachable(this.cfg.api, e);
    if (e instanceof HttpError) {
      if (e.status === 401) return authError(this.cfg.api, e);
      if (e.status === 403) return new RpcError(8006, `The OpenSandbox server refused to create a sandbox (HTTP 403${e.serverCode ? ` ${e.serverCode}` : ""}).`, "Check the API key's permissions.");
      if (looksLikeImageError(e.serverCode, e.serverMessage)) return imageMissing(image, e.serverMessage || e.serverCode);
      if ((e.status === 400 || e.status === 422) && /timeout|expir/i.test(`${e.serverCode} ${e.serverMessage}`)) {
        return new RpcError(2004, `Invalid timeout ${timeout}: the OpenSandbox server refused it (${e.serverMessage ?? e.serverCode}).`, "Ask for a shorter lifetime: the server has a maximum (server.max_sandbox_timeout_seconds).");
      }
      return new RpcError(2001, `Could not create the sandbox: HTTP ${e.status}${e.serverCode ? ` ${e.serverCode}` : ""}${e.serverMessage ? `: ${e.serverMessage}` : ""}`);
    }
    return new RpcError(2001, `Could not create the sandbox: ${e?.message ?? e}`);
  }

  failedSandbox(sb, image) {
    const st = sb?.status ?? {};
    const why = [st.reason, st.message].filter(Boolean).join(": ");
    if (looksLikeImageError(st.reason, st.message)) return imageMissing(image, why);
    return new RpcError(2001, `Could not create the sandbox: it went to state ${st.state ?? "?"}${why ? ` (${why})` : ""}.`);
  }

  // Make /workspace (the working directory of commands) once execd answers.
  async prepare(id, ctx) {
    const deadline = Date.now() + Math.min(30000, this.cfg.readyTimeoutMs);
    let last;
    for (let i = 0; ; i++) {
      try {
        const execd = await this.execd(id, ctx.abort.signal);
        try {
          await execd.mkdirs([WORKSPACE], 755, ctx.abort.signal);
        } catch (e) {
          // execd answered but would not make it: try the shell.
          if (!(e instanceof HttpError)) throw e;
          const r = await this.script(execd, `mkdir -p ${WORKSPACE}`, { signal: ctx.abort.signal });
          if (r.code !== 0) throw e;
        }
        await this.claimExecd(id, execd, ctx.abort.signal);
        return;
      } catch (e) {
        if (e instanceof Cancelled || (e instanceof RpcError && e.code !== 9001)) throw e;
        last = e;
        this.endpoints.delete(id);
        if (Date.now() > deadline) break;
        await new Promise((r) => setTimeout(r, Math.min(200 * (i + 1), 1000)));
      }
    }
    const err = await this.diagnose(id, last);
    throw new RpcError(2001, `Could not create the sandbox: its execd does not answer (${err.message})`, err.suggestion);
  }

  async info(p, ctx) {
    const id = sandboxParam(p, "sandbox/info");
    const rec = await this.liveRecord(id);
    const sb = await this.fetch(id, ctx.abort.signal);
    if (rec) this.syncPaused(rec, sb);
    return this.view(id, sb, rec);
  }

  syncPaused(rec, sb) {
    const paused = ["Paused", "Pausing"].includes(sb?.status?.state);
    if (rec.paused !== paused) {
      rec.paused = paused;
      this.save();
    }
  }

  async list(p, ctx) {
    const items = await this.life.list(ctx.abort.signal);
    const seen = new Set();
    const out = [];
    for (const sb of items) {
      if (!sb || typeof sb.id !== "string") continue;
      seen.add(sb.id);
      if (GONE_STATES.has(sb?.status?.state) || this.tombstones.has(sb.id) || this.killing.has(sb.id)) continue;
      const rec = this.records.get(sb.id) ?? null;
      if (rec && Date.now() >= rec.expiresAt) {
        this.reap(sb.id).catch(() => {});
        continue;
      }
      out.push(this.view(sb.id, sb, rec));
    }
    // Records of sandboxes the server no longer has: gone (expired there, or deleted elsewhere).
    for (const id of [...this.records.keys()]) if (!seen.has(id)) this.forget(id);
    return { sandboxes: out };
  }

  async kill(p, ctx) {
    const id = sandboxParam(p, "sandbox/kill");
    const rec = this.records.get(id);
    if (this.tombstones.has(id) || (rec && Date.now() >= rec.expiresAt)) {
      await this.reap(id); // deletes it again, should it still be there
      return { killed: false };
    }
    if (this.killing.has(id)) return { killed: false }; // another kill of it is under way
    // While the DELETE runs, the real server already cuts the sandbox's execd streams and shows
    // it as Failed: its running commands end as killed (137, SIGKILL) and every other call
    // answers E2009, as after the delete.
    this.killing.add(id);
    for (const ex of this.execs.values()) if (ex.sandbox === id) ex.sandboxKilled = true;
    let killed;
    try {
      killed = await this.own(id, () => this.life.delete(id, ctx.abort.signal));
    } catch (e) {
      if (e instanceof RpcError && e.code === 2009) killed = false;
      else if (e instanceof RpcError && /HTTP 409/.test(e.message)) killed = false;
      else {
        this.killing.delete(id);
        for (const ex of this.execs.values()) if (ex.sandbox === id) ex.sandboxKilled = false;
        throw e;
      }
    }
    this.known.delete(id);
    this.forget(id);
    this.killing.delete(id);
    return { killed };
  }

  async setTimeout(p, ctx) {
    const id = sandboxParam(p, "sandbox/setTimeout");
    const timeout = parseTimeout(p.timeout);
    let rec = await this.liveRecord(id);
    let sb = await this.fetch(id, ctx.abort.signal);
    const wanted = wholeSecond(Date.now() + timeout * 1000);
    const serverExpires = parseTime(sb.expiresAt);
    // The server only extends: ask it when abx's lifetime goes beyond the server's.
    if (serverExpires != null && wanted > serverExpires) {
      try {
        const r = await this.life.renew(id, rfc3339(wanted), ctx.abort.signal);
        if (r?.expiresAt) sb = { ...sb, expiresAt: r.expiresAt };
      } catch (e) {
        if (!(e instanceof RpcError) || e.code === 2009 || e.code === 8006) throw e;
        throw new RpcError(2004, `Invalid timeout ${timeout}: the OpenSandbox server refused the new expiration (${e.message}).`, "The server has a maximum lifetime (server.max_sandbox_timeout_seconds); ask for less.");
      }
    }
    if (!rec) {
      rec = {
        id,
        template: sb?.image?.uri ?? "",
        image: sb?.image?.uri ?? "",
        createdAt: parseTime(sb.createdAt) ?? Date.now(),
        env: {},
        metadata: isObj(sb.metadata) ? { ...sb.metadata } : {},
        paused: sb?.status?.state === "Paused",
      };
      this.records.set(id, rec);
    }
    rec.timeout = timeout;
    rec.expiresAt = wanted;
    await this.save();
    this.arm(rec);
    return this.view(id, sb, rec);
  }

  async pause(p, ctx) {
    const id = sandboxParam(p, "sandbox/pause");
    const rec = await this.liveRecord(id);
    const sb = await this.own(id, async () => {
      await this.life.pause(id, ctx.abort.signal); // 409: not running (already paused, or moving)
      const s = await waitForState(() => this.fetch(id, ctx.abort.signal), ["Paused"], {
        fail: ["Failed"],
        timeoutMs: 120000,
        signal: ctx.abort.signal,
        onFail: (x) => notRunning(id, x),
      });
      this.known.set(id, "Paused");
      return s;
    });
    if (rec) {
      rec.paused = true;
      await this.save();
    }
    return this.view(id, sb, rec);
  }

  async resume(p, ctx) {
    const id = sandboxParam(p, "sandbox/resume");
    const rec = await this.liveRecord(id);
    const sb = await this.own(id, async () => {
      await this.life.resume(id, ctx.abort.signal);
      const s = await waitForState(() => this.fetch(id, ctx.abort.signal), ["Running"], {
        fail: ["Failed"],
        timeoutMs: 120000,
        signal: ctx.abort.signal,
        onFail: (x) => notRunning(id, x),
      });
      this.known.set(id, "Running");
      return s;
    });
    this.endpoints.delete(id);
    if (rec) {
      rec.paused = false;
      await this.save();
    }
    return this.view(id, sb, rec);
  }

  async systemInfo(p, ctx) {
    const id = sandboxParam(p, "sandbox/systemInfo");
    return this.onExecd(
      id,
      async (execd) => {
        const [r, metrics] = await Promise.all([
          this.script(execd, SYSTEM_INFO_SCRIPT, { signal: ctx.abort.signal }),
          execd.metrics(ctx.abort.signal).catch(() => ({})),
        ]);
        const kv = {};
        for (const line of r.stdout.split("\n")) {
          const i = line.indexOf("=");
          if (i > 0) kv[line.slice(0, i)] = line.slice(i + 1).trim();
        }
        const num = (v) => (v == null || v === "" || Number.isNaN(Number(v)) ? null : Number(v));
        const [diskTotal, diskFree] = (kv.disk ?? "").split(" ").map(num);
        const gb = (kb) => (kb == null ? null : Math.round((kb / 1024 / 1024) * 100) / 100);
        return {
          os: kv.os || "Linux",
          arch: kv.arch || null,
          hostname: kv.hostname || null,
          kernel: kv.kernel || null,
          distro: kv.distro || null,
          cpuCount: num(kv.cpus) ?? num(metrics.cpu_count),
          memoryTotalMb: num(kv.mem) != null ? Math.round(num(kv.mem) / 1024) : num(metrics.mem_total_mib),
          diskTotalGb: gb(diskTotal),
          diskFreeGb: gb(diskFree),
          isolation: { model: "container", backend: "opensandbox" },
        };
      },
      { signal: ctx.abort.signal },
    );
  }

  async portUrl(p, ctx) {
    const id = sandboxParam(p, "ports/url");
    const port = p.port;
    if (!Number.isInteger(port) || port < 1 || port > 65535) {
      throw new RpcError(5002, `Invalid port ${JSON.stringify(port)}.`);
    }
    await this.liveRecord(id);
    const ep = await this.life.endpoint(id, port, ctx.abort.signal);
    return { url: ep.url, headers: ep.headers };
  }

  // -------------------------------------------------------------------------------------------
  // Commands

  execSpec(p, method) {
    const hasCmd = p.command != null;
    const hasArgv = p.argv != null;
    if (hasCmd === hasArgv) throw invalidParams(method, "give exactly one of `command` (a shell string) or `argv` (an array)");
    let command = null;
    let argv = null;
    if (hasCmd) {
      if (typeof p.command !== "string") throw invalidParams(method, "`command` must be a string");
      if (p.command.includes("\0")) throw invalidParams(method, "`command` contains a NUL byte");
      command = p.command;
    } else {
      if (!Array.isArray(p.argv) || p.argv.length === 0 || p.argv.some((a) => typeof a !== "string" || a.includes("\0"))) {
        throw invalidParams(method, "`argv` must be a non-empty array of strings");
      }
      argv = p.argv;
    }
    const cwd = p.cwd == null ? WORKSPACE : sandboxPath(p.cwd, method, "cwd");
    const env = strDict(p.env, method, "env", { keys: ENV_NAME });
    let timeout = null;
    if (p.timeout != null) {
      if (typeof p.timeout !== "number" || !(p.timeout > 0)) throw invalidParams(method, "`timeout` must be a positive number of seconds");
      timeout = p.timeout;
    }
    let stdin = null;
    if (p.stdin != null) stdin = decodeData(p.stdin, p.stdinEncoding, "stdin");
    let maxOutput = DEFAULT_MAX_OUTPUT;
    if (p.maxOutput != null) {
      if (!Number.isInteger(p.maxOutput) || p.maxOutput < 0) throw invalidParams(method, "`maxOutput` must be a non-negative integer");
      maxOutput = p.maxOutput;
    }
    const display = command ?? argv.join(" ");
    return { command, argv, cwd, cwdDefaulted: p.cwd == null, env, timeout, stdin, maxOutput, display };
  }

  envsFor(id, env) {
    return { ...(this.records.get(id)?.env ?? {}), ...env };
  }

  async execRun(p, ctx) {
    const id = sandboxParam(p, "exec/run");
    const spec = this.execSpec(p, "exec/run");
    const execd = await this.execd(id, ctx.abort.signal);
    const ex = new Exec(this, { id: newId("r"), sandbox: id, execd, display: spec.display, stream: false });
    const dir = `${EXEC_ROOT}/${ex.id}`;
    ex.dir = dir;
    const t0 = Date.now();
    try {
      if (spec.stdin) {
        await this.onExecd(id, (e) => e.upload([{ path: `${dir}/in`, data: spec.stdin, mode: 600 }]), { signal: ctx.abort.signal });
      }
      const script = wrapperScript({
        dir,
        command: spec.command,
        argv: spec.argv,
        mode: "capture",
        stdin: spec.stdin ? "file" : "null",
        env: this.envsFor(id, spec.env),
        watchdog: spec.timeout != null ? spec.timeout + 5 : null,
      });
      this.execs.set(ex.id, ex);
      let timer = null;
      if (spec.timeout != null) {
        timer = setTimeout(() => {
          ex.timedOut = true;
          ex.kill({ name: "KILL", number: 9 }).catch((e) => this.log(`timeout kill of ${ex.id} failed: ${e.message}`));
        }, spec.timeout * 1000);
      }
      let giveUp = null;
      const onAbort = () => {
        ex.cancelled = true;
        ex.kill({ name: "KILL", number: 9 }).catch(() => {});
        // The kill ends the stream; should it not arrive, stop waiting anyway.
        giveUp = setTimeout(() => ex.streamAbort.abort(), 5000);
      };
      ctx.abort.signal.addEventListener("abort", onAbort, { once: true });
      let terminal;
      let sandboxKilled = false;
      try {
        terminal = await this.startCommand(
          execd,
          spec,
          { command: script, cwd: spec.cwd, envs: this.envsFor(id, spec.env) },
          { onEvent: (e) => ex.control(e), signal: ex.streamAbort.signal },
        );
      } catch (e) {
        if (e instanceof Cancelled && ex.cancelled) throw e;
        if (ex.gone || ex.sandboxKilled) {
          sandboxKilled = true;
        } else {
          if (e instanceof RpcError) throw e;
          const d = await this.diagnose(id, e, execd);
          if (d.code === 2009 || d.sandboxFailed) sandboxKilled = true;
          else throw d;
        }
      } finally {
        clearTimeout(timer);
        clearTimeout(giveUp);
        ctx.abort.signal.removeEventListener("abort", onAbort);
        ex.exited = true;
        ex.forgetLater();
      }
      if (ex.cancelled) throw new Cancelled();
      if (sandboxKilled) {
        // The sandbox was killed (or failed) while the command ran: it died with it, as a killed
        // process does; its output went with the sandbox.
        if (ex.pid == null) throw sandboxNotFound(id);
        return { exitCode: 137, signal: "SIGKILL", timedOut: ex.timedOut, durationMs: Date.now() - t0, truncated: false, stdout: "", stderr: "" };
      }
      let { code, reason } = exitOf(terminal);
      let killedBy = null;
      if (code != null && code < 0 && ex.pid != null) ({ code, signal: killedBy } = ex.wrapperKilled(terminal));
      if (ex.nocmd) throw new RpcError(3003, `Could not start the command: ${spec.argv[0]}: not found.`);
      if (ex.pid == null) throw new RpcError(3003, `Could not start the command: ${reason ?? ex.errorText ?? "the command did not start"}.`);
      let out;
      let err;
      try {
        [out, err] = await Promise.all(
          ["out", "err"].map((f) =>
            execd.download(`${dir}/${f}`, { maxBytes: spec.maxOutput, signal: ctx.abort.signal }).catch((e) => {
              if (e instanceof HttpError && e.status === 404 && isFileAnswer(e)) return { data: Buffer.alloc(0), size: 0 };
              throw e;
            }),
          ),
        );
      } catch (e) {
        throw await this.diagnose(id, e, execd);
      }
      const truncated = Boolean(out.truncated || err.truncated || (out.size ?? 0) > out.data.length || (err.size ?? 0) > err.data.length);
      const result = {
        exitCode: code,
        timedOut: ex.timedOut,
        durationMs: Date.now() - t0,
        truncated,
      };
      const signal = killedBy ?? ex.signalFor(code);
      if (signal) result.signal = signal;
      const o = tryUtf8(out.data);
      const e = tryUtf8(err.data);
      if (o !== null && e !== null) {
        result.stdout = o;
        result.stderr = e;
      } else {
        result.stdout = out.data.toString("base64");
        result.stderr = err.data.toString("base64");
        result.encoding = "base64";
      }
      return result;
    } finally {
      execd.removeDir(dir).catch(() => {});
    }
  }

  async execStart(p, ctx) {
    const id = sandboxParam(p, "exec/start");
    if (p.pty != null) throw invalidParams("exec/start", "this provider has no pty");
    const spec = this.execSpec(p, "exec/start");
    const execd = await this.execd(id, ctx.abort.signal);
    const ex = new Exec(this, { id: newId("x"), sandbox: id, execd, display: spec.display, stream: true });
    ex.dir = `${EXEC_ROOT}/${ex.id}`;
    const script = wrapperScript({
      dir: ex.dir,
      command: spec.command,
      argv: spec.argv,
      mode: "stream",
      env: this.envsFor(id, spec.env),
      watchdog: spec.timeout != null ? spec.timeout + 5 : null,
    });
    this.execs.set(ex.id, ex);
    const done = this.startCommand(
      execd,
      spec,
      { command: script, cwd: spec.cwd, envs: this.envsFor(id, spec.env) },
      { onEvent: (e) => ex.onEvent(e), signal: ex.streamAbort.signal },
    );
    done.then(
      (terminal) => ex.finish(terminal),
      (err) => ex.broken(err),
    );
    const onAbort = () => {
      ex.cancelled = true;
      ex.kill({ name: "KILL", number: 9 }).catch(() => {});
    };
    ctx.abort.signal.addEventListener("abort", onAbort, { once: true });
    try {
      await ex.started; // the pid line, or the end of the stream
    } finally {
      ctx.abort.signal.removeEventListener("abort", onAbort);
    }
    if (ex.cancelled) throw new Cancelled();
    if (ex.pid == null) {
      this.execs.delete(ex.id);
      if (ex.nocmd) throw new RpcError(3003, `Could not start the command: ${spec.argv[0]}: not found.`);
      if (ex.failure) throw await this.diagnose(id, ex.failure, execd);
      throw new RpcError(3003, `Could not start the command: ${ex.startReason ?? "it did not start"}.`);
    }
    if (spec.timeout != null) {
      ex.timer = setTimeout(() => {
        ex.timedOut = true;
        ex.kill({ name: "KILL", number: 9 }).catch((e) => this.log(`timeout kill of ${ex.id} failed: ${e.message}`));
      }, spec.timeout * 1000);
    }
    ctx.afterReply = () => {
      ex.replied = true;
      ex.flush();
      if (spec.stdin) ex.write(spec.stdin, true).catch((e) => this.log(`stdin of ${ex.id}: ${e.message}`));
    };
    return { execId: ex.id, pid: ex.pid };
  }

  getExec(p, method) {
    const xid = p.execId;
    if (typeof xid !== "string" || !xid) throw invalidParams(method, "missing field `execId`");
    const ex = this.execs.get(xid);
    if (!ex || !ex.stream) throw new RpcError(3002, `Exec '${xid}' not found.`);
    return ex;
  }

  async execWrite(p) {
    const ex = this.getExec(p, "exec/write");
    if (ex.exited || ex.eof) throw new RpcError(3005, `Stdin of exec '${ex.id}' is closed.`);
    const data = p.data == null ? Buffer.alloc(0) : decodeData(p.data, p.encoding);
    await ex.write(data, p.eof === true);
    return {};
  }

  async execKill(p) {
    const ex = this.getExec(p, "exec/kill");
    const sig = parseSignal(p.signal, "exec/kill");
    if (ex.exited) return {};
    await ex.kill(sig);
    return {};
  }

  async execAttach(p) {
    const ex = this.getExec(p, "exec/attach");
    return { execId: ex.id, running: !ex.exited, replayed: 0, droppedBytes: 0 };
  }

  async processList(p, ctx) {
    const id = sandboxParam(p, "process/list");
    const rec = await this.liveRecord(id);
    const mine = [...this.execs.values()].filter((x) => x.sandbox === id && !x.exited && x.pid != null);
    if (!rec && mine.length === 0) await this.fetch(id, ctx.abort.signal); // E2009 for unknown ids
    const status = rec?.paused ? "stopped" : "running";
    return {
      processes: mine.map((x) => ({ pid: x.pid, ppid: x.ppid, command: x.display, status })),
    };
  }

  async processKill(p, ctx) {
    const id = sandboxParam(p, "process/kill");
    if (!Number.isInteger(p.pid) || p.pid <= 0) throw invalidParams("process/kill", "`pid` must be a positive integer");
    const sig = parseSignal(p.signal, "process/kill");
    const ex = [...this.execs.values()].find((x) => x.sandbox === id && !x.exited && x.pid === p.pid);
    if (ex) {
      await ex.kill(sig);
      return {};
    }
    const r = await this.onExecd(id, (execd) => this.script(execd, killPidScript(p.pid, sig.name), { signal: ctx.abort.signal }), {
      signal: ctx.abort.signal,
    });
    if (r.code !== 0) throw new RpcError(3006, `Process ${p.pid} not found in sandbox '${id}'.`);
    return {};
  }

  // -------------------------------------------------------------------------------------------
  // Files

  // FileInfo of a path and its type, or null when it does not exist.
  async stat(execd, p, signal) {
    let info;
    try {
      info = await execd.info(p, signal);
    } catch (e) {
      if (e instanceof HttpError && e.status === 404 && isFileAnswer(e)) return null;
      throw e;
    }
    let type = typeOf(info);
    if (type == null) {
      // Older execd versions report no type: a directory is what lists.
      try {
        await execd.list(p, 1, signal);
        type = "directory";
      } catch (e) {
        if (!(e instanceof HttpError)) throw e;
        type = "file";
      }
    }
    return { info, type };
  }

  async filesStat(p, ctx) {
    const id = sandboxParam(p, "files/stat");
    const sp = sandboxPath(p.path, "files/stat");
    return this.onExecd(
      id,
      async (execd) => {
        const st = await this.stat(execd, sp, ctx.abort.signal);
        if (!st) throw pathError(4001, sp);
        return entryOf(st.info, sp, st.type);
      },
      { p: sp, signal: ctx.abort.signal },
    );
  }

  async filesRead(p, ctx) {
    const id = sandboxParam(p, "files/read");
    const sp = sandboxPath(p.path, "files/read");
    const offset = p.offset ?? 0;
    if (!Number.isInteger(offset) || offset < 0) throw invalidParams("files/read", "`offset` must be a non-negative integer");
    let length = p.length ?? MAX_CHUNK;
    if (!Number.isInteger(length) || length < 0) throw invalidParams("files/read", "`length` must be a non-negative integer");
    length = Math.min(length, MAX_CHUNK);
    const encoding = p.encoding ?? null;
    if (encoding != null && !["utf-8", "utf8", "base64"].includes(encoding)) throw new RpcError(4007, `Invalid data: unknown encoding '${encoding}'.`);
    return this.onExecd(
      id,
      async (execd) => {
        const st = await this.stat(execd, sp, ctx.abort.signal);
        if (!st) throw pathError(4001, sp);
        if (st.type === "directory") throw pathError(4003, sp);
        const size = Number(st.info.size ?? 0);
        let buf = Buffer.alloc(0);
        if (offset < size && length > 0) {
          const end = Math.min(size, offset + length) - 1;
          const d = await execd.download(sp, { start: offset, end, signal: ctx.abort.signal, maxBytes: offset + length });
          buf = d.partial ? d.data : d.data.subarray(offset, end + 1); // a server without Range support
          if (buf.length > end - offset + 1) buf = buf.subarray(0, end - offset + 1);
        }
        const reachesEnd = offset + buf.length >= size;
        if (encoding === "base64") {
          return { data: buf.toString("base64"), encoding: "base64", size, eof: reachesEnd, offset };
        }
        const t = utf8Prefix(buf, reachesEnd);
        if (t === null) {
          if (encoding) throw new RpcError(4007, `Invalid data: '${sp}' is not valid UTF-8 at offset ${offset}; read it with encoding 'base64'.`);
          return { data: buf.toString("base64"), encoding: "base64", size, eof: reachesEnd, offset };
        }
        const eof = offset + t.used >= size;
        return { data: t.text, encoding: "utf-8", size, eof, offset };
      },
      { p: sp, signal: ctx.abort.signal },
    );
  }

  async filesWrite(p, ctx) {
    const id = sandboxParam(p, "files/write");
    const sp = sandboxPath(p.path, "files/write");
    const data = decodeData(p.data, p.encoding);
    if (p.offset != null && (!Number.isInteger(p.offset) || p.offset < 0)) throw invalidParams("files/write", "`offset` must be a non-negative integer");
    if (p.mode != null && (!Number.isInteger(p.mode) || p.mode < 0 || p.mode > 0o7777)) throw invalidParams("files/write", "`mode` must be an integer like 420 (0644)");
    const signal = ctx.abort.signal;
    const parent = parentOf(sp);
    return this.onExecd(
      id,
      async (execd) => {
        const [pst, tst] = await Promise.all([this.stat(execd, parent, signal), this.stat(execd, sp, signal)]);
        if (!pst) throw pathError(4001, parent);
        if (pst.type !== "directory") throw pathError(4004, parent);
        if (tst?.type === "directory") throw pathError(4003, sp);
        const oldSize = tst ? Number(tst.info.size ?? 0) : 0;
        const mode = p.mode != null ? Number(p.mode.toString(8)) : tst?.info?.mode != null ? Number(tst.info.mode) : 644;
        const tmp = joinPath(parent, `.abx-write-${randomBytes(6).toString("hex")}`);
        // Whole-file writes (and writes that patch a file) are atomic: the bytes go to a
        // temporary file next to the target, which is then renamed over it.
        const replace = async (bytes) => {
          try {
            await execd.upload([{ path: tmp, data: bytes, mode }], signal);
            await this.moveOver(execd, tmp, sp, Boolean(tst), signal);
          } catch (e) {
            execd.removeFile(tmp).catch(() => {});
            throw e;
          }
          return { size: bytes.length };
        };
        if (p.offset == null && !p.append) return replace(data);
        const at = p.append ? oldSize : p.offset;
        if (!tst) return replace(at > 0 ? Buffer.concat([Buffer.alloc(at), data]) : data);
        if (data.length === 0) return { size: oldSize };
        if (at === oldSize) {
          // Append: upload the chunk next to the file and let the sandbox append it.
          await execd.upload([{ path: tmp, data, mode: 600 }], signal);
          const r = await this.script(execd, appendScript(tmp, sp), { signal });
          if (r.code !== 0) throw new RpcError(9001, `Could not append to '${sp}': ${r.stdout}${r.stderr}`.trim());
          return { size: oldSize + data.length };
        }
        // In place (or past the end): read the file, patch it, write it back whole.
        const whole = oldSize > 0 ? (await execd.download(sp, { signal })).data : Buffer.alloc(0);
        const out = Buffer.alloc(Math.max(whole.length, at + data.length));
        whole.copy(out, 0);
        data.copy(out, at);
        return replace(out);
      },
      { p: sp, signal },
    );
  }

  // Entries of a directory (depth 1), as sandbox paths.
  async children(execd, dir, signal) {
    const raw = await execd.list(dir, 1, signal);
    const out = new Map();
    for (const e of raw) {
      if (!e || typeof e !== "object") continue;
      let p = e.path ?? e.name;
      if (typeof p !== "string" || !p) continue;
      if (!p.startsWith("/")) p = joinPath(dir, p);
      p = p.replace(/(.)\/+$/, "$1");
      if (p === dir || parentOf(p) !== dir) continue; // only direct children
      let type = typeOf(e);
      if (type == null) {
        const st = await this.stat(execd, p, signal).catch(() => null);
        type = st?.type ?? "file";
      }
      out.set(p, entryOf(e, p, type));
    }
    return [...out.values()];
  }

  async filesList(p, ctx) {
    const id = sandboxParam(p, "files/list");
    const sp = sandboxPath(p.path ?? WORKSPACE, "files/list");
    const signal = ctx.abort.signal;
    return this.onExecd(
      id,
      async (execd) => {
        const st = await this.stat(execd, sp, signal);
        if (!st) throw pathError(4001, sp);
        if (st.type !== "directory") throw pathError(4004, sp);
        let entries = await this.children(execd, sp, signal);
        if (p.recursive) {
          const all = [...entries];
          let frontier = entries.filter((e) => e.type === "directory");
          while (frontier.length && all.length < 100000) {
            const next = [];
            for (let i = 0; i < frontier.length; i += 8) {
              const batch = await Promise.all(frontier.slice(i, i + 8).map((d) => this.children(execd, d.path, signal)));
              for (const b of batch) {
                all.push(...b);
                next.push(...b.filter((e) => e.type === "directory"));
              }
            }
            frontier = next;
          }
          entries = all;
        }
        entries.sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
        return { entries };
      },
      { p: sp, signal },
    );
  }

  async filesMkdir(p, ctx) {
    const id = sandboxParam(p, "files/mkdir");
    const sp = sandboxPath(p.path, "files/mkdir");
    const signal = ctx.abort.signal;
    return this.onExecd(
      id,
      async (execd) => {
        const st = await this.stat(execd, sp, signal);
        if (st) {
          if (st.type === "directory" && p.parents) return {};
          throw pathError(4006, sp);
        }
        if (!p.parents) {
          const parent = parentOf(sp);
          const pst = await this.stat(execd, parent, signal);
          if (!pst) throw pathError(4001, parent);
          if (pst.type !== "directory") throw pathError(4004, parent);
        }
        await execd.mkdirs([sp], 755, signal);
        return {};
      },
      { p: sp, signal },
    );
  }

  async filesRemove(p, ctx) {
    const id = sandboxParam(p, "files/remove");
    const sp = sandboxPath(p.path, "files/remove");
    if (sp === WORKSPACE || sp === "/tmp") throw new RpcError(4008, `Permission denied: '${sp}' is a sandbox root.`, "Remove what is inside it instead.");
    const signal = ctx.abort.signal;
    return this.onExecd(
      id,
      async (execd) => {
        const st = await this.stat(execd, sp, signal);
        if (!st) throw pathError(4001, sp);
        if (st.type === "directory") {
          if (!p.recursive) {
            const kids = await this.children(execd, sp, signal);
            if (kids.length) throw pathError(4005, sp);
          }
          await execd.removeDir(sp, signal);
        } else {
          await execd.removeFile(sp, signal);
        }
        return {};
      },
      { p: sp, signal },
    );
  }

  async filesRename(p, ctx) {
    const id = sandboxParam(p, "files/rename");
    const from = sandboxPath(p.from, "files/rename", "from");
    const to = sandboxPath(p.to, "files/rename", "to");
    const signal = ctx.abort.signal;
    return this.onExecd(
      id,
      async (execd) => {
        const [st, pst, tst] = await Promise.all([this.stat(execd, from, signal), this.stat(execd, parentOf(to), signal), this.stat(execd, to, signal)]);
        if (!st) throw pathError(4001, from);
        if (!pst) throw pathError(4001, parentOf(to));
        if (pst.type !== "directory") throw pathError(4004, parentOf(to));
        if (from === to) return {};
        // rename(2)'s rules for an existing target (execd's /files/mv refuses any): a file
        // replaces a file atomically; a directory replaces an empty directory.
        if (tst) {
          const fromDir = st.type === "directory";
          const toDir = tst.type === "directory";
          if (!fromDir && toDir) throw pathError(4003, to);
          if (fromDir && !toDir) throw pathError(4004, to);
          if (toDir) {
            if ((await this.children(execd, to, signal)).length) throw pathError(4005, to);
            await execd.removeDir(to, signal);
            await execd.move(from, to, signal);
            return {};
          }
        }
        await this.moveOver(execd, from, to, Boolean(tst), signal);
        return {};
      },
      { p: from, signal },
    );
  }

  // -------------------------------------------------------------------------------------------

  // Stop the commands abx started (shutdown): best effort, bounded in time.
  async stopAll(ms = 1500) {
    this.stopped = true;
    clearTimeout(this.pollTimer);
    const running = [...this.execs.values()].filter((x) => !x.exited && x.pid != null);
    await Promise.race([Promise.allSettled(running.map((x) => x.kill({ name: "KILL", number: 9 }))), new Promise((r) => setTimeout(r, ms))]);
    await Promise.race([this.saving, new Promise((r) => setTimeout(r, 300))]);
  }

  handlers() {
    return {
      "sandbox/create": (p, c) => this.create(p, c),
      "sandbox/info": (p, c) => this.info(p, c),
      "sandbox/connect": (p, c) => this.info(p, c),
      "sandbox/list": (p, c) => this.list(p, c),
      "sandbox/kill": (p, c) => this.kill(p, c),
      "sandbox/setTimeout": (p, c) => this.setTimeout(p, c),
      "sandbox/pause": (p, c) => this.pause(p, c),
      "sandbox/resume": (p, c) => this.resume(p, c),
      "sandbox/systemInfo": (p, c) => this.systemInfo(p, c),
      "exec/run": (p, c) => this.execRun(p, c),
      "exec/start": (p, c) => this.execStart(p, c),
      "exec/write": (p, c) => this.execWrite(p, c),
      "exec/kill": (p, c) => this.execKill(p, c),
      "exec/attach": (p, c) => this.execAttach(p, c),
      "process/list": (p, c) => this.processList(p, c),
      "process/kill": (p, c) => this.processKill(p, c),
      "files/read": (p, c) => this.filesRead(p, c),
      "files/write": (p, c) => this.filesWrite(p, c),
      "files/list": (p, c) => this.filesList(p, c),
      "files/stat": (p, c) => this.filesStat(p, c),
      "files/mkdir": (p, c) => this.filesMkdir(p, c),
      "files/remove": (p, c) => this.filesRemove(p, c),
      "files/rename": (p, c) => this.filesRename(p, c),
      "ports/url": (p, c) => this.portUrl(p, c),
      "provider/doctor": (p, c) => this.doctor(p, c),
    };
  }

  // provider/doctor (EPP/1 extension, optional: a broker that does not send it loses nothing):
  // the checks only the plugin can make, in the shape of the broker's own doctor checks. Here:
  // whether the server answers at the configured URL and takes the API key (never shown).
  async doctor(p, ctx) {
    const url = this.cfg.api;
    let check;
    try {
      const r = await this.life.req("GET", "/sandboxes", { query: { page: 1, pageSize: 1 }, what: "list sandboxes", timeoutMs: 5000, signal: ctx.abort.signal });
      const total = r.json?.pagination?.totalItems;
      check = { name: "server", ok: true, detail: `OpenSandbox server at ${url} answers${typeof total === "number" ? ` (${total} sandbox${total === 1 ? "" : "es"})` : ""}` };
    } catch (e) {
      if (e instanceof Cancelled) throw e;
      const err = e instanceof RpcError ? e : new RpcError(8006, `The OpenSandbox server at ${url} did not answer: ${e?.message ?? e}.`);
      check = { name: "server", ok: false, detail: err.suggestion ? `${err.message} ${err.suggestion}` : err.message, code: err.abx };
    }
    return { ok: check.ok, checks: [check] };
  }
}

// An execd answer about a file (as opposed to a proxy or server answer about the sandbox).
function isFileAnswer(e) {
  if (e.status >= 502 && e.status <= 504) return false;
  if (/SANDBOX/i.test(e.serverCode ?? "")) return false;
  return true;
}

// ---------------------------------------------------------------------------------------------

// One command started through execd: exec/run ("capture") or exec/start ("stream").
class Exec {
  constructor(provider, { id, sandbox, execd, display, stream }) {
    this.p = provider;
    this.id = id;
    this.sandbox = sandbox;
    this.execd = execd;
    this.display = display;
    this.stream = stream;
    this.pid = null;
    this.ppid = null;
    this.nocmd = false;
    this.errorText = "";
    this.exited = false;
    this.eof = false;
    this.cancelled = false;
    this.timedOut = false;
    this.killSignal = null;
    this.replied = false;
    this.pending = []; // notifications not sent yet (held until the exec/start reply is written)
    this.flushing = false;
    this.chunks = 0;
    this.writes = Promise.resolve();
    this.timer = null;
    this.failure = null;
    this.startReason = null;
    this.streamAbort = new AbortController();
    this.started = new Promise((resolve) => (this.markStarted = resolve));
    this.pidKnown = new Promise((resolve) => (this.resolvePid = resolve));
  }

  // Control lines of the wrapper (exec/run: everything on the stream is control).
  control(e) {
    if (e.type === "stdout" && typeof e.text === "string") {
      if (e.text.startsWith(MARK_PID)) {
        const [pid, ppid] = e.text.slice(MARK_PID.length).trim().split(/\s+/).map(Number);
        this.pid = pid;
        this.ppid = ppid ?? null;
        this.resolvePid(pid);
        this.markStarted();
        return true;
      }
      if (e.text.startsWith(MARK_NOCMD)) {
        this.nocmd = true;
        return true;
      }
      if (e.text.startsWith(MARK_ERROR)) {
        this.errorText = e.text.slice(MARK_ERROR.length);
        return true;
      }
      if (e.text.startsWith(MARK_SIGNAL)) {
        const name = e.text.slice(MARK_SIGNAL.length).trim();
        const number = signalNumber(name);
        if (number) this.forwardedSignal = { name, number };
        return true;
      }
      if (!this.stream) return true;
    }
    if (e.type === "stderr" && !this.stream) {
      if (this.errorText.length < 2000) this.errorText += lineText(e);
      return true;
    }
    return e.type !== "stdout" && e.type !== "stderr";
  }

  onEvent(e) {
    // The wrapper's signal line comes after everything the command printed: after a last line
    // without its newline it shares that line.
    const at = e.type === "stdout" && typeof e.text === "string" ? e.text.indexOf(MARK_SIGNAL) : -1;
    if (at > 0) {
      this.onEvent({ ...e, text: e.text.slice(0, at) });
      this.onEvent({ ...e, text: e.text.slice(at) });
      return;
    }
    // The wrapper's lines come before anything the command prints (same stream, written first).
    if (this.control(e)) return;
    this.emit("exec/output", { execId: this.id, stream: e.type, data: lineText(e) });
  }

  // Notifications of the exec, in order. Until the exec/start reply is written they are held;
  // after it, lines that arrive together are sent together (consecutive output of one stream
  // as one notification, at most 64 KiB).
  emit(method, params) {
    this.pending.push([method, params]);
    if (!this.replied || this.flushing) return;
    this.flushing = true;
    setImmediate(() => {
      this.flushing = false;
      this.flush();
    });
  }

  flush() {
    const held = this.pending;
    this.pending = [];
    let merged = null;
    for (const [method, params] of held) {
      if (method === "exec/output" && merged && merged.stream === params.stream && merged.data.length < 65536) {
        merged.data += params.data;
        continue;
      }
      if (merged) this.p.notify("exec/output", merged);
      merged = null;
      if (method === "exec/output") merged = { ...params };
      else this.p.notify(method, params);
    }
    if (merged) this.p.notify("exec/output", merged);
  }

  signalFor(code) {
    if (this.killSignal && code === 128 + this.killSignal.number) return `SIG${this.killSignal.name}`;
    if (this.forwardedSignal && code === 128 + this.forwardedSignal.number) return `SIG${this.forwardedSignal.name}`;
    return null;
  }

  // execd reports -1 when the wrapper itself was killed by a signal (execd's interrupt or its
  // context's cancellation SIGKILL the wrapper's group, which is not the job's): EPP/1 has no
  // -1, so the command ends as killed by that signal (128+n and its name), and its group,
  // which outlived the wrapper, is killed too. -> {code, signal}
  wrapperKilled(terminal) {
    const sig = signalOfTraceback(terminal) ?? this.killSignal ?? { name: "KILL", number: 9 };
    if (this.pid != null) {
      this.p.script(this.execd, killScript(this.pid, "KILL")).catch((e) => this.p.log(`kill of the job of ${this.id} (pgid ${this.pid}) failed: ${e.message}`));
    }
    return { code: 128 + sig.number, signal: `SIG${sig.name}` };
  }

  // The stream ended with a terminal event (or without one).
  finish(terminal) {
    clearTimeout(this.timer);
    const { code, reason } = exitOf(terminal);
    if (this.pid == null) {
      this.startReason = (reason ?? this.errorText.trim()) || null;
      this.exited = true;
      this.markStarted();
      this.forgetLater();
      return;
    }
    if (code != null && code < 0) {
      const k = this.wrapperKilled(terminal);
      return this.exit(k.code, null, k.signal);
    }
    this.exit(code, code == null ? reason ?? "the command's exit status is unknown" : null);
  }

  // The stream broke (network, sandbox deleted).
  broken(err) {
    clearTimeout(this.timer);
    if (this.pid == null) {
      this.failure = this.gone || this.sandboxKilled ? sandboxNotFound(this.sandbox) : err;
      this.exited = true;
      this.markStarted();
      this.forgetLater();
      return;
    }
    if (this.exited) return;
    // Its sandbox was killed (here, or deleted on the server: gone, or Failed while the delete
    // runs) or failed: the command died with it, as a killed process does.
    if (this.gone || this.sandboxKilled) return this.exit(137, null, "SIGKILL");
    this.p.diagnose(this.sandbox, err, this.execd).then(
      (e) => (e.code === 2009 || e.sandboxFailed ? this.exit(137, null, "SIGKILL") : this.exit(null, e.message)),
      () => this.exit(null, err.message),
    );
  }

  // The sandbox was killed or expired: the exec ends (the stream is cut).
  sandboxGone() {
    this.gone = true;
    this.streamAbort.abort();
    if (this.pid != null && !this.exited && this.stream) this.exit(137, null, "SIGKILL");
  }

  exit(code, error, signal = null) {
    if (this.exited && this.exitSent) return;
    this.exited = true;
    this.exitSent = true;
    this.streamAbort.abort();
    if (!this.stream) return;
    const params = { execId: this.id, exitCode: code, timedOut: this.timedOut };
    const sig = signal ?? this.signalFor(code);
    if (sig) params.signal = sig;
    if (error) params.error = error;
    this.emit("exec/exit", params);
    this.forgetLater();
  }

  forgetLater() {
    if (this.forgotten) return;
    this.forgotten = true;
    const t = setTimeout(() => this.p.execs.delete(this.id), EXEC_KEEP_MS);
    t.unref?.();
    // The per-exec directory of a streamed exec, once the stdin uploads in flight settled.
    if (this.stream && this.dir && !this.gone) {
      this.writes.then(() => this.execd.removeDir(this.dir)).catch(() => {});
    }
  }

  // Signal the job's process group (through another execd command).
  async kill(sig) {
    if (this.exited) return;
    this.killSignal = sig;
    const pid = await Promise.race([this.pidKnown, this.started.then(() => this.pid)]);
    if (pid == null || this.exited) return;
    let r;
    try {
      r = await this.p.script(this.execd, killScript(pid, sig.name));
    } catch (e) {
      if (this.exited) return;
      throw await this.p.diagnose(this.sandbox, e, this.execd);
    }
    if (r.code !== 0 && !this.exited) this.p.log(`kill -${sig.name} of ${this.id} (pgid ${pid}) answered ${r.code}: ${r.stdout.trim()}`);
  }

  // Feed stdin: the chunk and its ready marker (and the eof marker) in one upload, in order.
  write(data, eof) {
    if (eof) this.eof = true;
    const files = [];
    if (data.length) {
      const n = this.chunks++;
      files.push({ path: `${this.dir}/c.${n}`, data, mode: 600 }, { path: `${this.dir}/r.${n}`, data: Buffer.alloc(0), mode: 600 });
    }
    if (eof) files.push({ path: `${this.dir}/eof`, data: Buffer.alloc(0), mode: 600 });
    const op = this.writes.then(async () => {
      if (!files.length) return;
      if (this.exited) throw new RpcError(3005, `Stdin of exec '${this.id}' is closed.`);
      try {
        await this.execd.upload(files);
      } catch (e) {
        throw await this.p.diagnose(this.sandbox, e, this.execd);
      }
    });
    this.writes = op.catch(() => {});
    return op;
  }
}
