// Clients of the two OpenSandbox APIs:
//   - the lifecycle API (specs/sandbox-lifecycle.yml): /v1/sandboxes..., header
//     OPEN-SANDBOX-API-KEY;
//   - execd (specs/execd-api.yaml), the daemon inside each sandbox on port 44772, reached at the
//     endpoint the lifecycle API returns for that port (GET /sandboxes/{id}/endpoints/44772),
//     with the headers that endpoint answer lists. The API key is never sent to execd: execd
//     runs inside the sandbox, next to the code the sandbox runs.

import { call, joinUrl, multipart, open } from "./http.mjs";
import { Cancelled, HttpError, NetworkError, RpcError, lifecycleError } from "./errors.mjs";
import { EventStreamParser, isTerminal } from "./events.mjs";

export const EXECD_PORT = 44772;
const LIFECYCLE_TIMEOUT_MS = 30000;

export class Lifecycle {
  constructor(cfg) {
    this.cfg = cfg;
    this.base = cfg.api;
  }

  headers() {
    return this.cfg.apiKey ? { "OPEN-SANDBOX-API-KEY": this.cfg.apiKey } : {};
  }

  // One lifecycle call; errors mapped to E-codes (404 about `id` is E2009).
  async req(method, path, { json, query, id = null, what, timeoutMs = LIFECYCLE_TIMEOUT_MS, signal, ok } = {}) {
    try {
      return await call(joinUrl(this.base, path, query), { method, json, headers: this.headers(), what, timeoutMs, signal, ok });
    } catch (e) {
      throw lifecycleError(e, { baseUrl: this.base, id, what });
    }
  }

  async list(signal) {
    const items = [];
    for (let page = 1; page <= 100; page++) {
      const r = await this.req("GET", "/sandboxes", { query: { page, pageSize: 100 }, what: "list sandboxes", signal });
      const body = r.json ?? {};
      const got = Array.isArray(body.items) ? body.items : Array.isArray(body) ? body : [];
      items.push(...got);
      const pg = body.pagination;
      if (!pg || !pg.hasNextPage || got.length === 0) break;
    }
    return items;
  }

  async get(id, signal) {
    return (await this.req("GET", `/sandboxes/${encodeURIComponent(id)}`, { id, what: "get sandbox", signal })).json ?? {};
  }

  // POST /sandboxes: the raw answer (202); errors are mapped by the caller (image, timeout).
  async create(body, { timeoutMs, signal }) {
    return call(joinUrl(this.base, "/sandboxes"), {
      method: "POST",
      json: body,
      headers: this.headers(),
      what: "create sandbox",
      timeoutMs,
      signal,
    });
  }

  // DELETE: true when deleted, false when it did not exist.
  async delete(id, signal) {
    const r = await this.req("DELETE", `/sandboxes/${encodeURIComponent(id)}`, { id, what: "delete sandbox", signal, ok: [404] });
    return r.status !== 404;
  }

  async pause(id, signal) {
    return this.req("POST", `/sandboxes/${encodeURIComponent(id)}/pause`, { id, what: "pause sandbox", signal, ok: [409] });
  }

  async resume(id, signal) {
    return this.req("POST", `/sandboxes/${encodeURIComponent(id)}/resume`, { id, what: "resume sandbox", signal, ok: [409] });
  }

  async renew(id, expiresAt, signal) {
    return (
      await this.req("POST", `/sandboxes/${encodeURIComponent(id)}/renew-expiration`, {
        id,
        json: { expiresAt },
        what: "renew expiration",
        signal,
      })
    ).json;
  }

  // {url, headers} where a client reaches `port` of the sandbox. The endpoint comes without a
  // scheme ("10.0.0.5:44772", "host/sandboxes/ID/port/8080", or with use_server_proxy
  // "host:8080/v1/sandboxes/ID/proxy/8080"); the configured protocol is put in front.
  async endpoint(id, port, signal) {
    const r = await this.req("GET", `/sandboxes/${encodeURIComponent(id)}/endpoints/${port}`, {
      id,
      query: this.cfg.useServerProxy ? { use_server_proxy: "true" } : undefined,
      what: `endpoint of port ${port}`,
      signal,
    });
    const body = r.json ?? {};
    const ep = typeof body.endpoint === "string" ? body.endpoint : typeof body.url === "string" ? body.url : "";
    if (!ep) throw new RpcError(9001, `OpenSandbox answered no endpoint for port ${port} of sandbox '${id}'.`);
    const url = /^[a-z][a-z0-9+.-]*:\/\//i.test(ep) ? ep : `${this.cfg.protocol}://${ep}`;
    const headers = {};
    if (body.headers && typeof body.headers === "object") {
      for (const [k, v] of Object.entries(body.headers)) if (v != null) headers[k] = String(v);
    }
    return { url, headers };
  }
}

