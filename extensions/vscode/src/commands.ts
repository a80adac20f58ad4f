// The extension's commands. Each takes an optional tree node (from a view's context menu), a
// sandbox reference or an abx: URI, and otherwise asks.
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import * as vscode from 'vscode';
import { parseSandboxUri, sandboxUri } from './adapters/fs';
import { AbxTerminal } from './adapters/terminal';
import type { BrokerClient } from './client/broker';
import { AbxError } from './client/errors';
import { formatExpiry, formatPlan, formatPlanText, groupFeatures, parseDuration, parsePort, plural, sandboxRef, templateNames } from './client/format';
import type { InstallParams, InstallPlan, ProviderSummary, Sandbox, TestResult } from './client/types';
import { encodeAuthority, SCHEME } from './client/uri';
import type { AbxDocuments } from './documents';
import { networkNote, pickNetwork } from './network';
import type { AbxService } from './service';
import type { ProviderNode, ProvidersProvider, SandboxesProvider, SandboxNode } from './views';

/** Every command id this file registers (package.json contributes the same set). */
export const COMMANDS = [
  'abx.refresh',
  'abx.reconnect',
  'abx.startBroker',
  'abx.showLog',
  'abx.showBrokerStatus',
  'abx.create',
  'abx.kill',
  'abx.pause',
  'abx.resume',
  'abx.extendTimeout',
  'abx.runCommand',
  'abx.openTerminal',
  'abx.upload',
  'abx.download',
  'abx.openPort',
  'abx.browseFiles',
  'abx.sandboxInfo',
  'abx.copySandboxId',
  'abx.installProvider',
  'abx.runContractKit',
  'abx.providerDoctor',
  'abx.setDefaultProvider',
  'abx.refreshProviders',
] as const;

/** The name of a sandbox's folder in the explorer (not the path's last part, `workspace`). */
export function sandboxFolderName(sb: string): string {
  return `abx: ${sb}`;
}

/** Whether `a` and `b` name the same sandbox (`provider:id`, or a bare id and a `provider:id`). */
function sameSandbox(a: string, b: string): boolean {
  return a === b || (!a.includes(':') && b.endsWith(`:${a}`)) || (!b.includes(':') && a.endsWith(`:${b}`));
}

type Arg = SandboxNode | ProviderNode | vscode.Uri | string | undefined;

/** Shows a broker error: `[E2009] message` with its suggestion, and a way to the fix. */
export async function showError(err: unknown, service: AbxService, what?: string): Promise<void> {
  const e = AbxError.from(err);
  service.log(`${what ? `${what}: ` : ''}${e.describe().replace(/\n/g, ' ')}`);
  const text = `${what ? `${what}: ` : ''}${e.headline}${e.suggestion ? ` ${e.suggestion}` : ''}`;
  const actions = e.abx === 'E1007' || e.abx === 'E1008' ? ['Open Settings', 'Show Log', 'Retry'] : ['Show Log'];
  const pick = await vscode.window.showErrorMessage(text, ...actions);
  // `@id:` shows exactly that setting, in whichever settings tab is open (User, Remote).
  if (pick === 'Open Settings') await vscode.commands.executeCommand('workbench.action.openSettings', '@id:abx.path');
  else if (pick === 'Show Log') service.output.show(true);
  else if (pick === 'Retry') await vscode.commands.executeCommand('abx.reconnect');
}

/** The marker beside a workspace file this window is reloading into (healOpenedWorkspace). */
const OPENING = '.opening';
/** How long a reloaded window waits for its folders before it reloads again (tests change it). */
export const healSettle = { ms: 2000 };

export class Commands {
  private run: vscode.OutputChannel | undefined;
  private kit: vscode.OutputChannel | undefined;
  private lastCommand = '';
  /** The terminals open on each sandbox (`provider:id`): they close when it goes. */
  private readonly terminals = new Map<string, Set<vscode.Terminal>>();
  /** Sandboxes whose editors were closed already (a kill from here, then its event). */
  private readonly closed = new Set<string>();
  /** Where the `.code-workspace` files of sandbox windows go (extension.ts: the global storage). */
  workspaceDir: string | undefined;
  /** The activation's healOpenedWorkspace: whether it reloaded the window. */
  healing: Promise<boolean> = Promise.resolve(false);
  /** The last updateWorkspaceFolders until VS Code applied it (a second one before is refused). */
  private folderChange: Promise<void> = Promise.resolve();

  constructor(
    private readonly service: AbxService,
    readonly sandboxes: SandboxesProvider,
    private readonly providers: ProvidersProvider,
    private readonly documents: AbxDocuments,
  ) {}

  register(): vscode.Disposable[] {
    const c = (id: (typeof COMMANDS)[number], f: (arg?: Arg, ...rest: unknown[]) => unknown) =>
      vscode.commands.registerCommand(id, async (arg?: Arg, ...rest: unknown[]) => {
        try {
          return await f.call(this, arg, ...rest);
        } catch (err) {
          await showError(err, this.service);
          return undefined;
        }
      });
    return [
      c('abx.refresh', this.refresh),
      c('abx.reconnect', this.reconnect),
      c('abx.startBroker', this.startBroker),
      c('abx.showLog', () => this.service.output.show(true)),
      c('abx.showBrokerStatus', this.showBrokerStatus),
      c('abx.create', this.create),
      c('abx.kill', this.kill),
      c('abx.pause', this.pause),
      c('abx.resume', this.resume),
      c('abx.extendTimeout', this.extendTimeout),
      c('abx.runCommand', this.runCommand),
      c('abx.openTerminal', this.openTerminal),
      c('abx.upload', this.upload),
      c('abx.download', this.download),
      c('abx.openPort', this.openPort),
      c('abx.browseFiles', this.browseFiles),
      c('abx.sandboxInfo', this.sandboxInfo),
      c('abx.copySandboxId', this.copySandboxId),
      c('abx.installProvider', this.installProvider),
      c('abx.runContractKit', this.runContractKit),
      c('abx.providerDoctor', this.providerDoctor),
      c('abx.setDefaultProvider', this.setDefaultProvider),
      c('abx.refreshProviders', () => this.providers.refresh()),
      // Killed by anyone (the CLI, an agent, another window) or its lifetime ended.
      this.service.onDidEndSandbox((sb) => void this.sandboxGone(sb)),
    ];
  }

