// The Sandbox API against the real broker (debug abx, its daemon under a fresh ABX_HOME, the
// builtin `local` provider): every call, streaming order with one exit at the end, exact
// bytes, errors per E-code, cancellation with AbortSignal, two clients at once. Every
// message sent is checked against docs/openrpc.json at the end.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import * as sdk from '../dist/esm/index.js';
import { ABX_BIN, driftOf, freshHome, SENT, trace, until } from './helpers.mjs';

const { Sandbox, BrokerClient } = sdk;
let home;
let opts;
let sb;

before(async () => {
  home = freshHome();
  opts = home.options;
  sb = await Sandbox.create({ ...opts, provider: 'local', timeout: 600, env: { GREETING: 'hi there' }, metadata: { suite: 'sdk-ts' }, network: 'none' });
});

after(async () => {
  await sb?.kill().catch(() => undefined);
  await sdk.closeAll();
  home?.cleanup();
  // `no/such` is the unknown-method test's own call.
  assert.deepEqual(driftOf(SENT.filter((m) => m.method !== 'no/such')), [], 'what the SDK sent matches docs/openrpc.json');
  assert.ok(SENT.length > 50);
});

describe('sandboxes', () => {
  test('create: provider, env, metadata, network; the daemon was started through abx', async () => {
    assert.equal(sb.provider, 'local');
    assert.match(sb.id, /^local:/);
    assert.equal(sb.status, 'running');
    assert.equal(sb.data.metadata?.suite, 'sdk-ts');
    assert.ok(fs.existsSync(path.join(home.dir, 'run', 'broker.sock')), 'the socket of this ABX_HOME');
    const r = await sb.exec('echo "$GREETING"');
    assert.equal(r.stdout, 'hi there\n');
    assert.equal(sb.client.mode, 'socket');
  });

  test('info, refresh, connect (lifetime untouched), list', async () => {
    const info = await sb.info();
    assert.equal(info.status, 'running');
    assert.equal((await sb.refresh()).data.id, info.id);
    const again = await Sandbox.connect(sb.id, opts);
    assert.equal(again.id, sb.id);
    assert.equal(again.data.expiresAt, info.expiresAt);
    const bare = await Sandbox.connect(sb.sandboxId, opts);
    assert.equal(bare.id, sb.id);
    const list = await Sandbox.list(opts);
    assert.ok(list.some((s) => `${s.provider}:${s.id}` === sb.id));
    assert.ok((await Sandbox.list({ ...opts, provider: 'local' })).some((s) => s.id === sb.sandboxId));
  });

  test('setTimeout, pause, resume, capabilities, systemInfo', async () => {
    const before = Date.parse((await sb.info()).expiresAt);
    const t = await sb.setTimeout(3600);
    assert.ok(Date.parse(t.expiresAt) > before, 'the lifetime grew');
    assert.equal((await sb.pause()).status, 'paused');
    assert.equal((await sb.info()).status, 'paused');
    assert.equal((await sb.resume()).status, 'running');
    assert.equal((await sb.exec('echo alive')).stdout, 'alive\n');
    const caps = await sb.capabilities();
    assert.ok(caps.features.includes('exec.run'));
    const si = await sb.systemInfo();
    assert.match(String(si.os), /linux/i);
  });

  test('kill is idempotent; a killed sandbox is SandboxNotFoundError (E2009)', async () => {
    const other = await Sandbox.create({ ...opts, timeout: 60 });
    assert.equal(await other.kill(), true);
    assert.equal(await other.kill(), false);
    await assert.rejects(other.info(), (e) => e instanceof sdk.SandboxNotFoundError && e.abx === 'E2009' && e.code === 2009 && /abx list/.test(e.suggestion));
    assert.ok(!(await Sandbox.list(opts)).some((s) => s.id === other.sandboxId));
  });
});

