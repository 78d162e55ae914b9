//! The loader's bookkeeping, with no I/O: which generation of each `Plugin` was acted on and how
//! it went, what is being prepared and for which ask, failures in a row, retries on their way.
//! The loader (`mod.rs`) asks it what an event means and does the rest (pulling, serving,
//! status); the tests here drive it through the orders of events a cluster produces, without one.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::plugin::Limits;

/// How often a Plugin refused for a reason that retrying alone does not change (a rule missing,
/// a Kind another serves) is looked at again.
pub(super) const STALLED_RETRY: Duration = Duration::from_secs(300);

/// A preparation running on its own (a task, in the operator).
pub(super) trait Task {
    fn is_finished(&self) -> bool;
    fn abort(&self);
}

impl Task for tokio::task::JoinHandle<()> {
    fn is_finished(&self) -> bool {
        tokio::task::JoinHandle::is_finished(self)
    }

    fn abort(&self) {
        tokio::task::JoinHandle::abort(self);
    }
}

/// What a `Plugin` asks for: which object (a Plugin deleted and created again under the same
/// name is another), which component, with which limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Ask {
    pub uid: String,
    pub digest: Option<String>,
    pub limits: Limits,
}

/// A preparation in flight.
struct Preparing<T> {
    /// Unique per preparation: a result carrying another ticket is from one replaced since.
    ticket: u64,
    ask: Ask,
    task: T,
}

/// The loader's bookkeeping of every `Plugin` it has seen.
pub(super) struct Book<T> {
    /// The generation of each Plugin last acted on, and whether it is served as asked: the same
    /// generation again (the echo of our own status write, a relist) is no news.
    attempted: BTreeMap<String, (i64, bool)>,
    /// Failures in a row per Plugin, for backoff.
    failures: BTreeMap<String, u32>,
    preparing: BTreeMap<String, Preparing<T>>,
    /// The last ticket given to a preparation.
    tickets: u64,
    /// The Plugins with a retry on its way.
    pending: BTreeSet<String>,
}

impl<T> Default for Book<T> {
    fn default() -> Self {
        Self {
            attempted: BTreeMap::new(),
            failures: BTreeMap::new(),
            preparing: BTreeMap::new(),
            tickets: 0,
            pending: BTreeSet::new(),
        }
    }
}

impl<T: Task> Book<T> {
    /// Whether `generation` of the Plugin `name` is to be acted on: it is not the generation
    /// acted on last, or this is a retry (`again`).
    pub(super) fn is_news(&self, name: &str, generation: i64, again: bool) -> bool {
        again
            || self
                .attempted
                .get(name)
                .is_none_or(|(g, _)| *g != generation)
    }

    /// Whether the preparation in flight for `name` is still what is asked (`ask`, `None` when
    /// the spec is refused) and still running: then it goes on. Any other preparation for
    /// `name` is stopped and forgotten.
    pub(super) fn keep_preparing(&mut self, name: &str, ask: Option<&Ask>) -> bool {
        let Some(p) = self.preparing.get(name) else {
            return false;
        };
        if ask == Some(&p.ask) && !p.task.is_finished() {
            return true;
        }
        if let Some(stale) = self.preparing.remove(name) {
            stale.task.abort();
        }
        false
    }

    /// Starts preparing `ask` for `name`: `spawn` is given the preparation's ticket, to come
    /// back with its result, and returns the task.
    pub(super) fn prepare(&mut self, name: &str, ask: Ask, spawn: impl FnOnce(u64) -> T) {
        self.tickets += 1;
        let ticket = self.tickets;
        let task = spawn(ticket);
        if let Some(stale) = self
            .preparing
            .insert(name.to_owned(), Preparing { ticket, ask, task })
        {
            stale.task.abort();
        }
    }

    /// A preparation for `name` came back with `ticket`: what it was asked for, when it is the
    /// preparation in flight; `None` when it was replaced or its Plugin forgotten since.
    pub(super) fn finished(&mut self, name: &str, ticket: u64) -> Option<Ask> {
        match self.preparing.get(name) {
            Some(p) if p.ticket == ticket => self.preparing.remove(name).map(|p| p.ask),
            _ => None,
        }
    }

    /// Whether any preparation is in flight.
    pub(super) fn is_preparing(&self) -> bool {
        !self.preparing.is_empty()
    }

    /// `generation` of the Plugin `name` is served as asked.
    pub(super) fn served(&mut self, name: &str, generation: i64) {
        self.failures.remove(name);
        self.attempted.insert(name.to_owned(), (generation, true));
    }

    /// `generation` of the Plugin `name` was refused; returns when to look at it again: with
    /// backoff when trying again may help (`transient`), else now and then (and at once when a
    /// Plugin goes, see [`Book::forget`]).
    pub(super) fn refused(&mut self, name: &str, generation: i64, transient: bool) -> Duration {
        let n = self.failures.entry(name.to_owned()).or_insert(0);
        *n += 1;
        let n = *n;
        self.attempted.insert(name.to_owned(), (generation, false));
        if transient {
            crate::operator::backoff_delay(n)
        } else {
            STALLED_RETRY
        }
    }

    /// Whether a retry of `name` is to be sent: none is on its way.
    pub(super) fn retry(&mut self, name: &str) -> bool {
        self.pending.insert(name.to_owned())
    }

    /// A retry of `name` arrived.
    pub(super) fn retried(&mut self, name: &str) {
        self.pending.remove(name);
    }

    /// The Plugin `name` is gone: its preparation stops, its history is forgotten.
    pub(super) fn forget(&mut self, name: &str) {
        if let Some(p) = self.preparing.remove(name) {
            p.task.abort();
        }
        self.failures.remove(name);
        self.attempted.remove(name);
    }

