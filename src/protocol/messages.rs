//! Every message of wire protocol version 1.
//!
//! Frames are JSON objects `{"v": 1, "t": "<type>", ...fields}`. Unknown fields are ignored, so a
//! newer server can add fields without breaking older SDKs; an unknown major version is refused
//! (see [`super::codec`]). How each type is written and read is in `super::wire` (one place, by
//! hand, for both directions and both ends).

use super::json::Json;
use crate::prelude::*;

use super::ids::{
    Action, Epoch, IdempotencyKey, KeyId, ParticipantId, RoomId, Seq, ServerTime, SessionId, Token,
};

/// The major protocol version this crate speaks.
pub const PROTOCOL_VERSION: u32 = 1;

/// Why an assignment was made. Unknown reasons from a newer server decode as `Unknown`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// First host of a room, or a host chosen because the room had none.
    Elected,
    /// The previous host's lease expired without renewal (also a re-grant to the same participant).
    LeaseLapsed,
    /// The previous host left explicitly (leave message or a clean close it initiated).
    Left,
    /// The previous host resigned (`host.resign`).
    Resigned,
    /// The previous host handed the role over (`host.transfer`).
    Transferred,
    /// The app backend reassigned the host through the admin API.
    Admin,
    /// The previous host was kicked through the admin API.
    Kicked,
    /// The room was closed; the assignment is hostless.
    Closed,
    /// A name this SDK does not know.
    Unknown,
}

impl Reason {
    /// The wire name.
    pub fn as_str(&self) -> &'static str {
        match self {
            Reason::Elected => "elected",
            Reason::LeaseLapsed => "lease_lapsed",
            Reason::Left => "left",
            Reason::Resigned => "resigned",
            Reason::Transferred => "transferred",
            Reason::Admin => "admin",
            Reason::Kicked => "kicked",
            Reason::Closed => "closed",
            Reason::Unknown => "unknown",
        }
    }
}

/// The authoritative record of who hosts a room, committed by the server with a compare-and-swap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    pub room: RoomId,
    /// `None`: the room is hostless (nobody eligible is connected).
    pub host: Option<ParticipantId>,
    /// The host's connection; the lease is bound to it. `None` exactly when `host` is `None`.
    pub session: Option<SessionId>,
    pub epoch: Epoch,
    pub seq: Seq,
    /// The lease TTL of this grant.
    pub lease_ms: u64,
    pub reason: Reason,
    pub issued_at: ServerTime,
}

impl Assignment {
    /// Whether this assignment names `participant` on `session` as host.
    pub fn names(&self, participant: &ParticipantId, session: &SessionId) -> bool {
        self.host.as_ref() == Some(participant) && self.session.as_ref() == Some(session)
    }

    /// Same holder (host and session) as `other`.
    pub fn same_holder(&self, other: &Assignment) -> bool {
        self.host == other.host && self.session == other.session
    }
}

/// An assignment with the server's Ed25519 signature, so that peers can relay it to each other
/// over WebRTC and each can verify it against the server's published key.
///
/// The signed bytes are [`super::codec::signing_bytes`] of `assignment`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedAssignment {
    pub assignment: Assignment,
    /// Key id of the signing key; `None` only from a server that does not sign (may be absent).
    pub kid: Option<KeyId>,
    /// base64url (no padding) Ed25519 signature (may be absent).
    pub sig: Option<String>,
}

impl From<Assignment> for SignedAssignment {
    fn from(assignment: Assignment) -> Self {
        Self {
            assignment,
            kid: None,
            sig: None,
        }
    }
}

/// One connection in a room. Membership is soft state rebuilt from live connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub id: ParticipantId,
    pub session: SessionId,
    /// Display name from the join token (at most [`super::codec::MAX_NAME_LEN`] bytes).
    pub name: String,
    /// Server-assigned join order; the first key of the election order.
    pub join_seq: u64,
    /// Whether the join token allows this participant to host.
    pub may_host: bool,
}

impl Member {
    /// `name` cut to the longest prefix of at most [`super::codec::MAX_NAME_LEN`] bytes that
    /// ends on a character boundary: what a member's display name may be (a cut by characters
    /// could exceed the limit in bytes, and every frame naming the member would then be refused).
    pub fn clamp_name(name: &str) -> &str {
        clamp_bytes(name, super::codec::MAX_NAME_LEN)
    }
}

/// `text` cut to its longest prefix of at most `max` bytes that ends on a character boundary
/// (a limit the decoder checks in bytes).
pub fn clamp_bytes(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Which actions the server treats as host-only and which as participant actions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ActionTable {
    pub host: Vec<Action>,
    pub participant: Vec<Action>,
}

impl ActionTable {
    pub fn kind(&self, action: &Action) -> Option<ActionKind> {
        if self.host.contains(action) {
            Some(ActionKind::Host)
        } else if self.participant.contains(action) {
            Some(ActionKind::Participant)
        } else {
            None
        }
    }
}

/// Host-only or participant action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ActionKind {
    Host,
    Participant,
}

impl ActionKind {
    /// The wire name.
    pub fn as_str(&self) -> &'static str {
        match self {
            ActionKind::Host => "host",
            ActionKind::Participant => "participant",
        }
    }
}

