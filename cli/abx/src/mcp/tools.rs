//! The tools of `abx mcp`: definitions (JSON Schema inputs, output schemas) and their
//! implementations over the broker API.
//!
//! A tool's arguments are a small struct here that derives `JsonSchema` (its input schema is
//! generated from it by [`input_schema`]) and converts into the params type of the broker
//! method it calls (`abx_protocol::api`): what the tool fixes (`exec`'s empty stdin) is set
//! in the conversion, and so is what it names differently for agents (`files_write`'s
//! `content` is `data`).
//!
//! Every tool takes its sandbox id as an explicit argument. A failure is a result with
//! `isError: true` whose text is the broker's E-code line and suggestion
//! (`[E2009] Sandbox 'x' not found.` ...), so the model sees it and can correct itself.

use super::{Era, Out};
use abx_client::client::CallError;
use abx_client::mux::Mux;
use abx_protocol::api::{self, to_params};
use abx_protocol::{AbxError, ErrorCode};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use tokio_util::sync::CancellationToken;

/// What a tool call gets.
pub struct Cx<'a> {
    /// The daemon.
    pub mux: &'a Mux,
    /// stdout, for progress notifications.
    pub out: &'a Out,
    /// `_meta.progressToken` of the request, when the client wants progress.
    pub progress: Option<Value>,
    /// Fired by `notifications/cancelled` (or when the client goes away).
    pub cancel: CancellationToken,
    /// The revision the call is served under.
    pub era: Era,
}

struct Def {
    name: &'static str,
    title: &'static str,
    description: &'static str,
    input: fn() -> Value,
    output: Option<fn() -> Value>,
    read_only: bool,
    destructive: bool,
    idempotent: bool,
}

