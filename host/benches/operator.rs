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
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::discovery::ApiResource;
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

fn peak_rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

async fn count(client: &kube::Client, ns: &str, ar: &ApiResource) -> usize {
    let api: Api<kube::api::PartialObjectMeta<DynamicObject>> =
        Api::namespaced_with(client.clone(), ns, ar);
    api.list(&ListParams::default().labels("app.kubernetes.io/managed-by=wasm-operator"))
        .await
        .map_or(0, |l| l.items.len())
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
    let bare_ns = cp.namespace(&client, "bare").await.unwrap();
    let op_ns = cp.namespace(&client, "operated").await.unwrap();

    // The objects: what the built-in service plugin renders for each resource.
    let runtime = host::plugin::Runtime::new(host::plugin::Limits::default(), None).unwrap();
    let registry =
        host::registry::Registry::load(&runtime, host::types::Context::default(), true, &[])
            .unwrap();
    let mut children = Vec::new();
    for i in 0..n {
        let r = host::documents::resource(&service(i, &bare_ns)).unwrap();
        children.extend(registry.render(&r).unwrap());
    }
    let deployments = ApiResource::erase::<k8s_openapi::api::apps::v1::Deployment>(&());
    let services = ApiResource::erase::<k8s_openapi::api::core::v1::Service>(&());

    // 1. The bare loop.
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
    let bare = started.elapsed();

    // 2. The operator, as its own process, on resources that already exist.
    let resources: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &op_ns,
        &ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
            "hanzo.ai", "v1", "Service",
        )),
    );
    futures::stream::iter(0..n)
        .map(|i| {
            let api = resources.clone();
            let obj = service(i, &op_ns);
            async move {
                api.patch(
                    &format!("svc-{i}"),
                    &PatchParams::apply("bench"),
                    &Patch::Apply(&obj),
                )
                .await
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await
        .expect("resources created");
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
            "--concurrency=16",
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
    let mut operator = KillOnDrop(child);
    let pid = operator.0.id();
    eprintln!("operator log: {}", log_path.display());
    // The clock starts when the operator says it is ready (plugins loaded, controllers started),
    // as the bare loop's starts with its client made.
    let up = Instant::now();
    while !scrape_path(port, "/readyz").contains("200 OK") {
        assert!(
            up.elapsed() < Duration::from_secs(60),
            "the operator did not become ready"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let started = Instant::now();
    loop {
        let (d, s) = (
            count(&client, &op_ns, &deployments).await,
            count(&client, &op_ns, &services).await,
        );
        if d >= n && s >= n {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "the operator did not converge in 5 minutes: {d} Deployments, {s} Services"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let converged = started.elapsed();

    // 3. A quiet period after convergence: let status settle, then count writes.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let before = writes(port);
    tokio::time::sleep(Duration::from_secs(quiet)).await;
    let quiet_writes = writes(port) - before;
    let rss = peak_rss_mib(pid);
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let _ = operator.0.wait();

    let ratio = converged.as_secs_f64() / bare.as_secs_f64();
    println!(
        "## Operator ({n} Service resources, {} children)\n",
        children.len()
    );
    println!("| measure | value | target |");
    println!("|---|---:|---|");
    println!(
        "| bare SSA loop, 16 in flight | {:.1} s | |",
        bare.as_secs_f64()
    );
    println!(
        "| `host run` until every child is applied | {:.1} s | |",
        converged.as_secs_f64()
    );
    println!("| ratio | {ratio:.2}× | ≤ 1.25× |");
    println!("| writes during a quiet {quiet} s after convergence | {quiet_writes} | 0 |");
    println!("| operator peak RSS | {rss:.0} MiB | ≤ 128 MiB |");
}
