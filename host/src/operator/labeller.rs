//! With shards, the holder of shard 0 labels each resource that has no shard label yet (a new
//! one, or every one after a single leader served them) with the shard its hash names: one
//! write, after which the API server gives the resource to that shard's watch alone.
//!
//! It sees those resources through a watch of their metadata alone (metadata-only list and
//! watch requests), selected by the label's absence, and keeps of each only its identity (name,
//! uid, the version seen) until its label is written: no store of objects. So the holder of
//! shard 0, whose watch would otherwise list every resource of the cluster at the start (none
//! labelled yet), holds little more than the holder of any other shard.
//!
//! The identities wait per namespace; the writers take them from the namespaces in turn, at
//! most a quarter of them (at least one) writing in one namespace at once, so that one
//! namespace's resources (many at once, or writes held to their floor) hold up no other's. Each
//! label is applied to the version the watch showed: a resource changed since (or labelled by
//! someone else meanwhile) is refused by the API server, and its new version comes through the
//! watch. A label that could not be written waits in its namespace again, with backoff.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, DynamicObject, ObjectMeta};
use kube::core::PartialObjectMeta;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::Notify;

use super::shard::SHARD_LABEL;
use super::{KindCtx, lock, reconcile};

/// The first wait before a label is tried again; doubled each time, up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(60);

/// The selector of the resources with no shard label.
pub(super) fn unlabelled() -> String {
    format!("!{SHARD_LABEL}")
}

/// What the labeller keeps of a resource until its label is written.
#[derive(Debug, Clone, PartialEq)]
struct Identity {
    name: String,
    uid: Option<String>,
    version: Option<String>,
    /// How many times its label failed, and when it may be tried again.
    failed: u32,
    not_before: Option<tokio::time::Instant>,
}

impl Identity {
    fn of(meta: ObjectMeta) -> (String, Self) {
        (
            meta.namespace.unwrap_or_default(),
            Self {
                name: meta.name.unwrap_or_default(),
                uid: meta.uid,
                version: meta.resource_version,
                failed: 0,
                not_before: None,
            },
        )
    }

    fn meta(&self, namespace: &str) -> ObjectMeta {
        ObjectMeta {
            namespace: Some(namespace.to_owned()),
            name: Some(self.name.clone()),
            uid: self.uid.clone(),
            resource_version: self.version.clone(),
            ..ObjectMeta::default()
        }
    }
}

/// The resources waiting for their label, per namespace, and the labels being written.
#[derive(Default)]
struct Queue {
    waiting: BTreeMap<String, VecDeque<Identity>>,
    writing: BTreeMap<String, usize>,
    /// The namespace taken from last: the next take starts after it.
    last: Option<String>,
}

impl Queue {
    fn push(&mut self, namespace: String, identity: Identity) {
        self.waiting
            .entry(namespace)
            .or_default()
            .push_back(identity);
    }

    /// The next resource to label, from the first namespace after the last one taken from
    /// whose writes in flight are under `per_namespace` and whose first resource may be tried
    /// `now`; it counts as writing until [`Self::done`].
    fn take(
        &mut self,
        per_namespace: usize,
        now: tokio::time::Instant,
    ) -> Option<(String, Identity)> {
        let after = self.last.clone().unwrap_or_default();
        let order = self
            .waiting
            .range::<String, _>((
                std::ops::Bound::Excluded(&after),
                std::ops::Bound::Unbounded,
            ))
            .chain(self.waiting.range::<String, _>(..=&after))
            .map(|(ns, _)| ns.clone())
            .collect::<Vec<_>>();
        for namespace in order {
            let busy = self.writing.get(&namespace).copied().unwrap_or(0) >= per_namespace;
            let Some(queue) = self.waiting.get_mut(&namespace) else {
                continue;
            };
            let ready = queue
                .front()
                .is_some_and(|i| i.not_before.is_none_or(|t| t <= now));
            if busy || !ready {
                continue;
            }
            let Some(identity) = queue.pop_front() else {
                continue;
            };
            if queue.is_empty() {
                self.waiting.remove(&namespace);
            }
            *self.writing.entry(namespace.clone()).or_default() += 1;
            self.last = Some(namespace.clone());
            return Some((namespace, identity));
        }
        None
    }

    fn done(&mut self, namespace: &str) {
        if let Some(n) = self.writing.get_mut(namespace) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.writing.remove(namespace);
            }
        }
    }

    /// The earliest time a waiting resource put off after a failure may be tried.
    fn next_try(&self) -> Option<tokio::time::Instant> {
        self.waiting
            .values()
            .filter_map(|q| q.front().and_then(|i| i.not_before))
            .min()
    }
}

