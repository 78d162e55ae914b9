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
}

pub(super) fn run(args: &InspectArgs) -> Result<ExitCode, Error> {
    let args = &args.subject;
    let subject = crate::publish::Subject::parse(&args.plugin)?;
    let runtime = args.sandbox.runtime()?;
    let report = crate::publish::inspect(
        &runtime,
        &args.sandbox.context(),
        &subject,
        &args.registries.options()?,
        args.sandbox.store().as_ref(),
    )?;
    match args.output {
        ReportFormat::Text => emit(&crate::publish::text(&report))?,
        ReportFormat::Json => emit(&format!(
            "{}\n",
            serde_json::to_string_pretty(&report).map_err(Error::Report)?
        ))?,
    }
    Ok(ExitCode::SUCCESS)
}
