//! The Sandbox API (the Python SDK's surface, in TypeScript): `Sandbox.create/connect/list`,
//! exec (whole, streamed, pty), files, processes, ports, lifetime, `runCode`, and `Providers`
//! (list, info, install with the CLI's confirmation and pinning rules, doctor, test). Every
//! call is one broker method (docs/broker-api.md) on a BrokerClient.

import * as fs from 'node:fs';
import * as path from 'node:path';
import { BrokerClient, BrokerOptions } from './broker.js';
import { randomUUID } from 'node:crypto';
import { ConfirmationRequiredError, FileNotFoundError, InvalidParamsError, SandboxNotFoundError } from './errors.js';
import type { ExecSession } from './exec.js';
import type { Cancel, Disposable } from './jsonrpc.js';
import type {
  ApplyResult,
  Capabilities,
  Change,
  CodeRunParams,
  CodeRunResult,
  CreateParams,
  DoctorResult,
  FileEntry,
  FilesChanged,
  FilesProgress,
  InstallPlan,
  LogResult,
  MountSpec,
  NetworkPolicy,
  PortUrl,
  ProcessEntry,
  ProviderInfo,
  ProviderSummary,
  Sandbox as SandboxInfo,
  SandboxListResult,
  SystemInfo,
  TestResult,
  TestResultNote,
  TransferResult,
} from './types.js';

/** How the Sandbox API reaches the broker: a client of your own, or options for one. */
export interface ClientOptions extends Omit<BrokerOptions, 'env'> {
  /** Use this connection (not closed by `sb.close()`). */
  client?: BrokerClient;
  /** Environment of the abx / ssh process, where ABX_HOME, ABX_HOST, ... are read (default: this process's). */
  processEnv?: NodeJS.ProcessEnv;
}

const shared = new Map<string, Promise<BrokerClient>>();

/**
 * The connection the Sandbox API uses: `opts.client`, else one shared connection per set of
 * options (mode `socket` unless told otherwise, or ssh with `host` / ABX_HOST). It does not
 * keep the process alive while nothing is in flight.
 */
export async function getClient(opts: ClientOptions = {}): Promise<BrokerClient> {
  if (opts.client) return opts.client;
  const { client: _c, log: _l, trace, processEnv, ...rest } = opts;
  const o = { ...rest, env: processEnv ?? process.env } as BrokerOptions;
  const key = JSON.stringify([rest, o.env]) + (trace ? `#${shared.size}` : '');
  let p = shared.get(key);
  if (p) {
    const c = await p.catch(() => undefined);
    if (c && !c.isClosed) return c;
  }
  // Only the connection options: a CreateOptions' sandbox env must not become the process's.
  const pick: BrokerOptions = {
    mode: rest.mode ?? 'socket',
    abxPath: rest.abxPath,
    host: rest.host,
    remoteBin: rest.remoteBin,
    sshPath: rest.sshPath,
    sshOptions: rest.sshOptions,
    socket: rest.socket,
    autoStart: rest.autoStart,
    abxHome: rest.abxHome,
    clientInfo: rest.clientInfo,
    env: o.env,
    log: opts.log,
    trace,
    unrefWhenIdle: rest.unrefWhenIdle ?? true,
    framing: rest.framing,
  };
  p = BrokerClient.connect(pick);
  shared.set(key, p);
  p.catch(() => shared.delete(key));
  return p;
}

/** Closes the shared connections (the ones the Sandbox API opened by itself). */
export async function closeAll(): Promise<void> {
  const all = [...shared.values()];
  shared.clear();
  await Promise.all(all.map((p) => p.then((c) => c.close()).catch(() => undefined)));
}

export interface CreateOptions extends ClientOptions, Omit<CreateParams, 'mounts'> {
  /** Host directories: `{source, target?, mode?}` or `'SRC[:TARGET][:MODE]'`. */
  mounts?: (MountSpec | string)[];
  /** Cancels the create (`$/cancelRequest`). */
  signal?: AbortSignal;
}

