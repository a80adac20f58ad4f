// What a real OpenSandbox server showed (issue 45, "OpenSandbox plugin (real server)"), each
// case against the stand-in made to behave the same way (node --test):
//   1. a sandbox killed while a command runs: the stream breaks before the DELETE ends and the
//      server shows the sandbox as Failed meanwhile; the command must end as killed (137,
//      SIGKILL), later calls E2009; only Paused is "paused" (E2002 "Resume it first");
//   2. a signal that reaches execd's command session (execd relays the signals it gets, and
//      its interrupt sends TERM, to the wrapper's process group) must reach the user's command,
//      which ends with 128+n and the signal's name, never -1, its output not cut;
//   4. sandbox/changed for what changed on the server without the broker (poll_interval);
//   5. behind the server's proxy, an unreachable execd (HTTP 502 BACKEND_CONNECTION_FAILED) is
//      E8006, as it is directly;
//   6. provider/doctor reports an unreachable server with its URL (never the API key).

import { test } from "node:test";
import assert from "node:assert/strict";
import { Plugin, lib, startServer } from "./helpers.mjs";

const { notRunning } = await import(lib("errors.mjs"));
const { waitForState, Lifecycle } = await import(lib("opensandbox.mjs"));
const { parseConfig } = await import(lib("config.mjs"));

const KEY = "osb-findings-key-51c9e2aa";
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function withPlugin(fn, { serverArgs = [], config = {} } = {}) {
  const server = await startServer({ apiKey: KEY, args: serverArgs });
  const plugin = new Plugin();
  try {
    const r = await plugin.start({ base_url: server.url, api_key: KEY, poll_interval: 0, ...config });
    assert.equal(r.error, undefined, JSON.stringify(r.error));
    await fn({ plugin, server });
  } finally {
    await plugin.stop();
    await server.stop();
  }
}

async function until(what, pred, ms = 15000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await pred();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(25);
  }
}

// Output of an exec/start so far, and its exec/exit once there.
const outputOf = (plugin, execId) =>
  plugin.notes.filter((n) => n.method === "exec/output" && n.params.execId === execId).map((n) => n.params.data).join("");
const exitOf = (plugin, execId) => plugin.notes.find((n) => n.method === "exec/exit" && n.params.execId === execId)?.params;

async function standin(server, path) {
  const r = await fetch(`${server.url}/_standin/sandboxes/${path}`, { method: "POST" });
  const text = await r.text();
  assert.equal(r.status, 200, text);
  return JSON.parse(text);
}

const life = (server) => new Lifecycle(parseConfig({ base_url: server.url, api_key: KEY }));

// ---------------------------------------------------------------------------------------------
// 1. Killing a sandbox while a command runs

test("stand-in: a DELETE cuts the streams first and shows Failed until it is done, then 404", async () => {
  const server = await startServer({ apiKey: KEY, args: ["--delete-ms", "400"] });
  try {
    const l = life(server);
    const sb = (await l.create({ image: { uri: "python:3.12-slim" }, entrypoint: ["tail", "-f", "/dev/null"], timeout: 120 }, {})).json;
    await waitForState(() => l.get(sb.id), ["Running"], { interval: [20] });
    const del = l.delete(sb.id);
    await sleep(100);
    assert.equal((await l.get(sb.id)).status.state, "Failed");
    assert.equal(await del, true);
    await assert.rejects(l.get(sb.id), (e) => e.code === 2009);
  } finally {
    await server.stop();
  }
});

