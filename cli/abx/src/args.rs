//! The command line: every command, its arguments and the global flags (clap derive).

use clap::{Args, Parser, Subcommand};

/// abx: drive code sandboxes through the abx broker.
#[derive(Parser, Debug)]
#[command(
    name = "abx",
    version,
    about,
    propagate_version = true,
    after_help = "Sandbox ids are 'id' or 'provider:id'. Exit codes: 0 ok, 1 error, 2 usage or refused, 4 not found.\nSee docs/cli.md for every command and its JSON form."
)]
pub struct Cli {
    /// Print machine-readable JSON (errors too, on stdout).
    #[arg(short = 'j', long = "json", global = true)]
    pub json: bool,
    /// Provider to use where no sandbox id decides (default: ABX_PROVIDER, then the
    /// configured default).
    #[arg(
        long,
        global = true,
        env = "ABX_PROVIDER",
        value_name = "ID",
        hide_env_values = true
    )]
    pub provider: Option<String>,
    /// The broker's machine: ssh://[user@]host[:port] reaches the broker there through
    /// `ssh host abx rpc` (your own ssh, keys and config); empty: this machine.
    #[arg(
        long,
        global = true,
        env = "ABX_HOST",
        value_name = "ssh://[USER@]HOST[:PORT]",
        hide_env_values = true
    )]
    pub host: Option<String>,
    /// More detail on errors.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Answer yes to confirmations (kill, discard).
    #[arg(short = 'y', long, global = true)]
    pub yes: bool,
    #[command(subcommand)]
    pub command: Only<Command>,
}

/// The wrappers below parse as what they wrap.
macro_rules! parses_as_inner {
    ($($w:ident),*) => {$(
        impl<T: clap::FromArgMatches> clap::FromArgMatches for $w<T> {
            fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
                T::from_arg_matches(m).map($w)
            }
            fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
                self.0.update_from_arg_matches(m)
            }
        }
    )*};
}
parses_as_inner!(Lazy, Deferred, Only);

/// A group of subcommands built only when the parser enters it (`Command::defer`): a
/// short command builds only the tree it uses, not every group's arguments (clap's tree
/// was most of `abx`'s start-up heap, issue 20). [`whole_tree`] builds them all, for the
/// completion scripts and `abx help ...`, whose copies of the tree are taken before any
/// deferred group is built.
#[derive(Debug)]
pub struct Lazy<T>(pub T);

thread_local! {
    // Per thread, so the tests can build both trees side by side.
    static EAGER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    static ONLY: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// How much of the tree to build for a command line (its words after the program's name):
/// every group at once for `abx help ...` and the completion scripts ([`set_eager`]);
/// otherwise, when the first word names a top-level command, that command alone ([`Only`]).
pub fn plan<I: IntoIterator<Item = std::ffi::OsString>>(words: I) {
    let words: Vec<std::ffi::OsString> = words.into_iter().take_while(|a| a != "--").collect();
    let eager = words.iter().any(|a| a == "help" || a == "completions");
    set_eager(eager);
    let first = words.first().and_then(|w| w.to_str());
    let only = first.filter(|w| !eager && !w.starts_with('-'));
    ONLY.with(|o| *o.borrow_mut() = only.map(str::to_owned));
}

/// The top-level commands, of which a command line that starts with one's name builds only
/// that one ([`plan`]). clap copies the global flags into every subcommand of the root
/// when it builds the root (five `Arg`s each, most of the heap of a short command's start,
/// issue 20), so the other twenty are left out rather than deferred. Every other command
/// line, and `abx help ...`, builds them all: a typo still gets its suggestion.
#[derive(Debug)]
pub struct Only<T>(pub T);

impl<T: Subcommand> Subcommand for Only<T> {
    fn augment_subcommands(cmd: clap::Command) -> clap::Command {
        let only = ONLY.with(|o| o.borrow().clone());
        if let Some(name) = only.filter(|_| !eager()) {
            let all = T::augment_subcommands(clap::Command::new(""));
            let one = all
                .get_subcommands()
                .find(|s| s.get_name() == name)
                .cloned();
            // The rest is left to the exit with the tree (see main).
            std::mem::forget(all);
            if let Some(one) = one {
                return cmd.subcommand(one);
            }
        }
        T::augment_subcommands(cmd)
    }
    fn augment_subcommands_for_update(cmd: clap::Command) -> clap::Command {
        T::augment_subcommands_for_update(cmd)
    }
    fn has_subcommand(name: &str) -> bool {
        T::has_subcommand(name)
    }
}

/// Build the whole tree, every group at once, from now on on this thread (see [`Lazy`],
/// [`Only`]).
pub fn whole_tree() {
    plan(["help".into()]);
}

fn set_eager(on: bool) {
    EAGER.with(|e| e.set(on));
}

fn eager() -> bool {
    EAGER.with(|e| e.get())
}

impl<T: Subcommand> Subcommand for Lazy<T> {
    fn augment_subcommands(cmd: clap::Command) -> clap::Command {
        if eager() {
            T::augment_subcommands(cmd)
        } else {
            cmd.defer(T::augment_subcommands)
        }
    }
    fn augment_subcommands_for_update(cmd: clap::Command) -> clap::Command {
        if eager() {
            T::augment_subcommands_for_update(cmd)
        } else {
            cmd.defer(T::augment_subcommands_for_update)
        }
    }
    fn has_subcommand(name: &str) -> bool {
        T::has_subcommand(name)
    }
}

/// A subcommand's arguments built only when the parser enters that subcommand
/// (`Command::defer`), the way [`Lazy`] does for a group: `abx list` builds the names and
/// abouts of the other top-level commands, not their arguments. The argument structs carry
/// no doc comment (a plain comment instead), because a deferred build would set it as the
/// subcommand's about over the variant's own.
#[derive(Debug)]
pub struct Deferred<T>(pub T);

impl<T: Args> Args for Deferred<T> {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        if eager() {
            T::augment_args(cmd)
        } else {
            cmd.defer(T::augment_args)
        }
    }
    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        if eager() {
            T::augment_args_for_update(cmd)
        } else {
            cmd.defer(T::augment_args_for_update)
        }
    }
    fn group_id() -> Option<clap::Id> {
        T::group_id()
    }
}