/// The built-in host actions every server knows: they route a host change through the server.
pub const ACTION_RESIGN: &str = "host.resign";
pub const ACTION_TRANSFER: &str = "host.transfer";

/// The authoritative state of a room at one point of its `seq`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub room: RoomId,
    /// The current assignment (the newest committed).
    pub current: SignedAssignment,
    /// Connected members in election order.
    pub members: Vec<Member>,
    /// The `seq` this snapshot reflects: every item with `seq <= this` is included in it.
    pub seq: Seq,
    /// For the host's own session only: the lease time left when the snapshot was taken.
    pub lease_remaining_ms: Option<u64>,
    pub server_time: ServerTime,
    pub actions: ActionTable,
}

/// A durable room event: an accepted command.
#[derive(Debug, Clone, PartialEq)]
pub struct RoomEvent {
    pub seq: Seq,
    /// The epoch in force when the command was accepted.
    pub epoch: Epoch,
    pub actor: ParticipantId,
    pub action: Action,
    pub payload: Json,
    pub at: ServerTime,
}

/// One entry of the room's single ordered stream.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    Assignment(SignedAssignment),
    Event(RoomEvent),
}

impl Item {
    pub fn seq(&self) -> Seq {
        match self {
            Item::Assignment(a) => a.assignment.seq,
            Item::Event(e) => e.seq,
        }
    }
}

/// A run of `seq` values the server no longer holds: `from..=to` will never be delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gap {
    pub from: Seq,
    pub to: Seq,
}

/// Host or participant capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Role {
    Host,
    Participant,
}

impl Role {
    /// The wire name.
    pub fn as_str(&self) -> &'static str {
        match self {
            Role::Host => "host",
            Role::Participant => "participant",
        }
    }
}

/// Stable codes of a refused command. Unknown codes from a newer server decode as `Unknown`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RejectCode {
    /// The command's epoch (or its token's) is not the room's current epoch.
    StaleEpoch,
    /// The sender is not the current host (or not on the host's session).
    NotHost,
    /// The host's lease had expired on the store's clock.
    LeaseExpired,
    /// Token missing, malformed, expired, signed by an unknown key, or for another room/subject.
    BadCapability,
    /// The token does not grant this action, or the action is unknown to the server.
    ActionNotGranted,
    /// The idempotency key was used before for a different request.
    IdempotencyConflict,
    /// Too many requests; retry after `retry_after_ms`.
    RateLimited,
    /// The payload or request is malformed.
    BadRequest,
    /// The server could not decide now (storage busy); retry after `retry_after_ms`.
    Unavailable,
    /// A name this SDK does not know.
    Unknown,
}

impl RejectCode {
    pub fn as_str(&self) -> &'static str {
        match self {
            RejectCode::StaleEpoch => "stale_epoch",
            RejectCode::NotHost => "not_host",
            RejectCode::LeaseExpired => "lease_expired",
            RejectCode::BadCapability => "bad_capability",
            RejectCode::ActionNotGranted => "action_not_granted",
            RejectCode::IdempotencyConflict => "idempotency_conflict",
            RejectCode::RateLimited => "rate_limited",
            RejectCode::BadRequest => "bad_request",
            RejectCode::Unavailable => "unavailable",
            RejectCode::Unknown => "unknown",
        }
    }

    /// Whether the same request may succeed later without change.
    pub fn is_retryable(&self) -> bool {
        matches!(self, RejectCode::RateLimited | RejectCode::Unavailable)
    }
}

/// The result of a command, over the socket or as the HTTP response body.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The command took effect as the room event with this `seq`.
    Accepted { seq: Seq },
    /// No state changed.
    Rejected {
        code: RejectCode,
        /// The room's current assignment, so the sender can correct its view (may be absent).
        current: Option<SignedAssignment>,
        /// (may be absent)
        retry_after_ms: Option<u64>,
    },
}

/// Codes of a protocol-level error frame (usually followed by a close).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    BadFrame,
    FrameTooLarge,
    UnsupportedVersion,
    RateLimited,
    /// The join token was refused (expired, forged, wrong room).
    Unauthorized,
    RoomFull,
    TooManyRooms,
    TooManyConnections,
    /// The first frame was not a hello, or a hello came twice.
    UnexpectedMessage,
    RoomClosed,
    Kicked,
    Internal,
    /// A name this SDK does not know.
    Unknown,
}

impl ErrorCode {
    pub fn as_str(&self) -> &'static str {
        match self {
            ErrorCode::BadFrame => "bad_frame",
            ErrorCode::FrameTooLarge => "frame_too_large",
            ErrorCode::UnsupportedVersion => "unsupported_version",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::RoomFull => "room_full",
            ErrorCode::TooManyRooms => "too_many_rooms",
            ErrorCode::TooManyConnections => "too_many_connections",
            ErrorCode::UnexpectedMessage => "unexpected_message",
            ErrorCode::RoomClosed => "room_closed",
            ErrorCode::Kicked => "kicked",
            ErrorCode::Internal => "internal",
            ErrorCode::Unknown => "unknown",
        }
    }
}

