//! Workspaces (issue 43): `--mount` of `abx create|run`, and `abx log`, `abx diff`,
//! `abx apply`, `abx discard`.

use super::{call1, Ctx};
use crate::args::{ApplyArgs, DiffArgs, DiscardArgs, LogArgs};
use crate::output::{line, out, print_json, text, Failure};
use crate::table::Table;
use crate::term;
use abx_protocol::api::{self, to_params, MountMode, MountSpec};
use abx_protocol::{AbxError, ErrorCode};
use serde_json::Value;
use std::path::{Component, Path, PathBuf};

/// The modes a `--mount` may end with.
const MODES: &str = "ro, rw or overlay";

/// One `--mount SRC[:TARGET][:MODE]`, read with these rules (docs/cli.md, "Mounts"):
///
/// 1. The mode is the last `:`-field when it is made of letters only; it must then be `ro`,
///    `rw` or `overlay` (anything else is a usage error, E1009).
/// 2. The target is what follows the last `:/` of what is left (a target is an absolute
///    path), unless that would leave a one-letter source (`C:/proj`: a drive letter).
/// 3. The rest is the source; relative (`.`, `..`, `proj`) it is made absolute from `cwd`.
///
/// So a source with a `:` in it is written with its target: `./a:b:/workspace`.
pub fn parse_mount(spec: &str, cwd: &Path) -> Result<MountSpec, Failure> {
    let bad = |why: String| {
        Failure::usage(
            format!("--mount '{spec}': {why}"),
            "Write --mount SRC[:TARGET][:MODE]: SRC a host directory ('.' is this one), TARGET an absolute path in the sandbox (default /workspace), MODE ro, rw or overlay (the default); a SRC with ':' in it needs its TARGET (SRC:/workspace).",
        )
    };
    let mut rest = spec;
    let mut mode = None;
    if let Some((head, last)) = spec.rsplit_once(':') {
        if !last.is_empty() && last.chars().all(|c| c.is_ascii_alphabetic()) {
            mode = Some(match last {
                "ro" => MountMode::Ro,
                "rw" => MountMode::Rw,
                "overlay" => MountMode::Overlay,
                other => return Err(bad(format!("unknown mode '{other}' ({MODES})"))),
            });
            rest = head;
        }
    }
    let mut source = rest;
    let mut target = None;
    if let Some(at) = rest.rfind(":/") {
        let (src, tgt) = (&rest[..at], &rest[at + 1..]);
        let drive = src.len() == 1 && src.chars().all(|c| c.is_ascii_alphabetic());
        if !drive {
            source = src;
            target = Some(tgt.to_owned());
        }
    }
    if source.is_empty() {
        return Err(bad("no source directory".into()));
    }
    Ok(MountSpec {
        source: absolute(source, cwd).to_string_lossy().into_owned(),
        target,
        mode,
    })
}

/// `path` made absolute from `cwd`, `.` components left out (`..` kept: the broker
/// resolves the path once, symlinks included).
fn absolute(path: &str, cwd: &Path) -> PathBuf {
    let p = Path::new(path);
    let joined = if p.is_absolute() {
        p.to_path_buf()
    } else {
        cwd.join(p)
    };
    let mut out = PathBuf::new();
    for c in joined.components() {
        if c != Component::CurDir {
            out.push(c);
        }
    }
    out
}

/// The `mounts` of `sandbox/create` from `--mount` flags (none: `None`); an `rw` mount is
/// said on stderr (its writes go to the host at once).
pub fn mounts(specs: &[String]) -> Result<Option<Value>, Failure> {
    if specs.is_empty() {
        return Ok(None);
    }
    let cwd = std::env::current_dir().map_err(|e| {
        Failure::usage(
            format!("--mount: cannot read the current directory: {e}"),
            "Give the source as an absolute path.",
        )
    })?;
    let mut list = Vec::new();
    for s in specs {
        let m = parse_mount(s, &cwd)?;
        if m.mode == Some(MountMode::Rw) {
            eprintln!(
                "Warning: '{}' is mounted rw: what the sandbox writes there goes to the host at once (overlay, the default, keeps it until 'abx apply').",
                m.source
            );
        }
        list.push(m);
    }
    Ok(Some(serde_json::to_value(list).expect("mounts serialize")))
}

/// The `Mounts` row of the info layout: `SRC -> TARGET (mode)`, comma separated.
pub fn mounts_row(sb: &Value) -> Option<String> {
    let list = sb["mounts"].as_array().filter(|l| !l.is_empty())?;
    Some(
        list.iter()
            .map(|m| {
                format!(
                    "{} -> {} ({})",
                    text(&m["source"]),
                    text(&m["target"]),
                    text(&m["mode"])
                )
            })
            .collect::<Vec<_>>()
            .join(", "),
    )
}

