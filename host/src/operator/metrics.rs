//! Metrics (controller-runtime's names, plus the plugins'), and the `/healthz`, `/readyz` and
//! `/metrics` endpoints.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// `controller` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    /// The Kind's controller, `<plural>.<group>`.
    pub controller: String,
}

/// `controller` and `result` labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// The Kind's controller.
    pub controller: String,
    /// `success`, `error` or `requeue`.
    pub result: String,
}

/// `plugin` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginLabels {
    /// The plugin's name.
    pub plugin: String,
}

/// `plugin` and `reason` labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabels {
    /// The plugin's name.
    pub plugin: String,
    /// CamelCase reason.
    pub reason: String,
}

/// `verb` and `resource` labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    /// `apply`, `apply_status`, `delete` or `event`.
    pub verb: String,
    /// The resource written, `<plural>.<group>`.
    pub resource: String,
}

/// `resource` label of a read.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReadLabels {
    /// The resource read, `<plural>.<group>`.
    pub resource: String,
}

/// `watch` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WatchLabels {
    /// The watch: a served Kind's controller (`<plural>.<group>`) or a child kind (`group/Kind`).
    pub watch: String,
}

/// `shard` label: a shard's index (`--shards`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShardLabels {
    pub shard: String,
}

/// `name` label: the Lease.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LeaseLabels {
    /// The Lease's name.
    pub name: String,
}

/// The labels of `wasm_operator_build_info`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    /// The operator's version.
    pub version: String,
    /// The plugin contract it serves (`wasm-operator:plugin@X.Y.Z`).
    pub contract: String,
}

/// The labels of `wasm_operator_plugin_info`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginInfoLabels {
    /// The plugin's name.
    pub plugin: String,
    /// Its version.
    pub version: String,
    /// The sha256 of its component (`sha256:...`).
    pub sha256: String,
    /// Where it comes from: `builtin`, a file, `oci://...` or `Plugin/NAME`.
    pub source: String,
}

/// `name` label: the controller, `<plural>.<group>`, as client-go's workqueue metrics name a
/// queue.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct NameLabels {
    /// The Kind's controller.
    pub name: String,
}

/// `workqueue_unfinished_work_seconds` and `workqueue_longest_running_processor_seconds` of each
/// controller, from the reconciliations in flight at the scrape.
#[derive(Debug)]
struct Unfinished(Arc<Mutex<Health>>);

