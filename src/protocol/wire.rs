//! How every protocol type is written as JSON and read back, on the reader and writer of
//! [`super::json`].
//!
//! The rules, the same for every type:
//! - Objects are written with their fields in declaration order; an optional field marked
//!   "(may be absent)" in [`super::messages`] is left out when `None`, any other `None` is `null`.
//! - On reading, keys may come in any order, unknown keys are ignored whatever their value (a
//!   newer peer may add fields), a key given twice is an error, a missing `Option` field is
//!   `None`, a missing list or payload is empty or `null`, and any other missing field is an
//!   error.
//! - A tagged object (`t` of a frame, `kind` of an [`Item`], `outcome` of an [`Outcome`]) is
//!   read in two passes: the first finds the tag and stops there; the second reads the
//!   variant's fields, where the tag (and a frame's `v`) must appear exactly once and is
//!   otherwise ignored, and so is a field that belongs to another variant. Encoders write the
//!   tag first, so the first pass reads a key or two.
//! - Fieldless enums are their snake_case name; a name this SDK does not know reads as the
//!   enum's `Unknown` where it has one, and is an error otherwise.

use crate::prelude::*;
use alloc::borrow::Cow;

use super::ids::{
    Action, Epoch, IdempotencyKey, KeyId, ParticipantId, RoomId, Seq, ServerTime, SessionId, Token,
};
use super::json::{FromJson, Json, Reader, Result, ToJson, Writer};
use super::messages::{
    ActionKind, ActionTable, Assignment, ClientMsg, CommandRequest, ErrorCode, Gap, InboxEntry,
    InboxPage, Item, KeySet, Member, Outcome, PublicKey, Reason, RejectCode, Role, RoomEvent,
    ServerMsg, SignedAssignment, Snapshot, PROTOCOL_VERSION,
};

// ---- primitives -------------------------------------------------------------------------------

impl FromJson for u64 {
    fn read_json(r: &mut Reader<'_>) -> Result<Self> {
        r.u64()
    }
}

impl ToJson for u64 {
    fn write_json(&self, w: &mut Writer) {
        w.u64(*self);
    }
}

impl FromJson for bool {
    fn read_json(r: &mut Reader<'_>) -> Result<Self> {
        r.bool()
    }
}

impl ToJson for bool {
    fn write_json(&self, w: &mut Writer) {
        w.bool(*self);
    }
}

impl FromJson for String {
    fn read_json(r: &mut Reader<'_>) -> Result<Self> {
        r.str().map(Cow::into_owned)
    }
}

impl ToJson for String {
    fn write_json(&self, w: &mut Writer) {
        w.str(self);
    }
}

impl ToJson for str {
    fn write_json(&self, w: &mut Writer) {
        w.str(self);
    }
}

impl<T: FromJson> FromJson for Option<T> {
    fn read_json(r: &mut Reader<'_>) -> Result<Self> {
        if r.null() {
            Ok(None)
        } else {
            T::read_json(r).map(Some)
        }
    }
}

impl<T: ToJson> ToJson for Option<T> {
    fn write_json(&self, w: &mut Writer) {
        match self {
            Some(v) => v.write_json(w),
            None => w.null(),
        }
    }
}

impl<T: FromJson> FromJson for Vec<T> {
    fn read_json(r: &mut Reader<'_>) -> Result<Self> {
        let mut out = Vec::new();
        r.array(|r| {
            out.push(T::read_json(r)?);
            Ok(())
        })?;
        Ok(out)
    }
}

impl<T: ToJson> ToJson for [T] {
    fn write_json(&self, w: &mut Writer) {
        w.open_array();
        for v in self {
            v.write_json(w);
        }
        w.close_array();
    }
}

impl<T: ToJson> ToJson for Vec<T> {
    fn write_json(&self, w: &mut Writer) {
        self.as_slice().write_json(w);
    }
}

impl<T: ToJson + ?Sized> ToJson for &T {
    fn write_json(&self, w: &mut Writer) {
        (**self).write_json(w);
    }
}

// ---- identifiers, counters, tokens --------------------------------------------------------------

macro_rules! string_ids {
    ($($t:ident),*) => {$(
        impl FromJson for $t {
            fn read_json(r: &mut Reader<'_>) -> Result<Self> {
                let at = r.pos();
                let s = r.str()?;
                $t::new(s).or_else(|_| {
                    r.rewind(at);
                    r.error()
                })
            }
        }

        impl ToJson for $t {
            fn write_json(&self, w: &mut Writer) {
                w.str(self.as_str());
            }
        }
    )*};
}

string_ids!(
    RoomId,
    ParticipantId,
    SessionId,
    KeyId,
    Action,
    IdempotencyKey
);

macro_rules! counters {
    ($($t:ident),*) => {$(
        impl FromJson for $t {
            fn read_json(r: &mut Reader<'_>) -> Result<Self> {
                r.u64().map($t)
            }
        }

        impl ToJson for $t {
            fn write_json(&self, w: &mut Writer) {
                w.u64(self.0);
            }
        }
    )*};
}

