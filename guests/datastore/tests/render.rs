//! The plugin's logic, called natively (`cargo test -p guest-datastore`): what `example.yaml`
//! renders to, the status `test/observed.yaml` gives it, and what it refuses.

use guest_datastore::DatastorePlugin;
use guest_kit::{Context, ObservedChild, Plugin, Resource};
use serde_json::{Value, json};

fn objects(yaml: &str) -> Vec<Value> {
    serde_saphyr::from_multiple(yaml).unwrap()
}

/// The Datastore of `example.yaml`, as the host passes it.
fn example() -> Resource {
    let docs = objects(include_str!("../example.yaml"));
    assert_eq!(docs.len(), 1);
    Resource::from_object(&docs[0]).unwrap()
}

#[test]
fn the_example_renders_a_stateful_set_and_its_services() {
    let rendered = DatastorePlugin::render_reported(&example(), &Context::default()).unwrap();
    assert!(rendered.warnings.is_empty(), "{:?}", rendered.warnings);
    let kinds: Vec<&str> = rendered
        .objects
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    assert!(kinds.contains(&"StatefulSet"), "{kinds:?}");
    assert!(kinds.contains(&"Service"), "{kinds:?}");
    let sts = rendered
        .objects
        .iter()
        .find(|o| o["kind"] == "StatefulSet")
        .unwrap();
    assert_eq!(sts["metadata"]["name"], "datastore");
    assert_eq!(
        sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"],
        "50Gi"
    );
}

#[test]
fn the_observed_children_give_the_status_build_sh_checks() {
    let children: Vec<ObservedChild> = objects(include_str!("../test/observed.yaml"))
        .iter()
        .filter_map(ObservedChild::from_object)
        .collect();
    let status = DatastorePlugin::status(&example(), &children, &Context::default()).unwrap();
    assert_eq!(status["readyReplicas"], 1);
    assert_eq!(status["replicas"], 1);
    assert_eq!(status["credentialsSecret"], "datastore-credentials");
    assert!(
        status["endpoint"]
            .as_str()
            .unwrap()
            .starts_with("datastore.hanzo.svc.cluster.local:"),
        "{status:?}"
    );
}

#[test]
fn an_unknown_engine_is_refused_naming_the_field() {
    let mut example = example();
    example.spec["type"] = json!("oracle");
    let e = DatastorePlugin::render(&example, &Context::default()).unwrap_err();
    assert!(e.to_string().contains("spec.type"), "{e}");
}
