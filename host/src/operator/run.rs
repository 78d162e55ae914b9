//! The run loop: leader election, setup of the watches and controllers, and shutdown.

use super::*;

/// Runs the operator until `shutdown` resolves (SIGTERM in the binary), then finishes the
/// reconciliations in flight and steps down.
pub async fn run(
    cluster: impl Into<crate::connection::Cluster>,
    registry: Registry,
    settings: Settings,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let crate::connection::Cluster {
        client,
        leases,
        watches,
    } = cluster.into();
    let metrics = Arc::new(Metrics::default());
    metrics.set_limits(settings.unready_after, settings.stuck_after);
    for plugin in registry.plugins() {
        metrics.plugin_served(plugin, plugin.source(), true);
    }
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let stopped = {
        let rx = stop_rx.clone();
        move || {
            let mut rx = rx.clone();
            async move {
                let _ = rx.wait_for(|s| *s).await;
            }
        }
    };
    let secure = settings.metrics_tls.as_ref().map(|tls| metrics::Secure {
        tls: tls.clone(),
        reviewer: super::secure::Reviewer::new(client.clone()),
        health_addr: settings.health_addr,
    });
    let addr = metrics::serve(settings.metrics_addr, secure, metrics.clone(), &stopped)
        .await
        .map_err(|source| Error::Serve {
            addr: settings.metrics_addr,
            source,
        })?;
    if settings.metrics_tls.is_some() {
        tracing::info!(%addr, health = %settings.health_addr, "serving /metrics over HTTPS to those RBAC allows, /healthz and /readyz on the health address");
    } else {
        tracing::info!(%addr, "serving /healthz, /readyz and /metrics");
    }

    // One limit of writes in flight for the replica, whichever shards it serves.
    let writes = Arc::new(writes::Writes::new(
        settings.min_writes_in_flight,
        settings.max_writes_in_flight,
        metrics.writes_limit.clone(),
        metrics.writes_limited_namespaces.clone(),
    ));

    // Shards: each replica serves the shards it holds.
    if let Some(sharding) = settings.sharding.filter(|s| s.count > 1) {
        let replica = Replica {
            metrics,
            writes,
            watches,
        };
        return super::shards::serve(
            client, leases, registry, settings, sharding, replica, stop_rx,
        )
        .await;
    }

    // Leader election: only the leader reconciles; the others wait. Without it, this replica
    // leads from the start (the series says so, for the alert that no replica leads).
    if !settings.leader_election {
        metrics.set_leader(&settings.lease_name, true);
    }
    let mut leadership = None;
    let mut fence = lease::Fence::open();
    let mut prefetched = BTreeMap::new();
    if settings.leader_election {
        let (is_leader, lease_fence, handle) = lease::elect(
            leases,
            &settings.lease_namespace,
            &settings.lease_name,
            &settings.identity,
        );
        let mut is_leader = is_leader;
        fence = lease_fence;
        tracing::info!(identity = %settings.identity, lease = %settings.lease_name, "waiting to lead");
        metrics.set_leader(&settings.lease_name, false);
        metrics.set_ready(true);
        // Meanwhile, the Plugins are made ready to serve.
        let standby = settings.plugin_resources.as_ref().map(|live| {
            plugins::Standby::start(
                &watches,
                live.clone(),
                registry.context().clone(),
                metrics.clone(),
            )
        });
        let mut stop = stop_rx.clone();
        let elected = tokio::select! {
            r = is_leader.wait_for(|l| *l) => { r.map(|_| true).map_err(Error::Election)? }
            _ = stop.wait_for(|s| *s) => false,
        };
        prefetched = standby.map(plugins::Standby::take).unwrap_or_default();
        metrics.plugins_prefetched.set(0);
        if !elected {
            drop(is_leader);
            let _ = handle.await;
            return Ok(());
        }
        tracing::info!(identity = %settings.identity, "leading");
        metrics.set_leader(&settings.lease_name, true);
        // Ready again once this replica's watches have listed (below).
        metrics.set_ready(false);
        leadership = Some((is_leader, handle));
    }

    // Stop on shutdown, or when another replica takes the lease.
    let mut lost = leadership.as_ref().map(|(rx, _)| rx.clone());
    let mut stop = stop_rx.clone();
    let (leader_metrics, lease_name) = (metrics.clone(), settings.lease_name.clone());
    let trigger = async move {
        match lost.as_mut() {
            Some(rx) => {
                tokio::select! {
                    _ = rx.wait_for(|l| !*l) => {
                        leader_metrics.set_leader(&lease_name, false);
                        tracing::warn!("lost the lease; stopping");
                    }
                    _ = stop.wait_for(|s| *s) => {}
                }
            }
            None => {
                let _ = stop.wait_for(|s| *s).await;
            }
        }
    };
    lead(
        client,
        registry,
        Replica {
            metrics: metrics.clone(),
            writes,
            watches,
        },
        &settings,
        Holding {
            fence,
            // The Lease is held: nothing more to wait for.
            serving: watch::channel(true).1,
        },
        prefetched,
        trigger,
    )
    .await?;
    metrics.set_ready(false);
    metrics.set_leader(&settings.lease_name, false);
    if let Some((rx, handle)) = leadership {
        let lost = !*rx.borrow();
        drop(rx);
        let _ = handle.await;
        tracing::info!("stepped down");
        if lost && !*stop_rx.borrow() {
            return Err(Error::LeaseLost);
        }
    }
    Ok(())
}

