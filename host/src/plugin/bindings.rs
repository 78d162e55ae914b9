//! Host bindings of `wit/plugin.wit`, and conversions to the plain types.

use crate::types::{Context, GroupVersionKind, KindInfo, PluginInfo, PrinterColumn, Resource};

wasmtime::component::bindgen!({
    path: "../wit",
    world: "plugin",
    // The description is kept in the compile cache as JSON (see `cache.rs`).
    additional_derives: [serde::Serialize, serde::Deserialize],
});

use self::wasm_operator::plugin::types as wit;

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

/// Converts and checks what `describe` returned.
pub(super) fn plugin_info(info: wit::PluginInfo) -> Result<PluginInfo, String> {
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
            Ok(KindInfo {
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
    let children = info
        .children
        .into_iter()
        .map(|g| GroupVersionKind {
            group: g.group,
            version: g.version,
            kind: g.kind,
        })
        .collect();
    Ok(PluginInfo {
        name: info.name,
        version: info.version,
        kinds,
        children,
    })
}
