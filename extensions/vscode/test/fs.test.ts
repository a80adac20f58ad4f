// The abx: FileSystemProvider against a real sandbox.
import './register-vscode';
import * as assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import * as vscode from 'vscode';
import { AbxFileSystemProvider, parseSandboxUri, sandboxUri } from '../src/adapters/fs';
import type { BrokerClient } from '../src/client/broker';
import { decodeAuthority, encodeAuthority } from '../src/client/uri';
import { freshHome, Home, until } from './helpers';

const enc = (s: string) => new TextEncoder().encode(s);
const dec = (b: Uint8Array) => new TextDecoder().decode(b);

function fsCode(code: string) {
  return (e: unknown) => e instanceof vscode.FileSystemError && e.code === code;
}

describe('abx: file system provider (real broker)', { timeout: 120_000 }, () => {
  let home: Home;
  let client: BrokerClient;
  let sb: string;
  let fsp: AbxFileSystemProvider;
  const uri = (p: string) => sandboxUri(sb, p);

  before(async () => {
    home = freshHome();
    client = await home.connect();
    const s = await client.sandboxCreate({ timeout: 600 });
    sb = `${s.provider}:${s.id}`;
    fsp = new AbxFileSystemProvider(async () => client);
  });

  after(() => home.cleanup());

  test('URIs: the sandbox survives the lower-casing of authorities', () => {
    for (const id of ['local:sb-0123abcd', 'e2b:iAbC~x', 'p:UPPER']) {
      const a = encodeAuthority(id);
      assert.equal(a, a.toLowerCase());
      assert.equal(decodeAuthority(a), id);
      const u = vscode.Uri.parse(sandboxUri(id, '/workspace/a b.txt').toString());
      assert.deepEqual(parseSandboxUri(u), { sandbox: id, path: '/workspace/a b.txt' });
    }
  });

  test('the root lists /workspace and /tmp', async () => {
    assert.deepEqual(await fsp.readDirectory(uri('/')), [
      ['workspace', vscode.FileType.Directory],
      ['tmp', vscode.FileType.Directory],
    ]);
    assert.equal((await fsp.stat(uri('/'))).type, vscode.FileType.Directory);
  });

  test('writeFile creates, readFile reads back, stat and readDirectory see it', async () => {
    await fsp.writeFile(uri('/workspace/hello.txt'), enc('héllo\n'), { create: true, overwrite: false });
    assert.equal(dec(await fsp.readFile(uri('/workspace/hello.txt'))), 'héllo\n');
    const st = await fsp.stat(uri('/workspace/hello.txt'));
    assert.equal(st.type, vscode.FileType.File);
    assert.equal(st.size, Buffer.byteLength('héllo\n'));
    assert.ok(st.mtime > 0);
    const dir = await fsp.readDirectory(uri('/workspace'));
    assert.deepEqual(
      dir.find(([n]) => n === 'hello.txt'),
      ['hello.txt', vscode.FileType.File],
    );
    // The sandbox's commands see the same file.
    assert.equal((await client.execRun({ sandbox: sb, command: 'cat /workspace/hello.txt' })).stdout, 'héllo\n');
  });

  test('writeFile honours create/overwrite and keeps an existing mode', async () => {
    await assert.rejects(
      fsp.writeFile(uri('/workspace/absent.txt'), enc('x'), { create: false, overwrite: true }),
      fsCode('FileNotFound'),
    );
    await fsp.writeFile(uri('/workspace/s.sh'), enc('#!/bin/sh\necho one\n'), { create: true, overwrite: false });
    await assert.rejects(
      fsp.writeFile(uri('/workspace/s.sh'), enc('y'), { create: true, overwrite: false }),
      fsCode('FileExists'),
    );
    await client.execRun({ sandbox: sb, command: 'chmod 755 /workspace/s.sh' });
    await fsp.writeFile(uri('/workspace/s.sh'), enc('#!/bin/sh\necho two\n'), { create: true, overwrite: true });
    const r = await client.execRun({ sandbox: sb, command: '/workspace/s.sh' });
    assert.equal(r.stdout, 'two\n');
    // Binary content is byte-exact.
    const bin = new Uint8Array([0, 255, 1, 254, 10, 13, 0xc3]);
    await fsp.writeFile(uri('/tmp/b.bin'), bin, { create: true, overwrite: true });
    assert.deepEqual(Buffer.from(await fsp.readFile(uri('/tmp/b.bin'))), Buffer.from(bin));
  });

  test('createDirectory, rename (with and without overwrite), delete (recursive)', async () => {
    await fsp.createDirectory(uri('/workspace/d'));
    await assert.rejects(fsp.createDirectory(uri('/workspace/d')), fsCode('FileExists'));
    await fsp.writeFile(uri('/workspace/d/a.txt'), enc('a'), { create: true, overwrite: false });
    await fsp.writeFile(uri('/workspace/d/b.txt'), enc('b'), { create: true, overwrite: false });
    await assert.rejects(fsp.rename(uri('/workspace/d/a.txt'), uri('/workspace/d/b.txt'), { overwrite: false }), fsCode('FileExists'));
    await fsp.rename(uri('/workspace/d/a.txt'), uri('/workspace/d/b.txt'), { overwrite: true });
    assert.equal(dec(await fsp.readFile(uri('/workspace/d/b.txt'))), 'a');
    await assert.rejects(fsp.stat(uri('/workspace/d/a.txt')), fsCode('FileNotFound'));
    await fsp.rename(uri('/workspace/d'), uri('/workspace/e'), { overwrite: false });
    assert.deepEqual(await fsp.readDirectory(uri('/workspace/e')), [['b.txt', vscode.FileType.File]]);
    await assert.rejects(fsp.delete(uri('/workspace/e'), { recursive: false }));
    await fsp.delete(uri('/workspace/e'), { recursive: true });
    await assert.rejects(fsp.readDirectory(uri('/workspace/e')), fsCode('FileNotFound'));
    await assert.rejects(fsp.delete(uri('/workspace'), { recursive: true }), fsCode('NoPermissions'));
  });

  test('errors map to FileSystemError codes and keep the E-code in the message', async () => {
    const err = await fsp.readFile(uri('/workspace/nope.txt')).then(
      () => assert.fail('read'),
      (e: unknown) => e,
    );
    assert.ok(err instanceof vscode.FileSystemError);
    assert.equal(err.code, 'FileNotFound');
    assert.match(err.message, /\[E4001\]/);
    await fsp.createDirectory(uri('/workspace/adir'));
    await assert.rejects(fsp.readFile(uri('/workspace/adir')), fsCode('FileIsADirectory'));
    await assert.rejects(fsp.stat(uri('/proc/version')), fsCode('NoPermissions'));
    const gone = sandboxUri('local:sb-gone', '/workspace/x');
    await assert.rejects(fsp.stat(gone), fsCode('FileNotFound'));
  });

  test('watch turns files/changed into change events', async () => {
    const events: vscode.FileChangeEvent[] = [];
    const sub = fsp.onDidChangeFile((e) => events.push(...e));
    const w = fsp.watch(uri('/workspace'), { recursive: true, excludes: [] });
    // Changes made by a command in the sandbox (not through this provider).
    await until(async () => {
      await client.execRun({ sandbox: sb, command: 'echo $RANDOM > /workspace/from-shell.txt' });
      return events.some((e) => e.uri.path === '/workspace/from-shell.txt');
    }, 'a change event for from-shell.txt');
    const ev = events.find((e) => e.uri.path === '/workspace/from-shell.txt')!;
    assert.equal(ev.uri.scheme, 'abx');
    assert.equal(parseSandboxUri(ev.uri).sandbox, sb);
    const n = events.length;
    await client.execRun({ sandbox: sb, command: 'rm /workspace/from-shell.txt' });
    await until(
      () => events.slice(n).some((e) => e.uri.path === '/workspace/from-shell.txt' && e.type === vscode.FileChangeType.Deleted),
      'a delete event',
    );
    // A rename in the sandbox: the old path is deleted, the new one created.
    await client.execRun({ sandbox: sb, command: 'echo r > /workspace/r1.txt' });
    await until(() => events.some((e) => e.uri.path === '/workspace/r1.txt'), 'r1 created');
    const m = events.length;
    await client.execRun({ sandbox: sb, command: 'mv /workspace/r1.txt /workspace/r2.txt' });
    await until(
      () =>
        events.slice(m).some((e) => e.uri.path === '/workspace/r1.txt' && e.type === vscode.FileChangeType.Deleted) &&
        events.slice(m).some((e) => e.uri.path === '/workspace/r2.txt' && e.type === vscode.FileChangeType.Created),
      'r1 deleted and r2 created',
    );
    w.dispose();
    sub.dispose();
  });

  test("watching a path that does not exist (VS Code's .vscode/settings.json) logs nothing; other watch failures are logged", async () => {
    const lines: string[] = [];
    const quiet = new AbxFileSystemProvider(async () => client, (l) => lines.push(l));
    const a = quiet.watch(uri('/workspace/.vscode/settings.json'), { recursive: false, excludes: [] });
    const b = quiet.watch(uri('/workspace/.vscode'), { recursive: true, excludes: [] });
    await quiet.watchesSettled();
    assert.deepEqual(lines, []);
    // A sandbox that is gone is worth a line.
    const c = quiet.watch(sandboxUri('local:sb-gone', '/workspace'), { recursive: true, excludes: [] });
    await quiet.watchesSettled();
    assert.equal(lines.length, 1);
    assert.match(lines[0], /\[E2009\]/);
    for (const w of [a, b, c]) w.dispose();
  });
});
