//! The harness of the tests that run on a control plane: the shared cluster with the CRDs
//! installed, an operator run in-process ([`Operator`]), kubectl (`apply`, `get`, `wait_ready`)
//! and the one polling loop ([`eventually`] and its kin) that every wait goes through.
//!
//! A test waits on a condition, never for a fixed time. A check that something does not happen
//! first waits for a sign that the operator has seen the change (a reconciliation of it ended,
//! its `observedGeneration` caught up, ...), then asserts.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Once;
use std::time::{Duration, Instant};

use serde_json::Value;
use testenv::ControlPlane;

use super::root;

/// Every API group the tests install CRDs for.
pub const GROUPS: [&str; 2] = ["hanzo.ai", "lux.cloud"];

/// The shared control plane with our CRDs (both groups) and the third-party ones installed.
pub fn cluster() -> &'static ControlPlane {
    static CRDS: Once = Once::new();
    let cp = ControlPlane::shared();
    CRDS.call_once(|| {
        let dir = tempfile::tempdir().unwrap();
        kubectl_ok(
            cp,
            &["apply", "-f", &root().join("crds").display().to_string()],
        );
        kubectl_ok(
            cp,
            &[
                "apply",
                "-f",
                &root().join("tests/crds").display().to_string(),
            ],
        );
        for group in GROUPS.iter().filter(|g| **g != "hanzo.ai") {
            let registry = registry_for(group);
            for (name, text) in host::crd::files(&host::crd::crds(&registry).unwrap()).unwrap() {
                std::fs::write(dir.path().join(name), text).unwrap();
            }
            let kms =
                std::fs::read_to_string(root().join("tests/crds/kmssecrets.kms.hanzo.ai.yaml"))
                    .unwrap();
            std::fs::write(
                dir.path().join(format!("kmssecrets.kms.{group}.yaml")),
                kms.replace("kms.hanzo.ai", &format!("kms.{group}")),
            )
            .unwrap();
        }
        kubectl_ok(cp, &["apply", "-f", &dir.path().display().to_string()]);
        kubectl_ok(
            cp,
            &[
                "wait",
                "--for=condition=Established",
                "crd",
                "--all",
                "--timeout=60s",
            ],
        );
    });
    cp
}

/// The built-in plugins serving `group`.
pub fn registry_for(group: &str) -> host::registry::Registry {
    let runtime =
        host::plugin::Runtime::new(host::plugin::Limits::default(), Some(super::cache())).unwrap();
    let ctx = host::types::Context {
        api_group: group.to_owned(),
        cluster_domain: "cluster.local".to_owned(),
    };
    host::registry::Registry::load(&runtime, ctx, true, &[]).unwrap()
}

/// The CRDs of the plugin at `wasm`, as `host crds --plugin` prints them, installed and
/// Established.
pub(crate) fn install_crds(cp: &ControlPlane, wasm: &str) {
    let runtime =
        host::plugin::Runtime::new(host::plugin::Limits::default(), Some(super::cache())).unwrap();
    let plugin = runtime
        .load_file(Path::new(wasm), &Default::default())
        .unwrap();
    for kind in &plugin.info().kinds {
        let crd = host::crd::crd(&plugin, kind).unwrap();
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), crd.to_string()).unwrap();
        // Other tests install the same CRDs on the shared control plane, maybe at this moment:
        // a create that lost that race is applied again, as an update.
        let path = file.path().display().to_string();
        let (mut ok, mut out) = kubectl(cp, &["apply", "-f", &path]);
        for _ in 0..3 {
            if ok || !out.contains("AlreadyExists") {
                break;
            }
            (ok, out) = kubectl(cp, &["apply", "-f", &path]);
        }
        assert!(ok, "kubectl apply -f {path}: {out}");
        kubectl_ok(
            cp,
            &[
                "wait",
                "--for=condition=Established",
                &format!("crd/{}.{}", kind.plural, kind.group),
                "--timeout=30s",
            ],
        );
    }
}

/// A Service of the built-in `hanzo.ai` group: a Deployment, a core Service and an Ingress.
pub(crate) const WEB: &str = "apiVersion: hanzo.ai/v1
kind: Service
metadata:
  name: web
