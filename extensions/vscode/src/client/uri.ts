// `abx:` URIs: abx://<sandbox>/<path in the sandbox>. No `vscode` import.
//
// The authority names the sandbox as `provider:id`. VS Code lowercases URI authorities when
// it prints them, so upper-case letters (which some providers use in ids) are written as
// `~` + the lower-case letter and `~` itself as `~~`: the authority survives a round trip.

export const SCHEME = 'abx';

export function encodeAuthority(sandbox: string): string {
  return sandbox.replace(/[A-Z~]/g, (c) => (c === '~' ? '~~' : `~${c.toLowerCase()}`));
}

export function decodeAuthority(authority: string): string {
  return authority.replace(/~(.)/g, (_m, c: string) => (c === '~' ? '~' : c.toUpperCase()));
}

/** The sandbox path of a URI path: `/workspace/a.txt`; `/` is the virtual root. */
export function sandboxPath(uriPath: string): string {
  const p = uriPath.replace(/\/+/g, '/');
  if (p === '' || p === '/') return '/';
  return p.length > 1 && p.endsWith('/') ? p.slice(0, -1) : p;
}

/** The directories a sandbox's files live under (docs/broker-api.md: Paths). */
export const ROOTS = ['workspace', 'tmp'];