export interface ExecOptions {
  env?: Record<string, string>;
  cwd?: string;
  /** Seconds; the broker kills the whole tree and says `timedOut`. */
  timeout?: number;
  /** Given to the command's stdin (text, or bytes sent as base64). */
  stdin?: string | Uint8Array;
  /** Kills the command (`$/cancelRequest`; rejects with CancelledError, E1006). */
  signal?: AbortSignal;
}

export interface ExecStreamOptions extends Omit<ExecOptions, 'signal'> {
  /** A pseudo-terminal of this size (the provider must declare `pty`). */
  pty?: { cols: number; rows: number };
  /** Called for each chunk, besides the async iterator. */
  onOutput?: (chunk: { stream: string; bytes: Buffer; text: string }) => void;
  /** Kills the command when it aborts. */
  signal?: AbortSignal;
  /**
   * Leave the command running when this process is interrupted or exits (default: it is
   * killed then, and at the end of an `await using` block); `attach(execId)` picks it up.
   */
  keepOnExit?: boolean;
}

/** `sb.exec()`'s result: text and the exact bytes. */
export interface ExecOutput {
  exitCode: number | null;
  /** UTF-8 text (invalid sequences replaced); `stdoutBytes` has the exact bytes. */
  stdout: string;
  stderr: string;
  stdoutBytes: Buffer;
  stderrBytes: Buffer;
  timedOut: boolean;
  durationMs: number;
  truncated: boolean;
  signal?: string | null;
  oomKilled?: boolean;
}

const CLIENT_KEYS = ['client', 'processEnv', 'mode', 'abxPath', 'host', 'remoteBin', 'sshPath', 'sshOptions', 'socket', 'autoStart', 'abxHome', 'clientInfo', 'log', 'trace', 'unrefWhenIdle', 'framing'];
const CREATE_KEYS = ['provider', 'template', 'timeout', 'timeoutMs', 'env', 'metadata', 'network', 'limits', 'mounts', 'signal'];

/** An option `Sandbox.create` does not know is refused (E1004), never ignored. */
function checkCreateOptions(opts: object): void {
  const o = opts as Record<string, unknown>;
  for (const k of Object.keys(o)) {
    if (o[k] === undefined || CLIENT_KEYS.includes(k) || CREATE_KEYS.includes(k)) continue;
    const hint: Record<string, string> = { envs: 'env', timeoutSeconds: 'timeout', image: 'template' };
    throw new InvalidParamsError('E1004', `Sandbox.create: unknown option '${k}'.`, {
      suggestion: hint[k] ? `Use '${hint[k]}'.` : `Known options: ${CREATE_KEYS.join(', ')} (and the connection's: ${CLIENT_KEYS.join(', ')}).`,
      method: 'sandbox/create',
    });
  }
  if (o.timeout !== undefined && o.timeoutMs !== undefined) {
    throw new InvalidParamsError('E1004', 'Sandbox.create: give timeout (seconds) or timeoutMs, not both.', { method: 'sandbox/create' });
  }
}

/** A `code/output` notification: one piece of a run's output, as it comes. */
export interface CodeOutput {
  sandbox: string;
  context: string;
  runId?: string;
  /** `stdout`, `stderr`, `result`, `error` or `restarted`. */
  type: string;
  text?: string;
  result?: Record<string, unknown>;
  error?: { name?: string; value?: string; traceback?: string };
}

/** A code context (`code/createContext`). */
export interface CodeContext {
  id: string;
  sandbox: string;
  language: string;
  cwd: string;
  default: boolean;
  executionCount: number;
  running: boolean;
  restarts: number;
  queued: number;
}

function dropUndefined<T extends object>(o: T): Partial<T> {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as Partial<T>;
}

function stdinParams(stdin: string | Uint8Array | undefined): Record<string, unknown> {
  if (stdin === undefined) return {};
  if (typeof stdin === 'string') return { stdin };
  return { stdin: Buffer.from(stdin).toString('base64'), stdinEncoding: 'base64' };
}

