//! The builtin `local` provider: sandboxes on this machine (docs/design.md#local).
//!
//! - [`files`]: every files/* operation, confined beneath the sandbox with `openat2`.
//! - [`watch`]: files/watch through inotify.
//! - [`init`]: the sandbox's init (PID 1): builds the private root and namespaces, starts
//!   and reaps its processes.
//! - [`container`]: the daemon's side of a sandbox's init.
//! - [`isolate`]: the isolation model in force; per-process confinement of the opt-in
//!   Landlock and none models.
//! - [`code`]: `code/*`, contexts (long-lived interpreters) that run cells.
//! - [`procs`]: finding, signalling and listing a sandbox's processes.
//! - [`templates`]: OCI images (pull, import, store, unpack) and sandboxes saved as templates.
//! - [`workspace`]: host directories mounted into sandboxes (`mounts`).
//! - [`egress`]: network policies: each policy sandbox's egress proxy (crate `abx-egress`).
//! - [`pool`]: ready sandboxes, built ahead of the creates that take them (issue 48).

pub mod code;
pub mod container;
pub mod egress;
pub mod exec;
pub mod files;
pub mod init;
pub mod isolate;
pub mod limits;
pub mod net;
pub mod pool;
pub mod procs;
pub mod sandboxes;
pub mod templates;
pub mod watch;
pub mod workspace;

use abx_protocol::{AbxError, ErrorCode};
use std::path::{Component, Path, PathBuf};

/// Where the sandbox's paths are mounted as its processes see them.
pub const WORKSPACE: &str = "/workspace";
/// The sandbox's private temp dir as its processes see it.
pub const TMP: &str = "/tmp";

/// The directories of one sandbox under the broker's data dir.
#[derive(Clone, Debug)]
pub struct SandboxDirs {
    /// `data/local/sandboxes/<id>`.
    pub root: PathBuf,
    /// Bound at `/workspace` (the working directory and HOME).
    pub workspace: PathBuf,
    /// Bound at `/tmp`.
    pub tmp: PathBuf,
    /// The sandbox's whole root as its processes see it (set per `files/*` call where the
    /// path needs it: outside `/workspace` and `/tmp`, or on a mount).
    pub view: Option<std::sync::Arc<RootView>>,
}

/// The root of a running sandbox as its init sees it: an `O_PATH` descriptor of its `/`
/// (in its mount namespace, handed over by the init), beneath which `files/*` resolve
/// paths with `openat2(RESOLVE_IN_ROOT)`: symlinks are followed as in the sandbox, `..` and
/// absolute links stay inside it, nothing on the host is reached.
#[derive(Debug)]
pub struct RootView {
    /// The init's `/`.
    pub root: std::sync::Arc<std::os::fd::OwnedFd>,
    /// The mounts' targets (`/workspace`, `/src`, ...): paths beneath them are resolved in
    /// the view, never in the sandbox's own directories.
    pub mounts: Vec<String>,
    /// The host ids the daemon takes (per thread, `setfsuid`) while it works in the view: a
    /// root daemon's sandbox user (its files through an idmapped mount are the owner's).
    pub owner: Option<(u32, u32)>,
}

/// Whether `path` (a sandbox path; relative ones are under `/workspace`) must be resolved in
/// the sandbox's whole view: outside `/workspace` and `/tmp`, or on one of `mounts`.
pub fn in_view(path: &str, mounts: &[String]) -> bool {
    let p = if path.starts_with('/') {
        PathBuf::from(path)
    } else {
        Path::new(WORKSPACE).join(path)
    };
    let mut norm = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::Normal(n) => norm.push(n),
            Component::ParentDir => {
                norm.pop();
            }
            _ => {}
        }
    }
    if !norm.starts_with(WORKSPACE) && !norm.starts_with(TMP) {
        return true;
    }
    mounts.iter().any(|m| norm.starts_with(m))
}

impl SandboxDirs {
    /// The layout beneath `root`.
    pub fn new(root: PathBuf) -> SandboxDirs {
        SandboxDirs {
            workspace: root.join("workspace"),
            tmp: root.join("tmp"),
            root,
            view: None,
        }
    }

    /// The host directory of an area.
    pub fn area_dir(&self, area: Area) -> &Path {
        match area {
            Area::Workspace => &self.workspace,
            Area::Tmp => &self.tmp,
        }
    }
}

/// The two writable areas of a sandbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Area {
    /// `/workspace`.
    Workspace,
    /// `/tmp`.
    Tmp,
}

impl Area {
    /// The sandbox-view prefix.
    pub fn prefix(self) -> &'static str {
        match self {
            Area::Workspace => WORKSPACE,
            Area::Tmp => TMP,
        }
    }
}

/// Split a sandbox path into its area and a normalized relative path (no `.`/`..`).
///
/// Relative paths are relative to `/workspace`. Absolute paths must lie under `/workspace`
/// or `/tmp`; anything else, or `..` climbing out of the area, is E4002. Symlinks are not
/// looked at here: the file operations resolve them beneath the area with `openat2`.
pub fn split_path(path: &str) -> Result<(Area, PathBuf), AbxError> {
    let outside = || AbxError::new(ErrorCode::PathOutsideSandbox, &[("path", path)]);
    if path.contains('\0') {
        return Err(outside());
    }
    let p = Path::new(path);
    let (area, rest): (Area, &Path) = if p.is_absolute() {
        if let Ok(r) = p.strip_prefix(WORKSPACE) {
            (Area::Workspace, r)
        } else if let Ok(r) = p.strip_prefix(TMP) {
            (Area::Tmp, r)
        } else {
            return Err(outside());
        }
    } else {
        (Area::Workspace, p)
    };
    let mut out = PathBuf::new();
    for c in rest.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return Err(outside());
                }
            }
            Component::RootDir | Component::Prefix(_) => return Err(outside()),
        }
    }
    Ok((area, out))
}

/// The sandbox-view path of an area-relative path (`/workspace/a/b`).
pub fn view_path(area: Area, rel: &Path) -> String {
    if rel.as_os_str().is_empty() {
        area.prefix().to_owned()
    } else {
        format!("{}/{}", area.prefix(), rel.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_into_areas() {
        let ok = |p: &str| split_path(p).unwrap();
        assert_eq!(ok("a/b"), (Area::Workspace, PathBuf::from("a/b")));
        assert_eq!(ok("./a/../b"), (Area::Workspace, PathBuf::from("b")));
        assert_eq!(ok("/workspace"), (Area::Workspace, PathBuf::new()));
        assert_eq!(
            ok("/workspace/x/./y"),
            (Area::Workspace, PathBuf::from("x/y"))
        );
        assert_eq!(ok("/tmp/up2.txt"), (Area::Tmp, PathBuf::from("up2.txt")));
        assert_eq!(ok(""), (Area::Workspace, PathBuf::new()));
        for bad in [
            "/etc/passwd",
            "..",
            "a/../../x",
            "/workspace/../etc",
            "/tmpx",
            "/workspacex/a",
            "/tmp/../x",
        ] {
            assert_eq!(
                split_path(bad).unwrap_err().code,
                ErrorCode::PathOutsideSandbox,
                "{bad}"
            );
        }
        assert_eq!(view_path(Area::Tmp, Path::new("a")), "/tmp/a");
        assert_eq!(view_path(Area::Workspace, Path::new("")), "/workspace");
    }
}
