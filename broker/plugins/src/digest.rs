//! The content digest of a plugin tree and its verification (docs/design.md#providers).
//!
//! The digest is `sha256:` + hex(sha256(listing)), where the listing has one line per
//! regular file, `"{hex sha256 of the file} {x|-} {relative/path}\n"`, sorted by the
//! path's bytes; `x` means some execute bit is set. A source's top-level `.git` is excluded
//! (the installer never copies it); in an installed tree a `.git` is an integrity failure. Directories only contribute through their files. Anything
//! that is not a regular file or a directory (symlink, fifo, socket, device) anywhere in
//! the tree is an error: [`TreeError`] says which and where, and callers map it to a
//! refusal (installing, E8012) or to an integrity failure (verifying, E8011).
//!
//! Files are streamed through the hash in 64 KiB blocks: memory stays constant whatever
//! their size. Files are opened with `O_NOFOLLOW | O_NONBLOCK` and checked again after
//! opening, so a path swapped for a symlink or a fifo during the walk is caught too.

use abx_protocol::{AbxError, ErrorCode};
use sha2::{Digest, Sha256};
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Largest file in a plugin tree.
pub const MAX_FILE: u64 = 64 << 20;
/// Largest plugin tree (sum of file sizes).
pub const MAX_TREE: u64 = 256 << 20;
/// Most files in a plugin tree.
pub const MAX_FILES: usize = 100_000;

/// Why a tree cannot be hashed.
#[derive(Debug)]
pub enum TreeError {
    /// Something other than a regular file or a directory.
    Special {
        /// Relative path.
        path: String,
        /// `symlink`, `fifo`, `socket`, `device`, ...
        kind: &'static str,
    },
    /// A file or directory name the listing cannot represent (a newline in it).
    BadName {
        /// Relative path (escaped).
        path: String,
    },
    /// The root is missing or unreadable, or a read failed.
    Io {
        /// Relative path (empty for the root).
        path: String,
        /// The error.
        error: io::Error,
    },
}

impl fmt::Display for TreeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TreeError::Special { path, kind } => write!(f, "'{path}' is a {kind}"),
            TreeError::BadName { path } => write!(f, "'{path}' has a newline in its name"),
            TreeError::Io { path, error } if path.is_empty() => write!(f, "{error}"),
            TreeError::Io { path, error } => write!(f, "'{path}': {error}"),
        }
    }
}

impl TreeError {
    /// The refusal used when installing: E8012 naming the offending path.
    pub fn refusal(&self) -> AbxError {
        match self {
            TreeError::Special { path, kind } => refused(
                format!(
                    "Refusing a provider source with a {kind} at '{path}': provider trees may hold only regular files and directories."
                ),
                "Ask the provider's maintainer to replace it with a regular file; symlinks and special files are never installed.",
            ),
            TreeError::BadName { path } => refused(
                format!("Refusing a provider source with a newline in a file name: '{path}'."),
                "Ask the provider's maintainer to rename it.",
            ),
            TreeError::Io { path, error } => {
                AbxError::internal(format!("reading the provider tree at '{path}': {error}"))
            }
        }
    }
}

pub(crate) fn refused(detail: impl Into<String>, suggestion: impl Into<String>) -> AbxError {
    AbxError::new(
        ErrorCode::Refused,
        &[("detail", &detail.into()), ("rerun", &suggestion.into())],
    )
}

/// The kind of a non-regular, non-directory file type, or `None` for files and dirs.
pub(crate) fn special_kind(ft: &fs::FileType) -> Option<&'static str> {
    if ft.is_file() || ft.is_dir() {
        None
    } else if ft.is_symlink() {
        Some("symlink")
    } else if ft.is_fifo() {
        Some("fifo")
    } else if ft.is_socket() {
        Some("socket")
    } else if ft.is_block_device() || ft.is_char_device() {
        Some("device")
    } else {
        Some("special file")
    }
}

