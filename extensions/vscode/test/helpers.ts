// Test helpers: the real abx binary, a fresh ABX_HOME per test file (its own daemon), and
// waiting for conditions (no timed assertions: a test that never sees what it waits for
// fails by the runner's timeout).
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { BrokerClient } from '../src/client/broker';

/** The extension's directory (out/test/.. /..). */
export const EXT_DIR = path.resolve(__dirname, '..', '..');
export const REPO_ROOT = path.resolve(EXT_DIR, '..', '..');
export const ABX_BIN = path.resolve(REPO_ROOT, process.env.ABX_BIN || path.join('target', 'debug', 'abx'));

export interface Home {
  dir: string;
  env: NodeJS.ProcessEnv;
  connect(mode?: 'daemon' | 'stdio'): Promise<BrokerClient>;
  /** `abx broker stop` with this ABX_HOME, then removes it. */
  cleanup(): void;
}

export function freshHome(): Home {
  if (!fs.existsSync(ABX_BIN)) {
    throw new Error(`abx binary not found at ${ABX_BIN}: build it (cargo build -p abx-cli) or set ABX_BIN`);
  }
  // Short: the socket path lives beneath it.
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'abxv-'));
  const env: NodeJS.ProcessEnv = { ...process.env, ABX_HOME: dir };
  delete env.ABX_PROVIDER;
  const clients: BrokerClient[] = [];
  return {
    dir,
    env,
    async connect(mode: 'daemon' | 'stdio' = 'daemon') {
      const c = await BrokerClient.connect({ abxPath: ABX_BIN, env, mode, clientInfo: { name: 'abx-vscode-test', version: '0' } });
      clients.push(c);
      return c;
    },
    cleanup() {
      for (const c of clients) c.dispose();
      try {
        execFileSync(ABX_BIN, ['broker', 'stop'], { env, stdio: 'ignore', timeout: 30_000 });
      } catch {
        /* not running */
      }
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}

/**
 * Resolves once `check()` is truthy, checking every 20 ms. The deadline only guards against
 * a hang (it names what never came); nothing asserts on how long anything took.
 */
export async function until<T>(
  check: () => T | undefined | false | null | Promise<T | undefined | false | null>,
  what: string,
  hangGuardMs = 60_000,
): Promise<T> {
  const deadline = Date.now() + hangGuardMs;
  for (;;) {
    const v = await check();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`never saw: ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}
