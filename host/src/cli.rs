//! The `host` command.
//!
//! Exit codes: 0 success; 1 a resource could not be rendered; 2 the command could not run as
//! asked (bad flags, an unreadable file, a plugin that does not load).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::documents::{self, Format};
use crate::error::Error;
use crate::plugin::{Cache, Limits, Runtime, default_cache_dir};
use crate::registry::{Registry, Source};
use crate::types::Context;

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
    /// Preview what `host run` would change in the cluster (the current kubeconfig's): each
    /// resource rendered as the operator renders it, each child sent as a server-side apply dry
    /// run under the operator's field manager and compared with the live object, and what it
    /// would prune. Writes nothing. Exit 0: no differences; 1: differences; 2: an error.
    Diff(DiffArgs),
    /// A demo with nothing to install: a Kubernetes control plane of its own (kwok simulates the
    /// pods), the CRDs, the operator, the examples applied, and a live table of each going to
    /// Ready. Ctrl-C tears it all down.
    #[cfg(feature = "dev")]
    Dev(DevArgs),
}

/// `host push`.
#[derive(Debug, Args)]
pub struct PushArgs {
    /// The context the plugin is described under before it is pushed.
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    /// How registries are reached.
    #[command(flatten)]
    pub registries: RegistryArgs,
    /// The plugin component.
    #[arg(value_name = "FILE.wasm")]
    pub file: PathBuf,
    /// Where to: `[oci://]REGISTRY/REPOSITORY[:TAG]` (the tag defaults to latest).
    #[arg(value_name = "REF")]
    pub reference: String,
}

/// `host pull`.
#[derive(Debug, Args)]
pub struct PullArgs {
    /// How registries are reached.
    #[command(flatten)]
    pub registries: RegistryArgs,
    /// Refuse a reference that names a tag and no digest.
    #[arg(long)]
    pub require_digest: bool,
    /// Where to write the component (default: the repository's last name, with .wasm).
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// What to pull: `[oci://]REGISTRY/REPOSITORY[:TAG][@sha256:DIGEST]`.
    #[arg(value_name = "REF")]
    pub reference: String,
}

/// `host inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The plugin, and how it is reached and reported on.
    #[command(flatten)]
    pub subject: SubjectArgs,
}

/// A plugin to look at (`host check`, `host inspect`): a file or a reference, the context it is
/// described under, how registries are reached, and the report's format.
#[derive(Debug, Args)]
pub struct SubjectArgs {
    /// The context and limits it runs under (those of `host run` by default).
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    /// How registries are reached (for a plugin given by reference).
    #[command(flatten)]
    pub registries: RegistryArgs,
    /// Report format.
    #[arg(short, long, value_enum, default_value_t = ReportFormat::Text)]
    pub output: ReportFormat,
    /// The plugin component: a file, or a reference to a registry (`oci://...`).
    #[arg(value_name = "FILE.wasm|REF")]
    pub plugin: String,
}

/// `host dev`.
#[derive(Debug, Args)]
pub struct DevArgs {
    /// Plugins and limits.
    #[command(flatten)]
    pub plugins: PluginArgs,
    /// Resources to apply: files or directories (default: the project's examples/).
    #[arg(value_name = "FILE|DIR")]
    pub inputs: Vec<String>,
    /// On Ctrl-C, stop the operator but leave the control plane running (it prints how to stop
    /// it).
    #[arg(long)]
    pub keep: bool,
}

