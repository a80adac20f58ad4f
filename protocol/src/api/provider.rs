//! `provider/*` methods: list, info, install, uninstall, update, doctor, configure, test.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A provider as `provider/list` shows it.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ProviderSummary {
    /// Provider id (`local`, or a plugin's manifest id).
    pub id: String,
    /// Display name.
    pub name: String,
    /// Version.
    pub version: String,
    /// `builtin` or `exec` (a plugin process speaking EPP/1).
    pub kind: String,
    /// `builtin`, `pinned`, `unpinned` or `local`.
    pub trust: String,
    /// Declared features (docs/design.md#features), e.g. `sandbox.lifecycle`.
    pub features: Vec<String>,
    /// Whether it is the default provider.
    pub default: bool,
}

/// `provider/list` result.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ProviderList {
    /// Every installed provider, builtins first.
    pub providers: Vec<ProviderSummary>,
}

/// Params naming a provider.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct ProviderIdParams {
    /// Provider id.
    pub id: String,
}

/// `provider/info` result: the summary, its description, and what the provider has.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ProviderInfo {
    /// Provider id.
    pub id: String,
    /// Display name.
    pub name: String,
    /// Version.
    pub version: String,
    /// `builtin` or `exec`.
    pub kind: String,
    /// Trust level.
    pub trust: String,
    /// Declared features.
    pub features: Vec<String>,
    /// Whether it is the default provider.
    pub default: bool,
    /// What it is.
    pub description: String,
    /// The rest: config keys (secrets flagged, secret defaults never shown), inherits,
    /// source `{url, subdir, ref, commit}`, digest, runtime, templates, security
    /// `{network, filesystem, spawnsProcesses, enforced}`, process, installedAt.
    #[serde(flatten)]
    pub details: Map<String, Value>,
}

/// `provider/install` params (`replace` is also what `provider/update` installs with).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", default)]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct ProviderInstallParams {
    /// A local directory, a git URL or an archive URL.
    pub source: String,
    /// The plugin root inside the source.
    pub subdir: Option<String>,
    /// Git: a full commit id (pinned), or a branch / tag (moving; needs `allowUnpinned`).
    #[serde(rename = "ref")]
    pub git_ref: Option<String>,
    /// The expected content digest (`sha256:<hex>` or bare hex); else E8013.
    pub sha256: Option<String>,
    /// Accept a moving ref.
    pub allow_unpinned: bool,
    /// Accept `file://` and `http://` sources.
    pub allow_insecure_transport: bool,
    /// The user confirmed the install (else E8012 with the plan).
    pub confirm: bool,
    /// Only return the plan: nothing is written.
    pub dry_run: bool,
    /// Replace an installed provider of the same id.
    pub replace: bool,
}

/// Where a provider came from.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ProviderSource {
    /// The source as given.
    pub url: String,
    /// The plugin root inside it.
    #[serde(default)]
    pub subdir: Option<String>,
    /// The ref asked for.
    #[serde(default, rename = "ref")]
    pub git_ref: Option<String>,
    /// The resolved commit (git).
    #[serde(default)]
    pub commit: Option<String>,
}

/// The provider an install replaced (or, for a dry run, would replace).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct PreviousInstall {
    /// Its version.
    pub version: String,
    /// Its digest.
    pub digest: String,
    /// Its commit (git sources).
    #[serde(default)]
    pub commit: Option<String>,
}

/// `provider/install` result: the installed provider, or the plan of a dry run.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct InstallPlan {
    /// Manifest id.
    pub id: String,
    /// Manifest name.
    pub name: String,
    /// Manifest version.
    pub version: String,
    /// Trust level it gets: `pinned`, `unpinned` or `local`.
    pub trust: String,
    /// Source, with the resolved commit.
    pub source: ProviderSource,
    /// Content digest (`sha256:<hex>`).
    pub digest: String,
    /// The manifest (`abx-provider.toml` as JSON, without secret defaults).
    pub manifest: Map<String, Value>,
    /// Declared security: `{network, filesystem, spawnsProcesses, ...}`.
    pub security: Map<String, Value>,
    /// The installed tree (absent for a dry run).
    #[serde(default)]
    pub path: Option<String>,
    /// False for a dry run.
    pub installed: bool,
    /// The provider this replaced, if any.
    #[serde(default)]
    pub previous: Option<PreviousInstall>,
}

