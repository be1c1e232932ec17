//! Identifier and counter newtypes shared by the SDK and the server.
//!
//! Identifiers are validated when they are decoded (bounded length, a conservative alphabet), so
//! nothing downstream has to wonder whether a room name can contain a newline or be a megabyte.

use crate::prelude::*;
use core::fmt;

/// The longest identifier accepted on the wire, in bytes.
pub const MAX_ID_LEN: usize = 128;

/// Why an identifier was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum IdError {
    Empty,
    TooLong,
    BadCharacter,
    /// `.` or `..`: a URL path segment that names no room (a browser's URL parser removes it).
    Dots,
}

impl IdError {
    pub fn code(&self) -> &'static str {
        match self {
            IdError::Empty => "id_empty",
            IdError::TooLong => "id_too_long",
            IdError::BadCharacter => "id_bad_character",
            IdError::Dots => "id_dots",
        }
    }
}

impl fmt::Display for IdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IdError::Empty => "identifier is empty",
            IdError::TooLong => "identifier is longer than 128 bytes",
            IdError::BadCharacter => "identifier may contain only A-Z a-z 0-9 and - _ . : @",
            IdError::Dots => "identifier may not be . or ..",
        })
    }
}

impl core::error::Error for IdError {}

fn validate_id(s: &str) -> Result<(), IdError> {
    if s.is_empty() {
        return Err(IdError::Empty);
    }
    if s.len() > MAX_ID_LEN {
        return Err(IdError::TooLong);
    }
    if !s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':' | b'@'))
    {
        return Err(IdError::BadCharacter);
    }
    if s.len() < 3 && s.bytes().all(|b| b == b'.') {
        return Err(IdError::Dots);
    }
    Ok(())
}

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        #[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
        #[cfg_attr(feature = "serde", serde(try_from = "String", into = "String"))]
        pub struct $name(String);

        impl $name {
            /// Validates and wraps an identifier.
            pub fn new(s: impl Into<String>) -> Result<Self, IdError> {
                let s = s.into();
                validate_id(&s)?;
                Ok(Self(s))
            }
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(s: String) -> Result<Self, IdError> {
                Self::new(s)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:?})", stringify!($name), self.0)
            }
        }
    };
}

string_id!(
    /// A room: the unit that has exactly one host.
    RoomId
);
string_id!(
    /// A participant, as named by the app backend in the join token.
    ParticipantId
);
string_id!(
    /// One connection of a participant. The host lease is bound to a session, so two tabs of the
    /// same participant cannot both hold it.
    SessionId
);
string_id!(
    /// The id of a server signing key (`kid`), for rotation.
    KeyId
);
string_id!(
    /// The name of a room action (`poll.open`, `vote`, `host.resign`, ...). The server keeps the
    /// table of which actions are host-only; the server stays app-agnostic otherwise.
    Action
);
string_id!(
    /// An idempotency key, scoped by the server to `(room, participant)`.
    IdempotencyKey
);

macro_rules! counter {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        #[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
        #[cfg_attr(feature = "serde", serde(transparent))]
        pub struct $name(pub u64);

        impl $name {
            pub const ZERO: Self = Self(0);
            /// The next value, saturating (a u64 counter never wraps in practice).
            pub fn next(self) -> Self {
                Self(self.0.saturating_add(1))
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }
    };
}

counter!(
    /// The generation of a room's host decision. Moves on every new grant, never decreases.
    Epoch
);
counter!(
    /// The room's single order for assignments and room events.
    Seq
);

/// A wall-clock time on the server, in milliseconds since the Unix epoch.
///
/// Deliberately a different type from the SDK's monotonic `core::Instant`: a server timestamp
/// says when something happened on the server and must never be compared with local time.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(transparent))]
pub struct ServerTime(pub u64);

impl fmt::Debug for ServerTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ServerTime({}ms)", self.0)
    }
}

/// An opaque bearer credential (join token or capability token).
///
/// The SDK never looks inside. `Debug` and `Display` never show the value, so a token cannot end
/// up in a log line or an error message by accident.
#[derive(Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(transparent))]
pub struct Token(String);

/// The longest token accepted on the wire, in bytes.
pub const MAX_TOKEN_LEN: usize = 4096;

impl Token {
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }
    /// The raw value, for putting on the wire only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}
