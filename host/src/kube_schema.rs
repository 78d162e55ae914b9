//! The Kubernetes side of a CRD's schema, for any plugin: the Kubernetes types a plugin's
//! schema names by `$ref`, inlined (and bounded) from k8s-openapi's own schemas for the
//! Kubernetes version the host was built for, the `status` schema and printer columns the host
//! owns, and the API server's rules for a structural schema.

use k8s_openapi::api::{core::v1 as core, networking::v1 as networking};
use k8s_openapi::apimachinery::pkg::{api::resource::Quantity, apis::meta::v1 as meta};
use schemars::JsonSchema;
use schemars::generate::SchemaSettings;
use std::sync::OnceLock;

use serde_json::{Value, json};

use crate::types::KindInfo;

fn schema_of<T: JsonSchema>() -> Value {
    let generator = SchemaSettings::openapi3()
        .with(|s| {
            s.inline_subschemas = true;
            s.meta_schema = None;
        })
        .into_generator();
    let mut v = generator.into_root_schema_for::<T>().to_value();
    if let Some(o) = v.as_object_mut() {
        for key in ["$schema", "title", "definitions", "$defs", "components"] {
            o.remove(key);
        }
    }
    v
}

/// A Kubernetes type that a plugin's schema may name with `$ref`.
#[derive(Debug, Clone, Copy)]
pub struct KubernetesType {
    /// Its OpenAPI definition name, such as `io.k8s.api.core.v1.Volume`.
    pub name: &'static str,
    /// Its schema for the Kubernetes version the host was built for, as the CRD inlines it.
    pub schema: fn() -> Value,
    /// Whether a value is one of it (k8s-openapi's own deserialization: types, int32 ranges).
    pub accepts: fn(&Value) -> bool,
}

fn accepts<T: serde::de::DeserializeOwned>(v: &Value) -> bool {
    T::deserialize(v).is_ok()
}

macro_rules! kubernetes_types {
    ($($name:literal => $ty:ty,)*) => {
        &[$(KubernetesType {
            name: $name,
            schema: schema_of::<$ty>,
            accepts: accepts::<$ty>,
        },)*]
    };
}

/// Every Kubernetes type a plugin's schema may name.
pub const KUBERNETES_TYPES: &[KubernetesType] = kubernetes_types! {
    "io.k8s.api.core.v1.Affinity" => core::Affinity,
    "io.k8s.api.core.v1.Container" => core::Container,
    "io.k8s.api.core.v1.ContainerPort" => core::ContainerPort,
    "io.k8s.api.core.v1.EnvFromSource" => core::EnvFromSource,
    "io.k8s.api.core.v1.EnvVar" => core::EnvVar,
    "io.k8s.api.core.v1.ExecAction" => core::ExecAction,
    "io.k8s.api.core.v1.GRPCAction" => core::GRPCAction,
    "io.k8s.api.core.v1.HTTPGetAction" => core::HTTPGetAction,
    "io.k8s.api.core.v1.LocalObjectReference" => core::LocalObjectReference,
    "io.k8s.api.core.v1.PersistentVolumeClaimSpec" => core::PersistentVolumeClaimSpec,
    "io.k8s.api.core.v1.PodSecurityContext" => core::PodSecurityContext,
    "io.k8s.api.core.v1.PodSpec" => core::PodSpec,
    "io.k8s.api.core.v1.Probe" => core::Probe,
    "io.k8s.api.core.v1.ResourceRequirements" => core::ResourceRequirements,
    "io.k8s.api.core.v1.SecurityContext" => core::SecurityContext,
    "io.k8s.api.core.v1.ServicePort" => core::ServicePort,
    "io.k8s.api.core.v1.TCPSocketAction" => core::TCPSocketAction,
    "io.k8s.api.core.v1.Toleration" => core::Toleration,
    "io.k8s.api.core.v1.TopologySpreadConstraint" => core::TopologySpreadConstraint,
    "io.k8s.api.core.v1.Volume" => core::Volume,
    "io.k8s.api.core.v1.VolumeMount" => core::VolumeMount,
    "io.k8s.api.networking.v1.NetworkPolicyPeer" => networking::NetworkPolicyPeer,
    "io.k8s.apimachinery.pkg.api.resource.Quantity" => Quantity,
    "io.k8s.apimachinery.pkg.apis.meta.v1.Condition" => meta::Condition,
    "io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector" => meta::LabelSelector,
};

