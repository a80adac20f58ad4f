//! `abx-broker`: the daemon binary. Started by `abx` (found beside it, see docs/cli.md
//! "Packaging"), never by hand in normal use:
//!
//! - `abx-broker run [--detached]`: the per-user daemon on the local socket;
//! - `abx-broker --stdio`: a private broker for one client on stdin/stdout;
//! - `abx-broker __abx-sandbox-init ...` / `__abx-plugin-launch`: the sandbox init and the
//!   plugin launcher, which the daemon starts as its own executable.
//!
//! Errors are printed the way `abx` prints them (`[E1012] message` and a suggestion; one
//! JSON object with `--json`), since `abx broker run` hands over to this binary.

use abx_broker::Paths;
use abx_protocol::AbxError;
use std::ffi::OsStr;
use std::process::ExitCode;

const USAGE: &str = "usage: abx-broker run [--detached] [--json] | abx-broker --stdio\n\
The abx daemon; started by 'abx' (see 'abx broker --help').";

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    match args.first().map(|a| a.as_os_str()) {
        Some(a) if a == OsStr::new(abx_local::init::ARG) => abx_local::init::main(),
        Some(a) if a == OsStr::new(abx_plugins::launch::ARG) => abx_plugins::launch::main(),
        _ => {}
    }
    let has = |f: &str| args.iter().any(|a| a == f);
    let json = has("--json") || has("-j");
    let paths = Paths::from_env();
    match args.first().and_then(|a| a.to_str()) {
        Some("--stdio") => match abx_broker::stdio::run(paths) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(&AbxError::internal(e), json),
        },
        Some("run") => match abx_broker::socket::run(paths, !has("--detached")) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(&e, json),
        },
        Some("--version" | "-V") => {
            println!("abx-broker {}", abx_broker::VERSION);
            ExitCode::SUCCESS
        }
        Some("--help" | "-h") => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

/// Print an error as `abx` does and exit with its code.
fn fail(e: &AbxError, json: bool) -> ExitCode {
    if json {
        let v = serde_json::json!({
            "status": "error",
            "message": e.message,
            "code": e.code.abx(),
            "suggestion": e.suggestion,
        });
        println!("{v}");
    } else {
        eprintln!("[{}] {}", e.code.abx(), e.message);
        if !e.suggestion.is_empty() {
            eprintln!("  Suggestion: {}", e.suggestion);
        }
    }
    ExitCode::from(e.code.exit_code().clamp(0, 255) as u8)
}
