//! With shards, the holder of shard 0 labels each resource that has no shard label yet (a new
//! one, or every one after a single leader served them) with the shard its hash names: one
//! write, after which the API server gives the resource to that shard's watch alone.
//!
//! It sees those resources through a watch of their metadata alone, selected by the label's
//! absence, and keeps none of them: no store, no queue beyond the writes in flight (the watch
//! is read no faster than the labels are written). So the holder of shard 0, whose watch would
//! otherwise list every resource of the cluster at the start (none labelled yet), holds no more
//! than the holder of any other shard.
//!
//! A label that could not be written is tried again later with backoff, off the watch's path,
//! so that resources whose label is refused (an admission policy, say) hold up no other.

use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::runtime::{WatchStreamExt, watcher};

use super::KindCtx;
use super::reconcile;
use super::shard::SHARD_LABEL;

/// The first wait before a label that failed is written again; doubled each time, up to
/// [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(60);

/// The selector of the resources with no shard label.
pub(super) fn unlabelled() -> String {
    format!("!{SHARD_LABEL}")
}

/// Labels, until `stopped` resolves, each resource of `ctx`'s Kind that `api` lists or watches
/// with no shard label, at most `concurrency` at once; nothing before the pipeline reconciles
/// (its shard's take confirmed, its caches synced).
pub(super) async fn run(
    ctx: std::sync::Arc<KindCtx>,
    api: Api<PartialObjectMeta<DynamicObject>>,
    concurrency: usize,
    stopped: impl std::future::Future<Output = ()>,
) {
    let Some(shard) = ctx.shared.shard else {
        return;
    };
    let mut synced = ctx.shared.synced.subscribe();
    let mut stopping = ctx.shared.stopping.subscribe();
    tokio::select! {
        r = synced.wait_for(|s| *s) => if r.is_err() { return },
        _ = stopping.wait_for(|s| *s) => return,
    }
    let config = super::watch_config().labels(&unlabelled());
    let labels = watcher(api, config)
        .default_backoff()
        .applied_objects()
        .for_each_concurrent(concurrency.max(1), |found| {
            let ctx = ctx.clone();
            async move {
                let resource = match found {
                    Ok(resource) => resource,
                    Err(e) => {
                        tracing::warn!(controller = %ctx.controller, "watch of the unlabelled resources: {e}");
                        return;
                    }
                };
                let meta = resource.metadata;
                let target = shard.sharding.of(
                    meta.namespace.as_deref().unwrap_or_default(),
                    meta.name.as_deref().unwrap_or_default(),
                );
                if let Err(e) = reconcile::move_to_shard(&meta, &ctx, target).await {
                    retry_later(ctx, meta, target, e);
                }
            }
        });
    tokio::select! {
        () = labels => {}
        () = stopped => {}
    }
}

/// Writes the label of `meta`'s resource again, with backoff, on a task of its own, until it is
/// written, the resource is gone (or made again under its name: a new one, which the watch
/// brings), or the pipeline stops.
fn retry_later(
    ctx: std::sync::Arc<KindCtx>,
    meta: kube::api::ObjectMeta,
    target: u32,
    first: kube::Error,
) {
    let resource = format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    );
    tokio::spawn(async move {
        let mut stopping = ctx.shared.stopping.subscribe();
        let mut wait = RETRY_FIRST;
        let mut error = first;
        loop {
            if matches!(&error, kube::Error::Api(s) if s.code == 404 || s.code == 409) {
                return;
            }
            tracing::warn!(controller = %ctx.controller, %resource, shard = target,
                "could not label the resource with its shard (tried again in {wait:?}): {error}");
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                _ = stopping.wait_for(|s| *s) => return,
            }
            wait = (wait * 2).min(RETRY_MAX);
            match reconcile::move_to_shard(&meta, &ctx, target).await {
                Ok(()) => return,
                Err(e) => error = e,
            }
        }
    });
}
