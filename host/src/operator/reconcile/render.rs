//! Render: the plugin called in its sandbox for the resource, in its turn of the memory budget,
//! off the async threads, and never waited for past its deadline (plus a margin).

use super::*;

/// How a resource is known to the budget among the calls of its namespace put off: its Kind
/// (`apiVersion/Kind`, as its controller is found to wake it) and its name, a line apart.
pub(super) fn budget_key(ctx: &KindCtx, name: &str) -> String {
    format!("{}/{}\n{name}", ctx.ar.api_version, ctx.ar.kind)
}

/// Wakes the resource a budget key names ([`budget_key`]) in `namespace`: its namespace has
/// room again among the calls waiting for the budget.
pub(crate) fn wake_put_off(owners: &super::super::children::Owners, namespace: &str, key: &str) {
    if let Some((kind, name)) = key.split_once('\n') {
        super::super::children::wake(
            owners,
            BTreeSet::from([(kind.to_owned(), namespace.to_owned(), name.to_owned())]),
        );
    }
}

/// The share of the memory budget one call of the resource's plugin may need, taken in the turn
/// of the resource's namespace (see [`super::budget`]); else when to try again: its namespace
/// already has its share of calls waiting ([`waiting_per_namespace`]), or the turn did not come within
/// [`BUDGET_WAIT`]. Either way the reconciliation leaves its slot to others meanwhile.
pub(super) async fn take_budget(
    owner: &Owner,
    ctx: &KindCtx,
) -> Result<Result<crate::operator::budget::Grant, Duration>, RenderError> {
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
pub(super) async fn render(
    owner: &Owner,
    ctx: &KindCtx,
    grant: crate::operator::budget::Grant,
) -> Result<(Rendered, Option<crate::operator::budget::Grant>), ReconcileError> {
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
pub(super) type Rendered = Result<(Vec<Value>, Vec<crate::types::Warning>), RenderError>;

/// Reports a render that failed. One that may succeed when tried again (the plugin ran out of
/// time, the instance pool was full) is retried with backoff; one that fails the same way every
/// time (a render error, a trap, output over a cap) waits for the resource to change.
pub(super) fn report_render_failure(
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
pub(super) fn report_refusals(
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
pub(super) fn nothing_applied(
    obj: &DynamicObject,
    ctx: &KindCtx,
    owner: &Owner,
    problems: Vec<Problem>,
) {
    let current = current_status(ctx, obj);
    let outcome = Outcome {
        children: owner.last_children.clone(),
        problems,
        fields: plugin_fields(current.as_ref()),
        ..Outcome::default()
    };
    if write_status(obj, ctx, owner, current.as_ref(), &outcome) {
        for p in &outcome.problems {
            outcome::warn_of(ctx, &obj.metadata, p);
        }
    }
}
