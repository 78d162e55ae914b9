//! What a rendered object may point at beyond its resource's namespace. A tenant who may create
//! a `Service` in one namespace must not, through the operator, read another namespace's
//! Secret, send its certificates through any ClusterIssuer, point a KMS client at any URL or hand
//! the ingress controller configuration snippets. These rules judge the output, whatever plugin
//! rendered it.

use std::collections::BTreeSet;

use serde_json::Value;

/// The Ingress annotation cert-manager reads to pick a cluster-wide issuer.
pub const CLUSTER_ISSUER_ANNOTATION: &str = "cert-manager.io/cluster-issuer";

/// Ingress annotations passed through by default: common ingress-nginx settings of the traffic
/// to the resource's own backends. Snippets, authentication URLs, server aliases and mirrors are
/// not among them.
pub const DEFAULT_INGRESS_ANNOTATIONS: [&str; 20] = [
    "cert-manager.io/issuer",
    "kubernetes.io/ingress.class",
    "nginx.ingress.kubernetes.io/backend-protocol",
    "nginx.ingress.kubernetes.io/cors-allow-credentials",
    "nginx.ingress.kubernetes.io/cors-allow-headers",
    "nginx.ingress.kubernetes.io/cors-allow-methods",
    "nginx.ingress.kubernetes.io/cors-allow-origin",
    "nginx.ingress.kubernetes.io/enable-cors",
    "nginx.ingress.kubernetes.io/force-ssl-redirect",
    "nginx.ingress.kubernetes.io/limit-connections",
    "nginx.ingress.kubernetes.io/limit-rps",
    "nginx.ingress.kubernetes.io/proxy-body-size",
    "nginx.ingress.kubernetes.io/proxy-buffer-size",
    "nginx.ingress.kubernetes.io/proxy-connect-timeout",
    "nginx.ingress.kubernetes.io/proxy-read-timeout",
    "nginx.ingress.kubernetes.io/proxy-send-timeout",
    "nginx.ingress.kubernetes.io/rewrite-target",
    "nginx.ingress.kubernetes.io/ssl-redirect",
    "nginx.ingress.kubernetes.io/use-regex",
    "nginx.ingress.kubernetes.io/whitelist-source-range",
];

/// What the operator is told it may let rendered objects name outside their namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowed {
    /// ClusterIssuers an Ingress (its `cert-manager.io/cluster-issuer` annotation) or a
    /// cert-manager object (`issuerRef` of kind ClusterIssuer) may name.
    pub cluster_issuers: BTreeSet<String>,
    /// URLs a KMSSecret's `spec.hostAPI` may be; absent, the KMS operator's own default is used.
    pub kms_hosts: BTreeSet<String>,
    /// Ingress annotation keys passed through: exact keys, or prefixes ending in `*`. A key
    /// with `snippet` in it passes only when listed exactly, never through a prefix.
    pub ingress_annotations: Vec<String>,
}

impl Default for Allowed {
    fn default() -> Self {
        Self {
            cluster_issuers: BTreeSet::new(),
            kms_hosts: BTreeSet::new(),
            ingress_annotations: DEFAULT_INGRESS_ANNOTATIONS.map(str::to_owned).to_vec(),
        }
    }
}

impl Allowed {
    /// Whether an Ingress annotation key is passed through.
    pub fn ingress_annotation(&self, key: &str) -> bool {
        self.ingress_annotations.iter().any(|allowed| {
            if allowed == key {
                return true;
            }
            match allowed.strip_suffix('*') {
                Some(prefix) => key.starts_with(prefix) && !key.contains("snippet"),
                None => false,
            }
        })
    }
}

/// What an object reaches for that it may not: the fields naming another namespace, and those
/// naming what the operator was not given (ClusterIssuers, KMS URLs, Ingress annotations).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Reached {
    /// Each field naming another namespace, and which.
    pub namespaces: Vec<String>,
    /// Each field naming what is not on the operator's lists.
    pub not_allowed: Vec<String>,
}

