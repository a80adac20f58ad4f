//! `@abx/sdk/e2b/code-interpreter`: E2B's `@e2b/code-interpreter` 2.8.0 surface (its
//! `Sandbox` with `runCode` and code contexts; `Execution`, `Result`, `ExecutionError`,
//! `OutputMessage`) over the broker's `code/*` methods, with everything of `@abx/sdk/e2b`.
//! `runCode` streams through `code/output` notifications (onStdout, onStderr, onResult,
//! onError), told apart by the run's own `runId`.

import { randomUUID } from 'node:crypto';
import { AbxError } from '../errors.js';
import { InvalidArgumentError, Sandbox as BaseSandbox, Secret, Template, TimeoutError, toAbxPath, toE2BError, toE2BPath, Volume } from '../e2b.js';

export * from '../e2b.js';

export enum ChartType {
  LINE = 'line',
  SCATTER = 'scatter',
  BAR = 'bar',
  PIE = 'pie',
  BOX_AND_WHISKER = 'box_and_whisker',
  SUPERCHART = 'superchart',
  UNKNOWN = 'unknown',
}

export enum ScaleType {
  LINEAR = 'linear',
  DATETIME = 'datetime',
  CATEGORICAL = 'categorical',
  LOG = 'log',
  SYMLOG = 'symlog',
  LOGIT = 'logit',
  FUNCTION = 'function',
  FUNCTIONLOG = 'functionlog',
  ASINH = 'asinh',
}

export type ChartTypes = { type: ChartType; title: string; elements: unknown[] };

/** One line (chunk) of output of a cell. */
export class OutputMessage {
  constructor(
    readonly line: string,
    /** Microseconds since the epoch (E2B's unit). */
    readonly timestamp: number,
    readonly error: boolean,
  ) {}
  toString(): string {
    return this.line;
  }
}

/** The error a cell raised: type, message, formatted traceback. */
export class ExecutionError {
  constructor(
    public name: string,
    public value: string,
    public traceback: string,
  ) {}
}

export type MIMEType = string;
export type RawData = { [key: MIMEType]: unknown };

const KNOWN: Record<string, string> = {
  'text/plain': 'text',
  'text/html': 'html',
  'text/markdown': 'markdown',
  'image/svg+xml': 'svg',
  'image/png': 'png',
  'image/jpeg': 'jpeg',
  'application/pdf': 'pdf',
  'text/latex': 'latex',
  'application/json': 'json',
  'application/javascript': 'javascript',
  'text/javascript': 'javascript',
};

/** One result of a cell (a MIME bundle) under E2B's names. */
export class Result {
  readonly isMainResult: boolean;
  readonly text?: string;
  readonly html?: string;
  readonly markdown?: string;
  readonly svg?: string;
  readonly png?: string;
  readonly jpeg?: string;
  readonly pdf?: string;
  readonly latex?: string;
  readonly json?: string;
  readonly javascript?: string;
  readonly data?: Record<string, unknown>;
  readonly chart?: ChartTypes;
  readonly extra?: Record<string, unknown>;
  readonly raw: RawData;

  constructor(rawData: RawData, isMainResult: boolean) {
    this.raw = rawData;
    this.isMainResult = isMainResult;
    const self = this as unknown as Record<string, unknown>;
    const extra: Record<string, unknown> = {};
    for (const [mime, v] of Object.entries(rawData)) {
      const k = KNOWN[mime];
      if (k) self[k] = k === 'json' && typeof v !== 'string' ? JSON.stringify(v) : v;
      else if (mime === 'application/vnd.e2b.data' || mime === 'data') self.data = v as Record<string, unknown>;
      else if (mime === 'application/vnd.e2b.chart' || mime === 'chart') self.chart = v as ChartTypes;
      else extra[mime] = v;
    }
    if (Object.keys(extra).length) self.extra = extra;
  }

  /** The formats this result has (`text` is left out, as E2B does). */
  formats(): string[] {
    const out: string[] = [];
    for (const k of ['html', 'png', 'jpeg', 'svg', 'pdf', 'latex', 'markdown', 'json', 'javascript']) {
      if ((this as unknown as Record<string, unknown>)[k] !== undefined) out.push(k);
    }
    if (this.data) out.push('data');
    if (this.chart) out.push('chart');
    if (this.extra) out.push(...Object.keys(this.extra));
    return out;
  }

  toJSON(): Record<string, unknown> {
    const j: Record<string, unknown> = {
      text: this.text,
      html: this.html,
      markdown: this.markdown,
      svg: this.svg,
      png: this.png,
      jpeg: this.jpeg,
      pdf: this.pdf,
      latex: this.latex,
      json: this.json,
      javascript: this.javascript,
    };
    if (this.extra) j.extra = this.extra;
    return j;
  }
}

export type Logs = { stdout: string[]; stderr: string[] };

