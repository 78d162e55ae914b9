//! Access: before a Plugin is served, the operator's own ServiceAccount is asked (access
//! reviews) whether it may do what the plugin's Kinds and child kinds need.

use super::*;

impl Loader {
    /// Refuses a plugin whose Kinds or child kinds the operator's ServiceAccount may not read
    /// or write, naming the first rule missing.
    pub(super) async fn allowed(&self, plugin: &Plugin) -> Result<(), Refusal> {
        let mut wanted: Vec<(String, String, Option<String>, &[&str])> = vec![(
            "apiextensions.k8s.io".into(),
            "customresourcedefinitions".into(),
            None,
            &["get", "create", "patch"],
        )];
        // A plugin whose Kinds name other objects brings admission policies (contract 1.2).
        if plugin.info().kinds.iter().any(|k| !k.references.is_empty()) {
            for resource in [
                "validatingadmissionpolicies",
                "validatingadmissionpolicybindings",
            ] {
                wanted.push((
                    "admissionregistration.k8s.io".into(),
                    resource.into(),
                    None,
                    &["get", "create", "patch"],
                ));
            }
        }
        // In every namespace the operator watches (or cluster-wide).
        for namespace in self.settings.scopes() {
            for kind in &plugin.info().kinds {
                wanted.push((
                    kind.group.clone(),
                    kind.plural.clone(),
                    namespace.clone(),
                    &["get", "list", "watch"],
                ));
                wanted.push((
                    kind.group.clone(),
                    format!("{}/status", kind.plural),
                    namespace.clone(),
                    &["patch"],
                ));
            }
            for child in &plugin.info().children {
                wanted.push((
                    child.group.clone(),
                    crate::gvk::plural(&child.kind),
                    namespace.clone(),
                    &["get", "list", "watch", "create", "patch", "delete"],
                ));
            }
        }
        let api: Api<SelfSubjectAccessReview> = Api::all(self.shared.client.clone());
        for (group, resource, namespace, verbs) in wanted {
            for verb in verbs {
                let (plural, subresource) = match resource.split_once('/') {
                    Some((p, s)) => (p.to_owned(), Some(s.to_owned())),
                    None => (resource.clone(), None),
                };
                let review = SelfSubjectAccessReview {
                    spec: SelfSubjectAccessReviewSpec {
                        resource_attributes: Some(ResourceAttributes {
                            group: Some(group.clone()),
                            resource: Some(plural),
                            subresource,
                            verb: Some((*verb).to_owned()),
                            namespace: namespace.clone(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                    ..Default::default()
                };
                let answer = api
                    .create(&PostParams::default(), &review)
                    .await
                    .map_err(|e| Refusal::transient("AccessReviewFailed", e.to_string()))?;
                if !answer.status.is_some_and(|s| s.allowed) {
                    let group_shown = if group.is_empty() { "\"\"" } else { &group };
                    return Err(Refusal::stalled(
                        "Forbidden",
                        format!(
                            "the operator's ServiceAccount may not {verb} {resource}{}{}: grant the rule {{apiGroups: [{group_shown}], resources: [{resource}], verbs: [{verb}]}} (`host rbac --plugin {}` prints every rule the plugin needs)",
                            if group.is_empty() {
                                String::new()
                            } else {
                                format!(".{group}")
                            },
                            namespace
                                .as_deref()
                                .map(|n| format!(" in namespace {n}"))
                                .unwrap_or_default(),
                            plugin
                                .source()
                                .split('(')
                                .nth(1)
                                .map(|s| s.trim_end_matches(')'))
                                .unwrap_or(plugin.source()),
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}
