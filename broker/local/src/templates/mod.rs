//! Templates of the `local` provider: OCI images, stored content-addressed under the
//! provider's data dir, and sandboxes saved as templates (issue 22).
//!
//! Layout of `data/local/templates/`:
//! - `blobs/sha256/<hex>`: every blob (manifests, configs, layers), written only after its
//!   sha256 matched the digest it was asked for; a blob is stored once whatever uses it.
//! - `images/<hex>/image.json`: one image (its manifest digest): name, layers, config (Env,
//!   WorkingDir, User, Entrypoint, Cmd), size, when pulled; `images/<hex>/rootfs/`: its layers
//!   applied in order (one flattened tree per image, see [`unpack`]), the read-only lower
//!   layer of every sandbox made from it.
//! - `names.json`: name -> digest. A tag resolves to a digest once (pull or import) and stays
//!   pinned until the next `templates/pull`; a sandbox records the digest it started from.
//!
//! - [`registry`]: pulls from an OCI / Docker registry v2 (through `oci-client`).
//! - [`archive`]: imports a `docker save` tar or an OCI layout directory.
//! - [`tarstream`]: reads tar streams (layers, archives) with every header checked before
//!   its data; the whiteout grammar.
//! - [`manifest`]: the JSON of images (manifests, indexes, configs), typed and capped.
//! - [`unpack`]: applies layers safely; tree copies.
//! - [`build`]: a sandbox's layer read through descriptors, its processes stopped meanwhile.
//! - [`dockerfile`]: builds a Dockerfile in a context directory (issue 49): its steps are
//!   images of their own (`source: "step"`, unnamed, not listed), found again by a cache key.
//!
//! Nothing an image holds is quoted in an error or a log line: errors say where (a path of
//! the host the user named, a byte offset, a line and column) and what, never the bytes.

pub mod archive;
pub mod build;
pub mod dockerfile;
pub mod init;
pub mod manifest;
pub mod registry;
pub mod tarstream;
pub mod unpack;

use abx_home::util::{now_ms, replace_file, rfc3339};
use abx_protocol::{AbxError, ErrorCode};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The host template: no image, the host's system directories read-only.
pub const HOST_TEMPLATE: &str = "base";

/// What of an image's config a sandbox honours.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ImageConfig {
    /// `KEY=value` entries, applied under the sandbox's and the exec's env.
    #[serde(default)]
    pub env: Vec<String>,
    /// The default working directory of an exec.
    #[serde(default)]
    pub working_dir: Option<String>,
    /// `uid[:gid]` (numeric, or a name of the image's /etc/passwd).
    #[serde(default)]
    pub user: Option<String>,
    /// Recorded and shown; exec runs the command it is given.
    #[serde(default)]
    pub entrypoint: Option<Vec<String>>,
    /// See `entrypoint`.
    #[serde(default)]
    pub cmd: Option<Vec<String>>,
    /// `Labels` (a built image's `LABEL`s).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// `ExposedPorts`, as `80/tcp` (a built image's `EXPOSE`s).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exposed_ports: Vec<String>,
}

impl ImageConfig {
    /// From an OCI / Docker image config blob (its `config` object; `Config` in older ones).
    pub fn from_blob(blob: &[u8]) -> Result<ImageConfig, String> {
        let c = manifest::config(blob).map_err(|e| format!("image config: {e}"))?;
        Ok(Self::from_config(&c))
    }

    /// From a parsed image config.
    pub fn from_config(c: &manifest::Config) -> ImageConfig {
        let Some(r) = c.run() else {
            return ImageConfig::default();
        };
        let s = |v: &Option<String>| v.clone().filter(|x| !x.is_empty());
        ImageConfig {
            env: r.env.clone().map(|v| v.0).unwrap_or_default(),
            working_dir: s(&r.working_dir),
            user: s(&r.user),
            entrypoint: r.entrypoint.clone().map(|v| v.0),
            cmd: r.cmd.clone().map(|v| v.0),
            ..ImageConfig::default()
        }
    }
}

/// One stored image.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Image {
    /// The name it was pulled, imported or built as.
    pub name: String,
    /// Its manifest digest (`sha256:...`).
    pub digest: String,
    /// Layer blob digests, lowest first.
    pub layers: Vec<String>,
    /// Bytes of its blobs (as stored).
    pub size: u64,
    /// When it was stored (RFC 3339).
    pub pulled_at: String,
    /// `registry`, `import` or `build`.
    pub source: String,
    /// The image it was built on (`build`).
    #[serde(default)]
    pub base: Option<String>,
    /// Its config.
    pub config: ImageConfig,
}

