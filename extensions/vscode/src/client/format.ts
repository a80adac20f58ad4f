// Small pure helpers for what the views show and what the prompts accept. No `vscode` import.

import type { Sandbox, SandboxChanged } from './types';

/** `sandbox(lifecycle,timeout,pause) exec(run,stream) pty` grouping, as the CLI shows features. */
export function groupFeatures(features: string[]): string[] {
  const groups = new Map<string, string[]>();
  for (const f of features) {
    const i = f.indexOf('.');
    const head = i < 0 ? f : f.slice(0, i);
    const tail = i < 0 ? '' : f.slice(i + 1);
    const g = groups.get(head) ?? [];
    if (tail) g.push(tail);
    groups.set(head, g);
  }
  return [...groups].map(([head, tails]) => (tails.length ? `${head}(${tails.join(',')})` : head));
}

/**
 * Seconds from `600`, `90s`, `10m`, `2h`, `1d` (as the CLI's --timeout). Undefined when it is
 * not a duration or outside 1 s .. 30 days.
 */
export function parseDuration(text: string): number | undefined {
  const m = /^\s*(\d+)\s*([smhd]?)\s*$/i.exec(text);
  if (!m) return undefined;
  const n = Number(m[1]) * ({ '': 1, s: 1, m: 60, h: 3600, d: 86400 } as Record<string, number>)[m[2].toLowerCase()];
  return n >= 1 && n <= 2_592_000 ? n : undefined;
}

/** `4m 10s`, `2h 5m`, `3d 1h` (two units at most), `expired` when not positive. */
export function formatRemaining(ms: number): string {
  if (ms <= 0) return 'expired';
  const s = Math.floor(ms / 1000);
  const parts: [number, string][] = [
    [Math.floor(s / 86400), 'd'],
    [Math.floor((s % 86400) / 3600), 'h'],
    [Math.floor((s % 3600) / 60), 'm'],
    [s % 60, 's'],
  ];
  const first = parts.findIndex(([n]) => n > 0);
  if (first < 0) return '0s';
  return parts
    .slice(first, first + 2)
    .filter(([n]) => n > 0)
    .map(([n, u]) => `${n}${u}`)
    .join(' ');
}

/**
 * When a sandbox ends, as the Sandboxes view says it: `expires in 4m 58s`, `expired`,
 * `does not expire` (no `expiresAt`).
 */
export function formatExpiry(expiresAt: string | null | undefined, now = Date.now()): string {
  if (!expiresAt) return 'does not expire';
  const at = Date.parse(expiresAt);
  if (Number.isNaN(at)) return `expires ${expiresAt}`;
  const left = formatRemaining(at - now);
  return left === 'expired' ? 'expired' : `expires in ${left}`;
}

/** `1 connection`, `2 connections`, `0 sandboxes`. */
export function plural(n: number, one: string, many = `${one}s`): string {
  return `${n} ${n === 1 ? one : many}`;
}

/** `provider:id`: the reference that routes without the broker's index. */
export function sandboxRef(s: Pick<Sandbox, 'id' | 'provider'>): string {
  return s.id.includes(':') ? s.id : `${s.provider}:${s.id}`;
}

/** The `provider:id` a `sandbox/changed` names. */
export function changedRef(c: Pick<SandboxChanged, 'sandbox' | 'provider'>): string {
  return c.sandbox.includes(':') || !c.provider ? c.sandbox : `${c.provider}:${c.sandbox}`;
}

/** Whether a `sandbox/changed` says the sandbox is gone (killed, or its lifetime ended). */
export function changeEndsSandbox(c: Pick<SandboxChanged, 'change'>): boolean {
  return c.change === 'killed' || c.change === 'expired';
}

/**
 * `list` with one `sandbox/changed` applied (a new array; `list` is not touched). `reload`:
 * the event does not say enough (no `sandboxInfo` for a sandbox not in the list, or a change
 * this version does not know): ask `sandbox/list` again.
 */
export function applySandboxChange(list: Sandbox[], c: SandboxChanged): { list: Sandbox[]; reload: boolean } {
  const ref = changedRef(c);
  const i = list.findIndex((s) => sandboxRef(s) === ref);
  if (changeEndsSandbox(c)) {
    return { list: i < 0 ? list : list.filter((_, k) => k !== i), reload: false };
  }
  const info = c.sandboxInfo;
  if (info && typeof info === 'object' && typeof info.id === 'string') {
    const s: Sandbox = { ...info, provider: info.provider || c.provider };
    const out = list.slice();
    if (i < 0) out.push(s);
    else out[i] = s;
    return { list: out, reload: false };
  }
  if (i >= 0 && (c.change === 'paused' || c.change === 'resumed')) {
    const out = list.slice();
    out[i] = { ...out[i], status: c.change === 'paused' ? 'paused' : 'running' };
    return { list: out, reload: false };
  }
  return { list, reload: true };
}

