// Issue 46 bench: time to first result of E2B code on abx, in a fresh `node` process:
// `Sandbox.create()` then `runCode("1+1")` (`@abx/sdk/e2b/code-interpreter`, `local`, the
// daemon already up), from spawning `node` until the result is printed; against `node -e ''`
// (spawn to exit) in the same run. Prints both medians and their ratio (measured, never
// asserted; the bar is the ratio measured when the layer landed plus 10%).
//
//   ABX_BIN=target/debug/abx node bench/e2b-first-result.mjs [runs]
import { execFileSync, spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const N = Number(process.argv[2] || 15);
const ABX = path.resolve(process.env.ABX_BIN || 'abx');
const home = fs.mkdtempSync(path.join(os.tmpdir(), 'abxts-bench-e2b-'));
const env = { ...process.env, ABX_HOME: home, ABX_BIN: ABX };
delete env.ABX_HOST;
delete env.ABX_PROVIDER;
const here = path.dirname(fileURLToPath(import.meta.url));
const mod = pathToFileURL(path.join(here, '../dist/esm/e2b/code-interpreter.js')).href;

const script = `import { Sandbox } from ${JSON.stringify(mod)};
const sbx = await Sandbox.create();
const execution = await sbx.runCode('1+1');
process.stdout.write('result ' + execution.text + '\\n');
await sbx.kill();`;

/** ms from spawn until `marker` on stdout (or the exit when there is none). */
function run(args, marker) {
  return new Promise((resolve, reject) => {
    const t0 = process.hrtime.bigint();
    const child = spawn(process.execPath, args, { env, stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    let at;
    child.stdout.on('data', (d) => {
      out += d;
      if (marker && at === undefined && out.includes(marker)) at = process.hrtime.bigint();
    });
    child.on('exit', (code) => {
      if (code !== 0) return reject(new Error(`exit ${code}: ${out}`));
      if (marker && at === undefined) return reject(new Error(`no '${marker}' in: ${out}`));
      resolve(Number((at ?? process.hrtime.bigint()) - t0) / 1e6);
    });
  });
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

try {
  execFileSync(ABX, ['broker', 'start'], { env, stdio: 'ignore' });
  // Warm both (page cache, the daemon's first sandbox).
  await run(['-e', '']);
  await run(['--input-type=module', '-e', script], 'result 2');
  const bare = [];
  const e2b = [];
  for (let i = 0; i < N; i++) {
    bare.push(await run(['-e', '']));
    e2b.push(await run(['--input-type=module', '-e', script], 'result 2'));
  }
  const b = median(bare);
  const e = median(e2b);
  console.log(`node -e '':                                   p50 ${b.toFixed(1)} ms (${N} runs)`);
  console.log(`Sandbox.create() + runCode("1+1"), first result: p50 ${e.toFixed(1)} ms (${N} runs)`);
  console.log(`ratio: ${(e / b).toFixed(2)}`);
} finally {
  try {
    execFileSync(ABX, ['broker', 'stop'], { env, stdio: 'ignore' });
  } catch {
    /* not running */
  }
  fs.rmSync(home, { recursive: true, force: true });
}
