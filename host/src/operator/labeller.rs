//! With shards, the holder of shard 0 labels each resource that has no shard label yet (a new
//! one, or every one after a single leader served them) with the shard its hash names: one
//! write, after which the API server gives the resource to that shard's watch alone.
//!
//! It sees those resources through a watch of their metadata alone (metadata-only list and
//! watch requests), selected by the label's absence, and keeps of each only its identity (name,
//! uid, the version seen) until its label is written: no store of objects, and at most
//! [`WAITING_MAX`] per namespace. Those seen beyond that are not kept: once the namespace's
//! kept ones are taken, a writer lists its unlabelled resources again (metadata, a page at a
//! time) for the next ones. So the holder of shard 0, whose watch would otherwise list every
//! resource of the cluster at the start (none labelled yet), holds little more than the holder
//! of any other shard.
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
use kube::api::{Api, DynamicObject, ListParams, ObjectMeta};
use kube::core::PartialObjectMeta;
use kube::runtime::events::EventType;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::Notify;

use super::report::QueuedEvent;
use super::shard::SHARD_LABEL;
use super::{KindCtx, lock, reconcile};

/// The most resources of one namespace kept waiting for their label: more seen meanwhile are
/// not kept but listed again, a page at a time, once those kept are taken. So a namespace of
/// many thousand new resources costs a few hundred identities, not one each.
const WAITING_MAX: usize = 256;

/// The first wait before a label is tried again; doubled each time, up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(60);

/// The reason of the Warning event on a resource whose shard label the API server refused.
pub(crate) const REFUSED_REASON: &str = "ShardLabelRefused";

/// What that event says: the resource waits, served by no replica, until its label is written.
fn refused_note(target: u32, e: &kube::Error) -> String {
    let note = format!(
        "the operator could not label this resource with its shard ({SHARD_LABEL}={target}), so no replica serves it yet; it tries again with backoff up to {RETRY_MAX:?}: {e}"
    );
    super::status::bounded_to(&note, super::status::MAX_NOTE)
}

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
    /// Namespaces with resources seen but not kept ([`WAITING_MAX`]): listed again once those
    /// kept are taken.
    overflowed: BTreeMap<String, Relist>,
}

/// Where a namespace with resources not kept stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Relist {
    /// To be listed again once none of its kept resources waits.
    Due,
    /// A writer lists it.
    Listing,
    /// A writer lists it, and the watch brought one more that was not kept meanwhile (perhaps
    /// newer than the list): it is listed once more after.
    ListingMissed,
}

