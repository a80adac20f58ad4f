// One daemon per data dir, found from every context (issue 41), against the real binaries: a
// temp HOME (no ABX_HOME), a shell context (HOME and XDG_RUNTIME_DIR, the real abx of ABX_BIN)
// and an SDK context like an MCP host's (only HOME, PATH, SHELL and TERM: the SDK reads the
// `env` option, not this process's), in both directions. Every daemon started here is stopped
// at the end (`abx broker stop` in its context) and the temp-dir fallback runtime dirs it made
// (`/tmp/abx-<uid>/<key>`) are removed.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { afterEach, describe, test } from 'node:test';
import * as sdk from '../dist/esm/index.js';
import { ABX_BIN } from './helpers.mjs';

const { BrokerClient, brokerPaths, dataKey, resolveSocket, socketPath } = sdk;
const UID = process.geteuid();

/** The fallback key as the shell computes it: `printf %s PATH | sha256sum | cut -c1-16`. */
function sha256sumKey(p) {
  return execFileSync('sh', ['-c', 'printf %s "$1" | sha256sum | cut -c1-16', 'sh', p], { encoding: 'utf8' }).trim();
}

/** The temp-dir runtime dir of a data dir, for a context without TMPDIR. */
const fallbackDir = (dataDir) => `/tmp/abx-${UID}/${sha256sumKey(dataDir)}`;

let dirs = [];
let contexts = [];

function newHome() {
  const d = fs.mkdtempSync(path.join(process.env.TMPDIR || os.tmpdir(), 'abx-home-'));
  dirs.push(d);
  return d;
}

function newXdg(home) {
  const d = path.join(home, 'xdg');
  fs.mkdirSync(d, { mode: 0o700 });
  return d;
}

/** A process environment: a HOME, with or without XDG_RUNTIME_DIR, nothing else of ours. */
function context(home, xdg) {
  const env = { HOME: home, PATH: process.env.PATH || '/usr/bin:/bin', SHELL: '/bin/sh', TERM: 'dumb' };
  if (xdg !== undefined) env.XDG_RUNTIME_DIR = xdg;
  const c = {
    home,
    env,
    dataDir: path.join(home, '.local/share/abx'),
    abx: (...args) => JSON.parse(execFileSync(ABX_BIN, ['-j', ...args], { env, cwd: home, encoding: 'utf8' })),
    /** What the SDK finds and the `broker/status` of the daemon it reaches (no start unless told). */
    async sdk(autoStart = false) {
      const client = await BrokerClient.connect({ mode: 'socket', env, abxPath: ABX_BIN, autoStart });
      try {
        const st = await client.status();
        return { label: client.label, pid: st.pid, dataDir: st.dataDir, socket: st.socket };
      } finally {
        await client.close();
      }
    },
  };
  contexts.push(c);
  return c;
}

afterEach(() => {
  for (const c of contexts) {
    try {
      execFileSync(ABX_BIN, ['broker', 'stop'], { env: c.env, cwd: c.home, stdio: 'ignore' });
    } catch {
      /* not running */
    }
  }
  for (const d of dirs) {
    fs.rmSync(fallbackDir(path.join(d, '.local/share/abx')), { recursive: true, force: true });
    fs.rmSync(d, { recursive: true, force: true });
  }
  dirs = [];
  contexts = [];
});