counters!(Epoch, Seq, ServerTime);

impl FromJson for Token {
    fn read_json(r: &mut Reader<'_>) -> Result<Self> {
        r.str().map(Token::new)
    }
}

impl ToJson for Token {
    fn write_json(&self, w: &mut Writer) {
        w.str(self.expose());
    }
}

// ---- fieldless enums ----------------------------------------------------------------------------

/// A fieldless enum, written as its name.
pub(super) trait Named: Copy + PartialEq + 'static {
    /// Every variant except the catch-all, in declaration order (a test checks it).
    const ALL: &'static [Self];
    /// What a name not in `ALL` reads as; `None`: it is an error.
    const OTHER: Option<Self>;
    /// The wire name.
    fn name(self) -> &'static str;
}

macro_rules! named {
    ($t:ident, other: $other:expr, [$($v:ident),* $(,)?]) => {
        impl Named for $t {
            const ALL: &'static [Self] = &[$($t::$v),*];
            const OTHER: Option<Self> = $other;
            fn name(self) -> &'static str {
                self.as_str()
            }
        }

        impl FromJson for $t {
            fn read_json(r: &mut Reader<'_>) -> Result<Self> {
                read_named(r)
            }
        }

        impl ToJson for $t {
            fn write_json(&self, w: &mut Writer) {
                w.str(self.as_str());
            }
        }
    };
}

fn read_named<T: Named>(r: &mut Reader<'_>) -> Result<T> {
    let at = r.pos();
    let name = r.str()?;
    match T::ALL
        .iter()
        .copied()
        .find(|v| v.name() == name)
        .or(T::OTHER)
    {
        Some(v) => Ok(v),
        None => {
            r.rewind(at);
            r.error()
        }
    }
}

named!(Reason, other: Some(Reason::Unknown), [
    Elected, LeaseLapsed, Left, Resigned, Transferred, Admin, Kicked, Closed,
]);
named!(RejectCode, other: Some(RejectCode::Unknown), [
    StaleEpoch, NotHost, LeaseExpired, BadCapability, ActionNotGranted, IdempotencyConflict,
    RateLimited, BadRequest, Unavailable,
]);
named!(ErrorCode, other: Some(ErrorCode::Unknown), [
    BadFrame, FrameTooLarge, UnsupportedVersion, RateLimited, Unauthorized, RoomFull,
    TooManyRooms, TooManyConnections, UnexpectedMessage, RoomClosed, Kicked, Internal,
]);
named!(Role, other: None, [Host, Participant]);
named!(ActionKind, other: None, [Host, Participant]);

// ---- reading objects ----------------------------------------------------------------------------

/// The fields of one object shape, each an `Option` filled at most once.
trait Slots {
    /// The fields' keys, in declaration order.
    fn keys(&self) -> &'static [&'static str];
    /// Reads the value of field `i` (an index into `keys()`).
    fn take(&mut self, r: &mut Reader<'_>, i: usize) -> Result<()>;
}

fn set<T: FromJson>(slot: &mut Option<T>, r: &mut Reader<'_>) -> Result<()> {
    if slot.is_some() {
        return r.error();
    }
    *slot = Some(T::read_json(r)?);
    Ok(())
}

/// A struct of `Option` slots named like the object's keys. Each `take` is a chain of index
/// compares; the key is matched against the names once, in `fill`, for every shape.
macro_rules! slots {
    ($name:ident { $($f:ident: $t:ty),* $(,)? }) => {
        #[derive(Default)]
        struct $name {
            $($f: Option<$t>,)*
        }

        impl Slots for $name {
            fn keys(&self) -> &'static [&'static str] {
                &[$(stringify!($f)),*]
            }
            #[allow(unused_mut, unused_assignments)]
            fn take(&mut self, r: &mut Reader<'_>, mut i: usize) -> Result<()> {
                $(if i == 0 {
                    return set(&mut self.$f, r);
                }
                i -= 1;)*
                let _ = i;
                r.error()
            }
        }
    };
}

/// Reads the object at `r` into `S`. `tags` were read by a first pass: each must appear once and
/// is otherwise ignored. Keys that are neither are skipped.
fn fields<S: Slots + Default>(r: &mut Reader<'_>, tags: &[&str]) -> Result<S> {
    let mut s = S::default();
    fill(r, tags, &mut s)?;
    Ok(s)
}

/// [`fields`] without the type parameter, so that the loop exists once in the wasm.
fn fill(r: &mut Reader<'_>, tags: &[&str], s: &mut dyn Slots) -> Result<()> {
    let mut seen = [false; 3];
    let keys = s.keys();
    r.object(|r, key| {
        if let Some(i) = tags.iter().position(|t| *t == key) {
            if seen[i] {
                return r.error();
            }
            seen[i] = true;
            return r.skip().map(drop);
        }
        match keys.iter().position(|k| *k == key) {
            Some(i) => s.take(r, i),
            None => r.skip().map(drop),
        }
    })
}