/// `host run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Plugins and limits.
    #[command(flatten)]
    pub plugins: PluginArgs,
    /// Watch only these namespaces: repeat the flag or separate them with commas (default:
    /// every namespace). Each is watched on its own, so the operator needs rights in these
    /// namespaces only (`host rbac --watch-namespace`).
    #[arg(long = "namespace", env = "WATCH_NAMESPACE", value_delimiter = ',', value_parser = parse_namespace, value_name = "NS")]
    pub namespaces: Vec<String>,
    /// Where /healthz, /readyz and /metrics are served.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub metrics_addr: std::net::SocketAddr,
    /// Elect a leader on a coordination.k8s.io Lease, so that several replicas can run.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// The Lease's namespace.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,
    /// The Lease's name.
    #[arg(long, default_value = "wasm-operator")]
    pub lease_name: String,
    /// This replica's identity in the Lease (default: the pod's name, else host name and pid).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Reconciliations in flight per Kind.
    #[arg(long, default_value_t = 16)]
    pub concurrency: u16,
    /// Applies and deletes in flight at once, across every Kind: what the operator may ask of
    /// the API server at a time, however many reconciliations run.
    #[arg(long, default_value_t = 16)]
    pub max_writes_in_flight: u16,
    /// The memory all plugin calls in flight may need together, such as 320Mi. Each call counts
    /// its memory cap and four times its output cap (80Mi at the defaults) and waits, in its
    /// namespace's turn, until that much is free; namespaces take turns, so one that floods the
    /// operator does not hold up the others. Default: room for two calls at the sandbox limits.
    #[arg(long, value_parser = parse_bytes, value_name = "BYTES")]
    pub render_memory: Option<usize>,
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

/// What the operator lets a resource's children be (docs/security.md).
#[derive(Debug, Clone, Args)]
pub struct PolicyArgs {
    /// The Pod Security Standard every pod template is held to in namespaces without a
    /// `pod-security.kubernetes.io/enforce` label: privileged, baseline or restricted.
    #[arg(long, default_value = "baseline", value_name = "LEVEL")]
    pub pod_security: crate::policy::Level,
    /// A ClusterIssuer that Ingresses (`cert-manager.io/cluster-issuer`) and cert-manager
    /// objects may name. Repeat the flag or separate them with commas (default: none).
    #[arg(long = "cluster-issuer", value_delimiter = ',', value_name = "NAME")]
    pub cluster_issuers: Vec<String>,
    /// A URL a KMSSecret's `spec.hostAPI` may be. Repeat the flag or separate them with commas
    /// (default: none; a KMSSecret without one uses the KMS operator's default).
    #[arg(long = "kms-host-api", value_delimiter = ',', value_name = "URL")]
    pub kms_hosts: Vec<String>,
    /// The Ingress annotations passed through, comma-separated: exact keys, or prefixes ending
    /// in `*` (a key with `snippet` in it only when listed exactly). Empty: none.
    #[arg(long, value_delimiter = ',', value_name = "KEYS", default_values_t = crate::policy::reach::DEFAULT_INGRESS_ANNOTATIONS.map(str::to_owned))]
    pub ingress_annotations: Vec<String>,
    /// A namespace whose resources may adopt objects no controller owns when they ask to
    /// (their `wasm-operator.dev/adopt: "true"`), for a migration. Elsewhere, an object is
    /// adopted only when it names the resource itself (`wasm-operator.dev/adopt-by`).
    #[arg(long = "adopt-in-namespace", value_delimiter = ',', value_parser = parse_namespace, value_name = "NS")]
    pub adopt_namespaces: Vec<String>,
}

impl PolicyArgs {
    /// The rules these flags say.
    pub fn rules(&self) -> crate::policy::Rules {
        let set = |v: &[String]| {
            v.iter()
                .filter(|s| !s.is_empty())
                .cloned()
                .collect::<std::collections::BTreeSet<_>>()
        };
        crate::policy::Rules {
            pod_security: self.pod_security,
            allowed: crate::policy::Allowed {
                cluster_issuers: set(&self.cluster_issuers),
                kms_hosts: set(&self.kms_hosts),
                ingress_annotations: self
                    .ingress_annotations
                    .iter()
                    .filter(|s| !s.is_empty())
                    .cloned()
                    .collect(),
            },
            adopt_namespaces: set(&self.adopt_namespaces),
        }
    }
}