/// `a/b` as shown in messages.
pub(crate) fn show(rel: &[u8]) -> String {
    String::from_utf8_lossy(rel).escape_debug().to_string()
}

/// One regular file of a tree, as the walk found it.
pub(crate) struct Entry {
    /// Path relative to the root, `/`-separated bytes.
    pub rel: Vec<u8>,
    /// Absolute path.
    pub abs: PathBuf,
    /// Any execute bit set.
    pub exec: bool,
    /// Size from lstat.
    pub size: u64,
}

/// Walk `root` (not following anything), returning its regular files sorted by path
/// bytes; the top-level `.git` is skipped. Any other file type is an error.
pub(crate) fn walk(root: &Path) -> Result<Vec<Entry>, TreeError> {
    walk_tree(root, true)
}

/// [`walk`], with the top-level `.git` skipped (a source) or walked like any directory
/// (an installed tree, which never holds one).
fn walk_tree(root: &Path, skip_git: bool) -> Result<Vec<Entry>, TreeError> {
    let meta = fs::symlink_metadata(root).map_err(|error| TreeError::Io {
        path: String::new(),
        error,
    })?;
    if let Some(kind) = special_kind(&meta.file_type()) {
        return Err(TreeError::Special {
            path: ".".into(),
            kind,
        });
    }
    if !meta.is_dir() {
        return Err(TreeError::Io {
            path: String::new(),
            error: io::Error::new(io::ErrorKind::NotADirectory, "not a directory"),
        });
    }
    let mut out = Vec::new();
    // (absolute dir, relative prefix)
    let mut stack: Vec<(PathBuf, Vec<u8>)> = vec![(root.to_path_buf(), Vec::new())];
    while let Some((dir, prefix)) = stack.pop() {
        let rd = fs::read_dir(&dir).map_err(|error| TreeError::Io {
            path: show(&prefix),
            error,
        })?;
        for ent in rd {
            let ent = ent.map_err(|error| TreeError::Io {
                path: show(&prefix),
                error,
            })?;
            let name = ent.file_name();
            let name = name.as_bytes();
            if skip_git && prefix.is_empty() && name == b".git" {
                continue;
            }
            let mut rel = prefix.clone();
            if !rel.is_empty() {
                rel.push(b'/');
            }
            rel.extend_from_slice(name);
            if name.contains(&b'\n') {
                return Err(TreeError::BadName { path: show(&rel) });
            }
            let abs = ent.path();
            let md = fs::symlink_metadata(&abs).map_err(|error| TreeError::Io {
                path: show(&rel),
                error,
            })?;
            let ft = md.file_type();
            if let Some(kind) = special_kind(&ft) {
                return Err(TreeError::Special {
                    path: show(&rel),
                    kind,
                });
            }
            if ft.is_dir() {
                stack.push((abs, rel));
            } else {
                out.push(Entry {
                    rel,
                    abs,
                    exec: md.permissions().mode() & 0o111 != 0,
                    size: md.len(),
                });
            }
        }
    }
    out.sort_by(|a, b| a.rel.cmp(&b.rel));
    Ok(out)
}

/// Open a regular file without following a symlink and without blocking on a fifo, and
/// check that what was opened is a regular file.
pub(crate) fn open_regular(abs: &Path, rel: &[u8]) -> Result<File, TreeError> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(abs)
        .map_err(|error| {
            if error.raw_os_error() == Some(libc::ELOOP) {
                TreeError::Special {
                    path: show(rel),
                    kind: "symlink",
                }
            } else {
                TreeError::Io {
                    path: show(rel),
                    error,
                }
            }
        })?;
    let md = f.metadata().map_err(|error| TreeError::Io {
        path: show(rel),
        error,
    })?;
    if let Some(kind) = special_kind(&md.file_type()) {
        return Err(TreeError::Special {
            path: show(rel),
            kind,
        });
    }
    Ok(f)
}

/// Hex sha256 of a reader, streamed.
pub(crate) fn hash_reader(r: impl Read) -> io::Result<String> {
    hash_reader_to(r, None::<&mut File>)
}

