//! What went wrong inside a plugin call: reported on the resource being rendered, never a stop
//! of the host.

use std::time::Duration;

use crate::units::mib;

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
        limit: usize,
        /// The total size it asked for.
        tried: usize,
    },
    /// The call needs more of the memory budget of calls in flight than the whole budget
    /// (`--render-memory`), so it never runs.
    #[error(
        "was not called: one call of it may need {} (its memory cap and {} times its output cap), more than all plugin calls in flight may have together, {} (--render-memory)",
        mib(*needs), super::OUTPUT_COPIES, mib(*budget)
    )]
    OverBudget {
        /// What one call may need.
        needs: u64,
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
    /// The guest refused the resource. Both strings are cut to
    /// [`crate::error::MAX_ERROR_FIELD`] and [`crate::error::MAX_ERROR_MESSAGE`] bytes.
    #[error("{}", if field.is_empty() { message.clone() } else { format!("{field}: {message}") })]
    Render {
        /// The field to blame.
        field: String,
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
    OutputTooLarge { bytes: usize, limit: usize },
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
        limit: usize,
    },
    /// The guest returned more manifests than one render may.
    #[error("returned {count} manifests, over the cap of {limit}")]
    TooManyManifests {
        /// How many it returned.
        count: usize,
        limit: usize,
    },
    /// A returned manifest is not a JSON object.
    #[error("returned manifest {index} that is not valid: {reason}")]
    BadManifest { index: usize, reason: String },
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
}