/// Which plugins to load and how to run them.
#[derive(Debug, Clone, Args)]
pub struct PluginArgs {
    /// A plugin component to load after the built-in ones: a file, or a reference to a registry
    /// (`oci://REGISTRY/REPOSITORY@sha256:DIGEST`, or a tag, resolved once). It replaces the
    /// built-in plugins for the Kinds it serves. Repeatable.
    #[arg(long = "plugin", value_name = "FILE.wasm|oci://REF")]
    pub plugins: Vec<String>,
    /// Refuse `--plugin` references that name a tag and no digest: a tag can be moved.
    #[arg(long)]
    pub require_digest: bool,
    /// Do not load the built-in plugins.
    #[arg(long)]
    pub no_builtins: bool,
    /// The context and limits of every plugin call.
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    /// How registries are reached.
    #[command(flatten)]
    pub registries: RegistryArgs,
}

impl PluginArgs {
    /// Sets up the runtime and loads the plugins, pulling those named by reference (or taking
    /// them from the store of pulled plugins, when they are there by digest).
    pub fn registry(&self) -> Result<Registry, Error> {
        self.registry_in(&self.sandbox.runtime()?)
    }

    /// As [`PluginArgs::registry`], loading into `runtime`.
    pub fn registry_in(&self, runtime: &Runtime) -> Result<Registry, Error> {
        // Read once, and only when a plugin is given by reference.
        let mut options = None;
        let store = self.sandbox.store();
        let mut sources = Vec::new();
        for plugin in &self.plugins {
            let Some(_) = plugin.strip_prefix(crate::oci::SCHEME) else {
                sources.push(Source::File(PathBuf::from(plugin)));
                continue;
            };
            let reference = crate::oci::Reference::parse(plugin)?;
            let options = match &options {
                Some(o) => o,
                None => options.insert(self.registries.options()?),
            };
            let pulled = crate::publish::block_on(crate::oci::pull(
                &reference,
                options,
                store.as_ref(),
                self.require_digest,
            ))??;
            let name = format!("{}{}", crate::oci::SCHEME, pulled.reference);
            if reference.digest.is_none() {
                // A tag is resolved once; from here on the digest is what is served.
                eprintln!("host: {plugin} is {name}");
            }
            tracing::info!(plugin = %name, from_store = pulled.cached, "plugin pulled and checked against its digest");
            sources.push(Source::Wasm {
                name,
                wasm: pulled.wasm,
            });
        }
        Registry::load_sources(runtime, self.sandbox.context(), !self.no_builtins, &sources)
    }
}

/// How registries are reached: credentials, certificates, plain HTTP.
#[derive(Debug, Clone, Args)]
pub struct RegistryArgs {
    /// A Docker config JSON with registry credentials (`auths`), such as a mounted Secret of
    /// type kubernetes.io/dockerconfigjson (default: $DOCKER_CONFIG/config.json, else
    /// ~/.docker/config.json, when there is one).
    #[arg(long, value_name = "FILE", env = "REGISTRY_CONFIG")]
    pub registry_config: Option<PathBuf>,
    /// PEM CA certificates to trust for registries, besides the system's.
    #[arg(long, value_name = "FILE", env = "REGISTRY_CA")]
    pub registry_ca: Option<PathBuf>,
    /// Speak plain HTTP to every registry. Without it, only a loopback registry that does not
    /// speak TLS is spoken to over HTTP.
    #[arg(long)]
    pub plain_http: bool,
    /// How long one registry request may take, such as 30s.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub registry_timeout: Duration,
}

impl RegistryArgs {
    /// The client options these flags say.
    pub fn options(&self) -> Result<crate::oci::Options, Error> {
        let default = || {
            std::env::var_os("DOCKER_CONFIG")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".docker")))
                .map(|d| d.join("config.json"))
                .filter(|p| p.is_file())
        };
        let file = self.registry_config.clone().or_else(default);
        // Read now, so that a file that cannot be read is said at start; read again at each
        // connection.
        let credentials = match &file {
            Some(path) => crate::oci::Credentials::from_file(path)?,
            None => crate::oci::Credentials::default(),
        };
        Ok(crate::oci::Options {
            ca_file: self.registry_ca.clone(),
            plain_http: self.plain_http,
            credentials,
            credentials_file: file,
            timeout: self.registry_timeout,
        })
    }
}

