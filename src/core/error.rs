//! Errors of the core's operations, each with a stable `code()` that the JS wrapper mirrors.

use core::fmt;

use crate::protocol::RejectCode;

/// Why a command was refused locally, or failed after it was sent.
// (Variants in the order that made the bundle smallest: docs/performance.md.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CommandError {
    /// No capability token for this action (not yet granted, or expired).
    NoCapability,
    /// A host action, and this session is not the host.
    NotHost,
    /// The server is unreachable or the view is resyncing: nobody's view is authoritative now.
    NotAuthoritative,
    /// This session is the host but its local lease deadline has passed (or is unknown).
    LeaseExpired,
    /// The epoch moved before the command could take effect; it is never retried.
    StaleEpoch,
    /// The idempotency key was used before for a different request.
    IdempotencyConflict,
    /// The action is in neither list of the room's action table.
    UnknownAction,
    /// Too many commands are already queued or in flight.
    QueueFull,
    /// No result after every retry.
    Timeout,
    /// The connection dropped before a host command's result arrived, and it could not be resent
    /// safely (the epoch or the authority changed). The room's events tell whether it took effect.
    Interrupted,
    /// The view was closed (`leave`).
    Closed,
    /// The server refused it for another reason.
    Rejected(RejectCode),
}

impl CommandError {
    pub fn code(&self) -> &'static str {
        match self {
            CommandError::NotHost => "NotHost",
            CommandError::NotAuthoritative => "NotAuthoritative",
            CommandError::LeaseExpired => "LeaseExpired",
            CommandError::NoCapability => "NoCapability",
            CommandError::StaleEpoch => "StaleEpoch",
            CommandError::IdempotencyConflict => "IdempotencyConflict",
            CommandError::UnknownAction => "UnknownAction",
            CommandError::QueueFull => "QueueFull",
            CommandError::Timeout => "Timeout",
            CommandError::Interrupted => "Interrupted",
            CommandError::Closed => "Closed",
            CommandError::Rejected(_) => "Rejected",
        }
    }

    /// Maps a server rejection to the error the app sees.
    pub fn from_reject(code: RejectCode) -> Self {
        match code {
            RejectCode::StaleEpoch => CommandError::StaleEpoch,
            RejectCode::NotHost => CommandError::NotHost,
            RejectCode::LeaseExpired => CommandError::LeaseExpired,
            RejectCode::BadCapability => CommandError::NoCapability,
            RejectCode::IdempotencyConflict => CommandError::IdempotencyConflict,
            other => CommandError::Rejected(other),
        }
    }
}

impl fmt::Display for CommandError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CommandError::NotHost => "this session is not the host",
            CommandError::NotAuthoritative => {
                "the server is unreachable or resyncing; no view is authoritative"
            }
            CommandError::LeaseExpired => "the host lease has expired locally",
            CommandError::NoCapability => "no capability token for this action",
            CommandError::StaleEpoch => "the host epoch changed; the command was not applied",
            CommandError::IdempotencyConflict => {
                "the idempotency key was already used for a different request"
            }
            CommandError::UnknownAction => "the action is not in the room's action table",
            CommandError::QueueFull => "too many commands queued or in flight",
            CommandError::Timeout => "no result from the server after every retry",
            CommandError::Interrupted => {
                "the result was lost (a drop or a new epoch); see the room's events"
            }
            CommandError::Closed => "the room was left",
            CommandError::Rejected(code) => code.as_str(),
        })
    }
}

impl core::error::Error for CommandError {}