  /** A sandbox is gone (once per sandbox): its editors, folder and terminals close. */
  async sandboxGone(sb: string): Promise<void> {
    for (const c of this.closed) if (sameSandbox(c, sb)) return;
    this.closed.add(sb);
    if (this.closed.size > 1024) this.closed.delete(this.closed.values().next().value as string);
    for (const [key, terms] of this.terminals) {
      if (!sameSandbox(key, sb)) continue;
      for (const t of terms) {
        try {
          t.dispose();
        } catch {
          /* already gone */
        }
      }
      this.terminals.delete(key);
    }
    await this.closeSandboxViews(sb);
  }

  /** The user asked for something: connect now, even while waiting to retry. */
  private client(): Promise<BrokerClient> {
    return this.service.getClient({ now: true });
  }

  // ------------------------------------------------------------ pickers

  /** The sandbox an argument names, or one the user picks (undefined: cancelled). */
  async pickSandbox(arg: Arg, placeHolder = 'Pick a sandbox', status?: string): Promise<string | undefined> {
    if (typeof arg === 'string' && arg) return arg;
    if (arg instanceof vscode.Uri && arg.scheme === SCHEME) return parseSandboxUri(arg).sandbox;
    if (arg && typeof arg === 'object' && 'kind' in arg && arg.kind === 'sandbox') return sandboxRef(arg.sandbox);
    const list = (await (await this.client()).sandboxList()).filter((s) => !status || s.status === status);
    if (!list.length) {
      const pick = await vscode.window.showInformationMessage(
        status ? `No ${status} sandboxes.` : 'No sandboxes yet.',
        'Create Sandbox',
      );
      if (pick === 'Create Sandbox') await vscode.commands.executeCommand('abx.create');
      return undefined;
    }
    const items = list.map((s) => ({
      label: sandboxRef(s),
      description: [s.status, s.template].filter(Boolean).join(' · '),
      detail: s.expiresAt ? formatExpiry(s.expiresAt) : undefined,
      ref: sandboxRef(s),
    }));
    const picked = await vscode.window.showQuickPick(items, { placeHolder, matchOnDescription: true });
    return picked?.ref;
  }

  /** A provider an argument names, or one the user picks; `feature` filters. */
  async pickProvider(arg: Arg, placeHolder: string, feature?: string): Promise<ProviderSummary | undefined> {
    const all = await (await this.client()).providerList();
    if (arg && typeof arg === 'object' && 'kind' in arg && 'provider' in arg && typeof arg.provider === 'object') {
      return all.find((p) => p.id === (arg.provider as ProviderSummary).id) ?? (arg.provider as ProviderSummary);
    }
    if (typeof arg === 'string' && arg) {
      const p = all.find((x) => x.id === arg);
      if (!p) throw new AbxError('E8001', `Provider '${arg}' is not installed.`, { suggestion: "Run 'abx provider list'." });
      return p;
    }
    const list = feature ? all.filter((p) => p.features.includes(feature)) : all;
    if (list.length === 1) return list[0];
    const preferred = this.service.settings.defaultProvider;
    const items = list
      .map((p) => ({
        label: p.id,
        description: [p.name, p.version, p.trust, p.default ? 'default' : ''].filter(Boolean).join(' · '),
        detail: groupFeatures(p.features).join(' '),
        p,
      }))
      .sort((a, b) => rank(b.p) - rank(a.p));
    function rank(p: ProviderSummary) {
      return (p.id === preferred ? 2 : 0) + (p.default ? 1 : 0);
    }
    const picked = await vscode.window.showQuickPick(items, { placeHolder, matchOnDescription: true });
    return picked?.p;
  }

  // ------------------------------------------------------------ broker

  private async refresh(): Promise<void> {
    this.service.forgetProviders();
    this.providers.refresh();
    await this.service.refreshSandboxes({ now: true });
  }

  /** Start Broker (the stopped broker's notification, view and status menu): starts the daemon. */
  private async startBroker(): Promise<void> {
    const c = await this.service.start();
    this.providers.refresh();
    vscode.window.setStatusBarMessage(`$(vm) abx-broker ${c.serverVersion} started`, 3000);
  }

  private async reconnect(): Promise<void> {
    await this.service.reconnect();
    this.providers.refresh();
    void vscode.window.showInformationMessage(`Connected to abx-broker ${(await this.client()).serverVersion}.`);
  }

