// What a real OpenSandbox deployment does that a naive stand-in hides (issue 21), each case
// against the stand-in made to behave the same way (node --test):
//   - execd's /files/mv refuses an existing destination (upload overwrites): writes over an
//     existing file, offset writes and renames onto an existing file must still work;
//   - a missing working directory is a 400 before any stream: E3003;
//   - sandboxes made directly on the server have no /workspace;
//   - a connection lost while the output of exec/run is fetched is E8006, never an internal
//     error with a stack trace;
//   - with docker network_mode = "host" every sandbox shares one execd: refused with E8006
//     naming the shared endpoint instead of running commands in the wrong sandbox.

import { test } from "node:test";
import assert from "node:assert/strict";
import { Plugin, lib, startGateway, startServer } from "./helpers.mjs";

const { HttpError } = await import(lib("errors.mjs"));
const { waitForState, Execd, Lifecycle } = await import(lib("opensandbox.mjs"));
const { parseConfig } = await import(lib("config.mjs"));

const KEY = "osb-quirks-key-7d3e1a0c";

// A sandbox made on the server directly (not through abx), and its execd.
async function rawSandbox(url) {
  const life = new Lifecycle(parseConfig({ base_url: url, api_key: KEY }));
  const created = (await life.create({ image: { uri: "python:3.12-slim" }, entrypoint: ["tail", "-f", "/dev/null"], timeout: 120 }, {})).json;
  await waitForState(() => life.get(created.id), ["Running"], { interval: [20] });
  const ep = await life.endpoint(created.id, 44772);
  return { id: created.id, life, execd: new Execd(ep.url, ep.headers) };
}

async function withPlugin(serverArgs, fn, { via = null } = {}) {
  const server = await startServer({ apiKey: KEY, args: serverArgs });
  const gw = via ? await via(server) : null;
  const plugin = new Plugin();
  try {
    await plugin.start({ base_url: gw?.url ?? server.url, api_key: KEY });
    await fn({ plugin, server, gw });
  } finally {
    await plugin.stop();
    await gw?.stop();
    await server.stop();
  }
}

test("stand-in: /files/mv refuses an existing destination like execd; /files/upload overwrites", async () => {
  const server = await startServer({ apiKey: KEY });
  try {
    const { execd } = await rawSandbox(server.url);
    await execd.upload([{ path: "/tmp/a", data: Buffer.from("a") }, { path: "/tmp/b", data: Buffer.from("b") }]);
    await assert.rejects(
      execd.move("/tmp/a", "/tmp/b"),
      (e) => e instanceof HttpError && e.status === 500 && e.serverCode === "RUNTIME_ERROR" && e.serverMessage === "error accessing file: destination path already exists: /tmp/b",
    );
    await assert.rejects(execd.move("/tmp/nope", "/tmp/c"), (e) => e instanceof HttpError && e.status === 404 && e.serverCode === "FILE_NOT_FOUND");
    await execd.upload([{ path: "/tmp/b", data: Buffer.from("new") }]);
    assert.equal((await execd.download("/tmp/b")).data.toString(), "new");
    await execd.move("/tmp/a", "/tmp/d/e"); // the destination's directory is made
    assert.equal((await execd.download("/tmp/d/e")).data.toString(), "a");
    // A missing cwd is refused before the stream starts.
    await assert.rejects(
      execd.command({ command: "true", cwd: "/workspace/nope" }),
      (e) => e instanceof HttpError && e.status === 400 && /working directory does not exist: \/workspace\/nope/.test(e.serverMessage),
    );
  } finally {
    await server.stop();
  }
});

