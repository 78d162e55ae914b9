//! `host pull`: a plugin pulled from an OCI registry, checked against its digests.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::{Error, RegistryArgs, emit};

/// `host pull`.
#[derive(Debug, Args)]
pub struct PullArgs {
    /// How registries are reached.
    #[command(flatten)]
    pub registries: RegistryArgs,
    /// Refuse a reference that names a tag and no digest.
    #[arg(long)]
    pub require_digest: bool,
    /// Where to write the component (default: the repository's last name, with .wasm).
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// What to pull: `[oci://]REGISTRY/REPOSITORY[:TAG][@sha256:DIGEST]`.
    #[arg(value_name = "REF")]
    pub reference: String,
}

pub(super) fn run(args: &PullArgs) -> Result<ExitCode, Error> {
    let reference = crate::oci::Reference::parse(&args.reference)?;
    let pulled = crate::publish::block_on(crate::oci::pull(
        &reference,
        &args.registries.options()?,
        None,
        args.require_digest,
    ))??;
    let path = args.output.clone().unwrap_or_else(|| {
        let name = reference.repository.rsplit('/').next().unwrap_or("plugin");
        PathBuf::from(format!("{name}.wasm"))
    });
    std::fs::write(&path, &pulled.wasm).map_err(|source| Error::Write {
        path: path.clone(),
        source,
    })?;
    eprintln!(
        "host: pulled {} ({} bytes, {}) to {}",
        pulled.reference,
        pulled.wasm.len(),
        pulled.media_type,
        path.display()
    );
    emit(&format!("{}{}\n", crate::oci::SCHEME, pulled.reference))?;
    Ok(ExitCode::SUCCESS)
}