/** Sandboxes grouped by provider, providers and ids sorted. */
export function groupByProvider(sandboxes: Sandbox[]): [string, Sandbox[]][] {
  const m = new Map<string, Sandbox[]>();
  for (const s of sandboxes) {
    const g = m.get(s.provider) ?? [];
    g.push(s);
    m.set(s.provider, g);
  }
  return [...m]
    .sort(([a], [b]) => a.localeCompare(b))
    .map(([p, list]) => [p, list.sort((a, b) => a.id.localeCompare(b.id))]);
}

/** A port number 1..65535, or undefined. */
export function parsePort(text: string): number | undefined {
  if (!/^\s*\d+\s*$/.test(text)) return undefined;
  const n = Number(text);
  return n >= 1 && n <= 65535 ? n : undefined;
}

/** What a `provider/install` plan means, for the review step (Markdown). */
export function formatPlan(plan: import('./types').InstallPlan): string {
  const m = plan.manifest ?? {};
  const sec = plan.security ?? {};
  const list = (v: unknown, none: string) =>
    Array.isArray(v) ? (v.length === 0 ? none : v.includes('*') ? 'any' : v.join(', ')) : v === undefined ? '?' : String(v);
  const trustNote: Record<string, string> = {
    pinned: 'pinned: a full commit id, checked against the digest on every start',
    unpinned: 'UNPINNED: a moving ref (branch or tag); updates may bring code you have not reviewed',
    local: 'local: a directory on this machine, checked against the digest on every start',
    builtin: 'builtin',
  };
  const lines = [
    `# Install provider '${plan.id}' ${plan.version}`,
    '',
    `- **Name:** ${plan.name}`,
    `- **Trust:** ${trustNote[plan.trust] ?? plan.trust}`,
    `- **Source:** ${plan.source?.url ?? '?'}`,
  ];
  if (plan.source?.subdir) lines.push(`- **Subdir:** ${plan.source.subdir}`);
  if (plan.source?.ref) lines.push(`- **Ref:** ${plan.source.ref}`);
  if (plan.source?.commit) lines.push(`- **Commit:** ${plan.source.commit}`);
  lines.push(`- **Digest:** ${plan.digest}`);
  if (typeof m.description === 'string' && m.description) lines.push(`- **Description:** ${m.description}`);
  if (Array.isArray(m.features)) lines.push(`- **Features:** ${groupFeatures(m.features as string[]).join(' ') || 'none'}`);
  const runtime = (m.runtime as { command?: unknown } | undefined)?.command;
  if (Array.isArray(runtime)) lines.push(`- **Runs:** \`${runtime.join(' ')}\``);
  lines.push(
    '',
    '## Declared security',
    '',
    `- **Network:** ${list(sec.network, 'none')}`,
    `- **Filesystem:** ${list(sec.filesystem, 'none')}`,
    `- **Spawns processes:** ${sec.spawnsProcesses === true ? 'yes' : sec.spawnsProcesses === false ? 'no' : '?'}`,
  );
  const config = m.config as Record<string, { description?: string; required?: boolean; secret?: boolean }> | undefined;
  if (config && Object.keys(config).length) {
    lines.push('', '## Configuration', '');
    for (const [k, c] of Object.entries(config)) {
      const flags = [c.required ? 'required' : 'optional', ...(c.secret ? ['secret'] : [])].join(', ');
      lines.push(`- \`${k}\` (${flags})${c.description ? `: ${c.description}` : ''}`);
    }
  }
  if (plan.previous) {
    lines.push('', `Replaces the installed version ${plan.previous.version ?? '?'} (${plan.previous.digest ?? ''}).`);
  }
  return lines.join('\n') + '\n';
}

/** The install plan as plain text (formatPlan without the Markdown), for a dialog. */
export function formatPlanText(plan: import('./types').InstallPlan): string {
  return formatPlan(plan)
    .replace(/^#+ /gm, '')
    .replace(/\*\*/g, '')
    .replace(/`/g, '')
    .replace(/\n{3,}/g, '\n\n');
}

/** Template names from a provider-defined `templates/list` result. */
export function templateNames(raw: unknown): string[] {
  const list = Array.isArray(raw) ? raw : Array.isArray((raw as { templates?: unknown })?.templates) ? (raw as { templates: unknown[] }).templates : [];
  return list
    .map((t) => (typeof t === 'string' ? t : (t as { name?: unknown; id?: unknown })?.name ?? (t as { id?: unknown })?.id))
    .filter((n): n is string => typeof n === 'string');
}
