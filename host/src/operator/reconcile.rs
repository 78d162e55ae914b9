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

use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, Preconditions};
use kube::discovery::ApiResource;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

use super::children::{Applied, ChildId, applied_key, controller_uid, kind_key};
use super::metrics::{ControllerLabels, FailureLabels, Metrics, PluginLabels, ResultLabels};
use super::report::{self, Key};
use super::status::{self, Child, Outcome, Problem, Skipped};
use super::{KindCtx, LiveChild, Shared, backoff, gvk_key, lock, read};
use crate::ownership::{
    ADOPT_BY_ANNOTATION, Control, FIELD_MANAGER, asks_adoption, consents, control, handle,
};
use crate::plugin::PluginError;
use crate::registry::RenderError;
use crate::types::Resource as PluginResource;

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
fn waiting_per_namespace(concurrency: u16) -> usize {
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
    #[error("{0}")]
    Retry(String),
}

/// Runs one reconciliation with metrics around it.
pub(crate) async fn reconcile(
    obj: Arc<DynamicObject>,
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
            _running: metrics.running(),
        }
    }
}

impl Drop for Measure<'_> {
    fn drop(&mut self) {
        Metrics::observe(
            &self.metrics.reconcile_time.get_or_create(&self.labels),
            self.started.elapsed(),
        );
        self.metrics
            .active_workers
            .get_or_create(&self.labels)
            .dec();
    }
}

/// Retries a failed reconciliation: 1 s, doubling to 5 minutes, per resource.
pub(crate) fn error_policy(
    obj: Arc<DynamicObject>,
    _e: &ReconcileError,
    ctx: Arc<KindCtx>,
) -> Action {
    let mut failures = lock(&ctx.shared.failures);
    let n = failures.entry(report_key(&ctx, &obj)).or_insert(0);
    *n += 1;
    backoff(*n)
}

