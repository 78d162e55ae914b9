//! With shards, the holder of shard 0 labels each resource that has no shard label yet (a new
//! one, or every one after a single leader served them) with the shard its hash names: one
//! write, after which the API server gives the resource to that shard's watch alone.
//!
//! It sees those resources through a watch of their metadata alone (metadata-only list and
//! watch requests), selected by the label's absence, and keeps of each only its identity (name,
//! uid, the version seen) until its label is written: no store of objects, and at most
//! [`WAITING_MAX`] per namespace (waiting, put off or being written). Those seen beyond that
//! are not kept: once none of the namespace's kept ones waits to be taken, a writer lists its
//! unlabelled resources again (metadata, a page at a time) for the next ones. So the holder of
//! shard 0, whose watch would otherwise list every resource of the cluster at the start (none
//! labelled yet), holds little more than the holder of any other shard. A namespace whose new
//! resources keep coming as fast as they are labelled lists the ones not kept once they slow.
//!
//! The identities wait per namespace, each resource once (at the last version seen); the
//! writers take them from the namespaces in turn, at most a quarter of them (from one to four)
//! writing in one namespace at once, so that one namespace's resources (many at once, or writes
//! held to their floor) hold up no other's. Each label is applied to the version the watch
//! showed: a resource changed since (or labelled by someone else meanwhile) is refused by the
//! API server, and its new version comes through the watch (one that comes while the label is
//! written is labelled after; an older one, from a list read before it, is not). A label that
//! could not be written waits aside, with backoff, then goes first in its namespace, a quarter
//! of [`WAITING_MAX`] at most per namespace (more are let go, and found by a later list); one
//! the API server refuses (an admission policy, say) puts a Warning event on its resource once.

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
    format!(
        "the operator could not label this resource with its shard ({SHARD_LABEL}={target}), so no replica serves it yet; it tries again with backoff up to {RETRY_MAX:?}: {e}"
    )
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
    /// Whether a Warning event told of its label refused.
    told: bool,
}

impl Identity {
    /// Whether this is a later state of its resource than `than`: a higher resourceVersion
    /// (the API server's are numbers; a list page can be older than the watch's last event),
    /// else any other version or uid.
    fn newer(&self, than: &Identity) -> bool {
        let number = |v: &Option<String>| v.as_deref().and_then(|v| v.parse::<u64>().ok());
        match (number(&self.version), number(&than.version)) {
            (Some(a), Some(b)) => a > b,
            _ => self.version != than.version || self.uid != than.uid,
        }
    }

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
    /// The labels being written, each with a version of its resource seen meanwhile (the watch,
    /// or a list): what is done with it depends on how the write ends ([`Self::done`]).
    in_flight: HashMap<Key, Option<Identity>>,
    /// Per namespace, its labels being written.
    writing: HashMap<String, usize>,
    /// Per namespace, its resources kept: waiting, put off or being written.
    kept: HashMap<String, usize>,
    /// Per namespace, its labels put off (in `later`).
    put_off: HashMap<String, usize>,
    /// The namespace taken from last: the next take starts after it.
    last: Option<String>,
    /// Namespaces with resources seen but not kept ([`WAITING_MAX`]): listed again once those
    /// kept are taken.
    overflowed: BTreeMap<String, Relist>,
}

/// Where a namespace with resources not kept stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Relist {
    /// To be listed again from then on, once none of its kept resources waits to be taken and
    /// at most half of [`WAITING_MAX`] are kept.
    Due(tokio::time::Instant),
    /// A writer lists it.
    Listing,
    /// A writer lists it, and the watch brought one more that was not kept meanwhile (perhaps
    /// newer than the list): it is listed once more after.
    ListingMissed,
}

/// How a list of a namespace ended ([`list_again`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Listed {
    /// Every unlabelled resource listed is kept.
    All,
    /// Some were left: listed again once those kept are taken.
    Left,
    /// The list failed: listed again after [`RELIST_RETRY`].
    Failed,
}

/// The most labels of one namespace put off (failed, waiting to be tried again): a namespace
/// whose labels keep failing (an admission policy refusing them, a webhook down) still lists
/// and labels its others.
const PUT_OFF_MAX: usize = WAITING_MAX / 4;

/// Takes one from `namespace`'s count, forgetting it at zero.
fn decrement(counts: &mut HashMap<String, usize>, namespace: &str) {
    if let Some(n) = counts.get_mut(namespace) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            counts.remove(namespace);
        }
    }
}

/// How long after a failed list a namespace is listed again.
const RELIST_RETRY: Duration = Duration::from_secs(5);

