//! Finding the `abx` binary and checking it is recent enough (E1007 missing, E1008 too old).

import { execFile } from 'node:child_process';
import { AbxError, BrokerUnreachableError, VersionMismatchError } from './errors.js';

/** The oldest abx this extension works with. */
export const MIN_ABX_VERSION = '0.1.0';

/** The broker protocol this extension speaks (`initialize` -> `protocolVersion`). */
export const PROTOCOL_VERSION = 'abx/1';

/** Methods the extension uses; a broker that lacks one is too old. */
export const REQUIRED_METHODS = [
  'broker/status',
  'provider/list',
  'provider/doctor',
  'provider/install',
  'provider/test',
  'sandbox/create',
  'sandbox/list',
  'sandbox/kill',
  'sandbox/setTimeout',
  'sandbox/pause',
  'sandbox/resume',
  'exec/start',
  'exec/write',
  'exec/resize',
  'exec/kill',
  'files/read',
  'files/write',
  'files/stat',
  'files/list',
  'files/watch',
  'files/upload',
  'files/download',
  'ports/url',
];

/** `[1, 2, 3]` from `1.2.3`, `v1.2.3-dev`, `abx 1.2.3`; undefined when there is none. */
export function parseVersion(text: string): [number, number, number] | undefined {
  const m = /(\d+)\.(\d+)\.(\d+)/.exec(text);
  return m ? [Number(m[1]), Number(m[2]), Number(m[3])] : undefined;
}

/** Negative, zero or positive like a comparator. */
export function compareVersions(a: string, b: string): number {
  const x = parseVersion(a) ?? [0, 0, 0];
  const y = parseVersion(b) ?? [0, 0, 0];
  for (let i = 0; i < 3; i++) {
    if (x[i] !== y[i]) return x[i] - y[i];
  }
  return 0;
}

const INSTALL_HINT =
  "Install abx (from the repository: 'cargo install --locked --path cli/abx && cargo install --locked --path broker/daemon'), or set the 'abx.path' setting to the abx binary.";

export function missingBinary(abxPath: string, detail: string): AbxError {
  return new BrokerUnreachableError('E1007', `The abx binary '${abxPath}' could not be run: ${detail}`, {
    suggestion: INSTALL_HINT,
  });
}

export function tooOld(abxPath: string, found: string, why: string): AbxError {
  return new VersionMismatchError('E1008', `abx at '${abxPath}' is too old (${found}): ${why}`, {
    suggestion: `Update abx to ${MIN_ABX_VERSION} or later ('cargo install --locked --path cli/abx && cargo install --locked --path broker/daemon' in the abx repository), then run 'abx broker stop' so the new version starts, or point 'abx.path' at a newer binary.`,
    data: { found, required: MIN_ABX_VERSION },
  });
}

/**
 * Runs `abx --version`. Rejects with E1007 when the binary cannot be run and with E1008
 * when it is older than MIN_ABX_VERSION. Resolves to the version string (`0.1.0`).
 */
export function checkAbxBinary(abxPath: string, env?: NodeJS.ProcessEnv): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(abxPath, ['--version'], { env, timeout: 30_000 }, (err, stdout, stderr) => {
      if (err) {
        const code = (err as NodeJS.ErrnoException).code;
        const detail =
          code === 'ENOENT'
            ? 'not found (not on PATH, or no such file)'
            : code === 'EACCES'
              ? 'permission denied (not executable)'
              : (stderr || err.message).trim();
        reject(missingBinary(abxPath, detail));
        return;
      }
      const out = String(stdout).trim();
      const v = parseVersion(out);
      if (!v) {
        reject(tooOld(abxPath, out || '(no version)', "'abx --version' printed no version"));
        return;
      }
      const version = v.join('.');
      if (compareVersions(version, MIN_ABX_VERSION) < 0) {
        reject(tooOld(abxPath, version, `this extension needs ${MIN_ABX_VERSION} or later`));
        return;
      }
      resolve(version);
    });
  });
}
