//! How the SDK reaches a broker: the daemon's Unix socket (found as the CLI finds it: the
//! runtime dir's socket, else the one the data dir's `broker.lock` records; the daemon started
//! through `abx broker start` when none answers), a spawned `abx rpc`
//! or `abx broker --stdio`, or `ssh [-p PORT] [user@]host -- abx rpc` for a broker on another
//! machine (`host` / ABX_HOST, like DOCKER_HOST=ssh://).

import { ChildProcess, execFile, spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import * as fs from 'node:fs';
import type { Readable, Writable } from 'node:stream';
import { AbxError, BrokerUnreachableError, HostAuthError, HostUnreachableError, InvalidParamsError, RemoteAbxNotFoundError } from './errors.js';

/** A byte stream to a broker. */
export interface Link {
  input: Readable;
  output: Writable;
  /** The process's stderr (spawned links). */
  stderr?: Readable;
  child?: ChildProcess;
  socket?: net.Socket;
  /** What it is, for messages: `abx rpc`, `ssh dev@box -- abx rpc`, the socket path. */
  label: string;
}

/** `ssh://[user@]host[:port]` (or `[user@]host[:port]`) parsed. */
export interface SshTarget {
  user?: string;
  host: string;
  port?: number;
}

/** Parses ABX_HOST / the `host` option. Throws E1004 on anything else than ssh. */
export function parseHost(spec: string): SshTarget {
  let s = spec.trim();
  const scheme = /^([a-z][a-z0-9+.-]*):\/\//i.exec(s);
  if (scheme) {
    if (scheme[1].toLowerCase() !== 'ssh') {
      throw new InvalidParamsError('E1004', `Invalid host '${spec}': only ssh:// is supported.`, {
        suggestion: "Use ABX_HOST=ssh://user@host[:port] (or 'user@host').",
      });
    }
    s = s.slice(scheme[0].length);
  }
  s = s.replace(/\/+$/, '');
  let user: string | undefined;
  const at = s.lastIndexOf('@');
  if (at >= 0) {
    user = decodeURIComponent(s.slice(0, at));
    s = s.slice(at + 1);
  }
  let host = s;
  let port: number | undefined;
  const v6 = /^\[([^\]]+)\](?::(\d+))?$/.exec(s);
  if (v6) {
    host = v6[1];
    port = v6[2] ? Number(v6[2]) : undefined;
  } else {
    const m = /^([^:]+):(\d+)$/.exec(s);
    if (m) {
      host = m[1];
      port = Number(m[2]);
    }
  }
  if (!host || /[\s/]/.test(host) || host.startsWith('-') || (user !== undefined && (!user || user.startsWith('-')))) {
    throw new InvalidParamsError('E1004', `Invalid host '${spec}'.`, {
      suggestion: 'Use ssh://user@host[:port], user@host or host.',
    });
  }
  if (port !== undefined && !(port >= 1 && port <= 65535)) {
    throw new InvalidParamsError('E1004', `Invalid port in host '${spec}'.`, { suggestion: 'A port is 1..65535.' });
  }
  return { user, host, port };
}

/**
 * `ssh` arguments for a target, as the CLI's `--host` runs it:
 * `[-F $ABX_SSH_CONFIG] [...extra] [-p PORT] -T -o BatchMode=yes -- user@host abx rpc`
 * (no pty, never a prompt: stdin is the protocol; the remote command shell-quoted).
 */
export function sshArgs(t: SshTarget, remoteBin: string, extra: string[] = [], sshConfig?: string): string[] {
  const args: string[] = [];
  if (sshConfig) args.push('-F', sshConfig);
  args.push(...extra);
  if (t.port !== undefined) args.push('-p', String(t.port));
  args.push('-T', '-o', 'BatchMode=yes', '--', t.user ? `${t.user}@${t.host}` : t.host, shellQuote(remoteBin), 'rpc');
  return args;
}

