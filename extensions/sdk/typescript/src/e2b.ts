//! `@abx/sdk/e2b`: E2B's JavaScript SDK surface (`Sandbox` of `e2b` 2.51.0, the version
//! `@e2b/code-interpreter` 2.8.0 depends on) over the abx broker, so code written for E2B runs
//! on `local` (or any provider) by changing its import. Every member maps to one or a few
//! broker calls; what has no counterpart throws `UnsupportedError` (a `SandboxError`) naming
//! the nearest abx call. The mapping is listed member by member in the SDK README.
//!
//! E2B's defaults on abx: its home `/home/user` is the sandbox's `/workspace` (paths and `cwd`
//! under `/home/user` and relative paths are sent as `/workspace/...`, and entries come back
//! under `/home/user`); its templates `base` and `code-interpreter-v1` are the provider's
//! default template; `user: 'user' | 'root'` both run as the sandbox's one user.

import type { BrokerClient } from './broker.js';
import {
  AbxError,
  CancelledError as AbxCancelledError,
  FileNotFoundError as AbxFileNotFoundError,
  InvalidParamsError,
  InvalidTimeoutError,
  SandboxNotFoundError as AbxSandboxNotFoundError,
  TemplateNotFoundError,
  ExecTimeoutError,
} from './errors.js';
import type { ExecSession, OutputChunk } from './exec.js';
import { getClient, Sandbox as AbxSandbox, type ClientOptions } from './sandbox.js';
import type { ExecExit, FileEntry, Sandbox as WireSandbox } from './types.js';

// ---------------------------------------------------------------- errors (E2B's names)

/** E2B's base error; `abx` holds the broker's error when there is one. */
export class SandboxError extends Error {
  statusCode?: number;
  /** The broker's error this one came from (E-code, suggestion), if any. */
  abx?: AbxError;
  constructor(message?: string) {
    super(message);
    this.name = new.target.name;
  }
}
export class TimeoutError extends SandboxError {
  constructor(message: string) {
    super(message);
  }
}
export class InvalidArgumentError extends SandboxError {
  constructor(message: string, stackTrace?: string) {
    super(message);
    if (stackTrace) this.stack = stackTrace;
  }
}
export class NotEnoughSpaceError extends SandboxError {
  constructor(message: string) {
    super(message);
  }
}
export class NotFoundError extends SandboxError {
  constructor(message: string) {
    super(message);
  }
}
export class FileNotFoundError extends NotFoundError {}
export class SandboxNotFoundError extends NotFoundError {}
export class AuthenticationError extends Error {
  constructor(message: string) {
    super(message);
    this.name = new.target.name;
  }
}
export class GitAuthError extends AuthenticationError {}
export class GitUpstreamError extends SandboxError {}
export class TemplateError extends SandboxError {}
export class RateLimitError extends SandboxError {}
export class ServiceBusyError extends Error {
  constructor(message?: string) {
    super(message);
    this.name = new.target.name;
  }
}
export class BuildError extends Error {
  constructor(message?: string) {
    super(message);
    this.name = new.target.name;
  }
}
export class FileUploadError extends BuildError {}
export class VolumeError extends Error {
  constructor(message?: string) {
    super(message);
    this.name = new.target.name;
  }
}
export class VolumeNotFoundError extends VolumeError {}
export class VolumePathNotFoundError extends VolumeError {}
export class SecretError extends Error {
  constructor(message?: string) {
    super(message);
    this.name = new.target.name;
  }
}
export class SecretNotFoundError extends SecretError {}

/**
 * An E2B member with no counterpart on the broker (not part of E2B): the message names the
 * nearest abx call (`nearest`).
 */
export class UnsupportedError extends SandboxError {
  readonly member: string;
  readonly nearest: string;
  constructor(member: string, nearest: string) {
    super(`${member} is not supported by abx; nearest: ${nearest}`);
    this.member = member;
    this.nearest = nearest;
  }
}

function unsupported(member: string, nearest: string): never {
  throw new UnsupportedError(member, nearest);
}

/** A broker error as the E2B error of the same meaning (the original kept in `.abx`). */
export function toE2BError(err: unknown): Error {
  if (!(err instanceof AbxError)) return err instanceof Error ? err : new SandboxError(String(err));
  const text = err.suggestion ? `${err.headline} ${err.suggestion}` : err.headline;
  let e: SandboxError;
  if (err instanceof AbxSandboxNotFoundError) e = new SandboxNotFoundError(text);
  else if (err instanceof AbxFileNotFoundError) e = new FileNotFoundError(text);
  else if (err instanceof ExecTimeoutError || err instanceof AbxCancelledError) e = new TimeoutError(text);
  else if (err instanceof TemplateNotFoundError) e = new TemplateError(text);
  else if (err instanceof InvalidParamsError || err instanceof InvalidTimeoutError) e = new InvalidArgumentError(text);
  else if (err.abx === 'E4012' || err.abx === 'E4013') e = new NotEnoughSpaceError(text);
  else if (/^E4/.test(err.abx) && /not found|no such/i.test(err.message)) e = new NotFoundError(text);
  else e = new SandboxError(text);
  e.abx = err;
  return e;
}

async function wrap<T>(p: Promise<T>): Promise<T> {
  try {
    return await p;
  } catch (err) {
    throw toE2BError(err);
  }
}

// ---------------------------------------------------------------- options

/** E2B's connection options; only `signal` and `requestTimeoutMs` act here (see README). */
export interface ConnectionOpts {
  apiKey?: string;
  validateApiKey?: boolean;
  domain?: string;
  apiUrl?: string;
  sandboxUrl?: string;
  debug?: boolean;
  requestTimeoutMs?: number;
  retries?: number;
  logger?: unknown;
  headers?: Record<string, string>;
  proxy?: string;
  apiHeaders?: Record<string, string>;
  signal?: AbortSignal;
  /** abx only: how to reach the broker, and which provider (default ABX_PROVIDER / the configured one). */
  abx?: ClientOptions & { provider?: string };
}

const CONNECTION_KEYS = [
  'apiKey',
  'validateApiKey',
  'domain',
  'apiUrl',
  'sandboxUrl',
  'debug',
  'requestTimeoutMs',
  'retries',
  'logger',
  'headers',
  'proxy',
  'apiHeaders',
  'signal',
  'abx',
];

export interface SandboxOpts extends ConnectionOpts {
  template?: string;
  metadata?: Record<string, string>;
  envs?: Record<string, string>;
  timeoutMs?: number;
  secure?: boolean;
  allowInternetAccess?: boolean;
  network?: { allowOut?: string[]; denyOut?: string[]; allowPublicTraffic?: boolean; [k: string]: unknown };
  lifecycle?: { onTimeout?: 'kill' | 'pause'; [k: string]: unknown };
  mcp?: unknown;
  iam?: unknown;
  volumeMounts?: unknown;
}

