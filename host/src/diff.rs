//! `host diff`: what `host run` would change in the cluster, shown before it does.
//!
//! Each resource is rendered exactly as the operator renders it (its children stamped with the
//! ownership label and owner reference), and each child is sent to the API server as a
//! server-side apply dry run under the operator's own field manager: the answer is the object as
//! it would be after the operator's apply, defaults and admission included, compared with the
//! live object. Children the resource controls that the render no longer returns are what the
//! operator would prune. Nothing is written.

use std::collections::BTreeSet;

use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::ApiResource;
use serde::Serialize;
use serde_json::Value;

use crate::ownership::{FIELD_MANAGER, OWNER_LABEL};
use crate::registry::{Registry, RenderError};
use crate::schema::UnknownFields;
use crate::types::Resource;

/// What the operator would do to one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// It does not exist: the operator creates it.
    Create,
    /// It exists and would change.
    Change,
    /// The resource controls it and the render no longer returns it: the operator deletes it.
    Delete,
    /// It exists and would not change.
    Unchanged,
    /// It exists and is not this resource's: the operator leaves it alone (a conflict).
    Skip,
}

/// One object of the preview.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    /// What would happen to it.
    pub action: Action,
    /// The resource it is a child of, `Kind/name`.
    pub owner: String,
    /// `apiVersion` of the object.
    pub api_version: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    /// A unified diff of the object (live, then as it would be), Secret values masked; for a
    /// skipped object, why.
    pub diff: String,
}

/// The whole preview.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// Every object, resource by resource.
    pub entries: Vec<Entry>,
    /// Resources that could not be previewed, and why.
    pub errors: Vec<String>,
    /// What was left out of the preview, and why (a Kind the cluster does not serve yet).
    pub notes: Vec<String>,
}

impl Report {
    /// How many objects each action concerns.
    pub fn count(&self, action: Action) -> usize {
        self.entries.iter().filter(|e| e.action == action).count()
    }

    /// Whether anything would change.
    pub fn differs(&self) -> bool {
        self.entries
            .iter()
            .any(|e| matches!(e.action, Action::Create | Action::Change | Action::Delete))
    }

    /// `N to create, M to change, K to delete`.
    pub fn summary(&self) -> String {
        format!(
            "{} to create, {} to change, {} to delete",
            self.count(Action::Create),
            self.count(Action::Change),
            self.count(Action::Delete)
        )
    }

    /// The report for a person: each object that would change, with its diff, then the summary.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for e in &self.entries {
            let what = format!("{} {}/{} ({})", e.kind, e.namespace, e.name, e.owner);
            match e.action {
                Action::Unchanged => {}
                Action::Skip => out.push_str(&format!("# {what}: left alone: {}\n", e.diff)),
                action => {
                    let verb = match action {
                        Action::Create => "created",
                        Action::Change => "changed",
                        _ => "deleted",
                    };
                    out.push_str(&format!("# {what}: {verb}\n{}", e.diff));
                    if !e.diff.ends_with('\n') {
                        out.push('\n');
                    }
                }
            }
        }
        for note in &self.notes {
            out.push_str(&format!("# {note}\n"));
        }
        for error in &self.errors {
            out.push_str(&format!("# error: {error}\n"));
        }
        out.push_str(&self.summary());
        out.push('\n');
        out
    }
}

/// Why a preview could not be made at all.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server could not be asked.
    #[error("{0}")]
    Kube(#[from] kube::Error),
    /// A Kind to preview is not served by the cluster.
    #[error("{0}")]
    Discovery(String),
}

/// Previews each of `resources` (rendered by `registry`); `strict` refuses spec fields the
/// Kind's schema does not know (files), else they are let be (resources read from the cluster,
/// which the API server has pruned).
pub async fn diff(
    client: &kube::Client,
    registry: &Registry,
    resources: &[Resource],
    strict: bool,
) -> Report {
    let mut report = Report::default();
    let mut found = Discovered::new();
    for resource in resources {
        let owner = format!("{}/{}", resource.kind, resource.name);
        match diff_one(client, &mut found, registry, resource, strict, &owner).await {
            Ok(entries) => report.entries.extend(entries),
            Err(e) => report
                .errors
                .push(format!("{owner} in {}: {e}", resource.namespace)),
        }
    }
    report
}

