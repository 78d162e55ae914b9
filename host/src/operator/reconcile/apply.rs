//! Apply: what the plan says, server-side applied; an update carries the uid of the object the
//! plan saw as ours, so the API server itself refuses it if that object was replaced. What an
//! answer means ([`answer`]) and which fields are immutable are decided without the cluster.

use super::*;

/// The body of an apply. An update carries the uid of the object the plan saw as ours: the API
/// server refuses it (409, uid mismatch) if that object has since been deleted or replaced, so an
/// object made meanwhile by someone else is never written over. A create carries none: the API
/// server accepts no uid on create, so a create relies on the cache having seen every object of
/// its kind (the window is the watch's delay, usually milliseconds; see docs/operator.md).
pub(super) fn guarded(planned: &Planned) -> Value {
    let mut body = planned.child.clone();
    if let Write::Update { uid } = &planned.write {
        body["metadata"]["uid"] = uid.clone().into();
    }
    body
}

/// What became of the applies.
#[derive(Debug, Default)]
pub(crate) struct ApplyReport {
    pub children: Vec<Child>,
    pub skipped: Vec<Skipped>,
    /// Applies the API server refused for good (the object is invalid, say).
    pub failures: Vec<String>,
    /// Applies that failed for a reason that may pass (the API server unavailable or
    /// overloaded, a timeout): retried with backoff, and said in status meanwhile.
    pub transient: Vec<String>,
    /// Objects that appeared, or were replaced, between the plan and the apply: the next
    /// reconciliation sees them in the cache and decides again.
    pub raced: Vec<String>,
    /// Children applied that changed, for the `Applied` event.
    pub changed: Vec<String>,
    /// Whether someone else changed a child while we applied it.
    pub look_again: bool,
}

/// How the API server answered one apply.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Answer {
    /// The kind is not served (its CRD went away).
    NotServed(String),
    /// The uid guard held: the object is not the one the plan saw.
    Raced(String),
    /// Refused for good.
    Refused(String),
    /// Anything else: retried with the whole reconciliation.
    Retry,
}

/// Whether the API server refused an apply for changing fields it does not let change.
pub(super) fn immutable(message: &str) -> bool {
    message.contains("field is immutable")
        || message.contains("updates to statefulset spec for fields other than")
}

/// The fields of a kind that cannot change once the object exists, as paths.
pub(super) fn immutable_fields(kind: &str) -> &'static [&'static str] {
    match kind {
        "StatefulSet" => &[
            "spec.selector",
            "spec.serviceName",
            "spec.volumeClaimTemplates",
            "spec.podManagementPolicy",
        ],
        "Deployment" | "DaemonSet" | "ReplicaSet" => &["spec.selector"],
        "Job" => &["spec.selector", "spec.template"],
        "Service" => &["spec.clusterIP"],
        "PersistentVolumeClaim" => &["spec.storageClassName", "spec.accessModes"],
        _ => &[],
    }
}

/// What to say about an apply refused for an immutable field: which fields differ between the
/// live object and the render, and how to let the operator make it again (it never deletes an
/// object to get past this by itself: that would replace pods, or lose data).
pub(super) async fn immutable_fix(shared: &Shared, namespace: &str, planned: &Planned) -> String {
    let api: Api<DynamicObject> =
        Api::namespaced_with(shared.client.clone(), namespace, &planned.ar);
    let Ok(Some(live)) = shared.fence.bounded(api.get_opt(&planned.name)).await else {
        return String::new();
    };
    let live = serde_json::to_value(&live).unwrap_or_default();
    immutable_advice(
        &planned.kind,
        &planned.name,
        namespace,
        &planned.child,
        &live,
    )
}

