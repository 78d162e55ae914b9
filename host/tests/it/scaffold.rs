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

/// The dependency `host new` writes by default, `guest-kit = { git = KIT_GIT, tag = "vX.Y.Z" }`,
/// as cargo fetches it: github.com cannot be reached from here, so git is told (`insteadOf`, as
/// a mirror is configured) to fetch that URL from a clone of this checkout tagged with the
/// host's version. Cargo finds guest-kit inside the repository and builds it from there, with
/// the workspace's inherited fields and the copy of the contract it carries.
#[test]
fn a_rust_plugin_is_scaffolded_and_builds_against_guest_kit_from_git() {
    let dir = tempfile::tempdir().unwrap();
    let mirror = dir.path().join("wasm-operator.git");
    let git = |args: &[&str]| {
        let out = Command::new("git").args(args).output().expect("git runs");
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let root = root().display().to_string();
    let at = mirror.display().to_string();
    git(&["clone", "--quiet", "--bare", "--no-local", &root, &at]);
    git(&["-C", &at, "tag", host::scaffold::KIT_TAG, "HEAD"]);

    let name = "hello-git";
    let project = dir.path().join(name);
    let out = Command::new(env!("CARGO_BIN_EXE_host"))
        .args(["new", name, "--lang", "rust", "--dir"])
        .arg(&project)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let manifest = std::fs::read_to_string(project.join("Cargo.toml")).unwrap();
    let line = format!(
        "guest-kit = {{ git = \"{}\", tag = \"{}\" }}",
        host::scaffold::KIT_GIT,
        host::scaffold::KIT_TAG
    );
    assert!(manifest.contains(&line), "{manifest}");

    // Only the fetch is redirected; the manifest is the one an author gets.
    let redirect = format!("url.file://{at}.insteadOf");
    let target = scaffold_target();
    let out = Command::new("cargo")
        .args(["test", "--quiet"])
        .current_dir(&project)
        .env("CARGO_TARGET_DIR", &target)
        .env("CARGO_NET_GIT_FETCH_WITH_CLI", "true")
        .env("GIT_CONFIG_COUNT", "1")
        .env("GIT_CONFIG_KEY_0", &redirect)
        .env("GIT_CONFIG_VALUE_0", host::scaffold::KIT_GIT)
        .output()
        .expect("cargo runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "cargo test failed:\n{text}");
    assert!(text.contains("test result: ok. 3 passed"), "{text}");
    let lock = std::fs::read_to_string(project.join("Cargo.lock")).unwrap();
    assert!(
        lock.contains(&format!(
            "source = \"git+{}?tag={}#",
            host::scaffold::KIT_GIT,
            host::scaffold::KIT_TAG
        )),
        "guest-kit came from the git dependency:\n{lock}"
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

/// The built-in plugins have the layout `host new --lang rust` writes (but for what makes a
/// project of its own: its own workspace and toolchain file), their examples are the ones the
/// README renders, and each builds, checks and tests by its own `./build.sh`.
#[test]
fn the_built_in_plugins_have_the_scaffolds_layout_and_build() {
    let own_project = ["Cargo.toml", "rust-toolchain.toml"];
    let scaffolded: Vec<String> = host::scaffold::files(
        "x",
        host::scaffold::Lang::Rust,
        &host::scaffold::Kit::Git(host::scaffold::KIT_GIT.into()),
    )
    .unwrap()
    .into_iter()
    .map(|f| f.path.to_owned())
    .filter(|p| !p.starts_with("src/") && !own_project.contains(&p.as_str()))
    .collect();
    let cache = tempfile::tempdir().unwrap();
    for guest in ["service", "datastore", "kvcluster"] {
        let dir = root().join("guests").join(guest);
        for file in &scaffolded {
            assert!(dir.join(file).is_file(), "guests/{guest}: no {file}");
        }
        let example = std::fs::read_to_string(dir.join("example.yaml")).unwrap();
        let copy = std::fs::read_to_string(root().join(format!("examples/{guest}.yaml")));
        assert!(
            copy.is_ok_and(|c| c == example),
            "examples/{guest}.yaml is not guests/{guest}/example.yaml: run scripts/generate"
        );
        let text = build(&dir, cache.path());
        assert!(
            text.contains("\npassed\n"),
            "{guest}: host check passed:\n{text}"
        );
        assert!(
            text.contains(&format!("push {guest}.wasm REGISTRY/plugins/{guest}:0.1.0")),
            "{guest}: says how to push:\n{text}"
        );
        std::fs::remove_file(dir.join(format!("{guest}.wasm"))).unwrap();
    }
}

/// The contract is the same everywhere it is copied: guest-kit's, the examples', and what
/// `host new` writes (`scripts/generate` copies it).
#[test]
fn every_copy_of_the_contract_is_the_contract() {
    let wit = std::fs::read_to_string(root().join("wit/plugin.wit")).unwrap();
    for copy in [
        "guests/kit/wit/plugin.wit",
        "guests/service/wit/plugin.wit",
        "guests/datastore/wit/plugin.wit",
        "guests/kvcluster/wit/plugin.wit",
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
    let target = scaffold_target();
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

/// The target directory of the scaffolded Rust builds: a cache of its own, since the tests' own
/// target directory is in use.
fn scaffold_target() -> std::path::PathBuf {
    let toolchain = host::scaffold::TOOLCHAIN;
    std::env::var_os("HOME")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
        .join(format!(".cache/wasm-operator/scaffold-target-{toolchain}"))
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
