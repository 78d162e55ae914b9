//! CustomResourceDefinitions from the plugins' own descriptions.
//!
//! A plugin describes each Kind's `spec` in OpenAPI v3 and may name Kubernetes types with
//! `{"$ref": "#/definitions/io.k8s.api.core.v1.Volume"}`. The host inlines those from
//! k8s-openapi's schemas for the Kubernetes version it was built for (`v1_36`), so that
//! Kubernetes-native fields are validated exactly and never pruned. The `status` schema is the
//! host's: it writes status, not the plugin.

use serde_json::{Map, Value, json};

use crate::error::{Error, Result};
use crate::kube_schema::{inline_refs, printer_columns, status_schema};
use crate::plugin::Plugin;
use crate::registry::Registry;
use crate::types::KindInfo;

/// The label and category every generated CRD carries.
pub const CATEGORY: &str = "wasm-operator";

/// The CRD of one Kind.
pub fn crd(plugin: &Plugin, kind: &KindInfo) -> Result<Value> {
    let mut spec = kind.spec_schema.clone();
    inline_refs(&mut spec).map_err(|reference| Error::UnknownSchemaRef {
        plugin: plugin.name().to_owned(),
        kind: kind.kind.clone(),
        reference,
    })?;
    let spec_required = spec
        .get("required")
        .and_then(Value::as_array)
        .is_some_and(|r| !r.is_empty());
    let mut root = json!({
        "type": "object",
        "description": format!("{} is served by the {} plugin.", kind.kind, plugin.name()),
        "properties": {
            "apiVersion": { "type": "string" },
            "kind": { "type": "string" },
            "metadata": { "type": "object" },
            "spec": spec,
            "status": status_schema(),
        },
    });
    if spec_required {
        root["required"] = json!(["spec"]);
    }
    // The fields the plugin computes (contract 1.1) beside the host's own (their `$ref`s were
    // inlined when the plugin described itself).
    if let Some(schema) = &kind.status_schema
        && let (Some(theirs), Some(ours)) = (
            schema.get("properties").and_then(Value::as_object),
            root["properties"]["status"]["properties"].as_object_mut(),
        )
    {
        for (name, field) in theirs {
            ours.entry(name.clone()).or_insert_with(|| field.clone());
        }
    }
    let columns: Vec<Value> = printer_columns(kind)
        .iter()
        .map(|c| {
            let mut col = json!({ "name": c.name, "type": c.type_, "jsonPath": c.json_path });
            if !c.description.is_empty() {
                col["description"] = c.description.as_str().into();
            }
            if c.priority != 0 {
                col["priority"] = c.priority.into();
            }
            col
        })
        .collect();
    let versions: Vec<Value> = kind
        .versions
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let mut version = json!({
                "name": v,
                "served": true,
                "storage": i == 0,
                "schema": { "openAPIV3Schema": root },
                "subresources": { "status": {} },
            });
            if !columns.is_empty() {
                version["additionalPrinterColumns"] = json!(columns);
            }
            version
        })
        .collect();
    let mut names = Map::new();
    names.insert("kind".into(), kind.kind.as_str().into());
    names.insert("listKind".into(), format!("{}List", kind.kind).into());
    names.insert("plural".into(), kind.plural.as_str().into());
    names.insert("singular".into(), kind.kind.to_lowercase().into());
    if !kind.short_names.is_empty() {
        names.insert("shortNames".into(), json!(kind.short_names));
    }
    names.insert("categories".into(), json!([CATEGORY]));
    Ok(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": format!("{}.{}", kind.plural, kind.group),
            "labels": { "app.kubernetes.io/managed-by": CATEGORY },
            "annotations": { "wasm-operator.dev/plugin": format!("{}@{}", plugin.name(), plugin.info().version) },
        },
        "spec": {
            "group": kind.group,
            "names": names,
            "scope": "Namespaced",
            "versions": versions,
        },
    }))
}

/// The CRD of every Kind the registry serves, sorted by group and Kind.
pub fn crds(registry: &Registry) -> Result<Vec<Value>> {
    registry
        .kinds()
        .map(|(plugin, kind)| crd(plugin, kind))
        .collect()
}

/// Each CRD as a file: (`<plural>.<group>.yaml`, its YAML), as `crds/` holds them.
pub fn files(crds: &[Value]) -> Result<Vec<(String, String)>> {
    crds.iter()
        .map(|crd| {
            let name = crd
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("unnamed");
            // Names were checked when their plugins loaded; a file name is made of nothing else.
            guest_kit::spec::dns_subdomain("metadata.name", name).map_err(|e| {
                crate::error::Error::Output(format!("a CRD named `{name}`: {}", e.message))
            })?;
            Ok((
                format!("{name}.yaml"),
                crate::documents::write(std::slice::from_ref(crd), crate::documents::Format::Yaml)?,
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube_schema::structural_problems;
    use crate::kube_schema::tests::unbounded;

    #[test]
    fn the_built_in_crds_are_structural() {
        let runtime = crate::plugin::Runtime::new(Default::default(), None).unwrap();
        let registry = Registry::load(&runtime, Default::default(), true, &[]).unwrap();
        for crd in crds(&registry).unwrap() {
            let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
            assert_eq!(
                structural_problems(schema, "openAPIV3Schema"),
                Vec::<String>::new(),
                "{}",
                crd["metadata"]["name"]
            );
        }
    }

    #[test]
    fn every_list_map_and_string_of_a_built_in_spec_is_bounded() {
        let runtime = crate::plugin::Runtime::new(Default::default(), None).unwrap();
        let registry = Registry::load(&runtime, Default::default(), true, &[]).unwrap();
        for crd in crds(&registry).unwrap() {
            let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
            let mut found = Vec::new();
            unbounded(&schema["properties"]["spec"], "spec", &mut found);
            assert!(
                found.is_empty(),
                "{}: unbounded {found:?}",
                crd["metadata"]["name"]
            );
        }
    }
}
