//! `host run`: the operator.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use super::args::parse_namespace;
use super::{Error, PluginArgs, PolicyArgs, shutdown_signal};
use crate::operator::budget::DEFAULT_CALLS_IN_FLIGHT;
use crate::units::{parse_bytes, parse_duration};

/// `host run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Plugins and limits.
    #[command(flatten)]
    pub plugins: PluginArgs,
    /// The cluster.
    #[command(flatten)]
    pub cluster: super::ClusterArgs,
    /// Watch only these namespaces: repeat the flag or separate them with commas (default:
    /// every namespace). Each is watched on its own, so the operator needs rights in these
    /// namespaces only (`host rbac --watch-namespace`).
    #[arg(long = "watch-namespace", env = "WATCH_NAMESPACE", value_delimiter = ',', value_parser = parse_namespace, value_name = "NS")]
    pub namespaces: Vec<String>,
    /// Refused: `-n/--namespace` never names the namespaces to watch (`--watch-namespace`) or
    /// the Lease's (`--lease-namespace`), so that it means one thing in every command.
    #[arg(short = 'n', long = "namespace", hide = true, value_name = "NS")]
    pub namespace: Option<String>,
    /// Where /metrics is served: over HTTPS to whoever the API server says may `get
    /// /metrics` (a TokenReview of the request's bearer token, then a SubjectAccessReview), or
    /// plain HTTP with /healthz and /readyz beside it under `--metrics-secure=false`.
    #[arg(long, default_value = "0.0.0.0:8443")]
    pub metrics_addr: std::net::SocketAddr,
    /// Serve /metrics over HTTPS with authentication and authorization by the API server (the
    /// operator needs to create TokenReviews and SubjectAccessReviews: `host rbac` grants it).
    /// `false` serves it, and the probes, over plain HTTP on --metrics-addr, to anyone.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub metrics_secure: bool,
    /// A directory with the metrics server's certificate and key, `tls.crt` and `tls.key` (a
    /// cert-manager Secret, mounted); default: a self-signed certificate made at start.
    #[arg(long, value_name = "DIR")]
    pub metrics_cert_dir: Option<std::path::PathBuf>,
    /// Where /healthz and /readyz are served (plain HTTP, for the kubelet) when /metrics is
    /// secure.
    #[arg(long, default_value = "0.0.0.0:8081")]
    pub health_probe_addr: std::net::SocketAddr,
    /// Elect a leader on a coordination.k8s.io Lease, so that several replicas can run.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// The Lease's namespace.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,
    /// The Lease's name.
    #[arg(long, default_value = "wasm-operator")]
    pub lease_name: String,
    /// Split the resources into this many shards, each served by the replica that holds its
    /// Lease (`<lease-name>-shard-<i>`): each replica holds a fair share, and takes over the
    /// shards of a replica that died. Run at least as many replicas. 1: one leader serves
    /// everything.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub shards: u32,
    /// What decides a resource's shard: a hash of its namespace and name, or of its namespace
    /// alone (a namespace's resources are then served by one replica).
    #[arg(long, default_value_t = crate::operator::shard::ShardBy::Name, value_enum)]
    pub shard_by: crate::operator::shard::ShardBy,
    /// This replica's identity in the Lease (default: the pod's name, else host name and pid).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Reconciliations in flight per Kind.
    #[arg(long, default_value_t = 16)]
    pub concurrency: u16,
    /// Applies and deletes in flight at once, across every Kind (and the reads of objects the
    /// watches know by name only): what the operator may ask of the API server at a time,
    /// however many reconciliations run. A ceiling: a namespace's
    /// limit halves while its writes take over 3 s, the replica's when the API server answers
    /// 429, and both grow back with quick answers.
    #[arg(long, default_value_t = 16)]
    pub max_writes_in_flight: u16,
    /// The floor of those limits: however the API server answers, so many writes may be in
    /// flight (at most --max-writes-in-flight; equal to it, the limit is fixed).
    #[arg(long, default_value_t = 1)]
    pub min_writes_in_flight: u16,
    /// The memory all plugin calls in flight may need together, such as 320Mi. Each call counts
    /// its memory cap and four times its output cap (80Mi at the defaults) and waits, in its
    /// namespace's turn, until that much is free; namespaces take turns, so one that floods the
    /// operator does not hold up the others. Default: room for two calls at the sandbox limits.
    #[arg(long, value_parser = parse_bytes, value_name = "BYTES")]
    pub render_memory: Option<usize>,
    /// The most memory compiling one plugin may take, such as 384Mi: plugins the compile cache
    /// lacks are compiled in a process of their own (`host compile-component`, two threads),
    /// whose data segment (heap and private mappings) is capped at this. A plugin that needs
    /// more fails to load and says so (a Plugin resource, in its status), instead of growing
    /// the container past its limit; one compiles at a time. Linux only; not with --no-cache.
    /// Default: not capped. The built-in plugins need 48Mi at most; plugins built with
    /// componentize-js or componentize-py 384Mi with the operator's image, 480Mi with a glibc
    /// build (docs/install.md, "Memory").
    #[arg(long, value_parser = parse_bytes, value_name = "BYTES")]
    pub compile_memory: Option<usize>,
    /// Threads for the operator's asynchronous work (watches, API calls, status). Renders run
    /// on threads of their own; one is enough for the rest, and spares the CPU it shares.
    #[arg(long, default_value_t = 1)]
    pub worker_threads: u16,
    /// Also serve the plugins that `Plugin` resources (plugins.wasm-operator.dev, cluster-wide)
    /// name, loaded, swapped and dropped live as those resources come, change and go. The
    /// operator then installs the CRDs of their Kinds (`host rbac --plugin-resources` grants
    /// what that needs).
    #[arg(long)]
    pub plugin_resources: bool,
    /// How long a watch may keep failing (it cannot list or watch) before /readyz fails.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub unready_after: Duration,
    /// How long one reconciliation may run before /healthz fails, so that the kubelet restarts
    /// a stuck operator (default: 2m, or the render wait plus 1m when longer).
    #[arg(long, value_parser = parse_duration)]
    pub stuck_after: Option<Duration>,
    /// What rendered objects are held to.
    #[command(flatten)]
    pub policy: PolicyArgs,
}

