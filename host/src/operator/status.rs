//! Status in the kstatus convention, and when a child counts as ready.

use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

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

/// Whether a child is ready, from its live object (`None`: not read, it exists).
pub(crate) fn child_ready(kind: &str, live: Option<&Value>) -> (bool, String) {
    let Some(o) = live else {
        return (true, "exists".into());
    };
    let int = |p: &str| o.pointer(p).and_then(Value::as_i64).unwrap_or(0);
    let generation = int("/metadata/generation");
    let observed = int("/status/observedGeneration");
    match kind {
        "Deployment" => {
            let want = o
                .pointer("/spec/replicas")
                .and_then(Value::as_i64)
                .unwrap_or(1);
            let (updated, available) = (
                int("/status/updatedReplicas"),
                int("/status/availableReplicas"),
            );
            if observed < generation {
                (
                    false,
                    "the Deployment controller has not seen the latest spec".into(),
                )
            } else if updated < want || available < want {
                (
                    false,
                    format!("{available}/{want} available, {updated}/{want} updated"),
                )
            } else {
                (true, format!("{available}/{want} available"))
            }
        }
        "StatefulSet" => {
            let want = o
                .pointer("/spec/replicas")
                .and_then(Value::as_i64)
                .unwrap_or(1);
            let (ready, updated) = (int("/status/readyReplicas"), int("/status/updatedReplicas"));
            if observed < generation {
                (
                    false,
                    "the StatefulSet controller has not seen the latest spec".into(),
                )
            } else if ready < want || updated < want {
                (
                    false,
                    format!("{ready}/{want} ready, {updated}/{want} updated"),
                )
            } else {
                (true, format!("{ready}/{want} ready"))
            }
        }
        _ => (true, "exists".into()),
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
        .round(jiff_unit())
        .unwrap_or_else(|_| Timestamp::now())
        .to_string();
    let previous = current.and_then(|s| s.get("conditions"));
    let (ready, reconciling, stalled, children, skipped) = match outcome {
        Outcome::Applied { children, skipped } => {
            let waiting: Vec<String> = children
                .iter()
                .filter(|c| !c.ready)
                .map(|c| format!("{} {}: {}", c.kind, c.name, c.message))
                .collect();
            let total = children.len();
            let summary = if waiting.is_empty() {
                let mut m = format!("{total} children ready");
                if !skipped.is_empty() {
                    m.push_str(&format!("; {} skipped (see status.skipped)", skipped.len()));
                }
                m
            } else {
                format!("waiting for {}", waiting.join("; "))
            };
            let is_ready = waiting.is_empty();
            (
                condition(
                    "Ready",
                    is_ready,
                    if is_ready { "Ready" } else { "Progressing" },
                    &summary,
                    generation,
                    previous,
                    &now,
                ),
                condition(
                    "Reconciling",
                    !is_ready,
                    if is_ready { "Ready" } else { "Progressing" },
                    &summary,
                    generation,
                    previous,
                    &now,
                ),
                condition(
                    "Stalled",
                    false,
                    "Applied",
                    "children applied",
                    generation,
                    previous,
                    &now,
                ),
                children,
                skipped,
            )
        }
        Outcome::Stalled {
            reason,
            message,
            children,
            skipped,
        } => (
            condition("Ready", false, reason, message, generation, previous, &now),
            condition(
                "Reconciling",
                false,
                reason,
                message,
                generation,
                previous,
                &now,
            ),
            condition("Stalled", true, reason, message, generation, previous, &now),
            children,
            skipped,
        ),
    };
    json!({
        "observedGeneration": generation,
        "conditions": [ready, reconciling, stalled],
        "children": children.iter().map(|c| json!({
            "apiVersion": c.api_version, "kind": c.kind, "name": c.name, "ready": c.ready, "message": c.message,
        })).collect::<Vec<_>>(),
        "skipped": skipped.iter().map(|s| json!({
            "apiVersion": s.api_version, "kind": s.kind, "name": s.name, "reason": s.reason,
        })).collect::<Vec<_>>(),
        "plugin": plugin,
    })
}

fn jiff_unit() -> k8s_openapi::jiff::Unit {
    k8s_openapi::jiff::Unit::Second
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
