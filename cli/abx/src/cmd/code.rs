//! `abx code SANDBOX [FILE|-]`: run code in a context of the sandbox (`code/run`). Output
//! streams as it comes (`code/output`: stdout to stdout, stderr and the error's traceback to
//! stderr, each result as its `text/plain`, each image result as a line saying it came and
//! where it was saved (`--save-images DIR`), a line naming the MIME types of a result with
//! neither); with -j, the whole result as JSON. Exit code 0, or 1 when the code raised an
//! error. Ctrl-C, SIGTERM or SIGHUP interrupt the code (`$/cancelRequest`; the context keeps
//! its state) before abx exits with 128 + the signal.

use super::Ctx;
use crate::output::{print_json, Failure};
use crate::stream::Ending;
use abx_protocol::api::{self, to_params};
use abx_protocol::ErrorCode;
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The language a file's extension says.
fn language_of(file: &str) -> Option<&'static str> {
    let ext = std::path::Path::new(file).extension()?.to_str()?;
    Some(match ext {
        "py" => "python",
        "js" | "mjs" | "cjs" => "javascript",
        "sh" | "bash" => "bash",
        _ => return None,
    })
}

fn read_code(file: Option<&str>) -> Result<String, Failure> {
    match file {
        None | Some("-") => {
            if crate::term::stdin_is_tty() {
                return Err(Failure::usage(
                    "abx code: no code given",
                    "Pass a file, or pipe the code in: echo '1+1' | abx code SANDBOX",
                ));
            }
            Ok(
                String::from_utf8_lossy(&crate::stream::piped_stdin().unwrap_or_default())
                    .into_owned(),
            )
        }
        Some(f) => std::fs::read_to_string(f).map_err(|e| {
            Failure::from(abx_protocol::AbxError::detail(
                ErrorCode::LocalFileError,
                format!("{f}: {e}"),
            ))
        }),
    }
}

/// The image MIME types of a result bundle: type, file extension, base64 (else text).
const IMAGES: &[(&str, &str, bool)] = &[
    ("image/png", "png", true),
    ("image/jpeg", "jpg", true),
    ("image/gif", "gif", true),
    ("image/svg+xml", "svg", false),
];

/// What becomes of image results: with `--save-images DIR`, each is written to DIR as
/// `N.png` (the first N not taken) and its path printed; without, a line says it came.
struct Images {
    dir: Option<PathBuf>,
    next: u64,
    /// The paths written, in order.
    saved: Vec<PathBuf>,
    /// The first write that failed.
    error: Option<Failure>,
}

impl Images {
    fn new(dir: Option<&Path>) -> Images {
        Images {
            dir: dir.map(Path::to_path_buf),
            next: 1,
            saved: Vec::new(),
            error: None,
        }
    }

    /// One line per image of bundle `b`: `[image/png 12345 bytes: DIR/1.png]`, or
    /// `[image/png 12345 bytes: use --save-images DIR]`.
    fn lines(&mut self, b: &Value) -> Vec<String> {
        let mut lines = Vec::new();
        for (mime, ext, base64) in IMAGES {
            let Some(data) = b[*mime].as_str() else {
                continue;
            };
            let bytes = if *base64 {
                abx_protocol::b64::decode(data).unwrap_or_default()
            } else {
                data.as_bytes().to_vec()
            };
            let n = bytes.len();
            let line = match self.save(ext, &bytes) {
                Some(path) => format!("[{mime} {n} bytes: {}]", path.display()),
                None if self.dir.is_some() => format!("[{mime} {n} bytes: not saved]"),
                None => format!("[{mime} {n} bytes: use --save-images DIR]"),
            };
            lines.push(line);
        }
        lines
    }

    /// Write an image to the next free `DIR/N.ext`; `None` without a DIR or when the write
    /// failed (the failure is kept for the exit).
    fn save(&mut self, ext: &str, bytes: &[u8]) -> Option<PathBuf> {
        let dir = self.dir.as_ref()?;
        if self.error.is_some() {
            return None;
        }
        let written = std::fs::create_dir_all(dir).and_then(|()| loop {
            let path = dir.join(format!("{}.{ext}", self.next));
            self.next += 1;
            // `create_new`: never over an image of an earlier run.
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(mut f) => break f.write_all(bytes).map(|()| path),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => break Err(e),
            }
        });
        match written {
            Ok(path) => {
                self.saved.push(path.clone());
                Some(path)
            }
            Err(e) => {
                self.error = Some(Failure::from(abx_protocol::AbxError::detail(
                    ErrorCode::LocalFileError,
                    format!("--save-images {}: {e}", dir.display()),
                )));
                None
            }
        }
    }
}

/// A result bundle as lines of text: its `text/plain`, then a line per image (saved or
/// not); a bundle with neither names its MIME types.
fn result_lines(b: &Value, images: &mut Images) -> Vec<String> {
    let mut lines: Vec<String> = b["text/plain"]
        .as_str()
        .map(str::to_owned)
        .into_iter()
        .collect();
    lines.extend(images.lines(b));
    if lines.is_empty() {
        let kinds: Vec<&str> = b
            .as_object()
            .map(|o| o.keys().map(String::as_str).collect())
            .unwrap_or_default();
        lines.push(format!("[{}]", kinds.join(", ")));
    }
    lines
}