/// A required field; the error points at the end of its object.
fn need<T>(r: &Reader<'_>, slot: Option<T>) -> Result<T> {
    slot.map_or_else(|| r.error(), Ok)
}

/// First pass over the object at `r`: the value of `key` (read by `read`), stopping there;
/// leaves `r` where it was. `Ok(None)`: the object has no such key.
pub(super) fn peek_field<'a, T>(
    r: &mut Reader<'a>,
    key: &str,
    read: impl Fn(&mut Reader<'a>) -> Result<T>,
) -> Result<Option<T>> {
    let start = r.pos();
    let mut found = None;
    let scan = r.object(|r, k| {
        if k == key {
            found = Some(read(r)?);
            // Stop the scan: the second pass reads (and checks) the rest.
            return r.error();
        }
        r.skip().map(drop)
    });
    match (found, scan) {
        (Some(v), _) => {
            r.rewind(start);
            Ok(Some(v))
        }
        (None, Ok(())) => {
            r.rewind(start);
            Ok(None)
        }
        (None, Err(e)) => Err(e),
    }
}

/// The tag `key` of the object at `r` (a missing tag is an error).
fn tag<'a>(r: &mut Reader<'a>, key: &str) -> Result<Cow<'a, str>> {
    match peek_field(r, key, Reader::str)? {
        Some(t) => Ok(t),
        None => r.error(),
    }
}

// ---- writing objects ----------------------------------------------------------------------------

/// A field marked "(may be absent)": left out when `None`.
fn maybe<T: ToJson>(w: &mut Writer, key: &str, value: &Option<T>) {
    if let Some(v) = value {
        w.field(key, v);
    }
}

/// Opens an object whose first entry is the tag `key: name`.
fn open_tagged(w: &mut Writer, key: &str, name: &str) {
    w.open();
    w.field(key, name);
}

// ---- assignments ------------------------------------------------------------------------------

slots!(SignedSlots {
    room: RoomId,
    host: Option<ParticipantId>,
    session: Option<SessionId>,
    epoch: Epoch,
    seq: Seq,
    lease_ms: u64,
    reason: Reason,
    issued_at: ServerTime,
    kid: Option<KeyId>,
    sig: Option<String>,
});

impl SignedSlots {
    fn build(self, r: &Reader<'_>) -> Result<SignedAssignment> {
        Ok(SignedAssignment {
            assignment: Assignment {
                room: need(r, self.room)?,
                host: self.host.flatten(),
                session: self.session.flatten(),
                epoch: need(r, self.epoch)?,
                seq: need(r, self.seq)?,
                lease_ms: need(r, self.lease_ms)?,
                reason: need(r, self.reason)?,
                issued_at: need(r, self.issued_at)?,
            },
            kid: self.kid.flatten(),
            sig: self.sig.flatten(),
        })
    }
}

fn signed_assignment(r: &mut Reader<'_>, tags: &[&str]) -> Result<SignedAssignment> {
    fields::<SignedSlots>(r, tags)?.build(r)
}

impl Assignment {
    fn write_fields(&self, w: &mut Writer) {
        w.field("room", &self.room);
        w.field("host", &self.host);
        w.field("session", &self.session);
        w.field("epoch", &self.epoch);
        w.field("seq", &self.seq);
        w.field("lease_ms", &self.lease_ms);
        w.field("reason", &self.reason);
        w.field("issued_at", &self.issued_at);
    }
}

impl ToJson for Assignment {
    fn write_json(&self, w: &mut Writer) {
        w.open();
        self.write_fields(w);
        w.close();
    }
}

/// Reads an assignment; a `kid` and `sig` next to it are read and dropped.
impl FromJson for Assignment {
    fn read_json(r: &mut Reader<'_>) -> Result<Self> {
        signed_assignment(r, &[]).map(|s| s.assignment)
    }
}

impl SignedAssignment {
    fn write_fields(&self, w: &mut Writer) {
        self.assignment.write_fields(w);
        maybe(w, "kid", &self.kid);
        maybe(w, "sig", &self.sig);
    }
}

impl ToJson for SignedAssignment {
    fn write_json(&self, w: &mut Writer) {
        w.open();
        self.write_fields(w);
        w.close();
    }
}

impl FromJson for SignedAssignment {
    fn read_json(r: &mut Reader<'_>) -> Result<Self> {
        signed_assignment(r, &[])
    }
}

// ---- snapshot parts ---------------------------------------------------------------------------

slots!(MemberSlots {
    id: ParticipantId,
    session: SessionId,
    name: String,
    join_seq: u64,
    may_host: bool,
});

