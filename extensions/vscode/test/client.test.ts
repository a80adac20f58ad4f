// The client layer against the real broker (`abx rpc` to a daemon of a fresh ABX_HOME).
import * as assert from 'node:assert/strict';
import * as crypto from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { CancellationTokenSource } from 'vscode-jsonrpc/node';
import { BrokerClient } from '../src/client/broker';
import { AbxError } from '../src/client/errors';
import type { OutputChunk } from '../src/client/exec';
import { changedRef } from '../src/client/format';
import type { FilesChanged, FilesProgress, SandboxChanged, TestResultNote } from '../src/client/types';
import { ABX_BIN, freshHome, Home, until } from './helpers';

describe('broker client (real broker)', { timeout: 180_000 }, () => {
  let home: Home;
  let client: BrokerClient;
  let sb: string;

  before(async () => {
    home = freshHome();
    client = await home.connect();
    const s = await client.sandboxCreate({ timeout: 600, metadata: { owner: 'vscode-test' } });
    sb = `${s.provider}:${s.id}`;
  });

  after(() => home.cleanup());

  test('initialize: the broker speaks abx/1 and offers every method the extension uses', () => {
    assert.equal(client.server?.protocolVersion, 'abx/1');
    assert.equal(client.server?.serverInfo.name, 'abx-broker');
    assert.match(client.serverVersion, /^\d+\.\d+\.\d+/);
    assert.equal(client.binaryVersion, client.serverVersion);
  });

  test('create, list, info: the sandbox is there with its provider and metadata', async () => {
    const list = await client.sandboxList();
    const mine = list.find((s) => `${s.provider}:${s.id}` === sb);
    assert.ok(mine, `sandbox ${sb} in ${JSON.stringify(list)}`);
    assert.equal(mine.status, 'running');
    assert.equal(mine.metadata?.owner, 'vscode-test');
    const info = await client.sandboxInfo(sb);
    assert.equal(info.timeout, 600);
    const status = await client.status();
    assert.ok(status.sandboxes >= 1);
  });

  test('exec stream: stdout, stderr and non-UTF-8 bytes in order, then exactly one exit with its code', async () => {
    const chunks: OutputChunk[] = [];
    let exits = 0;
    const s = await client.execStart(
      { sandbox: sb, command: "echo out; echo err >&2; printf 'caf\\303\\251 \\377\\n'; exit 7" },
      { onOutput: (c) => chunks.push(c), onExit: () => exits++ },
    );
    const exit = await s.exited;
    assert.equal(exit.exitCode, 7);
    assert.equal(exit.timedOut, false);
    assert.equal(exits, 1);
    const stdout = Buffer.concat(chunks.filter((c) => c.stream === 'stdout').map((c) => c.bytes));
    const stderr = Buffer.concat(chunks.filter((c) => c.stream === 'stderr').map((c) => c.bytes));
    assert.deepEqual(stdout, Buffer.concat([Buffer.from('out\ncafé '), Buffer.from([0xff, 0x0a])]));
    assert.equal(stderr.toString(), 'err\n');
  });

  test('exec stream: stdin written after start reaches the command; eof ends it', async () => {
    let out = '';
    const s = await client.execStart({ sandbox: sb, command: 'cat; echo done' });
    s.onOutput((c) => (out += c.text));
    await s.write('line one\n');
    await s.write(Buffer.from([0x61, 0x62, 0x0a]), true);
    const exit = await s.exited;
    assert.equal(exit.exitCode, 0);
    assert.equal(out, 'line one\nab\ndone\n');
  });

  test('exec kill: the tree dies and the exit says so', async () => {
    const s = await client.execStart({ sandbox: sb, command: 'echo ready; sleep 300' });
    let out = '';
    s.onOutput((c) => (out += c.text));
    await until(() => out.includes('ready'), 'ready');
    await s.kill('TERM');
    const exit = await s.exited;
    assert.notEqual(exit.exitCode, 0);
    assert.equal(exit.signal, 'SIGTERM');
  });

  test('exec/run cancelled through the token: -32800 with E1006', async () => {
    const cts = new CancellationTokenSource();
    const run = client.execRun({ sandbox: sb, command: 'sleep 300' }, cts.token);
    // Cancel once the command runs (the broker's process list shows it).
    await until(async () => (await client.processList(sb)).some((p) => p.command.includes('sleep 300')), 'sleep running');
    cts.cancel();
    await assert.rejects(run, (e: unknown) => e instanceof AbxError && e.abx === 'E1006' && e.code === -32800);
    await until(async () => !(await client.processList(sb)).some((p) => p.command.includes('sleep 300')), 'sleep killed');
  });

  test('errors carry the E-code, the message and the suggestion', async () => {
    const err = await client.sandboxInfo('local:sb-doesnotexist').then(
      () => assert.fail('no error'),
      (e: unknown) => e,
    );
    assert.ok(err instanceof AbxError);
    assert.equal(err.abx, 'E2009');
    assert.equal(err.code, 2009);
    assert.equal(err.method, 'sandbox/info');
    assert.match(err.message, /sb-doesnotexist/);
    assert.match(err.suggestion ?? '', /abx list/);
    assert.match(err.describe(), /^\[E2009\] .*\nSuggestion: /);
    // local declares templates.read (OCI images, issue 22): the host template is listed.
    const tl = (await client.templatesList('local')) as { templates: { name: string }[] };
    assert.equal(tl.templates[0].name, 'base');
    // Unknown method: the standard code, mapped to E1003.
    await assert.rejects(client.request('nope/nothing'), (e: unknown) => e instanceof AbxError && e.abx === 'E1003' && e.code === -32601);
  });

  test('files: write and read back byte-exact, stat, list, mkdir, rename, remove', async () => {
    const bytes = crypto.randomBytes(100_000);
    await client.filesMkdir(sb, '/workspace/dir/sub', true);
    assert.equal(await client.filesWriteAll(sb, '/workspace/dir/sub/r.bin', bytes), bytes.length);
    assert.deepEqual(await client.filesReadAll(sb, '/workspace/dir/sub/r.bin'), bytes);
    const st = await client.filesStat(sb, 'dir/sub/r.bin');
    assert.equal(st.type, 'file');
    assert.equal(st.size, bytes.length);
    assert.equal(st.path, '/workspace/dir/sub/r.bin');
    const names = (await client.filesList(sb, '/workspace/dir/sub')).map((e) => e.name);
    assert.deepEqual(names, ['r.bin']);
    await client.filesRename(sb, '/workspace/dir/sub/r.bin', '/workspace/dir/moved.bin');
    assert.deepEqual(await client.filesReadAll(sb, 'dir/moved.bin'), bytes);
    await assert.rejects(client.filesStat(sb, 'dir/sub/r.bin'), (e: unknown) => e instanceof AbxError && e.abx === 'E4001');
    await assert.rejects(client.filesRemove(sb, '/workspace/dir'), (e: unknown) => e instanceof AbxError && e.abx === 'E4005');
    await client.filesRemove(sb, '/workspace/dir', true);
    await assert.rejects(client.filesList(sb, '/workspace/dir'), (e: unknown) => e instanceof AbxError && e.abx === 'E4001');
    // The same path means the same file to exec.
    await client.filesWriteAll(sb, '/tmp/seen.txt', Buffer.from('from files/write'));
    const r = await client.execRun({ sandbox: sb, command: 'cat /tmp/seen.txt' });
    assert.equal(r.stdout, 'from files/write');
  });

  test('files: a write above one chunk goes through a temporary file and lands whole', async () => {
    const big = crypto.randomBytes(8 * 1024 * 1024 + 12345);
    assert.equal(await client.filesWriteAll(sb, 'big.bin', big), big.length);
    const back = await client.filesReadAll(sb, 'big.bin');
    assert.equal(back.length, big.length);
    assert.ok(back.equals(big));
    const left = (await client.filesList(sb, '/workspace')).filter((e) => e.name.includes('.abx-'));
    assert.deepEqual(left, []);
    await client.filesRemove(sb, 'big.bin');
  });

  test('upload and download with files/progress', async () => {
    const local = path.join(home.dir, 'up.bin');
    const data = crypto.randomBytes(300_000);
    fs.writeFileSync(local, data);
    const seen: FilesProgress[] = [];
    const up = await client.filesUpload(sb, local, '/workspace/up.bin', (p) => seen.push(p));
    assert.equal(up.size, data.length);
    assert.ok(seen.length > 0);
    assert.equal(seen[seen.length - 1].bytes, data.length);
    assert.equal(seen[seen.length - 1].total, data.length);
    const down = path.join(home.dir, 'down.bin');
    await client.filesDownload(sb, '/workspace/up.bin', down);
    assert.ok(fs.readFileSync(down).equals(data));
  });

  test('files/watch: a write in the sandbox comes back as files/changed', async () => {
    const changes: FilesChanged[] = [];
    const w = await client.filesWatch(sb, '/workspace', true, (c) => changes.push(c));
    await client.execRun({ sandbox: sb, command: 'mkdir -p w && echo hi > w/watched.txt' });
    await until(() => changes.some((c) => c.path === '/workspace/w/watched.txt'), 'files/changed for watched.txt');
    assert.equal(changes[0].watchId, w.watchId);
    w.dispose();
  });

  test('pause, resume, extend the lifetime, ports', async () => {
    assert.equal((await client.sandboxPause(sb)).status, 'paused');
    assert.equal((await client.sandboxResume(sb)).status, 'running');
    const before = Date.now();
    const s = await client.sandboxSetTimeout(sb, 3600);
    assert.equal(s.timeout, 3600);
    assert.ok(Date.parse(s.expiresAt ?? '') >= before + 3500_000);
    const u = await client.portsUrl(sb, 8080);
    assert.equal(u.url, 'http://127.0.0.1:8080');
  });

  test('providers: list, doctor, the contract kit with its per-test notifications', async () => {
    const providers = await client.providerList();
    const local = providers.find((p) => p.id === 'local');
    assert.ok(local);
    assert.equal(local.trust, 'builtin');
    assert.ok(local.features.includes('pty'));
    const doctor = await client.providerDoctor('local');
    assert.equal(doctor.ok, true);
    assert.ok(doctor.checks.length > 0);
    const notes: TestResultNote[] = [];
    const r = await client.providerTest('local', { filter: 'exec', onResult: (n) => notes.push(n) });
    assert.ok(r.results.length > 0);
    assert.equal(r.failed, 0);
    assert.equal(notes.length, r.results.length);
    assert.deepEqual(new Set(notes.map((n) => n.name)), new Set(r.results.map((x) => x.name)));
  });

  test('sandbox/subscribe: what another client does comes as sandbox/changed; after unsubscribe nothing does', async () => {
    const watcher = await home.connect();
    const sentinel = await home.connect();
    const seen: SandboxChanged[] = [];
    const sentinelSeen: SandboxChanged[] = [];
    watcher.onSandboxChanged((c) => seen.push(c));
    sentinel.onSandboxChanged((c) => sentinelSeen.push(c));
    assert.equal(watcher.offers('sandbox/subscribe'), true);
    assert.deepEqual(await watcher.sandboxSubscribe(), {});
    assert.deepEqual(await sentinel.sandboxSubscribe(), {});
    // `client` is another connection (as the CLI or an agent would be).
    const s = await client.sandboxCreate({ timeout: 600 });
    const ref = `${s.provider}:${s.id}`;
    const event = (list: SandboxChanged[], change: string) => list.find((c) => changedRef(c) === ref && c.change === change);
    const created = await until(() => event(seen, 'created'), 'created');
    assert.equal(created.provider, 'local');
    assert.equal(created.sandboxInfo?.id, s.id);
    assert.equal(created.sandboxInfo?.status, 'running');
    await client.sandboxPause(ref);
    assert.equal((await until(() => event(seen, 'paused'), 'paused')).sandboxInfo?.status ?? 'paused', 'paused');
    await client.sandboxResume(ref);
    assert.equal((await until(() => event(seen, 'resumed'), 'resumed')).sandboxInfo?.status ?? 'running', 'running');
    await client.sandboxSetTimeout(ref, 900);
    assert.equal((await until(() => event(seen, 'timeout'), 'timeout')).sandboxInfo?.timeout, 900);
    await client.sandboxKill(ref);
    await until(() => event(seen, 'killed'), 'killed');
    // Unsubscribed: the sentinel (still subscribed) hears of the next sandbox, the watcher not.
    assert.deepEqual(await watcher.sandboxUnsubscribe(), {});
    const n = seen.length;
    const t = await client.sandboxCreate({ timeout: 600 });
    await until(() => sentinelSeen.some((c) => c.sandbox.endsWith(t.id) && c.change === 'created'), 'the sentinel saw it');
    await watcher.ping(); // whatever was sent to the watcher before this reply has been read
    assert.equal(seen.length, n, JSON.stringify(seen.slice(n)));
    await client.sandboxKill(`${t.provider}:${t.id}`);
    watcher.dispose();
    sentinel.dispose();
  });

  test('a lifetime that ends is reported as well', async () => {
    const watcher = await home.connect();
    const seen: SandboxChanged[] = [];
    watcher.onSandboxChanged((c) => seen.push(c));
    await watcher.sandboxSubscribe();
    const s = await client.sandboxCreate({ timeout: 3 });
    const ref = `${s.provider}:${s.id}`;
    const ended = await until(() => seen.find((c) => changedRef(c) === ref && c.change === 'expired'), 'expired', 90_000);
    assert.ok(!ended.sandboxInfo || ended.sandboxInfo.id === s.id);
    assert.ok(!(await client.sandboxList()).some((x) => x.id === s.id));
    watcher.dispose();
  });

  test('kill is idempotent and the sandbox is gone after', async () => {
    const s = await client.sandboxCreate({});
    const id = `${s.provider}:${s.id}`;
    assert.equal((await client.sandboxKill(id)).killed, true);
    assert.equal((await client.sandboxKill(id)).killed, false);
    await assert.rejects(client.sandboxInfo(id), (e: unknown) => e instanceof AbxError && e.abx === 'E2009');
  });

  test('a private broker (abx broker --stdio) serves the same API', async () => {
    const c = await home.connect('stdio');
    assert.equal(c.server?.protocolVersion, 'abx/1');
    await c.ping();
    c.dispose();
  });

  test('losing the connection: pending requests and open streams fail with E1007, onDidClose fires', async () => {
    const c = await home.connect();
    let reason = '';
    c.onDidClose((r) => (reason = r));
    const s = await c.execStart({ sandbox: sb, command: 'sleep 300' });
    const pending = c.execRun({ sandbox: sb, command: 'sleep 300' });
    c.dispose();
    await assert.rejects(pending, (e: unknown) => e instanceof AbxError && e.abx === 'E1007');
    await assert.rejects(s.exited, (e: unknown) => e instanceof AbxError && e.abx === 'E1007');
    assert.ok(reason);
    await assert.rejects(c.ping(), (e: unknown) => e instanceof AbxError && e.abx === 'E1007');
  });
});