async fn reconcile_inner(obj: &DynamicObject, ctx: &KindCtx) -> Result<Action, ReconcileError> {
    if obj.metadata.deletion_timestamp.is_some() {
        // The garbage collector removes the children through their owner references.
        return Ok(Action::await_change());
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
    let output: u64 = objects.iter().map(super::budget::footprint).sum();
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
    let plan = plan(objects, &owner, ctx.shared.as_ref());
    for conflict in &plan.conflicts {
        lock(&ctx.shared.waiting).wait(conflict.id.clone(), owner.id());
    }
    // An object in the way that changed between the plan and the wait above woke nobody.
    let moved = plan.conflicts.iter().any(|c| {
        let (kind, ns, name) = &c.id;
        ctx.shared
            .live(kind, ns, name)
            .and_then(|l| l.metadata.uid.clone())
            != c.uid
    });
    let mut applied = apply(&plan, &owner, &ctx.shared).await?;
    applied.look_again |= moved;
    let pruned = prune(&owner, ctx, &plan.desired).await;
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

// --- render -------------------------------------------------------------------------------------

/// How a resource is known to the budget among the calls of its namespace put off: its
/// controller (which names its Kind and group) and its name.
fn budget_key(ctx: &KindCtx, name: &str) -> String {
    format!("{} {name}", ctx.controller)
}

/// The share of the memory budget one call of the resource's plugin may need, taken in the turn
/// of the resource's namespace (see [`super::budget`]); else when to try again: its namespace
/// already has its share of calls waiting ([`waiting_per_namespace`]), or the turn did not come within
/// [`BUDGET_WAIT`]. Either way the reconciliation leaves its slot to others meanwhile.
async fn take_budget(
    owner: &Owner,
    ctx: &KindCtx,
) -> Result<Result<super::budget::Grant, Duration>, RenderError> {
    let registry = ctx.shared.registry();
    // A Kind no plugin serves needs nothing: its render fails at once, and says why.
    let needs = registry
        .lookup(&owner.resource.api_version, &owner.resource.kind)
        .map_or(0, |(plugin, _)| plugin.limits().call_memory());
    let budget = &ctx.shared.budget;
    let namespace = &owner.resource.namespace;
    let key = budget_key(ctx, &owner.resource.name);
    if budget.waiting(namespace) >= waiting_per_namespace(ctx.shared.concurrency) {
        return Ok(Err(budget_retry(budget.defer(namespace, &key))));
    }
    let started = Instant::now();
    let taken = tokio::time::timeout(BUDGET_WAIT, budget.take(namespace, needs)).await;
    Metrics::observe(&ctx.shared.metrics.budget_wait, started.elapsed());
    match taken {
        Ok(Ok(grant)) => {
            budget.undefer(namespace, &key);
            Ok(Ok(grant))
        }
        Ok(Err(over)) => Err(RenderError::Plugin {
            plugin: ctx.plugin().0,
            error: PluginError::OverBudget {
                needs: over.needs,
                budget: over.budget,
            },
        }),
        Err(_) => {
            tracing::debug!(resource = %owner.display(), "no room in the memory budget of plugin calls for {BUDGET_WAIT:?}; tried again shortly");
            ctx.shared.metrics.budget_timeouts.inc();
            Ok(Err(budget_retry(budget.defer(namespace, &key))))
        }
    }
}

/// Renders the resource in a blocking task (the sandbox is synchronous and CPU-bound), which
/// holds the call's share of the memory budget until the call has ended, and hands it back. The
/// sandbox stops a call at its deadline; should a call still not return, the reconciliation does
/// not wait for it past `Settings::render_wait` and reports a deadline missed, which is retried
/// (the share stays with the call until it ends).
async fn render(
    owner: &Owner,
    ctx: &KindCtx,
    grant: super::budget::Grant,
) -> Result<(Rendered, Option<super::budget::Grant>), ReconcileError> {
    let shared = &ctx.shared;
    // The plugins as they are now: a swap meanwhile does not touch this render.
    let registry = shared.registry();
    let plugin = ctx.plugin().0;
    let resource = owner.resource.clone();
    let started = Instant::now();
    let task = tokio::task::spawn_blocking(move || {
        let rendered = registry.render_checked(&resource, crate::schema::UnknownFields::Ignore);
        (rendered, grant)
    });
    let out = match tokio::time::timeout(shared.render_wait, task).await {
        Ok(joined) => {
            let (rendered, grant) = joined?;
            (rendered, Some(grant))
        }
        Err(_) => (
            Err(RenderError::Plugin {
                plugin: plugin.clone(),
                error: PluginError::Deadline(shared.render_wait),
            }),
            None,
        ),
    };
    Metrics::observe(
        &shared
            .metrics
            .render_time
            .get_or_create(&PluginLabels { plugin }),
        started.elapsed(),
    );
    Ok(out)
}

/// What a render gave: the manifests and the plugin's warnings, or why there are none.
type Rendered = Result<(Vec<Value>, Vec<crate::types::Warning>), RenderError>;

/// Reports a render that failed. One that may succeed when tried again (the plugin ran out of
/// time, the instance pool was full) is retried with backoff; one that fails the same way every
/// time (a render error, a trap, output over a cap) waits for the resource to change.
fn report_render_failure(
    obj: &DynamicObject,
    ctx: &KindCtx,
    owner: &Owner,
    e: RenderError,
) -> Result<Action, ReconcileError> {
    ctx.shared
        .metrics
        .render_failures
        .get_or_create(&FailureLabels {
            plugin: ctx.plugin().0,
            reason: e.reason().to_owned(),
        })
        .inc();
    let retrying = e.transient();
    let suffix = if retrying {
        "will retry"
    } else {
        "not retried until the resource or its plugin changes, beyond the 10-minute resync"
    };
    let problem = Problem {
        reason: e.reason().to_owned(),
        message: format!("{e} ({suffix})"),
        retrying,
    };
    nothing_applied(obj, ctx, owner, vec![problem]);
    if retrying {
        return Err(ReconcileError::Render(e));
    }
    Ok(Action::requeue(RESYNC))
}

/// Reports rendered children that the host refuses to apply (see [`crate::policy`]): nothing
/// of the resource is applied or pruned, and it stays `Stalled` until it, its namespace's Pod
/// Security label or the operator's settings change (looked at again at each resync).
fn report_refusals(
    obj: &DynamicObject,
    ctx: &KindCtx,
    owner: &Owner,
    refusals: Vec<crate::policy::Refusal>,
) -> Result<Action, ReconcileError> {
    let problems = refusals
        .into_iter()
        .map(|r| Problem {
            reason: r.reason.to_owned(),
            message: format!("not applied: {}", r.message),
            retrying: false,
        })
        .collect();
    nothing_applied(obj, ctx, owner, problems);
    Ok(Action::requeue(RESYNC))
}

/// Writes the status (and an event per problem) of a reconciliation that applied nothing. The
/// children stay as the status last listed them (and their apply records with them), and the
/// plugin's status fields as they were.
fn nothing_applied(obj: &DynamicObject, ctx: &KindCtx, owner: &Owner, problems: Vec<Problem>) {
    let current = current_status(ctx, obj);
    let outcome = Outcome {
        children: owner.last_children.clone(),
        problems,
        fields: plugin_fields(current.as_ref()),
        ..Outcome::default()
    };
    if write_status(obj, ctx, owner, current.as_ref(), &outcome) {
        for p in &outcome.problems {
            publish(ctx, obj, EventType::Warning, &p.reason, p.message.clone());
        }
    }
}

// --- plan ---------------------------------------------------------------------------------------

/// What the plan reads of the operator's caches (the shared state, or a test's maps).
pub(crate) trait View {
    /// Where children of `group/version/Kind` are applied, or why they cannot be.
    fn target(&self, gvk: &str) -> Option<Result<ApiResource, String>>;
    /// The live object of kind `group/Kind` in `namespace` named `name`, as the watch shows it.
    fn live(&self, kind_key: &str, namespace: &str, name: &str) -> Option<Arc<LiveChild>>;
    /// What our last apply of the child with this key left.
    fn applied(&self, key: &str) -> Option<Applied>;
    /// Whether the watch of kind `group/Kind` that sees `namespace` has listed: before, an
    /// object it does not show may still exist.
    fn listed(&self, kind_key: &str, namespace: &str) -> bool;
}

impl View for Shared {
    fn target(&self, gvk: &str) -> Option<Result<ApiResource, String>> {
        read(&self.targets).get(gvk).cloned()
    }

    fn live(&self, kind_key: &str, namespace: &str, name: &str) -> Option<Arc<LiveChild>> {
        read(&self.watched).get(kind_key)?.get(namespace, name)
    }

    fn applied(&self, key: &str) -> Option<Applied> {
        lock(&self.applied).get(key).cloned()
    }

    fn listed(&self, kind_key: &str, namespace: &str) -> bool {
        read(&self.watched)
            .get(kind_key)
            .is_some_and(|w| w.listed(namespace))
    }
}

/// How a planned child is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Write {
    /// Left as it is: the live object is what we last applied.
    Skip,
    /// Created: no object of its kind and name exists.
    Create,
    /// Applied over the object with this uid, which this resource controls (or adopts).
    Update { uid: String },
}

/// One rendered child, and what to do with it.
#[derive(Debug)]
pub(crate) struct Planned {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    /// Where it is applied.
    pub ar: ApiResource,
    /// The object to apply, stamped with our owner reference and labels.
    pub child: Value,
    pub hash: u64,
    /// Its key in `Shared::applied`.
    pub cache_key: String,
    pub write: Write,
    /// Whether writing it changes it (for the `Applied` event).
    pub changed: bool,
    /// What our last apply of it left (in memory, else in the resource's status).
    pub previous: Option<Applied>,
    /// For a child left as it is whose readiness counts, the watch's copy.
    pub live: Option<Arc<LiveChild>>,
}

/// A rendered child whose object exists and is not this resource's to take.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Conflict {
    pub id: ChildId,
    pub api_version: String,
    pub kind: String,
    pub name: String,
    /// Who controls it: `Kind name`, or `nobody`.
    pub holder: String,
    /// The uid of the object in the way, as the plan saw it.
    pub uid: Option<String>,
}