test("1: a sandbox killed while exec/start runs: the command ends as killed (137, SIGKILL), later calls E2009", async () => {
  await withPlugin(
    async ({ plugin, server }) => {
      const sb = await plugin.call("sandbox/create", { timeout: 120 });
      const { execId } = await plugin.call("exec/start", { sandbox: sb.id, command: "echo ready; sleep 30" });
      await until("ready", () => outputOf(plugin, execId).includes("ready"));
      const run = plugin.request("exec/run", { sandbox: sb.id, command: "sleep 30" });
      await until("exec/run running", async () => (await standin(server, `${sb.id}/commands`)).running >= 2);
      assert.deepEqual(await plugin.call("sandbox/kill", { sandbox: sb.id }), { killed: true });
      const exit = await until("exec/exit", () => exitOf(plugin, execId));
      assert.equal(exit.exitCode, 137, JSON.stringify(exit));
      assert.equal(exit.signal, "SIGKILL");
      assert.equal(exit.error, undefined, `no error: ${exit.error}`);
      const r = await run;
      assert.equal(r.error, undefined, JSON.stringify(r.error));
      assert.equal(r.result.exitCode, 137);
      assert.equal(r.result.signal, "SIGKILL");
      for (const [method, params] of [
        ["sandbox/info", { sandbox: sb.id }],
        ["exec/run", { sandbox: sb.id, command: "true" }],
        ["files/list", { sandbox: sb.id }],
      ]) {
        const e = (await plugin.request(method, params)).error;
        assert.equal(e?.data?.abx, "E2009", `${method}: ${JSON.stringify(e)}`);
      }
    },
    { serverArgs: ["--delete-ms", "500"] },
  );
});

test("1: a sandbox deleted on the server while a command runs: killed (137), then E2009, never 'Resume it first'", async () => {
  await withPlugin(
    async ({ plugin, server }) => {
      const sb = await plugin.call("sandbox/create", { timeout: 120 });
      const { execId } = await plugin.call("exec/start", { sandbox: sb.id, command: "echo ready; sleep 30" });
      await until("ready", () => outputOf(plugin, execId).includes("ready"));
      const del = life(server).delete(sb.id);
      const exit = await until("exec/exit", () => exitOf(plugin, execId));
      assert.equal(exit.exitCode, 137, JSON.stringify(exit));
      assert.equal(exit.signal, "SIGKILL");
      // While the delete runs the server says Failed: E2002 that does not say "Resume".
      const during = (await plugin.request("exec/run", { sandbox: sb.id, command: "true" })).error;
      assert.ok(["E2002", "E2009"].includes(during?.data?.abx), JSON.stringify(during));
      assert.doesNotMatch(`${during.message} ${during.data.suggestion}`, /resume/i);
      await del;
      const after = (await plugin.request("exec/run", { sandbox: sb.id, command: "true" })).error;
      assert.equal(after?.data?.abx, "E2009", JSON.stringify(after));
    },
    { serverArgs: ["--delete-ms", "1500"] },
  );
});

test("1: server states map to E-codes: only Paused says 'Resume it first'", () => {
  const at = (state, extra = {}) => notRunning("sb1", { status: { state, ...extra } });
  for (const s of ["Paused", "Pausing"]) {
    const e = at(s);
    assert.equal(e.abx, "E2002");
    assert.match(e.suggestion, /Resume it first/);
  }
  const failed = at("Failed", { reason: "CONTAINER_EXITED", message: "exit 137" });
  assert.equal(failed.abx, "E2002");
  assert.match(failed.message, /has failed \(CONTAINER_EXITED: exit 137\)/);
  assert.doesNotMatch(failed.suggestion, /resume/i);
  assert.match(failed.suggestion, /abx kill sb1/);
  for (const s of ["Terminated", "Stopping"]) assert.equal(at(s).abx, "E2009");
  for (const s of ["Pending", "Resuming"]) {
    const e = at(s);
    assert.equal(e.abx, "E2002");
    assert.match(e.message, /not running yet/);
    assert.doesNotMatch(e.suggestion, /Resume it first/);
  }
  const odd = at("Hibernating");
  assert.equal(odd.abx, "E2002");
  assert.match(odd.message, /state 'Hibernating'/);
  assert.doesNotMatch(odd.suggestion, /Resume it first/);
});

