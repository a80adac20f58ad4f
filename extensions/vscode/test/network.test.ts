// Egress by name (src/network.ts, issue 44) on the fake UI surface against the real broker:
// the network asked at create (a policy from "only these hosts…"), the policy and its blocked
// counts in the Sandboxes view, "Allow Host for Sandbox..." (sandbox/setNetwork), and a
// refused request (`sandbox/blocked`) shown once per host with Allow.
//
// No traffic leaves the machine: the refused requests go to the sandbox's proxy on its
// loopback, for names under `.invalid` that nothing allows, and the proxy refuses them by
// name before resolving anything (broker/egress/src/proxy.rs, `check_name`). A host that was
// allowed is never asked for afterwards.
import './register-vscode';
import * as assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import * as vscode from 'vscode';
import type { Sandbox } from '../src/client/types';
import { activate, AbxExtensionApi, deactivate } from '../src/extension';
import {
  allowEntry,
  blockedText,
  NETWORK_COMMANDS,
  NETWORK_PICKS,
  networkChildren,
  networkTooltip,
  parseHosts,
  policyOf,
  withBlocked,
} from '../src/network';
import { sandboxContext, SandboxNode } from '../src/views';
import { ABX_BIN, EXT_DIR, freshHome, Home, until } from './helpers';
// eslint-disable-next-line @typescript-eslint/no-require-imports
const fake = require('./fake-vscode') as typeof import('./fake-vscode');

const manifest = JSON.parse(fs.readFileSync(path.join(EXT_DIR, 'package.json'), 'utf8'));

/** Whether `command` is in the Sandboxes view's menu of a row (`group` matching). */
function inSandboxMenu(command: string, viewItem: string, group: RegExp): boolean {
  return (manifest.contributes.menus['view/item/context'] as { command: string; when: string; group: string }[]).some((m) => {
    if (m.command !== command || !group.test(m.group)) return false;
    return m.when.split('&&').every((t) => {
      const term = t.trim();
      let x = /^view == (\S+)$/.exec(term);
      if (x) return x[1] === 'abx.sandboxes';
      x = /^viewItem =~ \/(.*)\/$/.exec(term);
      if (x) return new RegExp(x[1]).test(viewItem);
      x = /^viewItem == (\S+)$/.exec(term);
      if (x) return x[1] === viewItem;
      throw new Error(`when clause not understood: ${term}`);
    });
  });
}

const policySandbox = {
  id: 'sb-1',
  provider: 'local',
  status: 'running',
  network: { allow: ['pypi.example', '*.files.example'], deny: ['bad.files.example'], blocked: [{ host: 'evil.example', port: 443, count: 3, last: '2026-12-05T10:00:00Z' }] },
} as unknown as Sandbox;

