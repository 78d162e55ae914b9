//! `host run` on the real control plane: each test runs an operator of its own, in-process,
//! watching a namespace of its own.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;
use testenv::ControlPlane;

use crate::support::cluster::{
    Operator, WEB, apply, apply_cluster, cluster, condition, eventually, eventually_or, free_addr,
    get, install_crds, kubectl, kubectl_ok, settings, wait_collected, wait_observed, wait_ready,
    wait_reason,
};

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
    kubectl_ok(cp, &["delete", "-n", &ns, "service/web", "--wait=true"]);
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
    kubectl_ok(
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
    eventually(
        "the Deployment to be ours again",
        Duration::from_secs(10),
        || get(cp, &ns, "deployment/web").is_some_and(|d| d["spec"]["replicas"] == 3),
    )
    .await;

    // Steady state: no writes at all. Once the Deployment has rolled back, web's status says
    // so and the operator is quiet, a change that alters nothing the operator makes (an
    // annotation of web, which its plugin does not read) is reconciled, and nothing is
    // written.
    wait_ready(cp, &ns, "services.hanzo.ai/web");
    eventually(
        "the Deployment rolled back to 3 replicas, and web's status to say so",
        Duration::from_secs(60),
        || {
            let (Some(d), Some(w)) = (
                get(cp, &ns, "deployment/web"),
                get(cp, &ns, "services.hanzo.ai/web"),
            ) else {
                return false;
            };
            let applied = w["status"]["children"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["kind"] == "Deployment")
                .map(|c| c["applied"]["generation"].clone());
            d["status"]["observedGeneration"] == d["metadata"]["generation"]
                && d["status"]["replicas"] == 3
                && d["status"]["readyReplicas"] == 3
                && applied.as_ref() == Some(&d["metadata"]["generation"])
                && condition(&w, "Ready").0 == "True"
        },
    )
    .await;
    op.quiet().await;
    let before = op.writes_by_kind();
    let seen = |what: &str| get(cp, &ns, what).map(|o| o["status"].to_string());
    let status_before = (seen("services.hanzo.ai/web"), seen("deployment/web"));
    // Quiet, and web's status says what its Deployment says now (a status write whose echo
    // had not come back through the watch once left "7/3 available" there, the status that
    // said 3/3 counted as written).
    let web = get(cp, &ns, "services.hanzo.ai/web").unwrap();
    let deployment = web["status"]["children"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["kind"] == "Deployment");
    assert_eq!(
        deployment.map(|c| c["message"].clone()),
        Some(Value::from("3/3 available")),
        "web's and its Deployment's status: {status_before:#?}"
    );
    op.reconciles("services.hanzo.ai", || {
        kubectl_ok(
            cp,
            &[
                "annotate",
                "-n",
                &ns,
                "services.hanzo.ai/web",
                "example.com/looked-at=yes",
            ],
        );
    })
    .await;
    op.quiet().await;
    assert_eq!(
        op.writes_by_kind(),
        before,
        "writes during a quiet period (an annotation no render reads); web's and its \
         Deployment's status before: {status_before:#?}, after: {:#?}",
        (seen("services.hanzo.ai/web"), seen("deployment/web"))
    );
    let metrics = op.scrape();
    for name in [
        "controller_runtime_reconcile_total",
        "controller_runtime_reconcile_time_seconds",
        "wasm_operator_plugin_render_seconds",
    ] {
        assert!(metrics.contains(name), "{name} missing from /metrics");
    }

    // Delete the resource: the garbage collector removes the children.
    kubectl_ok(
        cp,
        &["delete", "-n", &ns, "services.hanzo.ai/web", "--wait=false"],
    );
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
    install_crds(cp, test_guests::HOSTILE);

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
    // A deadline may be missed through no fault of the plugin (a starved CPU): retried, with
    // backoff. The others fail the same way every time: a person must act.
    for (name, reason, says, stalled) in [
        ("looper", "PluginTimeout", "deadline", false),
        ("escaper", "ChildRefused", "kube-system", true),
        ("panicker", "PluginTrapped", "panicked on purpose", true),
    ] {
        let h = wait_reason(
            cp,
            &ns,
            &format!("hostiles.test.wasm-operator.dev/{name}"),
            reason,
        )
        .await;
        let (_, _, message) = condition(&h, "Ready");
        assert!(
            message.contains(says) && message.contains("plugin hostile"),
            "{message}"
        );
        let (condition_type, retry) = if stalled {
            (
                "Stalled",
                "not retried until the resource or its plugin changes",
            )
        } else {
            ("Reconciling", "will retry")
        };
        assert_eq!(condition(&h, condition_type).0, "True", "{name}: {h}");
        assert!(message.contains(retry), "{message}");
        assert_eq!(condition(&h, "Ready").0, "False");
    }
    // A plugin that declares two versions of one kind: what it applies under one is not
    // pruned as stale under the other, and the child is not rewritten again and again.
    apply(cp, &ns, &hostile("scaler", "hpa-v2"));
    wait_ready(cp, &ns, "hostiles.test.wasm-operator.dev/scaler");
    let first = get(cp, &ns, "hpa/scaler").expect("the HPA exists");
    // Reconciled again, at a new generation whose render is the same (a field the plugin does
    // not read).
    apply(cp, &ns, &hostile("scaler", "hpa-v2, secretName: unused"));
    wait_observed(cp, &ns, "hostiles.test.wasm-operator.dev/scaler").await;
    let later = get(cp, &ns, "hpa/scaler").expect("the HPA was pruned");
    assert_eq!(
        first["metadata"]["uid"], later["metadata"]["uid"],
        "deleted and made again"
    );
    assert_eq!(
        first["metadata"]["resourceVersion"], later["metadata"]["resourceVersion"],
        "written again and again"
    );
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
        // The plain install: namespace, CRDs, RBAC, the Deployment (whose pods kwok simulates).
        vec![
            "apply",
            "--server-side",
            "--validate=strict",
            "-f",
            "deploy/wasm-operator.yaml",
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
    // One served Kind's CRD is left out at start, to be installed while the operator runs.
    kubectl_ok(
        &cp,
        &[
            "delete",
            "crd",
            "kvclusters.storage.mydatabase.io",
            "--wait=true",
        ],
    );
    let admin = cp.client().await.unwrap();
    let ns = cp.namespace(&admin, "app").await.unwrap();
    // The operator acts as its ServiceAccount, bound by the RBAC of deploy/wasm-operator.yaml only.
    let client = cp
        .service_account_client(&admin, "wasm-operator", "wasm-operator")
        .await
        .unwrap();
    let mut op = Operator::start_with(
        client.clone(),
        None,
        "wasm-operator",
        "replica-a",
        "hanzo.ai",
        &[],
    )
    .await;

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

    // The Prometheus Operator's CRD arrives after the operator started: noticed without a
    // restart, and the skipped ServiceMonitor is applied within seconds.
    let monitor_crd = root.join("tests/crds/servicemonitors.monitoring.coreos.com.yaml");
    kubectl_ok(&cp, &["apply", "-f", &monitor_crd.display().to_string()]);
    let installed = Instant::now();
    eventually_or(
        "the skipped ServiceMonitor to be applied",
        Duration::from_secs(30),
        || get(&cp, &ns, "servicemonitors.monitoring.coreos.com/web").is_some(),
        || {
            format!(
                ":\n{}",
                kubectl(
                    &cp,
                    &["get", "-n", &ns, "services.hanzo.ai/web", "-o", "yaml"]
                )
                .1
            )
        },
    )
    .await;
    println!(
        "ServiceMonitor applied {:?} after its CRD was installed",
        installed.elapsed()
    );
    eventually(
        "status.skipped to list only the KMSSecret",
        Duration::from_secs(10),
        || {
            get(&cp, &ns, "services.hanzo.ai/web").is_some_and(|w| {
                w["status"]["skipped"]
                    .as_array()
                    .is_some_and(|s| s.len() == 1 && s[0]["kind"] == "KMSSecret")
            })
        },
    )
    .await;

    // The served Kind whose CRD comes late is served without a restart.
    let kv_crd = root.join("crds/kvclusters.storage.mydatabase.io.yaml");
    kubectl_ok(&cp, &["apply", "-f", &kv_crd.display().to_string()]);
    kubectl_ok(
        &cp,
        &[
            "wait",
            "--for=condition=Established",
            "crd/kvclusters.storage.mydatabase.io",
            "--timeout=30s",
        ],
    );
    apply(
        &cp,
        &ns,
        "apiVersion: storage.mydatabase.io/v1alpha1\nkind: KVCluster\nmetadata: {name: raft}\nspec: {size: 1}\n",
    );
    wait_ready(&cp, &ns, "kvclusters.storage.mydatabase.io/raft");

    // Change the spec and kill the API server while the operator works on it.
    apply(&cp, &ns, &monitored.replace("replicas: 2", "replicas: 4"));
    tokio::task::block_in_place(|| cp.restart_apiserver(Duration::from_secs(3))).unwrap();
    // An outage longer than the renew deadline (10 s, on a busy machine) makes the leader stop
    // writing and exit, as it must; the kubelet would start it again, and so does the test.
    // Either it has ended, or it has renewed its Lease since the API server came back.
    let back = k8s_openapi::jiff::Timestamp::now();
    eventually(
        "the operator to renew its Lease after the restart, or to end",
        Duration::from_secs(60),
        || {
            op.is_finished()
                || renewed(&cp, "wasm-operator")
                    .is_some_and(|(holder, at)| holder == "replica-a" && at > back)
        },
    )
    .await;
    if op.is_finished() {
        let ended = op.finish().await;
        assert!(
            matches!(
                &ended,
                Err(host::operator::Error::LeaseLost | host::operator::Error::Election(_))
            ),
            "the operator ended for another reason than its Lease: {ended:?}"
        );
        op =
            Operator::start_with(client, None, "wasm-operator", "replica-a", "hanzo.ai", &[]).await;
    }
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
    // The standby is up and the leader has renewed the Lease since it started.
    let standing_by = k8s_openapi::jiff::Timestamp::now();
    eventually(
        "replica-a to renew the Lease while replica-b stands by",
        Duration::from_secs(30),
        || !b.scrape().is_empty() && renewed(cp, &ns).is_some_and(|(_, at)| at > standing_by),
    )
    .await;
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

/// Watching two namespaces, the operator runs on the RBAC `host rbac --watch-namespace` prints
/// (its ClusterRole bound in those two alone), serves both, and leaves a third alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watching_some_namespaces_it_needs_and_touches_those_alone() {
    let cp = cluster();
    let _logs = cp.logs_on_failure();
    let admin = cp.client().await.unwrap();
    let home = cp.namespace(&admin, "op-home").await.unwrap();
    let a = cp.namespace(&admin, "watched-a").await.unwrap();
    let b = cp.namespace(&admin, "watched-b").await.unwrap();
    let elsewhere = cp.namespace(&admin, "unwatched").await.unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_host"))
        .args(["rbac", "--namespace", &home, "--name", &home])
        .args(["--watch-namespace", &format!("{a},{b}")])
        // This operator serves its metrics plain (in-process): no review rights either.
        .args(["--metrics-secure=false"])
        .env(
            "WASM_OPERATOR_CACHE",
            PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cli-cache"),
        )
        .output()
        .unwrap();
    let rbac = crate::support::succeeded("host rbac", out);
    assert!(!rbac.contains("ClusterRoleBinding"), "{rbac}");
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), &rbac).unwrap();
    kubectl_ok(cp, &["apply", "-f", &file.path().display().to_string()]);
    let client = cp
        .service_account_client(&admin, &home, &home)
        .await
        .unwrap();
    let settings = settings(vec![a.clone(), b.clone()], &home, "namespaced");
    let op = Operator::start_settings(client, "hanzo.ai", &[], settings).await;
    for ns in [&a, &b, &elsewhere] {
        apply(cp, ns, WEB);
    }
    wait_ready(cp, &a, "services.hanzo.ai/web");
    wait_ready(cp, &b, "services.hanzo.ai/web");
    assert!(get(cp, &b, "deployment/web").is_some());
    // A child deleted by hand in one watched namespace comes back: its watch is that
    // namespace's.
    kubectl_ok(cp, &["delete", "-n", &b, "deployment/web", "--wait=true"]);
    eventually(
        "the Deployment to come back",
        Duration::from_secs(30),
        || get(cp, &b, "deployment/web").is_some(),
    )
    .await;
    eventually("/readyz to answer 200", Duration::from_secs(30), || {
        op.ready()
    })
    .await;
    let untouched = get(cp, &elsewhere, "services.hanzo.ai/web").unwrap();
    assert!(
        untouched.get("status").is_none(),
        "a resource outside the watched namespaces got a status: {untouched}"
    );
    assert!(get(cp, &elsewhere, "deployment/web").is_none());
    op.stop().await;
}