impl Image {
    /// The `templates/list` entry.
    pub fn view(&self, names: &[String]) -> Value {
        json!({
            "name": self.name,
            "names": names,
            "digest": self.digest,
            "size": self.size,
            "pulledAt": self.pulled_at,
            "source": self.source,
            "base": self.base,
            "layers": self.layers.len(),
            "config": self.config,
        })
    }
}

/// The `[local]` keys for registries. Its `Debug` shows the users, never the passwords.
#[derive(Clone, Default)]
pub struct RegistrySettings {
    /// Registries reached over plain HTTP besides loopback ones (`insecure_registries`).
    pub insecure: Vec<String>,
    /// Credentials per registry host (`[local.registry_auth]` `"host" = "user:password"`).
    pub auth: BTreeMap<String, (String, String)>,
}

impl std::fmt::Debug for RegistrySettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let auth: BTreeMap<&str, String> = self
            .auth
            .iter()
            .map(|(h, (u, _))| (h.as_str(), format!("{u}:<redacted>")))
            .collect();
        f.debug_struct("RegistrySettings")
            .field("insecure", &self.insecure)
            .field("auth", &auth)
            .finish()
    }
}

/// Caps on what one image may unpack to (`[local] template_max_bytes`,
/// `template_max_entries`): a pull or import past them is E8012 and leaves nothing behind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Unpacked bytes of all its layers together (default 16 GiB); also caps the
    /// compressed size a registry's manifest declares.
    pub max_bytes: u64,
    /// Entries of all its layers together (default 4,000,000).
    pub max_entries: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_bytes: 16 << 30,
            max_entries: 4_000_000,
        }
    }
}

impl Limits {
    /// A fresh budget of these caps.
    pub fn budget(&self) -> unpack::Budget {
        unpack::Budget {
            bytes: self.max_bytes,
            entries: self.max_entries,
        }
    }
}

/// E8012: `what` goes over the caps.
pub fn too_big(what: &str, limits: &Limits) -> AbxError {
    AbxError::new(
        ErrorCode::Refused,
        &[
            (
                "detail",
                &format!(
                    "'{what}' is larger than this broker accepts for a template (at most {} bytes unpacked and {} entries: [local] template_max_bytes and template_max_entries); nothing of it was kept",
                    limits.max_bytes, limits.max_entries
                ),
            ),
            (
                "rerun",
                "If you trust this image, raise [local] template_max_bytes (or template_max_entries) in the broker config (config.toml), restart the broker and retry.",
            ),
        ],
    )
}

/// The store of templates.
pub struct Store {
    dir: PathBuf,
    owner: Option<(u32, u32)>,
    /// The registry settings.
    pub registry: RegistrySettings,
    /// The caps on an image's size.
    pub limits: Limits,
    /// One writer at a time (pull, import, build, remove).
    pub lock: tokio::sync::Mutex<()>,
}

/// A sha256 digest string of bytes.
pub fn sha256_digest(b: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(b)))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The hex of a `sha256:` digest (checked: 64 lowercase hex digits).
pub fn digest_hex(d: &str) -> Option<&str> {
    let h = d.strip_prefix("sha256:")?;
    (h.len() == 64
        && h.bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)))
    .then_some(h)
}

fn mismatch(expected: &str, actual: &str) -> AbxError {
    AbxError::new(
        ErrorCode::DigestMismatch,
        &[("expected", expected), ("actual", actual)],
    )
    .with_suggestion("The blob's content does not match its digest: the registry or the archive is corrupt or was tampered with. Nothing of it was stored.")
}

fn io_err(what: &str, e: impl std::fmt::Display) -> AbxError {
    AbxError::internal(format!("templates: {what}: {e}"))
}

/// A blob being written: hashed as it is written, stored under its digest only if it matches.
pub struct BlobWriter {
    tmp: tempfile::NamedTempFile,
    hash: Sha256,
    /// Bytes written.
    pub len: u64,
}

impl BlobWriter {
    /// Append bytes.
    pub fn write(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.hash.update(b);
        self.len += b.len() as u64;
        self.tmp.write_all(b)
    }
}