/// Paths in the sandbox as the workspace methods take them: relative ones under /workspace.
fn sandbox_paths(paths: &[String]) -> Option<Vec<String>> {
    (!paths.is_empty()).then(|| {
        paths
            .iter()
            .map(|p| {
                if p.starts_with('/') {
                    p.clone()
                } else {
                    format!("/workspace/{}", p.trim_start_matches("./"))
                }
            })
            .collect()
    })
}

/// How long, for people: `350ms`, `1.2s`, `3m04s`.
fn duration(ms: u64) -> String {
    match ms {
        0..=999 => format!("{ms}ms"),
        1000..=59_999 => format!("{:.1}s", ms as f64 / 1000.0),
        _ => format!("{}m{:02}s", ms / 60_000, (ms / 1000) % 60),
    }
}

/// What an entry ran, on one line: a `sh -c` string as it is, argv quoted word by word,
/// a cell as its first line and its language.
fn command_of(e: &Value) -> String {
    if let Some(code) = e["code"].as_str() {
        let lines = code.lines().count();
        let first = code.lines().next().unwrap_or("");
        let more = if lines > 1 {
            format!(" (+{} lines)", lines - 1)
        } else {
            String::new()
        };
        return format!("[{}] {first}{more}", text(&e["language"]));
    }
    let argv: Vec<String> = e["argv"]
        .as_array()
        .map(|a| a.iter().map(text).collect())
        .unwrap_or_default();
    match argv.as_slice() {
        [sh, c, cmd] if sh == "sh" && c == "-c" => cmd.replace('\n', " "),
        _ => crate::stream::shell_join(&argv),
    }
}

/// The exit column: the code, the signal, or the error; `running` while it runs.
fn exit_cell(e: &Value) -> String {
    if let Some(err) = e["error"].as_str() {
        return err.to_owned();
    }
    if let Some(sig) = e["signal"].as_str() {
        return sig.to_owned();
    }
    match (&e["exitCode"], &e["durationMs"]) {
        (Value::Number(n), _) => n.to_string(),
        (_, Value::Null) => "running".into(),
        _ => String::new(),
    }
}

/// `abx log SB [--since N] [--limit N]`.
pub async fn log(cx: &Ctx, a: LogArgs) -> Result<u8, Failure> {
    let params = to_params(&api::LogParams {
        sandbox: a.sandbox.clone(),
        since: a.since,
        limit: a.limit,
    });
    let r = call1(cx, api::methods::SANDBOX_LOG, params).await?;
    if cx.json {
        print_json(&r);
        return Ok(0);
    }
    let entries = r["entries"].as_array().cloned().unwrap_or_default();
    if entries.is_empty() {
        out("No commands logged.\n");
    } else {
        let mut t = Table::new([
            "Seq", "Client", "Kind", "Command", "Cwd", "Started", "Duration", "Exit",
        ]);
        for e in &entries {
            t.row([
                text(&e["seq"]),
                text(&e["client"]),
                text(&e["kind"]),
                command_of(e),
                text(&e["cwd"]),
                super::sandbox::show_time(&e["startedAt"]),
                e["durationMs"].as_u64().map(duration).unwrap_or_default(),
                exit_cell(e),
            ]);
        }
        out(&t.render(term::table_width()));
    }
    if let Some(d) = r["dropped"].as_u64().filter(|d| *d > 0) {
        eprintln!("({d} older entries were dropped: the log keeps the newest.)");
    }
    Ok(0)
}

/// The one-letter status of a change (git's, `m` for a mode change).
fn letter(change: &str) -> &'static str {
    match change {
        "added" => "A",
        "modified" => "M",
        "deleted" => "D",
        "typeChanged" => "T",
        "modeChanged" => "m",
        _ => "?",
    }
}

