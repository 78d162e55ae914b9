//! `render-fuzz`: see the library's documentation, and `docs/testing.md`.

use clap::Parser as _;

fn main() -> std::process::ExitCode {
    render_fuzz::Args::parse().run()
}
