//! The OpenRPC description of the broker API (`docs/openrpc.json`), generated from the
//! types of [`crate::api`] and the E-codes of [`crate::error`].
//!
//! [`document`] lists every method the broker answers (docs/broker-api.md; the broker's own
//! methods and [`crate::features::PROVIDER_METHODS`]) with its by-name params, its result,
//! its errors (references into `components/errors`, one per E-code) and, for provider
//! methods, the feature that gates it (`x-feature`). Notifications a client sends are
//! methods without a result; notifications the broker sends are listed under
//! `x-notifications`, and each method names those it may cause.
//!
//! A test (protocol/tests/openrpc.rs) fails when the checked-in document differs from this
//! one; regenerate with `ABX_UPDATE_OPENRPC=1 cargo test -p abx-protocol --features schema --test openrpc`.

use crate::api::*;
use crate::error::ErrorCode;
use crate::features;
use schemars::generate::{SchemaGenerator, SchemaSettings};
use schemars::JsonSchema;
use serde_json::{json, Map, Value};

type SchemaFn = fn(&mut SchemaGenerator) -> Value;

fn s<T: JsonSchema>(g: &mut SchemaGenerator) -> Value {
    let mut schema = g.subschema_for::<T>();
    for t in g.transforms_mut() {
        t.transform(&mut schema);
    }
    schema.to_value()
}

fn null(_: &mut SchemaGenerator) -> Value {
    json!({"type": "null"})
}

/// One method of the catalogue.
struct Method {
    name: &'static str,
    tag: &'static str,
    summary: &'static str,
    params: SchemaFn,
    /// The Rust type of the params (`std::any::type_name`).
    params_type: &'static str,
    /// `None`: a notification the client sends (no reply).
    result: Option<(&'static str, SchemaFn)>,
    /// The Rust type of the result (`None` for notifications and `shutdown`'s `null`).
    result_type: Option<&'static str>,
    errors: &'static [ErrorCode],
    /// Notifications the broker sends because of this call.
    notifications: &'static [&'static str],
}

use ErrorCode as E;

/// Errors any request may get.
const EVERY_REQUEST: &[ErrorCode] = &[
    E::InvalidParams,
    E::RequestCancelled,
    E::ShuttingDown,
    E::Internal,
];

/// Errors of routing a provider method (DESIGN §5) and of plugin providers.
const ROUTED: &[ErrorCode] = &[
    E::ProviderNotInstalled,
    E::FeatureNotSupported,
    E::HandshakeFailed,
    E::ProtocolMismatch,
    E::ConfigInvalid,
    E::PluginCrashed,
    E::PluginTimedOut,
    E::BadPluginReply,
];

macro_rules! m {
    ($name:literal, $tag:literal, $summary:literal, $params:ty => $rname:literal: $result:ty,
     [$($err:ident),*] $(, notes [$($n:literal),*])?) => {
        Method {
            name: $name,
            tag: $tag,
            summary: $summary,
            params: s::<$params>,
            params_type: std::any::type_name::<$params>(),
            result: Some(($rname, s::<$result>)),
            result_type: Some(std::any::type_name::<$result>()),
            errors: &[$(E::$err),*],
            notifications: &[$($($n),*)?],
        }
    };
}

