//! In-memory room hubs (membership, the broadcast of the room stream), elections and the
//! background tasks: the outbox publisher, the durable notifier and the lease sweeper.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::ws::Utf8Bytes;
use hostlease::core::elect;
use hostlease::protocol::{
    codec::encode_server, Assignment, Epoch, ErrorCode, Item, Member, ParticipantId, Reason,
    RoomId, Seq, ServerMsg, ServerTime, SessionId, SignedAssignment, Snapshot,
};
use tokio::sync::{broadcast, mpsc, Notify, OwnedSemaphorePermit, Semaphore};

use crate::limit::Limiter;
use crate::store::{GrantOutcome, GrantReq, RoomRow, Store, StoreError, StoreResult};
use crate::tokens::{Keypair, Verifier};
use crate::Config;

/// Presence changes per frame at most: far below the protocol's member limit per frame, so a
/// mass reconnect of a big room (all its departures and arrivals in one interval) still decodes.
pub const PRESENCE_CHUNK: usize = 1024;

/// What a room's broadcast carries: a stream item or a presence change, pre-encoded once. The
/// frame's bytes are shared by every receiver (a clone is a reference count, not a copy). Of an
/// item only the frame is kept, and an assignment's decoded form (sessions act on it): a
/// receiver that reads slowly keeps up to the channel's capacity of them alive, and an event's
/// payload (up to 59 KiB) was held twice.
#[derive(Debug, Clone)]
pub enum Bcast {
    Item {
        seq: Seq,
        assignment: Option<Arc<SignedAssignment>>,
        frame: Utf8Bytes,
    },
    Presence {
        frame: Utf8Bytes,
    },
}

/// Messages addressed to one connection.
#[derive(Debug)]
pub enum Direct {
    /// A frame for this session alone (a signal; shared by its recipients, not copied).
    Frame(Utf8Bytes),
    /// Send this error frame and close.
    Close(String),
}

/// Bytes of frames queued for one session at most (on top of the 256 frames its queue holds):
/// a signal past it is dropped, as one to a full queue is. Signals are up to 64 KiB, so a sender
/// flooding a member that reads slowly held 16 MiB there, and could do so to every member.
pub const OUTLET_BYTES: usize = 1 << 20;

/// A message in a session's queue, with the share of the queue's byte budget it holds until the
/// session has written it (dropped with it).
#[derive(Debug)]
pub struct Queued(pub Direct, pub Option<OwnedSemaphorePermit>);

/// The sending side of one session's queue of [`Direct`] messages.
#[derive(Debug, Clone)]
pub struct Outlet {
    tx: mpsc::Sender<Queued>,
    bytes: Arc<Semaphore>,
    /// The session's subscription point (its welcome's seq): the room's items after it reach
    /// it live, the ones before it do not (the offline inbox counts on this).
    pub since: Seq,
    /// When the session began (ms, the wall clock, as the store's): a kick recorded before it
    /// leaves it be.
    pub started_ms: u64,
}

impl Outlet {
    pub fn new() -> (Self, mpsc::Receiver<Queued>) {
        let (tx, rx) = mpsc::channel(256);
        let bytes = Arc::new(Semaphore::new(OUTLET_BYTES));
        let out = Self {
            tx,
            bytes,
            since: Seq::ZERO,
            started_ms: 0,
        };
        (out, rx)
    }
}

pub struct RoomState {
    pub current: SignedAssignment,
    /// The last seq published to this process's subscribers.
    pub seq: Seq,
    pub members: Vec<Member>,
    /// Sessions whose lease lapsed and that have not answered the server since (an echo, a
    /// resume, a command), with how many times in a row: passed over by elections while another
    /// member may be elected. Two tabs frozen in the background (or two sessions that never
    /// answer a probe) otherwise handed the role to each other for ever, and a member that
    /// answers never got it. Alone, a session is granted again after one lapse (a stall it
    /// recovers from), not after `GIVEN_UP` (see [`RoomState::electable`]). Each with the
    /// epoch it last lapsed in: a lapse is counted once, however many sweeps look at it.
    pub lapsed: HashMap<SessionId, (u32, Epoch)>,
    pub conns: HashMap<SessionId, Outlet>,
    pub next_join: u64,
    pub closed: bool,
    /// Presence changes not yet sent (see [`Room::announce`]).
    presence: PresenceQueue,
}

/// Lapses in a row, without an answer in between, after which a session is no longer elected,
/// even alone, until it answers: a lone page frozen in the background (its browser still answers
/// pings, so its connection stays) was granted anew every lease period for as long as it stayed,
/// each grant an assignment in the log, the outbox, every offline member's inbox and the webhook.
pub const GIVEN_UP: u32 = 2;

impl RoomState {
    /// Whether elections may pick `m`: it may host and has not lapsed `GIVEN_UP` times in a row.
    pub fn electable(&self, m: &Member) -> bool {
        m.may_host
            && self
                .lapsed
                .get(&m.session)
                .is_none_or(|&(n, _)| n < GIVEN_UP)
    }

    /// `session`'s lease of `epoch` lapsed. Counted once per epoch: a sweep whose grant failed
    /// (the store busy) or lost to another process's looks at the same lapse again, and counting
    /// each look gave up on a lone host that answered every probe.
    pub fn lapse(&mut self, session: &SessionId, epoch: Epoch) {
        let n = match self.lapsed.get(session) {
            Some(&(n, e)) if e == epoch => n,
            Some(&(n, _)) => n + 1,
            None => 1,
        };
        self.lapsed.insert(session.clone(), (n, epoch));
    }
}

/// Presence changes waiting for the room's next presence frame.
#[derive(Default)]
struct PresenceQueue {
    joined: Vec<Member>,
    left: Vec<Member>,
    /// When the last presence frame went out.
    last_sent: Option<tokio::time::Instant>,
    /// A task will send what is queued when the interval has passed.
    scheduled: bool,
}

pub struct Room {
    pub id: RoomId,
    pub state: Mutex<RoomState>,
    pub tx: broadcast::Sender<Bcast>,
    /// Serialises this process's decisions for the room (the CAS keeps them correct anyway).
    pub decide: tokio::sync::Mutex<()>,
    /// Woken whenever an item is published to this room's subscribers.
    published: Notify,
    /// Holders of this hub (sessions and in-flight requests), counted under the map lock: the
    /// hub leaves the map only when the last one releases it, so nobody joins an orphan.
    users: AtomicUsize,
    /// Set once the room's row has been read into `state` (see [`App::room`]).
    loaded: tokio::sync::OnceCell<()>,
}

impl Room {
    /// A hub not yet loaded, with one user (its creator).
    fn new(id: RoomId, genesis: SignedAssignment) -> Self {
        Room {
            id,
            state: Mutex::new(RoomState {
                current: genesis,
                seq: Seq::ZERO,
                members: Vec::new(),
                lapsed: HashMap::new(),
                conns: HashMap::new(),
                next_join: 1,
                closed: false,
                presence: PresenceQueue::default(),
            }),
            tx: broadcast::channel(4096).0,
            decide: tokio::sync::Mutex::new(()),
            published: Notify::new(),
            users: AtomicUsize::new(1),
            loaded: tokio::sync::OnceCell::new(),
        }
    }

    /// Tells the room's members that `member` came online or went offline; `st` is this room's
    /// locked state. At most one presence frame goes out per `interval`: a change in a quiet room
    /// at once, the changes that follow it within the interval together when it ends (one
    /// `presence_batch` frame). A session that leaves before its join went out is announced as
    /// gone all the same: a snapshot taken meanwhile (a welcome, `GET /snapshot`) listed it, and
    /// a member that never knew it ignores its departure.
    pub fn announce(
        self: &Arc<Self>,
        st: &mut RoomState,
        member: Member,
        online: bool,
        interval: Duration,
    ) {
        let q = &mut st.presence;
        if online {
            q.joined.push(member);
        } else {
            q.joined.retain(|m| m.session != member.session);
            q.left.push(member);
        }
        if q.scheduled {
            return;
        }
        let now = tokio::time::Instant::now();
        match q.last_sent.map(|t| t + interval).filter(|due| *due > now) {
            None => self.send_presence(st, now),
            Some(due) => {
                q.scheduled = true;
                let room = self.clone();
                tokio::spawn(async move {
                    tokio::time::sleep_until(due).await;
                    let mut st = room.state.lock().expect("room lock");
                    st.presence.scheduled = false;
                    room.send_presence(&mut st, tokio::time::Instant::now());
                });
            }
        }
    }

    /// Tells the room that `member` left after its departure made a grant that has just been
    /// published. That assignment was this interval's frame to every member, so the departure
    /// waits for the interval's end instead of racing the assignment to the same sockets (with
    /// an interval of 0 it goes at once).
    pub fn announce_after_grant(
        self: &Arc<Self>,
        st: &mut RoomState,
        member: Member,
        interval: Duration,
    ) {
        st.presence.last_sent = Some(tokio::time::Instant::now());
        self.announce(st, member, false, interval);
    }

