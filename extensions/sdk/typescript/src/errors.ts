//! Broker errors as exceptions: one class per E-code family of docs/design.md#errors (and a few named
//! codes), each carrying the E-code (`abx`), the message and the suggestion. The wire form is
//! `error.data = {abx: "E2009", suggestion: "..."}` (docs/broker-api.md "Errors").

/** JSON-RPC standard codes mapped to the broker's E-codes when `data.abx` is missing. */
const STANDARD: Record<number, string> = {
  [-32700]: 'E1001',
  [-32600]: 'E1002',
  [-32601]: 'E1003',
  [-32602]: 'E1004',
  [-32800]: 'E1006',
};

/** vscode-jsonrpc's codes for a connection that closed or failed (errors made by it are still mapped). */
const CONNECTION_CODES = new Set([-32097 /* PendingResponseRejected */, -32099 /* ConnectionInactive */]);

export interface AbxErrorOptions {
  code?: number;
  suggestion?: string;
  method?: string;
  data?: Record<string, unknown>;
}

/** Every error of this SDK. `instanceof` a family class (SandboxError, ...) or a named one. */
export class AbxError extends Error {
  /** `error.code` of the reply: the E-number for broker errors (2009), JSON-RPC codes otherwise (-32800). */
  readonly code: number;
  /** The E-code: `E2009`. */
  readonly abx: string;
  /** What to do about it, when the broker (or the SDK) knows. */
  readonly suggestion?: string;
  /** The method that failed, when known. */
  readonly method?: string;
  /** The rest of `error.data`. */
  readonly data: Record<string, unknown>;

