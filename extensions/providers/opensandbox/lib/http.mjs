// A small HTTP client on node:http / node:https (no dependencies): keep-alive agents, a deadline
// for the answer's headers, cancellation through an AbortSignal, bodies read whole or streamed,
// multipart bodies built byte-exact.

import * as http from "node:http";
import * as https from "node:https";
import { randomBytes } from "node:crypto";
import { Cancelled, HttpError, NetworkError } from "./errors.mjs";

// No cap on sockets per host: long-lived exec streams must never make a kill or a lifecycle
// call wait for a free socket (with use_server_proxy everything goes to one host).
const AGENTS = {
  "http:": new http.Agent({ keepAlive: true, maxFreeSockets: 32 }),
  "https:": new https.Agent({ keepAlive: true, maxFreeSockets: 32 }),
};

class Timeout extends Error {}
class Aborted extends Error {}

// Open a request and resolve when the answer's status and headers arrived.
// Resolves {status, headers, res, req}; rejects with NetworkError (no answer, or none within
// `timeoutMs`) or Cancelled (the signal fired). A request that failed on a kept-alive socket the
// server had just closed (reset before any answer) is sent once more on a fresh one.
export async function open(url, options = {}) {
  try {
    return await openOnce(url, options);
  } catch (e) {
    if (e instanceof NetworkError && e.staleSocket) return openOnce(url, options);
    throw e;
  }
}

function openOnce(url, { method = "GET", headers = {}, body = null, timeoutMs = 30000, signal } = {}) {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(new Cancelled());
    let u;
    try {
      u = new URL(url);
    } catch {
      return reject(new NetworkError(url, new Error(`invalid URL '${url}'`)));
    }
    const mod = u.protocol === "https:" ? https : u.protocol === "http:" ? http : null;
    if (!mod) return reject(new NetworkError(url, new Error(`unsupported scheme '${u.protocol}' (use http or https)`)));
    const h = { ...headers };
    if (body != null) h["Content-Length"] = String(Buffer.byteLength(body));
    const req = mod.request(u, { method, headers: h, agent: AGENTS[u.protocol] });
    let settled = false;
    const timer = setTimeout(() => req.destroy(new Timeout()), timeoutMs);
    const onAbort = () => req.destroy(new Aborted());
    signal?.addEventListener("abort", onAbort, { once: true });
    const done = () => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
    };
    req.on("response", (res) => {
      settled = true;
      done();
      resolve({ status: res.statusCode, headers: res.headers, res, req });
    });
    req.on("error", (e) => {
      done();
      if (settled) return; // errors after the headers belong to the body reader
      if (e instanceof Aborted) reject(new Cancelled());
      else if (e instanceof Timeout) reject(new NetworkError(url, e, { timeout: true }));
      else {
        const ne = new NetworkError(url, e);
        ne.staleSocket = req.reusedSocket && (e.code === "ECONNRESET" || e.code === "EPIPE");
        reject(ne);
      }
    });
    req.end(body ?? undefined);
  });
}

// Read a response body whole (at most `maxBytes`, the rest is dropped and `truncated` set).
export function readBody(opened, { timeoutMs = 60000, signal, maxBytes = Infinity } = {}) {
  const { res, req } = opened;
  return new Promise((resolve, reject) => {
    const chunks = [];
    let size = 0;
    let truncated = false;
    let finished = false;
    const finish = (err) => {
      if (finished) return;
      finished = true;
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
      if (err) reject(err);
      else resolve({ buffer: Buffer.concat(chunks), truncated });
    };
    const timer = setTimeout(() => {
      req.destroy();
      finish(new NetworkError(opened.url ?? "", new Error("body"), { timeout: true }));
    }, timeoutMs);
    const onAbort = () => {
      req.destroy();
      finish(new Cancelled());
    };
    signal?.addEventListener("abort", onAbort, { once: true });
    res.on("data", (c) => {
      if (size + c.length > maxBytes) {
        chunks.push(c.subarray(0, maxBytes - size));
        size = maxBytes;
        truncated = true;
        req.destroy(); // stop the transfer; what we have is what we keep
        finish();
        return;
      }
      chunks.push(c);
      size += c.length;
    });
    res.on("end", () => finish());
    res.on("error", (e) => finish(truncated ? null : new NetworkError("", e)));
    res.on("aborted", () => finish(truncated ? null : new NetworkError("", new Error("connection closed mid-body"))));
  });
}

// A whole request: JSON or raw body in, {status, headers, buffer, json} out. Non-2xx statuses
// (other than those listed in `ok`) reject with HttpError (`what` names the operation).
export async function call(url, { method = "GET", headers = {}, json, body, what = "request", timeoutMs, bodyTimeoutMs, signal, ok = [], maxBytes } = {}) {
  const h = { Accept: "application/json", ...headers };
  let payload = body ?? null;
  if (json !== undefined) {
    payload = Buffer.from(JSON.stringify(json));
    h["Content-Type"] = "application/json";
  }
  const opened = await open(url, { method, headers: h, body: payload, timeoutMs, signal });
  opened.url = url;
  const { buffer, truncated } = await readBody(opened, { timeoutMs: bodyTimeoutMs ?? Math.max(timeoutMs ?? 0, 60000), signal, maxBytes });
  const text = () => buffer.toString("utf8");
  let parsed;
  const parse = () => {
    if (parsed === undefined) {
      try {
        parsed = buffer.length ? JSON.parse(text()) : null;
      } catch {
        parsed = null;
      }
    }
    return parsed;
  };
  if ((opened.status < 200 || opened.status > 299) && !ok.includes(opened.status)) {
    throw new HttpError(opened.status, parse(), text(), what);
  }
  return {
    status: opened.status,
    headers: opened.headers,
    buffer,
    truncated,
    get json() {
      return parse();
    },
  };
}

// multipart/form-data with the parts in order. A part with a `filename` is sent as a file part
// (execd requires its `metadata` parts to be file parts too).
export function multipart(parts) {
  const boundary = `----abx${randomBytes(12).toString("hex")}`;
  const chunks = [];
  for (const p of parts) {
    let head = `--${boundary}\r\nContent-Disposition: form-data; name="${p.name}"`;
    if (p.filename != null) head += `; filename="${p.filename}"`;
    head += `\r\nContent-Type: ${p.contentType ?? "application/octet-stream"}\r\n\r\n`;
    chunks.push(Buffer.from(head), Buffer.isBuffer(p.data) ? p.data : Buffer.from(p.data), Buffer.from("\r\n"));
  }
  chunks.push(Buffer.from(`--${boundary}--\r\n`));
  return { body: Buffer.concat(chunks), contentType: `multipart/form-data; boundary=${boundary}` };
}

// Join a base URL (which may carry a path, like an execd endpoint
// "host:port/sandboxes/ID/port/44772") and an API path with a query.
export function joinUrl(base, path, query) {
  const b = base.endsWith("/") ? base.slice(0, -1) : base;
  let url = `${b}${path.startsWith("/") ? path : `/${path}`}`;
  if (query) {
    const qs = new URLSearchParams();
    for (const [k, v] of Object.entries(query)) {
      if (v == null) continue;
      for (const x of Array.isArray(v) ? v : [v]) qs.append(k, String(x));
    }
    const s = qs.toString();
    if (s) url += `?${s}`;
  }
  return url;
}