/// Server → client frames. Decoded only by [`super::codec::decode_server`] (fields read in
/// `super::de`, which says which fields may be absent).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ServerMsg {
    /// The answer to `hello` or `resume`: the authoritative snapshot at the subscription point,
    /// so nothing falls between snapshot and stream.
    Welcome {
        you: ParticipantId,
        session: SessionId,
        snapshot: Snapshot,
        /// Items after the resume cursor up to `snapshot.seq`, in order (absent: none).
        missed: Vec<Item>,
        /// Items after the cursor that the server no longer holds.
        discontinuity: Option<Gap>,
    },
    /// A new assignment on the room stream.
    Assignment(SignedAssignment),
    /// A room event on the room stream.
    Event(RoomEvent),
    /// Liveness probe of the host's connection; echo the nonce at once.
    LeaseProbe { nonce: u64, epoch: Epoch },
    /// The lease was renewed after the echo of `nonce`; `remaining_ms` is counted from when the
    /// server sent this frame.
    LeaseConfirm {
        nonce: u64,
        epoch: Epoch,
        remaining_ms: u64,
    },
    /// A capability token for this session.
    Capability {
        role: Role,
        token: Token,
        /// Set for host tokens: the epoch the token is bound to.
        epoch: Option<Epoch>,
        actions: Vec<Action>,
        /// Lifetime counted from when the server sent this frame.
        expires_in_ms: u64,
    },
    /// A member connected or disconnected (soft state, not on the `seq` stream).
    Presence { member: Member, online: bool },
    /// Several presence changes at once: the server sends at most one presence frame per room
    /// per interval, and what happened meanwhile comes together. Apply `left`, then `joined`
    /// (the two never name the same session).
    PresenceBatch {
        joined: Vec<Member>,
        left: Vec<Member>,
    },
    /// The result of a `command`.
    CommandResult {
        id: IdempotencyKey,
        outcome: Outcome,
    },
    /// The server will never deliver these items (retention, or it shed them).
    Discontinuity(Gap),
    /// WebRTC signalling relayed from another member of the room.
    Signal {
        from: ParticipantId,
        from_session: SessionId,
        data: Json,
    },
    /// A protocol error; the server usually closes the connection after it.
    Error { code: ErrorCode, message: String },
    /// Nothing to say: sent after [`super::codec::HEARTBEAT_MS`] without any other frame, so that
    /// the client can tell a quiet connection from a dead one.
    Heartbeat,
}

/// Client → server frames. Decoded only by [`super::codec::decode_client`] (fields read in
/// `super::de`, which says which fields may be absent).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ClientMsg {
    /// The first frame: the join token travels here, never in the URL.
    Hello {
        token: Token,
        /// Resume after this `seq` (items after it are replayed in `welcome.missed`).
        resume: Option<Seq>,
        /// The newest epoch this client has observed (lets the server spot a client that claims
        /// an epoch ahead of the committed one).
        epoch_seen: Option<Epoch>,
    },
    /// On a live connection: a gap was seen, send a fresh welcome resuming after `cursor`.
    Resume { cursor: Seq },
    /// Echo of a lease probe, sent from the message handler as soon as the probe arrives.
    LeaseEcho { nonce: u64 },
    /// Leaving explicitly: a host that leaves is replaced at once.
    Leave,
    /// A command. Host commands carry the host token and the epoch they were meant for.
    Command {
        id: IdempotencyKey,
        action: Action,
        /// Absent: `null`.
        payload: Json,
        epoch: Option<Epoch>,
        capability: Token,
        /// The command of its kind this one was sent behind, unanswered when it went: while
        /// that one stands refused with a retry time on this connection, the server holds this
        /// one (refused `unavailable`), so a refusal never lets a later command be applied first.
        after: Option<IdempotencyKey>,
    },
    /// WebRTC signalling for another member of the room.
    Signal {
        to: ParticipantId,
        to_session: Option<SessionId>,
        data: Json,
    },
}

/// `POST /v1/rooms/{room}/commands` body; the token travels in `Authorization: Bearer`, the key
/// in `Idempotency-Key`. The response body is an [`Outcome`].
#[derive(Debug, Clone, PartialEq)]
pub struct CommandRequest {
    pub action: Action,
    pub payload: Json,
    pub epoch: Option<Epoch>,
}

/// One entry of a participant's durable inbox.
#[derive(Debug, Clone, PartialEq)]
pub struct InboxEntry {
    pub cursor: u64,
    pub item: Item,
}

/// `GET /v1/rooms/{room}/inbox?since=<cursor>` response body.
#[derive(Debug, Clone, PartialEq)]
pub struct InboxPage {
    pub entries: Vec<InboxEntry>,
    /// Pass as `since` to read on; `None` when the page is the end.
    pub next: Option<u64>,
}

/// One public signing key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicKey {
    pub kid: KeyId,
    /// Always `"Ed25519"`: there is no algorithm negotiation.
    pub alg: String,
    /// base64url (no padding) of the 32-byte public key.
    pub x: String,
}

/// `GET /v1/keys` response body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySet {
    pub keys: Vec<PublicKey>,
}