impl prometheus_client::collector::Collector for Unfinished {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric as _;
        use prometheus_client::metrics::gauge::ConstGauge;
        let now = Instant::now();
        // controller: (the seconds all its reconciliations in flight have run, the longest)
        let mut by_controller: BTreeMap<String, (f64, f64)> = BTreeMap::new();
        for (controller, started) in super::lock(&self.0).running.values() {
            let ran = now.duration_since(*started).as_secs_f64();
            let entry = by_controller.entry(controller.clone()).or_default();
            entry.0 += ran;
            entry.1 = entry.1.max(ran);
        }
        for (name, help, longest) in [
            (
                "workqueue_unfinished_work_seconds",
                "Seconds the reconciliations in flight have run, together",
                false,
            ),
            (
                "workqueue_longest_running_processor_seconds",
                "Seconds the longest reconciliation in flight has run",
                true,
            ),
        ] {
            let mut family = encoder.encode_descriptor(
                name,
                help,
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            for (controller, (total, max)) in &by_controller {
                let labels = NameLabels {
                    name: controller.clone(),
                };
                let gauge = ConstGauge::new(if longest { *max } else { *total });
                gauge.encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// How long a watch may keep failing before `/readyz` says the operator is not ready, unless
/// set otherwise (`host run --unready-after`).
pub const WATCH_FAILING: Duration = Duration::from_secs(30);
/// A failure this long after the previous one starts a new run of failures. The watch's backoff
/// waits at most 30 s plus as much jitter between tries, so a watch that keeps failing fails
/// again within this; a quiet watch that failed once is not failing for ever.
const WATCH_QUIET: Duration = Duration::from_secs(75);
/// The least time one reconciliation may run before `/healthz` reports the reconcile loop stuck,
/// unless set otherwise (`host run --stuck-after`).
pub const RECONCILE_STUCK: Duration = Duration::from_secs(120);

/// When a watch's current run of failures began and when it last failed.
#[derive(Debug, Clone, Copy)]
struct Failing {
    since: Instant,
    last: Instant,
    /// Failures in this run.
    count: u32,
}

/// Health that `/readyz` and `/healthz` read: failing watches and reconciliations in flight.
#[derive(Debug)]
struct Health {
    watches: BTreeMap<String, Failing>,
    /// Reconciliations in flight: their controller and when they started.
    running: BTreeMap<u64, (String, Instant)>,
    next: u64,
    failing_after: Duration,
    stuck_after: Duration,
}

impl Default for Health {
    fn default() -> Self {
        Self {
            watches: BTreeMap::new(),
            running: BTreeMap::new(),
            next: 0,
            failing_after: WATCH_FAILING,
            stuck_after: RECONCILE_STUCK,
        }
    }
}

impl Health {
    fn watch_failed(&mut self, watch: &str, now: Instant) {
        let entry = self.watches.entry(watch.to_owned()).or_insert(Failing {
            since: now,
            last: now,
            count: 0,
        });
        if now.duration_since(entry.last) > WATCH_QUIET {
            entry.since = now;
            entry.count = 0;
        }
        entry.last = now;
        entry.count += 1;
    }

    /// The watches that have failed for longer than `failing_after` and are still failing.
    fn failing_watches(&self, now: Instant) -> Vec<String> {
        self.watches
            .iter()
            .filter(|(_, f)| {
                // Failed again and again over `failing_after`, and lately: one error, after which
                // the watch works on quietly, is not a failing watch.
                f.count >= 2
                    && now.duration_since(f.last) <= WATCH_QUIET
                    && f.last.duration_since(f.since) >= self.failing_after
            })
            .map(|(w, _)| w.clone())
            .collect()
    }

    /// How long the oldest reconciliation in flight has run.
    fn longest_running(&self, now: Instant) -> Option<Duration> {
        self.running
            .values()
            .map(|(_, started)| now.duration_since(*started))
            .max()
    }
}

/// Every metric the operator exports.
pub struct Metrics {
    registry: Registry,
    /// Every series name a scrape can hold, samples or not yet.
    series: std::collections::BTreeSet<String>,
    /// `controller_runtime_reconcile_total`.
    pub reconcile_total: Family<ResultLabels, Counter>,
    /// `controller_runtime_reconcile_errors_total`.
    pub reconcile_errors: Family<ControllerLabels, Counter>,
    /// `controller_runtime_reconcile_time_seconds`.
    pub reconcile_time: Family<ControllerLabels, Histogram>,
    /// `controller_runtime_active_workers`.
    pub active_workers: Family<ControllerLabels, Gauge>,
    /// `wasm_operator_plugin_render_seconds`.
    pub render_time: Family<PluginLabels, Histogram>,
    /// `wasm_operator_plugin_render_failures_total`.
    pub render_failures: Family<FailureLabels, Counter>,
    /// `wasm_operator_render_budget_wait_seconds`: how long plugin calls waited for their share
    /// of the memory budget (`--render-memory`).
    pub budget_wait: Histogram,
    /// `wasm_operator_render_budget_timeouts_total`: reconciliations that did not get their
    /// share in time, left their slot and were tried again.
    pub budget_timeouts: Counter,
    /// `wasm_operator_api_writes_total`: every write request the operator sends.
    pub writes: Family<WriteLabels, Counter>,
    /// `wasm_operator_api_reads_total`: objects the watches know by name only, read from the
    /// API server because a render or a status record names them.
    pub reads: Family<ReadLabels, Counter>,
    /// `wasm_operator_watch_errors_total`: errors of the watches, by watch.
    pub watch_errors: Family<WatchLabels, Counter>,
    /// `wasm_operator_report_errors_total`: status and event writes that failed.
    pub report_errors: Family<WriteLabels, Counter>,
    /// `wasm_operator_plugins_prefetched`: the `Plugin`s a standby holds loaded (pulled,
    /// compiled, checked) for when it leads.
    pub plugins_prefetched: Gauge,
    /// `wasm_operator_reports_pending`: status writes and events queued or being written.
    pub reports_pending: Gauge,
    /// `wasm_operator_api_writes_limit`: how many applies and deletes may be in flight now
    /// (at most `--max-writes-in-flight`, fewer after the API server answered 429).
    pub writes_limit: Gauge,
    /// `wasm_operator_api_writes_limited_namespaces`: namespaces whose own limit of writes in
    /// flight is below `--max-writes-in-flight`, their writes having been answered slowly.
    pub writes_limited_namespaces: Gauge,
    /// `leader_election_master_status`: 1 while this replica leads, by Lease.
    pub leader: Family<LeaseLabels, Gauge>,
    /// `wasm_operator_shards_held`: whether this replica holds each shard (1) or not (0), by
    /// its index; with `--shards`.
    pub shards_held: Family<ShardLabels, Gauge>,
    /// `wasm_operator_plugin_info`: 1 for each plugin served, with its version and digest.
    pub plugin_info: Family<PluginInfoLabels, Gauge>,
    /// `wasm_operator_plugin_resource_ready`: whether each Plugin resource is Ready (1) or not
    /// (0), by its name.
    pub plugin_ready: Family<PluginLabels, Gauge>,
    ready: AtomicBool,
    /// Whether any watch has failed and not worked since (a fast path for every event).
    any_failing: AtomicBool,
    health: Arc<Mutex<Health>>,
    /// Resources each controller was asked to reconcile and has not started: when each was
    /// first asked, by controller and `namespace/name`.
    pending: Mutex<BTreeMap<(String, String), Instant>>,
    /// `workqueue_adds_total`.
    pub queue_adds: Family<NameLabels, Counter>,
    /// `workqueue_depth`.
    pub queue_depth: Family<NameLabels, Gauge>,
    /// `workqueue_queue_duration_seconds`.
    pub queue_latency: Family<NameLabels, Histogram>,
    /// `workqueue_work_duration_seconds`.
    pub work_duration: Family<NameLabels, Histogram>,
    /// `workqueue_retries_total`.
    pub queue_retries: Family<NameLabels, Counter>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        // Each series name a scrape can hold (see [`Metrics::series`]).
        let mut series = std::collections::BTreeSet::new();
        let reconcile_total = Family::<ResultLabels, Counter>::default();
        let reconcile_errors = Family::<ControllerLabels, Counter>::default();
        let reconcile_time = Family::<ControllerLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 2.0, 15))
        });
        let active_workers = Family::<ControllerLabels, Gauge>::default();
        let render_time = Family::<PluginLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.00002, 2.0, 16))
        });
        let render_failures = Family::<FailureLabels, Counter>::default();
        let budget_wait = Histogram::new(exponential_buckets(0.0001, 4.0, 10));
        let budget_timeouts = Counter::default();
        register(
            &mut registry,
            &mut series,
            "wasm_operator_render_budget_wait_seconds",
            "Time plugin calls waited for their share of the memory budget (--render-memory)",
            budget_wait.clone(),
        );
        register(
            &mut registry,
            &mut series,
            "wasm_operator_render_budget_timeouts",
            "Reconciliations that waited too long for their share of the memory budget and were tried again",
            budget_timeouts.clone(),
        );
        let writes = Family::<WriteLabels, Counter>::default();
        let watch_errors = Family::<WatchLabels, Counter>::default();
        let report_errors = Family::<WriteLabels, Counter>::default();
        let plugins_prefetched = Gauge::default();
        let reports_pending = Gauge::default();
        let writes_limit = Gauge::default();
        register(
            &mut registry,
            &mut series,
            "wasm_operator_api_writes_limit",
            "Applies and deletes that may be in flight now: at most --max-writes-in-flight, fewer after the API server answered 429",
            writes_limit.clone(),
        );
        let writes_limited_namespaces = Gauge::default();
        register(
            &mut registry,
            &mut series,
            "wasm_operator_api_writes_limited_namespaces",
            "Namespaces whose writes were answered slowly, held to fewer in flight than --max-writes-in-flight",
            writes_limited_namespaces.clone(),
        );
        register(
            &mut registry,
            &mut series,
            "wasm_operator_reports_pending",
            "Status writes and events queued or being written",
            reports_pending.clone(),
        );
        register(
            &mut registry,
            &mut series,
            "wasm_operator_plugins_prefetched",
            "Plugin resources a standby replica holds loaded for when it leads",
            plugins_prefetched.clone(),
        );
        register(
            &mut registry,
            &mut series,
            "wasm_operator_watch_errors",
            "Errors of the watches (each is retried with backoff)",
            watch_errors.clone(),
        );
        register(
            &mut registry,
            &mut series,
            "wasm_operator_report_errors",
            "Status and event writes that failed",
            report_errors.clone(),
        );
        register(
            &mut registry,
            &mut series,
            "controller_runtime_reconcile",
            "Reconciliations per controller and result",
            reconcile_total.clone(),
        );
        register(
            &mut registry,
            &mut series,
            "controller_runtime_reconcile_errors",
            "Reconciliations that failed",
            reconcile_errors.clone(),
        );
        register(
            &mut registry,
            &mut series,
            "controller_runtime_reconcile_time_seconds",
            "Time per reconciliation",
            reconcile_time.clone(),
        );
        register(
            &mut registry,
            &mut series,
            "controller_runtime_active_workers",
            "Reconciliations in flight",
            active_workers.clone(),
        );
        register(
            &mut registry,
            &mut series,
            "wasm_operator_plugin_render_seconds",
            "Time per plugin render, sandbox included",
            render_time.clone(),
        );
        register(
            &mut registry,
            &mut series,
            "wasm_operator_plugin_render_failures",
            "Renders that failed, by reason",
            render_failures.clone(),
        );
        register(
            &mut registry,
            &mut series,
            "wasm_operator_api_writes",
            "Write requests sent to the API server",
            writes.clone(),
        );
        let reads = Family::<ReadLabels, Counter>::default();
        register(
            &mut registry,
            &mut series,
            "wasm_operator_api_reads",
            "Objects the watches know by name only, read from the API server because a render or a status record names them",
            reads.clone(),
        );
        let leader = Family::<LeaseLabels, Gauge>::default();
        register(
            &mut registry,
            &mut series,
            "leader_election_master_status",
            "Whether this replica leads (1) or waits (0), by Lease",
            leader.clone(),
        );
        let shards_held = Family::<ShardLabels, Gauge>::default();
        register(
            &mut registry,
            &mut series,
            "wasm_operator_shards_held",
            "Whether this replica holds each shard (1) or not (0), by shard",
            shards_held.clone(),
        );
        let build = Family::<BuildLabels, Gauge>::default();
        build
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION").to_owned(),
                contract: env!("CONTRACT_VERSION").to_owned(),
            })
            .set(1);
        register(
            &mut registry,
            &mut series,
            "wasm_operator_build_info",
            "The operator's version and the plugin contract it serves (always 1)",
            build,
        );
        let plugin_info = Family::<PluginInfoLabels, Gauge>::default();
        register(
            &mut registry,
            &mut series,
            "wasm_operator_plugin_info",
            "Each plugin served, with its version, digest and source (always 1)",
            plugin_info.clone(),
        );
        let plugin_ready = Family::<PluginLabels, Gauge>::default();
        register(
            &mut registry,
            &mut series,
            "wasm_operator_plugin_resource_ready",
            "Whether each Plugin resource is served as it asks (1) or not (0): its Ready condition",
            plugin_ready.clone(),
        );
        registry.register_collector(Box::new(super::process::ProcessCollector));
        series.extend(super::process::SERIES.iter().map(|s| (*s).to_owned()));
        // The work queues, as controller-runtime's (client-go's) workqueue metrics describe
        // theirs; kube's controller keeps its queue to itself, so they are counted around it.
        let queue_adds = Family::<NameLabels, Counter>::default();
        let queue_depth = Family::<NameLabels, Gauge>::default();
        let queue_latency = Family::<NameLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 4.0, 10))
        });
        let work_duration = Family::<NameLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 4.0, 10))
        });
        let queue_retries = Family::<NameLabels, Counter>::default();
        register(
            &mut registry,
            &mut series,
            "workqueue_adds",
            "Resources a controller was asked to reconcile (by a change, a child's change, a requeue or a retry)",
            queue_adds.clone(),
        );
        register(
            &mut registry,
            &mut series,
            "workqueue_depth",
            "Resources a controller was asked to reconcile and has not started",
            queue_depth.clone(),
        );
        register(
            &mut registry,
            &mut series,
            "workqueue_queue_duration_seconds",
            "How long a resource waited between the change that asked for it and its reconciliation",
            queue_latency.clone(),
        );
        register(
            &mut registry,
            &mut series,
            "workqueue_work_duration_seconds",
            "How long a reconciliation took",
            work_duration.clone(),
        );
        register(
            &mut registry,
            &mut series,
            "workqueue_retries",
            "Reconciliations retried after a failure",
            queue_retries.clone(),
        );
        let health = Arc::new(Mutex::new(Health::default()));
        registry.register_collector(Box::new(Unfinished(health.clone())));
        series.extend(
            [
                "workqueue_unfinished_work_seconds",
                "workqueue_longest_running_processor_seconds",
            ]
            .map(str::to_owned),
        );
        Self {
            registry,
            series,
            leader,
            shards_held,
            plugin_info,
            plugin_ready,
            reconcile_total,
            reconcile_errors,
            reconcile_time,
            active_workers,
            render_time,
            render_failures,
            budget_wait,
            budget_timeouts,
            writes,
            reads,
            watch_errors,
            report_errors,
            plugins_prefetched,
            reports_pending,
            writes_limit,
            writes_limited_namespaces,
            ready: AtomicBool::new(false),
            any_failing: AtomicBool::new(false),
            health,
            pending: Mutex::new(BTreeMap::new()),
            queue_adds,
            queue_depth,
            queue_latency,
            work_duration,
            queue_retries,
        }
    }
}

