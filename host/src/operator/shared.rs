//! What the controllers share: the plugins served, the caches of children, the budgets and
//! slots, the fence; the locks over them; and each Kind's context.

use super::*;

/// Why children of a declared kind cannot be applied (for now): said in the status of every
/// resource that renders one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Unserved {
    /// Children must live in their owner's namespace.
    #[error("{kind} is cluster-scoped")]
    ClusterScoped { kind: String },
    /// Discovery found no such kind (looked for again every few seconds).
    #[error("the API server does not serve {api_version} {kind} (is its CRD installed?)")]
    NotServed { api_version: String, kind: String },
    /// Discovery failed (looked for again every few seconds).
    #[error("discovery of {api_version} {kind} failed: {reason}")]
    Discovery {
        api_version: String,
        kind: String,
        /// The API server's answer.
        reason: String,
    },
    /// A plugin loaded since the start declares it; discovery has not answered yet.
    #[error("{api_version} {kind} is being looked for")]
    LookingFor { api_version: String, kind: String },
}

/// What every controller shares.
pub(crate) struct Shared {
    pub client: kube::Client,
    /// The connections watches take a place on (`crate::connection`).
    pub watches: crate::connection::Watches,
    /// The plugins served: swapped whole when a `Plugin` resource comes, changes or goes; a
    /// render holds the one it started with.
    pub registry: RwLock<Arc<Registry>>,
    pub reports: report::Reports,
    pub metrics: Arc<Metrics>,
    /// Where each declared child kind is applied, by `group/version/Kind`: `Err` says why it
    /// cannot be (its CRD is not installed, it is cluster-scoped, ...).
    pub targets: RwLock<BTreeMap<String, Result<ApiResource, Unserved>>>,
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
    /// The applies and deletes in flight, within a limit that follows the API server's answers
    /// (`Settings::max_writes_in_flight` at most); the replica's, shared by its shards.
    pub writes: Arc<super::writes::Writes>,
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
    /// The one shard served (see [`super::shard`]); `None`: every resource.
    pub shard: Option<super::shard::Shard>,
    /// The resources this pipeline moved to another shard, by uid: the resourceVersion each had
    /// then (for the pipeline's life: an entry per resource at most).
    pub labelled: Mutex<BTreeMap<String, String>>,
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

    /// Sends one write (`verb`: apply, delete) of a child or of a resource's shard label in
    /// `namespace`, within the limits of writes in flight, counted in
    /// `wasm_operator_api_writes_total`.
    pub(crate) async fn write<T>(
        &self,
        verb: &str,
        namespace: &str,
        ar: &ApiResource,
        call: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, kube::Error> {
        // A replica that may not write (its Lease not renewed in time) sends nothing: checked
        // once the write's slot is taken, since waiting for one may outlast the Lease, and
        // bounded in time, so that a write let through ends before another replica may lead.
        if !self.fence.allows() {
            return Err(not_leading());
        }
        let slot = self.writes.slot(namespace).await;
        if !self.fence.allows() {
            return Err(not_leading());
        }
        self.metrics
            .write(verb, &format!("{}.{}", ar.plural, ar.group));
        let result = self.fence.bounded(call).await;
        // How long it took says whether the API server keeps up; a 429 says it sheds load.
        slot.done(refused(&result));
        result
    }

    /// Reads (GET) one object in `namespace` that the watches know by name only
    /// (`reconcile::read_name_only`), within the same limits as the writes, counted in
    /// `wasm_operator_api_reads_total`. A render may name up to `--plugin-max-manifests` such
    /// objects: their reads wait in the namespace's limit as its writes do, so that one tenant's
    /// many reads delay only its own namespace, and the replica sends no more requests at once
    /// than its writes may.
    pub(crate) async fn read_by_name<T>(
        &self,
        namespace: &str,
        ar: &ApiResource,
        call: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, kube::Error> {
        let slot = self.writes.slot(namespace).await;
        self.metrics.read(&format!("{}.{}", ar.plural, ar.group));
        let result = self.fence.bounded(call).await;
        slot.done_read(refused(&result));
        result
    }
}

/// Whether the API server refused a request with 429 (its client's retries spent): it sheds
/// load.
fn refused<T>(result: &Result<T, kube::Error>) -> bool {
    matches!(result, Err(kube::Error::Api(s)) if s.code == 429)
}

/// A declared child kind's key: `group/version/Kind`.
pub(super) fn gvk_key(api_version: &str, kind: &str) -> String {
    let (g, v) = split_api_version(api_version);
    format!("{g}/{v}/{kind}")
}

/// The context of one Kind's controller.
pub(crate) struct KindCtx {
    pub shared: Arc<Shared>,
    pub ar: Arc<ApiResource>,
    pub controller: String,
    /// The settled resources its watch's lists hold back (see `settling`).
    pub settling: Arc<super::settling::Settling>,
    /// What its watch has seen of its resources: a reconciliation's copy is what it was when
    /// the reconciliation began.
    pub store: kube::runtime::reflector::Store<super::Served>,
}

impl KindCtx {
    /// The resource `name` in `namespace` as its watch has it now.
    pub(crate) fn latest(&self, namespace: &str, name: &str) -> Option<Arc<super::Served>> {
        self.store
            .get(&super::Served::reference(&self.ar, namespace, name))
    }

    /// The name of the plugin that serves the Kind now (the metrics' `plugin` label), and
    /// `name@version (sha256 prefix)` of it, for status. Looked up at each use: a `Plugin`
    /// resource may swap the plugin while the controller runs.
    pub(crate) fn plugin(&self) -> (String, String) {
        match self
            .shared
            .registry()
            .lookup(&self.ar.api_version, &self.ar.kind)
        {
            Ok((p, _)) => (p.name().to_owned(), super::status::plugin_label(p)),
            Err(e) => (String::new(), e.to_string()),
        }
    }
}
