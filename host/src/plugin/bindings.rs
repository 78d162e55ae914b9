//! Host bindings of `wit/plugin.wit`, and conversions to the plain types.

use crate::types::{
    Context, GroupVersionKind, KindInfo, PluginInfo, PrinterColumn, Reference, ReferenceTarget,
    Resource,
};

wasmtime::component::bindgen!({
    path: "../wit",
    world: "plugin",
});

use self::exports::wasm_operator::plugin::{admission, reconciler, reporting};
use self::wasm_operator::plugin::types as wit;
use super::sandbox::Sandbox;

/// The interface 1.1 added, as a component names its export (without the version).
pub(super) const REPORTING: &str = "wasm-operator:plugin/reporting";
/// The interface 1.2 added.
pub(super) const ADMISSION: &str = "wasm-operator:plugin/admission";

/// A component ready to instantiate, with the exports the host calls found: `reconciler`
/// (every 1.x plugin), `reporting` when the plugin was built against 1.1 or later, and
/// `admission` against 1.2 or later.
pub(super) struct Pre {
    instance_pre: wasmtime::component::InstancePre<Sandbox>,
    reconciler: reconciler::GuestIndices,
    reporting: Option<reporting::GuestIndices>,
    admission: Option<admission::GuestIndices>,
}

/// One instance's exports.
pub(super) struct Instance {
    pub reconciler: reconciler::Guest,
    pub reporting: Option<reporting::Guest>,
    pub admission: Option<admission::Guest>,
}

impl Pre {
    /// Finds the exports and checks their types; `reporting` is looked for when `exports`
    /// (the component's export names) has it, and then must have the contract's types.
    pub fn new(
        instance_pre: wasmtime::component::InstancePre<Sandbox>,
        exports: &[String],
    ) -> wasmtime::Result<Self> {
        let reconciler = reconciler::GuestIndices::new(&instance_pre)?;
        let reporting = if exports.iter().any(|e| e.starts_with(REPORTING)) {
            Some(reporting::GuestIndices::new(&instance_pre)?)
        } else {
            None
        };
        let admission = if exports.iter().any(|e| e.starts_with(ADMISSION)) {
            Some(admission::GuestIndices::new(&instance_pre)?)
        } else {
            None
        };
        Ok(Self {
            instance_pre,
            reconciler,
            reporting,
            admission,
        })
    }

    /// Whether the plugin exports `reporting` (contract 1.1).
    pub fn reports(&self) -> bool {
        self.reporting.is_some()
    }

    /// Whether the plugin exports `admission` (contract 1.2).
    pub fn admits(&self) -> bool {
        self.admission.is_some()
    }

    pub fn instantiate(&self, store: &mut wasmtime::Store<Sandbox>) -> wasmtime::Result<Instance> {
        let instance = self.instance_pre.instantiate(&mut *store)?;
        Ok(Instance {
            reconciler: self.reconciler.load(&mut *store, &instance)?,
            reporting: match &self.reporting {
                Some(r) => Some(r.load(&mut *store, &instance)?),
                None => None,
            },
            admission: match &self.admission {
                Some(a) => Some(a.load(&mut *store, &instance)?),
                None => None,
            },
        })
    }
}

/// What a render returns: the manifests' texts and the warnings, or the plugin's error.
pub(super) type Rendered = Result<(Vec<String>, Vec<wit::Warning>), wit::RenderError>;

impl Instance {
    /// Renders through `reporting.render` when the plugin exports it (manifests and warnings),
    /// else through `reconciler.render` (manifests alone).
    pub fn render(
        &self,
        store: &mut wasmtime::Store<Sandbox>,
        resource: &wit::Resource,
        ctx: &wit::Context,
    ) -> wasmtime::Result<Rendered> {
        Ok(match &self.reporting {
            Some(r) => r
                .call_render(store, resource, ctx)?
                .map(|r| (r.manifests, r.warnings)),
            None => self
                .reconciler
                .call_render(store, resource, ctx)?
                .map(|m| (m, Vec::new())),
        })
    }
}

/// A child as the host observes it, as the WIT record.
pub(super) fn observed_child(c: &crate::types::ObservedChild) -> wit::ObservedChild {
    wit::ObservedChild {
        api_version: c.api_version.clone(),
        kind: c.kind.clone(),
        name: c.name.clone(),
        replicas: c.replicas,
        status: c.status.to_string(),
    }
}

