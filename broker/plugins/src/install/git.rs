//! Git sources through libgit2: a bare clone into the staging directory (no hooks, no
//! checkout), the ref resolved to a commit, and the plugin's files written from the commit's
//! tree objects, so symlinks, submodules and unsafe names are refused before anything
//! reaches the disk.

use super::*;

pub(super) fn git_error(url: &str, e: &git2::Error) -> AbxError {
    unreachable_source(url, e.message())
}

pub(super) fn clone(url: &str, dest: &Path) -> Result<git2::Repository, AbxError> {
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
pub(super) fn resolve(
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

pub(super) const MODE_TREE: i32 = 0o040000;
pub(super) const MODE_BLOB: i32 = 0o100644;
pub(super) const MODE_BLOB_GROUP: i32 = 0o100664;
pub(super) const MODE_EXEC: i32 = 0o100755;
pub(super) const MODE_LINK: i32 = 0o120000;
pub(super) const MODE_COMMIT: i32 = 0o160000;

/// Write the files of `commit` (below `subdir`) into `dest`, from the object database.
pub(super) fn export_commit(
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
