//! `abx`: the command-line client of the abx broker. A thin `main`: parse flags, run the
//! command, print its output or its error and exit with the documented code.

mod client;
mod output;
mod rpc;
mod spawn;
mod stream;

use abx_broker::Paths;
use abx_protocol::api::methods;
use clap::{Parser, Subcommand};
use client::Client;
use output::{print_fields, print_json, Failure};
use serde_json::{json, Value};
use std::process::ExitCode;
use std::time::Duration;

/// abx: drive code sandboxes through the abx broker.
#[derive(Parser, Debug)]
#[command(name = "abx", version, about, propagate_version = true)]
struct Cli {
    /// Print machine-readable JSON.
    #[arg(short = 'j', long = "json", global = true)]
    json: bool,
    /// Provider to use (default: ABX_PROVIDER, then the configured default).
    #[arg(long, global = true, env = "ABX_PROVIDER")]
    provider: Option<String>,
    /// More detail on errors.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    /// Answer yes to confirmations.
    #[arg(short = 'y', long, global = true)]
    yes: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Manage the broker daemon, or serve one client on stdio (--stdio).
    Broker(BrokerArgs),
    /// Bridge stdin/stdout to the daemon (either framing).
    Rpc,
    /// Run a command in a throwaway sandbox: create, stream, kill.
    Run {
        /// Template of the sandbox.
        #[arg(long)]
        template: Option<String>,
        /// Seconds before the command is killed.
        #[arg(long)]
        timeout: Option<f64>,
        /// The command (one shell string, or words).
        #[arg(
            trailing_var_arg = true,
            allow_hyphen_values = true,
            required = true,
            value_name = "CMD"
        )]
        command: Vec<String>,
    },
    /// Run a command in a sandbox; abx exits with its exit code.
    Exec {
        /// Sandbox id (`id` or `provider:id`).
        sandbox: String,
        /// Seconds before the command is killed.
        #[arg(long)]
        timeout: Option<f64>,
        /// The command (one shell string, or words).
        #[arg(
            trailing_var_arg = true,
            allow_hyphen_values = true,
            required = true,
            value_name = "CMD"
        )]
        command: Vec<String>,
    },
}

#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
struct BrokerArgs {
    /// Serve one client on stdin/stdout instead of the daemon socket.
    #[arg(long)]
    stdio: bool,
    #[command(subcommand)]
    action: Option<BrokerAction>,
}