    /// The Plugins refused as last asked, each to be retried at once (any retry on its way is
    /// forgotten): a Plugin gone may have held what they claim.
    pub(super) fn retry_refused(&mut self) -> Vec<String> {
        let refused: Vec<String> = self
            .attempted
            .iter()
            .filter(|(_, (_, ok))| !ok)
            .map(|(n, _)| n.clone())
            .collect();
        for name in &refused {
            self.pending.remove(name);
        }
        refused
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;

    use super::*;

    /// A task whose end and abort the test controls and sees.
    #[derive(Clone, Default)]
    struct Fake {
        finished: Rc<Cell<bool>>,
        aborted: Rc<Cell<bool>>,
    }

    impl Task for Fake {
        fn is_finished(&self) -> bool {
            self.finished.get() || self.aborted.get()
        }

        fn abort(&self) {
            self.aborted.set(true);
        }
    }

    fn ask(uid: &str, digest: &str) -> Ask {
        Ask {
            uid: uid.into(),
            digest: Some(digest.into()),
            limits: Limits::default(),
        }
    }

    /// Starts preparing `ask` for `name`; the ticket and the task.
    fn start(book: &mut Book<Fake>, name: &str, ask: Ask) -> (u64, Fake) {
        let task = Fake::default();
        let mut ticket = 0;
        book.prepare(name, ask, |t| {
            ticket = t;
            task.clone()
        });
        (ticket, task)
    }

    #[test]
    fn a_generation_acted_on_is_no_news_until_it_changes_or_is_retried() {
        let mut book = Book::<Fake>::default();
        assert!(book.is_news("site", 1, false), "never seen");
        book.served("site", 1);
        assert!(
            !book.is_news("site", 1, false),
            "the echo of our status write"
        );
        assert!(book.is_news("site", 1, true), "a retry");
        assert!(book.is_news("site", 2, false), "a new spec");
        book.refused("site", 2, true);
        assert!(
            !book.is_news("site", 2, false),
            "a refused generation waits for its retry"
        );
        book.forget("site");
        assert!(book.is_news("site", 2, false), "created again");
    }

    #[test]
    fn a_preparation_for_what_is_still_asked_goes_on_and_any_other_is_stopped() {
        let mut book = Book::<Fake>::default();
        let (_, first) = start(&mut book, "site", ask("u1", "sha256:a"));
        assert!(book.keep_preparing("site", Some(&ask("u1", "sha256:a"))));
        assert!(!first.aborted.get());
        // The spec changed: the old preparation is not asked for any more.
        assert!(!book.keep_preparing("site", Some(&ask("u1", "sha256:b"))));
        assert!(first.aborted.get());
        assert!(!book.is_preparing());
        // Deleted and created again with the same image: another object.
        let (_, second) = start(&mut book, "site", ask("u1", "sha256:b"));
        assert!(!book.keep_preparing("site", Some(&ask("u2", "sha256:b"))));
        assert!(second.aborted.get());
        // A spec now refused stops what was being prepared for the last one.
        let (_, third) = start(&mut book, "site", ask("u2", "sha256:b"));
        assert!(!book.keep_preparing("site", None));
        assert!(third.aborted.get());
        // A finished task whose result has not come back yet is started again, not waited on.
        let (_, fourth) = start(&mut book, "site", ask("u2", "sha256:b"));
        fourth.finished.set(true);
        assert!(!book.keep_preparing("site", Some(&ask("u2", "sha256:b"))));
        assert!(!book.keep_preparing("other", Some(&ask("u2", "sha256:b"))));
    }

    #[test]
    fn only_the_result_of_the_preparation_in_flight_is_taken() {
        let mut book = Book::<Fake>::default();
        let (old, old_task) = start(&mut book, "site", ask("u1", "sha256:a"));
        let (new, _) = start(&mut book, "site", ask("u1", "sha256:b"));
        assert_ne!(old, new, "every preparation has its own ticket");
        assert!(old_task.aborted.get(), "replaced");
        assert_eq!(
            book.finished("site", old),
            None,
            "from a replaced preparation"
        );
        assert!(book.is_preparing(), "the newer one still runs");
        assert_eq!(book.finished("site", new), Some(ask("u1", "sha256:b")));
        assert!(!book.is_preparing());
        assert_eq!(book.finished("site", new), None, "taken once");
        // A result for a Plugin deleted meanwhile is dropped.
        let (gone, task) = start(&mut book, "gone", ask("u3", "sha256:c"));
        book.forget("gone");
        assert!(task.aborted.get());
        assert_eq!(book.finished("gone", gone), None);
    }

    #[test]
    fn refusals_back_off_when_retrying_may_help_and_wait_long_when_it_cannot() {
        let mut book = Book::<Fake>::default();
        let waits: Vec<Duration> = (0..4).map(|_| book.refused("site", 1, true)).collect();
        assert_eq!(
            waits,
            [1, 2, 4, 8].map(Duration::from_secs),
            "a registry down: backoff doubles"
        );
        book.served("site", 1);
        assert_eq!(
            book.refused("site", 2, true),
            Duration::from_secs(1),
            "served since: the count starts again"
        );
        assert_eq!(book.refused("site", 2, false), STALLED_RETRY);
    }

    #[test]
    fn one_retry_at_a_time_and_a_plugin_gone_retries_those_refused_at_once() {
        let mut book = Book::<Fake>::default();
        assert!(book.retry("a"));
        assert!(!book.retry("a"), "one is on its way");
        book.retried("a");
        assert!(book.retry("a"));
        book.refused("a", 1, false);
        book.refused("b", 1, true);
        book.served("c", 1);
        assert_eq!(book.retry_refused(), ["a", "b"], "not c, served");
        assert!(book.retry("a"), "the slow retry on its way is overtaken");
    }
}