describe('exec', () => {
  test('exec: exit code, stdout, stderr, env, cwd, stdin text and bytes', async () => {
    const r = await sb.exec('echo out; echo err >&2; exit 4');
    assert.equal(r.exitCode, 4);
    assert.equal(r.stdout, 'out\n');
    assert.equal(r.stderr, 'err\n');
    assert.deepEqual(r.stdoutBytes, Buffer.from('out\n'));
    assert.equal((await sb.exec('echo "$A-$B"', { env: { A: '1', B: 'two' } })).stdout, '1-two\n');
    assert.equal((await sb.exec('pwd', { cwd: '/tmp' })).stdout, '/tmp\n');
    assert.equal((await sb.exec(['sh', '-c', 'echo "$0 $1"', 'x', 'y y'])).stdout, 'x y y\n');
    assert.equal((await sb.exec('cat', { stdin: 'from stdin' })).stdout, 'from stdin');
    const bytes = Buffer.from([0, 255, 254, 10, 128]);
    const r2 = await sb.exec('cat', { stdin: bytes });
    assert.deepEqual(r2.stdoutBytes, bytes);
  });

  test('exec output that is not UTF-8 comes byte for byte', async () => {
    const r = await sb.exec("printf '\\377\\376\\000abc\\303'; printf '\\200' >&2");
    assert.deepEqual(r.stdoutBytes, Buffer.from([0xff, 0xfe, 0x00, 0x61, 0x62, 0x63, 0xc3]));
    assert.deepEqual(r.stderrBytes, Buffer.from([0x80]));
    assert.equal(r.exitCode, 0);
  });

  test('exec timeout: timedOut, the command is killed', async () => {
    const r = await sb.exec('sleep 30', { timeout: 1 });
    assert.equal(r.timedOut, true);
  });

  test('execStream: output in order, exactly one exit, last', async () => {
    const s = await sb.execStream('for i in $(seq 1 2000); do echo $i; done; echo done >&2; exit 3');
    const events = [];
    for await (const ev of s) events.push(ev);
    const exits = events.filter((e) => e.type === 'exit');
    assert.equal(exits.length, 1);
    assert.equal(events.at(-1).type, 'exit');
    assert.equal(events.at(-1).exitCode, 3);
    const out = events.filter((e) => e.type === 'output' && e.stream === 'stdout').map((e) => e.text).join('');
    assert.equal(out, Array.from({ length: 2000 }, (_, i) => `${i + 1}\n`).join(''));
    assert.equal(events.filter((e) => e.type === 'output' && e.stream === 'stderr').map((e) => e.text).join(''), 'done\n');
    assert.equal((await s.exited).exitCode, 3);
  });

  test('execStream bytes are exact (a binary file through cat)', async () => {
    const data = randomBytes(300 * 1024);
    await sb.files.write('/tmp/blob.bin', data);
    const s = await sb.execStream('cat /tmp/blob.bin');
    const parts = [];
    for await (const ev of s) if (ev.type === 'output') parts.push(ev.bytes);
    assert.deepEqual(Buffer.concat(parts), data);
  });

  test('execStream write() and closeStdin(), kill()', async () => {
    const s = await sb.execStream('cat; echo end');
    await s.write('abc');
    await s.write(Buffer.from([0xff, 0x0a]));
    await s.closeStdin();
    const parts = [];
    let exit;
    for await (const ev of s) {
      if (ev.type === 'output') parts.push(ev.bytes);
      else exit = ev;
    }
    assert.deepEqual(Buffer.concat(parts), Buffer.concat([Buffer.from('abc'), Buffer.from([0xff, 0x0a]), Buffer.from('end\n')]));
    assert.equal(exit.exitCode, 0);
    const k = await sb.execStream('sleep 300');
    await k.kill();
    const e = await k.exited;
    assert.notEqual(e.exitCode, 0);
    assert.equal(e.signal, 'SIGKILL');
  });

  test('pty: a terminal of the size asked, resize', async () => {
    const s = await sb.pty({ cols: 100, rows: 30, command: 'stty size; tty' });
    let text = '';
    for await (const ev of s) if (ev.type === 'output') text += ev.text;
    assert.match(text, /30 100/);
    assert.match(text, /\/dev\/pts\//);
    const p = await sb.pty({ cols: 80, rows: 24, command: 'read x; stty size' });
    await p.resize(120, 40);
    await p.write('go\n');
    let t2 = '';
    for await (const ev of p) if (ev.type === 'output') t2 += ev.text;
    assert.match(t2, /40 120/);
  });

  test('AbortSignal cancels exec (E1006, the command is killed) and kills a stream', async () => {
    const ac = new AbortController();
    const run = sb.exec('sleep 77', { signal: ac.signal });
    await until(async () => (await sb.processes.list()).some((p) => /sleep 77/.test(p.command)), 'sleep 77 running');
    ac.abort();
    await assert.rejects(run, (e) => e instanceof sdk.CancelledError && e.abx === 'E1006' && e.code === -32800);
    await until(async () => !(await sb.processes.list()).some((p) => /sleep 77/.test(p.command)), 'sleep 77 gone');
    const req = SENT.find((m) => m.method === 'exec/run' && m.params?.command === 'sleep 77');
    assert.ok(SENT.some((m) => m.method === '$/cancelRequest' && m.params?.id === req.id), 'the abort sent $/cancelRequest for that request');
    const ac2 = new AbortController();
    const s = await sb.execStream('sleep 78', { signal: ac2.signal });
    ac2.abort();
    assert.equal((await s.exited).signal, 'SIGKILL');
    const pre = new AbortController();
    pre.abort();
    await assert.rejects(sb.exec('echo never', { signal: pre.signal }), (e) => e instanceof sdk.CancelledError);
  });

  test('processes: list and kill', async () => {
    const s = await sb.execStream('sleep 301');
    const p = await until(async () => (await sb.processes.list()).find((p) => /sleep 301/.test(p.command)), 'sleep 301 listed');
    assert.ok(p.pid > 0);
    await sb.processes.kill(p.pid, 'TERM');
    const e = await s.exited;
    assert.notEqual(e.exitCode, 0);
    await assert.rejects(sb.processes.kill(999999), (e) => e instanceof sdk.ExecError && e.abx === 'E3006');
  });
});

describe('files', () => {
  test('write/read (text and exact bytes), list, stat, exists, mkdir, rename, remove', async () => {
    const data = randomBytes(300 * 1024);
    assert.equal(await sb.files.write('d/b.bin', data, { parents: false }).catch(() => -1), -1, 'parents: false: no parent dir yet is E4001 (the default makes it)');
    await sb.files.mkdir('/workspace/d/e', { parents: true });
    assert.equal(await sb.files.write('d/b.bin', data), data.length);
    assert.deepEqual(await sb.files.read('/workspace/d/b.bin'), data);
    await sb.files.write('d/t.txt', 'héllo\n');
    assert.equal(await sb.files.read('d/t.txt', { encoding: 'utf8' }), 'héllo\n');
    const names = (await sb.files.list('/workspace/d')).map((e) => e.name).sort();
    assert.deepEqual(names, ['b.bin', 'e', 't.txt']);
    assert.ok((await sb.files.list('/workspace', { recursive: true })).some((e) => e.path === '/workspace/d/e'));
    const st = await sb.files.stat('d/b.bin');
    assert.equal(st.size, data.length);
    assert.equal(st.type, 'file');
    assert.equal(await sb.files.exists('d/t.txt'), true);
    assert.equal(await sb.files.exists('d/nope'), false);
    await sb.files.rename('d/t.txt', 'd/u.txt');
    assert.equal(await sb.files.exists('d/t.txt'), false);
    assert.equal(await sb.files.read('d/u.txt', { encoding: 'text' }), 'héllo\n');
    await assert.rejects(sb.files.remove('d'), (e) => e instanceof sdk.FilesError && e.abx === 'E4005');
    await sb.files.remove('d', { recursive: true });
    assert.equal(await sb.files.exists('d'), false);
    await sb.files.write('m.sh', 'x', { mode: 0o755 });
    assert.equal((await sb.files.stat('m.sh')).mode, '0755');
  });

  test('file errors: FileNotFoundError E4001, PathOutsideSandboxError E4002', async () => {
    await assert.rejects(sb.files.read('/workspace/nope'), (e) => e instanceof sdk.FileNotFoundError && e.abx === 'E4001' && !!e.suggestion);
    // files/* see the sandbox's whole root (issue 43): /etc/passwd is the sandbox's own; a path
    // climbing out of it is E4002, a system directory is read-only (E4014).
    assert.match((await sb.files.read('/etc/passwd')).toString(), /root:/);
    await assert.rejects(sb.files.read('/workspace/../../etc/passwd'), (e) => e instanceof sdk.PathOutsideSandboxError && e.abx === 'E4002');
    await assert.rejects(sb.files.write('/etc/abx-test', 'x'), (e) => e instanceof sdk.ReadOnlyError && e.abx === 'E4014');
    await assert.rejects(sb.files.stat('../../etc'), (e) => e instanceof sdk.FilesError);
  });

  test('upload and download (the broker copies local files), with progress', async () => {
    const dir = fs.mkdtempSync(path.join(home.dir, 'xfer-'));
    const src = path.join(dir, 'up.bin');
    const data = randomBytes(3 * 1024 * 1024 + 7);
    fs.writeFileSync(src, data);
    const progress = [];
    const up = await sb.files.upload(src, '/workspace/up.bin', { onProgress: (p) => progress.push(p) });
    assert.equal(up.size, data.length);
    assert.deepEqual(await sb.files.read('up.bin'), data);
    const dst = path.join(dir, 'down.bin');
    const down = await sb.files.download('/workspace/up.bin', dst);
    assert.equal(down.size, data.length);
    assert.deepEqual(fs.readFileSync(dst), data);
    assert.ok(progress.every((p) => p.total === data.length));
  });

  test('watch: changes as an async iterator and a listener; close unwatches', async () => {
    await sb.files.mkdir('/workspace/w', { parents: true });
    const heard = [];
    const w = await sb.files.watch('/workspace/w', { recursive: true }, (c) => heard.push(c));
    assert.ok(w.watchId);
    await sb.files.write('w/new.txt', 'x');
    for await (const c of w) {
      if (c.path.endsWith('/w/new.txt')) break;
    }
    assert.ok(heard.some((c) => c.path.endsWith('/w/new.txt')));
    w.close();
    const after = [];
    for await (const c of w) after.push(c);
    assert.ok(Array.isArray(after));
  });

  test('runCode on local (code.interpret): the default context keeps its state; an error is in the result', async () => {
    let r = await sb.runCode("x = 41\nprint('hi')\nx + 1");
    assert.equal(r.stdout, 'hi\n');
    assert.equal(r.results[0]['text/plain'], '42');
    r = await sb.runCode('x * 2', { env: { A: '1' }, timeout: 30 });
    assert.equal(r.results[0]['text/plain'], '82');
    r = await sb.runCode('1/0');
    assert.equal(r.error?.name, 'ZeroDivisionError');
    await assert.rejects(sb.runCode('1', { context: 'nope' }), (e) => e instanceof sdk.InvalidParamsError);
  });

  test('ports.url', async () => {
    const u = await sb.ports.url(8080);
    assert.match(u.url, /8080/);
    assert.equal(typeof u.headers, 'object');
    await assert.rejects(sb.ports.url(0), (e) => e instanceof sdk.AbxError && e.abx.startsWith('E'));
  });
});

describe('errors and connections', () => {
  test('errors per E-code: E8001 ProviderNotFoundError, E2004 SandboxError, E1004 InvalidParamsError', async () => {
    await assert.rejects(Sandbox.create({ ...opts, provider: 'nope' }), (e) => e instanceof sdk.ProviderNotFoundError && e.abx === 'E8001' && /provider list/.test(e.suggestion));
    await assert.rejects(sb.setTimeout(0), (e) => e instanceof sdk.SandboxError && e.abx === 'E2004');
    await assert.rejects(sb.client.request('sandbox/info', { sandbox: 5 }), (e) => e instanceof sdk.InvalidParamsError && e.abx === 'E1004');
    const e = await sb.client.request('no/such').catch((x) => x);
    assert.equal(e.abx, 'E1003');
    assert.ok(e instanceof sdk.ProtocolError);
    assert.match(e.describe(), /^\[E1003\] .*\nSuggestion: /);
  });

  test('two clients at once: a socket client and an `abx rpc` client, concurrent streams and calls', async () => {
    const a = await BrokerClient.connect({ mode: 'socket', env: home.env, trace });
    const b = await BrokerClient.connect({ mode: 'daemon', abxPath: ABX_BIN, env: home.env, trace });
    try {
      assert.equal(b.mode, 'daemon');
      const sa = Sandbox.from(a, sb.data);
      const sbb = await Sandbox.connect(sb.id, { client: b });
      const [x, y] = await Promise.all([
        sa.execStream('for i in $(seq 1 300); do echo a$i; done'),
        sbb.execStream('for i in $(seq 1 300); do echo b$i; done'),
      ]);
      const collect = async (s) => {
        let t = '';
        let exits = 0;
        for await (const ev of s) {
          if (ev.type === 'output') t += ev.text;
          else exits++;
        }
        return { t, exits };
      };
      const [ra, rb] = await Promise.all([collect(x), collect(y)]);
      assert.equal(ra.t, Array.from({ length: 300 }, (_, i) => `a${i + 1}\n`).join(''));
      assert.equal(rb.t, Array.from({ length: 300 }, (_, i) => `b${i + 1}\n`).join(''));
      assert.equal(ra.exits + rb.exits, 2);
      const runs = await Promise.all(Array.from({ length: 20 }, (_, i) => (i % 2 ? sa : sbb).exec(`echo ${i}`)));
      runs.forEach((r, i) => assert.equal(r.stdout, `${i}\n`));
      const st = await a.status();
      assert.ok(st.connections >= 2);
    } finally {
      await a.close();
      await b.close();
    }
    assert.equal(a.isClosed, true);
    await assert.rejects(a.ping(), (e) => e instanceof sdk.BrokerUnreachableError && e.abx === 'E1007');
  });

  test('a missing abx binary is E1007 with the fix; a socket with no daemon and no autoStart too', async () => {
    await assert.rejects(
      BrokerClient.connect({ mode: 'daemon', abxPath: '/nonexistent/abx', env: home.env }),
      (e) => e instanceof sdk.BrokerUnreachableError && /not found/.test(e.message),
    );
    await assert.rejects(
      BrokerClient.connect({ mode: 'socket', socket: path.join(home.dir, 'none.sock'), autoStart: false, env: home.env }),
      (e) => e instanceof sdk.BrokerUnreachableError && e.abx === 'E1007' && !!e.suggestion,
    );
  });
});

describe('workspaces (issue 43)', () => {
  test('mount strings become the broker form', () => {
    assert.deepEqual(sdk.toMount('/abs:/workspace/p:ro'), { source: '/abs', target: '/workspace/p', mode: 'ro' });
    assert.deepEqual(sdk.toMount('rel'), { source: path.resolve('rel') });
    assert.deepEqual(sdk.toMount({ source: '/x', mode: 'rw' }), { source: '/x', mode: 'rw' });
  });

  test('an overlay mount: the host is untouched until apply; conflicts, discard, log', async () => {
    const proj = fs.mkdtempSync(path.join(process.env.TMPDIR ?? '/tmp', 'abx-proj-'));
    fs.writeFileSync(path.join(proj, 'a.txt'), 'one\n');
    fs.writeFileSync(path.join(proj, 'c.txt'), 'host\n');
    const w = await Sandbox.create({ ...opts, provider: 'local', timeout: 120, mounts: [proj] });
    try {
      assert.deepEqual(w.data.mounts, [{ source: proj, target: '/workspace', mode: 'overlay' }]);
      const r = await w.exec('echo two >> a.txt && echo new > d.txt && echo sb > c.txt');
      assert.equal(r.exitCode, 0);
      assert.equal(fs.readFileSync(path.join(proj, 'a.txt'), 'utf8'), 'one\n');
      const changes = await w.diff({ patch: true });
      assert.deepEqual(changes.map((c) => [c.path, c.change]), [
        ['/workspace/a.txt', 'modified'], ['/workspace/c.txt', 'modified'], ['/workspace/d.txt', 'added']]);
      assert.match(changes[0].patch ?? '', /\+two/);
      fs.writeFileSync(path.join(proj, 'c.txt'), 'host changed\n');
      const res = await w.apply();
      assert.deepEqual(res.applied.sort(), ['/workspace/a.txt', '/workspace/d.txt']);
      assert.deepEqual(res.conflicts.map((c) => c.path), ['/workspace/c.txt']);
      assert.equal(fs.readFileSync(path.join(proj, 'a.txt'), 'utf8'), 'one\ntwo\n');
      assert.equal(fs.readFileSync(path.join(proj, 'c.txt'), 'utf8'), 'host changed\n');
      assert.deepEqual(await w.discard({ paths: ['/workspace/c.txt'] }), ['/workspace/c.txt']);
      assert.deepEqual(await w.diff(), []);
      const log = await w.log();
      assert.ok(log.entries.some((e) => (e.argv ?? []).join(' ').includes('echo two >> a.txt') && e.exitCode === 0));
      assert.deepEqual((await w.log({ since: log.last })).entries, []);
    } finally {
      await w.kill().catch(() => undefined);
      fs.rmSync(proj, { recursive: true, force: true });
    }
  });

  test('a network policy at create, changed live with setNetwork', async () => {
    const w = await Sandbox.create({ ...opts, provider: 'local', timeout: 120, network: { allow: ['pypi.example'] } });
    try {
      assert.deepEqual(w.data.network, { allow: ['pypi.example'], deny: [], blocked: [] });
      assert.match((await w.exec('echo $HTTPS_PROXY')).stdout, /^http:\/\/127\.0\.0\.1:\d+/);
      const info = await w.setNetwork({ allow: ['pypi.example', '*.files.example'] });
      assert.deepEqual(info.network.allow, ['pypi.example', '*.files.example']);
      await assert.rejects(w.setNetwork({ allow: ['127.0.0.1'] }), (e) => e.abx === 'E1004' && /127\.0\.0\.1/.test(e.message));
    } finally {
      await w.kill().catch(() => undefined);
    }
  });
});