/// The Kubernetes type of a definition name, if a plugin may name it.
pub fn kubernetes_type(definition: &str) -> Option<&'static KubernetesType> {
    KUBERNETES_TYPES.iter().find(|t| t.name == definition)
}

/// The schema of a Kubernetes type by its OpenAPI definition name.
pub fn kubernetes_schema(definition: &str) -> Option<Value> {
    kubernetes_type(definition).map(|t| (t.schema)())
}

/// The Kubernetes type a `$ref` names (`#/definitions/NAME` or `#/components/schemas/NAME`),
/// as a CRD inlines it: without descriptions, every list, map and string bounded. Made once per
/// process: schemars builds a type's schema anew at each call, which for `PodSpec` takes
/// milliseconds, and every plugin load checks its Kinds' references through these schemas.
pub fn inlined(reference: &str) -> Option<&'static Value> {
    static INLINED: [OnceLock<Value>; KUBERNETES_TYPES.len()] =
        [const { OnceLock::new() }; KUBERNETES_TYPES.len()];
    let name = reference
        .trim_start_matches("#/definitions/")
        .trim_start_matches("#/components/schemas/");
    let i = KUBERNETES_TYPES.iter().position(|t| t.name == name)?;
    let ty = KUBERNETES_TYPES.get(i)?;
    Some(INLINED.get(i)?.get_or_init(|| {
        let mut schema = (ty.schema)();
        strip_descriptions(&mut schema);
        bound(&mut schema, "");
        schema
    }))
}

