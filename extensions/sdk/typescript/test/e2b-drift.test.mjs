// Drift: the names of `@abx/sdk/e2b` and `@abx/sdk/e2b/code-interpreter` against E2B's own
// type definitions, read from the packages npm installed (devDependencies pinned to what the
// registry has today: `@e2b/code-interpreter` 2.8.0 and `e2b` 2.51.0, the version its
// `e2b: ^2.48.0` resolves to): every runtime export, every public member of the classes E2B
// code touches, every option of the options types. What has no counterpart is listed below
// (MAPPED_TO_ERROR) and must throw UnsupportedError naming the nearest abx call. No broker.
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import { createRequire } from 'node:module';
import * as path from 'node:path';
import { test } from 'node:test';
import * as core from '@abx/sdk/e2b';
import * as ci from '@abx/sdk/e2b/code-interpreter';
import { SDK_DIR } from './helpers.mjs';

const require = createRequire(path.join(SDK_DIR, 'package.json'));
const pkgDir = (name) => path.dirname(require.resolve(`${name}/package.json`));
const E2B_DIR = pkgDir('e2b');
const CI_DIR = pkgDir('@e2b/code-interpreter');
const CORE_DTS = fs.readFileSync(path.join(E2B_DIR, 'dist/index.d.ts'), 'utf8');
const CI_DTS = fs.readFileSync(path.join(CI_DIR, 'dist/index.d.ts'), 'utf8');

/** `export { A, type B, C as default }` at the end of a .d.ts: the runtime names. */
function runtimeExports(dts) {
  const m = /export \{([^}]*)\};\s*(\/\/# sourceMappingURL.*)?\s*$/.exec(dts);
  assert.ok(m, 'the export list');
  return m[1]
    .split(',')
    .map((s) => s.trim())
    .filter((s) => s && !s.startsWith('type '))
    .map((s) => (/ as (\w+)$/.exec(s)?.[1] ?? s));
}

/** The lines of `declare class NAME` / `interface NAME` up to its closing brace (comments left out). */
function body(dts, header) {
  const lines = dts.split('\n');
  const start = lines.findIndex((l) => l.startsWith(`${header} `) || l.startsWith(`${header}<`));
  assert.ok(start >= 0, `${header} in the .d.ts`);
  const out = [];
  let depth = 0;
  for (let i = start; i < lines.length; i++) {
    const l = lines[i];
    const t = l.trim();
    if (t.startsWith('/**') || t.startsWith('*') || t.startsWith('//')) continue;
    if (i > start && depth === 1) out.push(l);
    for (const ch of l) {
      if (ch === '{') depth++;
      else if (ch === '}') depth--;
    }
    if (i > start && depth === 0) break;
  }
  return out;
}

