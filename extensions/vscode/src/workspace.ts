// Workspaces (issue 43): a workspace folder mounted into a sandbox ("Open Workspace Folder in
// Sandbox"), the "Sandbox Changes" view (what the sandbox changed under its overlay mounts,
// `sandbox/diff`, each change opening VS Code's diff editor: host file against sandbox file),
// apply and discard per file and for all (`sandbox/apply`, `sandbox/discard`; apply asks first,
// conflicts offer Force), and beside the changes the commands run in the sandbox
// (`sandbox/log`).
import * as path from 'node:path';
import * as vscode from 'vscode';
import { sandboxUri } from './adapters/fs';
import { AbxError } from './client/errors';
import { plural, sandboxRef } from './client/format';
import type { Sandbox } from './client/types';
import { decodeAuthority, encodeAuthority } from './client/uri';
import type { AbxDocuments } from './documents';
import { networkNote, pickNetwork, providerFeatures } from './network';
import type { AbxService } from './service';

/** Every command id this file registers (package.json contributes the same set). */
export const WORKSPACE_COMMANDS = [
  'abx.openFolderInSandbox',
  'abx.refreshChanges',
  'abx.openChange',
  'abx.applyChange',
  'abx.discardChange',
  'abx.applyAll',
  'abx.discardAll',
  'abx.showCommandLog',
] as const;

export const CHANGES_VIEW = 'abx.changes';
/** Read-only documents holding a sandbox's version of a file (the diff editor's right side). */
export const CONTENT_SCHEME = 'abx-sandbox';
/** Where "Open Workspace Folder in Sandbox" mounts the folder. */
export const WORKSPACE_TARGET = '/workspace';

// ---------------------------------------------------------------- the API's shapes

export type MountMode = 'overlay' | 'ro' | 'rw';

export interface Mount {
  source: string;
  target: string;
  mode: MountMode;
}

export type ChangeKind = 'added' | 'modified' | 'deleted' | 'typeChanged' | 'modeChanged';

/** One `sandbox/diff` entry. */
export interface Change {
  /** Absolute path in the sandbox (`/workspace/src/a.rs`). */
  path: string;
  change: ChangeKind;
  type: string;
  size: number;
  binary: boolean;
  mode?: number;
  symlinkTarget?: string;
  explicitOnly?: boolean;
  patch?: string;
}

export interface DiffResult {
  changes: Change[];
  truncated?: boolean;
}

export interface ApplyResult {
  applied: string[];
  conflicts: { path: string; reason: string }[];
  skipped: { path: string; reason: string }[];
}

export interface LogEntry {
  seq: number;
  kind: 'exec' | 'stream' | 'pty' | 'code' | string;
  client: string;
  argv?: string[];
  code?: string;
  language?: string;
  cwd?: string;
  startedAt: string;
  durationMs?: number;
  exitCode?: number;
  signal?: string;
  error?: string;
}

export interface LogResult {
  entries: LogEntry[];
  dropped: number;
  last: number;
}

export type MountedSandbox = Sandbox & { mounts?: Mount[] };

// ---------------------------------------------------------------- pure helpers

/** The mounts a sandbox reports (`Sandbox.mounts`), or those this window gave it at create. */
export function mountsOf(s: MountedSandbox, known?: Mount[]): Mount[] {
  return Array.isArray(s.mounts) && s.mounts.length ? s.mounts : (known ?? []);
}

function under(p: string, dir: string): string | undefined {
  const d = dir.replace(/\/+$/, '') || '/';
  if (p === d) return '';
  const prefix = d === '/' ? '/' : `${d}/`;
  return p.startsWith(prefix) ? p.slice(prefix.length) : undefined;
}

/** The mount a sandbox path lies in (the deepest target), and the path relative to it. */
export function mountOf(mounts: Mount[], sandboxPath: string): { mount: Mount; rel: string } | undefined {
  let best: { mount: Mount; rel: string } | undefined;
  for (const m of mounts) {
    const rel = under(sandboxPath, m.target);
    if (rel !== undefined && (!best || m.target.length > best.mount.target.length)) best = { mount: m, rel };
  }
  return best;
}

/** The host file a sandbox path stands for (undefined: not under a mount). */
export function hostPathOf(mounts: Mount[], sandboxPath: string): string | undefined {
  const m = mountOf(mounts, sandboxPath);
  if (!m) return undefined;
  return m.rel ? path.join(m.mount.source, ...m.rel.split('/')) : m.mount.source;
}

/** The sandbox path of a host file (undefined: under no mount). */
export function sandboxPathOf(mounts: Mount[], hostPath: string): string | undefined {
  let best: string | undefined;
  let depth = -1;
  for (const m of mounts) {
    const rel = under(hostPath, m.source);
    if (rel !== undefined && m.source.length > depth) {
      depth = m.source.length;
      best = rel ? `${m.target.replace(/\/+$/, '')}/${rel}` : m.target;
    }
  }
  return best;
}