// ---------------------------------------------------------------------------------------------
// 2. Signals reach the user's command

test("2: exec/kill TERM reaches the command: its trap runs, its output is complete, its exit is its own", async () => {
  await withPlugin(async ({ plugin }) => {
    const sb = await plugin.call("sandbox/create", { timeout: 120 });
    const { execId } = await plugin.call("exec/start", {
      sandbox: sb.id,
      command: "trap 'echo cleanup; exit 3' TERM; echo ready; while :; do sleep 0.1; done",
    });
    await until("ready", () => outputOf(plugin, execId).includes("ready"));
    await plugin.call("exec/kill", { execId, signal: "TERM" });
    const exit = await until("exec/exit", () => exitOf(plugin, execId));
    assert.equal(exit.exitCode, 3, JSON.stringify(exit));
    // (the command's own sh may say "Terminated" for its sleep, killed with it)
    assert.match(outputOf(plugin, execId), /^ready\n(.*\n)?cleanup\n$/);
    // A command without a trap: 128+15 and the name.
    const b = await plugin.call("exec/start", { sandbox: sb.id, command: "echo ready; sleep 30" });
    await until("ready", () => outputOf(plugin, b.execId).includes("ready"));
    await plugin.call("exec/kill", { execId: b.execId, signal: "INT" });
    const e2 = await until("exec/exit", () => exitOf(plugin, b.execId));
    assert.equal(e2.exitCode, 130, JSON.stringify(e2));
    assert.equal(e2.signal, "SIGINT");
  });
});

test("2: a signal to execd's command session (the wrapper's group) reaches the command: 128+n and its name, never -1", async () => {
  await withPlugin(async ({ plugin, server }) => {
    const sb = await plugin.call("sandbox/create", { timeout: 120 });
    // A command that cleans up on TERM: its output is not cut, its exit is its own.
    const a = await plugin.call("exec/start", {
      sandbox: sb.id,
      command: "trap 'echo cleanup; exit 3' TERM; echo ready; while :; do sleep 0.1; done",
    });
    await until("ready", () => outputOf(plugin, a.execId).includes("ready"));
    // One without a trap, whose pid is recorded to see that it is gone afterwards.
    const b = await plugin.call("exec/start", { sandbox: sb.id, command: "echo $$ > /tmp/b.pid; echo ready; exec sleep 30" });
    await until("ready", () => outputOf(plugin, b.execId).includes("ready"));
    const run = plugin.request("exec/run", { sandbox: sb.id, command: "sleep 30; echo never" });
    await until("exec/run running", async () => (await standin(server, `${sb.id}/commands`)).running >= 3);
    assert.ok((await standin(server, `${sb.id}/signal-commands?signal=TERM`)).signalled >= 3);
    const ea = await until("exec/exit a", () => exitOf(plugin, a.execId));
    assert.equal(ea.exitCode, 3, JSON.stringify(ea));
    assert.match(outputOf(plugin, a.execId), /^ready\n(.*\n)?cleanup\n$/);
    const eb = await until("exec/exit b", () => exitOf(plugin, b.execId));
    assert.deepEqual([eb.exitCode, eb.signal], [143, "SIGTERM"], JSON.stringify(eb));
    const reply = await run;
    assert.ok(reply.result, `exec/run answered ${JSON.stringify(reply)}`);
    const r = reply.result;
    assert.deepEqual([r.exitCode, r.signal, r.stdout], [143, "SIGTERM", ""], JSON.stringify(r));
    const alive = await plugin.call("exec/run", { sandbox: sb.id, command: "kill -0 $(cat /tmp/b.pid) 2>/dev/null && echo alive || echo gone" });
    assert.equal(alive.stdout, "gone\n");
  });
});

