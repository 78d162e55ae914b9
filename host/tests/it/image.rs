//! The operator's image (built by `scripts/image`), run by podman exactly as a kubelet runs the
//! chart's pod: the ServiceAccount's token and the cluster's CA mounted at
//! `/var/run/secrets/kubernetes.io/serviceaccount`, `KUBERNETES_SERVICE_HOST`/`PORT` set, a
//! read-only root filesystem, user 65532, every capability dropped, the chart's arguments and
//! environment. `scripts/test` builds the image and names it in `$WASM_OPERATOR_IMAGE`. The
//! chart serves `Plugin` resources too (`pluginResources.enabled`): a third party's plugin,
//! pushed to a registry, is loaded live by the operator in the container.

use std::os::unix::fs::PermissionsExt as _;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use testenv::ControlPlane;

use crate::support::cluster::{
    WEB, apply, apply_cluster, eventually, http_get, kubectl_ok, wait_for, wait_ready,
};

/// The image under test: what `scripts/image` printed (scripts/test sets this).
fn image() -> String {
    std::env::var("WASM_OPERATOR_IMAGE").unwrap_or_else(|_| {
        panic!(
            "WASM_OPERATOR_IMAGE is not set: build the image with scripts/image and set it to \
             the reference it prints (scripts/test does both)"
        )
    })
}

/// The image's `host` binary, copied into `dir`: the operator exactly as it ships.
pub(crate) fn binary(dir: &std::path::Path) -> std::path::PathBuf {
    let created = podman_ok(&["create", "--pull=never", &image()]);
    let container = Container(created.trim().to_owned());
    let copy = dir.join("host");
    podman_ok(&[
        "cp",
        &format!("{}:/usr/local/bin/host", container.0),
        &copy.display().to_string(),
    ]);
    copy
}

fn podman(args: &[&str]) -> Output {
    Command::new("podman")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("podman did not run (apt-get install podman runc): {e}"))
}

fn podman_ok(args: &[&str]) -> String {
    crate::support::succeeded(&format!("podman {args:?}"), podman(args))
}

/// Removes the container however the test ends.
struct Container(String);

impl Drop for Container {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let logs = podman(&["logs", &self.0]);
            eprintln!(
                "container logs:\n{}{}",
                String::from_utf8_lossy(&logs.stdout),
                String::from_utf8_lossy(&logs.stderr)
            );
        }
        let _ = podman(&["rm", "--force", "--time", "0", &self.0]);
    }
}