const TOOLS: &[Def] = &[
    Def {
        name: "sandbox_create",
        title: "Create a sandbox",
        description: "Create a sandbox and return it (its `id` is the `sandbox` argument of every \
            other tool). It lives `timeout` seconds (default 300) unless extended with \
            sandbox_set_timeout; kill it with sandbox_kill when done.",
        input: input_schema::<CreateArgs>,
        output: Some(sandbox_schema),
        read_only: false,
        destructive: false,
        idempotent: false,
    },
    Def {
        name: "sandbox_list",
        title: "List sandboxes",
        description: "List the running sandboxes (of one provider, or of all). A provider that fails is named in errors; the others are listed anyway.",
        input: input_schema::<ProviderArg>,
        output: Some(|| {
            object(
                json!({
                    "sandboxes": {"type": "array", "items": sandbox_schema()},
                    "errors": {
                        "type": "array",
                        "description": "Providers that could not list their sandboxes (the others are listed anyway).",
                        "items": object(
                            json!({
                                "provider": {"type": "string"},
                                "code": {"type": "string"},
                                "message": {"type": "string"},
                                "suggestion": {"type": "string"},
                            }),
                            &["provider", "code", "message"],
                        ),
                    },
                }),
                &["sandboxes"],
            )
        }),
        read_only: true,
        destructive: false,
        idempotent: true,
    },
    Def {
        name: "sandbox_info",
        title: "Show a sandbox",
        description: "Show one sandbox: status, template, when it started and when it expires.",
        input: input_schema::<SandboxArg>,
        output: Some(sandbox_schema),
        read_only: true,
        destructive: false,
        idempotent: true,
    },
    Def {
        name: "sandbox_kill",
        title: "Kill a sandbox",
        description: "Kill a sandbox: every process stops and its files are deleted. Idempotent \
            (`killed` is false when it was already gone).",
        input: input_schema::<SandboxArg>,
        output: Some(|| object(json!({"killed": {"type": "boolean"}}), &["killed"])),
        read_only: false,
        destructive: true,
        idempotent: true,
    },
    Def {
        name: "sandbox_set_timeout",
        title: "Set a sandbox's lifetime",
        description: "Set the remaining lifetime of a sandbox: it ends `timeout` seconds from now.",
        input: input_schema::<TimeoutArgs>,
        output: Some(sandbox_schema),
        read_only: false,
        destructive: false,
        idempotent: true,
    },
    Def {
        name: "exec",
        title: "Run a command",
        description: "Run a shell command (sh -c) in a sandbox and return its exit code, stdout \
            and stderr. Output is streamed as progress notifications when the client asks for \
            progress. Stdin is empty. Cancelling the call kills the command.",
        input: input_schema::<ExecArgs>,
        output: Some(|| {
            object(
                json!({
                    "exitCode": {"type": ["integer", "null"], "description": "The exit status (128+N when killed by signal N)."},
                    "stdout": {"type": "string"},
                    "stderr": {"type": "string"},
                    "timedOut": {"type": "boolean"},
                    "signal": {"type": "string", "description": "The signal that ended it, if one did."},
                    "truncated": {"type": "boolean", "description": "Output was longer than kept here (the middle is left out)."},
                }),
                &["exitCode", "stdout", "stderr", "timedOut"],
            )
        }),
        read_only: false,
        destructive: true,
        idempotent: false,
    },
    Def {
        name: "run_code",
        title: "Run code",
        description: "Run code in a sandbox's interpreter (python by default; javascript, \
            bash) and return its output, the value of the last expression and anything \
            displayed: charts come back as images, tables as HTML. Variables, imports and the \
            working directory persist between calls in the same context (one default context \
            per language per sandbox). An exception in the code is an error result with its \
            traceback. Cancelling the call, or its timeout, interrupts the code and keeps \
            the context.",
        input: input_schema::<RunCodeArgs>,
        output: Some(|| {
            object(
                json!({
                    "results": {"type": "array", "description": "Rich results (MIME type -> data; images base64).", "items": {"type": "object"}},
                    "stdout": {"type": "string"},
                    "stderr": {"type": "string"},
                    "error": {
                        "type": ["object", "null"],
                        "properties": {
                            "name": {"type": "string"},
                            "value": {"type": "string"},
                            "traceback": {"type": "string"},
                        },
                    },
                    "executionCount": {"type": "integer"},
                    "context": {"type": "string"},
                    "timedOut": {"type": "boolean"},
                }),
                &["results", "stdout", "stderr", "error"],
            )
        }),
        read_only: false,
        destructive: true,
        idempotent: false,
    },
    Def {
        name: "files_read",
        title: "Read a file",
        description:
            "Read a file of a sandbox (up to 4 MiB). Text comes back as is; a file that is \
            not UTF-8 comes back base64-encoded (`encoding: base64`).",
        input: input_schema::<PathArgs>,
        output: Some(|| {
            object(
                json!({
                    "path": {"type": "string"},
                    "content": {"type": "string"},
                    "encoding": {"type": "string", "enum": ["utf-8", "base64"]},
                    "size": {"type": "integer", "description": "Size of the whole file in bytes."},
                    "truncated": {"type": "boolean", "description": "Only the first 4 MiB were read."},
                }),
                &["path", "content", "encoding", "size", "truncated"],
            )
        }),
        read_only: true,
        destructive: false,
        idempotent: true,
    },
    Def {
        name: "files_write",
        title: "Write a file",
        description: "Write a text file in a sandbox, replacing it whole (atomically); missing \
            parent directories are created.",
        input: input_schema::<WriteArgs>,
        output: Some(|| {
            object(
                json!({"path": {"type": "string"}, "size": {"type": "integer"}}),
                &["path", "size"],
            )
        }),
        read_only: false,
        destructive: true,
        idempotent: true,
    },
    Def {
        name: "files_list",
        title: "List a directory",
        description: "List a directory of a sandbox: name, type, size, mode and modification time \
            of each entry.",
        input: input_schema::<ListArgs>,
        output: Some(|| {
            object(
                json!({"entries": {"type": "array", "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "path": {"type": "string"},
                        "type": {"type": "string", "description": "file, directory, symlink or other"},
                        "size": {"type": "integer"},
                        "mode": {"type": "string"},
                        "modifiedAt": {"type": "string"},
                    },
                    "required": ["name", "path", "type"],
                }}}),
                &["entries"],
            )
        }),
        read_only: true,
        destructive: false,
        idempotent: true,
    },
    Def {
        name: "ports_url",
        title: "URL of a port",
        description:
            "The URL where a port of a sandbox is reached (start a server listening on it \
            first), and the headers a client must send.",
        input: input_schema::<PortArgs>,
        output: Some(|| {
            object(
                json!({
                    "url": {"type": "string"},
                    "headers": {"type": "object", "additionalProperties": {"type": "string"}},
                }),
                &["url"],
            )
        }),
        read_only: true,
        destructive: false,
        idempotent: true,
    },
    Def {
        name: "provider_list",
        title: "List providers",
        description:
            "List the sandbox providers of the broker, their features and which one is the \
            default.",
        input: input_schema::<NoArgs>,
        output: Some(|| {
            object(
                json!({"providers": {"type": "array", "items": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "string"},
                        "name": {"type": "string"},
                        "version": {"type": "string"},
                        "kind": {"type": "string"},
                        "trust": {"type": "string"},
                        "features": {"type": "array", "items": {"type": "string"}},
                        "default": {"type": "boolean"},
                    },
                    "required": ["id"],
                }}}),
                &["providers"],
            )
        }),
        read_only: true,
        destructive: false,
        idempotent: true,
    },
];

fn object(properties: Value, required: &[&str]) -> Value {
    let mut s = json!({"type": "object", "properties": properties, "additionalProperties": false});
    if !required.is_empty() {
        s["required"] = json!(required);
    }
    s
}

/// A tool's input schema, generated from its arguments type: inlined, an optional argument
/// is left out rather than `null` (its type is not nullable), without the root's `$schema`,
/// `title` and `description` (the tool has its own).
fn input_schema<T: JsonSchema>() -> Value {
    let mut g = schemars::generate::SchemaSettings::draft2020_12()
        .with(|s| s.inline_subschemas = true)
        .into_generator();
    let mut v = g.root_schema_for::<T>().to_value();
    if let Some(o) = v.as_object_mut() {
        for k in ["$schema", "title", "description"] {
            o.remove(k);
        }
        // Some clients want `properties` even when there are none.
        o.entry("properties").or_insert_with(|| json!({}));
        for prop in o
            .get_mut("properties")
            .and_then(Value::as_object_mut)
            .into_iter()
            .flat_map(|p| p.values_mut())
        {
            // `["string", "null"]` → `"string"`.
            if let Some(Value::Array(types)) = prop.get("type") {
                let rest: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
                prop["type"] = match <[Value; 1]>::try_from(rest) {
                    Ok([one]) => one,
                    Err(many) => Value::Array(many),
                };
            }
        }
    }
    v
}