export type SandboxConnectOpts = ConnectionOpts & { timeoutMs?: number; onResume?: unknown };
export type SandboxApiOpts = Pick<ConnectionOpts, 'apiKey' | 'validateApiKey' | 'headers' | 'apiHeaders' | 'debug' | 'domain' | 'requestTimeoutMs' | 'retries' | 'signal' | 'abx'>;

/**
 * The options each E2B options type has here (besides ConnectionOpts'): anything else is
 * refused with InvalidArgumentError. test/e2b-drift.test.mjs compares them with E2B's .d.ts.
 */
export const OPTIONS = {
  ConnectionOpts: CONNECTION_KEYS.filter((k) => k !== 'abx'),
  SandboxOpts: ['template', 'metadata', 'envs', 'timeoutMs', 'secure', 'allowInternetAccess', 'network', 'lifecycle', 'mcp', 'iam', 'volumeMounts', 'sandboxUrl'],
  SandboxConnectOpts: ['timeoutMs', 'onResume'],
  SandboxListOpts: ['query', 'order', 'limit', 'nextToken'],
  CommandRequestOpts: ['requestTimeoutMs', 'signal'],
  CommandStartOpts: ['background', 'cwd', 'user', 'envs', 'onStdout', 'onStderr', 'stdin', 'timeoutMs'],
  CommandConnectOpts: ['onStdout', 'onStderr', 'timeoutMs'],
  PtyCreateOpts: ['cols', 'rows', 'onData', 'timeoutMs', 'user', 'envs', 'cwd'],
  FilesystemRequestOpts: ['user'],
  FilesystemReadOpts: ['user', 'gzip', 'streamIdleTimeoutMs'],
  FilesystemWriteOpts: ['user', 'gzip', 'useOctetStream', 'metadata'],
  FilesystemListOpts: ['user', 'depth'],
  WatchOpts: ['user', 'timeoutMs', 'onExit', 'recursive', 'includeEntry', 'allowNetworkMounts'],
} as const satisfies Record<string, readonly string[]>;

/** Refuses what this layer does not know (never ignored): an InvalidArgumentError naming it. */
function checkKeys(where: string, opts: object | undefined, known: readonly string[]): void {
  if (!opts) return;
  for (const k of Object.keys(opts)) {
    if ((opts as Record<string, unknown>)[k] === undefined) continue;
    if (!known.includes(k) && !CONNECTION_KEYS.includes(k)) {
      throw new InvalidArgumentError(`${where}: unknown option '${k}' (known: ${[...known].join(', ')})`);
    }
  }
}

function clientOf(opts: ConnectionOpts | undefined): Promise<BrokerClient> {
  const { provider: _p, ...rest } = opts?.abx ?? {};
  return wrap(getClient(rest));
}

function providerOf(opts: ConnectionOpts | undefined): string | undefined {
  return opts?.abx?.provider ?? (process.env.ABX_PROVIDER || undefined);
}

// ---------------------------------------------------------------- paths: /home/user <-> /workspace

export const E2B_HOME = '/home/user';
export const ABX_HOME_DIR = '/workspace';

/** An E2B path as the broker's: `/home/user/...` and relative paths under `/workspace`. */
export function toAbxPath(p: string): string {
  if (p === E2B_HOME || p === `${E2B_HOME}/`) return ABX_HOME_DIR;
  if (p.startsWith(`${E2B_HOME}/`)) return `${ABX_HOME_DIR}/${p.slice(E2B_HOME.length + 1)}`;
  if (p === '' || p === '.') return ABX_HOME_DIR;
  if (!p.startsWith('/')) return `${ABX_HOME_DIR}/${p.replace(/^\.\//, '')}`;
  return p;
}

/** A broker path as E2B's (`/workspace/...` under `/home/user`). */
export function toE2BPath(p: string): string {
  if (p === ABX_HOME_DIR) return E2B_HOME;
  if (p.startsWith(`${ABX_HOME_DIR}/`)) return `${E2B_HOME}/${p.slice(ABX_HOME_DIR.length + 1)}`;
  return p;
}

function checkUser(where: string, user: string | undefined): void {
  if (user === undefined || user === 'user' || user === 'root') return;
  throw new InvalidArgumentError(
    `${where}: user '${user}': an abx sandbox has one user; 'user' and 'root' both run as it (nearest: exec/run as the sandbox's user)`,
  );
}

function seconds(ms: number | undefined, dflt: number | undefined): number | undefined {
  const v = ms ?? dflt;
  if (v === undefined || v === 0) return undefined;
  return v / 1000;
}

// ---------------------------------------------------------------- commands

export interface CommandResult {
  exitCode: number;
  error?: string;
  stdout: string;
  stderr: string;
}

export class CommandExitError extends SandboxError implements CommandResult {
  private readonly result: CommandResult;
  constructor(result: CommandResult) {
    super(result.error ?? `Command exited with code ${result.exitCode}${result.stderr ? ` and error:\n${result.stderr}` : ''}`);
    this.result = result;
  }
  get exitCode(): number {
    return this.result.exitCode;
  }
  get error(): string | undefined {
    return this.result.error;
  }
  get stdout(): string {
    return this.result.stdout;
  }
  get stderr(): string {
    return this.result.stderr;
  }
}

export interface CommandRequestOpts {
  requestTimeoutMs?: number;
  signal?: AbortSignal;
}

export interface CommandStartOpts extends CommandRequestOpts {
  background?: boolean;
  cwd?: string;
  user?: string;
  envs?: Record<string, string>;
  onStdout?: (data: string) => void | Promise<void>;
  onStderr?: (data: string) => void | Promise<void>;
  stdin?: boolean;
  timeoutMs?: number;
}

export type CommandConnectOpts = Pick<CommandStartOpts, 'onStderr' | 'onStdout' | 'timeoutMs'> & CommandRequestOpts;

export interface ProcessInfo {
  pid: number;
  tag?: string;
  cmd: string;
  args: string[];
  envs: Record<string, string>;
  cwd?: string;
}

/** Go's words for a signal (E2B's envd says `signal: killed`). */
export function signalText(signal: string): string {
  const s = signal.replace(/^SIG/, '').toUpperCase();
  const words: Record<string, string> = { KILL: 'killed', TERM: 'terminated', INT: 'interrupt', HUP: 'hangup', QUIT: 'quit', PIPE: 'broken pipe', SEGV: 'segmentation fault', ABRT: 'aborted' };
  return `signal: ${words[s] ?? s.toLowerCase()}`;
}

function exitResult(exit: ExecExit, stdout: string, stderr: string): CommandResult {
  const r: CommandResult = { exitCode: exit.exitCode ?? -1, stdout, stderr };
  if (exit.timedOut) r.error = 'context deadline exceeded';
  else if (exit.signal) r.error = signalText(String(exit.signal));
  return r;
}

