//! Tidy tests, in the habit of rust-analyzer's `tidy.rs`: the architecture and the house rules
//! checked from the source tree and from cargo's own view of the workspace, so a rule that is
//! written down (docs/design.md#layout, docs/style.md) is also a test that fails when the code drifts.
//!
//! Each check is a plain function over its input (a metadata document, a `cargo tree`
//! listing, a binary's bytes, a file's text) that returns every violation, with the fix in
//! the message; the `#[test]`s feed it the real workspace, and the unit tests at the bottom
//! feed it bad input to show it can fail.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The layers, lowest first (protocol is what everything stands on, the binaries come last):
/// a crate may depend only on crates listed before it (an "upward edge" reaches later).
/// This is docs/design.md#layout (docs/design.md) and the crate graph in docs/architecture.md; change
/// them together. Workspace crates not listed here (abx-tests, which drives the real
/// binaries from outside) are exempt.
const LAYERS: &[&str] = &[
    "abx-protocol",
    "abx-home",
    "abx-client",
    "abx-core",
    "abx-confine",
    "abx-egress",
    "abx-local",
    "abx-plugins",
    "abx-kit",
    "abx-broker",
    "abx-cli",
];

/// What only the daemon may link: the thin `abx` client must carry none of it (docs/design.md#layout:
/// "protocol + client only: no git2, OpenSSL, reqwest or landlock in it").
const DAEMON_ONLY: &[&str] = &[
    "git2",
    "libgit2-sys",
    "openssl",
    "openssl-sys",
    "reqwest",
    "rustls",
    "landlock",
    "abx-core",
    "abx-confine",
    "abx-egress",
    "abx-local",
    "abx-plugins",
    "abx-kit",
    "abx-broker",
];

/// Byte strings whose presence in a binary shows daemon-only code was linked into it: the
/// C symbols of libgit2 and OpenSSL, and the Rust crates as they appear in mangled symbol
/// names (`<len><name>`, the same in the legacy and v0 manglings).
fn daemon_only_needles() -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = vec![
        (
            "libgit2 (C symbol git_libgit2_*)".into(),
            b"git_libgit2_".to_vec(),
        ),
        (
            "OpenSSL (C symbol OPENSSL_init*)".into(),
            b"OPENSSL_init".to_vec(),
        ),
    ];
    for krate in [
        "git2",
        "landlock",
        "reqwest",
        "rustls",
        "abx_core",
        "abx_confine",
        "abx_egress",
        "abx_local",
        "abx_plugins",
        "abx_kit",
        "abx_broker",
    ] {
        v.push((
            format!("crate {krate} (mangled symbol names)"),
            format!("{}{krate}", krate.len()).into_bytes(),
        ));
    }
    v
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The cargo running this test (`CARGO`, set by cargo for what it runs), else `cargo`.
fn cargo(args: &[&str]) -> String {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(&cargo)
        .args(args)
        .current_dir(workspace_root())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cargo:?}: {e}"));
    assert!(
        out.status.success(),
        "{cargo:?} {args:?} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("cargo prints UTF-8")
}

// ---- the crate graph ----

/// One dependency of a workspace crate on another workspace crate.
#[derive(Debug, PartialEq)]
struct Edge {
    from: String,
    to: String,
    /// `normal`, `dev` or `build`.
    kind: String,
    manifest: String,
}

/// The workspace-internal edges of a `cargo metadata --format-version 1` document.
fn workspace_edges(metadata: &Value) -> Vec<Edge> {
    let members: Vec<&str> = metadata["workspace_members"]
        .as_array()
        .expect("workspace_members")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let packages: Vec<&Value> = metadata["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .filter(|p| p["id"].as_str().is_some_and(|id| members.contains(&id)))
        .collect();
    let names: Vec<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
    let mut edges = vec![];
    for p in &packages {
        for d in p["dependencies"].as_array().into_iter().flatten() {
            let to = d["name"].as_str().unwrap_or_default();
            if names.contains(&to) {
                edges.push(Edge {
                    from: p["name"].as_str().unwrap_or_default().to_string(),
                    to: to.to_string(),
                    kind: d["kind"].as_str().unwrap_or("normal").to_string(),
                    manifest: p["manifest_path"].as_str().unwrap_or_default().to_string(),
                });
            }
        }
    }
    edges
}

/// Every edge that points down the layer list (to a crate listed after its dependent), and
/// every layer that is not a workspace crate (a stale list guards nothing).
fn layer_violations(metadata: &Value, layers: &[&str]) -> Vec<String> {
    let mut bad = vec![];
    let names: Vec<&str> = metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["name"].as_str())
        .collect();
    for l in layers {
        if !names.contains(l) {
            bad.push(format!(
                "the layer list in tests/tests/tidy.rs names `{l}`, which is not a workspace \
                 crate: update the list (and docs/design.md#layout, docs/architecture.md) to the crates \
                 that exist"
            ));
        }
    }
    let layer = |n: &str| layers.iter().position(|l| *l == n);
    for e in workspace_edges(metadata) {
        let (Some(from), Some(to)) = (layer(&e.from), layer(&e.to)) else {
            continue; // an unlisted crate is exempt
        };
        if to > from {
            bad.push(format!(
                "upward edge: {} (layer {}) has a {} dependency on {} (layer {}) in {}; a crate \
                 may depend only on crates listed before it (docs/design.md#layout). Fix: move what {} \
                 needs from {} down into {} or a crate below it (or invert it: a trait in the \
                 lower crate that the upper one implements and the composition root in \
                 abx-broker wires up), then remove the dependency",
                e.from,
                from + 1,
                e.kind,
                e.to,
                to + 1,
                e.manifest,
                e.from,
                e.to,
                e.from
            ));
        }
    }
    bad
}

#[test]
fn crate_graph_points_down_the_layers() {
    // --no-deps: the workspace's own manifests are all this needs, and the full resolve
    // would want every platform's packages downloaded.
    let meta: Value = serde_json::from_str(&cargo(&[
        "metadata",
        "--format-version",
        "1",
        "--offline",
        "--no-deps",
    ]))
    .expect("cargo metadata is JSON");
    // Guard the guard: the workspace has internal edges, so the check below has input.
    assert!(
        workspace_edges(&meta).len() >= 10,
        "cargo metadata shows almost no workspace-internal dependencies: {:?}",
        workspace_edges(&meta)
    );
    let bad = layer_violations(&meta, LAYERS);
    assert!(bad.is_empty(), "\n{}\n", bad.join("\n\n"));
}

