//! `abx upload`, `abx download` and `abx sandbox files list|read|write|rm|mkdir`.
//!
//! Upload and download hand the local path to the broker (same user, `files/upload` /
//! `files/download`): it streams the file with constant memory and writes atomically, so
//! a failure leaves nothing half-written. A progress bar is drawn on stderr from the
//! `files/progress` notifications, only when stderr is a terminal.

use super::{call, Ctx};
use crate::args::FilesCmd;
use crate::output::{out, out_bytes, print_json, text, Failure};
use crate::table::Table;
use crate::term;
use abx_client::client::Client;
use abx_protocol::api::{self, to_params};
use abx_protocol::message::Notification;
use abx_protocol::{AbxError, ErrorCode};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// `files/upload` / `files/download` params.
fn transfer_params(sandbox: &str, local: &Path, path: &str) -> Value {
    to_params(&api::TransferParams {
        sandbox: sandbox.into(),
        local_path: local.to_string_lossy().into_owned(),
        path: path.into(),
    })
}

fn local_err(path: &Path, detail: impl std::fmt::Display) -> Failure {
    AbxError::new(
        ErrorCode::LocalFileError,
        &[
            ("path", &path.display().to_string()),
            ("detail", &detail.to_string()),
        ],
    )
    .into()
}

/// Replace the broker's (API-worded) suggestion with the CLI's flag for this error code.
fn cli_hint(mut f: Failure, code: &str, suggestion: &str) -> Failure {
    if f.abx == code {
        f.suggestion = Some(suggestion.to_owned());
    }
    f
}

/// The path as the broker must see it: absolute (it does not share our working dir).
fn absolute(p: &Path) -> Result<PathBuf, Failure> {
    std::path::absolute(p).map_err(|e| local_err(p, e))
}

/// Check an upload source here first: a clear E4009 before anything is sent.
fn check_source(p: &Path) -> Result<u64, Failure> {
    let meta = std::fs::metadata(p).map_err(|e| local_err(p, io_reason(&e)))?;
    if meta.is_dir() {
        return Err(local_err(p, "is a directory"));
    }
    if !meta.is_file() {
        return Err(local_err(p, "is not a regular file"));
    }
    std::fs::File::open(p).map_err(|e| local_err(p, io_reason(&e)))?;
    Ok(meta.len())
}

fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => e.to_string(),
    }
}

/// A one-line progress bar on stderr (only when stderr is a terminal).
struct Progress {
    label: String,
    on: bool,
    drawn: bool,
}

impl Progress {
    fn new(label: &str, json: bool) -> Progress {
        Progress {
            label: label.to_owned(),
            on: !json && term::stderr_is_tty(),
            drawn: false,
        }
    }

    fn update(&mut self, done: u64, total: u64) {
        if !self.on {
            return;
        }
        let frac = if total == 0 {
            1.0
        } else {
            (done as f64 / total as f64).min(1.0)
        };
        let cells = 30;
        let full = (frac * cells as f64).round() as usize;
        let line = format!(
            "\r\x1b[K{}  [{}{}] {:>3}%  {} / {}",
            self.label,
            "#".repeat(full),
            "-".repeat(cells - full),
            (frac * 100.0).round() as u64,
            human_bytes(done),
            human_bytes(total)
        );
        let mut e = std::io::stderr();
        let _ = e.write_all(line.as_bytes());
        let _ = e.flush();
        self.drawn = true;
    }

    fn note(&mut self, n: &Notification) {
        if n.method != "files/progress" {
            return;
        }
        let p: Value = n
            .params
            .as_deref()
            .and_then(|p| serde_json::from_str(p.get()).ok())
            .unwrap_or_default();
        self.update(
            p["bytes"].as_u64().unwrap_or(0),
            p["total"].as_u64().unwrap_or(0),
        );
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if self.drawn {
            let _ = std::io::stderr().write_all(b"\r\x1b[K");
        }
    }
}

/// `1536` -> `1.5 KiB`.
pub fn human_bytes(n: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", U[i])
    }
}

async fn transfer(
    c: &mut Client,
    method: &str,
    params: Value,
    label: &str,
    json_mode: bool,
) -> Result<Value, Failure> {
    let mut bar = Progress::new(label, json_mode);
    let r = c
        .call_watching(method, Some(&params), &mut |n| bar.note(n))
        .await
        .map_err(|e| Failure::from(e).in_method(method));
    drop(bar);
    r
}

