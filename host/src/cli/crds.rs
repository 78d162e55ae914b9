//! `host crds`: the CRD of every Kind the plugins serve, and the `Plugin` Kind's.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::{Error, PluginArgs, emit};
use crate::documents::{self, Format};

/// `host crds`.
#[derive(Debug, Args)]
pub struct CrdsArgs {
    /// Plugins and limits.
    #[command(flatten)]
    pub plugins: PluginArgs,
    /// Write one file per CRD (`<plural>.<group>.yaml`) into this directory instead of stdout.
    #[arg(long, value_name = "DIR")]
    pub output_dir: Option<PathBuf>,
}

pub(super) fn run(args: &CrdsArgs) -> Result<ExitCode, Error> {
    let registry = args.plugins.registry()?;
    let mut crds = crate::crd::crds(&registry)?;
    // The Kind that names plugins to load live (`host run --plugin-resources`).
    crds.push(crate::api::crd());
    match &args.output_dir {
        None => emit(&documents::write(&crds, Format::Yaml)?)?,
        Some(dir) => {
            for (name, text) in crate::crd::files(&crds)? {
                let path = dir.join(name);
                std::fs::create_dir_all(dir)
                    .and_then(|()| std::fs::write(&path, text))
                    .map_err(|source| Error::Write {
                        path: path.clone(),
                        source,
                    })?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
