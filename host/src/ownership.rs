//! What `host run` and `host diff` must agree on about ownership: how a served resource is read
//! for its plugin, how its children are stamped (field manager, owner reference, labels), who
//! controls a live object, and when an object consents to be adopted.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::DynamicObject;
use kube::discovery::ApiResource;

/// The field manager of every apply.
pub const FIELD_MANAGER: &str = "wasm-operator.dev/host";
/// The label that ties a child to its owner (the owner's uid).
pub const OWNER_LABEL: &str = "wasm-operator.dev/owner";
/// The label that says which shard a resource, and each of its children, belongs to (`host
/// run --shards`; see `operator::shard`). It is the operator's, not the resource's: no render
/// reads it.
pub const SHARD_LABEL: &str = "wasm-operator.dev/shard";
/// `app.kubernetes.io/managed-by` on every child.
pub const MANAGED_BY: &str = "wasm-operator";

/// The annotation on a resource that asks to adopt objects of its children's names that no
/// controller owns. It is not enough on its own: it counts only in the namespaces the operator
/// is told adoption is a migration of (`--adopt-in-namespace`). Objects another controller owns
/// are never taken.
pub const ADOPT_ANNOTATION: &str = "wasm-operator.dev/adopt";
/// The annotation by which an object no controller owns consents to be adopted by one
/// resource: its value names that resource as kubectl does, `PLURAL.GROUP/NAME`
/// (`services.hanzo.ai/api`). Set by whoever may edit the object, it is the object's consent,
/// not the adopter's claim.
pub const ADOPT_BY_ANNOTATION: &str = "wasm-operator.dev/adopt-by";

/// Whether `resource` may adopt objects nobody controls ([`ADOPT_ANNOTATION`]).
pub fn asks_adoption(resource: &crate::types::Resource) -> bool {
    resource
        .annotations
        .get(ADOPT_ANNOTATION)
        .is_some_and(|v| v == "true")
}

/// How kubectl names the resource `name` of `plural` in `group`: `services.hanzo.ai/api`.
pub fn handle(plural: &str, group: &str, name: &str) -> String {
    if group.is_empty() {
        format!("{plural}/{name}")
    } else {
        format!("{plural}.{group}/{name}")
    }
}

/// Whether an object whose [`ADOPT_BY_ANNOTATION`] is `consent` consents to be adopted by the
/// resource kubectl names `handle`.
pub fn consents(consent: Option<&str>, handle: &str) -> bool {
    consent == Some(handle)
}

/// Who controls a live object, as this resource sees it.
pub enum Control<'a> {
    /// This resource controls it.
    Us,
    /// It has no controller owner reference.
    Nobody,
    /// Another controller does, by this reference.
    Other(&'a OwnerReference),
}

/// Who controls the object of `metadata`, as the resource of `uid` sees it.
pub fn control<'a>(metadata: &'a ObjectMeta, uid: &str) -> Control<'a> {
    match metadata
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
    {
        Some(r) if r.uid == uid => Control::Us,
        Some(r) => Control::Other(r),
        None => Control::Nobody,
    }
}

/// Adds to `child` what the host owns on every child of a resource: the controller owner
/// reference to it, the ownership label (`wasm-operator.dev/owner: <uid>`) and
/// `app.kubernetes.io/managed-by`. The operator applies children exactly so stamped.
pub fn stamp_child(
    child: &mut serde_json::Value,
    owner_api_version: &str,
    owner_kind: &str,
    owner_name: &str,
    owner_uid: &str,
) {
    let meta = &mut child["metadata"];
    if !meta["labels"].is_object() {
        meta["labels"] = serde_json::json!({});
    }
    meta["labels"][OWNER_LABEL] = owner_uid.into();
    meta["labels"]["app.kubernetes.io/managed-by"] = MANAGED_BY.into();
    meta["ownerReferences"] = serde_json::json!([{
        "apiVersion": owner_api_version,
        "kind": owner_kind,
        "name": owner_name,
        "uid": owner_uid,
        "controller": true,
        "blockOwnerDeletion": true,
    }]);
}

/// The annotation in which `kubectl apply` (client-side) keeps a copy of the whole object.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// The fields of a stored resource's data, in their place in it (see [`trim_resource`]).
const STORED: [&str; 2] = ["spec", "status"];

