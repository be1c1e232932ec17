//! [`HostView`]: the SDK's sans-I/O state machine.
//!
//! Methods come in four kinds, as in quinn-proto:
//! - getters (`phase`, `assignment`, `has_authority`, `provisional`, `members`, ...);
//! - `handle_*` inputs, each carrying the `Instant` at which it happened;
//! - commands (`command`, `resign`, `transfer`, `leave`);
//! - outputs: [`HostView::poll_transmit`], [`HostView::poll_event`], [`HostView::poll_timeout`].
//!
//! The drive loop: after every input or command, drain `poll_transmit` (send each frame at once, in
//! order) and `poll_event` (hand each event to the app) until both return `None`, then arm one timer
//! for `poll_timeout` and call [`HostView::handle_timeout`] when it fires. Extra `handle_timeout`
//! calls are harmless.

use crate::prelude::*;
use alloc::collections::VecDeque;

use crate::protocol::Json;

use super::backoff::{Backoff, Entropy, SplitMix64};
use super::error::CommandError;
use super::order::{election_cmp, provisional_coordinator};
use super::time::Instant;
use crate::protocol::codec::{HEARTBEAT_MS, RESEND_WINDOW_MS};
use crate::protocol::{
    Action, ActionKind, ActionTable, Assignment, ClientMsg, Epoch, ErrorCode, Gap, IdempotencyKey,
    Item, Member, Outcome, ParticipantId, RejectCode, Role, RoomEvent, Seq, ServerMsg, SessionId,
    SignedAssignment, Snapshot, Token, ACTION_RESIGN, ACTION_TRANSFER,
};

/// Tunables of a [`HostView`].
#[derive(Debug, Clone)]
pub struct Config {
    /// Most stream items buffered while waiting for a snapshot; past it the buffer is dropped and
    /// a new resync requested.
    pub buffer_limit: usize,
    /// Most commands queued offline plus in flight.
    pub command_limit: usize,
    /// Bound on the local clock's drift against the server's, in parts per million (ρ).
    pub drift_ppm: u64,
    /// Safety margin subtracted from every local lease deadline.
    pub lease_margin_ms: u64,
    /// Resend a command (same idempotency key) when no result came within this time; also how
    /// long a hello waits for its welcome. Taken within 100 ms ..= 10 min (a zero would make
    /// every timer due at once, for ever).
    pub command_timeout_ms: u64,
    /// Give up on a command after this many sends.
    pub max_attempts: u32,
    /// Delays between write retries.
    pub retry: Backoff,
    /// Seed of the core's random source (jitter, idempotency keys). Give each view its own
    /// random seed: two views with one seed make the same idempotency keys, and the server takes
    /// a command under a key it kept (48 h, per participant) for a retry of the first (a vote
    /// after a restart was answered with the earlier vote's result and not applied). The
    /// default is random where the OS gives `std` randomness (`RandomState`'s keys); on
    /// `wasm32-unknown-unknown` it has none, so set it there from `crypto.getRandomValues`, as
    /// the browser driver does.
    pub seed: u64,
    /// Ask the server for the retained room log on the first connection, so that the app can
    /// rebuild its state from events (`false`: start from the snapshot point).
    pub replay_history: bool,
    /// The action table to use until the server sends one.
    pub actions: ActionTable,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            buffer_limit: 4096,
            command_limit: 256,
            drift_ppm: 10_000,
            lease_margin_ms: 250,
            command_timeout_ms: 5_000,
            max_attempts: 6,
            retry: Backoff::default(),
            seed: default_seed(),
            replay_history: true,
            actions: ActionTable::default(),
        }
    }
}

/// A seed per call, random where the OS gives `std` randomness; the bundle's driver always sets
/// its own.
#[cfg(not(all(target_arch = "wasm32", feature = "bundle")))]
fn default_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}

#[cfg(all(target_arch = "wasm32", feature = "bundle"))]
fn default_seed() -> u64 {
    0x5EED
}

/// Connection phase of the view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// First connection, no snapshot yet.
    Connecting,
    /// Snapshot applied, stream contiguous: the view is authoritative.
    Live,
    /// The server is unreachable; the view is provisional.
    Offline,
    /// Connected again (or a gap was seen); waiting for a snapshot. Input is buffered.
    Resyncing,
    /// Left the room.
    Closed,
}

impl Phase {
    pub fn as_str(&self) -> &'static str {
        match self {
            Phase::Connecting => "connecting",
            Phase::Live => "live",
            Phase::Offline => "offline",
            Phase::Resyncing => "resyncing",
            Phase::Closed => "closed",
        }
    }
}

/// What this session knows of its own host lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeaseState {
    /// Not the host.
    NotHost,
    /// Named host, but the lease cannot be trusted (new grant not yet confirmed, or after a
    /// reconnect, sleep or freeze until the next snapshot).
    Unknown,
    /// Held until the local `deadline`, which never outlives the server's view.
    Held { deadline: Instant },
    /// The local deadline passed without renewal.
    Expired,
    /// This session resigned, transferred or left; it stops acting as host at once.
    Relinquished,
}

impl LeaseState {
    pub fn as_str(&self) -> &'static str {
        match self {
            LeaseState::NotHost => "not_host",
            LeaseState::Unknown => "unknown",
            LeaseState::Held { .. } => "held",
            LeaseState::Expired => "expired",
            LeaseState::Relinquished => "relinquished",
        }
    }

    /// The lease once the page has slept or frozen: one held (or run out) cannot be trusted
    /// until the next snapshot. [`HostView::handle_wake`] applies it; the browser driver reads
    /// it for a sleep it has seen and not yet handed over.
    pub fn after_wake(self) -> LeaseState {
        if matches!(self, LeaseState::Held { .. } | LeaseState::Expired) {
            LeaseState::Unknown
        } else {
            self
        }
    }
}

/// Something the SDK reports to the app (or to its driver).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Event {
    Phase(Phase),
    /// A newer assignment was adopted (from the server, a snapshot, or a verified peer relay).
    HostChanged {
        assignment: Assignment,
        previous: Option<Assignment>,
        via: Source,
    },
    /// The provisional coordinator changed (`None`: no longer provisional, or nobody reachable).
    Provisional {
        coordinator: Option<ParticipantId>,
    },
    MembersChanged,
    Lease(LeaseState),
    /// A room event, applied once and in `seq` order.
    RoomEvent(RoomEvent),
    /// These items will never be delivered.
    Discontinuity(Gap),
    /// A command waits to be sent: a participant command made while not live (sent after the
    /// resync), or any command made while an older one of its kind waits for its result.
    CommandQueued {
        id: IdempotencyKey,
    },
    CommandAccepted {
        id: IdempotencyKey,
        seq: Seq,
    },
    CommandFailed {
        id: IdempotencyKey,
        error: CommandError,
    },
    /// The server sent something that breaks the protocol's rules (it is ignored).
    ProtocolViolation(Violation),
    /// WebRTC signalling from another member.
    Signal {
        from: ParticipantId,
        from_session: SessionId,
        data: Json,
    },
    /// The server sent an error frame, with its text (for people); `Unauthorized` means the
    /// join token must be refreshed.
    ServerError(ErrorCode, String),
    /// No welcome answered the hello in time, or the server has been silent for longer than its
    /// heartbeat allows: the driver should close this connection and reconnect (with its usual
    /// backoff).
    Stalled,
}

/// Where an adopted assignment came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    Server,
    Snapshot,
    /// A server-signed assignment relayed by a peer; never gives this session authority.
    Peer,
}

/// A broken protocol rule.
// (Variants in the order that made the bundle smallest: docs/performance.md.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Violation {
    /// A welcome while no connection is open.
    UnexpectedWelcome,
    /// An assignment or snapshot for another room.
    WrongRoom,
    /// Two assignments with the same epoch name different holders.
    ConflictingAssignment { epoch: Epoch },
}

