//! Installing a provider plugin (DESIGN §6): sources, pinning, confirmation, atomic install.
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
use serde::{Deserialize, Serialize};
use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Largest file in a plugin tree.
pub const MAX_FILE: u64 = 64 << 20;
/// Largest plugin tree (sum of file sizes).
pub const MAX_TREE: u64 = 256 << 20;
/// Most files in a plugin tree.
pub const MAX_FILES: usize = 100_000;
/// Largest archive download.
pub const MAX_DOWNLOAD: u64 = 256 << 20;
/// Largest git transfer.
pub const MAX_FETCH: usize = 512 << 20;
const MAX_MANIFEST: u64 = 1 << 20;

/// The params of `provider/install` (DESIGN §4), plus `replace` for updates.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Request {
    /// A local directory, a git URL or an archive URL.
    pub source: String,
    /// The plugin root inside the source.
    pub subdir: Option<String>,
    /// Git: a full commit id (pinned), or a branch / tag (moving).
    #[serde(rename = "ref")]
    pub git_ref: Option<String>,
    /// The expected content digest (`sha256:<hex>` or bare hex).
    pub sha256: Option<String>,
    /// Accept a moving ref.
    pub allow_unpinned: bool,
    /// Accept `file://` and `http://`.
    pub allow_insecure_transport: bool,
    /// The user confirmed (`--yes`, a prompt, `confirm: true`).
    pub confirm: bool,
    /// Only return the plan.
    pub dry_run: bool,
    /// Replace an installed provider of the same id (update).
    pub replace: bool,
}

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
// Local trees (directories and extracted archives).

/// `root/subdir`, refusing symlinks on the way.
fn local_root(root: &Path, subdir: Option<&str>, source: &str) -> Result<PathBuf, AbxError> {
    let mut p = root.to_path_buf();
    let Some(sd) = subdir else { return Ok(p) };
    let mut rel = String::new();
    for c in sd.split('/') {
        p.push(c);
        if !rel.is_empty() {
            rel.push('/');
        }
        rel.push_str(c);
        match fs::symlink_metadata(&p) {
            Ok(md) if md.file_type().is_symlink() => {
                return Err(TreeError::Special {
                    path: rel,
                    kind: "symlink",
                }
                .refusal())
            }
            Ok(md) if md.is_dir() => {}
            Ok(_) => {
                return Err(unreachable_source(
                    source,
                    format!("'{rel}' is not a directory (--subdir)"),
                ))
            }
            Err(_) => {
                return Err(unreachable_source(
                    source,
                    format!("no directory '{sd}' in the source (--subdir)"),
                ))
            }
        }
    }
    Ok(p)
}

fn too_big(detail: String) -> AbxError {
    refused(
        detail,
        "Provider trees are limited to 64 MiB per file and 256 MiB in all; ask the provider's maintainer to slim it down.",
    )
}

fn submodule(path: &str) -> AbxError {
    refused(
        format!("Refusing a provider source with a git submodule or nested repository at '{path}'."),
        "Submodules are never installed; ask the provider's maintainer to vendor the files instead.",
    )
}

fn is_git_name(name: &[u8]) -> bool {
    name.eq_ignore_ascii_case(b".git")
}

/// Copy a directory tree (regular files and directories only) into `dest`.
fn copy_tree(src: &Path, dest: &Path) -> Result<(), AbxError> {
    let entries = digest::walk(src).map_err(|e| e.refusal())?;
    if entries.len() > MAX_FILES {
        return Err(too_big(format!(
            "Refusing a provider source with more than {MAX_FILES} files."
        )));
    }
    let mut total = 0u64;
    for e in &entries {
        let rel = digest::show(&e.rel);
        let comps: Vec<&[u8]> = e.rel.split(|b| *b == b'/').collect();
        if comps.iter().any(|c| *c == b".gitmodules") {
            return Err(submodule(&rel));
        }
        if let Some(i) = comps.iter().position(|c| is_git_name(c)) {
            return Err(submodule(&digest::show(&comps[..i].join(&b'/'))));
        }
        if e.size > MAX_FILE {
            return Err(too_big(format!(
                "Refusing a provider source with a file over 64 MiB: '{rel}' ({} bytes).",
                e.size
            )));
        }
        total += e.size;
        if total > MAX_TREE {
            return Err(too_big(
                "Refusing a provider source over 256 MiB in all.".to_string(),
            ));
        }
    }
    mkdir(dest)?;
    for e in &entries {
        let rel = std::ffi::OsStr::from_bytes(&e.rel);
        let to = dest.join(rel);
        if let Some(parent) = to.parent() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)
                .map_err(|err| {
                    AbxError::internal(format!("creating {}: {err}", parent.display()))
                })?;
        }
        let from = digest::open_regular(&e.abs, &e.rel).map_err(|err| err.refusal())?;
        let mut out = create_file(&to, e.exec)?;
        let n = io::copy(&mut from.take(MAX_FILE + 1), &mut out).map_err(|err| {
            AbxError::internal(format!("copying '{}': {err}", digest::show(&e.rel)))
        })?;
        if n > MAX_FILE {
            return Err(too_big(format!(
                "Refusing a provider source with a file over 64 MiB: '{}'.",
                digest::show(&e.rel)
            )));
        }
    }
    Ok(())
}

fn mkdir(p: &Path) -> Result<(), AbxError> {
    fs::DirBuilder::new()
        .mode(0o700)
        .create(p)
        .map_err(|e| AbxError::internal(format!("creating {}: {e}", p.display())))
}

fn create_file(p: &Path, exec: bool) -> Result<fs::File, AbxError> {
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(if exec { 0o755 } else { 0o644 })
        .open(p)
        .map_err(|e| AbxError::internal(format!("creating {}: {e}", p.display())))
}

// ---------------------------------------------------------------------------------------
// Git.

fn git_error(url: &str, e: &git2::Error) -> AbxError {
    unreachable_source(url, e.message())
}

fn clone(url: &str, dest: &Path) -> Result<git2::Repository, AbxError> {
    let over = Arc::new(AtomicBool::new(false));
    let flag = over.clone();
    let mut cb = git2::RemoteCallbacks::new();
    cb.transfer_progress(move |p| {
        if p.received_bytes() > MAX_FETCH {
            flag.store(true, Ordering::SeqCst);
            false
        } else {
            true
        }
    });
    let mut fo = git2::FetchOptions::new();
    fo.remote_callbacks(cb);
    fo.download_tags(git2::AutotagOption::All);
    let mut b = git2::build::RepoBuilder::new();
    b.bare(true)
        .clone_local(git2::build::CloneLocal::None)
        .fetch_options(fo);
    b.clone(url, dest).map_err(|e| {
        if over.load(Ordering::SeqCst) {
            too_big("Refusing a git source: the repository transfer exceeds 512 MiB.".into())
        } else {
            git_error(url, &e)
        }
    })
}

