//! Leader election on a Lease, with a renew deadline that fences writes.
//!
//! A leader renews the Lease every [`RETRY`]. If it cannot renew for [`RENEW_DEADLINE`] (it is
//! cut off from the API server, say), it stops writing at once and steps down, before the Lease
//! can expire ([`LEASE_DURATION`]) and another replica take it: two replicas never write at the
//! same time. The [`Fence`] is checked on every write, so it holds even while the elector's own
//! task waits on a request that will never return.
//!
//! A standby judges the Lease expired by its own clock: when the record (holder and renew time)
//! has not changed for the Lease's duration since it last saw it change, as client-go does, so
//! clocks that disagree between nodes do not matter.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use tokio::sync::watch;

/// How long a Lease holds without renewal.
pub const LEASE_DURATION: Duration = Duration::from_secs(15);
/// How long a leader may fail to renew before it stops writing: shorter than the Lease's
/// duration by enough to finish what is in flight.
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// How often the Lease is renewed or tried for.
pub const RETRY: Duration = Duration::from_secs(2);

/// With leader election, how long any request of a reconciliation (an apply, a delete, a status,
/// an event, a CRD, a read on the way) may take before it is abandoned (a Lease request may take
/// [`RETRY`]): shorter than the gap between the renew deadline and the Lease's
/// expiry, so that a write let through just before the fence closed is over, one way or the
/// other, before another replica may lead.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(4);

// Renewed at t, a leader stops writing at t + RENEW_DEADLINE; another replica may take the Lease
// at t + LEASE_DURATION at the earliest, by its own clock, and a last try may be in flight.
const _: () = assert!(RENEW_DEADLINE.as_secs() + RETRY.as_secs() < LEASE_DURATION.as_secs());
// A write the fence let through at t + RENEW_DEADLINE ends by then too.
const _: () =
    assert!(RENEW_DEADLINE.as_secs() + WRITE_TIMEOUT.as_secs() < LEASE_DURATION.as_secs());

/// Runs `call`, a request, for at most [`WRITE_TIMEOUT`]: one that hangs (its connection held
/// open by a network that answers nothing) is abandoned with an error, and what waits for it (a
/// write slot, a reconciliation, a shutdown) is not held up.
async fn bounded<T>(
    call: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, kube::Error> {
    match tokio::time::timeout(WRITE_TIMEOUT, call).await {
        Ok(result) => result,
        Err(_) => Err(kube::Error::Service(Box::new(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "no answer within {WRITE_TIMEOUT:?}: abandoned (a write may take no longer, so that it ends before another replica may lead)"
            ),
        )))),
    }
}

/// Whether this replica may write now. Without leader election it always may.
#[derive(Debug)]
pub struct Fence {
    base: Instant,
    /// Milliseconds since `base` until which writes are allowed; `u64::MAX` without election.
    until_ms: AtomicU64,
}

impl Fence {
    /// A fence that never closes (no leader election).
    pub fn open() -> Arc<Self> {
        Arc::new(Self {
            base: Instant::now(),
            until_ms: AtomicU64::new(u64::MAX),
        })
    }

    /// A fence that is closed until the Lease is first won.
    pub(super) fn closed() -> Arc<Self> {
        Arc::new(Self {
            base: Instant::now(),
            until_ms: AtomicU64::new(0),
        })
    }

    /// Whether a write may be sent now.
    pub fn allows(&self) -> bool {
        let now = u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX);
        now < self.until_ms.load(Ordering::Acquire)
    }

    /// Allows writes until `until`.
    pub(super) fn extend(&self, until: Instant) {
        let ms = until.saturating_duration_since(self.base).as_millis();
        self.until_ms
            .store(u64::try_from(ms).unwrap_or(u64::MAX), Ordering::Release);
    }

    pub(super) fn close(&self) {
        self.until_ms.store(0, Ordering::Release);
    }

    /// Runs `call`, a request of this replica: with leader election, for at most
    /// [`WRITE_TIMEOUT`], so that one let through before the fence closed is over before another
    /// replica may lead; without, as long as it takes (an admission webhook may take its 10 s).
    pub async fn bounded<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, kube::Error> {
        if self.until_ms.load(Ordering::Acquire) == u64::MAX {
            call.await
        } else {
            bounded(call).await
        }
    }
}