// ---------------------------------------------------------------------------------------------

export class Execd {
  constructor(url, headers) {
    this.url = url;
    this.headers = headers ?? {};
  }

  u(path, query) {
    return joinUrl(this.url, path, query);
  }

  // `timeoutMs` bounds the wait for the answer to start (a paused sandbox never answers);
  // `bodyTimeoutMs` the transfer.
  async req(method, path, { query, json, body, contentType, what, timeoutMs = 10000, bodyTimeoutMs = 300000, signal, ok, maxBytes, headers } = {}) {
    const h = { ...this.headers, ...(headers ?? {}) };
    if (contentType) h["Content-Type"] = contentType;
    return call(this.u(path, query), { method, json, body, headers: h, what, timeoutMs, bodyTimeoutMs, signal, ok, maxBytes });
  }

  // POST /command. Calls onEvent(event) for every event in order and resolves with the
  // terminal event (execution_complete / error), or null when the stream ended without one.
  // Stops reading at the terminal event (execd keeps the connection open ~1 s after it).
  // `headersTimeoutMs` bounds the wait for the answer to start (a paused sandbox never
  // answers). `signal` aborts the stream (Cancelled).
  async command(body, { onEvent, signal, headersTimeoutMs = 10000 } = {}) {
    const payload = Buffer.from(JSON.stringify(body));
    const opened = await open(this.u("/command"), {
      method: "POST",
      headers: { ...this.headers, "Content-Type": "application/json", Accept: "text/event-stream" },
      body: payload,
      timeoutMs: headersTimeoutMs,
      signal,
    });
    const { res, req } = opened;
    if (opened.status < 200 || opened.status > 299) {
      const chunks = [];
      for await (const c of res) chunks.push(c);
      const text = Buffer.concat(chunks).toString("utf8");
      let json = null;
      try {
        json = JSON.parse(text);
      } catch {
        // not JSON
      }
      throw new HttpError(opened.status, json, text, "run command");
    }
    return new Promise((resolve, reject) => {
      const parser = new EventStreamParser();
      let finished = false;
      const finish = (err, value) => {
        if (finished) return;
        finished = true;
        signal?.removeEventListener("abort", onAbort);
        req.destroy(); // do not wait for the server to close
        if (err) reject(err);
        else resolve(value);
      };
      const onAbort = () => finish(new Cancelled());
      signal?.addEventListener("abort", onAbort, { once: true });
      const deliver = (events) => {
        for (const e of events) {
          try {
            onEvent?.(e);
          } catch (err) {
            finish(err);
            return;
          }
          if (isTerminal(e)) {
            finish(null, e);
            return;
          }
        }
      };
      res.on("data", (chunk) => deliver(parser.push(chunk)));
      res.on("end", () => {
        deliver(parser.end());
        finish(null, null);
      });
      res.on("error", (e) => finish(new NetworkError(this.url, e)));
      res.on("aborted", () => finish(new NetworkError(this.url, new Error("the event stream was cut"))));
    });
  }

  // GET /files/info?path=... -> the FileInfo of one path.
  async info(path, signal) {
    const r = await this.req("GET", "/files/info", { query: { path }, what: `stat ${path}`, signal });
    const body = r.json ?? {};
    const info = body[path] ?? Object.values(body)[0];
    if (!info || typeof info !== "object") throw new HttpError(404, { code: "FILE_NOT_FOUND", message: "no info" }, "", `stat ${path}`);
    return info;
  }