fn catalogue() -> Vec<Method> {
    let v = vec![
        m!("initialize", "lifecycle",
            "Optional handshake: who is connecting; what the broker offers.",
            InitializeParams => "InitializeResult": InitializeResult, []),
        Method {
            name: "initialized",
            tag: "lifecycle",
            summary: "Notification after initialize (ignored).",
            params: s::<NoParams>,
            params_type: std::any::type_name::<NoParams>(),
            result: None,
            result_type: None,
            errors: &[],
            notifications: &[],
        },
        Method {
            name: "shutdown",
            tag: "lifecycle",
            summary: "This connection accepts no more requests (later ones get E1010).",
            params: s::<NoParams>,
            params_type: std::any::type_name::<NoParams>(),
            result: Some(("null", null)),
            result_type: None,
            errors: &[],
            notifications: &[],
        },
        Method {
            name: "exit",
            tag: "lifecycle",
            summary: "Notification: close this connection (ends `abx broker --stdio`).",
            params: s::<NoParams>,
            params_type: std::any::type_name::<NoParams>(),
            result: None,
            result_type: None,
            errors: &[],
            notifications: &[],
        },
        Method {
            name: "$/cancelRequest",
            tag: "lifecycle",
            summary: "Notification: cancel an in-flight request; it answers E1006 (-32800). A running exec/run is killed.",
            params: s::<CancelParams>,
            params_type: std::any::type_name::<CancelParams>(),
            result: None,
            result_type: None,
            errors: &[],
            notifications: &[],
        },
        m!("broker/ping", "broker", "Liveness.", NoParams => "Empty": Empty, []),
        m!("broker/status", "broker",
            "The daemon: version, pid, uptime, connections, requests in flight, paths, providers, sandboxes.",
            NoParams => "BrokerStatus": BrokerStatus, []),
        m!("broker/shutdown", "broker",
            "Stop the daemon after answering; with ifIdle it refuses (E1013) while others use it.",
            BrokerShutdownParams => "Empty": Empty, [Busy]),
        m!("provider/list", "providers", "Every installed provider.",
            NoParams => "ProviderList": ProviderList, []),
        m!("provider/info", "providers",
            "One provider: summary, description, config keys, source, digest, runtime, security.",
            ProviderIdParams => "ProviderInfo": ProviderInfo, [ProviderNotInstalled]),
        m!("provider/install", "providers",
            "Install a provider plugin from a directory, git URL or archive URL (dryRun: the plan only).",
            ProviderInstallParams => "InstallPlan": InstallPlan,
            [SourceUnreachable, Refused, DigestMismatch, InvalidManifest, AlreadyInstalled, EnforcementUnavailable]),
        m!("provider/uninstall", "providers", "Remove an installed plugin (needs confirm).",
            ProviderUninstallParams => "Empty": Empty, [ProviderNotInstalled, Refused]),
        m!("provider/update", "providers",
            "Re-resolve each plugin's source; update (or with check, only report).",
            ProviderUpdateParams => "UpdateResult": UpdateResult,
            [ProviderNotInstalled, SourceUnreachable, InvalidManifest, IntegrityFailed]),
        m!("provider/doctor", "providers",
            "Check a provider: installed, integrity, config, handshake, permissions.",
            ProviderIdParams => "DoctorResult": DoctorResult, [ProviderNotInstalled]),
        m!("provider/configure", "providers",
            "Store config values of a plugin (secrets in a 0600 file); null removes a value.",
            ProviderConfigureParams => "ConfigureResult": ConfigureResult,
            [ProviderNotInstalled, ConfigInvalid]),
        m!("provider/setDefault", "providers", "Make a provider the default.",
            ProviderIdParams => "Empty": Empty, [ProviderNotInstalled]),
        m!("provider/test", "providers", "Run the provider contract kit against a provider.",
            ProviderTestParams => "TestResult": TestResult, [ProviderNotInstalled],
            notes ["provider/testResult"]),
        // Provider methods (routed, gated by feature).
        m!("sandbox/create", "sandboxes", "Create a sandbox.",
            SandboxCreateParams => "Sandbox": Sandbox,
            [SandboxCreateFailed, InvalidTimeout, TemplateNotFound, SourceUnreachable, DigestMismatch]),
        m!("sandbox/info", "sandboxes", "Show a sandbox.",
            SandboxParams => "Sandbox": Sandbox, [SandboxNotFound]),
        m!("sandbox/connect", "sandboxes",
            "Reattach to a sandbox by id without touching its lifetime.",
            SandboxParams => "Sandbox": Sandbox, [SandboxNotFound]),
        m!("sandbox/list", "sandboxes",
            "List sandboxes (every provider's, unless provider is given). Across providers, a provider that fails is reported in errors and the others are listed anyway.",
            SandboxListParams => "SandboxList": SandboxList, []),
        m!("sandbox/kill", "sandboxes",
            "Kill a sandbox and everything in it; idempotent (killed: false when gone).",
            SandboxParams => "KillResult": KillResult, []),
        m!("sandbox/subscribe", "sandboxes",
            "This connection receives sandbox/changed for every sandbox of every provider from now on (idempotent; not gated on a feature).",
            NoParams => "Empty": Empty, [],
            notes ["sandbox/changed"]),
        m!("sandbox/unsubscribe", "sandboxes",
            "This connection receives no more sandbox/changed (idempotent): nothing is sent after the reply.",
            NoParams => "Empty": Empty, []),
        m!("sandbox/setTimeout", "sandboxes", "The sandbox's lifetime ends timeout seconds from now.",
            SetTimeoutParams => "Sandbox": Sandbox, [SandboxNotFound, InvalidTimeout]),
        m!("sandbox/pause", "sandboxes", "Stop every process of the sandbox.",
            SandboxParams => "Sandbox": Sandbox, [SandboxNotFound]),
        m!("sandbox/resume", "sandboxes", "Continue every process of a paused sandbox.",
            SandboxParams => "Sandbox": Sandbox, [SandboxNotFound]),
        m!("sandbox/capabilities", "sandboxes",
            "What the sandbox can do, derived from its provider's declared features.",
            SandboxParams => "Capabilities": Capabilities, [SandboxNotFound]),
        m!("sandbox/systemInfo", "sandboxes", "OS, architecture, CPUs, memory, disk, isolation.",
            SandboxParams => "SystemInfo": SystemInfo, [SandboxNotFound]),
        m!("exec/run", "exec",
            "Run a command to completion and return its output (cancel: killed, E1006). maxOutput above 16 MiB is E1004: stream with exec/start instead.",
            ExecRunParams => "ExecResult": ExecResult,
            [SandboxNotFound, SandboxNotRunning, ExecFailedToStart, InvalidData]),
        m!("exec/start", "exec",
            "Start a command and stream it: the reply first, then exec/output in read order and exactly one exec/exit.",
            ExecStartParams => "ExecStarted": ExecStarted,
            [SandboxNotFound, SandboxNotRunning, ExecFailedToStart, InvalidData],
            notes ["exec/output", "exec/exit"]),
        m!("exec/write", "exec", "Write to the stdin of an exec; eof closes it.",
            ExecWriteParams => "Empty": Empty,
            [ExecNotFound, ExecNotOwned, ExecStdinClosed, InvalidData]),
        m!("exec/resize", "exec", "Resize the terminal of a pty exec.",
            ExecResizeParams => "Empty": Empty, [ExecNotFound, ExecNotOwned]),
        m!("exec/kill", "exec", "Signal the whole process tree of an exec (default KILL).",
            ExecKillParams => "Empty": Empty, [ExecNotFound, ExecNotOwned]),
        m!("exec/attach", "exec",
            "Receive an exec's stream on this connection from now on, starting with what was buffered.",
            ExecIdParams => "AttachResult": AttachResult, [ExecNotFound],
            notes ["exec/output", "exec/exit"]),
        m!("process/list", "processes", "The processes of a sandbox.",
            SandboxParams => "ProcessList": ProcessList, [SandboxNotFound]),
        m!("process/kill", "processes", "Signal a process of a sandbox (default KILL).",
            ProcessKillParams => "Empty": Empty, [SandboxNotFound, ProcessNotFound]),
        m!("files/read", "files", "Read a chunk of a file (at most 4 MiB; a larger length is E1004: read in chunks).",
            FilesReadParams => "FileChunk": FileChunk,
            [SandboxNotFound, FileNotFound, PathOutsideSandbox, FilePermissionDenied, IsADirectory, InvalidData, PathTooLong]),
        m!("files/write", "files",
            "Write a file: replaced atomically, or at an offset, or appended.",
            FilesWriteParams => "SizeResult": SizeResult,
            [SandboxNotFound, FileNotFound, PathOutsideSandbox, FilePermissionDenied, IsADirectory, InvalidData, MessageTooLarge, PathTooLong, OffsetOutOfRange, DiskFull, QuotaExceeded]),
        m!("files/list", "files", "List a directory (recursive: everything below).",
            FilesListParams => "FileList": FileList,
            [SandboxNotFound, FileNotFound, PathOutsideSandbox, FilePermissionDenied, NotADirectory]),
        m!("files/stat", "files", "One file's status.",
            PathParams => "FileEntry": FileEntry,
            [SandboxNotFound, FileNotFound, PathOutsideSandbox, FilePermissionDenied]),
        m!("files/mkdir", "files", "Create a directory (parents: with missing parents).",
            MkdirParams => "Empty": Empty,
            [SandboxNotFound, FileNotFound, PathOutsideSandbox, FilePermissionDenied, FileExists, NotADirectory]),
        m!("files/remove", "files", "Remove a file or directory.",
            RemoveParams => "Empty": Empty,
            [SandboxNotFound, FileNotFound, PathOutsideSandbox, FilePermissionDenied, DirectoryNotEmpty]),
        m!("files/rename", "files", "Rename or move within the sandbox.",
            RenameParams => "Empty": Empty,
            [SandboxNotFound, FileNotFound, PathOutsideSandbox, FilePermissionDenied, FileExists]),
        m!("files/upload", "files",
            "Copy a local file of the broker's machine into the sandbox, with progress.",
            TransferParams => "TransferResult": TransferResult,
            [SandboxNotFound, FileNotFound, PathOutsideSandbox, FilePermissionDenied, IsADirectory, LocalFileError],
            notes ["files/progress"]),
        m!("files/download", "files",
            "Copy a file of the sandbox to the broker's machine, with progress.",
            TransferParams => "TransferResult": TransferResult,
            [SandboxNotFound, FileNotFound, PathOutsideSandbox, FilePermissionDenied, IsADirectory, LocalFileError],
            notes ["files/progress"]),
        m!("files/watch", "files", "Watch a path; changes come as files/changed.",
            WatchParams => "WatchStarted": WatchStarted,
            [SandboxNotFound, FileNotFound, PathOutsideSandbox, FilePermissionDenied],
            notes ["files/changed"]),
        m!("files/unwatch", "files", "Stop a watch.", UnwatchParams => "Empty": Empty, []),
        m!("ports/url", "ports",
            "Where a port of the sandbox is reached, and the headers to send.",
            PortParams => "PortUrl": PortUrl, [SandboxNotFound, PortNotReachable, InvalidPort]),
        m!("code/run", "code",
            "Run a cell in a context (a long-lived interpreter of the sandbox): variables, imports and the working directory persist; output streams as code/output.",
            CodeRunParams => "CodeResult": CodeResult,
            [SandboxNotFound, SandboxNotRunning, InvalidTimeout, ExecFailedToStart],
            notes ["code/output"]),
        m!("code/createContext", "code", "Create a context (an interpreter of a language; it starts on its first run).",
            CodeCreateContextParams => "CodeContext": CodeContext, [SandboxNotFound, SandboxNotRunning]),
        m!("code/listContexts", "code", "The sandbox's contexts.",
            SandboxParams => "CodeContexts": CodeContexts, [SandboxNotFound]),
        m!("code/restartContext", "code", "Restart a context's interpreter (its state is lost).",
            CodeContextParams => "CodeContext": CodeContext, [SandboxNotFound]),
        m!("code/removeContext", "code", "Remove a context and end its interpreter.",
            CodeContextParams => "Empty": Empty, [SandboxNotFound]),
        m!("commands/run", "templates", "Run a named command of the sandbox's template.",
            CommandRunParams => "ExecResult": ExecResult, [SandboxNotFound, SandboxNotRunning]),
        m!("templates/list", "templates", "The provider's templates (local: base and the stored OCI images).",
            TemplatesParams => "TemplateList": TemplateList, []),
        m!("templates/init", "templates", "Start a template (provider-defined).",
            TemplatesParams => "ProviderDefined": ProviderDefined, []),
        m!("templates/build", "templates", "Save a sandbox's filesystem changes as a new template (local: a new layer on its base image).",
            TemplatesBuildParams => "TemplateInfo": TemplateInfo, [TemplateNotFound, SandboxNotFound, Refused]),
        m!("templates/pull", "templates", "Pull an image from its registry (progress as templates/progress).",
            TemplatesPullParams => "TemplateInfo": TemplateInfo, [TemplateNotFound, SourceUnreachable, DigestMismatch, Refused],
            notes ["templates/progress"]),
        m!("templates/remove", "templates", "Remove a template, or prune the unused ones.",
            TemplatesRemoveParams => "TemplatesRemoved": TemplatesRemoved, [TemplateNotFound]),
        m!("templates/import", "templates", "Import a docker save archive or an OCI image layout directory.",
            TemplatesImportParams => "TemplateInfo": TemplateInfo, [LocalFileError, DigestMismatch, Refused]),
    ];
    v
}