impl Metrics {
    /// Counts one write request.
    pub fn write(&self, verb: &str, resource: &str) {
        self.writes
            .get_or_create(&WriteLabels {
                verb: verb.to_owned(),
                resource: resource.to_owned(),
            })
            .inc();
    }

    /// Counts one read of an object known by name only.
    pub fn read(&self, resource: &str) {
        self.reads
            .get_or_create(&ReadLabels {
                resource: resource.to_owned(),
            })
            .inc();
    }

    /// Counts an error of `watch` and notes that it is failing.
    pub fn watch_error(&self, watch: &str) {
        self.watch_errors
            .get_or_create(&WatchLabels {
                watch: watch.to_owned(),
            })
            .inc();
        self.health().watch_failed(watch, Instant::now());
        self.any_failing.store(true, Ordering::Relaxed);
    }

    /// Sets how long a watch may keep failing before `/readyz` fails, and how long one
    /// reconciliation may run before `/healthz` fails.
    pub fn set_limits(&self, unready_after: Duration, stuck_after: Duration) {
        let mut health = self.health();
        health.failing_after = unready_after;
        health.stuck_after = stuck_after;
    }

    /// Notes that `watch` works (it delivered objects, or finished a list).
    pub fn watch_ok(&self, watch: &str) {
        if self.any_failing.load(Ordering::Relaxed) {
            let mut health = self.health();
            health.watches.remove(watch);
            self.any_failing
                .store(!health.watches.is_empty(), Ordering::Relaxed);
        }
    }

