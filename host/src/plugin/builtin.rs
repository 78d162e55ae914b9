//! The plugins built into the host binary, built from `guests/` by `build.rs`.

/// A plugin embedded in the host.
#[derive(Debug, Clone, Copy)]
pub struct Builtin {
    /// Its name, as `describe` gives it.
    pub name: &'static str,
    pub wasm: &'static [u8],
    /// The sha256 of `wasm`, hex, computed when the host was built.
    pub sha256: &'static str,
}

/// Every built-in plugin, in load order.
pub const BUILTINS: [Builtin; 3] = [
    Builtin {
        name: "service",
        wasm: include_bytes!(env!("GUEST_SERVICE_WASM")),
        sha256: env!("GUEST_SERVICE_SHA256"),
    },
    Builtin {
        name: "datastore",
        wasm: include_bytes!(env!("GUEST_DATASTORE_WASM")),
        sha256: env!("GUEST_DATASTORE_SHA256"),
    },
    Builtin {
        name: "kvcluster",
        wasm: include_bytes!(env!("GUEST_KVCLUSTER_WASM")),
        sha256: env!("GUEST_KVCLUSTER_SHA256"),
    },
];
