// Egress by name (issue 44): the network asked for at create (a mode, or "only these hosts"
// as a policy), the policy and its blocked attempts shown in the Sandboxes view, a
// notification with "Allow" when the broker reports a refused connection (`sandbox/blocked`),
// and "abx: Allow Host for Sandbox..." (`sandbox/info` + `sandbox/setNetwork`).
import * as vscode from 'vscode';
import type { BrokerClient } from './client/broker';
import { AbxError } from './client/errors';
import { sandboxRef } from './client/format';
import type { Sandbox } from './client/types';
import { showError } from './commands';
import type { AbxService } from './service';
import type { SandboxNode } from './views';

export const NETWORK_COMMANDS = ['abx.allowHost'] as const;

/** The feature of a provider that enforces a policy (and understands the network modes). */
export const POLICY_FEATURE = 'network.vpc';

/** A policy entry: a pattern, or a pattern with headers the proxy adds. */
export type PolicyEntry = string | { host: string; headers?: Record<string, string> };

export interface Policy {
  allow: PolicyEntry[];
  deny?: string[];
}

export interface BlockedCount {
  host: string;
  port: number;
  count: number;
  last?: string;
}

/** A sandbox's network as the broker reports it: a mode, or a policy with what it refused. */
export type SandboxNetwork = string | (Policy & { blocked?: BlockedCount[] });

/** `sandbox/blocked` params. */
export interface SandboxBlocked {
  sandbox: string;
  provider?: string;
  host: string;
  port: number;
  count: number;
}

/** The labels of the create-time quick pick (tests answer with them). */
export const NETWORK_PICKS = {
  none: 'none',
  policy: 'only these hosts…',
  internet: 'internet',
  host: 'host',
} as const;

/** `network` of a Sandbox (undefined: the broker did not say). */
export function networkOf(s: Sandbox | undefined): SandboxNetwork | undefined {
  const n = (s as { network?: unknown } | undefined)?.network;
  if (typeof n === 'string') return n;
  if (n && typeof n === 'object' && Array.isArray((n as Policy).allow)) return n as SandboxNetwork;
  return undefined;
}

/** The policy of a sandbox with one (undefined: a mode, or not said). */
export function policyOf(s: Sandbox | undefined): (Policy & { blocked?: BlockedCount[] }) | undefined {
  const n = networkOf(s);
  return n && typeof n === 'object' ? n : undefined;
}

/** A policy entry as text (`host`, or the host of an entry with headers). */
export function entryText(e: PolicyEntry): string {
  return typeof e === 'string' ? e : `${e.host}${e.headers && Object.keys(e.headers).length ? ' (+headers)' : ''}`;
}

function entryHost(e: PolicyEntry): string {
  return typeof e === 'string' ? e : e.host;
}

/** `a.example, b.example:8443` (or `a, b` with whitespace): the patterns, empty ones dropped. */
export function parseHosts(text: string): string[] {
  return text
    .split(/[\s,]+/)
    .map((h) => h.trim())
    .filter(Boolean);
}

/** What "Allow" adds for a refused `host:port`: the host for 80 and 443 (a pattern without port covers both), else `host:port`. */
export function allowEntry(host: string, port: number | undefined): string {
  const h = host.includes(':') && !host.startsWith('[') && /^[0-9a-f:]+$/i.test(host) ? `[${host}]` : host;
  return !port || port === 80 || port === 443 ? host : `${h}:${port}`;
}

/** `n times` / `once`. */
export function times(n: number): string {
  return n === 1 ? 'once' : `${n} times`;
}

/** The notification's text for a `sandbox/blocked`. */
export function blockedText(b: SandboxBlocked): string {
  return `Sandbox ${blockedRef(b)} tried to reach ${b.host}:${b.port} (blocked ${b.count} ${b.count === 1 ? 'time' : 'times'}).`;
}

/** `provider:id` of a `sandbox/blocked`. */
export function blockedRef(b: SandboxBlocked): string {
  return b.sandbox.includes(':') || !b.provider ? b.sandbox : `${b.provider}:${b.sandbox}`;
}

