//! The sandbox: a hostile plugin is contained, named, and the host keeps serving.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use host::PluginError;
use host::error::Error;
use host::plugin::{Cache, Limits, Runtime};
use host::registry::{Registry, RenderError};
use host::types::Context;

use crate::support::resource;

fn limits() -> Limits {
    Limits {
        deadline: Duration::from_millis(300),
        ..Limits::default()
    }
}

fn hostile_registry(limits: Limits) -> Registry {
    let runtime = Runtime::new(limits, Some(crate::support::cache())).unwrap();
    Registry::load(
        &runtime,
        Context::default(),
        true,
        &[PathBuf::from(test_guests::HOSTILE)],
    )
    .unwrap()
}

fn hostile_resource(mode: &str) -> host::types::Resource {
    resource(&format!(
        "apiVersion: test.wasm-operator.dev/v1\nkind: Hostile\nmetadata: {{name: h, namespace: ns}}\nspec: {{mode: {mode}}}\n"
    ))
}

/// Renders in the hostile plugin under [`limits`] (a 300 ms deadline).
fn hostile(mode: &str) -> Result<Vec<serde_json::Value>, RenderError> {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY
        .get_or_init(|| hostile_registry(limits()))
        .render(&hostile_resource(mode))
}

/// Renders in the hostile plugin with a 10 s deadline, for modes that do much work before they
/// misbehave: what they are refused for must not depend on how busy the test machine is.
fn patient_hostile(mode: &str) -> Result<Vec<serde_json::Value>, RenderError> {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY
        .get_or_init(|| {
            hostile_registry(Limits {
                deadline: Duration::from_secs(10),
                ..Limits::default()
            })
        })
        .render(&hostile_resource(mode))
}

fn expect_plugin_error(
    mode: &str,
    result: Result<Vec<serde_json::Value>, RenderError>,
) -> PluginError {
    match result {
        Err(RenderError::Plugin { plugin, error }) => {
            assert_eq!(plugin, "hostile");
            error
        }
        other => panic!("mode {mode}: expected a plugin error, got {other:?}"),
    }
}

fn plugin_error(mode: &str) -> PluginError {
    expect_plugin_error(mode, hostile(mode))
}

#[test]
fn the_sandbox_gives_no_environment_files_network_clock_or_entropy() {
    let first = hostile("probe").unwrap();
    let data = &first[0]["data"];
    assert_eq!(data["env"], "", "environment leaked: {data}");
    assert_eq!(data["args"], "", "arguments leaked: {data}");
    assert_eq!(data["now"], "0", "the wall clock is not fixed: {data}");
    assert!(
        data["readDir"].as_str().unwrap().starts_with("error"),
        "{data}"
    );
    assert!(
        data["readFile"].as_str().unwrap().starts_with("error"),
        "{data}"
    );
    assert!(
        data["connect"].as_str().unwrap().starts_with("error"),
        "{data}"
    );
    // Randomness is fixed: a randomly seeded hasher gives the same hash every call.
    let second = hostile("probe").unwrap();
    assert_eq!(first, second);
}

#[test]
fn a_panic_is_reported_with_its_message() {
    let e = plugin_error("panic");
    assert!(matches!(e, PluginError::Panic(_)), "{e:?}");
    assert!(
        e.to_string().contains("hostile guest panicked on purpose"),
        "{e}"
    );
    assert_eq!(e.reason(), "PluginTrapped");
    assert!(
        hostile("ok").is_ok(),
        "the host keeps serving after a panic"
    );
}

#[test]
fn an_endless_loop_hits_the_deadline() {
    let start = Instant::now();
    let e = plugin_error("loop");
    let took = start.elapsed();
    assert_eq!(e, PluginError::Deadline(Duration::from_millis(300)));
    assert!(took < Duration::from_secs(3), "stopped after {took:?}");
    assert!(
        hostile("ok").is_ok(),
        "the host keeps serving after a timeout"
    );
}

/// How long a wait of 20 s (or forever) may take under the 300 ms deadline: far less than 20 s,
/// with room for a busy test machine.
const PROMPT: Duration = Duration::from_secs(5);

