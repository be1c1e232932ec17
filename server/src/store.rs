//! Durable storage behind the [`Store`] trait; [`SqliteStore`] is the embedded implementation.
//!
//! Every decision (grant, renewal, command) runs inside a `BEGIN IMMEDIATE` transaction whose
//! checks and effects, including the outbox row, commit together; commands and renewals queued
//! at the same time share one transaction (group commit, each in its own savepoint). Time-based
//! decisions use the store's clock inside the SQL ([`NOW`]), never the caller's.

use futures_util::TryStreamExt;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use hostlease::protocol::codec::{decode_body, encode_body};
use hostlease::protocol::json::FromJson;
use hostlease::protocol::{
    Action, ActionKind, Assignment, DecodeError, Epoch, IdempotencyKey, InboxEntry, InboxPage,
    Item, Json, Outcome, ParticipantId, Reason, RejectCode, Role, RoomEvent, RoomId, Seq,
    ServerTime, SessionId, SignedAssignment,
};
use sha2::{Digest, Sha256};
use sqlx::sqlite::{
    Sqlite, SqliteArguments, SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions,
    SqliteSynchronous,
};
use sqlx::{Row, SqliteConnection, SqlitePool};

use tokio::sync::{mpsc, oneshot};

use crate::clock::{StoreClock, SystemClock};
use crate::tokens::{CapClaims, Keypair};

/// The store clock in SQL: ms since the Unix epoch ([`crate::clock`]). A function every
/// connection of a [`SqliteStore`] has; SQLite's `julianday('now')` is the wall clock, which steps.
pub const NOW: &str = "hl_now()";

/// How long idempotency records are kept (the protocol's, which the SDK's resends stay within).
pub const IDEMPOTENCY_RETENTION_MS: i64 =
    hostlease::protocol::codec::IDEMPOTENCY_RETENTION_MS as i64;
/// How long an offline inbox entry is kept.
pub const INBOX_RETENTION_MS: i64 = 7 * 24 * 3600 * 1000;
/// A participant not seen (joined) for this long gets no more inbox entries, until it joins.
pub const PARTICIPANT_RETENTION_MS: i64 = 30 * 24 * 3600 * 1000;
/// A known participant's `seen_at` is written again on a join only once it is this old, so that
/// the rejoins of a reconnect storm write nothing (no fsync).
const SEEN_REFRESH_MS: i64 = 24 * 3600 * 1000;
/// Rows deleted per statement by housekeeping's retention.
const PRUNE_BATCH: u64 = 1000;

/// How long a kick is kept: it revokes the capabilities minted before it, which live up to
/// [`crate::MAX_CAPABILITY_MS`]; an hour more for clocks and a process's late sweep.
pub const KICK_RETENTION_MS: i64 = crate::MAX_CAPABILITY_MS as i64 + 3_600_000;

/// A webhook delivery is retried (backoff capped at 5 min) for this long after its commit: a
/// receiver down for a deploy or a partition misses nothing. Given up after, counted in
/// `hostlease_webhook_given_up_total` with a WARN line.
pub const WEBHOOK_RETENTION_MS: i64 = 24 * 3600 * 1000;

/// An outbox row claimed for webhook delivery ([`Store::webhook_due`]).
#[derive(Debug, Clone)]
pub struct Delivery {
    pub id: i64,
    /// `kind:dedup_key`: the delivery's `Idempotency-Key`.
    pub key: String,
    /// The item's JSON: the body.
    pub body: String,
    /// Attempts recorded before this one.
    pub attempts: i64,
    /// The claim's end (store clock, ms): the row's `webhook_next_at` while it is this claim's.
    pub claim: i64,
}

pub type StoreResult<T> = Result<T, StoreError>;

/// A decision already queued with the store, resolving to its answer.
pub type Pending<T> = Pin<Box<dyn Future<Output = StoreResult<T>> + Send + 'static>>;

#[derive(Debug)]
pub struct StoreError(pub String);

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "store error: {}", self.0)
    }
}
impl std::error::Error for StoreError {}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        StoreError(e.to_string())
    }
}
impl From<sqlx::migrate::MigrateError> for StoreError {
    fn from(e: sqlx::migrate::MigrateError) -> Self {
        StoreError(e.to_string())
    }
}

/// One room's durable record.
#[derive(Debug, Clone)]
pub struct RoomRow {
    pub room: RoomId,
    pub host: Option<ParticipantId>,
    pub session: Option<SessionId>,
    pub epoch: Epoch,
    pub seq: Seq,
    pub lease_expires: u64,
    /// Until when (store clock) a forced grant's holder is not confirmed: the lease it took away
    /// runs until then. 0: no fence.
    pub fenced_until: u64,
    pub current: Option<SignedAssignment>,
    pub closed: bool,
    /// The store clock when the row was read.
    pub now: u64,
}

impl RoomRow {
    pub fn lease_live(&self) -> bool {
        self.host.is_some() && self.lease_expires > self.now
    }

    /// The holder's lease is live and it may act on it: not fenced.
    pub fn lease_held(&self) -> bool {
        self.lease_live() && self.fenced_until <= self.now
    }
}

/// What a lease renewal did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewed {
    /// Renewed: the new expiry on the store clock and the TTL used.
    Until { expires: u64, lease_ms: u64 },
    /// Not renewed yet: the grant was forced, and the lease it took away runs this many ms more.
    Fenced { ms: u64 },
}

/// A request to commit a new assignment by compare-and-swap on `expected_epoch`.
#[derive(Debug, Clone)]
pub struct GrantReq {
    pub room: RoomId,
    pub expected_epoch: Epoch,
    pub holder: Option<(ParticipantId, SessionId)>,
    pub lease_ms: u64,
    pub reason: Reason,
    /// Only if the current lease has lapsed on the store clock (or the room is hostless).
    pub require_lapsed: bool,
    /// Also mark the room closed.
    pub close: bool,
}

impl GrantReq {
    /// An admin's reassign or a kick: it takes the role from a holder whose lease may still run
    /// and who may not know yet, so no holder is confirmed until that lease has run out: the new
    /// one, or (a grant to nobody) whoever is granted next.
    pub fn forced(&self) -> bool {
        matches!(self.reason, Reason::Admin | Reason::Kicked)
    }
}

#[derive(Debug, Clone)]
pub enum GrantOutcome {
    Won {
        assignment: SignedAssignment,
    },
    /// Zero rows changed: someone else committed first (or the lease is still live).
    Lost(Box<RoomRow>),
}

/// The participants connected to a process, each with the items its sessions there got live:
/// those with `since < seq <= upto` (`since`: the earliest subscription point of its sessions;
/// `upto`: the last seq published there when it was read). The offline inbox gets every other.
pub type Online = std::collections::HashMap<(RoomId, ParticipantId), (Seq, Seq)>;

/// A command, with a capability whose signature the caller has verified.
#[derive(Debug, Clone)]
pub struct CommandReq {
    pub room: RoomId,
    pub sender: ParticipantId,
    /// The sender's connection (WebSocket), or `None` for HTTP (the token's `sid` is used).
    pub sender_session: Option<SessionId>,
    pub claims: CapClaims,
    pub kind: ActionKind,
    pub action: Action,
    pub payload: Json,
    pub epoch: Option<Epoch>,
    pub key: IdempotencyKey,
    /// For `host.resign` / `host.transfer`: the next holder (chosen by the caller's election).
    pub next_holder: Option<Option<(ParticipantId, SessionId)>>,
    /// A refusal the caller decided (a transfer target that is not present); it stands unless
    /// the idempotency key replays an earlier outcome.
    pub refuse: Option<RejectCode>,
    pub lease_ms: u64,
    /// For a WebSocket command: the order of its connection's commands (`None` over HTTP).
    pub order: Option<Order>,
}

/// How a connection's pipelined commands keep their order across refusals: a command sent
/// `after` one that stands refused (or held itself) is held — refused `unavailable`, retryable,
/// without being looked at ([`held`]) — until that one is decided again, so that no command is
/// applied before one its sender made earlier and will send again. Any refusal counts, not only
/// those with a retry time: an attempt refused for good (its token expired) may have a resend
/// already on the wire with a fresh token. A store decides its connection's commands in the
/// order they were queued (the group committer's order), which is the order they arrived in.
#[derive(Debug, Clone)]
pub struct Order {
    /// The command of its kind the client sent this one behind, unanswered when it went.
    pub after: Option<IdempotencyKey>,
    pub held: Arc<Held>,
}

/// A connection's commands refused or held, and not decided since (a resend that is decided
/// takes its key out): at most [`Held::MAX`], the oldest forgotten.
#[derive(Debug, Default)]
pub struct Held(std::sync::Mutex<HeldKeys>);

#[derive(Debug, Default)]
struct HeldKeys {
    keys: std::collections::HashSet<IdempotencyKey>,
    /// The same keys, oldest first.
    order: std::collections::VecDeque<IdempotencyKey>,
}

impl Held {
    /// Far past what the SDK has pending at once (`command_limit`, 256).
    pub const MAX: usize = 1024;

    pub fn refused(&self, key: &IdempotencyKey) {
        let mut h = self.0.lock().expect("held lock");
        if h.keys.insert(key.clone()) {
            if h.order.len() >= Self::MAX {
                if let Some(old) = h.order.pop_front() {
                    h.keys.remove(&old);
                }
            }
            h.order.push_back(key.clone());
        }
    }

    /// Whether a command sent after `after` is held; `key` is the command's own, which is out
    /// of the set once decided.
    fn decide(&self, after: Option<&IdempotencyKey>, key: &IdempotencyKey) -> bool {
        let mut h = self.0.lock().expect("held lock");
        if after.is_some_and(|a| h.keys.contains(a)) {
            drop(h);
            self.refused(key);
            return true;
        }
        if h.keys.remove(key) {
            h.order.retain(|k| k != key);
        }
        false
    }
}

impl Order {
    /// The command with `key` in its connection's held set.
    pub fn of(&self, key: &IdempotencyKey) -> HeldKey {
        HeldKey(self.held.clone(), key.clone())
    }
}

/// A command's key in its connection's [`Held`].
#[derive(Debug, Clone)]
pub struct HeldKey(Arc<Held>, IdempotencyKey);

impl HeldKey {
    /// It was refused (or not decided): those sent after it are held until it is decided again.
    pub fn refused(&self) {
        self.0.refused(&self.1);
    }
}

impl CommandReq {
    fn held_key(&self) -> Option<HeldKey> {
        self.order.as_ref().map(|o| o.of(&self.key))
    }
}

/// The answer to a held command: refused `unavailable`, to be sent again once the one it was
/// sent after is.
pub fn held() -> Outcome {
    Outcome::Rejected {
        code: RejectCode::Unavailable,
        current: None,
        retry_after_ms: Some(0),
    }
}

