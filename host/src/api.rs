//! The operator's own API: the `Plugin` resource (`wasm-operator.dev/v1alpha1`, cluster-scoped)
//! by which a cluster admin serves a plugin from an OCI registry, and its CRD. What `host run`
//! watches and what `host rbac` grants on it are read from here.

use kube::core::GroupVersionKind;
use kube::discovery::ApiResource;
use serde_json::{Value, json};

/// The group of the `Plugin` Kind.
pub const GROUP: &str = "wasm-operator.dev";
pub const VERSION: &str = "v1alpha1";
pub const KIND: &str = "Plugin";
/// Its resource name.
pub const PLURAL: &str = "plugins";
/// The annotation on a CRD that a `Plugin` installed: the Plugin's name. A CRD without it (or
/// naming another Plugin) is not the Plugin's, and is never written.
pub const CRD_OWNER: &str = "wasm-operator.dev/plugin-resource";

/// The `Plugin` resource.
pub fn api_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, KIND), PLURAL)
}

/// The CRD of the `Plugin` Kind.
pub fn crd() -> Value {
    let duration = json!({ "type": "string", "pattern": "^[0-9]+(\\.[0-9]+)?(ms|s|m)?$" });
    let size = json!({ "type": "string", "pattern": "^[0-9]+(Ki|Mi|Gi)?B?$" });
    let condition = json!({
        "type": "object",
        "required": ["type", "status"],
        "properties": {
            "type": { "type": "string" },
            "status": { "type": "string" },
            "reason": { "type": "string" },
            "message": { "type": "string" },
            "observedGeneration": { "type": "integer", "format": "int64" },
            "lastTransitionTime": { "type": "string", "format": "date-time" },
        },
    });
    let schema = json!({
        "type": "object",
        "description": "A plugin served by the wasm-operator, loaded live from an OCI registry.",
        "required": ["spec"],
        "properties": {
            "apiVersion": { "type": "string" },
            "kind": { "type": "string" },
            "metadata": { "type": "object" },
            "spec": {
                "type": "object",
                "required": ["image"],
                "properties": {
                    "image": {
                        "type": "string",
                        "description": "The component: oci://REGISTRY/REPOSITORY[:TAG]@sha256:DIGEST (pinned by digest).",
                        "pattern": "^(oci://)?[^@]+@sha256:[0-9a-f]{64}$",
                    },
                    "limits": {
                        "type": "object",
                        "description": "The sandbox of each call, each at most the operator's own.",
                        "properties": {
                            "timeout": duration,
                            "memory": size,
                            "output": size,
                            "maxManifests": { "type": "integer", "minimum": 1, "format": "int32" },
                        },
                    },
                },
            },
            "status": {
                "type": "object",
                "properties": {
                    "observedGeneration": { "type": "integer", "format": "int64" },
                    "conditions": { "type": "array", "items": condition },
                    "image": { "type": "string", "description": "The reference served." },
                    "digest": { "type": "string", "description": "The manifest digest served." },
                    "sha256": { "type": "string", "description": "The component's sha256." },
                    "plugin": { "type": "string", "description": "Its name and version." },
                    "kinds": { "type": "array", "items": { "type": "string" } },
                },
            },
        },
    });
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": format!("{PLURAL}.{GROUP}"),
            "labels": { "app.kubernetes.io/managed-by": "wasm-operator" },
        },
        "spec": {
            "group": GROUP,
            "names": { "kind": KIND, "listKind": "PluginList", "plural": PLURAL, "singular": "plugin", "categories": ["wasm-operator"] },
            "scope": "Cluster",
            "versions": [{
                "name": VERSION,
                "served": true,
                "storage": true,
                "schema": { "openAPIV3Schema": schema },
                "subresources": { "status": {} },
                "additionalPrinterColumns": [
                    { "name": "Plugin", "type": "string", "jsonPath": ".status.plugin" },
                    { "name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status" },
                    { "name": "Status", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].message", "priority": 1 },
                    { "name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp" },
                ],
            }],
        },
    })
}
