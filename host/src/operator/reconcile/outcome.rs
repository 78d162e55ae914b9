//! Outcome: all of it turned into status, events and what to do next.

use super::*;

/// Writes status and events for what the reconciliation did, and says when to look again.
pub(super) fn report(
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
            &obj.metadata,
            EventType::Normal,
            "Applied",
            format!("applied {}", applied.changed.join(", ")),
        );
    }
    for what in &pruned.deleted {
        publish(
            ctx,
            &obj.metadata,
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
    let raced: Vec<String> = plan
        .appeared
        .iter()
        .chain(&applied.raced)
        .cloned()
        .collect();
    if !raced.is_empty() {
        problems.push(problem("ChildConflict", &raced, true));
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
            warn_of(ctx, &obj.metadata, p);
        }
        let warned = condition_message(current.as_ref(), "Warning");
        for w in outcome
            .warnings
            .iter()
            .map(ToString::to_string)
            .filter(|w| !warned.contains(w.as_str()))
        {
            publish(ctx, &obj.metadata, EventType::Warning, "PluginWarning", w);
        }
    }
    // What the operator retries by itself: with backoff, as a failed reconciliation.
    let retry: Vec<Problem> = outcome
        .problems
        .into_iter()
        .filter(|p| p.retrying)
        .collect();
    if !retry.is_empty() {
        return Err(ReconcileError::Retry(retry));
    }
    if applied.look_again {
        return Ok(Action::requeue(Duration::from_millis(100)));
    }
    if again {
        return Ok(Action::requeue(STATUS_RETRY));
    }
    Ok(Action::requeue(RESYNC))
}

/// Asks for an event about the resource `regarding` (of `ctx`'s Kind); it is written off the
/// reconciliation's path.
pub(crate) fn publish(
    ctx: &KindCtx,
    regarding: &kube::api::ObjectMeta,
    type_: EventType,
    reason: &str,
    note: String,
) {
    ctx.shared.reports.event(QueuedEvent::new(
        type_,
        reason,
        status::bounded_to(&note, status::MAX_NOTE).into(),
        &ctx.ar,
        regarding,
        &ctx.controller,
    ));
}

/// Asks for a Warning event telling of `problem` on the resource `regarding`.
pub(super) fn warn_of(ctx: &KindCtx, regarding: &kube::api::ObjectMeta, problem: &Problem) {
    publish(
        ctx,
        regarding,
        EventType::Warning,
        &problem.reason,
        problem.message.clone(),
    );
}

/// The status `obj` has or is about to have: one not yet written, or written and not yet shown
/// by the watch, is newer than the watch's; and the watch's copy now is newer than `obj`, the
/// copy the reconciliation began with (a status written meanwhile, by an earlier
/// reconciliation, may have come back through the watch since).
pub(super) fn current_status(ctx: &KindCtx, obj: &DynamicObject) -> Option<Value> {
    let key = report_key(ctx, obj);
    let stored = || ctx.latest(&key.namespace, &key.name);
    let version = stored().and_then(|o| o.metadata.resource_version.clone());
    let newest = ctx.shared.reports.newest_status(&key, version.as_deref());
    // Else the store's copy, read again: a write's echo that came in between (and took its
    // status out of the reports) is in it by now.
    newest.or_else(|| match stored() {
        Some(now) => crate::ownership::stored(&now, "status"),
        None => crate::ownership::stored(obj, "status"),
    })
}

/// The message of the `Ready` condition of `status`.
pub(super) fn ready_message(status: Option<&Value>) -> &str {
    condition_message(status, "Ready")
}

/// The message of the condition `type_` of `status`.
pub(super) fn condition_message<'a>(status: Option<&'a Value>, type_: &str) -> &'a str {
    status
        .and_then(|s| s.get("conditions")?.as_array())
        .and_then(|conds| conds.iter().find(|c| c["type"] == type_))
        .and_then(|c| c.get("message")?.as_str())
        .unwrap_or_default()
}

pub(super) fn report_key(ctx: &KindCtx, obj: &DynamicObject) -> Key {
    crate::operator::report::key(&ctx.controller, obj)
}

/// Asks for the status `outcome` says to be written when it differs from `current` (see
/// [`current_status`]); returns whether it differs.
pub(super) fn write_status(
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
