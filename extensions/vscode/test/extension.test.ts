// The extension activated on the fake UI surface, driving the real broker: the manifest and
// the code agree, and the commands, views, status bar and MCP registration do what they say.
import './register-vscode';
import * as assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import * as readline from 'node:readline';
import { after, before, describe, test } from 'node:test';
import * as vscode from 'vscode';
import { parseSandboxUri, sandboxUri } from '../src/adapters/fs';
import { CODE_COMMANDS } from '../src/code';
import { COMMANDS } from '../src/commands';
import { readSettings } from '../src/config';
import { activate, AbxExtensionApi, deactivate } from '../src/extension';
import { MCP_PROVIDER_ID, registerMcp } from '../src/mcp';
import { NETWORK_COMMANDS } from '../src/network';
import { TEMPLATE_COMMANDS } from '../src/templates';
import { EVENT_DEBOUNCE_MS, RETRY_BASE_MS } from '../src/service';
import { WORKSPACE_COMMANDS } from '../src/workspace';
import type { BrokerClient } from '../src/client/broker';
import type { Sandbox } from '../src/client/types';
import type { ProviderNode, SandboxNode } from '../src/views';
import { ABX_BIN, EXT_DIR, freshHome, Home, REPO_ROOT, until } from './helpers';
// eslint-disable-next-line @typescript-eslint/no-require-imports
const fake = require('./fake-vscode') as typeof import('./fake-vscode');

const manifest = JSON.parse(fs.readFileSync(path.join(EXT_DIR, 'package.json'), 'utf8'));

function context() {
  return { subscriptions: [] as { dispose(): unknown }[], extension: { packageJSON: manifest } };
}

/** As VS Code does: each subscription in order, an error does not stop the rest. */
function dispose(ctx: ReturnType<typeof context>): unknown[] {
  const errors: unknown[] = [];
  for (const d of ctx.subscriptions.splice(0)) {
    try {
      d.dispose();
    } catch (err) {
      errors.push(err);
    }
  }
  return errors;
}

/** The part of VS Code's when-clause language package.json uses: `a == b`, `a =~ /re/`, `!a`, `a`, `&&`. */
function whenMatches(when: string, ctx: Record<string, string | boolean | undefined>): boolean {
  return when.split('&&').every((term) => {
    const t = term.trim();
    let m = /^(\S+) == (\S+)$/.exec(t);
    if (m) return ctx[m[1]] === m[2];
    m = /^(\S+) =~ \/(.*)\/$/.exec(t);
    if (m) return new RegExp(m[2]).test(String(ctx[m[1]] ?? ''));
    m = /^!(\S+)$/.exec(t);
    if (m) return !ctx[m[1]];
    if (/^\S+$/.test(t)) return !!ctx[t];
    throw new Error(`when clause not understood: ${t}`);
  });
}

/** Whether `command` is in the Sandboxes view's context menu (any group) of a row. */
function inSandboxMenu(command: string, contextValue: string, group?: RegExp): boolean {
  return (manifest.contributes.menus['view/item/context'] as { command: string; when: string; group: string }[]).some(
    (m) => m.command === command && (!group || group.test(m.group)) && whenMatches(m.when, { view: 'abx.sandboxes', viewItem: contextValue }),
  );
}

function lastContext(key: string): unknown {
  const set = fake.recorded.executed.filter((e) => e.command === 'setContext' && e.args[0] === key);
  return set.at(-1)?.args[1];
}

describe('the manifest', () => {
  test('contributes exactly the commands the extension registers, each with a title', () => {
    const contributed = manifest.contributes.commands.map((c: { command: string }) => c.command).sort();
    assert.deepEqual(contributed, [...COMMANDS, ...CODE_COMMANDS, ...WORKSPACE_COMMANDS, ...NETWORK_COMMANDS, ...TEMPLATE_COMMANDS].sort());
    for (const c of manifest.contributes.commands) assert.ok(c.title && c.category === 'abx', c.command);
  });

  test('menus only name contributed commands; views and the MCP provider id match the code', () => {
    const known = new Set([...COMMANDS, ...CODE_COMMANDS, ...WORKSPACE_COMMANDS, ...NETWORK_COMMANDS, ...TEMPLATE_COMMANDS] as readonly string[]);
    for (const list of Object.values(manifest.contributes.menus) as { command: string }[][]) {
      for (const m of list) assert.ok(known.has(m.command), m.command);
    }
    assert.deepEqual(
      manifest.contributes.views.abx.map((v: { id: string }) => v.id),
      ['abx.sandboxes', 'abx.providers', 'abx.changes'],
    );
    assert.deepEqual(manifest.contributes.mcpServerDefinitionProviders.map((p: { id: string }) => p.id), [MCP_PROVIDER_ID]);
  });

  test('@types/vscode is pinned to engines.vscode (vsce refuses newer types)', () => {
    const engine = manifest.engines.vscode.replace(/^\^/, '');
    assert.equal(manifest.devDependencies['@types/vscode'], engine);
    // The MCP API is newer than the engine: it must be feature-tested, never assumed.
    assert.ok(Number(engine.split('.')[1]) < 101);
  });

  test('abx.path, abx.home, abx.connection: User settings apply in remote windows too; a workspace value is ignored', () => {
    const props = manifest.contributes.configuration.properties;
    for (const k of ['abx.path', 'abx.home', 'abx.connection']) {
      // VS Code drops machine(-overridable) values of the local User settings in a remote
      // window; window scope keeps them (Remote settings win), and the code skips workspace values.
      assert.equal(props[k].scope, 'window', k);
      assert.ok(manifest.capabilities.untrustedWorkspaces.restrictedConfigurations.includes(k));
    }
    fake.configuration.set('abx.path', '/usr/local/bin/abx');
    fake.workspaceConfiguration.set('abx.path', '/repo/evil-abx');
    fake.workspaceConfiguration.set('abx.home', '/repo/home');
    try {
      const s = readSettings();
      assert.equal(s.path, '/usr/local/bin/abx');
      assert.equal(s.home, '');
      assert.deepEqual(s.ignored, ['path', 'home']);
    } finally {
      fake.workspaceConfiguration.clear();
    }
  });

  test('the welcome views offer Reconnect only while not connected', () => {
    const welcome = manifest.contributes.viewsWelcome as { view: string; when?: string; contents: string }[];
    for (const connected of [true, false]) {
      const shown = welcome.filter((w) => w.view === 'abx.sandboxes' && whenMatches(w.when ?? 'true', { 'abx.connected': connected, true: true }));
      assert.equal(shown.length, 1, `connected=${connected}`);
      assert.equal(/command:abx\.reconnect/.test(shown[0].contents), !connected, shown[0].contents);
      assert.equal(/command:abx\.create/.test(shown[0].contents), connected, shown[0].contents);
    }
  });

  test('the terminal is offered only on running sandboxes whose provider has pty', () => {
    assert.ok(inSandboxMenu('abx.openTerminal', 'sandbox-running:pty', /^inline/));
    assert.ok(inSandboxMenu('abx.openTerminal', 'sandbox-running:pty'));
    assert.ok(!inSandboxMenu('abx.openTerminal', 'sandbox-running'));
    assert.ok(!inSandboxMenu('abx.openTerminal', 'sandbox-paused:pty'));
    assert.ok(inSandboxMenu('abx.runCommand', 'sandbox-running'));
    assert.ok(inSandboxMenu('abx.pause', 'sandbox-running:pty'));
    assert.ok(inSandboxMenu('abx.resume', 'sandbox-paused:pty'));
    assert.ok(!inSandboxMenu('abx.resume', 'sandbox-running:pty'));
  });
});

