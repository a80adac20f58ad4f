// Issue 46, the native SDK's defects against the real broker (`local`): a write into a new
// folder makes its parents; `timeoutMs` is honoured and an unknown create option is refused;
// runCode streams `code/output` (onOutput) and code contexts have helpers; isRunning;
// a streamed command ends with its client (Ctrl-C / SIGINT, process exit, the end of an
// `await using` block) unless kept (`keepOnExit`), and a kept one is picked up again with
// `attach` (exec/attach). The clients that end are real `node` processes.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { pathToFileURL } from 'node:url';
import { after, before, describe, test } from 'node:test';
import * as sdk from '../dist/esm/index.js';
import { driftOf, freshHome, SDK_DIR, SENT, until } from './helpers.mjs';

const { Sandbox } = sdk;
let home;
let opts;
let sb;

before(async () => {
  home = freshHome();
  opts = home.options;
  sb = await Sandbox.create({ ...opts, timeout: 600 });
});

after(async () => {
  await sb?.kill().catch(() => undefined);
  await sdk.closeAll();
  home?.cleanup();
  assert.deepEqual(driftOf(SENT), []);
});

const running = async (re) => (await sb.processes.list()).some((p) => re.test(p.command));

/** A `node` client in its own process: starts `cmd` streamed and prints its execId once it ran. */
function client(mode, cmd) {
  const script = path.join(home.dir, `client-${mode}.mjs`);
  fs.writeFileSync(
    script,
    `import { Sandbox } from ${JSON.stringify(pathToFileURL(path.join(SDK_DIR, 'dist/esm/index.js')).href)};
const sb = await Sandbox.connect(process.argv[2]);
const s = await sb.execStream(process.argv[3], { keepOnExit: process.argv[4] === 'keep' });
s.onOutput((c) => {
  if (!c.text.includes('started')) return;
  console.log(JSON.stringify({ execId: s.execId }));
  if (process.argv[4] !== 'wait') process.exit(0);
});
`,
  );
  const child = spawn(process.execPath, [script, sb.id, cmd, mode], { env: home.env, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  child.stdout.on('data', (d) => (out += d));
  child.stderr.on('data', (d) => (err += d));
  const exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
  const started = until(() => out.includes('execId') && JSON.parse(out.trim().split('\n')[0]).execId, `the client started '${cmd}' (${err})`);
  return { child, exited, started };
}

describe('files and create options', () => {
  test('files.write into a new folder makes its parents (the README quick start); parents: false keeps E4001', async () => {
    assert.equal(await sb.files.write('notes/deep/a.txt', 'héllo\n'), 7);
    assert.equal(await sb.files.read('notes/deep/a.txt', { encoding: 'utf8' }), 'héllo\n');
    await assert.rejects(sb.files.write('other/b.txt', 'x', { parents: false }), (e) => e instanceof sdk.FileNotFoundError && e.abx === 'E4001');
  });

  test('timeoutMs is honoured (whole seconds, up); an unknown option is refused (E1004), never ignored', async () => {
    const t0 = Date.now();
    const s = await Sandbox.create({ ...opts, timeoutMs: 120_500 });
    try {
      const end = Date.parse(s.data.expiresAt);
      assert.ok(end >= t0 + 119_000 && end <= Date.now() + 122_000, `expiresAt ${s.data.expiresAt}`);
    } finally {
      await s.kill();
    }
    await assert.rejects(Sandbox.create({ ...opts, envs: { A: '1' } }), (e) => e instanceof sdk.InvalidParamsError && e.abx === 'E1004' && /'envs'/.test(e.message) && /'env'/.test(e.suggestion));
    await assert.rejects(Sandbox.create({ ...opts, timeout: 60, timeoutMs: 60_000 }), (e) => e instanceof sdk.InvalidParamsError && /not both/.test(e.message));
  });
});

describe('code', () => {
  test('runCode onOutput: the code/output of this run, in order, before the reply', async () => {
    const seen = [];
    const r = await sb.runCode('import sys\nprint("a")\nprint("b", file=sys.stderr)\n6 * 7', { onOutput: (o) => seen.push([o.type, o.text ?? o.result?.['text/plain']]) });
    assert.deepEqual(seen, [['stdout', 'a\n'], ['stderr', 'b\n'], ['result', '42']]);
    assert.deepEqual(r.results, [{ 'text/plain': '42' }]);
  });

  test('code contexts: create (a JavaScript one runs without naming its language), list, restart, remove', async () => {
    const ctx = await sb.createCodeContext({ language: 'javascript' });
    assert.equal(ctx.language, 'javascript');
    await sb.runCode('var n = 41', { context: ctx.id });
    assert.equal((await sb.runCode('n + 1', { context: ctx.id })).results[0]['text/plain'], '42');
    assert.ok((await sb.listCodeContexts()).some((c) => c.id === ctx.id));
    const again = await sb.restartCodeContext(ctx.id);
    assert.equal(again.restarts, 1);
    assert.equal((await sb.runCode('typeof n', { context: ctx.id })).results[0]['text/plain'], "'undefined'");
    await sb.removeCodeContext(ctx.id);
    assert.ok(!(await sb.listCodeContexts()).some((c) => c.id === ctx.id));
  });

  test('isRunning: running, paused, gone', async () => {
    const s = await Sandbox.create({ ...opts, timeout: 60 });
    assert.equal(await s.isRunning(), true);
    await s.pause();
    assert.equal(await s.isRunning(), false);
    await s.kill();
    assert.equal(await s.isRunning(), false);
  });
});

describe('a streamed command ends with its client', () => {
  test('Ctrl-C (SIGINT) of the client kills the command, then the client ends as SIGINT would have', async () => {
    const c = client('wait', 'echo started; sleep 311');
    await c.started;
    assert.ok(await running(/sleep 311/));
    c.child.kill('SIGINT');
    assert.deepEqual(await c.exited, { code: null, signal: 'SIGINT' });
    await until(async () => !(await running(/sleep 311/)), 'sleep 311 gone');
  });

  test('process exit of the client kills the command', async () => {
    const c = client('exit', 'echo started; sleep 312');
    await c.started;
    assert.deepEqual(await c.exited, { code: 0, signal: null });
    await until(async () => !(await running(/sleep 312/)), 'sleep 312 gone');
  });

  test('leaving an `await using` block (Symbol.asyncDispose) kills it', async () => {
    const s = await sb.execStream('sleep 313');
    await until(() => running(/sleep 313/), 'sleep 313 running');
    await s[Symbol.asyncDispose]();
    assert.ok(s.done);
    assert.equal(s.exitInfo.signal, 'SIGKILL');
    assert.ok(!(await running(/sleep 313/)));
  });

  test('keepOnExit: the command outlives its client; attach (exec/attach) takes it over: output, stdin, kill', async () => {
    const c = client('keep', 'echo started; read x; echo "got $x"; sleep 314');
    const execId = await c.started;
    assert.deepEqual(await c.exited, { code: 0, signal: null });
    await until(() => running(/sleep 314|read/), 'still running');
    const s = await sb.attach(execId);
    assert.equal(s.execId, execId);
    assert.equal(s.attachInfo.running, true);
    let text = '';
    s.onOutput((ch) => (text += ch.text));
    await s.write('hi\n');
    await until(() => text.includes('got hi'), 'the attached session sees the output of its input');
    await s.kill();
    const exit = await s.exited;
    assert.equal(exit.signal, 'SIGKILL');
    await until(async () => !(await running(/sleep 314/)), 'sleep 314 gone');
  });
});
