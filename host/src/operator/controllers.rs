//! The controllers: one per served Kind, started and stopped as plugins come and go, with the
//! backoff of failed reconciliations.

use super::*;

/// The controllers of one served Kind (one per watched namespace).
pub(super) struct KindControllers {
    /// Turns true to stop them.
    pub(super) stop: watch::Sender<bool>,
    /// Each asks its controller to reconcile every resource of the Kind.
    pub(super) rescans: Vec<mpsc::UnboundedSender<()>>,
    /// Their name (`<plural>.<group>`), as the metrics say it.
    pub(super) controller: String,
}

impl KindControllers {
    pub(super) fn rescan(&self) {
        for rescan in &self.rescans {
            let _ = rescan.unbounded_send(());
        }
    }
}

/// The controllers of the served Kinds: those running, and the Kinds whose CRD was not
/// installed at start.
pub(crate) struct Controllers {
    /// Fires when the operator stops (shutdown, or the Lease lost).
    pub(super) stop: tokio::sync::broadcast::Sender<()>,
    /// Turns true when the operator stops, and stays so: a controller started after that (by
    /// a plugin loaded at that moment) does not start.
    pub(super) stopping: watch::Receiver<bool>,
    pub(super) running: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Served Kinds not installed yet: the plugin serving each, and what to discover.
    pub(super) unserved: Mutex<Vec<(crate::plugin::Plugin, GroupVersionKind)>>,
    /// The controllers of each served Kind, by `apiVersion/Kind`.
    pub(super) kinds: Mutex<BTreeMap<String, KindControllers>>,
    /// Held while missing child kinds are looked for ([`find_missing`]).
    pub(super) finding: tokio::sync::Mutex<()>,
}