impl Store {
    /// The store beneath `data_dir/local/templates`; files owned by `owner` where given.
    pub fn new(data_dir: &Path, owner: Option<(u32, u32)>, registry: RegistrySettings) -> Store {
        Store {
            dir: data_dir.join("local/templates"),
            owner,
            registry,
            limits: Limits::default(),
            lock: tokio::sync::Mutex::new(()),
        }
    }

    /// The same store with other caps.
    pub fn with_limits(mut self, limits: Limits) -> Store {
        self.limits = limits;
        self
    }

    fn blobs(&self) -> PathBuf {
        self.dir.join("blobs/sha256")
    }

    /// Where a stored blob is.
    pub fn blob_path(&self, digest: &str) -> Option<PathBuf> {
        digest_hex(digest).map(|h| self.blobs().join(h))
    }

    /// Whether a blob is stored.
    pub fn has_blob(&self, digest: &str) -> bool {
        self.blob_path(digest).is_some_and(|p| p.is_file())
    }

    /// Start writing a blob.
    pub fn blob_writer(&self) -> Result<BlobWriter, AbxError> {
        let d = self.dir.join("tmp");
        std::fs::create_dir_all(&d).map_err(|e| io_err("tmp dir", e))?;
        Ok(BlobWriter {
            tmp: tempfile::NamedTempFile::new_in(&d).map_err(|e| io_err("tmp file", e))?,
            hash: Sha256::new(),
            len: 0,
        })
    }

    /// Finish a blob: stored under `expected` when its content matches (else E8013).
    pub fn commit_blob(&self, w: BlobWriter, expected: &str) -> Result<PathBuf, AbxError> {
        let actual = format!("sha256:{}", hex(&w.hash.finalize()));
        if actual != expected {
            return Err(mismatch(expected, &actual));
        }
        let dst = self.blob_path(expected).ok_or_else(|| {
            AbxError::invalid_params("templates", format!("unsupported digest {expected:?}"))
        })?;
        std::fs::create_dir_all(self.blobs()).map_err(|e| io_err("blob dir", e))?;
        w.tmp
            .persist(&dst)
            .map_err(|e| io_err("storing a blob", e.error))?;
        Ok(dst)
    }

    /// Store bytes as a blob under `expected` (checked).
    pub fn put_blob(&self, bytes: &[u8], expected: &str) -> Result<PathBuf, AbxError> {
        let mut w = self.blob_writer()?;
        w.write(bytes).map_err(|e| io_err("writing a blob", e))?;
        self.commit_blob(w, expected)
    }

