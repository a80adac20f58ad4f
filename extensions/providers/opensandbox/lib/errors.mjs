// Errors: the broker's E-codes (docs/epp-1.md §9) and the mapping of OpenSandbox's HTTP answers
// and network failures onto them. Messages name ids, paths, URLs and server error codes, never a
// secret value (the API key and the registry password are only ever sent as request headers or
// in the create body).

export const SUGGESTIONS = {
  [-32601]: "The broker sends only the methods of the features this plugin declares.",
  [-32602]: "See docs/broker-api.md for the parameters of this method.",
  [-32600]: "Reconnect; the plugin is shutting down.",
  [-32800]: "The request was cancelled; nothing more will be sent for it.",
  2001: "Check the server's log; 'abx provider doctor opensandbox' checks the configuration.",
  2002: "Resume it first: abx resume <sandbox>.",
  2004: "Give a whole number of seconds between 1 and 2592000 (30 days).",
  2005: "Give an image the server can pull (e.g. --template python:3.12-slim), or set default_image / image_aliases (and registry_username / registry_password for a private registry) with 'abx provider configure opensandbox'.",
  2009: "Run 'abx list' to see the running sandboxes; a killed or expired sandbox cannot be reconnected.",
  3002: "It has exited and its exit was delivered, or it was started by an earlier run of the plugin.",
  3003: "Check the program name and the working directory.",
  3005: "Start it again to send more input.",
  3006: "Run 'abx sandbox process list <sandbox>': it lists the commands abx started in the sandbox.",
  4001: "Run 'abx sandbox files list <sandbox> --path <dir>' to see what is there.",
  4002: "Use a path under /workspace or /tmp of the sandbox, without '..'.",
  4003: "Give a file path, or use files/list for directories.",
  4004: "Give a directory path.",
  4005: "Pass recursive: true to remove it with its contents.",
  4006: "Remove it first, or choose another path.",
  4007: "Send text as encoding 'utf-8' or bytes as encoding 'base64'.",
  4008: "Check the file's mode inside the sandbox.",
  5001: "Start a server listening on that port inside the sandbox first.",
  5002: "Give a port number between 1 and 65535.",
  8006: "Configure the plugin: abx provider configure opensandbox base_url=http://HOST:8080 api_key=- (the key is read from stdin).",
  9001: "The plugin's log (abx broker status shows where) has the details; please report it.",
};

const STANDARD_ABX = { [-32700]: "E1001", [-32600]: "E1010", [-32601]: "E1003", [-32602]: "E1004", [-32800]: "E1006" };

export class RpcError extends Error {
  constructor(code, message, suggestion) {
    super(message);
    this.code = code;
    this.suggestion = suggestion ?? SUGGESTIONS[code] ?? "";
  }
  get abx() {
    return STANDARD_ABX[this.code] ?? `E${this.code}`;
  }
  toJSON() {
    return { code: this.code, message: this.message, data: { abx: this.abx, suggestion: this.suggestion } };
  }
}

export class Cancelled extends Error {
  constructor() {
    super("Request cancelled.");
  }
}

export const invalidParams = (method, detail) => new RpcError(-32602, `Invalid params for '${method}': ${detail}`);
export const sandboxNotFound = (id) => new RpcError(2009, `Sandbox '${id}' not found.`);
export const sandboxPaused = (id, state = "paused") =>
  new RpcError(2002, `Sandbox '${id}' is ${state}, not running.`, `Resume it first: abx resume ${id}.`);

// A sandbox the server shows in a state other than Running (`sb` its lifecycle answer), as the
// error of a call that needs it running. Only Paused/Pausing is paused ("Resume it first");
// the states of a sandbox that is going away (Stopping, Terminated) are E2009; Failed is E2002
// with what to do instead (it cannot be resumed: a deleted sandbox is Failed on the real
// server while the delete runs, a crashed one stays Failed); Pending/Resuming are on their way
// to Running; any other (unknown) state says which it is.
export function notRunning(id, sb) {
  const st = sb?.status ?? {};
  const state = typeof st.state === "string" && st.state ? st.state : "Unknown";
  const why = [st.reason, st.message].filter((x) => typeof x === "string" && x).join(": ");
  switch (state) {
    case "Paused":
    case "Pausing":
      return sandboxPaused(id, state.toLowerCase());
    case "Stopping":
    case "Terminated":
      return sandboxNotFound(id);
    case "Failed": {
      const e = new RpcError(
        2002,
        `Sandbox '${id}' has failed${why ? ` (${why})` : ""}: it cannot run commands.`,
        `A failed sandbox does not come back: remove it (abx kill ${id}) and create a new one; the OpenSandbox server's log says why it failed.`,
      );
      e.sandboxFailed = true; // its processes are gone with it
      return e;
    }
    case "Pending":
    case "Resuming":
      return new RpcError(2002, `Sandbox '${id}' is ${state.toLowerCase()}, not running yet.`, `Wait a moment and retry; 'abx info ${id}' shows its state.`);
    default:
      return new RpcError(
        2002,
        `Sandbox '${id}' is in state '${state}'${why ? ` (${why})` : ""}, not running.`,
        `Retry when it is running again ('abx info ${id}' shows its state), or remove it: abx kill ${id}.`,
      );
  }
}

