//! Status writes and events, off the reconciliation's path.
//!
//! A reconciliation's children are what users wait for, so its slot is freed as soon as they are
//! applied; what it has to report goes to a queue that a few workers write. Status writes are
//! coalesced per resource: when a resource's status changes again before the last change was
//! written (a burst of new resources, a rollout), only the newest status is written. A status
//! that says the resource is still settling (children applied, not all ready yet) waits up to
//! [`SETTLING`] for its successor, so that a resource whose children become ready quickly goes
//! from no status straight to Ready in one write; a status with `observedGeneration` behind the
//! generation is `InProgress` to kstatus readers meanwhile, which is what it is. Events are
//! written in order.
//!
//! A resource has one status write in flight at a time (two could land in either order), and
//! a status written counts as the resource's current one until the watch shows it
//! ([`Reports::newest_status`]): a reconciliation in between would otherwise compare what it
//! finds with the status before, and skip the write that says so.
//!
//! Applies come first: while a namespace has children being applied (a burst after a start or
//! an upgrade), its reports give way, so that they do not compete with the applies for the API
//! server: on 10,000 Services the children were all applied in 1.05 times the bare loop's
//! time with the reports after them, and in 1.56 times with 20,000 reports written alongside
//! (docs/benchmarks.md, session 23).
//! Not for ever: a report waits for its namespace's applies at most [`MAX_DEFER`] from when it
//! was asked, so reports keep moving in a namespace that is never quiet; and with more than
//! [`MAX_QUEUED_EVENTS`] events waiting, events no longer wait (statuses are one per resource at
//! most, events are not: the queue's memory comes first). Other namespaces' reports do not
//! wait: one tenant's burst delays only its own.
//!
//! An event says when it happened (`eventTime`), not when it was written. A write that fails
//! for a reason other than the resource being gone is retried after a second, unless a newer
//! status has replaced it.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;
use kube::runtime::events::{Event, EventType};
use prometheus_client::metrics::gauge::Gauge;
use serde_json::Value;
use serde_json::value::RawValue;
use tokio::sync::Notify;

use super::children::Applies;
use super::events::Recorder;
use super::lock;
use super::metrics::{Metrics, WriteLabels};
use crate::ownership::FIELD_MANAGER;

/// How many writes of reports are in flight at most.
pub(crate) const WORKERS: usize = 4;
/// How long a failed status write waits before it is tried again: [`RETRY`] doubling with each
/// failure in a row, to at most [`MAX_RETRY`].
const RETRY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(300);

/// The wait after the `failures`th failure in a row (`failures` ≥ 1).
fn retry_after(failures: u32) -> Duration {
    RETRY
        .saturating_mul(1 << failures.saturating_sub(1).min(16))
        .min(MAX_RETRY)
}
/// How long a settling status waits for a newer one before it is written.
pub(crate) const SETTLING: Duration = Duration::from_secs(2);
/// How long a report waits at most for the applies in flight in its namespace: longer than a
/// start on 10,000 resources takes to apply their children (170 s to 290 s on two cores).
const MAX_DEFER: Duration = Duration::from_secs(300);
/// More events waiting than this, and they no longer wait for applies: about 5 MiB.
const MAX_QUEUED_EVENTS: usize = 16_384;

/// Which resource a status belongs to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Key {
    pub controller: String,
    pub namespace: String,
    pub name: String,
}

/// The key of the resource `o` of `controller`.
pub(crate) fn key(controller: &str, o: &kube::api::DynamicObject) -> Key {
    Key {
        controller: controller.to_owned(),
        namespace: o.metadata.namespace.clone().unwrap_or_default(),
        name: o.metadata.name.clone().unwrap_or_default(),
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.controller, self.namespace, self.name)
    }
}

/// A status to write through the status subresource.
#[derive(Debug, Clone)]
struct StatusWrite {
    ar: Arc<ApiResource>,
    /// Kept as JSON text: in a burst of new resources thousands wait here, and a status as a
    /// tree of values takes several times the memory of its text.
    status: Box<RawValue>,
    /// When this resource's status was first asked for, since it was last written.
    asked: Instant,
    not_before: Instant,
    /// Failed writes in a row of this resource's status.
    failures: u32,
}

/// Statuses to write (one per resource, the newest, in the order resources first asked) and
/// events to write (in order), by namespace, the namespaces taking turns; of a namespace,
/// statuses go first.
#[derive(Default)]
struct Queue {
    /// Each key is one allocation that `order` shares.
    statuses: BTreeMap<Arc<Key>, StatusWrite>,
    /// Each namespace's resources with a status in `statuses`.
    order: BTreeMap<String, VecDeque<Arc<Key>>>,
    events: BTreeMap<String, VecDeque<QueuedEvent>>,
    /// How many events `events` holds.
    event_count: usize,
    /// The namespace whose report was taken last: the next turn is the one after it.
    turn: String,
    /// Shutting down: nothing waits for applies.
    flushing: bool,
    /// The statuses being written, and those written that the watch has not shown yet.
    writing: BTreeMap<Arc<Key>, Written>,
}

