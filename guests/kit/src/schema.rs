//! OpenAPI v3 building blocks for a Kind's spec schema.
//!
//! Kubernetes-native fields are described with [`k8s`], a `$ref` to the Kubernetes type by its
//! OpenAPI name; the host inlines the exact schema of the Kubernetes version it was built for, so
//! the API server neither prunes nor loosely validates them.

use serde_json::{Map, Value, json};

/// The longest a [`string`] may be unless bounded otherwise ([`max_length`]): room for any
/// name, path or URL a spec holds.
pub const MAX_STRING: u64 = 1024;

/// The most items an [`array`] may hold unless bounded otherwise ([`max_items`]).
pub const MAX_ITEMS: u64 = 256;

/// The most entries a [`string_map`] may hold, and the longest each value may be.
pub const MAX_MAP_ENTRIES: u64 = 64;
/// See [`MAX_MAP_ENTRIES`].
pub const MAX_MAP_VALUE: u64 = 16 << 10;

/// The longest an int-or-string's string form may be (a quantity, a percentage, a port name).
pub const MAX_INT_OR_STRING: u64 = 64;

// Every list, map and string a builder makes is bounded: the API server then refuses a spec
// that would have a render copy it over and over (a Service's Ingress repeats every path rule
// under every host), before any plugin runs. A Kind that needs more or less says so with
// [`max_items`] and [`max_length`].

/// A reference to a Kubernetes type, for example `io.k8s.api.core.v1.Volume`. The host bounds
/// the lists, maps and strings of the type it inlines.
pub fn k8s(definition: &str) -> Value {
    json!({ "$ref": format!("#/definitions/{definition}") })
}

/// A string of at most [`MAX_STRING`] bytes.
pub fn string(description: &str) -> Value {
    json!({ "type": "string", "description": description, "maxLength": MAX_STRING })
}

/// An undescribed string of at most `max` bytes, for the items of a list.
pub fn string_item(max: u64) -> Value {
    json!({ "type": "string", "maxLength": max })
}

/// A string from a fixed set.
pub fn enumeration(description: &str, values: &[&str]) -> Value {
    let longest = values.iter().map(|v| v.len()).max().unwrap_or(0);
    json!({ "type": "string", "description": description, "enum": values, "maxLength": longest })
}

/// An integer (`int32` unless `format` says otherwise).
pub fn integer(description: &str) -> Value {
    json!({ "type": "integer", "format": "int32", "description": description })
}

/// A boolean.
pub fn boolean(description: &str) -> Value {
    json!({ "type": "boolean", "description": description })
}

/// An int or a string (a port by number or name, a percentage), its string form at most
/// [`MAX_INT_OR_STRING`] bytes.
pub fn int_or_string(description: &str) -> Value {
    json!({ "x-kubernetes-int-or-string": true, "description": description, "maxLength": MAX_INT_OR_STRING })
}

/// A list of at most [`MAX_ITEMS`] `items`.
pub fn array(description: &str, items: Value) -> Value {
    json!({ "type": "array", "description": description, "items": items, "maxItems": MAX_ITEMS })
}

/// A map of at most [`MAX_MAP_ENTRIES`] strings, each at most [`MAX_MAP_VALUE`] bytes.
pub fn string_map(description: &str) -> Value {
    json!({
        "type": "object",
        "description": description,
        "additionalProperties": { "type": "string", "maxLength": MAX_MAP_VALUE },
        "maxProperties": MAX_MAP_ENTRIES,
    })
}

/// A map of at most 32 labels (label values: at most 63 bytes), as Kubernetes bounds a value.
pub fn label_map(description: &str) -> Value {
    json!({
        "type": "object",
        "description": description,
        "additionalProperties": { "type": "string", "maxLength": 63 },
        "maxProperties": 32,
    })
}

/// `schema` (a list) holding at most `n` items.
pub fn max_items(mut schema: Value, n: u64) -> Value {
    schema["maxItems"] = n.into();
    schema
}

/// `schema` (a string) at most `n` bytes long.
pub fn max_length(mut schema: Value, n: u64) -> Value {
    schema["maxLength"] = n.into();
    schema
}

/// An object with the given properties (in order) and required ones.
pub fn object(description: &str, properties: &[(&str, Value)], required: &[&str]) -> Value {
    let props: Map<String, Value> = properties
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect();
    let mut o = json!({ "type": "object", "description": description, "properties": props });
    if !required.is_empty() {
        o["required"] = json!(required);
    }
    o
}

/// `spec.image`.
pub fn image() -> Value {
    object(
        "The container image.",
        &[
            (
                "repository",
                max_length(
                    string("Registry and repository, for example ghcr.io/hanzoai/example."),
                    512,
                ),
            ),
            ("tag", max_length(string("Image tag."), 256)),
            (
                "pullPolicy",
                enumeration("Image pull policy.", &["Always", "IfNotPresent", "Never"]),
            ),
        ],
        &["repository"],
    )
}