  private async showBrokerStatus(): Promise<void> {
    const st = this.service.state;
    const items: { label: string; description?: string; action?: string }[] = [];
    if (st.kind === 'connected') {
      try {
        const s = await (await this.client()).status();
        items.push({
          label: `$(vm) abx-broker ${s.version}`,
          description: `pid ${s.pid} · up ${Math.round(s.uptimeMs / 1000)} s · ${plural(s.connections, 'connection')} · ${plural(s.sandboxes, 'sandbox', 'sandboxes')}`,
        });
        for (const p of s.providers) {
          items.push({
            label: `$(server-process) ${p.id}`,
            description: `${p.kind}${p.running && p.pid ? ` · pid ${p.pid}` : ''} · ${p.inFlight} in flight · ${p.restarts} restarts`,
          });
        }
      } catch (err) {
        items.push({ label: `$(error) ${AbxError.from(err).headline}` });
      }
    } else if (st.kind === 'error') {
      items.push({ label: `$(error) ${st.error.headline}`, description: st.error.suggestion });
    } else if (st.kind === 'stopped') {
      items.push({ label: '$(debug-stop) The abx broker is stopped.' }, { label: '$(play) Start Broker', action: 'abx.startBroker' });
    } else {
      items.push({ label: `$(sync) ${st.kind}` });
    }
    items.push(
      { label: '$(add) Create Sandbox', action: 'abx.create' },
      { label: '$(refresh) Reconnect to Broker', action: 'abx.reconnect' },
      { label: '$(output) Show Log', action: 'abx.showLog' },
      { label: '$(settings-gear) Open Settings', action: 'settings' },
    );
    const pick = await vscode.window.showQuickPick(items, { placeHolder: 'abx broker' });
    if (pick?.action === 'settings') await vscode.commands.executeCommand('workbench.action.openSettings', '@ext:abx.abx-broker');
    else if (pick?.action) await vscode.commands.executeCommand(pick.action);
  }

  // ------------------------------------------------------------ sandboxes

  /**
   * Create Sandbox: provider, template, then the network (providers with `network.vpc`:
   * `none`, only these hosts, `internet`, `host`). `networkArg` (a mode or `{allow}`) skips
   * that question.
   */
  private async create(arg?: Arg, networkArg?: unknown): Promise<Sandbox | undefined> {
    const provider = await this.pickProvider(
      arg && typeof arg === 'object' && 'kind' in arg && arg.kind === 'group' ? arg.provider : arg,
      'Create a sandbox with which provider?',
      'sandbox.lifecycle',
    );
    if (!provider) return undefined;
    const template = await this.pickTemplate(provider);
    if (template === undefined) return undefined;
    const network = await pickNetwork(provider.features, networkArg);
    if (network === undefined) return undefined;
    const timeout = this.service.settings.defaultTimeout;
    const sb = await vscode.window.withProgress(
      { location: vscode.ProgressLocation.Notification, title: `Creating a ${provider.id} sandbox…` },
      async () =>
        (await this.client()).sandboxCreate({
          provider: provider.id,
          template: template || undefined,
          timeout,
          ...(network === null ? {} : { network: network as never }),
        }),
    );
    await this.service.refreshSandboxes();
    const ref = sandboxRef(sb);
    // Only what the provider can do: a terminal needs `pty`.
    const offer = provider.features.includes('pty') ? ['Open Terminal', 'Browse Files'] : ['Browse Files'];
    void vscode.window.showInformationMessage(`Sandbox ${ref} created (${sb.template ?? 'default template'}, ${formatExpiry(sb.expiresAt)})${networkNote(network)}.`, ...offer).then((pick) => {
      if (pick === 'Open Terminal') void vscode.commands.executeCommand('abx.openTerminal', ref);
      if (pick === 'Browse Files') void vscode.commands.executeCommand('abx.browseFiles', ref);
    });
    return sb;
  }

  /** '' means the provider's default; undefined means cancelled. */
  private async pickTemplate(provider: ProviderSummary): Promise<string | undefined> {
    const preset = this.service.settings.defaultTemplate;
    if (provider.features.includes('templates.read')) {
      try {
        const raw = await (await this.client()).templatesList(provider.id);
        const names = templateNames(raw);
        if (names.length) {
          const items = [
            { label: '$(star) Default', description: "the provider's default template", value: '' },
            ...names.map((n) => ({ label: n, description: n === preset ? 'abx.defaultTemplate' : undefined, value: n })),
          ];
          const picked = await vscode.window.showQuickPick(items, { placeHolder: `Template for the ${provider.id} sandbox` });
          return picked?.value;
        }
      } catch (err) {
        this.service.log(`templates/list ${provider.id}: ${AbxError.from(err).headline}`);
      }
    }
    return vscode.window.showInputBox({
      title: `Template for the ${provider.id} sandbox`,
      prompt: "A template name, or empty for the provider's default",
      value: preset,
      placeHolder: provider.id === 'local' ? 'base' : 'default',
    });
  }

  private async kill(arg?: Arg): Promise<void> {
    const sb = await this.pickSandbox(arg, 'Kill which sandbox?');
    if (!sb) return;
    const ok = await vscode.window.showWarningMessage(
      `Kill sandbox ${sb}?`,
      {
        modal: true,
        detail: 'Its processes are stopped and its files are deleted. Its editors, its folder in this window and its terminals close too.',
      },
      'Kill',
    );
    if (ok !== 'Kill') return;
    const r = await (await this.client()).sandboxKill(sb);
    await this.service.refreshSandboxes();
    await this.sandboxGone(sb);
    void vscode.window.showInformationMessage(r.killed ? `Sandbox ${sb} killed.` : `Sandbox ${sb} was already gone.`);
  }