impl FromJson for Member {
    fn read_json(r: &mut Reader<'_>) -> Result<Self> {
        let s: MemberSlots = fields(r, &[])?;
        Ok(Member {
            id: need(r, s.id)?,
            session: need(r, s.session)?,
            name: s.name.unwrap_or_default(),
            join_seq: need(r, s.join_seq)?,
            may_host: need(r, s.may_host)?,
        })
    }
}

impl ToJson for Member {
    fn write_json(&self, w: &mut Writer) {
        w.open();
        w.field("id", &self.id);
        w.field("session", &self.session);
        w.field("name", &self.name);
        w.field("join_seq", &self.join_seq);
        w.field("may_host", &self.may_host);
        w.close();
    }
}

slots!(ActionTableSlots {
    host: Vec<Action>,
    participant: Vec<Action>,
});

impl FromJson for ActionTable {
    fn read_json(r: &mut Reader<'_>) -> Result<Self> {
        let s: ActionTableSlots = fields(r, &[])?;
        Ok(ActionTable {
            host: s.host.unwrap_or_default(),
            participant: s.participant.unwrap_or_default(),
        })
    }
}

impl ToJson for ActionTable {
    fn write_json(&self, w: &mut Writer) {
        w.open();
        w.field("host", &self.host);
        w.field("participant", &self.participant);
        w.close();
    }
}

slots!(SnapshotSlots {
    room: RoomId,
    current: SignedAssignment,
    members: Vec<Member>,
    seq: Seq,
    lease_remaining_ms: Option<u64>,
    server_time: ServerTime,
    actions: ActionTable,
});

impl FromJson for Snapshot {
    fn read_json(r: &mut Reader<'_>) -> Result<Self> {
        let s: SnapshotSlots = fields(r, &[])?;
        Ok(Snapshot {
            room: need(r, s.room)?,
            current: need(r, s.current)?,
            members: need(r, s.members)?,
            seq: need(r, s.seq)?,
            lease_remaining_ms: s.lease_remaining_ms.flatten(),
            server_time: need(r, s.server_time)?,
            actions: s.actions.unwrap_or_default(),
        })
    }
}

impl ToJson for Snapshot {
    fn write_json(&self, w: &mut Writer) {
        w.open();
        w.field("room", &self.room);
        w.field("current", &self.current);
        w.field("members", &self.members);
        w.field("seq", &self.seq);
        maybe(w, "lease_remaining_ms", &self.lease_remaining_ms);
        w.field("server_time", &self.server_time);
        w.field("actions", &self.actions);
        w.close();
    }
}

// ---- the room stream ----------------------------------------------------------------------------

slots!(EventSlots {
    seq: Seq,
    epoch: Epoch,
    actor: ParticipantId,
    action: Action,
    payload: Json,
    at: ServerTime,
});

fn room_event(r: &mut Reader<'_>, tags: &[&str]) -> Result<RoomEvent> {
    let s: EventSlots = fields(r, tags)?;
    Ok(RoomEvent {
        seq: need(r, s.seq)?,
        epoch: need(r, s.epoch)?,
        actor: need(r, s.actor)?,
        action: need(r, s.action)?,
        payload: s.payload.unwrap_or_default(),
        at: need(r, s.at)?,
    })
}

impl RoomEvent {
    fn write_fields(&self, w: &mut Writer) {
        w.field("seq", &self.seq);
        w.field("epoch", &self.epoch);
        w.field("actor", &self.actor);
        w.field("action", &self.action);
        w.field("payload", &self.payload);
        w.field("at", &self.at);
    }
}

impl FromJson for RoomEvent {
    fn read_json(r: &mut Reader<'_>) -> Result<Self> {
        room_event(r, &[])
    }
}

impl ToJson for RoomEvent {
    fn write_json(&self, w: &mut Writer) {
        w.open();
        self.write_fields(w);
        w.close();
    }
}

impl FromJson for Item {
    fn read_json(r: &mut Reader<'_>) -> Result<Self> {
        let at = r.pos();
        match &*tag(r, "kind")? {
            "assignment" => signed_assignment(r, &["kind"]).map(Item::Assignment),
            "event" => room_event(r, &["kind"]).map(Item::Event),
            _ => {
                r.rewind(at);
                r.error()
            }
        }
    }
}

impl ToJson for Item {
    fn write_json(&self, w: &mut Writer) {
        match self {
            Item::Assignment(a) => {
                open_tagged(w, "kind", "assignment");
                a.write_fields(w);
            }
            Item::Event(e) => {
                open_tagged(w, "kind", "event");
                e.write_fields(w);
            }
        }
        w.close();
    }
}

slots!(GapSlots { from: Seq, to: Seq });

fn gap(r: &mut Reader<'_>, tags: &[&str]) -> Result<Gap> {
    let s: GapSlots = fields(r, tags)?;
    Ok(Gap {
        from: need(r, s.from)?,
        to: need(r, s.to)?,
    })
}

impl FromJson for Gap {
    fn read_json(r: &mut Reader<'_>) -> Result<Self> {
        gap(r, &[])
    }
}

