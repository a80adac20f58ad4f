//! Every method name the broker and the CLI write as a literal (a match arm that routes, a
//! call they make) is one of the catalogue's (`abx_protocol::catalogue`): a name of one of
//! the catalogue's families (`sandbox/`, `files/`, ...) that the catalogue does not have is
//! a typo or a method added without its entry.

use abx_protocol::catalogue;
use std::path::{Path, PathBuf};

/// The `.rs` files under `dir`, at any depth.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The string literals of `text` shaped like a method name of one of `families`
/// (`family/camelCaseName`) that are neither a method nor a notification of the catalogue.
fn unknown_names<'a>(text: &'a str, families: &[&str]) -> Vec<&'a str> {
    let mut out = Vec::new();
    for line in text.lines() {
        for (i, lit) in line.split('"').enumerate() {
            if i % 2 == 0 {
                continue;
            }
            let Some((family, name)) = lit.split_once('/') else {
                continue;
            };
            let shaped = name.starts_with(|c: char| c.is_ascii_lowercase())
                && name.chars().all(|c| c.is_ascii_alphabetic());
            if shaped
                && families.contains(&family)
                && catalogue::method(lit).is_none()
                && catalogue::notification(lit).is_none()
            {
                out.push(lit);
            }
        }
    }
    out
}

#[test]
fn every_method_name_literal_of_the_broker_and_the_cli_is_in_the_catalogue() {
    let mut families: Vec<&str> = catalogue::METHODS
        .iter()
        .map(|m| m.name)
        .chain(catalogue::NOTIFICATIONS.iter().map(|n| n.name))
        .filter_map(|n| n.split_once('/').map(|(f, _)| f))
        .filter(|f| *f != "$")
        .collect();
    families.sort_unstable();
    families.dedup();
    // The check fails on a name the catalogue does not have.
    assert_eq!(
        unknown_names(
            r#"match m { "files/bogus" => 1, "files/read" | "x/y" => 2 }"#,
            &families
        ),
        ["files/bogus"]
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for dir in ["broker", "cli"] {
        for krate in std::fs::read_dir(root.join(dir)).expect("crates").flatten() {
            rust_files(&krate.path().join("src"), &mut files);
        }
    }
    assert!(files.len() > 50, "{}", files.len());
    let mut unknown = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        for n in unknown_names(&text, &families) {
            unknown.push(format!("{}: \"{n}\"", f.display()));
        }
    }
    assert!(
        unknown.is_empty(),
        "method names that are not in protocol/src/catalogue.rs:\n{}",
        unknown.join("\n")
    );
}
