//! Decoding of the tagged and flattened message types without serde's buffering `Content`.
//!
//! serde's derive reads a `#[serde(tag = ...)]` enum or a struct with a `#[serde(flatten)]` field
//! by first buffering the whole object into a private `Content` tree and then deserialising the
//! variant from that tree. It works with any key order, but in the wasm build that machinery and
//! a second copy of every field's deserialiser were ~70 KB of the ~280 KB of code (this module
//! in its place: ~31 KB less in all), and every frame was built into the buffer before it was
//! read. Here instead, with the same behaviour:
//!
//! - A frame ([`ServerMsg`], [`ClientMsg`]) is decoded from its text in passes: the codec's head
//!   pass reads `v` and `t`, then [`server_msg`] / [`client_msg`] read the variant's own fields
//!   struct from the same text, where `v` and `t` are unknown fields and ignored. A command
//!   result takes one more pass for its `outcome` tag. Any key order, nothing buffered.
//! - A tagged value inside a frame or body ([`Item`], [`Outcome`]) is read by [`TaggedVisitor`]:
//!   the entries before the tag are kept as JSON values and replayed, the rest go straight into
//!   the variant's struct. Every encoder here writes the tag first, so normally nothing is kept.
//! - The flattened [`SignedAssignment`] is read through a struct that spells out every field.
//!
//! As with the derives: unknown fields are ignored, and so is a field that belongs to another
//! variant, whatever its type; a duplicate field or tag, a missing tag and an unknown tag are
//! errors. What the derives also took, by accident of the buffer, and this does not: a tagged
//! value written as a JSON array (`["event", 3, ...]`, fields by position) and a variant's index
//! for its name (`"outcome": 1` in a command result). Neither is the protocol, and no encoder
//! writes them. One thing this takes that the derives did not: a value read before the tag is
//! kept as a `serde_json::Value`, so a key repeated inside it (in the `current` of an outcome
//! read as an HTTP body, say; a frame's is read from text) is not noticed; the last one wins, as
//! everywhere in a `Value`.

use core::fmt;
use core::marker::PhantomData;

use serde::de::value::MapAccessDeserializer;
use serde::de::{self, DeserializeSeed, IntoDeserializer, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::ids::{
    Action, Epoch, IdempotencyKey, KeyId, ParticipantId, RoomId, Seq, ServerTime, SessionId, Token,
};
use super::messages::{
    Assignment, ClientMsg, ErrorCode, Gap, Item, Member, Outcome, Reason, RejectCode, Role,
    RoomEvent, ServerMsg, SignedAssignment, Snapshot,
};

/// An enum written as a JSON object with a tag key naming the variant (`#[serde(tag = ...)]`).
pub(super) trait Tagged: Sized {
    /// The tag key.
    const TAG: &'static str;
    /// The tag values, in the order `variant` takes their index.
    const VARIANTS: &'static [&'static str];
    /// Reads variant `index` from the object's other entries.
    fn variant<'de, D: Deserializer<'de>>(index: usize, fields: D) -> Result<Self, D::Error>;
}

/// The [`Tagged`] enum of a `Deserialize` impl: `deserializer.deserialize_map(TaggedVisitor::new())`.
pub(super) struct TaggedVisitor<T>(PhantomData<T>);

impl<T> TaggedVisitor<T> {
    pub(super) fn new() -> Self {
        Self(PhantomData)
    }
}

impl<'de, T: Tagged> Visitor<'de> for TaggedVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a tagged object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<T, A::Error> {
        let mut before = Vec::new();
        let index = loop {
            match map.next_key_seed(KeyOrTag(T::TAG))? {
                None => return Err(de::Error::missing_field(T::TAG)),
                Some(None) => break map.next_value_seed(TagSeed::<T>(PhantomData))?,
                Some(Some(key)) => before.push((key, map.next_value::<Value>()?)),
            }
        };
        T::variant(
            index,
            MapAccessDeserializer::new(Replay {
                before: before.into_iter(),
                value: None,
                map,
                tag: T::TAG,
            }),
        )
    }
}

/// A key before the tag: `None` for the tag itself, the key otherwise.
struct KeyOrTag(&'static str);

impl<'de> DeserializeSeed<'de> for KeyOrTag {
    type Value = Option<String>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_identifier(self)
    }
}

impl<'de> Visitor<'de> for KeyOrTag {
    type Value = Option<String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<Self::Value, E> {
        Ok((key != self.0).then(|| key.to_owned()))
    }
}

/// The tag's value: the index of the variant it names.
pub(super) struct TagSeed<T>(PhantomData<T>);

