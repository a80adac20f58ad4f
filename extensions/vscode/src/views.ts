// The Sandboxes view (grouped by provider, status icons) and the Providers view (trust,
// features, doctor results).
import * as vscode from 'vscode';
import { AbxError } from './client/errors';
import { formatRemaining, groupByProvider, groupFeatures, sandboxRef } from './client/format';
import type { DoctorResult, ProviderSummary, Sandbox } from './client/types';
import { networkChildren, networkTooltip, policyOf } from './network';
import type { AbxService } from './service';

// ---------------------------------------------------------------- sandboxes

export type SandboxNode =
  | { kind: 'group'; provider: string; sandboxes: Sandbox[] }
  | { kind: 'sandbox'; sandbox: Sandbox }
  /** A row under a sandbox with a network policy: allowed, denied, each blocked host (issue 44). */
  | {
      kind: 'network';
      id: string;
      /** `provider:id` of its sandbox. */
      ref: string;
      label: string;
      description?: string;
      icon: string;
      color?: string;
      tooltip?: string;
      /** A blocked host:port (its row offers Allow). */
      blocked?: { host: string; port: number };
    };

export function sandboxIcon(status: string): vscode.ThemeIcon {
  switch (status) {
    case 'running':
      return new vscode.ThemeIcon('vm-running', new vscode.ThemeColor('charts.green'));
    case 'paused':
      return new vscode.ThemeIcon('debug-pause', new vscode.ThemeColor('charts.yellow'));
    default:
      return new vscode.ThemeIcon('vm-outline');
  }
}

/** How often the rows' time left ("expires in 4m 58s") is repainted: no broker request. */
export const REPAINT_MS = 10_000;

export class SandboxesProvider implements vscode.TreeDataProvider<SandboxNode>, vscode.Disposable {
  private readonly emitter = new vscode.EventEmitter<SandboxNode | undefined>();
  readonly onDidChangeTreeData = this.emitter.event;
  /** Set by extension.ts: shows why the list is empty (an error) or clears it. */
  view: vscode.TreeView<SandboxNode> | undefined;
  private readonly repaint: NodeJS.Timeout;
  /** Root reads in progress, and whether something changed meanwhile. */
  private loading = 0;
  private dirty = false;

  constructor(private readonly service: AbxService) {
    service.onDidChangeSandboxes(() => this.changed());
    service.onDidChangeState(() => this.changed());
    // The list itself follows the broker's events; only the clock moves on its own.
    this.repaint = setInterval(() => {
      if (this.service.sandboxes?.some((s) => s.expiresAt)) this.emitter.fire(undefined);
    }, REPAINT_MS);
    this.repaint.unref?.();
  }

  /** Repaints now, or once the root being read is done. */
  private changed(): void {
    if (this.loading > 0) this.dirty = true;
    else this.emitter.fire(undefined);
  }

  dispose(): void {
    clearInterval(this.repaint);
    this.emitter.dispose();
  }

  refresh(): void {
    void this.service.refreshSandboxes();
  }