/// A status being written, or written and not yet shown by the watch: until the watch shows
/// it, it is newer than the watch's copy of its resource. A reconciliation in that window that
/// compared its status with the watch's copy would take a status already replaced for the
/// current one, and skip the write that says what is current (session 32: a resource left
/// saying "7/3 available" after its Deployment was back at 3, until something else changed).
#[derive(Debug)]
struct Written {
    status: Box<RawValue>,
    /// The resourceVersion the write returned; `None` while it is in flight.
    resource_version: Option<String>,
    /// The resourceVersions the watch showed of the resource while the write was in flight
    /// (the watch may show the write before its answer arrives).
    seen: Vec<String>,
    /// The watch showed the resource deleted while the write was in flight: the write is no
    /// resource's status, but the next one (of a resource made again) still waits for its end.
    gone: bool,
}

/// A status kept as text, as a value.
fn parsed(status: &RawValue) -> Option<Value> {
    serde_json::from_str(status.get()).ok()
}

impl Queue {
    /// Queues `write` for `key`, replacing an unwritten one, due no later than that one was; but
    /// a status whose writes are failing keeps its backoff.
    fn push_status(&mut self, key: Arc<Key>, mut write: StatusWrite) {
        if let Some(earlier) = self.statuses.get(&key) {
            write.asked = earlier.asked;
            if earlier.failures > 0 {
                write.failures = earlier.failures;
                write.not_before = write.not_before.max(earlier.not_before);
            } else {
                write.not_before = write.not_before.min(earlier.not_before);
            }
        }
        let asked = write.asked;
        if self.statuses.insert(key.clone(), write).is_none() {
            // In the order they were asked: a retried status goes back where it was.
            let keys = self.order.entry(key.namespace.clone()).or_default();
            let statuses = &self.statuses;
            let at = keys.partition_point(|k| statuses.get(k).is_some_and(|w| w.asked <= asked));
            keys.insert(at, key);
        }
    }

    fn push_event(&mut self, event: QueuedEvent) {
        self.events
            .entry(event.namespace().to_owned())
            .or_default()
            .push_back(event);
        self.event_count += 1;
    }

    /// Queues `write` again after it failed, with backoff; a newer status that replaced it
    /// meanwhile is written instead, with the same backoff.
    fn retry_status(&mut self, key: Arc<Key>, write: StatusWrite, now: Instant) {
        // Not written: the watch's copy is as current as it was.
        self.writing.remove(&key);
        let failures = write.failures + 1;
        let not_before = now + retry_after(failures);
        match self.statuses.get_mut(&key) {
            Some(newer) => {
                newer.failures = failures;
                newer.not_before = newer.not_before.max(not_before);
            }
            None => self.push_status(
                key,
                StatusWrite {
                    not_before,
                    failures,
                    ..write
                },
            ),
        }
    }