impl<'de, T: Tagged> DeserializeSeed<'de> for TagSeed<T> {
    type Value = usize;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<usize, D::Error> {
        d.deserialize_identifier(self)
    }
}

impl<'de, T: Tagged> Visitor<'de> for TagSeed<T> {
    type Value = usize;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a variant name")
    }

    fn visit_str<E: de::Error>(self, tag: &str) -> Result<usize, E> {
        T::VARIANTS
            .iter()
            .position(|v| *v == tag)
            .ok_or_else(|| E::unknown_variant(tag, T::VARIANTS))
    }
}

/// A tag value read as a field of a fields struct (the command result's `outcome`).
pub(super) struct TagOf<T>(usize, PhantomData<T>);

impl<'de, T: Tagged> Deserialize<'de> for TagOf<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        TagSeed::<T>(PhantomData)
            .deserialize(d)
            .map(|i| Self(i, PhantomData))
    }
}

/// The entries of a tagged object other than the tag: first those read before it, then the rest
/// of the map, where a second tag is a duplicate field.
struct Replay<A> {
    before: std::vec::IntoIter<(String, Value)>,
    value: Option<Value>,
    map: A,
    tag: &'static str,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for Replay<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        if let Some((key, value)) = self.before.next() {
            self.value = Some(value);
            return seed
                .deserialize(IntoDeserializer::<A::Error>::into_deserializer(key))
                .map(Some);
        }
        self.map.next_key_seed(NotTag {
            seed,
            tag: self.tag,
        })
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        match self.value.take() {
            Some(value) => seed.deserialize(value).map_err(de::Error::custom),
            None => self.map.next_value_seed(seed),
        }
    }
}

/// A key after the tag: another tag is a duplicate, anything else goes to `seed`.
struct NotTag<K> {
    seed: K,
    tag: &'static str,
}

impl<'de, K: DeserializeSeed<'de>> DeserializeSeed<'de> for NotTag<K> {
    type Value = K::Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<K::Value, D::Error> {
        d.deserialize_identifier(self)
    }
}

impl<'de, K: DeserializeSeed<'de>> Visitor<'de> for NotTag<K> {
    type Value = K::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<K::Value, E> {
        if key == self.tag {
            return Err(E::duplicate_field(self.tag));
        }
        self.seed.deserialize(key.into_deserializer())
    }
}

impl Tagged for Item {
    const TAG: &'static str = "kind";
    const VARIANTS: &'static [&'static str] = &["assignment", "event"];

    fn variant<'de, D: Deserializer<'de>>(index: usize, fields: D) -> Result<Self, D::Error> {
        Ok(match index {
            0 => Item::Assignment(SignedAssignment::deserialize(fields)?),
            _ => Item::Event(RoomEvent::deserialize(fields)?),
        })
    }
}

impl Tagged for Outcome {
    const TAG: &'static str = "outcome";
    const VARIANTS: &'static [&'static str] = &["accepted", "rejected"];

    fn variant<'de, D: Deserializer<'de>>(index: usize, fields: D) -> Result<Self, D::Error> {
        Ok(match index {
            0 => Accepted::deserialize(fields)?.into(),
            _ => Rejected::deserialize(fields)?.into(),
        })
    }
}

/// [`SignedAssignment`] with its flattened [`Assignment`] spelled out.
#[derive(Deserialize)]
pub(super) struct SignedAssignmentFields {
    room: RoomId,
    host: Option<ParticipantId>,
    session: Option<SessionId>,
    epoch: Epoch,
    seq: Seq,
    lease_ms: u64,
    reason: Reason,
    issued_at: ServerTime,
    #[serde(default)]
    kid: Option<KeyId>,
    #[serde(default)]
    sig: Option<String>,
}

impl From<SignedAssignmentFields> for SignedAssignment {
    fn from(f: SignedAssignmentFields) -> Self {
        SignedAssignment {
            assignment: Assignment {
                room: f.room,
                host: f.host,
                session: f.session,
                epoch: f.epoch,
                seq: f.seq,
                lease_ms: f.lease_ms,
                reason: f.reason,
                issued_at: f.issued_at,
            },
            kid: f.kid,
            sig: f.sig,
        }
    }
}

/// [`Outcome::Accepted`].
#[derive(Deserialize)]
struct Accepted {
    seq: Seq,
}

impl From<Accepted> for Outcome {
    fn from(f: Accepted) -> Self {
        Outcome::Accepted { seq: f.seq }
    }
}

