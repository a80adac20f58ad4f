// Unit and integration tests of the OpenSandbox plugin's own pieces (node --test):
// the execd event-stream parser, error mapping, state waiting, configuration, the wrapper
// scripts, and the plugin process against the stand-in (wrong API key, unreachable server,
// lifetimes enforced across a restart, the stream's lingering connection).

import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawnSync } from "node:child_process";
import * as fs from "node:fs";
import * as net from "node:net";
import * as path from "node:path";
import { Plugin, lib, startServer, tempDir } from "./helpers.mjs";

const { EventStreamParser, exitOf, lineText, parseBlock } = await import(lib("events.mjs"));
const errors = await import(lib("errors.mjs"));
const { HttpError, NetworkError, RpcError, fileError, lifecycleError, serverError } = errors;
const { waitForState, Execd, Lifecycle } = await import(lib("opensandbox.mjs"));
const { apiBase, parseConfig, imageFor } = await import(lib("config.mjs"));
const { sandboxPath } = await import(lib("paths.mjs"));
const { wrapperScript, parseSignal, shq } = await import(lib("shell.mjs"));
const { multipart } = await import(lib("http.mjs"));
const { labelSafe, utf8Prefix } = await import(lib("provider.mjs"));

// -----------------------------------------------------------------------------------------------
// The event stream

const EVENTS = [
  { type: "init", text: "c0ffee", timestamp: 1 },
  { type: "stdout", text: "héllo wörld 你好 🌍", timestamp: 2 },
  { type: "ping", text: "pong", timestamp: 3 },
  { type: "stderr", text: "oops", timestamp: 4 },
  { type: "stdout", text: "\n", timestamp: 5 },
  { type: "error", error: { ename: "CommandExecError", evalue: "3", traceback: ["exit status 3"] }, timestamp: 6 },
];
const BODY = Buffer.from(`${EVENTS.map((e) => `${JSON.stringify(e)}\n\n`).join("")}${JSON.stringify({ type: "stdout", text: "after the end" })}\n\n`);

function feed(chunks) {
  const p = new EventStreamParser();
  const out = [];
  for (const c of chunks) out.push(...p.push(c));
  out.push(...p.end());
  return out;
}

test("event stream: whole body, stops at the terminal event", () => {
  assert.deepEqual(feed([BODY]), EVENTS);
});

test("event stream: split at every byte boundary (inside objects, separators and UTF-8 characters)", () => {
  for (let i = 1; i < BODY.length; i++) {
    assert.deepEqual(feed([BODY.subarray(0, i), BODY.subarray(i)]), EVENTS, `split at byte ${i}`);
  }
});

test("event stream: one byte at a time, and random chunk sizes", () => {
  assert.deepEqual(feed([...BODY].map((b) => Buffer.from([b]))), EVENTS);
  let seed = 7;
  const rnd = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) % 17) + 1;
  for (let round = 0; round < 50; round++) {
    const chunks = [];
    for (let i = 0; i < BODY.length; ) {
      const n = rnd();
      chunks.push(BODY.subarray(i, i + n));
      i += n;
    }
    assert.deepEqual(feed(chunks), EVENTS);
  }
});

test("event stream: CRLF separators, SSE data: framing, comments, a last block without blank line", () => {
  const crlf = EVENTS.map((e) => `${JSON.stringify(e)}\r\n\r\n`).join("");
  assert.deepEqual(feed([crlf]), EVENTS);
  const sse = `: hello\n\n${EVENTS.map((e) => `event: x\ndata: ${JSON.stringify(e)}\n\n`).join("")}`;
  assert.deepEqual(feed([sse]), EVENTS);
  const noTail = `${JSON.stringify(EVENTS[1])}\n\n${JSON.stringify({ type: "execution_complete", execution_time: 5 })}`;
  assert.deepEqual(feed([noTail]), [EVENTS[1], { type: "execution_complete", execution_time: 5 }]);
  assert.deepEqual(parseBlock("not json"), [{ type: "invalid", text: "not json" }]);
});

