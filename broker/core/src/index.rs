//! The sandbox index: which provider owns which sandbox id, persisted so bare ids keep
//! working after a daemon restart.
//!
//! Stored as a snapshot (`data/sandboxes.json`, replaced atomically) plus a journal
//! (`data/sandboxes.log`, one JSON line per change, appended with a single `write`). A change
//! costs one append, not a rewrite of the whole file: replacing a file by rename makes ext4
//! flush it (milliseconds), which `sandbox/create` and `sandbox/kill` used to pay each time.
//! Loading reads the snapshot, replays the journal (a torn last line, from a crash during the
//! append, is ignored) and compacts; so does an append past [`COMPACT_AFTER`] lines. Replay
//! is idempotent, so a crash between writing the snapshot and truncating the journal loses
//! nothing. An append survives a crash of the daemon (it is in the page cache); after a power
//! loss the last changes may be missing, which costs at worst a bare id that must be given as
//! `provider:id` or a stale entry that the next lookup drops.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Journal lines after which the snapshot is rewritten and the journal emptied.
pub const COMPACT_AFTER: usize = 512;

/// `sandbox id -> provider id`.
pub struct Index {
    path: PathBuf,
    journal_path: PathBuf,
    inner: Mutex<Inner>,
}

struct Inner {
    map: BTreeMap<String, String>,
    journal: Option<File>,
    lines: usize,
}

/// One journal line: `["+", id, provider]` or `["-", id]`.
fn apply(map: &mut BTreeMap<String, String>, line: &[u8]) -> bool {
    let Ok(v) = serde_json::from_slice::<Vec<String>>(line) else {
        return false;
    };
    match v.as_slice() {
        [op, id, provider] if op == "+" => {
            map.insert(id.clone(), provider.clone());
            true
        }
        [op, id] if op == "-" => {
            map.remove(id);
            true
        }
        _ => false,
    }
}

fn journal_path(path: &Path) -> PathBuf {
    path.with_extension("log")
}

impl Index {
    /// Load (or start empty): the snapshot, then the journal replayed, then compacted.
    pub fn load(path: PathBuf) -> Index {
        let mut map: BTreeMap<String, String> = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        let journal_path = journal_path(&path);
        let replayed = std::fs::read(&journal_path)
            .map(|b| {
                b.split(|&c| c == b'\n')
                    .filter(|l| apply(&mut map, l))
                    .count()
            })
            .unwrap_or(0);
        let index = Index {
            path,
            journal_path,
            inner: Mutex::new(Inner {
                map,
                journal: None,
                lines: replayed,
            }),
        };
        if replayed > 0 {
            let mut g = index.inner.lock().expect("index lock");
            index.compact(&mut g);
        }
        index
    }

    /// The owner of `sandbox`.
    pub fn get(&self, sandbox: &str) -> Option<String> {
        self.inner
            .lock()
            .expect("index lock")
            .map
            .get(sandbox)
            .cloned()
    }

    /// Record an owner.
    pub fn insert(&self, sandbox: &str, provider: &str) {
        let mut g = self.inner.lock().expect("index lock");
        if g.map.get(sandbox).map(String::as_str) != Some(provider) {
            g.map.insert(sandbox.to_owned(), provider.to_owned());
            self.append(&mut g, serde_json::json!(["+", sandbox, provider]));
        }
    }

    /// Forget a sandbox.
    pub fn remove(&self, sandbox: &str) {
        let mut g = self.inner.lock().expect("index lock");
        if g.map.remove(sandbox).is_some() {
            self.append(&mut g, serde_json::json!(["-", sandbox]));
        }
    }

    fn append(&self, g: &mut Inner, entry: serde_json::Value) {
        if g.lines >= COMPACT_AFTER {
            self.compact(g);
            return;
        }
        if g.journal.is_none() {
            if let Some(dir) = self.journal_path.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            g.journal = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.journal_path)
                .map_err(|e| {
                    tracing::error!(error = %e, path = %self.journal_path.display(), "cannot open the sandbox index journal")
                })
                .ok();
        }
        let mut line = entry.to_string().into_bytes();
        line.push(b'\n');
        // One write per line: a crash leaves at most a torn last line, which load ignores.
        let ok = g
            .journal
            .as_mut()
            .is_some_and(|f| f.write_all(&line).is_ok());
        if ok {
            g.lines += 1;
        } else {
            self.compact(g);
        }
    }

    /// Rewrite the snapshot atomically, then empty the journal.
    fn compact(&self, g: &mut Inner) {
        if let Err(e) = abx_home::util::write_atomic(
            &self.path,
            &serde_json::to_vec_pretty(&g.map).unwrap_or_default(),
        ) {
            tracing::error!(error = %e, path = %self.path.display(), "cannot save the sandbox index");
            return;
        }
        g.journal = None;
        match File::create(&self.journal_path) {
            Ok(f) => {
                g.journal = Some(f);
                g.lines = 0;
            }
            Err(e) => {
                tracing::error!(error = %e, path = %self.journal_path.display(), "cannot empty the sandbox index journal")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_survive_a_reload_without_a_snapshot_rewrite() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sandboxes.json");
        let ix = Index::load(path.clone());
        ix.insert("a", "local");
        ix.insert("b", "osb");
        ix.remove("a");
        ix.insert("c", "local");
        // No snapshot was written for these: only the journal.
        assert!(!path.exists());
        drop(ix);
        let ix = Index::load(path.clone());
        assert_eq!(ix.get("a"), None);
        assert_eq!(ix.get("b").as_deref(), Some("osb"));
        assert_eq!(ix.get("c").as_deref(), Some("local"));
        // Loading compacted: the snapshot has it all, the journal is empty.
        let snap: BTreeMap<String, String> =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(snap.len(), 2);
        assert_eq!(std::fs::read(journal_path(&path)).unwrap().len(), 0);
    }

    #[test]
    fn a_torn_last_line_is_ignored_and_compaction_keeps_everything() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sandboxes.json");
        let ix = Index::load(path.clone());
        for i in 0..COMPACT_AFTER + 10 {
            ix.insert(&format!("s{i}"), "local");
        }
        drop(ix);
        let mut f = OpenOptions::new()
            .append(true)
            .open(journal_path(&path))
            .unwrap();
        f.write_all(b"[\"+\",\"torn\"").unwrap();
        drop(f);
        let ix = Index::load(path);
        assert_eq!(ix.get("torn"), None);
        for i in 0..COMPACT_AFTER + 10 {
            assert_eq!(ix.get(&format!("s{i}")).as_deref(), Some("local"), "s{i}");
        }
    }
}