    /// The namespaces in turn, from the one after the last served: of each, the first status
    /// due at `now`, else its oldest event. Those of the namespaces in `busy` (applies in
    /// flight) wait up to [`MAX_DEFER`] from when they were asked. Else when one falls due
    /// (`None`: nothing is queued).
    fn pop(&mut self, now: Instant, busy: &HashSet<String>) -> Result<Work, Option<Instant>> {
        use std::ops::Bound::{Excluded, Included, Unbounded};
        let crowded = self.event_count > MAX_QUEUED_EVENTS;
        let mut earliest: Option<Instant> = None;
        let mut sooner = |at: Instant| earliest = Some(earliest.map_or(at, |e| e.min(at)));
        let namespaces: std::collections::BTreeSet<&str> = self
            .order
            .keys()
            .chain(self.events.keys())
            .map(String::as_str)
            .collect();
        let turn = self.turn.as_str();
        let in_turn = namespaces
            .range::<str, _>((Excluded(turn), Unbounded))
            .chain(namespaces.range::<str, _>((Unbounded, Included(turn))));
        let mut chosen = None;
        'namespaces: for &namespace in in_turn {
            let waiting = !self.flushing && busy.contains(namespace);
            for (i, key) in self.order.get(namespace).into_iter().flatten().enumerate() {
                let Some(w) = self.statuses.get(key) else {
                    continue;
                };
                // One write of a resource's status at a time: two in flight could land in
                // either order, the older last. Its turn comes when the one in flight ends.
                if self
                    .writing
                    .get(key)
                    .is_some_and(|w| w.resource_version.is_none())
                {
                    continue;
                }
                if waiting && w.asked + MAX_DEFER > now {
                    // Those after it were asked later (`push_status` keeps them in that order).
                    sooner(w.asked + MAX_DEFER);
                    break;
                }
                if w.not_before > now {
                    sooner(w.not_before);
                    continue;
                }
                chosen = Some((namespace.to_owned(), Some(i)));
                break 'namespaces;
            }
            if let Some(first) = self.events.get(namespace).and_then(VecDeque::front) {
                if waiting && !crowded && first.asked + MAX_DEFER > now {
                    sooner(first.asked + MAX_DEFER);
                } else {
                    chosen = Some((namespace.to_owned(), None));
                    break;
                }
            }
        }
        let Some((namespace, status)) = chosen else {
            return Err(earliest);
        };
        let work = match status {
            Some(i) => {
                let key = self.order.get_mut(&namespace).and_then(|k| k.remove(i));
                key.and_then(|key| {
                    let write = self.statuses.remove(&key)?;
                    self.writing.insert(
                        key.clone(),
                        Written {
                            status: write.status.clone(),
                            resource_version: None,
                            seen: Vec::new(),
                            gone: false,
                        },
                    );
                    Some(Work::Status(key, write))
                })
            }
            None => {
                let event = self
                    .events
                    .get_mut(&namespace)
                    .and_then(VecDeque::pop_front);
                event.map(|event| {
                    self.event_count -= 1;
                    Work::Event(event)
                })
            }
        };
        if self.order.get(&namespace).is_some_and(VecDeque::is_empty) {
            self.order.remove(&namespace);
        }
        if self.events.get(&namespace).is_some_and(VecDeque::is_empty) {
            self.events.remove(&namespace);
        }
        self.turn = namespace;
        // Always something: what was chosen is there.
        work.ok_or(Some(now))
    }

    fn is_empty(&self) -> bool {
        self.statuses.is_empty() && self.event_count == 0
    }

    /// The write of `key`'s status ended: written at `resource_version`, or not written
    /// (failed, to be retried from the queue; or the resource is gone).
    fn wrote(&mut self, key: &Key, resource_version: Option<String>) {
        let Some(w) = self.writing.get_mut(key) else {
            return;
        };
        match resource_version {
            Some(rv) if !w.gone && !w.seen.contains(&rv) => {
                w.resource_version = Some(rv);
                w.seen = Vec::new();
            }
            _ => {
                self.writing.remove(key);
            }
        }
    }

    /// The status `key` has or is about to have, if newer than the watch's copy of it, which
    /// is at `resource_version`.
    fn newest_status(&mut self, key: &Key, resource_version: Option<&str>) -> Option<Value> {
        if let Some(w) = self.statuses.get(key) {
            return parsed(&w.status);
        }
        let w = self.writing.get(key).filter(|w| !w.gone)?;
        if w.resource_version.is_some() && w.resource_version.as_deref() == resource_version {
            // The watch's copy has it.
            self.writing.remove(key);
            return None;
        }
        parsed(&w.status)
    }

    /// The watch showed `key` deleted.
    fn saw_deleted(&mut self, key: &Key) {
        match self.writing.get_mut(key) {
            Some(w) if w.resource_version.is_none() => w.gone = true,
            Some(_) => {
                self.writing.remove(key);
            }
            None => {}
        }
    }

    /// See [`Reports::relisted`].
    fn relisted(
        &mut self,
        controller: &str,
        scope: Option<&str>,
        version_in_store: impl Fn(&Key) -> Option<String>,
    ) {
        self.writing.retain(|k, w| {
            if k.controller != controller || scope.is_some_and(|ns| ns != k.namespace) {
                return true;
            }
            let in_store = version_in_store(k);
            let Some(written) = &w.resource_version else {
                // In flight: what the list showed counts as seen meanwhile (the write's own
                // version, or not), and a resource the list did not find is gone.
                match in_store {
                    Some(rv) => w.seen.push(rv),
                    None => w.gone = true,
                }
                return true;
            };
            in_store.is_some_and(|rv| rv != *written)
        });
    }

    /// The watch showed `key` at `resource_version`.
    fn saw(&mut self, key: &Key, resource_version: &str) {
        let Some(w) = self.writing.get_mut(key) else {
            return;
        };
        match &w.resource_version {
            None => w.seen.push(resource_version.to_owned()),
            Some(rv) if rv == resource_version => {
                self.writing.remove(key);
            }
            Some(_) => {}
        }
    }
}

#[allow(
    clippy::large_enum_variant,
    reason = "one at a time, popped and written at once: its size costs nothing"
)]
enum Work {
    Status(Arc<Key>, StatusWrite),
    Event(QueuedEvent),
}

/// An event to write: what happened, to what, when; `controller` labels its metric.
///
/// Kept as the few strings an event of ours has (its action is always `Reconcile`, it has no
/// related object): in a burst thousands wait here, and an `Event` with its `ObjectReference`
/// takes more than twice the memory.
#[derive(Debug)]
pub(crate) struct QueuedEvent {
    warning: bool,
    reason: Box<str>,
    note: Box<str>,
    /// `regarding`: its Kind, then its namespace, name, uid and resource version.
    ar: Arc<ApiResource>,
    regarding: [Option<Box<str>>; 4],
    controller: Box<str>,
    at: Timestamp,
    asked: Instant,
}

impl QueuedEvent {
    /// An event (action `Reconcile`) about `regarding`, of the Kind `ar`, happening now;
    /// `controller` labels its metric.
    pub(crate) fn new(
        type_: EventType,
        reason: &str,
        note: Box<str>,
        ar: &Arc<ApiResource>,
        regarding: &ObjectMeta,
        controller: &str,
    ) -> Self {
        let text = |v: &Option<String>| v.as_deref().map(Box::from);
        Self {
            warning: matches!(type_, EventType::Warning),
            reason: reason.into(),
            note,
            ar: ar.clone(),
            regarding: [
                text(&regarding.namespace),
                text(&regarding.name),
                text(&regarding.uid),
                text(&regarding.resource_version),
            ],
            controller: controller.into(),
            at: Timestamp::now(),
            asked: Instant::now(),
        }
    }

    /// The namespace of the object it regards (`""` for a cluster-scoped one).
    fn namespace(&self) -> &str {
        self.regarding[0].as_deref().unwrap_or_default()
    }