    /// Broadcasts what the presence queue holds: one change as a `presence` frame, more as
    /// `presence_batch` frames of at most [`PRESENCE_CHUNK`] changes each (departures first).
    fn send_presence(&self, st: &mut RoomState, now: tokio::time::Instant) {
        let q = &mut st.presence;
        let (joined, left) = (std::mem::take(&mut q.joined), std::mem::take(&mut q.left));
        if joined.is_empty() && left.is_empty() {
            return;
        }
        q.last_sent = Some(now);
        let mut changes = left
            .into_iter()
            .map(|m| (m, false))
            .chain(joined.into_iter().map(|m| (m, true)))
            .peekable();
        while changes.peek().is_some() {
            let mut chunk: Vec<(Member, bool)> = changes.by_ref().take(PRESENCE_CHUNK).collect();
            let msg = if chunk.len() == 1 {
                let (member, online) = chunk.remove(0);
                ServerMsg::Presence { member, online }
            } else {
                let (joined, left): (Vec<_>, Vec<_>) = chunk.into_iter().partition(|c| c.1);
                ServerMsg::PresenceBatch {
                    joined: joined.into_iter().map(|c| c.0).collect(),
                    left: left.into_iter().map(|c| c.0).collect(),
                }
            };
            let _ = self.tx.send(Bcast::Presence {
                frame: Utf8Bytes::from(encode_server(&msg)),
            });
        }
    }

    pub fn members(&self) -> Vec<Member> {
        self.state.lock().expect("room lock").members.clone()
    }

    /// Who the room's election picks among its members but `except`: a session whose lease
    /// lapsed (see [`RoomState::lapsed`]) only when no other member is eligible, and not once
    /// it lapsed `GIVEN_UP` times in a row.
    pub fn next_holder(&self, except: Option<&SessionId>) -> Option<(ParticipantId, SessionId)> {
        let st = self.state.lock().expect("room lock");
        let eligible = st
            .members
            .iter()
            .filter(|m| Some(&m.session) != except && st.electable(m));
        elect(
            eligible
                .clone()
                .filter(|m| !st.lapsed.contains_key(&m.session)),
        )
        .or_else(|| elect(eligible))
        .map(|m| (m.id.clone(), m.session.clone()))
    }

    /// Applies a committed item in seq order and broadcasts it; older ones are dropped.
    fn publish(&self, item: Item) {
        let mut st = self.state.lock().expect("room lock");
        if item.seq() <= st.seq {
            return;
        }
        let seq = item.seq();
        st.seq = seq;
        let (assignment, frame) = match item {
            Item::Assignment(a) => {
                st.current = a.clone();
                let frame = encode_server(&ServerMsg::Assignment(a.clone()));
                (Some(Arc::new(a)), frame)
            }
            Item::Event(e) => (None, encode_server(&ServerMsg::Event(e))),
        };
        let _ = self.tx.send(Bcast::Item {
            seq,
            assignment,
            frame: frame.into(),
        });
        self.published.notify_waiters();
    }

    /// Waits (at most `bound`) until the item with `seq` has been published here; `false` when
    /// the bound passed first.
    pub async fn wait_published(&self, seq: Seq, bound: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            let notified = self.published.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.state.lock().expect("room lock").seq >= seq {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return false;
            }
        }
    }
}

/// Queues `msg` for one session; whether a frame was queued. A frame is dropped when the
/// session's queue is full or holds [`OUTLET_BYTES`] already (a flood of signals; counted in
/// `hostlease_signals_dropped_total`), but a close never is: it waits for room in a task of its
/// own, which ends when the session reads it or is gone.
pub fn deliver(to: &Outlet, msg: Direct) -> bool {
    let held = match &msg {
        Direct::Frame(f) => {
            let n = u32::try_from(f.len()).unwrap_or(u32::MAX);
            match to.bytes.clone().try_acquire_many_owned(n) {
                Ok(p) => Some(p),
                Err(_) => {
                    metrics::counter!("hostlease_signals_dropped_total").increment(1);
                    return false;
                }
            }
        }
        Direct::Close(_) => None,
    };
    match to.tx.try_send(Queued(msg, held)) {
        Err(mpsc::error::TrySendError::Full(m @ Queued(Direct::Close(_), _))) => {
            let tx = to.tx.clone();
            tokio::spawn(async move {
                let _ = tx.send(m).await;
            });
            true
        }
        Err(mpsc::error::TrySendError::Full(_)) => {
            metrics::counter!("hostlease_signals_dropped_total").increment(1);
            false
        }
        // A session gone: nothing to deliver to.
        Err(mpsc::error::TrySendError::Closed(_)) => false,
        Ok(()) => true,
    }
}

/// A session's place among its room's members, from its join until its departure is announced
/// ([`Seat::vacate`], then [`Seat::announce_gone`]). A session task that ends any other way (a
/// panic, or dropped at shutdown) vacates it and announces the departure as the seat is dropped:
/// no member stays listed, electable and counted against the room's limits with no session
/// behind it, nor listed by the others.
pub struct Seat {
    room: Arc<Room>,
    member: Option<Member>,
    /// Still among the room's members.
    seated: bool,
    interval: Duration,
}

impl Seat {
    /// `member` has joined `room` (is in its members); `interval` is the presence interval.
    pub fn new(room: Arc<Room>, member: Member, interval: Duration) -> Self {
        Seat {
            room,
            member: Some(member),
            seated: true,
            interval,
        }
    }

    /// Takes the member out of the room, its departure not announced yet. Returns the last seq
    /// published here while it was in (`None`: it was out already): the notifier counts the
    /// items up to it as got live by this session.
    pub fn vacate(&mut self) -> Option<Seq> {
        let (true, Some(m)) = (std::mem::take(&mut self.seated), &self.member) else {
            return None;
        };
        let mut st = self.room.state.lock().expect("room lock");
        vacate(&mut st, &m.session);
        Some(st.seq)
    }

    /// Announces the departure; `after_grant`: after the grant the leaving made, which has
    /// been published (see [`Room::announce_after_grant`]).
    pub fn announce_gone(mut self, after_grant: bool) {
        self.vacate();
        let Some(member) = self.member.take() else {
            return;
        };
        let mut st = self.room.state.lock().expect("room lock");
        if after_grant {
            self.room
                .announce_after_grant(&mut st, member, self.interval);
        } else {
            self.room.announce(&mut st, member, false, self.interval);
        }
    }
}

fn vacate(st: &mut RoomState, session: &SessionId) {
    st.members.retain(|m| &m.session != session);
    st.lapsed.remove(session);
    st.conns.remove(session);
}

impl Drop for Seat {
    fn drop(&mut self) {
        let Some(member) = self.member.take() else {
            return;
        };
        // A lock poisoned by the panic that ended the session: the room is past saving here.
        let Ok(mut st) = self.room.state.lock() else {
            return;
        };
        if self.seated {
            vacate(&mut st, &member.session);
        }
        // Announcing may schedule a batch, a task: only inside the runtime.
        if tokio::runtime::Handle::try_current().is_ok() {
            self.room.announce(&mut st, member, false, self.interval);
        }
    }
}

/// One holder's use of a hub (a session or an in-flight request), from [`App::room`]. Dropping
/// it releases the hub, so a request future dropped mid-way (its client went away) cannot leave
/// the hub counted, and so in the map, forever.
pub struct HeldRoom {
    app: Arc<App>,
    hub: Arc<Room>,
}

impl HeldRoom {
    /// The hub itself (a clone of it does not count as a holder).
    pub fn hub(&self) -> &Arc<Room> {
        &self.hub
    }
}

impl std::ops::Deref for HeldRoom {
    type Target = Arc<Room>;
    fn deref(&self) -> &Arc<Room> {
        &self.hub
    }
}

impl Drop for HeldRoom {
    fn drop(&mut self) {
        self.app.release(&self.hub);
    }
}

