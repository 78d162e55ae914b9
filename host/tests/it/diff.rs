//! `host diff` on the real control plane: resources reconciled by the operator, then changed
//! in files, previewed by the API server's own server-side apply dry run.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::support::cluster::{Operator, apply, cluster, get, install_crds, wait_ready};

/// `host diff ARGS` against the control plane: its exit code, stdout and stderr.
fn host_diff(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
    use std::io::Write as _;
    let mut child = Command::new(env!("CARGO_BIN_EXE_host"))
        .arg("diff")
        .args(args)
        .current_dir(crate::support::root())
        .env("KUBECONFIG", kubeconfig)
        .env(
            "WASM_OPERATOR_CACHE",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache"),
        )
        .env("NO_COLOR", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    drop(input);
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The lines of a diff that change something (not its headers).
fn changed_lines(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| {
            (l.starts_with('-') || l.starts_with('+'))
                && !l.starts_with("---")
                && !l.starts_with("+++")
        })
        .map(str::to_owned)
        .collect()
}

const SERVICE: &str = "apiVersion: hanzo.ai/v1
kind: Service
metadata: {name: web, namespace: NS}
spec:
  image: {repository: nginx, tag: '1.27'}
  replicas: 2
  ports: [{name: http, containerPort: 8080}]
  ingress: {enabled: true, hosts: [web.example.com]}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diff_previews_changes_prunes_creations_and_a_plugin_upgrade() {
    let cp = cluster();
    let _logs = cp.logs_on_failure();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "diff").await.unwrap();
    let kubeconfig = cp.kubeconfig().to_path_buf();
    let service = SERVICE.replace("NS", &ns);
    let file = |text: &str| {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), text).unwrap();
        f
    };
    install_crds(cp, test_guests::HOSTILE);
    let op = Operator::start(cp, &ns, "hanzo.ai", &[PathBuf::from(test_guests::HOSTILE)]).await;
    apply(cp, &ns, &service);
    wait_ready(cp, &ns, "services.hanzo.ai/web");
    let hostile = |name: &str| {
        format!(
            "apiVersion: test.wasm-operator.dev/v1\nkind: Hostile\nmetadata: {{name: {name}}}\nspec: {{mode: ok}}\n"
        )
    };
    apply(cp, &ns, &hostile("h1"));
    apply(cp, &ns, &hostile("h2"));
    wait_ready(cp, &ns, "hostiles.test.wasm-operator.dev/h1");
    wait_ready(cp, &ns, "hostiles.test.wasm-operator.dev/h2");
    // The preview must not race the operator's own writes.
    op.stop().await;

    // Unchanged: nothing to show, exit 0.
    let unchanged = file(&service);
    let path = unchanged.path().display().to_string();
    let (code, out, err) = host_diff(&kubeconfig, &[&path], None);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.ends_with("0 to create, 0 to change, 0 to delete\n"),
        "{out}"
    );

    // Another replica count: one field of the Deployment, nothing else.
    let scaled = file(&service.replace("replicas: 2", "replicas: 3"));
    let path = scaled.path().display().to_string();
    let (code, out, err) = host_diff(&kubeconfig, &[&path], None);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains(&format!("# Deployment {ns}/web (Service/web): changed")),
        "{out}"
    );
    assert_eq!(
        changed_lines(&out),
        vec!["-  replicas: 2", "+  replicas: 3"],
        "{out}"
    );
    assert!(
        out.ends_with("0 to create, 1 to change, 0 to delete\n"),
        "{out}"
    );

    // Ingress off: the Ingress is what the operator would prune.
    let no_ingress = file(&service.replace(
        "ingress: {enabled: true, hosts: [web.example.com]}",
        "ingress: {enabled: false}",
    ));
    let path = no_ingress.path().display().to_string();
    let (code, out, err) = host_diff(&kubeconfig, &["-o", "json", &path], None);
    assert_eq!(code, 1, "{out}{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    let deleted: Vec<&Value> = report["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "delete")
        .collect();
    assert_eq!(deleted.len(), 1, "{report:#}");
    assert_eq!(deleted[0]["kind"], "Ingress", "{report:#}");
    assert_eq!(deleted[0]["name"], "web", "{report:#}");
    assert_eq!(report["summary"]["delete"], 1, "{report:#}");
    assert!(
        get(cp, &ns, "ingress/web").is_some(),
        "the preview deleted it"
    );

    // Not created yet: everything is created, read from stdin.
    let new = service.replace("name: web,", "name: fresh,");
    let (code, out, err) = host_diff(&kubeconfig, &["-"], Some(&new));
    assert_eq!(code, 1, "{out}{err}");
    for kind in ["Deployment", "Service", "Ingress"] {
        assert!(
            out.contains(&format!("# {kind} {ns}/fresh (Service/fresh): created")),
            "{out}"
        );
    }
    assert!(out.contains("+kind: Deployment"), "{out}");
    assert!(
        get(cp, &ns, "deployment/fresh").is_none(),
        "the preview created it"
    );

    // An invalid spec is an error (exit 2), saying which resource.
    let bad = file(&service.replace("replicas: 2", "replicas: many"));
    let path = bad.path().display().to_string();
    let (code, out, err) = host_diff(&kubeconfig, &[&path], None);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        out.contains("Service/web") && out.contains("spec.replicas"),
        "{out}{err}"
    );

    // A new version of a plugin, previewed over every resource of its Kinds.
    let (code, out, err) = host_diff(
        &kubeconfig,
        &[
            "--all",
            "-n",
            &ns,
            "--plugin",
            test_guests::HOSTILE_NEXT,
            "-o",
            "json",
        ],
        None,
    );
    assert_eq!(code, 1, "{out}{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    let changed: Vec<String> = report["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "change")
        .map(|e| {
            format!(
                "{} {}",
                e["owner"].as_str().unwrap(),
                e["kind"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        changed,
        vec!["Hostile/h1 ConfigMap", "Hostile/h2 ConfigMap"],
        "{report:#}"
    );
    let diff = report["entries"][0]["diff"].as_str().unwrap();
    assert!(diff.contains("+  version: next"), "{diff}");
    assert_eq!(report["summary"]["change"], 2, "{report:#}");
}
