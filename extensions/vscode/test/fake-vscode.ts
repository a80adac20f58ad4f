// A small stand-in for the `vscode` module's UI surface, for tests under plain node (no VS
// Code can be downloaded here). Only value types and UI calls are faked: everything the
// extension does with sandboxes goes to the real broker. Calls to the window are recorded
// so tests can answer prompts and inspect messages.

/* eslint-disable @typescript-eslint/no-explicit-any */

export class Disposable {
  private fn: (() => void) | undefined;
  constructor(fn: () => void) {
    this.fn = fn;
  }
  static from(...items: { dispose(): any }[]): Disposable {
    return new Disposable(() => items.forEach((i) => i.dispose()));
  }
  dispose(): void {
    const f = this.fn;
    this.fn = undefined;
    f?.();
  }
}

export class EventEmitter<T> {
  private listeners = new Set<(e: T) => any>();
  readonly event = (listener: (e: T) => any): Disposable => {
    this.listeners.add(listener);
    return new Disposable(() => this.listeners.delete(listener));
  };
  fire(e: T): void {
    for (const l of [...this.listeners]) l(e);
  }
  dispose(): void {
    this.listeners.clear();
  }
}

export class Uri {
  private constructor(
    readonly scheme: string,
    readonly authority: string,
    readonly path: string,
    readonly query: string,
    readonly fragment: string,
  ) {}
  static from(c: { scheme: string; authority?: string; path?: string; query?: string; fragment?: string }): Uri {
    return new Uri(c.scheme, c.authority ?? '', c.path ?? '', c.query ?? '', c.fragment ?? '');
  }
  static parse(s: string): Uri {
    const m = /^([a-zA-Z][\w+.-]*):(?:\/\/([^/?#]*))?([^?#]*)(?:\?([^#]*))?(?:#(.*))?$/.exec(s);
    if (!m) throw new Error(`bad uri ${s}`);
    return new Uri(m[1], m[2] ?? '', decodeURIComponent(m[3] ?? ''), m[4] ?? '', m[5] ?? '');
  }
  static file(p: string): Uri {
    return new Uri('file', '', p, '', '');
  }
  static joinPath(base: Uri, ...parts: string[]): Uri {
    return base.with({ path: [base.path.replace(/\/$/, ''), ...parts].join('/') });
  }
  get fsPath(): string {
    return this.path;
  }
  with(c: { scheme?: string; authority?: string; path?: string; query?: string; fragment?: string }): Uri {
    return new Uri(
      c.scheme ?? this.scheme,
      c.authority ?? this.authority,
      c.path ?? this.path,
      c.query ?? this.query,
      c.fragment ?? this.fragment,
    );
  }
  /** Like VS Code's: the authority comes out lower-cased. */
  toString(_skipEncoding?: boolean): string {
    let s = `${this.scheme}:`;
    if (this.authority || this.scheme === 'file') s += `//${this.authority.toLowerCase()}`;
    s += this.path;
    if (this.query) s += `?${this.query}`;
    if (this.fragment) s += `#${this.fragment}`;
    return s;
  }
  toJSON(): unknown {
    return { scheme: this.scheme, authority: this.authority, path: this.path };
  }
}

export enum FileType {
  Unknown = 0,
  File = 1,
  Directory = 2,
  SymbolicLink = 64,
}

export enum FilePermission {
  Readonly = 1,
}

export enum FileChangeType {
  Changed = 1,
  Created = 2,
  Deleted = 3,
}

export class FileSystemError extends Error {
  readonly code: string;
  constructor(messageOrUri?: string | Uri, code = 'Unknown') {
    super(typeof messageOrUri === 'string' ? messageOrUri : messageOrUri?.toString() ?? '');
    this.code = code;
    this.name = `${code} (FileSystemError)`;
  }
  static FileNotFound(m?: string | Uri) {
    return new FileSystemError(m, 'FileNotFound');
  }
  static FileExists(m?: string | Uri) {
    return new FileSystemError(m, 'FileExists');
  }
  static FileNotADirectory(m?: string | Uri) {
    return new FileSystemError(m, 'FileNotADirectory');
  }
  static FileIsADirectory(m?: string | Uri) {
    return new FileSystemError(m, 'FileIsADirectory');
  }
  static NoPermissions(m?: string | Uri) {
    return new FileSystemError(m, 'NoPermissions');
  }
  static Unavailable(m?: string | Uri) {
    return new FileSystemError(m, 'Unavailable');
  }
}

// ---- UI surface used by extension.ts (recorded for tests) ----

export enum TreeItemCollapsibleState {
  None = 0,
  Collapsed = 1,
  Expanded = 2,
}

export class ThemeIcon {
  constructor(
    readonly id: string,
    readonly color?: ThemeColor,
  ) {}
  static readonly File = new ThemeIcon('file');
  static readonly Folder = new ThemeIcon('folder');
}

export class ThemeColor {
  constructor(readonly id: string) {}
}

export class TreeItem {
  label?: string;
  id?: string;
  description?: string;
  tooltip?: any;
  iconPath?: any;
  contextValue?: string;
  accessibilityInformation?: { label: string; role?: string };
  command?: any;
  resourceUri?: Uri;
  constructor(
    label: string,
    public collapsibleState: TreeItemCollapsibleState = TreeItemCollapsibleState.None,
  ) {
    this.label = label;
  }
}

export class MarkdownString {
  value = '';
  isTrusted?: boolean;
  constructor(value = '') {
    this.value = value;
  }
  appendMarkdown(s: string): this {
    this.value += s;
    return this;
  }
  appendText(s: string): this {
    this.value += s;
    return this;
  }
  appendCodeblock(s: string, lang = ''): this {
    this.value += `\n\`\`\`${lang}\n${s}\n\`\`\`\n`;
    return this;
  }
}

export enum StatusBarAlignment {
  Left = 1,
  Right = 2,
}

export enum ProgressLocation {
  SourceControl = 1,
  Window = 10,
  Notification = 15,
}

export enum ViewColumn {
  Active = -1,
  One = 1,
}

export enum ConfigurationTarget {
  Global = 1,
  Workspace = 2,
}

export class CancellationTokenSource {
  private emitter = new EventEmitter<void>();
  token = {
    isCancellationRequested: false,
    onCancellationRequested: this.emitter.event,
  };
  cancel(): void {
    if (this.token.isCancellationRequested) return;
    this.token.isCancellationRequested = true;
    this.emitter.fire();
  }
  dispose(): void {
    this.emitter.dispose();
  }
}

/** What the fake window saw and what it answers. */
export const recorded = {
  messages: [] as { level: string; text: string; items: string[] }[],
  output: new Map<string, string[]>(),
  terminals: [] as { name: string; pty: any; terminal: any }[],
  statusBar: [] as any[],
  treeViews: new Map<string, any>(),
  fsProviders: new Map<string, any>(),
  commands: new Map<string, (...a: any[]) => any>(),
  executed: [] as { command: string; args: any[] }[],
  opened: [] as string[],
  clipboard: '',
  mcpProviders: new Map<string, any>(),
  documents: [] as { uri?: Uri; language?: string; content?: string }[],
  /** The last options of each message (modal, detail), in order with `messages`. */
  messageOptions: [] as (any | undefined)[],
  quickPicks: [] as any[][],
  dialogs: [] as { kind: 'open' | 'save'; opts: any }[],
  statusMessages: [] as string[],
  closedTabs: [] as any[],
  /** Every updateWorkspaceFolders; `workspace`: the window was a multi-root workspace then. */
  folderUpdates: [] as { start: number; del: number; added: number; workspace: boolean }[],
  /** Answers for prompts, taken in order: quick picks match by label, input boxes take the string. */
  answers: [] as (string | undefined | ((items: any[]) => any))[],
};

function answer(items?: any[]): any {
  if (!recorded.answers.length) return undefined;
  const a = recorded.answers.shift();
  if (typeof a === 'function') return a(items ?? []);
  if (items && a !== undefined) return items.find((i) => (typeof i === 'string' ? i : i.label) === a);
  return a;
}

/** User settings (VS Code's "global" level). */
const settings = new Map<string, any>();
export const configuration = settings;
/** Workspace settings (`.vscode/settings.json`): they win over User settings in `get`. */
export const workspaceConfiguration = new Map<string, any>();
const configurationChanged = new EventEmitter<any>();
/** What VS Code does after a settings edit. */
export function fireConfigurationChange(...sections: string[]): void {
  configurationChanged.fire({ affectsConfiguration: (s: string) => sections.some((x) => x === s || x.startsWith(`${s}.`)) });
}
const contentProviders = new Map<string, any>();
const closeTerminal = new EventEmitter<any>();
const foldersChanged = new EventEmitter<any>();
/** What VS Code fires when a terminal goes. */
export function fireCloseTerminal(t: any): void {
  closeTerminal.fire(t);
}

export const workspace = {
  getConfiguration(section?: string) {
    const prefix = section ? `${section}.` : '';
    return {
      get<T>(key: string, dflt?: T): T | undefined {
        const k = prefix + key;
        if (workspaceConfiguration.has(k)) return workspaceConfiguration.get(k);
        return settings.has(k) ? settings.get(k) : dflt;
      },
      inspect<T>(key: string): any {
        const k = prefix + key;
        return { key: k, globalValue: settings.get(k) as T | undefined, workspaceValue: workspaceConfiguration.get(k) as T | undefined };
      },
      async update(key: string, value: any) {
        settings.set(prefix + key, value);
      },
    };
  },
  onDidChangeConfiguration: configurationChanged.event,
  registerTextDocumentContentProvider(scheme: string, provider: any) {
    contentProviders.set(scheme, provider);
    return new Disposable(() => contentProviders.delete(scheme));
  },
  workspaceFile: undefined as Uri | undefined,
  registerFileSystemProvider(scheme: string, provider: any) {
    recorded.fsProviders.set(scheme, provider);
    return new Disposable(() => recorded.fsProviders.delete(scheme));
  },
  updateWorkspaceFolders: (start: number, del: number, ...folders: { uri: Uri; name?: string }[]) => {
    const before = workspace.workspaceFolders ?? [];
    // Like VS Code: on a window that is not a multi-root workspace (no folder, or one), the
    // change makes an untitled workspace and restarts the extension host; recorded, since in
    // code-server that path left an empty "Untitled (Workspace)" (issue 45, item 12).
    recorded.folderUpdates.push({ start, del, added: folders.length, workspace: !!workspace.workspaceFile });
    const kept = [...before.slice(0, start), ...before.slice(start + del)];
    workspace.workspaceFolders = [...kept.slice(0, start), ...folders.map((f) => ({ ...f, index: 0 })), ...kept.slice(start)].map((f, index) => ({ ...f, index }));
    setImmediate(() => foldersChanged.fire({ added: folders, removed: before.slice(start, start + del) }));
    return true;
  },
  onDidChangeWorkspaceFolders: foldersChanged.event,
  openTextDocument: async (arg: Uri | { language?: string; content?: string }) => {
    if (arg instanceof Uri) {
      // A virtual document: its content comes from the scheme's content provider (read-only).
      const p = contentProviders.get(arg.scheme);
      if (!p) throw new Error(`no content provider for ${arg.scheme}:`);
      const doc = { uri: arg, content: String(await p.provideTextDocumentContent(arg)), isDirty: false, isUntitled: false };
      recorded.documents.push(doc);
      return doc;
    }
    // An untitled document: dirty, asks to be saved on close.
    const doc = { ...arg, uri: Uri.from({ scheme: 'untitled', path: `/doc${recorded.documents.length + 1}` }), isDirty: true, isUntitled: true };
    recorded.documents.push(doc);
    return doc;
  },
  workspaceFolders: undefined as any,
  fs: {},
};

function outputChannel(name: string) {
  const lines: string[] = [];
  recorded.output.set(name, lines);
  let disposed = false;
  // Like VS Code's: a disposed channel throws on use.
  const live = () => {
    if (disposed) throw new Error('Channel has been closed');
  };
  return {
    name,
    append: (s: string) => (live(), lines.push(s)),
    appendLine: (s: string) => (live(), lines.push(`${s}\n`)),
    clear: () => (live(), lines.splice(0)),
    show: () => live(),
    hide: () => live(),
    dispose: () => {
      disposed = true;
    },
  };
}

export const window = {
  createOutputChannel: (name: string) => outputChannel(name),
  createStatusBarItem: () => {
    const item: any = { text: '', tooltip: '', show: () => (item.visible = true), hide: () => (item.visible = false), dispose: () => undefined };
    recorded.statusBar.push(item);
    return item;
  },
  createTreeView: (id: string, opts: any) => {
    // Like VS Code for a visible view: the root is asked for when the view is created and
    // again after every onDidChangeTreeData (a little later: VS Code's UI is another process).
    const provider = opts.treeDataProvider;
    const load = () => {
      if (view.visible) void Promise.resolve(provider.getChildren(undefined)).catch(() => undefined);
    };
    const sub = provider.onDidChangeTreeData?.(() => setImmediate(load));
    const view: any = {
      ...opts,
      visible: true,
      onDidChangeVisibility: new EventEmitter<any>().event,
      dispose: () => sub?.dispose(),
      reveal: async () => undefined,
    };
    recorded.treeViews.set(id, view);
    setImmediate(load);
    return view;
  },
  registerTreeDataProvider: (id: string, provider: any) => {
    recorded.treeViews.set(id, { treeDataProvider: provider });
    return new Disposable(() => undefined);
  },
  createTerminal: (opts: any) => {
    // As VS Code does: dispose closes the Pseudoterminal, then onDidCloseTerminal fires.
    const terminal: any = {
      name: opts.name,
      disposed: false,
      show: () => undefined,
      dispose: () => {
        if (terminal.disposed) return;
        terminal.disposed = true;
        opts.pty?.close?.();
        setImmediate(() => closeTerminal.fire(terminal));
      },
    };
    recorded.terminals.push({ ...opts, terminal });
    return terminal;
  },
  showInformationMessage: async (text: string, ...items: any[]) => msg('info', text, items),
  showWarningMessage: async (text: string, ...items: any[]) => msg('warning', text, items),
  showErrorMessage: async (text: string, ...items: any[]) => msg('error', text, items),
  showQuickPick: async (items: any, _opts?: any) => {
    const list = await items;
    recorded.quickPicks.push(list);
    return answer(list);
  },
  showInputBox: async (_opts?: any) => answer(),
  showOpenDialog: async (opts?: any) => {
    recorded.dialogs.push({ kind: 'open', opts });
    return answer();
  },
  showSaveDialog: async (opts?: any) => {
    recorded.dialogs.push({ kind: 'save', opts });
    return answer();
  },
  showTextDocument: async () => undefined,
  setStatusBarMessage: (text: string, _hide?: number) => {
    recorded.statusMessages.push(text);
    return new Disposable(() => undefined);
  },
  tabGroups: {
    all: [] as { tabs: { label: string; input: any }[] }[],
    close: async (tabs: any[]) => {
      recorded.closedTabs.push(...tabs);
      for (const g of window.tabGroups.all) g.tabs = g.tabs.filter((t) => !tabs.includes(t));
      return true;
    },
  },
  withProgress: async (_opts: any, task: (p: any, t: any) => any) => {
    const cts = new CancellationTokenSource();
    return task({ report: () => undefined }, cts.token);
  },
  onDidCloseTerminal: closeTerminal.event,
};

export class TabInputText {
  constructor(readonly uri: Uri) {}
}

function msg(level: string, text: string, items: any[]): any {
  const plain = items.filter((i) => typeof i === 'string' || (i && typeof i.title === 'string'));
  const opts = items.find((i) => i && typeof i === 'object' && typeof i.title !== 'string');
  recorded.messages.push({ level, text, items: plain.map((i) => (typeof i === 'string' ? i : i.title)) });
  recorded.messageOptions.push(opts);
  return answer(plain.length ? plain : undefined);
}

export const commands = {
  registerCommand(id: string, fn: (...a: any[]) => any) {
    recorded.commands.set(id, fn);
    return new Disposable(() => recorded.commands.delete(id));
  },
  async executeCommand(id: string, ...args: any[]) {
    recorded.executed.push({ command: id, args });
    return recorded.commands.get(id)?.(...args);
  },
};

export const env = {
  openExternal: async (uri: Uri) => {
    recorded.opened.push(uri.toString());
    return true;
  },
  clipboard: {
    writeText: async (s: string) => {
      recorded.clipboard = s;
    },
  },
  appName: 'fake',
};

export const extensions = { getExtension: () => undefined };

export class McpStdioServerDefinition {
  constructor(
    readonly label: string,
    readonly command: string,
    readonly args: string[] = [],
    readonly env: Record<string, string | number | null> = {},
    readonly version?: string,
  ) {}
}

export const lm = {
  registerMcpServerDefinitionProvider(id: string, provider: any) {
    recorded.mcpProviders.set(id, provider);
    return new Disposable(() => recorded.mcpProviders.delete(id));
  },
};

export const version = '1.101.0';