fn not_accepted(r: &StoreResult<(CommandDone, bool)>) -> bool {
    !matches!(
        r,
        Ok((
            CommandDone {
                outcome: Outcome::Accepted { .. },
                ..
            },
            _
        ))
    )
}

#[derive(Debug, Clone)]
pub struct CommandDone {
    pub outcome: Outcome,
    /// The assignment committed by a resign/transfer, if any.
    pub assignment: Option<SignedAssignment>,
    /// Whether this was a replay of an earlier accepted request.
    pub replayed: bool,
}

/// A value stored as JSON by [`encode_body`] (items, assignments, outcomes).
fn stored<T: FromJson>(text: &str) -> Result<T, DecodeError> {
    decode_body(text, usize::MAX)
}

/// The hash of a request stored with its idempotency key: SHA-256 over
/// `action \n canonical-JSON(payload)`, identical for WebSocket and HTTP (see `canonical`).
pub fn request_hash(action: &Action, payload: &Json) -> String {
    let mut h = Sha256::new();
    h.update(action.as_str().as_bytes());
    h.update(b"\n");
    let mut text = String::with_capacity(payload.as_str().len());
    canonical(payload.as_str(), &mut text);
    h.update(text.as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes one JSON value (already checked) in canonical form: no whitespace, object keys sorted
/// (of a repeated key, the last counts), strings escaped as serde_json escapes them — as the
/// `serde_json::Value` this used to go through wrote them — and numbers as their own text:
/// through `Value` they became `f64`s, so that two different numbers past 2^53 (or two long
/// decimals) hashed the same, and the second request was answered as a repeat of the first.
/// Hashes stored before stay valid for payloads whose numbers are integers within `u64`/`i64`
/// or decimals in their shortest form (what `JSON.stringify` writes); a retry across the
/// upgrade of one spelt otherwise (`1e2`, `1.50`) is answered `idempotency_conflict`.
fn canonical(text: &str, out: &mut String) {
    use hostlease::protocol::json::Reader;
    let string = |s: &str, out: &mut String| {
        out.push_str(&serde_json::Value::from(s).to_string());
    };
    let mut r = Reader::new(text);
    match text.as_bytes().first() {
        Some(b'{') => {
            let mut entries = std::collections::BTreeMap::new();
            let _ = r.object(|r, k| {
                entries.insert(k.to_string(), r.skip()?);
                Ok(())
            });
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                string(&k, out);
                out.push(':');
                canonical(v, out);
            }
            out.push('}');
        }
        Some(b'[') => {
            out.push('[');
            let mut first = true;
            let _ = r.array(|r| {
                if !std::mem::take(&mut first) {
                    out.push(',');
                }
                canonical(r.skip()?, out);
                Ok(())
            });
            out.push(']');
        }
        Some(b'"') => match r.str() {
            Ok(s) => string(&s, out),
            Err(_) => out.push_str(text),
        },
        _ => out.push_str(text),
    }
}

#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// The store clock ([`NOW`]), read by the store.
    async fn now_ms(&self) -> StoreResult<u64>;
    /// The store clock, read here: the clock of [`NOW`] (its SQL), which capabilities' `exp` and
    /// `sat` are on.
    fn clock_ms(&self) -> u64;
    /// The store clock minus the wall clock, ms: the wall clock's steps since the store clock's
    /// anchor (`hostlease_store_clock_skew_seconds`).
    fn clock_skew_ms(&self) -> i64;
    async fn room(&self, room: &RoomId) -> StoreResult<Option<RoomRow>>;
    async fn grant(&self, req: GrantReq, signer: &Keypair) -> StoreResult<GrantOutcome>;
    /// Renews a live lease by the room's TTL (`lease_ms` unless the room overrides it); `None`
    /// if the lease was not live, `Fenced` (nothing renewed) while a forced grant's fence holds.
    async fn renew(
        &self,
        room: &RoomId,
        epoch: Epoch,
        host: &ParticipantId,
        session: &SessionId,
        lease_ms: u64,
    ) -> StoreResult<Option<Renewed>>;
    /// Closes a room that is already hostless at `epoch` without a grant (hostless → hostless
    /// does not move the epoch). `false`: the row changed meanwhile.
    async fn close_hostless(&self, room: &RoomId, epoch: Epoch) -> StoreResult<bool>;
    /// Sets (or clears) the room's TTL override; applies from the next grant or renewal.
    async fn set_ttl(&self, room: &RoomId, ttl_ms: Option<u64>) -> StoreResult<()>;
    /// Queues a command when called (commands queued one after another are decided in that
    /// order) and resolves once it is decided and, if it took effect, durable.
    fn command(&self, req: CommandReq, signer: &Keypair) -> Pending<CommandDone>;
    /// Items with `after < seq <= upto`, oldest first: the newest, at most `limit` of them and
    /// at most `max_bytes` of their JSON (rows past the budget are not read); and the lowest
    /// retained seq of the room.
    async fn log_range(
        &self,
        room: &RoomId,
        after: Seq,
        upto: Seq,
        limit: usize,
        max_bytes: usize,
    ) -> StoreResult<(Vec<Item>, Option<Seq>)>;
    /// Outbox rows with id > `after`: `(id, room, item)`.
    async fn outbox_after(&self, after: i64, limit: i64) -> StoreResult<Vec<(i64, RoomId, Item)>>;
    async fn outbox_max_id(&self) -> StoreResult<i64>;
    /// Up to `limit` outbox rows not yet written to the offline inboxes: `(id, room, seq, item
    /// JSON)`.
    async fn unnotified(&self, limit: i64) -> StoreResult<Vec<(i64, RoomId, Seq, String)>>;
    /// Writes `rows` (from [`Store::unnotified`]) into the inbox of every participant of their
    /// room who did not get them live (see [`Online`]), and marks them notified, a few rows per
    /// transaction (rows another process claimed meanwhile are skipped). Returns the number
    /// written.
    async fn notify(
        &self,
        rows: &[(i64, RoomId, Seq, String)],
        online: &Online,
    ) -> StoreResult<usize>;
    /// Copies into the inbox of each [`Lost`] session's participant its room's items
    /// `(after, upto]` from the log, in seq order: the newest [`RECOVER_MAX`] of them and at most
    /// [`RECOVER_BYTES`] of their JSON (one at least). An item several of them lost is stored
    /// once, and the rows are written in transactions sized as [`Store::notify`]'s. Returns the
    /// number of inbox entries written.
    async fn recover_inbox(&self, lost: &[Lost]) -> StoreResult<usize>;
    /// Claims up to `limit` outbox rows due for webhook delivery (for `claim_ms`, so that another
    /// process does not send them meanwhile), oldest first.
    async fn webhook_due(&self, limit: i64, claim_ms: u64) -> StoreResult<Vec<Delivery>>;
    /// Records a delivery attempt of `d`: done, or retry after `retry_ms`. A failure is recorded
    /// only while `d`'s claim is the row's: recorded after the claim ran out (the writer was
    /// slow), it cut short the claim of the process sending the row now, and a third process
    /// sent it too.
    async fn webhook_result(&self, d: &Delivery, delivered: bool, retry_ms: u64)
        -> StoreResult<()>;
    /// Records that `p` was in `room` now (for its offline inbox). Past the queue's bound the
    /// sighting is left out and counted (`hostlease_participants_not_recorded_total`), not an error.
    async fn remember_participant(&self, room: &RoomId, p: &ParticipantId) -> StoreResult<()>;
    /// A page of `p`'s inbox after the cursor `since`, oldest first: at most `limit` entries and
    /// `max_bytes` of their stored JSON (one entry at least), and the cursor to read on from
    /// when more is left. An entry whose stored item no longer decodes is passed over (its
    /// cursor still counts), never the end of the reading.
    async fn inbox(
        &self,
        room: &RoomId,
        p: &ParticipantId,
        since: u64,
        limit: i64,
        max_bytes: usize,
    ) -> StoreResult<InboxPage>;
    /// Of `rooms` (the rooms this process has hubs for), those open with a host whose lease has
    /// lapsed on the store clock, and those closed (by any process) with their `seq`. Only rooms
    /// named are looked at, so rooms nobody here serves (abandoned ones, or another process's)
    /// cannot crowd out the ones that are.
    async fn lapsed_rooms(&self, rooms: &[RoomId]) -> StoreResult<Swept>;
    /// Records an admin kick (every process applies it to the sessions it holds); returns its id.
    async fn record_kick(&self, room: &RoomId, p: &ParticipantId) -> StoreResult<i64>;
    /// Kicks with an id above `after`, oldest first, at most `limit`: `(id, room, participant,
    /// when)`, when in ms on the store clock.
    async fn kicks_after(&self, after: i64, limit: i64) -> StoreResult<Vec<Kick>>;
    /// The newest kick's id (0: none).
    async fn kicks_max_id(&self) -> StoreResult<i64>;
    /// Deletes idempotency records older than the retention, kicks older than
    /// [`KICK_RETENTION_MS`], and trims each room's log to its newest `keep` items; outbox rows
    /// go after an hour once notified, but with `webhook` only once delivered too, or given up
    /// after 24 h.
    async fn housekeeping(&self, keep_log: i64, webhook: bool) -> StoreResult<()>;
}

/// A kick as [`Store::kicks_after`] reads it: `(id, room, participant, when)`.
pub type Kick = (i64, RoomId, ParticipantId, u64);

/// A room's lease TTL (binds: the server's default): its own, if set, never under the floor
/// ([`crate::LEASE_MS`]; one set through the admin API when the floor was 30 ms stays in the
/// row).
const TTL: &str = "MAX(COALESCE(ttl_ms, ?), 1000)";
const _: () = assert!(*crate::LEASE_MS.start() == 1000);

/// A session that ended without a close (neither side's): the notifier counted the items
/// published while it was listed as got live, and those after the last its client confirmed
/// (`after`) up to its end (`upto`) may never have reached it.
#[derive(Debug, Clone)]
pub struct Lost {
    pub room: RoomId,
    pub participant: ParticipantId,
    pub after: Seq,
    pub upto: Seq,
}

/// Items [`Store::recover_inbox`] copies for one session, at most (the newest).
pub const RECOVER_MAX: u64 = 1024;
/// Bytes of items [`Store::recover_inbox`] copies for one session, at most (one item at least).
pub const RECOVER_BYTES: i64 = 4 * 1024 * 1024;

/// Outbox rows written to the offline inboxes per transaction, at most.
const NOTIFY_CHUNK: usize = 16;
/// Inbox rows written per transaction, about: a transaction holds the one writer every process
/// commits through, and a room's participants away can be thousands (everyone seen in 30 days),
/// so that 16 outbox rows could be half a million indexed inserts, seconds in which no lease was
/// renewed anywhere. A row is never split: one with more participants away is a transaction of
/// its own.
const NOTIFY_INSERTS: usize = 2048;

