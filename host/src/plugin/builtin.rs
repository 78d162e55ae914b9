//! The plugins built into the host binary, built from `guests/` by `build.rs`.

/// A plugin embedded in the host.
#[derive(Debug, Clone, Copy)]
pub struct Builtin {
    /// Its name, as `describe` gives it.
    pub name: &'static str,
    /// The component.
    pub wasm: &'static [u8],
}

/// Every built-in plugin, in load order.
pub const BUILTINS: [Builtin; 3] = [
    Builtin {
        name: "service",
        wasm: include_bytes!(env!("GUEST_SERVICE_WASM")),
    },
    Builtin {
        name: "datastore",
        wasm: include_bytes!(env!("GUEST_DATASTORE_WASM")),
    },
    Builtin {
        name: "kvcluster",
        wasm: include_bytes!(env!("GUEST_KVCLUSTER_WASM")),
    },
];
