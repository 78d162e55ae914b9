//! `host check`: a plugin checked before it is published or served.

use std::process::ExitCode;

use clap::Args;

use super::{Error, ReportFormat, SubjectArgs, emit};

/// `host check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The plugin, and how it is reached and reported on.
    #[command(flatten)]
    pub subject: SubjectArgs,
    /// Resources of the plugin's Kinds to render: YAML or JSON files, or directories of them.
    #[arg(value_name = "EXAMPLE")]
    pub examples: Vec<String>,
}

pub(super) fn run(args: &CheckArgs) -> Result<ExitCode, Error> {
    let subject = &args.subject;
    let (wasm, source, examples) = match read(args) {
        Ok(read) => read,
        // With `-o json`, a check that could not run is reported too (and exits 2).
        Err(e) if subject.output == ReportFormat::Json => {
            eprintln!("error: {e}");
            let report = crate::check::Report::not_run(&subject.plugin, e.to_string());
            emit(&json(&report)?)?;
            return Ok(e.exit_code());
        }
        Err(e) => return Err(e),
    };
    let runtime = subject.sandbox.runtime()?;
    let report = crate::check::check(
        &runtime,
        &wasm,
        &source,
        &subject.sandbox.context(),
        &examples,
    );
    let text = match subject.output {
        ReportFormat::Text => report.text(),
        ReportFormat::Json => json(&report)?,
    };
    emit(&text)?;
    Ok(if report.passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The plugin (its bytes and where they came from) and the examples, read.
fn read(args: &CheckArgs) -> Result<(Vec<u8>, String, Vec<crate::check::Example>), Error> {
    let subject = &args.subject;
    let crate::publish::Fetched { wasm, source, .. } =
        crate::publish::Subject::parse(&subject.plugin)?.fetch(
            &subject.registries.options()?,
            subject.sandbox.store().as_ref(),
        )?;
    let mut examples = Vec::new();
    super::each_resource(&args.examples, |place, resource| {
        let resource = resource.map_err(|reason| Error::NotAResource {
            place: place.to_owned(),
            reason,
        })?;
        examples.push(crate::check::Example {
            source: format!("{place} ({}/{})", resource.kind, resource.name),
            resource,
        });
        Ok(())
    })?;
    Ok((wasm, source, examples))
}

fn json(report: &crate::check::Report) -> Result<String, Error> {
    let mut json = serde_json::to_string_pretty(report).map_err(Error::Report)?;
    json.push('\n');
    Ok(json)
}
