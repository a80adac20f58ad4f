//! The one catalogue of the broker API's methods (issue 47): for every method its name, who
//! serves it ([`Kind`]), the feature that gates it, its group, a one-line summary, its params
//! type (and whether its params are open), its result type, the E-codes it can return and the
//! notifications it causes; and every notification the broker sends, with its params type.
//!
//! It is written once, in the `catalogue!` invocation below, and everything else is derived
//! from it (a new method is one entry here, and its handler):
//! - [`crate::api::methods`]: a constant per method and notification name ([`names`]);
//! - [`crate::features::for_method`] and [`crate::features::PROVIDER_METHODS`] ([`ROUTED`]);
//! - the params table the broker checks members against ([`crate::api::params`]);
//! - with the `schema` feature, `docs/openrpc.json` (`crate::openrpc` iterates [`METHODS`] and
//!   [`NOTIFICATIONS`]; each entry also records the functions that make its schemas);
//! - the core's method list (`abx_core::dispatch::METHODS`: [`CORE`]), the daemon's
//!   (`abx_broker::compose::METHODS`: [`DAEMON`]) and `initialize`'s `capabilities.methods`
//!   ([`REQUESTS`], those the broker serves).
//!
//! The lists are `const` slices computed from the table at compile time, so the code that
//! routes on them reads a plain slice.

use crate::api::params::ParamsEntry;
use crate::api::*;
use crate::error::ErrorCode;

/// Who serves a method.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The LSP lifecycle (`initialize`, `shutdown` and the client's notifications): the
    /// connection and the core's dispatch.
    Lifecycle,
    /// The broker's own methods, served by the core (`broker/*`, `sandbox/subscribe`, ...).
    Broker,
    /// The daemon's own methods (provider management, the contract kit): the composition
    /// root's `Methods`, not the core's.
    Daemon,
    /// Routed to a provider after gating on the method's feature (E8004).
    Routed,
}

/// One method of the API: a request, or a notification a client sends (no result).
pub struct Method {
    /// The wire name (`sandbox/create`).
    pub name: &'static str,
    /// Who serves it.
    pub kind: Kind,
    /// The feature a provider must declare ([`Kind::Routed`] methods only).
    pub feature: Option<&'static str>,
    /// The feature needed instead when the params ask for a pty (`exec/start` with `pty`).
    pub with_pty: Option<&'static str>,
    /// Its group in the documentation (OpenRPC tag).
    pub group: &'static str,
    /// One line on what it does.
    pub summary: &'static str,
    /// Its params type and whether its params are open.
    pub params: ParamsEntry,
    /// Its result; `None` for a notification the client sends (nothing is answered).
    pub result: Option<Reply>,
    /// The E-codes of its own it may answer ([`Method::errors`] adds the common ones).
    pub own_errors: &'static [ErrorCode],
    /// The notifications the broker sends because of it.
    pub notifications: &'static [&'static str],
    #[cfg(feature = "schema")]
    pub(crate) params_schema: crate::openrpc::SchemaFn,
}

/// A method's result.
pub struct Reply {
    /// Its name in the documentation: the type's name, or `null`.
    pub name: &'static str,
    /// The Rust type (`std::any::type_name`); `None` for `null` (`shutdown`).
    type_name: Option<fn() -> &'static str>,
    #[cfg(feature = "schema")]
    pub(crate) schema: crate::openrpc::SchemaFn,
}

impl Reply {
    /// The Rust type of the result (`std::any::type_name`); `None` for `null`.
    pub fn type_name(&self) -> Option<&'static str> {
        self.type_name.map(|f| f())
    }
}

/// A notification the broker sends.
pub struct Notification {
    /// The wire name (`exec/output`).
    pub name: &'static str,
    /// What it says, and to whom it goes.
    pub description: &'static str,
    params_type: fn() -> &'static str,
    #[cfg(feature = "schema")]
    pub(crate) params_schema: crate::openrpc::SchemaFn,
}

impl Notification {
    /// The Rust type of its params (`std::any::type_name`).
    pub fn params_type(&self) -> &'static str {
        (self.params_type)()
    }
}

/// Errors any request may get.
pub const EVERY_REQUEST_ERRORS: &[ErrorCode] = &[
    ErrorCode::InvalidParams,
    ErrorCode::RequestCancelled,
    ErrorCode::ShuttingDown,
    ErrorCode::Internal,
];

/// Errors of routing a provider method (docs/design.md#features) and of plugin providers.
pub const ROUTING_ERRORS: &[ErrorCode] = &[
    ErrorCode::ProviderNotInstalled,
    ErrorCode::FeatureNotSupported,
    ErrorCode::HandshakeFailed,
    ErrorCode::ProtocolMismatch,
    ErrorCode::ConfigInvalid,
    ErrorCode::PluginCrashed,
    ErrorCode::PluginTimedOut,
    ErrorCode::BadPluginReply,
];

impl Method {
    /// A request (answered), not a notification the client sends.
    pub const fn is_request(&self) -> bool {
        self.result.is_some()
    }