#[test]
fn a_sleep_returns_at_once_because_time_stands_still() {
    let start = Instant::now();
    let out = hostile("sleep");
    let took = start.elapsed();
    assert!(took < PROMPT, "a 20 s sleep took {took:?}");
    let out = out.unwrap();
    assert_eq!(out[0]["data"]["mode"], "sleep");
}

#[test]
fn a_sleep_of_duration_max_returns_at_once_too() {
    let start = Instant::now();
    let out = hostile("sleep-forever");
    let took = start.elapsed();
    assert!(took < PROMPT, "a sleep of Duration::MAX took {took:?}");
    assert_eq!(out.unwrap()[0]["data"]["mode"], "sleep-forever");
}

#[test]
fn waiting_for_the_clock_to_move_hits_the_deadline() {
    // Each sleep returns at once and the clock never moves: the guest loops in wasm, where the
    // deadline stops it.
    let start = Instant::now();
    let e = plugin_error("wait-for-time");
    let took = start.elapsed();
    assert_eq!(e, PluginError::Deadline(Duration::from_millis(300)));
    assert!(took < PROMPT, "stopped after {took:?}");
    assert!(e.transient(), "a missed deadline is transient");
    assert!(hostile("ok").is_ok());
}

#[test]
fn polling_on_the_clock_returns_at_once() {
    let start = Instant::now();
    let out = hostile("poll");
    let took = start.elapsed();
    assert!(took < PROMPT, "two 20 s polls took {took:?}");
    assert_eq!(out.unwrap()[0]["data"]["mode"], "poll");
}

/// What the host copies out of a guest in one call with the default limits: the 4 MiB output
/// cap and room for headers, not wasmtime's default of 128 MiB.
fn hostcall_fuel() -> usize {
    let fuel = Limits::default().hostcall_fuel();
    assert!(fuel > 4 << 20 && fuel < 5 << 20, "{fuel}");
    fuel
}

#[test]
fn an_error_larger_than_the_output_cap_is_refused_before_the_host_copies_it() {
    let e = expect_plugin_error("huge-error", patient_hostile("huge-error"));
    assert_eq!(
        e,
        PluginError::HandedTooMuch {
            limit: hostcall_fuel()
        }
    );
    assert_eq!(e.reason(), "PluginMisbehaved");
    assert!(!e.transient());
    assert!(e.to_string().len() < 200, "{e}");
}

#[test]
fn a_long_error_is_cut_to_what_a_status_condition_can_hold() {
    let e = plugin_error("long-error");
    let PluginError::Render { field, message } = &e else {
        panic!("{e:?}")
    };
    let note = |cut: usize| format!("… ({cut} more bytes)");
    let field_max = host::error::MAX_ERROR_FIELD;
    let message_max = host::error::MAX_ERROR_MESSAGE;
    assert_eq!(
        *field,
        format!("spec.{}", "f".repeat(field_max - 5))
            + &note("spec.".len() + (16 << 10) - field_max)
    );
    assert_eq!(
        *message,
        "m".repeat(message_max) + &note((64 << 10) - message_max)
    );
    assert_eq!(e.reason(), "InvalidSpec");
    assert!(!e.transient());
    // A status condition's message may hold 32 KiB.
    assert!(e.to_string().len() < 8 << 10, "{}", e.to_string().len());
}

#[test]
fn more_manifests_than_the_cap_are_refused_before_they_are_parsed() {
    // A million empty strings: their list entries alone are over what the host copies.
    let e = expect_plugin_error("many-manifests", patient_hostile("many-manifests"));
    assert_eq!(
        e,
        PluginError::HandedTooMuch {
            limit: hostcall_fuel()
        }
    );
    assert_eq!(e.reason(), "PluginMisbehaved");
    assert!(!e.transient());
}

