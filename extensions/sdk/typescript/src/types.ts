//! Broker API v1 types (docs/broker-api.md, docs/openrpc.json): plain data, as on the wire.

export interface PeerInfo {
  name: string;
  version: string;
}

export interface InitializeResult {
  protocolVersion: string;
  serverInfo: PeerInfo;
  capabilities: { framings?: string[]; maxMessageSize?: number; methods?: string[] };
}

export interface ProviderProcess {
  id: string;
  kind: string;
  running: boolean;
  pid: number | null;
  inFlight: number;
  restarts: number;
}

export interface BrokerStatus {
  version: string;
  pid: number;
  uptimeMs: number;
  startedAt: number;
  connections: number;
  inFlight: number;
  socket: string;
  dataDir: string;
  logFile: string;
  providers: ProviderProcess[];
  sandboxes: number;
}

export interface ProviderSummary {
  id: string;
  name: string;
  version: string;
  /** `builtin` or `exec`. */
  kind: string;
  /** `builtin`, `pinned`, `unpinned` or `local`. */
  trust: string;
  features: string[];
  default: boolean;
}

export interface ProviderInfo extends ProviderSummary {
  description: string;
  [key: string]: unknown;
}

export interface DoctorCheck {
  name: string;
  ok: boolean;
  detail?: string | null;
}

export interface DoctorResult {
  checks: DoctorCheck[];
  ok: boolean;
}

export interface ProviderSource {
  url?: string;
  subdir?: string | null;
  ref?: string | null;
  commit?: string | null;
  [key: string]: unknown;
}

export interface InstallParams {
  source: string;
  subdir?: string;
  ref?: string;
  sha256?: string;
  allowUnpinned?: boolean;
  allowInsecureTransport?: boolean;
  confirm?: boolean;
  dryRun?: boolean;
  replace?: boolean;
}

export interface InstallPlan {
  id: string;
  name: string;
  version: string;
  trust: string;
  source: ProviderSource;
  digest: string;
  manifest: Record<string, unknown>;
  security: Record<string, unknown>;
  installed: boolean;
  path?: string | null;
  previous?: { version?: string; digest?: string; [key: string]: unknown } | null;
}

export interface TestOutcome {
  name: string;
  /** `passed`, `failed` or `skipped`. */
  outcome: string;
  detail?: string | null;
  durationMs: number;
}

export interface TestResult {
  results: TestOutcome[];
  passed: number;
  failed: number;
  skipped: number;
}

/** `provider/testResult` notification params: one finished contract test. */
export interface TestResultNote extends TestOutcome {
  id: string;
}

export interface Sandbox {
  id: string;
  provider: string;
  /** `running` or `paused`. */
  status: string;
  template?: string | null;
  url?: string | null;
  region?: string | null;
  timeout?: number | null;
  startedAt?: string | null;
  expiresAt?: string | null;
  metadata?: Record<string, unknown>;
  /** The image digest its template resolved to at create (`local`). */
  templateDigest?: string;
  /** A mode (`none`, `internet`, `host`), or a policy with what it refused. */
  network?: string | (NetworkPolicy & { blocked?: { host: string; port: number; count: number; last: string }[] }) | null;
  /** Host directories mounted into it. */
  mounts?: { source: string; target: string; mode: 'overlay' | 'ro' | 'rw' }[];
}

/** What happened to a sandbox (`sandbox/changed`'s `change`). */
export type SandboxChange = 'created' | 'killed' | 'paused' | 'resumed' | 'expired' | 'timeout';

/** `sandbox/subscribe` / `sandbox/unsubscribe` params (none) and result (`{}`). */
export type SandboxSubscribeParams = Record<string, never>;
export type SandboxSubscribeResult = Record<string, never>;

/**
 * `sandbox/changed` notification params, sent after `sandbox/subscribe` for every sandbox of
 * every provider (changes made by other clients and lifetimes that end included).
 */
export interface SandboxChanged {
  /** The sandbox id (bare, or `provider:id`). */
  sandbox: string;
  provider: string;
  /** A SandboxChange; a newer broker may send others (treated as "reload"). */
  change: SandboxChange | string;
  /** The sandbox as it is now, where the broker has it (absent or null once it is gone). */
  sandboxInfo?: Sandbox | null;
}

/** `sandbox/create` `limits`: memory in bytes or a size such as `512M`. */
export interface Limits {
  memory?: number | string;
  cpus?: number;
  pids?: number;
}

export interface CreateParams {
  provider?: string;
  template?: string;
  /** Lifetime in seconds (default 300, 1..2592000). */
  timeout?: number;
  env?: Record<string, string>;
  metadata?: Record<string, unknown>;
  /** `none`, `internet`, `host`, or a policy (`network.vpc`): only the hosts allowed. */
  network?: 'none' | 'internet' | 'host' | string | NetworkPolicy;
  limits?: Limits;
  /** Host directories in the sandbox (`storage.mount`); `overlay` (the default) changes the host only on `apply`. */
  mounts?: MountSpec[];
}

