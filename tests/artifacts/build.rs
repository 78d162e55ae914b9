//! Builds the test plugins and exports their paths.
fn main() {
    let wasm = guest_build::build(&["guest-hostile", "guest-incompatible"]);
    println!("cargo:rustc-env=HOSTILE_WASM={}", wasm[0].display());
    println!("cargo:rustc-env=INCOMPATIBLE_WASM={}", wasm[1].display());
}
