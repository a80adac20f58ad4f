//! Importing images without a registry (offline machines): a `docker save` archive (a tar
//! with `manifest.json`, the config and the layer tars) or an OCI image layout directory
//! (`oci-layout`, `index.json`, `blobs/sha256/...`; also inside a tar).
//!
//! Every blob is checked: an OCI layout's blobs against the digests that name them, a
//! `docker save` archive's layers against the config's `rootfs.diff_ids` (the sha256 of the
//! uncompressed layer) and its config against its file name where that is a digest.
//!
//! What the directory holds is untrusted (an archive unpacked here, or a layout someone
//! downloaded): every file in it is opened through the directory's descriptor with
//! `openat2(RESOLVE_BENEATH)`, never by path, and must be a regular file (a FIFO, a device
//! or a directory is refused before it is read: `O_NONBLOCK`, then `fstat`). An OCI layout's
//! files are opened with `RESOLVE_NO_SYMLINKS` and `O_NOFOLLOW` (a blob that is a symlink to
//! `/dev/zero` or to a host file is refused); a `docker save` archive's layers may be
//! relative symlinks that stay beneath it (the legacy format links a repeated layer to its
//! first copy). Every copy is capped: a blob by the size its descriptor declares (and it
//! must have that size), a layer by the store's caps, manifests and configs by
//! [`super::manifest::MAX_MANIFEST`] / [`super::manifest::MAX_CONFIG`]. An archive is
//! unpacked as an archive ([`unpack::Root::extract`]): whiteout names in it are not acted on.
//! Errors name the user's path and which item is wrong, never what the files hold.

use super::manifest::{self, MAX_CONFIG, MAX_LAYERS, MAX_MANIFEST};
use super::unpack::{
    self, fstat, openat2, RESOLVE_BENEATH, RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS,
};
use super::{digest_hex, mismatch, read_capped, Image, ImageConfig, Store};
use abx_protocol::{AbxError, ErrorCode};
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

fn bad(path: &Path, detail: impl std::fmt::Display) -> AbxError {
    AbxError::new(
        ErrorCode::LocalFileError,
        &[
            ("path", &path.display().to_string()),
            ("detail", &detail.to_string()),
        ],
    )
    .with_suggestion("Give a 'docker save' archive or an OCI image layout directory.")
}

/// A directory of an image (a `docker save` archive unpacked, or an OCI layout), its files
/// opened beneath its descriptor only.
struct Dir {
    fd: OwnedFd,
    /// The path the user named (for errors).
    shown: PathBuf,
}

impl Dir {
    fn open(path: &Path, shown: &Path) -> Result<Dir, AbxError> {
        let f = File::open(path).map_err(|e| bad(shown, e))?;
        if !f.metadata().map_err(|e| bad(shown, e))?.is_dir() {
            return Err(bad(shown, "not a directory"));
        }
        Ok(Dir {
            fd: f.into(),
            shown: shown.to_path_buf(),
        })
    }

    /// The regular file `rel` beneath the directory and its size: symlinks only where
    /// `symlinks` (and then only ones that stay beneath), `what` names it in errors.
    fn file(&self, rel: &str, symlinks: bool, what: &str) -> Result<(File, u64), AbxError> {
        let clean = unpack::clean(Path::new(rel))
            .filter(|c| !c.as_os_str().is_empty())
            .ok_or_else(|| bad(&self.shown, format!("{what}: its path leaves the archive")))?;
        let mut resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
        let mut flags = libc::O_RDONLY | libc::O_NONBLOCK;
        if !symlinks {
            resolve |= RESOLVE_NO_SYMLINKS;
            flags |= libc::O_NOFOLLOW;
        }
        let fd = openat2(self.fd.as_raw_fd(), &clean, flags, resolve).map_err(|e| {
            let why = match e.raw_os_error() {
                Some(libc::ELOOP) => "a symlink (refused)".to_owned(),
                Some(libc::EXDEV) => "a link out of the archive (refused)".to_owned(),
                _ => e.to_string(),
            };
            bad(&self.shown, format!("{what}: {why}"))
        })?;
        let st = fstat(fd.as_raw_fd()).map_err(|e| bad(&self.shown, e))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(bad(
                &self.shown,
                format!("{what}: not a regular file (refused)"),
            ));
        }
        // Back to blocking reads (a regular file never blocks; the flag only kept a FIFO
        // from holding the open).
        // SAFETY: fcntl on our descriptor.
        unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, 0) };
        Ok((File::from(fd), st.st_size.max(0) as u64))
    }

    /// Whether `rel` is a file of the directory (no symlink).
    fn has(&self, rel: &str) -> bool {
        self.file(rel, false, rel).is_ok()
    }

    /// The whole of a small file (at most `max` bytes).
    fn read(&self, rel: &str, symlinks: bool, max: u64, what: &str) -> Result<Vec<u8>, AbxError> {
        let (f, n) = self.file(rel, symlinks, what)?;
        if n > max {
            return Err(bad(
                &self.shown,
                format!("{what}: {n} bytes, over the {max} read of such a file"),
            ));
        }
        read_capped(f, max).map_err(|e| bad(&self.shown, format!("{what}: {e}")))
    }
}