/// The context a plugin is called with, the sandbox's limits and the compile cache.
#[derive(Debug, Clone, Args)]
pub struct SandboxArgs {
    /// The API group of the hanzo Kinds (and of the KMSSecrets they create, as kms.GROUP).
    #[arg(long, default_value = "hanzo.ai", env = "API_GROUP")]
    pub api_group: String,
    /// The cluster's DNS domain, for addresses plugins compute.
    #[arg(long, default_value = "cluster.local", env = "CLUSTER_DOMAIN")]
    pub cluster_domain: String,
    /// How long one plugin call may run, such as 1s or 500ms.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub plugin_timeout: Duration,
    /// How much memory one plugin call may use, such as 64Mi.
    #[arg(long, default_value = "64Mi", value_parser = parse_bytes)]
    pub plugin_memory: usize,
    /// How many bytes of manifests one render may return, such as 4Mi; also the largest error it
    /// may return.
    #[arg(long, default_value = "4Mi", value_parser = parse_bytes)]
    pub plugin_output: usize,
    /// How many manifests one render may return.
    #[arg(long, default_value_t = 1000)]
    pub plugin_max_manifests: usize,
    /// Where compiled plugins are cached (default: $WASM_OPERATOR_CACHE/components, else
    /// ~/.cache/wasm-operator/components).
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Compile plugins in memory and cache nothing.
    #[arg(long)]
    pub no_cache: bool,
}

impl SandboxArgs {
    /// The context plugins are called with.
    pub fn context(&self) -> Context {
        Context {
            api_group: self.api_group.clone(),
            cluster_domain: self.cluster_domain.clone(),
        }
    }

    /// The limits every plugin call runs under.
    pub fn limits(&self) -> Limits {
        Limits {
            deadline: self.plugin_timeout,
            memory_bytes: self.plugin_memory,
            output_bytes: self.plugin_output,
            max_manifests: self.plugin_max_manifests,
        }
    }

    /// Where pulled plugins are kept by digest: beside the compiled ones (none with
    /// `--no-cache`).
    pub fn store(&self) -> Option<crate::oci::Store> {
        if self.no_cache {
            return None;
        }
        let dir = self.cache_dir.clone().or_else(default_cache_dir)?;
        Some(crate::oci::Store::new(dir.join("oci")))
    }

    /// The runtime, with the compile cache unless `--no-cache`.
    pub fn runtime(&self) -> Result<Runtime, Error> {
        let cache = if self.no_cache {
            None
        } else {
            self.cache_dir
                .clone()
                .or_else(default_cache_dir)
                .map(Cache::new)
        };
        Runtime::new(self.limits(), cache)
    }
}

/// `host crds`.
#[derive(Debug, Args)]
pub struct CrdsArgs {
    /// Plugins and limits.
    #[command(flatten)]
    pub plugins: PluginArgs,
    /// Write one file per CRD (`<plural>.<group>.yaml`) into this directory instead of stdout.
    #[arg(long, value_name = "DIR")]
    pub output_dir: Option<PathBuf>,
}

/// `host rbac`.
#[derive(Debug, Args)]
pub struct RbacArgs {
    /// Plugins and limits.
    #[command(flatten)]
    pub plugins: PluginArgs,
    /// The namespace of the operator's ServiceAccount and Lease.
    #[arg(long, default_value = "wasm-operator", value_parser = parse_namespace)]
    pub namespace: String,
    /// The name of the ServiceAccount, the roles and their bindings.
    #[arg(long, default_value = "wasm-operator")]
    pub name: String,
    /// Also what `host run --plugin-resources` needs: read `Plugin` resources and write their
    /// status, and install the CRDs of the Kinds they serve. The rules for those plugins' own
    /// Kinds and child kinds are theirs to add (`host rbac --no-builtins --plugin REF`).
    #[arg(long)]
    pub plugin_resources: bool,
    /// The namespaces `host run --namespace` watches: the ClusterRole is then bound in each of
    /// them (a RoleBinding) instead of cluster-wide. Repeat the flag or separate with commas.
    #[arg(long = "watch-namespace", value_delimiter = ',', value_parser = parse_namespace, value_name = "NS")]
    pub watch_namespaces: Vec<String>,
}