test("plugin: whole-file writes, offset writes and renames replace existing files", async () => {
  await withPlugin([], async ({ plugin }) => {
    const sb = await plugin.call("sandbox/create", { timeout: 120 });
    const read = async (p) => (await plugin.call("files/read", { sandbox: sb.id, path: p })).data;
    await plugin.call("files/write", { sandbox: sb.id, path: "a.txt", data: "one", mode: 0o600 });
    assert.deepEqual(await plugin.call("files/write", { sandbox: sb.id, path: "a.txt", data: "two!" }), { size: 4 });
    assert.equal(await read("a.txt"), "two!");
    assert.equal((await plugin.call("files/stat", { sandbox: sb.id, path: "a.txt" })).mode, "0600", "an existing file keeps its mode");
    // In place, inside the file (read, patched, written back whole).
    assert.deepEqual(await plugin.call("files/write", { sandbox: sb.id, path: "a.txt", data: "XY", offset: 1 }), { size: 4 });
    assert.equal(await read("a.txt"), "tXY!");
    // Past the end of an existing file.
    assert.deepEqual(await plugin.call("files/write", { sandbox: sb.id, path: "a.txt", data: "Z", offset: 6 }), { size: 7 });
    assert.equal((await plugin.call("files/read", { sandbox: sb.id, path: "a.txt", encoding: "base64" })).data, Buffer.from("tXY!\0\0Z").toString("base64"));
    // Rename onto an existing file replaces it.
    await plugin.call("files/write", { sandbox: sb.id, path: "b.txt", data: "bee" });
    await plugin.call("files/rename", { sandbox: sb.id, from: "b.txt", to: "a.txt" });
    assert.equal(await read("a.txt"), "bee");
    assert.equal((await plugin.request("files/stat", { sandbox: sb.id, path: "b.txt" })).error?.code, 4001);
    // No temporary files are left behind.
    const names = (await plugin.call("files/list", { sandbox: sb.id })).entries.map((e) => e.name);
    assert.deepEqual(names, ["a.txt"]);
    // A file onto a directory, and a directory onto a file or a non-empty directory, are refused.
    await plugin.call("files/mkdir", { sandbox: sb.id, path: "d" });
    await plugin.call("files/write", { sandbox: sb.id, path: "d/x", data: "x" });
    assert.equal((await plugin.request("files/rename", { sandbox: sb.id, from: "a.txt", to: "d" })).error?.code, 4003);
    assert.equal((await plugin.request("files/rename", { sandbox: sb.id, from: "d", to: "a.txt" })).error?.code, 4004);
    await plugin.call("files/mkdir", { sandbox: sb.id, path: "e" });
    await plugin.call("files/write", { sandbox: sb.id, path: "e/y", data: "y" });
    assert.equal((await plugin.request("files/rename", { sandbox: sb.id, from: "e", to: "d" })).error?.code, 4005);
    // A directory onto an empty directory replaces it, like rename(2).
    await plugin.call("files/mkdir", { sandbox: sb.id, path: "f" });
    await plugin.call("files/rename", { sandbox: sb.id, from: "e", to: "f" });
    assert.equal(await read("f/y"), "y");
    await plugin.call("sandbox/kill", { sandbox: sb.id });
  });
});

test("plugin: a missing working directory is E3003 for exec/run and exec/start", async () => {
  await withPlugin([], async ({ plugin }) => {
    const sb = await plugin.call("sandbox/create", { timeout: 120 });
    for (const method of ["exec/run", "exec/start"]) {
      const r = await plugin.request(method, { sandbox: sb.id, command: "true", cwd: "/workspace/nope" });
      assert.equal(r.error?.code, 3003, `${method}: ${JSON.stringify(r)}`);
      assert.match(r.error.message, /working directory '\/workspace\/nope' does not exist/);
      assert.match(r.error.data.suggestion, /mkdir/);
    }
    await plugin.call("files/write", { sandbox: sb.id, path: "f", data: "" });
    const notDir = await plugin.request("exec/run", { sandbox: sb.id, command: "true", cwd: "f" });
    assert.equal(notDir.error?.code, 3003);
    assert.match(notDir.error.message, /'\/workspace\/f' is not a directory/);
    await plugin.call("sandbox/kill", { sandbox: sb.id });
  });
});

