//! `run_code`'s result: the output and results as text, images as image content, an error
//! as `isError` with its traceback.

use super::cx::{ok, pretty, Cx};
use serde_json::{json, Value};

/// The tool result of `run_code`: the output and results as text, images as image
/// content, an error as `isError` with its traceback.
pub(super) fn code_result(cx: &Cx<'_>, r: &Value) -> Value {
    let mut text = String::new();
    let section = |text: &mut String, name: &str, body: &str| {
        if !body.is_empty() {
            text.push_str(&format!("--- {name}\n{body}"));
            if !body.ends_with('\n') {
                text.push('\n');
            }
        }
    };
    section(
        &mut text,
        "stdout",
        r["stdout"].as_str().unwrap_or_default(),
    );
    section(
        &mut text,
        "stderr",
        r["stderr"].as_str().unwrap_or_default(),
    );
    let mut images = Vec::new();
    for b in r["results"].as_array().into_iter().flatten() {
        for (mime, kind) in [("image/png", "image"), ("image/jpeg", "image")] {
            if let Some(data) = b[mime].as_str() {
                images.push(json!({"type": kind, "data": data, "mimeType": mime}));
            }
        }
        let shown = b["text/markdown"]
            .as_str()
            .or(b["text/plain"].as_str())
            .or(b["text/html"].as_str());
        match shown {
            Some(t) => section(&mut text, "result", t),
            None if b.get("image/png").is_some() || b.get("image/jpeg").is_some() => {
                section(&mut text, "result", "(an image, below)")
            }
            None => section(&mut text, "result", &pretty(b)),
        }
    }
    let error = &r["error"];
    if !error.is_null() {
        let tb = error["traceback"].as_str().unwrap_or_default();
        let line = format!(
            "{}: {}",
            error["name"].as_str().unwrap_or_default(),
            error["value"].as_str().unwrap_or_default()
        );
        section(&mut text, "error", if tb.is_empty() { &line } else { tb });
    }
    if r["timedOut"] == true {
        text.push_str("(the code ran past its timeout and was interrupted)\n");
    }
    if text.is_empty() {
        text.push_str("(no output)\n");
    }
    let mut out = ok(cx, text, r.clone());
    if let Some(content) = out["content"].as_array_mut() {
        content.extend(images);
    }
    out["isError"] = json!(!error.is_null());
    out
}
