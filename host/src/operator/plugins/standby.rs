//! The standby: while another replica leads, every Plugin is prepared ahead, so that taking
//! the lead serves them without pulling or compiling.

use super::*;

/// A standby's preparation of one Plugin: the digest and limits it prepares.
pub(super) struct StandbyTask {
    pub(super) digest: Option<String>,
    pub(super) limits: Limits,
    pub(super) task: tokio::task::AbortHandle,
}

/// What a standby replica does while it waits for the Lease: it watches the `Plugin`s and
/// makes each ready (pulled, compiled, checked, loaded) without writing anything, so that when
/// it leads it serves them at once, with no pull or compile, even with the registry down.
pub(crate) struct Standby {
    pub(super) task: tokio::task::JoinHandle<()>,
    pub(super) ready: Arc<std::sync::Mutex<BTreeMap<String, Prepared>>>,
}

impl Standby {
    /// Starts making the Plugins ready.
    pub(crate) fn start(
        watches: &crate::connection::Watches,
        live: Live,
        ctx: Context,
        metrics: Arc<crate::operator::Metrics>,
    ) -> Self {
        let ready: Arc<std::sync::Mutex<BTreeMap<String, Prepared>>> = Arc::default();
        let place = watches.place();
        let api: Api<DynamicObject> = Api::all_with(place.client(), &api_resource());
        let events = watcher(api, watch_config()).default_backoff();
        let shared = ready.clone();
        let task = tokio::spawn(async move {
            let _place = place;
            let mut events = std::pin::pin!(events);
            // Each Plugin is prepared on its own task, so a silent registry holds back only its
            // own Plugins; the tasks are owned by a set, so they stop with this one.
            let mut set = tokio::task::JoinSet::new();
            let mut tasks: BTreeMap<String, StandbyTask> = BTreeMap::new();
            // The Plugins of the list in progress: those not in it were deleted meanwhile.
            let mut listing: Option<std::collections::BTreeSet<String>> = None;
            while let Some(event) = events.next().await {
                match event {
                    Ok(watcher::Event::Init) => listing = Some(Default::default()),
                    Ok(watcher::Event::InitApply(o) | watcher::Event::Apply(o)) => {
                        let name = o.name_any();
                        if let Some(listing) = listing.as_mut() {
                            listing.insert(name.clone());
                        }
                        let spec = o.data.get("spec").cloned().unwrap_or(Value::Null);
                        let Ok((reference, limits)) = wanted(&live, &spec) else {
                            lock(&shared).remove(&name);
                            continue;
                        };
                        let held = lock(&shared).get(&name).is_some_and(|p| {
                            p.reference.digest == reference.digest && p.limits == limits
                        });
                        // A preparation of this very spec goes on (the leader's status
                        // writes and relists bring the same spec again and again).
                        let preparing = tasks.get(&name).is_some_and(|t| {
                            t.digest == reference.digest
                                && t.limits == limits
                                && !t.task.is_finished()
                        });
                        if held || preparing {
                            continue;
                        }
                        if let Some(old) = tasks.remove(&name) {
                            old.task.abort();
                        }
                        let digest = reference.digest.clone();
                        let (live, ctx, ready, metrics) =
                            (live.clone(), ctx.clone(), shared.clone(), metrics.clone());
                        let task_name = name.clone();
                        let task = set.spawn(async move {
                            let name = task_name;
                            match prepare(&live, &ctx, &name, reference, limits).await {
                                Ok(p) => {
                                    tracing::info!(plugin = %name, image = %p.reference, "loaded, ready for when this replica leads");
                                    lock(&ready).insert(name, p);
                                }
                                // The leader says why in status; this replica tries again
                                // when the Plugin changes.
                                Err(r) => {
                                    lock(&ready).remove(&name);
                                    tracing::info!(plugin = %name, reason = r.reason, "not loaded while standing by: {}", r.message);
                                }
                            }
                            count_ready(&metrics, &ready);
                        });
                        tasks.insert(
                            name,
                            StandbyTask {
                                digest,
                                limits,
                                task,
                            },
                        );
                    }
                    Ok(watcher::Event::Delete(o)) => {
                        let name = o.name_any();
                        if let Some(old) = tasks.remove(&name) {
                            old.task.abort();
                        }
                        lock(&shared).remove(&name);
                    }
                    Ok(watcher::Event::InitDone) => {
                        if let Some(listed) = listing.take() {
                            lock(&shared).retain(|name, _| listed.contains(name));
                            tasks.retain(|name, t| {
                                let keep = listed.contains(name);
                                if !keep {
                                    t.task.abort();
                                }
                                keep
                            });
                        }
                    }
                    Err(e) => tracing::debug!("standby's watch of Plugins: {e}"),
                }
                while set.try_join_next().is_some() {}
                tasks.retain(|_, t| !t.task.is_finished());
                count_ready(&metrics, &shared);
            }
        });
        Self { task, ready }
    }

    /// What is ready now, the standby going on (with shards: for each shard taken, while the
    /// replica goes on preparing for the next).
    pub(crate) fn snapshot(&self) -> BTreeMap<String, Prepared> {
        lock(&self.ready).clone()
    }

    /// Stops.
    pub(crate) fn stop(&self) {
        self.task.abort();
    }

    /// Stops, and hands over what is ready.
    pub(crate) fn take(self) -> BTreeMap<String, Prepared> {
        self.task.abort();
        std::mem::take(&mut *lock(&self.ready))
    }
}

/// Says in `wasm_operator_plugins_prefetched` how many Plugins a standby holds ready.
pub(super) fn count_ready(
    metrics: &crate::operator::Metrics,
    ready: &std::sync::Mutex<BTreeMap<String, Prepared>>,
) {
    metrics
        .plugins_prefetched
        .set(i64::try_from(lock(ready).len()).unwrap_or(i64::MAX));
}
