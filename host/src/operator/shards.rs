//! Shards, each on a Lease of its own (`--shards K`): which ones this replica holds, and a
//! pipeline (watches, controllers, caches) for each.
//!
//! One task per replica campaigns for every shard. Each round, every [`RETRY`], it:
//! 1. lists this operator's Leases (one request), and judges each expired by its own clock, as
//!    the single leader's election does: when its record has not changed for its duration. A
//!    watch on the same Leases notes each change when it comes, so that a Lease expires its
//!    duration after its holder's last renewal, not after the first round to list it;
//! 2. renews the shards it holds, all at once, each a compare-and-swap on the resourceVersion
//!    listed; one not answered by the round's deadline counts as failed, the others' are
//!    recorded. Each shard has its own [`Fence`]: its writes stop when its renewals have failed
//!    for [`RENEW_DEADLINE`], before its Lease can expire and another replica take it;
//! 3. renews this replica's member Lease, `<lease>-member-<hash of identity>`: the member Leases
//!    say how many replicas there are, so that each holds its fair share, ceil(K / replicas),
//!    counting those still renewing (a member Lease changed within [`WARM_AFTER`]): one that
//!    stopped, its member Lease not yet expired, neither holds back the take of its shards nor
//!    makes another give them back. It comes after the shards' renewals, and only when each
//!    shard it still holds was renewed, so that a replica whose rounds end before them (killed
//!    between the two, or too slow for a round's deadline) or whose renewals fail stops counting
//!    as renewing no later than its shards' Leases stop being renewed;
//! 4. gives back one shard when it holds more than its share (a replica joined): that shard's
//!    reconciliations end first, then its Lease is released for another to take at once;
//! 5. takes free or expired shards up to its share: a replica that died (killed, cut off) is
//!    replaced within the Lease's duration, without a person. It takes none while a Lease of
//!    another shard count (or the single leader's Lease) is held by someone: replicas of two
//!    shard counts never serve at once, so a reshard waits for the old replicas to go.
//!
//! A shard taken is served once a round right after the take confirms that no Lease of another
//! shard count (or the single leader's) was taken meanwhile; its pipeline starts at the take, so
//! its watches list while that round runs, and it writes nothing until it is confirmed. When a
//! Lease this replica could take is about to expire, the next round comes at its expiry rather
//! than up to a [`RETRY`] later; when one is released (its holder gave it back), at once.
//!
//! Which resources a shard serves is `shard`'s.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::WatchStreamExt;
use tokio::sync::{mpsc, watch};

use super::lease::{
    Fence, LEASE_DURATION, Observed, RENEW_DEADLINE, RETRY, WRITE_TIMEOUT, duration_of,
};
use super::shard::{Shard, Sharding};
use super::{Error, Metrics, Registry, Settings};

/// On each of this operator's Leases: the name of its single leader's Lease (`--lease-name`).
pub(super) const OF_LABEL: &str = "wasm-operator.dev/lease-of";
/// On each of this operator's Leases: `shard` or `member`.
pub(super) const ROLE_LABEL: &str = "wasm-operator.dev/lease-role";
/// On a shard's Lease: the shard count of the replica that last took it.
const SHARDS_ANNOTATION: &str = "wasm-operator.dev/shards";

/// How long another replica's shard Lease must have gone unrenewed, by our clock, before this
/// replica (which would take it) starts that shard's pipeline: watching, its fence closed, so
/// that its caches have listed by the time the Lease expires and is taken. Renewals come every
/// [`RETRY`]: five missed mean the holder is gone or cut off, and it stops writing at
/// [`RENEW_DEADLINE`] after its last renewal anyway.
const WARM_AFTER: Duration = RENEW_DEADLINE;

/// What a round leaves, before its deadline ([`RETRY`]), to record the shards' renewals: one
/// not answered by then counts as failed, and the others' are recorded.
const RECORD_MARGIN: Duration = Duration::from_millis(250);

/// The longest `--lease-name` sharding takes: it is a label's value on every Lease.
pub const MAX_LEASE_NAME: usize = 63;

/// The Lease of shard `index`.
pub fn shard_lease(base: &str, index: u32) -> String {
    format!("{base}-shard-{index}")
}

/// The shard whose Lease is `name` ([`shard_lease`]'s inverse).
fn shard_index(base: &str, name: &str) -> Option<u32> {
    name.strip_prefix(base)?
        .strip_prefix("-shard-")
        .and_then(super::shard::label_value)
}

/// This replica's member Lease: named by a hash of its identity, which may be long or hold
/// characters a name may not.
fn member_lease(base: &str, identity: &str) -> String {
    format!(
        "{base}-member-{:016x}",
        super::shard::fnv1a(identity.as_bytes())
    )
}

/// What a shard's pipeline is told to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    /// Serve the shard.
    Leading,
    /// Finish and stop: the shard is given to another replica once its pipeline has ended.
    Yield,
    /// Stop: the Lease was lost (its fence has closed already).
    Lost,
}