  getTreeItem(node: SandboxNode): vscode.TreeItem {
    if (node.kind === 'group') {
      const item = new vscode.TreeItem(node.provider, vscode.TreeItemCollapsibleState.Expanded);
      // Stable across reloads and reconnects (VS Code keeps expansion by id).
      item.id = `group:${node.provider}`;
      const running = node.sandboxes.filter((s) => s.status === 'running').length;
      item.description = `${node.sandboxes.length} sandbox${node.sandboxes.length === 1 ? '' : 'es'}${running < node.sandboxes.length ? `, ${running} running` : ''}`;
      item.iconPath = new vscode.ThemeIcon('server-environment');
      item.contextValue = 'sandboxGroup';
      return item;
    }
    if (node.kind === 'network') {
      const item = new vscode.TreeItem(node.label, vscode.TreeItemCollapsibleState.None);
      item.id = node.id;
      item.description = node.description;
      item.iconPath = new vscode.ThemeIcon(node.icon, node.color ? new vscode.ThemeColor(node.color) : undefined);
      item.tooltip = node.tooltip ?? [node.label, node.description].filter(Boolean).join(': ');
      item.contextValue = node.blocked ? 'blockedHost' : 'networkLine';
      item.accessibilityInformation = { label: [node.label, node.description].filter(Boolean).join(': ') };
      return item;
    }
    const s = node.sandbox;
    const policy = policyOf(s);
    // A sandbox with a network policy expands to it and what it refused.
    const item = new vscode.TreeItem(s.id, policy ? vscode.TreeItemCollapsibleState.Collapsed : vscode.TreeItemCollapsibleState.None);
    item.id = `sandbox:${sandboxRef(s)}`;
    const left = s.expiresAt ? formatRemaining(Date.parse(s.expiresAt) - Date.now()) : undefined;
    const blocked = policy?.blocked?.length ? `${policy.blocked.length} blocked` : undefined;
    item.description = [s.template, s.status, left ? `expires in ${left}` : undefined, blocked].filter(Boolean).join(' · ');
    item.iconPath = sandboxIcon(s.status);
    item.contextValue = sandboxContext(s, this.service.providerFeatures(s.provider));
    const md = new vscode.MarkdownString();
    md.appendMarkdown(`**${sandboxRef(s)}**\n\n`);
    for (const [k, v] of [
      ['Status', s.status],
      ['Template', s.template],
      ['Region', s.region],
      ['URL', s.url],
      ['Started', s.startedAt],
      ['Expires', s.expiresAt],
      ['Lifetime', s.timeout ? `${s.timeout} s` : undefined],
    ] as [string, unknown][]) {
      if (v !== undefined && v !== null && v !== '') md.appendMarkdown(`- ${k}: \`${String(v)}\`\n`);
    }
    const meta = s.metadata && Object.keys(s.metadata).length ? JSON.stringify(s.metadata) : '';
    if (meta) md.appendMarkdown(`- Metadata: \`${meta}\`\n`);
    const net = networkTooltip(s);
    if (net) md.appendMarkdown(net);
    item.tooltip = md;
    return item;
  }

  async getChildren(node?: SandboxNode): Promise<SandboxNode[]> {
    if (node?.kind === 'group') {
      // The list's latest copy (a group node may be older than the last repaint).
      const now = this.service.sandboxes?.filter((s) => s.provider === node.provider);
      return (now ?? node.sandboxes).map((sandbox) => ({ kind: 'sandbox', sandbox }));
    }
    if (node?.kind === 'sandbox') {
      // The list's latest copy: blocked counts change without the row being asked again.
      const ref = sandboxRef(node.sandbox);
      const now = this.service.sandboxes?.find((x) => sandboxRef(x) === ref) ?? node.sandbox;
      return networkChildren(now);
    }
    if (node) return [];
    this.loading++;
    try {
      return await this.root();
    } finally {
      // Changes that came while the root was being read repaint once, after it: a repaint
      // during the read makes VS Code cancel it ("Unable to refresh tree view: Canceled").
      if (--this.loading === 0 && this.dirty) {
        this.dirty = false;
        setTimeout(() => this.emitter.fire(undefined), 0);
      }
    }
  }

  private async root(): Promise<SandboxNode[]> {
    let list = this.service.sandboxes;
    const first = this.service.state;
    if (!list && !this.service.sandboxesAttempted && first.kind !== 'error' && first.kind !== 'stopped') {
      list = await this.service.refreshSandboxes();
    }
    const st = this.service.state;
    const stale = !!list && this.service.stale;
    let message: string | undefined;
    if (st.kind === 'stopped') message = 'The abx broker is stopped.';
    else if (st.kind === 'error') message = `${st.error.headline}${st.error.suggestion ? ` ${st.error.suggestion}` : ''}`;
    else if (stale) message = 'Reconnecting to the abx broker… (the list may be out of date)';
    else if (!list && this.service.listError) message = `${this.service.listError.headline}${this.service.listError.suggestion ? ` ${this.service.listError.suggestion}` : ''}`;
    if (this.view) this.view.message = message;
    // Offline or stopped: no stale list with actions that cannot work. Reconnecting: the last
    // list (its group and row ids stay, so VS Code keeps what was expanded or selected).
    if (!list || st.kind === 'error' || st.kind === 'stopped') return [];
    return groupByProvider(list).map(([provider, sandboxes]) => ({ kind: 'group', provider, sandboxes }));
  }
}