/// Hex sha256 of a reader, streamed; with `copy`, every block hashed is also written there
/// (one read: what is written is exactly what was hashed).
fn hash_reader_to(mut r: impl Read, mut copy: Option<&mut impl Write>) -> io::Result<String> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        h.update(&buf[..n]);
        if let Some(w) = copy.as_mut() {
            w.write_all(&buf[..n])?;
        }
    }
    Ok(hex(&h.finalize()))
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(HEX[(b >> 4) as usize] as char);
        s.push(HEX[(b & 15) as usize] as char);
    }
    s
}

/// The digest of a tree, with the reason when it cannot be computed.
pub fn dirhash_tree(root: &Path) -> Result<String, TreeError> {
    listing_digest(&walk(root)?)
}

fn listing_digest(entries: &[Entry]) -> Result<String, TreeError> {
    listing_digest_to(entries, None)
}

/// The listing digest of `entries`; with `copy_to`, each file is also written beneath that
/// directory as it is hashed (mode 0755 when executable, else 0644; parents 0755).
fn listing_digest_to(entries: &[Entry], copy_to: Option<&Path>) -> Result<String, TreeError> {
    let mut listing = Sha256::new();
    for e in entries {
        let f = open_regular(&e.abs, &e.rel)?;
        let io_err = |error| TreeError::Io {
            path: show(&e.rel),
            error,
        };
        let sum = match copy_to {
            None => hash_reader(f).map_err(io_err)?,
            Some(dst) => {
                let target = dst.join(std::ffi::OsStr::from_bytes(&e.rel));
                if let Some(parent) = target.parent() {
                    fs::DirBuilder::new()
                        .recursive(true)
                        .mode(0o755)
                        .create(parent)
                        .map_err(io_err)?;
                }
                let mut out = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(if e.exec { 0o755 } else { 0o644 })
                    .open(&target)
                    .map_err(io_err)?;
                hash_reader_to(f, Some(&mut out)).map_err(io_err)?
            }
        };
        listing.update(sum.as_bytes());
        listing.update(if e.exec { b" x " } else { b" - " });
        listing.update(&e.rel);
        listing.update(b"\n");
    }
    Ok(format!("sha256:{}", hex(&listing.finalize())))
}

/// Why an installed tree's files cannot be what was installed, before hashing any: more
/// files, a bigger file or more bytes than an install accepts ([`MAX_FILES`],
/// [`MAX_FILE`], [`MAX_TREE`]).
fn past_caps(entries: &[Entry]) -> Option<String> {
    if entries.len() > MAX_FILES {
        return Some(format!(
            "{} files, more than an install accepts",
            entries.len()
        ));
    }
    let mut total = 0u64;
    for e in entries {
        if e.size > MAX_FILE {
            return Some(format!(
                "'{}' is {} bytes, more than an install accepts",
                show(&e.rel),
                e.size
            ));
        }
        total = total.saturating_add(e.size);
    }
    (total > MAX_TREE).then(|| format!("{total} bytes in all, more than an install accepts"))
}

/// The digest of a tree: `sha256:<64 hex>`. A symlink or special file anywhere is refused
/// as when installing (E8012); use [`verify`] to check an installed tree (E8011).
pub fn dirhash(root: &Path) -> Result<String, AbxError> {
    dirhash_tree(root).map_err(|e| e.refusal())
}

/// Check an installed tree against its recorded digest: any difference (a file edited,
/// added, removed, renamed, made executable or not, replaced by a symlink; the manifest
/// edited; the tree gone) is E8011 `Provider 'X': files changed since install.`
///
/// An installed tree never holds a `.git` (the installer does not copy a source's top-level
/// `.git` and refuses nested ones): one that appears is E8011 too, and files under it are
/// hashed like any others. A tree past the install caps is E8011 without hashing a byte.
/// This blocks: async callers run it on the blocking pool.
pub fn verify(root: &Path, expected: &str, provider_id: &str) -> Result<(), AbxError> {
    check_tree(root, expected, None).map_err(|why| {
        tracing::warn!(provider = provider_id, root = %root.display(), "integrity check failed: {why}");
        AbxError::new(ErrorCode::IntegrityFailed, &[("provider", provider_id)])
    })
}