/** A running command (E2B's CommandHandle) over one `exec/start` stream. */
export class CommandHandle {
  readonly pid: number;
  /** abx: the broker's exec id (`exec/attach`, `exec/kill`). */
  readonly execId: string;
  private _stdout = '';
  private _stderr = '';
  private result?: CommandResult;
  private disconnected = false;
  private readonly _wait: Promise<ExecExit>;
  private readonly offs: { dispose(): void }[] = [];

  /** @internal */
  constructor(
    private readonly session: ExecSession,
    private readonly onStdout?: (s: string) => void | Promise<void>,
    private readonly onStderr?: (s: string) => void | Promise<void>,
    private readonly onPty?: (b: Uint8Array) => void | Promise<void>,
    pid?: number,
  ) {
    this.pid = pid ?? session.pid ?? 0;
    this.execId = session.execId;
    this.offs.push(
      session.onOutput((c: OutputChunk) => {
        if (this.disconnected) return;
        if (c.stream === 'stdout') {
          this._stdout += c.text;
          if (c.text) void Promise.resolve(this.onStdout?.(c.text)).catch(() => undefined);
        } else if (c.stream === 'stderr') {
          this._stderr += c.text;
          if (c.text) void Promise.resolve(this.onStderr?.(c.text)).catch(() => undefined);
        } else if (c.bytes.length) {
          void Promise.resolve(this.onPty?.(new Uint8Array(c.bytes))).catch(() => undefined);
        }
      }),
    );
    this._wait = session.exited.then((e) => {
      this.result = exitResult(e, this._stdout, this._stderr);
      return e;
    });
    this._wait.catch(() => undefined);
  }

  get exitCode(): number | undefined {
    return this.result?.exitCode;
  }
  get error(): string | undefined {
    return this.result?.error;
  }
  get stdout(): string {
    return this._stdout;
  }
  get stderr(): string {
    return this._stderr;
  }

  /** Waits for the end: the result, or CommandExitError for a non-zero exit. */
  async wait(): Promise<CommandResult> {
    const exit = await wrap(this._wait);
    await new Promise((r) => setImmediate(r));
    const result = exitResult(exit, this._stdout, this._stderr);
    if (exit.timedOut) throw new TimeoutError(`Command timed out (${result.error}); stdout: ${result.stdout.slice(-200)}`);
    if (result.exitCode !== 0) throw new CommandExitError(result);
    return result;
  }

  /** Stops receiving output; the command goes on (`commands.connect(pid)` attaches again). */
  async disconnect(): Promise<void> {
    this.disconnected = true;
    for (const o of this.offs) o.dispose();
  }

  /** `exec/kill` (KILL): true when it was running. */
  async kill(): Promise<boolean> {
    if (this.session.done) return false;
    try {
      await this.session.kill('KILL');
      return true;
    } catch (err) {
      const e = AbxError.from(err);
      if (e.abx === 'E3002') return false;
      throw toE2BError(e);
    }
  }

  async sendStdin(data: string | Uint8Array, _opts?: CommandRequestOpts): Promise<void> {
    await wrap(this.session.write(data));
  }

  async closeStdin(_opts?: CommandRequestOpts): Promise<void> {
    await wrap(this.session.closeStdin());
  }

  /** abx: `await using h = await sbx.commands.run(.., {background: true})` kills it at the block's end. */
  async [Symbol.asyncDispose](): Promise<void> {
    if (!this.session.done) await this.kill().catch(() => undefined);
  }
}

/** The commands of a sandbox (E2B's `sandbox.commands`). */
export class Commands {
  /** @internal */
  constructor(private readonly sbx: Sandbox) {}

  get supportsStdinClose(): boolean {
    return true;
  }

  /** `process/list`: every process of the sandbox. */
  async list(_opts?: CommandRequestOpts): Promise<ProcessInfo[]> {
    const ps = await wrap(this.sbx.abx.processes.list());
    return ps.map((p) => {
      const argv = String(p.command ?? '').split(' ');
      return { pid: p.pid, cmd: argv[0] ?? '', args: argv.slice(1), envs: {}, tag: this.sbx.handles.get(p.pid)?.execId };
    });
  }

  private byPid(pid: number, where: string): CommandHandle {
    const h = this.sbx.handles.get(pid);
    if (!h) throw new NotFoundError(`${where}(${pid}): no command with that pid was started through this Sandbox object (abx writes by exec id: exec/write)`);
    return h;
  }

  async sendStdin(pid: number, data: string | Uint8Array, _opts?: CommandRequestOpts): Promise<void> {
    await this.byPid(pid, 'commands.sendStdin').sendStdin(data);
  }

  async closeStdin(pid: number, _opts?: CommandRequestOpts): Promise<void> {
    await this.byPid(pid, 'commands.closeStdin').closeStdin();
  }

  /** `exec/kill` for a command started here, else `process/kill`; false when it was not running. */
  async kill(pid: number, _opts?: CommandRequestOpts): Promise<boolean> {
    const h = this.sbx.handles.get(pid);
    if (h) return h.kill();
    try {
      await this.sbx.abx.processes.kill(pid, 'KILL');
      return true;
    } catch (err) {
      const e = AbxError.from(err);
      if (e.abx === 'E3006' || e.abx === 'E3002') return false;
      throw toE2BError(e);
    }
  }

  /** `exec/attach`: a command started by this process (its pid); output from now on (and what was buffered). */
  async connect(pid: number, opts: CommandConnectOpts = {}): Promise<CommandHandle> {
    checkKeys('commands.connect', opts, OPTIONS.CommandConnectOpts);
    const h = this.sbx.handles.get(pid);
    if (!h) {
      throw new NotFoundError(
        `commands.connect(${pid}): no command with that pid was started through this Sandbox object; abx attaches by exec id: sandbox.abx.attach(execId) (exec/attach)`,
      );
    }
    const s = await wrap(this.sbx.abx.attach(h.execId, { keepOnExit: true }));
    const handle = new CommandHandle(s, opts.onStdout, opts.onStderr, undefined, pid);
    this.sbx.handles.set(pid, handle);
    return handle;
  }

  run(cmd: string, opts?: CommandStartOpts & { background?: false }): Promise<CommandResult>;
  run(cmd: string, opts: CommandStartOpts & { background: true }): Promise<CommandHandle>;
  run(cmd: string, opts?: CommandStartOpts & { background?: boolean }): Promise<CommandHandle | CommandResult>;
  async run(cmd: string, opts: CommandStartOpts = {}): Promise<CommandHandle | CommandResult> {
    checkKeys('commands.run', opts, OPTIONS.CommandStartOpts);
    checkUser('commands.run', opts.user);
    const timeout = seconds(opts.timeoutMs, 60_000);
    const cwd = toAbxPath(opts.cwd ?? E2B_HOME);
    if (!opts.background && !opts.onStdout && !opts.onStderr && !opts.stdin) {
      const r = await wrap(this.sbx.abx.exec(cmd, { env: opts.envs, cwd, timeout, signal: opts.signal }));
      const result: CommandResult = { exitCode: r.exitCode ?? -1, stdout: r.stdout, stderr: r.stderr };
      if (r.timedOut) throw new TimeoutError(`Command timed out after ${timeout} s (context deadline exceeded): ${cmd}`);
      if (r.signal) result.error = signalText(String(r.signal));
      if (result.exitCode !== 0) throw new CommandExitError(result);
      return result;
    }
    const s = await wrap(this.sbx.abx.execStream(cmd, { env: opts.envs, cwd, timeout, signal: opts.signal, keepOnExit: !!opts.background }));
    const handle = new CommandHandle(s, opts.onStdout, opts.onStderr);
    this.sbx.handles.set(handle.pid, handle);
    if (!opts.stdin) await s.closeStdin().catch(() => undefined);
    if (opts.background) return handle;
    return handle.wait();
  }
}

