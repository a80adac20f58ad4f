// "Run Selection in Sandbox" (src/code.ts) on the fake UI surface against the real broker:
// code/run in the sandbox's default context, its output streamed into "abx: Code", state
// kept between runs, the editor's selection (or line) and language used when no code is given.
import './register-vscode';
import * as assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { after, before, describe, test } from 'node:test';
import * as vscode from 'vscode';
import { CODE_COMMANDS, CodeResult, languageOf, resultLine } from '../src/code';
import { activate, AbxExtensionApi, deactivate } from '../src/extension';
import { ABX_BIN, EXT_DIR, freshHome, Home, until } from './helpers';
// eslint-disable-next-line @typescript-eslint/no-require-imports
const fake = require('./fake-vscode') as typeof import('./fake-vscode');

const manifest = JSON.parse(fs.readFileSync(path.join(EXT_DIR, 'package.json'), 'utf8'));

describe('languages and result lines', () => {
  test('editor language ids map to code/run languages', () => {
    assert.equal(languageOf('python'), 'python');
    assert.equal(languageOf('javascript'), 'javascript');
    assert.equal(languageOf('shellscript'), 'bash');
    assert.equal(languageOf('markdown'), undefined);
    assert.equal(resultLine({ 'text/plain': '42' }), '42');
    assert.equal(resultLine({ 'image/png': 'iVBO' }), '[image/png]');
  });
});

describe('run selection on the real broker', { timeout: 240_000 }, () => {
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
    const client = await api.service.getClient();
    const s = await client.request<{ id: string; provider: string }>('sandbox/create', { timeout: 600 });
    sb = `${s.provider}:${s.id}`;
  });

  after(async () => {
    const done = deactivate();
    for (const d of ctx.subscriptions.splice(0)) d.dispose();
    await done;
    home.cleanup();
  });

  test('the command is registered', () => {
    for (const c of CODE_COMMANDS) assert.ok(fake.recorded.commands.has(c), c);
  });

  test('runs code in the default context, streams output and keeps state', async () => {
    const r = (await vscode.commands.executeCommand('abx.runSelection', sb, "x = 6\nprint('hi')\nx * 7", 'python')) as CodeResult;
    assert.equal(r.stdout, 'hi\n');
    assert.equal(r.results[0]['text/plain'], '42');
    assert.equal(r.context, 'default-python');
    const out = fake.recorded.output.get('abx: Code')!.join('');
    assert.match(out, new RegExp(`>>> \\[${sb} python\\]\\nhi\\n42\\n\\[default-python #1\\]`));
    const again = (await vscode.commands.executeCommand('abx.runSelection', sb, 'x', 'python')) as CodeResult;
    assert.equal(again.results[0]['text/plain'], '6');
    assert.equal(again.executionCount, 2);
  });

  test('an error shows its traceback and a warning', async () => {
    const r = (await vscode.commands.executeCommand('abx.runSelection', sb, '1/0', 'python')) as CodeResult;
    assert.equal(r.error?.name, 'ZeroDivisionError');
    assert.match(fake.recorded.output.get('abx: Code')!.join(''), /Traceback[\s\S]*ZeroDivisionError: division by zero/);
    assert.ok(fake.recorded.messages.some((m) => m.level === 'warning' && /ZeroDivisionError/.test(m.text)));
  });

  test("without code it takes the editor's selection, or its line, and its language", async () => {
    const doc = {
      languageId: 'shellscript',
      getText: () => 'V=from-selection; echo "$V"',
      lineAt: () => ({ text: 'echo "line:$V"' }),
    };
    const w = vscode.window as unknown as { activeTextEditor?: unknown };
    try {
      w.activeTextEditor = { document: doc, selection: { isEmpty: false, active: { line: 0 } } };
      let r = (await vscode.commands.executeCommand('abx.runSelection', sb)) as CodeResult;
      assert.equal(r.stdout, 'from-selection\n');
      assert.equal(r.context, 'default-bash');
      w.activeTextEditor = { document: doc, selection: { isEmpty: true, active: { line: 0 } } };
      r = (await vscode.commands.executeCommand('abx.runSelection', sb)) as CodeResult;
      assert.equal(r.stdout, 'line:from-selection\n', 'the same bash context');
    } finally {
      w.activeTextEditor = undefined;
    }
  });
});
