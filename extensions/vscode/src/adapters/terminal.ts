// A VS Code Pseudoterminal on a pty `exec/start`: keystrokes go through `exec/write`, size
// changes through `exec/resize`, output comes from `exec/output`; the exit code is shown.

import * as vscode from 'vscode';
import type { BrokerClient } from '../client/broker';
import { AbxError } from '../client/errors';
import type { ExecSession } from '../client/exec';
import type { ExecExit } from '../client/types';

/** What runs when no command is given: the sandbox's bash, else sh (as `abx shell`). */
export const DEFAULT_SHELL = 'if command -v bash >/dev/null 2>&1; then exec bash -i; else exec sh -i; fi';

export interface TerminalOptions {
  sandbox: string;
  /** A shell string; default DEFAULT_SHELL. */
  command?: string;
  cwd?: string;
  env?: Record<string, string>;
  /** Close the terminal as soon as the command exits (else: after a key press). */
  closeOnExit?: boolean;
}

export class AbxTerminal implements vscode.Pseudoterminal {
  private readonly writeEmitter = new vscode.EventEmitter<string>();
  private readonly closeEmitter = new vscode.EventEmitter<number | void>();
  readonly onDidWrite: vscode.Event<string> = this.writeEmitter.event;
  readonly onDidClose: vscode.Event<number | void> = this.closeEmitter.event;

  private session: ExecSession | undefined;
  private size: { cols: number; rows: number } = { cols: 80, rows: 24 };
  /** Input typed while a write is in flight, sent as one `exec/write` after it. */
  private inputBuf = '';
  private pendingSize: { cols: number; rows: number } | undefined;
  /** The broker serves requests concurrently: writes and resizes go one at a time, in order. */
  private pumping = false;
  private exit: ExecExit | undefined;
  private failed = false;
  private closed = false;
  /** Resolves with the exit code once the command has exited (undefined when it never started). */
  readonly exited: Promise<number | undefined>;
  private resolveExited!: (code: number | undefined) => void;

  constructor(
    private readonly client: () => Promise<BrokerClient>,
    private readonly opts: TerminalOptions,
  ) {
    this.exited = new Promise((r) => (this.resolveExited = r));
  }

  get execId(): string | undefined {
    return this.session?.execId;
  }

  open(initialDimensions: vscode.TerminalDimensions | undefined): void {
    if (initialDimensions) this.size = { cols: initialDimensions.columns, rows: initialDimensions.rows };
    void this.start();
  }

  private async start(): Promise<void> {
    try {
      const client = await this.client();
      this.session = await client.execStart(
        {
          sandbox: this.opts.sandbox,
          command: this.opts.command || DEFAULT_SHELL,
          cwd: this.opts.cwd,
          env: this.opts.env,
          pty: { ...this.size },
        },
        {
          onOutput: (c) => {
            if (c.text) this.writeEmitter.fire(c.text);
          },
          onExit: (e) => this.onExit(e),
        },
      );
      this.session.exited.catch((err) => this.fail(AbxError.from(err)));
      if (this.closed) {
        void this.session.kill('HUP').catch(() => undefined);
        return;
      }
      void this.pump();
    } catch (err) {
      this.fail(AbxError.from(err, 'exec/start'));
    }
  }

  private fail(err: AbxError): void {
    if (this.exit || this.failed) return;
    this.failed = true;
    const lines = err.describe().split('\n').join('\r\n');
    this.writeEmitter.fire(`\r\n\x1b[31m${lines}\x1b[0m\r\n`);
    this.writeEmitter.fire('\r\n[abx] Press any key to close the terminal.\r\n');
    this.resolveExited(undefined);
  }

  private onExit(e: ExecExit): void {
    this.exit = e;
    const code = e.exitCode ?? -1;
    const how = e.timedOut ? ' (timed out)' : e.signal ? ` (${e.signal})` : '';
    this.writeEmitter.fire(`\r\n[abx] Process exited with code ${code}${how}.\r\n`);
    this.resolveExited(code);
    if (this.opts.closeOnExit) {
      this.closeEmitter.fire(code);
    } else {
      this.writeEmitter.fire('[abx] Press any key to close the terminal.\r\n');
    }
  }

  handleInput(data: string): void {
    if (this.exit || this.failed) {
      // The command is over: a key press closes the terminal.
      if (!this.closed) {
        this.closed = true;
        this.closeEmitter.fire(this.exit?.exitCode ?? undefined);
      }
      return;
    }
    this.inputBuf += data;
    void this.pump();
  }

  setDimensions(dimensions: vscode.TerminalDimensions): void {
    this.size = { cols: dimensions.columns, rows: dimensions.rows };
    this.pendingSize = { ...this.size };
    void this.pump();
  }

  /** Sends buffered input and the latest size, one request at a time, in the order given. */
  private async pump(): Promise<void> {
    if (this.pumping || !this.session) return;
    this.pumping = true;
    try {
      while (!this.exit && !this.failed && (this.inputBuf || this.pendingSize)) {
        if (this.pendingSize) {
          const s = this.pendingSize;
          this.pendingSize = undefined;
          await this.session.resize(s.cols, s.rows).catch((err) => this.report(err));
          continue;
        }
        const data = this.inputBuf;
        this.inputBuf = '';
        await this.session.write(data).catch((err) => this.report(err));
      }
    } finally {
      this.pumping = false;
    }
  }

  private report(err: unknown): void {
    const e = AbxError.from(err);
    // A write racing the exit is expected; anything else is shown in the terminal.
    if (this.exit || e.abx === 'E3002' || e.abx === 'E3005') return;
    this.writeEmitter.fire(`\r\n\x1b[31m${e.headline}\x1b[0m\r\n`);
  }

  /** The user closed the terminal: hang the session up (SIGHUP to its tree, like `abx shell`). */
  close(): void {
    void this.hangUp();
    this.resolveExited(this.exit?.exitCode ?? undefined);
  }

  /**
   * Ends the command in the sandbox: SIGHUP to its tree (`exec/kill`), and SIGKILL when it
   * has not exited within `graceMs`. For a terminal that goes away (closed, or lost with
   * the extension host). Never rejects.
   */
  async hangUp(graceMs = 1000): Promise<void> {
    this.closed = true;
    const s = this.session;
    if (!s || s.done || this.exit) return;
    await s.kill('HUP').catch(() => undefined);
    const ended = await Promise.race([
      s.exited.then(
        () => true,
        () => true,
      ),
      new Promise<boolean>((r) => setTimeout(() => r(false), graceMs).unref()),
    ]);
    if (!ended) await s.kill('KILL').catch(() => undefined);
  }
}