  /** A sandbox is gone: its editors close and its workspace folder goes. */
  private async closeSandboxViews(sb: string): Promise<void> {
    // Opened as `provider:id` (from the views) or as the bare id (typed).
    const bare = sb.slice(sb.indexOf(':') + 1);
    const authorities = new Set([encodeAuthority(sb), encodeAuthority(bare)]);
    const mine = (u: vscode.Uri | undefined) => u?.scheme === SCHEME && authorities.has(u.authority);
    try {
      const tabs = (vscode.window.tabGroups?.all ?? []).flatMap((g) =>
        g.tabs.filter((t) => {
          const input = t.input as { uri?: vscode.Uri; original?: vscode.Uri; modified?: vscode.Uri } | undefined;
          return mine(input?.uri) || mine(input?.original) || mine(input?.modified);
        }),
      );
      // Its files are gone with it.
      if (tabs.length) await vscode.window.tabGroups.close(tabs, true);
    } catch (err) {
      this.service.log(`closing the editors of ${sb}: ${AbxError.from(err).headline}`);
    }
    const folders = vscode.workspace.workspaceFolders ?? [];
    const idx = folders.map((f, i) => (mine(f.uri) ? i : -1)).filter((i) => i >= 0);
    if (!idx.length) return;
    if (idx[0] === 0) {
      // The window's first folder: removing it restarts the extension host; let the user choose.
      void vscode.window
        .showInformationMessage(`This window's folder belonged to sandbox ${sb}, which is gone.`, 'Close Folder')
        .then((pick) => pick && vscode.commands.executeCommand('workbench.action.closeFolder'));
      return;
    }
    // One call (VS Code refuses a second before the first is applied), decided when the
    // changes before it are applied: the run from the first match, when the sandbox's
    // folders sit together (they do unless added by hand).
    await this.changeFolders(() => {
      const now = (vscode.workspace.workspaceFolders ?? []).map((f, i) => (mine(f.uri) ? i : -1)).filter((i) => i >= 0);
      if (!now.length || now[0] === 0) return undefined;
      let n = 1;
      while (now[n] === now[0] + n) n++;
      return [now[0], n];
    });
  }

  private async pause(arg?: Arg): Promise<void> {
    const sb = await this.pickSandbox(arg, 'Pause which sandbox?', 'running');
    if (!sb) return;
    await (await this.client()).sandboxPause(sb);
    await this.service.refreshSandboxes();
  }

  private async resume(arg?: Arg): Promise<void> {
    const sb = await this.pickSandbox(arg, 'Resume which sandbox?', 'paused');
    if (!sb) return;
    await (await this.client()).sandboxResume(sb);
    await this.service.refreshSandboxes();
  }

  private async extendTimeout(arg?: Arg): Promise<void> {
    const sb = await this.pickSandbox(arg, 'Extend the lifetime of which sandbox?');
    if (!sb) return;
    const text = await vscode.window.showInputBox({
      title: `Lifetime of ${sb}`,
      prompt: 'The sandbox ends this long from now: seconds, or 90s, 10m, 2h, 1d',
      value: String(this.service.settings.defaultTimeout),
      validateInput: (v) => (parseDuration(v) ? undefined : 'A duration between 1 s and 30 days, e.g. 600, 10m, 2h'),
    });
    if (text === undefined) return;
    const secs = parseDuration(text);
    if (!secs) return;
    const s = await (await this.client()).sandboxSetTimeout(sb, secs);
    await this.service.refreshSandboxes();
    void vscode.window.showInformationMessage(`Sandbox ${sb} now ${formatExpiry(s.expiresAt)}.`);
  }

  private async runCommand(arg?: Arg, command?: unknown): Promise<number | null | undefined> {
    const sb = await this.pickSandbox(arg, 'Run a command in which sandbox?', 'running');
    if (!sb) return undefined;
    const cmd =
      typeof command === 'string'
        ? command
        : await vscode.window.showInputBox({
            title: `Run in ${sb}`,
            prompt: 'A shell command (run with sh -c in /workspace); output goes to the "abx: Run" channel',
            value: this.lastCommand,
          });
    if (!cmd) return undefined;
    this.lastCommand = cmd;
    this.run ??= vscode.window.createOutputChannel('abx: Run');
    const out = this.run;
    out.show(true);
    out.appendLine(`$ ${cmd}    [${sb}]`);
    const client = await this.client();
    return vscode.window.withProgress(
      { location: vscode.ProgressLocation.Notification, title: `Running '${cmd}' in ${sb}`, cancellable: true },
      async (_progress, token) => {
        // stdin '' : closed at once, so a command that reads it ends instead of waiting.
        const session = await client.execStart({ sandbox: sb, command: cmd, stdin: '' }, { onOutput: (c) => out.append(c.text) });
        const sub = token.onCancellationRequested(() => void session.kill('TERM').catch(() => undefined));
        // The window goes: the command goes with it.
        const onShutdown = this.service.onShutdown(async () => {
          if (!session.done) await session.kill('TERM').catch(() => undefined);
        });
        try {
          const exit = await session.exited;
          const how = exit.timedOut ? ' (timed out)' : exit.signal ? ` (${exit.signal})` : '';
          out.appendLine(`[exit ${exit.exitCode}${how}]`);
          if (exit.exitCode !== 0 && !token.isCancellationRequested) {
            void vscode.window.showWarningMessage(`'${cmd}' exited with code ${exit.exitCode}${how}.`);
          }
          return exit.exitCode;
        } finally {
          sub.dispose();
          onShutdown.dispose();
        }
      },
    );
  }