/**
 * A sandbox row's `contextValue`: `sandbox-<status>`, then `:<feature>` for the features of
 * its provider that menus depend on (`sandbox-running:pty`), and `:policy` for a sandbox with
 * a network policy. package.json's menus match it.
 */
export function sandboxContext(s: Sandbox, features: string[] | undefined): string {
  const tags = ['pty'].filter((f) => features?.includes(f));
  // `policy`: a network policy (Allow Host applies).
  if (policyOf(s)) tags.push('policy');
  return [`sandbox-${s.status}`, ...tags].join(':');
}

// ---------------------------------------------------------------- providers

export type ProviderNode =
  | { kind: 'provider'; provider: ProviderSummary }
  | { kind: 'features'; provider: ProviderSummary }
  | { kind: 'doctor'; provider: ProviderSummary }
  | { kind: 'line'; label: string; description?: string; icon?: string; color?: string; tooltip?: string; a11y?: string };

const TRUST: Record<string, { icon: string; note: string }> = {
  builtin: { icon: 'verified', note: 'Part of the broker.' },
  pinned: { icon: 'lock', note: 'Installed from a full commit id; its files are checked against the digest before every start.' },
  local: { icon: 'folder', note: 'Installed from a local directory; its files are checked against the digest before every start.' },
  unpinned: { icon: 'unlock', note: 'Installed from a moving ref (branch or tag): updates may bring unreviewed code.' },
};

export class ProvidersProvider implements vscode.TreeDataProvider<ProviderNode> {
  private readonly emitter = new vscode.EventEmitter<ProviderNode | undefined>();
  readonly onDidChangeTreeData = this.emitter.event;
  private providers: ProviderSummary[] | undefined;
  private readonly doctor = new Map<string, DoctorResult | AbxError>();
  view: vscode.TreeView<ProviderNode> | undefined;

  constructor(private readonly service: AbxService) {
    service.onDidChangeState((s) => {
      if (s.kind !== 'connecting') this.refresh();
    });
  }

  /** Root reads in progress, and whether a reload was asked for meanwhile. */
  private loading = 0;
  private dirty = false;

  /** Forgets what it loaded (doctor results too) and reloads (after a root read in progress). */
  refresh(): void {
    if (this.loading > 0) {
      this.dirty = true;
      return;
    }
    this.providers = undefined;
    this.doctor.clear();
    this.emitter.fire(undefined);
  }

  /** Stores a doctor result (from the doctor command) and shows it. */
  setDoctor(id: string, r: DoctorResult | AbxError): void {
    this.doctor.set(id, r);
    this.emitter.fire(undefined);
  }

  getTreeItem(node: ProviderNode): vscode.TreeItem {
    switch (node.kind) {
      case 'provider': {
        const p = node.provider;
        const item = new vscode.TreeItem(p.name || p.id, vscode.TreeItemCollapsibleState.Collapsed);
        item.id = `provider:${p.id}`;
        item.description = [p.id, p.version, p.trust, p.default ? 'default' : undefined].filter(Boolean).join(' · ');
        const t = TRUST[p.trust];
        item.iconPath = new vscode.ThemeIcon(
          t?.icon ?? 'extensions',
          p.trust === 'unpinned' ? new vscode.ThemeColor('charts.yellow') : undefined,
        );
        item.tooltip = `${p.name} (${p.id}) ${p.version}\nKind: ${p.kind}\nTrust: ${p.trust}. ${t?.note ?? ''}\nFeatures: ${groupFeatures(p.features).join(' ')}`;
        item.contextValue = p.default ? 'provider-default' : 'provider';
        return item;
      }
      case 'features': {
        const item = new vscode.TreeItem('Features', vscode.TreeItemCollapsibleState.Collapsed);
        item.id = `features:${node.provider.id}`;
        item.description = `${node.provider.features.length}`;
        item.iconPath = new vscode.ThemeIcon('symbol-property');
        return item;
      }
      case 'doctor': {
        const r = this.doctor.get(node.provider.id);
        const item = new vscode.TreeItem('Doctor', vscode.TreeItemCollapsibleState.Collapsed);
        item.id = `doctor:${node.provider.id}`;
        item.description = !r ? 'expand to run' : r instanceof AbxError ? r.headline : r.ok ? 'all checks passed' : 'problems found';
        item.iconPath = new vscode.ThemeIcon(
          !r ? 'pulse' : r instanceof AbxError || !r.ok ? 'error' : 'pass',
          !r ? undefined : new vscode.ThemeColor(r instanceof AbxError || !r.ok ? 'charts.red' : 'charts.green'),
        );
        item.contextValue = 'doctor';
        return item;
      }
      case 'line': {
        const item = new vscode.TreeItem(node.label, vscode.TreeItemCollapsibleState.None);
        item.description = node.description;
        if (node.icon) item.iconPath = new vscode.ThemeIcon(node.icon, node.color ? new vscode.ThemeColor(node.color) : undefined);
        item.tooltip = node.tooltip;
        // Screen readers read this, not the tooltip (which may be empty).
        item.accessibilityInformation = {
          label: node.a11y ?? [node.label, node.description].filter((x) => x !== undefined && x !== null && x !== '').join(': '),
        };
        return item;
      }
    }
  }