pub struct App {
    pub cfg: Config,
    pub store: Arc<dyn Store>,
    pub keys: Keypair,
    /// Verifies join tokens (the app backend's public keys).
    pub join_keys: Verifier,
    /// Verifies capability tokens (this server's public keys).
    pub cap_keys: Verifier,
    /// The hubs of this process. A plain lock held only for lookups and inserts (never across an
    /// await): every join passes here, and a fair async lock held across a store read made a
    /// reconnect storm's joins queue behind one another.
    pub rooms: Mutex<HashMap<RoomId, Arc<Room>>>,
    /// Open WebSockets, in all and per client address.
    pub ws_sockets: Arc<crate::limit::Sockets>,
    pub committed: Notify,
    pub shutdown: tokio::sync::watch::Sender<bool>,
    /// Signs dev join tokens when `--dev` is on.
    pub dev_app_key: Option<Keypair>,
    pub metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    /// HTTP requests per client address (as [`crate::http::client_key`] keys it).
    pub http_limiter: Limiter<std::net::IpAddr>,
    /// Commands per participant in a room, over every WebSocket session it has and HTTP
    /// together: a join token opening more sockets, or reconnecting, gets no more through.
    pub command_limiter: Limiter<(RoomId, ParticipantId)>,
    /// HTTP commands with an expired capability, per participant in a room, at the same rate:
    /// kept apart so that anyone holding an old capability of X's (its signature stays good)
    /// cannot spend X's rate, yet cannot bring the store's writer commands without limit either
    /// (a replay of an accepted command under its key still works with an expired one).
    pub expired_limiter: Limiter<(RoomId, ParticipantId)>,
    /// Command payload bytes per room (`Config::room_bytes_rate`).
    pub room_bytes: Limiter<RoomId>,
    /// Signal bytes each participant in a room has the server deliver
    /// (`Config::signal_bytes_rate`).
    pub signal_bytes: Limiter<(RoomId, ParticipantId)>,
    /// The kicks made through this process that the sweeper has not read yet. Held from
    /// recording a kick until its sessions here are closed, and by the sweeper while it reads the
    /// kicks recorded: the sweeper sees a kick made here only once it is applied, so the kick's
    /// answer counts the sessions it closed (the sweeper, on a 20 ms tick, had closed them first
    /// and the answer said 0), and skips it (it would close a session joined since).
    kicking: tokio::sync::Mutex<HashSet<i64>>,
    /// Sessions ended without a close since the notifier last looked (at most [`LOST_MAX`]): it
    /// copies what they may have missed into their inboxes, many at once.
    lost: Mutex<Vec<crate::store::Lost>>,
    /// Per participant in a room, the seqs its lost sessions had queued for its inbox, as one
    /// range `(after, upto]` (at most [`LOST_MAX`] participants; past that forgotten, which only
    /// lets a copy through twice).
    recovering: Mutex<HashMap<(RoomId, ParticipantId), (Seq, Seq)>>,
    /// How often the outbox workers paused (tests read them).
    pub pauses: Pauses,
}

/// How many times each outbox worker paused for want of a full batch: a backlog is worked off
/// batch after batch, without a pause in between.
#[derive(Default)]
pub struct Pauses {
    pub notifier: std::sync::atomic::AtomicU64,
    pub webhook: std::sync::atomic::AtomicU64,
}

/// Pauses for `poll` unless the last batch was `full` (then the next goes at once), counting the
/// pause in `count`.
pub(crate) async fn pace(full: bool, poll: Duration, count: &std::sync::atomic::AtomicU64) {
    if !full {
        count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tokio::time::sleep(poll).await;
    }
}

impl App {
    pub fn new(
        cfg: Config,
        store: Arc<dyn Store>,
        keys: Keypair,
        join_keys: Verifier,
        dev_app_key: Option<Keypair>,
    ) -> Arc<Self> {
        let cap_keys = Verifier::from_keys(&[keys.public()]).expect("own key is valid");
        let http_limiter = Limiter::new(cfg.http_rate, cfg.http_burst);
        let command_limiter = Limiter::new(cfg.msg_rate, cfg.msg_burst);
        let expired_limiter = Limiter::new(cfg.msg_rate, cfg.msg_burst);
        // One payload of the largest size always fits.
        let room_bytes = Limiter::new(
            cfg.room_bytes_rate.max(1.0),
            cfg.room_bytes_burst
                .max(hostlease::protocol::codec::MAX_CLIENT_PAYLOAD as f64),
        );
        // Two relayed frames of the largest size always fit.
        let signal_bytes = Limiter::new(
            cfg.signal_bytes_rate.max(1.0),
            cfg.signal_bytes_burst
                .max(2.0 * hostlease::protocol::codec::MAX_CLIENT_FRAME as f64),
        );
        Arc::new(Self {
            cfg,
            store,
            keys,
            join_keys,
            cap_keys,
            rooms: Mutex::new(HashMap::new()),
            ws_sockets: Arc::default(),
            committed: Notify::new(),
            shutdown: tokio::sync::watch::channel(false).0,
            dev_app_key,
            metrics: crate::http::metrics_handle(),
            http_limiter,
            command_limiter,
            expired_limiter,
            room_bytes,
            signal_bytes,
            kicking: tokio::sync::Mutex::new(HashSet::new()),
            lost: Mutex::new(Vec::new()),
            recovering: Mutex::new(HashMap::new()),
            pauses: Pauses::default(),
        })
    }

    fn genesis(&self, room: &RoomId, now: u64) -> SignedAssignment {
        self.keys.sign_assignment(Assignment {
            room: room.clone(),
            host: None,
            session: None,
            epoch: Epoch::ZERO,
            seq: Seq::ZERO,
            lease_ms: 0,
            reason: Reason::Elected,
            issued_at: ServerTime(now),
        })
    }

    /// The hub of `room`, loaded from the store on first use, held until the returned handle is
    /// dropped. `None` when the room limit is reached. A new hub enters the map before its row is
    /// read, so the publisher applies what commits meanwhile; the load then keeps the newer of the
    /// row and what was published.
    pub async fn room(self: &Arc<Self>, room: &RoomId) -> Result<Option<HeldRoom>, StoreError> {
        let hub = {
            let mut map = self.rooms.lock().expect("rooms lock");
            match map.get(room) {
                Some(r) => {
                    r.users.fetch_add(1, Ordering::Relaxed);
                    r.clone()
                }
                None if map.len() >= self.cfg.max_rooms => return Ok(None),
                None => {
                    let hub = Arc::new(Room::new(
                        room.clone(),
                        self.genesis(room, self.store.clock_ms()),
                    ));
                    map.insert(room.clone(), hub.clone());
                    metrics::gauge!("hostlease_rooms").set(map.len() as f64);
                    hub
                }
            }
        };
        // Counted from here on: the handle releases the hub however this future or its caller
        // ends (a failed load, or a request dropped when its client went away).
        let held = HeldRoom {
            app: self.clone(),
            hub,
        };
        held.hub
            .loaded
            .get_or_try_init(|| self.load(&held.hub))
            .await?;
        Ok(Some(held))
    }

    /// Reads the room's row into a new hub, keeping whatever newer the publisher applied already.
    async fn load(&self, hub: &Room) -> Result<(), StoreError> {
        let Some(row) = self.store.room(&hub.id).await? else {
            return Ok(());
        };
        let mut st = hub.state.lock().expect("room lock");
        // A room never granted keeps the hub's genesis assignment (seq 0).
        if let Some(current) = row.current {
            if current.assignment.seq >= st.current.assignment.seq {
                st.current = current;
            }
        }
        st.seq = st.seq.max(row.seq);
        st.closed |= row.closed;
        Ok(())
    }

    /// Releases a hub obtained from [`App::room`] (by dropping its [`HeldRoom`]); the last
    /// holder drops it from the map.
    fn release(&self, room: &Room) {
        let mut map = self.rooms.lock().expect("rooms lock");
        if room.users.fetch_sub(1, Ordering::Relaxed) == 1 {
            map.remove(&room.id);
        }
        metrics::gauge!("hostlease_rooms").set(map.len() as f64);
    }

    pub fn snapshot(&self, room: &Room, remaining: Option<u64>) -> Snapshot {
        let st = room.state.lock().expect("room lock");
        self.snapshot_locked(room, &st, remaining)
    }

    pub fn snapshot_locked(&self, room: &Room, st: &RoomState, remaining: Option<u64>) -> Snapshot {
        // Already in election order: members are appended with the room's next join seq and
        // removed in place.
        let members = st.members.clone();
        debug_assert!(members
            .windows(2)
            .all(|w| hostlease::core::election_cmp(&w[0], &w[1]).is_lt()));
        Snapshot {
            room: room.id.clone(),
            current: st.current.clone(),
            members,
            seq: st.seq,
            lease_remaining_ms: remaining,
            server_time: ServerTime(self.store.clock_ms()),
            actions: self.action_table(),
        }
    }

    /// The action table sent in snapshots: the configured one plus the built-in host actions.
    pub fn action_table(&self) -> hostlease::protocol::ActionTable {
        self.cfg.action_table()
    }

    /// Commits a grant by CAS and reports it. Returns the committed assignment if this call won.
    pub async fn grant(
        &self,
        req: GrantReq,
        old: Option<&RoomRow>,
        correlation: &str,
    ) -> Result<Option<SignedAssignment>, StoreError> {
        // A forced grant takes the role from a holder whose lease may still run: the store fences
        // its successor until that has run out, on the store clock (`Store::renew` confirms
        // nothing before, and a snapshot tells of no lease: `RoomRow::lease_held`).
        match self.store.grant(req.clone(), &self.keys).await? {
            GrantOutcome::Won { assignment } => {
                // Logged before it is published: its line comes before any client hears of it.
                log_reassign(
                    old.and_then(|r| r.host.as_ref()),
                    &assignment.assignment,
                    correlation,
                );
                self.committed.notify_one();
                Ok(Some(assignment))
            }
            GrantOutcome::Lost(_) => {
                metrics::counter!("hostlease_cas_conflicts_total").increment(1);
                Ok(None)
            }
        }
    }