function command(cmd: string | string[]): Record<string, unknown> {
  return Array.isArray(cmd) ? { argv: cmd } : { command: cmd };
}

export class Sandbox {
  /** `provider:id`: routes to this sandbox from any client. */
  readonly id: string;
  /** The provider's own id of the sandbox. */
  readonly sandboxId: string;
  readonly provider: string;
  readonly client: BrokerClient;
  /** What the broker said last (`refresh()` asks again). */
  data: SandboxInfo;
  readonly files: Files;
  readonly processes: Processes;
  readonly ports: Ports;
  private readonly owned: boolean;

  private constructor(client: BrokerClient, info: SandboxInfo, owned: boolean) {
    this.client = client;
    this.data = info;
    this.provider = info.provider;
    this.sandboxId = info.id;
    this.id = info.id.startsWith(`${info.provider}:`) ? info.id : `${info.provider}:${info.id}`;
    this.owned = owned;
    this.files = new Files(this);
    this.processes = new Processes(this);
    this.ports = new Ports(this);
  }

  /**
   * `sandbox/create`: provider, template, timeout (s), env, network, limits, metadata, and
   * mounts (host directories: `{source, target?, mode?}`, or `'SRC[:TARGET][:MODE]'`, a
   * relative SRC taken from the current directory).
   */
  static async create(opts: CreateOptions & { timeoutMs?: number } = {}): Promise<Sandbox> {
    checkCreateOptions(opts);
    const client = await getClient(opts);
    const { provider, template, env, metadata, network, limits } = opts;
    // `timeoutMs` (E2B's name) is honoured: whole seconds, rounded up.
    const timeout = opts.timeoutMs !== undefined ? Math.max(1, Math.ceil(opts.timeoutMs / 1000)) : opts.timeout;
    const mounts = opts.mounts === undefined ? undefined : opts.mounts.map(toMount);
    const info = await client.sandboxCreate({ provider, template, timeout, env, metadata, network, limits, mounts }, opts.signal);
    return new Sandbox(client, info, false);
  }

  /** `sandbox/connect`: an existing sandbox (`id` or `provider:id`); its lifetime is untouched. */
  static async connect(id: string, opts: ClientOptions = {}): Promise<Sandbox> {
    const client = await getClient(opts);
    return new Sandbox(client, await client.sandboxConnect(id), false);
  }

  /** `sandbox/list`: every provider's sandboxes (or one provider's). */
  static async list(opts: ClientOptions & { provider?: string } = {}): Promise<SandboxInfo[]> {
    const client = await getClient(opts);
    return (await client.sandboxListAll(opts.provider)).sandboxes;
  }

  /** `sandbox/list` with the providers that could not answer. */
  static async listAll(opts: ClientOptions & { provider?: string } = {}): Promise<SandboxListResult> {
    return (await getClient(opts)).sandboxListAll(opts.provider);
  }

  /** A Sandbox object for a client and a Sandbox record (no call). */
  static from(client: BrokerClient, info: SandboxInfo): Sandbox {
    return new Sandbox(client, info, false);
  }

  get status(): string {
    return this.data.status;
  }

  /** `sandbox/info`, kept in `data`. */
  async info(): Promise<SandboxInfo> {
    this.data = await this.client.sandboxInfo(this.id);
    return this.data;
  }

  /** Same as info(), returning the Sandbox. */
  async refresh(): Promise<this> {
    await this.info();
    return this;
  }

