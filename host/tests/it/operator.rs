//! `host run` on the real control plane: each test runs an operator of its own, in-process,
//! watching a namespace of its own.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;
use testenv::ControlPlane;

use crate::judge::cluster;

/// An operator running in this test.
struct Operator {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), host::operator::Error>>,
    metrics: SocketAddr,
}

impl Operator {
    async fn start(cp: &ControlPlane, namespace: &str, group: &str, extra: &[PathBuf]) -> Self {
        let client = cp.client().await.unwrap();
        Self::start_with(
            client,
            Some(namespace),
            namespace,
            &format!("test-{namespace}"),
            group,
            extra,
        )
        .await
    }

    async fn start_with(
        client: kube::Client,
        watch: Option<&str>,
        lease_namespace: &str,
        identity: &str,
        group: &str,
        extra: &[PathBuf],
    ) -> Self {
        let runtime = host::plugin::Runtime::new(
            host::plugin::Limits {
                deadline: Duration::from_millis(500),
                ..Default::default()
            },
            Some(crate::support::cache()),
        )
        .unwrap();
        let ctx = host::types::Context {
            api_group: group.to_owned(),
            cluster_domain: "cluster.local".to_owned(),
        };
        let registry = host::registry::Registry::load(&runtime, ctx, true, extra).unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let metrics: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let settings = host::operator::Settings {
            namespace: watch.map(str::to_owned),
            metrics_addr: metrics,
            leader_election: true,
            lease_namespace: lease_namespace.to_owned(),
            lease_name: "wasm-operator".to_owned(),
            identity: identity.to_owned(),
            concurrency: 4,
            max_writes_in_flight: 16,
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(host::operator::run(
            client,
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

    fn get(&self, path: &str) -> String {
        let mut s = TcpStream::connect(self.metrics).unwrap();
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    fn scrape(&self) -> String {
        self.get("/metrics")
    }

    /// Whether `/readyz` answers 200.
    fn ready(&self) -> bool {
        self.get("/readyz").starts_with("HTTP/1.0 200")
    }

    fn writes(&self) -> f64 {
        self.scrape()
            .lines()
            .filter(|l| l.starts_with("wasm_operator_api_writes_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    async fn stop(mut self) {
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

fn kubectl(cp: &ControlPlane, args: &[&str]) -> (bool, String) {
    let out = cp.kubectl(args);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn apply(cp: &ControlPlane, ns: &str, yaml: &str) {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), yaml).unwrap();
    let (ok, out) = kubectl(
        cp,
        &["apply", "-n", ns, "-f", &file.path().display().to_string()],
    );
    assert!(ok, "kubectl apply: {out}\n{yaml}");
}

/// `kubectl wait --for=condition=Ready`, which works because status follows kstatus.
fn wait_ready(cp: &ControlPlane, ns: &str, what: &str) {
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

fn get(cp: &ControlPlane, ns: &str, what: &str) -> Option<Value> {
    let out = cp.kubectl(&["get", "-n", ns, what, "-o", "json"]);
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).unwrap())
}

async fn eventually(what: &str, timeout: Duration, check: impl FnMut() -> bool) {
    eventually_or(what, timeout, check, String::new).await;
}

/// As [`eventually`], with `explain()` appended to the failure message.
async fn eventually_or(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> bool,
    explain: impl Fn() -> String,
) {
    let deadline = Instant::now() + timeout;
    while !check() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}{}",
            explain()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn condition(obj: &Value, type_: &str) -> (String, String, String) {
    let c = obj["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_).cloned())
        .unwrap_or_default();
    let s = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
    (s("status"), s("reason"), s("message"))
}

const WEB: &str = "apiVersion: hanzo.ai/v1
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_lives_its_whole_life() {
    let cp = cluster();
    let _logs = cp.logs_on_failure();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "life").await.unwrap();
    let op = Operator::start(cp, &ns, "hanzo.ai", &[]).await;

    // Create: children exist, kwok makes the pods Ready, the resource becomes Ready.
    apply(cp, &ns, WEB);
    wait_ready(cp, &ns, "services.hanzo.ai/web");
    let web = get(cp, &ns, "services.hanzo.ai/web").unwrap();
    assert_eq!(
        web["status"]["observedGeneration"],
        web["metadata"]["generation"]
    );
    assert_eq!(condition(&web, "Stalled").0, "False");
    assert_eq!(condition(&web, "Reconciling").0, "False");
    let deployment = get(cp, &ns, "deployment/web").unwrap();
    let owner = &deployment["metadata"]["ownerReferences"][0];
    assert_eq!(
        (owner["kind"].as_str(), owner["controller"].as_bool()),
        (Some("Service"), Some(true))
    );
    assert_eq!(owner["uid"], web["metadata"]["uid"]);
    assert_eq!(
        deployment["metadata"]["labels"]["wasm-operator.dev/owner"],
        web["metadata"]["uid"]
    );
    assert!(get(cp, &ns, "ingress/web").is_some());
    assert!(get(cp, &ns, "service/web").is_some());
    let (_, printed) = kubectl(cp, &["get", "-n", &ns, "services.hanzo.ai"]);
    assert!(
        printed.contains("READY") && printed.contains("True"),
        "{printed}"
    );

    // Update a field: the child follows.
    apply(cp, &ns, &WEB.replace("replicas: 2", "replicas: 3"));
    eventually(
        "the Deployment to have 3 replicas",
        Duration::from_secs(10),
        || get(cp, &ns, "deployment/web").is_some_and(|d| d["spec"]["replicas"] == 3),
    )
    .await;

    // Turn the ingress off: the Ingress is pruned.
    apply(
        cp,
        &ns,
        &WEB.replace("replicas: 2", "replicas: 3").replace(
            "  ingress: { hosts: [web.example.com] }\n",
            "  ingress: { enabled: false }\n",
        ),
    );
    eventually("the Ingress to be pruned", Duration::from_secs(10), || {
        get(cp, &ns, "ingress/web").is_none()
    })
    .await;

    // Delete a child by hand: it comes back within two seconds.
    let (ok, out) = kubectl(cp, &["delete", "-n", &ns, "service/web", "--wait=true"]);
    assert!(ok, "{out}");
    let deleted = Instant::now();
    eventually("the Service to come back", Duration::from_secs(10), || {
        get(cp, &ns, "service/web").is_some()
    })
    .await;
    assert!(
        deleted.elapsed() < Duration::from_secs(2),
        "came back after {:?}",
        deleted.elapsed()
    );

    // Another field manager takes a field we own: ours wins again.
    let (ok, out) = kubectl(
        cp,
        &[
            "patch",
            "-n",
            &ns,
            "deployment/web",
            "--type=merge",
            "--field-manager=intruder",
            "-p",
            r#"{"spec":{"replicas":7}}"#,
        ],
    );
    assert!(ok, "{out}");
    eventually(
        "the Deployment to be ours again",
        Duration::from_secs(10),
        || get(cp, &ns, "deployment/web").is_some_and(|d| d["spec"]["replicas"] == 3),
    )
    .await;

    // Steady state: no writes at all.
    wait_ready(cp, &ns, "services.hanzo.ai/web");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = op.writes();
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(op.writes(), before, "writes during a quiet period");
    let metrics = op.scrape();
    for name in [
        "controller_runtime_reconcile_total",
        "controller_runtime_reconcile_time_seconds",
        "wasm_operator_plugin_render_seconds",
    ] {
        assert!(metrics.contains(name), "{name} missing from /metrics");
    }

    // Delete the resource: the garbage collector removes the children.
    let (ok, out) = kubectl(
        cp,
        &["delete", "-n", &ns, "services.hanzo.ai/web", "--wait=false"],
    );
    assert!(ok, "{out}");
    eventually(
        "the children to be garbage-collected",
        Duration::from_secs(60),
        || get(cp, &ns, "deployment/web").is_none() && get(cp, &ns, "service/web").is_none(),
    )
    .await;
    op.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_plugin_stalls_its_resources_and_nothing_else() {
    let cp = cluster();
    let _logs = cp.logs_on_failure();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "hostile").await.unwrap();
    // The hostile plugin's CRD, from its own description.
    let runtime = host::plugin::Runtime::new(
        host::plugin::Limits::default(),
        Some(crate::support::cache()),
    )
    .unwrap();
    let hostile = runtime
        .load_file(
            std::path::Path::new(test_guests::HOSTILE),
            &Default::default(),
        )
        .unwrap();
    let crd = host::crd::crd(&hostile, &hostile.info().kinds[0]).unwrap();
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), crd.to_string()).unwrap();
    let (ok, out) = kubectl(cp, &["apply", "-f", &file.path().display().to_string()]);
    assert!(ok, "{out}");
    let (ok, out) = kubectl(
        cp,
        &[
            "wait",
            "--for=condition=Established",
            "crd/hostiles.test.wasm-operator.dev",
            "--timeout=30s",
        ],
    );
    assert!(ok, "{out}");

    let op = Operator::start(cp, &ns, "hanzo.ai", &[PathBuf::from(test_guests::HOSTILE)]).await;
    let hostile = |name: &str, mode: &str| {
        format!(
            "apiVersion: test.wasm-operator.dev/v1\nkind: Hostile\nmetadata: {{name: {name}}}\nspec: {{mode: {mode}}}\n"
        )
    };
    apply(cp, &ns, &hostile("looper", "loop"));
    apply(cp, &ns, &hostile("escaper", "other-namespace"));
    apply(cp, &ns, &hostile("panicker", "panic"));
    apply(cp, &ns, WEB);
    for (name, reason, says) in [
        ("looper", "PluginTimeout", "deadline"),
        ("escaper", "ChildRefused", "kube-system"),
        ("panicker", "PluginTrapped", "panicked on purpose"),
    ] {
        eventually(
            &format!("{name} to be Stalled"),
            Duration::from_secs(30),
            || {
                get(cp, &ns, &format!("hostiles.test.wasm-operator.dev/{name}"))
                    .is_some_and(|h| condition(&h, "Stalled").0 == "True")
            },
        )
        .await;
        let h = get(cp, &ns, &format!("hostiles.test.wasm-operator.dev/{name}")).unwrap();
        let (_, r, message) = condition(&h, "Stalled");
        assert_eq!(r, reason, "{message}");
        assert!(
            message.contains(says) && message.contains("plugin hostile"),
            "{message}"
        );
        assert_eq!(condition(&h, "Ready").0, "False");
    }
    assert!(
        get(cp, "kube-system", "configmap/escaper").is_none(),
        "the guard let an object out of the namespace"
    );
    wait_ready(cp, &ns, "services.hanzo.ai/web");
    let (_, events) = kubectl(cp, &["get", "events", "-n", &ns]);
    assert!(
        events.contains("PluginTimeout") && events.contains("Applied"),
        "{events}"
    );
    op.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn facades_kvclusters_and_another_api_group() {
    let cp = cluster();
    let _logs = cp.logs_on_failure();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "lux").await.unwrap();
    let op = Operator::start(cp, &ns, "lux.cloud", &[]).await;
    apply(
        cp,
        &ns,
        "apiVersion: lux.cloud/v1\nkind: IAM\nmetadata: {name: iam}\nspec:\n  image: {repository: ghcr.io/hanzoai/iam}\n  ports: [{name: http, containerPort: 8000}]\n  kmsSecrets: [{managedSecretName: iam-secrets, projectSlug: iam, envSlug: prod}]\n",
    );
    apply(
        cp,
        &ns,
        "apiVersion: lux.cloud/v1\nkind: SQL\nmetadata: {name: db}\nspec:\n  image: {repository: postgres, tag: '16'}\n  storage: {size: 1Gi}\n  credentialsSecret: db-credentials\n",
    );
    apply(
        cp,
        &ns,
        "apiVersion: storage.mydatabase.io/v1alpha1\nkind: KVCluster\nmetadata: {name: raft}\nspec: {size: 3}\n",
    );
    for what in [
        "iams.lux.cloud/iam",
        "sqls.lux.cloud/db",
        "kvclusters.storage.mydatabase.io/raft",
    ] {
        wait_ready(cp, &ns, what);
    }
    let kms = get(cp, &ns, "kmssecrets.kms.lux.cloud/iam-secrets")
        .expect("the KMSSecret is in kms.lux.cloud");
    assert_eq!(
        kms["metadata"]["ownerReferences"][0]["apiVersion"],
        "lux.cloud/v1"
    );
    let pods = get(cp, &ns, "pods").unwrap();
    let raft: Vec<&Value> = pods["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["metadata"]["labels"]["app"] == "raft")
        .collect();
    assert_eq!(raft.len(), 3);
    for pod in raft {
        let env = pod["spec"]["containers"][0]["env"].as_array().unwrap();
        let value = |n: &str| {
            env.iter()
                .find(|e| e["name"] == n)
                .map(|e| e["value"].clone())
        };
        assert_eq!(value("SEED_NODE_ID"), Some("raft-0".into()));
        assert_eq!(
            value("SEED_NODE_ADDR"),
            Some(format!("raft-0.raft-service.{ns}.svc.cluster.local:50051").into())
        );
        assert_eq!(pod["status"]["phase"], "Running");
    }
    op.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_with_its_rbac_skips_missing_crds_and_survives_an_api_server_restart() {
    // A control plane of its own: only our CRDs, and it gets restarted.
    let cp = ControlPlane::start().unwrap();
    let _logs = cp.logs_on_failure();
    let root = crate::support::root();
    for args in [
        vec!["apply", "-f", "crds/"],
        vec![
            "apply",
            "-f",
            "deploy/namespace.yaml",
            "-f",
            "deploy/rbac.yaml",
        ],
        vec![
            "apply",
            "--dry-run=server",
            "--validate=strict",
            "-f",
            "deploy/deployment.yaml",
        ],
        vec![
            "wait",
            "--for=condition=Established",
            "crd",
            "--all",
            "--timeout=60s",
        ],
    ] {
        let args: Vec<String> = args
            .iter()
            .map(|a| {
                if a.ends_with('/') || a.ends_with(".yaml") {
                    root.join(a).display().to_string()
                } else {
                    (*a).to_owned()
                }
            })
            .collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (ok, out) = kubectl(&cp, &args);
        assert!(ok, "kubectl {args:?}: {out}");
    }
    let admin = cp.client().await.unwrap();
    let ns = cp.namespace(&admin, "app").await.unwrap();
    // The operator acts as its ServiceAccount, bound by deploy/rbac.yaml only.
    let client = cp
        .service_account_client(&admin, "wasm-operator", "wasm-operator")
        .await
        .unwrap();
    let op =
        Operator::start_with(client, None, "wasm-operator", "replica-a", "hanzo.ai", &[]).await;

    let monitored = WEB.replace(
        "  ingress: { hosts: [web.example.com] }\n",
        "  serviceMonitor: { port: http }\n  kmsSecrets: [{ managedSecretName: web-secrets }]\n",
    );
    apply(&cp, &ns, &monitored);
    wait_ready(&cp, &ns, "services.hanzo.ai/web");
    let web = get(&cp, &ns, "services.hanzo.ai/web").unwrap();
    let skipped: Vec<String> = web["status"]["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            format!(
                "{} {}",
                s["kind"].as_str().unwrap(),
                s["reason"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(skipped.len(), 2, "{skipped:?}");
    assert!(
        skipped
            .iter()
            .any(|s| s.starts_with("ServiceMonitor") && s.contains("CRD")),
        "{skipped:?}"
    );
    assert!(
        skipped.iter().any(|s| s.starts_with("KMSSecret")),
        "{skipped:?}"
    );
    assert!(
        condition(&web, "Ready").2.contains("2 skipped"),
        "{:?}",
        condition(&web, "Ready")
    );

    // Change the spec and kill the API server while the operator works on it.
    apply(&cp, &ns, &monitored.replace("replicas: 2", "replicas: 4"));
    tokio::task::block_in_place(|| cp.restart_apiserver(Duration::from_secs(3))).unwrap();
    let converged = || {
        let d = get(&cp, &ns, "deployment/web");
        let w = get(&cp, &ns, "services.hanzo.ai/web");
        d.is_some_and(|d| d["spec"]["replicas"] == 4)
            && w.is_some_and(|w| {
                w["status"]["observedGeneration"] == w["metadata"]["generation"]
                    && condition(&w, "Ready").0 == "True"
            })
    };
    eventually_or(
        "the operator to converge after the restart",
        Duration::from_secs(180),
        converged,
        || {
            let get_yaml = |what| kubectl(&cp, &["get", "-n", &ns, what, "-o", "yaml"]).1;
            format!(
                ":\n{}\n{}",
                get_yaml("services.hanzo.ai/web"),
                get_yaml("deployment/web")
            )
        },
    )
    .await;
    op.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_one_lease() {
    let cp = cluster();
    let _logs = cp.logs_on_failure();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "lease").await.unwrap();
    let a = Operator::start_with(
        cp.client().await.unwrap(),
        Some(&ns),
        &ns,
        "replica-a",
        "hanzo.ai",
        &[],
    )
    .await;
    apply(cp, &ns, WEB);
    wait_ready(cp, &ns, "services.hanzo.ai/web");
    let b = Operator::start_with(
        cp.client().await.unwrap(),
        Some(&ns),
        &ns,
        "replica-b",
        "hanzo.ai",
        &[],
    )
    .await;
    let holder = || {
        get(cp, &ns, "lease/wasm-operator")
            .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_owned))
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(holder().as_deref(), Some("replica-a"));
    assert_eq!(b.writes(), 0.0, "the standby replica wrote");
    assert!(a.ready(), "the leader has listed everything: ready");
    assert!(b.ready(), "a standby waiting for the Lease is ready");

    // The leader steps down on shutdown; the standby takes over and reconciles.
    a.stop().await;
    eventually(
        "replica-b to take the lease",
        Duration::from_secs(30),
        || holder().as_deref() == Some("replica-b"),
    )
    .await;
    apply(cp, &ns, &WEB.replace("replicas: 2", "replicas: 1"));
    // Within seconds: the new leader lists, then reconciles (a lost wake-up once held every
    // reconciliation back until a 30 s timeout).
    eventually("replica-b to reconcile", Duration::from_secs(10), || {
        get(cp, &ns, "deployment/web").is_some_and(|d| d["spec"]["replicas"] == 1)
    })
    .await;
    assert!(b.ready(), "the new leader, having reconciled, is ready");
    b.stop().await;
}