  async getChildren(node?: ProviderNode): Promise<ProviderNode[]> {
    if (!node) {
      this.loading++;
      try {
        return await this.root();
      } finally {
        // A repaint while VS Code waits for the root cancels it: it comes after.
        if (--this.loading === 0 && this.dirty) {
          this.dirty = false;
          setTimeout(() => this.refresh(), 0);
        }
      }
    }
    return this.children(node);
  }

  private async root(): Promise<ProviderNode[]> {
    {
      if (!this.providers) {
        try {
          // Not `now`: after a failed attempt this waits for the backoff instead of
          // connecting again on each repaint (every failure repaints this view).
          this.providers = await (await this.service.getClient()).providerList();
          if (this.view) this.view.message = undefined;
        } catch (err) {
          const e = AbxError.from(err);
          if (this.view) this.view.message = `${e.headline}${e.suggestion ? ` ${e.suggestion}` : ''}`;
          return [];
        }
      }
      return this.providers.map((provider) => ({ kind: 'provider', provider }));
    }
  }

  private async children(node: ProviderNode): Promise<ProviderNode[]> {
    switch (node.kind) {
      case 'provider': {
        const p = node.provider;
        const t = TRUST[p.trust];
        return [
          { kind: 'line', label: 'Trust', description: p.trust, icon: t?.icon ?? 'shield', tooltip: t?.note },
          { kind: 'line', label: 'Kind', description: p.kind === 'exec' ? 'exec (EPP/1 plugin)' : p.kind, icon: 'gear' },
          { kind: 'line', label: 'Version', description: p.version, icon: 'tag' },
          { kind: 'features', provider: p },
          { kind: 'doctor', provider: p },
        ];
      }
      case 'features':
        return groupFeatures(node.provider.features).map((g) => ({ kind: 'line', label: g, icon: 'check' }));
      case 'doctor': {
        let r = this.doctor.get(node.provider.id);
        if (!r) {
          try {
            r = await (await this.service.getClient()).providerDoctor(node.provider.id);
          } catch (err) {
            r = AbxError.from(err);
          }
          this.doctor.set(node.provider.id, r);
          // The Doctor row's own icon shows the verdict.
          setTimeout(() => this.emitter.fire(node), 0);
        }
        if (r instanceof AbxError) {
          return [{ kind: 'line', label: r.headline, icon: 'error', color: 'charts.red', tooltip: r.describe(), a11y: `Doctor failed: ${r.describe()}` }];
        }
        return r.checks.map((c) => {
          const detail = typeof c.detail === 'string' && c.detail ? c.detail : undefined;
          const verdict = c.ok ? 'passed' : 'failed';
          return {
            kind: 'line',
            label: c.name,
            description: detail,
            icon: c.ok ? 'pass' : 'error',
            color: c.ok ? 'charts.green' : 'charts.red',
            tooltip: detail ? `${verdict}: ${detail}` : verdict,
            a11y: `${c.name} check ${verdict}${detail ? `: ${detail}` : ''}`,
          };
        });
      }
      default:
        return [];
    }
  }
}
