//! Local trees: a directory source copied (never referenced) into the staging directory,
//! and the same checks for an extracted archive: no symlinks, special files, `.git` or
//! submodules, within the size limits.

use super::*;

/// `root/subdir`, refusing symlinks on the way.
pub(super) fn local_root(
    root: &Path,
    subdir: Option<&str>,
    source: &str,
) -> Result<PathBuf, AbxError> {
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

pub(super) fn too_big(detail: String) -> AbxError {
    refused(
        detail,
        "Provider trees are limited to 64 MiB per file and 256 MiB in all; ask the provider's maintainer to slim it down.",
    )
}

pub(super) fn submodule(path: &str) -> AbxError {
    refused(
        format!("Refusing a provider source with a git submodule or nested repository at '{path}'."),
        "Submodules are never installed; ask the provider's maintainer to vendor the files instead.",
    )
}

pub(super) fn is_git_name(name: &[u8]) -> bool {
    name.eq_ignore_ascii_case(b".git")
}

/// Copy a directory tree (regular files and directories only) into `dest`.
pub(super) fn copy_tree(src: &Path, dest: &Path) -> Result<(), AbxError> {
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

pub(super) fn mkdir(p: &Path) -> Result<(), AbxError> {
    fs::DirBuilder::new()
        .mode(0o700)
        .create(p)
        .map_err(|e| AbxError::internal(format!("creating {}: {e}", p.display())))
}

pub(super) fn create_file(p: &Path, exec: bool) -> Result<fs::File, AbxError> {
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(if exec { 0o755 } else { 0o644 })
        .open(p)
        .map_err(|e| AbxError::internal(format!("creating {}: {e}", p.display())))
}
