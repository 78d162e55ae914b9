//! One reconciliation, in phases: render, plan, apply, prune, report.
//!
//! - [`render`] runs the plugin in its sandbox, off the async threads, and never waits past the
//!   plugin's deadline (plus a margin).
//! - [`plan`] decides, per rendered child, whether to create it, update it or leave it as it
//!   is, and refuses to touch an object this resource does not control (a `ChildConflict`). It
//!   only reads the caches, so it is unit-tested on its own.
//! - [`apply`] server-side applies what the plan says; an update carries the uid of the object
//!   the plan saw as ours, so the API server itself refuses it if that object was replaced.
//! - [`prune`] deletes the children this resource controls that the render no longer returns,
//!   each delete preconditioned on the child's uid.
//! - [`report`] turns all of it into status, events and what to do next.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, Preconditions};
use kube::discovery::ApiResource;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use serde_json::{Value, json};

use super::children::{Applied, ChildId, applied_key, controller_uid, kind_key};
use super::metrics::{
    ControllerLabels, FailureLabels, Metrics, NameLabels, PluginLabels, ResultLabels,
};
use super::report::{self, Key, QueuedEvent};
use super::status::{self, Child, Outcome, Problem, Skipped};
use super::{KindCtx, LiveChild, Pairs, Served, Shared, Unserved, backoff, gvk_key, lock, read};
use crate::ownership::{
    ADOPT_BY_ANNOTATION, Control, FIELD_MANAGER, asks_adoption, consents, control, handle,
};
use crate::plugin::PluginError;
use crate::registry::RenderError;
use crate::types::Resource as PluginResource;

mod apply;
mod outcome;
mod plan;
mod prune;
mod render;

use apply::*;
pub(crate) use outcome::publish;
use outcome::*;
use plan::*;
use prune::*;
pub(crate) use render::wake_put_off;
use render::*;

/// How often a resource is rendered again with no event (a resync).
const RESYNC: Duration = Duration::from_secs(600);

/// How long a reconciliation waits for its share of the memory budget of plugin calls before
/// it leaves its slot to others and is tried again. Well below the time after which `/healthz`
/// calls a reconciliation stuck.
const BUDGET_WAIT: Duration = Duration::from_secs(20);

/// How many reconciliations of one namespace may wait for the budget at once: a quarter of the
/// reconciliations a Kind runs at once (`--concurrency`), from one to four. Past that, one does
/// not wait but leaves its slot at once and is tried again later ([`budget_retry`]): a namespace
/// that floods the operator then holds a few slots of each Kind, not all of them, and the
/// resources of other namespaces get slots (and, by turns, the budget) in seconds.
pub(crate) fn waiting_per_namespace(concurrency: u16) -> usize {
    usize::from(concurrency / 4).clamp(1, 4)
}

/// When a reconciliation that found its namespace's share of waiting full is tried again: a
/// tenth of a second for each of its namespace's reconciliations put off so, up to half a minute,
/// so that a namespace of thousands of waiting resources does not spin the controller.
fn budget_retry(deferred: usize) -> Duration {
    let tenths = u64::try_from(deferred).unwrap_or(u64::MAX).clamp(1, 300);
    Duration::from_millis(100 * tenths)
}

