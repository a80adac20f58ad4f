// The broker client: a vscode-jsonrpc connection to `abx rpc` (the per-user daemon) or
// `abx broker --stdio` (a private broker). No `vscode` import: tested under plain node.

import { ChildProcess, spawn } from 'node:child_process';
import * as path from 'node:path';
import {
  CancellationToken,
  createMessageConnection,
  Disposable,
  Emitter,
  Event,
  MessageConnection,
  StreamMessageReader,
  StreamMessageWriter,
} from 'vscode-jsonrpc/node';
import { AbxError, brokerGone } from './errors';
import { ExecHandlers, ExecNote, ExecSession } from './exec';
import type {
  BrokerStatus,
  Capabilities,
  CreateParams,
  DoctorResult,
  ExecExit,
  ExecOutputNote,
  ExecParams,
  ExecResult,
  ExecStarted,
  ExecStartParams,
  FileChunk,
  FileEntry,
  FilesChanged,
  FilesProgress,
  InitializeResult,
  InstallParams,
  InstallPlan,
  PortUrl,
  ProcessEntry,
  ProviderInfo,
  ProviderSummary,
  Sandbox,
  SandboxChanged,
  SandboxSubscribeResult,
  SystemInfo,
  TestResult,
  TestResultNote,
  TransferResult,
} from './types';
import { checkAbxBinary, compareVersions, MIN_ABX_VERSION, PROTOCOL_VERSION, REQUIRED_METHODS, tooOld } from './version';

export interface BrokerOptions {
  /** The abx binary (a name on PATH or a path). Default `abx`. */
  abxPath?: string;
  /** `daemon`: `abx rpc` to the per-user daemon (default); `stdio`: a private `abx broker --stdio`. */
  mode?: 'daemon' | 'stdio';
  /** Environment of the abx process (default: this process's). */
  env?: NodeJS.ProcessEnv;
  /** Sets ABX_HOME for the abx process (its own daemon, data and sockets). */
  abxHome?: string;
  /** Sent in `initialize`. */
  clientInfo?: { name: string; version: string };
  /** Lines the abx process writes to stderr, and connection events. */
  log?: (line: string) => void;
}

/** Largest chunk asked of `files/read` (the broker's maximum). */
export const READ_CHUNK = 4 * 1024 * 1024;
/** Largest chunk sent in one `files/write` (base64 keeps it well under the 64 MiB message limit). */
export const WRITE_CHUNK = 8 * 1024 * 1024;

/** Notifications for an id nobody listens to yet are kept, within these bounds. */
const EARLY_IDS = 64;
const EARLY_NOTES = 4096;

export class BrokerClient implements Disposable {
  readonly abxPath: string;
  readonly mode: 'daemon' | 'stdio';
  /** The environment the abx process runs with (ABX_HOME included). */
  readonly env: NodeJS.ProcessEnv;
  /** `abx --version` of the binary. */
  binaryVersion = '';
  /** The broker's `initialize` result. */
  server: InitializeResult | undefined;

  private readonly conn: MessageConnection;
  private readonly child: ChildProcess;
  private readonly log: (line: string) => void;
  private closed = false;
  private closeReason = 'the connection closed';
  private stderrTail: string[] = [];
  private markClosedResolve!: () => void;
  private readonly closedPromise = new Promise<void>((r) => (this.markClosedResolve = r));
  private readonly closeEmitter = new Emitter<string>();
  /** Fires once, with the reason, when the connection to the broker is gone. */
  readonly onDidClose: Event<string> = this.closeEmitter.event;
  private readonly notifyEmitter = new Emitter<{ method: string; params: unknown }>();
  /** Every notification from the broker (after the exec/watch routing). */
  readonly onNotification: Event<{ method: string; params: unknown }> = this.notifyEmitter.event;

  private readonly execs = new Map<string, ExecSession>();
  private readonly earlyExec = new Map<string, ExecNote[]>();
  private readonly watches = new Map<string, (c: FilesChanged) => void>();
  private readonly earlyWatch = new Map<string, FilesChanged[]>();
  private readonly progress = new Set<(p: FilesProgress) => void>();
  private readonly testResults = new Set<(n: TestResultNote) => void>();
  private readonly sandboxChangedEmitter = new Emitter<SandboxChanged>();
  /** `sandbox/changed` notifications (after `sandboxSubscribe()`). */
  readonly onSandboxChanged: Event<SandboxChanged> = this.sandboxChangedEmitter.event;

