//! The plugin's logic, called natively (`cargo test -p guest-kvcluster`): what `example.yaml`
//! renders to, the status `test/observed.yaml` gives it, and what it refuses.

use guest_kit::{Context, ObservedChild, Plugin, Resource};
use guest_kvcluster::KvClusterPlugin;
use serde_json::{Value, json};

fn objects(yaml: &str) -> Vec<Value> {
    serde_saphyr::from_multiple(yaml).unwrap()
}

/// The KVCluster of `example.yaml`, as the host passes it.
fn example() -> Resource {
    let docs = objects(include_str!("../example.yaml"));
    assert_eq!(docs.len(), 1);
    Resource::from_object(&docs[0]).unwrap()
}

#[test]
fn the_example_renders_three_nodes_behind_a_headless_service() {
    let objects = KvClusterPlugin::render(&example(), &Context::default()).unwrap();
    let sts = objects.iter().find(|o| o["kind"] == "StatefulSet").unwrap();
    assert_eq!(sts["spec"]["replicas"], 3);
    let headless = objects
        .iter()
        .find(|o| o["kind"] == "Service" && o["metadata"]["name"] == "my-raft-db-service")
        .unwrap();
    assert_eq!(headless["spec"]["clusterIP"], "None");
}

#[test]
fn the_observed_children_give_the_status_build_sh_checks() {
    let children: Vec<ObservedChild> = objects(include_str!("../test/observed.yaml"))
        .iter()
        .filter_map(ObservedChild::from_object)
        .collect();
    let status = KvClusterPlugin::status(&example(), &children, &Context::default()).unwrap();
    assert_eq!(status["readyNodes"], 3);
    assert_eq!(status["size"], 3);
    assert_eq!(
        status["seedAddress"],
        "my-raft-db-0.my-raft-db-service.default.svc.cluster.local:50051"
    );
}

#[test]
fn a_size_out_of_range_is_refused_naming_the_field() {
    let mut example = example();
    example.spec["size"] = json!(0);
    let e = KvClusterPlugin::render(&example, &Context::default()).unwrap_err();
    assert!(e.to_string().contains("spec.size"), "{e}");
}
