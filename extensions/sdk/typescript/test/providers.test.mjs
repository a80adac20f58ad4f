// Providers through the SDK against the real broker: list, info, install with the CLI's
// confirmation and pinning rules (a dry run, a confirm callback, E8012 refusals for no
// confirmation, an insecure transport, an unpinned git source), doctor, the contract kit with
// its per-test notifications, and runCode's E8004 on the Python fixture plugin (tests/
// fixtures/plugins/py-local, which does not declare code.interpret).
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { after, before, describe, test } from 'node:test';
import * as sdk from '../dist/esm/index.js';
import { copyFixture, driftOf, freshHome, SENT } from './helpers.mjs';

const { Providers, Sandbox } = sdk;
let home;
let opts;

before(() => {
  home = freshHome();
  opts = home.options;
});

after(async () => {
  await sdk.closeAll();
  home?.cleanup();
  assert.deepEqual(driftOf(SENT), []);
});

function gitRepo(dir) {
  const git = (...a) => execFileSync('git', ['-c', 'user.email=t@example.com', '-c', 'user.name=t', ...a], { cwd: dir, stdio: 'pipe' });
  git('init', '-q');
  git('add', '-A');
  git('commit', '-qm', 'fixture');
  return execFileSync('git', ['rev-parse', 'HEAD'], { cwd: dir, encoding: 'utf8' }).trim();
}

describe('providers', () => {
  test('list and info: the builtin local provider', async () => {
    const list = await Providers.list(opts);
    const local = list.find((p) => p.id === 'local');
    assert.ok(local);
    assert.equal(local.kind, 'builtin');
    assert.ok(local.features.includes('exec.run'));
    const info = await Providers.info('local', opts);
    assert.equal(info.id, 'local');
    await assert.rejects(Providers.info('nope', opts), (e) => e instanceof sdk.ProviderNotFoundError && e.abx === 'E8001');
  });

  test('install: refused without confirmation (E8012), a callback that says no installs nothing, dry run, then yes', async () => {
    const dir = copyFixture('py-local');
    await assert.rejects(Providers.install(dir, opts), (e) => e instanceof sdk.ConfirmationRequiredError && e.abx === 'E8012' && /--yes/.test(e.suggestion));
    let seen;
    await assert.rejects(
      Providers.install(dir, { ...opts, confirm: (plan) => ((seen = plan), false) }),
      (e) => e instanceof sdk.ConfirmationRequiredError && /nothing was installed/.test(e.message),
    );
    assert.equal(seen.id, 'py-local');
    assert.match(seen.digest, /^sha256:/);
    assert.ok(!(await Providers.list(opts)).some((p) => p.id === 'py-local'), 'nothing installed');
    const plan = await Providers.install(dir, { ...opts, dryRun: true });
    assert.equal(plan.id, 'py-local');
    assert.ok(!(await Providers.list(opts)).some((p) => p.id === 'py-local'), 'a dry run installs nothing');
    const done = await Providers.install(dir, { ...opts, confirm: async (p) => p.id === 'py-local' });
    assert.equal(done.id, 'py-local');
    const listed = (await Providers.list(opts)).find((p) => p.id === 'py-local');
    assert.equal(listed.trust, 'local');
    await assert.rejects(Providers.install(dir, { ...opts, confirm: true }), (e) => e instanceof sdk.AlreadyInstalledError && e.abx === 'E8015');
  });

  test('pinning rules: file:// needs allowInsecureTransport, an unpinned git source needs ref or allowUnpinned', async () => {
    const dir = copyFixture('py-local');
    const commit = gitRepo(dir);
    const url = `file://${dir}`;
    await assert.rejects(Providers.install(url, { ...opts, confirm: true }), (e) => e instanceof sdk.ConfirmationRequiredError && /insecure transport/.test(e.message));
    await assert.rejects(
      Providers.install(url, { ...opts, confirm: true, allowInsecureTransport: true }),
      (e) => e instanceof sdk.ConfirmationRequiredError && /unpinned/.test(e.message) && e.suggestion.includes(commit),
    );
    const plan = await Providers.install(url, { ...opts, ref: commit, allowInsecureTransport: true, dryRun: true });
    assert.equal(plan.source.commit, commit);
    assert.equal(plan.trust, 'pinned');
  });

  test('doctor and the contract kit (per-test results as they finish)', async () => {
    const d = await Providers.doctor('py-local', opts);
    assert.equal(d.ok, true, JSON.stringify(d));
    assert.ok(d.checks.some((c) => c.name === 'handshake' && c.ok));
    const heard = [];
    const r = await Providers.test('py-local', { ...opts, onResult: (n) => heard.push(n) });
    assert.equal(r.failed, 0, JSON.stringify(r.results.filter((x) => x.outcome === 'failed')));
    assert.ok(r.passed > 0);
    assert.equal(heard.length, r.results.length);
  });

  test('a sandbox on the plugin; runCode is FeatureNotSupportedError (E8004) there', async () => {
    const sb = await Sandbox.create({ ...opts, provider: 'py-local' });
    try {
      assert.match(sb.id, /^py-local:/);
      const r = await sb.exec('printf "%s" plugin');
      assert.equal(r.stdout, 'plugin');
      await assert.rejects(
        sb.runCode('print(1)'),
        (e) => e instanceof sdk.FeatureNotSupportedError && e.abx === 'E8004' && /code\.interpret/.test(e.message) && !!e.suggestion,
      );
      await assert.rejects(sb.pause(), (e) => e instanceof sdk.FeatureNotSupportedError);
    } finally {
      await sb.kill();
    }
  });
});