impl Reached {
    /// Whether the object may be applied as rendered.
    pub fn is_empty(&self) -> bool {
        self.namespaces.is_empty() && self.not_allowed.is_empty()
    }
}

/// What an object reaches for that it may not; empty when it may be applied as rendered.
pub fn check(allowed: &Allowed, namespace: &str, object: &Value) -> Reached {
    let mut reached = Reached::default();
    let mut at = String::new();
    if let Some(spec) = object.get("spec") {
        at.push_str("spec");
        other_namespaces(spec, namespace, &mut at, &mut reached.namespaces);
        cluster_issuer_refs(spec, allowed, &mut at, &mut reached.not_allowed);
    }
    let refused = &mut reached.not_allowed;
    let kind = object.get("kind").and_then(Value::as_str).unwrap_or("");
    if kind == "Ingress" {
        let annotations = object
            .pointer("/metadata/annotations")
            .and_then(Value::as_object);
        for (key, value) in annotations.into_iter().flatten() {
            if key == CLUSTER_ISSUER_ANNOTATION {
                let issuer = value.as_str().unwrap_or("");
                if !allowed.cluster_issuers.contains(issuer) {
                    refuse(refused, || {
                        format!(
                            "metadata.annotations[{key}]: ClusterIssuer `{issuer}` is not one the operator may use ({}; --cluster-issuer)",
                            list(&allowed.cluster_issuers)
                        )
                    });
                }
            } else if !allowed.ingress_annotation(key) {
                refuse(refused, || {
                    format!(
                        "metadata.annotations[{key}]: this Ingress annotation is not passed through (--ingress-annotations lists those that are)"
                    )
                });
            }
        }
    }
    if kind == "KMSSecret"
        && let Some(host) = object.pointer("/spec/hostAPI")
    {
        let host = host.as_str().unwrap_or("");
        if !allowed.kms_hosts.contains(host) {
            refused.push(crate::units::bounded(format!(
                "spec.hostAPI: `{host}` is not a KMS API the operator may use ({}; --kms-host-api)",
                list(&allowed.kms_hosts)
            ), MAX_REFUSAL));
        }
    }
    reached
}

fn list(set: &BTreeSet<String>) -> String {
    if set.is_empty() {
        "none is allowed".to_owned()
    } else {
        format!(
            "allowed: {}",
            set.iter().cloned().collect::<Vec<_>>().join(", ")
        )
    }
}

/// The most refusals of one kind said of one object: a plugin could return a hundred thousand
/// fields, each of which would otherwise make a message.
const MAX_SAID: usize = 10;
/// The most bytes of one refusal (a path is as long as the plugin makes its keys).
const MAX_REFUSAL: usize = 512;

/// Adds a refusal, made only while fewer than [`MAX_SAID`] are said, and cut to [`MAX_REFUSAL`].
fn refuse(refused: &mut Vec<String>, make: impl FnOnce() -> String) {
    if refused.len() < MAX_SAID {
        refused.push(crate::units::bounded(make(), MAX_REFUSAL));
    } else if refused.len() == MAX_SAID {
        refused.push("and more".to_owned());
    }
}

/// Any field named `namespace` or `…Namespace` holding another namespace than the resource's:
/// a Secret reference into `kms-system`, a target elsewhere; and a Prometheus Operator
/// `namespaceSelector` that selects other namespaces (`any: true`, or `matchNames`), which would
/// scrape their pods. (A label selector of namespaces, as a NetworkPolicy's, lets traffic in and
/// reaches nothing: it is not this shape.)
fn other_namespaces(value: &Value, namespace: &str, at: &mut String, refused: &mut Vec<String>) {
    walk(value, at, &mut |path, key, v| {
        if key == "namespaceSelector" {
            if v.get("any") == Some(&Value::Bool(true)) {
                refuse(refused, || {
                    format!(
                        "{path}.any: selects every namespace; a resource may only refer to its own namespace `{namespace}`"
                    )
                });
            }
            let others: Vec<&str> = v
                .get("matchNames")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .filter(|n| *n != namespace)
                .collect();
            if !others.is_empty() {
                refuse(refused, || {
                    format!(
                        "{path}.matchNames: names namespace `{}`; a resource may only refer to its own namespace `{namespace}`",
                        others.join("`, `")
                    )
                });
            }
        }
        if (key == "namespace" || key.ends_with("Namespace"))
            && let Some(ns) = v.as_str()
            && !ns.is_empty()
            && ns != namespace
        {
            refuse(refused, || {
                format!(
                    "{path}: names namespace `{ns}`; a resource may only refer to its own namespace `{namespace}`"
                )
            });
        }
    });
}

