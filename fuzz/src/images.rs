//! The fuzz targets of image input (issue 42), on the daemon's own code compiled in as it is
//! (`broker/local/src/templates/`: `tarstream.rs`, `unpack.rs`, `manifest.rs`: std, libc,
//! tracing, serde and serde_json only):
//!
//! | target | drives | properties checked |
//! |---|---|---|
//! | `layer` | a layer or archive tar stream: `tarstream::Reader` alone, then `unpack::Root` applying it (as one layer, as two layers one over the other, or as an archive) into a temp root beside a canary | no panic; nothing written outside the root (the canary and the root are all its directory holds); no device node, fifo, setuid or setgid bit made; the budget holds; no error quotes the input |
//! | `image_json` | `manifest::{manifest, config, docker_save}` (OCI index and manifest, image config, `docker save` manifest) | no panic; every list within its cap; errors say where and quote nothing |
//!
//! "Quote nothing" is checked with a marker: inputs that hold `SECRET` (the seeds do) must
//! not get it back in an error.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The daemon's tar stream reader and whiteout grammar.
#[path = "../../broker/local/src/templates/tarstream.rs"]
pub mod tarstream;

/// The daemon's layer application.
#[path = "../../broker/local/src/templates/unpack.rs"]
pub mod unpack;

/// The daemon's image JSON.
#[path = "../../broker/local/src/templates/manifest.rs"]
pub mod manifest;

const MARK: &str = "SECRET";

fn no_quote(what: &str, msg: &str) {
    assert!(!msg.contains(MARK), "{what} quotes its input: {msg}");
}

/// A fresh directory under the temp dir, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "abx-fuzz-layer-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("scratch dir");
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Every entry of a tar stream, its data read (or, every other one, skipped).
fn read_all(body: &[u8]) {
    use std::io::Read;
    let mut r = tarstream::Reader::new(body);
    let mut n = 0u64;
    loop {
        match r.next() {
            Ok(Some(e)) => {
                n += 1;
                assert!(e.extension_bytes <= 8 * tarstream::MAX_EXTENSION);
                if let Some(map) = &e.sparse {
                    assert!(map.len() <= tarstream::MAX_SPARSE_SEGMENTS);
                    assert_eq!(map.iter().map(|s| s.1).sum::<u64>(), e.stored);
                    assert!(map.iter().all(|s| s.0 + s.1 <= e.size));
                }
                if let Some(name) = e.path.rsplit(|&b| b == b'/').next() {
                    if let tarstream::Whiteout::Remove(x) = tarstream::whiteout(name) {
                        assert!(!x.is_empty() && x != b"." && x != b".." && !x.contains(&b'/'));
                    }
                }
                if n.is_multiple_of(2) {
                    let mut sink = Vec::new();
                    if let Err(e) = (&mut r).take(1 << 20).read_to_end(&mut sink) {
                        no_quote("reading an entry", &e.to_string());
                        return;
                    }
                    assert!(sink.len() as u64 <= e.stored);
                }
                assert!(r.position() <= body.len() as u64);
            }
            Ok(None) => return,
            Err(e) => {
                no_quote("the tar reader", &e.to_string());
                return;
            }
        }
    }
}

/// What the root holds, checked: no device nodes or fifos, no setuid or setgid bits.
fn check_tree(p: &Path) {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let Ok(rd) = std::fs::read_dir(p) else {
        return;
    };
    for e in rd.flatten() {
        let Ok(m) = std::fs::symlink_metadata(e.path()) else {
            continue;
        };
        let t = m.file_type();
        assert!(
            !(t.is_block_device() || t.is_char_device() || t.is_fifo() || t.is_socket()),
            "a special file was made: {:?}",
            e.path()
        );
        if !t.is_symlink() {
            assert_eq!(m.permissions().mode() & 0o6000, 0, "setuid/setgid kept");
        }
        if t.is_dir() {
            check_tree(&e.path());
        }
    }
}

/// A layer (or archive) tar stream. The first byte: bit 0 cuts the rest in two layers (at
/// the byte's share of it), the second applied over the first; bit 1 unpacks as an archive.
pub fn layer(data: &[u8]) {
    let Some((&sel, body)) = data.split_first() else {
        return;
    };
    read_all(body);
    let s = Scratch::new();
    std::fs::write(s.0.join("canary"), b"canary").expect("canary");
    let root = unpack::Root::open(&s.0.join("r"), None).expect("root");
    let mut budget = unpack::Budget {
        bytes: 4 << 20,
        entries: 512,
    };
    let parts: Vec<&[u8]> = if sel & 1 == 1 {
        let cut = body.len() * sel as usize / 256;
        vec![&body[..cut], &body[cut..]]
    } else {
        vec![body]
    };
    for part in parts {
        let before = budget;
        let r = if sel & 2 != 0 {
            root.extract(part, &mut budget)
        } else {
            root.apply(part, &mut budget)
        };
        assert!(budget.bytes <= before.bytes && budget.entries <= before.entries);
        if let Err(e) = r {
            no_quote("unpacking", &e.to_string());
        }
    }
    let mut names: Vec<String> = std::fs::read_dir(&s.0)
        .expect("scratch")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["canary", "r"],
        "something was written outside the root"
    );
    assert_eq!(
        std::fs::read(s.0.join("canary")).ok().as_deref(),
        Some(&b"canary"[..]),
        "the canary beside the root changed"
    );
    assert!(
        std::fs::symlink_metadata(s.0.join("r")).is_ok_and(|m| m.is_dir()),
        "the root itself was replaced"
    );
    check_tree(&s.0.join("r"));
}

/// The JSON of images: as an index or manifest, as a config, as a `docker save` manifest.
pub fn image_json(data: &[u8]) {
    let shape = |what: &str, e: &manifest::JsonError| {
        no_quote(what, &e.0);
        assert!(
            e.0.contains(" at line ") || e.0 == "manifest.json lists no image",
            "{what}: {}",
            e.0
        );
    };
    match manifest::manifest(data) {
        Ok(m) => {
            assert!(m.layers.0.len() <= manifest::MAX_LAYERS);
            if let Some(ms) = &m.manifests {
                assert!(ms.0.len() <= manifest::MAX_LAYERS);
                for d in &ms.0 {
                    let _ = (d.size(), d.ref_name());
                }
            }
            let _ = m.platform("linux", "amd64");
            let _ = m.config.as_ref().map(manifest::Descriptor::size);
        }
        Err(e) => shape("a manifest", &e),
    }
    match manifest::config(data) {
        Ok(c) => {
            assert!(c.diff_ids().len() <= manifest::MAX_LAYERS);
            if let Some(r) = c.run() {
                for l in [&r.env, &r.cmd, &r.entrypoint].into_iter().flatten() {
                    assert!(l.0.len() <= manifest::MAX_STRINGS);
                }
            }
        }
        Err(e) => shape("a config", &e),
    }
    match manifest::docker_save(data) {
        Ok(d) => assert!(d.layers.0.len() <= manifest::MAX_LAYERS),
        Err(e) => shape("manifest.json", &e),
    }
}