test("2: a command session killed outright (execd's context cancelled): 137 SIGKILL, never -1, and the command is gone", async () => {
  await withPlugin(async ({ plugin, server }) => {
    const sb = await plugin.call("sandbox/create", { timeout: 120 });
    const b = await plugin.call("exec/start", { sandbox: sb.id, command: "echo $$ > /tmp/k.pid; echo ready; exec sleep 30" });
    await until("ready", () => outputOf(plugin, b.execId).includes("ready"));
    await standin(server, `${sb.id}/signal-commands?signal=KILL`);
    const eb = await until("exec/exit", () => exitOf(plugin, b.execId));
    assert.deepEqual([eb.exitCode, eb.signal], [137, "SIGKILL"], JSON.stringify(eb));
    await until("the command to be killed", async () => {
      const r = await plugin.call("exec/run", { sandbox: sb.id, command: "kill -0 $(cat /tmp/k.pid) 2>/dev/null && echo alive || echo gone" });
      return r.stdout === "gone\n";
    }, 5000);
  });
});

// ---------------------------------------------------------------------------------------------
// 4. sandbox/changed

test("4: sandbox/changed reports what changed on the server without the broker (poll_interval)", async () => {
  await withPlugin(
    async ({ plugin, server }) => {
      const changes = () => plugin.notes.filter((n) => n.method === "sandbox/changed").map((n) => n.params);
      const seen = (id, change) => changes().find((c) => c.sandbox === id && c.change === change);
      const l = life(server);
      const early = await plugin.call("sandbox/create", { timeout: 120 }); // while the first poll may run
      await sleep(400); // the first poll: what is there already is not "created"
      // The broker's own calls are the broker's to report.
      const mine = await plugin.call("sandbox/create", { timeout: 120 });
      await plugin.call("sandbox/pause", { sandbox: mine.id });
      await plugin.call("sandbox/resume", { sandbox: mine.id });
      // Made, paused, resumed and deleted on the server directly.
      const other = (await l.create({ image: { uri: "python:3.12-slim" }, entrypoint: ["tail", "-f", "/dev/null"], timeout: 120 }, {})).json;
      const created = await until("created", () => seen(other.id, "created"));
      assert.equal(created.sandboxInfo?.id, other.id);
      await waitForState(() => l.get(other.id), ["Running"], { interval: [20] });
      await l.pause(other.id);
      await until("paused", () => seen(other.id, "paused"));
      await l.resume(other.id);
      await until("resumed", () => seen(other.id, "resumed"));
      await l.delete(other.id);
      await until("killed", () => seen(other.id, "killed"));
      // A lifetime that ends: the plugin deletes the sandbox and says so, once.
      const short = await plugin.call("sandbox/create", { timeout: 120 });
      await plugin.call("sandbox/setTimeout", { sandbox: short.id, timeout: 1 }); // the broker reports this
      await until("expired", () => seen(short.id, "expired"), 10000);
      await plugin.call("sandbox/kill", { sandbox: mine.id });
      await sleep(800);
      assert.deepEqual(changes().filter((c) => c.sandbox === early.id), []);
      assert.deepEqual(
        changes().filter((c) => c.sandbox === mine.id),
        [],
        "no report for the broker's own create, pause, resume and kill",
      );
      assert.deepEqual(changes().filter((c) => c.sandbox === short.id).map((c) => c.change), ["expired"]);
      assert.deepEqual(changes().filter((c) => c.sandbox === other.id).map((c) => c.change), ["created", "paused", "resumed", "killed"]);
    },
    { config: { poll_interval: 0.2 } },
  );
});

