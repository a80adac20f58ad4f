//! Every error the broker can return: one enum of E-codes (docs/design.md#errors).
//!
//! Each code has a number (`E2009`), the JSON-RPC `error.code` it travels as (the standard
//! code for wire errors, the E-number for broker errors), a message template with `{name}`
//! placeholders, a default suggestion and the CLI exit code. [`AbxError`] is the typed error
//! handlers return; [`RpcError`] is the wire object `{code, message, data: {abx, suggestion}}`.
//!
//! Messages never contain secrets: templates are filled only with ids, paths and names.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::fmt;

macro_rules! error_codes {
    ($( $(#[$doc:meta])* $name:ident = $num:literal, rpc $rpc:expr, exit $exit:literal,
        $template:literal, $suggestion:literal; )*) => {
        /// One variant per E-code. See the module docs.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum ErrorCode { $( $(#[$doc])* $name, )* }

        impl ErrorCode {
            /// Every code, in numeric order.
            pub const ALL: &'static [ErrorCode] = &[ $( ErrorCode::$name, )* ];

            /// The E-number, e.g. 2009.
            pub const fn number(self) -> u32 { match self { $( ErrorCode::$name => $num, )* } }

            /// The JSON-RPC `error.code` this error is sent with.
            pub const fn rpc_code(self) -> i64 { match self { $( ErrorCode::$name => $rpc, )* } }

            /// The CLI exit code: 1 error, 2 usage or refused, 4 not found.
            pub const fn exit_code(self) -> i32 { match self { $( ErrorCode::$name => $exit, )* } }

            /// The message template; `{name}` placeholders are filled by [`AbxError::new`].
            pub const fn template(self) -> &'static str {
                match self { $( ErrorCode::$name => $template, )* }
            }

            /// The default suggestion (may hold placeholders too).
            pub const fn suggestion(self) -> &'static str {
                match self { $( ErrorCode::$name => $suggestion, )* }
            }

            /// The variant name, e.g. `SandboxNotFound`.
            pub const fn name(self) -> &'static str {
                match self { $( ErrorCode::$name => stringify!($name), )* }
            }
        }
    };
}

const RPC_PARSE: i64 = -32700;
const RPC_INVALID_REQUEST: i64 = -32600;
const RPC_METHOD_NOT_FOUND: i64 = -32601;
const RPC_INVALID_PARAMS: i64 = -32602;
const RPC_CANCELLED: i64 = -32800;

