//! The host's errors.

use std::path::PathBuf;

/// The longest field path of a render error that is kept (bytes); the rest is cut with a note.
///
/// Field paths are short (`spec.ports[1].containerPort`); a longer one is a guest misbehaving.
pub const MAX_ERROR_FIELD: usize = 512;

/// The longest message of a plugin error that is kept (bytes); the rest is cut with a note.
///
/// Messages end up in status conditions, whose `message` the API server caps at 32 KiB, and in
/// events and logs. 4 KiB is far more than any real explanation needs, and leaves room for the
/// plugin's name, the resource and the field in the same condition.
pub const MAX_ERROR_MESSAGE: usize = 4 << 10;

/// The host's errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// wasmtime could not be set up.
    #[error("cannot set up the WebAssembly engine: {0}")]
    Engine(String),
    /// A plugin file could not be read.
    #[error("cannot read plugin {path}: {source}")]
    ReadPlugin {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A plugin could not be loaded.
    #[error("plugin {plugin}: {reason}")]
    Load {
        /// The file, or `built-in NAME`.
        plugin: String,
        reason: String,
    },
    /// Two plugins from the command line serve the same Kind.
    #[error("plugins {first} and {second} both serve {kind}; pass only one of them")]
    KindConflict {
        /// `Kind.group`.
        kind: String,
        first: String,
        second: String,
    },
    /// An input file could not be read.
    #[error("cannot read {path}: {source}")]
    ReadInput {
        /// The file (`-` for stdin).
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// An input file is not YAML or JSON.
    #[error("{path}: {reason}")]
    ParseInput { path: String, reason: String },
    /// A CRD schema referred to a Kubernetes type this host does not know.
    #[error(
        "plugin {plugin}: the schema of {kind} refers to {reference}, which is not a Kubernetes type this host knows"
    )]
    UnknownSchemaRef {
        plugin: String,
        kind: String,
        reference: String,
    },
    /// Output could not be written.
    #[error("cannot write output: {0}")]
    Output(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