  private constructor(opts: BrokerOptions, env: NodeJS.ProcessEnv, child: ChildProcess) {
    this.abxPath = opts.abxPath || 'abx';
    this.mode = opts.mode ?? 'daemon';
    this.env = env;
    this.child = child;
    const log = opts.log;
    // Logging must never break the connection's bookkeeping (a log sink that is already
    // disposed throws, e.g. an output channel during an extension host shutdown).
    this.log = (line) => {
      try {
        log?.(line);
      } catch {
        /* the log is gone */
      }
    };
    this.conn = createMessageConnection(
      new StreamMessageReader(child.stdout!),
      new StreamMessageWriter(child.stdin!),
    );
    this.conn.onNotification((method: string, params: unknown) => this.route(method, params));
    // The process's exit names the reason; a closed stream alone closes shortly after.
    this.conn.onClose(() => setTimeout(() => this.markClosed(this.closeReason), 500).unref());
    this.conn.onError(([err]) => this.log(`connection error: ${err.message}`));
    let buf = '';
    child.stderr!.setEncoding('utf8');
    child.stderr!.on('data', (s: string) => {
      buf += s;
      let i;
      while ((i = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, i).trimEnd();
        buf = buf.slice(i + 1);
        if (!line) continue;
        this.stderrTail.push(line);
        if (this.stderrTail.length > 20) this.stderrTail.shift();
        this.log(line);
      }
    });
    child.on('error', (err) => this.markClosed(`'${this.abxPath}' failed: ${err.message}`));
    const exited = (code: number | null, signal: NodeJS.Signals | null) => {
      const last = this.stderrTail.filter((l) => l.trim()).slice(-3).join(' ');
      const how = signal ? `was killed by ${signal}` : `exited with code ${code}`;
      this.markClosed(last ? `'abx ${this.args.join(' ')}' ${how}: ${last}` : `'abx ${this.args.join(' ')}' ${how}`);
    };
    // 'close' comes once stderr is read to its end (the reason is its last lines); 'exit'
    // alone is enough when something else holds the pipes open.
    child.on('close', exited);
    child.on('exit', (code, signal) => setTimeout(() => exited(code, signal), 500).unref());
    // Writes into a dead process must not crash the extension host.
    child.stdin!.on('error', (err) => this.log(`abx stdin: ${err.message}`));
    this.conn.listen();
  }

  private get args(): string[] {
    return this.mode === 'stdio' ? ['broker', '--stdio'] : ['rpc'];
  }

  /**
   * Checks the binary (`abx --version`: E1007 when missing, E1008 when too old), starts
   * `abx rpc` (or `abx broker --stdio`), and says `initialize` (E1008 when the broker does
   * not speak abx/1 or lacks a method this extension uses).
   */
  static async connect(opts: BrokerOptions = {}): Promise<BrokerClient> {
    const abxPath = opts.abxPath || 'abx';
    const env: NodeJS.ProcessEnv = { ...(opts.env ?? process.env) };
    if (opts.abxHome) env.ABX_HOME = opts.abxHome;
    const version = await checkAbxBinary(abxPath, env);
    const args = opts.mode === 'stdio' ? ['broker', '--stdio'] : ['rpc'];
    const child = spawn(abxPath, args, { env, stdio: ['pipe', 'pipe', 'pipe'], cwd: env.HOME && path.isAbsolute(env.HOME) ? env.HOME : undefined });
    const client = new BrokerClient(opts, env, child);
    client.binaryVersion = version;
    try {
      await client.handshake(opts.clientInfo ?? { name: 'abx-vscode', version: '0.0.0' });
    } catch (err) {
      client.dispose();
      throw err;
    }
    return client;
  }

