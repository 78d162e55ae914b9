//! How many applies and deletes a replica has in flight (and reads of objects known by name
//! only, below): at most `--max-writes-in-flight`, and fewer while the API server answers slowly
//! or sheds load.
//!
//! Each limit follows the answers it is given, additive increase and multiplicative decrease as
//! TCP's congestion window does: a quick answer raises it by 1/limit (about one slot per
//! limit's worth of quick answers), a late one halves it, at most once per write's time (the
//! writes already in flight when it was cut started before the cut and say nothing new).
//!
//! Two limits hold each write, so that no tenant slows another:
//! - **Its namespace's**, halved by a write of that namespace answered later than [`SLOW`] (the
//!   client's own retries of a 429 or 503 included) or abandoned at the write deadline. Slowness
//!   can be of a tenant's own making (children near the plugin output cap take seconds to
//!   apply), so it throttles only the namespace it was seen in. A namespace is tracked while it
//!   has writes in flight or a limit below the maximum.
//! - **The replica's**, halved by a 429 once the client's retries are spent, whichever
//!   namespace's write got it (API Priority and Fairness sheds the operator's flow as a whole,
//!   and no tenant can make it do so but by the operator's own volume of writes), and by a slow
//!   answer once slow answers came from two namespaces since its last cut (an API server
//!   behind for everyone, where no 429 may come: with leader election a write is abandoned at
//!   4 s). Only a namespace whose own limit is at the maximum counts: one cut already is known
//!   to be slow, and a tenant that keeps its own writes slow would otherwise hold half the
//!   count, so that any other namespace's one slow answer cut the replica's limit again after
//!   each cut. A quick answer raises it.
//!
//! The reads of objects the watches know by name only (`Shared::read_by_name`) take slots as
//! writes do: a late or refused read cuts the limits as a write's answer does, a quick one
//! raises nothing.
//!
//! `--min-writes-in-flight` is the floor of both (equal to the maximum, it pins them).
//!
//! Replicas that share one API server (shards) each read their own answers from it, so each
//! sends less once it falls behind, where a fixed limit each would keep sending K times one
//! replica's writes, to be abandoned at the deadline and sent again. They do not share one
//! limit: with four replicas on 10,000 Services the four limits together were 23 to 48, and
//! writes were still abandoned (docs/benchmarks.md, "Shards").

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::lock;

/// An answer slower than this says the API server is behind: three quarters of the write
/// deadline ([`super::lease::WRITE_TIMEOUT`]), so that writes are cut before they are
/// abandoned. Not less: some writes are slow on a server that keeps up (a Service create lists
/// every allocated ClusterIP), and with 1 s the limit was cut so often that one replica took
/// twice as long on 10,000 Services (449 s against 229 s; docs/benchmarks.md).
pub(crate) const SLOW: Duration = Duration::from_secs(3);
const _: () = assert!(SLOW.as_millis() < super::lease::WRITE_TIMEOUT.as_millis());

/// The writes in flight and their limits; one per replica, shared by its shards' pipelines.
#[derive(Debug)]
pub(crate) struct Writes {
    /// The replica's limit, which 429s cut.
    all: Limit,
    /// Every limit's floor and ceiling.
    min: u16,
    max: u16,
    /// Each namespace's limit, which its slow answers cut: those with writes in flight or a
    /// limit below the maximum.
    namespaces: Mutex<HashMap<String, Arc<Limit>>>,
    /// `wasm_operator_api_writes_limit`: the replica's limit.
    gauge: Gauge,
    /// `wasm_operator_api_writes_limited_namespaces`: namespaces whose limit is below the
    /// maximum.
    limited: Gauge,
    /// The namespace of the first slow answer from a namespace at its maximum since the
    /// replica's limit was last cut: such an answer from another one cuts it.
    slow_from: Mutex<Option<String>>,
}

