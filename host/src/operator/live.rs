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
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::api::DynamicObject;
use kube::core::{DynamicResourceScope, Resource};
use kube::discovery::ApiResource;
use serde::de::{DeserializeSeed, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

/// A child object, read for reconciliation (see the module's documentation).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(from = "Raw")]
pub struct LiveChild {
    /// Its metadata, without `managedFields`, and without its labels and annotations, which
    /// are the next two fields: `meta().labels` (kube's `ResourceExt::labels()`) is always
    /// empty here.
    pub metadata: ObjectMeta,
    /// `metadata.labels`.
    pub labels: Pairs,
    /// `metadata.annotations`.
    pub annotations: Pairs,
    /// `spec.replicas`, for the kinds that have it.
    spec: Spec,
    /// The counts of its status that say whether it is ready (`None`: it has no status).
    pub status: Option<Counts>,
}

/// A child as its text has it, before its labels and annotations move out of its metadata.
#[derive(Deserialize)]
struct Raw {
    #[serde(default)]
    metadata: LeanMeta,
    #[serde(default)]
    spec: Spec,
    #[serde(default)]
    status: Option<Counts>,
}

impl From<Raw> for LiveChild {
    fn from(raw: Raw) -> Self {
        let m = raw.metadata;
        Self {
            metadata: ObjectMeta {
                name: m.name,
                namespace: m.namespace,
                uid: m.uid,
                resource_version: m.resource_version,
                generation: m.generation,
                owner_references: m.owner_references,
                deletion_timestamp: m.deletion_timestamp,
                ..ObjectMeta::default()
            },
            labels: m.labels,
            annotations: m.annotations,
            spec: raw.spec,
            status: raw.status,
        }
    }
}

/// A string-to-string map as a live child's labels or annotations keep it: its keys and values
/// one after the other in one string. A `BTreeMap<String, String>` takes a node of 11 entries
/// (about 540 bytes) and two allocations per entry: at 20,000 children, about 19 MiB more than
/// this. It is only ever read by key, and holds a few entries.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Pairs {
    /// Each key, then its value.
    text: Box<str>,
    /// Where each key and each value ends in `text`.
    ends: Box<[usize]>,
}

impl Pairs {
    /// The value of `key` (the last one, should a text name it twice, as a map would keep).
    pub fn get(&self, key: &str) -> Option<&str> {
        self.iter().rev().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    /// Each key and its value, in the order they came.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&str, &str)> {
        let piece = |i: usize| {
            let start = if i == 0 { 0 } else { self.ends[i - 1] };
            self.text.get(start..self.ends[i]).unwrap_or_default()
        };
        (0..self.ends.len() / 2).map(move |i| (piece(2 * i), piece(2 * i + 1)))
    }

    /// Whether it has no entry.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }
}

impl std::fmt::Debug for Pairs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<K: AsRef<str>, V: AsRef<str>> FromIterator<(K, V)> for Pairs {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(entries: I) -> Self {
        let mut text = String::new();
        let mut ends = Vec::new();
        for (k, v) in entries {
            text.push_str(k.as_ref());
            ends.push(text.len());
            text.push_str(v.as_ref());
            ends.push(text.len());
        }
        Self {
            text: text.into(),
            ends: ends.into(),
        }
    }
}

impl<'de> Deserialize<'de> for Pairs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_option(PairsVisitor)
    }
}

/// Reads a map of strings (or `null`) straight into a [`Pairs`]' one string.
struct PairsVisitor;

impl<'de> Visitor<'de> for PairsVisitor {
    type Value = Pairs;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a map of strings")
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<Pairs, E> {
        Ok(Pairs::default())
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Pairs, E> {
        Ok(Pairs::default())
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Pairs, D::Error> {
        d.deserialize_map(self)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Pairs, A::Error> {
        let mut text = String::new();
        let mut ends = Vec::new();
        while map.next_key_seed(Append(&mut text))?.is_some() {
            ends.push(text.len());
            map.next_value_seed(Append(&mut text))?;
            ends.push(text.len());
        }
        Ok(Pairs {
            text: text.into(),
            ends: ends.into(),
        })
    }
}

/// Reads a string onto the end of another, without a string of its own.
struct Append<'a>(&'a mut String);

impl<'de> DeserializeSeed<'de> for Append<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for Append<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<(), E> {
        self.0.push_str(s);
        Ok(())
    }
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
#[derive(Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct LeanMeta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    generation: Option<i64>,
    labels: Pairs,
    annotations: Pairs,
    owner_references: Option<Vec<OwnerReference>>,
    deletion_timestamp: Option<Time>,
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

impl Served {
    /// The reference of the resource `name` of `ar` in `namespace` (empty: cluster-scoped), as
    /// the served watch's store and queue key it.
    pub(crate) fn reference(
        ar: &Arc<ApiResource>,
        namespace: &str,
        name: &str,
    ) -> kube::runtime::reflector::ObjectRef<Self> {
        let r = kube::runtime::reflector::ObjectRef::new_with(name, ar.clone());
        if namespace.is_empty() {
            r
        } else {
            r.within(namespace)
        }
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
            live.labels.get("wasm-operator.dev/owner"),
            Some("owner-uid")
        );
        assert_eq!(
            live.annotations.get("deployment.kubernetes.io/revision"),
            Some("1")
        );
        assert!(m.labels.is_none() && m.annotations.is_none());
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

    #[test]
    fn labels_and_annotations_read_into_one_string_each() {
        let text =
            r#"{"metadata":{"labels":{"a":"1","b\"\u00e9":"x\ny","":""},"annotations":null}}"#;
        let live: LiveChild = serde_json::from_str(text).unwrap();
        assert_eq!(
            live.labels.iter().collect::<Vec<_>>(),
            vec![("a", "1"), ("b\"\u{e9}", "x\ny"), ("", "")]
        );
        assert_eq!(live.labels.get("b\"\u{e9}"), Some("x\ny"));
        assert_eq!(live.labels.get(""), Some(""));
        assert_eq!(live.labels.get("c"), None);
        assert!(live.annotations.is_empty());
        // A watch event whose "object" comes before its "type" is buffered by serde first.
        let event: kube::core::WatchEvent<LiveChild> = serde_json::from_str(
            r#"{"object":{"metadata":{"labels":{"k":"v"},"annotations":null}},"type":"ADDED"}"#,
        )
        .unwrap();
        let kube::core::WatchEvent::Added(live) = event else {
            panic!("not an ADDED event");
        };
        assert_eq!(live.labels.get("k"), Some("v"));
        assert!(live.annotations.is_empty());
        assert!(serde_json::from_str::<LiveChild>(r#"{"metadata":{"labels":{"k":1}}}"#).is_err());
    }
}
