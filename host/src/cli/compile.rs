//! `host compile-component`: compiles the component on stdin into the compile cache and exits.
//! Not for people: `host run` runs it to compile a plugin in a process of its own, so that the
//! compiler's memory goes when it exits and a compiler crash is not the operator's (see
//! `plugin::cache::Apart`).

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::Error;
use crate::plugin::{COMPILE_THREADS, Cache, Compiled};

/// `host compile-component`.
#[derive(Debug, Args)]
pub struct CompileArgs {
    /// The compile cache to write into.
    #[arg(long, value_name = "DIR")]
    pub cache_dir: PathBuf,
    /// The sha256 (hex) of the component on stdin, which names its compiled file.
    #[arg(long)]
    pub sha256: String,
    /// The most memory this process may take (its data segment: the heap and every private
    /// writable mapping), in bytes: `host run --compile-memory`. A compile that needs more
    /// fails here, not in the operator's container.
    #[arg(long, value_name = "BYTES")]
    pub memory_cap: Option<u64>,
}

pub(super) fn run(args: &CompileArgs) -> Result<ExitCode, Error> {
    // The compiler's threads, started before the cap: a thread whose stack the cap refused
    // would end the process as something other than out of memory. Two, whatever the CPUs (see
    // `COMPILE_THREADS`).
    rayon::ThreadPoolBuilder::new()
        .num_threads(COMPILE_THREADS)
        .build_global()
        .map_err(|e| Error::Compiler(e.to_string()))?;
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
    let cache = Cache::new(&args.cache_dir);
    // Read by the process that ran this one: exit 1 and the reason alone when the component
    // does not compile; 3 when the cache cannot be written (that process then compiles it
    // itself); 2 for the other errors, as every command.
    match crate::plugin::compile_into_cache(&cache, &wasm, &sha256)? {
        Compiled::Written => Ok(ExitCode::SUCCESS),
        Compiled::Invalid(reason) => {
            eprintln!("{reason}");
            Ok(ExitCode::FAILURE)
        }
        Compiled::Unwritable(e) => {
            eprintln!(
                "cannot write the compiled component into {}: {e}",
                args.cache_dir.display()
            );
            Ok(ExitCode::from(3))
        }
    }
}

/// Caps this process's data segment (`RLIMIT_DATA`: since Linux 4.7 the heap and every private
/// writable mapping, so also what the allocator maps for large blocks) at `bytes`, hard and
/// soft: an allocation past it fails, and the process aborts saying so.
#[cfg(target_os = "linux")]
fn cap_memory(bytes: u64) -> Result<(), Error> {
    use rustix::process::{Resource, Rlimit, setrlimit};
    let limit = Rlimit {
        current: Some(bytes),
        maximum: Some(bytes),
    };
    setrlimit(Resource::Data, limit).map_err(|e| Error::MemoryCap {
        bytes,
        source: e.into(),
    })
}

/// Elsewhere `RLIMIT_DATA` does not hold mappings (macOS, the BSDs): a cap asked for is refused
/// rather than not kept (`host run` refuses `--compile-memory` there before it runs this).
#[cfg(not(target_os = "linux"))]
fn cap_memory(bytes: u64) -> Result<(), Error> {
    Err(Error::MemoryCap {
        bytes,
        source: std::io::Error::other("not kept on this system (Linux only)"),
    })
}
