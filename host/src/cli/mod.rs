//! The `host` command: it parses the arguments and calls the library; nothing imports it. One
//! file per command, holding its arguments and what it does; what several share in [`args`].
//!
//! Exit codes: 0 success; 1 a resource could not be rendered, a check failed, a diff found
//! differences or the operator stopped on an error; 2 the command could not run as asked (bad
//! flags, an unreadable file, a plugin that does not load, a cluster out of reach).

use std::io::Write;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

mod admission;
mod args;
mod check;
mod compile;
mod completion;
mod crds;
#[cfg(feature = "dev")]
mod dev;
mod diff;
mod error;
mod inspect;
mod new;
mod probe;
mod pull;
mod push;
mod rbac;
mod render;
mod run;
mod verify;

pub use admission::AdmissionArgs;
pub use args::{ClusterArgs, PluginArgs, PolicyArgs, RegistryArgs, SandboxArgs, SubjectArgs};
pub use check::CheckArgs;
pub use completion::CompletionArgs;
pub use crds::CrdsArgs;
#[cfg(feature = "dev")]
pub use dev::DevArgs;
pub use diff::DiffArgs;
pub use error::Error;
pub use inspect::InspectArgs;
pub use new::NewArgs;
pub use probe::ProbeArgs;
pub use pull::PullArgs;
pub use push::PushArgs;
pub use rbac::RbacArgs;
pub use render::RenderArgs;
pub use run::RunArgs;
pub use verify::VerifyArgs;

/// What `host --version` prints: the host's version, the wasmtime it embeds, the contract
/// (WIT package) it speaks, and the sha256 of each built-in plugin.
pub fn long_version() -> String {
    let mut text = format!(
        "{}\nwasmtime {}\ncontract wasm-operator:plugin@{}",
        env!("CARGO_PKG_VERSION"),
        env!("WASMTIME_VERSION"),
        CONTRACT_VERSION
    );
    for b in crate::plugin::BUILTINS {
        text.push_str(&format!("\nbuilt-in plugin {} sha256:{}", b.name, b.sha256));
    }
    text
}

/// The version of the contract (`wit/plugin.wit`) this host was built with.
pub const CONTRACT_VERSION: &str = env!("CONTRACT_VERSION");

/// Runs reconcilers written as WebAssembly components.
#[derive(Debug, Parser)]
#[command(name = "host", version, about, propagate_version = true)]
pub struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "LOG_FORMAT")]
    pub log_format: LogFormat,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Log formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Render resources offline, with no cluster, and print the manifests.
    Render(RenderArgs),
    /// Print the CustomResourceDefinition of every Kind the plugins serve.
    Crds(CrdsArgs),
    /// Print the least-privilege RBAC of `host run` for the plugins: a ServiceAccount, a
    /// ClusterRole (their Kinds, status, child kinds, events) and a Role for the Lease.
    Rbac(RbacArgs),
    /// Print the ValidatingAdmissionPolicies (and their bindings) by which the API server lets a
    /// resource name a Secret, ConfigMap or ServiceAccount only when its author may use it
    /// (the references each plugin declares; Kubernetes 1.30 or later).
    Admission(AdmissionArgs),
    /// Run the operator: reconcile every Kind the plugins serve (in cluster, or with the current
    /// kubeconfig).
    Run(Box<RunArgs>),
    /// Check a plugin before it is published or served: its contract, imports, descriptions,
    /// schemas, and each example rendered within the sandbox's limits, purely. Exit 0 when every
    /// check passes, 1 when one fails, 2 when the checks could not run.
    Check(CheckArgs),
    /// Push a plugin to an OCI registry as a Wasm artifact (config
    /// application/vnd.wasm.config.v0+json, one application/wasm layer); prints the reference
    /// pinned to its digest.
    Push(PushArgs),
    /// Pull a plugin from an OCI registry, checked against its digests; prints the reference
    /// pinned to its digest.
    Pull(PullArgs),
    /// Say what a plugin is: its Kinds, the child kinds it may emit, its contract, digest, size,
    /// imports and exports; from a file or a registry.
    Inspect(InspectArgs),
    /// Verify a plugin's signatures in its registry (cosign's `.sig` signatures and Sigstore
    /// bundles) against public keys, or certificate authorities and the identity a certificate
    /// must name; offline but for the registry. Exit 0: signed by what is trusted; 1: not; 2:
    /// the check could not run.
    Verify(VerifyArgs),
    /// Write a plugin project in Rust, JavaScript or Python that builds outside this
    /// repository: the contract, the plugin, an example, and `./build.sh`, which builds the
    /// component, checks it with its example, tests the status it computes and prints how to
    /// push it.
    New(NewArgs),
    /// Preview what `host run` would change in the cluster (the current kubeconfig's): each
    /// resource rendered as the operator renders it, each child sent as a server-side apply dry
    /// run under the operator's field manager and compared with the live object, and what it
    /// would prune. Writes nothing. Exit 0: no differences; 1: differences; 2: an error.
    Diff(DiffArgs),
    /// Print the completion script of a shell (bash, zsh, fish, elvish, powershell).
    Completion(CompletionArgs),
    /// Ask an HTTP endpoint, such as the operator's /readyz, and print its answer: exit 0 when
    /// it answers 2xx, 1 when it answers otherwise, 2 when it does not answer (the image's
    /// probe: it has no shell or curl; `helm test` runs it).
    Probe(ProbeArgs),
    /// A demo with nothing to install: a Kubernetes control plane of its own (kwok simulates the
    /// pods), the CRDs, the operator, the examples applied, and a live table of each going to
    /// Ready. Ctrl-C tears it all down.
    #[cfg(feature = "dev")]
    Dev(DevArgs),
    /// Compile the component on stdin into the compile cache: what `host run` runs to compile
    /// a plugin in a process of its own.
    #[command(hide = true)]
    CompileComponent(compile::CompileArgs),
}

