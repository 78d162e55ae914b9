//! The operator benchmark: prints a table, asserts nothing. Each phase runs on a control plane
//! of its own (a control plane slows down as objects pile up in it).
//!
//! 1. A bare loop server-side-applies the children of N Service resources directly (the same
//!    objects the plugin renders and the host stamps, 16 requests in flight): the physical limit.
//! 2. `host run` (the release binary, a separate process, 16 writes in flight) reconciles the
//!    same N resources; the time is from its `/readyz` until every child exists.
//! 3. Writes the operator sends during a quiet minute once every resource is Ready, from its
//!    /metrics and from the API server's audit log (Lease renewals apart).
//! 4. The operator's peak RSS (VmHWM).
//! 5. Writes by a new operator process after a restart with nothing changed (audit log).
//!
//! The operator runs as in production: leader election on (a Lease in the namespace), API
//! Priority and Fairness on in the API server.
//!
//! Rounds of both phases (`BENCH_ROUNDS`, default 5, 0 skips 1 to 5); the ratio of each round
//! and their median.
//!
//! 6. A mixed run: Service, SQL (Datastore), KVCluster and IAM resources together, both phases.
//! 7. A large run on 10,000 Service resources, both phases, for the operator's peak RSS and the
//!    time until every child is applied (`BENCH_LARGE_BARE=0` skips its bare loop).
//!
//! 8. Shards: the same 10,000 Service resources served by 1, 2 and 4 replicas of
//!    `host run --shards K`, separate processes on one control plane: the time from their start
//!    until every child is applied, each replica's peak RSS against a replica's fixed base (one
//!    with no resources), the API server's CPU; then one replica killed, and the time until a
//!    change in its shard is applied by another (`BENCH_SHARDED` sets the size, 0 skips it; `BENCH_SHARDED_BARE=0` skips its bare loop;
//!    `BENCH_SHARDS=1,4` which shard counts run, default 1,2,4; `BENCH_KILL_SHARD=0` kills the
//!    holder of shard 0 rather than the first replica holding one, where K has that shard).
//!    The replicas act as the operator's ServiceAccount, with its RBAC and the chart's
//!    FlowSchema for its Leases (`BENCH_AS=sa-no-flowschema` leaves that out, `BENCH_AS=admin`
//!    connects as the control plane's admin, which API Priority and Fairness exempts).
//!
//! Run: `cargo bench -p host --bench operator` (N defaults to 1000; `BENCH_RESOURCES=200` for a
//! quicker run; `BENCH_QUIET_SECS` sets the quiet period, default 60; `BENCH_MIXED` the mixed
//! run's size, default N, 0 skips it; `BENCH_LARGE` the large run's, default 10000, 0 skips it;
//! `BENCH_TRACE=1` prints the children seen every 0.1 s; `BENCH_LOG` is the operator's
//! `RUST_LOG`; `BENCH_HOST_BIN` runs another `host` binary, such as a release's static one;
//! `BENCH_HOST_ARGS` adds arguments to each `host run`, such as `--min-writes-in-flight=16`).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DynamicObject, PartialObjectMeta, Patch, PatchParams};
use kube::discovery::ApiResource;
use kube::runtime::WatchStreamExt;
use serde_json::{Value, json};

/// Stops the operator however the benchmark ends.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What a phase reconciles.
#[derive(Debug, Clone, Copy)]
enum Workload {
    /// `n` hanzo `Service` resources.
    Services(usize),
    /// `n` resources of four Kinds in turn: `Service`, the `SQL` facade of `Datastore`,
    /// `KVCluster`, the `IAM` facade of `Service`.
    Mixed(usize),
}

impl Workload {
    fn resources(self, ns: &str) -> Vec<(ApiResource, Value)> {
        let ar = |group: &str, version: &str, kind: &str| {
            ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(group, version, kind))
        };
        match self {
            Self::Services(n) => (0..n).map(|i| (service_ar(), service(i, ns))).collect(),
            Self::Mixed(n) => (0..n)
                .map(|i| match i % 4 {
                    0 => (service_ar(), service(i, ns)),
                    1 => (
                        ar("hanzo.ai", "v1", "SQL"),
                        json!({
                            "apiVersion": "hanzo.ai/v1", "kind": "SQL",
                            "metadata": { "name": format!("sql-{i}"), "namespace": ns },
                            "spec": { "image": { "repository": "postgres", "tag": "16" },
                                "storage": { "size": "1Gi" }, "credentialsSecret": "db" },
                        }),
                    ),
                    2 => (
                        ar("storage.mydatabase.io", "v1alpha1", "KVCluster"),
                        json!({
                            "apiVersion": "storage.mydatabase.io/v1alpha1", "kind": "KVCluster",
                            "metadata": { "name": format!("kv-{i}"), "namespace": ns },
                            "spec": { "size": 1 },
                        }),
                    ),
                    _ => (
                        ar("hanzo.ai", "v1", "IAM"),
                        json!({
                            "apiVersion": "hanzo.ai/v1", "kind": "IAM",
                            "metadata": { "name": format!("iam-{i}"), "namespace": ns },
                            "spec": { "image": { "repository": "ghcr.io/hanzoai/iam", "tag": "v1" },
                                "replicas": 0, "ports": [{ "name": "http", "containerPort": 8000 }] },
                        }),
                    ),
                })
                .collect(),
        }
    }
}

fn service(i: usize, ns: &str) -> Value {
    json!({
        "apiVersion": "hanzo.ai/v1",
        "kind": "Service",
        "metadata": { "name": format!("svc-{i}"), "namespace": ns },
        "spec": {
            "image": { "repository": "ghcr.io/hanzoai/bench", "tag": "v1" },
            "replicas": 0,
            "ports": [{ "name": "http", "containerPort": 8080, "servicePort": 80 }],
            "env": [{ "name": "INDEX", "value": i.to_string() }],
        },
    })
}

fn scrape(port: u16) -> String {
    scrape_path(port, "/metrics")
}

fn scrape_path(port: u16, path: &str) -> String {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes());
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// The operator's writes so far, summed by verb (`apply`, `apply_status`, `event`, `delete`).
fn writes_by_verb(port: u16) -> Vec<(String, f64)> {
    let mut sums: std::collections::BTreeMap<String, f64> = Default::default();
    for line in scrape(port).lines() {
        let Some(rest) = line.strip_prefix("wasm_operator_api_writes_total{") else {
            continue;
        };
        let verb = rest
            .split("verb=\"")
            .nth(1)
            .and_then(|v| v.split('"').next())
            .unwrap_or("?");
        let n = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0);
        *sums.entry(verb.to_owned()).or_default() += n;
    }
    sums.into_iter().collect()
}

