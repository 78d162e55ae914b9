//! Changed resources first when a watch lists: a pipeline that starts (the operator's start, a
//! leader's or a shard's takeover) or a watch that lists again finds every resource at once, and
//! kube's queue takes them in no particular order. A resource changed while nobody served it
//! would wait behind thousands that need nothing (a shard's takeover at 10,000 Services: 15 s of
//! no-op reconciliations between the caches' sync and the one change, measured in session 27).
//!
//! So, while a watch lists, a resource whose spec has not changed since its last reconciliation
//! (its status observed its current generation, Ready or not) is held back; the others (new, or
//! changed since) are queued as they come. One not Ready is waiting for its children (a rollout)
//! or failed at that generation: reconciling it first would change nothing, and a takeover soon
//! after a large rollout finds most resources so (measured in session 28: 4,807 of a shard's
//! 5,000, which had buried the one changed resource among them). Once the list is done and every one of those has started, or after
//! [`HOLD_AT_MOST`] whichever comes first, the held ones are queued too: each is still
//! reconciled, as after any list, only later.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::channel::mpsc;
use kube::discovery::ApiResource;
use kube::runtime::reflector::ObjectRef;

use super::{Served, lock};

/// The longest a settled resource is held back after its watch has listed: however many changed
/// resources wait, the others are queued then (a changed one that never starts, deleted before
/// its turn, holds nothing back longer).
pub(crate) const HOLD_AT_MOST: Duration = Duration::from_secs(10);

/// Whether the last reconciliation of `o` acted on its spec as it is: its status observed its
/// current generation. Anything else (no status, a spec changed since) is to be reconciled first.
pub(crate) fn settled(o: &Served) -> bool {
    /// What of a status says so; the rest (its conditions, its children, the plugin's fields)
    /// is skipped, not built.
    #[derive(serde::Deserialize)]
    struct Status {
        #[serde(rename = "observedGeneration")]
        observed_generation: Option<i64>,
    }
    let Some(status) = crate::ownership::stored_as::<Status>(o, "status") else {
        return false;
    };
    status.observed_generation.is_some() && status.observed_generation == o.metadata.generation
}

/// One watch's settled resources held back while it lists, and the changed ones not yet started.
pub(crate) struct Settling {
    state: Mutex<State>,
    /// Where the held resources are queued: the controller's `reconcile_on`.
    queue: mpsc::UnboundedSender<ObjectRef<Served>>,
    /// The watched Kind, which a reference to one of its resources names.
    ar: Arc<ApiResource>,
    /// [`HOLD_AT_MOST`], but in tests.
    hold: Duration,
    /// Whether the pipeline reconciles yet (every watch has listed): the longest hold counts
    /// from then, as nothing starts before.
    synced: tokio::sync::watch::Receiver<bool>,
}

#[derive(Default)]
struct State {
    /// The watch is listing: settled resources are held.
    listing: bool,
    held: Vec<ObjectRef<Served>>,
    /// Changed resources of this list not yet started (`namespace/name`).
    waiting: HashSet<String>,
}

