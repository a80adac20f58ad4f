//! One streamed exec (`exec/start`): its output and exit notifications (as events, or as an
//! async iterator that ends with the exit), stdin, resize, kill.

import { StringDecoder } from 'node:string_decoder';
import type { AbxError } from './errors.js';
import { Emitter, Event } from './jsonrpc.js';
import type { ExecExit, ExecOutputNote } from './types.js';

/** One chunk of output, as bytes and as text decoded across chunk boundaries. */
export interface OutputChunk {
  /** `stdout`, `stderr` or `pty`. */
  stream: string;
  bytes: Buffer;
  /** UTF-8 text; a character split between two chunks comes whole with the second. */
  text: string;
}

/** What iterating an ExecSession yields: output chunks in order, then exactly one exit. */
export type ExecEvent =
  | { type: 'output'; stream: string; bytes: Buffer; text: string }
  | ({ type: 'exit' } & ExecExit);

export interface ExecHandlers {
  onOutput?: (chunk: OutputChunk) => void;
  onExit?: (exit: ExecExit) => void;
}

/** What an ExecSession needs from its connection. */
export interface ExecTransport {
  request<R>(method: string, params: object): Promise<R>;
  /** Kills execs from an exiting process, waiting (blocking) for the broker's replies. */
  killExecsSync?(execIds: string[], waitMs?: number): void;
}

type Note = { kind: 'output'; params: ExecOutputNote } | { kind: 'exit'; params: ExecExit };

/** What `exec/attach` said (a session made by `attach`). */
export interface AttachInfo {
  running: boolean;
  replayed: number;
  droppedBytes: number;
}

// ---- ending streamed commands with this process
//
// A streamed command outlives its client on the broker (so that `exec/attach` can pick it
// up). Unless told to keep it (`keepOnExit`), a session ends its command when this process
// is interrupted (SIGINT, SIGTERM: the kills are sent, then the signal does what it did
// before) or exits (the kill is written before the process goes).

const live = new Set<ExecSession>();
const SIGNALS: NodeJS.Signals[] = ['SIGINT', 'SIGTERM'];
let installed = false;

function killAllSync(): void {
  // Per connection: the kills written, then a wait for the broker's replies (see
  // BrokerClient.killExecsSync); a transport without it gets the kills sent only.
  const byTransport = new Map<ExecTransport, string[]>();
  for (const s of live) {
    if (s.done) continue;
    const t = s.transportOf();
    const ids = byTransport.get(t) ?? [];
    ids.push(s.execId);
    byTransport.set(t, ids);
  }
  for (const [t, ids] of byTransport) {
    try {
      if (t.killExecsSync) t.killExecsSync(ids);
      else for (const id of ids) void t.request('exec/kill', { execId: id }).catch(() => undefined);
    } catch {
      /* the connection is gone */
    }
  }
}

function onSignal(sig: NodeJS.Signals): void {
  const all = [...live];
  const kills = all.map((s) => s.kill('KILL').catch(() => undefined));
  const done = Promise.race([Promise.all(kills), new Promise((r) => setTimeout(r, 1500).unref())]);
  void done.then(() => {
    // Our part is done: the signal's own handling from now on (a second Ctrl-C too).
    live.clear();
    uninstall();
    // Nobody else listens: the signal's default action (the process ends), as without us.
    if (process.listenerCount(sig) === 0) process.kill(process.pid, sig);
  });
}

const handlers = new Map<NodeJS.Signals, () => void>(SIGNALS.map((s) => [s, () => onSignal(s)]));

function install(): void {
  if (installed) return;
  installed = true;
  for (const [sig, h] of handlers) process.on(sig, h);
  process.on('exit', killAllSync);
}

function uninstall(): void {
  if (!installed || live.size) return;
  installed = false;
  for (const [sig, h] of handlers) process.removeListener(sig, h);
  process.removeListener('exit', killAllSync);
}

export class ExecSession {
  readonly execId: string;
  /** Set by `attach`: what the broker replayed. */
  attachInfo?: AttachInfo;
  readonly pid: number | null;
  /** Resolves with the exit notification; rejects when the broker connection is lost first. */
  readonly exited: Promise<ExecExit>;
  private readonly outputEmitter = new Emitter<OutputChunk>();
  private readonly exitEmitter = new Emitter<ExecExit>();
  readonly onOutput: Event<OutputChunk> = this.outputEmitter.event;
  readonly onExit: Event<ExecExit> = this.exitEmitter.event;
  private readonly decoders = new Map<string, StringDecoder>();
  private pending: Note[] | undefined;
  private exit: ExecExit | undefined;
  private resolveExit!: (e: ExecExit) => void;
  private queue: ExecEvent[] | undefined;
  private wake: (() => void) | undefined;
  private lost: AbxError | undefined;
  private rejectExit!: (e: Error) => void;

  constructor(
    private readonly transport: ExecTransport,
    execId: string,
    pid: number | null | undefined,
    handlers: ExecHandlers = {},
    early: Note[] = [],
  ) {
    this.execId = execId;
    this.pid = pid ?? null;
    this.exited = new Promise<ExecExit>((resolve, reject) => {
      this.resolveExit = resolve;
      this.rejectExit = reject;
    });
    // Nobody may await `exited`: a lost connection must not be an unhandled rejection.
    this.exited.catch(() => undefined);
    if (handlers.onOutput) this.onOutput(handlers.onOutput);
    if (handlers.onExit) this.onExit(handlers.onExit);
    // Notifications that came before the caller could subscribe are replayed on the next
    // turn, in order, so `const s = await execStart(..); s.onOutput(..)` sees all output.
    this.pending = [...early];
    setImmediate(() => this.flush());
  }