// ---------------------------------------------------------------- pty

export interface PtyCreateOpts extends CommandRequestOpts {
  cols: number;
  rows: number;
  onData: (data: Uint8Array) => void | Promise<void>;
  timeoutMs?: number;
  user?: string;
  envs?: Record<string, string>;
  cwd?: string;
}

export class Pty {
  /** @internal */
  constructor(private readonly sbx: Sandbox) {}

  /** `exec/start` with `pty`: an interactive bash. */
  async create(opts: PtyCreateOpts): Promise<CommandHandle> {
    checkKeys('pty.create', opts, OPTIONS.PtyCreateOpts);
    checkUser('pty.create', opts.user);
    const s = await wrap(
      this.sbx.abx.execStream(['bash', '-i', '-l'], {
        pty: { cols: opts.cols, rows: opts.rows },
        env: { TERM: 'xterm-256color', ...(opts.envs ?? {}) },
        cwd: toAbxPath(opts.cwd ?? E2B_HOME),
        timeout: seconds(opts.timeoutMs, 60_000),
      }),
    );
    const h = new CommandHandle(s, undefined, undefined, opts.onData);
    this.sbx.handles.set(h.pid, h);
    return h;
  }

  async connect(pid: number, opts: { onData?: (d: Uint8Array) => void | Promise<void>; timeoutMs?: number } = {}): Promise<CommandHandle> {
    const h = this.sbx.handles.get(pid);
    if (!h) throw new NotFoundError(`pty.connect(${pid}): not a terminal of this Sandbox object; nearest: sandbox.abx.attach(execId) (exec/attach)`);
    const s = await wrap(this.sbx.abx.attach(h.execId));
    const n = new CommandHandle(s, undefined, undefined, opts.onData, pid);
    this.sbx.handles.set(pid, n);
    return n;
  }

  async sendInput(pid: number, data: Uint8Array, _opts?: CommandRequestOpts): Promise<void> {
    await this.sbx.commands.sendStdin(pid, data);
  }

  async resize(pid: number, size: { cols: number; rows: number }, _opts?: CommandRequestOpts): Promise<void> {
    const h = this.sbx.handles.get(pid);
    if (!h) throw new NotFoundError(`pty.resize(${pid}): not a terminal of this Sandbox object`);
    await wrap(this.sbx.client.request('exec/resize', { execId: h.execId, cols: size.cols, rows: size.rows }));
  }

  kill(pid: number, _opts?: CommandRequestOpts): Promise<boolean> {
    return this.sbx.commands.kill(pid);
  }
}

// ---------------------------------------------------------------- files

export enum FileType {
  FILE = 'file',
  DIR = 'dir',
  SYMLINK = 'symlink',
}

export interface WriteInfo {
  name: string;
  type?: FileType;
  path: string;
  metadata?: Record<string, string>;
}

export interface EntryInfo extends WriteInfo {
  size: number;
  mode: number;
  permissions: string;
  owner: string;
  group: string;
  modifiedTime?: Date;
  symlinkTarget?: string;
}

export enum FilesystemEventType {
  CHMOD = 'chmod',
  CREATE = 'create',
  REMOVE = 'remove',
  RENAME = 'rename',
  WRITE = 'write',
}

export interface FilesystemEvent {
  name: string;
  type: FilesystemEventType;
  entry?: EntryInfo;
}

export type WriteEntry = { path: string; data: string | ArrayBuffer | Blob | ReadableStream };

export interface FilesystemRequestOpts extends CommandRequestOpts {
  user?: string;
}
export interface FilesystemWriteOpts extends FilesystemRequestOpts {
  gzip?: boolean;
  useOctetStream?: boolean;
  metadata?: Record<string, string>;
}
export interface FilesystemReadOpts extends FilesystemRequestOpts {
  gzip?: boolean;
  streamIdleTimeoutMs?: number;
}
export interface FilesystemListOpts extends FilesystemRequestOpts {
  depth?: number;
}
export interface WatchOpts extends FilesystemRequestOpts {
  timeoutMs?: number;
  onExit?: (err?: Error) => void | Promise<void>;
  recursive?: boolean;
  includeEntry?: boolean;
  allowNetworkMounts?: boolean;
}

function fileType(t: string | undefined): FileType | undefined {
  if (t === 'file') return FileType.FILE;
  if (t === 'dir' || t === 'directory') return FileType.DIR;
  if (t === 'symlink') return FileType.SYMLINK;
  return undefined;
}

function permissions(mode: number, type: FileType | undefined): string {
  const c = type === FileType.DIR ? 'd' : type === FileType.SYMLINK ? 'l' : '-';
  let s = c;
  for (let i = 8; i >= 0; i--) s += mode & (1 << i) ? 'rwx'[(8 - i) % 3] : '-';
  return s;
}

function entryInfo(e: FileEntry): EntryInfo {
  const x = e as FileEntry & { modifiedAt?: string; target?: string };
  const type = fileType(String(x.type));
  const mode = (typeof x.mode === 'number' ? x.mode : parseInt(String(x.mode ?? '0'), 8) || 0) & 0o7777;
  const out: EntryInfo = {
    name: x.name,
    type,
    path: toE2BPath(x.path),
    size: Number(x.size ?? 0),
    mode,
    permissions: permissions(mode, type),
    owner: 'user',
    group: 'user',
  };
  if (x.modifiedAt) out.modifiedTime = new Date(x.modifiedAt);
  if (x.target) out.symlinkTarget = x.target;
  return out;
}

async function toBytes(data: string | ArrayBuffer | ArrayBufferView | Blob | ReadableStream): Promise<Uint8Array> {
  if (typeof data === 'string') return Buffer.from(data, 'utf8');
  if (data instanceof ArrayBuffer) return new Uint8Array(data);
  if (ArrayBuffer.isView(data)) return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  if (typeof Blob !== 'undefined' && data instanceof Blob) return new Uint8Array(await data.arrayBuffer());
  const parts: Uint8Array[] = [];
  const reader = (data as ReadableStream<Uint8Array>).getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    parts.push(typeof value === 'string' ? Buffer.from(value) : value);
  }
  return Buffer.concat(parts);
}

