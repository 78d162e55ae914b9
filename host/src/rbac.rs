//! The least-privilege RBAC of `host run` for the loaded plugins (`host rbac`): read the Kinds
//! they serve and write their status, manage the child kinds they declare, record events, hold
//! the Lease. Every rule names its groups and resources; there is no `*`.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use crate::gvk::plural;
use crate::registry::Registry;

/// Where the operator runs: its ServiceAccount's namespace and name (also the Lease's namespace,
/// and the name of every object here).
#[derive(Debug, Clone)]
pub struct Target {
    /// The namespace of the ServiceAccount and the Lease.
    pub namespace: String,
    /// The name of the ServiceAccount, the roles and their bindings.
    pub name: String,
    /// The namespaces the operator watches (`host run --watch-namespace`): the ClusterRole is bound
    /// in each of them by a RoleBinding. Empty: bound cluster-wide by a ClusterRoleBinding.
    pub watch_namespaces: Vec<String>,
    /// Whether the operator serves `Plugin` resources (`host run --plugin-resources`).
    pub plugin_resources: bool,
    /// Whether it serves /metrics securely (`host run --metrics-secure`): then it asks the API
    /// server about each scrape's token (`<name>-metrics-auth`, bound cluster-wide).
    pub metrics_secure: bool,
    /// Whether it splits the resources into shards (`host run --shards`, more than one): then
    /// it labels each served resource with its shard (`patch` on the served Kinds), and lists,
    /// applies and deletes the Leases of the shards and replicas.
    pub sharded: bool,
}

const READ: [&str; 3] = ["get", "list", "watch"];
const MANAGE: [&str; 7] = [
    "get", "list", "watch", "create", "update", "patch", "delete",
];

/// The ServiceAccount, the ClusterRole and its binding (cluster-wide, or in each watched
/// namespace), and the Lease's Role and RoleBinding.
pub fn objects(registry: &Registry, target: &Target) -> Vec<Value> {
    let mut served: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (_, kind) in registry.kinds() {
        served
            .entry(kind.group.clone())
            .or_default()
            .insert(kind.plural.clone());
    }
    let mut children: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for plugin in registry.plugins() {
        for child in &plugin.info().children {
            children
                .entry(child.group.clone())
                .or_default()
                .insert(plural(&child.kind));
        }
    }
    let rule = |group: &str, resources: Vec<String>, verbs: &[&str]| json!({ "apiGroups": [group], "resources": resources, "verbs": verbs });
    let mut rules = Vec::new();
    for (group, plurals) in &served {
        if target.sharded {
            rules.push(rule(
                group,
                plurals.iter().cloned().collect(),
                &["get", "list", "watch", "patch"],
            ));
        } else {
            rules.push(rule(group, plurals.iter().cloned().collect(), &READ));
        }
        rules.push(rule(
            group,
            plurals.iter().map(|p| format!("{p}/status")).collect(),
            &["get", "patch", "update"],
        ));
    }
    for (group, plurals) in &children {
        rules.push(rule(group, plurals.iter().cloned().collect(), &MANAGE));
    }
    // `Plugin` resources are cluster-scoped, and so are the CRDs they install: these rules
    // are a ClusterRole's, and need the cluster-wide binding.
    let mut cluster_rules = Vec::new();
    if target.plugin_resources {
        cluster_rules.push(rule(
            crate::api::GROUP,
            vec![crate::api::PLURAL.to_owned()],
            &READ,
        ));
        cluster_rules.push(rule(
            crate::api::GROUP,
            vec![format!("{}/status", crate::api::PLURAL)],
            &["get", "patch", "update"],
        ));
        cluster_rules.push(rule(
            "apiextensions.k8s.io",
            vec!["customresourcedefinitions".to_owned()],
            &["get", "create", "patch"],
        ));
        // The admission policies of the Kinds whose specs name other objects (contract 1.2).
        cluster_rules.push(rule(
            "admissionregistration.k8s.io",
            vec![
                "validatingadmissionpolicies".to_owned(),
                "validatingadmissionpolicybindings".to_owned(),
            ],
            &["get", "create", "patch"],
        ));
    }
    // The Pod Security level a namespace enforces (its label) is what the pods the operator
    // renders there are held to. A RoleBinding grants this for its own namespace.
    rules.push(rule("", vec!["namespaces".to_owned()], &["get"]));
    rules.push(json!({
        "apiGroups": ["events.k8s.io", ""],
        "resources": ["events"],
        "verbs": ["create", "patch"],
    }));
    let (ns, name) = (&target.namespace, &target.name);
    let subject = json!([{ "kind": "ServiceAccount", "name": name, "namespace": ns }]);
    let lease_role = format!("{name}-leader-election");
    let role_ref =
        json!({ "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name });
    let mut objects = vec![
        json!({
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": { "name": name, "namespace": ns },
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": { "name": name },
            "rules": rules,
        }),
    ];
    let watched: BTreeSet<&String> = target.watch_namespaces.iter().collect();
    if watched.is_empty() {
        if let Some(all) = objects[1]["rules"].as_array_mut() {
            all.append(&mut cluster_rules);
        }
        objects.push(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": { "name": name },
            "roleRef": role_ref,
            "subjects": subject,
        }));
    }
    // A ClusterRole of `rules` named `role`, bound cluster-wide to the ServiceAccount.
    let cluster_wide = |role: String, rules: Value| {
        [
            json!({
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": { "name": role },
                "rules": rules,
            }),
            json!({
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": { "name": role },
                "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role },
                "subjects": subject,
            }),
        ]
    };
    // Watching some namespaces only, the operator lists and writes in those alone; what is
    // cluster-wide by nature gets a ClusterRole of its own, bound cluster-wide.
    if !cluster_rules.is_empty() {
        objects.extend(cluster_wide(
            format!("{name}-plugins"),
            json!(cluster_rules),
        ));
    }
    for watched in watched {
        objects.push(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": { "name": name, "namespace": watched },
            "roleRef": role_ref,
            "subjects": subject,
        }));
    }
    if target.metrics_secure {
        // TokenReviews and SubjectAccessReviews are cluster-scoped: a ClusterRole of their own,
        // bound cluster-wide, as the system:auth-delegator role grants them, and nothing more.
        objects.extend(cluster_wide(
            format!("{name}-metrics-auth"),
            json!([
                rule(
                    "authentication.k8s.io",
                    vec!["tokenreviews".to_owned()],
                    &["create"]
                ),
                rule(
                    "authorization.k8s.io",
                    vec!["subjectaccessreviews".to_owned()],
                    &["create"]
                ),
            ]),
        ));
    }
    objects.extend([
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": { "name": lease_role, "namespace": ns },
            "rules": [{
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "verbs": if target.sharded {
                    json!(["get", "list", "watch", "create", "update", "patch", "delete"])
                } else {
                    json!(["get", "list", "create", "update"])
                },
            }],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": { "name": lease_role, "namespace": ns },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": lease_role },
            "subjects": subject,
        }),
    ]);
    objects
}
