//! `host run`: the operator.
//!
//! One controller per Kind the plugins serve. Each reconciliation renders the resource through its
//! plugin (in a fresh sandboxed instance), checks every object, and server-side applies it under
//! one field manager with the host's owner reference and ownership label; children a render no
//! longer returns are deleted, and nothing a resource does not control is written (see
//! `children` and `reconcile`). Every object of each child kind is watched, so a child deleted or
//! edited by hand brings its owner back to reconcile. Status follows kstatus
//! (`Ready`, `Reconciling`, `Stalled`, `observedGeneration`); nothing is written when nothing
//! changed.
//!
//! The run loop is in `run`, what the controllers share in `shared`, the reflectors in
//! `watches`, the child kinds the cluster serves in `discovery`, one controller per Kind in
//! `controllers`, one reconciliation in `reconcile` (a folder, by phase), and `Plugin` resources
//! loaded live in `plugins` (docs/architecture.md).

pub mod budget;
mod children;
mod controllers;
mod discovery;
pub mod events;
mod labeller;
pub mod lease;
mod live;
pub mod metrics;
pub mod offline;
pub mod plugins;
mod process;
mod reconcile;
mod report;
mod run;
pub mod secure;
mod settling;
pub mod shard;
pub mod shards;
mod shared;
mod status;
mod watches;
mod writes;

use controllers::*;
use discovery::*;
pub use run::run;
use shared::*;
use watches::*;

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use events::Recorder;
use futures::StreamExt;
use futures::channel::mpsc;
use kube::api::Api;
use kube::core::GroupVersionKind;
use kube::discovery::{ApiCapabilities, ApiResource, Scope, pinned_kind};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{PredicateConfig, WatchStreamExt, watcher};
use tokio::sync::watch;

use children::{Applies, OwnerIndex, Waiting};
pub use live::{LiveChild, Pairs, Served};
pub use metrics::Metrics;

use crate::gvk::split_api_version;
use crate::ownership::{FIELD_MANAGER, trim_resource};
use crate::registry::Registry;

/// How long a namespace's Pod Security level is used before it is read again.
const LEVEL_TTL: Duration = Duration::from_secs(30);

/// What went wrong running the operator.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Kubernetes client could not be made or a call failed.
    #[error("kubernetes: {0}")]
    Kube(#[from] kube::Error),
    /// Plugins could not be loaded.
    #[error(transparent)]
    Host(#[from] crate::error::Error),
    /// The metrics server could not start.
    #[error("metrics server on {addr}: {source}")]
    Serve {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// The leader election task ended before this replica led.
    #[error("leader election: the election task ended: {0}")]
    Election(#[source] tokio::sync::watch::error::RecvError),
    /// Another replica took the Lease while this one led: it stops rather than write as a
    /// second leader.
    #[error("leader election: another replica took the lease")]
    LeaseLost,
    /// No Kind could be served.
    #[error("no Kind can be served: {0}")]
    NothingToServe(String),
}

/// How the operator runs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Watch only these namespaces; empty watches every namespace.
    pub namespaces: Vec<String>,
    /// Where `/metrics` is served (and, without `metrics_tls`, `/healthz` and `/readyz`).
    pub metrics_addr: SocketAddr,
    /// Serve `/metrics` over HTTPS with this certificate, to requests whose bearer token the
    /// API server says may `get /metrics`; the probes are then served on `health_addr`. None:
    /// everything plain HTTP on `metrics_addr`.
    pub metrics_tls: Option<std::sync::Arc<rustls::ServerConfig>>,
    /// Where `/healthz` and `/readyz` are served when `/metrics` is secure.
    pub health_addr: SocketAddr,
    /// Elect a leader on a Lease (for more than one replica).
    pub leader_election: bool,
    /// The Lease's namespace.
    pub lease_namespace: String,
    /// The Lease's name.
    pub lease_name: String,
    /// This replica's identity.
    pub identity: String,
    /// Reconciliations in flight per Kind.
    pub concurrency: u16,
    /// Applies and deletes in flight at once, across every Kind: at most this many.
    pub max_writes_in_flight: u16,
    /// ...and no limit below this many, however the API server answers (see [`writes`]).
    pub min_writes_in_flight: u16,
    /// The memory all plugin calls in flight may need together, in bytes (see [`budget`]).
    pub render_memory: u64,
    /// How long a reconciliation waits for a render: the plugin deadline and a margin. The
    /// sandbox stops a call at its deadline; this bounds the wait should one still not return.
    pub render_wait: Duration,
    /// How long a watch of a served Kind or a child kind may keep failing (it cannot list or
    /// watch) before `/readyz` fails.
    pub unready_after: Duration,
    /// How long one reconciliation may run before `/healthz` fails (the reconcile loop is
    /// stuck; a kubelet then restarts the operator).
    pub stuck_after: Duration,
    /// Serve the plugins that `Plugin` resources name, loaded live (none: only those given at
    /// start).
    pub plugin_resources: Option<plugins::Live>,
    /// What rendered objects are held to before they are applied, and who may adopt.
    pub rules: crate::policy::Rules,
    /// Split the resources into shards, each on a Lease of its own (`--shards`, with leader
    /// election); `None`, or one shard: one leader serves everything.
    pub sharding: Option<shard::Sharding>,
    /// The one shard this pipeline serves: set by the operator for each shard it takes.
    pub shard: Option<shard::Shard>,
}

impl Settings {
    /// Where each watch looks: every namespace at once (`None`), or each watched namespace on
    /// its own, since a list or watch across several namespaces needs rights in every namespace.
    pub(crate) fn scopes(&self) -> Vec<Option<String>> {
        if self.namespaces.is_empty() {
            vec![None]
        } else {
            let unique: std::collections::BTreeSet<&String> = self.namespaces.iter().collect();
            unique.into_iter().cloned().map(Some).collect()
        }
    }

    /// The default of [`Settings::stuck_after`] for a given `render_wait`: two minutes, or
    /// longer when one render may take longer.
    pub fn default_stuck_after(render_wait: Duration) -> Duration {
        (render_wait + Duration::from_secs(60)).max(metrics::RECONCILE_STUCK)
    }
}