/// How [`Store::notify`] groups rows whose inbox entries number `fanout` into transactions: the
/// index ranges, in order, each at most [`NOTIFY_CHUNK`] rows and [`NOTIFY_INSERTS`] entries
/// (but a row past it alone).
pub fn notify_chunks(fanout: &[usize]) -> Vec<std::ops::Range<usize>> {
    let mut chunks = Vec::new();
    let (mut start, mut entries) = (0, 0);
    for (i, &n) in fanout.iter().enumerate() {
        if i > start && (i - start == NOTIFY_CHUNK || entries + n > NOTIFY_INSERTS) {
            chunks.push(start..i);
            (start, entries) = (i, 0);
        }
        entries += n;
    }
    if start < fanout.len() {
        chunks.push(start..fanout.len());
    }
    chunks
}

/// What [`Store::lapsed_rooms`] found.
#[derive(Debug, Default)]
pub struct Swept {
    /// Open rooms whose host's lease has lapsed.
    pub lapsed: Vec<RoomId>,
    /// Closed rooms, with the seq their log ended at (the closing assignment's, if any).
    pub closed: Vec<(RoomId, Seq)>,
}

/// Rooms looked up per query by [`Store::lapsed_rooms`].
const LAPSED_CHUNK: usize = 500;

/// The outbox rows due for a webhook delivery (binds: the retention, the limit), in the index's
/// order: ordered by id alone, SQLite gathered and sorted every due row, in the write
/// transaction, every poll (millions while a receiver was down for hours).
fn webhook_due_rows() -> String {
    format!(
        "SELECT id FROM outbox INDEXED BY outbox_webhook_due \
         WHERE webhook_done_at IS NULL AND webhook_next_at <= {NOW} \
         AND created_at >= {NOW} - ? ORDER BY webhook_next_at, id LIMIT ?"
    )
}

pub struct SqliteStore {
    /// Readers (WAL: they never wait for the writer).
    pool: SqlitePool,
    /// The one connection every write of this process goes through. Writers queue for it in
    /// order instead of racing for SQLite's write lock, whose busy handler sleeps and retries
    /// (up to 100 ms a try) and so let a lease renewal lose to a stream of joins and commands
    /// until the lease lapsed under load. Other processes on the file still meet the busy handler.
    writer: SqlitePool,
    /// Commands, renewals and participant records, committed in groups through `writer`.
    group: GroupCommit,
    /// Housekeeping deletes inbox entries older than this ([`INBOX_RETENTION_MS`]) ...
    pub inbox_retention_ms: i64,
    /// ... and forgets participants not seen for this long ([`PARTICIPANT_RETENTION_MS`]).
    pub participant_retention_ms: i64,
    /// The clock `hl_now()` reads on this store's connections.
    clock: Arc<StoreClock>,
    /// Commands and participant sightings queued for the group committer at most
    /// ([`MAX_QUEUED_COMMANDS`]).
    pub max_queued_commands: usize,
}

fn parse_id<T: TryFrom<String>>(s: Option<String>) -> Option<T> {
    s.and_then(|s| T::try_from(s).ok())
}

fn room_from_row(room: &RoomId, r: &sqlx::sqlite::SqliteRow) -> RoomRow {
    RoomRow {
        room: room.clone(),
        host: parse_id(r.get("host")),
        session: parse_id(r.get("session")),
        epoch: Epoch(r.get::<i64, _>("epoch") as u64),
        seq: Seq(r.get::<i64, _>("seq") as u64),
        lease_expires: r.get::<i64, _>("lease_expires") as u64,
        fenced_until: r.get::<i64, _>("fenced_until") as u64,
        current: r
            .get::<Option<String>, _>("current")
            .and_then(|s| stored(&s).ok()),
        closed: r.get::<i64, _>("closed") != 0,
        now: r.get::<i64, _>("now") as u64,
    }
}

async fn read_room(c: &mut SqliteConnection, room: &RoomId) -> StoreResult<Option<RoomRow>> {
    let q = format!(
        "SELECT host, session, epoch, seq, lease_expires, fenced_until, current, closed, {NOW} AS now \
         FROM rooms WHERE room = ?"
    );
    let r = sqlx::query(&q)
        .bind(room.as_str())
        .fetch_optional(&mut *c)
        .await?;
    Ok(r.map(|r| room_from_row(room, &r)))
}

async fn store_now(c: &mut SqliteConnection) -> StoreResult<u64> {
    let q = format!("SELECT {NOW}");
    let v: i64 = sqlx::query_scalar(&q).fetch_one(&mut *c).await?;
    Ok(v as u64)
}

/// Appends an item to the log and the outbox in the caller's transaction.
async fn append(
    c: &mut SqliteConnection,
    room: &RoomId,
    seq: Seq,
    dedup_key: &str,
    item: &Item,
    now: u64,
) -> StoreResult<()> {
    let json = encode_body(item);
    sqlx::query("INSERT INTO log (room, seq, item) VALUES (?, ?, ?)")
        .bind(room.as_str())
        .bind(seq.0 as i64)
        .bind(&json)
        .execute(&mut *c)
        .await?;
    sqlx::query(
        "INSERT INTO outbox (kind, dedup_key, room, seq, item, created_at) VALUES (?, ?, ?, ?, ?, ?)",
    )
    .bind(match item {
        Item::Assignment(_) => "assignment",
        Item::Event(_) => "event",
    })
    .bind(dedup_key)
    .bind(room.as_str())
    .bind(seq.0 as i64)
    .bind(&json)
    .bind(now as i64)
    .execute(&mut *c)
    .await?;
    Ok(())
}

/// The CAS grant inside an open transaction. `fenced`: the holder it replaces may not know (see
/// [`GrantReq::forced`]).
async fn grant_in_tx(
    c: &mut SqliteConnection,
    req: &GrantReq,
    fenced: bool,
    signer: &Keypair,
) -> StoreResult<GrantOutcome> {
    sqlx::query("INSERT OR IGNORE INTO rooms (room) VALUES (?)")
        .bind(req.room.as_str())
        .execute(&mut *c)
        .await?;
    let lapsed = if req.require_lapsed {
        format!(" AND (host IS NULL OR lease_expires <= {NOW})")
    } else {
        String::new()
    };
    // The fence this grant leaves: a forced grant's holder (or whoever is granted next) is not
    // confirmed before the lease it took away has run out, and no later grant lifts that (a
    // successor who leaves at once is replaced by someone fenced the same). A renewal confirms
    // nothing before; the new lease runs from the fence, so that it does not lapse meanwhile.
    // SET expressions read the old row.
    // (A holder still fenced was never confirmed: its lease adds nothing to the fence.)
    let fence = if fenced {
        format!(
            "MAX(fenced_until, CASE WHEN host IS NOT NULL AND fenced_until <= {NOW} \
             THEN lease_expires ELSE 0 END)"
        )
    } else {
        "fenced_until".to_string()
    };
    let q = format!(
        "UPDATE rooms SET host = ?, session = ?, epoch = epoch + 1, seq = seq + 1, \
         lease_expires = CASE WHEN ? IS NULL THEN 0 ELSE MAX({NOW}, {fence}) + {TTL} END, \
         fenced_until = {fence}, \
         lease_ms = {TTL}, closed = closed OR ? \
         WHERE room = ? AND epoch = ? AND (closed = 0 OR ?){lapsed} \
         RETURNING epoch, seq, lease_ms, {NOW} AS now"
    );
    let (host, session) = match &req.holder {
        Some((h, s)) => (Some(h.as_str()), Some(s.as_str())),
        None => (None, None),
    };
    let row = sqlx::query(&q)
        .bind(host)
        .bind(session)
        .bind(host)
        .bind(req.lease_ms as i64)
        .bind(req.lease_ms as i64)
        .bind(req.close)
        .bind(req.room.as_str())
        .bind(req.expected_epoch.0 as i64)
        // A closed room is never granted again (only a close may commit on a closed row).
        .bind(req.close)
        .fetch_optional(&mut *c)
        .await?;
    let Some(row) = row else {
        let cur = read_room(c, &req.room)
            .await?
            .ok_or_else(|| StoreError("room vanished".into()))?;
        return Ok(GrantOutcome::Lost(Box::new(cur)));
    };
    let epoch = Epoch(row.get::<i64, _>("epoch") as u64);
    let seq = Seq(row.get::<i64, _>("seq") as u64);
    let lease_ms = row.get::<i64, _>("lease_ms") as u64;
    let now = row.get::<i64, _>("now") as u64;
    let a = Assignment {
        room: req.room.clone(),
        host: req.holder.as_ref().map(|h| h.0.clone()),
        session: req.holder.as_ref().map(|h| h.1.clone()),
        epoch,
        seq,
        lease_ms: if req.holder.is_some() { lease_ms } else { 0 },
        reason: req.reason,
        issued_at: ServerTime(now),
    };
    let signed = signer.sign_assignment(a);
    let json = encode_body(&signed);
    sqlx::query("UPDATE rooms SET current = ? WHERE room = ?")
        .bind(&json)
        .bind(req.room.as_str())
        .execute(&mut *c)
        .await?;
    let dedup = format!("{}:{}", req.room, epoch.0);
    append(
        c,
        &req.room,
        seq,
        &dedup,
        &Item::Assignment(signed.clone()),
        now,
    )
    .await?;
    Ok(GrantOutcome::Won { assignment: signed })
}

