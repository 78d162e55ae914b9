//! A child as the operator reads it from the API server: what reconciliation needs of it and
//! nothing else.
//!
//! Every child the operator applies comes back twice: in the apply's answer and through the
//! child watch, later again with each status change. Read as a `DynamicObject`, each of those
//! is parsed in full (its managed fields, its pod template) into JSON values, buffered once more
//! for `DynamicObject`'s flattened fields, and then mostly thrown away. `LiveChild` reads the
//! metadata the reconciliation and the watches use, `spec.replicas` and the replica counts of
//! `status`, and skips the rest of the text without building anything from it.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::api::DynamicObject;
use kube::core::{DynamicResourceScope, Resource};
use kube::discovery::ApiResource;
use serde::{Deserialize, Deserializer, Serialize};

/// A child object, read for reconciliation (see the module's documentation).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct LiveChild {
    /// Its metadata, without `managedFields`.
    #[serde(default, deserialize_with = "lean_metadata")]
    pub metadata: ObjectMeta,
    /// `spec.replicas`, for the kinds that have it.
    #[serde(default)]
    spec: Spec,
    /// The counts of its status that say whether it is ready (`None`: it has no status).
    #[serde(default)]
    pub status: Option<Counts>,
}

/// The fields of a child's status that readiness reads (`status::child_ready`): a workload's
/// replica counts. The rest (conditions above all) is skipped unread: at 20,000 children it
/// was tens of MiB of JSON values kept for nothing. Written back as those fields, absent ones
/// left out (what a 1.1 plugin's status call sees of a child).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Counts {
    /// `status.observedGeneration`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `status.availableReplicas` (Deployment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_replicas: Option<i64>,
    /// `status.readyReplicas` (StatefulSet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i64>,
    /// `status.updatedReplicas`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_replicas: Option<i64>,
}

impl Counts {
    /// A count by its field name in `status`; 0 when absent.
    pub fn get(&self, field: &str) -> i64 {
        match field {
            "observedGeneration" => self.observed_generation,
            "availableReplicas" => self.available_replicas,
            "readyReplicas" => self.ready_replicas,
            "updatedReplicas" => self.updated_replicas,
            _ => None,
        }
        .unwrap_or(0)
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
struct Spec {
    #[serde(default)]
    replicas: Option<i64>,
}

impl LiveChild {
    /// `spec.replicas`, where the kind has it.
    pub fn replicas(&self) -> Option<i64> {
        self.spec.replicas
    }
}

/// The metadata fields the operator reads; serde skips the others (`managedFields` above all)
/// without building them.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LeanMeta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    generation: Option<i64>,
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
    owner_references: Option<Vec<OwnerReference>>,
    deletion_timestamp: Option<Time>,
}

fn lean_metadata<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    let m = LeanMeta::deserialize(d)?;
    Ok(ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        uid: m.uid,
        resource_version: m.resource_version,
        generation: m.generation,
        labels: m.labels,
        annotations: m.annotations,
        owner_references: m.owner_references,
        deletion_timestamp: m.deletion_timestamp,
        ..ObjectMeta::default()
    })
}

/// `Resource` for a type whose kind is given at run time and shared: every key of a watch's
/// store, every request in the controller's queue holds a copy of the kind (an `ApiResource`
/// is five strings), which at 10,000 resources and 20,000 children was megabytes of the same
/// words. An `Arc` is one pointer.
macro_rules! shared_kind {
    ($t:ty, $($meta:tt)+) => {
        impl Resource for $t {
            type DynamicType = Arc<ApiResource>;
            type Scope = DynamicResourceScope;

            fn kind(dt: &Arc<ApiResource>) -> Cow<'_, str> {
                dt.kind.as_str().into()
            }

            fn group(dt: &Arc<ApiResource>) -> Cow<'_, str> {
                dt.group.as_str().into()
            }

            fn version(dt: &Arc<ApiResource>) -> Cow<'_, str> {
                dt.version.as_str().into()
            }

            fn api_version(dt: &Arc<ApiResource>) -> Cow<'_, str> {
                dt.api_version.as_str().into()
            }

            fn plural(dt: &Arc<ApiResource>) -> Cow<'_, str> {
                dt.plural.as_str().into()
            }

            fn meta(&self) -> &ObjectMeta {
                &self.$($meta)+
            }

            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.$($meta)+
            }
        }
    };
}

shared_kind!(LiveChild, metadata);
shared_kind!(Served, 0.metadata);

/// A resource of a served Kind as the operator's watch, store and queue keep it: a
/// `DynamicObject` whose kind is shared (see [`shared_kind`]).
#[derive(Clone, Debug, Deserialize)]
#[serde(transparent)]
pub struct Served(pub DynamicObject);

impl std::ops::Deref for Served {
    type Target = DynamicObject;

    fn deref(&self) -> &DynamicObject {
        &self.0
    }
}

impl std::ops::DerefMut for Served {
    fn deref_mut(&mut self) -> &mut DynamicObject {
        &mut self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_metadata_replicas_and_status_and_skips_the_rest() {
        let text = serde_json::json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": "web",
                "namespace": "ns",
                "uid": "u-1",
                "resourceVersion": "42",
                "generation": 3,
                "labels": { "wasm-operator.dev/owner": "owner-uid" },
                "annotations": { "deployment.kubernetes.io/revision": "1" },
                "ownerReferences": [{
                    "apiVersion": "hanzo.ai/v1", "kind": "Service", "name": "web",
                    "uid": "owner-uid", "controller": true
                }],
                "managedFields": [{ "manager": "wasm-operator", "fieldsV1": { "f:spec": {} } }],
                "creationTimestamp": "2026-11-30T00:00:00Z",
            },
            "spec": { "replicas": 2, "template": { "spec": { "containers": [] } } },
            "status": { "observedGeneration": 3, "availableReplicas": 2 },
        })
        .to_string();
        let live: LiveChild = serde_json::from_str(&text).unwrap();
        let m = &live.metadata;
        assert_eq!(m.name.as_deref(), Some("web"));
        assert_eq!(m.namespace.as_deref(), Some("ns"));
        assert_eq!(m.uid.as_deref(), Some("u-1"));
        assert_eq!(m.resource_version.as_deref(), Some("42"));
        assert_eq!(m.generation, Some(3));
        assert_eq!(
            m.labels.as_ref().unwrap()["wasm-operator.dev/owner"],
            "owner-uid"
        );
        assert_eq!(
            m.owner_references.as_ref().unwrap()[0].controller,
            Some(true)
        );
        assert!(m.managed_fields.is_none());
        assert!(m.creation_timestamp.is_none());
        assert_eq!(live.replicas(), Some(2));
        let counts = live.status.unwrap();
        assert_eq!(counts.get("availableReplicas"), 2);
        assert_eq!(counts.get("observedGeneration"), 3);
        assert_eq!(counts.get("readyReplicas"), 0);

        let service: LiveChild =
            serde_json::from_str(r#"{"metadata":{"name":"web"},"spec":{"ports":[]}}"#).unwrap();
        assert_eq!(service.replicas(), None);
        assert!(service.status.is_none());
    }
}
