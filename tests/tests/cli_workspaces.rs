//! Issue 43 from the CLI: `abx create|run --mount`, `abx info` showing mounts, `abx diff`,
//! `abx apply` (conflicts exit 1 with E4015), `abx discard` (confirmed like `abx kill`).
//! Real daemon, real `local` sandboxes. (`abx log`: tests/tests/cmdlog.rs.)

use abx_tests::Home;
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;

/// Dropped before its `Home`: opens up overlayfs's `work/work` (mode 0) so that a user who
/// is not root can remove the home (as tests/tests/workspaces.rs does).
struct Tidy(PathBuf);

impl Drop for Tidy {
    fn drop(&mut self) {
        let Ok(sbs) = std::fs::read_dir(self.0.join("data/local/sandboxes")) else {
            return;
        };
        for sb in sbs.flatten() {
            let Ok(ms) = std::fs::read_dir(sb.path().join("mounts")) else {
                continue;
            };
            for m in ms.flatten() {
                let w = m.path().join("work/work");
                let _ = std::fs::set_permissions(&w, std::fs::Permissions::from_mode(0o700));
            }
        }
    }
}

fn project() -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix("abx-cliproj")
        .tempdir()
        .unwrap();
    std::fs::write(d.path().join("a.txt"), "host a\n").unwrap();
    std::fs::write(d.path().join("keep.txt"), "keep\n").unwrap();
    d
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn ok(out: &Output) -> String {
    assert!(out.status.success(), "{out:?}");
    text(&out.stdout)
}

fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"))
}

/// `abx ARGS` run from `dir`.
fn run_in(home: &Home, dir: &Path, args: &[&str]) -> Output {
    home.abx().current_dir(dir).args(args).output().unwrap()
}

#[test]
fn mount_flags_are_parsed_and_refused_with_e1009() {
    let home = Home::new();
    for spec in [".:rwx", ".:RO", ":ro", ".:foo"] {
        let out = home.run(&["create", "--mount", spec]);
        assert_eq!(out.status.code(), Some(2), "{spec}: {out:?}");
        let err = text(&out.stderr);
        assert!(err.starts_with("[E1009] --mount"), "{spec}: {err}");
        assert!(err.contains("Suggestion:"), "{err}");
        let out = home.run(&["-j", "run", "--mount", spec, "--", "true"]);
        assert_eq!(out.status.code(), Some(2), "{spec}: {out:?}");
        assert_eq!(json_of(&out)["code"], "E1009");
    }
    // Refused before any daemon was needed.
    assert!(!home.socket().exists());
}