/// Drops `description` everywhere below `v`: inlined Kubernetes types keep the CRD small enough
/// for client-side `kubectl apply` (their documentation is `kubectl explain pod.spec`'s).
fn strip_descriptions(v: &mut Value) {
    match v {
        Value::Object(o) => {
            o.remove("description");
            // A property *named* description must stay: only the schema keyword goes.
            for (k, child) in o.iter_mut() {
                if k == "properties" {
                    if let Value::Object(props) = child {
                        props.values_mut().for_each(strip_descriptions);
                    }
                } else {
                    strip_descriptions(child);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(strip_descriptions),
        _ => {}
    }
}

/// The most items a list of an inlined Kubernetes type may hold (an `env` list:
/// [`MAX_ENV`]), unless Kubernetes bounds it.
pub const MAX_ITEMS: u64 = 256;
/// The most variables an inlined container's `env` may hold: as many as the main container's.
pub const MAX_ENV: u64 = 512;
/// The longest a string of an inlined Kubernetes type may be (an env value, a script in
/// `command`), unless Kubernetes bounds it.
pub const MAX_STRING: u64 = 64 << 10;
/// The most entries a map of an inlined Kubernetes type may hold.
pub const MAX_ENTRIES: u64 = 64;
/// The longest an int-or-string of an inlined Kubernetes type may be (a quantity, a port name).
pub const MAX_INT_OR_STRING: u64 = 64;

/// Bounds every list, map and string of an inlined Kubernetes type that Kubernetes leaves
/// unbounded, so that the API server refuses a resource that would have a render copy a huge
/// list (and so that the CEL of admission policies has bounded costs). `name` is the property
/// `v` is the schema of.
fn bound(v: &mut Value, name: &str) {
    let Value::Object(o) = v else { return };
    let is = |t: &str| o.get("type").and_then(Value::as_str) == Some(t);
    if o.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        o.entry("maxLength").or_insert(MAX_INT_OR_STRING.into());
    } else if is("array") {
        let max = if name == "env" { MAX_ENV } else { MAX_ITEMS };
        o.entry("maxItems").or_insert(max.into());
    } else if is("string") && !o.contains_key("enum") {
        o.entry("maxLength").or_insert(MAX_STRING.into());
    } else if is("object") && o.contains_key("additionalProperties") {
        o.entry("maxProperties").or_insert(MAX_ENTRIES.into());
    }
    if let Some(Value::Object(props)) = o.get_mut("properties") {
        for (k, child) in props.iter_mut() {
            bound(child, k);
        }
    }
    for key in ["items", "additionalProperties"] {
        if let Some(child) = o.get_mut(key) {
            bound(child, "");
        }
    }
    for key in ["allOf", "anyOf", "oneOf"] {
        if let Some(Value::Array(children)) = o.get_mut(key) {
            children.iter_mut().for_each(|c| bound(c, ""));
        }
    }
}

/// Replaces every `$ref` to a Kubernetes type with its schema; `Err(ref)` for an unknown one.
pub fn inline_refs(v: &mut Value) -> std::result::Result<(), String> {
    match v {
        Value::Object(o) => {
            if let Some(Value::String(r)) = o.get("$ref") {
                let schema = inlined(r).ok_or_else(|| r.clone())?;
                o.remove("$ref");
                if let Value::Object(s) = schema {
                    for (k, val) in s {
                        o.entry(k.clone()).or_insert_with(|| val.clone());
                    }
                }
                return Ok(());
            }
            o.values_mut().try_for_each(inline_refs)
        }
        Value::Array(a) => a.iter_mut().try_for_each(inline_refs),
        _ => Ok(()),
    }
}

/// Whether every `$ref` in `v` names a Kubernetes type the host knows (the ones
/// [`inline_refs`] would inline).
pub fn refs_known(v: &Value) -> bool {
    match v {
        Value::Object(o) => match o.get("$ref") {
            Some(Value::String(r)) => inlined(r).is_some(),
            _ => o.values().all(refs_known),
        },
        Value::Array(a) => a.iter().all(refs_known),
        _ => true,
    }
}

/// The fields of `status` the host owns: a plugin's status schema may not name them.
pub const HOST_STATUS_FIELDS: &[&str] = &[
    "observedGeneration",
    "conditions",
    "children",
    "skipped",
    "plugin",
];

/// The schema of `status`, which the host writes.
pub fn status_schema() -> Value {
    let mut condition =
        kubernetes_schema("io.k8s.apimachinery.pkg.apis.meta.v1.Condition").unwrap_or_default();
    strip_descriptions(&mut condition);
    json!({
        "type": "object",
        "description": "Observed state, written by the operator.",
        "properties": {
            "observedGeneration": { "type": "integer", "format": "int64", "description": "The generation the status describes." },
            "conditions": {
                "type": "array",
                "description": "Ready, Reconciling and Stalled, in the kstatus convention; Warning when the plugin left something out.",
                "items": condition,
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["type"],
            },
            "children": {
                "type": "array",
                "description": "The objects rendered for this resource.",
                "items": {
                    "type": "object",
                    "properties": {
                        "apiVersion": { "type": "string" },
                        "kind": { "type": "string" },
                        "name": { "type": "string" },
                        "ready": { "type": "boolean" },
                        "message": { "type": "string" },
                        "applied": {
                            "type": "object",
                            "description": "What the operator's last apply of it left, so that a restarted operator writes nothing unchanged.",
                            "properties": {
                                "hash": { "type": "string", "description": "A hash of the object as applied." },
                                "uid": { "type": "string", "description": "The object's uid after the apply." },
                                "generation": { "type": "integer", "format": "int64", "description": "Its generation after the apply." },
                                "resourceVersion": { "type": "string", "description": "Its resourceVersion after the apply, for kinds without a generation." },
                            },
                        },
                    },
                },
            },
            "skipped": {
                "type": "array",
                "description": "Children not applied, and why (for example, their CRD is not installed).",
                "items": {
                    "type": "object",
                    "properties": {
                        "apiVersion": { "type": "string" },
                        "kind": { "type": "string" },
                        "name": { "type": "string" },
                        "reason": { "type": "string" },
                    },
                },
            },
            "plugin": { "type": "string", "description": "The plugin that rendered this resource: name@version (sha256 prefix)." },
        },
    })
}

/// A Kind's printer columns: the plugin's, with the host's own `Ready` and `Status` (from the
/// Ready condition, which the host owns) before them and `Age` after, unless the plugin names a
/// column so itself. `kubectl get` shows whether a resource is ready whatever the plugin declares.
pub fn printer_columns(kind: &KindInfo) -> Vec<crate::types::PrinterColumn> {
    let declared = |name: &str| {
        kind.printer_columns
            .iter()
            .any(|c| c.name.eq_ignore_ascii_case(name))
    };
    let (mut front, mut back) = (Vec::new(), Vec::new());
    for column in guest_kit::render::standard_printer_columns() {
        if declared(&column.name) {
            continue;
        }
        if column.name == "Age" {
            back.push(column);
        } else {
            front.push(column);
        }
    }
    front
        .into_iter()
        .chain(kind.printer_columns.iter().cloned())
        .chain(back)
        .collect()
}

/// Why a schema, as a CRD's `openAPIV3Schema` (its `$ref`s inlined), would not be structural,
/// or not accepted by the API server: each problem names the schema's path (`spec.ports.items`).
/// Empty when it is fine. What the API server checks, in short: every node has one type (or says
/// it is an int-or-string or keeps unknown fields), arrays say what their items are, nothing
/// OpenAPI has that CRDs refuse (`$ref`, `patternProperties`, ...), no non-empty `properties`
/// beside an `additionalProperties` other than `true`, and inside `allOf`, `anyOf`, `oneOf` and
/// `not` only value checks: no types (but `integer` and `string` under an int-or-string),
/// defaults, descriptions or nullability.
///
/// And the junctors of the schema itself (a CRD's `openAPIV3Schema`) may only check fields and
/// items the schema specifies outside them, through every level (a key of a map included:
/// `properties` under a junctor needs the same `properties` outside). The API server holds the
/// root's junctors to this, not those of the nodes below it (tested against it: a `oneOf` in
/// `spec` that checks a field `spec` does not specify is accepted).
pub fn structural_problems(schema: &Value, path: &str) -> Vec<String> {
    let mut problems = Vec::new();
    structural(schema, path, Place::Outside, &mut problems);
    for (at, inside) in junctors(schema, path) {
        uncovered(inside, schema, &at, path, &mut problems);
    }
    problems
}

/// Where a schema node stands, for what it may say.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    /// Not inside `allOf`, `anyOf`, `oneOf` or `not`.
    Outside,
    /// Inside one.
    Junctor,
    /// Directly inside one of a node with `x-kubernetes-int-or-string`, where the API server
    /// allows `type: integer` and `type: string` (`anyOf: [{type: integer}, {type: string}]`, as
    /// controller-gen writes it).
    IntOrString,
}

fn structural(node: &Value, path: &str, place: Place, problems: &mut Vec<String>) {
    let Some(object) = node.as_object() else {
        problems.push(format!("{path}: a schema must be an object, not `{node}`"));
        return;
    };
    for refused in [
        "$ref",
        "$schema",
        "definitions",
        "dependencies",
        "additionalItems",
        "patternProperties",
        "id",
    ] {
        if object.contains_key(refused) {
            problems.push(format!(
                "{path}: `{refused}` is not allowed in a CRD schema"
            ));
        }
    }
    if object.get("uniqueItems") == Some(&Value::Bool(true)) {
        problems.push(format!(
            "{path}: `uniqueItems: true` is not allowed (use x-kubernetes-list-type: set)"
        ));
    }
    let flag = |name: &str| object.get(name) == Some(&Value::Bool(true));
    let free = flag("x-kubernetes-int-or-string") || flag("x-kubernetes-preserve-unknown-fields");
    let type_ = object.get("type");
    if place == Place::Outside {
        match type_ {
            Some(Value::String(t))
                if matches!(
                    t.as_str(),
                    "object" | "array" | "string" | "integer" | "number" | "boolean"
                ) => {}
            Some(Value::String(other)) => problems.push(format!("{path}: unknown type `{other}`")),
            Some(_) => problems.push(format!(
                "{path}: `type` must be one name, such as \"string\" (nullable: true allows null)"
            )),
            None if free => {}
            None => problems.push(format!(
                "{path}: no type (a structural schema gives every field one)"
            )),
        }
    } else {
        for field in [
            "type",
            "default",
            "description",
            "nullable",
            "additionalProperties",
        ] {
            let allowed = field == "type"
                && place == Place::IntOrString
                && matches!(type_.and_then(Value::as_str), Some("integer" | "string"));
            if object.contains_key(field) && !allowed {
                problems.push(format!(
                    "{path}: `{field}` is not allowed inside allOf, anyOf, oneOf or not"
                ));
            }
        }
    }
    if type_.and_then(Value::as_str) == Some("array") && !object.contains_key("items") {
        problems.push(format!("{path}: an array without `items`"));
    }
    let has_properties = object
        .get("properties")
        .and_then(Value::as_object)
        .is_some_and(|p| !p.is_empty());
    if has_properties
        && object
            .get("additionalProperties")
            .is_some_and(|more| *more != Value::Bool(true))
    {
        problems.push(format!(
            "{path}: `properties` beside an `additionalProperties` other than true"
        ));
    }
    // Below a junctor, everything is in it; the junctors of this node are below it.
    let inner = if place == Place::Outside {
        Place::Outside
    } else {
        Place::Junctor
    };
    let below = if flag("x-kubernetes-int-or-string") {
        Place::IntOrString
    } else {
        Place::Junctor
    };
    if let Some(properties) = object.get("properties") {
        match properties.as_object() {
            Some(properties) => {
                for (name, child) in properties {
                    structural(child, &format!("{path}.{name}"), inner, problems);
                }
            }
            None => problems.push(format!("{path}.properties: not an object")),
        }
    }
    if let Some(items) = object.get("items") {
        structural(items, &format!("{path}.items"), inner, problems);
    }
    if let Some(more) = object.get("additionalProperties")
        && !more.is_boolean()
    {
        structural(
            more,
            &format!("{path}.additionalProperties"),
            inner,
            problems,
        );
    }
    for junctor in ["allOf", "anyOf", "oneOf"] {
        if let Some(list) = object.get(junctor) {
            match list.as_array() {
                Some(list) => {
                    for (i, child) in list.iter().enumerate() {
                        structural(child, &format!("{path}.{junctor}[{i}]"), below, problems);
                    }
                }
                None => problems.push(format!("{path}.{junctor}: not a list")),
            }
        }
    }
    if let Some(not) = object.get("not") {
        structural(not, &format!("{path}.not"), below, problems);
    }
}

/// The schemas directly inside `node`'s `allOf`, `anyOf`, `oneOf` and `not`, with their paths.
fn junctors<'a>(node: &'a Value, path: &str) -> Vec<(String, &'a Value)> {
    let mut found = Vec::new();
    for junctor in ["allOf", "anyOf", "oneOf"] {
        for (i, child) in node[junctor].as_array().into_iter().flatten().enumerate() {
            found.push((format!("{path}.{junctor}[{i}]"), child));
        }
    }
    if let Some(not) = node.get("not") {
        found.push((format!("{path}.not"), not));
    }
    found
}