    /// The event and what it regards, as the recorder takes them.
    fn parts(&self) -> (Event, ObjectReference) {
        let event = Event {
            type_: if self.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: self.reason.to_string(),
            note: Some(self.note.to_string()),
            action: ACTION.to_owned(),
            secondary: None,
        };
        let [namespace, name, uid, resource_version] =
            self.regarding.clone().map(|v| v.map(String::from));
        let regarding = ObjectReference {
            api_version: Some(self.ar.api_version.clone()),
            kind: Some(self.ar.kind.clone()),
            namespace,
            name,
            uid,
            resource_version,
            field_path: None,
        };
        (event, regarding)
    }
}

/// Every event's action.
const ACTION: &str = "Reconcile";

/// The body of a status write.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct StatusPatch<'a> {
    api_version: &'a str,
    kind: &'a str,
    status: &'a RawValue,
}

/// The queue of reports and the workers that write them.
pub(crate) struct Reports {
    client: kube::Client,
    recorder: Recorder,
    queue: Mutex<Queue>,
    work: Notify,
    in_flight: AtomicUsize,
    idle: Notify,
    /// The applies reports give way to.
    applies: Arc<Applies>,
    /// Whether this replica may write.
    fence: Arc<super::lease::Fence>,
    /// `wasm_operator_reports_pending`: statuses and events queued or being written.
    pending: Gauge,
}

impl Reports {
    pub(crate) fn new(
        client: kube::Client,
        recorder: Recorder,
        applies: Arc<Applies>,
        fence: Arc<super::lease::Fence>,
        pending: Gauge,
    ) -> Self {
        Self {
            client,
            recorder,
            queue: Mutex::new(Queue::default()),
            work: Notify::new(),
            in_flight: AtomicUsize::new(0),
            idle: Notify::new(),
            applies,
            fence,
            pending,
        }
    }

    /// Sets [`Self::pending`] from `queue` (locked by the caller) and the writes in flight.
    fn count(&self, queue: &Queue) {
        let queued = queue.statuses.len() + queue.event_count;
        let total = queued + self.in_flight.load(Ordering::SeqCst);
        self.pending.set(i64::try_from(total).unwrap_or(i64::MAX));
    }

    /// The status most recently asked for that the watch's copy of the resource, at
    /// `resource_version`, does not show yet (queued, being written, or written and its echo
    /// still to come), if any.
    pub(crate) fn newest_status(&self, key: &Key, resource_version: Option<&str>) -> Option<Value> {
        lock(&self.queue).newest_status(key, resource_version)
    }

    /// The watch of `controller`'s resources showed `o` (`deleted`, or as it is now), its
    /// store updated. On every event of the served watches: nothing is built unless a status
    /// is being written or awaits its echo.
    pub(crate) fn saw(&self, controller: &str, o: &kube::api::DynamicObject, deleted: bool) {
        let mut queue = lock(&self.queue);
        if queue.writing.is_empty() {
            return;
        }
        let key = key(controller, o);
        match o.metadata.resource_version.as_deref() {
            Some(rv) if !deleted => queue.saw(&key, rv),
            _ => queue.saw_deleted(&key),
        }
    }

    /// The watch of `controller`'s resources in `scope` (a namespace, or all) listed again,
    /// and its store holds what the list found, which may have skipped a write's echo or a
    /// deletion: `version_in_store` of each written status's resource says whether the store
    /// has it (at that resourceVersion, or the resource is gone). One the store does not show at
    /// that version may be older (the echo is still to come) or newer (the echo was skipped),
    /// and is kept until the next write, the resource's deletion, or a reconciliation that finds
    /// the store at it. A write in flight takes the list's version as seen meanwhile, or the
    /// resource as gone.
    pub(crate) fn relisted(
        &self,
        controller: &str,
        scope: Option<&str>,
        version_in_store: impl Fn(&Key) -> Option<String>,
    ) {
        lock(&self.queue).relisted(controller, scope, version_in_store);
    }

    /// Asks for `status` to be written for the resource `key` (of `ar`), replacing any status
    /// for it not yet written, no sooner than `hold` from now (and no later than the status it
    /// replaces was due).
    pub(crate) fn status(&self, key: Key, ar: &Arc<ApiResource>, status: Value, hold: Duration) {
        let status = match serde_json::value::to_raw_value(&status) {
            Ok(status) => status,
            Err(e) => {
                tracing::error!(resource = %key, "status not written: {e}");
                return;
            }
        };
        let write = StatusWrite {
            ar: ar.clone(),
            status,
            asked: Instant::now(),
            not_before: Instant::now() + hold,
            failures: 0,
        };
        let mut queue = lock(&self.queue);
        queue.push_status(Arc::new(key), write);
        self.count(&queue);
        drop(queue);
        self.work.notify_one();
    }

    /// Asks for `event` to be written.
    pub(crate) fn event(&self, event: QueuedEvent) {
        let mut queue = lock(&self.queue);
        queue.push_event(event);
        self.count(&queue);
        drop(queue);
        self.work.notify_one();
    }

    /// The next write that is due, else when the next held status falls due.
    fn next(&self) -> Result<Work, Option<Instant>> {
        let busy = self.applies.busy_namespaces();
        let mut queue = lock(&self.queue);
        let work = queue.pop(Instant::now(), &busy)?;
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        self.count(&queue);
        Ok(work)
    }

    fn is_empty(&self) -> bool {
        lock(&self.queue).is_empty() && self.in_flight.load(Ordering::SeqCst) == 0
    }