  private async handshake(clientInfo: { name: string; version: string }): Promise<void> {
    let init: InitializeResult;
    try {
      init = await this.request<InitializeResult>('initialize', { clientInfo });
    } catch (err) {
      if (err instanceof AbxError && (err.abx === 'E1003' || err.code === -32601)) {
        throw tooOld(this.abxPath, this.binaryVersion, "the broker does not answer 'initialize'");
      }
      throw err;
    }
    this.server = init;
    const found = init.serverInfo?.version ?? '?';
    if (init.protocolVersion !== PROTOCOL_VERSION) {
      throw tooOld(this.abxPath, found, `the broker speaks '${init.protocolVersion}', this extension '${PROTOCOL_VERSION}'`);
    }
    if (compareVersions(found, MIN_ABX_VERSION) < 0) {
      throw tooOld(this.abxPath, found, `the running broker is older than ${MIN_ABX_VERSION}`);
    }
    const methods = init.capabilities?.methods;
    if (Array.isArray(methods)) {
      const missing = REQUIRED_METHODS.filter((m) => !methods.includes(m));
      if (missing.length) {
        throw tooOld(this.abxPath, found, `the broker lacks ${missing.join(', ')}`);
      }
    }
    this.conn.sendNotification('initialized', {}).catch(() => undefined);
  }

  get isClosed(): boolean {
    return this.closed;
  }

  /** Process id of `abx rpc` (or `abx broker --stdio`). */
  get pid(): number | undefined {
    return this.child.pid;
  }

  /** Whether the abx process has exited. */
  get processExited(): boolean {
    return this.child.exitCode !== null || this.child.signalCode !== null;
  }

  get serverVersion(): string {
    return this.server?.serverInfo.version ?? '';
  }

  private markClosed(reason: string): void {
    if (this.closed) return;
    this.closed = true;
    this.closeReason = reason;
    this.log(`broker connection closed: ${reason}`);
    this.markClosedResolve();
    const err = brokerGone(undefined, reason);
    for (const s of this.execs.values()) {
      try {
        s.connectionLost(err);
      } catch {
        /* a listener failed: the others still hear of it */
      }
    }
    this.execs.clear();
    // Pending requests are rejected by the dispose (PendingResponseRejected -> E1007).
    try {
      this.conn.dispose();
    } catch {
      /* already disposed */
    }
    try {
      this.closeEmitter.fire(reason);
    } catch (e) {
      this.log(`a close listener failed: ${(e as Error)?.message ?? e}`);
    }
  }

  /** Any broker method. Errors are AbxError with the E-code and suggestion. */
  async request<R>(method: string, params?: object, token?: CancellationToken): Promise<R> {
    if (this.closed) throw brokerGone(method, this.closeReason);
    try {
      return token
        ? await this.conn.sendRequest<R>(method, params ?? {}, token)
        : await this.conn.sendRequest<R>(method, params ?? {});
    } catch (err) {
      const e = AbxError.from(err, method);
      const fromBroker = typeof (err as { code?: unknown })?.code === 'number' && e.abx !== 'E1007';
      if (!fromBroker) {
        // A transport failure (EPIPE, a closed stream): the process exit says why.
        await Promise.race([this.closedPromise, new Promise((r) => setTimeout(r, 2000).unref())]);
        if (this.closed) throw brokerGone(method, this.closeReason);
      }
      throw e;
    }
  }

  /** A notification to the broker. */
  async notify(method: string, params?: object): Promise<void> {
    if (this.closed) throw brokerGone(method, this.closeReason);
    await this.conn.sendNotification(method, params ?? {});
  }

  private route(method: string, params: unknown): void {
    const p = params as Record<string, unknown>;
    switch (method) {
      case 'exec/output':
      case 'exec/exit': {
        const note: ExecNote =
          method === 'exec/output'
            ? { kind: 'output', params: p as unknown as ExecOutputNote }
            : { kind: 'exit', params: p as unknown as ExecExit };
        const id = String(p?.execId);
        const s = this.execs.get(id);
        if (s) {
          s.deliver(note);
          if (note.kind === 'exit') this.execs.delete(id);
        } else {
          keepEarly(this.earlyExec, id, note);
        }
        break;
      }
      case 'files/changed': {
        const c = p as unknown as FilesChanged;
        const l = this.watches.get(c.watchId);
        if (l) l(c);
        else keepEarly(this.earlyWatch, c.watchId, c);
        break;
      }
      case 'files/progress':
        for (const l of this.progress) l(p as unknown as FilesProgress);
        break;
      case 'provider/testResult':
        for (const l of this.testResults) l(p as unknown as TestResultNote);
        break;
      case 'sandbox/changed':
        if (p && typeof p.sandbox === 'string' && typeof p.change === 'string') {
          try {
            this.sandboxChangedEmitter.fire(p as unknown as SandboxChanged);
          } catch (e) {
            this.log(`a sandbox/changed listener failed: ${(e as Error)?.message ?? e}`);
          }
        }
        break;
    }
    this.notifyEmitter.fire({ method, params });
  }

