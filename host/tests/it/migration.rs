//! Moving from the earlier operator: a team stops the KV-Operator and starts this one over the
//! same KVClusters. Their children are made here as the KV-Operator made them (its public
//! source, `internal/controller/kvcluster_controller.go`: a controller-runtime `Create` under
//! its field manager, a controller reference to the KVCluster, selector `app: <name>`, the
//! headless Service `<name>-service`, the claim template `data-volume`), and this operator takes
//! them over: no immutable field changed, no pod replaced. Where an immutable field differs, it
//! says which, with the command that lets it make the object again.

use std::time::Duration;

use serde_json::Value;
use testenv::ControlPlane;

use crate::support::cluster::{
    Operator, apply, cluster, condition, eventually, get, kubectl_ok, wait_ready,
};

/// The field manager controller-runtime's client writes under in the KV-Operator's image (its
/// binary, `manager`, as Kubebuilder builds it).
const EARLIER_MANAGER: &str = "manager";

/// The headless Service and the StatefulSet the KV-Operator creates for `name`, with the claim
/// template named `claim` (`data-volume` in its source).
fn earlier_children(ns: &str, name: &str, uid: &str, size: i64, claim: &str) -> String {
    let owner = format!(
        "ownerReferences: [{{apiVersion: storage.mydatabase.io/v1alpha1, kind: KVCluster, name: {name}, uid: {uid}, controller: true, blockOwnerDeletion: true}}]"
    );
    format!(
        "apiVersion: v1
kind: Service
metadata: {{name: {name}-service, namespace: {ns}, {owner}}}
spec:
  clusterIP: None
  selector: {{app: {name}}}
  ports: [{{name: grpc, port: 50051}}, {{name: raft, port: 60051}}, {{name: metrics, port: 51051}}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {{name: {name}, namespace: {ns}, {owner}}}
spec:
  replicas: {size}
  serviceName: {name}-service
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
      containers:
      - name: storage-node
        image: kv-storage:latest
        imagePullPolicy: IfNotPresent
        env:
        - {{name: POD_NAME, valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}}}
        - {{name: NODE_ID, value: $(POD_NAME)}}
        - {{name: SEED_NODE_ID, value: {name}-0}}
        - {{name: SEED_NODE_ADDR, value: {name}-0.{name}-service.{ns}.svc.cluster.local:50051}}
        ports: [{{containerPort: 50051, name: grpc}}, {{containerPort: 60051, name: raft}}, {{containerPort: 51051, name: metrics}}]
        volumeMounts: [{{name: {claim}, mountPath: /app/raft-data}}]
  volumeClaimTemplates:
  - metadata: {{name: {claim}}}
    spec:
      accessModes: [ReadWriteOnce]
      resources: {{requests: {{storage: 1Gi}}}}
"
    )
}

/// Creates `yaml` as a controller-runtime client does: a create, under `EARLIER_MANAGER`.
fn create_as_earlier_operator(cp: &ControlPlane, yaml: &str) {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), yaml).unwrap();
    kubectl_ok(
        cp,
        &[
            "create",
            "--field-manager",
            EARLIER_MANAGER,
            "-f",
            &file.path().display().to_string(),
        ],
    );
}