    /// Marks a reconciliation as running until the returned guard is dropped; `/healthz` fails
    /// while one has run for longer than its limit (see [`Metrics::set_limits`]).
    pub fn running(self: &Arc<Self>, controller: &str) -> Running {
        let mut health = self.health();
        let id = health.next;
        health.next += 1;
        health
            .running
            .insert(id, (controller.to_owned(), Instant::now()));
        Running {
            metrics: self.clone(),
            id,
        }
    }

    fn health(&self) -> std::sync::MutexGuard<'_, Health> {
        super::lock(&self.health)
    }

    /// Why the operator is not ready, if it is not.
    fn not_ready(&self) -> Option<String> {
        if !self.ready.load(Ordering::Relaxed) {
            return Some("not ready: not leading, or the watches have not listed yet".into());
        }
        let health = self.health();
        let failing = health.failing_watches(Instant::now());
        (!failing.is_empty()).then(|| {
            format!(
                "not ready: watches failing for over {:?}: {}",
                health.failing_after,
                failing.join(", ")
            )
        })
    }

    /// Why the operator is not healthy, if it is not.
    fn unhealthy(&self) -> Option<String> {
        let health = self.health();
        let longest = health.longest_running(Instant::now())?;
        let limit = health.stuck_after;
        (longest > limit).then(|| {
            format!("unhealthy: a reconciliation has run for {longest:?} (stuck after {limit:?})")
        })
    }

    /// Marks the operator ready (or not) for `/readyz`.
    /// A controller was asked to reconcile `key` (`namespace/name`): a change of the resource
    /// or of one of its children.
    pub fn queued(&self, controller: &str, key: &str) {
        let labels = NameLabels {
            name: controller.to_owned(),
        };
        let mut pending = super::lock(&self.pending);
        // As client-go counts: a resource already waiting is not added again.
        if let std::collections::btree_map::Entry::Vacant(v) =
            pending.entry((controller.to_owned(), key.to_owned()))
        {
            v.insert(Instant::now());
            self.queue_adds.get_or_create(&labels).inc();
            // Kept by counting under the lock, not by counting the map: at 10,000 resources
            // that was a walk of the map for every event.
            self.queue_depth.get_or_create(&labels).inc();
        }
    }

    /// A controller starts reconciling `key`: how long it waited, when a change asked for it;
    /// a timed requeue or a retry counts as asked now.
    pub fn dequeued(&self, controller: &str, key: &str) {
        let labels = NameLabels {
            name: controller.to_owned(),
        };
        let mut pending = super::lock(&self.pending);
        match pending.remove(&(controller.to_owned(), key.to_owned())) {
            Some(since) => {
                Self::observe(&self.queue_latency.get_or_create(&labels), since.elapsed());
                self.queue_depth.get_or_create(&labels).dec();
            }
            None => {
                self.queue_adds.get_or_create(&labels).inc();
                Self::observe(&self.queue_latency.get_or_create(&labels), Duration::ZERO);
            }
        }
    }

    /// `controller` stopped (its Kind no longer served): nothing of it waits.
    pub fn controller_stopped(&self, controller: &str) {
        let mut pending = super::lock(&self.pending);
        pending.retain(|(c, _), _| c != controller);
        self.queue_depth
            .get_or_create(&NameLabels {
                name: controller.to_owned(),
            })
            .set(0);
    }

    /// `key` was deleted: the controller will not reconcile it for what asked before.
    pub fn forgotten(&self, controller: &str, key: &str) {
        let mut pending = super::lock(&self.pending);
        if pending
            .remove(&(controller.to_owned(), key.to_owned()))
            .is_some()
        {
            self.queue_depth
                .get_or_create(&NameLabels {
                    name: controller.to_owned(),
                })
                .dec();
        }
    }

    /// Says that `plugin` is served (`true`) or no longer (`false`), from `source`.
    pub fn plugin_served(&self, plugin: &crate::plugin::Plugin, source: &str, served: bool) {
        let labels = PluginInfoLabels {
            plugin: plugin.name().to_owned(),
            version: plugin.info().version.clone(),
            sha256: format!("sha256:{}", plugin.sha256()),
            source: source.to_owned(),
        };
        if served {
            self.plugin_info.get_or_create(&labels).set(1);
        } else {
            self.plugin_info.remove(&labels);
        }
    }

    /// Says whether this replica leads on the Lease `name`.
    pub fn set_leader(&self, name: &str, leads: bool) {
        self.leader
            .get_or_create(&LeaseLabels {
                name: name.to_owned(),
            })
            .set(i64::from(leads));
    }

    /// Says whether this replica holds shard `index`.
    pub fn set_shard(&self, index: u32, held: bool) {
        self.shards_held
            .get_or_create(&ShardLabels {
                shard: index.to_string(),
            })
            .set(i64::from(held));
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// Every series name a scrape can hold once it has samples (a family with none is left
    /// out of a scrape): what alerts and dashboards may ask for.
    pub fn series(&self) -> &std::collections::BTreeSet<String> {
        &self.series
    }

    /// The OpenMetrics text.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// Prometheus's text format (0.0.4).
    pub fn encode_text(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry);
        out
    }

    /// Times `f` into a histogram in seconds.
    pub fn observe(h: &Histogram, took: Duration) {
        h.observe(took.as_secs_f64());
    }
}