impl Queue {
    /// A resource seen with no label: queued, or, if it waits already (or was put off), its
    /// version brought up to date; not kept (false) when its namespace has [`WAITING_MAX`]
    /// waiting, which then is listed again once they are taken.
    fn push(&mut self, meta: ObjectMeta) -> bool {
        let key = (
            meta.namespace.unwrap_or_default(),
            meta.name.unwrap_or_default(),
        );
        if let Some(waiting) = self.entries.get_mut(&key) {
            waiting.uid = meta.uid;
            waiting.version = meta.resource_version;
            return true;
        }
        if self
            .waiting
            .get(&key.0)
            .is_some_and(|q| q.len() >= WAITING_MAX)
        {
            match self.overflowed.get_mut(&key.0) {
                Some(relist) if *relist == Relist::Listing => *relist = Relist::ListingMissed,
                Some(_) => {}
                None => {
                    tracing::info!(namespace = %key.0, "{WAITING_MAX} resources of the namespace wait for their shard label: the others are listed again as those are labelled");
                    self.overflowed.insert(key.0, Relist::Due);
                }
            }
            return false;
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
        true
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

    /// A namespace to list again: one with resources not kept, none of its kept ones waiting,
    /// and no writer listing it. It counts as listed until [`Self::listed`].
    fn relist(&mut self) -> Option<String> {
        let waiting = &self.waiting;
        let (namespace, relist) = self
            .overflowed
            .iter_mut()
            .find(|(ns, relist)| **relist == Relist::Due && !waiting.contains_key(*ns))?;
        *relist = Relist::Listing;
        Some(namespace.clone())
    }

    /// `namespace` was listed again: it is done unless some were `left` unkept, or the watch
    /// brought one not kept meanwhile (then it is listed once more).
    fn listed(&mut self, namespace: &str, left: bool) {
        let missed = self.overflowed.get(namespace) == Some(&Relist::ListingMissed);
        if left || missed {
            self.overflowed.insert(namespace.to_owned(), Relist::Due);
        } else {
            self.overflowed.remove(namespace);
        }
    }

    /// When the first label put off may be tried again.
    fn next_try(&self) -> Option<tokio::time::Instant> {
        self.later.first_key_value().map(|((at, _), _)| *at)
    }
}

/// Lists `namespace`'s resources with no shard label again, a page at a time, keeping them as
/// the watch's are until [`WAITING_MAX`] wait; whether some were left for a later list.
async fn list_again(ctx: &KindCtx, namespace: &str, queue: &Mutex<Queue>) -> bool {
    let api: Api<DynamicObject> =
        Api::namespaced_with(ctx.shared.client.clone(), namespace, &*ctx.ar);
    let mut params = ListParams::default()
        .labels(&unlabelled())
        .limit(u32::try_from(WAITING_MAX).unwrap_or(u32::MAX));
    loop {
        let page = match api.list_metadata(&params).await {
            Ok(page) => page,
            Err(e) => {
                tracing::warn!(controller = %ctx.controller, %namespace,
                    "could not list the resources with no shard label (listed again in {RETRY_FIRST:?}): {e}");
                tokio::time::sleep(RETRY_FIRST).await;
                return true;
            }
        };
        let mut q = lock(queue);
        let mut left = false;
        for item in page.items {
            left |= !q.push(item.metadata);
        }
        drop(q);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(_) if left => return true,
            Some(token) => params = params.continue_token(&token),
            None => return left,
        }
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
                let relist = lock(&queue).relist();
                if let Some(namespace) = relist {
                    let left = list_again(&ctx, &namespace, &queue).await;
                    lock(&queue).listed(&namespace, left);
                    more.notify_waiters();
                    continue;
                }
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
                        // Unlabelled, it is served by no replica: its author is told why, on
                        // the resource, at the first refusal (the retries only log).
                        if identity.failed == 0 {
                            ctx.shared.reports.event(QueuedEvent::new(
                                EventType::Warning,
                                REFUSED_REASON,
                                refused_note(target, &e).into(),
                                &ctx.ar,
                                &identity.meta(namespace, name),
                                &ctx.controller,
                            ));
                        }
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
    fn a_namespace_keeps_so_many_waiting_and_lists_the_rest_again_once_they_are_taken() {
        let now = tokio::time::Instant::now();
        let mut q = Queue::default();
        for i in 0..WAITING_MAX + 10 {
            let kept = q.push(meta("flood", &format!("f{i}"), "1"));
            assert_eq!(kept, i < WAITING_MAX, "f{i}");
        }
        // Another namespace is kept all the same.
        assert!(q.push(meta("quiet", "q0", "1")));
        assert_eq!(q.entries.len(), WAITING_MAX + 1);
        // Not listed again while its kept ones wait.
        assert_eq!(q.relist(), None);
        assert_eq!(names(&mut q, usize::MAX, now).len(), WAITING_MAX + 1);
        assert_eq!(q.relist().as_deref(), Some("flood"));
        assert_eq!(q.relist(), None, "listed by one writer at a time");
        // A list that kept them all: done.
        q.listed("flood", false);
        assert_eq!(q.relist(), None);

        // One seen by the watch and not kept while the list ran: listed once more.
        let mut q = Queue::default();
        for i in 0..=WAITING_MAX {
            q.push(meta("flood", &format!("f{i}"), "1"));
        }
        names(&mut q, usize::MAX, now);
        assert_eq!(q.relist().as_deref(), Some("flood"));
        for i in 0..=WAITING_MAX {
            q.push(meta("flood", &format!("g{i}"), "1"));
        }
        q.listed("flood", false);
        assert_eq!(q.relist(), None, "not while its kept ones wait");
        names(&mut q, usize::MAX, now);
        assert_eq!(q.relist().as_deref(), Some("flood"));
        // A list that left some: listed again.
        q.listed("flood", true);
        assert_eq!(q.relist().as_deref(), Some("flood"));
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