spec:
  image: { repository: ghcr.io/hanzoai/web, tag: v1 }
  replicas: 2
  ports: [{ name: http, containerPort: 8080, servicePort: 80 }]
  env: [{ name: LOG_LEVEL, value: info }]
  ingress: { hosts: [web.example.com] }
";

// --- the operator ----------------------------------------------------------------------------

/// The counter of reconciliations ended, labelled by controller (`<plural>.<group>`) and result.
const RECONCILED: &str = "controller_runtime_reconcile_total";
/// The gauge of reconciliations running, labelled by controller.
const RUNNING: &str = "controller_runtime_active_workers";
/// The counter of the operator's write requests, labelled by verb and resource.
const WRITES: &str = "wasm_operator_api_writes_total";
/// Status writes and events the operator has queued and not yet written.
const PENDING: &str = "wasm_operator_reports_pending";

/// An operator running in this test.
pub(crate) struct Operator {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), host::operator::Error>>,
    metrics: SocketAddr,
}

impl Operator {
    /// An operator watching `namespace` alone, serving the built-in plugins under `group` and
    /// the plugins at `extra`, with leader election on a Lease in that namespace; connected as
    /// `host run` connects (`host::connection`).
    pub(crate) async fn start(
        cp: &ControlPlane,
        namespace: &str,
        group: &str,
        extra: &[PathBuf],
    ) -> Self {
        let cluster = host::connection::Cluster::connect(cp.admin_config().await.unwrap()).unwrap();
        Self::start_with(
            cluster,
            Some(namespace),
            namespace,
            &format!("test-{namespace}"),
            group,
            extra,
        )
        .await
    }

    /// An operator acting as `client`, watching `watch` (none: every namespace), electing its
    /// leader on a Lease in `lease_namespace` as `identity`.
    pub(crate) async fn start_with(
        client: impl Into<host::connection::Cluster>,
        watch: Option<&str>,
        lease_namespace: &str,
        identity: &str,
        group: &str,
        extra: &[PathBuf],
    ) -> Self {
        let namespaces = watch.map(str::to_owned).into_iter().collect();
        let settings = settings(namespaces, lease_namespace, identity);
        Self::start_settings(client, group, extra, settings).await
    }

    /// An operator run with `settings` exactly.
    pub(crate) async fn start_settings(
        client: impl Into<host::connection::Cluster>,
        group: &str,
        extra: &[PathBuf],
        settings: host::operator::Settings,
    ) -> Self {
        // The operator's logs, with RUST_LOG set (for example RUST_LOG=host=debug).
        if std::env::var_os("RUST_LOG").is_some() {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
                .with_test_writer()
                .try_init();
        }
        let runtime = host::plugin::Runtime::new(
            host::plugin::Limits {
                deadline: Duration::from_millis(500),
                ..Default::default()
            },
            Some(super::cache()),
        )
        .unwrap();
        let ctx = host::types::Context {
            api_group: group.to_owned(),
            cluster_domain: "cluster.local".to_owned(),
        };
        let registry = host::registry::Registry::load(&runtime, ctx, true, extra).unwrap();
        Self::run(client, registry, settings)
    }