describe('finding abx', { timeout: 60_000 }, () => {
  test('a missing binary is E1007 with the fix', async () => {
    const err = await BrokerClient.connect({ abxPath: '/nonexistent/abx' }).then(
      () => assert.fail('connected'),
      (e: unknown) => e,
    );
    assert.ok(err instanceof AbxError);
    assert.equal(err.abx, 'E1007');
    assert.match(err.message, /\/nonexistent\/abx/);
    assert.match(err.message, /not found/);
    assert.match(err.suggestion ?? '', /abx\.path/);
  });

  test('a binary older than the extension needs is E1008 with the fix', async () => {
    // The real abx behind a wrapper that reports an old version.
    const home = freshHome();
    try {
      const wrapper = path.join(home.dir, 'old-abx');
      fs.writeFileSync(
        wrapper,
        `#!/bin/sh\nif [ "$1" = "--version" ]; then echo "abx 0.0.9"; exit 0; fi\nexec '${ABX_BIN}' "$@"\n`,
        { mode: 0o755 },
      );
      const err = await BrokerClient.connect({ abxPath: wrapper, env: home.env }).then(
        () => assert.fail('connected'),
        (e: unknown) => e,
      );
      assert.ok(err instanceof AbxError);
      assert.equal(err.abx, 'E1008');
      assert.match(err.message, /too old \(0\.0\.9\)/);
      assert.match(err.suggestion ?? '', /Update abx/);
    } finally {
      home.cleanup();
    }
  });

  test('something that is not abx (no broker behind it) fails with the reason', async () => {
    const home = freshHome();
    try {
      const fake = path.join(home.dir, 'not-abx');
      fs.writeFileSync(fake, `#!/bin/sh\nif [ "$1" = "--version" ]; then echo "abx 9.9.9"; exit 0; fi\necho "no broker here" >&2\nexit 3\n`, {
        mode: 0o755,
      });
      const err = await BrokerClient.connect({ abxPath: fake, env: home.env }).then(
        () => assert.fail('connected'),
        (e: unknown) => e,
      );
      assert.ok(err instanceof AbxError);
      assert.equal(err.abx, 'E1007');
      assert.match(err.message, /no broker here|exited with code 3/);
    } finally {
      home.cleanup();
    }
  });
});