/// An operator may not list every Kind it serves (its RBAC grants one plugin's Kinds only): the
/// watches it may not list are refused over and over, and a stop still ends it (kube holds a
/// controller until its first list, graceful shutdown or not; the operator lets such a
/// controller go).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kinds_it_may_not_list_do_not_hold_up_its_stop() {
    let cp = cluster();
    let _logs = cp.logs_on_failure();
    let admin = cp.client().await.unwrap();
    let ns = cp.namespace(&admin, "unlisted").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let datastore = host::plugin::BUILTINS
        .iter()
        .find(|b| b.name == "datastore")
        .unwrap();
    let wasm = dir.path().join("datastore.wasm");
    std::fs::write(&wasm, datastore.wasm).unwrap();
    let rbac = crate::support::host_ok(&[
        "rbac",
        "--no-builtins",
        "--plugin",
        &wasm.display().to_string(),
        "--namespace",
        &ns,
        "--name",
        &ns,
        "--watch-namespace",
        &ns,
    ]);
    apply_cluster(cp, &rbac);
    let client = cp.service_account_client(&admin, &ns, &ns).await.unwrap();
    // It serves every built-in plugin's Kinds.
    let op = Operator::start_settings(
        client,
        "hanzo.ai",
        &[],
        settings(vec![ns.clone()], &ns, "unlisted"),
    )
    .await;
    eventually(
        "the list of services.hanzo.ai to be refused",
        Duration::from_secs(60),
        || {
            op.scrape().lines().any(|l| {
                l.starts_with("wasm_operator_watch_errors_total{")
                    && l.contains("services.hanzo.ai")
            })
        },
    )
    .await;
    // The Kinds it may list are watched meanwhile.
    assert!(
        !op.scrape().lines().any(|l| {
            l.starts_with("wasm_operator_watch_errors_total{") && l.contains("datastores.hanzo.ai")
        }),
        "{}",
        op.scrape()
    );
    let stopping = Instant::now();
    op.finish().await.unwrap();
    println!("stopped in {:?}", stopping.elapsed());
}