impl Queue {
    /// A resource seen with no label: queued, or, if it waits already (or was put off, or its
    /// label is being written), its version noted; not kept (false) when its namespace keeps
    /// [`WAITING_MAX`] already, which then is listed again once they are taken.
    fn push(&mut self, meta: ObjectMeta, now: tokio::time::Instant) -> bool {
        let key = (
            meta.namespace.unwrap_or_default(),
            meta.name.unwrap_or_default(),
        );
        let identity = Identity {
            uid: meta.uid,
            version: meta.resource_version,
            failed: 0,
            told: false,
        };
        if let Some(waiting) = self.entries.get_mut(&key) {
            if identity.newer(waiting) {
                waiting.uid = identity.uid;
                waiting.version = identity.version;
            }
            return true;
        }
        if let Some(seen) = self.in_flight.get_mut(&key) {
            if seen.as_ref().is_none_or(|seen| identity.newer(seen)) {
                *seen = Some(identity);
            }
            return true;
        }
        if self.kept.get(&key.0).copied().unwrap_or(0) >= WAITING_MAX {
            match self.overflowed.get_mut(&key.0) {
                Some(relist) if *relist == Relist::Listing => *relist = Relist::ListingMissed,
                Some(_) => {}
                None => {
                    tracing::info!(namespace = %key.0, "{WAITING_MAX} resources of the namespace wait for their shard label: the others are listed again as those are labelled");
                    self.overflowed.insert(key.0, Relist::Due(now));
                }
            }
            return false;
        }
        *self.kept.entry(key.0.clone()).or_default() += 1;
        self.queue(key, identity);
        true
    }

    /// Waits `identity` (kept already) at the back of its namespace.
    fn queue(&mut self, key: Key, identity: Identity) {
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
            decrement(&mut self.put_off, &namespace);
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
            self.in_flight.insert(key.clone(), None);
            return Some((key, identity));
        }
    }

    /// The label of `key`, taken as `written`, is written (`failed` false: applied, or refused
    /// as the resource is gone or changed since), or failed (`failed` true: tried again at
    /// `retry`, counted a failure more). A later version of it seen meanwhile is queued (a
    /// write that failed is tried again with it); the same or an older one seen again (a list
    /// that ran while it was written) is not. Of a namespace with [`PUT_OFF_MAX`] put off
    /// already, a label that failed is not kept: the namespace is listed again after `retry`.
    fn done(&mut self, key: Key, written: Identity, failed: bool, retry: tokio::time::Instant) {
        decrement(&mut self.writing, &key.0);
        let newer = self
            .in_flight
            .remove(&key)
            .flatten()
            .filter(|n| n.newer(&written));
        match (failed, newer) {
            (false, None) => decrement(&mut self.kept, &key.0),
            (false, Some(newer)) => self.queue(key, newer),
            (true, _) if self.put_off.get(&key.0).copied().unwrap_or(0) >= PUT_OFF_MAX => {
                decrement(&mut self.kept, &key.0);
                let relist = self.overflowed.entry(key.0).or_insert(Relist::Due(retry));
                match relist {
                    Relist::Listing => *relist = Relist::ListingMissed,
                    Relist::Due(at) => *at = (*at).max(retry),
                    Relist::ListingMissed => {}
                }
            }
            (true, newer) => {
                let mut again = newer.unwrap_or(written.clone());
                again.failed = written.failed + 1;
                again.told |= written.told;
                self.seq += 1;
                *self.put_off.entry(key.0.clone()).or_default() += 1;
                self.later.insert((retry, self.seq), key.clone());
                self.entries.insert(key, again);
            }
        }
    }

    /// A namespace to list again: one with resources not kept, due by `now`, none of its kept
    /// ones waiting to be taken, at most half of [`WAITING_MAX`] kept, and no writer listing
    /// it. It counts as listed until [`Self::listed`].
    fn relist(&mut self, now: tokio::time::Instant) -> Option<String> {
        let (waiting, kept) = (&self.waiting, &self.kept);
        let (namespace, relist) = self.overflowed.iter_mut().find(|(ns, relist)| {
            matches!(relist, Relist::Due(at) if *at <= now)
                && !waiting.contains_key(*ns)
                && kept.get(*ns).copied().unwrap_or(0) <= WAITING_MAX / 2
        })?;
        *relist = Relist::Listing;
        Some(namespace.clone())
    }

    /// `namespace` was listed again, as `listed` says: done when every one listed was kept and
    /// the watch brought none that was not meanwhile; else listed once more (after
    /// [`RELIST_RETRY`] when the list failed).
    fn listed(&mut self, namespace: &str, listed: Listed, now: tokio::time::Instant) {
        let missed = self.overflowed.get(namespace) == Some(&Relist::ListingMissed);
        let again = match listed {
            Listed::Failed => Some(now + RELIST_RETRY),
            Listed::Left => Some(now),
            Listed::All if missed => Some(now),
            Listed::All => None,
        };
        match again {
            Some(at) => self
                .overflowed
                .insert(namespace.to_owned(), Relist::Due(at)),
            None => self.overflowed.remove(namespace),
        };
    }

    /// When the first label put off may be tried again, or the first namespace whose list
    /// failed listed again (after `now`).
    fn next_try(&self, now: tokio::time::Instant) -> Option<tokio::time::Instant> {
        let relists = self.overflowed.values().filter_map(|r| match r {
            Relist::Due(at) if *at > now => Some(*at),
            _ => None,
        });
        self.later
            .first_key_value()
            .map(|((at, _), _)| *at)
            .into_iter()
            .chain(relists)
            .min()
    }
}