    /// An operator serving `registry`, run with `settings` exactly.
    pub(crate) fn run(
        client: impl Into<host::connection::Cluster>,
        registry: host::registry::Registry,
        settings: host::operator::Settings,
    ) -> Self {
        let metrics = settings.metrics_addr;
        let (tx, rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(host::operator::run(
            client.into(),
            registry,
            settings,
            async move {
                let _ = rx.await;
            },
        ));
        Self {
            stop: Some(tx),
            task,
            metrics,
        }
    }

    /// The response to `GET path` on its metrics address, or nothing while it does not answer.
    pub(crate) fn get(&self, path: &str) -> String {
        http_get(self.metrics, path)
    }

    /// What `/metrics` answers.
    pub(crate) fn scrape(&self) -> String {
        self.get("/metrics")
    }

    /// The value of the metric `name` (without labels), once it is exported.
    pub(crate) fn metric(&self, name: &str) -> Option<f64> {
        self.scrape()
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
    }

    /// Whether its run has ended.
    pub(crate) fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Whether `/readyz` answers 200.
    pub(crate) fn ready(&self) -> bool {
        self.get("/readyz").starts_with("HTTP/1.0 200")
    }

    /// Every write request it has sent.
    pub(crate) fn writes(&self) -> f64 {
        sum(&self.scrape(), WRITES, None)
    }

    /// The writes made so far, by their labels (verb and resource), sorted: what a count that
    /// moved should say moved.
    pub(crate) fn writes_by_kind(&self) -> Vec<String> {
        let mut lines: Vec<String> = self
            .scrape()
            .lines()
            .filter(|l| l.strip_prefix(WRITES).is_some_and(|l| l.starts_with('{')))
            .map(str::to_owned)
            .collect();
        lines.sort();
        lines
    }

    /// The reconciliations of `controller` (`<plural>.<group>`) ended so far, whatever their
    /// result.
    pub(crate) fn reconciled(&self, controller: &str) -> f64 {
        sum(&self.scrape(), RECONCILED, Some(("controller", controller)))
    }

    /// The reconciliations running now, of every controller.
    pub(crate) fn running(&self) -> f64 {
        sum(&self.scrape(), RUNNING, None)
    }

    /// Makes `change`, then waits until a reconciliation of `controller` has ended since: the
    /// sign that the operator has seen the change. The count is read once no reconciliation
    /// runs, so that one begun before the change does not pass for it.
    pub(crate) async fn reconciles(&self, controller: &str, change: impl FnOnce()) {
        eventually(
            "no reconciliation to be running",
            Duration::from_secs(60),
            || self.running() == 0.0,
        )
        .await;
        let before = self.reconciled(controller);
        change();
        eventually(
            &format!("a reconciliation of {controller} after the change"),
            Duration::from_secs(60),
            || self.reconciled(controller) > before,
        )
        .await;
    }

    /// Waits until the operator is quiet: no reconciliation running, no status or event waiting
    /// to be written (a settling status is held for a while before it is), and neither its
    /// reconciliations nor its writes counted again for a second.
    pub(crate) async fn quiet(&self) {
        let last = std::cell::Cell::new(None);
        let mut since = Instant::now();
        eventually_or(
            "the operator to be quiet for a second",
            Duration::from_secs(60),
            || {
                let scraped = self.scrape();
                let now = (
                    sum(&scraped, RECONCILED, None),
                    sum(&scraped, WRITES, None),
                    sum(&scraped, RUNNING, None),
                    sum(&scraped, PENDING, None),
                );
                if last.get() != Some(now) || now.2 != 0.0 || now.3 != 0.0 {
                    last.set(Some(now));
                    since = Instant::now();
                }
                since.elapsed() >= Duration::from_secs(1)
            },
            || {
                format!(
                    " (reconciliations, writes, running, reports pending): {:?}",
                    last.get()
                )
            },
        )
        .await;
    }

    /// Stops the operator and returns how its run ended.
    pub(crate) async fn finish(mut self) -> Result<(), host::operator::Error> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        match tokio::time::timeout(Duration::from_secs(30), self.task).await {
            Ok(Ok(result)) => result,
            other => panic!("the operator did not stop: {other:?}"),
        }
    }

    /// Stops the operator, which must end cleanly.
    pub(crate) async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let result = tokio::time::timeout(Duration::from_secs(30), self.task).await;
        assert!(
            matches!(result, Ok(Ok(Ok(())))),
            "the operator did not stop cleanly: {result:?}"
        );
    }
}