/// Counters, for diagnostics and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub stale_dropped: u64,
    pub duplicates_dropped: u64,
    pub resyncs_requested: u64,
    pub buffer_overflows: u64,
    pub violations: u64,
    pub peer_assignments_dropped: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CmdState {
    /// Not sent yet: made while not live (participant actions only; sent after the resync), or
    /// behind an older command of its kind (sent once that one is decided).
    Queued,
    /// Rejected as retryable; send again at `until`.
    Backoff { until: Instant },
    /// Sent; resend with the same key at `resend_at` if no result came.
    InFlight { resend_at: Instant },
    /// Sent, then the connection dropped: the outcome is unknown until the next welcome.
    Unknown,
}

#[derive(Debug, Clone)]
struct PendingCommand {
    id: IdempotencyKey,
    action: Action,
    payload: Json,
    kind: ActionKind,
    /// For host commands: the epoch they were made in. They die with it.
    epoch: Option<Epoch>,
    attempts: u32,
    /// Attempts sent on this connection and not answered yet (answers come in the order the
    /// attempts went): while a later one is out, the answer to an earlier one decides nothing.
    out: u32,
    /// When it was made: no attempt goes [`RESEND_WINDOW_MS`] after, once one went (the first
    /// attempt went then or later, so this errs early).
    made_at: Instant,
    state: CmdState,
}

#[derive(Debug, Clone)]
struct Grant {
    token: Token,
    epoch: Option<Epoch>,
    actions: Vec<Action>,
    expires_at: Instant,
}

/// How many recent probe echoes a confirmation may answer.
const ECHOES_KEPT: usize = 4;

/// Commands of a kind out at once, at most (each is answered after its event went out: one at a
/// time, a room's host published one event per round trip).
pub const PIPELINE: usize = 16;

/// The longest server retry time a command waits out; past it the command fails with the
/// refusal's code.
pub const MAX_RETRY_AFTER_MS: u64 = 60_000;

fn is_relinquish(action: &Action) -> bool {
    matches!(action.as_str(), ACTION_RESIGN | ACTION_TRANSFER)
}

/// The SDK's cached, self-correcting view of a room's host.
#[derive(Debug)]
pub struct HostView {
    config: Config,
    rng: SplitMix64,
    phase: Phase,
    /// Latest local time seen; inputs that go back in time are clamped to it.
    now: Instant,
    me: Option<ParticipantId>,
    session: Option<SessionId>,
    /// The newest assignment observed: the epoch floor.
    current: Option<Assignment>,
    /// The signed form of `current`, when the server signed it, for relaying to peers.
    current_signed: Option<SignedAssignment>,
    have_snapshot: bool,
    /// Last applied `seq`.
    cursor: Seq,
    /// The cursor asked for in the pending hello/resume (`None`: no history requested).
    resume_asked: Option<Seq>,
    /// When the oldest hello/resume no welcome has answered yet was sent: the anchor for a
    /// snapshot's lease time. It never moves forward while one is unanswered, as a welcome
    /// answers the oldest and may have been built before any later one was sent.
    resync_sent_at: Instant,
    /// Hello and resume frames sent on this connection that no welcome has answered yet.
    unanswered: u32,
    awaiting_welcome: bool,
    /// Awaiting a welcome: `Stalled` if none came by then; else resync for a missing grant.
    resync_retry_at: Option<Instant>,
    /// Connections given up since the last welcome (`Stalled`): each next hello waits twice as
    /// long (up to 32×: 160 s by default), so that a server slowed by a reconnect storm is not
    /// dialled again and again by clients whose welcome was merely late, and a large welcome on
    /// a slow link (a browser hands a frame over only once all of it has arrived) gets through.
    stalls: u8,
    /// Welcomes given up on since the last wake (a welcome does not reset it): a resume's wait
    /// grows with them (its jitter up to `base · 2^slow`), so that a link slow enough to miss one
    /// large welcome gives the next resume's longer, while a view that never missed one notices
    /// a dead connection within the first timeout.
    slow: u8,
    /// The end of the current silence window of a connection: a window in which no frame came
    /// (`heard` still false at its end) means the connection is dead, as the server sends a
    /// heartbeat after [`HEARTBEAT_MS`] of silence. A window is [`HEARTBEAT_MS`] plus the command
    /// timeout, so a dead connection is noticed 20 to 40 s after its last frame by default.
    silence_check_at: Option<Instant>,
    /// A frame came in the current silence window.
    heard: bool,
    /// A silence check that heard nothing ran late and decided nothing (the next one decides).
    late: bool,
    members: Vec<Member>,
    actions: ActionTable,
    /// Sorted, no duplicates. (This and `buffer` are sorted vectors rather than B-trees: the two
    /// B-tree instantiations were ~15 KB of wasm. An insert out of order moves part of the
    /// vector, which stays cheap at the buffer limit; in order or reversed it moves nothing.)
    reachable: Vec<ParticipantId>,
    provisional: Option<ParticipantId>,
    /// Sorted by `seq`, one item per `seq`.
    buffer: VecDeque<Item>,
    lease: LeaseState,
    /// The latest probes echoed, `(nonce, sent_at)`, newest last: a confirmation may answer any
    /// of them when the round trip is longer than the probe interval.
    echoes: VecDeque<(u64, Instant)>,
    host_grant: Option<Grant>,
    participant_grant: Option<Grant>,
    commands: Vec<PendingCommand>,
    transmits: VecDeque<ClientMsg>,
    events: VecDeque<Event>,
    stats: Stats,
}