/** Stops a `watchDir` (E2B's WatchHandle). */
export class WatchHandle {
  /** @internal */
  constructor(private readonly handleStop: () => void) {}
  async stop(): Promise<void> {
    this.handleStop();
  }
}

/** The files of a sandbox (E2B's `sandbox.files`). */
export class Filesystem {
  /** @internal */
  constructor(private readonly sbx: Sandbox) {}

  read(path: string, opts?: FilesystemReadOpts & { format?: 'text' }): Promise<string>;
  read(path: string, opts?: FilesystemReadOpts & { format: 'bytes' }): Promise<Uint8Array>;
  read(path: string, opts?: FilesystemReadOpts & { format: 'blob' }): Promise<Blob>;
  read(path: string, opts?: FilesystemReadOpts & { format: 'stream' }): Promise<ReadableStream<Uint8Array>>;
  async read(
    path: string,
    opts: FilesystemReadOpts & { format?: 'text' | 'bytes' | 'blob' | 'stream' } = {},
  ): Promise<string | Uint8Array | Blob | ReadableStream<Uint8Array>> {
    checkKeys('files.read', opts, ['format', ...OPTIONS.FilesystemReadOpts]);
    checkUser('files.read', opts.user);
    const b = await wrap(this.sbx.abx.files.read(toAbxPath(path), { signal: opts.signal }));
    switch (opts.format ?? 'text') {
      case 'text':
        return b.toString('utf8');
      case 'bytes':
        return new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
      case 'blob':
        return new Blob([new Uint8Array(b)]);
      case 'stream':
        return new ReadableStream<Uint8Array>({
          start(c) {
            c.enqueue(new Uint8Array(b));
            c.close();
          },
        });
      default:
        throw new InvalidArgumentError(`files.read: format '${String(opts.format)}' (text, bytes, blob, stream)`);
    }
  }

  write(path: string, data: string | ArrayBuffer | Blob | ReadableStream, opts?: FilesystemWriteOpts): Promise<WriteInfo>;
  write(files: WriteEntry[], opts?: FilesystemWriteOpts): Promise<WriteInfo[]>;
  async write(
    pathOrFiles: string | WriteEntry[],
    dataOrOpts?: string | ArrayBuffer | Blob | ReadableStream | FilesystemWriteOpts,
    opts?: FilesystemWriteOpts,
  ): Promise<WriteInfo | WriteInfo[]> {
    if (Array.isArray(pathOrFiles)) return this.writeFiles(pathOrFiles, dataOrOpts as FilesystemWriteOpts);
    const o = opts ?? {};
    checkKeys('files.write', o, OPTIONS.FilesystemWriteOpts);
    checkUser('files.write', o.user);
    if (o.metadata) unsupported('files.write({metadata})', 'files/write (no metadata on abx files)');
    const p = toAbxPath(pathOrFiles);
    await wrap(this.sbx.abx.files.write(p, await toBytes(dataOrOpts as string)));
    return { name: p.slice(p.lastIndexOf('/') + 1), type: FileType.FILE, path: toE2BPath(p) };
  }

  /** Several files, in order (each its own atomic `files/write`; parents made). */
  async writeFiles(files: WriteEntry[], opts: FilesystemWriteOpts = {}): Promise<WriteInfo[]> {
    const out: WriteInfo[] = [];
    for (const f of files) out.push(await this.write(f.path, f.data, opts));
    return out;
  }

  /** `files/list` (`depth` 1 by default; deeper: recursive, cut at `depth`). */
  async list(path: string, opts: FilesystemListOpts = {}): Promise<EntryInfo[]> {
    checkKeys('files.list', opts, OPTIONS.FilesystemListOpts);
    checkUser('files.list', opts.user);
    const depth = opts.depth ?? 1;
    if (depth < 1) throw new InvalidArgumentError('files.list: depth should be at least one');
    const base = toAbxPath(path).replace(/\/+$/, '') || '/';
    const entries = await wrap(this.sbx.abx.files.list(base, { recursive: depth > 1 }));
    return entries
      .filter((e) => {
        const rel = e.path.startsWith(`${base}/`) ? e.path.slice(base.length + 1) : e.name;
        return rel.split('/').length <= depth;
      })
      .map(entryInfo);
  }

  /** `files/mkdir` with parents: false when it existed already. */
  async makeDir(path: string, opts: FilesystemRequestOpts = {}): Promise<boolean> {
    checkKeys('files.makeDir', opts, OPTIONS.FilesystemRequestOpts);
    if (await this.exists(path)) return false;
    await wrap(this.sbx.abx.files.mkdir(toAbxPath(path), { parents: true }));
    return true;
  }

  async rename(oldPath: string, newPath: string, opts: FilesystemRequestOpts = {}): Promise<EntryInfo> {
    checkKeys('files.rename', opts, OPTIONS.FilesystemRequestOpts);
    await wrap(this.sbx.abx.files.rename(toAbxPath(oldPath), toAbxPath(newPath)));
    return this.getInfo(newPath);
  }

  /** `files/remove` (recursive, as E2B's). */
  async remove(path: string, opts: FilesystemRequestOpts = {}): Promise<void> {
    checkKeys('files.remove', opts, OPTIONS.FilesystemRequestOpts);
    await wrap(this.sbx.abx.files.remove(toAbxPath(path), { recursive: true }));
  }

  async exists(path: string, opts: FilesystemRequestOpts = {}): Promise<boolean> {
    checkKeys('files.exists', opts, OPTIONS.FilesystemRequestOpts);
    return wrap(this.sbx.abx.files.exists(toAbxPath(path)));
  }

  async getInfo(path: string, opts: FilesystemRequestOpts = {}): Promise<EntryInfo> {
    checkKeys('files.getInfo', opts, OPTIONS.FilesystemRequestOpts);
    return entryInfo(await wrap(this.sbx.abx.files.stat(toAbxPath(path))));
  }