/// A Lease's record: who holds it, and when they last renewed it (as written).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Record {
    pub(super) holder: Option<String>,
    renew: Option<String>,
}

/// Each Lease as last seen, and when its record last changed by our clock: a Lease is judged by
/// its own duration counted from then, never by another machine's clock (as client-go's leader
/// election does).
#[derive(Debug, Default)]
pub(super) struct Observed(std::collections::BTreeMap<String, (Record, Instant)>);

impl Observed {
    /// Notes `lease` as seen at `now`: its holder, and since when its record has been as it is
    /// (`now` when it changed, or is seen first).
    pub(super) fn see(&mut self, lease: &Lease, now: Instant) -> (Option<String>, Instant) {
        let spec = lease.spec.as_ref();
        let record = Record {
            holder: spec
                .and_then(|s| s.holder_identity.clone())
                .filter(|h| !h.is_empty()),
            renew: spec.and_then(|s| s.renew_time.as_ref().map(|t| t.0.to_string())),
        };
        let name = lease.metadata.name.clone().unwrap_or_default();
        let since = match self.0.get(&name) {
            Some((r, at)) if *r == record => *at,
            _ => {
                tracing::debug!(lease = %name, holder = ?record.holder, renewed = ?record.renew,
                    "a Lease seen changed");
                now
            }
        };
        let holder = record.holder.clone();
        self.0.insert(name, (record, since));
        (holder, since)
    }

    /// Whether `lease` is held by someone whose renewals we still see: a holder, and a record
    /// that changed within its duration (noting it, as [`Self::see`]).
    pub(super) fn live(&mut self, lease: &Lease, now: Instant) -> bool {
        let (holder, since) = self.see(lease, now);
        holder.is_some() && now.duration_since(since) < duration_of(lease)
    }

    /// The Lease `name` as last seen, and since when its record has been so.
    pub(super) fn get(&self, name: &str) -> Option<&(Record, Instant)> {
        self.0.get(name)
    }

    pub(super) fn contains(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    pub(super) fn forget(&mut self, name: &str) {
        self.0.remove(name);
    }
}

/// The duration `lease` says it has ([`LEASE_DURATION`] when it says none).
pub(super) fn duration_of(lease: &Lease) -> Duration {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.lease_duration_seconds)
        .and_then(|d| u64::try_from(d).ok())
        .map_or(LEASE_DURATION, Duration::from_secs)
}

/// Campaigns for the Lease `namespace/name` as `identity`. Returns whether this replica leads
/// (true while it does; false for good once it stepped down), the fence its writes check, and
/// the task, which releases the Lease when every receiver is dropped.
pub fn elect(
    client: kube::Client,
    namespace: &str,
    name: &str,
    identity: &str,
) -> (
    watch::Receiver<bool>,
    Arc<Fence>,
    tokio::task::JoinHandle<()>,
) {
    let api: Api<Lease> = Api::namespaced(client, namespace);
    let fence = Fence::closed();
    let (tx, rx) = watch::channel(false);
    let task = tokio::spawn(campaign(
        api,
        name.to_owned(),
        identity.to_owned(),
        tx,
        fence.clone(),
    ));
    (rx, fence, task)
}

