// Helpers of the OpenSandbox plugin tests: start the stand-in server, and drive the plugin over
// EPP/1 on a pipe (as the broker does, with the same minimal environment).

import { spawn } from "node:child_process";
import * as http from "node:http";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import * as readline from "node:readline";
import { fileURLToPath } from "node:url";

const HERE = path.dirname(fileURLToPath(import.meta.url));
export const REPO = path.resolve(HERE, "..", "..");
export const PLUGIN = path.join(REPO, "extensions", "providers", "opensandbox");
export const lib = (name) => path.join(PLUGIN, "lib", name);

export function tempDir(tag) {
  return fs.mkdtempSync(path.join(os.tmpdir(), `osb-${tag}-`));
}

// Start the stand-in; resolves {url, stop()}.
export function startServer({ apiKey = "", args = [] } = {}) {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [path.join(HERE, "server.mjs"), "--port", "0", ...args], {
      env: { PATH: process.env.PATH, OSB_STANDIN_API_KEY: apiKey },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stderr = "";
    child.stderr.on("data", (d) => (stderr += d));
    const rl = readline.createInterface({ input: child.stdout });
    const timer = setTimeout(() => reject(new Error(`stand-in did not start: ${stderr}`)), 10000);
    rl.once("line", (line) => {
      clearTimeout(timer);
      const url = line.replace(/^listening /, "").trim();
      resolve({
        url,
        child,
        stop: () =>
          new Promise((r) => {
            if (child.exitCode != null) return r();
            child.once("exit", () => r());
            child.kill("SIGTERM");
          }),
      });
    });
    child.once("exit", (code) => reject(new Error(`stand-in exited (${code}): ${stderr}`)));
  });
}

// The plugin as the broker runs it: cwd = its directory, a minimal environment, JSON-RPC lines.
export class Plugin {
  constructor({ dataDir, env = {} } = {}) {
    this.ownData = dataDir == null;
    this.dataDir = dataDir ?? tempDir("data");
    this.child = spawn("node", ["./provider.mjs"], {
      cwd: PLUGIN,
      env: {
        PATH: process.env.PATH,
        HOME: os.homedir(),
        LANG: "C.UTF-8",
        ABX_PROTOCOL: "EPP/1",
        ABX_PROVIDER_ID: "opensandbox",
        ABX_DATA_DIR: this.dataDir,
        ...env,
      },
      stdio: ["pipe", "pipe", "pipe"],
    });
    this.nextId = 1;
    this.waiting = new Map();
    this.notes = [];
    this.stderr = "";
    this.lines = [];
    this.child.stderr.on("data", (d) => (this.stderr += d));
    readline.createInterface({ input: this.child.stdout }).on("line", (line) => {
      this.lines.push(line);
      const msg = JSON.parse(line); // anything else on stdout is a protocol violation
      if ("id" in msg && this.waiting.has(msg.id)) {
        this.waiting.get(msg.id)(msg);
        this.waiting.delete(msg.id);
      } else if (msg.method) {
        this.notes.push(msg);
      }
    });
  }

  // Send a request; resolves with the whole reply ({result} or {error}).
  request(method, params = {}) {
    const id = this.nextId++;
    const p = new Promise((resolve) => this.waiting.set(id, resolve));
    this.child.stdin.write(`${JSON.stringify({ jsonrpc: "2.0", id, method, params })}\n`);
    return p;
  }

  async call(method, params) {
    const r = await this.request(method, params);
    if (r.error) {
      const e = new Error(`${method}: [${r.error.data?.abx}] ${r.error.message}`);
      e.rpc = r.error;
      throw e;
    }
    return r.result;
  }

  notify(method, params = {}) {
    this.child.stdin.write(`${JSON.stringify({ jsonrpc: "2.0", method, params })}\n`);
  }

  async start(config) {
    const r = await this.request("initialize", { protocol: "EPP/1", broker: { name: "test", version: "0" }, config, dataDir: this.dataDir });
    if (!r.error) this.notify("initialized");
    return r;
  }

  async stop() {
    if (this.child.exitCode == null && this.child.signalCode == null) {
      const exited = new Promise((r) => this.child.once("exit", r));
      await this.request("shutdown").catch(() => {});
      this.notify("exit");
      await exited;
    }
    if (this.ownData) fs.rmSync(this.dataDir, { recursive: true, force: true });
  }
}

// A gateway in front of the stand-in (loopback only): forwards every request, points the
// endpoints the server answers at itself (so execd traffic goes through it too), and can go
// away like an overloaded host: when `refuseWhen(req)` says so it stops listening and drops
// every connection, so that request and every later one fail (reset, then refused).
// Resolves {url, closed, stop()}.
export function startGateway(target, { refuseWhen = () => false } = {}) {
  const t = new URL(target);
  const sockets = new Set();
  const gw = { closed: false };
  const server = http.createServer((req, res) => {
    if (gw.closed || refuseWhen(req)) {
      gw.close();
      return;
    }
    const up = http.request(
      { host: t.hostname, port: t.port, method: req.method, path: req.url, headers: { ...req.headers, host: t.host } },
      (ur) => {
        if (!/\/endpoints\/\d+/.test(req.url)) {
          res.writeHead(ur.statusCode, ur.headers);
          ur.pipe(res);
          return;
        }
        const chunks = [];
        ur.on("data", (c) => chunks.push(c));
        ur.on("end", () => {
          const body = Buffer.concat(chunks).toString("utf8").split(t.host).join(gw.host);
          const headers = { ...ur.headers, "content-length": Buffer.byteLength(body) };
          res.writeHead(ur.statusCode, headers);
          res.end(body);
        });
      },
    );
    up.on("error", () => res.destroy());
    req.pipe(up);
  });
  server.on("connection", (s) => {
    sockets.add(s);
    s.on("close", () => sockets.delete(s));
  });
  gw.close = () => {
    gw.closed = true;
    server.close();
    for (const s of sockets) s.destroy();
  };
  gw.stop = () => new Promise((r) => (gw.closed ? r() : (gw.close(), r())));
  return new Promise((resolve) => {
    server.listen(0, "127.0.0.1", () => {
      gw.host = `127.0.0.1:${server.address().port}`;
      gw.url = `http://${gw.host}`;
      resolve(gw);
    });
  });
}