describe('extension on the real broker', { timeout: 240_000 }, () => {
  let home: Home;
  let ctx: ReturnType<typeof context>;
  let api: AbxExtensionApi;
  let sb: string;

  before(async () => {
    home = freshHome();
    fake.configuration.set('abx.path', ABX_BIN);
    fake.configuration.set('abx.home', home.dir);
    fake.configuration.set('abx.refreshInterval', 0);
    ctx = context();
    api = activate(ctx as unknown as vscode.ExtensionContext);
    await until(() => api.service.state.kind === 'connected' && api.service.sandboxes, 'connected with a sandbox list');
  });

  after(async () => {
    const done = deactivate();
    dispose(ctx);
    await done;
    home.cleanup();
  });

  test('activation registers every command, the abx: file system, both views and the status bar', () => {
    for (const c of COMMANDS) assert.ok(fake.recorded.commands.has(c), c);
    assert.equal(fake.recorded.fsProviders.get('abx'), api.fs);
    assert.ok(fake.recorded.treeViews.has('abx.sandboxes'));
    assert.ok(fake.recorded.treeViews.has('abx.providers'));
    const bar = fake.recorded.statusBar.at(-1);
    assert.equal(bar.text, '$(vm) abx: 0');
    assert.equal(bar.command, 'abx.showBrokerStatus');
  });

  test('create: the only provider with sandbox.lifecycle is used, the template picked from its templates/list; the view and status bar follow', async () => {
    fake.recorded.answers.push('$(star) Default', 'none'); // template: the provider's default; network: none
    const picks = fake.recorded.quickPicks.length;
    const created = await vscode.commands.executeCommand<{ id: string; provider: string; timeout: number }>('abx.create');
    assert.ok(created);
    // local declares templates.read: its templates are offered (the host's `base` first).
    const offered = fake.recorded.quickPicks[picks].map((i: { label: string }) => i.label);
    assert.deepEqual(offered.slice(0, 2), ['$(star) Default', 'base']);
    assert.equal(created.timeout, 300); // abx.defaultTimeout
    sb = `${created.provider}:${created.id}`;
    const roots = await api.sandboxes.getChildren();
    assert.deepEqual(
      roots.map((r) => (r.kind === 'group' ? r.provider : '?')),
      ['local'],
    );
    const kids = await api.sandboxes.getChildren(roots[0]);
    const node = kids.find((k) => k.kind === 'sandbox' && k.sandbox.id === created.id) as SandboxNode & { kind: 'sandbox' };
    assert.ok(node);
    const item = api.sandboxes.getTreeItem(node);
    // local declares pty: the row carries it, and its menu has the terminal.
    assert.equal(item.contextValue, 'sandbox-running:pty');
    assert.ok(inSandboxMenu('abx.openTerminal', item.contextValue));
    assert.equal((item.iconPath as vscode.ThemeIcon).id, 'vm-running');
    assert.match(String(item.description), /base · running · expires in \d/);
    assert.equal(fake.recorded.statusBar.at(-1).text, '$(vm) abx: 1');
    // The toast says the time left as the tree does, not a UTC timestamp.
    const toast = fake.recorded.messages.find((m) => m.text.startsWith(`Sandbox ${sb} created`))!;
    assert.match(toast.text, /expires in \d+m( \d+s)?\)/);
    assert.doesNotMatch(toast.text, /\d{4}-\d\d-\d\dT/);
    assert.deepEqual(toast.items, ['Open Terminal', 'Browse Files']);
  });

  test('connected: the welcome view context says so', () => {
    assert.equal(lastContext('abx.connected'), true);
  });

  test('broker status: counts in words (1 sandbox, not 1 sandboxes)', async () => {
    const s = await (await api.service.getClient()).status();
    assert.equal(s.sandboxes, 1);
    fake.recorded.answers.push(() => undefined);
    await vscode.commands.executeCommand('abx.showBrokerStatus');
    const head = fake.recorded.quickPicks.at(-1)![0];
    assert.match(head.description, /· 1 sandbox$/);
    assert.match(head.description, new RegExp(`· ${s.connections} connection${s.connections === 1 ? '' : 's'} ·`));
  });

  test('copy ID: to the clipboard, and the status bar says so', async () => {
    await vscode.commands.executeCommand('abx.copySandboxId', sb);
    assert.equal(fake.recorded.clipboard, sb);
    assert.match(fake.recorded.statusMessages.at(-1) ?? '', new RegExp(`Copied ${sb}`));
  });

  test('show sandbox info: a read-only virtual document, not a dirty untitled one', async () => {
    await vscode.commands.executeCommand('abx.sandboxInfo', sb);
    const doc = fake.recorded.documents.at(-1)!;
    assert.equal(doc.uri?.scheme, 'abx-doc');
    assert.match(doc.uri!.path, /\.json$/);
    assert.equal((doc as { isDirty?: boolean }).isDirty, false);
    const info = JSON.parse(doc.content!);
    assert.equal(`${info.sandbox.provider}:${info.sandbox.id}`, sb);
  });

  test('pause and resume from the view change the status icon', async () => {
    const node = (await sandboxNode(sb))!;
    await vscode.commands.executeCommand('abx.pause', node);
    const paused = (await sandboxNode(sb))!;
    const item = api.sandboxes.getTreeItem(paused);
    assert.equal(item.contextValue, 'sandbox-paused:pty');
    assert.ok(!inSandboxMenu('abx.openTerminal', item.contextValue!));
    assert.equal((item.iconPath as vscode.ThemeIcon).id, 'debug-pause');
    await vscode.commands.executeCommand('abx.resume', paused);
    assert.equal(api.sandboxes.getTreeItem((await sandboxNode(sb))!).contextValue, 'sandbox-running:pty');
  });

  test('extend timeout takes a duration', async () => {
    fake.recorded.answers.push('2h');
    await vscode.commands.executeCommand('abx.extendTimeout', sb);
    const s = api.service.sandboxes!.find((x) => `${x.provider}:${x.id}` === sb)!;
    assert.equal(s.timeout, 7200);
    const m = fake.recorded.messages.at(-1)!;
    assert.match(m.text, new RegExp(`^Sandbox ${sb} now expires in (1h 59m|2h)\\.$`));
  });

  test('run command streams into the output channel and returns the exit code', async () => {
    const code = await vscode.commands.executeCommand('abx.runCommand', sb, 'echo one; echo two >&2; exit 4');
    assert.equal(code, 4);
    const out = fake.recorded.output.get('abx: Run')!.join('');
    assert.match(out, /\$ echo one; echo two >&2; exit 4/);
    assert.match(out, /one\n/);
    assert.match(out, /two\n/);
    assert.match(out, /\[exit 4\]/);
    assert.ok(fake.recorded.messages.some((m) => m.level === 'warning' && /exited with code 4/.test(m.text)));
  });

  test('run command closes stdin: a command reading it ends', async () => {
    const code = await vscode.commands.executeCommand('abx.runCommand', sb, 'cat; echo after-cat');
    assert.equal(code, 0);
    assert.match(fake.recorded.output.get('abx: Run')!.join(''), /after-cat\n/);
  });

  test('open terminal from the explorer starts in the folder that was clicked', async () => {
    const client = await api.service.getClient();
    await client.filesMkdir(sb, '/workspace/sub/dir', true);
    await client.filesWriteAll(sb, '/workspace/sub/dir/f.txt', Buffer.from('x'));
    const ref = sb;
    for (const [p, want] of [
      ['/workspace/sub', '/workspace/sub'],
      ['/workspace/sub/dir/f.txt', '/workspace/sub/dir'],
    ]) {
      await vscode.commands.executeCommand('abx.openTerminal', vscode.Uri.from({ scheme: 'abx', authority: ref, path: p }));
      const t = fake.recorded.terminals.at(-1)!;
      let out = '';
      t.pty.onDidWrite((s: string) => (out += s));
      t.pty.open({ columns: 80, rows: 24 });
      t.pty.handleInput('echo "cwd=$(pwd)"; exit\r');
      await t.pty.exited;
      assert.match(out, new RegExp(`cwd=${want}\\r\\n`));
    }
  });

  test('open terminal: a Pseudoterminal on a pty exec in the sandbox', async () => {
    await vscode.commands.executeCommand('abx.openTerminal', sb);
    const t = fake.recorded.terminals.at(-1)!;
    assert.equal(t.name, `abx: ${sb}`);
    let out = '';
    t.pty.onDidWrite((s: string) => (out += s));
    t.pty.open({ columns: 90, rows: 20 });
    t.pty.handleInput('stty size; exit 6\r');
    assert.equal(await t.pty.exited, 6);
    assert.match(out, /20 90/);
  });

  test('closing a terminal ends its command in the sandbox', async () => {
    await vscode.commands.executeCommand('abx.openTerminal', sb);
    const t = fake.recorded.terminals.at(-1)!;
    t.pty.open({ columns: 80, rows: 24 });
    t.pty.handleInput('sleep 4243\r');
    const client = await api.service.getClient();
    await until(async () => (await client.processList(sb)).some((p) => p.command.includes('sleep 4243')), 'sleep running');
    // The terminal goes without its Pseudoterminal being closed (as when VS Code drops it).
    fake.fireCloseTerminal(t.terminal);
    await until(async () => !(await client.processList(sb)).some((p) => p.command.includes('sleep 4243')), 'sleep gone', 15_000);
  });

  test('browse files in a single-folder window asks first and opens a new window: the window is not reloaded', async () => {
    const before = [{ uri: vscode.Uri.file('/home/u/proj'), name: 'proj', index: 0 }];
    fake.workspace.workspaceFolders = before;
    fake.workspace.workspaceFile = undefined;
    try {
      const n = fake.recorded.messages.length;
      fake.recorded.answers.push('Open in New Window');
      const folder = await vscode.commands.executeCommand<vscode.Uri>('abx.browseFiles', sb);
      assert.ok(folder);
      assert.equal(fake.workspace.workspaceFolders, before, 'the workspace folders were not touched');
      const asked = fake.recorded.messages.slice(n)[0];
      assert.deepEqual(asked.items, ['Open in New Window', 'Add to This Window']);
      assert.equal(fake.recorded.messageOptions[n]?.modal, true);
      const open = fake.recorded.executed.at(-1)!;
      assert.equal(open.command, 'vscode.openFolder');
      // A workspace file whose one folder is the sandbox's, named after it (not `workspace`).
      assert.match(open.args[0].path, /\.code-workspace$/);
      const ws = JSON.parse(fs.readFileSync(open.args[0].fsPath, 'utf8'));
      assert.deepEqual(ws.folders, [{ name: `abx: ${sb}`, uri: folder.toString() }]);
      assert.deepEqual(open.args[1], { forceNewWindow: true });
      // Declining changes nothing either.
      fake.recorded.answers.push(undefined);
      assert.equal(await vscode.commands.executeCommand('abx.browseFiles', sb), undefined);
      assert.equal(fake.workspace.workspaceFolders, before);
    } finally {
      fake.workspace.workspaceFolders = undefined;
    }
  });

  test('upload and download through the commands, browse files adds an abx: folder to a multi-root workspace', async () => {
    const local = path.join(home.dir, 'local.txt');
    fs.writeFileSync(local, 'uploaded bytes\n');
    fake.recorded.answers.push('/workspace/remote.txt');
    await vscode.commands.executeCommand('abx.upload', sb, vscode.Uri.file(local));
    fake.workspace.workspaceFile = vscode.Uri.file('/home/u/work.code-workspace');
    const n = fake.recorded.messages.length;
    const folder = await vscode.commands.executeCommand<vscode.Uri>('abx.browseFiles', sb);
    assert.equal(fake.recorded.messages.length, n, 'a multi-root workspace takes the folder without a question');
    assert.ok(folder);
    assert.equal(folder.scheme, 'abx');
    assert.deepEqual(parseSandboxUri(folder), { sandbox: sb, path: '/workspace' });
    assert.equal(vscode.workspace.workspaceFolders?.at(-1)?.uri.toString(), folder.toString());
    // The explorer's context menu on a file passes its abx: URI.
    const file = vscode.Uri.from({ scheme: 'abx', authority: folder.authority, path: '/workspace/remote.txt' });
    assert.equal(new TextDecoder().decode(await api.fs.readFile(file)), 'uploaded bytes\n');
    const back = path.join(home.dir, 'back.txt');
    await vscode.commands.executeCommand('abx.download', file, vscode.Uri.file(back));
    assert.equal(fs.readFileSync(back, 'utf8'), 'uploaded bytes\n');
  });

  test('download from the Sandboxes view: a file picker on the sandbox, then a save dialog', async () => {
    const node = (await sandboxNode(sb))!;
    const picked = path.join(home.dir, 'picked.txt');
    fake.recorded.answers.push([sandboxUri(sb, '/workspace/remote.txt')] as never, vscode.Uri.file(picked) as never);
    const d = fake.recorded.dialogs.length;
    await vscode.commands.executeCommand('abx.download', node);
    const [open, save] = fake.recorded.dialogs.slice(d);
    assert.equal(open.kind, 'open');
    assert.deepEqual(parseSandboxUri(open.opts.defaultUri), { sandbox: sb, path: '/workspace' });
    assert.equal(open.opts.canSelectFiles, true);
    assert.equal(save.kind, 'save');
    assert.equal(fs.readFileSync(picked, 'utf8'), 'uploaded bytes\n');
  });

  test('open port URL opens the broker’s ports/url', async () => {
    const url = await vscode.commands.executeCommand('abx.openPort', sb, 8765);
    assert.equal(url, 'http://127.0.0.1:8765');
    assert.deepEqual(fake.recorded.opened.at(-1), 'http://127.0.0.1:8765');
  });

  test('providers view: trust, features, doctor results', async () => {
    const roots = (await api.providers.getChildren()) as (ProviderNode & { kind: 'provider' })[];
    const local = roots.find((r) => r.provider.id === 'local')!;
    assert.ok(local);
    const item = api.providers.getTreeItem(local);
    assert.match(String(item.description), /local · .* · builtin · default/);
    const kids = await api.providers.getChildren(local);
    const trust = kids.find((k) => k.kind === 'line' && k.label === 'Trust') as ProviderNode & { kind: 'line' };
    assert.equal(trust.description, 'builtin');
    const features = kids.find((k) => k.kind === 'features')!;
    const groups = (await api.providers.getChildren(features)).map((k) => (k.kind === 'line' ? k.label : ''));
    assert.ok(groups.some((g) => /^sandbox\(lifecycle/.test(g)), groups.join(' '));
    assert.ok(groups.includes('pty'));
    const doctor = kids.find((k) => k.kind === 'doctor')!;
    const checks = (await api.providers.getChildren(doctor)) as (ProviderNode & { kind: 'line' })[];
    assert.ok(checks.length > 0);
    assert.ok(checks.every((c) => c.icon === 'pass'), JSON.stringify(checks));
    assert.match(String(api.providers.getTreeItem(doctor).description), /all checks passed/);
    // Screen readers get the check and its verdict, never "null".
    for (const c of checks) {
      const label = api.providers.getTreeItem(c).accessibilityInformation?.label ?? '';
      assert.match(label, new RegExp(`^${c.label} check passed`));
      assert.doesNotMatch(label, /null|undefined/);
    }
  });

  test('contract kit: streamed per test into its output channel, summary at the end', async () => {
    const r = await vscode.commands.executeCommand<{ passed: number; failed: number }>('abx.runContractKit', 'local', 'files');
    assert.ok(r && r.passed > 0);
    assert.equal(r.failed, 0);
    const out = fake.recorded.output.get('abx: Contract Kit')!.join('');
    assert.match(out, /✓ \S+/);
    assert.match(out, new RegExp(`${r.passed} passed, 0 failed`));
  });

  test('install provider: the review shows the broker’s plan; declining installs nothing; confirming installs it pinned to the reviewed digest', async (t) => {
    const fixture = path.join(REPO_ROOT, 'tests', 'fixtures', 'plugins', 'node-local');
    if (!fs.existsSync(path.join(fixture, 'abx-provider.toml'))) {
      t.skip(`no fixture plugin at ${fixture}`);
      return;
    }
    fake.recorded.answers.push(undefined); // the confirmation: dismissed
    const m = fake.recorded.messages.length;
    const declined = await vscode.commands.executeCommand('abx.installProvider', fixture);
    assert.equal(declined, undefined);
    const review = fake.recorded.documents.at(-1)!;
    // Read-only, not an untitled document that asks to be saved.
    assert.equal(review.uri?.scheme, 'abx-doc');
    assert.match(review.uri!.path, /\.md$/);
    // The modal question carries the plan itself: the editor behind it cannot be scrolled.
    const q = fake.recorded.messages.slice(m).findIndex((x) => /^Install provider 'node-local'/.test(x.text));
    assert.ok(q >= 0);
    const detail = String(fake.recorded.messageOptions[m + q]?.detail);
    assert.match(detail, /Network: none/);
    // The dialog's message is the title line: the detail does not say it again (issue 45, item 15).
    assert.doesNotMatch(detail, /Install provider 'node-local'/);
    assert.match(detail, /Filesystem: data_dir, tmp/);
    assert.match(detail, /Spawns processes: yes/);
    assert.match(detail, /Digest: sha256:[0-9a-f]{64}/);
    assert.match(detail, /token \(optional, secret\)/);
    assert.match(review.content!, /# Install provider 'node-local' 0\.1\.0/);
    assert.match(review.content!, /\*\*Trust:\*\* local/);
    assert.match(review.content!, /\*\*Digest:\*\* sha256:[0-9a-f]{64}/);
    assert.match(review.content!, /\*\*Spawns processes:\*\* yes/);
    assert.match(review.content!, /`token` \(optional, secret\)/);
    const client = await api.service.getClient();
    assert.ok(!(await client.providerList()).some((p) => p.id === 'node-local'));

    fake.recorded.answers.push('Install');
    const done = await vscode.commands.executeCommand<{ id: string; digest: string; installed: boolean }>('abx.installProvider', fixture);
    assert.ok(done?.installed);
    assert.equal(done.id, 'node-local');
    assert.match(review.content!, new RegExp(done.digest.replace(/[:]/g, '\\$&')));
    const listed = (await client.providerList()).find((p) => p.id === 'node-local');
    assert.equal(listed?.trust, 'local');
  });

  test('a provider without pty: no terminal in its menu or its create toast, and the command says why', async (t) => {
    const client = await api.service.getClient();
    if (!(await client.providerList()).some((p) => p.id === 'node-local')) {
      t.skip('node-local is not installed (the install test was skipped)');
      return;
    }
    fake.recorded.answers.push(''); // template: the provider's default
    const created = await vscode.commands.executeCommand<{ id: string; provider: string }>('abx.create', 'node-local');
    assert.ok(created);
    const ref = `${created.provider}:${created.id}`;
    try {
      const toast = fake.recorded.messages.find((x) => x.text.startsWith(`Sandbox ${ref} created`))!;
      assert.deepEqual(toast.items, ['Browse Files']);
      const item = api.sandboxes.getTreeItem((await sandboxNode(ref))!);
      assert.equal(item.contextValue, 'sandbox-running');
      assert.ok(!inSandboxMenu('abx.openTerminal', item.contextValue!));
      assert.ok(inSandboxMenu('abx.runCommand', item.contextValue!));
      const n = fake.recorded.messages.length;
      const terms = fake.recorded.terminals.length;
      await vscode.commands.executeCommand('abx.openTerminal', ref);
      assert.equal(fake.recorded.terminals.length, terms);
      assert.match(fake.recorded.messages.slice(n).find((x) => x.level === 'error')!.text, /\[E8004\] Provider 'node-local' does not support 'pty'/);
    } finally {
      await client.sandboxKill(ref);
    }
  });

  test('offline: the sandbox list and its actions go; back online they come back', async () => {
    assert.ok(await sandboxNode(sb));
    fake.configuration.set('abx.path', '/nonexistent/abx');
    try {
      await api.service.settingsChanged();
      assert.equal(api.service.state.kind, 'error');
      assert.equal(api.service.sandboxes, undefined);
      assert.deepEqual(await api.sandboxes.getChildren(), []);
      assert.equal(fake.recorded.statusBar.at(-1).text, '$(vm-outline) abx: offline');
      assert.equal(lastContext('abx.connected'), false);
    } finally {
      fake.configuration.set('abx.path', ABX_BIN);
      await api.service.settingsChanged();
    }
    assert.equal(api.service.state.kind, 'connected');
    assert.ok(await sandboxNode(sb));
  });

  test('kill asks first; the sandbox is gone after, and its folder and editors close', async () => {
    fake.recorded.answers.push(undefined);
    await vscode.commands.executeCommand('abx.kill', sb);
    assert.ok(await sandboxNode(sb), 'still there after declining');
    const proj = { uri: vscode.Uri.file('/home/u/proj'), name: 'proj', index: 0 };
    fake.workspace.workspaceFolders = [proj, { uri: sandboxUri(sb), name: `abx: ${sb}`, index: 1 }];
    const mine = { label: 'remote.txt', input: new fake.TabInputText(sandboxUri(sb, '/workspace/remote.txt')) };
    const other = { label: 'x.txt', input: new fake.TabInputText(vscode.Uri.file('/home/u/proj/x.txt')) };
    fake.window.tabGroups.all = [{ tabs: [mine, other] }];
    try {
      fake.recorded.answers.push('Kill');
      await vscode.commands.executeCommand('abx.kill', sb);
      assert.equal(await sandboxNode(sb), undefined);
      assert.equal(fake.recorded.statusBar.at(-1).text, '$(vm) abx: 0');
      assert.deepEqual(fake.recorded.closedTabs, [mine]);
      assert.deepEqual(fake.workspace.workspaceFolders, [proj]);
    } finally {
      fake.workspace.workspaceFolders = undefined;
      fake.window.tabGroups.all = [];
    }
  });

  test('errors from commands are shown with their E-code and suggestion', async () => {
    const n = fake.recorded.messages.length;
    await vscode.commands.executeCommand('abx.pause', 'local:sb-nope');
    const m = fake.recorded.messages.slice(n).find((x) => x.level === 'error');
    assert.ok(m);
    assert.match(m.text, /\[E2009\] Sandbox 'sb-nope' not found\. Run 'abx list'/);
  });

  test('MCP: abx mcp is offered to the agent with the configured binary and ABX_HOME, and it answers', async () => {
    const provider = fake.recorded.mcpProviders.get(MCP_PROVIDER_ID);
    assert.ok(provider);
    const [def] = await provider.provideMcpServerDefinitions();
    assert.ok(def instanceof fake.McpStdioServerDefinition);
    assert.equal(def.command, ABX_BIN);
    assert.deepEqual(def.args, ['mcp']);
    assert.equal(def.env.ABX_HOME, home.dir);
    assert.equal(await provider.resolveMcpServerDefinition(def), def);
    // Start it as VS Code would and list its tools.
    const child = spawn(def.command as string, def.args as string[], {
      env: { ...process.env, ...(def.env as Record<string, string>) },
      stdio: ['pipe', 'pipe', 'inherit'],
    });
    const lines = readline.createInterface({ input: child.stdout });
    const replies: Record<number, { result?: { tools?: { name: string }[] } }> = {};
    lines.on('line', (l) => {
      const m = JSON.parse(l);
      if (m.id !== undefined) replies[m.id] = m;
    });
    const send = (m: object) => child.stdin.write(`${JSON.stringify(m)}\n`);
    send({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'test', version: '0' } } });
    await until(() => replies[1], 'initialize reply');
    send({ jsonrpc: '2.0', method: 'notifications/initialized' });
    send({ jsonrpc: '2.0', id: 2, method: 'tools/list', params: {} });
    const list = await until(() => replies[2], 'tools/list reply');
    const names = list.result!.tools!.map((t) => t.name);
    assert.ok(names.includes('sandbox_create') && names.includes('exec'), names.join(' '));
    child.stdin.end();
    await new Promise((r) => child.once('exit', r));
    fake.configuration.set('abx.mcp.enabled', false);
    await api.service.settingsChanged();
    assert.deepEqual(await provider.provideMcpServerDefinitions(), []);
    fake.configuration.set('abx.mcp.enabled', true);
    await api.service.settingsChanged();
  });

  test('MCP: on a VS Code without the API nothing is registered and nothing fails', () => {
    assert.equal(registerMcp(api.service, '0.1.0', { lm: {} }), undefined);
    assert.equal(registerMcp(api.service, '0.1.0', {}), undefined);
  });

  async function sandboxNode(ref: string): Promise<(SandboxNode & { kind: 'sandbox' }) | undefined> {
    await api.service.refreshSandboxes();
    for (const g of await api.sandboxes.getChildren()) {
      for (const k of await api.sandboxes.getChildren(g)) {
        if (k.kind === 'sandbox' && `${k.sandbox.provider}:${k.sandbox.id}` === ref) return k;
      }
    }
    return undefined;
  }
});