    /// Recomputes the host of `room` from the store and the local membership: grants when the
    /// room is hostless with an eligible member, or the lease has lapsed on the store clock.
    /// Finding the current host still holding a live lease changes nothing.
    pub async fn reconcile(&self, room: &Arc<Room>, correlation: &str) -> Result<(), StoreError> {
        let _g = room.decide.lock().await;
        for _ in 0..5 {
            let Some(row) = self.store.room(&room.id).await? else {
                // Never granted: hostless at epoch 0.
                let next = room.next_holder(None);
                if next.is_none() {
                    return Ok(());
                }
                let req = self.grant_req(room, Epoch::ZERO, next, Reason::Elected, true);
                if self.grant(req, None, correlation).await?.is_some() {
                    return Ok(());
                }
                continue;
            };
            if row.closed || row.lease_live() {
                return Ok(());
            }
            if let (Some(_), Some(s)) = (&row.host, &row.session) {
                let mut st = room.state.lock().expect("room lock");
                if st.members.iter().any(|m| &m.session == s) {
                    st.lapse(s, row.epoch);
                }
            }
            // A session that let its lease lapse is passed over while another eligible member
            // is connected; alone, it is granted again (a new grant, so a new epoch), unless it
            // has lapsed `GIVEN_UP` times in a row: then to nobody, until it answers.
            let next = room
                .next_holder(row.session.as_ref())
                .or_else(|| room.next_holder(None));
            let reason = if row.host.is_some() {
                Reason::LeaseLapsed
            } else if next.is_none() {
                return Ok(()); // hostless -> hostless is not a grant
            } else {
                Reason::Elected
            };
            let req = self.grant_req(room, row.epoch, next, reason, true);
            if self.grant(req, Some(&row), correlation).await?.is_some() {
                return Ok(());
            }
        }
        Ok(())
    }

    /// The holder `session` is gone or gave the role up (leave, clean close, kick): grant at once
    /// to the next member, excluding it. No-op when it is not the recorded holder. Returns the
    /// seq of the assignment this call committed, if it did.
    pub async fn replace_host(
        &self,
        room: &Arc<Room>,
        session: &SessionId,
        reason: Reason,
        correlation: &str,
    ) -> Result<Option<Seq>, StoreError> {
        {
            let _g = room.decide.lock().await;
            let Some(row) = self.store.room(&room.id).await? else {
                return Ok(None);
            };
            if row.session.as_ref() != Some(session) || row.closed {
                return Ok(None);
            }
            let next = room.next_holder(Some(session));
            let req = self.grant_req(room, row.epoch, next, reason, false);
            if let Some(a) = self.grant(req, Some(&row), correlation).await? {
                return Ok(Some(a.assignment.seq));
            }
        }
        self.reconcile(room, correlation).await.map(|()| None)
    }

    pub fn grant_req(
        &self,
        room: &Room,
        expected: Epoch,
        holder: Option<(ParticipantId, SessionId)>,
        reason: Reason,
        require_lapsed: bool,
    ) -> GrantReq {
        GrantReq {
            room: room.id.clone(),
            expected_epoch: expected,
            holder,
            lease_ms: self.cfg.lease_ms,
            reason,
            require_lapsed,
            close: false,
        }
    }

    /// Closes the room in this process: no one joins any more, and every session gets a
    /// `room_closed` error and is closed, after the items up to `seq` (the closing assignment,
    /// if the close made one) have been published to it, or `bound` has passed.
    pub async fn close_here(&self, hub: &Room, seq: Seq, bound: Duration) {
        hub.state.lock().expect("room lock").closed = true;
        hub.wait_published(seq, bound).await;
        let frame = encode_server(&ServerMsg::Error {
            code: ErrorCode::RoomClosed,
            message: "room closed".into(),
        });
        self.direct(hub, |_| true, || Direct::Close(frame.clone()));
    }

    /// Kicks `p` from the room: recorded first (the other processes on the database kick the
    /// sessions they hold, and its capabilities are refused from now on), then applied here.
    /// Returns how many sessions were kicked here.
    pub async fn kick(&self, hub: &Arc<Room>, p: &ParticipantId) -> StoreResult<usize> {
        let sessions = {
            let mut own = self.kicking.lock().await;
            let id = self.store.record_kick(&hub.id, p).await?;
            own.insert(id);
            Self::remove_kicked(hub, p, None)
        };
        self.replace_kicked(hub, p, &sessions, None).await;
        Ok(sessions.len())
    }

    /// Kicks `p` from the room in this process (a kick made through another one, recorded at
    /// `at`, ms on the store clock). Returns how many sessions were kicked here. The sessions
    /// `p` began since are left be, as their capabilities are (it may join again: a kick applied
    /// on the next sweep closed the session it had opened meanwhile, and took the host role from
    /// it if it had been elected).
    pub async fn kick_here(&self, hub: &Arc<Room>, p: &ParticipantId, at: u64) -> usize {
        let sessions = Self::remove_kicked(hub, p, Some(at));
        self.replace_kicked(hub, p, &sessions, Some(at)).await;
        sessions.len()
    }

    /// `p`'s sessions (those begun by `before`, if given) leave the membership (so the next
    /// election skips them) and are told `kicked` and closed, under one lock (a session joining
    /// meanwhile is either kicked too or not at all).
    fn remove_kicked(hub: &Room, p: &ParticipantId, before: Option<u64>) -> Vec<SessionId> {
        let frame = encode_server(&ServerMsg::Error {
            code: ErrorCode::Kicked,
            message: "kicked by the app".into(),
        });
        let mut st = hub.state.lock().expect("room lock");
        let st = &mut *st;
        let began = |m: &Member| st.conns.get(&m.session).map_or(0, |o| o.started_ms);
        let (out, stay): (Vec<_>, Vec<_>) = std::mem::take(&mut st.members)
            .into_iter()
            .partition(|m| &m.id == p && before.is_none_or(|k| began(m) <= k));
        st.members = stay;
        for m in &out {
            if let Some(tx) = st.conns.get(&m.session) {
                deliver(tx, Direct::Close(frame.clone()));
            }
        }
        out.into_iter().map(|m| m.session).collect()
    }

    /// A kicked host is replaced at once.
    /// Replaces `p` as host after a kick: its `sessions` closed here, and the session the room
    /// names if it is `p`'s and not among them. A host whose connection is gone while its lease
    /// runs is a member of no process: it is replaced all the same when a member here can take
    /// over (the room named it host until the lease lapsed, up to a day with an admin TTL), by
    /// the process kicking or by one that applies the kick on its next sweep (with the kick made
    /// through a process holding none of the members, no one replaced it). The successor is
    /// fenced until then, as for every forced grant: the old host's client may not know yet.
    /// `replace_host` decides against the stored session (a host connected to another process
    /// is replaced once, there or here). (Unreadable: left to the sweep.)
    async fn replace_kicked(
        &self,
        hub: &Arc<Room>,
        p: &ParticipantId,
        sessions: &[SessionId],
        before: Option<u64>,
    ) {
        let mut sessions = sessions.to_vec();
        if let Ok(Some(row)) = self.store.room(&hub.id).await {
            // (Not a session of `p`'s granted the role after a kick applied late. The grant's
            // time stands for the session's start here: a session begun before the kick and
            // granted again since is left to the process holding it, which closes it.)
            let granted = row.current.as_ref().map(|c| c.assignment.issued_at.0);
            sessions.extend(row.session.filter(|s| {
                row.host.as_ref() == Some(p)
                    && !sessions.contains(s)
                    && before.is_none_or(|k| granted.is_none_or(|g| g <= k))
                    && hub.next_holder(Some(s)).is_some()
            }));
        }
        let correlation = correlation_id();
        for s in &sessions {
            if let Err(e) = self
                .replace_host(hub, s, Reason::Kicked, &correlation)
                .await
            {
                tracing::warn!(error = %e, "replace host after a kick failed");
            }
        }
    }

    /// Sends `msg` to every session of the room (or those matching `filter`).
    pub fn direct(&self, room: &Room, filter: impl Fn(&Member) -> bool, msg: impl Fn() -> Direct) {
        let st = room.state.lock().expect("room lock");
        for m in st.members.iter().filter(|m| filter(m)) {
            if let Some(tx) = st.conns.get(&m.session) {
                deliver(tx, msg());
            }
        }
    }