/// `host admission`.
#[derive(Debug, Args)]
pub struct AdmissionArgs {
    /// Plugins and limits.
    #[command(flatten)]
    pub plugins: PluginArgs,
}

/// A namespace name given on the command line.
fn parse_namespace(s: &str) -> Result<String, String> {
    if documents::is_namespace(s) {
        Ok(s.to_owned())
    } else {
        Err(format!(
            "`{s}` is not a valid namespace: use at most 63 lower-case letters, digits and '-', \
             starting and ending with a letter or digit"
        ))
    }
}

/// `host check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The plugin, and how it is reached and reported on.
    #[command(flatten)]
    pub subject: SubjectArgs,
    /// Resources of the plugin's Kinds to render: YAML or JSON files, or directories of them.
    #[arg(value_name = "EXAMPLE")]
    pub examples: Vec<String>,
}

/// Formats of a report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReportFormat {
    /// For a person.
    Text,
    /// One JSON object.
    Json,
}

/// `host diff`.
#[derive(Debug, Args)]
pub struct DiffArgs {
    /// Plugins and limits (`--plugin NEW` previews a new version of a plugin).
    #[command(flatten)]
    pub plugins: PluginArgs,
    /// Preview every resource of the plugins' Kinds in the cluster (with `--plugin NEW`: an
    /// upgrade of that plugin, before it is rolled out) instead of files.
    #[arg(long, conflicts_with = "files")]
    pub all: bool,
    /// With `--all`, only this namespace.
    #[arg(long, short = 'n', requires = "all")]
    pub namespace: Option<String>,
    /// Report format.
    #[arg(short, long, value_enum, default_value_t = ReportFormat::Text)]
    pub output: ReportFormat,
    /// YAML or JSON files of resources, or directories of them; `-` reads standard input.
    #[arg(value_name = "FILE", required_unless_present = "all")]
    pub files: Vec<String>,
}

/// `host render`.
#[derive(Debug, Args)]
pub struct RenderArgs {
    /// Plugins and limits.
    #[command(flatten)]
    pub plugins: PluginArgs,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Format::Yaml)]
    pub output: Format,
    /// YAML or JSON files of resources, or directories of them; `-` reads standard input.
    #[arg(value_name = "FILE", required = true)]
    pub files: Vec<String>,
}

/// Parses `500ms`, `2s`, `1m` or a number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (number, unit) = s.split_at(
        s.find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len()),
    );
    let n: f64 = number
        .parse()
        .map_err(|_| format!("`{s}` is not a duration such as 500ms, 2s or 1m"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" => n * 60.0,
        _ => return Err(format!("`{s}`: unit must be ms, s or m")),
    };
    Duration::try_from_secs_f64(secs).map_err(|e| format!("`{s}`: {e}"))
}

/// Parses `64Mi`, `1Gi`, `512Ki`, `4MiB` or a number of bytes.
pub fn parse_bytes(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (number, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: usize = number
        .parse()
        .map_err(|_| format!("`{s}` is not a size such as 64Mi"))?;
    let shift = match unit.trim_end_matches('B') {
        "" => 0,
        "Ki" => 10,
        "Mi" => 20,
        "Gi" => 30,
        _ => return Err(format!("`{s}`: unit must be Ki, Mi or Gi")),
    };
    n.checked_shl(shift)
        .filter(|v| v >> shift == n)
        .ok_or_else(|| format!("`{s}` is too large"))
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
            Command::Render(args) => render(&args),
            Command::Crds(args) => crds(&args),
            Command::Rbac(args) => rbac(&args),
            Command::Admission(args) => admission(&args),
            Command::Run(args) => run(&args),
            Command::Check(args) => check(&args),
            Command::Push(args) => push(&args),
            Command::Pull(args) => pull(&args),
            Command::Inspect(args) => inspect(&args),
            Command::Diff(args) => diff(&args),
            #[cfg(feature = "dev")]
            Command::Dev(args) => dev(&args),
        };
        match result {
            Ok(code) => code,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(2)
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
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(Error::Output(e.to_string())),
        _ => Ok(()),
    }
}