/// Registers `metric` as `name`, and records the names of the series it exports (`_total` of a
/// counter; `_bucket`, `_sum` and `_count` of a histogram).
fn register<M>(
    registry: &mut Registry,
    series: &mut std::collections::BTreeSet<String>,
    name: &str,
    help: &str,
    metric: M,
) where
    M: prometheus_client::registry::Metric + prometheus_client::encoding::EncodeMetric,
{
    use prometheus_client::metrics::MetricType;
    match metric.metric_type() {
        MetricType::Counter => {
            series.insert(format!("{name}_total"));
        }
        MetricType::Histogram => {
            for suffix in ["_bucket", "_sum", "_count"] {
                series.insert(format!("{name}{suffix}"));
            }
        }
        _ => {
            series.insert(name.to_owned());
        }
    }
    registry.register(name, help, metric);
}

/// A reconciliation in flight; see [`Metrics::running`].
#[derive(Debug)]
pub struct Running {
    metrics: Arc<Metrics>,
    id: u64,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.metrics.health().running.remove(&self.id);
    }
}

async fn healthz(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    match m.unhealthy() {
        None => (StatusCode::OK, "ok".to_owned()),
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
    }
}

async fn readyz(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    match m.not_ready() {
        None => (StatusCode::OK, "ok".to_owned()),
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
    }
}