// A sandbox id argument. Not a doc comment: see [`Deferred`].
#[derive(Args, Debug, Clone)]
pub struct SandboxArg {
    /// Sandbox id (`id` or `provider:id`).
    #[arg(value_name = "SANDBOX")]
    pub sandbox: String,
}

/// The top-level commands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create a sandbox and print its details.
    Create(Deferred<CreateArgs>),
    /// Show a sandbox.
    Info(Deferred<SandboxArg>),
    /// List sandboxes.
    List,
    /// Run a command in a sandbox; abx exits with its exit code.
    Exec(Deferred<ExecArgs>),
    /// Run code in a sandbox's interpreter (a context keeps variables between runs):
    /// output streamed, results printed, exit 1 when the code raised an error.
    Code(Deferred<CodeArgs>),
    /// Run a command in a throwaway sandbox: create, stream, kill.
    Run(Deferred<RunArgs>),
    /// An interactive shell (or CMD) in a sandbox on a pseudo-terminal.
    Shell(Deferred<ShellArgs>),
    /// Copy a local file into a sandbox.
    Upload(Deferred<UploadArgs>),
    /// Copy a file out of a sandbox.
    Download(Deferred<DownloadArgs>),
    /// Kill a sandbox (asks first on a terminal; --yes to skip). Idempotent.
    Kill(Deferred<SandboxArg>),
    /// Pause every process of a sandbox.
    Pause(Deferred<SandboxArg>),
    /// Resume a paused sandbox.
    Resume(Deferred<SandboxArg>),
    /// Set the remaining lifetime of a sandbox (from now).
    SetTimeout(Deferred<SetTimeoutArgs>),
    /// Print the URL of a port of a sandbox.
    Ports(Deferred<PortsArgs>),
    /// Sandbox files, processes, system info, capabilities and named commands.
    #[command(subcommand)]
    Sandbox(Lazy<SandboxCmd>),
    /// Templates of the provider (list, pull, build, rm, import, init): only where the
    /// provider declares templates.
    #[command(subcommand)]
    Template(Lazy<TemplateCmd>),
    /// Providers: install, list, info, doctor, test, update, uninstall, configure, default.
    #[command(subcommand)]
    Provider(Lazy<ProviderCmd>),
    /// Print a shell completion script (bash, zsh, fish, ...).
    Completions(Deferred<CompletionsArgs>),
    /// Manage the broker daemon, or serve one client on stdio (--stdio).
    Broker(Deferred<BrokerArgs>),
    /// Bridge stdin/stdout to the daemon (either framing).
    Rpc,
    /// Print sandbox changes of every provider as they happen (created, killed, paused,
    /// resumed, expired, timeout), one line each, until interrupted; -j: one JSON object
    /// per line.
    Events(Deferred<EventsArgs>),
    /// Every command run in a sandbox (exec, pty, code cell), with the client that asked.
    Log(Deferred<LogArgs>),
    /// What a sandbox changed under its overlay mounts, against the host.
    Diff(Deferred<DiffArgs>),
    /// Write a sandbox's changes (all, or PATHS) to the host; conflicts exit 1.
    Apply(Deferred<ApplyArgs>),
    /// Drop a sandbox's changes (all, or PATHS): it sees the host's files again.
    Discard(Deferred<DiscardArgs>),
    /// A sandbox's network policy, live: `show`, `allow HOST...`, `deny HOST...`.
    Network(Deferred<NetworkArgs>),
    /// The broker's secrets for egress headers: `set KEY` (the value from stdin, or asked
    /// for without echo), `list` (keys only), `rm KEY`.
    Secret(Deferred<SecretArgs>),
}

