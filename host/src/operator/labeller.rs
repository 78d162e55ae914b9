//! With shards, the holder of shard 0 labels each resource that has no shard label yet (a new
//! one, or every one after a single leader served them) with the shard its hash names: one
//! write, after which the API server gives the resource to that shard's watch alone.
//!
//! It sees those resources through a watch of their metadata alone (metadata-only list and
//! watch requests), selected by the label's absence, and keeps none of them in a store: the
//! watch is read no faster than the labels are written. So the holder of shard 0, whose watch
//! would otherwise list every resource of the cluster at the start (none labelled yet), holds
//! no more than the holder of any other shard.
//!
//! Each label is applied to the version the watch showed: a resource changed since (or labelled
//! by someone else meanwhile) is refused by the API server, and its new version comes through
//! the watch. A label that could not be written, or whose namespace already has its share of
//! the labeller's writes waiting, is tried again later on a task of its own that keeps the
//! resource's identity alone, so that one namespace's resources (an admission policy refusing
//! the label, a namespace whose writes are held to their floor) hold up no other's.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, DynamicObject, ObjectMeta};
use kube::core::PartialObjectMeta;
use kube::runtime::{WatchStreamExt, watcher};

use super::shard::SHARD_LABEL;
use super::{KindCtx, lock, reconcile};

/// The first wait before a label is tried again; doubled each time, up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(60);

/// The selector of the resources with no shard label.
pub(super) fn unlabelled() -> String {
    format!("!{SHARD_LABEL}")
}

/// What labelling a resource keeps of it: its identity and the version seen.
fn identity(meta: ObjectMeta) -> ObjectMeta {
    ObjectMeta {
        namespace: meta.namespace,
        name: meta.name,
        uid: meta.uid,
        resource_version: meta.resource_version,
        ..ObjectMeta::default()
    }
}

/// Labels, until `stopped()` resolves, each resource of `ctx`'s Kind that `api` lists or watches
/// with no shard label, at most `concurrency` at once and a quarter of those (at least one) per
/// namespace; nothing before the pipeline reconciles (its shard's take confirmed, its caches
/// synced).
pub(super) async fn run<S, F>(
    ctx: Arc<KindCtx>,
    api: Api<PartialObjectMeta<DynamicObject>>,
    concurrency: u16,
    stopped: S,
) where
    S: Fn() -> F + Clone + Send + Sync + 'static,
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let Some(shard) = ctx.shared.shard else {
        return;
    };
    let mut synced = ctx.shared.synced.subscribe();
    tokio::select! {
        r = synced.wait_for(|s| *s) => if r.is_err() { return },
        () = stopped() => return,
    }
    let per_namespace = reconcile::waiting_per_namespace(concurrency);
    let waiting: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
    let config = super::watch_config().labels(&unlabelled());
    let labels = watcher(api, config)
        .default_backoff()
        .applied_objects()
        .for_each_concurrent(usize::from(concurrency.max(1)), |found| {
            let (ctx, waiting, stopped) = (ctx.clone(), waiting.clone(), stopped.clone());
            async move {
                let meta = match found {
                    Ok(resource) => identity(resource.metadata),
                    Err(e) => {
                        tracing::warn!(controller = %ctx.controller, "watch of the resources with no shard label: {e}");
                        return;
                    }
                };
                let target = shard.sharding.of(
                    meta.namespace.as_deref().unwrap_or_default(),
                    meta.name.as_deref().unwrap_or_default(),
                );
                let namespace = meta.namespace.clone().unwrap_or_default();
                let room = {
                    let mut waiting = lock(&waiting);
                    let n = waiting.entry(namespace.clone()).or_default();
                    *n += 1;
                    *n <= per_namespace
                };
                let result = if room {
                    Some(reconcile::move_to_shard(&meta, &ctx, target).await)
                } else {
                    None
                };
                if let Some(n) = lock(&waiting).get_mut(&namespace) {
                    *n -= 1;
                }
                match result {
                    Some(Ok(())) => {}
                    Some(Err(e)) => retry_later(ctx, meta, target, Some(e), stopped),
                    // Its namespace has its share waiting already.
                    None => retry_later(ctx, meta, target, None, stopped),
                }
            }
        });
    tokio::select! {
        () = labels => {}
        () = stopped() => {}
    }
}

/// Writes the label of the resource `meta` names again, with backoff, on a task of its own,
/// until it is written, the resource is gone or changed (404, 409: a changed one comes through
/// the watch again, if still unlabelled), or the Kind's controllers stop. `error`: why the last
/// try failed (none: it was put off).
fn retry_later<S, F>(
    ctx: Arc<KindCtx>,
    meta: ObjectMeta,
    target: u32,
    mut error: Option<kube::Error>,
    stopped: S,
) where
    S: Fn() -> F + Send + 'static,
    F: std::future::Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        let resource = format!(
            "{}/{}",
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default()
        );
        let mut wait = RETRY_FIRST;
        loop {
            match &error {
                Some(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => return,
                Some(e) => {
                    tracing::warn!(controller = %ctx.controller, %resource, shard = target,
                        "could not label the resource with its shard (tried again in {wait:?}): {e}");
                }
                None => {}
            }
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = stopped() => return,
            }
            wait = (wait * 2).min(RETRY_MAX);
            match reconcile::move_to_shard(&meta, &ctx, target).await {
                Ok(()) => return,
                Err(e) => error = Some(e),
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_label_is_applied_to_the_identity_and_version_seen_alone() {
        let meta = ObjectMeta {
            namespace: Some("team-a".into()),
            name: Some("web".into()),
            uid: Some("u-1".into()),
            resource_version: Some("42".into()),
            labels: Some([("app".to_owned(), "web".to_owned())].into()),
            annotations: Some([("a".to_owned(), "b".repeat(1000))].into()),
            ..ObjectMeta::default()
        };
        let kept = identity(meta);
        assert_eq!(kept.resource_version.as_deref(), Some("42"));
        assert_eq!(kept.uid.as_deref(), Some("u-1"));
        assert_eq!(
            (kept.namespace.as_deref(), kept.name.as_deref()),
            (Some("team-a"), Some("web"))
        );
        assert!(kept.labels.is_none() && kept.annotations.is_none());
        assert_eq!(unlabelled(), "!wasm-operator.dev/shard");
    }
}
