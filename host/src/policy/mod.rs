//! What the host refuses to apply whatever plugin rendered it: the rules a resource's children
//! are held to before anything reaches the API server, so that a resource never makes the
//! operator do what its author could not.
//!
//! - [`pod_security`]: every pod template held to the Pod Security Standards;
//! - [`reach`]: nothing named outside the resource's namespace, cluster-wide issuers, KMS URLs
//!   and Ingress annotations only from the lists the operator is given;
//! - [`names`]: the names a plugin describes itself with, checked as the API server checks them;
//! - [`admission`]: the references a resource may make only to objects its author may use,
//!   checked by the API server at admission.
//!
//! A refusal applies nothing for the resource: its status says `Stalled`, with each rule that
//! failed, until the resource (or the namespace, or the operator's settings) changes.

pub mod admission;
pub mod names;
pub mod pod_security;
pub mod reach;

use serde_json::Value;

pub use pod_security::Level;
pub use reach::Allowed;

/// The operator's settings for these rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rules {
    /// The Pod Security level of namespaces that enforce none (`--pod-security`).
    pub pod_security: Level,
    /// What rendered objects may name beyond their namespace.
    pub allowed: Allowed,
    /// Namespaces where a resource that asks to (its `wasm-operator.dev/adopt` annotation) may
    /// adopt objects no controller owns and that do not name it (`--adopt-in-namespace`: a
    /// migration, stated by whoever runs the operator).
    pub adopt_namespaces: std::collections::BTreeSet<String>,
}

impl Default for Rules {
    fn default() -> Self {
        Self {
            pod_security: Level::Baseline,
            allowed: Allowed::default(),
            adopt_namespaces: std::collections::BTreeSet::new(),
        }
    }
}

/// Why the children of one resource are not applied: a CamelCase reason (`PodSecurity`,
/// `OutsideNamespace`, `NotAllowed`) and what failed, object by object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// For conditions and events.
    pub reason: &'static str,
    /// Which object, and each rule it fails.
    pub message: String,
}

/// Judges every rendered object of a resource in `namespace`, whose Pod Security level is
/// `level`. Empty: all may be applied.
pub fn judge(rules: &Rules, namespace: &str, level: Level, objects: &[Value]) -> Vec<Refusal> {
    let mut refusals = Vec::new();
    for object in objects {
        let text = |p: &str| object.pointer(p).and_then(Value::as_str).unwrap_or("");
        let what = format!("{} {}", text("/kind"), text("/metadata/name"));
        let violations = pod_security::check(level, object);
        if !violations.is_empty() {
            refusals.push(Refusal {
                reason: "PodSecurity",
                message: format!("{what} {}", pod_security::message(level, &violations)),
            });
        }
        let reached = reach::check(&rules.allowed, namespace, object);
        if !reached.namespaces.is_empty() {
            refusals.push(Refusal {
                reason: "OutsideNamespace",
                message: format!("{what}: {}", reached.namespaces.join("; ")),
            });
        }
        if !reached.not_allowed.is_empty() {
            refusals.push(Refusal {
                reason: "NotAllowed",
                message: format!("{what}: {}", reached.not_allowed.join("; ")),
            });
        }
    }
    refusals
}

/// The level a namespace enforces, from its labels; `default` where it names none (or names one
/// this host does not know, which the API server refuses to store anyway).
pub fn level_of(
    labels: Option<&std::collections::BTreeMap<String, String>>,
    default: Level,
) -> Level {
    labels
        .and_then(|l| l.get(pod_security::ENFORCE_LABEL))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_privileged_deployment_and_a_foreign_secret_are_both_named() {
        let objects = [
            json!({ "apiVersion": "apps/v1", "kind": "Deployment", "metadata": { "name": "web" },
                "spec": { "template": { "spec": { "containers": [
                    { "name": "app", "image": "x", "securityContext": { "privileged": true } }] } } } }),
            json!({ "apiVersion": "kms.hanzo.ai/v1", "kind": "KMSSecret", "metadata": { "name": "web" },
                "spec": { "credentialsRef": { "secretNamespace": "kms-system" } } }),
            json!({ "apiVersion": "v1", "kind": "Service", "metadata": { "name": "web" }, "spec": {} }),
        ];
        let refusals = judge(&Rules::default(), "team", Level::Baseline, &objects);
        assert_eq!(refusals.len(), 2, "{refusals:?}");
        assert_eq!(refusals[0].reason, "PodSecurity");
        assert!(
            refusals[0]
                .message
                .starts_with("Deployment web violates PodSecurity \"baseline:latest\": privileged"),
            "{}",
            refusals[0].message
        );
        assert_eq!(refusals[1].reason, "OutsideNamespace");
        assert!(
            refusals[1]
                .message
                .starts_with("KMSSecret web: spec.credentialsRef.secretNamespace")
        );
        // A privileged namespace lets the Deployment be.
        let refusals = judge(&Rules::default(), "team", Level::Privileged, &objects);
        assert_eq!(refusals.len(), 1);
    }

    #[test]
    fn a_namespace_label_wins_over_the_default() {
        let labels: std::collections::BTreeMap<String, String> = [(
            pod_security::ENFORCE_LABEL.to_owned(),
            "privileged".to_owned(),
        )]
        .into();
        assert_eq!(level_of(Some(&labels), Level::Baseline), Level::Privileged);
        assert_eq!(level_of(None, Level::Restricted), Level::Restricted);
        let odd: std::collections::BTreeMap<String, String> =
            [(pod_security::ENFORCE_LABEL.to_owned(), "lax".to_owned())].into();
        assert_eq!(level_of(Some(&odd), Level::Baseline), Level::Baseline);
    }
}
