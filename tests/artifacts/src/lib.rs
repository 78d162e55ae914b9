//! Paths of the test plugins, built from `tests/guests/` by this crate's build script.

/// The plugin that misbehaves on request (`tests/guests/hostile`).
pub const HOSTILE: &str = env!("HOSTILE_WASM");
/// The same plugin, its next version (the `next-version` feature): `ok` renders its ConfigMap
/// with one more key, for the tests of an upgrade.
pub const HOSTILE_NEXT: &str = env!("HOSTILE_NEXT_WASM");
/// A plugin built against contract 1.0, its WIT frozen as published
/// (`tests/guests/contract-1-0`): what a host that speaks 1.1 must keep serving unchanged.
pub const CONTRACT_1_0: &str = env!("CONTRACT_1_0_WASM");
/// A plugin built against a future major version of the contract (`tests/guests/incompatible`).
pub const INCOMPATIBLE: &str = env!("INCOMPATIBLE_WASM");
/// A plugin component with two core modules of one 40 MiB memory each, whose `describe` and
/// `render` trap (`tests/artifacts/several-memories.wat`): each memory is under the default
/// 64 MiB cap, both together are over it.
pub const SEVERAL_MEMORIES: &str = env!("SEVERAL_MEMORIES_WASM");
/// The hostile plugin describing its Kind with the plural `../../../x` (the `climbing-plural`
/// feature): a name the API server refuses, which the host must refuse at load.
pub const HOSTILE_CLIMBING: &str = env!("HOSTILE_CLIMBING_WASM");