#[test]
fn the_memory_cap_holds_for_all_memories_of_a_component_together() {
    let wasm = std::fs::read(test_guests::SEVERAL_MEMORIES).unwrap();
    let load = |memory_bytes: usize| {
        let runtime = Runtime::new(
            Limits {
                memory_bytes,
                ..limits()
            },
            None,
        )
        .unwrap();
        match runtime.load(&wasm, "several.wasm", &Context::default()) {
            Err(e @ Error::Load { .. }) => e.to_string(),
            other => panic!("expected a load error, got {other:?}"),
        }
    };
    // Two memories of 40 MiB: each is under the 64 MiB cap, together they are over it.
    let e = load(64 << 20);
    assert_eq!(
        e,
        format!(
            "plugin several.wasm: {}",
            PluginError::Memory {
                limit: 64 << 20,
                tried: 80 << 20,
            }
        )
    );
    // Under a cap both fit in, the component starts, and `describe` traps.
    let e = load(256 << 20);
    assert!(e.contains("trapped") && e.contains("unreachable"), "{e}");
}

#[test]
fn a_full_instance_pool_is_a_transient_busy_error_until_instances_are_freed() {
    let runtime = Runtime::new(limits(), Some(crate::support::cache())).unwrap();
    let wasm = std::fs::read(test_guests::HOSTILE).unwrap();
    let plugin = runtime
        .load(&wasm, "hostile.wasm", &Context::default())
        .unwrap();
    let ok = hostile_resource("ok");
    // Every session holds one instance of the pool, until there is none left.
    let mut sessions = Vec::new();
    let e = loop {
        match plugin.session() {
            Ok(session) => sessions.push(session),
            Err(e) => break e,
        }
        assert!(sessions.len() <= 10_000, "the pool never ran out");
    };
    assert!(matches!(e, PluginError::Busy(_)), "{e:?}");
    assert!(
        e.to_string()
            .contains("maximum concurrent limit of 256 for component instances reached"),
        "{e}"
    );
    assert_eq!(e.reason(), "PluginBusy");
    assert!(e.transient());
    let e = plugin.render(&ok, &Context::default()).unwrap_err();
    assert!(matches!(e, PluginError::Busy(_)), "{e:?}");
    drop(sessions);
    assert!(plugin.render(&ok, &Context::default()).is_ok());
}

#[test]
fn unbounded_allocation_hits_the_memory_cap() {
    // 64 MiB written a page at a time: on a loaded machine that outlasts the 300 ms deadline.
    let e = expect_plugin_error("alloc", patient_hostile("alloc"));
    assert!(
        matches!(e, PluginError::Memory { limit, .. } if limit == 64 << 20),
        "{e:?}"
    );
    assert!(hostile("ok").is_ok());
}

#[test]
fn too_much_output_is_refused() {
    // 8 MiB of manifests: stopped while they are copied out, at the output cap and headers.
    let e = expect_plugin_error("huge-output", patient_hostile("huge-output"));
    assert_eq!(
        e,
        PluginError::HandedTooMuch {
            limit: hostcall_fuel()
        },
        "{e:?}"
    );
    assert_eq!(e.reason(), "PluginMisbehaved");
}

#[test]
fn objects_outside_the_resource_are_refused() {
    let e = plugin_error("other-namespace");
    assert!(e.to_string().contains("namespace `kube-system`"), "{e}");
    let e = plugin_error("undeclared-kind");
    assert!(
        e.to_string()
            .contains("ClusterRoleBinding (rbac.authorization.k8s.io/v1) is not a child kind"),
        "{e}"
    );
    let e = plugin_error("bad-name");
    assert!(e.to_string().contains("invalid name"), "{e}");
    assert_eq!(e.reason(), "ChildRefused");
    // An object with no namespace is put in the resource's.
    let out = hostile("no-namespace").unwrap();
    assert_eq!(out[0]["metadata"]["namespace"], "ns");
}

#[test]
fn a_typed_error_names_the_field() {
    let e = plugin_error("error");
    assert_eq!(e.to_string(), "spec.mode: was asked to fail");
}

