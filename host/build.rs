//! Builds the built-in guests into components that `src/plugin/builtin.rs` embeds (with their
//! sha256, so that loading one does not hash it again), and records the wasmtime version (for the
//! compile cache's keys and `host --version`) and the contract's version.
use sha2::{Digest, Sha256};

fn main() {
    let wasm = guest_build::build(&["guest-service", "guest-datastore", "guest-kvcluster"]);
    for (name, path) in ["SERVICE", "DATASTORE", "KVCLUSTER"].iter().zip(&wasm) {
        println!("cargo:rustc-env=GUEST_{name}_WASM={}", path.display());
        let bytes = std::fs::read(path)
            .unwrap_or_else(|e| panic!("cannot read the built guest {}: {e}", path.display()));
        let sha256: String = Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        println!("cargo:rustc-env=GUEST_{name}_SHA256={sha256}");
    }
    let lock = guest_build::workspace_root().join("Cargo.lock");
    let text = std::fs::read_to_string(&lock).unwrap_or_default();
    let version = text
        .split("[[package]]")
        .find(|p| p.contains("\nname = \"wasmtime\"\n"))
        .and_then(|p| {
            p.lines().find_map(|l| {
                l.strip_prefix("version = \"")?
                    .strip_suffix('"')
                    .map(str::to_owned)
            })
        })
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=WASMTIME_VERSION={version}");
    // The contract's version, from its package line (`package wasm-operator:plugin@1.0.0;`).
    let wit = guest_build::workspace_root().join("wit/plugin.wit");
    println!("cargo:rerun-if-changed={}", wit.display());
    let contract = std::fs::read_to_string(&wit)
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("package ")?
                .trim_end_matches(';')
                .split_once('@')
                .map(|(_, v)| v.to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=CONTRACT_VERSION={contract}");
}
