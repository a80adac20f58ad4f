//! Importing images without a registry (offline machines): a `docker save` archive (a tar
//! with `manifest.json`, the config and the layer tars) or an OCI image layout directory
//! (`oci-layout`, `index.json`, `blobs/sha256/...`; also inside a tar).
//!
//! Every blob is checked: an OCI layout's blobs against the digests that name them, a
//! `docker save` archive's layers against the config's `rootfs.diff_ids` (the sha256 of the
//! uncompressed layer) and its config against its file name where that is a digest.

use super::{digest_hex, mismatch, unpack, Image, ImageConfig, Store};
use abx_protocol::{AbxError, ErrorCode};
use serde_json::Value;
use sha2::{Digest, Sha256};
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

fn read_json(p: &Path) -> Result<Value, AbxError> {
    let b = std::fs::read(p).map_err(|e| bad(p, e))?;
    serde_json::from_slice(&b).map_err(|e| bad(p, e))
}

/// Import `path` (a tar or a directory); `name` names it (default: the archive's own tag).
pub fn import(
    store: &Store,
    path: &Path,
    name: Option<&str>,
    tag: Option<&str>,
) -> Result<Image, AbxError> {
    let md = std::fs::metadata(path).map_err(|e| bad(path, e))?;
    let _tmp;
    let dir: PathBuf = if md.is_dir() {
        path.to_path_buf()
    } else {
        let t =
            tempfile::tempdir_in(store.dir.join("tmp").tap_mkdir()).map_err(|e| bad(path, e))?;
        let root = unpack::Root::open(t.path(), None).map_err(|e| bad(path, e))?;
        root.apply(
            unpack::layer_reader(path).map_err(|e| bad(path, e))?,
            &mut store.limits.budget(),
        )
        .map_err(|e| {
            if unpack::is_over_budget(&e) {
                super::too_big(&path.display().to_string(), &store.limits)
            } else {
                bad(path, e)
            }
        })?;
        let d = t.path().to_path_buf();
        _tmp = t;
        d
    };
    let res = if dir.join("manifest.json").is_file() {
        docker_save(store, &dir, name)
    } else if dir.join("index.json").is_file() {
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

trait MkDir {
    fn tap_mkdir(self) -> Self;
}
impl MkDir for PathBuf {
    fn tap_mkdir(self) -> Self {
        let _ = std::fs::create_dir_all(&self);
        self
    }
}

fn inside(dir: &Path, rel: &str) -> Result<PathBuf, AbxError> {
    let c = unpack::clean(Path::new(rel))
        .ok_or_else(|| bad(dir, format!("path {rel:?} leaves the archive")))?;
    Ok(dir.join(c))
}

/// The sha256 of a file, or of its decompressed content (at most `limit` bytes of it: E8012
/// past that, so a decompression bomb is not hashed to its end).
fn file_digest(store: &Store, p: &Path, decompress: bool) -> Result<String, AbxError> {
    let mut r: Box<dyn std::io::Read> = if decompress {
        unpack::layer_reader(p).map_err(|e| bad(p, e))?
    } else {
        Box::new(std::fs::File::open(p).map_err(|e| bad(p, e))?)
    };
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0u64;
    loop {
        let n = r.read(&mut buf).map_err(|e| bad(p, e))?;
        if n == 0 {
            break;
        }
        total += n as u64;
        if decompress && total > store.limits.max_bytes {
            return Err(super::too_big(&p.display().to_string(), &store.limits));
        }
        h.update(&buf[..n]);
    }
    Ok(format!("sha256:{}", super::hex(&h.finalize())))
}

fn docker_save(store: &Store, dir: &Path, name: Option<&str>) -> Result<Image, AbxError> {
    let m = read_json(&dir.join("manifest.json"))?;
    let first = m
        .as_array()
        .and_then(|a| a.first())
        .ok_or_else(|| bad(dir, "manifest.json lists no image"))?;
    let cfg_rel = first
        .get("Config")
        .and_then(|v| v.as_str())
        .ok_or_else(|| bad(dir, "no Config"))?;
    let cfg_path = inside(dir, cfg_rel)?;
    let cfg_b = std::fs::read(&cfg_path).map_err(|e| bad(&cfg_path, e))?;
    let cfg_digest = super::sha256_digest(&cfg_b);
    // The config is named by its digest (`<hex>.json` or `blobs/sha256/<hex>`).
    let stem = cfg_path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("")
        .trim_end_matches(".json");
    if digest_hex(&format!("sha256:{stem}")).is_some() && format!("sha256:{stem}") != cfg_digest {
        return Err(mismatch(&format!("sha256:{stem}"), &cfg_digest));
    }
    let cv: Value = serde_json::from_slice(&cfg_b).map_err(|e| bad(&cfg_path, e))?;
    let diff_ids: Vec<String> = cv
        .pointer("/rootfs/diff_ids")
        .and_then(|v| v.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let layers = first
        .get("Layers")
        .and_then(|v| v.as_array())
        .cloned()
        .unwrap_or_default();
    if diff_ids.len() != layers.len() {
        return Err(bad(
            dir,
            format!(
                "{} layers but {} diff_ids in the config",
                layers.len(),
                diff_ids.len()
            ),
        ));
    }
    let mut stored = Vec::new();
    for (l, want) in layers.iter().zip(&diff_ids) {
        let p = inside(dir, l.as_str().unwrap_or(""))?;
        let got = file_digest(store, &p, true)?;
        if &got != want {
            return Err(mismatch(want, &got));
        }
        let blob = file_digest(store, &p, false)?;
        let size = std::fs::metadata(&p).map_or(0, |m| m.len());
        store.put_blob_file(&p, &blob)?;
        stored.push((blob, size, want.clone()));
    }
    let config = ImageConfig::from_blob(&cfg_b).map_err(|e| bad(&cfg_path, e))?;
    let tag = first
        .get("RepoTags")
        .and_then(|v| v.as_array())
        .and_then(|a| a.first())
        .and_then(|v| v.as_str())
        .map(str::to_owned);
    let name = name
        .map(str::to_owned)
        .or(tag)
        .unwrap_or_else(|| "imported".into());
    let img = store.store_local(&name, &stored, &config, "import", None)?;
    store.install(&img, std::slice::from_ref(&name))?;
    Ok(img)
}

fn blob(store: &Store, dir: &Path, digest: &str) -> Result<PathBuf, AbxError> {
    let h = digest_hex(digest).ok_or_else(|| bad(dir, format!("unsupported digest {digest:?}")))?;
    let p = dir.join("blobs/sha256").join(h);
    store.put_blob_file(&p, digest)
}

fn oci_layout(
    store: &Store,
    dir: &Path,
    name: Option<&str>,
    tag: Option<&str>,
) -> Result<Image, AbxError> {
    let index = read_json(&dir.join("index.json"))?;
    let ms = index
        .get("manifests")
        .and_then(|v| v.as_array())
        .cloned()
        .unwrap_or_default();
    let ref_name = |m: &Value| {
        m.pointer("/annotations/org.opencontainers.image.ref.name")
            .and_then(|v| v.as_str())
            .map(str::to_owned)
    };
    let pick = match tag {
        Some(t) => ms.iter().find(|m| ref_name(m).as_deref() == Some(t)),
        None => ms.first(),
    }
    .ok_or_else(|| bad(dir, format!("no image {} in index.json", tag.unwrap_or(""))))?;
    let mut digest = pick
        .get("digest")
        .and_then(|v| v.as_str())
        .unwrap_or("")
        .to_owned();
    let mut manifest: Value;
    loop {
        let p = blob(store, dir, &digest)?;
        manifest = read_json(&p)?;
        let is_index = manifest.get("manifests").is_some();
        if !is_index {
            break;
        }
        let next = manifest["manifests"]
            .as_array()
            .and_then(|a| {
                a.iter().find(|e| {
                    e.pointer("/platform/os").and_then(|v| v.as_str()) == Some("linux")
                        && e.pointer("/platform/architecture").and_then(|v| v.as_str())
                            == Some(super::registry::go_arch())
                })
            })
            .and_then(|e| e.get("digest").and_then(|v| v.as_str()))
            .ok_or_else(|| bad(dir, "no manifest for this platform in the index"))?;
        digest = next.to_owned();
    }
    let cfg_d = manifest
        .pointer("/config/digest")
        .and_then(|v| v.as_str())
        .unwrap_or("")
        .to_owned();
    let cfg_p = blob(store, dir, &cfg_d)?;
    let cfg_b = std::fs::read(&cfg_p).map_err(|e| bad(&cfg_p, e))?;
    let config = ImageConfig::from_blob(&cfg_b).map_err(|e| bad(&cfg_p, e))?;
    let mut layers = Vec::new();
    let mut size = cfg_b.len() as u64;
    for l in manifest
        .get("layers")
        .and_then(|v| v.as_array())
        .cloned()
        .unwrap_or_default()
    {
        let d = l
            .get("digest")
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_owned();
        let p = blob(store, dir, &d)?;
        size += std::fs::metadata(&p).map_or(0, |m| m.len());
        layers.push(d);
    }
    let name = name
        .map(str::to_owned)
        .or_else(|| ref_name(pick))
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
