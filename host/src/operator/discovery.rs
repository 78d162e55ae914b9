//! Discovery: which of the declared child kinds the cluster serves, and where; those whose CRD
//! is not installed yet are looked for again now and then.

use super::*;

/// Discovers each of `gvks`: one round trip each, all in flight together.
pub(super) async fn discover(
    client: &kube::Client,
    gvks: impl Iterator<Item = GroupVersionKind>,
) -> Vec<Result<(ApiResource, ApiCapabilities), kube::Error>> {
    futures::future::join_all(gvks.map(|gvk| async move { pinned_kind(client, &gvk).await })).await
}

/// How often the child kinds not served at start are looked for again.
pub(super) const REDISCOVER: Duration = Duration::from_secs(5);

/// Looks for the child kinds whose CRD was not installed at start (the Prometheus Operator's
/// ServiceMonitor, installed after the operator). When one appears: watch it, wait for its first
/// list, then apply it from then on, and reconcile every resource, so that the children that were
/// skipped are applied within seconds, with no restart.
pub(super) async fn rediscover(
    shared: Arc<Shared>,
    settings: Settings,
    controllers: Arc<Controllers>,
) {
    let mut stop = controllers.stop.subscribe();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(REDISCOVER) => {}
            _ = stop.recv() => return,
        }
        controllers.start_found(&shared, &settings).await;
        find_missing(&shared, &settings, &controllers).await;
    }
}

/// Looks for the declared child kinds not served yet ([`Shared::missing`]); each found is
/// watched, and applied once its watch has listed; then every resource is reconciled, so that
/// the children skipped meanwhile are applied.
pub(crate) async fn find_missing(
    shared: &Arc<Shared>,
    settings: &Settings,
    controllers: &Controllers,
) {
    // One search at a time (the periodic one, and a plugin loaded live), so that no kind is
    // watched twice.
    let _one = controllers.finding.lock().await;
    let missing = lock(&shared.missing).clone();
    if missing.is_empty() {
        return;
    }
    let found = discover(&shared.client, missing.iter().map(|(_, gvk)| gvk.clone())).await;
    let mut served = Vec::new();
    for ((key, gvk), found) in missing.into_iter().zip(found) {
        match found {
            Ok((ar, caps)) if caps.scope == Scope::Namespaced => served.push((key, ar)),
            Ok(_) => {
                tracing::warn!(kind = %gvk.kind, "installed, but cluster-scoped: children of this kind stay skipped");
                lock(&shared.missing).retain(|(k, _)| *k != key);
            }
            Err(_) => {}
        }
    }
    if served.is_empty() {
        return;
    }
    let mut writers = Vec::new();
    let mut stores = Vec::new();
    for (_, ar) in &served {
        let kind = children::kind_key(&ar.api_version, &ar.kind);
        if !read(&shared.watched).contains_key(&kind) {
            let (more, watch) = Watched::new(&kind, ar, &settings.scopes());
            writers.extend(more);
            stores.push((kind, watch));
        }
    }
    let listed = children::watch_children(shared, writers);
    for (name, mut done) in listed {
        if tokio::time::timeout(SYNC_TIMEOUT, done.wait_for(|d| *d))
            .await
            .is_err()
        {
            tracing::warn!(watch = %name, "not listed after {SYNC_TIMEOUT:?}; applying it anyway");
        }
    }
    {
        let mut watched = write(&shared.watched);
        watched.extend(stores);
    }
    {
        let mut targets = write(&shared.targets);
        let mut missing = lock(&shared.missing);
        for (key, ar) in served {
            tracing::info!(kind = %ar.kind, group = %ar.group, "now served: its children are applied from now on");
            missing.retain(|(k, _)| *k != key);
            targets.insert(key, Ok(ar));
        }
    }
    controllers.rescan_all();
}