describe('network helpers', () => {
  test('an allow list as typed: commas and spaces, empty entries dropped', () => {
    assert.deepEqual(parseHosts(' a.example, *.b.example ,, c.example:8443  d.example'), ['a.example', '*.b.example', 'c.example:8443', 'd.example']);
    assert.deepEqual(parseHosts(' , '), []);
  });

  test('Allow adds the host for 80 and 443, host:port otherwise', () => {
    assert.equal(allowEntry('a.example', 443), 'a.example');
    assert.equal(allowEntry('a.example', 80), 'a.example');
    assert.equal(allowEntry('a.example', 8080), 'a.example:8080');
    assert.equal(allowEntry('10.0.0.1', 5432), '10.0.0.1:5432');
    assert.equal(allowEntry('2001:db8::1', 8443), '[2001:db8::1]:8443');
  });

  test('the notification text names the sandbox, host, port and count', () => {
    assert.equal(blockedText({ sandbox: 'sb-1', provider: 'local', host: 'x.example', port: 443, count: 1 }), 'Sandbox local:sb-1 tried to reach x.example:443 (blocked 1 time).');
    assert.equal(blockedText({ sandbox: 'local:sb-1', provider: 'local', host: 'x.example', port: 80, count: 4 }), 'Sandbox local:sb-1 tried to reach x.example:80 (blocked 4 times).');
  });

  test('tooltip and rows: the policy and what it refused; a mode is one line, no rows', () => {
    const md = networkTooltip(policySandbox);
    assert.match(md, /only these hosts: `pypi\.example`, `\*\.files\.example`/);
    assert.match(md, /Denied: `bad\.files\.example`/);
    assert.match(md, /Blocked: `evil\.example:443` 3 times/);
    const rows = networkChildren(policySandbox) as (SandboxNode & { kind: 'network' })[];
    assert.deepEqual(
      rows.map((r) => [r.label, r.description]),
      [
        ['Allowed', 'pypi.example, *.files.example'],
        ['Denied', 'bad.files.example'],
        ['evil.example:443', 'blocked 3 times'],
      ],
    );
    assert.deepEqual(rows[2].blocked, { host: 'evil.example', port: 443 });
    const none = { ...policySandbox, network: 'none' } as unknown as Sandbox;
    assert.equal(networkTooltip(none), '- Network: `none`\n');
    assert.deepEqual(networkChildren(none), []);
    assert.equal(sandboxContext(policySandbox, ['pty']), 'sandbox-running:pty:policy');
    assert.equal(sandboxContext(none, ['pty']), 'sandbox-running:pty');
  });

  test('an event updates the counts of its host (newest first), others stay', () => {
    const s = withBlocked(policySandbox, { sandbox: 'sb-1', provider: 'local', host: 'new.example', port: 80, count: 1 });
    assert.deepEqual(
      policyOf(s)!.blocked!.map((b) => `${b.host}:${b.port}=${b.count}`),
      ['new.example:80=1', 'evil.example:443=3'],
    );
    const again = withBlocked(s, { sandbox: 'sb-1', provider: 'local', host: 'evil.example', port: 443, count: 4 });
    assert.deepEqual(
      policyOf(again)!.blocked!.map((b) => `${b.host}:${b.port}=${b.count}`),
      ['evil.example:443=4', 'new.example:80=1'],
    );
  });

  test('the menus: Allow Host on sandboxes with a policy and inline on blocked hosts; in the palette', () => {
    assert.ok(inSandboxMenu('abx.allowHost', 'sandbox-running:pty:policy', /./));
    assert.ok(inSandboxMenu('abx.allowHost', 'sandbox-paused:policy', /./));
    assert.ok(!inSandboxMenu('abx.allowHost', 'sandbox-running:pty', /./));
    assert.ok(inSandboxMenu('abx.allowHost', 'blockedHost', /^inline/));
    assert.ok(!inSandboxMenu('abx.allowHost', 'networkLine', /./));
    const titles = Object.fromEntries(manifest.contributes.commands.map((c: { command: string; title: string }) => [c.command, c.title]));
    assert.equal(titles['abx.allowHost'], 'Allow Host for Sandbox...');
    const hidden = (manifest.contributes.menus.commandPalette as { command: string; when: string }[]).filter((m) => m.when === 'false').map((m) => m.command);
    assert.ok(!hidden.includes('abx.allowHost'));
  });
});