/// [`Outcome::Rejected`].
#[derive(Deserialize)]
struct Rejected {
    code: RejectCode,
    #[serde(default)]
    current: Option<SignedAssignment>,
    #[serde(default)]
    retry_after_ms: Option<u64>,
}

impl From<Rejected> for Outcome {
    fn from(f: Rejected) -> Self {
        Outcome::Rejected {
            code: f.code,
            current: f.current,
            retry_after_ms: f.retry_after_ms,
        }
    }
}

/// A fieldless enum, written as its name.
///
/// Read by [`deserialize_named`] rather than derived: the derive's `deserialize_enum` also takes
/// the externally tagged `{"name": null}`, which is not the protocol, and cost ~1.5 KB of wasm per
/// enum.
pub(super) trait Named: Copy + PartialEq + 'static {
    /// Every variant except the catch-all, in declaration order (the tests below check it).
    const ALL: &'static [Self];
    /// What a name not in `ALL` reads as (`#[serde(other)]`); `None`: it is an error.
    const OTHER: Option<Self>;
    /// The wire name, as `Serialize` writes it.
    fn name(self) -> &'static str;
}

pub(super) fn deserialize_named<'de, D: Deserializer<'de>, T: Named>(d: D) -> Result<T, D::Error> {
    d.deserialize_str(NamedVisitor(PhantomData))
}

struct NamedVisitor<T>(PhantomData<T>);

impl<'de, T: Named> Visitor<'de> for NamedVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a known name")
    }

    fn visit_str<E: de::Error>(self, name: &str) -> Result<T, E> {
        T::ALL
            .iter()
            .copied()
            .find(|v| v.name() == name)
            .or(T::OTHER)
            .ok_or_else(|| E::invalid_value(de::Unexpected::Str(name), &self))
    }
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

        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                deserialize_named(d)
            }
        }
    };
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

/// One pass over a frame's text.
fn read<'a, T: Deserialize<'a>>(text: &'a str) -> Result<T, serde_json::Error> {
    serde_json::from_str(text)
}

#[derive(Deserialize)]
struct Welcome {
    you: ParticipantId,
    session: SessionId,
    snapshot: Snapshot,
    #[serde(default)]
    missed: Vec<Item>,
    #[serde(default)]
    discontinuity: Option<Gap>,
}

#[derive(Deserialize)]
struct LeaseProbe {
    nonce: u64,
    epoch: Epoch,
}

#[derive(Deserialize)]
struct LeaseConfirm {
    nonce: u64,
    epoch: Epoch,
    remaining_ms: u64,
}

#[derive(Deserialize)]
struct Capability {
    role: Role,
    token: Token,
    #[serde(default)]
    epoch: Option<Epoch>,
    actions: Vec<Action>,
    expires_in_ms: u64,
}

#[derive(Deserialize)]
struct Presence {
    member: Member,
    online: bool,
}

/// A command result's own fields; its outcome's are read in a third pass.
#[derive(Deserialize)]
struct CommandResult {
    id: IdempotencyKey,
    outcome: TagOf<Outcome>,
}

#[derive(Deserialize)]
struct SignalFrom {
    from: ParticipantId,
    from_session: SessionId,
    data: Value,
}

#[derive(Deserialize)]
struct Error {
    code: ErrorCode,
    message: String,
}

/// Reads the server frame of type `t` from `text` (whose `v` and `t` the head pass has read).
/// `Ok(None)`: `t` is not a server frame type.
pub(super) fn server_msg(text: &str, t: &str) -> Result<Option<ServerMsg>, serde_json::Error> {
    Ok(Some(match t {
        "welcome" => {
            let f: Welcome = read(text)?;
            ServerMsg::Welcome {
                you: f.you,
                session: f.session,
                snapshot: f.snapshot,
                missed: f.missed,
                discontinuity: f.discontinuity,
            }
        }
        "assignment" => ServerMsg::Assignment(read(text)?),
        "event" => ServerMsg::Event(read(text)?),
        "lease_probe" => {
            let f: LeaseProbe = read(text)?;
            ServerMsg::LeaseProbe {
                nonce: f.nonce,
                epoch: f.epoch,
            }
        }
        "lease_confirm" => {
            let f: LeaseConfirm = read(text)?;
            ServerMsg::LeaseConfirm {
                nonce: f.nonce,
                epoch: f.epoch,
                remaining_ms: f.remaining_ms,
            }
        }
        "capability" => {
            let f: Capability = read(text)?;
            ServerMsg::Capability {
                role: f.role,
                token: f.token,
                epoch: f.epoch,
                actions: f.actions,
                expires_in_ms: f.expires_in_ms,
            }
        }
        "presence" => {
            let f: Presence = read(text)?;
            ServerMsg::Presence {
                member: f.member,
                online: f.online,
            }
        }
        "command_result" => {
            let f: CommandResult = read(text)?;
            let outcome = match f.outcome.0 {
                0 => read::<Accepted>(text)?.into(),
                _ => read::<Rejected>(text)?.into(),
            };
            ServerMsg::CommandResult { id: f.id, outcome }
        }
        "discontinuity" => ServerMsg::Discontinuity(read(text)?),
        "signal" => {
            let f: SignalFrom = read(text)?;
            ServerMsg::Signal {
                from: f.from,
                from_session: f.from_session,
                data: f.data,
            }
        }
        "error" => {
            let f: Error = read(text)?;
            ServerMsg::Error {
                code: f.code,
                message: f.message,
            }
        }
        _ => return Ok(None),
    }))
}

