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

/// `watch` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WatchLabels {
    /// The watch: a served Kind's controller (`<plural>.<group>`) or a child kind (`group/Kind`).
    pub watch: String,
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
    running: BTreeMap<u64, Instant>,
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
            .map(|started| now.duration_since(*started))
            .max()
    }
}

/// Every metric the operator exports.
pub struct Metrics {
    registry: Registry,
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
    /// `wasm_operator_watch_errors_total`: errors of the watches, by watch.
    pub watch_errors: Family<WatchLabels, Counter>,
    /// `wasm_operator_report_errors_total`: status and event writes that failed.
    pub report_errors: Family<WriteLabels, Counter>,
    /// `wasm_operator_plugins_prefetched`: the `Plugin`s a standby holds loaded (pulled,
    /// compiled, checked) for when it leads.
    pub plugins_prefetched: Gauge,
    /// `wasm_operator_reports_pending`: status writes and events queued or being written.
    pub reports_pending: Gauge,
    ready: AtomicBool,
    /// Whether any watch has failed and not worked since (a fast path for every event).
    any_failing: AtomicBool,
    health: Mutex<Health>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
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
        registry.register(
            "wasm_operator_render_budget_wait_seconds",
            "Time plugin calls waited for their share of the memory budget (--render-memory)",
            budget_wait.clone(),
        );
        registry.register(
            "wasm_operator_render_budget_timeouts",
            "Reconciliations that waited too long for their share of the memory budget and were tried again",
            budget_timeouts.clone(),
        );
        let writes = Family::<WriteLabels, Counter>::default();
        let watch_errors = Family::<WatchLabels, Counter>::default();
        let report_errors = Family::<WriteLabels, Counter>::default();
        let plugins_prefetched = Gauge::default();
        let reports_pending = Gauge::default();
        registry.register(
            "wasm_operator_reports_pending",
            "Status writes and events queued or being written",
            reports_pending.clone(),
        );
        registry.register(
            "wasm_operator_plugins_prefetched",
            "Plugin resources a standby replica holds loaded for when it leads",
            plugins_prefetched.clone(),
        );
        registry.register(
            "wasm_operator_watch_errors",
            "Errors of the watches (each is retried with backoff)",
            watch_errors.clone(),
        );
        registry.register(
            "wasm_operator_report_errors",
            "Status and event writes that failed",
            report_errors.clone(),
        );
        registry.register(
            "controller_runtime_reconcile",
            "Reconciliations per controller and result",
            reconcile_total.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_errors",
            "Reconciliations that failed",
            reconcile_errors.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_time_seconds",
            "Time per reconciliation",
            reconcile_time.clone(),
        );
        registry.register(
            "controller_runtime_active_workers",
            "Reconciliations in flight",
            active_workers.clone(),
        );
        registry.register(
            "wasm_operator_plugin_render_seconds",
            "Time per plugin render, sandbox included",
            render_time.clone(),
        );
        registry.register(
            "wasm_operator_plugin_render_failures",
            "Renders that failed, by reason",
            render_failures.clone(),
        );
        registry.register(
            "wasm_operator_api_writes",
            "Write requests sent to the API server",
            writes.clone(),
        );
        Self {
            registry,
            reconcile_total,
            reconcile_errors,
            reconcile_time,
            active_workers,
            render_time,
            render_failures,
            budget_wait,
            budget_timeouts,
            writes,
            watch_errors,
            report_errors,
            plugins_prefetched,
            reports_pending,
            ready: AtomicBool::new(false),
            any_failing: AtomicBool::new(false),
            health: Mutex::new(Health::default()),
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
    pub fn running(self: &Arc<Self>) -> Running {
        let mut health = self.health();
        let id = health.next;
        health.next += 1;
        health.running.insert(id, Instant::now());
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
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// The OpenMetrics text.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// Times `f` into a histogram in seconds.
    pub fn observe(h: &Histogram, took: Duration) {
        h.observe(took.as_secs_f64());
    }
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

async fn metrics(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        m.encode(),
    )
}

/// Serves `/healthz`, `/readyz` and `/metrics` on `addr` until `shutdown` resolves.
pub async fn serve(
    addr: SocketAddr,
    metrics_state: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<SocketAddr> {
    let app = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(metrics_state);
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
        let running = m.running();
        m.health().running.insert(
            running.id,
            Instant::now() - RECONCILE_STUCK - Duration::from_secs(1),
        );
        assert!(m.unhealthy().is_some_and(|w| w.contains("stuck")));
        drop(running);
        assert_eq!(m.unhealthy(), None);
    }
}