/// How many times over a rendered output's parsed size its share of the budget stays held
/// while it is applied: the parsed objects, and the bodies made of them.
const APPLY_COPIES: u64 = 2;
/// Why a reconciliation failed; it is retried with backoff (see [`error_policy`]).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReconcileError {
    /// A call to the API server failed.
    #[error(transparent)]
    Kube(#[from] kube::Error),
    /// The render task died.
    #[error("render task: {0}")]
    Join(#[from] tokio::task::JoinError),
    /// The render failed for a reason that is not the plugin's (reported in status).
    #[error("{0}")]
    Render(RenderError),
    /// Children could not be pruned or applied for now (reported in status).
    #[error("{}", .0.iter().map(|p| p.message.as_str()).collect::<Vec<_>>().join("; "))]
    Retry(Vec<Problem>),
}

/// Runs one reconciliation with metrics around it.
pub(crate) async fn reconcile(
    obj: Arc<Served>,
    ctx: Arc<KindCtx>,
) -> Result<Action, ReconcileError> {
    // Nothing is reconciled before every watch has listed what it watches: pruning and the
    // skipping of unchanged children read the child caches, which must be complete.
    // A shutdown before then (its watches may never list) leaves the resource to the next
    // leader instead of holding the shutdown for the sync timeout.
    let mut synced = ctx.shared.synced.subscribe();
    let mut stopping = ctx.shared.stopping.subscribe();
    tokio::select! {
        _ = synced.wait_for(|s| *s) => {}
        _ = stopping.wait_for(|s| *s) => return Ok(Action::await_change()),
    }
    let metrics = &ctx.shared.metrics;
    let key = queue_key(&obj);
    ctx.settling.started(&key);
    metrics.dequeued(&ctx.controller, &key);
    let result = {
        let _measure = Measure::start(metrics, &ctx.controller);
        reconcile_inner(&obj, &ctx).await
    };
    let key = report_key(&ctx, &obj);
    let outcome = match &result {
        Ok(_) => {
            // A reconciliation put off for the budget is no success: the backoff of its last
            // failure stays.
            if !ctx
                .shared
                .budget
                .deferred(&key.namespace, &budget_key(&ctx, &key.name))
            {
                lock(&ctx.shared.failures).remove(&key);
            }
            "success"
        }
        Err(e) => {
            tracing::warn!(controller = %ctx.controller, resource = %key, "reconcile failed: {e}");
            metrics
                .reconcile_errors
                .get_or_create(&ControllerLabels {
                    controller: ctx.controller.clone(),
                })
                .inc();
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

/// Moves the resource whose metadata is `meta` to the shard `target` by labelling it so
/// ([`super::shard::SHARD_LABEL`]): a server-side apply of that label alone, under a field
/// manager of its own, by the holder of the shard the resource is in now (nobody else writes
/// it; shard 0's, for a resource with no label yet: `labeller`). The holder of `target` serves
/// the resource from then on, and applies its children again with that label. Applied to the
/// version `meta` names: if the resource changed since (its label too, perhaps), the API server
/// refuses (409) and the watch brings the new version.
pub(super) async fn move_to_shard(
    meta: &kube::api::ObjectMeta,
    ctx: &KindCtx,
    target: u32,
) -> Result<(), kube::Error> {
    let namespace = meta.namespace.clone().unwrap_or_default();
    let name = meta.name.clone().unwrap_or_default();
    let api: Api<DynamicObject> =
        Api::namespaced_with(ctx.shared.client.clone(), &namespace, &*ctx.ar);
    let body = json!({
        "apiVersion": ctx.ar.api_version,
        "kind": ctx.ar.kind,
        "metadata": {
            "name": name,
            // Applied to this very object, as it was seen: one made again under its name is
            // not moved, nor one changed since.
            "uid": meta.uid,
            "resourceVersion": meta.resource_version,
            "labels": { super::shard::SHARD_LABEL: target.to_string() },
        },
    });
    let params = PatchParams::apply(SHARD_FIELD_MANAGER).force();
    // Answered with the object's metadata alone: a whole object read back per label (every
    // resource, after a single leader or a reshard) is nothing this needs.
    ctx.shared
        .write(
            "apply",
            &namespace,
            &ctx.ar,
            api.patch_metadata(&name, &params, &Patch::Apply(&body)),
        )
        .await?;
    tracing::info!(controller = %ctx.controller, resource = %format!("{namespace}/{name}"), shard = target, "labelled with its shard");
    Ok(())
}

/// The field manager of the shard label on resources: its own, so that the label is kept apart
/// from the children's applies and never taken from the resource's author.
pub(crate) const SHARD_FIELD_MANAGER: &str = "wasm-operator.dev/shard";

/// How the work-queue metrics name a resource: `namespace/name`.
pub(crate) fn queue_key(obj: &DynamicObject) -> String {
    format!(
        "{}/{}",
        obj.metadata.namespace.as_deref().unwrap_or_default(),
        obj.metadata.name.as_deref().unwrap_or_default()
    )
}

/// [`queue_key`] of the resource a reference names.
pub(crate) fn ref_key<K: kube::runtime::reflector::Lookup>(
    r: &kube::runtime::reflector::ObjectRef<K>,
) -> String {
    format!("{}/{}", r.namespace.as_deref().unwrap_or_default(), r.name)
}

/// Times a reconciliation and counts it as active until dropped, so that no early return can
/// leave the gauge up; `/healthz` also sees it as running.
struct Measure<'a> {
    metrics: &'a Arc<Metrics>,
    labels: ControllerLabels,
    started: Instant,
    _running: super::metrics::Running,
}

impl<'a> Measure<'a> {
    fn start(metrics: &'a Arc<Metrics>, controller: &str) -> Self {
        let labels = ControllerLabels {
            controller: controller.to_owned(),
        };
        metrics.active_workers.get_or_create(&labels).inc();
        Self {
            metrics,
            labels,
            started: Instant::now(),
            _running: metrics.running(controller),
        }
    }
}

impl Drop for Measure<'_> {
    fn drop(&mut self) {
        let took = self.started.elapsed();
        Metrics::observe(
            &self.metrics.reconcile_time.get_or_create(&self.labels),
            took,
        );
        Metrics::observe(
            &self.metrics.work_duration.get_or_create(&NameLabels {
                name: self.labels.controller.clone(),
            }),
            took,
        );
        self.metrics
            .active_workers
            .get_or_create(&self.labels)
            .dec();
    }
}

/// Retries a failed reconciliation: 1 s, doubling to 5 minutes, per resource.
pub(crate) fn error_policy(obj: Arc<Served>, _e: &ReconcileError, ctx: Arc<KindCtx>) -> Action {
    ctx.shared
        .metrics
        .queue_retries
        .get_or_create(&NameLabels {
            name: ctx.controller.clone(),
        })
        .inc();
    let mut failures = lock(&ctx.shared.failures);
    let n = failures.entry(report_key(&ctx, &obj)).or_insert(0);
    *n += 1;
    backoff(*n)
}

/// Reads from the API server the objects this reconciliation needs that the watches know by
/// name only (`children::Elsewhere`): a rendered object whose name an object that is not ours,
/// or another shard's child, has; a child the status records that is not in the store (a
/// resource that moved here from another shard: its children still carry the old shard's
/// label). Usually none: a child of ours is in the store, and a new name in neither.
async fn read_name_only<'a>(
    objects: &[Value],
    owner: &Owner,
    shared: &'a Shared,
) -> Result<WithReads<'a, Shared>, kube::Error> {
    let namespace = &owner.resource.namespace;
    let rendered = objects.iter().map(|o| {
        let (api_version, kind, name) = crate::ownership::identity(o);
        (kind_key(&api_version, &kind), name)
    });
    let recorded = owner.recorded.keys().cloned();
    let mut reads = WithReads {
        view: shared,
        read: BTreeMap::new(),
        known: BTreeMap::new(),
    };
    for (kind, name) in rendered.chain(recorded) {
        let id = (kind, namespace.clone(), name);
        if reads.read.contains_key(&id) || shared.live(&id.0, &id.1, &id.2).is_some() {
            continue;
        }
        let Some((ar, known)) = super::read(&shared.watched)
            .get(&id.0)
            .map(|w| (w.ar.clone(), w.name_only(&id.1, &id.2)))
        else {
            continue;
        };
        if known.is_none() {
            continue;
        }
        let api: Api<LiveChild> = Api::namespaced_with(shared.client.clone(), namespace, &ar);
        let object = shared
            .read_by_name(namespace, &ar, api.get_opt(&id.2))
            .await?;
        reads.known.insert(id.clone(), known);
        reads.read.insert(id, object.map(Arc::new));
    }
    Ok(reads)
}