/// Every resource of the Kinds `registry`'s plugins serve (with `given_only`, those of the
/// plugins given with `--plugin` alone, not the built-in ones), in `namespace` (or everywhere),
/// as the cluster holds them.
pub async fn listed(
    client: &kube::Client,
    registry: &Registry,
    namespace: Option<&str>,
    given_only: bool,
) -> Result<(Vec<Resource>, Vec<String>), Error> {
    let mut out = Vec::new();
    let mut notes = Vec::new();
    let mut found = Discovered::new();
    for (_, kind) in registry
        .kinds()
        .filter(|(p, _)| !given_only || !p.source().starts_with("built-in "))
    {
        let gvk = GroupVersionKind::gvk(&kind.group, &kind.versions[0], &kind.kind);
        // A Kind whose CRD is not installed yet (before a switch from the earlier operator)
        // has nothing in the cluster to preview.
        let Ok(ar) = discover(client, &mut found, &gvk).await else {
            notes.push(format!(
                "{}.{} is not served by the cluster (its CRD is not installed): nothing of it to preview",
                kind.plural, kind.group
            ));
            continue;
        };
        let api: Api<DynamicObject> = match namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
            None => Api::all_with(client.clone(), &ar),
        };
        for obj in api.list(&ListParams::default()).await?.items {
            out.push(crate::ownership::plugin_resource(&obj, &ar));
        }
    }
    Ok((out, notes))
}

/// The API resources discovered so far, by `group/version/Kind`: each asked of the API server
/// once per preview, not once per object.
type Discovered = std::collections::BTreeMap<String, ApiResource>;

async fn discover(
    client: &kube::Client,
    found: &mut Discovered,
    gvk: &GroupVersionKind,
) -> Result<ApiResource, Error> {
    let key = format!("{}/{}/{}", gvk.group, gvk.version, gvk.kind);
    if let Some(ar) = found.get(&key) {
        return Ok(ar.clone());
    }
    let ar = kube::discovery::pinned_kind(client, gvk)
        .await
        .map(|(ar, _)| ar)
        .map_err(|e| {
            Error::Discovery(format!(
                "the cluster does not serve {}/{} {}: {e}",
                gvk.group, gvk.version, gvk.kind
            ))
        })?;
    found.insert(key, ar.clone());
    Ok(ar)
}

