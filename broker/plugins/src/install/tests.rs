//! Unit tests of the install: classification, pinning, hostile trees, atomicity.

use super::*;
use std::os::unix::fs::{symlink, MetadataExt};
use std::process::Stdio;

const COMMIT: &str = "c410c3261381a56afca212d26ef59a065ab52c27";

fn manifest_text(id: &str) -> String {
    format!(
        r#"schema = 1
id = "{id}"
name = "Test {id}"
version = "0.1.0"
protocol = "EPP/1"
description = "A test provider."
features = ["sandbox.lifecycle", "exec.run"]

[runtime]
command = ["sh", "./provider.sh"]

[config.api_key]
description = "Key"
secret = true
default = "sk-SECRET-DEFAULT"

[security]
network = ["*"]
filesystem = ["data_dir"]
"#
    )
}

/// A plugin directory: `root/<sub>/` with a manifest, a script and a nested file.
pub(super) fn plugin_dir(root: &Path, id: &str) {
    fs::create_dir_all(root.join("lib")).unwrap();
    fs::write(root.join(manifest::FILE_NAME), manifest_text(id)).unwrap();
    fs::write(root.join("provider.sh"), "#!/bin/sh\necho hi\n").unwrap();
    fs::set_permissions(root.join("provider.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(root.join("lib/util.sh"), "x=1\n").unwrap();
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.com",
            "-c",
            "init.defaultBranch=main",
            "-c",
            "protocol.file.allow=always",
            "-c",
            "commit.gpgsign=false",
        ])
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", dir)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// A git repo with the plugin under `opensandbox/`; returns (file:// url, head commit).
fn repo(base: &Path, id: &str) -> (String, String) {
    let r = base.join(format!("repo-{id}"));
    fs::create_dir_all(&r).unwrap();
    git(&r, &["init", "-q"]);
    plugin_dir(&r.join("opensandbox"), id);
    fs::write(r.join("README.md"), "repo\n").unwrap();
    git(&r, &["add", "-A"]);
    git(&r, &["commit", "-q", "-m", "one"]);
    let head = git(&r, &["rev-parse", "HEAD"]);
    (format!("file://{}", r.display()), head)
}

fn commit_all(url: &str, msg: &str) -> String {
    let r = Path::new(url.strip_prefix("file://").unwrap());
    git(r, &["add", "-A"]);
    git(r, &["commit", "-q", "-m", msg]);
    git(r, &["rev-parse", "HEAD"])
}

pub(super) fn req(source: &str) -> Request {
    Request {
        source: source.into(),
        ..Request::default()
    }
}

fn git_req(url: &str, commit: &str) -> Request {
    Request {
        source: url.into(),
        subdir: Some("opensandbox".into()),
        git_ref: Some(commit.into()),
        allow_insecure_transport: true,
        confirm: true,
        ..Request::default()
    }
}

pub(super) struct Env {
    _t: tempfile::TempDir,
    pub(super) base: PathBuf,
    pub(super) data: PathBuf,
}

pub(super) fn env() -> Env {
    let t = tempfile::tempdir().unwrap();
    let base = t.path().to_path_buf();
    let data = base.join("data");
    Env { _t: t, base, data }
}

/// Everything under `dir`, relative, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            out.push(p.strip_prefix(dir).unwrap().display().to_string());
            if fs::symlink_metadata(&p).unwrap().is_dir() {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Nothing but the lock, the registry and the trees it records is under providers/.
pub(super) fn assert_clean(data: &Path) {
    let base = installed::providers_dir(data);
    let recs = installed::load(data);
    let left: Vec<String> = listing(&base)
        .into_iter()
        .filter(|p| p != ".lock" && p != "installed.json")
        .filter(|p| {
            let abs = base.join(p);
            !recs
                .iter()
                .any(|r| abs.starts_with(&r.path) || r.path.parent() == Some(abs.as_path()))
        })
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

pub(super) fn refused_code(e: &AbxError) {
    assert_eq!(e.code, ErrorCode::Refused, "{e} / {}", e.suggestion);
    assert_eq!(e.code.exit_code(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_pinned_install_is_read_only_and_verified() {
    let env = env();
    let (url, head) = repo(&env.base, "opensandbox");
    let plan = install(&env.data, &git_req(&url, &head)).await.unwrap();
    assert!(plan.installed);
    assert_eq!(plan.trust, Trust::Pinned);
    assert_eq!(plan.source.commit.as_deref(), Some(head.as_str()));
    assert_eq!(plan.source.subdir.as_deref(), Some("opensandbox"));
    assert_eq!(plan.version, "0.1.0");
    let path = plan.path.clone().unwrap();
    assert_eq!(
        path,
        installed::providers_dir(&env.data)
            .join("opensandbox")
            .join(digest::short(&plan.digest))
    );
    // The digest is that of the plugin directory itself.
    let src_dir = Path::new(url.strip_prefix("file://").unwrap()).join("opensandbox");
    assert_eq!(digest::dirhash(&src_dir).unwrap(), plan.digest);
    digest::verify(&path, &plan.digest, "opensandbox").unwrap();
    // Read-only: files 0444/0555, directories 0555.
    let mode = |p: &Path| fs::symlink_metadata(p).unwrap().mode() & 0o777;
    assert_eq!(mode(&path), 0o555);
    assert_eq!(mode(&path.join("lib")), 0o555);
    assert_eq!(mode(&path.join("provider.sh")), 0o555);
    assert_eq!(mode(&path.join("abx-provider.toml")), 0o444);
    assert!(!path.join("README.md").exists());
    // Recorded.
    let rec = installed::get(&env.data, "opensandbox").unwrap();
    assert_eq!(rec.path, path);
    assert_eq!(rec.trust, Trust::Pinned);
    assert_eq!(rec.source.git_ref.as_deref(), Some(head.as_str()));
    assert!(rec.installed_at.ends_with('Z'));
    // The plan never shows the secret default; the full manifest still has it.
    let json = serde_json::to_string(&plan).unwrap();
    assert!(!json.contains("SECRET"), "{json}");
    let full = installed::full_manifest(&rec).unwrap();
    assert!(full.config["api_key"].default.is_some());
    assert_clean(&env.data);

    // Same id again: E8015.
    let e = install(&env.data, &git_req(&url, &head)).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::AlreadyInstalled);
    assert_eq!(
        e.to_string(),
        "[E8015] Provider 'opensandbox' is already installed."
    );
    assert_clean(&env.data);

    // Tampering is caught, and a reinstall (replace) repairs it.
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(path.join("lib"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(path.join("lib/evil.sh"), "rm -rf /").unwrap();
    let e = digest::verify(&path, &plan.digest, "opensandbox").unwrap_err();
    assert_eq!(e.code, ErrorCode::IntegrityFailed);
    let mut r = git_req(&url, &head);
    r.replace = true;
    let again = install(&env.data, &r).await.unwrap();
    assert_eq!(again.path.as_ref(), Some(&path));
    assert_eq!(again.previous.as_ref().unwrap().digest, plan.digest);
    digest::verify(&path, &plan.digest, "opensandbox").unwrap();
    assert_clean(&env.data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unpinned_is_refused_with_the_seed_text_then_allowed() {
    let env = env();
    let (url, head) = repo(&env.base, "opensandbox");
    let mut r = git_req(&url, "main");
    r.git_ref = None;
    let e = install(&env.data, &r).await.unwrap_err();
    refused_code(&e);
    assert_eq!(
        e.to_string(),
        "[E8012] Refusing an unpinned git source without review (--yes does not accept a moving ref)."
    );
    assert_eq!(
        e.suggestion,
        format!("Pin it: --ref {head} (or --sha256 <digest>); or pass --allow-unpinned to accept the current head.")
    );
    assert_eq!(
        e.data["rerun"],
        format!("abx provider install {url} --subdir opensandbox --ref {head} --allow-insecure-transport --yes")
    );
    assert_clean(&env.data);

    // A branch is a moving ref too; so is a short commit id.
    for moving in ["main", &head[..12]] {
        let e = install(&env.data, &git_req(&url, moving))
            .await
            .unwrap_err();
        refused_code(&e);
        assert!(e.suggestion.contains(&head), "{}", e.suggestion);
    }

    // --allow-unpinned installs the head, trust unpinned.
    let mut r = git_req(&url, "main");
    r.allow_unpinned = true;
    let plan = install(&env.data, &r).await.unwrap();
    assert_eq!(plan.trust, Trust::Unpinned);
    assert_eq!(plan.source.commit.as_deref(), Some(head.as_str()));
    assert_eq!(plan.source.git_ref.as_deref(), Some("main"));

    // A new commit on the branch; an update with replace moves to it and removes the
    // old tree.
    let old_path = plan.path.clone().unwrap();
    fs::write(
        Path::new(url.strip_prefix("file://").unwrap()).join("opensandbox/lib/util.sh"),
        "x=2\n",
    )
    .unwrap();
    let head2 = commit_all(&url, "two");
    r.replace = true;
    let plan2 = install(&env.data, &r).await.unwrap();
    assert_eq!(plan2.source.commit.as_deref(), Some(head2.as_str()));
    assert_ne!(plan2.digest, plan.digest);
    assert_eq!(
        plan2.previous.as_ref().unwrap().commit.as_deref(),
        Some(head.as_str())
    );
    assert!(!old_path.exists());
    assert_eq!(installed::load(&env.data).len(), 1);

    // An old commit by full id is pinned (and fetched even though not at a branch head).
    let mut r = git_req(&url, &head);
    r.replace = true;
    let plan3 = install(&env.data, &r).await.unwrap();
    assert_eq!(plan3.trust, Trust::Pinned);
    assert_eq!(plan3.digest, plan.digest);
    assert_clean(&env.data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sha256_pins_content_and_mismatch_is_e8013() {
    let env = env();
    let (url, head) = repo(&env.base, "opensandbox");
    let src_dir = Path::new(url.strip_prefix("file://").unwrap()).join("opensandbox");
    let d = digest::dirhash(&src_dir).unwrap();
    let mut r = git_req(&url, "main");
    r.sha256 = Some(d.trim_start_matches("sha256:").to_uppercase());
    let e = {
        let mut bad = r.clone();
        bad.sha256 = Some(format!("sha256:{}", "0".repeat(64)));
        install(&env.data, &bad).await.unwrap_err()
    };
    assert_eq!(e.code, ErrorCode::DigestMismatch);
    assert_eq!(
        e.to_string(),
        format!(
            "[E8013] Digest mismatch: expected sha256:{}, got {d}.",
            "0".repeat(64)
        )
    );
    assert_clean(&env.data);
    let plan = install(&env.data, &r).await.unwrap();
    assert_eq!(plan.trust, Trust::Pinned);
    assert_eq!(plan.digest, d);
    assert_eq!(plan.source.commit.as_deref(), Some(head.as_str()));
    let mut bad = r.clone();
    bad.sha256 = Some("sha256:xyz".into());
    assert_eq!(
        install(&env.data, &bad).await.unwrap_err().code,
        ErrorCode::Usage
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insecure_transport_and_confirmation_refusals_keep_every_flag() {
    let env = env();
    let (url, head) = repo(&env.base, "opensandbox");
    let mut r = git_req(&url, &head);
    r.allow_insecure_transport = false;
    let e = install(&env.data, &r).await.unwrap_err();
    refused_code(&e);
    assert!(
        e.message.contains("insecure transport 'file://'"),
        "{}",
        e.message
    );
    assert_eq!(
        e.suggestion,
        format!("If you trust this source, re-run: abx provider install {url} --subdir opensandbox --ref {head} --allow-insecure-transport --yes")
    );
    // Nothing at all was written: the refusal comes before any fetch.
    assert!(!env.data.exists());

    let mut r = git_req(&url, &head);
    r.confirm = false;
    let e = install(&env.data, &r).await.unwrap_err();
    refused_code(&e);
    assert_eq!(
        e.to_string(),
        "[E8012] Installing a provider requires confirmation."
    );
    assert_eq!(
        e.suggestion,
        format!("Re-run with --yes after reviewing: abx provider install {url} --subdir opensandbox --ref {head} --allow-insecure-transport --yes")
    );
    assert_eq!(e.data["plan"]["id"], "opensandbox");
    assert_eq!(e.data["plan"]["source"]["commit"], head.as_str());
    assert!(!e.data["plan"].to_string().contains("SECRET"));
    assert_clean(&env.data);
    assert!(installed::load(&env.data).is_empty());

    // Quoting and the other flags.
    let r = Request {
        source: "/tmp/my plugin".into(),
        subdir: Some("it's".into()),
        sha256: Some("sha256:ab".into()),
        allow_unpinned: true,
        ..Request::default()
    };
    assert_eq!(
        command(&r),
        "abx provider install '/tmp/my plugin' --subdir 'it'\\''s' --sha256 sha256:ab --allow-unpinned --yes"
    );
    // Other transports are not supported; credentials in URLs are refused unshown.
    let e = install(&env.data, &req("ssh://example.com/x.git"))
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::SourceUnreachable);
    let e = install(&env.data, &req("https://user:tok3n@example.com/x.git"))
        .await
        .unwrap_err();
    refused_code(&e);
    assert!(!format!("{e} {}", e.suggestion).contains("tok3n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_writes_nothing() {
    let env = env();
    let (url, head) = repo(&env.base, "opensandbox");
    let mut r = git_req(&url, "main");
    r.dry_run = true;
    r.confirm = false;
    let plan = install(&env.data, &r).await.unwrap();
    assert!(!plan.installed && plan.path.is_none());
    assert_eq!(plan.trust, Trust::Unpinned);
    assert_eq!(plan.source.commit.as_deref(), Some(head.as_str()));
    assert_eq!(plan.security.network, vec!["*"]);
    assert_eq!(
        plan.manifest.features,
        vec!["sandbox.lifecycle", "exec.run"]
    );
    assert!(plan.digest.starts_with("sha256:"));
    assert!(!env.data.exists(), "the data dir was touched");
    // Its private temp dir is gone (other tests may be running dry runs: wait for
    // a moment with none of this process's in flight).
    let prefix = format!("abx-install-{}-", std::process::id());
    let ours = || {
        fs::read_dir(std::env::temp_dir())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            .count()
    };
    let mut tries = 0;
    while ours() > 0 {
        tries += 1;
        assert!(tries < 100, "temp dir left behind");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // The plan's digest then pins a real install.
    let mut r = git_req(&url, "main");
    r.sha256 = Some(plan.digest.clone());
    assert_eq!(install(&env.data, &r).await.unwrap().trust, Trust::Pinned);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_directory_is_copied() {
    let env = env();
    let src = env.base.join("src");
    plugin_dir(&src, "localp");
    fs::create_dir_all(src.join(".git/objects")).unwrap();
    fs::write(src.join(".git/HEAD"), "x").unwrap();
    let mut r = req(src.to_str().unwrap());
    r.confirm = true;
    let plan = install(&env.data, &r).await.unwrap();
    assert_eq!(plan.trust, Trust::Local);
    assert_eq!(
        plan.source.url,
        fs::canonicalize(&src).unwrap().display().to_string()
    );
    assert!(plan.source.commit.is_none());
    let path = plan.path.unwrap();
    assert!(!path.starts_with(&src));
    assert!(!path.join(".git").exists());
    // Changing the source does not change the installed copy.
    fs::write(src.join("provider.sh"), "changed").unwrap();
    digest::verify(&path, &plan.digest, "localp").unwrap();
    // --ref makes no sense for a directory.
    let mut r2 = r.clone();
    r2.git_ref = Some(COMMIT.into());
    assert_eq!(
        install(&env.data, &r2).await.unwrap_err().code,
        ErrorCode::Usage
    );
    // A missing directory.
    let e = install(&env.data, &req("/nonexistent/abx/plugin"))
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::SourceUnreachable);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_manifest_name_and_missing_manifest() {
    let env = env();
    let old = env.base.join("oldname");
    fs::create_dir_all(&old).unwrap();
    fs::write(old.join("ebx-provider.toml"), manifest_text("old")).unwrap();
    let mut r = req(old.to_str().unwrap());
    r.confirm = true;
    let e = install(&env.data, &r).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidManifest);
    assert_eq!(
        e.to_string(),
        "[E8014] Invalid abx-provider.toml: file not found at the plugin root."
    );
    assert_eq!(
        e.suggestion,
        "This plugin still uses the pre-rename 'ebx-provider.toml'. Rename it to abx-provider.toml and rename its EBX_* variables to ABX_* (the plugin's maintainer must publish the update)."
    );
    assert_clean(&env.data);

    let empty = env.base.join("empty");
    fs::create_dir_all(&empty).unwrap();
    let e = install(&env.data, &req(empty.to_str().unwrap()))
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "[E8014] Invalid abx-provider.toml: file not found at the plugin root."
    );
    assert_eq!(e.suggestion, ErrorCode::InvalidManifest.suggestion());

    // The plugin one level down: the suggestion names --subdir.
    let (url, head) = repo(&env.base, "opensandbox");
    let mut r = git_req(&url, &head);
    r.subdir = None;
    let e = install(&env.data, &r).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidManifest);
    assert!(
        e.suggestion.ends_with(&format!(
            "--subdir opensandbox: abx provider install {url} --subdir opensandbox --ref {head} --allow-insecure-transport --yes"
        )),
        "{}",
        e.suggestion
    );
    assert_clean(&env.data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_git_sources_are_refused() {
    let env = env();
    let outside = env.base.join("outside-target");
    fs::write(&outside, "secret").unwrap();

    // A symlink pointing out of the tree.
    let (url, _) = repo(&env.base, "opensandbox");
    let rp = PathBuf::from(url.strip_prefix("file://").unwrap());
    symlink(&outside, rp.join("opensandbox/lib/link")).unwrap();
    let head = commit_all(&url, "link");
    let e = install(&env.data, &git_req(&url, &head)).await.unwrap_err();
    refused_code(&e);
    assert!(e.message.contains("symlink at 'lib/link'"), "{}", e.message);
    assert_clean(&env.data);

    // The subdir itself a symlink.
    fs::remove_file(rp.join("opensandbox/lib/link")).unwrap();
    symlink("opensandbox", rp.join("alias")).unwrap();
    let head = commit_all(&url, "alias");
    let mut r = git_req(&url, &head);
    r.subdir = Some("alias".into());
    let e = install(&env.data, &r).await.unwrap_err();
    refused_code(&e);
    assert!(e.message.contains("symlink at 'alias'"), "{}", e.message);

    // A gitlink (submodule) entry.
    git(
        &rp,
        &[
            "update-index",
            "--add",
            "--cacheinfo",
            &format!("160000,{head},opensandbox/vendor"),
        ],
    );
    git(&rp, &["commit", "-q", "-m", "sub"]);
    let head = git(&rp, &["rev-parse", "HEAD"]);
    let e = install(&env.data, &git_req(&url, &head)).await.unwrap_err();
    refused_code(&e);
    assert!(
        e.message
            .contains("submodule or nested repository at 'vendor'"),
        "{}",
        e.message
    );
    git(&rp, &["rm", "-q", "--cached", "opensandbox/vendor"]);
    git(&rp, &["commit", "-q", "-m", "unsub"]);

    // A .gitmodules file.
    fs::write(rp.join("opensandbox/.gitmodules"), "[submodule \"x\"]\n").unwrap();
    let head = commit_all(&url, "gitmodules");
    let e = install(&env.data, &git_req(&url, &head)).await.unwrap_err();
    refused_code(&e);
    assert!(e.message.contains("submodule"), "{}", e.message);
    fs::remove_file(rp.join("opensandbox/.gitmodules")).unwrap();

    // --subdir escaping the source.
    for bad in ["../x", "/etc", "opensandbox/../../x"] {
        let mut r = git_req(&url, &head);
        r.subdir = Some(bad.into());
        let e = install(&env.data, &r).await.unwrap_err();
        refused_code(&e);
        assert!(e.message.contains("--subdir"), "{}", e.message);
    }

    // A runtime outside the root, or missing, or not executable.
    let mt = rp.join("opensandbox").join(manifest::FILE_NAME);
    for (cmd, what) in [
        (r#"["sh", "../escape.sh"]"#, "outside the plugin root"),
        (r#"["/bin/sh", "./provider.sh"]"#, "absolute path"),
        (r#"["sh", "./missing.sh"]"#, "not in the plugin"),
        (r#"["./lib/util.sh"]"#, "not executable"),
    ] {
        fs::write(
            &mt,
            manifest_text("opensandbox").replace(r#"["sh", "./provider.sh"]"#, cmd),
        )
        .unwrap();
        let head = commit_all(&url, cmd);
        let e = install(&env.data, &git_req(&url, &head)).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidManifest, "{e}");
        assert!(
            e.message.contains("line 10, key 'runtime.command'"),
            "{}",
            e.message
        );
        assert!(e.message.contains(what), "{}", e.message);
    }
    assert_clean(&env.data);
    assert_eq!(fs::read_to_string(&outside).unwrap(), "secret");
    // Nothing was written next to the data dir either.
    let mut top: Vec<String> = fs::read_dir(&env.base)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    top.sort();
    assert_eq!(top, vec!["data", "outside-target", "repo-opensandbox"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_local_sources_are_refused() {
    let env = env();
    let mk = |name: &str| {
        let d = env.base.join(name);
        plugin_dir(&d, "hostile");
        d
    };
    let confirm = |p: &Path| Request {
        source: p.display().to_string(),
        confirm: true,
        ..Request::default()
    };
    let d = mk("symlink");
    symlink("/etc/passwd", d.join("lib/passwd")).unwrap();
    let e = install(&env.data, &confirm(&d)).await.unwrap_err();
    refused_code(&e);
    assert!(
        e.message.contains("symlink at 'lib/passwd'"),
        "{}",
        e.message
    );

    let d = mk("fifo");
    let c = std::ffi::CString::new(d.join("lib/fifo").as_os_str().as_bytes()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let e = install(&env.data, &confirm(&d)).await.unwrap_err();
    refused_code(&e);
    assert!(e.message.contains("fifo at 'lib/fifo'"), "{}", e.message);

    let d = mk("nested-git");
    fs::create_dir_all(d.join("lib/vendor/.git")).unwrap();
    fs::write(d.join("lib/vendor/.git/HEAD"), "x").unwrap();
    let e = install(&env.data, &confirm(&d)).await.unwrap_err();
    refused_code(&e);
    assert!(
        e.message
            .contains("submodule or nested repository at 'lib/vendor'"),
        "{}",
        e.message
    );

    let d = mk("huge-file");
    fs::File::create(d.join("big.bin"))
        .unwrap()
        .set_len(MAX_FILE + 1)
        .unwrap();
    let e = install(&env.data, &confirm(&d)).await.unwrap_err();
    refused_code(&e);
    assert!(
        e.message.contains("file over 64 MiB: 'big.bin'"),
        "{}",
        e.message
    );

    let d = mk("huge-tree");
    for i in 0..5 {
        fs::File::create(d.join(format!("part{i}.bin")))
            .unwrap()
            .set_len(60 << 20)
            .unwrap();
    }
    let e = install(&env.data, &confirm(&d)).await.unwrap_err();
    refused_code(&e);
    assert!(e.message.contains("over 256 MiB"), "{}", e.message);

    let d = mk("subdir-link");
    symlink(&d, d.join("loop")).unwrap();
    let mut r = confirm(&d);
    r.subdir = Some("loop".into());
    let e = install(&env.data, &r).await.unwrap_err();
    refused_code(&e);
    assert_clean(&env.data);
    assert!(installed::load(&env.data).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_installs_of_two_ids() {
    let env = env();
    let (u1, h1) = repo(&env.base, "one");
    let (u2, h2) = repo(&env.base, "two");
    let (r1, r2) = (git_req(&u1, &h1), git_req(&u2, &h2));
    let (a, b) = tokio::join!(
        tokio::spawn({
            let d = env.data.clone();
            async move { install(&d, &r1).await }
        }),
        tokio::spawn({
            let d = env.data.clone();
            async move { install(&d, &r2).await }
        }),
    );
    a.unwrap().unwrap();
    b.unwrap().unwrap();
    let ids: Vec<String> = installed::load(&env.data)
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(ids, vec!["one", "two"]);
    // Two installs of the same id at once: exactly one wins, the other is E8015.
    let (u3, h3) = repo(&env.base, "three");
    let r3 = git_req(&u3, &h3);
    let (a, b) = tokio::join!(
        tokio::spawn({
            let (d, r) = (env.data.clone(), r3.clone());
            async move { install(&d, &r).await }
        }),
        tokio::spawn({
            let (d, r) = (env.data.clone(), r3.clone());
            async move { install(&d, &r).await }
        }),
    );
    let results = [a.unwrap(), b.unwrap()];
    assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1);
    assert!(results
        .iter()
        .any(|r| matches!(r, Err(e) if e.code == ErrorCode::AlreadyInstalled)));
    assert_eq!(installed::load(&env.data).len(), 3);
    assert_clean(&env.data);
}

#[test]
fn listing_lines_parse() {
    assert_eq!(
        parse_listing_line("-rw-r--r-- u/g        1234 2024-01-01 00:00 dir/my file.txt"),
        Some(('-', 1234, "dir/my file.txt"))
    );
    assert_eq!(
        parse_listing_line("lrwxrwxrwx u/g 0 2024-01-01 00:00 a -> /etc/passwd"),
        Some(('l', 0, "a -> /etc/passwd"))
    );
    assert_eq!(
        parse_listing_line("crw-r--r-- root/root 1,3 2024-01-01 00:00 dev/null"),
        Some(('c', 0, "dev/null"))
    );
    assert_eq!(parse_listing_line("garbage"), None);
    assert!(is_full_commit(COMMIT) && !is_full_commit(&COMMIT[..39]));
    let r = req("x");
    assert_eq!(
        normalize_subdir(&r, "./a//b/").unwrap().as_deref(),
        Some("a/b")
    );
    assert_eq!(normalize_subdir(&r, ".").unwrap(), None);
    assert!(normalize_subdir(&r, "a/../b").is_err());
}

#[test]
fn request_params_use_rpc_names() {
    let r: Request = serde_json::from_value(serde_json::json!({
        "source": "https://example.com/x.git",
        "subdir": "p",
        "ref": "main",
        "sha256": "sha256:00",
        "allowUnpinned": true,
        "allowInsecureTransport": true,
        "confirm": true,
        "dryRun": true
    }))
    .unwrap();
    assert_eq!(r.git_ref.as_deref(), Some("main"));
    assert!(r.allow_unpinned && r.allow_insecure_transport && r.confirm && r.dry_run && !r.replace);
    assert_eq!(r.subdir.as_deref(), Some("p"));
}