fn sandbox_schema() -> Value {
    let mut s = object(
        json!({
            "id": {"type": "string"},
            "provider": {"type": "string"},
            "status": {"type": "string", "description": "running or paused"},
            "template": {"type": ["string", "null"]},
            "url": {"type": ["string", "null"]},
            "region": {"type": ["string", "null"]},
            "timeout": {"type": ["number", "null"], "description": "Lifetime in seconds."},
            "startedAt": {"type": ["string", "null"]},
            "expiresAt": {"type": ["string", "null"]},
            "metadata": {"type": ["object", "null"]},
        }),
        &["id"],
    );
    // Providers may add fields of their own.
    s.as_object_mut()
        .expect("object")
        .remove("additionalProperties");
    s
}

/// Whether a tool of this name exists.
pub fn exists(name: &str) -> bool {
    TOOLS.iter().any(|d| d.name == name)
}

/// The `tools` array of `tools/list`, shaped for the era.
pub fn list(era: Era) -> Vec<Value> {
    TOOLS
        .iter()
        .map(|d| {
            let mut t = json!({
                "name": d.name,
                "description": d.description,
                "inputSchema": (d.input)(),
            });
            if era.structured() {
                t["title"] = json!(d.title);
                if let Some(o) = d.output {
                    // Results may grow fields: an output schema never forbids extra ones.
                    let mut schema = o();
                    if let Some(obj) = schema.as_object_mut() {
                        obj.remove("additionalProperties");
                    }
                    t["outputSchema"] = schema;
                }
            }
            if era.annotations() {
                t["annotations"] = json!({
                    "title": d.title,
                    "readOnlyHint": d.read_only,
                    "destructiveHint": d.destructive,
                    "idempotentHint": d.idempotent,
                    "openWorldHint": false,
                });
            }
            t
        })
        .collect()
}

/// A successful result: `text` for the model, `structured` for programs.
fn ok(cx: &Cx<'_>, text: String, structured: Value) -> Value {
    let mut r = json!({"content": [{"type": "text", "text": text}], "isError": false});
    if cx.era.structured() {
        r["structuredContent"] = structured;
    }
    r
}

/// A failed result: the E-code line and its suggestion.
fn fail_text(text: String) -> Value {
    json!({"content": [{"type": "text", "text": text}], "isError": true})
}

fn fail_abx(e: &AbxError) -> Value {
    fail_text(format!("{e}\nSuggestion: {}", e.suggestion))
}

fn fail(e: &CallError) -> Value {
    match e {
        CallError::Rpc(r) => match r.suggestion() {
            Some(s) => fail_text(format!("{r}\nSuggestion: {s}")),
            None => fail_text(r.to_string()),
        },
        CallError::Broken(b) => fail_abx(b),
    }
}

fn args<T: DeserializeOwned>(tool: &str, v: Value) -> Result<T, Value> {
    serde_json::from_value(v).map_err(|e| fail_abx(&AbxError::invalid_params(tool, e)))
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default()
}

/// Run a tool; `None` when the call was cancelled (nothing is to be sent).
pub async fn call(cx: &Cx<'_>, name: &str, a: Value) -> Option<Value> {
    let cancel = cx.cancel.clone();
    if name == "exec" {
        return exec(cx, a).await;
    }
    if name == "run_code" {
        let a: RunCodeArgs = match args(name, a) {
            Ok(a) => a,
            Err(e) => return Some(e),
        };
        let p = to_params(&api::CodeRunParams::from(a));
        // Dropping the call on cancel sends $/cancelRequest: the code is interrupted.
        return tokio::select! {
            r = cx.mux.call("code/run", p) => Some(match r {
                Ok(r) => code_result(cx, &r),
                Err(e) => fail(&e),
            }),
            _ = cancel.cancelled() => None,
        };
    }
    tokio::select! {
        r = simple(cx, name, a) => Some(r.unwrap_or_else(|e| e)),
        // Dropping the call sends $/cancelRequest to the broker.
        _ = cancel.cancelled() => None,
    }
}

// Tool arguments. Each derives its input schema (field docs are what agents read) and
// converts into the params of the broker method it calls.

const SANDBOX_ARG: &str =
    "Sandbox id (`id` or `provider:id`), as sandbox_create or sandbox_list returned it.";
const PATH_ARG: &str =
    "Path in the sandbox: under /workspace (relative paths are taken from there) or /tmp.";

// `sandbox_create` → `sandbox/create`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct CreateArgs {
    /// Provider id (see provider_list). Default: the broker's default provider.
    provider: Option<String>,
    /// Template of the provider (the local provider has 'base').
    template: Option<String>,
    /// Lifetime in seconds (default 300).
    #[schemars(range(min = 1, max = 2_592_000))]
    timeout: Option<u64>,
    /// Environment variables of every command run in the sandbox.
    env: Option<BTreeMap<String, String>>,
    /// Labels to attach to the sandbox.
    #[schemars(with = "Option<BTreeMap<String, String>>")]
    metadata: Option<Map<String, Value>>,
}

impl From<CreateArgs> for api::SandboxCreateParams {
    fn from(a: CreateArgs) -> Self {
        api::SandboxCreateParams {
            provider: a.provider,
            template: a.template,
            timeout: a.timeout.map(Value::from),
            env: a.env,
            metadata: a.metadata,
            ..Default::default()
        }
    }
}