test("event stream: exit codes and line text", () => {
  assert.deepEqual(exitOf({ type: "execution_complete", execution_time: 3 }), { code: 0, reason: null });
  assert.deepEqual(exitOf({ type: "error", error: { ename: "CommandExecError", evalue: "143" } }), { code: 143, reason: null });
  assert.deepEqual(exitOf({ type: "error", error: { ename: "CommandExecError", evalue: "-1" } }), { code: -1, reason: null });
  const start = exitOf({ type: "error", error: { ename: "CommandExecError", evalue: "chdir /nope: no such file or directory" } });
  assert.equal(start.code, null);
  assert.match(start.reason, /chdir \/nope/);
  assert.equal(exitOf(null).code, null);
  assert.equal(lineText({ type: "stdout", text: "abc" }), "abc\n");
  assert.equal(lineText({ type: "stdout", text: "\n" }), "\n");
});

// -----------------------------------------------------------------------------------------------
// Errors

const BASE = "http://osb.example:8080/v1";

test("errors: a bad or missing API key is E8006 with a configure suggestion", () => {
  for (const [code, rx] of [
    ["INVALID_API_KEY", /rejected the API key/],
    ["MISSING_API_KEY", /requires an API key/],
  ]) {
    const e = lifecycleError(new HttpError(401, { code, message: "nope" }, "", "list sandboxes"), { baseUrl: BASE });
    assert.equal(e.code, 8006);
    assert.equal(e.toJSON().data.abx, "E8006");
    assert.match(e.message, rx);
    assert.match(e.suggestion, /abx provider configure opensandbox api_key=-/);
  }
});

test("errors: an unreachable server is E8006 naming the URL and the cause", () => {
  const refused = Object.assign(new Error("connect ECONNREFUSED"), { code: "ECONNREFUSED" });
  const e = lifecycleError(new NetworkError(`${BASE}/sandboxes`, refused), { baseUrl: BASE });
  assert.equal(e.code, 8006);
  assert.match(e.message, /osb\.example:8080.*unreachable.*connection refused \(ECONNREFUSED\)/);
  assert.match(e.suggestion, /base_url/);
  const dns = lifecycleError(new NetworkError(BASE, Object.assign(new Error("x"), { code: "ENOTFOUND" })), { baseUrl: BASE });
  assert.match(dns.message, /host not found/);
  const slow = lifecycleError(new NetworkError(BASE, new Error("t"), { timeout: true }), { baseUrl: BASE });
  assert.match(slow.message, /no answer in time/);
});

test("errors: 404 about a sandbox is E2009; a missing image is E2005; others keep the server's words", () => {
  const gone = lifecycleError(new HttpError(404, { code: "DOCKER::SANDBOX_NOT_FOUND", message: "Sandbox x not found." }, "", "get sandbox"), { baseUrl: BASE, id: "abc" });
  assert.equal(gone.code, 2009);
  assert.equal(gone.message, "Sandbox 'abc' not found.");
  const img = lifecycleError(new HttpError(500, { code: "DOCKER::SANDBOX_IMAGE_PULL_FAILED", message: "pull access denied" }, "", "create sandbox"), { baseUrl: BASE });
  assert.equal(img.code, 2005);
  const other = lifecycleError(new HttpError(500, { code: "SANDBOX::UNKNOWN_ERROR", message: "disk full" }, "", "get sandbox"), { baseUrl: BASE, id: "abc" });
  assert.equal(other.code, 9001);
  assert.match(other.message, /HTTP 500 SANDBOX::UNKNOWN_ERROR: disk full/);
  assert.equal(errors.sandboxPaused("abc").code, 2002);
  assert.match(errors.sandboxPaused("abc").suggestion, /abx resume abc/);
});

test("errors: every server error shape is understood", () => {
  assert.deepEqual(serverError({ code: "A", message: "b" }), { code: "A", message: "b" });
  assert.deepEqual(serverError({ detail: { code: "A", message: "b" } }), { code: "A", message: "b" });
  assert.deepEqual(serverError({ detail: [{ loc: ["body", "timeout"], msg: "too small" }] }), { code: "VALIDATION_ERROR", message: "body.timeout: too small" });
  assert.deepEqual(serverError({ error: "Unauthorized" }), { code: null, message: "Unauthorized" });
  assert.deepEqual(serverError(null, "plain text"), { code: null, message: "plain text" });
});

