//! `Plugin` resources on the real control plane, with a real registry: a plugin pushed, named by
//! a `Plugin`, served without a restart; upgraded to a new digest; a broken version that leaves
//! the last good one serving; a second Plugin claiming the same Kind refused; deleted, its CRD
//! and resources left in place; one whose compile needs more memory than the operator's cap
//! refused, saying which setting to raise.

use std::time::Duration;

use serde_json::Value;
use testenv::{ControlPlane, Registry, RegistryOptions};

use crate::support::cluster::{
    Operator, apply, apply_cluster, eventually, get, kubectl, kubectl_ok, settings, wait_for,
    wait_ready,
};

/// Two replicas: the standby pulls, compiles and checks every Plugin while it waits for the
/// Lease, so when the leader goes it serves them at once, with the registry down and nothing
/// of the plugin on its disk before it stood by.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_has_the_plugins_loaded_when_it_becomes_leader() {
    let cp = ControlPlane::start().unwrap();
    let _logs = cp.logs_on_failure();
    let mut registry = Registry::start(RegistryOptions::default()).unwrap();
    let image = push(
        &registry,
        "plugins/hostile",
        &std::fs::read(test_guests::HOSTILE).unwrap(),
    )
    .await;
    install_plugin_crd(&cp);
    let runtime = host::plugin::Runtime::new(
        host::plugin::Limits::default(),
        Some(crate::support::cache()),
    )
    .unwrap();
    let base = || host::registry::Registry::load(&runtime, Default::default(), false, &[]).unwrap();
    // Each replica has a store of its own, as each pod has.
    let (store_a, store_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let replica = |identity: &str, store: &std::path::Path| host::operator::Settings {
        identity: identity.to_owned(),
        ..settings_for(&runtime, store)
    };
    let a = Operator::run(
        cp.client().await.unwrap(),
        base(),
        replica("replica-a", store_a.path()),
    );
    let holder = || {
        get(&cp, "default", "lease/wasm-operator")
            .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_owned))
    };
    eventually("replica-a to lead", Duration::from_secs(30), || {
        holder().as_deref() == Some("replica-a")
    })
    .await;
    let b = Operator::run(
        cp.client().await.unwrap(),
        base(),
        replica("replica-b", store_b.path()),
    );

    apply_cluster(&cp, &plugin("hostile", &image));
    wait_for(&cp, "Ready", "plugins.wasm-operator.dev/hostile");
    let admin = cp.client().await.unwrap();
    let ns = cp.namespace(&admin, "standby").await.unwrap();
    let hostile = "apiVersion: test.wasm-operator.dev/v1\nkind: Hostile\nmetadata: {name: h}\nspec: {mode: ok}\n";
    apply(&cp, &ns, hostile);
    wait_ready(&cp, &ns, "hostiles.test.wasm-operator.dev/h");
    eventually(
        "the standby to load the Plugin",
        Duration::from_secs(60),
        || b.metric("wasm_operator_plugins_prefetched") == Some(1.0),
    )
    .await;
    assert_eq!(holder().as_deref(), Some("replica-a"), "the standby led");

    // The registry goes, then the leader: the standby serves the plugin it loaded.
    registry.stop();
    a.stop().await;
    eventually("replica-b to lead", Duration::from_secs(30), || {
        holder().as_deref() == Some("replica-b")
    })
    .await;
    apply(&cp, &ns, &hostile.replace("mode: ok", "mode: counter"));
    eventually(
        "replica-b to reconcile with the plugin it loaded standing by",
        Duration::from_secs(30),
        || get(&cp, &ns, "configmap/h").is_some_and(|c| c["data"].get("renders").is_some()),
    )
    .await;
    let status = plugin_status(&cp, "hostile");
    assert_eq!(ready(&status).0, "True", "{status}");
    assert_eq!(
        b.metric("wasm_operator_plugins_prefetched"),
        Some(0.0),
        "handed over when it led"
    );
    b.stop().await;
}