  /** `files/watch`: kinds created / modified / removed / renamed as CREATE / WRITE / REMOVE / RENAME. */
  async watchDir(
    path: string,
    onEvent: (event: FilesystemEvent) => void | Promise<void>,
    opts: WatchOpts = {},
  ): Promise<WatchHandle> {
    checkKeys('files.watchDir', opts, OPTIONS.WatchOpts);
    const base = toAbxPath(path).replace(/\/+$/, '');
    const kinds: Record<string, FilesystemEventType> = {
      created: FilesystemEventType.CREATE,
      modified: FilesystemEventType.WRITE,
      removed: FilesystemEventType.REMOVE,
      renamed: FilesystemEventType.RENAME,
    };
    let chain: Promise<void> = Promise.resolve();
    const w = await wrap(
      this.sbx.abx.files.watch(base, { recursive: opts.recursive ?? false }, (c) => {
        const full = String(c.path);
        const name = full.startsWith(`${base}/`) ? full.slice(base.length + 1) : full;
        // `#<inode>`: the unnamed file an atomic write fills before it takes its name.
        if (/(^|\/)#\d+$/.test(name)) return;
        const kind = String((c as { kind?: string }).kind);
        const type = kinds[kind] ?? FilesystemEventType.WRITE;
        chain = chain.then(async () => {
          await onEvent({ name, type });
          // A file written whole comes in under its name at once (`created`): inotify on E2B
          // says CREATE then WRITE for it, so WRITE follows when it has content.
          if (kind === 'created') {
            const st = await this.sbx.abx.files.stat(full).catch(() => undefined);
            if (st && String(st.type) === 'file' && Number(st.size) > 0) await onEvent({ name, type: FilesystemEventType.WRITE });
          }
        }).catch(() => undefined);
      }),
    );
    let timer: NodeJS.Timeout | undefined;
    let stopped = false;
    const stop = () => {
      if (stopped) return;
      stopped = true;
      if (timer) clearTimeout(timer);
      w.dispose();
      void Promise.resolve(opts.onExit?.()).catch(() => undefined);
    };
    const ms = opts.timeoutMs ?? 60_000;
    if (ms > 0) {
      timer = setTimeout(stop, ms);
      timer.unref();
    }
    return new WatchHandle(stop);
  }
}

// ---------------------------------------------------------------- sandbox

export type SandboxState = 'running' | 'paused';

export interface SandboxInfo {
  sandboxId: string;
  templateId: string;
  name?: string;
  metadata: Record<string, string>;
  startedAt: Date;
  endAt: Date;
  state: SandboxState;
  cpuCount: number;
  memoryMB: number;
  envdVersion: string;
  allowInternetAccess?: boolean;
  sandboxDomain?: string;
}

export interface SandboxListOpts extends SandboxApiOpts {
  query?: { metadata?: Record<string, string>; state?: SandboxState[]; startedAfter?: Date; template?: string };
  order?: 'asc' | 'desc';
  limit?: number;
  nextToken?: string;
}

function e2bInfo(w: WireSandbox, sys?: object): SandboxInfo {
  const si = (sys ?? {}) as { cpuCount?: number; memoryTotalMb?: number };
  const net = (w as { network?: unknown }).network;
  return {
    sandboxId: w.id.startsWith(`${w.provider}:`) ? w.id : `${w.provider}:${w.id}`,
    templateId: String(w.template ?? 'base'),
    name: String(w.template ?? 'base'),
    metadata: (w.metadata ?? {}) as Record<string, string>,
    startedAt: new Date(String(w.startedAt)),
    endAt: new Date(String(w.expiresAt)),
    state: w.status === 'paused' ? 'paused' : 'running',
    cpuCount: Number(si.cpuCount ?? 0),
    memoryMB: Number(si.memoryTotalMb ?? 0),
    envdVersion: `abx`,
    allowInternetAccess: net === undefined ? undefined : net === 'internet' || net === 'host',
    sandboxDomain: undefined,
  };
}

/** E2B's `Sandbox.list()` result: one page holding every sandbox (the broker does not page). */
export class SandboxPaginator {
  private _hasNext = true;
  /** @internal */
  constructor(private readonly opts: SandboxListOpts = {}) {}
  get hasNext(): boolean {
    return this._hasNext;
  }
  get nextToken(): string | undefined {
    return undefined;
  }
  async nextItems(_opts?: SandboxApiOpts): Promise<SandboxInfo[]> {
    if (!this._hasNext) throw new SandboxError('No more items to fetch');
    this._hasNext = false;
    const c = await clientOf(this.opts);
    const all = (await wrap(c.sandboxListAll(providerOf(this.opts)))).sandboxes.map((w) => e2bInfo(w));
    const q = this.opts.query ?? {};
    let out = all.filter(
      (s) =>
        (!q.metadata || Object.entries(q.metadata).every(([k, v]) => s.metadata[k] === v)) &&
        (!q.state || q.state.includes(s.state)) &&
        (!q.startedAfter || s.startedAt > q.startedAfter) &&
        (!q.template || s.templateId === q.template),
    );
    out.sort((a, b) => (this.opts.order === 'asc' ? 1 : -1) * (a.startedAt.getTime() - b.startedAt.getTime()));
    if (this.opts.limit !== undefined) out = out.slice(0, this.opts.limit);
    return out;
  }
}

/** E2B's `base` and `code-interpreter-v1` are the provider's default template (`local`: the host system). */
export function templateFor(t: string | undefined): string | undefined {
  if (t === undefined || t === 'base' || t === 'code-interpreter-v1' || t === 'code-interpreter') return undefined;
  return t;
}


/** E2B's `Sandbox` (the `e2b` package's) on the abx broker. */
export class Sandbox {
  protected static readonly defaultTemplate: string = 'base';
  readonly files: Filesystem;
  readonly commands: Commands;
  readonly pty: Pty;
  /** Every method throws UnsupportedError: run `git` with `commands.run`. */
  readonly git: { readonly [method: string]: (...args: unknown[]) => never };
  /** `provider:id`: what `Sandbox.connect` takes. */
  readonly sandboxId: string;
  readonly sandboxDomain: string;
  readonly trafficAccessToken?: string;
  /** abx: the native SDK's Sandbox (everything the broker offers). */
  readonly abx: AbxSandbox;
  /** @internal pid -> the handle of a command this object started. */
  readonly handles = new Map<number, CommandHandle>();

  /** @internal use Sandbox.create / Sandbox.connect. */
  constructor(opts: { abx: AbxSandbox }) {
    this.abx = opts.abx;
    this.sandboxId = opts.abx.id;
    this.sandboxDomain = opts.abx.provider === 'local' ? '127.0.0.1' : String(opts.abx.data.url ?? '');
    this.files = new Filesystem(this);
    this.commands = new Commands(this);
    this.pty = new Pty(this);
    this.git = new Proxy(
      {} as { readonly [method: string]: (...args: unknown[]) => never },
      {
        get: (_t, prop) => {
          if (typeof prop === 'symbol' || prop === 'then') return undefined;
          return () => unsupported(`sandbox.git.${String(prop)}`, "commands.run('git ...') (exec/run)");
        },
      },
    );
  }

  /** @internal */
  get client(): BrokerClient {
    return this.abx.client;
  }

  private static async wrapAbx<S extends typeof Sandbox>(cls: S, abx: AbxSandbox): Promise<InstanceType<S>> {
    return new cls({ abx }) as InstanceType<S>;
  }

  static list(opts: SandboxListOpts = {}): SandboxPaginator {
    checkKeys('Sandbox.list', opts, OPTIONS.SandboxListOpts);
    return new SandboxPaginator(opts);
  }