async fn campaign(
    api: Api<Lease>,
    name: String,
    identity: String,
    leading: watch::Sender<bool>,
    fence: Arc<Fence>,
) {
    let mut seen = Observed::default();
    let mut shards_seen = Observed::default();
    let mut last_renewal: Option<Instant> = None;
    loop {
        if leading.is_closed() {
            break;
        }
        let attempt = Instant::now();
        // A request that hangs (a partition) must not hold the loop past the deadline.
        let result = tokio::time::timeout(
            RETRY,
            try_acquire(
                &api,
                &name,
                &identity,
                last_renewal.is_some(),
                &mut seen,
                &mut shards_seen,
            ),
        )
        .await
        .unwrap_or(Err(AttemptError::NoAnswer(RETRY)));
        match result {
            Ok(true) => {
                if last_renewal.is_none() {
                    tracing::info!(%identity, lease = %name, "acquired the Lease");
                }
                // Valid from when we asked: others count the Lease's duration from no earlier.
                last_renewal = Some(attempt);
                fence.extend(attempt + RENEW_DEADLINE);
                leading.send_if_modified(|l| !std::mem::replace(l, true));
            }
            Ok(false) => {
                if last_renewal.is_some() {
                    // Another replica holds it: we lost it (our renewals failed for too long).
                    fence.close();
                    tracing::warn!(%identity, lease = %name, "another replica holds the Lease; stepping down");
                    leading.send_replace(false);
                    return;
                }
            }
            Err(e) => {
                if let Some(renewed) = last_renewal {
                    tracing::warn!(%identity, lease = %name, "could not renew the Lease: {e}");
                    if renewed.elapsed() >= RENEW_DEADLINE {
                        fence.close();
                        tracing::error!(%identity, lease = %name,
                            "no renewal for {RENEW_DEADLINE:?}: stopped writing, stepping down before the Lease can expire");
                        leading.send_replace(false);
                        return;
                    }
                } else {
                    tracing::debug!(%identity, lease = %name, "could not read the Lease: {e}");
                }
            }
        }
        let next = attempt + RETRY;
        tokio::select! {
            _ = tokio::time::sleep_until(next.into()) => {}
            _ = leading.closed() => break,
        }
    }
    // Every receiver is gone: the operator stopped. Release the Lease if we hold it, so that a
    // standby takes over at once.
    fence.close();
    if last_renewal.is_some() {
        let _ = tokio::time::timeout(RETRY, release(&api, &name, &identity)).await;
        tracing::info!(%identity, lease = %name, "released the Lease");
    }
}

fn now_micro() -> MicroTime {
    MicroTime(Timestamp::now())
}

/// Why one round of taking or renewing the Lease did not say whether we hold it.
#[derive(Debug, thiserror::Error)]
enum AttemptError {
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error("no answer within {0:?}")]
    NoAnswer(Duration),
}