    /// Relays a signal `frame` from `from` to the sessions matching `to` here, each delivery
    /// charged to `from`'s signal bytes (`Config::signal_bytes_rate`): past them it is dropped
    /// and counted; one a full queue drops is not charged.
    pub fn signal(
        &self,
        room: &Room,
        from: &ParticipantId,
        to: impl Fn(&Member) -> bool,
        frame: &Utf8Bytes,
    ) {
        let (key, len) = ((room.id.clone(), from.clone()), frame.len() as f64);
        let st = room.state.lock().expect("room lock");
        for m in st.members.iter().filter(|m| to(m)) {
            let Some(tx) = st.conns.get(&m.session) else {
                continue;
            };
            if self.signal_bytes.spend(key.clone(), len).is_err() {
                metrics::counter!("hostlease_signals_dropped_total").increment(1);
            } else if !deliver(tx, Direct::Frame(frame.clone())) {
                self.signal_bytes.refund(key.clone(), len);
            }
        }
    }
}

/// The one structured log line per reassignment.
pub fn log_reassign(old_host: Option<&ParticipantId>, new: &Assignment, correlation: &str) {
    let old_host = old_host.map_or_else(|| "-".to_string(), |h| h.to_string());
    let new_host = new
        .host
        .as_ref()
        .map_or_else(|| "-".to_string(), |h| h.to_string());
    tracing::info!(
        target: "hostlease::reassign",
        room = %new.room,
        old = %old_host,
        new = %new_host,
        epoch = new.epoch.0,
        reason = new.reason.as_str(),
        correlation_id = correlation,
        "host reassigned"
    );
    metrics::counter!("hostlease_assignments_total", "reason" => new.reason.as_str()).increment(1);
}

pub fn correlation_id() -> String {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).expect("random source");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// How often the metrics recorder drains its histogram samples (its exporter's default).
const METRICS_UPKEEP: Duration = Duration::from_secs(5);

/// Starts the publisher, the notifier, the sweeper and the metrics upkeep. Returns once the
/// publisher's and the sweeper's starting points are read: call it before accepting
/// connections, or what is committed for them meanwhile (a grant, a kick through another
/// process) would fall below those points and never be published or applied here.
pub async fn spawn_background(app: Arc<App>) -> Vec<tokio::task::JoinHandle<()>> {
    let outbox = newest_id("outbox", || app.store.outbox_max_id()).await;
    // Kicks recorded before this process started concern no session of its own.
    let kicks = newest_id("kick", || app.store.kicks_max_id()).await;
    let mut v = vec![
        tokio::spawn(publisher(app.clone(), outbox)),
        tokio::spawn(notifier(app.clone())),
    ];
    if app.cfg.webhook_url.is_some() {
        v.push(tokio::spawn(crate::webhook::worker(app.clone())));
    }
    if let Some(metrics) = app.metrics.clone() {
        // Histogram samples are kept until drained: by a scrape of `/metrics`, or by this (the
        // recorder is installed without its exporter's upkeep task). A server nobody scrapes
        // otherwise held every command's latency sample for ever.
        v.push(tokio::spawn(async move {
            let mut every = tokio::time::interval(METRICS_UPKEEP);
            loop {
                every.tick().await;
                metrics.run_upkeep();
            }
        }));
    }
    v.push(tokio::spawn(housekeeper(app.clone())));
    v.push(tokio::spawn(sweeper(app, kicks)));
    v
}

/// Sweeps between two rounds of housekeeping.
const HOUSEKEEPING_SWEEPS: u32 = 600;

/// Deletes what the store keeps for a while only (idempotency records, kicks, old inbox items,
/// the log past `log_keep`), every `HOUSEKEEPING_SWEEPS` sweeps. A task of its own: in the
/// sweeper, its batches of deletes (each a write through the one writer) held up failovers,
/// elections and kicks from other processes for as long as they all took.
async fn housekeeper(app: Arc<App>) {
    let every = Duration::from_millis(app.cfg.sweep_ms.clamp(5, 5000)) * HOUSEKEEPING_SWEEPS;
    loop {
        tokio::time::sleep(every).await;
        // Outbox rows are kept for the webhook whenever one is configured (it was a flag of the
        // store that only the CLI set: a server embedded with a webhook lost undelivered rows
        // after an hour).
        let webhook = app.cfg.webhook_url.is_some();
        if let Err(e) = app.store.housekeeping(app.cfg.log_keep, webhook).await {
            tracing::warn!(error = %e, "housekeeping failed");
        }
    }
}

