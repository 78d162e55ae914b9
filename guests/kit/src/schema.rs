//! OpenAPI v3 building blocks for a Kind's spec schema.
//!
//! Kubernetes-native fields are described with [`k8s`], a `$ref` to the Kubernetes type by its
//! OpenAPI name; the host inlines the exact schema of the Kubernetes version it was built for, so
//! the API server neither prunes nor loosely validates them.

use serde_json::{Map, Value, json};

/// A reference to a Kubernetes type, for example `io.k8s.api.core.v1.Volume`.
pub fn k8s(definition: &str) -> Value {
    json!({ "$ref": format!("#/definitions/{definition}") })
}

/// A string.
pub fn string(description: &str) -> Value {
    json!({ "type": "string", "description": description })
}

/// A string from a fixed set.
pub fn enumeration(description: &str, values: &[&str]) -> Value {
    json!({ "type": "string", "description": description, "enum": values })
}

/// An integer (`int32` unless `format` says otherwise).
pub fn integer(description: &str) -> Value {
    json!({ "type": "integer", "format": "int32", "description": description })
}

/// A boolean.
pub fn boolean(description: &str) -> Value {
    json!({ "type": "boolean", "description": description })
}

/// An int or a string (a port by number or name, a percentage).
pub fn int_or_string(description: &str) -> Value {
    json!({ "x-kubernetes-int-or-string": true, "description": description })
}

/// A list of `items`.
pub fn array(description: &str, items: Value) -> Value {
    json!({ "type": "array", "description": description, "items": items })
}

/// A map of strings.
pub fn string_map(description: &str) -> Value {
    json!({ "type": "object", "description": description, "additionalProperties": { "type": "string" } })
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
                string("Registry and repository, for example ghcr.io/hanzoai/example."),
            ),
            ("tag", string("Image tag.")),
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
    array(
        "Ports the container listens on and the Service exposes.",
        object(
            "A port.",
            &[
                (
                    "name",
                    string("Port name; required when there is more than one port."),
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
    )
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
                array(
                    "Allowed sources.",
                    k8s("io.k8s.api.networking.v1.NetworkPolicyPeer"),
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
    array(
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
                    array("Only these keys.", json!({ "type": "string" })),
                ),
                ("secretName", string("Alias of managedSecretName.")),
                (
                    "creationPolicy",
                    enumeration("Owner of the managed Secret.", &["Orphan", "Owner"]),
                ),
            ],
            &[],
        ),
    )
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
            array(
                "Environment of the main container, passed through unchanged.",
                core("EnvVar"),
            ),
        ),
        (
            "envFrom",
            array(
                "Environment sources, passed through unchanged.",
                core("EnvFromSource"),
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
            array(
                "Extra containers, passed through unchanged.",
                core("Container"),
            ),
        ),
        (
            "initContainers",
            array(
                "Init containers, passed through unchanged.",
                core("Container"),
            ),
        ),
        (
            "imagePullSecrets",
            array("Registry credentials.", core("LocalObjectReference")),
        ),
        ("serviceAccountName", string("Service account of the pods.")),
        (
            "command",
            array("Entrypoint override.", json!({ "type": "string" })),
        ),
        (
            "args",
            array("Arguments override.", json!({ "type": "string" })),
        ),
        (
            "partOf",
            string("Value of the app.kubernetes.io/part-of label."),
        ),
        (
            "component",
            string("Value of the app.kubernetes.io/component label."),
        ),
        (
            "labels",
            string_map("Labels for every object and the pods."),
        ),
        (
            "annotations",
            string_map("Annotations for the workload and its pods."),
        ),
        ("nodeSelector", string_map("Pod node selector.")),
        ("tolerations", array("Pod tolerations.", core("Toleration"))),
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