impl ToJson for Gap {
    fn write_json(&self, w: &mut Writer) {
        w.open();
        w.field("from", &self.from);
        w.field("to", &self.to);
        w.close();
    }
}

// ---- command outcomes ---------------------------------------------------------------------------

slots!(AcceptedSlots {
    id: IdempotencyKey,
    seq: Seq
});
slots!(RejectedSlots {
    id: IdempotencyKey,
    code: RejectCode,
    current: Option<SignedAssignment>,
    retry_after_ms: Option<u64>,
});

/// An outcome's fields after its tag was read; `tags` are the keys to ignore. Returns the
/// frame's `id` too when `with_id` (a command result).
fn outcome(
    r: &mut Reader<'_>,
    name: &str,
    tags: &[&str],
    with_id: bool,
) -> Result<(Option<IdempotencyKey>, Outcome)> {
    let id_of = |r: &Reader<'_>, id| {
        if with_id {
            need(r, id).map(Some)
        } else {
            Ok(None)
        }
    };
    match name {
        "accepted" => {
            let s: AcceptedSlots = fields(r, tags)?;
            let id = id_of(r, s.id)?;
            Ok((
                id,
                Outcome::Accepted {
                    seq: need(r, s.seq)?,
                },
            ))
        }
        "rejected" => {
            let s: RejectedSlots = fields(r, tags)?;
            let id = id_of(r, s.id)?;
            Ok((
                id,
                Outcome::Rejected {
                    code: need(r, s.code)?,
                    current: s.current.flatten(),
                    retry_after_ms: s.retry_after_ms.flatten(),
                },
            ))
        }
        _ => r.error(),
    }
}

impl Outcome {
    fn write_fields(&self, w: &mut Writer) {
        match self {
            Outcome::Accepted { seq } => {
                w.field("outcome", "accepted");
                w.field("seq", seq);
            }
            Outcome::Rejected {
                code,
                current,
                retry_after_ms,
            } => {
                w.field("outcome", "rejected");
                w.field("code", code);
                maybe(w, "current", current);
                maybe(w, "retry_after_ms", retry_after_ms);
            }
        }
    }
}

/// An `id` next to the outcome is ignored (as any unknown field is).
impl FromJson for Outcome {
    fn read_json(r: &mut Reader<'_>) -> Result<Self> {
        let name = tag(r, "outcome")?;
        outcome(r, &name, &["outcome"], false).map(|(_, o)| o)
    }
}

impl ToJson for Outcome {
    fn write_json(&self, w: &mut Writer) {
        w.open();
        self.write_fields(w);
        w.close();
    }
}

// ---- HTTP bodies --------------------------------------------------------------------------------

slots!(CommandRequestSlots {
    action: Action,
    payload: Json,
    epoch: Option<Epoch>,
});

impl FromJson for CommandRequest {
    fn read_json(r: &mut Reader<'_>) -> Result<Self> {
        let s: CommandRequestSlots = fields(r, &[])?;
        Ok(CommandRequest {
            action: need(r, s.action)?,
            payload: s.payload.unwrap_or_default(),
            epoch: s.epoch.flatten(),
        })
    }
}

impl ToJson for CommandRequest {
    fn write_json(&self, w: &mut Writer) {
        w.open();
        w.field("action", &self.action);
        w.field("payload", &self.payload);
        maybe(w, "epoch", &self.epoch);
        w.close();
    }
}

slots!(InboxEntrySlots {
    cursor: u64,
    item: Item
});

impl FromJson for InboxEntry {
    fn read_json(r: &mut Reader<'_>) -> Result<Self> {
        let s: InboxEntrySlots = fields(r, &[])?;
        Ok(InboxEntry {
            cursor: need(r, s.cursor)?,
            item: need(r, s.item)?,
        })
    }
}

impl ToJson for InboxEntry {
    fn write_json(&self, w: &mut Writer) {
        w.open();
        w.field("cursor", &self.cursor);
        w.field("item", &self.item);
        w.close();
    }
}

slots!(InboxPageSlots {
    entries: Vec<InboxEntry>,
    next: Option<u64>,
});

impl FromJson for InboxPage {
    fn read_json(r: &mut Reader<'_>) -> Result<Self> {
        let s: InboxPageSlots = fields(r, &[])?;
        Ok(InboxPage {
            entries: need(r, s.entries)?,
            next: s.next.flatten(),
        })
    }
}

impl ToJson for InboxPage {
    fn write_json(&self, w: &mut Writer) {
        w.open();
        w.field("entries", &self.entries);
        maybe(w, "next", &self.next);
        w.close();
    }
}

slots!(PublicKeySlots {
    kid: KeyId,
    alg: String,
    x: String,
});

impl FromJson for PublicKey {
    fn read_json(r: &mut Reader<'_>) -> Result<Self> {
        let s: PublicKeySlots = fields(r, &[])?;
        Ok(PublicKey {
            kid: need(r, s.kid)?,
            alg: need(r, s.alg)?,
            x: need(r, s.x)?,
        })
    }
}

