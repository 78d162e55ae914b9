//! Builds the built-in guests into components that `src/plugin/builtin.rs` embeds, and records
//! the wasmtime version for the compile cache's keys.
fn main() {
    let wasm = guest_build::build(&["guest-service", "guest-datastore", "guest-kvcluster"]);
    for (name, path) in ["SERVICE", "DATASTORE", "KVCLUSTER"].iter().zip(&wasm) {
        println!("cargo:rustc-env=GUEST_{name}_WASM={}", path.display());
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
}