  private async openTerminal(arg?: Arg): Promise<vscode.Terminal | undefined> {
    const sb = await this.pickSandbox(arg, 'Open a terminal in which sandbox?', 'running');
    if (!sb) return undefined;
    await this.requireFeature(sb, 'pty', 'a terminal');
    // From the explorer: start in the folder (or the file's folder) that was clicked.
    let cwd: string | undefined;
    if (arg instanceof vscode.Uri && arg.scheme === SCHEME) {
      const p = parseSandboxUri(arg).path;
      if (p !== '/') {
        const st = await (await this.client()).filesStat(sb, p).catch(() => undefined);
        cwd = st?.type === 'directory' ? p : path.posix.dirname(p);
      }
    }
    const pty = new AbxTerminal(() => this.client(), { sandbox: sb, cwd, command: this.service.settings.terminalCommand || undefined });
    const term = vscode.window.createTerminal({ name: `abx: ${sb}`, pty, iconPath: new vscode.ThemeIcon('vm') });
    const open = this.terminals.get(sb) ?? new Set<vscode.Terminal>();
    this.terminals.set(sb, open.add(term));
    // The terminal goes (closed, or lost with the window): its command in the sandbox ends
    // too, instead of running on with nobody attached.
    const subs = [
      // Shutdown: a short grace (VS Code does not wait long), then SIGKILL.
      this.service.onShutdown(() => pty.hangUp(300)),
      vscode.window.onDidCloseTerminal((t) => {
        if (t !== term) return;
        void pty.hangUp();
        open.delete(term);
      }),
    ];
    void pty.exited.then(() => subs.forEach((d) => d.dispose()));
    term.show();
    return term;
  }

  /** Throws E8004 when the sandbox's provider does not declare `feature`. */
  private async requireFeature(sb: string, feature: string, what: string): Promise<void> {
    const provider = sb.includes(':') ? sb.slice(0, sb.indexOf(':')) : undefined;
    let features = provider ? this.service.providerFeatures(provider) : undefined;
    if (provider && !features) {
      features = (await (await this.client()).providerList()).find((p) => p.id === provider)?.features;
    }
    if (features && !features.includes(feature)) {
      throw new AbxError('E8004', `Provider '${provider}' does not support '${feature}', which ${what} needs.`, {
        suggestion: "Use 'Run Command in Sandbox' for commands, or a provider with that feature ('abx provider list').",
      });
    }
  }

  private async upload(arg?: Arg, localArg?: unknown): Promise<void> {
    const sb = await this.pickSandbox(arg, 'Upload to which sandbox?');
    if (!sb) return;
    let local = localArg instanceof vscode.Uri ? localArg : undefined;
    if (!local) {
      const picked = await vscode.window.showOpenDialog({ canSelectMany: false, openLabel: 'Upload' });
      local = picked?.[0];
    }
    if (!local) return;
    const dir = arg instanceof vscode.Uri && arg.scheme === SCHEME ? parseSandboxUri(arg).path : '/workspace';
    const remote = await vscode.window.showInputBox({
      title: `Upload ${path.basename(local.fsPath)} to ${sb}`,
      prompt: 'Path in the sandbox (under /workspace or /tmp)',
      value: `${dir === '/' ? '/workspace' : dir}/${path.basename(local.fsPath)}`,
    });
    if (!remote) return;
    const r = await this.transfer('Uploading', (c, onProgress, token) => c.filesUpload(sb, local!.fsPath, remote, onProgress, token));
    void vscode.window.showInformationMessage(`Uploaded ${local.fsPath} -> ${sb}:${remote} (${r.size} bytes).`);
  }

  private async download(arg?: Arg, localArg?: unknown): Promise<void> {
    const sb = await this.pickSandbox(arg, 'Download from which sandbox?');
    if (!sb) return;
    let remote: string | undefined = arg instanceof vscode.Uri && arg.scheme === SCHEME ? parseSandboxUri(arg).path : undefined;
    if (!remote || remote === '/') {
      // A file picker on the sandbox's files (the abx: file system).
      const picked = await vscode.window.showOpenDialog({
        title: `Download from ${sb}`,
        defaultUri: sandboxUri(sb, remote === '/' ? '/' : '/workspace'),
        canSelectFiles: true,
        canSelectFolders: false,
        canSelectMany: false,
        openLabel: 'Download',
      });
      const u = picked?.[0];
      if (!u) return;
      if (u.scheme !== SCHEME || parseSandboxUri(u).sandbox !== sb) {
        throw new AbxError('E4001', `${u.toString(true)} is not a file of sandbox ${sb}.`, { suggestion: `Pick a file under abx://${encodeAuthority(sb)}/workspace.` });
      }
      remote = parseSandboxUri(u).path;
    }
    if (!remote) return;
    let local = localArg instanceof vscode.Uri ? localArg : undefined;
    if (!local) {
      local = await vscode.window.showSaveDialog({ saveLabel: 'Download', defaultUri: vscode.Uri.file(path.join(os.homedir(), path.basename(remote))) });
    }
    if (!local) return;
    const r = await this.transfer('Downloading', (c, onProgress, token) => c.filesDownload(sb, remote!, local!.fsPath, onProgress, token));
    void vscode.window.showInformationMessage(`Downloaded ${sb}:${remote} -> ${local.fsPath} (${r.size} bytes).`);
  }

  private transfer<T>(
    verb: string,
    f: (c: BrokerClient, onProgress: (p: { bytes: number; total: number; path: string }) => void, token: vscode.CancellationToken) => Promise<T>,
  ): Thenable<T> {
    return vscode.window.withProgress(
      { location: vscode.ProgressLocation.Notification, title: verb, cancellable: true },
      async (progress, token) => {
        let last = 0;
        return f(
          await this.client(),
          (p) => {
            if (!p.total) return;
            const pct = (p.bytes / p.total) * 100;
            progress.report({ increment: pct - last, message: `${p.path}: ${p.bytes} / ${p.total} bytes` });
            last = pct;
          },
          token,
        );
      },
    );
  }