/// A command's checks and effect inside the caller's open transaction. The flag says whether
/// the effect is to be kept (`false`: a rejection or a replay, nothing to commit).
async fn command_in_tx(
    tx: &mut SqliteConnection,
    req: &CommandReq,
    signer: &Keypair,
) -> StoreResult<(CommandDone, bool)> {
    let now = store_now(tx).await?;
    // A room that never had a host still takes participant commands.
    sqlx::query("INSERT OR IGNORE INTO rooms (room) VALUES (?)")
        .bind(req.room.as_str())
        .execute(&mut *tx)
        .await?;
    let row = read_room(tx, &req.room).await?;
    let c = &req.claims;
    // A kick revokes every capability of the participant's sessions begun before it: they are
    // closed, but a participant capability kept working over HTTP until it expired, and a
    // session on another process than the kick's sent commands until that process's next sweep
    // closed it (an index look-up; the table holds a day and an hour of kicks).
    let kicked: Option<i64> = sqlx::query_scalar(
        "SELECT 1 FROM kicks WHERE room = ? AND participant = ? AND created_at >= ? LIMIT 1",
    )
    .bind(req.room.as_str())
    .bind(c.sub.as_str())
    .bind(i64::try_from(c.sat).unwrap_or(i64::MAX))
    .fetch_optional(&mut *tx)
    .await?;
    // A refusal tells who hosts now only to a session of the room, or to a capability that
    // still works: a signature stays valid after its token expires and after a kick, and the
    // holder of an old one (a member long gone, one kicked) could otherwise ask over HTTP who
    // hosts, forever. A session is told at its welcome anyway; its `stale_epoch` still comes.
    let current = row
        .as_ref()
        .and_then(|r| r.current.clone())
        .filter(|_| kicked.is_none() && (req.sender_session.is_some() || c.exp > now));
    let reject = |code: RejectCode| CommandDone {
        outcome: Outcome::Rejected {
            code,
            current: current.clone(),
            retry_after_ms: None,
        },
        assignment: None,
        replayed: false,
    };
    let hash = request_hash(&req.action, &req.payload);
    // Signature and kid were checked by the caller; everything else is checked here,
    // against the row this transaction holds.
    if c.room != req.room || c.sub != req.sender {
        return Ok((reject(RejectCode::BadCapability), false));
    }
    // A host token (genuine, for this room and sender) of an epoch the room has left is stale
    // before anything else is wrong with it: the old host, reconnected as another session after
    // a failover, holds one past its expiry, and `stale_epoch` (with the current assignment)
    // tells its SDK to reload, where `bad_capability` told it nothing.
    let stale_host_token = req.kind == ActionKind::Host
        && c.role == Role::Host
        && matches!((c.epoch, &row), (Some(e), Some(r)) if e < r.epoch);
    let refused_token = if stale_host_token {
        RejectCode::StaleEpoch
    } else {
        RejectCode::BadCapability
    };
    // Idempotency: scoped to (room, sub), shared by both transports; looked up before anything
    // else can refuse, so a retry gets its first outcome again.
    let prior: Option<(String, String)> = sqlx::query_as(
        "SELECT request_hash, outcome FROM idempotency WHERE room = ? AND sub = ? AND key = ?",
    )
    .bind(req.room.as_str())
    .bind(c.sub.as_str())
    .bind(req.key.as_str())
    .fetch_optional(&mut *tx)
    .await?;
    if let Some((h, outcome)) = prior {
        if h != hash {
            return Ok((reject(RejectCode::IdempotencyConflict), false));
        }
        let outcome: Outcome = stored(&outcome).map_err(|e| StoreError(e.to_string()))?;
        return Ok((
            CommandDone {
                outcome,
                assignment: None,
                replayed: true,
            },
            false,
        ));
    }
    // A token of another session of the same participant: a retry on a new connection with the
    // old one's token gets its first outcome above, as over HTTP (which has no session), and
    // nothing new.
    if let Some(s) = &req.sender_session {
        if s != &c.sid {
            return Ok((reject(refused_token), false));
        }
    }
    let Some(row) = row else {
        return Ok((
            reject(match req.kind {
                ActionKind::Host => RejectCode::NotHost,
                ActionKind::Participant => RejectCode::BadRequest,
            }),
            false,
        ));
    };
    if c.exp <= now {
        return Ok((reject(refused_token), false));
    }
    if kicked.is_some() {
        return Ok((reject(RejectCode::BadCapability), false));
    }
    if !c.actions.contains(&req.action) {
        return Ok((reject(RejectCode::ActionNotGranted), false));
    }
    if row.closed {
        return Ok((reject(RejectCode::BadRequest), false));
    }
    if req.kind == ActionKind::Host {
        if c.role != Role::Host {
            return Ok((reject(RejectCode::BadCapability), false));
        }
        if c.epoch != Some(row.epoch) || req.epoch.is_some_and(|e| e != row.epoch) {
            return Ok((reject(RejectCode::StaleEpoch), false));
        }
        if row.host.as_ref() != Some(&c.sub) || row.session.as_ref() != Some(&c.sid) {
            return Ok((reject(RejectCode::NotHost), false));
        }
        // Fenced: the lease a forced grant took away may still run (no capability is issued
        // for a fenced holder; this holds whatever issues one).
        if now >= row.lease_expires || now < row.fenced_until {
            return Ok((reject(RejectCode::LeaseExpired), false));
        }
    }
    // A refusal the caller decided (a transfer to no one present) stands only for a sender who
    // may act: a stale host is told `stale_epoch` (and resyncs), not `bad_request`.
    if let Some(code) = req.refuse {
        return Ok((reject(code), false));
    }
    // The effect: a room event on the room's seq, then (resign/transfer) the grant.
    let seq = row.seq.next();
    sqlx::query("UPDATE rooms SET seq = ? WHERE room = ? AND epoch = ?")
        .bind(seq.0 as i64)
        .bind(req.room.as_str())
        .bind(row.epoch.0 as i64)
        .execute(&mut *tx)
        .await?;
    let event = RoomEvent {
        seq,
        epoch: row.epoch,
        actor: c.sub.clone(),
        action: req.action.clone(),
        payload: req.payload.clone(),
        at: ServerTime(now),
    };
    let dedup = format!("{}:{}", req.room, seq.0);
    append(tx, &req.room, seq, &dedup, &Item::Event(event), now).await?;
    let mut assignment = None;
    if let Some(next) = &req.next_holder {
        let reason = if req.action.as_str() == hostlease::protocol::ACTION_TRANSFER {
            Reason::Transferred
        } else {
            Reason::Resigned
        };
        let g = GrantReq {
            room: req.room.clone(),
            expected_epoch: row.epoch,
            holder: next.clone(),
            lease_ms: req.lease_ms,
            reason,
            require_lapsed: false,
            close: false,
        };
        // Sent over HTTP (a backend holding the host's capability), the holder's SDK has not
        // given the role up: it acts until it hears of this grant, which a stalled connection or
        // another process's publisher may hold back, so the successor is fenced like an admin's
        // reassign. Over its own socket the SDK gives authority up as it sends.
        let fenced = req.sender_session.is_none();
        match grant_in_tx(tx, &g, fenced, signer).await? {
            GrantOutcome::Won { assignment: a, .. } => assignment = Some(a),
            GrantOutcome::Lost(_) => {
                return Ok((reject(RejectCode::StaleEpoch), false));
            }
        }
    }
    let outcome = Outcome::Accepted { seq };
    sqlx::query(
        "INSERT INTO idempotency (room, sub, key, request_hash, outcome, created_at) VALUES (?, ?, ?, ?, ?, ?)",
    )
    .bind(req.room.as_str())
    .bind(c.sub.as_str())
    .bind(req.key.as_str())
    .bind(&hash)
    .bind(encode_body(&outcome))
    .bind(now as i64)
    .execute(&mut *tx)
    .await?;
    Ok((
        CommandDone {
            outcome,
            assignment,
            replayed: false,
        },
        true,
    ))
}

/// A lease renewal: the CAS on `(room, epoch, host, session)` while the lease is still live.
struct Renewal {
    room: RoomId,
    epoch: Epoch,
    host: ParticipantId,
    session: SessionId,
    lease_ms: u64,
}

async fn renew_in_tx(c: &mut SqliteConnection, r: &Renewal) -> StoreResult<Option<Renewed>> {
    let held = format!(
        "WHERE room = ? AND epoch = ? AND host = ? AND session = ? AND lease_expires > {NOW}"
    );
    // Never shorter than it was: the holder was told of the lease it had (a TTL lowered since
    // applies from here on, as the confirm says), and a fence is taken from it.
    let q = format!(
        "UPDATE rooms SET lease_expires = MAX(lease_expires, {NOW} + {TTL}) \
         {held} AND fenced_until <= {NOW} RETURNING lease_expires, {TTL}"
    );
    let row: Option<(i64, i64)> = sqlx::query_as(&q)
        .bind(r.lease_ms as i64)
        .bind(r.room.as_str())
        .bind(r.epoch.0 as i64)
        .bind(r.host.as_str())
        .bind(r.session.as_str())
        .bind(r.lease_ms as i64)
        .fetch_optional(&mut *c)
        .await?;
    if let Some((expires, lease_ms)) = row {
        return Ok(Some(Renewed::Until {
            expires: expires as u64,
            lease_ms: lease_ms as u64,
        }));
    }
    // Not renewed: the lease is gone, or it was fenced. (Not asked again whether it still is:
    // `NOW` is read again here, and a fence that ended between the two statements would make a
    // healthy holder look gone. Probed again at once instead.)
    let fenced: Option<i64> = sqlx::query_scalar(&format!(
        "SELECT MAX(1, fenced_until - {NOW}) FROM rooms {held}"
    ))
    .bind(r.room.as_str())
    .bind(r.epoch.0 as i64)
    .bind(r.host.as_str())
    .bind(r.session.as_str())
    .fetch_optional(&mut *c)
    .await?;
    Ok(fenced.map(|ms| Renewed::Fenced { ms: ms as u64 }))
}

async fn remember_in_tx(
    c: &mut SqliteConnection,
    room: &RoomId,
    p: &ParticipantId,
) -> StoreResult<()> {
    let q = format!(
        "INSERT INTO participants (room, participant, seen_at) VALUES (?, ?, {NOW}) \
         ON CONFLICT (room, participant) DO UPDATE SET seen_at = excluded.seen_at \
         WHERE participants.seen_at < excluded.seen_at - ?"
    );
    sqlx::query(&q)
        .bind(room.as_str())
        .bind(p.as_str())
        .bind(SEEN_REFRESH_MS)
        .execute(&mut *c)
        .await?;
    Ok(())
}

// ----- group commit ------------------------------------------------------------------------------

/// Most decisions a group commit takes in one transaction.
const GROUP_MAX: usize = 256;

/// Commands waiting for the committer at most (default of [`SqliteStore::max_queued_commands`]):
/// when the store falls behind, a command past it is answered `unavailable` (retry in 500 ms) at
/// once instead of queueing. Sixteen full groups; each connection may send 50 a second, so
/// without a bound a slow disk let the queue, and the memory it holds, grow without end.
/// Sightings of participants (one at each join and each leave, which no session waits for) are
/// counted too: one past the bound is not recorded (a stalled store queued one per join and per
/// leave without end). Renewals are not: there is at most one per host session.
pub const MAX_QUEUED_COMMANDS: usize = 16 * GROUP_MAX;

/// The answer of a command refused because [`MAX_QUEUED_COMMANDS`] are waiting already.
pub const STORE_BUSY: &str = "busy: too many commands queued";

/// A queued command's place in the count of [`MAX_QUEUED_COMMANDS`], given back when the job is
/// run or dropped.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

type Reply<T> = oneshot::Sender<StoreResult<T>>;

/// A decision for the group committer: its checks and effect run in a savepoint of the group's
/// transaction, and its answer is sent only after that transaction committed.
enum Job {
    Command {
        req: Box<CommandReq>,
        signer: Keypair,
        reply: Reply<CommandDone>,
        _slot: Slot,
    },
    Renew {
        renewal: Renewal,
        reply: Reply<Option<Renewed>>,
    },
    /// A participant seen (for the offline inbox).
    Remember {
        room: RoomId,
        participant: ParticipantId,
        reply: Reply<()>,
        _slot: Slot,
    },
}

impl Job {
    /// The answer of a job the group did not get to (it failed before).
    fn not_run(self) -> Answer {
        let e = || StoreError("not run".into());
        match self {
            Job::Command { reply, req, .. } => {
                req.held_key().inspect(HeldKey::refused);
                answer(reply, Err(e()))
            }
            Job::Renew { reply, .. } => answer(reply, Err(e())),
            Job::Remember { reply, .. } => answer(reply, Err(e())),
        }
    }
}