fn render(args: &RenderArgs) -> Result<ExitCode, Error> {
    let registry = args.plugins.registry()?;
    let mut objects = Vec::new();
    let mut failures = Vec::new();
    for file in &documents::expand(&args.files)? {
        let shown = if file == "-" {
            "<stdin>"
        } else {
            file.as_str()
        };
        let text = documents::read(file)?;
        for doc in documents::parse(file, &text)? {
            let label = |r: Option<&crate::types::Resource>| match r {
                Some(r) => format!("{shown}: document {} ({}/{})", doc.index, r.kind, r.name),
                None => format!("{shown}: document {}", doc.index),
            };
            match documents::resource(&doc.value) {
                Err(e) => failures.push(format!("{}: {e}", label(None))),
                Ok(resource) => match registry.render_reported(&resource) {
                    Ok((rendered, warnings)) => {
                        // What the plugin left out goes to stderr; the rest renders.
                        for w in &warnings {
                            eprintln!("warning: {}: {w}", label(Some(&resource)));
                        }
                        objects.extend(rendered);
                    }
                    Err(e) => failures.push(format!("{}: {e}", label(Some(&resource)))),
                },
            }
        }
    }
    if !failures.is_empty() {
        for f in &failures {
            eprintln!("error: {f}");
        }
        eprintln!(
            "{} resource(s) could not be rendered; nothing was printed",
            failures.len()
        );
        return Ok(ExitCode::from(1));
    }
    emit(&documents::write(&objects, args.output)?)?;
    Ok(ExitCode::SUCCESS)
}

