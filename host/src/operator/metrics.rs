//! Metrics (controller-runtime's names, plus the plugins'), and the `/healthz`, `/readyz` and
//! `/metrics` endpoints.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

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
    /// `wasm_operator_api_writes_total`: every write request the operator sends.
    pub writes: Family<WriteLabels, Counter>,
    ready: AtomicBool,
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
        let writes = Family::<WriteLabels, Counter>::default();
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
            writes,
            ready: AtomicBool::new(false),
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

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    if m.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
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
