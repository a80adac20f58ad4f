//! The commands: one module per family, all broker clients, dispatched from [`run`].

mod broker;
mod code;
mod exec;
mod files;
mod network;
mod process;
mod provider;
mod sandbox;
mod secret;
mod shell;
mod template;
mod workspace;

use crate::args::{
    BrokerAction, BrokerArgs, Cli, CodeArgs, Command, CommandCmd, CompletionsArgs, Deferred,
    DownloadArgs, EventsArgs, ExecArgs, Lazy, PortsArgs, ProviderCmd, RunArgs, SandboxCmd,
    SetTimeoutArgs, ShellArgs, SystemCmd, TemplateCmd, UploadArgs,
};
use crate::output::{print_json, Failure};
use abx_client::client::Client;
use abx_home::Paths;
use serde_json::{json, Value};

/// What every command knows: where the daemon is and the global flags.
pub struct Ctx {
    /// Socket, data and log locations.
    pub paths: Paths,
    /// -j.
    pub json: bool,
    /// --provider / ABX_PROVIDER.
    pub provider: Option<String>,
    /// --yes.
    pub yes: bool,
}

impl Ctx {
    /// Connect to the daemon, starting it when none answers.
    pub async fn connect(&self) -> Result<Client, Failure> {
        Ok(Client::connect(&self.paths).await?)
    }

    /// [`Ctx::connect`] for commands that run something in a sandbox: the daemon is told
    /// who asked (`initialize`, not waited for), so `abx log` names `abx`.
    pub async fn connect_announced(&self) -> Result<Client, Failure> {
        let mut c = self.connect().await?;
        c.announce().await?;
        Ok(c)
    }
}

/// Call `method` and turn a failure into a [`Failure`] that remembers the method.
pub async fn call(c: &mut Client, method: &str, params: Value) -> Result<Value, Failure> {
    c.call(method, Some(&params))
        .await
        .map_err(|e| Failure::from(e).in_method(method))
}