    /// Writes reports until the process ends; run [`WORKERS`] of these.
    pub(crate) async fn work(&self, metrics: &Metrics) {
        loop {
            // Listening before looking, so that applies that end in between wake this worker.
            let quiet = self.applies.quiet.notified();
            let work = self.work.notified();
            tokio::pin!(quiet, work);
            quiet.as_mut().enable();
            work.as_mut().enable();
            match self.next() {
                Ok(Work::Status(key, write)) => {
                    let written = self.write_status(&key, &write, metrics).await;
                    let failures = write.failures + 1;
                    {
                        // Under one lock: the next write of this resource waits for this one's
                        // end, its retry included.
                        let mut queue = lock(&self.queue);
                        match &written {
                            Ok(rv) => queue.wrote(&key, rv.clone()),
                            Err(_) => queue.retry_status(key.clone(), write, Instant::now()),
                        }
                    }
                    if let Err(e) = written {
                        metrics
                            .report_errors
                            .get_or_create(&WriteLabels {
                                verb: "apply_status".into(),
                                resource: key.controller.clone(),
                            })
                            .inc();
                        tracing::warn!(resource = %key,
                            "status not written, retrying in {:?}: {e}", retry_after(failures));
                        // Counted again below, once the write is no longer in flight.
                    }
                }
                Ok(Work::Event(..)) if !self.fence.allows() => {
                    tracing::debug!("event not written: this replica may not write");
                }
                Ok(Work::Event(queued)) => {
                    metrics.write("event", "events.events.k8s.io");
                    let (event, regarding) = queued.parts();
                    let published = self
                        .fence
                        .bounded(self.recorder.publish(&event, &regarding, queued.at))
                        .await;
                    if let Err(e) = published {
                        metrics
                            .report_errors
                            .get_or_create(&WriteLabels {
                                verb: "event".into(),
                                resource: queued.controller.to_string(),
                            })
                            .inc();
                        tracing::warn!(controller = %queued.controller, reason = %event.reason, "event not recorded: {e}");
                    }
                }
                Err(next_due) => {
                    if next_due.is_none() && self.in_flight.load(Ordering::SeqCst) == 0 {
                        self.idle.notify_waiters();
                    }
                    match next_due {
                        Some(at) => tokio::select! {
                            () = tokio::time::sleep_until(at) => {}
                            () = &mut work => {}
                            () = &mut quiet => {}
                        },
                        None => work.await,
                    }
                    continue;
                }
            }
            let queue = lock(&self.queue);
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            self.count(&queue);
        }
    }

