//! Installing a provider plugin (docs/design.md#providers): sources, pinning, confirmation, atomic install.
//!
//! **Sources.**
//! - A local directory (trust `local`): its files are *copied*, never referenced.
//! - A git URL through libgit2: `https://`; `file://` and `http://` are insecure transports
//!   and need `allow_insecure_transport`. The repository is cloned bare into the staging
//!   directory (libgit2 runs no hooks and checks nothing out); the plugin's files are then
//!   written from the commit's tree objects, so symlinks, submodules (gitlinks or a
//!   `.gitmodules` file) and unsafe names are refused before anything reaches the disk.
//! - An archive URL ending in `.tar.gz` / `.tgz` (`https://`, or `http://` with
//!   `allow_insecure_transport`), only with `sha256`: downloaded with reqwest (size-limited),
//!   listed with the system `tar` (any member that is not a regular file or a directory, an
//!   absolute name or a `..` component is refused) and only then extracted with
//!   `--no-same-owner --no-same-permissions`. When the archive holds a single top-level
//!   directory and no manifest at its root, that directory is the plugin root.
//!
//! `subdir` selects the plugin root inside the source (relative, no `..`).
//!
//! **Pinning.** `sha256` always pins the *content digest* of the plugin tree
//! ([`super::digest`]), never the bytes of an archive: the same value verifies a git, an
//! archive or a local source, and is what `provider info` shows. A `ref` that is a full
//! 40-hex commit id pins a git source; a branch, a tag or no ref at all is a moving ref,
//! refused unless `allow_unpinned` (trust `unpinned`) or `sha256` (trust `pinned`) is given.
//! An archive is pinned by its `sha256`; a local directory is always trust `local`.
//!
//! **Confirmation.** Without `confirm` (and not a dry run) the install is refused with the
//! exact command to re-run, keeping every flag given, plus the plan in `error.data.plan`.
//! A dry run returns the plan and writes nothing outside a private temp dir (removed).
//!
//! **Limits.** 64 MiB per file, 256 MiB per tree, 100 000 files, 256 MiB of archive,
//! 512 MiB of git transfer.
//!
//! **Atomicity.** Work happens in `data_dir/providers/.staging-<rand>/`. The tree is made
//! read-only (files 0444 / 0555, directories 0555), synced, renamed to
//! `data_dir/providers/<id>/<digest-16>/`, and only then recorded in the registry, all
//! under the registry lock; the previous tree of an update is removed after the record
//! changes. A crash at any point leaves the old record valid; leftovers are removed by
//! [`super::installed::cleanup_orphans`]. Dropping the future (a cancelled request) before
//! the commit point installs nothing.

use super::digest::{self, refused, TreeError};
use super::installed::{self, Installed, Source, Trust};
use abx_protocol::manifest::{self, Manifest, Security};
use abx_protocol::{AbxError, ErrorCode};
use serde::Serialize;
use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

mod archive;
mod dir;
mod git;

use archive::*;
use dir::*;
use git::*;

/// The caps of a plugin tree (the digest's, an install refuses a source past them).
pub use super::digest::{MAX_FILE, MAX_FILES, MAX_TREE};
/// Largest archive download.
pub const MAX_DOWNLOAD: u64 = 256 << 20;
/// Largest git transfer.
pub const MAX_FETCH: usize = 512 << 20;
const MAX_MANIFEST: u64 = 1 << 20;

/// The params of `provider/install` (docs/design.md#api; `replace` for updates): the API type.
pub type Request = abx_protocol::api::ProviderInstallParams;

/// An installed (or, for a dry run, installable) provider.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// Manifest id.
    pub id: String,
    /// Manifest name.
    pub name: String,
    /// Manifest version.
    pub version: String,
    /// Trust level it gets.
    pub trust: Trust,
    /// Source, with the resolved commit.
    pub source: Source,
    /// Content digest.
    pub digest: String,
    /// The manifest (serialized without secret defaults).
    pub manifest: Manifest,
    /// Declared security.
    pub security: Security,
    /// The installed tree (absent for a dry run).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// False for a dry run.
    pub installed: bool,
    /// The record this replaced (or, for a dry run, would conflict with / replace).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous: Option<Previous>,
}

