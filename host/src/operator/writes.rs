//! How many applies and deletes a replica has in flight: at most `--max-writes-in-flight`, and
//! fewer while the API server answers slowly.
//!
//! The limit follows the API server's answers, additive increase and multiplicative decrease as
//! TCP's congestion window does. A write answered within [`SLOW`] raises it by 1/limit (about
//! one slot per limit's worth of quick answers); a write answered later than that (the
//! client's own retries of a 429 or 503, which API Priority and Fairness answers when it sheds
//! load, included), abandoned at the write deadline (with leader election), or refused with a
//! 429 once the client's retries are spent halves it, at most once per write's time: the writes
//! already in flight when it was cut started before the cut and say nothing new.
//!
//! Replicas that share one API server (shards) each read their own answers from it, so each
//! sends less once it falls behind, where a fixed limit each would keep sending K times one
//! replica's writes, to be abandoned at the deadline and sent again. They do not share one
//! limit: with four replicas on 10,000 Services the four limits together were 23 to 48, and
//! writes were still abandoned (docs/benchmarks.md, "Shards").

use std::sync::Mutex;
use std::time::{Duration, Instant};

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{Semaphore, SemaphorePermit};

use super::lock;

/// An answer slower than this says the API server is behind: three quarters of the write
/// deadline ([`super::lease::WRITE_TIMEOUT`]), so that writes are cut before they are
/// abandoned. Not less: some writes are slow on a server that keeps up (a Service create lists
/// every allocated ClusterIP), and with 1 s the limit was cut so often that one replica took
/// twice as long on 10,000 Services (449 s against 229 s; docs/benchmarks.md).
pub(crate) const SLOW: Duration = Duration::from_secs(3);
const _: () = assert!(SLOW.as_millis() < super::lease::WRITE_TIMEOUT.as_millis());

/// The writes in flight and their limit; one per replica, shared by its shards' pipelines.
#[derive(Debug)]
pub(crate) struct Writes {
    semaphore: Semaphore,
    max: usize,
    state: Mutex<State>,
    /// `wasm_operator_api_writes_limit`.
    gauge: Gauge,
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
}

/// A write's place among those in flight: [`Slot::done`] with how it was answered.
#[must_use = "a slot says how its write was answered with `done`"]
pub(crate) struct Slot<'a> {
    writes: &'a Writes,
    permit: Option<SemaphorePermit<'a>>,
    started: Instant,
}

impl Writes {
    /// At most `max` writes in flight (at least 1), starting there; `gauge` shows the limit.
    pub(crate) fn new(max: u16, gauge: Gauge) -> Self {
        let max = usize::from(max.max(1));
        gauge.set(i64::try_from(max).unwrap_or(i64::MAX));
        Self {
            semaphore: Semaphore::new(max),
            max,
            state: Mutex::new(State {
                limit: max as f64,
                permits: max,
                cut: None,
            }),
            gauge,
        }
    }

    /// Waits for a slot.
    pub(crate) async fn slot(&self) -> Slot<'_> {
        // The semaphore is never closed; without a permit, the write goes anyway.
        let permit = self.semaphore.acquire().await.ok();
        Slot {
            writes: self,
            permit,
            started: Instant::now(),
        }
    }

    /// The limit now (its whole part).
    #[cfg(test)]
    pub(crate) fn limit(&self) -> usize {
        whole(lock(&self.state).limit)
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

    fn done_at(self, now: Instant, refused: bool) {
        // The slots follow the new limit when `self` drops, after this lock.
        let writes = self.writes;
        let mut state = lock(&writes.state);
        let behind = refused || now.saturating_duration_since(self.started) >= SLOW;
        if behind {
            if state.cut.is_none_or(|cut| cut < self.started) {
                state.limit = (state.limit / 2.0).max(1.0);
                state.cut = Some(now);
            }
        } else {
            state.limit = (state.limit + 1.0 / state.limit).min(writes.max as f64);
        }
    }
}