fn owner_uids(obj: &Value) -> Vec<String> {
    obj["metadata"]["ownerReferences"]
        .as_array()
        .map(|refs| {
            refs.iter()
                .filter_map(|r| r["uid"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

const HAND_MADE: &str = "apiVersion: v1
kind: Service
metadata:
  name: NAME
  labels: { made-by: hand }
spec:
  selector: { app: hand }
  ports: [{ name: db, port: 5432 }]
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_made_by_hand_is_taken_only_with_its_own_consent_or_in_a_migration() {
    let cp = cluster();
    let _logs = cp.logs_on_failure();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "adopt").await.unwrap();
    let op = Operator::start(cp, &ns, "hanzo.ai", &[]).await;
    apply(cp, &ns, &HAND_MADE.replace("NAME", "web"));
    apply(cp, &ns, &HAND_MADE.replace("NAME", "api"));

    // `web` wants the core Service `web` that a person made: left alone, and said so.
    apply(cp, &ns, WEB);
    let web = wait_reason(cp, &ns, "services.hanzo.ai/web", "ChildConflict").await;
    let (_, _, message) = condition(&web, "Ready");
    assert!(
        message.contains("Service web") && message.contains("no controller"),
        "{message}"
    );
    assert!(
        message.contains(
            "kubectl annotate service web wasm-operator.dev/adopt-by=services.hanzo.ai/web"
        ),
        "{message}"
    );
    assert_eq!(condition(&web, "Stalled").0, "True", "a person must act");
    let svc = get(cp, &ns, "service/web").unwrap();
    assert!(owner_uids(&svc).is_empty(), "taken over: {svc}");
    assert_eq!(svc["spec"]["ports"][0]["port"], 5432, "changed: {svc}");
    assert_eq!(svc["metadata"]["labels"]["made-by"], "hand");
    // The rest of its children are applied.
    assert!(get(cp, &ns, "deployment/web").is_some());
    let (_, events) = kubectl(cp, &["get", "events", "-n", &ns]);
    assert!(events.contains("ChildConflict"), "{events}");

    // `api` asks to adopt what nobody controls. Its own word is not enough: whoever may create
    // a resource could otherwise take any object of the namespace (a platform's policy).
    apply(
        cp,
        &ns,
        &WEB.replace(
            "name: web",
            "name: api\n  annotations: { wasm-operator.dev/adopt: \"true\" }",
        ),
    );
    wait_reason(cp, &ns, "services.hanzo.ai/api", "ChildConflict").await;
    let untouched = get(cp, &ns, "service/api").unwrap();
    assert!(owner_uids(&untouched).is_empty(), "taken over: {untouched}");
    assert_eq!(untouched["spec"]["ports"][0]["port"], 5432);

    // The object's consent, given by whoever may edit it, names the resource: it is adopted.
    kubectl_ok(
        cp,
        &[
            "annotate",
            "-n",
            &ns,
            "service/api",
            "wasm-operator.dev/adopt-by=services.hanzo.ai/api",
        ],
    );
    wait_ready(cp, &ns, "services.hanzo.ai/api");
    let api = get(cp, &ns, "services.hanzo.ai/api").unwrap();
    let adopted = get(cp, &ns, "service/api").unwrap();
    assert_eq!(
        owner_uids(&adopted),
        vec![api["metadata"]["uid"].as_str().unwrap().to_owned()]
    );

    // Deleting `web` garbage-collects what it owns, never the object it left alone.
    kubectl_ok(cp, &["delete", "-n", &ns, "services.hanzo.ai/web"]);
    eventually(
        "web's Deployment to be collected",
        Duration::from_secs(60),
        || get(cp, &ns, "deployment/web").is_none(),
    )
    .await;
    // The garbage collector is done with web: nothing names it as owner any more.
    wait_collected(cp, &ns, web["metadata"]["uid"].as_str().unwrap()).await;
    assert!(
        get(cp, &ns, "service/web").is_some(),
        "the hand-made Service was deleted with the resource that never owned it"
    );
    op.stop().await;

    // Where the operator is told a migration is under way, a resource that asks adopts.
    let mut settings = settings(vec![ns.clone()], &ns, &format!("test-{ns}"));
    settings.rules.adopt_namespaces = [ns.clone()].into();
    let op = Operator::start_settings(cp.client().await.unwrap(), "hanzo.ai", &[], settings).await;
    apply(cp, &ns, &HAND_MADE.replace("NAME", "db"));
    apply(
        cp,
        &ns,
        &WEB.replace(
            "name: web",
            "name: db\n  annotations: { wasm-operator.dev/adopt: \"true\" }",
        ),
    );
    wait_ready(cp, &ns, "services.hanzo.ai/db");
    let db = get(cp, &ns, "services.hanzo.ai/db").unwrap();
    assert_eq!(
        owner_uids(&get(cp, &ns, "service/db").unwrap()),
        vec![db["metadata"]["uid"].as_str().unwrap().to_owned()]
    );
    op.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_resources_wanting_one_child_the_first_keeps_it() {
    let cp = cluster();
    let _logs = cp.logs_on_failure();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "clash").await.unwrap();
    let op = Operator::start(cp, &ns, "hanzo.ai", &[]).await;
    // A hanzo Service `db` renders the core Service `db`, and so does a Datastore `db`.
    apply(cp, &ns, &WEB.replace("name: web", "name: db"));
    wait_ready(cp, &ns, "services.hanzo.ai/db");
    let first = get(cp, &ns, "services.hanzo.ai/db").unwrap();
    let first_uid = first["metadata"]["uid"].as_str().unwrap().to_owned();
    apply(
        cp,
        &ns,
        "apiVersion: hanzo.ai/v1\nkind: Datastore\nmetadata: {name: db}\nspec:\n  image: {repository: postgres, tag: '16'}\n  storage: {size: 1Gi}\n",
    );
    let second = wait_reason(cp, &ns, "datastores.hanzo.ai/db", "ChildConflict").await;
    let (_, _, message) = condition(&second, "Ready");
    assert!(
        message.contains("Service db is controlled by Service db"),
        "{message}"
    );
    // No ping-pong: the core Service stays the first's, untouched, while both are reconciled.
    let before = get(cp, &ns, "service/db").unwrap();
    assert_eq!(owner_uids(&before), vec![first_uid.clone()]);
    apply(
        cp,
        &ns,
        &WEB.replace("name: web", "name: db")
            .replace("replicas: 2", "replicas: 3"),
    );
    // The first has been reconciled at its new generation.
    wait_observed(cp, &ns, "services.hanzo.ai/db").await;
    let after = get(cp, &ns, "service/db").unwrap();
    assert_eq!(owner_uids(&after), vec![first_uid]);
    assert_eq!(
        before["metadata"]["resourceVersion"], after["metadata"]["resourceVersion"],
        "the Service was written while two resources want it"
    );
    wait_ready(cp, &ns, "services.hanzo.ai/db");
    op.stop().await;
}

/// An apply the API server fails for a reason that may pass (here its own 500: an admission
/// webhook it cannot reach, with `failurePolicy: Fail`) is said in status as it is retried, and
/// the resource goes Ready once it passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transient_apply_failure_is_said_in_status_and_retried() {
    let cp = cluster();
    let _logs = cp.logs_on_failure();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "transient").await.unwrap();
    // Nothing listens on this port: each call of the webhook fails, so the API server answers
    // creates and updates of core Services in this namespace with a 500.
    let closed = testenv::free_port().unwrap();
    let webhook = format!(
        "apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {{ name: unreachable-{ns} }}
webhooks:
- name: unreachable.wasm-operator.dev
  failurePolicy: Fail
  sideEffects: None
  admissionReviewVersions: [v1]
  timeoutSeconds: 1
  clientConfig: {{ url: 'https://127.0.0.1:{closed}/validate' }}
  rules:
  - apiGroups: ['']
    apiVersions: [v1]
    operations: [CREATE, UPDATE]
    resources: [services]
  namespaceSelector:
    matchLabels: {{ kubernetes.io/metadata.name: {ns} }}
"
    );
    apply(cp, &ns, &webhook);
    let probe = "apiVersion: v1\nkind: Service\nmetadata: { name: probe }\nspec: { ports: [{ port: 80 }] }\n";
    let probe_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(probe_file.path(), probe).unwrap();
    let probe_path = probe_file.path().display().to_string();
    eventually(
        "the webhook to fail creates",
        Duration::from_secs(30),
        || {
            let (ok, out) = kubectl(
                cp,
                &["apply", "-n", &ns, "--dry-run=server", "-f", &probe_path],
            );
            !ok && out.contains("failed calling webhook")
        },
    )
    .await;

    let _op = Operator::start(cp, &ns, "hanzo.ai", &[]).await;
    apply(cp, &ns, WEB);
    let stuck = wait_reason(cp, &ns, "services.hanzo.ai/web", "ApplyFailed").await;
    let (ready, _, message) = condition(&stuck, "Ready");
    assert_eq!(ready, "False");
    assert!(
        message.contains("Service web") && message.contains("failed calling webhook"),
        "{message}"
    );
    assert_eq!(condition(&stuck, "Reconciling").0, "True", "it is retried");
    assert_ne!(condition(&stuck, "Stalled").0, "True", "{stuck}");
    // The children that could be applied were.
    assert!(get(cp, &ns, "deployment/web").is_some());

    // The webhook goes: a retry applies the Service, and the resource goes Ready.
    kubectl_ok(
        cp,
        &[
            "delete",
            "validatingwebhookconfiguration",
            &format!("unreachable-{ns}"),
        ],
    );
    wait_ready(cp, &ns, "services.hanzo.ai/web");
    assert!(get(cp, &ns, "service/web").is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_what_a_resource_controls_is_pruned_and_a_failed_delete_is_retried() {
    let cp = cluster();
    let _logs = cp.logs_on_failure();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "prune").await.unwrap();
    let op = Operator::start(cp, &ns, "hanzo.ai", &[]).await;
    apply(cp, &ns, WEB);
    wait_ready(cp, &ns, "services.hanzo.ai/web");
    let web = get(cp, &ns, "services.hanzo.ai/web").unwrap();
    let uid = web["metadata"]["uid"].as_str().unwrap().to_owned();
    // A hand-made Ingress that copies our ownership label: the label proves nothing.
    apply(
        cp,
        &ns,
        &format!(
            "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: copycat\n  labels: {{ wasm-operator.dev/owner: {uid} }}\nspec:\n  defaultBackend: {{ service: {{ name: web, port: {{ number: 80 }} }} }}\n"
        ),
    );
    // The API server refuses to delete our Ingress `web` for now (an admission policy).
    let policy = format!(
        "apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {{ name: keep-{ns} }}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - apiGroups: [networking.k8s.io]
      apiVersions: [v1]
      operations: [DELETE]
      resources: [ingresses]
      resourceNames: [web]
    namespaceSelector:
      matchLabels: {{ kubernetes.io/metadata.name: {ns} }}
  validations:
  - expression: 'false'
    message: kept on purpose by the test
    reason: Forbidden
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {{ name: keep-{ns} }}
spec:
  policyName: keep-{ns}
  validationActions: [Deny]
"
    );
    apply(cp, &ns, &policy);
    // The policy takes effect once the API server has loaded it: a delete by dry run says when.
    eventually(
        "the admission policy to refuse deletes",
        Duration::from_secs(30),
        || {
            !kubectl(
                cp,
                &["delete", "-n", &ns, "ingress/web", "--dry-run=server"],
            )
            .0
        },
    )
    .await;

    // Turn the ingress off: ours cannot be deleted yet, which the status says; it is retried.
    let off = WEB.replace(
        "  ingress: { hosts: [web.example.com] }\n",
        "  ingress: { enabled: false }\n",
    );
    apply(cp, &ns, &off);
    let stuck = wait_reason(cp, &ns, "services.hanzo.ai/web", "PruneFailed").await;
    let (_, _, message) = condition(&stuck, "Ready");
    assert!(
        message.contains("Ingress web") && message.contains("kept on purpose"),
        "{message}"
    );
    assert_eq!(condition(&stuck, "Reconciling").0, "True", "it is retried");
    let (_, events) = kubectl(cp, &["get", "events", "-n", &ns]);
    assert!(events.contains("PruneFailed"), "{events}");
    assert!(
        !events.contains("Pruned "),
        "Pruned recorded before it happened: {events}"
    );

    // Lift the policy: the retry deletes it, and only then is it recorded as pruned.
    kubectl_ok(
        cp,
        &[
            "delete",
            "validatingadmissionpolicybinding",
            &format!("keep-{ns}"),
        ],
    );
    eventually("the Ingress to be pruned", Duration::from_secs(60), || {
        get(cp, &ns, "ingress/web").is_none()
    })
    .await;
    wait_ready(cp, &ns, "services.hanzo.ai/web");
    let (_, events) = kubectl(cp, &["get", "events", "-n", &ns]);
    assert!(events.contains("Pruned"), "{events}");
    // What only copied our label is still there.
    assert!(
        get(cp, &ns, "ingress/copycat").is_some(),
        "an object that only carried our label was pruned"
    );
    kubectl_ok(
        cp,
        &["delete", "validatingadmissionpolicy", &format!("keep-{ns}")],
    );
    op.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_with_nothing_changed_writes_nothing() {
    let cp = cluster();
    let _logs = cp.logs_on_failure();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "restart").await.unwrap();
    let first = Operator::start(cp, &ns, "hanzo.ai", &[]).await;
    apply(cp, &ns, WEB);
    apply(
        cp,
        &ns,
        "apiVersion: hanzo.ai/v1\nkind: SQL\nmetadata: {name: db}\nspec:\n  image: {repository: postgres, tag: '16'}\n  storage: {size: 1Gi}\n  credentialsSecret: db-credentials\n",
    );
    wait_ready(cp, &ns, "services.hanzo.ai/web");
    wait_ready(cp, &ns, "sqls.hanzo.ai/db");
    // Let the last statuses and events be written, then stop: each status says every child is
    // ready, and the operator is quiet.
    for what in ["services.hanzo.ai/web", "sqls.hanzo.ai/db"] {
        eventually(
            &format!("{what}'s status to say every child is ready"),
            Duration::from_secs(60),
            || {
                get(cp, &ns, what).is_some_and(|o| {
                    let children = o["status"]["children"].as_array().cloned();
                    o["status"]["observedGeneration"] == o["metadata"]["generation"]
                        && children
                            .is_some_and(|c| !c.is_empty() && c.iter().all(|c| c["ready"] == true))
                })
            },
        )
        .await;
    }
    first.quiet().await;
    first.stop().await;

    // A new operator finds every child as it left it: what it applied is in each status.
    let second = Operator::start(cp, &ns, "hanzo.ai", &[]).await;
    eventually(
        "the new operator to be ready",
        Duration::from_secs(30),
        || second.ready(),
    )
    .await;
    // Each resource has been reconciled, and what those reconciliations had to report would
    // have been written by the time the operator is quiet.
    eventually(
        "the new operator to reconcile both resources",
        Duration::from_secs(30),
        || {
            second.reconciled("services.hanzo.ai") >= 1.0
                && second.reconciled("sqls.hanzo.ai") >= 1.0
        },
    )
    .await;
    second.quiet().await;
    let writes: Vec<String> = second
        .scrape()
        .lines()
        .filter(|l| l.starts_with("wasm_operator_api_writes_total{"))
        .map(str::to_owned)
        .collect();
    assert!(writes.is_empty(), "writes after a restart: {writes:?}");
    let reconciled = second
        .scrape()
        .lines()
        .any(|l| l.starts_with("controller_runtime_reconcile_total{") && !l.ends_with(" 0"));
    assert!(reconciled, "the new operator reconciled nothing");
    second.stop().await;
}

/// The holder of the Lease `wasm-operator` in `ns` and when it last renewed it.
fn renewed(cp: &ControlPlane, ns: &str) -> Option<(String, k8s_openapi::jiff::Timestamp)> {
    let lease = get(cp, ns, "lease/wasm-operator")?;
    let holder = lease["spec"]["holderIdentity"].as_str()?.to_owned();
    let at = lease["spec"]["renewTime"].as_str()?.parse().ok()?;
    Some((holder, at))
}

/// When the API server received a request, from its audit event.
fn received(event: &Value) -> k8s_openapi::jiff::Timestamp {
    event["requestReceivedTimestamp"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no requestReceivedTimestamp in {event}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_stops_writing_before_another_takes_over() {
    leader_partitioned(Fault::Cut).await;
}

/// A network that stops answering without a reset: the leader's writes hang, and more wait for
/// a write slot behind them (one slot here). Each is abandoned after its timeout, and a write
/// that gets its slot after the renew deadline is not sent: when the network comes back, after
/// another replica took the Lease, nothing of the old leader's reaches the API server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_writes_hang_in_a_black_hole_sends_none_after_another_leads() {
    leader_partitioned(Fault::BlackHole).await;
}

/// How replica A is cut off from the API server.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// Every connection reset, new ones refused.
    Cut,
    /// Every byte lost, no connection closed.
    BlackHole,
}

async fn leader_partitioned(fault: Fault) {
    // A control plane of its own, whose audit log holds only this test's writes.
    let cp = ControlPlane::start().unwrap();
    let _logs = cp.logs_on_failure();
    let root = crate::support::root();
    let install = root.join("deploy/wasm-operator.yaml").display().to_string();
    kubectl_ok(&cp, &["apply", "--server-side", "-f", &install]);
    kubectl_ok(
        &cp,
        &[
            "wait",
            "--for=condition=Established",
            "crd",
            "--all",
            "--timeout=60s",
        ],
    );
    let admin = cp.client().await.unwrap();
    let ns = cp.namespace(&admin, "partition").await.unwrap();
    // Replica A reaches the API server through a proxy the test can cut; B directly. Both act
    // as the operator's ServiceAccount; the audit log tells them apart by user agent.
    let proxy = cp.proxy().unwrap();
    // Each connects as `host run` does: over HTTP/2, its watches apart from its requests.
    let client = |server: Option<String>, agent: &'static str| {
        let (cp, admin) = (&cp, admin.clone());
        async move {
            let config = cp
                .service_account_config_via(
                    &admin,
                    "wasm-operator",
                    "wasm-operator",
                    server.as_deref(),
                    Some(agent),
                )
                .await
                .unwrap();
            host::connection::Cluster::connect(config).unwrap()
        }
    };
    let mut a_settings = settings(vec![ns.clone()], "wasm-operator", "replica-a");
    if fault == Fault::BlackHole {
        // One write at a time: the others wait for its slot while it hangs.
        a_settings.max_writes_in_flight = 1;
    }
    let a = Operator::start_settings(
        client(Some(proxy.url()), "replica-a").await,
        "hanzo.ai",
        &[],
        a_settings,
    )
    .await;
    apply(&cp, &ns, WEB);
    wait_ready(&cp, &ns, "services.hanzo.ai/web");
    let b = Operator::start_with(
        client(None, "replica-b").await,
        Some(&ns),
        "wasm-operator",
        "replica-b",
        "hanzo.ai",
        &[],
    )
    .await;
    let holder = || {
        get(&cp, "wasm-operator", "lease/wasm-operator")
            .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_owned))
    };
    // The leader has renewed the Lease since the standby started.
    let standing_by = k8s_openapi::jiff::Timestamp::now();
    eventually(
        "replica-a to renew the Lease while replica-b stands by",
        Duration::from_secs(30),
        || renewed(&cp, "wasm-operator").is_some_and(|(_, at)| at > standing_by),
    )
    .await;
    assert_eq!(holder().as_deref(), Some("replica-a"));

    // Cut A off. The resource changes meanwhile: there is work for whoever leads.
    if fault == Fault::BlackHole {
        // A burst of work, so that A has writes in flight and more waiting when the network
        // stops answering.
        for i in 0..8 {
            apply(
                &cp,
                &ns,
                &WEB.replace("name: web", &format!("name: burst-{i}")),
            );
        }
        proxy.black_hole();
    } else {
        proxy.cut();
    }
    let cut = Instant::now();
    apply(&cp, &ns, &WEB.replace("replicas: 2", "replicas: 3"));
    eventually(
        "replica-b to take the Lease",
        Duration::from_secs(60),
        || holder().as_deref() == Some("replica-b"),
    )
    .await;
    println!("replica-b took the Lease {:?} after the cut", cut.elapsed());
    eventually(
        "replica-b to apply the change",
        Duration::from_secs(30),
        || get(&cp, &ns, "deployment/web").is_some_and(|d| d["spec"]["replicas"] == 3),
    )
    .await;
    // A's network comes back: a leader that had not stopped would now write alongside B.
    proxy.restore();
    apply(&cp, &ns, &WEB.replace("replicas: 2", "replicas: 4"));
    eventually(
        "replica-b to apply the next change",
        Duration::from_secs(30),
        || get(&cp, &ns, "deployment/web").is_some_and(|d| d["spec"]["replicas"] == 4),
    )
    .await;
    // A steps down by itself: its last reconciliations and reports end first (each request
    // bounded in time), which on a loaded machine can take a while. Once it has ended, whatever
    // it sent after the network came back is in the audit log.
    let stepping_down = Instant::now();
    eventually(
        "replica-a to step down by itself",
        Duration::from_secs(60),
        || a.is_finished(),
    )
    .await;
    println!(
        "replica-a ended {:?} after the check began",
        stepping_down.elapsed()
    );
    let ended = a.finish().await;
    assert!(
        matches!(
            &ended,
            Err(host::operator::Error::LeaseLost | host::operator::Error::Election(_))
        ),
        "replica-a should have stepped down: {ended:?}"
    );

    // The API server's own record.
    let audit = cp.audit_log();
    let by = |agent: &str| -> Vec<&Value> {
        audit
            .iter()
            .filter(|e| e["userAgent"].as_str().is_some_and(|u| u.contains(agent)))
            .collect()
    };
    let (a_events, b_events) = (by("replica-a"), by("replica-b"));
    let is_lease = |e: &Value| e["objectRef"]["resource"] == "leases";
    let ok = |e: &Value| {
        e["responseStatus"]["code"]
            .as_i64()
            .is_some_and(|c| c < 300)
    };
    let a_renewed = a_events
        .iter()
        .filter(|e| is_lease(e) && ok(e))
        .map(|e| received(e))
        .max()
        .expect("replica-a renewed its Lease");
    let b_acquired = b_events
        .iter()
        .filter(|e| is_lease(e) && ok(e))
        .map(|e| received(e))
        .min()
        .expect("replica-b took the Lease");
    let a_writes: Vec<&Value> = a_events.iter().copied().filter(|e| !is_lease(e)).collect();
    let b_writes: Vec<&Value> = b_events.iter().copied().filter(|e| !is_lease(e)).collect();
    assert!(
        !a_writes.is_empty() && !b_writes.is_empty(),
        "both replicas wrote"
    );
    let deadline = a_renewed + k8s_openapi::jiff::SignedDuration::from_secs(10);
    for w in &a_writes {
        assert!(
            received(w) <= deadline,
            "replica-a wrote after its renew deadline ({deadline}): {w}"
        );
    }
    let a_last = a_writes.iter().map(|e| received(e)).max().unwrap();
    let b_first = b_writes.iter().map(|e| received(e)).min().unwrap();
    assert!(
        a_last < b_acquired && a_last < b_first,
        "two writers at once: replica-a's last write {a_last}, replica-b leads from {b_acquired}, first writes {b_first}"
    );
    println!(
        "replica-a: last renewal {a_renewed}, last write {a_last}; replica-b: Lease {b_acquired}, first write {b_first}"
    );
    b.stop().await;
    drop(proxy);
}

