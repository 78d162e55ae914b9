//! The `host` command as a user runs it: output, exit codes, messages.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use crate::support::root;

fn host(args: &[&str], stdin: Option<&str>) -> Output {
    let cache = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache");
    let mut child = Command::new(env!("CARGO_BIN_EXE_host"))
        .args(args)
        .current_dir(root())
        .env("WASM_OPERATOR_CACHE", cache)
        .env("NO_COLOR", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("host runs");
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    drop(input);
    child.wait_with_output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn renders_the_examples_with_no_plugin_flag() {
    let out = host(&["render", "examples/"], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    // Everything a Service can become, and the Datastore's and KVCluster's workloads.
    for kind in [
        "Deployment",
        "Service",
        "Ingress",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
        "NetworkPolicy",
        "ServiceMonitor",
        "KMSSecret",
        "StatefulSet",
    ] {
        assert!(
            stdout.contains(&format!("\nkind: {kind}\n")),
            "{kind} missing from:\n{stdout}"
        );
    }
    assert_eq!(
        stdout.matches("\n---\n").count() + 1,
        15,
        "fifteen objects:\n{stdout}"
    );
}

/// A backup enabled without its S3 target renders the database, leaves the backup out, and says
/// so on stderr, naming the file, the resource and the fields (contract 1.1 warnings).
#[test]
fn an_incomplete_optional_feature_renders_the_rest_with_a_warning() {
    let db = "apiVersion: hanzo.ai/v1alpha1\nkind: HanzoDatastore\nmetadata: {name: db, namespace: prod}\nspec:\n  type: postgresql\n  image: {repository: postgres, tag: '16'}\n  storage: {size: 10Gi}\n  credentialsSecret: db-creds\n  backup: {enabled: true, schedule: '0 3 * * *', retentionDays: 7}\n";
    let out = host(&["render", "-"], Some(db));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("kind: StatefulSet"), "{stdout}");
    assert!(!stdout.contains("kind: CronJob"), "{stdout}");
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("warning: <stdin>: document 1 (HanzoDatastore/db): spec.backup: is enabled but spec.backup.s3Endpoint, spec.backup.s3Bucket, spec.backup.s3CredentialsSecret are not set"),
        "{stderr}"
    );
    // Present and invalid is still an error.
    let out = host(
        &["render", "-"],
        Some(&db.replace(
            "schedule: '0 3 * * *'",
            "schedule: 'nightly', s3Endpoint: e, s3Bucket: b, s3CredentialsSecret: s",
        )),
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("spec.backup.schedule"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn reads_stdin_and_writes_a_json_list() {
    let yaml = std::fs::read_to_string(root().join("examples/service.yaml")).unwrap();
    let out = host(&["render", "-o", "json", "-"], Some(&yaml));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(list["kind"], "List");
    assert_eq!(list["items"].as_array().unwrap().len(), 10);
}

#[test]
fn a_bad_resource_exits_1_naming_file_document_resource_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("crs.yaml");
    std::fs::write(
        &file,
        "apiVersion: hanzo.ai/v1\nkind: Service\nmetadata: {name: ok}\nspec: {image: {repository: x}}\n---\n\
         apiVersion: hanzo.ai/v1\nkind: Datastore\nmetadata: {name: db}\nspec:\n  image: {repository: x}\n  storage: {size: fifty}\n",
    )
    .unwrap();
    let path = file.display().to_string();
    let out = host(&["render", &path], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        out.stdout.is_empty(),
        "nothing is printed when a resource fails"
    );
    let stderr = text(&out.stderr);
    let expected = format!(
        "{path}: document 2 (Datastore/db): plugin datastore: spec.storage.size: `fifty` is not a quantity"
    );
    assert!(stderr.contains(&expected), "{stderr}");
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(host(&[], None).status.code(), Some(2));
    assert_eq!(host(&["render"], None).status.code(), Some(2));
    assert_eq!(
        host(&["render", "--frobnicate", "x.yaml"], None)
            .status
            .code(),
        Some(2)
    );
    let out = host(&["render", "no/such/file.yaml"], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("cannot read no/such/file.yaml"),
        "{}",
        text(&out.stderr)
    );
    let out = host(
        &["render", "--plugin", "examples/service.yaml", "examples/"],
        None,
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("plugin examples/service.yaml: not a WebAssembly component"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_plugin_flag_adds_kinds() {
    let cr = "apiVersion: test.wasm-operator.dev/v1\nkind: Hostile\nmetadata: {name: h}\nspec: {mode: ok}\n";
    let out = host(&["render", "--plugin", test_guests::HOSTILE, "-"], Some(cr));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("kind: ConfigMap"));
    let out = host(
        &[
            "render",
            "--plugin",
            test_guests::HOSTILE,
            "--plugin-timeout",
            "100ms",
            "-",
        ],
        Some(&cr.replace("ok", "loop")),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("(Hostile/h): plugin hostile: ran past its deadline of 100ms"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn crds_print_for_another_group() {
    let out = host(&["crds", "--api-group", "lux.cloud"], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("name: services.lux.cloud"));
    assert!(stdout.contains("name: kvclusters.storage.mydatabase.io"));
    assert!(!stdout.contains("hanzo.ai"), "no hanzo.ai group left");
}

/// `host --version`: the host, the wasmtime it embeds, the contract it speaks, and the digest of
/// each built-in plugin, the same digest the operator writes into each resource's status.
#[test]
fn version_names_the_engine_the_contract_and_each_builtin_digest() {
    use sha2::Digest;
    let out = host(&["--version"], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let printed = text(&out.stdout);
    let lines: Vec<&str> = printed.lines().collect();
    assert_eq!(
        lines.first().copied(),
        Some(format!("host {}", env!("CARGO_PKG_VERSION")).as_str()),
        "{printed}"
    );
    assert!(
        lines.iter().any(|l| l.starts_with("wasmtime 48.")),
        "{printed}"
    );
    let wit = std::fs::read_to_string(root().join("wit/plugin.wit")).unwrap();
    let package = wit
        .lines()
        .find_map(|l| l.trim().strip_prefix("package "))
        .unwrap()
        .trim_end_matches(';');
    assert!(
        lines.contains(&format!("contract {package}").as_str()),
        "{printed}"
    );
    for plugin in host::plugin::BUILTINS {
        let digest = sha2::Sha256::digest(plugin.wasm)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>();
        assert!(
            lines.contains(&format!("built-in plugin {} sha256:{digest}", plugin.name).as_str()),
            "{printed}"
        );
    }
}

/// The chart's `files/rbac.yaml` is `host rbac` for the built-in plugins: regenerate it when they
/// change (scripts/generate).
#[test]
fn the_charts_rbac_is_what_host_rbac_prints() {
    // With the rules for Plugin resources, which the chart grants when they are on.
    let out = host(&["rbac", "--plugin-resources"], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let committed =
        std::fs::read_to_string(root().join("charts/wasm-operator/files/rbac.yaml")).unwrap();
    assert!(
        committed == text(&out.stdout),
        "charts/wasm-operator/files/rbac.yaml is stale: run scripts/generate"
    );
    assert!(!committed.contains('*'), "a wildcard in:\n{committed}");
}

/// `host render --observed`: the status the operator would write, from children as a cluster
/// reports them: each judged ready as the operator judges it, and a 1.1 plugin's own fields
/// (the KVCluster's `readyNodes`) from them.
#[test]
fn render_with_observed_children_prints_the_status_the_operator_would_write() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let example = crate::support::root().join("examples/kvcluster.yaml");
    let observed = |ready: u32, service: bool| {
        let mut text = format!(
            "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {{name: my-raft-db, namespace: default, generation: 2}}\n\
             spec: {{replicas: 3}}\nstatus: {{observedGeneration: 2, replicas: 3, readyReplicas: {ready}, updatedReplicas: 3}}\n"
        );
        if service {
            text.push_str("---\napiVersion: v1\nkind: Service\nmetadata: {name: my-raft-db-service, namespace: default}\nspec: {clusterIP: None}\n");
        }
        let path = dir.join(format!("observed-{ready}-{service}.yaml"));
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let status = |observed: &str| -> serde_json::Value {
        let out = crate::support::host_in(
            dir,
            &[
                "render",
                "--observed",
                observed,
                &example.display().to_string(),
            ],
        );
        let text = crate::support::succeeded("host render --observed", out);
        let docs = host::documents::values(&text).unwrap();
        assert_eq!(
            docs[0]["kind"], "KVCluster",
            "the resource comes first: {text}"
        );
        assert_eq!(docs.len(), 3, "then its children: {text}");
        docs[0]["status"].clone()
    };
    let ready = |s: &serde_json::Value| {
        s["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Ready")
            .cloned()
            .unwrap()
    };

    let all = status(&observed(3, true));
    assert_eq!(ready(&all)["status"], "True", "{all:#}");
    assert_eq!(all["readyNodes"], 3, "the plugin's own field: {all:#}");
    assert_eq!(all["children"][0]["message"], "3/3 ready", "{all:#}");

    let two = status(&observed(2, true));
    assert_eq!(ready(&two)["reason"], "Progressing", "{two:#}");
    assert_eq!(two["readyNodes"], 2, "{two:#}");
    assert!(
        ready(&two)["message"]
            .as_str()
            .unwrap()
            .contains("StatefulSet my-raft-db: 2/3 ready"),
        "{two:#}"
    );

    // A child not given counts as the operator counts it once applied: a kind without a
    // readiness rule (the Service) exists; one with a rule (the StatefulSet) is not ready.
    let no_service = status(&observed(3, false));
    assert_eq!(ready(&no_service)["status"], "True", "{no_service:#}");
    assert!(
        no_service["children"][1]["message"]
            .as_str()
            .unwrap()
            .starts_with("exists (not observed"),
        "{no_service:#}"
    );
    let service_only = dir.join("service-only.yaml");
    std::fs::write(
        &service_only,
        "apiVersion: v1\nkind: Service\nmetadata: {name: my-raft-db-service, namespace: default}\nspec: {clusterIP: None}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: my-raft-db-svc, namespace: default}\n",
    )
    .unwrap();
    let out = crate::support::host_in(
        dir,
        &[
            "render",
            "--observed",
            &service_only.display().to_string(),
            &example.display().to_string(),
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let text = crate::support::succeeded("host render --observed", out);
    let missing = host::documents::values(&text).unwrap()[0]["status"].clone();
    assert_eq!(ready(&missing)["status"], "False", "{missing:#}");
    assert!(
        ready(&missing)["message"]
            .as_str()
            .unwrap()
            .contains("StatefulSet my-raft-db: not observed"),
        "{missing:#}"
    );
    // An observed object that is no child (a name that differs) is said, not silently unused.
    assert!(
        stderr.contains("Service v1 default/my-raft-db-svc is no child rendered"),
        "{stderr}"
    );

    // An observed document that is not an object says which field it lacks, and where.
    let bad = dir.join("bad.yaml");
    std::fs::write(&bad, "apiVersion: v1\nkind: Service\nmetadata: {}\n").unwrap();
    let out = crate::support::host_in(
        dir,
        &[
            "render",
            "--observed",
            &bad.display().to_string(),
            &example.display().to_string(),
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("bad.yaml: document 1") && stderr.contains("metadata.name"),
        "{stderr}"
    );
}

/// As [`host`], with `HOME` and `KUBECONFIG` pointing at `home` (no kubeconfig unless one is
/// written there) and no in-cluster service account.
fn host_at_home(home: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_host"))
        .args(args)
        .current_dir(root())
        .env("HOME", home)
        .env("KUBECONFIG", home.join(".kube/config"))
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .env(
            "WASM_OPERATOR_CACHE",
            std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache"),
        )
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .expect("host runs")
}

/// kubectl's manners: `--kubeconfig` and `--context` where a cluster is talked to, exit 2 and
/// a message in the user's terms whenever a command cannot run, `-n` never the watched
/// namespaces, completions.
#[test]
fn a_command_that_cannot_reach_a_cluster_says_why_and_exits_2() {
    let home = tempfile::tempdir().unwrap();
    let exits_2 = |args: &[&str], says: &str| {
        let out = host_at_home(home.path(), args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "host {args:?}: {stderr}");
        assert!(stderr.contains(says), "host {args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "host {args:?}: output on a failure");
    };
    // No kubeconfig anywhere, and not in a cluster.
    exits_2(&["run"], "no usable kubeconfig");
    exits_2(&["diff", "examples/service.yaml"], "no usable kubeconfig");
    // A kubeconfig that is not there, a context it does not have.
    exits_2(
        &[
            "diff",
            "--kubeconfig",
            "/nonexistent/config",
            "examples/service.yaml",
        ],
        "/nonexistent/config",
    );
    // A cluster that does not answer: said with its address.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let kubeconfig = home.path().join("k.yaml");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: 'https://127.0.0.1:{port}', insecure-skip-tls-verify: true}}\nusers:\n- name: u\n  user: {{token: t}}\ncontexts:\n- name: here\n  context: {{cluster: c, user: u}}\ncurrent-context: here\n"
        ),
    )
    .unwrap();
    let kubeconfig = kubeconfig.display().to_string();
    exits_2(
        &[
            "diff",
            "--kubeconfig",
            &kubeconfig,
            "--context",
            "elsewhere",
            "examples/service.yaml",
        ],
        "elsewhere",
    );
    exits_2(
        &["diff", "--kubeconfig", &kubeconfig, "examples/service.yaml"],
        &format!("cannot reach the cluster at https://127.0.0.1:{port}"),
    );
    exits_2(
        &[
            "run",
            "--kubeconfig",
            &kubeconfig,
            "--context",
            "here",
            "--leader-elect=false",
        ],
        &format!("cannot reach the cluster at https://127.0.0.1:{port}"),
    );
    // -n is never the namespaces to watch.
    exits_2(&["run", "-n", "app"], "--watch-namespace app");
    // A probe that gets no answer.
    exits_2(
        &[
            "probe",
            "--timeout",
            "2s",
            &format!("http://127.0.0.1:{port}/readyz"),
        ],
        "no answer",
    );
}

#[test]
fn every_problem_of_a_spec_is_said_at_once() {
    let out = host(
        &["render", "-"],
        Some(
            "apiVersion: hanzo.ai/v1\nkind: Service\nmetadata: {name: web, namespace: ns}\nspec:\n  image: {pullPolicy: Sometimes}\n  replicas: many\n  replica: 1\n",
        ),
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    for field in [
        "spec.image.repository: is required",
        "spec.image.pullPolicy",
        "spec.replicas: must be an integer",
        "spec.replica: unknown field",
    ] {
        assert!(stderr.contains(field), "{field} not in: {stderr}");
    }
}

#[test]
fn completions_are_printed_for_each_shell() {
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef host"),
        ("fish", "complete -c host"),
    ] {
        let out = host(&["completion", shell], None);
        assert!(out.status.success(), "{shell}: {}", text(&out.stderr));
        let script = text(&out.stdout);
        assert!(script.contains(marker), "{shell}: {script}");
        // Subcommands and their own flags are offered.
        for word in [
            "watch-namespace",
            "kubeconfig",
            "plugin-signatures",
            "observed",
        ] {
            assert!(script.contains(word), "{shell}: no {word}");
        }
    }
}
