// The extension's settings (package.json `contributes.configuration`).
import * as os from 'node:os';
import * as path from 'node:path';
import * as vscode from 'vscode';

export interface Settings {
  /** The abx binary. */
  path: string;
  /** `daemon` (abx rpc: the per-user daemon, shared with the CLI and agents) or `stdio`. */
  connection: 'daemon' | 'stdio';
  /** ABX_HOME for abx ('' = abx's own default). */
  home: string;
  /** ABX_HOST for abx: `ssh://user@host[:port]` ('' = this machine, or the inherited ABX_HOST). */
  host: string;
  defaultProvider: string;
  defaultTemplate: string;
  /** Lifetime of new sandboxes and of "extend", in seconds. */
  defaultTimeout: number;
  /** Seconds between sandbox list refreshes while connected (0: only on demand). */
  refreshInterval: number;
  /** Register `abx mcp` with VS Code's agent (VS Code 1.101+). */
  mcpEnabled: boolean;
  /** Command of new terminals ('' = the sandbox's bash, else sh). */
  terminalCommand: string;
  /** Connect when VS Code starts (the status bar shows the state from the start). */
  connectOnStartup: boolean;
  /** Keys of USER_ONLY that a workspace sets; those values are not used. */
  ignored: string[];
}

/**
 * Settings that choose what program runs: taken from User settings (and, in a remote
 * window, Remote settings) only, never from a workspace's `.vscode/settings.json`.
 */
export const USER_ONLY = ['path', 'home', 'connection', 'host'] as const;


export function expandHome(p: string): string {
  if (p === '~') return os.homedir();
  if (p.startsWith('~/')) return path.join(os.homedir(), p.slice(2));
  return p;
}

/**
 * The User value of a setting (in a remote window: User and Remote merged, Remote first),
 * else its default: what a workspace sets is skipped.
 */
function userValue<T>(c: vscode.WorkspaceConfiguration, key: string, dflt: T): T {
  const i = c.inspect<T>(key);
  if (!i) return c.get<T>(key, dflt);
  return i.globalValue ?? i.defaultValue ?? dflt;
}

export function readSettings(): Settings {
  const c = vscode.workspace.getConfiguration('abx');
  const ignored = USER_ONLY.filter((k) => {
    const i = c.inspect(k);
    return i?.workspaceValue !== undefined || i?.workspaceFolderValue !== undefined;
  });
  const connection = userValue<string>(c, 'connection', 'daemon') === 'stdio' ? 'stdio' : 'daemon';
  return {
    path: expandHome((userValue<string>(c, 'path', 'abx') || 'abx').trim()),
    connection,
    home: expandHome((userValue<string>(c, 'home', '') || '').trim()),
    host: (userValue<string>(c, 'host', '') || '').trim(),
    defaultProvider: (c.get<string>('defaultProvider', '') || '').trim(),
    defaultTemplate: (c.get<string>('defaultTemplate', '') || '').trim(),
    defaultTimeout: Math.max(1, Math.floor(Number(c.get<number>('defaultTimeout', 300)) || 300)),
    refreshInterval: Math.max(0, Number(c.get<number>('refreshInterval', 10)) || 0),
    mcpEnabled: c.get<boolean>('mcp.enabled', true) !== false,
    terminalCommand: (c.get<string>('terminal.command', '') || '').trim(),
    connectOnStartup: c.get<boolean>('connectOnStartup', true) !== false,
    ignored: [...ignored],
  };
}

/** The environment abx runs with: ours, plus ABX_HOME and ABX_HOST when set. */
export function abxEnv(s: Settings): NodeJS.ProcessEnv {
  const env = { ...process.env };
  if (s.home) env.ABX_HOME = s.home;
  if (s.host) env.ABX_HOST = s.host;
  return env;
}