  private async openPort(arg?: Arg, portArg?: unknown): Promise<string | undefined> {
    const sb = await this.pickSandbox(arg, 'Open a port of which sandbox?', 'running');
    if (!sb) return undefined;
    const text =
      typeof portArg === 'number'
        ? String(portArg)
        : await vscode.window.showInputBox({
            title: `Open a port of ${sb}`,
            prompt: 'Port number a server in the sandbox listens on',
            validateInput: (v) => (parsePort(v) ? undefined : 'A port number between 1 and 65535'),
          });
    const port = text === undefined ? undefined : parsePort(text);
    if (!port) return undefined;
    const u = await (await this.client()).portsUrl(sb, port);
    const headers = Object.entries(u.headers ?? {});
    await vscode.env.openExternal(vscode.Uri.parse(u.url));
    if (headers.length) {
      const list = headers.map(([k]) => k).join(', ');
      const pick = await vscode.window.showInformationMessage(
        `Opened ${u.url}. The provider requires these request headers: ${list}.`,
        'Copy Headers',
      );
      if (pick === 'Copy Headers') await vscode.env.clipboard.writeText(headers.map(([k, v]) => `${k}: ${v}`).join('\n'));
    }
    return u.url;
  }

  private async browseFiles(arg?: Arg): Promise<vscode.Uri | undefined> {
    const sb = await this.pickSandbox(arg, 'Browse the files of which sandbox?');
    if (!sb) return undefined;
    const uri = sandboxUri(sb, '/workspace');
    const folders = vscode.workspace.workspaceFolders ?? [];
    if (!folders.some((f) => f.uri.toString() === uri.toString())) {
      // A window that is not a multi-root workspace (no folder, or a single folder) cannot
      // take a folder in place: VS Code makes it an untitled workspace and restarts the
      // extension host, and in code-server that path left an empty "Untitled (Workspace)"
      // in 3 of 8 runs (issue 45). Such a window is only changed when the user says so,
      // and then by opening a workspace file written first (both folders, the sandbox's
      // named after it): one ordinary reload into a workspace that is complete on disk.
      if (!vscode.workspace.workspaceFile) {
        const pick = await vscode.window.showInformationMessage(
          `Open the files of ${sb}`,
          {
            modal: true,
            detail:
              'A new window keeps this one as it is. Adding the folder to this window reopens it as a multi-root workspace: VS Code restarts its extensions and the terminals of this window are lost.',
          },
          'Open in New Window',
          'Add to This Window',
        );
        if (pick === 'Open in New Window') {
          await this.openWorkspaceFile(sb, [{ name: sandboxFolderName(sb), uri }], true);
          return uri;
        }
        if (pick !== 'Add to This Window') return undefined;
        await this.openWorkspaceFile(sb, [...folders.map((f) => ({ name: f.name, uri: f.uri })), { name: sandboxFolderName(sb), uri }], false);
        return uri;
      }
      // A workspace takes the folder in place (no restart); one change at a time, each
      // applied (onDidChangeWorkspaceFolders) before the next.
      await this.changeFolders(() => {
        const now = vscode.workspace.workspaceFolders ?? [];
        // Added meanwhile (a second click): nothing to do.
        return now.some((f) => f.uri.toString() === uri.toString()) ? undefined : [now.length, 0, { uri, name: sandboxFolderName(sb) }];
      });
    }
    await vscode.commands.executeCommand('workbench.view.explorer');
    return uri;
  }

  /**
   * updateWorkspaceFolders, after the previous one was applied, and resolved once VS Code
   * applied this one (or it was refused): VS Code refuses a second call before the first is
   * applied.
   */
  changeFolders(change: () => [number, number, ...{ uri: vscode.Uri; name?: string }[]] | undefined): Promise<void> {
    const run = async (): Promise<void> => {
      // Decided when it runs: the folders as the previous change left them.
      const args = change();
      if (!args) return;
      const [start, deleteCount, ...add] = args;
      let sub: vscode.Disposable | undefined;
      const applied = new Promise<void>((resolve) => {
        sub = vscode.workspace.onDidChangeWorkspaceFolders?.(() => resolve());
        setTimeout(resolve, 5000).unref?.();
      });
      try {
        if (!vscode.workspace.updateWorkspaceFolders(start, deleteCount, ...add)) return;
        if (sub) await applied;
      } finally {
        sub?.dispose();
      }
    };
    const next = this.folderChange.then(run, run);
    this.folderChange = next.catch(() => undefined);
    return next;
  }

  /**
   * Writes a `.code-workspace` file with `folders` (whole, before anything opens it) and
   * opens it: in a new window, or in this one (a reload into that workspace).
   */
  private async openWorkspaceFile(sb: string, folders: { name: string; uri: vscode.Uri }[], newWindow: boolean): Promise<vscode.Uri> {
    const dir = path.join(this.workspaceDir ?? path.join(os.tmpdir(), `abx-vscode-${os.userInfo().uid}`), 'workspaces');
    fs.mkdirSync(dir, { recursive: true });
    const base = `${sb.replace(/[^A-Za-z0-9._-]+/g, '-')}${newWindow ? '' : `-with-${folders.length - 1}`}`;
    const file = path.join(dir, `${base}.code-workspace`);
    const entries = folders.map((f) =>
      // This machine's folders by path (resolved where the workspace file is, also in a
      // remote window); the sandbox's by its abx: URI.
      f.uri.scheme === 'file' ? { name: f.name, path: f.uri.fsPath } : { name: f.name, uri: f.uri.toString() },
    );
    const tmp = `${file}.${process.pid}.tmp`;
    fs.writeFileSync(tmp, JSON.stringify({ folders: entries, settings: {} }, null, 2) + '\n');
    fs.renameSync(tmp, file);
    const ws = vscode.Uri.file(file);
    this.service.log(`opening ${file} (${entries.length} folder${entries.length === 1 ? '' : 's'})${newWindow ? ' in a new window' : ' in this window'}`);
    // This window reloads into the file: a marker beside it lets the extension of the
    // reloaded window check that the folders arrived (healOpenedWorkspace).
    if (!newWindow) fs.writeFileSync(`${file}${OPENING}`, JSON.stringify({ at: Date.now(), folders: entries.length }) + '\n');
    await vscode.commands.executeCommand('vscode.openFolder', ws, newWindow ? { forceNewWindow: true } : { forceReuseWindow: true });
    return ws;
  }