/// A background task's starting point: the newest id of a table, read until the store answers.
async fn newest_id<F: Future<Output = Result<i64, StoreError>>>(
    what: &str,
    read: impl Fn() -> F,
) -> i64 {
    loop {
        match read().await {
            Ok(v) => return v,
            Err(e) => {
                tracing::warn!(error = %e, "{what} read failed");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

/// Tails the outbox (commit order) and publishes every item to this process's subscribers. Every
/// process tails the same table, so clients of any process on the same database see every commit.
/// Publishing happens only after commit, by construction.
async fn publisher(app: Arc<App>, mut last: i64) {
    let poll = Duration::from_millis(app.cfg.sweep_ms.clamp(5, 1000));
    loop {
        let _ = tokio::time::timeout(poll, app.committed.notified()).await;
        loop {
            let rows = match app.store.outbox_after(last, 512).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "outbox read failed");
                    break;
                }
            };
            if rows.is_empty() {
                break;
            }
            let newest = rows.last().map(|(_, _, item)| match item {
                Item::Assignment(a) => a.assignment.issued_at.0,
                Item::Event(e) => e.at.0,
            });
            if let Some(at) = newest {
                // Commit (store clock) to publication, for the newest item of the batch.
                let lag_ms = app.store.clock_ms().saturating_sub(at);
                metrics::gauge!("hostlease_outbox_lag_seconds").set(lag_ms as f64 / 1000.0);
            }
            // The hubs are looked up under the map's lock and published to outside it: encoding
            // and broadcasting a batch would hold up every join, leave and lookup meanwhile. A
            // hub made after the lookup loads its snapshot after these rows were committed.
            let hubs: Vec<_> = {
                let map = app.rooms.lock().expect("rooms lock");
                rows.into_iter()
                    .map(|(id, room, item)| (id, map.get(&room).cloned(), item))
                    .collect()
            };
            for (id, hub, item) in hubs {
                last = id;
                if let Some(r) = hub {
                    r.publish(item);
                }
            }
        }
    }
}

/// Sessions waiting for the notifier to recover their inboxes, at most: past it (a mass
/// disconnect while the store stalls) one is left out and counted
/// (`hostlease_inbox_not_recovered_total`).
const LOST_MAX: usize = 65_536;

impl App {
    /// Queues `lost` for the notifier (see [`crate::store::Store::recover_inbox`]), less the
    /// seqs a lost session of the same participant queued already: its inbox is the
    /// participant's, and the recovery is deduplicated only within one notifier turn. A client
    /// that never answered pings and reset its sessions one after another (16 at once) had each
    /// copy what was published in its time: the room's stream written into the inbox 16 times
    /// over.
    pub fn lost(&self, lost: crate::store::Lost) {
        // What the store copies at most: the newest `RECOVER_MAX` (its byte budget may copy fewer
        // of them; those left out count as queued here too).
        let upto = lost.upto;
        let after = lost
            .after
            .max(Seq(upto.0.saturating_sub(crate::store::RECOVER_MAX)));
        if upto <= after {
            return;
        }
        let key = (lost.room.clone(), lost.participant.clone());
        let mut map = self.recovering.lock().expect("recovering lock");
        let (pieces, queued) = match map.get(&key).copied() {
            // Overlapping or touching: what lies outside the range queued so far.
            Some((lo, hi)) if after <= hi && upto >= lo => (
                [(after, upto.min(lo)), (after.max(hi), upto)],
                (lo.min(after), hi.max(upto)),
            ),
            _ => ([(after, upto), (upto, upto)], (after, upto)),
        };
        let mut all = true;
        for (after, upto) in pieces {
            all &= self.queue_lost(crate::store::Lost {
                after,
                upto,
                ..lost.clone()
            });
        }
        // Recorded only once queued: a range the full queue refused is not taken for copied.
        if all {
            if map.len() >= LOST_MAX {
                map.clear();
            }
            map.insert(key, queued);
        }
    }

    /// Queues `lost` as it is; whether it is queued (an empty range needs no queueing; past
    /// [`LOST_MAX`] it is counted as not recovered).
    fn queue_lost(&self, lost: crate::store::Lost) -> bool {
        if lost.upto <= lost.after {
            return true;
        }
        let mut q = self.lost.lock().expect("lost lock");
        if q.len() < LOST_MAX {
            q.push(lost);
            true
        } else {
            metrics::counter!("hostlease_inbox_not_recovered_total").increment(1);
            false
        }
    }
}

/// Lost sessions the notifier recovers the inboxes of per turn, at most.
const RECOVER_BATCH: usize = 1024;

/// How long the notifier waits for the rows it read to be published here.
const NOTIFY_PUBLISH_WAIT: Duration = Duration::from_secs(1);

/// Outbox rows the notifier reads at a time.
const NOTIFY_BATCH: i64 = 256;

/// Works off the outbox into the offline members' durable inboxes, with the connected members of
/// only the rooms the pending rows are for. (It used to copy every member of every room under the
/// hub map's lock every 200 ms, pending rows or not, and to read a room's participants again for
/// each row.) A full batch is followed by the next at once: with a pause before every batch, a
/// process committing more than a batch per pause (1,280 rows/s) fell behind for good.
async fn notifier(app: Arc<App>) {
    let poll = Duration::from_millis(app.cfg.sweep_ms.clamp(5, 1000) * 2);
    let mut full = false;
    loop {
        pace(full, poll, &app.pauses.notifier).await;
        // Up to a batch of the sessions lost, a room at a time; the next turn comes at once
        // while more wait. A room that failed is tried again with the ones after it (a part of
        // it written already is then written twice: a duplicate, not a loss).
        let lost: Vec<crate::store::Lost> = {
            let mut q = app.lost.lock().expect("lost lock");
            let n = q.len().min(RECOVER_BATCH);
            full = q.len() > n;
            q.drain(..n).collect()
        };
        let mut rooms: std::collections::BTreeMap<RoomId, Vec<crate::store::Lost>> =
            std::collections::BTreeMap::new();
        for l in lost {
            rooms.entry(l.room.clone()).or_default().push(l);
        }
        let mut rooms = rooms.into_values();
        while let Some(room) = rooms.next() {
            match app.store.recover_inbox(&room).await {
                Ok(n) => metrics::counter!("hostlease_inbox_recovered_total").increment(n as u64),
                Err(e) => {
                    tracing::warn!(error = %e, "inbox recovery failed");
                    full = false; // the store failed: a pause before the next try
                    room.into_iter().chain(rooms.flatten()).for_each(|l| {
                        app.queue_lost(l);
                    });
                    break;
                }
            }
        }
        let rows = match app.store.unnotified(NOTIFY_BATCH).await {
            Ok(rows) if rows.is_empty() => continue,
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(error = %e, "outbox notify failed");
                continue;
            }
        };
        // Each room's newest seq in the batch.
        let mut newest: HashMap<&RoomId, Seq> = HashMap::new();
        for (_, room, seq, _) in &rows {
            let n = newest.entry(room).or_insert(*seq);
            *n = (*n).max(*seq);
        }
        let hubs: Vec<(Arc<Room>, Seq)> = {
            let map = app.rooms.lock().expect("rooms lock");
            newest
                .iter()
                .filter_map(|(r, seq)| map.get(*r).map(|h| (h.clone(), *seq)))
                .collect()
        };
        // Only where someone is connected to count as got live (a hub loading, or let go of,
        // may never publish them).
        let (waited, idle): (Vec<_>, Vec<_>) = hubs
            .into_iter()
            .partition(|(r, _)| !r.state.lock().expect("room lock").conns.is_empty());
        // The rows just committed are published here first (the publisher is woken by each
        // commit; a few ms): read before, a member connected throughout counted as away for
        // them and got an inbox copy of what it had live. Past the bound (a publisher behind),
        // the copies go as before: a duplicate, not a loss.
        futures_util::future::join_all(
            waited
                .iter()
                .map(|(r, seq)| r.wait_published(*seq, NOTIFY_PUBLISH_WAIT)),
        )
        .await;
        let hubs: Vec<Arc<Room>> = waited.into_iter().chain(idle).map(|(r, _)| r).collect();
        // Who got what live here: a participant's items from the earliest subscription point of
        // its sessions on, up to the last one published here. An item from before (it joined
        // after the commit: a page reloaded, or back before this ran) or not yet published here
        // (committed by another process) goes to its inbox too: a duplicate is cheaper than a
        // loss.
        let mut online = crate::store::Online::new();
        for r in &hubs {
            let st = r.state.lock().expect("room lock");
            for m in &st.members {
                let Some(since) = st.conns.get(&m.session).map(|o| o.since) else {
                    continue;
                };
                let got = online
                    .entry((r.id.clone(), m.id.clone()))
                    .or_insert((since, st.seq));
                got.0 = got.0.min(since);
            }
        }
        match app.store.notify(&rows, &online).await {
            Ok(n) => {
                metrics::counter!("hostlease_outbox_notified_total").increment(n as u64);
                full |= rows.len() as i64 == NOTIFY_BATCH;
            }
            Err(e) => tracing::warn!(error = %e, "outbox notify failed"),
        }
    }
}

/// How long a room closed elsewhere waits for its closing assignment to be published here
/// before its sessions are closed.
const CLOSE_WAIT: Duration = Duration::from_secs(1);