/** What the view shows per kind of change: a word, a letter, an icon and its colour. */
export function changeLook(kind: string): { word: string; letter: string; icon: string; color: string } {
  switch (kind) {
    case 'added':
      return { word: 'added', letter: 'A', icon: 'diff-added', color: 'gitDecoration.addedResourceForeground' };
    case 'modified':
      return { word: 'modified', letter: 'M', icon: 'diff-modified', color: 'gitDecoration.modifiedResourceForeground' };
    case 'deleted':
      return { word: 'deleted', letter: 'D', icon: 'diff-removed', color: 'gitDecoration.deletedResourceForeground' };
    case 'typeChanged':
      return { word: 'type changed', letter: 'T', icon: 'diff-renamed', color: 'gitDecoration.renamedResourceForeground' };
    case 'modeChanged':
      return { word: 'mode changed', letter: 'P', icon: 'key', color: 'gitDecoration.modifiedResourceForeground' };
    default:
      return { word: kind, letter: '?', icon: 'question', color: 'foreground' };
  }
}

/** `src/a.rs` for `/workspace/src/a.rs` under a mount at `/workspace` (the path itself otherwise). */
export function relativeLabel(mounts: Mount[], sandboxPath: string): string {
  const m = mountOf(mounts, sandboxPath);
  if (!m) return sandboxPath;
  // Several mounts: the target's name keeps them apart.
  const prefix = mounts.length > 1 ? `${m.mount.target.replace(/\/+$/, '')}/` : '';
  return m.rel ? `${prefix}${m.rel}` : m.mount.target;
}

