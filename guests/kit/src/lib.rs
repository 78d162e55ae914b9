//! Helpers for writing operator plugins in Rust.
//!
//! A plugin is a WebAssembly component that implements the `wasm-operator:plugin` WIT world
//! (`wit/plugin.wit`). This crate lets its logic be a plain Rust library, tested natively:
//!
//! - [`Plugin`] is the trait a guest implements, over plain Rust [`Resource`], [`Context`],
//!   [`PluginInfo`] and [`RenderError`] types that mirror the WIT records;
//! - [`export_plugin!`] turns an implementation into the component's exports (a few lines in the
//!   guest's `lib.rs`, compiled only for `wasm32`);
//! - [`spec`] parses a resource's spec with errors that name the field (`spec.storage.size`);
//! - [`render`] holds the renderers that several guests share: labels, ports, probes, Services,
//!   NetworkPolicy, ServiceMonitor and KMSSecret;
//! - [`schema`] holds the OpenAPI building blocks for describing a Kind's spec.
//!
//! Guests are pure: the same input gives the same bytes out. Everything here uses ordered maps
//! (`serde_json`'s default `Map` is a `BTreeMap`), never a randomly seeded hash map.

// Plugin authors read this crate's documentation: every public item says what it is for.
#![warn(missing_docs)]

mod export;
pub mod render;
pub mod schema;
pub mod spec;
mod types;

pub use types::{
    Context, GroupVersionKind, KindInfo, ObservedChild, Plugin, PluginInfo, PrinterColumn,
    Reference, ReferenceTarget, RenderError, Rendered, Resource, Result, Warning, WireResource,
    render_wire, render_wire_reported,
};

#[doc(hidden)]
pub use export::adapter as __adapter;
#[cfg(target_family = "wasm")]
#[doc(hidden)]
pub use export::bindings as __bindings;