// `sandbox_list` → `sandbox/list`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ProviderArg {
    /// Only this provider's sandboxes.
    provider: Option<String>,
}

impl From<ProviderArg> for api::SandboxListParams {
    fn from(a: ProviderArg) -> Self {
        api::SandboxListParams {
            provider: a.provider,
        }
    }
}

// `sandbox_info`, `sandbox_kill` → `sandbox/info`, `sandbox/kill`.
#[derive(Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct SandboxArg {
    #[schemars(description = SANDBOX_ARG)]
    sandbox: String,
}

impl From<SandboxArg> for api::SandboxParams {
    fn from(a: SandboxArg) -> Self {
        api::SandboxParams { sandbox: a.sandbox }
    }
}

// `sandbox_set_timeout` → `sandbox/setTimeout`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct TimeoutArgs {
    #[schemars(description = SANDBOX_ARG)]
    sandbox: String,
    /// Seconds from now.
    #[schemars(range(min = 1, max = 2_592_000))]
    timeout: u64,
}

impl From<TimeoutArgs> for api::SetTimeoutParams {
    fn from(a: TimeoutArgs) -> Self {
        api::SetTimeoutParams {
            sandbox: a.sandbox,
            timeout: a.timeout.into(),
        }
    }
}

// `files_read` → `files/read` (the whole file, up to the broker's 4 MiB).
#[derive(Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct PathArgs {
    #[schemars(description = SANDBOX_ARG)]
    sandbox: String,
    #[schemars(description = PATH_ARG)]
    path: String,
}

impl From<PathArgs> for api::FilesReadParams {
    fn from(a: PathArgs) -> Self {
        api::FilesReadParams {
            sandbox: a.sandbox,
            path: a.path,
            offset: None,
            length: None,
            encoding: None,
        }
    }
}

// `files_write` → `files/write` (`content` is `data`, as text).
#[derive(Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct WriteArgs {
    #[schemars(description = SANDBOX_ARG)]
    sandbox: String,
    #[schemars(description = PATH_ARG)]
    path: String,
    /// The whole new content (UTF-8 text).
    content: String,
}

impl From<WriteArgs> for api::FilesWriteParams {
    fn from(a: WriteArgs) -> Self {
        api::FilesWriteParams {
            sandbox: a.sandbox,
            path: a.path,
            data: a.content,
            encoding: None,
            offset: None,
            append: false,
            mode: None,
        }
    }
}

// `files_list` → `files/list` (not recursive).
#[derive(Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ListArgs {
    #[schemars(description = SANDBOX_ARG)]
    sandbox: String,
    /// Directory (default /workspace).
    path: Option<String>,
}

impl From<ListArgs> for api::FilesListParams {
    fn from(a: ListArgs) -> Self {
        api::FilesListParams {
            sandbox: a.sandbox,
            path: a.path,
            recursive: false,
        }
    }
}

// `ports_url` → `ports/url`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct PortArgs {
    #[schemars(description = SANDBOX_ARG)]
    sandbox: String,
    #[schemars(range(min = 1, max = 65535))]
    port: u16,
}

impl From<PortArgs> for api::PortParams {
    fn from(a: PortArgs) -> Self {
        api::PortParams {
            sandbox: a.sandbox,
            port: a.port.into(),
        }
    }
}

// `provider_list` → `provider/list`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct NoArgs {}

impl From<NoArgs> for api::NoParams {
    fn from(_: NoArgs) -> Self {
        api::NoParams {}
    }
}

// `exec` → `exec/start` (or `exec/run`): a shell command, stdin empty and closed.
#[derive(Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ExecArgs {
    #[schemars(description = SANDBOX_ARG)]
    sandbox: String,
    /// The command, run with sh -c (pipes, &&, redirections work).
    command: String,
    /// Working directory (default /workspace).
    cwd: Option<String>,
    /// Extra environment variables.
    env: Option<BTreeMap<String, String>>,
    /// Seconds before the command (and everything it started) is killed. Default: no limit.
    #[schemars(extend("exclusiveMinimum" = 0))]
    timeout: Option<f64>,
}

impl From<ExecArgs> for api::ExecStartParams {
    fn from(a: ExecArgs) -> Self {
        api::ExecStartParams {
            sandbox: a.sandbox,
            command: Some(a.command),
            cwd: a.cwd,
            env: a.env,
            timeout: a.timeout,
            // Empty and closed, so a command that reads stdin does not wait forever.
            stdin: Some(String::new()),
            ..Default::default()
        }
    }
}

// `run_code` → `code/run`.
#[derive(Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RunCodeArgs {
    #[schemars(description = SANDBOX_ARG)]
    sandbox: String,
    /// The code (several statements; the value of the last expression is returned).
    code: String,
    /// python (default), javascript or bash.
    language: Option<String>,
    /// A context id (from code/createContext); default: the sandbox's default context of the language.
    context: Option<String>,
    /// Seconds before the code is interrupted (the context and its variables stay).
    #[schemars(extend("exclusiveMinimum" = 0))]
    timeout: Option<f64>,
}

impl From<RunCodeArgs> for api::CodeRunParams {
    fn from(a: RunCodeArgs) -> Self {
        api::CodeRunParams {
            sandbox: a.sandbox,
            code: a.code,
            language: a.language,
            context: a.context,
            timeout: a.timeout,
            env: None,
            run_id: None,
        }
    }
}