/** A policy in one line: `allow a, b; deny c`. */
export function formatPolicy(p: Policy): string {
  const allow = p.allow.length ? p.allow.map(entryText).join(', ') : 'nothing';
  const deny = p.deny?.length ? `; deny ${p.deny.join(', ')}` : '';
  return `allow ${allow}${deny}`;
}

/** The tooltip lines (markdown) of a sandbox's network. */
export function networkTooltip(s: Sandbox): string {
  const n = networkOf(s);
  if (n === undefined) return '';
  if (typeof n === 'string') return `- Network: \`${n}\`\n`;
  let md = `- Network: only these hosts: ${n.allow.length ? n.allow.map((e) => `\`${entryText(e)}\``).join(', ') : 'none'}\n`;
  if (n.deny?.length) md += `- Denied: ${n.deny.map((e) => `\`${e}\``).join(', ')}\n`;
  const blocked = n.blocked ?? [];
  if (blocked.length) {
    md += `- Blocked: ${blocked
      .slice(0, 10)
      .map((b) => `\`${b.host}:${b.port}\` ${times(b.count)}`)
      .join(', ')}${blocked.length > 10 ? `, and ${blocked.length - 10} more` : ''}\n`;
  } else {
    md += '- Blocked: nothing yet\n';
  }
  return md;
}

/** The rows under a sandbox with a policy in the Sandboxes view. */
export function networkChildren(s: Sandbox): SandboxNode[] {
  const p = policyOf(s);
  if (!p) return [];
  const ref = sandboxRef(s);
  const rows: SandboxNode[] = [
    {
      kind: 'network',
      id: `net-allow:${ref}`,
      label: 'Allowed',
      description: p.allow.length ? p.allow.map(entryText).join(', ') : 'no host',
      icon: 'globe',
      ref,
    },
  ];
  if (p.deny?.length) rows.push({ kind: 'network', id: `net-deny:${ref}`, label: 'Denied', description: p.deny.join(', '), icon: 'circle-slash', ref });
  const blocked = [...(p.blocked ?? [])].sort((a, b) => (b.last ?? '').localeCompare(a.last ?? '') || b.count - a.count);
  if (!blocked.length) rows.push({ kind: 'network', id: `net-blocked:${ref}`, label: 'Blocked', description: 'nothing yet', icon: 'shield', ref });
  for (const b of blocked) {
    rows.push({
      kind: 'network',
      id: `net-blocked:${ref}:${b.host}:${b.port}`,
      label: `${b.host}:${b.port}`,
      description: `blocked ${times(b.count)}`,
      icon: 'warning',
      color: 'charts.yellow',
      ref,
      blocked: { host: b.host, port: b.port },
      tooltip: `${ref} tried to reach ${b.host}:${b.port}: blocked ${times(b.count)}${b.last ? `, last at ${b.last}` : ''}. Allow adds ${allowEntry(b.host, b.port)} to its policy.`,
    });
  }
  return rows;
}

/** A blocked-host list's entry with one more refusal (the event's count), newest first. */
export function withBlocked(s: Sandbox, b: SandboxBlocked, at = new Date()): Sandbox {
  const p = policyOf(s);
  if (!p) return s;
  const last = at.toISOString().replace(/\.\d+Z$/, 'Z');
  const rest = (p.blocked ?? []).filter((x) => !(x.host === b.host && x.port === b.port));
  const blocked = [{ host: b.host, port: b.port, count: b.count, last }, ...rest];
  return { ...s, network: { ...p, blocked } } as Sandbox;
}

/**
 * Asks for the network of a new sandbox (undefined: cancelled). Providers without
 * `network.vpc` are not asked: `null` (their own default applies).
 */
export async function pickNetwork(features: string[] | undefined, preset?: unknown): Promise<SandboxNetwork | null | undefined> {
  if (preset !== undefined && preset !== null) {
    if (typeof preset === 'string') return preset;
    if (typeof preset === 'object' && Array.isArray((preset as Policy).allow)) return preset as Policy;
  }
  if (features && !features.includes(POLICY_FEATURE)) return null;
  const items: (vscode.QuickPickItem & { value: keyof typeof NETWORK_PICKS })[] = [
    { label: NETWORK_PICKS.none, description: 'default', detail: 'No network: loopback inside the sandbox only.', value: 'none' },
    {
      label: NETWORK_PICKS.policy,
      description: 'a list of hosts',
      detail: 'Only the hosts you name (example.com, *.example.com, host:port, an IP or CIDR), through a filtering proxy on this machine; anything else is refused and shown here, with Allow.',
      value: 'policy',
    },
    {
      label: NETWORK_PICKS.internet,
      description: 'the whole internet',
      detail: 'Opens the whole internet to the code in the sandbox (not this machine’s loopback services).',
      value: 'internet',
    },
    { label: NETWORK_PICKS.host, description: 'this machine’s network', detail: 'The host’s own network, loopback services included: no network isolation.', value: 'host' },
  ];
  const picked = await vscode.window.showQuickPick(items, { placeHolder: 'Network of the sandbox', matchOnDetail: true });
  if (!picked) return undefined;
  if (picked.value !== 'policy') return picked.value;
  const text = await vscode.window.showInputBox({
    title: 'Only these hosts',
    prompt: 'Hosts the sandbox may reach, comma-separated: example.com, *.example.com (its subdomains), host:port (else 80 and 443), an IP or CIDR, @set',
    placeHolder: 'pypi.example, files.pypi.example',
    validateInput: (v) => (parseHosts(v).length ? undefined : 'Name at least one host'),
  });
  if (text === undefined) return undefined;
  const allow = parseHosts(text);
  if (!allow.length) return undefined;
  return { allow };
}

/** The features of `provider` (undefined: the broker's default provider). */
export async function providerFeatures(client: BrokerClient, provider: string | undefined): Promise<string[] | undefined> {
  try {
    const all = await client.providerList();
    return (provider ? all.find((p) => p.id === provider) : all.find((p) => p.default))?.features;
  } catch {
    return undefined;
  }
}

/** What a network choice says in a toast: `` (none), ` (network: internet)`, ` (network: only a, b)`. */
export function networkNote(n: SandboxNetwork | null | undefined): string {
  if (!n || n === 'none') return '';
  if (typeof n === 'string') return ` (network: ${n})`;
  return ` (network: only ${n.allow.map(entryText).join(', ')})`;
}

/**
 * Adds `entries` to the allow list of sandbox `sb` (its current policy read with
 * `sandbox/info`, written with `sandbox/setNetwork`); returns the sandbox as it is now.
 */
export async function allowHosts(client: BrokerClient, sb: string, entries: string[]): Promise<Sandbox> {
  const info = await client.sandboxInfo(sb);
  const n = networkOf(info);
  if (typeof n !== 'object') {
    throw new AbxError('E1004', `Sandbox ${sb} has no host list to add to: its network is '${n ?? 'not reported'}'.`, {
      suggestion: "A sandbox's hosts can be allowed when it was created with a list of hosts ('only these hosts…', CLI --allow HOST); a network mode cannot become a policy while it runs.",
    });
  }
  const have = new Set(n.allow.map(entryHost));
  const allow = [...n.allow, ...entries.filter((e) => !have.has(e))];
  const network: Policy = { allow };
  if (n.deny?.length) network.deny = n.deny;
  return client.request<Sandbox>('sandbox/setNetwork', { sandbox: sb, network });
}

/** `sandbox/blocked` shown as a notification with Allow; the view's counts follow. */
export class Network implements vscode.Disposable {
  /** `provider:id|host` with a notification open: no second one until it is answered. */
  private readonly open = new Set<string>();
  /** One read-modify-write of a sandbox's policy at a time. */
  private readonly queue = new Map<string, Promise<unknown>>();
  private readonly disposables: vscode.Disposable[] = [];

  constructor(private readonly service: AbxService) {
    this.disposables.push(service.onDidBlock((b) => this.blocked(b)));
  }

  /** How many notifications wait for an answer (tests). */
  get pending(): number {
    return this.open.size;
  }

  private blocked(b: SandboxBlocked): void {
    const ref = blockedRef(b);
    const key = `${ref}|${b.host}`;
    // Once per host per sandbox until it is answered: a retry loop does not stack them.
    if (this.open.has(key)) return;
    this.open.add(key);
    const entry = allowEntry(b.host, b.port);
    void Promise.resolve(vscode.window.showWarningMessage(blockedText(b), 'Allow', 'Dismiss')).then(
      async (pick) => {
        try {
          if (pick === 'Allow') await this.allow(ref, [entry]);
        } catch (err) {
          await showError(err, this.service, `Allow ${entry} for ${ref}`);
        } finally {
          this.open.delete(key);
        }
      },
      () => this.open.delete(key),
    );
  }

  /** Adds `entries` to the sandbox's allow list (one change at a time per sandbox). */
  async allow(sb: string, entries: string[]): Promise<Sandbox> {
    const prev = this.queue.get(sb) ?? Promise.resolve();
    const next = prev.catch(() => undefined).then(async () => {
      const client = await this.service.getClient({ now: true });
      const s = await allowHosts(client, sb, entries);
      this.service.updateSandbox(s);
      this.service.log(`${sb}: allowed ${entries.join(', ')} (sandbox/setNetwork)`);
      void vscode.window.showInformationMessage(`Sandbox ${sb} may now reach ${entries.join(', ')}.`);
      return s;
    });
    this.queue.set(sb, next);
    try {
      return await next;
    } finally {
      if (this.queue.get(sb) === next) this.queue.delete(sb);
    }
  }

  /** "abx: Allow Host for Sandbox...": a node (sandbox or blocked host), a ref, or asks. */
  async allowCommand(arg?: unknown, hostArg?: unknown): Promise<Sandbox | undefined> {
    let sb: string | undefined;
    let proposed: string | undefined;
    if (arg && typeof arg === 'object' && 'kind' in arg && (arg as SandboxNode).kind === 'network') {
      const n = arg as SandboxNode & { kind: 'network' };
      sb = n.ref;
      if (n.blocked) proposed = allowEntry(n.blocked.host, n.blocked.port);
    } else if (typeof arg === 'string' && arg) {
      sb = arg;
    } else if (arg && typeof arg === 'object' && 'kind' in arg && (arg as SandboxNode).kind === 'sandbox') {
      sb = sandboxRef((arg as SandboxNode & { kind: 'sandbox' }).sandbox);
    } else {
      sb = await this.pickPolicySandbox();
    }
    if (!sb) return undefined;
    let hosts: string[];
    if (typeof hostArg === 'string') hosts = parseHosts(hostArg);
    else if (Array.isArray(hostArg)) hosts = hostArg.map(String);
    else if (proposed) hosts = [proposed];
    else {
      const info = await (await this.service.getClient({ now: true })).sandboxInfo(sb);
      const p = policyOf(info);
      const last = p?.blocked?.[0];
      const text = await vscode.window.showInputBox({
        title: `Allow hosts for ${sb}`,
        prompt: `Added to its allow list${p ? ` (now: ${p.allow.map(entryText).join(', ') || 'none'})` : ''}: example.com, *.example.com, host:port, an IP or CIDR; comma-separated`,
        value: last ? allowEntry(last.host, last.port) : undefined,
        validateInput: (v) => (parseHosts(v).length ? undefined : 'Name at least one host'),
      });
      if (text === undefined) return undefined;
      hosts = parseHosts(text);
    }
    if (!hosts.length) return undefined;
    return this.allow(sb, hosts);
  }

  /** A sandbox with a policy, picked (only those can allow a host). */
  private async pickPolicySandbox(): Promise<string | undefined> {
    const list = await (await this.service.getClient({ now: true })).sandboxList();
    const withPolicy = list.filter((s) => policyOf(s));
    if (!withPolicy.length) {
      void vscode.window.showInformationMessage("No sandbox has a list of allowed hosts: create one with the network 'only these hosts…'.");
      return undefined;
    }
    const picked = await vscode.window.showQuickPick(
      withPolicy.map((s) => ({ label: sandboxRef(s), description: formatPolicy(policyOf(s)!), ref: sandboxRef(s) })),
      { placeHolder: 'Allow a host for which sandbox?' },
    );
    return picked?.ref;
  }

  register(): vscode.Disposable[] {
    return [
      vscode.commands.registerCommand('abx.allowHost', async (arg?: unknown, host?: unknown) => {
        try {
          return await this.allowCommand(arg, host);
        } catch (err) {
          await showError(err, this.service);
          return undefined;
        }
      }),
    ];
  }

  dispose(): void {
    for (const d of this.disposables.splice(0)) d.dispose();
  }
}
