//! `host run`: the operator.
//!
//! One controller per Kind the plugins serve. Each reconciliation renders the resource through its
//! plugin (in a fresh sandboxed instance), checks every object, and server-side applies it under
//! one field manager with the host's owner reference and ownership label; children a render no
//! longer returns are deleted, and nothing a resource does not control is written (see
//! `children` and `reconcile`). Every object of each child kind is watched, so a child deleted or
//! edited by hand brings its owner back to reconcile. Status follows kstatus
//! (`Ready`, `Reconciling`, `Stalled`, `observedGeneration`); nothing is written when nothing
//! changed.

pub mod budget;
mod children;
pub mod lease;
mod live;
pub mod metrics;
pub mod plugins;
mod reconcile;
mod report;
mod status;

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::StreamExt;
use futures::channel::mpsc;
use kube::api::{Api, DynamicObject};
use kube::core::GroupVersionKind;
use kube::discovery::{ApiCapabilities, ApiResource, Scope, pinned_kind};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{PredicateConfig, WatchStreamExt, watcher};
use tokio::sync::watch;

use children::{Applies, OwnerIndex, Waiting};
pub use live::LiveChild;
pub use metrics::Metrics;

use crate::gvk::split_api_version;
use crate::ownership::{FIELD_MANAGER, trim_resource};
use crate::registry::Registry;

/// How long a namespace's Pod Security level is used before it is read again.
const LEVEL_TTL: Duration = Duration::from_secs(30);