/// The tool result of `run_code`: the output and results as text, images as image
/// content, an error as `isError` with its traceback.
fn code_result(cx: &Cx<'_>, r: &Value) -> Value {
    let mut text = String::new();
    let section = |text: &mut String, name: &str, body: &str| {
        if !body.is_empty() {
            text.push_str(&format!("--- {name}\n{body}"));
            if !body.ends_with('\n') {
                text.push('\n');
            }
        }
    };
    section(
        &mut text,
        "stdout",
        r["stdout"].as_str().unwrap_or_default(),
    );
    section(
        &mut text,
        "stderr",
        r["stderr"].as_str().unwrap_or_default(),
    );
    let mut images = Vec::new();
    for b in r["results"].as_array().into_iter().flatten() {
        for (mime, kind) in [("image/png", "image"), ("image/jpeg", "image")] {
            if let Some(data) = b[mime].as_str() {
                images.push(json!({"type": kind, "data": data, "mimeType": mime}));
            }
        }
        let shown = b["text/markdown"]
            .as_str()
            .or(b["text/plain"].as_str())
            .or(b["text/html"].as_str());
        match shown {
            Some(t) => section(&mut text, "result", t),
            None if b.get("image/png").is_some() || b.get("image/jpeg").is_some() => {
                section(&mut text, "result", "(an image, below)")
            }
            None => section(&mut text, "result", &pretty(b)),
        }
    }
    let error = &r["error"];
    if !error.is_null() {
        let tb = error["traceback"].as_str().unwrap_or_default();
        let line = format!(
            "{}: {}",
            error["name"].as_str().unwrap_or_default(),
            error["value"].as_str().unwrap_or_default()
        );
        section(&mut text, "error", if tb.is_empty() { &line } else { tb });
    }
    if r["timedOut"] == true {
        text.push_str("(the code ran past its timeout and was interrupted)\n");
    }
    if text.is_empty() {
        text.push_str("(no output)\n");
    }
    let mut out = ok(cx, text, r.clone());
    if let Some(content) = out["content"].as_array_mut() {
        content.extend(images);
    }
    out["isError"] = json!(!error.is_null());
    out
}

fn put<T: serde::Serialize>(p: &mut Value, k: &str, v: Option<T>) {
    if let Some(v) = v {
        p[k] = json!(v);
    }
}

async fn simple(cx: &Cx<'_>, name: &str, a: Value) -> Result<Value, Value> {
    let m = cx.mux;
    let call = |method: &'static str, params: Value| async move {
        m.call(method, params).await.map_err(|e| fail(&e))
    };
    Ok(match name {
        "sandbox_create" => {
            let a: CreateArgs = args(name, a)?;
            let p = to_params(&api::SandboxCreateParams::from(a));
            let sb = call("sandbox/create", p).await?;
            ok(cx, pretty(&sb), sb)
        }
        "sandbox_list" => {
            let a: ProviderArg = args(name, a)?;
            let r = call("sandbox/list", to_params(&api::SandboxListParams::from(a))).await?;
            // A provider that failed is named under the list; the others are listed anyway.
            let mut text = pretty(&r);
            for e in r["errors"].as_array().into_iter().flatten() {
                text.push('\n');
                text.push_str(crate::output::provider_warning(e).trim_end());
            }
            ok(cx, text, r)
        }
        "sandbox_info" => {
            let a: SandboxArg = args(name, a)?;
            let sb = call("sandbox/info", to_params(&api::SandboxParams::from(a))).await?;
            ok(cx, pretty(&sb), sb)
        }
        "sandbox_kill" => {
            let a: SandboxArg = args(name, a)?;
            let p = to_params(&api::SandboxParams::from(a.clone()));
            let r = call("sandbox/kill", p).await?;
            let killed = r["killed"].as_bool().unwrap_or(false);
            let text = if killed {
                format!("Sandbox '{}' killed.", a.sandbox)
            } else {
                format!("Sandbox '{}' was already gone.", a.sandbox)
            };
            ok(cx, text, json!({"killed": killed}))
        }
        "sandbox_set_timeout" => {
            let a: TimeoutArgs = args(name, a)?;
            let p = to_params(&api::SetTimeoutParams::from(a));
            let sb = call("sandbox/setTimeout", p).await?;
            ok(cx, pretty(&sb), sb)
        }
        "files_read" => {
            let a: PathArgs = args(name, a)?;
            let p = to_params(&api::FilesReadParams::from(a.clone()));
            let r = call("files/read", p).await?;
            let content = r["data"].as_str().unwrap_or_default().to_owned();
            let encoding = r["encoding"].as_str().unwrap_or("utf-8").to_owned();
            let size = r["size"].as_u64().unwrap_or(0);
            let truncated = r["eof"] == json!(false);
            let mut text = if encoding == "base64" {
                format!("(not UTF-8 text: {size} bytes, base64-encoded)\n{content}")
            } else {
                content.clone()
            };
            if truncated {
                text.push_str(&format!(
                    "\n[... truncated: the file has {size} bytes; read it in parts with exec (e.g. head, tail, sed -n)]"
                ));
            }
            ok(
                cx,
                text,
                json!({"path": a.path, "content": content, "encoding": encoding, "size": size, "truncated": truncated}),
            )
        }
        "files_write" => {
            let a: WriteArgs = args(name, a)?;
            let p = to_params(&api::FilesWriteParams::from(a.clone()));
            let r = match m.call("files/write", p.clone()).await {
                Err(CallError::Rpc(e)) if e.error_code() == Some(ErrorCode::FileNotFound) => {
                    // A missing parent directory: create it, then write again.
                    match parent(&a.path) {
                        Some(dir) => {
                            let mkdir = api::MkdirParams {
                                sandbox: a.sandbox.clone(),
                                path: dir,
                                parents: true,
                            };
                            call("files/mkdir", to_params(&mkdir)).await?;
                            call("files/write", p).await?
                        }
                        None => return Err(fail(&CallError::Rpc(e))),
                    }
                }
                r => r.map_err(|e| fail(&e))?,
            };
            let size = r["size"].as_u64().unwrap_or(0);
            ok(
                cx,
                format!("Wrote {size} bytes to {}.", a.path),
                json!({"path": a.path, "size": size}),
            )
        }
        "files_list" => {
            let a: ListArgs = args(name, a)?;
            let r = call(
                "files/list",
                to_params(&api::FilesListParams::from(a.clone())),
            )
            .await?;
            let entries = r["entries"].as_array().cloned().unwrap_or_default();
            let dir = a.path.unwrap_or_else(|| "/workspace".into());
            let mut text = if entries.is_empty() {
                format!("{dir} is empty.")
            } else {
                format!("{dir}:\n")
            };
            for e in &entries {
                let kind = e["type"].as_str().unwrap_or("?");
                let suffix = if kind == "directory" { "/" } else { "" };
                text.push_str(&format!(
                    "{:<9} {:>10} {} {}{suffix}\n",
                    kind,
                    e["size"].as_u64().unwrap_or(0),
                    e["modifiedAt"].as_str().unwrap_or(""),
                    e["name"].as_str().unwrap_or(""),
                ));
            }
            ok(cx, text.trim_end().to_owned(), json!({"entries": entries}))
        }
        "ports_url" => {
            let a: PortArgs = args(name, a)?;
            let r = call("ports/url", to_params(&api::PortParams::from(a))).await?;
            let headers = r.get("headers").cloned().unwrap_or_else(|| json!({}));
            let url = r["url"].clone();
            ok(cx, pretty(&r), json!({"url": url, "headers": headers}))
        }
        "provider_list" => {
            let a: NoArgs = args(name, a)?;
            let r = call("provider/list", to_params(&api::NoParams::from(a))).await?;
            ok(cx, pretty(&r), r)
        }
        other => return Err(fail_text(format!("Unknown tool '{other}'."))),
    })
}