/** What `runCode` answers. */
export class Execution {
  constructor(
    public results: Result[] = [],
    public logs: Logs = { stdout: [], stderr: [] },
    public error?: ExecutionError,
    public executionCount?: number,
  ) {}
  /** The main result's text (the value of the cell's last expression). */
  get text(): string | undefined {
    for (const r of this.results) if (r.isMainResult) return r.text;
    return undefined;
  }
  toJSON(): { results: Result[]; logs: Logs; error: ExecutionError | undefined } {
    return { results: this.results, logs: this.logs, error: this.error };
  }
}

export type Context = { id: string; language: string; cwd: string };
export type RunCodeLanguage = 'python' | 'javascript' | 'typescript' | 'r' | 'java' | 'bash' | (string & {});

export interface RunCodeOpts {
  onStdout?: (output: OutputMessage) => Promise<unknown> | unknown;
  onStderr?: (output: OutputMessage) => Promise<unknown> | unknown;
  onResult?: (data: Result) => Promise<unknown> | unknown;
  onError?: (error: ExecutionError) => Promise<unknown> | unknown;
  envs?: Record<string, string>;
  timeoutMs?: number;
  requestTimeoutMs?: number;
}

export interface CreateCodeContextOpts {
  cwd?: string;
  language?: RunCodeLanguage;
  requestTimeoutMs?: number;
}

/** The options of runCode and createCodeContext (test/e2b-drift.test.mjs compares them with E2B's .d.ts). */
export const CI_OPTIONS = {
  RunCodeOpts: ['onStdout', 'onStderr', 'onResult', 'onError', 'envs', 'timeoutMs', 'requestTimeoutMs'],
  CreateCodeContextOpts: ['cwd', 'language', 'requestTimeoutMs'],
} as const;

const RUN_KEYS: readonly string[] = [...CI_OPTIONS.RunCodeOpts, 'language', 'context', 'signal'];

/**
 * Which results are "main": the broker's bundles do not say which one is the value of the
 * last expression, so the last result of a cell is main unless it is an image (a figure is
 * a display, as in E2B).
 */
function mainIndex(bundles: Record<string, unknown>[]): number {
  const i = bundles.length - 1;
  if (i < 0) return -1;
  const b = bundles[i];
  if ('image/png' in b || 'image/jpeg' in b || 'image/svg+xml' in b) return -1;
  return i;
}

/** Removes the indentation of the first non-blank line from every line (IPython's leading_indent). */
export function dedent(code: string): string {
  const lines = code.split('\n');
  const first = lines.find((l) => l.trim() !== '');
  const indent = first ? /^[ \t]*/.exec(first)![0] : '';
  if (!indent) return code;
  return lines.map((l) => (l.startsWith(indent) ? l.slice(indent.length) : l.trimStart() === '' ? '' : l)).join('\n');
}

function contextId(where: string, context: Context | string | undefined): string {
  const id = typeof context === 'string' ? context : context?.id;
  if (typeof id !== 'string' || !id) {
    throw new InvalidArgumentError(`${where}: a Context or a context id is required (got ${String(context)})`);
  }
  return id;
}

function wireContext(c: { id: string; language?: string; cwd?: string }): Context {
  return { id: c.id, language: String(c.language ?? 'python'), cwd: toE2BPath(String(c.cwd ?? '/workspace')) };
}


/** E2B's code interpreter `Sandbox` (default template `code-interpreter-v1`: the provider's default). */
export class Sandbox extends BaseSandbox {
  protected static override readonly defaultTemplate: string = 'code-interpreter-v1';