/// `/metrics`: OpenMetrics to a scraper that asks for it (Prometheus does), else Prometheus's
/// text format 0.0.4, as client_golang negotiates.
async fn metrics(
    State(m): State<Arc<Metrics>>,
    headers: axum::http::HeaderMap,
) -> impl IntoResponse {
    let openmetrics = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"));
    if openmetrics {
        (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            m.encode(),
        )
    } else {
        (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            m.encode_text(),
        )
    }
}

/// How `/metrics` is served: over HTTPS, to whom the API server says may read it.
#[derive(Debug, Clone)]
pub struct Secure {
    /// The server's certificate and key.
    pub tls: Arc<rustls::ServerConfig>,
    /// Who asks the API server about each request's token.
    pub reviewer: super::secure::Reviewer,
    /// Where `/healthz` and `/readyz` are served, plain, for the kubelet.
    pub health_addr: SocketAddr,
}

/// Serves `/healthz`, `/readyz` and `/metrics` on `addr` until the future `stopped` makes
/// resolves: all plain HTTP, or, with `secure`, `/metrics` over HTTPS to those allowed and the
/// probes plain on their own address. The address `/metrics` is served on.
pub async fn serve<F>(
    addr: SocketAddr,
    secure: Option<Secure>,
    metrics_state: Arc<Metrics>,
    stopped: impl Fn() -> F,
) -> std::io::Result<SocketAddr>
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let probes = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz));
    let Some(secure) = secure else {
        let app = probes
            .route("/metrics", get(metrics))
            .with_state(metrics_state);
        return serve_plain(addr, app, stopped()).await;
    };
    serve_plain(
        secure.health_addr,
        probes.with_state(metrics_state.clone()),
        stopped(),
    )
    .await
    .map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("the health probe address {}: {e}", secure.health_addr),
        )
    })?;
    let app = Router::new()
        .route("/metrics", get(metrics))
        .with_state(metrics_state)
        .layer(axum::middleware::from_fn_with_state(
            secure.reviewer,
            super::secure::authorize,
        ));
    super::secure::serve_tls(addr, secure.tls, app, stopped()).await
}

