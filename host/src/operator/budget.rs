//! The memory budget of the plugin calls in flight, shared fairly across namespaces.
//!
//! Every plugin call may grow its instance to the memory cap and hand the host as much as the
//! output cap, which the host then parses and applies. A call takes its share of the budget
//! ([`crate::plugin::Limits::call_memory`]) before it starts and gives it back when it ends, so
//! that the calls in flight together never need more than the budget (`--render-memory`), however
//! many resources wait. A call that needs more than the whole budget is refused at once.
//!
//! Waiting calls are served one namespace at a time, in turn (the oldest call of each), so that
//! a namespace that floods the operator with resources waits behind its own calls, not in front
//! of everyone else's: a resource of a quiet namespace is served after at most one call of each
//! other waiting namespace.
//!
//! A namespace has only a few calls waiting at once; its other reconciliations leave their slot
//! instead of waiting (they are *put off*, [`Budget::defer`]). Each call of the namespace served
//! wakes one of them ([`Budget::on_wake`]), and the last wakes as many as may wait (never the
//! whole backlog at once, which would only be put off again), so that a burst in one namespace
//! goes as fast as the budget serves it, not at the pace of a timer.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// How many plugin calls at the sandbox limits the default budget (`--render-memory`) has room
/// for.
pub const DEFAULT_CALLS_IN_FLIGHT: u64 = 2;

/// A call that needs more than the whole budget: it could never run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverBudget {
    /// What the call needs.
    pub needs: u64,
    pub budget: u64,
}

/// What wakes a reconciliation put off: given its namespace and key.
type Wake = Box<dyn Fn(&str, &str) + Send + Sync>;

/// The budget; see the module's documentation.
pub struct Budget {
    total: u64,
    state: Mutex<State>,
    wake: std::sync::OnceLock<Wake>,
}

impl std::fmt::Debug for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Budget")
            .field("total", &self.total)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct State {
    /// Bytes not held by any call.
    free: u64,
    /// The calls waiting, oldest first, by namespace (`""` for cluster-scoped work). A
    /// namespace with none waiting has no entry.
    waiting: BTreeMap<String, VecDeque<Waiter>>,
    /// The namespace served last: the next turn goes to the first one after it.
    last: Option<String>,
    /// The next waiter's id.
    next_id: u64,
    /// Per namespace, the calls put off without waiting (by the caller's key), until they get
    /// their share: how long the next one is put off follows how many there are.
    deferred: BTreeMap<String, BTreeSet<String>>,
    /// The calls put off to wake, once the lock is let go.
    woken: Vec<(String, String)>,
    /// How many calls of one namespace may wait: how many of its calls put off are woken when
    /// its queue empties (`None`: all of them).
    room: Option<usize>,
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    bytes: u64,
    granted: oneshot::Sender<()>,
}

/// A share of the budget, given back when dropped.
#[derive(Debug)]
pub struct Grant {
    budget: Arc<Budget>,
    bytes: u64,
}