/// The provider that was installed under the same id before.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Previous {
    /// Its version.
    pub version: String,
    /// Its digest.
    pub digest: String,
    /// Its commit (git sources).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
}

// ---------------------------------------------------------------------------------------
// Commands to re-run.

fn shell_quote(s: &str) -> String {
    let safe = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-./:=@%+,".contains(&b));
    if safe {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// The `abx provider install ...` command for a request: the source and every flag it
/// has, in a fixed order, ending with `--yes` (or `--dry-run` for a dry run).
pub fn command(req: &Request) -> String {
    let mut parts = vec![
        "abx".to_owned(),
        "provider".to_owned(),
        "install".to_owned(),
        shell_quote(&req.source),
    ];
    let mut opt = |flag: &str, v: &Option<String>| {
        if let Some(v) = v {
            parts.push(flag.to_owned());
            parts.push(shell_quote(v));
        }
    };
    opt("--subdir", &req.subdir);
    opt("--ref", &req.git_ref);
    opt("--sha256", &req.sha256);
    if req.allow_unpinned {
        parts.push("--allow-unpinned".into());
    }
    if req.allow_insecure_transport {
        parts.push("--allow-insecure-transport".into());
    }
    parts.push(if req.dry_run { "--dry-run" } else { "--yes" }.into());
    parts.join(" ")
}

// ---------------------------------------------------------------------------------------
// Classifying the source.

#[derive(Clone, Debug)]
enum Kind {
    Local(PathBuf),
    Git(String),
    Archive(String),
}

struct Classified {
    kind: Kind,
    subdir: Option<String>,
    sha256: Option<String>,
}

fn unreachable_source(source: &str, detail: impl std::fmt::Display) -> AbxError {
    AbxError::new(
        ErrorCode::SourceUnreachable,
        &[("source", source), ("detail", &detail.to_string())],
    )
}

fn usage(detail: impl Into<String>, suggestion: impl Into<String>) -> AbxError {
    AbxError::new(ErrorCode::Usage, &[("detail", &detail.into())]).with_suggestion(suggestion)
}

/// `a/./b/` -> `a/b`; refuses `..`, absolute paths and NUL.
fn normalize_subdir(req: &Request, s: &str) -> Result<Option<String>, AbxError> {
    let bad = || {
        let mut fixed = req.clone();
        fixed.subdir = Some("<dir>".into());
        refused(
            format!(
                "Refusing --subdir '{}': it must be a relative path inside the source (no '..', not absolute).",
                s.escape_debug()
            ),
            format!(
                "Give the plugin's directory relative to the source root: {}",
                command(&fixed)
            ),
        )
    };
    if s.starts_with('/') || s.contains('\0') || s.contains('\\') {
        return Err(bad());
    }
    let mut parts = Vec::new();
    for c in s.split('/') {
        match c {
            "" | "." => {}
            ".." => return Err(bad()),
            c => parts.push(c),
        }
    }
    Ok((!parts.is_empty()).then(|| parts.join("/")))
}

fn is_full_commit(r: &str) -> bool {
    r.len() == 40 && r.bytes().all(|b| b.is_ascii_hexdigit())
}

fn is_loopback(host: &str) -> bool {
    host == "localhost"
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn classify(req: &Request) -> Result<Classified, AbxError> {
    let source = req.source.trim();
    if source.is_empty() {
        return Err(AbxError::invalid_params(
            "provider/install",
            "'source' is required: a directory, a git URL or a .tar.gz URL",
        ));
    }
    let subdir = match &req.subdir {
        Some(s) => normalize_subdir(req, s)?,
        None => None,
    };
    let sha256 = match &req.sha256 {
        Some(d) => Some(digest::normalize(d).ok_or_else(|| {
            usage(
                "--sha256 must be a content digest: sha256:<64 hex digits>.",
                "Copy the digest shown by 'abx provider install --dry-run' or published by the provider's maintainer.",
            )
        })?),
        None => None,
    };
    let kind = if let Some(idx) = source.find("://") {
        let scheme = source[..idx].to_ascii_lowercase();
        let url = reqwest::Url::parse(source).map_err(|e| unreachable_source(source, e))?;
        if !url.username().is_empty() || url.password().is_some() {
            let mut clean = url.clone();
            let _ = clean.set_username("");
            let _ = clean.set_password(None);
            return Err(refused(
                format!("Refusing a source URL with credentials in it ({clean}): they would be stored and shown."),
                "Give the URL without 'user:password@'; abx installs public sources only.",
            ));
        }
        let insecure = match scheme.as_str() {
            "https" => false,
            "http" | "file" => true,
            _ => {
                return Err(unreachable_source(
                    source,
                    format!("the transport '{scheme}://' is not supported (use https://, or file:// / http:// with --allow-insecure-transport)"),
                ))
            }
        };
        let path = url.path().to_ascii_lowercase();
        let archive = scheme != "file" && (path.ends_with(".tar.gz") || path.ends_with(".tgz"));
        if insecure && !req.allow_insecure_transport {
            let mut fixed = req.clone();
            fixed.allow_insecure_transport = true;
            return Err(refused(
                format!(
                    "Refusing the insecure transport '{scheme}://' without --allow-insecure-transport (its content is not authenticated)."
                ),
                format!("If you trust this source, re-run: {}", command(&fixed)),
            ));
        }
        if archive {
            if req.git_ref.is_some() {
                return Err(usage(
                    "--ref applies to git sources, not to an archive URL.",
                    "Pin an archive with --sha256 <digest>.",
                ));
            }
            if sha256.is_none() && !req.dry_run {
                let mut fixed = req.clone();
                fixed.sha256 = Some("<digest>".into());
                return Err(refused(
                    "Refusing an archive source without --sha256 (an archive URL is not pinned).",
                    format!(
                        "Pin it with the digest published by its maintainer (or shown by --dry-run): {}",
                        command(&fixed)
                    ),
                ));
            }
            Kind::Archive(source.to_owned())
        } else {
            Kind::Git(source.to_owned())
        }
    } else {
        let p = Path::new(source);
        let md = fs::metadata(p).map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                unreachable_source(
                    source,
                    "no such directory (give a directory, a git URL or a .tar.gz URL)",
                )
            } else {
                unreachable_source(source, e)
            }
        })?;
        if !md.is_dir() {
            return Err(unreachable_source(source, "not a directory"));
        }
        if req.git_ref.is_some() {
            return Err(usage(
                "--ref applies to git sources; a local directory is installed as it is.",
                format!(
                    "Give its git URL instead to pick a commit: abx provider install file://{} --ref <commit> --allow-insecure-transport --yes",
                    fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf()).display()
                ),
            ));
        }
        let abs = fs::canonicalize(p).map_err(|e| unreachable_source(source, e))?;
        Kind::Local(abs)
    };
    Ok(Classified {
        kind,
        subdir,
        sha256,
    })
}

