// The extension activated on the fake UI surface, driving the real broker: the manifest and
// the code agree, and the commands, views, status bar and MCP registration do what they say.
import './register-vscode';
import * as assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import * as readline from 'node:readline';
import { after, before, describe, test } from 'node:test';
import * as vscode from 'vscode';
import { parseSandboxUri } from '../src/adapters/fs';
import { COMMANDS } from '../src/commands';
import { activate, AbxExtensionApi } from '../src/extension';
import { MCP_PROVIDER_ID, registerMcp } from '../src/mcp';
import type { ProviderNode, SandboxNode } from '../src/views';
import { ABX_BIN, EXT_DIR, freshHome, Home, REPO_ROOT, until } from './helpers';
// eslint-disable-next-line @typescript-eslint/no-require-imports
const fake = require('./fake-vscode') as typeof import('./fake-vscode');

const manifest = JSON.parse(fs.readFileSync(path.join(EXT_DIR, 'package.json'), 'utf8'));

function context() {
  return { subscriptions: [] as { dispose(): unknown }[], extension: { packageJSON: manifest } };
}

function dispose(ctx: ReturnType<typeof context>) {
  for (const d of ctx.subscriptions.reverse()) d.dispose();
}

describe('the manifest', () => {
  test('contributes exactly the commands the extension registers, each with a title', () => {
    const contributed = manifest.contributes.commands.map((c: { command: string }) => c.command).sort();
    assert.deepEqual(contributed, [...COMMANDS].sort());
    for (const c of manifest.contributes.commands) assert.ok(c.title && c.category === 'abx', c.command);
  });

  test('menus only name contributed commands; views and the MCP provider id match the code', () => {
    const known = new Set(COMMANDS as readonly string[]);
    for (const list of Object.values(manifest.contributes.menus) as { command: string }[][]) {
      for (const m of list) assert.ok(known.has(m.command), m.command);
    }
    assert.deepEqual(
      manifest.contributes.views.abx.map((v: { id: string }) => v.id),
      ['abx.sandboxes', 'abx.providers'],
    );
    assert.deepEqual(manifest.contributes.mcpServerDefinitionProviders.map((p: { id: string }) => p.id), [MCP_PROVIDER_ID]);
  });

  test('@types/vscode is pinned to engines.vscode (vsce refuses newer types)', () => {
    const engine = manifest.engines.vscode.replace(/^\^/, '');
    assert.equal(manifest.devDependencies['@types/vscode'], engine);
    // The MCP API is newer than the engine: it must be feature-tested, never assumed.
    assert.ok(Number(engine.split('.')[1]) < 101);
  });

  test('abx.path and abx.home cannot come from a workspace (they choose what runs)', () => {
    const props = manifest.contributes.configuration.properties;
    for (const k of ['abx.path', 'abx.home', 'abx.connection']) {
      assert.equal(props[k].scope, 'machine', k);
      assert.ok(manifest.capabilities.untrustedWorkspaces.restrictedConfigurations.includes(k));
    }
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

  after(() => {
    dispose(ctx);
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

  test('create: the only provider with sandbox.lifecycle is used, the template asked; the view and status bar follow', async () => {
    fake.recorded.answers.push(''); // template: the provider's default
    const created = await vscode.commands.executeCommand<{ id: string; provider: string; timeout: number }>('abx.create');
    assert.ok(created);
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
    assert.equal(item.contextValue, 'sandbox-running');
    assert.equal((item.iconPath as vscode.ThemeIcon).id, 'vm-running');
    assert.match(String(item.description), /base · running · expires in \d/);
    assert.equal(fake.recorded.statusBar.at(-1).text, '$(vm) abx: 1');
  });

  test('pause and resume from the view change the status icon', async () => {
    const node = (await sandboxNode(sb))!;
    await vscode.commands.executeCommand('abx.pause', node);
    const paused = (await sandboxNode(sb))!;
    const item = api.sandboxes.getTreeItem(paused);
    assert.equal(item.contextValue, 'sandbox-paused');
    assert.equal((item.iconPath as vscode.ThemeIcon).id, 'debug-pause');
    await vscode.commands.executeCommand('abx.resume', paused);
    assert.equal(api.sandboxes.getTreeItem((await sandboxNode(sb))!).contextValue, 'sandbox-running');
  });

  test('extend timeout takes a duration', async () => {
    fake.recorded.answers.push('2h');
    await vscode.commands.executeCommand('abx.extendTimeout', sb);
    const s = api.service.sandboxes!.find((x) => `${x.provider}:${x.id}` === sb)!;
    assert.equal(s.timeout, 7200);
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

  test('upload and download through the commands, browse files adds an abx: folder', async () => {
    const local = path.join(home.dir, 'local.txt');
    fs.writeFileSync(local, 'uploaded bytes\n');
    fake.recorded.answers.push('/workspace/remote.txt');
    await vscode.commands.executeCommand('abx.upload', sb, vscode.Uri.file(local));
    const folder = await vscode.commands.executeCommand<vscode.Uri>('abx.browseFiles', sb);
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
    const declined = await vscode.commands.executeCommand('abx.installProvider', fixture);
    assert.equal(declined, undefined);
    const review = fake.recorded.documents.at(-1)!;
    assert.equal(review.language, 'markdown');
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

  test('kill asks first; the sandbox is gone after', async () => {
    fake.recorded.answers.push(undefined);
    await vscode.commands.executeCommand('abx.kill', sb);
    assert.ok(await sandboxNode(sb), 'still there after declining');
    fake.recorded.answers.push('Kill');
    await vscode.commands.executeCommand('abx.kill', sb);
    assert.equal(await sandboxNode(sb), undefined);
    assert.equal(fake.recorded.statusBar.at(-1).text, '$(vm) abx: 0');
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

describe('extension without a usable abx', { timeout: 60_000 }, () => {
  test('a missing binary: an error with the fix, the status bar says offline, views say why', async () => {
    fake.configuration.set('abx.path', '/nonexistent/abx');
    fake.configuration.set('abx.home', '');
    const n = fake.recorded.messages.length;
    const ctx = context();
    try {
      const api = activate(ctx as unknown as vscode.ExtensionContext);
      await until(() => api.service.state.kind === 'error', 'error state');
      const m = await until(() => fake.recorded.messages.slice(n).find((x) => x.level === 'error'), 'an error message');
      assert.match(m.text, /\[E1007\] The abx binary '\/nonexistent\/abx' could not be run: not found/);
      assert.match(m.text, /abx\.path/);
      assert.deepEqual(m.items, ['Open Settings', 'Show Log', 'Retry']);
      const bar = fake.recorded.statusBar.at(-1);
      assert.equal(bar.text, '$(vm-outline) abx: offline');
      assert.deepEqual(await api.sandboxes.getChildren(), []);
      assert.match(String(fake.recorded.treeViews.get('abx.sandboxes').message), /E1007/);
    } finally {
      dispose(ctx);
    }
  });
});