error_codes! {
    // E1xxx: wire and usage
    /// The bytes were not JSON.
    ParseError = 1001, rpc RPC_PARSE, exit 1,
        "Parse error: {detail}",
        "Send one JSON-RPC 2.0 message per line, or use Content-Length framing.";
    /// JSON, but not a valid JSON-RPC 2.0 request.
    InvalidRequest = 1002, rpc RPC_INVALID_REQUEST, exit 1,
        "Invalid request: {detail}",
        "A request is {\"jsonrpc\":\"2.0\",\"id\":<number|string>,\"method\":\"...\",\"params\":{...}}.";
    /// No such method.
    MethodNotFound = 1003, rpc RPC_METHOD_NOT_FOUND, exit 2,
        "Method '{method}' not found.",
        "See docs/broker-api.md for the method catalogue.";
    /// Params missing, of the wrong type or out of range.
    InvalidParams = 1004, rpc RPC_INVALID_PARAMS, exit 2,
        "Invalid params for '{method}': {detail}",
        "See docs/broker-api.md for the parameters of '{method}'.";
    /// A message above the size limit.
    MessageTooLarge = 1005, rpc RPC_INVALID_REQUEST, exit 1,
        "Message too large: the limit is {limit} bytes{size}.",
        "Send large files in chunks with files/write offsets, or use files/upload.";
    /// The request was cancelled by `$/cancelRequest`.
    RequestCancelled = 1006, rpc RPC_CANCELLED, exit 1,
        "Request cancelled.",
        "The client cancelled this request; nothing more will be sent for it.";
    /// The CLI could not reach or start the daemon.
    BrokerUnreachable = 1007, rpc 1007, exit 1,
        "The abx broker is not reachable: {detail}",
        "Run 'abx broker start' and see the log at {log}.";
    /// Client and daemon versions differ and the daemon is busy.
    VersionMismatch = 1008, rpc 1008, exit 1,
        "The running broker is version {server}, this client is {client}.",
        "Stop it when it is idle ('abx broker stop') so the next command starts version {client}.";
    /// Wrong command-line usage or a refused action.
    Usage = 1009, rpc 1009, exit 2,
        "{detail}",
        "Run 'abx --help' for the command list.";
    /// The connection or the daemon is shutting down.
    ShuttingDown = 1010, rpc RPC_INVALID_REQUEST, exit 1,
        "The broker is shutting down; '{method}' was not run.",
        "Reconnect; the next abx command starts a fresh broker.";
    /// Permission denied at the broker's door.
    PermissionDenied = 1011, rpc 1011, exit 1,
        "Permission denied: {detail}",
        "The broker serves only the user who owns it.";
    /// A daemon already owns the socket.
    BrokerAlreadyRunning = 1012, rpc 1012, exit 1,
        "An abx broker is already running (pid {pid}, socket {socket}).",
        "Use it, or stop it first with 'abx broker stop'.";
    /// The request was valid but the broker is busy with too much at once.
    Busy = 1013, rpc 1013, exit 1,
        "The broker is busy: {detail}",
        "Retry shortly.";
    /// ssh could not reach the machine named by `ABX_HOST` / `--host`.
    HostUnreachable = 1014, rpc 1014, exit 1,
        "Cannot reach host '{host}' over ssh: {detail}",
        "Check the address and port in ABX_HOST / --host (ssh://[user@]host[:port]) and that sshd runs there; 'ssh {target} true' must work by hand.";
    /// ssh reached the machine but the login was refused (key, host key).
    HostAuthFailed = 1015, rpc 1015, exit 1,
        "ssh could not log in to '{host}': {detail}",
        "abx runs your own ssh without prompting (BatchMode): load the key in ssh-agent or name it in ~/.ssh/config (IdentityFile), accept the host key once with 'ssh {target} true', then retry.";
    /// Logged in, but the remote `abx` could not be run.
    RemoteAbxNotFound = 1016, rpc 1016, exit 1,
        "'{bin}' cannot be run on host '{host}': {detail}",
        "Install abx on that machine so '{bin}' is on the PATH of non-interactive ssh sessions, or set ABX_REMOTE_BIN to its full path there.";

    // E2xxx: sandboxes
    /// A sandbox could not be created.
    SandboxCreateFailed = 2001, rpc 2001, exit 1,
        "Could not create the sandbox: {detail}",
        "Check the provider with 'abx provider doctor {provider}'.";
    /// The sandbox exists but is not running (paused or stopping).
    SandboxNotRunning = 2002, rpc 2002, exit 1,
        "Sandbox '{sandbox}' is {status}, not running.",
        "Run 'abx resume {sandbox}' first.";
    /// The sandbox's lifetime ran out.
    SandboxExpired = 2003, rpc 2003, exit 4,
        "Sandbox '{sandbox}' expired.",
        "Create a new one with 'abx create'; extend lifetimes with 'abx set-timeout'.";
    /// A timeout outside the accepted range.
    InvalidTimeout = 2004, rpc 2004, exit 2,
        "Invalid timeout {timeout}: {detail}",
        "Give a whole number of seconds between 1 and 2592000 (30 days).";
    /// The template is unknown to the provider.
    TemplateNotFound = 2005, rpc 2005, exit 4,
        "Template '{template}' not found.",
        "Run 'abx template list' to see the templates of this provider.";
    /// The broker's cap on live sandboxes is reached.
    SandboxLimitReached = 2006, rpc 2006, exit 1,
        "Too many sandboxes: {detail}",
        "Kill sandboxes you no longer need ('abx list', 'abx kill ID'), or raise [local] max_sandboxes in the broker config (config.toml).";
    /// No sandbox with this id.
    SandboxNotFound = 2009, rpc 2009, exit 4,
        "Sandbox '{sandbox}' not found.",
        "Run 'abx list' to see the running sandboxes; a killed or expired sandbox cannot be reconnected.";
    /// A host directory the sandbox may not mount, or no longer the one it mounted.
    MountRefused = 2010, rpc 2010, exit 2,
        "Mount of '{path}' refused: {reason}.",
        "Mount a project directory of your own: not the home directory itself or one above it, a credential directory, a system directory or the broker's own (docs/local-sandboxes.md, \"Mounts\").";
    /// A Dockerfile build step failed (a `RUN` exited non-zero, or ran out of room).
    BuildFailed = 2011, rpc 2011, exit 1,
        "Build of '{template}' failed at {step} (Dockerfile line {line}): {detail}",
        "Fix the step (its last output lines are above), then build again: the steps before it are cached.";
    /// A Dockerfile that cannot be built as written.
    DockerfileInvalid = 2012, rpc 2012, exit 2,
        "Dockerfile line {line}: {detail}",
        "See docs/templates.md for the instructions 'abx template build' supports.";
    /// The build context cannot be used: a path escapes it, or it is too big.
    BuildContextRefused = 2013, rpc 2013, exit 2,
        "Build context '{path}' refused: {reason}.",
        "COPY and ADD read only files under the context, without '..' or links that leave it; exclude what the image does not need in .dockerignore (limits: docs/templates.md).";

    // E3xxx: exec
    /// The command ran out of time.
    ExecTimedOut = 3001, rpc 3001, exit 1,
        "Command timed out after {timeout}s.",
        "Raise the timeout, or run it with 'exec/start' and stream its output.";
    /// No exec with this id.
    ExecNotFound = 3002, rpc 3002, exit 4,
        "Exec '{exec}' not found.",
        "It has exited and its exit was delivered, or it belongs to another broker.";
    /// The command could not be started.
    ExecFailedToStart = 3003, rpc 3003, exit 1,
        "Could not start the command: {detail}",
        "Check the program name and the working directory.";
    /// The exec belongs to another connection and is not attached here.
    ExecNotOwned = 3004, rpc 3004, exit 1,
        "Exec '{exec}' belongs to another connection.",
        "Call exec/attach with its id to take over its output first.";
    /// Stdin of the exec is closed.
    ExecStdinClosed = 3005, rpc 3005, exit 1,
        "Stdin of exec '{exec}' is closed.",
        "Start it again to send more input.";

    /// No such process in the sandbox.
    ProcessNotFound = 3006, rpc 3006, exit 4,
        "Process {pid} not found in sandbox '{sandbox}'.",
        "Run 'abx sandbox process list {sandbox}' to see its processes.";

    // E4xxx: files
    /// No such file.
    FileNotFound = 4001, rpc 4001, exit 4,
        "File '{path}' not found.",
        "Run 'abx sandbox files list {sandbox} --path <dir>' to see what is there.";
    /// A path escaping the sandbox.
    PathOutsideSandbox = 4002, rpc 4002, exit 2,
        "Path '{path}' is outside the sandbox.",
        "Use a path under /workspace or /tmp of the sandbox, without '..' or links that leave it.";
    /// A directory where a file is expected.
    IsADirectory = 4003, rpc 4003, exit 1,
        "'{path}' is a directory.",
        "Give a file path, or use files/list for directories.";
    /// A file where a directory is expected.
    NotADirectory = 4004, rpc 4004, exit 1,
        "'{path}' is not a directory.",
        "Give a directory path.";
    /// A directory that is not empty.
    DirectoryNotEmpty = 4005, rpc 4005, exit 1,
        "Directory '{path}' is not empty.",
        "Remove it recursively (recursive: true; abx sandbox files rm -r) to delete its contents too.";
    /// Something already exists at the path.
    FileExists = 4006, rpc 4006, exit 1,
        "'{path}' already exists.",
        "Remove it first, or choose another path.";
    /// Data that cannot be decoded (bad base64, bad encoding name).
    InvalidData = 4007, rpc 4007, exit 2,
        "Invalid data: {detail}",
        "Send text as encoding 'utf-8' or bytes as encoding 'base64'.";
    /// The operating system refused access.
    FilePermissionDenied = 4008, rpc 4008, exit 1,
        "Permission denied: '{path}'.",
        "Check the file's mode inside the sandbox.";
    /// A local file (upload source, download target) cannot be used.
    LocalFileError = 4009, rpc 4009, exit 1,
        "Local file '{path}': {detail}",
        "Check that the local path exists and is readable (upload) or its directory writable (download).";
    /// A path (or one of its names) longer than the file system allows.
    PathTooLong = 4010, rpc 4010, exit 2,
        "Path '{path}' is too long.",
        "Keep each name under 256 bytes and the whole path under 4096 bytes.";
    /// An offset (or offset + length) beyond the largest file the file system allows.
    OffsetOutOfRange = 4011, rpc 4011, exit 2,
        "Offset out of range for '{path}': {detail}",
        "Write at an offset below the largest file size the sandbox's file system allows (2^63-1 bytes at most).";
    /// No space left on the sandbox's file system.
    DiskFull = 4012, rpc 4012, exit 1,
        "No space left to write '{path}'.",
        "Free space in the sandbox (remove files), then retry.";
    /// The user's disk quota is exhausted.
    QuotaExceeded = 4013, rpc 4013, exit 1,
        "Disk quota exceeded writing '{path}'.",
        "Free space within the quota (remove files), then retry.";
    /// A path the sandbox sees but may not change.
    ReadOnly = 4014, rpc 4014, exit 1,
        "'{path}' is read-only in sandbox '{sandbox}'.",
        "Write under /workspace, /tmp or a mount that is not 'ro'.";
    /// Host files changed since the sandbox was created, where the sandbox changed them too.
    ApplyConflict = 4015, rpc 4015, exit 1,
        "Changed on the host since sandbox '{sandbox}' was created: {paths}.",
        "Review them ('abx diff {sandbox} --patch PATH'), then apply with --force to keep the sandbox's version, or 'abx discard {sandbox} PATH' to keep the host's.";

    // E5xxx: ports
    /// Nothing answers on the port.
    PortNotReachable = 5001, rpc 5001, exit 1,
        "Port {port} of sandbox '{sandbox}' is not reachable.",
        "Start a server listening on that port inside the sandbox first.";
    /// A port number out of range.
    InvalidPort = 5002, rpc 5002, exit 2,
        "Invalid port {port}.",
        "Give a port number between 1 and 65535.";

    // E8xxx: providers
    /// No such provider.
    ProviderNotInstalled = 8001, rpc 8001, exit 4,
        "Provider '{provider}' is not installed.",
        "Run 'abx provider list'; install with 'abx provider install <path-or-git-url>'.";
    /// The plugin failed its handshake.
    HandshakeFailed = 8002, rpc 8002, exit 1,
        "Provider '{provider}': handshake failed: {detail}",
        "Run 'abx provider doctor {provider}' and check the plugin's log.";
    /// The plugin speaks another protocol.
    ProtocolMismatch = 8003, rpc 8003, exit 1,
        "Provider '{provider}' speaks '{protocol}', not EPP/1.",
        "Update the provider: 'abx provider update {provider}'.";
    /// The provider does not declare the feature a method needs.
    FeatureNotSupported = 8004, rpc 8004, exit 1,
        "Provider '{provider}' does not support '{feature}'.",
        "Run 'abx provider info {provider}' to see supported features.";
    /// Provider configuration is missing or invalid.
    ConfigInvalid = 8006, rpc 8006, exit 1,
        "Provider '{provider}': invalid configuration: {detail}",
        "Run 'abx provider configure {provider}' to set it.";
    /// The plugin process crashed.
    PluginCrashed = 8007, rpc 8007, exit 1,
        "Provider '{provider}' crashed: {detail}",
        "It restarts on the next call; run 'abx provider doctor {provider}' if it keeps crashing.";
    /// The plugin did not answer in time.
    PluginTimedOut = 8008, rpc 8008, exit 1,
        "Provider '{provider}' did not answer '{method}' within {timeout}s.",
        "Run 'abx provider doctor {provider}'.";
    /// The plugin answered something that is not valid EPP/1.
    BadPluginReply = 8009, rpc 8009, exit 1,
        "Provider '{provider}' sent an invalid reply: {detail}",
        "Report this to the provider's maintainer.";
    /// A provider source cannot be fetched.
    SourceUnreachable = 8010, rpc 8010, exit 1,
        "Cannot fetch '{source}': {detail}",
        "Check the URL or path and your network.";
    /// Installed files changed since install.
    IntegrityFailed = 8011, rpc 8011, exit 1,
        "Provider '{provider}': files changed since install.",
        "Reinstall or run 'abx provider update {provider}'.";
    /// Confirmation, pinning or transport refused.
    Refused = 8012, rpc 8012, exit 2,
        "{detail}",
        "{rerun}";
    /// The content digest does not match the one given.
    DigestMismatch = 8013, rpc 8013, exit 1,
        "Digest mismatch: expected {expected}, got {actual}.",
        "Check the --sha256 value against the publisher's.";
    /// The manifest is missing or invalid.
    InvalidManifest = 8014, rpc 8014, exit 1,
        "Invalid abx-provider.toml: {detail}",
        "See docs/providers.md for the manifest format.";
    /// A provider with this id is installed already.
    AlreadyInstalled = 8015, rpc 8015, exit 1,
        "Provider '{provider}' is already installed.",
        "Run 'abx provider update {provider}', or uninstall it first.";
    /// Declared permissions cannot be enforced here.
    EnforcementUnavailable = 8016, rpc 8016, exit 1,
        "Provider '{provider}': cannot enforce its declared security: {detail}",
        "Set enforcement = \"warn\" in the broker config to run it unconfined.";

    // E9xxx: internal
    /// A bug in the broker.
    Internal = 9001, rpc 9001, exit 1,
        "Internal error: {detail}",
        "This is a bug; the broker log has the details. Please report it.";
}