/// Import `path` (a tar or a directory); `name` names it (default: the archive's own tag).
pub fn import(
    store: &Store,
    path: &Path,
    name: Option<&str>,
    tag: Option<&str>,
) -> Result<Image, AbxError> {
    // The path the user named is followed; nothing inside it is.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| bad(path, e))?;
    let md = f.metadata().map_err(|e| bad(path, e))?;
    let _tmp;
    let dir = if md.is_dir() {
        Dir::open(path, path)?
    } else if md.is_file() {
        // SAFETY: fcntl on our descriptor (blocking reads again).
        unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETFL, 0) };
        let tmp = store.dir.join("tmp");
        let _ = std::fs::create_dir_all(&tmp);
        let t = tempfile::tempdir_in(&tmp).map_err(|e| bad(path, e))?;
        let root = unpack::Root::open(t.path(), None).map_err(|e| bad(path, e))?;
        root.extract(
            super::layer_reader(f).map_err(|e| bad(path, e))?,
            &mut store.limits.budget(),
        )
        .map_err(|e| {
            if unpack::is_over_budget(&e) {
                super::too_big(&path.display().to_string(), &store.limits)
            } else {
                bad(path, e)
            }
        })?;
        let d = Dir::open(t.path(), path)?;
        _tmp = t;
        d
    } else {
        return Err(bad(path, "neither a regular file nor a directory"));
    };
    let res = if dir.has("manifest.json") {
        docker_save(store, &dir, name)
    } else if dir.has("index.json") {
        oci_layout(store, &dir, name, tag)
    } else {
        Err(bad(
            path,
            "neither manifest.json (docker save) nor index.json (OCI layout) found",
        ))
    };
    if res.is_err() {
        // The blobs a failed import stored go again.
        store.gc_blobs();
    }
    res
}

/// The sha256 of a layer's decompressed content (at most the store's cap of it: E8012 past
/// that, so a decompression bomb is not hashed to its end).
fn diff_id(store: &Store, dir: &Dir, f: File, what: &str) -> Result<String, AbxError> {
    let mut r = super::layer_reader(f).map_err(|e| bad(&dir.shown, format!("{what}: {e}")))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0u64;
    loop {
        let n = r
            .read(&mut buf)
            .map_err(|e| bad(&dir.shown, format!("{what}: {e}")))?;
        if n == 0 {
            break;
        }
        total += n as u64;
        if total > store.limits.max_bytes {
            return Err(super::too_big(
                &dir.shown.display().to_string(),
                &store.limits,
            ));
        }
        h.update(&buf[..n]);
    }
    Ok(format!("sha256:{}", super::hex(&h.finalize())))
}

fn docker_save(store: &Store, dir: &Dir, name: Option<&str>) -> Result<Image, AbxError> {
    let mb = dir.read("manifest.json", false, MAX_MANIFEST, "manifest.json")?;
    let m =
        manifest::docker_save(&mb).map_err(|e| bad(&dir.shown, format!("manifest.json: {e}")))?;
    let cfg_b = dir.read(&m.config, true, MAX_CONFIG, "the config")?;
    let cfg_digest = super::sha256_digest(&cfg_b);
    // The config is named by its digest (`<hex>.json` or `blobs/sha256/<hex>`).
    let stem = Path::new(&m.config)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("")
        .trim_end_matches(".json");
    if digest_hex(&format!("sha256:{stem}")).is_some() && format!("sha256:{stem}") != cfg_digest {
        return Err(mismatch(&format!("sha256:{stem}"), &cfg_digest));
    }
    let cfg = manifest::config(&cfg_b).map_err(|e| bad(&dir.shown, format!("the config: {e}")))?;
    let diff_ids = cfg.diff_ids();
    if diff_ids.len() != m.layers.0.len() {
        return Err(bad(
            &dir.shown,
            format!(
                "{} layers but {} diff_ids in the config",
                m.layers.0.len(),
                diff_ids.len()
            ),
        ));
    }
    let mut stored = Vec::new();
    for (i, (l, want)) in m.layers.0.iter().zip(diff_ids).enumerate() {
        let what = format!("layer {}", i + 1);
        let (f, n) = dir.file(l, true, &what)?;
        if n > store.limits.max_bytes {
            return Err(super::too_big(
                &dir.shown.display().to_string(),
                &store.limits,
            ));
        }
        let got = diff_id(store, dir, f, &what)?;
        if &got != want {
            return Err(mismatch(want, &got));
        }
        // The blob is the file as it is, hashed as it is copied (at most its size).
        let (mut f, n) = dir.file(l, true, &what)?;
        let (_, blob, size) = store.put_blob_from(&mut f, None, n)?;
        stored.push((blob, size, want.clone()));
    }
    let config = ImageConfig::from_config(&cfg);
    let tag = m.repo_tags.as_ref().and_then(|t| t.0.first()).cloned();
    let name = name
        .map(str::to_owned)
        .or(tag)
        .unwrap_or_else(|| "imported".into());
    let img = store.store_local(&name, &stored, &config, "import", None)?;
    store.install(&img, std::slice::from_ref(&name))?;
    Ok(img)
}