// ---------------------------------------------------------------------------------------
// Staging.

enum Stage {
    Registry(installed::Staging),
    Temp(PathBuf),
}

impl Stage {
    fn path(&self) -> &Path {
        match self {
            Stage::Registry(s) => &s.dir,
            Stage::Temp(p) => p,
        }
    }

    /// A private temp dir for a dry run (nothing under the data dir is touched).
    fn temp() -> Result<Stage, AbxError> {
        let base = std::env::temp_dir();
        for i in 0..16u32 {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let dir = base.join(format!(
                "abx-install-{}-{nanos:08x}{i:x}",
                std::process::id()
            ));
            match fs::DirBuilder::new().mode(0o700).create(&dir) {
                Ok(()) => return Ok(Stage::Temp(dir)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => {
                    return Err(AbxError::internal(format!(
                        "creating {}: {e}",
                        dir.display()
                    )))
                }
            }
        }
        Err(AbxError::internal("could not create a temp dir"))
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        if let Stage::Temp(p) = self {
            let _ = installed::force_remove_dir(p);
        }
    }
}

/// Sets the flag when the install future is dropped (a cancelled request).
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, AbxError> + Send + 'static,
) -> Result<T, AbxError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| AbxError::internal(format!("install task failed: {e}")))?
}

/// Install a provider (or plan it, for a dry run). See the module docs.
pub async fn install(data_dir: &Path, req: &Request) -> Result<Plan, AbxError> {
    let cls = classify(req)?;
    let cancelled = Arc::new(AtomicBool::new(false));
    let _guard = CancelOnDrop(cancelled.clone());
    let dd = data_dir.to_path_buf();
    let dry = req.dry_run;
    let stage = blocking(move || {
        if dry {
            Stage::temp()
        } else {
            installed::new_staging(&dd).map(Stage::Registry)
        }
    })
    .await?;
    if let Kind::Archive(url) = &cls.kind {
        download(
            url,
            &stage.path().join("download.tar.gz"),
            req.allow_insecure_transport,
        )
        .await?;
    }
    let dd = data_dir.to_path_buf();
    let req = req.clone();
    blocking(move || {
        let r = prepare(&dd, &req, cls, stage.path(), &cancelled);
        drop(stage);
        r
    })
    .await
}