/// Pushes `wasm` to the registry as `repository:tag`; the reference pinned to its digest.
pub(crate) async fn push(registry: &Registry, repository: &str, wasm: &[u8]) -> String {
    let reference =
        host::oci::Reference::parse(&format!("{}/{repository}:latest", registry.addr())).unwrap();
    let options = host::oci::Options {
        timeout: Duration::from_secs(30),
        ..Default::default()
    };
    let pinned = host::oci::push(wasm, &Default::default(), &reference, &options)
        .await
        .unwrap();
    format!("oci://{pinned}")
}

pub(crate) fn plugin(name: &str, image: &str) -> String {
    format!(
        "apiVersion: wasm-operator.dev/v1alpha1\nkind: Plugin\nmetadata: {{name: {name}}}\nspec: {{image: \"{image}\"}}\n"
    )
}

/// The `Plugin` named `name`, cluster-scoped.
pub(crate) fn plugin_status(cp: &ControlPlane, name: &str) -> Value {
    let out = cp.kubectl(&["get", "plugins.wasm-operator.dev", name, "-o", "json"]);
    if !out.status.success() {
        return Value::Null;
    }
    serde_json::from_slice::<Value>(&out.stdout).unwrap()["status"].clone()
}

pub(crate) fn ready(status: &Value) -> (String, String, String) {
    let c = status["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready").cloned())
        .unwrap_or_default();
    let s = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
    (s("status"), s("reason"), s("message"))
}

/// Applies the Plugin `name` of the image `broken` (which is not a component), and waits until
/// the operator has refused it: it has handled every Plugin event before this one too.
async fn barrier(cp: &ControlPlane, name: &str, broken: &str) {
    apply_cluster(cp, &plugin(name, broken));
    eventually(
        &format!("the Plugin {name} to be refused"),
        Duration::from_secs(60),
        || ready(&plugin_status(cp, name)).1 == "CheckFailed",
    )
    .await;
}

