//! What several commands share: which plugins to load and how, the sandbox, registries,
//! the operator's policy, and a plugin to look at.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use super::{Error, ReportFormat};
use crate::documents;
use crate::plugin::{Cache, Limits, Runtime, default_cache_dir};
use crate::registry::{Registry, Source};
use crate::signature::Policy;
use crate::types::Context;
use crate::units::{parse_bytes, parse_duration};

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
    /// A signature policy (YAML; docs/plugins.md): which keys and which certificate identities
    /// may sign the plugins of which repositories, and where a signature is required. A plugin
    /// from a registry (`--plugin oci://...`, and Plugin resources with `host run
    /// --plugin-resources`) is loaded only when the policy lets it through; files are loaded as
    /// they are.
    #[arg(long, value_name = "FILE", env = "PLUGIN_SIGNATURES")]
    pub plugin_signatures: Option<PathBuf>,
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

    /// The signature policy `--plugin-signatures` names, read.
    pub fn signature_policy(&self) -> Result<Option<Arc<Policy>>, Error> {
        let Some(path) = &self.plugin_signatures else {
            return Ok(None);
        };
        Ok(Some(Arc::new(Policy::from_file(path)?)))
    }

    /// As [`PluginArgs::registry`], loading into `runtime`.
    pub fn registry_in(&self, runtime: &Runtime) -> Result<Registry, Error> {
        // Read at start, so that a policy that cannot be used is said whatever the plugins.
        let policy = self.signature_policy()?;
        // Read once, and only when a plugin is given by reference.
        let mut read_options: Option<crate::oci::Options> = None;
        let store = self.sandbox.store();
        let mut sources = Vec::new();
        for plugin in &self.plugins {
            let Some(_) = plugin.strip_prefix(crate::oci::SCHEME) else {
                sources.push(Source::File(PathBuf::from(plugin)));
                continue;
            };
            let reference = crate::oci::Reference::parse(plugin)?;
            let named_a_tag = reference.digest.is_none();
            let mut options = || -> Result<crate::oci::Options, Error> {
                match &read_options {
                    Some(o) => Ok(o.clone()),
                    None => Ok(read_options.insert(self.registries.options()?).clone()),
                }
            };
            // The policy judges the artifact before any of it is pulled: a tag is resolved to
            // its digest first, and what is served is what was judged.
            let reference = match &policy {
                Some(policy) if !(self.require_digest && reference.digest.is_none()) => {
                    let pinned =
                        crate::publish::block_on(crate::oci::resolve(&reference, &options()?))??;
                    let verdict = crate::publish::block_on(policy.check(&pinned, &options()?))??;
                    tracing::info!(plugin = %pinned, "{verdict}");
                    pinned
                }
                _ => reference,
            };
            // Kept by digest (and judged): the layer is not even read when it was compiled
            // before.
            let (pinned, source) = match store
                .as_ref()
                .and_then(|s| crate::oci::kept(&reference, s))
            {
                Some(kept) => {
                    let name = format!("{}{}", crate::oci::SCHEME, kept.reference);
                    tracing::info!(plugin = %name, "plugin kept by digest");
                    (
                        kept.reference.clone(),
                        Source::Kept {
                            name,
                            kept,
                            refetch: Box::new((options()?, store.clone())),
                        },
                    )
                }
                None => {
                    let pulled = crate::publish::block_on(crate::oci::pull(
                        &reference,
                        &options()?,
                        store.as_ref(),
                        self.require_digest,
                    ))??;
                    let name = format!("{}{}", crate::oci::SCHEME, pulled.reference);
                    tracing::info!(plugin = %name, from_store = pulled.cached, "plugin pulled and checked against its digest");
                    (
                        pulled.reference,
                        Source::Wasm {
                            name,
                            wasm: pulled.wasm,
                        },
                    )
                }
            };
            if named_a_tag {
                // A tag is resolved once; from here on the digest is what is served.
                eprintln!("host: {plugin} is {}{pinned}", crate::oci::SCHEME);
            }
            sources.push(source);
        }
        Ok(Registry::load_sources(
            runtime,
            self.sandbox.context(),
            !self.no_builtins,
            &sources,
        )?)
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
        Ok(Runtime::new(self.limits(), cache)?)
    }
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