    /// Copy what `src` reads into the store as a blob, at most `max` bytes (a source that has
    /// more is refused: E8012 when `max` is the store's cap, else a file error from the
    /// caller), stored under `expected` when given (checked, E8013), else under its own
    /// digest. Returns where it is stored, its digest and its size.
    pub fn put_blob_from(
        &self,
        src: &mut dyn std::io::Read,
        expected: Option<&str>,
        max: u64,
    ) -> Result<(PathBuf, String, u64), AbxError> {
        if let Some(d) = expected.filter(|d| self.has_blob(d)) {
            let p = self.blob_path(d).expect("digest");
            let n = p.metadata().map_or(0, |m| m.len());
            return Ok((p, d.to_owned(), n));
        }
        let mut w = self.blob_writer()?;
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            let n = src.read(&mut buf).map_err(|e| io_err("reading", e))?;
            if n == 0 {
                break;
            }
            if w.len + n as u64 > max {
                return Err(AbxError::new(
                    ErrorCode::Refused,
                    &[(
                        "detail",
                        &format!("a blob is longer than the {max} bytes it may have (its declared size, or the store's caps); nothing of it was kept"),
                    )],
                ));
            }
            w.write(&buf[..n])
                .map_err(|e| io_err("writing a blob", e))?;
        }
        let len = w.len;
        let digest = match expected {
            Some(d) => d.to_owned(),
            None => format!("sha256:{}", hex(&w.hash.clone().finalize())),
        };
        let p = self.commit_blob(w, &digest)?;
        Ok((p, digest, len))
    }

    /// Read a stored blob whole, refused past `max` bytes (manifests, configs).
    pub fn read_blob(&self, digest: &str, max: u64) -> Result<Vec<u8>, AbxError> {
        let p = self
            .blob_path(digest)
            .ok_or_else(|| io_err("blob", format!("unsupported digest {digest:?}")))?;
        let f = std::fs::File::open(&p).map_err(|e| io_err("blob", e))?;
        read_capped(f, max).map_err(|e| io_err("blob", e))
    }

    fn image_dir(&self, digest: &str) -> Option<PathBuf> {
        digest_hex(digest).map(|h| self.dir.join("images").join(h))
    }

    /// The flattened root of a stored image.
    pub fn rootfs(&self, digest: &str) -> Option<PathBuf> {
        self.image_dir(digest)
            .map(|d| d.join("rootfs"))
            .filter(|p| p.is_dir())
    }

    /// A stored image by digest.
    pub fn image(&self, digest: &str) -> Option<Image> {
        let d = self.image_dir(digest)?;
        let b = std::fs::read(d.join("image.json")).ok()?;
        serde_json::from_slice(&b).ok()
    }

    fn names(&self) -> BTreeMap<String, String> {
        std::fs::read(self.dir.join("names.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    fn save_names(&self, n: &BTreeMap<String, String>) -> Result<(), AbxError> {
        std::fs::create_dir_all(&self.dir).map_err(|e| io_err("store dir", e))?;
        replace_file(
            &self.dir.join("names.json"),
            &serde_json::to_vec_pretty(n).unwrap_or_default(),
        )
        .map_err(|e| io_err("names.json", e))
    }

    /// Point `names` at `digest`.
    pub fn tag(&self, names: &[String], digest: &str) -> Result<(), AbxError> {
        let mut n = self.names();
        for name in names {
            n.insert(name.clone(), digest.to_owned());
        }
        self.save_names(&n)
    }

    /// The stored image a template names: a name (as given or normalized), or a digest
    /// (`sha256:...`, `name@sha256:...`).
    pub fn lookup(&self, template: &str) -> Option<Image> {
        let names = self.names();
        if let Some(d) = names.get(template) {
            return self.image(d);
        }
        if let Ok(r) = registry::parse_ref(template) {
            if let Some(d) = names.get(&r.whole()) {
                return self.image(d);
            }
            if let Some(d) = r.digest() {
                return self.image(d);
            }
        }
        let d = template.rsplit('@').next().unwrap_or(template);
        if digest_hex(d).is_some() {
            return self.image(d);
        }
        None
    }

    /// Record an image and flatten its layers into its rootfs (once per digest).
    pub fn install(&self, img: &Image, names: &[String]) -> Result<(), AbxError> {
        let dir = self
            .image_dir(&img.digest)
            .ok_or_else(|| io_err("image", "bad digest"))?;
        if !dir.join("rootfs").is_dir() {
            let tmp = dir.with_extension(format!("tmp-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&tmp);
            if let Err(e) = self.unpack_into(img, &tmp) {
                // Nothing of a failed image stays: its partial root, its record, the blobs
                // no other image uses.
                let _ = std::fs::remove_dir_all(&tmp);
                let _ = std::fs::remove_dir_all(&dir);
                self.gc_blobs();
                return Err(e);
            }
            std::fs::create_dir_all(dir.parent().expect("images"))
                .map_err(|e| io_err("images", e))?;
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::rename(&tmp, &dir).map_err(|e| io_err("installing the image", e))?;
        } else {
            self.write_record(&dir, img)?;
        }
        self.tag(names, &img.digest)
    }

    /// Apply an image's layers (within the caps) into `tmp/rootfs` and write its record
    /// (and the record of its other blobs) there.
    fn unpack_into(&self, img: &Image, tmp: &Path) -> Result<(), AbxError> {
        let root =
            unpack::Root::open(&tmp.join("rootfs"), self.owner).map_err(|e| io_err("rootfs", e))?;
        let mut budget = self.limits.budget();
        for l in &img.layers {
            let f = self
                .blob_path(l)
                .and_then(|p| std::fs::File::open(p).ok())
                .ok_or_else(|| io_err("layer", format!("{l} is not stored")))?;
            let r = layer_reader(f).map_err(|e| io_err("layer", e))?;
            root.apply(r, &mut budget).map_err(|e| {
                if unpack::is_over_budget(&e) {
                    too_big(&img.name, &self.limits)
                } else {
                    AbxError::detail(
                        ErrorCode::SandboxCreateFailed,
                        format!("applying layer {l} of {}: {e}", img.name),
                    )
                }
            })?;
        }
        if let Some(d) = self.image_dir(&img.digest) {
            if let Ok(b) = std::fs::read(d.join("blobs.json")) {
                let _ = std::fs::write(tmp.join("blobs.json"), b);
            }
        }
        self.write_record(tmp, img)
    }

    fn write_record(&self, dir: &Path, img: &Image) -> Result<(), AbxError> {
        std::fs::create_dir_all(dir).map_err(|e| io_err("image dir", e))?;
        replace_file(
            &dir.join("image.json"),
            &serde_json::to_vec_pretty(img).unwrap_or_default(),
        )
        .map_err(|e| io_err("image.json", e))
    }

    /// Every stored image with its names, but a Dockerfile build's steps (its cache).
    pub fn list(&self) -> Vec<(Image, Vec<String>)> {
        let mut v = self.list_all();
        v.retain(|(i, _)| i.source != dockerfile::STEP_SOURCE);
        v
    }

    /// Every stored image with its names, build steps too.
    pub fn list_all(&self) -> Vec<(Image, Vec<String>)> {
        let names = self.names();
        let mut out = Vec::new();
        let Ok(rd) = std::fs::read_dir(self.dir.join("images")) else {
            return out;
        };
        for e in rd.flatten() {
            let Some(h) = e.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if digest_hex(&format!("sha256:{h}")).is_none() {
                continue;
            }
            if let Some(img) = self.image(&format!("sha256:{h}")) {
                let n: Vec<String> = names
                    .iter()
                    .filter(|(_, d)| **d == img.digest)
                    .map(|(k, _)| k.clone())
                    .collect();
                out.push((img, n));
            }
        }
        out.sort_by(|a, b| a.0.name.cmp(&b.0.name));
        out
    }

    /// Remove an image (by a name or its digest); `in_use` digests are refused. Names
    /// pointing at it go; blobs no other image uses go.
    pub fn remove(&self, template: &str, in_use: &[String]) -> Result<Value, AbxError> {
        let img = self
            .lookup(template)
            .ok_or_else(|| AbxError::new(ErrorCode::TemplateNotFound, &[("template", template)]))?;
        if in_use.contains(&img.digest) {
            return Err(AbxError::invalid_params(
                "templates/remove",
                format!(
                    "template '{template}' ({}) is used by a live sandbox; kill it first",
                    img.digest
                ),
            ));
        }
        if self
            .list()
            .iter()
            .any(|(i, _)| i.base.as_deref() == Some(&img.digest))
        {
            return Err(AbxError::invalid_params(
                "templates/remove",
                format!("template '{template}' is the base of a built template; remove that first"),
            ));
        }
        let mut names = self.names();
        names.retain(|_, d| *d != img.digest);
        self.save_names(&names)?;
        if let Some(d) = self.image_dir(&img.digest) {
            let trash = d.with_extension("removing");
            let _ = std::fs::rename(&d, &trash);
            let _ = std::fs::remove_dir_all(&trash);
        }
        let freed = self.gc_blobs();
        Ok(json!({"removed": [img.digest], "freedBytes": freed}))
    }

    /// Remove every image no live sandbox uses and no name points at (`prune`), then
    /// unused blobs.
    pub fn prune(&self, in_use: &[String], all: bool) -> Result<Value, AbxError> {
        let names = self.names();
        let mut removed = Vec::new();
        let imgs = self.list_all();
        let bases: Vec<String> = imgs.iter().filter_map(|(i, _)| i.base.clone()).collect();
        for (img, n) in imgs {
            let named = !n.is_empty() && !all;
            // A build step has a root of its own: being a base does not keep it.
            let base = bases.contains(&img.digest) && img.source != dockerfile::STEP_SOURCE;
            if in_use.contains(&img.digest) || named || base {
                continue;
            }
            if let Some(d) = self.image_dir(&img.digest) {
                let _ = std::fs::remove_dir_all(&d);
            }
            removed.push(img.digest);
        }
        let mut names = names;
        names.retain(|_, d| !removed.contains(d));
        self.save_names(&names)?;
        let freed = self.gc_blobs();
        Ok(json!({"removed": removed, "freedBytes": freed}))
    }

    /// Remove blobs no stored image refers to (layers, and the configs and manifests
    /// recorded beside them in `blobs.json` of each image).
    pub(crate) fn gc_blobs(&self) -> u64 {
        let mut keep = std::collections::HashSet::new();
        let Ok(rd) = std::fs::read_dir(self.dir.join("images")) else {
            return 0;
        };
        for e in rd.flatten() {
            let p = e.path().join("image.json");
            if let Some(img) = std::fs::read(&p)
                .ok()
                .and_then(|b| serde_json::from_slice::<Image>(&b).ok())
            {
                keep.extend(img.layers.iter().cloned());
                keep.insert(img.digest.clone());
            }
            if let Some(extra) = std::fs::read(e.path().join("blobs.json"))
                .ok()
                .and_then(|b| serde_json::from_slice::<Vec<String>>(&b).ok())
            {
                keep.extend(extra);
            }
        }
        let mut freed = 0;
        if let Ok(rd) = std::fs::read_dir(self.blobs()) {
            for e in rd.flatten() {
                let d = format!("sha256:{}", e.file_name().to_string_lossy());
                if !keep.contains(&d) {
                    freed += e.metadata().map_or(0, |m| m.len());
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        freed
    }

    /// Record the other blobs an image uses (config, manifest) so they are kept.
    pub fn keep_blobs(&self, digest: &str, blobs: &[String]) {
        if let Some(d) = self.image_dir(digest) {
            let _ = std::fs::create_dir_all(&d);
            let _ = replace_file(
                &d.join("blobs.json"),
                &serde_json::to_vec(blobs).unwrap_or_default(),
            );
        }
    }

    /// Store a locally made image: its layers (already stored), a config and a manifest
    /// written here; the manifest's digest is the image's.
    pub fn store_local(
        &self,
        name: &str,
        layers: &[(String, u64, String)],
        config: &ImageConfig,
        source: &str,
        base: Option<String>,
    ) -> Result<Image, AbxError> {
        let cfg = json!({
            "architecture": registry::go_arch(),
            "os": "linux",
            "config": {
                "Env": config.env,
                "WorkingDir": config.working_dir.clone().unwrap_or_default(),
                "User": config.user.clone().unwrap_or_default(),
                "Entrypoint": config.entrypoint,
                "Cmd": config.cmd,
                "Labels": config.labels,
                "ExposedPorts": config.exposed_ports.iter().map(|p| (p.clone(), json!({}))).collect::<serde_json::Map<String, Value>>(),
            },
            "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|l| l.2.clone()).collect::<Vec<_>>()},
        });
        let cfg_b = serde_json::to_vec(&cfg).map_err(AbxError::internal)?;
        let cfg_d = sha256_digest(&cfg_b);
        self.put_blob(&cfg_b, &cfg_d)?;
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cfg_d, "size": cfg_b.len()},
            "layers": layers.iter().map(|(d, s, _)| json!({"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": d, "size": s})).collect::<Vec<_>>(),
        });
        let man_b = serde_json::to_vec(&manifest).map_err(AbxError::internal)?;
        let man_d = sha256_digest(&man_b);
        self.put_blob(&man_b, &man_d)?;
        let img = Image {
            name: name.to_owned(),
            digest: man_d.clone(),
            layers: layers.iter().map(|l| l.0.clone()).collect(),
            size: layers.iter().map(|l| l.1).sum::<u64>() + cfg_b.len() as u64,
            pulled_at: rfc3339(now_ms() / 1000),
            source: source.to_owned(),
            base,
            config: config.clone(),
        };
        self.keep_blobs(&man_d, &[cfg_d, man_d.clone()]);
        Ok(img)
    }

    /// Save a sandbox's upper layer as a new template on its base image: the upper dir is
    /// turned into an OCI layer (overlay whiteouts become `.wh.` entries) through descriptors
    /// only, while the processes of `pidns` (the sandbox's PID namespace, where they are not
    /// frozen already) are stopped ([`build`]); stored as a blob; the new image's rootfs is
    /// the base's (hard-link clone) with it applied.
    pub fn build(
        &self,
        name: &str,
        base: &Image,
        upper: &Path,
        pidns: Option<u64>,
    ) -> Result<Image, AbxError> {
        let mut w = self.blob_writer()?;
        {
            let _stopped = pidns.map(|ns| build::stop_processes(ns, build::STOP_WAIT));
            let mut hw = HashWriter(&mut w);
            let mut b = tar::Builder::new(&mut hw);
            let saved = build::write_layer(&mut b, upper, &mut self.limits.budget())
                .and_then(|()| b.finish());
            if let Err(e) = saved {
                return Err(if unpack::is_over_budget(&e) {
                    too_big(name, &self.limits)
                } else {
                    io_err("saving the sandbox's layer", e)
                });
            }
            // The processes go on as soon as the layer is read.
        }
        let digest = format!("sha256:{}", hex(&w.hash.clone().finalize()));
        let size = w.len;
        let path = self.commit_blob(w, &digest)?;
        let mut layers: Vec<(String, u64, String)> = base
            .layers
            .iter()
            .map(|l| {
                let s = self
                    .blob_path(l)
                    .and_then(|p| p.metadata().ok())
                    .map_or(0, |m| m.len());
                (l.clone(), s, l.clone())
            })
            .collect();
        layers.push((digest.clone(), size, digest));
        let img = self.store_local(
            name,
            &layers,
            &base.config,
            "build",
            Some(base.digest.clone()),
        )?;
        let dir = self
            .image_dir(&img.digest)
            .ok_or_else(|| io_err("image", "bad digest"))?;
        let base_root = self
            .rootfs(&base.digest)
            .ok_or_else(|| io_err("build", "the base image's rootfs is gone"))?;
        let tmp = dir.with_extension(format!("tmp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        unpack::link_clone(&base_root, &tmp.join("rootfs"))
            .map_err(|e| io_err("cloning the base", e))?;
        let root =
            unpack::Root::open(&tmp.join("rootfs"), self.owner).map_err(|e| io_err("rootfs", e))?;
        if let Err(e) = root.apply(
            layer_reader(std::fs::File::open(&path).map_err(|e| io_err("layer", e))?)
                .map_err(|e| io_err("layer", e))?,
            &mut self.limits.budget(),
        ) {
            let _ = std::fs::remove_dir_all(&tmp);
            let _ = std::fs::remove_dir_all(&dir);
            self.gc_blobs();
            return Err(if unpack::is_over_budget(&e) {
                too_big(name, &self.limits)
            } else {
                io_err("applying the saved layer", e)
            });
        }
        self.write_record(&tmp, &img)?;
        if let Ok(b) = std::fs::read(dir.join("blobs.json")) {
            let _ = std::fs::write(tmp.join("blobs.json"), b);
        }
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::rename(&tmp, &dir).map_err(|e| io_err("installing the image", e))?;
        self.tag(&[name.to_owned()], &img.digest)?;
        Ok(img)
    }
}

struct HashWriter<'a>(&'a mut BlobWriter);

impl std::io::Write for HashWriter<'_> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.write(b)?;
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The compression of a layer, from its first bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// A plain tar.
    None,
    /// gzip.
    Gzip,
    /// zstd.
    Zstd,
}

impl Compression {
    /// Sniff the magic bytes of a blob.
    pub fn sniff(head: &[u8]) -> Compression {
        if head.starts_with(&[0x1f, 0x8b]) {
            Compression::Gzip
        } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            Compression::Zstd
        } else {
            Compression::None
        }
    }
}

/// A reader of the tar stream inside a (possibly compressed) layer or archive, an open file
/// (read from its start).
pub fn layer_reader(mut f: std::fs::File) -> std::io::Result<Box<dyn std::io::Read>> {
    use std::io::{Read, Seek};
    let mut head = [0u8; 4];
    let mut n = 0;
    while n < head.len() {
        match f.read(&mut head[n..])? {
            0 => break,
            k => n += k,
        }
    }
    f.rewind()?;
    let r = std::io::BufReader::with_capacity(256 * 1024, f);
    Ok(match Compression::sniff(&head[..n]) {
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(r)),
        Compression::Zstd => Box::new(zstd::stream::read::Decoder::with_buffer(r)?),
        Compression::None => Box::new(r),
    })
}

/// Read `r` whole, refused past `max` bytes (before they are read).
pub fn read_capped(r: impl std::io::Read, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut v = Vec::new();
    r.take(max + 1).read_to_end(&mut v)?;
    if v.len() as u64 > max {
        return Err(std::io::Error::other(format!(
            "longer than the {max} bytes read of such a file"
        )));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_settings_debug_never_shows_a_password() {
        let mut r = RegistrySettings::default();
        r.auth.insert(
            "reg.example:5000".into(),
            ("alice".into(), "hunter2-secret".into()),
        );
        let d = format!("{r:?}");
        assert!(d.contains("alice") && d.contains("reg.example:5000"), "{d}");
        assert!(!d.contains("hunter2-secret"), "{d}");
    }
}