/** Public members of a class: `{name, isStatic}` (private, protected and the constructor left out). */
function classMembers(dts, name) {
  const out = new Map();
  for (const l of body(dts, `declare class ${name}`)) {
    const m = /^ {2}(static\s+)?(readonly\s+)?(get\s+|set\s+)?([A-Za-z_$][\w$]*)\??\s*[(<:=;]/.exec(l);
    if (!m || /^ {2}(private|protected)\b/.test(l) || m[4] === 'constructor') continue;
    out.set(`${m[1] ? 'static ' : ''}${m[4]}`, { name: m[4], isStatic: !!m[1] });
  }
  return [...out.values()];
}

/** The own keys of an options interface. */
function optionKeys(dts, name) {
  const keys = [];
  for (const l of body(dts, `interface ${name}`)) {
    const m = /^ {2}([A-Za-z_$][\w$]*)\??:/.exec(l);
    if (m) keys.push(m[1]);
  }
  return keys;
}

// What E2B has and abx maps to UnsupportedError (the README's mapping table says why).
const MAPPED_TO_ERROR = {
  'Sandbox (static)': ['getMetrics', 'createSnapshot', 'listSnapshots', 'deleteSnapshot', 'fork'],
  Sandbox: ['fork', 'createSnapshot', 'listSnapshots', 'getMcpUrl', 'getMcpToken', 'uploadUrl', 'downloadUrl', 'getMetrics'],
  exports: ['Template', 'TemplateBase', 'Volume', 'Secret', 'Git', 'ConnectionConfig', 'ApiClient', 'ReadyCmd', 'LogEntry', 'LogEntryStart', 'LogEntryEnd', 'SecretPaginator', 'defaultBuildLogger', 'getSignature', 'waitForFile', 'waitForPort', 'waitForProcess', 'waitForTimeout', 'waitForURL'],
};

// Objects to look for instance fields on (E2B's classes' fields are own properties here).
const fakeAbx = { id: 'local:sb-x', provider: 'local', data: {} };
const fakeSession = { pid: 1, execId: 'e', onOutput: () => ({ dispose() {} }), exited: new Promise(() => {}), done: false };
function instanceOf(mod, name) {
  switch (name) {
    case 'Sandbox':
      return new mod.Sandbox({ abx: fakeAbx });
    case 'Commands':
    case 'Filesystem':
    case 'Pty':
      return new mod[name](new mod.Sandbox({ abx: fakeAbx }));
    case 'CommandHandle':
      return new mod.CommandHandle(fakeSession);
    case 'CommandExitError':
      return new mod.CommandExitError({ exitCode: 1, stdout: '', stderr: '' });
    case 'WatchHandle':
      return new mod.WatchHandle(() => {});
    case 'SandboxPaginator':
      return new mod.SandboxPaginator({});
    case 'Execution':
      return new mod.Execution();
    case 'Result':
      return new mod.Result({}, false);
    case 'ExecutionError':
      return new mod.ExecutionError('n', 'v', 't');
    case 'OutputMessage':
      return new mod.OutputMessage('l', 0, false);
  }
  throw new Error(name);
}

function checkClass(dts, mod, name, problems) {
  const C = mod[name];
  if (typeof C !== 'function') {
    problems.push(`${name}: not exported`);
    return 0;
  }
  const inst = instanceOf(mod, name);
  let n = 0;
  for (const m of classMembers(dts, name)) {
    n++;
    const ok = m.isStatic ? m.name in C : m.name in inst;
    if (!ok) problems.push(`${name}${m.isStatic ? '.' : '#'}${m.name}: missing`);
  }
  return n;
}

test(`the pinned E2B packages are the versions mirrored (e2b 2.51.0, @e2b/code-interpreter 2.8.0)`, () => {
  const v = (d) => JSON.parse(fs.readFileSync(path.join(d, 'package.json'), 'utf8')).version;
  assert.equal(v(E2B_DIR), '2.51.0');
  assert.equal(v(CI_DIR), '2.8.0');
  assert.equal(JSON.parse(fs.readFileSync(path.join(CI_DIR, 'package.json'), 'utf8')).dependencies.e2b, '^2.48.0');
});

test("every runtime export of e2b is exported by @abx/sdk/e2b, and of @e2b/code-interpreter by .../code-interpreter", () => {
  const problems = [];
  const coreNames = runtimeExports(CORE_DTS);
  const ciNames = runtimeExports(CI_DTS);
  for (const n of coreNames) if (!(n in core)) problems.push(`e2b: ${n}`);
  // `export * from "e2b"` in the code interpreter: e2b's names as well.
  for (const n of new Set([...coreNames, ...ciNames])) if (!(n in ci)) problems.push(`@e2b/code-interpreter: ${n}`);
  assert.deepEqual(problems, []);
  assert.ok(coreNames.length > 40, `${coreNames.length} runtime names in e2b`);
  assert.notEqual(ci.Sandbox, core.Sandbox, "the code interpreter's Sandbox is its own (with runCode)");
  assert.ok(ci.Sandbox.prototype instanceof core.Sandbox);
  assert.equal(ci.default, ci.Sandbox);
  assert.equal(core.default, core.Sandbox);
});

test('every public member of the classes E2B code uses is here (core and code interpreter)', () => {
  const problems = [];
  let n = 0;
  for (const name of ['Sandbox', 'Commands', 'Filesystem', 'CommandHandle', 'CommandExitError', 'WatchHandle', 'Pty', 'SandboxPaginator']) {
    n += checkClass(CORE_DTS, core, name, problems);
  }
  // Sandbox's statics from its base class SandboxApi (kill, getInfo, setTimeout, pause, ...).
  for (const m of classMembers(CORE_DTS, 'SandboxApi')) {
    n++;
    if (!(m.name in core.Sandbox)) problems.push(`Sandbox.${m.name} (SandboxApi): missing`);
  }
  for (const name of ['Sandbox', 'Execution', 'Result', 'ExecutionError', 'OutputMessage']) n += checkClass(CI_DTS, ci, name, problems);
  assert.deepEqual(problems, []);
  assert.ok(n > 90, `${n} members compared`);
});

test('every option of the options types is taken (or refused by name, never ignored)', () => {
  const problems = [];
  const have = (list, k) => list.includes(k) || core.OPTIONS.ConnectionOpts.includes(k);
  for (const name of Object.keys(core.OPTIONS)) {
    if (name === 'ConnectionOpts' || name === 'SandboxConnectOpts' || name === 'CommandConnectOpts' || name === 'CommandRequestOpts') continue;
    for (const k of optionKeys(CORE_DTS, name)) if (!have(core.OPTIONS[name], k)) problems.push(`${name}.${k}`);
  }
  for (const k of optionKeys(CORE_DTS, 'ConnectionOpts')) if (!core.OPTIONS.ConnectionOpts.includes(k)) problems.push(`ConnectionOpts.${k}`);
  for (const name of Object.keys(ci.CI_OPTIONS)) {
    for (const k of optionKeys(CI_DTS, name)) if (!ci.CI_OPTIONS[name].includes(k)) problems.push(`${name}.${k}`);
  }
  // And nothing here that E2B does not have (a typo would refuse E2B's own option).
  for (const name of ['SandboxOpts', 'CommandStartOpts', 'WatchOpts', 'FilesystemListOpts', 'SandboxListOpts']) {
    const theirs = optionKeys(CORE_DTS, name);
    for (const k of core.OPTIONS[name]) if (!theirs.includes(k) && !['user'].includes(k)) problems.push(`extra ${name}.${k}`);
  }
  assert.deepEqual(problems, []);
});

test('what has no counterpart is listed and throws UnsupportedError naming the nearest abx call', async () => {
  const sbx = new ci.Sandbox({ abx: fakeAbx });
  const statics = [...classMembers(CORE_DTS, 'Sandbox'), ...classMembers(CORE_DTS, 'SandboxApi')].filter((m) => m.isStatic).map((m) => m.name);
  const methods = classMembers(CORE_DTS, 'Sandbox').filter((m) => !m.isStatic).map((m) => m.name);
  const runtime = runtimeExports(CORE_DTS);
  const seen = [];
  const expectUnsupported = async (label, f) => {
    let err;
    try {
      await f();
    } catch (e) {
      err = e;
    }
    assert.ok(err instanceof core.UnsupportedError, `${label}: ${err}`);
    assert.match(err.message, /is not supported by abx; nearest: \S/, label);
    seen.push(label);
  };
  for (const m of MAPPED_TO_ERROR['Sandbox (static)']) {
    assert.ok(statics.includes(m), `Sandbox.${m} is E2B's`);
    await expectUnsupported(`Sandbox.${m}`, () => ci.Sandbox[m]('local:sb-x'));
  }
  for (const m of MAPPED_TO_ERROR.Sandbox) {
    assert.ok(methods.includes(m), `sandbox.${m} is E2B's`);
    await expectUnsupported(`sandbox.${m}`, () => sbx[m]('p'));
  }
  for (const n of MAPPED_TO_ERROR.exports) {
    assert.ok(runtime.includes(n), `${n} is e2b's`);
    const v = core[n];
    await expectUnsupported(n, () => (typeof v === 'function' && /^class|Proxy/.test(String(v)) ? new v() : v()));
  }
  await expectUnsupported('sandbox.git.*', () => sbx.git.status('/x'));
  assert.equal(seen.length, 5 + 8 + 19 + 1);
});