/** The command of a log entry, as one line: argv joined (quoted where needed), or the code's first line. */
export function logCommand(e: LogEntry): string {
  if (e.argv?.length) {
    // `sh -c CMD` as the broker records a `command`: show CMD.
    if (e.argv.length === 3 && e.argv[0] === 'sh' && e.argv[1] === '-c') return e.argv[2];
    return e.argv.map((a) => (/^[\w@%+=:,./-]+$/.test(a) ? a : `'${a.replace(/'/g, `'\\''`)}'`)).join(' ');
  }
  if (e.code !== undefined) {
    const lines = e.code.split('\n').filter((l) => l.trim());
    return `${e.language ? `[${e.language}] ` : ''}${lines[0] ?? ''}${lines.length > 1 ? ' …' : ''}`;
  }
  return `(${e.kind})`;
}

/** How a log entry ended: `exit 0`, `SIGKILL`, `E3003`, `running`. */
export function logOutcome(e: LogEntry): string {
  if (e.error) return e.error;
  if (e.signal) return e.signal;
  if (e.exitCode !== undefined && e.exitCode !== null) return `exit ${e.exitCode}`;
  return e.durationMs === undefined ? 'running' : 'ended';
}

function seconds(ms: number | undefined): string | undefined {
  if (ms === undefined) return undefined;
  return ms < 1000 ? `${ms} ms` : `${(ms / 1000).toFixed(ms < 10_000 ? 1 : 0)} s`;
}

/** The log as text (the "Show Command Log" document). */
export function formatLog(sb: string, r: LogResult): string {
  const lines = [`Commands run in sandbox ${sb} (${plural(r.entries.length, 'entry', 'entries')}${r.dropped ? `, ${r.dropped} older dropped` : ''})`, ''];
  for (const e of r.entries) {
    const when = e.startedAt.replace('T', ' ').replace(/Z$/, ' UTC');
    const took = seconds(e.durationMs);
    lines.push(`#${e.seq}  ${when}  ${e.client}  ${e.kind}  ${logOutcome(e)}${took ? `  ${took}` : ''}${e.cwd ? `  cwd ${e.cwd}` : ''}`);
    if (e.argv?.length || e.code === undefined) lines.push(`    $ ${logCommand(e)}`);
    else for (const l of e.code.replace(/\n$/, '').split('\n')) lines.push(`    ${l}`);
  }
  return lines.join('\n') + '\n';
}

/**
 * The paths an E4015 (apply conflict: nothing else was applied) names: the error's
 * `data.paths` or `data.conflicts` when it has them, else its message (`...: a, b.`), else
 * the paths that were asked for.
 */
export function conflictPaths(e: AbxError, asked: string[] | undefined): string[] {
  const d = e.data as { paths?: unknown; conflicts?: unknown };
  if (Array.isArray(d.paths)) return d.paths.map(String);
  if (Array.isArray(d.conflicts)) return d.conflicts.map((c) => (typeof c === 'string' ? c : String((c as { path?: unknown }).path)));
  const m = /created: (.*?)\.?$/.exec(e.message);
  if (m) {
    const found = m[1].split(/,\s*/).map((s) => s.trim().replace(/^'|'$/g, '')).filter((s) => s.startsWith('/'));
    if (found.length) return found;
  }
  return asked ?? [];
}

// ---------------------------------------------------------------- the sandbox side of a file

/** `abx-sandbox://<provider:id>/<path>`: the sandbox's version of a file, read with files/read. */
export function contentUri(sandbox: string, sandboxPath: string, empty = false): vscode.Uri {
  return vscode.Uri.from({ scheme: CONTENT_SCHEME, authority: encodeAuthority(sandbox), path: sandboxPath, query: empty ? 'empty' : '' });
}

export class SandboxContent implements vscode.TextDocumentContentProvider, vscode.Disposable {
  private readonly emitter = new vscode.EventEmitter<vscode.Uri>();
  readonly onDidChange = this.emitter.event;
  private readonly shown = new Map<string, vscode.Uri>();

  constructor(private readonly service: AbxService) {}

  async provideTextDocumentContent(uri: vscode.Uri): Promise<string> {
    this.shown.set(uri.toString(), uri);
    if (uri.query === 'empty') return '';
    const sb = decodeAuthority(uri.authority);
    const client = await this.service.getClient();
    // An error (E4001: gone meanwhile, or a broker whose files/* do not see mounts) is
    // shown in the editor: an empty side would look like an emptied file.
    return (await client.filesReadAll(sb, uri.path)).toString('utf8');
  }

  /** Open diff editors show the sandbox's files again (after an apply, a discard, a refresh). */
  refresh(): void {
    for (const u of this.shown.values()) this.emitter.fire(u);
  }

  dispose(): void {
    this.emitter.dispose();
    this.shown.clear();
  }
}

// ---------------------------------------------------------------- the view

export type ChangeNode =
  | { kind: 'sandbox'; ref: string; sandbox: MountedSandbox; mounts: Mount[] }
  | { kind: 'change'; ref: string; change: Change; mounts: Mount[] }
  | { kind: 'commands'; ref: string }
  | { kind: 'log'; ref: string; entry: LogEntry }
  | { kind: 'note'; ref: string; label: string; description?: string; icon?: string; tooltip?: string };

export class ChangesProvider implements vscode.TreeDataProvider<ChangeNode>, vscode.Disposable {
  private readonly emitter = new vscode.EventEmitter<ChangeNode | undefined>();
  readonly onDidChangeTreeData = this.emitter.event;
  view: vscode.TreeView<ChangeNode> | undefined;
  /** Each sandbox's diff, read once per refresh. */
  private readonly diffs = new Map<string, Promise<DiffResult | AbxError>>();
  /** The mounts this window gave the sandboxes it created (when the list does not carry them). */
  readonly knownMounts = new Map<string, Mount[]>();
  private readonly subs: vscode.Disposable[] = [];

  constructor(
    private readonly service: AbxService,
    private readonly content: SandboxContent,
  ) {
    // A sandbox created, killed, paused, ... (`sandbox/changed`, or a list read again).
    this.subs.push(service.onDidChangeSandboxes(() => this.refresh()));
  }

  dispose(): void {
    for (const s of this.subs) s.dispose();
    this.emitter.dispose();
  }

  /** Reads every diff again (and the sandboxes' files shown in diff editors). */
  refresh(): void {
    this.diffs.clear();
    this.content.refresh();
    this.emitter.fire(undefined);
  }

  /** The sandboxes with mounts, as the view lists them. */
  mounted(): { ref: string; sandbox: MountedSandbox; mounts: Mount[] }[] {
    return (this.service.sandboxes ?? [])
      .map((s) => {
        const ref = sandboxRef(s);
        return { ref, sandbox: s as MountedSandbox, mounts: mountsOf(s as MountedSandbox, this.knownMounts.get(ref)) };
      })
      .filter((x) => x.mounts.length > 0);
  }

  /** `sandbox/diff` of a sandbox (cached until the next refresh). */
  diff(ref: string): Promise<DiffResult | AbxError> {
    let d = this.diffs.get(ref);
    if (!d) {
      d = this.service
        .getClient()
        .then((c) => c.request<DiffResult>('sandbox/diff', { sandbox: ref }))
        .catch((err) => AbxError.from(err));
      this.diffs.set(ref, d);
      // The sandbox row's count follows.
      void d.then((r) => {
        if (r instanceof AbxError || this.counts.get(ref) === r.changes.length) return;
        this.counts.set(ref, r.changes.length);
        this.emitter.fire(undefined);
      });
    }
    return d;
  }

  /** The count of changes last read for each sandbox (kept across refreshes: no flicker). */
  private readonly counts = new Map<string, number>();

  getTreeItem(node: ChangeNode): vscode.TreeItem {
    switch (node.kind) {
      case 'sandbox': {
        const item = new vscode.TreeItem(node.ref, vscode.TreeItemCollapsibleState.Expanded);
        item.id = `changes:${node.ref}`;
        const n = this.counts.get(node.ref);
        const where = node.mounts.map((m) => `${m.target} ← ${m.source} (${m.mode})`).join(', ');
        item.description = [n === undefined ? undefined : plural(n, 'change'), where].filter(Boolean).join(' · ');
        item.iconPath = new vscode.ThemeIcon('vm', node.sandbox.status === 'running' ? new vscode.ThemeColor('charts.green') : undefined);
        const overlay = node.mounts.some((m) => m.mode === 'overlay');
        item.contextValue = `changesSandbox${overlay ? ':overlay' : ''}${n ? ':changes' : ''}`;
        item.tooltip = `${node.ref}\n${node.mounts
          .map((m) => `${m.target} ← ${m.source} (${m.mode}${m.mode === 'rw' ? ': writes go to the host' : m.mode === 'overlay' ? ': the host changes only on apply' : ': read-only'})`)
          .join('\n')}`;
        return item;
      }
      case 'change': {
        const c = node.change;
        const look = changeLook(c.change);
        const label = relativeLabel(node.mounts, c.path);
        const item = new vscode.TreeItem(label, vscode.TreeItemCollapsibleState.None);
        item.id = `change:${node.ref}:${c.path}`;
        const host = hostPathOf(node.mounts, c.path);
        item.description = [look.word, c.type !== 'file' ? c.type : undefined, c.binary ? 'binary' : undefined, c.explicitOnly ? 'applied only when named' : undefined]
          .filter(Boolean)
          .join(' · ');
        item.iconPath = new vscode.ThemeIcon(look.icon, new vscode.ThemeColor(look.color));
        item.contextValue = `change-${c.change}${c.explicitOnly ? ':explicit' : ''}`;
        item.tooltip = [
          `${look.word}: ${c.path}`,
          host ? `host: ${host}` : undefined,
          c.type !== 'file' ? `type: ${c.type}` : undefined,
          c.change !== 'deleted' ? `size: ${c.size} bytes` : undefined,
          c.mode !== undefined ? `mode: ${c.mode.toString(8)}` : undefined,
          c.symlinkTarget ? `symlink to ${c.symlinkTarget}` : undefined,
          c.explicitOnly ? 'a symlink leaving the folder: Apply All leaves it out; Apply on this row applies it' : undefined,
        ]
          .filter(Boolean)
          .join('\n');
        item.accessibilityInformation = { label: `${label}, ${look.word}` };
        item.command = { command: 'abx.openChange', title: 'Open Changes', arguments: [node] };
        return item;
      }
      case 'commands': {
        const item = new vscode.TreeItem('Commands', vscode.TreeItemCollapsibleState.Collapsed);
        item.id = `commands:${node.ref}`;
        item.description = 'run in the sandbox (sandbox/log)';
        item.iconPath = new vscode.ThemeIcon('history');
        item.contextValue = 'changesCommands';
        return item;
      }
      case 'log': {
        const e = node.entry;
        const item = new vscode.TreeItem(logCommand(e), vscode.TreeItemCollapsibleState.None);
        item.id = `log:${node.ref}:${e.seq}`;
        const outcome = logOutcome(e);
        item.description = [e.client, outcome, seconds(e.durationMs)].filter(Boolean).join(' · ');
        const ok = e.exitCode === 0 && !e.error && !e.signal;
        item.iconPath = new vscode.ThemeIcon(
          outcome === 'running' ? 'loading' : ok ? 'pass' : 'error',
          outcome === 'running' ? undefined : new vscode.ThemeColor(ok ? 'charts.green' : 'charts.red'),
        );
        item.tooltip = [
          `#${e.seq} ${e.kind} by ${e.client}`,
          `started ${e.startedAt}`,
          e.cwd ? `cwd ${e.cwd}` : undefined,
          outcome,
          e.code !== undefined ? `\n${e.code}` : e.argv ? `argv: ${JSON.stringify(e.argv)}` : undefined,
        ]
          .filter(Boolean)
          .join('\n');
        item.accessibilityInformation = { label: `${logCommand(e)}, by ${e.client}, ${outcome}` };
        return item;
      }
      case 'note': {
        const item = new vscode.TreeItem(node.label, vscode.TreeItemCollapsibleState.None);
        item.description = node.description;
        item.tooltip = node.tooltip;
        if (node.icon) item.iconPath = new vscode.ThemeIcon(node.icon);
        return item;
      }
    }
  }

  async getChildren(node?: ChangeNode): Promise<ChangeNode[]> {
    if (!node) {
      let list = this.service.sandboxes;
      if (!list && !this.service.sandboxesAttempted && this.service.state.kind !== 'error') list = await this.service.refreshSandboxes();
      if (!list || this.service.state.kind === 'error') return [];
      return this.mounted().map((m) => ({ kind: 'sandbox', ...m }));
    }
    if (node.kind === 'sandbox') {
      const out: ChangeNode[] = [];
      if (!node.mounts.some((m) => m.mode === 'overlay')) {
        out.push({
          kind: 'note',
          ref: node.ref,
          label: 'No overlay mount',
          description: node.mounts.some((m) => m.mode === 'rw') ? 'rw: writes went to the host at once' : 'ro: nothing can change',
          icon: 'info',
        });
      } else {
        const d = await this.diff(node.ref);
        if (d instanceof AbxError) {
          out.push({ kind: 'note', ref: node.ref, label: d.headline, tooltip: d.describe(), icon: 'error' });
        } else {
          if (!d.changes.length) out.push({ kind: 'note', ref: node.ref, label: 'No changes', description: 'the sandbox has the host’s files', icon: 'check' });
          for (const change of d.changes) out.push({ kind: 'change', ref: node.ref, change, mounts: node.mounts });
          if (d.truncated) out.push({ kind: 'note', ref: node.ref, label: 'The list was cut', description: 'more changes than shown', icon: 'warning' });
        }
      }
      out.push({ kind: 'commands', ref: node.ref });
      return out;
    }
    if (node.kind === 'commands') {
      try {
        const r = await (await this.service.getClient()).request<LogResult>('sandbox/log', { sandbox: node.ref });
        const rows: ChangeNode[] = [...r.entries].reverse().map((entry) => ({ kind: 'log', ref: node.ref, entry }));
        if (!rows.length) rows.push({ kind: 'note', ref: node.ref, label: 'No commands yet', icon: 'info' });
        if (r.dropped) rows.push({ kind: 'note', ref: node.ref, label: `${r.dropped} older entries dropped`, icon: 'info' });
        return rows;
      } catch (err) {
        const e = AbxError.from(err);
        return [{ kind: 'note', ref: node.ref, label: e.headline, tooltip: e.describe(), icon: 'error' }];
      }
    }
    return [];
  }
}

// ---------------------------------------------------------------- commands

type Arg = ChangeNode | vscode.Uri | string | undefined;

export interface WorkspaceParts {
  changes: ChangesProvider;
  content: SandboxContent;
  disposables: vscode.Disposable[];
}

export class WorkspaceCommands {
  constructor(
    private readonly service: AbxService,
    private readonly changes: ChangesProvider,
    private readonly documents: AbxDocuments,
    private readonly showError: (err: unknown) => Promise<void>,
  ) {}

  register(): vscode.Disposable[] {
    const c = (id: (typeof WORKSPACE_COMMANDS)[number], f: (...a: never[]) => unknown) =>
      vscode.commands.registerCommand(id, async (...args: unknown[]) => {
        try {
          return await (f as (...a: unknown[]) => unknown).apply(this, args);
        } catch (err) {
          await this.showError(err);
          return undefined;
        }
      });
    return [
      c('abx.openFolderInSandbox', this.openFolder),
      c('abx.refreshChanges', this.refresh),
      c('abx.openChange', this.openChange),
      c('abx.applyChange', this.applyChange),
      c('abx.discardChange', this.discardChange),
      c('abx.applyAll', this.applyAll),
      c('abx.discardAll', this.discardAll),
      c('abx.showCommandLog', this.showLog),
    ];
  }

  private client() {
    return this.service.getClient({ now: true });
  }

  private async refresh(): Promise<void> {
    await this.service.refreshSandboxes({ now: true });
    this.changes.refresh();
  }

  /** The workspace folder an argument names, or one the user picks. */
  private async pickFolder(arg: unknown): Promise<vscode.Uri | undefined> {
    if (arg instanceof vscode.Uri && arg.scheme === 'file') return arg;
    if (typeof arg === 'string' && arg.startsWith('/')) return vscode.Uri.file(arg);
    const folders = (vscode.workspace.workspaceFolders ?? []).filter((f) => f.uri.scheme === 'file');
    if (folders.length === 1) return folders[0].uri;
    if (folders.length > 1) {
      const picked = await vscode.window.showQuickPick(
        folders.map((f) => ({ label: f.name, description: f.uri.fsPath, uri: f.uri })),
        { placeHolder: 'Open which workspace folder in a sandbox?' },
      );
      return picked?.uri;
    }
    const picked = await vscode.window.showOpenDialog({ canSelectFiles: false, canSelectFolders: true, canSelectMany: false, openLabel: 'Open in Sandbox' });
    return picked?.[0];
  }

  /**
   * "Open Workspace Folder in Sandbox": a sandbox with the folder mounted at /workspace
   * (overlay unless the user picks otherwise), and a terminal in it.
   */
  private async openFolder(arg?: unknown, modeArg?: unknown, networkArg?: unknown): Promise<{ sandbox: string; mode: MountMode; terminal?: vscode.Terminal } | undefined> {
    const folder = await this.pickFolder(arg);
    if (!folder) return undefined;
    const source = folder.fsPath;
    let mode: MountMode | undefined = modeArg === 'overlay' || modeArg === 'ro' || modeArg === 'rw' ? modeArg : undefined;
    if (!mode) {
      const items: (vscode.QuickPickItem & { mode: MountMode })[] = [
        { label: 'overlay', description: 'default', detail: 'The sandbox works on a copy-on-write layer: your files change only when you apply its changes (Sandbox Changes view).', mode: 'overlay' },
        { label: 'ro', description: 'read-only', detail: 'The sandbox reads your files and cannot change them.', mode: 'ro' },
        { label: 'rw', description: 'writes go to the host', detail: 'Every write in the sandbox changes your files on the host at once: nothing to review or apply.', mode: 'rw' },
      ];
      const picked = await vscode.window.showQuickPick(items, { placeHolder: `Mount ${source} at ${WORKSPACE_TARGET} how?` });
      if (!picked) return undefined;
      mode = picked.mode;
    }
    if (mode === 'rw') {
      const ok = await vscode.window.showWarningMessage(
        `Mount ${source} read-write? Writes in the sandbox go to the host: commands in it change your files directly, with no review and no apply step.`,
        { modal: true, detail: 'Choose overlay (the default) to review the sandbox’s changes and apply only those you want.' },
        'Mount Read-Write',
      );
      if (ok !== 'Mount Read-Write') return undefined;
    }
    const s = this.service.settings;
    const mounts = [{ source, target: WORKSPACE_TARGET, mode }];
    const params: Record<string, unknown> = { timeout: s.defaultTimeout, mounts };
    if (s.defaultProvider) params.provider = s.defaultProvider;
    if (s.defaultTemplate) params.template = s.defaultTemplate;
    const client = await this.client();
    // The network (issue 44): asked of a provider with `network.vpc` (none by default).
    const network = await pickNetwork(await providerFeatures(client, s.defaultProvider || undefined), networkArg);
    if (network === undefined) return undefined;
    if (network !== null) params.network = network;
    const sb = await vscode.window.withProgress(
      { location: vscode.ProgressLocation.Notification, title: `Creating a sandbox with ${path.basename(source)} at ${WORKSPACE_TARGET}…` },
      () => client.request<MountedSandbox>('sandbox/create', params),
    );
    const ref = sandboxRef(sb);
    this.changes.knownMounts.set(ref, mountsOf(sb, mounts));
    await this.service.refreshSandboxes();
    this.changes.refresh();
    const how =
      mode === 'rw'
        ? 'rw: writes in the sandbox go to the host at once'
        : mode === 'ro'
          ? 'read-only'
          : 'overlay: your files change only when you apply the changes in the Sandbox Changes view';
    void vscode.window.showInformationMessage(`Sandbox ${ref}: ${source} at ${WORKSPACE_TARGET} (${how})${networkNote(network)}.`);
    const terminal = (await vscode.commands.executeCommand<vscode.Terminal | undefined>('abx.openTerminal', sandboxUri(ref, WORKSPACE_TARGET))) ?? undefined;
    return { sandbox: ref, mode, terminal };
  }

  /** The sandbox node an argument names (a node, a `provider:id`), or one the user picks. */
  private async sandboxNode(arg: Arg): Promise<(ChangeNode & { kind: 'sandbox' }) | undefined> {
    if (arg && typeof arg === 'object' && 'kind' in arg && arg.kind === 'sandbox') return arg;
    let ref = arg && typeof arg === 'object' && 'ref' in arg ? arg.ref : typeof arg === 'string' ? arg : undefined;
    if (!this.service.sandboxes) await this.service.refreshSandboxes({ now: true });
    const all = this.changes.mounted();
    if (!ref) {
      if (all.length === 1) ref = all[0].ref;
      else if (!all.length) {
        void vscode.window.showInformationMessage('No sandbox has a mounted folder. Run "abx: Open Workspace Folder in Sandbox" first.');
        return undefined;
      } else {
        const picked = await vscode.window.showQuickPick(
          all.map((m) => ({ label: m.ref, description: m.mounts.map((x) => `${x.target} ← ${x.source}`).join(', '), ref: m.ref })),
          { placeHolder: 'Which sandbox?' },
        );
        ref = picked?.ref;
      }
    }
    if (!ref) return undefined;
    const found = all.find((m) => m.ref === ref || m.ref.endsWith(`:${ref}`));
    if (found) return { kind: 'sandbox', ...found };
    const info = (await (await this.client()).sandboxInfo(ref)) as MountedSandbox;
    const r = sandboxRef(info);
    return { kind: 'sandbox', ref: r, sandbox: info, mounts: mountsOf(info, this.changes.knownMounts.get(r)) };
  }

  /** The diff editor: the host file (left) against the sandbox's version (right). */
  private async openChange(node?: ChangeNode): Promise<void> {
    if (!node || node.kind !== 'change') return;
    const c = node.change;
    const host = hostPathOf(node.mounts, c.path);
    const label = relativeLabel(node.mounts, c.path);
    if (c.type === 'directory' || c.type === 'symlink' || c.binary) {
      const what = c.type === 'symlink' ? `a symlink${c.symlinkTarget ? ` to ${c.symlinkTarget}` : ''}` : c.type === 'directory' ? 'a directory' : 'a binary file';
      void vscode.window.showInformationMessage(`${label} (${changeLook(c.change).word}) is ${what}: there is no text to compare.`);
      return;
    }
    const left = c.change === 'added' || !host ? contentUri(node.ref, c.path, true) : vscode.Uri.file(host);
    const right = contentUri(node.ref, c.path, c.change === 'deleted');
    await vscode.commands.executeCommand('vscode.diff', left, right, `${label} (host ↔ sandbox ${node.ref})`, { preview: true });
  }

  private async applyChange(node?: ChangeNode): Promise<ApplyResult | undefined> {
    if (!node || node.kind !== 'change') return undefined;
    const host = hostPathOf(node.mounts, node.change.path) ?? node.change.path;
    const word = changeLook(node.change.change).word;
    const ok = await vscode.window.showWarningMessage(
      `Apply the sandbox's change to ${host}?`,
      {
        modal: true,
        detail: `${relativeLabel(node.mounts, node.change.path)} (${word}) from sandbox ${node.ref}. This ${node.change.change === 'deleted' ? 'deletes' : 'writes'} your file on the host.`,
      },
      'Apply',
    );
    if (ok !== 'Apply') return undefined;
    return this.apply(node.ref, [node.change.path], false);
  }

  private async applyAll(arg?: Arg): Promise<ApplyResult | undefined> {
    const node = await this.sandboxNode(arg);
    if (!node) return undefined;
    const d = await this.changes.diff(node.ref);
    if (d instanceof AbxError) throw d;
    if (!d.changes.length) {
      void vscode.window.showInformationMessage(`Sandbox ${node.ref} has no changes to apply.`);
      return undefined;
    }
    const explicit = d.changes.filter((c) => c.explicitOnly);
    const listed = d.changes.slice(0, 20).map((c) => `${changeLook(c.change).letter} ${relativeLabel(node.mounts, c.path)}`);
    if (d.changes.length > listed.length) listed.push(`… and ${d.changes.length - listed.length} more`);
    const ok = await vscode.window.showWarningMessage(
      `Apply ${plural(d.changes.length - explicit.length, 'change')} of sandbox ${node.ref} to ${node.mounts.map((m) => m.source).join(', ')}?`,
      {
        modal: true,
        detail: `This writes your files on the host.\n\n${listed.join('\n')}${explicit.length ? `\n\nLeft out (symlinks leaving the folder; apply them one by one): ${explicit.map((c) => c.path).join(', ')}` : ''}`,
      },
      'Apply',
    );
    if (ok !== 'Apply') return undefined;
    return this.apply(node.ref, undefined, false);
  }

  /** `sandbox/apply`; conflicts are named in a warning whose Force applies them anyway. */
  private async apply(ref: string, paths: string[] | undefined, force: boolean): Promise<ApplyResult> {
    const client = await this.client();
    const params: Record<string, unknown> = { sandbox: ref };
    if (paths) params.paths = paths;
    if (force) params.force = true;
    let r: ApplyResult;
    try {
      r = await client.request<ApplyResult>('sandbox/apply', params);
    } catch (err) {
      const e = AbxError.from(err);
      if (e.abx !== 'E4015') throw e;
      // Every path asked for conflicts: nothing was applied.
      r = { applied: [], conflicts: conflictPaths(e, paths).map((p) => ({ path: p, reason: e.message })), skipped: [] };
    }
    this.changes.refresh();
    this.service.log(`sandbox/apply ${ref}${force ? ' (force)' : ''}: ${r.applied.length} applied, ${r.conflicts.length} conflicts, ${r.skipped.length} skipped`);
    if (r.applied.length) {
      void vscode.window.showInformationMessage(
        r.applied.length === 1 ? `Applied ${r.applied[0]} from sandbox ${ref}.` : `Applied ${plural(r.applied.length, 'change')} from sandbox ${ref}.`,
      );
    }
    if (r.skipped.length) {
      void vscode.window.showWarningMessage(`Not applied from sandbox ${ref}: ${r.skipped.map((s) => `${s.path} (${s.reason})`).join('; ')}.`);
    }
    if (r.conflicts.length) {
      const names = r.conflicts.map((c) => c.path);
      const pick = await vscode.window.showWarningMessage(
        `Changed on the host since sandbox ${ref} was created, so not applied: ${names.join(', ')}. Force writes the sandbox's version over yours.`,
        'Force',
        'Discard',
      );
      if (pick === 'Force') {
        const again = await this.apply(ref, names, true);
        return { applied: [...r.applied, ...again.applied], conflicts: again.conflicts, skipped: [...r.skipped, ...again.skipped] };
      }
      if (pick === 'Discard') await this.discard(ref, names);
    }
    return r;
  }

  private async discardChange(node?: ChangeNode): Promise<string[] | undefined> {
    if (!node || node.kind !== 'change') return undefined;
    const ok = await vscode.window.showWarningMessage(
      `Discard the sandbox's change to ${relativeLabel(node.mounts, node.change.path)}?`,
      { modal: true, detail: `Sandbox ${node.ref} sees the host's version again; its own is lost. Your file on the host is not touched.` },
      'Discard',
    );
    if (ok !== 'Discard') return undefined;
    return this.discard(node.ref, [node.change.path]);
  }

  private async discardAll(arg?: Arg): Promise<string[] | undefined> {
    const node = await this.sandboxNode(arg);
    if (!node) return undefined;
    const ok = await vscode.window.showWarningMessage(
      `Discard every change of sandbox ${node.ref}?`,
      { modal: true, detail: 'The sandbox sees the host’s files again; what it changed is lost. Your files on the host are not touched.' },
      'Discard All',
    );
    if (ok !== 'Discard All') return undefined;
    return this.discard(node.ref, undefined);
  }

  private async discard(ref: string, paths: string[] | undefined): Promise<string[]> {
    const params: Record<string, unknown> = { sandbox: ref };
    if (paths) params.paths = paths;
    const r = await (await this.client()).request<{ discarded: string[] }>('sandbox/discard', params);
    this.changes.refresh();
    void vscode.window.showInformationMessage(`Discarded ${r.discarded.length === 1 ? r.discarded[0] : plural(r.discarded.length, 'change')} in sandbox ${ref}.`);
    return r.discarded;
  }

  /** The whole command log of a sandbox in a read-only document. */
  private async showLog(arg?: Arg | { kind: 'sandbox'; sandbox: Sandbox }): Promise<LogResult | undefined> {
    let ref: string | undefined;
    if (typeof arg === 'string') ref = arg;
    else if (arg && typeof arg === 'object' && 'ref' in arg) ref = arg.ref;
    // a row of the Sandboxes view
    else if (arg && typeof arg === 'object' && 'sandbox' in arg && typeof arg.sandbox === 'object') ref = sandboxRef(arg.sandbox);
    if (!ref) {
      // any sandbox: commands run in those without mounts too
      const list = (await this.service.refreshSandboxes({ now: true })) ?? [];
      if (!list.length) {
        void vscode.window.showInformationMessage('No sandboxes.');
        return undefined;
      }
      const picked = await vscode.window.showQuickPick(
        list.map((s) => ({ label: sandboxRef(s), description: [s.status, s.template].filter(Boolean).join(' · '), ref: sandboxRef(s) })),
        { placeHolder: 'The command log of which sandbox?' },
      );
      ref = picked?.ref;
    }
    if (!ref) return undefined;
    const r = await (await this.client()).request<LogResult>('sandbox/log', { sandbox: ref });
    await this.documents.show(`commands ${ref}.log`, formatLog(ref, r));
    return r;
  }
}

/** The view, the `abx-sandbox:` documents and the commands of this file. */
export function registerWorkspace(service: AbxService, documents: AbxDocuments, showError: (err: unknown) => Promise<void>): WorkspaceParts {
  const content = new SandboxContent(service);
  const changes = new ChangesProvider(service, content);
  const view = vscode.window.createTreeView(CHANGES_VIEW, { treeDataProvider: changes, showCollapseAll: true });
  changes.view = view;
  // What commands in a sandbox change sends no event: the diffs are read again whenever the
  // view is shown.
  const shown = view.onDidChangeVisibility((e) => {
    if (e.visible) changes.refresh();
  });
  const commands = new WorkspaceCommands(service, changes, documents, showError);
  return {
    changes,
    content,
    disposables: [vscode.workspace.registerTextDocumentContentProvider(CONTENT_SCHEME, content), content, changes, shown, view, ...commands.register()],
  };
}