fn host_version() -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_host"))
        .arg("--version")
        .output()
        .expect("host runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_image_is_static_scratch_and_labelled_with_the_versions() {
    let image = image();
    let inspect: Value = serde_json::from_str(&podman_ok(&["image", "inspect", &image])).unwrap();
    let config = &inspect[0]["Config"];
    assert_eq!(config["User"], "65532:65532");
    assert_eq!(
        config["Entrypoint"],
        serde_json::json!(["/usr/local/bin/host"])
    );
    // FROM scratch: two layers, the binary and the CA certificates, and nothing else.
    assert_eq!(
        inspect[0]["RootFS"]["Layers"].as_array().map(Vec::len),
        Some(2),
        "{}",
        inspect[0]["RootFS"]
    );
    let labels = &inspect[0]["Labels"];
    let version = host_version();
    let line = |prefix: &str| {
        version
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no `{prefix}` in {version}"))
            .to_owned()
    };
    assert_eq!(labels["org.opencontainers.image.version"], line("host "));
    assert_eq!(labels["dev.wasm-operator.wasmtime"], line("wasmtime "));
    assert_eq!(labels["dev.wasm-operator.contract"], line("contract "));
    for plugin in ["service", "datastore", "kvcluster"] {
        assert_eq!(
            labels[format!("dev.wasm-operator.plugin.{plugin}")],
            line(&format!("built-in plugin {plugin} ")),
            "the {plugin} plugin's digest"
        );
    }
    for key in [
        "org.opencontainers.image.title",
        "org.opencontainers.image.revision",
        "org.opencontainers.image.created",
        "org.opencontainers.image.source",
        "org.opencontainers.image.licenses",
    ] {
        assert!(labels[key].is_string(), "no {key} in {labels}");
    }
    // The binary inside is the host, and runs with nothing else in the image.
    let out = podman_ok(&[
        "run",
        "--rm",
        "--runtime",
        "runc",
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=1024:1024",
        "--network",
        "none",
        &image,
        "--version",
    ]);
    assert_eq!(out, version);
    // Reproducible on any machine: the binary names no path of the machine that built it.
    let dir = tempfile::tempdir().unwrap();
    let copy = binary(dir.path());
    let text = String::from_utf8_lossy(&std::fs::read(&copy).unwrap()).into_owned();
    for path in [crate::support::cargo_home(), crate::support::root()] {
        let path = format!("{}/", path.display());
        assert!(!text.contains(&path), "the image's host names {path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_runs_as_the_in_cluster_operator() {
    let image = image();
    let cp = ControlPlane::start().unwrap();
    let _logs = cp.logs_on_failure();
    let admin = cp.client().await.unwrap();

    // The chart, rendered for this image and free metrics and health ports, installed as plain
    // manifests; the metrics server's certificate from a CA of the test's (metrics.certSecret).
    let port = testenv::free_port().unwrap();
    let health_port = testenv::free_port().unwrap();
    let metrics_tls = tempfile::tempdir().unwrap();
    let ca_file = metrics_tls.path().join("ca.pem");
    {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let leaf =
            rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
                .unwrap()
                .signed_by(&key, &issuer)
                .unwrap();
        std::fs::write(&ca_file, ca.pem()).unwrap();
        std::fs::write(metrics_tls.path().join("tls.crt"), leaf.pem()).unwrap();
        std::fs::write(metrics_tls.path().join("tls.key"), key.serialize_pem()).unwrap();
        for f in ["tls.crt", "tls.key", "ca.pem"] {
            std::fs::set_permissions(
                metrics_tls.path().join(f),
                std::fs::Permissions::from_mode(0o644),
            )
            .unwrap();
        }
    }
    let (repository, tag) = image.rsplit_once(':').expect("image:tag");
    // With Plugin resources, and what docs/plugins.md says a plugin loaded that way needs:
    // the ClusterRole rules `host rbac --no-builtins --plugin FILE` prints, in
    // plugins.extraRules (here, for the JavaScript example plugin).
    let plugin_wasm = testenv::static_site_plugin().expect("scripts/js-plugin builds it");
    let rbac = crate::support::host_ok(&[
        "rbac",
        "--no-builtins",
        "--plugin",
        &plugin_wasm.display().to_string(),
    ]);
    let rules = host::documents::parse("host rbac", &rbac)
        .unwrap()
        .into_iter()
        .find(|d| d.value["kind"] == "ClusterRole")
        .expect("host rbac prints a ClusterRole")
        .value["rules"]
        .clone();
    let values = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        values.path(),
        serde_json::json!({ "plugins": { "extraRules": rules } }).to_string(),
    )
    .unwrap();
    let rendered = crate::chart::template_with(
        Some(values.path()),
        &[
            "namespace.create=true",
            &format!("image.repository={repository}"),
            &format!("image.tag={tag}"),
            &format!("metrics.port={port}"),
            &format!("metrics.healthPort={health_port}"),
            "metrics.certSecret=metrics-tls",
            "pluginResources.enabled=true",
            // The JavaScript plugin below compiles in 368Mi with this image; the default (64Mi)
            // is room for Rust guests (docs/install.md, "Memory").
            "sandbox.compileMemory=384Mi",
        ],
    );
    let manifests = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(manifests.path(), &rendered).unwrap();
    kubectl_ok(
        &cp,
        &[
            "apply",
            "--server-side",
            "-f",
            &manifests.path().display().to_string(),
        ],
    );
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
    let deployment = host::documents::parse("chart", &rendered)
        .unwrap()
        .into_iter()
        .map(|d| d.value)
        .find(|d| d["kind"] == "Deployment")
        .expect("the chart renders a Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert_eq!(container["image"], image.as_str());
    let args: Vec<String> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();

    // What the kubelet mounts: the ServiceAccount's token, the CA, the namespace.
    let secrets = tempfile::tempdir().unwrap();
    let token = cp
        .service_account_token(&admin, "wasm-operator", "wasm-operator")
        .await
        .unwrap();
    std::fs::write(secrets.path().join("token"), token).unwrap();
    std::fs::copy(cp.ca_path(), secrets.path().join("ca.crt")).unwrap();
    std::fs::write(secrets.path().join("namespace"), "wasm-operator").unwrap();
    for entry in std::fs::read_dir(secrets.path()).unwrap() {
        let path = entry.unwrap().path();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    std::fs::set_permissions(secrets.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let api_port = cp.server().rsplit(':').next().unwrap().to_owned();

    let name = format!("wasm-operator-test-{}", std::process::id());
    let mut run: Vec<String> = [
        "run",
        "--detach",
        "--name",
        &name,
        "--runtime",
        "runc",
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=1024:1024",
        "--network",
        "host",
        "--tmpfs",
        "/var/cache/wasm-operator:rw,mode=1777",
        "--volume",
        &format!(
            "{}:/etc/wasm-operator/metrics-tls:ro",
            metrics_tls.path().display()
        ),
        "--volume",
        &format!(
            "{}:/var/run/secrets/kubernetes.io/serviceaccount:ro",
            secrets.path().display()
        ),
        "--env",
        "KUBERNETES_SERVICE_HOST=127.0.0.1",
        "--env",
        &format!("KUBERNETES_SERVICE_PORT={api_port}"),
        "--env",
        &format!("POD_NAME={name}"),
        "--env",
        "POD_NAMESPACE=wasm-operator",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    // The pod's and the container's securityContext, as a kubelet applies them.
    run.extend(security_flags(
        &pod["securityContext"],
        &container["securityContext"],
    ));
    // The chart's environment, but for the two fields the kubelet fills in (set above).
    for env in container["env"].as_array().unwrap() {
        if let Some(value) = env["value"].as_str() {
            run.extend([
                "--env".to_owned(),
                format!("{}={value}", env["name"].as_str().unwrap()),
            ]);
        }
    }
    run.push(image.clone());
    run.extend(args);
    let run: Vec<&str> = run.iter().map(String::as_str).collect();
    podman_ok(&run);
    let _container = Container(name.clone());

    // An example Service becomes Ready through the operator in the container.
    let ns = cp.namespace(&admin, "app").await.unwrap();
    apply(&cp, &ns, WEB);
    wait_ready(&cp, &ns, "services.hanzo.ai/web");
    let health = std::net::SocketAddr::from(([127, 0, 0, 1], health_port));
    eventually("/readyz answers 200", Duration::from_secs(30), || {
        http_get(health, "/readyz").starts_with("HTTP/1.0 200")
    })
    .await;
    // /metrics: HTTPS, and only to a token the API server says may get it.
    let scrape = |token: Option<&str>| {
        let dir = tempfile::tempdir().unwrap();
        let mut args = vec![
            "probe".to_owned(),
            "--ca-file".to_owned(),
            ca_file.display().to_string(),
        ];
        if let Some(token) = token {
            std::fs::write(dir.path().join("token"), token).unwrap();
            args.extend([
                "--bearer-token-file".to_owned(),
                dir.path().join("token").display().to_string(),
            ]);
        }
        args.push(format!("https://127.0.0.1:{port}/metrics"));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        crate::support::host_in(metrics_tls.path(), &args)
    };
    let anonymous = scrape(None);
    assert_eq!(anonymous.status.code(), Some(1), "{anonymous:?}");
    assert!(
        String::from_utf8_lossy(&anonymous.stderr).contains("401"),
        "{anonymous:?}"
    );
    kubectl_ok(&cp, &["create", "serviceaccount", "prometheus", "-n", &ns]);
    let prometheus = cp
        .service_account_token(&admin, &ns, "prometheus")
        .await
        .unwrap();
    let unbound = scrape(Some(&prometheus));
    assert_eq!(unbound.status.code(), Some(1), "{unbound:?}");
    assert!(
        String::from_utf8_lossy(&unbound.stderr).contains("403")
            && String::from_utf8_lossy(&unbound.stderr).contains("may not get /metrics"),
        "{unbound:?}"
    );
    kubectl_ok(
        &cp,
        &[
            "create",
            "clusterrolebinding",
            "prometheus-metrics",
            "--clusterrole=wasm-operator-metrics-reader",
            &format!("--serviceaccount={ns}:prometheus"),
        ],
    );
    // An answer is remembered for a minute by token: each try has a new token of the same
    // account, asked anew, until the API server's authorizer has the binding.
    let deadline = Instant::now() + Duration::from_secs(30);
    let scraped = loop {
        let prometheus = cp
            .service_account_token(&admin, &ns, "prometheus")
            .await
            .unwrap();
        let scraped = scrape(Some(&prometheus));
        if scraped.status.success() || Instant::now() > deadline {
            break scraped;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let metrics = String::from_utf8_lossy(&scraped.stdout).into_owned();
    assert!(scraped.status.success(), "{scraped:?}");
    assert!(
        metrics.contains("controller_runtime_reconcile_total")
            && metrics.contains("leader_election_master_status"),
        "{metrics}"
    );
    // `helm test`'s pod: the same image, asking /readyz with `host probe` as the chart's test
    // hook does (here through the host's network rather than the Service).
    let probe = |path: &str| {
        podman(&[
            "run",
            "--rm",
            "--pull=never",
            "--runtime",
            "runc",
            "--ulimit",
            "nofile=1024:1024",
            "--ulimit",
            "nproc=1024:1024",
            "--network",
            "host",
            "--user",
            "65532:65532",
            &image,
            "probe",
            &format!("http://127.0.0.1:{health_port}{path}"),
        ])
    };
    let ready = probe("/readyz");
    assert!(ready.status.success(), "{ready:?}");
    assert!(
        String::from_utf8_lossy(&ready.stdout).starts_with("200 OK"),
        "{ready:?}"
    );
    let missing = probe("/no-such-path");
    assert_eq!(missing.status.code(), Some(1), "{missing:?}");

    // A plugin pushed to a registry, named by a Plugin: loaded by the running operator, its
    // CRD installed, its Kind reconciled to Ready.
    let registry = testenv::Registry::start(Default::default()).unwrap();
    let wasm = std::fs::read(&plugin_wasm).unwrap();
    let image_ref = crate::plugins::push(&registry, "plugins/static-site", &wasm).await;
    apply_cluster(&cp, &crate::plugins::plugin("static-site", &image_ref));
    wait_for(&cp, "Ready", "plugins.wasm-operator.dev/static-site");
    let site = std::fs::read_to_string(
        crate::support::root().join("examples/plugins/static-site/example.yaml"),
    )
    .unwrap();
    apply(&cp, &ns, &site);
    wait_ready(&cp, &ns, "staticsites.sites.example.com/hello");

    // SIGTERM stops it cleanly, well within the pod's grace period.
    let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
    let started = Instant::now();
    podman_ok(&["stop", "--time", &grace.to_string(), &name]);
    let took = started.elapsed();
    let state: Value = serde_json::from_str(&podman_ok(&[
        "inspect",
        "--format",
        "{{json .State}}",
        &name,
    ]))
    .unwrap();
    assert_eq!(state["ExitCode"], 0, "exit after SIGTERM: {state}");
    assert!(
        took < Duration::from_secs(grace),
        "stopping took {took:?}, the grace period is {grace} s"
    );
}

/// podman's flags for what the chart's securityContexts ask of the runtime (the container's
/// wins over the pod's, as in Kubernetes). A field this does not know fails the test, so the
/// image is never run more loosely than the chart says.
fn security_flags(pod: &Value, container: &Value) -> Vec<String> {
    let field = |name: &str| match &container[name] {
        Value::Null => &pod[name],
        v => v,
    };
    let known = [
        "runAsNonRoot",
        "runAsUser",
        "runAsGroup",
        "seccompProfile",
        "allowPrivilegeEscalation",
        "readOnlyRootFilesystem",
        "capabilities",
    ];
    for context in [pod, container] {
        for key in context.as_object().into_iter().flat_map(|o| o.keys()) {
            assert!(
                known.contains(&key.as_str()),
                "the chart sets securityContext.{key}, which this test does not apply"
            );
        }
    }
    let mut flags = Vec::new();
    let user = field("runAsUser")
        .as_i64()
        .expect("the chart sets runAsUser");
    assert!(
        field("runAsNonRoot") != &Value::Bool(true) || user != 0,
        "runAsNonRoot with user 0"
    );
    let group = field("runAsGroup").as_i64().unwrap_or(user);
    flags.extend(["--user".to_owned(), format!("{user}:{group}")]);
    if field("readOnlyRootFilesystem") == &Value::Bool(true) {
        flags.push("--read-only".to_owned());
    }
    if field("allowPrivilegeEscalation") == &Value::Bool(false) {
        flags.extend(["--security-opt".to_owned(), "no-new-privileges".to_owned()]);
    }
    for cap in field("capabilities")["drop"]
        .as_array()
        .into_iter()
        .flatten()
    {
        flags.extend(["--cap-drop".to_owned(), cap.as_str().unwrap().to_owned()]);
    }
    for cap in field("capabilities")["add"]
        .as_array()
        .into_iter()
        .flatten()
    {
        flags.extend(["--cap-add".to_owned(), cap.as_str().unwrap().to_owned()]);
    }
    // RuntimeDefault is podman's default seccomp profile too; anything else is not applied here.
    let seccomp = field("seccompProfile")["type"]
        .as_str()
        .unwrap_or("RuntimeDefault");
    assert_eq!(
        seccomp, "RuntimeDefault",
        "a seccomp profile this test cannot apply"
    );
    flags
}