/// A shard taken: its pipeline starts at once, its watches listing while the take waits to be
/// confirmed; it writes and reconciles nothing before `serving` turns true.
pub(super) struct Won {
    pub index: u32,
    /// Tells this holding from an earlier one of the same shard.
    pub term: u64,
    pub fence: Arc<Fence>,
    pub role: watch::Receiver<Role>,
    /// Turns true when the take is confirmed (the fence opens then); closed without turning
    /// true when the shard is given back unserved.
    pub serving: watch::Receiver<bool>,
}

/// What the run loop tells the campaign.
pub(super) enum Ctl {
    /// The pipeline of this holding of a shard has ended: release its Lease if still held.
    Stopped { index: u32, term: u64 },
    /// One of this operator's Leases as the watch on them saw it change, when it did.
    Seen(Box<Lease>),
    /// The operator stops: release everything.
    Quit,
}

/// A shard held: its pipeline, and its Lease's renewals.
struct Held {
    pipeline: Pipeline,
    /// When the last renewal that succeeded was asked for.
    renewed: Instant,
    /// Whether the round after it was taken confirmed that no replica of another shard count
    /// (or a single leader) took a Lease meanwhile: only then is the shard served. (Each side
    /// looks before it takes, and the later of two that took at once sees the other's Lease
    /// when it confirms.)
    confirmed: bool,
}

/// A shard's pipeline, as the campaign steers it: started at the take, or before it for a
/// Lease about to expire ([`WARM_AFTER`]).
struct Pipeline {
    /// Tells this pipeline from an earlier one of the same shard.
    term: u64,
    fence: Arc<Fence>,
    role: watch::Sender<Role>,
    /// Tells the pipeline its take is confirmed.
    serving: watch::Sender<bool>,
}

struct Campaign {
    api: Api<Lease>,
    base: String,
    identity: String,
    member: String,
    sharding: Sharding,
    /// Where this replica starts looking for a shard to take, so that replicas starting at
    /// once do not all race for shard 0.
    offset: u32,
    seen: Observed,
    held: BTreeMap<u32, Held>,
    /// Shards about to expire whose pipeline runs already, unserved.
    warming: BTreeMap<u32, Pipeline>,
    terms: u64,
    /// Rounds that listed the Leases.
    rounds: u64,
    /// A shard was taken this round: the next round, which confirms it, comes at once.
    took: bool,
    /// When the first Lease of another replica's that this replica could take expires by our
    /// clock: a round is held then, not up to a [`RETRY`] later.
    expiry: Option<Instant>,
    /// This replica's fair share at the last round: a shard's Lease released while it holds
    /// fewer brings a round at once.
    share: usize,
    won: mpsc::UnboundedSender<Won>,
    metrics: Arc<Metrics>,
    /// Turns true when the operator stops: no shard is taken from then on.
    stop: watch::Receiver<bool>,
}

fn now_micro() -> MicroTime {
    MicroTime(Timestamp::now())
}

fn holder_of(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty())
}

impl Campaign {
    /// Whether `lease` is held by someone whose renewals we still see ([`Observed::live`]).
    fn live(&mut self, lease: &Lease, now: Instant) -> bool {
        self.seen.live(lease, now)
    }

    /// Whether `lease`'s record changed within its duration, by our clock, held or not (after
    /// [`Self::live`] has seen it this round).
    fn changed_within(&self, lease: &Lease, now: Instant) -> bool {
        self.seen
            .get(&lease.name_any())
            .is_some_and(|(_, at)| now.duration_since(*at) < duration_of(lease))
    }

