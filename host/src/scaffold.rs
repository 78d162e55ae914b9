//! `host new`: a plugin project that builds, tests and checks outside this repository, in Rust,
//! JavaScript or Python. Every project has the same layout: the contract (`wit/`), the plugin's
//! source, an example resource (`example.yaml`), the children of that example as a cluster would
//! report them (`test/observed.yaml`), and one command, `./build.sh`, that builds the component,
//! runs `host check` on it with the example, checks the status the operator would write (`host
//! render --observed`) and prints how to push it.
//!
//! The templates are in `host/templates/`, built into the host; `{{word}}` in them is replaced.

use std::path::{Path, PathBuf};

/// The languages a plugin can be scaffolded in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    Rust,
    Javascript,
    Python,
}

/// Where a Rust plugin takes `guest-kit` from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kit {
    /// A checkout of it (the `guests/kit` folder of this repository, or a copy of that folder).
    Path(PathBuf),
    /// A git repository holding it.
    Git(String),
}

/// The repository `guest-kit` comes from by default.
pub const KIT_GIT: &str = "https://github.com/hanzoai/wasm-operator";

/// The release of it a project is pinned to: this host's own (`v` and its version), so that the
/// guest-kit a project builds with speaks the contract this host serves, and a project builds
/// the same later.
pub const KIT_TAG: &str = concat!("v", env!("CARGO_PKG_VERSION"));

/// Names no plugin may take: Rust's keywords (cargo refuses them as package names) and the
/// crates a project builds with or beside (a crate of one of those names shadows it).
const RESERVED: [&str; 60] = [
    "as",
    "async",
    "await",
    "break",
    "const",
    "continue",
    "crate",
    "dyn",
    "else",
    "enum",
    "extern",
    "false",
    "fn",
    "for",
    "if",
    "impl",
    "in",
    "let",
    "loop",
    "match",
    "mod",
    "move",
    "mut",
    "pub",
    "ref",
    "return",
    "self",
    "static",
    "struct",
    "super",
    "trait",
    "true",
    "type",
    "unsafe",
    "use",
    "where",
    "while",
    "abstract",
    "become",
    "box",
    "do",
    "final",
    "gen",
    "macro",
    "override",
    "priv",
    "try",
    "typeof",
    "unsized",
    "virtual",
    "yield",
    "std",
    "core",
    "alloc",
    "test",
    "proc-macro",
    "guest-kit",
    "wit-bindgen",
    "serde",
    "serde-json",
];

/// The toolchain a Rust plugin is built with (the one the host is built with).
pub const TOOLCHAIN: &str = "1.95.0";

/// The componentize-py a Python plugin is built with.
pub const COMPONENTIZE_PY: &str = "0.25.1";

/// Why a project could not be written.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "{name:?} cannot name a plugin: lower-case letters, digits and '-', starting with a letter, at most 40 characters (it names the crate or package, the Kind and its API group)"
    )]
    Name { name: String },
    #[error(
        "{name:?} cannot name a plugin: it is a Rust keyword or the name of a crate the project builds with; choose another (`{name}-plugin`, say)"
    )]
    Reserved { name: String },
    #[error("{} exists and is not empty: give another NAME or --dir", .dir.display())]
    Exists { dir: PathBuf },
    #[error("cannot write {}: {source}", .path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One file of a project: its path in the project, its text, and whether it is run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct File {
    pub path: &'static str,
    pub text: String,
    pub executable: bool,
}

/// The contract, as this host speaks it.
const WIT: &str = include_str!("../../wit/plugin.wit");

macro_rules! template {
    ($path:literal) => {
        ($path, include_str!(concat!("../templates/", $path)))
    };
}

/// The files every project has, by their path in the project and their template.
const COMMON: [(&str, &str); 4] = [
    ("README.md", include_str!("../templates/common/README.md")),
    (
        "example.yaml",
        include_str!("../templates/common/example.yaml"),
    ),
    (
        "test/observed.yaml",
        include_str!("../templates/common/test/observed.yaml"),
    ),
    (".gitignore", include_str!("../templates/common/gitignore")),
];

/// Each language's own files, by their template's path under `templates/`; the path in the
/// project is what follows the language's folder.
fn own(lang: Lang) -> Vec<(&'static str, &'static str)> {
    match lang {
        Lang::Rust => vec![
            template!("rust/Cargo.toml"),
            template!("rust/rust-toolchain.toml"),
            template!("rust/src/lib.rs"),
            template!("rust/tests/render.rs"),
        ],
        Lang::Javascript => vec![
            template!("javascript/package.json"),
            template!("javascript/package-lock.json"),
            template!("javascript/build.mjs"),
            template!("javascript/src/plugin.js"),
        ],
        Lang::Python => vec![template!("python/src/app.py")],
    }
}