  /**
   * In a window that "Add to This Window" just reloaded into one of our workspace files: when
   * its folders have not arrived once VS Code settled, reload it once more.
   *
   * Why (issue 45 item 12, seen in code-server 4.139 in about half of the first Adds after a
   * fresh start): the first time a window opens a remote workspace file, VS Code starts it
   * from its (empty) configuration cache and reads the file once the remote file system is
   * there; in those runs that read never came, and the window stayed "No Folder Opened" under
   * the workspace's title until a reload (then the cache has the folders). The marker is
   * removed first, so a window reloads at most once per Add. Returns whether it reloaded.
   */
  async healOpenedWorkspace(settleMs = healSettle.ms): Promise<boolean> {
    const wf = vscode.workspace.workspaceFile;
    if (!wf || (wf.scheme !== 'file' && wf.scheme !== 'vscode-remote')) return false;
    const marker = `${wf.path}${OPENING}`;
    let opened: { at?: number; folders?: number };
    try {
      opened = JSON.parse(fs.readFileSync(marker, 'utf8'));
    } catch {
      return false;
    }
    fs.rmSync(marker, { force: true });
    const has = () => (vscode.workspace.workspaceFolders?.length ?? 0) > 0;
    if (!opened.folders || Date.now() - (opened.at ?? 0) > 10 * 60_000 || has()) return false;
    await new Promise<void>((resolve) => {
      const sub = vscode.workspace.onDidChangeWorkspaceFolders?.(() => has() && done());
      const timer = setTimeout(() => done(), settleMs);
      function done() {
        clearTimeout(timer);
        sub?.dispose();
        resolve();
      }
    });
    if (has()) return false;
    this.service.log(`${wf.path} opened without its ${opened.folders} folders (VS Code did not read the workspace file); reloading the window once`);
    await vscode.commands.executeCommand('workbench.action.reloadWindow');
    return true;
  }

  private async sandboxInfo(arg?: Arg): Promise<void> {
    const sb = await this.pickSandbox(arg, 'Show which sandbox?');
    if (!sb) return;
    const c = await this.client();
    const [info, caps, sys] = await Promise.all([
      c.sandboxInfo(sb),
      c.sandboxCapabilities(sb).catch((e) => ({ error: AbxError.from(e).headline })),
      c.sandboxSystemInfo(sb).catch((e) => ({ error: AbxError.from(e).headline })),
    ]);
    await this.documents.show(`sandbox ${sb}.json`, JSON.stringify({ sandbox: info, capabilities: caps, systemInfo: sys }, null, 2) + '\n');
  }

  private async copySandboxId(arg?: Arg): Promise<void> {
    const sb = await this.pickSandbox(arg, 'Copy the id of which sandbox?');
    if (!sb) return;
    await vscode.env.clipboard.writeText(sb);
    vscode.window.setStatusBarMessage(`$(copy) Copied ${sb}`, 3000);
  }

  // ------------------------------------------------------------ providers

