//! `host compile-component`: compiles the component on stdin into the compile cache and exits.
//! Not for people: `host run` runs it to compile a plugin in a process of its own, so that the
//! compiler's memory goes when it exits and a compiler crash is not the operator's (see
//! `plugin::cache::Apart`).

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::Error;
use crate::plugin::{Cache, Limits};

/// `host compile-component`.
#[derive(Debug, Args)]
pub struct CompileArgs {
    /// The compile cache to write into.
    #[arg(long, value_name = "DIR")]
    pub cache_dir: PathBuf,
    /// The sha256 (hex) of the component on stdin, which names its compiled file.
    #[arg(long)]
    pub sha256: String,
    /// `--plugin-memory` of the runtime that will load it, in bytes (the engine's settings).
    #[arg(long, value_name = "BYTES")]
    pub plugin_memory: usize,
    /// The most memory this process may take (its data segment: the heap and every private
    /// writable mapping), in bytes: `host run --compile-memory`. A compile that needs more
    /// fails here, not in the operator's container.
    #[arg(long, value_name = "BYTES")]
    pub memory_cap: Option<u64>,
}

pub(super) fn run(args: &CompileArgs) -> Result<ExitCode, Error> {
    if let Some(bytes) = args.memory_cap {
        cap_memory(bytes)?;
    }
    let mut wasm = Vec::new();
    std::io::stdin()
        .read_to_end(&mut wasm)
        .map_err(|e| Error::Usage(format!("cannot read the component on stdin: {e}")))?;
    let sha256 = crate::units::sha256_hex(&wasm);
    if sha256 != args.sha256 {
        return Err(Error::Usage(format!(
            "the component on stdin has sha256 {sha256}, not {}",
            args.sha256
        )));
    }
    let limits = Limits {
        memory_bytes: args.plugin_memory,
        ..Limits::default()
    };
    let cache = Cache::new(&args.cache_dir);
    // Read by the process that ran this one: exit 1 and the reason alone when the component
    // does not compile; 3 when the cache cannot be written (that process then compiles it
    // itself); 2 for the other errors, as every command.
    match crate::plugin::compile_into_cache(&limits, &cache, &wasm, &sha256)? {
        Ok(Ok(())) => Ok(ExitCode::SUCCESS),
        Ok(Err(reason)) => {
            eprintln!("{reason}");
            Ok(ExitCode::FAILURE)
        }
        Err(e) => {
            eprintln!(
                "cannot write the compiled component into {}: {e}",
                args.cache_dir.display()
            );
            Ok(ExitCode::from(3))
        }
    }
}

/// Caps this process's data segment (`RLIMIT_DATA`: since Linux 4.7 the heap and every private
/// writable mapping, so also what the allocator maps for large blocks and thread stacks) at
/// `bytes`, hard and soft: an allocation past it fails, and the process aborts saying so.
#[cfg(unix)]
fn cap_memory(bytes: u64) -> Result<(), Error> {
    use rustix::process::{Resource, Rlimit, setrlimit};
    let limit = Rlimit {
        current: Some(bytes),
        maximum: Some(bytes),
    };
    setrlimit(Resource::Data, limit).map_err(|e| {
        Error::Usage(format!(
            "cannot cap this process's memory at {bytes} bytes: {e}"
        ))
    })
}

/// Where there is no `RLIMIT_DATA`, nothing is capped (the container's limit still holds).
#[cfg(not(unix))]
fn cap_memory(bytes: u64) -> Result<(), Error> {
    tracing::warn!("--memory-cap {bytes} is not applied on this platform");
    Ok(())
}