    /// The feature a call needs: `has_pty` is whether its params ask for a pty.
    pub fn feature_for(&self, has_pty: bool) -> Option<&'static str> {
        match self.with_pty {
            Some(f) if has_pty => Some(f),
            _ => self.feature,
        }
    }

    /// Every E-code a request may answer, by number: its own, those of any request, and for
    /// a routed method those of routing. Empty for a notification.
    pub fn errors(&self) -> Vec<ErrorCode> {
        if !self.is_request() {
            return Vec::new();
        }
        let mut codes = self.own_errors.to_vec();
        codes.extend_from_slice(EVERY_REQUEST_ERRORS);
        if self.kind == Kind::Routed {
            codes.extend_from_slice(ROUTING_ERRORS);
        }
        codes.sort_by_key(|c| c.number());
        codes.dedup();
        codes
    }
}

/// The method named `name`.
pub fn method(name: &str) -> Option<&'static Method> {
    METHODS.iter().find(|m| m.name == name)
}

/// The notification named `name`.
pub fn notification(name: &str) -> Option<&'static Notification> {
    NOTIFICATIONS.iter().find(|n| n.name == name)
}

/// What a broker lists in `initialize`'s `capabilities.methods`, given the methods its
/// composition root serves (`root`): the catalogue's requests in its order (the core's and
/// the routed ones always, the daemon's when `root` has them), then those of `root` the
/// catalogue does not have. With the daemon's methods: [`REQUESTS`].
pub fn listed(root: &[&'static str]) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = METHODS
        .iter()
        .filter(|m| m.is_request() && (m.kind != Kind::Daemon || root.contains(&m.name)))
        .map(|m| m.name)
        .collect();
    out.extend(root.iter().filter(|n| method(n).is_none()));
    out
}

const fn picks(kind: Kind, kinds: &[Kind]) -> bool {
    let mut i = 0;
    while i < kinds.len() {
        if kinds[i] as u8 == kind as u8 {
            return true;
        }
        i += 1;
    }
    false
}

/// How many requests of `kinds` there are.
const fn count(kinds: &[Kind]) -> usize {
    let (mut i, mut n) = (0, 0);
    while i < ALL.len() {
        if ALL[i].is_request() && picks(ALL[i].kind, kinds) {
            n += 1;
        }
        i += 1;
    }
    n
}

/// The names of the requests of `kinds`, in the catalogue's order.
const fn names_of<const N: usize>(kinds: &[Kind]) -> [&'static str; N] {
    let mut out = [""; N];
    let (mut i, mut j) = (0, 0);
    while i < ALL.len() {
        if ALL[i].is_request() && picks(ALL[i].kind, kinds) {
            out[j] = ALL[i].name;
            j += 1;
        }
        i += 1;
    }
    assert!(j == N);
    out
}

const EVERY_KIND: &[Kind] = &[Kind::Lifecycle, Kind::Broker, Kind::Daemon, Kind::Routed];
const CORE_KINDS: &[Kind] = &[Kind::Lifecycle, Kind::Broker];

/// Every request of the API, in the catalogue's order: what a broker with the daemon's
/// methods lists in `initialize`'s `capabilities.methods` (client notifications aside).
pub const REQUESTS: &[&str] = &names_of::<{ count(EVERY_KIND) }>(EVERY_KIND);
/// The requests the core serves itself ([`Kind::Lifecycle`] and [`Kind::Broker`]).
pub const CORE: &[&str] = &names_of::<{ count(CORE_KINDS) }>(CORE_KINDS);
/// The daemon's own requests ([`Kind::Daemon`]).
pub const DAEMON: &[&str] = &names_of::<{ count(&[Kind::Daemon]) }>(&[Kind::Daemon]);
/// The methods routed to providers ([`Kind::Routed`]).
pub const ROUTED: &[&str] = &names_of::<{ count(&[Kind::Routed]) }>(&[Kind::Routed]);

/// Every method, in the catalogue's order (docs/openrpc.json's).
pub static METHODS: &[Method] = ALL;

/// Every notification the broker sends.
pub static NOTIFICATIONS: &[Notification] = NOTES;

macro_rules! catalogue {
    (
        methods {
            $( $id:ident $name:literal: $kind:ident $( ($feature:literal $(, pty: $pty:literal)?) )?
               in $group:literal,
               $params:ty $([$open:ident])? $(=> $result:ident)?,
               [$($err:ident),*] $(notes [$($note:literal),*])?,
               $summary:literal; )*
        }
        notifications {
            $( $nid:ident $nname:literal: $nparams:ty, $ndesc:literal; )*
        }
    ) => {
        const ALL: &[Method] = &[
            $(Method {
                name: $name,
                kind: Kind::$kind,
                feature: catalogue!(@opt $($feature)?),
                with_pty: catalogue!(@opt $($($pty)?)?),
                group: $group,
                summary: $summary,
                params: ParamsEntry::new::<$params>($name, catalogue!(@open $($open)?)),
                result: catalogue!(@result $($result)?),
                own_errors: &[$(ErrorCode::$err),*],
                notifications: &[$($($note),*)?],
                #[cfg(feature = "schema")]
                params_schema: crate::openrpc::schema_of::<$params>,
            },)*
        ];

        const NOTES: &[Notification] = &[
            $(Notification {
                name: $nname,
                description: $ndesc,
                params_type: std::any::type_name::<$nparams>,
                #[cfg(feature = "schema")]
                params_schema: crate::openrpc::schema_of::<$nparams>,
            },)*
        ];

        /// A constant per method and notification name (re-exported as
        /// [`crate::api::methods`]).
        pub mod names {
            $(
                #[doc = concat!("`", $name, "`: ", $summary)]
                pub const $id: &str = $name;
            )*
            $(
                #[doc = concat!("Notification `", $nname, "`: ", $ndesc)]
                pub const $nid: &str = $nname;
            )*
        }
    };
    (@opt) => { None };
    (@opt $v:literal) => { Some($v) };
    (@open) => { false };
    (@open open) => { true };
    (@result) => { None };
    (@result null) => {
        Some(Reply {
            name: "null",
            type_name: None,
            #[cfg(feature = "schema")]
            schema: crate::openrpc::null_schema,
        })
    };
    (@result $t:ident) => {
        Some(Reply {
            name: stringify!($t),
            type_name: Some(std::any::type_name::<$t>),
            #[cfg(feature = "schema")]
            schema: crate::openrpc::schema_of::<$t>,
        })
    };
}

// Each entry: NAME "wire/name": Kind[("feature"[, pty: "feature with a pty"])] in "group",
// ParamsType [open] => ResultType (none: a notification the client sends; `null`: the
// result is null), [own E-codes] notes [notifications it causes], "summary".
// Open params take members their type does not name: api/params.rs says which and why.
catalogue! {
    methods {
        INITIALIZE "initialize": Lifecycle in "lifecycle",
            InitializeParams [open] => InitializeResult, [],
            "Optional handshake: who is connecting; what the broker offers.";
        INITIALIZED "initialized": Lifecycle in "lifecycle",
            NoParams [open], [],
            "Notification after initialize (ignored).";
        SHUTDOWN "shutdown": Lifecycle in "lifecycle",
            NoParams [open] => null, [],
            "This connection accepts no more requests (later ones get E1010).";
        EXIT "exit": Lifecycle in "lifecycle",
            NoParams [open], [],
            "Notification: close this connection (ends `abx broker --stdio`).";
        CANCEL_REQUEST "$/cancelRequest": Lifecycle in "lifecycle",
            CancelParams [open], [],
            "Notification: cancel an in-flight request; it answers E1006 (-32800). A running exec/run is killed.";
        PING "broker/ping": Broker in "broker",
            NoParams => Empty, [],
            "Liveness.";
        STATUS "broker/status": Broker in "broker",
            NoParams => BrokerStatus, [],
            "The daemon: version, pid, uptime, connections, requests in flight, paths, providers, sandboxes.";
        BROKER_SHUTDOWN "broker/shutdown": Broker in "broker",
            BrokerShutdownParams => Empty, [Busy],
            "Stop the daemon after answering; with ifIdle it refuses (E1013) while others use it.";
        PROVIDER_LIST "provider/list": Broker in "providers",
            NoParams => ProviderList, [],
            "Every installed provider.";
        PROVIDER_INFO "provider/info": Broker in "providers",
            ProviderIdParams => ProviderInfo, [ProviderNotInstalled],
            "One provider: summary, description, config keys, source, digest, runtime, security.";
        PROVIDER_INSTALL "provider/install": Daemon in "providers",
            ProviderInstallParams => InstallPlan,
            [SourceUnreachable, Refused, DigestMismatch, InvalidManifest, AlreadyInstalled, EnforcementUnavailable],
            "Install a provider plugin from a directory, git URL or archive URL (dryRun: the plan only).";
        PROVIDER_UNINSTALL "provider/uninstall": Daemon in "providers",
            ProviderUninstallParams => Empty, [ProviderNotInstalled, Refused],
            "Remove an installed plugin (needs confirm).";
        PROVIDER_UPDATE "provider/update": Daemon in "providers",
            ProviderUpdateParams => UpdateResult,
            [ProviderNotInstalled, SourceUnreachable, InvalidManifest, IntegrityFailed],
            "Re-resolve each plugin's source; update (or with check, only report).";
        PROVIDER_DOCTOR "provider/doctor": Daemon in "providers",
            ProviderIdParams => DoctorResult, [ProviderNotInstalled],
            "Check a provider: installed, integrity, config, handshake, permissions.";
        PROVIDER_CONFIGURE "provider/configure": Daemon in "providers",
            ProviderConfigureParams => ConfigureResult, [ProviderNotInstalled, ConfigInvalid],
            "Store config values of a plugin (secrets in a 0600 file); null removes a value.";
        PROVIDER_SET_DEFAULT "provider/setDefault": Daemon in "providers",
            ProviderIdParams => Empty, [ProviderNotInstalled],
            "Make a provider the default.";
        PROVIDER_TEST "provider/test": Daemon in "providers",
            ProviderTestParams => TestResult, [ProviderNotInstalled] notes ["provider/testResult"],
            "Run the provider contract kit against a provider.";
        SECRETS_SET "secrets/set": Daemon in "secrets",
            SecretSetParams => Empty, [],
            "Store a secret for egress headers (a policy's headers: {NAME: \"secret:KEY\"}) in the daemon's 0600 file; never returned, logged or put in an error.";
        SECRETS_LIST "secrets/list": Daemon in "secrets",
            NoParams => SecretList, [],
            "The keys of the stored secrets (never their values).";
        SECRETS_REMOVE "secrets/remove": Daemon in "secrets",
            SecretKeyParams => SecretRemoved, [],
            "Remove a stored secret (sandboxes whose policy names it get no more connections to that host: refused, counted as blocked).";
        SANDBOX_CREATE "sandbox/create": Routed("sandbox.lifecycle") in "sandboxes",
            SandboxCreateParams => Sandbox,
            [SandboxCreateFailed, InvalidTimeout, TemplateNotFound, SourceUnreachable, DigestMismatch, MountRefused],
            "Create a sandbox (mounts: host directories in it, storage.mount).";
        SANDBOX_INFO "sandbox/info": Routed("sandbox.lifecycle") in "sandboxes",
            SandboxParams => Sandbox, [SandboxNotFound],
            "Show a sandbox.";
        SANDBOX_CONNECT "sandbox/connect": Routed("sessions") in "sandboxes",
            SandboxParams => Sandbox, [SandboxNotFound],
            "Reattach to a sandbox by id without touching its lifetime.";
        SANDBOX_LIST "sandbox/list": Routed("sandbox.lifecycle") in "sandboxes",
            SandboxListParams => SandboxList, [],
            "List sandboxes (every provider's, unless provider is given). Across providers, a provider that fails is reported in errors and the others are listed anyway.";
        SANDBOX_KILL "sandbox/kill": Routed("sandbox.lifecycle") in "sandboxes",
            SandboxParams => KillResult, [],
            "Kill a sandbox and everything in it; idempotent (killed: false when gone).";
        SUBSCRIBE "sandbox/subscribe": Broker in "sandboxes",
            NoParams => Empty, [] notes ["sandbox/changed", "sandbox/blocked"],
            "This connection receives sandbox/changed (and sandbox/blocked) for every sandbox of every provider from now on (idempotent; not gated on a feature).";
        UNSUBSCRIBE "sandbox/unsubscribe": Broker in "sandboxes",
            NoParams => Empty, [],
            "This connection receives no more sandbox/changed (idempotent): nothing is sent after the reply.";
        SANDBOX_DIFF "sandbox/diff": Routed("storage.mount") in "sandboxes",
            DiffParams => DiffResult, [SandboxNotFound, FileNotFound, PathOutsideSandbox, MountRefused],
            "What the sandbox changed under its overlay mounts, against the host as it was at create (format patch: with unified diffs).";
        SANDBOX_APPLY "sandbox/apply": Routed("storage.mount") in "sandboxes",
            ApplyParams => ApplyResult, [SandboxNotFound, FileNotFound, PathOutsideSandbox, ApplyConflict, FilePermissionDenied, DiskFull, MountRefused],
            "Write the sandbox's changes (all, or the paths given) to the host, each file atomically; a path the host changed since create is a conflict unless force.";
        SANDBOX_DISCARD "sandbox/discard": Routed("storage.mount") in "sandboxes",
            DiscardParams => DiscardResult, [SandboxNotFound, FileNotFound, PathOutsideSandbox, MountRefused],
            "Drop the sandbox's changes under its overlay mounts (all, or the paths given): it sees the host's files again.";
        SANDBOX_LOG "sandbox/log": Broker in "sandboxes",
            LogParams => LogResult, [SandboxNotFound],
            "Every command run in the sandbox (exec, pty, code cell) with the client that asked, kept by the broker for every provider (bounded).";
        SANDBOX_SET_NETWORK "sandbox/setNetwork": Routed("network.vpc") in "sandboxes",
            SetNetworkParams => Sandbox, [SandboxNotFound] notes ["sandbox/blocked"],
            "Change the egress policy of a running sandbox: new connections follow it, open ones go on.";
        SANDBOX_SET_TIMEOUT "sandbox/setTimeout": Routed("sandbox.timeout") in "sandboxes",
            SetTimeoutParams => Sandbox, [SandboxNotFound, InvalidTimeout],
            "The sandbox's lifetime ends timeout seconds from now.";
        SANDBOX_PAUSE "sandbox/pause": Routed("sandbox.pause") in "sandboxes",
            SandboxParams => Sandbox, [SandboxNotFound],
            "Stop every process of the sandbox.";
        SANDBOX_RESUME "sandbox/resume": Routed("sandbox.pause") in "sandboxes",
            SandboxParams => Sandbox, [SandboxNotFound],
            "Continue every process of a paused sandbox.";
        SANDBOX_CAPABILITIES "sandbox/capabilities": Routed("sandbox.lifecycle") in "sandboxes",
            SandboxParams => Capabilities, [SandboxNotFound],
            "What the sandbox can do, derived from its provider's declared features.";
        SANDBOX_SYSTEM_INFO "sandbox/systemInfo": Routed("sandbox.lifecycle") in "sandboxes",
            SandboxParams => SystemInfo, [SandboxNotFound],
            "OS, architecture, CPUs, memory, disk, isolation.";
        EXEC_RUN "exec/run": Routed("exec.run") in "exec",
            ExecRunParams => ExecResult,
            [SandboxNotFound, SandboxNotRunning, ExecFailedToStart, InvalidData],
            "Run a command to completion and return its output (cancel: killed, E1006). maxOutput above 16 MiB is E1004: stream with exec/start instead.";
        EXEC_START "exec/start": Routed("exec.stream", pty: "pty") in "exec",
            ExecStartParams => ExecStarted,
            [SandboxNotFound, SandboxNotRunning, ExecFailedToStart, InvalidData]
            notes ["exec/output", "exec/exit"],
            "Start a command and stream it: the reply first, then exec/output in read order and exactly one exec/exit.";
        EXEC_WRITE "exec/write": Routed("exec.stream") in "exec",
            ExecWriteParams => Empty, [ExecNotFound, ExecNotOwned, ExecStdinClosed, InvalidData],
            "Write to the stdin of an exec; eof closes it.";
        EXEC_RESIZE "exec/resize": Routed("pty") in "exec",
            ExecResizeParams => Empty, [ExecNotFound, ExecNotOwned],
            "Resize the terminal of a pty exec.";
        EXEC_KILL "exec/kill": Routed("exec.stream") in "exec",
            ExecKillParams => Empty, [ExecNotFound, ExecNotOwned],
            "Signal the whole process tree of an exec (default KILL).";
        EXEC_ATTACH "exec/attach": Routed("exec.stream") in "exec",
            ExecIdParams => AttachResult, [ExecNotFound] notes ["exec/output", "exec/exit"],
            "Receive an exec's stream on this connection from now on, starting with what was buffered.";
        PROCESS_LIST "process/list": Routed("process.manage") in "processes",
            SandboxParams => ProcessList, [SandboxNotFound],
            "The processes of a sandbox.";
        PROCESS_KILL "process/kill": Routed("process.manage") in "processes",
            ProcessKillParams => Empty, [SandboxNotFound, ProcessNotFound],
            "Signal a process of a sandbox (default KILL).";
        FILES_READ "files/read": Routed("files.rw") in "files",
            FilesReadParams => FileChunk,
            [SandboxNotFound, FileNotFound, PathOutsideSandbox, FilePermissionDenied, IsADirectory, InvalidData, PathTooLong],
            "Read a chunk of a file (at most 4 MiB; a larger length is E1004: read in chunks).";
        FILES_WRITE "files/write": Routed("files.rw") in "files",
            FilesWriteParams => SizeResult,
            [SandboxNotFound, FileNotFound, PathOutsideSandbox, FilePermissionDenied, IsADirectory, InvalidData, MessageTooLarge, PathTooLong, OffsetOutOfRange, DiskFull, QuotaExceeded],
            "Write a file: replaced atomically, or at an offset, or appended.";
        FILES_LIST "files/list": Routed("files.rw") in "files",
            FilesListParams => FileList,
            [SandboxNotFound, FileNotFound, PathOutsideSandbox, FilePermissionDenied, NotADirectory],
            "List a directory (recursive: everything below).";
        FILES_STAT "files/stat": Routed("files.rw") in "files",
            PathParams => FileEntry,
            [SandboxNotFound, FileNotFound, PathOutsideSandbox, FilePermissionDenied],
            "One file's status.";
        FILES_MKDIR "files/mkdir": Routed("files.rw") in "files",
            MkdirParams => Empty,
            [SandboxNotFound, FileNotFound, PathOutsideSandbox, FilePermissionDenied, FileExists, NotADirectory],
            "Create a directory (parents: with missing parents).";
        FILES_REMOVE "files/remove": Routed("files.rw") in "files",
            RemoveParams => Empty,
            [SandboxNotFound, FileNotFound, PathOutsideSandbox, FilePermissionDenied, DirectoryNotEmpty],
            "Remove a file or directory.";
        FILES_RENAME "files/rename": Routed("files.rw") in "files",
            RenameParams => Empty,
            [SandboxNotFound, FileNotFound, PathOutsideSandbox, FilePermissionDenied, FileExists],
            "Rename or move within the sandbox.";
        FILES_UPLOAD "files/upload": Routed("files.rw") in "files",
            TransferParams => TransferResult,
            [SandboxNotFound, FileNotFound, PathOutsideSandbox, FilePermissionDenied, IsADirectory, LocalFileError]
            notes ["files/progress"],
            "Copy a local file of the broker's machine into the sandbox, with progress.";
        FILES_DOWNLOAD "files/download": Routed("files.rw") in "files",
            TransferParams => TransferResult,
            [SandboxNotFound, FileNotFound, PathOutsideSandbox, FilePermissionDenied, IsADirectory, LocalFileError]
            notes ["files/progress"],
            "Copy a file of the sandbox to the broker's machine, with progress.";
        FILES_WATCH "files/watch": Routed("files.watch") in "files",
            WatchParams => WatchStarted,
            [SandboxNotFound, FileNotFound, PathOutsideSandbox, FilePermissionDenied]
            notes ["files/changed"],
            "Watch a path; changes come as files/changed.";
        FILES_UNWATCH "files/unwatch": Routed("files.watch") in "files",
            UnwatchParams => Empty, [],
            "Stop a watch.";
        PORTS_URL "ports/url": Routed("ports.url") in "ports",
            PortParams => PortUrl, [SandboxNotFound, PortNotReachable, InvalidPort],
            "Where a port of the sandbox is reached, and the headers to send.";
        CODE_RUN "code/run": Routed("code.interpret") in "code",
            CodeRunParams => CodeResult,
            [SandboxNotFound, SandboxNotRunning, InvalidTimeout, ExecFailedToStart]
            notes ["code/output"],
            "Run a cell in a context (a long-lived interpreter of the sandbox): variables, imports and the working directory persist; output streams as code/output.";
        CODE_CREATE_CONTEXT "code/createContext": Routed("code.interpret") in "code",
            CodeCreateContextParams => CodeContext, [SandboxNotFound, SandboxNotRunning],
            "Create a context (an interpreter of a language; it starts on its first run).";
        CODE_LIST_CONTEXTS "code/listContexts": Routed("code.interpret") in "code",
            SandboxParams => CodeContexts, [SandboxNotFound],
            "The sandbox's contexts.";
        CODE_RESTART_CONTEXT "code/restartContext": Routed("code.interpret") in "code",
            CodeContextParams => CodeContext, [SandboxNotFound],
            "Restart a context's interpreter (its state is lost).";
        CODE_REMOVE_CONTEXT "code/removeContext": Routed("code.interpret") in "code",
            CodeContextParams => Empty, [SandboxNotFound],
            "Remove a context and end its interpreter.";
        COMMANDS_RUN "commands/run": Routed("templates.read") in "templates",
            CommandRunParams => ExecResult, [SandboxNotFound, SandboxNotRunning],
            "Run a named command of the sandbox's template.";
        TEMPLATES_LIST "templates/list": Routed("templates.read") in "templates",
            TemplatesParams [open] => TemplateList, [],
            "The provider's templates (local: base and the stored OCI images).";
        TEMPLATES_INIT "templates/init": Routed("templates.read") in "templates",
            TemplatesInitParams [open] => TemplatesInitResult, [Refused, LocalFileError, FileExists],
            "Write a starter Dockerfile for a language into a directory (local: for templates/build).";
        TEMPLATES_BUILD "templates/build": Routed("templates.build") in "templates",
            TemplatesBuildParams [open] => TemplateInfo,
            [TemplateNotFound, SandboxNotFound, Refused, LocalFileError, BuildFailed, DockerfileInvalid, BuildContextRefused] notes ["templates/progress"],
            "Save a sandbox's filesystem changes as a new template (local: a new layer on its base image), or build a Dockerfile in a context directory (progress as templates/progress).";
        TEMPLATES_PULL "templates/pull": Routed("templates.read") in "templates",
            TemplatesPullParams [open] => TemplateInfo,
            [TemplateNotFound, SourceUnreachable, DigestMismatch, Refused] notes ["templates/progress"],
            "Pull an image from its registry (progress as templates/progress).";
        TEMPLATES_REMOVE "templates/remove": Routed("templates.read") in "templates",
            TemplatesRemoveParams [open] => TemplatesRemoved, [TemplateNotFound],
            "Remove a template, or prune the unused ones.";
        TEMPLATES_IMPORT "templates/import": Routed("templates.read") in "templates",
            TemplatesImportParams [open] => TemplateInfo, [LocalFileError, DigestMismatch, Refused],
            "Import a docker save archive or an OCI image layout directory.";
    }
    notifications {
        EXEC_OUTPUT "exec/output": ExecOutput,
            "A chunk of an exec's output, in read order (only to the connection that owns the stream).";
        EXEC_EXIT "exec/exit": ExecExit,
            "An exec ended: exactly one per exec, after its last output.";
        CODE_OUTPUT "code/output": CodeOutput,
            "One event of a running code/run cell, in order: stdout, stderr, result, error, or restarted (only to the calling connection).";
        FILES_PROGRESS "files/progress": FilesProgress,
            "Progress of files/upload or files/download.";
        TEMPLATES_PROGRESS "templates/progress": TemplatesProgress,
            "Progress of templates/pull or of a Dockerfile templates/build.";
        FILES_CHANGED "files/changed": FilesChanged,
            "A change under a watched path.";
        SANDBOX_BLOCKED "sandbox/blocked": SandboxBlocked,
            "A sandbox's egress policy refused a connection (to subscribers; counted before the refusal was answered).";
        SANDBOX_CHANGED "sandbox/changed": SandboxChanged,
            "A sandbox of some provider was created, killed, paused, resumed, expired or given a new timeout, by any client or by no one (only to connections that called sandbox/subscribe; a subscriber that stops reading loses the oldest, see docs/broker-api.md).";
        PROVIDER_TEST_RESULT "provider/testResult": TestResultNote,
            "One contract-kit test finished (during provider/test, to the caller, in completion order).";
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::features;

    #[test]
    fn names_are_unique_and_lookups_find_them() {
        let mut names: Vec<&str> = METHODS.iter().map(|m| m.name).collect();
        names.extend(NOTIFICATIONS.iter().map(|n| n.name));
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len(), "a name is listed twice");
        for m in METHODS {
            assert!(std::ptr::eq(method(m.name).unwrap(), m), "{}", m.name);
            assert_eq!(m.params.method, m.name);
        }
        for n in NOTIFICATIONS {
            assert!(std::ptr::eq(notification(n.name).unwrap(), n), "{}", n.name);
        }
        assert!(method("no/such").is_none() && notification("no/such").is_none());
    }

    /// Routed methods, and only they, have a feature, and it is a known one; the pty rule
    /// is `exec/start`'s alone.
    #[test]
    fn every_routed_method_and_only_those_has_a_known_feature() {
        for m in METHODS {
            match (m.kind, m.feature) {
                (Kind::Routed, Some(f)) => assert!(features::is_known(f), "{}: {f}", m.name),
                (Kind::Routed, None) => panic!("{}: routed without a feature", m.name),
                (_, Some(f)) => panic!("{}: not routed, but gated on {f}", m.name),
                (_, None) => {}
            }
            assert!(m.is_request() || m.kind == Kind::Lifecycle, "{}", m.name);
            if let Some(f) = m.with_pty {
                assert_eq!((m.name, f), ("exec/start", "pty"));
            }
        }
    }

    /// Every feature a provider may declare gates some method, or is one of those that gate
    /// none (documented in [`features::NOT_GATING`] and docs/design.md#features).
    #[test]
    fn every_feature_gates_a_method_or_is_documented_as_gating_none() {
        for f in features::ALL {
            let gating = METHODS
                .iter()
                .any(|m| m.feature == Some(f) || m.with_pty == Some(f));
            assert_ne!(gating, features::NOT_GATING.contains(f), "{f}");
        }
        for f in features::NOT_GATING {
            assert!(features::is_known(f), "{f}");
        }
    }

    /// The derived lists partition the requests by kind, in the catalogue's order.
    #[test]
    fn derived_lists_are_the_requests_by_kind() {
        let of = |kinds: &[Kind]| -> Vec<&str> {
            METHODS
                .iter()
                .filter(|m| m.is_request() && kinds.contains(&m.kind))
                .map(|m| m.name)
                .collect()
        };
        assert_eq!(REQUESTS, of(EVERY_KIND));
        assert_eq!(CORE, of(&[Kind::Lifecycle, Kind::Broker]));
        assert_eq!(DAEMON, of(&[Kind::Daemon]));
        assert_eq!(ROUTED, of(&[Kind::Routed]));
        assert_eq!(CORE.len() + DAEMON.len() + ROUTED.len(), REQUESTS.len());
        assert_eq!(features::PROVIDER_METHODS, ROUTED);
        let notifications: Vec<&str> = METHODS
            .iter()
            .filter(|m| !m.is_request())
            .map(|m| m.name)
            .collect();
        assert_eq!(notifications, ["initialized", "exit", "$/cancelRequest"]);
    }

    /// The lists the catalogue replaced (issue 47), as they were: the derived ones are the
    /// same methods (the provider methods in the same order).
    #[test]
    fn derived_lists_equal_the_lists_they_replaced() {
        const OLD_CORE: &[&str] = &[
            "initialize",
            "shutdown",
            "broker/ping",
            "broker/status",
            "broker/shutdown",
            "sandbox/subscribe",
            "sandbox/unsubscribe",
            "sandbox/log",
            "provider/list",
            "provider/info",
        ];
        const OLD_DAEMON: &[&str] = &[
            "provider/install",
            "provider/uninstall",
            "provider/update",
            "provider/doctor",
            "provider/configure",
            "provider/setDefault",
            "provider/test",
            // Added since (issue 44): the secret store for egress headers.
            "secrets/set",
            "secrets/list",
            "secrets/remove",
        ];
        let sorted = |l: &[&'static str]| {
            let mut l = l.to_vec();
            l.sort_unstable();
            l
        };
        assert_eq!(sorted(CORE), sorted(OLD_CORE));
        assert_eq!(DAEMON, OLD_DAEMON);
        // The old `features::for_method`, method by method.
        let old_feature = |m: &str, pty: bool| -> Option<&str> {
            Some(match m {
                "sandbox/create"
                | "sandbox/info"
                | "sandbox/list"
                | "sandbox/kill"
                | "sandbox/capabilities"
                | "sandbox/systemInfo" => "sandbox.lifecycle",
                "sandbox/setTimeout" => "sandbox.timeout",
                "sandbox/pause" | "sandbox/resume" => "sandbox.pause",
                "sandbox/connect" => "sessions",
                "sandbox/diff" | "sandbox/apply" | "sandbox/discard" => "storage.mount",
                "sandbox/setNetwork" => "network.vpc",
                "exec/run" => "exec.run",
                "exec/start" if pty => "pty",
                "exec/start" | "exec/write" | "exec/kill" | "exec/attach" => "exec.stream",
                "exec/resize" => "pty",
                "process/list" | "process/kill" => "process.manage",
                "files/read" | "files/write" | "files/list" | "files/stat" | "files/mkdir"
                | "files/remove" | "files/rename" | "files/upload" | "files/download" => "files.rw",
                "files/watch" | "files/unwatch" => "files.watch",
                "ports/url" => "ports.url",
                "code/run"
                | "code/createContext"
                | "code/listContexts"
                | "code/restartContext"
                | "code/removeContext" => "code.interpret",
                "commands/run" | "templates/list" | "templates/init" | "templates/pull"
                | "templates/remove" | "templates/import" => "templates.read",
                "templates/build" => "templates.build",
                _ => return None,
            })
        };
        for m in METHODS {
            for pty in [false, true] {
                assert_eq!(
                    features::for_method(m.name, pty),
                    old_feature(m.name, pty),
                    "{} pty {pty}",
                    m.name
                );
            }
        }
        assert_eq!(ROUTED.len(), 46);
        assert_eq!(features::for_method("no/such", false), None);
    }

    /// Every notification a method names is in the notification table, and every one there
    /// is caused by some method.
    #[test]
    fn notifications_named_by_methods_are_described() {
        for m in METHODS {
            for n in m.notifications {
                assert!(
                    notification(n).is_some(),
                    "{}: {n} is not described",
                    m.name
                );
            }
        }
        for n in NOTIFICATIONS {
            assert!(
                METHODS.iter().any(|m| m.notifications.contains(&n.name)),
                "{}: no method causes it",
                n.name
            );
            assert!(
                n.params_type().starts_with("abx_protocol::api::"),
                "{}",
                n.name
            );
        }
    }

    /// Every method's params type can be probed for its members (the broker's check), and a
    /// closed method's type has a fixed set of them; every type is one of [`crate::api`].
    #[test]
    fn every_params_type_probes_and_every_result_is_an_api_type() {
        for m in METHODS {
            let p = &m.params;
            assert!(
                p.type_name().starts_with("abx_protocol::api::"),
                "{}: {}",
                m.name,
                p.type_name()
            );
            assert!(
                p.open || p.has_fixed_fields(),
                "{}: closed, but {} reads any member",
                m.name,
                p.type_name()
            );
            if p.type_name().ends_with("::NoParams") {
                assert!(p.fields().is_empty(), "{}", m.name);
            } else if p.has_fixed_fields() {
                assert!(
                    !p.fields().is_empty(),
                    "{}: the probe found no member",
                    m.name
                );
            }
            if let Some(r) = &m.result {
                match r.type_name() {
                    Some(t) => {
                        assert!(t.starts_with("abx_protocol::api::"), "{}: {t}", m.name);
                        assert!(t.ends_with(&format!("::{}", r.name)), "{}: {t}", m.name);
                    }
                    None => assert_eq!((m.name, r.name), ("shutdown", "null")),
                }
            }
        }
    }

    #[test]
    fn initialize_lists_the_requests_a_broker_serves() {
        assert_eq!(listed(DAEMON), REQUESTS);
        let bare = listed(&[]);
        assert_eq!(bare.len(), CORE.len() + ROUTED.len());
        assert!(bare.iter().all(|m| !DAEMON.contains(m)));
        let extra = listed(&["test/echo", "provider/test"]);
        assert_eq!(extra.last(), Some(&"test/echo"));
        assert!(extra.contains(&"provider/test") && !extra.contains(&"provider/install"));
    }

    #[test]
    fn errors_add_the_common_ones_by_kind() {
        let ping = method("broker/ping").unwrap().errors();
        assert_eq!(ping.len(), EVERY_REQUEST_ERRORS.len());
        let read = method("files/read").unwrap().errors();
        assert!(read.contains(&ErrorCode::FeatureNotSupported));
        assert!(read.contains(&ErrorCode::FileNotFound));
        assert!(read.windows(2).all(|w| w[0].number() < w[1].number()));
        assert!(method("exit").unwrap().errors().is_empty());
    }
}
