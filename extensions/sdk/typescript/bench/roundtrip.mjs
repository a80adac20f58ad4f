// Round trips of the SDK against the same calls made by hand (measured, never asserted):
//   - `broker/ping` and `exec/run true` through a Sandbox API connection (the daemon socket)
//     against a minimal raw client on the same socket (one JSON line out, one line back);
//   - the same through BrokerClient over a spawned `abx rpc`;
//   - `Sandbox.list()` in a fresh node process against `node -e 0` (the SDK's startup cost).
//
//   ABX_BIN=target/debug/abx node bench/roundtrip.mjs [iterations]
import { execFileSync, spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import { BrokerClient, Sandbox, closeAll } from '../dist/esm/index.js';

const N = Number(process.argv[2] || 500);
const ABX = path.resolve(process.env.ABX_BIN || 'abx');
const home = fs.mkdtempSync(path.join(os.tmpdir(), 'abxts-bench-'));
const env = { ...process.env, ABX_HOME: home };
const opts = { abxPath: ABX, processEnv: env };
const here = path.dirname(fileURLToPath(import.meta.url));

function stats(ns) {
  const s = [...ns].sort((a, b) => a - b);
  const q = (p) => s[Math.min(s.length - 1, Math.floor(p * s.length))] / 1000;
  return `p50 ${q(0.5).toFixed(1)} us  p99 ${q(0.99).toFixed(1)} us`;
}

async function time(n, f) {
  for (let i = 0; i < Math.min(50, n); i++) await f();
  const out = [];
  for (let i = 0; i < n; i++) {
    const t = process.hrtime.bigint();
    await f();
    out.push(Number(process.hrtime.bigint() - t));
  }
  return out;
}

/** The floor: one line out, one line back, on the same socket. */
function rawClient(file) {
  const s = net.createConnection({ path: file });
  let buf = '';
  let wait;
  s.setEncoding('utf8');
  s.on('data', (d) => {
    buf += d;
    const i = buf.indexOf('\n');
    if (i >= 0) {
      const line = buf.slice(0, i);
      buf = buf.slice(i + 1);
      wait?.(line);
    }
  });
  let id = 0;
  return {
    ready: new Promise((r) => s.once('connect', r)),
    call(method, params) {
      return new Promise((r) => {
        wait = r;
        s.write(JSON.stringify({ jsonrpc: '2.0', id: ++id, method, params }) + '\n');
      });
    },
    close: () => s.destroy(),
  };
}

const sb = await Sandbox.create({ ...opts, timeout: 600 });
const sock = path.join(home, 'run', 'broker.sock');
const raw = rawClient(sock);
await raw.ready;
const rpc = await BrokerClient.connect({ mode: 'daemon', abxPath: ABX, env });

const rows = [];
rows.push(['broker/ping raw socket client', stats(await time(N, () => raw.call('broker/ping', {})))]);
rows.push(['broker/ping SDK (socket)', stats(await time(N, () => sb.client.ping()))]);
rows.push(['broker/ping SDK (abx rpc)', stats(await time(N, () => rpc.ping()))]);
rows.push(['exec/run true raw socket client', stats(await time(N / 5, () => raw.call('exec/run', { sandbox: sb.id, command: 'true' })))]);
rows.push(['sb.exec("true") SDK (socket)', stats(await time(N / 5, () => sb.exec('true')))]);
const viaRpc = Sandbox.from(rpc, sb.data);
rows.push(['sb.exec("true") SDK (abx rpc)', stats(await time(N / 5, () => viaRpc.exec('true')))]);

function wall(args) {
  const out = [];
  for (let i = 0; i < 10; i++) {
    const t = process.hrtime.bigint();
    const r = spawnSync(process.execPath, args, { env, stdio: 'ignore' });
    if (r.status !== 0) throw new Error(`${args.join(' ')} failed`);
    out.push(Number(process.hrtime.bigint() - t));
  }
  return out;
}
const listScript = `import { Sandbox } from ${JSON.stringify(path.join(here, '../dist/esm/index.js'))}; await Sandbox.list({ abxPath: ${JSON.stringify(ABX)} });`;
rows.push(['node -e 0', stats(wall(['-e', '0']))]);
rows.push(['fresh node: Sandbox.list()', stats(wall(['--input-type=module', '-e', listScript]))]);

await sb.kill();
raw.close();
await rpc.close();
await closeAll();
execFileSync(ABX, ['broker', 'stop'], { env, stdio: 'ignore' });
fs.rmSync(home, { recursive: true, force: true });
for (const [k, v] of rows) console.log(`${k.padEnd(36)} ${v}`);