/// `provider/uninstall` params.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct ProviderUninstallParams {
    /// Provider id.
    pub id: String,
    /// The user confirmed (else E8012).
    #[serde(default)]
    pub confirm: bool,
}

/// `provider/update` params.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct ProviderUpdateParams {
    /// Only this provider (default: every installed plugin).
    #[serde(default)]
    pub id: Option<String>,
    /// Only report what would change.
    #[serde(default)]
    pub check: bool,
    /// Another git ref to follow.
    #[serde(default, rename = "ref")]
    pub git_ref: Option<String>,
}

/// One provider's outcome of `provider/update`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct UpdateStatus {
    /// Provider id.
    pub id: String,
    /// Installed version.
    pub from: String,
    /// Available version (`null` on error).
    pub to: Option<String>,
    /// Installed digest.
    #[serde(default)]
    pub from_digest: Option<String>,
    /// Available digest.
    #[serde(default)]
    pub to_digest: Option<String>,
    /// `up-to-date`, `update-available`, `repair-available`, `updated`, `repaired` or `error`.
    pub status: String,
    /// Why it failed (`status: error`).
    #[serde(default)]
    pub error: Option<String>,
}

/// `provider/update` result.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct UpdateResult {
    /// One entry per provider considered.
    pub providers: Vec<UpdateStatus>,
}

/// One check of `provider/doctor`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct DoctorCheck {
    /// `installed`, `integrity`, `config`, `handshake` or `permissions`.
    pub name: String,
    /// Whether it passed.
    pub ok: bool,
    /// What was found.
    pub detail: String,
    /// The E-code of a failure.
    #[serde(default)]
    pub code: Option<String>,
}

/// `provider/doctor` result.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct DoctorResult {
    /// The checks, in order; they stop at the first integrity failure.
    pub checks: Vec<DoctorCheck>,
    /// Whether every check passed.
    pub ok: bool,
}

/// `provider/configure` params.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct ProviderConfigureParams {
    /// Provider id.
    pub id: String,
    /// Keys of the manifest's `[config]` and their values (`null` removes a value).
    pub values: Map<String, Value>,
}

/// `provider/configure` result.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ConfigureResult {
    /// The keys now stored.
    pub configured: Vec<String>,
}

/// `provider/test` params.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct ProviderTestParams {
    /// Provider id.
    pub id: String,
    /// Only the contract tests whose name contains this.
    #[serde(default)]
    pub filter: Option<String>,
    /// Tests run at once (default 16, at least 1): 1 for a provider whose sandboxes
    /// share one endpoint (`abx provider test ID --concurrency N`).
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(with = "Option<u64>", range(min = 1)))]
    pub concurrency: Option<usize>,
    /// The template every sandbox of the run is made from (default: the provider's own
    /// default), e.g. an OCI image on `local`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
}

/// One contract test of `provider/test`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct TestOutcome {
    /// Test name.
    pub name: String,
    /// `passed`, `failed` or `skipped`.
    pub outcome: String,
    /// Why it failed or was skipped.
    #[serde(default)]
    pub detail: Option<String>,
    /// How long it took.
    pub duration_ms: u64,
}

/// `provider/testResult` notification params: one finished test of `provider/test`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct TestResultNote {
    /// The provider under test.
    pub id: String,
    /// The test.
    #[serde(flatten)]
    pub test: TestOutcome,
}

/// `provider/test` result.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TestResult {
    /// Every test run.
    pub results: Vec<TestOutcome>,
    /// Count passed.
    pub passed: u64,
    /// Count failed.
    pub failed: u64,
    /// Count skipped.
    pub skipped: u64,
    /// Tests that ran at once.
    #[serde(default)]
    pub concurrency: Option<u64>,
}
