// The E2B examples of test/e2b-snippets type-check (tsc --strict, checkJs) against
// `@abx/sdk/e2b`'s .d.ts exactly as they do against E2B's own (`e2b` 2.51.0,
// `@e2b/code-interpreter` 2.8.0, mapped onto the same import names): the same diagnostics
// both ways, which is one: the contexts page's `context.contextId`, which E2B's Context type
// does not have either. TypeScript code written for E2B compiles on abx by changing its import.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { createRequire } from 'node:module';
import { test } from 'node:test';
import { SDK_DIR } from './helpers.mjs';

const require = createRequire(path.join(SDK_DIR, 'package.json'));
const tsc = require.resolve('typescript/bin/tsc');

function check(dir, extra) {
  const base = {
    compilerOptions: {
      target: 'ES2022',
      module: 'node16',
      moduleResolution: 'node16',
      lib: ['ES2022', 'esnext.disposable', 'DOM'],
      strict: true,
      noEmit: true,
      allowJs: true,
      checkJs: true,
      skipLibCheck: true,
      types: ['node'],
      typeRoots: [path.join(SDK_DIR, 'node_modules/@types')],
      ...extra,
    },
    include: [path.join(SDK_DIR, 'test/e2b-snippets/*.mjs'), path.join(dir, 'probe.mjs')],
  };
  const cfg = path.join(dir, `tsconfig.${extra.paths ? 'e2b' : 'abx'}.json`);
  fs.writeFileSync(cfg, JSON.stringify(base));
  try {
    execFileSync(process.execPath, [tsc, '-p', cfg], { encoding: 'utf8', cwd: SDK_DIR });
    return [];
  } catch (e) {
    return String(e.stdout).trim().split('\n').filter(Boolean);
  }
}

test("E2B's examples type-check against @abx/sdk/e2b as against E2B's own types", () => {
  // The probe: a name only abx has, so the mapping onto E2B's types is seen to take effect.
  const dir = fs.mkdtempSync(path.join(SDK_DIR, 'test/.tsc-'));
  fs.writeFileSync(path.join(dir, 'probe.mjs'), "import { UnsupportedError } from '@abx/sdk/e2b'\nconsole.log(UnsupportedError)\n");
  try {
    const ours = check(dir, {});
    const theirs = check(dir, {
      baseUrl: SDK_DIR,
      paths: {
        '@abx/sdk/e2b': ['node_modules/e2b/dist/index.d.mts'],
        '@abx/sdk/e2b/code-interpreter': ['node_modules/@e2b/code-interpreter/dist/index.d.mts'],
      },
    });
    const probe = (l) => l.includes('probe.mjs');
    assert.deepEqual(ours.filter(probe), []);
    assert.equal(theirs.filter(probe).length, 1, `E2B's types have no UnsupportedError: ${theirs}`);
    assert.deepEqual(ours, theirs.filter((l) => !probe(l)));
    assert.deepEqual(ours, ["test/e2b-snippets/14-contexts-restart.mjs(18,42): error TS2339: Property 'contextId' does not exist on type 'Context'."]);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
