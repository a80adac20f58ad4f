// Broker errors as the extension sees them: the E-code, the message and the suggestion
// (DESIGN §3: `error.data = {abx: "E2009", suggestion: "..."}` always). No `vscode` import.

/** JSON-RPC standard codes mapped to the broker's E-codes when `data.abx` is missing. */
const STANDARD: Record<number, string> = {
  [-32700]: 'E1001',
  [-32600]: 'E1002',
  [-32601]: 'E1003',
  [-32602]: 'E1004',
  [-32800]: 'E1006',
};

/** vscode-jsonrpc's own codes for a connection that closed or failed. */
const CONNECTION_CODES = new Set([-32097 /* PendingResponseRejected */, -32099 /* ConnectionInactive */]);

export class AbxError extends Error {
  /** `error.code` of the reply: the E-number for broker errors, JSON-RPC codes otherwise. */
  readonly code: number;
  /** `E2009` style code. */
  readonly abx: string;
  readonly suggestion?: string;
  /** The method that failed, when known. */
  readonly method?: string;
  /** The rest of `error.data`. */
  readonly data: Record<string, unknown>;

  constructor(
    abx: string,
    message: string,
    opts: { code?: number; suggestion?: string; method?: string; data?: Record<string, unknown> } = {},
  ) {
    super(message);
    this.name = 'AbxError';
    this.abx = abx;
    this.code = opts.code ?? (Number(abx.replace(/^E/, '')) || 0);
    this.suggestion = opts.suggestion;
    this.method = opts.method;
    this.data = opts.data ?? {};
  }

  /** The E-number (`2009`). */
  get number(): number {
    return Number(this.abx.replace(/^E/, '')) || 0;
  }

  /** `[E2009] Sandbox 'x' not found.` (the CLI's first line). */
  get headline(): string {
    return `[${this.abx}] ${this.message}`;
  }

  /** Headline, then `Suggestion: ...` on its own line when there is one. */
  describe(): string {
    return this.suggestion ? `${this.headline}\nSuggestion: ${this.suggestion}` : this.headline;
  }

  /** A JSON-RPC error reply (or anything thrown) as an AbxError. */
  static from(err: unknown, method?: string): AbxError {
    if (err instanceof AbxError) return err;
    const e = err as { code?: unknown; message?: unknown; data?: unknown } | undefined;
    if (e && typeof e === 'object' && typeof e.code === 'number') {
      const data = (e.data && typeof e.data === 'object' ? (e.data as Record<string, unknown>) : {}) ?? {};
      const message = typeof e.message === 'string' ? e.message : String(err);
      if (CONNECTION_CODES.has(e.code) && typeof data.abx !== 'string') {
        return brokerGone(method, message);
      }
      const abx =
        typeof data.abx === 'string' ? data.abx : STANDARD[e.code] ?? (e.code > 0 ? `E${e.code}` : 'E9001');
      const { abx: _a, suggestion, ...rest } = data;
      return new AbxError(abx, message, {
        code: e.code,
        suggestion: typeof suggestion === 'string' ? suggestion : undefined,
        method,
        data: rest,
      });
    }
    const message = err instanceof Error ? err.message : String(err);
    return new AbxError('E9001', message, { method });
  }
}

/** The connection to the broker went away under a request. */
export function brokerGone(method: string | undefined, detail: string): AbxError {
  return new AbxError('E1007', `The abx broker is not reachable: ${detail}`, {
    method,
    suggestion: "Run 'abx: Reconnect to Broker' (or 'abx broker start' in a shell) and see the abx output channel.",
  });
}

export function isAbxError(err: unknown, abx?: string): err is AbxError {
  return err instanceof AbxError && (abx === undefined || err.abx === abx);
}