fn load_error(bytes: &[u8], name: &str) -> String {
    let runtime = Runtime::new(limits(), None).unwrap();
    match runtime.load(bytes, name, &Context::default()) {
        Err(e @ Error::Load { .. }) => e.to_string(),
        other => panic!("expected a load error, got {other:?}"),
    }
}

#[test]
fn incompatible_components_are_refused_by_name() {
    let bytes = std::fs::read(test_guests::INCOMPATIBLE).unwrap();
    let e = load_error(&bytes, "future.wasm");
    assert!(e.starts_with("plugin future.wasm: "), "{e}");
    assert!(
        e.contains("wasm-operator:plugin@2.0.0") && e.contains("1.x"),
        "{e}"
    );

    // The smallest valid component: it exports nothing.
    let e = load_error(b"\0asm\x0d\x00\x01\x00", "empty.wasm");
    assert!(
        e.contains("does not export `wasm-operator:plugin/reconciler`"),
        "{e}"
    );

    let e = load_error(b"apiVersion: v1\n", "cr.yaml");
    assert!(e.contains("not a WebAssembly component"), "{e}");

    let e = load_error(b"\0asm\x01\x00\x00\x00", "module.wasm");
    assert!(e.contains("not a valid WebAssembly component"), "{e}");
}

#[test]
fn a_second_start_loads_from_the_compile_cache() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = std::fs::read(test_guests::HOSTILE).unwrap();
    let load = || {
        let runtime = Runtime::new(limits(), Some(Cache::new(dir.path()))).unwrap();
        runtime
            .load(&wasm, "hostile.wasm", &Context::default())
            .unwrap()
    };
    let first = load();
    assert!(!first.from_cache());
    let mut cached: Vec<PathBuf> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    cached.sort();
    let names: Vec<String> = cached
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    let (compiled, description) = if names[0].ends_with(".cwasm") {
        (&cached[0], &cached[1])
    } else {
        (&cached[1], &cached[0])
    };
    let compiled_name = compiled.file_name().unwrap().to_string_lossy();
    assert!(
        compiled_name.starts_with(first.sha256()) && compiled_name.contains("wasmtime48."),
        "{compiled_name}"
    );
    let description_name = description.file_name().unwrap().to_string_lossy();
    assert!(
        description_name.starts_with(first.sha256())
            && description_name.ends_with(".describe.json"),
        "{description_name}"
    );
    let second = load();
    assert!(second.from_cache());
    assert_eq!(second.info(), first.info());

    // The description comes from the cache, not from a call: an edit to it shows.
    let text = std::fs::read_to_string(description).unwrap();
    let version = format!("\"version\":\"{}\"", first.info().version);
    assert!(text.contains(&version), "{text}");
    std::fs::write(
        description,
        text.replace(&version, "\"version\":\"edited\""),
    )
    .unwrap();
    assert_eq!(load().info().version, "edited");

    // A description another context asked for is not reused.
    let runtime = Runtime::new(limits(), Some(Cache::new(dir.path()))).unwrap();
    let other = Context {
        api_group: "lux.cloud".to_owned(),
        ..Context::default()
    };
    let lux = runtime.load(&wasm, "hostile.wasm", &other).unwrap();
    assert_eq!(lux.info().version, first.info().version);

    // Damaged entries are ignored and replaced, never trusted. (The host maps compiled
    // components; it only ever replaces cache files by renaming, so no component it has loaded
    // is damaged in place, here or by another host sharing the directory.)
    let expected = first.info().clone();
    drop((first, second, lux));
    std::fs::write(compiled, b"garbage").unwrap();
    std::fs::write(description, b"{\"name\":\"hostile\"}").unwrap();
    let third = load();
    assert!(!third.from_cache());
    assert_eq!(third.info(), &expected);
    assert!(std::fs::metadata(compiled).unwrap().len() > 1000);
    assert!(
        std::fs::read_to_string(description)
            .unwrap()
            .contains(&version)
    );
}