  /** Runs a command (`sh -c` string, or argv) to completion: `exec/run`. */
  async exec(cmd: string | string[], opts: ExecOptions = {}): Promise<ExecOutput> {
    const r = await this.client.execRun(
      { sandbox: this.id, ...command(cmd), env: opts.env, cwd: opts.cwd, timeout: opts.timeout, ...stdinParams(opts.stdin) } as never,
      opts.signal,
    );
    const enc = r.encoding === 'base64' ? 'base64' : 'utf8';
    const stdoutBytes = Buffer.from(r.stdout, enc);
    const stderrBytes = Buffer.from(r.stderr, enc);
    return {
      exitCode: r.exitCode,
      stdout: enc === 'utf8' ? r.stdout : stdoutBytes.toString('utf8'),
      stderr: enc === 'utf8' ? r.stderr : stderrBytes.toString('utf8'),
      stdoutBytes,
      stderrBytes,
      timedOut: r.timedOut,
      durationMs: r.durationMs,
      truncated: r.truncated ?? false,
      signal: r.signal,
      oomKilled: r.oomKilled,
    };
  }

  /**
   * Starts a streamed command (`exec/start`). The session is an async iterator of output
   * chunks ending with one `exit` event; `write()` / `closeStdin()` feed stdin, `kill()`
   * signals the tree, `exited` resolves with the exit.
   */
  async execStream(cmd: string | string[], opts: ExecStreamOptions = {}): Promise<ExecSession> {
    const s = await this.client.execStart(
      {
        sandbox: this.id,
        ...command(cmd),
        env: opts.env,
        cwd: opts.cwd,
        timeout: opts.timeout,
        pty: opts.pty,
        ...stdinParams(opts.stdin),
      } as never,
      { onOutput: opts.onOutput },
    );
    s.startQueue();
    if (opts.keepOnExit) s.keepOnExit();
    else s.guard();
    const signal = opts.signal;
    if (signal) {
      const kill = () => void s.kill().catch(() => undefined);
      if (signal.aborted) kill();
      else {
        signal.addEventListener('abort', kill, { once: true });
        s.exited.finally(() => signal.removeEventListener('abort', kill)).catch(() => undefined);
      }
    }
    return s;
  }

  /**
   * `exec/attach`: a streamed command started elsewhere (another connection, a process that
   * ended with `keepOnExit`): its output from now on, after what was buffered while no one
   * listened (up to 1 MiB), then its exit. Only this process may then write to or kill it.
   */
  async attach(execId: string, opts: { onOutput?: ExecStreamOptions['onOutput']; keepOnExit?: boolean } = {}): Promise<ExecSession> {
    const s = await this.client.execAttach(execId, { onOutput: opts.onOutput });
    s.startQueue();
    if (opts.keepOnExit) s.keepOnExit();
    else s.guard();
    return s;
  }

  /** A shell (or `command`) on a pseudo-terminal: execStream with `pty`. */
  pty(opts: { cols?: number; rows?: number; command?: string; env?: Record<string, string>; cwd?: string } = {}): Promise<ExecSession> {
    return this.execStream(opts.command ?? 'sh -i', {
      pty: { cols: opts.cols ?? 80, rows: opts.rows ?? 24 },
      env: opts.env,
      cwd: opts.cwd,
    });
  }

  /** `sandbox/setTimeout`: the lifetime ends `seconds` from now. */
  async setTimeout(seconds: number): Promise<SandboxInfo> {
    this.data = await this.client.sandboxSetTimeout(this.id, seconds);
    return this.data;
  }

  async pause(): Promise<SandboxInfo> {
    this.data = await this.client.sandboxPause(this.id);
    return this.data;
  }

  async resume(): Promise<SandboxInfo> {
    this.data = await this.client.sandboxResume(this.id);
    return this.data;
  }

  /** `sandbox/kill` (idempotent): true when this call killed it. */
  async kill(): Promise<boolean> {
    return (await this.client.sandboxKill(this.id)).killed;
  }