async fn diff_one(
    client: &kube::Client,
    found: &mut Discovered,
    registry: &Registry,
    file: &Resource,
    strict: bool,
    owner: &str,
) -> Result<Vec<Entry>, Error> {
    let (group, version) = crate::gvk::split_api_version(&file.api_version);
    let ar = discover(
        client,
        found,
        &GroupVersionKind::gvk(group, version, &file.kind),
    )
    .await?;
    // The resource as the operator would see it: the file's spec and metadata, on the live
    // object's uid and generation (none when it is not in the cluster yet). A resource read
    // from the cluster (not `strict`) carries them already.
    let mut resource = file.clone();
    let live_uid = if strict {
        let owners: Api<DynamicObject> = Api::namespaced_with(client.clone(), &file.namespace, &ar);
        let live = owners.get_opt(&file.name).await?;
        if let Some(live) = &live {
            resource.uid = live.metadata.uid.clone().unwrap_or_default();
            resource.generation = live.metadata.generation.unwrap_or(0);
        }
        live.map(|_| resource.uid.clone())
    } else {
        Some(resource.uid.clone())
    };
    let unknown = if strict {
        UnknownFields::Refuse
    } else {
        UnknownFields::Ignore
    };
    let (objects, _) = registry
        .render_checked(&resource, unknown)
        .map_err(|e: RenderError| Error::Discovery(format!("does not render: {e}")))?;
    let handle = crate::ownership::handle(&ar.plural, &ar.group, &resource.name);
    let mut entries = Vec::new();
    let mut desired = BTreeSet::new();
    for mut object in objects {
        if !resource.uid.is_empty() {
            crate::ownership::stamp_child(
                &mut object,
                &resource.api_version,
                &resource.kind,
                &resource.name,
                &resource.uid,
            );
        }
        let (api_version, kind, name) = crate::ownership::identity(&object);
        let (g, v) = crate::gvk::split_api_version(&api_version);
        let child_ar = discover(client, found, &GroupVersionKind::gvk(g, v, &kind)).await?;
        desired.insert((child_ar.group.clone(), kind.clone(), name.clone()));
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), &resource.namespace, &child_ar);
        let live = api.get_opt(&name).await?;
        let entry = |action, diff: String| Entry {
            action,
            owner: owner.to_owned(),
            api_version: api_version.clone(),
            kind: kind.clone(),
            namespace: resource.namespace.clone(),
            name: name.clone(),
            diff,
        };
        if let Some(live) = &live
            && let Some(why) = not_ours(live, &resource, &handle)
        {
            entries.push(entry(Action::Skip, why));
            continue;
        }
        let params = PatchParams::apply(FIELD_MANAGER).force().dry_run();
        let after = api.patch(&name, &params, &Patch::Apply(&object)).await?;
        let after = serde_json::to_value(&after).unwrap_or_default();
        let label = format!("{kind}/{name}");
        match live {
            None => {
                // What is created: what the operator sends, without the server's defaults.
                let (_, shown) = mask_secrets(&kind, Value::Null, comparable(&object));
                entries.push(entry(
                    Action::Create,
                    unified(&label, &Value::Null, &shown, None),
                ));
            }
            Some(live) => {
                let before = comparable(&serde_json::to_value(&live).unwrap_or_default());
                let after = comparable(&after);
                let (before, after) = mask_secrets(&kind, before, after);
                if before == after {
                    entries.push(entry(Action::Unchanged, String::new()));
                } else {
                    entries.push(entry(
                        Action::Change,
                        unified(&label, &before, &after, Some(3)),
                    ));
                }
            }
        }
    }
    // What the resource controls that the render no longer returns: pruned.
    if let Some(uid) = &live_uid {
        let plugin = registry
            .lookup(&resource.api_version, &resource.kind)
            .map_err(|e| Error::Discovery(e.to_string()))?
            .0;
        let mut kinds = BTreeSet::new();
        for child in &plugin.info().children {
            // One version of each kind: the objects are the same whatever the version.
            if !kinds.insert((child.group.clone(), child.kind.clone())) {
                continue;
            }
            let gvk = GroupVersionKind::gvk(&child.group, &child.version, &child.kind);
            let Ok(child_ar) = discover(client, found, &gvk).await else {
                continue;
            };
            let api: Api<DynamicObject> =
                Api::namespaced_with(client.clone(), &resource.namespace, &child_ar);
            let selector = format!("{OWNER_LABEL}={uid}");
            for obj in api
                .list(&ListParams::default().labels(&selector))
                .await?
                .items
            {
                let name = obj.metadata.name.clone().unwrap_or_default();
                let key = (child_ar.group.clone(), child.kind.clone(), name.clone());
                if desired.contains(&key) || not_ours(&obj, &resource, &handle).is_some() {
                    continue;
                }
                let label = format!("{}/{name}", child.kind);
                let before = comparable(&serde_json::to_value(&obj).unwrap_or_default());
                let (before, _) = mask_secrets(&child.kind, before, Value::Null);
                entries.push(Entry {
                    action: Action::Delete,
                    owner: owner.to_owned(),
                    api_version: child_ar.api_version.clone(),
                    kind: child.kind.clone(),
                    namespace: resource.namespace.clone(),
                    name,
                    diff: unified(&label, &before, &Value::Null, None),
                });
            }
        }
    }
    Ok(entries)
}

/// Why the operator would leave `live` alone for `resource` (kubectl's `handle` for it):
/// another owner controls it, or nobody does and it does not consent to this resource's
/// adoption. Where the operator adopts on request (`--adopt-in-namespace`), it would take more.
fn not_ours(live: &DynamicObject, resource: &Resource, handle: &str) -> Option<String> {
    use crate::ownership::{ADOPT_BY_ANNOTATION, Control, consents, control};
    let consent = live
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ADOPT_BY_ANNOTATION))
        .map(String::as_str);
    match control(&live.metadata, &resource.uid) {
        Control::Us => None,
        Control::Other(c) => Some(format!(
            "controlled by {} {} (uid {}): the operator never takes another's object (ChildConflict)",
            c.kind, c.name, c.uid
        )),
        Control::Nobody if consents(consent, handle) => None,
        Control::Nobody => Some(format!(
            "exists and nobody controls it: the operator takes it only when the object consents ({ADOPT_BY_ANNOTATION}: {handle}), or in a namespace it adopts in (--adopt-in-namespace) when the resource asks"
        )),
    }
}

/// The object without what changes on every write or is not the operator's to set: status,
/// and the metadata the server keeps.
fn comparable(object: &Value) -> Value {
    let mut o = object.clone();
    if let Some(map) = o.as_object_mut() {
        map.remove("status");
        if let Some(meta) = map.get_mut("metadata").and_then(Value::as_object_mut) {
            for noise in [
                "managedFields",
                "resourceVersion",
                "generation",
                "creationTimestamp",
                "uid",
                "selfLink",
            ] {
                meta.remove(noise);
            }
            if let Some(annotations) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
                annotations.remove("deployment.kubernetes.io/revision");
                if annotations.is_empty() {
                    meta.remove("annotations");
                }
            }
        }
    }
    o
}

