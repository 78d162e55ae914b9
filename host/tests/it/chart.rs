//! The Helm chart (`charts/wasm-operator`), run by Helm v4 itself: lint, what it renders against
//! what `host crds` and `host rbac` print, the plain manifests in `deploy/`, and install, upgrade
//! and uninstall on a real control plane into a namespace that enforces the `restricted` Pod
//! Security Standard.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use serde_json::Value;
use testenv::ControlPlane;

use crate::support::cluster::{WEB, apply, get, kubectl, kubectl_ok};
use crate::support::root;

const CHART: &str = "charts/wasm-operator";

/// Runs helm from the repository root, with its caches and configuration in a directory of the
/// test run's own.
pub(crate) fn helm(args: &[&str]) -> Output {
    let binary: PathBuf = testenv::helm().unwrap_or_else(|e| panic!("helm: {e}"));
    let home = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("helm-home");
    Command::new(binary)
        .args(args)
        .current_dir(root())
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("helm did not run: {e}"))
}

pub(crate) fn helm_ok(args: &[&str]) -> String {
    crate::support::succeeded(&format!("helm {args:?}"), helm(args))
}

fn host_ok(args: &[&str]) -> String {
    let cache = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cli-cache");
    let out = Command::new(env!("CARGO_BIN_EXE_host"))
        .args(args)
        .env("WASM_OPERATOR_CACHE", cache)
        .stdin(Stdio::null())
        .output()
        .expect("host runs");
    assert!(
        out.status.success(),
        "host {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn documents(text: &str) -> Vec<Value> {
    host::documents::parse("output", text)
        .expect("YAML parses")
        .into_iter()
        .map(|d| d.value)
        .collect()
}

/// `helm template` of the chart as release `wasm-operator` in namespace `wasm-operator`.
pub(crate) fn template(sets: &[&str]) -> String {
    template_with(None, sets)
}

/// As [`template`], with a values file first (`-f`).
pub(crate) fn template_with(values: Option<&std::path::Path>, sets: &[&str]) -> String {
    let values = values.map(|v| v.display().to_string());
    let mut args = vec![
        "template",
        "wasm-operator",
        CHART,
        "--namespace",
        "wasm-operator",
    ];
    if let Some(values) = &values {
        args.extend(["--values", values]);
    }
    for set in sets {
        args.extend(["--set", set]);
    }
    helm_ok(&args)
}

/// The Deployment among `docs`.
fn deployment(docs: &[Value]) -> Value {
    docs.iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("a Deployment")
        .clone()
}

/// The CRDs among `docs`, by name, without the labels and annotations a chart adds.
fn crds(docs: &[Value]) -> BTreeMap<String, Value> {
    docs.iter()
        .filter(|d| d["kind"] == "CustomResourceDefinition")
        .map(|d| {
            let mut d = d.clone();
            if let Some(meta) = d["metadata"].as_object_mut() {
                meta.remove("labels");
                meta.remove("annotations");
            }
            (
                d["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                d,
            )
        })
        .collect()
}

fn rules<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    &docs
        .iter()
        .find(|d| d["kind"] == kind && d.get("rules").is_some())
        .unwrap_or_else(|| panic!("no {kind} with rules"))["rules"]
}

#[test]
fn helm_lint_passes() {
    let out = helm_ok(&["lint", "--strict", CHART]);
    assert!(out.contains("0 chart(s) failed"), "{out}");
}

#[test]
fn the_chart_installs_what_host_crds_and_host_rbac_print() {
    for group in ["hanzo.ai", "example.com"] {
        let chart = documents(&template(&[
            &format!("apiGroup={group}"),
            "pluginResources.enabled=true",
        ]));
        let host_crds = documents(&host_ok(&["crds", "--api-group", group]));
        let host_rbac = documents(&host_ok(&[
            "rbac",
            "--api-group",
            group,
            "--plugin-resources",
        ]));

        let (want, got) = (crds(&host_crds), crds(&chart));
        assert_eq!(
            want.keys().collect::<Vec<_>>(),
            got.keys().collect::<Vec<_>>(),
            "the chart's CRDs under {group}; run scripts/generate"
        );
        for (name, crd) in &want {
            assert!(
                got[name] == *crd,
                "the chart's {name} differs from `host crds`; run scripts/generate"
            );
        }
        for kind in ["ClusterRole", "Role"] {
            assert_eq!(
                rules(&chart, kind),
                rules(&host_rbac, kind),
                "the chart's {kind} under {group} differs from `host rbac`; run scripts/generate"
            );
        }
        // With shards, the chart grants what `host rbac --shards` adds.
        let sharded = documents(&template(&[
            &format!("apiGroup={group}"),
            "pluginResources.enabled=true",
            "sharding.shards=2",
        ]));
        let host_sharded = documents(&host_ok(&[
            "rbac",
            "--api-group",
            group,
            "--plugin-resources",
            "--shards=2",
        ]));
        for kind in ["ClusterRole", "Role"] {
            assert_eq!(
                rules(&sharded, kind),
                rules(&host_sharded, kind),
                "the chart's {kind} with shards under {group} differs from `host rbac --shards`"
            );
            assert_ne!(
                rules(&sharded, kind),
                rules(&chart, kind),
                "shards grant nothing more in the {kind}"
            );
        }
        assert!(
            deployment(&sharded).to_string().contains("\"--shards=2\""),
            "the Deployment's args lack --shards=2"
        );
        // With Plugin resources off (the default), the ClusterRole is `host rbac`'s without them.
        let default = documents(&template(&[&format!("apiGroup={group}")]));
        assert_eq!(
            rules(&default, "ClusterRole"),
            rules(
                &documents(&host_ok(&["rbac", "--api-group", group])),
                "ClusterRole"
            ),
            "the chart's default ClusterRole under {group} differs from `host rbac`"
        );
        for doc in chart.iter().filter(|d| d.get("rules").is_some()) {
            assert!(
                !doc["rules"].to_string().contains('*'),
                "a wildcard in {doc}"
            );
        }
        // The admission policies are `host admission`'s, moved to the group.
        // (Helm orders what it renders by kind.)
        let policies = |docs: &[Value]| -> BTreeMap<String, Value> {
            docs.iter()
                .filter(|d| {
                    d["kind"] == "ValidatingAdmissionPolicy"
                        || d["kind"] == "ValidatingAdmissionPolicyBinding"
                })
                .map(|d| {
                    (
                        format!("{}/{}", d["kind"], d["metadata"]["name"]),
                        d["spec"].clone(),
                    )
                })
                .collect()
        };
        let host_admission = documents(&host_ok(&["admission", "--api-group", group]));
        assert_eq!(
            policies(&chart).len(),
            26,
            "a policy and a binding per hanzo Kind"
        );
        assert_eq!(
            policies(&chart),
            policies(&host_admission),
            "the chart's admission policies under {group} differ from `host admission`; run scripts/generate"
        );
        // Every CRD is kept when the release is uninstalled.
        for crd in chart
            .iter()
            .filter(|d| d["kind"] == "CustomResourceDefinition")
        {
            assert_eq!(
                crd["metadata"]["annotations"]["helm.sh/resource-policy"], "keep",
                "{}",
                crd["metadata"]["name"]
            );
        }
    }
}

/// The values a platform team sets, each seen in what the chart renders.
#[test]
fn the_values_reach_what_the_chart_renders() {
    let digest = format!("sha256:{}", "a".repeat(64));
    let docs = documents(&template(&[
        "watchNamespaces={app,web}",
        &format!("image.digest={digest}"),
        "plugins.files={/plugins/site.wasm}",
        "plugins.requireDigest=true",
        "plugins.registry.configSecret=registry-login",
        "plugins.registry.caConfigMap=registry-ca",
        "sandbox.timeout=2s",
        "replicas=1",
        "leaderElection.enabled=false",
        "policy.podSecurity=restricted",
        "policy.clusterIssuers={letsencrypt-prod,internal-ca}",
        "policy.kmsHostAPIs={https://kms.example.com/api}",
        "policy.adoptInNamespaces={app}",
        "pluginSignatures.policy.rules[0].repositories[0]=ghcr.io/acme/*",
        "pluginSignatures.policy.rules[0].keys[0].file=acme-signing/cosign.pub",
        "pluginSignatures.secrets={acme-signing}",
    ]));
    let pod = &deployment(&docs)["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert_eq!(
        container["image"],
        format!("ghcr.io/hanzoai/wasm-operator@{digest}")
    );
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    // The registry's credentials and CA, mounted where the flags' variables point.
    let env = container["env"].to_string();
    let mounts = container["volumeMounts"].to_string();
    let volumes = pod["volumes"].to_string();
    for (variable, dir) in [
        ("REGISTRY_CONFIG", "/var/run/secrets/wasm-operator/registry"),
        ("REGISTRY_CA", "/etc/wasm-operator/registry-ca"),
    ] {
        assert!(env.contains(variable) && env.contains(dir), "{env}");
        assert!(mounts.contains(dir), "{mounts}");
    }
    assert!(
        volumes.contains("registry-login") && volumes.contains("registry-ca"),
        "{volumes}"
    );
    for want in [
        "--require-digest",
        "--watch-namespace=app,web",
        "--plugin=/plugins/site.wasm",
        "--plugin-timeout=2s",
        "--leader-elect=false",
        "--pod-security=restricted",
        "--cluster-issuer=letsencrypt-prod,internal-ca",
        "--kms-host-api=https://kms.example.com/api",
        "--adopt-in-namespace=app",
        "--plugin-signatures=/etc/wasm-operator/signatures/policy.yaml",
    ] {
        assert!(args.contains(&want), "no {want} in {args:?}");
    }
    // The signature policy, in a ConfigMap mounted where the flag points, beside the Secret of
    // the key it names; as mounted, the host reads it.
    assert!(
        mounts.contains("/etc/wasm-operator/signatures/acme-signing")
            && volumes.contains("acme-signing"),
        "{mounts} {volumes}"
    );
    let policy = docs
        .iter()
        .find(|d| {
            d["kind"] == "ConfigMap" && d["metadata"]["name"] == "wasm-operator-plugin-signatures"
        })
        .expect("the policy's ConfigMap");
    let mounted = tempfile::tempdir().unwrap();
    std::fs::create_dir(mounted.path().join("acme-signing")).unwrap();
    std::fs::write(
        mounted.path().join("acme-signing/cosign.pub"),
        "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEzKnRHCtJN7DfC+P1hBzeFzPSSkv9\n6BxO4/OrD6MTzVzPjdSm3jmZK/Yz1O2/da7TgaQ75ySsi51BXx5VnlMq2Q==\n-----END PUBLIC KEY-----\n",
    )
    .unwrap();
    let path = mounted.path().join("policy.yaml");
    std::fs::write(&path, policy["data"]["policy.yaml"].as_str().unwrap()).unwrap();
    host::signature::Policy::from_file(&path)
        .unwrap_or_else(|e| panic!("the chart's policy: {e}\n{policy}"));
    let annotations = &deployment(&docs)["spec"]["template"]["metadata"]["annotations"];
    assert!(
        annotations["checksum/plugin-signatures"].is_string(),
        "a new policy rolls the pods: {annotations}"
    );
    // Given as a string (`--set-file pluginSignatures.policy=policy.yaml`), it is the same policy.
    let values = mounted.path().join("values.yaml");
    std::fs::write(
        &values,
        "pluginSignatures:\n  policy: |\n    rules:\n      - repositories: [ghcr.io/acme/*]\n        keys: [{file: acme-signing/cosign.pub}]\n",
    )
    .unwrap();
    let as_string = documents(&template_with(Some(&values), &[]));
    let text = as_string
        .iter()
        .find(|d| d["metadata"]["name"] == "wasm-operator-plugin-signatures")
        .expect("the policy's ConfigMap, from a string")["data"]["policy.yaml"]
        .as_str()
        .unwrap()
        .to_owned();
    std::fs::write(&path, &text).unwrap();
    host::signature::Policy::from_file(&path)
        .unwrap_or_else(|e| panic!("the chart's policy, from a string: {e}\n{text}"));
    assert!(
        deployment(&as_string)["spec"]["template"]["metadata"]["annotations"]
            ["checksum/plugin-signatures"]
            .is_string()
    );
    // The host takes them as the rules the values say.
    use clap::Parser;
    let parsed =
        host::cli::Cli::try_parse_from(std::iter::once("host").chain(args.iter().copied()))
            .unwrap_or_else(|e| panic!("host does not take {args:?}: {e}"));
    let host::cli::Command::Run(run) = parsed.command else {
        panic!("not `host run`: {args:?}")
    };
    let policy = run.policy.rules();
    assert_eq!(policy.pod_security, host::policy::Level::Restricted);
    assert_eq!(policy.allowed.cluster_issuers.len(), 2);
    assert!(policy.adopt_namespaces.contains("app"));
    // By default: baseline, and the same Ingress annotations as the host's own default.
    let defaults = documents(&template(&[]));
    let default_args =
        deployment(&defaults)["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(
        default_args.contains("\"--pod-security=baseline\""),
        "{default_args}"
    );
    let annotations = format!(
        "\"--ingress-annotations={}\"",
        host::policy::reach::DEFAULT_INGRESS_ANNOTATIONS.join(",")
    );
    assert!(default_args.contains(&annotations), "{default_args}");
    // Watching two namespaces, the ClusterRole is bound in those two alone, as `host rbac`
    // binds it.
    let bindings = |docs: &[Value]| -> Vec<Value> {
        docs.iter()
            .filter(|d| d["kind"] == "RoleBinding" || d["kind"] == "ClusterRoleBinding")
            .filter(|d| d["roleRef"]["kind"] == "ClusterRole")
            // The secure metrics' review rights are cluster-wide by nature (checked below).
            .filter(|d| {
                !d["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .ends_with("-metrics-auth")
            })
            .map(|d| {
                serde_json::json!([
                    d["kind"],
                    d["metadata"]["name"],
                    d["metadata"]["namespace"],
                    d["roleRef"],
                    d["subjects"]
                ])
            })
            .collect()
    };
    let host_rbac = documents(&host_ok(&["rbac", "--watch-namespace", "app,web"]));
    assert_eq!(bindings(&docs).len(), 2, "{:?}", bindings(&docs));
    assert_eq!(bindings(&docs), bindings(&host_rbac));
    assert!(bindings(&docs).iter().all(|b| b[0] == "RoleBinding"));
    // The secure metrics' review rights: the same rules as `host rbac`, bound cluster-wide.
    let auth = |docs: &[Value], kind: &str| {
        docs.iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == "wasm-operator-metrics-auth")
            .cloned()
            .unwrap_or_else(|| panic!("no {kind} wasm-operator-metrics-auth"))
    };
    assert_eq!(
        auth(&docs, "ClusterRole")["rules"],
        auth(&host_rbac, "ClusterRole")["rules"]
    );
    assert_eq!(
        auth(&docs, "ClusterRoleBinding")["subjects"],
        auth(&host_rbac, "ClusterRoleBinding")["subjects"]
    );
    let plain = documents(&template(&["metrics.secure=false"]));
    assert!(
        !plain
            .iter()
            .any(|d| d["metadata"]["name"] == "wasm-operator-metrics-auth"),
        "no review rights without secure metrics"
    );
    assert!(!args.contains(&"--plugin-resources"));
    // With Plugin resources too, what they need (cluster-wide by nature) is a ClusterRole of its
    // own, bound cluster-wide, as `host rbac` makes it.
    let docs = documents(&template(&[
        "watchNamespaces={app,web}",
        "pluginResources.enabled=true",
    ]));
    let host_rbac = documents(&host_ok(&[
        "rbac",
        "--watch-namespace",
        "app,web",
        "--plugin-resources",
    ]));
    assert_eq!(bindings(&docs), bindings(&host_rbac));
    let plugin_role = |docs: &[Value]| {
        docs.iter()
            .find(|d| {
                d["kind"] == "ClusterRole" && d["metadata"]["name"] == "wasm-operator-plugins"
            })
            .map(|d| d["rules"].clone())
            .expect("the Plugin resources' ClusterRole")
    };
    assert_eq!(plugin_role(&docs), plugin_role(&host_rbac));
    assert_eq!(
        rules(&docs, "ClusterRole"),
        rules(&host_rbac, "ClusterRole")
    );
    assert!(
        deployment(&docs)["spec"]["template"]["spec"]["containers"][0]["args"]
            .to_string()
            .contains("--plugin-resources")
    );
    assert!(
        docs.iter()
            .any(|d| d["metadata"]["name"] == "plugins.wasm-operator.dev"),
        "the Plugin CRD"
    );
    // The single value of earlier versions is refused, saying what replaced it.
    let out = helm(&[
        "template",
        "wasm-operator",
        CHART,
        "--set",
        "watchNamespace=app",
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("watchNamespaces, a list"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Without the built-in plugins: no CRDs, and the ClusterRole holds the rules given.
    let docs = documents(&template(&[
        "plugins.builtins=false",
        "plugins.extraRules[0].apiGroups={example.com}",
        "plugins.extraRules[0].resources={sites}",
        "plugins.extraRules[0].verbs={get,list,watch}",
    ]));
    assert!(
        !docs.iter().any(|d| d["kind"] == "CustomResourceDefinition"),
        "built-in CRDs without the built-in plugins"
    );
    let args = deployment(&docs)["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(args.contains("--no-builtins"), "{args}");
    // The namespaces' Pod Security labels are read whatever the plugins.
    assert_eq!(
        *rules(&docs, "ClusterRole"),
        serde_json::json!([
            { "apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"] },
            { "apiGroups": ["example.com"], "resources": ["sites"], "verbs": ["get", "list", "watch"] },
        ])
    );
    assert!(
        !docs
            .iter()
            .any(|d| d["kind"] == "ValidatingAdmissionPolicy"),
        "the built-in plugins' admission policies without them"
    );

    // The Leases' FlowSchema: the release's ServiceAccount, on Leases in the release's
    // namespace (the install test checks where the API server puts them); none without leader
    // election.
    let leaderless = documents(&template(&["replicas=1", "leaderElection.enabled=false"]));
    assert!(
        !leaderless.iter().any(|d| d["kind"] == "FlowSchema"),
        "a FlowSchema without leader election"
    );
    let docs = documents(&template(&[]));
    let flows: Vec<&Value> = docs.iter().filter(|d| d["kind"] == "FlowSchema").collect();
    assert_eq!(flows.len(), 1, "{flows:?}");
    let rule = &flows[0]["spec"]["rules"][0];
    assert_eq!(
        rule["subjects"],
        serde_json::json!([{ "kind": "ServiceAccount",
            "serviceAccount": { "name": "wasm-operator", "namespace": "wasm-operator" } }])
    );
    assert_eq!(
        rule["resourceRules"],
        serde_json::json!([{ "apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
            "namespaces": ["wasm-operator"], "verbs": ["*"] }])
    );
    assert_eq!(
        flows[0]["spec"]["priorityLevelConfiguration"]["name"],
        "leader-election"
    );

    // Two replicas with no leader would both write: refused.
    let out = helm(&[
        "template",
        "wasm-operator",
        CHART,
        "--set",
        "leaderElection.enabled=false",
    ]);
    assert!(
        !out.status.success(),
        "two leaderless replicas were rendered"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("needs leaderElection.enabled"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The container's memory limit is the base plus room for the plugin calls in flight, counted
/// as the host counts them, plus one compile; `--render-memory` is the calls' room,
/// `--compile-memory` the compile's.
#[test]
fn the_memory_limit_is_the_base_and_room_for_the_calls_in_flight_and_a_compile() {
    use clap::Parser;
    let container = |sets: &[&str]| {
        let docs = documents(&template(sets));
        docs.iter()
            .find(|d| d["kind"] == "Deployment")
            .expect("a Deployment")["spec"]["template"]["spec"]["containers"][0]
            .clone()
    };
    for (sets, calls, budget, compile, limit) in [
        (&[][..], 2, "160Mi", 64 << 20, "352Mi"),
        (
            &[
                "sandbox.memory=32Mi",
                "sandbox.output=512Ki",
                "sandbox.callsInFlight=3",
                "sandbox.compileMemory=384Mi",
                "baseMemory=100Mi",
            ][..],
            3,
            "102Mi",
            384 << 20,
            "586Mi",
        ),
        // Units as the host also reads them, and bytes rounded up to whole KiB.
        (
            &[
                "sandbox.memory=64MiB",
                "sandbox.output=1000000",
                "sandbox.callsInFlight=1",
            ][..],
            1,
            "69444Ki",
            64 << 20,
            "266052Ki",
        ),
    ] {
        let c = container(sets);
        assert_eq!(c["resources"]["limits"]["memory"], limit, "{sets:?}");
        let args: Vec<&str> = c["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        let flag = format!("--render-memory={budget}");
        assert!(args.contains(&flag.as_str()), "no {flag} in {args:?}");
        let parsed =
            host::cli::Cli::try_parse_from(std::iter::once("host").chain(args.iter().copied()))
                .unwrap_or_else(|e| panic!("host does not take {args:?}: {e}"));
        let host::cli::Command::Run(run) = parsed.command else {
            panic!("not `host run`: {args:?}")
        };
        assert_eq!(run.compile_memory, Some(compile), "{sets:?}");
        let per_call = run.plugins.sandbox.limits().call_memory();
        let budget = run.render_memory.map_or(0, |b| b as u64);
        assert!(
            budget >= calls * per_call && budget - calls * per_call < calls * 4 * 1024,
            "{sets:?}: the chart counts a call as the host does, {budget} for {calls} × {per_call}"
        );
    }
    // A limit given is kept; a size the host could not read is refused, naming it.
    let c = container(&["resources.limits.memory=1Gi"]);
    assert_eq!(c["resources"]["limits"]["memory"], "1Gi");
    let out = helm(&["template", "x", CHART, "--set", "sandbox.memory=lots"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    // values.schema.json refuses it first, naming the value.
    assert!(
        err.contains("/sandbox/memory") && err.contains("'lots' does not match"),
        "{err}"
    );
}

/// The chart explains itself: a value it does not know, or of the wrong type, fails `helm lint`
/// and `helm install` (values.schema.json); its README is what helm-docs writes from the values'
/// comments; names and security contexts can be overridden; `helm test` asks /readyz with a
/// command the host takes.
#[test]
fn the_chart_refuses_unknown_values_and_documents_the_known_ones() {
    for (set, says) in [
        ("replicass=2", "replicass"),
        ("image.pullPolicy=Sometimes", "pullPolicy"),
        ("sandbox.timeout=soon", "timeout"),
        ("metrics.serviceMonitor.intervall=1m", "intervall"),
        ("policy.podSecurity=strict", "podSecurity"),
        ("sharding.by=uid", "by"),
    ] {
        for command in [
            vec!["lint", "--strict", CHART, "--set", set],
            vec!["template", "x", CHART, "--set", set],
        ] {
            let out = helm(&command);
            let err = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(!out.status.success(), "helm {command:?} passed: {err}");
            assert!(err.contains(says), "helm {command:?}: {err}");
        }
    }

    // Two replicas, three shards: one replica would hold more than its share. (`helm lint`
    // does not run the templates' checks.)
    let out = helm(&["template", "x", CHART, "--set", "sharding.shards=3"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("more than replicas"),
        "helm template with 3 shards and 2 replicas: {err}"
    );

    // The README, as helm-docs writes it from values.yaml now.
    let helm_docs = testenv::helm_docs().unwrap_or_else(|e| panic!("helm-docs: {e}"));
    let out = Command::new(helm_docs)
        .args([
            "--chart-search-root",
            "wasm-operator",
            "--dry-run",
            "--log-level",
            "warning",
        ])
        .current_dir(root().join("charts"))
        .output()
        .expect("helm-docs runs");
    assert!(out.status.success(), "{out:?}");
    let written = String::from_utf8_lossy(&out.stdout);
    let committed = std::fs::read_to_string(root().join(CHART).join("README.md")).unwrap();
    assert!(
        written.trim() == committed.trim(),
        "charts/wasm-operator/README.md is stale: run scripts/generate"
    );
    // Every value is in it, with its comment.
    for value in [
        "| replicas |",
        "| sandbox.callsInFlight |",
        "| podSecurityContext |",
        "| pluginSignatures.policy |",
        "| metrics.secure |",
    ] {
        assert!(committed.contains(value), "{value} is not in the README");
    }
    // Each described whole: helm-docs starts a description again at a comment line that
    // begins with `--`, which leaves the first lines out.
    for row in committed
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| Key"))
    {
        let description = row
            .trim_end_matches('|')
            .rsplit(" | ")
            .next()
            .unwrap_or_default();
        assert!(
            description
                .trim()
                .chars()
                .next()
                .is_some_and(char::is_uppercase),
            "a value's description is cut short in the README: {row}"
        );
    }

    // Names: fullnameOverride names everything; nameOverride the name label and the full name.
    let named = deployment(&documents(&template(&["fullnameOverride=ops"])));
    assert_eq!(named["metadata"]["name"], "ops");
    let named = deployment(&documents(&template(&["nameOverride=reconciler"])));
    assert_eq!(named["metadata"]["name"], "wasm-operator-reconciler");
    assert_eq!(
        named["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"],
        "reconciler"
    );

    // Restricted by default; OpenShift drops the user and group, the rest stays.
    let docs = documents(&template(&[]));
    let pod = &deployment(&docs)["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
    assert_eq!(
        pod["containers"][0]["securityContext"]["capabilities"]["drop"][0],
        "ALL"
    );
    let docs = documents(&template(&[
        "podSecurityContext.runAsUser=null",
        "podSecurityContext.runAsGroup=null",
    ]));
    let context = &deployment(&docs)["spec"]["template"]["spec"]["securityContext"];
    assert!(context.get("runAsUser").is_none() && context.get("runAsGroup").is_none());
    assert_eq!(context["runAsNonRoot"], true);

    // `helm test`: a pod of the operator's own image that asks /readyz through the Service.
    let docs = documents(&template(&[]));
    let test = docs
        .iter()
        .find(|d| d["metadata"]["annotations"]["helm.sh/hook"] == "test")
        .expect("a helm test hook");
    let args: Vec<&str> = test["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(
        args,
        [
            "probe",
            "http://wasm-operator-metrics.wasm-operator.svc:8081/readyz"
        ]
    );
    let service = docs
        .iter()
        .find(|d| d["kind"] == "Service")
        .expect("the metrics Service");
    assert_eq!(service["metadata"]["name"], "wasm-operator-metrics");
    use clap::Parser;
    host::cli::Cli::try_parse_from(std::iter::once("host").chain(args.iter().copied()))
        .unwrap_or_else(|e| panic!("host does not take {args:?}: {e}"));
}

#[test]
fn deploy_is_the_chart_rendered() {
    let committed = std::fs::read_to_string(root().join("deploy/wasm-operator.yaml")).unwrap();
    let body: String = committed
        .lines()
        .skip_while(|l| l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    // Without the `helm test` hook: kubectl would create it as a Pod of its own.
    let rendered = helm_ok(&[
        "template",
        "wasm-operator",
        CHART,
        "--namespace",
        "wasm-operator",
        "--set",
        "namespace.create=true",
        "--skip-tests",
    ]);
    assert!(!rendered.contains("helm.sh/hook"), "{rendered}");
    assert!(
        body == rendered,
        "deploy/wasm-operator.yaml is stale: run scripts/generate"
    );
}

/// How API Priority and Fairness classified a GET of `path` made as `user` (impersonated):
/// the FlowSchema and the priority level its response names (`X-Kubernetes-PF-FlowSchema-UID`,
/// `X-Kubernetes-PF-PriorityLevel-UID`), by name. `--raw`: the one request, no discovery before
/// it.
fn classified(cp: &ControlPlane, user: &str, path: &str) -> (String, String) {
    let args = ["--as", user, "-v=8", "get", "--raw", path];
    let (ok, out) = kubectl(cp, &args);
    assert!(ok, "kubectl {args:?}: {out}");
    let header = |name: &str| {
        out.lines()
            .find_map(|l| Some(l.split_once(name)?.1.trim().to_owned()))
            .unwrap_or_else(|| panic!("no {name} in the response to {args:?}: {out}"))
    };
    let name_of = |kind: &str, uid: String| {
        let all = kubectl_ok(cp, &["get", kind, "-o", "json"]);
        let all: Value = serde_json::from_str(&all).expect(kind);
        all["items"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|o| o["metadata"]["uid"] == uid.as_str())
            .and_then(|o| o["metadata"]["name"].as_str())
            .unwrap_or_else(|| panic!("no {kind} has the uid {uid}: {all}"))
            .to_owned()
    };
    (
        name_of("flowschemas", header("X-Kubernetes-Pf-Flowschema-Uid:")),
        name_of(
            "prioritylevelconfigurations",
            header("X-Kubernetes-Pf-Prioritylevel-Uid:"),
        ),
    )
}

fn kubectl_stdin(cp: &ControlPlane, args: &[&str], input: &str) -> (bool, String) {
    use std::io::Write as _;
    let mut child = Command::new(cp.bin_dir().join("kubectl"))
        .arg(format!("--kubeconfig={}", cp.kubeconfig().display()))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl runs");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(input.as_bytes()).expect("kubectl reads");
    drop(stdin);
    let out = child.wait_with_output().expect("kubectl ends");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn install_upgrade_and_uninstall_on_a_restricted_namespace() {
    // A control plane of its own: the chart installs cluster-scoped objects (CRDs, ClusterRole).
    let cp = ControlPlane::start().unwrap();
    let _logs = cp.logs_on_failure();
    let kubeconfig = cp.kubeconfig().display().to_string();
    let ns = "wasm-operator";
    kubectl_ok(&cp, &["create", "namespace", ns]);
    kubectl_ok(
        &cp,
        &[
            "label",
            "namespace",
            ns,
            "pod-security.kubernetes.io/enforce=restricted",
        ],
    );
    // Everything the chart renders passes the API server's strict server-side dry run, the
    // ServiceMonitor and the PrometheusRule included (their CRDs first).
    for crd in ["servicemonitors", "prometheusrules"] {
        let file = root().join(format!("tests/crds/{crd}.monitoring.coreos.com.yaml"));
        kubectl_ok(
            &cp,
            &["apply", "--server-side", "-f", &file.display().to_string()],
        );
        kubectl_ok(
            &cp,
            &[
                "wait",
                "--for=condition=Established",
                &format!("crd/{crd}.monitoring.coreos.com"),
                "--timeout=60s",
            ],
        );
    }
    // The namespace the second variant watches: its RoleBinding goes there.
    kubectl_ok(&cp, &["create", "namespace", "watched"]);
    for sets in [
        &[
            "metrics.serviceMonitor.enabled=true",
            "metrics.prometheusRule.enabled=true",
            "metrics.dashboard.enabled=true",
        ][..],
        &[
            "metrics.serviceMonitor.enabled=true",
            "metrics.certSecret=metrics-tls",
        ][..],
        &[
            "metrics.secure=false",
            "metrics.serviceMonitor.enabled=true",
        ][..],
        &[
            "watchNamespaces={watched}",
            "plugins.files={/plugins/site.wasm,oci://registry.example.com/site@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef}",
            "plugins.registry.configSecret=registry-login",
            "plugins.registry.caConfigMap=registry-ca",
            "pluginResources.enabled=true",
            "pluginSignatures.policy.rules[0].repositories[0]=registry.example.com/**",
            "pluginSignatures.policy.rules[0].keys[0].file=signing/cosign.pub",
            "pluginSignatures.secrets={signing}",
            "replicas=1",
            "leaderElection.enabled=false",
            "podDisruptionBudget.enabled=false",
            "metrics.service.enabled=false",
        ],
    ] {
        let (ok, out) = kubectl_stdin(
            &cp,
            &[
                "apply",
                "--server-side",
                "--dry-run=server",
                "--validate=strict",
                "-f",
                "-",
            ],
            &template(sets),
        );
        assert!(
            ok,
            "strict server-side dry run of the chart with {sets:?}: {out}"
        );
    }

    // Install: the CRDs are Established and the operator's pods are admitted under `restricted`,
    // scheduled and (kwok) running.
    let notes = helm_ok(&[
        "install",
        "wasm-operator",
        CHART,
        "--namespace",
        ns,
        "--kubeconfig",
        &kubeconfig,
        "--wait",
        "--timeout",
        "3m",
    ]);
    // NOTES.txt: what was installed and how to see it working.
    for says in [
        "as deployment/wasm-operator",
        "2 replica(s), one leading",
        &format!("kubectl -n {ns} rollout status deployment/wasm-operator"),
        &format!("helm test wasm-operator -n {ns}"),
    ] {
        assert!(notes.contains(says), "no {says:?} in the notes: {notes}");
    }
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
    kubectl_ok(
        &cp,
        &[
            "wait",
            "-n",
            ns,
            "--for=condition=Available",
            "deployment/wasm-operator",
            "--timeout=120s",
        ],
    );
    let pods = get(
        &cp, ns, "pods", // every pod in the namespace is the operator's
    )
    .expect("pods");
    let pods = pods["items"].as_array().expect("items");
    assert_eq!(pods.len(), 2, "two replicas");
    for pod in pods {
        assert!(pod["spec"]["nodeName"].is_string(), "scheduled: {pod}");
    }
    let (ok, out) = kubectl(&cp, &["create", "namespace", "app"]);
    assert!(ok, "{out}");

    // API Priority and Fairness, as the API server classifies the operator's requests: those on
    // its Leases in `leader-election` (the chart's FlowSchema), the rest in `workload-low` (a
    // ServiceAccount's); the chart's FlowSchema off, the Leases' too.
    let operator = format!("system:serviceaccount:{ns}:wasm-operator");
    let leases = format!("/apis/coordination.k8s.io/v1/namespaces/{ns}/leases");
    assert_eq!(
        classified(&cp, &operator, &leases),
        (
            "wasm-operator-leader-election".to_owned(),
            "leader-election".to_owned()
        )
    );
    assert_eq!(
        classified(&cp, &operator, "/apis/hanzo.ai/v1/namespaces/app/services"),
        ("service-accounts".to_owned(), "workload-low".to_owned())
    );

    // A user's resource, created while the chart is installed.
    apply(&cp, "app", WEB);

    // Upgrade changes values: one replica, text logs, and the CRDs change with the release (here
    // their keep annotation goes, then comes back): Helm's crds/ folder would never upgrade them.
    let upgrade = |sets: &[&str]| {
        let mut args = vec![
            "upgrade",
            "wasm-operator",
            CHART,
            "--namespace",
            ns,
            "--kubeconfig",
            &kubeconfig,
            "--reuse-values",
            "--wait",
            "--timeout",
            "3m",
        ];
        for set in sets {
            args.extend(["--set", set]);
        }
        helm_ok(&args);
    };
    let keep = |crd: &str| {
        get(&cp, ns, &format!("crd/{crd}")).expect("the CRD")["metadata"]["annotations"]
            ["helm.sh/resource-policy"]
            .clone()
    };
    upgrade(&[
        "replicas=1",
        "logFormat=text",
        "crds.keep=false",
        "leaderElection.flowSchema=false",
    ]);
    // The API server drops a deleted FlowSchema from its configuration shortly after.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let now = classified(&cp, &operator, &leases);
        if now == ("service-accounts".to_owned(), "workload-low".to_owned()) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the Leases' requests still classified {now:?} 30 s after the FlowSchema went"
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    let deployment = get(&cp, ns, "deployment/wasm-operator").expect("deployment");
    assert_eq!(deployment["spec"]["replicas"], 1);
    let args = deployment["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(args.contains("--log-format=text"), "{args}");
    assert_eq!(
        keep("services.hanzo.ai"),
        Value::Null,
        "the CRD was not upgraded"
    );
    upgrade(&["crds.keep=true"]);
    assert_eq!(
        keep("services.hanzo.ai"),
        "keep",
        "the CRD was not upgraded"
    );
    let deployment = get(&cp, ns, "deployment/wasm-operator").expect("deployment");
    assert_eq!(
        deployment["spec"]["replicas"], 1,
        "--reuse-values kept the first upgrade"
    );

    // Uninstall: the operator goes; its CRDs and the user's resource stay.
    helm_ok(&[
        "uninstall",
        "wasm-operator",
        "--namespace",
        ns,
        "--kubeconfig",
        &kubeconfig,
        "--wait",
        "--timeout",
        "3m",
    ]);
    assert!(get(&cp, ns, "deployment/wasm-operator").is_none());
    assert!(get(&cp, ns, "clusterrole/wasm-operator").is_none());
    let crds = kubectl_ok(&cp, &["get", "crd", "-o", "name"]);
    for crd in [
        "services.hanzo.ai",
        "datastores.hanzo.ai",
        "kvclusters.storage.mydatabase.io",
    ] {
        assert!(crds.contains(crd), "{crd} was deleted: {crds}");
    }
    assert!(
        get(&cp, "app", "services.hanzo.ai/web").is_some(),
        "the user's Service was deleted"
    );
}
