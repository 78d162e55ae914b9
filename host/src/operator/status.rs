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
    /// What our last apply of it left, if we know.
    pub applied: Option<super::children::Applied>,
    /// What readiness was judged on (`spec.replicas`, the counts of its status): what a 1.1
    /// plugin's status call sees of it. Not written to status.
    pub observed: Option<(Option<i64>, Option<super::live::Counts>)>,
}

/// How the status names the plugin that reconciled: `NAME@VERSION (SHA256 prefix)`.
pub(crate) fn plugin_label(plugin: &crate::plugin::Plugin) -> String {
    format!(
        "{}@{} ({})",
        plugin.name(),
        plugin.info().version,
        &plugin.sha256()[..12]
    )
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
    readiness_rule(kind).is_some()
}

/// The status count that makes a child of `kind` ready, and its word, for the kinds whose
/// rollout the operator waits on; every other kind is ready once it exists.
pub(crate) fn readiness_rule(kind: &str) -> Option<(&'static str, &'static str)> {
    match kind {
        "Deployment" => Some(("availableReplicas", "available")),
        "StatefulSet" => Some(("readyReplicas", "ready")),
        _ => None,
    }
}

/// Whether a child is ready, from its live object (`None`: not read, it exists).
pub(crate) fn child_ready(kind: &str, live: Option<&LiveChild>) -> (bool, String) {
    let Some(o) = live else {
        return (true, "exists".into());
    };
    let int = |field: &str| o.status.as_ref().map_or(0, |s| s.get(field));
    let generation = o.metadata.generation.unwrap_or(0);
    let observed = int("observedGeneration");
    // (the count that makes it ready, its word): the rollout must also be fully updated.
    let Some((ready_field, word)) = readiness_rule(kind) else {
        return (true, "exists".into());
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

/// Something that keeps a resource from being Ready besides children still settling.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Problem {
    /// A short CamelCase reason (`ChildConflict`, `ApplyFailed`, `PruneFailed`, a render's).
    pub reason: String,
    /// What happened, naming the object or field.
    pub message: String,
    /// Whether the operator tries again by itself (`Reconciling`) or a person must act first
    /// (`Stalled`).
    pub retrying: bool,
}

/// The outcome of a reconciliation, as status.
#[derive(Debug, Clone, Default)]
pub(crate) struct Outcome {
    /// The children applied (or left as they are), each ready or not.
    pub children: Vec<Child>,
    /// The children not applied, and why.
    pub skipped: Vec<Skipped>,
    /// What keeps the resource from being Ready, if anything.
    pub problems: Vec<Problem>,
    /// What the plugin left out, and why (contract 1.1): shown without making it un-Ready.
    pub warnings: Vec<crate::types::Warning>,
    /// The status fields the plugin computed (contract 1.1), beside the host's own.
    pub fields: serde_json::Map<String, Value>,
}

impl Outcome {
    /// Whether a person must act before the resource can become Ready.
    pub(crate) fn stalled(&self) -> bool {
        self.problems.iter().any(|p| !p.retrying)
    }

    /// Whether the status says the children are still settling (applied, not all ready).
    pub(crate) fn settling(&self) -> bool {
        self.problems.is_empty() && self.children.iter().any(|c| !c.ready)
    }
}

/// The longest condition message written; the API server refuses more than 32 KiB, and a person
/// reads the first lines (the events and the logs have each problem in full).
const MAX_MESSAGE: usize = 4096;

/// The longest event note the API server accepts (`events.k8s.io/v1`).
pub(crate) const MAX_NOTE: usize = 1024;

/// `message`, cut at [`MAX_MESSAGE`] bytes on a character boundary, saying so.
pub(crate) fn bounded(message: &str) -> String {
    bounded_to(message, MAX_MESSAGE)
}

/// `message`, cut to at most `limit` bytes on a character boundary, saying so.
pub(crate) fn bounded_to(message: &str, limit: usize) -> String {
    if message.len() <= limit {
        return message.to_owned();
    }
    // Room for the note saying how much was cut.
    crate::units::bounded(message.to_owned(), limit.saturating_sub(32))
}

/// The time a condition written now records: to the second, as the API server keeps it.
pub(crate) fn now() -> String {
    Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Second)
        .unwrap_or_else(|_| Timestamp::now())
        .to_string()
}