impl Drop for Slot<'_> {
    /// The write ended, answered or not (a slot dropped unanswered leaves the limit as it
    /// was): the slots follow the limit.
    fn drop(&mut self) {
        let writes = self.writes;
        let mut state = lock(&writes.state);
        let target = whole(state.limit);
        if state.permits > target {
            // Free slots go first; then this write's own is not given back. Slots held by
            // other writes go as those end.
            state.permits -= writes.semaphore.forget_permits(state.permits - target);
            if state.permits > target
                && let Some(permit) = self.permit.take()
            {
                permit.forget();
                state.permits -= 1;
            }
        } else if state.permits < target {
            writes.semaphore.add_permits(target - state.permits);
            state.permits = target;
        }
        writes.gauge.set(i64::try_from(target).unwrap_or(i64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writes(max: u16) -> Writes {
        Writes::new(max, Gauge::default())
    }

    /// Takes `n` slots at once, their writes started at `at`.
    async fn slots(w: &Writes, n: usize, at: Instant) -> Vec<Slot<'_>> {
        let mut held = Vec::new();
        for _ in 0..n {
            let mut slot = w.slot().await;
            slot.started = at;
            held.push(slot);
        }
        held
    }

    #[tokio::test]
    async fn slow_answers_halve_the_limit_once_per_round_and_quick_ones_win_it_back() {
        let w = writes(16);
        assert_eq!((w.limit(), w.semaphore.available_permits()), (16, 16));
        let t0 = Instant::now();
        let at = |slows: u32| t0 + SLOW * slows;

        // Sixteen writes in flight, all answered late: the first halves the limit, the others
        // started before that cut and do not cut again. Slots are given up until 8 exist.
        for slot in slots(&w, 16, at(0)).await {
            slot.done_at(at(1), false);
        }
        assert_eq!((w.limit(), w.semaphore.available_permits()), (8, 8));

        // A write started after the cut and answered late cuts again; the free slots go at once.
        for slot in slots(&w, 1, at(2)).await {
            slot.done_at(at(3), false);
        }
        assert_eq!((w.limit(), w.semaphore.available_permits()), (4, 4));

        // A 429 is behind whatever its time.
        for k in 4..7 {
            for slot in slots(&w, 1, at(k)).await {
                slot.done_at(at(k), true);
            }
        }
        assert_eq!((w.limit(), w.semaphore.available_permits()), (1, 1));

        // Quick answers add about one slot per limit's worth of them, up to the maximum.
        let quick = async |n: usize| {
            for slot in slots(&w, n, at(7)).await {
                slot.done_at(at(7), false);
            }
        };
        quick(1).await;
        assert_eq!((w.limit(), w.semaphore.available_permits()), (2, 2));
        quick(1).await;
        quick(2).await;
        assert_eq!((w.limit(), w.semaphore.available_permits()), (3, 3));
        for _ in 0..100 {
            quick(3).await;
        }
        assert_eq!((w.limit(), w.semaphore.available_permits()), (16, 16));
    }

    #[tokio::test]
    async fn a_slot_dropped_unanswered_changes_no_limit_and_is_kept_only_within_it() {
        let w = writes(2);
        drop(slots(&w, 2, Instant::now()).await);
        assert_eq!((w.limit(), w.semaphore.available_permits()), (2, 2));
        assert_eq!(writes(0).limit(), 1);

        // Over the limit after a cut: a slot dropped unanswered is not given back.
        let w = writes(4);
        let t0 = Instant::now();
        let mut held = slots(&w, 4, t0).await.into_iter();
        held.next().unwrap().done_at(t0 + SLOW, false);
        assert_eq!((w.limit(), w.semaphore.available_permits()), (2, 0));
        drop(held.next());
        assert_eq!((w.limit(), w.semaphore.available_permits()), (2, 0));
        drop(held.next());
        assert_eq!((w.limit(), w.semaphore.available_permits()), (2, 1));
    }

    #[tokio::test]
    async fn no_more_writes_than_the_limit_are_in_flight_after_a_cut() {
        let w = writes(4);
        let t0 = Instant::now();
        let mut held = slots(&w, 4, t0).await.into_iter();
        held.next().unwrap().done_at(t0 + SLOW, false);
        // Limit 2; three still in flight: none free until two of them end.
        assert_eq!((w.limit(), w.semaphore.available_permits()), (2, 0));
        held.next().unwrap().done_at(t0, false);
        assert_eq!(w.semaphore.available_permits(), 0);
        held.next().unwrap().done_at(t0, false);
        assert_eq!(w.semaphore.available_permits(), 1);
    }
}