/// One limit of writes in flight, between a floor and a ceiling.
#[derive(Debug)]
struct Limit {
    semaphore: Arc<Semaphore>,
    min: f64,
    max: usize,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// The limit, with its fraction (additive increase adds 1/limit at a time).
    limit: f64,
    /// The permits that exist, held or free: the limit's whole part, once the writes held
    /// over a cut have ended.
    permits: usize,
    /// When the limit was last cut.
    cut: Option<Instant>,
    /// Whether the permits were below the maximum when they last followed the limit.
    limited: bool,
}

/// How an answer moves a limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    Quick,
    /// Says nothing to this limit (a slow answer, to the replica's).
    Neutral,
    Behind,
}

/// A write's place among those in flight: [`Slot::done`] with how it was answered.
#[must_use = "a slot says how its write was answered with `done`"]
pub(crate) struct Slot<'a> {
    writes: &'a Writes,
    namespace: String,
    limit: Arc<Limit>,
    own: Option<OwnedSemaphorePermit>,
    all: Option<OwnedSemaphorePermit>,
    started: Instant,
}

impl Writes {
    /// At most `max` writes in flight (at least 1), and each limit at least `min` (at most
    /// `max`), starting at `max`; `gauge` shows the replica's limit, `limited` how many
    /// namespaces have theirs cut.
    pub(crate) fn new(min: u16, max: u16, gauge: Gauge, limited: Gauge) -> Self {
        let max = max.max(1);
        gauge.set(i64::from(max));
        limited.set(0);
        Self {
            all: Limit::new(min, max),
            min,
            max,
            namespaces: Mutex::new(HashMap::new()),
            gauge,
            limited,
            slow_from: Mutex::new(None),
        }
    }

    /// Waits for a slot for a write in `namespace`: first within the namespace's limit, then
    /// within the replica's, so that a namespace held at its limit keeps none of the
    /// replica's slots while it waits.
    pub(crate) async fn slot(&self, namespace: &str) -> Slot<'_> {
        let limit = lock(&self.namespaces)
            .entry(namespace.to_owned())
            .or_insert_with(|| Arc::new(Limit::new(self.min, self.max)))
            .clone();
        let own = limit.acquire().await;
        let all = self.all.acquire().await;
        Slot {
            writes: self,
            namespace: namespace.to_owned(),
            limit,
            own,
            all,
            started: Instant::now(),
        }
    }

    /// The replica's limit now (its whole part).
    #[cfg(test)]
    fn limit(&self) -> usize {
        whole(lock(&self.all.state).limit)
    }

    /// `namespace`'s limit now (its whole part), the maximum when it is not tracked.
    #[cfg(test)]
    fn limit_of(&self, namespace: &str) -> usize {
        lock(&self.namespaces)
            .get(namespace)
            .map_or(usize::from(self.max), |l| whole(lock(&l.state).limit))
    }

    /// What a slow answer from `namespace`, whose own limit is at its maximum, says to the
    /// replica's limit: nothing while every such answer since its last cut came from one
    /// namespace (which a tenant can cause itself), behind once a second namespace answers
    /// slowly too. (A tenant with several namespaces can still cut it: at most by half per
    /// round, each namespace once until its own limit grows back, and quick answers win it
    /// back.)
    fn slow_seen(&self, namespace: &str) -> Answer {
        let mut first = lock(&self.slow_from);
        match first.as_deref() {
            None => {
                *first = Some(namespace.to_owned());
                Answer::Neutral
            }
            Some(seen) if seen == namespace => Answer::Neutral,
            Some(_) => Answer::Behind,
        }
    }
}

impl Limit {
    fn new(min: u16, max: u16) -> Self {
        let max = usize::from(max.max(1));
        Self {
            semaphore: Arc::new(Semaphore::new(max)),
            min: f64::from(min.max(1)).min(max as f64),
            max,
            state: Mutex::new(State {
                limit: max as f64,
                permits: max,
                cut: None,
                limited: false,
            }),
        }
    }

