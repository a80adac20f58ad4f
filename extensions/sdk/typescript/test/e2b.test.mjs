// `@abx/sdk/e2b` and `@abx/sdk/e2b/code-interpreter` against the real broker (`local`, a daemon
// under a fresh ABX_HOME): E2B's own documented JavaScript examples (test/e2b-snippets, each
// naming its docs URL; unchanged but for the import) run in this process with their console
// output captured, then what E2B code relies on beyond them: CommandExitError, timeouts,
// background handles (wait, kill, connect), files formats, getHost, templates, users, and the
// members mapped to a clear error.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { inspect } from 'node:util';
import { after, afterEach, before, describe, test } from 'node:test';
import * as core from '@abx/sdk/e2b';
import * as ci from '@abx/sdk/e2b/code-interpreter';
import { closeAll } from '@abx/sdk';
import { freshHome, REPO_ROOT, until } from './helpers.mjs';

const { Sandbox } = ci;
let home;
let work;
let savedEnv;

before(() => {
  home = freshHome();
  savedEnv = { ...process.env };
  // E2B code passes no connection options: the layer reads ABX_HOME / ABX_BIN as abx does.
  process.env.ABX_HOME = home.dir;
  process.env.ABX_BIN = home.env.ABX_BIN;
  delete process.env.ABX_HOST;
  delete process.env.ABX_PROVIDER;
  work = fs.mkdtempSync(path.join(process.env.TMPDIR || os.tmpdir(), 'abxts-e2bcwd-'));
  process.chdir(work);
});

afterEach(async () => {
  restoreConsole();
  // Snippets leave their sandboxes running (as on E2B, until their timeout): end them.
  for (const s of await Sandbox.list().nextItems()) await Sandbox.kill(s.sandboxId);
});

after(async () => {
  await closeAll();
  home?.cleanup();
  process.env = savedEnv;
  fs.rmSync(work, { recursive: true, force: true });
});

// ---- running a snippet: its console output captured until the test has seen what it wants

let restoreConsole = () => {};

async function snippet(name) {
  const out = [];
  const orig = { log: console.log, error: console.error };
  const cap = (...a) => out.push(a.map((x) => (typeof x === 'string' ? x : inspect(x, { depth: 4 }))).join(' '));
  console.log = cap;
  console.error = cap;
  restoreConsole = () => Object.assign(console, orig);
  const text = () => out.join('\n');
  try {
    await import(`./e2b-snippets/${name}.mjs`);
  } catch (err) {
    err.output = text();
    throw err;
  }
  return { out, text };
}

// ---- matplotlib: E2B's code-interpreter template has it; `local` sees the host's /usr, so the
// packages of target/pyvenv (scripts/test installs them) go into the sandbox's user site
// (/workspace/.local/lib/pythonX.Y/site-packages; HOME is /workspace), as tests/tests/code.rs
// does with its PYTHONPATH.

function richSite() {
  const pys = [process.env.ABX_TEST_PYTHON, path.join(REPO_ROOT, 'target/pyvenv/bin/python3'), path.join(REPO_ROOT, 'target/codevenv/bin/python3')].filter(Boolean);
  for (const py of pys) {
    try {
      const site = execFileSync(py, ['-c', "import sysconfig; print(sysconfig.get_paths()['purelib'])"], { encoding: 'utf8' }).trim();
      execFileSync('/usr/bin/python3', ['-c', 'import matplotlib'], { env: { ...process.env, PYTHONPATH: site }, stdio: 'ignore' });
      const ver = execFileSync('/usr/bin/python3', ['-c', 'import sys; print(f"python{sys.version_info[0]}.{sys.version_info[1]}")'], { encoding: 'utf8' }).trim();
      return { site, ver };
    } catch {
      /* the next one */
    }
  }
  return undefined;
}