/// Serves `app` over plain HTTP on `addr` until `shutdown` resolves.
async fn serve_plain(
    addr: SocketAddr,
    app: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
        {
            tracing::error!("metrics server: {e}");
        }
    });
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_is_failing_after_a_run_of_errors_not_after_one() {
        let mut h = Health::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        h.watch_failed("w", t0);
        // One error, then quiet: never failing, at any time after.
        for s in [10, 31, 40, 44, 100] {
            assert!(h.failing_watches(at(s)).is_empty(), "at {s} s");
        }
        // Errors every 20 s for 40 s: failing.
        h.watch_failed("w", at(20));
        h.watch_failed("w", at(40));
        assert_eq!(h.failing_watches(at(41)), vec!["w".to_owned()]);
        // Still failing between the backoff's tries (up to 60 s apart).
        assert_eq!(h.failing_watches(at(100)), vec!["w".to_owned()]);
        // A failure after a quiet spell starts a new run.
        h.watch_failed("w", at(300));
        assert!(h.failing_watches(at(301)).is_empty());
    }

    #[test]
    fn a_long_reconciliation_makes_the_operator_unhealthy_until_it_ends() {
        let m = Arc::new(Metrics::default());
        assert_eq!(m.unhealthy(), None);
        let running = m.running("services.hanzo.ai");
        m.health().running.insert(
            running.id,
            (
                "services.hanzo.ai".to_owned(),
                Instant::now() - RECONCILE_STUCK - Duration::from_secs(1),
            ),
        );
        assert!(m.unhealthy().is_some_and(|w| w.contains("stuck")));
        drop(running);
        assert_eq!(m.unhealthy(), None);
    }

    #[test]
    fn the_work_queues_count_what_waits_and_for_how_long() {
        let m = Arc::new(Metrics::default());
        let c = "services.hanzo.ai";
        m.queued(c, "app/web");
        m.queued(c, "app/web");
        m.queued(c, "app/api");
        m.queued("kvs.hanzo.ai", "app/kv");
        let text = m.encode();
        // The second change of app/web, before it was reconciled, adds nothing.
        assert!(
            text.contains("workqueue_adds_total{name=\"services.hanzo.ai\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("workqueue_depth{name=\"services.hanzo.ai\"} 2"),
            "{text}"
        );
        m.dequeued(c, "app/web");
        m.forgotten(c, "app/api");
        // A timed requeue: counted as asked when it runs.
        m.dequeued(c, "app/db");
        let running = m.running(c);
        let text = m.encode();
        assert!(
            text.contains("workqueue_depth{name=\"services.hanzo.ai\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("workqueue_depth{name=\"kvs.hanzo.ai\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("workqueue_adds_total{name=\"services.hanzo.ai\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("workqueue_queue_duration_seconds_count{name=\"services.hanzo.ai\"} 2"),
            "{text}"
        );
        assert!(
            text.contains(
                "workqueue_longest_running_processor_seconds{name=\"services.hanzo.ai\"}"
            ),
            "{text}"
        );
        drop(running);
        let text = m.encode();
        assert!(
            !text.contains("workqueue_longest_running_processor_seconds{"),
            "{text}"
        );
    }

    #[test]
    fn the_series_people_look_for_are_there() {
        let m = Metrics::default();
        m.set_leader("wasm-operator", true);
        let text = m.encode();
        for series in [
            "leader_election_master_status{name=\"wasm-operator\"} 1",
            &format!(
                "wasm_operator_build_info{{version=\"{}\",contract=\"{}\"}} 1",
                env!("CARGO_PKG_VERSION"),
                env!("CONTRACT_VERSION")
            ),
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
            "process_open_fds",
            "process_start_time_seconds",
        ] {
            assert!(text.contains(series), "no {series} in:\n{text}");
        }
    }
}