/// The commit to install and whether it came from a moving ref.
fn resolve(
    repo: &git2::Repository,
    url: &str,
    git_ref: Option<&str>,
) -> Result<(git2::Oid, bool), AbxError> {
    match git_ref {
        Some(r) if is_full_commit(r) => {
            let oid = git2::Oid::from_str(r).map_err(|e| git_error(url, &e))?;
            if repo.find_commit(oid).is_err() {
                // Not reachable from a branch or tag: ask for it by id.
                if let Ok(mut remote) = repo.remote_anonymous(url) {
                    let _ = remote.fetch(&[r], None, None);
                }
            }
            repo.find_commit(oid).map(|c| (c.id(), false)).map_err(|_| {
                unreachable_source(url, format!("commit {r} is not in the repository"))
            })
        }
        Some(r) => {
            let names = [
                format!("refs/remotes/origin/{r}"),
                format!("refs/heads/{r}"),
                format!("refs/tags/{r}"),
                r.to_owned(),
            ];
            for n in &names {
                if let Ok(obj) = repo.revparse_single(n) {
                    if let Ok(c) = obj.peel_to_commit() {
                        return Ok((c.id(), true));
                    }
                }
            }
            Err(unreachable_source(
                url,
                format!(
                    "no branch, tag or commit '{}' in the repository",
                    r.escape_debug()
                ),
            ))
        }
        None => {
            let head = repo
                .head()
                .and_then(|h| h.peel_to_commit())
                .map_err(|e| git_error(url, &e))?;
            Ok((head.id(), true))
        }
    }
}

const MODE_TREE: i32 = 0o040000;
const MODE_BLOB: i32 = 0o100644;
const MODE_BLOB_GROUP: i32 = 0o100664;
const MODE_EXEC: i32 = 0o100755;
const MODE_LINK: i32 = 0o120000;
const MODE_COMMIT: i32 = 0o160000;