/// The Plugin CRD, as `host crds` prints it, installed and Established.
pub(crate) fn install_plugin_crd(cp: &ControlPlane) {
    apply_cluster(cp, &serde_json::to_string(&host::api::crd()).unwrap());
    wait_for(cp, "Established", "crd/plugins.wasm-operator.dev");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_resource_is_served_upgraded_kept_on_a_bad_version_and_dropped_live() {
    // A control plane of its own: the CRDs there are the Plugins' alone.
    let cp = ControlPlane::start().unwrap();
    let _logs = cp.logs_on_failure();
    let registry = Registry::start(RegistryOptions::default()).unwrap();
    let v1 = push(
        &registry,
        "plugins/hostile",
        &std::fs::read(test_guests::HOSTILE).unwrap(),
    )
    .await;
    let v2 = push(
        &registry,
        "plugins/hostile",
        &std::fs::read(test_guests::HOSTILE_NEXT).unwrap(),
    )
    .await;
    let broken = push(&registry, "plugins/hostile", b"\0asm but not a component").await;
    assert_ne!(v1, v2);

    install_plugin_crd(&cp);

    // The operator serves no Kind at start, and Plugin resources.
    let store = tempfile::tempdir().unwrap();
    let runtime = host::plugin::Runtime::new(
        host::plugin::Limits::default(),
        Some(crate::support::cache()),
    )
    .unwrap();
    let operator = serve_plugins(cp.client().await.unwrap(), &runtime, store.path());

    // A Plugin whose registry takes connections and never answers (a listener nobody accepts
    // from): it holds back nothing but itself.
    let black_hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let stuck = format!(
        "oci://{}/plugins/stuck@sha256:{}",
        black_hole.local_addr().unwrap(),
        "0".repeat(64)
    );
    apply_cluster(&cp, &plugin("stuck", &stuck));

    // A Plugin: its CRD installed, its Kind served.
    apply_cluster(&cp, &plugin("hostile", &v1));
    wait_for(&cp, "Ready", "plugins.wasm-operator.dev/hostile");
    assert_eq!(
        ready(&plugin_status(&cp, "stuck")).0,
        "",
        "the Plugin on the silent registry was settled first (its pull has a 30 s deadline)"
    );
    kubectl_ok(&cp, &["delete", "plugins.wasm-operator.dev", "stuck"]);
    drop(black_hole);
    let status = plugin_status(&cp, "hostile");
    assert_eq!(status["digest"], v1.rsplit_once('@').unwrap().1, "{status}");
    assert_eq!(
        status["kinds"][0], "Hostile.test.wasm-operator.dev",
        "{status}"
    );
    let crd = kubectl_ok(
        &cp,
        &[
            "get",
            "crd",
            "hostiles.test.wasm-operator.dev",
            "-o",
            "json",
        ],
    );
    let crd: Value = serde_json::from_str(&crd).unwrap();
    assert_eq!(
        crd["metadata"]["annotations"][host::api::CRD_OWNER],
        "hostile"
    );
    // Its Kind names a Secret (contract 1.2): the admission policy and its binding come with
    // the CRD.
    for (kind, says) in [
        ("validatingadmissionpolicy", "object.spec.secretName"),
        (
            "validatingadmissionpolicybinding",
            "\"policyName\": \"references.hostiles.test.wasm-operator.dev\"",
        ),
    ] {
        let policy = kubectl_ok(
            &cp,
            &[
                "get",
                kind,
                "references.hostiles.test.wasm-operator.dev",
                "-o",
                "json",
            ],
        );
        assert!(policy.contains(says), "{policy}");
    }

    let admin = cp.client().await.unwrap();
    let ns = cp.namespace(&admin, "live").await.unwrap();
    let hostile = "apiVersion: test.wasm-operator.dev/v1\nkind: Hostile\nmetadata: {name: h}\nspec: {mode: ok}\n";
    apply(&cp, &ns, hostile);
    wait_ready(&cp, &ns, "hostiles.test.wasm-operator.dev/h");
    let data = |cp: &ControlPlane| get(cp, &ns, "configmap/h").map(|c| c["data"].clone());
    assert_eq!(data(&cp).unwrap()["mode"], "ok");
    assert!(data(&cp).unwrap().get("version").is_none());

    // A new digest: the children change, with no restart.
    apply_cluster(&cp, &plugin("hostile", &v2));
    eventually(
        "the children of the new version",
        Duration::from_secs(60),
        || data(&cp).is_some_and(|d| d["version"] == "next"),
    )
    .await;
    let h = get(&cp, &ns, "hostiles.test.wasm-operator.dev/h").unwrap();
    assert!(
        h["status"]["plugin"].as_str().unwrap().contains("0.0.1"),
        "{h}"
    );
    assert!(!operator.is_finished(), "the operator stopped");

    // A broken version: refused, saying why; the last good one keeps serving.
    apply_cluster(&cp, &plugin("hostile", &broken));
    eventually(
        "the broken version refused",
        Duration::from_secs(60),
        || {
            let s = plugin_status(&cp, "hostile");
            ready(&s).0 == "False"
        },
    )
    .await;
    let status = plugin_status(&cp, "hostile");
    let (_, reason, message) = ready(&status);
    assert_eq!(reason, "CheckFailed", "{status}");
    assert!(
        message.contains("still serving") && message.contains(v2.trim_start_matches("oci://")),
        "{message}"
    );
    assert_eq!(status["digest"], v2.rsplit_once('@').unwrap().1, "{status}");
    operator
        .reconciles("hostiles.test.wasm-operator.dev", || {
            apply(
                &cp,
                &ns,
                &hostile.replace("name: h}", "name: h, labels: {touched: \"yes\"}}"),
            );
        })
        .await;
    assert_eq!(
        data(&cp).unwrap()["version"],
        "next",
        "not served by the last good version"
    );
    wait_ready(&cp, &ns, "hostiles.test.wasm-operator.dev/h");

    // A second Plugin for the same Kind: refused, naming both.
    apply_cluster(&cp, &plugin("hostile-again", &v1));
    eventually("the second Plugin refused", Duration::from_secs(60), || {
        ready(&plugin_status(&cp, "hostile-again")).1 == "KindConflict"
    })
    .await;
    let (_, _, message) = ready(&plugin_status(&cp, "hostile-again"));
    assert!(
        message.contains("Plugin/hostile ") && message.contains("Plugin/hostile-again"),
        "{message}"
    );
    kubectl_ok(
        &cp,
        &["delete", "plugins.wasm-operator.dev", "hostile-again"],
    );

    // Deleted: its controllers stop; its CRD and resources stay.
    kubectl_ok(
        &cp,
        &[
            "delete",
            "plugins.wasm-operator.dev",
            "hostile",
            "--wait=true",
        ],
    );
    // The operator handles the Plugins' events in order: once it has handled a Plugin applied
    // after the delete, it has stopped the deleted one's controllers; once it has handled one
    // applied after the change, it has had the time to see the change.
    barrier(&cp, "after-delete", &broken).await;
    apply(&cp, &ns, &hostile.replace("mode: ok", "mode: error"));
    barrier(&cp, "after-change", &broken).await;
    let h = get(&cp, &ns, "hostiles.test.wasm-operator.dev/h").expect("the resource stays");
    assert_ne!(
        h["status"]["observedGeneration"], h["metadata"]["generation"],
        "reconciled after its Plugin was deleted: {h}"
    );
    assert!(kubectl(&cp, &["get", "crd", "hostiles.test.wasm-operator.dev"]).0);
    assert_eq!(data(&cp).unwrap()["version"], "next");
    for name in ["after-delete", "after-change"] {
        kubectl_ok(&cp, &["delete", "plugins.wasm-operator.dev", name]);
    }

    operator.stop().await;

    // An operator whose ServiceAccount may serve Plugins (`host rbac --plugin-resources`) but
    // not what this plugin's Kinds need: the Plugin says which rule is missing.
    let rbac = crate::support::host_ok(&[
        "rbac",
        "--no-builtins",
        "--plugin-resources",
        "--namespace",
        "default",
        "--name",
        "limited",
    ]);
    apply_cluster(&cp, &rbac);
    let limited = cp
        .service_account_client(&admin, "default", "limited")
        .await
        .unwrap();
    let operator = serve_plugins(limited, &runtime, store.path());
    apply_cluster(&cp, &plugin("limited", &v1));
    eventually(
        "the Plugin refused for want of a rule",
        Duration::from_secs(60),
        || ready(&plugin_status(&cp, "limited")).1 == "Forbidden",
    )
    .await;
    let (_, _, message) = ready(&plugin_status(&cp, "limited"));
    assert!(
        message.contains("may not") && message.contains("apiGroups: [test.wasm-operator.dev]"),
        "{message}"
    );
    operator.stop().await;
}

/// An operator of these tests (see [`settings_for`]) on `client`, serving no Kind at start and
/// the plugins `Plugin` resources name, loaded by `runtime`, pulled into `store`.
fn serve_plugins(
    client: kube::Client,
    runtime: &host::plugin::Runtime,
    store: &std::path::Path,
) -> Operator {
    Operator::run(
        client,
        host::registry::Registry::load(runtime, Default::default(), false, &[]).unwrap(),
        settings_for(runtime, store),
    )
}

/// How the operators of these tests run: no Kind at start, and `Plugin` resources.
pub(crate) fn settings_for(
    runtime: &host::plugin::Runtime,
    store: &std::path::Path,
) -> host::operator::Settings {
    host::operator::Settings {
        render_wait: Duration::from_secs(5),
        plugin_resources: Some(host::operator::plugins::Live {
            runtime: runtime.clone(),
            registries: host::oci::Options {
                timeout: Duration::from_secs(30),
                ..Default::default()
            },
            store: Some(host::oci::Store::new(store)),
            signatures: None,
        }),
        ..settings(Vec::new(), "default", "live")
    }
}

/// An operator that compiles plugins under `--compile-memory` too small for one: the Plugin
/// says so, naming the setting, and nothing of it is compiled in the operator's own process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_that_needs_more_memory_to_compile_than_the_cap_says_so() {
    let cp = ControlPlane::start().unwrap();
    let _logs = cp.logs_on_failure();
    let registry = Registry::start(RegistryOptions::default()).unwrap();
    let pinned = push(
        &registry,
        "plugins/hostile",
        &std::fs::read(test_guests::HOSTILE).unwrap(),
    )
    .await;
    install_plugin_crd(&cp);
    // An empty compile cache of its own, as in a new pod.
    let (cache, store) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let runtime = host::plugin::Runtime::new(
        host::plugin::Limits::default(),
        Some(host::plugin::Cache::new(cache.path())),
    )
    .unwrap()
    .compiling_apart(env!("CARGO_BIN_EXE_host").into(), Some(8 << 20));
    let operator = serve_plugins(cp.client().await.unwrap(), &runtime, store.path());
    apply_cluster(&cp, &plugin("tight", &pinned));
    eventually(
        "the Plugin to say its compile needs more memory",
        Duration::from_secs(60),
        || {
            ready(&plugin_status(&cp, "tight")).2.contains(
                "compiling it needs more memory than the compiler may take (8Mi, --compile-memory): raise it",
            )
        },
    )
    .await;
    let (status, reason, _) = ready(&plugin_status(&cp, "tight"));
    assert_eq!(status, "False", "{reason}");
    let compiled = std::fs::read_dir(cache.path())
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".cwasm"))
                .count()
        })
        .unwrap_or(0);
    assert_eq!(compiled, 0, "compiled all the same");
    assert!(
        !kubectl(&cp, &["get", "crd", "hostiles.test.wasm-operator.dev"]).0,
        "its Kind was installed"
    );
    operator.stop().await;
}

