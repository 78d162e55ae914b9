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
//! The identities wait per namespace, each resource once (at the last version seen); the
//! writers take them from the namespaces in turn, at most a quarter of them (from one to four)
//! writing in one namespace at once, so that one namespace's resources (many at once, or writes
//! held to their floor) hold up no other's. Each label is applied to the version the watch
//! showed: a resource changed since (or labelled by someone else meanwhile) is refused by the
//! API server, and its new version comes through the watch. A label that could not be written
//! waits aside, with backoff, then goes first in its namespace.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Bound;
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

/// What the labeller keeps of a resource until its label is written (its namespace and name
/// are its key).
#[derive(Debug, Clone, PartialEq)]
struct Identity {
    uid: Option<String>,
    version: Option<String>,
    /// How many times its label failed.
    failed: u32,
}

impl Identity {
    fn meta(&self, namespace: &str, name: &str) -> ObjectMeta {
        ObjectMeta {
            namespace: Some(namespace.to_owned()),
            name: Some(name.to_owned()),
            uid: self.uid.clone(),
            resource_version: self.version.clone(),
            ..ObjectMeta::default()
        }
    }
}

/// A resource's key: its namespace and name.
type Key = (String, String);

/// The resources waiting for their label (each once, at the last version seen), per namespace,
/// and the labels being written.
#[derive(Default)]
struct Queue {
    entries: HashMap<Key, Identity>,
    /// Per namespace, the names to take, in order.
    waiting: BTreeMap<String, VecDeque<String>>,
    /// Labels that failed, by when they may be tried again (then first in their namespace).
    later: BTreeMap<(tokio::time::Instant, u64), Key>,
    seq: u64,
    writing: BTreeMap<String, usize>,
    /// The namespace taken from last: the next take starts after it.
    last: Option<String>,
}

impl Queue {
    /// A resource seen with no label: queued, or, if it waits already (or was put off), its
    /// version brought up to date.
    fn push(&mut self, meta: ObjectMeta) {
        let key = (
            meta.namespace.unwrap_or_default(),
            meta.name.unwrap_or_default(),
        );
        if let Some(waiting) = self.entries.get_mut(&key) {
            waiting.uid = meta.uid;
            waiting.version = meta.resource_version;
            return;
        }
        let identity = Identity {
            uid: meta.uid,
            version: meta.resource_version,
            failed: 0,
        };
        self.waiting
            .entry(key.0.clone())
            .or_default()
            .push_back(key.1.clone());
        self.entries.insert(key, identity);
    }