describe('where the socket is', () => {
  test('paths as the CLI resolves them; the key is sha256sum of the data dir', () => {
    const tmp = newHome();
    assert.equal(socketPath({ ABX_HOME: tmp }), path.join(tmp, 'run', 'broker.sock'));
    assert.equal(brokerPaths({ ABX_HOME: tmp }).dataLock, path.join(tmp, 'data', 'broker.lock'));
    assert.equal(socketPath({ HOME: '/home/u', XDG_RUNTIME_DIR: tmp }), path.join(tmp, 'abx', 'broker.sock'));
    for (const xdg of [path.join(tmp, 'missing'), '', undefined]) {
      // The key of the Rust unit test (broker/home/src/paths.rs).
      assert.equal(socketPath({ HOME: '/home/u', XDG_RUNTIME_DIR: xdg, TMPDIR: '/var/tmpx' }), `/var/tmpx/abx-${UID}/5d30585de145e544/broker.sock`);
      assert.equal(socketPath({ HOME: '/home/u', XDG_RUNTIME_DIR: xdg }), `/tmp/abx-${UID}/5d30585de145e544/broker.sock`);
    }
    assert.deepEqual(brokerPaths({ XDG_DATA_HOME: '/d' }).runtimeDir, `/tmp/abx-${UID}/${dataKey('/d/abx')}`);
    assert.equal(brokerPaths({ HOME: '' }).dataDir, '/.local/share/abx');
    // Joined as Rust's PathBuf::join joins: no normalization (the key hashes these bytes).
    assert.equal(brokerPaths({ HOME: '/home//u/' }).dataDir, '/home//u/.local/share/abx');
    for (const p of ['/home/u/.local/share/abx', '/tmp/a b/.local/share/abx', '/h/\u00e9t\u00e9/abx', 'rel/abx']) {
      assert.equal(dataKey(p), sha256sumKey(p), p);
    }
  });

  test('without XDG_RUNTIME_DIR the SDK reaches the daemon a shell with it started', async () => {
    const home = newHome();
    const shell = context(home, newXdg(home));
    const started = shell.abx('broker', 'start');
    const st = shell.abx('broker', 'status');
    assert.equal(st.pid, started.pid);
    assert.equal(st.dataDir, shell.dataDir);
    assert.equal(st.socket, path.join(home, 'xdg', 'abx', 'broker.sock'));

    const mcp = context(home);
    // It tries its own runtime dir first (nothing there), then the data dir's record.
    assert.equal(socketPath(mcp.env), path.join(fallbackDir(shell.dataDir), 'broker.sock'));
    assert.equal(await resolveSocket(mcp.env), st.socket);
    assert.deepEqual(await mcp.sdk(), { label: st.socket, pid: st.pid, dataDir: shell.dataDir, socket: st.socket });
    // Allowed to start one, it still reaches the shell's (no second daemon on the same data).
    assert.equal((await mcp.sdk(true)).pid, st.pid);
    assert.equal(shell.abx('broker', 'status').pid, st.pid);
  });

  test('with XDG_RUNTIME_DIR the SDK reaches the daemon started without it', async () => {
    const home = newHome();
    const bare = context(home);
    const started = bare.abx('broker', 'start');
    const st = bare.abx('broker', 'status');
    assert.equal(st.pid, started.pid);
    assert.equal(st.dataDir, bare.dataDir);
    // The daemon's fallback runtime dir is keyed as sha256sum keys the data dir.
    assert.equal(st.socket, path.join(fallbackDir(bare.dataDir), 'broker.sock'));

    const shell = context(home, newXdg(home));
    assert.equal(socketPath(shell.env), path.join(home, 'xdg', 'abx', 'broker.sock'));
    assert.equal(await resolveSocket(shell.env), st.socket);
    assert.deepEqual(await shell.sdk(), { label: st.socket, pid: st.pid, dataDir: bare.dataDir, socket: st.socket });
    assert.equal((await shell.sdk(true)).pid, st.pid);
  });

  test('a runtime socket whose daemon serves another data dir is not used', async () => {
    // Two HOMEs share one XDG_RUNTIME_DIR: its socket belongs to the first HOME's daemon.
    const home1 = newHome();
    const home2 = newHome();
    const xdg = newXdg(home1);
    const first = context(home1, xdg);
    const firstPid = first.abx('broker', 'start').pid;
    const other = context(home2, xdg);
    assert.equal(socketPath(other.env), path.join(xdg, 'abx', 'broker.sock'));
    assert.equal(await resolveSocket(other.env), undefined);
    await assert.rejects(other.sdk(), (e) => e instanceof sdk.BrokerUnreachableError && e.abx === 'E1007' && /serves another data dir/.test(e.message));

    // Its own daemon (started without XDG_RUNTIME_DIR) is found through its data dir instead.
    const second = context(home2);
    const secondPid = second.abx('broker', 'start').pid;
    assert.notEqual(secondPid, firstPid);
    const got = await other.sdk();
    assert.equal(got.pid, secondPid);
    assert.equal(got.dataDir, second.dataDir);
    assert.equal(await resolveSocket(other.env), path.join(fallbackDir(second.dataDir), 'broker.sock'));
  });

  test("a data dir record naming another daemon's socket is not used; an explicit socket is used as given", async () => {
    const home1 = newHome();
    const home2 = newHome();
    const owner = context(home1, newXdg(home1));
    const st = owner.abx('broker', 'start');
    const sock = owner.abx('broker', 'status').socket;
    const forged = context(home2);
    fs.mkdirSync(forged.dataDir, { recursive: true, mode: 0o700 });
    fs.writeFileSync(path.join(forged.dataDir, 'broker.lock'), `${st.pid}\n${st.version}\n${sock}\n${forged.dataDir}\n`);
    assert.equal(await resolveSocket(forged.env), undefined);
    await assert.rejects(forged.sdk(), (e) => e instanceof sdk.BrokerUnreachableError && e.abx === 'E1007');
    // `socket` means this socket exactly, whatever the records say.
    const c = await BrokerClient.connect({ mode: 'socket', socket: sock, env: forged.env, autoStart: false });
    try {
      assert.equal((await c.status()).pid, st.pid);
    } finally {
      await c.close();
    }
  });
});
