// The broker connection as the extension uses it: connected on first need, reconnected after
// a loss, its state shown in the status bar and the views.
import * as vscode from 'vscode';
import { BrokerClient } from './client/broker';
import { AbxError } from './client/errors';
import type { Sandbox } from './client/types';
import { abxEnv, readSettings, Settings } from './config';

export type BrokerState =
  | { kind: 'idle' }
  | { kind: 'connecting' }
  | { kind: 'connected'; version: string }
  | { kind: 'error'; error: AbxError };

export class AbxService implements vscode.Disposable {
  private client: BrokerClient | undefined;
  private connecting: Promise<BrokerClient> | undefined;
  private stateValue: BrokerState = { kind: 'idle' };
  private readonly stateEmitter = new vscode.EventEmitter<BrokerState>();
  readonly onDidChangeState = this.stateEmitter.event;
  private readonly sandboxesEmitter = new vscode.EventEmitter<Sandbox[] | undefined>();
  /** Fires with the latest sandbox list (undefined: unknown, e.g. disconnected). */
  readonly onDidChangeSandboxes = this.sandboxesEmitter.event;
  private sandboxesValue: Sandbox[] | undefined;
  /** Whether a list was asked for on this connection (the view asks once, not in a loop). */
  private listAttempted = false;
  /** Why the last sandbox/list failed, if it did. */
  listError: AbxError | undefined;
  private timer: NodeJS.Timeout | undefined;
  private settingsValue: Settings;

  constructor(
    readonly output: vscode.OutputChannel,
    private readonly extensionVersion: string,
  ) {
    this.settingsValue = readSettings();
  }

  get settings(): Settings {
    return this.settingsValue;
  }

  get state(): BrokerState {
    return this.stateValue;
  }

  get sandboxes(): Sandbox[] | undefined {
    return this.sandboxesValue;
  }

  get sandboxesAttempted(): boolean {
    return this.listAttempted;
  }

  private setState(s: BrokerState): void {
    this.stateValue = s;
    this.stateEmitter.fire(s);
  }

  log(line: string): void {
    this.output.appendLine(`[${new Date().toISOString()}] ${line}`);
  }

  /** The connected client; connects (once, shared) when there is none. */
  getClient(): Promise<BrokerClient> {
    if (this.client && !this.client.isClosed) return Promise.resolve(this.client);
    if (!this.connecting) {
      this.connecting = this.connect().finally(() => (this.connecting = undefined));
    }
    return this.connecting;
  }

  private async connect(): Promise<BrokerClient> {
    const s = this.settingsValue;
    this.setState({ kind: 'connecting' });
    this.log(`connecting: ${s.path} ${s.connection === 'stdio' ? 'broker --stdio' : 'rpc'}${s.home ? ` (ABX_HOME=${s.home})` : ''}`);
    try {
      const client = await BrokerClient.connect({
        abxPath: s.path,
        mode: s.connection,
        env: abxEnv(s),
        clientInfo: { name: 'abx-vscode', version: this.extensionVersion },
        log: (l) => this.log(`abx: ${l}`),
      });
      this.client = client;
      client.onDidClose((reason) => {
        if (this.client !== client) return;
        this.client = undefined;
        this.sandboxesValue = undefined;
        this.listAttempted = false;
        this.sandboxesEmitter.fire(undefined);
        this.setState({ kind: 'error', error: new AbxError('E1007', `The abx broker connection closed: ${reason}`) });
      });
      this.log(`connected to abx-broker ${client.serverVersion} (abx ${client.binaryVersion})`);
      this.setState({ kind: 'connected', version: client.serverVersion });
      this.schedule();
      return client;
    } catch (err) {
      const e = AbxError.from(err);
      this.log(`connection failed: ${e.describe()}`);
      this.setState({ kind: 'error', error: e });
      throw e;
    }
  }

  /** Drops the connection and connects again (settings re-read). */
  async reconnect(): Promise<BrokerClient> {
    this.settingsValue = readSettings();
    const old = this.client;
    this.client = undefined;
    old?.dispose();
    const c = await this.getClient();
    await this.refreshSandboxes();
    return c;
  }

  /** Settings changed: apply them (a new abx path, home or mode means a new connection). */
  async settingsChanged(): Promise<void> {
    const before = this.settingsValue;
    this.settingsValue = readSettings();
    const s = this.settingsValue;
    if (before.path !== s.path || before.home !== s.home || before.connection !== s.connection) {
      if (this.client || this.stateValue.kind === 'error') await this.reconnect().catch(() => undefined);
    }
    this.schedule();
  }

  /** Reloads the sandbox list (connecting when needed). */
  async refreshSandboxes(): Promise<Sandbox[] | undefined> {
    this.listAttempted = true;
    try {
      const client = await this.getClient();
      this.sandboxesValue = await client.sandboxList();
      this.listError = undefined;
    } catch (err) {
      this.listError = AbxError.from(err);
      this.log(`sandbox/list: ${this.listError.headline}`);
      this.sandboxesValue = undefined;
    }
    this.sandboxesEmitter.fire(this.sandboxesValue);
    return this.sandboxesValue;
  }

  private schedule(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
    const every = this.settingsValue.refreshInterval;
    if (every > 0) {
      this.timer = setInterval(() => {
        // Only while connected: a missing binary is reported once, not every few seconds.
        if (this.client && !this.client.isClosed) void this.refreshSandboxes();
      }, every * 1000);
    }
  }

  dispose(): void {
    if (this.timer) clearInterval(this.timer);
    this.client?.dispose();
    this.client = undefined;
    this.stateEmitter.dispose();
    this.sandboxesEmitter.dispose();
  }
}
