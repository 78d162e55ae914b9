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
        if !self.writes() {
            return;
        }
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
        self.shared
            .metrics
            .plugin_ready
            .get_or_create(&crate::operator::metrics::PluginLabels {
                plugin: o.name_any(),
            })
            .set(i64::from(refusal.is_none()));
        fields["observedGeneration"] = generation.into();
        fields["conditions"] = json!(conditions);
        // Nothing to write when nothing changed (our own write comes back through the watch).
        let current = o.data.get("status").cloned().unwrap_or(Value::Null);
        if current == fields {
            return;
        }
        // Fields the last status had and this one does not (a digest no longer served, a
        // signature's `unverified`) go, at any depth: a merge patch keeps what it does not null.
        null_what_is_gone(&current, &mut fields);
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

/// Sets to null, in the merge patch `new`, each field `old` has and `new` does not, in nested
/// objects too (arrays are replaced whole by a merge patch).
fn null_what_is_gone(old: &Value, new: &mut Value) {
    let (Some(old), Some(new)) = (old.as_object(), new.as_object_mut()) else {
        return;
    };
    for (key, was) in old {
        match new.get_mut(key) {
            None => {
                new.insert(key.clone(), Value::Null);
            }
            Some(is) => null_what_is_gone(was, is),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_merge_patch_nulls_what_is_gone_at_any_depth() {
        let old = json!({
            "digest": "sha256:1",
            "signature": {"rule": "rules[1]", "unverified": "no signature", "signedBy": ["k"]},
            "kinds": ["A.x"],
        });
        let mut new = json!({"signature": {"rule": "rules[0]", "signedBy": ["k2"]}, "kinds": []});
        null_what_is_gone(&old, &mut new);
        assert_eq!(
            new,
            json!({
                "digest": null,
                "signature": {"rule": "rules[0]", "unverified": null, "signedBy": ["k2"]},
                "kinds": [],
            })
        );
    }
}