test("errors: execd file errors map to E4xxx", () => {
  const h = (status, code, message) => new HttpError(status, { code, message }, "", "op");
  assert.equal(fileError(h(404, "FILE_NOT_FOUND", "file not found"), "/workspace/a").code, 4001);
  assert.equal(fileError(h(500, "RUNTIME_ERROR", "open /x: permission denied"), "/x").code, 4008);
  assert.equal(fileError(h(500, "RUNTIME_ERROR", "remove /x: directory not empty"), "/x").code, 4005);
  assert.equal(fileError(h(500, "RUNTIME_ERROR", "read /x: is a directory"), "/x").code, 4003);
  assert.equal(fileError(h(500, "RUNTIME_ERROR", "something else"), "/x").code, 9001);
});

// -----------------------------------------------------------------------------------------------
// Waiting for asynchronous states

test("waitForState: polls through transitional and unknown states until the wanted one", async () => {
  const states = ["Running", "Pausing", "SomethingNew", "Pausing", "Paused"];
  let calls = 0;
  const sb = await waitForState(async () => ({ id: "x", status: { state: states[calls++] } }), ["Paused"], { interval: [1] });
  assert.equal(sb.status.state, "Paused");
  assert.equal(calls, 5);
});

test("waitForState: a failure state ends the wait with its error; a deadline with E3001", async () => {
  await assert.rejects(
    waitForState(async () => ({ status: { state: "Failed", reason: "ImagePullBackOff", message: "pull failed" } }), ["Running"], { interval: [1] }),
    (e) => e instanceof RpcError && e.code === 2001 && /Failed: pull failed/.test(e.message),
  );
  await assert.rejects(
    waitForState(async () => ({ status: { state: "Failed" } }), ["Running"], { interval: [1], onFail: () => new RpcError(2005, "custom") }),
    (e) => e.code === 2005,
  );
  await assert.rejects(
    waitForState(async () => ({ status: { state: "Pending" } }), ["Running"], { interval: [5], timeoutMs: 30 }),
    (e) => e.code === 3001 && e.lastState === "Pending",
  );
  const ac = new AbortController();
  ac.abort();
  await assert.rejects(waitForState(async () => ({ status: { state: "Pending" } }), ["Running"], { signal: ac.signal }), (e) => e instanceof errors.Cancelled);
});

// -----------------------------------------------------------------------------------------------
// Configuration, paths, helpers

test("config: base_url, domain and protocol give the API base", () => {
  assert.equal(apiBase({ base_url: "http://h:8080" }).api, "http://h:8080/v1");
  assert.equal(apiBase({ base_url: "https://h/v1/" }).api, "https://h/v1");
  assert.equal(apiBase({ base_url: "h:9000" }).api, "http://h:9000/v1");
  assert.equal(apiBase({ domain: "api.example.com", protocol: "https" }).api, "https://api.example.com/v1");
  assert.equal(apiBase({}).api, "http://localhost:8080/v1");
  const c = parseConfig({ base_url: "https://h", image_aliases: "py=python:3.12-slim, node=node:22", entrypoint: '["sleep","infinity"]', platform: "linux/arm64" });
  assert.equal(c.protocol, "https");
  assert.deepEqual(c.entrypoint, ["sleep", "infinity"]);
  assert.deepEqual(c.platform, { os: "linux", arch: "arm64" });
  assert.equal(imageFor(c, "py"), "python:3.12-slim");
  assert.equal(imageFor(c, "ubuntu:24.04"), "ubuntu:24.04");
  assert.equal(imageFor(c, null), "python:3.12-slim");
  assert.deepEqual(parseConfig({ image_aliases: '{"a":"b:1"}' }).aliases, { a: "b:1" });
});