describe('extension without a usable abx', { timeout: 120_000 }, () => {
  test('a missing binary: an error with the fix, the status bar says offline, views say why', async () => {
    fake.configuration.set('abx.path', '/nonexistent/abx');
    fake.configuration.set('abx.home', '');
    const n = fake.recorded.messages.length;
    const ctx = context();
    fake.recorded.answers.push('Open Settings');
    try {
      const api = activate(ctx as unknown as vscode.ExtensionContext);
      await until(() => api.service.state.kind === 'error', 'error state');
      const m = await until(() => fake.recorded.messages.slice(n).find((x) => x.level === 'error'), 'an error message');
      assert.match(m.text, /\[E1007\] The abx binary '\/nonexistent\/abx' could not be run: not found/);
      assert.match(m.text, /abx\.path/);
      assert.deepEqual(m.items, ['Open Settings', 'Show Log', 'Retry']);
      // The setting itself, in whichever settings tab (User, Remote) is open.
      const open = await until(() => fake.recorded.executed.find((e) => e.command === 'workbench.action.openSettings'), 'settings opened');
      assert.deepEqual(open.args, ['@id:abx.path']);
      const bar = fake.recorded.statusBar.at(-1);
      assert.equal(bar.text, '$(vm-outline) abx: offline');
      assert.deepEqual(await api.sandboxes.getChildren(), []);
      assert.match(String(fake.recorded.treeViews.get('abx.sandboxes').message), /E1007/);
    } finally {
      dispose(ctx);
    }
  });

  test('a missing binary with the Providers view open: attempts follow the backoff, one error message; a settings change connects at once', async () => {
    fake.configuration.set('abx.path', '/nonexistent/abx');
    fake.configuration.set('abx.home', '');
    const n = fake.recorded.messages.length;
    const ctx = context();
    const home = freshHome();
    try {
      const api = activate(ctx as unknown as vscode.ExtensionContext);
      const out = () => fake.recorded.output.get('abx')!.join('');
      const attempts = () => [...out().matchAll(/^\[([^\]]+)\] connecting: (\S+)/gm)].map((m) => ({ at: Date.parse(m[1]), path: m[2] }));
      // The Providers view (visible in the fake, as in VS Code) repaints after every failure
      // and asks for the connection again: that must not be a new attempt each time.
      await until(() => attempts().length >= 3, 'the first attempt and two retries', 30_000);
      const [a, b, c] = attempts();
      assert.ok(b.at - a.at >= RETRY_BASE_MS - 20, `second attempt ${b.at - a.at} ms after the first`);
      assert.ok(c.at - b.at >= 2 * RETRY_BASE_MS - 20, `third attempt ${c.at - b.at} ms after the second`);
      assert.match(String(fake.recorded.treeViews.get('abx.providers').message), /E1007/);
      assert.equal(fake.recorded.messages.slice(n).filter((x) => x.level === 'error').length, 1, 'the failure is reported once');
      // A settings change connects now, not at the next retry.
      const due = api.service.nextRetryAt;
      assert.ok(due > Date.now());
      fake.configuration.set('abx.path', ABX_BIN);
      fake.configuration.set('abx.home', home.dir);
      fake.fireConfigurationChange('abx.path', 'abx.home');
      const next = await until(() => attempts().find((x) => x.path === ABX_BIN), 'an attempt with the new path');
      assert.ok(next.at < due, 'attempted before the planned retry');
      await until(() => api.service.state.kind === 'connected', 'connected');
    } finally {
      dispose(ctx);
      fake.configuration.set('abx.path', '/nonexistent/abx');
      home.cleanup();
    }
  });
});