#[test]
fn create_and_run_mount_the_current_directory_and_info_shows_it() {
    let home = Home::new();
    let _t = Tidy(home.path.clone());
    let p = project();
    let src = p.path().canonicalize().unwrap();
    // `abx run --mount . -- CMD`: the README's example.
    let out = run_in(
        &home,
        &src,
        &["run", "--mount", ".", "--", "cat a.txt; pwd"],
    );
    assert_eq!(ok(&out), "host a\n/workspace\n");
    // create: `.` and a relative path are made absolute from the current directory.
    std::fs::create_dir(src.join("sub")).unwrap();
    let out = run_in(
        &home,
        &src,
        &[
            "-j",
            "create",
            "--mount",
            ".:ro",
            "--mount",
            "sub:/workspace/sub",
        ],
    );
    let sb = json_of(&out);
    let id = format!("local:{}", sb["id"].as_str().unwrap());
    assert_eq!(sb["mounts"][0]["source"], src.to_str().unwrap(), "{sb}");
    assert_eq!(sb["mounts"][0]["target"], "/workspace");
    assert_eq!(sb["mounts"][0]["mode"], "ro");
    assert_eq!(sb["mounts"][1]["source"], src.join("sub").to_str().unwrap());
    assert_eq!(sb["mounts"][1]["target"], "/workspace/sub");
    assert_eq!(sb["mounts"][1]["mode"], "overlay");
    let info = ok(&home.run(&["info", &id]));
    let row = info
        .lines()
        .find(|l| l.starts_with("Mounts"))
        .unwrap_or_else(|| panic!("{info}"));
    assert!(
        row.contains(&format!("{} -> /workspace (ro)", src.display())),
        "{row}"
    );
    assert!(row.contains("/workspace/sub (overlay)"), "{row}");
    // An rw mount says on stderr that writes go to the host.
    let out = home.run(&[
        "run",
        "--mount",
        &format!("{}:rw", src.display()),
        "--",
        "echo through > through.txt",
    ]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        text(&out.stderr).contains("mounted rw"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(src.join("through.txt")).unwrap(),
        "through\n"
    );
    // No mounts: -j has no `mounts` key, info no Mounts row.
    let sb = json_of(&home.run(&["-j", "create"]));
    assert!(sb.get("mounts").is_none(), "{sb}");
}

#[test]
fn diff_apply_and_discard_from_the_cli() {
    let home = Home::new();
    let _t = Tidy(home.path.clone());
    let p = project();
    let src = p.path().canonicalize().unwrap();
    let sb = json_of(&home.run(&["-j", "create", "--mount", src.to_str().unwrap()]));
    let id = sb["id"].as_str().unwrap().to_owned();
    let sh = |cmd: &str| ok(&home.run(&["exec", &id, "--", cmd]));
    assert_eq!(ok(&home.run(&["diff", &id])), "No changes.\n");
    sh("echo sandbox >> a.txt; echo new > b.txt; rm keep.txt");

    let out = ok(&home.run(&["diff", &id]));
    assert_eq!(
        out,
        "M /workspace/a.txt\nA /workspace/b.txt\nD /workspace/keep.txt\n"
    );
    let out = ok(&home.run(&["diff", &id, "--stat"]));
    for want in ["Path", "Change", "/workspace/b.txt", "added", "3 changes"] {
        assert!(out.contains(want), "{want}: {out}");
    }
    let out = ok(&home.run(&["diff", &id, "--patch", "a.txt"]));
    assert!(out.contains("+sandbox"), "{out}");
    assert!(!out.contains("b.txt"), "only the path asked: {out}");
    let v = json_of(&home.run(&["-j", "diff", &id]));
    assert_eq!(v["changes"].as_array().unwrap().len(), 3, "{v}");

    // Dry run: said, nothing written.
    let out = ok(&home.run(&["apply", &id, "--dry-run", "b.txt"]));
    assert_eq!(out, "Would apply /workspace/b.txt\n");
    assert!(!src.join("b.txt").exists());
    let out = ok(&home.run(&["apply", &id, "/workspace/b.txt"]));
    assert_eq!(out, "Applied /workspace/b.txt\n");
    assert_eq!(std::fs::read_to_string(src.join("b.txt")).unwrap(), "new\n");

    // The host changed a.txt since create: a conflict, exit 1 with E4015 and the suggestion.
    std::fs::write(src.join("a.txt"), "host changed\n").unwrap();
    let out = home.run(&["apply", &id, "a.txt"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = text(&out.stderr);
    assert!(err.contains("[E4015]"), "{err}");
    assert!(err.contains("/workspace/a.txt"), "{err}");
    assert!(
        err.contains("Suggestion:") && err.contains("--force"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(src.join("a.txt")).unwrap(),
        "host changed\n"
    );
    let out = home.run(&["-j", "apply", &id, "a.txt"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let conflicted = v["conflicts"][0]["path"] == "/workspace/a.txt" || v["code"] == "E4015";
    assert!(conflicted, "{v}");

    // Discard: refused without a terminal or --yes, like kill.
    let out = home.run(&["discard", &id]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = text(&out.stderr);
    assert!(err.contains("[E1009] Refusing to discard"), "{err}");
    assert!(err.contains(&format!("abx discard {id} --yes")), "{err}");
    let out = ok(&home.run(&["discard", &id, "--yes", "keep.txt"]));
    assert_eq!(out, "Discarded /workspace/keep.txt\n");
    assert_eq!(sh("cat keep.txt"), "keep\n");
    let out = ok(&home.run(&["-y", "discard", &id]));
    assert!(out.contains("Discarded /workspace/a.txt"), "{out}");
    assert_eq!(ok(&home.run(&["diff", &id])), "No changes.\n");
    let out = ok(&home.run(&["apply", &id]));
    assert_eq!(out, "Nothing to apply.\n");
    // A sandbox that is not there.
    let out = home.run(&["diff", "sb-0000000000000000"]);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
}