/** A host directory to mount: `source` is an absolute path of the broker's machine. */
export interface MountSpec {
  source: string;
  /** Default `/workspace`. */
  target?: string;
  /** `overlay` (default), `ro`, or `rw` (writes go to the host at once). */
  mode?: 'overlay' | 'ro' | 'rw';
}

/** One path the sandbox changed under an overlay mount (`sandbox/diff`). */
export interface Change {
  /** Absolute path in the sandbox. */
  path: string;
  change: 'added' | 'modified' | 'deleted' | 'typeChanged' | 'modeChanged';
  type: 'file' | 'directory' | 'symlink' | string;
  size: number;
  binary: boolean;
  mode?: number;
  symlinkTarget?: string;
  /** An added symlink leaving the tree: applied only when named. */
  explicitOnly?: boolean;
  /** A unified diff (`patch: true`, text files). */
  patch?: string;
}

export interface ApplyResult {
  applied: string[];
  conflicts: { path: string; reason: string }[];
  skipped: { path: string; reason: string }[];
}

/** One command run in a sandbox (`sandbox/log`). */
export interface LogEntry {
  seq: number;
  kind: 'exec' | 'stream' | 'pty' | 'code';
  client: string;
  argv?: string[];
  code?: string;
  language?: string;
  cwd?: string;
  startedAt: string;
  durationMs?: number;
  exitCode?: number;
  signal?: string;
  error?: string;
}

export interface LogResult {
  entries: LogEntry[];
  dropped: number;
  last: number;
}

export interface ExecParams {
  sandbox: string;
  command?: string;
  argv?: string[];
  cwd?: string;
  env?: Record<string, string>;
  timeout?: number;
  stdin?: string;
  stdinEncoding?: string;
  maxOutput?: number;
}

export interface ExecResult {
  exitCode: number | null;
  stdout: string;
  stderr: string;
  timedOut: boolean;
  durationMs: number;
  truncated?: boolean;
  signal?: string | null;
  encoding?: string | null;
  memoryLimited?: boolean;
  oomKilled?: boolean;
}

export interface PtySize {
  cols: number;
  rows: number;
}

export interface ExecStartParams extends ExecParams {
  pty?: PtySize;
}

export interface ExecStarted {
  execId: string;
  pid?: number | null;
}

export interface ExecOutputNote {
  execId: string;
  /** `stdout`, `stderr` or `pty`. */
  stream: string;
  data: string;
  encoding?: string | null;
}

export interface ExecExit {
  execId: string;
  exitCode: number | null;
  signal?: string | null;
  oomKilled?: boolean;
  timedOut: boolean;
}

export interface FileEntry {
  name: string;
  path: string;
  /** `file`, `directory`, `symlink` or `other`. */
  type: string;
  size: number;
  /** Octal permission bits, e.g. `0644`. */
  mode: string;
  modifiedAt: string;
}

export interface FileChunk {
  data: string;
  encoding: string;
  size: number;
  eof: boolean;
  offset: number;
}

export interface FilesChanged {
  watchId: string;
  sandbox: string;
  path: string;
  /** `created`, `modified`, `removed` or `renamed`. */
  kind: string;
}

export interface FilesProgress {
  sandbox: string;
  path: string;
  bytes: number;
  total: number;
}

export interface TransferResult {
  size: number;
  [key: string]: unknown;
}

export interface PortUrl {
  url: string;
  headers: Record<string, string>;
}

export interface SystemInfo {
  os?: string;
  arch?: string;
  hostname?: string;
  [key: string]: unknown;
}

export interface Capabilities {
  capabilities: string[];
  features: string[];
}

export interface ProcessEntry {
  pid: number;
  ppid?: number;
  command: string;
  status: string;
}

export interface SandboxListResult {
  sandboxes: Sandbox[];
  /** One entry per provider that could not answer (the others are listed). */
  errors?: { provider: string; code: string; message: string; suggestion?: string }[];
}

export interface CodeRunParams {
  sandbox: string;
  code: string;
  /** `python`, `javascript`, ... (what the provider's code.interpret offers). */
  language: string;
  /** A context made with `code/createContext` (default: the language's own context). */
  context?: string;
  /** Seconds before the cell is interrupted (the context and its state are kept). */
  timeout?: number;
  /** Environment of the cell. */
  env?: Record<string, string>;
}

export interface CodeRunResult {
  results: Record<string, unknown>[];
  stdout: string;
  stderr: string;
  error?: { name?: string; value?: string; traceback?: string } | null;
  executionCount?: number | null;
  [key: string]: unknown;
}

/** An egress policy: `example.com`, `*.example.com`, `host:port`, an IP or CIDR, `@set`. */
export interface NetworkPolicy {
  allow: (string | { host: string; headers?: Record<string, string> })[];
  deny?: string[];
}

/** `sandbox/blocked`: a sandbox's policy refused a connection. */
export interface SandboxBlocked {
  sandbox: string;
  provider: string;
  host: string;
  port: number;
  count: number;
}