test("config: bad values are E8006 naming the key, never its value", () => {
  for (const [cfg, key] of [
    [{ base_url: "ftp://h" }, "base_url"],
    [{ base_url: "http://user:sekrit-pass@h" }, "base_url"],
    [{ ready_timeout: -1 }, "ready_timeout"],
    [{ network_policy: "{not json" }, "network_policy"],
    [{ platform: "weird" }, "platform"],
    [{ registry_password: "sekrit-pass" }, "registry_username"],
    [{ use_server_proxy: "maybe" }, "use_server_proxy"],
  ]) {
    assert.throws(
      () => parseConfig(cfg),
      (e) => e.code === 8006 && e.message.includes(`'${key}'`) && !e.message.includes("sekrit"),
      JSON.stringify(cfg),
    );
  }
});

test("paths: relative under /workspace, only /workspace and /tmp, '..' cannot leave", () => {
  assert.equal(sandboxPath("a/b.txt"), "/workspace/a/b.txt");
  assert.equal(sandboxPath("/workspace/a/../b"), "/workspace/b");
  assert.equal(sandboxPath("/tmp/x/"), "/tmp/x");
  assert.equal(sandboxPath("/workspace"), "/workspace");
  for (const p of ["/etc/passwd", "/workspace/../../etc/passwd", "../etc/passwd", "/tmpfoo", "/"]) {
    assert.throws(() => sandboxPath(p), (e) => e.code === 4002, p);
  }
});

test("helpers: label-safe metadata, UTF-8 prefixes, signals, quoting, multipart file parts", () => {
  assert.deepEqual(labelSafe({ kit: "test_lifecycle", note: "日本語 ✓", n: 3, "bad key": "x", "opensandbox.io/id": "x" }), { kit: "test_lifecycle" });
  const ee = Buffer.from("éé");
  assert.deepEqual(utf8Prefix(ee.subarray(0, 3), false), { text: "é", used: 2 });
  assert.equal(utf8Prefix(Buffer.from([0xff, 0x00]), false), null);
  assert.deepEqual(parseSignal("TERM", "m"), { name: "TERM", number: 15 });
  assert.deepEqual(parseSignal("SIGKILL", "m"), { name: "KILL", number: 9 });
  assert.deepEqual(parseSignal(2, "m"), { name: "INT", number: 2 });
  assert.throws(() => parseSignal("NOPE", "m"), (e) => e.code === -32602);
  assert.equal(execFileSync("sh", ["-c", `printf %s ${shq("it's $HOME `x` \\ ü")}`]).toString(), "it's $HOME `x` \\ ü");
  const { body, contentType } = multipart([
    { name: "metadata", filename: "metadata.json", contentType: "application/json", data: '{"path":"/workspace/a"}' },
    { name: "file", filename: "file.bin", data: Buffer.from([0, 255]) },
  ]);
  const text = body.toString("latin1");
  assert.match(contentType, /^multipart\/form-data; boundary=/);
  assert.match(text, /name="metadata"; filename="metadata.json"\r\nContent-Type: application\/json/);
  assert.ok(body.includes(Buffer.from([0x0d, 0x0a, 0x0d, 0x0a, 0, 255, 0x0d, 0x0a])));
});

// -----------------------------------------------------------------------------------------------
// The wrapper scripts, run by bash as execd runs them

const hasBash = spawnSync("bash", ["-c", "true"]).status === 0;

test("wrapper (capture): exit codes, signals as 128+n, byte-exact output files, missing programs", { skip: !hasBash }, () => {
  const dir = tempDir("wrap");
  const run = (spec) => spawnSync("bash", ["-c", wrapperScript({ dir: `${dir}/x`, mode: "capture", ...spec })], { cwd: dir });
  let r = run({ command: "printf '\\377\\000x'; echo err >&2; exit 3" });
  assert.equal(r.status, 3);
  assert.match(r.stdout.toString(), /^\u0001abx-pid \d+ \d+\n$/);
  assert.deepEqual([...fs.readFileSync(`${dir}/x/out`)], [0xff, 0, 0x78]);
  assert.equal(fs.readFileSync(`${dir}/x/err`, "utf8"), "err\n");
  r = run({ command: "kill -TERM $$" });
  assert.equal(r.status, 143);
  r = run({ argv: ["printf", "%s-%s", "a b", "c"] });
  assert.equal(r.status, 0);
  assert.equal(fs.readFileSync(`${dir}/x/out`, "utf8"), "a b-c");
  r = run({ argv: ["/no/such/program"] });
  assert.equal(r.status, 127);
  assert.equal(r.stdout.toString(), "\u0001abx-nocmd\n");
  fs.rmSync(dir, { recursive: true, force: true });
});

