//! `host diff`: what `host run` would change, previewed by server-side dry run.

use std::process::ExitCode;

use clap::Args;

use super::{ClusterArgs, Error, PluginArgs, ReportFormat, emit};

/// `host diff`.
#[derive(Debug, Args)]
pub struct DiffArgs {
    /// Plugins and limits (`--plugin NEW` previews a new version of a plugin).
    #[command(flatten)]
    pub plugins: PluginArgs,
    /// The cluster.
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Preview every resource of the plugins' Kinds in the cluster (with `--plugin NEW`: an
    /// upgrade of that plugin, before it is rolled out) instead of files.
    #[arg(long, conflicts_with = "files")]
    pub all: bool,
    /// With `--all`, only the resources of this namespace.
    #[arg(long, short = 'n', requires = "all", value_parser = super::args::parse_namespace, value_name = "NS")]
    pub namespace: Option<String>,
    /// Report format.
    #[arg(short, long, value_enum, default_value_t = ReportFormat::Text)]
    pub output: ReportFormat,
    /// YAML or JSON files of resources, or directories of them; `-` reads standard input.
    #[arg(value_name = "FILE", required_unless_present = "all")]
    pub files: Vec<String>,
}

pub(super) fn run(args: &DiffArgs) -> Result<ExitCode, Error> {
    let registry = args.plugins.registry()?;
    let mut resources = Vec::new();
    if !args.all {
        super::each_resource(&args.files, |place, resource| {
            resources.push(resource.map_err(|reason| Error::NotAResource {
                place: place.to_owned(),
                reason,
            })?);
            Ok(())
        })?;
    }
    let runtime = super::runtime(None)?;
    let mut notes = Vec::new();
    let mut report = runtime.block_on(async {
        let client = args.cluster.client(None).await?;
        if args.all {
            // With `--plugin NEW`, the Kinds of the plugins given (a built-in one it replaces is
            // previewed with it); else every Kind served.
            (resources, notes) = crate::diff::listed(
                &client,
                &registry,
                args.namespace.as_deref(),
                !args.plugins.plugins.is_empty(),
            )
            .await?;
        }
        Ok::<_, Error>(crate::diff::diff(&client, &registry, &resources, !args.all).await)
    })?;
    report.notes = notes;
    match args.output {
        ReportFormat::Text => emit(&report.text())?,
        ReportFormat::Json => emit(&format!(
            "{}\n",
            serde_json::json!({
                "entries": report.entries,
                "errors": report.errors,
                "notes": report.notes,
                "summary": {
                    "create": report.count(crate::diff::Action::Create),
                    "change": report.count(crate::diff::Action::Change),
                    "delete": report.count(crate::diff::Action::Delete),
                },
            })
        ))?,
    }
    Ok(if !report.errors.is_empty() {
        ExitCode::from(2)
    } else if report.differs() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
