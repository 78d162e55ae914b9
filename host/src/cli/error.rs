//! What failed, in the user's terms, with its cause kept as the error's source; the exit code
//! follows from it.

use std::path::PathBuf;
use std::process::ExitCode;

/// Why a command did not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The async runtime could not start.
    #[error("could not start the async runtime: {0}")]
    Start(#[source] std::io::Error),
    /// The cluster could not be reached: no answer, or no client could be made.
    #[error("cannot reach the cluster: {0}")]
    Cluster(#[source] kube::Error),
    /// The metrics server's certificate cannot be used.
    #[error(transparent)]
    Metrics(#[from] crate::operator::secure::Error),
    /// The cluster did not answer.
    #[error("cannot reach the cluster at {server}: {source}")]
    Unreachable {
        /// The API server's address.
        server: String,
        #[source]
        source: kube::Error,
    },
    /// The command line asks for something the command does not do.
    #[error("{0}")]
    Usage(String),
    /// `host compile-component` could not cap its own memory.
    #[error("cannot cap this process's memory at {bytes} bytes: {source}")]
    MemoryCap {
        /// The cap asked for.
        bytes: u64,
        #[source]
        source: std::io::Error,
    },
    /// `host compile-component` could not start its compiler threads.
    #[error("cannot start the compiler's threads: {0}")]
    Compiler(String),
    /// No kubeconfig, or one that cannot be used (a file, a context).
    #[error("cannot use {what}: {reason}")]
    Kubeconfig {
        /// The file or context.
        what: String,
        /// Why.
        reason: String,
    },
    /// An input (a file, a document, a plugin, a flag's value) is not what the command needs.
    #[error(transparent)]
    Input(#[from] crate::Error),
    /// A document of an input file is not a resource.
    #[error("{place}: {reason}")]
    NotAResource {
        /// `FILE: document N`.
        place: String,
        /// Which field is wrong, and how.
        reason: crate::documents::FieldError,
    },
    /// `--render-memory` leaves no room for even one plugin call.
    #[error(
        "--render-memory {} is less than one plugin call may need, {} (--plugin-memory and {} times --plugin-output); raise it, or lower those",
        crate::units::mib(*budget), crate::units::mib(*needs), crate::plugin::OUTPUT_COPIES
    )]
    RenderMemoryTooSmall {
        /// `--render-memory`.
        budget: u64,
        /// What one call may need.
        needs: u64,
    },
    /// A plugin could not be pushed, pulled or looked at.
    #[error(transparent)]
    Publish(#[from] crate::publish::Error),
    /// A registry refused a plugin, or could not be reached.
    #[error(transparent)]
    Registry(#[from] crate::oci::Error),
    /// `host diff` could not list what it compares.
    #[error(transparent)]
    Diff(#[from] crate::diff::Error),
    /// The operator stopped on an error.
    #[error(transparent)]
    Operator(#[from] crate::operator::Error),
    /// The demo stopped on an error.
    #[cfg(feature = "dev")]
    #[error(transparent)]
    Dev(#[from] crate::dev::Error),
    /// `host verify` was given nothing to trust.
    #[error(
        "nothing is trusted: give --key, or --trusted-root with --certificate-identity and --certificate-oidc-issuer"
    )]
    NothingTrusted,
    /// A plugin project could not be written.
    #[error(transparent)]
    Scaffold(#[from] crate::scaffold::Error),
    /// Signatures could not be checked, or none counts.
    #[error(transparent)]
    Signature(#[from] crate::signature::Error),
    /// An endpoint `host probe` asked did not answer.
    #[error("{url}: {reason}")]
    Probe {
        /// What was asked.
        url: String,
        /// Why there is no answer.
        reason: String,
    },
    /// A file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Standard output could not be written.
    #[error("cannot write output: {0}")]
    Output(#[source] std::io::Error),
    /// A report could not be written as JSON.
    #[error("cannot write the report: {0}")]
    Report(#[source] serde_json::Error),
    /// A file could not be written.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// The exit code: 1 when what ran failed (the operator, the demo), 2 when the command could
    /// not run as asked.
    pub fn exit_code(&self) -> ExitCode {
        match self {
            Self::Operator(_) => ExitCode::FAILURE,
            // Verified, and not signed as trusted.
            Self::Signature(e) if e.is_refusal() => ExitCode::FAILURE,
            #[cfg(feature = "dev")]
            Self::Dev(_) => ExitCode::FAILURE,
            _ => ExitCode::from(2),
        }
    }
}