/// A job's answer, held until the group's transaction ends: called with `None` once it
/// committed (the job's own result goes out), or with the reason it did not (that goes out
/// instead). A caller that went away no longer wants it; an accepted command stays accepted, and
/// a retry with its idempotency key replays it.
type Answer = Box<dyn FnOnce(Option<&str>) + Send>;

fn answer<T: Send + 'static>(reply: Reply<T>, result: StoreResult<T>) -> Answer {
    Box::new(move |failed| {
        let _ = reply.send(match failed {
            None => result,
            Some(why) => Err(StoreError(why.to_string())),
        });
    })
}

/// Hot-path writes of this process (commands, lease renewals, first sightings of participants)
/// go through one committer that takes every decision queued while the previous transaction was
/// being made durable into the next transaction: one fsync answers many decisions. Each decision
/// is still checked inside the transaction that carries its effect (a savepoint of it, against
/// the rows as the decisions before it left them) and answered only after that transaction
/// committed with `synchronous=FULL`, so no caller ever hears of an effect that is not durable.
/// If the commit fails, every decision of the group is answered with the error and none took
/// effect.
struct GroupCommit {
    tx: mpsc::UnboundedSender<Job>,
    /// Transactions the committer has committed.
    commits: Arc<AtomicU64>,
    /// Commands queued and not yet run.
    commands: Arc<AtomicUsize>,
}

impl GroupCommit {
    fn start(writer: SqlitePool) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let commits = Arc::new(AtomicU64::new(0));
        tokio::spawn(group_committer(writer, rx, commits.clone()));
        Self {
            tx,
            commits,
            commands: Arc::default(),
        }
    }

    /// A place for one more command in the queue, if fewer than `max` wait; a refusal is
    /// counted in the metric `busy` names (not logged each time).
    fn slot(&self, max: usize, busy: &'static str) -> Option<Slot> {
        let taken = self.commands.fetch_add(1, Ordering::Relaxed);
        let slot = Slot(self.commands.clone());
        if taken < max {
            return Some(slot);
        }
        metrics::counter!(busy).increment(1);
        None
    }

    /// Queues the job now; the returned future resolves to its answer.
    fn submit<T: Send + 'static>(
        &self,
        job: impl FnOnce(Reply<T>) -> Job,
    ) -> impl Future<Output = StoreResult<T>> + Send + 'static {
        let (reply, answer) = oneshot::channel();
        let queued = self.tx.send(job(reply));
        async move {
            let closed = || StoreError("store closed".into());
            queued.map_err(|_| closed())?;
            answer.await.map_err(|_| closed())?
        }
    }
}

async fn group_committer(
    writer: SqlitePool,
    mut rx: mpsc::UnboundedReceiver<Job>,
    commits: Arc<AtomicU64>,
) {
    let mut jobs = Vec::with_capacity(GROUP_MAX);
    while rx.recv_many(&mut jobs, GROUP_MAX).await > 0 {
        metrics::histogram!("hostlease_group_commit_size").record(jobs.len() as f64);
        let mut answers = Vec::with_capacity(jobs.len());
        let committed = run_group(&writer, std::mem::take(&mut jobs), &mut answers).await;
        match committed {
            Ok(()) => {
                commits.fetch_add(1, Ordering::Relaxed);
                answers.into_iter().for_each(|a| a(None));
            }
            Err(e) => {
                tracing::warn!(error = %e, decisions = answers.len(), "group commit failed");
                answers
                    .into_iter()
                    .for_each(|a| a(Some("storage unavailable")));
            }
        }
    }
}

/// Runs fixed SQL (savepoints) on `c`.
async fn exec(c: &mut SqliteConnection, sql: &'static str) -> Result<(), sqlx::Error> {
    sqlx::query(sql).execute(c).await.map(|_| ())
}

/// Runs `jobs` in one transaction, each in a savepoint that is kept only when the decision has
/// an effect, and commits. `answers` gets one entry per job, in order, whatever happens.
async fn run_group(
    writer: &SqlitePool,
    jobs: Vec<Job>,
    answers: &mut Vec<Answer>,
) -> StoreResult<()> {
    let mut tx = match writer.begin_with("BEGIN IMMEDIATE").await {
        Ok(tx) => tx,
        Err(e) => {
            answers.extend(jobs.into_iter().map(Job::not_run));
            return Err(e.into());
        }
    };
    let mut failed = None;
    let mut jobs = jobs.into_iter();
    for job in jobs.by_ref() {
        // A held command is answered without a savepoint of its own: nothing of it is looked at.
        let job = match job {
            Job::Command { req, reply, .. }
                if req
                    .order
                    .as_ref()
                    .is_some_and(|o| o.held.decide(o.after.as_ref(), &req.key)) =>
            {
                metrics::counter!("hostlease_commands_held_total").increment(1);
                let done = CommandDone {
                    outcome: held(),
                    assignment: None,
                    replayed: false,
                };
                answers.push(answer(reply, Ok(done)));
                continue;
            }
            job => job,
        };
        if let Err(e) = exec(&mut tx, "SAVEPOINT decision").await {
            answers.push(job.not_run());
            failed = Some(e);
            break;
        }
        let (answer, keep) = match job {
            Job::Command {
                req, signer, reply, ..
            } => {
                let held = req.held_key();
                let r = command_in_tx(&mut tx, &req, &signer).await;
                if let (Some(h), true) = (&held, not_accepted(&r)) {
                    h.refused();
                }
                let keep = matches!(r, Ok((_, true)));
                let answered = answer(reply, r.map(|(done, _)| done));
                // Not committed after all: held behind it are those sent after it.
                let answered: Answer = Box::new(move |failed| {
                    if let (Some(h), true) = (&held, failed.is_some()) {
                        h.refused();
                    }
                    answered(failed)
                });
                (answered, keep)
            }
            Job::Renew { renewal, reply } => {
                let r = renew_in_tx(&mut tx, &renewal).await;
                let keep = matches!(r, Ok(Some(Renewed::Until { .. })));
                (answer(reply, r), keep)
            }
            Job::Remember {
                room,
                participant,
                reply,
                ..
            } => {
                let r = remember_in_tx(&mut tx, &room, &participant).await;
                let keep = r.is_ok();
                (answer(reply, r), keep)
            }
        };
        answers.push(answer);
        let undo = if keep {
            Ok(())
        } else {
            exec(&mut tx, "ROLLBACK TO decision").await
        };
        if let Err(e) = undo.and(exec(&mut tx, "RELEASE decision").await) {
            failed = Some(e);
            break;
        }
    }
    if let Some(e) = failed {
        answers.extend(jobs.map(Job::not_run));
        let _ = tx.rollback().await;
        return Err(e.into());
    }
    tx.commit().await?;
    Ok(())
}

/// A pool of `opts`, its first connection retried while the file is busy: switching a file to
/// WAL (the first connection's `journal_mode` pragma) is refused `database is locked` at once,
/// not after the busy timeout, while another process is doing it too.
async fn connect(pool: SqlitePoolOptions, opts: &SqliteConnectOptions) -> StoreResult<SqlitePool> {
    let mut tries = 0;
    loop {
        match pool.clone().connect_with(opts.clone()).await {
            Err(sqlx::Error::Database(e))
                if tries < 200
                    && e.code()
                        .and_then(|c| c.parse::<i32>().ok())
                        .is_some_and(|c| c & 0xff == 5) =>
            {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            r => return Ok(r?),
        }
    }
}

/// The store clock as one connection's statements read it: once as each statement begins.
struct StatementClock {
    clock: Arc<StoreClock>,
    /// The store clock when the connection's current statement began.
    now: AtomicI64,
}

impl StatementClock {
    fn refresh(&self) {
        // (A clock source that panics keeps the reading before: no unwinding into SQLite.)
        if let Ok(now) =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.clock.now_ms()))
        {
            self.now.store(now, Ordering::Relaxed);
        }
    }
}