describe('network policies on the real broker', { timeout: 240_000 }, () => {
  let home: Home;
  const ctx = { subscriptions: [] as { dispose(): unknown }[], extension: { packageJSON: manifest } };
  let api: AbxExtensionApi;
  let sb: string;

  before(async () => {
    home = freshHome();
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
  });

  async function info(ref: string): Promise<Sandbox> {
    return (await api.service.getClient()).sandboxInfo(ref);
  }

  async function allowed(ref: string): Promise<string[]> {
    return (policyOf(await info(ref))?.allow ?? []).map(String);
  }

  async function node(ref: string): Promise<SandboxNode & { kind: 'sandbox' }> {
    for (const g of await api.sandboxes.getChildren()) {
      for (const k of await api.sandboxes.getChildren(g)) {
        if (k.kind === 'sandbox' && `${k.sandbox.provider}:${k.sandbox.id}` === ref) return k;
      }
    }
    assert.fail(`the Sandboxes view lists ${ref}`);
  }

  async function rows(ref: string): Promise<(SandboxNode & { kind: 'network' })[]> {
    return (await api.sandboxes.getChildren(await node(ref))) as (SandboxNode & { kind: 'network' })[];
  }

  async function curl(url: string): Promise<string> {
    const r = (await (await api.service.getClient()).execRun({
      sandbox: sb,
      command: `curl -s -o /dev/null -w '%{http_code}' ${url}`,
    })) as unknown as { stdout: string; stderr: string };
    return r.stdout.trim();
  }

  function messages(re: RegExp): { level: string; text: string; items: string[] }[] {
    return fake.recorded.messages.filter((m) => re.test(m.text));
  }

  test('the command is registered', () => {
    for (const c of NETWORK_COMMANDS) assert.ok(fake.recorded.commands.has(c), c);
  });

  test('create asks for the network: none by default, "only these hosts…" takes a list, internet says what it opens', async () => {
    const picks = fake.recorded.quickPicks.length;
    // template, network, the hosts
    fake.recorded.answers.push('$(star) Default', NETWORK_PICKS.policy, 'allowed.example, api.example:8443');
    const created = await vscode.commands.executeCommand<Sandbox>('abx.create');
    assert.ok(created, `created: ${JSON.stringify(fake.recorded.messages.slice(-2))}`);
    sb = `${created.provider}:${created.id}`;
    const offered = fake.recorded.quickPicks[picks + 1] as vscode.QuickPickItem[];
    assert.deepEqual(
      offered.map((i) => i.label),
      ['none', 'only these hosts…', 'internet', 'host'],
    );
    assert.equal(offered[0].description, 'default');
    assert.match(String(offered[2].detail), /whole internet/);
    assert.deepEqual(await allowed(sb), ['allowed.example', 'api.example:8443']);
    assert.ok(messages(new RegExp(`^Sandbox ${sb} created .*\\(network: only allowed\\.example, api\\.example:8443\\)\\.$`)).length);
  });

  test('the Sandboxes view shows the policy: tooltip, context, rows under the sandbox', async () => {
    const n = await node(sb);
    const item = api.sandboxes.getTreeItem(n);
    assert.equal(item.collapsibleState, vscode.TreeItemCollapsibleState.Collapsed);
    assert.match(String(item.contextValue), /:policy$/);
    const tip = (item.tooltip as vscode.MarkdownString).value;
    assert.match(tip, /only these hosts: `allowed\.example`, `api\.example:8443`/);
    assert.match(tip, /Blocked: nothing yet/);
    const r = await rows(sb);
    assert.deepEqual(
      r.map((x) => [x.label, x.description]),
      [
        ['Allowed', 'allowed.example, api.example:8443'],
        ['Blocked', 'nothing yet'],
      ],
    );
  });

  test('"Allow Host for Sandbox...": an input box, then sandbox/setNetwork; the view follows', async () => {
    fake.recorded.answers.push('more.example, db.example:5432');
    const r = await vscode.commands.executeCommand<Sandbox>('abx.allowHost', sb);
    assert.ok(r, JSON.stringify(fake.recorded.messages.slice(-2)));
    assert.deepEqual(await allowed(sb), ['allowed.example', 'api.example:8443', 'more.example', 'db.example:5432']);
    await until(async () => (await rows(sb))[0].description === 'allowed.example, api.example:8443, more.example, db.example:5432', 'the Allowed row updated');
    // Without a sandbox: a picker of the sandboxes with a policy.
    fake.recorded.answers.push(sb, 'third.example');
    await vscode.commands.executeCommand('abx.allowHost');
    assert.ok((await allowed(sb)).includes('third.example'));
    // Again: not added twice.
    await vscode.commands.executeCommand('abx.allowHost', sb, 'third.example');
    assert.equal((await allowed(sb)).filter((h) => h === 'third.example').length, 1);
  });

  test('a sandbox with a network mode has no host list: Allow says so (E1004)', async () => {
    const client = await api.service.getClient();
    const plain = await client.sandboxCreate({ network: 'none' as never });
    const ref = `${plain.provider}:${plain.id}`;
    try {
      const at = fake.recorded.messages.length;
      const r = await vscode.commands.executeCommand('abx.allowHost', ref, 'x.example');
      assert.equal(r, undefined);
      const err = fake.recorded.messages.slice(at).find((m) => m.level === 'error');
      assert.ok(err, 'an error message');
      assert.match(err.text, /^\[E1004\] Sandbox .* has no host list to add to: its network is 'none'/);
    } finally {
      await client.sandboxKill(ref);
    }
  });

  test('a refused request: the proxy answers 403, the notification names it, Allow adds the host', async () => {
    fake.recorded.answers.push('Allow');
    assert.equal(await curl('http://denied.invalid/'), '403');
    const note = await until(() => messages(/tried to reach denied\.invalid:80/)[0], 'the blocked notification');
    assert.equal(note.text, `Sandbox ${sb} tried to reach denied.invalid:80 (blocked 1 time).`);
    assert.equal(note.level, 'warning');
    assert.deepEqual(note.items, ['Allow', 'Dismiss']);
    await until(async () => (await allowed(sb)).includes('denied.invalid'), 'denied.invalid in the allow list');
    await until(() => messages(/^Sandbox .* may now reach denied\.invalid\.$/)[0], 'the confirmation');
    // The count is in sandbox/info and the view.
    const blocked = policyOf(await info(sb))!.blocked!;
    assert.deepEqual(
      blocked.map((b) => [b.host, b.port, b.count]),
      [['denied.invalid', 80, 1]],
    );
    const row = await until(async () => (await rows(sb)).find((x) => x.label === 'denied.invalid:80'), 'the blocked row');
    assert.equal(row.description, 'blocked once');
    assert.equal(api.sandboxes.getTreeItem(row).contextValue, 'blockedHost');
    assert.match(String(api.sandboxes.getTreeItem(await node(sb)).description), /1 blocked/);
    // Not asked for again: the name was allowed, and would now be resolved.
  });

  test('a retry loop shows one notification per host until it is answered; a port other than 80/443 is allowed as host:port', async () => {
    let answer!: (pick: string | undefined) => void;
    const pending = new Promise<string | undefined>((r) => (answer = r));
    fake.recorded.answers.push(() => pending);
    for (let i = 0; i < 5; i++) assert.equal(await curl('http://loop.invalid:8080/'), '403');
    // the counts follow each event, in the view too
    await until(async () => (await rows(sb)).find((x) => x.label === 'loop.invalid:8080' && x.description === 'blocked 5 times'), 'five attempts counted');
    assert.equal(messages(/tried to reach loop\.invalid/).length, 1);
    assert.equal(api.network.pending, 1);
    answer('Dismiss');
    await until(() => api.network.pending === 0, 'the notification answered');
    assert.ok(!(await allowed(sb)).includes('loop.invalid:8080'), 'Dismiss allows nothing');
    // Answered: the next attempt asks again; Allow adds host:port.
    fake.recorded.answers.push('Allow');
    assert.equal(await curl('http://loop.invalid:8080/'), '403');
    const again = await until(() => messages(/tried to reach loop\.invalid:8080/)[1], 'a second notification');
    assert.equal(again.text, `Sandbox ${sb} tried to reach loop.invalid:8080 (blocked 6 times).`);
    await until(async () => (await allowed(sb)).includes('loop.invalid:8080'), 'loop.invalid:8080 in the allow list');
    await until(() => messages(/may now reach loop\.invalid:8080/)[0], 'the confirmation');
  });

  test('Allow from a blocked row of the view', async () => {
    assert.equal(await curl('http://row.invalid:8081/'), '403');
    // the notification: dismissed (no answer queued)
    const row = await until(async () => (await rows(sb)).find((x) => x.label === 'row.invalid:8081'), 'the blocked row');
    await vscode.commands.executeCommand('abx.allowHost', row);
    assert.ok((await allowed(sb)).includes('row.invalid:8081'));
  });
});