  /**
   * `code/run` (language default `python`): FeatureNotSupportedError (E8004) where the
   * provider does not declare code.interpret.
   */
  async runCode(
    code: string,
    opts: {
      language?: string;
      context?: string;
      timeout?: number;
      env?: Record<string, string>;
      signal?: AbortSignal;
      /** Each `code/output` of this run as it comes (stdout, stderr, result, error, restarted). */
      onOutput?: (out: CodeOutput) => void;
    } = {},
  ): Promise<CodeRunResult> {
    // With a context, its own language (sending another one is E1004).
    const p: CodeRunParams & { runId?: string } = { sandbox: this.id, code } as CodeRunParams;
    if (opts.language !== undefined || opts.context === undefined) p.language = opts.language ?? 'python';
    if (opts.context !== undefined) p.context = opts.context;
    if (opts.timeout !== undefined) p.timeout = opts.timeout;
    if (opts.env !== undefined) p.env = opts.env;
    const onOutput = opts.onOutput;
    if (!onOutput) return this.client.codeRun(p, opts.signal);
    const runId = randomUUID();
    p.runId = runId;
    const sub = this.client.onNotification(({ method, params }) => {
      const n = params as CodeOutput;
      if (method === 'code/output' && n?.runId === runId) onOutput(n);
    });
    try {
      return await this.client.codeRun(p, opts.signal);
    } finally {
      sub.dispose();
    }
  }

  /** `code/createContext`: a long-lived interpreter (variables persist from cell to cell). */
  createCodeContext(opts: { language?: string; cwd?: string; interpreter?: string; env?: Record<string, string> } = {}): Promise<CodeContext> {
    return this.client.request('code/createContext', { sandbox: this.id, ...dropUndefined(opts) });
  }

  /** `code/listContexts`, oldest first. */
  async listCodeContexts(): Promise<CodeContext[]> {
    return (await this.client.request<{ contexts: CodeContext[] }>('code/listContexts', { sandbox: this.id })).contexts;
  }

  /** `code/restartContext`: a fresh interpreter (its state lost). */
  restartCodeContext(context: string): Promise<CodeContext> {
    return this.client.request('code/restartContext', { sandbox: this.id, context });
  }

  /** `code/removeContext`: the interpreter ends. */
  async removeCodeContext(context: string): Promise<void> {
    await this.client.request('code/removeContext', { sandbox: this.id, context });
  }

  /** `sandbox/info`: whether it is running (paused or gone: false). */
  async isRunning(): Promise<boolean> {
    try {
      return (await this.info()).status === 'running';
    } catch (e) {
      if (e instanceof SandboxNotFoundError) return false;
      throw e;
    }
  }

  /** `commands/run`: a named command of the provider (E8004 where it has none). */
  runCommand(name: string, args?: unknown): Promise<Record<string, unknown>> {
    return this.client.request('commands/run', args === undefined ? { sandbox: this.id, name } : { sandbox: this.id, name, args });
  }

  capabilities(): Promise<Capabilities> {
    return this.client.sandboxCapabilities(this.id);
  }

  /** `sandbox/setNetwork`: a new egress policy; new connections follow it, open ones go on. */
  async setNetwork(network: NetworkPolicy): Promise<SandboxInfo> {
    this.data = await this.client.request<SandboxInfo>('sandbox/setNetwork', { sandbox: this.id, network });
    return this.data;
  }

  /** `sandbox/diff`: what the sandbox changed under its overlay mounts, against the host at create. */
  async diff(opts: { paths?: string[]; target?: string; patch?: boolean } = {}): Promise<Change[]> {
    const p: Record<string, unknown> = { sandbox: this.id };
    if (opts.paths !== undefined) p.paths = opts.paths;
    if (opts.target !== undefined) p.target = opts.target;
    if (opts.patch) p.format = 'patch';
    return (await this.client.request<{ changes: Change[] }>('sandbox/diff', p)).changes;
  }