test("wrapper (stream): stdin chunks are fed in order until eof; uploads may still land after the exit", { skip: !hasBash }, async () => {
  const dir = tempDir("wrap");
  const d = `${dir}/x`;
  const { spawn } = await import("node:child_process");
  const child = spawn("bash", ["-c", wrapperScript({ dir: d, mode: "stream", command: "cat; echo done; exit 4" })]);
  let out = "";
  child.stdout.on("data", (c) => (out += c));
  const exited = new Promise((r) => child.on("exit", (code) => r(code)));
  await new Promise((r) => setTimeout(r, 200));
  // eof and the last chunk land together: the feeder must still copy the chunk first.
  fs.writeFileSync(`${d}/c.0`, "abc\n");
  fs.writeFileSync(`${d}/r.0`, "");
  fs.writeFileSync(`${d}/c.1`, "déf\n");
  fs.writeFileSync(`${d}/r.1`, "");
  fs.writeFileSync(`${d}/eof`, "");
  assert.equal(await exited, 4);
  assert.match(out, /^\u0001abx-pid \d+ \d+\nabc\ndéf\ndone\n$/);
  // The wrapper leaves its directory to the plugin, so a late upload into it cannot fail.
  fs.writeFileSync(`${d}/late`, "");
  fs.rmSync(dir, { recursive: true, force: true });
});

