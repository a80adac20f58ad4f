// Entry point: the views, the commands, the abx: file system, the status bar and the MCP
// server registration, all on one broker connection (AbxService).
import * as vscode from 'vscode';
import { AbxFileSystemProvider } from './adapters/fs';
import { registerCode } from './code';
import { registerTemplates } from './templates';
import { Commands, showError } from './commands';
import { AbxError } from './client/errors';
import { SCHEME } from './client/uri';
import { AbxDocuments, DOC_SCHEME } from './documents';
import { createStatusBar } from './statusbar';
import { registerMcp } from './mcp';
import { Network } from './network';
import { AbxService } from './service';
import { ProvidersProvider, SandboxesProvider } from './views';
import { ChangesProvider, registerWorkspace, SandboxContent } from './workspace';

export interface AbxExtensionApi {
  service: AbxService;
  commands: Commands;
  fs: AbxFileSystemProvider;
  sandboxes: SandboxesProvider;
  providers: ProvidersProvider;
  documents: AbxDocuments;
  /** The Sandbox Changes view and the `abx-sandbox:` documents (issue 43). */
  changes: ChangesProvider;
  sandboxContent: SandboxContent;
  /** Network policies: `sandbox/blocked` notifications and Allow Host (issue 44). */
  network: Network;
}

/** The running extension's service: deactivate() shuts it down. */
let current: AbxService | undefined;

/** Runs `dispose` and swallows what it throws: one failing part must not stop the others. */
function safely(d: { dispose(): unknown }, log: (l: string) => void): void {
  try {
    d.dispose();
  } catch (err) {
    log(`dispose: ${(err as Error)?.message ?? err}`);
  }
}

export function activate(context: vscode.ExtensionContext): AbxExtensionApi {
  // The abx: file system first, before anything else can fail or wait: a window with an
  // abx: folder resolves it as soon as the extension is activated (`onFileSystem:abx`), and
  // a scheme without a provider then logs "no file system provider" errors. It connects on
  // its first request.
  let service: AbxService | undefined;
  const pending: string[] = [];
  const fs = new AbxFileSystemProvider(
    () => (service ? service.getClient() : Promise.reject(new AbxError('E1007', 'The abx extension is starting.'))),
    (l) => (service ? service.log(l) : pending.push(l)),
  );
  const fsRegistration = vscode.workspace.registerFileSystemProvider(SCHEME, fs, { isCaseSensitive: true });
  const version = String((context.extension?.packageJSON as { version?: string } | undefined)?.version ?? '0.0.0');
  const output = vscode.window.createOutputChannel('abx');
  service = new AbxService(output, version);
  current = service;
  for (const l of pending.splice(0)) service.log(l);
  // VS Code disposes context.subscriptions in order; the parts go in the reverse order of
  // their creation: the UI first, then the connection (which ends what this window started
  // in sandboxes), the output channel last, so the shutdown can still log.
  const parts: { dispose(): unknown }[] = [];
  const svc = service;
  context.subscriptions.push(
    new vscode.Disposable(() => {
      for (const d of parts.splice(0).reverse()) safely(d, (l) => svc.log(l));
      safely(svc, () => undefined);
      safely(output, () => undefined);
      if (current === svc) current = undefined;
    }),
  );
  parts.push(fsRegistration);
  const documents = new AbxDocuments();
  parts.push(documents, vscode.workspace.registerTextDocumentContentProvider(DOC_SCHEME, documents));

  const sandboxes = new SandboxesProvider(service);
  const sandboxView = vscode.window.createTreeView('abx.sandboxes', { treeDataProvider: sandboxes, showCollapseAll: true });
  sandboxes.view = sandboxView;
  const providers = new ProvidersProvider(service);
  const providerView = vscode.window.createTreeView('abx.providers', { treeDataProvider: providers });
  providers.view = providerView;
  parts.push(sandboxes, sandboxView, providerView);

  const commands = new Commands(service, sandboxes, providers, documents);
  // The `.code-workspace` files of sandbox windows (Browse Files).
  commands.workspaceDir = context.globalStorageUri?.fsPath;
  parts.push(...commands.register());
  // A window "Add to This Window" reloaded into a workspace file: check its folders arrived.
  commands.healing = commands.healOpenedWorkspace().catch((e) => {
    service.log(`checking the opened workspace: ${AbxError.from(e).headline}`);
    return false;
  });
  parts.push(...registerCode(service, commands));
  parts.push(...registerTemplates(service, (err) => showError(err, service)));
  const network = new Network(service);
  parts.push(network, ...network.register());
  const workspace = registerWorkspace(service, documents, (err) => showError(err, service));
  parts.push(...workspace.disposables);
  parts.push(createStatusBar(service));

  const mcp = registerMcp(service, version);
  if (mcp) parts.push(mcp);

  parts.push(
    vscode.workspace.onDidChangeConfiguration(async (e) => {
      if (!e.affectsConfiguration('abx')) return;
      await service.settingsChanged();
      mcp?.refresh();
    }),
  );

  // A missing or too old abx is said once, with the fix, when the extension starts; the
  // service then retries on a backoff schedule and on every settings change.
  if (service.settings.connectOnStartup) {
    service.getClient().then(
      () => service.refreshSandboxes(),
      (err) => showError(err, service, 'abx'),
    );
  }

  return { service, commands, fs, sandboxes, providers, documents, changes: workspace.changes, sandboxContent: workspace.content, network };
}

/**
 * VS Code calls this first on shutdown and waits (a few seconds) for the promise, then
 * disposes the subscriptions: terminals end their commands in the sandboxes, then the
 * connection closes and `abx rpc` exits.
 */
export function deactivate(): Thenable<void> | undefined {
  return current?.shutdown();
}