#[test]
fn cache_entries_unused_for_30_days_are_removed_when_the_host_writes() {
    let dir = tempfile::tempdir().unwrap();
    let ago = |days: u64| std::time::SystemTime::now() - Duration::from_secs(days * 24 * 3600);
    let file = |name: &str, modified| {
        let path = dir.path().join(name);
        std::fs::write(&path, b"x").unwrap();
        std::fs::File::options()
            .append(true)
            .open(&path)
            .unwrap()
            .set_modified(modified)
            .unwrap();
        path
    };
    let stale = [
        file("old-wasmtime47.0.0-0.cwasm", ago(40)),
        file("old-host0.0.1-0.describe.json", ago(31)),
        file(".123-0.tmp", ago(60)),
    ];
    let recent = file("recent-wasmtime48.0.0-0.cwasm", ago(29));
    let foreign = file("notes.txt", ago(400));

    let wasm = std::fs::read(test_guests::HOSTILE).unwrap();
    let load = || {
        Runtime::new(limits(), Some(Cache::new(dir.path())))
            .unwrap()
            .load(&wasm, "hostile.wasm", &Context::default())
            .unwrap()
    };
    let first = load();
    assert!(!first.from_cache());
    for path in &stale {
        assert!(!path.exists(), "{} was not removed", path.display());
    }
    assert!(recent.exists() && foreign.exists());

    // A load from the cache renews what it used, so entries in use never age out.
    let compiled: Vec<PathBuf> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains(first.sha256()))
        .collect();
    assert_eq!(compiled.len(), 2, "{compiled:?}");
    for path in &compiled {
        std::fs::File::options()
            .append(true)
            .open(path)
            .unwrap()
            .set_modified(ago(20))
            .unwrap();
    }
    assert!(load().from_cache());
    for path in &compiled {
        let age = std::fs::metadata(path)
            .unwrap()
            .modified()
            .unwrap()
            .elapsed()
            .unwrap_or_default();
        assert!(age < Duration::from_secs(60), "{}: {age:?}", path.display());
    }
}

/// The compiled form depends on nothing in the environment: the compiler process runs with none,
/// and what it writes must be what the operator, whatever its environment, would have written.
#[test]
fn the_environment_does_not_change_what_a_plugin_compiles_to() {
    let wasm = std::fs::read(test_guests::HOSTILE).unwrap();
    let sha256 = host::units::sha256_hex(&wasm);
    let compile = |env: &[(&str, &str)]| {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_host"))
            .arg("compile-component")
            .arg(format!("--cache-dir={}", dir.path().display()))
            .arg(format!("--sha256={sha256}"))
            .env_clear()
            .envs(env.iter().copied())
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(&wasm).unwrap();
        assert!(child.wait().unwrap().success());
        let files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let name = e.file_name().to_string_lossy().into_owned();
                (name, std::fs::read(e.path()).unwrap())
            })
            .collect();
        files
    };
    let bare = compile(&[]);
    assert_eq!(
        bare.len(),
        1,
        "{:?}",
        bare.iter().map(|f| &f.0).collect::<Vec<_>>()
    );
    let detailed = compile(&[("WASMTIME_BACKTRACE_DETAILS", "1")]);
    assert_eq!(
        detailed.iter().map(|f| &f.0).collect::<Vec<_>>(),
        bare.iter().map(|f| &f.0).collect::<Vec<_>>()
    );
    assert!(detailed[0].1 == bare[0].1, "the compiled bytes differ");
}

