//! `host`: the operator binary. All logic lives in the library.
use std::process::ExitCode;

fn main() -> ExitCode {
    host::cli::Cli::parse_and_run()
}