#[derive(Subcommand, Debug)]
enum BrokerAction {
    /// Start the daemon in the background (no-op when running).
    Start,
    /// Stop the daemon.
    Stop,
    /// Show the daemon's status.
    Status,
    /// Run the daemon in the foreground.
    Run {
        /// Started by a client: log to the log file only.
        #[arg(long, hide = true)]
        detached: bool,
    },
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(match e.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => 0,
                _ => 2,
            });
        }
    };
    let paths = Paths::from_env();
    let json_mode = cli.json;
    match run(cli, paths) {
        Ok(code) => ExitCode::from(code),
        Err(f) => {
            f.print(json_mode);
            ExitCode::from(f.exit as u8)
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn run(cli: Cli, paths: Paths) -> Result<u8, Failure> {
    match cli.command {
        Command::Broker(BrokerArgs { stdio: true, .. }) => {
            abx_broker::stdio::run(paths)
                .map_err(|e| Failure::from(abx_protocol::AbxError::internal(e)))?;
            Ok(0)
        }
        Command::Broker(BrokerArgs { action, .. }) => match action {
            None | Some(BrokerAction::Status) => {
                runtime().block_on(broker_status(&paths, cli.json))
            }
            Some(BrokerAction::Start) => runtime().block_on(broker_start(&paths, cli.json)),
            Some(BrokerAction::Stop) => runtime().block_on(broker_stop(&paths, cli.json)),
            Some(BrokerAction::Run { detached }) => {
                abx_broker::daemon::run(paths, !detached)?;
                Ok(0)
            }
        },
        Command::Rpc => {
            runtime().block_on(rpc::run(&paths))?;
            Ok(0)
        }
        Command::Run {
            template,
            timeout,
            command,
        } => runtime().block_on(run_throwaway(
            &paths,
            cli.provider.as_deref(),
            template.as_deref(),
            timeout,
            &command,
        )),
        Command::Exec {
            sandbox,
            timeout,
            command,
        } => runtime().block_on(async {
            let mut c = Client::connect(&paths).await?;
            stream::exec(&mut c, &sandbox, &stream::shell_join(&command), timeout).await
        }),
    }
}

fn fmt_uptime(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

async fn broker_status(paths: &Paths, json_mode: bool) -> Result<u8, Failure> {
    let mut c = Client::connect_existing(paths).await?;
    let st = c.call(methods::STATUS, None::<&Value>).await?;
    if json_mode {
        print_json(&st);
        return Ok(0);
    }
    let s = |k: &str| {
        st.get(k).map_or_else(String::new, |v| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
    };
    print_fields(&[
        ("Status", "running".into()),
        ("Version", s("version")),
        ("PID", s("pid")),
        ("Uptime", fmt_uptime(st["uptimeMs"].as_u64().unwrap_or(0))),
        ("Connections", s("connections")),
        ("Sandboxes", s("sandboxes")),
        ("Socket", s("socket")),
        ("Log", s("logFile")),
    ]);
    Ok(0)
}

async fn broker_start(paths: &Paths, json_mode: bool) -> Result<u8, Failure> {
    let started = spawn::start_daemon(paths).await?;
    let mut c = Client::connect(paths).await?;
    let st = c.call(methods::STATUS, None::<&Value>).await?;
    let pid = st["pid"].as_u64().unwrap_or(0);
    if json_mode {
        print_json(
            &json!({"status": "running", "started": started.is_some(), "pid": pid, "version": st["version"]}),
        );
    } else if started.is_some() {
        println!("abx broker started (pid {pid}).");
    } else {
        println!("abx broker is already running (pid {pid}).");
    }
    Ok(0)
}

async fn broker_stop(paths: &Paths, json_mode: bool) -> Result<u8, Failure> {
    let Ok(mut c) = Client::connect_existing(paths).await else {
        if json_mode {
            print_json(&json!({"status": "stopped", "wasRunning": false}));
        } else {
            println!("abx broker is not running.");
        }
        return Ok(0);
    };
    let st = c.call(methods::STATUS, None::<&Value>).await?;
    c.call(methods::BROKER_SHUTDOWN, None::<&Value>).await?;
    drop(c);
    spawn::wait_stopped(paths, Duration::from_secs(10)).await?;
    let pid = st["pid"].as_u64().unwrap_or(0);
    if json_mode {
        print_json(&json!({"status": "stopped", "wasRunning": true, "pid": pid}));
    } else {
        println!("abx broker stopped (pid {pid}).");
    }
    Ok(0)
}

async fn run_throwaway(
    paths: &Paths,
    provider: Option<&str>,
    template: Option<&str>,
    timeout: Option<f64>,
    command: &[String],
) -> Result<u8, Failure> {
    let mut c = Client::connect(paths).await?;
    let mut params = json!({});
    if let Some(p) = provider {
        params["provider"] = json!(p);
    }
    if let Some(t) = template {
        params["template"] = json!(t);
    }
    let sb = c.call("sandbox/create", Some(&params)).await?;
    let id = sb["id"].as_str().unwrap_or_default().to_owned();
    let prov = sb["provider"].as_str().unwrap_or_default().to_owned();
    let full = if prov.is_empty() {
        id.clone()
    } else {
        format!("{prov}:{id}")
    };
    let cmd = stream::shell_join(command);
    let result = tokio::select! {
        r = stream::exec(&mut c, &full, &cmd, timeout) => r,
        _ = tokio::signal::ctrl_c() => Ok(130),
    };
    // Always clean up, on success, failure or Ctrl-C.
    let mut k = Client::connect(paths).await?;
    let _ = k
        .call("sandbox/kill", Some(&json!({"sandbox": full})))
        .await;
    result
}
