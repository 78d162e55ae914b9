//! Rendered output: snapshots of every fixture, determinism, and the wasm path agreeing with the
//! same guest libraries called natively.

use guest_kit::Plugin as _;
use host::documents::{self, Format};
use host::types::Context;

use crate::support::{fixtures, registry, render, resources};

#[test]
fn every_fixture_matches_its_snapshot() {
    for path in fixtures() {
        let mut objects = Vec::new();
        for r in resources(&path) {
            objects.extend(render(&r));
        }
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let yaml = documents::write(&objects, Format::Yaml).unwrap();
        insta::assert_snapshot!(name, yaml);
    }
}

#[test]
fn rendering_twice_gives_the_same_bytes() {
    for path in fixtures() {
        for r in resources(&path) {
            let once = documents::write(&render(&r), Format::Json).unwrap();
            let twice = documents::write(&render(&r), Format::Json).unwrap();
            assert_eq!(once, twice, "{}/{} rendered differently", r.kind, r.name);
        }
    }
}

/// The built-in plugins name no path of the machine that built them (cargo's registry, the
/// checkout), so their digests (in `host --version` and the image's labels) are the same wherever
/// the same source is built with the same toolchain.
#[test]
fn the_built_in_plugins_name_no_path_of_the_machine_that_built_them() {
    let cargo_home = crate::support::cargo_home();
    let root = crate::support::root();
    for builtin in host::plugin::BUILTINS {
        for path in [&cargo_home, &root] {
            let path = path.display().to_string();
            assert!(
                !builtin
                    .wasm
                    .windows(path.len())
                    .any(|w| w == path.as_bytes()),
                "the {} plugin names {path}",
                builtin.name
            );
        }
    }
}

#[test]
fn the_component_renders_what_the_native_library_renders() {
    let ctx = Context::default();
    for path in fixtures() {
        for r in resources(&path) {
            let (plugin, _) = registry().lookup(&r.api_version, &r.kind).unwrap();
            let native = match plugin.name() {
                "service" => guest_service::ServicePlugin::render(&r, &ctx),
                "datastore" => guest_datastore::DatastorePlugin::render(&r, &ctx),
                "kvcluster" => guest_kvcluster::KvClusterPlugin::render(&r, &ctx),
                other => panic!("unexpected plugin {other}"),
            }
            .unwrap();
            assert_eq!(render(&r), native, "{}/{}", r.kind, r.name);
        }
    }
}

#[test]
fn facades_imply_their_engine_and_kinds_carry_their_group() {
    let info = |kind: &str| {
        registry()
            .kinds()
            .find(|(_, k)| k.kind == kind)
            .map(|(_, k)| k.clone())
            .unwrap()
    };
    assert_eq!(info("SQL").engine.as_deref(), Some("postgresql"));
    assert_eq!(info("KV").engine.as_deref(), Some("valkey"));
    assert_eq!(info("DocDB").engine.as_deref(), Some("docdb"));
    assert_eq!(info("S3").engine.as_deref(), Some("minio"));
    assert_eq!(info("Datastore").engine, None);
    assert_eq!(info("Service").group, "hanzo.ai");
    assert_eq!(info("HanzoService").versions, vec!["v1alpha1"]);
    assert_eq!(info("KVCluster").group, "storage.mydatabase.io");
    let kinds: Vec<String> = registry().kinds().map(|(_, k)| k.kind.clone()).collect();
    assert_eq!(kinds.len(), 14, "{kinds:?}");
}

#[test]
fn the_api_group_moves_kinds_and_kmssecrets_but_not_kvcluster() {
    let runtime = host::plugin::Runtime::new(
        host::plugin::Limits::default(),
        Some(crate::support::cache()),
    )
    .unwrap();
    let ctx = Context {
        api_group: "lux.cloud".into(),
        cluster_domain: "cluster.local".into(),
    };
    let lux = host::registry::Registry::load(&runtime, ctx, true, &[]).unwrap();
    let groups: std::collections::BTreeSet<&str> =
        lux.kinds().map(|(_, k)| k.group.as_str()).collect();
    assert_eq!(groups, ["lux.cloud", "storage.mydatabase.io"].into());
    let r = crate::support::resource(
        "apiVersion: lux.cloud/v1\nkind: Service\nmetadata: {name: a, namespace: lux}\nspec:\n  image: {repository: x}\n  kmsSecrets: [{managedSecretName: s}]\n",
    );
    let out = lux.render(&r).unwrap();
    assert_eq!(out.last().unwrap()["apiVersion"], "kms.lux.cloud/v1");
    // A hanzo.ai resource is not served by a lux.cloud host.
    let hanzo = crate::support::resource(
        "apiVersion: hanzo.ai/v1\nkind: Service\nmetadata: {name: a}\nspec: {image: {repository: x}}\n",
    );
    assert!(
        lux.render(&hanzo)
            .unwrap_err()
            .to_string()
            .contains("no plugin serves Service in hanzo.ai/v1")
    );
}

#[test]
fn kvcluster_pods_learn_the_seed_address() {
    let r = crate::support::resource(
        &std::fs::read_to_string(crate::support::root().join("examples/kvcluster.yaml")).unwrap(),
    );
    let out = render(&r);
    let sts = crate::support::find(&out, "StatefulSet", "my-raft-db");
    assert_eq!(sts["spec"]["replicas"], 3);
    assert_eq!(sts["spec"]["serviceName"], "my-raft-db-service");
    let env = &sts["spec"]["template"]["spec"]["containers"][0]["env"];
    let get = |n: &str| {
        env.as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == n)
            .cloned()
            .unwrap()
    };
    assert_eq!(
        get("POD_NAME")["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.name"
    );
    assert_eq!(get("NODE_ID")["value"], "$(POD_NAME)");
    assert_eq!(get("SEED_NODE_ID")["value"], "my-raft-db-0");
    assert_eq!(
        get("SEED_NODE_ADDR")["value"],
        "my-raft-db-0.my-raft-db-service.default.svc.cluster.local:50051"
    );
    let svc = crate::support::find(&out, "Service", "my-raft-db-service");
    assert_eq!(svc["spec"]["clusterIP"], "None");
}
