//! `host inspect`: what a plugin is, from a file or a registry.

use std::process::ExitCode;

use clap::Args;

use super::{Error, ReportFormat, SubjectArgs, emit};

/// `host inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The plugin, and how it is reached and reported on.
    #[command(flatten)]
    pub subject: SubjectArgs,
    /// A signature policy (as `host run --plugin-signatures` takes it): also say whether it lets
    /// this plugin through (a plugin from a registry).
    #[arg(long, value_name = "FILE")]
    pub plugin_signatures: Option<std::path::PathBuf>,
}

pub(super) fn run(args: &InspectArgs) -> Result<ExitCode, Error> {
    let policy = match &args.plugin_signatures {
        Some(path) => Some(crate::signature::Policy::from_file(path)?),
        None => None,
    };
    let args = &args.subject;
    let subject = crate::publish::Subject::parse(&args.plugin)?;
    let runtime = args.sandbox.runtime()?;
    let options = args.registries.options()?;
    let mut report = crate::publish::inspect(
        &runtime,
        &args.sandbox.context(),
        &subject,
        &options,
        args.sandbox.store().as_ref(),
    )?;
    // A plugin from a registry: the signatures stored beside it, and what a policy says.
    if let crate::publish::Subject::Oci(_) = subject {
        let pinned = crate::oci::Reference::parse(report["source"].as_str().unwrap_or_default())?;
        let (seen, verdict) = crate::publish::block_on(async {
            let seen = crate::signature::seen(&pinned, &options).await;
            let verdict = match &policy {
                Some(p) => Some(p.check(&pinned, &options).await),
                None => None,
            };
            (seen, verdict)
        })?;
        report["signatures"] = match seen {
            Ok(seen) => serde_json::to_value(seen).map_err(Error::Report)?,
            Err(e) => serde_json::json!({ "error": e.to_string() }),
        };
        if let Some(verdict) = verdict {
            report["policy"] = match verdict {
                Ok(v) => {
                    serde_json::json!({ "allowed": true, "verdict": v.to_string(), "rule": v.rule })
                }
                Err(e) => serde_json::json!({ "allowed": false, "verdict": e.to_string() }),
            };
        }
    }
    match args.output {
        ReportFormat::Text => emit(&crate::publish::text(&report))?,
        ReportFormat::Json => emit(&format!(
            "{}\n",
            serde_json::to_string_pretty(&report).map_err(Error::Report)?
        ))?,
    }
    Ok(ExitCode::SUCCESS)
}
