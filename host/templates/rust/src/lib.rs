//! The `{{name}}` plugin: a `{{Kind}}` (`{{group}}/v1alpha1`) becomes a ConfigMap holding its
//! `spec.message`. Pure: the same resource gives the same manifests, byte for byte.

use guest_kit::{
    Context, GroupVersionKind, KindInfo, ObservedChild, Plugin, PluginInfo, Rendered, Resource,
    Result, Warning, schema, spec,
};
use serde::Deserialize;
use serde_json::{Map, Value, json};

/// The plugin.
pub struct {{Kind}}Plugin;

guest_kit::export_plugin!({{Kind}}Plugin);

/// The Kind's group.
pub const GROUP: &str = "{{group}}";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct {{Kind}}Spec {
    #[serde(default)]
    message: String,
}

impl Plugin for {{Kind}}Plugin {
    fn describe(_ctx: &Context) -> PluginInfo {
        PluginInfo {
            name: "{{name}}".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            kinds: vec![KindInfo {
                group: GROUP.into(),
                versions: vec!["v1alpha1".into()],
                kind: "{{Kind}}".into(),
                plural: "{{plural}}".into(),
                short_names: Vec::new(),
                engine: None,
                spec_schema: json!({
                    "type": "object",
                    "properties": {
                        "message": { "type": "string", "maxLength": 1024, "description": "What the ConfigMap holds." },
                    },
                }),
                printer_columns: Vec::new(),
                status_schema: Some(json!({
                    "type": "object",
                    "properties": {
                        "configMap": schema::string("The ConfigMap holding the message, once it exists"),
                    },
                })),
                // Its spec names no other object (a Secret, ConfigMap or ServiceAccount).
                references: Vec::new(),
            }],
            children: vec![GroupVersionKind::new("", "v1", "ConfigMap")],
        }
    }

    fn render(resource: &Resource, ctx: &Context) -> Result<Vec<Value>> {
        Ok(Self::render_reported(resource, ctx)?.objects)
    }

    fn render_reported(resource: &Resource, _ctx: &Context) -> Result<Rendered> {
        let s: {{Kind}}Spec = spec::parse(&resource.spec)?;
        let mut warnings = Vec::new();
        let message = if s.message.is_empty() {
            warnings.push(Warning::new("spec.message", "is empty: the ConfigMap says hello"));
            "hello".to_owned()
        } else {
            s.message
        };
        let config_map = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": { "name": resource.name },
            "data": { "message": message },
        });
        Ok(Rendered {
            objects: vec![config_map],
            warnings,
        })
    }

    fn status(
        resource: &Resource,
        children: &[ObservedChild],
        _ctx: &Context,
    ) -> Result<Map<String, Value>> {
        let mut fields = Map::new();
        if children
            .iter()
            .any(|c| c.kind == "ConfigMap" && c.name == resource.name)
        {
            fields.insert("configMap".into(), resource.name.clone().into());
        }
        Ok(fields)
    }
}
