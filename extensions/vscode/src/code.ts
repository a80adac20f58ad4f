// "Run Selection in Sandbox" (abx.runSelection): the editor's selection (or its current line)
// runs in a code context of a sandbox through code/run; its output, results and error stream
// into the "abx: Code" output channel as code/output arrives. Variables persist between runs
// (the sandbox's default context of the language). Cancelling the progress notification
// interrupts the code (the context keeps its state).
import * as vscode from 'vscode';
import type { Commands } from './commands';
import type { AbxService } from './service';

export const CODE_COMMANDS = ['abx.runSelection'] as const;

/** code/run's language for an editor language id (undefined: python). */
export function languageOf(languageId: string | undefined): string | undefined {
  switch (languageId) {
    case 'python':
      return 'python';
    case 'javascript':
    case 'javascriptreact':
      return 'javascript';
    case 'shellscript':
    case 'bash':
    case 'sh':
      return 'bash';
    default:
      return undefined;
  }
}

interface CodeError {
  name: string;
  value: string;
  traceback: string;
}

/** A code/run result (the fields this command reads). */
export interface CodeResult {
  results: Record<string, unknown>[];
  stdout: string;
  stderr: string;
  error: CodeError | null;
  executionCount: number;
  context: string;
  timedOut?: boolean;
  restarted?: boolean;
}

interface CodeOutput {
  runId?: string;
  type: string;
  text?: string;
  result?: Record<string, unknown>;
  error?: CodeError;
}

/** A result bundle as a line: its text/plain, else the MIME types it has. */
export function resultLine(b: Record<string, unknown>): string {
  const t = b['text/plain'];
  return typeof t === 'string' ? t : `[${Object.keys(b).join(', ')}]`;
}

let runs = 0;

export function registerCode(service: AbxService, commands: Commands): vscode.Disposable[] {
  let channel: vscode.OutputChannel | undefined;
  const run = async (arg?: unknown, code?: unknown, language?: unknown): Promise<CodeResult | undefined> => {
    const editor = vscode.window.activeTextEditor;
    let text = typeof code === 'string' ? code : undefined;
    if (text === undefined && editor) {
      const sel = editor.selection;
      text = sel && !sel.isEmpty ? editor.document.getText(sel) : editor.document.lineAt(sel.active.line).text;
    }
    if (!text || !text.trim()) {
      void vscode.window.showInformationMessage('Select the code to run in a sandbox (or put the cursor on a line).');
      return undefined;
    }
    const lang = typeof language === 'string' ? language : languageOf(editor?.document.languageId);
    const sb = await commands.pickSandbox(arg as string | undefined, 'Run the selection in which sandbox?', 'running');
    if (!sb) return undefined;
    channel ??= vscode.window.createOutputChannel('abx: Code');
    const out = channel;
    out.show(true);
    out.appendLine(`>>> [${sb}${lang ? ` ${lang}` : ''}]`);
    const client = await service.getClient();
    const runId = `vscode-${process.pid}-${++runs}`;
    const sub = client.onNotification(({ method, params }) => {
      const n = params as CodeOutput;
      if (method !== 'code/output' || n?.runId !== runId) return;
      if (n.type === 'stdout' || n.type === 'stderr') out.append(n.text ?? '');
      else if (n.type === 'result' && n.result) out.appendLine(resultLine(n.result));
      else if (n.type === 'error' && n.error) out.append(n.error.traceback ? `${n.error.traceback.replace(/\n?$/, '\n')}` : `${n.error.name}: ${n.error.value}\n`);
      else if (n.type === 'restarted') out.appendLine(`[${n.text ?? 'the context was restarted'}]`);
    });
    try {
      return await vscode.window.withProgress(
        { location: vscode.ProgressLocation.Notification, title: `Running the selection in ${sb}`, cancellable: true },
        async (_progress, token) => {
          const params: Record<string, unknown> = { sandbox: sb, code: text, runId };
          if (lang) params.language = lang;
          const r = await client.request<CodeResult>('code/run', params, token);
          out.appendLine(`[${r.context} #${r.executionCount}${r.timedOut ? ', timed out' : ''}${r.error ? `, ${r.error.name}` : ''}]`);
          if (r.error && !token.isCancellationRequested) {
            void vscode.window.showWarningMessage(`${r.error.name}: ${r.error.value}`);
          }
          return r;
        },
      );
    } finally {
      sub.dispose();
    }
  };
  return [vscode.commands.registerCommand('abx.runSelection', run)];
}