/// An example plugin (`examples/plugins/NAME`) served as its author would ship it, and the
/// operator serving it: what the tests of each language then look at.
struct Served {
    operator: Operator,
    /// The namespace its `example.yaml` was applied in.
    ns: String,
    _registry: Registry,
    _cache: tempfile::TempDir,
}

/// `host push`es `wasm` to a registry, runs an operator serving Plugin resources, applies a
/// `Plugin` named `name` pinned to the digest printed, waits for it to be Ready, and applies the
/// example's `example.yaml` in a new namespace named after `ns`.
async fn serve_example(cp: &ControlPlane, wasm: &std::path::Path, name: &str, ns: &str) -> Served {
    let registry = Registry::start(RegistryOptions::default()).unwrap();
    let cache = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_host"))
        .args(["push", &wasm.display().to_string()])
        .arg(format!("{}/plugins/{name}:0.1.0", registry.addr()))
        .env("WASM_OPERATOR_CACHE", cache.path())
        .output()
        .unwrap();
    let pinned = crate::support::succeeded("host push", out)
        .trim()
        .to_owned();

    install_plugin_crd(cp);
    let runtime = host::plugin::Runtime::new(
        host::plugin::Limits::default(),
        Some(crate::support::cache()),
    )
    .unwrap();
    let operator = serve_plugins(cp.client().await.unwrap(), &runtime, cache.path());
    apply_cluster(cp, &plugin(name, &pinned));
    wait_for(cp, "Ready", &format!("plugins.wasm-operator.dev/{name}"));
    let admin = cp.client().await.unwrap();
    let ns = cp.namespace(&admin, ns).await.unwrap();
    let example = std::fs::read_to_string(
        crate::support::root().join(format!("examples/plugins/{name}/example.yaml")),
    )
    .unwrap();
    apply(cp, &ns, &example);
    Served {
        operator,
        ns,
        _registry: registry,
        _cache: cache,
    }
}

