//! The host's errors.

use std::path::PathBuf;
use std::time::Duration;

/// What went wrong inside a plugin call. Each is reported on the resource being rendered; none
/// stops the host.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PluginError {
    /// The call ran past its deadline.
    #[error("ran past its deadline of {0:?} and was stopped")]
    Deadline(Duration),
    /// The call tried to grow memory past the cap.
    #[error(
        "tried to grow its memory to {tried} bytes, over the cap of {limit} bytes, and was stopped"
    )]
    Memory {
        /// The cap.
        limit: usize,
        /// The size it asked for.
        tried: usize,
    },
    /// The guest panicked.
    #[error("{0}")]
    Panic(String),
    /// Any other trap.
    #[error("trapped: {0}")]
    Trap(String),
    /// The guest refused the resource.
    #[error("{}", if field.is_empty() { message.clone() } else { format!("{field}: {message}") })]
    Render {
        /// The field to blame.
        field: String,
        /// Why.
        message: String,
    },
    /// The guest returned more than the output cap.
    #[error("returned {bytes} bytes of manifests, over the cap of {limit} bytes")]
    OutputTooLarge {
        /// What it returned.
        bytes: usize,
        /// The cap.
        limit: usize,
    },
    /// A returned manifest is not a JSON object.
    #[error("returned manifest {index} that is not valid: {reason}")]
    BadManifest {
        /// Its position.
        index: usize,
        /// Why.
        reason: String,
    },
    /// `describe` returned something unusable.
    #[error("described itself wrongly: {0}")]
    BadDescription(String),
    /// A returned object failed the host's checks.
    #[error("{0}")]
    Guard(String),
}

impl PluginError {
    /// A short CamelCase reason, for status conditions, events and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Deadline(_) => "PluginTimeout",
            Self::Memory { .. } => "PluginMemoryExceeded",
            Self::Panic(_) | Self::Trap(_) => "PluginTrapped",
            Self::Render { .. } => "InvalidSpec",
            Self::OutputTooLarge { .. } | Self::BadManifest { .. } | Self::BadDescription(_) => {
                "PluginMisbehaved"
            }
            Self::Guard(_) => "ChildRefused",
        }
    }
}

/// The host's errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// wasmtime could not be set up.
    #[error("cannot set up the WebAssembly engine: {0}")]
    Engine(String),
    /// A plugin file could not be read.
    #[error("cannot read plugin {path}: {source}")]
    ReadPlugin {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A plugin could not be loaded.
    #[error("plugin {plugin}: {reason}")]
    Load {
        /// The file, or `built-in NAME`.
        plugin: String,
        /// Why.
        reason: String,
    },
    /// Two plugins from the command line serve the same Kind.
    #[error("plugins {first} and {second} both serve {kind}; pass only one of them")]
    KindConflict {
        /// `Kind.group`.
        kind: String,
        /// One plugin.
        first: String,
        /// The other.
        second: String,
    },
    /// An input file could not be read.
    #[error("cannot read {path}: {source}")]
    ReadInput {
        /// The file (`-` for stdin).
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// An input file is not YAML or JSON.
    #[error("{path}: {reason}")]
    ParseInput {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// A CRD schema referred to a Kubernetes type this host does not know.
    #[error(
        "plugin {plugin}: the schema of {kind} refers to {reference}, which is not a Kubernetes type this host knows"
    )]
    UnknownSchemaRef {
        /// The plugin.
        plugin: String,
        /// The Kind.
        kind: String,
        /// The `$ref`.
        reference: String,
    },
    /// Output could not be written.
    #[error("cannot write output: {0}")]
    Output(String),
}

/// The host's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
