//! `host completion SHELL`: the shell's completion script for `host`, as kubectl and helm print
//! theirs.

use std::process::ExitCode;

use clap::{Args, CommandFactory as _};
use clap_complete::Shell;

use super::{Cli, Error};

/// `host completion`.
#[derive(Debug, Args)]
pub struct CompletionArgs {
    /// The shell: bash (`source <(host completion bash)`), zsh (`host completion zsh >
    /// "${fpath[1]}/_host"`), fish (`host completion fish > ~/.config/fish/completions/host.fish`),
    /// elvish or powershell.
    #[arg(value_enum, value_name = "SHELL")]
    pub shell: Shell,
}

pub(super) fn run(args: &CompletionArgs) -> Result<ExitCode, Error> {
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut Cli::command(), "host", &mut script);
    super::emit(&String::from_utf8_lossy(&script))?;
    Ok(ExitCode::SUCCESS)
}