  /** `sandbox/create`: `timeoutMs` (default 300 000) as `timeout` s, `envs` as `env`, `metadata`. */
  static create<S extends typeof Sandbox>(this: S, opts?: SandboxOpts): Promise<InstanceType<S>>;
  static create<S extends typeof Sandbox>(this: S, template: string, opts?: SandboxOpts): Promise<InstanceType<S>>;
  static async create<S extends typeof Sandbox>(this: S, a?: string | SandboxOpts, b?: SandboxOpts): Promise<InstanceType<S>> {
    const opts: SandboxOpts = (typeof a === 'string' ? { ...(b ?? {}), template: a } : a) ?? {};
    checkKeys('Sandbox.create', opts, OPTIONS.SandboxOpts);
    if (opts.mcp) unsupported('Sandbox.create({mcp})', 'an MCP server of abx itself (abx mcp), or commands.run to start one');
    if (opts.iam) unsupported('Sandbox.create({iam})', 'sandbox/create env (credentials as environment variables)');
    if (opts.volumeMounts) unsupported('Sandbox.create({volumeMounts})', "sandbox/create mounts (the native SDK's Sandbox.create({mounts}))");
    if (opts.lifecycle?.onTimeout === 'pause') unsupported("Sandbox.create({lifecycle: {onTimeout: 'pause'}})", 'sandbox/setTimeout, sandbox/pause');
    let network: 'none' | 'internet' | { allow: string[]; deny?: string[] } | undefined;
    if (opts.allowInternetAccess === false) network = 'none';
    else if (opts.allowInternetAccess === true) network = 'internet';
    if (opts.network) {
      const { allowOut, denyOut, allowPublicTraffic: _pub, ...rest } = opts.network;
      if (Object.keys(rest).length) unsupported(`Sandbox.create({network: {${Object.keys(rest).join(', ')}}})`, 'sandbox/create network {allow, deny}');
      if (allowOut?.length || denyOut?.length) network = { allow: allowOut ?? [], ...(denyOut?.length ? { deny: denyOut } : {}) };
    }
    const client = await clientOf(opts);
    const timeout = Math.max(1, Math.ceil((opts.timeoutMs ?? 300_000) / 1000));
    const info = await wrap(
      client.sandboxCreate(
        {
          provider: providerOf(opts),
          template: templateFor(opts.template ?? (this as typeof Sandbox).defaultTemplate),
          timeout,
          env: opts.envs,
          metadata: opts.metadata,
          network,
        } as never,
        opts.signal,
      ),
    );
    return Sandbox.wrapAbx(this, AbxSandbox.from(client, info));
  }

  /** `sandbox/connect` (`provider:id`); a paused sandbox is resumed; `timeoutMs` sets the lifetime. */
  static async connect<S extends typeof Sandbox>(this: S, sandboxId: string, opts: SandboxConnectOpts = {}): Promise<InstanceType<S>> {
    checkKeys('Sandbox.connect', opts, OPTIONS.SandboxConnectOpts);
    const client = await clientOf(opts);
    let info = await wrap(client.sandboxConnect(sandboxId));
    const abx = AbxSandbox.from(client, info);
    if (info.status === 'paused') info = await wrap(abx.resume());
    if (opts.timeoutMs !== undefined) await wrap(abx.setTimeout(Math.max(1, Math.ceil(opts.timeoutMs / 1000))));
    return Sandbox.wrapAbx(this, abx);
  }

  async connect(opts: SandboxConnectOpts = {}): Promise<this> {
    await (this.constructor as typeof Sandbox).connect(this.sandboxId, { ...opts, abx: opts.abx ?? { client: this.client } });
    return this;
  }

  static async kill(sandboxId: string, opts: SandboxApiOpts = {}): Promise<boolean> {
    const c = await clientOf(opts);
    try {
      return (await c.sandboxKill(sandboxId)).killed;
    } catch (err) {
      if (err instanceof AbxSandboxNotFoundError) return false;
      throw toE2BError(err);
    }
  }

  static async getInfo(sandboxId: string, opts: SandboxApiOpts = {}): Promise<SandboxInfo> {
    const c = await clientOf(opts);
    const [w, sys] = await Promise.all([wrap(c.sandboxInfo(sandboxId)), c.sandboxSystemInfo(sandboxId).catch(() => undefined)]);
    return e2bInfo(w, sys);
  }

  static getFullInfo(sandboxId: string, opts: SandboxApiOpts = {}): Promise<SandboxInfo> {
    return Sandbox.getInfo(sandboxId, opts);
  }

  static async setTimeout(sandboxId: string, timeoutMs: number, opts: SandboxApiOpts = {}): Promise<void> {
    const c = await clientOf(opts);
    await wrap(c.sandboxSetTimeout(sandboxId, Math.max(1, Math.ceil(timeoutMs / 1000))));
  }

  /** `sandbox/pause` (every process stopped, memory kept; `connect` resumes it). */
  static async pause(sandboxId: string, opts: SandboxApiOpts & { keepMemory?: boolean } = {}): Promise<boolean> {
    const c = await clientOf(opts);
    const before = await wrap(c.sandboxInfo(sandboxId));
    if (before.status === 'paused') return false;
    await wrap(c.sandboxPause(sandboxId));
    return true;
  }

  static betaPause(sandboxId: string, opts: SandboxApiOpts & { keepMemory?: boolean } = {}): Promise<boolean> {
    return Sandbox.pause(sandboxId, opts);
  }

  static async getMetrics(_sandboxId: string, _opts?: unknown): Promise<never> {
    return unsupported('Sandbox.getMetrics', 'sandbox/systemInfo (sandbox.abx.systemInfo())');
  }

  static async updateNetwork(sandboxId: string, network: { allowOut?: string[]; denyOut?: string[] }, opts: SandboxApiOpts = {}): Promise<void> {
    const c = await clientOf(opts);
    await wrap(c.request('sandbox/setNetwork', { sandbox: sandboxId, network: { allow: network.allowOut ?? [], ...(network.denyOut ? { deny: network.denyOut } : {}) } }));
  }

  static async createSnapshot(_sandboxId: string, _opts?: unknown): Promise<never> {
    return unsupported('Sandbox.createSnapshot', 'templates/build (abx template build SANDBOX NAME)');
  }

  static listSnapshots(_opts?: unknown): never {
    return unsupported('Sandbox.listSnapshots', 'templates/list (abx template list)');
  }

  static async deleteSnapshot(_snapshotId: string, _opts?: unknown): Promise<never> {
    return unsupported('Sandbox.deleteSnapshot', 'templates/remove (abx template rm)');
  }

  static async fork(_sandboxId: string, _opts?: unknown): Promise<never> {
    return unsupported('Sandbox.fork', 'templates/build then sandbox/create {template}');
  }

  async fork(_opts?: unknown): Promise<never> {
    return unsupported('sandbox.fork', 'templates/build then sandbox/create {template}');
  }

  /** @internal `ports/url` answers (or errors) per port, asked by getHost. */
  private readonly hosts = new Map<number, { host?: string; error?: Error }>();