test("plugin: a sandbox made directly on the server (no /workspace) runs commands and takes files", async () => {
  await withPlugin([], async ({ plugin, server }) => {
    const raw = await rawSandbox(server.url);
    await assert.rejects(raw.execd.info("/workspace"), (e) => e instanceof HttpError && e.status === 404);
    // (exec/run output is the bytes of files, which the stand-in does not map back to
    // container paths: what lands where shows the working directory)
    const run = await plugin.call("exec/run", { sandbox: raw.id, command: "printf x > here" });
    assert.equal(run.exitCode, 0);
    assert.equal((await raw.execd.download("/workspace/here")).data.toString(), "x");
    const { execId } = await plugin.call("exec/start", { sandbox: raw.id, command: "pwd" });
    const deadline = Date.now() + 10000;
    while (!plugin.notes.some((n) => n.method === "exec/exit" && n.params.execId === execId) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    assert.equal(plugin.notes.filter((n) => n.method === "exec/output" && n.params.execId === execId).map((n) => n.params.data).join(""), "/workspace\n");
    await raw.life.delete(raw.id);
    // A sandbox of abx's whose /workspace was removed: the default working directory is made again.
    const sb = await plugin.call("sandbox/create", { timeout: 120 });
    assert.equal((await plugin.call("exec/run", { sandbox: sb.id, command: "rm -rf /workspace", cwd: "/tmp" })).exitCode, 0);
    assert.equal((await plugin.request("files/stat", { sandbox: sb.id, path: "/workspace" })).error?.code, 4001);
    assert.equal((await plugin.call("exec/run", { sandbox: sb.id, command: "printf y > again" })).exitCode, 0);
    assert.equal((await plugin.call("files/read", { sandbox: sb.id, path: "again" })).data, "y");
    await plugin.call("sandbox/kill", { sandbox: sb.id });
  });
  // files/write first, in a fresh plugin process (the workspace is made on first use).
  await withPlugin([], async ({ plugin, server }) => {
    const raw = await rawSandbox(server.url);
    assert.deepEqual(await plugin.call("files/write", { sandbox: raw.id, path: "a.txt", data: "hi" }), { size: 2 });
    assert.equal((await raw.execd.download("/workspace/a.txt")).data.toString(), "hi");
    await raw.life.delete(raw.id);
  });
});

test("plugin: a connection lost while exec/run output is fetched is E8006, without a stack trace", async () => {
  let refuse = false;
  await withPlugin(
    [],
    async ({ plugin, gw }) => {
      const sb = await plugin.call("sandbox/create", { timeout: 120 });
      refuse = true; // the server's host goes away when the output is downloaded
      const r = await plugin.request("exec/run", { sandbox: sb.id, command: "echo hi" });
      assert.ok(gw.closed, "the gateway went away during the call");
      assert.equal(r.error?.code, 8006, JSON.stringify(r));
      assert.equal(r.error.data.abx, "E8006");
      assert.match(r.error.message, /unreachable: connection (refused|reset)/);
      assert.ok(r.error.data.suggestion.length > 0);
      assert.doesNotMatch(plugin.stderr, /internal error|    at /i);
    },
    { via: (server) => startGateway(server.url, { refuseWhen: (req) => refuse && req.url.includes("/files/download") }) },
  );
});

test("plugin: sandboxes that share one execd (docker network_mode = host) are refused with E8006", async () => {
  for (const proxy of [false, true]) {
    const server = await startServer({ apiKey: KEY, args: ["--host-network"] });
    const plugin = new Plugin();
    try {
      await plugin.start({ base_url: server.url, api_key: KEY, use_server_proxy: proxy });
      const a = await plugin.call("sandbox/create", { timeout: 120 });
      await plugin.call("files/write", { sandbox: a.id, path: "mine", data: "a" });
      const b = await plugin.request("sandbox/create", { timeout: 120 });
      assert.equal(b.error?.code, 8006, `proxy=${proxy}: ${JSON.stringify(b)}`);
      assert.match(b.error.message, new RegExp(`shares one execd with sandbox '${a.id}'`));
      assert.match(b.error.message, /network_mode/);
      assert.match(b.error.data.suggestion, /one sandbox at a time/);
      // The refused sandbox was not left behind, and the first one still works.
      const list = await plugin.call("sandbox/list", {});
      assert.deepEqual(list.sandboxes.map((s) => s.id), [a.id]);
      assert.equal((await plugin.call("exec/run", { sandbox: a.id, command: "cat mine" })).stdout, "a");
      // Once the first is gone, a new one works.
      await plugin.call("sandbox/kill", { sandbox: a.id });
      const c = await plugin.call("sandbox/create", { timeout: 120 });
      assert.equal((await plugin.call("exec/run", { sandbox: c.id, command: "echo ok" })).stdout, "ok\n");
      await plugin.call("sandbox/kill", { sandbox: c.id });
    } finally {
      await plugin.stop();
      await server.stop();
    }
  }
});