const PATH_MESSAGES = {
  4001: (p) => `File '${p}' not found.`,
  4002: (p) => `Path '${p}' is outside the sandbox.`,
  4003: (p) => `'${p}' is a directory.`,
  4004: (p) => `'${p}' is not a directory.`,
  4005: (p) => `Directory '${p}' is not empty.`,
  4006: (p) => `'${p}' already exists.`,
  4008: (p) => `Permission denied: '${p}'.`,
};
export const pathError = (code, p) => new RpcError(code, PATH_MESSAGES[code](p));

// ---------------------------------------------------------------------------------------------
// HTTP and network failures

// A failure of the HTTP exchange itself (no answer): DNS, refused, reset, TLS, timeout.
export class NetworkError extends Error {
  constructor(url, cause, { timeout = false } = {}) {
    super(describeNetwork(cause, timeout));
    this.url = url;
    this.causeCode = cause?.code ?? null;
    this.timeout = timeout;
  }
}

function describeNetwork(cause, timeout) {
  if (timeout) return "no answer in time";
  const code = cause?.code;
  const known = {
    ECONNREFUSED: "connection refused",
    ENOTFOUND: "host not found",
    EAI_AGAIN: "host name lookup failed",
    ECONNRESET: "connection reset",
    EHOSTUNREACH: "host unreachable",
    ENETUNREACH: "network unreachable",
    ETIMEDOUT: "connection timed out",
    EPIPE: "connection closed",
    UND_ERR_SOCKET: "connection closed",
    DEPTH_ZERO_SELF_SIGNED_CERT: "self-signed TLS certificate",
    CERT_HAS_EXPIRED: "expired TLS certificate",
    ERR_TLS_CERT_ALTNAME_INVALID: "TLS certificate does not match the host",
  };
  if (code && known[code]) return `${known[code]} (${code})`;
  return cause?.message ? String(cause.message) : String(cause ?? "network error");
}

// An HTTP answer with a non-2xx status. `body` is the parsed JSON body when there was one.
export class HttpError extends Error {
  constructor(status, body, text, what) {
    const { code, message } = serverError(body, text);
    super(`${what}: HTTP ${status}${code ? ` ${code}` : ""}${message ? `: ${message}` : ""}`);
    this.status = status;
    this.serverCode = code;
    this.serverMessage = message;
    this.what = what;
  }
}

// OpenSandbox answers {code, message}; FastAPI's HTTPException wraps it as {detail: {code,
// message}} and validation errors as {detail: [{loc, msg}]}; execd's token filter answers
// {error}. Accept all of them.
export function serverError(body, text) {
  if (body && typeof body === "object") {
    const d = body.detail;
    if (d && typeof d === "object" && !Array.isArray(d)) return { code: str(d.code), message: str(d.message) };
    if (Array.isArray(d)) {
      const msg = d
        .map((x) => [Array.isArray(x?.loc) ? x.loc.join(".") : null, x?.msg].filter(Boolean).join(": "))
        .join("; ");
      return { code: "VALIDATION_ERROR", message: msg };
    }
    if (typeof d === "string") return { code: str(body.code), message: d };
    if (body.code || body.message) return { code: str(body.code), message: str(body.message) };
    if (body.error) return { code: null, message: str(body.error) };
  }
  const t = (text ?? "").trim();
  return { code: null, message: t.length > 300 ? `${t.slice(0, 300)}...` : t };
}

const str = (v) => (v == null ? null : typeof v === "string" ? v : JSON.stringify(v));

// The lifecycle server could not be reached at all.
export function unreachable(baseUrl, err) {
  return new RpcError(
    8006,
    `The OpenSandbox server at ${baseUrl} is unreachable: ${err.message}.`,
    "Check that the server is running and that base_url (or domain and protocol) points at it: " +
      "abx provider configure opensandbox base_url=http://HOST:8080",
  );
}

// Authentication failures of the lifecycle API.
export function authError(baseUrl, err) {
  const missing = err.serverCode === "MISSING_API_KEY";
  return new RpcError(
    8006,
    missing
      ? `The OpenSandbox server at ${baseUrl} requires an API key and none is configured (${err.serverCode}).`
      : `The OpenSandbox server at ${baseUrl} rejected the API key (HTTP ${err.status}${err.serverCode ? ` ${err.serverCode}` : ""}).`,
    "Set the key with: abx provider configure opensandbox api_key=- (reads it from stdin), or export " +
      "OPEN_SANDBOX_API_KEY before the broker starts.",
  );
}

const IMAGE_RE = /IMAGE_PULL|ImagePull|ErrImagePull|pull access denied|manifest unknown|manifest for .* not found|repository does not exist|no such image|image .*not found|not found: image|failed to pull|unable to pull/i;

export function looksLikeImageError(...texts) {
  return texts.some((t) => typeof t === "string" && IMAGE_RE.test(t));
}

