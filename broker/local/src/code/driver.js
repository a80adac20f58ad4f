// The abx code/run driver for JavaScript (node): a long-lived interpreter that runs cells
// read as JSON lines on stdin in one vm context (state persists; the value of the last
// expression is a result) and answers with frames on fd 1 (a marker, one JSON object, a
// newline). Embedded in the broker (broker/local/src/code/mod.rs), which starts `node -e`
// with a short bootstrap that reads this file from stdin and runs it as `[abx-driver]` (so
// it is not on the command line).
'use strict';
const vm = require('vm');
const fs = require('fs');
const util = require('util');
const nonce = process.env.ABX_CODE_NONCE || '';
delete process.env.ABX_CODE_NONCE;
const MARK = '\x1f' + nonce;

function writeAll(fd, s) {
  const b = Buffer.from(s);
  let off = 0;
  while (off < b.length) {
    try {
      off += fs.writeSync(fd, b, off);
    } catch (e) {
      if (e.code !== 'EAGAIN') throw e;
    }
  }
}
function send(o) { writeAll(1, MARK + JSON.stringify(o) + '\n'); }
const text = (args) => util.formatWithOptions({ colors: false }, ...args) + '\n';
// In pieces (the broker drops a frame past its size limit), never between the halves of a
// surrogate pair.
const PIECE = 1 << 16; // small frames: the broker counts a frame while it reads it (issue 42)
function sendText(t, d) {
  for (let i = 0; i < d.length;) {
    let j = Math.min(i + PIECE, d.length);
    const c = d.charCodeAt(j - 1);
    if (j < d.length && c >= 0xd800 && c < 0xdc00) j -= 1;
    send({ t, d: d.slice(i, j) });
    i = j;
  }
}
const out = (...a) => sendText('stdout', text(a));
const err = (...a) => sendText('stderr', text(a));

function bundle(v) {
  const b = {};
  if (v !== null && typeof v === 'object' && typeof v._repr_mimebundle_ === 'function') {
    Object.assign(b, v._repr_mimebundle_());
  }
  if (!('text/plain' in b)) b['text/plain'] = typeof v === 'string' ? util.inspect(v) : util.inspect(v, { depth: 4 });
  return b;
}
function display(...vs) { for (const v of vs) send({ t: 'result', b: bundle(v) }); }

const con = {
  log: out, info: out, debug: out, trace: out, dir: (v) => out(util.inspect(v)),
  error: err, warn: err, table: out, assert: (c, ...a) => { if (!c) err('Assertion failed', ...a); },
  time() {}, timeEnd() {}, group() {}, groupEnd() {},
};
const sandbox = {
  console: con, display, require, process, Buffer, URL, URLSearchParams, TextEncoder, TextDecoder,
  setTimeout, setInterval, setImmediate, clearTimeout, clearInterval, clearImmediate,
  queueMicrotask, structuredClone: globalThis.structuredClone, fetch: globalThis.fetch,
  module: { exports: {} }, __filename: '[cell]', __dirname: process.cwd(),
};
sandbox.globalThis = sandbox;
sandbox.exports = sandbox.module.exports;
const ctx = vm.createContext(sandbox);

let interrupt = null;
process.on('SIGINT', () => { if (interrupt) interrupt(); });

// Frames of node itself (`node:events:524:28`, `node:internal/...`), of the bootstrap and
// of this driver: not the user's.
const ours = (l) => /\(?node:[\w/]+:\d+:\d+\)?$|\[eval\]|\[abx-driver\]/.test(l);
const trim = (stack) => String(stack || '').split('\n').filter((l) => !ours(l)).join('\n');
function error(e) {
  if (e instanceof Error || (e && typeof e === 'object' && 'stack' in e)) {
    send({ t: 'error', name: String(e.name || 'Error'), value: String(e.message || ''), traceback: trim(e.stack) });
  } else {
    send({ t: 'error', name: 'Error', value: util.inspect(e), traceback: 'Uncaught ' + util.inspect(e) });
  }
}

let n = 0;
async function run(req) {
  n += 1;
  for (const [k, v] of Object.entries(req.env || {})) process.env[k] = v;
  try {
    let v = vm.runInContext(req.code || '', ctx, { filename: `<cell ${n}>`, breakOnSigint: true });
    if (v && typeof v.then === 'function') {
      v = await Promise.race([
        v,
        new Promise((_, reject) => { interrupt = () => { const e = new Error('Script execution was interrupted by `SIGINT`'); e.name = 'KeyboardInterrupt'; reject(e); }; }),
      ]);
    }
    if (v !== undefined) {
      sandbox._ = v;
      display(v);
    }
  } catch (e) {
    if (e && e.code === 'ERR_SCRIPT_EXECUTION_INTERRUPTED') e.name = 'KeyboardInterrupt';
    error(e);
  } finally {
    interrupt = null;
  }
  send({ t: 'done' });
  writeAll(2, MARK + 'E\n');
}

process.on('uncaughtException', (e) => { err('Uncaught ' + (e && e.stack ? e.stack : util.inspect(e))); });
process.on('unhandledRejection', (e) => { err('Unhandled rejection: ' + (e && e.stack ? e.stack : util.inspect(e))); });

let buf = '';
const queue = [];
let busy = false;
async function pump() {
  if (busy) return;
  busy = true;
  while (queue.length) {
    const line = queue.shift();
    let req;
    try { req = JSON.parse(line); } catch (_) { continue; }
    await run(req);
  }
  busy = false;
}
process.stdin.setEncoding('utf8');
process.stdin.on('data', (d) => {
  buf += d;
  let i;
  while ((i = buf.indexOf('\n')) >= 0) {
    queue.push(buf.slice(0, i));
    buf = buf.slice(i + 1);
  }
  pump();
});
process.stdin.on('end', () => process.exit(0));
send({ t: 'ready', pid: process.pid });
