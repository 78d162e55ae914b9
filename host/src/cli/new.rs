//! `host new`: a plugin project in Rust, JavaScript or Python, ready to build outside this
//! repository.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::Error;
use crate::scaffold::{self, Kit, Lang};

/// `host new`.
#[derive(Debug, Args)]
pub struct NewArgs {
    /// The plugin's name: lower-case letters, digits and '-' (`hello-world` serves the Kind
    /// `HelloWorld` in `hello-world.example.com`).
    #[arg(value_name = "NAME")]
    pub name: String,
    /// The language it is written in.
    #[arg(long, value_enum)]
    pub lang: Lang,
    /// Where to write it (default: ./NAME); it must not exist or be empty.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Rust: take guest-kit from this checkout of it (the `guests/kit` folder of the
    /// wasm-operator repository) instead of from git.
    #[arg(long, value_name = "PATH", conflicts_with = "kit_git")]
    pub kit: Option<PathBuf>,
    /// Rust: take guest-kit from this git repository.
    #[arg(long, value_name = "URL", default_value = scaffold::KIT_GIT)]
    pub kit_git: String,
}

pub(super) fn run(args: &NewArgs) -> Result<ExitCode, Error> {
    let kit = match &args.kit {
        // Absolute, so that the project can move.
        Some(path) => Kit::Path(std::path::absolute(path).map_err(|source| Error::Read {
            path: path.clone(),
            source,
        })?),
        None => Kit::Git(args.kit_git.clone()),
    };
    let files = scaffold::files(&args.name, args.lang, &kit)?;
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(&args.name));
    scaffold::write(&dir, &files)?;
    let mut text = String::new();
    for f in &files {
        text.push_str(&format!("  {}\n", f.path));
    }
    eprintln!(
        "host: wrote the {} plugin {} in {}:\n{text}Next: cd {} && ./build.sh\n",
        format!("{:?}", args.lang).to_lowercase(),
        args.name,
        dir.display(),
        dir.display()
    );
    Ok(ExitCode::SUCCESS)
}