  /**
   * `sandbox/apply`: write the sandbox's changes (all, or `paths`) to the host, each file
   * atomically. A path the host changed since create is a conflict unless `force`.
   */
  apply(opts: { paths?: string[]; target?: string; dryRun?: boolean; force?: boolean } = {}): Promise<ApplyResult> {
    const p: Record<string, unknown> = { sandbox: this.id };
    if (opts.paths !== undefined) p.paths = opts.paths;
    if (opts.target !== undefined) p.target = opts.target;
    if (opts.dryRun) p.dryRun = true;
    if (opts.force) p.force = true;
    return this.client.request('sandbox/apply', p);
  }

  /** `sandbox/discard`: drop the sandbox's changes (all, or `paths`). */
  async discard(opts: { paths?: string[]; target?: string } = {}): Promise<string[]> {
    const p: Record<string, unknown> = { sandbox: this.id };
    if (opts.paths !== undefined) p.paths = opts.paths;
    if (opts.target !== undefined) p.target = opts.target;
    return (await this.client.request<{ discarded: string[] }>('sandbox/discard', p)).discarded;
  }

  /** `sandbox/log`: every command run in the sandbox, with the client that asked. */
  log(opts: { since?: number; limit?: number } = {}): Promise<LogResult> {
    const p: Record<string, unknown> = { sandbox: this.id };
    if (opts.since !== undefined) p.since = opts.since;
    if (opts.limit !== undefined) p.limit = opts.limit;
    return this.client.request('sandbox/log', p);
  }

  systemInfo(): Promise<SystemInfo> {
    return this.client.sandboxSystemInfo(this.id);
  }

  /** Closes the connection when this Sandbox opened it itself (never the shared one). */
  async close(): Promise<void> {
    if (this.owned) await this.client.close();
  }
}

export class Files {
  constructor(private readonly sb: Sandbox) {}

  private get c(): BrokerClient {
    return this.sb.client;
  }

  /** The whole file as bytes (`encoding: 'bytes'`, the default) or UTF-8 text. */
  read(p: string, opts?: { encoding?: 'bytes'; signal?: AbortSignal }): Promise<Buffer>;
  read(p: string, opts: { encoding: 'utf8' | 'text'; signal?: AbortSignal }): Promise<string>;
  async read(p: string, opts: { encoding?: 'bytes' | 'utf8' | 'text'; signal?: AbortSignal } = {}): Promise<Buffer | string> {
    const b = await this.c.filesReadAll(this.sb.id, p, opts.signal);
    return opts.encoding === 'utf8' || opts.encoding === 'text' ? b.toString('utf8') : b;
  }

  /**
   * Writes a whole file (atomic); text is UTF-8. Resolves with its size. Missing parent
   * directories are made (as MCP's `files_write` does) unless `parents: false`.
   */
  async write(p: string, data: string | Uint8Array, opts: { mode?: number; parents?: boolean } = {}): Promise<number> {
    const bytes = typeof data === 'string' ? Buffer.from(data, 'utf8') : data;
    try {
      return await this.c.filesWriteAll(this.sb.id, p, bytes, opts.mode);
    } catch (err) {
      const slash = p.lastIndexOf('/');
      if (!(err instanceof FileNotFoundError) || opts.parents === false || slash <= 0) throw err;
      await this.c.filesMkdir(this.sb.id, p.slice(0, slash), true);
      return this.c.filesWriteAll(this.sb.id, p, bytes, opts.mode);
    }
  }

  list(p = '/workspace', opts: { recursive?: boolean } = {}): Promise<FileEntry[]> {
    return this.c.filesList(this.sb.id, p, opts.recursive ?? false);
  }

  stat(p: string): Promise<FileEntry> {
    return this.c.filesStat(this.sb.id, p);
  }

  /** False for E4001 (not found); other errors are thrown. */
  async exists(p: string): Promise<boolean> {
    try {
      await this.stat(p);
      return true;
    } catch (e) {
      if (e instanceof FileNotFoundError) return false;
      throw e;
    }
  }

  async mkdir(p: string, opts: { parents?: boolean } = {}): Promise<void> {
    await this.c.filesMkdir(this.sb.id, p, opts.parents ?? false);
  }