impl Grant {
    /// Keeps `bytes` of the grant (when less than it holds) and gives the rest back: a
    /// render's share, once its output is known, shrinks to what that output takes.
    pub fn shrink(mut self, bytes: u64) -> Self {
        if bytes < self.bytes {
            self.budget.give_back(self.bytes - bytes);
            self.bytes = bytes;
        }
        self
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// About how many bytes of memory `value` takes once parsed: each value's own slot, and the
/// bytes of every string and key with an entry's overhead. An estimate for the budget, not an
/// allocator's count.
pub fn footprint(value: &serde_json::Value) -> u64 {
    use serde_json::Value;
    const SLOT: u64 = std::mem::size_of::<Value>() as u64;
    const ENTRY: u64 = 64;
    let len = |s: &str| u64::try_from(s.len()).unwrap_or(u64::MAX);
    let mut total = 0u64;
    let mut stack = vec![value];
    while let Some(v) = stack.pop() {
        total = total.saturating_add(SLOT);
        match v {
            Value::String(s) => total = total.saturating_add(len(s)),
            Value::Array(items) => stack.extend(items),
            Value::Object(fields) => {
                for (k, v) in fields {
                    total = total.saturating_add(ENTRY + len(k));
                    stack.push(v);
                }
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }
    total
}

impl Drop for Grant {
    fn drop(&mut self) {
        self.budget.give_back(self.bytes);
    }
}

impl Budget {
    /// A budget of `total` bytes.
    pub fn new(total: u64) -> Arc<Self> {
        Arc::new(Self {
            total,
            state: Mutex::new(State {
                free: total,
                ..State::default()
            }),
            wake: std::sync::OnceLock::new(),
        })
    }

    /// Sets what wakes a call put off (by its namespace and key) when its namespace has room
    /// again, and how many calls of one namespace may wait (the room a namespace whose queue
    /// empties has: no more of its calls put off are woken at once); set once.
    pub fn on_wake(&self, room: usize, wake: impl Fn(&str, &str) + Send + Sync + 'static) {
        if self.wake.set(Box::new(wake)).is_ok() {
            super::lock(&self.state).room = Some(room.max(1));
        }
    }

    /// Serves waiting calls, then lets the lock go and wakes the calls put off that now have
    /// room.
    fn serve_and_wake(&self, mut state: std::sync::MutexGuard<'_, State>) {
        serve(&mut state);
        let woken = std::mem::take(&mut state.woken);
        drop(state);
        if let Some(wake) = self.wake.get() {
            for (namespace, key) in &woken {
                wake(namespace, key);
            }
        }
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    /// How many calls of `namespace` wait for their share now.
    pub fn waiting(&self, namespace: &str) -> usize {
        super::lock(&self.state)
            .waiting
            .get(namespace)
            .map_or(0, VecDeque::len)
    }

    /// Notes that the call `key` of `namespace` was put off without waiting; how many of the
    /// namespace's calls are put off now. Only a namespace with calls waiting keeps such notes
    /// (they go when its last waiting call is served or leaves), so none outlive a flood.
    pub fn defer(&self, namespace: &str, key: &str) -> usize {
        let mut state = super::lock(&self.state);
        if !state.waiting.contains_key(namespace) {
            return 1;
        }
        let keys = state.deferred.entry(namespace.to_owned()).or_default();
        keys.insert(key.to_owned());
        keys.len()
    }

    /// Notes that the call `key` of `namespace` got its share.
    pub fn undefer(&self, namespace: &str, key: &str) {
        let mut state = super::lock(&self.state);
        if let Some(keys) = state.deferred.get_mut(namespace) {
            keys.remove(key);
            if keys.is_empty() {
                state.deferred.remove(namespace);
            }
        }
    }

    /// Whether the call `key` of `namespace` is put off now.
    pub fn deferred(&self, namespace: &str, key: &str) -> bool {
        super::lock(&self.state)
            .deferred
            .get(namespace)
            .is_some_and(|keys| keys.contains(key))
    }

    /// Bytes not held by any call right now.
    pub fn free(&self) -> u64 {
        super::lock(&self.state).free
    }

    /// Waits for `bytes` of the budget for a call on behalf of `namespace`, in the namespace's
    /// turn. Dropping the future before it is granted leaves the queue (and gives back a grant
    /// made meanwhile).
    pub async fn take(self: &Arc<Self>, namespace: &str, bytes: u64) -> Result<Grant, OverBudget> {
        if bytes > self.total {
            return Err(OverBudget {
                needs: bytes,
                budget: self.total,
            });
        }
        let (id, granted) = {
            let mut state = super::lock(&self.state);
            if state.waiting.is_empty() && state.free >= bytes {
                state.free -= bytes;
                return Ok(self.grant(bytes));
            }
            let id = state.next_id;
            state.next_id += 1;
            let (tx, rx) = oneshot::channel();
            state
                .waiting
                .entry(namespace.to_owned())
                .or_default()
                .push_back(Waiter {
                    id,
                    bytes,
                    granted: tx,
                });
            // The namespace whose turn it is may be this one, and its call may fit now.
            self.serve_and_wake(state);
            (id, rx)
        };
        let mut waiting = Waiting {
            budget: self,
            namespace,
            id,
            bytes,
            done: false,
        };
        // The sender is dropped only once granted (sent) or by this waiter leaving the queue.
        let _ = granted.await;
        waiting.done = true;
        Ok(self.grant(bytes))
    }

    fn grant(self: &Arc<Self>, bytes: u64) -> Grant {
        Grant {
            budget: self.clone(),
            bytes,
        }
    }

    fn give_back(&self, bytes: u64) {
        let mut state = super::lock(&self.state);
        state.free = state.free.saturating_add(bytes).min(self.total);
        self.serve_and_wake(state);
    }
}

/// Grants waiting calls while the budget allows, one namespace after another in turn. The
/// namespace whose turn it is keeps it until its oldest call fits: a large call is not passed
/// over forever by smaller ones.
fn serve(state: &mut State) {
    loop {
        let turn = match &state.last {
            Some(last) => state
                .waiting
                .range::<String, _>((
                    std::ops::Bound::Excluded(last.clone()),
                    std::ops::Bound::Unbounded,
                ))
                .next()
                .or_else(|| state.waiting.iter().next()),
            None => state.waiting.iter().next(),
        }
        .map(|(namespace, _)| namespace.clone());
        let Some(namespace) = turn else { return };
        let Some(queue) = state.waiting.get_mut(&namespace) else {
            return;
        };
        let Some(bytes) = queue.front().map(|w| w.bytes) else {
            state.waiting.remove(&namespace);
            wake_room(state, &namespace);
            continue;
        };
        if bytes > state.free {
            return;
        }
        let waiter = queue.pop_front();
        let emptied = queue.is_empty();
        if emptied {
            state.waiting.remove(&namespace);
            wake_room(state, &namespace);
        }
        if let Some(waiter) = waiter
            && waiter.granted.send(()).is_ok()
        {
            state.free -= bytes;
            // Its place among the namespace's waiting calls goes to one put off (an emptied
            // queue's room was given out above).
            if !emptied
                && let Some(key) = state
                    .deferred
                    .get_mut(&namespace)
                    .and_then(BTreeSet::pop_first)
            {
                state.woken.push((namespace.clone(), key));
            }
        }
        state.last = Some(namespace);
    }
}

/// `namespace` has no call waiting any more: wakes as many of its calls put off as may wait
/// (not thousands at once, to be put off again), and forgets them. The others stay noted: each
/// woken call served wakes one more.
fn wake_room(state: &mut State, namespace: &str) {
    let room = state.room.unwrap_or(usize::MAX);
    let Some(keys) = state.deferred.get_mut(namespace) else {
        return;
    };
    let woken: Vec<String> = std::iter::from_fn(|| keys.pop_first()).take(room).collect();
    if keys.is_empty() {
        state.deferred.remove(namespace);
    }
    state
        .woken
        .extend(woken.into_iter().map(|k| (namespace.to_owned(), k)));
}

/// A call in the queue: leaving it unserved (the future dropped) takes it out, or gives back what
/// was granted meanwhile.
struct Waiting<'a> {
    budget: &'a Arc<Budget>,
    namespace: &'a str,
    id: u64,
    bytes: u64,
    done: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut state = super::lock(&self.budget.state);
        let queued = state.waiting.get_mut(self.namespace).and_then(|queue| {
            let at = queue.iter().position(|w| w.id == self.id)?;
            queue.remove(at)
        });
        if queued.is_none() {
            // Granted, but never taken.
            state.free = state.free.saturating_add(self.bytes).min(self.budget.total);
        }
        if state
            .waiting
            .get(self.namespace)
            .is_some_and(VecDeque::is_empty)
        {
            state.waiting.remove(self.namespace);
            wake_room(&mut state, self.namespace);
        }
        self.budget.serve_and_wake(state);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Whether `fut` is ready after letting the runtime run.
    async fn ready<F: std::future::Future + Unpin>(fut: &mut F) -> Option<F::Output> {
        tokio::time::timeout(Duration::from_millis(20), fut)
            .await
            .ok()
    }

    #[tokio::test]
    async fn a_call_over_the_whole_budget_is_refused_at_once() {
        let budget = Budget::new(100);
        let e = budget.take("a", 101).await.unwrap_err();
        assert_eq!(
            e,
            OverBudget {
                needs: 101,
                budget: 100
            }
        );
        assert_eq!(budget.free(), 100);
    }

    #[tokio::test]
    async fn calls_wait_for_the_budget_and_get_it_back() {
        let budget = Budget::new(100);
        let first = budget.take("a", 60).await.unwrap();
        let mut second = Box::pin(budget.take("a", 60));
        assert!(ready(&mut second).await.is_none(), "60 + 60 > 100");
        drop(first);
        let second = ready(&mut second)
            .await
            .expect("granted once the first ended")
            .unwrap();
        assert_eq!(budget.free(), 40);
        drop(second);
        assert_eq!(budget.free(), 100);
    }

    #[tokio::test]
    async fn a_quiet_namespace_is_served_before_a_flooding_ones_backlog() {
        let budget = Budget::new(10);
        let running = budget.take("flood", 10).await.unwrap();
        let mut flood: Vec<_> = (0..20)
            .map(|_| Box::pin(budget.take("flood", 10)))
            .collect();
        for f in &mut flood {
            assert!(ready(f).await.is_none());
        }
        let mut quiet = Box::pin(budget.take("quiet", 10));
        assert!(ready(&mut quiet).await.is_none());
        assert_eq!((budget.waiting("flood"), budget.waiting("quiet")), (20, 1));
        drop(running);
        // Turns go by namespace name from the start: the flood's oldest call first, then the
        // quiet namespace's, before any other of the flood's.
        let first = ready(&mut flood[0])
            .await
            .expect("the flood's turn")
            .unwrap();
        drop(first);
        let quiet = ready(&mut quiet)
            .await
            .expect("the quiet namespace's turn")
            .unwrap();
        for f in &mut flood[1..] {
            assert!(
                ready(f).await.is_none(),
                "a flood call went before the quiet one"
            );
        }
        drop(quiet);
        drop(flood);
        assert_eq!(budget.free(), 10);
    }

    #[tokio::test]
    async fn a_call_that_leaves_the_queue_frees_its_place_and_what_it_was_granted() {
        let budget = Budget::new(10);
        let running = budget.take("a", 10).await.unwrap();
        let mut leaving = Box::pin(budget.take("b", 10));
        assert!(ready(&mut leaving).await.is_none());
        let mut staying = Box::pin(budget.take("c", 10));
        assert!(ready(&mut staying).await.is_none());
        drop(leaving);
        assert_eq!(
            budget.waiting("b"),
            0,
            "the call that left is out of the queue"
        );
        drop(running);
        let staying = ready(&mut staying).await.expect("served").unwrap();
        drop(staying);
        assert_eq!(budget.free(), 10);

        // Granted, then dropped before the future is polled again: given back.
        let running = budget.take("a", 10).await.unwrap();
        let mut granted = Box::pin(budget.take("b", 10));
        assert!(ready(&mut granted).await.is_none());
        drop(running);
        drop(granted);
        assert_eq!(budget.free(), 10);
        assert!(crate::operator::lock(&budget.state).waiting.is_empty());
    }

    #[tokio::test]
    async fn calls_put_off_are_counted_per_namespace_while_it_has_calls_waiting() {
        let budget = Budget::new(10);
        assert_eq!(budget.defer("a", "x"), 1);
        assert!(
            !budget.deferred("a", "x"),
            "no calls of `a` wait: nothing is kept"
        );
        let running = budget.take("a", 10).await.unwrap();
        let mut waiting_a = Box::pin(budget.take("a", 10));
        assert!(ready(&mut waiting_a).await.is_none());
        let mut waiting_b = Box::pin(budget.take("b", 10));
        assert!(ready(&mut waiting_b).await.is_none());
        assert_eq!(budget.defer("a", "x"), 1);
        assert_eq!(budget.defer("a", "x"), 1, "the same call counts once");
        assert_eq!(budget.defer("a", "y"), 2);
        assert_eq!(budget.defer("b", "x"), 1);
        assert!(budget.deferred("a", "x") && budget.deferred("b", "x"));
        budget.undefer("a", "x");
        assert!(!budget.deferred("a", "x"));
        assert_eq!(budget.defer("a", "z"), 2);
        // `a`'s last waiting call is served: its notes go with its queue.
        drop(running);
        let served = ready(&mut waiting_a).await.expect("served").unwrap();
        assert!(!budget.deferred("a", "y") && !budget.deferred("a", "z"));
        assert!(budget.deferred("b", "x"), "`b` still waits");
        drop(served);
        drop(waiting_b);
        assert!(!budget.deferred("b", "x"));
    }

    #[tokio::test]
    async fn each_call_served_wakes_one_put_off_and_the_last_wakes_the_rest() {
        let budget = Budget::new(10);
        let woken = Arc::new(Mutex::new(Vec::new()));
        let seen = woken.clone();
        budget.on_wake(4, move |ns, key| {
            super::super::lock(&seen).push(format!("{ns}/{key}"))
        });
        let running = budget.take("a", 10).await.unwrap();
        let mut first = Box::pin(budget.take("a", 10));
        let mut second = Box::pin(budget.take("a", 10));
        assert!(ready(&mut first).await.is_none() && ready(&mut second).await.is_none());
        for key in ["x", "y", "z"] {
            budget.defer("a", key);
        }
        drop(running);
        let served = ready(&mut first).await.expect("served").unwrap();
        assert_eq!(
            *super::super::lock(&woken),
            ["a/x"],
            "its place among the waiting goes to one put off"
        );
        drop(served);
        let last = ready(&mut second).await.expect("served").unwrap();
        assert_eq!(
            *super::super::lock(&woken),
            ["a/x", "a/y", "a/z"],
            "no call of `a` waits any more: every one put off is woken"
        );
        assert!(!budget.deferred("a", "z"));
        drop(last);
    }

    #[tokio::test]
    async fn a_queue_that_empties_wakes_no_more_put_off_than_may_wait() {
        let budget = Budget::new(10);
        let woken = Arc::new(Mutex::new(Vec::new()));
        let seen = woken.clone();
        budget.on_wake(1, move |ns, key| {
            super::super::lock(&seen).push(format!("{ns}/{key}"))
        });
        let running = budget.take("a", 10).await.unwrap();
        let mut waiting = Box::pin(budget.take("a", 10));
        assert!(ready(&mut waiting).await.is_none());
        for key in ["x", "y", "z"] {
            budget.defer("a", key);
        }
        drop(running);
        let served = ready(&mut waiting).await.expect("served").unwrap();
        assert_eq!(*super::super::lock(&woken), ["a/x"], "room for one");
        assert!(budget.deferred("a", "y") && budget.deferred("a", "z"));
        drop(served);
    }

    #[tokio::test]
    async fn a_shrunk_grant_gives_back_the_rest() {
        let budget = Budget::new(100);
        let grant = budget.take("a", 80).await.unwrap().shrink(30);
        assert_eq!((grant.bytes(), budget.free()), (30, 70));
        let grant = grant.shrink(50);
        assert_eq!(
            (grant.bytes(), budget.free()),
            (30, 70),
            "a grant never grows"
        );
        drop(grant);
        assert_eq!(budget.free(), 100);
    }

    #[test]
    fn a_footprint_grows_with_what_the_value_holds() {
        let small = footprint(&serde_json::json!({ "a": "b" }));
        let big = footprint(&serde_json::json!({ "a": "b".repeat(1000), "c": [1, 2, 3] }));
        assert!(small > 0 && big > small + 1000, "{small} {big}");
    }

    #[tokio::test]
    async fn a_large_call_is_not_passed_over_by_small_ones_of_its_turn() {
        let budget = Budget::new(10);
        let small = budget.take("a", 5).await.unwrap();
        let mut large = Box::pin(budget.take("b", 10));
        assert!(ready(&mut large).await.is_none());
        // A newcomer queues behind, though 5 bytes are free.
        let mut newcomer = Box::pin(budget.take("c", 5));
        assert!(ready(&mut newcomer).await.is_none());
        drop(small);
        let large = ready(&mut large)
            .await
            .expect("the large call first")
            .unwrap();
        assert!(ready(&mut newcomer).await.is_none());
        drop(large);
        assert!(ready(&mut newcomer).await.is_some());
    }
}
