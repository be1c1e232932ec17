//! Encoding and decoding of frames, with explicit limits.
//!
//! Every decoder here returns a typed [`DecodeError`] on bad input and never panics. Error
//! messages are fixed strings: a decoder's error never echoes the input, so a token inside a
//! malformed frame cannot leak into a log line through an error message.

use crate::prelude::*;
use core::fmt;

use super::ids::MAX_TOKEN_LEN;
use super::json::{self, line_column, FromJson, Json, Reader, SyntaxError, ToJson};
use super::messages::{
    Assignment, ClientMsg, Gap, Item, Member, ServerMsg, Snapshot, PROTOCOL_VERSION,
};
use super::wire;

/// Largest client → server frame, in bytes.
pub const MAX_CLIENT_FRAME: usize = 64 * 1024;
/// Largest command payload or signalling body a client sends, in bytes of JSON text: the frame
/// less room for the rest of it (ids, the action, the epoch and a capability token of
/// `MAX_TOKEN_LEN`), so that a payload within it always makes a frame the server accepts.
pub const MAX_CLIENT_PAYLOAD: usize = MAX_CLIENT_FRAME - MAX_TOKEN_LEN - 1024;
/// Deepest nesting of a command's payload, which a server accepts (it refuses a deeper one
/// `bad_request`): the server's frames wrap a payload up to four levels deeper (an inbox entry),
/// and every frame must stay within the JSON reader's `MAX_DEPTH` (128).
pub const MAX_PAYLOAD_DEPTH: usize = 64;
/// Largest server → client frame, in bytes (a welcome of a full room with its replay).
pub const MAX_SERVER_FRAME: usize = 4 * 1024 * 1024;
/// Most members in one room (and so in one snapshot): few enough that a welcome of a full room
/// of the longest ids and names, with its replay, fits in `MAX_SERVER_FRAME` (the server's test
/// `a_full_welcome_fits_in_a_frame`).
pub const MAX_MEMBERS: usize = 4_096;
/// Most items replayed in one welcome; the server announces older ones as a discontinuity.
pub const MAX_REPLAY: usize = 4_096;
/// Most actions in an action table or a capability.
pub const MAX_ACTIONS: usize = 256;
/// Longest display name, in bytes.
pub const MAX_NAME_LEN: usize = 64;
/// Longest a server leaves a live connection without a frame: after this long with nothing
/// sent, it sends a `heartbeat`. A client that hears nothing for longer (and a margin) presumes
/// the connection dead, as a half-open TCP connection (a peer gone without a FIN, a NAT entry
/// expired) may never report a close.
pub const HEARTBEAT_MS: u64 = 15_000;

/// How long the server keeps a command's idempotency record (at least 24 h, as the design
/// requires): a command sent again with its key within this is answered its first outcome, never
/// applied twice.
pub const IDEMPOTENCY_RETENTION_MS: u64 = 48 * 3600 * 1000;

/// How long after a command was made the SDK may send it again with the same key: an hour
/// short of [`IDEMPOTENCY_RETENTION_MS`]. Past it the server's record may be gone (a laptop that
/// slept for days with an unanswered vote), and a command already sent fails `Interrupted`.
pub const RESEND_WINDOW_MS: u64 = IDEMPOTENCY_RETENTION_MS - 3600 * 1000;
/// Longest error message in an error frame, in bytes.
pub const MAX_MESSAGE_LEN: usize = 256;
/// Longest base64url signature (an Ed25519 signature is 86 characters).
pub const MAX_SIG_LEN: usize = 128;

/// Why a frame was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    /// Larger than the limit for its direction.
    TooLarge { len: usize, max: usize },
    /// Not JSON, or JSON of the wrong shape. `line`/`column` locate the problem.
    Malformed { line: usize, column: usize },
    /// No `v` field.
    MissingVersion,
    /// A major version this SDK does not speak.
    UnsupportedVersion(u64),
    /// A `t` this SDK does not know (a newer server's message; safe to ignore).
    UnknownType,
    /// Well-formed, but breaks a protocol limit or rule.
    Invalid(&'static str),
}

