//! The status the operator would write, without a cluster (`host render --observed`): a
//! resource's rendered children matched with objects as a cluster reports them (`kubectl get
//! -o yaml`), each judged ready as the operator judges it, and a 1.1 plugin's `status()` called
//! with them, as `crossplane render --observed-resources` does for compositions.

use std::collections::BTreeMap;

use serde_json::Value;

use super::LiveChild;
use super::status::{Child, Outcome, child_ready, status};
use crate::documents::FieldError;
use crate::registry::Registry;
use crate::registry::RenderError;
use crate::types::{ObservedChild, Resource, Warning};

/// Live objects, as a cluster would report them, by `apiVersion`, kind, namespace and name.
#[derive(Debug, Default, Clone)]
pub struct Observed {
    objects: BTreeMap<(String, String, String, String), Value>,
}

impl Observed {
    /// Adds `object` (a whole object, with `apiVersion`, `kind` and `metadata.name`); an object
    /// without a namespace counts as in every namespace. An error names the field it lacks.
    pub fn add(&mut self, object: Value) -> Result<(), FieldError> {
        let text = |pointer: &str, field: &str| {
            object
                .pointer(pointer)
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| FieldError {
                    field: field.to_owned(),
                    problem: "missing: an observed object is a whole object, as `kubectl get -o yaml` prints it".to_owned(),
                })
        };
        let key = (
            text("/apiVersion", "apiVersion")?,
            text("/kind", "kind")?,
            text("/metadata/namespace", "metadata.namespace").unwrap_or_default(),
            text("/metadata/name", "metadata.name")?,
        );
        self.objects.insert(key, object);
        Ok(())
    }

    /// How many objects are held.
    pub fn len(&self) -> usize {
        self.objects.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    /// The object observed for a child `kind` named `name` in `namespace`.
    fn get(&self, api_version: &str, kind: &str, namespace: &str, name: &str) -> Option<&Value> {
        self.key_of(api_version, kind, namespace, name)
            .and_then(|k| self.objects.get(&k))
    }

    /// The key of the object observed for a child, when one is.
    fn key_of(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Option<(String, String, String, String)> {
        let key = |ns: &str| {
            (
                api_version.to_owned(),
                kind.to_owned(),
                ns.to_owned(),
                name.to_owned(),
            )
        };
        [key(namespace), key("")]
            .into_iter()
            .find(|k| self.objects.contains_key(k))
    }

    /// Each observed object that is none of `children` (rendered in the namespace given with
    /// each), as `Kind apiVersion namespace/name`: most likely a name or apiVersion that differs
    /// from what the plugin renders, so that the child it was meant for counts as not observed.
    pub fn unmatched<'a>(
        &self,
        children: impl IntoIterator<Item = (&'a str, &'a Value)>,
    ) -> Vec<String> {
        let mut matched = std::collections::BTreeSet::new();
        for (namespace, child) in children {
            let text = |pointer: &str| {
                child
                    .pointer(pointer)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
            };
            if let Some(k) = self.key_of(
                text("/apiVersion"),
                text("/kind"),
                namespace,
                text("/metadata/name"),
            ) {
                matched.insert(k);
            }
        }
        self.objects
            .keys()
            .filter(|k| !matched.contains(*k))
            .map(|(api_version, kind, namespace, name)| {
                let namespace = if namespace.is_empty() {
                    ""
                } else {
                    namespace.as_str()
                };
                format!("{kind} {api_version} {namespace}/{name}").replace(" /", " ")
            })
            .collect()
    }
}

/// The status the operator would write for `resource`, rendered by `registry` to `children`
/// (with `warnings`), when the cluster reports `observed`: each child ready or not as the
/// operator judges it (a child not observed counts as applied: ready if its kind has no
/// readiness rule, not ready if it has one), and the fields a 1.1 plugin's
/// `status()` computes from the children observed.
pub fn status_of(
    registry: &Registry,
    resource: &Resource,
    children: &[Value],
    warnings: &[Warning],
    observed: &Observed,
) -> Result<Value, RenderError> {
    let (plugin, _) = registry.lookup(&resource.api_version, &resource.kind)?;
    let mut summary = Vec::new();
    let mut seen = Vec::new();
    for child in children {
        let text = |pointer: &str| {
            child
                .pointer(pointer)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let (api_version, kind, name) =
            (text("/apiVersion"), text("/kind"), text("/metadata/name"));
        let live = observed
            .get(&api_version, &kind, &resource.namespace, &name)
            .map(|o| serde_json::from_value::<LiveChild>(o.clone()));
        let (ready, message, counts) = match live {
            Some(Ok(live)) => {
                let (ready, message) = child_ready(&kind, Some(&live));
                seen.push(ObservedChild {
                    api_version: api_version.clone(),
                    kind: kind.clone(),
                    name: name.clone(),
                    replicas: live.replicas(),
                    status: live
                        .status
                        .as_ref()
                        .and_then(|c| serde_json::to_value(c).ok())
                        .unwrap_or_else(|| Value::Object(serde_json::Map::new())),
                });
                (ready, message, Some((live.replicas(), live.status.clone())))
            }
            Some(Err(e)) => (
                false,
                format!("the observed object cannot be read: {e}"),
                None,
            ),
            // As the operator counts it once applied: a kind without a readiness rule is ready
            // when it exists; one with a rule (Deployment, StatefulSet) is not until observed.
            None if !super::status::reports_readiness(&kind) => (
                true,
                "exists (not observed: a kind without a readiness rule counts once applied)"
                    .to_owned(),
                None,
            ),
            None => (
                false,
                "not observed (no such object given)".to_owned(),
                None,
            ),
        };
        summary.push(Child {
            api_version,
            kind,
            name,
            ready,
            message,
            applied: None,
            observed: counts,
        });
    }
    let fields = plugin
        .status(resource, &seen, registry.context())
        .map_err(|error| RenderError::Plugin {
            plugin: plugin.name().to_owned(),
            error,
        })?
        .unwrap_or_default();
    let outcome = Outcome {
        children: summary,
        skipped: Vec::new(),
        problems: Vec::new(),
        warnings: warnings.to_vec(),
        fields,
    };
    let mut written = status(
        &outcome,
        resource.generation,
        None,
        &super::status::plugin_label(plugin),
    );
    // The time of a write that did not happen would change at each run.
    for c in written["conditions"].as_array_mut().into_iter().flatten() {
        if let Some(c) = c.as_object_mut() {
            c.remove("lastTransitionTime");
        }
    }
    Ok(written)
}
