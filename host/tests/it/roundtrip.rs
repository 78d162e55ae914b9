//! The invariant of HIP-0400: `env`, `envFrom`, `volumes`, `volumeMounts` (and `resources`,
//! `sidecars`, `initContainers`) reach the pod template unchanged, for every volume source.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::support::{find, render, resources, root};

fn fixture(name: &str) -> host::types::Resource {
    resources(&root().join("tests/data").join(name)).remove(0)
}

fn schema_properties(definition: &str) -> BTreeSet<String> {
    let schema = host::kube_schema::kubernetes_schema(definition).expect("known type");
    schema["properties"]
        .as_object()
        .expect("properties")
        .keys()
        .cloned()
        .collect()
}

#[test]
fn kubernetes_fields_reach_the_deployment_unchanged() {
    let r = fixture("service-full.yaml");
    let out = render(&r);
    let pod = &find(&out, "Deployment", "api")["spec"]["template"]["spec"];
    let main = &pod["containers"][0];
    for field in ["env", "envFrom", "volumeMounts", "resources"] {
        assert_eq!(main[field], r.spec[field], "containers[0].{field}");
    }
    assert_eq!(pod["volumes"], r.spec["volumes"]);
    assert_eq!(pod["initContainers"], r.spec["initContainers"]);
    let sidecars: Vec<Value> = pod["containers"].as_array().unwrap()[1..].to_vec();
    assert_eq!(Value::Array(sidecars), r.spec["sidecars"]);
    for (field, pod_field) in [
        ("imagePullSecrets", "imagePullSecrets"),
        ("nodeSelector", "nodeSelector"),
        ("tolerations", "tolerations"),
        ("affinity", "affinity"),
        ("securityContext", "securityContext"),
    ] {
        assert_eq!(pod[pod_field], r.spec[field], "{field}");
    }
    assert_eq!(main["securityContext"], r.spec["containerSecurityContext"]);
}

#[test]
fn every_volume_source_reaches_the_pod_unchanged() {
    let r = fixture("service-volumes.yaml");
    let out = render(&r);
    let pod = &find(&out, "Deployment", "volumes")["spec"]["template"]["spec"];
    assert_eq!(pod["volumes"], r.spec["volumes"]);
    assert_eq!(pod["containers"][0]["volumeMounts"], r.spec["volumeMounts"]);

    // The fixture must cover every source the Kubernetes version we build for has.
    let used: BTreeSet<String> = r.spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|v| v.as_object().unwrap().keys().cloned())
        .collect();
    let missing: Vec<String> = schema_properties("io.k8s.api.core.v1.Volume")
        .difference(&used)
        .cloned()
        .collect();
    assert!(
        missing.is_empty(),
        "service-volumes.yaml lacks volume sources {missing:?}"
    );

    let projected = r.spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v.get("projected").is_some())
        .unwrap();
    let used: BTreeSet<String> = projected["projected"]["sources"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s.as_object().unwrap().keys().cloned())
        .collect();
    let all = host::kube_schema::kubernetes_schema("io.k8s.api.core.v1.Volume").unwrap();
    let sources: BTreeSet<String> =
        all["properties"]["projected"]["properties"]["sources"]["items"]["properties"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
    let missing: Vec<&String> = sources.difference(&used).collect();
    assert!(
        missing.is_empty(),
        "the projected volume lacks sources {missing:?}"
    );
}

#[test]
fn datastore_keeps_user_env_volumes_and_mounts() {
    let r = fixture("datastore-full.yaml");
    let out = render(&r);
    let pod = &find(&out, "StatefulSet", "datastore")["spec"]["template"]["spec"];
    let main = &pod["containers"][0];
    let env = main["env"].as_array().unwrap();
    let user = r.spec["env"].as_array().unwrap();
    assert_eq!(
        &env[env.len() - user.len()..],
        user.as_slice(),
        "the user's env follows the defaults, unchanged"
    );
    let names: Vec<&str> = env.iter().map(|e| e["name"].as_str().unwrap()).collect();
    let unique: BTreeSet<&str> = names.iter().copied().collect();
    assert_eq!(names.len(), unique.len(), "one entry per name: {names:?}");
    assert_eq!(main["envFrom"], r.spec["envFrom"]);
    assert_eq!(pod["volumes"], r.spec["volumes"]);
    let mounts = main["volumeMounts"].as_array().unwrap();
    let user_mounts = r.spec["volumeMounts"].as_array().unwrap();
    assert_eq!(&mounts[..user_mounts.len()], user_mounts.as_slice());
    assert_eq!(mounts.last().unwrap()["mountPath"], "/var/lib/clickhouse");
}

#[test]
fn engines_get_their_ports_paths_and_credentials() {
    let all = resources(&root().join("tests/data/datastore-facades.yaml"));
    let expect = [
        (
            "postgres",
            5432,
            "/var/lib/postgresql/data",
            Some("POSTGRES_PASSWORD"),
        ),
        ("cache", 6379, "/data", Some("VALKEY_PASSWORD")),
        (
            "documents",
            27017,
            "/state",
            Some("FERRETDB_POSTGRESQL_URL"),
        ),
        ("objects", 9000, "/data", Some("MINIO_ROOT_PASSWORD")),
        ("analytics", 8123, "/var/lib/clickhouse", None),
        ("events", 4222, "/data", None),
    ];
    for (name, port, path, secret_var) in expect {
        let r = all.iter().find(|r| r.name == name).unwrap();
        let out = render(r);
        let main = &find(&out, "StatefulSet", name)["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(main["ports"][0]["containerPort"], port, "{name}");
        assert!(
            main["volumeMounts"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["mountPath"] == path),
            "{name}"
        );
        if let Some(var) = secret_var {
            assert!(
                main["env"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|e| e["name"] == var),
                "{name} lacks {var}"
            );
        }
        find(&out, "Service", &format!("{name}-hs"));
        find(&out, "Service", name);
    }
}