#[test]
fn a_plugin_is_compiled_in_a_process_of_its_own_whose_failure_fails_only_the_load() {
    let wasm = std::fs::read(test_guests::HOSTILE).unwrap();
    let ctx = Context::default();
    let compiled = |dir: &std::path::Path| {
        std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .flatten()
                    .filter(|e| e.file_name().to_string_lossy().ends_with(".cwasm"))
                    .count()
            })
            .unwrap_or(0)
    };
    let capped = |dir: &std::path::Path, exe: &str, cap: Option<u64>| {
        Runtime::new(limits(), Some(Cache::new(dir)))
            .unwrap()
            .compiling_apart(PathBuf::from(exe), cap)
    };
    let apart = |dir: &std::path::Path, exe: &str| capped(dir, exe, None);
    let refused = |dir: &std::path::Path, exe: &str, wasm: &[u8]| {
        apart(dir, exe)
            .load(wasm, "hostile.wasm", &ctx)
            .unwrap_err()
            .to_string()
    };

    // `host compile-component` writes the compiled file (its engine has no instance pool, this
    // one has: the one file serves both); this process maps it, and it renders. A cap the
    // compile fits in changes nothing.
    let dir = tempfile::tempdir().unwrap();
    let plugin = capped(dir.path(), env!("CARGO_BIN_EXE_host"), Some(256 << 20))
        .load(&wasm, "hostile.wasm", &ctx)
        .unwrap();
    assert!(!plugin.from_cache());
    assert_eq!(compiled(dir.path()), 1);
    assert!(plugin.render(&hostile_resource("ok"), &ctx).is_ok());
    // The file is the other process's: a runtime that cannot compile apart (no executable)
    // and finds it usable loads it from the cache.
    let again = apart(dir.path(), "/nonexistent/host")
        .load(&wasm, "hostile.wasm", &ctx)
        .unwrap();
    assert!(
        again.from_cache(),
        "the compiler process's file was not usable here"
    );

    // Under a cap it does not fit in, the compiler runs out of memory: the load fails and
    // says which setting to raise, and the component is not compiled here instead.
    let dir = tempfile::tempdir().unwrap();
    let e = capped(dir.path(), env!("CARGO_BIN_EXE_host"), Some(8 << 20))
        .load(&wasm, "hostile.wasm", &ctx)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with(
            "plugin hostile.wasm: compiling it needs more memory than the compiler may take (8Mi, --compile-memory): raise it"
        ),
        "{e}"
    );
    assert_eq!(compiled(dir.path()), 0);

    // What does not compile there fails the load with wasmtime's reason, and nothing is cached.
    let dir = tempfile::tempdir().unwrap();
    let mut broken = wasm.clone();
    broken.truncate(wasm.len() / 2);
    let e = refused(dir.path(), env!("CARGO_BIN_EXE_host"), &broken);
    assert!(
        e.starts_with("plugin hostile.wasm: ") && e.contains("not a valid WebAssembly component"),
        "{e}"
    );
    assert_eq!(compiled(dir.path()), 0);

    // A compiler process that says the component does not compile (exit 1), or that dies, is
    // the load's failure, not this process's: the compile was not done here (it would have
    // succeeded).
    let scripts = tempfile::tempdir().unwrap();
    let script = |name: &str, body: &str| {
        use std::os::unix::fs::PermissionsExt;
        let path = scripts.path().join(name);
        std::fs::write(&path, format!("#!/bin/sh\ncat >/dev/null\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path.display().to_string()
    };
    let refusing = script("refusing", "echo 'no such thing' >&2; exit 1");
    let e = refused(dir.path(), &refusing, &wasm);
    assert!(
        e.ends_with("not a valid WebAssembly component: no such thing"),
        "{e}"
    );
    let dying = script("dying", "kill -9 $$");
    let e = refused(dir.path(), &dying, &wasm);
    assert!(
        e.contains("the compiler process was killed") && e.contains("signal: 9"),
        "{e}"
    );
    assert_eq!(compiled(dir.path()), 0);

    // One that fails otherwise (a `host` without the command, a cache it cannot write) is
    // not the component's fault: compiled here.
    let plugin = apart(dir.path(), "/bin/false")
        .load(&wasm, "hostile.wasm", &ctx)
        .unwrap();
    assert_eq!(compiled(dir.path()), 1);
    assert!(plugin.render(&hostile_resource("ok"), &ctx).is_ok());

    // No executable to run: compiled here, as without the option.
    let dir = tempfile::tempdir().unwrap();
    let plugin = apart(dir.path(), "/nonexistent/host")
        .load(&wasm, "hostile.wasm", &ctx)
        .unwrap();
    assert_eq!(compiled(dir.path()), 1);
    assert!(plugin.render(&hostile_resource("ok"), &ctx).is_ok());
}