/// Waits until the operator's queue of status writes and events (`wasm_operator_reports_pending`)
/// is empty; returns the wait. Panics after 10 minutes.
async fn reports_written(port: u16) -> Duration {
    let started = Instant::now();
    loop {
        let pending = scrape(port)
            .lines()
            .find_map(|l| l.strip_prefix("wasm_operator_reports_pending "))
            .and_then(|v| v.trim().parse::<f64>().ok());
        if pending == Some(0.0) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "{pending:?} reports pending after 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// CPU time (user and system) a process has used so far, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name: state is the 1st, utime the 12th, stime the 13th.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

/// CPU seconds used so far by the control plane's processes, by name (`kube-apiserver`, `etcd`,
/// `kube-controller`, `kwok`, `kube-scheduler`), and by this benchmark.
fn machine_cpu() -> Vec<(String, f64)> {
    let mut out: std::collections::BTreeMap<String, f64> = Default::default();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        let comm = comm.trim();
        let name = if pid == std::process::id() {
            "bench"
        } else if comm == host_comm() {
            // `BENCH_HOST_BIN` may have another name.
            "host"
        } else if [
            "kube-apiserver",
            "etcd",
            "kube-controller",
            "kwok",
            "kube-scheduler",
            "host",
        ]
        .contains(&comm)
        {
            comm
        } else {
            continue;
        };
        *out.entry(name.to_owned()).or_default() += cpu_seconds(pid);
    }
    out.into_iter().collect()
}

/// Named counters' growth between two readings (CPU by process, writes by verb).
fn delta(before: &[(String, f64)], after: &[(String, f64)]) -> Vec<(String, f64)> {
    after
        .iter()
        .map(|(name, t)| {
            let b = before
                .iter()
                .find(|(n, _)| n == name)
                .map_or(0.0, |(_, b)| *b);
            (name.clone(), t - b)
        })
        .collect()
}

/// `name 1.2, ...` (CPU seconds).
fn cpu_text(cpu: &[(String, f64)]) -> String {
    cpu.iter()
        .map(|(name, t)| format!("{name} {t:.1}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn peak_rss_mib(pid: u32) -> f64 {
    proc_status_mib(pid, "VmHWM:")
}

/// A memory figure of `/proc/<pid>/status` (such as `VmRSS:`), MiB.
fn proc_status_mib(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Counts the objects of `ar` with `label` in `ns` as they appear, through one metadata watch,
/// so that measuring puts next to no load on the API server; `wanted` reaches `n` when all are
/// there.
fn count_appearing(
    client: &kube::Client,
    ns: &str,
    ar: &ApiResource,
    label: &str,
) -> tokio::sync::watch::Receiver<usize> {
    let api: Api<PartialObjectMeta<DynamicObject>> = Api::namespaced_with(client.clone(), ns, ar);
    let (tx, rx) = tokio::sync::watch::channel(0);
    let config = kube::runtime::watcher::Config::default().labels(label);
    let stream = kube::runtime::watcher(api, config).default_backoff();
    tokio::spawn(async move {
        let mut seen = std::collections::BTreeSet::new();
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            if let Ok(
                kube::runtime::watcher::Event::Apply(o)
                | kube::runtime::watcher::Event::InitApply(o),
            ) = event
            {
                seen.insert(o.metadata.name.unwrap_or_default());
                if tx.send(seen.len()).is_err() {
                    // Nobody counts any more: stop watching.
                    break;
                }
            }
        }
    });
    rx
}

/// Creates the workload's resources in `ns` and returns them as the API server stored them.
async fn create_resources(
    client: &kube::Client,
    ns: &str,
    workload: Workload,
) -> Vec<DynamicObject> {
    futures::stream::iter(workload.resources(ns))
        .map(|(ar, obj)| {
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
            async move {
                let name = obj["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                api.patch(&name, &PatchParams::apply("bench"), &Patch::Apply(&obj))
                    .await
            }
        })
        .buffered(16)
        .try_collect::<Vec<_>>()
        .await
        .expect("resources created")
}

/// Stops the operator as a cluster would (SIGTERM) and waits for it.
fn stop(mut operator: KillOnDrop) {
    let _ = Command::new("kill")
        .args(["-TERM", &operator.0.id().to_string()])
        .status();
    let _ = operator.0.wait();
}

/// Counters of children as they appear, one per child kind.
type Counters = Vec<tokio::sync::watch::Receiver<usize>>;

fn seen_now(counters: &Counters) -> usize {
    counters.iter().map(|c| *c.borrow()).sum()
}

/// With `BENCH_TRACE` set, prints the children seen every 0.1 s from now on.
fn trace(counters: &Counters, total: usize, label: &'static str) {
    if std::env::var_os("BENCH_TRACE").is_some() {
        let counters = counters.clone();
        let started = Instant::now();
        tokio::spawn(async move {
            let mut line = String::new();
            loop {
                let seen = seen_now(&counters);
                line.push_str(&format!(" {:.1}:{seen}", started.elapsed().as_secs_f64()));
                if seen >= total {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            eprintln!("{label} (s:children):{line}");
        });
    }
}

/// Waits until the counters add up to `total`; panics at `deadline`.
async fn all_seen(counters: Counters, total: usize, deadline: Instant) {
    while seen_now(&counters) < total {
        assert!(
            Instant::now() < deadline,
            "not converged in time: {} of {total} seen",
            seen_now(&counters)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A fresh control plane with the project's CRDs installed, and an admin client.
async fn control_plane(root: &std::path::Path) -> (testenv::ControlPlane, kube::Client) {
    let cp = tokio::task::spawn_blocking(testenv::ControlPlane::start)
        .await
        .unwrap()
        .expect("control plane");
    for dir in ["crds", "tests/crds"] {
        let out = cp.kubectl(&["apply", "-f", &root.join(dir).display().to_string()]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    cp.kubectl(&[
        "wait",
        "--for=condition=Established",
        "crd",
        "--all",
        "--timeout=60s",
    ]);
    let client = cp.client().await.unwrap();
    (cp, client)
}

fn service_ar() -> ApiResource {
    ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
        "hanzo.ai", "v1", "Service",
    ))
}

const MANAGED: &str = "app.kubernetes.io/managed-by=wasm-operator";

/// Counts the children the host stamped in `ns` (Deployments, StatefulSets, Services) as they
/// appear.
fn count_children(client: &kube::Client, ns: &str) -> Counters {
    child_kinds()
        .iter()
        .map(|ar| count_appearing(client, ns, ar, MANAGED))
        .collect()
}

fn child_kinds() -> [ApiResource; 3] {
    [
        ApiResource::erase::<k8s_openapi::api::apps::v1::Deployment>(&()),
        ApiResource::erase::<k8s_openapi::api::apps::v1::StatefulSet>(&()),
        ApiResource::erase::<k8s_openapi::api::core::v1::Service>(&()),
    ]
}

/// One timed phase: how long, and the CPU each process used meanwhile.
struct Phase {
    time: Duration,
    cpu: Vec<(String, f64)>,
}

impl Phase {
    /// The CPU seconds of the processes named `name` during the phase.
    fn cpu_of(&self, name: &str) -> f64 {
        self.cpu
            .iter()
            .find(|(n, _)| n == name)
            .map_or(0.0, |(_, c)| *c)
    }
}

/// The bare loop on a control plane of its own: the exact objects the operator applies for each
/// resource (the plugin's render with the host's owner reference and labels, pointing at
/// resources that exist, so that the garbage collector does the same work), server-side
/// applied with 16 requests in flight.
async fn bare_phase(
    root: &std::path::Path,
    registry: &host::registry::Registry,
    workload: Workload,
) -> (Phase, usize) {
    bare_phase_as(root, registry, workload, false).await
}

/// [`bare_phase`], its applies made as the control plane's admin, or with `as_operator` as the
/// operator's ServiceAccount with the operator's RBAC (what each of its requests then costs the
/// API server: the token, RBAC's rules, API Priority and Fairness's queues).
async fn bare_phase_as(
    root: &std::path::Path,
    registry: &host::registry::Registry,
    workload: Workload,
    as_operator: bool,
) -> (Phase, usize) {
    let (cp, admin) = control_plane(root).await;
    let ns = cp.namespace(&admin, "bare").await.unwrap();
    let kinds = child_kinds();
    let owners = create_resources(&admin, &ns, workload).await;
    let client = if as_operator {
        grant_operator_rights(&cp, &ns, 1, false);
        cp.service_account_client(&admin, &ns, "wasm-operator")
            .await
            .expect("the operator's ServiceAccount's client")
    } else {
        admin.clone()
    };
    let mut children = Vec::new();
    for owner in &owners {
        let value = serde_json::to_value(owner).unwrap();
        let r = host::documents::resource(&value).unwrap();
        for mut child in registry.render(&r).unwrap() {
            host::ownership::stamp_child(&mut child, &r.api_version, &r.kind, &r.name, &r.uid);
            children.push(child);
        }
    }
    let total = children.len();
    let seen = count_children(&admin, &ns);
    let params = PatchParams::apply("bench.wasm-operator.dev/bare").force();
    let started = Instant::now();
    let cpu0 = machine_cpu();
    trace(&seen, total, "bare");
    futures::stream::iter(children)
        .map(|obj| {
            let ar = kinds
                .iter()
                .find(|ar| obj["kind"] == ar.kind.as_str())
                .unwrap_or_else(|| {
                    panic!("a child kind the bench does not count: {}", obj["kind"])
                });
            let api = Api::<DynamicObject>::namespaced_with(client.clone(), &ns, ar);
            let params = params.clone();
            async move {
                let name = obj["metadata"]["name"].as_str().unwrap_or_default();
                api.patch(name, &params, &Patch::Apply(&obj)).await
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await
        .expect("bare applies");
    all_seen(seen, total, started + Duration::from_secs(600)).await;
    let phase = Phase {
        time: started.elapsed(),
        cpu: delta(&cpu0, &machine_cpu()),
    };
    (phase, total)
}

/// What the operator phase measured besides its time.
struct OperatorRun {
    /// From the process's start to its `/readyz`.
    startup: Duration,
    phase: Phase,
    writes: Vec<(String, f64)>,
    /// The writes the API server's audit log shows from the operator until every child was
    /// applied, by verb and resource, Lease apart; and its Lease writes.
    api_writes: (Vec<(String, f64)>, f64),
    /// The operator's peak RSS, MiB.
    rss: f64,
    /// Its peak RSS at `/readyz`, once every watch has listed, MiB.
    rss_ready: f64,
    /// Its RSS at the end, MiB.
    rss_end: f64,
    /// Only when a quiet period was asked.
    quiet: Option<Quiet>,
    /// From every child applied until the operator's queue of status writes and events was
    /// first empty (Services without a quiet period).
    reported_after: Option<Duration>,
}

/// The steady state after a run.
struct Quiet {
    /// From convergence until every resource was Ready.
    ready_after: Duration,
    /// Writes during the quiet period, by verb (those with any), as the operator counts them.
    writes: Vec<(String, f64)>,
    /// The same, as the API server's audit log shows them (Lease writes apart).
    api_writes: Vec<(String, f64)>,
    /// Lease writes during the quiet period.
    lease_writes: f64,
    /// Writes by a new operator process in its first [`RESTART_SECS`] after a restart, Lease
    /// writes apart.
    restart_writes: Vec<(String, f64)>,
}

/// Waits until all `n` Service resources in `ns` have the condition Ready=True; returns the
/// wait. Panics after 10 minutes.
async fn all_ready(client: &kube::Client, ns: &str, n: usize) -> Duration {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &service_ar());
    let started = Instant::now();
    loop {
        let list = api.list(&Default::default()).await.expect("list resources");
        let ready = list
            .items
            .iter()
            .filter(|o| {
                o.data["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
            .count();
        if ready >= n {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "{ready} of {n} resources Ready after 10 minutes"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// `host run` (the release binary, its own process, default settings but for the metrics
/// address) on a control plane of its own, on `n` resources that already exist; timed from its
/// `/readyz` (plugins loaded, every watch's first list done) until every child exists; its
/// start-up until then is reported apart. With `quiet`, then
/// counts its writes during that long after convergence and reads its peak RSS.
async fn operator_phase(
    root: &std::path::Path,
    workload: Workload,
    total: usize,
    quiet: Option<u64>,
) -> OperatorRun {
    let (cp, client) = control_plane(root).await;
    let ns = cp.namespace(&client, "operated").await.unwrap();
    create_resources(&client, &ns, workload).await;
    let port = free_port();
    // Watch for the children before the operator starts, so that none is missed.
    let seen = count_children(&client, &ns);
    let up = Instant::now();
    let operator = start_operator(&cp, &client, &ns, port, "bench-1").await;
    let startup = up.elapsed();
    let rss_ready = peak_rss_mib(operator.0.id());
    let started = Instant::now();
    let from = Timestamp::now();
    let cpu0 = machine_cpu();
    trace(&seen, total, "operator");
    all_seen(seen, total, started + Duration::from_secs(600)).await;
    let phase = Phase {
        time: started.elapsed(),
        cpu: delta(&cpu0, &machine_cpu()),
    };
    let writes = writes_by_verb(port);
    let api_writes = audited_writes(&cp, "(bench-1)", from, Timestamp::now());
    let n = match workload {
        Workload::Services(n) | Workload::Mixed(n) => n,
    };
    let quiet = match quiet {
        Some(secs) => {
            // A steady state: every resource Ready (the controller manager has observed every
            // Deployment, at its 20 requests a second, and the operator has said so), then a
            // few seconds more for the last reports.
            let ready_after = all_ready(&client, &ns, n).await;
            tokio::time::sleep(Duration::from_secs(5)).await;
            let before = writes_by_verb(port);
            let from = Timestamp::now();
            tokio::time::sleep(Duration::from_secs(secs)).await;
            let to = Timestamp::now();
            let after = writes_by_verb(port);
            let quiet_writes: Vec<(String, f64)> = delta(&before, &after)
                .into_iter()
                .filter(|(_, n)| *n > 0.0)
                .collect();
            let (quiet_api_writes, lease_writes) = audited_writes(&cp, "(bench-1)", from, to);
            let rss = peak_rss_mib(operator.0.id());
            let rss_end = proc_status_mib(operator.0.id(), "VmRSS:");
            // A restart with nothing changed: a new process, the same cluster.
            stop(operator);
            let from = Timestamp::now();
            let again = start_operator(&cp, &client, &ns, port, "bench-2").await;
            tokio::time::sleep(Duration::from_secs(RESTART_SECS)).await;
            let (restart_writes, _) = audited_writes(&cp, "(bench-2)", from, Timestamp::now());
            stop(again);
            return OperatorRun {
                startup,
                phase,
                writes,
                api_writes,
                rss,
                rss_ready,
                rss_end,
                quiet: Some(Quiet {
                    ready_after,
                    writes: quiet_writes,
                    api_writes: quiet_api_writes,
                    lease_writes,
                    restart_writes,
                }),
                reported_after: None,
            };
        }
        None => None,
    };
    // Every report written too (they come after the children): the one large run. Not every
    // resource Ready: at 10,000 the controller manager's 20 requests a second take most of an
    // hour to make every Deployment's pods.
    let reported_after = match (workload, &quiet) {
        (Workload::Services(_), None) => Some(reports_written(port).await),
        _ => None,
    };
    let rss = peak_rss_mib(operator.0.id());
    let rss_end = proc_status_mib(operator.0.id(), "VmRSS:");
    stop(operator);
    OperatorRun {
        startup,
        phase,
        writes,
        api_writes,
        rss,
        rss_ready,
        rss_end,
        quiet,
        reported_after,
    }
}

/// How long writes are counted after a restart.
const RESTART_SECS: u64 = 30;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts `host run` (the release binary, default settings but for the metrics address, with
/// leader election on a Lease in `ns` as production runs it) as `identity`; returns once it holds
/// the Lease and its `/readyz` says its watches have listed.
async fn start_operator(
    cp: &testenv::ControlPlane,
    client: &kube::Client,
    ns: &str,
    port: u16,
    identity: &str,
) -> KillOnDrop {
    let operator = spawn_host(cp.kubeconfig(), ns, port, identity, &[]);
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), ns);
    let up = Instant::now();
    let fail = |what: &str| {
        assert!(
            up.elapsed() < Duration::from_secs(60),
            "the operator did not {what}; its log: {}",
            host_log(identity).display()
        );
    };
    // A standby waiting for the Lease is ready too: first the Lease, then `/readyz`.
    loop {
        let holder = leases
            .get_opt("wasm-operator")
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec?.holder_identity);
        if holder.as_deref() == Some(identity) {
            break;
        }
        fail("take the Lease");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    while !scrape_path(port, "/readyz").contains("200 OK") {
        fail("become ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    operator
}

/// The writes the API server's audit log shows from the operator whose user agent contains
/// `agent` between `from` and `to`: by verb and resource, and apart, its Lease writes.
fn audited_writes(
    cp: &testenv::ControlPlane,
    agent: &str,
    from: Timestamp,
    to: Timestamp,
) -> (Vec<(String, f64)>, f64) {
    let mut writes: std::collections::BTreeMap<String, f64> = Default::default();
    let mut lease = 0.0;
    for e in cp.audit_log() {
        let ours = e["userAgent"]
            .as_str()
            .is_some_and(|u| u.starts_with("wasm-operator/") && u.contains(agent));
        let at: Option<Timestamp> = e["requestReceivedTimestamp"]
            .as_str()
            .and_then(|t| t.parse().ok());
        if !ours || !at.is_some_and(|at| from <= at && at <= to) {
            continue;
        }
        let resource = e["objectRef"]["resource"].as_str().unwrap_or("?");
        let subresource = e["objectRef"]["subresource"]
            .as_str()
            .map(|s| format!("/{s}"))
            .unwrap_or_default();
        if resource == "leases" {
            lease += 1.0;
        } else {
            let verb = e["verb"].as_str().unwrap_or("?");
            *writes
                .entry(format!("{verb} {resource}{subresource}"))
                .or_default() += 1.0;
        }
    }
    (writes.into_iter().collect(), lease)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

/// `2000 apply, 4 apply_status`
fn by_verb(writes: &[(String, f64)]) -> String {
    writes
        .iter()
        .map(|(verb, n)| format!("{n} {verb}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Prints a table row: the median of `values`, then each round's value.
fn row(label: &str, values: &[f64], format: &dyn Fn(f64) -> String, target: &str) {
    let rounds: Vec<String> = values.iter().map(|v| format(*v)).collect();
    println!(
        "| {label} | {} | {} | {target} |",
        format(median(values.to_vec())),
        rounds.join(", ")
    );
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = env_or("BENCH_RESOURCES", 1000);
    let quiet: u64 = env_or("BENCH_QUIET_SECS", 60);
    let rounds: usize = env_or("BENCH_ROUNDS", 5);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf();
    let runtime = host::plugin::Runtime::new(host::plugin::Limits::default(), None).unwrap();
    let registry =
        host::registry::Registry::load(&runtime, host::types::Context::default(), true, &[])
            .unwrap();

    if rounds > 0 {
        services(&root, &registry, n, quiet, rounds).await;
    }

    // Several Kinds at once, as a cluster runs them.
    let mixed: usize = env_or("BENCH_MIXED", n);
    if mixed > 0 {
        let (bare, total) = bare_phase(&root, &registry, Workload::Mixed(mixed)).await;
        let op = operator_phase(&root, Workload::Mixed(mixed), total, None).await;
        let (b, o, up) = (
            bare.time.as_secs_f64(),
            op.phase.time.as_secs_f64(),
            op.startup.as_secs_f64(),
        );
        println!(
            "\n## Mixed: {mixed} resources (Service, SQL, KVCluster, IAM in turn), {total} children, one round\n"
        );
        println!("| measure | value | target |");
        println!("|---|---:|---|");
        println!("| bare SSA loop, 16 in flight | {b:.1} s | |");
        println!("| `host run` start-up | {up:.2} s | |");
        println!("| `host run` from `/readyz` until every child is applied | {o:.1} s | |");
        println!("| ratio (from `/readyz`) | {:.2}× | ≤ 1.25× |", o / b);
        println!(
            "| ratio (from process start, start-up included) | {:.2}× | |",
            (o + up) / b
        );
        println!("| operator peak RSS | {:.0} MiB | ≤ 128 MiB |", op.rss);
    }

    // Shards: K replicas sharing the resources.
    let sharded_n: usize = env_or("BENCH_SHARDED", 10_000);
    if sharded_n > 0 {
        sharded(&root, &registry, sharded_n).await;
    }

    // Many resources: memory and time to converge, and the bare loop at that size
    // (`BENCH_LARGE_BARE=0` skips it).
    let large: usize = env_or("BENCH_LARGE", 10_000);
    if large > 0 {
        let bare = if env_or("BENCH_LARGE_BARE", 1) > 0 {
            Some(bare_phase(&root, &registry, Workload::Services(large)).await)
        } else {
            None
        };
        let total = 2 * large;
        let op = operator_phase(&root, Workload::Services(large), total, None).await;
        let o = op.phase.time.as_secs_f64();
        println!("\n## {large} Service resources, {total} children, one round\n");
        println!("| measure | value | target |");
        println!("|---|---:|---|");
        if let Some((bare, _)) = &bare {
            println!(
                "| bare SSA loop, 16 in flight | {:.1} s | |",
                bare.time.as_secs_f64()
            );
        }
        println!(
            "| `host run` start-up | {:.2} s | |",
            op.startup.as_secs_f64()
        );
        println!("| `host run` from `/readyz` until every child is applied | {o:.1} s | |");
        if let Some((bare, _)) = &bare {
            let b = bare.time.as_secs_f64();
            println!("| ratio (from `/readyz`) | {:.2}× | |", o / b);
            println!(
                "| ratio (from process start, start-up included) | {:.2}× | |",
                (o + op.startup.as_secs_f64()) / b
            );
        }
        if let Some(reported) = op.reported_after {
            let r = reported.as_secs_f64();
            println!(
                "| then until every status write and event asked for is written | {r:.1} s | |"
            );
            if let Some((bare, _)) = &bare {
                println!(
                    "| ratio until every report is written too (from `/readyz`; the bare loop writes none) | {:.2}× | |",
                    (o + r) / bare.time.as_secs_f64()
                );
            }
        }
        let api_cpu = |p: &Phase| {
            p.cpu
                .iter()
                .find(|(name, _)| name == "kube-apiserver")
                .map_or(0.0, |(_, c)| *c)
        };
        if let Some((bare, _)) = &bare {
            println!("| API server CPU, bare loop | {:.1} s | |", api_cpu(bare));
            println!("| CPU by process, bare loop | {} | |", cpu_text(&bare.cpu));
        }
        println!(
            "| API server CPU, operator | {:.1} s | |",
            api_cpu(&op.phase)
        );
        println!(
            "| CPU by process, operator | {} | |",
            cpu_text(&op.phase.cpu)
        );
        println!(
            "| operator writes until then, as it counts them | {} | |",
            by_verb(&op.writes)
        );
        let (audited, leases) = &op.api_writes;
        println!(
            "| operator writes until then, as the API server's audit log counts them (Lease apart) | {} | |",
            by_verb(audited)
        );
        println!("| Lease writes until then | {leases} | |");
        println!("| operator peak RSS | {:.0} MiB | ≤ 128 MiB |", op.rss);
        println!(
            "| operator peak RSS at `/readyz` (every watch listed) | {:.0} MiB | |",
            op.rss_ready
        );
        println!("| operator RSS at the end | {:.0} MiB | |", op.rss_end);
    }
}

/// Where the `host run` started as `identity` logs.
fn host_log(identity: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("wasm-operator-{identity}.log"))
}

/// Starts `host run` (the release binary, its own process) with leader election on a Lease in
/// `ns`, as `identity`, connecting with `kubeconfig`, with `extra` arguments; its log goes to a
/// file named after `identity`.
fn spawn_host(
    kubeconfig: &std::path::Path,
    ns: &str,
    port: u16,
    identity: &str,
    extra: &[String],
) -> KillOnDrop {
    let cache = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench-cache");
    let log = std::fs::File::create(host_log(identity)).unwrap();
    let child = Command::new(host_binary())
        .args([
            "run".to_owned(),
            "--leader-elect=true".to_owned(),
            format!("--lease-namespace={ns}"),
            format!("--identity={identity}"),
            "--max-writes-in-flight=16".to_owned(),
            format!("--metrics-addr=127.0.0.1:{port}"),
            "--metrics-secure=false".to_owned(),
            format!("--watch-namespace={ns}"),
        ])
        .args(extra)
        .args(
            std::env::var("BENCH_HOST_ARGS")
                .unwrap_or_default()
                .split_whitespace(),
        )
        .env("KUBECONFIG", kubeconfig)
        .env("WASM_OPERATOR_CACHE", &cache)
        .env(
            "RUST_LOG",
            std::env::var("BENCH_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("host run starts");
    KillOnDrop(child)
}

/// The `host` binary the operator phases run: this build's, or `BENCH_HOST_BIN` (such as the
/// static musl binary of a release, which is what the image runs).
fn host_binary() -> std::ffi::OsString {
    std::env::var_os("BENCH_HOST_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_host").into())
}

/// The process name (`comm`, its first 15 bytes) of [`host_binary`], whose CPU time
/// [`machine_cpu`] counts as `host`'s.
fn host_comm() -> String {
    let bin = host_binary();
    let name = std::path::Path::new(&bin)
        .file_name()
        .map_or_else(|| "host".into(), |n| n.to_string_lossy().into_owned());
    name.chars().take(15).collect()
}

/// Starts `host run --shards K` (the release binary, its own process) as `identity` on the
/// Leases of `ns`; returns at once (a replica of shards is ready while it waits for them).
fn start_replica(
    kubeconfig: &std::path::Path,
    ns: &str,
    port: u16,
    identity: &str,
    shards: u32,
) -> KillOnDrop {
    spawn_host(
        kubeconfig,
        ns,
        port,
        identity,
        &[format!("--shards={shards}")],
    )
}

/// Who the sharded runs' replicas are to the API server (`BENCH_AS`): by default, as the chart
/// installs them, the operator's ServiceAccount with the RBAC `host rbac --shards K` prints and a
/// FlowSchema that puts its Lease requests in the `leader-election` priority level (the chart's,
/// `leaderElection.flowSchema`); `sa-no-flowschema`, the same without it (every request in
/// `workload-low`, a ServiceAccount's); `admin`, the control plane's admin certificate
/// (`system:masters`, which API Priority and Fairness exempts). Returns the kubeconfig they use.
async fn replica_identity(
    cp: &testenv::ControlPlane,
    client: &kube::Client,
    ns: &str,
    shards: u32,
) -> std::path::PathBuf {
    let mode = bench_as();
    if mode == "admin" {
        return cp.kubeconfig().to_owned();
    }
    grant_operator_rights(cp, ns, shards, mode == "sa");
    let kubeconfig = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("bench-kubeconfig-{ns}.json"));
    cp.write_service_account_kubeconfig(client, ns, "wasm-operator", &kubeconfig)
        .await
        .expect("the replicas' kubeconfig");
    kubeconfig
}

/// `BENCH_AS`: `sa` (the default), `sa-no-flowschema` or `admin` ([`replica_identity`]).
fn bench_as() -> String {
    let mode = std::env::var("BENCH_AS").unwrap_or_else(|_| "sa".into());
    assert!(
        ["sa", "sa-no-flowschema", "admin"].contains(&mode.as_str()),
        "BENCH_AS: sa, sa-no-flowschema or admin"
    );
    mode
}

/// Gives the ServiceAccount `ns/wasm-operator` what `host rbac --shards K` prints for replicas
/// serving `ns` with their Leases there, and with `flow_schema` what the chart's
/// templates/flowschema.yaml renders for it.
fn grant_operator_rights(cp: &testenv::ControlPlane, ns: &str, shards: u32, flow_schema: bool) {
    // This build's binary: `BENCH_HOST_BIN` may be a wrapper that prints more (a profiler).
    let out = Command::new(env!("CARGO_BIN_EXE_host"))
        .args(["rbac", "-n", ns, "--watch-namespace", ns])
        .args([
            format!("--shards={shards}"),
            "--metrics-secure=false".into(),
        ])
        .output()
        .expect("host rbac runs");
    assert!(out.status.success(), "host rbac: {out:?}");
    let mut manifests = String::from_utf8(out.stdout).expect("host rbac prints text");
    if flow_schema {
        // The chart's own FlowSchema, as it installs it for a release in `ns` (its
        // ServiceAccount, `wasm-operator`, is the one `host rbac` names).
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let helm = testenv::helm().expect("helm");
        let out = Command::new(helm)
            .current_dir(&root)
            .args([
                "template",
                "wasm-operator",
                "charts/wasm-operator",
                "--namespace",
                ns,
            ])
            .args(["--show-only", "templates/flowschema.yaml"])
            .env(
                "HELM_CACHE_HOME",
                std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("helm-home"),
            )
            .output()
            .expect("helm template runs");
        assert!(out.status.success(), "helm template: {out:?}");
        let flow = String::from_utf8(out.stdout).expect("helm prints text");
        manifests.push_str(&format!("---\n{flow}\n"));
    }
    let file =
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("bench-rbac-{ns}.yaml"));
    std::fs::write(&file, manifests).unwrap();
    let out = cp.kubectl(&["apply", "--server-side", "-f", &file.display().to_string()]);
    assert!(out.status.success(), "the operator's RBAC applied: {out:?}");
}

/// The shards a replica says it holds (`wasm_operator_shards_held`).
fn shards_held(port: u16) -> Vec<u32> {
    testenv::shards_held(&scrape(port))
}

/// Waits until the `want` resources `api` lists with `selector` each have a status observed at
/// their generation (Ready or not: many wait for the Deployment controller, which lags minutes
/// behind at this size). Returns how long that took.
async fn settled(api: &Api<DynamicObject>, selector: &str, want: usize) -> Duration {
    let since = Instant::now();
    loop {
        let listed = api
            .list(&kube::api::ListParams::default().labels(selector))
            .await
            .expect("resources listed");
        let ready = listed
            .items
            .iter()
            .filter(|o| {
                o.metadata.generation.is_some()
                    && o.data["status"]["observedGeneration"].as_i64() == o.metadata.generation
            })
            .count();
        if ready >= want {
            return since.elapsed();
        }
        assert!(
            since.elapsed() < Duration::from_secs(600),
            "{ready} of {want} resources ({selector}) observed in 10 minutes"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// A failover: one replica killed.
#[derive(Debug, Clone, Copy)]
struct Failover {
    /// From the kill until a change of one of the killed replica's resources is applied by
    /// another replica.
    killed_shard: Duration,
    /// The same from the shard's last renewal as the API server wrote it (its audit log's
    /// answer to the killed holder's last update of the shard's Lease), where the Lease's
    /// duration runs from: the kill comes up to a renewal period (2 s) after it.
    since_renewal: Option<Duration>,
    /// From the kill until a change in another shard is applied.
    other_shard: Duration,
    /// How long after every child was applied the killed replica's shard had settled (every
    /// status observed at its generation), when it was killed.
    settled_after: Duration,
}

/// When the API server answered the last update of the Lease `name` before `before`, from its
/// audit log (`stageTimestamp` of the `ResponseComplete` stage).
fn last_lease_write(
    cp: &testenv::ControlPlane,
    name: &str,
    before: Timestamp,
) -> Option<Timestamp> {
    // Only the lines that name the Lease are parsed: the log holds every write of the run.
    let log = std::fs::read_to_string(cp.dir().join("audit.log")).unwrap_or_default();
    log.lines()
        .filter(|l| l.contains(name))
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| {
            e["objectRef"]["resource"] == "leases"
                && e["objectRef"]["name"] == name
                && e["stage"] == "ResponseComplete"
                && e["responseStatus"]["code"] == 200
                && matches!(e["verb"].as_str(), Some("update" | "patch"))
        })
        .filter_map(|e| e["stageTimestamp"].as_str()?.parse::<Timestamp>().ok())
        .filter(|t| *t < before)
        .max()
}

/// One sharded run: what it measured.
struct ShardedRun {
    shards: u32,
    /// From the replicas' start until every child exists.
    time: Duration,
    /// Each replica's peak RSS, MiB.
    rss: Vec<f64>,
    /// The API server's CPU meanwhile, seconds.
    api_cpu: f64,
    /// The replicas' CPU meanwhile, seconds, summed.
    host_cpu: f64,
    /// With more than one shard: from killing the holder of a shard until a change of one of
    /// its resources is applied by another replica; and a change in another shard right after
    /// the kill; and how long after every child was applied the killed replica's shard had
    /// settled (when it was killed).
    failover: Option<Failover>,
}

/// The 8th measure: `n` Service resources served by K replicas (`--shards K`), each a process
/// of its own on one control plane of its own; then, with K > 1, one replica killed.
async fn sharded_run(root: &std::path::Path, n: usize, shards: u32) -> ShardedRun {
    let (cp, client) = control_plane(root).await;
    let ns = cp.namespace(&client, "sharded").await.unwrap();
    create_resources(&client, &ns, Workload::Services(n)).await;
    let kubeconfig = replica_identity(&cp, &client, &ns, shards).await;
    let seen = count_children(&client, &ns);
    let ports: Vec<u16> = (0..shards).map(|_| free_port()).collect();
    let cpu0 = machine_cpu();
    let started = Instant::now();
    let mut replicas: Vec<KillOnDrop> = ports
        .iter()
        .enumerate()
        .map(|(i, port)| {
            let identity = format!("shard-bench-{i}");
            start_replica(&kubeconfig, &ns, *port, &identity, shards)
        })
        .collect();
    trace(&seen, 2 * n, "sharded");
    all_seen(seen, 2 * n, started + Duration::from_secs(900)).await;
    let time = started.elapsed();
    let cpu = delta(&cpu0, &machine_cpu());
    let cpu_of = |name: &str| cpu.iter().find(|(n, _)| n == name).map_or(0.0, |(_, c)| *c);
    let rss = replicas.iter().map(|r| peak_rss_mib(r.0.id())).collect();
    let failover = if shards > 1 {
        // Who holds what: each replica its share, one shard each.
        let held: Vec<Vec<u32>> = ports.iter().map(|p| shards_held(*p)).collect();
        // `BENCH_KILL_SHARD`: kill the holder of that shard (such as 0, whose holder also
        // labels) where K has it; by default the first replica holding one.
        let kill: Option<u32> = std::env::var("BENCH_KILL_SHARD")
            .ok()
            .map(|s| s.parse().expect("BENCH_KILL_SHARD: a shard index"))
            .filter(|s| *s < shards);
        let victim = held
            .iter()
            .position(|h| kill.map_or(!h.is_empty(), |s| h.contains(&s)))
            .expect("a replica holds the shard");
        let lost = kill.unwrap_or(held[victim][0]);
        let sharding = host::operator::shard::Sharding {
            count: shards,
            by: host::operator::shard::ShardBy::Name,
        };
        let in_shard = |want: bool| {
            (0..n)
                .map(|i| format!("svc-{i}"))
                .find(|name| (sharding.of(&ns, name) == lost) == want)
                .expect("a resource of that shard")
        };
        let (orphan, other) = (in_shard(true), in_shard(false));
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &service_ar());
        // A takeover with every resource of the shard's last reconciliation recorded (its status
        // observed at its generation), not while statuses are still being written after the
        // children were all applied.
        let of_shard = (0..n)
            .filter(|i| sharding.of(&ns, &format!("svc-{i}")) == lost)
            .count();
        let settling = settled(
            &api,
            &format!("{}={lost}", host::ownership::SHARD_LABEL),
            of_shard,
        )
        .await;
        let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
            Api::namespaced(client.clone(), &ns);
        let scale = |name: String, replicas: i32| {
            let (api, deployments) = (api.clone(), deployments.clone());
            async move {
                let patch = json!({ "spec": { "replicas": replicas } });
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .expect("resource patched");
                let since = Instant::now();
                loop {
                    let now = deployments
                        .get(&name)
                        .await
                        .ok()
                        .and_then(|d| d.spec?.replicas);
                    if now == Some(replicas) {
                        return since.elapsed();
                    }
                    assert!(
                        since.elapsed() < Duration::from_secs(120),
                        "{name} not scaled in 2 minutes"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        let killed = Instant::now();
        let killed_at = Timestamp::now();
        drop(replicas.remove(victim));
        let other_shard = scale(other, 1).await;
        scale(orphan, 1).await;
        let killed_shard = killed.elapsed();
        let renewed = last_lease_write(&cp, &format!("wasm-operator-shard-{lost}"), killed_at);
        let since_renewal = renewed.and_then(|r| {
            let before_kill = Duration::try_from(killed_at.duration_since(r)).ok()?;
            Some(killed_shard + before_kill)
        });
        Some(Failover {
            killed_shard,
            since_renewal,
            other_shard,
            settled_after: settling,
        })
    } else {
        None
    };
    for r in replicas {
        stop(r);
    }
    ShardedRun {
        shards,
        time,
        rss,
        api_cpu: cpu_of("kube-apiserver"),
        host_cpu: cpu_of("host"),
        failover,
    }
}

/// What a replica holds whatever its share: the peak RSS of `host run` on a control plane with
/// no resources, 5 s after its `/readyz` (every watch listed), MiB; twice: the first start may
/// find the compile cache without this build's plugins and compile them (the replicas that
/// follow find them compiled), the second finds them. And a third start that serves one
/// resource, 5 s after its children were applied: what a replica at work holds whatever its
/// share (the code of a reconciliation paged in, the plugin's compiled code and an instance's
/// memory, the buffers of writes), a base that can be chosen the other way. (first, second, at
/// work)
async fn base_rss(root: &std::path::Path) -> (f64, f64, f64) {
    let (cp, client) = control_plane(root).await;
    let mut peaks = Vec::new();
    for (start, resources) in [
        ("base-bench-first", 0),
        ("base-bench-second", 0),
        ("base-bench-one", 1),
    ] {
        // A namespace (and so a Lease) each: the first's is not waited for.
        let ns = cp.namespace(&client, start).await.unwrap();
        create_resources(&client, &ns, Workload::Services(resources)).await;
        let seen = count_children(&client, &ns);
        let operator = start_operator(&cp, &client, &ns, free_port(), start).await;
        all_seen(
            seen,
            2 * resources,
            Instant::now() + Duration::from_secs(60),
        )
        .await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        peaks.push(peak_rss_mib(operator.0.id()));
        stop(operator);
    }
    (peaks[0], peaks[1], peaks[2])
}

/// The sharded runs (`BENCH_SHARDED` resources, 0 skips them) with 1, 2 and 4 replicas, and
/// their table.
async fn sharded(root: &std::path::Path, registry: &host::registry::Registry, n: usize) {
    let bare = if env_or("BENCH_SHARDED_BARE", 1) > 0 {
        Some(bare_phase(root, registry, Workload::Services(n)).await.0)
    } else {
        None
    };
    // The bare loop again as the replicas are to the API server, when they are not its admin.
    let bare_as_operator = if bare.is_some() && bench_as() != "admin" {
        Some(
            bare_phase_as(root, registry, Workload::Services(n), true)
                .await
                .0,
        )
    } else {
        None
    };
    let (first_base, base, working) = base_rss(root).await;
    let mut runs = Vec::new();
    // `BENCH_SHARDS`: which shard counts, such as `1,4` (default `1,2,4`).
    let counts: Vec<u32> = std::env::var("BENCH_SHARDS")
        .unwrap_or_else(|_| "1,2,4".into())
        .split(',')
        .map(|k| {
            k.trim()
                .parse()
                .expect("BENCH_SHARDS: shard counts, such as 1,2,4")
        })
        .collect();
    for shards in counts {
        let run = sharded_run(root, n, shards).await;
        eprintln!(
            "{shards} shard(s): {:.1} s, RSS {:?} MiB",
            run.time.as_secs_f64(),
            run.rss
        );
        runs.push(run);
    }
    println!(
        "\n## Shards: {n} Service resources, {} children, K replicas of `host run --shards K` on one control plane\n",
        2 * n
    );
    if let Some(bare) = &bare {
        println!(
            "Bare SSA loop (16 in flight, a control plane of its own): {:.1} s as the control plane's admin (API server CPU {:.1} s){}.\n",
            bare.time.as_secs_f64(),
            bare.cpu_of("kube-apiserver"),
            bare_as_operator.as_ref().map_or(String::new(), |b| format!(
                "; {:.1} s as the operator's ServiceAccount with its RBAC (API server CPU {:.1} s)",
                b.time.as_secs_f64(),
                b.cpu_of("kube-apiserver")
            ))
        );
    }
    println!(
        "The replicas act as: {} (`BENCH_AS`).\n",
        std::env::var("BENCH_AS").unwrap_or_else(|_| "sa".into())
    );
    println!(
        "A replica's fixed base: {base:.0} MiB (the peak RSS of one `host run`, no shards, on a control plane with no resources, 5 s after `/readyz`, its plugins in the compile cache; {first_base:.0} MiB at a first start that may have compiled them; a replica of shards has a Lease and a pipeline per shard besides); at work, {working:.0} MiB (the same serving one resource, 5 s after its children were applied: the reconciliation's code paged in, the plugin's compiled code, an instance's memory). The issue's target for each replica of K is the base plus 1/K of K = 1's peak; a stricter reading counts the base once: the base plus 1/K of what K = 1 holds above it. Both are printed, each with the idle base and the base at work.\n"
    );
    println!(
        "| K | from the processes' start until every child is applied | ratio to the bare loop (admin; as the ServiceAccount) | each replica's peak RSS | base + K = 1's peak / K (idle base; at work) | base + (K = 1's peak - base) / K (idle base; at work) | replicas' CPU | API server CPU | failover: a change in the killed replica's shard applied (from the kill; from its Lease's last renewal) | a change in another shard, right after the kill | the killed replica's shard observed (every status at its generation), after every child was applied |"
    );
    println!("|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|");
    let single = runs
        .first()
        .and_then(|r| r.rss.first().copied())
        .unwrap_or(0.0);
    for r in &runs {
        let t = r.time.as_secs_f64();
        let ratio = bare.as_ref().map_or("".to_owned(), |b| {
            let operator = bare_as_operator.as_ref().map_or(String::new(), |o| {
                format!("; {:.2}×", t / o.time.as_secs_f64())
            });
            format!("{:.2}×{operator}", t / b.time.as_secs_f64())
        });
        let rss = r
            .rss
            .iter()
            .map(|m| format!("{m:.0}"))
            .collect::<Vec<_>>()
            .join(", ");
        let (over, other, settling) = r.failover.map_or(Default::default(), |f| {
            let renewal = f
                .since_renewal
                .map_or("?".to_owned(), |d| format!("{:.1} s", d.as_secs_f64()));
            (
                format!("{:.1} s; {renewal}", f.killed_shard.as_secs_f64()),
                format!("{:.1} s", f.other_shard.as_secs_f64()),
                format!("{:.1} s", f.settled_after.as_secs_f64()),
            )
        });
        println!(
            "| {} | {t:.1} s | {ratio} | {rss} MiB | {:.0}; {:.0} MiB | {:.0}; {:.0} MiB | {:.1} s | {:.1} s | {over} | {other} | {settling} |",
            r.shards,
            base + single / f64::from(r.shards),
            working + single / f64::from(r.shards),
            base + (single - base) / f64::from(r.shards),
            working + (single - working) / f64::from(r.shards),
            r.host_cpu,
            r.api_cpu,
        );
    }
}

/// Rounds of both phases on `n` Service resources, the quiet minute and the restart: the first
/// table.
async fn services(
    root: &std::path::Path,
    registry: &host::registry::Registry,
    n: usize,
    quiet: u64,
    rounds: usize,
) {
    // Rounds of (bare loop, operator), each phase on a fresh control plane: a control plane
    // gets slower as objects pile up in it (the bare loop's time went from 5.5 s to 20.6 s over
    // eight rounds in one), so a second phase on the first one's control plane would pay for
    // the first's objects. The last operator run also measures the quiet period.
    let (mut bares, mut operators) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let (bare, total) = bare_phase(root, registry, Workload::Services(n)).await;
        let last = round + 1 == rounds;
        let operator =
            operator_phase(root, Workload::Services(n), total, last.then_some(quiet)).await;
        eprintln!(
            "round {}: bare {:.2} s ({}), operator {:.2} s ({})",
            round + 1,
            bare.time.as_secs_f64(),
            cpu_text(&bare.cpu),
            operator.phase.time.as_secs_f64(),
            cpu_text(&operator.phase.cpu),
        );
        bares.push(bare);
        operators.push(operator);
    }

    let secs = |v: f64| format!("{v:.1} s");
    let bare_times: Vec<f64> = bares.iter().map(|p| p.time.as_secs_f64()).collect();
    let op_times: Vec<f64> = operators
        .iter()
        .map(|o| o.phase.time.as_secs_f64())
        .collect();
    let ratios: Vec<f64> = op_times
        .iter()
        .zip(&bare_times)
        .map(|(o, b)| o / b)
        .collect();
    let startups: Vec<f64> = operators.iter().map(|o| o.startup.as_secs_f64()).collect();
    let op_cpu: Vec<f64> = operators.iter().map(|o| o.phase.cpu_of("host")).collect();
    let api_bare: Vec<f64> = bares.iter().map(|p| p.cpu_of("kube-apiserver")).collect();
    let api_op: Vec<f64> = operators
        .iter()
        .map(|o| o.phase.cpu_of("kube-apiserver"))
        .collect();
    let last = operators.last().expect("at least one round");
    let steady = last
        .quiet
        .as_ref()
        .expect("the last round measures the quiet period");
    let quiet_writes = steady.writes.iter().fold(0.0, |sum, (_, n)| sum + n);

    println!(
        "## Operator ({n} Service resources, {} children; {rounds} round(s), each phase on a fresh control plane)\n",
        2 * n
    );
    println!("| measure | median | rounds | target |");
    println!("|---|---:|---|---|");
    row("bare SSA loop, 16 in flight", &bare_times, &secs, "");
    row(
        "`host run` start-up: process start to `/readyz` (caches synced)",
        &startups,
        &|v| format!("{v:.2} s"),
        "",
    );
    row(
        "`host run` from `/readyz` until every child is applied",
        &op_times,
        &secs,
        "",
    );
    row(
        "ratio (from `/readyz`)",
        &ratios,
        &|v| format!("{v:.2}×"),
        "≤ 1.25×",
    );
    let with_startup: Vec<f64> = operators
        .iter()
        .zip(&bare_times)
        .map(|(o, b)| (o.startup.as_secs_f64() + o.phase.time.as_secs_f64()) / b)
        .collect();
    row(
        "ratio (from process start, start-up included)",
        &with_startup,
        &|v| format!("{v:.2}×"),
        "",
    );
    row("operator CPU until then", &op_cpu, &secs, "");
    row("API server CPU, bare loop", &api_bare, &secs, "");
    row("API server CPU, operator", &api_op, &secs, "");
    println!(
        "| operator writes until then (last round) | {} | | |",
        by_verb(&last.writes)
    );
    println!(
        "| every resource Ready (last round), after convergence | {:.0} s | | |",
        steady.ready_after.as_secs_f64()
    );
    println!(
        "| writes during a quiet {quiet} s once all are Ready | {quiet_writes}{} | | 0 |",
        if steady.writes.is_empty() {
            String::new()
        } else {
            format!(" ({})", by_verb(&steady.writes))
        }
    );
    let total = |w: &[(String, f64)]| w.iter().fold(0.0, |sum, (_, n)| sum + n);
    let listed = |w: &[(String, f64)]| {
        if w.is_empty() {
            String::new()
        } else {
            format!(" ({})", by_verb(w))
        }
    };
    println!(
        "| writes during the quiet {quiet} s, counted by the API server (audit log), Lease apart | {}{} | | 0 |",
        total(&steady.api_writes),
        listed(&steady.api_writes)
    );
    println!(
        "| Lease writes during the quiet {quiet} s (renewals every 2 s) | {} | | |",
        steady.lease_writes
    );
    println!(
        "| writes in the first {RESTART_SECS} s after a restart with nothing changed (audit log, Lease apart) | {}{} | | 0 |",
        total(&steady.restart_writes),
        listed(&steady.restart_writes)
    );
    println!("| operator peak RSS | {:.0} MiB | | ≤ 128 MiB |", last.rss);
}