    /// Whether the limit is at its maximum (never cut, or grown back).
    fn at_max(&self) -> bool {
        lock(&self.state).limit >= self.max as f64
    }

    async fn acquire(&self) -> Option<OwnedSemaphorePermit> {
        // The semaphore is never closed; without a permit, the write goes anyway.
        self.semaphore.clone().acquire_owned().await.ok()
    }

    /// A write started at `started` was answered at `now`; whether the limit was cut.
    fn answered(&self, started: Instant, now: Instant, answer: Answer) -> bool {
        let mut state = lock(&self.state);
        match answer {
            Answer::Behind if state.cut.is_none_or(|cut| cut < started) => {
                state.limit = (state.limit / 2.0).max(self.min);
                state.cut = Some(now);
                true
            }
            Answer::Behind | Answer::Neutral => false,
            Answer::Quick => {
                state.limit = (state.limit + 1.0 / state.limit).min(self.max as f64);
                false
            }
        }
    }

    /// A write holding `permit` ended, answered or not: the permits follow the limit (free ones
    /// go first, then this write's own is not given back; those held by other writes go as
    /// they end). The limit's whole part, and whether it went below the maximum (`Some(true)`)
    /// or back to it (`Some(false)`).
    fn fit(&self, permit: &mut Option<OwnedSemaphorePermit>) -> (usize, Option<bool>) {
        let mut state = lock(&self.state);
        let target = whole(state.limit);
        if state.permits > target {
            state.permits -= self.semaphore.forget_permits(state.permits - target);
            if state.permits > target
                && let Some(permit) = permit.take()
            {
                permit.forget();
                state.permits -= 1;
            }
        } else if state.permits < target {
            self.semaphore.add_permits(target - state.permits);
            state.permits = target;
        }
        let limited = target < self.max;
        let changed = (limited != state.limited).then_some(limited);
        state.limited = limited;
        (target, changed)
    }
}

/// The whole part of a limit, at least 1.
fn whole(limit: f64) -> usize {
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "a limit lies in [1, max], max a u16: its whole part fits"
    )]
    let n = limit.floor() as usize;
    n.max(1)
}

impl Slot<'_> {
    /// The write was answered (or abandoned) now; `refused`: with 429.
    pub(crate) fn done(self, refused: bool) {
        self.done_at(Instant::now(), refused);
    }

    /// A read held this slot and was answered (or abandoned) now: a 429 or a slow answer cuts
    /// the limits as a write's does, a quick one raises nothing (a cheap GET says little of
    /// what a write costs, and a namespace cut for its slow writes must not win its limit back
    /// by reads).
    pub(crate) fn done_read(self, refused: bool) {
        self.done_read_at(Instant::now(), refused);
    }

    fn done_read_at(self, now: Instant, refused: bool) {
        if refused || now.saturating_duration_since(self.started) >= SLOW {
            self.done_at(now, refused);
        }
    }

    fn done_at(self, now: Instant, refused: bool) {
        // The slots follow the new limits when `self` drops.
        let slow = now.saturating_duration_since(self.started) >= SLOW;
        let (own, all) = match (refused, slow) {
            (true, _) => (Answer::Behind, Answer::Behind),
            // A namespace whose limit is cut already is known to be slow (a tenant can keep
            // its own writes slow): its slow answers say nothing new of the API server.
            (false, true) if !self.limit.at_max() => (Answer::Behind, Answer::Neutral),
            (false, true) => (Answer::Behind, self.writes.slow_seen(&self.namespace)),
            (false, false) => (Answer::Quick, Answer::Quick),
        };
        if self.limit.answered(self.started, now, own) {
            tracing::info!(namespace = %self.namespace, limit = whole(lock(&self.limit.state).limit), refused, "writes answered late: fewer in flight for the namespace");
        }
        if self.writes.all.answered(self.started, now, all) {
            tracing::info!(
                limit = whole(lock(&self.writes.all.state).limit),
                refused,
                "writes refused with 429, or answered late in several namespaces: fewer in flight"
            );
            *lock(&self.writes.slow_from) = None;
        }
    }
}

