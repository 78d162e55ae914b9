//! The host's errors.

use std::path::PathBuf;
use std::time::Duration;

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

/// What went wrong inside a plugin call. Each is reported on the resource being rendered; none
/// stops the host. [`PluginError::transient`] tells whether retrying the same call may succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PluginError {
    /// The call ran past its deadline.
    #[error("ran past its deadline of {0:?} and was stopped")]
    Deadline(Duration),
    /// The call tried to grow its memories, counted together, past the cap.
    #[error(
        "tried to grow its memory to {tried} bytes (all its linear memories together), over the cap of {limit} bytes, and was stopped"
    )]
    Memory {
        /// The cap.
        limit: usize,
        /// The total size it asked for.
        tried: usize,
    },
    /// The call needs more of the memory budget of calls in flight than the whole budget
    /// (`--render-memory`), so it never runs.
    #[error(
        "was not called: one call of it may need {} (its memory cap and {} times its output cap), more than all plugin calls in flight may have together, {} (--render-memory)",
        mib(*needs), crate::plugin::OUTPUT_COPIES, mib(*budget)
    )]
    OverBudget {
        /// What one call may need.
        needs: u64,
        /// The whole budget.
        budget: u64,
    },
    /// No instance could be made: the host's instance pool was exhausted by calls running at the
    /// same time. The plugin never ran.
    #[error("could not be started, too many plugin calls are running at once: {0}")]
    Busy(String),
    /// The guest panicked.
    #[error("{0}")]
    Panic(String),
    /// Any other trap.
    #[error("trapped: {0}")]
    Trap(String),
    /// The guest refused the resource. Both strings are cut to [`MAX_ERROR_FIELD`] and
    /// [`MAX_ERROR_MESSAGE`] bytes.
    #[error("{}", if field.is_empty() { message.clone() } else { format!("{field}: {message}") })]
    Render {
        /// The field to blame.
        field: String,
        /// Why.
        message: String,
    },
    /// The guest returned an error (field and message) larger than the output cap.
    #[error("returned an error of {bytes} bytes, over the cap of {limit} bytes")]
    ErrorTooLarge {
        /// The size of the field and message together.
        bytes: usize,
        /// The cap (the output cap).
        limit: usize,
    },
    /// The guest returned more than the output cap.
    #[error("returned {bytes} bytes of manifests, over the cap of {limit} bytes")]
    OutputTooLarge {
        /// What it returned.
        bytes: usize,
        /// The cap.
        limit: usize,
    },
    /// The guest handed the host more data in one call than the output cap (with room for the
    /// lists' and strings' headers) allows: refused while it was being copied out, before the
    /// host held it.
    #[error(
        "handed the host more than {limit} bytes in one call (the output cap, with room for its lists' headers) and was stopped"
    )]
    HandedTooMuch {
        /// What one call may hand over, in bytes.
        limit: usize,
    },
    /// The guest returned manifests of more JSON values than the host parses for one call.
    #[error(
        "returned manifests of {values} JSON values or more, over the {limit} the host parses for one call"
    )]
    TooManyValues {
        /// How many values its manifests hold, at most.
        values: usize,
        /// The cap.
        limit: usize,
    },
    /// The guest returned more manifests than one render may.
    #[error("returned {count} manifests, over the cap of {limit}")]
    TooManyManifests {
        /// How many it returned.
        count: usize,
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
    /// `status` returned something unusable.
    #[error("returned a status the host cannot use: {0}")]
    BadStatus(String),
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
            Self::Busy(_) => "PluginBusy",
            Self::OverBudget { .. } => "RenderBudgetExceeded",
            Self::Panic(_) | Self::Trap(_) => "PluginTrapped",
            Self::Render { .. } => "InvalidSpec",
            Self::ErrorTooLarge { .. }
            | Self::OutputTooLarge { .. }
            | Self::HandedTooMuch { .. }
            | Self::TooManyValues { .. }
            | Self::TooManyManifests { .. }
            | Self::BadManifest { .. }
            | Self::BadDescription(_)
            | Self::BadStatus(_) => "PluginMisbehaved",
            Self::Guard(_) => "ChildRefused",
        }
    }

    /// Whether the same call may succeed if retried, with nothing changed: the failure was not
    /// the guest's doing. The pool being full says nothing about the plugin; a deadline may be
    /// missed because the host's CPUs were busy elsewhere. Everything else follows from the
    /// plugin and the resource alone (plugins are pure, and every call gets a fresh instance), so
    /// it happens again until one of them changes.
    pub fn transient(&self) -> bool {
        match self {
            Self::Busy(_) | Self::Deadline(_) => true,
            Self::Memory { .. }
            | Self::OverBudget { .. }
            | Self::Panic(_)
            | Self::Trap(_)
            | Self::Render { .. }
            | Self::ErrorTooLarge { .. }
            | Self::OutputTooLarge { .. }
            | Self::HandedTooMuch { .. }
            | Self::TooManyValues { .. }
            | Self::TooManyManifests { .. }
            | Self::BadManifest { .. }
            | Self::BadDescription(_)
            | Self::BadStatus(_)
            | Self::Guard(_) => false,
        }
    }
}

