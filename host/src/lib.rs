//! The operator host: loads one WebAssembly component per Kind and does all cluster I/O.
//!
//! - [`plugin`]: loading components (with a compile cache) and calling them in a sandbox;
//! - [`registry`]: which plugin serves which Kind, and the checks every rendered object passes;
//! - [`schema`]: a spec checked against its Kind's schema before it is rendered;
//! - [`documents`]: reading resources from YAML or JSON files and writing manifests;
//! - [`crd`]: CustomResourceDefinitions from the plugins' own descriptions;
//! - [`diff`]: `host diff`, what the operator would change, previewed by server-side dry run;
//! - [`check`]: `host check`, a plugin checked before it is published or served;
//! - [`oci`]: plugins pushed to and pulled from OCI registries;
//! - [`publish`]: `host push`, `host pull` and `host inspect`;
//! - [`rbac`]: the least-privilege RBAC of the operator for the loaded plugins;
//! - [`operator`]: `host run`, the controllers;
//! - [`dev`]: `host dev`, the operator on a control plane of its own, for a demo;
//! - [`cli`]: the `host` command.

pub mod check;
pub mod cli;
pub mod crd;
#[cfg(feature = "dev")]
pub mod dev;
pub mod diff;
pub mod documents;
pub mod error;
pub mod oci;
pub mod operator;
pub mod plugin;
pub mod policy;
pub mod publish;
pub mod rbac;
pub mod registry;
pub mod schema;

/// The plain types shared with guests (`guest-kit`).
pub mod types {
    pub use guest_kit::{
        Context, GroupVersionKind, KindInfo, ObservedChild, PluginInfo, PrinterColumn, Reference,
        ReferenceTarget, Resource, Warning,
    };
}

pub use error::{Error, PluginError, Result};