/// Each field or list that `inside` (a schema in a junctor, at `at`) checks and the structural
/// schema `outside` (at `path`) does not specify: the API server refuses a CRD whose junctors
/// reach fields its structure does not have ("must only have properties/items that are
/// specified in the structural part").
fn uncovered(inside: &Value, outside: &Value, at: &str, path: &str, problems: &mut Vec<String>) {
    let Some(inside_object) = inside.as_object() else {
        return;
    };
    if let Some(properties) = inside_object.get("properties").and_then(Value::as_object) {
        for (name, child) in properties {
            let field = format!("{path}.{name}");
            let child_at = format!("{at}.{name}");
            match outside.get("properties").and_then(|p| p.get(name)) {
                Some(structure) => uncovered(child, structure, &child_at, &field, problems),
                None => problems.push(format!(
                    "{field}: checked in {child_at} and not specified outside the junctor (a \
                     structural schema specifies every field it checks outside allOf, anyOf, \
                     oneOf and not)"
                )),
            }
        }
    }
    if let Some(items) = inside_object.get("items") {
        let field = format!("{path}.items");
        match outside.get("items") {
            Some(structure) => {
                uncovered(items, structure, &format!("{at}.items"), &field, problems)
            }
            None => problems.push(format!(
                "{field}: checked in {at}.items and not specified outside the junctor"
            )),
        }
    }
    for (nested_at, nested) in junctors(inside, at) {
        uncovered(nested, outside, &nested_at, path, problems);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn every_kind_gets_the_hosts_columns_unless_it_names_them() {
        let mut kind = KindInfo {
            group: "example.com".into(),
            versions: vec!["v1".into()],
            kind: "Site".into(),
            plural: "sites".into(),
            short_names: vec![],
            engine: None,
            spec_schema: json!({ "type": "object" }),
            printer_columns: vec![],
            status_schema: None,
            references: Vec::new(),
        };
        let names = |kind: &KindInfo| -> Vec<String> {
            printer_columns(kind).into_iter().map(|c| c.name).collect()
        };
        assert_eq!(names(&kind), ["Ready", "Status", "Age"]);
        kind.printer_columns = vec![
            crate::types::PrinterColumn::new("Replicas", "integer", ".spec.replicas", ""),
            crate::types::PrinterColumn::new("status", "string", ".status.phase", "theirs"),
        ];
        assert_eq!(names(&kind), ["Ready", "Replicas", "status", "Age"]);
    }

    #[test]
    fn what_is_not_structural_is_named() {
        let schema = json!({
            "type": "object",
            "properties": {
                "a": { "description": "no type" },
                "b": { "type": "array" },
                "c": { "type": "object", "properties": { "x": { "type": "string" } }, "additionalProperties": { "type": "string" } },
                "c2": { "type": "object", "properties": { "x": { "type": "string" } }, "additionalProperties": true },
                "c3": { "type": "object", "properties": {}, "additionalProperties": { "type": "string" } },
                "e2": { "x-kubernetes-int-or-string": true, "anyOf": [{ "type": "integer" }, { "type": "string" }] },
                "i": { "type": ["string", "null"] },
                "d": { "$ref": "#/definitions/x" },
                "e": { "x-kubernetes-int-or-string": true },
                "f": { "type": "string", "anyOf": [{ "type": "string" }, { "pattern": "^a" }] },
                "g": { "type": "tuple" },
                "h": { "type": "array", "items": { "type": "string" }, "uniqueItems": true },
            },
        });
        let problems = structural_problems(&schema, "spec");
        let named = |path: &str, what: &str| {
            assert!(
                problems
                    .iter()
                    .any(|p| p.starts_with(path) && p.contains(what)),
                "no `{what}` at {path} in {problems:#?}"
            );
        };
        named("spec.a:", "no type");
        named("spec.b:", "without `items`");
        named("spec.c:", "beside an `additionalProperties`");
        named("spec.d:", "`$ref`");
        named("spec.d:", "no type");
        named("spec.f.anyOf[0]:", "`type`");
        named("spec.g:", "unknown type");
        named("spec.h:", "uniqueItems");
        named("spec.i:", "must be one name");
        for fine in ["spec.e", "spec.c2", "spec.c3"] {
            assert!(
                !problems
                    .iter()
                    .any(|p| p.starts_with(&format!("{fine}:"))
                        || p.starts_with(&format!("{fine}."))),
                "{fine}: {problems:#?}"
            );
        }
        assert_eq!(problems.len(), 9, "{problems:#?}");
    }

    #[test]
    fn the_roots_junctors_check_only_fields_the_structure_specifies() {
        let schema = json!({
            "type": "object",
            "properties": {
                "a": { "type": "string" },
                "list": { "type": "array", "items": { "type": "object", "properties": { "x": { "type": "string" } } } },
                "labels": { "type": "object", "additionalProperties": { "type": "string" } },
                "inner": { "type": "object", "oneOf": [{ "properties": { "z": { "minLength": 1 } } }] },
            },
            "oneOf": [
                { "required": ["a"] },
                { "properties": { "a": { "minLength": 1 }, "b": { "minLength": 1 } } },
                { "properties": { "list": { "items": { "properties": { "x": {}, "y": {} } } } } },
                { "properties": { "labels": { "properties": { "k": { "maxLength": 3 } } } } },
                { "anyOf": [{ "properties": { "c": { "pattern": "^c" } } }] },
            ],
            "not": { "properties": { "a": { "items": { "maxItems": 1 } } } },
        });
        let problems = structural_problems(&schema, "root");
        let expected = [
            "root.b: checked in root.oneOf[1].b",
            "root.list.items.y: checked in root.oneOf[2].list.items.y",
            "root.labels.k: checked in root.oneOf[3].labels.k",
            "root.c: checked in root.oneOf[4].anyOf[0].c",
            "root.a.items: checked in root.not.a.items",
        ];
        for want in expected {
            assert!(
                problems.iter().any(|p| p.starts_with(want)),
                "no `{want}` in {problems:#?}"
            );
        }
        // `a` and `list.items.x` are specified; the junctors of `inner` are not the root's.
        assert_eq!(problems.len(), expected.len(), "{problems:#?}");
    }

    #[test]
    fn inlines_kubernetes_types_without_refs() {
        let mut v = json!({ "type": "array", "items": { "$ref": "#/definitions/io.k8s.api.core.v1.Volume" } });
        inline_refs(&mut v).unwrap();
        let text = v.to_string();
        assert!(!text.contains("$ref"), "{text}");
        for source in ["projected", "downwardAPI", "csi", "ephemeral", "image"] {
            assert!(
                v["items"]["properties"].get(source).is_some(),
                "Volume lacks {source}"
            );
        }
    }

    /// Where below `v` a list, map, string or int-or-string has no bound.
    pub(crate) fn unbounded(v: &Value, at: &str, found: &mut Vec<String>) {
        let Value::Object(o) = v else { return };
        let t = o.get("type").and_then(Value::as_str);
        let missing = match t {
            Some("array") => !o.contains_key("maxItems"),
            Some("string") => !o.contains_key("maxLength") && !o.contains_key("enum"),
            Some("object") => {
                o.contains_key("additionalProperties") && !o.contains_key("maxProperties")
            }
            _ => o.contains_key("x-kubernetes-int-or-string") && !o.contains_key("maxLength"),
        };
        if missing {
            found.push(at.to_owned());
        }
        for (k, child) in o {
            unbounded(child, &format!("{at}.{k}"), found);
        }
    }

    #[test]
    fn inlined_kubernetes_types_bound_every_list_map_and_string() {
        let mut v = json!({ "$ref": "#/definitions/io.k8s.api.core.v1.Container" });
        inline_refs(&mut v).unwrap();
        let p = &v["properties"];
        assert_eq!(p["env"]["maxItems"], MAX_ENV);
        assert_eq!(p["ports"]["maxItems"], MAX_ITEMS);
        assert_eq!(p["command"]["items"]["maxLength"], MAX_STRING);
        assert_eq!(
            p["env"]["items"]["properties"]["value"]["maxLength"],
            MAX_STRING
        );
        let limits = &p["resources"]["properties"]["limits"];
        assert_eq!(limits["maxProperties"], MAX_ENTRIES);
        assert_eq!(
            limits["additionalProperties"]["maxLength"],
            MAX_INT_OR_STRING
        );
        // Nothing is left unbounded, anywhere in the type.
        let mut found = Vec::new();
        unbounded(&v, "Container", &mut found);
        assert!(found.is_empty(), "unbounded: {found:?}");
    }

    #[test]
    fn unknown_refs_are_named() {
        let mut v = json!({ "$ref": "#/definitions/io.k8s.api.core.v1.Nope" });
        assert_eq!(
            inline_refs(&mut v).unwrap_err(),
            "#/definitions/io.k8s.api.core.v1.Nope"
        );
    }
}