/// What went wrong running the operator.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Kubernetes client could not be made or a call failed.
    #[error("kubernetes: {0}")]
    Kube(#[from] kube::Error),
    /// Plugins could not be loaded.
    #[error(transparent)]
    Host(#[from] crate::error::Error),
    /// The metrics server could not start.
    #[error("metrics server on {addr}: {source}")]
    Serve {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Leader election failed.
    #[error("leader election: {0}")]
    Lease(String),
    /// No Kind could be served.
    #[error("no Kind can be served: {0}")]
    NothingToServe(String),
}

/// How the operator runs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Watch only these namespaces; empty watches every namespace.
    pub namespaces: Vec<String>,
    /// Where `/healthz`, `/readyz` and `/metrics` are served.
    pub metrics_addr: SocketAddr,
    /// Elect a leader on a Lease (for more than one replica).
    pub leader_election: bool,
    /// The Lease's namespace.
    pub lease_namespace: String,
    /// The Lease's name.
    pub lease_name: String,
    /// This replica's identity.
    pub identity: String,
    /// Reconciliations in flight per Kind.
    pub concurrency: u16,
    /// Applies and deletes in flight at once, across every Kind.
    pub max_writes_in_flight: u16,
    /// The memory all plugin calls in flight may need together, in bytes (see [`budget`]).
    pub render_memory: u64,
    /// How long a reconciliation waits for a render: the plugin deadline and a margin. The
    /// sandbox stops a call at its deadline; this bounds the wait should one still not return.
    pub render_wait: Duration,
    /// How long a watch of a served Kind or a child kind may keep failing (it cannot list or
    /// watch) before `/readyz` fails.
    pub unready_after: Duration,
    /// How long one reconciliation may run before `/healthz` fails (the reconcile loop is
    /// stuck; a kubelet then restarts the operator).
    pub stuck_after: Duration,
    /// Serve the plugins that `Plugin` resources name, loaded live (none: only those given at
    /// start).
    pub plugin_resources: Option<plugins::Live>,
    /// What rendered objects are held to before they are applied, and who may adopt.
    pub rules: crate::policy::Rules,
}

impl Settings {
    /// Where each watch looks: every namespace at once (`None`), or each watched namespace on
    /// its own, since a list or watch across several namespaces needs rights in every namespace.
    pub(crate) fn scopes(&self) -> Vec<Option<String>> {
        if self.namespaces.is_empty() {
            vec![None]
        } else {
            let unique: std::collections::BTreeSet<&String> = self.namespaces.iter().collect();
            unique.into_iter().cloned().map(Some).collect()
        }
    }

    /// The default of [`Settings::stuck_after`] for a given `render_wait`: two minutes, or
    /// longer when one render may take longer.
    pub fn default_stuck_after(render_wait: Duration) -> Duration {
        (render_wait + Duration::from_secs(60)).max(metrics::RECONCILE_STUCK)
    }
}

/// A child kind (`group/Kind`) that the cluster serves: the version watched, and its objects.
pub(crate) struct Watched {
    pub ar: ApiResource,
    /// One watch per scope ([`Settings::scopes`]): all namespaces, or each watched namespace.
    pub parts: Vec<WatchedPart>,
}

/// The watch of one child kind in one scope.
pub(crate) struct WatchedPart {
    /// The namespace watched, or `None` for all of them.
    pub namespace: Option<String>,
    /// Turns true once the watch has listed: until then, the store cannot say that an object
    /// does not exist.
    pub listed: FirstListDone,
    /// Every object of this kind in the scope, as much of it as reconciliation reads (see
    /// `children`).
    pub store: Store<LiveChild>,
}

impl Watched {
    /// The watches of the child kind `kind` on `ar`, one per scope: what fills them, and what
    /// reads them.
    fn new(
        kind: &str,
        ar: &ApiResource,
        scopes: &[Option<String>],
    ) -> (Vec<children::Writer>, Self) {
        let mut writers = Vec::new();
        let mut parts = Vec::new();
        for scope in scopes {
            let writer = reflector::store::Writer::<LiveChild>::new(ar.clone());
            let store = writer.as_reader();
            let (first_list, listed) = FirstList::new();
            parts.push(WatchedPart {
                namespace: scope.clone(),
                listed,
                store,
            });
            writers.push(children::Writer {
                kind: kind.to_owned(),
                ar: ar.clone(),
                namespace: scope.clone(),
                writer,
                first_list,
            });
        }
        (
            writers,
            Self {
                ar: ar.clone(),
                parts,
            },
        )
    }

    /// The watch that sees `namespace`.
    fn part(&self, namespace: &str) -> Option<&WatchedPart> {
        self.parts
            .iter()
            .find(|p| p.namespace.as_deref().is_none_or(|ns| ns == namespace))
    }

    /// The object `name` in `namespace`, as its watch shows it.
    pub(crate) fn get(&self, namespace: &str, name: &str) -> Option<Arc<LiveChild>> {
        self.part(namespace)?
            .store
            .get(&reflector::ObjectRef::new_with(name, self.ar.clone()).within(namespace))
    }

    /// Whether the watch that sees `namespace` has listed.
    pub(crate) fn listed(&self, namespace: &str) -> bool {
        self.part(namespace).is_some_and(|p| *p.listed.borrow())
    }
}

/// The API of `ar` in `scope` (a namespace, or all of them), and the name of a watch of it for
/// logs and health: `name`, with the namespace when there is one.
pub(crate) fn scoped<K>(
    client: &kube::Client,
    scope: Option<&str>,
    ar: &ApiResource,
    name: &str,
) -> (Api<K>, String)
where
    K: kube::Resource<DynamicType = ApiResource, Scope = kube::core::DynamicResourceScope>,
{
    match scope {
        Some(ns) => (
            Api::namespaced_with(client.clone(), ns, ar),
            format!("{name} in {ns}"),
        ),
        None => (Api::all_with(client.clone(), ar), name.to_owned()),
    }
}

/// What every controller shares.
pub(crate) struct Shared {
    pub client: kube::Client,
    /// The plugins served: swapped whole when a `Plugin` resource comes, changes or goes; a
    /// render holds the one it started with.
    pub registry: RwLock<Arc<Registry>>,
    pub reports: report::Reports,
    pub metrics: Arc<Metrics>,
    /// Where each declared child kind is applied, by `group/version/Kind`: `Err` says why it
    /// cannot be (its CRD is not installed, it is cluster-scoped, ...).
    pub targets: RwLock<BTreeMap<String, Result<ApiResource, String>>>,
    /// The watch of each child kind the cluster serves, by `group/Kind` ([`children::kind_key`]).
    pub watched: RwLock<BTreeMap<String, Watched>>,
    /// The declared child kinds whose CRD was not installed at start, looked for again now and
    /// then: `group/version/Kind` and the kind.
    pub missing: Mutex<Vec<(String, GroupVersionKind)>>,
    /// The controllers of the served Kinds, to wake resources through.
    pub owners: children::Owners,
    /// What each child looked like after our last apply, to skip writes when nothing changed.
    pub applied: Mutex<BTreeMap<String, children::Applied>>,
    /// Children being applied right now.
    pub applies: Arc<Applies>,
    /// Which children each resource controls (by its uid).
    pub owned: Mutex<OwnerIndex>,
    /// Resources waiting on an object they may not take.
    pub waiting: Mutex<Waiting>,
    /// Failures in a row per resource, for backoff.
    pub failures: Mutex<BTreeMap<report::Key, u32>>,
    /// One permit per apply or delete in flight (`Settings::max_writes_in_flight`).
    pub writes: tokio::sync::Semaphore,
    /// The memory budget of plugin calls in flight (`Settings::render_memory`).
    pub budget: Arc<budget::Budget>,
    /// How many reconciliations of one Kind run at once (`Settings::concurrency`).
    pub concurrency: u16,
    /// Whether every watch (served Kinds and child kinds) has listed what it watches.
    pub synced: tokio::sync::watch::Sender<bool>,
    /// Turns true when the operator stops: what waits for `synced` waits no more.
    pub stopping: tokio::sync::watch::Sender<bool>,
    /// See [`Settings::render_wait`].
    pub render_wait: Duration,
    /// Whether this replica may write (it leads, and renewed its Lease in time).
    pub fence: Arc<lease::Fence>,
    /// See [`Settings::rules`].
    pub rules: crate::policy::Rules,
    /// The Pod Security level each namespace enforced when last read, and when that was.
    pub levels: Mutex<BTreeMap<String, (std::time::Instant, crate::policy::Level)>>,
}

/// The error of a write this replica may not send: it does not lead, or its Lease was not
/// renewed in time.
pub(crate) fn not_leading() -> kube::Error {
    kube::Error::Service(Box::new(std::io::Error::other(
        "not sent: this replica does not hold the Lease (or could not renew it in time)",
    )))
}

/// Reads `l`, as [`lock`] locks.
pub(crate) fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Writes `l`, as [`lock`] locks.
pub(crate) fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Locks `m`; a lock whose holder panicked is still used (every value kept under these locks is
/// whole between statements), so no work is silently skipped.
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Shared {
    /// The plugins served now.
    pub(crate) fn registry(&self) -> Arc<Registry> {
        read(&self.registry).clone()
    }

    /// The Pod Security level `namespace` enforces (its `pod-security.kubernetes.io/enforce`
    /// label), else the operator's default; read again when older than [`LEVEL_TTL`]. A namespace
    /// the operator may not read gets the default (the API server's own Pod Security admission
    /// still holds its pods to its label); any other failure is one to retry, not a verdict.
    pub(crate) async fn pod_security_level(
        &self,
        namespace: &str,
    ) -> Result<crate::policy::Level, kube::Error> {
        let default = self.rules.pod_security;
        if let Some((at, level)) = lock(&self.levels).get(namespace)
            && at.elapsed() < LEVEL_TTL
        {
            return Ok(*level);
        }
        let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(self.client.clone());
        let level = match self.fence.bounded(api.get_metadata(namespace)).await {
            Ok(ns) => crate::policy::level_of(ns.metadata.labels.as_ref(), default),
            Err(kube::Error::Api(s)) if s.code == 403 => {
                tracing::warn!(%namespace, "may not read the namespace's Pod Security label (grant get on namespaces: host rbac), holding its pods to {default}");
                default
            }
            Err(e) => return Err(e),
        };
        lock(&self.levels).insert(namespace.to_owned(), (std::time::Instant::now(), level));
        Ok(level)
    }

    /// Sends one write of a child (`verb`: apply, delete) within the budget of writes in flight,
    /// counted in `wasm_operator_api_writes_total`.
    pub(crate) async fn write<T>(
        &self,
        verb: &str,
        ar: &ApiResource,
        call: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, kube::Error> {
        // A replica that may not write (its Lease not renewed in time) sends nothing: checked
        // once the write's slot is taken, since waiting for one may outlast the Lease, and
        // bounded in time, so that a write let through ends before another replica may lead.
        if !self.fence.allows() {
            return Err(not_leading());
        }
        // The semaphore is never closed; without a permit, the write goes anyway.
        let _permit = self.writes.acquire().await.ok();
        if !self.fence.allows() {
            return Err(not_leading());
        }
        self.metrics
            .write(verb, &format!("{}.{}", ar.plural, ar.group));
        self.fence.bounded(call).await
    }
}

/// A declared child kind's key: `group/version/Kind`.
fn gvk_key(api_version: &str, kind: &str) -> String {
    let (g, v) = split_api_version(api_version);
    format!("{g}/{v}/{kind}")
}

/// The context of one Kind's controller.
pub(crate) struct KindCtx {
    pub shared: Arc<Shared>,
    pub ar: ApiResource,
    pub controller: String,
}

impl KindCtx {
    /// The name of the plugin that serves the Kind now (the metrics' `plugin` label), and
    /// `name@version (sha256 prefix)` of it, for status. Looked up at each use: a `Plugin`
    /// resource may swap the plugin while the controller runs.
    pub(crate) fn plugin(&self) -> (String, String) {
        match self
            .shared
            .registry()
            .lookup(&self.ar.api_version, &self.ar.kind)
        {
            Ok((p, _)) => (
                p.name().to_owned(),
                format!("{}@{} ({})", p.name(), p.info().version, &p.sha256()[..12]),
            ),
            Err(e) => (String::new(), e.to_string()),
        }
    }
}

/// Runs the operator until `shutdown` resolves (SIGTERM in the binary), then finishes the
/// reconciliations in flight and steps down.
pub async fn run(
    client: kube::Client,
    registry: Registry,
    settings: Settings,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let metrics = Arc::new(Metrics::default());
    metrics.set_limits(settings.unready_after, settings.stuck_after);
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let stopped = {
        let rx = stop_rx.clone();
        move || {
            let mut rx = rx.clone();
            async move {
                let _ = rx.wait_for(|s| *s).await;
            }
        }
    };
    let addr = metrics::serve(settings.metrics_addr, metrics.clone(), stopped())
        .await
        .map_err(|source| Error::Serve {
            addr: settings.metrics_addr,
            source,
        })?;
    tracing::info!(%addr, "serving /healthz, /readyz and /metrics");

    // Leader election: only the leader reconciles; the others wait.
    let mut leadership = None;
    let mut fence = lease::Fence::open();
    let mut prefetched = BTreeMap::new();
    if settings.leader_election {
        let (is_leader, lease_fence, handle) = lease::elect(
            client.clone(),
            &settings.lease_namespace,
            &settings.lease_name,
            &settings.identity,
        );
        let mut is_leader = is_leader;
        fence = lease_fence;
        tracing::info!(identity = %settings.identity, lease = %settings.lease_name, "waiting to lead");
        metrics.set_ready(true);
        // Meanwhile, the Plugins are made ready to serve.
        let standby = settings.plugin_resources.as_ref().map(|live| {
            plugins::Standby::start(
                client.clone(),
                live.clone(),
                registry.context().clone(),
                metrics.clone(),
            )
        });
        let mut stop = stop_rx.clone();
        let elected = tokio::select! {
            r = is_leader.wait_for(|l| *l) => { r.map(|_| true).map_err(|e| Error::Lease(e.to_string()))? }
            _ = stop.wait_for(|s| *s) => false,
        };
        prefetched = standby.map(plugins::Standby::take).unwrap_or_default();
        metrics.plugins_prefetched.set(0);
        if !elected {
            drop(is_leader);
            let _ = handle.await;
            return Ok(());
        }
        tracing::info!(identity = %settings.identity, "leading");
        // Ready again once this replica's watches have listed (below).
        metrics.set_ready(false);
        leadership = Some((is_leader, handle));
    }

    let (shared, writers) = setup(
        client.clone(),
        registry,
        metrics.clone(),
        &settings,
        fence.clone(),
    )
    .await?;
    let shared = Arc::new(shared);
    let mut report_workers = Vec::new();
    for _ in 0..report::WORKERS {
        let shared = shared.clone();
        report_workers.push(tokio::spawn(async move {
            shared.reports.work(&shared.metrics).await;
        }));
    }

    // Stop on shutdown, or when another replica takes the lease.
    let mut lost = leadership.as_ref().map(|(rx, _)| rx.clone());
    let mut stop = stop_rx.clone();
    let trigger = async move {
        match lost.as_mut() {
            Some(rx) => {
                tokio::select! {
                    _ = rx.wait_for(|l| !*l) => tracing::warn!("lost the lease; stopping"),
                    _ = stop.wait_for(|s| *s) => {}
                }
            }
            None => {
                let _ = stop.wait_for(|s| *s).await;
            }
        }
    };
    let (trigger_tx, _) = tokio::sync::broadcast::channel::<()>(1);
    let trigger_tx2 = trigger_tx.clone();
    let mut stopping = shared.stopping.subscribe();
    let halted = shared.clone();
    tokio::spawn(async move {
        trigger.await;
        halted.stopping.send_replace(true);
        let _ = trigger_tx2.send(());
    });

    // Reconciliation starts, and the operator is ready, once every watch has listed what it
    // watches (into its store): the operator then sees the cluster.
    let mut listed = children::watch_children(&shared, writers);
    let registry = shared.registry();
    let kinds: Vec<_> = registry.kinds().collect();
    let discovered = discover(
        &client,
        kinds
            .iter()
            .map(|(_, kind)| GroupVersionKind::gvk(&kind.group, &kind.versions[0], &kind.kind)),
    )
    .await;
    let controllers = Arc::new(Controllers {
        stop: trigger_tx.clone(),
        stopping: stopping.clone(),
        running: Mutex::new(Vec::new()),
        kinds: Mutex::new(BTreeMap::new()),
        finding: tokio::sync::Mutex::new(()),
        unserved: Mutex::new(Vec::new()),
    });
    for ((plugin, kind), found) in kinds.into_iter().zip(discovered) {
        let gvk = GroupVersionKind::gvk(&kind.group, &kind.versions[0], &kind.kind);
        match found {
            Ok((ar, _)) => {
                listed.extend(controllers.start(&shared, &settings, plugin.name(), kind, ar))
            }
            Err(e) => {
                tracing::error!(kind = %kind.kind, group = %kind.group, plugin = %plugin.name(),
                    "not serving {}.{}: its CRD is not installed ({e}); install crds/ (looked for again every {REDISCOVER:?})", kind.plural, kind.group);
                lock(&controllers.unserved).push((plugin.name().to_owned(), kind.clone(), gvk));
            }
        }
    }
    // Plugins served as `Plugin` resources, loaded as they come, change and go.
    let live = match &settings.plugin_resources {
        Some(live) => {
            let (task, first) = plugins::serve(
                shared.clone(),
                settings.clone(),
                controllers.clone(),
                live.clone(),
                std::mem::take(&mut prefetched),
            );
            listed.push(("plugins.wasm-operator.dev".to_owned(), first));
            Some(task)
        }
        None => None,
    };
    if live.is_none() && lock(&controllers.running).is_empty() {
        return Err(Error::NothingToServe(
            "no CRD of any Kind the plugins serve is installed".into(),
        ));
    }
    let synced = shared.clone();
    tokio::spawn(async move {
        // A watch that cannot list (no RBAC for it, say) must not hold every Kind back forever.
        let deadline = tokio::time::Instant::now() + SYNC_TIMEOUT;
        for (name, mut done) in listed {
            // An error means its watch ended: nothing more to wait for.
            let listed = tokio::time::timeout_at(deadline, done.wait_for(|d| *d)).await;
            if listed.is_err() {
                tracing::warn!(watch = %name, "not listed after {SYNC_TIMEOUT:?}; reconciling without it");
            }
        }
        tracing::info!("caches synced; reconciling");
        synced.synced.send_replace(true);
        synced.metrics.set_ready(true);
    });
    let rediscovery = tokio::spawn(rediscover(
        shared.clone(),
        settings.clone(),
        controllers.clone(),
    ));
    // Until the operator stops (shutdown, or the Lease lost); then every controller, those
    // started later too (a Kind whose CRD came late, a plugin loaded live), finishes.
    let _ = stopping.wait_for(|s| *s).await;
    // Nothing starts controllers from here on.
    if let Some(live) = live {
        live.abort();
    }
    rediscovery.abort();
    loop {
        let next = lock(&controllers.running).pop();
        let Some(c) = next else { break };
        let _ = c.await;
    }
    // Finish what the last reconciliations had to report before stepping down.
    shared.reports.flush(Duration::from_secs(10)).await;
    for w in report_workers {
        w.abort();
    }
    metrics.set_ready(false);
    if let Some((rx, handle)) = leadership {
        let lost = !*rx.borrow();
        drop(rx);
        let _ = handle.await;
        tracing::info!("stepped down");
        if lost && !*stop_rx.borrow() {
            return Err(Error::Lease("another replica took the lease".into()));
        }
    }
    Ok(())
}

/// Discovers the child kinds; each the cluster serves gets a store for its watch.
async fn setup(
    client: kube::Client,
    registry: Registry,
    metrics: Arc<Metrics>,
    settings: &Settings,
    fence: Arc<lease::Fence>,
) -> Result<(Shared, Vec<children::Writer>), Error> {
    // Every child kind once (by `group/version/Kind`), all discovered at once.
    let mut wanted = BTreeMap::new();
    for plugin in registry.plugins() {
        for child in &plugin.info().children {
            let api_version = crate::gvk::api_version(&child.group, &child.version);
            wanted
                .entry(gvk_key(&api_version, &child.kind))
                .or_insert((api_version, child.clone()));
        }
    }
    let discovered = discover(
        &client,
        wanted
            .values()
            .map(|(_, child)| GroupVersionKind::gvk(&child.group, &child.version, &child.kind)),
    )
    .await;
    let mut targets = BTreeMap::new();
    let mut watched = BTreeMap::new();
    let mut writers = Vec::new();
    let mut missing = Vec::new();
    for ((key, (api_version, child)), found) in wanted.into_iter().zip(discovered) {
        let entry = match found {
            Ok((_, caps)) if caps.scope != Scope::Namespaced => {
                Err(format!("{} is cluster-scoped", child.kind))
            }
            Ok((ar, _)) => {
                // One watch per `group/Kind`, on the first version the cluster serves.
                let kind = children::kind_key(&api_version, &child.kind);
                if let std::collections::btree_map::Entry::Vacant(slot) = watched.entry(kind) {
                    let (more, watch) = Watched::new(slot.key(), &ar, &settings.scopes());
                    writers.extend(more);
                    slot.insert(watch);
                }
                Ok(ar)
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {
                missing.push((
                    key.clone(),
                    GroupVersionKind::gvk(&child.group, &child.version, &child.kind),
                ));
                Err(format!(
                    "the API server does not serve {api_version} {} (is its CRD installed?)",
                    child.kind
                ))
            }
            Err(e) => {
                // Served later, perhaps (a CRD still being established, an API server busy).
                missing.push((
                    key.clone(),
                    GroupVersionKind::gvk(&child.group, &child.version, &child.kind),
                ));
                Err(format!(
                    "discovery of {api_version} {} failed: {e}",
                    child.kind
                ))
            }
        };
        if let Err(why) = &entry {
            tracing::warn!(kind = %child.kind, "children of this kind will be skipped: {why}");
        }
        targets.insert(key, entry);
    }
    let reporter = Reporter {
        controller: FIELD_MANAGER.to_owned(),
        instance: Some(settings.identity.clone()),
    };
    let applies = Arc::new(Applies::default());
    let shared = Shared {
        reports: report::Reports::new(
            client.clone(),
            Recorder::new(client.clone(), reporter),
            applies.clone(),
            fence.clone(),
        ),
        fence,
        applies,
        client,
        registry: RwLock::new(Arc::new(registry)),
        metrics,
        targets: RwLock::new(targets),
        watched: RwLock::new(watched),
        missing: Mutex::new(missing),
        owners: Arc::new(Mutex::new(BTreeMap::new())),
        applied: Mutex::new(BTreeMap::new()),
        owned: Mutex::new(OwnerIndex::default()),
        waiting: Mutex::new(Waiting::default()),
        failures: Mutex::new(BTreeMap::new()),
        writes: tokio::sync::Semaphore::new(usize::from(settings.max_writes_in_flight)),
        budget: budget::Budget::new(settings.render_memory),
        concurrency: settings.concurrency,
        synced: tokio::sync::watch::Sender::new(false),
        stopping: tokio::sync::watch::Sender::new(false),
        render_wait: settings.render_wait,
        rules: settings.rules.clone(),
        levels: Mutex::new(BTreeMap::new()),
    };
    Ok((shared, writers))
}

/// Discovers each of `gvks`: one round trip each, all in flight together.
async fn discover(
    client: &kube::Client,
    gvks: impl Iterator<Item = GroupVersionKind>,
) -> Vec<Result<(ApiResource, ApiCapabilities), kube::Error>> {
    futures::future::join_all(gvks.map(|gvk| async move { pinned_kind(client, &gvk).await })).await
}

/// Says when a watch's first list has reached its store. (`Store::wait_until_ready` wakes only
/// the last of several waiters, and the controller already waits on its own store.)
pub(crate) struct FirstList(tokio::sync::watch::Sender<bool>);

/// Turns true once the watch's first list is in its store.
pub(crate) type FirstListDone = tokio::sync::watch::Receiver<bool>;

impl FirstList {
    pub(crate) fn new() -> (Self, FirstListDone) {
        let (tx, rx) = tokio::sync::watch::channel(false);
        (Self(tx), rx)
    }

    /// Says the first list is done (for a watch read without a reflector's `inspect`).
    pub(crate) fn done(self) {
        self.0.send_replace(true);
    }

    /// Another receiver of the same signal.
    pub(crate) fn subscribe(&self) -> FirstListDone {
        self.0.subscribe()
    }

    /// For `inspect` after the reflector, which has applied each event to the store by then.
    pub(crate) fn observer<K>(self) -> impl FnMut(&Result<watcher::Event<K>, watcher::Error>) {
        move |event| {
            if let Ok(watcher::Event::InitDone) = event {
                self.0.send_replace(true);
            }
        }
    }
}

/// Counts and logs a watch's errors (the watch retries them with backoff), and notes when it
/// works again, for `/readyz`.
pub(crate) fn watch_health<K>(
    metrics: &Metrics,
    watch: &str,
    event: &Result<watcher::Event<K>, watcher::Error>,
) {
    match event {
        // `Init` comes before a list is tried: it says nothing of whether the list works.
        Ok(watcher::Event::Init) => {}
        Ok(_) => metrics.watch_ok(watch),
        Err(e) => {
            metrics.watch_error(watch);
            tracing::warn!(%watch, "watch failed (retrying with backoff): {e}");
        }
    }
}

/// How often the child kinds not served at start are looked for again.
const REDISCOVER: Duration = Duration::from_secs(5);

/// Looks for the child kinds whose CRD was not installed at start (the Prometheus Operator's
/// ServiceMonitor, installed after the operator). When one appears: watch it, wait for its first
/// list, then apply it from then on, and reconcile every resource, so that the children that were
/// skipped are applied within seconds, with no restart.
async fn rediscover(shared: Arc<Shared>, settings: Settings, controllers: Arc<Controllers>) {
    let mut stop = controllers.stop.subscribe();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(REDISCOVER) => {}
            _ = stop.recv() => return,
        }
        controllers.start_found(&shared, &settings).await;
        find_missing(&shared, &settings, &controllers).await;
    }
}

/// Looks for the declared child kinds not served yet ([`Shared::missing`]); each found is
/// watched, and applied once its watch has listed; then every resource is reconciled, so that
/// the children skipped meanwhile are applied.
pub(crate) async fn find_missing(
    shared: &Arc<Shared>,
    settings: &Settings,
    controllers: &Controllers,
) {
    // One search at a time (the periodic one, and a plugin loaded live), so that no kind is
    // watched twice.
    let _one = controllers.finding.lock().await;
    let missing = lock(&shared.missing).clone();
    if missing.is_empty() {
        return;
    }
    let found = discover(&shared.client, missing.iter().map(|(_, gvk)| gvk.clone())).await;
    let mut served = Vec::new();
    for ((key, gvk), found) in missing.into_iter().zip(found) {
        match found {
            Ok((ar, caps)) if caps.scope == Scope::Namespaced => served.push((key, ar)),
            Ok(_) => {
                tracing::warn!(kind = %gvk.kind, "installed, but cluster-scoped: children of this kind stay skipped");
                lock(&shared.missing).retain(|(k, _)| *k != key);
            }
            Err(_) => {}
        }
    }
    if served.is_empty() {
        return;
    }
    let mut writers = Vec::new();
    let mut stores = Vec::new();
    for (_, ar) in &served {
        let kind = children::kind_key(&ar.api_version, &ar.kind);
        if !read(&shared.watched).contains_key(&kind) {
            let (more, watch) = Watched::new(&kind, ar, &settings.scopes());
            writers.extend(more);
            stores.push((kind, watch));
        }
    }
    let listed = children::watch_children(shared, writers);
    for (name, mut done) in listed {
        if tokio::time::timeout(SYNC_TIMEOUT, done.wait_for(|d| *d))
            .await
            .is_err()
        {
            tracing::warn!(watch = %name, "not listed after {SYNC_TIMEOUT:?}; applying it anyway");
        }
    }
    {
        let mut watched = write(&shared.watched);
        watched.extend(stores);
    }
    {
        let mut targets = write(&shared.targets);
        let mut missing = lock(&shared.missing);
        for (key, ar) in served {
            tracing::info!(kind = %ar.kind, group = %ar.group, "now served: its children are applied from now on");
            missing.retain(|(k, _)| *k != key);
            targets.insert(key, Ok(ar));
        }
    }
    controllers.rescan_all();
}

/// The controllers of one served Kind (one per watched namespace).
struct KindControllers {
    /// Turns true to stop them.
    stop: watch::Sender<bool>,
    /// Each asks its controller to reconcile every resource of the Kind.
    rescans: Vec<mpsc::UnboundedSender<()>>,
}

impl KindControllers {
    fn rescan(&self) {
        for rescan in &self.rescans {
            let _ = rescan.unbounded_send(());
        }
    }
}

/// The controllers of the served Kinds: those running, and the Kinds whose CRD was not
/// installed at start.
pub(crate) struct Controllers {
    /// Fires when the operator stops (shutdown, or the Lease lost).
    stop: tokio::sync::broadcast::Sender<()>,
    /// Turns true when the operator stops, and stays so: a controller started after that (by
    /// a plugin loaded at that moment) does not start.
    stopping: watch::Receiver<bool>,
    running: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Served Kinds not installed yet: the plugin's name, the Kind, what to discover.
    unserved: Mutex<Vec<(String, crate::types::KindInfo, GroupVersionKind)>>,
    /// The controllers of each served Kind, by `apiVersion/Kind`.
    kinds: Mutex<BTreeMap<String, KindControllers>>,
    /// Held while missing child kinds are looked for ([`find_missing`]).
    finding: tokio::sync::Mutex<()>,
}

impl Controllers {
    /// Starts the controllers of `kind`, served by the cluster as `ar`: one per scope (all
    /// namespaces, or each watched namespace). Returns, for each, what says when its watch has
    /// first listed.
    fn start(
        &self,
        shared: &Arc<Shared>,
        settings: &Settings,
        plugin: &str,
        kind: &crate::types::KindInfo,
        ar: ApiResource,
    ) -> Vec<(String, FirstListDone)> {
        if *self.stopping.borrow() {
            return Vec::new();
        }
        let controller = format!("{}.{}", kind.plural, kind.group);
        let ctx = Arc::new(KindCtx {
            shared: shared.clone(),
            ar: ar.clone(),
            controller: controller.clone(),
        });
        let key = format!("{}/{}", ar.api_version, ar.kind);
        let kind_stop = lock(&self.kinds)
            .entry(key.clone())
            .or_insert_with(|| KindControllers {
                stop: watch::channel(false).0,
                rescans: Vec::new(),
            })
            .stop
            .subscribe();
        let mut listed = Vec::new();
        for scope in settings.scopes() {
            let (api, watch) =
                scoped::<DynamicObject>(&shared.client, scope.as_deref(), &ar, &controller);
            let (tx, rx) = mpsc::unbounded();
            lock(&shared.owners)
                .entry(format!("{}/{}", ar.api_version, ar.kind))
                .or_insert_with(|| (ar.clone(), Vec::new()))
                .1
                .push((scope.clone(), tx));
            let (rescan, rescanned) = mpsc::unbounded();
            if let Some(k) = lock(&self.kinds).get_mut(&key) {
                k.rescans.push(rescan);
            }
            // The operator stops, or this Kind is no longer served.
            let stopped = {
                let (stop, kind_stop) = (self.stopping.clone(), kind_stop.clone());
                move || {
                    let (mut stop, mut kind_stop) = (stop.clone(), kind_stop.clone());
                    async move {
                        tokio::select! {
                            _ = stop.wait_for(|s| *s) => {}
                            _ = kind_stop.wait_for(|s| *s) => {}
                        }
                    }
                }
            };
            // A resource is rendered again when what its render reads changes (spec, labels,
            // annotations), not when only its status does: most of its updates are our own
            // status writes. Children's events, resyncs and retries reach it through the
            // scheduler.
            let writer = reflector::store::Writer::<DynamicObject>::new(ar.clone());
            let reader = writer.as_reader();
            let (first_list, done) = FirstList::new();
            let health = (shared.metrics.clone(), watch.clone());
            let trigger =
                reflector::reflector(writer, watcher(api, watch_config()).modify(trim_resource))
                    .inspect(first_list.observer())
                    .inspect(move |event| watch_health(&health.0, &health.1, event))
                    .default_backoff()
                    .applied_objects()
                    .predicate_filter(render_input, PredicateConfig::default());
            let name = watch.clone();
            let watch_name = watch.clone();
            let run = Controller::for_stream_with(trigger, reader, ar.clone())
                .with_config(
                    kube::runtime::controller::Config::default().concurrency(settings.concurrency),
                )
                .reconcile_on(rx)
                .reconcile_all_on(rescanned)
                .graceful_shutdown_on(stopped())
                .run(reconcile::reconcile, reconcile::error_policy, ctx.clone())
                .for_each(move |result| {
                    // A reconciler's failure was logged and counted by `reconcile`; anything
                    // else (a queue or store error) would otherwise go unseen.
                    if let Err(e) = result
                        && !matches!(e, kube::runtime::controller::Error::ReconcilerFailed(..))
                    {
                        tracing::warn!(controller = %name, "controller: {e}");
                    }
                    futures::future::ready(())
                });
            // kube holds a controller's runner until its store has listed, through a graceful
            // shutdown too: a watch whose list is refused (no RBAC for it) or never answered
            // would hold the operator's shutdown forever. Nothing of such a Kind can be
            // reconciling (nothing is before the list), so its controller is dropped at once.
            let unlisted = done.clone();
            let run = async move {
                tokio::select! {
                    () = run => {}
                    () = async move {
                        stopped().await;
                        if *unlisted.borrow() {
                            std::future::pending::<()>().await;
                        }
                    } => {
                        tracing::debug!(controller = %watch_name, "stopped before its first list");
                    }
                }
            };
            tracing::info!(controller = %watch, %plugin, "controller started");
            let mut running = lock(&self.running);
            // Controllers of Kinds stopped since (a plugin upgraded or removed) are let go.
            running.retain(|c| !c.is_finished());
            running.push(tokio::spawn(run));
            listed.push((watch, done));
        }
        listed
    }

    /// Whether the controllers of `apiVersion/Kind` run.
    pub(crate) fn serves(&self, key: &str) -> bool {
        lock(&self.kinds).contains_key(key)
    }

    /// Asks the controllers of `apiVersion/Kind` to reconcile every resource of it.
    pub(crate) fn rescan(&self, key: &str) {
        if let Some(k) = lock(&self.kinds).get(key) {
            k.rescan();
        }
    }

    /// Asks every controller to reconcile every resource of its Kind.
    fn rescan_all(&self) {
        for k in lock(&self.kinds).values() {
            k.rescan();
        }
    }

    /// Stops the controllers of `apiVersion/Kind` (its plugin is gone); resources of it are
    /// left as they are.
    pub(crate) fn stop_kind(&self, shared: &Shared, key: &str) {
        if let Some(k) = lock(&self.kinds).remove(key) {
            let _ = k.stop.send(true);
        }
        lock(&shared.owners).remove(key);
        lock(&self.unserved).retain(|(_, kind, gvk)| {
            format!("{}/{}/{}", gvk.group, gvk.version, kind.kind).trim_start_matches('/') != key
        });
    }

    /// Starts the controllers of the served Kinds whose CRD has been installed since.
    async fn start_found(&self, shared: &Arc<Shared>, settings: &Settings) {
        let unserved = lock(&self.unserved).clone();
        if unserved.is_empty() {
            return;
        }
        let found = discover(
            &shared.client,
            unserved.iter().map(|(_, _, gvk)| gvk.clone()),
        )
        .await;
        for ((plugin, kind, gvk), found) in unserved.into_iter().zip(found) {
            if let Ok((ar, _)) = found {
                lock(&self.unserved).retain(|(_, _, g)| *g != gvk);
                tracing::info!(kind = %kind.kind, group = %kind.group, "its CRD is installed now: serving it");
                self.start(shared, settings, &plugin, &kind, ar);
            }
        }
    }
}

/// How long reconciliation waits for every watch's first list before it starts anyway.
const SYNC_TIMEOUT: Duration = Duration::from_secs(30);

/// How every watch lists: from the API server's watch cache (`resourceVersion=0`), in pages.
pub(crate) fn watch_config() -> watcher::Config {
    watcher::Config::default().any_semantic()
}

/// A hash of what a render reads from a resource besides its name: generation (the spec),
/// labels and annotations; and its uid, so that a resource created again under the same name
/// counts as new.
fn render_input(obj: &DynamicObject) -> Option<u64> {
    let mut h = std::hash::DefaultHasher::new();
    let meta = &obj.metadata;
    (
        &meta.uid,
        meta.generation,
        &meta.labels,
        &meta.annotations,
        meta.deletion_timestamp.is_some(),
    )
        .hash(&mut h);
    Some(h.finish())
}

/// How long to wait after the `n`th failure in a row: 1 s doubling to 5 minutes.
pub(crate) fn backoff(n: u32) -> Action {
    Action::requeue(backoff_delay(n))
}

/// The wait of [`backoff`].
pub(crate) fn backoff_delay(n: u32) -> Duration {
    let secs = 1u64
        .checked_shl(n.saturating_sub(1).min(9))
        .unwrap_or(300)
        .min(300);
    Duration::from_secs(secs)
}