/// Gives connection `c` the SQL function `hl_now()` ([`NOW`]): `clock`'s time when the statement
/// began, as SQLite's `julianday('now')` is one value for a whole statement (a statement that
/// reads it twice, as a grant's fence does, must not see two times).
async fn register_now(c: &mut SqliteConnection, clock: Arc<StoreClock>) -> sqlx::Result<()> {
    use libsqlite3_sys as ffi;
    use std::ffi::c_void;
    unsafe extern "C" fn now(
        ctx: *mut ffi::sqlite3_context,
        _: i32,
        _: *mut *mut ffi::sqlite3_value,
    ) {
        // SAFETY: the user data is the `StatementClock` given to `sqlite3_create_function_v2`
        // below, alive until `drop_clock` (SQLite calls it once the function is gone).
        let clock = unsafe { &*(ffi::sqlite3_user_data(ctx) as *const StatementClock) };
        unsafe { ffi::sqlite3_result_int64(ctx, clock.now.load(Ordering::Relaxed)) };
    }
    unsafe extern "C" fn began(
        _: u32,
        ctx: *mut c_void,
        stmt: *mut c_void,
        sql: *mut c_void,
    ) -> i32 {
        // A statement of the connection's own: not a trigger's program or a statement SQLite
        // runs within another (their text is another string), which read the clock of the
        // statement they run in. (Before the statement takes its lock: every decision runs in a
        // `BEGIN IMMEDIATE` transaction, whose lock was taken by its BEGIN.)
        // SAFETY: `stmt` is the statement beginning; `sqlite3_sql` only reads its text pointer.
        if unsafe { ffi::sqlite3_sql(stmt.cast()) } == sql.cast_const().cast() {
            // SAFETY: `ctx` is the function's `StatementClock`: statements run only while the
            // connection is open, and the function (with it) goes only as the connection closes.
            unsafe { &*(ctx as *const StatementClock) }.refresh();
        }
        0
    }
    unsafe extern "C" fn drop_clock(p: *mut c_void) {
        // SAFETY: `p` came from `Box::into_raw` below, and SQLite calls this once.
        drop(unsafe { Box::from_raw(p as *mut StatementClock) });
    }
    let state = Box::new(StatementClock {
        now: AtomicI64::new(clock.now_ms()),
        clock,
    });
    // Nothing else may register `hl_now` on these connections (the state would be freed under
    // the trace hook) or set a trace hook (`hl_now()` would stop moving: leases never run out).
    let mut handle = c.lock_handle().await?;
    let db = handle.as_raw_handle().as_ptr();
    let state = Box::into_raw(state) as *mut c_void;
    // SAFETY: `db` is the connection's handle, locked for these calls; SQLite owns `state` from
    // here and gives it to `drop_clock` (also when the call fails, and then it is not used again).
    let mut rc = unsafe {
        ffi::sqlite3_create_function_v2(
            db,
            c"hl_now".as_ptr(),
            0,
            ffi::SQLITE_UTF8,
            state,
            Some(now),
            None,
            None,
            Some(drop_clock),
        )
    };
    if rc == ffi::SQLITE_OK {
        // SAFETY: as above; `state` lives as long as the function, which outlives every statement.
        rc =
            unsafe { ffi::sqlite3_trace_v2(db, ffi::SQLITE_TRACE_STMT as u32, Some(began), state) };
    }
    if rc == ffi::SQLITE_OK {
        Ok(())
    } else {
        Err(sqlx::Error::Protocol(format!(
            "registering hl_now(): SQLite error {rc}"
        )))
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `url` (`sqlite://path`) and applies migrations.
    pub async fn open(url: &str) -> StoreResult<Self> {
        Self::open_with_clock(url, StoreClock::new(SystemClock)).await
    }

    /// [`SqliteStore::open`] on the store clock `clock` (a test's clock source).
    pub async fn open_with_clock(url: &str, clock: StoreClock) -> StoreResult<Self> {
        let path = url.strip_prefix("sqlite://").unwrap_or(url);
        if let Some(dir) = std::path::Path::new(path).parent() {
            if !dir.as_os_str().is_empty() {
                std::fs::create_dir_all(dir).map_err(|e| StoreError(e.to_string()))?;
            }
        }
        let opts = SqliteConnectOptions::from_str(&format!("sqlite://{path}"))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(10))
            .foreign_keys(true);
        let clock = Arc::new(clock);
        let pool_of = |n: u32| {
            let clock = clock.clone();
            SqlitePoolOptions::new()
                .max_connections(n)
                .after_connect(move |c, _| {
                    let clock = clock.clone();
                    Box::pin(async move { register_now(c, clock).await })
                })
        };
        let writer = connect(pool_of(1), &opts).await?;
        // In one write transaction: sqlx's SQLite migrator takes no lock, so processes started
        // together each read the applied list and all but one failed on `table rooms already
        // exists`. Here the others wait (the busy timeout) and then find them applied; each
        // migration becomes a savepoint.
        let mut tx = writer.begin_with("BEGIN IMMEDIATE").await?;
        // (`run_direct`: `run` on a transaction's connection does not compile in a `Send` future.)
        sqlx::migrate!("./migrations").run_direct(&mut *tx).await?;
        // The store clock's offset for this boot: the first process's, for every process on the
        // file (a row of an earlier boot is replaced).
        if let Some((boot, offset)) = clock.proposal() {
            sqlx::query("DELETE FROM clock WHERE boot <> ?")
                .bind(&boot)
                .execute(&mut *tx)
                .await?;
            let kept: i64 = sqlx::query_scalar(
                "INSERT INTO clock (boot, offset_ns) VALUES (?, ?) \
                 ON CONFLICT (boot) DO UPDATE SET boot = boot RETURNING offset_ns",
            )
            .bind(&boot)
            .bind(offset)
            .fetch_one(&mut *tx)
            .await?;
            // (A store clock off the wall clock is told by the sweeper, at its first sweep.)
            clock.anchor(kept);
        } else {
            tracing::warn!(
                "no boot clock here: leases are timed on the wall clock, which a step moves"
            );
        }
        tx.commit().await?;
        let pool = connect(pool_of(4), &opts).await?;
        Ok(Self {
            pool,
            group: GroupCommit::start(writer.clone()),
            writer,
            clock,
            inbox_retention_ms: INBOX_RETENTION_MS,
            participant_retention_ms: PARTICIPANT_RETENTION_MS,
            max_queued_commands: MAX_QUEUED_COMMANDS,
        })
    }

    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The newest id of `table` (one of this module's tables with an `id` key), 0 when empty.
    async fn max_id(&self, table: &'static str) -> StoreResult<i64> {
        let v: Option<i64> = sqlx::query_scalar(&format!("SELECT MAX(id) FROM {table}"))
            .fetch_one(&self.pool)
            .await?;
        Ok(v.unwrap_or(0))
    }

    /// Transactions committed so far for commands and lease renewals (each carries a group of
    /// them; see `GroupCommit`).
    pub fn group_commits(&self) -> u64 {
        self.group.commits.load(Ordering::Relaxed)
    }
}

/// The rooms whose log housekeeping trims, 500 at a time in name order after `?1`: an open room
/// with more than `?2` items ever, a closed one while any of its log is left (every run looked at
/// each closed room with a long history again, and took the writer for an empty delete).
pub const LOG_TRIM_ROOMS: &str = "SELECT room, seq, closed FROM rooms WHERE room > ?1 AND \
     ((closed = 0 AND seq > ?2) OR (closed = 1 AND EXISTS (SELECT 1 FROM log \
     WHERE log.room = rooms.room))) ORDER BY room LIMIT 500";

/// Housekeeping's deletes: `[idempotency, inbox, inbox_items, participants, outbox_delivered,
/// outbox_unclaimed, outbox, log, kicks]`. Each deletes at most `PRUNE_BATCH` rows and finds them through an index (a test
/// reads their query plans): one statement over a whole table held the one writer, and with it
/// every lease renewal queued behind, for seconds. `?1` is the retention in ms (for the log: the
/// room, and `?2` the newest seq to delete).
pub fn prune_sql() -> [String; 9] {
    let aged = |table: &str, key: &str, column: &str, more: &str| {
        format!(
            "DELETE FROM {table} WHERE {key} IN (SELECT {key} FROM {table} \
             WHERE {column} < {NOW} - ?1{more} LIMIT {PRUNE_BATCH})"
        )
    };
    // Notified outbox rows older than ?1 through the partial index `index` of those where `cond`.
    let outbox = |index: &str, cond: &str| {
        format!(
            "DELETE FROM outbox WHERE id IN (SELECT id FROM outbox INDEXED BY {index} \
             WHERE created_at < {NOW} - ?1 AND {cond} AND notified_at IS NOT NULL \
             LIMIT {PRUNE_BATCH})"
        )
    };
    [
        aged("idempotency", "rowid", "created_at", ""),
        aged("inbox", "cursor", "created_at", ""),
        // Only once no row points at it: a row is written just after its item, and each
        // delete runs with its own clock reading.
        aged(
            "inbox_items",
            "id",
            "created_at",
            " AND NOT EXISTS (SELECT 1 FROM inbox WHERE inbox.item_id = inbox_items.id)",
        ),
        aged("participants", "rowid", "seen_at", ""),
        // Outbox rows whose webhook was delivered (bound: an hour), through the index of those
        // only: not the rows still waiting for a receiver that is down.
        outbox("outbox_done_by_age", "webhook_done_at IS NOT NULL"),
        // Without a webhook here, the rows no webhook worker has claimed (bound: an hour), if
        // no worker has been at work within that hour: none has a row in flight or put off
        // until then, nor delivered one since. A row a worker claimed (`webhook_next_at` set,
        // about 200 ms after its commit) may be another process's to deliver: it stays for the
        // next delete. So may one not claimed yet while a worker is behind: a receiver that
        // hangs holds each send its 10 s, and the worker claims ~3 rows a second; committed
        // faster, unclaimed rows grew an hour old and were deleted, never delivered nor counted
        // as given up.
        outbox(
            "outbox_unclaimed_by_age",
            &format!(
                "webhook_next_at = 0 AND NOT EXISTS (SELECT 1 FROM outbox AS w INDEXED BY \
                 outbox_webhook_due WHERE w.webhook_done_at IS NULL \
                 AND w.webhook_next_at > {NOW} - ?1) AND NOT EXISTS (SELECT 1 FROM outbox AS d \
                 INDEXED BY outbox_delivered_at WHERE d.webhook_done_at IS NOT NULL \
                 AND d.webhook_done_at > {NOW} - ?1)"
            ),
        ),
        // And any (bound: 24 h with a webhook here, given up; an hour more without, so that
        // the process delivering a claimed row counts it given up first).
        aged("outbox", "id", "created_at", " AND notified_at IS NOT NULL"),
        format!(
            "DELETE FROM log WHERE rowid IN (SELECT rowid FROM log WHERE room = ?1 AND seq <= ?2 \
             LIMIT {PRUNE_BATCH})"
        ),
        // Kicks older than ?1 (bound: a day and an hour, see `KICK_RETENTION_MS`).
        aged("kicks", "id", "created_at", ""),
    ]
}

/// Writes a row into the inbox in `room` of each of `ps`, pointing at the stored item `item_id`;
/// the number written.
async fn inbox_rows(
    tx: &mut sqlx::SqliteConnection,
    room: &RoomId,
    ps: &[&ParticipantId],
    item_id: i64,
) -> StoreResult<usize> {
    let insert = format!(
        "INSERT INTO inbox (room, participant, item, item_id, created_at) \
         VALUES (?, ?, '', ?, {NOW})"
    );
    for p in ps {
        sqlx::query(&insert)
            .bind(room.as_str())
            .bind(p.as_str())
            .bind(item_id)
            .execute(&mut *tx)
            .await?;
    }
    Ok(ps.len())
}

impl SqliteStore {
    /// Runs one of [`prune_sql`]'s deletes until a batch comes back short, each batch its own
    /// transaction on the writer, so that what is queued for it goes in between.
    async fn prune<'q>(
        &self,
        query: impl Fn() -> sqlx::query::Query<'q, Sqlite, SqliteArguments<'q>>,
    ) -> StoreResult<()> {
        while query().execute(&self.writer).await?.rows_affected() == PRUNE_BATCH {
            tokio::task::yield_now().await;
        }
        Ok(())
    }
}

#[async_trait]
impl Store for SqliteStore {
    async fn now_ms(&self) -> StoreResult<u64> {
        let mut c = self.pool.acquire().await?;
        store_now(&mut c).await
    }

    fn clock_ms(&self) -> u64 {
        self.clock.now_ms().max(0) as u64
    }

    fn clock_skew_ms(&self) -> i64 {
        self.clock.skew_ms()
    }

    async fn room(&self, room: &RoomId) -> StoreResult<Option<RoomRow>> {
        let mut c = self.pool.acquire().await?;
        read_room(&mut c, room).await
    }

    async fn grant(&self, req: GrantReq, signer: &Keypair) -> StoreResult<GrantOutcome> {
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        let out = grant_in_tx(&mut tx, &req, req.forced(), signer).await?;
        if matches!(out, GrantOutcome::Won { .. }) {
            tx.commit().await?;
        } else {
            tx.rollback().await?;
        }
        Ok(out)
    }

    async fn renew(
        &self,
        room: &RoomId,
        epoch: Epoch,
        host: &ParticipantId,
        session: &SessionId,
        lease_ms: u64,
    ) -> StoreResult<Option<Renewed>> {
        let renewal = Renewal {
            room: room.clone(),
            epoch,
            host: host.clone(),
            session: session.clone(),
            lease_ms,
        };
        self.group
            .submit(|reply| Job::Renew { renewal, reply })
            .await
    }