/// Notifications the broker sends: name, description, params type.
fn notifications() -> Vec<(&'static str, &'static str, SchemaFn)> {
    vec![
        (
            "exec/output",
            "A chunk of an exec's output, in read order (only to the connection that owns the stream).",
            s::<ExecOutput>,
        ),
        (
            "exec/exit",
            "An exec ended: exactly one per exec, after its last output.",
            s::<ExecExit>,
        ),
        (
            "code/output",
            "One event of a running code/run cell, in order: stdout, stderr, result, error, or restarted (only to the calling connection).",
            s::<CodeOutput>,
        ),
        (
            "files/progress",
            "Progress of files/upload or files/download.",
            s::<FilesProgress>,
        ),
        (
            "templates/progress",
            "Progress of templates/pull.",
            s::<TemplatesProgress>,
        ),
        (
            "files/changed",
            "A change under a watched path.",
            s::<FilesChanged>,
        ),
        (
            "sandbox/changed",
            "A sandbox of some provider was created, killed, paused, resumed, expired or given a new timeout, by any client or by no one (only to connections that called sandbox/subscribe; a subscriber that stops reading loses the oldest, see docs/broker-api.md).",
            s::<SandboxChanged>,
        ),
        (
            "provider/testResult",
            "One contract-kit test finished (during provider/test, to the caller, in completion order).",
            s::<TestResultNote>,
        ),
    ]
}

