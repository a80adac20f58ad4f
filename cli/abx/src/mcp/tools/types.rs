//! The tools' types: each tool's arguments (they derive its input schema, and their field
//! docs are what agents read) converted into the params of the broker method it calls, and
//! the structured results of the tools that reshape the method's (`exec`, `files_read`,
//! `files_write`).

use abx_protocol::api;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

// Tool arguments. Each derives its input schema (field docs are what agents read) and
// converts into the params of the broker method it calls.

pub(super) const SANDBOX_ARG: &str =
    "Sandbox id (`id` or `provider:id`), as sandbox_create or sandbox_list returned it.";
pub(super) const PATH_ARG: &str =
    "Path in the sandbox: under /workspace (relative paths are taken from there) or /tmp.";

// `sandbox_create` → `sandbox/create`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct CreateArgs {
    /// Provider id (see provider_list). Default: the broker's default provider.
    pub(super) provider: Option<String>,
    /// Template of the provider (the local provider has 'base').
    pub(super) template: Option<String>,
    /// Lifetime in seconds (default 300).
    #[schemars(range(min = 1, max = 2_592_000))]
    pub(super) timeout: Option<u64>,
    /// Environment variables of every command run in the sandbox.
    pub(super) env: Option<BTreeMap<String, String>>,
    /// Labels to attach to the sandbox.
    #[schemars(with = "Option<BTreeMap<String, String>>")]
    pub(super) metadata: Option<Map<String, Value>>,
    /// Host directories to bring into the sandbox.
    pub(super) mounts: Option<Vec<MountArg>>,
    /// Network: 'none' (no network), 'internet', 'host', or a policy {allow: [host...],
    /// deny?: [host...]}: only the hosts allowed ('example.com', '*.example.com',
    /// 'HOST:PORT', an IP or CIDR), through a filtering proxy. Ask the user before allowing
    /// hosts.
    #[schemars(with = "Option<api::NetworkSpec>")]
    pub(super) network: Option<Value>,
    /// Limits of the sandbox (the local provider's defaults: 2G memory, 1024 processes).
    pub(super) limits: Option<LimitsArg>,
}

// `sandbox_create`'s `limits` → `sandbox/create` `limits` (`api::SandboxLimits`).
#[derive(Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct LimitsArg {
    /// Memory: bytes, or a size with a unit ('512M', '2G'). A command that goes over it is
    /// killed (oomKilled in its exit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "MemoryArg")]
    pub(super) memory: Option<MemoryArg>,
    /// CPUs (0.5: half a core).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "f64", range(min = 0.01))]
    pub(super) cpus: Option<f64>,
    /// Processes and threads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "u64", range(min = 1))]
    pub(super) pids: Option<u64>,
}

// A memory limit: bytes or a size with a unit.
#[derive(Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub(super) enum MemoryArg {
    Bytes(u64),
    Size(String),
}

// `sandbox_set_network` → `sandbox/setNetwork`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct SetNetworkArgs {
    #[schemars(description = SANDBOX_ARG)]
    pub(super) sandbox: String,
    /// The whole new policy: {allow: [host...], deny?: [host...]}.
    #[schemars(with = "api::NetworkPolicy")]
    pub(super) network: Value,
}

impl From<SetNetworkArgs> for api::SetNetworkParams {
    fn from(a: SetNetworkArgs) -> Self {
        api::SetNetworkParams {
            sandbox: a.sandbox,
            network: a.network,
        }
    }
}

// One of `sandbox_create`'s `mounts` → a `sandbox/create` mount.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct MountArg {
    /// A directory on the user's machine: absolute, or relative to the directory abx mcp
    /// runs in ('.' is that directory, usually the user's project).
    pub(super) source: String,
    /// Where the sandbox sees it (absolute; default /workspace).
    #[serde(default)]
    #[schemars(with = "String")]
    pub(super) target: Option<String>,
    /// overlay (default: the sandbox writes to its own layer, the user's files change only
    /// on sandbox_apply), ro (read-only) or rw (writes go to the user's files at once: only
    /// when the user asked for it).
    #[serde(default)]
    #[schemars(with = "api::MountMode")]
    pub(super) mode: Option<api::MountMode>,
}

impl From<CreateArgs> for api::SandboxCreateParams {
    fn from(a: CreateArgs) -> Self {
        let cwd = std::env::current_dir().unwrap_or_else(|_| "/".into());
        let mounts = a.mounts.map(|list| {
            let specs: Vec<api::MountSpec> = list
                .into_iter()
                .map(|m| api::MountSpec {
                    source: cwd.join(&m.source).to_string_lossy().into_owned(),
                    target: m.target,
                    mode: m.mode,
                })
                .collect();
            serde_json::to_value(specs).expect("mounts serialize")
        });
        api::SandboxCreateParams {
            provider: a.provider,
            template: a.template,
            timeout: a.timeout.map(Value::from),
            env: a.env,
            metadata: a.metadata,
            mounts,
            network: a.network,
            limits: a
                .limits
                .map(|l| serde_json::to_value(l).expect("limits serialize")),
        }
    }
}