impl Controllers {
    /// Starts the controllers of `kind`, served by the cluster as `ar`: one per scope (all
    /// namespaces, or each watched namespace). Returns, for each, what says when its watch has
    /// first listed.
    pub(super) fn start(
        &self,
        shared: &Arc<Shared>,
        settings: &Settings,
        plugin: &str,
        kind: &crate::types::KindInfo,
        ar: ApiResource,
    ) -> Vec<(String, FirstListDone)> {
        if *self.stopping.borrow() {
            return Vec::new();
        }
        let controller = format!("{}.{}", kind.plural, kind.group);
        let ar = Arc::new(ar);
        let key = format!("{}/{}", ar.api_version, ar.kind);
        let kind_stop = lock(&self.kinds)
            .entry(key.clone())
            .or_insert_with(|| KindControllers {
                stop: watch::channel(false).0,
                rescans: Vec::new(),
                controller: controller.clone(),
            })
            .stop
            .subscribe();
        let mut listed = Vec::new();
        for scope in settings.scopes() {
            let place = shared.watches.place();
            let (api, watch) =
                scoped::<Served>(&place.client(), scope.as_deref(), &ar, &controller);
            // Settled resources a list finds are queued after the changed ones (`settling`).
            let (later_tx, later_rx) = mpsc::unbounded();
            let settling =
                super::settling::Settling::new(ar.clone(), later_tx, shared.synced.subscribe());
            let writer = reflector::store::Writer::<Served>::new(ar.clone());
            let reader = writer.as_reader();
            let ctx = Arc::new(KindCtx {
                shared: shared.clone(),
                ar: ar.clone(),
                controller: controller.clone(),
                settling: settling.clone(),
                store: reader.clone(),
            });
            let (tx, rx) = mpsc::unbounded();
            lock(&shared.owners)
                .entry(format!("{}/{}", ar.api_version, ar.kind))
                .or_insert_with(|| (ar.clone(), Vec::new()))
                .1
                .push((scope.clone(), tx));
            let (rescan, rescanned) = mpsc::unbounded();
            if let Some(k) = lock(&self.kinds).get_mut(&key) {
                k.rescans.push(rescan);
            }
            // The operator stops, or this Kind is no longer served.
            let stopped = {
                let (stop, kind_stop) = (self.stopping.clone(), kind_stop.clone());
                move || {
                    let (mut stop, mut kind_stop) = (stop.clone(), kind_stop.clone());
                    async move {
                        tokio::select! {
                            _ = stop.wait_for(|s| *s) => {}
                            _ = kind_stop.wait_for(|s| *s) => {}
                        }
                    }
                }
            };
            // With shards, shard 0's holder labels the resources with no shard label, which
            // no shard's watch selects (`labeller`).
            if let Some(shard) = shared.shard
                && shard.index == 0
                && shard.sharding.count > 1
            {
                let place = shared.watches.place();
                let (api, _) = scoped::<kube::core::PartialObjectMeta<kube::api::DynamicObject>>(
                    &place.client(),
                    scope.as_deref(),
                    &ar,
                    &controller,
                );
                let labelling =
                    super::labeller::run(ctx.clone(), api, settings.concurrency, stopped.clone());
                lock(&self.running).push(tokio::spawn(async move {
                    let _place = place;
                    labelling.await;
                }));
            }
            // A resource is rendered again when what its render reads changes (spec, labels,
            // annotations), not when only its status does: most of its updates are our own
            // status writes. Children's events, resyncs and retries reach it through the
            // scheduler.
            let (first_list, done) = FirstList::new();
            let health = (shared.metrics.clone(), watch.clone());
            let (queue, queue_name) = (shared.metrics.clone(), controller.clone());
            let (forget, forget_name) = (shared.metrics.clone(), controller.clone());
            let shard = shared.shard;
            let (lists, admits) = (settling.clone(), settling.clone());
            let (watched, watched_scope) = (ctx.clone(), scope.clone());
            let trigger = reflector::reflector(
                writer,
                watcher(api, owners_config(settings)).modify(move |o| {
                    // The watch's place on its connection, held while the watch is.
                    let _ = &place;
                    trim_served(shard, o)
                }),
            )
            .inspect(first_list.observer())
            .inspect(move |event| watch_health(&health.0, &health.1, event))
            .inspect(move |event| match event {
                Ok(kube::runtime::watcher::Event::Delete(o)) => {
                    let key = reconcile::queue_key(o);
                    lists.started(&key);
                    forget.forgotten(&forget_name, &key);
                    watched.shared.reports.saw(&watched.controller, o, true);
                }
                // Our status writes, as the store now has them (`Reports::newest_status`). A
                // list's objects reach the store together, at its end.
                Ok(kube::runtime::watcher::Event::Apply(o)) => {
                    watched.shared.reports.saw(&watched.controller, o, false);
                }
                Ok(kube::runtime::watcher::Event::Init) => lists.listing(),
                Ok(kube::runtime::watcher::Event::InitDone) => {
                    lists.listed();
                    let version = |k: &report::Key| {
                        (watched.latest(&k.namespace, &k.name)?.metadata)
                            .resource_version
                            .clone()
                    };
                    (watched.shared.reports).relisted(
                        &watched.controller,
                        watched_scope.as_deref(),
                        version,
                    );
                }
                Ok(kube::runtime::watcher::Event::InitApply(_)) => {}
                Err(_) => {}
            })
            .default_backoff()
            .applied_objects()
            .predicate_filter(render_input, PredicateConfig::default())
            // Counted as queued when seen, held back or not: the queue's latency includes the
            // wait of one held.
            .inspect(move |o| {
                if let Ok(o) = o {
                    queue.queued(&queue_name, &reconcile::queue_key(o));
                }
            })
            .filter(move |o| {
                std::future::ready(match o {
                    Ok(o) => admits.admit(o),
                    Err(_) => true,
                })
            });
            // A child's change asks for its owner; a list's settled resources come once released.
            let (queue, queue_name) = (shared.metrics.clone(), controller.clone());
            let asked = futures::stream::select(rx, later_rx).inspect(
                move |r: &reflector::ObjectRef<Served>| {
                    queue.queued(&queue_name, &reconcile::ref_key(r));
                },
            );
            let name = watch.clone();
            let watch_name = watch.clone();
            let (gone, gone_name) = (shared.metrics.clone(), controller.clone());
            let gone_settling = settling.clone();
            let run = Controller::for_stream_with(trigger, reader, ar.clone())
                .with_config(
                    kube::runtime::controller::Config::default().concurrency(settings.concurrency),
                )
                .reconcile_on(asked)
                .reconcile_all_on(rescanned)
                .graceful_shutdown_on(stopped())
                .run(reconcile::reconcile, reconcile::error_policy, ctx.clone())
                .for_each(move |result| {
                    // A reconciler's failure was logged and counted by `reconcile`; anything
                    // else (a queue or store error) would otherwise go unseen.
                    match result {
                        // Asked for (a child's change after its owner was deleted), and gone:
                        // it waits no more.
                        Err(kube::runtime::controller::Error::ObjectNotFound(r)) => {
                            let key = reconcile::ref_key(&r);
                            gone_settling.started(&key);
                            gone.forgotten(&gone_name, &key);
                        }
                        Err(e)
                            if !matches!(
                                e,
                                kube::runtime::controller::Error::ReconcilerFailed(..)
                            ) =>
                        {
                            tracing::warn!(controller = %name, "controller: {e}");
                        }
                        _ => {}
                    }
                    futures::future::ready(())
                });
            // kube holds a controller's runner until its store has listed, through a graceful
            // shutdown too: a watch whose list is refused (no RBAC for it) or never answered
            // would hold the operator's shutdown forever. Nothing of such a Kind can be
            // reconciling (nothing is before the list), so its controller is dropped at once.
            let unlisted = done.clone();
            let run = async move {
                tokio::select! {
                    () = run => {}
                    () = async move {
                        stopped().await;
                        if *unlisted.borrow() {
                            std::future::pending::<()>().await;
                        }
                    } => {
                        tracing::debug!(controller = %watch_name, "stopped before its first list");
                    }
                }
            };
            tracing::info!(controller = %watch, %plugin, "controller started");
            let mut running = lock(&self.running);
            // Controllers of Kinds stopped since (a plugin upgraded or removed) are let go.
            running.retain(|c| !c.is_finished());
            running.push(tokio::spawn(run));
            listed.push((watch, done));
        }
        listed
    }

