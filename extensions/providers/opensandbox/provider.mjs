#!/usr/bin/env node
// opensandbox: an abx provider plugin (EPP/1, docs/epp-1.md) for OpenSandbox
// (https://github.com/alibaba/OpenSandbox). Node >= 18, no dependencies, no build step.
//
// This file is the wire: JSON-RPC 2.0 lines on stdin/stdout, one task per request (requests run
// concurrently and are answered in any order, each exactly once), `$/cancelRequest`,
// `shutdown`/`exit`. The methods are in lib/provider.mjs. Logs go to stderr (the broker copies
// them into its log with secret values redacted); secrets are never logged by this plugin.

import * as readline from "node:readline";
import { Cancelled, NetworkError, RpcError } from "./lib/errors.mjs";
import { OpenSandboxProvider } from "./lib/provider.mjs";

function send(msg) {
  // JSON.stringify escapes newlines inside strings: one message, one line, one write.
  process.stdout.write(`${JSON.stringify(msg)}\n`);
}
const notify = (method, params) => send({ jsonrpc: "2.0", method, params });
const log = (message) => process.stderr.write(`opensandbox: ${message}\n`);
process.stdout.on("error", () => process.exit(1)); // the broker is gone

const provider = new OpenSandboxProvider({ notify, log });
const handlers = provider.handlers();
const pending = new Map(); // request id -> {abort}
let initialized = false;
let shuttingDown = false;
let shutdownSeen = false;

function reply(id, result, error) {
  send(error ? { jsonrpc: "2.0", id, error } : { jsonrpc: "2.0", id, result });
}

async function runRequest(id, method, params) {
  const key = JSON.stringify(id);
  const ctx = { id, method, abort: new AbortController(), afterReply: null };
  pending.set(key, ctx);
  let result = null;
  let error = null;
  try {
    result = await handlers[method](params, ctx);
    if (ctx.abort.signal.aborted) throw new Cancelled();
  } catch (e) {
    if (e instanceof RpcError) error = e;
    else if (e instanceof Cancelled) error = new RpcError(-32800, "Request cancelled.");
    else if (e instanceof NetworkError) {
      // Not mapped where it happened (each call site should): still the documented E-code.
      log(`${method}: ${e.url}: ${e.message}`);
      error = new RpcError(
        8006,
        `OpenSandbox is unreachable (${e.url}): ${e.message}.`,
        "Check that the server and its sandboxes can be reached (abx provider doctor opensandbox); if sandbox endpoints cannot be reached directly: abx provider configure opensandbox use_server_proxy=true",
      );
    } else {
      log(`internal error in ${method}: ${e?.stack ?? e}`);
      error = new RpcError(9001, `Internal error in ${method}: ${e?.message ?? e}`);
    }
  } finally {
    pending.delete(key);
  }
  reply(id, result, error);
  if (!error && ctx.afterReply) ctx.afterReply();
}

async function initialize(params) {
  if (params.protocol != null && params.protocol !== "EPP/1") {
    throw new RpcError(8003, `This plugin speaks EPP/1, not '${params.protocol}'.`, "Update abx or the plugin.");
  }
  const r = await provider.initialize(params);
  initialized = true;
  return r;
}

const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
let ready = Promise.resolve(); // requests wait for initialize

rl.on("line", (line) => {
  if (!line.trim()) return;
  let msg;
  try {
    msg = JSON.parse(line);
  } catch (e) {
    reply(null, null, new RpcError(-32700, `Parse error: ${e.message}`));
    return;
  }
  if (msg === null || typeof msg !== "object" || Array.isArray(msg) || typeof msg.method !== "string") {
    if (msg && typeof msg === "object" && !("method" in msg) && ("result" in msg || "error" in msg)) return;
    const id = msg && typeof msg === "object" && (typeof msg.id === "number" || typeof msg.id === "string") ? msg.id : null;
    reply(id, null, new RpcError(-32600, "Invalid request."));
    return;
  }
  const { method } = msg;
  const params = msg.params ?? {};
  if (!("id" in msg)) {
    if (method === "$/cancelRequest") pending.get(JSON.stringify(params?.id))?.abort.abort();
    else if (method === "initialized") log(`${provider.cfg ? `ready; server ${provider.cfg.api}` : "ready"}`);
    else if (method === "exit") process.exit(shutdownSeen ? 0 : 1);
    return;
  }
  const { id } = msg;
  if (typeof params !== "object" || Array.isArray(params)) {
    reply(id, null, new RpcError(-32602, `Invalid params for '${method}': params must be an object`));
  } else if (method === "initialize") {
    ready = initialize(params).then(
      (r) => reply(id, r),
      (e) => reply(id, null, e instanceof RpcError ? e : new RpcError(8006, `Could not start: ${e?.message ?? e}`)),
    );
  } else {
    ready.then(() => {
      if (!initialized) reply(id, null, new RpcError(-32600, "Not initialized: the first request must be 'initialize'."));
      else if (shuttingDown) reply(id, null, new RpcError(-32600, `Shutting down; '${method}' was not run.`));
      else if (method === "shutdown") {
        shuttingDown = shutdownSeen = true;
        provider.stopAll().finally(() => reply(id, null));
      } else if (!Object.hasOwn(handlers, method)) reply(id, null, new RpcError(-32601, `Method '${method}' not found.`));
      else runRequest(id, method, params);
    });
  }
});

rl.on("close", () => {
  // stdin closed: the broker is gone.
  provider.stopAll(1000).finally(() => process.exit(shutdownSeen ? 0 : 1));
});
