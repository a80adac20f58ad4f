//! `abx secret set KEY | list | rm KEY`: the broker's secrets for egress headers
//! (`secrets/*`; docs/cli.md). The value is read from stdin, or asked for on the terminal
//! without echo: never from the command line (argv is visible to every user of the machine
//! in `/proc`).

use super::{call1, Ctx};
use crate::args::SecretArgs;
use crate::output::{out, print_json, Failure};
use serde_json::json;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;

/// `abx secret`.
pub async fn secret(cx: &Ctx, a: SecretArgs) -> Result<u8, Failure> {
    let key = || {
        a.key.clone().ok_or_else(|| {
            Failure::usage(
                format!("abx secret {} KEY: name the key", a.action),
                "Keys are what a policy names as \"secret:KEY\": abx secret set api_token",
            )
        })
    };
    match a.action.as_str() {
        "set" => {
            let key = key()?;
            let value = read_value(&key)?;
            call1(cx, "secrets/set", json!({"key": key, "value": value})).await?;
            if cx.json {
                print_json(&json!({"key": key}));
            } else {
                out(&format!("Stored secret '{key}'.\n"));
            }
            Ok(0)
        }
        "list" => {
            if a.key.is_some() {
                return Err(Failure::usage(
                    "abx secret list takes no key",
                    "Run 'abx secret list' to see the keys.",
                ));
            }
            let v = call1(cx, "secrets/list", json!({})).await?;
            if cx.json {
                print_json(&v);
            } else {
                let keys = v["keys"].as_array().cloned().unwrap_or_default();
                if keys.is_empty() {
                    out("No secrets.\n");
                }
                for k in keys {
                    out(&format!("{}\n", k.as_str().unwrap_or("?")));
                }
            }
            Ok(0)
        }
        _ => {
            let key = key()?;
            let v = call1(cx, "secrets/remove", json!({"key": key})).await?;
            if cx.json {
                print_json(&v);
            } else if v["removed"] == true {
                out(&format!("Removed secret '{key}'.\n"));
            } else {
                out(&format!("No secret '{key}'.\n"));
            }
            Ok(0)
        }
    }
}

/// The value: stdin when it is not a terminal (one trailing line break dropped), else asked
/// for on the terminal with echo off.
fn read_value(key: &str) -> Result<String, Failure> {
    let bad = |m: String| {
        Failure::usage(
            m,
            "Pipe the value in: printf %s \"$TOKEN\" | abx secret set KEY",
        )
    };
    let raw = if crate::term::stdin_is_tty() {
        prompt(&format!("Value of secret '{key}' (not echoed): "))
            .map_err(|e| bad(format!("cannot read the value from the terminal: {e}")))?
    } else {
        let mut b = Vec::new();
        std::io::stdin()
            .take(64 * 1024)
            .read_to_end(&mut b)
            .map_err(|e| bad(format!("cannot read the value from stdin: {e}")))?;
        b
    };
    let mut v = String::from_utf8(raw).map_err(|_| bad("the value is not UTF-8".into()))?;
    if v.ends_with('\n') {
        v.pop();
        if v.ends_with('\r') {
            v.pop();
        }
    }
    if v.is_empty() {
        return Err(bad("the value is empty".into()));
    }
    Ok(v)
}

/// Ask on the terminal (stdin) with echo off, restored afterwards.
fn prompt(question: &str) -> std::io::Result<Vec<u8>> {
    let mut tty = std::fs::OpenOptions::new().write(true).open("/dev/tty")?;
    write!(tty, "{question}")?;
    tty.flush()?;
    let stdin = std::io::stdin();
    let fd = stdin.as_raw_fd();
    // SAFETY: plain termios calls on our own stdin.
    let saved = unsafe {
        let mut t: libc::termios = std::mem::zeroed();
        if libc::tcgetattr(fd, &mut t) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let saved = t;
        t.c_lflag &= !(libc::ECHO | libc::ECHONL);
        t.c_lflag |= libc::ICANON;
        if libc::tcsetattr(fd, libc::TCSANOW, &t) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        saved
    };
    let mut line = String::new();
    let read = stdin.read_line(&mut line);
    // SAFETY: restores what tcgetattr returned.
    unsafe {
        libc::tcsetattr(fd, libc::TCSANOW, &saved);
    }
    let _ = writeln!(tty);
    read?;
    Ok(line.into_bytes())
}