/// `--render-memory`, else room for [`DEFAULT_CALLS_IN_FLIGHT`] calls at the sandbox limits;
/// refused when not even one call fits.
fn render_memory(args: &RunArgs) -> Result<u64, Error> {
    let needs = args.plugins.sandbox.limits().call_memory();
    let budget = match args.render_memory {
        Some(bytes) => u64::try_from(bytes).unwrap_or(u64::MAX),
        None => needs.saturating_mul(DEFAULT_CALLS_IN_FLIGHT),
    };
    if budget < needs {
        return Err(Error::RenderMemoryTooSmall { budget, needs });
    }
    Ok(budget)
}

/// `--compile-memory` in bytes, refused where it would not be kept: with `--no-cache` plugins
/// are compiled in the operator's process, and only Linux's `RLIMIT_DATA` holds mappings.
fn compile_memory(args: &RunArgs) -> Result<Option<u64>, Error> {
    let Some(bytes) = args.compile_memory else {
        return Ok(None);
    };
    if args.plugins.sandbox.no_cache {
        return Err(Error::Usage(
            "--compile-memory cannot be kept with --no-cache: plugins are then compiled in the operator's own process".into(),
        ));
    }
    if !cfg!(target_os = "linux") {
        return Err(Error::Usage(
            "--compile-memory is kept on Linux only (RLIMIT_DATA holds no mappings elsewhere)"
                .into(),
        ));
    }
    Ok(Some(u64::try_from(bytes).unwrap_or(u64::MAX)))
}

/// How long a reconciliation may run before `/healthz` fails: as asked, but never less than a
/// render may take (a healthy operator would be restarted in a loop), else the default.
fn stuck_after(asked: Option<Duration>, render_wait: Duration) -> Duration {
    match asked {
        Some(d) if d < render_wait => {
            tracing::warn!(
                "--stuck-after {d:?} is shorter than a render may take ({render_wait:?}: twice \
                 --plugin-timeout plus 5 s); using {render_wait:?}"
            );
            render_wait
        }
        Some(d) => d,
        None => crate::operator::Settings::default_stuck_after(render_wait),
    }
}

