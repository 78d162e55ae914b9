//! Groups, versions, kinds and resource names, written and read as the API server does. A leaf:
//! it imports nothing of the crate.

/// Splits an apiVersion into group and version (`v1` is the core group).
pub fn split_api_version(api_version: &str) -> (&str, &str) {
    api_version.split_once('/').unwrap_or(("", api_version))
}

/// The apiVersion of `version` in `group`: `group/version`, or `version` alone in the core
/// group.
pub fn api_version(group: &str, version: &str) -> String {
    if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    }
}

/// The resource name of a kind, as Kubernetes guesses it when nothing says otherwise
/// (`UnsafeGuessKindToResource`): lower case; `-s` takes `-es`, `-y` takes `-ies`, else `-s`.
pub fn plural(kind: &str) -> String {
    let lower = kind.to_lowercase();
    if lower.ends_with('s') {
        format!("{lower}es")
    } else if let Some(stem) = lower.strip_suffix('y') {
        format!("{stem}ies")
    } else {
        format!("{lower}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_versions_split_and_join_with_the_core_group_bare() {
        assert_eq!(split_api_version("apps/v1"), ("apps", "v1"));
        assert_eq!(split_api_version("v1"), ("", "v1"));
        assert_eq!(api_version("apps", "v1"), "apps/v1");
        assert_eq!(api_version("", "v1"), "v1");
    }

    #[test]
    fn plurals_as_kubernetes_guesses_them() {
        for (kind, want) in [
            ("Deployment", "deployments"),
            ("Ingress", "ingresses"),
            ("NetworkPolicy", "networkpolicies"),
            ("KMSSecret", "kmssecrets"),
            ("ServiceMonitor", "servicemonitors"),
            ("HorizontalPodAutoscaler", "horizontalpodautoscalers"),
        ] {
            assert_eq!(plural(kind), want);
        }
    }
}