/// `spec.ports`.
pub fn ports() -> Value {
    let ports = array(
        "Ports the container listens on and the Service exposes.",
        object(
            "A port.",
            &[
                (
                    "name",
                    max_length(
                        string("Port name; required when there is more than one port."),
                        15,
                    ),
                ),
                (
                    "containerPort",
                    integer("The port the container listens on."),
                ),
                (
                    "servicePort",
                    integer("The port the Service exposes (default: containerPort)."),
                ),
                (
                    "protocol",
                    enumeration("Protocol (default TCP).", &["TCP", "UDP", "SCTP"]),
                ),
            ],
            &["containerPort"],
        ),
    );
    // Each port is copied into the container, every Service and the NetworkPolicy.
    max_items(ports, 64)
}

/// A probe in short form or with a Kubernetes handler.
pub fn probe(description: &str) -> Value {
    object(
        description,
        &[
            ("path", string("HTTP GET path.")),
            (
                "port",
                int_or_string("HTTP GET port by number or name (default: the first port)."),
            ),
            (
                "scheme",
                enumeration("HTTP GET scheme.", &["HTTP", "HTTPS"]),
            ),
            ("exec", k8s("io.k8s.api.core.v1.ExecAction")),
            ("tcpSocket", k8s("io.k8s.api.core.v1.TCPSocketAction")),
            ("httpGet", k8s("io.k8s.api.core.v1.HTTPGetAction")),
            ("grpc", k8s("io.k8s.api.core.v1.GRPCAction")),
            (
                "initialDelaySeconds",
                integer("Seconds before the first probe."),
            ),
            ("periodSeconds", integer("Seconds between probes.")),
            (
                "timeoutSeconds",
                integer("Seconds before a probe times out."),
            ),
            (
                "failureThreshold",
                integer("Failures before the probe fails."),
            ),
            (
                "successThreshold",
                integer("Successes before the probe passes."),
            ),
        ],
        &[],
    )
}

/// `spec.networkPolicy`.
pub fn network_policy() -> Value {
    object(
        "A NetworkPolicy for the pods: ingress only on the declared ports.",
        &[
            ("enabled", boolean("On unless false.")),
            (
                "allowFrom",
                max_items(
                    array(
                        "Allowed sources.",
                        k8s("io.k8s.api.networking.v1.NetworkPolicyPeer"),
                    ),
                    128,
                ),
            ),
            ("allowIngress", boolean("Allow every source.")),
            (
                "allowIntraNamespace",
                boolean("Allow pods of the same namespace (default true)."),
            ),
        ],
        &[],
    )
}

/// `spec.serviceMonitor`.
pub fn service_monitor() -> Value {
    object(
        "A Prometheus Operator ServiceMonitor for the Service.",
        &[
            ("enabled", boolean("On unless false.")),
            (
                "port",
                string("Name of the Service port to scrape (default: the first named port)."),
            ),
            ("metricsPort", string("Alias of port.")),
            ("path", string("Path to scrape (default /metrics).")),
            ("metricsPath", string("Alias of path.")),
            ("interval", string("Scrape interval, for example 30s.")),
        ],
        &[],
    )
}

/// `spec.kmsSecrets`.
pub fn kms_secrets() -> Value {
    let secrets = array(
        "Secrets kept filled from KMS; each becomes a KMSSecret.",
        object(
            "A KMS-managed Secret.",
            &[
                ("hostAPI", string("KMS API address.")),
                ("hostApi", string("Alias of hostAPI.")),
                ("projectSlug", string("KMS project.")),
                ("envSlug", string("KMS environment.")),
                (
                    "secretsPath",
                    string("Path of the secrets in the project (default /)."),
                ),
                (
                    "credentialsRef",
                    object(
                        "Secret holding the machine identity's credentials.",
                        &[
                            ("name", string("Secret name.")),
                            ("namespace", string("Secret namespace.")),
                        ],
                        &["name"],
                    ),
                ),
                (
                    "resyncInterval",
                    integer("Seconds between syncs (default 60, minimum 10)."),
                ),
                (
                    "managedSecretName",
                    string("The Secret the KMS operator fills."),
                ),
                (
                    "name",
                    string("Name of the KMSSecret (default: the managed Secret's name)."),
                ),
                (
                    "keys",
                    // Joined into one annotation of the KMSSecret.
                    array("Only these keys.", string_item(253)),
                ),
                ("secretName", string("Alias of managedSecretName.")),
                (
                    "creationPolicy",
                    enumeration("Owner of the managed Secret.", &["Orphan", "Owner"]),
                ),
            ],
            &[],
        ),
    );
    // Each becomes an object of its own, carrying every label of the resource.
    max_items(secrets, 16)
}

