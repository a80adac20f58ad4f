//! The sandbox index: which provider owns which sandbox id, persisted atomically so bare
//! ids keep working after a daemon restart.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

/// `sandbox id -> provider id`, saved to `data/sandboxes.json` on every change.
pub struct Index {
    path: PathBuf,
    map: Mutex<BTreeMap<String, String>>,
}

impl Index {
    /// Load (or start empty).
    pub fn load(path: PathBuf) -> Index {
        let map = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        Index {
            path,
            map: Mutex::new(map),
        }
    }

    /// The owner of `sandbox`.
    pub fn get(&self, sandbox: &str) -> Option<String> {
        self.map.lock().expect("index lock").get(sandbox).cloned()
    }

    /// Record an owner.
    pub fn insert(&self, sandbox: &str, provider: &str) {
        let mut m = self.map.lock().expect("index lock");
        if m.get(sandbox).map(String::as_str) != Some(provider) {
            m.insert(sandbox.to_owned(), provider.to_owned());
            self.save(&m);
        }
    }

    /// Forget a sandbox.
    pub fn remove(&self, sandbox: &str) {
        let mut m = self.map.lock().expect("index lock");
        if m.remove(sandbox).is_some() {
            self.save(&m);
        }
    }

    fn save(&self, m: &BTreeMap<String, String>) {
        if let Err(e) = crate::util::write_atomic(
            &self.path,
            &serde_json::to_vec_pretty(m).unwrap_or_default(),
        ) {
            tracing::error!(error = %e, path = %self.path.display(), "cannot save the sandbox index");
        }
    }
}
