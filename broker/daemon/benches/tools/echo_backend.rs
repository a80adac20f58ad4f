//! The relay bench's backend (not a cargo target: the plugin bench compiles it with
//! `rustc -O`, std only, into the target dir). The same tiny program stands behind every
//! relay, so the relays are compared and nothing else:
//!
//! - `echo_backend epp [ID]`: an EPP/1 plugin on stdio, newline-delimited JSON-RPC; answers
//!   `initialize` with the handshake of provider `ID` (default `echo`) declaring
//!   `sandbox.lifecycle`, and every other request with `{"sandboxes":[]}`.
//! - `echo_backend lsp`: a language server on stdio, `Content-Length` framing; answers
//!   `initialize` with `{"capabilities":{}}` and every other request the same way.
//!
//! `shutdown` gets `null`, `exit` ends it, other notifications are ignored. Each reply is one
//! `write(2)`. The request is scanned, not parsed: the top-level `id` is echoed as it came
//! (lspmux sends tagged string ids) and `method` picks the answer.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::mem::ManuallyDrop;
use std::os::fd::FromRawFd;

fn main() {
    let mut args = std::env::args().skip(1);
    let lsp = match args.next().as_deref() {
        Some("lsp") => true,
        Some("epp") | None => false,
        Some(other) => {
            eprintln!("echo_backend: unknown mode {other:?} (epp or lsp)");
            std::process::exit(2);
        }
    };
    let id = args.next().unwrap_or_else(|| "echo".to_owned());
    let epp_init = format!(
        "{{\"protocol\":\"EPP/1\",\"provider\":{{\"id\":\"{id}\",\"name\":\"Echo\",\"version\":\"0.1.0\"}},\"features\":[\"sandbox.lifecycle\"]}}"
    );
    // SAFETY: fds 0 and 1 are ours for the life of the process; ManuallyDrop never closes them.
    let (input, mut out) = unsafe {
        (
            ManuallyDrop::new(File::from_raw_fd(0)),
            ManuallyDrop::new(File::from_raw_fd(1)),
        )
    };
    let mut r = BufReader::with_capacity(64 * 1024, &*input);
    let mut msg = Vec::with_capacity(4096);
    let mut reply = Vec::with_capacity(4096);
    loop {
        msg.clear();
        let ok = if lsp {
            read_lsp(&mut r, &mut msg)
        } else {
            r.read_until(b'\n', &mut msg).map(|n| n > 0).unwrap_or(false)
        };
        if !ok {
            return;
        }
        let (id, method) = scan(&msg);
        let Some(id) = id else {
            if method == b"exit" {
                return;
            }
            continue;
        };
        let result: &[u8] = match method {
            b"initialize" if lsp => b"{\"capabilities\":{}}",
            b"initialize" => epp_init.as_bytes(),
            b"shutdown" => b"null",
            _ => b"{\"sandboxes\":[]}",
        };
        reply.clear();
        if lsp {
            let body_len = 22 + id.len() + 10 + result.len() + 1;
            reply.extend_from_slice(format!("Content-Length: {body_len}\r\n\r\n").as_bytes());
        }
        reply.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
        reply.extend_from_slice(id);
        reply.extend_from_slice(b",\"result\":");
        reply.extend_from_slice(result);
        reply.push(b'}');
        if !lsp {
            reply.push(b'\n');
        }
        if out.write_all(&reply).is_err() {
            return;
        }
    }
}

/// One `Content-Length` framed message into `msg`; false at EOF or on a bad header.
fn read_lsp(r: &mut impl BufRead, msg: &mut Vec<u8>) -> bool {
    let mut len = None;
    let mut line = Vec::new();
    loop {
        line.clear();
        match r.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return false,
            Ok(_) => {}
        }
        let l = line.strip_suffix(b"\n").unwrap_or(&line);
        let l = l.strip_suffix(b"\r").unwrap_or(l);
        if l.is_empty() {
            break;
        }
        if let Some(v) = l
            .to_ascii_lowercase()
            .strip_prefix(b"content-length:".as_slice())
        {
            len = std::str::from_utf8(v).ok().and_then(|s| s.trim().parse::<usize>().ok());
        }
    }
    let Some(n) = len else { return false };
    msg.resize(n, 0);
    r.read_exact(msg).is_ok()
}

/// The raw top-level `id` value and `method` string of a JSON object (no allocation).
fn scan(m: &[u8]) -> (Option<&[u8]>, &[u8]) {
    let (mut id, mut method) = (None, &b""[..]);
    let mut i = match m.iter().position(|&b| b == b'{') {
        Some(p) => p + 1,
        None => return (None, method),
    };
    loop {
        i = skip_ws(m, i);
        if i >= m.len() || m[i] == b'}' {
            return (id, method);
        }
        if m[i] == b',' {
            i += 1;
            continue;
        }
        let key_end = string_end(m, i);
        let key = &m[(i + 1).min(key_end)..key_end.saturating_sub(1).max(i + 1)];
        i = skip_ws(m, key_end);
        if i < m.len() && m[i] == b':' {
            i += 1;
        }
        i = skip_ws(m, i);
        let v_end = value_end(m, i);
        let value = &m[i.min(v_end)..v_end];
        match key {
            b"id" => id = Some(value),
            b"method" if value.len() >= 2 => method = &value[1..value.len() - 1],
            _ => {}
        }
        i = v_end;
    }
}

fn skip_ws(m: &[u8], mut i: usize) -> usize {
    while i < m.len() && matches!(m[i], b' ' | b'\t' | b'\r' | b'\n') {
        i += 1;
    }
    i
}

/// The index just past the string starting at `i` (a `"`).
fn string_end(m: &[u8], mut i: usize) -> usize {
    i += 1;
    while i < m.len() {
        match m[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            _ => i += 1,
        }
    }
    m.len()
}

/// The index just past the JSON value starting at `i`.
fn value_end(m: &[u8], mut i: usize) -> usize {
    if i >= m.len() {
        return i;
    }
    match m[i] {
        b'"' => string_end(m, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            while i < m.len() {
                match m[i] {
                    b'"' => {
                        i = string_end(m, i);
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return i + 1;
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
            i
        }
        _ => {
            while i < m.len() && !matches!(m[i], b',' | b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t') {
                i += 1;
            }
            i
        }
    }
}