/// Which cluster a command talks to, as kubectl takes it.
#[derive(Debug, Clone, Default, Args)]
pub struct ClusterArgs {
    /// The kubeconfig file (default: $KUBECONFIG, else ~/.kube/config, else the pod's service
    /// account when in a cluster).
    #[arg(long, value_name = "FILE", global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig's context to use (default: its current context).
    #[arg(long, value_name = "NAME", global = true)]
    pub context: Option<String>,
}

impl ClusterArgs {
    /// The client configuration: from the kubeconfig and context given, else as kubectl finds
    /// one (KUBECONFIG, ~/.kube/config), else the pod's own (in a cluster). An error says which
    /// file or context could not be used.
    pub async fn config(&self) -> Result<kube::Config, Error> {
        use kube::config::{KubeConfigOptions, Kubeconfig};
        let options = KubeConfigOptions {
            context: self.context.clone(),
            ..KubeConfigOptions::default()
        };
        let unusable = |source: String| Error::Kubeconfig {
            what: match (&self.kubeconfig, &self.context) {
                (Some(file), Some(context)) => {
                    format!("the context {context:?} of {}", file.display())
                }
                (Some(file), None) => file.display().to_string(),
                (None, Some(context)) => format!("the kubeconfig's context {context:?}"),
                (None, None) => "the kubeconfig".to_owned(),
            },
            reason: source,
        };
        match &self.kubeconfig {
            Some(file) => {
                let kubeconfig =
                    Kubeconfig::read_from(file).map_err(|e| unusable(e.to_string()))?;
                kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                    .await
                    .map_err(|e| unusable(e.to_string()))
            }
            None if self.context.is_some() => kube::Config::from_kubeconfig(&options)
                .await
                .map_err(|e| unusable(e.to_string())),
            None => kube::Config::infer().await.map_err(|e| Error::Kubeconfig {
                what: "the kubeconfig".to_owned(),
                reason: format!(
                    "no usable kubeconfig ($KUBECONFIG, else ~/.kube/config) and not in a cluster; give --kubeconfig ({e})"
                ),
            }),
        }
    }

    /// A client for the cluster, naming itself `agent` in every request when given, once the
    /// cluster has answered (its version): a cluster that cannot be reached is said before the
    /// command starts, with its address.
    pub async fn client(&self, agent: Option<&str>) -> Result<kube::Client, Error> {
        let config = self.agent_config(agent).await?;
        let server = config.cluster_url.to_string();
        let client = crate::connection::client(config).map_err(Error::Cluster)?;
        reachable(&client, server).await?;
        Ok(client)
    }

    /// [`Self::client`], with a client for the Leases and the connections of the watches, as
    /// `host run` needs them.
    pub async fn cluster(&self, agent: Option<&str>) -> Result<crate::connection::Cluster, Error> {
        let config = self.agent_config(agent).await?;
        let server = config.cluster_url.to_string();
        let cluster = crate::connection::Cluster::connect(config).map_err(Error::Cluster)?;
        reachable(&cluster.client, server).await?;
        Ok(cluster)
    }

    /// The kubeconfig's config, naming itself `agent` in every request when given.
    async fn agent_config(&self, agent: Option<&str>) -> Result<kube::Config, Error> {
        let mut config = self.config().await?;
        if let Some(value) = agent.and_then(|a| http::HeaderValue::from_str(a).ok()) {
            config.headers.push((http::header::USER_AGENT, value));
        }
        Ok(config)
    }
}

/// Asks the cluster at `server` its version: one that cannot be reached is said before the
/// command starts, with its address.
async fn reachable(client: &kube::Client, server: String) -> Result<(), Error> {
    client
        .apiserver_version()
        .await
        .map_err(|source| Error::Unreachable { server, source })?;
    Ok(())
}

/// A namespace name given on the command line.
pub(super) fn parse_namespace(s: &str) -> Result<String, String> {
    if documents::is_namespace(s) {
        Ok(s.to_owned())
    } else {
        Err(format!(
            "`{s}` is not a valid namespace: use at most 63 lower-case letters, digits and '-', \
             starting and ending with a letter or digit"
        ))
    }
}