// `abx secret`. Not a doc comment: see [`Deferred`].
#[derive(Args, Debug)]
pub struct SecretArgs {
    /// set KEY (the value is read from stdin, or asked for on the terminal without echo;
    /// never from the command line), list (the keys, never the values), rm KEY.
    #[arg(value_parser = ["set", "list", "rm"])]
    pub action: String,
    /// The key a policy names as "secret:KEY" (letters, digits, '_', '-', '.').
    #[arg(value_name = "KEY")]
    pub key: Option<String>,
}

// `abx network`. Not a doc comment: see [`Deferred`].
#[derive(Args, Debug)]
pub struct NetworkArgs {
    /// Sandbox id (`id` or `provider:id`).
    pub sandbox: String,
    /// show (the policy and the blocked hosts), allow HOST... (added to the allow-list),
    /// deny HOST... (added to the deny-list).
    #[arg(value_parser = ["show", "allow", "deny"])]
    pub action: String,
    /// Host patterns (example.com, *.example.com, HOST:PORT, an IP or CIDR, @SET).
    #[arg(value_name = "HOST")]
    pub hosts: Vec<String>,
}

// `abx log`. Not a doc comment: see [`Deferred`].
#[derive(Args, Debug)]
pub struct LogArgs {
    /// Sandbox id (`id` or `provider:id`).
    pub sandbox: String,
    /// Only entries after this sequence number.
    #[arg(long, value_name = "SEQ")]
    pub since: Option<u64>,
    /// At most this many entries (default and max 1000), the oldest first.
    #[arg(long, value_name = "N")]
    pub limit: Option<u64>,
}

// `abx diff`. Not a doc comment: see [`Deferred`].
#[derive(Args, Debug)]
pub struct DiffArgs {
    /// Sandbox id (`id` or `provider:id`).
    pub sandbox: String,
    /// A table of the changes with their sizes, and a summary.
    #[arg(long, conflicts_with = "patch")]
    pub stat: bool,
    /// Unified diffs of the text files.
    #[arg(long)]
    pub patch: bool,
    /// Only these paths in the sandbox (relative: under /workspace; a directory selects
    /// what is beneath it).
    #[arg(value_name = "PATHS")]
    pub paths: Vec<String>,
}

// `abx apply`. Not a doc comment: see [`Deferred`].
#[derive(Args, Debug)]
pub struct ApplyArgs {
    /// Sandbox id (`id` or `provider:id`).
    pub sandbox: String,
    /// Only these paths in the sandbox (relative: under /workspace).
    #[arg(value_name = "PATHS")]
    pub paths: Vec<String>,
    /// Say what would be applied, change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Apply paths the host changed since create too (the sandbox's version wins).
    #[arg(long)]
    pub force: bool,
}

// `abx discard`. Not a doc comment: see [`Deferred`].
#[derive(Args, Debug)]
pub struct DiscardArgs {
    /// Sandbox id (`id` or `provider:id`).
    pub sandbox: String,
    /// Only these paths in the sandbox (relative: under /workspace).
    #[arg(value_name = "PATHS")]
    pub paths: Vec<String>,
}

// `abx exec`. Not a doc comment: see [`Deferred`].
#[derive(Args, Debug)]
pub struct ExecArgs {
    /// Sandbox id (`id` or `provider:id`).
    pub sandbox: String,
    /// Seconds before the command is killed.
    #[arg(long, value_parser = parse_seconds_f64)]
    pub timeout: Option<f64>,
    /// Working directory in the sandbox.
    #[arg(long)]
    pub cwd: Option<String>,
    /// The command (one shell string, or words).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        required = true,
        value_name = "CMD"
    )]
    pub command: Vec<String>,
}

// `abx code`. Not a doc comment: see [`Deferred`].
#[derive(Args, Debug)]
pub struct CodeArgs {
    /// Sandbox id (`id` or `provider:id`).
    pub sandbox: String,
    /// A file with the code, or `-` (the default) for stdin.
    #[arg(value_name = "FILE")]
    pub file: Option<String>,
    /// The context to run in (default: the sandbox's default context of the language).
    #[arg(long, value_name = "ID")]
    pub context: Option<String>,
    /// python (default; or from the file's extension: .py, .js, .sh), javascript, bash.
    #[arg(long, short = 'l', value_name = "LANG")]
    pub language: Option<String>,
    /// Seconds before the code is interrupted (the context keeps its state).
    #[arg(long, value_parser = parse_seconds_f64)]
    pub timeout: Option<f64>,
    /// Write each image result (a matplotlib figure, ...) to DIR as N.png / N.jpg / N.svg
    /// (the first N not taken; DIR is created) and print its path.
    #[arg(long, value_name = "DIR")]
    pub save_images: Option<std::path::PathBuf>,
}