  /** Closes the connection; never throws. `abx rpc` is ended (SIGTERM) if it stays. */
  dispose(): void {
    if (!this.closed) {
      this.closeReason = 'closed by the client';
      try {
        this.child.stdin?.end();
      } catch {
        /* gone */
      }
    }
    this.markClosed(this.closeReason);
    // `abx rpc` waits for open exec streams after stdin closes: do not leave it behind.
    if (!this.processExited) {
      const term = setTimeout(() => this.terminate('SIGTERM'), 1000);
      const kill = setTimeout(() => this.terminate('SIGKILL'), 3000);
      term.unref();
      kill.unref();
      this.child.once('exit', () => {
        clearTimeout(term);
        clearTimeout(kill);
      });
    }
    this.closeEmitter.dispose();
    this.notifyEmitter.dispose();
    this.sandboxChangedEmitter.dispose();
  }

  /**
   * Closes the connection and waits for the abx process to end: it gets `graceMs` after its
   * stdin closes, then SIGTERM, then SIGKILL. For shutdowns, where an unref'd timer may
   * never fire.
   */
  async close(graceMs = 1500): Promise<void> {
    const exited = new Promise<void>((resolve) => {
      if (this.processExited) resolve();
      else this.child.once('exit', () => resolve());
    });
    const within = (ms: number) =>
      Promise.race([exited.then(() => true), new Promise<boolean>((r) => setTimeout(() => r(false), ms).unref())]);
    this.dispose();
    if (await within(graceMs)) return;
    this.terminate('SIGTERM');
    if (await within(1000)) return;
    this.terminate('SIGKILL');
    await within(1000);
  }

  private terminate(signal: NodeJS.Signals): void {
    try {
      if (!this.processExited) this.child.kill(signal);
    } catch {
      /* gone */
    }
  }

  // ---- broker ----

  ping(): Promise<object> {
    return this.request('broker/ping');
  }

  status(): Promise<BrokerStatus> {
    return this.request('broker/status');
  }

  // ---- providers ----

  async providerList(): Promise<ProviderSummary[]> {
    return (await this.request<{ providers: ProviderSummary[] }>('provider/list')).providers;
  }

  providerInfo(id: string): Promise<ProviderInfo> {
    return this.request('provider/info', { id });
  }

  providerDoctor(id: string, token?: CancellationToken): Promise<DoctorResult> {
    return this.request('provider/doctor', { id }, token);
  }

  providerInstall(params: InstallParams, token?: CancellationToken): Promise<InstallPlan> {
    return this.request('provider/install', params, token);
  }

  providerSetDefault(id: string): Promise<object> {
    return this.request('provider/setDefault', { id });
  }

  /** The contract kit; `onResult` gets each test as it finishes (`provider/testResult`). */
  async providerTest(
    id: string,
    opts: { filter?: string; onResult?: (n: TestResultNote) => void } = {},
    token?: CancellationToken,
  ): Promise<TestResult> {
    const l = (n: TestResultNote) => {
      if (n.id === id) opts.onResult?.(n);
    };
    this.testResults.add(l);
    try {
      const params: Record<string, unknown> = { id };
      if (opts.filter) params.filter = opts.filter;
      return await this.request<TestResult>('provider/test', params, token);
    } finally {
      this.testResults.delete(l);
    }
  }

  templatesList(provider?: string): Promise<unknown> {
    return this.request('templates/list', provider ? { provider } : {});
  }

  // ---- sandboxes ----

  sandboxCreate(params: CreateParams = {}, token?: CancellationToken): Promise<Sandbox> {
    return this.request('sandbox/create', dropEmpty(params), token);
  }

  async sandboxList(provider?: string): Promise<Sandbox[]> {
    return (await this.request<{ sandboxes: Sandbox[] }>('sandbox/list', provider ? { provider } : {})).sandboxes;
  }

  /**
   * `sandbox/subscribe`: from now on this connection gets `sandbox/changed` (onSandboxChanged)
   * for every sandbox of every provider. A broker without it rejects with -32601 (E1003).
   */
  sandboxSubscribe(): Promise<SandboxSubscribeResult> {
    return this.request('sandbox/subscribe');
  }