    fn shard_spec(&self, acquire: Option<MicroTime>, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(LEASE_DURATION.as_secs() as i32),
            acquire_time: acquire,
            renew_time: Some(now_micro()),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    fn shard_meta(&self, index: u32, mut meta: ObjectMeta) -> ObjectMeta {
        meta.name = Some(shard_lease(&self.base, index));
        meta.labels.get_or_insert_default().extend([
            (OF_LABEL.to_owned(), self.base.clone()),
            (ROLE_LABEL.to_owned(), "shard".to_owned()),
        ]);
        meta.annotations.get_or_insert_default().insert(
            SHARDS_ANNOTATION.to_owned(),
            self.sharding.count.to_string(),
        );
        meta
    }

    async fn renew_member(&self) -> Result<(), kube::Error> {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.member.clone()),
                labels: Some(
                    [
                        (OF_LABEL.to_owned(), self.base.clone()),
                        (ROLE_LABEL.to_owned(), "member".to_owned()),
                    ]
                    .into(),
                ),
                annotations: Some(
                    [(
                        SHARDS_ANNOTATION.to_owned(),
                        self.sharding.count.to_string(),
                    )]
                    .into(),
                ),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.identity.clone()),
                lease_duration_seconds: Some(LEASE_DURATION.as_secs() as i32),
                renew_time: Some(now_micro()),
                ..LeaseSpec::default()
            }),
        };
        let params = PatchParams::apply(crate::ownership::FIELD_MANAGER).force();
        self.api
            .patch(&self.member, &params, &Patch::Apply(&lease))
            .await?;
        Ok(())
    }

    /// One round (see the module's documentation), begun at `attempt`.
    async fn round(&mut self, attempt: Instant) {
        let params = ListParams::default().labels(&format!("{OF_LABEL}={}", self.base));
        let leases = match self.api.list(&params).await {
            Ok(list) => list.items,
            Err(e) => {
                tracing::warn!(identity = %self.identity, "could not list the shards' Leases: {e}");
                return;
            }
        };
        // The single leader's Lease (`--shards 1`, or an operator from before sharding).
        let single = match self.api.get_opt(&self.base).await {
            Ok(lease) => lease,
            Err(e) => {
                tracing::warn!(identity = %self.identity, "could not read the Lease {}: {e}", self.base);
                return;
            }
        };
        let now = Instant::now();
        // This replica, whatever its member Lease says: the list shows it as the last round
        // left it, expired after a stall.
        let mut members = 1usize;
        // The members renewed within [`WARM_AFTER`], this replica among them: the share it will
        // have once the others expire is what it readies for.
        let mut renewing_ids = vec![self.identity.clone()];
        // When the share first widens: another's member Lease stops counting as renewing, or
        // expires, by our clock.
        let mut member_expiry: Option<Instant> = None;
        let mut barrier = None;
        let mut shards: BTreeMap<u32, Lease> = BTreeMap::new();
        let mut stale_members = Vec::new();
        if let Some(lease) = &single {
            // Released (or expired) within its duration, as this replica saw it change: a
            // standby of one leader may be taking it. One from before `confirm_take` looks
            // for shards only before its take, so this replica waits until a standby would
            // have taken it. (Seen first as it is now, it was not seen to change.)
            let first = !self.seen.contains(&lease.name_any());
            if self.live(lease, now) {
                barrier = Some(format!(
                    "{} holds the Lease {} (one leader, no shards)",
                    holder_of(lease).unwrap_or_default(),
                    self.base
                ));
            } else if !first && self.changed_within(lease, now) {
                barrier = Some(format!(
                    "the Lease {} (one leader, no shards) was given up less than {:?} ago",
                    self.base,
                    duration_of(lease)
                ));
            }
        }
        for lease in leases {
            let live = self.live(&lease, now);
            let labels = lease.labels();
            match labels.get(ROLE_LABEL).map(String::as_str) {
                // This replica's own is counted already, and never deleted as stale.
                Some("member") if lease.name_any() == self.member => {}
                Some("member") => {
                    // Replicas of another shard count (a reshard under way) take no share here.
                    let same = lease.annotations().get(SHARDS_ANNOTATION)
                        == Some(&self.sharding.count.to_string());
                    if live && same {
                        members += 1;
                        let at = self.seen.get(&lease.name_any()).map(|(_, at)| *at);
                        if at.is_some_and(|at| now.duration_since(at) < WARM_AFTER)
                            && let Some(holder) = holder_of(&lease)
                        {
                            renewing_ids.push(holder.to_owned());
                        }
                        if let Some(at) = at {
                            // The share widens when the member stops counting as renewing,
                            // and again when its Lease expires.
                            for when in [at + WARM_AFTER, at + duration_of(&lease)] {
                                if when > now {
                                    member_expiry =
                                        Some(member_expiry.map_or(when, |e| e.min(when)));
                                }
                            }
                        }
                    } else if !live
                        && self.seen.get(&lease.name_any()).is_some_and(|(_, at)| {
                            now.duration_since(*at) > 4 * duration_of(&lease)
                        })
                    {
                        stale_members.push(lease);
                    }
                }
                Some("shard") => {
                    let annotations = lease.annotations();
                    let count = annotations
                        .get(SHARDS_ANNOTATION)
                        .and_then(|v| v.parse::<u32>().ok());
                    // From its name: what an annotation says could be edited.
                    let index = shard_index(&self.base, &lease.name_any());
                    let theirs = holder_of(&lease) != Some(self.identity.as_str());
                    if live && theirs && count != Some(self.sharding.count) {
                        barrier = Some(format!(
                            "{} holds the Lease {} of {} shards, not {}",
                            holder_of(&lease).unwrap_or_default(),
                            lease.name_any(),
                            count.map_or("an unknown number of".to_owned(), |c| c.to_string()),
                            self.sharding.count
                        ));
                    }
                    if let Some(index) = index.filter(|i| *i < self.sharding.count) {
                        shards.insert(index, lease);
                    }
                }
                _ => {}
            }
        }
        let renewed = self
            .renew_held(attempt, now, &shards, barrier.as_deref())
            .await;
        // After the shards', and only when each was renewed: a replica whose rounds end before
        // their renewals (killed, or too slow for the round's deadline) or whose renewals fail
        // stops counting as renewing no later than its shards' Leases stop being renewed.
        if renewed {
            if let Err(e) = self.renew_member().await {
                tracing::debug!(identity = %self.identity, "could not renew the member Lease: {e}");
            }
        } else {
            tracing::debug!(identity = %self.identity, "not renewing the member Lease: a shard's Lease was not renewed this round");
        }
        let fair = self
            .sharding
            .count
            .div_ceil(u32::try_from(members).unwrap_or(u32::MAX));
        let fair = usize::try_from(fair).unwrap_or(usize::MAX);

        let fair_soon = self
            .sharding
            .count
            .div_ceil(u32::try_from(renewing_ids.len()).unwrap_or(u32::MAX));
        let fair_soon = usize::try_from(fair_soon).unwrap_or(usize::MAX);
        // More than its share: one shard at a time is given back.
        let yielding = self
            .held
            .values()
            .any(|h| *h.pipeline.role.borrow() == Role::Yield);
        // Counting those renewing only (`fair_soon`): a replica that stopped renewing does not
        // make another give back a shard it took from it while its member Lease runs out.
        let share = fair.max(fair_soon);
        self.share = share;
        if self.held.len() > share
            && !yielding
            && let Some((index, held)) = self.held.iter().rev().find(|(_, h)| h.confirmed)
        {
            tracing::info!(identity = %self.identity, shard = index, replicas = members,
                "holding more than a fair share ({share}): giving shard {index} back once its reconciliations end");
            held.pipeline.role.send_replace(Role::Yield);
        }
        // Not in the first round: replicas that start together (a rollout, a scale-up) see each
        // other's member Lease first, so that none takes every shard only to give most back.
        // Nor once the operator stops.
        self.rounds += 1;
        if self.rounds == 1 || *self.stop.borrow() {
            self.warm(&shards, now, 0);
            return;
        }
        match &barrier {
            Some(why) => {
                if self.held.len() < fair {
                    tracing::info!(identity = %self.identity, "taking no shard: {why}");
                }
                self.warm(&shards, now, 0);
            }
            None => {
                // `share` is what it will hold once the Leases of those not renewing expire:
                // their shards' pipelines start now, and a round comes when the first Lease (a
                // shard's, or a member's that widens the share) expires.
                //
                // One replica readies the shards of those gone: of those renewing, the one
                // holding fewest shards (then the first identity), so that one pipeline, not
                // one per replica, lists them before the take.
                let held_by =
                    |id: &str| shards.values().filter(|l| holder_of(l) == Some(id)).count();
                let first = renewing_ids
                    .iter()
                    .map(|id| (held_by(id), id.as_str()))
                    .min()
                    .map(|(_, id)| id);
                let readies = first == Some(self.identity.as_str());
                // Expired Leases are left to it while it has room for them.
                let defer = !readies && first.is_some_and(|id| held_by(id) < share);
                // Expired Leases up to that share: a silent replica's shard is taken when its
                // Lease expires, not once its member Lease has expired too.
                if self.held.len() < share {
                    self.take(attempt, now, &shards, share, defer).await;
                }
                if self.held.len() < share {
                    self.expiry = [self.next_expiry(&shards, now), member_expiry]
                        .into_iter()
                        .flatten()
                        .filter(|e| *e > now)
                        .min();
                }
                self.warm(&shards, now, if readies { share } else { 0 });
            }
        }
        for lease in stale_members {
            let name = lease.name_any();
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    resource_version: lease.resource_version(),
                    uid: None,
                }),
                ..DeleteParams::default()
            };
            if self.api.delete(&name, &params).await.is_ok() {
                tracing::info!(lease = %name, "deleted the member Lease of a replica gone for good");
                self.seen.forget(&name);
            }
        }
    }

    /// Renews each shard held, as listed in `shards`, all at once (one slow answer holds up no
    /// other shard's renewal); confirms each taken last round when there is no `barrier`, else
    /// gives it back unserved. Whether every shard still held was renewed.
    async fn renew_held(
        &mut self,
        attempt: Instant,
        now: Instant,
        shards: &BTreeMap<u32, Lease>,
        barrier: Option<&str>,
    ) -> bool {
        let mut all = true;
        let mut renewals = Vec::new();
        // Each answer by the round's deadline, less the time to record them all: one that hangs
        // counts as a failed renewal, and the others' are recorded.
        let by = tokio::time::Instant::from_std(attempt + RETRY.saturating_sub(RECORD_MARGIN));
        let indices: Vec<u32> = self.held.keys().copied().collect();
        for index in indices {
            let name = shard_lease(&self.base, index);
            let api = self.api.clone();
            match shards.get(&index) {
                Some(lease) if holder_of(lease) == Some(self.identity.as_str()) => {
                    let mut updated = lease.clone();
                    let acquire = lease.spec.as_ref().and_then(|s| s.acquire_time.clone());
                    let transitions = lease
                        .spec
                        .as_ref()
                        .and_then(|s| s.lease_transitions)
                        .unwrap_or(0);
                    updated.spec = Some(self.shard_spec(acquire, transitions));
                    let renewal = async move {
                        let params = PostParams::default();
                        api.replace(&name, &params, &updated).await
                    };
                    renewals.push((index, false, renewal.boxed()));
                }
                Some(lease) => {
                    // Someone took it: our renewals failed for longer than its duration.
                    let holder = holder_of(lease).unwrap_or_default().to_owned();
                    if self.live(lease, now) {
                        tracing::warn!(identity = %self.identity, shard = index, %holder,
                            "another replica holds the shard's Lease; stopping the shard");
                        self.drop_shard(index, Role::Lost);
                    } else {
                        all = false;
                    }
                }
                None => {
                    // Deleted meanwhile: made again, still ours; if another replica made it
                    // first, this one stops at once.
                    let lease = Lease {
                        metadata: self.shard_meta(index, ObjectMeta::default()),
                        spec: Some(self.shard_spec(Some(now_micro()), 0)),
                    };
                    let made = async move {
                        let params = PostParams::default();
                        api.create(&params, &lease).await
                    };
                    renewals.push((index, true, made.boxed()));
                }
            }
        }
        let mut released = Vec::new();
        let answers = renewals
            .into_iter()
            .map(|(index, made, renewal)| async move {
                (index, made, tokio::time::timeout_at(by, renewal).await)
            });
        for (index, made, renewed) in futures::future::join_all(answers).await {
            let name = shard_lease(&self.base, index);
            let renewed = match renewed {
                Ok(renewed) => renewed,
                Err(_) => {
                    all = false;
                    tracing::warn!(identity = %self.identity, shard = index, "no answer renewing the shard's Lease within the round");
                    continue;
                }
            };
            match renewed {
                Ok(_) => {
                    let confirm = match self.held.get_mut(&index) {
                        Some(held) => {
                            held.renewed = attempt;
                            if held.confirmed {
                                held.pipeline.fence.extend(attempt + RENEW_DEADLINE);
                            }
                            !held.confirmed
                        }
                        None => false,
                    };
                    if confirm {
                        match barrier {
                            None => self.confirm(index, attempt),
                            Some(why) => {
                                tracing::info!(identity = %self.identity, shard = index,
                                    "giving back the shard just taken, unserved: {why}");
                                self.drop_shard(index, Role::Lost);
                                released.push(name);
                            }
                        }
                    }
                }
                Err(_) if made => {
                    tracing::warn!(identity = %self.identity, shard = index,
                        "the shard's Lease was deleted and could not be made again; stopping the shard");
                    self.drop_shard(index, Role::Lost);
                }
                Err(e) => {
                    all = false;
                    tracing::warn!(identity = %self.identity, shard = index, "could not renew the shard's Lease: {e}");
                }
            }
        }
        // Each on its own task: a slow release holds up neither the round nor another release.
        for name in released {
            let (api, identity) = (self.api.clone(), self.identity.clone());
            tokio::spawn(async move { release(&api, &name, &identity).await });
        }
        all
    }

    /// When the first of `shards` held by another replica expires by our clock (after `now`),
    /// if this replica may take one then; or, past that, when the [`RETRY`] it leaves to the
    /// replica that readied it ends (should that one not take it, the others do then, not at
    /// their next round).
    fn next_expiry(&self, shards: &BTreeMap<u32, Lease>, now: Instant) -> Option<Instant> {
        shards
            .iter()
            .filter(|(index, _)| !self.held.contains_key(index))
            .filter_map(|(_, lease)| {
                let (record, at) = self.seen.get(&lease.name_any())?;
                record.holder.as_ref()?;
                let expiry = *at + duration_of(lease);
                Some([expiry, expiry + RETRY])
            })
            .flatten()
            .filter(|expiry| *expiry > now)
            .min()
    }

    /// Takes free or expired shards until this replica holds `fair` of them. With `defer`, a
    /// Lease that expired (its holder silent) is left for a [`RETRY`] past its expiry to the
    /// replica that readies the silent replicas' shards (its pipeline listed already).
    async fn take(
        &mut self,
        attempt: Instant,
        now: Instant,
        shards: &BTreeMap<u32, Lease>,
        fair: usize,
        defer: bool,
    ) {
        let count = self.sharding.count;
        for step in 0..count {
            if self.held.len() >= fair {
                break;
            }
            let index = (self.offset + step) % count;
            if self.held.contains_key(&index) {
                continue;
            }
            let name = shard_lease(&self.base, index);
            let result = match shards.get(&index) {
                // Deleted while a replica held it: that one may still write until the Lease's
                // duration has passed since its last renewal seen.
                None if self.seen.get(&name).is_some_and(|(r, at)| {
                    r.holder.is_some() && now.duration_since(*at) < LEASE_DURATION
                }) =>
                {
                    continue;
                }
                None => {
                    let lease = Lease {
                        metadata: self.shard_meta(index, ObjectMeta::default()),
                        spec: Some(self.shard_spec(Some(now_micro()), 0)),
                    };
                    self.api.create(&PostParams::default(), &lease).await
                }
                Some(lease) => {
                    if self.live(lease, now) {
                        continue;
                    }
                    let readied_elsewhere = defer
                        && holder_of(lease).is_some()
                        && self.seen.get(&name).is_some_and(|(_, at)| {
                            now.duration_since(*at) < duration_of(lease) + RETRY
                        });
                    if readied_elsewhere {
                        continue;
                    }
                    let transitions = lease
                        .spec
                        .as_ref()
                        .and_then(|s| s.lease_transitions)
                        .unwrap_or(0)
                        .saturating_add(1);
                    let mut updated = lease.clone();
                    updated.metadata = self.shard_meta(index, lease.metadata.clone());
                    updated.spec = Some(self.shard_spec(Some(now_micro()), transitions));
                    // The resourceVersion listed makes it a compare-and-swap: of two replicas
                    // taking one expired Lease, one wins.
                    self.api
                        .replace(&name, &PostParams::default(), &updated)
                        .await
                }
            };
            match result {
                Ok(_) => self.won(index, attempt),
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => {
                    tracing::warn!(identity = %self.identity, shard = index, "could not take the shard's Lease: {e}");
                }
            }
        }
    }

    /// Holds shard `index`, taken at `attempt`: renewed from now on, its pipeline started (its
    /// watches list meanwhile, its fence closed), served once confirmed.
    fn won(&mut self, index: u32, attempt: Instant) {
        let warm = self.warming.remove(&index);
        let started = warm.is_some();
        let pipeline = warm.unwrap_or_else(|| self.start_pipeline(index));
        self.held.insert(
            index,
            Held {
                pipeline,
                renewed: attempt,
                confirmed: false,
            },
        );
        self.took = true;
        if started {
            tracing::info!(identity = %self.identity, shard = index, "took the shard's Lease, its watches started already; serving it once the next round confirms");
        } else {
            tracing::info!(identity = %self.identity, shard = index, "took the shard's Lease; its watches start, serving it once the next round confirms");
        }
    }

    /// Starts a pipeline for shard `index`, unserved and its fence closed.
    fn start_pipeline(&mut self, index: u32) -> Pipeline {
        self.terms += 1;
        let (role, _) = watch::channel(Role::Leading);
        let (serving, _) = watch::channel(false);
        let started = Pipeline {
            term: self.terms,
            fence: Fence::closed(),
            role,
            serving,
        };
        let _ = self.won.send(Won {
            index,
            term: started.term,
            fence: started.fence.clone(),
            role: started.role.subscribe(),
            serving: started.serving.subscribe(),
        });
        started
    }

    /// Whether `lease`, another replica's, has gone unrenewed for [`WARM_AFTER`] by our clock
    /// (after [`Self::live`] has seen it this round).
    fn abandoned(&self, lease: &Lease, now: Instant) -> bool {
        holder_of(lease).is_some_and(|h| h != self.identity)
            && self
                .seen
                .get(&lease.name_any())
                .is_some_and(|(_, at)| now.duration_since(*at) >= WARM_AFTER)
    }

    /// Starts the pipeline of each shard of `shards` that this replica would take (within its
    /// `fair` share) and whose Lease is [`Self::abandoned`]; stops those warming whose Lease was
    /// renewed or taken by another since, and every one when this replica holds `fair` already.
    fn warm(&mut self, shards: &BTreeMap<u32, Lease>, now: Instant, fair: usize) {
        let cold: Vec<u32> = self
            .warming
            .keys()
            .copied()
            .filter(|i| {
                self.held.len() >= fair || !shards.get(i).is_some_and(|l| self.abandoned(l, now))
            })
            .collect();
        for index in cold {
            if let Some(w) = self.warming.remove(&index) {
                tracing::info!(identity = %self.identity, shard = index, "the shard's Lease was renewed or taken: its watches stop");
                w.role.send_replace(Role::Lost);
            }
        }
        for (index, lease) in shards {
            if self.held.len() + self.warming.len() >= fair {
                break;
            }
            if self.held.contains_key(index)
                || self.warming.contains_key(index)
                || !self.abandoned(lease, now)
            {
                continue;
            }
            tracing::info!(identity = %self.identity, shard = index, holder = holder_of(lease).unwrap_or_default(),
                "the shard's Lease has not been renewed for {WARM_AFTER:?}: its watches start, to serve it once the Lease expires and is taken");
            let started = self.start_pipeline(*index);
            self.warming.insert(*index, started);
        }
    }

    /// Serves shard `index`, renewed at `attempt`: its fence opens and its pipeline, started at
    /// the take, reconciles.
    fn confirm(&mut self, index: u32, attempt: Instant) {
        let Some(held) = self.held.get_mut(&index) else {
            return;
        };
        held.confirmed = true;
        held.pipeline.fence.extend(attempt + RENEW_DEADLINE);
        tracing::info!(identity = %self.identity, shard = index, "serving the shard");
        self.metrics.set_shard(index, true);
        self.metrics
            .set_leader(&shard_lease(&self.base, index), true);
        held.pipeline.serving.send_replace(true);
    }

    /// Stops writing for shard `index` at once and forgets it, its pipeline told why.
    fn drop_shard(&mut self, index: u32, role: Role) {
        if let Some(held) = self.held.remove(&index) {
            held.pipeline.fence.close();
            held.pipeline.role.send_replace(role);
            self.metrics.set_shard(index, false);
            self.metrics
                .set_leader(&shard_lease(&self.base, index), false);
        }
    }

    /// Closes the fence of each shard whose renewals have failed for [`RENEW_DEADLINE`].
    fn check_deadlines(&mut self) {
        let late: Vec<u32> = self
            .held
            .iter()
            .filter(|(_, h)| h.renewed.elapsed() >= RENEW_DEADLINE)
            .map(|(i, _)| *i)
            .collect();
        for index in late {
            tracing::error!(identity = %self.identity, shard = index,
                "no renewal for {RENEW_DEADLINE:?}: stopped writing, giving the shard up before its Lease can expire");
            self.drop_shard(index, Role::Lost);
        }
    }

    /// Notes `lease` as the watch brought it, now: a renewal counts from when its event came,
    /// not from the next round's list (up to a [`RETRY`] later), so that a Lease expires by our
    /// clock its duration after its holder's last renewal (later, never sooner). Whether a
    /// round should come at once: a shard's Lease held by another was released just now, while
    /// this replica holds less than its share, past its first round (in which replicas that
    /// start together see each other first). A Lease seen released already (the watch's first
    /// list, a relist) brings no round.
    fn see(&mut self, lease: &Lease) -> bool {
        let name = lease.name_any();
        let was_held = self
            .seen
            .get(&name)
            .is_some_and(|(record, _)| record.holder.is_some());
        let (holder, _) = self.seen.see(lease, Instant::now());
        let index = shard_index(&self.base, &name).filter(|i| *i < self.sharding.count);
        was_held
            && holder.is_none()
            && index.is_some_and(|i| !self.held.contains_key(&i))
            && lease.labels().get(ROLE_LABEL).map(String::as_str) == Some("shard")
            && self.rounds >= 2
            && self.held.len() < self.share
            && !*self.stop.borrow()
    }

    async fn run(mut self, mut ctl: mpsc::UnboundedReceiver<Ctl>) {
        loop {
            let attempt = Instant::now();
            // A request that hangs (a partition) must not hold the loop past the deadline.
            if tokio::time::timeout(RETRY, self.round(attempt))
                .await
                .is_err()
            {
                tracing::warn!(identity = %self.identity, "no answer within {RETRY:?} from the API server about the shards");
            }
            self.check_deadlines();
            // A shard just taken is confirmed by a round at once (each side of a race looks
            // after its own take, so the later one sees the earlier); a Lease about to expire
            // is taken when it does.
            let expiry = self.expiry.take();
            let next = if std::mem::take(&mut self.took) {
                Instant::now()
            } else {
                let periodic = attempt + RETRY;
                expiry
                    .filter(|e| *e > Instant::now())
                    .map_or(periodic, |e| e.min(periodic))
            };
            loop {
                tokio::select! {
                    _ = tokio::time::sleep_until(next.into()) => break,
                    msg = ctl.recv() => match msg {
                        Some(Ctl::Seen(lease)) => {
                            if self.see(&lease) {
                                break;
                            }
                        }
                        Some(Ctl::Stopped { index, term }) => {
                            // A pipeline started early that ended by itself: a take starts
                            // another.
                            if self.warming.get(&index).is_some_and(|w| w.term == term) {
                                self.warming.remove(&index);
                            }
                            if self.held.get(&index).is_some_and(|h| h.pipeline.term == term) {
                                self.drop_shard(index, Role::Yield);
                                // A request of the pipeline may still be on its way (its
                                // report workers are stopped, not waited for): released once
                                // any would have ended, so that the next holder writes after it.
                                let (api, identity) = (self.api.clone(), self.identity.clone());
                                let name = shard_lease(&self.base, index);
                                tokio::spawn(async move {
                                    tokio::time::sleep(WRITE_TIMEOUT).await;
                                    release(&api, &name, &identity).await;
                                });
                            }
                        }
                        Some(Ctl::Quit) | None => {
                            for (_, w) in std::mem::take(&mut self.warming) {
                                w.role.send_replace(Role::Lost);
                            }
                            let held: Vec<u32> = self.held.keys().copied().collect();
                            for index in &held {
                                self.drop_shard(*index, Role::Yield);
                            }
                            if !held.is_empty() {
                                tokio::time::sleep(WRITE_TIMEOUT).await;
                            }
                            for index in held {
                                release(&self.api, &shard_lease(&self.base, index), &self.identity)
                                    .await;
                            }
                            let _ = tokio::time::timeout(
                                RETRY,
                                self.api.delete(&self.member, &DeleteParams::default()),
                            )
                            .await;
                            return;
                        }
                    }
                }
            }
        }
    }
}