// `sandbox_diff` → `sandbox/diff`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct DiffArgs {
    #[schemars(description = SANDBOX_ARG)]
    pub(super) sandbox: String,
    /// One mount, by its target (default: every overlay mount).
    pub(super) target: Option<String>,
    /// Only these paths (absolute paths in the sandbox; a directory selects what is beneath it).
    pub(super) paths: Option<Vec<String>>,
    /// list (default) or patch (a unified diff for each text file).
    pub(super) format: Option<api::DiffFormat>,
}

impl From<DiffArgs> for api::DiffParams {
    fn from(a: DiffArgs) -> Self {
        api::DiffParams {
            sandbox: a.sandbox,
            target: a.target,
            paths: a.paths,
            format: a.format,
        }
    }
}

// `sandbox_apply` → `sandbox/apply`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct ApplyArgs {
    #[schemars(description = SANDBOX_ARG)]
    pub(super) sandbox: String,
    /// One mount, by its target (default: every overlay mount).
    pub(super) target: Option<String>,
    /// Only these paths (absolute paths in the sandbox; default: every change).
    pub(super) paths: Option<Vec<String>>,
    /// Say what would be applied, and change nothing.
    pub(super) dry_run: Option<bool>,
    /// Also overwrite files the user changed since the sandbox was created.
    pub(super) force: Option<bool>,
}

impl From<ApplyArgs> for api::ApplyParams {
    fn from(a: ApplyArgs) -> Self {
        api::ApplyParams {
            sandbox: a.sandbox,
            target: a.target,
            paths: a.paths,
            dry_run: a.dry_run,
            force: a.force,
        }
    }
}

// `sandbox_discard` → `sandbox/discard`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct DiscardArgs {
    #[schemars(description = SANDBOX_ARG)]
    pub(super) sandbox: String,
    /// One mount, by its target (default: every overlay mount).
    pub(super) target: Option<String>,
    /// Only these paths (absolute paths in the sandbox; default: every change).
    pub(super) paths: Option<Vec<String>>,
}

impl From<DiscardArgs> for api::DiscardParams {
    fn from(a: DiscardArgs) -> Self {
        api::DiscardParams {
            sandbox: a.sandbox,
            target: a.target,
            paths: a.paths,
        }
    }
}

// `sandbox_log` → `sandbox/log`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct LogArgs {
    #[schemars(description = SANDBOX_ARG)]
    pub(super) sandbox: String,
    /// Only commands with a larger sequence number.
    pub(super) since: Option<u64>,
    /// At most this many (default and max 1000), the oldest first.
    #[schemars(range(max = 1000))]
    pub(super) limit: Option<u64>,
}

impl From<LogArgs> for api::LogParams {
    fn from(a: LogArgs) -> Self {
        api::LogParams {
            sandbox: a.sandbox,
            since: a.since,
            limit: a.limit,
        }
    }
}

// `sandbox_list` → `sandbox/list`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ProviderArg {
    /// Only this provider's sandboxes.
    pub(super) provider: Option<String>,
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
pub(super) struct SandboxArg {
    #[schemars(description = SANDBOX_ARG)]
    pub(super) sandbox: String,
}

impl From<SandboxArg> for api::SandboxParams {
    fn from(a: SandboxArg) -> Self {
        api::SandboxParams { sandbox: a.sandbox }
    }
}