  // GET /files/download (with a Range when start/end are given). -> {data, size}
  async download(path, { start = null, end = null, maxBytes, signal } = {}) {
    const headers = start != null ? { Range: `bytes=${start}-${end ?? ""}` } : {};
    const r = await this.req("GET", "/files/download", {
      query: { path },
      headers,
      what: `download ${path}`,
      signal,
      maxBytes,
      ok: [416],
    });
    if (r.status === 416) return { data: Buffer.alloc(0), size: null, partial: true };
    let size = null;
    const cr = r.headers["content-range"];
    if (typeof cr === "string") {
      const m = /\/(\d+)\s*$/.exec(cr);
      if (m) size = Number(m[1]);
    } else if (r.headers["content-length"] != null) {
      size = Number(r.headers["content-length"]);
    }
    return { data: r.buffer, size, partial: r.status === 206, truncated: r.truncated };
  }

  // POST /files/upload: pairs of a metadata part (sent as a file part: execd reads it from the
  // form's files) and the file part, written in order.
  async upload(files, signal) {
    const parts = [];
    for (const f of files) {
      const meta = { path: f.path };
      if (f.mode != null) meta.mode = f.mode;
      parts.push({ name: "metadata", filename: "metadata.json", contentType: "application/json", data: JSON.stringify(meta) });
      parts.push({ name: "file", filename: "file.bin", contentType: "application/octet-stream", data: f.data });
    }
    const { body, contentType } = multipart(parts);
    await this.req("POST", "/files/upload", { body, contentType, what: `upload ${files.map((f) => f.path).join(", ")}`, signal, timeoutMs: 120000 });
  }

  async move(src, dest, signal) {
    await this.req("POST", "/files/mv", { json: [{ src, dest }], what: `move ${src}`, signal });
  }

  async removeFile(path, signal) {
    await this.req("DELETE", "/files", { query: { path }, what: `remove ${path}`, signal });
  }

  async mkdirs(paths, mode = 755, signal, { timeoutMs } = {}) {
    const json = {};
    for (const p of paths) json[p] = { mode };
    await this.req("POST", "/directories", { json, what: `mkdir ${paths.join(", ")}`, signal, timeoutMs });
  }

  async removeDir(path, signal) {
    await this.req("DELETE", "/directories", { query: { path }, what: `remove ${path}`, signal });
  }

  // GET /directories/list?path=&depth= -> array of entries (shape varies between execd
  // versions: a bare array, or {entries|items|files: [...]}).
  async list(path, depth = 1, signal) {
    const r = await this.req("GET", "/directories/list", { query: { path, depth }, what: `list ${path}`, signal });
    const body = r.json;
    if (Array.isArray(body)) return body;
    for (const k of ["entries", "items", "files", "children"]) if (Array.isArray(body?.[k])) return body[k];
    if (body && typeof body === "object") return Object.values(body).filter((x) => x && typeof x === "object");
    return [];
  }

  async metrics(signal) {
    return (await this.req("GET", "/metrics", { what: "metrics", signal })).json ?? {};
  }
}

// Wait until a sandbox reaches one of `wanted` states (pause/resume/create are asynchronous).
// `get` returns the sandbox (throws E2009 when it is gone); `fail` states end the wait with an
// error; unknown states are waited through. Resolves with the sandbox.
export async function waitForState(get, wanted, { fail = ["Failed", "Terminated", "Stopping"], timeoutMs = 60000, signal, interval = [100, 200, 400, 800, 1000], onFail } = {}) {
  const deadline = Date.now() + timeoutMs;
  let i = 0;
  let last = null;
  for (;;) {
    if (signal?.aborted) throw new Cancelled();
    const sb = await get();
    last = sb?.status?.state ?? "Unknown";
    if (wanted.includes(last)) return sb;
    if (fail.includes(last)) throw onFail ? onFail(sb) : new RpcError(2001, `Sandbox went to state ${last}${sb?.status?.message ? `: ${sb.status.message}` : ""}.`);
    if (Date.now() >= deadline) {
      const e = new RpcError(3001, `Sandbox did not reach ${wanted.join(" or ")} within ${Math.round(timeoutMs / 1000)} s (state: ${last}).`, "The server may be busy; check the sandbox with 'abx info <sandbox>' and retry.");
      e.lastState = last;
      e.sandbox = sb;
      throw e;
    }
    const wait = interval[Math.min(i++, interval.length - 1)];
    await new Promise((r) => setTimeout(r, Math.min(wait, Math.max(0, deadline - Date.now()))));
  }
}