/// The properties every workload Kind shares, matching [`crate::render::Workload`].
pub fn workload_properties() -> Vec<(&'static str, Value)> {
    let core = |t: &str| k8s(&format!("io.k8s.api.core.v1.{t}"));
    vec![
        ("image", image()),
        ("replicas", integer("Desired pod count.")),
        ("ports", ports()),
        (
            "env",
            max_items(
                array(
                    "Environment of the main container, passed through unchanged.",
                    core("EnvVar"),
                ),
                512,
            ),
        ),
        (
            "envFrom",
            max_items(
                array(
                    "Environment sources, passed through unchanged.",
                    core("EnvFromSource"),
                ),
                64,
            ),
        ),
        (
            "volumes",
            array("Pod volumes, passed through unchanged.", core("Volume")),
        ),
        (
            "volumeMounts",
            array("Mounts of the main container.", core("VolumeMount")),
        ),
        ("resources", core("ResourceRequirements")),
        ("livenessProbe", probe("Liveness probe.")),
        ("readinessProbe", probe("Readiness probe.")),
        ("startupProbe", probe("Startup probe.")),
        (
            "probes",
            object(
                "Legacy probes: Kubernetes probes by role.",
                &[
                    ("readiness", core("Probe")),
                    ("liveness", core("Probe")),
                    ("startup", core("Probe")),
                ],
                &[],
            ),
        ),
        ("kmsSecrets", kms_secrets()),
        (
            "sidecars",
            max_items(
                array(
                    "Extra containers, passed through unchanged.",
                    core("Container"),
                ),
                32,
            ),
        ),
        (
            "initContainers",
            max_items(
                array(
                    "Init containers, passed through unchanged.",
                    core("Container"),
                ),
                32,
            ),
        ),
        (
            "imagePullSecrets",
            max_items(
                array("Registry credentials.", core("LocalObjectReference")),
                32,
            ),
        ),
        (
            "serviceAccountName",
            max_length(string("Service account of the pods."), 253),
        ),
        (
            "command",
            array("Entrypoint override.", string_item(64 << 10)),
        ),
        ("args", array("Arguments override.", string_item(64 << 10))),
        (
            "partOf",
            string("Value of the app.kubernetes.io/part-of label."),
        ),
        (
            "component",
            string("Value of the app.kubernetes.io/component label."),
        ),
        ("labels", label_map("Labels for every object and the pods.")),
        (
            "annotations",
            string_map("Annotations for the workload and its pods."),
        ),
        ("nodeSelector", label_map("Pod node selector.")),
        (
            "tolerations",
            max_items(array("Pod tolerations.", core("Toleration")), 64),
        ),
        ("affinity", core("Affinity")),
        ("priorityClassName", string("Pod priority class.")),
        ("securityContext", core("PodSecurityContext")),
        ("containerSecurityContext", core("SecurityContext")),
        ("enableServiceLinks", boolean("Pod enableServiceLinks.")),
        ("networkPolicy", network_policy()),
        ("serviceMonitor", service_monitor()),
    ]
}

/// Every field of [`workload_properties`] that names another object of the resource's namespace
/// (contract 1.2): the ServiceAccount of the pods, the Secrets and ConfigMaps of the main
/// container's, the sidecars' and the init containers' environments, of the volumes, the image
/// pull Secrets, and the Secrets of `kmsSecrets` (the credentials read, and the Secret the KMS
/// operator writes).
pub fn workload_references() -> Vec<crate::Reference> {
    use crate::{Reference, ReferenceTarget::*};
    let mut refs = vec![
        Reference::new("spec.serviceAccountName", ServiceAccount),
        Reference::new("spec.imagePullSecrets[].name", Secret),
        Reference::new("spec.kmsSecrets[].credentialsRef.name", Secret),
        Reference::new("spec.kmsSecrets[].managedSecretName", Secret),
        Reference::new("spec.kmsSecrets[].secretName", Secret),
    ];
    for container in ["spec", "spec.sidecars[]", "spec.initContainers[]"] {
        for (path, target) in [
            ("env[].valueFrom.secretKeyRef.name", Secret),
            ("env[].valueFrom.configMapKeyRef.name", ConfigMap),
            ("envFrom[].secretRef.name", Secret),
            ("envFrom[].configMapRef.name", ConfigMap),
        ] {
            refs.push(Reference::new(&format!("{container}.{path}"), target));
        }
    }
    for (path, target) in [
        ("secret.secretName", Secret),
        ("configMap.name", ConfigMap),
        ("projected.sources[].secret.name", Secret),
        ("projected.sources[].configMap.name", ConfigMap),
        ("csi.nodePublishSecretRef.name", Secret),
        ("cephfs.secretRef.name", Secret),
        ("rbd.secretRef.name", Secret),
        ("iscsi.secretRef.name", Secret),
        ("flexVolume.secretRef.name", Secret),
        ("azureFile.secretName", Secret),
        ("scaleIO.secretRef.name", Secret),
        ("storageos.secretRef.name", Secret),
    ] {
        refs.push(Reference::new(&format!("spec.volumes[].{path}"), target));
    }
    refs
}