/// The methods the document describes, in order (requests and client notifications).
pub fn method_names() -> Vec<&'static str> {
    catalogue().iter().map(|m| m.name).collect()
}

/// Each method the document describes with the Rust types its params and result are
/// generated from (`std::any::type_name`; no result type for notifications and `shutdown`).
pub fn method_types() -> Vec<(&'static str, &'static str, Option<&'static str>)> {
    catalogue()
        .iter()
        .map(|m| (m.name, m.params_type, m.result_type))
        .collect()
}

/// Turn an inline object schema into by-name content descriptors.
fn params_of(schema: &Value) -> Vec<Value> {
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let Some(props) = schema["properties"].as_object() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (name, prop) in props {
        let mut prop = prop.clone();
        let description = prop
            .as_object_mut()
            .and_then(|o| o.remove("description"))
            .unwrap_or(Value::Null);
        let mut cd = json!({
            "name": name,
            "required": required.contains(&name.as_str()),
            "schema": prop,
        });
        if !description.is_null() {
            cd["description"] = description;
        }
        out.push(cd);
    }
    // Required params first, each group in name order.
    out.sort_by_key(|cd| (cd["required"] == json!(false), cd["name"].to_string()));
    out
}

fn error_ref(c: ErrorCode) -> Value {
    json!({"$ref": format!("#/components/errors/{}", c.abx())})
}