impl ToJson for PublicKey {
    fn write_json(&self, w: &mut Writer) {
        w.open();
        w.field("kid", &self.kid);
        w.field("alg", &self.alg);
        w.field("x", &self.x);
        w.close();
    }
}

slots!(KeySetSlots { keys: Vec<PublicKey> });

impl FromJson for KeySet {
    fn read_json(r: &mut Reader<'_>) -> Result<Self> {
        let s: KeySetSlots = fields(r, &[])?;
        Ok(KeySet {
            keys: need(r, s.keys)?,
        })
    }
}

impl ToJson for KeySet {
    fn write_json(&self, w: &mut Writer) {
        w.open();
        w.field("keys", &self.keys);
        w.close();
    }
}

// ---- frames -------------------------------------------------------------------------------------

/// The keys a frame's first pass reads.
const FRAME_TAGS: &[&str] = &["v", "t"];

/// A frame's `v` and `t`, read by a first pass that stops at each (`None`: absent). `r` is left
/// at the start.
pub(super) fn frame_head<'a>(r: &mut Reader<'a>) -> Result<(Option<u64>, Option<Cow<'a, str>>)> {
    let v = peek_field(r, "v", Reader::u64)?;
    let t = peek_field(r, "t", Reader::str)?;
    Ok((v, t))
}

slots!(WelcomeSlots {
    you: ParticipantId,
    session: SessionId,
    snapshot: Snapshot,
    missed: Vec<Item>,
    discontinuity: Option<Gap>,
});
slots!(LeaseProbeSlots {
    nonce: u64,
    epoch: Epoch,
});
slots!(LeaseConfirmSlots {
    nonce: u64,
    epoch: Epoch,
    remaining_ms: u64,
});
slots!(CapabilitySlots {
    role: Role,
    token: Token,
    epoch: Option<Epoch>,
    actions: Vec<Action>,
    expires_in_ms: u64,
});
slots!(PresenceSlots {
    member: Member,
    online: bool,
});
slots!(PresenceBatchSlots {
    joined: Vec<Member>,
    left: Vec<Member>,
});
slots!(SignalFromSlots {
    from: ParticipantId,
    from_session: SessionId,
    data: Json,
});
slots!(ErrorSlots {
    code: ErrorCode,
    message: String,
});

/// Reads the server frame of type `t` at `r` (whose head was read). `Ok(None)`: `t` is not a
/// server frame type.
pub(super) fn server_msg(r: &mut Reader<'_>, t: &str) -> Result<Option<ServerMsg>> {
    let tags = FRAME_TAGS;
    Ok(Some(match t {
        "welcome" => {
            let s: WelcomeSlots = fields(r, tags)?;
            ServerMsg::Welcome {
                you: need(r, s.you)?,
                session: need(r, s.session)?,
                snapshot: need(r, s.snapshot)?,
                missed: s.missed.unwrap_or_default(),
                discontinuity: s.discontinuity.flatten(),
            }
        }
        "assignment" => ServerMsg::Assignment(signed_assignment(r, tags)?),
        "event" => ServerMsg::Event(room_event(r, tags)?),
        "lease_probe" => {
            let s: LeaseProbeSlots = fields(r, tags)?;
            ServerMsg::LeaseProbe {
                nonce: need(r, s.nonce)?,
                epoch: need(r, s.epoch)?,
            }
        }
        "lease_confirm" => {
            let s: LeaseConfirmSlots = fields(r, tags)?;
            ServerMsg::LeaseConfirm {
                nonce: need(r, s.nonce)?,
                epoch: need(r, s.epoch)?,
                remaining_ms: need(r, s.remaining_ms)?,
            }
        }
        "capability" => {
            let s: CapabilitySlots = fields(r, tags)?;
            ServerMsg::Capability {
                role: need(r, s.role)?,
                token: need(r, s.token)?,
                epoch: s.epoch.flatten(),
                actions: need(r, s.actions)?,
                expires_in_ms: need(r, s.expires_in_ms)?,
            }
        }
        "presence" => {
            let s: PresenceSlots = fields(r, tags)?;
            ServerMsg::Presence {
                member: need(r, s.member)?,
                online: need(r, s.online)?,
            }
        }
        "presence_batch" => {
            let s: PresenceBatchSlots = fields(r, tags)?;
            ServerMsg::PresenceBatch {
                joined: s.joined.unwrap_or_default(),
                left: s.left.unwrap_or_default(),
            }
        }
        "command_result" => {
            let name = tag(r, "outcome")?;
            let (id, outcome) = outcome(r, &name, &["v", "t", "outcome"], true)?;
            ServerMsg::CommandResult {
                id: need(r, id)?,
                outcome,
            }
        }
        "discontinuity" => ServerMsg::Discontinuity(gap(r, tags)?),
        "signal" => {
            let s: SignalFromSlots = fields(r, tags)?;
            ServerMsg::Signal {
                from: need(r, s.from)?,
                from_session: need(r, s.from_session)?,
                data: need(r, s.data)?,
            }
        }
        "heartbeat" => {
            fields::<NoSlots>(r, tags)?;
            ServerMsg::Heartbeat
        }
        "error" => {
            let s: ErrorSlots = fields(r, tags)?;
            ServerMsg::Error {
                code: need(r, s.code)?,
                message: need(r, s.message)?,
            }
        }
        _ => return Ok(None),
    }))
}