/// Formats of a report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReportFormat {
    /// For a person.
    Text,
    /// One JSON object.
    Json,
}

impl Cli {
    /// Parses the arguments and runs.
    pub fn parse_and_run() -> ExitCode {
        use clap::{CommandFactory, FromArgMatches};
        // `--version` says what this binary holds; a leak of one short string, once.
        let long: &'static str = Box::leak(long_version().into_boxed_str());
        let matches = Self::command().long_version(long).get_matches();
        let cli = match Self::from_arg_matches(&matches) {
            Ok(cli) => cli,
            Err(e) => e.exit(),
        };
        let default = if matches!(cli.command, Command::Run(_)) {
            "info,kube=warn"
        } else {
            "warn"
        };
        init_logging(cli.log_format, default);
        cli.run()
    }

    /// Runs the command.
    pub fn run(self) -> ExitCode {
        let result = match self.command {
            Command::Render(args) => render::run(&args),
            Command::Crds(args) => crds::run(&args),
            Command::Rbac(args) => rbac::run(&args),
            Command::Admission(args) => admission::run(&args),
            Command::Run(args) => run::run(&args),
            Command::Check(args) => check::run(&args),
            Command::Push(args) => push::run(&args),
            Command::Pull(args) => pull::run(&args),
            Command::Inspect(args) => inspect::run(&args),
            Command::Verify(args) => verify::run(&args),
            Command::New(args) => new::run(&args),
            Command::Diff(args) => diff::run(&args),
            Command::Probe(args) => probe::run(&args),
            Command::Completion(args) => completion::run(&args),
            #[cfg(feature = "dev")]
            Command::Dev(args) => dev::run(&args),
            Command::CompileComponent(args) => compile::run(&args),
        };
        match result {
            Ok(code) => code,
            Err(e) => {
                eprintln!("error: {e}");
                e.exit_code()
            }
        }
    }
}

/// Sets up tracing on stderr, filtered by `RUST_LOG` (else `default`); colours only on a
/// terminal, and never with `NO_COLOR`.
pub fn init_logging(format: LogFormat, default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(
                std::env::var_os("NO_COLOR").is_none()
                    && std::io::IsTerminal::is_terminal(&std::io::stderr()),
            )
            .try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Writes to stdout; a closed pipe (`host render x | head`) is not an error.
fn emit(text: &str) -> Result<(), Error> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(Error::Output(e)),
        _ => Ok(()),
    }
}

/// The async runtime of a command that talks to a cluster: `workers` threads, or the calling
/// thread alone.
fn runtime(workers: Option<usize>) -> Result<tokio::runtime::Runtime, Error> {
    let mut builder = match workers {
        Some(n) => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n.max(1));
            b
        }
        None => tokio::runtime::Builder::new_current_thread(),
    };
    builder.enable_all().build().map_err(Error::Start)
}

/// Every document of the input `files` (directories expanded, `-` standard input) read and
/// parsed as a resource, in order; `each` gets where it is (`FILE: document N`) and the resource,
/// or why the document is not one.
fn each_resource(
    files: &[String],
    mut each: impl FnMut(
        &str,
        std::result::Result<crate::types::Resource, crate::documents::FieldError>,
    ) -> Result<(), Error>,
) -> Result<(), Error> {
    for file in &crate::documents::expand(files)? {
        let shown = if file == "-" {
            "<stdin>"
        } else {
            file.as_str()
        };
        let text = crate::documents::read(file)?;
        for doc in crate::documents::parse(file, &text)? {
            let place = format!("{shown}: document {}", doc.index);
            each(&place, crate::documents::resource(&doc.value))?;
        }
    }
    Ok(())
}

/// Resolves on SIGTERM (a kubelet stopping the pod) or Ctrl-C; elsewhere than Unix, on Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = ctrl_c => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = ctrl_c.await;
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    tracing::info!("shutting down: finishing reconciliations in flight");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::Limits;
    use std::time::Duration;

    fn limits(args: &[&str]) -> Limits {
        let cli = Cli::try_parse_from([&["host", "render"], args, &["-"]].concat()).unwrap();
        match cli.command {
            Command::Render(render) => render.plugins.sandbox.limits(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_plugin_flags_set_every_limit_and_default_to_the_library_defaults() {
        assert_eq!(limits(&[]), Limits::default());
        assert_eq!(
            limits(&[
                "--plugin-timeout=2s",
                "--plugin-memory=32Mi",
                "--plugin-output=1Mi",
                "--plugin-max-manifests=50",
            ]),
            Limits {
                deadline: Duration::from_secs(2),
                memory_bytes: 32 << 20,
                output_bytes: 1 << 20,
                max_manifests: 50,
            }
        );
    }
}
