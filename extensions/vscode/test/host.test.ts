// The `abx.host` setting: the broker process the extension starts (`abx rpc`, and `abx mcp`
// offered to the agent) runs with ABX_HOST set to it, so the CLI reaches the broker of that
// machine over ssh. Checked with an ABX_BIN wrapper that records the environment it was
// started with, then runs the real abx (without ABX_HOST: here the "remote" is this machine).
import './register-vscode';
import * as assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { describe, test } from 'node:test';
import * as vscode from 'vscode';
import { readSettings } from '../src/config';
import { activate, deactivate } from '../src/extension';
import { MCP_PROVIDER_ID } from '../src/mcp';
import { ABX_BIN, EXT_DIR, freshHome, until } from './helpers';
// eslint-disable-next-line @typescript-eslint/no-require-imports
const fake = require('./fake-vscode') as typeof import('./fake-vscode');

const manifest = JSON.parse(fs.readFileSync(path.join(EXT_DIR, 'package.json'), 'utf8'));

function context() {
  return { subscriptions: [] as { dispose(): unknown }[], extension: { packageJSON: manifest } };
}

/** An abx that appends `<first arg> ABX_HOST=<value or unset>` to `log`, then runs the real one. */
function recordingAbx(dir: string, log: string): string {
  const file = path.join(dir, 'abx-recording');
  fs.writeFileSync(file, `#!/bin/sh\nprintf '%s ABX_HOST=%s\\n' "$1" "\${ABX_HOST-unset}" >> '${log}'\nexec env -u ABX_HOST '${ABX_BIN}' "$@"\n`, { mode: 0o755 });
  return file;
}

async function connectWith(host: string | undefined): Promise<string> {
  const home = freshHome();
  const log = path.join(home.dir, 'env.log');
  fake.configuration.set('abx.path', recordingAbx(home.dir, log));
  fake.configuration.set('abx.home', home.dir);
  fake.configuration.set('abx.refreshInterval', 0);
  if (host !== undefined) fake.configuration.set('abx.host', host);
  const ctx = context();
  const saved = process.env.ABX_HOST;
  delete process.env.ABX_HOST;
  try {
    const api = activate(ctx as unknown as vscode.ExtensionContext);
    await until(() => api.service.state.kind === 'connected', 'connected through the recording abx');
    if (host) {
      const provider = fake.recorded.mcpProviders.get(MCP_PROVIDER_ID);
      const [def] = (await provider?.provideMcpServerDefinitions()) ?? [];
      assert.equal((def?.env as Record<string, string>)?.ABX_HOST, host.trim(), 'abx mcp gets ABX_HOST too');
    }
    return fs.readFileSync(log, 'utf8');
  } finally {
    if (saved !== undefined) process.env.ABX_HOST = saved;
    const done = deactivate();
    for (const d of ctx.subscriptions.splice(0)) {
      try {
        d.dispose();
      } catch {
        /* as VS Code: the rest still go */
      }
    }
    await done;
    fake.configuration.set('abx.host', '');
    fake.configuration.set('abx.path', ABX_BIN);
    home.cleanup();
  }
}

describe('abx.host', () => {
  test('the manifest contributes it, user settings only (restricted, window scope)', () => {
    const p = manifest.contributes.configuration.properties['abx.host'];
    assert.equal(p.type, 'string');
    assert.equal(p.default, '');
    assert.equal(p.scope, 'window');
    assert.ok(manifest.capabilities.untrustedWorkspaces.restrictedConfigurations.includes('abx.host'));
    fake.workspaceConfiguration.set('abx.host', 'ssh://evil@example.com');
    try {
      const s = readSettings();
      assert.equal(s.host, '');
      assert.ok(s.ignored.includes('host'));
    } finally {
      fake.workspaceConfiguration.clear();
    }
  });

  test('set: abx --version and abx rpc run with ABX_HOST', async () => {
    const log = await connectWith(' ssh://dev@build-box:2222 ');
    assert.match(log, /^--version ABX_HOST=ssh:\/\/dev@build-box:2222$/m);
    assert.match(log, /^rpc ABX_HOST=ssh:\/\/dev@build-box:2222$/m);
  });

  test('empty: no ABX_HOST', async () => {
    const log = await connectWith(undefined);
    assert.match(log, /^rpc ABX_HOST=unset$/m);
    assert.doesNotMatch(log, /ABX_HOST=ssh/);
  });
});