/// Write the files of `commit` (below `subdir`) into `dest`, from the object database.
fn export_commit(
    repo: &git2::Repository,
    oid: git2::Oid,
    subdir: Option<&str>,
    dest: &Path,
    url: &str,
) -> Result<(), AbxError> {
    let short = &oid.to_string()[..8];
    let commit = repo.find_commit(oid).map_err(|e| git_error(url, &e))?;
    let mut tree = commit.tree().map_err(|e| git_error(url, &e))?;
    if let Some(sd) = subdir {
        // Walk the path one component at a time so a symlink or submodule on the way is named.
        let mut rel = String::new();
        for c in sd.split('/') {
            if !rel.is_empty() {
                rel.push('/');
            }
            rel.push_str(c);
            let entry = tree.get_name(c).ok_or_else(|| {
                unreachable_source(
                    url,
                    format!("no directory '{sd}' at commit {short} (--subdir)"),
                )
            })?;
            let (mode, id) = (entry.filemode(), entry.id());
            drop(entry);
            match mode {
                MODE_TREE => {
                    tree = repo.find_tree(id).map_err(|e| git_error(url, &e))?;
                }
                MODE_LINK => {
                    return Err(TreeError::Special {
                        path: rel,
                        kind: "symlink",
                    }
                    .refusal())
                }
                MODE_COMMIT => return Err(submodule(&rel)),
                _ => {
                    return Err(unreachable_source(
                        url,
                        format!("'{rel}' is not a directory at commit {short} (--subdir)"),
                    ))
                }
            }
        }
    }
    let odb = repo.odb().map_err(|e| git_error(url, &e))?;
    mkdir(dest)?;
    let mut total = 0u64;
    let mut files = 0usize;
    let mut stack: Vec<(git2::Tree, PathBuf, String)> =
        vec![(tree, dest.to_path_buf(), String::new())];
    while let Some((tree, dir, prefix)) = stack.pop() {
        for entry in tree.iter() {
            let name = entry.name_bytes();
            let rel = if prefix.is_empty() {
                digest::show(name)
            } else {
                format!("{prefix}/{}", digest::show(name))
            };
            if name.is_empty()
                || name == b"."
                || name == b".."
                || name.contains(&b'/')
                || name.contains(&b'\0')
                || name.contains(&b'\n')
            {
                return Err(refused(
                    format!("Refusing a provider source with an unsafe file name: '{rel}'."),
                    "Ask the provider's maintainer to rename it.",
                ));
            }
            if is_git_name(name) || name == b".gitmodules" {
                return Err(submodule(&rel));
            }
            let path = dir.join(std::ffi::OsStr::from_bytes(name));
            match entry.filemode() {
                MODE_TREE => {
                    let sub = repo.find_tree(entry.id()).map_err(|e| git_error(url, &e))?;
                    mkdir(&path)?;
                    stack.push((sub, path, rel));
                }
                mode @ (MODE_BLOB | MODE_BLOB_GROUP | MODE_EXEC) => {
                    let (size, _) = odb
                        .read_header(entry.id())
                        .map_err(|e| git_error(url, &e))?;
                    let size = size as u64;
                    if size > MAX_FILE {
                        return Err(too_big(format!(
                            "Refusing a provider source with a file over 64 MiB: '{rel}' ({size} bytes)."
                        )));
                    }
                    total += size;
                    files += 1;
                    if total > MAX_TREE {
                        return Err(too_big(
                            "Refusing a provider source over 256 MiB in all.".into(),
                        ));
                    }
                    if files > MAX_FILES {
                        return Err(too_big(format!(
                            "Refusing a provider source with more than {MAX_FILES} files."
                        )));
                    }
                    let blob = repo.find_blob(entry.id()).map_err(|e| git_error(url, &e))?;
                    let mut f = create_file(&path, mode == MODE_EXEC)?;
                    f.write_all(blob.content())
                        .map_err(|e| AbxError::internal(format!("writing '{rel}': {e}")))?;
                }
                MODE_LINK => {
                    return Err(TreeError::Special {
                        path: rel,
                        kind: "symlink",
                    }
                    .refusal())
                }
                MODE_COMMIT => return Err(submodule(&rel)),
                _ => {
                    return Err(TreeError::Special {
                        path: rel,
                        kind: "special file",
                    }
                    .refusal())
                }
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Archives.

async fn download(url: &str, dest: &Path, allow_insecure: bool) -> Result<(), AbxError> {
    use tokio::io::AsyncWriteExt;
    let parsed = reqwest::Url::parse(url).map_err(|e| unreachable_source(url, e))?;
    let policy = reqwest::redirect::Policy::custom(move |attempt| {
        if attempt.previous().len() >= 10 {
            attempt.error("too many redirects")
        } else if attempt.url().scheme() != "https" && !allow_insecure {
            attempt.error("redirected to an insecure URL (--allow-insecure-transport accepts it)")
        } else {
            attempt.follow()
        }
    });
    let mut builder = reqwest::Client::builder()
        .redirect(policy)
        .connect_timeout(std::time::Duration::from_secs(30))
        .timeout(std::time::Duration::from_secs(600))
        .user_agent(concat!("abx/", env!("CARGO_PKG_VERSION")));
    if parsed.host_str().is_some_and(is_loopback) {
        builder = builder.no_proxy();
    }
    let client = builder.build().map_err(|e| unreachable_source(url, e))?;
    let fail = |e: reqwest::Error| {
        let mut detail = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            detail.push_str(": ");
            detail.push_str(&s.to_string());
            src = s.source();
        }
        unreachable_source(url, detail)
    };
    let mut resp = client.get(parsed).send().await.map_err(fail)?;
    if !resp.status().is_success() {
        return Err(unreachable_source(url, format!("HTTP {}", resp.status())));
    }
    let over = || too_big("Refusing an archive over 256 MiB.".to_string());
    if resp.content_length().is_some_and(|n| n > MAX_DOWNLOAD) {
        return Err(over());
    }
    let mut file = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dest)
        .await
        .map_err(|e| AbxError::internal(format!("creating {}: {e}", dest.display())))?;
    let mut got = 0u64;
    while let Some(chunk) = resp.chunk().await.map_err(fail)? {
        got += chunk.len() as u64;
        if got > MAX_DOWNLOAD {
            return Err(over());
        }
        file.write_all(&chunk)
            .await
            .map_err(|e| AbxError::internal(format!("writing {}: {e}", dest.display())))?;
    }
    file.flush()
        .await
        .map_err(|e| AbxError::internal(format!("writing {}: {e}", dest.display())))?;
    Ok(())
}

/// One member of `tar -tv` output: type char, size, name.
fn parse_listing_line(line: &str) -> Option<(char, u64, &str)> {
    let kind = line.chars().next()?;
    let mut rest = line;
    let mut fields = Vec::with_capacity(5);
    for _ in 0..5 {
        rest = rest.trim_start();
        let end = rest.find(char::is_whitespace)?;
        fields.push(&rest[..end]);
        rest = &rest[end..];
    }
    let name = rest.strip_prefix(' ')?;
    // Devices list "major,minor" where the size would be: only files need a size.
    let size = match fields[2].parse() {
        Ok(n) => n,
        Err(_) if kind != '-' => 0,
        Err(_) => return None,
    };
    Some((kind, size, name))
}

fn tar(args: &[&std::ffi::OsStr]) -> io::Result<std::process::Output> {
    Command::new("tar")
        .args(args)
        .env("LC_ALL", "C")
        .env("TZ", "UTC")
        .stdin(std::process::Stdio::null())
        .output()
}

/// List (and refuse anything but plain files and directories with safe names), then extract.
fn extract(archive: &Path, dest: &Path, url: &str) -> Result<(), AbxError> {
    let bad_archive = |detail: String| unreachable_source(url, detail);
    let out = tar(&[
        "--list".as_ref(),
        "--verbose".as_ref(),
        "--gzip".as_ref(),
        "--file".as_ref(),
        archive.as_os_str(),
    ])
    .map_err(|e| AbxError::internal(format!("running tar: {e}")))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(bad_archive(format!(
            "not a .tar.gz archive ({})",
            err.lines().next().unwrap_or("tar failed").trim()
        )));
    }
    let listing = String::from_utf8_lossy(&out.stdout);
    let mut total = 0u64;
    let mut count = 0usize;
    for line in listing.lines().filter(|l| !l.is_empty()) {
        let Some((kind, size, name)) = parse_listing_line(line) else {
            return Err(bad_archive(format!(
                "unreadable archive listing: {}",
                line.escape_debug()
            )));
        };
        let clean = name.trim_end_matches('/');
        match kind {
            '-' | 'd' => {}
            'l' => {
                let n = clean.split(" -> ").next().unwrap_or(clean);
                return Err(TreeError::Special {
                    path: n.to_owned(),
                    kind: "symlink",
                }
                .refusal());
            }
            'h' => {
                let n = clean.split(" link to ").next().unwrap_or(clean);
                return Err(TreeError::Special {
                    path: n.to_owned(),
                    kind: "hard link",
                }
                .refusal());
            }
            'c' | 'b' => {
                return Err(TreeError::Special {
                    path: clean.to_owned(),
                    kind: "device",
                }
                .refusal())
            }
            'p' => {
                return Err(TreeError::Special {
                    path: clean.to_owned(),
                    kind: "fifo",
                }
                .refusal())
            }
            _ => {
                return Err(TreeError::Special {
                    path: clean.to_owned(),
                    kind: "special file",
                }
                .refusal())
            }
        }
        if clean.starts_with('/') || clean.split('/').any(|c| c == "..") {
            return Err(refused(
                format!(
                    "Refusing an archive with a member outside its root: '{}'.",
                    clean.escape_debug()
                ),
                "Ask the provider's maintainer to publish an archive with relative paths only.",
            ));
        }
        if kind == '-' {
            if size > MAX_FILE {
                return Err(too_big(format!(
                    "Refusing a provider source with a file over 64 MiB: '{clean}' ({size} bytes)."
                )));
            }
            total += size;
            count += 1;
            if total > MAX_TREE {
                return Err(too_big(
                    "Refusing a provider source over 256 MiB in all.".into(),
                ));
            }
            if count > MAX_FILES {
                return Err(too_big(format!(
                    "Refusing a provider source with more than {MAX_FILES} files."
                )));
            }
        }
    }
    mkdir(dest)?;
    let out = tar(&[
        "--extract".as_ref(),
        "--gzip".as_ref(),
        "--file".as_ref(),
        archive.as_os_str(),
        "--directory".as_ref(),
        dest.as_os_str(),
        "--no-same-owner".as_ref(),
        "--no-same-permissions".as_ref(),
        "--no-overwrite-dir".as_ref(),
    ])
    .map_err(|e| AbxError::internal(format!("running tar: {e}")))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(bad_archive(format!(
            "extracting failed ({})",
            err.lines().next().unwrap_or("tar failed").trim()
        )));
    }
    Ok(())
}