/// Connect and make one call.
pub async fn call1(cx: &Ctx, method: &str, params: Value) -> Result<Value, Failure> {
    let mut c = cx.connect().await?;
    call(&mut c, method, params).await
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Run the parsed command line; `Ok(exit code)` or the failure to print.
pub fn run(cli: Cli, paths: Paths) -> Result<u8, Failure> {
    let cx = Ctx {
        paths,
        json: cli.json,
        provider: cli.provider.filter(|p| !p.is_empty()),
        yes: cli.yes,
    };
    match cli.command.0 {
        // Not async, or owning their own runtime.
        // The daemon is its own binary: hand this process over to it (same pid, so whoever
        // started `abx broker run` can signal and wait on the daemon).
        Command::Broker(Deferred(BrokerArgs { stdio: true, .. })) => {
            Err(broker::exec_daemon(&cx, &["--stdio"]))
        }
        Command::Broker(Deferred(BrokerArgs {
            action: Some(BrokerAction::Run { detached }),
            ..
        })) => Err(broker::exec_daemon(
            &cx,
            if detached {
                &["run", "--detached"]
            } else {
                &["run"]
            },
        )),
        Command::Completions(Deferred(CompletionsArgs { shell })) => completions(&cx, shell),
        command => runtime().block_on(dispatch(&cx, command)),
    }
}

async fn dispatch(cx: &Ctx, command: Command) -> Result<u8, Failure> {
    match command {
        Command::Broker(Deferred(BrokerArgs { action, .. })) => match action {
            None | Some(BrokerAction::Status) => broker::status(cx).await,
            Some(BrokerAction::Start) => broker::start(cx).await,
            Some(BrokerAction::Stop) => broker::stop(cx).await,
            Some(BrokerAction::Run { .. }) => unreachable!("handled in run"),
        },
        Command::Events(Deferred(EventsArgs { count })) => sandbox::events(cx, count).await,
        Command::Log(Deferred(a)) => workspace::log(cx, a).await,
        Command::Diff(Deferred(a)) => workspace::diff(cx, a).await,
        Command::Apply(Deferred(a)) => workspace::apply(cx, a).await,
        Command::Discard(Deferred(a)) => workspace::discard(cx, a).await,
        Command::Network(Deferred(a)) => network::network(cx, a).await,
        Command::Secret(Deferred(a)) => secret::secret(cx, a).await,
        Command::Rpc => {
            crate::rpc::run(&cx.paths).await?;
            Ok(0)
        }
        Command::Create(Deferred(a)) => sandbox::create(cx, a).await,
        Command::Info(Deferred(a)) => sandbox::info(cx, &a.sandbox).await,
        Command::List | Command::Sandbox(Lazy(SandboxCmd::List)) => sandbox::list(cx).await,
        Command::Kill(Deferred(a)) => sandbox::kill(cx, &a.sandbox).await,
        Command::Pause(Deferred(a)) => sandbox::pause_resume(cx, &a.sandbox, true).await,
        Command::Resume(Deferred(a)) => sandbox::pause_resume(cx, &a.sandbox, false).await,
        Command::SetTimeout(Deferred(SetTimeoutArgs { sandbox, seconds })) => {
            sandbox::set_timeout(cx, &sandbox, seconds).await
        }
        Command::Ports(Deferred(PortsArgs { sandbox, port })) => {
            sandbox::ports(cx, &sandbox, port).await
        }
        Command::Exec(Deferred(ExecArgs {
            sandbox,
            timeout,
            cwd,
            command,
        })) => exec::exec(cx, &sandbox, &command, timeout, cwd.as_deref()).await,
        Command::Code(Deferred(CodeArgs {
            sandbox,
            file,
            context,
            language,
            timeout,
            save_images,
        })) => {
            code::code(
                cx,
                &sandbox,
                file.as_deref(),
                context.as_deref(),
                language.as_deref(),
                save_images.as_deref(),
                timeout,
            )
            .await
        }
        Command::Run(Deferred(RunArgs {
            template,
            mount,
            opts,
            timeout,
            command,
        })) => {
            let mounts = workspace::mounts(&mount)?;
            exec::run(cx, template.as_deref(), mounts, &opts, timeout, &command).await
        }
        Command::Shell(Deferred(ShellArgs { sandbox, command })) => {
            shell::shell(cx, &sandbox, &command).await
        }
        Command::Upload(Deferred(UploadArgs {
            sandbox,
            local,
            remote,
        })) => files::upload(cx, &sandbox, &local, &remote).await,
        Command::Download(Deferred(DownloadArgs {
            sandbox,
            remote,
            local,
        })) => files::download(cx, &sandbox, &remote, &local).await,
        Command::Sandbox(Lazy(SandboxCmd::Files(Lazy(f)))) => files::files(cx, f).await,
        Command::Sandbox(Lazy(SandboxCmd::Process(Lazy(p)))) => process::process(cx, p).await,
        Command::Sandbox(Lazy(SandboxCmd::System(SystemCmd::Info(a)))) => {
            sandbox::system_info(cx, &a.sandbox).await
        }
        Command::Sandbox(Lazy(SandboxCmd::Capabilities(a))) => {
            sandbox::capabilities(cx, &a.sandbox).await
        }
        Command::Sandbox(Lazy(SandboxCmd::Command(Lazy(CommandCmd::Run {
            sandbox,
            name,
            args,
        })))) => sandbox::command_run(cx, &sandbox, &name, &args).await,
        Command::Template(Lazy(TemplateCmd::Build(a))) => template::build(cx, a).await,
        Command::Template(Lazy(TemplateCmd::Init(a))) => template::init(cx, a).await,
        Command::Template(Lazy(TemplateCmd::Pull { reference })) => {
            template::pull(cx, &reference).await
        }
        Command::Template(Lazy(t)) => {
            let (action, args) = t.action_and_args();
            provider::template(cx, action, &args).await
        }
        Command::Provider(Lazy(ProviderCmd::List)) => provider::list(cx).await,
        Command::Provider(Lazy(ProviderCmd::Info { id })) => provider::info(cx, &id).await,
        Command::Provider(Lazy(ProviderCmd::Install(a))) => provider::install(cx, &a).await,
        Command::Provider(Lazy(ProviderCmd::Uninstall { id })) => {
            provider::uninstall(cx, &id).await
        }
        Command::Provider(Lazy(ProviderCmd::Update { id, check, git_ref })) => {
            provider::update(cx, id.as_deref(), check, git_ref.as_deref()).await
        }
        Command::Provider(Lazy(ProviderCmd::Doctor { id })) => provider::doctor(cx, &id).await,
        Command::Provider(Lazy(ProviderCmd::Test {
            id,
            filter,
            concurrency,
        })) => provider::test(cx, &id, filter.as_deref(), concurrency).await,
        Command::Provider(Lazy(ProviderCmd::Configure { id, values, unset })) => {
            provider::configure(cx, &id, &values, &unset).await
        }
        Command::Provider(Lazy(ProviderCmd::Default { id })) => {
            provider::set_default(cx, &id).await
        }
        Command::Completions(_) => unreachable!("handled in run"),
    }
}

fn completions(cx: &Ctx, shell: clap_complete::Shell) -> Result<u8, Failure> {
    use clap::CommandFactory;
    crate::args::whole_tree();
    let mut cmd = Cli::command();
    let mut buf = Vec::new();
    clap_complete::generate(shell, &mut cmd, "abx", &mut buf);
    if cx.json {
        print_json(&json!({"shell": shell.to_string(), "script": String::from_utf8_lossy(&buf)}));
    } else {
        crate::output::out_bytes(&buf);
    }
    Ok(0)
}

/// A destructive command's confirmation (`abx kill`, `abx discard`): nothing to ask with
/// `--yes`; else a `[y/N]` prompt on a terminal; refused (E1009, exit 2) when the answer is no
/// or there is no terminal to ask on. `question` is asked as is; `aborted` says what was not
/// done; `doing` names the action for the refusal ("kill sandbox 'X'"); `again` is the
/// command to run with `--yes`.
pub(crate) fn confirm_or_refuse(
    cx: &Ctx,
    question: &str,
    aborted: &str,
    doing: &str,
    again: &str,
) -> Result<(), Failure> {
    if cx.yes {
        return Ok(());
    }
    let answer = if crate::term::stdin_is_tty() {
        crate::term::confirm(question)
    } else {
        None
    };
    match answer {
        Some(true) => Ok(()),
        Some(false) => Err(Failure::usage(
            format!("Aborted: {aborted}."),
            format!("Answer 'y' to go on, or run '{again}'."),
        )),
        None => Err(Failure::usage(
            format!("Refusing to {doing} without confirmation (no terminal to ask on)."),
            format!("Re-run with --yes: {again}"),
        )),
    }
}