/// Whether the watch has shown a change of `id`, an object it knows by name only, since just
/// before it was read: a change that woke nobody, since the resource did not wait on it yet.
fn changed_since_read(shared: &Shared, reads: &WithReads<'_, Shared>, id: &ChildId) -> bool {
    let now = super::read(&shared.watched)
        .get(&id.0)
        .and_then(|w| w.name_only(&id.1, &id.2));
    reads.known.get(id).is_some_and(|before| *before != now)
}

async fn reconcile_inner(obj: &DynamicObject, ctx: &KindCtx) -> Result<Action, ReconcileError> {
    if obj.metadata.deletion_timestamp.is_some() {
        // The garbage collector removes the children through their owner references.
        return Ok(Action::await_change());
    }
    // With shards: a resource of this shard whose hash names another is moved there (one
    // write of its label), and served here no more.
    if let Some(shard) = ctx.shared.shard {
        let labels = obj.metadata.labels.as_ref();
        if !shard.owns(labels) {
            // Seen just before it moved away: another shard's now.
            return Ok(Action::await_change());
        }
        let (namespace, name) = (obj.namespace().unwrap_or_default(), obj.name_any());
        let uid = obj.metadata.uid.clone().unwrap_or_default();
        let version = obj.metadata.resource_version.clone().unwrap_or_default();
        if let Some(target) = shard.destination(&namespace, &name, labels) {
            // Asked again before the watch shows the label written (a child changed, say): it
            // is not written twice.
            let moved = lock(&ctx.shared.labelled).get(&uid) == Some(&version);
            if !moved {
                move_to_shard(&obj.metadata, ctx, target).await?;
                lock(&ctx.shared.labelled).insert(uid, version);
            }
            return Ok(Action::await_change());
        }
        // Here to stay: a record of an earlier move (it came back) is let go.
        lock(&ctx.shared.labelled).remove(&uid);
        // The watch keeps a resource it judged not this shard's to serve without its spec and
        // status (`Shard::serves`, the same judgement as above): never rendered from, which
        // would prune every child of a spec read as empty.
        if obj.data.is_null() {
            tracing::error!(controller = %ctx.controller, resource = %format!("{namespace}/{name}"), "kept without its spec by this shard's watch, yet served here: not rendered");
            return Ok(Action::await_change());
        }
    }
    let owner = Owner::of(obj, ctx);
    let grant = match take_budget(&owner, ctx).await {
        Ok(Ok(grant)) => grant,
        Ok(Err(later)) => return Ok(Action::requeue(later)),
        Err(e) => return report_render_failure(obj, ctx, &owner, e),
    };
    let (rendered, grant) = render(&owner, ctx, grant).await?;
    let (objects, mut warnings) = match rendered {
        Ok(rendered) => rendered,
        Err(e) => return report_render_failure(obj, ctx, &owner, e),
    };
    // The instance is gone; what stays is the output, until it has been applied.
    let output: u64 = objects.iter().map(crate::operator::budget::footprint).sum();
    let grant = grant.map(|g| g.shrink(output.saturating_mul(APPLY_COPIES)));
    // Whatever the plugin, nothing is applied that its author could not have made: pods within
    // the namespace's Pod Security level, nothing named outside the namespace.
    let level = if objects
        .iter()
        .any(|o| crate::policy::pod_security::pod_template(o).is_some())
    {
        // Not known (the API server did not answer): tried again with backoff.
        ctx.shared
            .pod_security_level(&owner.resource.namespace)
            .await?
    } else {
        ctx.shared.rules.pod_security
    };
    let refusals = crate::policy::judge(
        &ctx.shared.rules,
        &owner.resource.namespace,
        level,
        &objects,
    );
    if !refusals.is_empty() {
        return report_refusals(obj, ctx, &owner, refusals);
    }
    let reads = read_name_only(&objects, &owner, &ctx.shared).await?;
    let plan = plan(objects, &owner, &reads);
    for conflict in &plan.conflicts {
        lock(&ctx.shared.waiting).wait(conflict.id.clone(), owner.id());
    }
    // An object in the way that changed between the plan and the wait above woke nobody.
    let moved = plan.conflicts.iter().any(|c| {
        let (kind, ns, name) = &c.id;
        match reads.read.get(&c.id) {
            Some(_) => changed_since_read(&ctx.shared, &reads, &c.id),
            None => {
                ctx.shared
                    .live(kind, ns, name)
                    .and_then(|l| l.metadata.uid.clone())
                    != c.uid
            }
        }
    });
    let mut applied = apply(&plan, &owner, &ctx.shared).await?;
    applied.look_again |= moved;
    let pruned = prune(&owner, ctx, &plan.desired, &reads).await;
    drop(grant);
    let mut again = false;
    let fields = match plugin_status(&owner, ctx, &applied.children).await {
        Ok(fields) => fields,
        Err(e) => {
            // No room in the budget for the call now: it never ran, and is made again shortly,
            // not at the next resync.
            again = matches!(
                e,
                RenderError::Plugin {
                    error: PluginError::Busy(_),
                    ..
                }
            );
            // The fields stay as they were; the resource says why they are not new.
            warnings.push(crate::types::Warning {
                field: "status".into(),
                message: format!("its status fields were not computed: {e}"),
            });
            plugin_fields(current_status(ctx, obj).as_ref())
        }
    };
    report(
        obj,
        ctx,
        &owner,
        plan,
        applied,
        pruned,
        Reported {
            warnings,
            fields,
            again,
        },
    )
}

