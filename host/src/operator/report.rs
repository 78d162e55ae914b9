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
//! Applies come first: while children are being applied (a burst after a start or an upgrade),
//! reports wait, for at most [`MAX_DEFER`], so that they do not compete with the applies for
//! the API server. A write that fails for a reason other than the resource being gone is
//! retried after a second, unless a newer status has replaced it.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;
use kube::runtime::events::Event;
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
/// How long reports wait for applies in flight to finish before they are written anyway.
const MAX_DEFER: Duration = Duration::from_secs(10);

/// Which resource a status belongs to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Key {
    pub controller: String,
    pub namespace: String,
    pub name: String,
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
    not_before: Instant,
    /// Failed writes in a row of this resource's status.
    failures: u32,
}

/// Statuses to write (one per resource, the newest, in the order resources first asked) and
/// events to write (in order). Statuses go first.
#[derive(Default)]
struct Queue {
    statuses: BTreeMap<Key, StatusWrite>,
    order: VecDeque<Key>,
    events: VecDeque<(Event, ObjectReference, String)>,
}

impl Queue {
    /// Queues `write` for `key`, replacing an unwritten one, due no later than that one was; but
    /// a status whose writes are failing keeps its backoff.
    fn push_status(&mut self, key: Key, mut write: StatusWrite) {
        if let Some(earlier) = self.statuses.get(&key) {
            if earlier.failures > 0 {
                write.failures = earlier.failures;
                write.not_before = write.not_before.max(earlier.not_before);
            } else {
                write.not_before = write.not_before.min(earlier.not_before);
            }
        }
        if self.statuses.insert(key.clone(), write).is_none() {
            self.order.push_back(key);
        }
    }

