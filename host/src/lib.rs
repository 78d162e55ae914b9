//! The operator host: loads one WebAssembly component per Kind and does all cluster I/O.
//!
//! Layers, bottom first; a module uses only those below it ([`layers`] keeps it so, and
//! docs/architecture.md walks one resource through them):
//!
//! - [`types`], [`units`], [`gvk`], [`connection`]: the plain types shared with guests;
//!   durations, sizes and bounded text; groups, versions, kinds and plurals; and, beside them,
//!   the connections to the API server;
//! - [`api`], [`ownership`], [`kube_schema`], [`oci`]: the `Plugin` resource; how children are
//!   stamped, owned and adopted; the Kubernetes types a CRD inlines; plugins in OCI registries;
//! - [`error`]; then [`documents`], [`schema`], [`policy`]: resources read from files; a spec
//!   checked against its schema; what a rendered object may be (Pod Security, reach, names);
//! - [`plugin`]: components loaded (with a compile cache) and called in a sandbox;
//! - [`registry`]: which plugin serves which Kind, and the checks every rendered object passes;
//! - [`crd`]; then [`check`], [`rbac`], [`publish`]: CRDs from the plugins' descriptions;
//!   `host check`; the operator's RBAC; `host push`, `pull` and `inspect`;
//! - [`diff`], [`operator`]: `host diff`; `host run`, the controllers;
//! - [`dev`]: `host dev`, the operator on a control plane of its own, for a demo;
//! - [`cli`]: the `host` command, which parses and calls; nothing imports it.

pub mod api;
pub mod check;
pub mod cli;
pub mod connection;
pub mod crd;
#[cfg(feature = "dev")]
pub mod dev;
pub mod diff;
pub mod documents;
pub mod error;
pub mod gvk;
pub mod kube_schema;
pub mod layers;
pub mod oci;
pub mod operator;
pub mod ownership;
pub mod plugin;
pub mod policy;
pub mod publish;
pub mod rbac;
pub mod registry;
pub mod scaffold;
pub mod schema;
pub mod signature;
pub mod units;

/// The plain types shared with guests (`guest-kit`).
pub mod types {
    pub use guest_kit::{
        Context, GroupVersionKind, KindInfo, ObservedChild, PluginInfo, PrinterColumn, Reference,
        ReferenceTarget, Resource, Warning,
    };
}

pub use error::{Error, Result};
pub use plugin::PluginError;