  /** `sandbox/unsubscribe`: no more `sandbox/changed` on this connection. */
  sandboxUnsubscribe(): Promise<SandboxSubscribeResult> {
    return this.request('sandbox/unsubscribe');
  }

  /**
   * Whether the broker offers `method` (its `initialize` method list); undefined when it does
   * not send one.
   */
  offers(method: string): boolean | undefined {
    const methods = this.server?.capabilities?.methods;
    return Array.isArray(methods) ? methods.includes(method) : undefined;
  }

  sandboxInfo(sandbox: string): Promise<Sandbox> {
    return this.request('sandbox/info', { sandbox });
  }

  sandboxKill(sandbox: string): Promise<{ killed: boolean }> {
    return this.request('sandbox/kill', { sandbox });
  }

  sandboxPause(sandbox: string): Promise<Sandbox> {
    return this.request('sandbox/pause', { sandbox });
  }

  sandboxResume(sandbox: string): Promise<Sandbox> {
    return this.request('sandbox/resume', { sandbox });
  }

  sandboxSetTimeout(sandbox: string, timeout: number): Promise<Sandbox> {
    return this.request('sandbox/setTimeout', { sandbox, timeout });
  }

  sandboxCapabilities(sandbox: string): Promise<Capabilities> {
    return this.request('sandbox/capabilities', { sandbox });
  }

  sandboxSystemInfo(sandbox: string): Promise<SystemInfo> {
    return this.request('sandbox/systemInfo', { sandbox });
  }

  async processList(sandbox: string): Promise<ProcessEntry[]> {
    return (await this.request<{ processes: ProcessEntry[] }>('process/list', { sandbox })).processes;
  }

  // ---- exec ----

  /** Runs to completion; cancelling the token kills the command (-32800, E1006). */
  execRun(params: ExecParams, token?: CancellationToken): Promise<ExecResult> {
    return this.request('exec/run', dropEmpty(params), token);
  }

  /**
   * Starts a streamed exec (`pty` for a terminal). Output and the exit come through the
   * session (and `handlers`, attached before any output is delivered).
   */
  async execStart(params: ExecStartParams, handlers: ExecHandlers = {}, token?: CancellationToken): Promise<ExecSession> {
    const started = await this.request<ExecStarted>('exec/start', dropEmpty(params), token);
    const early = this.earlyExec.get(started.execId) ?? [];
    this.earlyExec.delete(started.execId);
    const session = new ExecSession(this, started.execId, started.pid, handlers, early);
    if (early.some((n) => n.kind === 'exit')) {
      // Its stream is over already: nothing more will come for it.
    } else {
      this.execs.set(started.execId, session);
    }
    return session;
  }

  // ---- files ----

  filesStat(sandbox: string, path: string): Promise<FileEntry> {
    return this.request('files/stat', { sandbox, path });
  }

  async filesList(sandbox: string, path: string, recursive = false): Promise<FileEntry[]> {
    const params: Record<string, unknown> = { sandbox, path };
    if (recursive) params.recursive = true;
    return (await this.request<{ entries: FileEntry[] }>('files/list', params)).entries;
  }

  /** A whole file, read in chunks of at most 4 MiB, byte-exact. */
  async filesReadAll(sandbox: string, path: string, token?: CancellationToken): Promise<Buffer> {
    const parts: Buffer[] = [];
    let offset = 0;
    for (;;) {
      const c = await this.request<FileChunk>(
        'files/read',
        { sandbox, path, offset, length: READ_CHUNK, encoding: 'base64' },
        token,
      );
      const b = Buffer.from(c.data, c.encoding === 'base64' ? 'base64' : 'utf8');
      parts.push(b);
      offset += b.length;
      if (c.eof || b.length === 0) break;
    }
    return Buffer.concat(parts);
  }

