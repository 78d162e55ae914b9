//! A tenant whose only rights are over `services.hanzo.ai` in its namespace, as a platform team
//! grants them: through the operator it gets nothing it could not make itself. Pods are held to
//! the namespace's Pod Security level (or the operator's default), nothing is named outside the
//! namespace, and the platform's own objects are never adopted on the tenant's word.

use std::time::Duration;

use testenv::ControlPlane;

use crate::judge::cluster;
use crate::operator::{
    Operator, condition, get, kubectl, kubectl_ok, settings, wait_ready, wait_reason,
};

/// A ServiceAccount `tenant` in `ns` that may do anything with `services.hanzo.ai` there, and
/// nothing else; its name for `kubectl --as`.
fn tenant(cp: &ControlPlane, ns: &str) -> String {
    let yaml = format!(
        "apiVersion: v1
kind: ServiceAccount
metadata: {{ name: tenant, namespace: {ns} }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{ name: tenant, namespace: {ns} }}
rules:
- apiGroups: [hanzo.ai]
  resources: [services]
  verbs: [get, list, watch, create, update, patch, delete]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{ name: tenant, namespace: {ns} }}
roleRef: {{ apiGroup: rbac.authorization.k8s.io, kind: Role, name: tenant }}
subjects: [{{ kind: ServiceAccount, name: tenant, namespace: {ns} }}]
"
    );
    crate::operator::apply(cp, ns, &yaml);
    format!("system:serviceaccount:{ns}:tenant")
}

/// `kubectl apply` as `user`.
fn apply_as(cp: &ControlPlane, user: &str, ns: &str, yaml: &str) {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), yaml).unwrap();
    kubectl_ok(
        cp,
        &[
            "apply",
            "--as",
            user,
            "-n",
            ns,
            "-f",
            &file.path().display().to_string(),
        ],
    );
}

/// A Service that asks for everything a tenant must not get: privileged containers, the node's
/// root filesystem, every taint tolerated.
const PRIVILEGED: &str = "apiVersion: hanzo.ai/v1
kind: Service
metadata: { name: NAME }
spec:
  image: { repository: ghcr.io/hanzoai/web, tag: v1 }
  ports: [{ name: http, containerPort: 8080 }]
  containerSecurityContext: { privileged: true }
  volumes: [{ name: root, hostPath: { path: / } }]
  volumeMounts: [{ name: root, mountPath: /host }]
  sidecars: [{ name: helper, image: busybox, securityContext: { privileged: true } }]
  tolerations: [{ operator: Exists }]
";

/// A Service with nothing a baseline namespace refuses.
const PLAIN: &str = "apiVersion: hanzo.ai/v1
kind: Service
metadata: { name: NAME }
spec:
  image: { repository: ghcr.io/hanzoai/web, tag: v1 }
  ports: [{ name: http, containerPort: 8080 }]
";