/// What every pipeline of a replica shares: its metrics, its writes in flight, and the
/// connections of its watches.
#[derive(Clone)]
pub(super) struct Replica {
    pub metrics: Arc<Metrics>,
    pub writes: Arc<writes::Writes>,
    pub watches: crate::connection::Watches,
}

/// What a pipeline holds: the fence its writes go through, and whether it serves yet (a
/// shard's take confirmed).
pub(super) struct Holding {
    pub fence: Arc<lease::Fence>,
    pub serving: watch::Receiver<bool>,
}

/// Serves as the leader (or as the holder of one shard, `settings.shard`) until `stop`
/// resolves, writing through `fence`; then lets every controller finish and what they had to
/// report be sent. The watches start at once; the `Plugin` resources are served, and
/// reconciling begins, once `serving` is true (a shard's take confirmed): its watches list
/// meanwhile, so that a shard taken over reconciles as soon as it may.
pub(super) async fn lead(
    client: kube::Client,
    registry: Registry,
    Replica {
        metrics,
        writes,
        watches,
    }: Replica,
    settings: &Settings,
    Holding { fence, mut serving }: Holding,
    mut prefetched: BTreeMap<String, plugins::Prepared>,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let (shared, writers) = setup(
        client.clone(),
        watches,
        registry,
        metrics.clone(),
        writes,
        settings,
        fence.clone(),
    )
    .await?;
    let shared = Arc::new(shared);
    let mut report_workers = Vec::new();
    for _ in 0..report::WORKERS {
        let shared = shared.clone();
        report_workers.push(tokio::spawn(async move {
            shared.reports.work(&shared.metrics).await;
        }));
    }
    let (trigger_tx, _) = tokio::sync::broadcast::channel::<()>(1);
    let trigger_tx2 = trigger_tx.clone();
    let mut stopping = shared.stopping.subscribe();
    let halted = shared.clone();
    tokio::spawn(async move {
        stop.await;
        halted.stopping.send_replace(true);
        let _ = trigger_tx2.send(());
    });

    // Reconciliation starts, and the operator is ready, once every watch has listed what it
    // watches (into its store): the operator then sees the cluster.
    let mut listed = children::watch_children(&shared, writers);
    let registry = shared.registry();
    let kinds: Vec<_> = registry.kinds().collect();
    let discovered = discover(
        &client,
        kinds
            .iter()
            .map(|(_, kind)| GroupVersionKind::gvk(&kind.group, &kind.versions[0], &kind.kind)),
    )
    .await;
    let controllers = Arc::new(Controllers {
        stop: trigger_tx.clone(),
        stopping: stopping.clone(),
        running: Mutex::new(Vec::new()),
        kinds: Mutex::new(BTreeMap::new()),
        finding: tokio::sync::Mutex::new(()),
        unserved: Mutex::new(Vec::new()),
    });
    for ((plugin, kind), found) in kinds.into_iter().zip(discovered) {
        let gvk = GroupVersionKind::gvk(&kind.group, &kind.versions[0], &kind.kind);
        match found {
            Ok((ar, _)) => {
                listed.extend(controllers.start(&shared, settings, plugin.name(), kind, ar))
            }
            Err(e) => {
                tracing::error!(kind = %kind.kind, group = %kind.group, plugin = %plugin.name(),
                    "not serving {}.{}: its CRD is not installed ({e}); install crds/ (looked for again every {REDISCOVER:?})", kind.plural, kind.group);
                lock(&controllers.unserved).push((plugin.clone(), gvk));
            }
        }
    }
    // Plugins served as `Plugin` resources, loaded as they come, change and go: once this
    // replica may write (installing a plugin writes its CRDs and its status).
    let confirmed = settings.plugin_resources.is_none() || {
        let mut stopped = stopping.clone();
        tokio::select! {
            r = serving.wait_for(|s| *s) => r.is_ok(),
            _ = stopped.wait_for(|s| *s) => false,
        }
    };
    let live = match &settings.plugin_resources {
        Some(live) if confirmed => {
            let (task, first) = plugins::serve(
                shared.clone(),
                settings.clone(),
                controllers.clone(),
                live.clone(),
                std::mem::take(&mut prefetched),
            );
            listed.push(("plugins.wasm-operator.dev".to_owned(), first));
            Some(task)
        }
        _ => None,
    };
    if confirmed && live.is_none() && lock(&controllers.running).is_empty() {
        // Nothing was reconciled, so nothing is to report: the workers go with the pipeline.
        for w in &report_workers {
            w.abort();
        }
        return Err(Error::NothingToServe(
            "no CRD of any Kind the plugins serve is installed".into(),
        ));
    }
    let synced = shared.clone();
    let sharded = settings.shard.is_some();
    tokio::spawn(async move {
        // A watch that cannot list (no RBAC for it, say) must not hold every Kind back forever.
        let deadline = tokio::time::Instant::now() + SYNC_TIMEOUT;
        for (name, mut done) in listed {
            // An error means its watch ended: nothing more to wait for.
            let listed = tokio::time::timeout_at(deadline, done.wait_for(|d| *d)).await;
            if listed.is_err() {
                tracing::warn!(watch = %name, "not listed after {SYNC_TIMEOUT:?}; reconciling without it");
            }
        }
        // A shard given back before its take was confirmed never reconciles.
        if !*serving.borrow() {
            tracing::info!("caches synced; reconciling once the shard's take is confirmed");
            if serving.wait_for(|s| *s).await.is_err() {
                return;
            }
        }
        tracing::info!("caches synced; reconciling");
        synced.synced.send_replace(true);
        // A replica of shards is ready from the start, as a standby is.
        if !sharded {
            synced.metrics.set_ready(true);
        }
    });
    let rediscovery = tokio::spawn(rediscover(
        shared.clone(),
        settings.clone(),
        controllers.clone(),
    ));
    // Until the operator stops (shutdown, or the Lease lost); then every controller, those
    // started later too (a Kind whose CRD came late, a plugin loaded live), finishes.
    let _ = stopping.wait_for(|s| *s).await;
    // Nothing starts controllers from here on.
    if let Some(live) = live {
        live.abort();
    }
    rediscovery.abort();
    loop {
        let next = lock(&controllers.running).pop();
        let Some(c) = next else { break };
        let _ = c.await;
    }
    // Finish what the last reconciliations had to report before stepping down.
    shared.reports.flush(Duration::from_secs(10)).await;
    for w in report_workers {
        w.abort();
    }
    Ok(())
}

