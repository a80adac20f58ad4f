// The broker connection as the extension uses it: connected on first need, reconnected after
// a loss, its state shown in the status bar and the views.
import { execFile } from 'node:child_process';
import * as vscode from 'vscode';
import { BrokerClient } from './client/broker';
import { AbxError } from './client/errors';
import { applySandboxChange, changedRef, changeEndsSandbox, sandboxRef as sandboxRefOf } from './client/format';
import type { Sandbox, SandboxChanged } from './client/types';
import { abxEnv, readSettings, Settings } from './config';
import { blockedRef, SandboxBlocked, withBlocked } from './network';

export type BrokerState =
  | { kind: 'idle' }
  | { kind: 'connecting' }
  | { kind: 'connected'; version: string }
  | { kind: 'error'; error: AbxError }
  /**
   * The daemon was stopped (`abx broker stop`, or it exited): nothing starts it again until
   * the user acts (a command, Start); a daemon started by someone else is joined.
   */
  | { kind: 'stopped' };

/** First wait before connecting again after a failed attempt; doubles up to RETRY_MAX_MS. */
export const RETRY_BASE_MS = 1000;
export const RETRY_MAX_MS = 60_000;
/** `sandbox/changed` events within this window repaint the views once. */
export const EVENT_DEBOUNCE_MS = 100;
/** While stopped: how often `abx broker status` (which never starts one) looks for a daemon. */
export const STOPPED_WATCH_MS = 3000;
/** What deactivate waits for at most: VS Code (in the web above all) does not wait for long work at shutdown. */
export const SHUTDOWN_BUDGET_MS = 800;

/** The error of what needs the broker while it is stopped (until the user starts it). */
export function stoppedError(): AbxError {
  return new AbxError('E1007', 'The abx broker is stopped.', {
    suggestion: "Start it: Start in the notification, 'abx: Start Broker', or 'abx broker start'.",
  });
}

