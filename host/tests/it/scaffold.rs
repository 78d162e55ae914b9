//! `host new`: a plugin project of each language, written outside the checkout, built, checked
//! and tested by its own `./build.sh` with nothing but what docs/plugins.md tells an author to
//! install (rustup, Node.js and npm, python3; the packages come from crates.io, npm and the
//! Python package index). The Rust one takes guest-kit from a copy of `guests/kit` alone.

use std::path::Path;
use std::process::Command;

use crate::support::root;

/// Writes the project `name` in `lang` under `dir` with `host new ARGS`, runs its `./build.sh`,
/// and returns what it printed; asserts that it passed.
fn scaffold_and_build(dir: &Path, name: &str, lang: &str, extra: &[&str]) -> String {
    let project = dir.join(name);
    let mut args = vec!["new", name, "--lang", lang];
    let at = project.display().to_string();
    args.extend(["--dir", &at]);
    args.extend(extra);
    crate::support::succeeded(
        &format!("host new --lang {lang}"),
        crate::support::host_in(dir, &args),
    );
    let text = build(&project, &dir.join("cache"));
    assert!(
        text.contains("\npassed\n"),
        "{lang}: host check passed:\n{text}"
    );
    assert!(
        text.contains(&format!("push {name}.wasm REGISTRY/plugins/{name}:0.1.0")),
        "{lang}: says how to push:\n{text}"
    );
    assert!(project.join(format!("{name}.wasm")).is_file());
    text
}

#[test]
fn a_rust_plugin_is_scaffolded_and_builds_against_a_copy_of_guest_kit_alone() {
    let dir = tempfile::tempdir().unwrap();
    // guest-kit as an author would have it: its folder, copied out of the repository.
    let kit = dir.path().join("guest-kit");
    for part in ["Cargo.toml", "src", "wit"] {
        copy(&root().join("guests/kit").join(part), &kit.join(part));
    }
    let kit = kit.display().to_string();
    let out = scaffold_and_build(dir.path(), "hello-rust", "rust", &["--kit", &kit]);
    assert!(
        out.contains("test result: ok. 3 passed"),
        "cargo test ran: {out}"
    );
}

#[test]
fn a_javascript_plugin_is_scaffolded_and_builds() {
    let dir = tempfile::tempdir().unwrap();
    scaffold_and_build(dir.path(), "hello-js", "javascript", &[]);
}

#[test]
fn a_python_plugin_is_scaffolded_and_builds() {
    let dir = tempfile::tempdir().unwrap();
    scaffold_and_build(dir.path(), "hello-py", "python", &[]);
}

/// The example plugins have the layout `host new` writes, and build, check and test by their
/// own `./build.sh` once copied out of the checkout (what is in .gitignore left behind).
#[test]
fn the_example_plugins_have_the_scaffolds_layout_and_build_once_copied() {
    let scaffolded: Vec<String> = host::scaffold::files(
        "x",
        host::scaffold::Lang::Python,
        &host::scaffold::Kit::Git(host::scaffold::KIT_GIT.into()),
    )
    .unwrap()
    .into_iter()
    .map(|f| f.path.to_owned())
    .filter(|p| !p.starts_with("src/"))
    .collect();
    for (example, artifact) in [
        ("static-site", "static-site.wasm"),
        ("redirect", "redirect.wasm"),
    ] {
        let from = root().join("examples/plugins").join(example);
        for file in &scaffolded {
            assert!(from.join(file).is_file(), "{example}: no {file}");
        }
        let dir = tempfile::tempdir().unwrap();
        let to = dir.path().join(example);
        for entry in std::fs::read_dir(&from).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if ["node_modules", ".venv", "__pycache__", artifact].contains(&name.as_ref()) {
                continue;
            }
            copy(&entry.path(), &to.join(&*name));
        }
        let text = build(&to, &dir.path().join("cache"));
        assert!(
            text.contains(&format!("push {artifact} REGISTRY/plugins/{example}:0.1.0")),
            "{example}: says how to push:\n{text}"
        );
    }
}

/// The contract is the same everywhere it is copied: guest-kit's, the examples', and what
/// `host new` writes (`scripts/generate` copies it).
#[test]
fn every_copy_of_the_contract_is_the_contract() {
    let wit = std::fs::read_to_string(root().join("wit/plugin.wit")).unwrap();
    for copy in [
        "guests/kit/wit/plugin.wit",
        "examples/plugins/static-site/wit/plugin.wit",
        "examples/plugins/redirect/wit/plugin.wit",
    ] {
        let text = std::fs::read_to_string(root().join(copy)).unwrap_or_default();
        assert!(
            text == wit,
            "{copy} is not wit/plugin.wit: run scripts/generate"
        );
    }
}

/// Runs `project`'s `./build.sh` with this build of `host` and the compile cache `cache`; what it
/// printed, asserting that it passed.
fn build(project: &Path, cache: &Path) -> String {
    // A cache of its own for a Rust build: the tests' own target directory is in use.
    let toolchain = host::scaffold::TOOLCHAIN;
    let target = std::env::var_os("HOME")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
        .join(format!(".cache/wasm-operator/scaffold-target-{toolchain}"));
    let out = Command::new(project.join("build.sh"))
        .current_dir(project)
        .env("HOST", env!("CARGO_BIN_EXE_host"))
        .env("CARGO_TARGET_DIR", &target)
        .env("WASM_OPERATOR_CACHE", cache)
        .output()
        .expect("build.sh runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{}: ./build.sh failed:\n{text}",
        project.display()
    );
    text
}

fn copy(from: &Path, to: &Path) {
    if from.is_dir() {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            copy(&entry.path(), &to.join(entry.file_name()));
        }
    } else {
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(from, to).unwrap();
    }
}