impl ErrorCode {
    /// `"E2009"`.
    pub fn abx(self) -> String {
        format!("E{}", self.number())
    }

    /// Look a code up by its E-number.
    pub fn from_number(n: u32) -> Option<Self> {
        Self::ALL.iter().copied().find(|c| c.number() == n)
    }

    /// Look a code up by its `"E2009"` form.
    pub fn from_abx(s: &str) -> Option<Self> {
        s.strip_prefix('E')?
            .parse()
            .ok()
            .and_then(Self::from_number)
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "E{}", self.number())
    }
}

/// Fill `{name}` placeholders from `args`; unknown placeholders are left as they are.
pub fn fill(template: &str, args: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(template.len() + 32);
    let mut rest = template;
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        match after.find('}') {
            Some(end) if args.iter().any(|(k, _)| *k == &after[..end]) => {
                let key = &after[..end];
                let (_, v) = args.iter().find(|(k, _)| *k == key).expect("checked");
                out.push_str(v);
                rest = &after[end + 1..];
            }
            _ => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The typed error of every broker operation.
#[derive(Clone, Debug, PartialEq)]
pub struct AbxError {
    /// Which error.
    pub code: ErrorCode,
    /// The filled message, without the `[E....]` prefix.
    pub message: String,
    /// What to do about it.
    pub suggestion: String,
    /// Extra machine-readable fields for `error.data` (never secrets).
    pub data: Map<String, Value>,
}

impl AbxError {
    /// Build an error from its code, filling the template and default suggestion.
    pub fn new(code: ErrorCode, args: &[(&str, &str)]) -> Self {
        AbxError {
            code,
            message: fill(code.template(), args),
            suggestion: fill(code.suggestion(), args),
            data: Map::new(),
        }
    }

    /// An error whose template has a single `{detail}`.
    pub fn detail(code: ErrorCode, detail: impl fmt::Display) -> Self {
        Self::new(code, &[("detail", &detail.to_string())])
    }

    /// Replace the suggestion.
    pub fn with_suggestion(mut self, suggestion: impl Into<String>) -> Self {
        self.suggestion = suggestion.into();
        self
    }

    /// Add a field to `error.data`.
    pub fn with_data(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.data.insert(key.to_owned(), value.into());
        self
    }

    /// -32602 for `method` with a reason.
    pub fn invalid_params(method: &str, detail: impl fmt::Display) -> Self {
        Self::new(
            ErrorCode::InvalidParams,
            &[("method", method), ("detail", &detail.to_string())],
        )
    }

    /// An internal error (E9001).
    pub fn internal(detail: impl fmt::Display) -> Self {
        Self::detail(ErrorCode::Internal, detail)
    }

    /// The wire form.
    pub fn to_rpc(&self) -> RpcError {
        let mut data = self.data.clone();
        data.insert("abx".into(), Value::String(self.code.abx()));
        data.insert("suggestion".into(), Value::String(self.suggestion.clone()));
        RpcError {
            code: self.code.rpc_code(),
            message: self.message.clone(),
            data: Some(Value::Object(data)),
        }
    }
}

impl fmt::Display for AbxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {}", self.code.abx(), self.message)
    }
}

