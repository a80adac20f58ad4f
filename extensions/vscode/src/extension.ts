// Entry point: the views, the commands, the abx: file system, the status bar and the MCP
// server registration, all on one broker connection (AbxService).
import * as vscode from 'vscode';
import { AbxFileSystemProvider } from './adapters/fs';
import { Commands, showError } from './commands';
import { SCHEME } from './client/uri';
import { createStatusBar } from './statusbar';
import { registerMcp } from './mcp';
import { AbxService } from './service';
import { ProvidersProvider, SandboxesProvider } from './views';

export interface AbxExtensionApi {
  service: AbxService;
  commands: Commands;
  fs: AbxFileSystemProvider;
  sandboxes: SandboxesProvider;
  providers: ProvidersProvider;
}

export function activate(context: vscode.ExtensionContext): AbxExtensionApi {
  const version = String((context.extension?.packageJSON as { version?: string } | undefined)?.version ?? '0.0.0');
  const output = vscode.window.createOutputChannel('abx');
  const service = new AbxService(output, version);
  context.subscriptions.push(output, service);

  const fs = new AbxFileSystemProvider(
    () => service.getClient(),
    (l) => service.log(l),
  );
  context.subscriptions.push(vscode.workspace.registerFileSystemProvider(SCHEME, fs, { isCaseSensitive: true }));

  const sandboxes = new SandboxesProvider(service);
  const sandboxView = vscode.window.createTreeView('abx.sandboxes', { treeDataProvider: sandboxes, showCollapseAll: true });
  sandboxes.view = sandboxView;
  const providers = new ProvidersProvider(service);
  const providerView = vscode.window.createTreeView('abx.providers', { treeDataProvider: providers });
  providers.view = providerView;
  context.subscriptions.push(sandboxView, providerView);

  const commands = new Commands(service, sandboxes, providers);
  context.subscriptions.push(...commands.register());
  context.subscriptions.push(createStatusBar(service));

  const mcp = registerMcp(service, version);
  if (mcp) context.subscriptions.push(mcp);

  context.subscriptions.push(
    vscode.workspace.onDidChangeConfiguration(async (e) => {
      if (!e.affectsConfiguration('abx')) return;
      await service.settingsChanged();
      mcp?.refresh();
    }),
  );

  // A missing or too old abx is said once, with the fix, when the extension starts.
  if (service.settings.connectOnStartup) {
    service.getClient().then(
      () => service.refreshSandboxes(),
      (err) => showError(err, service, 'abx'),
    );
  }

  return { service, commands, fs, sandboxes, providers };
}

export function deactivate(): void {
  // context.subscriptions dispose the connection (and with it `abx rpc`).
}
