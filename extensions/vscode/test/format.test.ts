// Pure helpers: durations, ports, feature groups, remaining time, template names, errors.
import * as assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { AbxError } from '../src/client/errors';
import { applySandboxChange, changedRef, changeEndsSandbox, formatExpiry, formatPlanText, formatRemaining, groupByProvider, groupFeatures, parseDuration, parsePort, plural, sandboxRef, templateNames } from '../src/client/format';
import { compareVersions, parseVersion } from '../src/client/version';

describe('format helpers', () => {
  test('sandbox/changed applied to a list: upsert with sandboxInfo, removal when gone, reload when it says too little', () => {
    const a = { id: 'sb-a', provider: 'local', status: 'running' };
    const b = { id: 'sb-b', provider: 'e2b', status: 'running' };
    const list = [a, b];
    assert.equal(changedRef({ sandbox: 'sb-a', provider: 'local' }), 'local:sb-a');
    assert.equal(changedRef({ sandbox: 'local:sb-a', provider: 'local' }), 'local:sb-a');
    assert.ok(changeEndsSandbox({ change: 'killed' }) && changeEndsSandbox({ change: 'expired' }));
    assert.ok(!changeEndsSandbox({ change: 'timeout' }));
    const created = applySandboxChange(list, { sandbox: 'sb-c', provider: 'local', change: 'created', sandboxInfo: { id: 'sb-c', provider: 'local', status: 'running' } });
    assert.deepEqual(created, { list: [a, b, { id: 'sb-c', provider: 'local', status: 'running' }], reload: false });
    assert.equal(list.length, 2, 'the list given is not changed');
    const extended = applySandboxChange(list, { sandbox: 'sb-a', provider: 'local', change: 'timeout', sandboxInfo: { ...a, timeout: 900 } });
    assert.equal(extended.list[0].timeout, 900);
    assert.deepEqual(applySandboxChange(list, { sandbox: 'sb-b', provider: 'e2b', change: 'killed' }), { list: [a], reload: false });
    assert.deepEqual(applySandboxChange(list, { sandbox: 'sb-x', provider: 'e2b', change: 'expired' }), { list, reload: false });
    // The same id on another provider is another sandbox.
    assert.deepEqual(applySandboxChange(list, { sandbox: 'sb-a', provider: 'e2b', change: 'killed' }).list, list);
    assert.equal(applySandboxChange(list, { sandbox: 'sb-a', provider: 'local', change: 'paused' }).list[0].status, 'paused');
    assert.equal(applySandboxChange(list, { sandbox: 'sb-x', provider: 'local', change: 'created' }).reload, true);
    assert.equal(applySandboxChange(list, { sandbox: 'sb-a', provider: 'local', change: 'resync' }).reload, true);
  });

  test('durations as the CLI takes them, within 1 s .. 30 days', () => {
    assert.equal(parseDuration('600'), 600);
    assert.equal(parseDuration('90s'), 90);
    assert.equal(parseDuration('10m'), 600);
    assert.equal(parseDuration(' 2h '), 7200);
    assert.equal(parseDuration('1d'), 86400);
    assert.equal(parseDuration('30d'), 2_592_000);
    assert.equal(parseDuration('31d'), undefined);
    assert.equal(parseDuration('0'), undefined);
    assert.equal(parseDuration('-5'), undefined);
    assert.equal(parseDuration('5 minutes'), undefined);
  });

  test('ports', () => {
    assert.equal(parsePort('8080'), 8080);
    assert.equal(parsePort('0'), undefined);
    assert.equal(parsePort('65536'), undefined);
    assert.equal(parsePort('80a'), undefined);
  });

  test('features grouped as the CLI shows them', () => {
    assert.deepEqual(groupFeatures(['sandbox.lifecycle', 'sandbox.timeout', 'exec.run', 'pty', 'sandbox.pause', 'files.rw']), [
      'sandbox(lifecycle,timeout,pause)',
      'exec(run)',
      'pty',
      'files(rw)',
    ]);
    assert.deepEqual(groupFeatures([]), []);
  });

  test('remaining time: two units at most', () => {
    assert.equal(formatRemaining(-1), 'expired');
    assert.equal(formatRemaining(59_000), '59s');
    assert.equal(formatRemaining(250_000), '4m 10s');
    assert.equal(formatRemaining(7_500_000), '2h 5m');
    assert.equal(formatRemaining(3 * 86_400_000 + 3_600_000 + 5000), '3d 1h');
    assert.equal(formatRemaining(3_600_000), '1h');
  });

  test('expiry as the Sandboxes view says it, never a raw timestamp', () => {
    const now = Date.parse('2026-01-01T12:00:00Z');
    assert.equal(formatExpiry('2026-01-01T12:04:58Z', now), 'expires in 4m 58s');
    assert.equal(formatExpiry('2026-01-01T14:00:00Z', now), 'expires in 2h');
    assert.equal(formatExpiry('2026-01-01T11:00:00Z', now), 'expired');
    assert.equal(formatExpiry(null, now), 'does not expire');
    assert.equal(formatExpiry(undefined, now), 'does not expire');
  });

  test('counts in words', () => {
    assert.equal(plural(1, 'connection'), '1 connection');
    assert.equal(plural(2, 'connection'), '2 connections');
    assert.equal(plural(0, 'sandbox', 'sandboxes'), '0 sandboxes');
    assert.equal(plural(1, 'sandbox', 'sandboxes'), '1 sandbox');
  });

  test('the install plan as plain text for a dialog: no Markdown marks', () => {
    const text = formatPlanText({
      id: 'p',
      name: 'P',
      version: '1.0.0',
      trust: 'pinned',
      source: { url: 'https://example.invalid/p.git', commit: 'abc' },
      digest: 'sha256:00',
      manifest: { runtime: { command: ['node', 'p.mjs'] } },
      security: { network: ['api.example.invalid'], filesystem: [], spawnsProcesses: false },
      installed: false,
    });
    assert.doesNotMatch(text, /\*\*|`|^#/m);
    assert.match(text, /^Install provider 'p' 1\.0\.0$/m);
    assert.match(text, /^- Runs: node p\.mjs$/m);
    assert.match(text, /^- Network: api\.example\.invalid$/m);
    assert.match(text, /^- Filesystem: none$/m);
    assert.match(text, /^- Spawns processes: no$/m);
  });

  test('sandbox references and grouping by provider', () => {
    assert.equal(sandboxRef({ id: 'sb-1', provider: 'local' }), 'local:sb-1');
    assert.equal(sandboxRef({ id: 'x:sb-1', provider: 'x' }), 'x:sb-1');
    const g = groupByProvider([
      { id: 'b', provider: 'z', status: 'running' },
      { id: 'c', provider: 'local', status: 'paused' },
      { id: 'a', provider: 'z', status: 'running' },
    ]);
    assert.deepEqual(
      g.map(([p, l]) => [p, l.map((s) => s.id)]),
      [
        ['local', ['c']],
        ['z', ['a', 'b']],
      ],
    );
  });

  test('versions', () => {
    assert.deepEqual(parseVersion('abx 0.1.0'), [0, 1, 0]);
    assert.equal(parseVersion('abx'), undefined);
    assert.ok(compareVersions('0.1.0', '0.0.9') > 0);
    assert.ok(compareVersions('0.10.0', '0.9.0') > 0);
    assert.equal(compareVersions('1.2.3-dev', '1.2.3'), 0);
  });

  test('errors from JSON-RPC replies: data.abx wins, standard codes are mapped', () => {
    const e = AbxError.from({ code: 4001, message: "File 'x' not found.", data: { abx: 'E4001', suggestion: 'Look.', path: 'x' } }, 'files/read');
    assert.equal(e.abx, 'E4001');
    assert.equal(e.suggestion, 'Look.');
    assert.equal(e.data.path, 'x');
    assert.equal(e.describe(), "[E4001] File 'x' not found.\nSuggestion: Look.");
    assert.equal(AbxError.from({ code: -32602, message: 'bad' }).abx, 'E1004');
    assert.equal(AbxError.from({ code: -32097, message: 'disposed' }).abx, 'E1007');
    assert.equal(AbxError.from(new Error('boom')).abx, 'E9001');
  });
});

test('template names from provider-defined templates/list results', () => {
  assert.deepEqual(templateNames({ templates: [{ name: 'base' }, { id: 'py' }, 'node'] }), ['base', 'py', 'node']);
  assert.deepEqual(templateNames(['a']), ['a']);
  assert.deepEqual(templateNames({}), []);
});

test('the client layer loads under plain node: nothing in src/client imports vscode', async () => {
  const fs = await import('node:fs');
  const path = await import('node:path');
  const { execFileSync } = await import('node:child_process');
  const dir = path.resolve(__dirname, '..', '..', 'src', 'client');
  for (const f of fs.readdirSync(dir)) {
    assert.doesNotMatch(fs.readFileSync(path.join(dir, f), 'utf8'), /from ['"]vscode['"]|require\(['"]vscode['"]\)/, f);
  }
  const out = execFileSync(process.execPath, ['-e', `const c = require(${JSON.stringify(path.resolve(__dirname, '..', 'src', 'client', 'index.js'))}); console.log(typeof c.BrokerClient.connect)`]);
  assert.equal(out.toString().trim(), 'function');
});