/// Discovers the child kinds; each the cluster serves gets a store for its watch.
pub(super) async fn setup(
    client: kube::Client,
    watches: crate::connection::Watches,
    registry: Registry,
    metrics: Arc<Metrics>,
    writes: Arc<writes::Writes>,
    settings: &Settings,
    fence: Arc<lease::Fence>,
) -> Result<(Shared, Vec<children::Writer>), Error> {
    // Every child kind once (by `group/version/Kind`), all discovered at once.
    let mut wanted = BTreeMap::new();
    for plugin in registry.plugins() {
        for child in &plugin.info().children {
            let api_version = crate::gvk::api_version(&child.group, &child.version);
            wanted
                .entry(gvk_key(&api_version, &child.kind))
                .or_insert((api_version, child.clone()));
        }
    }
    let discovered = discover(
        &client,
        wanted
            .values()
            .map(|(_, child)| GroupVersionKind::gvk(&child.group, &child.version, &child.kind)),
    )
    .await;
    let mut targets = BTreeMap::new();
    let mut watched = BTreeMap::new();
    let mut writers = Vec::new();
    let mut missing = Vec::new();
    for ((key, (api_version, child)), found) in wanted.into_iter().zip(discovered) {
        let entry = match found {
            Ok((_, caps)) if caps.scope != Scope::Namespaced => Err(Unserved::ClusterScoped {
                kind: child.kind.clone(),
            }),
            Ok((ar, _)) => {
                // One watch per `group/Kind`, on the first version the cluster serves.
                let kind = children::kind_key(&api_version, &child.kind);
                if let std::collections::btree_map::Entry::Vacant(slot) = watched.entry(kind) {
                    let (more, watch) = Watched::new(slot.key(), &ar, &settings.scopes());
                    writers.extend(more);
                    slot.insert(watch);
                }
                Ok(ar)
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {
                missing.push((
                    key.clone(),
                    GroupVersionKind::gvk(&child.group, &child.version, &child.kind),
                ));
                Err(Unserved::NotServed {
                    api_version: api_version.clone(),
                    kind: child.kind.clone(),
                })
            }
            Err(e) => {
                // Served later, perhaps (a CRD still being established, an API server busy).
                missing.push((
                    key.clone(),
                    GroupVersionKind::gvk(&child.group, &child.version, &child.kind),
                ));
                Err(Unserved::Discovery {
                    api_version: api_version.clone(),
                    kind: child.kind.clone(),
                    reason: e.to_string(),
                })
            }
        };
        if let Err(why) = &entry {
            tracing::warn!(kind = %child.kind, "children of this kind will be skipped: {why}");
        }
        targets.insert(key, entry);
    }
    let reporter = Reporter {
        controller: FIELD_MANAGER.to_owned(),
        instance: Some(settings.identity.clone()),
    };
    let applies = Arc::new(Applies::default());
    let shared = Shared {
        reports: report::Reports::new(
            client.clone(),
            Recorder::new(client.clone(), reporter),
            applies.clone(),
            fence.clone(),
            metrics.reports_pending.clone(),
        ),
        fence,
        applies,
        client,
        watches,
        registry: RwLock::new(Arc::new(registry)),
        metrics,
        targets: RwLock::new(targets),
        watched: RwLock::new(watched),
        missing: Mutex::new(missing),
        owners: Arc::new(Mutex::new(BTreeMap::new())),
        applied: Mutex::new(BTreeMap::new()),
        owned: Mutex::new(OwnerIndex::default()),
        waiting: Mutex::new(Waiting::default()),
        failures: Mutex::new(BTreeMap::new()),
        writes,
        budget: budget::Budget::new(settings.render_memory),
        concurrency: settings.concurrency,
        synced: tokio::sync::watch::Sender::new(false),
        stopping: tokio::sync::watch::Sender::new(false),
        render_wait: settings.render_wait,
        rules: settings.rules.clone(),
        shard: settings.shard,
        labelled: Mutex::new(BTreeMap::new()),
        levels: Mutex::new(BTreeMap::new()),
    };
    let owners = shared.owners.clone();
    let room = super::reconcile::waiting_per_namespace(settings.concurrency);
    shared.budget.on_wake(room, move |namespace, key| {
        super::reconcile::wake_put_off(&owners, namespace, key);
    });
    Ok((shared, writers))
}