  async remove(p: string, opts: { recursive?: boolean } = {}): Promise<void> {
    await this.c.filesRemove(this.sb.id, p, opts.recursive ?? false);
  }

  async rename(from: string, to: string): Promise<void> {
    await this.c.filesRename(this.sb.id, from, to);
  }

  /** The broker copies a local file (this machine's, same user) into the sandbox. */
  upload(localPath: string, p: string, opts: { onProgress?: (p: FilesProgress) => void; signal?: AbortSignal } = {}): Promise<TransferResult> {
    return this.c.filesUpload(this.sb.id, path.resolve(localPath), p, opts.onProgress, opts.signal);
  }

  /** The broker copies a sandbox file out to a local path. */
  download(p: string, localPath: string, opts: { onProgress?: (p: FilesProgress) => void; signal?: AbortSignal } = {}): Promise<TransferResult> {
    return this.c.filesDownload(this.sb.id, p, path.resolve(localPath), opts.onProgress, opts.signal);
  }

  /**
   * `files/watch`: `listener` gets each change (if given); the handle is also an async
   * iterator of changes. `dispose()` / `close()` unwatches.
   */
  async watch(p: string, opts: { recursive?: boolean } = {}, listener?: (c: FilesChanged) => void): Promise<Watch> {
    const w = new Watch(listener);
    w.handle = await this.c.filesWatch(this.sb.id, p, opts.recursive ?? false, (c) => w.push(c));
    return w;
  }
}

/** A `files/watch`: changes as an async iterator (and a listener). */
export class Watch implements Disposable, AsyncIterable<FilesChanged> {
  /** @internal */
  handle: (Disposable & { watchId: string }) | undefined;
  private readonly queue: FilesChanged[] = [];
  private wake: (() => void) | undefined;
  private done = false;

  constructor(private readonly listener?: (c: FilesChanged) => void) {}

  get watchId(): string {
    return this.handle?.watchId ?? '';
  }

  /** @internal */
  push(c: FilesChanged): void {
    this.listener?.(c);
    this.queue.push(c);
    if (this.queue.length > 10_000) this.queue.shift();
    const w = this.wake;
    this.wake = undefined;
    w?.();
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<FilesChanged, void, undefined> {
    for (;;) {
      const c = this.queue.shift();
      if (c) {
        yield c;
        continue;
      }
      if (this.done) return;
      await new Promise<void>((r) => (this.wake = r));
    }
  }

  dispose(): void {
    this.done = true;
    this.handle?.dispose();
    const w = this.wake;
    this.wake = undefined;
    w?.();
  }

  close(): void {
    this.dispose();
  }
}

export class Processes {
  constructor(private readonly sb: Sandbox) {}

  list(): Promise<ProcessEntry[]> {
    return this.sb.client.processList(this.sb.id);
  }

  async kill(pid: number, signal?: string): Promise<void> {
    await this.sb.client.processKill(this.sb.id, pid, signal);
  }
}

export class Ports {
  constructor(private readonly sb: Sandbox) {}