/// What the plugin said besides its manifests (contract 1.1).
struct Reported {
    warnings: Vec<crate::types::Warning>,
    fields: serde_json::Map<String, Value>,
    /// Whether the status call could not be made for now and is to be made again shortly.
    again: bool,
}

/// When a status call put off for want of room in the memory budget is made again.
const STATUS_RETRY: Duration = Duration::from_secs(5);

/// The plugin's own fields of a status (those the host does not own).
fn plugin_fields(status: Option<&Value>) -> serde_json::Map<String, Value> {
    status
        .and_then(Value::as_object)
        .map(|s| {
            s.iter()
                .filter(|(k, _)| !crate::kube_schema::HOST_STATUS_FIELDS.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// The status fields the plugin computes (contract 1.1) from the resource and its children as
/// the watches show them now, in a blocking task under the same deadline as a render. None for
/// a plugin that computes none.
async fn plugin_status(
    owner: &Owner,
    ctx: &KindCtx,
    children: &[Child],
) -> Result<serde_json::Map<String, Value>, RenderError> {
    let shared = &ctx.shared;
    let registry = shared.registry();
    // Most plugins compute no status (every 1.0 plugin): nothing to observe, no call to make.
    let computes = registry
        .lookup(&owner.resource.api_version, &owner.resource.kind)
        .map_or(true, |(plugin, kind)| {
            plugin.reports() && kind.status_schema.is_some()
        });
    if !computes {
        return Ok(serde_json::Map::new());
    }
    let observed: Vec<crate::types::ObservedChild> = children
        .iter()
        .filter_map(|c| {
            // What readiness was judged on (the apply's answer, else the watch's copy).
            let (replicas, counts) = match &c.observed {
                Some(observed) => observed.clone(),
                None => {
                    let live = shared.live(
                        &kind_key(&c.api_version, &c.kind),
                        &owner.resource.namespace,
                        &c.name,
                    )?;
                    (live.replicas(), live.status.clone())
                }
            };
            let status = counts
                .and_then(|c| serde_json::to_value(c).ok())
                .unwrap_or_else(|| Value::Object(serde_json::Map::new()));
            Some(crate::types::ObservedChild {
                api_version: c.api_version.clone(),
                kind: c.kind.clone(),
                name: c.name.clone(),
                replicas,
                status,
            })
        })
        .collect();
    let resource = owner.resource.clone();
    let plugin_name = ctx.plugin().0;
    let failed = |error| RenderError::Plugin {
        plugin: plugin_name.clone(),
        error,
    };
    let Ok(grant) = take_budget(owner, ctx).await? else {
        return Err(failed(PluginError::Busy(
            "no room in the memory budget of plugin calls (--render-memory) for now".into(),
        )));
    };
    let task = tokio::task::spawn_blocking(move || {
        // The share of the budget is held until the call has ended.
        let _grant = grant;
        let (plugin, _) = registry.lookup(&resource.api_version, &resource.kind)?;
        plugin
            .status(&resource, &observed, registry.context())
            .map_err(|error| RenderError::Plugin {
                plugin: plugin.name().to_owned(),
                error,
            })
    });
    match tokio::time::timeout(shared.render_wait, task).await {
        Ok(Ok(fields)) => fields.map(Option::unwrap_or_default),
        Ok(Err(joined)) => Err(failed(PluginError::Panic(joined.to_string()))),
        Err(_) => Err(failed(PluginError::Deadline(shared.render_wait))),
    }
}

/// The resource being reconciled, as the phases need it.
pub(crate) struct Owner {
    /// What the plugin renders.
    pub resource: PluginResource,
    /// Its controller's `apiVersion/Kind` (the key its controller is woken by).
    pub controller_kind: String,
    /// Whether it may adopt any object nobody controls: it asks ([`ADOPT_ANNOTATION`]) in a
    /// namespace the operator adopts in (`--adopt-in-namespace`).
    pub adopt: bool,
    /// How an object names it to consent to its adoption ([`ADOPT_BY_ANNOTATION`]).
    pub handle: String,
    /// What its status says our last applies left, by kind key and name: after a restart, the
    /// record of what is already in place.
    pub recorded: BTreeMap<(String, String), Applied>,
    /// The children its status lists, kept as they are when a render fails.
    pub last_children: Vec<Child>,
    /// The shard it is served in, which its children are labelled with (with `--shards`).
    pub shard: Option<u32>,
}

impl Owner {
    fn of(obj: &DynamicObject, ctx: &KindCtx) -> Self {
        let resource = crate::ownership::plugin_resource(obj, &ctx.ar);
        let adopt = asks_adoption(&resource)
            && ctx
                .shared
                .rules
                .adopt_namespaces
                .contains(&resource.namespace);
        let handle = handle(&ctx.ar.plural, &ctx.ar.group, &resource.name);
        let status = crate::ownership::stored(obj, "status");
        let last_children: Vec<Child> = status
            .as_ref()
            .and_then(|s| s.get("children"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|c| {
                let text = |k: &str| c.get(k).and_then(Value::as_str).map(str::to_owned);
                Some(Child {
                    api_version: text("apiVersion")?,
                    kind: text("kind")?,
                    name: text("name")?,
                    ready: c.get("ready").and_then(Value::as_bool).unwrap_or(false),
                    message: text("message").unwrap_or_default(),
                    applied: c.get("applied").and_then(Applied::from_status),
                    observed: None,
                })
            })
            .collect();
        let recorded = last_children
            .iter()
            .filter_map(|c| {
                let applied = c.applied.clone()?;
                Some(((kind_key(&c.api_version, &c.kind), c.name.clone()), applied))
            })
            .collect();
        Self {
            controller_kind: format!("{}/{}", ctx.ar.api_version, ctx.ar.kind),
            resource,
            adopt,
            handle,
            recorded,
            last_children,
            shard: ctx
                .shared
                .shard
                .filter(|s| s.sharding.count > 1)
                .map(|s| s.index),
        }
    }

    fn id(&self) -> super::children::OwnerId {
        (
            self.controller_kind.clone(),
            self.resource.namespace.clone(),
            self.resource.name.clone(),
        )
    }

    /// How this resource is named in messages: `Kind name`.
    fn display(&self) -> String {
        format!("{} {}", self.resource.kind, self.resource.name)
    }
}