// ---- the thin client ----

/// The daemon-only crates named in a `cargo tree --prefix none` listing (one crate a line,
/// `name vX.Y.Z ...`).
fn daemon_only_in_tree(listing: &str) -> Vec<String> {
    let mut found: Vec<String> = listing
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| DAEMON_ONLY.contains(n))
        .map(str::to_string)
        .collect();
    found.sort();
    found.dedup();
    found
}

/// Which of `needles` occur in `bytes`, in one pass (the `abx` debug binary is tens of MB
/// and this test is built without optimisation).
fn find_all(bytes: &[u8], needles: &[&[u8]]) -> Vec<bool> {
    let mut by_first: Vec<Vec<usize>> = vec![vec![]; 256];
    for (i, n) in needles.iter().enumerate() {
        by_first[n[0] as usize].push(i);
    }
    let mut hit = vec![false; needles.len()];
    for (pos, b) in bytes.iter().enumerate() {
        for &i in &by_first[*b as usize] {
            if !hit[i] && bytes[pos..].starts_with(needles[i]) {
                hit[i] = true;
            }
        }
    }
    hit
}

/// What daemon-only code a binary's bytes show.
fn daemon_only_in_binary(bytes: &[u8]) -> Vec<String> {
    let needles = daemon_only_needles();
    let raw: Vec<&[u8]> = needles.iter().map(|(_, n)| n.as_slice()).collect();
    needles
        .iter()
        .zip(find_all(bytes, &raw))
        .filter(|(_, h)| *h)
        .map(|((what, _), _)| what.clone())
        .collect()
}

// Two checks of one rule, because each sees what the other cannot. `cargo tree` is the
// declared graph: it fails the moment a manifest pulls a daemon-only crate into abx-cli's
// graph, whatever the build, and `cargo tree -i` names the path. The binary is what was
// actually linked: it catches what the graph does not name (a C library vendored or linked
// by another crate's build script, a feature that turns on TLS, a `links` override) and
// shows the thin client really is thin, which is what the process-start cost depends on.

#[test]
fn abx_cli_tree_has_no_daemon_only_crates() {
    let listing = cargo(&[
        "tree",
        "-p",
        "abx-cli",
        "-e",
        "normal",
        "--prefix",
        "none",
        "--offline",
    ]);
    assert!(
        listing.lines().any(|l| l.starts_with("abx-client ")),
        "cargo tree of abx-cli does not list abx-client; the listing is not what this test \
         expects:\n{listing}"
    );
    let found = daemon_only_in_tree(&listing);
    assert!(
        found.is_empty(),
        "abx-cli (the `abx` binary) depends on daemon-only crates: {}. The client links only \
         abx-protocol, abx-home and abx-client (docs/design.md#layout). Find the path with `cargo tree -p \
         abx-cli -e normal -i {}` and move the code that needs it into the daemon (abx-broker \
         or below), reached over the API",
        found.join(", "),
        found[0]
    );
}

#[test]
fn abx_binary_links_no_daemon_only_code() {
    // The binary of the same profile as this test, beside its target dir (the test command
    // builds the workspace's binaries first, as for every suite here).
    let abx = abx_tests::bin_dir().join("abx");
    let bytes = std::fs::read(&abx).unwrap_or_else(|e| {
        panic!(
            "cannot read {}: {e}; build it first (cargo build -p abx-cli)",
            abx.display()
        )
    });
    // Guard the guard: the needles are mangled crate names, so the binary must have symbols
    // (the protocol crate it links shows up the same way).
    assert!(
        find_all(&bytes, &[b"12abx_protocol"])[0],
        "{} has no Rust symbol names (stripped?): this check would see nothing",
        abx.display()
    );
    let found = daemon_only_in_binary(&bytes);
    assert!(
        found.is_empty(),
        "{} contains daemon-only code: {}. The thin client must not link it (docs/design.md#layout); \
         see which crate brings it with `cargo tree -p abx-cli -e normal -i <crate>` and move \
         that code behind the daemon's API",
        abx.display(),
        found.join(", ")
    );
}

// ---- module headers ----

/// Whether a Rust file's first non-empty line is a `//!` module header.
fn has_module_header(text: &str) -> bool {
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .is_some_and(|l| l.starts_with("//!"))
}

/// Every `*.rs` under `root`, skipping build output (`target/`), `node_modules/` and hidden
/// directories, sorted.
fn rust_files(root: &Path) -> Vec<PathBuf> {
    files_ending(root, &[".rs"])
}