impl DecodeError {
    /// A stable code for logs, metrics and the JS error class.
    pub fn code(&self) -> &'static str {
        match self {
            DecodeError::TooLarge { .. } => "frame_too_large",
            DecodeError::Malformed { .. } => "malformed_frame",
            DecodeError::MissingVersion => "missing_version",
            DecodeError::UnsupportedVersion(_) => "unsupported_version",
            DecodeError::UnknownType => "unknown_message_type",
            DecodeError::Invalid(_) => "invalid_frame",
        }
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::TooLarge { len, max } => {
                write!(f, "frame of {len} bytes is larger than the limit of {max}")
            }
            DecodeError::Malformed { line, column } => {
                write!(f, "malformed frame at line {line}, column {column}")
            }
            DecodeError::MissingVersion => f.write_str("frame has no protocol version"),
            DecodeError::UnsupportedVersion(v) => {
                write!(
                    f,
                    "protocol version {v} is not supported (this SDK speaks {PROTOCOL_VERSION})"
                )
            }
            DecodeError::UnknownType => f.write_str("unknown message type"),
            DecodeError::Invalid(why) => write!(f, "invalid frame: {why}"),
        }
    }
}

impl core::error::Error for DecodeError {}

fn malformed(text: &str, e: SyntaxError) -> DecodeError {
    let (line, column) = line_column(text, e.0);
    DecodeError::Malformed { line, column }
}

fn too_large(text: &str, max: usize) -> Result<(), DecodeError> {
    if text.len() > max {
        return Err(DecodeError::TooLarge {
            len: text.len(),
            max,
        });
    }
    Ok(())
}