/// The JavaScript example plugin as its author would ship it: `host push` to a registry, a
/// `Plugin` naming the digest printed, its `StaticSite` reconciled to Ready, and `kubectl get`
/// showing the host's Ready column (the plugin declares no columns).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_javascript_plugin_is_pushed_loaded_by_a_plugin_resource_and_reconciled() {
    let cp = ControlPlane::start().unwrap();
    let _logs = cp.logs_on_failure();
    let wasm = testenv::static_site_plugin().expect("scripts/js-plugin builds it");
    let served = serve_example(&cp, &wasm, "static-site", "site").await;
    let (operator, ns) = (served.operator, served.ns.clone());
    wait_ready(&cp, &ns, "staticsites.sites.example.com/hello");
    let files = get(&cp, &ns, "configmap/hello-files").expect("the files' ConfigMap");
    assert!(
        files["data"]["index.html"]
            .as_str()
            .unwrap()
            .contains("JavaScript")
    );
    let deployment = get(&cp, &ns, "deployment/hello").expect("the Deployment");
    assert_eq!(deployment["status"]["readyReplicas"], 2, "{deployment}");
    let table = kubectl_ok(&cp, &["get", "-n", &ns, "staticsites"]);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        (header.first(), header.get(1), header.last()),
        (Some(&"NAME"), Some(&"READY"), Some(&"AGE")),
        "{table}"
    );
    assert!(table.lines().nth(1).unwrap().contains("True"), "{table}");

    operator.stop().await;
}