/// `abx diff SB [--stat|--patch] [PATHS...]`.
pub async fn diff(cx: &Ctx, a: DiffArgs) -> Result<u8, Failure> {
    let params = to_params(&api::DiffParams {
        sandbox: a.sandbox.clone(),
        target: None,
        paths: sandbox_paths(&a.paths),
        format: a.patch.then_some(api::DiffFormat::Patch),
    });
    let r = call1(cx, api::methods::SANDBOX_DIFF, params).await?;
    if cx.json {
        print_json(&r);
        return Ok(0);
    }
    let changes = r["changes"].as_array().cloned().unwrap_or_default();
    if changes.is_empty() {
        out("No changes.\n");
        return Ok(0);
    }
    if a.stat {
        let mut t = Table::new(["Path", "Change", "Type", "Size"]);
        let mut counts = std::collections::BTreeMap::new();
        for c in &changes {
            let change = text(&c["change"]);
            *counts.entry(change.clone()).or_insert(0u64) += 1;
            let mut kind = text(&c["type"]);
            if c["binary"].as_bool() == Some(true) {
                kind.push_str(" (binary)");
            }
            t.row([text(&c["path"]), change, kind, text(&c["size"])]);
        }
        out(&t.render(term::table_width()));
        let summary: Vec<String> = counts.iter().map(|(k, n)| format!("{n} {k}")).collect();
        line(&format!(
            "{} change{}: {}",
            changes.len(),
            if changes.len() == 1 { "" } else { "s" },
            summary.join(", ")
        ));
    } else if a.patch {
        for c in &changes {
            match c["patch"].as_str() {
                Some(p) => {
                    out(p);
                    if !p.ends_with('\n') {
                        out("\n");
                    }
                }
                None if c["binary"].as_bool() == Some(true) => line(&format!(
                    "Binary file {} {}",
                    text(&c["path"]),
                    text(&c["change"])
                )),
                None => {
                    let mut s = format!(
                        "{} {} ({})",
                        letter(&text(&c["change"])),
                        text(&c["path"]),
                        text(&c["type"])
                    );
                    if let Some(t) = c["symlinkTarget"].as_str() {
                        s.push_str(&format!(" -> {t}"));
                    }
                    line(&s)
                }
            }
        }
    } else {
        for c in &changes {
            let mut s = format!("{} {}", letter(&text(&c["change"])), text(&c["path"]));
            if let Some(t) = c["symlinkTarget"].as_str() {
                s.push_str(&format!(" -> {t}"));
            }
            if c["explicitOnly"].as_bool() == Some(true) {
                s.push_str("  (applied only when named)");
            }
            line(&s);
        }
    }
    if r["truncated"].as_bool() == Some(true) {
        eprintln!("(The list was cut: name PATHS to see the rest.)");
    }
    Ok(0)
}

/// `abx apply SB [PATHS...] [--dry-run] [--force]`: 0 when everything asked was applied;
/// with conflicts they are printed and abx exits 1 with E4015.
pub async fn apply(cx: &Ctx, a: ApplyArgs) -> Result<u8, Failure> {
    let params = to_params(&api::ApplyParams {
        sandbox: a.sandbox.clone(),
        target: None,
        paths: sandbox_paths(&a.paths),
        dry_run: a.dry_run.then_some(true),
        force: a.force.then_some(true),
    });
    let r = call1(cx, api::methods::SANDBOX_APPLY, params).await?;
    let list = |k: &str| r[k].as_array().cloned().unwrap_or_default();
    let (applied, conflicts, skipped) = (list("applied"), list("conflicts"), list("skipped"));
    if cx.json {
        print_json(&r);
        return Ok(u8::from(!conflicts.is_empty()));
    }
    let verb = if a.dry_run { "Would apply" } else { "Applied" };
    for p in &applied {
        line(&format!("{verb} {}", text(p)));
    }
    for s in &skipped {
        line(&format!(
            "Skipped {}: {}",
            text(&s["path"]),
            text(&s["reason"])
        ));
    }
    for c in &conflicts {
        line(&format!(
            "Conflict {}: {}",
            text(&c["path"]),
            text(&c["reason"])
        ));
    }
    if applied.is_empty() && skipped.is_empty() && conflicts.is_empty() {
        out("Nothing to apply.\n");
    }
    if conflicts.is_empty() {
        return Ok(0);
    }
    let paths: Vec<String> = conflicts.iter().map(|c| text(&c["path"])).collect();
    let e = AbxError::new(
        ErrorCode::ApplyConflict,
        &[("sandbox", &a.sandbox), ("paths", &paths.join(", "))],
    );
    Err(e.into())
}