    async fn close_hostless(&self, room: &RoomId, epoch: Epoch) -> StoreResult<bool> {
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        sqlx::query("INSERT OR IGNORE INTO rooms (room) VALUES (?)")
            .bind(room.as_str())
            .execute(&mut *tx)
            .await?;
        let n = sqlx::query(
            "UPDATE rooms SET closed = 1 WHERE room = ? AND epoch = ? AND host IS NULL",
        )
        .bind(room.as_str())
        .bind(epoch.0 as i64)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        tx.commit().await?;
        Ok(n == 1)
    }

    async fn set_ttl(&self, room: &RoomId, ttl_ms: Option<u64>) -> StoreResult<()> {
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        sqlx::query("INSERT OR IGNORE INTO rooms (room) VALUES (?)")
            .bind(room.as_str())
            .execute(&mut *tx)
            .await?;
        sqlx::query("UPDATE rooms SET ttl_ms = ? WHERE room = ?")
            .bind(ttl_ms.map(|t| t as i64))
            .bind(room.as_str())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    fn command(&self, req: CommandReq, signer: &Keypair) -> Pending<CommandDone> {
        let Some(slot) = self
            .group
            .slot(self.max_queued_commands, "hostlease_store_busy_total")
        else {
            req.held_key().inspect(HeldKey::refused);
            return Box::pin(std::future::ready(Err(StoreError(STORE_BUSY.into()))));
        };
        Box::pin(self.group.submit(|reply| Job::Command {
            req: Box::new(req),
            signer: signer.clone(),
            reply,
            _slot: slot,
        }))
    }

    async fn log_range(
        &self,
        room: &RoomId,
        after: Seq,
        upto: Seq,
        limit: usize,
        max_bytes: usize,
    ) -> StoreResult<(Vec<Item>, Option<Seq>)> {
        let mut c = self.pool.acquire().await?;
        let mut items = Vec::new();
        {
            // Newest first, row by row: a log of large items past the budget is not read, but for
            // the few rows the driver reads ahead (it was read whole, up to `limit` rows of
            // 59 KiB, and cut down to the budget after).
            let mut rows = sqlx::query_scalar::<_, String>(
                "SELECT item FROM log WHERE room = ? AND seq > ? AND seq <= ? ORDER BY seq DESC LIMIT ?",
            )
            .bind(room.as_str())
            .bind(after.0 as i64)
            .bind(upto.0 as i64)
            .bind(limit as i64)
            .fetch(&mut *c);
            let mut bytes = 0;
            while let Some(text) = rows.try_next().await? {
                bytes += text.len();
                if bytes > max_bytes {
                    break;
                }
                items.extend(stored::<Item>(&text).ok());
            }
        }
        items.reverse();
        let min: Option<i64> = sqlx::query_scalar("SELECT MIN(seq) FROM log WHERE room = ?")
            .bind(room.as_str())
            .fetch_one(&mut *c)
            .await?;
        Ok((items, min.map(|m| Seq(m as u64))))
    }

    async fn outbox_after(&self, after: i64, limit: i64) -> StoreResult<Vec<(i64, RoomId, Item)>> {
        let rows: Vec<(i64, String, String)> =
            sqlx::query_as("SELECT id, room, item FROM outbox WHERE id > ? ORDER BY id LIMIT ?")
                .bind(after)
                .bind(limit)
                .fetch_all(&self.pool)
                .await?;
        Ok(rows
            .into_iter()
            .filter_map(|(id, room, item)| Some((id, RoomId::new(room).ok()?, stored(&item).ok()?)))
            .collect())
    }

    async fn outbox_max_id(&self) -> StoreResult<i64> {
        self.max_id("outbox").await
    }

    async fn unnotified(&self, limit: i64) -> StoreResult<Vec<(i64, RoomId, Seq, String)>> {
        let rows: Vec<(i64, String, i64, String)> = sqlx::query_as(
            "SELECT id, room, seq, item FROM outbox WHERE notified_at IS NULL ORDER BY id LIMIT ?",
        )
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .filter_map(|(id, room, seq, item)| {
                Some((id, RoomId::new(room).ok()?, Seq(seq as u64), item))
            })
            .collect())
    }

