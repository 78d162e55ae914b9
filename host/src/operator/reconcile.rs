//! One reconciliation: render, check, apply, prune, report.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

use super::metrics::{ControllerLabels, FailureLabels, Metrics, PluginLabels, ResultLabels};
use super::report::{self, Key};
use super::status::{self, Child, Outcome, Skipped};
use super::{FIELD_MANAGER, KindCtx, LiveChild, backoff, gvk_key};
use crate::types::Resource as PluginResource;

/// How often a resource is rendered again with no event (a resync).
const RESYNC: Duration = Duration::from_secs(600);

/// What a child looked like after our last apply of it.
#[derive(Debug, Clone)]
pub(crate) struct Applied {
    hash: u64,
    generation: Option<i64>,
    resource_version: Option<String>,
}

impl Applied {
    /// Whether `live` is exactly what our apply left (its echo through the watch).
    pub(crate) fn is_echo(&self, live: &LiveChild) -> bool {
        self.resource_version.is_some() && live.metadata.resource_version == self.resource_version
    }
}

/// Why a reconciliation failed (it is retried with backoff).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReconcileError {
    /// A call to the API server failed.
    #[error("{0}")]
    Kube(#[from] kube::Error),
    /// The render task died.
    #[error("render task: {0}")]
    Join(String),
}

/// Runs one reconciliation with metrics around it.
pub(crate) async fn reconcile(
    obj: Arc<DynamicObject>,
    ctx: Arc<KindCtx>,
) -> Result<Action, ReconcileError> {
    // Nothing is reconciled before every watch has listed what it watches: pruning and the
    // skipping of unchanged children read the child caches, which must be complete.
    let mut synced = ctx.shared.synced.subscribe();
    let _ = synced.wait_for(|s| *s).await;
    let labels = ControllerLabels {
        controller: ctx.controller.clone(),
    };
    let metrics = &ctx.shared.metrics;
    metrics.active_workers.get_or_create(&labels).inc();
    let started = Instant::now();
    let result = reconcile_inner(&obj, &ctx).await;
    Metrics::observe(
        &metrics.reconcile_time.get_or_create(&labels),
        started.elapsed(),
    );
    metrics.active_workers.get_or_create(&labels).dec();
    let key = format!(
        "{}/{}/{}",
        ctx.controller,
        obj.namespace().unwrap_or_default(),
        obj.name_any()
    );
    let outcome = match &result {
        Ok(_) => {
            if let Ok(mut f) = ctx.shared.failures.lock() {
                f.remove(&key);
            }
            "success"
        }
        Err(e) => {
            tracing::warn!(controller = %ctx.controller, resource = %key, "reconcile failed: {e}");
            metrics.reconcile_errors.get_or_create(&labels).inc();
            "error"
        }
    };
    metrics
        .reconcile_total
        .get_or_create(&ResultLabels {
            controller: ctx.controller.clone(),
            result: outcome.to_owned(),
        })
        .inc();
    result
}

/// Retries a failed reconciliation: 1 s, doubling to 5 minutes, per resource.
pub(crate) fn error_policy(
    obj: Arc<DynamicObject>,
    _e: &ReconcileError,
    ctx: Arc<KindCtx>,
) -> Action {
    let key = format!(
        "{}/{}/{}",
        ctx.controller,
        obj.namespace().unwrap_or_default(),
        obj.name_any()
    );
    let n = ctx.shared.failures.lock().map_or(0, |mut f| {
        let n = f.entry(key).or_insert(0);
        *n += 1;
        *n
    });
    backoff(n)
}

fn plugin_resource(obj: &DynamicObject, ctx: &KindCtx) -> PluginResource {
    let meta = &obj.metadata;
    let map = |m: &Option<BTreeMap<String, String>>| m.clone().unwrap_or_default();
    PluginResource {
        api_version: ctx.ar.api_version.clone(),
        kind: ctx.ar.kind.clone(),
        name: obj.name_any(),
        namespace: obj.namespace().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        generation: meta.generation.unwrap_or(0),
        labels: map(&meta.labels),
        annotations: map(&meta.annotations),
        spec: obj
            .data
            .get("spec")
            .filter(|s| s.is_object())
            .cloned()
            .unwrap_or_else(|| json!({})),
    }
}

fn hash(v: &Value) -> u64 {
    let mut h = DefaultHasher::new();
    v.to_string().hash(&mut h);
    h.finish()
}