/// What to say about the rendered object `rendered` of `kind` refused for an immutable field,
/// given the `live` one: empty when no immutable field the render sets differs. Decided from the
/// two objects alone.
pub(super) fn immutable_advice(
    kind: &str,
    name: &str,
    namespace: &str,
    rendered: &Value,
    live: &Value,
) -> String {
    let at = |v: &Value, path: &str| {
        path.split('.')
            .try_fold(v, |v, key| v.get(key))
            .cloned()
            .unwrap_or(Value::Null)
    };
    let differ: Vec<String> = immutable_fields(kind)
        .iter()
        .filter_map(|path| {
            let (mine, theirs) = (at(rendered, path), at(live, path));
            // Only what the render sets: the server fills in the rest.
            let comparable = |v: &Value| match v {
                Value::Array(items) => Value::Array(
                    items
                        .iter()
                        .map(|i| json!({ "name": at(i, "metadata.name") }))
                        .collect(),
                ),
                other => other.clone(),
            };
            let (m, t) = if *path == "spec.volumeClaimTemplates" {
                (comparable(&mine), comparable(&theirs))
            } else {
                (mine.clone(), theirs.clone())
            };
            (!m.is_null() && m != t).then(|| format!("{path} (live {t}, rendered {m})"))
        })
        .collect();
    if differ.is_empty() {
        return String::new();
    }
    let shown = kind.to_lowercase();
    let selector_differs = differ.iter().any(|d| d.starts_with("spec.selector"));
    let claims_differ = differ
        .iter()
        .any(|d| d.starts_with("spec.volumeClaimTemplates"));
    let how = match kind {
        "StatefulSet" if !selector_differs => format!(
            "kubectl delete {shown} {name} -n {namespace} --cascade=orphan (its pods and claims stay; the operator makes it again, and the new one adopts the pods, which roll only if their template changed)"
        ),
        "StatefulSet" => format!(
            "kubectl delete {shown} {name} -n {namespace} (its pods go, its PersistentVolumeClaims stay; the operator makes it again)"
        ),
        _ => format!("kubectl delete {shown} {name} -n {namespace} (the operator makes it again)"),
    };
    // Pods of a claim template of another name mount new, empty claims: say so before anyone
    // runs the command.
    let data = if claims_differ {
        " Its claim templates differ: pods made from the rendered ones get new, empty claims and the old claims stay, unused; copy the data across (or keep the earlier claim names in the spec, where the plugin allows) before you let it go."
    } else {
        ""
    };
    format!(
        ". Immutable and different from the live object: {}.{data} The operator does not delete it by itself; to let it make the object again: {how}",
        differ.join("; ")
    )
}

pub(super) fn answer(e: &kube::Error) -> Answer {
    match e {
        kube::Error::Api(s) if s.code == 404 => Answer::NotServed(s.message.clone()),
        // The object is not the one the plan saw: gone ("uid mismatch: the provided object
        // specified uid ..., and no existing object was found"), replaced (metadata.uid is
        // immutable), or taken meanwhile by another controller (only one reference may be the
        // controller).
        kube::Error::Api(s)
            if (s.code == 409 && s.message.contains("uid mismatch"))
                || (s.code == 422
                    && (s.message.contains("metadata.uid")
                        || s.message
                            .contains("Only one reference can have Controller set to true"))) =>
        {
            Answer::Raced(s.message.clone())
        }
        kube::Error::Api(s) if (400..500).contains(&s.code) && s.code != 409 && s.code != 429 => {
            Answer::Refused(s.message.clone())
        }
        _ => Answer::Retry,
    }
}

