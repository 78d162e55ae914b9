//! Status: the Plugin's own status (kstatus conditions, the image and digest served).

use super::*;

impl Loader {
    /// Writes the Plugin's status: `fields`, and kstatus conditions from `refusal` (none: Ready).
    pub(super) async fn write_status(
        &self,
        o: &DynamicObject,
        generation: i64,
        mut fields: Value,
        refusal: Option<&Refusal>,
        message: &str,
    ) {
        let now = crate::operator::status::now();
        let previous = o.data.get("status").and_then(|s| s.get("conditions"));
        let cond = |type_: &str, on: bool, reason: &str, message: &str| {
            crate::operator::status::condition(
                type_, on, reason, message, generation, previous, &now,
            )
        };
        let message = crate::operator::status::bounded_to(message, 4096);
        let conditions = match refusal {
            None => vec![
                cond("Ready", true, "Serving", &message),
                cond("Reconciling", false, "Serving", ""),
                cond("Stalled", false, "Serving", ""),
            ],
            Some(r) => vec![
                cond("Ready", false, r.reason, &message),
                cond(
                    "Reconciling",
                    r.transient,
                    r.reason,
                    if r.transient { &message } else { "" },
                ),
                cond(
                    "Stalled",
                    !r.transient,
                    r.reason,
                    if r.transient { "" } else { &message },
                ),
            ],
        };
        fields["observedGeneration"] = generation.into();
        fields["conditions"] = json!(conditions);
        // Nothing to write when nothing changed (our own write comes back through the watch).
        let current = o.data.get("status").cloned().unwrap_or(Value::Null);
        if current == fields {
            return;
        }
        // Fields the last status had and this one does not (a digest no longer served) go.
        if let Some(old) = current.as_object() {
            for key in old.keys() {
                if fields.get(key).is_none() {
                    fields[key] = Value::Null;
                }
            }
        }
        let api: Api<DynamicObject> = Api::all_with(self.shared.client.clone(), &api_resource());
        if !self.shared.fence.allows() {
            return;
        }
        if let Err(e) = self
            .shared
            .fence
            .bounded(api.patch_status(
                &o.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": fields })),
            ))
            .await
        {
            tracing::warn!(plugin = %o.name_any(), "status not written: {e}");
        }
    }
}