  constructor(abx: string, message: string, opts: AbxErrorOptions = {}) {
    super(message);
    this.name = new.target.name;
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

  /** A JSON-RPC error reply (or anything thrown) as the AbxError subclass of its E-code. */
  static from(err: unknown, method?: string): AbxError {
    if (err instanceof AbxError) return err;
    const e = err as { code?: unknown; message?: unknown; data?: unknown } | undefined;
    if (e && typeof e === 'object' && typeof e.code === 'number') {
      const data = e.data && typeof e.data === 'object' ? (e.data as Record<string, unknown>) : {};
      const message = typeof e.message === 'string' ? e.message : String(err);
      if (CONNECTION_CODES.has(e.code) && typeof data.abx !== 'string') return brokerGone(method, message);
      const abx =
        typeof data.abx === 'string' ? data.abx : STANDARD[e.code] ?? (e.code > 0 ? `E${e.code}` : 'E9001');
      const { abx: _a, suggestion, ...rest } = data;
      return makeError(abx, message, {
        code: e.code,
        suggestion: typeof suggestion === 'string' ? suggestion : undefined,
        method,
        data: rest,
      });
    }
    const message = err instanceof Error ? err.message : String(err);
    return makeError('E9001', message, { method });
  }
}

// ---- families (docs/design.md#errors)

/** E1xxx: wire and usage (invalid params, message too large, broker unreachable, version mismatch). */
export class ProtocolError extends AbxError {}
/** E2xxx: sandboxes. */
export class SandboxError extends AbxError {}
/** E3xxx: exec. */
export class ExecError extends AbxError {}
/** E4xxx: files. */
export class FilesError extends AbxError {}
/** E5xxx: ports. */
export class PortError extends AbxError {}
/** E8xxx: providers and plugins. */
export class ProviderError extends AbxError {}
/** E9xxx: a bug in the broker. */
export class InternalError extends AbxError {}

// ---- named codes (the Python SDK's names; aliases below where this SDK had its own first)

/** E1001: the bytes were not JSON. */
export class ParseError extends ProtocolError {}
/** E1002: not a JSON-RPC request. */
export class InvalidRequestError extends ProtocolError {}
/** E1003: the broker has no such method. */
export class MethodNotFoundError extends ProtocolError {}
/** E1004 */
export class InvalidParamsError extends ProtocolError {}
/** E1005 */
export class MessageTooLargeError extends ProtocolError {}
/** E1006: the request was cancelled (AbortSignal, a cancellation token). */
export class CancelledError extends ProtocolError {}
/** E1007: the broker (or the abx binary) cannot be reached. */
export class BrokerUnreachableError extends ProtocolError {}
/** E1008: the broker or the abx binary is too old for this SDK. */
export class VersionMismatchError extends ProtocolError {}
/** E1009 */
export class UsageError extends ProtocolError {}
/** E1010 */
export class ShuttingDownError extends ProtocolError {}
/** E1011 */
export class PermissionDeniedError extends ProtocolError {}
/** E1012 */
export class BrokerAlreadyRunningError extends ProtocolError {}
/** E1013 */
export class BusyError extends ProtocolError {}
/** E1014: ssh could not reach the host of `host` / ABX_HOST. */
export class HostUnreachableError extends BrokerUnreachableError {}
/** E1015: ssh reached the host but could not log in. */
export class HostAuthError extends BrokerUnreachableError {}
/** E1016: logged in, but the remote abx (remoteBin / ABX_REMOTE_BIN) could not be run. */
export class RemoteAbxNotFoundError extends BrokerUnreachableError {}
/** E2001 */
export class SandboxCreateError extends SandboxError {}
/** E2002 */
export class SandboxNotRunningError extends SandboxError {}
/** E2003 */
export class SandboxExpiredError extends SandboxError {}
/** E2004 */
export class InvalidTimeoutError extends SandboxError {}
/** E2005 */
export class TemplateNotFoundError extends SandboxError {}
/** E2006 */
export class SandboxLimitError extends SandboxError {}
/** E2009 */
export class SandboxNotFoundError extends SandboxError {}
/** E2010: a mount the sandbox may not have. */
export class MountRefusedError extends SandboxError {}
/** E3001 */
export class ExecTimeoutError extends ExecError {}
/** E3002 */
export class ExecNotFoundError extends ExecError {}
/** E3003 */
export class ExecStartError extends ExecError {}
/** E3004 */
export class ExecNotOwnedError extends ExecError {}
/** E3005 */
export class ExecStdinClosedError extends ExecError {}
/** E3006 */
export class ProcessNotFoundError extends ExecError {}
/** E4001 */
export class FileNotFoundError extends FilesError {}
/** E4002 */
export class PathOutsideSandboxError extends FilesError {}
/** E4003 */
export class IsADirectoryError extends FilesError {}
/** E4004 */
export class NotADirectoryError extends FilesError {}
/** E4005 */
export class DirectoryNotEmptyError extends FilesError {}
/** E4006 */
export class FileExistsError extends FilesError {}
/** E4014: a path the sandbox sees but may not change (a system directory, an `ro` mount). */
export class ReadOnlyError extends FilesError {}
/** E4015: host files changed since the sandbox was created (`sandbox/apply`). */
export class ApplyConflictError extends FilesError {}
/** E5001 */
export class PortNotReachableError extends PortError {}
/** E8001 */
export class ProviderNotFoundError extends ProviderError {}
/** E8002, E8003, E8007, E8008, E8009: the plugin failed (handshake, protocol, crash, timeout, reply). */
export class PluginError extends ProviderError {}
/** E8002 */
export class HandshakeError extends PluginError {}
/** E8004: the provider does not declare the feature (`runCode` on a provider without `code.interpret`). */
export class FeatureNotSupportedError extends ProviderError {}
/** E8006 */
export class ProviderConfigError extends ProviderError {}
/** E8007 */
export class ProviderCrashedError extends PluginError {}
/** E8008 */
export class ProviderTimeoutError extends PluginError {}
/** E8010 */
export class SourceUnreachableError extends ProviderError {}
/** E8011 */
export class IntegrityError extends ProviderError {}
/** E8012: confirmation, pin or transport refused (the message names the flag to add). */
export class ConfirmationRequiredError extends ProviderError {}
/** E8013 */
export class DigestMismatchError extends ProviderError {}
/** E8014 */
export class ManifestError extends ProviderError {}
/** E8015 */
export class AlreadyInstalledError extends ProviderError {}
/** E8016 */
export class EnforcementUnavailableError extends ProviderError {}

// The Python SDK's names for the same classes.
export const WireError = ProtocolError;
export type WireError = ProtocolError;
export const PortsError = PortError;
export type PortsError = PortError;
export const RequestCancelledError = CancelledError;
export type RequestCancelledError = CancelledError;
export const SandboxFileNotFoundError = FileNotFoundError;
export type SandboxFileNotFoundError = FileNotFoundError;
export const ProviderNotInstalledError = ProviderNotFoundError;
export type ProviderNotInstalledError = ProviderNotFoundError;
export const RefusedError = ConfirmationRequiredError;
export type RefusedError = ConfirmationRequiredError;
export const InvalidManifestError = ManifestError;
export type InvalidManifestError = ManifestError;

type ErrorClass = new (abx: string, message: string, opts?: AbxErrorOptions) => AbxError;

/** The class of each named E-code. */
export const ERROR_CLASSES: Readonly<Record<string, ErrorClass>> = {
  E1001: ParseError,
  E1002: InvalidRequestError,
  E1003: MethodNotFoundError,
  E1004: InvalidParamsError,
  E1005: MessageTooLargeError,
  E1006: CancelledError,
  E1007: BrokerUnreachableError,
  E1008: VersionMismatchError,
  E1009: UsageError,
  E1010: ShuttingDownError,
  E1011: PermissionDeniedError,
  E1012: BrokerAlreadyRunningError,
  E1013: BusyError,
  E1014: HostUnreachableError,
  E1015: HostAuthError,
  E1016: RemoteAbxNotFoundError,
  E2001: SandboxCreateError,
  E2002: SandboxNotRunningError,
  E2003: SandboxExpiredError,
  E2004: InvalidTimeoutError,
  E2005: TemplateNotFoundError,
  E2006: SandboxLimitError,
  E2009: SandboxNotFoundError,
  E2010: MountRefusedError,
  E3001: ExecTimeoutError,
  E3002: ExecNotFoundError,
  E3003: ExecStartError,
  E3004: ExecNotOwnedError,
  E3005: ExecStdinClosedError,
  E3006: ProcessNotFoundError,
  E4001: FileNotFoundError,
  E4002: PathOutsideSandboxError,
  E4003: IsADirectoryError,
  E4004: NotADirectoryError,
  E4005: DirectoryNotEmptyError,
  E4006: FileExistsError,
  E4014: ReadOnlyError,
  E4015: ApplyConflictError,
  E5001: PortNotReachableError,
  E8001: ProviderNotFoundError,
  E8002: HandshakeError,
  E8003: PluginError,
  E8004: FeatureNotSupportedError,
  E8006: ProviderConfigError,
  E8007: ProviderCrashedError,
  E8008: ProviderTimeoutError,
  E8009: PluginError,
  E8010: SourceUnreachableError,
  E8011: IntegrityError,
  E8012: ConfirmationRequiredError,
  E8013: DigestMismatchError,
  E8014: ManifestError,
  E8015: AlreadyInstalledError,
  E8016: EnforcementUnavailableError,
};

/** The ssh codes the CLI's `--host` adds to the protocol (E1014..E1016): this SDK raises them for its own ssh. */
export const SSH_CODES = ['E1014', 'E1015', 'E1016'] as const;

/** The family class of an E-code by its first digit. */
export const FAMILIES: Readonly<Record<string, ErrorClass>> = {
  '1': ProtocolError,
  '2': SandboxError,
  '3': ExecError,
  '4': FilesError,
  '5': PortError,
  '8': ProviderError,
  '9': InternalError,
};

/** The error class an E-code is thrown as: its named class, else its family, else AbxError. */
export function errorClass(abx: string): ErrorClass {
  return ERROR_CLASSES[abx] ?? FAMILIES[/^E(\d)/.exec(abx)?.[1] ?? ''] ?? AbxError;
}

/** An AbxError of the right class for `abx`. */
export function makeError(abx: string, message: string, opts: AbxErrorOptions = {}): AbxError {
  const C = errorClass(abx);
  return new C(abx, message, opts);
}

/** The connection to the broker went away under a request (E1007). */
export function brokerGone(method: string | undefined, detail: string, suggestion?: string): AbxError {
  return new BrokerUnreachableError('E1007', `The abx broker is not reachable: ${detail}`, {
    method,
    suggestion:
      suggestion ??
      "Run 'abx: Reconnect to Broker' (or 'abx broker start' in a shell) and see the abx output channel.",
  });
}

/** A request cancelled before it was sent, or whose signal aborted (E1006, code -32800). */
export function cancelled(method?: string): AbxError {
  return new CancelledError('E1006', 'Request cancelled.', { code: -32800, method });
}

export function isAbxError(err: unknown, abx?: string): err is AbxError {
  return err instanceof AbxError && (abx === undefined || err.abx === abx);
}