impl Settling {
    /// What one watch of the Kind `ar` holds back, queued on `queue` once released; `synced`
    /// turns true when its pipeline starts reconciling.
    pub(crate) fn new(
        ar: Arc<ApiResource>,
        queue: mpsc::UnboundedSender<ObjectRef<Served>>,
        synced: tokio::sync::watch::Receiver<bool>,
    ) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State::default()),
            queue,
            ar,
            hold: HOLD_AT_MOST,
            synced,
        })
    }

    /// The watch starts a list.
    pub(crate) fn listing(&self) {
        let mut state = lock(&self.state);
        state.listing = true;
        state.waiting.clear();
    }

    /// The watch has listed: what it held goes to the queue once the changed resources have all
    /// started, or [`HOLD_AT_MOST`] after the pipeline starts reconciling.
    pub(crate) fn listed(self: &Arc<Self>) {
        lock(&self.state).listing = false;
        self.release_if_done();
        let this = self.clone();
        let mut synced = self.synced.clone();
        tokio::spawn(async move {
            // An error: the pipeline is gone, and its controller with it.
            if synced.wait_for(|s| *s).await.is_ok() {
                tokio::time::sleep(this.hold).await;
            }
            this.release();
        });
    }

    /// Whether `o`, which the watch just gave, is to be queued now; if not, it is held.
    pub(crate) fn admit(&self, o: &Served) -> bool {
        if !lock(&self.state).listing {
            return true;
        }
        // Read outside the lock, which reconciliations starting take too. Only this watch's
        // stream calls `admit`, and it alone ends the list, so the list cannot end meanwhile.
        let settled = settled(o);
        let mut state = lock(&self.state);
        if settled {
            state
                .held
                .push(ObjectRef::from_obj_with(o, self.ar.clone()));
            return false;
        }
        state.waiting.insert(super::reconcile::queue_key(o));
        true
    }

    /// A reconciliation of `key` starts (or it was deleted): it waits no more.
    pub(crate) fn started(&self, key: &str) {
        let removed = lock(&self.state).waiting.remove(key);
        if removed {
            self.release_if_done();
        }
    }

    fn release_if_done(&self) {
        let done = {
            let state = lock(&self.state);
            !state.listing && state.waiting.is_empty()
        };
        if done {
            self.release();
        }
    }

    /// Queues every resource held.
    fn release(&self) {
        let held = std::mem::take(&mut lock(&self.state).held);
        for r in held {
            // The controller has stopped: nothing to queue for.
            let _ = self.queue.unbounded_send(r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use serde_json::json;

    fn served(name: &str, generation: i64, status: serde_json::Value) -> Served {
        let mut o: Served = serde_json::from_value(json!({
            "apiVersion": "hanzo.ai/v1", "kind": "Service",
            "metadata": { "name": name, "namespace": "ns", "generation": generation },
            "status": status,
        }))
        .unwrap();
        crate::ownership::trim_resource(&mut o);
        o
    }

    fn ar() -> Arc<ApiResource> {
        Arc::new(ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("hanzo.ai", "v1", "Service"),
            "services",
        ))
    }

    /// A pipeline reconciling already.
    fn synced() -> tokio::sync::watch::Receiver<bool> {
        let (tx, rx) = tokio::sync::watch::channel(true);
        std::mem::forget(tx);
        rx
    }

    fn ready(observed: i64) -> serde_json::Value {
        json!({ "observedGeneration": observed,
            "conditions": [{ "type": "Ready", "status": "True" }] })
    }

    #[test]
    fn settled_is_observed_at_the_current_generation_ready_or_not() {
        assert!(settled(&served("a", 2, ready(2))));
        assert!(!settled(&served("a", 3, ready(2))), "a spec changed since");
        assert!(!settled(&served("a", 2, json!(null))), "never reconciled");
        // Waiting for its children, or failed at this generation: nothing changed to act on.
        let waiting = json!({ "observedGeneration": 2,
            "conditions": [{ "type": "Ready", "status": "False" }] });
        assert!(settled(&served("a", 2, waiting)));
        assert!(!settled(&served("a", 2, json!({ "conditions": [] }))));
    }

    #[tokio::test]
    async fn a_list_queues_changed_resources_first_and_the_settled_once_those_started() {
        let (tx, mut rx) = mpsc::unbounded();
        let s = Settling::new(ar(), tx, synced());
        s.listing();
        assert!(!s.admit(&served("calm", 1, ready(1))));
        assert!(s.admit(&served("changed", 2, ready(1))));
        assert!(s.admit(&served("new", 1, json!(null))));
        s.listed();
        s.started("ns/changed");
        assert!(rx.try_recv().is_err(), "held while a changed one waits");
        s.started("ns/new");
        let released = rx.next().await.unwrap();
        assert_eq!(released.name, "calm");
        // Outside a list, everything is queued as it comes.
        assert!(s.admit(&served("calm", 1, ready(1))));
        // A list with nothing changed queues what it held as soon as it is done.
        s.listing();
        assert!(!s.admit(&served("calm", 1, ready(1))));
        s.listed();
        assert_eq!(rx.next().await.unwrap().name, "calm");
    }

    #[tokio::test]
    async fn a_changed_resource_that_never_starts_holds_the_others_back_no_longer_than_the_limit() {
        let (tx, mut rx) = mpsc::unbounded();
        let hold = Duration::from_secs(2);
        let s = Arc::new(Settling {
            hold,
            ..Arc::into_inner(Settling::new(ar(), tx, synced())).unwrap()
        });
        s.listing();
        assert!(!s.admit(&served("calm", 1, ready(1))));
        assert!(s.admit(&served("gone", 2, ready(1))));
        let since = std::time::Instant::now();
        s.listed();
        assert!(rx.try_recv().is_err(), "held while a changed one waits");
        assert_eq!(rx.next().await.unwrap().name, "calm");
        assert!(since.elapsed() >= hold);
    }
}
