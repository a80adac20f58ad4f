//! JSON-RPC 2.0 over a byte stream, with no dependencies: LSP `Content-Length` framing (what
//! vscode-jsonrpc spoke) or newline-delimited JSON on the way out, either one read back (the
//! broker answers in the client's framing, docs/broker-api.md "Framing"), requests with ids,
//! notifications both ways, cancellation (`$/cancelRequest`) from an AbortSignal or a
//! cancellation token, and the small event helpers (Emitter, Event, Disposable) the client
//! and the VS Code extension use.

import type { Readable, Writable } from 'node:stream';

export interface Disposable {
  dispose(): void;
}

/** Subscribe with a listener; the Disposable unsubscribes. (The shape of VS Code's Event.) */
export type Event<T> = (listener: (e: T) => unknown, thisArgs?: unknown, disposables?: Disposable[]) => Disposable;

export class Emitter<T> {
  private listeners: Array<(e: T) => unknown> | undefined = [];
  private eventFn: Event<T> | undefined;

  get event(): Event<T> {
    if (!this.eventFn) {
      this.eventFn = (listener, thisArgs, disposables) => {
        const l = thisArgs === undefined ? listener : (e: T) => listener.call(thisArgs, e);
        this.listeners?.push(l);
        const d = {
          dispose: () => {
            const i = this.listeners?.indexOf(l) ?? -1;
            if (i >= 0) this.listeners!.splice(i, 1);
          },
        };
        disposables?.push(d);
        return d;
      };
    }
    return this.eventFn;
  }

  /** Calls every listener; one that throws does not keep the others from hearing. */
  fire(e: T): void {
    if (!this.listeners) return;
    let failed: unknown;
    for (const l of [...this.listeners]) {
      try {
        l(e);
      } catch (err) {
        failed ??= err;
      }
    }
    if (failed !== undefined) throw failed;
  }

  dispose(): void {
    this.listeners = undefined;
  }
}

/** A cancellation token (structurally VS Code's and vscode-jsonrpc's). */
export interface CancellationToken {
  readonly isCancellationRequested: boolean;
  onCancellationRequested(listener: (e: unknown) => unknown): Disposable;
}

/** What a request can be cancelled with: an AbortSignal or a cancellation token. */
export type Cancel = AbortSignal | CancellationToken | undefined;

/** Calls `f` once when `c` cancels; the Disposable stops listening. */
export function onCancel(c: Cancel, f: () => void): Disposable {
  if (!c) return { dispose: () => undefined };
  if (isAbortSignal(c)) {
    if (c.aborted) {
      f();
      return { dispose: () => undefined };
    }
    const l = () => f();
    c.addEventListener('abort', l, { once: true });
    return { dispose: () => c.removeEventListener('abort', l) };
  }
  if (c.isCancellationRequested) {
    f();
    return { dispose: () => undefined };
  }
  return c.onCancellationRequested(() => f());
}

export function isCancelled(c: Cancel): boolean {
  if (!c) return false;
  return isAbortSignal(c) ? c.aborted : c.isCancellationRequested;
}

function isAbortSignal(c: object): c is AbortSignal {
  return typeof (c as AbortSignal).addEventListener === 'function' && 'aborted' in c;
}

/** An error reply: `{code, message, data}`. */
export interface RpcError {
  code: number;
  message: string;
  data?: unknown;
}

/** The connection closed (or could not write) under a request. */
export class ConnectionClosed extends Error {
  constructor(detail: string) {
    super(detail);
    this.name = 'ConnectionClosed';
  }
}

interface Pending {
  method: string;
  resolve: (v: unknown) => void;
  reject: (e: unknown) => void;
}

const NEWLINE = 0x0a;
/** A header block longer than this is not one. */
const MAX_HEADER = 8192;

/** `lsp`: `Content-Length: N` headers (default); `line`: one JSON message per line. */
export type Framing = 'lsp' | 'line';

