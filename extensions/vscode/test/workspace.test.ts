// Workspaces (src/workspace.ts, issue 43) on the fake UI surface against the real broker: a
// folder opened in a sandbox (overlay by default, rw said plainly), the Sandbox Changes view
// listing sandbox/diff, a change opening the diff editor (host file against the sandbox's
// version), apply (asked first; conflicts named, Force), discard, and the command log.
import './register-vscode';
import * as assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import * as vscode from 'vscode';
import { toFsError } from '../src/adapters/fs';
import { AbxError } from '../src/client/errors';
import { sandboxRef as sandboxRefOf } from '../src/client/format';
import { activate, AbxExtensionApi, deactivate } from '../src/extension';
import {
  ChangeNode,
  conflictPaths,
  CONTENT_SCHEME,
  hostPathOf,
  logCommand,
  logOutcome,
  Mount,
  relativeLabel,
  sandboxPathOf,
  WORKSPACE_COMMANDS,
} from '../src/workspace';
import { ABX_BIN, EXT_DIR, freshHome, Home, until } from './helpers';
// eslint-disable-next-line @typescript-eslint/no-require-imports
const fake = require('./fake-vscode') as typeof import('./fake-vscode');

const manifest = JSON.parse(fs.readFileSync(path.join(EXT_DIR, 'package.json'), 'utf8'));

/** Whether `command` is in the Sandbox Changes view's menu (`group` matching) of a row. */
function inChangesMenu(command: string, viewItem: string, group: RegExp): boolean {
  return (manifest.contributes.menus['view/item/context'] as { command: string; when: string; group: string }[]).some((m) => {
    if (m.command !== command || !group.test(m.group)) return false;
    return m.when.split('&&').every((t) => {
      const term = t.trim();
      let x = /^view == (\S+)$/.exec(term);
      if (x) return x[1] === 'abx.changes';
      x = /^viewItem =~ \/(.*)\/$/.exec(term);
      if (x) return new RegExp(x[1]).test(viewItem);
      x = /^viewItem == (\S+)$/.exec(term);
      if (x) return x[1] === viewItem;
      throw new Error(`when clause not understood: ${term}`);
    });
  });
}

describe('workspace helpers', () => {
  const mounts: Mount[] = [{ source: '/home/u/proj', target: '/workspace', mode: 'overlay' }];

  test('sandbox paths map to host files and back', () => {
    assert.equal(hostPathOf(mounts, '/workspace/src/a.rs'), '/home/u/proj/src/a.rs');
    assert.equal(hostPathOf(mounts, '/workspace'), '/home/u/proj');
    assert.equal(hostPathOf(mounts, '/workspacex/a'), undefined);
    assert.equal(hostPathOf(mounts, '/tmp/a'), undefined);
    assert.equal(sandboxPathOf(mounts, '/home/u/proj/src/a.rs'), '/workspace/src/a.rs');
    assert.equal(sandboxPathOf(mounts, '/home/u/project/a'), undefined);
    assert.equal(relativeLabel(mounts, '/workspace/src/a.rs'), 'src/a.rs');
    // the deepest mount wins
    const two: Mount[] = [...mounts, { source: '/data/lib', target: '/workspace/lib', mode: 'ro' }];
    assert.equal(hostPathOf(two, '/workspace/lib/x.c'), '/data/lib/x.c');
    assert.equal(relativeLabel(two, '/workspace/lib/x.c'), '/workspace/lib/x.c');
  });

  test('log entries read as commands', () => {
    const base = { seq: 1, kind: 'exec', client: 'claude-code', startedAt: '2026-12-05T10:00:00Z' };
    assert.equal(logCommand({ ...base, argv: ['sh', '-c', 'make test'] }), 'make test');
    assert.equal(logCommand({ ...base, argv: ['git', 'commit', '-m', 'a b'] }), "git commit -m 'a b'");
    assert.equal(logCommand({ ...base, kind: 'code', code: 'x = 1\nprint(x)\n', language: 'python' }), '[python] x = 1 …');
    assert.equal(logOutcome({ ...base, exitCode: 0, durationMs: 3 }), 'exit 0');
    assert.equal(logOutcome({ ...base, error: 'E3003' }), 'E3003');
    assert.equal(logOutcome({ ...base }), 'running');
  });

  test('the abx: file system: a read-only place (E4014) is NoPermissions', () => {
    const e = toFsError(new AbxError('E4014', "'/etc/x' is read-only in sandbox 'sb-1'."), vscode.Uri.parse('abx://local:sb-1/etc/x'));
    assert.equal((e as vscode.FileSystemError).code, 'NoPermissions');
  });

  test('an E4015 names its paths', () => {
    const e = new AbxError('E4015', "Changed on the host since sandbox 'sb-1' was created: /workspace/a.txt, /workspace/b.txt.");
    assert.deepEqual(conflictPaths(e, undefined), ['/workspace/a.txt', '/workspace/b.txt']);
    assert.deepEqual(conflictPaths(new AbxError('E4015', 'conflict', { data: { paths: ['/workspace/x'] } }), undefined), ['/workspace/x']);
    assert.deepEqual(conflictPaths(new AbxError('E4015', 'conflict'), ['/workspace/y']), ['/workspace/y']);
  });

  test('the menus: apply and discard inline on each change, Apply All / Discard All on a sandbox with changes', () => {
    for (const c of ['abx.applyChange', 'abx.discardChange', 'abx.openChange']) {
      assert.ok(inChangesMenu(c, 'change-modified', /^inline/), c);
      assert.ok(inChangesMenu(c, 'change-added:explicit', /^inline/), c);
      assert.ok(!inChangesMenu(c, 'changesSandbox:overlay:changes', /^inline/), c);
    }
    for (const c of ['abx.applyAll', 'abx.discardAll']) {
      assert.ok(inChangesMenu(c, 'changesSandbox:overlay:changes', /^inline/), c);
      assert.ok(!inChangesMenu(c, 'changesSandbox:overlay', /^inline/), `${c}: no changes, no action`);
      assert.ok(!inChangesMenu(c, 'change-modified', /./), c);
    }
    assert.ok(inChangesMenu('abx.showCommandLog', 'changesCommands', /^inline/));
    const views = manifest.contributes.views.abx.map((v: { id: string; name: string }) => `${v.id}=${v.name}`);
    assert.ok(views.includes('abx.changes=Sandbox Changes'));
    const titles = Object.fromEntries(manifest.contributes.commands.map((c: { command: string; title: string }) => [c.command, c.title]));
    assert.equal(titles['abx.openFolderInSandbox'], 'Open Workspace Folder in Sandbox');
  });
});

