//! `abx`: the command-line client of the abx broker. A thin `main`: parse flags, run the
//! command, print its output or its error and exit with the documented code. The daemon is
//! another binary (`abx-broker`, found beside this one); this one links no daemon code.

mod args;
mod cmd;
mod mcp;
mod output;
mod rpc;
mod stream;
mod table;
mod term;

use abx_home::Paths;
use abx_protocol::ErrorCode;
use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{CommandFactory, FromArgMatches, Subcommand};
use serde_json::json;
use std::process::ExitCode;

// `abx mcp`, served here rather than from the command table.
#[derive(Subcommand, Debug)]
enum Serve {
    /// Serve the Model Context Protocol on stdio, for AI agents (docs/mcp.md).
    Mcp,
}

fn main() -> ExitCode {
    // The command tree is built to parse one line (args::plan); it and the matches are left
    // to the exit rather than freed piece by piece (a tenth of a short command's own CPU
    // time).
    let mut host = None;
    // Only the command the line names, its groups as the parser enters them; the whole tree
    // for `abx help ...` and the completion scripts, which copy it before the parser enters
    // any group (args::plan).
    args::plan(flags_and_words());
    let mut command = Serve::augment_subcommands(args::Cli::command());
    let parsed = command
        .try_get_matches_from_mut(std::env::args_os())
        .and_then(|m| {
            host = m.get_one::<String>("host").cloned();
            let r = match Serve::from_arg_matches(&m) {
                Ok(Serve::Mcp) => Ok(None),
                Err(_) => args::Cli::from_arg_matches(&m).map(Some),
            };
            std::mem::forget(m);
            r
        });
    std::mem::forget(command);
    if parsed.is_ok() {
        // --host (or ABX_HOST, which clap reads into it) decides for every connection.
        if let Err(e) = abx_client::remote::set(Some(host.as_deref().unwrap_or(""))) {
            let json_mode = matches!(&parsed, Ok(Some(c)) if c.json);
            output::Failure::from(e).print(json_mode, false, None);
            return ExitCode::from(2);
        }
    }
    let cli = match parsed {
        Ok(Some(c)) => c,
        Ok(None) => return mcp::run(&Paths::from_env()),
        Err(e) => return usage_error(e),
    };
    let paths = Paths::from_env();
    let (json_mode, verbose) = (cli.json, cli.verbose > 0);
    let log = paths.log_file();
    match cmd::run(cli, paths) {
        Ok(code) => ExitCode::from(code),
        Err(f) => {
            f.print(json_mode, verbose, Some(&log));
            ExitCode::from(f.exit.clamp(0, 255) as u8)
        }
    }
}

/// The command line's words before `--` (after it they belong to the sandbox's command).
fn flags_and_words() -> impl Iterator<Item = std::ffi::OsString> {
    std::env::args_os().skip(1).take_while(|a| a != "--")
}

/// Groups of `abx sandbox ...`, for the hint after an unknown top-level command.
const SANDBOX_GROUPS: &[&str] = &["files", "process", "system", "capabilities", "command"];

/// clap's message (help and version as they are), plus a hint for unknown commands; with
/// -j a JSON error on stdout. Exit 0 for help/version, else 2.
fn usage_error(e: clap::Error) -> ExitCode {
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        let _ = e.print();
        return ExitCode::from(
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                2
            } else {
                0
            },
        );
    }
    let mut hint = String::new();
    if e.kind() == ErrorKind::InvalidSubcommand {
        if let Some(ContextValue::String(bad)) = e.get(ContextKind::InvalidSubcommand) {
            if SANDBOX_GROUPS.contains(&bad.as_str()) {
                hint = format!("Did you mean 'abx sandbox {bad}'? ");
            }
        }
        hint.push_str("See 'abx --help' for the command list (sandbox files, processes, system info and named commands: 'abx sandbox --help').");
    }
    let json_mode = flags_and_words().any(|a| a == "-j" || a == "--json");
    if json_mode {
        let rendered = e.render().to_string();
        let message = rendered
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("usage error")
            .trim_start_matches("error: ")
            .to_owned();
        output::print_json(&json!({
            "status": "error",
            "message": message,
            "code": ErrorCode::Usage.abx(),
            "suggestion": if hint.is_empty() { "Run 'abx --help' for the command list.".to_owned() } else { hint },
        }));
    } else {
        let _ = e.print();
        if !hint.is_empty() {
            eprintln!("\n{hint}");
        }
    }
    ExitCode::from(2)
}