/**
 * One JSON-RPC connection. Replies may come in any order (the broker serves requests
 * concurrently); notifications are delivered in the order they arrive.
 */
export class Connection {
  private nextId = 1;

  /** The id the next request will get (requests sent since have ids from here on). */
  get peekNextId(): number {
    return this.nextId;
  }
  private readonly pending = new Map<number, Pending>();
  private chunks: Buffer[] = [];
  private have = 0;
  /** Body length of the LSP message being read; -1 between messages. */
  private body = -1;
  /** Reading a line that has no newline yet (only new chunks are searched). */
  private inLine = false;
  private closedWith: string | undefined;
  private readonly closeEmitter = new Emitter<string>();
  /** Fires once, when the input ends or fails (or `close()`). */
  readonly onClose = this.closeEmitter.event;
  /** Each notification from the other side. */
  onNotification: (method: string, params: unknown) => void = () => undefined;
  /** A line that is not JSON-RPC (logged by the client). */
  onGarbage: (line: string) => void = () => undefined;
  /** Every message sent and received (`out` / `in`), parsed; for tests and debugging. */
  trace: ((dir: 'out' | 'in', msg: Record<string, unknown>) => void) | undefined;

  constructor(
    input: Readable,
    private readonly output: Writable,
    private readonly framing: Framing = 'lsp',
  ) {
    input.on('data', (b: Buffer) => this.read(typeof b === 'string' ? Buffer.from(b) : b));
    input.on('end', () => this.closed('the broker closed the connection'));
    input.on('close', () => this.closed('the broker closed the connection'));
    input.on('error', (e: Error) => this.closed(`read failed: ${e.message}`));
    output.on('error', (e: Error) => this.closed(`write failed: ${e.message}`));
  }

  get isClosed(): boolean {
    return this.closedWith !== undefined;
  }

  /** Why it closed, once it has. */
  get closeReason(): string | undefined {
    return this.closedWith;
  }

  /**
   * Sends a request; resolves with its result, rejects with the reply's RpcError, or with
   * ConnectionClosed. `cancel` sends `$/cancelRequest` and the broker answers -32800.
   */
  request<R>(method: string, params: unknown, cancel?: Cancel): Promise<R> {
    if (this.closedWith !== undefined) return Promise.reject(new ConnectionClosed(this.closedWith));
    const id = this.nextId++;
    return new Promise<R>((resolve, reject) => {
      let sub: Disposable | undefined;
      this.pending.set(id, {
        method,
        resolve: (v) => {
          sub?.dispose();
          resolve(v as R);
        },
        reject: (e) => {
          sub?.dispose();
          reject(e);
        },
      });
      if (!this.send({ jsonrpc: '2.0', id, method, params: params ?? {} })) return;
      if (cancel) {
        sub = onCancel(cancel, () => {
          if (this.pending.has(id)) this.notify('$/cancelRequest', { id });
        });
      }
    });
  }

  /** Sends a notification (no reply). False when the connection is closed. */
  notify(method: string, params: unknown): boolean {
    return this.send({ jsonrpc: '2.0', method, params: params ?? {} });
  }

  private send(msg: Record<string, unknown>): boolean {
    if (this.closedWith !== undefined) return false;
    this.trace?.('out', msg);
    try {
      const text = JSON.stringify(msg);
      if (this.framing === 'line') {
        this.output.write(text + '\n');
      } else {
        this.output.write(`Content-Length: ${Buffer.byteLength(text, 'utf8')}\r\n\r\n${text}`);
      }
      return true;
    } catch (e) {
      this.closed(`write failed: ${(e as Error).message}`);
      return false;
    }
  }

  private take(): Buffer {
    const all = this.chunks.length === 1 ? this.chunks[0] : Buffer.concat(this.chunks, this.have);
    this.chunks = [];
    this.have = 0;
    return all;
  }