/// Adds what the host owns on every child: the controller owner reference, the ownership label
/// and `managed-by`.
fn stamp(child: &mut Value, owner: &DynamicObject, ctx: &KindCtx) {
    let uid = owner.metadata.uid.as_deref().unwrap_or_default();
    super::stamp_child(
        child,
        &ctx.ar.api_version,
        &ctx.ar.kind,
        &owner.name_any(),
        uid,
    );
}

/// One rendered child, and what to do with it.
struct Planned<'a> {
    api_version: String,
    kind: String,
    name: String,
    served: &'a super::ChildKind,
    /// The object to apply, stamped.
    child: Value,
    hash: u64,
    /// Its key in `Shared::applied`.
    cache_key: String,
    /// Whether it is left as it is.
    skip: bool,
    /// Whether applying it changes it (for the `Applied` event).
    changed: bool,
    /// For a child left as it is whose readiness counts, the watch's copy.
    live: Option<Arc<LiveChild>>,
}

/// Whether the live child still is what we last applied: same desired object, our labels and
/// annotations in place, our owner reference, and no spec change since (its generation, or its
/// resourceVersion for kinds without one).
fn unchanged(
    desired: &Value,
    hash: u64,
    applied: Option<&Applied>,
    live: Option<&LiveChild>,
) -> bool {
    let (Some(applied), Some(live)) = (applied, live) else {
        return false;
    };
    if applied.hash != hash {
        return false;
    }
    let subset = |want: &Value, have: &Option<BTreeMap<String, String>>| {
        want.as_object().is_none_or(|w| {
            w.iter().all(|(k, v)| {
                have.as_ref().and_then(|h| h.get(k)).map(String::as_str) == v.as_str()
            })
        })
    };
    if !subset(&desired["metadata"]["labels"], &live.metadata.labels)
        || !subset(
            &desired["metadata"]["annotations"],
            &live.metadata.annotations,
        )
    {
        return false;
    }
    let uid = desired["metadata"]["ownerReferences"][0]["uid"].as_str();
    if !live
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|r| Some(r.uid.as_str()) == uid && r.controller == Some(true))
    {
        return false;
    }
    match applied.generation {
        Some(g) => live.metadata.generation == Some(g),
        None => live.metadata.resource_version == applied.resource_version,
    }
}

/// Asks for an event about `obj`; it is written off the reconciliation's path.
fn publish(ctx: &KindCtx, obj: &DynamicObject, type_: EventType, reason: &str, note: String) {
    let event = Event {
        type_,
        reason: reason.to_owned(),
        note: Some(note),
        action: "Reconcile".into(),
        secondary: None,
    };
    ctx.shared
        .reports
        .event(event, obj.object_ref(&ctx.ar), &ctx.controller);
}

fn report_key(ctx: &KindCtx, obj: &DynamicObject) -> Key {
    Key {
        controller: ctx.controller.clone(),
        namespace: obj.namespace().unwrap_or_default(),
        name: obj.name_any(),
    }
}

/// The status `obj` has or is about to have: one not yet written is newer than the watch's.
fn current_status(ctx: &KindCtx, obj: &DynamicObject) -> Option<Value> {
    ctx.shared
        .reports
        .pending_status(&report_key(ctx, obj))
        .or_else(|| obj.data.get("status").cloned())
}

/// Asks for `desired` to be written as the status of `obj` when it differs from its current
/// one (see [`current_status`]); returns whether it differs.
fn report_status(
    ctx: &KindCtx,
    obj: &DynamicObject,
    current: Option<&Value>,
    desired: Value,
    settling: bool,
) -> bool {
    let comparable = |v: &Value| {
        let mut v = v.clone();
        if let Some(conds) = v.get_mut("conditions").and_then(Value::as_array_mut) {
            for c in conds {
                if let Some(c) = c.as_object_mut() {
                    c.remove("lastTransitionTime");
                }
            }
        }
        v
    };
    if status::same(&comparable(&desired), current.map(comparable).as_ref()) {
        return false;
    }
    let hold = if settling {
        report::SETTLING
    } else {
        Duration::ZERO
    };
    ctx.shared
        .reports
        .status(report_key(ctx, obj), &ctx.ar, desired, hold);
    true
}