/// Checks the size, then reads `v` and `t` in a first pass, so that an unknown major version is
/// reported as such rather than as whatever shape error its new fields would cause, then has
/// `read` decode the frame of type `t` (`Ok(None)`: not a type of this direction).
fn decode_frame<T>(
    text: &str,
    max: usize,
    read: impl FnOnce(&mut Reader<'_>, &str) -> Result<Option<T>, SyntaxError>,
) -> Result<T, DecodeError> {
    too_large(text, max)?;
    let mut r = Reader::new(text);
    let (v, t) = wire::frame_head(&mut r).map_err(|e| malformed(text, e))?;
    match v {
        None => return Err(DecodeError::MissingVersion),
        Some(v) if v != u64::from(PROTOCOL_VERSION) => {
            return Err(DecodeError::UnsupportedVersion(v))
        }
        Some(_) => {}
    }
    let t = t.ok_or(DecodeError::UnknownType)?;
    let msg = read(&mut r, &t)
        .map_err(|e| malformed(text, e))?
        .ok_or(DecodeError::UnknownType)?;
    r.end().map_err(|e| malformed(text, e))?;
    Ok(msg)
}

/// Decodes one server → client text frame.
pub fn decode_server(text: &str) -> Result<ServerMsg, DecodeError> {
    let msg = decode_frame(text, MAX_SERVER_FRAME, wire::server_msg)?;
    validate_server(&msg)?;
    Ok(msg)
}

/// Decodes one client → server text frame.
pub fn decode_client(text: &str) -> Result<ClientMsg, DecodeError> {
    let msg = decode_frame(text, MAX_CLIENT_FRAME, wire::client_msg)?;
    validate_client(&msg)?;
    Ok(msg)
}

/// Decodes an HTTP body or a stored value of type `T` (snapshot, command request, inbox page,
/// key set, outcome, item, an app's JSON payload).
pub fn decode_body<T: FromJson>(text: &str, max: usize) -> Result<T, DecodeError> {
    too_large(text, max)?;
    json::from_str(text).map_err(|e| malformed(text, e))
}

/// A command payload or signalling body as a client sends it: JSON text within
/// [`MAX_CLIENT_PAYLOAD`] bytes and [`MAX_PAYLOAD_DEPTH`] levels of nesting, which the server
/// accepts. A deeper one would make a frame too deep to read, which closes the connection.
pub fn decode_payload(text: &str) -> Result<Json, DecodeError> {
    too_large(text, MAX_CLIENT_PAYLOAD)?;
    json::from_str_within(text, MAX_PAYLOAD_DEPTH as u32).map_err(|e| malformed(text, e))
}

/// Encodes an HTTP body or a value to store.
pub fn encode_body<T: ToJson + ?Sized>(value: &T) -> String {
    json::to_string(value)
}

/// Encodes a server → client frame.
pub fn encode_server(msg: &ServerMsg) -> String {
    json::to_string(msg)
}

/// Encodes a client → server frame.
pub fn encode_client(msg: &ClientMsg) -> String {
    json::to_string(msg)
}

fn check(ok: bool, why: &'static str) -> Result<(), DecodeError> {
    if ok {
        Ok(())
    } else {
        Err(DecodeError::Invalid(why))
    }
}

/// Checks the rules an assignment must obey beyond its shape.
pub fn validate_assignment(a: &Assignment) -> Result<(), DecodeError> {
    check(
        a.host.is_some() == a.session.is_some(),
        "an assignment has a host and a session, or neither",
    )
}

fn validate_sig(sig: &Option<String>) -> Result<(), DecodeError> {
    check(
        sig.as_ref().is_none_or(|s| s.len() <= MAX_SIG_LEN),
        "signature too long",
    )
}

fn validate_member(m: &Member) -> Result<(), DecodeError> {
    check(m.name.len() <= MAX_NAME_LEN, "display name too long")
}

fn validate_item(item: &Item) -> Result<(), DecodeError> {
    match item {
        Item::Assignment(a) => {
            validate_assignment(&a.assignment)?;
            validate_sig(&a.sig)
        }
        Item::Event(_) => Ok(()),
    }
}

/// Checks a snapshot's counts and its assignment.
pub fn validate_snapshot(s: &Snapshot) -> Result<(), DecodeError> {
    check(s.members.len() <= MAX_MEMBERS, "too many members")?;
    check(
        s.actions.host.len() + s.actions.participant.len() <= MAX_ACTIONS,
        "too many actions",
    )?;
    check(
        s.current.assignment.room == s.room,
        "snapshot assignment is for another room",
    )?;
    validate_assignment(&s.current.assignment)?;
    validate_sig(&s.current.sig)?;
    s.members.iter().try_for_each(validate_member)
}

fn validate_server(msg: &ServerMsg) -> Result<(), DecodeError> {
    match msg {
        ServerMsg::Welcome {
            snapshot,
            missed,
            discontinuity,
            ..
        } => {
            validate_snapshot(snapshot)?;
            discontinuity.iter().try_for_each(validate_gap)?;
            // Replayed items are the snapshot's past: one after it would be held outside the
            // view's buffer bound.
            check(
                missed.len() <= MAX_REPLAY && missed.iter().all(|i| i.seq() <= snapshot.seq),
                "replay out of bounds",
            )?;
            missed.iter().try_for_each(validate_item)
        }
        // A rejection's assignment is adopted, and relayed to peers, like any other.
        ServerMsg::Assignment(a)
        | ServerMsg::CommandResult {
            outcome:
                super::messages::Outcome::Rejected {
                    current: Some(a), ..
                },
            ..
        } => {
            validate_assignment(&a.assignment)?;
            validate_sig(&a.sig)
        }
        ServerMsg::Capability { token, actions, .. } => {
            check(token.expose().len() <= MAX_TOKEN_LEN, "token too long")?;
            check(actions.len() <= MAX_ACTIONS, "too many actions")
        }
        ServerMsg::Presence { member, .. } => validate_member(member),
        ServerMsg::PresenceBatch { joined, left } => {
            check(joined.len() + left.len() <= MAX_MEMBERS, "too many members")?;
            joined.iter().chain(left).try_for_each(validate_member)
        }
        ServerMsg::Discontinuity(g) => validate_gap(g),
        ServerMsg::Error { message, .. } => {
            check(message.len() <= MAX_MESSAGE_LEN, "error message too long")
        }
        _ => Ok(()),
    }
}

fn validate_gap(g: &Gap) -> Result<(), DecodeError> {
    check(g.from <= g.to, "discontinuity range is reversed")
}

fn validate_client(msg: &ClientMsg) -> Result<(), DecodeError> {
    match msg {
        ClientMsg::Hello { token, .. }
        | ClientMsg::Command {
            capability: token, ..
        } => check(token.expose().len() <= MAX_TOKEN_LEN, "token too long"),
        _ => Ok(()),
    }
}

/// The exact bytes the server signs for an assignment (Ed25519, no pre-hash).
///
/// UTF-8 text, fields separated by `\n` (identifiers cannot contain a newline), absent host and
/// session as empty strings:
///
/// ```text
/// hostlease/v1/assignment\n{room}\n{host}\n{session}\n{epoch}\n{seq}\n{lease_ms}\n{reason}\n{issued_at}
/// ```
pub fn signing_bytes(a: &Assignment) -> Vec<u8> {
    let mut out = String::from("hostlease/v1/assignment");
    for field in [
        a.room.as_str(),
        a.host.as_ref().map_or("", |h| h.as_str()),
        a.session.as_ref().map_or("", |s| s.as_str()),
    ] {
        out.push('\n');
        out.push_str(field);
    }
    for n in [a.epoch.0, a.seq.0, a.lease_ms] {
        out.push('\n');
        json::push_u64(&mut out, n);
    }
    out.push('\n');
    out.push_str(a.reason.as_str());
    out.push('\n');
    json::push_u64(&mut out, a.issued_at.0);
    out.into_bytes()
}
