//! `host push`: a plugin pushed to an OCI registry.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::{Error, RegistryArgs, SandboxArgs, emit};

/// `host push`.
#[derive(Debug, Args)]
pub struct PushArgs {
    /// The context the plugin is described under before it is pushed.
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    /// How registries are reached.
    #[command(flatten)]
    pub registries: RegistryArgs,
    /// The plugin component.
    #[arg(value_name = "FILE.wasm")]
    pub file: PathBuf,
    /// Where to: `[oci://]REGISTRY/REPOSITORY[:TAG]` (the tag defaults to latest).
    #[arg(value_name = "REF")]
    pub reference: String,
}

pub(super) fn run(args: &PushArgs) -> Result<ExitCode, Error> {
    let reference = crate::oci::Reference::parse(&args.reference)?;
    let runtime = args.sandbox.runtime()?;
    let pushed = crate::publish::push(
        &runtime,
        &args.sandbox.context(),
        &args.file,
        &reference,
        &args.registries.options()?,
    )?;
    emit(&format!("{}{pushed}\n", crate::oci::SCHEME))?;
    Ok(ExitCode::SUCCESS)
}
