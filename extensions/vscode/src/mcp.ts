// Registers `abx mcp` as an MCP server for VS Code's agent, where the API exists
// (vscode.lm.registerMcpServerDefinitionProvider, VS Code 1.101+). On older VS Code this is
// a no-op: the extension's `engines.vscode` is lower, so it must not assume the API.
import * as vscode from 'vscode';
import { AbxError } from './client/errors';
import { checkAbxBinary } from './client/version';
import { abxEnv } from './config';
import type { AbxService } from './service';

export const MCP_PROVIDER_ID = 'abx.mcpServers';

interface McpApi {
  lm?: {
    registerMcpServerDefinitionProvider?: (
      id: string,
      provider: {
        onDidChangeMcpServerDefinitions?: vscode.Event<void>;
        provideMcpServerDefinitions(token: vscode.CancellationToken): unknown[] | Thenable<unknown[]>;
        resolveMcpServerDefinition?(server: unknown, token: vscode.CancellationToken): unknown;
      },
    ) => vscode.Disposable;
  };
  McpStdioServerDefinition?: new (
    label: string,
    command: string,
    args?: string[],
    env?: Record<string, string | number | null>,
    version?: string,
  ) => unknown;
}

/** Whether this VS Code has the MCP server definition API. */
export function mcpApiAvailable(api: unknown = vscode): boolean {
  const a = api as McpApi;
  return typeof a.lm?.registerMcpServerDefinitionProvider === 'function' && typeof a.McpStdioServerDefinition === 'function';
}

export interface McpRegistration extends vscode.Disposable {
  /** The settings changed: VS Code asks for the definitions again. */
  refresh(): void;
}

export function registerMcp(service: AbxService, extensionVersion: string, api: unknown = vscode): McpRegistration | undefined {
  if (!mcpApiAvailable(api)) {
    service.log('MCP: this VS Code has no MCP server API (1.101+); register `abx mcp` by hand (docs/mcp.md).');
    return undefined;
  }
  const a = api as Required<McpApi>;
  const changed = new vscode.EventEmitter<void>();
  const registration = a.lm.registerMcpServerDefinitionProvider!(MCP_PROVIDER_ID, {
    onDidChangeMcpServerDefinitions: changed.event,
    provideMcpServerDefinitions: () => {
      const s = service.settings;
      if (!s.mcpEnabled) return [];
      const env: Record<string, string> = {};
      if (s.home) env.ABX_HOME = s.home;
      if (s.host) env.ABX_HOST = s.host;
      return [new a.McpStdioServerDefinition('abx sandboxes', s.path, ['mcp'], env, extensionVersion)];
    },
    resolveMcpServerDefinition: async (server: unknown) => {
      // Starting it would fail obscurely when abx is missing or too old: say so with the fix.
      try {
        await checkAbxBinary(service.settings.path, abxEnv(service.settings));
        return server;
      } catch (err) {
        const e = AbxError.from(err);
        void vscode.window.showErrorMessage(`abx MCP server: ${e.headline} ${e.suggestion ?? ''}`);
        return undefined;
      }
    },
  });
  return {
    refresh: () => changed.fire(),
    dispose: () => {
      registration.dispose();
      changed.dispose();
    },
  };
}
