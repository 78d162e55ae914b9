//! Paths of the test plugins, built from `tests/guests/` by this crate's build script.

/// The plugin that misbehaves on request (`tests/guests/hostile`).
pub const HOSTILE: &str = env!("HOSTILE_WASM");
/// A plugin built against a future major version of the contract (`tests/guests/incompatible`).
pub const INCOMPATIBLE: &str = env!("INCOMPATIBLE_WASM");