/// The uids of the pods of KVCluster `name`, by pod name.
fn pods(cp: &ControlPlane, ns: &str, name: &str) -> Vec<(String, String)> {
    let list = get(cp, ns, "pods").unwrap();
    let mut pods: Vec<(String, String)> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["metadata"]["labels"]["app"] == name)
        .map(|p| {
            (
                p["metadata"]["name"].as_str().unwrap().to_owned(),
                p["metadata"]["uid"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    pods.sort();
    pods
}

/// Waits until `size` pods of `name` run, and returns them.
async fn running(cp: &ControlPlane, ns: &str, name: &str, size: usize) -> Vec<(String, String)> {
    eventually(
        &format!("{size} pods of {name}"),
        Duration::from_secs(90),
        || {
            get(cp, ns, &format!("statefulset/{name}"))
                .is_some_and(|s| s["status"]["readyReplicas"] == size)
        },
    )
    .await;
    pods(cp, ns, name)
}

fn managers(obj: &Value) -> Vec<String> {
    obj["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["manager"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kvcluster_the_kv_operator_made_is_taken_over_as_it_is() {
    let cp = cluster();
    let _logs = cp.logs_on_failure();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "migrate").await.unwrap();
    let kvcluster = |name: &str, size: i64| {
        format!(
            "apiVersion: storage.mydatabase.io/v1alpha1\nkind: KVCluster\nmetadata: {{name: {name}}}\nspec: {{size: {size}}}\n"
        )
    };

    // What the KV-Operator left running: a KVCluster and its children, made its way, and one
    // made by a version whose claim template had another name.
    apply(cp, &ns, &kvcluster("raft", 3));
    apply(cp, &ns, &kvcluster("older", 2));
    let uid = |name: &str| {
        get(cp, &ns, &format!("kvclusters.storage.mydatabase.io/{name}")).unwrap()["metadata"]
            ["uid"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    create_as_earlier_operator(
        cp,
        &earlier_children(&ns, "raft", &uid("raft"), 3, "data-volume"),
    );
    create_as_earlier_operator(
        cp,
        &earlier_children(&ns, "older", &uid("older"), 2, "data"),
    );
    let raft_pods = running(cp, &ns, "raft", 3).await;
    running(cp, &ns, "older", 2).await;
    let sts = get(cp, &ns, "statefulset/raft").unwrap();
    let revision = sts["status"]["updateRevision"].clone();

    // This operator starts over them.
    let op = Operator::start(cp, &ns, "hanzo.ai", &[]).await;
    wait_ready(cp, &ns, "kvclusters.storage.mydatabase.io/raft");
    let after = get(cp, &ns, "statefulset/raft").unwrap();
    assert_eq!(
        after["metadata"]["uid"], sts["metadata"]["uid"],
        "made again"
    );
    let with_fields: Value = serde_json::from_str(&kubectl_ok(
        cp,
        &[
            "get",
            "statefulset/raft",
            "-n",
            &ns,
            "-o",
            "json",
            "--show-managed-fields",
        ],
    ))
    .unwrap();
    assert!(
        managers(&with_fields).contains(&host::ownership::FIELD_MANAGER.to_owned()),
        "not applied: {:?}",
        managers(&with_fields)
    );
    assert_eq!(
        after["status"]["updateRevision"], revision,
        "the pod template changed"
    );
    // Its pods stay: the same ones, once the StatefulSet controller has seen what this operator
    // applied (a template it changed would have a new revision to roll out).
    eventually(
        "the StatefulSet controller to observe the applied StatefulSet",
        Duration::from_secs(60),
        || {
            get(cp, &ns, "statefulset/raft")
                .is_some_and(|s| s["status"]["observedGeneration"] == s["metadata"]["generation"])
        },
    )
    .await;
    let observed = get(cp, &ns, "statefulset/raft").unwrap();
    assert_eq!(
        observed["status"]["updateRevision"], revision,
        "the pod template changed"
    );
    assert_eq!(pods(cp, &ns, "raft"), raft_pods, "pods were replaced");
    let raft = get(cp, &ns, "kvclusters.storage.mydatabase.io/raft").unwrap();
    assert_eq!(raft["status"]["readyNodes"], 3, "{raft}");
    // And it is this operator's from now on: a change of size goes through.
    apply(cp, &ns, &kvcluster("raft", 4));
    running(cp, &ns, "raft", 4).await;

    // The claim template's name is immutable and differs: said, with the fix.
    let older = eventually(
        "the older KVCluster to say what blocks it",
        Duration::from_secs(30),
        || {
            get(cp, &ns, "kvclusters.storage.mydatabase.io/older")
                .is_some_and(|o| condition(&o, "Ready").1 == "ApplyFailed")
        },
    );
    older.await;
    let o = get(cp, &ns, "kvclusters.storage.mydatabase.io/older").unwrap();
    let (_, _, message) = condition(&o, "Ready");
    assert!(
        message.contains(
            r#"spec.volumeClaimTemplates (live [{"name":"data"}], rendered [{"name":"data-volume"}])"#
        ) && message.contains("new, empty claims")
            && message.contains(&format!(
                "kubectl delete statefulset older -n {ns} --cascade=orphan"
            )),
        "{message}"
    );
    assert_eq!(condition(&o, "Stalled").0, "True", "{o}");
    // The fix as said: the StatefulSet is made again, with the claim template rendered, and
    // adopts the pods (which the StatefulSet controller then rolls, their volume's name having
    // changed). The resource is no longer refused.
    kubectl_ok(
        cp,
        &[
            "delete",
            "statefulset",
            "older",
            "-n",
            &ns,
            "--cascade=orphan",
        ],
    );
    eventually(
        "the StatefulSet made again",
        Duration::from_secs(60),
        || {
            get(cp, &ns, "statefulset/older").is_some_and(|s| {
                s["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data-volume"
            })
        },
    )
    .await;
    eventually(
        "the older KVCluster no longer refused",
        Duration::from_secs(30),
        || {
            get(cp, &ns, "kvclusters.storage.mydatabase.io/older").is_some_and(|o| {
                condition(&o, "Ready").1 != "ApplyFailed" && condition(&o, "Stalled").0 == "False"
            })
        },
    )
    .await;
    let adopted = pods(cp, &ns, "older");
    assert_eq!(adopted.len(), 2);
    let sts = get(cp, &ns, "statefulset/older").unwrap();
    for (name, _) in &adopted {
        let pod = get(cp, &ns, &format!("pod/{name}")).unwrap();
        assert_eq!(
            pod["metadata"]["ownerReferences"][0]["uid"], sts["metadata"]["uid"],
            "{name} not adopted"
        );
    }
    op.stop().await;
}
