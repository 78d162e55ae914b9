//! `crds/` is exactly what `host crds` prints for the default group.

use std::collections::BTreeMap;

use crate::support::{registry, root};

#[test]
fn crds_directory_is_up_to_date() {
    // The built-in plugins' CRDs, and the Plugin Kind's (as `host crds` prints them).
    let mut crds = host::crd::crds(registry()).unwrap();
    crds.push(host::api::crd());
    let expected: BTreeMap<String, String> = host::crd::files(&crds).unwrap().into_iter().collect();
    let dir = root().join("crds");
    let actual: BTreeMap<String, String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read_to_string(&p).unwrap(),
            )
        })
        .collect();
    let stale: Vec<&String> = expected
        .keys()
        .filter(|k| actual.get(*k) != expected.get(*k))
        .collect();
    let extra: Vec<&String> = actual
        .keys()
        .filter(|k| !expected.contains_key(*k))
        .collect();
    assert!(
        stale.is_empty() && extra.is_empty(),
        "crds/ is stale (differs: {stale:?}, not generated: {extra:?}); run scripts/generate"
    );
}

#[test]
fn crds_are_structural_and_complete() {
    for crd in host::crd::crds(registry()).unwrap() {
        let text = crd.to_string();
        let name = crd["metadata"]["name"].as_str().unwrap();
        assert!(!text.contains("$ref"), "{name} has a $ref");
        let version = &crd["spec"]["versions"][0];
        assert_eq!(
            version["subresources"]["status"],
            serde_json::json!({}),
            "{name}"
        );
        let root = &version["schema"]["openAPIV3Schema"];
        assert_eq!(root["properties"]["spec"]["type"], "object", "{name}");
        assert_eq!(
            root["properties"]["status"]["properties"]["conditions"]["x-kubernetes-list-type"],
            "map"
        );
        let columns: Vec<&str> = version["additionalPrinterColumns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        for c in ["Ready", "Status", "Age"] {
            assert!(columns.contains(&c), "{name} lacks printer column {c}");
        }
    }
}

/// A plugin that declares no printer columns (the hostile one) still gets the host's: `kubectl
/// get` shows whether its resources are Ready.
#[test]
fn a_kind_without_columns_gets_the_hosts() {
    let runtime = host::plugin::Runtime::new(Default::default(), None).unwrap();
    let registry = host::registry::Registry::load(
        &runtime,
        Default::default(),
        false,
        &[std::path::PathBuf::from(test_guests::HOSTILE)],
    )
    .unwrap();
    let crds = host::crd::crds(&registry).unwrap();
    assert_eq!(crds.len(), 1);
    let columns: Vec<&str> = crds[0]["spec"]["versions"][0]["additionalPrinterColumns"]
        .as_array()
        .expect("printer columns")
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(columns, ["Ready", "Status", "Age"]);
}

/// The host's rule for junctors is the API server's: the junctors of a CRD's root schema may
/// check only fields and items the schema specifies outside them, at every level (a key of a
/// map included); the junctors of a node below the root are not held to it. Each schema goes to
/// the real API server in a CRD (server dry run), at the root and in `spec`, and the host's
/// verdict must be the API server's.
#[test]
fn junctors_are_judged_as_the_api_server_judges_them() {
    use serde_json::{Value, json};
    let cp = crate::support::cluster::cluster();
    let structure = json!({
        "a": { "type": "string" },
        "list": { "type": "array", "items": { "type": "object", "properties": { "x": { "type": "string" } } } },
        "labels": { "type": "object", "additionalProperties": { "type": "string" } },
    });
    // Junctors over `spec`'s fields, and whether the API server takes them at the root.
    let cases = [
        (
            "required",
            json!({ "oneOf": [{ "required": ["a"] }, { "required": ["list"] }] }),
            true,
        ),
        (
            "specified",
            json!({ "anyOf": [{ "properties": { "a": { "minLength": 1 } } }] }),
            true,
        ),
        (
            "item field",
            json!({ "not": { "properties": { "list": { "items": { "properties": { "x": { "pattern": "^x" } } } } } } }),
            true,
        ),
        (
            "map key",
            json!({ "allOf": [{ "properties": { "labels": { "properties": { "k": { "maxLength": 3 } } } } }] }),
            false,
        ),
        (
            "unspecified",
            json!({ "oneOf": [{ "properties": { "b": { "minLength": 1 } } }] }),
            false,
        ),
        (
            "nested unspecified",
            json!({ "allOf": [{ "anyOf": [{ "properties": { "c": { "pattern": "^c" } } }] }] }),
            false,
        ),
        (
            "unspecified item field",
            json!({ "anyOf": [{ "properties": { "list": { "items": { "properties": { "y": { "minLength": 1 } } } } } }] }),
            false,
        ),
        (
            "items of a string",
            json!({ "not": { "properties": { "a": { "items": { "maxItems": 1 } } } } }),
            false,
        ),
    ];
    let api_server_takes = |schema: &Value| {
        let crd = json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": { "name": "junctors.junctors.test" },
            "spec": {
                "group": "junctors.test",
                "names": { "kind": "Junctor", "plural": "junctors" },
                "scope": "Namespaced",
                "versions": [{ "name": "v1", "served": true, "storage": true, "schema": { "openAPIV3Schema": schema } }],
            },
        });
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), crd.to_string()).unwrap();
        crate::support::cluster::kubectl(
            cp,
            &[
                "create",
                "--dry-run=server",
                "-f",
                &file.path().display().to_string(),
            ],
        )
    };
    for (name, junctors, at_root) in cases {
        let spec = json!({ "type": "object", "properties": structure });
        // In `spec`: the API server takes them all.
        let mut in_spec = spec.clone();
        for (k, v) in junctors.as_object().unwrap() {
            in_spec[k] = v.clone();
        }
        // At the root, over `spec`.
        let below_root = json!({ "type": "object", "properties": { "spec": in_spec } });
        let root = json!({
            "type": "object",
            "properties": { "spec": spec },
            "allOf": [{ "properties": { "spec": junctors } }],
        });
        for (place, schema, expected) in [
            ("in spec", below_root, true),
            ("at the root", root, at_root),
        ] {
            let problems = host::kube_schema::structural_problems(&schema, "openAPIV3Schema");
            let (accepted, out) = api_server_takes(&schema);
            assert_eq!(
                accepted, expected,
                "{name} {place}: the API server says {out}"
            );
            assert_eq!(
                problems.is_empty(),
                accepted,
                "{name} {place}: the API server says {out}; the host says {problems:#?}"
            );
        }
    }
}