fn check(args: &CheckArgs) -> Result<ExitCode, Error> {
    let subject = &args.subject;
    let crate::publish::Fetched { wasm, source, .. } =
        crate::publish::Subject::parse(&subject.plugin)?.fetch(
            &subject.registries.options()?,
            subject.sandbox.store().as_ref(),
        )?;
    let mut examples = Vec::new();
    for file in &documents::expand(&args.examples)? {
        let text = documents::read(file)?;
        for doc in documents::parse(file, &text)? {
            let resource = documents::resource(&doc.value).map_err(|reason| Error::Example {
                place: format!("{file}: document {}", doc.index),
                reason,
            })?;
            examples.push(crate::check::Example {
                source: format!(
                    "{file}: document {} ({}/{})",
                    doc.index, resource.kind, resource.name
                ),
                resource,
            });
        }
    }
    let runtime = subject.sandbox.runtime()?;
    let report = crate::check::check(
        &runtime,
        &wasm,
        &source,
        &subject.sandbox.context(),
        &examples,
    );
    let text = match subject.output {
        ReportFormat::Text => report.text(),
        ReportFormat::Json => {
            let mut json =
                serde_json::to_string_pretty(&report).map_err(|e| Error::Output(e.to_string()))?;
            json.push('\n');
            json
        }
    };
    emit(&text)?;
    Ok(if report.passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// How long a reconciliation may run before `/healthz` fails: as asked, but never less than a
/// render may take (a healthy operator would be restarted in a loop), else the default.
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

/// How many plugin calls at the sandbox limits the default `--render-memory` has room for.
pub const DEFAULT_CALLS_IN_FLIGHT: u64 = 2;

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

fn run(args: &RunArgs) -> Result<ExitCode, Error> {
    let plugin_runtime = args.plugins.sandbox.runtime()?;
    let registry = args.plugins.registry_in(&plugin_runtime)?;
    let plugin_resources = if args.plugin_resources {
        Some(crate::operator::plugins::Live {
            runtime: plugin_runtime,
            registries: args.plugins.registries.options()?,
            store: args.plugins.sandbox.store(),
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
        leader_election: args.leader_elect,
        lease_namespace: args.lease_namespace.clone(),
        lease_name: args.lease_name.clone(),
        identity,
        concurrency: args.concurrency.max(1),
        max_writes_in_flight: args.max_writes_in_flight.max(1),
        render_memory: render_memory(args)?,
        render_wait,
        unready_after: args.unready_after,
        stuck_after: stuck_after(args.stuck_after, render_wait),
        plugin_resources,
        rules: args.policy.rules(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(usize::from(args.worker_threads.max(1)))
        .enable_all()
        .build()
        .map_err(|e| Error::Output(format!("cannot start the async runtime: {e}")))?;
    let result = runtime.block_on(async move {
        // The operator names itself in every request, so the API server's audit log and
        // metrics tell its writes (and each replica's) apart from everyone else's.
        let mut config = kube::Config::infer()
            .await
            .map_err(|e| crate::operator::Error::Kube(kube::Error::InferConfig(e)))?;
        if let Ok(value) = http::HeaderValue::from_str(&agent) {
            config.headers.push((http::header::USER_AGENT, value));
        }
        let client = kube::Client::try_from(config)?;
        crate::operator::run(client, registry, settings, shutdown_signal()).await
    });
    // A render that never returned (the operator stopped waiting for it) must not hold the
    // process after shutdown.
    runtime.shutdown_timeout(Duration::from_secs(5));
    match result {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            eprintln!("error: {e}");
            Ok(ExitCode::FAILURE)
        }
    }
}

fn diff(args: &DiffArgs) -> Result<ExitCode, Error> {
    let registry = args.plugins.registry()?;
    let mut resources = Vec::new();
    if !args.all {
        for file in &documents::expand(&args.files)? {
            let text = documents::read(file)?;
            for doc in documents::parse(file, &text)? {
                resources.push(
                    documents::resource(&doc.value).map_err(|e| {
                        Error::Output(format!("{file}: document {}: {e}", doc.index))
                    })?,
                );
            }
        }
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Output(format!("cannot start the async runtime: {e}")))?;
    let mut notes = Vec::new();
    let mut report = runtime.block_on(async {
        let client = kube::Client::try_default()
            .await
            .map_err(|e| Error::Output(format!("cannot reach the cluster: {e}")))?;
        if args.all {
            // With `--plugin NEW`, the Kinds of the plugins given (a built-in one it replaces is
            // previewed with it); else every Kind served.
            (resources, notes) = crate::diff::listed(
                &client,
                &registry,
                args.namespace.as_deref(),
                !args.plugins.plugins.is_empty(),
            )
            .await
            .map_err(|e| Error::Output(e.to_string()))?;
        }
        Ok::<_, Error>(crate::diff::diff(&client, &registry, &resources, !args.all).await)
    })?;
    report.notes = notes;
    match args.output {
        ReportFormat::Text => emit(&report.text())?,
        ReportFormat::Json => emit(&format!(
            "{}\n",
            serde_json::json!({
                "entries": report.entries,
                "errors": report.errors,
                "notes": report.notes,
                "summary": {
                    "create": report.count(crate::diff::Action::Create),
                    "change": report.count(crate::diff::Action::Change),
                    "delete": report.count(crate::diff::Action::Delete),
                },
            })
        ))?,
    }
    Ok(if !report.errors.is_empty() {
        ExitCode::from(2)
    } else if report.differs() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(feature = "dev")]
fn dev(args: &DevArgs) -> Result<ExitCode, Error> {
    let registry = args.plugins.registry()?;
    let inputs = if args.inputs.is_empty() {
        vec![crate::dev::default_examples().display().to_string()]
    } else {
        args.inputs.clone()
    };
    let options = crate::dev::Options {
        render_wait: args.plugins.sandbox.plugin_timeout * 2 + Duration::from_secs(5),
        examples: inputs,
        keep: args.keep,
    };
    match crate::dev::run(registry, &options, shutdown_signal()) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            eprintln!("error: {e}");
            Ok(ExitCode::FAILURE)
        }
    }
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
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
    tracing::info!("shutting down: finishing reconciliations in flight");
}

fn rbac(args: &RbacArgs) -> Result<ExitCode, Error> {
    let registry = args.plugins.registry()?;
    let target = crate::rbac::Target {
        namespace: args.namespace.clone(),
        name: args.name.clone(),
        watch_namespaces: args.watch_namespaces.clone(),
        plugin_resources: args.plugin_resources,
    };
    let mut text = String::from(
        "# What `host run` needs for these plugins, and nothing more (generated by `host rbac`).\n",
    );
    text.push_str(&documents::write(
        &crate::rbac::objects(&registry, &target),
        Format::Yaml,
    )?);
    emit(&text)?;
    Ok(ExitCode::SUCCESS)
}

fn admission(args: &AdmissionArgs) -> Result<ExitCode, Error> {
    let registry = args.plugins.registry()?;
    let mut text = String::from(
        "# What the API server checks of the references these plugins' resources make (generated by `host admission`).\n",
    );
    text.push_str(&documents::write(
        &crate::policy::admission::for_registry(&registry),
        Format::Yaml,
    )?);
    emit(&text)?;
    Ok(ExitCode::SUCCESS)
}

fn push(args: &PushArgs) -> Result<ExitCode, Error> {
    let reference = crate::oci::Reference::parse(&args.reference)?;
    let runtime = args.sandbox.runtime()?;
    let pushed = crate::publish::push(
        &runtime,
        &args.sandbox.context(),
        &args.file,
        &reference,
        &args.registries.options()?,
    )?;
    emit(&format!("{}{pushed}\n", crate::oci::SCHEME))?;
    Ok(ExitCode::SUCCESS)
}

fn pull(args: &PullArgs) -> Result<ExitCode, Error> {
    let reference = crate::oci::Reference::parse(&args.reference)?;
    let pulled = crate::publish::block_on(crate::oci::pull(
        &reference,
        &args.registries.options()?,
        None,
        args.require_digest,
    ))??;
    let path = args.output.clone().unwrap_or_else(|| {
        let name = reference.repository.rsplit('/').next().unwrap_or("plugin");
        PathBuf::from(format!("{name}.wasm"))
    });
    std::fs::write(&path, &pulled.wasm)
        .map_err(|e| Error::Output(format!("{}: {e}", path.display())))?;
    eprintln!(
        "host: pulled {} ({} bytes, {}) to {}",
        pulled.reference,
        pulled.wasm.len(),
        pulled.media_type,
        path.display()
    );
    emit(&format!("{}{}\n", crate::oci::SCHEME, pulled.reference))?;
    Ok(ExitCode::SUCCESS)
}

fn inspect(args: &InspectArgs) -> Result<ExitCode, Error> {
    let args = &args.subject;
    let subject = crate::publish::Subject::parse(&args.plugin)?;
    let runtime = args.sandbox.runtime()?;
    let report = crate::publish::inspect(
        &runtime,
        &args.sandbox.context(),
        &subject,
        &args.registries.options()?,
        args.sandbox.store().as_ref(),
    )?;
    match args.output {
        ReportFormat::Text => emit(&crate::publish::text(&report))?,
        ReportFormat::Json => emit(&format!(
            "{}\n",
            serde_json::to_string_pretty(&report).map_err(|e| Error::Output(e.to_string()))?
        ))?,
    }
    Ok(ExitCode::SUCCESS)
}

fn crds(args: &CrdsArgs) -> Result<ExitCode, Error> {
    let registry = args.plugins.registry()?;
    let mut crds = crate::crd::crds(&registry)?;
    // The Kind that names plugins to load live (`host run --plugin-resources`).
    crds.push(crate::operator::plugins::crd());
    match &args.output_dir {
        None => emit(&documents::write(&crds, Format::Yaml)?)?,
        Some(dir) => {
            for (name, text) in crate::crd::files(&crds)? {
                let path = dir.join(name);
                std::fs::create_dir_all(dir)
                    .and_then(|()| std::fs::write(&path, text))
                    .map_err(|e| Error::Output(format!("{}: {e}", path.display())))?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_sizes() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1m").unwrap(), Duration::from_secs(60));
        assert!(parse_duration("soon").is_err());
        assert_eq!(parse_bytes("64Mi").unwrap(), 64 << 20);
        assert_eq!(parse_bytes("4MiB").unwrap(), 4 << 20);
        assert_eq!(parse_bytes("100").unwrap(), 100);
        assert!(parse_bytes("1Pi").is_err());
    }

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
}