/** A word for the remote shell (ssh joins its arguments with spaces). */
function shellQuote(w: string): string {
  return /^[A-Za-z0-9_./:=@%+-]+$/.test(w) ? w : `'${w.replace(/'/g, `'\\''`)}'`;
}

/** The `ssh` command a user can run by hand to check the target (`-p PORT` when there is one). */
export function sshCheckCommand(t: SshTarget): string {
  const where = t.user ? `${t.user}@${t.host}` : t.host;
  return t.port !== undefined ? `ssh -p ${t.port} ${where} true` : `ssh ${where} true`;
}

/** Where the daemon of a context's data dir lives (broker/home/src/paths.rs `Paths::from_env`). */
export interface BrokerPaths {
  /**
   * `$ABX_HOME/run`; else `$XDG_RUNTIME_DIR/abx` when that variable is set, non-empty and a
   * directory; else `$TMPDIR/abx-<euid>/<dataKey(dataDir)>` (TMPDIR as Rust's
   * `std::env::temp_dir` takes it: `/tmp` when unset).
   */
  runtimeDir: string;
  /** `$ABX_HOME/data`; else `${XDG_DATA_HOME:-$HOME/.local/share}/abx`. */
  dataDir: string;
  /** The runtime dir's `broker.sock`: the socket tried first. */
  socket: string;
  /** The runtime dir's `broker.lock`: the record of the daemon listening beside it. */
  runtimeLock: string;
  /** The data dir's `broker.lock`: the record of the daemon serving the data dir. */
  dataLock: string;
}

/**
 * Rust's `PathBuf::join`: no normalization (unlike `path.join`), since the fallback key hashes
 * the data dir's path as the daemon computes it.
 */
function joinPath(base: string, ...parts: string[]): string {
  let out = base;
  for (const p of parts) {
    if (p.startsWith('/')) out = p;
    else if (out === '' || out.endsWith('/')) out += p;
    else out += `/${p}`;
  }
  return out;
}

function euid(): number {
  return typeof process.geteuid === 'function' ? process.geteuid() : os.userInfo().uid;
}

/**
 * The key of a data dir in the temp-dir fallback: the first 16 hex digits of the SHA-256 of its
 * path as given, not resolved (`printf %s PATH | sha256sum | cut -c1-16`).
 */
export function dataKey(dataDir: string): string {
  return createHash('sha256').update(dataDir, 'utf8').digest('hex').slice(0, 16);
}

/** The runtime and data dirs of an environment, as the CLI resolves them (see {@link BrokerPaths}). */
export function brokerPaths(env: NodeJS.ProcessEnv = process.env): BrokerPaths {
  const v = (k: string) => env[k] || undefined;
  let runtimeDir: string;
  let dataDir: string;
  const home = v('ABX_HOME');
  if (home) {
    runtimeDir = joinPath(home, 'run');
    dataDir = joinPath(home, 'data');
  } else {
    dataDir = joinPath(v('XDG_DATA_HOME') ?? joinPath(v('HOME') ?? '/', '.local/share'), 'abx');
    const xdg = v('XDG_RUNTIME_DIR');
    let isDir = false;
    try {
      isDir = !!xdg && fs.statSync(xdg).isDirectory();
    } catch {
      /* not there: the temp dir */
    }
    // std::env::temp_dir: TMPDIR as set (even empty), else /tmp.
    runtimeDir = isDir ? joinPath(xdg!, 'abx') : joinPath(env.TMPDIR ?? '/tmp', `abx-${euid()}`, dataKey(dataDir));
  }
  return {
    runtimeDir,
    dataDir,
    socket: joinPath(runtimeDir, 'broker.sock'),
    runtimeLock: joinPath(runtimeDir, 'broker.lock'),
    dataLock: joinPath(dataDir, 'broker.lock'),
  };
}

/**
 * The socket tried first: `broker.sock` in the runtime dir of {@link brokerPaths}
 * (`$ABX_HOME/run`, else `$XDG_RUNTIME_DIR/abx`, else `$TMPDIR/abx-<uid>/<key>`). The daemon may
 * listen elsewhere (started from a context with another runtime dir): see {@link resolveSocket}.
 */
export function socketPath(env: NodeJS.ProcessEnv = process.env): string {
  return brokerPaths(env).socket;
}

/**
 * A daemon's `broker.lock` (broker/home/src/lock.rs `Record`): pid, version, socket and data dir
 * lines, complete lines only (an older daemon wrote fewer).
 */
interface LockRecord {
  pid: number;
  version?: string;
  socket?: string;
  dataDir?: string;
}

const UTF8 = new TextDecoder('utf-8', { fatal: true });

/** Rust's `str::trim().parse::<u32>()` of bytes. */
function u32(b: Uint8Array): number | undefined {
  let s: string;
  try {
    s = UTF8.decode(b).trim();
  } catch {
    return undefined;
  }
  const m = /^\+?([0-9]+)$/.exec(s);
  if (!m) return undefined;
  const n = Number(m[1]);
  return n < 2 ** 32 ? n : undefined;
}

function readRecord(file: string): LockRecord | undefined {
  let buf: Buffer;
  try {
    const fd = fs.openSync(file, 'r');
    try {
      const all = Buffer.alloc(16 << 10);
      let n = 0;
      for (;;) {
        const k = fs.readSync(fd, all, n, all.length - n, null);
        if (k <= 0) break;
        n += k;
        if (n === all.length) break;
      }
      buf = all.subarray(0, n);
    } finally {
      fs.closeSync(fd);
    }
  } catch {
    return undefined;
  }
  const lines: Buffer[] = [];
  let at = 0;
  for (;;) {
    const nl = buf.indexOf(0x0a, at);
    if (nl < 0 || nl === at) break; // the rest is not a complete line, or an empty line ends it
    lines.push(buf.subarray(at, nl));
    at = nl + 1;
  }
  let pid = lines[0] ? u32(lines[0]) : undefined;
  if (pid === undefined && !buf.includes(0x0a)) pid = u32(buf); // an older daemon's pid-only file
  if (pid === undefined) return undefined;
  let version: string | undefined;
  try {
    version = lines[1] ? UTF8.decode(lines[1]) : undefined;
  } catch {
    version = undefined;
  }
  return { pid, version, socket: lines[2]?.toString('utf8'), dataDir: lines[3]?.toString('utf8') };
}

/**
 * Rust's `Path::components` on Unix (what `Path` equality compares): repeated and trailing
 * separators and inner `.` do not count.
 */
function components(p: string): string[] {
  const absolute = p.startsWith('/');
  const out = absolute ? ['/'] : [];
  p.split('/').forEach((c, i) => {
    if (!c || (c === '.' && (i > 0 || absolute))) return;
    out.push(c);
  });
  return out;
}

function samePath(a: string, b: string): boolean {
  const x = components(a);
  const y = components(b);
  return x.length === y.length && x.every((c, i) => c === y[i]);
}

/** A record without a data dir (an older daemon) is taken as serving any, as the CLI does. */
function serves(r: LockRecord, dataDir: string): boolean {
  return r.dataDir === undefined || samePath(r.dataDir, dataDir);
}

/** `p` itself (not a symlink's target) is a socket / a directory of this euid. */
function mine(p: string, kind: 'socket' | 'dir'): boolean {
  try {
    const st = fs.lstatSync(p);
    return st.uid === euid() && (kind === 'socket' ? st.isSocket() : st.isDirectory());
  } catch {
    return false;
  }
}

/**
 * The socket the data dir's record names (a daemon started from another context), when it is
 * absolute and not the runtime socket, the `broker.lock` beside it names exactly this data dir,
 * and the socket and its directory belong to this euid (cli/client/src/client.rs
 * `recorded_elsewhere`).
 */
function recordedElsewhere(p: BrokerPaths): string | undefined {
  const sock = readRecord(p.dataLock)?.socket;
  if (sock === undefined || !sock.startsWith('/') || samePath(sock, p.socket)) return undefined;
  const comps = components(sock);
  if (comps.length < 2) return undefined;
  const parent = `/${comps.slice(1, -1).join('/')}`;
  const beside = readRecord(joinPath(parent, 'broker.lock'));
  if (beside?.dataDir === undefined || !samePath(beside.dataDir, p.dataDir)) return undefined;
  return mine(sock, 'socket') && mine(parent, 'dir') ? sock : undefined;
}

/**
 * Connects to `file` when it is a socket of this euid (Node has no peer credentials: the owner
 * of a socket file is whoever bound it, so this stands in for the CLI's check that the daemon
 * runs as this user).
 */
async function connectChecked(file: string): Promise<net.Socket> {
  const st = fs.lstatSync(file);
  if (st.uid !== euid()) {
    throw Object.assign(new Error(`${file} is served by another user (uid ${st.uid}), not uid ${euid()}`), { code: 'EACCES' });
  }
  return connectSocket(file);
}

/**
 * A connection to the live daemon that serves `p.dataDir`, without starting one
 * (cli/client/src/client.rs `connect_raw`): the runtime socket unless the record beside it
 * names another data dir, else the socket recorded in the data dir. Rejects when none answers.
 */
async function connectResolved(p: BrokerPaths): Promise<{ socket: net.Socket; file: string }> {
  const r = readRecord(p.runtimeLock);
  let first: Error;
  if (r && !serves(r, p.dataDir)) {
    first = Object.assign(new Error(`the daemon on ${p.socket} serves another data dir`), { code: 'ENOENT' });
  } else {
    try {
      return { socket: await connectChecked(p.socket), file: p.socket };
    } catch (e) {
      first = e as Error;
    }
  }
  const other = recordedElsewhere(p);
  if (other === undefined) throw first;
  return { socket: await connectChecked(other), file: other };
}

/**
 * The socket of the live daemon that serves the data dir of `env`, found as the CLI finds it
 * (cli/client/src/client.rs `connect_raw`), so that a process without XDG_RUNTIME_DIR (cron,
 * ssh, an MCP host passing only HOME) reaches the daemon a shell with it started, and the
 * reverse:
 *
 * 1. {@link socketPath}, unless the `broker.lock` beside it names another data dir;
 * 2. else the socket named in the data dir's `broker.lock`, if it is absolute, the `broker.lock`
 *    beside it names exactly this data dir, and the socket and its directory belong to this user.
 *
 * Undefined when no such daemon answers (nothing is started: mode `socket` of
 * `BrokerClient.connect` starts one).
 */
export async function resolveSocket(env: NodeJS.ProcessEnv = process.env): Promise<string | undefined> {
  try {
    const { socket, file } = await connectResolved(brokerPaths(env));
    socket.destroy();
    return file;
  } catch {
    return undefined;
  }
}

function connectSocket(file: string): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const s = net.createConnection({ path: file });
    const fail = (e: Error) => {
      s.destroy();
      reject(e);
    };
    s.once('error', fail);
    s.once('connect', () => {
      s.off('error', fail);
      resolve(s);
    });
  });
}

function run(file: string, args: string[], env: NodeJS.ProcessEnv, timeoutMs: number): Promise<{ stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    execFile(file, args, { env, timeout: timeoutMs }, (err, stdout, stderr) => {
      if (err) reject(Object.assign(err, { stderr: String(stderr) }));
      else resolve({ stdout: String(stdout), stderr: String(stderr) });
    });
  });
}

async function startDaemon(abxPath: string, env: NodeJS.ProcessEnv): Promise<void> {
  try {
    await run(abxPath, ['broker', 'start'], env, 60_000);
  } catch (e) {
    const err = e as NodeJS.ErrnoException & { stderr?: string };
    const detail =
      err.code === 'ENOENT'
        ? `the abx binary '${abxPath}' was not found`
        : (err.stderr || err.message || String(e)).trim().split('\n').slice(-3).join(' ');
    throw new BrokerUnreachableError('E1007', `The abx broker is not reachable: could not start it: ${detail}`, {
      suggestion:
        err.code === 'ENOENT'
          ? "Install abx ('cargo install --locked --path cli/abx && cargo install --locked --path broker/daemon' in the abx repository) or pass abxPath / set ABX_BIN."
          : "Run 'abx broker start' in a shell to see why, and check its log (abx broker status).",
    });
  }
}

/**
 * The daemon's socket: `opts.socket` exactly when given, else the live daemon of the data dir
 * of `opts.env`, found as {@link resolveSocket} finds it. When none answers, `abx broker start`
 * (which waits until the daemon listens; `autoStart: false`: E1007 instead) and once more.
 */
export async function openSocket(opts: { socket?: string; abxPath: string; env: NodeJS.ProcessEnv; autoStart?: boolean }): Promise<Link> {
  const link = (s: net.Socket, file: string): Link => ({ input: s, output: s, socket: s, label: file });
  if (opts.socket) {
    const file = opts.socket;
    try {
      return link(await connectSocket(file), file);
    } catch (first) {
      const code = (first as NodeJS.ErrnoException).code;
      if (opts.autoStart === false || !(code === 'ENOENT' || code === 'ECONNREFUSED')) {
        throw new BrokerUnreachableError('E1007', `The abx broker is not reachable: ${file}: ${(first as Error).message}`, {
          suggestion: "Start it with 'abx broker start' (or let the SDK start it: autoStart), and check ABX_HOME.",
        });
      }
    }
    await startDaemon(opts.abxPath, opts.env);
    try {
      return link(await connectSocket(file), file);
    } catch (e) {
      throw new BrokerUnreachableError('E1007', `The abx broker is not reachable: ${file}: ${(e as Error).message}`, {
        suggestion: "Run 'abx broker status' and check ABX_HOME / XDG_RUNTIME_DIR.",
      });
    }
  }
  let p = brokerPaths(opts.env);
  try {
    const c = await connectResolved(p);
    return link(c.socket, c.file);
  } catch (first) {
    if (opts.autoStart === false) {
      throw new BrokerUnreachableError(
        'E1007',
        `The abx broker is not reachable: no daemon serving ${p.dataDir} answers (${p.socket}: ${(first as Error).message})`,
        { suggestion: "Start it with 'abx broker start' (or let the SDK start it: autoStart), and check ABX_HOME." },
      );
    }
  }
  await startDaemon(opts.abxPath, opts.env);
  p = brokerPaths(opts.env);
  try {
    const c = await connectResolved(p);
    return link(c.socket, c.file);
  } catch (e) {
    throw new BrokerUnreachableError(
      'E1007',
      `The abx broker is not reachable: started, but no daemon serving ${p.dataDir} answers (${p.socket}: ${(e as Error).message})`,
      { suggestion: "Run 'abx broker status' in the same environment and check ABX_HOME / XDG_RUNTIME_DIR." },
    );
  }
}

/** Spawns `file args` with piped stdio. */
export function openProcess(file: string, args: string[], env: NodeJS.ProcessEnv, label: string): Link {
  const child = spawn(file, args, {
    env,
    stdio: ['pipe', 'pipe', 'pipe'],
    cwd: env.HOME && path.isAbsolute(env.HOME) && fs.existsSync(env.HOME) ? env.HOME : undefined,
  });
  return { input: child.stdout!, output: child.stdin!, stderr: child.stderr!, child, label };
}

/**
 * What an ssh failure means, from its exit code and last stderr lines, with the fix: E1016 the
 * remote abx cannot be run, E1015 the login was refused, E1014 the host cannot be reached (the
 * codes and texts of the CLI's `--host`).
 */
export function sshFailure(label: string, target: SshTarget, remoteBin: string, exitCode: number | null, stderr: string): AbxError {
  const check = sshCheckCommand(target);
  const tail = stderr.trim().split('\n').filter((l) => l.trim()).slice(-3).join(' ');
  const detail = tail || `'${label}' exited with code ${exitCode}`;
  const data = { host: target.host, exitCode };
  if (exitCode !== 255 && (exitCode === 127 || exitCode === 126 || /command not found|No such file or directory|not found|Permission denied/i.test(tail))) {
    return new RemoteAbxNotFoundError('E1016', `'${remoteBin}' cannot be run on host '${target.host}': ${detail}`, {
      suggestion: `Install abx on that machine so '${remoteBin}' is on the PATH of non-interactive ssh sessions, or set ABX_REMOTE_BIN (remoteBin) to its full path there.`,
      data,
    });
  }
  if (/Permission denied|Authentication failed|Too many authentication failures|Host key verification failed|no matching host key/i.test(tail)) {
    return new HostAuthError('E1015', `ssh could not log in to '${target.host}': ${detail}`, {
      suggestion: `abx runs your own ssh without prompting: load the key in ssh-agent or name it in ~/.ssh/config (IdentityFile), accept the host key once with '${check}', then retry.`,
      data,
    });
  }
  if (exitCode === 255) {
    return new HostUnreachableError('E1014', `Cannot reach host '${target.host}' over ssh: ${detail}`, {
      suggestion: `Check the address and port (${target.port ?? 22}) in ABX_HOST / host (ssh://[user@]host[:port]) and that sshd runs there; '${check}' must work by hand.`,
      data,
    });
  }
  return new BrokerUnreachableError('E1007', `The abx broker is not reachable: '${label}' exited with code ${exitCode}: ${detail}`, {
    suggestion: `Run '${label}' in a shell to see why.`,
    data,
  });
}