/// `abx discard SB [PATHS...]`: asks first on a terminal (`--yes` to skip), refused
/// without either (E1009), like `abx kill`.
pub async fn discard(cx: &Ctx, a: DiscardArgs) -> Result<u8, Failure> {
    let what = if a.paths.is_empty() {
        "every change".to_owned()
    } else {
        format!("the changes to {}", a.paths.join(", "))
    };
    let sb = &a.sandbox;
    let again = format!(
        "abx discard {sb}{}{} --yes",
        if a.paths.is_empty() { "" } else { " " },
        crate::stream::shell_join(&a.paths)
    );
    super::confirm_or_refuse(
        cx,
        &format!("Discard {what} of sandbox {sb}?"),
        &format!("nothing of sandbox '{sb}' was discarded"),
        &format!("discard {what} of sandbox '{sb}'"),
        &again,
    )?;
    let params = to_params(&api::DiscardParams {
        sandbox: sb.clone(),
        target: None,
        paths: sandbox_paths(&a.paths),
    });
    let r = call1(cx, api::methods::SANDBOX_DISCARD, params).await?;
    if cx.json {
        print_json(&r);
        return Ok(0);
    }
    let list = r["discarded"].as_array().cloned().unwrap_or_default();
    if list.is_empty() {
        out("Nothing to discard.\n");
    }
    for p in &list {
        line(&format!("Discarded {}", text(p)));
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(spec: &str) -> (String, Option<String>, Option<MountMode>) {
        let s = parse_mount(spec, Path::new("/home/u/proj")).unwrap();
        (s.source, s.target, s.mode)
    }

    #[test]
    fn mount_specs() {
        assert_eq!(m("."), ("/home/u/proj".into(), None, None));
        assert_eq!(m("./"), ("/home/u/proj".into(), None, None));
        assert_eq!(m("src"), ("/home/u/proj/src".into(), None, None));
        assert_eq!(m("../lib"), ("/home/u/proj/../lib".into(), None, None));
        assert_eq!(m("/data"), ("/data".into(), None, None));
        assert_eq!(
            m(".:ro"),
            ("/home/u/proj".into(), None, Some(MountMode::Ro))
        );
        assert_eq!(m("/data:rw"), ("/data".into(), None, Some(MountMode::Rw)));
        assert_eq!(
            m(".:/workspace/app"),
            ("/home/u/proj".into(), Some("/workspace/app".into()), None)
        );
        assert_eq!(
            m("/d:/srv/x:overlay"),
            ("/d".into(), Some("/srv/x".into()), Some(MountMode::Overlay))
        );
        // A source with ':' in it: its target makes it clear.
        assert_eq!(
            m("./a:b:/workspace"),
            ("/home/u/proj/a:b".into(), Some("/workspace".into()), None)
        );
        assert_eq!(
            m("/x/a:/b:/workspace:ro"),
            (
                "/x/a:/b".into(),
                Some("/workspace".into()),
                Some(MountMode::Ro)
            )
        );
        // A drive letter is not a source.
        assert_eq!(m("C:/proj"), ("/home/u/proj/C:/proj".into(), None, None));
        assert_eq!(m(r"C:\proj"), (r"/home/u/proj/C:\proj".into(), None, None));
        assert_eq!(
            m("C:/proj:/workspace"),
            (
                "/home/u/proj/C:/proj".into(),
                Some("/workspace".into()),
                None
            )
        );
        // A last field with a digit or a dot is part of the path.
        assert_eq!(m("./v:1.2"), ("/home/u/proj/v:1.2".into(), None, None));
    }

    #[test]
    fn bad_mount_specs_are_usage_errors() {
        for spec in [
            ".:rwx",
            ".:RO",
            "/d:/w:readonly",
            ":ro",
            ":/workspace",
            ".:foo",
        ] {
            let e = parse_mount(spec, Path::new("/p")).unwrap_err();
            assert_eq!((e.abx.as_str(), e.exit), ("E1009", 2), "{spec}");
        }
        let e = parse_mount(".:rwx", Path::new("/p")).unwrap_err();
        assert!(e.message.contains("unknown mode 'rwx'"), "{}", e.message);
    }

    #[test]
    fn log_cells() {
        let e = serde_json::json!({"argv": ["sh", "-c", "make test"], "exitCode": 2, "durationMs": 1500});
        assert_eq!(command_of(&e), "make test");
        assert_eq!(exit_cell(&e), "2");
        let e = serde_json::json!({"argv": ["ls", "a b"]});
        assert_eq!(command_of(&e), "ls 'a b'");
        assert_eq!(exit_cell(&e), "running");
        let e = serde_json::json!({"code": "x = 1\nprint(x)", "language": "python", "error": "E1006", "durationMs": 3});
        assert_eq!(command_of(&e), "[python] x = 1 (+1 lines)");
        assert_eq!(exit_cell(&e), "E1006");
        assert_eq!(duration(350), "350ms");
        assert_eq!(duration(1500), "1.5s");
        assert_eq!(duration(184_000), "3m04s");
        assert_eq!(
            sandbox_paths(&["a.txt".into(), "/tmp/x".into(), "./b".into()]),
            Some(vec![
                "/workspace/a.txt".into(),
                "/tmp/x".into(),
                "/workspace/b".into()
            ])
        );
    }
}