/// Every file under `root` whose name ends with one of `ends`, skipping build output
/// (`target/`), `node_modules/` and hidden directories, sorted.
fn files_ending(root: &Path, ends: &[&str]) -> Vec<PathBuf> {
    let mut out = vec![];
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            let name = e.file_name();
            let name = name.to_string_lossy();
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                if name != "target" && name != "node_modules" && !name.starts_with('.') {
                    todo.push(path);
                }
            } else if ft.is_file() && ends.iter().any(|e| name.ends_with(e)) {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The files under `root` that lack a `//!` header, relative to `root`.
fn files_without_header(root: &Path) -> Vec<String> {
    rust_files(root)
        .into_iter()
        .filter(|p| !has_module_header(&std::fs::read_to_string(p).unwrap_or_default()))
        .map(|p| p.strip_prefix(root).unwrap_or(&p).display().to_string())
        .collect()
}

#[test]
fn every_module_starts_with_a_header() {
    let root = workspace_root();
    let files = rust_files(&root);
    // Guard the guard: each source root the rule covers is walked and has files.
    for dir in [
        "protocol",
        "broker",
        "cli",
        "tests/src",
        "tests/tests",
        "fuzz/src",
        "fuzz/fuzz_targets",
    ] {
        assert!(
            files.iter().any(|f| f.starts_with(root.join(dir))),
            "no Rust file found under {dir}/: the walk in rust_files() misses it"
        );
    }
    let bad = files_without_header(&root);
    assert!(
        bad.is_empty(),
        "\nThese Rust files do not start with a `//!` header saying what the module owns \
         (docs/style.md):\n\n    {}\n\nAdd one as their first non-empty line.\n",
        bad.join("\n    ")
    );
}

// ---- each check can fail ----

#[cfg(test)]
mod checks_fail {
    use super::*;
    use serde_json::json;

    fn pkg(name: &str, deps: &[(&str, Option<&str>)]) -> Value {
        json!({
            "id": format!("path+file:///ws/{name}#0.1.0"),
            "name": name,
            "manifest_path": format!("/ws/{name}/Cargo.toml"),
            "dependencies": deps.iter().map(|(d, kind)| json!({
                "name": d, "kind": kind, "path": format!("/ws/{d}")
            })).collect::<Vec<_>>(),
        })
    }

    fn meta(pkgs: Vec<Value>) -> Value {
        let ids: Vec<Value> = pkgs.iter().map(|p| p["id"].clone()).collect();
        json!({ "packages": pkgs, "workspace_members": ids })
    }

    const FAKE_LAYERS: &[&str] = &["abx-protocol", "abx-core", "abx-local"];

    #[test]
    fn an_upward_edge_is_named_with_its_fix() {
        let m = meta(vec![
            pkg("abx-protocol", &[]),
            pkg("abx-core", &[("abx-protocol", None), ("abx-local", None)]),
            pkg("abx-local", &[("abx-core", None), ("serde", None)]),
        ]);
        let bad = layer_violations(&m, FAKE_LAYERS);
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert!(
            bad[0].contains("abx-core (layer 2) has a normal dependency on abx-local (layer 3)")
        );
        assert!(bad[0].contains("/ws/abx-core/Cargo.toml"));
        assert!(bad[0].contains("Fix:"));
    }

    #[test]
    fn dev_dependencies_count_too() {
        let m = meta(vec![
            pkg("abx-protocol", &[("abx-core", Some("dev"))]),
            pkg("abx-core", &[]),
            pkg("abx-local", &[]),
        ]);
        let bad = layer_violations(&m, FAKE_LAYERS);
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert!(bad[0].contains("dev dependency on abx-core"));
    }

    #[test]
    fn downward_edges_and_unlisted_crates_pass() {
        let m = meta(vec![
            pkg("abx-protocol", &[]),
            pkg("abx-core", &[("abx-protocol", None)]),
            pkg(
                "abx-local",
                &[("abx-core", None), ("abx-protocol", Some("build"))],
            ),
            pkg("abx-tests", &[("abx-local", None)]),
            pkg("abx-protocol-helper", &[("abx-tests", None)]),
        ]);
        assert_eq!(layer_violations(&m, FAKE_LAYERS), Vec::<String>::new());
    }

    #[test]
    fn a_stale_layer_list_fails() {
        let m = meta(vec![pkg("abx-protocol", &[]), pkg("abx-core", &[])]);
        let bad = layer_violations(&m, FAKE_LAYERS);
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert!(bad[0].contains("`abx-local`, which is not a workspace crate"));
    }

    #[test]
    fn a_tree_listing_with_git2_fails() {
        let listing = "abx-cli v0.1.0 (/ws/cli/abx)\nabx-client v0.1.0 (/ws/cli/client)\n\
                       git2 v0.20.2\nlibgit2-sys v0.18.1+1.9.0\nlibc v0.2.1\ngit2 v0.20.2\n\
                       abx-core v0.1.0 (/ws/broker/core)\n";
        assert_eq!(
            daemon_only_in_tree(listing),
            ["abx-core", "git2", "libgit2-sys"]
        );
        // A crate whose name merely starts like one (git2-hooks) is not git2.
        assert!(
            daemon_only_in_tree("abx-cli v0.1.0\ngit2-hooks v1.0.0\nrustls-pemfile v2\n")
                .is_empty()
        );
    }

    #[test]
    fn a_binary_with_libgit2_or_landlock_symbols_fails() {
        let mut bytes = vec![0u8; 4096];
        bytes.extend_from_slice(b"\0git_libgit2_init\0");
        bytes.extend_from_slice(b"_ZN8landlock7ruleset7Ruleset3new17h0123456789abcdefE\0");
        bytes.extend_from_slice(b"_ZN7abx_cli4main17h0123456789abcdefE\0");
        let found = daemon_only_in_binary(&bytes);
        assert_eq!(
            found,
            [
                "libgit2 (C symbol git_libgit2_*)",
                "crate landlock (mangled symbol names)"
            ]
        );
        // The word alone (a help text about Landlock) is not linked code.
        assert!(daemon_only_in_binary(b"sandboxes use landlock and seccomp\0").is_empty());
        // A needle at the very end of the bytes is found.
        assert_eq!(daemon_only_in_binary(b"x10abx_broker").len(), 1);
    }

    #[test]
    fn a_file_without_a_header_fails() {
        assert!(has_module_header("//! What this owns.\nuse std::io;\n"));
        assert!(has_module_header("\n\n  //! After blank lines.\n"));
        assert!(!has_module_header("use std::io;\n//! too late\n"));
        assert!(!has_module_header("// a plain comment\n//! x\n"));
        assert!(!has_module_header("#![no_main]\n//! x\n"));
        assert!(!has_module_header("/// an item doc\nfn f() {}\n"));
        assert!(!has_module_header(""));

        let dir = tempfile::tempdir().expect("tempdir");
        let write = |rel: &str, text: &str| {
            let p = dir.path().join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        };
        write("a/src/lib.rs", "//! fine\n");
        write("a/src/deep/bad.rs", "fn main() {}\n");
        write("a/target/debug/build/gen.rs", "fn generated() {}\n");
        write("ext/node_modules/x/y.rs", "fn vendored() {}\n");
        write(".git/hook.rs", "fn hidden() {}\n");
        write("a/README.md", "not rust\n");
        assert_eq!(files_without_header(dir.path()), ["a/src/deep/bad.rs"]);
    }
}

// ---- the design lives in the repository (issue 47) ----

/// The `<a id="...">` anchors of docs/design.md.
fn design_anchors(design: &str) -> Vec<String> {
    design
        .lines()
        .filter_map(|l| {
            l.strip_prefix("<a id=\"")?
                .split('"')
                .next()
                .map(str::to_owned)
        })
        .collect()
}

/// Every citation of the design points into docs/design.md at an anchor it has; nothing
/// cites the founding brief (`DESIGN` with a section sign), a file a clone does not have.
#[test]
fn design_citations_point_into_the_repository() {
    let root = workspace_root();
    let design = std::fs::read_to_string(root.join("docs/design.md")).expect("docs/design.md");
    let anchors = design_anchors(&design);
    assert!(anchors.len() >= 16, "{anchors:?}");
    let old = format!("DESIGN {}", '\u{a7}');
    let mut bad = vec![];
    let exts = [
        ".rs", ".md", ".ts", ".py", ".lua", ".sh", ".mjs", ".js", ".toml", ".json",
    ];
    for p in files_ending(&root, &exts) {
        let rel = p.strip_prefix(&root).unwrap_or(&p).display().to_string();
        let Ok(text) = std::fs::read_to_string(&p) else {
            continue;
        };
        if text.contains(&old) {
            bad.push(format!(
                "{rel}: cites '{old}n': cite docs/design.md#<anchor>"
            ));
        }
        for (i, _) in text.match_indices("design.md#") {
            let id: String = text[i + "design.md#".len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
                .collect();
            if id != "<anchor" && !id.is_empty() && !anchors.contains(&id) {
                bad.push(format!("{rel}: docs/design.md#{id} has no such anchor"));
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

// ---- the codemap is true (issue 47) ----

/// The repo paths and type names that docs/architecture.md names in backticks, each with the
/// crate directory of the section it is in (`### \`broker/local/\` ...`), if any.
fn codemap_names(text: &str) -> (Vec<(String, String)>, Vec<String>) {
    let (mut paths, mut types) = (vec![], vec![]);
    let mut base = String::new();
    let exts = [".rs", ".md", ".py", ".js", ".sh", ".lua", ".mjs", ".ts"];
    // Runtime places (under ABX_HOME, a sandbox, the user's home), not files of the repo.
    let runtime = [
        "data/",
        "config/",
        "run/",
        "sandboxes/",
        "images/",
        "blobs/",
    ];
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("### `") {
            base = rest.split('`').next().unwrap_or_default().to_owned();
            continue;
        }
        if line.starts_with("## ") {
            base.clear();
        }
        for (i, tok) in line.split('`').enumerate() {
            if i % 2 == 0 || tok.is_empty() {
                continue;
            }
            let plain = tok
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._/-".contains(c));
            let is_path = (exts.iter().any(|e| tok.ends_with(e)) || tok.ends_with('/'))
                && !runtime.iter().any(|r| tok.starts_with(r));
            if plain && is_path && !tok.starts_with('/') && !tok.starts_with('.') {
                paths.push((tok.to_owned(), base.clone()));
            }
            let mut c = tok.chars();
            if c.next().is_some_and(|c| c.is_ascii_uppercase())
                && c.next().is_some_and(|c| c.is_ascii_lowercase())
                && tok.chars().all(|c| c.is_ascii_alphanumeric())
            {
                types.push(tok.to_owned());
            }
        }
    }
    (paths, types)
}

/// Every file under `dir` (any depth), skipping build output and hidden dirs.
fn all_files(dir: &Path) -> Vec<PathBuf> {
    files_ending(dir, &[""])
}

/// Every path and type name docs/architecture.md mentions exists: a path relative to the
/// repository, to its section's crate directory or that crate's `src/`, or the tail of a
/// file or directory beneath that crate; a type name as an item of the workspace's code.
#[test]
fn the_codemap_names_what_exists() {
    let root = workspace_root();
    let text = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let (paths, types) = codemap_names(&text);
    assert!(paths.len() > 40 && types.len() > 20, "{paths:?} {types:?}");
    let mut missing = vec![];
    for (p, base) in &paths {
        let bare = p.trim_end_matches('/');
        let direct = [
            root.join(bare),
            root.join(base).join(bare),
            root.join(base).join("src").join(bare),
        ];
        if direct.iter().any(|c| c.exists()) {
            continue;
        }
        let under = if base.is_empty() {
            root.clone()
        } else {
            root.join(base)
        };
        let tail = format!("/{bare}");
        let found = all_files(&under).iter().any(|f| {
            let s = f.to_string_lossy();
            s.ends_with(&tail) || f.ancestors().any(|a| a.to_string_lossy().ends_with(&tail))
        });
        if !found {
            missing.push(format!("path `{p}` (section `{base}`)"));
        }
    }
    let code: String = rust_files(&root)
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n");
    // Names of other crates' items the codemap mentions (tokio-util's codec traits, std's).
    let foreign = ["Decoder", "Encoder", "Display", "FramedRead", "StreamExt"];
    for t in types.iter().filter(|t| !foreign.contains(&t.as_str())) {
        let defined = [
            "struct", "enum", "trait", "type", "union", "mod", "fn", "const", "static",
        ]
        .iter()
        .any(|k| {
            code.match_indices(&format!("{k} {t}")).any(|(i, m)| {
                let next = code[i + m.len()..].chars().next();
                !next.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
            })
        });
        if !defined {
            missing.push(format!("type `{t}`"));
        }
    }
    missing.sort();
    missing.dedup();
    assert!(
        missing.is_empty(),
        "docs/architecture.md names what does not exist (fix the codemap):\n{}",
        missing.join("\n")
    );
}

// ---- rooms a newcomer can read (issue 47) ----

/// Lines a source file may have before its tests (a trailing `#[cfg(test)] mod tests`).
const MAX_LINES: usize = 900;

/// The source files still over [`MAX_LINES`] (issue 47: their owners split them next). The
/// list only shrinks: the test fails when a listed file has come under the limit (take it
/// off) and when an unlisted one goes over (split it by job instead of listing it).
const OVER_MAX_LINES: &[&str] = &[
    // The builtin provider's largest rooms, being reworked by their owners (sandboxes,
    // templates, init): split by job as each is next worked on.
    "broker/local/src/sandboxes.rs",
    "broker/local/src/init.rs",
    "broker/local/src/exec.rs",
    "broker/local/src/code/mod.rs",
    "broker/local/src/files/mod.rs",
    "broker/local/src/container.rs",
    "broker/local/src/workspace/changes.rs",
    "broker/local/src/workspace/changes_tests.rs",
    // The connection loop and the outbound queue: tuned for the wire benches; split with
    // a bench run beside the change.
    "broker/core/src/conn.rs",
    "broker/core/src/outbound.rs",
    // The CLI's argument tree (lazy building), being changed by its owner.
    "cli/abx/src/args.rs",
    // Dockerfile builds of templates, new this session and over at birth: its owner splits it.
    "broker/local/src/templates/dockerfile/build.rs",
];

/// The line where a file's trailing tests start (`#[cfg(test)]` then `mod name {`, with
/// nothing after it but more test modules), else its line count: the lines the rule counts.
fn lines_before_tests(text: &str) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    let is_test_mod = |i: usize| {
        lines[i] == "#[cfg(test)]"
            && lines.get(i + 1).is_some_and(|l| {
                l.strip_prefix("mod ")
                    .and_then(|r| r.strip_suffix(" {"))
                    .is_some_and(|n| n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
            })
    };
    // After the tests start, no item of the file's own at the start of a line (a test's
    // text may have lines there: raw strings).
    let items = [
        "pub ",
        "pub(",
        "fn ",
        "async fn ",
        "unsafe ",
        "impl",
        "struct ",
        "enum ",
        "union ",
        "trait ",
        "type ",
        "use ",
        "const ",
        "static ",
        "macro_rules!",
    ];
    let only_tests_after = |i: usize| {
        lines[i..]
            .iter()
            .all(|l| !items.iter().any(|k| l.starts_with(k)))
    };
    (0..lines.len())
        .find(|&i| is_test_mod(i) && only_tests_after(i))
        .unwrap_or(lines.len())
}

/// The source files the size rule covers: every `.rs` in a `src/` under broker/, cli/ and
/// protocol/ (a crate's integration tests and benches are not rooms of it), relative to
/// `root`, with their lines before tests.
fn source_sizes(root: &Path) -> Vec<(String, usize)> {
    let mut out = vec![];
    for top in ["broker", "cli", "protocol"] {
        for f in rust_files(&root.join(top)) {
            let rel = f.strip_prefix(root).unwrap_or(&f).display().to_string();
            if !rel.contains("/src/") {
                continue;
            }
            let text = std::fs::read_to_string(&f).unwrap_or_default();
            out.push((rel, lines_before_tests(&text)));
        }
    }
    out
}

/// Every file over `max` lines that `allowed` does not list, and every listed file that is
/// no longer over (or no longer exists).
fn size_violations(sizes: &[(String, usize)], max: usize, allowed: &[&str]) -> Vec<String> {
    let mut bad = vec![];
    for (f, n) in sizes {
        if *n > max && !allowed.contains(&f.as_str()) {
            bad.push(format!(
                "{f} has {n} lines before its tests, over {max}: split it by job (a folder with \
                 `mod.rs` and a file per concern, docs/style.md) rather than listing it"
            ));
        }
    }
    for a in allowed {
        match sizes.iter().find(|(f, _)| f == a) {
            None => bad.push(format!(
                "{a} is listed in OVER_MAX_LINES (tests/tests/tidy.rs) but does not exist: take \
                 it off the list"
            )),
            Some((_, n)) if *n <= max => bad.push(format!(
                "{a} has come under the limit ({n} lines before its tests): take it off \
                 OVER_MAX_LINES in tests/tests/tidy.rs, so the list only shrinks"
            )),
            _ => {}
        }
    }
    bad
}

#[test]
fn no_source_file_is_over_900_lines_before_its_tests() {
    let root = workspace_root();
    let sizes = source_sizes(&root);
    // Guard the guard: the walk sees the crates' sources.
    assert!(sizes.len() > 100, "{sizes:?}");
    let bad = size_violations(&sizes, MAX_LINES, OVER_MAX_LINES);
    assert!(bad.is_empty(), "\n{}\n", bad.join("\n\n"));
}

/// The import circles still inside a crate, each as its files (issue 47: to end next). Like
/// [`OVER_MAX_LINES`] the list only shrinks: each entry must be exactly a circle the code
/// has (a circle that shrank is written smaller, one that ended is taken off), and a
/// circle not listed fails.
const CIRCLES_ALLOWED: &[&[&str]] = &[
    // abx-core: the command log is both a store that the broker, the event hub and the
    // outbound queue call into (`CmdLog`, `exit_seen`) and the `sandbox/log` handler above
    // them (`serve`, `begin`: dispatch's `Cx` and `resolve_sandbox`). Ends when cmdlog.rs is
    // split into the store (below outbound) and the handler (beside dispatch). (The circle
    // broker <-> dispatch <-> conn of issue 47 ended: `Cx` is in cx.rs and holds no `Conn`.)
    &[
        "broker/core/src/broker.rs",
        "broker/core/src/cmdlog.rs",
        "broker/core/src/cx.rs",
        "broker/core/src/dispatch.rs",
        "broker/core/src/events.rs",
        "broker/core/src/members.rs",
        "broker/core/src/outbound.rs",
        "broker/core/src/provider.rs",
    ],
    // abx-local: the init's protocol (init.rs) and the daemon's side of it (container.rs)
    // share the isolation model, process listing, pasta and mount checks both ways. Its
    // files are being changed by their owners this session.
    &[
        "broker/local/src/container.rs",
        "broker/local/src/init.rs",
        "broker/local/src/isolate.rs",
        "broker/local/src/net.rs",
        "broker/local/src/procs.rs",
        "broker/local/src/workspace/mounts.rs",
    ],
    // abx-cli: `abx sandbox info` shows the network and mounts rows that `abx network` and
    // `abx workspace` print, and they borrow its time format.
    &[
        "cli/abx/src/cmd/network.rs",
        "cli/abx/src/cmd/sandbox.rs",
        "cli/abx/src/cmd/workspace.rs",
    ],
    // abx-client: a connection starts and stops the daemon through spawn.rs
    // (`start_daemon`, `wait_stopped`), which asks the daemon it started through client.rs
    // (`answers`).
    &["cli/client/src/client.rs", "cli/client/src/spawn.rs"],
    // abx-protocol: the catalogue names the API's types and OpenRPC's schema functions; the
    // API's method names, its params table and the OpenRPC document are read from the
    // catalogue.
    &[
        "protocol/src/api/mod.rs",
        "protocol/src/api/params.rs",
        "protocol/src/catalogue.rs",
        "protocol/src/openrpc.rs",
    ],
];

/// One crate's modules: each source file (tests left out) with its module path.
struct Modules {
    /// (file relative to the repository, module path: `a::b`, "" for the crate root).
    files: Vec<(String, String)>,
}

impl Modules {
    fn file_of(&self, module: &str) -> Option<usize> {
        self.files.iter().position(|(_, m)| m == module)
    }
}

/// Whether a source file is a test module (`tests.rs`, `*_tests.rs`): not a room of the graph.
fn is_test_file(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name == "tests.rs" || name.ends_with("_tests.rs")
}

/// The module path of `file` (relative to its crate's `src/`): `a/b.rs` and `a/b/mod.rs` are
/// `a::b`; `lib.rs` and `main.rs` the root.
fn module_path(rel: &str) -> String {
    let rel = rel.trim_end_matches(".rs");
    let rel = rel.strip_suffix("/mod").unwrap_or(rel);
    if rel == "lib" || rel == "main" {
        String::new()
    } else {
        rel.replace('/', "::")
    }
}

/// The modules of the crate whose sources are `files` (relative to the repository, all under
/// `src`), honouring `#[path = "..."] mod name;` (read from `text_of`). A crate with both
/// `lib.rs` and `main.rs` is its library (the binary is a crate of its own).
fn crate_modules(src: &str, files: &[(String, String)]) -> Modules {
    let mut out = vec![];
    let has_lib = files.iter().any(|(f, _)| f == &format!("{src}/lib.rs"));
    let mut renamed: Vec<(String, String)> = vec![];
    for (f, text) in files {
        let rel = f.strip_prefix(&format!("{src}/")).unwrap_or(f);
        let lines: Vec<&str> = text.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            let Some(p) = l
                .trim()
                .strip_prefix("#[path = \"")
                .and_then(|r| r.strip_suffix("\"]"))
            else {
                continue;
            };
            let Some(name) = lines.get(i + 1).and_then(|n| {
                let n = n.trim();
                let n = n.strip_prefix("pub ").unwrap_or(n);
                n.strip_prefix("mod ")?.strip_suffix(';')
            }) else {
                continue;
            };
            let dir = rel.rsplit_once('/').map_or("", |(d, _)| d);
            let target = if dir.is_empty() {
                format!("{src}/{p}")
            } else {
                format!("{src}/{dir}/{p}")
            };
            let parent = module_path(rel);
            let m = if parent.is_empty() {
                name.to_owned()
            } else {
                format!("{parent}::{name}")
            };
            renamed.push((target, m));
        }
    }
    for (f, _) in files {
        let rel = f.strip_prefix(&format!("{src}/")).unwrap_or(f);
        if is_test_file(f) || (has_lib && rel == "main.rs") || rel.starts_with("bin/") {
            continue;
        }
        let m = renamed
            .iter()
            .find(|(t, _)| t == f)
            .map_or_else(|| module_path(rel), |(_, m)| m.clone());
        out.push((f.clone(), m));
    }
    Modules { files: out }
}

/// Rust text without comments (line comments and doc comments; a `//` inside a string cuts
/// the rest of that line, which only loses names) and without its trailing tests.
fn code_of(text: &str) -> String {
    let keep = lines_before_tests(text);
    text.lines()
        .take(keep)
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The paths of the use tree (or path in code) at the start of `s` (`a::b::{c, d::{e, *}}`),
/// each as its segments.
fn use_tree(s: &str) -> Vec<Vec<String>> {
    fn ident(s: &[u8], i: &mut usize) -> Option<String> {
        while *i < s.len() && s[*i].is_ascii_whitespace() {
            *i += 1;
        }
        let start = *i;
        while *i < s.len() && (s[*i].is_ascii_alphanumeric() || s[*i] == b'_' || s[*i] == b'*') {
            *i += 1;
        }
        (*i > start).then(|| String::from_utf8_lossy(&s[start..*i]).into_owned())
    }
    fn sep(s: &[u8], i: &mut usize) -> bool {
        let mut j = *i;
        while j < s.len() && s[j].is_ascii_whitespace() {
            j += 1;
        }
        if s[j..].starts_with(b"::") {
            *i = j + 2;
            true
        } else {
            false
        }
    }
    fn tree(s: &[u8], i: &mut usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
        let mut path = prefix;
        loop {
            while *i < s.len() && s[*i].is_ascii_whitespace() {
                *i += 1;
            }
            if *i < s.len() && s[*i] == b'{' {
                *i += 1;
                loop {
                    tree(s, i, path.clone(), out);
                    while *i < s.len() && s[*i].is_ascii_whitespace() {
                        *i += 1;
                    }
                    match s.get(*i) {
                        Some(b',') => *i += 1,
                        Some(b'}') => {
                            *i += 1;
                            return;
                        }
                        _ => return,
                    }
                    while *i < s.len() && s[*i].is_ascii_whitespace() {
                        *i += 1;
                    }
                    if s.get(*i) == Some(&b'}') {
                        *i += 1;
                        return;
                    }
                }
            }
            let Some(seg) = ident(s, i) else {
                out.push(path);
                return;
            };
            path.push(seg);
            if !sep(s, i) {
                out.push(path);
                return;
            }
        }
    }
    let mut out = vec![];
    let mut i = 0;
    tree(s.as_bytes(), &mut i, vec![], &mut out);
    out
}

/// The modules (by index in `m.files`) that the file `at` imports: `crate::`, `super::`,
/// `self::` paths and paths through its own child modules, in `use` items and in code; not
/// its parent module nor its own children (a folder's face and its parts).
fn imports_of(m: &Modules, at: usize, code: &str) -> Vec<usize> {
    let cur = m.files[at].1.clone();
    let parent = |p: &str| {
        p.rsplit_once("::")
            .map_or(String::new(), |(a, _)| a.to_owned())
    };
    let join = |a: &str, b: &str| {
        if a.is_empty() {
            b.to_owned()
        } else {
            format!("{a}::{b}")
        }
    };
    let bytes = code.as_bytes();
    let mut out = vec![];
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let starts_word = c.is_ascii_alphabetic() || c == b'_';
        let prev = i.checked_sub(1).map(|p| bytes[p]);
        if !starts_word || prev.is_some_and(|p| p.is_ascii_alphanumeric() || p == b'_' || p == b':')
        {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < bytes.len() && (bytes[j].is_ascii_alphanumeric() || bytes[j] == b'_') {
            j += 1;
        }
        let word = &code[i..j];
        if !code[j..].starts_with("::") || code[j + 2..].starts_with('<') {
            i = j;
            continue;
        }
        let child = m.file_of(&join(&cur, word)).is_some();
        if !matches!(word, "crate" | "super" | "self") && !child {
            i = j;
            continue;
        }
        for path in use_tree(&code[i..]) {
            let mut module = String::new();
            let mut segs = path.iter().peekable();
            match segs.peek().map(|s| s.as_str()) {
                Some("crate") => {
                    segs.next();
                }
                Some("self") => {
                    segs.next();
                    module = cur.clone();
                }
                Some("super") => {
                    module = cur.clone();
                    while segs.peek().is_some_and(|s| *s == "super") {
                        segs.next();
                        module = parent(&module);
                    }
                }
                _ => module = cur.clone(),
            }
            for s in segs {
                let next = join(&module, s);
                if m.file_of(&next).is_some() {
                    module = next;
                } else {
                    break;
                }
            }
            // A module and its parent are one room's face and its parts (docs/style.md: a
            // folder's `mod.rs` holds the shared part and the entry points): the parts use
            // the shared part, the entry points call the parts.
            let kin = module == cur || module == parent(&cur) || parent(&module) == cur;
            if !kin {
                if let Some(t) = m.file_of(&module) {
                    out.push(t);
                }
            }
        }
        i = j;
    }
    out.sort();
    out.dedup();
    out
}

/// The circles of a graph (`edges[n]`: the nodes `n` imports): its strongly connected
/// components of more than one node, each sorted (Tarjan's algorithm).
fn circles(edges: &[Vec<usize>]) -> Vec<Vec<usize>> {
    struct T<'a> {
        edges: &'a [Vec<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(t: &mut T<'_>, v: usize) {
        t.index[v] = Some(t.next);
        t.low[v] = t.next;
        t.next += 1;
        t.stack.push(v);
        t.on[v] = true;
        for &w in &t.edges[v] {
            match t.index[w] {
                None => {
                    visit(t, w);
                    t.low[v] = t.low[v].min(t.low[w]);
                }
                Some(iw) if t.on[w] => t.low[v] = t.low[v].min(iw),
                _ => {}
            }
        }
        if Some(t.low[v]) == t.index[v] {
            let mut c = vec![];
            while let Some(w) = t.stack.pop() {
                t.on[w] = false;
                c.push(w);
                if w == v {
                    break;
                }
            }
            if c.len() > 1 {
                c.sort();
                t.out.push(c);
            }
        }
    }
    let n = edges.len();
    let mut t = T {
        edges,
        index: vec![None; n],
        low: vec![0; n],
        on: vec![false; n],
        stack: vec![],
        next: 0,
        out: vec![],
    };
    for v in 0..n {
        if t.index[v].is_none() {
            visit(&mut t, v);
        }
    }
    t.out
}

/// The import circles of the crate whose `src/` is `src` (relative to the repository), given
/// its files' texts: each circle as its files, and the names that tie it (`a -> b`).
fn crate_circles(src: &str, files: &[(String, String)]) -> Vec<(Vec<String>, Vec<String>)> {
    let m = crate_modules(src, files);
    let text_of = |f: &str| {
        files
            .iter()
            .find(|(g, _)| g == f)
            .map_or("", |(_, t)| t.as_str())
    };
    let edges: Vec<Vec<usize>> = (0..m.files.len())
        .map(|i| imports_of(&m, i, &code_of(text_of(&m.files[i].0))))
        .collect();
    circles(&edges)
        .into_iter()
        .map(|c| {
            let names: Vec<String> = c.iter().map(|&i| m.files[i].0.clone()).collect();
            let ties = c
                .iter()
                .flat_map(|&a| {
                    edges[a]
                        .iter()
                        .filter(|b| c.contains(b))
                        .map(|&b| format!("{} -> {}", m.files[a].0, m.files[b].0))
                        .collect::<Vec<_>>()
                })
                .collect();
            (names, ties)
        })
        .collect()
}

/// Every circle `allowed` does not list exactly, and every listed one the code no longer has.
fn circle_violations(found: &[(Vec<String>, Vec<String>)], allowed: &[&[&str]]) -> Vec<String> {
    let mut bad = vec![];
    for (c, ties) in found {
        let listed = allowed.iter().any(|a| {
            let mut a: Vec<&str> = a.to_vec();
            a.sort();
            a == c.iter().map(String::as_str).collect::<Vec<_>>()
        });
        if !listed {
            bad.push(format!(
                "an import circle inside a crate: {}\n  tied by: {}\nEnd it (docs/style.md): move \
                 what both sides use into a module below them, or pass it in, so that imports \
                 point one way",
                c.join(", "),
                ties.join("; ")
            ));
        }
    }
    for a in allowed {
        let mut a: Vec<&str> = a.to_vec();
        a.sort();
        if !found
            .iter()
            .any(|(c, _)| c.iter().map(String::as_str).collect::<Vec<_>>() == a)
        {
            bad.push(format!(
                "CIRCLES_ALLOWED (tests/tests/tidy.rs) lists a circle the code no longer has \
                 exactly: {}; write it as it is now, or take it off when it ended",
                a.join(", ")
            ));
        }
    }
    bad
}

/// The `src/` directories of the crates under broker/, cli/ and protocol/.
fn crate_sources(root: &Path) -> Vec<String> {
    let mut out = vec![];
    for top in ["broker", "cli", "protocol"] {
        for f in files_ending(&root.join(top), &["Cargo.toml"]) {
            let dir = f.parent().expect("a manifest has a directory").join("src");
            if dir.is_dir() {
                out.push(dir.strip_prefix(root).unwrap_or(&dir).display().to_string());
            }
        }
    }
    out.sort();
    out
}

#[test]
fn no_import_circles_inside_a_crate() {
    let root = workspace_root();
    let crates = crate_sources(&root);
    assert!(crates.len() >= 10, "{crates:?}");
    let mut found = vec![];
    for src in &crates {
        let files: Vec<(String, String)> = rust_files(&root.join(src))
            .into_iter()
            .map(|f| {
                let rel = f.strip_prefix(&root).unwrap_or(&f).display().to_string();
                (rel, std::fs::read_to_string(&f).unwrap_or_default())
            })
            .collect();
        found.extend(crate_circles(src, &files));
    }
    let bad = circle_violations(&found, CIRCLES_ALLOWED);
    assert!(bad.is_empty(), "\n{}\n", bad.join("\n\n"));
}

#[cfg(test)]
mod rooms_checks_fail {
    use super::*;

    #[test]
    fn lines_are_counted_before_the_trailing_tests_only() {
        let text = "//! x\nfn a() {}\n\n#[cfg(test)]\nmod tests {\n    use super::*;\n    const RAW: &str = r#\"\nschema = 1\n[table]\n\"#;\n}\n";
        assert_eq!(lines_before_tests(text), 3);
        // A test module followed by more of the file's own items is not trailing.
        let mid = "fn a() {}\n#[cfg(test)]\nmod tests {\n}\nfn b() {}\n";
        assert_eq!(lines_before_tests(mid), 5);
        assert_eq!(lines_before_tests("fn a() {}\n"), 1);
    }

    #[test]
    fn a_file_over_the_limit_fails_and_the_list_only_shrinks() {
        let sizes = vec![
            ("a/src/big.rs".to_owned(), 12),
            ("a/src/listed.rs".to_owned(), 15),
            ("a/src/shrunk.rs".to_owned(), 4),
            ("a/src/small.rs".to_owned(), 10),
        ];
        let bad = size_violations(
            &sizes,
            10,
            &["a/src/listed.rs", "a/src/shrunk.rs", "a/src/gone.rs"],
        );
        assert_eq!(bad.len(), 3, "{bad:?}");
        assert!(bad[0].starts_with("a/src/big.rs has 12 lines"));
        assert!(bad[1].contains("a/src/shrunk.rs has come under the limit"));
        assert!(bad[2].contains("a/src/gone.rs is listed"));
        assert!(size_violations(&sizes[1..], 12, &["a/src/listed.rs"]).is_empty());
    }

    fn files(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(f, t)| (f.to_string(), t.to_string()))
            .collect()
    }

    #[test]
    fn an_import_circle_is_found_with_what_ties_it() {
        let crate_files = files(&[
            ("c/src/lib.rs", "//! root\npub mod a;\npub mod b;\npub mod d;\npub use a::A;\n"),
            ("c/src/a.rs", "//! a\nuse crate::b::B;\npub struct A;\n"),
            (
                "c/src/b.rs",
                "//! b\npub struct B(crate::d::{self, D});\nfn f() { super::a::g(); }\n",
            ),
            // In a comment or the tests: no import.
            (
                "c/src/d.rs",
                "//! d [`crate::a`]\npub struct D; // crate::b\n#[cfg(test)]\nmod tests {\n    use crate::a::A;\n}\n",
            ),
            // A folder's face and its parts use each other: no circle.
            ("c/src/e/mod.rs", "//! e\nmod x;\npub use x::X;\nfn f() { x::go() }\n"),
            ("c/src/e/x.rs", "//! x\nuse super::helper;\npub struct X;\n"),
            ("c/src/e/tests.rs", "//! t\nuse crate::a::A;\n"),
        ]);
        let found = crate_circles("c/src", &crate_files);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, ["c/src/a.rs", "c/src/b.rs"]);
        assert_eq!(
            found[0].1,
            ["c/src/a.rs -> c/src/b.rs", "c/src/b.rs -> c/src/a.rs"]
        );
        // Siblings in a folder, through `super::`, and a `#[path]` module.
        let folder = files(&[
            (
                "c/src/lib.rs",
                "//! root\nmod f;\n#[path = \"g_extra.rs\"]\nmod g;\n",
            ),
            ("c/src/f/mod.rs", "//! f\nmod p;\nmod q;\n"),
            ("c/src/f/p.rs", "//! p\nuse super::q::{Q, self};\n"),
            ("c/src/f/q.rs", "//! q\nuse super::{p::P, super::g::G};\n"),
            ("c/src/g_extra.rs", "//! g\nuse crate::f::p;\n"),
        ]);
        let found = crate_circles("c/src", &folder);
        assert_eq!(found.len(), 1, "{found:?}");
        // The path attribute makes g_extra.rs the module `g`: q.rs -> g_extra.rs -> p.rs.
        assert_eq!(
            found[0].0,
            ["c/src/f/p.rs", "c/src/f/q.rs", "c/src/g_extra.rs"]
        );
    }

    #[test]
    fn an_unlisted_circle_fails_and_a_listed_one_must_be_exact() {
        let found = vec![(
            vec!["c/src/a.rs".to_owned(), "c/src/b.rs".to_owned()],
            vec!["c/src/a.rs -> c/src/b.rs".to_owned()],
        )];
        let bad = circle_violations(&found, &[]);
        assert_eq!(bad.len(), 1);
        assert!(bad[0].contains("an import circle inside a crate: c/src/a.rs, c/src/b.rs"));
        assert!(circle_violations(&found, &[&["c/src/b.rs", "c/src/a.rs"]]).is_empty());
        // A circle that shrank or ended is written anew or taken off.
        let bad = circle_violations(&found, &[&["c/src/a.rs", "c/src/b.rs", "c/src/c.rs"]]);
        assert_eq!(bad.len(), 2, "{bad:?}");
        assert!(bad[1].contains("no longer has exactly"));
    }
}