// ---------------------------------------------------------------------------------------
// The blocking part.

fn prepare(
    data_dir: &Path,
    req: &Request,
    cls: Classified,
    work: &Path,
    cancelled: &AtomicBool,
) -> Result<Plan, AbxError> {
    let tree = work.join("tree");
    let mut source = Source {
        url: req.source.trim().to_owned(),
        subdir: cls.subdir.clone(),
        git_ref: req.git_ref.clone(),
        commit: None,
    };
    let mut trust = Trust::Local;
    match &cls.kind {
        Kind::Local(dir) => {
            source.url = dir.display().to_string();
            let root = local_root(dir, cls.subdir.as_deref(), &req.source)?;
            copy_tree(&root, &tree)?;
        }
        Kind::Git(url) => {
            let repo = clone(url, &work.join("repo"))?;
            let (oid, moving) = resolve(&repo, url, req.git_ref.as_deref())?;
            let commit = oid.to_string();
            if moving && !req.allow_unpinned && cls.sha256.is_none() && !req.dry_run {
                return Err(pin_refusal(req, &commit));
            }
            trust = if moving && cls.sha256.is_none() {
                Trust::Unpinned
            } else {
                Trust::Pinned
            };
            export_commit(&repo, oid, cls.subdir.as_deref(), &tree, url)?;
            source.commit = Some(commit);
        }
        Kind::Archive(url) => {
            let extracted = work.join("extract");
            extract(&work.join("download.tar.gz"), &extracted, url)?;
            let _ = fs::remove_file(work.join("download.tar.gz"));
            let top = archive_root(&extracted);
            let root = local_root(&top, cls.subdir.as_deref(), url)?;
            copy_tree(&root, &tree)?;
            trust = Trust::Pinned;
        }
    }

    let (manifest, text) = read_manifest(&tree, req)?;
    check_runtime(&tree, &manifest, &text)?;
    let digest = digest::dirhash(&tree)?;
    if let Some(want) = &cls.sha256 {
        if *want != digest {
            return Err(AbxError::new(
                ErrorCode::DigestMismatch,
                &[("expected", want), ("actual", &digest)],
            ));
        }
    }
    if matches!(cls.kind, Kind::Archive(_)) && cls.sha256.is_none() {
        // Only reachable in a dry run: say what a real install would need.
        trust = Trust::Unpinned;
    }

    let existing = installed::get(data_dir, &manifest.id);
    let mut plan = Plan {
        id: manifest.id.clone(),
        name: manifest.name.clone(),
        version: manifest.version.clone(),
        trust,
        source,
        digest,
        security: manifest.security.clone(),
        manifest,
        path: None,
        installed: false,
        previous: existing.as_ref().map(previous),
    };
    if req.dry_run {
        return Ok(plan);
    }
    if existing.is_some() && !req.replace {
        return Err(already_installed(&plan.id));
    }
    if !req.confirm {
        return Err(refused(
            "Installing a provider requires confirmation.",
            format!("Re-run with --yes after reviewing: {}", command(req)),
        )
        .with_data(
            "plan",
            serde_json::to_value(&plan).unwrap_or(serde_json::Value::Null),
        ));
    }
    commit(data_dir, req, &tree, &mut plan, cancelled)?;
    Ok(plan)
}

fn previous(r: &Installed) -> Previous {
    Previous {
        version: r.version.clone(),
        digest: r.digest.clone(),
        commit: r.source.commit.clone(),
    }
}

fn already_installed(id: &str) -> AbxError {
    AbxError::new(ErrorCode::AlreadyInstalled, &[("provider", id)])
}