impl std::error::Error for AbxError {}

impl From<AbxError> for RpcError {
    fn from(e: AbxError) -> Self {
        e.to_rpc()
    }
}

/// The JSON-RPC error object as it travels on the wire.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RpcError {
    /// JSON-RPC code: a standard negative code or the E-number.
    pub code: i64,
    /// Human-readable message.
    pub message: String,
    /// `{abx: "E2009", suggestion: "...", ...}` for every error the broker sends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

impl RpcError {
    /// `data.abx`, e.g. `"E2009"`, when present.
    pub fn abx(&self) -> Option<&str> {
        self.data.as_ref()?.get("abx")?.as_str()
    }

    /// `data.suggestion` when present.
    pub fn suggestion(&self) -> Option<&str> {
        self.data.as_ref()?.get("suggestion")?.as_str()
    }

    /// The known code, from `data.abx` or else from `code`.
    pub fn error_code(&self) -> Option<ErrorCode> {
        if let Some(c) = self.abx().and_then(ErrorCode::from_abx) {
            return Some(c);
        }
        u32::try_from(self.code)
            .ok()
            .and_then(ErrorCode::from_number)
    }

    /// The CLI exit code for this error (1 when unknown).
    pub fn exit_code(&self) -> i32 {
        self.error_code().map_or(1, ErrorCode::exit_code)
    }
}