/// `abx upload SANDBOX LOCAL REMOTE`.
pub async fn upload(cx: &Ctx, sandbox: &str, local: &Path, remote: &str) -> Result<u8, Failure> {
    check_source(local)?;
    let abs = absolute(local)?;
    let mut c = cx.connect().await?;
    let r = transfer(
        &mut c,
        "files/upload",
        transfer_params(sandbox, &abs, remote),
        &format!("Uploading {}", local.display()),
        cx.json,
    )
    .await?;
    if cx.json {
        print_json(
            &json!({"sandbox": sandbox, "localPath": abs, "path": remote, "size": r["size"]}),
        );
    } else {
        out(&format!("Uploaded {} -> {remote}\n", local.display()));
    }
    Ok(0)
}

/// `abx download SANDBOX REMOTE LOCAL` (LOCAL may be an existing directory).
pub async fn download(cx: &Ctx, sandbox: &str, remote: &str, local: &Path) -> Result<u8, Failure> {
    let mut target = local.to_path_buf();
    if local.is_dir() {
        let name = Path::new(remote).file_name().ok_or_else(|| {
            local_err(local, "is a directory and the remote path has no file name")
        })?;
        target = local.join(name);
    }
    let abs = absolute(&target)?;
    let mut c = cx.connect().await?;
    let r = transfer(
        &mut c,
        "files/download",
        transfer_params(sandbox, &abs, remote),
        &format!("Downloading {remote}"),
        cx.json,
    )
    .await?;
    if cx.json {
        print_json(
            &json!({"sandbox": sandbox, "path": remote, "localPath": abs, "size": r["size"]}),
        );
    } else {
        out(&format!("Downloaded {remote} -> {}\n", target.display()));
    }
    Ok(0)
}

/// `abx sandbox files ...`.
pub async fn files(cx: &Ctx, f: FilesCmd) -> Result<u8, Failure> {
    match f {
        FilesCmd::List {
            sandbox,
            path,
            recursive,
        } => list(cx, &sandbox, path.as_deref(), recursive).await,
        FilesCmd::Read { sandbox, path } => read(cx, &sandbox, &path).await,
        FilesCmd::Write {
            sandbox,
            path,
            from,
        } => write(cx, &sandbox, &path, from.as_deref()).await,
        FilesCmd::Rm {
            sandbox,
            path,
            recursive,
        } => {
            let mut c = cx.connect().await?;
            call(
                &mut c,
                "files/remove",
                to_params(&api::RemoveParams {
                    sandbox: sandbox.clone(),
                    path: path.clone(),
                    recursive,
                }),
            )
            .await
            .map_err(|f| {
                cli_hint(
                    f,
                    "E4005",
                    "Re-run with -r (--recursive) to remove it with its contents.",
                )
            })?;
            if cx.json {
                print_json(&json!({"sandbox": sandbox, "path": path, "removed": true}));
            } else {
                out(&format!("Removed {path}\n"));
            }
            Ok(0)
        }
        FilesCmd::Mkdir {
            sandbox,
            path,
            parents,
        } => {
            let mut c = cx.connect().await?;
            call(
                &mut c,
                "files/mkdir",
                to_params(&api::MkdirParams {
                    sandbox: sandbox.clone(),
                    path: path.clone(),
                    parents,
                }),
            )
            .await
            .map_err(|f| {
                cli_hint(
                    f,
                    "E4001",
                    "Pass -p (--parents) to create the missing parent directories too.",
                )
            })?;
            if cx.json {
                print_json(&json!({"sandbox": sandbox, "path": path, "created": true}));
            } else {
                out(&format!("Created directory {path}\n"));
            }
            Ok(0)
        }
    }
}

async fn list(cx: &Ctx, sandbox: &str, path: Option<&str>, recursive: bool) -> Result<u8, Failure> {
    let params = to_params(&api::FilesListParams {
        sandbox: sandbox.into(),
        path: path.map(Into::into),
        recursive,
    });
    let mut c = cx.connect().await?;
    let r = call(&mut c, "files/list", params).await?;
    let entries = r["entries"].as_array().cloned().unwrap_or_default();
    if cx.json {
        print_json(&json!({"entries": entries}));
        return Ok(0);
    }
    if entries.is_empty() {
        out(&format!("No files in {}.\n", path.unwrap_or("/workspace")));
        return Ok(0);
    }
    // Recursive listings show paths below the listed directory: the shortest path is a
    // direct child, so it tells that directory.
    let root = entries
        .iter()
        .map(|e| (text(&e["path"]), text(&e["name"])))
        .min_by_key(|(p, _)| p.len())
        .and_then(|(p, n)| p.strip_suffix(&n).map(str::to_owned))
        .unwrap_or_default();
    let mut t = Table::new(["Name", "Type", "Size"]);
    for e in &entries {
        let name = if recursive && !root.is_empty() {
            let full = text(&e["path"]);
            full.strip_prefix(&root).map(str::to_owned).unwrap_or(full)
        } else {
            text(&e["name"])
        };
        t.row([name, text(&e["type"]), text(&e["size"])]);
    }
    out(&t.render(term::table_width()));
    Ok(0)
}

