// Test helpers: the real abx (ABX_BIN, default target/debug/abx of the repository), a fresh
// ABX_HOME per suite (its daemon stopped at the end), a trace of every message the SDK sends
// (checked against docs/openrpc.json), and waiting for conditions (no fixed sleeps).
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

export const SDK_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
export const REPO_ROOT = path.resolve(SDK_DIR, '../../..');
export const ABX_BIN = path.resolve(process.env.ABX_BIN || path.join(REPO_ROOT, 'target/debug/abx'));
export const OPENRPC = JSON.parse(fs.readFileSync(path.join(REPO_ROOT, 'docs/openrpc.json'), 'utf8'));

/** Every message sent by any client of this process (`trace` of the helpers' options). */
export const SENT = [];
export const trace = (dir, msg) => {
  if (dir === 'out') SENT.push(msg);
};

/** A fresh ABX_HOME; `options` reach its daemon; `cleanup()` stops it and removes the dir. */
export function freshHome() {
  const dir = fs.mkdtempSync(path.join(process.env.TMPDIR || os.tmpdir(), 'abxts-'));
  const env = { ...process.env, ABX_HOME: dir, ABX_BIN };
  delete env.ABX_HOST;
  delete env.ABX_PROVIDER;
  return {
    dir,
    env,
    options: { abxPath: ABX_BIN, processEnv: env, trace },
    abx(...args) {
      return execFileSync(ABX_BIN, args, { env, encoding: 'utf8' });
    },
    cleanup() {
      try {
        execFileSync(ABX_BIN, ['broker', 'stop'], { env, stdio: 'ignore' });
      } catch {
        /* not running */
      }
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** Waits (30 s at most) until `f()` is truthy and returns it. */
export async function until(f, what, ms = 30_000) {
  const end = Date.now() + ms;
  let last;
  for (;;) {
    try {
      const v = await f();
      if (v) return v;
    } catch (e) {
      last = e;
    }
    if (Date.now() > end) throw new Error(`never saw: ${what}${last ? ` (last error: ${last.message})` : ''}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** The fixture plugins of tests/fixtures/plugins. */
export function fixture(name) {
  return path.join(REPO_ROOT, 'tests/fixtures/plugins', name);
}

/** A copy of a fixture plugin in a temp dir (installs record the dir's digest). */
export function copyFixture(name) {
  const dst = fs.mkdtempSync(path.join(process.env.TMPDIR || os.tmpdir(), `abxts-${name}-`));
  fs.cpSync(fixture(name), dst, { recursive: true });
  return dst;
}

/**
 * Checks messages against docs/openrpc.json: each method is in it, each param name is one of
 * its params. Returns the problems (empty when none).
 */
export function driftOf(messages) {
  const methods = new Map(OPENRPC.methods.map((m) => [m.name, new Set((m.params ?? []).map((p) => p.name))]));
  const problems = [];
  for (const m of messages) {
    if (typeof m.method !== 'string') continue;
    const known = methods.get(m.method);
    if (!known) {
      problems.push(`${m.method}: not in docs/openrpc.json`);
      continue;
    }
    const params = m.params && typeof m.params === 'object' && !Array.isArray(m.params) ? Object.keys(m.params) : [];
    for (const p of params) if (!known.has(p)) problems.push(`${m.method}: param '${p}' is not in docs/openrpc.json`);
  }
  return [...new Set(problems)];
}