/// The Python example plugin (componentize-py) as its author would ship it: `host push`, a
/// `Plugin` naming the digest printed, its `Redirect` reconciled to Ready with the plugin's own
/// status fields, and `kubectl get` showing the column the plugin declares.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_plugin_is_pushed_loaded_by_a_plugin_resource_and_reconciled() {
    let cp = ControlPlane::start().unwrap();
    let _logs = cp.logs_on_failure();
    let wasm = testenv::redirect_plugin().expect("scripts/py-plugin builds it");
    let served = serve_example(&cp, &wasm, "redirect", "redirect").await;
    let (operator, ns) = (served.operator, served.ns.clone());
    wait_ready(&cp, &ns, "redirects.redirects.example.com/old-docs");
    let conf = get(&cp, &ns, "configmap/old-docs-conf").expect("the server's ConfigMap");
    assert!(
        conf["data"]["default.conf"]
            .as_str()
            .unwrap()
            .contains("return 301 https://docs.example.com/;"),
        "{conf}"
    );
    let deployment = get(&cp, &ns, "deployment/old-docs").expect("the Deployment");
    assert_eq!(deployment["status"]["readyReplicas"], 2, "{deployment}");
    // The plugin's own status fields, from the children the operator observed.
    let redirect = get(&cp, &ns, "redirects.redirects.example.com/old-docs").unwrap();
    assert_eq!(
        redirect["status"]["target"], "https://docs.example.com/",
        "{redirect}"
    );
    eventually(
        "the plugin's status to count the available replicas",
        Duration::from_secs(30),
        || {
            get(&cp, &ns, "redirects.redirects.example.com/old-docs")
                .is_some_and(|r| r["status"]["availableReplicas"] == 2)
        },
    )
    .await;
    let table = kubectl_ok(&cp, &["get", "-n", &ns, "redirects"]);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert!(header.contains(&"TO"), "the plugin's column: {table}");
    assert!(table.contains("https://docs.example.com/"), "{table}");

    operator.stop().await;
}
