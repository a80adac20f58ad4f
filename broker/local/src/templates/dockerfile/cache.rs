//! The build cache: a step's key (the parent's chain, the instruction as expanded, the
//! digests of its inputs) -> the image that step made, one file a key under
//! `templates/cache/`. An entry whose image is gone (pruned) is a miss.

use super::super::{Image, Store};
use abx_home::util::replace_file;
use sha2::{Digest, Sha256};

/// A key: sha256 of its parts, each length-prefixed (no two part lists hash alike).
pub fn key(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    super::super::hex(&h.finalize())
}

impl Store {
    fn cache_dir(&self) -> std::path::PathBuf {
        self.dir.join("cache")
    }

    /// The image a step key names, if it is still stored whole.
    pub fn cache_get(&self, key: &str) -> Option<Image> {
        let d = std::fs::read_to_string(self.cache_dir().join(key)).ok()?;
        let img = self.image(d.trim())?;
        self.rootfs(&img.digest)?;
        Some(img)
    }

    /// Record a step key's image; true when the entry is new.
    pub fn cache_put(&self, key: &str, digest: &str) -> bool {
        let dir = self.cache_dir();
        let p = dir.join(key);
        let new = !p.exists();
        let _ = std::fs::create_dir_all(&dir);
        let _ = replace_file(&p, digest.as_bytes());
        new
    }

    /// Forget a step key.
    pub fn cache_forget(&self, key: &str) {
        let _ = std::fs::remove_file(self.cache_dir().join(key));
    }
}