// `abx run`. Not a doc comment: see [`Deferred`].
#[derive(Args, Debug)]
pub struct RunArgs {
    /// Template of the sandbox.
    #[arg(long)]
    pub template: Option<String>,
    /// A host directory in the sandbox: SRC[:TARGET][:ro|rw|overlay] (repeatable; TARGET
    /// default /workspace, mode default overlay; `.` is the current directory).
    #[arg(long = "mount", value_name = "SRC[:TARGET][:MODE]")]
    pub mount: Vec<String>,
    /// Network and limits of the sandbox.
    #[command(flatten)]
    pub opts: SandboxOpts,
    /// Seconds before the command is killed.
    #[arg(long, value_parser = parse_seconds_f64)]
    pub timeout: Option<f64>,
    /// The command (one shell string, or words).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        required = true,
        value_name = "CMD"
    )]
    pub command: Vec<String>,
}

// `abx shell`. Not a doc comment: see [`Deferred`].
#[derive(Args, Debug)]
pub struct ShellArgs {
    /// Sandbox id (`id` or `provider:id`).
    pub sandbox: String,
    /// What to run instead of the sandbox's shell.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

// `abx upload`. Not a doc comment: see [`Deferred`].
#[derive(Args, Debug)]
pub struct UploadArgs {
    /// Sandbox id (`id` or `provider:id`).
    pub sandbox: String,
    /// Local file.
    pub local: std::path::PathBuf,
    /// Path in the sandbox (relative: under /workspace).
    pub remote: String,
}

// `abx download`. Not a doc comment: see [`Deferred`].
#[derive(Args, Debug)]
pub struct DownloadArgs {
    /// Sandbox id (`id` or `provider:id`).
    pub sandbox: String,
    /// Path in the sandbox.
    pub remote: String,
    /// Local file, or an existing directory to put it in.
    pub local: std::path::PathBuf,
}

// `abx set-timeout`. Not a doc comment: see [`Deferred`].
#[derive(Args, Debug)]
pub struct SetTimeoutArgs {
    /// Sandbox id (`id` or `provider:id`).
    pub sandbox: String,
    /// Seconds (or 90s, 10m, 2h, 1d).
    #[arg(value_parser = parse_seconds)]
    pub seconds: u64,
}

// `abx ports`. Not a doc comment: see [`Deferred`].
#[derive(Args, Debug)]
pub struct PortsArgs {
    /// Sandbox id (`id` or `provider:id`).
    pub sandbox: String,
    /// Port number.
    pub port: u16,
}

// `abx template ...`: each action with its own arguments and help. Not a doc comment: see
// [`Lazy`].
#[derive(Subcommand, Debug)]
pub enum TemplateCmd {
    /// List the provider's templates: one row per name (NAME, DIGEST, SIZE, PULLED).
    List,
    /// Pull an image from a registry and keep it as a template (local: an OCI reference,
    /// e.g. busybox:latest or registry.example/team/app@sha256:...).
    Pull {
        /// The image reference.
        #[arg(value_name = "REF")]
        reference: String,
    },
    /// Build a template from a Dockerfile (DIR -t NAME), or save a sandbox's filesystem as
    /// a new template (SANDBOX NAME).
    #[command(
        override_usage = "abx template build <DIR> -t <NAME> [-f <DOCKERFILE>] [--build-arg <K=V>]... [--target <STAGE>] [--network <MODE>] [--no-cache]\n       abx template build <SANDBOX> <NAME>",
        after_help = "A first argument that is an existing directory, or -t, makes a Dockerfile build: DIR is the build context\n(sent to the broker as an absolute path), the steps print as docker build prints them ([2/4] RUN make, its\noutput, CACHED for a cache hit) and Ctrl-C stops the build. Otherwise the sandbox SANDBOX is saved as NAME.\n\nExamples:\n  abx template init python ./py && abx template build ./py -t my-python\n  abx template build . -t app:1 -f docker/Dockerfile --build-arg VERSION=2 --network internet\n  abx template build sb-49ea9f3f my-saved"
    )]
    Build(TemplateBuildArgs),
    /// Remove a template by name or digest, or with --prune the images no name or sandbox
    /// uses.
    #[command(
        override_usage = "abx template rm NAME|DIGEST\n       abx template rm --prune [--all]"
    )]
    Rm {
        /// The template's name or digest.
        #[arg(required_unless_present = "prune", conflicts_with = "prune")]
        name: Option<String>,
        /// Remove the images that no name points at and no sandbox uses.
        #[arg(long)]
        prune: bool,
        /// With --prune: the named ones too (those no sandbox uses).
        #[arg(long, requires = "prune")]
        all: bool,
    },
    /// Import an image from this machine: a `docker save` archive (a tar, possibly gzip or
    /// zstd) or an OCI layout (a directory, or a tar of one). The broker reads PATH (made
    /// absolute here) as untrusted input.
    #[command(
        after_help = "Examples:\n  docker save busybox:latest -o bb.tar && abx template import bb.tar my/bb:1\n  abx create --template my/bb:1"
    )]
    Import {
        /// The archive or OCI layout.
        path: String,
        /// The template's name (default: the archive's own tag).
        name: Option<String>,
    },
    /// Write a template scaffold for a language (a Dockerfile and a README) into DIR, for
    /// `abx template build DIR -t NAME`.
    #[command(
        override_usage = "abx template init <LANGUAGE> [DIR] [--force]",
        after_help = "Languages (local): python, node, go, rust, java, shell. DIR defaults to ./LANGUAGE and is made absolute\nhere (the broker writes it). The Dockerfile's FROM is an image of the broker's store when one fits,\nelse the language's usual image, with the command that gets it (abx template pull IMAGE).\nExisting files are never overwritten without --force.\n\nExamples:\n  abx template init python\n  abx template init node ./web && abx template build ./web -t web"
    )]
    Init(TemplateInitArgs),
}

