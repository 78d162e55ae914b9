//! `host render`: resources rendered offline, with no cluster, the manifests printed.

use std::process::ExitCode;

use clap::Args;

use super::{Error, PluginArgs, emit};
use crate::documents::{self, Format};

/// `host render`.
#[derive(Debug, Args)]
pub struct RenderArgs {
    /// Plugins and limits.
    #[command(flatten)]
    pub plugins: PluginArgs,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Format::Yaml)]
    pub output: Format,
    /// YAML or JSON files of resources, or directories of them; `-` reads standard input.
    #[arg(value_name = "FILE", required = true)]
    pub files: Vec<String>,
}

pub(super) fn run(args: &RenderArgs) -> Result<ExitCode, Error> {
    let registry = args.plugins.registry()?;
    let mut objects = Vec::new();
    let mut failures = Vec::new();
    super::each_resource(&args.files, |place, resource| {
        match resource {
            Err(e) => failures.push(format!("{place}: {e}")),
            Ok(resource) => {
                let place = format!("{place} ({}/{})", resource.kind, resource.name);
                match registry.render_reported(&resource) {
                    Ok((rendered, warnings)) => {
                        // What the plugin left out goes to stderr; the rest renders.
                        for w in &warnings {
                            eprintln!("warning: {place}: {w}");
                        }
                        objects.extend(rendered);
                    }
                    Err(e) => failures.push(format!("{place}: {e}")),
                }
            }
        }
        Ok(())
    })?;
    if !failures.is_empty() {
        for f in &failures {
            eprintln!("error: {f}");
        }
        eprintln!(
            "{} resource(s) could not be rendered; nothing was printed",
            failures.len()
        );
        return Ok(ExitCode::from(1));
    }
    emit(&documents::write(&objects, args.output)?)?;
    Ok(ExitCode::SUCCESS)
}
