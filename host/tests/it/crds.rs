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