// `sandbox_set_timeout` → `sandbox/setTimeout`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct TimeoutArgs {
    #[schemars(description = SANDBOX_ARG)]
    pub(super) sandbox: String,
    /// Seconds from now.
    #[schemars(range(min = 1, max = 2_592_000))]
    pub(super) timeout: u64,
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
pub(super) struct PathArgs {
    #[schemars(description = SANDBOX_ARG)]
    pub(super) sandbox: String,
    #[schemars(description = PATH_ARG)]
    pub(super) path: String,
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
pub(super) struct WriteArgs {
    #[schemars(description = SANDBOX_ARG)]
    pub(super) sandbox: String,
    #[schemars(description = PATH_ARG)]
    pub(super) path: String,
    /// The whole new content (UTF-8 text).
    pub(super) content: String,
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
pub(super) struct ListArgs {
    #[schemars(description = SANDBOX_ARG)]
    pub(super) sandbox: String,
    /// Directory (default /workspace).
    pub(super) path: Option<String>,
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
pub(super) struct PortArgs {
    #[schemars(description = SANDBOX_ARG)]
    pub(super) sandbox: String,
    #[schemars(range(min = 1, max = 65535))]
    pub(super) port: u16,
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
pub(super) struct NoArgs {}

impl From<NoArgs> for api::NoParams {
    fn from(_: NoArgs) -> Self {
        api::NoParams {}
    }
}

// `exec` → `exec/start` (or `exec/run`): a shell command, stdin empty and closed.
#[derive(Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ExecArgs {
    #[schemars(description = SANDBOX_ARG)]
    pub(super) sandbox: String,
    /// The command, run with sh -c (pipes, &&, redirections work).
    pub(super) command: String,
    /// Working directory (default /workspace).
    pub(super) cwd: Option<String>,
    /// Extra environment variables.
    pub(super) env: Option<BTreeMap<String, String>>,
    /// Seconds before the command (and everything it started) is killed. Default: no limit.
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub(super) timeout: Option<f64>,
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
pub(super) struct RunCodeArgs {
    #[schemars(description = SANDBOX_ARG)]
    pub(super) sandbox: String,
    /// The code (several statements; the value of the last expression is returned).
    pub(super) code: String,
    /// python (default), javascript or bash.
    pub(super) language: Option<String>,
    /// A context id (from code_context_create or code_context_list); default: the sandbox's
    /// default context of the language.
    pub(super) context: Option<String>,
    /// Seconds before the code is interrupted (the context and its variables stay).
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub(super) timeout: Option<f64>,
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

// `code_context_create` → `code/createContext`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct CreateContextArgs {
    #[schemars(description = SANDBOX_ARG)]
    pub(super) sandbox: String,
    /// python (default), javascript or bash.
    pub(super) language: Option<String>,
    /// Working directory the interpreter starts in (default /workspace).
    pub(super) cwd: Option<String>,
    /// The interpreter program in the sandbox (default python3, node or bash on its PATH),
    /// e.g. a virtualenv's /workspace/.venv/bin/python.
    pub(super) interpreter: Option<String>,
    /// Environment variables of the interpreter.
    pub(super) env: Option<BTreeMap<String, String>>,
}

impl From<CreateContextArgs> for api::CodeCreateContextParams {
    fn from(a: CreateContextArgs) -> Self {
        api::CodeCreateContextParams {
            sandbox: a.sandbox,
            language: a.language,
            cwd: a.cwd,
            interpreter: a.interpreter,
            env: a.env,
        }
    }
}

// `code_context_restart`, `code_context_remove` → `code/restartContext`,
// `code/removeContext`.
#[derive(Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ContextArgs {
    #[schemars(description = SANDBOX_ARG)]
    pub(super) sandbox: String,
    /// The context id (from code_context_create or code_context_list; a default context's is
    /// default-<language>).
    pub(super) context: String,
}

impl From<ContextArgs> for api::CodeContextParams {
    fn from(a: ContextArgs) -> Self {
        api::CodeContextParams {
            sandbox: a.sandbox,
            context: a.context,
        }
    }
}

// Tool results of the tools whose structured result is not the called method's: each is
// serialized into `structuredContent` and generates the tool's output schema.

/// `exec`'s structured result.
#[derive(Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(super) struct ExecOutcome {
    /// The exit status (128+N when killed by signal N; `null` when unknown).
    pub(super) exit_code: Option<i64>,
    /// Standard output (the middle left out when it was too long).
    pub(super) stdout: String,
    /// Standard error (the middle left out when it was too long).
    pub(super) stderr: String,
    /// The timeout killed it.
    pub(super) timed_out: bool,
    /// The signal that ended it, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) signal: Option<String>,
    /// Output was longer than kept here (the middle is left out).
    pub(super) truncated: bool,
}

/// `files_read`'s structured result.
#[derive(Serialize, JsonSchema)]
pub(super) struct ReadOutcome {
    /// The file's path, as given.
    pub(super) path: String,
    /// The file's content (its first 4 MiB), as text or base64.
    pub(super) content: String,
    /// `utf-8` or `base64`.
    pub(super) encoding: String,
    /// Size of the whole file in bytes.
    pub(super) size: u64,
    /// Only the first 4 MiB were read.
    pub(super) truncated: bool,
}

/// `files_write`'s structured result.
#[derive(Serialize, JsonSchema)]
pub(super) struct WriteOutcome {
    /// The file's path, as given.
    pub(super) path: String,
    /// Bytes written.
    pub(super) size: u64,
}