/// A Secret's values as `***`: the same on both sides when they are equal, else marked as the
/// value before and after (as `kubectl diff` does).
fn mask_secrets(kind: &str, mut before: Value, mut after: Value) -> (Value, Value) {
    if kind != "Secret" {
        return (before, after);
    }
    for field in ["data", "stringData"] {
        let keys: BTreeSet<String> = [&before, &after]
            .iter()
            .filter_map(|o| o.get(field).and_then(Value::as_object))
            .flat_map(|m| m.keys().cloned())
            .collect();
        for key in keys {
            let b = before.get(field).and_then(|m| m.get(&key)).cloned();
            let a = after.get(field).and_then(|m| m.get(&key)).cloned();
            let same = b == a;
            if b.is_some() {
                before[field][&key] = if same { "***" } else { "*** (before)" }.into();
            }
            if a.is_some() {
                after[field][&key] = if same { "***" } else { "*** (after)" }.into();
            }
        }
    }
    (before, after)
}

/// A unified diff of two objects as YAML (`Null`: absent), with `context` lines around each
/// change (none: the whole object).
fn unified(label: &str, before: &Value, after: &Value, context: Option<usize>) -> String {
    let yaml = |v: &Value| {
        if v.is_null() {
            String::new()
        } else {
            crate::documents::write(std::slice::from_ref(v), crate::documents::Format::Yaml)
                .unwrap_or_default()
                .trim_start_matches("---\n")
                .to_owned()
        }
    };
    let (old, new) = (yaml(before), yaml(after));
    let diff = similar::TextDiff::from_lines(&old, &new);
    let mut unified = diff.unified_diff();
    unified.context_radius(context.unwrap_or(usize::MAX / 2));
    let from = if before.is_null() {
        "/dev/null".to_owned()
    } else {
        format!("live/{label}")
    };
    let to = if after.is_null() {
        "/dev/null".to_owned()
    } else {
        format!("rendered/{label}")
    };
    unified.header(&from, &to).to_string()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn secret_values_are_masked_and_marked_when_they_change() {
        let before = json!({ "kind": "Secret", "data": { "a": "eA==", "b": "eQ==" } });
        let after = json!({ "kind": "Secret", "data": { "a": "eA==", "b": "eg==" } });
        let (b, a) = mask_secrets("Secret", before, after);
        assert_eq!(b["data"], json!({ "a": "***", "b": "*** (before)" }));
        assert_eq!(a["data"], json!({ "a": "***", "b": "*** (after)" }));
        let text = unified("Secret/s", &b, &a, Some(3));
        assert!(!text.contains("eQ==") && !text.contains("eg=="), "{text}");
        // Created: nothing of its values shows either.
        let (_, created) = mask_secrets(
            "Secret",
            Value::Null,
            json!({ "stringData": { "p": "hunter2" } }),
        );
        let text = unified("Secret/s", &Value::Null, &created, None);
        assert!(!text.contains("hunter2") && text.contains("***"), "{text}");
        let (cm, _) = mask_secrets("ConfigMap", json!({ "data": { "a": "x" } }), Value::Null);
        assert_eq!(cm["data"]["a"], "x");
    }

    #[test]
    fn a_change_shows_only_the_fields_that_change_and_noise_is_left_out() {
        let live = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": { "name": "web", "resourceVersion": "7", "uid": "u", "generation": 3,
                "managedFields": [{}], "annotations": { "deployment.kubernetes.io/revision": "2" } },
            "spec": { "replicas": 2, "template": { "spec": { "containers": [{ "name": "web", "image": "nginx" }] } } },
            "status": { "readyReplicas": 2 },
        });
        let mut rendered = live.clone();
        rendered["spec"]["replicas"] = 3.into();
        rendered["metadata"]["resourceVersion"] = "8".into();
        let before = comparable(&live);
        let after = comparable(&rendered);
        let text = unified("Deployment/web", &before, &after, Some(3));
        let changed: Vec<&str> = text
            .lines()
            .filter(|l| {
                (l.starts_with('-') || l.starts_with('+'))
                    && !l.starts_with("---")
                    && !l.starts_with("+++")
            })
            .collect();
        assert_eq!(changed, vec!["-  replicas: 2", "+  replicas: 3"], "{text}");
        assert!(
            !text.contains("resourceVersion") && !text.contains("readyReplicas"),
            "{text}"
        );
    }
}
