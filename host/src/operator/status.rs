//! Status in the kstatus convention, and when a child counts as ready.

use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use super::LiveChild;

/// A child as the status summarises it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Child {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub ready: bool,
    pub message: String,
}

/// A child that was not applied, and why.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Skipped {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub reason: String,
}

/// Whether the status of a child of this kind says when it is ready (the others count as ready
/// once they exist).
pub(crate) fn reports_readiness(kind: &str) -> bool {
    matches!(kind, "Deployment" | "StatefulSet")
}

/// Whether a child is ready, from its live object (`None`: not read, it exists).
pub(crate) fn child_ready(kind: &str, live: Option<&LiveChild>) -> (bool, String) {
    let Some(o) = live else {
        return (true, "exists".into());
    };
    let int = |field: &str| {
        o.status
            .as_ref()
            .and_then(|s| s.get(field))
            .and_then(Value::as_i64)
            .unwrap_or(0)
    };
    let generation = o.metadata.generation.unwrap_or(0);
    let observed = int("observedGeneration");
    // (the count that makes it ready, its word): the rollout must also be fully updated.
    let (ready_field, word) = match kind {
        "Deployment" => ("availableReplicas", "available"),
        "StatefulSet" => ("readyReplicas", "ready"),
        _ => return (true, "exists".into()),
    };
    let want = o.replicas().unwrap_or(1);
    let (ready, updated) = (int(ready_field), int("updatedReplicas"));
    if observed < generation {
        (
            false,
            format!("the {kind} controller has not seen the latest spec"),
        )
    } else if ready < want || updated < want {
        (
            false,
            format!("{ready}/{want} {word}, {updated}/{want} updated"),
        )
    } else {
        (true, format!("{ready}/{want} {word}"))
    }
}

/// The outcome of a reconciliation, as status.
#[derive(Debug, Clone)]
pub(crate) enum Outcome {
    /// Rendered and applied; ready when every child is.
    Applied {
        children: Vec<Child>,
        skipped: Vec<Skipped>,
    },
    /// Nothing (or not everything) could be applied; a person must act.
    Stalled {
        reason: String,
        message: String,
        children: Vec<Child>,
        skipped: Vec<Skipped>,
    },
}

fn condition(
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: i64,
    previous: Option<&Value>,
    now: &str,
) -> Value {
    let status = if status { "True" } else { "False" };
    // A condition keeps its transition time until its status changes.
    let since = previous
        .and_then(|conds| conds.as_array())
        .and_then(|conds| conds.iter().find(|c| c["type"] == type_))
        .filter(|c| c["status"] == status)
        .and_then(|c| c["lastTransitionTime"].as_str())
        .unwrap_or(now)
        .to_owned();
    json!({
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": since,
    })
}

/// The status to write for `outcome`, given the resource's generation and current status.
pub(crate) fn status(
    outcome: &Outcome,
    generation: i64,
    current: Option<&Value>,
    plugin: &str,
) -> Value {
    let now = Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Second)
        .unwrap_or_else(|_| Timestamp::now())
        .to_string();
    let previous = current.and_then(|s| s.get("conditions"));
    // Ready, Reconciling and Stalled all follow from three facts: ready, stalled, and why.
    let (is_ready, stalled, reason, message, children, skipped) = match outcome {
        Outcome::Applied { children, skipped } => {
            let waiting: Vec<String> = children
                .iter()
                .filter(|c| !c.ready)
                .map(|c| format!("{} {}: {}", c.kind, c.name, c.message))
                .collect();
            let summary = if waiting.is_empty() {
                let mut m = format!("{} children ready", children.len());
                if !skipped.is_empty() {
                    m.push_str(&format!("; {} skipped (see status.skipped)", skipped.len()));
                }
                m
            } else {
                format!("waiting for {}", waiting.join("; "))
            };
            let ready = waiting.is_empty();
            let reason = if ready { "Ready" } else { "Progressing" };
            (ready, false, reason, summary, children, skipped)
        }
        Outcome::Stalled {
            reason,
            message,
            children,
            skipped,
        } => (
            false,
            true,
            reason.as_str(),
            message.clone(),
            children,
            skipped,
        ),
    };
    let cond = |type_: &str, status: bool, reason: &str, message: &str| {
        condition(type_, status, reason, message, generation, previous, &now)
    };
    let (stalled_reason, stalled_message) = if stalled {
        (reason, message.as_str())
    } else {
        ("Applied", "children applied")
    };
    let conditions = [
        cond("Ready", is_ready, reason, &message),
        cond("Reconciling", !is_ready && !stalled, reason, &message),
        cond("Stalled", stalled, stalled_reason, stalled_message),
    ];
    json!({
        "observedGeneration": generation,
        "conditions": conditions,
        "children": children.iter().map(|c| json!({
            "apiVersion": c.api_version, "kind": c.kind, "name": c.name, "ready": c.ready, "message": c.message,
        })).collect::<Vec<_>>(),
        "skipped": skipped.iter().map(|s| json!({
            "apiVersion": s.api_version, "kind": s.kind, "name": s.name, "reason": s.reason,
        })).collect::<Vec<_>>(),
        "plugin": plugin,
    })
}

