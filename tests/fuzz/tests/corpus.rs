//! The fuzzer under `cargo test`: every input that ever broke a property is replayed, and a
//! short run with a fixed seed must find nothing.
//!
//! `corpus/` holds inputs whose bugs are fixed: they must pass. `corpus/open/` holds inputs whose
//! bugs are not fixed yet: each gets an ignored test here that says what still fails, and moves
//! to `corpus/` with the fix (none is open now).

use std::path::Path;
use std::process::{Command, Output};

fn fuzzer(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_render-fuzz"))
        .args(args)
        .output()
        .expect("render-fuzz runs")
}

fn report(out: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn every_input_that_once_broke_the_render_path_now_passes() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let files = std::fs::read_dir(&corpus)
        .expect("the corpus")
        .filter(|e| e.as_ref().is_ok_and(|e| e.path().is_file()))
        .count();
    assert!(files > 0, "the corpus is empty");
    let out = fuzzer(&["--replay", &corpus.display().to_string()]);
    assert!(out.status.success(), "{}", report(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("{files} file(s) replayed")),
        "{}",
        report(&out)
    );
}

fn replay(name: &str, extra: &[&str]) {
    let file = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(name);
    assert!(file.is_file(), "{} is missing", file.display());
    let mut args = vec!["--replay", file.to_str().expect("a UTF-8 path")];
    args.extend(extra);
    let out = fuzzer(&args);
    assert!(out.status.success(), "{}", report(&out));
}

/// Once open (`host render` applied no CRD schema, so a passed-through Kubernetes field out of
/// range rendered a Deployment the API server refuses); the host now refuses the spec, naming
/// its field. Replayed under `--strict`, which judges passed-through fields too.
#[test]
fn a_passed_through_int32_out_of_range_is_refused_naming_the_field() {
    replay("int32-overflow-in-passed-through-probe.json", &["--strict"]);
}

#[test]
fn ten_seconds_of_fuzzing_find_nothing() {
    // A fixed seed, so that a failure here is the same failure on every machine; failures go to
    // the build's scratch space, not the committed corpus.
    let found = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-found");
    let out = fuzzer(&[
        "--seconds",
        "10",
        "--seed",
        "1",
        "--corpus",
        &found.display().to_string(),
    ]);
    assert!(out.status.success(), "{}", report(&out));
}
