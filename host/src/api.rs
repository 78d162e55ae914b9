//! The operator's own API: the `Plugin` resource (`wasm-operator.dev/v1alpha1`, cluster-scoped)
//! by which a cluster admin serves a plugin from an OCI registry, its typed spec and status, and
//! the CRD generated from them. What `host run` watches and what `host rbac` grants on it are
//! read from here.

use kube::CustomResource;
use kube::CustomResourceExt as _;
use kube::core::GroupVersionKind;
use kube::discovery::ApiResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The group of the `Plugin` Kind.
pub const GROUP: &str = "wasm-operator.dev";
/// The version of the `Plugin` Kind.
pub const VERSION: &str = "v1alpha1";
/// The Kind that names a plugin to serve.
pub const KIND: &str = "Plugin";
/// Its resource name.
pub const PLURAL: &str = "plugins";
/// The annotation on a CRD that a `Plugin` installed: the Plugin's name. A CRD without it (or
/// naming another Plugin) is not the Plugin's, and is never written.
pub const CRD_OWNER: &str = "wasm-operator.dev/plugin-resource";

/// The longest image reference a Plugin may name: a registry, a repository path, a tag and a
/// digest fit in far less.
const MAX_IMAGE: usize = 1024;
/// The longest duration or size of a Plugin's limits (`1500ms`, `64Mi`).
const MAX_LIMIT: usize = 32;

/// What a Plugin asks for: its component, pinned by digest, and the sandbox of its calls.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "wasm-operator.dev",
    version = "v1alpha1",
    kind = "Plugin",
    plural = "plugins",
    singular = "plugin",
    category = "wasm-operator",
    status = "PluginStatus",
    doc = "A plugin served by the wasm-operator, loaded live from an OCI registry.",
    printcolumn = r#"{"name": "Plugin", "type": "string", "jsonPath": ".status.plugin"}"#,
    printcolumn = r#"{"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name": "Status", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].message", "priority": 1}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
pub struct PluginSpec {
    /// The component: oci://REGISTRY/REPOSITORY[:TAG]@sha256:DIGEST (pinned by digest).
    #[schemars(regex(pattern = r"^(oci://)?[^@]+@sha256:[0-9a-f]{64}$"), length(max = MAX_IMAGE))]
    pub image: String,
    /// The sandbox of each call, each at most the operator's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<PluginLimits>,
}

/// The sandbox limits a Plugin asks for; each is lowered to the operator's own when above it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PluginLimits {
    /// How long one call may run (`500ms`, `2s`, `1m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]+(\.[0-9]+)?(ms|s|m)?$"), length(max = MAX_LIMIT))]
    pub timeout: Option<String>,
    /// How much memory one call may grow to (`64Mi`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]+(Ki|Mi|Gi)?B?$"), length(max = MAX_LIMIT))]
    pub memory: Option<String>,
    /// How many bytes of manifests one call may return (`4Mi`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]+(Ki|Mi|Gi)?B?$"), length(max = MAX_LIMIT))]
    pub output: Option<String>,
    /// How many manifests one render may return.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_manifests: Option<i32>,
}

/// What the operator says of a Plugin.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PluginStatus {
    /// The generation these fields were written for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// kstatus conditions: `Ready`, `Reconciling`, `Stalled`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub conditions: Vec<PluginCondition>,
    /// The reference served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_IMAGE))]
    pub image: Option<String>,
    /// The manifest digest served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub digest: Option<String>,
    /// The component's sha256.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub sha256: Option<String>,
    /// Its name and version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub plugin: Option<String>,
    /// The Kinds it serves (`Kind.group`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256), inner(length(max = 316)))]
    pub kinds: Vec<String>,
    /// What the operator's signature policy (`--plugin-signatures`) said of the version served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<PluginSignature>,
}

/// Who signed the version of a Plugin that is served, as the operator's signature policy
/// judged it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PluginSignature {
    /// The rule of the policy that decided: `rules[N] (PATTERN, ...)`.
    #[schemars(length(max = 1024))]
    pub rule: String,
    /// Each signature that counts: `key FILE (SHA256:...) (cosign)`, `certificate of SUBJECT
    /// (issuer ISSUER) (bundle)`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(max = 1024)))]
    pub signed_by: Vec<String>,
    /// Why it is served without a signature that counts, when the rule does not require one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub unverified: Option<String>,
}

/// One kstatus condition of a Plugin.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PluginCondition {
    /// `Ready`, `Reconciling` or `Stalled`.
    #[serde(rename = "type")]
    #[schemars(length(max = 64))]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    #[schemars(length(max = 16))]
    pub status: String,
    /// Why, in CamelCase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub reason: Option<String>,
    /// Why, for a person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32768))]
    pub message: Option<String>,
    /// The generation it was written for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// When its status last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64), extend("format" = "date-time"))]
    pub last_transition_time: Option<String>,
}

/// The `Plugin` resource.
pub fn api_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, KIND), PLURAL)
}

/// The CRD of the `Plugin` Kind, generated from [`PluginSpec`] and [`PluginStatus`], labelled
/// as every CRD the operator makes.
pub fn crd() -> Value {
    let mut crd = Plugin::crd();
    crd.metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert(
            "app.kubernetes.io/managed-by".into(),
            "wasm-operator".into(),
        );
    let mut crd = serde_json::to_value(crd).unwrap_or(Value::Null);
    whole_numbers(&mut crd);
    crd
}

/// Bounds written as whole numbers (`minimum: 1`), as YAML and the API server give them back:
/// the typed CRD holds every bound as a float.
fn whole_numbers(v: &mut Value) {
    match v {
        Value::Number(n) => {
            if let Some(f) = n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 1e15) {
                // Whole and within i64's exact range: the cast loses nothing.
                #[expect(
                    clippy::cast_possible_truncation,
                    reason = "checked whole and in range"
                )]
                let whole = f as i64;
                *v = Value::from(whole);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(whole_numbers),
        Value::Object(map) => map.values_mut().for_each(whole_numbers),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generated_crd_names_the_kind_as_the_operator_watches_it() {
        let crd = crd();
        assert_eq!(crd["metadata"]["name"], format!("{PLURAL}.{GROUP}"));
        assert_eq!(crd["spec"]["scope"], "Cluster");
        assert_eq!(crd["spec"]["names"]["kind"], KIND);
        assert_eq!(crd["spec"]["versions"][0]["name"], VERSION);
        let ar = api_resource();
        assert_eq!((ar.group.as_str(), ar.plural.as_str()), (GROUP, PLURAL));
    }

    #[test]
    fn a_spec_reads_with_and_without_limits() {
        let spec: PluginSpec = serde_json::from_value(serde_json::json!({
            "image": "oci://r/p@sha256:00",
            "limits": { "timeout": "2s", "maxManifests": 10 },
        }))
        .unwrap();
        let limits = spec.limits.unwrap();
        assert_eq!(limits.timeout.as_deref(), Some("2s"));
        assert_eq!(limits.max_manifests, Some(10));
        assert_eq!(limits.memory, None);
        let bare: PluginSpec =
            serde_json::from_value(serde_json::json!({ "image": "x@sha256:00" })).unwrap();
        assert_eq!(bare.limits, None);
    }
}