/// Releases the Lease `name` if `identity` holds it, so that another replica takes it at once
/// (else it expires).
async fn release(api: &Api<Lease>, name: &str, identity: &str) {
    match tokio::time::timeout(RETRY, super::lease::release(api, name, identity)).await {
        Ok(Ok(())) => tracing::info!(%identity, lease = %name, "released the shard's Lease"),
        Ok(Err(e)) => {
            tracing::warn!(%identity, lease = %name, "could not release the shard's Lease (it expires): {e}")
        }
        Err(_) => {
            tracing::warn!(%identity, lease = %name, "no answer releasing the shard's Lease (it expires)")
        }
    }
}

/// How long ago `lease` was renewed, by this machine's clock.
fn renewed_ago(lease: &Lease) -> Option<k8s_openapi::jiff::SignedDuration> {
    let renewed = lease.spec.as_ref()?.renew_time.as_ref()?.0;
    Some(k8s_openapi::jiff::Timestamp::now().duration_since(renewed))
}

/// Tells the campaign of each change to this operator's Leases (those labelled with `selector`)
/// as the API server sends it. The rounds' lists go on regardless: should the watch fail (a Role
/// from before it, without `watch`), renewals are seen as they were, up to a [`RETRY`] late.
async fn watch_leases(
    api: Api<Lease>,
    _place: crate::connection::WatchPlace,
    selector: String,
    ctl: mpsc::UnboundedSender<Ctl>,
) {
    let mut failing = false;
    let mut changes = std::pin::pin!(
        kube::runtime::watcher(
            api,
            kube::runtime::watcher::Config::default().labels(&selector)
        )
        .default_backoff()
        .applied_objects()
    );
    while let Some(change) = changes.next().await {
        match change {
            Ok(lease) => {
                failing = false;
                tracing::debug!(lease = %lease.name_any(), lag = ?renewed_ago(&lease),
                    "the watch showed a Lease");
                if ctl.send(Ctl::Seen(Box::new(lease))).is_err() {
                    return;
                }
            }
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(
                    "the watch of the shards' Leases failed (renewals are seen at each round's list until it is back): {e}"
                );
            }
            Err(_) => {}
        }
    }
}