/** Pids of this process's children that run `abx rpc` (from /proc). */
function abxRpcChildren(): number[] {
  const found: number[] = [];
  for (const d of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const stat = fs.readFileSync(`/proc/${d}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      const argv = fs.readFileSync(`/proc/${d}/cmdline`, 'utf8').split('\0');
      if (ppid === process.pid && argv[1] === 'rpc') found.push(Number(d));
    } catch {
      /* gone meanwhile */
    }
  }
  return found;
}

describe('extension host shutdown', { timeout: 120_000 }, () => {
  test("VS Code's order (deactivate, then the subscriptions in order): nothing throws, the terminal's command ends in the sandbox, abx rpc exits", async () => {
    const home = freshHome();
    fake.configuration.set('abx.path', ABX_BIN);
    fake.configuration.set('abx.home', home.dir);
    fake.configuration.set('abx.refreshInterval', 0);
    const ctx = context();
    const earlier = abxRpcChildren();
    try {
      const api = activate(ctx as unknown as vscode.ExtensionContext);
      await until(() => api.service.state.kind === 'connected', 'connected');
      // The extension's `abx rpc`: the one child that came with the activation.
      const rpcs = abxRpcChildren().filter((p) => !earlier.includes(p));
      assert.equal(rpcs.length, 1, JSON.stringify(rpcs));
      const rpc = rpcs[0];
      const observer = await home.connect();
      const s = await observer.sandboxCreate({ timeout: 600 });
      const sb = `${s.provider}:${s.id}`;
      await vscode.commands.executeCommand('abx.openTerminal', sb);
      const t = fake.recorded.terminals.at(-1)!;
      t.pty.open({ columns: 80, rows: 24 });
      t.pty.handleInput('sleep 4244\r');
      const running = async () => (await observer.processList(sb)).some((p) => p.command.includes('sleep 4244'));
      await until(running, 'sleep running in the terminal');

      const done = deactivate();
      const errors = dispose(ctx);
      await done;
      assert.deepEqual(errors.map(String), []);
      assert.ok(done, 'deactivate gives VS Code something to wait for');
      await until(async () => !(await running()), "the terminal's command ended", 15_000);
      const alive = () => {
        try {
          process.kill(rpc, 0);
          return true;
        } catch {
          return false;
        }
      };
      await until(() => !alive(), 'abx rpc exited', 15_000);
      assert.doesNotMatch(fake.recorded.output.get('abx')!.join(''), /Channel has been closed/);
    } finally {
      dispose(ctx);
      home.cleanup();
    }
  });
});

/** The `abx` CLI of `home` (another client of the same daemon), `--json`; its parsed output. */
function cli(home: Home, ...args: string[]): Promise<Record<string, unknown>> {
  return new Promise((resolve, reject) => {
    execFile(ABX_BIN, ['--json', ...args], { env: home.env, timeout: 120_000 }, (err, stdout, stderr) => {
      if (err) reject(new Error(`abx ${args.join(' ')}: ${err.message} ${stdout} ${stderr}`));
      else resolve(stdout.trim() ? JSON.parse(stdout) : {});
    });
  });
}

/** The Sandboxes view's rows as the tree shows them, by `provider:id` (no request is made). */
async function rows(api: AbxExtensionApi): Promise<Map<string, vscode.TreeItem>> {
  const out = new Map<string, vscode.TreeItem>();
  for (const g of await api.sandboxes.getChildren()) {
    for (const k of await api.sandboxes.getChildren(g)) {
      if (k.kind === 'sandbox') out.set(`${k.sandbox.provider}:${k.sandbox.id}`, api.sandboxes.getTreeItem(k));
    }
  }
  return out;
}

/** Counts the `sandbox/list` requests `client` sends from now on. */
function countLists(client: BrokerClient): { n: number } {
  const count = { n: 0 };
  const orig = client.sandboxList.bind(client);
  client.sandboxList = (provider?: string) => {
    count.n++;
    return orig(provider);
  };
  return count;
}

describe('the Sandboxes view follows sandbox/changed (no polling)', { timeout: 240_000 }, () => {
  let home: Home;
  let ctx: ReturnType<typeof context>;
  let api: AbxExtensionApi;
  let lists: { n: number };

  before(async () => {
    home = freshHome();
    fake.configuration.set('abx.path', ABX_BIN);
    fake.configuration.set('abx.home', home.dir);
    // A poll would only come after an hour: whatever shows up below came as an event.
    fake.configuration.set('abx.refreshInterval', 3600);
    ctx = context();
    api = activate(ctx as unknown as vscode.ExtensionContext);
    await until(() => api.service.state.kind === 'connected' && api.service.sandboxes, 'connected with a sandbox list');
    lists = countLists(await api.service.getClient());
  });

  after(async () => {
    const done = deactivate();
    dispose(ctx);
    await done;
    fake.configuration.set('abx.refreshInterval', 0);
    home.cleanup();
  });

  test('connected to a current broker: subscribed, so no poll is planned', () => {
    assert.equal(api.service.live, true);
    assert.doesNotMatch(fake.recorded.output.get('abx')!.join(''), /no sandbox\/subscribe|sandbox\/subscribe failed/);
  });

  test('sandboxes created, paused, resumed, extended by the CLI show in the view from the events alone', async () => {
    const before = lists.n;
    const s = (await cli(home, 'create', '--timeout', '600')) as unknown as Sandbox;
    const ref = `${s.provider}:${s.id}`;
    const created = await until(async () => (await rows(api)).get(ref), `${ref} in the view`);
    assert.equal(created.contextValue, 'sandbox-running:pty');
    // The status bar follows the (debounced) repaint.
    await until(() => fake.recorded.statusBar.at(-1).text === '$(vm) abx: 1', 'the status bar to count it');
    await cli(home, 'pause', ref);
    await until(async () => (await rows(api)).get(ref)?.contextValue === 'sandbox-paused:pty', `${ref} paused in the view`);
    await cli(home, 'resume', ref);
    await until(async () => (await rows(api)).get(ref)?.contextValue === 'sandbox-running:pty', `${ref} running again`);
    await cli(home, 'set-timeout', ref, '2h');
    await until(() => api.service.sandboxes?.find((x) => `${x.provider}:${x.id}` === ref)?.timeout === 7200, 'the new lifetime');
    assert.match(String((await rows(api)).get(ref)!.description), /expires in (1h 59m|2h)/);
    assert.equal(lists.n, before, 'no sandbox/list was needed');
    await cli(home, 'kill', '--yes', ref);
    await until(async () => !(await rows(api)).has(ref), `${ref} gone from the view`);
  });

  test('killed by another client: the row goes, and its editors, folder and terminals close', async () => {
    const s = (await cli(home, 'create', '--timeout', '600')) as unknown as Sandbox;
    const ref = `${s.provider}:${s.id}`;
    await until(async () => (await rows(api)).get(ref), `${ref} in the view`);
    await vscode.commands.executeCommand('abx.openTerminal', ref);
    const term = fake.recorded.terminals.at(-1)!;
    term.pty.open({ columns: 80, rows: 24 });
    const proj = { uri: vscode.Uri.file('/home/u/proj'), name: 'proj', index: 0 };
    fake.workspace.workspaceFolders = [proj, { uri: sandboxUri(ref), name: `abx: ${ref}`, index: 1 }];
    const mine = { label: 'a.txt', input: new fake.TabInputText(sandboxUri(ref, '/workspace/a.txt')) };
    const other = { label: 'x.txt', input: new fake.TabInputText(vscode.Uri.file('/home/u/proj/x.txt')) };
    fake.window.tabGroups.all = [{ tabs: [mine, other] }];
    const closedBefore = fake.recorded.closedTabs.length;
    const before = lists.n;
    try {
      await cli(home, 'kill', '--yes', ref);
      await until(async () => !(await rows(api)).has(ref), `${ref} gone from the view`);
      await until(() => term.terminal.disposed, 'its terminal closed');
      await until(() => fake.recorded.closedTabs.length > closedBefore, 'its editor closed');
      assert.deepEqual(fake.recorded.closedTabs.slice(closedBefore), [mine]);
      assert.deepEqual(fake.workspace.workspaceFolders, [proj]);
      assert.equal(lists.n, before, 'no sandbox/list was needed');
    } finally {
      fake.workspace.workspaceFolders = undefined;
      fake.window.tabGroups.all = [];
    }
  });

  test('a lifetime that ends: the sandbox leaves the view by itself', async () => {
    const before = lists.n;
    const s = (await cli(home, 'create', '--timeout', '5')) as unknown as Sandbox;
    const ref = `${s.provider}:${s.id}`;
    await until(() => api.service.sandboxes?.some((x) => `${x.provider}:${x.id}` === ref), `${ref} in the list`);
    await until(async () => !(await rows(api)).has(ref), `${ref} expired and gone from the view`, 90_000);
    assert.equal(lists.n, before, 'no sandbox/list was needed');
  });

  test('a burst of events repaints the view once', async () => {
    const client = await api.service.getClient();
    let fires = 0;
    const sub = api.service.onDidChangeSandboxes(() => fires++);
    try {
      // The broker's notifications as they come in one read (route is what the reader calls).
      const route = (client as unknown as { route(m: string, p: unknown): void }).route.bind(client);
      for (let i = 0; i < 20; i++) {
        route('sandbox/changed', {
          sandbox: `sb-burst-${i}`,
          provider: 'local',
          change: 'created',
          sandboxInfo: { id: `sb-burst-${i}`, provider: 'local', status: 'running', template: 'base' },
        });
      }
      for (let i = 0; i < 20; i++) route('sandbox/changed', { sandbox: `sb-burst-${i}`, provider: 'local', change: 'killed' });
      await until(() => fires > 0, 'a repaint');
      await new Promise((r) => setTimeout(r, EVENT_DEBOUNCE_MS * 3));
      assert.equal(fires, 1);
      assert.ok(!(await rows(api)).has('local:sb-burst-0'));
    } finally {
      sub.dispose();
    }
  });

  test('after abx rpc dies the extension reconnects, subscribes again, and events flow', async () => {
    const old = await api.service.getClient();
    const pid = old.pid!;
    process.kill(pid, 'SIGKILL');
    await until(() => old.isClosed, 'the old connection closed');
    const fresh = await until(
      () => api.service.state.kind === 'connected' && api.service.live === true && api.service.getClient().then((c) => (c !== old ? c : undefined)),
      'reconnected and subscribed',
    );
    // The list that follows a reconnect comes first (events were missed meanwhile), then only events.
    await until(() => api.service.sandboxes, 'the list after the reconnect');
    const after = countLists(fresh);
    const s = (await cli(home, 'create', '--timeout', '600')) as unknown as Sandbox;
    const ref = `${s.provider}:${s.id}`;
    await until(async () => (await rows(api)).get(ref), `${ref} in the view after the reconnect`);
    assert.equal(after.n, 0, 'no sandbox/list was needed');
    await cli(home, 'kill', '--yes', ref);
    await until(async () => !(await rows(api)).has(ref), `${ref} gone`);
  });
});

describe('on a broker without sandbox/subscribe the view polls', { timeout: 120_000 }, () => {
  test('subscribe answers -32601: logged once, the list is refreshed every abx.refreshInterval seconds', async () => {
    const home = freshHome();
    // An `abx` whose broker lacks the method: the real one behind test/old-broker.ts.
    const old = path.join(home.dir, 'old-abx');
    fs.writeFileSync(old, `#!/bin/sh\nABX_REAL_BIN='${ABX_BIN}' exec '${process.execPath}' '${path.join(__dirname, 'old-broker.js')}' "$@"\n`, { mode: 0o755 });
    fake.configuration.set('abx.path', old);
    fake.configuration.set('abx.home', home.dir);
    fake.configuration.set('abx.refreshInterval', 1);
    const ctx = context();
    try {
      const api = activate(ctx as unknown as vscode.ExtensionContext);
      await until(() => api.service.state.kind === 'connected' && api.service.sandboxes, 'connected with a sandbox list');
      assert.equal(api.service.live, false);
      const log = fake.recorded.output.get('abx')!.join('');
      assert.match(log, /the broker has no sandbox\/subscribe \(abx [\d.]+\): the Sandboxes view refreshes every 1 s instead \(abx\.refreshInterval\)/);
      const lists = countLists(await api.service.getClient());
      const s = (await cli(home, 'create', '--timeout', '600')) as unknown as Sandbox;
      const ref = `${s.provider}:${s.id}`;
      await until(async () => (await rows(api)).get(ref), `${ref} in the view (by the poll)`);
      assert.ok(lists.n > 0, 'it came through sandbox/list');
      await cli(home, 'kill', '--yes', ref);
      await until(async () => !(await rows(api)).has(ref), `${ref} gone (by the poll)`);
    } finally {
      const done = deactivate();
      dispose(ctx);
      await done;
      fake.configuration.set('abx.refreshInterval', 0);
      fake.configuration.set('abx.path', ABX_BIN);
      home.cleanup();
    }
  });
});