/// `/healthz` fails while a reconciliation hangs on requests the API server never receives (a
/// half-open partition) for longer than `--stuck-after`, and recovers when they go through;
/// `/readyz` fails while the watches cannot reach the API server for longer than
/// `--unready-after`, and recovers when they can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_and_readyz_follow_a_partition() {
    let cp = cluster();
    let _logs = cp.logs_on_failure();
    let admin = cp.client().await.unwrap();
    let ns = cp.namespace(&admin, "health").await.unwrap();
    let proxy = cp.proxy().unwrap();
    let settings = host::operator::Settings {
        namespaces: vec![ns.clone()],
        metrics_addr: free_addr(),
        metrics_tls: None,
        health_addr: free_addr(),
        leader_election: false,
        lease_namespace: ns.clone(),
        lease_name: "wasm-operator".to_owned(),
        identity: "health".to_owned(),
        concurrency: 4,
        max_writes_in_flight: 16,
        min_writes_in_flight: 1,
        render_memory: 2 * host::plugin::Limits::default().call_memory(),
        render_wait: Duration::from_secs(3),
        unready_after: Duration::from_secs(3),
        stuck_after: Duration::from_secs(3),
        plugin_resources: None,
        rules: host::policy::Rules::default(),
        sharding: None,
        shard: None,
    };
    let op = Operator::start_settings(
        cp.client_via(&proxy.url()).await.unwrap(),
        "hanzo.ai",
        &[],
        settings,
    )
    .await;
    eventually("/readyz", Duration::from_secs(30), || op.ready()).await;
    let status = |path: &str| {
        op.get(path)
            .split(' ')
            .nth(1)
            .unwrap_or_default()
            .to_owned()
    };
    assert_eq!(status("/healthz"), "200");

    // Half-open: the watches' events still arrive, the reconciliation's applies hang.
    proxy.stall();
    apply(cp, &ns, WEB);
    eventually_or(
        "/healthz to fail on the stuck reconciliation",
        Duration::from_secs(30),
        || status("/healthz") == "503",
        || op.get("/healthz"),
    )
    .await;
    let body = op.get("/healthz");
    assert!(body.contains("a reconciliation has run for"), "{body}");
    // Ready is about the watches, which work.
    assert!(op.ready(), "{}", op.get("/readyz"));
    proxy.restore();
    wait_ready(cp, &ns, "services.hanzo.ai/web");
    eventually("/healthz to recover", Duration::from_secs(30), || {
        status("/healthz") == "200"
    })
    .await;

    // Cut: every watch fails to list or watch, again and again.
    proxy.cut();
    eventually_or(
        "/readyz to fail naming the watch of Services",
        Duration::from_secs(60),
        || {
            let body = op.get("/readyz");
            body.starts_with("HTTP/1.0 503")
                && body.contains("watches failing for over 3s")
                && body.contains("services.hanzo.ai")
        },
        || op.get("/readyz"),
    )
    .await;
    assert_eq!(status("/healthz"), "200", "{}", op.get("/healthz"));
    proxy.restore();
    eventually_or(
        "/readyz to recover",
        Duration::from_secs(90),
        || op.ready(),
        || op.get("/readyz"),
    )
    .await;
    op.stop().await;
    drop(proxy);
}
