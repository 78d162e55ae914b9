//! The plugin's logic, called natively (`cargo test`): what it renders and what it refuses.

use guest_kit::{Context, Plugin, Resource};
use serde_json::json;
use {{crate}}::{{Kind}}Plugin;

fn resource(spec: serde_json::Value) -> Resource {
    Resource::new("{{group}}/v1alpha1", "{{Kind}}", "hello", "default", spec)
}

#[test]
fn a_message_becomes_a_config_map() {
    let rendered =
        {{Kind}}Plugin::render_reported(&resource(json!({ "message": "hi" })), &Context::default())
            .unwrap();
    assert_eq!(rendered.objects.len(), 1);
    assert_eq!(rendered.objects[0]["data"]["message"], "hi");
    assert!(rendered.warnings.is_empty());
}

#[test]
fn an_empty_message_is_a_warning_not_an_error() {
    let rendered =
        {{Kind}}Plugin::render_reported(&resource(json!({})), &Context::default()).unwrap();
    assert_eq!(rendered.objects[0]["data"]["message"], "hello");
    assert_eq!(rendered.warnings[0].field, "spec.message");
}

#[test]
fn an_unknown_field_is_refused_naming_it() {
    let e = {{Kind}}Plugin::render(&resource(json!({ "mesage": "hi" })), &Context::default())
        .unwrap_err();
    assert!(e.to_string().contains("mesage"), "{e}");
}