/// Runs the operator as one of the replicas sharing `sharding`'s shards, until `stop` turns
/// true: each shard taken gets a pipeline of its own ([`super::run::lead`]), which ends when the
/// shard is lost or given back.
pub(super) async fn serve(
    client: kube::Client,
    leases: kube::Client,
    registry: Registry,
    settings: Settings,
    sharding: Sharding,
    replica: super::run::Replica,
    stop: watch::Receiver<bool>,
) -> Result<(), Error> {
    let metrics = replica.metrics.clone();
    for index in 0..sharding.count {
        metrics.set_shard(index, false);
    }
    // Ready from the start, as a standby is: a replica holding no shard is one in waiting.
    metrics.set_ready(true);
    // Plugins served as `Plugin` resources are prepared all along, as a standby does: a shard
    // taken serves them at once, with no pull or compile.
    let standby = settings.plugin_resources.as_ref().map(|live| {
        super::plugins::Standby::start(
            &replica.watches,
            live.clone(),
            registry.context().clone(),
            metrics.clone(),
        )
    });
    let api: Api<Lease> = Api::namespaced(leases, &settings.lease_namespace);
    let (won_tx, mut won) = mpsc::unbounded_channel();
    let (ctl, ctl_rx) = mpsc::unbounded_channel();
    let campaign = Campaign {
        api: api.clone(),
        base: settings.lease_name.clone(),
        identity: settings.identity.clone(),
        member: member_lease(&settings.lease_name, &settings.identity),
        sharding,
        offset: u32::try_from(
            super::shard::fnv1a(settings.identity.as_bytes()) % u64::from(sharding.count),
        )
        .unwrap_or(0),
        seen: Observed::default(),
        held: BTreeMap::new(),
        warming: BTreeMap::new(),
        terms: 0,
        rounds: 0,
        took: false,
        expiry: None,
        share: 0,
        won: won_tx,
        metrics: metrics.clone(),
        stop: stop.clone(),
    };
    tracing::info!(identity = %settings.identity, shards = sharding.count, by = %sharding.by,
        "campaigning for a fair share of the shards");
    let campaign = tokio::spawn(campaign.run(ctl_rx));
    let place = replica.watches.place();
    let lease_watch = tokio::spawn(watch_leases(
        Api::namespaced(place.client(), &settings.lease_namespace),
        place,
        format!("{OF_LABEL}={}", settings.lease_name),
        ctl.clone(),
    ));
    let (ended_tx, mut ended) = mpsc::unbounded_channel::<(u32, u64, Result<(), Error>)>();
    let mut running = Vec::new();
    let mut stopping = stop.clone();
    loop {
        tokio::select! {
            Some(w) = won.recv() => {
                let Won { index, term, fence, mut role, serving } = w;
                let mut shard_settings = settings.clone();
                shard_settings.shard = Some(Shard { sharding, index });
                let (client, registry, ended_tx) =
                    (client.clone(), registry.clone(), ended_tx.clone());
                let replica = replica.clone();
                let mut stop = stop.clone();
                let stopped = async move {
                    tokio::select! {
                        _ = role.wait_for(|r| *r != Role::Leading) => {}
                        _ = stop.wait_for(|s| *s) => {}
                    }
                };
                let prefetched = standby.as_ref().map(|s| s.snapshot()).unwrap_or_default();
                running.retain(|h: &tokio::task::JoinHandle<()>| !h.is_finished());
                running.push(tokio::spawn(async move {
                    // On a task of its own: should it panic, the shard is still given back.
                    let pipeline = tokio::spawn(async move {
                        super::run::lead(
                            client,
                            registry,
                            replica,
                            &shard_settings,
                            super::run::Holding { fence, serving },
                            prefetched,
                            stopped,
                        )
                        .await
                    });
                    let result = match pipeline.await {
                        Ok(result) => result,
                        Err(e) => {
                            tracing::error!(shard = index, "the shard's pipeline panicked: {e}");
                            Ok(())
                        }
                    };
                    tracing::info!(shard = index, "stopped serving the shard");
                    let _ = ended_tx.send((index, term, result));
                }));
            }
            Some((index, term, result)) = ended.recv() => {
                if let Err(e) = result {
                    tracing::error!(shard = index, "the shard's pipeline failed: {e}");
                }
                let _ = ctl.send(Ctl::Stopped { index, term });
            }
            _ = stopping.wait_for(|s| *s) => break,
        }
    }
    // Every pipeline sees the stop too: each finishes its reconciliations, then every Lease is
    // released.
    for pipeline in running {
        let _ = pipeline.await;
    }
    if let Some(standby) = standby {
        standby.stop();
    }
    lease_watch.abort();
    let _ = ctl.send(Ctl::Quit);
    let _ = campaign.await;
    metrics.set_ready(false);
    Ok(())
}