/** Runs `f` with the code interpreter's Sandbox.create putting matplotlib into each new sandbox. */
async function withMatplotlib(t, f) {
  const rich = richSite();
  if (!rich) {
    t.skip('SKIPPED: no virtualenv with matplotlib for /usr/bin/python3 (run scripts/test, or set ABX_TEST_PYTHON)');
    return;
  }
  const orig = Object.getOwnPropertyDescriptor(Sandbox, 'create');
  Sandbox.create = async function (...args) {
    const sbx = await core.Sandbox.create.apply(this, args);
    const bare = sbx.sandboxId.replace(/^local:/, '');
    const ws = path.join(home.dir, 'data/local/sandboxes', bare, 'workspace');
    assert.ok(fs.existsSync(ws), `the sandbox's workspace on the host: ${ws}`);
    const dst = path.join(ws, '.local/lib', rich.ver, 'site-packages');
    fs.mkdirSync(path.dirname(dst), { recursive: true });
    try {
      execFileSync('cp', ['-al', rich.site, dst]);
    } catch {
      execFileSync('cp', ['-r', '--reflink=auto', rich.site, dst]);
    }
    return sbx;
  };
  try {
    await f();
  } finally {
    if (orig) Object.defineProperty(Sandbox, 'create', orig);
    else delete Sandbox.create;
  }
}

// ---- E2B's documented examples