async fn reconcile_inner(obj: &DynamicObject, ctx: &KindCtx) -> Result<Action, ReconcileError> {
    if obj.metadata.deletion_timestamp.is_some() {
        // The garbage collector removes the children through their owner references.
        return Ok(Action::await_change());
    }
    let shared = &ctx.shared;
    let resource = plugin_resource(obj, ctx);
    let generation = resource.generation;
    let (plugin_name, plugin_id) = match shared
        .registry
        .lookup(&resource.api_version, &resource.kind)
    {
        Ok((p, _)) => (
            p.name().to_owned(),
            format!("{}@{} ({})", p.name(), p.info().version, &p.sha256()[..12]),
        ),
        Err(e) => (String::new(), e.to_string()),
    };

    // Render in a blocking task: the sandbox is synchronous and CPU-bound.
    let registry = shared.registry.clone();
    let started = Instant::now();
    let to_render = resource.clone();
    let rendered = tokio::task::spawn_blocking(move || registry.render(&to_render))
        .await
        .map_err(|e| ReconcileError::Join(e.to_string()))?;
    Metrics::observe(
        &shared.metrics.render_time.get_or_create(&PluginLabels {
            plugin: plugin_name.clone(),
        }),
        started.elapsed(),
    );

    let objects = match rendered {
        Ok(objects) => objects,
        Err(e) => {
            shared
                .metrics
                .render_failures
                .get_or_create(&FailureLabels {
                    plugin: plugin_name,
                    reason: e.reason().to_owned(),
                })
                .inc();
            let outcome = Outcome::Stalled {
                reason: e.reason().to_owned(),
                message: e.to_string(),
                children: vec![],
                skipped: vec![],
            };
            let current = current_status(ctx, obj);
            let desired = status::status(&outcome, generation, current.as_ref(), &plugin_id);
            if report_status(ctx, obj, current.as_ref(), desired, false) {
                publish(ctx, obj, EventType::Warning, e.reason(), e.to_string());
            }
            // Nothing changes until the spec (or the plugin) does; look again now and then.
            return Ok(Action::requeue(RESYNC));
        }
    };

    let namespace = resource.namespace.clone();
    let uid = resource.uid.clone();
    let mut skipped = Vec::new();
    let mut desired_names = BTreeSet::new();
    // First decide, per child, whether it must be written; then do every write at once.
    let mut work = Vec::new();
    for mut child in objects {
        let api_version = child["apiVersion"].as_str().unwrap_or_default().to_owned();
        let kind = child["kind"].as_str().unwrap_or_default().to_owned();
        let name = child["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let key = gvk_key(&api_version, &kind);
        let served = match shared.children.get(&key) {
            Some(Ok(c)) => c,
            Some(Err(why)) => {
                skipped.push(Skipped {
                    api_version,
                    kind,
                    name,
                    reason: why.clone(),
                });
                continue;
            }
            None => {
                skipped.push(Skipped {
                    api_version,
                    kind,
                    name,
                    reason: "not a declared child kind".into(),
                });
                continue;
            }
        };
        desired_names.insert(format!("{key}/{name}"));
        stamp(&mut child, obj, ctx);
        let h = hash(&child);
        let cache_key = super::applied_key(&uid, &key, &name);
        let live = served
            .store
            .get(&ObjectRef::new_with(&name, served.ar.clone()).within(&namespace));
        let previous = shared
            .applied
            .lock()
            .ok()
            .and_then(|a| a.get(&cache_key).cloned());
        // A child we applied that the watch has not shown yet is not applied again: a deletion
        // of it is seen by the watch, which then forgets the apply (see `dispatch_children`).
        let not_seen_yet = live.is_none() && previous.as_ref().is_some_and(|p| p.hash == h);
        let skip = not_seen_yet || unchanged(&child, h, previous.as_ref(), live.as_deref());
        let changed = previous.is_none_or(|p| p.hash != h) || live.is_none();
        // A child left as it is reports readiness from the watch's copy.
        let live = live.filter(|_| skip && status::reports_readiness(&kind));
        work.push(Planned {
            api_version,
            kind,
            name,
            served,
            child,
            hash: h,
            cache_key,
            skip,
            changed,
            live,
        });
    }
    let calls = work.iter().map(|p| {
        let Planned {
            name,
            served,
            child,
            skip,
            ..
        } = p;
        let api: Api<LiveChild> =
            Api::namespaced_with(shared.client.clone(), &namespace, &served.ar);
        async move {
            if *skip {
                return Ok(None);
            }
            let params = PatchParams::apply(FIELD_MANAGER).force();
            shared
                .write(
                    "apply",
                    &served.ar,
                    api.patch(name, &params, &Patch::Apply(child)),
                )
                .await
                .map(Some)
        }
    });
    let batch = shared.applies.begin(
        work.iter()
            .filter(|w| !w.skip)
            .map(|w| w.cache_key.clone())
            .collect(),
    );
    let results = futures::future::join_all(calls).await;
    // What the watch showed of each child while it was applied: anything but the apply's own
    // result is someone else's change, to be looked at again.
    let seen_meanwhile = batch.finish();
    let mut look_again = false;

    let mut children = Vec::new();
    let mut failures = Vec::new();
    let mut applied_now = Vec::new();
    for (planned, result) in work.into_iter().zip(results) {
        let Planned {
            api_version,
            kind,
            name,
            hash: h,
            cache_key,
            skip,
            changed,
            live,
            ..
        } = planned;
        let live_object = match result {
            Ok(out) => {
                if let (false, Some(out)) = (skip, &out) {
                    let others = seen_meanwhile.get(&cache_key).is_some_and(|seen| {
                        seen.iter()
                            .any(|rv| Some(rv) != out.metadata.resource_version.as_ref())
                    });
                    look_again |= others;
                    let record = Applied {
                        hash: h,
                        generation: out.metadata.generation,
                        resource_version: out.metadata.resource_version.clone(),
                    };
                    if let Ok(mut a) = shared.applied.lock() {
                        a.insert(cache_key, record);
                    }
                    if changed {
                        applied_now.push(format!("{kind} {name}"));
                    }
                }
                out
            }
            Err(kube::Error::Api(s)) if s.code == 404 && !skip => {
                skipped.push(Skipped {
                    api_version,
                    kind,
                    name,
                    reason: format!("the API server does not serve it: {}", s.message),
                });
                continue;
            }
            Err(kube::Error::Api(s))
                if (400..500).contains(&s.code) && s.code != 409 && s.code != 429 && !skip =>
            {
                failures.push(format!("{kind} {name}: {}", s.message));
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        // The apply's answer, else (left as it is) the watch's copy.
        let live = live_object.as_ref().or(live.as_deref());
        let (ready, message) = if live.is_none() && status::reports_readiness(&kind) {
            // Applied moments ago, not yet seen by the watch: its status is still to come.
            (false, "not observed yet".to_owned())
        } else {
            status::child_ready(&kind, live)
        };
        children.push(Child {
            api_version,
            kind,
            name,
            ready,
            message,
        });
    }
    if !applied_now.is_empty() {
        publish(
            ctx,
            obj,
            EventType::Normal,
            "Applied",
            format!("applied {}", applied_now.join(", ")),
        );
    }

    // Prune what this render no longer returns: the children the watches show with our
    // ownership label.
    let owned = shared
        .owned
        .lock()
        .map(|index| index.owned_by(&uid))
        .unwrap_or_default();
    for (key, child_namespace, name) in owned {
        let Some(Ok(served)) = shared.children.get(&key) else {
            continue;
        };
        if child_namespace != namespace || desired_names.contains(&format!("{key}/{name}")) {
            continue;
        }
        let gone = served
            .store
            .get(&ObjectRef::new_with(&name, served.ar.clone()).within(&child_namespace))
            .is_none_or(|m| m.metadata.deletion_timestamp.is_some());
        if gone {
            continue;
        }
        let api: Api<LiveChild> =
            Api::namespaced_with(shared.client.clone(), &namespace, &served.ar);
        let deleted = shared
            .write(
                "delete",
                &served.ar,
                api.delete(&name, &DeleteParams::background()),
            )
            .await;
        match deleted {
            Ok(_) | Err(kube::Error::Api(_)) => {}
            Err(e) => return Err(e.into()),
        }
        if let Ok(mut a) = shared.applied.lock() {
            a.remove(&super::applied_key(&uid, &key, &name));
        }
        publish(
            ctx,
            obj,
            EventType::Normal,
            "Pruned",
            format!(
                "deleted {} {name}: the render no longer returns it",
                served.ar.kind
            ),
        );
    }

    let outcome = if failures.is_empty() {
        Outcome::Applied { children, skipped }
    } else {
        Outcome::Stalled {
            reason: "ApplyFailed".into(),
            message: failures.join("; "),
            children,
            skipped,
        }
    };
    let current = current_status(ctx, obj);
    let desired = status::status(&outcome, generation, current.as_ref(), &plugin_id);
    let settling =
        matches!(&outcome, Outcome::Applied { children, .. } if children.iter().any(|c| !c.ready));
    let changed = report_status(ctx, obj, current.as_ref(), desired, settling);
    if let (true, Outcome::Stalled { message, .. }) = (changed, &outcome) {
        publish(ctx, obj, EventType::Warning, "ApplyFailed", message.clone());
    }
    if look_again {
        return Ok(Action::requeue(Duration::from_millis(100)));
    }
    Ok(Action::requeue(RESYNC))
}
