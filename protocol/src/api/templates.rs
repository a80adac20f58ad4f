//! `templates/*` params and results as the builtin `local` provider has them (OCI images and
//! sandboxes saved as templates, issue 22), and the `templates/progress` notification. Other
//! providers may take and answer more (members a type does not name are passed through).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// `templates/pull`: fetch (or update) an image from its registry.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct TemplatesPullParams {
    /// Provider id (default: the default provider).
    #[serde(default)]
    pub provider: Option<String>,
    /// An image reference: `busybox:latest`, `registry.example/ns/img:tag`, `img@sha256:...`.
    #[serde(default)]
    pub template: Option<String>,
    /// Further provider-defined params.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// `templates/remove`: one template, or (`prune`) every one no live sandbox uses.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct TemplatesRemoveParams {
    /// Provider id (default: the default provider).
    #[serde(default)]
    pub provider: Option<String>,
    /// A name or digest (not with `prune`).
    #[serde(default)]
    pub template: Option<String>,
    /// Remove the images no name points at and no live sandbox uses.
    #[serde(default)]
    pub prune: Option<bool>,
    /// With `prune`: named ones too (still not those in use or the base of a built one).
    #[serde(default)]
    pub all: Option<bool>,
    /// Further provider-defined params.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// `templates/import`: an image archive from `docker save`, or an OCI image layout
/// directory (or a tar of one), read by the broker (same machine).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct TemplatesImportParams {
    /// Provider id (default: the default provider).
    #[serde(default)]
    pub provider: Option<String>,
    /// The archive or directory on the broker's machine.
    #[serde(default)]
    pub path: Option<String>,
    /// The name to give it (default: the archive's own tag, else `imported`).
    #[serde(default)]
    pub name: Option<String>,
    /// OCI layout: the `org.opencontainers.image.ref.name` to pick (default: the first).
    #[serde(default)]
    pub tag: Option<String>,
    /// Further provider-defined params.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// `templates/build`, in one of two forms: save a sandbox's filesystem changes as a new
/// template (a new layer on its base image: `sandbox`), or build a Dockerfile in a context
/// directory on the broker's machine (`context`, issue 49). Not both.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct TemplatesBuildParams {
    /// Provider id (default: the sandbox's, else the default provider).
    #[serde(default)]
    pub provider: Option<String>,
    /// The sandbox to save (made from an image template).
    #[serde(default)]
    pub sandbox: Option<String>,
    /// The new template's name.
    #[serde(default)]
    pub name: Option<String>,
    /// Dockerfile form: the build context, an absolute directory on the broker's machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    /// Dockerfile form: the Dockerfile, a path relative to the context (default `Dockerfile`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dockerfile: Option<String>,
    /// Dockerfile form: values of the Dockerfile's `ARG`s.
    #[serde(rename = "buildArgs", default, skip_serializing_if = "Option::is_none")]
    pub build_args: Option<std::collections::BTreeMap<String, String>>,
    /// Dockerfile form: the stage to build (default: the last).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Dockerfile form: the `RUN` steps' network, as sandbox/create's `network` (default `none`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(with = "Option<super::NetworkSpec>"))]
    pub network: Option<Value>,
    /// Dockerfile form: do not use the build cache (every step runs; results still cached).
    #[serde(rename = "noCache", default, skip_serializing_if = "Option::is_none")]
    pub no_cache: Option<bool>,
    /// Further provider-defined params.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// One template (`templates/list`, and the result of pull, import and build).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct TemplateInfo {
    /// The name it was pulled, imported or built as (`base`: the host system).
    pub name: String,
    /// Every name that points at it.
    #[serde(default)]
    pub names: Vec<String>,
    /// Its manifest digest (`sha256:...`; null for `base`).
    #[serde(default)]
    pub digest: Option<String>,
    /// Bytes of its blobs.
    #[serde(default)]
    pub size: u64,
    /// When it was stored (RFC 3339 UTC; null for `base`).
    #[serde(default)]
    pub pulled_at: Option<String>,
    /// `registry`, `import`, `build` or `host`.
    #[serde(default)]
    pub source: Option<String>,
    /// The template it was built on (`build`).
    #[serde(default)]
    pub base: Option<String>,
    /// Its image config: env, workingDir, user, entrypoint, cmd.
    #[serde(default)]
    pub config: Option<Value>,
    /// Further provider-defined fields.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// `templates/list` result.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TemplateList {
    /// The templates, `base` first.
    pub templates: Vec<TemplateInfo>,
}

/// `templates/remove` result.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct TemplatesRemoved {
    /// Digests of the removed images.
    pub removed: Vec<String>,
    /// Bytes of blobs freed.
    #[serde(default)]
    pub freed_bytes: u64,
}

/// `templates/progress`: progress of a `templates/pull` or a Dockerfile `templates/build`
/// (to the caller).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TemplatesProgress {
    /// The reference being pulled, or the name being built.
    pub template: String,
    /// Pull: bytes of blobs done (already stored ones count as done). Build: steps done.
    pub bytes: u64,
    /// Pull: bytes of the image's blobs. Build: the number of steps.
    pub total: u64,
    /// Pull: `manifest`, a blob digest, or `unpacked`. Build: the step as docker names it,
    /// `[2/5] RUN make`.
    pub step: String,
    /// Build: a line of a `RUN`'s output, or a status line of the step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<String>,
    /// Build: the step was a cache hit (it did no work).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached: Option<bool>,
}

/// `templates/init`: write a starter Dockerfile (and what it needs) for a language into a
/// directory on the broker's machine.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(inline))]
pub struct TemplatesInitParams {
    /// Provider id (default: the default provider).
    #[serde(default)]
    pub provider: Option<String>,
    /// The language to start from (`python`, `node`, ...).
    #[serde(default)]
    pub language: Option<String>,
    /// The directory to write into, absolute, on the broker's machine.
    #[serde(default)]
    pub path: Option<String>,
    /// Overwrite files that exist (else E4006 naming the first, nothing written).
    #[serde(default)]
    pub force: Option<bool>,
    /// Further provider-defined params.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// `templates/init` result.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TemplatesInitResult {
    /// The directory written into.
    pub path: String,
    /// The files written (paths).
    #[serde(default)]
    pub files: Vec<String>,
    /// The image the Dockerfile's `FROM` names.
    pub from: String,
    /// How to get that image, if it is not in the store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
    /// The language written for (its canonical name: `js` gives `node`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    /// The template name the scaffold's README builds (`abx template build DIR -t NAME`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}