export interface GetClientOptions {
  /**
   * Connect now even while waiting to retry after a failure: for what the user asked for
   * (a command). Views, the file system and timers leave it unset, so a missing binary is
   * tried again on the backoff schedule, not on every repaint.
   */
  now?: boolean;
}

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
  /** The list is the last one known before the connection was lost (shown while reconnecting). */
  private staleValue = false;
  /** Set while a lost connection is being looked at (does the daemon still run?). */
  private settling: Promise<void> | undefined;
  /** While stopped: looks for a daemon someone else started (never starts one). */
  private stoppedWatch: NodeJS.Timeout | undefined;
  /** Features of each provider, loaded with the sandbox list (once per connection). */
  private featuresValue: Map<string, string[]> | undefined;
  private featuresLoading: BrokerClient | undefined;
  /** Whether a list was asked for on this connection (the view asks once, not in a loop). */
  private listAttempted = false;
  /** Why the last sandbox/list failed, if it did. */
  listError: AbxError | undefined;
  /** The fallback poll (only on a broker without `sandbox/subscribe`). */
  private timer: NodeJS.Timeout | undefined;
  /**
   * Whether this connection gets `sandbox/changed`: true once `sandbox/subscribe` answered,
   * false when the broker lacks it (then the list is polled), undefined while not connected.
   */
  private liveValue: boolean | undefined;
  /** Debounces the repaint after events (and the reload some events ask for). */
  private eventTimer: NodeJS.Timeout | undefined;
  private reloadAfterEvents = false;
  /** `sandbox/list` requests in flight, and the events that came meanwhile (replayed on their result). */
  private listsInFlight = 0;
  private changesDuringList: SandboxChanged[] = [];
  private readonly endedEmitter = new vscode.EventEmitter<string>();
  /**
   * Fires with `provider:id` when a sandbox is killed (by anyone) or its lifetime ends, as
   * the broker reports it: its editors, folder and terminals go.
   */
  readonly onDidEndSandbox = this.endedEmitter.event;
  private readonly blockedEmitter = new vscode.EventEmitter<SandboxBlocked>();
  /**
   * Fires for each `sandbox/blocked` (a sandbox's network policy refused a connection;
   * issue 44). The listed sandbox's `network.blocked` is updated first.
   */
  readonly onDidBlock = this.blockedEmitter.event;
  private settingsValue: Settings;
  /** Failed connection attempts in a row, and what the last one said. */
  private failures = 0;
  private lastFailure: AbxError | undefined;
  private retryAt = 0;
  private retryTimer: NodeJS.Timeout | undefined;
  private readonly shutdownHooks = new Set<() => Promise<void>>();
  private shutdownPromise: Promise<void> | undefined;

  constructor(
    readonly output: vscode.OutputChannel,
    private readonly extensionVersion: string,
  ) {
    this.settingsValue = this.readSettings();
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

  /** Whether `sandboxes` is the last list known before a lost connection (reconnecting). */
  get stale(): boolean {
    return this.staleValue;
  }

  /** Whether the list follows `sandbox/changed` (true) or is polled (false; undefined: offline). */
  get live(): boolean | undefined {
    return this.liveValue;
  }

  get sandboxesAttempted(): boolean {
    return this.listAttempted;
  }

  /** The features a provider declares (undefined: not known yet). */
  providerFeatures(provider: string): string[] | undefined {
    return this.featuresValue?.get(provider);
  }

  /** Providers changed (install, default): their features are loaded again. */
  forgetProviders(): void {
    this.featuresValue = undefined;
  }

  /** When the next automatic connection attempt is due (0: none planned). */
  get nextRetryAt(): number {
    return this.retryTimer ? this.retryAt : 0;
  }

  private readSettings(): Settings {
    const s = readSettings();
    for (const k of s.ignored) {
      this.log(`abx.${k} is set in the workspace settings and ignored: it chooses what runs, so only User and Remote settings count.`);
    }
    return s;
  }

  private setState(s: BrokerState): void {
    this.stateValue = s;
    if (this.shutdownPromise) return;
    this.stateEmitter.fire(s);
    void vscode.commands.executeCommand('setContext', 'abx.connected', s.kind === 'connected');
    void vscode.commands.executeCommand('setContext', 'abx.stopped', s.kind === 'stopped');
  }

  /** A line in the abx output channel; never throws (the channel may be gone at shutdown). */
  log(line: string): void {
    try {
      this.output.appendLine(`[${new Date().toISOString()}] ${line}`);
    } catch {
      /* the output channel is disposed */
    }
  }

  /**
   * The connected client; connects (once, shared) when there is none. After a failed
   * attempt, callers get that failure until the backoff has passed (unless `now`).
   */
  getClient(opts: GetClientOptions = {}): Promise<BrokerClient> {
    if (this.shutdownPromise) return Promise.reject(new AbxError('E1007', 'The abx extension is shutting down.'));
    if (this.client && !this.client.isClosed) return Promise.resolve(this.client);
    if (this.connecting) return this.connecting;
    // A connection just closed: whether the daemon still runs is being found out. Until then
    // nothing connects by itself (that would start a daemon that was just stopped).
    if (!opts.now && this.settling) return this.settling.then(() => this.getClient(opts));
    // Stopped: only the user starts it again (views, files and timers get the reason).
    if (!opts.now && this.stateValue.kind === 'stopped') return Promise.reject(stoppedError());
    if (!opts.now && this.lastFailure && Date.now() < this.retryAt) return Promise.reject(this.lastFailure);
    this.connecting = this.connect().finally(() => (this.connecting = undefined));
    return this.connecting;
  }

  private async connect(): Promise<BrokerClient> {
    // getClient() stores this promise first: whoever the state change below wakes (a view
    // asking for the client) joins this attempt instead of starting another.
    await Promise.resolve();
    const s = this.settingsValue;
    if (this.retryTimer) clearTimeout(this.retryTimer);
    this.retryTimer = undefined;
    this.stopWatching();
    this.setState({ kind: 'connecting' });
    this.log(`connecting: ${s.path} ${s.connection === 'stdio' ? 'broker --stdio' : 'rpc'}${s.home ? ` (ABX_HOME=${s.home})` : ''}${s.host ? ` (ABX_HOST=${s.host})` : ''}`);
    try {
      const client = await BrokerClient.connect({
        abxPath: s.path,
        mode: s.connection,
        env: abxEnv(s),
        clientInfo: { name: 'abx-vscode', version: this.extensionVersion },
        log: (l) => this.log(`abx: ${l}`),
      });
      if (this.shutdownPromise) {
        client.dispose();
        throw new AbxError('E1007', 'The abx extension is shutting down.');
      }
      this.client = client;
      this.failures = 0;
      this.lastFailure = undefined;
      client.onDidClose((reason) => {
        if (this.client !== client) return;
        this.client = undefined;
        // The list stays (marked stale) while it is found out whether the daemon still runs.
        this.lost(true);
        this.setState({ kind: 'connecting' });
        void this.afterLoss(reason);
      });
      client.onSandboxChanged((c) => {
        if (this.client === client) this.sandboxChanged(c);
      });
      client.onNotification(({ method, params }) => {
        if (method === 'sandbox/blocked' && this.client === client) this.sandboxBlocked(params);
      });
      // Before the first list: nothing that happens after it is missed.
      this.liveValue = await this.subscribe(client);
      if (this.client !== client) {
        // It closed meanwhile: the close handler has planned the next attempt.
        throw new AbxError('E1007', 'The abx broker connection closed while subscribing to sandbox changes.');
      }
      this.log(`connected to abx-broker ${client.serverVersion} (abx ${client.binaryVersion})`);
      this.setState({ kind: 'connected', version: client.serverVersion });
      this.schedule();
      return client;
    } catch (err) {
      const e = AbxError.from(err);
      this.failures++;
      const wait = Math.min(RETRY_BASE_MS * 2 ** (this.failures - 1), RETRY_MAX_MS);
      const same = this.lastFailure?.describe() === e.describe();
      this.lastFailure = e;
      this.log(
        same
          ? `connection failed again (${this.failures} attempts); next attempt in ${Math.round(wait / 1000)} s`
          : `connection failed: ${e.describe()}; next attempt in ${Math.round(wait / 1000)} s`,
      );
      this.lost();
      this.planRetry(wait);
      this.setState({ kind: 'error', error: e });
      throw e;
    }
  }

  /**
   * `sandbox/subscribe` on a new connection: true when the broker will send `sandbox/changed`;
   * false when it lacks the method (an older broker: the list is polled instead).
   */
  private async subscribe(client: BrokerClient): Promise<boolean> {
    const every = this.settingsValue.refreshInterval;
    const fallback = every > 0 ? `the Sandboxes view refreshes every ${every} s instead (abx.refreshInterval)` : 'the Sandboxes view refreshes on demand only (abx.refreshInterval is 0)';
    if (client.offers('sandbox/subscribe') === false) {
      this.log(`the broker has no sandbox/subscribe (abx ${client.serverVersion}): ${fallback}`);
      return false;
    }
    try {
      await client.sandboxSubscribe();
      return true;
    } catch (err) {
      const e = AbxError.from(err);
      if (e.code === -32601 || e.abx === 'E1003') {
        this.log(`the broker has no sandbox/subscribe (abx ${client.serverVersion}): ${fallback}`);
      } else {
        this.log(`sandbox/subscribe failed: ${e.headline}; ${fallback}`);
      }
      return false;
    }
  }

  /** One `sandbox/changed`: the list follows it; the views repaint once per burst. */
  private sandboxChanged(c: SandboxChanged): void {
    if (this.shutdownPromise) return;
    if (this.listsInFlight > 0) this.changesDuringList.push(c);
    if (this.sandboxesValue) {
      const r = applySandboxChange(this.sandboxesValue, c);
      this.sandboxesValue = r.list;
      if (r.reload) this.reloadAfterEvents = true;
    }
    if (changeEndsSandbox(c)) {
      try {
        this.endedEmitter.fire(changedRef(c));
      } catch (err) {
        this.log(`closing what showed ${changedRef(c)}: ${(err as Error)?.message ?? err}`);
      }
    }
    this.repaintSoon();
  }

  /** One `sandbox/blocked`: the listed sandbox's counts follow (repainted once per burst), then listeners. */
  private sandboxBlocked(params: unknown): void {
    if (this.shutdownPromise) return;
    const b = params as SandboxBlocked;
    if (!b || typeof b.sandbox !== 'string' || typeof b.host !== 'string') return;
    const ref = blockedRef(b);
    if (this.sandboxesValue) {
      this.sandboxesValue = this.sandboxesValue.map((s) => (sandboxRefOf(s) === ref || s.id === b.sandbox ? withBlocked(s, b) : s));
      this.repaintSoon();
    }
    try {
      this.blockedEmitter.fire(b);
    } catch (err) {
      this.log(`sandbox/blocked of ${ref}: ${(err as Error)?.message ?? err}`);
    }
  }

  /** A sandbox as a call returned it (`sandbox/setNetwork`): the list shows it at once. */
  updateSandbox(s: Sandbox): void {
    if (!this.sandboxesValue || this.shutdownPromise) return;
    const ref = sandboxRefOf(s);
    this.sandboxesValue = this.sandboxesValue.map((x) => (sandboxRefOf(x) === ref ? { ...x, ...s } : x));
    this.repaintSoon();
  }

  /** Repaints the views once for what came within EVENT_DEBOUNCE_MS (no request). */
  private repaintSoon(): void {
    if (this.eventTimer) return;
    this.eventTimer = setTimeout(() => {
      this.eventTimer = undefined;
      if (this.shutdownPromise) return;
      if (this.reloadAfterEvents) {
        this.reloadAfterEvents = false;
        void this.refreshSandboxes();
      } else if (this.sandboxesValue) {
        this.sandboxesEmitter.fire(this.sandboxesValue);
      }
    }, EVENT_DEBOUNCE_MS);
  }

  /**
   * The connection is gone. `keep`: the last list stays, marked stale, until the next one
   * comes (a reconnect) or the broker is found stopped or unreachable; otherwise it goes.
   */
  private lost(keep = false): void {
    this.liveValue = undefined;
    if (this.timer) clearInterval(this.timer);
    if (this.eventTimer) clearTimeout(this.eventTimer);
    this.timer = this.eventTimer = undefined;
    this.reloadAfterEvents = false;
    this.featuresValue = undefined;
    if (keep && this.sandboxesValue !== undefined) {
      this.staleValue = true;
      this.sandboxesEmitter.fire(this.sandboxesValue);
      return;
    }
    this.listAttempted = false;
    this.staleValue = false;
    if (this.sandboxesValue !== undefined) {
      this.sandboxesValue = undefined;
      this.sandboxesEmitter.fire(undefined);
    }
  }

  /**
   * An established connection closed. Over `abx rpc` (or the socket, or ssh) that is either
   * `abx rpc` gone (the daemon runs: connect again at once) or the daemon stopped (`abx
   * broker stop`): then it stays stopped, says so, and waits for the user; connecting would
   * start a new daemon, and a stop would never stick. `abx broker status` tells them apart
   * and never starts one. A private `broker --stdio` is started again (it is this window's).
   */
  private async afterLoss(reason: string): Promise<void> {
    if (this.shutdownPromise) return;
    let settled!: () => void;
    const settling = new Promise<void>((r) => (settled = r));
    this.settling = settling;
    let running: boolean;
    try {
      running = this.settingsValue.connection === 'stdio' ? true : await this.daemonRunning();
    } finally {
      if (this.settling === settling) this.settling = undefined;
      // Waiters ask again once the state below is set (same tick).
      queueMicrotask(settled);
    }
    if (this.shutdownPromise || this.client || this.connecting) return;
    if (!running) {
      this.log(`the abx broker stopped (${reason}); it is started again when you ask for it (Start, or any command)`);
      this.markStopped(true);
      return;
    }
    this.log(`reconnecting (${reason})`);
    void this.getClient({ now: true }).then(
      () => this.refreshSandboxes(),
      () => undefined,
    );
  }

  /** Whether a daemon runs for these settings: `abx broker status` (it never starts one). */
  daemonRunning(): Promise<boolean> {
    const s = this.settingsValue;
    return new Promise((resolve) => {
      try {
        execFile(s.path, ['broker', 'status', '-j'], { env: abxEnv(s), timeout: 10_000 }, (err) => resolve(!err));
      } catch {
        resolve(false);
      }
    });
  }

  /** The broker is stopped: the list goes, the state says so, and (`notify`) a message offers Start. */
  private markStopped(notify: boolean): void {
    if (this.shutdownPromise) return;
    if (this.retryTimer) clearTimeout(this.retryTimer);
    this.retryTimer = undefined;
    this.lost();
    this.listError = undefined;
    this.setState({ kind: 'stopped' });
    this.watchStopped();
    if (notify) {
      void vscode.window.showInformationMessage('The abx broker stopped. It starts again when you ask for it.', 'Start', 'Show Log').then(
        (pick) => {
          if (pick === 'Start') void vscode.commands.executeCommand('abx.startBroker');
          else if (pick === 'Show Log') this.output.show(true);
        },
        () => undefined,
      );
    }
  }

  /** While stopped: joins a daemon that someone else starts (the CLI, an agent, another window). */
  private watchStopped(): void {
    this.stopWatching();
    const t = setInterval(() => {
      if (this.stateValue.kind !== 'stopped' || this.shutdownPromise) return this.stopWatching();
      void this.daemonRunning().then((up) => {
        if (!up || this.stateValue.kind !== 'stopped' || this.stoppedWatch !== t) return;
        this.log('a daemon runs again (started elsewhere): reconnecting');
        void this.getClient({ now: true }).then(
          () => this.refreshSandboxes(),
          () => undefined,
        );
      });
    }, STOPPED_WATCH_MS);
    t.unref?.();
    this.stoppedWatch = t;
  }

  private stopWatching(): void {
    if (this.stoppedWatch) clearInterval(this.stoppedWatch);
    this.stoppedWatch = undefined;
  }

  /** The user asked for the broker (Start): connect now, which starts the daemon. */
  async start(): Promise<BrokerClient> {
    this.failures = 0;
    this.lastFailure = undefined;
    const c = await this.getClient({ now: true });
    await this.refreshSandboxes();
    return c;
  }

  /** The next automatic attempt, `ms` from now (a sooner or later one already planned is replaced). */
  private planRetry(ms: number): void {
    if (this.shutdownPromise) return;
    if (this.retryTimer) clearTimeout(this.retryTimer);
    this.retryAt = Date.now() + ms;
    this.retryTimer = setTimeout(() => {
      this.retryTimer = undefined;
      // `now`: a timer may fire a millisecond before `retryAt` by the wall clock; without it
      // that attempt would be refused as too early and no retry would ever be planned again.
      void this.getClient({ now: true }).then(
        () => this.refreshSandboxes(),
        () => undefined,
      );
    }, ms);
    this.retryTimer.unref?.();
  }

  /** Drops the connection and connects again now (settings re-read, backoff reset). */
  async reconnect(): Promise<BrokerClient> {
    this.settingsValue = this.readSettings();
    const old = this.client;
    this.client = undefined;
    this.failures = 0;
    this.lastFailure = undefined;
    if (old) {
      old.dispose();
      this.lost();
    }
    const c = await this.getClient({ now: true });
    await this.refreshSandboxes();
    return c;
  }

  /** Settings changed: apply them (a new abx path, home or mode means a new connection, now). */
  async settingsChanged(): Promise<void> {
    const before = this.settingsValue;
    this.settingsValue = this.readSettings();
    const s = this.settingsValue;
    if (before.path !== s.path || before.home !== s.home || before.connection !== s.connection) {
      if (this.client || this.stateValue.kind === 'error') await this.reconnect().catch(() => undefined);
    }
    this.schedule();
  }

  /**
   * Reloads the sandbox list (connecting when needed). The list does not wait for the
   * providers' features (`provider/list` starts plugins, which can take seconds): the rows
   * are repainted when those come.
   */
  async refreshSandboxes(opts: GetClientOptions = {}): Promise<Sandbox[] | undefined> {
    this.listAttempted = true;
    let counted = false;
    try {
      const client = await this.getClient(opts);
      // Events that come while the list is on its way are applied on top of it.
      this.listsInFlight++;
      counted = true;
      const seen = this.changesDuringList.length;
      if (!this.featuresValue) this.loadFeatures(client);
      const list = await client.sandboxList();
      let current = list;
      for (const c of this.changesDuringList.slice(seen)) current = applySandboxChange(current, c).list;
      this.sandboxesValue = current;
      this.staleValue = false;
      this.listError = undefined;
    } catch (err) {
      const e = AbxError.from(err);
      if (this.staleValue && (this.stateValue.kind === 'connecting' || this.connecting)) {
        // Reconnecting: the last list stays (stale) until the connection is settled.
        this.log(`sandbox/list while reconnecting: ${e.headline}`);
      } else {
        this.listError = this.stateValue.kind === 'stopped' ? undefined : e;
        if (this.stateValue.kind !== 'error' && this.stateValue.kind !== 'stopped') this.log(`sandbox/list: ${e.headline}`);
        this.sandboxesValue = undefined;
        this.staleValue = false;
      }
    } finally {
      if (counted && --this.listsInFlight === 0) this.changesDuringList = [];
    }
    if (!this.shutdownPromise) this.sandboxesEmitter.fire(this.sandboxesValue);
    return this.sandboxesValue;
  }

  /** The providers' features (the rows' menus depend on them); the views repaint when they come. */
  private loadFeatures(client: BrokerClient): void {
    if (this.featuresLoading === client) return;
    this.featuresLoading = client;
    client.providerList().then(
      (ps) => {
        if (this.featuresLoading === client) this.featuresLoading = undefined;
        if (this.client !== client || this.shutdownPromise) return;
        this.featuresValue = new Map(ps.map((p) => [p.id, p.features]));
        if (this.sandboxesValue) this.sandboxesEmitter.fire(this.sandboxesValue);
      },
      () => {
        if (this.featuresLoading === client) this.featuresLoading = undefined;
      },
    );
  }

  /**
   * The fallback poll: only on a broker without `sandbox/subscribe` (live === false). A live
   * connection needs none: every change, by anyone, comes as an event.
   */
  private schedule(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
    const every = this.settingsValue.refreshInterval;
    if (this.liveValue === false && every > 0 && !this.shutdownPromise) {
      this.timer = setInterval(() => {
        // Only while connected: a missing binary is retried on the backoff schedule.
        if (this.client && !this.client.isClosed) void this.refreshSandboxes();
      }, every * 1000);
    }
  }

  /**
   * Runs `hook` when the extension shuts down, before the connection closes (a terminal
   * ends its command in the sandbox). Dispose to unregister.
   */
  onShutdown(hook: () => Promise<void>): vscode.Disposable {
    this.shutdownHooks.add(hook);
    return new vscode.Disposable(() => this.shutdownHooks.delete(hook));
  }

  /**
   * Ends what this window started in sandboxes (terminals, commands), then closes the
   * connection and waits for `abx rpc` to exit. Once; never rejects.
   */
  shutdown(): Promise<void> {
    this.shutdownPromise ??= this.doShutdown();
    return this.shutdownPromise;
  }

  private async doShutdown(): Promise<void> {
    if (this.timer) clearInterval(this.timer);
    if (this.retryTimer) clearTimeout(this.retryTimer);
    if (this.eventTimer) clearTimeout(this.eventTimer);
    this.timer = this.retryTimer = this.eventTimer = undefined;
    this.stopWatching();
    // Short: VS Code restarts the extension host when a window becomes a workspace, and the
    // web does not wait for long work at shutdown ("Long running operations during shutdown
    // are unsupported in the web"). The hang-ups are sent at once; what they do not finish
    // within the budget, the closed connection ends (`abx rpc` then ends its streams).
    const budget = new Promise((r) => setTimeout(r, SHUTDOWN_BUDGET_MS).unref());
    const hooks = [...this.shutdownHooks];
    this.shutdownHooks.clear();
    if (hooks.length) {
      await Promise.race([Promise.allSettled(hooks.map((h) => Promise.resolve().then(h))), budget]);
    }
    const c = this.client;
    this.client = undefined;
    // A connection still being made closes itself when it is done (connect() checks).
    // `abx rpc` gets its stdin closed now; its exit is not waited for beyond the budget
    // (the SDK's timers end it if it stays).
    if (c) await Promise.race([c.close().catch(() => undefined), budget]);
  }

  dispose(): void {
    void this.shutdown();
    this.stateEmitter.dispose();
    this.sandboxesEmitter.dispose();
    this.endedEmitter.dispose();
    this.blockedEmitter.dispose();
  }
}