/// The sum of the samples of `name` in `scraped` (Prometheus' text format), of those labelled
/// `label` only if given.
pub(crate) fn sum(scraped: &str, name: &str, label: Option<(&str, &str)>) -> f64 {
    let label = label.map(|(k, v)| format!("{k}=\"{v}\""));
    scraped
        .lines()
        .filter_map(|l| l.strip_prefix(name))
        .filter(|l| l.starts_with('{') || l.starts_with(' '))
        .filter(|l| {
            label
                .as_deref()
                .is_none_or(|label| l.split('}').next().is_some_and(|ls| ls.contains(label)))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// How the operators of these tests run: leader election on a Lease in `lease_namespace`,
/// watching `namespaces` (none: all), metrics on a free port.
pub(crate) fn settings(
    namespaces: Vec<String>,
    lease_namespace: &str,
    identity: &str,
) -> host::operator::Settings {
    host::operator::Settings {
        namespaces,
        metrics_addr: free_addr(),
        metrics_tls: None,
        health_addr: free_addr(),
        leader_election: true,
        lease_namespace: lease_namespace.to_owned(),
        lease_name: "wasm-operator".to_owned(),
        identity: identity.to_owned(),
        concurrency: 4,
        max_writes_in_flight: 16,
        min_writes_in_flight: 1,
        render_memory: 2 * host::plugin::Limits::default().call_memory(),
        render_wait: Duration::from_secs(3),
        unready_after: Duration::from_secs(30),
        stuck_after: Duration::from_secs(120),
        plugin_resources: None,
        rules: host::policy::Rules::default(),
        sharding: None,
        shard: None,
    }
}

/// A free port on loopback.
pub(crate) fn free_addr() -> SocketAddr {
    let port = testenv::free_port().unwrap();
    format!("127.0.0.1:{port}").parse().unwrap()
}

/// The response to `GET path` (status line, headers, body), or nothing while nothing answers.
pub(crate) fn http_get(addr: SocketAddr, path: &str) -> String {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return String::new();
    };
    if s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
        .is_err()
    {
        return String::new();
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

// --- kubectl ---------------------------------------------------------------------------------

/// Runs kubectl as admin: whether it succeeded, and what it printed (stdout, then stderr).
pub(crate) fn kubectl(cp: &ControlPlane, args: &[&str]) -> (bool, String) {
    let out = cp.kubectl(args);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Runs kubectl as admin and asserts that it succeeded (else shows both streams); returns its
/// stdout.
pub(crate) fn kubectl_ok(cp: &ControlPlane, args: &[&str]) -> String {
    let out = cp.kubectl(args);
    super::succeeded(&format!("kubectl {}", args.join(" ")), out)
}

/// `kubectl apply -n ns` of `yaml`, which must succeed.
pub(crate) fn apply(cp: &ControlPlane, ns: &str, yaml: &str) {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), yaml).unwrap();
    let (ok, out) = kubectl(
        cp,
        &["apply", "-n", ns, "-f", &file.path().display().to_string()],
    );
    assert!(ok, "kubectl apply: {out}\n{yaml}");
}

/// `kubectl apply` of cluster-scoped `yaml` (or of objects that name their namespace).
pub(crate) fn apply_cluster(cp: &ControlPlane, yaml: &str) {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), yaml).unwrap();
    kubectl_ok(cp, &["apply", "-f", &file.path().display().to_string()]);
}

/// `kubectl wait --for=condition=Ready`, which works because status follows kstatus.
pub(crate) fn wait_ready(cp: &ControlPlane, ns: &str, what: &str) {
    let (ok, out) = kubectl(
        cp,
        &[
            "wait",
            "-n",
            ns,
            "--for=condition=Ready",
            what,
            "--timeout=120s",
        ],
    );
    assert!(
        ok,
        "kubectl wait {what}: {out}\n{}",
        kubectl(cp, &["get", "-n", ns, what, "-o", "yaml"]).1
    );
}

/// `kubectl wait --for=condition=CONDITION WHAT` (cluster-scoped objects).
pub(crate) fn wait_for(cp: &ControlPlane, condition: &str, what: &str) {
    kubectl_ok(
        cp,
        &[
            "wait",
            &format!("--for=condition={condition}"),
            what,
            "--timeout=120s",
        ],
    );
}

/// `what` in `ns` as JSON, or nothing if it cannot be read (it does not exist).
pub(crate) fn get(cp: &ControlPlane, ns: &str, what: &str) -> Option<Value> {
    let out = cp.kubectl(&["get", "-n", ns, what, "-o", "json"]);
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).unwrap())
}