    async fn notify(
        &self,
        rows: &[(i64, RoomId, Seq, String)],
        online: &Online,
    ) -> StoreResult<usize> {
        // Each room's participants are read once per batch (from a reader: one who joins
        // meanwhile is told by `online`, and one forgotten meanwhile gets one more entry).
        let mut parts: std::collections::HashMap<&RoomId, Vec<ParticipantId>> =
            std::collections::HashMap::new();
        for (_, room, ..) in rows {
            if parts.contains_key(room) {
                continue;
            }
            let ids: Vec<String> =
                sqlx::query_scalar("SELECT participant FROM participants WHERE room = ?")
                    .bind(room.as_str())
                    .fetch_all(&self.pool)
                    .await?;
            let ids = ids.into_iter().filter_map(|p| ParticipantId::new(p).ok());
            parts.insert(room, ids.collect());
        }
        // A few rows per transaction: one fsync for several rows, while a grant or command
        // queued behind on the writer connection waits for a short transaction only.
        let claim =
            format!("UPDATE outbox SET notified_at = {NOW} WHERE id = ? AND notified_at IS NULL");
        let store_item =
            format!("INSERT INTO inbox_items (item, created_at) VALUES (?, {NOW}) RETURNING id");
        // Who gets a row; counted for every row before any transaction, to size them (the
        // lists themselves one row at a time: a batch of a room with thousands away is millions).
        fn away<'a>(
            parts: &'a std::collections::HashMap<&RoomId, Vec<ParticipantId>>,
            online: &'a Online,
            room: &'a RoomId,
            seq: Seq,
        ) -> impl Iterator<Item = &'a ParticipantId> + 'a {
            parts.get(room).into_iter().flatten().filter(move |p| {
                !online
                    .get(&(room.clone(), (*p).clone()))
                    .is_some_and(|&(since, upto)| since < seq && seq <= upto)
            })
        }
        let fanout: Vec<usize> = rows
            .iter()
            .map(|(_, room, seq, _)| away(&parts, online, room, *seq).count())
            .collect();
        let mut n = 0;
        for chunk in notify_chunks(&fanout) {
            let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
            for (id, room, seq, item) in &rows[chunk] {
                let claimed = sqlx::query(&claim)
                    .bind(id)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                if claimed == 0 {
                    continue; // another process got it
                }
                let away: Vec<&ParticipantId> = away(&parts, online, room, *seq).collect();
                if !away.is_empty() {
                    // The item once; a row per participant away points at it.
                    let item_id: i64 = sqlx::query_scalar(&store_item)
                        .bind(item)
                        .fetch_one(&mut *tx)
                        .await?;
                    inbox_rows(&mut tx, room, &away, item_id).await?;
                }
                n += 1;
            }
            tx.commit().await?;
        }
        Ok(n)
    }

    async fn recover_inbox(&self, lost: &[Lost]) -> StoreResult<usize> {
        let mut rooms: BTreeMap<&RoomId, Vec<(&ParticipantId, u64, u64)>> = BTreeMap::new();
        for l in lost {
            // The newest `RECOVER_MAX` (a room's seqs have no holes).
            let after = l.after.0.max(l.upto.0.saturating_sub(RECOVER_MAX));
            if l.upto.0 > after {
                rooms
                    .entry(&l.room)
                    .or_default()
                    .push((&l.participant, after, l.upto.0));
            }
        }
        let store_item = format!(
            "INSERT INTO inbox_items (item, created_at) \
             SELECT item, {NOW} FROM log WHERE room = ? AND seq = ? RETURNING id"
        );
        let mut n = 0;
        for (room, sessions) in rooms {
            let lo = sessions.iter().map(|s| s.1).min().unwrap_or(0);
            let hi = sessions.iter().map(|s| s.2).max().unwrap_or(0);
            // The sizes from a reader (the items are copied within the store, never read out).
            let sizes: BTreeMap<u64, i64> = sqlx::query_as::<_, (i64, i64)>(
                "SELECT seq, length(CAST(item AS BLOB)) FROM log \
                 WHERE room = ? AND seq > ? AND seq <= ?",
            )
            .bind(room.as_str())
            .bind(lo as i64)
            .bind(hi as i64)
            .fetch_all(&self.pool)
            .await?
            .into_iter()
            .map(|(seq, size)| (seq as u64, size))
            .collect();
            // Who gets each item: a session's newest first, up to its byte budget (a participant
            // once, whatever the number of its sessions lost together).
            let mut to: BTreeMap<u64, std::collections::BTreeSet<&ParticipantId>> = BTreeMap::new();
            for &(p, after, upto) in &sessions {
                let mut bytes = 0;
                for (&seq, &size) in sizes.range(after + 1..=upto).rev() {
                    bytes += size;
                    if bytes > RECOVER_BYTES && bytes != size {
                        break;
                    }
                    to.entry(seq).or_default().insert(p);
                }
            }
            let to: Vec<(u64, Vec<&ParticipantId>)> = to
                .into_iter()
                .map(|(seq, ps)| (seq, ps.into_iter().collect()))
                .collect();
            let fanout: Vec<usize> = to.iter().map(|(_, ps)| ps.len()).collect();
            for chunk in notify_chunks(&fanout) {
                let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
                for (seq, ps) in &to[chunk] {
                    // Trimmed from the log meanwhile: nothing to copy.
                    let Some(item_id) = sqlx::query_scalar::<_, i64>(&store_item)
                        .bind(room.as_str())
                        .bind(*seq as i64)
                        .fetch_optional(&mut *tx)
                        .await?
                    else {
                        continue;
                    };
                    n += inbox_rows(&mut tx, room, ps, item_id).await?;
                }
                tx.commit().await?;
            }
        }
        Ok(n)
    }

    async fn webhook_due(&self, limit: i64, claim_ms: u64) -> StoreResult<Vec<Delivery>> {
        let mut tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        let q = format!(
            "UPDATE outbox SET webhook_next_at = {NOW} + ? WHERE id IN ({}) \
             RETURNING id, kind || ':' || dedup_key, item, webhook_attempts, webhook_next_at",
            webhook_due_rows()
        );
        let rows: Vec<(i64, String, String, i64, i64)> = sqlx::query_as(&q)
            .bind(claim_ms as i64)
            .bind(WEBHOOK_RETENTION_MS)
            .bind(limit)
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        let mut rows: Vec<Delivery> = rows
            .into_iter()
            .map(|(id, key, body, attempts, claim)| Delivery {
                id,
                key,
                body,
                attempts,
                claim,
            })
            .collect();
        rows.sort_by_key(|r| r.id);
        Ok(rows)
    }

    async fn webhook_result(
        &self,
        d: &Delivery,
        delivered: bool,
        retry_ms: u64,
    ) -> StoreResult<()> {
        // Delivered is delivered, whoever holds the row now; a failure moves the next attempt
        // only while the row is still this claim's.
        if delivered {
            let q = format!(
                "UPDATE outbox SET webhook_done_at = {NOW}, webhook_attempts = webhook_attempts + 1 WHERE id = ?"
            );
            sqlx::query(&q).bind(d.id).execute(&self.writer).await?;
        } else {
            let q = format!(
                "UPDATE outbox SET webhook_next_at = {NOW} + ?, webhook_attempts = \
                 webhook_attempts + 1 WHERE id = ? AND webhook_next_at = ?"
            );
            sqlx::query(&q)
                .bind(retry_ms as i64)
                .bind(d.id)
                .bind(d.claim)
                .execute(&self.writer)
                .await?;
        }
        Ok(())
    }

    async fn remember_participant(&self, room: &RoomId, p: &ParticipantId) -> StoreResult<()> {
        // Through the group committer: a reconnect storm's thousands of rejoins become a few
        // transactions whose `INSERT OR IGNORE`s of known participants write nothing (no fsync),
        // and they never queue on the readers that sessions and hub loads wait for.
        // Past the queue's bound the sighting is left out, and counted: no session waits for it.
        let busy = "hostlease_participants_not_recorded_total";
        let Some(_slot) = self.group.slot(self.max_queued_commands, busy) else {
            return Ok(());
        };
        let (room, participant) = (room.clone(), p.clone());
        self.group
            .submit(|reply| Job::Remember {
                room,
                participant,
                reply,
                _slot,
            })
            .await
    }

    async fn inbox(
        &self,
        room: &RoomId,
        p: &ParticipantId,
        since: u64,
        limit: i64,
        max_bytes: usize,
    ) -> StoreResult<InboxPage> {
        // Row by row, up to the budget: a page was read whole (256 rows of up to 59 KiB, ~15 MB
        // held until a client that never reads its answer let go of it). One row more than the
        // page tells whether more is left.
        let mut c = self.pool.acquire().await?;
        let mut rows = sqlx::query_as::<_, (i64, String)>(
            "SELECT i.cursor, COALESCE(it.item, i.item) FROM inbox i \
             LEFT JOIN inbox_items it ON it.id = i.item_id \
             WHERE i.room = ? AND i.participant = ? AND i.cursor > ? ORDER BY i.cursor LIMIT ?",
        )
        .bind(room.as_str())
        .bind(p.as_str())
        .bind(i64::try_from(since).unwrap_or(i64::MAX))
        .bind(limit.saturating_add(1))
        .fetch(&mut *c);
        let mut page = InboxPage {
            entries: Vec::new(),
            next: None,
        };
        let (mut read, mut bytes, mut last) = (0, 0, None);
        while let Some((cursor, text)) = rows.try_next().await? {
            bytes += text.len();
            if read == limit || (read > 0 && bytes > max_bytes) {
                page.next = last;
                break;
            }
            read += 1;
            let cursor = cursor as u64;
            last = Some(cursor);
            page.entries
                .extend(stored(&text).ok().map(|item| InboxEntry { cursor, item }));
        }
        Ok(page)
    }

    async fn lapsed_rooms(&self, rooms: &[RoomId]) -> StoreResult<Swept> {
        let mut swept = Swept::default();
        // A chunk's names are bound parameters (SQLite allows 32 766 per statement).
        for chunk in rooms.chunks(LAPSED_CHUNK) {
            let marks = vec!["?"; chunk.len()].join(",");
            let q = format!(
                "SELECT room, closed, seq FROM rooms WHERE room IN ({marks}) AND (closed = 1 \
                 OR (host IS NOT NULL AND lease_expires <= {NOW}))"
            );
            let mut query = sqlx::query_as::<_, (String, bool, i64)>(&q);
            for r in chunk {
                query = query.bind(r.as_str());
            }
            for (room, closed, seq) in query.fetch_all(&self.pool).await? {
                let Ok(room) = RoomId::new(room) else {
                    continue;
                };
                if closed {
                    swept.closed.push((room, Seq(seq as u64)));
                } else {
                    swept.lapsed.push(room);
                }
            }
        }
        Ok(swept)
    }

    async fn record_kick(&self, room: &RoomId, p: &ParticipantId) -> StoreResult<i64> {
        let q = format!(
            "INSERT INTO kicks (room, participant, created_at) VALUES (?, ?, {NOW}) RETURNING id"
        );
        Ok(sqlx::query_scalar(&q)
            .bind(room.as_str())
            .bind(p.as_str())
            .fetch_one(&self.writer)
            .await?)
    }

    async fn kicks_after(&self, after: i64, limit: i64) -> StoreResult<Vec<Kick>> {
        let rows: Vec<(i64, String, String, i64)> = sqlx::query_as(
            "SELECT id, room, participant, created_at FROM kicks WHERE id > ? ORDER BY id LIMIT ?",
        )
        .bind(after)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .filter_map(|(id, r, p, at)| {
                let at = u64::try_from(at).unwrap_or(0);
                Some((id, RoomId::new(r).ok()?, ParticipantId::new(p).ok()?, at))
            })
            .collect())
    }

    async fn kicks_max_id(&self) -> StoreResult<i64> {
        self.max_id("kicks").await
    }

    async fn housekeeping(&self, keep_log: i64, webhook: bool) -> StoreResult<()> {
        let [idempotency, inbox, inbox_items, participants, outbox_done, outbox_unclaimed, outbox, log, kicks] =
            prune_sql();
        // A kick revokes the capabilities minted before it for as long as any of them can live:
        // deleted after an hour, a 24 h participant token from before it worked again.
        self.prune(|| sqlx::query(&kicks).bind(KICK_RETENTION_MS))
            .await?;
        // Rows a process of the code before migration 0005 wrote (during a rolling upgrade)
        // carry 0: they count from now.
        for q in [
            format!("UPDATE inbox SET created_at = {NOW} WHERE created_at = 0"),
            format!("UPDATE participants SET seen_at = {NOW} WHERE seen_at = 0"),
        ] {
            sqlx::query(&q).execute(&self.writer).await?;
        }
        for (q, keep) in [
            (idempotency, IDEMPOTENCY_RETENTION_MS),
            (inbox, self.inbox_retention_ms),
            (inbox_items, self.inbox_retention_ms),
            (participants, self.participant_retention_ms),
        ] {
            self.prune(|| sqlx::query(&q).bind(keep)).await?;
        }
        if webhook {
            // Rows whose delivery is given up, each counted once (they are deleted just below).
            let q = format!(
                "SELECT COUNT(*) FROM outbox WHERE created_at < {NOW} - {WEBHOOK_RETENTION_MS} \
                 AND webhook_done_at IS NULL AND notified_at IS NOT NULL"
            );
            let lost: i64 = sqlx::query_scalar(&q).fetch_one(&self.pool).await?;
            if lost > 0 {
                tracing::warn!(rows = lost, "webhook deliveries given up after 24 h");
                metrics::counter!("hostlease_webhook_given_up_total").increment(lost as u64);
            }
        }
        // (Before the delivered rows go: a row a worker delivered since the last run is what
        // shows it at work, an hour behind.)
        let keep = if webhook {
            WEBHOOK_RETENTION_MS
        } else {
            self.prune(|| sqlx::query(&outbox_unclaimed).bind(3_600_000i64))
                .await?;
            WEBHOOK_RETENTION_MS + 3_600_000
        };
        self.prune(|| sqlx::query(&outbox_done).bind(3_600_000i64))
            .await?;
        self.prune(|| sqlx::query(&outbox).bind(keep)).await?;
        // Each room's log is trimmed to its newest `keep_log` items, and a closed room's goes
        // whole: no one may join it to read it (it was kept for ever, an app that opens a room
        // per meeting grew the log without end). The rooms and their oldest retained seq are
        // read on the readers (an index look-up per room); only a log that needs trimming takes
        // the writer.
        let mut after = String::new();
        loop {
            let rooms: Vec<(String, i64, bool)> = sqlx::query_as(LOG_TRIM_ROOMS)
                .bind(&after)
                .bind(keep_log)
                .fetch_all(&self.pool)
                .await?;
            let Some((last, ..)) = rooms.last() else {
                break;
            };
            after = last.clone();
            for (room, seq, closed) in rooms {
                // A closed room was listed only with a log left (the scan's `EXISTS`): all of it
                // goes, without asking where it starts.
                let upto = if closed { seq } else { seq - keep_log };
                let trim = closed || {
                    let oldest: Option<i64> =
                        sqlx::query_scalar("SELECT MIN(seq) FROM log WHERE room = ?")
                            .bind(&room)
                            .fetch_one(&self.pool)
                            .await?;
                    oldest.is_some_and(|o| o <= upto)
                };
                if trim {
                    self.prune(|| sqlx::query(&log).bind(&room).bind(upto))
                        .await?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A command sent after a held or refused one is held; deciding a command takes its key out;
    /// the keys kept are bounded (the oldest forgotten).
    #[test]
    fn held_commands_hold_those_after_them_and_are_bounded() {
        let k = |s: &str| IdempotencyKey::new(s).unwrap();
        let held = Held::default();
        held.refused(&k("a"));
        assert!(held.decide(Some(&k("a")), &k("b")), "after a refused one");
        assert!(held.decide(Some(&k("b")), &k("c")), "after a held one");
        assert!(!held.decide(None, &k("d")));
        assert!(!held.decide(Some(&k("d")), &k("e")), "after a decided one");
        assert!(
            !held.decide(None, &k("a")),
            "the refused one, decided again"
        );
        assert!(!held.decide(Some(&k("a")), &k("b")));
        for i in 0..Held::MAX + 1 {
            held.refused(&k(&format!("r{i}")));
        }
        assert!(
            !held.decide(Some(&k("r0")), &k("x")),
            "the oldest forgotten"
        );
        assert!(held.decide(Some(&k("r1")), &k("y")));
        let h = held.0.lock().unwrap();
        assert!(h.order.len() <= Held::MAX && h.keys.len() == h.order.len());
    }

    /// Claiming due deliveries reads the index in order and stops at the limit: no sort of
    /// every due row.
    #[tokio::test]
    async fn due_deliveries_are_read_in_index_order() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("p.db").display());
        let store = SqliteStore::open(&url).await.unwrap();
        let plan: Vec<(i64, i64, i64, String)> =
            sqlx::query_as(&format!("EXPLAIN QUERY PLAN {}", webhook_due_rows()))
                .bind(WEBHOOK_RETENTION_MS)
                .bind(64)
                .fetch_all(&store.pool)
                .await
                .unwrap();
        let plan: Vec<&str> = plan.iter().map(|r| r.3.as_str()).collect();
        assert!(
            plan.iter().any(|d| d.contains("outbox_webhook_due")),
            "{plan:?}"
        );
        assert!(!plan.iter().any(|d| d.contains("TEMP B-TREE")), "{plan:?}");
    }
}
