//! The low-level broker client: one JSON-RPC connection (jsonrpc.ts) to the daemon's socket,
//! a spawned `abx rpc` / `abx broker --stdio`, or `ssh host -- abx rpc` (transport.ts), with a
//! method per broker call, exec/watch/progress notifications routed to their owners, and
//! E-coded errors (errors.ts). The VS Code extension uses it as is; sandbox.ts builds the
//! Sandbox API on it.

import type { ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import { AbxError, brokerGone, cancelled } from './errors.js';
import { ExecHandlers, ExecNote, ExecSession } from './exec.js';
import { Cancel, ConnectionClosed, Connection, Disposable, Emitter, Event, Framing, isCancelled } from './jsonrpc.js';
import { Link, openProcess, openSocket, parseHost, sshArgs, sshFailure, SshTarget } from './transport.js';
import type {
  BrokerStatus,
  Capabilities,
  CodeRunParams,
  CodeRunResult,
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
  SandboxListResult,
  SandboxSubscribeResult,
  SystemInfo,
  TestResult,
  TestResultNote,
  TransferResult,
} from './types.js';
import { checkAbxBinary, compareVersions, MIN_ABX_VERSION, PROTOCOL_VERSION, REQUIRED_METHODS, tooOld } from './version.js';

/** How to reach the broker. */
export type ConnectionMode = 'socket' | 'daemon' | 'stdio' | 'ssh';

export interface BrokerOptions {
  /** The abx binary (a name on PATH or a path). Default: ABX_BIN, else `abx`. */
  abxPath?: string;
  /**
   * `daemon`: a spawned `abx rpc` bridging to the per-user daemon (the default of
   * BrokerClient.connect, what the VS Code extension uses); `socket`: the daemon's Unix socket
   * directly, started through `abx broker start` when none answers (the default of the
   * Sandbox API); `stdio`: a private `abx broker --stdio`; `ssh`: `ssh host -- abx rpc`
   * (chosen by `host`).
   */
  mode?: ConnectionMode;
  /**
   * A broker on another machine: `ssh://[user@]host[:port]` or `[user@]host`. Runs
   * `ssh [-p PORT] [user@]host -- abx rpc` (the user's own ssh, keys and config) and speaks
   * over its stdio. Default: ABX_HOST of `env` when `mode` is not given.
   */
  host?: string;
  /** The abx binary on the remote machine. Default: ABX_REMOTE_BIN, else `abx`. */
  remoteBin?: string;
  /** The ssh binary. Default: ABX_SSH, else `ssh`. */
  sshPath?: string;
  /** Extra ssh arguments, before the host (`-F`, `-i`, `-o ...`). */
  sshOptions?: string[];
  /**
   * The daemon's socket (mode `socket`), used exactly as given. Default: the live daemon of the
   * data dir of `env`, found as the CLI finds it (`resolveSocket`: the runtime dir's socket,
   * else the one the data dir's `broker.lock` records).
   */
  socket?: string;
  /** Mode `socket`: start the daemon when none answers (default true). */
  autoStart?: boolean;
  /** Environment of the abx / ssh process, and where ABX_HOME, ABX_HOST... are read (default: this process's). */
  env?: NodeJS.ProcessEnv;
  /** Sets ABX_HOME for the abx process (its own daemon, data and sockets). */
  abxHome?: string;
  /** Sent in `initialize`. */
  clientInfo?: { name: string; version: string };
  /** Lines the abx process writes to stderr, and connection events. */
  log?: (line: string) => void;
  /** Every JSON-RPC message sent (`out`) and received (`in`). */
  trace?: (dir: 'out' | 'in', msg: Record<string, unknown>) => void;
  /**
   * Let the Node process exit while nothing is in flight (no request, stream or watch): the
   * connection does not hold the event loop then. Default false (the Sandbox API: true).
   */
  unrefWhenIdle?: boolean;
  /** Framing of what this client sends: `lsp` (Content-Length, default) or `line`. Replies are read in either. */
  framing?: Framing;
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
  readonly mode: ConnectionMode;
  /** The environment the abx process runs with (ABX_HOME included). */
  readonly env: NodeJS.ProcessEnv;
  /** `abx --version` of the binary ('' when it was not run: socket, ssh). */
  binaryVersion = '';
  /** The broker's `initialize` result. */
  server: InitializeResult | undefined;
  /** The ssh target (mode `ssh`). */
  readonly sshTarget: SshTarget | undefined;
  /** What this is connected through: `abx rpc`, the socket path, `ssh ... -- abx rpc`. */
  readonly label: string;

  private readonly conn: Connection;
  private readonly link: Link;
  private readonly child: ChildProcess | undefined;
  private readonly log: (line: string) => void;
  private closed = false;
  private busy = 0;
  private readonly unrefWhenIdle: boolean;
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

  private constructor(opts: BrokerOptions, mode: ConnectionMode, env: NodeJS.ProcessEnv, link: Link, target?: SshTarget) {
    this.abxPath = opts.abxPath || env.ABX_BIN || 'abx';
    this.mode = mode;
    this.env = env;
    this.link = link;
    this.child = link.child;
    this.sshTarget = target;
    this.label = link.label;
    this.unrefWhenIdle = opts.unrefWhenIdle ?? false;
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
    this.conn = new Connection(link.input, link.output, opts.framing ?? 'lsp');
    this.conn.trace = opts.trace;
    this.conn.onNotification = (method, params) => this.route(method, params);
    this.conn.onGarbage = (line) => this.log(`not JSON-RPC from the broker: ${line.slice(0, 200)}`);
    const child = this.child;
    if (child) {
      // The process's exit names the reason; a closed stream alone closes shortly after.
      this.conn.onClose(() => setTimeout(() => this.markClosed(this.closeReason), 500).unref());
      let buf = '';
      link.stderr!.setEncoding('utf8');
      link.stderr!.on('data', (s: string) => {
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
      child.on('error', (err) => this.markClosed(`'${this.label}' failed: ${err.message}`));
      const exited = (code: number | null, signal: NodeJS.Signals | null) => {
        const last = this.stderrTail.filter((l) => l.trim()).slice(-3).join(' ');
        const how = signal ? `was killed by ${signal}` : `exited with code ${code}`;
        this.markClosed(last ? `'${this.label}' ${how}: ${last}` : `'${this.label}' ${how}`);
      };
      // 'close' comes once stderr is read to its end (the reason is its last lines); 'exit'
      // alone is enough when something else holds the pipes open.
      child.on('close', exited);
      child.on('exit', (code, signal) => setTimeout(() => exited(code, signal), 500).unref());
      // Writes into a dead process must not crash the host program.
      link.output.on('error', (err) => this.log(`abx stdin: ${err.message}`));
    } else {
      this.conn.onClose((reason) => this.markClosed(reason));
    }
    this.setRef(!this.unrefWhenIdle);
  }

  /** Something is in flight: the connection holds the event loop (unrefWhenIdle). */
  private hold(): void {
    if (this.busy++ === 0 && this.unrefWhenIdle) this.setRef(true);
  }

  private release(): void {
    if (--this.busy === 0 && this.unrefWhenIdle) this.setRef(false);
  }

  private setRef(on: boolean): void {
    const handles: Array<{ ref?: () => unknown; unref?: () => unknown } | null | undefined> = [
      this.link.socket,
      this.child,
      this.child?.stdout as never,
      this.child?.stderr as never,
      this.child?.stdin as never,
    ];
    for (const h of handles) {
      try {
        if (on) h?.ref?.();
        else h?.unref?.();
      } catch {
        /* not a handle */
      }
    }
  }

  /**
   * Connects: mode `daemon` (the default here) checks the binary (`abx --version`: E1007 when
   * missing, E1008 when too old) and starts `abx rpc`; `stdio` starts `abx broker --stdio`;
   * `socket` opens the daemon's socket (starting the daemon when none answers); `host` (or
   * ABX_HOST when no mode is given) runs `ssh host -- abx rpc`. Then says `initialize`
   * (E1008 when the broker does not speak abx/1 or lacks a method this client uses).
   */
  static async connect(opts: BrokerOptions = {}): Promise<BrokerClient> {
    const env: NodeJS.ProcessEnv = { ...(opts.env ?? process.env) };
    if (opts.abxHome) env.ABX_HOME = opts.abxHome;
    const abxPath = opts.abxPath || env.ABX_BIN || 'abx';
    const host = opts.host || (opts.mode === undefined || opts.mode === 'ssh' ? env.ABX_HOST : undefined) || undefined;
    let mode: ConnectionMode = host ? 'ssh' : opts.mode ?? 'daemon';
    if (mode === 'ssh' && !host) mode = 'daemon';
    let client: BrokerClient;
    if (mode === 'ssh') {
      const target = parseHost(host!);
      const remoteBin = opts.remoteBin || env.ABX_REMOTE_BIN || 'abx';
      const ssh = opts.sshPath || env.ABX_SSH || 'ssh';
      const args = sshArgs(target, remoteBin, opts.sshOptions, env.ABX_SSH_CONFIG || undefined);
      const label = `${ssh} ${args.join(' ')}`;
      const link = openProcess(ssh, args, env, label);
      client = new BrokerClient(opts, mode, env, link, target);
      try {
        await client.handshake(opts.clientInfo ?? { name: 'abx-sdk', version: '0.1.0' });
      } catch (err) {
        const exit = await client.exitCode(3000);
        client.dispose();
        if (exit !== undefined && err instanceof AbxError && err.abx === 'E1007') {
          throw sshFailure(label, target, remoteBin, exit, client.stderrTail.join('\n'));
        }
        if ((err as AbxError)?.abx === 'E1007' && /ENOENT/.test((err as Error).message)) {
          throw new AbxError('E1007', `The abx broker is not reachable: the ssh binary '${ssh}' was not found.`, {
            suggestion: 'Install an ssh client (openssh-client), or set ABX_SSH to one.',
          });
        }
        throw err;
      }
      return client;
    }
    if (mode === 'socket') {
      const link = await openSocket({ socket: opts.socket, abxPath, env, autoStart: opts.autoStart });
      client = new BrokerClient(opts, mode, env, link);
    } else {
      const version = await checkAbxBinary(abxPath, env);
      const args = mode === 'stdio' ? ['broker', '--stdio'] : ['rpc'];
      const link = openProcess(abxPath, args, env, `abx ${args.join(' ')}`);
      client = new BrokerClient(opts, mode, env, link);
      client.binaryVersion = version;
    }
    try {
      await client.handshake(opts.clientInfo ?? { name: 'abx-sdk', version: '0.1.0' });
    } catch (err) {
      client.dispose();
      throw err;
    }
    return client;
  }

  /** The exit code of the process once it exits (within `ms`), undefined when it runs on. */
  private exitCode(ms: number): Promise<number | undefined> {
    const child = this.child;
    if (!child) return Promise.resolve(undefined);
    if (child.exitCode !== null) return Promise.resolve(child.exitCode);
    return new Promise((resolve) => {
      const t = setTimeout(() => resolve(undefined), ms);
      t.unref();
      // 'close': stderr is read to its end, so the tail holds ssh's message.
      child.once('close', (code) => {
        clearTimeout(t);
        resolve(code ?? undefined);
      });
    });
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
      throw tooOld(this.abxPath, found, `the broker speaks '${init.protocolVersion}', this client '${PROTOCOL_VERSION}'`);
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
    this.conn.notify('initialized', {});
  }

  get isClosed(): boolean {
    return this.closed;
  }

  /** Process id of `abx rpc` (or `abx broker --stdio`, or ssh); undefined on the socket. */
  get pid(): number | undefined {
    return this.child?.pid;
  }

  /** Whether the abx (or ssh) process has exited; on the socket, whether it is closed. */
  get processExited(): boolean {
    const c = this.child;
    if (!c) return this.link.socket?.destroyed ?? true;
    return c.exitCode !== null || c.signalCode !== null;
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
    // Pending requests are rejected (ConnectionClosed -> E1007 in request()).
    this.conn.close(reason);
    this.link.socket?.destroy();
    try {
      this.closeEmitter.fire(reason);
    } catch (e) {
      this.log(`a close listener failed: ${(e as Error)?.message ?? e}`);
    }
  }

  /** Any broker method. Errors are AbxError with the E-code and suggestion. */
  async request<R>(method: string, params?: object, cancel?: Cancel): Promise<R> {
    if (this.closed) throw brokerGone(method, this.closeReason);
    // Cancelled before it was sent (an AbortSignal already aborted): nothing is sent, as
    // fetch does; a fast command would otherwise finish before the broker read the cancel.
    if (cancel && isCancelled(cancel)) throw cancelled(method);
    this.hold();
    try {
      return await this.conn.request<R>(method, params ?? {}, cancel);
    } catch (err) {
      if (err instanceof ConnectionClosed && isCancelled(cancel)) throw cancelled(method);
      const e = AbxError.from(err, method);
      const fromBroker = !(err instanceof ConnectionClosed) && typeof (err as { code?: unknown })?.code === 'number';
      if (!fromBroker) {
        // A transport failure (EPIPE, a closed stream): the process exit says why.
        await Promise.race([this.closedPromise, new Promise((r) => setTimeout(r, 2000).unref())]);
        if (this.closed) throw brokerGone(method, this.closeReason);
      }
      throw e;
    } finally {
      this.release();
    }
  }

  /** A notification to the broker. */
  async notify(method: string, params?: object): Promise<void> {
    if (this.closed) throw brokerGone(method, this.closeReason);
    if (!this.conn.notify(method, params ?? {})) throw brokerGone(method, this.closeReason);
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
        this.link.output.end();
      } catch {
        /* gone */
      }
    }
    this.markClosed(this.closeReason);
    // `abx rpc` waits for open exec streams after stdin closes: do not leave it behind.
    if (this.child && !this.processExited) {
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
    const child = this.child;
    const exited = new Promise<void>((resolve) => {
      if (!child || this.processExited) resolve();
      else child.once('exit', () => resolve());
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
      if (this.child && !this.processExited) this.child.kill(signal);
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

  providerDoctor(id: string, cancel?: Cancel): Promise<DoctorResult> {
    return this.request('provider/doctor', { id }, cancel);
  }

  providerInstall(params: InstallParams, cancel?: Cancel): Promise<InstallPlan> {
    return this.request('provider/install', params, cancel);
  }

  providerSetDefault(id: string): Promise<object> {
    return this.request('provider/setDefault', { id });
  }

  /** The contract kit; `onResult` gets each test as it finishes (`provider/testResult`). */
  async providerTest(
    id: string,
    opts: { filter?: string; onResult?: (n: TestResultNote) => void } = {},
    cancel?: Cancel,
  ): Promise<TestResult> {
    const l = (n: TestResultNote) => {
      if (n.id === id) opts.onResult?.(n);
    };
    this.testResults.add(l);
    try {
      const params: Record<string, unknown> = { id };
      if (opts.filter) params.filter = opts.filter;
      return await this.request<TestResult>('provider/test', params, cancel);
    } finally {
      this.testResults.delete(l);
    }
  }

  templatesList(provider?: string): Promise<unknown> {
    return this.request('templates/list', provider ? { provider } : {});
  }

  // ---- sandboxes ----

  sandboxCreate(params: CreateParams = {}, cancel?: Cancel): Promise<Sandbox> {
    return this.request('sandbox/create', dropEmpty(params), cancel);
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
  execRun(params: ExecParams, cancel?: Cancel): Promise<ExecResult> {
    return this.request('exec/run', dropEmpty(params), cancel);
  }

  /**
   * Starts a streamed exec (`pty` for a terminal). Output and the exit come through the
   * session (and `handlers`, attached before any output is delivered).
   */
  async execStart(params: ExecStartParams, handlers: ExecHandlers = {}, cancel?: Cancel): Promise<ExecSession> {
    const started = await this.request<ExecStarted>('exec/start', dropEmpty(params), cancel);
    const early = this.earlyExec.get(started.execId) ?? [];
    this.earlyExec.delete(started.execId);
    const session = new ExecSession(this, started.execId, started.pid, handlers, early);
    if (early.some((n) => n.kind === 'exit')) {
      // Its stream is over already: nothing more will come for it.
    } else {
      this.execs.set(started.execId, session);
      // A stream in progress keeps the process alive until its exit (or the connection's end).
      this.hold();
      session.exited.then(
        () => this.release(),
        () => this.release(),
      );
    }
    return session;
  }

  /**
   * `exec/attach`: this connection receives the exec's stream from now on, starting with
   * what was buffered while no one listened (the exit included). A session of this
   * connection for the same exec stops receiving (the new one gets everything).
   */
  async execAttach(execId: string, handlers: ExecHandlers = {}): Promise<ExecSession> {
    const r = await this.request<{ execId: string; running?: boolean; replayed?: number; droppedBytes?: number }>('exec/attach', { execId });
    const early = this.earlyExec.get(execId) ?? [];
    this.earlyExec.delete(execId);
    const session = new ExecSession(this, execId, null, handlers, early);
    const old = this.execs.get(execId);
    if (old) {
      // It will hear nothing more: its hold on the process ends now.
      this.execs.delete(execId);
      old.dispose();
      this.release();
    }
    if (!early.some((n) => n.kind === 'exit')) {
      this.execs.set(execId, session);
      this.hold();
      session.exited.then(
        () => this.release(),
        () => this.release(),
      );
    }
    session.attachInfo = { running: r.running ?? true, replayed: r.replayed ?? 0, droppedBytes: r.droppedBytes ?? 0 };
    return session;
  }

  /**
   * `exec/kill` (KILL) for each exec, from a process that is exiting (`process.on('exit')`:
   * no event loop any more): the requests are written, then this blocks, reading the replies
   * straight from the connection, until the broker answered them all or `waitMs` passed. The
   * broker cancels what a client that went away had in flight, so the process must not be
   * gone before the kills ran.
   */
  killExecsSync(execIds: string[], waitMs = 1000): void {
    if (this.closed || execIds.length === 0) return;
    const first = this.conn.peekNextId;
    for (const execId of execIds) this.conn.request('exec/kill', { execId }).catch(() => undefined);
    const want = new Set<number>();
    for (let id = first; id < this.conn.peekNextId; id++) want.add(id);
    const fd = (this.link.input as unknown as { _handle?: { fd?: number } })._handle?.fd;
    const nap = (ms: number) => Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
    if (typeof fd !== 'number' || fd < 0) {
      nap(Math.min(waitMs, 300));
      return;
    }
    const buf = Buffer.alloc(64 * 1024);
    const end = Date.now() + waitMs;
    let tail = '';
    while (want.size > 0 && Date.now() < end) {
      let n: number;
      try {
        n = fs.readSync(fd, buf, 0, buf.length, null);
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code === 'EAGAIN') {
          nap(5);
          continue;
        }
        return;
      }
      if (n === 0) return;
      const text = tail + buf.toString('utf8', 0, n);
      for (const m of text.matchAll(/"id"\s*:\s*(\d+)/g)) want.delete(Number(m[1]));
      tail = text.slice(-32);
    }
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
  async filesReadAll(sandbox: string, path: string, cancel?: Cancel): Promise<Buffer> {
    const parts: Buffer[] = [];
    let offset = 0;
    for (;;) {
      const c = await this.request<FileChunk>(
        'files/read',
        { sandbox, path, offset, length: READ_CHUNK, encoding: 'base64' },
        cancel,
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
    cancel?: Cancel,
  ): Promise<TransferResult> {
    return this.transfer('files/upload', sandbox, localPath, path, onProgress, cancel);
  }

  /** The broker streams a sandbox file out to LOCAL (same user). */
  filesDownload(
    sandbox: string,
    path: string,
    localPath: string,
    onProgress?: (p: FilesProgress) => void,
    cancel?: Cancel,
  ): Promise<TransferResult> {
    return this.transfer('files/download', sandbox, localPath, path, onProgress, cancel);
  }

  private async transfer(
    method: string,
    sandbox: string,
    localPath: string,
    path: string,
    onProgress?: (p: FilesProgress) => void,
    cancel?: Cancel,
  ): Promise<TransferResult> {
    const l = (p: FilesProgress) => {
      if (p.path === path && (p.sandbox === sandbox || sandbox.endsWith(`:${p.sandbox}`))) onProgress?.(p);
    };
    if (onProgress) this.progress.add(l);
    try {
      return await this.request<TransferResult>(method, { sandbox, localPath, path }, cancel);
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
    this.hold();
    const early = this.earlyWatch.get(watchId) ?? [];
    this.earlyWatch.delete(watchId);
    for (const c of early) listener(c);
    return {
      watchId,
      dispose: () => {
        if (!this.watches.delete(watchId)) return;
        this.release();
        if (!this.closed) this.request('files/unwatch', { watchId }).catch(() => undefined);
      },
    };
  }

  // ---- ports ----

  portsUrl(sandbox: string, port: number): Promise<PortUrl> {
    return this.request('ports/url', { sandbox, port });
  }

  // ---- the rest of the catalogue (the Sandbox API uses these) ----

  /** `sandbox/list` with its `errors` (providers that could not answer). */
  sandboxListAll(provider?: string): Promise<SandboxListResult> {
    return this.request('sandbox/list', provider ? { provider } : {});
  }

  /** `sandbox/connect`: the sandbox, its lifetime untouched. */
  sandboxConnect(sandbox: string): Promise<Sandbox> {
    return this.request('sandbox/connect', { sandbox });
  }

  processKill(sandbox: string, pid: number, signal?: string): Promise<object> {
    return this.request('process/kill', signal ? { sandbox, pid, signal } : { sandbox, pid });
  }

  /** `code/run` (E8004 where the provider does not declare code.interpret). */
  codeRun(params: CodeRunParams, cancel?: Cancel): Promise<CodeRunResult> {
    return this.request('code/run', dropEmpty(params), cancel);
  }

  providerUninstall(id: string, confirm = true): Promise<object> {
    return this.request('provider/uninstall', { id, confirm });
  }

  providerConfigure(id: string, values: Record<string, unknown>): Promise<{ configured: string[] }> {
    return this.request('provider/configure', { id, values });
  }

  brokerShutdown(ifIdle = false): Promise<object> {
    return this.request('broker/shutdown', ifIdle ? { ifIdle } : {});
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