export function imageMissing(image, detail) {
  return new RpcError(2005, `Template '${image}' not found: the OpenSandbox server cannot pull the image (${detail}).`);
}

// Map an error of a lifecycle call about sandbox `id` (null for list/create) onto an E-code.
export function lifecycleError(err, { baseUrl, id = null, what = "request" } = {}) {
  if (err instanceof RpcError || err instanceof Cancelled) return err;
  if (err instanceof NetworkError) return unreachable(baseUrl, err);
  if (err instanceof HttpError) {
    if (err.status === 401) return authError(baseUrl, err);
    if (err.status === 403) {
      return new RpcError(
        8006,
        `The OpenSandbox server refused the ${what}${id ? ` of sandbox '${id}'` : ""} (HTTP 403${err.serverCode ? ` ${err.serverCode}` : ""}${err.serverMessage ? `: ${err.serverMessage}` : ""}).`,
        "Check that the API key may use this sandbox (multi-tenant servers scope keys to tenants).",
      );
    }
    if (err.status === 404 && id) return sandboxNotFound(id);
    if (err.status === 501 || /API_NOT_SUPPORTED/.test(err.serverCode ?? "")) {
      return new RpcError(-32601, `This OpenSandbox server does not support ${what} (${err.serverCode ?? `HTTP ${err.status}`}${err.serverMessage ? `: ${err.serverMessage}` : ""}).`, "Its runtime lacks this operation (pause, for example, depends on the runtime).");
    }
    if (looksLikeImageError(err.serverCode, err.serverMessage)) return imageMissing("?", err.serverMessage || err.serverCode);
    return new RpcError(9001, `OpenSandbox ${err.message}`, "Check the OpenSandbox server's log for this request.");
  }
  return new RpcError(9001, `Internal error during ${what}: ${err?.message ?? err}`);
}

// The E4xxx an error text about sandbox path `p` stands for (execd's messages, a shell
// command's stderr), or null.
export function fileErrorOfText(text, p) {
  if (/FILE_NOT_FOUND|no such file|not exist/i.test(text)) return pathError(4001, p);
  if (/permission denied|EACCES|EPERM|operation not permitted|read-only file system|EROFS/i.test(text)) return pathError(4008, p);
  if (/is a directory|EISDIR/i.test(text)) return pathError(4003, p);
  if (/not a directory|ENOTDIR/i.test(text)) return pathError(4004, p);
  if (/not empty|ENOTEMPTY/i.test(text)) return pathError(4005, p);
  if (/file exists|EEXIST|already exists/i.test(text)) return pathError(4006, p);
  return null;
}

// Map an execd error on a file operation about sandbox path `p`.
export function fileError(err, p) {
  if (err instanceof RpcError || err instanceof Cancelled) return err;
  if (err instanceof HttpError) {
    const text = `${err.serverCode ?? ""} ${err.serverMessage ?? ""}`;
    if (err.status === 404) return pathError(4001, p);
    return fileErrorOfText(text, p) ?? new RpcError(9001, `execd ${err.message}`, "Check the sandbox with 'abx exec <sandbox> ls -la <dir>'.");
  }
  return new RpcError(9001, `Internal error on '${p}': ${err?.message ?? err}`);
}

// execd's /files/mv refused because the destination exists (it never replaces).
export const isDestinationExists = (err) => err instanceof HttpError && /destination path already exists/i.test(err.serverMessage ?? "");

// execd refused a command's working directory before starting it (HTTP 400 from
// RunCommandRequest.Validate): "missing", "notdir", "other", or null for any other error.
export function workingDirProblem(err) {
  if (!(err instanceof HttpError) || err.status !== 400) return null;
  const m = err.serverMessage ?? "";
  if (/working directory does not exist/i.test(m)) return "missing";
  if (/working directory path is not a directory/i.test(m)) return "notdir";
  if (/working directory/i.test(m)) return "other";
  return null;
}

export function workingDirError(problem, cwd, err) {
  const what =
    problem === "missing"
      ? `working directory '${cwd}' does not exist`
      : problem === "notdir"
        ? `working directory '${cwd}' is not a directory`
        : `working directory '${cwd}' cannot be used (${err?.serverMessage ?? "refused"})`;
  return new RpcError(
    3003,
    `Could not start the command: ${what}.`,
    `Give an existing directory as the working directory, or create it first: abx sandbox files mkdir <sandbox> ${cwd} -p.`,
  );
}

// A shared-execd server: sandbox `id` reaches the execd of sandbox `other`.
export function sharedExecd(id, other, where) {
  return new RpcError(
    8006,
    `Sandbox '${id}' shares one execd with sandbox '${other}' (${where}): this OpenSandbox server gives its sandboxes a shared execd endpoint (a docker runtime with network_mode = "host" does), so the commands and files of one would reach the other.`,
    `Use one sandbox at a time on this server (kill '${other}' first; for the contract kit: abx provider test opensandbox --concurrency 1), or configure its docker runtime with bridge networking.`,
  );
}