test("4: poll_interval is declared with a default, and 0 turns polling off", async () => {
  const fs = await import("node:fs");
  const manifest = fs.readFileSync(lib("../abx-provider.toml"), "utf8");
  assert.match(manifest, /\[config\.poll_interval\]\ndescription = "[^"]+"\ndefault = 10\n/);
  assert.equal(parseConfig({}).pollIntervalMs, 10000);
  assert.equal(parseConfig({ poll_interval: 0 }).pollIntervalMs, 0);
  assert.throws(() => parseConfig({ poll_interval: -1 }), (e) => e.code === 8006 && /poll_interval/.test(e.message));
  await withPlugin(async ({ plugin, server }) => {
    const l = life(server);
    await l.create({ image: { uri: "python:3.12-slim" }, entrypoint: ["tail", "-f", "/dev/null"], timeout: 120 }, {});
    await sleep(600);
    assert.equal(plugin.notes.filter((n) => n.method === "sandbox/changed").length, 0);
  });
});

// ---------------------------------------------------------------------------------------------
// 5. An unreachable execd, directly and through the server's proxy

for (const proxy of [false, true]) {
  test(`5: an execd that does not answer is E8006 with a suggestion (${proxy ? "through the server's proxy: HTTP 502 BACKEND_CONNECTION_FAILED" : "direct"})`, async () => {
    await withPlugin(
      async ({ plugin, server }) => {
        const sb = await plugin.call("sandbox/create", { timeout: 120 });
        await standin(server, `${sb.id}/execd?listening=false`);
        if (proxy) {
          const r = await fetch(`${server.url}/v1/sandboxes/${sb.id}/proxy/44772/ping`);
          assert.equal(r.status, 502);
          assert.equal((await r.json()).code, "BACKEND_CONNECTION_FAILED");
        }
        for (const [method, params] of [
          ["exec/run", { sandbox: sb.id, command: "true" }],
          ["files/read", { sandbox: sb.id, path: "a.txt" }],
        ]) {
          const e = (await plugin.request(method, params)).error;
          assert.equal(e?.data?.abx, "E8006", `${method}: ${JSON.stringify(e)}`);
          assert.match(e.message, /execd of sandbox .* is unreachable/);
          if (proxy) assert.match(e.message, /502 BACKEND_CONNECTION_FAILED/);
          assert.ok(e.data.suggestion.length > 20, e.data.suggestion);
          assert.ok(!JSON.stringify(e).includes(KEY));
        }
        await standin(server, `${sb.id}/execd?listening=true`);
        assert.equal((await plugin.call("exec/run", { sandbox: sb.id, command: "echo back" })).stdout, "back\n");
      },
      { config: { use_server_proxy: proxy } },
    );
  });
}

// ---------------------------------------------------------------------------------------------
// 6. provider/doctor

test("6: provider/doctor checks that the server answers, names its URL, never the key", async () => {
  const server = await startServer({ apiKey: KEY });
  const plugin = new Plugin();
  try {
    await plugin.start({ base_url: server.url, api_key: KEY, poll_interval: 0 });
    const ok = await plugin.call("provider/doctor", {});
    assert.equal(ok.ok, true, JSON.stringify(ok));
    assert.equal(ok.checks[0].name, "server");
    assert.match(ok.checks[0].detail, new RegExp(`${server.url}/v1 answers`));
    await server.stop();
    const down = await plugin.call("provider/doctor", {});
    assert.equal(down.ok, false);
    assert.equal(down.checks[0].ok, false);
    assert.equal(down.checks[0].code, "E8006");
    assert.match(down.checks[0].detail, new RegExp(`${server.url}/v1 is unreachable: connection refused`));
    assert.ok(!JSON.stringify(down).includes(KEY));
  } finally {
    await plugin.stop();
    await server.stop();
  }
  // A key the server refuses.
  const s2 = await startServer({ apiKey: KEY });
  const p2 = new Plugin();
  try {
    await p2.start({ base_url: s2.url, api_key: "wrong-key-123", poll_interval: 0 });
    const bad = await p2.call("provider/doctor", {});
    assert.equal(bad.ok, false);
    assert.match(bad.checks[0].detail, /rejected the API key/);
    assert.ok(!JSON.stringify(bad).includes("wrong-key-123"));
  } finally {
    await p2.stop();
    await s2.stop();
  }
});