impl HostView {
    pub fn new(mut config: Config) -> Self {
        config.command_timeout_ms = config.command_timeout_ms.clamp(100, 600_000);
        let rng = SplitMix64::new(config.seed);
        let actions = config.actions.clone();
        Self {
            config,
            rng,
            phase: Phase::Connecting,
            now: Instant::ZERO,
            me: None,
            session: None,
            current: None,
            current_signed: None,
            have_snapshot: false,
            cursor: Seq::ZERO,
            resume_asked: None,
            resync_sent_at: Instant::ZERO,
            unanswered: 0,
            stalls: 0,
            slow: 0,
            silence_check_at: None,
            heard: false,
            late: false,
            awaiting_welcome: false,
            resync_retry_at: None,
            members: Vec::new(),
            actions,
            reachable: Vec::new(),
            provisional: None,
            buffer: VecDeque::new(),
            lease: LeaseState::NotHost,
            echoes: VecDeque::new(),
            host_grant: None,
            participant_grant: None,
            commands: Vec::new(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            stats: Stats::default(),
        }
    }

    // ----- getters -------------------------------------------------------------------------

    pub fn phase(&self) -> Phase {
        self.phase
    }
    /// The newest assignment observed (authoritative only while [`Phase::Live`]).
    pub fn assignment(&self) -> Option<&Assignment> {
        self.current.as_ref()
    }
    /// The signed form of the current assignment, to relay to peers.
    pub fn signed_assignment(&self) -> Option<&SignedAssignment> {
        self.current_signed.as_ref()
    }
    pub fn epoch(&self) -> Option<Epoch> {
        self.current.as_ref().map(|a| a.epoch)
    }
    pub fn me(&self) -> Option<&ParticipantId> {
        self.me.as_ref()
    }
    pub fn session(&self) -> Option<&SessionId> {
        self.session.as_ref()
    }
    /// Whether the newest assignment names this session as host (with or without authority).
    pub fn is_named_host(&self) -> bool {
        match (&self.current, &self.me, &self.session) {
            (Some(a), Some(me), Some(s)) => a.names(me, s),
            _ => false,
        }
    }
    /// Whether this session may issue host commands at `now`: live, named host by the server,
    /// holding a host token for the current epoch, and before its local lease deadline.
    pub fn has_authority(&self, now: Instant) -> bool {
        self.host_gate(now.max(self.now)).is_ok()
    }
    /// The lease as of the last input. See [`HostView::lease_at`] for a reading between inputs.
    pub fn lease(&self) -> LeaseState {
        self.lease
    }
    /// The lease as of `now`: one held past its deadline reads `Expired` before the timeout that
    /// records it (and emits the `Lease` event) is handled, as [`HostView::has_authority`] does.
    pub fn lease_at(&self, now: Instant) -> LeaseState {
        match self.lease {
            LeaseState::Held { deadline } if now.max(self.now) >= deadline => LeaseState::Expired,
            lease => lease,
        }
    }
    /// The provisional coordinator, shown while the server is unreachable. It has no authority.
    pub fn provisional(&self) -> Option<&ParticipantId> {
        self.provisional.as_ref()
    }
    /// Members of the last committed membership, in election order.
    pub fn members(&self) -> &[Member] {
        &self.members
    }
    pub fn actions(&self) -> &ActionTable {
        &self.actions
    }
    /// The last applied `seq`.
    pub fn cursor(&self) -> Seq {
        self.cursor
    }
    pub fn stats(&self) -> Stats {
        self.stats
    }
    /// Commands not yet resolved: `(id, action, queued_offline)`.
    pub fn pending(&self) -> impl Iterator<Item = (&IdempotencyKey, &Action, bool)> {
        self.commands
            .iter()
            .map(|c| (&c.id, &c.action, matches!(c.state, CmdState::Queued)))
    }
    pub fn buffered(&self) -> usize {
        self.buffer.len()
    }

    // ----- outputs -------------------------------------------------------------------------

    /// The next frame to send, in order.
    pub fn poll_transmit(&mut self) -> Option<ClientMsg> {
        self.transmits.pop_front()
    }
    /// The next event for the app, in order.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }
    /// When [`HostView::handle_timeout`] should next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let lease = match self.lease {
            LeaseState::Held { deadline } => Some(deadline),
            _ => None,
        };
        let cmds = self.commands.iter().filter_map(|c| match c.state {
            CmdState::InFlight { resend_at } => Some(resend_at),
            CmdState::Backoff { until } => Some(until),
            _ => None,
        });
        lease
            .into_iter()
            .chain(cmds)
            .chain(self.resync_retry_at)
            .chain(self.silence_check_at)
            .min()
    }

    // ----- inputs --------------------------------------------------------------------------

    /// Every input's clock reading. Time never goes back, and a lease whose deadline has passed
    /// expires on whichever input comes first, not only on the timer (which a hidden tab runs
    /// late).
    #[inline(never)] // one copy in the wasm, not one per input
    fn tick(&mut self, now: Instant) -> Instant {
        self.now = self.now.max(now);
        if let LeaseState::Held { deadline } = self.lease {
            if self.now >= deadline {
                self.set_lease(LeaseState::Expired);
            }
        }
        self.now
    }

    /// A connection to the server opened. Queues the hello with `join_token` (the token goes in
    /// the first frame, never in a URL). Once per connection, after `handle_disconnected` for
    /// the last one: a session and the tokens bound to it belong to their connection (the
    /// browser driver dials no second connection while one is open or opening).
    pub fn handle_connected(&mut self, now: Instant, join_token: Token) {
        let now = self.tick(now);
        if self.phase == Phase::Closed {
            return;
        }
        let resume = if self.have_snapshot || self.config.replay_history {
            Some(self.cursor)
        } else {
            None
        };
        // The buffer is kept: what it holds is the room's log past the cursor, which the hello
        // resumes from (a replay cut to its newest items would otherwise announce them lost).
        self.echoes.clear();
        self.resume_asked = resume;
        self.resync_sent_at = now;
        self.unanswered = 1;
        self.awaiting_welcome = true;
        self.silence_check_at = Some(self.silence_window(now));
        self.resync_retry_at = Some(
            now.add_ms(
                self.config
                    .command_timeout_ms
                    .saturating_mul(1 << self.stalls),
            ),
        );
        self.transmits.push_back(ClientMsg::Hello {
            token: join_token,
            resume,
            epoch_seen: self.epoch(),
        });
        let next = if self.have_snapshot {
            Phase::Resyncing
        } else {
            Phase::Connecting
        };
        self.set_phase(next);
        // The provisional coordinator stays until the welcome: a server that takes the socket
        // but not yet the hello (a reconnect storm) is not reachable yet, and this page showed
        // no coordinator while the others still showed theirs.
        self.update_provisional();
    }

    /// The connection closed or failed. The view becomes provisional; host authority ends.
    pub fn handle_disconnected(&mut self, now: Instant) {
        self.tick(now);
        if self.phase == Phase::Closed {
            return;
        }
        self.awaiting_welcome = false;
        self.unanswered = 0;
        self.resync_retry_at = None;
        self.silence_check_at = None;
        self.echoes.clear();
        // The session is gone: its host token is worthless, its lease will lapse on the server.
        self.host_grant = None;
        self.participant_grant = None;
        self.session = None;
        if !matches!(self.lease, LeaseState::NotHost) {
            self.set_lease(LeaseState::Unknown);
        }
        // Commands sent and not decided: unknown. A host command fails `Interrupted` now: after
        // any reconnect it would (a new welcome brings no host token before its resend is
        // checked), and its promise waited on the outage meanwhile; so does one already unknown
        // (its resend came due during a resync). Host commands are never kept offline (one queued
        // behind another never went: `NotAuthoritative`).
        let mut i = 0;
        while i < self.commands.len() {
            let c = &mut self.commands[i];
            if c.kind == ActionKind::Host {
                // (One whose every attempt was refused, waiting to go again: certainly not
                // applied, and not authoritative now.)
                self.refuse(i, CommandError::NotAuthoritative);
                continue;
            }
            // (One refused with a retry time keeps it: it goes again then, with its key, not
            // at the welcome, where it was refused again and spent an attempt.)
            if !matches!(c.state, CmdState::Backoff { .. } | CmdState::Queued) {
                c.state = CmdState::Unknown;
            }
            c.out = 0; // their answers went with the connection
            i += 1;
        }
        self.set_phase(Phase::Offline);
        self.update_provisional();
    }

    /// The page slept, froze or was hidden long enough that timers cannot be trusted. The lease
    /// is unknown until the next snapshot; a connected view resyncs.
    pub fn handle_wake(&mut self, now: Instant) {
        let now = self.tick(now);
        // The page or the network changed (`online`, shown again): the connections given up
        // before say nothing of the next, which waits the first timeout again; a hello awaited
        // for up to 160 s gets it too (and a resume or a grant awaited, no more than it had).
        self.stalls = 0;
        self.slow = 0;
        let first = now.add_ms(self.config.command_timeout_ms);
        self.resync_retry_at = self.resync_retry_at.map(|t| t.min(first));
        self.set_lease(self.lease.after_wake());
        if matches!(self.phase, Phase::Live | Phase::Resyncing) {
            self.request_resync(now, false);
        }
    }

    /// A peer became reachable over WebRTC.
    pub fn handle_peer_seen(&mut self, now: Instant, peer: ParticipantId) {
        self.handle_peer(now, peer, true);
    }

    /// A peer stopped being reachable over WebRTC.
    pub fn handle_peer_lost(&mut self, now: Instant, peer: &ParticipantId) {
        self.handle_peer(now, peer.clone(), false);
    }

    /// A peer became reachable over WebRTC (`reachable`), or stopped being so.
    pub fn handle_peer(&mut self, now: Instant, peer: ParticipantId, reachable: bool) {
        self.tick(now);
        match (self.reachable.binary_search(&peer), reachable) {
            (Err(i), true) => self.reachable.insert(i, peer),
            (Ok(i), false) => {
                self.reachable.remove(i);
            }
            _ => {}
        }
        self.update_provisional();
    }

    /// A server-signed assignment relayed by a peer, **already verified by the driver** (room, key
    /// id, signature). Adopted only after a first snapshot and only if newer; it never gives this
    /// session authority. Returns whether it was adopted.
    pub fn handle_peer_assignment(&mut self, now: Instant, signed: SignedAssignment) -> bool {
        self.tick(now);
        if !self.have_snapshot || self.phase == Phase::Closed {
            self.stats.peer_assignments_dropped += 1;
            return false;
        }
        let adopted = self.adopt(signed, Source::Peer);
        if !adopted {
            self.stats.peer_assignments_dropped += 1;
        }
        self.update_provisional();
        adopted
    }

    /// Timers: the lease deadline and command resends. Extra calls are harmless.
    pub fn handle_timeout(&mut self, now: Instant) {
        let now = self.tick(now); // expires a lease whose deadline passed
        if self.resync_retry_at.is_some_and(|t| now >= t) {
            self.resync_retry_at = None;
            if self.awaiting_welcome {
                // The hello or a resume went unanswered for a whole timeout, where the server
                // answers each at once: the connection is presumed dead (half-open after a sleep
                // or a network change, which may never report a close). Start over: the driver
                // drops it and dials again.
                self.resync_retry_at = Some(now.add_ms(self.config.command_timeout_ms));
                self.stalls = (self.stalls + 1).min(5);
                self.slow = (self.slow + 1).min(6);
                self.events.push_back(Event::Stalled);
            } else if self.needs_participant_grant() {
                self.request_resync(now, true);
            }
        }
        if let Some(t) = self.silence_check_at.filter(|t| now >= *t) {
            // A welcome still awaited has its own, growing, limit (`resync_retry_at`): a large
            // one on a slow link is silence until all of it has arrived. A check that runs over
            // a second late (the page's event loop was blocked, or a hidden tab's timers were
            // throttled) may run before frames that arrived meanwhile: it decides nothing, but
            // the next one decides however late it runs (a hidden tab's checks all run late).
            // That grace is spent only by a check it saved: one that heard frames leaves it.
            let heard = self.heard || self.awaiting_welcome;
            if heard || (now > t.add_ms(1_000) && !self.late) {
                self.late = !heard;
                self.heard = false;
                self.silence_check_at = Some(self.silence_window(now));
            } else {
                self.silence_check_at = None;
                self.events.push_back(Event::Stalled);
            }
        }
        // Oldest first (one behind an older one of its kind that waits to go again waits too:
        // `send`); a resend removes at most its own command (failing it), and those queued
        // behind it then go (`flush_queued`).
        let mut i = 0;
        let mut resent = false;
        while i < self.commands.len() {
            let before = self.commands.len();
            if match self.commands[i].state {
                CmdState::InFlight { resend_at } => now >= resend_at,
                CmdState::Backoff { until } => now >= until,
                _ => false,
            } {
                resent = true;
                self.resend(now, i);
            }
            if self.commands.len() == before {
                i += 1;
            }
        }
        if resent {
            self.flush_queued(now);
        }
    }

    /// The in-order case of a room event, told by its seq alone (for a driver that decoded the
    /// event itself and hands it on as its own object). When the view is live, nothing is
    /// buffered and `seq` is the next one, this does what `handle_server` with the event would,
    /// except that no [`Event::RoomEvent`] is queued: the caller delivers the event, and returns
    /// `true`. Otherwise it changes nothing and returns `false`; the caller then passes the
    /// whole decoded frame to `handle_server`.
    ///
    /// It takes no time: applying an event in order depends on none, and the next input that
    /// does (a timeout, a command, any other frame) brings its own reading of the clock.
    pub fn handle_event_seq(&mut self, seq: Seq) -> bool {
        self.heard = true;
        if self.phase != Phase::Live || !self.buffer.is_empty() || seq != self.cursor.next() {
            return false;
        }
        self.cursor = seq;
        true
    }

    /// One decoded frame from the server.
    pub fn handle_server(&mut self, now: Instant, msg: ServerMsg) {
        let now = self.tick(now);
        self.heard = true;
        if matches!(self.phase, Phase::Offline | Phase::Closed) {
            // A frame from a connection already reported closed: nothing it says is current.
            return;
        }
        match msg {
            ServerMsg::Welcome {
                you,
                session,
                snapshot,
                missed,
                discontinuity,
            } => self.handle_welcome(now, you, session, snapshot, missed, discontinuity),
            ServerMsg::Assignment(a) => self.handle_item(now, Item::Assignment(a)),
            ServerMsg::Event(e) => self.handle_item(now, Item::Event(e)),
            ServerMsg::LeaseProbe { nonce, .. } => {
                if matches!(self.lease, LeaseState::Relinquished) {
                    // Giving the role up: let the lease lapse even if the resign is lost.
                    return;
                }
                // Echo at once: the anchor of the local deadline is this send time.
                if self.echoes.len() == ECHOES_KEPT {
                    self.echoes.pop_front();
                }
                self.echoes.push_back((nonce, now));
                self.transmits.push_back(ClientMsg::LeaseEcho { nonce });
            }
            ServerMsg::LeaseConfirm {
                nonce,
                epoch,
                remaining_ms,
            } => self.handle_confirm(now, nonce, epoch, remaining_ms),
            ServerMsg::Capability {
                role,
                token,
                epoch,
                actions,
                expires_in_ms,
            } => {
                let grant = Grant {
                    token,
                    epoch,
                    actions,
                    expires_at: now
                        .add_ms(expires_in_ms.saturating_sub(self.config.lease_margin_ms)),
                };
                match role {
                    Role::Host => {
                        if epoch.is_some() && epoch == self.epoch() && self.is_named_host() {
                            // A lease already held (a welcome's, before its capability) may act
                            // from now on: said again, or nothing would tell the app.
                            if self.host_grant.replace(grant).is_none()
                                && matches!(self.lease, LeaseState::Held { .. })
                            {
                                self.events.push_back(Event::Lease(self.lease));
                            }
                        }
                    }
                    Role::Participant => {
                        self.participant_grant = Some(grant);
                        self.flush_queued(now);
                    }
                }
            }
            ServerMsg::Presence { member, online } => {
                self.presence(member, online);
                self.events.push_back(Event::MembersChanged);
            }
            ServerMsg::PresenceBatch { joined, left } => {
                for m in left {
                    self.presence(m, false);
                }
                for m in joined {
                    self.presence(m, true);
                }
                self.events.push_back(Event::MembersChanged);
            }
            ServerMsg::CommandResult { id, outcome } => {
                self.handle_result(now, id, outcome);
                // A command decided may have held later ones back (`send`).
                self.flush_queued(now);
            }
            ServerMsg::Discontinuity(gap) => {
                if self.phase == Phase::Live && gap.from <= self.cursor.next() {
                    if gap.to > self.cursor {
                        self.events.push_back(Event::Discontinuity(Gap {
                            from: self.cursor.next().max(gap.from),
                            to: gap.to,
                        }));
                        self.cursor = gap.to;
                    }
                    self.drain_buffer(now);
                } else {
                    self.request_resync(now, false);
                }
            }
            ServerMsg::Signal {
                from,
                from_session,
                data,
            } => self.events.push_back(Event::Signal {
                from,
                from_session,
                data,
            }),
            ServerMsg::Error { code, message } => {
                self.events.push_back(Event::ServerError(code, message));
                // Put out of the room by the server, or speaking a protocol version it no longer
                // takes: joining again would undo a kick, or knock on a closed room (or with the
                // same version) forever, so the view closes (pending commands fail `Closed`).
                if matches!(
                    code,
                    ErrorCode::Kicked | ErrorCode::RoomClosed | ErrorCode::UnsupportedVersion
                ) {
                    self.leave(now);
                }
            }
            // Heard (above): the silence window is satisfied.
            ServerMsg::Heartbeat => {}
        }
    }

    /// One member's presence change. `members` stays in election order, and an entry is found
    /// by binary search on its election key (join seq, id, session): the server gives a session
    /// one join seq, so a leave names the entry its join added. A join or leave in a room of a
    /// thousand costs every member ten comparisons, not a pass over the list. A leave whose key
    /// is not listed (a server that changed the session's join seq) still removes the session's
    /// entries, by a scan.
    fn presence(&mut self, member: Member, online: bool) {
        match self.members.binary_search_by(|m| election_cmp(m, &member)) {
            Ok(at) if online => self.members[at] = member,
            Ok(at) => drop(self.members.remove(at)),
            Err(at) if online => self.members.insert(at, member),
            Err(_) => self
                .members
                .retain(|m| !(m.id == member.id && m.session == member.session)),
        }
    }

    fn handle_welcome(
        &mut self,
        now: Instant,
        you: ParticipantId,
        session: SessionId,
        snapshot: Snapshot,
        missed: Vec<Item>,
        discontinuity: Option<Gap>,
    ) {
        if !self.awaiting_welcome && self.phase != Phase::Live {
            self.violation(Violation::UnexpectedWelcome);
            return;
        }
        if let Some(a) = &self.current {
            if a.room != snapshot.room {
                self.violation(Violation::WrongRoom);
                return;
            }
        }
        self.session = Some(session);
        self.me = Some(you);
        // The authoritative state replaces the view (never with an older epoch). On a first
        // welcome it does so before the replay: the assignments in the room's history are then
        // older and dropped as stale (a late joiner was told of every past host, after its view
        // already showed the current one). A resuming view applies it after the replay, so that
        // no assignment it missed is lost: each comes in seq order among the events.
        let mut current = Some(snapshot.current);
        if !self.have_snapshot {
            if let Some(c) = current.take() {
                self.adopt(c, Source::Snapshot);
            }
        }
        self.awaiting_welcome = false;
        self.unanswered = self.unanswered.saturating_sub(1);
        self.resync_retry_at = None;
        self.stalls = 0;

        // Items after our cursor up to the snapshot point, in order, each once: those replayed
        // and those the stream brought while a resume was asked for (held in the buffer), merged
        // in the buffer (a replayed copy replaces a held one). A hole neither fills is announced
        // where the next item begins, and one at the end if this welcome answers a resume or the
        // server said it could not replay that far: a discontinuity the server announces never
        // drops an item the view holds (it replays the newest items within its byte budget, and
        // a lagging view may hold older ones).
        let asked = self.resume_asked.take();
        while asked.is_none() && self.pop_through(snapshot.seq).is_some() {
            // No history was asked for: the snapshot stands for what the stream brought before it.
            self.stats.duplicates_dropped += 1;
        }
        for item in missed {
            self.hold(item);
        }
        while let Some(item) = self.pop_through(snapshot.seq) {
            let seq = item.seq();
            if seq <= self.cursor {
                self.stats.duplicates_dropped += 1;
                continue;
            }
            if seq > self.cursor.next() {
                self.events.push_back(Event::Discontinuity(Gap {
                    from: self.cursor.next(),
                    to: Seq(seq.0 - 1),
                }));
            }
            self.apply(now, item);
        }
        let mut reach = discontinuity.map_or(self.cursor, |g| g.to);
        if asked.is_some() {
            reach = reach.max(snapshot.seq);
        }
        if reach > self.cursor {
            // Asked for or announced, and neither replayed nor held.
            self.events.push_back(Event::Discontinuity(Gap {
                from: self.cursor.next(),
                to: reach,
            }));
            self.cursor = reach;
        }
        self.cursor = self.cursor.max(snapshot.seq);
        if let Some(c) = current {
            self.adopt(c, Source::Snapshot);
        }

        self.have_snapshot = true;
        // Into election order by the presence path (the server sends them in that order, so
        // each lands at the end); a session listed twice under one key is kept once.
        self.members = Vec::with_capacity(snapshot.members.len());
        for m in snapshot.members {
            self.presence(m, true);
        }
        if !snapshot.actions.host.is_empty() || !snapshot.actions.participant.is_empty() {
            self.actions = snapshot.actions;
        }
        self.events.push_back(Event::MembersChanged);
        let lease = if self.is_named_host() && matches!(self.lease, LeaseState::Relinquished) {
            LeaseState::Relinquished // a resign or transfer is on its way; never take it back
        } else if self.is_named_host() {
            match snapshot.lease_remaining_ms {
                // Anchored at the oldest resume it may answer: a confirmation since (a welcome
                // came between two resumes) may hold a later deadline, which stands.
                Some(r) => self.local_deadline(self.resync_sent_at, r, now),
                None => LeaseState::Unknown,
            }
        } else {
            LeaseState::NotHost
        };
        self.set_lease(lease);
        self.set_provisional(None);
        self.drain_buffer(now);
    }

    /// `anchor + remaining·(1−ρ) − margin`, as a lease state at `now`; never earlier than a
    /// deadline the lease already holds (the caller's reading of this epoch's lease may be older
    /// than the one that set it).
    fn local_deadline(&self, anchor: Instant, remaining_ms: u64, now: Instant) -> LeaseState {
        let drift = remaining_ms.saturating_mul(self.config.drift_ppm) / 1_000_000;
        let keep = remaining_ms
            .saturating_sub(drift)
            .saturating_sub(self.config.lease_margin_ms);
        let mut deadline = anchor.add_ms(keep);
        if let LeaseState::Held { deadline: held } = self.lease {
            deadline = deadline.max(held);
        }
        // (The anchor is a past send: no time kept is `Expired` too.)
        if deadline <= now {
            LeaseState::Expired
        } else {
            LeaseState::Held { deadline }
        }
    }

    fn handle_confirm(&mut self, now: Instant, nonce: u64, epoch: Epoch, remaining_ms: u64) {
        let Some(&(_, sent_at)) = self.echoes.iter().find(|(n, _)| *n == nonce) else {
            return;
        };
        if Some(epoch) != self.epoch() || !self.is_named_host() {
            return;
        }
        if matches!(self.lease, LeaseState::Relinquished) || self.phase != Phase::Live {
            return;
        }
        // A confirmation of an older echo never shortens a deadline a newer one set.
        let lease = self.local_deadline(sent_at, remaining_ms, now);
        self.set_lease(lease);
    }

    fn handle_item(&mut self, now: Instant, item: Item) {
        match self.phase {
            Phase::Live => {
                let seq = item.seq();
                if seq <= self.cursor {
                    self.stats.duplicates_dropped += 1;
                } else if seq == self.cursor.next() {
                    self.apply(now, item);
                    self.drain_buffer(now);
                } else {
                    // A gap: keep what we have and ask the server to fill it.
                    self.buffer_item(item);
                    self.request_resync(now, false);
                }
            }
            Phase::Connecting | Phase::Resyncing => self.buffer_item(item),
            Phase::Offline | Phase::Closed => {}
        }
    }

    fn buffer_item(&mut self, item: Item) {
        let at = self.buffer.binary_search_by_key(&item.seq(), Item::seq);
        if self.buffer.len() >= self.config.buffer_limit && at.is_err() {
            // Overflow: drop the buffer and resync from the cursor; the welcome replays it all.
            self.stats.buffer_overflows += 1;
            self.buffer.clear();
            let now = self.now;
            self.request_resync(now, true);
            return;
        }
        self.hold(item);
    }

    /// The buffer's first item, if its seq is at most `upto`.
    fn pop_through(&mut self, upto: Seq) -> Option<Item> {
        if self.buffer.front()?.seq() <= upto {
            self.buffer.pop_front()
        } else {
            None
        }
    }

    /// Into the buffer in seq order; a second copy of a seq replaces the first, as a map insert
    /// would. Unbounded here: `buffer_item` bounds what the stream adds, and a welcome adds at
    /// most its replay (`MAX_REPLAY`) up to its snapshot point.
    fn hold(&mut self, item: Item) {
        match self.buffer.binary_search_by_key(&item.seq(), Item::seq) {
            Ok(i) => self.buffer[i] = item,
            Err(i) => self.buffer.insert(i, item),
        }
    }

    /// Applies buffered items contiguous from the cursor. A gap left behind asks for a resume.
    fn drain_buffer(&mut self, now: Instant) {
        while let Some(seq) = self.buffer.front().map(Item::seq) {
            if seq <= self.cursor {
                self.buffer.pop_front();
                self.stats.duplicates_dropped += 1;
            } else if seq == self.cursor.next() {
                if let Some(item) = self.buffer.pop_front() {
                    self.apply(now, item);
                }
            } else {
                break;
            }
        }
        if self.buffer.is_empty() {
            if !self.awaiting_welcome && self.phase != Phase::Live {
                self.set_phase(Phase::Live);
                self.revalidate_unknown(now);
            }
        } else {
            self.request_resync(now, false);
        }
    }

    /// Applies one in-order stream item.
    fn apply(&mut self, _now: Instant, item: Item) {
        self.cursor = item.seq();
        match item {
            Item::Assignment(a) => {
                self.adopt(a, Source::Server);
            }
            Item::Event(e) => self.events.push_back(Event::RoomEvent(e)),
        }
    }

    /// Asks the server for a fresh welcome resuming after the cursor, on the open connection.
    /// `force`: ask again even if a resume from this cursor is pending (the buffer was dropped).
    fn request_resync(&mut self, now: Instant, force: bool) {
        if matches!(self.phase, Phase::Offline | Phase::Closed) {
            return;
        }
        if !force && self.awaiting_welcome && self.resume_asked == Some(self.cursor) {
            return; // already asked from exactly here
        }
        self.stats.resyncs_requested += 1;
        if self.unanswered == 0 {
            // With hellos or resumes unanswered, the next welcome answers the oldest: its lease
            // time stays anchored there, never later than the server's reading of it.
            self.resync_sent_at = now;
        }
        self.unanswered = self.unanswered.saturating_add(1);
        self.awaiting_welcome = true;
        // Backed off by the welcomes given up on since the last wake (`slow`): a lifetime count
        // of resyncs held every resume of a long-lived view to the cap, up to 20 s to notice a
        // dead connection instead of 5.
        let retry = self
            .config
            .retry
            .retry_delay_ms(self.slow.into(), None, &mut self.rng);
        self.resync_retry_at = Some(now.add_ms(self.config.command_timeout_ms + retry));
        self.resume_asked = Some(self.cursor);
        self.transmits.push_back(ClientMsg::Resume {
            cursor: self.cursor,
        });
        if self.have_snapshot {
            self.set_phase(Phase::Resyncing);
        }
    }

    /// The stale-drop rule. Returns whether `signed` became the current assignment.
    fn adopt(&mut self, signed: SignedAssignment, via: Source) -> bool {
        let a = &signed.assignment;
        if let Some(cur) = &self.current {
            if a.room != cur.room {
                self.violation(Violation::WrongRoom);
                return false;
            }
            if a.epoch < cur.epoch {
                self.stats.stale_dropped += 1;
                return false;
            }
            if a.epoch == cur.epoch {
                if a.same_holder(cur) {
                    self.stats.duplicates_dropped += 1;
                    if self.current_signed.as_ref().is_none_or(|s| s.sig.is_none())
                        && signed.sig.is_some()
                    {
                        self.current_signed = Some(signed);
                    }
                } else {
                    self.violation(Violation::ConflictingAssignment { epoch: a.epoch });
                }
                return false;
            }
        }
        let previous = self.current.replace(signed.assignment.clone());
        let assignment = signed.assignment.clone();
        self.current_signed = Some(signed);
        // A new epoch ends every host token and every unsent host command of older epochs.
        self.host_grant = None;
        self.echoes.clear();
        self.fail_all(CommandError::StaleEpoch, Some(assignment.epoch));
        let lease = if self.is_named_host() {
            // A new grant: authority begins with the first confirmed probe, not with the news
            // (and never with a peer's relay of it).
            LeaseState::Unknown
        } else {
            LeaseState::NotHost
        };
        self.set_lease(lease);
        self.events.push_back(Event::HostChanged {
            assignment,
            previous,
            via,
        });
        true
    }

    fn handle_result(&mut self, now: Instant, id: IdempotencyKey, outcome: Outcome) {
        let Some(i) = self.commands.iter().position(|c| c.id == id) else {
            // Not ours (a late duplicate, or a frame someone sent around the SDK). A rejection
            // still tells us the view is behind: adopt what it carries and reload.
            if let Outcome::Rejected { code, current, .. } = outcome {
                if let Some(a) = current {
                    self.adopt(a, Source::Server);
                }
                if matches!(code, RejectCode::StaleEpoch | RejectCode::NotHost) {
                    self.request_resync(now, false);
                }
            }
            return;
        };
        match outcome {
            Outcome::Accepted { seq } => {
                self.commands.remove(i);
                self.events.push_back(Event::CommandAccepted { id, seq });
                if seq > self.cursor && self.phase == Phase::Live && self.buffer.is_empty() {
                    // The server publishes the event before it answers the sender, on the same
                    // ordered connection: not having it means it was lost.
                    self.request_resync(now, false);
                }
            }
            Outcome::Rejected {
                code,
                current,
                retry_after_ms,
            } => {
                // An attempt resent since (no answer came in time) is still out: its answer
                // decides, as this one may have been refused where that one is applied (a
                // transfer to a member back in between, a token refreshed). What the refusal
                // carries is taken all the same.
                let c = &mut self.commands[i];
                c.out = c.out.saturating_sub(1);
                let later = c.out > 0;
                // A retryable refusal leaves the command to go again: no longer in flight, a
                // newer epoch this brings fails a host command of an older one now (it was
                // resent into an epoch that is over, and failed `Interrupted`). Any other answer
                // decides the command itself, below.
                if code.is_retryable() && !later {
                    c.state = CmdState::Backoff { until: now };
                }
                if let Some(a) = current {
                    self.adopt(a, Source::Server);
                }
                if matches!(code, RejectCode::StaleEpoch | RejectCode::NotHost) {
                    // Our view was behind the server's: reload the authoritative state.
                    self.request_resync(now, false);
                }
                let Some(i) = self
                    .commands
                    .iter()
                    .position(|c| c.id == id)
                    .filter(|_| !later)
                else {
                    return; // adopting the newer assignment already failed it, or a later answer decides
                };
                // A retry time past a minute (a room's byte budget far behind, or a hostile
                // server's u64::MAX) is the app's to decide: the command fails with the
                // refusal's code now rather than leaving its promise pending for that long.
                let retry = code.is_retryable() && retry_after_ms <= Some(MAX_RETRY_AFTER_MS);
                let kind = self.commands[i].kind;
                if retry_after_ms == Some(0)
                    && kind == ActionKind::Host
                    && self.commands[i].epoch != self.epoch()
                {
                    // Held (not looked at) behind one refused for an epoch that is over.
                    self.fail_at(i, CommandError::StaleEpoch);
                    return;
                }
                if retry_after_ms == Some(0) && self.commands[..i].iter().any(|o| o.kind == kind) {
                    // Held by the server behind an older one of its kind (refused, or held in
                    // turn), so not applied: it goes again right behind that one
                    // (`flush_queued`: at once if that one is out again, the server deciding
                    // that one first), this attempt not counted.
                    let c = &mut self.commands[i];
                    c.attempts = c.attempts.saturating_sub(1);
                    c.state = CmdState::Queued;
                    return;
                }
                if retry && self.commands[i].attempts < self.config.max_attempts {
                    let attempt = self.commands[i].attempts;
                    let delay =
                        self.config
                            .retry
                            .retry_delay_ms(attempt, retry_after_ms, &mut self.rng);
                    self.commands[i].state = CmdState::Backoff {
                        until: now.add_ms(delay),
                    };
                    return;
                }
                let error = if retry {
                    CommandError::Timeout
                } else {
                    CommandError::from_reject(code)
                };
                let c = &self.commands[i];
                if is_relinquish(&c.action)
                    && matches!(self.lease, LeaseState::Relinquished)
                    && c.epoch == self.epoch()
                {
                    // The server refused the resign, so it certainly did not happen: still the
                    // named host, with authority again from the next confirmed probe. (When the
                    // outcome is unknown the session stays relinquished and lets the lease lapse.)
                    self.set_lease(LeaseState::Unknown);
                }
                if retry || !code.is_retryable() {
                    self.fail_at(i, error);
                } else {
                    // Refused for too long: if this answered a resend, an earlier attempt may
                    // have been applied (the rate limits come before the key's look-up), and it
                    // fails `Interrupted`.
                    self.refuse(i, error);
                }
                if code == RejectCode::LeaseExpired && matches!(self.lease, LeaseState::Held { .. })
                {
                    self.set_lease(LeaseState::Expired);
                }
            }
        }
    }

    // ----- commands ------------------------------------------------------------------------

    /// Issues `action` with `payload`. Host actions need authority now and are never queued
    /// offline; participant actions made while not live are queued and sent after the resync.
    /// Commands of a kind go one at a time, in the order they were made (see `send`).
    /// Before the first snapshot an action not in the configured table waits with them and is
    /// classified when the server's table comes: a host action then fails `NotAuthoritative`
    /// (it was made without authority), an action in neither list `UnknownAction`.
    /// Returns the idempotency key (reused on every retry) or why it was refused locally.
    pub fn command(
        &mut self,
        now: Instant,
        action: Action,
        payload: Json,
        key: Option<IdempotencyKey>,
    ) -> Result<IdempotencyKey, CommandError> {
        let now = self.tick(now);
        if self.phase == Phase::Closed {
            return Err(CommandError::Closed);
        }
        let kind = if is_relinquish(&action) {
            ActionKind::Host
        } else {
            match self.actions.kind(&action) {
                Some(kind) => kind,
                // Before the first snapshot the room's action table is not known: the command
                // waits with the participant commands and is classified when it comes (`send`).
                None if !self.have_snapshot => ActionKind::Participant,
                None => return Err(CommandError::UnknownAction),
            }
        };
        if self.commands.len() >= self.config.command_limit {
            return Err(CommandError::QueueFull);
        }
        // What `send` would refuse at once is this call's answer, not an event for a key the
        // caller has not been given yet.
        if kind == ActionKind::Participant
            && self.can_send_participant()
            && self
                .participant_grant
                .as_ref()
                .is_some_and(|g| !g.actions.contains(&action))
        {
            return Err(CommandError::NoCapability);
        }
        if let Some(k) = &key {
            if self.commands.iter().any(|c| &c.id == k) {
                return Err(CommandError::IdempotencyConflict);
            }
        }
        let epoch = match kind {
            ActionKind::Host => {
                if !self.host_gate(now)?.actions.contains(&action) {
                    return Err(CommandError::NoCapability);
                }
                self.epoch()
            }
            ActionKind::Participant => None,
        };
        let id = key.unwrap_or_else(|| self.new_key());
        self.commands.push(PendingCommand {
            id: id.clone(),
            action,
            payload,
            kind,
            epoch,
            attempts: 0,
            out: 0,
            made_at: now,
            state: CmdState::Queued,
        });
        let i = self.commands.len() - 1;
        if kind == ActionKind::Participant && !self.can_send_participant() {
            self.events
                .push_back(Event::CommandQueued { id: id.clone() });
            self.flush_queued(now); // arms the resync timer if live without a token
        } else {
            self.send(now, i);
            if self
                .commands
                .get(i)
                .is_some_and(|c| matches!(c.state, CmdState::Queued))
            {
                // Behind an older command of its kind waiting for its result.
                self.events
                    .push_back(Event::CommandQueued { id: id.clone() });
            }
        }
        Ok(id)
    }

    /// `host.resign`: give the host role up; the server elects the next member.
    pub fn resign(&mut self, now: Instant) -> Result<IdempotencyKey, CommandError> {
        let action = Action::new(ACTION_RESIGN).map_err(|_| CommandError::UnknownAction)?;
        self.command(now, action, Json::null(), None)
    }

    /// `host.transfer {to}`: hand the host role to `to`.
    pub fn transfer(
        &mut self,
        now: Instant,
        to: &ParticipantId,
    ) -> Result<IdempotencyKey, CommandError> {
        let action = Action::new(ACTION_TRANSFER).map_err(|_| CommandError::UnknownAction)?;
        let payload = Json::object_of_str("to", to.as_str());
        self.command(now, action, payload, None)
    }

    /// Leaves the room: a host that leaves is replaced at once. Pending commands fail `Closed`.
    pub fn leave(&mut self, now: Instant) {
        self.tick(now);
        if self.phase == Phase::Closed {
            return;
        }
        if !matches!(self.phase, Phase::Offline) {
            self.transmits.push_back(ClientMsg::Leave);
        }
        // `Closed`, but `Interrupted` for one sent and not answered: it may have been applied.
        self.fail_all(CommandError::Closed, None);
        // Nothing is awaited any more: no deadline is left for `poll_timeout` to report.
        self.awaiting_welcome = false;
        self.resync_retry_at = None;
        self.silence_check_at = None;
        self.host_grant = None;
        self.set_lease(LeaseState::NotHost);
        self.set_provisional(None);
        self.set_phase(Phase::Closed);
    }

    // ----- internals -----------------------------------------------------------------------

    /// Every local condition for a host command, in the order the errors are reported.
    fn host_gate(&self, now: Instant) -> Result<&Grant, CommandError> {
        self.host_gate_inner(now, false)
    }

    /// `relinquishing`: a resend of `host.resign` / `host.transfer`, which may go out after this
    /// session stopped acting as host (giving up the role cannot cause two hosts).
    fn host_gate_inner(&self, now: Instant, relinquishing: bool) -> Result<&Grant, CommandError> {
        if self.phase != Phase::Live {
            return Err(CommandError::NotAuthoritative);
        }
        if !self.is_named_host() {
            return Err(CommandError::NotHost);
        }
        match self.lease_at(now) {
            LeaseState::Held { .. } => {}
            LeaseState::Relinquished if relinquishing => {}
            LeaseState::Relinquished | LeaseState::NotHost => return Err(CommandError::NotHost),
            _ => return Err(CommandError::LeaseExpired),
        }
        match &self.host_grant {
            Some(g) if g.epoch == self.epoch() && now < g.expires_at => Ok(g),
            _ => Err(CommandError::NoCapability),
        }
    }

    fn can_send_participant(&self) -> bool {
        self.phase == Phase::Live
            && self
                .participant_grant
                .as_ref()
                .is_some_and(|g| g.expires_at > self.now)
    }

    fn new_key(&mut self) -> IdempotencyKey {
        let (a, b) = (self.rng.next_u64(), self.rng.next_u64());
        // 32 hex digits: always a valid identifier.
        let mut key = String::with_capacity(32);
        crate::protocol::json::push_hex16(&mut key, a);
        crate::protocol::json::push_hex16(&mut key, b);
        IdempotencyKey::new(key).unwrap_or_else(|_| unreachable!()) // hex is a valid identifier
    }

    /// Sends (or resends, same key) command `i` if it may still be sent; fails it otherwise.
    fn send(&mut self, now: Instant, i: usize) {
        let c = &self.commands[i];
        if c.attempts > 0 && now.ms_since(c.made_at) >= RESEND_WINDOW_MS {
            // Sent, never answered, and the server may have forgotten its key by now (a laptop
            // asleep for days): sent again, it could be applied a second time.
            self.fail_at(i, CommandError::Interrupted);
            return;
        }
        if c.kind == ActionKind::Participant && self.have_snapshot {
            // A command made before the table was known: a host action made then had no
            // authority (host commands are never queued); an action in neither list is unknown.
            let refused = match self.actions.kind(&c.action) {
                Some(ActionKind::Participant) => None,
                Some(ActionKind::Host) => Some(CommandError::NotAuthoritative),
                None => Some(CommandError::UnknownAction),
            };
            if let Some(e) = refused {
                self.refuse(i, e);
                return;
            }
        }
        // Commands of a kind reach the server in the order they were made (a changed vote must
        // not land before the vote it changes): while an older one of its kind waits to go
        // (again), or `PIPELINE` are out, this one waits (queued); `flush_queued` after each
        // result and resend sends it. Otherwise it goes at once, naming the newest older one
        // (`after`): while that one stands refused with a retry time, the server holds this
        // one, so a refusal never lets a later command be applied first. A resign or transfer
        // waits for every host command made before it to be decided: sent, it ends this
        // session's acting as host, and one of them refused then could not go again.
        let relinquish = is_relinquish(&c.action);
        let mut after = None;
        let mut out = 0;
        for o in self.commands[..i].iter().filter(|o| o.kind == c.kind) {
            out += 1;
            if relinquish || out >= PIPELINE || !matches!(o.state, CmdState::InFlight { .. }) {
                self.commands[i].state = CmdState::Queued;
                return;
            }
            after = Some(&o.id);
        }
        let after = after.cloned();
        let token = match c.kind {
            ActionKind::Host => {
                if c.epoch != self.epoch() {
                    // A resend: sent, never answered, outcome unknown.
                    self.fail_at(i, CommandError::Interrupted);
                    return;
                }
                match self.host_gate_inner(now, relinquish) {
                    Ok(g) => g.token.clone(),
                    Err(e) => {
                        self.refuse(i, e);
                        return;
                    }
                }
            }
            ActionKind::Participant => match &self.participant_grant {
                Some(g) if self.can_send_participant() && !g.actions.contains(&c.action) => {
                    self.refuse(i, CommandError::NoCapability);
                    return;
                }
                Some(g) if self.can_send_participant() => g.token.clone(),
                _ => {
                    // Live without a token (a resend's ran out, the server's refresh late): a
                    // resync asks for one after a command timeout, whether the command was
                    // made, revalidated or resent.
                    self.commands[i].state = CmdState::Queued;
                    if self.phase == Phase::Live && self.resync_retry_at.is_none() {
                        self.resync_retry_at = Some(now.add_ms(self.config.command_timeout_ms));
                    }
                    return;
                }
            },
        };
        if c.attempts >= self.config.max_attempts {
            self.fail_at(i, CommandError::Timeout);
            return;
        }
        let jitter = self.config.retry.delay_ms(c.attempts, &mut self.rng);
        let c = &mut self.commands[i];
        c.attempts += 1;
        c.out += 1;
        c.state = CmdState::InFlight {
            resend_at: now.add_ms(self.config.command_timeout_ms + jitter),
        };
        self.transmits.push_back(ClientMsg::Command {
            id: c.id.clone(),
            action: c.action.clone(),
            payload: c.payload.clone(),
            epoch: c.epoch,
            capability: token,
            after,
        });
        if relinquish {
            // Stop acting as host as it goes (not before: host commands made before it go
            // first): the server is about to grant someone else.
            self.set_lease(LeaseState::Relinquished);
        }
    }

    /// Fails command `i`, refused here with `e`; but `Interrupted` when an attempt already sent
    /// may have got no answer (a resend, or one the connection's drop hid; in backoff, the last
    /// attempt was answered, but for a participant command one before it, on an earlier
    /// connection, may not have been): that one may have been applied, and `e` would say it was
    /// not. A host command never outlives its connection, whose answers come in order: in
    /// backoff, every attempt was refused.
    fn refuse(&mut self, i: usize, e: CommandError) {
        let c = &self.commands[i];
        let unanswered = match c.state {
            CmdState::Backoff { .. } => c.kind == ActionKind::Participant && c.attempts > 1,
            _ => c.attempts > 0,
        };
        self.fail_at(i, [e, CommandError::Interrupted][usize::from(unanswered)]);
    }

    fn resend(&mut self, now: Instant, i: usize) {
        if self.phase == Phase::Live {
            self.send(now, i);
        } else {
            self.commands[i].state = CmdState::Unknown;
        }
    }

    /// Live, with participant commands waiting for a token the server has not (yet) sent.
    fn needs_participant_grant(&self) -> bool {
        self.phase == Phase::Live
            && !self.can_send_participant()
            && self
                .commands
                .iter()
                .any(|c| matches!(c.state, CmdState::Queued))
    }

    /// Sends every queued command, oldest first, when live (a host command held through a
    /// resync would be refused by the host gate until the welcome: it was failed
    /// `NotAuthoritative` when a participant command made meanwhile flushed the queue);
    /// participant commands once a participant token is at hand (live without one, a resync
    /// asks for it after a command timeout: the token normally follows the welcome at once).
    fn flush_queued(&mut self, now: Instant) {
        if self.phase != Phase::Live {
            return;
        }
        let mut i = 0;
        while i < self.commands.len() {
            let before = self.commands.len();
            if matches!(self.commands[i].state, CmdState::Queued) {
                self.send(now, i);
            }
            if self.commands.len() == before {
                i += 1;
            }
        }
    }

    /// After a resync: commands whose outcome the disconnect or the resync hid go again with
    /// the same key, in the order they were made, with those queued meanwhile (the server
    /// deduplicates). A host command only in its epoch, while still host (`send` fails it
    /// `Interrupted` otherwise: its outcome is unknown and resending could replay a stale
    /// intention; the room's event stream says whether it took effect).
    fn revalidate_unknown(&mut self, now: Instant) {
        for c in &mut self.commands {
            if matches!(c.state, CmdState::Unknown) {
                c.state = CmdState::Queued;
            }
        }
        self.flush_queued(now);
    }

    /// Fails the command at `i` (removed; its event queued).
    fn fail_at(&mut self, i: usize, error: CommandError) {
        let id = self.commands.remove(i).id;
        self.events.push_back(Event::CommandFailed { id, error });
    }

    /// Fails every command (`None`), or every one that dies with a new `epoch`, oldest first;
    /// one sent and maybe not answered fails `Interrupted` (see `refuse`).
    fn fail_all(&mut self, error: CommandError, epoch: Option<Epoch>) {
        let mut i = 0;
        while i < self.commands.len() {
            if epoch.is_none_or(|e| self.commands[i].dies_with(e)) {
                self.refuse(i, error);
            } else {
                i += 1;
            }
        }
    }

    fn violation(&mut self, v: Violation) {
        self.stats.violations += 1;
        self.events.push_back(Event::ProtocolViolation(v));
    }

    /// The end of a silence window that starts at `now`.
    fn silence_window(&self, now: Instant) -> Instant {
        now.add_ms(HEARTBEAT_MS + self.config.command_timeout_ms)
    }

    fn set_phase(&mut self, phase: Phase) {
        if self.phase != phase {
            self.phase = phase;
            self.events.push_back(Event::Phase(phase));
        }
    }

    fn set_lease(&mut self, lease: LeaseState) {
        if self.lease != lease {
            let announce = core::mem::discriminant(&self.lease) != core::mem::discriminant(&lease);
            self.lease = lease;
            if announce {
                self.events.push_back(Event::Lease(lease));
            }
        }
    }

    fn set_provisional(&mut self, p: Option<ParticipantId>) {
        if self.provisional != p {
            self.provisional = p.clone();
            self.events.push_back(Event::Provisional { coordinator: p });
        }
    }

    /// Between losing a session and the next welcome (offline, or reconnecting), the
    /// provisional coordinator; live or closed, none (the welcome and `leave` clear it).
    fn update_provisional(&mut self) {
        if self.session.is_some() || self.phase == Phase::Closed {
            return;
        }
        let me = self.me.clone();
        let reachable = &self.reachable;
        let p = provisional_coordinator(
            self.current.as_ref().and_then(|a| a.host.as_ref()),
            &self.members,
            |id| reachable.binary_search(id).is_ok() || me.as_ref() == Some(id),
        )
        .cloned();
        self.set_provisional(p);
    }
}

impl PendingCommand {
    /// A host command of an older epoch than `epoch` waiting to be sent again (it was refused as
    /// retryable). One in flight may be what made the new epoch (a resign) or have been committed
    /// before it: its result, which the server sends after the item it committed, tells; if none
    /// comes (a timeout, or the connection dropped) it fails `Interrupted`, outcome unknown.
    fn dies_with(&self, epoch: Epoch) -> bool {
        self.kind == ActionKind::Host
            && self.epoch != Some(epoch)
            && !matches!(self.state, CmdState::Unknown | CmdState::InFlight { .. })
    }
}
