//! `host dev`: the operator on a control plane of its own, for a demo.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use super::{Error, PluginArgs, shutdown_signal};

/// `host dev`.
#[derive(Debug, Args)]
pub struct DevArgs {
    /// Plugins and limits.
    #[command(flatten)]
    pub plugins: PluginArgs,
    /// Resources to apply: files or directories (default: the project's examples/).
    #[arg(value_name = "FILE|DIR")]
    pub inputs: Vec<String>,
    /// On Ctrl-C, stop the operator but leave the control plane running (it prints how to stop
    /// it).
    #[arg(long)]
    pub keep: bool,
}

pub(super) fn run(args: &DevArgs) -> Result<ExitCode, Error> {
    let registry = args.plugins.registry()?;
    let inputs = if args.inputs.is_empty() {
        vec![crate::dev::default_examples().display().to_string()]
    } else {
        args.inputs.clone()
    };
    let options = crate::dev::Options {
        render_wait: args.plugins.sandbox.plugin_timeout * 2 + Duration::from_secs(5),
        examples: inputs,
        keep: args.keep,
    };
    crate::dev::run(registry, &options, shutdown_signal())?;
    Ok(ExitCode::SUCCESS)
}
