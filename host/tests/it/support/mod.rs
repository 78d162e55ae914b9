//! Shared fixtures: one registry of the built-in plugins for every test, and the test data;
//! the harness of the tests on a control plane in [`cluster`].

pub mod cluster;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use host::documents;
use host::plugin::{Cache, Limits, Runtime};
use host::registry::Registry;
use host::types::{Context, Resource};
use serde_json::Value;

/// The repository root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("host/ has a parent")
        .to_path_buf()
}

/// A compile cache private to the test run.
pub fn cache() -> Cache {
    Cache::new(Path::new(env!("CARGO_TARGET_TMPDIR")).join("component-cache"))
}

/// The built-in plugins under the default context, loaded once.
pub fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let runtime = Runtime::new(Limits::default(), Some(cache())).expect("runtime");
        Registry::load(&runtime, Context::default(), true, &[]).expect("built-in plugins load")
    })
}

/// The fixture files of `tests/data`.
pub fn fixtures() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("tests/data"))
        .expect("tests/data")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

/// The resources of a fixture file.
pub fn resources(path: &Path) -> Vec<Resource> {
    let text = std::fs::read_to_string(path).expect("fixture");
    documents::parse(&path.display().to_string(), &text)
        .expect("fixture parses")
        .iter()
        .map(|d| documents::resource(&d.value).expect("fixture is a resource"))
        .collect()
}

/// A resource from inline YAML.
pub fn resource(yaml: &str) -> Resource {
    let docs = documents::parse("inline.yaml", yaml).expect("inline YAML parses");
    documents::resource(&docs[0].value).expect("inline YAML is a resource")
}

/// Renders through the registry (the wasm path, with the host's checks).
pub fn render(resource: &Resource) -> Vec<Value> {
    registry()
        .render(resource)
        .unwrap_or_else(|e| panic!("{}/{}: {e}", resource.kind, resource.name))
}

/// The first object of a kind.
pub fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} among {} objects", objects.len()))
}

/// The stdout of a command that `what` names, asserting that it succeeded (else both streams).
pub fn succeeded(what: &str, out: std::process::Output) -> String {
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `host ARGS` run with `cache` as its home and cache (compiled and pulled plugins), no Docker
/// config, no colours.
pub fn host_in(cache: &Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_host"))
        .args(args)
        .current_dir(root())
        .env("WASM_OPERATOR_CACHE", cache)
        .env("NO_COLOR", "1")
        .env("HOME", cache)
        .env_remove("DOCKER_CONFIG")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("host runs")
}

/// The stdout of `host ARGS`, run with the CLI tests' compile cache, asserting that it succeeded.
pub fn host_ok(args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_host"))
        .args(args)
        .env(
            "WASM_OPERATOR_CACHE",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache"),
        )
        .output()
        .expect("host runs");
    succeeded(&format!("host {}", args.join(" ")), out)
}

/// Cargo's home on this machine (`CARGO_HOME`, else `~/.cargo`): its registry's paths are what a
/// build must not leave in what it makes.
pub fn cargo_home() -> PathBuf {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .expect("CARGO_HOME or HOME")
}
