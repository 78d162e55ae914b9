//! The operator benchmark, on a real control plane of its own: prints a table, asserts nothing.
//!
//! 1. A bare loop server-side-applies the children of N Service resources directly (the same
//!    objects the plugin renders, 16 requests in flight): the physical limit.
//! 2. `host run` (the release binary, a separate process) reconciles the same N resources; the
//!    time is until every child exists.
//! 3. Writes the operator sends during a quiet minute after convergence (from its /metrics).
//! 4. The operator's peak RSS (VmHWM).
//!
//! Run: `cargo bench -p host --bench operator` (N defaults to 1000; `BENCH_RESOURCES=200` for a
//! quicker run; `BENCH_QUIET_SECS` sets the quiet period, default 60).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
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

fn writes(port: u16) -> f64 {
    scrape(port)
        .lines()
        .filter(|l| l.starts_with("wasm_operator_api_writes_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
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

fn peak_rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
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

/// Creates `n` Service resources in `ns` and returns them as the API server stored them.
async fn create_resources(
    client: &kube::Client,
    ns: &str,
    ar: &ApiResource,
    n: usize,
) -> Vec<DynamicObject> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, ar);
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            let obj = service(i, ns);
            async move {
                api.patch(
                    &format!("svc-{i}"),
                    &PatchParams::apply("bench"),
                    &Patch::Apply(&obj),
                )
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

/// Waits until each counter reaches `n`; panics at `deadline`.
async fn all_seen(counters: [tokio::sync::watch::Receiver<usize>; 2], n: usize, deadline: Instant) {
    for mut seen in counters {
        let all = tokio::time::timeout_at(deadline.into(), seen.wait_for(|c| *c >= n))
            .await
            .is_ok();
        assert!(all, "not converged in time: {} of {n} seen", *seen.borrow());
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::var("BENCH_RESOURCES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let quiet: u64 = std::env::var("BENCH_QUIET_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf();
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
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .max(1);
    let service_ar = ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
        "hanzo.ai", "v1", "Service",
    ));
    let runtime = host::plugin::Runtime::new(host::plugin::Limits::default(), None).unwrap();
    let registry =
        host::registry::Registry::load(&runtime, host::types::Context::default(), true, &[])
            .unwrap();
    let deployments = ApiResource::erase::<k8s_openapi::api::apps::v1::Deployment>(&());
    let services = ApiResource::erase::<k8s_openapi::api::core::v1::Service>(&());
    let managed = "app.kubernetes.io/managed-by=wasm-operator";

    // Rounds of (bare loop, operator) on fresh namespaces (BENCH_ROUNDS, default 1); each side's
    // best round counts. Later rounds run on a control plane still busy with the earlier
    // rounds' objects (the controller manager's backlog), so they are slower on both sides.
    let (mut bares, mut operators, mut cpus) = (Vec::new(), Vec::new(), Vec::new());
    let mut last = None;
    let mut children_count = 0;
    for round in 0..rounds {
        let bare_ns = cp
            .namespace(&client, &format!("bare-{round}"))
            .await
            .unwrap();
        let op_ns = cp
            .namespace(&client, &format!("operated-{round}"))
            .await
            .unwrap();

        // The objects: exactly what the operator applies for each resource, the plugin's render
        // with the host's owner reference and labels, so that both runs ask the same of the API
        // server and of the garbage collector. The bare loop's owners exist in their own
        // namespace, which the operator does not watch.
        let bare_owners = create_resources(&client, &bare_ns, &service_ar, n).await;
        let mut children = Vec::new();
        for owner in &bare_owners {
            let r = host::documents::resource(&serde_json::to_value(owner).unwrap()).unwrap();
            for mut child in registry.render(&r).unwrap() {
                host::operator::stamp_child(
                    &mut child,
                    &service_ar.api_version,
                    &service_ar.kind,
                    &r.name,
                    &r.uid,
                );
                children.push(child);
            }
        }
        children_count = children.len();

        // 1. The bare loop, 16 applies in flight. Both sides are timed the same way, until a
        // watch has seen every child; the watches run for both, so both pay for them.
        let bare_seen = [
            count_appearing(&client, &bare_ns, &deployments, managed),
            count_appearing(&client, &bare_ns, &services, managed),
        ];
        let params = PatchParams::apply("bench.wasm-operator.dev/bare").force();
        let started = Instant::now();
        futures::stream::iter(children.iter().cloned())
            .map(|obj| {
                let client = client.clone();
                let ar = if obj["kind"] == "Deployment" {
                    deployments.clone()
                } else {
                    services.clone()
                };
                let (ns, params) = (bare_ns.clone(), params.clone());
                async move {
                    let name = obj["metadata"]["name"].as_str().unwrap().to_owned();
                    Api::<DynamicObject>::namespaced_with(client, &ns, &ar)
                        .patch(&name, &params, &Patch::Apply(&obj))
                        .await
                }
            })
            .buffer_unordered(16)
            .try_collect::<Vec<_>>()
            .await
            .expect("bare applies");
        all_seen(bare_seen, n, started + Duration::from_secs(300)).await;
        bares.push(started.elapsed());

        // 2. The operator, as its own process, on resources that already exist; 8
        // reconciliations of two children each, so 16 applies in flight too.
        create_resources(&client, &op_ns, &service_ar, n).await;
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let cache = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench-cache");
        let log_path = std::env::temp_dir().join("wasm-operator-bench.log");
        let log = std::fs::File::create(&log_path).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_host"))
            .args([
                "run",
                "--leader-elect=false",
                "--concurrency=8",
                &format!("--metrics-addr=127.0.0.1:{port}"),
            ])
            .arg(format!("--namespace={op_ns}"))
            .env("KUBECONFIG", cp.kubeconfig())
            .env("WASM_OPERATOR_CACHE", &cache)
            .env(
                "RUST_LOG",
                std::env::var("BENCH_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("host run starts");
        let operator = KillOnDrop(child);
        // Watch for the children before the operator starts, so that none is missed.
        let seen = [
            count_appearing(&client, &op_ns, &deployments, managed),
            count_appearing(&client, &op_ns, &services, managed),
        ];
        // The clock starts when the operator says it is ready (plugins loaded, watches
        // started), as the bare loop's starts with its client made.
        let up = Instant::now();
        while !scrape_path(port, "/readyz").contains("200 OK") {
            assert!(
                up.elapsed() < Duration::from_secs(60),
                "the operator did not become ready; its log: {}",
                log_path.display()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let started = Instant::now();
        let cpu_before = cpu_seconds(operator.0.id());
        all_seen(seen, n, started + Duration::from_secs(300)).await;
        operators.push(started.elapsed());
        cpus.push(cpu_seconds(operator.0.id()) - cpu_before);
        eprintln!(
            "round {}: bare {:.1} s, operator {:.1} s",
            round + 1,
            bares[round].as_secs_f64(),
            operators[round].as_secs_f64()
        );
        let by_verb = writes_by_verb(port);
        if round + 1 < rounds {
            stop(operator);
        } else {
            last = Some((operator, port, by_verb));
        }
    }
    let (operator, port, by_verb) = last.expect("at least one round");
    let pid = operator.0.id();

    // 3. A quiet period after convergence: let status settle, then count writes.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let before = writes(port);
    tokio::time::sleep(Duration::from_secs(quiet)).await;
    let quiet_writes = writes(port) - before;
    let rss = peak_rss_mib(pid);
    stop(operator);

    let bare = *bares.iter().min().unwrap();
    let converged = *operators.iter().min().unwrap();
    let secs = |v: &[Duration]| {
        v.iter()
            .map(|d| format!("{:.1}", d.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let ratio = converged.as_secs_f64() / bare.as_secs_f64();
    println!(
        "## Operator ({n} Service resources, {children_count} children; best of {rounds} round(s))\n"
    );
    println!("| measure | value | target |");
    println!("|---|---:|---|");
    println!(
        "| bare SSA loop, 16 in flight | {:.1} s (rounds: {}) | |",
        bare.as_secs_f64(),
        secs(&bares)
    );
    println!(
        "| `host run` until every child is applied | {:.1} s (rounds: {}) | |",
        converged.as_secs_f64(),
        secs(&operators)
    );
    println!("| ratio | {ratio:.2}× | ≤ 1.25× |");
    println!(
        "| operator CPU until then | {:.1} s (rounds: {}) | |",
        cpus.iter().copied().fold(f64::INFINITY, f64::min),
        cpus.iter()
            .map(|c| format!("{c:.1}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "| operator writes until then | {} | |",
        by_verb
            .iter()
            .map(|(verb, n)| format!("{n} {verb}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("| writes during a quiet {quiet} s after convergence | {quiet_writes} | 0 |");
    println!("| operator peak RSS | {rss:.0} MiB | ≤ 128 MiB |");
}