fn open_frame(w: &mut Writer, t: &str) {
    w.open();
    w.field("v", &u64::from(PROTOCOL_VERSION));
    w.field("t", t);
}

impl ToJson for ServerMsg {
    fn write_json(&self, w: &mut Writer) {
        match self {
            ServerMsg::Welcome {
                you,
                session,
                snapshot,
                missed,
                discontinuity,
            } => {
                open_frame(w, "welcome");
                w.field("you", you);
                w.field("session", session);
                w.field("snapshot", snapshot);
                w.field("missed", missed);
                maybe(w, "discontinuity", discontinuity);
            }
            ServerMsg::Assignment(a) => {
                open_frame(w, "assignment");
                a.write_fields(w);
            }
            ServerMsg::Event(e) => {
                open_frame(w, "event");
                e.write_fields(w);
            }
            ServerMsg::LeaseProbe { nonce, epoch } => {
                open_frame(w, "lease_probe");
                w.field("nonce", nonce);
                w.field("epoch", epoch);
            }
            ServerMsg::LeaseConfirm {
                nonce,
                epoch,
                remaining_ms,
            } => {
                open_frame(w, "lease_confirm");
                w.field("nonce", nonce);
                w.field("epoch", epoch);
                w.field("remaining_ms", remaining_ms);
            }
            ServerMsg::Capability {
                role,
                token,
                epoch,
                actions,
                expires_in_ms,
            } => {
                open_frame(w, "capability");
                w.field("role", role);
                w.field("token", token);
                maybe(w, "epoch", epoch);
                w.field("actions", actions);
                w.field("expires_in_ms", expires_in_ms);
            }
            ServerMsg::Presence { member, online } => {
                open_frame(w, "presence");
                w.field("member", member);
                w.field("online", online);
            }
            ServerMsg::PresenceBatch { joined, left } => {
                open_frame(w, "presence_batch");
                w.field("joined", joined);
                w.field("left", left);
            }
            ServerMsg::CommandResult { id, outcome } => {
                open_frame(w, "command_result");
                w.field("id", id);
                outcome.write_fields(w);
            }
            ServerMsg::Discontinuity(g) => {
                open_frame(w, "discontinuity");
                w.field("from", &g.from);
                w.field("to", &g.to);
            }
            ServerMsg::Signal {
                from,
                from_session,
                data,
            } => {
                open_frame(w, "signal");
                w.field("from", from);
                w.field("from_session", from_session);
                w.field("data", data);
            }
            ServerMsg::Error { code, message } => {
                open_frame(w, "error");
                w.field("code", code);
                w.field("message", message);
            }
            ServerMsg::Heartbeat => open_frame(w, "heartbeat"),
        }
        w.close();
    }
}

slots!(HelloSlots {
    token: Token,
    resume: Option<Seq>,
    epoch_seen: Option<Epoch>,
});
slots!(ResumeSlots { cursor: Seq });
slots!(LeaseEchoSlots { nonce: u64 });
// A frame with no fields of its own (`leave`, `heartbeat`).
slots!(NoSlots {});
slots!(CommandSlots {
    id: IdempotencyKey,
    action: Action,
    payload: Json,
    epoch: Option<Epoch>,
    capability: Token,
    after: Option<IdempotencyKey>,
});
slots!(SignalToSlots {
    to: ParticipantId,
    to_session: Option<SessionId>,
    data: Json,
});

/// Reads the client frame of type `t` at `r` (whose head was read). `Ok(None)`: `t` is not a
/// client frame type.
pub(super) fn client_msg(r: &mut Reader<'_>, t: &str) -> Result<Option<ClientMsg>> {
    let tags = FRAME_TAGS;
    Ok(Some(match t {
        "hello" => {
            let s: HelloSlots = fields(r, tags)?;
            ClientMsg::Hello {
                token: need(r, s.token)?,
                resume: s.resume.flatten(),
                epoch_seen: s.epoch_seen.flatten(),
            }
        }
        "resume" => {
            let s: ResumeSlots = fields(r, tags)?;
            ClientMsg::Resume {
                cursor: need(r, s.cursor)?,
            }
        }
        "lease_echo" => {
            let s: LeaseEchoSlots = fields(r, tags)?;
            ClientMsg::LeaseEcho {
                nonce: need(r, s.nonce)?,
            }
        }
        "leave" => {
            fields::<NoSlots>(r, tags)?;
            ClientMsg::Leave
        }
        "command" => {
            let s: CommandSlots = fields(r, tags)?;
            ClientMsg::Command {
                id: need(r, s.id)?,
                action: need(r, s.action)?,
                payload: s.payload.unwrap_or_default(),
                epoch: s.epoch.flatten(),
                capability: need(r, s.capability)?,
                after: s.after.flatten(),
            }
        }
        "signal" => {
            let s: SignalToSlots = fields(r, tags)?;
            ClientMsg::Signal {
                to: need(r, s.to)?,
                to_session: s.to_session.flatten(),
                data: need(r, s.data)?,
            }
        }
        _ => return Ok(None),
    }))
}