// `abx template build`. Not a doc comment: see [`Lazy`].
#[derive(Args, Debug, Default)]
pub struct TemplateBuildArgs {
    /// The build context (a directory with a Dockerfile), or a sandbox id to save.
    #[arg(value_name = "DIR|SANDBOX")]
    pub source: String,
    /// The template's name (SANDBOX form; with DIR, the same as -t).
    #[arg(value_name = "NAME")]
    pub name: Option<String>,
    /// The new template's name (a Dockerfile build).
    #[arg(short = 't', long = "tag", value_name = "NAME")]
    pub tag: Option<String>,
    /// The Dockerfile (default DIR/Dockerfile; a path from here, or from DIR).
    #[arg(short = 'f', long = "file", value_name = "DOCKERFILE")]
    pub file: Option<String>,
    /// Set a build argument (an ARG of the Dockerfile; repeatable).
    #[arg(long = "build-arg", value_name = "K=V", value_parser = parse_kv)]
    pub build_args: Vec<(String, String)>,
    /// The stage to build (default: the last).
    #[arg(long, value_name = "STAGE")]
    pub target: Option<String>,
    /// The network of the RUN steps: none (default), internet, host, or allow:HOST,...
    #[arg(long, value_name = "none|internet|host|allow:HOST,...", value_parser = parse_network)]
    pub network: Option<String>,
    /// Run every step again (no cache hits).
    #[arg(long)]
    pub no_cache: bool,
}

impl TemplateBuildArgs {
    /// Whether this is a Dockerfile build (not a sandbox saved): -t or any build flag, or a
    /// first argument that is an existing directory.
    pub fn is_dockerfile_build(&self) -> bool {
        self.tag.is_some()
            || self.file.is_some()
            || !self.build_args.is_empty()
            || self.target.is_some()
            || self.network.is_some()
            || self.no_cache
            || std::path::Path::new(&self.source).is_dir()
    }
}

// `abx template init`. Not a doc comment: see [`Lazy`].
#[derive(Args, Debug, Default)]
pub struct TemplateInitArgs {
    /// The language: python, node, go, rust, java, shell (the provider may have others).
    #[arg(value_name = "LANGUAGE", required_unless_present = "template")]
    pub language: Option<String>,
    /// Where to write the scaffold (default ./LANGUAGE).
    #[arg(value_name = "DIR")]
    pub dir: Option<String>,
    /// The language, as the reference tool's --template takes it.
    #[arg(
        long = "template",
        alias = "language",
        value_name = "LANGUAGE",
        conflicts_with = "language"
    )]
    pub template: Option<String>,
    /// Overwrite the scaffold's files where they exist.
    #[arg(long)]
    pub force: bool,
}

impl TemplateCmd {
    /// The action's name and the words after it, as the broker's `templates/*` take them
    /// (`args` goes along for providers of their own).
    pub fn action_and_args(&self) -> (&'static str, Vec<String>) {
        match self {
            TemplateCmd::List => ("list", vec![]),
            TemplateCmd::Pull { reference } => ("pull", vec![reference.clone()]),
            TemplateCmd::Build(b) => (
                "build",
                std::iter::once(&b.source).chain(&b.name).cloned().collect(),
            ),
            TemplateCmd::Rm { name, prune, all } => {
                let mut a: Vec<String> = name.iter().cloned().collect();
                if *prune {
                    a.push("--prune".into());
                }
                if *all {
                    a.push("--all".into());
                }
                ("rm", a)
            }
            TemplateCmd::Import { path, name } => (
                "import",
                std::iter::once(path).chain(name).cloned().collect(),
            ),
            TemplateCmd::Init(i) => (
                "init",
                i.language
                    .iter()
                    .chain(&i.template)
                    .chain(&i.dir)
                    .cloned()
                    .collect(),
            ),
        }
    }
}