  /**
   * Writes a whole file. Up to WRITE_CHUNK it is one atomic `files/write`; larger files are
   * written in chunks to a temporary sibling and renamed over the target, so a failure
   * never leaves the target half-written.
   */
  async filesWriteAll(sandbox: string, path: string, data: Uint8Array, mode?: number): Promise<number> {
    const buf = Buffer.from(data.buffer, data.byteOffset, data.byteLength);
    if (buf.length <= WRITE_CHUNK) {
      const params: Record<string, unknown> = { sandbox, path, data: buf.toString('base64'), encoding: 'base64' };
      if (mode !== undefined) params.mode = mode;
      return (await this.request<{ size: number }>('files/write', params)).size;
    }
    const slash = path.lastIndexOf('/');
    const tmp = `${path.slice(0, slash + 1)}.${path.slice(slash + 1)}.abx-${process.pid}-${Date.now()}.part`;
    try {
      for (let off = 0; off < buf.length; off += WRITE_CHUNK) {
        const params: Record<string, unknown> = {
          sandbox,
          path: tmp,
          data: buf.subarray(off, off + WRITE_CHUNK).toString('base64'),
          encoding: 'base64',
        };
        if (off > 0) params.offset = off;
        else if (mode !== undefined) params.mode = mode;
        await this.request('files/write', params);
      }
      await this.request('files/rename', { sandbox, from: tmp, to: path });
    } catch (err) {
      await this.request('files/remove', { sandbox, path: tmp }).catch(() => undefined);
      throw err;
    }
    return buf.length;
  }

  filesMkdir(sandbox: string, path: string, parents = false): Promise<object> {
    return this.request('files/mkdir', parents ? { sandbox, path, parents } : { sandbox, path });
  }

  filesRemove(sandbox: string, path: string, recursive = false): Promise<object> {
    return this.request('files/remove', recursive ? { sandbox, path, recursive } : { sandbox, path });
  }

  filesRename(sandbox: string, from: string, to: string): Promise<object> {
    return this.request('files/rename', { sandbox, from, to });
  }

  /** The broker streams LOCAL into the sandbox (same user); progress from `files/progress`. */
  filesUpload(
    sandbox: string,
    localPath: string,
    path: string,
    onProgress?: (p: FilesProgress) => void,
    token?: CancellationToken,
  ): Promise<TransferResult> {
    return this.transfer('files/upload', sandbox, localPath, path, onProgress, token);
  }

  /** The broker streams a sandbox file out to LOCAL (same user). */
  filesDownload(
    sandbox: string,
    path: string,
    localPath: string,
    onProgress?: (p: FilesProgress) => void,
    token?: CancellationToken,
  ): Promise<TransferResult> {
    return this.transfer('files/download', sandbox, localPath, path, onProgress, token);
  }

  private async transfer(
    method: string,
    sandbox: string,
    localPath: string,
    path: string,
    onProgress?: (p: FilesProgress) => void,
    token?: CancellationToken,
  ): Promise<TransferResult> {
    const l = (p: FilesProgress) => {
      if (p.path === path && (p.sandbox === sandbox || sandbox.endsWith(`:${p.sandbox}`))) onProgress?.(p);
    };
    if (onProgress) this.progress.add(l);
    try {
      return await this.request<TransferResult>(method, { sandbox, localPath, path }, token);
    } finally {
      this.progress.delete(l);
    }
  }

  /** `files/watch`; `listener` gets each `files/changed`; dispose to unwatch. */
  async filesWatch(
    sandbox: string,
    path: string,
    recursive: boolean,
    listener: (c: FilesChanged) => void,
  ): Promise<Disposable & { watchId: string }> {
    const { watchId } = await this.request<{ watchId: string }>('files/watch', { sandbox, path, recursive });
    this.watches.set(watchId, listener);
    const early = this.earlyWatch.get(watchId) ?? [];
    this.earlyWatch.delete(watchId);
    for (const c of early) listener(c);
    return {
      watchId,
      dispose: () => {
        if (!this.watches.delete(watchId)) return;
        if (!this.closed) this.request('files/unwatch', { watchId }).catch(() => undefined);
      },
    };
  }

  // ---- ports ----

  portsUrl(sandbox: string, port: number): Promise<PortUrl> {
    return this.request('ports/url', { sandbox, port });
  }
}

function keepEarly<T>(map: Map<string, T[]>, id: string, note: T): void {
  let list = map.get(id);
  if (!list) {
    if (map.size >= EARLY_IDS) map.delete(map.keys().next().value as string);
    list = [];
    map.set(id, list);
  }
  if (list.length < EARLY_NOTES) list.push(note);
}

/** Drops undefined and null members (the broker treats absent as default). */
function dropEmpty<T extends object>(o: T): T {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(o)) {
    if (v !== undefined && v !== null) out[k] = v;
  }
  return out as T;
}
