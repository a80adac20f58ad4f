// The seed's sdk_run.py flow with the TypeScript SDK: create, refresh, capabilities, exec, a
// 300 KB binary round trip, unicode text, list, a missing file, processes, a port URL,
// setTimeout, pause, resume, runCode, files.watch, a named command, connect, list, a bogus
// provider, kill.
//
//   node examples/sdk_run.mjs [provider]      (default: the broker's default provider)
//
// Unsupported features print their E-code (E8004) and the script goes on.
import { randomBytes } from 'node:crypto';
import { AbxError, Sandbox } from '@abx/sdk';

const provider = process.argv[2];
const show = (label, v) => console.log(`${label}: ${JSON.stringify(v)}`);
const fails = async (label, f) => {
  try {
    show(label, await f());
  } catch (e) {
    if (!(e instanceof AbxError)) throw e;
    show(`${label} ->`, [e.name, e.abx, e.headline]);
  }
};

const sb = await Sandbox.create({ provider, timeout: 300 });
show('create', [sb.id, sb.provider, sb.status]);
await sb.refresh();
show('refresh', [sb.data.status, sb.data.template ?? '', sb.data.timeout]);
show('capabilities', (await sb.capabilities()).capabilities);
const r = await sb.exec('echo hello-sdk; echo err >&2; exit 4');
show('exec', [r.exitCode, r.stdout, r.stderr]);
const blob = randomBytes(300 * 1024);
await sb.files.write('b.bin', blob);
show('files roundtrip equal', (await sb.files.read('b.bin')).equals(blob));
await sb.files.write('t.txt', 'héllo\n');
show('files.read', await sb.files.read('t.txt', { encoding: 'utf8' }));
show('files.list', (await sb.files.list('/workspace')).map((e) => e.name).sort());
show('files.exists missing', await sb.files.exists('/workspace/nope'));
await fails('files.read missing', () => sb.files.read('/workspace/nope'));
await fails('processes', async () => (await sb.processes.list()).map((p) => p.pid));
await fails('ports.url(9000)', async () => {
  const u = await sb.ports.url(9000);
  return [u.url, u.headers];
});
await fails('setTimeout', async () => (await sb.setTimeout(600)).expiresAt && 'ok');
await fails('paused status', async () => (await sb.pause()).status);
await fails('resumed status', async () => (await sb.resume()).status);
show('exec after resume', (await sb.exec('echo alive')).stdout);
await fails('runCode', () => sb.runCode('print(1 + 1)'));
await fails('files.watch', async () => {
  const w = await sb.files.watch('/workspace');
  w.close();
  return 'watching';
});
await fails('named command', () => sb.runCommand('deploy'));
const again = await Sandbox.connect(sb.id);
show('connect', [again.id, again.status]);
show('list contains', (await Sandbox.list()).some((s) => `${s.provider}:${s.id}` === sb.id));
await fails('create bogus provider', () => Sandbox.create({ provider: 'nope' }));
show('killed', await sb.kill());
show('list after kill', (await Sandbox.list()).filter((s) => `${s.provider}:${s.id}` === sb.id));