/// The plugin root of an extracted archive: the top, or its single directory when the top
/// has no manifest.
fn archive_root(top: &Path) -> PathBuf {
    if top.join(manifest::FILE_NAME).exists() || top.join(manifest::OLD_FILE_NAME).exists() {
        return top.to_path_buf();
    }
    let entries: Vec<_> = fs::read_dir(top)
        .map(|rd| rd.flatten().collect())
        .unwrap_or_default();
    if let [only] = entries.as_slice() {
        if fs::symlink_metadata(only.path()).is_ok_and(|m| m.is_dir()) {
            return only.path();
        }
    }
    top.to_path_buf()
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
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::os::unix::fs::{symlink, MetadataExt};
    use std::process::Stdio;

    const COMMIT: &str = "c410c3261381a56afca212d26ef59a065ab52c27";

    fn manifest_text(id: &str) -> String {
        format!(
            r#"schema = 1
id = "{id}"
name = "Test {id}"
version = "0.1.0"
protocol = "EPP/1"
description = "A test provider."
features = ["sandbox.lifecycle", "exec.run"]

[runtime]
command = ["sh", "./provider.sh"]

[config.api_key]
description = "Key"
secret = true
default = "sk-SECRET-DEFAULT"

[security]
network = ["*"]
filesystem = ["data_dir"]
"#
        )
    }

    /// A plugin directory: `root/<sub>/` with a manifest, a script and a nested file.
    fn plugin_dir(root: &Path, id: &str) {
        fs::create_dir_all(root.join("lib")).unwrap();
        fs::write(root.join(manifest::FILE_NAME), manifest_text(id)).unwrap();
        fs::write(root.join("provider.sh"), "#!/bin/sh\necho hi\n").unwrap();
        fs::set_permissions(root.join("provider.sh"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(root.join("lib/util.sh"), "x=1\n").unwrap();
    }

    fn git(dir: &Path, args: &[&str]) -> String {
        let out = Command::new("git")
            .args([
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@example.com",
                "-c",
                "init.defaultBranch=main",
                "-c",
                "protocol.file.allow=always",
                "-c",
                "commit.gpgsign=false",
            ])
            .args(args)
            .current_dir(dir)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("HOME", dir)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    /// A git repo with the plugin under `opensandbox/`; returns (file:// url, head commit).
    fn repo(base: &Path, id: &str) -> (String, String) {
        let r = base.join(format!("repo-{id}"));
        fs::create_dir_all(&r).unwrap();
        git(&r, &["init", "-q"]);
        plugin_dir(&r.join("opensandbox"), id);
        fs::write(r.join("README.md"), "repo\n").unwrap();
        git(&r, &["add", "-A"]);
        git(&r, &["commit", "-q", "-m", "one"]);
        let head = git(&r, &["rev-parse", "HEAD"]);
        (format!("file://{}", r.display()), head)
    }

    fn commit_all(url: &str, msg: &str) -> String {
        let r = Path::new(url.strip_prefix("file://").unwrap());
        git(r, &["add", "-A"]);
        git(r, &["commit", "-q", "-m", msg]);
        git(r, &["rev-parse", "HEAD"])
    }

    fn req(source: &str) -> Request {
        Request {
            source: source.into(),
            ..Request::default()
        }
    }

    fn git_req(url: &str, commit: &str) -> Request {
        Request {
            source: url.into(),
            subdir: Some("opensandbox".into()),
            git_ref: Some(commit.into()),
            allow_insecure_transport: true,
            confirm: true,
            ..Request::default()
        }
    }

    struct Env {
        _t: tempfile::TempDir,
        base: PathBuf,
        data: PathBuf,
    }

    fn env() -> Env {
        let t = tempfile::tempdir().unwrap();
        let base = t.path().to_path_buf();
        let data = base.join("data");
        Env { _t: t, base, data }
    }

    /// Everything under `dir`, relative, sorted.
    fn listing(dir: &Path) -> Vec<String> {
        let mut out = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            let Ok(rd) = fs::read_dir(&d) else { continue };
            for e in rd.flatten() {
                let p = e.path();
                out.push(p.strip_prefix(dir).unwrap().display().to_string());
                if fs::symlink_metadata(&p).unwrap().is_dir() {
                    stack.push(p);
                }
            }
        }
        out.sort();
        out
    }

    /// Nothing but the lock, the registry and the trees it records is under providers/.
    fn assert_clean(data: &Path) {
        let base = installed::providers_dir(data);
        let recs = installed::load(data);
        let left: Vec<String> = listing(&base)
            .into_iter()
            .filter(|p| p != ".lock" && p != "installed.json")
            .filter(|p| {
                let abs = base.join(p);
                !recs
                    .iter()
                    .any(|r| abs.starts_with(&r.path) || r.path.parent() == Some(abs.as_path()))
            })
            .collect();
        assert!(left.is_empty(), "left behind: {left:?}");
    }

    fn refused_code(e: &AbxError) {
        assert_eq!(e.code, ErrorCode::Refused, "{e} / {}", e.suggestion);
        assert_eq!(e.code.exit_code(), 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn git_pinned_install_is_read_only_and_verified() {
        let env = env();
        let (url, head) = repo(&env.base, "opensandbox");
        let plan = install(&env.data, &git_req(&url, &head)).await.unwrap();
        assert!(plan.installed);
        assert_eq!(plan.trust, Trust::Pinned);
        assert_eq!(plan.source.commit.as_deref(), Some(head.as_str()));
        assert_eq!(plan.source.subdir.as_deref(), Some("opensandbox"));
        assert_eq!(plan.version, "0.1.0");
        let path = plan.path.clone().unwrap();
        assert_eq!(
            path,
            installed::providers_dir(&env.data)
                .join("opensandbox")
                .join(digest::short(&plan.digest))
        );
        // The digest is that of the plugin directory itself.
        let src_dir = Path::new(url.strip_prefix("file://").unwrap()).join("opensandbox");
        assert_eq!(digest::dirhash(&src_dir).unwrap(), plan.digest);
        digest::verify(&path, &plan.digest, "opensandbox").unwrap();
        // Read-only: files 0444/0555, directories 0555.
        let mode = |p: &Path| fs::symlink_metadata(p).unwrap().mode() & 0o777;
        assert_eq!(mode(&path), 0o555);
        assert_eq!(mode(&path.join("lib")), 0o555);
        assert_eq!(mode(&path.join("provider.sh")), 0o555);
        assert_eq!(mode(&path.join("abx-provider.toml")), 0o444);
        assert!(!path.join("README.md").exists());
        // Recorded.
        let rec = installed::get(&env.data, "opensandbox").unwrap();
        assert_eq!(rec.path, path);
        assert_eq!(rec.trust, Trust::Pinned);
        assert_eq!(rec.source.git_ref.as_deref(), Some(head.as_str()));
        assert!(rec.installed_at.ends_with('Z'));
        // The plan never shows the secret default; the full manifest still has it.
        let json = serde_json::to_string(&plan).unwrap();
        assert!(!json.contains("SECRET"), "{json}");
        let full = installed::full_manifest(&rec).unwrap();
        assert!(full.config["api_key"].default.is_some());
        assert_clean(&env.data);

        // Same id again: E8015.
        let e = install(&env.data, &git_req(&url, &head)).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::AlreadyInstalled);
        assert_eq!(
            e.to_string(),
            "[E8015] Provider 'opensandbox' is already installed."
        );
        assert_clean(&env.data);

        // Tampering is caught, and a reinstall (replace) repairs it.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        fs::set_permissions(path.join("lib"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(path.join("lib/evil.sh"), "rm -rf /").unwrap();
        let e = digest::verify(&path, &plan.digest, "opensandbox").unwrap_err();
        assert_eq!(e.code, ErrorCode::IntegrityFailed);
        let mut r = git_req(&url, &head);
        r.replace = true;
        let again = install(&env.data, &r).await.unwrap();
        assert_eq!(again.path.as_ref(), Some(&path));
        assert_eq!(again.previous.as_ref().unwrap().digest, plan.digest);
        digest::verify(&path, &plan.digest, "opensandbox").unwrap();
        assert_clean(&env.data);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unpinned_is_refused_with_the_seed_text_then_allowed() {
        let env = env();
        let (url, head) = repo(&env.base, "opensandbox");
        let mut r = git_req(&url, "main");
        r.git_ref = None;
        let e = install(&env.data, &r).await.unwrap_err();
        refused_code(&e);
        assert_eq!(
            e.to_string(),
            "[E8012] Refusing an unpinned git source without review (--yes does not accept a moving ref)."
        );
        assert_eq!(
            e.suggestion,
            format!("Pin it: --ref {head} (or --sha256 <digest>); or pass --allow-unpinned to accept the current head.")
        );
        assert_eq!(
            e.data["rerun"],
            format!("abx provider install {url} --subdir opensandbox --ref {head} --allow-insecure-transport --yes")
        );
        assert_clean(&env.data);

        // A branch is a moving ref too; so is a short commit id.
        for moving in ["main", &head[..12]] {
            let e = install(&env.data, &git_req(&url, moving))
                .await
                .unwrap_err();
            refused_code(&e);
            assert!(e.suggestion.contains(&head), "{}", e.suggestion);
        }

        // --allow-unpinned installs the head, trust unpinned.
        let mut r = git_req(&url, "main");
        r.allow_unpinned = true;
        let plan = install(&env.data, &r).await.unwrap();
        assert_eq!(plan.trust, Trust::Unpinned);
        assert_eq!(plan.source.commit.as_deref(), Some(head.as_str()));
        assert_eq!(plan.source.git_ref.as_deref(), Some("main"));

        // A new commit on the branch; an update with replace moves to it and removes the
        // old tree.
        let old_path = plan.path.clone().unwrap();
        fs::write(
            Path::new(url.strip_prefix("file://").unwrap()).join("opensandbox/lib/util.sh"),
            "x=2\n",
        )
        .unwrap();
        let head2 = commit_all(&url, "two");
        r.replace = true;
        let plan2 = install(&env.data, &r).await.unwrap();
        assert_eq!(plan2.source.commit.as_deref(), Some(head2.as_str()));
        assert_ne!(plan2.digest, plan.digest);
        assert_eq!(
            plan2.previous.as_ref().unwrap().commit.as_deref(),
            Some(head.as_str())
        );
        assert!(!old_path.exists());
        assert_eq!(installed::load(&env.data).len(), 1);

        // An old commit by full id is pinned (and fetched even though not at a branch head).
        let mut r = git_req(&url, &head);
        r.replace = true;
        let plan3 = install(&env.data, &r).await.unwrap();
        assert_eq!(plan3.trust, Trust::Pinned);
        assert_eq!(plan3.digest, plan.digest);
        assert_clean(&env.data);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sha256_pins_content_and_mismatch_is_e8013() {
        let env = env();
        let (url, head) = repo(&env.base, "opensandbox");
        let src_dir = Path::new(url.strip_prefix("file://").unwrap()).join("opensandbox");
        let d = digest::dirhash(&src_dir).unwrap();
        let mut r = git_req(&url, "main");
        r.sha256 = Some(d.trim_start_matches("sha256:").to_uppercase());
        let e = {
            let mut bad = r.clone();
            bad.sha256 = Some(format!("sha256:{}", "0".repeat(64)));
            install(&env.data, &bad).await.unwrap_err()
        };
        assert_eq!(e.code, ErrorCode::DigestMismatch);
        assert_eq!(
            e.to_string(),
            format!(
                "[E8013] Digest mismatch: expected sha256:{}, got {d}.",
                "0".repeat(64)
            )
        );
        assert_clean(&env.data);
        let plan = install(&env.data, &r).await.unwrap();
        assert_eq!(plan.trust, Trust::Pinned);
        assert_eq!(plan.digest, d);
        assert_eq!(plan.source.commit.as_deref(), Some(head.as_str()));
        let mut bad = r.clone();
        bad.sha256 = Some("sha256:xyz".into());
        assert_eq!(
            install(&env.data, &bad).await.unwrap_err().code,
            ErrorCode::Usage
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn insecure_transport_and_confirmation_refusals_keep_every_flag() {
        let env = env();
        let (url, head) = repo(&env.base, "opensandbox");
        let mut r = git_req(&url, &head);
        r.allow_insecure_transport = false;
        let e = install(&env.data, &r).await.unwrap_err();
        refused_code(&e);
        assert!(
            e.message.contains("insecure transport 'file://'"),
            "{}",
            e.message
        );
        assert_eq!(
            e.suggestion,
            format!("If you trust this source, re-run: abx provider install {url} --subdir opensandbox --ref {head} --allow-insecure-transport --yes")
        );
        // Nothing at all was written: the refusal comes before any fetch.
        assert!(!env.data.exists());

        let mut r = git_req(&url, &head);
        r.confirm = false;
        let e = install(&env.data, &r).await.unwrap_err();
        refused_code(&e);
        assert_eq!(
            e.to_string(),
            "[E8012] Installing a provider requires confirmation."
        );
        assert_eq!(
            e.suggestion,
            format!("Re-run with --yes after reviewing: abx provider install {url} --subdir opensandbox --ref {head} --allow-insecure-transport --yes")
        );
        assert_eq!(e.data["plan"]["id"], "opensandbox");
        assert_eq!(e.data["plan"]["source"]["commit"], head.as_str());
        assert!(!e.data["plan"].to_string().contains("SECRET"));
        assert_clean(&env.data);
        assert!(installed::load(&env.data).is_empty());

        // Quoting and the other flags.
        let r = Request {
            source: "/tmp/my plugin".into(),
            subdir: Some("it's".into()),
            sha256: Some("sha256:ab".into()),
            allow_unpinned: true,
            ..Request::default()
        };
        assert_eq!(
            command(&r),
            "abx provider install '/tmp/my plugin' --subdir 'it'\\''s' --sha256 sha256:ab --allow-unpinned --yes"
        );
        // Other transports are not supported; credentials in URLs are refused unshown.
        let e = install(&env.data, &req("ssh://example.com/x.git"))
            .await
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::SourceUnreachable);
        let e = install(&env.data, &req("https://user:tok3n@example.com/x.git"))
            .await
            .unwrap_err();
        refused_code(&e);
        assert!(!format!("{e} {}", e.suggestion).contains("tok3n"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dry_run_writes_nothing() {
        let env = env();
        let (url, head) = repo(&env.base, "opensandbox");
        let mut r = git_req(&url, "main");
        r.dry_run = true;
        r.confirm = false;
        let plan = install(&env.data, &r).await.unwrap();
        assert!(!plan.installed && plan.path.is_none());
        assert_eq!(plan.trust, Trust::Unpinned);
        assert_eq!(plan.source.commit.as_deref(), Some(head.as_str()));
        assert_eq!(plan.security.network, vec!["*"]);
        assert_eq!(
            plan.manifest.features,
            vec!["sandbox.lifecycle", "exec.run"]
        );
        assert!(plan.digest.starts_with("sha256:"));
        assert!(!env.data.exists(), "the data dir was touched");
        // Its private temp dir is gone (other tests may be running dry runs: wait for
        // a moment with none of this process's in flight).
        let prefix = format!("abx-install-{}-", std::process::id());
        let ours = || {
            fs::read_dir(std::env::temp_dir())
                .unwrap()
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                .count()
        };
        let mut tries = 0;
        while ours() > 0 {
            tries += 1;
            assert!(tries < 100, "temp dir left behind");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        // The plan's digest then pins a real install.
        let mut r = git_req(&url, "main");
        r.sha256 = Some(plan.digest.clone());
        assert_eq!(install(&env.data, &r).await.unwrap().trust, Trust::Pinned);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn local_directory_is_copied() {
        let env = env();
        let src = env.base.join("src");
        plugin_dir(&src, "localp");
        fs::create_dir_all(src.join(".git/objects")).unwrap();
        fs::write(src.join(".git/HEAD"), "x").unwrap();
        let mut r = req(src.to_str().unwrap());
        r.confirm = true;
        let plan = install(&env.data, &r).await.unwrap();
        assert_eq!(plan.trust, Trust::Local);
        assert_eq!(
            plan.source.url,
            fs::canonicalize(&src).unwrap().display().to_string()
        );
        assert!(plan.source.commit.is_none());
        let path = plan.path.unwrap();
        assert!(!path.starts_with(&src));
        assert!(!path.join(".git").exists());
        // Changing the source does not change the installed copy.
        fs::write(src.join("provider.sh"), "changed").unwrap();
        digest::verify(&path, &plan.digest, "localp").unwrap();
        // --ref makes no sense for a directory.
        let mut r2 = r.clone();
        r2.git_ref = Some(COMMIT.into());
        assert_eq!(
            install(&env.data, &r2).await.unwrap_err().code,
            ErrorCode::Usage
        );
        // A missing directory.
        let e = install(&env.data, &req("/nonexistent/abx/plugin"))
            .await
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::SourceUnreachable);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn old_manifest_name_and_missing_manifest() {
        let env = env();
        let old = env.base.join("oldname");
        fs::create_dir_all(&old).unwrap();
        fs::write(old.join("ebx-provider.toml"), manifest_text("old")).unwrap();
        let mut r = req(old.to_str().unwrap());
        r.confirm = true;
        let e = install(&env.data, &r).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidManifest);
        assert_eq!(
            e.to_string(),
            "[E8014] Invalid abx-provider.toml: file not found at the plugin root."
        );
        assert_eq!(
            e.suggestion,
            "This plugin still uses the pre-rename 'ebx-provider.toml'. Rename it to abx-provider.toml and rename its EBX_* variables to ABX_* (the plugin's maintainer must publish the update)."
        );
        assert_clean(&env.data);

        let empty = env.base.join("empty");
        fs::create_dir_all(&empty).unwrap();
        let e = install(&env.data, &req(empty.to_str().unwrap()))
            .await
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "[E8014] Invalid abx-provider.toml: file not found at the plugin root."
        );
        assert_eq!(e.suggestion, ErrorCode::InvalidManifest.suggestion());

        // The plugin one level down: the suggestion names --subdir.
        let (url, head) = repo(&env.base, "opensandbox");
        let mut r = git_req(&url, &head);
        r.subdir = None;
        let e = install(&env.data, &r).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidManifest);
        assert!(
            e.suggestion.ends_with(&format!(
                "--subdir opensandbox: abx provider install {url} --subdir opensandbox --ref {head} --allow-insecure-transport --yes"
            )),
            "{}",
            e.suggestion
        );
        assert_clean(&env.data);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hostile_git_sources_are_refused() {
        let env = env();
        let outside = env.base.join("outside-target");
        fs::write(&outside, "secret").unwrap();

        // A symlink pointing out of the tree.
        let (url, _) = repo(&env.base, "opensandbox");
        let rp = PathBuf::from(url.strip_prefix("file://").unwrap());
        symlink(&outside, rp.join("opensandbox/lib/link")).unwrap();
        let head = commit_all(&url, "link");
        let e = install(&env.data, &git_req(&url, &head)).await.unwrap_err();
        refused_code(&e);
        assert!(e.message.contains("symlink at 'lib/link'"), "{}", e.message);
        assert_clean(&env.data);

        // The subdir itself a symlink.
        fs::remove_file(rp.join("opensandbox/lib/link")).unwrap();
        symlink("opensandbox", rp.join("alias")).unwrap();
        let head = commit_all(&url, "alias");
        let mut r = git_req(&url, &head);
        r.subdir = Some("alias".into());
        let e = install(&env.data, &r).await.unwrap_err();
        refused_code(&e);
        assert!(e.message.contains("symlink at 'alias'"), "{}", e.message);

        // A gitlink (submodule) entry.
        git(
            &rp,
            &[
                "update-index",
                "--add",
                "--cacheinfo",
                &format!("160000,{head},opensandbox/vendor"),
            ],
        );
        git(&rp, &["commit", "-q", "-m", "sub"]);
        let head = git(&rp, &["rev-parse", "HEAD"]);
        let e = install(&env.data, &git_req(&url, &head)).await.unwrap_err();
        refused_code(&e);
        assert!(
            e.message
                .contains("submodule or nested repository at 'vendor'"),
            "{}",
            e.message
        );
        git(&rp, &["rm", "-q", "--cached", "opensandbox/vendor"]);
        git(&rp, &["commit", "-q", "-m", "unsub"]);

        // A .gitmodules file.
        fs::write(rp.join("opensandbox/.gitmodules"), "[submodule \"x\"]\n").unwrap();
        let head = commit_all(&url, "gitmodules");
        let e = install(&env.data, &git_req(&url, &head)).await.unwrap_err();
        refused_code(&e);
        assert!(e.message.contains("submodule"), "{}", e.message);
        fs::remove_file(rp.join("opensandbox/.gitmodules")).unwrap();

        // --subdir escaping the source.
        for bad in ["../x", "/etc", "opensandbox/../../x"] {
            let mut r = git_req(&url, &head);
            r.subdir = Some(bad.into());
            let e = install(&env.data, &r).await.unwrap_err();
            refused_code(&e);
            assert!(e.message.contains("--subdir"), "{}", e.message);
        }

        // A runtime outside the root, or missing, or not executable.
        let mt = rp.join("opensandbox").join(manifest::FILE_NAME);
        for (cmd, what) in [
            (r#"["sh", "../escape.sh"]"#, "outside the plugin root"),
            (r#"["/bin/sh", "./provider.sh"]"#, "absolute path"),
            (r#"["sh", "./missing.sh"]"#, "not in the plugin"),
            (r#"["./lib/util.sh"]"#, "not executable"),
        ] {
            fs::write(
                &mt,
                manifest_text("opensandbox").replace(r#"["sh", "./provider.sh"]"#, cmd),
            )
            .unwrap();
            let head = commit_all(&url, cmd);
            let e = install(&env.data, &git_req(&url, &head)).await.unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidManifest, "{e}");
            assert!(
                e.message.contains("line 10, key 'runtime.command'"),
                "{}",
                e.message
            );
            assert!(e.message.contains(what), "{}", e.message);
        }
        assert_clean(&env.data);
        assert_eq!(fs::read_to_string(&outside).unwrap(), "secret");
        // Nothing was written next to the data dir either.
        let mut top: Vec<String> = fs::read_dir(&env.base)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        top.sort();
        assert_eq!(top, vec!["data", "outside-target", "repo-opensandbox"]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hostile_local_sources_are_refused() {
        let env = env();
        let mk = |name: &str| {
            let d = env.base.join(name);
            plugin_dir(&d, "hostile");
            d
        };
        let confirm = |p: &Path| Request {
            source: p.display().to_string(),
            confirm: true,
            ..Request::default()
        };
        let d = mk("symlink");
        symlink("/etc/passwd", d.join("lib/passwd")).unwrap();
        let e = install(&env.data, &confirm(&d)).await.unwrap_err();
        refused_code(&e);
        assert!(
            e.message.contains("symlink at 'lib/passwd'"),
            "{}",
            e.message
        );

        let d = mk("fifo");
        let c = std::ffi::CString::new(d.join("lib/fifo").as_os_str().as_bytes()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let e = install(&env.data, &confirm(&d)).await.unwrap_err();
        refused_code(&e);
        assert!(e.message.contains("fifo at 'lib/fifo'"), "{}", e.message);

        let d = mk("nested-git");
        fs::create_dir_all(d.join("lib/vendor/.git")).unwrap();
        fs::write(d.join("lib/vendor/.git/HEAD"), "x").unwrap();
        let e = install(&env.data, &confirm(&d)).await.unwrap_err();
        refused_code(&e);
        assert!(
            e.message
                .contains("submodule or nested repository at 'lib/vendor'"),
            "{}",
            e.message
        );

        let d = mk("huge-file");
        fs::File::create(d.join("big.bin"))
            .unwrap()
            .set_len(MAX_FILE + 1)
            .unwrap();
        let e = install(&env.data, &confirm(&d)).await.unwrap_err();
        refused_code(&e);
        assert!(
            e.message.contains("file over 64 MiB: 'big.bin'"),
            "{}",
            e.message
        );

        let d = mk("huge-tree");
        for i in 0..5 {
            fs::File::create(d.join(format!("part{i}.bin")))
                .unwrap()
                .set_len(60 << 20)
                .unwrap();
        }
        let e = install(&env.data, &confirm(&d)).await.unwrap_err();
        refused_code(&e);
        assert!(e.message.contains("over 256 MiB"), "{}", e.message);

        let d = mk("subdir-link");
        symlink(&d, d.join("loop")).unwrap();
        let mut r = confirm(&d);
        r.subdir = Some("loop".into());
        let e = install(&env.data, &r).await.unwrap_err();
        refused_code(&e);
        assert_clean(&env.data);
        assert!(installed::load(&env.data).is_empty());
    }

    /// Serve `body` once per connection on a loopback port; returns the base URL.
    fn serve(body: Vec<u8>) -> String {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { return };
                let mut buf = [0u8; 4096];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&got);
                let resp = if head.starts_with("GET /missing") {
                    b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                        .to_vec()
                } else {
                    let mut r = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/gzip\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    )
                    .into_bytes();
                    r.extend_from_slice(&body);
                    r
                };
                let _ = s.write_all(&resp);
            }
        });
        format!("http://{addr}")
    }

    /// A .tar.gz of `dir`'s contents under a top-level `name/`, made with the system tar.
    fn targz(dir: &Path, name: &str, extra: &[&str]) -> Vec<u8> {
        let out = dir.with_extension("tar.gz");
        let st = Command::new("tar")
            .arg("-czf")
            .arg(&out)
            .args(extra)
            .arg("-C")
            .arg(dir.parent().unwrap())
            .arg("--transform")
            .arg(format!(
                "s,^{},{name},",
                dir.file_name().unwrap().to_str().unwrap()
            ))
            .arg(dir.file_name().unwrap())
            .status()
            .unwrap();
        assert!(st.success());
        fs::read(out).unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn archive_over_loopback_http() {
        let env = env();
        let src = env.base.join("arch");
        plugin_dir(&src, "archived");
        let d = digest::dirhash(&src).unwrap();
        let base = serve(targz(&src, "archived-1.0", &[]));
        let url = format!("{base}/releases/archived-1.0.tar.gz");

        // Without --sha256: refused, with the command to re-run.
        let mut r = req(&url);
        r.allow_insecure_transport = true;
        r.confirm = true;
        let e = install(&env.data, &r).await.unwrap_err();
        refused_code(&e);
        assert!(e.message.contains("without --sha256"), "{}", e.message);
        assert!(
            e.suggestion.ends_with(&format!(
                "abx provider install {url} --sha256 '<digest>' --allow-insecure-transport --yes"
            )),
            "{}",
            e.suggestion
        );
        // http:// without --allow-insecure-transport: refused.
        let mut r2 = r.clone();
        r2.allow_insecure_transport = false;
        r2.sha256 = Some(d.clone());
        let e = install(&env.data, &r2).await.unwrap_err();
        refused_code(&e);
        assert!(
            e.suggestion.contains("--sha256 sha256:")
                && e.suggestion.contains("--allow-insecure-transport --yes")
        );
        // A dry run shows the digest; a wrong one is E8013; the right one installs.
        let mut dry = r.clone();
        dry.dry_run = true;
        dry.confirm = false;
        let plan = install(&env.data, &dry).await.unwrap();
        assert_eq!(plan.digest, d);
        let mut wrong = r.clone();
        wrong.sha256 = Some(format!("sha256:{}", "1".repeat(64)));
        assert_eq!(
            install(&env.data, &wrong).await.unwrap_err().code,
            ErrorCode::DigestMismatch
        );
        r.sha256 = Some(d.clone());
        let plan = install(&env.data, &r).await.unwrap();
        assert_eq!(plan.trust, Trust::Pinned);
        assert_eq!(plan.id, "archived");
        digest::verify(plan.path.as_ref().unwrap(), &d, "archived").unwrap();
        assert_clean(&env.data);

        // 404.
        let mut r404 = r.clone();
        r404.source = format!("{base}/missing.tgz");
        let e = install(&env.data, &r404).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::SourceUnreachable);
        assert!(e.message.contains("404"), "{}", e.message);
        assert_clean(&env.data);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hostile_archives_are_refused() {
        let env = env();
        let outside = env.base.join("escaped.txt");
        for (case, extra, what) in [
            ("symlink", &[][..], "symlink"),
            (
                "dotdot",
                &[
                    "-P",
                    "--transform",
                    "s,^dotdot/lib/util.sh,../../escaped.txt,",
                ][..],
                "outside its root",
            ),
            (
                "absolute",
                &[
                    "-P",
                    "--transform",
                    "s,^absolute/lib/util.sh,/tmp/abx-escaped.txt,",
                ][..],
                "outside its root",
            ),
        ] {
            let src = env.base.join(case);
            plugin_dir(&src, "bad");
            if case == "symlink" {
                symlink("/etc/passwd", src.join("lib/passwd")).unwrap();
            }
            let out = src.with_extension("tar.gz");
            let st = Command::new("tar")
                .arg("-czf")
                .arg(&out)
                .args(extra)
                .arg("-C")
                .arg(&env.base)
                .arg(case)
                .status()
                .unwrap();
            assert!(st.success());
            let base = serve(fs::read(&out).unwrap());
            let r = Request {
                source: format!("{base}/p.tar.gz"),
                sha256: Some(format!("sha256:{}", "0".repeat(64))),
                allow_insecure_transport: true,
                confirm: true,
                ..Request::default()
            };
            let e = install(&env.data, &r).await.unwrap_err();
            refused_code(&e);
            assert!(e.message.contains(what), "{case}: {}", e.message);
            assert!(!outside.exists());
            assert!(!Path::new("/tmp/abx-escaped.txt").exists());
            assert_clean(&env.data);
        }
        // Not an archive at all.
        let base = serve(b"<html>hello</html>".to_vec());
        let r = Request {
            source: format!("{base}/p.tgz"),
            sha256: Some(format!("sha256:{}", "0".repeat(64))),
            allow_insecure_transport: true,
            confirm: true,
            ..Request::default()
        };
        let e = install(&env.data, &r).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::SourceUnreachable);
        assert!(e.message.contains("not a .tar.gz archive"), "{}", e.message);
        assert_clean(&env.data);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_installs_of_two_ids() {
        let env = env();
        let (u1, h1) = repo(&env.base, "one");
        let (u2, h2) = repo(&env.base, "two");
        let (r1, r2) = (git_req(&u1, &h1), git_req(&u2, &h2));
        let (a, b) = tokio::join!(
            tokio::spawn({
                let d = env.data.clone();
                async move { install(&d, &r1).await }
            }),
            tokio::spawn({
                let d = env.data.clone();
                async move { install(&d, &r2).await }
            }),
        );
        a.unwrap().unwrap();
        b.unwrap().unwrap();
        let ids: Vec<String> = installed::load(&env.data)
            .into_iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(ids, vec!["one", "two"]);
        // Two installs of the same id at once: exactly one wins, the other is E8015.
        let (u3, h3) = repo(&env.base, "three");
        let r3 = git_req(&u3, &h3);
        let (a, b) = tokio::join!(
            tokio::spawn({
                let (d, r) = (env.data.clone(), r3.clone());
                async move { install(&d, &r).await }
            }),
            tokio::spawn({
                let (d, r) = (env.data.clone(), r3.clone());
                async move { install(&d, &r).await }
            }),
        );
        let results = [a.unwrap(), b.unwrap()];
        assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1);
        assert!(results
            .iter()
            .any(|r| matches!(r, Err(e) if e.code == ErrorCode::AlreadyInstalled)));
        assert_eq!(installed::load(&env.data).len(), 3);
        assert_clean(&env.data);
    }

    #[test]
    fn listing_lines_parse() {
        assert_eq!(
            parse_listing_line("-rw-r--r-- u/g        1234 2024-01-01 00:00 dir/my file.txt"),
            Some(('-', 1234, "dir/my file.txt"))
        );
        assert_eq!(
            parse_listing_line("lrwxrwxrwx u/g 0 2024-01-01 00:00 a -> /etc/passwd"),
            Some(('l', 0, "a -> /etc/passwd"))
        );
        assert_eq!(
            parse_listing_line("crw-r--r-- root/root 1,3 2024-01-01 00:00 dev/null"),
            Some(('c', 0, "dev/null"))
        );
        assert_eq!(parse_listing_line("garbage"), None);
        assert!(is_full_commit(COMMIT) && !is_full_commit(&COMMIT[..39]));
        let r = req("x");
        assert_eq!(
            normalize_subdir(&r, "./a//b/").unwrap().as_deref(),
            Some("a/b")
        );
        assert_eq!(normalize_subdir(&r, ".").unwrap(), None);
        assert!(normalize_subdir(&r, "a/../b").is_err());
    }

    #[test]
    fn request_params_use_rpc_names() {
        let r: Request = serde_json::from_value(serde_json::json!({
            "source": "https://example.com/x.git",
            "subdir": "p",
            "ref": "main",
            "sha256": "sha256:00",
            "allowUnpinned": true,
            "allowInsecureTransport": true,
            "confirm": true,
            "dryRun": true
        }))
        .unwrap();
        assert_eq!(r.git_ref.as_deref(), Some("main"));
        assert!(
            r.allow_unpinned && r.allow_insecure_transport && r.confirm && r.dry_run && !r.replace
        );
        assert_eq!(r.subdir.as_deref(), Some("p"));
    }
}
