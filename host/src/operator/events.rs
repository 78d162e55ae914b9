//! Events (events.k8s.io/v1), written as kube's `Recorder` writes them, with less kept.
//!
//! An event repeated within [`SERIES_TTL`] of its last write (same type, action, reason, note,
//! reporter, regarding and related object) is not a new object: the first one's `series`
//! counts it, as `kubectl events` shows. Unlike kube's recorder, the note is part of what makes
//! an event the same: an Event's note cannot change once written, so `applied Deployment/a`
//! and a later `applied Service/a` are two events, not one with the first's note. kube's
//! recorder keeps each event whole for six minutes and walks all of them on every publish; at
//! 10,000 resources (an `Applied` event each) that walk was 9 % of the operator's CPU, and the
//! events held megabytes. Here each event is remembered as its name, its count and when it
//! last happened, under a 64-bit hash of what makes it the same, and the records past
//! [`SERIES_TTL`] are dropped at most once every [`SWEEP_EVERY`], when an event is published.
//! The window counts from writes, which can come minutes after what they report (reports give
//! way to applies); the times written on the events are those of what happened.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};

use super::lock;

/// How long after an event's last occurrence a repeat still counts in its series (kube's and
/// client-go's figure).
const SERIES_TTL: Duration = Duration::from_secs(6 * 60);
/// How often the records of events past [`SERIES_TTL`] are dropped.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Writes events as `reporter`.
pub struct Recorder {
    client: kube::Client,
    reporter: Reporter,
    seen: Mutex<Seen>,
}

/// The events written lately, by the hash of what makes one the same as another.
struct Seen {
    records: HashMap<u64, Record>,
    swept: Instant,
}

/// An event written: its object's name, how many times it happened, when it last did.
struct Record {
    name: String,
    count: i32,
    last: Instant,
}

impl Recorder {
    pub fn new(client: kube::Client, reporter: Reporter) -> Self {
        Self {
            client,
            reporter,
            seen: Mutex::new(Seen {
                records: HashMap::new(),
                swept: Instant::now(),
            }),
        }
    }

    /// Writes `event` about `regarding` (in its namespace, or `default` for a cluster-scoped
    /// object): a new Event, or, for a repeat, one more in the first one's series.
    /// `at` is when it happened: its `eventTime`, or its series' `lastObservedTime`.
    pub async fn publish(
        &self,
        event: &Event,
        regarding: &ObjectReference,
        at: Timestamp,
    ) -> Result<(), kube::Error> {
        let key = self.key(event, regarding);
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), namespace);
        let now = Instant::now();
        let repeat = {
            let mut seen = lock(&self.seen);
            if now.saturating_duration_since(seen.swept) >= SWEEP_EVERY {
                seen.records
                    .retain(|_, r| now.saturating_duration_since(r.last) < SERIES_TTL);
                seen.swept = now;
            }
            seen.records
                .get_mut(&key)
                .filter(|r| now.saturating_duration_since(r.last) < SERIES_TTL)
                .map(|r| {
                    r.count = r.count.saturating_add(1);
                    r.last = now;
                    (r.name.clone(), r.count)
                })
        };
        if let Some((name, count)) = repeat {
            let patch = serde_json::json!({
                "series": EventSeries {
                    count,
                    last_observed_time: MicroTime(at),
                }
            });
            match api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                // The event is gone (the API server keeps events an hour by default, and
                // anyone may delete one): a new one starts the series again.
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                done => return done.map(drop),
            }
        }
        let created = self.event(event, regarding, at);
        let name = created.metadata.name.clone().unwrap_or_default();
        api.create(&PostParams::default(), &created).await?;
        lock(&self.seen).records.insert(
            key,
            Record {
                name,
                count: 1,
                last: now,
            },
        );
        Ok(())
    }

    /// What makes an event the same as another: all but its time.
    fn key(&self, event: &Event, regarding: &ObjectReference) -> u64 {
        let mut h = std::hash::DefaultHasher::new();
        matches!(event.type_, EventType::Warning).hash(&mut h);
        (&event.action, &event.reason, &event.note).hash(&mut h);
        (&self.reporter.controller, &self.reporter.instance).hash(&mut h);
        for r in std::iter::once(regarding).chain(&event.secondary) {
            (&r.api_version, &r.kind, &r.namespace, &r.name, &r.uid).hash(&mut h);
            (&r.field_path, &r.resource_version).hash(&mut h);
        }
        h.finish()
    }

    /// A new Event object for `event` about `regarding`, which happened `at`: named after
    /// `regarding` and the time of the write, as client-go names them, so that two events that
    /// happened at once still have names of their own.
    fn event(&self, event: &Event, regarding: &ObjectReference, at: Timestamp) -> K8sEvent {
        let instance = self
            .reporter
            .instance
            .clone()
            .unwrap_or_else(|| self.reporter.controller.clone());
        K8sEvent {
            action: Some(event.action.clone()),
            reason: Some(event.reason.clone()),
            note: event.note.clone(),
            type_: Some(
                match event.type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .to_owned(),
            ),
            event_time: Some(MicroTime(at)),
            regarding: Some(regarding.clone()),
            related: event.secondary.clone(),
            reporting_controller: Some(self.reporter.controller.clone()),
            reporting_instance: Some(instance),
            metadata: ObjectMeta {
                namespace: regarding.namespace.clone(),
                name: Some(event_name(
                    regarding
                        .name
                        .as_deref()
                        .unwrap_or(&self.reporter.controller),
                    Timestamp::now(),
                )),
                ..ObjectMeta::default()
            },
            ..K8sEvent::default()
        }
    }
}

/// An Event's name: `regarding`'s name and the time in hex nanoseconds, as client-go names
/// them, the name cut so that the whole stays within the 253 characters a name may have.
fn event_name(regarding: &str, now: Timestamp) -> String {
    let suffix = format!(".{:x}", now.as_nanosecond());
    let room = 253usize.saturating_sub(suffix.len());
    let mut cut = regarding.get(..room).unwrap_or(regarding);
    // A name is lowercase letters, digits, '-' and '.', and each part ends with a letter or
    // digit.
    cut = cut.trim_end_matches(['-', '.']);
    format!("{cut}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_stay_valid_however_long_the_objects_name() {
        let now = Timestamp::from_nanosecond(0x1234).unwrap();
        assert_eq!(event_name("web", now), "web.1234");
        let long = format!("{}-{}", "a".repeat(240), "b".repeat(12));
        let name = event_name(&long, now);
        assert!(name.len() <= 253, "{}", name.len());
        assert!(name.ends_with(".1234"));
        let awkward = format!("{}-.x", "a".repeat(247));
        assert_eq!(
            event_name(&awkward, now),
            format!("{}.1234", "a".repeat(247))
        );
    }
}