  /**
   * Install with a review step: a dry run first (nothing written), its plan shown, then the
   * install on confirmation, pinned to the digest that was reviewed.
   */
  private async installProvider(arg?: Arg, opts?: unknown): Promise<InstallPlan | undefined> {
    const given = (opts && typeof opts === 'object' ? opts : {}) as Partial<InstallParams>;
    const source =
      (typeof arg === 'string' && arg) ||
      (await vscode.window.showInputBox({
        title: 'Install an abx provider (1/2)',
        prompt: 'A local directory, a git URL (https://...) or a .tar.gz URL',
        placeHolder: 'https://github.com/org/abx-provider-x.git',
        ignoreFocusOut: true,
      }));
    if (!source) return undefined;
    const params: InstallParams = { source, ...given };
    if (given.ref === undefined && /^(https?|file|ssh|git):\/\/|\.git$|^git@/.test(source) && !/\.tar\.gz$|\.tgz$/.test(source)) {
      const ref = await vscode.window.showInputBox({
        title: 'Install an abx provider (2/2)',
        prompt: 'Ref: a full commit id pins the provider; a branch or tag is a moving ref (unpinned). Empty: the default branch (unpinned).',
        ignoreFocusOut: true,
      });
      if (ref === undefined) return undefined;
      if (ref) params.ref = ref;
    }
    const client = await this.client();
    let plan: InstallPlan | undefined;
    for (let attempt = 0; attempt < 3 && !plan; attempt++) {
      try {
        plan = await vscode.window.withProgress(
          { location: vscode.ProgressLocation.Notification, title: `Fetching ${source} for review…` },
          () => client.providerInstall({ ...params, dryRun: true, confirm: false }),
        );
      } catch (err) {
        const e = AbxError.from(err);
        const text = `${e.message} ${e.suggestion ?? ''}`;
        if (e.abx === 'E8012' && /insecure/i.test(text) && !params.allowInsecureTransport) {
          const ok = await vscode.window.showWarningMessage(
            `${e.headline}`,
            { modal: true, detail: 'file:// and http:// sources are not authenticated: anyone on the way can change what you install.' },
            'Allow Insecure Transport',
          );
          if (ok !== 'Allow Insecure Transport') return undefined;
          params.allowInsecureTransport = true;
          continue;
        }
        if (e.abx === 'E8012' && /unpinned|moving/i.test(text) && !params.allowUnpinned) {
          params.allowUnpinned = true;
          continue;
        }
        throw e;
      }
    }
    if (!plan) return undefined;
    // The plan, read-only in an editor (it stays open to read after the question), and
    // the same plan in the question itself: a modal dialog covers the editor and blocks
    // scrolling it, so what the user confirms is in the dialog.
    await this.documents.show(`install ${plan.id} ${plan.version}.md`, formatPlan(plan));
    const unpinned = plan.trust === 'unpinned';
    const choice = await vscode.window.showWarningMessage(
      `Install provider '${plan.id}' ${plan.version} (${plan.trust})?`,
      {
        modal: true,
        // The plan without its title line: the message above is that line already.
        detail: formatPlanText(plan).replace(/^[^\n]*\n+/, '') + (unpinned ? '\nThis is a moving ref: the provider is not pinned to a commit.' : ''),
      },
      'Install',
    );
    if (choice !== 'Install') return undefined;
    const install: InstallParams = { ...params, confirm: true, dryRun: false, sha256: plan.digest };
    if (unpinned) install.allowUnpinned = true;
    let done: InstallPlan;
    try {
      done = await vscode.window.withProgress(
        { location: vscode.ProgressLocation.Notification, title: `Installing provider '${plan.id}'…` },
        () => client.providerInstall(install),
      );
    } catch (err) {
      const e = AbxError.from(err);
      if (e.abx !== 'E8015') throw e;
      const again = await vscode.window.showWarningMessage(
        `Provider '${plan.id}' is already installed. Replace it with ${plan.version}?`,
        { modal: true },
        'Replace',
      );
      if (again !== 'Replace') return undefined;
      done = await client.providerInstall({ ...install, replace: true });
    }
    this.providers.refresh();
    this.service.forgetProviders();
    void vscode.window
      .showInformationMessage(`Installed provider '${done.id}' ${done.version} (${done.trust}).`, 'Run Doctor', 'Run Contract Kit')
      .then((pick) => {
        if (pick === 'Run Doctor') void vscode.commands.executeCommand('abx.providerDoctor', done.id);
        if (pick === 'Run Contract Kit') void vscode.commands.executeCommand('abx.runContractKit', done.id);
      });
    return done;
  }

  private async runContractKit(arg?: Arg, filterArg?: unknown): Promise<TestResult | undefined> {
    const p = await this.pickProvider(arg, 'Run the contract kit against which provider?');
    if (!p) return undefined;
    const filter = typeof filterArg === 'string' ? filterArg : undefined;
    this.kit ??= vscode.window.createOutputChannel('abx: Contract Kit');
    const out = this.kit;
    out.show(true);
    out.appendLine(`Contract kit: ${p.id} ${p.version}${filter ? ` (filter '${filter}')` : ''}`);
    const client = await this.client();
    const r = await vscode.window.withProgress(
      { location: vscode.ProgressLocation.Notification, title: `Contract kit: ${p.id}`, cancellable: true },
      async (progress, token) => {
        let passed = 0;
        let failed = 0;
        let skipped = 0;
        return client.providerTest(
          p.id,
          {
            filter,
            onResult: (n) => {
              if (n.outcome === 'passed') passed++;
              else if (n.outcome === 'failed') failed++;
              else skipped++;
              const mark = n.outcome === 'passed' ? '✓' : n.outcome === 'failed' ? '✗' : '-';
              out.appendLine(`  ${mark} ${n.name} (${n.durationMs} ms)${n.detail ? `: ${n.detail}` : ''}`);
              progress.report({ message: `${passed} passed, ${failed} failed, ${skipped} skipped` });
            },
          },
          token,
        );
      },
    );
    out.appendLine(`${r.passed} passed, ${r.failed} failed, ${r.skipped} skipped`);
    const text = `Contract kit on '${p.id}': ${r.passed} passed, ${r.failed} failed, ${r.skipped} skipped.`;
    const show = r.failed ? vscode.window.showErrorMessage(text, 'Show Output') : vscode.window.showInformationMessage(text, 'Show Output');
    void show.then((pick) => pick && out.show());
    return r;
  }

  private async providerDoctor(arg?: Arg): Promise<void> {
    const p = await this.pickProvider(arg, 'Check which provider?');
    if (!p) return;
    const client = await this.client();
    const r = await client.providerDoctor(p.id).catch((e) => AbxError.from(e));
    this.providers.setDoctor(p.id, r);
    if (r instanceof AbxError) throw r;
    const bad = r.checks.filter((c) => !c.ok);
    if (bad.length) {
      void vscode.window.showErrorMessage(`Provider '${p.id}': ${bad.map((c) => `${c.name}: ${c.detail ?? 'failed'}`).join('; ')}`);
    } else {
      void vscode.window.showInformationMessage(`Provider '${p.id}': all ${r.checks.length} checks passed.`);
    }
  }

  private async setDefaultProvider(arg?: Arg): Promise<void> {
    const p = await this.pickProvider(arg, 'Make which provider the default?', 'sandbox.lifecycle');
    if (!p) return;
    await (await this.client()).providerSetDefault(p.id);
    this.providers.refresh();
  }
}