/// Copy an installed tree into the empty directory `dst` while hashing it, in one pass: each
/// file is read once, and the bytes hashed are the bytes written. Ok only when the digest of
/// what was copied is `expected` (the same rules as [`verify`]); else why not. The plugin
/// launcher runs the copy ([`super::launch`]), so what runs is what was verified, whatever
/// happens to the installed tree meanwhile. Blocking.
pub fn copy_verified(root: &Path, dst: &Path, expected: &str) -> Result<(), String> {
    check_tree(root, expected, Some(dst))
}

/// Why `root` is not the tree whose digest is `expected` (see [`verify`]); with `copy_to`,
/// copied there as it is hashed.
fn check_tree(root: &Path, expected: &str, copy_to: Option<&Path>) -> Result<(), String> {
    if fs::symlink_metadata(root.join(".git")).is_ok() {
        return Err("a .git appeared in the installed tree".into());
    }
    let entries = walk_tree(root, false).map_err(|e| e.to_string())?;
    if let Some(why) = past_caps(&entries) {
        return Err(why);
    }
    match listing_digest_to(&entries, copy_to) {
        Ok(actual) if actual == expected => Ok(()),
        Ok(actual) => Err(format!("digest {actual}, expected {expected}")),
        Err(e) => Err(e.to_string()),
    }
}

/// The 16 hex digits shown by doctor: `sha256:60c6997a1b94ece7...` -> `60c6997a1b94ece7`.
pub fn short(d: &str) -> &str {
    let hex = d.strip_prefix("sha256:").unwrap_or(d);
    hex.get(..16).unwrap_or(hex)
}