  /** Whether the exit notification has come. */
  get done(): boolean {
    return this.exit !== undefined;
  }

  get exitInfo(): ExecExit | undefined {
    return this.exit;
  }

  /** @internal called by the client for each notification of this exec. */
  deliver(note: Note): void {
    if (this.pending) {
      this.pending.push(note);
      return;
    }
    this.handle(note);
  }

  /** @internal the connection went away. */
  connectionLost(err: AbxError): void {
    if (this.exit) return;
    this.lost = err;
    this.rejectExit(err);
    this.poke();
  }

  /**
   * Keeps every event from now on for the async iterator. Called before the first event is
   * delivered (the session replays on the next turn), so the iterator sees all output.
   */
  startQueue(): void {
    if (this.queue) return;
    this.queue = [];
    this.onOutput((c) => {
      this.queue!.push({ type: 'output', ...c });
      this.poke();
    });
    this.onExit((e) => {
      this.queue!.push({ type: 'exit', ...e });
      this.poke();
    });
  }

  private poke(): void {
    const w = this.wake;
    this.wake = undefined;
    w?.();
  }

  /**
   * The output chunks in the order they were read, then one `exit` event, then the end. A
   * lost connection ends it with an E1007 error.
   */
  async *[Symbol.asyncIterator](): AsyncGenerator<ExecEvent, void, undefined> {
    this.startQueue();
    const q = this.queue!;
    for (;;) {
      const ev = q.shift();
      if (ev) {
        yield ev;
        if (ev.type === 'exit') return;
        continue;
      }
      if (this.lost) throw this.lost;
      await new Promise<void>((r) => (this.wake = r));
    }
  }

  private flush(): void {
    const notes = this.pending ?? [];
    this.pending = undefined;
    for (const n of notes) this.handle(n);
  }

  private handle(note: Note): void {
    if (note.kind === 'output') {
      const p = note.params;
      const bytes = p.encoding === 'base64' ? Buffer.from(p.data, 'base64') : Buffer.from(p.data, 'utf8');
      let dec = this.decoders.get(p.stream);
      if (!dec) {
        dec = new StringDecoder('utf8');
        this.decoders.set(p.stream, dec);
      }
      this.outputEmitter.fire({ stream: p.stream, bytes, text: dec.write(bytes) });
      return;
    }
    if (this.exit) return;
    // Flush what the decoders still hold (an incomplete character at the very end).
    for (const [stream, dec] of this.decoders) {
      const rest = dec.end();
      if (rest) this.outputEmitter.fire({ stream, bytes: Buffer.alloc(0), text: rest });
    }
    this.exit = note.params;
    this.exitEmitter.fire(note.params);
    this.resolveExit(note.params);
  }

  /** Sends bytes to stdin (`exec/write`); `eof` closes stdin after them. */
  async write(data: string | Uint8Array, eof = false): Promise<void> {
    const params: Record<string, unknown> = { execId: this.execId };
    if (typeof data === 'string') {
      params.data = data;
    } else {
      params.data = Buffer.from(data).toString('base64');
      params.encoding = 'base64';
    }
    if (eof) params.eof = true;
    await this.transport.request('exec/write', params);
  }

  /** Closes stdin. */
  async closeStdin(): Promise<void> {
    await this.transport.request('exec/write', { execId: this.execId, data: '', eof: true });
  }

  /** Resizes the pty (`exec/resize`). */
  async resize(cols: number, rows: number): Promise<void> {
    await this.transport.request('exec/resize', { execId: this.execId, cols, rows });
  }

  /**
   * Ends the command when this process is interrupted (SIGINT, SIGTERM) or exits, and when
   * an `await using` block holding the session ends (the default of `execStream`).
   */
  guard(): this {
    if (this.done || this.keep) return this;
    live.add(this);
    install();
    this.exited
      .finally(() => {
        live.delete(this);
        uninstall();
      })
      .catch(() => undefined);
    return this;
  }

  private keep = false;

  /** Leaves the command running when this process ends (re-attach with `exec/attach`). */
  keepOnExit(): this {
    this.keep = true;
    live.delete(this);
    uninstall();
    return this;
  }

  /** `await using s = await sb.execStream(..)`: kills the command (KILL) if still running. */
  async [Symbol.asyncDispose](): Promise<void> {
    if (this.done || this.keep) return;
    await this.kill('KILL').catch(() => undefined);
    await Promise.race([this.exited.catch(() => undefined), new Promise((r) => setTimeout(r, 5000).unref())]);
  }

  /** @internal the connection this session speaks over. */
  transportOf(): ExecTransport {
    return this.transport;
  }

  /** Signals the whole process tree (`exec/kill`, default KILL). */
  async kill(signal?: string): Promise<void> {
    await this.transport.request('exec/kill', signal ? { execId: this.execId, signal } : { execId: this.execId });
  }

  dispose(): void {
    this.outputEmitter.dispose();
    this.exitEmitter.dispose();
  }
}

export type { Note as ExecNote };