    /// The next resource to label, from the first namespace after the last one taken from
    /// whose writes in flight are under `per_namespace`; labels put off until `now` or earlier
    /// come first in their namespace. It counts as writing until [`Self::done`].
    fn take(&mut self, per_namespace: usize, now: tokio::time::Instant) -> Option<(Key, Identity)> {
        while let Some(entry) = self.later.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let (namespace, name) = entry.remove();
            self.waiting.entry(namespace).or_default().push_front(name);
        }
        loop {
            let after = self.last.clone().unwrap_or_default();
            let writing = &self.writing;
            let namespace = self
                .waiting
                .range::<String, _>((Bound::Excluded(&after), Bound::Unbounded))
                .chain(self.waiting.range::<String, _>(..=&after))
                .find(|(ns, _)| writing.get(*ns).copied().unwrap_or(0) < per_namespace)
                .map(|(ns, _)| ns.clone())?;
            let queue = self.waiting.get_mut(&namespace)?;
            let name = queue.pop_front();
            if queue.is_empty() {
                self.waiting.remove(&namespace);
            }
            self.last = Some(namespace.clone());
            let Some(name) = name else { continue };
            let key = (namespace, name);
            let Some(identity) = self.entries.remove(&key) else {
                continue;
            };
            *self.writing.entry(key.0.clone()).or_default() += 1;
            return Some((key, identity));
        }
    }

    /// The label of `key` is written, or failed.
    fn done(&mut self, namespace: &str) {
        if let Some(n) = self.writing.get_mut(namespace) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.writing.remove(namespace);
            }
        }
    }

    /// The label of `key` failed: tried again at `at`, unless a newer version of it came
    /// meanwhile (that one waits already).
    fn put_off(&mut self, key: Key, mut identity: Identity, at: tokio::time::Instant) {
        if self.entries.contains_key(&key) {
            return;
        }
        identity.failed += 1;
        self.seq += 1;
        self.later.insert((at, self.seq), key.clone());
        self.entries.insert(key, identity);
    }

    /// When the first label put off may be tried again.
    fn next_try(&self) -> Option<tokio::time::Instant> {
        self.later.first_key_value().map(|((at, _), _)| *at)
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
                        lock(&queue).push(resource.metadata);
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
                let Some((key, identity)) = next else {
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
                let (namespace, name) = (&key.0, &key.1);
                let target = shard.sharding.of(namespace, name);
                let result =
                    reconcile::move_to_shard(&identity.meta(namespace, name), &ctx, target).await;
                let mut q = lock(&queue);
                q.done(namespace);
                match result {
                    Ok(()) => {}
                    // Gone, or changed since (the watch brings it again if still unlabelled).
                    Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                    Err(e) => {
                        let wait = RETRY_FIRST
                            .saturating_mul(1 << identity.failed.min(6))
                            .min(RETRY_MAX);
                        tracing::warn!(controller = %ctx.controller, resource = %format!("{namespace}/{name}"), shard = target,
                            "could not label the resource with its shard (tried again in {wait:?}): {e}");
                        q.put_off(key.clone(), identity, tokio::time::Instant::now() + wait);
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

    fn meta(namespace: &str, name: &str, version: &str) -> ObjectMeta {
        ObjectMeta {
            namespace: Some(namespace.into()),
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            resource_version: Some(version.into()),
            labels: Some([("app".to_owned(), "web".to_owned())].into()),
            ..ObjectMeta::default()
        }
    }

    fn names(q: &mut Queue, per_namespace: usize, now: tokio::time::Instant) -> Vec<String> {
        std::iter::from_fn(|| q.take(per_namespace, now))
            .map(|((ns, name), _)| format!("{ns}/{name}"))
            .collect()
    }

    #[test]
    fn a_label_is_applied_to_the_identity_and_version_seen_alone() {
        let mut q = Queue::default();
        q.push(meta("team-a", "web", "7"));
        let ((ns, name), identity) = q.take(4, tokio::time::Instant::now()).unwrap();
        let applied = identity.meta(&ns, &name);
        assert_eq!(applied.resource_version.as_deref(), Some("7"));
        assert_eq!(applied.uid.as_deref(), Some("uid-web"));
        assert_eq!(
            (applied.namespace.as_deref(), applied.name.as_deref()),
            (Some("team-a"), Some("web"))
        );
        assert!(applied.labels.is_none());
        assert_eq!(unlabelled(), "!wasm-operator.dev/shard");
    }

    #[test]
    fn namespaces_take_turns_and_one_never_writes_more_than_its_share() {
        let now = tokio::time::Instant::now();
        let mut q = Queue::default();
        for i in 0..5 {
            q.push(meta("flood", &format!("f{i}"), "1"));
        }
        q.push(meta("quiet", "q0", "1"));
        q.push(meta("quiet", "q1", "1"));
        // In turns, and two at most writing per namespace: the flood waits for its writes.
        assert_eq!(
            names(&mut q, 2, now),
            ["flood/f0", "quiet/q0", "flood/f1", "quiet/q1"]
        );
        q.done("flood");
        assert_eq!(names(&mut q, 2, now), ["flood/f2"]);
    }

    #[test]
    fn a_resource_waits_once_at_its_last_version() {
        let now = tokio::time::Instant::now();
        let mut q = Queue::default();
        q.push(meta("ns", "web", "1"));
        q.push(meta("ns", "web", "2"));
        q.push(meta("ns", "web", "3"));
        let (_, identity) = q.take(4, now).unwrap();
        assert_eq!(identity.version.as_deref(), Some("3"));
        assert!(q.take(4, now).is_none(), "queued once");
    }

    #[test]
    fn a_label_that_failed_waits_for_its_time_without_holding_its_namespace() {
        let now = tokio::time::Instant::now();
        let mut q = Queue::default();
        q.push(meta("ns", "bad", "1"));
        q.push(meta("ns", "good", "1"));
        let (key, identity) = q.take(4, now).unwrap();
        q.done("ns");
        let at = now + Duration::from_secs(5);
        q.put_off(key, identity, at);
        // The other is not held up by the one put off.
        assert_eq!(names(&mut q, 4, now), ["ns/good"]);
        q.done("ns");
        assert_eq!(q.next_try(), Some(at));
        assert_eq!(names(&mut q, 4, at), ["ns/bad"]);
        // Seen again (a newer version) while it was put off: once, at that version.
        let mut q = Queue::default();
        q.push(meta("ns", "bad", "1"));
        let (key, identity) = q.take(4, now).unwrap();
        q.done("ns");
        q.put_off(key, identity, at);
        q.push(meta("ns", "bad", "2"));
        let taken: Vec<_> = std::iter::from_fn(|| q.take(4, at)).collect();
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].1.version.as_deref(), Some("2"));
    }
}