/// The parent directory of a sandbox path, when it has one worth creating.
fn parent(path: &str) -> Option<String> {
    let p = std::path::Path::new(path).parent()?.to_str()?;
    (!p.is_empty() && p != "/").then(|| p.to_owned())
}

/// Output kept for the result, per stream: the first [`HEAD`] bytes and the last [`TAIL`].
const HEAD: usize = 64 * 1024;
const TAIL: usize = 448 * 1024;

#[derive(Default)]
struct Capture {
    head: String,
    /// Set once anything went to `tail`: the head takes no more.
    head_closed: bool,
    tail: String,
    omitted: u64,
}

fn floor_char(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

impl Capture {
    fn push(&mut self, mut s: &str) {
        if !self.head_closed {
            let n = floor_char(s, (HEAD - self.head.len()).min(s.len()));
            self.head.push_str(&s[..n]);
            s = &s[n..];
            if s.is_empty() {
                return;
            }
            self.head_closed = true;
        }
        self.tail.push_str(s);
        if self.tail.len() > TAIL {
            let cut = self.tail.len() - TAIL;
            let mut cut_at = cut;
            while !self.tail.is_char_boundary(cut_at) {
                cut_at += 1;
            }
            self.tail.drain(..cut_at);
            self.omitted += cut_at as u64;
        }
    }

    fn text(&self) -> String {
        if self.omitted == 0 {
            format!("{}{}", self.head, self.tail)
        } else {
            format!(
                "{}\n[... {} bytes left out ...]\n{}",
                self.head, self.omitted, self.tail
            )
        }
    }
}

async fn exec(cx: &Cx<'_>, a: Value) -> Option<Value> {
    let a: ExecArgs = match args("exec", a) {
        Ok(a) => a,
        Err(e) => return Some(e),
    };
    let conn = match cx.mux.conn().await {
        Ok(c) => c,
        Err(e) => return Some(fail_abx(&e)),
    };
    let p = to_params(&api::ExecStartParams::from(a.clone()));
    // Not raced with the cancel token: an exec that started must be known to be killed.
    let (started, mut events) = match conn.start_stream("exec/start", p.clone()).await {
        Ok(r) => r,
        Err(CallError::Rpc(e)) if crate::stream::lacks_stream(&e) => {
            // No `exec.stream`: `exec/run` does it, with the output at the end (said once
            // on stderr). Dropping the call on cancel sends `$/cancelRequest`, which kills it.
            crate::stream::note_no_stream(&e);
            let r = tokio::select! {
                r = conn.call("exec/run", p) => r,
                _ = cx.cancel.cancelled() => return None,
            };
            return Some(match r {
                Ok(r) => exec_result(
                    cx,
                    a.timeout,
                    run_as_exit(&r),
                    (run_capture(&r, "stdout"), run_capture(&r, "stderr")),
                    r["truncated"] == true,
                ),
                Err(e) => fail(&e),
            });
        }
        Err(e) => return Some(fail(&e)),
    };
    let exec_id = started["execId"].as_str().unwrap_or_default().to_owned();
    let (mut out, mut err) = (Capture::default(), Capture::default());
    let mut progressed: u64 = 0;
    let exit = loop {
        tokio::select! {
            ev = events.recv() => match ev {
                Some(ev) if ev.method == "exec/output" => {
                    let p = &ev.params;
                    let data = p["data"].as_str().unwrap_or_default();
                    let text = if p["encoding"] == "base64" {
                        let bytes = abx_protocol::b64::decode(data)
                            .unwrap_or_default();
                        String::from_utf8_lossy(&bytes).into_owned()
                    } else {
                        data.to_owned()
                    };
                    if p["stream"] == "stderr" {
                        err.push(&text);
                    } else {
                        out.push(&text);
                    }
                    if let (Some(token), false) = (&cx.progress, text.is_empty()) {
                        progressed += text.len() as u64;
                        cx.out.notify(
                            "notifications/progress",
                            json!({"progressToken": token, "progress": progressed, "message": text}),
                        );
                    }
                }
                Some(ev) if ev.method == "exec/exit" => break ev.params,
                Some(_) => {}
                None => {
                    return Some(fail_abx(&AbxError::new(
                        ErrorCode::BrokerUnreachable,
                        &[
                            ("detail", "the connection to the broker broke while the command ran"),
                            ("log", "the broker log"),
                        ],
                    )))
                }
            },
            _ = cx.cancel.cancelled() => {
                let kill = api::ExecIdParams { exec_id };
                let _ = conn.call("exec/kill", to_params(&kill)).await;
                return None;
            }
        }
    };
    Some(exec_result(cx, a.timeout, exit, (out, err), false))
}

/// An `exec/run` result's stream `k` as a [`Capture`].
fn run_capture(r: &Value, k: &str) -> Capture {
    let data = r[k].as_str().unwrap_or_default();
    let mut c = Capture::default();
    if r["encoding"] == "base64" {
        let bytes = abx_protocol::b64::decode(data).unwrap_or_default();
        c.push(&String::from_utf8_lossy(&bytes));
    } else {
        c.push(data);
    }
    c
}

/// An `exec/run` result in the shape of an `exec/exit`.
fn run_as_exit(r: &Value) -> Value {
    let mut e = json!({"exitCode": r.get("exitCode").cloned().unwrap_or(Value::Null), "timedOut": r["timedOut"]});
    if let Some(s) = r.get("signal") {
        e["signal"] = s.clone();
    }
    e
}

/// The tool result of an exec: exit line, stdout, stderr.
fn exec_result(
    cx: &Cx<'_>,
    timeout: Option<f64>,
    exit: Value,
    (out, err): (Capture, Capture),
    truncated: bool,
) -> Value {
    let exit_code = exit.get("exitCode").cloned().unwrap_or(Value::Null);
    let timed_out = exit["timedOut"].as_bool().unwrap_or(false);
    let signal = exit["signal"].as_str().map(str::to_owned);
    let truncated = truncated || out.omitted > 0 || err.omitted > 0;
    let (stdout, stderr) = (out.text(), err.text());
    let mut text = match (&exit_code, timed_out) {
        (_, true) => format!(
            "Timed out after {}s and was killed (exit code {exit_code}).",
            timeout.unwrap_or(0.0)
        ),
        (Value::Null, _) => "Exit code: unknown.".to_owned(),
        (c, _) => format!("Exit code: {c}"),
    };
    if let Some(s) = &signal {
        text.push_str(&format!(" (signal {s})"));
    }
    text.push_str(&format!("\n--- stdout\n{stdout}"));
    if !stdout.is_empty() && !stdout.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&format!("--- stderr\n{stderr}"));
    let mut structured = json!({
        "exitCode": exit_code, "stdout": stdout, "stderr": stderr, "timedOut": timed_out,
        "truncated": truncated,
    });
    put(&mut structured, "signal", signal);
    ok(cx, text, structured)
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn capture_keeps_head_and_tail() {
        let mut c = Capture::default();
        c.push("hello ");
        c.push("world");
        assert_eq!(c.text(), "hello world");
        let mut c = Capture::default();
        let big = "é".repeat(HEAD + TAIL); // 2 bytes each
        c.push(&big);
        assert!(c.omitted > 0);
        assert!(c.head.len() <= HEAD && c.tail.len() <= TAIL);
        assert!(c.text().contains("bytes left out"));
        // Order is kept when the head ends inside a character.
        let mut c = Capture::default();
        c.push(&"a".repeat(HEAD - 1));
        c.push("é");
        c.push("b");
        assert_eq!(c.text(), format!("{}éb", "a".repeat(HEAD - 1)));
    }

    /// `v` without what schemars adds that says nothing new to an agent: integer `format`s
    /// and the `minimum: 0` of unsigned integers; `required` sorted.
    fn essential(mut v: Value) -> Value {
        if let Some(o) = v.as_object_mut() {
            if o.get("format")
                .and_then(Value::as_str)
                .is_some_and(|f| f.starts_with("uint") || f == "double")
            {
                o.remove("format");
                if o.get("minimum") == Some(&json!(0)) {
                    o.remove("minimum");
                }
            }
            if let Some(Value::Array(r)) = o.get_mut("required") {
                r.sort_by_key(|x| x.to_string());
            }
            for x in o.values_mut() {
                *x = essential(x.take());
            }
        }
        v
    }

    /// The input schemas agents see are generated from the argument types, and say what the
    /// hand-written ones said (names, types, bounds, descriptions, required, closed).
    #[test]
    fn input_schemas_are_generated_and_unchanged_for_agents() {
        let want: Value =
            serde_json::from_str(include_str!("../../tests/fixtures/mcp_input_schemas.json"))
                .expect("fixture");
        let want = want.as_object().expect("object");
        assert_eq!(want.len(), TOOLS.len());
        for d in TOOLS {
            let have = essential((d.input)());
            assert_eq!(&have, &essential(want[d.name].clone()), "{}", d.name);
        }
    }

    /// Every argument of a tool reaches the broker as a member of the method's params
    /// (the API type's schema has it), except those the tool renames or fixes.
    #[test]
    fn every_tool_argument_is_a_member_of_the_methods_params() {
        fn api_props<T: JsonSchema>() -> Vec<String> {
            let s = input_schema::<T>();
            s["properties"]
                .as_object()
                .expect("properties")
                .keys()
                .cloned()
                .collect()
        }
        // tool, method's params properties, renames (argument → member).
        type Renames = &'static [(&'static str, &'static str)];
        let cases: Vec<(&str, Vec<String>, Renames)> = vec![
            (
                "sandbox_create",
                api_props::<api::SandboxCreateParams>(),
                &[],
            ),
            ("sandbox_list", api_props::<api::SandboxListParams>(), &[]),
            ("sandbox_info", api_props::<api::SandboxParams>(), &[]),
            ("sandbox_kill", api_props::<api::SandboxParams>(), &[]),
            (
                "sandbox_set_timeout",
                api_props::<api::SetTimeoutParams>(),
                &[],
            ),
            ("exec", api_props::<api::ExecStartParams>(), &[]),
            ("run_code", api_props::<api::CodeRunParams>(), &[]),
            ("files_read", api_props::<api::FilesReadParams>(), &[]),
            (
                "files_write",
                api_props::<api::FilesWriteParams>(),
                &[("content", "data")],
            ),
            ("files_list", api_props::<api::FilesListParams>(), &[]),
            ("ports_url", api_props::<api::PortParams>(), &[]),
            ("provider_list", api_props::<api::NoParams>(), &[]),
        ];
        assert_eq!(cases.len(), TOOLS.len());
        for (tool, members, renames) in cases {
            let d = TOOLS.iter().find(|d| d.name == tool).expect(tool);
            let input = (d.input)();
            for arg in input["properties"].as_object().expect("properties").keys() {
                let member = renames
                    .iter()
                    .find(|(a, _)| a == arg)
                    .map_or(arg.as_str(), |(_, m)| m);
                assert!(
                    members.iter().any(|m| m == member),
                    "{tool}: {arg} is not a param"
                );
            }
        }
    }

    /// The conversions carry every argument into the request (and what the tool fixes).
    #[test]
    fn tool_arguments_convert_into_the_requests() {
        let a: ExecArgs = serde_json::from_value(
            json!({"sandbox": "s", "command": "ls", "cwd": "/tmp", "env": {"A": "1"}, "timeout": 2.5}),
        )
        .expect("args");
        assert_eq!(
            to_params(&api::ExecStartParams::from(a)),
            json!({"sandbox": "s", "command": "ls", "cwd": "/tmp", "env": {"A": "1"}, "timeout": 2.5, "stdin": ""})
        );
        let a: CreateArgs =
            serde_json::from_value(json!({"timeout": 60, "metadata": {"k": "v"}})).expect("args");
        assert_eq!(
            to_params(&api::SandboxCreateParams::from(a)),
            json!({"timeout": 60, "metadata": {"k": "v"}})
        );
        let a: WriteArgs =
            serde_json::from_value(json!({"sandbox": "s", "path": "p", "content": "x"}))
                .expect("args");
        assert_eq!(
            to_params(&api::FilesWriteParams::from(a)),
            json!({"sandbox": "s", "path": "p", "data": "x", "append": false})
        );
        // Unknown arguments are refused (the schemas are closed).
        assert!(
            serde_json::from_value::<PortArgs>(json!({"sandbox": "s", "port": 1, "x": 1})).is_err()
        );
    }

    #[test]
    fn every_tool_has_an_object_schema() {
        for era in [Era::Handshake("2024-11-05"), Era::Modern] {
            for t in list(era) {
                assert_eq!(t["inputSchema"]["type"], "object", "{}", t["name"]);
                assert_eq!(t["inputSchema"]["additionalProperties"], false);
                if era == Era::Modern {
                    assert!(t["outputSchema"].is_object(), "{}", t["name"]);
                    let extra = t["outputSchema"].get("additionalProperties");
                    assert!(extra.is_none(), "{}", t["name"]);
                } else {
                    assert!(t.get("outputSchema").is_none());
                }
            }
        }
        assert_eq!(
            parent("/workspace/a/b.txt").as_deref(),
            Some("/workspace/a")
        );
        assert_eq!(parent("b.txt"), None);
        assert_eq!(parent("d/b.txt").as_deref(), Some("d"));
    }
}
