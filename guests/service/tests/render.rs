//! The plugin's logic, called natively (`cargo test -p guest-service`): what `example.yaml`
//! renders to, and what it refuses.

use guest_kit::{Context, Plugin, Resource};
use guest_service::ServicePlugin;
use serde_json::{Value, json};

/// The resources of `example.yaml`, as the host passes them.
fn examples() -> Vec<Resource> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(include_str!("../example.yaml")).unwrap();
    docs.iter().filter_map(Resource::from_object).collect()
}

fn kinds(objects: &[Value]) -> Vec<&str> {
    objects
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect()
}

#[test]
fn the_examples_render_what_their_comments_say() {
    let examples = examples();
    assert_eq!(examples.len(), 2);
    let ctx = Context::default();
    let plain = ServicePlugin::render_reported(&examples[0], &ctx).unwrap();
    assert_eq!(kinds(&plain.objects), ["Deployment", "Service"]);
    assert!(plain.warnings.is_empty(), "{:?}", plain.warnings);
    let deployment = &plain.objects[0];
    assert_eq!(deployment["spec"]["replicas"], 2);
    assert_eq!(
        deployment["spec"]["template"]["spec"]["containers"][0]["image"],
        "ghcr.io/hanzoai/example:v1.2.3"
    );

    let full = ServicePlugin::render_reported(&examples[1], &ctx).unwrap();
    let mut got = kinds(&full.objects);
    got.sort_unstable();
    assert_eq!(
        got,
        [
            "Deployment",
            "HorizontalPodAutoscaler",
            "Ingress",
            "KMSSecret",
            "NetworkPolicy",
            "PodDisruptionBudget",
            "Service",
            "ServiceMonitor"
        ]
    );
    // Scaled by its autoscaler: the Deployment leaves spec.replicas to it.
    let deployment = full
        .objects
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .unwrap();
    assert!(deployment["spec"].get("replicas").is_none(), "{deployment}");
}

#[test]
fn a_negative_replica_count_is_refused_naming_the_field() {
    let mut example = examples().remove(0);
    example.spec["replicas"] = json!(-1);
    let e = ServicePlugin::render(&example, &Context::default()).unwrap_err();
    assert!(e.to_string().contains("spec.replicas"), "{e}");
}