impl Conflict {
    fn message(&self, owner: &Owner) -> String {
        if self.holder == "nobody" {
            format!(
                "{} {} exists and no controller owns it (made by hand?); it is left alone. Delete or rename it, or, as whoever may edit it, let {} adopt it: kubectl annotate {} {} {ADOPT_BY_ANNOTATION}={}",
                self.kind,
                self.name,
                owner.display(),
                self.kind.to_lowercase(),
                self.name,
                owner.handle
            )
        } else {
            format!(
                "{} {} is controlled by {}; it is left alone",
                self.kind, self.name, self.holder
            )
        }
    }
}

/// What one reconciliation will do.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    pub children: Vec<Planned>,
    /// Children not applied: their kind is not declared or not served.
    pub skipped: Vec<Skipped>,
    /// Children not applied: another controls the object, or nobody does.
    pub conflicts: Vec<Conflict>,
    /// Children not created yet: the watch of their kind has not listed, so whether an object
    /// of that name exists is not known.
    pub unknown: Vec<String>,
    /// Every rendered child, by kind key and name: what prune keeps.
    pub desired: BTreeSet<(String, String)>,
}

/// Decides, for each rendered object, whether to create it, update it, leave it as it is, or
/// refuse it (its kind is not served, or its object is not ours to take).
pub(crate) fn plan(objects: Vec<Value>, owner: &Owner, view: &impl View) -> Plan {
    let r = &owner.resource;
    let mut plan = Plan::default();
    for mut child in objects {
        let (api_version, kind, name) = crate::ownership::identity(&child);
        let key = kind_key(&api_version, &kind);
        plan.desired.insert((key.clone(), name.clone()));
        let ar = match view.target(&gvk_key(&api_version, &kind)) {
            Some(Ok(ar)) => ar,
            found => {
                let reason = match found {
                    Some(Err(why)) => why,
                    _ => "not a declared child kind".to_owned(),
                };
                plan.skipped.push(Skipped {
                    api_version,
                    kind,
                    name,
                    reason,
                });
                continue;
            }
        };
        crate::ownership::stamp_child(&mut child, &r.api_version, &r.kind, &r.name, &r.uid);
        let h = hash(&child);
        let cache_key = applied_key(&r.uid, &key, &name);
        let live = view.live(&key, &r.namespace, &name);
        // In memory: what this process applied. In the resource's status: what an earlier
        // process did, which says whether a live object is unchanged, never that one the watch
        // does not show exists.
        let remembered = view.applied(&cache_key);
        let previous = remembered
            .clone()
            .or_else(|| owner.recorded.get(&(key.clone(), name.clone())).cloned());
        let write = match live.as_deref() {
            Some(l) => match (
                control(&l.metadata, &r.uid),
                owner.adopt || consents(&l.metadata, &owner.handle),
            ) {
                (Control::Us, _) | (Control::Nobody, true) => {
                    if unchanged(&child, h, previous.as_ref(), Some(l)) {
                        Write::Skip
                    } else {
                        Write::Update {
                            uid: l.metadata.uid.clone().unwrap_or_default(),
                        }
                    }
                }
                (Control::Other(by), _) => {
                    plan.conflicts.push(Conflict {
                        id: (key, r.namespace.clone(), name.clone()),
                        api_version,
                        kind,
                        name,
                        holder: format!("{} {}", by.kind, by.name),
                        uid: l.metadata.uid.clone(),
                    });
                    continue;
                }
                (Control::Nobody, false) => {
                    plan.conflicts.push(Conflict {
                        id: (key, r.namespace.clone(), name.clone()),
                        api_version,
                        kind,
                        name,
                        holder: "nobody".into(),
                        uid: l.metadata.uid.clone(),
                    });
                    continue;
                }
            },
            // A child we applied that the watch has not shown yet is not applied again: a
            // deletion of it is seen by the watch, which then forgets the apply.
            None if remembered.is_some_and(|p| p.hash == h) => Write::Skip,
            None if !view.listed(&key, &r.namespace) => {
                plan.unknown.push(format!("{kind} {name}"));
                continue;
            }
            None => Write::Create,
        };
        let changed = previous.as_ref().is_none_or(|p| p.hash != h) || live.is_none();
        // A child left as it is reports readiness from the watch's copy.
        let live = live.filter(|_| write == Write::Skip && status::reports_readiness(&kind));
        plan.children.push(Planned {
            api_version,
            kind,
            name,
            ar,
            child,
            hash: h,
            cache_key,
            write,
            changed,
            previous,
            live,
        });
    }
    plan
}