/// The condition `type_` of `obj`: its status, reason and message (empty where it has none).
pub(crate) fn condition(obj: &Value, type_: &str) -> (String, String, String) {
    let c = obj["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_).cloned())
        .unwrap_or_default();
    let s = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
    (s("status"), s("reason"), s("message"))
}

/// `what`, once its `Ready` condition's reason is `reason`.
pub(crate) async fn wait_reason(cp: &ControlPlane, ns: &str, what: &str, reason: &str) -> Value {
    wait_for_object(
        cp,
        ns,
        what,
        &format!("to say {reason}"),
        Duration::from_secs(30),
        |o| condition(o, "Ready").1 == reason,
    )
    .await
}

/// `what`, once its operator has reported on its current generation: `status.observedGeneration`
/// has reached `metadata.generation`.
pub(crate) async fn wait_observed(cp: &ControlPlane, ns: &str, what: &str) -> Value {
    wait_for_object(
        cp,
        ns,
        what,
        "to be reported on at its generation",
        Duration::from_secs(60),
        |o| o["status"]["observedGeneration"] == o["metadata"]["generation"],
    )
    .await
}

/// `what` in `ns`, once `done` holds of it, within `within`; on a timeout the failure shows it.
async fn wait_for_object(
    cp: &ControlPlane,
    ns: &str,
    what: &str,
    waiting: &str,
    within: Duration,
    done: impl Fn(&Value) -> bool,
) -> Value {
    eventually_or(
        &format!("{what} {waiting}"),
        within,
        || get(cp, ns, what).is_some_and(|o| done(&o)),
        || {
            format!(
                ": {}",
                kubectl(cp, &["get", "-n", ns, what, "-o", "yaml"]).1
            )
        },
    )
    .await;
    get(cp, ns, what).unwrap()
}

/// Waits until nothing in `ns` names the object of uid `owner` among its owners: the garbage
/// collector is done with what it owned.
pub(crate) async fn wait_collected(cp: &ControlPlane, ns: &str, owner: &str) {
    let owned = || {
        let list = kubectl_ok(
            cp,
            &[
                "get",
                "-n",
                ns,
                "all,ingress,networkpolicy,configmap,serviceaccount,poddisruptionbudget",
                "-o",
                "json",
            ],
        );
        let list: Value = serde_json::from_str(&list).unwrap();
        list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|o| {
                o["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|refs| refs.iter().any(|r| r["uid"] == owner))
            })
            .map(|o| format!("{}/{}", o["kind"], o["metadata"]["name"]))
            .collect::<Vec<_>>()
    };
    eventually_or(
        &format!("what {owner} owned to be collected"),
        Duration::from_secs(60),
        || owned().is_empty(),
        || format!(": {:?}", owned()),
    )
    .await;
}

// --- waiting -----------------------------------------------------------------------------------

/// Polls `check` every 100 ms until it holds; fails after `timeout`.
pub(crate) async fn eventually(what: &str, timeout: Duration, check: impl FnMut() -> bool) {
    eventually_or(what, timeout, check, String::new).await;
}

/// As [`eventually`], with `explain()` appended to the failure message.
pub(crate) async fn eventually_or(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> bool,
    explain: impl Fn() -> String,
) {
    poll(
        what,
        timeout,
        Duration::from_millis(100),
        async || check(),
        explain,
    )
    .await;
}

/// As [`eventually`], for a check that awaits (a request of a kube client, say).
pub(crate) async fn eventually_async(
    what: &str,
    timeout: Duration,
    check: impl AsyncFnMut() -> bool,
) {
    poll(
        what,
        timeout,
        Duration::from_millis(100),
        check,
        String::new,
    )
    .await;
}

/// The polling loop: `check` every `every` until it holds; fails after `timeout`, saying
/// `what` was waited for and `explain()`.
pub(crate) async fn poll(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut check: impl AsyncFnMut() -> bool,
    explain: impl Fn() -> String,
) {
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}{}",
            explain()
        );
        tokio::time::sleep(every).await;
    }
}