/// Chunk size of `files read` (the broker's maximum per call).
const READ_CHUNK: u64 = 4 * 1024 * 1024;

async fn read(cx: &Ctx, sandbox: &str, path: &str) -> Result<u8, Failure> {
    let mut c = cx.connect().await?;
    let mut offset = 0u64;
    let mut all = Vec::new();
    loop {
        let r = call(
            &mut c,
            "files/read",
            to_params(&api::FilesReadParams {
                sandbox: sandbox.into(),
                path: path.into(),
                offset: Some(offset),
                length: Some(READ_CHUNK),
                encoding: Some("base64".into()),
            }),
        )
        .await?;
        let data =
            abx_protocol::b64::decode(r["data"].as_str().unwrap_or_default()).map_err(|e| {
                Failure::from(AbxError::internal(format!("bad base64 from broker: {e}")))
            })?;
        offset += data.len() as u64;
        if cx.json {
            all.extend_from_slice(&data);
        } else {
            out_bytes(&data);
        }
        if r["eof"] != false || data.is_empty() {
            break;
        }
    }
    if cx.json {
        let (data, encoding) = match String::from_utf8(all) {
            Ok(s) => (s, "utf-8"),
            Err(e) => (abx_protocol::b64::encode(e.into_bytes()), "base64"),
        };
        print_json(
            &json!({"sandbox": sandbox, "path": path, "size": offset, "encoding": encoding, "data": data}),
        );
    }
    Ok(0)
}

/// Largest stdin written with one (atomic) `files/write`; more is spooled to a private
/// temp file and uploaded, which is atomic too.
const WRITE_INLINE: usize = 4 * 1024 * 1024;

async fn write(cx: &Ctx, sandbox: &str, path: &str, from: Option<&Path>) -> Result<u8, Failure> {
    let size = if let Some(local) = from {
        check_source(local)?;
        let abs = absolute(local)?;
        let mut c = cx.connect().await?;
        let r = transfer(
            &mut c,
            "files/upload",
            transfer_params(sandbox, &abs, path),
            &format!("Writing {path}"),
            cx.json,
        )
        .await?;
        r["size"].as_u64().unwrap_or(0)
    } else {
        let mut stdin = std::io::stdin().lock();
        let mut head = Vec::new();
        (&mut stdin)
            .take(WRITE_INLINE as u64 + 1)
            .read_to_end(&mut head)
            .map_err(|e| local_err(Path::new("<stdin>"), e))?;
        if head.len() <= WRITE_INLINE {
            drop(stdin);
            let mut c = cx.connect().await?;
            let r = call(
                &mut c,
                "files/write",
                to_params(&api::FilesWriteParams {
                    sandbox: sandbox.into(),
                    path: path.into(),
                    data: abx_protocol::b64::encode(&head),
                    encoding: Some("base64".into()),
                    offset: None,
                    append: false,
                    mode: None,
                }),
            )
            .await?;
            r["size"].as_u64().unwrap_or(head.len() as u64)
        } else {
            let (spool, mut file) = tempfile_in_runtime(cx)?;
            file.write_all(&head)
                .and_then(|_| std::io::copy(&mut stdin, &mut file).map(|_| ()))
                .and_then(|_| file.flush())
                .map_err(|e| local_err(&spool.0, e))?;
            drop((stdin, file));
            let mut c = cx.connect().await?;
            let r = transfer(
                &mut c,
                "files/upload",
                transfer_params(sandbox, &spool.0, path),
                &format!("Writing {path}"),
                cx.json,
            )
            .await;
            r?["size"].as_u64().unwrap_or(0)
        }
    };
    if cx.json {
        print_json(&json!({"sandbox": sandbox, "path": path, "size": size}));
    } else {
        out(&format!("Wrote {size} bytes to {path}\n"));
    }
    Ok(0)
}

/// A spool file, removed when dropped (also on every error path).
struct Spool(PathBuf);

impl Drop for Spool {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A private (0600, O_EXCL) spool file in the broker's runtime dir.
fn tempfile_in_runtime(cx: &Ctx) -> Result<(Spool, std::fs::File), Failure> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = &cx.paths.runtime_dir;
    cx.paths.ensure().map_err(|e| local_err(dir, e))?;
    let p = dir.join(format!(
        "stdin-{}-{}.spool",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&p)
        .map_err(|e| local_err(&p, e))?;
    Ok((Spool(p), f))
}

#[cfg(test)]
mod tests {
    #[test]
    fn human_sizes() {
        assert_eq!(super::human_bytes(12), "12 B");
        assert_eq!(super::human_bytes(1536), "1.5 KiB");
        assert_eq!(super::human_bytes(3 * 1024 * 1024), "3.0 MiB");
    }
}
