// "Build Template from Dockerfile" (abx.buildTemplate, issue 49): on a Dockerfile of the
// explorer (its context menu, for files named `Dockerfile` or `*.Dockerfile`), the editor's
// Dockerfile, or one picked, builds its folder as the build context with templates/build
// {context, dockerfile, name}. The name is asked (default: the folder's name); the steps stream
// into the "abx: Template Build" output channel as docker build prints them (`[2/4] RUN make`,
// its output indented, `CACHED ...` for a cache hit) from templates/progress, and into a
// cancellable progress notification: cancelling it sends $/cancelRequest, which stops the
// build (nothing is stored).
import * as path from 'node:path';
import * as vscode from 'vscode';
import { AbxError } from './client/errors';
import type { AbxService } from './service';

export const TEMPLATE_COMMANDS = ['abx.buildTemplate'] as const;

/** What templates/build answers (the fields this command reads). */
export interface TemplateInfo {
  name: string;
  names?: string[];
  digest?: string | null;
  size?: number;
  source?: string;
  [k: string]: unknown;
}

/** A templates/progress notification. */
export interface TemplateProgress {
  template: string;
  bytes: number;
  total: number;
  step: string;
  line?: string;
  cached?: boolean;
}

/** Options of a build beyond the Dockerfile and the name (templates/build's members). */
export interface BuildOptions {
  buildArgs?: Record<string, string>;
  target?: string;
  network?: string | { allow: string[] };
  noCache?: boolean;
}

/** Whether a file name is a Dockerfile (`Dockerfile`, `Dockerfile.dev`, `app.Dockerfile`). */
export function isDockerfile(file: string): boolean {
  const b = path.basename(file);
  return /^Dockerfile([.-].*)?$/i.test(b) || /\.Dockerfile$/i.test(b);
}

/** A template name from a folder's name: lowercase, `[a-z0-9._-]`, others as `-`. */
export function defaultTemplateName(dir: string): string {
  const n = path
    .basename(dir)
    .toLowerCase()
    .replace(/[^a-z0-9._-]/g, '-')
    .replace(/^[-.]+|[-.]+$/g, '');
  return n || 'template';
}

/** Whether a name can name a template (as the broker takes it: no spaces, no `@`). */
export function validTemplateName(v: string): string | undefined {
  if (!v.trim()) return 'A name for the template';
  if (/\s/.test(v) || v.includes('@')) return 'No spaces and no @ in a template name';
  if (v === 'base') return "'base' is the host system";
  return undefined;
}

/** The lines docker build prints for the progress of a build, as `abx template build` does. */
export class StepLines {
  private step: string | undefined;
  private cached = false;

  lines(p: TemplateProgress): string[] {
    const out: string[] = [];
    if (p.step && p.step !== this.step) {
      this.step = p.step;
      this.cached = !!p.cached;
      out.push(p.cached ? `CACHED ${p.step}` : p.step);
    } else if (p.cached && !this.cached) {
      this.cached = true;
      out.push('  CACHED');
    }
    if (typeof p.line === 'string') {
      for (const l of p.line.replace(/[\r\n]+$/, '').split('\n')) out.push(`  ${l}`);
    }
    return out;
  }
}

export function registerTemplates(service: AbxService, showError: (err: unknown) => Promise<void>): vscode.Disposable[] {
  let channel: vscode.OutputChannel | undefined;

  const pickDockerfile = async (arg: unknown): Promise<vscode.Uri | undefined> => {
    if (arg instanceof vscode.Uri) return arg;
    if (typeof arg === 'string' && arg) return vscode.Uri.file(arg);
    const doc = vscode.window.activeTextEditor?.document as { uri?: vscode.Uri } | undefined;
    if (doc?.uri && doc.uri.scheme === 'file' && isDockerfile(doc.uri.fsPath)) return doc.uri;
    const picked = await vscode.window.showOpenDialog({
      title: 'Build a template from which Dockerfile?',
      openLabel: 'Build',
      canSelectMany: false,
      canSelectFolders: false,
    });
    return picked?.[0];
  };

  const build = async (arg?: unknown, nameArg?: unknown, opts?: BuildOptions): Promise<TemplateInfo | undefined> => {
    const file = await pickDockerfile(arg);
    if (!file) return undefined;
    const context = path.dirname(file.fsPath);
    const dockerfile = path.basename(file.fsPath);
    const name =
      typeof nameArg === 'string' && nameArg
        ? nameArg
        : await vscode.window.showInputBox({
            title: `Build a template from ${dockerfile}`,
            prompt: `The template's name (the build context is ${context})`,
            value: defaultTemplateName(context),
            validateInput: validTemplateName,
          });
    if (!name) return undefined;
    channel ??= vscode.window.createOutputChannel('abx: Template Build');
    const out = channel;
    out.show(true);
    out.appendLine(`>>> abx template build ${context} -t ${name}${dockerfile === 'Dockerfile' ? '' : ` -f ${dockerfile}`}`);
    const client = await service.getClient();
    const steps = new StepLines();
    let report: ((p: TemplateProgress) => void) | undefined;
    const sub = client.onNotification(({ method, params }) => {
      const p = params as TemplateProgress;
      if (method !== 'templates/progress' || p?.template !== name) return;
      for (const l of steps.lines(p)) out.appendLine(l);
      report?.(p);
    });
    let cancelled = false;
    try {
      return await vscode.window.withProgress(
        { location: vscode.ProgressLocation.Notification, title: `Building template ${name}`, cancellable: true },
        async (progress, token) => {
          let done = 0;
          report = (p) => {
            const pct = p.total ? Math.min(100, (p.bytes / p.total) * 100) : done;
            progress.report({ increment: Math.max(0, pct - done), message: p.step });
            done = Math.max(done, pct);
          };
          const params: Record<string, unknown> = { context, name, ...opts };
          if (dockerfile !== 'Dockerfile') params.dockerfile = dockerfile;
          try {
            const r = await client.request<TemplateInfo>('templates/build', params, token);
            const digest = (r.digest ?? '').replace(/^sha256:/, '').slice(0, 12);
            out.appendLine(`Built template '${r.name}' (${digest}, ${r.size ?? 0} bytes). Use it: abx create --template ${r.name}`);
            void vscode.window.showInformationMessage(`Built template '${r.name}'.`);
            return r;
          } catch (err) {
            if (token.isCancellationRequested) {
              cancelled = true;
              out.appendLine(`The build of '${name}' was cancelled (nothing was stored).`);
              return undefined;
            }
            out.appendLine(AbxError.from(err).describe());
            throw err;
          }
        },
      );
    } catch (err) {
      if (!cancelled) await showError(err);
      return undefined;
    } finally {
      sub.dispose();
    }
  };

  return [vscode.commands.registerCommand('abx.buildTemplate', build)];
}