describe("E2B's documented examples, unchanged but for the import", () => {
  test('01 quick start (e2b.dev/docs/quickstart): runCode logs, files.list("/")', async () => {
    const { text } = await snippet('01-quickstart');
    assert.match(text(), /stdout: \[ 'hello world\\n' \]/);
    assert.match(text(), /name: 'workspace'/);
    assert.match(text(), /name: 'usr'/);
  });

  test('02 commands.run (e2b.dev/docs/commands): a CommandResult', async () => {
    const { out } = await snippet('02-commands-run');
    assert.match(out[0], /exitCode: 0/);
    assert.match(out[0], /stdout: 'total 0\\n'|stdout: 'total/);
  });

  test('03 streaming (e2b.dev/docs/commands/streaming): onStdout per chunk, then the result', async () => {
    const { out } = await snippet('03-commands-streaming');
    assert.deepEqual(out.slice(0, 2), ['hello\n', 'world\n']);
    assert.match(out[2], /exitCode: 0/);
    assert.match(out[2], /stdout: 'hello\\nworld\\n'/);
  });

  test('04 background (e2b.dev/docs/commands/background): returns at once; kill() ends it', async () => {
    const t0 = Date.now();
    const { out } = await snippet('04-commands-background');
    assert.ok(Date.now() - t0 < 9000, 'did not wait for the 10 s sleep');
    assert.ok(!out.includes('world\n'), out.join('|'));
  });

  test('05 files write, read (e2b.dev/docs/filesystem/read-write): parents are made', async () => {
    const { out } = await snippet('05-files-write-read');
    assert.deepEqual(out, ['file content']);
  });

  test('06 write several files (e2b.dev/docs/filesystem/read-write)', async () => {
    const { out } = await snippet('06-files-write-multiple');
    assert.deepEqual(out, ['file content']);
  });

  test('07 getInfo of a file and a directory (e2b.dev/docs/filesystem/info): /home/user paths', async () => {
    const { out } = await snippet('07-files-info');
    assert.match(out[0], /name: 'test_file\.txt'/);
    assert.match(out[0], /type: 'file'/);
    assert.match(out[0], /path: '\/home\/user\/test_file\.txt'/);
    assert.match(out[0], /size: 13/);
    assert.match(out[0], /permissions: '-rw-r--r--'/);
    assert.match(out[1], /type: 'dir'/);
    assert.match(out[1], /path: '\/home\/user\/test_dir'/);
  });

  test('08 watchDir (e2b.dev/docs/filesystem/watch): the write is seen', async () => {
    const { text } = await snippet('08-files-watch');
    await until(() => /wrote to file my-file/.test(text()), 'the WRITE event of my-file');
  });

  test('09 runCode streaming (e2b.dev/docs/code-interpreting/streaming): OutputMessages in order', async () => {
    const { out, text } = await snippet('09-code-streaming');
    await until(() => /This goes last/.test(text()), 'the last line', 20_000);
    assert.match(out[0], /^stdout: OutputMessage \{[^}]*line: 'This goes first to stdout\\n'[^}]*error: false/s);
    assert.match(out[1], /^stderr: OutputMessage \{[^}]*line: 'This goes later to stderr\\n'[^}]*error: true/s);
    assert.match(out[2], /^stdout: OutputMessage \{[^}]*line: 'This goes last\\n'/s);
    assert.match(out[0], /timestamp: \d{16}/);
  });

  test('10 a matplotlib chart (e2b.dev/docs/code-interpreting/create-charts-visualizations/static-charts)', async (t) => {
    await withMatplotlib(t, async () => {
      const { out } = await snippet('10-code-chart');
      assert.deepEqual(out, ['Chart saved as chart.png']);
      const png = fs.readFileSync(path.join(work, 'chart.png'));
      assert.deepEqual([...png.subarray(0, 4)], [0x89, 0x50, 0x4e, 0x47], 'a PNG');
    });
  });

  test('11 onResult with a chart (e2b.dev/docs/code-interpreting/streaming)', async (t) => {
    await withMatplotlib(t, async () => {
      const { out } = await snippet('11-code-stream-results');
      assert.equal(out.length, 1, out.join('|'));
      assert.match(out[0], /^result: Result \{/);
      assert.match(out[0], /png: 'iVBORw0K/);
      assert.match(out[0], /isMainResult: false/);
    });
  });

  test('12 createCodeContext, runCode({context}) (e2b.dev/docs/code-interpreting/contexts)', async () => {
    const { out } = await snippet('12-contexts-create');
    assert.match(out[0], /^Execution \{/);
    assert.match(out[0], /stdout: \[ 'Hello, world!\\n' \]/);
    assert.match(out[0], /error: undefined/);
    assert.match(out[0], /executionCount: 1/);
  });

  test('13 listCodeContexts (e2b.dev/docs/code-interpreting/contexts)', async () => {
    const { out } = await snippet('13-contexts-list');
    assert.equal(out[0], '[]', 'a new sandbox has no contexts until code runs');
  });

  test("14 restartCodeContext (e2b.dev/docs/code-interpreting/contexts): the page's context.contextId is refused clearly", async () => {
    await assert.rejects(snippet('14-contexts-restart'), (e) => e instanceof ci.InvalidArgumentError && /a Context or a context id is required \(got undefined\)/.test(e.message));
  });

  test('15 removeCodeContext by object and by id (e2b.dev/docs/code-interpreting/contexts)', async () => {
    const { out } = await snippet('15-contexts-remove');
    assert.equal(out[0], '[]');
  });

  test('16 timeouts: create({timeoutMs}), setTimeout, getInfo, kill (e2b.dev/docs/sandbox)', async () => {
    const t0 = Date.now();
    const { out } = await snippet('16-timeouts');
    assert.match(out[0], /sandboxId: 'local:sb-/);
    assert.match(out[0], /templateId: 'base'/);
    const m = /startedAt: (\S+),[\s\S]*endAt: (\S+),/.exec(out[0]);
    assert.ok(m, out[0]);
    // setTimeout(30_000): the end is 30 s after the call, not 60 s after the create.
    const end = Date.parse(m[2]);
    assert.ok(end >= t0 + 28_000 && end <= Date.now() + 31_000, `endAt ${m[2]}`);
    assert.equal((await Sandbox.list().nextItems()).length, 0, 'killed');
  });

  test('17 envs: sandbox, runCode and command (e2b.dev/docs/sandbox/environment-variables)', async () => {
    const { out } = await snippet('17-env-vars');
    assert.deepEqual(out, ["[ 'my_value\\n' ]", '123\n', 'my_value\n']);
  });

  test('18 list, connect by sandboxId (e2b.dev/docs/sandbox/connect): one user, root', async () => {
    const { out } = await snippet('18-connect');
    assert.match(out[0], /^Running in sandbox local:sb-\S+ as "root"$/);
  });

  test('19 metadata and Sandbox.list() (e2b.dev/docs/sandbox/list): one page, then E2B\'s error', async () => {
    const out = [];
    const orig = console.log;
    console.log = (...a) => out.push(a.map((x) => inspect(x)).join(' '));
    try {
      await assert.rejects(import('./e2b-snippets/19-metadata-list.mjs'), (e) => e instanceof ci.SandboxError && e.message === 'No more items to fetch');
    } finally {
      console.log = orig;
    }
    assert.equal(out[0], "'Running sandbox metadata:' { name: 'My Sandbox' }");
    assert.match(out[1], /'Running sandbox id:' 'local:sb-/);
    assert.match(out[3], /'Running sandbox template id:' 'base'/);
  });

  test('20 errors: Execution.error, CommandExitError (e2b.dev/docs/sdk-reference)', async () => {
    const { out } = await snippet('20-code-errors');
    assert.deepEqual(out, ['error name: NameError', "error value: name 'undefined_variable' is not defined", 'traceback has the line: true', 'exit code: 3 stderr: oops']);
  });

  test('21 JavaScript and Bash cells (e2b.dev/docs/code-interpreting/supported-languages)', async () => {
    const { out } = await snippet('21-languages');
    assert.match(out[0], /stdout: \[ 'Hello, world!\\n' \]/);
    assert.match(out[1], /stdout: \[ 'Hello, world!\\n' \]/);
  });
});

// ---- beyond the snippets

describe('E2B behaviour on abx', () => {
  test('commands: CommandExitError, timeoutMs -> TimeoutError, cwd /home/user, user root/user, others refused', async () => {
    const sbx = await Sandbox.create();
    const e = await sbx.commands.run('echo out; echo err >&2; exit 7').catch((x) => x);
    assert.ok(e instanceof ci.CommandExitError && e instanceof ci.SandboxError);
    assert.deepEqual([e.exitCode, e.stdout, e.stderr], [7, 'out\n', 'err\n']);
    await assert.rejects(sbx.commands.run('sleep 30', { timeoutMs: 300 }), ci.TimeoutError);
    assert.equal((await sbx.commands.run('pwd')).stdout, '/workspace\n');
    assert.equal((await sbx.commands.run('pwd', { cwd: '/home/user/sub', user: 'root' }).catch(async () => {
      await sbx.files.makeDir('/home/user/sub');
      return sbx.commands.run('pwd', { cwd: '/home/user/sub', user: 'user' });
    })).stdout, '/workspace/sub\n');
    await assert.rejects(sbx.commands.run('true', { user: 'bob' }), (x) => x instanceof ci.InvalidArgumentError && /one user/.test(x.message));
    await assert.rejects(sbx.commands.run('true', { bogus: 1 }), (x) => x instanceof ci.InvalidArgumentError && /unknown option 'bogus'/.test(x.message));
  });

  test('background: wait() after output; kill(); connect(pid) re-attaches; list() shows it; stdin', async () => {
    const sbx = await Sandbox.create();
    const h = await sbx.commands.run('echo one; sleep 0.2; echo two', { background: true });
    const r = await h.wait();
    assert.deepEqual([r.exitCode, r.stdout], [0, 'one\ntwo\n']);
    assert.equal(h.exitCode, 0);

    const long = await sbx.commands.run('echo start; sleep 60', { background: true });
    await until(() => long.stdout === 'start\n', 'the first line');
    await until(async () => (await sbx.commands.list()).some((p) => p.cmd.includes('sleep') || p.args.includes('60')), 'sleep in process list');
    await long.disconnect();
    const again = await sbx.commands.connect(long.pid);
    assert.equal(again.pid, long.pid);
    assert.equal(await sbx.commands.kill(long.pid), true);
    await assert.rejects(again.wait(), (x) => x instanceof ci.CommandExitError && x.exitCode !== 0);
    assert.equal(await again.kill(), false);

    const cat = await sbx.commands.run('cat', { background: true, stdin: true });
    await sbx.commands.sendStdin(cat.pid, 'piped\n');
    await sbx.commands.closeStdin(cat.pid);
    assert.equal((await cat.wait()).stdout, 'piped\n');
  });

  test('files: read formats, exists, makeDir, list depth, rename, remove, FileNotFoundError', async () => {
    const sbx = await Sandbox.create();
    await sbx.files.write('dir/a.bin', new Uint8Array([0, 255, 1]).buffer);
    assert.deepEqual([...(await sbx.files.read('dir/a.bin', { format: 'bytes' }))], [0, 255, 1]);
    assert.deepEqual([...new Uint8Array(await (await sbx.files.read('/home/user/dir/a.bin', { format: 'blob' })).arrayBuffer())], [0, 255, 1]);
    const chunks = [];
    for await (const c of await sbx.files.read('dir/a.bin', { format: 'stream' })) chunks.push(...c);
    assert.deepEqual(chunks, [0, 255, 1]);
    assert.equal(await sbx.files.exists('dir/a.bin'), true);
    assert.equal(await sbx.files.exists('dir/none'), false);
    assert.equal(await sbx.files.makeDir('dir/x/y'), true);
    assert.equal(await sbx.files.makeDir('dir/x/y'), false);
    assert.deepEqual((await sbx.files.list('dir')).map((e) => e.path).sort(), ['/home/user/dir/a.bin', '/home/user/dir/x']);
    assert.deepEqual((await sbx.files.list('dir', { depth: 2 })).map((e) => e.name).sort(), ['a.bin', 'x', 'y']);
    const moved = await sbx.files.rename('dir/a.bin', 'dir/b.bin');
    assert.deepEqual([moved.path, moved.type, moved.size], ['/home/user/dir/b.bin', 'file', 3]);
    await sbx.files.remove('dir');
    assert.equal(await sbx.files.exists('dir'), false);
    await assert.rejects(sbx.files.read('dir/b.bin'), (x) => x instanceof ci.FileNotFoundError && x.abx?.abx === 'E4001');
    await assert.rejects(sbx.files.write('/etc/x', 'y'), (x) => x instanceof ci.SandboxError && /E4014/.test(x.message));
  });

  test('getHost(port) reaches a server in the sandbox (http on local); isRunning; getInfo', async () => {
    const sbx = await Sandbox.create();
    const srv = await sbx.commands.run('python3 -m http.server 38631 --bind 127.0.0.1', { background: true, timeoutMs: 0 });
    await sbx.files.write('hello.txt', 'served');
    const host = sbx.getHost(38631);
    assert.equal(host, '127.0.0.1:38631');
    const body = await until(async () => {
      // Each attempt bounded: a connection made before the server listens must not hang the test.
      const r = await fetch(`http://${host}/hello.txt`, { signal: AbortSignal.timeout(2000) });
      return r.ok && (await r.text());
    }, 'the server answers');
    assert.equal(body, 'served');
    assert.equal(new URL((await sbx.abx.ports.url(38631)).url).host, host, "getHost is ports/url's answer");
    await srv.kill();
    assert.equal(await sbx.isRunning(), true);
    const info = await sbx.getInfo();
    assert.equal(info.state, 'running');
    assert.ok(info.cpuCount > 0 && info.memoryMB > 0);
    await sbx.pause();
    assert.equal(await sbx.isRunning(), false);
    assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'paused');
    const back = await Sandbox.connect(sbx.sandboxId);
    assert.equal(await back.isRunning(), true, 'connect resumes a paused sandbox');
    assert.equal(await Sandbox.kill(sbx.sandboxId), true);
    assert.equal(await sbx.isRunning(), false);
    assert.equal(await Sandbox.kill(sbx.sandboxId), false);
    await assert.rejects(Sandbox.connect(sbx.sandboxId), ci.SandboxNotFoundError);
  });

  test("templates: 'base' and 'code-interpreter-v1' are the provider's default; another name is a clear TemplateError", async () => {
    for (const t of ['base', 'code-interpreter-v1']) {
      const s = await Sandbox.create(t, { timeoutMs: 30_000 });
      assert.equal((await s.getInfo()).templateId, 'base');
    }
    const c = await core.Sandbox.create({ template: 'code-interpreter-v1' });
    assert.equal(typeof c.runCode, 'undefined', "the core Sandbox has no runCode, as e2b's");
    await assert.rejects(core.Sandbox.create('no-such-template-e2b'), (x) => x instanceof ci.TemplateError && /E2005/.test(x.message));
  });

  test('runCode: results, text, executionCount, callbacks, timeoutMs, language+context refused', async () => {
    const sbx = await Sandbox.create();
    const seen = [];
    const ex = await sbx.runCode('print("a")\nx = 40\nx + 2', { onStdout: (m) => seen.push(m.line), onResult: (r) => seen.push(`r:${r.text}`) });
    assert.equal(ex.text, '42');
    assert.equal(ex.results[0].isMainResult, true);
    assert.deepEqual(ex.results[0].formats(), []);
    assert.deepEqual(ex.logs, { stdout: ['a\n'], stderr: [] });
    assert.deepEqual(seen, ['a\n', 'r:42']);
    const html = await sbx.runCode('class H:\n  def _repr_html_(self): return "<b>x</b>"\nH()');
    assert.equal(html.results[0].html, '<b>x</b>');
    assert.deepEqual(html.results[0].formats(), ['html']);
    const js = await sbx.runCode('({a: 1})', { language: 'javascript' });
    assert.ok(js.results.length === 1);
    await assert.rejects(sbx.runCode('import time; time.sleep(30)', { timeoutMs: 500 }), ci.TimeoutError);
    const ctx = await sbx.createCodeContext();
    await assert.rejects(sbx.runCode('1', { context: ctx, language: 'python' }), ci.InvalidArgumentError);
    await sbx.runCode('y = 5', { context: ctx });
    assert.equal((await sbx.runCode('y', { context: ctx })).text, '5');
    await sbx.restartCodeContext(ctx);
    assert.equal((await sbx.runCode('y', { context: ctx })).error?.name, 'NameError');
  });

  test('members with no counterpart throw UnsupportedError naming the nearest abx call', async () => {
    const sbx = await Sandbox.create();
    const cases = [
      [() => sbx.createSnapshot(), /templates\/build/],
      [() => sbx.listSnapshots(), /templates\/list/],
      [() => sbx.getMetrics(), /sandbox\/systemInfo/],
      [() => sbx.getMcpUrl(), /abx mcp/],
      [() => sbx.getMcpToken(), /abx mcp/],
      [() => sbx.uploadUrl('a'), /files\/upload/],
      [() => sbx.downloadUrl('a'), /files\/download/],
      [() => sbx.fork(), /templates\/build/],
      [() => sbx.git.clone('x'), /commands\.run/],
      [() => Sandbox.fork(sbx.sandboxId), /templates\/build/],
      [() => Sandbox.getMetrics(sbx.sandboxId), /sandbox\/systemInfo/],
      [() => Sandbox.createSnapshot(sbx.sandboxId), /templates\/build/],
      [() => Sandbox.deleteSnapshot('s'), /templates\/remove/],
      [() => Sandbox.listSnapshots(), /templates\/list/],
      [() => Sandbox.create({ volumeMounts: { '/d': 'v' } }), /mounts/],
      [() => Sandbox.create({ mcp: {} }), /abx mcp/],
      [() => new ci.Template(), /templates\/build/],
      [() => ci.Template.build(), /templates\/build/],
      [() => ci.Volume.create('v'), /mounts/],
      [() => ci.Secret.list(), /secrets/],
      [() => sbx.files.write('a', 'b', { metadata: { k: 'v' } }), /files\/write/],
    ];
    for (const [f, nearest] of cases) {
      let err;
      try {
        await f();
      } catch (e) {
        err = e;
      }
      assert.ok(err instanceof ci.UnsupportedError && err instanceof ci.SandboxError, `${f}: ${err}`);
      assert.match(err.message, nearest, String(f));
    }
    await assert.rejects(Sandbox.create({ nope: true }), (x) => x instanceof ci.InvalidArgumentError && /unknown option 'nope'/.test(x.message));
  });
});