fn error_object(c: ErrorCode) -> Value {
    json!({
        "code": c.rpc_code(),
        "message": c.template(),
        "data": {"abx": c.abx(), "suggestion": c.suggestion(), "exitCode": c.exit_code()},
    })
}

/// The OpenRPC 1.3 document of the broker API.
pub fn document() -> Value {
    let mut g = SchemaSettings::draft07()
        .with(|s| s.definitions_path = "/components/schemas".into())
        .into_generator();
    let mut methods = Vec::new();
    for m in catalogue() {
        let params_schema = (m.params)(&mut g);
        let mut o = Map::new();
        o.insert("name".into(), json!(m.name));
        o.insert("summary".into(), json!(m.summary));
        o.insert("tags".into(), json!([{"name": m.tag}]));
        o.insert("paramStructure".into(), json!("by-name"));
        o.insert("params".into(), Value::Array(params_of(&params_schema)));
        if let Some((rname, rfn)) = m.result {
            o.insert(
                "result".into(),
                json!({"name": rname, "schema": rfn(&mut g)}),
            );
            let provider = features::PROVIDER_METHODS.contains(&m.name);
            let mut codes: Vec<ErrorCode> = m.errors.to_vec();
            codes.extend_from_slice(EVERY_REQUEST);
            if provider {
                codes.extend_from_slice(ROUTED);
            }
            codes.sort_by_key(|c| c.number());
            codes.dedup();
            o.insert(
                "errors".into(),
                Value::Array(codes.into_iter().map(error_ref).collect()),
            );
            if provider {
                let f = features::for_method(m.name, false).unwrap_or_default();
                o.insert("x-feature".into(), json!(f));
                if m.name == "exec/start" {
                    o.insert(
                        "description".into(),
                        json!("With `pty` it also needs the `pty` feature."),
                    );
                }
            }
        }
        if !m.notifications.is_empty() {
            o.insert("x-notifications".into(), json!(m.notifications));
        }
        methods.push(Value::Object(o));
    }
    let notes: Vec<Value> = notifications()
        .into_iter()
        .map(|(name, description, p)| {
            let schema = p(&mut g);
            json!({"name": name, "description": description, "params": schema})
        })
        .collect();
    let mut errors = Map::new();
    for c in ErrorCode::ALL {
        errors.insert(c.abx(), error_object(*c));
    }
    let schemas = Value::Object(g.take_definitions(true));
    json!({
        "openrpc": "1.3.2",
        "info": {
            "title": "abx broker API",
            "version": crate::PROTOCOL_VERSION,
            "description": "JSON-RPC 2.0 API of the abx broker, the per-user daemon that drives code sandboxes. \
                Transports: the per-user socket ($XDG_RUNTIME_DIR/abx/broker.sock, or $ABX_HOME/run/broker.sock), \
                `abx broker --stdio` and `abx rpc`; newline-delimited JSON or Content-Length framing, detected per connection. \
                Requests are served concurrently. Errors carry `data.abx` (the E-code) and `data.suggestion`; \
                `error.code` is the JSON-RPC code for wire errors (E1001 -32700, E1002/E1005/E1010 -32600, E1003 -32601, \
                E1004 -32602, E1006 -32800) and the E-number otherwise. Provider methods take `sandbox` (`id` or \
                `provider:id`) or `provider` and are gated by the feature in `x-feature` (E8004). \
                See docs/broker-api.md.",
            "license": {"name": "Apache-2.0"},
        },
        "servers": [{
            "name": "abx broker",
            "url": "unix:$XDG_RUNTIME_DIR/abx/broker.sock",
            "summary": "The per-user socket (or $ABX_HOME/run/broker.sock); also `abx broker --stdio`.",
        }],
        "methods": methods,
        "components": {
            "schemas": schemas,
            "errors": errors,
        },
        "x-notifications": notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_provider_method_is_described_once() {
        let names = method_names();
        for m in features::PROVIDER_METHODS {
            assert_eq!(names.iter().filter(|n| *n == m).count(), 1, "{m}");
        }
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len(), "duplicate methods");
    }

    /// Every provider method's params and result are types of [`crate::api`] (the ones the
    /// broker and the providers deserialize into), not free-form JSON.
    #[test]
    fn every_provider_method_has_api_params_and_result_types() {
        let types = method_types();
        for m in features::PROVIDER_METHODS {
            let (_, params, result) = types.iter().find(|t| t.0 == *m).expect(m);
            assert!(params.starts_with("abx_protocol::api::"), "{m}: {params}");
            let result = result.unwrap_or_else(|| panic!("{m}: no result type"));
            assert!(result.starts_with("abx_protocol::api::"), "{m}: {result}");
        }
        // Only methods that take nothing have no params type of their own.
        for (m, params, _) in &types {
            if params.ends_with("::NoParams") {
                assert!(
                    !features::PROVIDER_METHODS.contains(m)
                        || matches!(*m, "sandbox/subscribe" | "sandbox/unsubscribe"),
                    "{m} takes params but is described without"
                );
            }
        }
    }
}