fn hash(v: &Value) -> u64 {
    let mut h = DefaultHasher::new();
    v.to_string().hash(&mut h);
    h.finish()
}

/// Whether the live child still is what we last applied: same desired object, our labels and
/// annotations in place, our owner reference, the same object (uid), and no spec change since (its generation, or its
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
    if controller_uid(live) != uid {
        return false;
    }
    // The object we applied, not another made since under its name (a record without a uid,
    // from an older operator, is written again once).
    if applied.uid.is_none() || live.metadata.uid != applied.uid {
        return false;
    }
    match applied.generation {
        Some(g) => live.metadata.generation == Some(g),
        None => live.metadata.resource_version == applied.resource_version,
    }
}

// --- apply --------------------------------------------------------------------------------------

/// The body of an apply. An update carries the uid of the object the plan saw as ours: the API
/// server refuses it (409, uid mismatch) if that object has since been deleted or replaced, so an
/// object made meanwhile by someone else is never written over. A create carries none: the API
/// server accepts no uid on create, so a create relies on the cache having seen every object of
/// its kind (the window is the watch's delay, usually milliseconds; see docs/operator.md).
fn guarded(planned: &Planned) -> Value {
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
enum Answer {
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
fn immutable(message: &str) -> bool {
    message.contains("field is immutable")
        || message.contains("updates to statefulset spec for fields other than")
}

/// The fields of a kind that cannot change once the object exists, as paths.
fn immutable_fields(kind: &str) -> &'static [&'static str] {
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
async fn immutable_fix(shared: &Shared, namespace: &str, planned: &Planned) -> String {
    let api: Api<DynamicObject> =
        Api::namespaced_with(shared.client.clone(), namespace, &planned.ar);
    let Ok(Some(live)) = shared.fence.bounded(api.get_opt(&planned.name)).await else {
        return String::new();
    };
    let live = serde_json::to_value(&live).unwrap_or_default();
    let at = |v: &Value, path: &str| {
        path.split('.')
            .try_fold(v, |v, key| v.get(key))
            .cloned()
            .unwrap_or(Value::Null)
    };
    let differ: Vec<String> = immutable_fields(&planned.kind)
        .iter()
        .filter_map(|path| {
            let (mine, theirs) = (at(&planned.child, path), at(&live, path));
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
    let (kind, name) = (planned.kind.to_lowercase(), &planned.name);
    let selector_differs = differ.iter().any(|d| d.starts_with("spec.selector"));
    let claims_differ = differ
        .iter()
        .any(|d| d.starts_with("spec.volumeClaimTemplates"));
    let how = match planned.kind.as_str() {
        "StatefulSet" if !selector_differs => format!(
            "kubectl delete {kind} {name} -n {namespace} --cascade=orphan (its pods and claims stay; the operator makes it again, and the new one adopts the pods, which roll only if their template changed)"
        ),
        "StatefulSet" => format!(
            "kubectl delete {kind} {name} -n {namespace} (its pods go, its PersistentVolumeClaims stay; the operator makes it again)"
        ),
        _ => format!("kubectl delete {kind} {name} -n {namespace} (the operator makes it again)"),
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

fn answer(e: &kube::Error) -> Answer {
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
async fn apply(
    plan: &Plan,
    owner: &Owner,
    shared: &Arc<Shared>,
) -> Result<ApplyReport, ReconcileError> {
    let namespace = &owner.resource.namespace;
    let calls = plan.children.iter().map(|p| {
        let api: Api<LiveChild> = Api::namespaced_with(shared.client.clone(), namespace, &p.ar);
        async move {
            if p.write == Write::Skip {
                return Ok(None);
            }
            let params = PatchParams::apply(FIELD_MANAGER).force();
            shared
                .write(
                    "apply",
                    &p.ar,
                    api.patch(&p.name, &params, &Patch::Apply(guarded(p))),
                )
                .await
                .map(Some)
        }
    });
    let batch = shared.applies.begin(
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

// --- prune --------------------------------------------------------------------------------------

/// A child to delete: where, its name, and the uid the delete is preconditioned on.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Stale {
    pub kind_key: String,
    pub name: String,
    pub uid: String,
}

/// The children `owner_uid` controls in `namespace` that the render no longer returns: those the
/// owner index lists, that the watch still shows controlled by it and not being deleted.
pub(crate) fn stale_children(
    owned: Vec<ChildId>,
    owner_uid: &str,
    namespace: &str,
    desired: &BTreeSet<(String, String)>,
    view: &impl View,
) -> Vec<Stale> {
    owned
        .into_iter()
        .filter(|(_, ns, _)| ns == namespace)
        .filter(|(key, _, name)| !desired.contains(&(key.clone(), name.clone())))
        .filter_map(|(key, ns, name)| {
            let live = view.live(&key, &ns, &name)?;
            let ours = controller_uid(&live) == Some(owner_uid);
            let uid = live.metadata.uid.clone()?;
            (ours && live.metadata.deletion_timestamp.is_none()).then_some(Stale {
                kind_key: key,
                name,
                uid,
            })
        })
        .collect()
}

/// What prune did.
#[derive(Debug, Default)]
pub(crate) struct Pruned {
    pub deleted: Vec<String>,
    pub failed: Vec<String>,
}

/// Deletes the stale children, each only if it still is the object we saw (uid precondition).
async fn prune(owner: &Owner, ctx: &KindCtx, desired: &BTreeSet<(String, String)>) -> Pruned {
    let shared = &ctx.shared;
    let r = &owner.resource;
    let owned = lock(&shared.owned).owned_by(&r.uid);
    let mut pruned = Pruned::default();
    for stale in stale_children(owned, &r.uid, &r.namespace, desired, shared.as_ref()) {
        let Some(ar) = read(&shared.watched)
            .get(&stale.kind_key)
            .map(|w| w.ar.clone())
        else {
            continue;
        };
        let api: Api<LiveChild> = Api::namespaced_with(shared.client.clone(), &r.namespace, &ar);
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(stale.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::background()
        };
        let what = format!("{} {}", ar.kind, stale.name);
        match shared
            .write("delete", &ar, api.delete(&stale.name, &params))
            .await
        {
            Ok(_) => {
                lock(&shared.applied).remove(&applied_key(&r.uid, &stale.kind_key, &stale.name));
                pruned.deleted.push(what);
            }
            // Already gone, or replaced by another object of that name: nothing of ours to delete.
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => pruned.failed.push(format!("could not delete {what}: {e}")),
        }
    }
    pruned
}

// --- report -------------------------------------------------------------------------------------

/// Writes status and events for what the reconciliation did, and says when to look again.
fn report(
    obj: &DynamicObject,
    ctx: &KindCtx,
    owner: &Owner,
    plan: Plan,
    applied: ApplyReport,
    pruned: Pruned,
    reported: Reported,
) -> Result<Action, ReconcileError> {
    if !applied.changed.is_empty() {
        publish(
            ctx,
            obj,
            EventType::Normal,
            "Applied",
            format!("applied {}", applied.changed.join(", ")),
        );
    }
    for what in &pruned.deleted {
        publish(
            ctx,
            obj,
            EventType::Normal,
            "Pruned",
            format!("deleted {what}: the render no longer returns it"),
        );
    }
    let mut skipped = plan.skipped;
    skipped.extend(applied.skipped);
    let mut problems = Vec::new();
    for conflict in &plan.conflicts {
        let message = conflict.message(owner);
        skipped.push(Skipped {
            api_version: conflict.api_version.clone(),
            kind: conflict.kind.clone(),
            name: conflict.name.clone(),
            reason: format!("ChildConflict: {message}"),
        });
        problems.push(Problem {
            reason: "ChildConflict".into(),
            message,
            retrying: false,
        });
    }
    let problem = |reason: &str, messages: &[String], retrying| Problem {
        reason: reason.into(),
        message: messages.join("; "),
        retrying,
    };
    if !applied.failures.is_empty() {
        problems.push(problem("ApplyFailed", &applied.failures, false));
    }
    if !applied.transient.is_empty() {
        problems.push(problem("ApplyFailed", &applied.transient, true));
    }
    if !applied.raced.is_empty() {
        problems.push(problem("ChildConflict", &applied.raced, true));
    }
    if !pruned.failed.is_empty() {
        problems.push(problem("PruneFailed", &pruned.failed, true));
    }
    if !plan.unknown.is_empty() {
        let message = format!(
            "not created yet: the watch of their kind has not listed, so an object of that name may exist: {}",
            plan.unknown.join(", ")
        );
        problems.push(problem("WatchNotListed", &[message], true));
    }
    let again = reported.again;
    let outcome = Outcome {
        children: applied.children,
        skipped,
        problems,
        warnings: reported.warnings,
        fields: reported.fields,
    };
    let current = current_status(ctx, obj);
    if write_status(obj, ctx, owner, current.as_ref(), &outcome) {
        // Each problem and warning once, when it appears: not again whenever another part of
        // the status (a child's readiness) changes.
        let said = ready_message(current.as_ref());
        for p in outcome
            .problems
            .iter()
            .filter(|p| !said.contains(&p.message))
        {
            publish(ctx, obj, EventType::Warning, &p.reason, p.message.clone());
        }
        let warned = condition_message(current.as_ref(), "Warning");
        for w in outcome
            .warnings
            .iter()
            .map(ToString::to_string)
            .filter(|w| !warned.contains(w.as_str()))
        {
            publish(ctx, obj, EventType::Warning, "PluginWarning", w);
        }
    }
    // What the operator retries by itself: with backoff, as a failed reconciliation.
    let retry: Vec<&str> = outcome
        .problems
        .iter()
        .filter(|p| p.retrying)
        .map(|p| p.message.as_str())
        .collect();
    if !retry.is_empty() {
        return Err(ReconcileError::Retry(retry.join("; ")));
    }
    if applied.look_again {
        return Ok(Action::requeue(Duration::from_millis(100)));
    }
    if again {
        return Ok(Action::requeue(STATUS_RETRY));
    }
    Ok(Action::requeue(RESYNC))
}

/// Asks for an event about `obj`; it is written off the reconciliation's path.
fn publish(ctx: &KindCtx, obj: &DynamicObject, type_: EventType, reason: &str, note: String) {
    let event = Event {
        type_,
        reason: reason.to_owned(),
        note: Some(status::bounded_to(&note, status::MAX_NOTE)),
        action: "Reconcile".into(),
        secondary: None,
    };
    ctx.shared
        .reports
        .event(event, obj.object_ref(&ctx.ar), &ctx.controller);
}

/// The status `obj` has or is about to have: one not yet written is newer than the watch's.
fn current_status(ctx: &KindCtx, obj: &DynamicObject) -> Option<Value> {
    ctx.shared
        .reports
        .pending_status(&report_key(ctx, obj))
        .or_else(|| crate::ownership::stored(obj, "status"))
}

/// The message of the `Ready` condition of `status`.
fn ready_message(status: Option<&Value>) -> &str {
    condition_message(status, "Ready")
}

/// The message of the condition `type_` of `status`.
fn condition_message<'a>(status: Option<&'a Value>, type_: &str) -> &'a str {
    status
        .and_then(|s| s.get("conditions")?.as_array())
        .and_then(|conds| conds.iter().find(|c| c["type"] == type_))
        .and_then(|c| c.get("message")?.as_str())
        .unwrap_or_default()
}

fn report_key(ctx: &KindCtx, obj: &DynamicObject) -> Key {
    Key {
        controller: ctx.controller.clone(),
        namespace: obj.namespace().unwrap_or_default(),
        name: obj.name_any(),
    }
}

/// Asks for the status `outcome` says to be written when it differs from `current` (see
/// [`current_status`]); returns whether it differs.
fn write_status(
    obj: &DynamicObject,
    ctx: &KindCtx,
    owner: &Owner,
    current: Option<&Value>,
    outcome: &Outcome,
) -> bool {
    let desired = status::status(outcome, owner.resource.generation, current, &ctx.plugin().1);
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
    let hold = if outcome.settling() {
        report::SETTLING
    } else {
        Duration::ZERO
    };
    ctx.shared
        .reports
        .status(report_key(ctx, obj), &ctx.ar, desired, hold);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The caches as a test sets them.
    #[derive(Default)]
    struct Caches {
        targets: BTreeMap<String, Result<ApiResource, String>>,
        live: BTreeMap<(String, String, String), Arc<LiveChild>>,
        applied: BTreeMap<String, Applied>,
        unlisted: BTreeSet<String>,
    }

    impl View for Caches {
        fn target(&self, gvk: &str) -> Option<Result<ApiResource, String>> {
            self.targets.get(gvk).cloned()
        }
        fn live(&self, kind_key: &str, namespace: &str, name: &str) -> Option<Arc<LiveChild>> {
            self.live
                .get(&(kind_key.into(), namespace.into(), name.into()))
                .cloned()
        }
        fn applied(&self, key: &str) -> Option<Applied> {
            self.applied.get(key).cloned()
        }
        fn listed(&self, kind_key: &str, _namespace: &str) -> bool {
            !self.unlisted.contains(kind_key)
        }
    }

    fn ar(api_version: &str, kind: &str, plural: &str) -> ApiResource {
        let (group, version) = crate::gvk::split_api_version(api_version);
        ApiResource {
            group: group.into(),
            version: version.into(),
            api_version: api_version.into(),
            kind: kind.into(),
            plural: plural.into(),
        }
    }

    fn caches() -> Caches {
        let mut c = Caches::default();
        c.targets
            .insert("/v1/Service".into(), Ok(ar("v1", "Service", "services")));
        c.targets.insert(
            "apps/v1/Deployment".into(),
            Ok(ar("apps/v1", "Deployment", "deployments")),
        );
        c.targets.insert(
            "monitoring.coreos.com/v1/ServiceMonitor".into(),
            Err("its CRD is not installed".into()),
        );
        c
    }

    fn owner(adopt: bool) -> Owner {
        let mut annotations = BTreeMap::new();
        if adopt {
            annotations.insert(
                crate::ownership::ADOPT_ANNOTATION.to_owned(),
                "true".to_owned(),
            );
        }
        Owner {
            resource: PluginResource {
                api_version: "hanzo.ai/v1".into(),
                kind: "Service".into(),
                name: "web".into(),
                namespace: "ns".into(),
                uid: "uid-web".into(),
                generation: 1,
                labels: BTreeMap::new(),
                annotations,
                spec: json!({}),
            },
            controller_kind: "hanzo.ai/v1/Service".into(),
            adopt,
            handle: handle("services", "hanzo.ai", "web"),
            recorded: BTreeMap::new(),
            last_children: Vec::new(),
        }
    }

    fn service(name: &str) -> Value {
        json!({ "apiVersion": "v1", "kind": "Service", "metadata": { "name": name, "namespace": "ns" } })
    }

    fn live(uid: &str, controller: Option<(&str, &str, &str)>) -> Arc<LiveChild> {
        let refs: Vec<Value> = controller
            .into_iter()
            .map(|(kind, name, uid)| {
                json!({ "apiVersion": "x/v1", "kind": kind, "name": name, "uid": uid, "controller": true })
            })
            .collect();
        Arc::new(
            serde_json::from_value(json!({
                "metadata": { "name": "web", "namespace": "ns", "uid": uid, "resourceVersion": "7",
                    "ownerReferences": refs,
                    "labels": { crate::ownership::OWNER_LABEL: "uid-web", "app.kubernetes.io/managed-by": "wasm-operator" } },
            }))
            .unwrap(),
        )
    }

    fn key(kind: &str, name: &str) -> (String, String, String) {
        (format!("/{kind}"), "ns".into(), name.into())
    }

    #[test]
    fn a_child_that_does_not_exist_is_created() {
        let plan = plan(vec![service("web")], &owner(false), &caches());
        assert_eq!(plan.children.len(), 1);
        assert_eq!(plan.children[0].write, Write::Create);
        assert!(plan.conflicts.is_empty());
        let body = guarded(&plan.children[0]);
        assert_eq!(body["metadata"]["ownerReferences"][0]["uid"], "uid-web");
        assert_eq!(body["metadata"]["ownerReferences"][0]["controller"], true);
        // The API server accepts no uid on create.
        assert!(body["metadata"].get("uid").is_none());
    }

    #[test]
    fn nothing_is_created_before_the_watch_of_its_kind_has_listed() {
        let mut c = caches();
        c.unlisted.insert("/Service".into());
        let plan = plan(vec![service("web")], &owner(false), &c);
        assert!(plan.children.is_empty());
        assert_eq!(plan.unknown, vec!["Service web".to_owned()]);
    }

    #[test]
    fn an_object_made_by_hand_is_never_taken() {
        let mut c = caches();
        c.live.insert(key("Service", "web"), live("uid-hand", None));
        let plan = plan(vec![service("web")], &owner(false), &c);
        assert!(plan.children.is_empty());
        assert_eq!(plan.conflicts.len(), 1);
        assert_eq!(plan.conflicts[0].holder, "nobody");
        assert!(
            plan.conflicts[0].message(&owner(false)).contains(
                "kubectl annotate service web wasm-operator.dev/adopt-by=services.hanzo.ai/web"
            ),
            "{}",
            plan.conflicts[0].message(&owner(false))
        );
        // Still desired: prune must not treat it as stale.
        assert!(plan.desired.contains(&("/Service".into(), "web".into())));
    }

    #[test]
    fn an_object_that_names_the_resource_consents_to_its_adoption() {
        let consenting = |value: &str| {
            let mut l = (*live("uid-hand", None)).clone();
            l.metadata.annotations =
                Some([(ADOPT_BY_ANNOTATION.to_owned(), value.to_owned())].into());
            Arc::new(l)
        };
        let mut c = caches();
        c.live
            .insert(key("Service", "web"), consenting("services.hanzo.ai/web"));
        let planned = plan(vec![service("web")], &owner(false), &c);
        assert!(planned.conflicts.is_empty());
        assert_eq!(
            planned.children[0].write,
            Write::Update {
                uid: "uid-hand".into()
            }
        );
        // Consent to another resource (or another Kind of the same name) is no consent.
        for other in ["services.hanzo.ai/api", "datastores.hanzo.ai/web", "true"] {
            c.live.insert(key("Service", "web"), consenting(other));
            let planned = plan(vec![service("web")], &owner(false), &c);
            assert_eq!(planned.conflicts.len(), 1, "{other}");
        }
    }

    #[test]
    fn an_object_nobody_controls_is_adopted_where_the_operator_adopts_when_asked() {
        let mut c = caches();
        c.live.insert(key("Service", "web"), live("uid-hand", None));
        let plan = plan(vec![service("web")], &owner(true), &c);
        assert!(plan.conflicts.is_empty());
        assert_eq!(
            plan.children[0].write,
            Write::Update {
                uid: "uid-hand".into()
            }
        );
        assert_eq!(guarded(&plan.children[0])["metadata"]["uid"], "uid-hand");
    }

    #[test]
    fn an_object_another_resource_controls_is_never_taken_even_when_adopting() {
        let mut c = caches();
        c.live.insert(
            key("Service", "web"),
            live("uid-svc", Some(("Datastore", "web", "uid-db"))),
        );
        for adopt in [false, true] {
            let plan = plan(vec![service("web")], &owner(adopt), &c);
            assert!(plan.children.is_empty());
            assert_eq!(plan.conflicts[0].holder, "Datastore web");
            assert!(
                plan.conflicts[0]
                    .message(&owner(adopt))
                    .contains("controlled by Datastore web")
            );
        }
    }

    #[test]
    fn our_own_child_is_updated_over_its_uid_and_left_alone_when_unchanged() {
        let mut c = caches();
        let ours = live("uid-svc", Some(("Service", "web", "uid-web")));
        c.live.insert(key("Service", "web"), ours.clone());
        let first = plan(vec![service("web")], &owner(false), &c);
        assert_eq!(
            first.children[0].write,
            Write::Update {
                uid: "uid-svc".into()
            }
        );
        // After our apply left it so, it is left as it is.
        let p = &first.children[0];
        c.applied.insert(
            p.cache_key.clone(),
            Applied {
                hash: p.hash,
                uid: Some("uid-svc".into()),
                generation: None,
                resource_version: Some("7".into()),
            },
        );
        let second = plan(vec![service("web")], &owner(false), &c);
        assert_eq!(second.children[0].write, Write::Skip);
        // Deleted and made again by someone else, with our owner reference and the same
        // resourceVersion in its kind's sequence (or generation 1): another object, written.
        c.live.insert(
            key("Service", "web"),
            live("uid-again", Some(("Service", "web", "uid-web"))),
        );
        let again = plan(vec![service("web")], &owner(false), &c);
        assert_eq!(
            again.children[0].write,
            Write::Update {
                uid: "uid-again".into()
            }
        );
        c.live.insert(key("Service", "web"), ours.clone());
        // After a restart the memory is empty; the record in the resource's status serves.
        let record = c.applied.remove(&p.cache_key).unwrap();
        let mut restarted = owner(false);
        restarted
            .recorded
            .insert(("/Service".into(), "web".into()), record);
        let third = plan(vec![service("web")], &restarted, &c);
        assert_eq!(third.children[0].write, Write::Skip);
        // A record in status does not stand for an object the watch does not show: deleted by
        // hand, it is created again.
        c.live.clear();
        let fourth = plan(vec![service("web")], &restarted, &c);
        assert_eq!(fourth.children[0].write, Write::Create);
    }

    #[test]
    fn children_of_undeclared_or_unserved_kinds_are_skipped_with_the_reason() {
        let monitor = json!({ "apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
            "metadata": { "name": "web", "namespace": "ns" } });
        let cron = json!({ "apiVersion": "batch/v1", "kind": "CronJob",
            "metadata": { "name": "web", "namespace": "ns" } });
        let plan = plan(vec![monitor, cron], &owner(false), &caches());
        let reasons: Vec<&str> = plan.skipped.iter().map(|s| s.reason.as_str()).collect();
        assert_eq!(
            reasons,
            ["its CRD is not installed", "not a declared child kind"]
        );
    }

    #[test]
    fn two_versions_of_one_kind_are_one_child() {
        let mut c = caches();
        c.targets.insert(
            "autoscaling/v1/HorizontalPodAutoscaler".into(),
            Ok(ar(
                "autoscaling/v1",
                "HorizontalPodAutoscaler",
                "horizontalpodautoscalers",
            )),
        );
        let hpa = json!({ "apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler",
            "metadata": { "name": "web", "namespace": "ns" } });
        let plan = plan(vec![hpa], &owner(false), &c);
        // Prune compares by group and kind: what v2 shows of this child is what v1 applied.
        let owned = vec![(
            "autoscaling/HorizontalPodAutoscaler".to_owned(),
            "ns".to_owned(),
            "web".to_owned(),
        )];
        c.live.insert(
            owned[0].clone(),
            live("uid-hpa", Some(("Service", "web", "uid-web"))),
        );
        assert!(stale_children(owned, "uid-web", "ns", &plan.desired, &c).is_empty());
    }

    #[test]
    fn only_children_this_resource_controls_are_stale() {
        let mut c = caches();
        let ours = live("uid-old", Some(("Service", "web", "uid-web")));
        let theirs = live("uid-theirs", Some(("Service", "other", "uid-other")));
        c.live.insert(key("Ingress", "old"), ours);
        c.live.insert(key("Ingress", "theirs"), theirs);
        let owned = vec![
            key("Ingress", "old"),
            key("Ingress", "theirs"),
            key("Service", "web"),
            // Listed, but gone from the watch: nothing to delete.
            key("Ingress", "gone"),
        ];
        let desired = BTreeSet::from([("/Service".to_owned(), "web".to_owned())]);
        let stale = stale_children(owned, "uid-web", "ns", &desired, &c);
        assert_eq!(
            stale,
            vec![Stale {
                kind_key: "/Ingress".into(),
                name: "old".into(),
                uid: "uid-old".into()
            }]
        );
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