impl Drop for Slot<'_> {
    /// The write ended, answered or not (a slot dropped unanswered leaves the limits as they
    /// were): the slots follow the limits, and a namespace back at the maximum with nothing in
    /// flight is no longer tracked.
    fn drop(&mut self) {
        let writes = self.writes;
        let (all, _) = writes.all.fit(&mut self.all);
        writes.gauge.set(i64::try_from(all).unwrap_or(i64::MAX));
        let (_, changed) = self.limit.fit(&mut self.own);
        match changed {
            Some(true) => writes.limited.inc(),
            Some(false) => writes.limited.dec(),
            None => 0,
        };
        drop(self.own.take());
        let mut namespaces = lock(&writes.namespaces);
        // The map's and this slot's: no other write holds or waits for it (taking it from the
        // map needs this lock). Whether it is at the maximum is read here, under the map's
        // lock, not from `fit` above: another write of the namespace may have cut it and ended
        // in between.
        if !lock(&self.limit.state).limited
            && Arc::strong_count(&self.limit) == 2
            && namespaces
                .get(&self.namespace)
                .is_some_and(|l| Arc::ptr_eq(l, &self.limit))
        {
            namespaces.remove(&self.namespace);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writes(min: u16, max: u16) -> Writes {
        Writes::new(min, max, Gauge::default(), Gauge::default())
    }

    /// Takes `n` slots in `namespace` at once, their writes started at `at`.
    async fn slots<'a>(w: &'a Writes, namespace: &str, n: usize, at: Instant) -> Vec<Slot<'a>> {
        let mut held = Vec::new();
        for _ in 0..n {
            let mut slot = w.slot(namespace).await;
            slot.started = at;
            held.push(slot);
        }
        held
    }

    /// The free slots of `namespace` (the maximum when it is not tracked) and of the replica.
    fn free(w: &Writes, namespace: &str) -> (usize, usize) {
        let own = lock(&w.namespaces)
            .get(namespace)
            .map_or(usize::from(w.max), |l| l.semaphore.available_permits());
        (own, w.all.semaphore.available_permits())
    }

    #[tokio::test]
    async fn slow_answers_halve_the_namespaces_limit_once_per_round_and_quick_ones_win_it_back() {
        let w = writes(1, 16);
        let t0 = Instant::now();
        let at = |slows: u32| t0 + SLOW * slows;

        // Sixteen writes in flight, all answered late: the first halves the namespace's limit,
        // the others started before that cut and do not cut again. Slots are given up until 8
        // exist. The replica's limit is not the namespace's to cut.
        for slot in slots(&w, "a", 16, at(0)).await {
            slot.done_at(at(1), false);
        }
        assert_eq!((w.limit_of("a"), w.limit()), (8, 16));
        assert_eq!(free(&w, "a"), (8, 16));
        assert_eq!(w.limited.get(), 1);

        // A write started after the cut and answered late cuts again; the free slots go at once.
        for slot in slots(&w, "a", 1, at(2)).await {
            slot.done_at(at(3), false);
        }
        assert_eq!(free(&w, "a"), (4, 16));

        // A 429 is behind whatever its time, for the namespace and the replica both.
        for k in 4..7 {
            for slot in slots(&w, "a", 1, at(k)).await {
                slot.done_at(at(k), true);
            }
        }
        assert_eq!((w.limit_of("a"), w.limit()), (1, 2));
        assert_eq!(free(&w, "a"), (1, 2));

        // Quick answers add about one slot per limit's worth of them, up to the maximum; back
        // there with nothing in flight, the namespace is no longer tracked.
        let quick = async |n: usize| {
            for slot in slots(&w, "a", n, at(7)).await {
                slot.done_at(at(7), false);
            }
        };
        quick(1).await;
        assert_eq!((w.limit_of("a"), w.limit()), (2, 2));
        quick(1).await;
        quick(2).await;
        assert_eq!((w.limit_of("a"), w.limit()), (3, 3));
        for _ in 0..100 {
            quick(3).await;
        }
        assert_eq!((w.limit_of("a"), w.limit()), (16, 16));
        assert!(lock(&w.namespaces).is_empty());
        assert_eq!(w.limited.get(), 0);
    }

    #[tokio::test]
    async fn reads_cut_the_limits_as_writes_do_and_never_raise_them() {
        let w = writes(1, 16);
        let t0 = Instant::now();
        let at = |slows: u32| t0 + SLOW * slows;
        for slot in slots(&w, "a", 1, at(0)).await {
            slot.done_at(at(1), false);
        }
        assert_eq!((w.limit_of("a"), w.limit()), (8, 16));
        // Quick reads, many: the namespace's limit stays where its slow write put it.
        for _ in 0..100 {
            for slot in slots(&w, "a", 1, at(2)).await {
                slot.done_read_at(at(2), false);
            }
        }
        assert_eq!((w.limit_of("a"), w.limit()), (8, 16));
        // A slow read cuts it, a refused one the replica's too.
        for slot in slots(&w, "a", 1, at(2)).await {
            slot.done_read_at(at(3), false);
        }
        assert_eq!((w.limit_of("a"), w.limit()), (4, 16));
        for slot in slots(&w, "a", 1, at(4)).await {
            slot.done_read_at(at(4), true);
        }
        assert_eq!((w.limit_of("a"), w.limit()), (2, 8));
    }

    #[tokio::test]
    async fn a_namespace_answered_slowly_takes_no_slot_from_another() {
        // A tenant whose children take seconds to apply (near the output cap) is held to one
        // write at a time; the others keep every slot.
        let w = writes(1, 16);
        let t0 = Instant::now();
        for k in 0..6 {
            for slot in slots(&w, "slow", 1, t0 + SLOW * (2 * k)).await {
                slot.done_at(t0 + SLOW * (2 * k + 1), false);
            }
        }
        assert_eq!(
            (w.limit_of("slow"), w.limit_of("other"), w.limit()),
            (1, 16, 16)
        );
        let held = slots(&w, "other", 16, t0).await;
        assert_eq!(free(&w, "other"), (0, 0));
        drop(held);

        // Held at its limit, the slow namespace waits without a slot of the replica's.
        let _one = w.slot("slow").await;
        let waiting = tokio::time::timeout(Duration::from_millis(50), w.slot("slow")).await;
        assert!(
            waiting.is_err(),
            "a second write of the slow namespace got a slot"
        );
        assert_eq!(free(&w, "slow"), (0, 15));
    }

    #[tokio::test]
    async fn slow_answers_from_two_namespaces_halve_the_replicas_limit() {
        let w = writes(1, 16);
        let t0 = Instant::now();
        let late = async |namespace: &str, round: u32| {
            for slot in slots(&w, namespace, 1, t0 + SLOW * (2 * round)).await {
                slot.done_at(t0 + SLOW * (2 * round + 1), false);
            }
        };
        late("a", 0).await;
        late("a", 1).await;
        assert_eq!(w.limit(), 16);
        late("b", 2).await;
        assert_eq!((w.limit_of("a"), w.limit_of("b"), w.limit()), (4, 8, 8));
        // The count starts again after the cut, and namespaces cut already count no more.
        late("b", 3).await;
        late("a", 4).await;
        assert_eq!(w.limit(), 8);
        late("c", 5).await;
        assert_eq!(w.limit(), 8);
        late("d", 6).await;
        assert_eq!(w.limit(), 4);
    }

    #[tokio::test]
    async fn namespaces_kept_slow_cut_the_replicas_limit_once() {
        // Two tenants, each keeping its own writes slow: after the first cut, their slow
        // answers are their namespaces' business.
        let w = writes(1, 16);
        let t0 = Instant::now();
        for round in 0..8 {
            for namespace in ["t", "u"] {
                for slot in slots(&w, namespace, 1, t0 + SLOW * (2 * round)).await {
                    slot.done_at(t0 + SLOW * (2 * round + 1), false);
                }
            }
        }
        assert_eq!((w.limit_of("t"), w.limit_of("u"), w.limit()), (1, 1, 8));
    }

    #[tokio::test]
    async fn a_namespace_cut_stays_tracked_once_its_writes_end() {
        let w = writes(1, 2);
        let t0 = Instant::now();
        let mut held = slots(&w, "a", 2, t0).await.into_iter();
        let (quick, slow) = (held.next().unwrap(), held.next().unwrap());
        slow.done_at(t0 + SLOW, false);
        drop(quick);
        assert_eq!((w.limit_of("a"), w.limited.get()), (1, 1));
        assert!(lock(&w.namespaces).contains_key("a"));
        // Grown back to the maximum, it is forgotten with its last write.
        for round in 1..=4 {
            for slot in slots(&w, "a", 1, t0 + SLOW * round).await {
                slot.done_at(t0 + SLOW * round, false);
            }
        }
        assert_eq!((w.limit_of("a"), w.limited.get()), (2, 0));
        assert!(!lock(&w.namespaces).contains_key("a"));
    }

    #[tokio::test]
    async fn the_floor_holds_every_limit() {
        let w = writes(16, 16);
        let t0 = Instant::now();
        for k in 0..4 {
            for slot in slots(&w, "a", 1, t0 + SLOW * (2 * k)).await {
                slot.done_at(t0 + SLOW * (2 * k + 1), true);
            }
        }
        assert_eq!((w.limit_of("a"), w.limit()), (16, 16));
        let w = writes(4, 16);
        for k in 0..4 {
            for slot in slots(&w, "a", 1, t0 + SLOW * (2 * k)).await {
                slot.done_at(t0 + SLOW * (2 * k + 1), true);
            }
        }
        assert_eq!((w.limit_of("a"), w.limit()), (4, 4));
        // A floor over the ceiling is the ceiling; none is at least 1.
        assert_eq!(writes(20, 2).limit(), 2);
        assert_eq!(writes(0, 0).limit(), 1);
    }

    #[tokio::test]
    async fn a_slot_dropped_unanswered_changes_no_limit_and_is_kept_only_within_it() {
        let w = writes(1, 2);
        drop(slots(&w, "a", 2, Instant::now()).await);
        assert_eq!((w.limit_of("a"), w.limit()), (2, 2));
        assert!(lock(&w.namespaces).is_empty());

        // Over the limit after a cut: a slot dropped unanswered is not given back.
        let w = writes(1, 4);
        let t0 = Instant::now();
        let mut held = slots(&w, "a", 4, t0).await.into_iter();
        held.next().unwrap().done_at(t0 + SLOW, false);
        assert_eq!((w.limit_of("a"), free(&w, "a")), (2, (0, 1)));
        drop(held.next());
        assert_eq!(free(&w, "a"), (0, 2));
        drop(held.next());
        assert_eq!(free(&w, "a"), (1, 3));
    }

    #[tokio::test]
    async fn no_more_writes_than_the_limit_are_in_flight_after_a_cut() {
        let w = writes(1, 4);
        let t0 = Instant::now();
        let mut held = slots(&w, "a", 4, t0).await.into_iter();
        held.next().unwrap().done_at(t0 + SLOW, false);
        // Limit 2; three still in flight: none free until two of them end.
        assert_eq!((w.limit_of("a"), free(&w, "a").0), (2, 0));
        held.next().unwrap().done_at(t0, false);
        assert_eq!(free(&w, "a").0, 0);
        held.next().unwrap().done_at(t0, false);
        assert_eq!(free(&w, "a").0, 1);
    }
}
