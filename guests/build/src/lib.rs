//! Builds guest crates of this workspace into WebAssembly components, from a build script.
//!
//! Each guest is compiled with `cargo rustc --crate-type cdylib --target wasm32-wasip2 --profile
//! guest` into a target directory of its own (so the outer build's lock is never waited on), and
//! the build script learns the path of every `.wasm` it asked for. Nothing prebuilt is committed.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The target every guest is built for.
pub const TARGET: &str = "wasm32-wasip2";

/// The workspace root, from the calling build script's manifest directory.
pub fn workspace_root() -> PathBuf {
    let manifest =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("called from a build script"));
    manifest
        .ancestors()
        .find(|dir| {
            dir.join("Cargo.lock").exists() || is_workspace_manifest(&dir.join("Cargo.toml"))
        })
        .expect("the crate lives in a workspace")
        .to_path_buf()
}

fn is_workspace_manifest(path: &Path) -> bool {
    std::fs::read_to_string(path).is_ok_and(|s| s.contains("[workspace]"))
}

/// Makes sure the standard library for [`TARGET`] is installed. `rust-toolchain.toml` lists the
/// target, but rustup only installs listed targets together with a toolchain it installs; on a
/// machine that already had the toolchain, add it here, as the toolchain file asks.
fn ensure_target() {
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let sysroot = Command::new(&rustc)
        .args(["--print", "sysroot"])
        .output()
        .ok()
        .map(|o| {
            PathBuf::from(String::from_utf8_lossy(&o.stdout).trim())
                .join("lib/rustlib")
                .join(TARGET)
        });
    if sysroot.as_ref().is_some_and(|p| p.exists()) {
        return;
    }
    println!("cargo:warning=installing the {TARGET} target that rust-toolchain.toml asks for");
    let status = Command::new("rustup")
        .args(["target", "add", TARGET])
        .status();
    assert!(
        status.is_ok_and(|s| s.success()),
        "the {TARGET} target is missing and `rustup target add {TARGET}` failed; install it and build again"
    );
}

/// A directory name of its own for the checkout at `root`: its last component and a hash of the
/// whole path.
///
/// Checkouts of this repository that share `CARGO_TARGET_DIR` (git worktrees, for one) must not
/// share the guests' target directory. Cargo names a workspace member's artifacts by its path
/// relative to the workspace root, the same in every checkout, and takes them as fresh when they
/// are newer than this checkout's sources: a guest would be linked with another checkout's
/// `guest-kit`, and the component at the returned path would be whichever checkout built it last.
fn checkout_dir_name(root: &Path) -> String {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    let hash = BuildHasherDefault::<DefaultHasher>::default().hash_one(root);
    let name = root
        .file_name()
        .map_or_else(|| "root".into(), |n| n.to_string_lossy());
    format!("{name}-{hash:016x}")
}

/// The rustc flags that write this machine's paths (cargo's home, the checkout) as fixed ones.
fn remap_flags(root: &Path) -> Vec<String> {
    let cargo_home = env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|home| PathBuf::from(home).join(".cargo")));
    let mut flags = Vec::new();
    if let Some(cargo_home) = cargo_home {
        flags.push(format!(
            "--remap-path-prefix={}=/cargo",
            cargo_home.display()
        ));
    }
    flags.push(format!("--remap-path-prefix={}=/src", root.display()));
    flags
}

/// Builds each package and returns the path of its component, in order. Panics (failing the
/// build script, with cargo's output above) when a build fails.
pub fn build(packages: &[&str]) -> Vec<PathBuf> {
    build_variant(packages, &[], "")
}

/// As [`build`], with the cargo `features` on, into a target directory of the variant's own
/// (`variant` names it), so that it sits beside the plain build instead of replacing it.
pub fn build_variant(packages: &[&str], features: &[&str], variant: &str) -> Vec<PathBuf> {
    ensure_target();
    let root = workspace_root();
    for watched in ["guests", "wit", "tests/guests", "Cargo.toml", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }
    let target_dir = env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| root.join("target"), PathBuf::from)
        .join("wasm-guests")
        .join(checkout_dir_name(&root))
        .join(variant);
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    packages
        .iter()
        .map(|package| {
            let mut cmd = Command::new(&cargo);
            cmd.current_dir(&root)
                .args([
                    "rustc",
                    "--quiet",
                    "--package",
                    package,
                    "--lib",
                    "--crate-type",
                    "cdylib",
                ])
                .args(["--target", TARGET, "--profile", "guest", "--target-dir"])
                .arg(&target_dir);
            if !features.is_empty() {
                cmd.args(["--features", &features.join(",")]);
            }
            // Flags meant for the outer, native build (coverage, sanitizers, clippy) must not
            // leak into the guests.
            for var in [
                "RUSTFLAGS",
                "CARGO_ENCODED_RUSTFLAGS",
                "CARGO_BUILD_RUSTFLAGS",
                "RUSTC_WORKSPACE_WRAPPER",
                "CARGO_TARGET_DIR",
                "CARGO_BUILD_TARGET",
                "CARGO_PRIMARY_PACKAGE",
            ] {
                cmd.env_remove(var);
            }
            // Panic messages name the source files of the crates they come from: the paths of
            // the machine that built the component (cargo's registry under CARGO_HOME) would make
            // its bytes, and its digest, differ from one machine to the next.
            cmd.env("CARGO_ENCODED_RUSTFLAGS", remap_flags(&root).join("\x1f"));
            let status = cmd
                .status()
                .unwrap_or_else(|e| panic!("could not run cargo for {package}: {e}"));
            assert!(
                status.success(),
                "building guest {package} for {TARGET} failed ({status}); is the target installed? \
                 (`rustup target add {TARGET}`, which rust-toolchain.toml asks for)"
            );
            let wasm = target_dir
                .join(TARGET)
                .join("guest")
                .join(format!("{}.wasm", package.replace('-', "_")));
            assert!(
                wasm.exists(),
                "cargo built {package} but {} is missing",
                wasm.display()
            );
            wasm
        })
        .collect()
}
