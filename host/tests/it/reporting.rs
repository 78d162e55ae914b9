//! Contract 1.1 on the real control plane: warnings shown on the resource without making it
//! un-Ready, status fields computed by the plugin from what the host observes, a plugin whose
//! status misbehaves contained, and a plugin built against 1.0 served unchanged.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use crate::support::cluster::{
    Operator, apply, cluster, condition, eventually, get, install_crds, kubectl, kubectl_ok,
    wait_ready,
};

const DATASTORE: &str = "apiVersion: hanzo.ai/v1alpha1
kind: HanzoDatastore
metadata: {name: db}
spec:
  type: postgresql
  image: {repository: postgres, tag: '16'}
  storage: {size: 1Gi}
  credentialsSecret: db-creds
  backup: {enabled: true, schedule: '0 3 * * *', retentionDays: 7}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warnings_and_status_computed_by_plugins_show_on_the_resource() {
    let cp = cluster();
    let _logs = cp.logs_on_failure();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "reporting").await.unwrap();
    install_crds(cp, test_guests::HOSTILE);
    install_crds(cp, test_guests::CONTRACT_1_0);
    let op = Operator::start(
        cp,
        &ns,
        "hanzo.ai",
        &[
            PathBuf::from(test_guests::HOSTILE),
            PathBuf::from(test_guests::CONTRACT_1_0),
        ],
    )
    .await;

    // A backup without its S3 target: the database is deployed, the backup left out, and the
    // resource Ready with a warning naming the fields.
    apply(cp, &ns, DATASTORE);
    wait_ready(cp, &ns, "hanzodatastores.hanzo.ai/db");
    let db = get(cp, &ns, "hanzodatastores.hanzo.ai/db").unwrap();
    let (status, reason, warning) = condition(&db, "Warning");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "PluginWarning"),
        "{db}"
    );
    assert!(
        warning.contains("spec.backup") && warning.contains("spec.backup.s3Endpoint"),
        "{warning}"
    );
    assert_eq!(condition(&db, "Stalled").0, "False", "{db}");
    assert!(get(cp, &ns, "statefulset/db").is_some(), "no StatefulSet");
    assert!(
        get(cp, &ns, "cronjob/db-backup").is_none(),
        "a CronJob with no target"
    );
    // `kubectl get` shows it, in the host's message column.
    let table = kubectl_ok(cp, &["get", "-n", &ns, "hanzodatastores"]);
    assert!(table.contains("warning: spec.backup"), "{table}");
    // Once, as an event.
    eventually("the warning's event", Duration::from_secs(30), || {
        kubectl(
            cp,
            &[
                "get",
                "events",
                "-n",
                &ns,
                "--field-selector",
                "reason=PluginWarning",
            ],
        )
        .1
        .contains("spec.backup")
    })
    .await;
    // The plugin's status fields beside the host's: the endpoint and the credentials' Secret at
    // once, the ready replicas as the StatefulSet reports them.
    assert_eq!(
        db["status"]["endpoint"],
        format!("db.{ns}.svc.cluster.local:5432"),
        "{db}"
    );
    assert_eq!(db["status"]["credentialsSecret"], "db-creds", "{db}");
    eventually(
        "the ready replicas in status",
        Duration::from_secs(60),
        || {
            get(cp, &ns, "hanzodatastores.hanzo.ai/db")
                .is_some_and(|d| d["status"]["readyReplicas"] == 1 && d["status"]["replicas"] == 1)
        },
    )
    .await;

    // Completed, the backup is rendered and the warning goes.
    apply(
        cp,
        &ns,
        &DATASTORE.replace(
            "retentionDays: 7}",
            "retentionDays: 7, s3Endpoint: 'https://s3.example.com', s3Bucket: backups, s3CredentialsSecret: s3-creds}",
        ),
    );
    eventually("the backup CronJob", Duration::from_secs(30), || {
        get(cp, &ns, "cronjob/db-backup").is_some()
    })
    .await;
    eventually("the warning to go", Duration::from_secs(30), || {
        get(cp, &ns, "hanzodatastores.hanzo.ai/db").is_some_and(|d| {
            condition(&d, "Warning").0.is_empty() && condition(&d, "Ready").0 == "True"
        })
    })
    .await;

    // A KVCluster reports its seed and its ready nodes.
    apply(
        cp,
        &ns,
        "apiVersion: storage.mydatabase.io/v1alpha1\nkind: KVCluster\nmetadata: {name: raft}\nspec: {size: 3}\n",
    );
    wait_ready(cp, &ns, "kvclusters.storage.mydatabase.io/raft");
    eventually(
        "three ready nodes in status",
        Duration::from_secs(60),
        || {
            get(cp, &ns, "kvclusters.storage.mydatabase.io/raft").is_some_and(|k| {
                k["status"]["readyNodes"] == 3
                    && k["status"]["seedAddress"]
                        == format!("raft-0.raft-service.{ns}.svc.cluster.local:50051")
            })
        },
    )
    .await;

    // A status that names fields its schema does not (one of them the host's own), and one
    // that never returns: the resource stays Ready, says why its fields are not new, and
    // nothing of the host's status is overwritten.
    let hostile = |name: &str, mode: &str| {
        format!(
            "apiVersion: test.wasm-operator.dev/v1\nkind: Hostile\nmetadata: {{name: {name}}}\nspec: {{mode: {mode}}}\n"
        )
    };
    apply(cp, &ns, &hostile("warner", "warn"));
    apply(cp, &ns, &hostile("undeclared", "undeclared-status"));
    apply(cp, &ns, &hostile("stuck", "status-loop"));
    apply(cp, &ns, &hostile("mistyped", "mistyped-status"));
    for (name, says) in [
        ("warner", "spec.mode: was asked to warn"),
        ("undeclared", "not among the status fields"),
        ("mistyped", "status.mode"),
        ("stuck", "deadline"),
    ] {
        let what = format!("hostiles.test.wasm-operator.dev/{name}");
        wait_ready(cp, &ns, &what);
        let h = get(cp, &ns, &what).unwrap();
        let (_, _, warning) = condition(&h, "Warning");
        assert!(warning.contains(says), "{name}: {h}");
        assert!(h["status"].get("other").is_none(), "{h}");
        assert_eq!(condition(&h, "Ready").0, "True", "{h}");
    }
    let warner = get(cp, &ns, "hostiles.test.wasm-operator.dev/warner").unwrap();
    assert_eq!(warner["status"]["mode"], "warn", "{warner}");

    // A plugin built against contract 1.0: served as before, with no warnings and no fields.
    apply(
        cp,
        &ns,
        "apiVersion: test.wasm-operator.dev/v1\nkind: Legacy\nmetadata: {name: old}\nspec: {message: hello}\n",
    );
    wait_ready(cp, &ns, "legacies.test.wasm-operator.dev/old");
    let cm = get(cp, &ns, "configmap/old").expect("the 1.0 plugin's ConfigMap");
    assert_eq!(cm["data"]["contract"], "1.0.0");
    let old: Value = get(cp, &ns, "legacies.test.wasm-operator.dev/old").unwrap();
    assert!(condition(&old, "Warning").0.is_empty(), "{old}");
    op.stop().await;
}

