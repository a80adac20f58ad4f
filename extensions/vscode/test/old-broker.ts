// An abx as it was before `sandbox/subscribe`, made from the real one: `node old-broker.js
// rpc` runs the real `abx rpc` (ABX_REAL_BIN) and stands between it and the client, with
// the methods of MISSING taken out: `initialize` does not list them and calling one gets the
// broker's own answer for an unknown method (-32601, E1003). Everything else passes through
// unchanged, both ways. Content-Length framing (what vscode-jsonrpc speaks). `--version` and
// other arguments run the real binary as they are. ABX_FILTER_MISSING (comma-separated, may be
// empty) replaces the list of methods taken out; ABX_FILTER_HOLD holds a method's replies.
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import type { Readable, Writable } from 'node:stream';

const MISSING = (process.env.ABX_FILTER_MISSING ?? 'sandbox/subscribe,sandbox/unsubscribe').split(',').filter(Boolean);
/**
 * ABX_FILTER_HOLD=`method:file`: replies to `method` are held until `file` exists (a slow
 * provider, e.g. a plugin that takes seconds to start: issue 45, item 14).
 */
const [HOLD_METHOD, HOLD_FILE] = (process.env.ABX_FILTER_HOLD ?? '').split(/:(.*)/s);
const holding = new Set<unknown>();

const real = process.env.ABX_REAL_BIN;
if (!real) {
  process.stderr.write('old-broker: ABX_REAL_BIN is not set\n');
  process.exit(2);
}
const args = process.argv.slice(2);
const child = spawn(real, args, { stdio: args[0] === 'rpc' ? ['pipe', 'pipe', 'inherit'] : 'inherit' });
child.on('exit', (code, signal) => process.exit(code ?? (signal ? 128 : 1)));
for (const s of ['SIGTERM', 'SIGINT', 'SIGHUP'] as const) process.on(s, () => child.kill(s));

function frame(msg: unknown): Buffer {
  const body = Buffer.from(JSON.stringify(msg), 'utf8');
  return Buffer.concat([Buffer.from(`Content-Length: ${body.length}\r\n\r\n`, 'ascii'), body]);
}

/** Calls `onMessage` with each Content-Length framed message read from `input`. */
function frames(input: Readable, onMessage: (m: Record<string, unknown>, raw: Buffer) => void, onEnd: () => void): void {
  let buf = Buffer.alloc(0);
  input.on('data', (chunk: Buffer) => {
    buf = Buffer.concat([buf, chunk]);
    for (;;) {
      const end = buf.indexOf('\r\n\r\n');
      if (end < 0) return;
      const m = /Content-Length:\s*(\d+)/i.exec(buf.subarray(0, end).toString('ascii'));
      if (!m) throw new Error('old-broker: a frame without Content-Length');
      const len = Number(m[1]);
      if (buf.length < end + 4 + len) return;
      const raw = buf.subarray(0, end + 4 + len);
      buf = buf.subarray(end + 4 + len);
      onMessage(JSON.parse(raw.subarray(end + 4).toString('utf8')), raw);
    }
  });
  input.on('end', onEnd);
}

if (args[0] === 'rpc') {
  const toBroker = child.stdin as Writable;
  const fromBroker = child.stdout as Readable;
  frames(
    process.stdin,
    (m, raw) => {
      if (typeof m.method === 'string' && MISSING.includes(m.method)) {
        if (m.id !== undefined) {
          process.stdout.write(
            frame({
              jsonrpc: '2.0',
              id: m.id,
              error: {
                code: -32601,
                message: `Method '${m.method}' not found.`,
                data: { abx: 'E1003', suggestion: 'See docs/broker-api.md for the method catalogue.' },
              },
            }),
          );
        }
        return;
      }
      if (HOLD_METHOD && m.method === HOLD_METHOD && m.id !== undefined) holding.add(m.id);
      toBroker.write(raw);
    },
    () => toBroker.end(),
  );
  frames(
    fromBroker,
    (m, raw) => {
      const result = m.result as { capabilities?: { methods?: string[] } } | undefined;
      const methods = result?.capabilities?.methods;
      if (Array.isArray(methods)) {
        result!.capabilities!.methods = methods.filter((x) => !MISSING.includes(x));
        process.stdout.write(frame(m));
        return;
      }
      if (m.id !== undefined && holding.has(m.id)) {
        holding.delete(m.id);
        const release = () => (fs.existsSync(HOLD_FILE) ? process.stdout.write(raw) : setTimeout(release, 20));
        release();
        return;
      }
      process.stdout.write(raw);
    },
    () => undefined,
  );
}
