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