pub(super) fn run(args: &RunArgs) -> Result<ExitCode, Error> {
    if let Some(ns) = &args.namespace {
        return Err(Error::Usage(format!(
            "host run takes no -n/--namespace {ns}: the namespaces to watch are --watch-namespace {ns}, the Lease's is --lease-namespace {ns}"
        )));
    }
    if args.shards > 1 && !args.leader_elect {
        return Err(Error::Usage(format!(
            "--shards {} needs --leader-elect: each shard is served by the replica that holds its Lease",
            args.shards
        )));
    }
    if args.shards > 1 && args.lease_name.len() > crate::operator::shards::MAX_LEASE_NAME {
        return Err(Error::Usage(format!(
            "--lease-name {} is longer than {} characters: with --shards it is a label's value on every Lease",
            args.lease_name,
            crate::operator::shards::MAX_LEASE_NAME
        )));
    }
    // Plugins the cache does not hold are compiled in a process of their own, so that the
    // compiler's memory is not the operator's (`plugin::cache::Apart`), run from this
    // executable (on Linux `/proc/self/exe`: the running binary, even after an upgrade
    // replaced its file); where it cannot be found, here.
    let exe = if cfg!(target_os = "linux") {
        Ok(std::path::PathBuf::from("/proc/self/exe"))
    } else {
        std::env::current_exe()
    };
    let compile_memory = compile_memory(args)?;
    let plugin_runtime = match exe {
        Ok(exe) => args
            .plugins
            .sandbox
            .runtime()?
            .compiling_apart(exe, compile_memory),
        Err(e) if compile_memory.is_some() => {
            return Err(Error::Usage(format!(
                "--compile-memory needs this executable, to run the compiler from: cannot find it ({e})"
            )));
        }
        Err(e) => {
            tracing::warn!("compiling plugins in this process: cannot find its executable: {e}");
            args.plugins.sandbox.runtime()?
        }
    };
    let registry = args.plugins.registry_in(&plugin_runtime)?;
    let plugin_resources = if args.plugin_resources {
        Some(crate::operator::plugins::Live {
            runtime: plugin_runtime,
            registries: args.plugins.registries.options()?,
            store: args.plugins.sandbox.store(),
            signatures: args.plugins.signature_policy()?,
        })
    } else {
        None
    };
    let identity = args.identity.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    });
    let agent = format!("wasm-operator/{} ({identity})", env!("CARGO_PKG_VERSION"));
    // Past the deadline, the sandbox has stopped the call; the margin covers a starved CPU.
    let render_wait = args.plugins.sandbox.plugin_timeout * 2 + Duration::from_secs(5);
    let settings = crate::operator::Settings {
        namespaces: args.namespaces.clone(),
        metrics_addr: args.metrics_addr,
        metrics_tls: if args.metrics_secure {
            let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
            let names: Vec<String> = ["localhost", host.trim()]
                .into_iter()
                .filter(|n| !n.is_empty())
                .map(str::to_owned)
                .collect();
            Some(crate::operator::secure::tls_config(
                args.metrics_cert_dir.as_deref(),
                &names,
            )?)
        } else {
            None
        },
        health_addr: args.health_probe_addr,
        leader_election: args.leader_elect,
        lease_namespace: args.lease_namespace.clone(),
        lease_name: args.lease_name.clone(),
        identity,
        concurrency: args.concurrency.max(1),
        max_writes_in_flight: args.max_writes_in_flight.max(1),
        min_writes_in_flight: args
            .min_writes_in_flight
            .clamp(1, args.max_writes_in_flight.max(1)),
        render_memory: render_memory(args)?,
        render_wait,
        unready_after: args.unready_after,
        stuck_after: stuck_after(args.stuck_after, render_wait),
        plugin_resources,
        rules: args.policy.rules(),
        sharding: Some(crate::operator::shard::Sharding {
            count: args.shards,
            by: args.shard_by,
        }),
        shard: None,
    };
    let runtime = super::runtime(Some(usize::from(args.worker_threads)))?;
    let result = runtime.block_on(async move {
        // The operator names itself in every request, so the API server's audit log and
        // metrics tell its writes (and each replica's) apart from everyone else's.
        let cluster = args.cluster.cluster(Some(&agent)).await?;
        crate::operator::run(cluster, registry, settings, shutdown_signal())
            .await
            .map_err(Error::from)
    });
    // A render that never returned (the operator stopped waiting for it) must not hold the
    // process after shutdown.
    runtime.shutdown_timeout(Duration::from_secs(5));
    result?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn run_args(args: &[&str]) -> RunArgs {
        let cli = Cli::try_parse_from(["host", "run"].iter().chain(args)).unwrap();
        match cli.command {
            Command::Run(run) => *run,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_render_memory_is_room_for_two_calls_unless_set_and_never_less_than_one() {
        assert_eq!(render_memory(&run_args(&[])).unwrap(), 160 << 20);
        assert_eq!(
            render_memory(&run_args(&["--plugin-memory=16Mi", "--plugin-output=1Mi"])).unwrap(),
            40 << 20
        );
        assert_eq!(
            render_memory(&run_args(&["--render-memory=1Gi"])).unwrap(),
            1 << 30
        );
        let e = render_memory(&run_args(&["--render-memory=64Mi"])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--render-memory 64Mi is less than one plugin call may need, 80Mi (--plugin-memory and 4 times --plugin-output); raise it, or lower those"
        );
    }

    #[test]
    fn the_compile_memory_is_kept_or_refused_never_ignored() {
        assert_eq!(compile_memory(&run_args(&[])).unwrap(), None);
        assert_eq!(
            compile_memory(&run_args(&["--compile-memory=384Mi"])).unwrap(),
            Some(384 << 20)
        );
        let e = compile_memory(&run_args(&["--compile-memory=384Mi", "--no-cache"])).unwrap_err();
        assert!(
            e.to_string().contains("cannot be kept with --no-cache"),
            "{e}"
        );
    }
}