/// Labels, until `stopped()` resolves, each resource of `ctx`'s Kind that `api` lists or watches
/// with no shard label, `concurrency` writers taking them from the namespaces in turn; nothing
/// before the pipeline reconciles (its shard's take confirmed, its caches synced).
pub(super) async fn run<S, F>(
    ctx: Arc<KindCtx>,
    api: Api<PartialObjectMeta<DynamicObject>>,
    concurrency: u16,
    stopped: S,
) where
    S: Fn() -> F,
    F: std::future::Future<Output = ()>,
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
    let queue = Arc::new(Mutex::new(Queue::default()));
    let more = Arc::new(Notify::new());
    let feed = {
        let (queue, more, ctx) = (queue.clone(), more.clone(), ctx.clone());
        watcher(api, super::watch_config().labels(&unlabelled()))
            .default_backoff()
            .applied_objects()
            .for_each(move |found| {
                match found {
                    Ok(resource) => {
                        let (namespace, identity) = Identity::of(resource.metadata);
                        lock(&queue).push(namespace, identity);
                        more.notify_one();
                    }
                    Err(e) => {
                        tracing::warn!(controller = %ctx.controller, "watch of the resources with no shard label: {e}");
                    }
                }
                std::future::ready(())
            })
    };
    let writers = futures::future::join_all((0..concurrency.max(1)).map(|_| {
        let (queue, more, ctx) = (queue.clone(), more.clone(), ctx.clone());
        async move {
            loop {
                let now = tokio::time::Instant::now();
                let next = lock(&queue).take(per_namespace, now);
                let Some((namespace, mut identity)) = next else {
                    // Nothing to take now: wait for more, or for the first put off to be due.
                    let due = lock(&queue).next_try();
                    match due {
                        Some(due) => {
                            tokio::select! {
                                () = more.notified() => {}
                                () = tokio::time::sleep_until(due) => {}
                            }
                        }
                        None => more.notified().await,
                    }
                    continue;
                };
                let target = shard.sharding.of(&namespace, &identity.name);
                let result =
                    reconcile::move_to_shard(&identity.meta(&namespace), &ctx, target).await;
                let mut q = lock(&queue);
                q.done(&namespace);
                match result {
                    Ok(()) => {}
                    // Gone, or changed since (the watch brings it again if still unlabelled).
                    Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                    Err(e) => {
                        let wait = RETRY_FIRST
                            .saturating_mul(1 << identity.failed.min(6))
                            .min(RETRY_MAX);
                        tracing::warn!(controller = %ctx.controller, resource = %format!("{namespace}/{}", identity.name), shard = target,
                            "could not label the resource with its shard (tried again in {wait:?}): {e}");
                        identity.failed += 1;
                        identity.not_before = Some(tokio::time::Instant::now() + wait);
                        q.push(namespace, identity);
                    }
                }
                drop(q);
                // Another writer may take from that namespace now.
                more.notify_one();
            }
        }
    }));
    tokio::select! {
        () = feed => {}
        _ = writers => {}
        () = stopped() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(name: &str) -> Identity {
        Identity::of(ObjectMeta {
            namespace: Some("ns".into()),
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            resource_version: Some("7".into()),
            labels: Some([("app".to_owned(), "web".to_owned())].into()),
            ..ObjectMeta::default()
        })
        .1
    }

    #[test]
    fn a_label_is_applied_to_the_identity_and_version_seen_alone() {
        let kept = identity("web");
        let meta = kept.meta("team-a");
        assert_eq!(meta.resource_version.as_deref(), Some("7"));
        assert_eq!(meta.uid.as_deref(), Some("uid-web"));
        assert_eq!(
            (meta.namespace.as_deref(), meta.name.as_deref()),
            (Some("team-a"), Some("web"))
        );
        assert!(meta.labels.is_none());
        assert_eq!(unlabelled(), "!wasm-operator.dev/shard");
    }

    #[test]
    fn namespaces_take_turns_and_one_never_writes_more_than_its_share() {
        let now = tokio::time::Instant::now();
        let mut q = Queue::default();
        for i in 0..5 {
            q.push("flood".into(), identity(&format!("f{i}")));
        }
        q.push("quiet".into(), identity("q0"));
        q.push("quiet".into(), identity("q1"));
        let mut taken = Vec::new();
        while let Some((ns, i)) = q.take(2, now) {
            taken.push(format!("{ns}/{}", i.name));
        }
        // In turns, and two at most writing per namespace: the flood waits for its writes.
        assert_eq!(taken, ["flood/f0", "quiet/q0", "flood/f1", "quiet/q1"]);
        q.done("flood");
        assert_eq!(q.take(2, now).map(|(_, i)| i.name), Some("f2".to_owned()));
        assert!(q.take(2, now).is_none(), "the flood is at its share again");
    }

    #[test]
    fn a_label_that_failed_waits_for_its_time() {
        let now = tokio::time::Instant::now();
        let mut q = Queue::default();
        let mut late = identity("late");
        late.not_before = Some(now + Duration::from_secs(5));
        q.push("ns".into(), late);
        assert!(q.take(4, now).is_none());
        assert_eq!(q.next_try(), Some(now + Duration::from_secs(5)));
        assert!(q.take(4, now + Duration::from_secs(5)).is_some());
    }
}