/// `./build.sh`: the same start and end in every language (check, the status test, how to
/// push), around the language's own steps that leave `NAME.wasm`.
fn build_script(lang: Lang) -> String {
    let steps = match lang {
        Lang::Rust => include_str!("../templates/rust/build-steps.sh"),
        Lang::Javascript => include_str!("../templates/javascript/build-steps.sh"),
        Lang::Python => include_str!("../templates/python/build-steps.sh"),
    };
    [
        include_str!("../templates/common/build-head.sh"),
        steps,
        include_str!("../templates/common/build-tail.sh"),
    ]
    .concat()
}

/// Whether `name` can name a plugin: a DNS label of at most 40 characters starting with a
/// letter (it becomes a crate or package name, a Kind and part of an API group).
fn valid(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= 40
        && chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.ends_with('-')
}

/// The Kind a plugin named `name` serves: its words, each capitalized (`hello-world`:
/// `HelloWorld`).
fn kind(name: &str) -> String {
    name.split('-')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// The plural of a lower-case Kind, as English makes it (`redis`: `redises`, `policy`:
/// `policies`, `hello`: `hellos`); the CRD's resource name.
fn plural(kind: &str) -> String {
    let vowel = |c: char| "aeiou".contains(c);
    if ["s", "x", "z", "ch", "sh"]
        .iter()
        .any(|end| kind.ends_with(end))
    {
        format!("{kind}es")
    } else if let Some(stem) = kind.strip_suffix('y')
        && stem.chars().last().is_some_and(|c| !vowel(c))
    {
        format!("{stem}ies")
    } else {
        format!("{kind}s")
    }
}

/// `text` as a TOML basic string.
fn toml_string(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The files of a plugin project named `name` in `lang`.
pub fn files(name: &str, lang: Lang, kit: &Kit) -> Result<Vec<File>, Error> {
    if !valid(name) {
        return Err(Error::Name {
            name: name.to_owned(),
        });
    }
    if RESERVED.contains(&name) {
        return Err(Error::Reserved {
            name: name.to_owned(),
        });
    }
    let kind = kind(name);
    let kit = match kit {
        Kit::Path(path) => format!("{{ path = {} }}", toml_string(&path.display().to_string())),
        Kit::Git(url) => format!(
            "{{ git = {}, tag = {} }}",
            toml_string(url),
            toml_string(KIT_TAG)
        ),
    };
    let (language, lang_flag, needs, wit_note) = match lang {
        Lang::Rust => (
            "Rust",
            "rust",
            "It needs Rust through rustup, which installs the toolchain `rust-toolchain.toml` names, with the wasm32-wasip2 target.",
            "; guest-kit builds the bindings from its own copy of it",
        ),
        Lang::Javascript => (
            "JavaScript",
            "javascript",
            "It needs Node.js and npm; `npm ci` installs componentize-js as package-lock.json pins it.",
            "",
        ),
        Lang::Python => (
            "Python",
            "python",
            "It needs python3 with its venv module; componentize-py is installed into `.venv`.",
            "",
        ),
    };
    let words: [(&str, String); 14] = [
        ("name", name.to_owned()),
        ("crate", name.replace('-', "_")),
        ("Kind", kind.clone()),
        ("plural", plural(&kind.to_ascii_lowercase())),
        ("group", format!("{name}.example.com")),
        ("kit", kit),
        ("toolchain", TOOLCHAIN.to_owned()),
        ("componentize_py", COMPONENTIZE_PY.to_owned()),
        ("contract", env!("CONTRACT_VERSION").to_owned()),
        ("language", language.to_owned()),
        ("lang", lang_flag.to_owned()),
        ("artifact", format!("{name}.wasm")),
        ("needs", needs.to_owned()),
        ("wit_note", wit_note.to_owned()),
    ];
    let fill = |template: &str| {
        let mut text = template.to_owned();
        for (word, value) in &words {
            text = text.replace(&format!("{{{{{word}}}}}"), value);
        }
        text
    };
    let mut files: Vec<File> = COMMON
        .iter()
        .map(|(path, template)| File {
            path,
            text: fill(template),
            executable: false,
        })
        .collect();
    files.push(File {
        path: "wit/plugin.wit",
        text: WIT.to_owned(),
        executable: false,
    });
    for (template, text) in own(lang) {
        let path = template.split_once('/').map_or(template, |(_, p)| p);
        files.push(File {
            path,
            text: fill(text),
            executable: false,
        });
    }
    files.push(File {
        path: "build.sh",
        text: fill(&build_script(lang)),
        executable: true,
    });
    Ok(files)
}

/// Writes `files` into `dir`, which must not exist or be empty.
pub fn write(dir: &Path, files: &[File]) -> Result<(), Error> {
    if std::fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_some()) {
        return Err(Error::Exists {
            dir: dir.to_path_buf(),
        });
    }
    for file in files {
        let path = dir.join(file.path);
        let fail = |source| Error::Write {
            path: path.clone(),
            source,
        };
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(fail)?;
        }
        std::fs::write(&path, &file.text).map_err(fail)?;
        #[cfg(unix)]
        if file.executable {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
                .map_err(fail)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_placeholder_is_filled_in_every_language() {
        for lang in [Lang::Rust, Lang::Javascript, Lang::Python] {
            let files = files("hello-world", lang, &Kit::Path("/kit \"x\"".into())).unwrap();
            for f in &files {
                assert!(
                    !f.text.contains("{{") || f.path == "wit/plugin.wit",
                    "{lang:?} {}: a placeholder is left",
                    f.path
                );
            }
            let paths: Vec<&str> = files.iter().map(|f| f.path).collect();
            for common in [
                "wit/plugin.wit",
                "example.yaml",
                "test/observed.yaml",
                "build.sh",
            ] {
                assert!(
                    paths.contains(&common),
                    "{lang:?}: no {common} in {paths:?}"
                );
            }
            let example = &files
                .iter()
                .find(|f| f.path == "example.yaml")
                .unwrap()
                .text;
            assert!(
                example.contains("kind: HelloWorld")
                    && example.contains("apiVersion: hello-world.example.com/v1alpha1"),
                "{example}"
            );
        }
        let rust = files("hello-world", Lang::Rust, &Kit::Path("/kit \"x\"".into())).unwrap();
        let cargo = &rust.iter().find(|f| f.path == "Cargo.toml").unwrap().text;
        assert!(
            cargo.contains(r#"guest-kit = { path = "/kit \"x\"" }"#),
            "{cargo}"
        );
        let git = files("p", Lang::Rust, &Kit::Git(KIT_GIT.into())).unwrap();
        assert!(git.iter().any(|f| {
            f.text.contains(&format!(
                "guest-kit = {{ git = \"{KIT_GIT}\", tag = \"v{}\" }}",
                env!("CARGO_PKG_VERSION")
            ))
        }));
    }

    #[test]
    fn a_name_must_make_a_crate_a_kind_and_a_group() {
        for bad in ["", "Hello", "1st", "a_b", "a-", "a.b", &"a".repeat(41)] {
            assert!(
                matches!(
                    files(bad, Lang::Python, &Kit::Git(KIT_GIT.into())),
                    Err(Error::Name { .. })
                ),
                "{bad:?}"
            );
        }
        for reserved in ["test", "std", "fn", "guest-kit", "async"] {
            let e = files(reserved, Lang::Rust, &Kit::Git(KIT_GIT.into())).unwrap_err();
            assert!(matches!(e, Error::Reserved { .. }), "{reserved:?}: {e}");
        }
        assert_eq!(kind("hello-world-2"), "HelloWorld2");
        for (kind, plural) in [
            ("hello", "hellos"),
            ("redis", "redises"),
            ("policy", "policies"),
            ("gateway", "gateways"),
            ("box2", "box2s"),
            ("mailbox", "mailboxes"),
            ("batch", "batches"),
        ] {
            assert_eq!(super::plural(kind), plural);
        }
    }

    #[test]
    fn the_toolchain_is_the_hosts() {
        let pinned = include_str!("../../rust-toolchain.toml");
        assert!(
            pinned.contains(&format!("channel = \"{TOOLCHAIN}\"")),
            "{pinned}"
        );
    }

    #[test]
    fn a_directory_that_is_not_empty_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("mine"), "").unwrap();
        let files = files("p", Lang::Python, &Kit::Git(KIT_GIT.into())).unwrap();
        assert!(matches!(
            write(dir.path(), &files),
            Err(Error::Exists { .. })
        ));
        let fresh = dir.path().join("p");
        write(&fresh, &files).unwrap();
        assert!(fresh.join("wit/plugin.wit").is_file());
    }
}