/// Normalize a user-given digest (`sha256:<hex>` or bare hex, any case) to
/// `sha256:<64 lowercase hex>`; `None` when malformed.
pub fn normalize(d: &str) -> Option<String> {
    let d = d.trim();
    let hex = d
        .strip_prefix("sha256:")
        .or_else(|| d.strip_prefix("SHA256:"))
        .unwrap_or(d);
    (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| format!("sha256:{}", hex.to_ascii_lowercase()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn tree() -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        fs::write(r.join("abx-provider.toml"), "schema = 1\n").unwrap();
        fs::write(r.join("provider.mjs"), "console.log(1)\n").unwrap();
        fs::create_dir_all(r.join("lib/sub")).unwrap();
        fs::write(r.join("lib/a.js"), "a").unwrap();
        fs::write(r.join("lib/sub/b.js"), "b").unwrap();
        fs::write(r.join("run.sh"), "#!/bin/sh\n").unwrap();
        fs::set_permissions(r.join("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
        t
    }

    #[test]
    fn digest_is_the_documented_listing() {
        let t = tree();
        let sha = |b: &[u8]| hex(&Sha256::digest(b));
        let mut listing = String::new();
        for (path, content, x) in [
            ("abx-provider.toml", &b"schema = 1\n"[..], "-"),
            ("lib/a.js", b"a", "-"),
            ("lib/sub/b.js", b"b", "-"),
            ("provider.mjs", b"console.log(1)\n", "-"),
            ("run.sh", b"#!/bin/sh\n", "x"),
        ] {
            listing.push_str(&format!("{} {x} {path}\n", sha(content)));
        }
        let expected = format!("sha256:{}", sha(listing.as_bytes()));
        assert_eq!(dirhash(t.path()).unwrap(), expected);
        assert_eq!(short(&expected).len(), 16);
        assert_eq!(short(&expected), &expected[7..23]);
        verify(t.path(), &expected, "p").unwrap();
    }

    #[test]
    fn git_dir_at_the_top_is_excluded_and_empty_dirs_do_not_count() {
        let t = tree();
        let before = dirhash(t.path()).unwrap();
        fs::create_dir_all(t.path().join(".git/objects")).unwrap();
        fs::write(t.path().join(".git/HEAD"), "ref").unwrap();
        fs::create_dir(t.path().join("empty")).unwrap();
        assert_eq!(dirhash(t.path()).unwrap(), before);
        // A nested .git is content like any other.
        fs::create_dir(t.path().join("lib/.git")).unwrap();
        fs::write(t.path().join("lib/.git/x"), "x").unwrap();
        assert_ne!(dirhash(t.path()).unwrap(), before);
    }

    fn tampered(f: impl FnOnce(&Path)) {
        let t = tree();
        let d = dirhash(t.path()).unwrap();
        f(t.path());
        let e = verify(t.path(), &d, "opensandbox").unwrap_err();
        assert_eq!(e.code, ErrorCode::IntegrityFailed);
        assert_eq!(
            e.to_string(),
            "[E8011] Provider 'opensandbox': files changed since install."
        );
        assert_eq!(
            e.suggestion,
            "Reinstall or run 'abx provider update opensandbox'."
        );
    }

    #[test]
    fn a_git_dir_appearing_in_an_installed_tree_is_e8011() {
        tampered(|r| {
            fs::create_dir_all(r.join(".git/hooks")).unwrap();
            fs::write(r.join(".git/hooks/post-checkout"), "#!/bin/sh\n").unwrap();
        });
        // Even an empty one: an installed tree never holds a .git.
        tampered(|r| fs::create_dir(r.join(".git")).unwrap());
        tampered(|r| fs::write(r.join(".git"), "gitdir: /elsewhere\n").unwrap());
        tampered(|r| {
            fs::create_dir(r.join("lib/.git")).unwrap();
            fs::write(r.join("lib/.git/config"), "x").unwrap();
        });
    }

    #[test]
    fn a_tree_past_the_install_caps_is_e8011_without_hashing() {
        // 1 TiB sparse: hashing it would take hours; the check answers at once.
        let start = std::time::Instant::now();
        tampered(|r| {
            fs::File::create(r.join("huge.bin"))
                .unwrap()
                .set_len(1 << 40)
                .unwrap()
        });
        tampered(|r| {
            for i in 0..5 {
                fs::File::create(r.join(format!("big{i}.bin")))
                    .unwrap()
                    .set_len(60 << 20)
                    .unwrap();
            }
        });
        assert!(start.elapsed() < std::time::Duration::from_secs(60));
    }

    #[test]
    fn every_tamper_variant_is_e8011() {
        tampered(|r| fs::write(r.join("provider.mjs"), "console.log(2)\n").unwrap());
        tampered(|r| fs::write(r.join("abx-provider.toml"), "schema = 2\n").unwrap());
        tampered(|r| fs::write(r.join("extra.js"), "").unwrap());
        tampered(|r| fs::write(r.join("lib/sub/new.js"), "").unwrap());
        tampered(|r| fs::remove_file(r.join("lib/a.js")).unwrap());
        tampered(|r| fs::rename(r.join("lib/a.js"), r.join("lib/c.js")).unwrap());
        tampered(|r| {
            fs::set_permissions(r.join("provider.mjs"), fs::Permissions::from_mode(0o744)).unwrap()
        });
        tampered(|r| {
            fs::set_permissions(r.join("run.sh"), fs::Permissions::from_mode(0o644)).unwrap()
        });
        tampered(|r| {
            // Same content, but through a symlink.
            let copy = r.parent().unwrap().join(format!(
                "outside-{}",
                r.file_name().unwrap().to_string_lossy()
            ));
            fs::copy(r.join("provider.mjs"), &copy).unwrap();
            fs::remove_file(r.join("provider.mjs")).unwrap();
            symlink(&copy, r.join("provider.mjs")).unwrap();
        });
        tampered(|r| {
            fs::remove_dir_all(r.join("lib/sub")).unwrap();
            symlink("/tmp", r.join("lib/sub")).unwrap();
        });
        tampered(|r| {
            let c = std::ffi::CString::new(r.join("fifo").as_os_str().as_bytes()).unwrap();
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        });
        tampered(|r| fs::remove_dir_all(r).unwrap());
    }

    #[test]
    fn special_files_are_refused_when_hashing() {
        let t = tree();
        symlink("provider.mjs", t.path().join("lib/link")).unwrap();
        let e = dirhash(t.path()).unwrap_err();
        assert_eq!(e.code, ErrorCode::Refused);
        assert!(e.message.contains("symlink at 'lib/link'"), "{}", e.message);
        match dirhash_tree(t.path()) {
            Err(TreeError::Special { path, kind }) => {
                assert_eq!((path.as_str(), kind), ("lib/link", "symlink"))
            }
            other => panic!("{other:?}"),
        }
        let t = tree();
        let sock = t.path().join("s.sock");
        let _l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        assert!(matches!(
            dirhash_tree(t.path()),
            Err(TreeError::Special { kind: "socket", .. })
        ));
        let t = tree();
        fs::write(t.path().join("a\nb"), "").unwrap();
        assert!(matches!(
            dirhash_tree(t.path()),
            Err(TreeError::BadName { .. })
        ));
    }

    #[test]
    fn the_private_copy_is_what_was_hashed() {
        let t = tree();
        let d = dirhash(t.path()).unwrap();
        let out = tempfile::tempdir().unwrap();
        let dst = out.path().join("copy");
        fs::create_dir(&dst).unwrap();
        copy_verified(t.path(), &dst, &d).unwrap();
        // Same digest, same bytes, the execute bit kept.
        assert_eq!(dirhash(&dst).unwrap(), d);
        assert_eq!(fs::read(dst.join("lib/sub/b.js")).unwrap(), b"b");
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dst.join("run.sh")), 0o755);
        assert_eq!(mode(&dst.join("provider.mjs")), 0o644);
        // A tree that differs is refused with why (the copy is not to be run).
        fs::write(t.path().join("provider.mjs"), "console.log(2)\n").unwrap();
        let dst2 = out.path().join("copy2");
        fs::create_dir(&dst2).unwrap();
        let why = copy_verified(t.path(), &dst2, &d).unwrap_err();
        assert!(why.starts_with("digest sha256:"), "{why}");
        fs::create_dir(t.path().join(".git")).unwrap();
        let dst3 = out.path().join("copy3");
        fs::create_dir(&dst3).unwrap();
        assert!(copy_verified(t.path(), &dst3, &d)
            .unwrap_err()
            .contains(".git"));
    }

    #[test]
    fn large_files_stream() {
        let t = tempfile::tempdir().unwrap();
        let f = File::create(t.path().join("big")).unwrap();
        f.set_len(8 << 20).unwrap(); // sparse 8 MiB of zeros
        let d = dirhash(t.path()).unwrap();
        let zeros = hex(&Sha256::digest(vec![0u8; 8 << 20]));
        let listing = format!("{zeros} - big\n");
        assert_eq!(
            d,
            format!("sha256:{}", hex(&Sha256::digest(listing.as_bytes())))
        );
    }

    #[test]
    fn normalize_digests() {
        let h = "A".repeat(64);
        assert_eq!(normalize(&h), Some(format!("sha256:{}", "a".repeat(64))));
        assert_eq!(
            normalize(&format!("sha256:{}", "b".repeat(64))),
            Some(format!("sha256:{}", "b".repeat(64)))
        );
        assert_eq!(normalize("sha256:abc"), None);
        assert_eq!(normalize(&"g".repeat(64)), None);
        assert_eq!(short("sha256:0123456789abcdef0123"), "0123456789abcdef");
        assert_eq!(short("abc"), "abc");
    }
}