/// Reassigns lapsed leases (decided on the store clock), elects in hostless rooms, and closes
/// here the rooms another process closed.
async fn sweeper(app: Arc<App>, mut last_kick: i64) {
    let mut skewed = false;
    loop {
        tokio::time::sleep(Duration::from_millis(app.cfg.sweep_ms.clamp(5, 5000))).await;
        // The wall clock's steps since the store clock's anchor: leases are timed on the store
        // clock, and the times the server reports (`issued_at`, `server_time`) differ this much
        // from the wall clock's. A line when it goes past a second, and when it comes back.
        let skew = app.store.clock_skew_ms();
        metrics::gauge!("hostlease_store_clock_skew_seconds").set(skew as f64 / 1000.0);
        if skewed != (skew.abs() > 1000) {
            skewed = !skewed;
            tracing::warn!(
                skew_ms = skew,
                "the store clock {} the wall clock (leases are timed on the store clock)",
                if skewed {
                    "differs from"
                } else {
                    "agrees again with"
                }
            );
        }
        let hubs: Vec<Arc<Room>> = app
            .rooms
            .lock()
            .expect("rooms lock")
            .values()
            .cloned()
            .collect();
        // Only the rooms served here (a closed room is never granted again): rooms without a
        // hub in this process are not ours to reassign, and a query over every lapsed row let
        // abandoned rooms crowd out live ones.
        let ids: Vec<RoomId> = hubs
            .iter()
            .filter(|h| !h.state.lock().expect("room lock").closed)
            .map(|h| h.id.clone())
            .collect();
        // Kicks made through the other processes (this one's own are applied already).
        let kicks = {
            let mut own = app.kicking.lock().await;
            app.store.kicks_after(last_kick, 1000).await.map(|kicks| {
                if let Some((id, ..)) = kicks.last() {
                    last_kick = *id;
                }
                kicks
                    .into_iter()
                    .filter(|(id, ..)| !own.remove(id))
                    .collect::<Vec<_>>()
            })
        };
        match kicks {
            Ok(kicks) => {
                for (_, room, p, at) in kicks {
                    let hub = app.rooms.lock().expect("rooms lock").get(&room).cloned();
                    if let Some(hub) = hub {
                        let app = app.clone();
                        tokio::spawn(async move { app.kick_here(&hub, &p, at).await });
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "kick read failed"),
        }
        let (lapsed, closed) = match app.store.lapsed_rooms(&ids).await {
            Ok(s) => (
                s.lapsed.into_iter().collect::<HashSet<_>>(),
                s.closed.into_iter().collect::<HashMap<_, _>>(),
            ),
            Err(e) => {
                tracing::warn!(error = %e, "lease sweep failed");
                continue;
            }
        };
        for hub in hubs {
            if let Some(&seq) = closed.get(&hub.id) {
                // Closed by another process on this database (this one closes its own rooms
                // itself): the close reaches the sessions held here too.
                if !hub.state.lock().expect("room lock").closed {
                    let app = app.clone();
                    tokio::spawn(async move { app.close_here(&hub, seq, CLOSE_WAIT).await });
                }
                continue;
            }
            let needs = lapsed.contains(&hub.id) || {
                let st = hub.state.lock().expect("room lock");
                st.current.assignment.host.is_none()
                    && !st.closed
                    && st.members.iter().any(|m| st.electable(m))
            };
            if needs {
                if let Err(e) = app.reconcile(&hub, &correlation_id()).await {
                    tracing::warn!(error = %e, "reconcile failed");
                }
            }
        }
        metrics::gauge!("hostlease_connections").set(app.ws_sockets.total() as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::SqliteStore;

    /// A lapse is counted once per epoch, however many sweeps look at it (a grant that failed
    /// or lost a race is tried again by the next sweep); lapses of two epochs in a row give up.
    #[test]
    fn a_lapse_is_counted_once_per_epoch() {
        let room = Room::new(
            RoomId::new("r").unwrap(),
            SignedAssignment::from(genesis("r")),
        );
        let mut st = room.state.lock().unwrap();
        let m = member(1);
        st.members.push(m.clone());
        for _ in 0..3 {
            st.lapse(&m.session, Epoch(4));
        }
        assert!(st.electable(&m));
        st.lapse(&m.session, Epoch(5));
        assert!(!st.electable(&m));
        st.lapsed.remove(&m.session); // it answered
        assert!(st.electable(&m));
    }
    use hostlease::protocol::{Action, RoomEvent};

    /// A hostless room's first assignment.
    fn genesis(room: &str) -> Assignment {
        Assignment {
            room: RoomId::new(room).unwrap(),
            host: None,
            session: None,
            epoch: Epoch::ZERO,
            seq: Seq::ZERO,
            lease_ms: 6000,
            reason: Reason::Elected,
            issued_at: ServerTime(0),
        }
    }

    fn member(i: u64) -> Member {
        Member {
            id: ParticipantId::new(format!("p{i}")).unwrap(),
            session: SessionId::new(format!("s{i}")).unwrap(),
            name: String::new(),
            join_seq: i,
            may_host: true,
        }
    }

    /// The first change in a quiet room goes out at once; what follows within the interval goes
    /// out in one batch when it ends (a session that came and went in between as gone: a welcome
    /// meanwhile listed it); after a quiet interval a change goes out at once again.
    #[tokio::test(start_paused = true)]
    async fn presence_is_sent_at_once_when_quiet_and_batched_within_the_interval() {
        let hub = Arc::new(Room::new(RoomId::new("p").unwrap(), genesis("p").into()));
        let mut rx = hub.tx.subscribe();
        let interval = Duration::from_millis(100);
        let m = member;
        let announce = |member: Member, online: bool| {
            let mut st = hub.state.lock().unwrap();
            hub.announce(&mut st, member, online, interval);
        };
        let frame = |b: Bcast| match b {
            Bcast::Presence { frame } => hostlease::protocol::decode_server(&frame).unwrap(),
            Bcast::Item { .. } => panic!("an item"),
        };

        announce(m(0), true);
        let first = frame(rx.try_recv().expect("sent at once"));
        assert_eq!(
            first,
            ServerMsg::Presence {
                member: m(0),
                online: true
            }
        );
        for i in 1..=5 {
            announce(m(i), true);
        }
        announce(m(0), false);
        announce(m(6), true); // a welcome here lists m(6): its departure must go out too
        announce(m(6), false);
        assert!(rx.try_recv().is_err(), "held until the interval ends");
        let batch = frame(rx.recv().await.unwrap());
        assert_eq!(
            batch,
            ServerMsg::PresenceBatch {
                joined: (1..=5).map(m).collect(),
                left: vec![m(0), m(6)],
            }
        );
        tokio::time::sleep(interval).await;
        assert!(rx.try_recv().is_err(), "nothing else was queued");
        announce(m(7), false);
        assert_eq!(
            frame(rx.try_recv().expect("quiet again: sent at once")),
            ServerMsg::Presence {
                member: m(7),
                online: false
            }
        );
    }

    /// A session task that ends without vacating its seat (a panic) leaves no member behind,
    /// and its departure goes out; a seat vacated is announced when told, or when dropped.
    #[tokio::test(start_paused = true)]
    async fn a_seat_not_vacated_takes_its_member_out_when_dropped() {
        let hub = Arc::new(Room::new(RoomId::new("v").unwrap(), genesis("v").into()));
        let mut rx = hub.tx.subscribe();
        hub.state
            .lock()
            .unwrap()
            .members
            .extend([member(1), member(2)]);
        let gone = |b: Result<Bcast, _>| match b {
            Ok(Bcast::Presence { frame }) => hostlease::protocol::decode_server(&frame).unwrap(),
            _ => panic!("no departure announced"),
        };
        let left = |i| ServerMsg::Presence {
            member: member(i),
            online: false,
        };
        let seat = Seat::new(hub.clone(), member(1), Duration::ZERO);
        let task = tokio::spawn(async move {
            let _seat = seat;
            panic!("a bug in the session");
        });
        assert!(task.await.unwrap_err().is_panic());
        assert_eq!(hub.state.lock().unwrap().members, vec![member(2)]);
        assert_eq!(gone(rx.try_recv()), left(1));
        let mut seat = Seat::new(hub.clone(), member(2), Duration::ZERO);
        seat.vacate();
        assert!(hub.state.lock().unwrap().members.is_empty());
        assert!(rx.try_recv().is_err(), "announced when told");
        seat.announce_gone(false);
        assert_eq!(gone(rx.try_recv()), left(2));
        // Vacated, then the task ends before announcing (dropped while waiting for a grant).
        hub.state.lock().unwrap().members.push(member(3));
        let mut seat = Seat::new(hub.clone(), member(3), Duration::ZERO);
        seat.vacate();
        drop(seat);
        assert_eq!(gone(rx.try_recv()), left(3));
    }

    /// A mass reconnect of a big room within one interval (every member leaves and comes back)
    /// goes out in frames of at most `PRESENCE_CHUNK` changes, departures first, each within the
    /// protocol's limits (one frame of all 18,000 would not decode).
    #[tokio::test(start_paused = true)]
    async fn a_big_presence_batch_goes_out_in_chunks_that_decode() {
        let hub = Arc::new(Room::new(RoomId::new("b").unwrap(), genesis("b").into()));
        let mut rx = hub.tx.subscribe();
        let interval = Duration::from_millis(100);
        {
            let mut st = hub.state.lock().unwrap();
            hub.announce(&mut st, member(0), true, interval); // goes at once
            for i in 1..=9000 {
                hub.announce(&mut st, member(i), false, interval);
                hub.announce(&mut st, member(100_000 + i), true, interval);
            }
        }
        let _first = rx.try_recv().unwrap();
        // The batch's frames go out together when the interval ends.
        let mut next = Some(rx.recv().await.unwrap());
        let (mut joined, mut left, mut frames) = (Vec::new(), Vec::new(), 0);
        while let Some(Bcast::Presence { frame }) = next.take().or_else(|| rx.try_recv().ok()) {
            frames += 1;
            match hostlease::protocol::decode_server(&frame).expect("each frame decodes") {
                ServerMsg::PresenceBatch { joined: j, left: l } => {
                    assert!(j.len() + l.len() <= PRESENCE_CHUNK);
                    assert!(l.is_empty() || joined.is_empty(), "departures first");
                    joined.extend(j);
                    left.extend(l);
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(frames, 18_000usize.div_ceil(PRESENCE_CHUNK));
        assert_eq!(left, (1..=9000).map(member).collect::<Vec<_>>());
        assert_eq!(
            joined,
            (1..=9000).map(|i| member(100_000 + i)).collect::<Vec<_>>()
        );
    }

    /// A departure that made a grant waits for the interval's end: the assignment, published
    /// just before, was the room's frame for it. With an interval of 0 it goes at once.
    #[tokio::test(start_paused = true)]
    async fn a_departure_after_a_grant_waits_for_the_interval() {
        let hub = Arc::new(Room::new(RoomId::new("g").unwrap(), genesis("g").into()));
        let mut rx = hub.tx.subscribe();
        let interval = Duration::from_millis(100);
        let leave = |i: u64, interval: Duration| {
            let mut st = hub.state.lock().unwrap();
            hub.announce_after_grant(&mut st, member(i), interval);
        };
        leave(1, interval);
        assert!(rx.try_recv().is_err(), "held behind the assignment");
        let t = tokio::time::Instant::now();
        let Bcast::Presence { frame } = rx.recv().await.unwrap() else {
            panic!("an item")
        };
        assert_eq!(t.elapsed(), interval);
        assert_eq!(
            hostlease::protocol::decode_server(&frame).unwrap(),
            ServerMsg::Presence {
                member: member(1),
                online: false
            }
        );
        leave(2, Duration::ZERO);
        assert!(rx.try_recv().is_ok(), "no interval: at once");
    }

    async fn test_app() -> (tempfile::TempDir, Arc<App>) {
        test_app_with(Config::default()).await
    }

    async fn test_app_with(cfg: Config) -> (tempfile::TempDir, Arc<App>) {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&format!("sqlite://{}", dir.path().join("m.db").display()))
            .await
            .unwrap();
        let join = Verifier::from_keys(&[Keypair::generate("app").public()]).unwrap();
        let app = App::new(cfg, Arc::new(store), Keypair::generate("srv"), join, None);
        (dir, app)
    }

    /// A lost session queues for its participant's inbox only the seqs no lost session of the
    /// same participant queued before (16 sessions that never answer a ping, reset one after
    /// another, each queued everything published in its time); another participant's, and a
    /// retry of a recovery the store failed, are queued whole.
    #[tokio::test]
    async fn a_lost_session_queues_only_what_its_participant_has_not() {
        let (_dir, app) = test_app().await;
        let room = RoomId::new("r").unwrap();
        let lost = |p: &str, after: u64, upto: u64| crate::store::Lost {
            room: room.clone(),
            participant: ParticipantId::new(p).unwrap(),
            after: Seq(after),
            upto: Seq(upto),
        };
        let queued = |app: &App| -> Vec<(String, u64, u64)> {
            app.lost
                .lock()
                .unwrap()
                .drain(..)
                .map(|l| (l.participant.to_string(), l.after.0, l.upto.0))
                .collect()
        };
        app.lost(lost("m", 50, 100));
        app.lost(lost("m", 60, 90)); // inside: nothing new
        app.lost(lost("m", 40, 120)); // both sides
        app.lost(lost("m", 120, 130)); // touching
        app.lost(lost("b", 60, 90)); // another participant
        app.lost(lost("m", 200, 210)); // apart: whole
        app.lost(lost("m", 7, 7)); // empty
        assert_eq!(
            queued(&app),
            [
                ("m".into(), 50, 100),
                ("m".into(), 40, 50),
                ("m".into(), 100, 120),
                ("m".into(), 120, 130),
                ("b".into(), 60, 90),
                ("m".into(), 200, 210),
            ]
        );
        app.queue_lost(lost("m", 200, 210));
        assert_eq!(queued(&app), [("m".into(), 200, 210)]);
        // The store copies a session's newest 1,024 at most: only those count as queued, and a
        // gap before them is queued when another session lost it.
        app.lost(lost("c", 0, 5000));
        app.lost(lost("c", 1000, 1500));
        assert_eq!(
            queued(&app),
            [("c".into(), 3976, 5000), ("c".into(), 1000, 1500)]
        );
        // A range the full queue refused is not recorded: queued again later, whole.
        for _ in 0..LOST_MAX {
            app.queue_lost(lost("x", 0, 1));
        }
        app.lost(lost("d", 10, 20));
        assert!(!queued(&app).contains(&("d".into(), 10, 20)));
        app.lost(lost("d", 10, 20));
        assert_eq!(queued(&app), [("d".into(), 10, 20)]);
    }

    fn in_map(app: &App, room: &RoomId) -> bool {
        app.rooms.lock().unwrap().contains_key(room)
    }

    /// A held hub is released when its handle is dropped, with no explicit release: also when
    /// the future holding it is dropped mid-way (an HTTP request whose client went away).
    #[tokio::test]
    async fn a_dropped_holder_releases_its_hub() {
        let (_dir, app) = test_app().await;
        let room = RoomId::new("held").unwrap();

        let a = app.room(&room).await.unwrap().expect("a hub");
        let b = app.room(&room).await.unwrap().expect("a hub");
        assert!(Arc::ptr_eq(a.hub(), b.hub()), "one hub per room");
        drop(a);
        assert!(in_map(&app, &room), "still held by the other");
        drop(b);
        assert!(!in_map(&app, &room), "the last holder dropped it");

        // A request that acquired the hub and was then cancelled while waiting.
        let request = {
            let app = app.clone();
            let room = room.clone();
            async move {
                let hub = app.room(&room).await.unwrap().expect("a hub");
                let _decide = hub.decide.lock().await;
                std::future::pending::<()>().await;
            }
        };
        assert!(
            tokio::time::timeout(Duration::from_millis(50), request)
                .await
                .is_err(),
            "the request never finishes"
        );
        assert!(!in_map(&app, &room), "the dropped request released the hub");
    }

    fn snapshot_of(hub: &Room) -> (Seq, SignedAssignment) {
        let st = hub.state.lock().unwrap();
        (st.seq, st.current.clone())
    }

    /// A hub enters the map before its row is read, so the publisher may apply items first; the
    /// load must keep whichever is newer, the row or what was published.
    #[tokio::test]
    async fn a_new_hub_keeps_the_newer_of_its_row_and_what_was_published_meanwhile() {
        let (_dir, app) = test_app().await;
        let room = RoomId::new("merge").unwrap();
        let holder = (
            ParticipantId::new("alice").unwrap(),
            SessionId::new("s-alice").unwrap(),
        );
        let req = GrantReq {
            room: room.clone(),
            expected_epoch: Epoch::ZERO,
            holder: Some(holder.clone()),
            lease_ms: 60_000,
            reason: Reason::Elected,
            require_lapsed: false,
            close: false,
        };
        let GrantOutcome::Won {
            assignment: row, ..
        } = app.store.grant(req, &app.keys).await.unwrap()
        else {
            panic!("the first grant wins");
        };
        assert_eq!(row.assignment.seq, Seq(1));
        let fresh = || Room::new(room.clone(), app.genesis(&room, 0));

        // Nothing published before the read: the row.
        let hub = fresh();
        app.load(&hub).await.unwrap();
        assert_eq!(snapshot_of(&hub), (Seq(1), row.clone()));

        // An event published before the read finished: its seq stands, the row's assignment too.
        let hub = fresh();
        hub.publish(Item::Event(RoomEvent {
            seq: Seq(2),
            epoch: Epoch(1),
            actor: holder.0.clone(),
            action: Action::new("poll.open").unwrap(),
            payload: hostlease::protocol::Json::parse("{}").expect("an empty object"),
            at: ServerTime(0),
        }));
        app.load(&hub).await.unwrap();
        assert_eq!(snapshot_of(&hub), (Seq(2), row.clone()));

        // An assignment newer than the row, published first: it stands.
        let hub = fresh();
        let newer = app.keys.sign_assignment(Assignment {
            epoch: Epoch(2),
            seq: Seq(3),
            ..row.assignment.clone()
        });
        hub.publish(Item::Assignment(newer.clone()));
        app.load(&hub).await.unwrap();
        assert_eq!(snapshot_of(&hub), (Seq(3), newer));
    }

    /// A signal a full queue drops is not charged to its sender's signal bytes: a member that
    /// reads nothing (16 sessions, each queue full) spent its senders' budget on signals it
    /// never got, and their offers to the other peers were dropped. Past the budget a signal is
    /// dropped.
    #[tokio::test]
    async fn a_signal_a_full_queue_drops_is_not_charged() {
        // A budget of four queues' worth, refilled at 1 byte a second.
        let (_dir, app) = test_app_with(Config {
            signal_bytes_rate: 1.0,
            signal_bytes_burst: 4.0 * OUTLET_BYTES as f64,
            ..Config::default()
        })
        .await;
        let hub = Arc::new(Room::new(RoomId::new("sg").unwrap(), genesis("sg").into()));
        let (slow, _slow_rx) = Outlet::new();
        let (fast, mut fast_rx) = Outlet::new();
        {
            let mut st = hub.state.lock().unwrap();
            st.members.extend([member(1), member(2)]);
            st.conns.insert(member(1).session, slow);
            st.conns.insert(member(2).session, fast);
        }
        let from = ParticipantId::new("sender").unwrap();
        let frame: Utf8Bytes = "x".repeat(60 * 1024).into();
        // Far more than the burst to the member that reads nothing: its queue takes 17.
        for _ in 0..200 {
            app.signal(&hub, &from, |m| m.join_seq == 1, &frame);
        }
        // The budget left is the burst less those 17: the other member gets its share.
        let burst = app.cfg.signal_bytes_burst;
        let left = ((burst - 17.0 * frame.len() as f64) / frame.len() as f64).floor() as usize;
        assert!(left >= 1, "{left}");
        let mut got = 0;
        for _ in 0..left + 3 {
            app.signal(&hub, &from, |m| m.join_seq == 2, &frame);
            // (Read at once: this member's queue never fills.)
            while fast_rx.try_recv().is_ok() {
                got += 1;
            }
        }
        // And past the budget, dropped.
        assert_eq!(got, left);
    }

    /// A session's queue holds at most `OUTLET_BYTES` of signals: a sender flooding a member
    /// that reads slowly can no longer park 256 frames of 64 KiB there. What the session writes
    /// gives its bytes back; a close goes in whatever the queue holds.
    #[tokio::test]
    async fn a_session_queue_is_bounded_in_bytes() {
        let (out, mut rx) = Outlet::new();
        let frame: Utf8Bytes = "x".repeat(60 * 1024).into();
        for _ in 0..40 {
            deliver(&out, Direct::Frame(frame.clone()));
        }
        let fit = OUTLET_BYTES / frame.len();
        let mut queued = Vec::new();
        while let Ok(q) = rx.try_recv() {
            queued.push(q);
        }
        assert_eq!(
            queued.len(),
            fit,
            "{fit} frames of 60 KiB fit in the budget"
        );
        deliver(&out, Direct::Close("bye".into()));
        assert!(matches!(rx.try_recv(), Ok(Queued(Direct::Close(_), _))));
        // Written (dropped): their bytes are free again.
        queued.clear();
        deliver(&out, Direct::Frame(frame.clone()));
        assert!(matches!(
            rx.try_recv(),
            Ok(Queued(Direct::Frame(_), Some(_)))
        ));
    }
}