#[derive(Deserialize)]
struct Hello {
    token: Token,
    #[serde(default)]
    resume: Option<Seq>,
    #[serde(default)]
    epoch_seen: Option<Epoch>,
}

#[derive(Deserialize)]
struct Resume {
    cursor: Seq,
}

#[derive(Deserialize)]
struct LeaseEcho {
    nonce: u64,
}

/// No fields, but still a JSON object (the head pass takes `[1, "leave"]` too).
#[derive(Deserialize)]
struct Leave {}

#[derive(Deserialize)]
struct Command {
    id: IdempotencyKey,
    action: Action,
    #[serde(default)]
    payload: Value,
    #[serde(default)]
    epoch: Option<Epoch>,
    capability: Token,
}

#[derive(Deserialize)]
struct SignalTo {
    to: ParticipantId,
    #[serde(default)]
    to_session: Option<SessionId>,
    data: Value,
}

/// Reads the client frame of type `t` from `text` (whose `v` and `t` the head pass has read).
/// `Ok(None)`: `t` is not a client frame type.
pub(super) fn client_msg(text: &str, t: &str) -> Result<Option<ClientMsg>, serde_json::Error> {
    Ok(Some(match t {
        "hello" => {
            let f: Hello = read(text)?;
            ClientMsg::Hello {
                token: f.token,
                resume: f.resume,
                epoch_seen: f.epoch_seen,
            }
        }
        "resume" => ClientMsg::Resume {
            cursor: read::<Resume>(text)?.cursor,
        },
        "lease_echo" => ClientMsg::LeaseEcho {
            nonce: read::<LeaseEcho>(text)?.nonce,
        },
        "leave" => {
            read::<Leave>(text)?;
            ClientMsg::Leave
        }
        "command" => {
            let f: Command = read(text)?;
            ClientMsg::Command {
                id: f.id,
                action: f.action,
                payload: f.payload,
                epoch: f.epoch,
                capability: f.capability,
            }
        }
        "signal" => {
            let f: SignalTo = read(text)?;
            ClientMsg::Signal {
                to: f.to,
                to_session: f.to_session,
                data: f.data,
            }
        }
        _ => return Ok(None),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Serialize;

    /// `ALL` holds every variant but the catch-all, and each reads back from the name
    /// `Serialize` writes for it.
    /// `discriminants`: of every variant, in declaration order.
    fn check_named<T>(discriminants: &[usize])
    where
        T: Named + Serialize + serde::de::DeserializeOwned + PartialEq + fmt::Debug,
    {
        for (i, d) in discriminants.iter().enumerate() {
            assert_eq!(*d, i, "variant {i} is not listed in order");
        }
        for v in T::ALL {
            let json = serde_json::to_string(v).unwrap();
            assert_eq!(json, format!("\"{}\"", v.name()));
            assert_eq!(serde_json::from_str::<T>(&json).unwrap(), *v);
        }
        assert_eq!(
            discriminants.len(),
            T::ALL.len() + usize::from(T::OTHER.is_some())
        );
        if let Some(other) = T::OTHER {
            let json = serde_json::to_string(&other).unwrap();
            assert_eq!(serde_json::from_str::<T>(&json).unwrap(), other);
            assert_eq!(
                serde_json::from_str::<T>("\"from_the_future\"").unwrap(),
                other
            );
        } else {
            assert!(serde_json::from_str::<T>("\"from_the_future\"").is_err());
        }
        // Only a name: not the externally tagged form the derive also took, nor a number.
        let first = T::ALL[0].name();
        assert!(serde_json::from_str::<T>(&format!("{{\"{first}\":null}}")).is_err());
        assert!(serde_json::from_str::<T>("0").is_err());
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
    }
}
