//! What the API server would say, for the parts the fuzzer can judge offline: whether a spec is
//! one the Kind's CRD accepts, and whether a rendered object is a valid object of its kind.

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::batch::v1::CronJob;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::networking::v1::{Ingress, NetworkPolicy};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Marks the schema of a Kubernetes type inlined where the plugin named it with `$ref`; the
/// value is the type's OpenAPI name.
pub const PASSED_THROUGH: &str = "x-fuzz-passed-through";

/// `schema` with every `$ref` to a Kubernetes type replaced by the type's schema (as the CRD
/// has it), marked [`PASSED_THROUGH`]; `None` when a `$ref` is unknown.
pub fn inline(mut schema: Value) -> Option<Value> {
    fn walk(v: &mut Value) -> bool {
        match v {
            Value::Object(o) => {
                if let Some(Value::String(r)) = o.get("$ref") {
                    let name = r.trim_start_matches("#/definitions/").to_owned();
                    let Some(Value::Object(inlined)) = host::kube_schema::kubernetes_schema(&name)
                    else {
                        return false;
                    };
                    o.remove("$ref");
                    for (k, val) in inlined {
                        o.entry(k).or_insert(val);
                    }
                    o.insert(PASSED_THROUGH.into(), Value::String(name));
                    return true;
                }
                o.values_mut().all(walk)
            }
            Value::Array(a) => a.iter_mut().all(walk),
            _ => true,
        }
    }
    walk(&mut schema).then_some(schema)
}

/// Whether `v` is what the structural `schema` describes: types, required fields, enums, and no
/// field the schema does not know (which the API server would prune).
///
/// A Kubernetes type the plugin passes through unchanged must also be a valid value of its Rust
/// type (k8s-openapi: `int32` ranges, required fields), unless `strict`: the plugins do not judge
/// those fields, the API server does when it is sent the child, so an object that fails there
/// because of one is not the plugin's doing. `--strict` judges them anyway: the host checks specs
/// against the Kind's schema, `int32` ranges included (`host::schema`), so such a spec is
/// refused before it is rendered. Integer ranges of the Kind's own fields are not checked here:
/// they are the plugin's to refuse, or the host's where the schema says `int32`.
pub fn conforms(v: &Value, schema: &Value, strict: bool) -> bool {
    if !strict
        && let Some(name) = schema.get(PASSED_THROUGH).and_then(Value::as_str)
        && !typed_as(name, v)
    {
        return false;
    }
    if schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        return v.is_i64() || v.is_u64() || v.is_string();
    }
    if let Some(options) = schema.get("enum").and_then(Value::as_array)
        && !options.contains(v)
    {
        return false;
    }
    let recurse = |child: &Value, s: &Value| conforms(child, s, strict);
    match (schema.get("type").and_then(Value::as_str), v) {
        (Some("string"), Value::String(_)) | (Some("boolean"), Value::Bool(_)) => true,
        (Some("integer"), Value::Number(n)) => n.is_i64() || n.is_u64(),
        (Some("number"), Value::Number(_)) => true,
        (Some("array"), Value::Array(items)) => {
            let item = schema.get("items").unwrap_or(&Value::Null);
            items.iter().all(|i| item.is_null() || recurse(i, item))
        }
        (Some("object") | None, Value::Object(m)) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let extra = schema.get("additionalProperties").filter(|a| a.is_object());
            let required_present =
                schema
                    .get("required")
                    .and_then(Value::as_array)
                    .is_none_or(|r| {
                        r.iter()
                            .filter_map(Value::as_str)
                            .all(|k| m.contains_key(k))
                    });
            required_present
                && m.iter()
                    .all(|(k, child)| match (props.and_then(|p| p.get(k)), extra) {
                        (Some(s), _) | (None, Some(s)) => recurse(child, s),
                        (None, None) => props.is_none() && schema.get("type").is_none(),
                    })
        }
        (None, _) => true,
        _ => false,
    }
}

/// Whether `v` is a valid value of the Kubernetes type named `definition` (those `crd.rs`
/// inlines); unknown names pass.
fn typed_as(definition: &str, v: &Value) -> bool {
    host::kube_schema::kubernetes_type(definition).is_none_or(|t| (t.accepts)(v))
}

fn typed<T: DeserializeOwned>(o: &Value) -> Result<(), String> {
    serde_json::from_value::<T>(o.clone())
        .map(drop)
        .map_err(|e| e.to_string())
}

/// Whether `o` is a valid object of its kind, as far as its Rust type (k8s-openapi) can tell —
/// types and `int32` ranges — plus the Service rule that no two ports share a number and
/// protocol, or a name. Kinds with no Rust type here (ServiceMonitor, KMSSecret) pass.
pub fn valid_object(o: &Value) -> Result<(), String> {
    let api_version = o["apiVersion"].as_str().unwrap_or("");
    let kind = o["kind"].as_str().unwrap_or("");
    match (api_version, kind) {
        ("apps/v1", "Deployment") => typed::<Deployment>(o),
        ("apps/v1", "StatefulSet") => typed::<StatefulSet>(o),
        ("v1", "Service") => typed::<Service>(o).and_then(|()| service_ports(o)),
        ("networking.k8s.io/v1", "Ingress") => typed::<Ingress>(o),
        ("networking.k8s.io/v1", "NetworkPolicy") => typed::<NetworkPolicy>(o),
        ("autoscaling/v2", "HorizontalPodAutoscaler") => typed::<HorizontalPodAutoscaler>(o),
        ("policy/v1", "PodDisruptionBudget") => typed::<PodDisruptionBudget>(o),
        ("batch/v1", "CronJob") => typed::<CronJob>(o),
        _ => Ok(()),
    }
}

fn service_ports(o: &Value) -> Result<(), String> {
    let mut seen = std::collections::BTreeSet::new();
    let mut names = std::collections::BTreeSet::new();
    for (i, p) in o["spec"]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let key = (
            p["port"].to_string(),
            p["protocol"].as_str().unwrap_or("TCP").to_owned(),
        );
        if !seen.insert(key) {
            return Err(format!(
                "spec.ports[{i}]: port {} is there twice",
                p["port"]
            ));
        }
        if let Some(n) = p["name"].as_str()
            && !names.insert(n.to_owned())
        {
            return Err(format!("spec.ports[{i}]: the name `{n}` is there twice"));
        }
    }
    Ok(())
}