// `abx completions`. Not a doc comment: see [`Deferred`].
#[derive(Args, Debug)]
pub struct CompletionsArgs {
    /// The shell.
    pub shell: clap_complete::Shell,
}

// `abx events`. Not a doc comment: see [`Deferred`].
#[derive(Args, Debug)]
pub struct EventsArgs {
    /// Exit after this many changes.
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
}

// `abx create`. Not a doc comment: see [`Deferred`].
#[derive(Args, Debug)]
pub struct CreateArgs {
    /// Template (the provider's; `local` has `base`).
    #[arg(long)]
    pub template: Option<String>,
    /// Lifetime in seconds (or 90s, 10m, 2h, 1d; default 300).
    #[arg(long, value_parser = parse_seconds)]
    pub timeout: Option<u64>,
    /// Environment of every command in the sandbox (repeatable).
    #[arg(long = "env", short = 'e', value_name = "KEY=VALUE", value_parser = parse_kv)]
    pub env: Vec<(String, String)>,
    /// Metadata to attach (repeatable).
    #[arg(long = "metadata", short = 'm', value_name = "KEY=VALUE", value_parser = parse_kv)]
    pub metadata: Vec<(String, String)>,
    /// A host directory in the sandbox: SRC[:TARGET][:ro|rw|overlay] (repeatable; TARGET
    /// default /workspace, mode default overlay; `.` is the current directory).
    #[arg(long = "mount", value_name = "SRC[:TARGET][:MODE]")]
    pub mount: Vec<String>,
    /// Network and limits.
    #[command(flatten)]
    pub opts: SandboxOpts,
}

// Network and limits of a new sandbox (`local`; docs/local-sandboxes.md). Not a doc
// comment: see [`Deferred`] (flattened into `create` and `run`).
#[derive(clap::Args, Debug, Default, Clone)]
pub struct SandboxOpts {
    /// Network: none (loopback only), internet (outbound, no host loopback), host, or
    /// allow:HOST,HOST,... (only those hosts, through a filtering proxy).
    #[arg(long, value_name = "none|internet|host|allow:HOST,...", value_parser = parse_network)]
    pub network: Option<String>,
    /// Allow HOST (repeatable; a pattern: example.com, *.example.com, HOST:PORT, an IP or
    /// CIDR, @SET): a network policy of the hosts allowed, nothing else.
    #[arg(long = "allow", value_name = "HOST")]
    pub allow: Vec<String>,
    /// Memory limit (bytes, or 512M, 2G).
    #[arg(long, value_name = "SIZE")]
    pub memory: Option<String>,
    /// CPU limit in cores (0.5, 2).
    #[arg(long, value_name = "CORES")]
    pub cpus: Option<f64>,
    /// Limit on processes and threads.
    #[arg(long, value_name = "N")]
    pub pids: Option<u64>,
}

impl SandboxOpts {
    /// Put the options into `sandbox/create` params.
    pub fn apply(&self, params: &mut abx_protocol::api::SandboxCreateParams) {
        use serde_json::json;
        let mut allow: Vec<String> = Vec::new();
        match self.network.as_deref() {
            Some(n) if n.starts_with("allow:") => allow.extend(
                n["allow:".len()..]
                    .split(',')
                    .filter(|h| !h.trim().is_empty())
                    .map(|h| h.trim().to_owned()),
            ),
            Some(n) => params.network = Some(serde_json::Value::String(n.to_owned())),
            None => {}
        }
        allow.extend(self.allow.iter().cloned());
        if !allow.is_empty()
            || self
                .network
                .as_deref()
                .is_some_and(|n| n.starts_with("allow:"))
        {
            params.network = Some(json!({ "allow": allow }));
        }
        let limits = abx_protocol::api::SandboxLimits {
            memory: self
                .memory
                .as_ref()
                .map(|m| m.parse::<u64>().map_or_else(|_| json!(m), |n| json!(n))),
            cpus: self.cpus,
            pids: self.pids,
        };
        if limits.memory.is_some() || limits.cpus.is_some() || limits.pids.is_some() {
            params.limits = Some(abx_protocol::api::to_params(&limits));
        }
    }
}

// `abx sandbox ...`. Not a doc comment: see [`Lazy`].
#[derive(Subcommand, Debug)]
pub enum SandboxCmd {
    /// List sandboxes (same as `abx list`).
    List,
    /// Files in a sandbox.
    #[command(subcommand)]
    Files(Lazy<FilesCmd>),
    /// Processes in a sandbox.
    #[command(subcommand)]
    Process(Lazy<ProcessCmd>),
    /// System information.
    #[command(subcommand)]
    System(SystemCmd),
    /// What a sandbox can do (derived from its provider's features).
    Capabilities(SandboxArg),
    /// Named commands of a sandbox's template.
    #[command(subcommand)]
    Command(Lazy<CommandCmd>),
}