/// Lists `namespace`'s resources with no shard label again, a page at a time, keeping them as
/// the watch's are until its namespace keeps [`WAITING_MAX`].
async fn list_again(ctx: &KindCtx, namespace: &str, queue: &Mutex<Queue>) -> Listed {
    let api: Api<DynamicObject> =
        Api::namespaced_with(ctx.shared.client.clone(), namespace, &*ctx.ar);
    let mut params = ListParams::default()
        .labels(&unlabelled())
        .limit(u32::try_from(WAITING_MAX).unwrap_or(u32::MAX));
    let mut pages = 0u32;
    loop {
        let page = match api.list_metadata(&params).await {
            Ok(page) => page,
            Err(e) => {
                tracing::warn!(controller = %ctx.controller, %namespace,
                    "could not list the resources with no shard label (listed again in {RELIST_RETRY:?}): {e}");
                return Listed::Failed;
            }
        };
        pages += 1;
        let now = tokio::time::Instant::now();
        let mut q = lock(queue);
        let mut left = false;
        for item in page.items {
            left |= !q.push(item.metadata, now);
        }
        drop(q);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) if !left => params = params.continue_token(&token),
            next => {
                let left = left || next.is_some();
                tracing::info!(controller = %ctx.controller, %namespace, pages, left,
                    "listed the namespace's resources with no shard label again");
                return if left { Listed::Left } else { Listed::All };
            }
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
                        lock(&queue).push(resource.metadata, tokio::time::Instant::now());
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
                let relist = lock(&queue).relist(now);
                if let Some(namespace) = relist {
                    let listed = Box::pin(list_again(&ctx, &namespace, &queue)).await;
                    lock(&queue).listed(&namespace, listed, tokio::time::Instant::now());
                    more.notify_waiters();
                    continue;
                }
                let next = lock(&queue).take(per_namespace, now);
                let Some((key, identity)) = next else {
                    // Nothing to take now: wait for more, or for the first put off to be due.
                    let due = lock(&queue).next_try(now);
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
                let mut identity = identity;
                let (namespace, name) = (key.0.as_str(), key.1.as_str());
                let target = shard.sharding.of(namespace, name);
                // Each request's future is boxed, held only while it runs: in the writer's own
                // state it would size every writer for it, waiting or not (about 7 KiB: the
                // 16 writers of each of 14 Kinds held 1.6 MiB, measured with heaptrack).
                let result = Box::pin(reconcile::move_to_shard(
                    &identity.meta(namespace, name),
                    &ctx,
                    target,
                ))
                .await;
                let wait = RETRY_FIRST
                    .saturating_mul(1 << identity.failed.min(6))
                    .min(RETRY_MAX);
                let failed = match result {
                    Ok(()) => false,
                    // Gone, or changed since (the watch brings it again if still unlabelled).
                    Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => false,
                    Err(e) => {
                        tracing::warn!(controller = %ctx.controller, resource = %format!("{namespace}/{name}"), shard = target,
                            "could not label the resource with its shard (tried again in {wait:?}): {e}");
                        // Refused (not a failure that may pass, such as a timeout or an
                        // overloaded API server): unlabelled, it is served by no replica, and
                        // its author is told why, on the resource, at the first refusal.
                        let refused = matches!(&e, kube::Error::Api(s) if matches!(s.code, 400 | 403 | 422));
                        if refused && !identity.told {
                            identity.told = true;
                            reconcile::publish(
                                &ctx,
                                &identity.meta(namespace, name),
                                EventType::Warning,
                                REFUSED_REASON,
                                refused_note(target, &e),
                            );
                        }
                        true
                    }
                };
                let mut q = lock(&queue);
                q.done(key, identity, failed, tokio::time::Instant::now() + wait);
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

    /// Takes every resource it can, leaving each in flight.
    fn take_all(
        q: &mut Queue,
        per_namespace: usize,
        now: tokio::time::Instant,
    ) -> Vec<(Key, Identity)> {
        std::iter::from_fn(|| q.take(per_namespace, now)).collect()
    }

    fn names(taken: &[(Key, Identity)]) -> Vec<String> {
        taken
            .iter()
            .map(|((ns, name), _)| format!("{ns}/{name}"))
            .collect()
    }

    /// Every label in flight written.
    fn written(q: &mut Queue, taken: Vec<(Key, Identity)>, now: tokio::time::Instant) {
        for (key, identity) in taken {
            q.done(key, identity, false, now);
        }
    }

    #[test]
    fn a_label_is_applied_to_the_identity_and_version_seen_alone() {
        let now = tokio::time::Instant::now();
        let mut q = Queue::default();
        q.push(meta("team-a", "web", "7"), now);
        let ((ns, name), identity) = q.take(4, now).unwrap();
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
            q.push(meta("flood", &format!("f{i}"), "1"), now);
        }
        q.push(meta("quiet", "q0", "1"), now);
        q.push(meta("quiet", "q1", "1"), now);
        // In turns, and two at most writing per namespace: the flood waits for its writes.
        let mut taken = take_all(&mut q, 2, now);
        assert_eq!(
            names(&taken),
            ["flood/f0", "quiet/q0", "flood/f1", "quiet/q1"]
        );
        let (key, identity) = taken.remove(0);
        q.done(key, identity, false, now);
        assert_eq!(names(&take_all(&mut q, 2, now)), ["flood/f2"]);
    }

    #[test]
    fn a_resource_waits_once_at_its_last_version() {
        let now = tokio::time::Instant::now();
        let mut q = Queue::default();
        q.push(meta("ns", "web", "1"), now);
        q.push(meta("ns", "web", "2"), now);
        q.push(meta("ns", "web", "3"), now);
        let (_, identity) = q.take(4, now).unwrap();
        assert_eq!(identity.version.as_deref(), Some("3"));
        assert!(q.take(4, now).is_none(), "queued once");
    }

    #[test]
    fn a_label_that_failed_waits_for_its_time_without_holding_its_namespace() {
        let now = tokio::time::Instant::now();
        let at = now + Duration::from_secs(5);
        let mut q = Queue::default();
        q.push(meta("ns", "bad", "1"), now);
        q.push(meta("ns", "good", "1"), now);
        let (key, identity) = q.take(4, now).unwrap();
        q.done(key, identity, true, at);
        // The other is not held up by the one put off.
        let good = take_all(&mut q, 4, now);
        assert_eq!(names(&good), ["ns/good"]);
        written(&mut q, good, now);
        assert_eq!(q.next_try(now), Some(at));
        let bad = take_all(&mut q, 4, at);
        assert_eq!(names(&bad), ["ns/bad"]);
        assert_eq!(bad[0].1.failed, 1, "its failures counted");

        // Seen again (a newer version) while its label was written: tried again at that
        // version when the write failed, its failures still counted.
        let mut q = Queue::default();
        q.push(meta("ns", "bad", "1"), now);
        let (key, identity) = q.take(4, now).unwrap();
        q.push(meta("ns", "bad", "2"), now);
        assert!(
            q.take(4, now).is_none(),
            "not queued while its label is written"
        );
        q.done(key, identity, true, at);
        let again = take_all(&mut q, 4, at);
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].1.version.as_deref(), Some("2"));
        assert_eq!(again[0].1.failed, 1);
    }

    #[test]
    fn a_version_seen_while_its_label_is_written_is_labelled_only_if_it_is_another() {
        let now = tokio::time::Instant::now();
        let mut q = Queue::default();
        // A list that ran while the label was written brings the same version: done with it.
        q.push(meta("ns", "web", "1"), now);
        let (key, identity) = q.take(4, now).unwrap();
        q.push(meta("ns", "web", "1"), now);
        q.done(key, identity, false, now);
        assert!(q.take(4, now).is_none());
        assert!(q.kept.is_empty(), "{:?}", q.kept);
        // The label refused as the resource changed meanwhile: the newer version is labelled.
        q.push(meta("ns", "web", "1"), now);
        let (key, identity) = q.take(4, now).unwrap();
        q.push(meta("ns", "web", "2"), now);
        q.done(key, identity, false, now);
        let again = take_all(&mut q, 4, now);
        assert_eq!(again[0].1.version.as_deref(), Some("2"));
        written(&mut q, again, now);
        assert!(q.kept.is_empty(), "{:?}", q.kept);
    }

    #[test]
    fn a_namespace_keeps_so_many_and_lists_the_rest_again_once_they_are_taken() {
        let now = tokio::time::Instant::now();
        let mut q = Queue::default();
        for i in 0..WAITING_MAX + 10 {
            let kept = q.push(meta("flood", &format!("f{i}"), "1"), now);
            assert_eq!(kept, i < WAITING_MAX, "f{i}");
        }
        // Another namespace is kept all the same.
        assert!(q.push(meta("quiet", "q0", "1"), now));
        assert_eq!(q.entries.len(), WAITING_MAX + 1);
        // Not listed again while its kept ones wait.
        assert_eq!(q.relist(now), None);
        let taken = take_all(&mut q, usize::MAX, now);
        assert_eq!(taken.len(), WAITING_MAX + 1);
        // Nor while they are being written: they count as kept.
        assert_eq!(q.relist(now), None);
        assert!(!q.push(meta("flood", "late", "1"), now), "still full");
        written(&mut q, taken, now);
        assert_eq!(q.relist(now).as_deref(), Some("flood"));
        assert_eq!(q.relist(now), None, "listed by one writer at a time");
        // A list that kept every one: done.
        q.listed("flood", Listed::All, now);
        assert_eq!(q.relist(now), None);

        // One brought by the watch and not kept while the list ran: listed once more.
        let mut q = Queue::default();
        for i in 0..=WAITING_MAX {
            q.push(meta("flood", &format!("f{i}"), "1"), now);
        }
        let taken = take_all(&mut q, usize::MAX, now);
        written(&mut q, taken, now);
        assert_eq!(q.relist(now).as_deref(), Some("flood"));
        for i in 0..=WAITING_MAX {
            q.push(meta("flood", &format!("g{i}"), "1"), now);
        }
        q.listed("flood", Listed::All, now);
        assert_eq!(q.relist(now), None, "not while its kept ones wait");
        let taken = take_all(&mut q, usize::MAX, now);
        written(&mut q, taken, now);
        assert_eq!(q.relist(now).as_deref(), Some("flood"));
        // A list that left some: listed again at once; one that failed, later.
        q.listed("flood", Listed::Left, now);
        assert_eq!(q.relist(now).as_deref(), Some("flood"));
        q.listed("flood", Listed::Failed, now);
        assert_eq!(q.relist(now), None, "not at once after a failed list");
        let later = now + RELIST_RETRY;
        assert_eq!(q.next_try(now), Some(later), "a writer wakes for it");
        assert_eq!(q.relist(later).as_deref(), Some("flood"));
    }

    #[test]
    fn labels_that_keep_failing_never_hold_up_their_namespace() {
        let now = tokio::time::Instant::now();
        let at = now + Duration::from_secs(1);
        let mut q = Queue::default();
        for i in 0..100 {
            q.push(meta("refused", &format!("r{i}"), "1"), now);
        }
        for (key, mut identity) in take_all(&mut q, usize::MAX, now) {
            identity.told = true;
            q.done(key, identity, true, at);
        }
        // A quarter of those kept are put off at most; the others are let go, and the
        // namespace is listed again when they would have been tried.
        assert_eq!(q.entries.len(), PUT_OFF_MAX);
        assert_eq!(q.kept.get("refused"), Some(&PUT_OFF_MAX));
        assert_eq!(q.relist(now), None);
        assert_eq!(q.relist(at).as_deref(), Some("refused"));
        assert!(q.push(meta("refused", "new", "1"), at), "others are kept");
        // Those put off keep their count of failures and that they were told of.
        let again = take_all(&mut q, usize::MAX, at);
        assert!(
            again
                .iter()
                .filter(|(k, _)| k.1 != "new")
                .all(|(_, i)| i.failed == 1 && i.told)
        );
    }

    #[test]
    fn an_older_version_from_a_list_never_replaces_a_newer_one_seen() {
        let now = tokio::time::Instant::now();
        let mut q = Queue::default();
        q.push(meta("ns", "web", "5"), now);
        q.push(meta("ns", "web", "3"), now);
        let (key, identity) = q.take(4, now).unwrap();
        assert_eq!(identity.version.as_deref(), Some("5"));
        // While its label is written: the watch brings 7, a list read before it 6.
        q.push(meta("ns", "web", "7"), now);
        q.push(meta("ns", "web", "6"), now);
        q.done(key, identity, false, now);
        let again = take_all(&mut q, 4, now);
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].1.version.as_deref(), Some("7"));
    }
}