impl fmt::Display for RpcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.abx() {
            Some(abx) => write!(f, "[{abx}] {}", self.message),
            None => write!(f, "[{}] {}", self.code, self.message),
        }
    }
}

impl std::error::Error for RpcError {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn codes_are_unique_and_complete() {
        let mut seen = HashSet::new();
        for c in ErrorCode::ALL {
            assert!(seen.insert(c.number()), "duplicate {}", c.number());
            assert!(!c.template().is_empty());
            assert!(!c.suggestion().is_empty(), "{c} has no suggestion");
            assert!(matches!(c.exit_code(), 1 | 2 | 4));
            assert_eq!(ErrorCode::from_abx(&c.abx()), Some(*c));
        }
        // The seed fixes these numbers and exit codes.
        assert_eq!(ErrorCode::SandboxNotFound.number(), 2009);
        assert_eq!(ErrorCode::SandboxNotFound.exit_code(), 4);
        assert_eq!(ErrorCode::FileNotFound.number(), 4001);
        assert_eq!(ErrorCode::ProviderNotInstalled.number(), 8001);
        assert_eq!(ErrorCode::FeatureNotSupported.number(), 8004);
        assert_eq!(ErrorCode::IntegrityFailed.number(), 8011);
        assert_eq!(ErrorCode::Refused.exit_code(), 2);
        assert_eq!(ErrorCode::InvalidManifest.number(), 8014);
        assert!(ErrorCode::from_number(8005).is_none(), "E8005 is retired");
    }

    #[test]
    fn templates_fill() {
        let e = AbxError::new(
            ErrorCode::FeatureNotSupported,
            &[("provider", "X"), ("feature", "files.watch")],
        );
        assert_eq!(
            e.to_string(),
            "[E8004] Provider 'X' does not support 'files.watch'."
        );
        assert_eq!(
            e.suggestion,
            "Run 'abx provider info X' to see supported features."
        );
        let rpc = e.to_rpc();
        assert_eq!(rpc.code, 8004);
        assert_eq!(rpc.abx(), Some("E8004"));
        assert_eq!(fill("a {x} {y} {", &[("x", "1")]), "a 1 {y} {");
    }

    #[test]
    fn wire_codes_use_jsonrpc_numbers() {
        assert_eq!(ErrorCode::ParseError.rpc_code(), -32700);
        assert_eq!(ErrorCode::MethodNotFound.rpc_code(), -32601);
        assert_eq!(ErrorCode::RequestCancelled.rpc_code(), -32800);
        assert_eq!(ErrorCode::SandboxNotFound.rpc_code(), 2009);
    }
}
