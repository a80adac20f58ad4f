//! Plugin fixtures for the suites: fixture dirs, git repos made in a temp dir, installs.

use crate::{Client, Home};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The directory of a fixture plugin.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/plugins")
        .join(name)
}

/// Copy a fixture plugin into `to`. A fixture with a `BASE` file (the name of another
/// fixture) is that fixture with its own files copied over it: `bad-contract` overrides
/// `py-local` instead of copying it. `BASE` itself is not copied.
pub fn copy_fixture(name: &str, to: &Path) {
    let from = fixture(name);
    if let Ok(base) = std::fs::read_to_string(from.join("BASE")) {
        copy_fixture(base.trim(), to);
    }
    copy_dir(&from, to);
    let _ = std::fs::remove_file(to.join("BASE"));
}

/// Copy a directory tree.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), &dst).unwrap();
        }
    }
}

/// Run git in `dir` with a fixed identity; returns stdout.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@example.invalid")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@example.invalid")
        .output()
        .expect("git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A git repo holding fixtures at the given subdirs; returns (dir, file:// url, commit).
pub fn repo(parts: &[(&str, &str)]) -> (tempfile::TempDir, String, String) {
    let dir = tempfile::tempdir().unwrap();
    for (subdir, name) in parts {
        copy_fixture(name, &dir.path().join(subdir));
    }
    git(dir.path(), &["init", "-q", "-b", "main"]);
    git(dir.path(), &["add", "-A"]);
    git(dir.path(), &["commit", "-q", "-m", "fixture"]);
    let commit = git(dir.path(), &["rev-parse", "HEAD"]);
    let url = format!("file://{}", dir.path().display());
    (dir, url, commit)
}

/// A started daemon with extra environment, and a client.
pub fn started(home_env: &[(&str, &str)]) -> (Home, Client) {
    let mut home = Home::new();
    for (k, v) in home_env {
        home.env.push((k.to_string(), v.to_string()));
    }
    home.start();
    let c = home.connect();
    (home, c)
}

/// Install a fixture from a fresh git repo, pinned; returns the repo (keep it alive).
pub fn install_pinned(c: &mut Client, name: &str) -> (tempfile::TempDir, String) {
    let (dir, url, commit) = repo(&[("plugin", name)]);
    let r = c.request(
        "provider/install",
        json!({"source": url, "subdir": "plugin", "ref": commit, "allowInsecureTransport": true, "confirm": true}),
    );
    assert!(r.get("error").is_none(), "install {name}: {r}");
    (dir, commit)
}

/// A sandbox on an installed plugin provider: (its bare id, `provider:id`).
pub fn plugin_sandbox(c: &mut Client, provider: &str) -> (String, String) {
    let sb = c.call("sandbox/create", json!({"provider": provider}))["id"]
        .as_str()
        .expect("sandbox id")
        .to_owned();
    let full = format!("{provider}:{sb}");
    (sb, full)
}

/// A sparse file of `len` bytes (reading it costs no disk); keep the dir alive.
pub fn sparse_file(len: u64) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.bin");
    std::fs::File::create(&path).unwrap().set_len(len).unwrap();
    (dir, path)
}

/// One provider's entry of `broker/status` (`providers[]`: running, pid, restarts, disabled).
pub fn provider_status(c: &mut Client, id: &str) -> serde_json::Value {
    let st = c.call("broker/status", serde_json::Value::Null);
    st["providers"]
        .as_array()
        .and_then(|a| a.iter().find(|p| p["id"] == id))
        .cloned()
        .unwrap_or_else(|| panic!("no provider '{id}' in broker/status: {st}"))
}

/// Install a fixture that leaves out the feature `feature` (pinned): the lines `"feature",`
/// of its manifest and its code (the list its handshake reports) are removed. Returns the
/// repo (keep it alive).
pub fn install_without(c: &mut Client, name: &str, feature: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let plugin = dir.path().join("plugin");
    copy_dir(&fixture(name), &plugin);
    let line = format!("\"{feature}\",");
    let mut removed = 0;
    for e in std::fs::read_dir(&plugin).unwrap() {
        let path = e.unwrap().path();
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let kept: Vec<&str> = text.lines().filter(|l| l.trim() != line).collect();
        if kept.len() < text.lines().count() {
            removed += 1;
            std::fs::write(&path, kept.join("\n") + "\n").unwrap();
        }
    }
    assert!(
        removed >= 2,
        "{name}: '{feature}' not found in its manifest and code"
    );
    git(dir.path(), &["init", "-q", "-b", "main"]);
    git(dir.path(), &["add", "-A"]);
    git(dir.path(), &["commit", "-q", "-m", "fixture"]);
    let commit = git(dir.path(), &["rev-parse", "HEAD"]);
    let url = format!("file://{}", dir.path().display());
    let r = c.request(
        "provider/install",
        json!({"source": url, "subdir": "plugin", "ref": commit, "allowInsecureTransport": true, "confirm": true}),
    );
    assert!(r.get("error").is_none(), "install {name}: {r}");
    dir
}
