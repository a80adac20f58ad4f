// examples/sdk_run.mjs runs to the end against the real broker (local provider), each step
// printing what the seed's sdk_run.py printed.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import * as path from 'node:path';
import { test } from 'node:test';
import { freshHome, SDK_DIR } from './helpers.mjs';

test('examples/sdk_run.mjs: the seed flow end to end on local', async () => {
  const home = freshHome();
  try {
    const out = await new Promise((resolve, reject) =>
      execFile(process.execPath, [path.join(SDK_DIR, 'examples/sdk_run.mjs'), 'local'], { env: home.env, timeout: 120_000 }, (err, stdout, stderr) =>
        err ? reject(new Error(`${err.message}\n${stdout}\n${stderr}`)) : resolve(stdout),
      ),
    );
    const lines = out.split('\n');
    assert.match(lines[0], /^create: \["local:[^"]+","local","running"\]$/);
    assert.ok(lines.includes('exec: [4,"hello-sdk\\n","err\\n"]'), out);
    assert.ok(lines.includes('files roundtrip equal: true'), out);
    assert.ok(lines.includes('files.read: "héllo\\n"'), out);
    assert.ok(lines.includes('files.exists missing: false'), out);
    assert.ok(lines.some((l) => l.startsWith('files.read missing ->: ["FileNotFoundError","E4001"')), out);
    assert.ok(lines.includes('paused status: "paused"'), out);
    assert.ok(lines.includes('resumed status: "running"'), out);
    assert.ok(lines.includes('exec after resume: "alive\\n"'), out);
    assert.ok(lines.some((l) => l.startsWith('create bogus provider ->: ["ProviderNotFoundError","E8001"')), out);
    assert.ok(lines.includes('list contains: true'), out);
    assert.ok(lines.includes('killed: true'), out);
    assert.ok(lines.includes('list after kill: []'), out);
  } finally {
    home.cleanup();
  }
});
