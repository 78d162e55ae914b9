//! `host check`, as a plugin author runs it: the built-in plugins pass with their examples, and
//! each defect of the hostile test guests fails the check it belongs to, named in the report.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

use crate::support::root;

fn host(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_host"))
        .args(args)
        .current_dir(root())
        .env(
            "WASM_OPERATOR_CACHE",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache"),
        )
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .expect("host runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `host check -o json ARGS...`: its exit code and report.
fn check_json(args: &[&str]) -> (i32, Value) {
    // Well above what a render takes, even with the whole test suite running on two cores.
    check_within("2s", args)
}

/// As [`check_json`], with a deadline for each call of `timeout`.
fn check_within(timeout: &str, args: &[&str]) -> (i32, Value) {
    let mut all = vec!["check", "-o", "json", "--plugin-timeout", timeout];
    all.extend(args);
    let out = host(&all);
    let code = out.status.code().expect("an exit code");
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "host {all:?}: not a JSON report ({e}), exit {code}:\n{}{}",
            text(&out.stdout),
            text(&out.stderr)
        )
    });
    (code, report)
}

/// The details of the failing findings of `check` in `report`, in order.
fn failures(report: &Value, check: &str) -> Vec<String> {
    report["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| f["check"] == check && f["outcome"] == "fail")
        .map(|f| f["detail"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// The first finding of `check` in `report`: its outcome and detail.
fn finding(report: &Value, check: &str) -> (String, String) {
    let f = report["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .find(|f| f["check"] == check)
        .unwrap_or_else(|| panic!("no {check} in {report:#}"));
    (
        f["outcome"].as_str().unwrap().to_owned(),
        f["detail"].as_str().unwrap().to_owned(),
    )
}

/// What a guest that hands the host more than the default output cap (and headers) is told.
const HANDED_TOO_MUCH: &str =
    "PluginMisbehaved: plugin hostile: handed the host more than 4292224 bytes in one call";

fn hostile_example(dir: &Path, mode: &str) -> String {
    let path = dir.join(format!("{mode}.yaml"));
    std::fs::write(
        &path,
        format!(
            "apiVersion: test.wasm-operator.dev/v1\nkind: Hostile\nmetadata:\n  name: h\n  \
             namespace: app\nspec:\n  mode: {mode}\n"
        ),
    )
    .unwrap();
    path.display().to_string()
}

#[test]
fn the_built_in_plugins_pass_with_their_examples() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(
        host::plugin::BUILTINS.len(),
        3,
        "an example for each built-in plugin"
    );
    for (builtin, example) in host::plugin::BUILTINS.iter().zip([
        "examples/service.yaml",
        "examples/datastore.yaml",
        "examples/kvcluster.yaml",
    ]) {
        let wasm = dir.path().join(format!("{}.wasm", builtin.name));
        std::fs::write(&wasm, builtin.wasm).unwrap();
        let wasm = wasm.display().to_string();
        let (code, report) = check_json(&[&wasm, example]);
        assert_eq!(code, 0, "{report:#}");
        assert_eq!(report["passed"], true);
        assert_eq!(report["component"]["sha256"], builtin.sha256);
        assert_eq!(report["contract"], "1.2.0");
        assert!(
            finding(&report, "contract").1.contains("and reporting"),
            "{report:#}"
        );
        for check in [
            "compile", "contract", "imports", "describe", "schemas", "render", "pure",
        ] {
            assert_eq!(finding(&report, check).0, "pass", "{check}: {report:#}");
        }
        // The person's report says the same.
        let out = host(&["check", &wasm, example]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let shown = text(&out.stdout);
        assert!(shown.contains("PASS  pure"), "{shown}");
        assert!(shown.trim_end().ends_with("passed"), "{shown}");
    }
}

/// The JavaScript example plugin (componentize-js, every WASI feature of the engine off) passes
/// every check with its example: it imports nothing but the contract's types, and is pure.
#[test]
fn the_javascript_plugin_passes_with_its_example() {
    let wasm = testenv::static_site_plugin().expect("scripts/js-plugin builds it");
    let (code, report) = check_json(&[
        &wasm.display().to_string(),
        "examples/plugins/static-site/example.yaml",
    ]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(
        report["kinds"][0], "StaticSite.sites.example.com (v1alpha1)",
        "{report:#}"
    );
    assert_eq!(
        report["component"]["imports"],
        serde_json::json!(["wasm-operator:plugin/types@1.2.0"]),
        "{report:#}"
    );
    for check in ["render", "pure"] {
        assert_eq!(finding(&report, check).0, "pass", "{report:#}");
    }
    assert!(
        finding(&report, "contract").1.contains("and reporting"),
        "{report:#}"
    );
}

/// A plugin built against contract 1.0, as published then, passes on a host that speaks 1.1;
/// a 1.1 plugin's warnings are in the report (they fail nothing), and a status that names a
/// field its schema does not fails the render check.
#[test]
fn a_1_0_plugin_passes_and_warnings_are_reported_without_failing() {
    let dir = tempfile::tempdir().unwrap();
    let legacy = dir.path().join("legacy.yaml");
    std::fs::write(
        &legacy,
        "apiVersion: test.wasm-operator.dev/v1\nkind: Legacy\nmetadata: {name: old, namespace: app}\nspec: {message: hi}\n",
    )
    .unwrap();
    let (code, report) = check_json(&[test_guests::CONTRACT_1_0, &legacy.display().to_string()]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["contract"], "1.0.0", "{report:#}");
    assert!(
        !finding(&report, "contract").1.contains("reporting"),
        "{report:#}"
    );

    let warn = hostile_example(dir.path(), "warn");
    let (code, report) = check_json(&[test_guests::HOSTILE, &warn]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(
        report["warnings"],
        serde_json::json!([format!(
            "{warn}: document 1 (Hostile/h): spec.mode: was asked to warn"
        )]),
        "{report:#}"
    );
    let out = host(&["check", test_guests::HOSTILE, &warn]);
    let shown = text(&out.stdout);
    assert!(
        shown.contains("WARN  render    ") && shown.contains("was asked to warn"),
        "{shown}"
    );

    let undeclared = hostile_example(dir.path(), "undeclared-status");
    let (code, report) = check_json(&[test_guests::HOSTILE, &undeclared]);
    assert_eq!(code, 1, "{report:#}");
    let (outcome, detail) = finding(&report, "render");
    assert_eq!(outcome, "fail", "{report:#}");
    assert!(
        detail.contains("status: PluginMisbehaved")
            && detail.contains("is not among the status fields Hostile declares"),
        "{detail}"
    );
}

#[test]
fn without_examples_the_render_checks_are_skipped_not_passed() {
    let (code, report) = check_json(&[test_guests::HOSTILE]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(finding(&report, "render").0, "skip");
    assert_eq!(finding(&report, "pure").0, "skip");
    assert_eq!(finding(&report, "schemas").0, "pass");
}

#[test]
fn each_defect_of_the_hostile_guest_fails_its_check() {
    let dir = tempfile::tempdir().unwrap();
    let ok = hostile_example(dir.path(), "ok");
    let (code, report) = check_json(&[test_guests::HOSTILE, &ok]);
    assert_eq!(code, 0, "the well-behaved mode passes: {report:#}");

    // Each mode, and what the failing render check says about it.
    for (mode, says) in [
        ("panic", "PluginTrapped: plugin hostile: panicked"),
        (
            "loop",
            "PluginTimeout: plugin hostile: ran past its deadline of 2s",
        ),
        (
            "alloc",
            "PluginMemoryExceeded: plugin hostile: tried to grow its memory",
        ),
        // Stopped while it is copied out: at the 4 MiB output cap and room for its headers.
        ("huge-output", HANDED_TOO_MUCH),
        ("many-manifests", HANDED_TOO_MUCH),
        (
            "other-namespace",
            "may only write to the resource's own namespace `app`",
        ),
        (
            "undeclared-kind",
            "ClusterRoleBinding (rbac.authorization.k8s.io/v1) is not a child kind",
        ),
        ("bad-name", "invalid name `Not_A_Valid_Name`"),
        (
            "error",
            "InvalidSpec: plugin hostile: spec.mode: was asked to fail",
        ),
        ("huge-error", HANDED_TOO_MUCH),
    ] {
        let example = hostile_example(dir.path(), mode);
        // A million manifests take a while to make in a debug build of the guest.
        let timeout = if mode == "many-manifests" {
            "10s"
        } else {
            "2s"
        };
        let (code, report) = check_within(timeout, &[test_guests::HOSTILE, &ok, &example]);
        assert_eq!(code, 1, "{mode}: {report:#}");
        assert_eq!(report["passed"], false);
        // One entry for the example that rendered, one for the one that failed.
        let failures = failures(&report, "render");
        assert_eq!(failures.len(), 1, "{mode}: {report:#}");
        assert_eq!(finding(&report, "render").0, "pass", "{mode}: {report:#}");
        let detail = &failures[0];
        assert!(detail.contains(&format!("{mode}.yaml")), "{mode}: {detail}");
        assert!(detail.contains(says), "{mode}: no `{says}` in {detail}");
        assert!(!detail.contains("ok.yaml"), "{mode}: {detail}");
        // What did render is still checked for purity.
        assert_eq!(finding(&report, "pure").0, "pass", "{mode}: {report:#}");
    }

    // Each example that fails is an entry of its own.
    let (panic, error) = (
        hostile_example(dir.path(), "panic"),
        hostile_example(dir.path(), "error"),
    );
    let (code, report) = check_json(&[test_guests::HOSTILE, &panic, &error]);
    assert_eq!(code, 1, "{report:#}");
    let failures = failures(&report, "render");
    assert_eq!(failures.len(), 2, "{report:#}");
    assert!(failures[0].contains("panic.yaml") && !failures[0].contains("error.yaml"));
    assert!(failures[1].contains("error.yaml") && !failures[1].contains("panic.yaml"));

    // State kept between calls: each fresh instance gives the same bytes, a second call in one
    // instance does not.
    let counter = hostile_example(dir.path(), "counter");
    let (code, report) = check_json(&[test_guests::HOSTILE, &counter]);
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(finding(&report, "render").0, "pass");
    let (outcome, detail) = finding(&report, "pure");
    assert_eq!(outcome, "fail", "{report:#}");
    assert!(detail.contains("keeps state between calls"), "{detail}");
}

#[test]
fn a_plugin_that_does_not_load_fails_at_the_step_that_broke() {
    // Built against a future major version of the contract.
    let (code, report) = check_json(&[test_guests::INCOMPATIBLE]);
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(finding(&report, "compile").0, "pass");
    let (outcome, detail) = finding(&report, "contract");
    assert_eq!(outcome, "fail", "{report:#}");
    assert!(
        detail.contains("2."),
        "names the version it found: {detail}"
    );
    assert!(
        report["component"]["exports"].is_array(),
        "what it exports is still shown: {report:#}"
    );
    for check in ["imports", "describe", "schemas", "render", "pure"] {
        assert_eq!(finding(&report, check).0, "skip", "{check}: {report:#}");
    }

    // Two memories, each under the cap, together over it: refused when `describe` runs.
    let (code, report) = check_json(&[test_guests::SEVERAL_MEMORIES]);
    assert_eq!(code, 1, "{report:#}");
    let (outcome, detail) = finding(&report, "describe");
    assert_eq!(outcome, "fail", "{report:#}");
    assert!(
        detail.contains("all its linear memories together"),
        "{detail}"
    );

    // A plural that climbs out of a directory: refused as the API server refuses it, at load.
    let (code, report) = check_json(&[test_guests::HOSTILE_CLIMBING]);
    assert_eq!(code, 1, "{report:#}");
    let (outcome, detail) = finding(&report, "describe");
    assert_eq!(outcome, "fail", "{report:#}");
    assert!(
        detail.contains("Kind `Hostile`: plural: `../../../x` is not a valid DNS label"),
        "{detail}"
    );
    // Nor does any other command make a path of it.
    let out_dir = tempfile::tempdir().unwrap();
    let crds_in = out_dir.path().join("crds");
    let out = host(&[
        "crds",
        "--no-builtins",
        "--plugin",
        test_guests::HOSTILE_CLIMBING,
        "--output-dir",
        &crds_in.display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("plural"),
        "{}",
        text(&out.stderr)
    );
    let written: Vec<_> = walk(out_dir.path());
    assert!(written.is_empty(), "wrote {written:?}");
    let climbed = crds_in.join("../../../x.test.wasm-operator.dev.yaml");
    assert!(!climbed.exists(), "wrote {}", climbed.display());

    // Not a component at all.
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.wasm");
    std::fs::write(&junk, "not wasm").unwrap();
    let (code, report) = check_json(&[&junk.display().to_string()]);
    assert_eq!(code, 1, "{report:#}");
    let (outcome, detail) = finding(&report, "compile");
    assert_eq!(outcome, "fail");
    assert!(detail.contains("not a WebAssembly component"), "{detail}");
}

#[test]
fn what_cannot_be_checked_exits_2_naming_the_file() {
    let out = host(&["check", "no-such-plugin.wasm"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("no-such-plugin.wasm"),
        "{}",
        text(&out.stderr)
    );
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "apiVersion: test.wasm-operator.dev/v1\nkind: Hostile\n",
    )
    .unwrap();
    let out = host(&["check", test_guests::HOSTILE, &bad.display().to_string()]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("bad.yaml") && err.contains("metadata.name"),
        "{err}"
    );
    // With -o json, a report too, saying why nothing was checked.
    for args in [
        &["no-such-plugin.wasm"][..],
        &[test_guests::HOSTILE, &bad.display().to_string()],
    ] {
        let (code, report) = check_json(args);
        assert_eq!(code, 2, "{report:#}");
        assert_eq!(report["passed"], false, "{report:#}");
        assert_eq!(report["findings"], serde_json::json!([]), "{report:#}");
        let error = report["error"].as_str().unwrap_or_default();
        assert!(
            error.contains("no-such-plugin.wasm") || error.contains("bad.yaml"),
            "{report:#}"
        );
    }
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}