    /// Queues `write` again after it failed, with backoff; a newer status that replaced it
    /// meanwhile is written instead, with the same backoff.
    fn retry_status(&mut self, key: Key, write: StatusWrite, now: Instant) {
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

    /// The first status due at `now`, else the oldest event; else when the next held status
    /// falls due (`None`: nothing is queued).
    fn pop(&mut self, now: Instant) -> Result<Work, Option<Instant>> {
        let mut due = None;
        let mut earliest: Option<Instant> = None;
        for (i, key) in self.order.iter().enumerate() {
            match self.statuses.get(key) {
                Some(w) if w.not_before <= now => {
                    due = Some(i);
                    break;
                }
                Some(w) => earliest = Some(earliest.map_or(w.not_before, |e| e.min(w.not_before))),
                None => {}
            }
        }
        if let Some(i) = due
            && let Some(key) = self.order.remove(i)
            && let Some(write) = self.statuses.remove(&key)
        {
            return Ok(Work::Status(key, write));
        }
        match self.events.pop_front() {
            Some((event, regarding, controller)) => Ok(Work::Event(event, regarding, controller)),
            None => Err(earliest),
        }
    }

    fn is_empty(&self) -> bool {
        self.statuses.is_empty() && self.events.is_empty()
    }
}

#[allow(
    clippy::large_enum_variant,
    reason = "one at a time, popped and written at once: its size costs nothing"
)]
enum Work {
    Status(Key, StatusWrite),
    Event(Event, ObjectReference, String),
}

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
        let queued = queue.statuses.len() + queue.events.len();
        let total = queued + self.in_flight.load(Ordering::SeqCst);
        self.pending.set(i64::try_from(total).unwrap_or(i64::MAX));
    }

    /// The status most recently asked for and not yet written, if any: newer than what the
    /// watch shows.
    pub(crate) fn pending_status(&self, key: &Key) -> Option<Value> {
        lock(&self.queue)
            .statuses
            .get(key)
            .and_then(|w| serde_json::from_str(w.status.get()).ok())
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
            not_before: Instant::now() + hold,
            failures: 0,
        };
        let mut queue = lock(&self.queue);
        queue.push_status(key, write);
        self.count(&queue);
        drop(queue);
        self.work.notify_one();
    }

    /// Asks for an event about `regarding`; `controller` labels its metric.
    pub(crate) fn event(&self, event: Event, regarding: ObjectReference, controller: &str) {
        let mut queue = lock(&self.queue);
        queue
            .events
            .push_back((event, regarding, controller.to_owned()));
        self.count(&queue);
        drop(queue);
        self.work.notify_one();
    }

    /// The next write that is due, else when the next held status falls due.
    fn next(&self) -> Result<Work, Option<Instant>> {
        let mut queue = lock(&self.queue);
        let work = queue.pop(Instant::now())?;
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        self.count(&queue);
        Ok(work)
    }

    fn is_empty(&self) -> bool {
        lock(&self.queue).is_empty() && self.in_flight.load(Ordering::SeqCst) == 0
    }

    /// Writes reports until the process ends; run [`WORKERS`] of these.
    pub(crate) async fn work(&self, metrics: &Metrics) {
        let mut deferring_since: Option<Instant> = None;
        loop {
            if self.applies.is_empty() {
                deferring_since = None;
            } else if deferring_since.get_or_insert_with(Instant::now).elapsed() < MAX_DEFER {
                let done = self.applies.done.notified();
                if !self.applies.is_empty() {
                    let _ = tokio::time::timeout(Duration::from_millis(100), done).await;
                }
                continue;
            }
            match self.next() {
                Ok(Work::Status(key, write)) => {
                    if let Err(e) = self.write_status(&key, &write, metrics).await {
                        metrics
                            .report_errors
                            .get_or_create(&WriteLabels {
                                verb: "apply_status".into(),
                                resource: key.controller.clone(),
                            })
                            .inc();
                        tracing::warn!(resource = %key,
                            "status not written, retrying in {:?}: {e}", retry_after(write.failures + 1));
                        lock(&self.queue).retry_status(key, write, Instant::now());
                        // Counted again below, once the write is no longer in flight.
                    }
                }
                Ok(Work::Event(..)) if !self.fence.allows() => {
                    tracing::debug!("event not written: this replica may not write");
                }
                Ok(Work::Event(event, regarding, controller)) => {
                    metrics.write("event", "events.events.k8s.io");
                    let published = self
                        .fence
                        .bounded(self.recorder.publish(&event, &regarding))
                        .await;
                    if let Err(e) = published {
                        metrics
                            .report_errors
                            .get_or_create(&WriteLabels {
                                verb: "event".into(),
                                resource: controller.clone(),
                            })
                            .inc();
                        tracing::warn!(%controller, reason = %event.reason, "event not recorded: {e}");
                    }
                }
                Err(next_due) => {
                    if next_due.is_none() && self.in_flight.load(Ordering::SeqCst) == 0 {
                        self.idle.notify_waiters();
                    }
                    match next_due {
                        Some(at) => {
                            let _ = tokio::time::timeout_at(at, self.work.notified()).await;
                        }
                        None => self.work.notified().await,
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
    ) -> Result<(), kube::Error> {
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
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            other => other.map(drop),
        }
    }

    /// Writes every held status now, then waits until every report asked for so far is
    /// written, or `limit` passes.
    pub(crate) async fn flush(&self, limit: Duration) {
        let now = Instant::now();
        for w in lock(&self.queue).statuses.values_mut() {
            w.not_before = now;
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

    fn key(name: &str) -> Key {
        Key {
            controller: "services.hanzo.ai".into(),
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    fn write(status: &str, not_before: Instant) -> StatusWrite {
        StatusWrite {
            ar: Arc::new(ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
                "hanzo.ai", "v1", "Service",
            ))),
            status: serde_json::value::to_raw_value(&json!({ "message": status })).unwrap(),
            not_before,
            failures: 0,
        }
    }

    fn event(reason: &str) -> (Event, ObjectReference, String) {
        let event = Event {
            type_: kube::runtime::events::EventType::Normal,
            reason: reason.into(),
            note: None,
            action: "Reconcile".into(),
            secondary: None,
        };
        (event, ObjectReference::default(), "c".into())
    }

    fn popped_status(q: &mut Queue, now: Instant) -> (String, Value) {
        match q.pop(now) {
            Ok(Work::Status(k, w)) => {
                let status: Value = serde_json::from_str(w.status.get()).unwrap();
                (k.name, status["message"].clone())
            }
            Ok(Work::Event(..)) => panic!("an event, not a status"),
            Err(e) => panic!("nothing due: {e:?}"),
        }
    }

    #[test]
    fn only_the_newest_status_of_a_resource_is_written() {
        let now = Instant::now();
        let mut q = Queue::default();
        q.push_status(key("a"), write("reconciling", now));
        q.push_status(key("b"), write("ready", now));
        q.push_status(key("a"), write("ready", now));
        // One write per resource, in the order they first asked, each with its newest status.
        assert_eq!(popped_status(&mut q, now), ("a".into(), json!("ready")));
        assert_eq!(popped_status(&mut q, now), ("b".into(), json!("ready")));
        assert!(matches!(q.pop(now), Err(None)));
        assert!(q.is_empty());
    }

    #[test]
    fn a_held_status_waits_and_its_successor_is_not_held_longer() {
        let now = Instant::now();
        let later = now + SETTLING;
        let mut q = Queue::default();
        q.push_status(key("a"), write("settling", later));
        q.events.push_back(event("Applied"));
        // Not due yet: the event goes first, then the queue says when the status falls due.
        assert!(matches!(q.pop(now), Ok(Work::Event(e, ..)) if e.reason == "Applied"));
        assert_eq!(q.pop(now).err(), Some(Some(later)));
        // A newer status that could wait longer is due when the one it replaces was.
        q.push_status(key("a"), write("still settling", later + SETTLING));
        assert_eq!(q.pop(now).err(), Some(Some(later)));
        // A status that need not wait replaces it and is due at once.
        q.push_status(key("a"), write("ready", now));
        assert_eq!(popped_status(&mut q, now), ("a".into(), json!("ready")));
    }

    #[test]
    fn a_failed_write_is_retried_with_backoff_and_a_newer_status_keeps_it() {
        let now = Instant::now();
        let mut q = Queue::default();
        q.retry_status(key("a"), write("first", now + SETTLING), now);
        // Not at once: a second after the first failure.
        assert_eq!(q.pop(now).err(), Some(Some(now + RETRY)));
        let (k, w) = match q.pop(now + RETRY) {
            Ok(Work::Status(k, w)) => (k, w),
            _ => panic!("the retry is due after {RETRY:?}"),
        };
        assert_eq!(w.failures, 1);
        // It fails again: two seconds.
        q.retry_status(k, w, now);
        assert_eq!(q.pop(now).err(), Some(Some(now + 2 * RETRY)));
        // A newer status replacing a failing one is written when the backoff ends, not at once.
        q.push_status(key("a"), write("newer", now));
        assert_eq!(q.pop(now).err(), Some(Some(now + 2 * RETRY)));
        assert_eq!(
            popped_status(&mut q, now + 2 * RETRY),
            ("a".into(), json!("newer"))
        );
        assert!(q.is_empty());
        // A write that failed while a newer status waited hands its backoff to that one.
        q.push_status(key("b"), write("newer", now));
        q.retry_status(key("b"), write("older", now), now);
        assert_eq!(
            popped_status(&mut q, now + RETRY),
            ("b".into(), json!("newer"))
        );
    }

    #[test]
    fn the_backoff_doubles_to_five_minutes() {
        let waits: Vec<u64> = (1..=12).map(|n| retry_after(n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]);
        assert_eq!(retry_after(u32::MAX), MAX_RETRY);
    }
}