// `abx sandbox files ...`. Not a doc comment: see [`Lazy`].
#[derive(Subcommand, Debug)]
pub enum FilesCmd {
    /// List a directory.
    List {
        /// Sandbox id (`id` or `provider:id`).
        sandbox: String,
        /// Directory (default: the sandbox's working directory, /workspace on `local`).
        #[arg(long)]
        path: Option<String>,
        /// Walk subdirectories too.
        #[arg(long, short = 'r')]
        recursive: bool,
    },
    /// Print a file's bytes to stdout.
    Read {
        /// Sandbox id (`id` or `provider:id`).
        sandbox: String,
        /// Path in the sandbox.
        path: String,
    },
    /// Write a file from a local file (--from) or from stdin.
    Write {
        /// Sandbox id (`id` or `provider:id`).
        sandbox: String,
        /// Path in the sandbox.
        path: String,
        /// Local file to write (default: stdin).
        #[arg(long, short = 'f', value_name = "LOCAL")]
        from: Option<std::path::PathBuf>,
    },
    /// Remove a file or directory.
    Rm {
        /// Sandbox id (`id` or `provider:id`).
        sandbox: String,
        /// Path in the sandbox.
        path: String,
        /// Remove a directory with its contents.
        #[arg(long, short = 'r')]
        recursive: bool,
    },
    /// Create a directory.
    Mkdir {
        /// Sandbox id (`id` or `provider:id`).
        sandbox: String,
        /// Path in the sandbox.
        path: String,
        /// Create missing parents too, and accept an existing directory.
        #[arg(long, short = 'p')]
        parents: bool,
    },
}

// `abx sandbox process ...`. Not a doc comment: see [`Lazy`].
#[derive(Subcommand, Debug)]
pub enum ProcessCmd {
    /// List the processes of a sandbox.
    List(SandboxArg),
    /// Signal a process of a sandbox.
    Kill {
        /// Sandbox id (`id` or `provider:id`).
        sandbox: String,
        /// Process id.
        pid: i64,
        /// Signal name or number (default KILL).
        #[arg(long, short = 's')]
        signal: Option<String>,
    },
}

/// `abx sandbox system ...`.
#[derive(Subcommand, Debug)]
pub enum SystemCmd {
    /// OS, architecture, CPUs, disk and isolation of a sandbox.
    Info(SandboxArg),
}

// `abx sandbox command ...`. Not a doc comment: see [`Lazy`].
#[derive(Subcommand, Debug)]
pub enum CommandCmd {
    /// Run a named command of the sandbox's template.
    Run {
        /// Sandbox id (`id` or `provider:id`).
        sandbox: String,
        /// Command name.
        name: String,
        /// Its arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

// `abx provider ...`. Not a doc comment: see [`Lazy`].
#[derive(Subcommand, Debug)]
pub enum ProviderCmd {
    /// List the providers and their features.
    List,
    /// Show one provider.
    Info {
        /// Provider id.
        id: String,
    },
    /// Install a provider plugin from a directory, a git URL or a .tar.gz URL.
    Install(InstallArgs),
    /// Remove an installed provider.
    Uninstall {
        /// Provider id.
        id: String,
    },
    /// Update installed providers from their sources (or check with --check).
    Update {
        /// One provider (default: all).
        id: Option<String>,
        /// Only report what would change.
        #[arg(long)]
        check: bool,
        /// Move to this ref (a full commit id pins it).
        #[arg(long = "ref")]
        git_ref: Option<String>,
    },
    /// Check a provider: installed, integrity, config, handshake, permissions.
    Doctor {
        /// Provider id.
        id: String,
    },
    /// Run the contract kit against a provider.
    Test {
        /// Provider id.
        id: String,
        /// Only tests whose name contains this (comma-separated list allowed).
        #[arg(long)]
        filter: Option<String>,
        /// Tests run at once (default 16); 1 for a provider whose sandboxes share one
        /// endpoint.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
        concurrency: Option<u64>,
    },
    /// Store configuration values: KEY=VALUE (KEY=- reads the value from stdin).
    Configure {
        /// Provider id.
        id: String,
        /// KEY=VALUE pairs.
        #[arg(value_name = "KEY=VALUE")]
        values: Vec<String>,
        /// Remove a stored key.
        #[arg(long, value_name = "KEY")]
        unset: Vec<String>,
    },
    /// Make a provider the default.
    Default {
        /// Provider id.
        id: String,
    },
}

/// `abx provider install` flags.
#[derive(clap::Args, Debug)]
pub struct InstallArgs {
    /// A directory, a git URL (https://, or file:// / http:// with --allow-insecure-transport) or a .tar.gz URL.
    pub source: String,
    /// The plugin's directory inside the source.
    #[arg(long)]
    pub subdir: Option<String>,
    /// A full commit id (pinned) or a branch/tag (moving: needs --allow-unpinned).
    #[arg(long = "ref")]
    pub git_ref: Option<String>,
    /// Pin the content digest (sha256:<hex>).
    #[arg(long)]
    pub sha256: Option<String>,
    /// Accept a moving ref (trust: unpinned).
    #[arg(long)]
    pub allow_unpinned: bool,
    /// Accept file:// and http:// sources.
    #[arg(long)]
    pub allow_insecure_transport: bool,
    /// Show the plan (commit, digest, manifest, security) and install nothing.
    #[arg(long)]
    pub dry_run: bool,
}

// `abx broker ...`. Not a doc comment: see [`Deferred`].
#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BrokerArgs {
    /// Serve one client on stdin/stdout instead of the daemon socket.
    #[arg(long)]
    pub stdio: bool,
    #[command(subcommand)]
    pub action: Option<BrokerAction>,
}

// `abx broker start|stop|status|run`. Not a doc comment: see [`Deferred`].
#[derive(Subcommand, Debug)]
pub enum BrokerAction {
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

/// Seconds: `600`, `600s`, `10m`, `2h`, `1d`.
pub fn parse_seconds(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, 's')) => (&s[..i], 1),
        Some((i, 'm')) => (&s[..i], 60),
        Some((i, 'h')) => (&s[..i], 3600),
        Some((i, 'd')) => (&s[..i], 86400),
        _ => (s, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("'{s}' is not a duration (seconds, or 90s, 10m, 2h, 1d)"))
}