  /** `ports/url`: the URL (and headers) that reach `port` of the sandbox. */
  url(port: number): Promise<PortUrl> {
    return this.sb.client.portsUrl(this.sb.id, port);
  }
}

export interface InstallOptions extends ClientOptions {
  subdir?: string;
  /** A git ref (a commit pins the provider). */
  ref?: string;
  /** The archive's sha256 (pins an archive). */
  sha256?: string;
  /** Accept a source that is not pinned (a branch, a tag): the CLI's --allow-unpinned. */
  allowUnpinned?: boolean;
  /** Accept http:// or file:// transport: the CLI's --allow-insecure-transport. */
  allowInsecureTransport?: boolean;
  /** Replace an installed provider of the same id. */
  replace?: boolean;
  /**
   * The CLI's confirmation: `true` is --yes; a function is shown the plan (a dry run) and
   * installs only when it answers true (else ConfirmationRequiredError, E8012, nothing
   * installed). Absent: the broker refuses (E8012, with the command to re-run).
   */
  confirm?: boolean | ((plan: InstallPlan) => boolean | Promise<boolean>);
  /** Only the plan (resolved commit, digest, manifest, declared security): nothing is written. */
  dryRun?: boolean;
  signal?: AbortSignal;
}

/** A local directory is sent as an absolute path (the daemon has its own cwd), like the CLI. */
function installSource(source: string): string {
  if (source.includes('://')) return source;
  try {
    return fs.realpathSync(source);
  } catch {
    return source;
  }
}

/** Providers: list, info, install (with the CLI's confirmation and pinning rules), doctor, test. */
export const Providers = {
  async list(opts: ClientOptions = {}): Promise<ProviderSummary[]> {
    return (await getClient(opts)).providerList();
  },

  async info(id: string, opts: ClientOptions = {}): Promise<ProviderInfo> {
    return (await getClient(opts)).providerInfo(id);
  },

  async install(source: string, opts: InstallOptions = {}): Promise<InstallPlan> {
    const c = await getClient(opts);
    const params = {
      source: installSource(source),
      subdir: opts.subdir,
      ref: opts.ref,
      sha256: opts.sha256,
      allowUnpinned: opts.allowUnpinned,
      allowInsecureTransport: opts.allowInsecureTransport,
      replace: opts.replace,
    };
    const clean = Object.fromEntries(Object.entries(params).filter(([, v]) => v !== undefined && v !== false)) as typeof params;
    if (opts.dryRun) return c.providerInstall({ ...clean, dryRun: true }, opts.signal);
    let confirm = opts.confirm === true;
    if (typeof opts.confirm === 'function') {
      // Review first: the plan; refusals (pinning, transport) come now.
      const plan = await c.providerInstall({ ...clean, dryRun: true }, opts.signal);
      if (!(await opts.confirm(plan))) {
        throw new ConfirmationRequiredError('E8012', 'Aborted: nothing was installed.', {
          suggestion: 'Confirm the plan (return true), or pass confirm: true after reviewing.',
          method: 'provider/install',
        });
      }
      confirm = true;
    }
    return c.providerInstall(confirm ? { ...clean, confirm: true } : clean, opts.signal);
  },

  async uninstall(id: string, opts: ClientOptions = {}): Promise<void> {
    await (await getClient(opts)).providerUninstall(id, true);
  },

  async doctor(id: string, opts: ClientOptions & { signal?: AbortSignal } = {}): Promise<DoctorResult> {
    return (await getClient(opts)).providerDoctor(id, opts.signal);
  },

  /** The contract kit; `onResult` gets each test as it finishes. */
  async test(
    id: string,
    opts: ClientOptions & { filter?: string; onResult?: (n: TestResultNote) => void; signal?: AbortSignal } = {},
  ): Promise<TestResult> {
    return (await getClient(opts)).providerTest(id, { filter: opts.filter, onResult: opts.onResult }, opts.signal as Cancel);
  },

  async setDefault(id: string, opts: ClientOptions = {}): Promise<void> {
    await (await getClient(opts)).providerSetDefault(id);
  },
};

/** A `mounts` entry as the broker takes it (see `Sandbox.create`). */
export function toMount(m: MountSpec | string): MountSpec {
  if (typeof m !== 'string') {
    return m.source.startsWith('/') ? m : { ...m, source: resolvePath(m.source) };
  }
  const parts = m.split(':');
  let mode: MountSpec['mode'];
  const last = parts[parts.length - 1];
  if (parts.length > 1 && (last === 'ro' || last === 'rw' || last === 'overlay')) {
    mode = last;
    parts.pop();
  }
  const out: MountSpec = { source: resolvePath(parts[0]) };
  const target = parts.slice(1).join(':');
  if (target) out.target = target;
  if (mode) out.mode = mode;
  return out;
}

function resolvePath(p: string): string {
  return path.resolve(p);
}