/// One round: take the Lease if it is free or expired, renew it if ours and `leading`. Returns
/// whether we hold it now. A Lease in our name that we do not lead by (a take whose look after
/// it did not finish, or a restart under the same identity) is taken as any other: looked at
/// before and after.
async fn try_acquire(
    api: &Api<Lease>,
    name: &str,
    identity: &str,
    leading: bool,
    seen: &mut Observed,
    shards_seen: &mut Observed,
) -> Result<bool, AttemptError> {
    let spec = |acquire: Option<MicroTime>, transitions: i32| LeaseSpec {
        holder_identity: Some(identity.to_owned()),
        lease_duration_seconds: Some(LEASE_DURATION.as_secs() as i32),
        acquire_time: acquire,
        renew_time: Some(now_micro()),
        lease_transitions: Some(transitions),
        ..LeaseSpec::default()
    };
    let lease = match api.get_opt(name).await? {
        Some(lease) => lease,
        None => {
            if let Some(holder) = shard_held(api, name, identity, shards_seen).await? {
                tracing::info!(%identity, lease = %name, "not taking the Lease: {holder}");
                return Ok(false);
            }
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.to_owned()),
                    ..ObjectMeta::default()
                },
                spec: Some(spec(Some(now_micro()), 0)),
            };
            return match api.create(&PostParams::default(), &lease).await {
                Ok(_) => confirm_take(api, name, identity, shards_seen).await,
                // Someone else created it first.
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e.into()),
            };
        }
    };
    let current = lease.spec.clone().unwrap_or_default();
    let now = Instant::now();
    let (holder, since) = seen.see(&lease, now);
    let ours = holder.as_deref() == Some(identity);
    let expired = holder.is_none() || now.duration_since(since) >= duration_of(&lease);
    if !ours && !expired {
        return Ok(false);
    }
    let renewing = ours && leading;
    if !renewing && let Some(holder) = shard_held(api, name, identity, shards_seen).await? {
        tracing::info!(%identity, lease = %name, "not taking the Lease: {holder}");
        return Ok(false);
    }
    let transitions = current.lease_transitions.unwrap_or(0) + i32::from(!ours);
    let acquire = if ours {
        current.acquire_time.clone()
    } else {
        Some(now_micro())
    };
    let mut updated = lease;
    updated.spec = Some(spec(acquire, transitions));
    // The resourceVersion we read makes this a compare-and-swap: of two replicas taking an
    // expired Lease, one wins.
    match api.replace(name, &PostParams::default(), &updated).await {
        Ok(_) if renewing => Ok(true),
        Ok(_) => confirm_take(api, name, identity, shards_seen).await,
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Looks for shards once more after taking the Lease `name`, and gives it back if a replica
/// holds one: of a leader and a shard's holder that took their Leases at once, each looked
/// before its take and looks again after it, so the later of the two sees the other's (the
/// shards' campaign confirms its takes the same way). Whether this replica leads.
async fn confirm_take(
    api: &Api<Lease>,
    name: &str,
    identity: &str,
    shards_seen: &mut Observed,
) -> Result<bool, AttemptError> {
    let found = shard_held(api, name, identity, shards_seen).await;
    if let Ok(None) = found {
        return Ok(true);
    }
    if let Ok(Some(holder)) = &found {
        tracing::info!(%identity, lease = %name, "giving back the Lease just taken: {holder}");
    }
    if let Err(e) = release(api, name, identity).await {
        tracing::warn!(%identity, lease = %name, "could not give back the Lease just taken (it expires): {e}");
    }
    found.map(|_| false).map_err(Into::into)
}

/// Who holds a shard's Lease of the operator whose single leader's Lease is `name` (replicas
/// run with `--shards`), judged by our clock as the Lease itself is; `None` when nobody does.
/// One leader never serves alongside shards: a reshard back to one waits for them to go.
async fn shard_held(
    api: &Api<Lease>,
    name: &str,
    identity: &str,
    seen: &mut Observed,
) -> Result<Option<String>, kube::Error> {
    let params = kube::api::ListParams::default().labels(&format!(
        "{}={name},{}=shard",
        super::shards::OF_LABEL,
        super::shards::ROLE_LABEL
    ));
    let now = Instant::now();
    let leases = match api.list(&params).await {
        Ok(list) => list.items,
        // Without the right to list Leases (RBAC from before sharding), or with a Lease name
        // no label can hold: no shards can be running with this Lease name's RBAC and label.
        Err(kube::Error::Api(s)) if s.code == 403 || s.code == 400 => {
            tracing::warn!(%identity, lease = %name, "cannot list the shards' Leases ({}): taking the Lease without looking for shards; `host rbac` grants list on Leases", s.message);
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    for lease in leases {
        let (holder, since) = seen.see(&lease, now);
        if let Some(holder) = holder.filter(|h| h != identity)
            && now.duration_since(since) < duration_of(&lease)
        {
            return Ok(Some(format!(
                "{holder} holds the shard's Lease {}",
                lease.metadata.name.as_deref().unwrap_or_default()
            )));
        }
    }
    Ok(None)
}

/// Gives up the Lease `name` if `identity` holds it (nothing when another does, or it is gone).
pub(super) async fn release(
    api: &Api<Lease>,
    name: &str,
    identity: &str,
) -> Result<(), kube::Error> {
    let Some(mut lease) = api.get_opt(name).await? else {
        return Ok(());
    };
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    if spec.holder_identity.as_deref() != Some(identity) {
        return Ok(());
    }
    spec.holder_identity = None;
    spec.renew_time = None;
    spec.acquire_time = None;
    api.replace(name, &PostParams::default(), &lease).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fence_opens_until_a_time_and_closes() {
        let fence = Fence::closed();
        assert!(!fence.allows());
        fence.extend(Instant::now() + Duration::from_secs(60));
        assert!(fence.allows());
        fence.extend(Instant::now());
        assert!(!fence.allows(), "past its deadline");
        fence.extend(Instant::now() + Duration::from_secs(60));
        fence.close();
        assert!(!fence.allows());
        assert!(Fence::open().allows());
    }
}