/// The operator's events on the real API server: a repeat (same reason, note and object) is
/// counted in the first event's `series`, not written as a new Event; another note is an event
/// of its own; once an event is gone, its next repeat starts a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_event_is_counted_in_its_series() {
    use k8s_openapi::api::core::v1::ObjectReference;
    use k8s_openapi::api::events::v1::Event as K8sEvent;
    use kube::api::{Api, DeleteParams, ListParams};
    use kube::runtime::events::{Event, EventType, Reporter};

    let cp = cluster();
    let client = cp.client().await.unwrap();
    let ns = cp.namespace(&client, "events").await.unwrap();
    let recorder = host::operator::events::Recorder::new(
        client.clone(),
        Reporter {
            controller: "wasm-operator".into(),
            instance: Some("it".into()),
        },
    );
    let regarding = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("ConfigMap".into()),
        name: Some("cm".into()),
        namespace: Some(ns.clone()),
        ..ObjectReference::default()
    };
    let event = |note: &str| Event {
        type_: EventType::Normal,
        reason: "Applied".into(),
        note: Some(note.into()),
        action: "Reconcile".into(),
        secondary: None,
    };
    // Written a minute after it happened (reports give way to applies): the event says when it
    // happened.
    let happened = k8s_openapi::jiff::Timestamp::from_second(
        k8s_openapi::jiff::Timestamp::now().as_second() - 60,
    )
    .unwrap();
    for note in ["one", "one", "one", "two"] {
        recorder
            .publish(&event(note), &regarding, happened)
            .await
            .unwrap();
    }
    let api: Api<K8sEvent> = Api::namespaced(client.clone(), &ns);
    let by_note = |list: &[K8sEvent], note: &str| -> Vec<Option<i32>> {
        list.iter()
            .filter(|e| e.note.as_deref() == Some(note))
            .map(|e| e.series.as_ref().map(|s| s.count))
            .collect()
    };
    let listed = api.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(listed.len(), 2, "{listed:#?}");
    assert_eq!(by_note(&listed, "one"), [Some(3)]);
    assert_eq!(by_note(&listed, "two"), [None]);
    let one = listed
        .iter()
        .find(|e| e.note.as_deref() == Some("one"))
        .unwrap();
    assert_eq!(one.reporting_instance.as_deref(), Some("it"));
    assert_eq!(one.regarding.as_ref().unwrap().name.as_deref(), Some("cm"));
    assert_eq!(one.event_time.as_ref().map(|t| t.0), Some(happened));
    let series = one.series.as_ref().unwrap();
    assert_eq!(series.last_observed_time.0, happened);

    // Gone (expired, or deleted by someone): the next repeat is a new event.
    let name = one.metadata.name.clone().unwrap();
    api.delete(&name, &DeleteParams::default()).await.unwrap();
    recorder
        .publish(
            &event("one"),
            &regarding,
            k8s_openapi::jiff::Timestamp::now(),
        )
        .await
        .unwrap();
    let listed = api.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(by_note(&listed, "one"), [None]);
}