/// Makes a served resource light before it is stored: drops what the operator never reads (its
/// `managedFields`, `kubectl apply`'s copy of the whole object, which plugins do not see
/// either, and its `apiVersion` and `kind`, which its watch knows), and keeps its data as
/// `[spec, status]`, each compact JSON text (one allocation instead of a tree of maps and
/// strings; not a map either, whose one B-tree node took more than both texts of a small
/// resource), read back with [`stored`] by the reconciliation that needs them. Measured at
/// 10,000 resources, the trees were most of the operator's memory. Other top-level fields are
/// dropped: neither plugins nor the operator read them.
pub fn trim_resource(obj: &mut DynamicObject) {
    obj.types = None;
    obj.metadata.managed_fields = None;
    if let Some(annotations) = obj.metadata.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
    let compact = |v: serde_json::Value| match v {
        v @ (serde_json::Value::Object(_) | serde_json::Value::Array(_)) => {
            serde_json::Value::String(v.to_string())
        }
        other => other,
    };
    let mut data = std::mem::take(&mut obj.data);
    obj.data = serde_json::Value::Array(
        STORED
            .iter()
            .map(|field| {
                compact(
                    data.get_mut(*field)
                        .map(serde_json::Value::take)
                        .unwrap_or_default(),
                )
            })
            .collect(),
    );
}

/// A resource of a served Kind (`ar`) as its plugin gets it: its metadata, and its spec (an
/// empty object when it has none).
pub fn plugin_resource(obj: &DynamicObject, ar: &ApiResource) -> crate::types::Resource {
    let meta = &obj.metadata;
    let map = |m: &Option<BTreeMap<String, String>>| m.clone().unwrap_or_default();
    crate::types::Resource {
        api_version: ar.api_version.clone(),
        kind: ar.kind.clone(),
        name: meta.name.clone().unwrap_or_default(),
        namespace: meta.namespace.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        generation: meta.generation.unwrap_or(0),
        // The operator's own label is no input of a render: the same resource renders the same
        // children whatever the shard count.
        labels: {
            let mut labels = map(&meta.labels);
            labels.remove(SHARD_LABEL);
            labels
        },
        annotations: map(&meta.annotations),
        spec: stored(obj, "spec")
            .filter(serde_json::Value::is_object)
            .unwrap_or_else(|| serde_json::json!({})),
    }
}

/// `apiVersion`, `kind` and `metadata.name` of a rendered object (empty when absent).
pub fn identity(object: &serde_json::Value) -> (String, String, String) {
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
    (
        text(&object["apiVersion"]),
        text(&object["kind"]),
        text(&object["metadata"]["name"]),
    )
}

/// A stored resource's `spec` or `status` (see [`trim_resource`]): parsed back from its compact
/// text, or as it is in an object that was not stored (a test's, say); `None` when absent.
pub fn stored(obj: &DynamicObject, field: &str) -> Option<serde_json::Value> {
    stored_as(obj, field)
}

/// A stored resource's `spec` or `status` read as `T` straight from its compact text (see
/// [`stored`]), without building the whole JSON value; `None` when absent or not a `T`.
pub fn stored_as<T: serde::de::DeserializeOwned>(obj: &DynamicObject, field: &str) -> Option<T> {
    let value = match &obj.data {
        serde_json::Value::Array(parts) => parts.get(STORED.iter().position(|f| *f == field)?)?,
        data => data.get(field)?,
    };
    match value {
        serde_json::Value::Null => None,
        serde_json::Value::String(text) => serde_json::from_str(text).ok(),
        other => T::deserialize(other).ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_trimmed_resource_keeps_its_spec_and_status_and_nothing_the_operator_does_not_read() {
        let mut obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "hanzo.ai/v1",
            "kind": "Service",
            "metadata": {
                "name": "web",
                "annotations": { LAST_APPLIED: "{}", "keep": "me" },
                "managedFields": [{ "manager": "kubectl" }],
            },
            "spec": { "replicas": 2, "ports": [80] },
            "status": { "conditions": [] },
            "other": { "a": 1 },
        }))
        .unwrap();
        trim_resource(&mut obj);
        assert_eq!(
            stored(&obj, "spec"),
            Some(json!({ "replicas": 2, "ports": [80] }))
        );
        assert_eq!(stored(&obj, "status"), Some(json!({ "conditions": [] })));
        assert_eq!(stored(&obj, "other"), None);
        assert!(obj.types.is_none() && obj.metadata.managed_fields.is_none());
        assert_eq!(
            obj.metadata.annotations,
            Some(BTreeMap::from([("keep".to_owned(), "me".to_owned())]))
        );

        // No status yet; and an object that was not stored reads as it is.
        let mut obj: DynamicObject =
            serde_json::from_value(json!({ "metadata": { "name": "a" }, "spec": {} })).unwrap();
        let plain = obj.clone();
        trim_resource(&mut obj);
        assert_eq!(
            (stored(&obj, "spec"), stored(&obj, "status")),
            (Some(json!({})), None)
        );
        assert_eq!(
            (stored(&plain, "spec"), stored(&plain, "status")),
            (Some(json!({})), None)
        );
    }
}