fn named(yaml: &str, name: &str) -> String {
    yaml.replace("NAME", name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_gets_no_pod_its_namespace_would_refuse_and_nothing_outside_it() {
    let cp = cluster();
    let _logs = cp.logs_on_failure();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "tenant").await.unwrap();
    let privileged_ns = cp.namespace(&client, "tenant-priv").await.unwrap();
    let restricted_ns = cp.namespace(&client, "tenant-restr").await.unwrap();
    for (namespace, level) in [
        (&privileged_ns, "privileged"),
        (&restricted_ns, "restricted"),
    ] {
        kubectl_ok(
            cp,
            &[
                "label",
                "namespace",
                namespace,
                &format!("pod-security.kubernetes.io/enforce={level}"),
            ],
        );
    }
    let user = tenant(cp, &ns);
    let privileged_user = tenant(cp, &privileged_ns);
    let restricted_user = tenant(cp, &restricted_ns);
    // What the tenant cannot do itself.
    for verb in ["create deployments", "get secrets", "create ingresses"] {
        let mut args = vec!["auth", "can-i"];
        args.extend(verb.split(' '));
        args.extend(["--as", &user, "-n", &ns]);
        let (_, said) = kubectl(cp, &args);
        assert_eq!(said.trim(), "no", "the tenant may {verb}");
    }
    let watched = vec![ns.clone(), privileged_ns.clone(), restricted_ns.clone()];
    let op = Operator::start_settings(
        client.clone(),
        "hanzo.ai",
        &[],
        settings(watched, &ns, &format!("test-{ns}")),
    )
    .await;

    // In a namespace with no Pod Security label, the operator's default (baseline) holds.
    apply_as(cp, &user, &ns, &named(PRIVILEGED, "evil"));
    let evil = wait_reason(cp, &ns, "services.hanzo.ai/evil", "PodSecurity").await;
    let (_, _, message) = condition(&evil, "Ready");
    for said in [
        "Deployment evil violates PodSecurity \"baseline:latest\"",
        "privileged (containers \"evil\", \"helper\" must not set securityContext.privileged=true)",
        "hostPath volumes (volume \"root\")",
    ] {
        assert!(message.contains(said), "{said} not in: {message}");
    }
    assert_eq!(condition(&evil, "Stalled").0, "True", "{evil}");
    // Nothing of it is applied: not the Deployment, not its harmless Service either.
    assert!(get(cp, &ns, "deployment/evil").is_none());
    assert!(get(cp, &ns, "service/evil").is_none());
    let (_, events) = kubectl(cp, &["get", "events", "-n", &ns]);
    assert!(events.contains("PodSecurity"), "{events}");

    // The tenant takes the privileges out: it is applied.
    apply_as(cp, &user, &ns, &named(PLAIN, "evil"));
    wait_ready(cp, &ns, "services.hanzo.ai/evil");

    // A namespace that enforces privileged lets the same resource be.
    apply_as(
        cp,
        &privileged_user,
        &privileged_ns,
        &named(PRIVILEGED, "evil"),
    );
    wait_ready(cp, &privileged_ns, "services.hanzo.ai/evil");
    let deployment = get(cp, &privileged_ns, "deployment/evil").unwrap();
    assert_eq!(
        deployment["spec"]["template"]["spec"]["containers"][0]["securityContext"]["privileged"],
        true
    );

    // One that enforces restricted holds even a plain Service to it, as the API server would
    // its pods.
    apply_as(cp, &restricted_user, &restricted_ns, &named(PLAIN, "plain"));
    let plain = wait_reason(cp, &restricted_ns, "services.hanzo.ai/plain", "PodSecurity").await;
    let (_, _, message) = condition(&plain, "Ready");
    assert!(
        message.contains("violates PodSecurity \"restricted:latest\"")
            && message.contains("runAsNonRoot != true"),
        "{message}"
    );
    assert!(get(cp, &restricted_ns, "deployment/plain").is_none());

    // A KMS secret whose credentials live in another namespace: refused, nothing applied.
    apply_as(
        cp,
        &user,
        &ns,
        &format!(
            "{}  kmsSecrets: [{{ managedSecretName: stolen, credentialsRef: {{ name: machine, namespace: kube-system }} }}]\n",
            named(PLAIN, "kms")
        ),
    );
    let kms = wait_reason(cp, &ns, "services.hanzo.ai/kms", "OutsideNamespace").await;
    let (_, _, message) = condition(&kms, "Ready");
    assert!(
        message.contains("credentialsRef.secretNamespace: names namespace `kube-system`"),
        "{message}"
    );
    assert!(get(cp, &ns, "deployment/kms").is_none());
    let (_, kms_secrets) = kubectl(
        cp,
        &["get", "kmssecrets.kms.hanzo.ai", "-n", &ns, "-o", "name"],
    );
    assert!(kms_secrets.trim().is_empty(), "{kms_secrets}");

    // An Ingress with a configuration snippet and a ClusterIssuer nobody gave the operator.
    apply_as(
        cp,
        &user,
        &ns,
        &format!(
            "{}  ingress:\n    hosts: [a.example.com]\n    clusterIssuer: internal-ca\n    annotations: {{ nginx.ingress.kubernetes.io/configuration-snippet: 'more_set_headers \"x: y\";' }}\n",
            named(PLAIN, "snippet")
        ),
    );
    let snippet = wait_reason(cp, &ns, "services.hanzo.ai/snippet", "NotAllowed").await;
    let (_, _, message) = condition(&snippet, "Ready");
    assert!(
        message.contains("ClusterIssuer `internal-ca` is not one the operator may use")
            && message
                .contains("configuration-snippet]: this Ingress annotation is not passed through"),
        "{message}"
    );
    assert!(get(cp, &ns, "ingress/snippet").is_none());
    op.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_cannot_take_over_the_platforms_network_policy() {
    let cp = cluster();
    let _logs = cp.logs_on_failure();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "takeover").await.unwrap();
    let user = tenant(cp, &ns);
    // The platform's policy, made by its own tooling (no controller owns it).
    crate::operator::apply(
        cp,
        &ns,
        "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: default-deny, labels: { made-by: platform } }
spec:
  podSelector: {}
  policyTypes: [Ingress, Egress]
",
    );
    let op = Operator::start(cp, &ns, "hanzo.ai", &[]).await;
    // The tenant names its Service like the policy and asks to adopt.
    apply_as(
        cp,
        &user,
        &ns,
        &format!(
            "{}  networkPolicy: {{ enabled: true }}\n",
            named(PLAIN, "default-deny").replace(
                "metadata: { name: default-deny }",
                "metadata: { name: default-deny, annotations: { wasm-operator.dev/adopt: \"true\" } }"
            )
        ),
    );
    let taker = wait_reason(cp, &ns, "services.hanzo.ai/default-deny", "ChildConflict").await;
    let (_, _, message) = condition(&taker, "Ready");
    assert!(message.contains("NetworkPolicy default-deny"), "{message}");
    let policy = get(cp, &ns, "networkpolicy/default-deny").unwrap();
    assert!(policy["metadata"]["ownerReferences"].is_null(), "{policy}");
    assert_eq!(
        policy["spec"]["policyTypes"],
        serde_json::json!(["Ingress", "Egress"])
    );
    // Its other children are applied, and go with it; the policy stays.
    wait_for_deployment(cp, &ns, "default-deny").await;
    kubectl_ok(
        cp,
        &[
            "delete",
            "--as",
            &user,
            "-n",
            &ns,
            "services.hanzo.ai/default-deny",
        ],
    );
    crate::operator::eventually(
        "the tenant's Deployment to be collected",
        Duration::from_secs(60),
        || get(cp, &ns, "deployment/default-deny").is_none(),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let policy = get(cp, &ns, "networkpolicy/default-deny").expect("the platform's policy");
    assert_eq!(policy["metadata"]["labels"]["made-by"], "platform");
    op.stop().await;
}

async fn wait_for_deployment(cp: &ControlPlane, ns: &str, name: &str) {
    crate::operator::eventually(
        &format!("deployment {name}"),
        Duration::from_secs(30),
        || get(cp, ns, &format!("deployment/{name}")).is_some(),
    )
    .await;
}

/// What works today keeps working: every example and test fixture renders pods that the
/// operator's default, baseline, lets through, except the one fixture that mounts a node path
/// on purpose; and the built-in plugins reach nothing outside the resource's namespace unless
/// the resource names it (the full Service's KMS credentials, ClusterIssuer and host API).
#[test]
fn the_examples_and_fixtures_pass_the_default_rules() {
    use host::policy::{Level, Rules, judge};
    use std::collections::BTreeMap;

    let root = crate::support::root();
    let mut files: Vec<std::path::PathBuf> = ["service.yaml", "datastore.yaml", "kvcluster.yaml"]
        .iter()
        .map(|f| root.join("examples").join(f))
        .collect();
    files.extend(crate::support::fixtures());
    let mut refused: BTreeMap<String, Vec<&'static str>> = BTreeMap::new();
    for file in &files {
        for r in crate::support::resources(file) {
            let objects = crate::support::render(&r);
            for refusal in judge(&Rules::default(), &r.namespace, Level::Baseline, &objects) {
                refused
                    .entry(format!(
                        "{}/{}",
                        file.file_name().unwrap().to_string_lossy(),
                        r.name
                    ))
                    .or_default()
                    .push(refusal.reason);
            }
        }
    }
    let refused: Vec<String> = refused
        .into_iter()
        .map(|(what, reasons)| format!("{what}: {}", reasons.join(",")))
        .collect();
    assert_eq!(
        refused,
        [
            "service-full.yaml/api: NotAllowed,OutsideNamespace,NotAllowed",
            "service-volumes.yaml/volumes: PodSecurity",
        ],
        "which resources the default rules refuse"
    );
}
