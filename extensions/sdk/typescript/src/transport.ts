//! How the SDK reaches a broker: the per-user daemon's Unix socket (found as the CLI finds
//! it, the daemon started through `abx broker start` when none answers), a spawned `abx rpc`
//! or `abx broker --stdio`, or `ssh [-p PORT] [user@]host -- abx rpc` for a broker on another
//! machine (`host` / ABX_HOST, like DOCKER_HOST=ssh://).

import { ChildProcess, execFile, spawn } from 'node:child_process';
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

/** `ssh` arguments for a target: `[...extra, -p PORT, user@host, --, abx, rpc]`. */
export function sshArgs(t: SshTarget, remoteBin: string, extra: string[] = []): string[] {
  const args = [...extra];
  if (t.port !== undefined) args.push('-p', String(t.port));
  args.push(t.user ? `${t.user}@${t.host}` : t.host, '--', remoteBin, 'rpc');
  return args;
}

/** The daemon's socket, as the CLI resolves it (broker/home/src/paths.rs). */
export function socketPath(env: NodeJS.ProcessEnv = process.env): string {
  if (env.ABX_HOME) return path.join(env.ABX_HOME, 'run', 'broker.sock');
  const xdg = env.XDG_RUNTIME_DIR;
  if (xdg) {
    try {
      if (fs.statSync(xdg).isDirectory()) return path.join(xdg, 'abx', 'broker.sock');
    } catch {
      /* not there: the temp dir */
    }
  }
  const tmp = env.TMPDIR || '/tmp';
  const uid = typeof process.geteuid === 'function' ? process.geteuid() : os.userInfo().uid;
  return path.join(tmp, `abx-${uid}`, 'broker.sock');
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

/**
 * The daemon's socket; when nothing answers there, `abx broker start` (which waits until
 * the daemon listens) and once more.
 */
export async function openSocket(opts: { socket?: string; abxPath: string; env: NodeJS.ProcessEnv; autoStart?: boolean }): Promise<Link> {
  const file = opts.socket ?? socketPath(opts.env);
  const link = (s: net.Socket): Link => ({ input: s, output: s, socket: s, label: file });
  try {
    return link(await connectSocket(file));
  } catch (first) {
    const code = (first as NodeJS.ErrnoException).code;
    if (opts.autoStart === false || !(code === 'ENOENT' || code === 'ECONNREFUSED')) {
      throw new BrokerUnreachableError('E1007', `The abx broker is not reachable: ${file}: ${(first as Error).message}`, {
        suggestion: "Start it with 'abx broker start' (or let the SDK start it: autoStart), and check ABX_HOME.",
      });
    }
  }
  try {
    await run(opts.abxPath, ['broker', 'start'], opts.env, 60_000);
  } catch (e) {
    const err = e as NodeJS.ErrnoException & { stderr?: string };
    const detail =
      err.code === 'ENOENT'
        ? `the abx binary '${opts.abxPath}' was not found`
        : (err.stderr || err.message || String(e)).trim().split('\n').slice(-3).join(' ');
    throw new BrokerUnreachableError('E1007', `The abx broker is not reachable: could not start it: ${detail}`, {
      suggestion:
        err.code === 'ENOENT'
          ? "Install abx ('cargo install --path cli' in the abx repository) or pass abxPath / set ABX_BIN."
          : "Run 'abx broker start' in a shell to see why, and check its log (abx broker status).",
    });
  }
  try {
    return link(await connectSocket(file));
  } catch (e) {
    throw new BrokerUnreachableError('E1007', `The abx broker is not reachable: ${file}: ${(e as Error).message}`, {
      suggestion: "Run 'abx broker status' and check ABX_HOME / XDG_RUNTIME_DIR.",
    });
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
  const where = target.user ? `${target.user}@${target.host}` : target.host;
  const dest = target.port !== undefined ? `ssh://${where}:${target.port}` : where;
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
      suggestion: `abx runs your own ssh without prompting: load the key in ssh-agent or name it in ~/.ssh/config (IdentityFile), accept the host key once with 'ssh ${dest} true', then retry.`,
      data,
    });
  }
  if (exitCode === 255) {
    return new HostUnreachableError('E1014', `Cannot reach host '${target.host}' over ssh: ${detail}`, {
      suggestion: `Check the address and port (${target.port ?? 22}) in ABX_HOST / host (ssh://[user@]host[:port]) and that sshd runs there; 'ssh ${dest} true' must work by hand.`,
      data,
    });
  }
  return new BrokerUnreachableError('E1007', `The abx broker is not reachable: '${label}' exited with code ${exitCode}: ${detail}`, {
    suggestion: `Run '${label}' in a shell to see why.`,
    data,
  });
}