fn pin_refusal(req: &Request, commit: &str) -> AbxError {
    let mut pinned = req.clone();
    pinned.git_ref = Some(commit.to_owned());
    let mut unpinned = req.clone();
    unpinned.allow_unpinned = true;
    refused(
        "Refusing an unpinned git source without review (--yes does not accept a moving ref).",
        format!(
            "Pin it: --ref {commit} (or --sha256 <digest>); or pass --allow-unpinned to accept the current head."
        ),
    )
    .with_data("commit", commit)
    .with_data("rerun", command(&pinned))
    .with_data("rerunUnpinned", command(&unpinned))
}

/// Make the staged tree read-only, move it into place and record it, under the lock.
fn commit(
    data_dir: &Path,
    req: &Request,
    tree: &Path,
    plan: &mut Plan,
    cancelled: &AtomicBool,
) -> Result<(), AbxError> {
    let io_err = |what: &str, e: io::Error| AbxError::internal(format!("{what}: {e}"));
    make_read_only(tree).map_err(|e| io_err("making the tree read-only", e))?;
    sync_fs(tree);

    let mut reg = installed::lock(data_dir)?;
    if cancelled.load(Ordering::SeqCst) {
        return Err(AbxError::new(ErrorCode::RequestCancelled, &[]));
    }
    let old = reg.get(&plan.id).cloned();
    if old.is_some() && !req.replace {
        return Err(already_installed(&plan.id));
    }
    let id_dir = installed::providers_dir(data_dir).join(&plan.id);
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&id_dir)
        .map_err(|e| io_err("creating the provider directory", e))?;
    let target = id_dir.join(digest::short(&plan.digest));
    let reuse = match fs::symlink_metadata(&target) {
        Err(_) => false,
        // The same content is there already (a reinstall): keep it if intact.
        Ok(_) if digest::dirhash_tree(&target).ok().as_deref() == Some(plan.digest.as_str()) => {
            true
        }
        Ok(_) => {
            installed::force_remove_dir(&target).map_err(|e| io_err("removing a stale tree", e))?;
            false
        }
    };
    if reuse {
        // Modes are not part of the digest (but for the execute bit): restore them.
        make_read_only(&target).map_err(|e| io_err("making the tree read-only", e))?;
    } else {
        fs::rename(tree, &target).map_err(|e| io_err("moving the tree into place", e))?;
        if let Ok(d) = fs::File::open(&id_dir) {
            let _ = d.sync_all();
        }
    }
    fs::set_permissions(&target, fs::Permissions::from_mode(0o555))
        .map_err(|e| io_err("making the tree read-only", e))?;
    let rec = Installed {
        id: plan.id.clone(),
        name: plan.name.clone(),
        version: plan.version.clone(),
        trust: plan.trust,
        source: plan.source.clone(),
        digest: plan.digest.clone(),
        path: target.clone(),
        installed_at: abx_home::util::rfc3339(abx_home::util::now_ms() / 1000),
        manifest: plan.manifest.clone(),
    };
    let prev = reg.put(rec);
    reg.save()?;
    if let Some(p) = &prev {
        if p.path != target {
            if let Err(e) = reg.remove_unreferenced_tree(&p.path) {
                tracing::warn!("removing the previous tree of '{}': {}", p.id, e.message);
            }
        }
    }
    drop(reg);
    tracing::info!(
        provider = %plan.id,
        version = %plan.version,
        trust = %plan.trust,
        digest = %plan.digest,
        "installed provider"
    );
    plan.previous = old.as_ref().map(previous);
    plan.path = Some(target);
    plan.installed = true;
    Ok(())
}

fn sync_fs(path: &Path) {
    if let Ok(f) = fs::File::open(path) {
        unsafe {
            libc::syncfs(f.as_raw_fd());
        }
    }
}

/// Files 0444 (0555 when executable), directories 0555; the root is left writable so it
/// can be renamed (it is made 0555 after the rename).
fn make_read_only(root: &Path) -> io::Result<()> {
    fn walk(dir: &Path, is_root: bool) -> io::Result<()> {
        for e in fs::read_dir(dir)? {
            let e = e?;
            let md = fs::symlink_metadata(e.path())?;
            if md.is_dir() {
                walk(&e.path(), false)?;
            } else if md.is_file() {
                let mode = if md.permissions().mode() & 0o111 != 0 {
                    0o555
                } else {
                    0o444
                };
                fs::set_permissions(e.path(), fs::Permissions::from_mode(mode))?;
            }
        }
        if !is_root {
            fs::set_permissions(dir, fs::Permissions::from_mode(0o555))?;
        }
        Ok(())
    }
    walk(root, true)
}