test("wrapper (stream): the command's stderr is its own, without bash's job notices ('[2]+ Done')", { skip: !hasBash }, async () => {
  // A command that ends before the wrapper reaches its `wait` made bash report the finished
  // job on the wrapper's stderr, which is the exec's stderr (a third of the runs did, with a
  // watchdog: one more fork before the wrapper's `wait`).
  const dir = tempDir("wrap");
  try {
    for (let i = 0; i < 30; i++) {
      const d = `${dir}/x${i}`;
      fs.mkdirSync(d);
      fs.writeFileSync(`${d}/eof`, ""); // no input: the feeder ends at once
      const r = spawnSync("bash", ["-c", wrapperScript({ dir: d, mode: "stream", watchdog: 60, command: "echo out; echo err >&2" })]);
      assert.equal(r.status, 0);
      assert.equal(r.stderr.toString(), "err\n", `run ${i}`);
      assert.match(r.stdout.toString(), /^\u0001abx-pid \d+ \d+\nout\n$/);
    }
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

// -----------------------------------------------------------------------------------------------
// The plugin process against the stand-in

const KEY = "osb-unit-key-5f1c2a9b";

async function closedPort() {
  const srv = net.createServer();
  await new Promise((r) => srv.listen(0, "127.0.0.1", r));
  const { port } = srv.address();
  await new Promise((r) => srv.close(r));
  return port;
}

test("plugin: a wrong API key answers E8006, and the key never appears in the reply", async () => {
  const server = await startServer({ apiKey: KEY });
  const plugin = new Plugin();
  try {
    const init = await plugin.start({ base_url: server.url, api_key: "osb-wrong-key-0000" });
    assert.equal(init.result.provider.id, "opensandbox");
    const r = await plugin.request("sandbox/list", {});
    assert.equal(r.error.code, 8006);
    assert.equal(r.error.data.abx, "E8006");
    assert.match(r.error.message, /rejected the API key \(HTTP 401 INVALID_API_KEY\)/);
    assert.ok(!JSON.stringify(r).includes("osb-wrong-key-0000"));
    assert.ok(!plugin.stderr.includes("osb-wrong-key-0000"));
    const c = await plugin.request("sandbox/create", { timeout: 60 });
    assert.equal(c.error.code, 8006);
  } finally {
    await plugin.stop();
    await server.stop();
  }
});

test("plugin: no API key for a server that wants one answers E8006 (MISSING_API_KEY)", async () => {
  const server = await startServer({ apiKey: KEY });
  const plugin = new Plugin();
  try {
    await plugin.start({ base_url: server.url });
    const r = await plugin.request("sandbox/list", {});
    assert.equal(r.error.code, 8006);
    assert.match(r.error.message, /requires an API key/);
  } finally {
    await plugin.stop();
    await server.stop();
  }
});

test("plugin: an unreachable base_url answers E8006 naming it", async () => {
  const port = await closedPort();
  const plugin = new Plugin();
  try {
    await plugin.start({ base_url: `http://127.0.0.1:${port}`, api_key: KEY });
    for (const [method, params] of [
      ["sandbox/list", {}],
      ["sandbox/info", { sandbox: "abc" }],
      ["sandbox/create", { timeout: 60 }],
    ]) {
      const r = await plugin.request(method, params);
      assert.equal(r.error?.code, 8006, method);
      assert.match(r.error.message, new RegExp(`127\\.0\\.0\\.1:${port}/v1 is unreachable: connection refused`), method);
    }
  } finally {
    await plugin.stop();
  }
});

test("plugin: an invalid configuration fails initialize with E8006 naming the key", async () => {
  const plugin = new Plugin();
  try {
    const r = await plugin.start({ base_url: "ftp://nowhere" });
    assert.equal(r.error.code, 8006);
    assert.match(r.error.message, /'base_url'/);
  } finally {
    plugin.child.kill();
    fs.rmSync(plugin.dataDir, { recursive: true, force: true });
  }
});

test("plugin: lifetimes below the server's minimum are enforced by the plugin, across a restart", async () => {
  const server = await startServer({ apiKey: KEY });
  const config = { base_url: server.url, api_key: KEY };
  const data = tempDir("data");
  let plugin = new Plugin({ dataDir: data });
  try {
    await plugin.start(config);
    const sb = await plugin.call("sandbox/create", { timeout: 3, metadata: { note: "日本語 ✓", kit: "ok" } });
    assert.equal(sb.status, "running");
    assert.deepEqual(sb.metadata, { note: "日本語 ✓", kit: "ok" });
    // The server was asked for its minimum (60 s) and only got the label-safe metadata.
    const server0 = await new Lifecycle(parseConfig(config)).get(sb.id);
    assert.ok(Date.parse(server0.expiresAt) - Date.now() > 50000);
    assert.deepEqual(server0.metadata, { kit: "ok" });
    // A restarted plugin still knows abx's lifetime.
    await plugin.stop();
    plugin = new Plugin({ dataDir: data });
    await plugin.start(config);
    const again = await plugin.call("sandbox/connect", { sandbox: sb.id });
    assert.equal(again.expiresAt, sb.expiresAt);
    assert.deepEqual(again.metadata, sb.metadata);
    await new Promise((r) => setTimeout(r, Date.parse(sb.expiresAt) - Date.now() + 1200));
    const gone = await plugin.request("sandbox/info", { sandbox: sb.id });
    assert.equal(gone.error?.code, 2009);
    const list = await plugin.call("sandbox/list", {});
    assert.ok(!list.sandboxes.some((s) => s.id === sb.id));
    await assert.rejects(new Lifecycle(parseConfig(config)).get(sb.id), (e) => e.code === 2009);
  } finally {
    await plugin.stop();
    await server.stop();
    fs.rmSync(data, { recursive: true, force: true });
  }
});

test("plugin: setTimeout shortens abx's lifetime although the server only extends", async () => {
  const server = await startServer({ apiKey: KEY });
  const plugin = new Plugin();
  try {
    await plugin.start({ base_url: server.url, api_key: KEY });
    const sb = await plugin.call("sandbox/create", { timeout: 600 });
    const shorter = await plugin.call("sandbox/setTimeout", { sandbox: sb.id, timeout: 60 });
    const left = (Date.parse(shorter.expiresAt) - Date.now()) / 1000;
    assert.ok(left > 50 && left <= 61, `${left}`);
    const longer = await plugin.call("sandbox/setTimeout", { sandbox: sb.id, timeout: 7200 });
    const srv = await new Lifecycle(parseConfig({ base_url: server.url, api_key: KEY })).get(sb.id);
    assert.equal(Date.parse(srv.expiresAt), Date.parse(longer.expiresAt)); // renewed to the absolute time
    assert.deepEqual(await plugin.call("sandbox/kill", { sandbox: sb.id }), { killed: true });
  } finally {
    await plugin.stop();
    await server.stop();
  }
});

test("plugin: pause and resume wait for the asynchronous states; commands are refused while paused", async () => {
  const server = await startServer({ apiKey: KEY, args: ["--pause-ms", "400"] });
  const plugin = new Plugin();
  try {
    await plugin.start({ base_url: server.url, api_key: KEY });
    const sb = await plugin.call("sandbox/create", { timeout: 120 });
    const t0 = Date.now();
    const p = await plugin.call("sandbox/pause", { sandbox: sb.id });
    assert.equal(p.status, "paused");
    assert.ok(Date.now() - t0 >= 350, "pause answered before the server reached Paused");
    const r = await plugin.request("exec/run", { sandbox: sb.id, command: "echo x" });
    assert.equal(r.error?.code, 2002);
    const again = await plugin.call("sandbox/pause", { sandbox: sb.id }); // 409 from the server: already paused
    assert.equal(again.status, "paused");
    assert.equal((await plugin.call("sandbox/resume", { sandbox: sb.id })).status, "running");
    assert.equal((await plugin.call("exec/run", { sandbox: sb.id, command: "echo x" })).stdout, "x\n");
  } finally {
    await plugin.stop();
    await server.stop();
  }
});

test("plugin: the stream is read up to its terminal event, not until execd closes it", async () => {
  const server = await startServer({ apiKey: KEY, args: ["--linger-ms", "3000"] });
  const cfg = parseConfig({ base_url: server.url, api_key: KEY });
  const life = new Lifecycle(cfg);
  try {
    const created = (await life.create({ image: { uri: "python:3.12-slim" }, entrypoint: ["tail", "-f", "/dev/null"], timeout: 60 }, {})).json;
    await waitForState(() => life.get(created.id), ["Running"], { interval: [20] });
    const ep = await life.endpoint(created.id, 44772);
    const execd = new Execd(ep.url, ep.headers);
    const seen = [];
    const t0 = Date.now();
    const terminal = await execd.command({ command: "echo one; echo two >&2; exit 7" }, { onEvent: (e) => seen.push(e.type) });
    assert.ok(Date.now() - t0 < 1500, `took ${Date.now() - t0} ms: waited for the lingering connection`);
    assert.equal(exitOf(terminal).code, 7);
    assert.deepEqual(seen.filter((t) => t !== "ping").sort(), ["error", "init", "stderr", "stdout"]);
    // Without its execd token the sandbox's endpoint refuses (the plugin passes the endpoint's headers).
    await assert.rejects(new Execd(ep.url, {}).info("/tmp"), (e) => e instanceof HttpError && e.status === 401);
    await life.delete(created.id);
  } finally {
    await server.stop();
  }
});

test("stand-in: an upload whose metadata is not a file part is refused like execd does", async () => {
  const server = await startServer({});
  const cfg = parseConfig({ base_url: server.url });
  const life = new Lifecycle(cfg);
  try {
    const created = (await life.create({ image: { uri: "x:1" }, entrypoint: ["sleep", "1"], timeout: 60 }, {})).json;
    await waitForState(() => life.get(created.id), ["Running"], { interval: [20] });
    const ep = await life.endpoint(created.id, 44772);
    const { call } = await import(lib("http.mjs"));
    const { body, contentType } = multipart([
      { name: "metadata", data: '{"path":"/tmp/a"}', contentType: "application/json" },
      { name: "file", filename: "f", data: "x" },
    ]);
    await assert.rejects(
      call(`${ep.url}/files/upload`, { method: "POST", body, headers: { ...ep.headers, "Content-Type": contentType } }),
      (e) => e instanceof HttpError && e.status === 400 && e.serverCode === "INVALID_FILE_METADATA",
    );
    // Timeouts under the server's minimum are refused with a FastAPI validation error.
    await assert.rejects(
      life.create({ image: { uri: "x:1" }, entrypoint: ["sleep", "1"], timeout: 59 }, {}),
      (e) => e instanceof HttpError && e.status === 422 && /greater than or equal to 60/.test(e.message),
    );
  } finally {
    await server.stop();
  }
});

test("plugin: works with an execd that reports no file type (older versions)", async () => {
  const server = await startServer({ apiKey: KEY, args: ["--no-file-type"] });
  const plugin = new Plugin();
  try {
    await plugin.start({ base_url: server.url, api_key: KEY });
    const sb = await plugin.call("sandbox/create", { timeout: 120 });
    await plugin.call("files/mkdir", { sandbox: sb.id, path: "d/e", parents: true });
    await plugin.call("files/write", { sandbox: sb.id, path: "d/e/f.txt", data: "x" });
    assert.equal((await plugin.call("files/stat", { sandbox: sb.id, path: "d" })).type, "directory");
    assert.equal((await plugin.call("files/stat", { sandbox: sb.id, path: "d/e/f.txt" })).type, "file");
    const l = await plugin.call("files/list", { sandbox: sb.id, path: "d", recursive: true });
    assert.deepEqual(l.entries.map((e) => [e.path, e.type]), [["/workspace/d/e", "directory"], ["/workspace/d/e/f.txt", "file"]]);
    assert.equal((await plugin.request("files/read", { sandbox: sb.id, path: "d" })).error?.code, 4003);
    await plugin.call("sandbox/kill", { sandbox: sb.id });
  } finally {
    await plugin.stop();
    await server.stop();
  }
});

test("plugin: exec/run is byte-exact; exec/start is text by lines (blank lines kept, CR ends a line)", async () => {
  const server = await startServer({ apiKey: KEY });
  const plugin = new Plugin();
  try {
    await plugin.start({ base_url: server.url, api_key: KEY });
    const sb = await plugin.call("sandbox/create", { timeout: 120, env: { FROM_CREATE: "c" } });
    const cmd = "printf 'a\\n\\nb\\r\\nc'; printf \"$FROM_CREATE$FROM_CALL\" >&2";
    const run = await plugin.call("exec/run", { sandbox: sb.id, command: cmd, env: { FROM_CALL: "d" } });
    assert.deepEqual([run.stdout, run.stderr, run.exitCode], ["a\n\nb\r\nc", "cd", 0]);
    const { execId } = await plugin.call("exec/start", { sandbox: sb.id, command: cmd, env: { FROM_CALL: "d" } });
    const deadline = Date.now() + 10000;
    while (!plugin.notes.some((n) => n.method === "exec/exit" && n.params.execId === execId) && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 20));
    }
    const mine = plugin.notes.filter((n) => n.params?.execId === execId);
    const text = (stream) => mine.filter((n) => n.method === "exec/output" && n.params.stream === stream).map((n) => n.params.data).join("");
    assert.equal(text("stdout"), "a\n\nb\nc\n");
    assert.equal(text("stderr"), "cd\n");
    assert.deepEqual(mine.filter((n) => n.method === "exec/exit").map((n) => n.params.exitCode), [0]);
    assert.equal(mine.at(-1).method, "exec/exit");
    const gone = await plugin.request("exec/run", { sandbox: sb.id, argv: ["/no/such/program"] });
    assert.equal(gone.error?.code, 3003);
    const nocwd = await plugin.request("exec/run", { sandbox: sb.id, command: "true", cwd: "/workspace/nope" });
    assert.equal(nocwd.error?.code, 3003);
    await plugin.call("sandbox/kill", { sandbox: sb.id });
  } finally {
    await plugin.stop();
    await server.stop();
  }
});