  runCode(code: string, opts?: RunCodeOpts & { language?: RunCodeLanguage }): Promise<Execution>;
  runCode(code: string, opts?: RunCodeOpts & { context?: Context }): Promise<Execution>;
  async runCode(code: string, opts: RunCodeOpts & { language?: RunCodeLanguage; context?: Context | string; signal?: AbortSignal } = {}): Promise<Execution> {
    for (const k of Object.keys(opts)) {
      if ((opts as Record<string, unknown>)[k] !== undefined && !RUN_KEYS.includes(k)) {
        throw new InvalidArgumentError(`runCode: unknown option '${k}' (known: ${RUN_KEYS.join(', ')})`);
      }
    }
    if (opts.language && opts.context) {
      throw new InvalidArgumentError('You can provide context or language, but not both at the same time.');
    }
    const language = opts.language === 'typescript' ? 'javascript' : opts.language;
    const runId = randomUUID();
    // IPython (E2B's kernel) takes a cell indented as a whole (a template literal's
    // indentation): so does this layer for Python, as IPython's leading_indent does.
    const py = opts.context ? (typeof opts.context === 'object' ? opts.context.language : undefined) : (language ?? 'python');
    if (py === 'python' || py === 'py' || py === 'python3') code = dedent(code);
    const params: Record<string, unknown> = { sandbox: this.sandboxId, code, runId };
    if (opts.context) params.context = contextId('runCode', opts.context);
    else params.language = language ?? 'python';
    const timeoutMs = opts.timeoutMs ?? 60_000;
    if (timeoutMs > 0) params.timeout = timeoutMs / 1000;
    if (opts.envs) params.env = opts.envs;

    const logs: Logs = { stdout: [], stderr: [] };
    const pending: Promise<unknown>[] = [];
    const call = (f: ((x: never) => unknown) | undefined, x: unknown) => {
      if (f) pending.push(Promise.resolve().then(() => f(x as never)).catch(() => undefined));
    };
    const sub = this.client.onNotification(({ method, params: p }) => {
      if (method !== 'code/output') return;
      const n = p as { runId?: string; type?: string; text?: string; result?: RawData; error?: { name?: string; value?: string; traceback?: string } };
      if (n.runId !== runId) return;
      const ts = Date.now() * 1000;
      if (n.type === 'stdout' && n.text !== undefined) {
        logs.stdout.push(n.text);
        call(opts.onStdout, new OutputMessage(n.text, ts, false));
      } else if (n.type === 'stderr' && n.text !== undefined) {
        logs.stderr.push(n.text);
        call(opts.onStderr, new OutputMessage(n.text, ts, true));
      } else if (n.type === 'result' && n.result) {
        call(opts.onResult, new Result(n.result, false));
      } else if (n.type === 'error' && n.error) {
        call(opts.onError, new ExecutionError(String(n.error.name ?? ''), String(n.error.value ?? ''), String(n.error.traceback ?? '')));
      }
    });
    let r: Record<string, unknown>;
    try {
      r = await this.client.request<Record<string, unknown>>('code/run', params, opts.signal);
    } catch (err) {
      throw toE2BError(err);
    } finally {
      sub.dispose();
    }
    await Promise.all(pending);
    if (r.timedOut) throw new TimeoutError(`Execution timed out after ${timeoutMs} ms (the cell was interrupted; code/run timeout)`);
    const bundles = (r.results as Record<string, unknown>[] | undefined) ?? [];
    const main = mainIndex(bundles);
    const results = bundles.map((b, i) => new Result(b as RawData, i === main));
    // The notifications carry the chunks; without them (none came) the reply's text is one chunk.
    if (!logs.stdout.length && r.stdout) logs.stdout.push(String(r.stdout));
    if (!logs.stderr.length && r.stderr) logs.stderr.push(String(r.stderr));
    const e = r.error as { name?: string; value?: string; traceback?: string } | null | undefined;
    const error = e ? new ExecutionError(String(e.name ?? ''), String(e.value ?? ''), String(e.traceback ?? '')) : undefined;
    return new Execution(results, logs, error, typeof r.executionCount === 'number' ? r.executionCount : undefined);
  }

  /** `code/createContext` (`cwd` default `/home/user`, i.e. `/workspace`). */
  async createCodeContext(opts: CreateCodeContextOpts = {}): Promise<Context> {
    for (const k of Object.keys(opts)) {
      if ((opts as Record<string, unknown>)[k] !== undefined && !(CI_OPTIONS.CreateCodeContextOpts as readonly string[]).includes(k)) {
        throw new InvalidArgumentError(`createCodeContext: unknown option '${k}' (known: ${CI_OPTIONS.CreateCodeContextOpts.join(', ')})`);
      }
    }
    const language = opts.language === 'typescript' ? 'javascript' : opts.language ?? 'python';
    const c = await this.call<{ id: string; language?: string; cwd?: string }>('code/createContext', {
      sandbox: this.sandboxId,
      language,
      cwd: toAbxPath(opts.cwd ?? '/home/user'),
    });
    return wireContext(c);
  }

  async removeCodeContext(context: Context | string): Promise<void> {
    await this.call('code/removeContext', { sandbox: this.sandboxId, context: contextId('removeCodeContext', context) });
  }

  async listCodeContexts(): Promise<Context[]> {
    const r = await this.call<{ contexts: { id: string; language?: string; cwd?: string }[] }>('code/listContexts', { sandbox: this.sandboxId });
    return r.contexts.map(wireContext);
  }

  async restartCodeContext(context: Context | string): Promise<void> {
    await this.call('code/restartContext', { sandbox: this.sandboxId, context: contextId('restartCodeContext', context) });
  }

  private async call<R>(method: string, params: object): Promise<R> {
    try {
      return await this.client.request<R>(method, params);
    } catch (err) {
      throw toE2BError(err instanceof AbxError ? err : AbxError.from(err, method));
    }
  }
}

/** E2B's client object, with the code interpreter's Sandbox. */
export class E2B {
  readonly Sandbox: typeof Sandbox = Sandbox;
  readonly Volume = Volume;
  readonly Template = Template;
  readonly Secret = Secret;
  constructor(_opts?: unknown) {}
}

export default Sandbox;