fn parse_seconds_f64(s: &str) -> Result<f64, String> {
    if let Ok(f) = s.trim().parse::<f64>() {
        if f.is_finite() && f > 0.0 {
            return Ok(f);
        }
        return Err(format!("'{s}' is not a positive number of seconds"));
    }
    parse_seconds(s).map(|n| n as f64)
}

/// `--network`: a mode, or `allow:HOST,...`.
fn parse_network(s: &str) -> Result<String, String> {
    if matches!(s, "none" | "internet" | "host") || s.starts_with("allow:") {
        Ok(s.to_owned())
    } else {
        Err(format!(
            "'{s}' is not a network: none, internet, host or allow:HOST,HOST,..."
        ))
    }
}

fn parse_kv(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("'{s}' is not KEY=VALUE")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    /// What a user reads is the same whether the groups and each command's arguments are
    /// built as the parser enters them or all at once: every command's help, `abx help ...`,
    /// version lines, and the errors with their suggestions (missing arguments too). It fails
    /// when a deferred argument struct or group keeps a doc comment.
    #[test]
    fn deferred_groups_and_arguments_read_as_the_whole_tree_does() {
        fn render(eager: bool, argv: &[&str]) -> String {
            if eager {
                whole_tree();
            } else {
                // What `main` builds for this line.
                plan(argv[1..].iter().map(std::ffi::OsString::from));
            }
            let r = Cli::command().try_get_matches_from(argv);
            plan([]);
            match r {
                Ok(m) => format!("ok {:?}", m.subcommand_name()),
                Err(e) => format!("{:?} {}", e.kind(), e.render()),
            }
        }
        let mut paths: Vec<Vec<String>> = vec![vec![]];
        whole_tree();
        let whole = Cli::command();
        plan([]);
        let mut stack: Vec<(Vec<String>, &clap::Command)> = vec![(vec![], &whole)];
        while let Some((path, cmd)) = stack.pop() {
            for sub in cmd.get_subcommands() {
                let mut p = path.clone();
                p.push(sub.get_name().to_owned());
                paths.push(p.clone());
                stack.push((p, sub));
            }
        }
        assert!(
            paths.len() > 40,
            "the walk saw the nested groups: {}",
            paths.len()
        );
        for path in &paths {
            let path: Vec<&str> = path.iter().map(String::as_str).collect();
            let mut cases: Vec<Vec<&str>> = vec![
                [&["abx"], &path[..], &["--help"]].concat(),
                [&["abx", "help"], &path[..]].concat(),
                [&["abx"], &path[..], &["--version"]].concat(),
                [&["abx"], &path[..]].concat(),
                [&["abx"], &path[..], &["bogus"]].concat(),
                [&["abx"], &path[..], &["--bogus"]].concat(),
            ];
            if let Some(last) = path.last() {
                let typo = &last[..last.len() - 1];
                cases.push([&["abx"], &path[..path.len() - 1], &[typo]].concat());
            }
            for argv in cases {
                assert_eq!(render(false, &argv), render(true, &argv), "{argv:?}");
            }
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_seconds("600"), Ok(600));
        assert_eq!(parse_seconds("90s"), Ok(90));
        assert_eq!(parse_seconds("10m"), Ok(600));
        assert_eq!(parse_seconds("2h"), Ok(7200));
        assert_eq!(parse_seconds("1d"), Ok(86400));
        assert!(parse_seconds("soon").is_err());
        assert!(parse_seconds("-5").is_err());
        assert_eq!(parse_seconds_f64("1.5"), Ok(1.5));
    }
}