describe('workspaces on the real broker', { timeout: 240_000 }, () => {
  let home: Home;
  const ctx = { subscriptions: [] as { dispose(): unknown }[], extension: { packageJSON: manifest } };
  let api: AbxExtensionApi;
  let proj: string;
  let sb: string;

  before(async () => {
    home = freshHome();
    // The project lives outside the broker's own directories (those are refused, E2010).
    proj = fs.mkdtempSync(path.join(os.tmpdir(), 'abxproj-'));
    fs.writeFileSync(path.join(proj, 'a.txt'), 'host a\n');
    fs.writeFileSync(path.join(proj, 'b.txt'), 'host b\n');
    fs.writeFileSync(path.join(proj, 'c.txt'), 'host c\n');
    fake.configuration.set('abx.path', ABX_BIN);
    fake.configuration.set('abx.home', home.dir);
    fake.configuration.set('abx.refreshInterval', 0);
    api = activate(ctx as unknown as vscode.ExtensionContext);
    await until(() => api.service.state.kind === 'connected' && api.service.sandboxes, 'connected');
  });

  after(async () => {
    const done = deactivate();
    for (const d of ctx.subscriptions.splice(0)) d.dispose();
    await done;
    home.cleanup();
    fs.rmSync(proj, { recursive: true, force: true });
  });

  async function sandboxNode(): Promise<ChangeNode & { kind: 'sandbox' }> {
    api.changes.refresh();
    const roots = await api.changes.getChildren();
    const n = roots.find((r) => r.kind === 'sandbox' && r.ref === sb);
    assert.ok(n, `the view lists ${sb}: ${JSON.stringify(roots.map((r) => r.ref))}`);
    return n as ChangeNode & { kind: 'sandbox' };
  }

  async function changeNodes(): Promise<(ChangeNode & { kind: 'change' })[]> {
    const kids = await api.changes.getChildren(await sandboxNode());
    const err = kids.find((k) => k.kind === 'note' && /^\[E/.test(k.label));
    assert.ok(!err, `sandbox/diff failed: ${err && err.kind === 'note' ? err.label : ''}`);
    return kids.filter((k): k is ChangeNode & { kind: 'change' } => k.kind === 'change');
  }

  async function change(p: string): Promise<ChangeNode & { kind: 'change' }> {
    const n = (await changeNodes()).find((c) => c.change.path === p);
    assert.ok(n, `a change of ${p}`);
    return n;
  }

  async function sh(command: string): Promise<{ exitCode: number | null; stdout: string; stderr: string }> {
    const r = await (await api.service.getClient()).execRun({ sandbox: sb, command });
    return r as unknown as { exitCode: number | null; stdout: string; stderr: string };
  }

  test('the commands are registered', () => {
    for (const c of WORKSPACE_COMMANDS) assert.ok(fake.recorded.commands.has(c), c);
    assert.ok(fake.recorded.treeViews.has('abx.changes'));
  });

  test('rw is never silent: it says writes go to the host, and asks', async () => {
    const n = fake.recorded.messages.length;
    fake.recorded.answers.push('rw', undefined); // the mode, then the warning: declined
    const r = await vscode.commands.executeCommand('abx.openFolderInSandbox', vscode.Uri.file(proj));
    assert.equal(r, undefined, 'declined: nothing created');
    const picks = fake.recorded.quickPicks.at(-1)!;
    assert.deepEqual(
      picks.map((i: { label: string }) => i.label),
      ['overlay', 'ro', 'rw'],
    );
    assert.equal(picks[0].description, 'default');
    const warn = fake.recorded.messages.slice(n).find((m) => m.level === 'warning')!;
    assert.match(warn.text, /Writes in the sandbox go to the host/);
    assert.deepEqual(warn.items, ['Mount Read-Write']);
    assert.equal(fake.recorded.messageOptions[fake.recorded.messages.indexOf(warn)]?.modal, true);
    assert.equal((await (await api.service.getClient()).sandboxList()).length, 0);
  });

  test('a folder the broker refuses to mount (the home directory) says why, with the E-code', async () => {
    const at = fake.recorded.messages.length;
    const r = await vscode.commands.executeCommand('abx.openFolderInSandbox', vscode.Uri.file(os.homedir()), 'overlay', 'none');
    assert.equal(r, undefined);
    const err = fake.recorded.messages.slice(at).find((m) => m.level === 'error');
    assert.ok(err, 'an error message');
    assert.match(err.text, /^\[E2010\] Mount of '.*' refused: .*Mount a project directory of your own/);
  });

  test('open a folder in a sandbox: overlay by default, a terminal in /workspace', async () => {
    fake.recorded.answers.push('overlay', 'none'); // the mount's mode, then the network
    const r = await vscode.commands.executeCommand<{ sandbox: string; mode: string; terminal?: unknown }>('abx.openFolderInSandbox', vscode.Uri.file(proj));
    assert.ok(r, `a sandbox was created: ${JSON.stringify(fake.recorded.messages.slice(-3))}`);
    sb = r.sandbox;
    assert.equal(r.mode, 'overlay');
    const info = (await (await api.service.getClient()).sandboxInfo(sb)) as { mounts?: Mount[] };
    assert.deepEqual(info.mounts, [{ source: fs.realpathSync(proj), target: '/workspace', mode: 'overlay' }]);
    assert.ok(fake.recorded.messages.some((m) => m.text.startsWith(`Sandbox ${sb}: ${proj} at /workspace (overlay`)));
    const t = fake.recorded.terminals.at(-1)!;
    assert.equal(t.name, `abx: ${sb}`);
    let out = '';
    t.pty.onDidWrite((s: string) => (out += s));
    t.pty.open({ columns: 80, rows: 24 });
    // No history file: the sandbox's HOME is /workspace, where bash would write it (a change).
    t.pty.handleInput('unset HISTFILE; echo "cwd=$(pwd)"; cat a.txt; exit\r');
    await t.pty.exited;
    assert.match(out, /cwd=\/workspace\r\n/);
    assert.match(out, /host a\r\n/);
  });

  test('the view lists what the sandbox changed; the host is not touched', async () => {
    assert.ok(sb, 'the sandbox of the previous test');
    const r = await sh('echo sandbox a > /workspace/a.txt && echo new > /workspace/new.txt && rm /workspace/c.txt');
    assert.equal(r.exitCode, 0, r.stderr);
    const kids = await changeNodes();
    assert.deepEqual(
      kids.map((k) => [k.change.path, k.change.change]),
      [
        ['/workspace/a.txt', 'modified'],
        ['/workspace/c.txt', 'deleted'],
        ['/workspace/new.txt', 'added'],
      ],
    );
    const item = api.changes.getTreeItem(kids[0]);
    assert.equal(item.label, 'a.txt');
    assert.match(String(item.description), /^modified/);
    assert.equal(item.contextValue, 'change-modified');
    assert.equal(item.command?.command, 'abx.openChange');
    const node = await sandboxNode();
    await api.changes.diff(sb);
    const root = await until(() => {
      const it = api.changes.getTreeItem(node);
      return /^3 changes · \/workspace ← /.test(String(it.description)) && it;
    }, 'the count on the sandbox row');
    assert.equal(root.contextValue, 'changesSandbox:overlay:changes');
    assert.equal(fs.readFileSync(path.join(proj, 'a.txt'), 'utf8'), 'host a\n');
    assert.ok(fs.existsSync(path.join(proj, 'c.txt')));
    assert.ok(!fs.existsSync(path.join(proj, 'new.txt')));
  });

  test("a change opens the diff editor: the host file against the sandbox's version", async () => {
    const n = await change('/workspace/a.txt');
    await vscode.commands.executeCommand('abx.openChange', n);
    const call = fake.recorded.executed.filter((e) => e.command === 'vscode.diff').at(-1)!;
    const [left, right, title] = call.args as [vscode.Uri, vscode.Uri, string];
    assert.equal(left.scheme, 'file');
    assert.equal(left.fsPath, path.join(fs.realpathSync(proj), 'a.txt'));
    assert.equal(right.scheme, CONTENT_SCHEME);
    assert.match(title, /^a\.txt \(host ↔ sandbox /);
    const doc = await vscode.workspace.openTextDocument(right);
    assert.equal((doc as unknown as { content: string }).content, 'sandbox a\n');
    // added: nothing on the left; deleted: nothing on the right
    await vscode.commands.executeCommand('abx.openChange', await change('/workspace/new.txt'));
    const added = fake.recorded.executed.filter((e) => e.command === 'vscode.diff').at(-1)!.args as vscode.Uri[];
    assert.equal(added[0].scheme, CONTENT_SCHEME);
    assert.equal((await vscode.workspace.openTextDocument(added[0]) as unknown as { content: string }).content, '');
    assert.equal((await vscode.workspace.openTextDocument(added[1]) as unknown as { content: string }).content, 'new\n');
  });

  test('apply asks first (declined: nothing written), then writes the host file', async () => {
    const n = await change('/workspace/a.txt');
    let at = fake.recorded.messages.length;
    fake.recorded.answers.push(undefined);
    await vscode.commands.executeCommand('abx.applyChange', n);
    const asked = fake.recorded.messages[at];
    assert.equal(asked.level, 'warning');
    assert.match(asked.text, /Apply the sandbox's change to .*a\.txt\?/);
    assert.equal(fake.recorded.messageOptions[at]?.modal, true);
    assert.match(fake.recorded.messageOptions[at]?.detail, /writes your file on the host/);
    assert.equal(fs.readFileSync(path.join(proj, 'a.txt'), 'utf8'), 'host a\n', 'declined');
    at = fake.recorded.messages.length;
    fake.recorded.answers.push('Apply');
    const r = await vscode.commands.executeCommand<{ applied: string[] }>('abx.applyChange', n);
    assert.deepEqual(r?.applied, ['/workspace/a.txt']);
    assert.equal(fs.readFileSync(path.join(proj, 'a.txt'), 'utf8'), 'sandbox a\n');
    assert.ok(fake.recorded.messages.slice(at).some((m) => m.text === `Applied /workspace/a.txt from sandbox ${sb}.`));
    // applied: no longer a change
    assert.ok(!(await changeNodes()).some((c) => c.change.path === '/workspace/a.txt'));
  });

  test('discard drops one change: the sandbox sees the host again', async () => {
    fake.recorded.answers.push('Discard');
    const r = await vscode.commands.executeCommand<string[]>('abx.discardChange', await change('/workspace/new.txt'));
    assert.deepEqual(r, ['/workspace/new.txt']);
    assert.ok(!(await changeNodes()).some((c) => c.change.path === '/workspace/new.txt'));
    assert.ok(!fs.existsSync(path.join(proj, 'new.txt')), 'nothing written to the host');
    assert.notEqual((await sh('test -e /workspace/new.txt')).exitCode, 0);
    // the other change is still there
    assert.ok((await changeNodes()).some((c) => c.change.path === '/workspace/c.txt'));
  });

  test('a file changed on the host since create is a conflict, named, and Force applies it', async () => {
    assert.equal((await sh('echo sandbox b > /workspace/b.txt')).exitCode, 0);
    const n = await change('/workspace/b.txt');
    fs.writeFileSync(path.join(proj, 'b.txt'), 'host b, edited\n');
    const at = fake.recorded.messages.length;
    fake.recorded.answers.push('Apply', 'Force');
    const r = await vscode.commands.executeCommand<{ applied: string[]; conflicts: unknown[] }>('abx.applyChange', n);
    const warn = fake.recorded.messages.slice(at).find((m) => /Changed on the host since sandbox/.test(m.text));
    assert.ok(warn, 'a warning names the conflict');
    assert.match(warn.text, /\/workspace\/b\.txt/);
    assert.deepEqual(warn.items, ['Force', 'Discard']);
    assert.deepEqual(r?.applied, ['/workspace/b.txt'], 'applied with force');
    assert.equal(fs.readFileSync(path.join(proj, 'b.txt'), 'utf8'), 'sandbox b\n');
  });

  test('Apply All asks with the list, then applies every change (a deletion too)', async () => {
    const at = fake.recorded.messages.length;
    fake.recorded.answers.push('Apply');
    const r = await vscode.commands.executeCommand<{ applied: string[] }>('abx.applyAll', await sandboxNode());
    assert.match(fake.recorded.messages[at].text, new RegExp(`^Apply 1 change of sandbox ${sb} to `));
    assert.match(fake.recorded.messageOptions[at]?.detail, /D c\.txt/);
    assert.deepEqual(r?.applied, ['/workspace/c.txt']);
    assert.ok(!fs.existsSync(path.join(proj, 'c.txt')));
    assert.deepEqual(await changeNodes(), []);
  });

  test('Discard All drops every change', async () => {
    assert.equal((await sh('echo x > /workspace/x.txt && echo y > /workspace/y.txt')).exitCode, 0);
    assert.equal((await changeNodes()).length, 2);
    fake.recorded.answers.push('Discard All');
    const r = await vscode.commands.executeCommand<string[]>('abx.discardAll', sb);
    assert.deepEqual([...(r ?? [])].sort(), ['/workspace/x.txt', '/workspace/y.txt']);
    assert.deepEqual(await changeNodes(), []);
    assert.ok(!fs.existsSync(path.join(proj, 'x.txt')));
  });

  test('beside the changes, the commands run in the sandbox: client, command, exit', async () => {
    assert.equal((await sh('exit 3')).exitCode, 3);
    const kids = await api.changes.getChildren(await sandboxNode());
    const cmds = kids.find((k) => k.kind === 'commands')!;
    assert.ok(cmds, 'a Commands node');
    const rows = await api.changes.getChildren(cmds);
    const items = rows.filter((r) => r.kind === 'log').map((r) => api.changes.getTreeItem(r));
    const last = items[0];
    assert.equal(last.label, 'exit 3');
    assert.match(String(last.description), /^abx-vscode · exit 3/);
    assert.ok(items.some((i) => i.label === 'echo sandbox b > /workspace/b.txt'));
    // the whole log as a read-only document
    await vscode.commands.executeCommand('abx.showCommandLog', sb);
    const doc = fake.recorded.documents.at(-1)!;
    assert.equal(doc.uri?.scheme, 'abx-doc');
    assert.match(doc.content!, /abx-vscode {2}exec {2}exit 3/);
    // from a row of the Sandboxes view
    const row = (await api.sandboxes.getChildren((await api.sandboxes.getChildren())[0])).find((n) => n.kind === 'sandbox' && sandboxRefOf(n.sandbox) === sb);
    assert.ok(row, 'the Sandboxes view row');
    const r = await vscode.commands.executeCommand<{ last: number }>('abx.showCommandLog', row);
    assert.ok(r && r.last >= 1);
  });

  test('a sandbox made with the CLI (abx create --mount) shows up by itself (sandbox/changed)', async () => {
    const out = execFileSync(ABX_BIN, ['create', '--mount', proj, '-j'], { env: home.env, encoding: 'utf8', timeout: 60_000 });
    const made = JSON.parse(out) as { id: string; provider: string };
    const ref = `${made.provider}:${made.id}`;
    const node = await until(async () => (await api.changes.getChildren()).find((r) => r.ref === ref), 'the CLI sandbox in Sandbox Changes');
    assert.equal(node.kind, 'sandbox');
    await (await api.service.getClient()).sandboxKill(ref);
  });

  test('a killed sandbox leaves the view', async () => {
    await (await api.service.getClient()).sandboxKill(sb);
    await until(async () => !(await api.changes.getChildren()).some((r) => r.ref === sb), 'the sandbox gone from Sandbox Changes');
  });
});