  private keep(rest: Buffer): void {
    this.chunks = rest.length ? [rest] : [];
    this.have = rest.length;
  }

  private read(b: Buffer): void {
    if (!b.length) return;
    this.chunks.push(b);
    this.have += b.length;
    if (this.inLine && b.indexOf(NEWLINE) < 0) return;
    this.inLine = false;
    for (;;) {
      if (this.body >= 0) {
        if (this.have < this.body) return;
        const all = this.take();
        const n = this.body;
        this.body = -1;
        this.keep(all.subarray(n));
        this.dispatch(all.subarray(0, n));
        continue;
      }
      if (!this.have) return;
      const head = this.take();
      let i = 0;
      while (i < head.length && (head[i] === 0x20 || head[i] === 0x09 || head[i] === 0x0d || head[i] === NEWLINE)) i++;
      if (i === head.length) return;
      if (head[i] === 0x43 || head[i] === 0x63) {
        // `Content-Length: N`, other headers, a blank line (`\r\n\r\n` or `\n\n`).
        let end = head.indexOf('\r\n\r\n', i);
        let sep = 4;
        const lf = head.indexOf('\n\n', i);
        if (lf >= 0 && (end < 0 || lf < end)) {
          end = lf;
          sep = 2;
        }
        if (end < 0) {
          if (head.length - i > MAX_HEADER) {
            this.onGarbage(head.subarray(i, i + 200).toString('utf8'));
            return;
          }
          this.keep(head.subarray(i));
          return;
        }
        const m = /content-length:\s*(\d+)/i.exec(head.subarray(i, end).toString('ascii'));
        if (!m) {
          this.onGarbage(head.subarray(i, end).toString('utf8'));
          this.keep(head.subarray(end + sep));
          continue;
        }
        this.body = Number(m[1]);
        this.keep(head.subarray(end + sep));
        continue;
      }
      const nl = head.indexOf(NEWLINE, i);
      if (nl < 0) {
        this.keep(head.subarray(i));
        this.inLine = true;
        return;
      }
      this.keep(head.subarray(nl + 1));
      this.dispatch(head.subarray(i, nl));
    }
  }

  private dispatch(line: Buffer): void {
    const text = line.toString('utf8').trim();
    if (!text) return;
    let msg: unknown;
    try {
      msg = JSON.parse(text);
    } catch {
      this.onGarbage(text);
      return;
    }
    for (const m of Array.isArray(msg) ? msg : [msg]) this.handle(m);
  }

  private handle(m: unknown): void {
    if (!m || typeof m !== 'object') return;
    const msg = m as Record<string, unknown>;
    this.trace?.('in', msg);
    if (typeof msg.method === 'string') {
      if (msg.id === undefined || msg.id === null) {
        try {
          this.onNotification(msg.method, msg.params);
        } catch {
          /* a listener failed: the connection goes on */
        }
      } else {
        // The broker sends no requests; answer so a peer that does is not left waiting.
        this.send({ jsonrpc: '2.0', id: msg.id, error: { code: -32601, message: `Method '${msg.method}' not found.` } });
      }
      return;
    }
    const id = typeof msg.id === 'number' ? msg.id : Number(msg.id);
    const p = this.pending.get(id);
    if (!p) return;
    this.pending.delete(id);
    if (msg.error && typeof msg.error === 'object') p.reject(msg.error as RpcError);
    else p.resolve(msg.result);
  }

  private closed(reason: string): void {
    if (this.closedWith !== undefined) return;
    this.closedWith = reason;
    const err = new ConnectionClosed(reason);
    const pending = [...this.pending.values()];
    this.pending.clear();
    for (const p of pending) p.reject(err);
    try {
      this.closeEmitter.fire(reason);
    } catch {
      /* a listener failed */
    }
    this.closeEmitter.dispose();
  }

  /** Stops: pending requests reject with ConnectionClosed. Never throws. */
  close(reason = 'closed by the client'): void {
    this.closed(reason);
  }
}