/// Status schemas as the host keeps them: by (group, Kind), each checked to be a JSON object
/// schema of type `object` with `properties`, none of them the host's own, its `$ref`s inlined.
pub(super) fn status_schemas(
    schemas: Vec<wit::StatusSchema>,
) -> Result<Vec<(String, String, serde_json::Value)>, String> {
    schemas
        .into_iter()
        .map(|s| {
            let mut schema: serde_json::Value = serde_json::from_str(&s.schema)
                .map_err(|e| format!("the status schema of {} is not JSON: {e}", s.kind))?;
            // Kubernetes types named by `$ref`, inlined once: each status call is checked
            // against it.
            crate::kube_schema::inline_refs(&mut schema).map_err(|reference| {
                format!(
                    "the status schema of {} names {reference}, which is not a Kubernetes type this host knows",
                    s.kind
                )
            })?;
            if schema.get("type").and_then(serde_json::Value::as_str) != Some("object") {
                return Err(format!(
                    "the status schema of {} must be of type object",
                    s.kind
                ));
            }
            let Some(properties) = schema
                .get("properties")
                .and_then(serde_json::Value::as_object)
            else {
                return Err(format!(
                    "the status schema of {} must name its fields in properties",
                    s.kind
                ));
            };
            if let Some(own) = properties
                .keys()
                .find(|k| crate::kube_schema::HOST_STATUS_FIELDS.contains(&k.as_str()))
            {
                return Err(format!(
                    "the status schema of {} declares `{own}`, which the host owns ({})",
                    s.kind,
                    crate::kube_schema::HOST_STATUS_FIELDS.join(", ")
                ));
            }
            Ok((s.group, s.kind, schema))
        })
        .collect()
}

pub(super) fn context(ctx: &Context) -> wit::Context {
    wit::Context {
        api_group: ctx.api_group.clone(),
        cluster_domain: ctx.cluster_domain.clone(),
    }
}

/// The WIT record for `r`: its boundary form (guest-kit's, which the native benchmark uses too),
/// moved into the generated type.
pub(super) fn resource(r: &Resource) -> wit::Resource {
    let w = guest_kit::WireResource::from_resource(r);
    wit::Resource {
        api_version: w.api_version,
        kind: w.kind,
        metadata: wit::ObjectMeta {
            name: w.name,
            namespace: w.namespace,
            uid: w.uid,
            generation: w.generation,
            labels: w.labels,
            annotations: w.annotations,
        },
        spec: w.spec,
    }
}

/// Converts and checks what `describe` (and, for a 1.1 plugin, `status-schemas`, and for a 1.2
/// plugin, `references`) returned.
pub(super) fn plugin_info(
    info: wit::PluginInfo,
    status: Vec<wit::StatusSchema>,
    references: Vec<wit::Reference>,
) -> Result<PluginInfo, String> {
    let mut status = status_schemas(status)?;
    if info.kinds.is_empty() {
        return Err("describe() names no Kinds".into());
    }
    let kinds = info
        .kinds
        .into_iter()
        .map(|k| {
            let spec_schema = serde_json::from_str(&k.spec_schema)
                .map_err(|e| format!("the spec schema of {} is not JSON: {e}", k.kind))?;
            if k.versions.is_empty() {
                return Err(format!("{} names no versions", k.kind));
            }
            if k.plural.is_empty() || k.plural != k.plural.to_lowercase() {
                return Err(format!(
                    "{}: plural `{}` must be non-empty lower case",
                    k.kind, k.plural
                ));
            }
            let status_schema = status
                .iter()
                .position(|(g, kind, _)| *g == k.group && *kind == k.kind)
                .map(|i| status.swap_remove(i).2);
            Ok(KindInfo {
                status_schema,
                references: Vec::new(),
                group: k.group,
                versions: k.versions,
                kind: k.kind,
                plural: k.plural,
                short_names: k.short_names,
                engine: k.engine,
                spec_schema,
                printer_columns: k
                    .printer_columns
                    .into_iter()
                    .map(|c| PrinterColumn {
                        name: c.name,
                        type_: c.type_,
                        json_path: c.json_path,
                        description: c.description,
                        priority: c.priority,
                    })
                    .collect(),
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    if let Some((group, kind, _)) = status.first() {
        return Err(format!(
            "status-schemas names {kind} ({group}), which describe() does not"
        ));
    }
    let children = info
        .children
        .into_iter()
        .map(|g| GroupVersionKind {
            group: g.group,
            version: g.version,
            kind: g.kind,
        })
        .collect();
    let mut kinds = kinds;
    for r in references {
        let Some(kind) = kinds
            .iter_mut()
            .find(|k| k.group == r.group && k.kind == r.kind)
        else {
            return Err(format!(
                "references names {} ({}), which describe() does not",
                r.kind, r.group
            ));
        };
        let target = match r.target {
            wit::ReferenceTarget::Secret => ReferenceTarget::Secret,
            wit::ReferenceTarget::ConfigMap => ReferenceTarget::ConfigMap,
            wit::ReferenceTarget::ServiceAccount => ReferenceTarget::ServiceAccount,
        };
        crate::policy::admission::check_path(&r.path)
            .and_then(|()| crate::policy::admission::in_schema(&kind.spec_schema, &r.path))
            .map_err(|e| format!("{}: {e}", kind.kind))?;
        kind.references.push(Reference {
            path: r.path,
            target,
        });
    }
    let info = PluginInfo {
        name: info.name,
        version: info.version,
        kinds,
        children,
    };
    // Names become CRD names, file names and RBAC rules: checked as the API server checks them.
    crate::policy::names::check(&info)?;
    Ok(info)
}