/// Store the blob `d` of the layout: exactly the size it declares, at most `cap` bytes (a
/// layer: the store's cap, E8012 past it).
fn blob(
    store: &Store,
    dir: &Dir,
    d: &manifest::Descriptor,
    cap: Option<u64>,
    what: &str,
) -> Result<String, AbxError> {
    let h = digest_hex(&d.digest)
        .ok_or_else(|| bad(&dir.shown, format!("{what}: not a sha256 digest")))?;
    if store.has_blob(&d.digest) {
        return Ok(d.digest.clone());
    }
    let declared = d.size();
    match cap {
        None if declared > store.limits.max_bytes => {
            return Err(super::too_big(
                &dir.shown.display().to_string(),
                &store.limits,
            ))
        }
        Some(cap) if declared > cap => {
            return Err(bad(
                &dir.shown,
                format!("{what}: {declared} bytes declared, over the {cap} read of such a blob"),
            ))
        }
        _ => {}
    }
    let (mut f, n) = dir.file(&format!("blobs/sha256/{h}"), false, what)?;
    if n != declared {
        return Err(bad(
            &dir.shown,
            format!("{what}: {n} bytes where its descriptor declares {declared}"),
        ));
    }
    store.put_blob_from(&mut f, Some(&d.digest), declared)?;
    Ok(d.digest.clone())
}

fn oci_layout(
    store: &Store,
    dir: &Dir,
    name: Option<&str>,
    tag: Option<&str>,
) -> Result<Image, AbxError> {
    let ib = dir.read("index.json", false, MAX_MANIFEST, "index.json")?;
    let index = manifest::manifest(&ib).map_err(|e| bad(&dir.shown, format!("index.json: {e}")))?;
    let ms = index.manifests.map(|m| m.0).unwrap_or_default();
    let pick = match tag {
        Some(t) => ms.iter().find(|m| m.ref_name() == Some(t)),
        None => ms.first(),
    }
    .ok_or_else(|| {
        bad(
            &dir.shown,
            match tag {
                Some(t) => format!("no image {t} in index.json"),
                None => "no image in index.json".to_owned(),
            },
        )
    })?;
    let mut desc = pick.clone();
    let mut manifest: manifest::Manifest;
    let mut depth = 0;
    loop {
        let digest = blob(store, dir, &desc, Some(MAX_MANIFEST), "a manifest")?;
        let b = store.read_blob(&digest, MAX_MANIFEST)?;
        manifest =
            manifest::manifest(&b).map_err(|e| bad(&dir.shown, format!("a manifest: {e}")))?;
        if manifest.manifests.is_none() {
            break;
        }
        depth += 1;
        if depth > 4 {
            return Err(bad(&dir.shown, "indexes nested more than 4 deep"));
        }
        desc = manifest
            .platform("linux", super::registry::go_arch())
            .cloned()
            .ok_or_else(|| bad(&dir.shown, "no manifest for this platform in the index"))?;
    }
    let digest = desc.digest.clone();
    let cfg_desc = manifest.config.clone().unwrap_or_default();
    let cfg_d = blob(store, dir, &cfg_desc, Some(MAX_CONFIG), "the config")?;
    let cfg_b = store.read_blob(&cfg_d, MAX_CONFIG)?;
    let config =
        ImageConfig::from_blob(&cfg_b).map_err(|e| bad(&dir.shown, format!("the config: {e}")))?;
    let declared: u64 = manifest
        .layers
        .0
        .iter()
        .fold(0u64, |a, l| a.saturating_add(l.size()));
    if declared > store.limits.max_bytes || manifest.layers.0.len() > MAX_LAYERS {
        return Err(super::too_big(
            &dir.shown.display().to_string(),
            &store.limits,
        ));
    }
    let mut layers = Vec::new();
    let mut size = cfg_b.len() as u64;
    for (i, l) in manifest.layers.0.iter().enumerate() {
        let d = blob(store, dir, l, None, &format!("layer {}", i + 1))?;
        size += l.size();
        layers.push(d);
    }
    let name = name
        .map(str::to_owned)
        .or_else(|| pick.ref_name().map(str::to_owned))
        .unwrap_or_else(|| "imported".into());
    let img = Image {
        name: name.clone(),
        digest: digest.clone(),
        layers,
        size,
        pulled_at: abx_home::util::rfc3339(abx_home::util::now_ms() / 1000),
        source: "import".into(),
        base: None,
        config,
    };
    store.keep_blobs(&digest, &[cfg_d, digest.clone()]);
    store.install(&img, &[name])?;
    Ok(img)
}