fn print_note(n: &Value, images: &mut Images) {
    let mut out = std::io::stdout();
    let mut err = std::io::stderr();
    let text = n["text"].as_str().unwrap_or_default();
    match n["type"].as_str().unwrap_or_default() {
        "stdout" => {
            let _ = out.write_all(text.as_bytes());
            let _ = out.flush();
        }
        "stderr" => {
            let _ = err.write_all(text.as_bytes());
        }
        "result" => {
            for l in result_lines(&n["result"], images) {
                let _ = writeln!(out, "{l}");
            }
            let _ = out.flush();
        }
        "error" => {
            let e = &n["error"];
            let tb = e["traceback"].as_str().unwrap_or_default();
            if tb.is_empty() {
                let _ = writeln!(err, "{}: {}", text_of(&e["name"]), text_of(&e["value"]));
            } else {
                let _ = write!(err, "{tb}");
                if !tb.ends_with('\n') {
                    let _ = writeln!(err);
                }
            }
        }
        "restarted" => {
            let _ = writeln!(err, "abx: {text}");
        }
        _ => {}
    }
}

fn text_of(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

/// `abx code`.
pub async fn code(
    cx: &Ctx,
    sandbox: &str,
    file: Option<&str>,
    context: Option<&str>,
    language: Option<&str>,
    save_images: Option<&Path>,
    timeout: Option<f64>,
) -> Result<u8, Failure> {
    let code = read_code(file)?;
    let language = language
        .map(str::to_owned)
        .or_else(|| file.and_then(language_of).map(str::to_owned));
    let params = to_params(&api::CodeRunParams {
        sandbox: sandbox.into(),
        code,
        language,
        context: context.map(Into::into),
        timeout,
        env: None,
        run_id: Some("abx-code".into()),
    });
    let mut c = cx.connect_announced().await?;
    let mut ending = Ending::new();
    let id = c
        .send_request("code/run", Some(&params))
        .await
        .map_err(|e| Failure::from(e).in_method("code/run"))?;
    let json_mode = cx.json;
    let mut images = Images::new(save_images);
    let mut on_note = |n: &abx_protocol::message::Notification| {
        if !json_mode && n.method == "code/output" {
            if let Some(p) = n.params.as_deref() {
                if let Ok(v) = serde_json::from_str::<Value>(p.get()) {
                    print_note(&v, &mut images);
                }
            }
        }
    };
    let sig = tokio::select! {
        r = c.reply_watching(&id, &mut on_note) => {
            let mut r = r.map_err(|e| Failure::from(e).in_method("code/run"))?;
            if json_mode {
                // The images of the result, saved: their paths in `savedImages`.
                if save_images.is_some() {
                    for b in r["results"].as_array().into_iter().flatten() {
                        images.lines(b);
                    }
                    r["savedImages"] = serde_json::json!(images.saved);
                }
                if let Some(f) = images.error.take() {
                    return Err(f);
                }
                print_json(&r);
            } else if r["timedOut"] == true {
                eprintln!("abx: the code ran past its timeout and was interrupted");
            }
            if let Some(f) = images.error.take() {
                return Err(f);
            }
            return Ok(if r["error"].is_null() { 0 } else { 1 });
        }
        _ = tokio::signal::ctrl_c() => libc::SIGINT,
        sig = ending.recv() => sig,
    };
    crate::stream::cancel_and_wait(&mut c, &id).await;
    Ok((128 + sig) as u8)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Issue 45, item 9: an image result says that it came, and `--save-images` writes it.
    #[test]
    fn image_results_are_named_and_saved() {
        let fig = json!({"text/plain": "<Figure size 640x480 with 1 Axes>",
            "image/png": "iVBORw0KGgo="});
        let mut none = Images::new(None);
        assert_eq!(
            result_lines(&fig, &mut none),
            [
                "<Figure size 640x480 with 1 Axes>",
                "[image/png 8 bytes: use --save-images DIR]"
            ]
        );
        assert_eq!(
            result_lines(&json!({"text/html": "<b>"}), &mut none),
            ["[text/html]"]
        );
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("out");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("1.png"), b"earlier").unwrap();
        let mut save = Images::new(Some(&dir));
        let svg = json!({"image/svg+xml": "<svg/>"});
        assert_eq!(
            result_lines(&fig, &mut save)[1],
            format!("[image/png 8 bytes: {}]", dir.join("2.png").display())
        );
        assert_eq!(
            result_lines(&svg, &mut save),
            [format!(
                "[image/svg+xml 6 bytes: {}]",
                dir.join("3.svg").display()
            )]
        );
        assert_eq!(std::fs::read(dir.join("1.png")).unwrap(), b"earlier");
        assert_eq!(
            std::fs::read(dir.join("2.png")).unwrap(),
            b"\x89PNG\r\n\x1a\n"
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("3.svg")).unwrap(),
            "<svg/>"
        );
        assert_eq!(save.saved.len(), 2);
        assert!(save.error.is_none());
        // A DIR that cannot be made: E4009 (abx exits 1 with it).
        let mut bad = Images::new(Some(&dir.join("1.png/x")));
        assert_eq!(
            result_lines(&fig, &mut bad)[1],
            "[image/png 8 bytes: not saved]"
        );
        assert_eq!(bad.error.unwrap().abx, "E4009");
    }
}
