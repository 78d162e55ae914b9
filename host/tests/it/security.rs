//! A tenant whose only rights are over `services.hanzo.ai` in its namespace, as a platform team
//! grants them: through the operator it gets nothing it could not make itself. Pods are held to
//! the namespace's Pod Security level (or the operator's default), nothing is named outside the
//! namespace, and the platform's own objects are never adopted on the tenant's word.

use std::time::Duration;

use testenv::ControlPlane;

use crate::support::cluster::{
    Operator, apply, cluster, condition, eventually, get, kubectl, kubectl_ok, settings,
    wait_collected, wait_ready, wait_reason,
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
    apply(cp, ns, &yaml);
    format!("system:serviceaccount:{ns}:tenant")
}

/// `kubectl apply` as `user`, which must succeed.
fn apply_as(cp: &ControlPlane, user: &str, ns: &str, yaml: &str) {
    let (took, out) = try_apply_as(cp, user, ns, yaml);
    assert!(took, "kubectl apply as {user}: {out}\n{yaml}");
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
    apply(
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
    eventually(
        "the tenant's Deployment to be collected",
        Duration::from_secs(60),
        || get(cp, &ns, "deployment/default-deny").is_none(),
    )
    .await;
    // The garbage collector is done with the tenant's Service: nothing names it as owner.
    wait_collected(cp, &ns, taker["metadata"]["uid"].as_str().unwrap()).await;
    let policy = get(cp, &ns, "networkpolicy/default-deny").expect("the platform's policy");
    assert_eq!(policy["metadata"]["labels"]["made-by"], "platform");
    op.stop().await;
}

async fn wait_for_deployment(cp: &ControlPlane, ns: &str, name: &str) {
    eventually(
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

/// `kubectl apply` as `user`: whether the API server took it, and what it said.
fn try_apply_as(cp: &ControlPlane, user: &str, ns: &str, yaml: &str) -> (bool, String) {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), yaml).unwrap();
    kubectl(
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
    )
}

/// The policies `host admission` prints for the built-in plugins, each binding limited to `ns`
/// (the control plane is shared with tests whose tenants make other references).
fn install_admission(cp: &ControlPlane, ns: &str) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_host"))
        .arg("admission")
        .env(
            "WASM_OPERATOR_CACHE",
            std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache"),
        )
        .output()
        .unwrap();
    let text = crate::support::succeeded("host admission", out);
    let docs = host::documents::parse("admission.yaml", &text).unwrap();
    let mut objects = Vec::new();
    for doc in docs {
        let mut o = doc.value;
        if o["kind"] == "ValidatingAdmissionPolicyBinding" {
            let name = format!("{}-{ns}", o["metadata"]["name"].as_str().unwrap());
            o["metadata"]["name"] = name.into();
            o["spec"]["matchResources"] = serde_json::json!({
                "namespaceSelector": { "matchLabels": { "kubernetes.io/metadata.name": ns } }
            });
        }
        objects.push(o);
    }
    assert!(objects.len() >= 2, "{text}");
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        file.path(),
        serde_json::to_string(&serde_json::json!({
            "apiVersion": "v1", "kind": "List", "items": objects,
        }))
        .unwrap(),
    )
    .unwrap();
    kubectl_ok(
        cp,
        &[
            "apply",
            "--server-side",
            "-f",
            &file.path().display().to_string(),
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_may_name_only_secrets_and_service_accounts_its_author_may_use() {
    let cp = cluster();
    let _logs = cp.logs_on_failure();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "refs").await.unwrap();
    let user = tenant(cp, &ns);
    let with = |name: &str, extra: &str| format!("{}{extra}", named(PLAIN, name));
    let env_from_db = "  envFrom: [{ secretRef: { name: db } }]\n";
    install_admission(cp, &ns);

    // The API server refuses a tenant's reference to a Secret it may not read (once the policy
    // is in force: it takes a moment to be loaded).
    let mut said = String::new();
    eventually(
        "the references policy to be in force",
        Duration::from_secs(60),
        || {
            let (took, out) = try_apply_as(cp, &user, &ns, &with("leak", env_from_db));
            if took {
                kubectl(
                    cp,
                    &["delete", "-n", &ns, "services.hanzo.ai/leak", "--wait"],
                );
            }
            said = out;
            !took
        },
    )
    .await;
    assert!(
        said.contains("spec.envFrom[].secretRef.name names a Secret you may not get yourself"),
        "{said}"
    );
    // Nor a ServiceAccount it may not act as, nor a Secret in a sidecar's environment.
    for (field, extra) in [
        (
            "spec.serviceAccountName",
            "  serviceAccountName: deployer\n",
        ),
        (
            "spec.sidecars[].env[].valueFrom.secretKeyRef.name",
            "  sidecars: [{ name: s, image: busybox, env: [{ name: T, valueFrom: { secretKeyRef: { name: token, key: t } } }] }]\n",
        ),
        (
            "spec.volumes[].secret.secretName",
            "  volumes: [{ name: v, secret: { secretName: tls } }]\n",
        ),
    ] {
        let (took, out) = try_apply_as(cp, &user, &ns, &with("leak", extra));
        assert!(!took && out.contains(field), "{field}: {out}");
    }
    assert!(get(cp, &ns, "services.hanzo.ai/leak").is_none());
    // What names nothing is not held up.
    apply_as(cp, &user, &ns, &named(PLAIN, "plain"));

    // Granted `get` on that one Secret, the tenant may name it, and only it.
    apply(
        cp,
        &ns,
        &format!(
            "apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{ name: read-db, namespace: {ns} }}
rules: [{{ apiGroups: [''], resources: [secrets], resourceNames: [db], verbs: [get] }}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{ name: read-db, namespace: {ns} }}
roleRef: {{ apiGroup: rbac.authorization.k8s.io, kind: Role, name: read-db }}
subjects: [{{ kind: ServiceAccount, name: tenant, namespace: {ns} }}]
"
        ),
    );
    apply_as(cp, &user, &ns, &with("granted", env_from_db));
    let (took, out) = try_apply_as(
        cp,
        &user,
        &ns,
        &with(
            "granted",
            "  envFrom: [{ secretRef: { name: db } }, { secretRef: { name: other } }]\n",
        ),
    );
    assert!(
        !took && out.contains("spec.envFrom[].secretRef.name"),
        "{out}"
    );

    // An admin keeps every field: the operator renders it to Ready, its status writes not held
    // up by the policy.
    let op = Operator::start(cp, &ns, "hanzo.ai", &[]).await;
    // The pods' ServiceAccount exists (the API server makes no pod for one that does not).
    kubectl_ok(cp, &["create", "serviceaccount", "deployer", "-n", &ns]);
    apply(
        cp,
        &ns,
        &with(
            "admin",
            // Five Secrets in one list: each name would be an authorizer check, and CEL's cost
            // model fits two in one expression; an admin passes on the namespace-wide one.
            "  envFrom: [{ secretRef: { name: db } }]\n  serviceAccountName: deployer\n  volumes: [{ name: v, secret: { secretName: tls } }]\n  env: [{ name: A, valueFrom: { secretKeyRef: { name: a, key: k } } }, { name: B, valueFrom: { secretKeyRef: { name: b, key: k } } }, { name: C, valueFrom: { secretKeyRef: { name: c, key: k } } }, { name: D, valueFrom: { secretKeyRef: { name: d, key: k } } }, { name: E, valueFrom: { secretKeyRef: { name: e, key: k } } }]\n",
        ),
    );
    wait_ready(cp, &ns, "services.hanzo.ai/admin");
    // A change of its metadata alone is not checked again: the tenant may label it.
    kubectl_ok(
        cp,
        &[
            "label",
            "--as",
            &user,
            "-n",
            &ns,
            "services.hanzo.ai/admin",
            "team=a",
        ],
    );
    let pod = get(cp, &ns, "deployment/admin").unwrap()["spec"]["template"]["spec"].clone();
    assert_eq!(pod["serviceAccountName"], "deployer");
    assert_eq!(
        pod["containers"][0]["envFrom"][0]["secretRef"]["name"],
        "db"
    );
    wait_ready(cp, &ns, "services.hanzo.ai/granted");
    // The tenant changing the admin's resource is held to the same rule.
    let (took, out) = try_apply_as(
        cp,
        &user,
        &ns,
        &with(
            "admin",
            "  envFrom: [{ secretRef: { name: db } }]\n  serviceAccountName: deployer\n  volumes: [{ name: v, secret: { secretName: tls } }]\n  replicas: 3\n",
        ),
    );
    assert!(!took && out.contains("spec.serviceAccountName"), "{out}");
    op.stop().await;
}