/// Whether `desired` says the same as `current` (the server drops empty lists, so they are
/// equal to absent ones).
pub(crate) fn same(desired: &Value, current: Option<&Value>) -> bool {
    fn norm(v: &Value) -> Value {
        match v {
            Value::Object(m) => Value::Object(
                m.iter()
                    .filter(|(_, v)| !matches!(v, Value::Array(a) if a.is_empty()) && !v.is_null())
                    .map(|(k, v)| (k.clone(), norm(v)))
                    .collect(),
            ),
            Value::Array(a) => Value::Array(a.iter().map(norm).collect()),
            other => other.clone(),
        }
    }
    current.is_some_and(|c| norm(desired) == norm(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rollouts_are_ready_when_updated_and_available_for_the_latest_generation() {
        let live = |v: Value| -> LiveChild { serde_json::from_value(v).unwrap() };
        let deployment = |generation: i64, observed: i64, available: i64, updated: i64| {
            live(json!({
                "metadata": { "generation": generation },
                "spec": { "replicas": 2 },
                "status": { "observedGeneration": observed, "availableReplicas": available, "updatedReplicas": updated },
            }))
        };
        assert_eq!(
            child_ready("Deployment", Some(&deployment(2, 2, 2, 2))),
            (true, "2/2 available".into())
        );
        assert!(
            !child_ready("Deployment", Some(&deployment(2, 1, 2, 2))).0,
            "stale observedGeneration"
        );
        assert_eq!(
            child_ready("Deployment", Some(&deployment(1, 1, 1, 2))),
            (false, "1/2 available, 2/2 updated".into())
        );
        let sts = live(json!({
            "metadata": { "generation": 1 },
            "spec": { "replicas": 3 },
            "status": { "observedGeneration": 1, "readyReplicas": 3, "updatedReplicas": 3 },
        }));
        assert_eq!(
            child_ready("StatefulSet", Some(&sts)),
            (true, "3/3 ready".into())
        );
        assert_eq!(child_ready("Service", Some(&sts)), (true, "exists".into()));
        assert_eq!(child_ready("Deployment", None), (true, "exists".into()));
    }

    #[test]
    fn status_keeps_transition_times_and_ignores_empty_lists() {
        let children = vec![Child {
            api_version: "v1".into(),
            kind: "Service".into(),
            name: "a".into(),
            ready: true,
            message: "exists".into(),
        }];
        let outcome = Outcome::Applied {
            children,
            skipped: vec![],
        };
        let first = status(&outcome, 1, None, "p");
        assert_eq!(first["conditions"][0]["status"], "True");
        let mut earlier = first.clone();
        earlier["conditions"][0]["lastTransitionTime"] = "2020-01-01T00:00:00Z".into();
        let second = status(&outcome, 1, Some(&earlier), "p");
        assert_eq!(
            second["conditions"][0]["lastTransitionTime"],
            "2020-01-01T00:00:00Z"
        );
        assert!(same(
            &json!({ "a": 1, "skipped": [] }),
            Some(&json!({ "a": 1 }))
        ));
        assert!(!same(&json!({ "a": 1 }), Some(&json!({ "a": 2 }))));
    }
}