/// `bytes` in MiB, as `--render-memory` and the chart write them (`64Mi`), or in bytes when
/// not a whole number of MiB.
pub(crate) fn mib(bytes: u64) -> String {
    if bytes.is_multiple_of(1 << 20) {
        format!("{}Mi", bytes >> 20)
    } else {
        format!("{bytes} bytes")
    }
}

/// `text` cut to its first `max` bytes (at a character boundary) and a note saying how much was
/// left out, so that a guest cannot put megabytes into a status condition or a log line.
pub(crate) fn bounded(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let total = text.len();
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push_str(&format!("… ({} more bytes)", total - end));
    text
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
    /// `--render-memory` leaves no room for even one plugin call.
    #[error(
        "--render-memory {} is less than one plugin call may need, {} (--plugin-memory and {} times --plugin-output); raise it, or lower those",
        mib(*budget), mib(*needs), crate::plugin::OUTPUT_COPIES
    )]
    RenderMemoryTooSmall {
        /// `--render-memory`.
        budget: u64,
        /// What one call may need.
        needs: u64,
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
    /// A document of an input file is not a resource.
    #[error("{place}: {reason}")]
    Example {
        /// `FILE: document N`.
        place: String,
        /// Which field is wrong, and how.
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
    /// A plugin could not be pushed to or pulled from its registry.
    #[error(transparent)]
    Oci(#[from] crate::oci::Error),
}

/// The host's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    fn every_plugin_error() -> Vec<(PluginError, &'static str, bool)> {
        let s = || "x".to_owned();
        vec![
            (
                PluginError::Deadline(Duration::from_secs(1)),
                "PluginTimeout",
                true,
            ),
            (PluginError::Busy(s()), "PluginBusy", true),
            (
                PluginError::Memory { limit: 1, tried: 2 },
                "PluginMemoryExceeded",
                false,
            ),
            (
                PluginError::OverBudget {
                    needs: 80 << 20,
                    budget: 64 << 20,
                },
                "RenderBudgetExceeded",
                false,
            ),
            (PluginError::Panic(s()), "PluginTrapped", false),
            (PluginError::Trap(s()), "PluginTrapped", false),
            (
                PluginError::Render {
                    field: s(),
                    message: s(),
                },
                "InvalidSpec",
                false,
            ),
            (
                PluginError::ErrorTooLarge { bytes: 2, limit: 1 },
                "PluginMisbehaved",
                false,
            ),
            (
                PluginError::OutputTooLarge { bytes: 2, limit: 1 },
                "PluginMisbehaved",
                false,
            ),
            (
                PluginError::TooManyValues {
                    values: 2,
                    limit: 1,
                },
                "PluginMisbehaved",
                false,
            ),
            (
                PluginError::TooManyManifests { count: 2, limit: 1 },
                "PluginMisbehaved",
                false,
            ),
            (
                PluginError::BadManifest {
                    index: 0,
                    reason: s(),
                },
                "PluginMisbehaved",
                false,
            ),
            (PluginError::BadDescription(s()), "PluginMisbehaved", false),
            (PluginError::BadStatus(s()), "PluginMisbehaved", false),
            (PluginError::Guard(s()), "ChildRefused", false),
        ]
    }

    #[test]
    fn each_plugin_error_keeps_its_reason() {
        for (error, reason, _) in every_plugin_error() {
            assert_eq!(error.reason(), reason, "{error:?}");
        }
    }

    #[test]
    fn only_a_full_pool_and_a_missed_deadline_are_transient() {
        for (error, _, transient) in every_plugin_error() {
            assert_eq!(error.transient(), transient, "{error:?}");
        }
    }

    #[test]
    fn a_short_text_is_kept_whole() {
        assert_eq!(bounded("short".to_owned(), 5), "short");
        assert_eq!(bounded(String::new(), 0), "");
    }

    #[test]
    fn a_long_text_is_cut_at_a_character_boundary_with_a_note() {
        assert_eq!(bounded("abcdef".to_owned(), 4), "abcd… (2 more bytes)");
        // `é` is two bytes: a cut through it keeps the whole characters before it.
        assert_eq!(bounded("aéb".to_owned(), 2), "a… (3 more bytes)");
        let cut = bounded("x".repeat(1 << 20), MAX_ERROR_MESSAGE);
        assert!(cut.starts_with(&"x".repeat(MAX_ERROR_MESSAGE)));
        assert!(cut.ends_with(&format!("… ({} more bytes)", (1 << 20) - MAX_ERROR_MESSAGE)));
        assert!(cut.len() < MAX_ERROR_MESSAGE + 32);
    }
}