// ---------------------------------------------------------------------------------------
// Manifest and runtime checks.

fn manifest_error(detail: impl Into<String>) -> AbxError {
    AbxError::new(ErrorCode::InvalidManifest, &[("detail", &detail.into())])
}

fn read_manifest(tree: &Path, req: &Request) -> Result<(Manifest, String), AbxError> {
    let path = tree.join(manifest::FILE_NAME);
    match fs::symlink_metadata(&path) {
        Ok(md) if md.is_file() => {
            if md.len() > MAX_MANIFEST {
                return Err(manifest_error("the file is larger than 1 MiB."));
            }
            let bytes = fs::read(&path)
                .map_err(|e| AbxError::internal(format!("reading the manifest: {e}")))?;
            let text =
                String::from_utf8(bytes).map_err(|_| manifest_error("the file is not UTF-8."))?;
            let m = manifest::parse(&text)?;
            Ok((m, text))
        }
        Ok(_) => Err(manifest_error("it is not a regular file.")),
        Err(_) => {
            let missing = manifest_error("file not found at the plugin root.");
            if tree.join(manifest::OLD_FILE_NAME).exists() {
                return Err(missing.with_suggestion(
                    "This plugin still uses the pre-rename 'ebx-provider.toml'. Rename it to abx-provider.toml and rename its EBX_* variables to ABX_* (the plugin's maintainer must publish the update).",
                ));
            }
            // A manifest one level down: suggest --subdir.
            let mut found: Vec<String> = fs::read_dir(tree)
                .map(|rd| {
                    rd.flatten()
                        .filter(|e| e.path().join(manifest::FILE_NAME).is_file())
                        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            found.sort();
            match found.first() {
                Some(dir) => {
                    let mut fixed = req.clone();
                    let base = req.subdir.as_deref().map(|s| s.trim_end_matches('/'));
                    fixed.subdir = Some(match base {
                        Some(b) if !b.is_empty() => format!("{b}/{dir}"),
                        _ => dir.clone(),
                    });
                    Err(missing.with_suggestion(format!(
                        "The plugin is in '{dir}/': re-run with --subdir {}: {}",
                        fixed.subdir.as_deref().unwrap_or(dir),
                        command(&fixed)
                    )))
                }
                None => Err(missing),
            }
        }
    }
}

/// Line of the first line holding `needle` (quoted), else of `key =`.
fn line_for(text: &str, needle: &str, key: &str) -> usize {
    let quoted = [format!("\"{needle}\""), format!("'{needle}'")];
    text.lines()
        .position(|l| quoted.iter().any(|q| l.contains(q.as_str())))
        .or_else(|| text.lines().position(|l| l.trim_start().starts_with(key)))
        .map_or(1, |i| i + 1)
}

/// Every runtime argv entry that is a path must exist inside the tree; the program itself
/// must be an executable file when it is a path.
fn check_runtime(tree: &Path, m: &Manifest, text: &str) -> Result<(), AbxError> {
    for (i, rel) in m.runtime_paths() {
        let arg = &m.runtime.command[i];
        let line = line_for(text, arg, "command");
        let err = |what: &str| {
            manifest_error(format!(
                "line {line}, key 'runtime.command': '{}' {what}",
                arg.escape_debug()
            ))
        };
        if rel.split('/').any(|c| is_git_name(c.as_bytes())) {
            return Err(err("is inside .git, which is never installed."));
        }
        match fs::symlink_metadata(tree.join(&rel)) {
            Err(_) => return Err(err("is not in the plugin (file not found).")),
            Ok(md) if i == 0 && md.is_dir() => return Err(err("is a directory, not a program.")),
            Ok(md) if i == 0 && md.permissions().mode() & 0o111 == 0 => {
                return Err(err(
                    "is not executable (mark it executable, or run it through its interpreter, e.g. [\"sh\", \"./run.sh\"]).",
                ))
            }
            Ok(_) => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod archive_tests;
#[cfg(test)]
mod tests;