  /**
   * `host:port` that reaches `port` of the sandbox (`ports/url`; `local`: `127.0.0.1:PORT`,
   * plain http). E2B's getHost is synchronous: the first call for a port asks the broker for
   * its forward and answers `127.0.0.1:PORT` on `local` at once; once the answer is in, later
   * calls give exactly what it said (another port when that one was taken on the host), or
   * throw its error. `await sandbox.abx.ports.url(port)` waits for the answer.
   */
  getHost(port: number): string {
    const known = this.hosts.get(port);
    if (known?.error) throw known.error;
    if (known?.host) return known.host;
    if (!known) {
      const entry: { host?: string; error?: Error } = {};
      this.hosts.set(port, entry);
      this.abx.ports.url(port).then(
        (u) => {
          const url = new URL(u.url);
          entry.host = url.host;
        },
        (err) => {
          entry.error = toE2BError(err);
        },
      );
    }
    if (this.abx.provider === 'local') return `127.0.0.1:${port}`;
    return unsupported(
      `sandbox.getHost(${port}) before the provider answered (its URLs are only known from ports/url)`,
      'await sandbox.abx.ports.url(port) (ports/url), then getHost(port) answers at once',
    );
  }

  /** `sandbox/info`: running (a paused or gone sandbox is false). */
  async isRunning(_opts?: CommandRequestOpts): Promise<boolean> {
    try {
      return (await this.abx.info()).status === 'running';
    } catch (err) {
      if (err instanceof AbxSandboxNotFoundError) return false;
      throw toE2BError(err);
    }
  }

  async setTimeout(timeoutMs: number, _opts?: CommandRequestOpts): Promise<void> {
    await wrap(this.abx.setTimeout(Math.max(1, Math.ceil(timeoutMs / 1000))));
  }

  updateNetwork(network: { allowOut?: string[]; denyOut?: string[] }, _opts?: CommandRequestOpts): Promise<void> {
    return Sandbox.updateNetwork(this.sandboxId, network, { abx: { client: this.client } });
  }

  async kill(_opts?: CommandRequestOpts): Promise<boolean> {
    try {
      return await this.abx.kill();
    } catch (err) {
      if (err instanceof AbxSandboxNotFoundError) return false;
      throw toE2BError(err);
    }
  }

  pause(opts: { keepMemory?: boolean } = {}): Promise<boolean> {
    return Sandbox.pause(this.sandboxId, { ...opts, abx: { client: this.client } });
  }

  betaPause(opts: { keepMemory?: boolean } = {}): Promise<boolean> {
    return this.pause(opts);
  }

  async createSnapshot(_opts?: unknown): Promise<never> {
    return unsupported('sandbox.createSnapshot', 'templates/build (abx template build SANDBOX NAME)');
  }

  listSnapshots(_opts?: unknown): never {
    return unsupported('sandbox.listSnapshots', 'templates/list (abx template list)');
  }

  getMcpUrl(): never {
    return unsupported('sandbox.getMcpUrl', 'abx mcp (the broker is an MCP server itself)');
  }

  async getMcpToken(): Promise<never> {
    return unsupported('sandbox.getMcpToken', 'abx mcp (no token: the broker runs as your user)');
  }

  async uploadUrl(_path?: string, _opts?: unknown): Promise<never> {
    return unsupported('sandbox.uploadUrl', 'files/upload (sandbox.abx.files.upload(localPath, path))');
  }

  async downloadUrl(_path: string, _opts?: unknown): Promise<never> {
    return unsupported('sandbox.downloadUrl', 'files/download (sandbox.abx.files.download(path, localPath))');
  }

  /** `sandbox/info` and `sandbox/systemInfo` (cpuCount, memoryMB). */
  async getInfo(_opts?: CommandRequestOpts): Promise<SandboxInfo> {
    return Sandbox.getInfo(this.sandboxId, { abx: { client: this.client } });
  }

  async getMetrics(_opts?: unknown): Promise<never> {
    return unsupported('sandbox.getMetrics', 'sandbox/systemInfo (sandbox.abx.systemInfo())');
  }

  /** abx: `await using sbx = await Sandbox.create()` kills it at the block's end. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.kill().catch(() => undefined);
  }
}

// ---------------------------------------------------------------- the rest of e2b's exports

function unsupportedClass(name: string, nearest: string): new (...args: unknown[]) => object {
  const C = class {
    constructor() {
      unsupported(name, nearest);
    }
  };
  Object.defineProperty(C, 'name', { value: name });
  return new Proxy(C, {
    get(t, prop, r) {
      if (prop === 'prototype' || prop === 'name' || prop === 'length' || typeof prop === 'symbol') return Reflect.get(t, prop, r);
      return () => unsupported(`${name}.${String(prop)}`, nearest);
    },
  });
}

/** E2B's template builder: build images with `abx template build` / `templates/build`. */
export const Template = unsupportedClass('Template', 'templates/build (abx template build), templates/pull, templates/import');
export const TemplateBase = Template;
export const Volume = unsupportedClass('Volume', "sandbox/create mounts (the native SDK's Sandbox.create({mounts}))");
export const Secret = unsupportedClass('Secret', 'secrets/* of the daemon (abx secrets)');
export const SecretPaginator = unsupportedClass('SecretPaginator', 'secrets/* of the daemon (abx secrets)');
export const Git = unsupportedClass('Git', "commands.run('git ...') (exec/run)");
export const ConnectionConfig = unsupportedClass('ConnectionConfig', "Sandbox.create({abx: {...}}) (the native SDK's ClientOptions)");
export const ApiClient = unsupportedClass('ApiClient', 'BrokerClient of @abx/sdk');
export const ReadyCmd = unsupportedClass('ReadyCmd', 'templates/build');
export const LogEntry = unsupportedClass('LogEntry', 'templates/build');
export const LogEntryStart = LogEntry;
export const LogEntryEnd = LogEntry;
export const VolumeFileType = { UNKNOWN: 'unknown', FILE: 'file', DIRECTORY: 'directory', SYMLINK: 'symlink' } as const;
export const ALL_TRAFFIC = '0.0.0.0/0';

/** E2B's client object: `new E2B().Sandbox` is this module's Sandbox. */
export class E2B {
  readonly Sandbox: typeof Sandbox = Sandbox;
  readonly Volume = Volume;
  readonly Template = Template;
  readonly Secret = Secret;
  constructor(_opts?: ConnectionOpts) {}
}

export function defaultBuildLogger(): never {
  return unsupported('defaultBuildLogger', 'templates/build');
}
export function getSignature(): never {
  return unsupported('getSignature', 'files/upload, files/download (no signed URLs: the broker runs as your user)');
}
export function waitForFile(): never {
  return unsupported('waitForFile', 'templates/build');
}
export function waitForPort(): never {
  return unsupported('waitForPort', 'templates/build');
}
export function waitForProcess(): never {
  return unsupported('waitForProcess', 'templates/build');
}
export function waitForTimeout(): never {
  return unsupported('waitForTimeout', 'templates/build');
}
export function waitForURL(): never {
  return unsupported('waitForURL', 'templates/build');
}

export default Sandbox;