/// Applies every child the plan writes, all at once, and reads back readiness.
pub(super) async fn apply(
    plan: &Plan,
    owner: &Owner,
    shared: &Arc<Shared>,
) -> Result<ApplyReport, ReconcileError> {
    let namespace = &owner.resource.namespace;
    let calls = plan.children.iter().map(|p| {
        let api: Api<LiveChild> =
            Api::namespaced_with(shared.client.clone(), namespace, &Arc::new(p.ar.clone()));
        async move {
            if p.write == Write::Skip {
                return Ok(None);
            }
            let params = PatchParams::apply(FIELD_MANAGER).force();
            shared
                .write(
                    "apply",
                    namespace,
                    &p.ar,
                    api.patch(&p.name, &params, &Patch::Apply(guarded(p))),
                )
                .await
                .map(Some)
        }
    });
    let batch = shared.applies.begin(
        namespace,
        plan.children
            .iter()
            .filter(|p| p.write != Write::Skip)
            .map(|p| p.cache_key.clone())
            .collect(),
    );
    let results = futures::future::join_all(calls).await;
    // What the watch showed of each child while it was applied: anything but the apply's own
    // result is someone else's change, to be looked at again.
    let seen_meanwhile = batch.finish();
    let mut out = ApplyReport::default();
    for (planned, result) in plan.children.iter().zip(results) {
        let mut record = planned.previous.clone();
        let live_object = match result {
            Ok(answer) => {
                if let Some(answer) = &answer {
                    let seen = seen_meanwhile.get(&planned.cache_key);
                    // Deleted while applied (after the apply landed): nothing is in place.
                    let deleted = seen.is_some_and(|seen| seen.deleted);
                    out.look_again |= deleted
                        || seen.is_some_and(|seen| {
                            seen.versions
                                .iter()
                                .any(|rv| Some(rv) != answer.metadata.resource_version.as_ref())
                        });
                    let now = Applied {
                        hash: planned.hash,
                        uid: answer.metadata.uid.clone(),
                        generation: answer.metadata.generation,
                        resource_version: answer.metadata.resource_version.clone(),
                    };
                    if !deleted {
                        lock(&shared.applied).insert(planned.cache_key.clone(), now.clone());
                        record = Some(now);
                    }
                    if planned.changed {
                        out.changed
                            .push(format!("{} {}", planned.kind, planned.name));
                    }
                }
                answer
            }
            Err(e) => {
                let what = format!("{} {}", planned.kind, planned.name);
                match answer(&e) {
                    Answer::NotServed(message) => out.skipped.push(Skipped {
                        api_version: planned.api_version.clone(),
                        kind: planned.kind.clone(),
                        name: planned.name.clone(),
                        reason: format!("the API server does not serve it: {message}"),
                    }),
                    Answer::Raced(message) => out.raced.push(format!(
                        "{what} changed hands while it was applied ({message}); looking again"
                    )),
                    Answer::Refused(message) => {
                        let fix = if immutable(&message) {
                            immutable_fix(shared, namespace, planned).await
                        } else {
                            String::new()
                        };
                        out.failures.push(format!("{what}: {message}{fix}"));
                    }
                    Answer::Retry => out.transient.push(format!("{what}: {e}")),
                }
                continue;
            }
        };
        // The apply's answer, else (left as it is) the watch's copy.
        let live = live_object.as_ref().or(planned.live.as_deref());
        let (ready, message) = if live.is_none() && status::reports_readiness(&planned.kind) {
            // Applied moments ago, not yet seen by the watch: its status is still to come.
            (false, "not observed yet".to_owned())
        } else {
            status::child_ready(&planned.kind, live)
        };
        out.children.push(Child {
            api_version: planned.api_version.clone(),
            kind: planned.kind.clone(),
            name: planned.name.clone(),
            ready,
            message,
            applied: record,
            observed: live.map(|l| (l.replicas(), l.status.clone())),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_immutable_field_that_differs_is_named_with_how_to_let_the_operator_make_it_again() {
        let live = json!({ "spec": {
            "selector": { "matchLabels": { "app": "db" } },
            "serviceName": "db",
            "volumeClaimTemplates": [{ "metadata": { "name": "data" }, "status": { "phase": "Bound" } }],
        } });
        // Only the claim templates differ (by name; what the server fills in does not count).
        let rendered = json!({ "spec": {
            "selector": { "matchLabels": { "app": "db" } },
            "serviceName": "db",
            "volumeClaimTemplates": [{ "metadata": { "name": "storage" } }],
        } });
        let advice = immutable_advice("StatefulSet", "db", "ns", &rendered, &live);
        assert!(
            advice.contains("spec.volumeClaimTemplates (live"),
            "{advice}"
        );
        assert!(!advice.contains("spec.serviceName"), "{advice}");
        assert!(advice.contains("--cascade=orphan"), "{advice}");
        assert!(advice.contains("new, empty claims"), "{advice}");
        // A selector that differs: the pods cannot be adopted, so no orphaning.
        let mut moved = rendered.clone();
        moved["spec"]["selector"]["matchLabels"]["app"] = json!("other");
        let advice = immutable_advice("StatefulSet", "db", "ns", &moved, &live);
        assert!(advice.contains("spec.selector"), "{advice}");
        assert!(!advice.contains("--cascade=orphan"), "{advice}");
        // Nothing the render sets differs: nothing to say.
        let same = json!({ "spec": { "serviceName": "db" } });
        assert_eq!(
            immutable_advice("StatefulSet", "db", "ns", &same, &live),
            ""
        );
        assert_eq!(immutable_advice("ConfigMap", "db", "ns", &moved, &live), "");
    }

    #[test]
    fn the_api_servers_answers_are_told_apart() {
        let api = |code: u16, message: &str| {
            kube::Error::Api(
                kube::core::Status::failure(message, "")
                    .with_code(code)
                    .boxed(),
            )
        };
        let mismatch = "Operation cannot be fulfilled on deployments.apps \"web\": uid mismatch: the provided object specified uid a, and no existing object was found";
        assert_eq!(answer(&api(409, mismatch)), Answer::Raced(mismatch.into()));
        assert!(matches!(
            answer(&api(409, "conflict on fluid")),
            Answer::Retry
        ));
        assert!(matches!(
            answer(&api(
                422,
                "metadata.ownerReferences: Invalid value: Only one reference can have Controller set to true"
            )),
            Answer::Raced(_)
        ));
        assert!(matches!(
            answer(&api(
                422,
                "metadata.uid: Invalid value: \"b\": field is immutable"
            )),
            Answer::Raced(_)
        ));
        assert!(matches!(answer(&api(429, "slow down")), Answer::Retry));
        assert!(matches!(answer(&api(500, "oops")), Answer::Retry));
        assert!(matches!(
            answer(&api(422, "spec.x: Invalid")),
            Answer::Refused(_)
        ));
        assert!(matches!(answer(&api(404, "no kind")), Answer::NotServed(_)));
    }
}