impl ToJson for ClientMsg {
    fn write_json(&self, w: &mut Writer) {
        match self {
            ClientMsg::Hello {
                token,
                resume,
                epoch_seen,
            } => {
                open_frame(w, "hello");
                w.field("token", token);
                maybe(w, "resume", resume);
                maybe(w, "epoch_seen", epoch_seen);
            }
            ClientMsg::Resume { cursor } => {
                open_frame(w, "resume");
                w.field("cursor", cursor);
            }
            ClientMsg::LeaseEcho { nonce } => {
                open_frame(w, "lease_echo");
                w.field("nonce", nonce);
            }
            ClientMsg::Leave => open_frame(w, "leave"),
            ClientMsg::Command {
                id,
                action,
                payload,
                epoch,
                capability,
                after,
            } => {
                open_frame(w, "command");
                w.field("id", id);
                w.field("action", action);
                w.field("payload", payload);
                maybe(w, "epoch", epoch);
                w.field("capability", capability);
                maybe(w, "after", after);
            }
            ClientMsg::Signal {
                to,
                to_session,
                data,
            } => {
                open_frame(w, "signal");
                w.field("to", to);
                maybe(w, "to_session", to_session);
                w.field("data", data);
            }
        }
        w.close();
    }
}

#[cfg(test)]
mod tests {
    use super::super::json::{from_str, to_string};
    use super::*;
    use std::fmt;

    /// `ALL` holds every variant but the catch-all, in declaration order, and each reads back
    /// from the name written for it. `discriminants`: of every variant, in declaration order.
    fn check_named<T>(discriminants: &[usize])
    where
        T: Named + ToJson + FromJson + fmt::Debug,
    {
        for (i, d) in discriminants.iter().enumerate() {
            assert_eq!(*d, i, "variant {i} is not listed in order");
        }
        for v in T::ALL {
            let json = to_string(v);
            assert_eq!(json, format!("\"{}\"", v.name()));
            assert_eq!(from_str::<T>(&json).unwrap(), *v);
        }
        assert_eq!(
            discriminants.len(),
            T::ALL.len() + usize::from(T::OTHER.is_some())
        );
        match T::OTHER {
            Some(other) => {
                assert_eq!(from_str::<T>(&to_string(&other)).unwrap(), other);
                assert_eq!(from_str::<T>("\"from_the_future\"").unwrap(), other);
            }
            None => assert!(from_str::<T>("\"from_the_future\"").is_err()),
        }
        // Only a name: not an externally tagged object, nor a number.
        let first = T::ALL[0].name();
        assert!(from_str::<T>(&format!("{{\"{first}\":null}}")).is_err());
        assert!(from_str::<T>("0").is_err());
    }

    #[test]
    fn named_enums_read_every_name_they_write() {
        use ErrorCode as E;
        use Reason as R;
        use RejectCode as C;
        check_named::<Reason>(&[
            R::Elected as usize,
            R::LeaseLapsed as usize,
            R::Left as usize,
            R::Resigned as usize,
            R::Transferred as usize,
            R::Admin as usize,
            R::Kicked as usize,
            R::Closed as usize,
            R::Unknown as usize,
        ]);
        check_named::<RejectCode>(&[
            C::StaleEpoch as usize,
            C::NotHost as usize,
            C::LeaseExpired as usize,
            C::BadCapability as usize,
            C::ActionNotGranted as usize,
            C::IdempotencyConflict as usize,
            C::RateLimited as usize,
            C::BadRequest as usize,
            C::Unavailable as usize,
            C::Unknown as usize,
        ]);
        check_named::<ErrorCode>(&[
            E::BadFrame as usize,
            E::FrameTooLarge as usize,
            E::UnsupportedVersion as usize,
            E::RateLimited as usize,
            E::Unauthorized as usize,
            E::RoomFull as usize,
            E::TooManyRooms as usize,
            E::TooManyConnections as usize,
            E::UnexpectedMessage as usize,
            E::RoomClosed as usize,
            E::Kicked as usize,
            E::Internal as usize,
            E::Unknown as usize,
        ]);
        check_named::<Role>(&[Role::Host as usize, Role::Participant as usize]);
        check_named::<ActionKind>(&[ActionKind::Host as usize, ActionKind::Participant as usize]);
    }
}