/// A kstatus condition; it keeps the transition time `previous` (the conditions written last)
/// gives it until its status changes.
pub(crate) fn condition(
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
    let now = now();
    let previous = current.and_then(|s| s.get("conditions"));
    // Ready, Reconciling and Stalled all follow from three facts: ready, stalled, and why.
    let Outcome {
        children,
        skipped,
        problems,
        warnings,
        fields,
    } = outcome;
    let stalled = outcome.stalled();
    let (is_ready, reason, message) = if let Some(first) = problems.first() {
        let message = problems
            .iter()
            .map(|p| p.message.as_str())
            .collect::<Vec<_>>()
            .join("; ");
        (false, first.reason.as_str(), message)
    } else {
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
        (ready, if ready { "Ready" } else { "Progressing" }, summary)
    };
    // The first warning shows in the Ready message too, so `kubectl get` shows it.
    let message = match warnings.first() {
        Some(first) => format!(
            "{message}; warning: {first}{}",
            if warnings.len() > 1 {
                format!(
                    " (and {} more, see the Warning condition)",
                    warnings.len() - 1
                )
            } else {
                String::new()
            }
        ),
        None => message,
    };
    let message = bounded(&message);
    let cond = |type_: &str, status: bool, reason: &str, message: &str| {
        condition(type_, status, reason, message, generation, previous, &now)
    };
    let first_stalled = problems.iter().find(|p| !p.retrying);
    let (stalled_reason, stalled_message) = if let Some(p) = first_stalled {
        (p.reason.as_str(), p.message.as_str())
    } else if problems.is_empty() {
        ("Applied", "children applied")
    } else {
        ("Retrying", "the operator retries by itself")
    };
    let mut conditions = vec![
        cond("Ready", is_ready, reason, &message),
        cond("Reconciling", !is_ready && !stalled, reason, &message),
        cond("Stalled", stalled, stalled_reason, stalled_message),
    ];
    // Not one of kstatus's abnormal-true conditions: tools show it, and the resource stays
    // Ready.
    if !warnings.is_empty() {
        let all = warnings
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ");
        conditions.push(cond("Warning", true, "PluginWarning", &bounded(&all)));
    }
    // The plugin's fields first: the host's own (which its schema may not name) go over them.
    let mut status = Value::Object(fields.clone());
    let host = json!({
        "observedGeneration": generation,
        "conditions": conditions,
        "children": children.iter().map(|c| {
            let mut child = json!({
                "apiVersion": c.api_version, "kind": c.kind, "name": c.name, "ready": c.ready, "message": c.message,
            });
            if let Some(applied) = &c.applied {
                child["applied"] = applied.to_status();
            }
            child
        }).collect::<Vec<_>>(),
        "skipped": skipped.iter().map(|s| json!({
            "apiVersion": s.api_version, "kind": s.kind, "name": s.name, "reason": s.reason,
        })).collect::<Vec<_>>(),
        "plugin": plugin,
    });
    if let (Some(status), Value::Object(host)) = (status.as_object_mut(), host) {
        status.extend(host);
    }
    status
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
            applied: None,
            observed: None,
        }];
        let outcome = Outcome {
            children,
            ..Outcome::default()
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

    #[test]
    fn a_problem_a_person_must_fix_stalls_and_one_being_retried_reconciles() {
        let problem = |reason: &str, retrying| Problem {
            reason: reason.into(),
            message: format!("{reason} happened"),
            retrying,
        };
        let conds = |o: &Outcome| {
            let s = status(o, 3, None, "p");
            let get = |t: &str| {
                let c = s["conditions"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|c| c["type"] == t)
                    .unwrap()
                    .clone();
                (
                    c["status"].as_str().unwrap().to_owned(),
                    c["reason"].as_str().unwrap().to_owned(),
                )
            };
            (get("Ready"), get("Reconciling"), get("Stalled"))
        };
        let conflict = Outcome {
            problems: vec![problem("ChildConflict", false)],
            ..Outcome::default()
        };
        let (ready, reconciling, stalled) = conds(&conflict);
        assert_eq!(ready, ("False".into(), "ChildConflict".into()));
        assert_eq!(reconciling.0, "False");
        assert_eq!(stalled, ("True".into(), "ChildConflict".into()));
        let prune = Outcome {
            problems: vec![problem("PruneFailed", true)],
            ..Outcome::default()
        };
        let (ready, reconciling, stalled) = conds(&prune);
        assert_eq!(ready, ("False".into(), "PruneFailed".into()));
        assert_eq!(reconciling, ("True".into(), "PruneFailed".into()));
        assert_eq!(stalled, ("False".into(), "Retrying".into()));
        // Both: a person must act.
        let both = Outcome {
            problems: vec![
                problem("PruneFailed", true),
                problem("ChildConflict", false),
            ],
            ..Outcome::default()
        };
        assert_eq!(conds(&both).2.0, "True");
        let s = status(&both, 3, None, "p");
        let message = s["conditions"][0]["message"].as_str().unwrap();
        assert!(
            message.contains("PruneFailed happened; ChildConflict happened"),
            "{message}"
        );
    }

    #[test]
    fn long_messages_are_cut_on_a_character_boundary() {
        let long = "é".repeat(5000);
        let cut = bounded(&long);
        assert!(cut.len() <= MAX_MESSAGE, "{}", cut.len());
        assert!(bounded_to(&long, MAX_NOTE).len() <= MAX_NOTE);
        assert!(cut.ends_with("more bytes)"), "{cut}");
        assert_eq!(bounded("short"), "short");
    }
}