    /// Whether the controllers of `apiVersion/Kind` run.
    pub(crate) fn serves(&self, key: &str) -> bool {
        lock(&self.kinds).contains_key(key)
    }

    /// Asks the controllers of `apiVersion/Kind` to reconcile every resource of it.
    pub(crate) fn rescan(&self, key: &str) {
        if let Some(k) = lock(&self.kinds).get(key) {
            k.rescan();
        }
    }

    /// Asks every controller to reconcile every resource of its Kind.
    pub(super) fn rescan_all(&self) {
        for k in lock(&self.kinds).values() {
            k.rescan();
        }
    }

    /// Stops the controllers of `apiVersion/Kind` (its plugin is gone); resources of it are
    /// left as they are.
    pub(crate) fn stop_kind(&self, shared: &Shared, key: &str) {
        if let Some(k) = lock(&self.kinds).remove(key) {
            let _ = k.stop.send(true);
            shared.metrics.controller_stopped(&k.controller);
        }
        lock(&shared.owners).remove(key);
        lock(&self.unserved).retain(|(_, gvk)| {
            format!("{}/{}/{}", gvk.group, gvk.version, gvk.kind).trim_start_matches('/') != key
        });
    }

    /// Starts the controllers of the served Kinds whose CRD has been installed since.
    pub(super) async fn start_found(&self, shared: &Arc<Shared>, settings: &Settings) {
        let unserved = lock(&self.unserved).clone();
        if unserved.is_empty() {
            return;
        }
        let found = discover(&shared.client, unserved.iter().map(|(_, gvk)| gvk.clone())).await;
        for ((plugin, gvk), found) in unserved.into_iter().zip(found) {
            if let Ok((ar, _)) = found
                && let Some(kind) = plugin.kind(&gvk.group, &gvk.kind)
            {
                lock(&self.unserved).retain(|(_, g)| *g != gvk);
                tracing::info!(kind = %kind.kind, group = %kind.group, "its CRD is installed now: serving it");
                self.start(shared, settings, plugin.name(), kind, ar);
            }
        }
    }
}

/// How the resources of a served Kind are watched: with shards, only this pipeline's shard's,
/// as the API server selects them by their label.
fn owners_config(settings: &Settings) -> watcher::Config {
    let config = watch_config();
    match settings.shard.and_then(|s| s.sharding.selector(s.index)) {
        Some(selector) => config.labels(&selector),
        None => config,
    }
}

/// Trims a resource of a served Kind as the store keeps it (`trim_resource`). With shards, a
/// resource this shard only moves elsewhere (labelled with this shard, or with none of this
/// shard count's, and named for another: after a reshard) keeps only what moving it reads: its
/// identity, its version and its shard label; no spec, status, annotations or other labels.
fn trim_served(shard: Option<super::shard::Shard>, o: &mut Served) {
    trim_resource(o);
    let Some(shard) = shard else { return };
    let meta = &o.metadata;
    let (namespace, name) = (
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default(),
    );
    if shard.serves(namespace, name, meta.labels.as_ref()) {
        return;
    }
    o.data = serde_json::Value::Null;
    let meta = &mut o.metadata;
    meta.annotations = None;
    meta.finalizers = None;
    meta.owner_references = None;
    if let Some(labels) = meta.labels.as_mut() {
        labels.retain(|k, _| k == super::shard::SHARD_LABEL);
    }
}

/// A hash of what a render reads from a resource besides its name: generation (the spec),
/// labels and annotations; and its uid, so that a resource created again under the same name
/// counts as new.
pub(super) fn render_input(obj: &Served) -> Option<u64> {
    let mut h = std::hash::DefaultHasher::new();
    let meta = &obj.metadata;
    (
        &meta.uid,
        meta.generation,
        &meta.labels,
        &meta.annotations,
        meta.deletion_timestamp.is_some(),
    )
        .hash(&mut h);
    Some(h.finish())
}

/// How long to wait after the `n`th failure in a row: 1 s doubling to 5 minutes.
pub(crate) fn backoff(n: u32) -> Action {
    Action::requeue(backoff_delay(n))
}

/// The wait of [`backoff`].
pub(crate) fn backoff_delay(n: u32) -> Duration {
    let secs = 1u64
        .checked_shl(n.saturating_sub(1).min(9))
        .unwrap_or(300)
        .min(300);
    Duration::from_secs(secs)
}