    async fn write_status(
        &self,
        key: &Key,
        write: &StatusWrite,
        metrics: &Metrics,
    ) -> Result<Option<String>, kube::Error> {
        if !self.fence.allows() {
            return Err(super::not_leading());
        }
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &key.namespace, &*write.ar);
        metrics.write("apply_status", &key.controller);
        let patch = StatusPatch {
            api_version: &write.ar.api_version,
            kind: &write.ar.kind,
            status: &write.status,
        };
        match self
            .fence
            .bounded(api.patch_status(
                &key.name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            ))
            .await
        {
            // The resource is gone: nothing to report on.
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
            other => other.map(|o| o.metadata.resource_version),
        }
    }

    /// Writes every held status now, then waits until every report asked for so far is
    /// written, or `limit` passes.
    pub(crate) async fn flush(&self, limit: Duration) {
        {
            let now = Instant::now();
            let mut queue = lock(&self.queue);
            queue.flushing = true;
            for w in queue.statuses.values_mut() {
                w.not_before = now;
            }
        }
        self.work.notify_waiters();
        let done = async {
            loop {
                let idle = self.idle.notified();
                if self.is_empty() {
                    return;
                }
                // Wake now and then in case the last worker went idle before we listened.
                let _ = tokio::time::timeout(Duration::from_millis(50), idle).await;
            }
        };
        if tokio::time::timeout(limit, done).await.is_err() {
            tracing::warn!("shutting down with status writes or events not yet written");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn none() -> HashSet<String> {
        HashSet::new()
    }

    fn key(name: &str) -> Arc<Key> {
        key_in("ns", name)
    }

    fn key_in(namespace: &str, name: &str) -> Arc<Key> {
        Arc::new(Key {
            controller: "services.hanzo.ai".into(),
            namespace: namespace.into(),
            name: name.into(),
        })
    }

    fn service() -> Arc<ApiResource> {
        Arc::new(ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
            "hanzo.ai", "v1", "Service",
        )))
    }

    fn write(status: &str, not_before: Instant) -> StatusWrite {
        StatusWrite {
            asked: Instant::now(),
            ar: Arc::new(ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
                "hanzo.ai", "v1", "Service",
            ))),
            status: serde_json::value::to_raw_value(&json!({ "message": status })).unwrap(),
            not_before,
            failures: 0,
        }
    }

    fn event(reason: &str) -> QueuedEvent {
        QueuedEvent::new(
            EventType::Normal,
            reason,
            "note".into(),
            &service(),
            &ObjectMeta {
                namespace: Some("ns".into()),
                ..ObjectMeta::default()
            },
            "c",
        )
    }

    fn popped_status(q: &mut Queue, now: Instant, busy: &HashSet<String>) -> (String, Value) {
        match q.pop(now, busy) {
            Ok(Work::Status(k, w)) => {
                let status: Value = serde_json::from_str(w.status.get()).unwrap();
                (k.name.clone(), status["message"].clone())
            }
            Ok(Work::Event(..)) => panic!("an event, not a status"),
            Err(e) => panic!("nothing due: {e:?}"),
        }
    }

    #[test]
    fn a_resource_has_one_status_write_in_flight_at_a_time() {
        let mut q = Queue::default();
        let now = Instant::now();
        q.push_status(key("a"), write("first", now));
        assert_eq!(popped_status(&mut q, now, &none()).1, "first");
        // Asked again while the first is written: it waits for that write to end.
        q.push_status(key("a"), write("second", now));
        q.push_status(key("b"), write("other", now));
        assert_eq!(popped_status(&mut q, now, &none()).0, "b");
        assert!(matches!(q.pop(now, &none()), Err(None)));
        q.wrote(&key("a"), Some("5".into()));
        assert_eq!(popped_status(&mut q, now, &none()).1, "second");
    }

    #[test]
    fn a_written_status_is_the_current_one_until_the_watch_shows_it() {
        let mut q = Queue::default();
        let now = Instant::now();
        let message = |v: Option<Value>| v.map(|v| v["message"].clone());
        q.push_status(key("a"), write("ready", now));
        assert_eq!(
            message(q.newest_status(&key("a"), Some("4"))),
            Some(json!("ready"))
        );
        popped_status(&mut q, now, &none());
        // In flight, then written at 5: the watch's copy at 4 is older.
        assert_eq!(
            message(q.newest_status(&key("a"), Some("4"))),
            Some(json!("ready"))
        );
        q.wrote(&key("a"), Some("5".into()));
        assert_eq!(
            message(q.newest_status(&key("a"), Some("4"))),
            Some(json!("ready"))
        );
        q.saw(&key("a"), "4");
        assert_eq!(
            message(q.newest_status(&key("a"), Some("4"))),
            Some(json!("ready"))
        );
        // The watch shows it: its copy is current again.
        q.saw(&key("a"), "5");
        assert_eq!(q.newest_status(&key("a"), Some("4")), None);
        assert!(q.writing.is_empty());

        // The watch shows the write before its answer comes back.
        q.push_status(key("a"), write("echoed", now));
        popped_status(&mut q, now, &none());
        q.saw(&key("a"), "6");
        q.wrote(&key("a"), Some("6".into()));
        assert!(q.writing.is_empty());

        // A reconciliation of the object at the written version finds it current.
        q.push_status(key("a"), write("read back", now));
        popped_status(&mut q, now, &none());
        q.wrote(&key("a"), Some("7".into()));
        assert_eq!(q.newest_status(&key("a"), Some("7")), None);
        assert!(q.writing.is_empty());

        // A failed write is queued again, and still the newest status.
        q.push_status(key("a"), write("failed", now));
        let Ok(Work::Status(k, w)) = q.pop(now, &none()) else {
            panic!("the status is due");
        };
        q.retry_status(k, w, now);
        assert!(q.writing.is_empty());
        assert_eq!(
            message(q.newest_status(&key("a"), Some("7"))),
            Some(json!("failed"))
        );
        // A newer status asked for while a write fails is the one written after it, alone.
        assert_eq!(popped_status(&mut q, now + RETRY, &none()).1, "failed");
        q.push_status(key("a"), write("newer", now));
        assert!(matches!(q.pop(now + RETRY, &none()), Err(None)));
        let failed = write("failed", now);
        q.retry_status(key("a"), failed, now + RETRY);
        assert_eq!(popped_status(&mut q, now + 4 * RETRY, &none()).1, "newer");
        assert!(matches!(q.pop(now + 4 * RETRY, &none()), Err(None)));
    }

    #[test]
    fn a_resource_deleted_while_its_status_is_written_waits_for_that_write() {
        let mut q = Queue::default();
        let now = Instant::now();
        q.push_status(key("a"), write("old", now));
        popped_status(&mut q, now, &none());
        q.saw_deleted(&key("a"));
        // Made again under the same name: the watch's copy is its status, and its first
        // status waits for the old write's end.
        assert_eq!(q.newest_status(&key("a"), Some("9")), None);
        q.push_status(key("a"), write("new", now));
        assert!(matches!(q.pop(now, &none()), Err(None)));
        q.wrote(&key("a"), Some("8".into()));
        assert!(q.writing.is_empty());
        assert_eq!(popped_status(&mut q, now, &none()).1, "new");
    }

    #[test]
    fn a_relist_drops_the_writes_its_store_shows() {
        let written = |q: &mut Queue, name: &str, rv: &str| {
            q.push_status(key(name), write(name, Instant::now()));
            popped_status(q, Instant::now(), &none());
            q.wrote(&key(name), Some(rv.into()));
        };
        let mut q = Queue::default();
        written(&mut q, "shown", "5");
        written(&mut q, "gone", "6");
        written(&mut q, "unclear", "8");
        q.push_status(key("flying"), write("flying", Instant::now()));
        popped_status(&mut q, Instant::now(), &none());
        // A write of another namespace's (another watch's) resource is left to that watch.
        let elsewhere = key_in("other", "elsewhere");
        q.push_status(elsewhere.clone(), write("elsewhere", Instant::now()));
        popped_status(&mut q, Instant::now(), &none());
        q.wrote(&elsewhere, Some("9".into()));
        let store = |k: &Key| match k.name.as_str() {
            "shown" => Some("5".to_owned()),
            "unclear" | "flying" => Some("3".to_owned()),
            _ => None,
        };
        q.push_status(key("vanished"), write("vanished", Instant::now()));
        popped_status(&mut q, Instant::now(), &none());
        q.relisted("services.hanzo.ai", Some("ns"), store);
        let left: Vec<&str> = q.writing.keys().map(|k| k.name.as_str()).collect();
        // Shown at its version, or gone: dropped. At another version (older or newer, the
        // store cannot say), in flight, or of another namespace: kept.
        assert_eq!(left, ["flying", "unclear", "vanished", "elsewhere"]);
        // In flight: the list's version counts as seen (the write's answer at it ends the
        // entry), a resource the list did not find as gone.
        q.wrote(&key("flying"), Some("3".into()));
        assert!(q.newest_status(&key("vanished"), None).is_none());
        q.wrote(&key("vanished"), Some("4".into()));
        let left: Vec<&str> = q.writing.keys().map(|k| k.name.as_str()).collect();
        assert_eq!(left, ["unclear", "elsewhere"]);
        // Another controller's watch, of every namespace: this one's are left alone.
        q.relisted("other.example.com", None, |_| None);
        assert_eq!(q.writing.len(), 2);
        q.relisted("services.hanzo.ai", None, |_| None);
        assert!(q.writing.is_empty());
    }

    #[test]
    fn only_the_newest_status_of_a_resource_is_written() {
        let now = Instant::now();
        let mut q = Queue::default();
        q.push_status(key("a"), write("reconciling", now));
        q.push_status(key("b"), write("ready", now));
        q.push_status(key("a"), write("ready", now));
        // One write per resource, in the order they first asked, each with its newest status.
        assert_eq!(
            popped_status(&mut q, now, &none()),
            ("a".into(), json!("ready"))
        );
        assert_eq!(
            popped_status(&mut q, now, &none()),
            ("b".into(), json!("ready"))
        );
        assert!(matches!(q.pop(now, &none()), Err(None)));
        assert!(q.is_empty());
    }

    #[test]
    fn a_held_status_waits_and_its_successor_is_not_held_longer() {
        let now = Instant::now();
        let later = now + SETTLING;
        let mut q = Queue::default();
        q.push_status(key("a"), write("settling", later));
        q.push_event(event("Applied"));
        // Not due yet: the event goes first, then the queue says when the status falls due.
        assert!(matches!(q.pop(now, &none()), Ok(Work::Event(e)) if &*e.reason == "Applied"));
        assert_eq!(q.pop(now, &none()).err(), Some(Some(later)));
        // A newer status that could wait longer is due when the one it replaces was.
        q.push_status(key("a"), write("still settling", later + SETTLING));
        assert_eq!(q.pop(now, &none()).err(), Some(Some(later)));
        // A status that need not wait replaces it and is due at once.
        q.push_status(key("a"), write("ready", now));
        assert_eq!(
            popped_status(&mut q, now, &none()),
            ("a".into(), json!("ready"))
        );
    }

    #[test]
    fn a_failed_write_is_retried_with_backoff_and_a_newer_status_keeps_it() {
        let now = Instant::now();
        let mut q = Queue::default();
        q.retry_status(key("a"), write("first", now + SETTLING), now);
        // Not at once: a second after the first failure.
        assert_eq!(q.pop(now, &none()).err(), Some(Some(now + RETRY)));
        let (k, w) = match q.pop(now + RETRY, &none()) {
            Ok(Work::Status(k, w)) => (k, w),
            _ => panic!("the retry is due after {RETRY:?}"),
        };
        assert_eq!(w.failures, 1);
        // It fails again: two seconds.
        q.retry_status(k, w, now);
        assert_eq!(q.pop(now, &none()).err(), Some(Some(now + 2 * RETRY)));
        // A newer status replacing a failing one is written when the backoff ends, not at once.
        q.push_status(key("a"), write("newer", now));
        assert_eq!(q.pop(now, &none()).err(), Some(Some(now + 2 * RETRY)));
        assert_eq!(
            popped_status(&mut q, now + 2 * RETRY, &none()),
            ("a".into(), json!("newer"))
        );
        assert!(q.is_empty());
        // A write that failed while a newer status waited hands its backoff to that one.
        q.push_status(key("b"), write("newer", now));
        q.retry_status(key("b"), write("older", now), now);
        assert_eq!(
            popped_status(&mut q, now + RETRY, &none()),
            ("b".into(), json!("newer"))
        );
    }

    #[test]
    fn reports_wait_for_their_namespaces_applies_for_a_while() {
        let now = Instant::now();
        let asked_now = |mut w: StatusWrite| {
            w.asked = now;
            w
        };
        let event_now = || {
            let mut e = event("Applied");
            e.asked = now;
            e
        };
        let busy: HashSet<String> = ["ns".to_owned()].into();
        let mut q = Queue::default();
        q.push_status(key("a"), asked_now(write("ready", now)));
        q.push_event(event_now());
        // Their namespace has applies in flight: nothing is due until MAX_DEFER has passed.
        assert_eq!(q.pop(now, &busy).err(), Some(Some(now + MAX_DEFER)));
        // Another namespace's reports do not wait.
        let other = key_in("other", "b");
        q.push_status(other, asked_now(write("ready", now)));
        assert_eq!(
            popped_status(&mut q, now, &busy),
            ("b".into(), json!("ready"))
        );
        // The applies end: written.
        assert_eq!(
            popped_status(&mut q, now, &none()),
            ("a".into(), json!("ready"))
        );
        q.wrote(&key("a"), Some("1".into()));
        assert!(matches!(q.pop(now, &none()), Ok(Work::Event(_))));
        assert!(matches!(q.pop(now, &none()), Err(None)));
        // Or they do not, and the reports stop waiting MAX_DEFER after they were asked;
        // a newer status replacing one does not push that back.
        q.push_status(key("a"), asked_now(write("settling", now)));
        let mut newer = write("ready", now);
        newer.asked = now + MAX_DEFER / 2;
        q.push_status(key("a"), newer);
        q.push_event(event_now());
        let just_before = now + MAX_DEFER - Duration::from_millis(1);
        assert_eq!(q.pop(just_before, &busy).err(), Some(Some(now + MAX_DEFER)));
        let deadline = now + MAX_DEFER;
        assert_eq!(
            popped_status(&mut q, deadline, &busy),
            ("a".into(), json!("ready"))
        );
        assert!(matches!(q.pop(deadline, &busy), Ok(Work::Event(_))));
        // Too many events waiting: they no longer wait.
        for _ in 0..=MAX_QUEUED_EVENTS {
            q.push_event(event_now());
        }
        assert!(matches!(q.pop(now, &busy), Ok(Work::Event(_))));
        assert_eq!(q.pop(now, &busy).err(), Some(Some(now + MAX_DEFER)));
        // Shutting down: nothing waits.
        q.flushing = true;
        assert!(matches!(q.pop(now, &busy), Ok(Work::Event(_))));
    }

    #[test]
    fn a_retried_status_keeps_its_place_and_a_busy_namespace_holds_back_no_other() {
        let now = Instant::now();
        let busy: HashSet<String> = ["ns".to_owned()].into();
        let mut q = Queue::default();
        // Asked long ago, written, failed; a newer one asked since waits for the applies.
        let mut old = write("old", now);
        old.asked = now - MAX_DEFER;
        let mut newer = write("newer", now);
        newer.asked = now;
        q.push_status(key("b"), newer);
        q.retry_status(key("a"), old, now - RETRY);
        // The retry is due after its backoff, not held behind the newer one for MAX_DEFER.
        assert_eq!(
            popped_status(&mut q, now, &busy),
            ("a".into(), json!("old"))
        );
        // Another namespace's event goes while this namespace's statuses wait, and before
        // them once they may go.
        let mut elsewhere = event("Applied");
        elsewhere.regarding[0] = Some("other".into());
        q.push_event(elsewhere);
        assert!(matches!(q.pop(now, &busy), Ok(Work::Event(e)) if e.namespace() == "other"));
        q.push_status(key("c"), write("c", now));
        let mut elsewhere = event("Applied");
        elsewhere.regarding[0] = Some("other".into());
        q.push_event(elsewhere);
        let served: Vec<String> = (0..3)
            .map(|_| match q.pop(now, &none()) {
                Ok(Work::Status(k, _)) => k.name.clone(),
                Ok(Work::Event(e)) => e.namespace().to_owned(),
                Err(e) => panic!("nothing due: {e:?}"),
            })
            .collect();
        assert_eq!(served, ["b", "other", "c"]);
    }

    #[test]
    fn namespaces_take_turns() {
        let now = Instant::now();
        let mut q = Queue::default();
        let in_ns = key_in;
        // A tenant with many statuses to write, then another with one.
        for name in ["a1", "a2", "a3"] {
            q.push_status(in_ns("a", name), write("ready", now));
        }
        q.push_status(in_ns("b", "b1"), write("ready", now));
        let order: Vec<String> = (0..4)
            .map(|_| popped_status(&mut q, now, &none()).0)
            .collect();
        assert_eq!(order, ["a1", "b1", "a2", "a3"]);
    }

    #[test]
    fn a_queued_event_is_written_as_it_was_asked() {
        let regarding = ObjectMeta {
            namespace: Some("ns".into()),
            name: Some("a".into()),
            uid: Some("u".into()),
            resource_version: Some("7".into()),
            ..ObjectMeta::default()
        };
        let before = Timestamp::now();
        let queued = QueuedEvent::new(
            EventType::Warning,
            "Failed",
            "it failed".into(),
            &service(),
            &regarding,
            "c",
        );
        let (event, back) = queued.parts();
        let expected = ObjectReference {
            api_version: Some("hanzo.ai/v1".into()),
            kind: Some("Service".into()),
            namespace: Some("ns".into()),
            name: Some("a".into()),
            uid: Some("u".into()),
            resource_version: Some("7".into()),
            field_path: None,
        };
        assert_eq!(back, expected);
        assert!(matches!(event.type_, EventType::Warning));
        assert_eq!(
            (
                event.reason.as_str(),
                event.note.as_deref(),
                event.action.as_str()
            ),
            ("Failed", Some("it failed"), "Reconcile")
        );
        assert!(event.secondary.is_none());
        // When it was asked for, not when it will be written.
        assert!(before <= queued.at && queued.at <= Timestamp::now());
    }

    #[test]
    fn the_backoff_doubles_to_five_minutes() {
        let waits: Vec<u64> = (1..=12).map(|n| retry_after(n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]);
        assert_eq!(retry_after(u32::MAX), MAX_RETRY);
    }
}