/// cert-manager's `issuerRef` of kind ClusterIssuer (a Certificate's, say).
fn cluster_issuer_refs(
    value: &Value,
    allowed: &Allowed,
    at: &mut String,
    refused: &mut Vec<String>,
) {
    walk(value, at, &mut |path, key, v| {
        if key == "issuerRef" && v.get("kind").and_then(Value::as_str) == Some("ClusterIssuer") {
            let issuer = v.get("name").and_then(Value::as_str).unwrap_or("");
            if !allowed.cluster_issuers.contains(issuer) {
                refuse(refused, || {
                    format!(
                        "{path}: ClusterIssuer `{issuer}` is not one the operator may use ({}; --cluster-issuer)",
                        list(&allowed.cluster_issuers)
                    )
                });
            }
        }
    });
}

/// Calls `f(path, key, value)` for every field of every object under `value`, depth first;
/// `at` is the path so far (restored on return).
fn walk(value: &Value, at: &mut String, f: &mut dyn FnMut(&str, &str, &Value)) {
    let len = at.len();
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                at.push('.');
                at.push_str(k);
                f(at, k, v);
                walk(v, at, f);
                at.truncate(len);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                at.push_str(&format!("[{i}]"));
                walk(v, at, f);
                at.truncate(len);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use rstest::rstest;
    use serde_json::json;

    use super::*;

    fn allowed() -> Allowed {
        Allowed {
            cluster_issuers: ["letsencrypt-prod".to_owned()].into(),
            kms_hosts: ["https://kms.hanzo.ai/api".to_owned()].into(),
            ..Allowed::default()
        }
    }

    fn ingress(annotations: Value) -> Value {
        json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": { "name": "web", "namespace": "team", "annotations": annotations },
            "spec": { "rules": [] },
        })
    }

    fn kms(credentials_ns: &str, host: Option<&str>) -> Value {
        let mut o = json!({
            "apiVersion": "kms.hanzo.ai/v1", "kind": "KMSSecret",
            "metadata": { "name": "web", "namespace": "team" },
            "spec": {
                "authentication": { "universalAuth": { "credentialsRef": {
                    "secretName": "machine", "secretNamespace": credentials_ns } } },
                "managedKubeSecretReferences": [{ "secretName": "s", "secretNamespace": "team" }],
            },
        });
        if let Some(h) = host {
            o["spec"]["hostAPI"] = h.into();
        }
        o
    }

    #[rstest]
    #[case::own_namespace(kms("team", None))]
    #[case::listed_kms_host(kms("team", Some("https://kms.hanzo.ai/api")))]
    #[case::listed_cluster_issuer(ingress(json!({ "cert-manager.io/cluster-issuer": "letsencrypt-prod" })))]
    #[case::default_annotation(ingress(json!({ "nginx.ingress.kubernetes.io/proxy-body-size": "64m" })))]
    #[case::namespaced_issuer(ingress(json!({ "cert-manager.io/issuer": "team-ca" })))]
    #[case::pod_with_no_reach(json!({ "kind": "Deployment", "spec": { "template": { "spec": {
        "containers": [{ "name": "a", "env": [{ "name": "NAMESPACE", "value": "other" }] }] } } } }))]
    #[case::a_monitor_of_its_own_namespace(json!({ "kind": "ServiceMonitor", "spec": { "namespaceSelector": { "matchNames": ["team"] } } }))]
    #[case::traffic_from_labelled_namespaces(json!({ "kind": "NetworkPolicy", "spec": { "ingress": [{ "from": [{ "namespaceSelector": { "matchLabels": { "team": "ops" } } }] }] } }))]
    fn objects_that_stay_home_pass(#[case] object: Value) {
        assert_eq!(check(&allowed(), "team", &object), Reached::default());
    }

    #[rstest]
    #[case::secret_in_another_namespace(
        kms("kms-system", None),
        "spec.authentication.universalAuth.credentialsRef.secretNamespace: names namespace `kms-system`"
    )]
    #[case::any_kms_url(
        kms("team", Some("http://169.254.169.254/")),
        "spec.hostAPI: `http://169.254.169.254/` is not a KMS API"
    )]
    #[case::unlisted_cluster_issuer(ingress(json!({ "cert-manager.io/cluster-issuer": "internal-ca" })), "ClusterIssuer `internal-ca`")]
    #[case::configuration_snippet(ingress(json!({ "nginx.ingress.kubernetes.io/configuration-snippet": "more_set_headers x;" })), "configuration-snippet]: this Ingress annotation is not passed through")]
    #[case::auth_url(ingress(json!({ "nginx.ingress.kubernetes.io/auth-url": "http://x" })), "auth-url]")]
    #[case::certificate_issuer_ref(json!({ "kind": "Certificate", "spec": { "issuerRef": { "kind": "ClusterIssuer", "name": "internal-ca" } } }), "spec.issuerRef: ClusterIssuer `internal-ca`")]
    #[case::namespace_in_a_list(json!({ "kind": "Thing", "spec": { "targets": [{ "namespace": "kube-system" }] } }), "spec.targets[0].namespace: names namespace `kube-system`")]
    #[case::a_monitor_of_every_namespace(json!({ "kind": "ServiceMonitor", "spec": { "namespaceSelector": { "any": true } } }), "spec.namespaceSelector.any: selects every namespace")]
    #[case::a_monitor_of_another_namespace(json!({ "kind": "ServiceMonitor", "spec": { "namespaceSelector": { "matchNames": ["team", "payments"] } } }), "spec.namespaceSelector.matchNames: names namespace `payments`")]
    fn objects_that_reach_out_are_refused_naming_the_field(
        #[case] object: Value,
        #[case] expected: &str,
    ) {
        let reached = check(&allowed(), "team", &object);
        let refused: Vec<&String> = reached
            .namespaces
            .iter()
            .chain(&reached.not_allowed)
            .collect();
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert!(refused[0].contains(expected), "{refused:?}");
        // A namespace named is said apart from a name not on the operator's lists.
        assert_eq!(
            reached.namespaces.len(),
            usize::from(expected.contains("namespace"))
        );
    }

    #[test]
    fn a_flood_of_refusals_is_said_in_ten_short_ones() {
        let key = "k".repeat(1 << 20);
        let many: serde_json::Map<String, Value> = (0..10_000)
            .map(|i| (format!("n{i}Namespace"), Value::from("other")))
            .collect();
        let object = json!({ "kind": "Thing", "spec": { key: many } });
        let reached = check(&allowed(), "team", &object);
        assert_eq!(reached.namespaces.len(), MAX_SAID + 1);
        assert_eq!(reached.namespaces[MAX_SAID], "and more");
        assert!(
            reached
                .namespaces
                .iter()
                .all(|r| r.len() < MAX_REFUSAL + 64)
        );
    }

    #[rstest]
    #[case::exact("nginx.ingress.kubernetes.io/proxy-body-size", true)]
    #[case::prefix("example.com/anything", true)]
    #[case::snippet_through_a_prefix("example.com/server-snippet", false)]
    #[case::snippet_listed_exactly("example.com/configuration-snippet", true)]
    #[case::not_listed("nginx.ingress.kubernetes.io/server-alias", false)]
    fn ingress_annotations_pass_by_exact_key_or_prefix_and_snippets_only_exactly(
        #[case] key: &str,
        #[case] passes: bool,
    ) {
        let mut a = Allowed::default();
        a.ingress_annotations.push("example.com/*".into());
        a.ingress_annotations
            .push("example.com/configuration-snippet".into());
        assert_eq!(a.ingress_annotation(key), passes);
    }
}
