// The Pseudoterminal adapter on a real pty exec: input written, output seen, resize, exit code.
import './register-vscode';
import * as assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { AbxTerminal } from '../src/adapters/terminal';
import type { BrokerClient } from '../src/client/broker';
import { freshHome, Home, until } from './helpers';

describe('terminal (pty exec, real broker)', { timeout: 120_000 }, () => {
  let home: Home;
  let client: BrokerClient;
  let sb: string;

  before(async () => {
    home = freshHome();
    client = await home.connect();
    const s = await client.sandboxCreate({ timeout: 600 });
    sb = `${s.provider}:${s.id}`;
  });

  after(() => home.cleanup());

  function open(command?: string, closeOnExit = false) {
    const term = new AbxTerminal(async () => client, { sandbox: sb, command, closeOnExit });
    let out = '';
    const closes: (number | void)[] = [];
    term.onDidWrite((s) => (out += s));
    term.onDidClose((c) => closes.push(c));
    return { term, out: () => out, closes };
  }

  test('keystrokes reach the command, its output comes back, resize changes the pty size, the exit code is shown', async () => {
    const t = open(
      'stty size; printf "name? "; read name; echo "hello $name"; printf "again? "; read x; stty size; exit 5',
    );
    t.term.open({ columns: 100, rows: 30 });
    await until(() => t.out().includes('name? '), 'first prompt');
    assert.match(t.out(), /30 100\r\n/);
    // Typed piecewise, as a user types: the pty echoes and the line arrives whole.
    for (const ch of 'wor') t.term.handleInput(ch);
    t.term.handleInput('ld\r');
    await until(() => t.out().includes('hello world'), 'the reply to the input');
    await until(() => t.out().includes('again? '), 'second prompt');
    t.term.setDimensions({ columns: 132, rows: 43 });
    t.term.handleInput('\r');
    const code = await t.term.exited;
    assert.equal(code, 5);
    assert.match(t.out(), /43 132\r\n/);
    assert.match(t.out(), /Process exited with code 5/);
    // The terminal stays until a key is pressed, then closes with the code.
    assert.deepEqual(t.closes, []);
    t.term.handleInput('x');
    assert.deepEqual(t.closes, [5]);
  });

  test('the default shell is interactive; exit ends it with its code and closeOnExit closes the terminal', async () => {
    const t = open(undefined, true);
    t.term.open({ columns: 80, rows: 24 });
    t.term.handleInput('echo "sum=$((40+2))"\r');
    await until(() => t.out().includes('sum=42'), 'the shell ran the line');
    t.term.handleInput('exit 3\r');
    assert.equal(await t.term.exited, 3);
    assert.deepEqual(t.closes, [3]);
  });

  test('closing the terminal hangs up the remote session', async () => {
    const t = open('echo started; sleep 300');
    t.term.open({ columns: 80, rows: 24 });
    await until(() => t.out().includes('started'), 'started');
    const execId = t.term.execId;
    assert.ok(execId);
    t.term.close();
    await until(async () => !(await client.processList(sb)).some((p) => p.command.includes('sleep 300')), 'sleep gone');
  });

  test('a failure to start is shown in the terminal with its E-code', async () => {
    const term = new AbxTerminal(async () => client, { sandbox: 'local:sb-gone' });
    let out = '';
    term.onDidWrite((s) => (out += s));
    term.open({ columns: 80, rows: 24 });
    assert.equal(await term.exited, undefined);
    assert.match(out, /\[E2009\] Sandbox 'sb-gone' not found\./);
    assert.match(out, /Suggestion: /);
  });
});
