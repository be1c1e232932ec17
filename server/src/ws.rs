//! The live session: `GET /v1/rooms/{room}/ws`.
//!
//! hello (join token in the first frame) → welcome at the subscription point → participant
//! capability → the room stream. A host session is probed every `ttl/3`; each echo renews the
//! lease in the store and is answered by `lease_confirm` and a fresh host capability.

use std::collections::VecDeque;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use futures_util::stream::FuturesOrdered;
use futures_util::{FutureExt, SinkExt, StreamExt};
use hostlease::core::elect;
use hostlease::protocol::{
    codec::{
        decode_client, decode_server, encode_server, HEARTBEAT_MS, MAX_CLIENT_FRAME,
        MAX_CLIENT_PAYLOAD, MAX_MEMBERS, MAX_PAYLOAD_DEPTH, MAX_REPLAY,
    },
    Action, ActionKind, ClientMsg, DecodeError, Epoch, ErrorCode, Gap, IdempotencyKey, Item, Json,
    Member, Outcome, ParticipantId, Reason, RejectCode, Role, RoomId, Seq, ServerMsg, SessionId,
    Token, ACTION_RESIGN, ACTION_TRANSFER,
};
use tokio::sync::{broadcast, mpsc};
use tokio::time::Instant;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use tokio_stream::wrappers::BroadcastStream;

use crate::limit::{Bucket, Counted};
use crate::rooms::{correlation_id, App, Bcast, Direct, Room};
use crate::store::{CommandDone, CommandReq, Held, Order, Pending, Renewed};
use crate::tokens::{CapClaims, JoinClaims, CAP_PREFIX, JOIN_PREFIX};

/// A connection's commands being decided at once at most; past it, the connection's next frame
/// waits (TCP backpressure on the client).
const MAX_IN_FLIGHT: usize = 64;

/// Sessions one participant may hold in one room at once (its tabs and devices); one more is
/// refused `too_many_connections`.
pub const MAX_SESSIONS_PER_PARTICIPANT: usize = 16;

/// A connection's commands in flight, each resolving to its `command_result`.
type Commands = FuturesOrdered<Pin<Box<dyn Future<Output = ServerMsg> + Send>>>;

/// How long a departing host's presence frame waits for its successor's assignment to go out.
const PUBLISH_WAIT: Duration = Duration::from_millis(100);

/// Probes whose echo still renews the lease (the client keeps as many echoes).
const PROBES_KEPT: usize = 4;

/// The replayed items' share of a welcome, in encoded bytes: a quarter of the client's 4 MiB
/// frame limit, leaving room for a full snapshot (a larger log made every welcome too large to
/// read, and the client dialled for ever). A client further behind gets the newest items that
/// fit and a gap for the rest.
const REPLAY_BYTES: usize = 1 << 20;

/// Broadcast frames written per flush at most.
const BROADCAST_BATCH: usize = 64;

type Stream = futures_util::stream::SplitStream<WebSocket>;

/// A write that did not complete: the socket failed, or the client stopped reading and the write
/// outlasted the sink's limit. Either way the session ends.
#[derive(Debug)]
struct WriteFailed;

/// The socket's write half, every write bounded by `limit` (`Config::write_timeout_ms`): a
/// client that stops reading fills the socket's buffers, and an unbounded write would then hold
/// its session, member entry and connection slot forever.
struct Sink {
    inner: futures_util::stream::SplitSink<WebSocket, Message>,
    limit: Duration,
    /// When frames were last written (a send or a flush; every queued frame is flushed): the
    /// heartbeat's reference, read once per write, not once per broadcast frame queued.
    last: Instant,
    /// A close frame was written (after every frame before it): the server ended the session.
    closed: bool,
}

impl Sink {
    fn done<E>(r: Result<Result<(), E>, tokio::time::error::Elapsed>) -> Result<(), WriteFailed> {
        match r {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(WriteFailed),
            Err(_) => {
                metrics::counter!("hostlease_ws_write_timeouts_total").increment(1);
                Err(WriteFailed)
            }
        }
    }

    /// Writes and flushes one frame.
    async fn send(&mut self, m: Message) -> Result<(), WriteFailed> {
        self.last = Instant::now();
        let close = matches!(m, Message::Close(_));
        let sent = Self::done(tokio::time::timeout(self.limit, self.inner.send(m)).await);
        self.closed |= close && sent.is_ok();
        sent
    }

    /// Queues one frame (written when the buffer fills or at the next flush).
    async fn feed(&mut self, m: Message) -> Result<(), WriteFailed> {
        Self::done(tokio::time::timeout(self.limit, self.inner.feed(m)).await)
    }

    async fn flush(&mut self) -> Result<(), WriteFailed> {
        self.last = Instant::now();
        Self::done(tokio::time::timeout(self.limit, self.inner.flush()).await)
    }

    async fn close(&mut self) -> Result<(), WriteFailed> {
        Self::done(tokio::time::timeout(self.limit, self.inner.close()).await)
    }

    /// Writes a WebSocket ping carrying `sent` (its pong says the client has every item up to
    /// it). Not a frame the SDK hears (the browser answers it by itself), so it leaves `last`,
    /// the heartbeat's reference, alone.
    async fn ping(&mut self, sent: Seq) -> Result<(), WriteFailed> {
        let payload = sent.0.to_be_bytes().to_vec().into();
        Self::done(tokio::time::timeout(self.limit, self.inner.send(Message::Ping(payload))).await)
    }
}

/// Records (in the background) that `sub` was in `room` now, for its offline inbox.
fn remember(app: &Arc<App>, room: &RoomId, sub: &ParticipantId) {
    let (app, room, sub) = (app.clone(), room.clone(), sub.clone());
    tokio::spawn(async move {
        // A sighting past the store's queue bound is counted there, not warned of per join.
        if let Err(e) = app.store.remember_participant(&room, &sub).await {
            tracing::warn!(error = %e, "participant not recorded");
        }
    });
}

/// Heartbeat periods a client may stay silent (no frame, not even the pong its browser sends for
/// a ping) before its session is ended as dead: a client gone without a close (power, network,
/// a suspended laptop) otherwise held its session, member entry and connection slot until the
/// kernel gave the TCP connection up, about 15 minutes.
const SILENT_PERIODS: u32 = 3;

/// How long a connection may go without a frame before it gets a heartbeat.
fn heartbeat_every(app: &App) -> Duration {
    Duration::from_millis(app.cfg.heartbeat_ms.clamp(1, HEARTBEAT_MS))
}

fn frame(msg: &ServerMsg) -> Message {
    Message::Text(encode_server(msg).into())
}

/// An `error` frame; its message cut to `MAX_MESSAGE_LEN` bytes (at a character boundary), the
/// most a client accepts (it was cut to 200 characters, up to 800 bytes).
fn error_msg(code: ErrorCode, message: &str) -> ServerMsg {
    let max = hostlease::protocol::codec::MAX_MESSAGE_LEN;
    ServerMsg::Error {
        code,
        message: hostlease::protocol::clamp_bytes(message, max).into(),
    }
}

async fn close_with(sink: &mut Sink, code: ErrorCode, message: &str) {
    metrics::counter!("hostlease_ws_errors_total", "code" => code.as_str()).increment(1);
    // A write that fails or times out ends the attempt: the next ones would only wait as long.
    if sink.send(frame(&error_msg(code, message))).await.is_err() {
        return;
    }
    if sink
        .send(Message::Close(Some(CloseFrame {
            code: if code == ErrorCode::Internal {
                1011
            } else {
                1008
            },
            reason: code.as_str().into(),
        })))
        .await
        .is_err()
    {
        return;
    }
    let _ = sink.close().await;
}

/// Whether a read failed on a frame past the transport's limit (twice the protocol's, see
/// `http::ws_upgrade`): answered `frame_too_large` like one within it, not dropped as a broken
/// connection (the client saw a reset, and before a hello was told `unexpected_message`).
fn too_large(e: &axum::Error) -> bool {
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<tungstenite::Error>())
        .is_some_and(|e| matches!(e, tungstenite::Error::Capacity(_)))
}

fn decode_error_code(e: &DecodeError) -> ErrorCode {
    match e {
        DecodeError::TooLarge { .. } => ErrorCode::FrameTooLarge,
        DecodeError::UnsupportedVersion(_) => ErrorCode::UnsupportedVersion,
        _ => ErrorCode::BadFrame,
    }
}

/// Frames of any kind beyond this many times the command rate (and burst) close the connection:
/// a flood. Commands beyond the rate itself are refused one by one (`Bucket::admit`).
const FLOOD_FACTOR: f64 = 4.0;
/// The flood limit's burst is never under this: the SDK sends up to its `command_limit` (256)
/// commands at once after a resync (a test checks it against the SDK's), and with a low `msg_rate` that was a flood, closed, sent
/// again after the reconnect, and closed again.
pub const FLOOD_MIN_BURST: f64 = 320.0;

/// Resumes per second per connection, and burst. Each costs a log read, a welcome of up to
/// 1 MiB of replay and a signed token; the SDK sends one at a time (after a gap, or a wake: a
/// tab shown again), each after the last one's welcome. Past this a resume waits its turn (the
/// connection stays open; a client that sends a burst gets its welcomes at this rate). Per
/// connection, not per participant: the wait holds up the session's loop (its probes and
/// echoes), which another tab of the same participant must not be able to cause.
const RESUME_RATE: f64 = 2.0;
const RESUME_BURST: f64 = 10.0;

fn random_session() -> SessionId {
    let mut b = [0u8; 12];
    getrandom::fill(&mut b).expect("random source");
    let s: String = b.iter().map(|x| format!("{x:02x}")).collect();
    SessionId::new(format!("s-{s}")).expect("valid session id")
}

/// `address`: the client's, as the HTTP limiter keys it.
pub async fn run(app: Arc<App>, room_id: RoomId, address: IpAddr, socket: WebSocket) {
    // Counted until the socket is dropped, drain included, so the caps bound open sockets.
    let (_counted, count, from_address) = Counted::new(&app.ws_sockets, address);
    let (sink, mut stream) = socket.split();
    let mut sink = Sink {
        inner: sink,
        limit: Duration::from_millis(app.cfg.write_timeout_ms),
        last: Instant::now(),
        closed: false,
    };
    if count > app.cfg.max_connections {
        close_with(
            &mut sink,
            ErrorCode::TooManyConnections,
            "too many connections",
        )
        .await;
    } else if from_address > app.cfg.max_sockets_per_address {
        metrics::counter!("hostlease_ws_address_refused_total").increment(1);
        close_with(
            &mut sink,
            ErrorCode::TooManyConnections,
            "too many connections from this address",
        )
        .await;
    } else {
        serve(app, room_id, sink, &mut stream).await;
    }
    drain(&mut stream).await;
}

/// After a session ends, reads (and drops) what the client still sends, briefly and boundedly:
/// closing a TCP socket with unread bytes in it makes the kernel reset the connection, and the
/// reset can destroy the typed error frame and the close frame sent just before, on their way
/// to a client that was still sending (a flooding one, typically).
async fn drain(stream: &mut Stream) {
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        for _ in 0..1024 {
            if !matches!(stream.next().await, Some(Ok(_))) {
                break;
            }
        }
    })
    .await;
}

async fn serve(app: Arc<App>, room_id: RoomId, mut sink: Sink, stream: &mut Stream) {
    // The first frame must be a hello, within a bounded time.
    let first = tokio::time::timeout(Duration::from_secs(10), stream.next()).await;
    let text = match first {
        Ok(Some(Ok(Message::Text(t)))) => t,
        Ok(Some(Ok(Message::Binary(_)))) => {
            close_with(
                &mut sink,
                ErrorCode::BadFrame,
                "binary frames are not accepted",
            )
            .await;
            return;
        }
        Ok(Some(Err(e))) if too_large(&e) => {
            close_with(&mut sink, ErrorCode::FrameTooLarge, "frame too large").await;
            return;
        }
        _ => {
            close_with(&mut sink, ErrorCode::UnexpectedMessage, "expected hello").await;
            return;
        }
    };
    let (token, resume) = match decode_client(text.as_str()) {
        Ok(ClientMsg::Hello {
            token,
            resume,
            epoch_seen,
        }) => {
            // A client that had a view before (the SDK also sends `resume` on its first hello,
            // to replay the room's history).
            if epoch_seen.is_some() {
                metrics::counter!("hostlease_reconnects_total").increment(1);
            }
            (token, resume)
        }
        Ok(_) => {
            close_with(
                &mut sink,
                ErrorCode::UnexpectedMessage,
                "the first frame must be hello",
            )
            .await;
            return;
        }
        Err(e) => {
            close_with(&mut sink, decode_error_code(&e), e.code()).await;
            return;
        }
    };
    let claims: JoinClaims = match app.join_keys.verify(JOIN_PREFIX, token.expose()) {
        Ok(c) => c,
        Err(_) => {
            close_with(&mut sink, ErrorCode::Unauthorized, "join token refused").await;
            return;
        }
    };
    if claims.room != room_id || claims.exp <= crate::tokens::now_ms() {
        close_with(&mut sink, ErrorCode::Unauthorized, "join token refused").await;
        return;
    }
    drop(token);
    let room = match app.room(&room_id).await {
        Ok(Some(r)) => r,
        Ok(None) => {
            close_with(&mut sink, ErrorCode::TooManyRooms, "too many rooms").await;
            return;
        }
        Err(e) => {
            tracing::error!(error = %e, "room load failed");
            close_with(&mut sink, ErrorCode::Internal, "storage unavailable").await;
            return;
        }
    };
    let session = random_session();
    let presence_interval = Duration::from_millis(app.cfg.presence_ms);
    let (mut dtx, drx) = crate::rooms::Outlet::new();
    // The subscription point: join, snapshot and subscribe under one lock, so that nothing
    // published falls between the snapshot and the stream.
    let joined = {
        let mut st = room.state.lock().expect("room lock");
        // Closed here, or through another process: its closing assignment is published here
        // before this process's next sweep closes the room's sessions (up to 5 s later).
        if st.closed || st.current.assignment.reason == Reason::Closed {
            Err(ErrorCode::RoomClosed)
        } else if st.members.len() >= app.cfg.max_members.min(MAX_MEMBERS) {
            Err(ErrorCode::RoomFull)
        } else if st.members.iter().filter(|m| m.id == claims.sub).count()
            >= MAX_SESSIONS_PER_PARTICIPANT
        {
            // One join token would otherwise fill the room (and multiply every per-connection
            // budget by the room's size).
            Err(ErrorCode::TooManyConnections)
        } else {
            // When the session began, read where it joins: a kick recorded from then on
            // revokes its capabilities, and one recorded before finds it not yet a member and
            // leaves it be (read before the hello, a session that joined while a kick was
            // recorded was neither closed nor able to use a capability, until the kick's
            // record was deleted an hour later).
            let started_ms = app.store.clock_ms();
            let member = Member {
                id: claims.sub.clone(),
                session: session.clone(),
                name: Member::clamp_name(&claims.name).to_string(),
                join_seq: st.next_join,
                may_host: claims.may_host,
            };
            st.next_join += 1;
            st.members.push(member.clone());
            let snapshot = app.snapshot_locked(&room, &st, None);
            dtx.since = snapshot.seq;
            dtx.started_ms = started_ms;
            st.conns.insert(session.clone(), dtx);
            let rx = room.tx.subscribe();
            room.announce(&mut st, member.clone(), true, presence_interval);
            Ok((member, snapshot, rx, started_ms))
        }
    };
    let (member, snapshot, rx, started_ms) = match joined {
        Ok(j) => j,
        Err(code) => {
            close_with(&mut sink, code, code.as_str()).await;
            return;
        }
    };
    let mut seat = crate::rooms::Seat::new(room.hub().clone(), member, presence_interval);
    // Recorded for the offline inbox; the session does not wait for it.
    remember(&app, &room_id, &claims.sub);
    let mut conn = Conn {
        app: app.clone(),
        room: room.hub().clone(),
        me: claims.sub.clone(),
        session: session.clone(),
        started_ms,
        sink,
        host_epoch: None,
        host_ttl: app.cfg.lease_ms,
        probes: VecDeque::new(),
        next_probe: None,
        participant_refresh: Instant::now(),
        heartbeat_at: Instant::now() + heartbeat_every(&app),
        heard: Instant::now(),
        pinged_at: Instant::now(),
        sent: snapshot.seq,
        acked: snapshot.seq,
        queued_upto: snapshot.seq,
        flood: Bucket::new(
            app.cfg.msg_rate * FLOOD_FACTOR,
            (app.cfg.msg_burst * FLOOD_FACTOR).max(FLOOD_MIN_BURST),
        ),
        resume_rate: Bucket::new(RESUME_RATE, RESUME_BURST),
        held: Arc::default(),
    };
    let explicit = conn.live(snapshot, resume, rx, drx, stream).await;
    // Lost: neither side closed (a server close goes after everything sent before it).
    let lost = !explicit && !conn.sink.closed;
    // What its gaps queued already is not queued again.
    let acked = conn.acked.max(conn.queued_upto);
    // Seen until now: a member connected for longer than the participant retention is not
    // forgotten for the inbox the moment it leaves (not when the server is shutting down).
    if !*app.shutdown.borrow() {
        remember(&app, &room_id, &claims.sub);
    }
    metrics::counter!("hostlease_connections_closed_total", "how" => if explicit { "left" } else { "dropped" })
        .increment(1);
    // Leaving: the member goes; a host that left explicitly is replaced at once, a dead
    // connection only stops renewing (the sweeper reassigns after expiry). The room hears of the
    // departure after the grant, so the new assignment reaches every member first (a snapshot
    // taken in between already lacks the member; the late presence frame changes nothing there).
    let listed_upto = seat.vacate();
    // Gone without a close (silent, reset, a write failed): what was published while it was
    // listed after the last item its client confirmed goes to its inbox (a duplicate of one it
    // did get is cheaper than a loss).
    if let (true, false, Some(upto)) = (lost, *app.shutdown.borrow(), listed_upto) {
        app.lost(crate::store::Lost {
            room: room_id.clone(),
            participant: claims.sub.clone(),
            after: acked,
            upto,
        });
    }
    let mut granted = false;
    if explicit {
        match app
            .replace_host(&room, &session, Reason::Left, &correlation_id())
            .await
        {
            Ok(Some(seq)) => granted = room.wait_published(seq, PUBLISH_WAIT).await,
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "replace host failed"),
        }
    }
    seat.announce_gone(granted);
    // `room` (the held hub) is released here, as on every earlier return.
}

struct Conn {
    app: Arc<App>,
    room: Arc<Room>,
    me: ParticipantId,
    session: SessionId,
    /// When the session began (ms since the Unix epoch): its capabilities' `sat`.
    started_ms: u64,
    sink: Sink,
    /// Set while the latest assignment names this session: the epoch being probed.
    host_epoch: Option<Epoch>,
    /// The TTL of the current grant to this session (probe interval is a third of it).
    host_ttl: u64,
    /// The probes an echo may still answer, `(nonce, epoch, sent)`, oldest first: an echo can
    /// take longer than the probe interval (a slow or busy client), and the client takes a
    /// confirmation for any of its last four echoes. Each is spent by its first echo.
    probes: VecDeque<(u64, Epoch, Instant)>,
    next_probe: Option<Instant>,
    participant_refresh: Instant,
    /// When to look at whether the connection has been quiet for a heartbeat period. Moved only
    /// when the timer fires (a frame sent meanwhile makes it fire early, for nothing), not on
    /// every write: a broadcast writes to every session of a room.
    heartbeat_at: Instant,
    /// When the client's last frame (of any kind, pongs too) came: a client quiet for
    /// `SILENT_PERIODS` is given up.
    heard: Instant,
    /// When the last ping went: every client is pinged once a period, quiet or not (its pong
    /// says which items it has).
    pinged_at: Instant,
    /// The last seq of the items sent in order from the session's start (or its latest
    /// welcome): one past a gap (the broadcast lagged) is sent but not counted.
    sent: Seq,
    /// The last seq the client confirmed having, by the pong for a ping that carried it.
    acked: Seq,
    /// Every item up to it was sent, or published before the session began, or queued for the
    /// inbox as a resume's gap: a gap is queued from past it only (a client resuming from 0
    /// again and again queues nothing more).
    queued_upto: Seq,
    /// Every client frame: past it, the connection is closed `rate_limited`.
    flood: Bucket,
    /// Resumes: past it, a resume waits for its turn.
    resume_rate: Bucket,
    /// Its commands refused with a retry time (or held) and not decided since: those sent after
    /// them are held (`store::Order`).
    held: Arc<Held>,
}

enum Flow {
    Continue,
    /// Ended; `true` when the client left explicitly (leave frame or its own close).
    End(bool),
    /// Nothing heard from the client for `SILENT_PERIODS`: it ends unless a frame is waiting.
    Silent,
}

impl Conn {
    async fn send(&mut self, msg: &ServerMsg) -> bool {
        self.sink.send(frame(msg)).await.is_ok()
    }

    async fn live(
        &mut self,
        snapshot: hostlease::protocol::Snapshot,
        resume: Option<Seq>,
        rx: broadcast::Receiver<Bcast>,
        mut drx: mpsc::Receiver<crate::rooms::Queued>,
        stream: &mut Stream,
    ) -> bool {
        if !self.welcome(snapshot, resume, false).await {
            return false;
        }
        if !self.send_participant_capability().await {
            return false;
        }
        // A join may make someone host (first eligible member of a hostless room). A room with
        // a host needs nothing: a lapsed lease is the sweeper's to reassign.
        let hostless = self
            .room
            .state
            .lock()
            .expect("room lock")
            .current
            .assignment
            .host
            .is_none();
        if hostless {
            let app = self.app.clone();
            let room = self.room.clone();
            tokio::spawn(async move {
                if let Err(e) = app.reconcile(&room, &correlation_id()).await {
                    tracing::warn!(error = %e, "reconcile failed");
                }
            });
        }
        let mut shutdown = self.app.shutdown.subscribe();
        // The room's broadcast as a stream: its receive future lives across the loop's turns, so
        // a wake for any other reason does not unregister it from (and register it again with)
        // the channel, under the channel's lock shared by every session of the room.
        let mut rx = BroadcastStream::new(rx);
        // Commands queued with the store, answered in the order they came: the next frame is
        // read while earlier commands are still being committed (up to `MAX_IN_FLIGHT`).
        let mut commands: Commands = FuturesOrdered::new();
        // One timer for the session's timed duties (the host probe, the participant token's
        // refresh), moved only when the next of them moves: a broadcast wakes every session of
        // a room, and a timer made anew on each wake costs every one of them.
        let timer = tokio::time::sleep_until(self.participant_refresh);
        tokio::pin!(timer);
        loop {
            let due = self
                .next_probe
                .map_or(self.participant_refresh, |p| {
                    p.min(self.participant_refresh)
                })
                .min(self.heartbeat_at);
            if timer.deadline() != due {
                timer.as_mut().reset(due);
            }
            if commands.len() >= MAX_IN_FLIGHT {
                // Not reading the client (its frames wait in the socket): a silence of the
                // server's making is not the client's.
                self.heard = Instant::now();
            }
            let flow = tokio::select! {
                m = stream.next(), if commands.len() < MAX_IN_FLIGHT => self.on_client(m, &mut commands, &mut rx).await,
                Some(answer) = commands.next() => self.answer(answer, &mut rx).await,
                b = rx.next() => match b {
                    Some(Ok(b)) => self.on_broadcasts(b, &mut rx).await,
                    // A slow client: it sees a seq gap on the next item and resumes.
                    Some(Err(BroadcastStreamRecvError::Lagged(_))) => Flow::Continue,
                    None => Flow::End(false),
                },
                d = drx.recv() => match d {
                    // The frame's share of the queue's bytes is held until it is written.
                    Some(crate::rooms::Queued(Direct::Frame(f), _held)) => {
                        if self.sink.send(Message::Text(f)).await.is_ok() { Flow::Continue } else { Flow::End(false) }
                    }
                    Some(crate::rooms::Queued(Direct::Close(f), _)) => {
                        // What was published before the close goes out first (a room's closing
                        // assignment before its `room_closed`).
                        if let Flow::End(e) = self.drain_broadcasts(&mut rx).await {
                            return e;
                        }
                        // An error frame from elsewhere (admin kick or close): counted like the
                        // session's own errors (`close_with`).
                        if let Ok(ServerMsg::Error { code, .. }) = decode_server(&f) {
                            metrics::counter!("hostlease_ws_errors_total", "code" => code.as_str()).increment(1);
                        }
                        if self.sink.send(Message::Text(f.into())).await.is_ok() {
                            let _ = self.sink.send(Message::Close(None)).await;
                        }
                        Flow::End(false)
                    }
                    None => Flow::End(false),
                },
                _ = &mut timer => self.on_timer().await,
                // Set already when this session went live (it joined during the shutdown)
                // counts too: `changed` would wait for a change that never comes.
                () = async { let _ = shutdown.wait_for(|stop| *stop).await; } => {
                    close_with(&mut self.sink, ErrorCode::Internal, "server shutting down").await;
                    Flow::End(false)
                }
            };
            let flow = match flow {
                // The timer may have won the race against a frame already read from the socket
                // (the loop was busy): one read that does not wait before the client is blamed.
                Flow::Silent => match stream.next().now_or_never() {
                    Some(m) => self.on_client(m, &mut commands, &mut rx).await,
                    None => {
                        metrics::counter!("hostlease_ws_unresponsive_total").increment(1);
                        Flow::End(false)
                    }
                },
                f => f,
            };
            if let Flow::End(explicit) = flow {
                return explicit;
            }
        }
    }

    /// The welcome for `hello`/`resume`: the snapshot, and the items after `resume` up to it
    /// (the newest `MAX_REPLAY` within `REPLAY_BYTES`; older or trimmed ones are announced as a
    /// gap). Queued on the sink; the caller flushes. `midway`: a `resume` on the live session,
    /// whose gap was published while it was listed (counted as got live): it goes to the inbox
    /// (as far as the log still has it). A hello's gap is there already (published while the
    /// participant was away, or recovered from the session that lost it).
    async fn welcome(
        &mut self,
        mut snapshot: hostlease::protocol::Snapshot,
        resume: Option<Seq>,
        midway: bool,
    ) -> bool {
        let mut missed = Vec::new();
        let mut discontinuity = None;
        if let Some(cursor) = resume {
            if cursor < snapshot.seq {
                match self
                    .app
                    .store
                    .log_range(
                        &self.room.id,
                        cursor,
                        snapshot.seq,
                        MAX_REPLAY,
                        REPLAY_BYTES,
                    )
                    .await
                {
                    Ok((items, _min)) => {
                        let first = items.first().map_or(snapshot.seq.next(), Item::seq);
                        if first > cursor.next() {
                            discontinuity = Some(Gap {
                                from: cursor.next(),
                                to: Seq(first.0 - 1),
                            });
                        }
                        missed = items;
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "log read failed");
                        close_with(&mut self.sink, ErrorCode::Internal, "storage unavailable")
                            .await;
                        return false;
                    }
                }
            }
        }
        if let (true, Some(gap)) = (midway, discontinuity) {
            self.app.lost(crate::store::Lost {
                room: self.room.id.clone(),
                participant: self.me.clone(),
                after: Seq(gap.from.0.saturating_sub(1)).max(self.queued_upto),
                upto: gap.to,
            });
            self.queued_upto = self.queued_upto.max(gap.to);
        }
        let names_me = snapshot.current.assignment.names(&self.me, &self.session);
        // The lease a welcome tells its host of, with the host capability that goes with it.
        let mut lease = None;
        if names_me {
            if let Ok(Some(row)) = self.app.store.room(&self.room.id).await {
                // Not while fenced: the lease it is told of would be authority before the one
                // it replaced has run out (its holder then learns it from a confirm).
                if row.epoch == snapshot.current.assignment.epoch && row.lease_held() {
                    let remaining = row.lease_expires - row.now;
                    snapshot.lease_remaining_ms = Some(remaining);
                    lease = Some((row.lease_expires, remaining));
                }
            }
        }
        let epoch = snapshot.current.assignment.epoch;
        // The client has every item up to the snapshot once it reads this.
        self.sent = self.sent.max(snapshot.seq);
        if names_me {
            self.host_ttl = snapshot.current.assignment.lease_ms.max(3);
        }
        // Queued, not flushed: the participant capability follows at once, in the same write.
        let ok = self
            .sink
            .feed(frame(&ServerMsg::Welcome {
                you: self.me.clone(),
                session: self.session.clone(),
                snapshot,
                missed,
                discontinuity,
            }))
            .await
            .is_ok();
        if !ok {
            return false;
        }
        if names_me {
            self.become_host(epoch);
        }
        // A host told of its lease by a welcome holds it from then on, and so gets its token
        // with it: one the server sent while the client was resyncing (the confirm of a probe
        // answered meanwhile, for an epoch the client had not applied yet) was dropped, and
        // until the next renewal its host commands failed `NoCapability` with the lease held.
        match lease {
            Some((expires, remaining)) => {
                let capability = self.host_capability(epoch, expires, remaining);
                self.sink.feed(frame(&capability)).await.is_ok()
            }
            None => true,
        }
    }

    fn become_host(&mut self, epoch: Epoch) {
        if self.host_epoch != Some(epoch) {
            self.host_epoch = Some(epoch);
            self.next_probe = Some(Instant::now());
        }
    }

    /// A host capability for `epoch`, valid until `expires` (the store clock), `remaining_ms`
    /// from now.
    fn host_capability(&self, epoch: Epoch, expires: u64, remaining_ms: u64) -> ServerMsg {
        let mut actions = self.app.action_table().host;
        actions.dedup();
        let claims = CapClaims {
            room: self.room.id.clone(),
            sub: self.me.clone(),
            sid: self.session.clone(),
            role: Role::Host,
            epoch: Some(epoch),
            actions: actions.clone(),
            exp: expires,
            sat: self.started_ms,
            kid: self.app.keys.kid.clone(),
        };
        ServerMsg::Capability {
            role: Role::Host,
            token: Token::new(self.app.keys.sign_token(CAP_PREFIX, &claims)),
            epoch: Some(epoch),
            actions,
            expires_in_ms: remaining_ms,
        }
    }

    async fn send_participant_capability(&mut self) -> bool {
        let ttl = self.app.cfg.participant_token_ms;
        let actions = self.app.cfg.actions.participant.clone();
        let claims = CapClaims {
            room: self.room.id.clone(),
            sub: self.me.clone(),
            sid: self.session.clone(),
            role: Role::Participant,
            epoch: None,
            actions: actions.clone(),
            exp: self.app.store.clock_ms() + ttl,
            sat: self.started_ms,
            kid: self.app.keys.kid.clone(),
        };
        let token = Token::new(self.app.keys.sign_token(CAP_PREFIX, &claims));
        self.participant_refresh = Instant::now() + Duration::from_millis(ttl * 3 / 4);
        self.send(&ServerMsg::Capability {
            role: Role::Participant,
            token,
            epoch: None,
            actions,
            expires_in_ms: ttl,
        })
        .await
    }

    /// The timed duties that are due: the host probe, the participant token's refresh.
    async fn on_timer(&mut self) -> Flow {
        let now = Instant::now();
        if self.next_probe.is_some_and(|p| p <= now) {
            if let Flow::End(e) = self.probe().await {
                return Flow::End(e);
            }
        }
        if self.participant_refresh <= now && !self.send_participant_capability().await {
            return Flow::End(false);
        }
        if self.heartbeat_at <= now {
            let every = heartbeat_every(&self.app);
            if self.heard + every * SILENT_PERIODS <= now {
                return Flow::Silent;
            }
            if self.sink.last + every <= now && !self.send(&ServerMsg::Heartbeat).await {
                return Flow::End(false);
            }
            if self.pinged_at + every <= now {
                self.pinged_at = now;
                if self.sink.ping(self.sent).await.is_err() {
                    return Flow::End(false);
                }
            }
            // The next look comes within a period (`last` and `pinged_at` are now at the
            // latest): a client is pinged once a period.
            self.heartbeat_at = self.sink.last.min(self.pinged_at) + every;
        }
        Flow::Continue
    }

    async fn probe(&mut self) -> Flow {
        let Some(epoch) = self.host_epoch else {
            self.next_probe = None;
            return Flow::Continue;
        };
        let nonce = {
            let mut b = [0u8; 8];
            getrandom::fill(&mut b).expect("random source");
            u64::from_le_bytes(b) >> 11
        };
        if self.probes.len() == PROBES_KEPT {
            self.probes.pop_front();
        }
        self.probes.push_back((nonce, epoch, Instant::now()));
        self.next_probe = Some(Instant::now() + Duration::from_millis((self.host_ttl / 3).max(1)));
        if self.send(&ServerMsg::LeaseProbe { nonce, epoch }).await {
            Flow::Continue
        } else {
            Flow::End(false)
        }
    }

    /// The client's page answered (an echo, a resume, a command of its own: not a pong, which
    /// the browser sends for a frozen page too): if its lease had lapsed, elections no longer
    /// pass it over.
    fn answered(&self) {
        self.room
            .state
            .lock()
            .expect("room lock")
            .lapsed
            .remove(&self.session);
    }

    async fn on_echo(&mut self, nonce: u64) -> Flow {
        // One renewal per probe: the nonce, and every older one, is spent by its first echo (a
        // repeated echo would otherwise renew, and cost a store write, as often as a client
        // cares to send it). A probe of an earlier grant renews nothing, but shows the page
        // runs: a session its lease lapsed from that answers late is elected again.
        let Some(i) = self.probes.iter().position(|p| p.0 == nonce) else {
            return Flow::Continue;
        };
        let (_, probed, sent) = self.probes[i];
        self.probes.drain(..=i);
        // The server's own asking, one echo a probe: not the client's flood. Counted, echoes
        // alone (three a second at a 1 s lease) outran a low `--msg-rate`'s flood refill, and a
        // healthy host was closed `rate_limited`.
        self.flood.refund(1.0);
        self.answered();
        if self.host_epoch != Some(probed) {
            return Flow::Continue;
        }
        let epoch = probed;
        metrics::histogram!("hostlease_probe_rtt_seconds").record(sent.elapsed().as_secs_f64());
        match self
            .app
            .store
            .renew(
                &self.room.id,
                epoch,
                &self.me,
                &self.session,
                self.app.cfg.lease_ms,
            )
            .await
        {
            Ok(Some(Renewed::Fenced { ms })) => {
                // A forced grant: the lease it took away runs `ms` more, and its holder may not
                // know yet (its connection cut). No confirm, and so no authority, before then:
                // probed again once it has run out.
                self.next_probe = Some(Instant::now() + Duration::from_millis(ms));
                Flow::Continue
            }
            Ok(Some(Renewed::Until { expires, lease_ms })) => {
                self.host_ttl = lease_ms.max(3);
                // A shorter lease than the one the next probe was planned for (the room's TTL
                // was lowered): probe within a third of it, or the lease lapses before the
                // next renewal and a healthy host is failed over.
                let due = Instant::now() + Duration::from_millis(self.host_ttl / 3);
                self.next_probe = Some(self.next_probe.map_or(due, |p| p.min(due)));
                // The token first: a client's lease is held from the confirm on, and so it can
                // act as host from that moment (its `lease: held` event means authority).
                let ok = self
                    .send(&self.host_capability(epoch, expires, lease_ms))
                    .await
                    && self
                        .send(&ServerMsg::LeaseConfirm {
                            nonce,
                            epoch,
                            remaining_ms: lease_ms,
                        })
                        .await;
                if ok {
                    Flow::Continue
                } else {
                    Flow::End(false)
                }
            }
            Ok(None) => {
                // The lease is gone (lapsed or superseded): stop probing; the sweeper decides.
                self.host_epoch = None;
                self.next_probe = None;
                Flow::Continue
            }
            Err(e) => {
                tracing::warn!(error = %e, "lease renewal failed");
                Flow::Continue
            }
        }
    }

    /// Sends a command's result after the event it committed: the client takes an accepted seq
    /// it has not seen on the stream for a lost event and resyncs. An accepted result comes out
    /// of `commands` once its event was published here (or `answer_wait_ms` passed: see
    /// `on_client`), so the event is in `rx` and goes out first.
    async fn answer(&mut self, answer: ServerMsg, rx: &mut BroadcastStream<Bcast>) -> Flow {
        if let ServerMsg::CommandResult {
            outcome: Outcome::Accepted { .. },
            ..
        } = &answer
        {
            if let Flow::End(e) = self.drain_broadcasts(rx).await {
                return Flow::End(e);
            }
        }
        if self.send(&answer).await {
            Flow::Continue
        } else {
            Flow::End(false)
        }
    }

    /// Writes every broadcast already received (published, so in `rx` or lagged past).
    async fn drain_broadcasts(&mut self, rx: &mut BroadcastStream<Bcast>) -> Flow {
        loop {
            match rx.next().now_or_never() {
                Some(Some(Ok(b))) => {
                    if let Flow::End(e) = self.on_broadcasts(b, rx).await {
                        return Flow::End(e);
                    }
                }
                // Lagged: the client sees the gap on the next item and resumes; what is queued
                // after it still goes out first.
                Some(Some(Err(_))) => {}
                _ => return Flow::Continue,
            }
        }
    }

    /// Sends `first` and what else the room has already queued for this connection, up to
    /// `BROADCAST_BATCH` frames, with one flush: a busy room costs a write per batch, not one
    /// per frame. Order is kept (a probe sent on the way flushes what was queued before it).
    async fn on_broadcasts(&mut self, first: Bcast, rx: &mut BroadcastStream<Bcast>) -> Flow {
        let mut next = Some(first);
        let mut sent = 0;
        while let Some(b) = next.take() {
            if let Flow::End(e) = self.on_broadcast(b).await {
                return Flow::End(e);
            }
            sent += 1;
            if sent < BROADCAST_BATCH {
                // A lag shows up here as an error, as it would at `recv`: the client sees a seq
                // gap on the next item and resumes from its cursor.
                next = rx.next().now_or_never().flatten().and_then(Result::ok);
            }
        }
        if self.sink.flush().await.is_err() {
            return Flow::End(false);
        }
        Flow::Continue
    }

    /// Queues one broadcast frame (the caller flushes) and acts on what it means for this session.
    async fn on_broadcast(&mut self, b: Bcast) -> Flow {
        let f = match &b {
            Bcast::Item { frame, .. } | Bcast::Presence { frame } => frame.clone(),
        };
        if self.sink.feed(Message::Text(f)).await.is_err() {
            return Flow::End(false);
        }
        let Bcast::Item {
            seq, assignment, ..
        } = b
        else {
            return Flow::Continue;
        };
        if seq == self.sent.next() {
            self.sent = seq;
        }
        if let Some(a) = assignment {
            if a.assignment.names(&self.me, &self.session) {
                // A new grant to this session: the assignment went first, the probe follows.
                self.host_ttl = a.assignment.lease_ms.max(3);
                self.become_host(a.assignment.epoch);
                if let Flow::End(e) = self.probe().await {
                    return Flow::End(e);
                }
            } else {
                self.host_epoch = None;
                self.next_probe = None;
            }
        }
        Flow::Continue
    }

    /// The session ends as a leave (a `leave`, or the client closed the socket: a page
    /// unloading, a `close()` that sent no `leave`): the commands sent before are decided
    /// first, else the leave's grant could be committed before them (the host's last command
    /// refused `stale_epoch`, a transfer going to whoever was next) or they were dropped unsent
    /// to the store. With `answer` each is answered after its event (after a close, answers go
    /// nowhere). A stalled store is waited for no longer than a write may take.
    async fn settle(
        &mut self,
        commands: &mut Commands,
        rx: &mut BroadcastStream<Bcast>,
        answer: bool,
    ) {
        let within = Duration::from_millis(self.app.cfg.write_timeout_ms);
        let _ = tokio::time::timeout(within, async {
            while let Some(a) = commands.next().await {
                if answer && matches!(self.answer(a, rx).await, Flow::End(_)) {
                    break;
                }
            }
        })
        .await;
    }

    async fn on_client(
        &mut self,
        m: Option<Result<Message, axum::Error>>,
        commands: &mut Commands,
        rx: &mut BroadcastStream<Bcast>,
    ) -> Flow {
        let m = match m {
            Some(Ok(Message::Close(_))) => {
                self.settle(commands, rx, false).await;
                return Flow::End(true);
            }
            Some(Ok(m)) => m,
            Some(Err(e)) if too_large(&e) => {
                close_with(&mut self.sink, ErrorCode::FrameTooLarge, "frame too large").await;
                return Flow::End(false);
            }
            Some(Err(_)) | None => return Flow::End(false),
        };
        self.heard = Instant::now();
        // Every frame but the close counts against the flood limit, control frames too: each
        // ping costs a pong, so a ping flood is a flood like any other.
        if !self.flood.take() {
            close_with(
                &mut self.sink,
                ErrorCode::RateLimited,
                "message rate exceeded",
            )
            .await;
            return Flow::End(false);
        }
        let text = match m {
            Message::Text(t) => t,
            Message::Pong(p) => {
                // Its payload is the `sent` of a ping (never past the latest: a pong is anyone's
                // to send unasked).
                if let Ok(b) = <[u8; 8]>::try_from(&p[..]) {
                    let seq = Seq(u64::from_be_bytes(b)).min(self.sent);
                    self.acked = self.acked.max(seq);
                }
                return Flow::Continue;
            }
            Message::Ping(_) => return Flow::Continue,
            Message::Binary(_) => {
                close_with(
                    &mut self.sink,
                    ErrorCode::BadFrame,
                    "binary frames are not accepted",
                )
                .await;
                return Flow::End(false);
            }
            Message::Close(_) => {
                self.settle(commands, rx, false).await;
                return Flow::End(true);
            }
        };
        if text.len() > MAX_CLIENT_FRAME {
            close_with(&mut self.sink, ErrorCode::FrameTooLarge, "frame too large").await;
            return Flow::End(false);
        }
        let msg = match decode_client(text.as_str()) {
            Ok(m) => m,
            Err(DecodeError::UnknownType) => return Flow::Continue, // newer client; ignore
            Err(e) => {
                close_with(&mut self.sink, decode_error_code(&e), e.code()).await;
                return Flow::End(false);
            }
        };
        match msg {
            ClientMsg::Hello { .. } => {
                close_with(
                    &mut self.sink,
                    ErrorCode::UnexpectedMessage,
                    "hello came twice",
                )
                .await;
                Flow::End(false)
            }
            ClientMsg::Resume { cursor } => {
                self.answered();
                while let Err(ms) = self.resume_rate.admit() {
                    metrics::counter!("hostlease_resumes_paced_total").increment(1);
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                }
                // A fresh subscription point is not needed: this socket is already subscribed
                // and the snapshot is taken from the published state, so the stream continues
                // right after it. A fresh participant token follows, as after a hello: a client
                // whose token ran out (a sleep) resumes to get one.
                let snapshot = self.app.snapshot(&self.room, None);
                if self.welcome(snapshot, Some(cursor), true).await
                    && self.send_participant_capability().await
                {
                    Flow::Continue
                } else {
                    Flow::End(false)
                }
            }
            ClientMsg::LeaseEcho { nonce } => self.on_echo(nonce).await,
            ClientMsg::Leave => {
                self.settle(commands, rx, true).await;
                let _ = self.sink.send(Message::Close(None)).await;
                Flow::End(true)
            }
            ClientMsg::Command {
                id,
                action,
                payload,
                epoch,
                capability,
                after,
            } => {
                self.answered();
                let rate = self
                    .app
                    .command_limiter
                    .admit((self.room.id.clone(), self.me.clone()));
                if let Err(ms) = rate {
                    // Over the command rate: refused, retryable, in order with the answers
                    // before it; the SDK backs off for at least `retry_after_ms`. Those sent
                    // after it are held until it is decided (`store::Order`).
                    self.held.refused(&id);
                    let outcome = rate_limited(ms);
                    commands.push_back(Box::pin(std::future::ready(ServerMsg::CommandResult {
                        id,
                        outcome,
                    })));
                    return Flow::Continue;
                }
                let outcome = command(
                    &self.app,
                    &self.room,
                    Incoming {
                        sender: Some((&self.me, &self.session)),
                        capability: Capability::Token(&capability),
                        key: id.clone(),
                        action,
                        payload,
                        epoch,
                        order: Some(Order {
                            after,
                            held: self.held.clone(),
                        }),
                    },
                );
                // The result waits for its event to be published here, beside the others in
                // flight: the session reads, probes and writes on meanwhile. (It used to wait in
                // the session's loop, 500 ms for each result in turn when the publisher lagged,
                // so that a host's burst of commands held its lease echoes unread until the lease
                // lapsed.)
                let room = self.room.clone();
                let wait = Duration::from_millis(self.app.cfg.answer_wait_ms);
                commands.push_back(Box::pin(async move {
                    let outcome = outcome.await;
                    if let Outcome::Accepted { seq } = &outcome {
                        room.wait_published(*seq, wait).await;
                    }
                    ServerMsg::CommandResult { id, outcome }
                }));
                Flow::Continue
            }
            ClientMsg::Signal {
                to,
                to_session,
                data,
            } => {
                let f: axum::extract::ws::Utf8Bytes = encode_server(&ServerMsg::Signal {
                    from: self.me.clone(),
                    from_session: self.session.clone(),
                    data,
                })
                .into();
                self.app.signal(
                    &self.room,
                    &self.me,
                    |m| m.id == to && to_session.as_ref().is_none_or(|s| &m.session == s),
                    &f,
                );
                Flow::Continue
            }
            _ => Flow::Continue,
        }
    }
}

/// A command refused for a rate (its participant's commands, or its room's payload bytes;
/// counted), to retry after `ms`.
pub(crate) fn rate_limited(ms: u64) -> Outcome {
    metrics::counter!("hostlease_commands_total", "result" => RejectCode::RateLimited.as_str())
        .increment(1);
    Outcome::Rejected {
        code: RejectCode::RateLimited,
        current: None,
        retry_after_ms: Some(ms),
    }
}

/// A command as it arrived, from either transport.
pub struct Incoming<'a> {
    /// The sending connection (WebSocket), or `None` for HTTP (the token's `sub`/`sid` stand).
    pub sender: Option<(&'a ParticipantId, &'a SessionId)>,
    pub capability: Capability<'a>,
    pub key: IdempotencyKey,
    pub action: Action,
    pub payload: Json,
    pub epoch: Option<Epoch>,
    /// Its connection's order (WebSocket), `None` over HTTP.
    pub order: Option<Order>,
}

/// A command's capability: the token as it came (WebSocket), or its claims, whose signature the
/// caller has already verified for the room (HTTP checks it before loading the room).
pub enum Capability<'a> {
    Token(&'a Token),
    Verified(CapClaims),
}

/// One command, from either transport: verify the capability's signature, choose the next
/// holder for resign/transfer from the local membership, and queue it with the store, which
/// checks the rest and applies the effect in one transaction. The command is queued when this is
/// called, so a connection's commands are decided in the order they arrived; the returned future
/// resolves to the outcome. What follows a decision (the reassignment's log line, the metrics, the
/// publisher's wake-up) runs in a task of its own: a connection or HTTP request that goes away
/// before its answer does not take them with it.
pub fn command(
    app: &Arc<App>,
    room: &Arc<Room>,
    cmd: Incoming<'_>,
) -> impl Future<Output = Outcome> + Send + 'static {
    let claimed = cmd.epoch;
    // A refusal decided here, not by the store, names the current assignment only to a session
    // of the room: over HTTP the capability may be expired or revoked by a kick, which only the
    // store checks (it says who hosts to a capability that still works).
    let session = cmd.sender.is_some();
    let current = move |room: &Room| session.then(|| current(room)).flatten();
    let held = cmd.order.as_ref().map(|o| o.of(&cmd.key));
    let who = cmd.sender.map(|(p, _)| p.clone());
    let queued = queue_command(app, room, cmd);
    if let (Err(_), Some(h)) = (&queued, &held) {
        // Refused before the store: those sent after it are held until it is decided again.
        h.refused();
    }
    let (app, room) = (app.clone(), room.clone());
    let current_room = room.clone();
    let decided = tokio::spawn(async move {
        let (pending, old_host, charged) = match queued {
            Ok(q) => q,
            Err(Refused::Rate(ms)) => return rate_limited(ms),
            Err(Refused::Code(code)) => return reject(code, current(&room)),
        };
        match pending.await {
            Ok(done) => {
                if done.replayed || matches!(done.outcome, Outcome::Rejected { .. }) {
                    // Nothing new for the room to send: its bytes are given back.
                    app.room_bytes.refund(room.id.clone(), charged);
                }
                if let (Some(who), true) = (&who, done.outcome == crate::store::held()) {
                    // Held, not looked at: the command-rate token goes back too (the ones
                    // behind a refused command would spend its sender's rate at every round).
                    app.command_limiter
                        .refund((room.id.clone(), who.clone()), 1.0);
                }
                if let Outcome::Rejected {
                    current: Some(cur), ..
                } = &done.outcome
                {
                    if claimed.is_some_and(|e| e > cur.assignment.epoch) {
                        // No server ever granted that epoch: a client bug or a forgery.
                        metrics::counter!("hostlease_epoch_ahead_claims_total").increment(1);
                    }
                }
                if let Some(a) = &done.assignment {
                    crate::rooms::log_reassign(old_host.as_ref(), &a.assignment, &correlation_id());
                    handed_to_the_departed(&app, &room, &a.assignment).await;
                }
                if matches!(done.outcome, Outcome::Accepted { .. }) {
                    // Something new in the outbox; or, for a replay, something the first
                    // attempt's connection may have dropped before it said so.
                    app.committed.notify_one();
                }
                let result = match &done.outcome {
                    Outcome::Accepted { .. } => "accepted",
                    Outcome::Rejected { code, .. } => code.as_str(),
                };
                metrics::counter!("hostlease_commands_total", "result" => result).increment(1);
                done.outcome
            }
            Err(e) => {
                app.room_bytes.refund(room.id.clone(), charged);
                // A full queue is counted (`hostlease_store_busy_total`), not logged per command.
                if e.0 != crate::store::STORE_BUSY {
                    tracing::warn!(error = %e, "command failed in store");
                }
                metrics::counter!("hostlease_commands_total", "result" => RejectCode::Unavailable.as_str())
                    .increment(1);
                Outcome::Rejected {
                    code: RejectCode::Unavailable,
                    current: current(&room),
                    retry_after_ms: Some(500),
                }
            }
        }
    });
    async move {
        decided.await.unwrap_or_else(|_| Outcome::Rejected {
            // The task panicked (or the runtime is going down): nothing to say but "retry".
            code: RejectCode::Unavailable,
            current: current(&current_room),
            retry_after_ms: Some(500),
        })
    }
}

/// A resign or transfer chose its successor from the members as it was queued; one that left
/// before it was committed (its leave found the old host still holding the role, and so
/// changed nothing) is replaced at once, as after any leave, rather than holding an unanswered
/// role until its lease lapsed.
async fn handed_to_the_departed(app: &App, room: &Arc<Room>, a: &hostlease::protocol::Assignment) {
    let Some(s) = &a.session else {
        return;
    };
    let left = {
        let st = room.state.lock().expect("room lock");
        !st.members.iter().any(|m| &m.session == s)
    };
    if left {
        if let Err(e) = app
            .replace_host(room, s, Reason::Left, &correlation_id())
            .await
        {
            tracing::warn!(error = %e, "replace a successor who left failed");
        }
    }
}

fn current(room: &Room) -> Option<hostlease::protocol::SignedAssignment> {
    Some(room.state.lock().expect("room lock").current.clone())
}

fn reject(code: RejectCode, current: Option<hostlease::protocol::SignedAssignment>) -> Outcome {
    metrics::counter!("hostlease_commands_total", "result" => code.as_str()).increment(1);
    Outcome::Rejected {
        code,
        current,
        retry_after_ms: None,
    }
}

/// Why a command was refused before the store saw it.
enum Refused {
    Code(RejectCode),
    /// Over the room's bytes: `rate_limited`, to be tried again after this many ms.
    Rate(u64),
}

impl From<RejectCode> for Refused {
    fn from(code: RejectCode) -> Self {
        Refused::Code(code)
    }
}

/// The checks that need no store, then the command queued with the store. Returns the pending
/// decision, for resign/transfer the host it replaces (the sender, if it is accepted), and the
/// room bytes it was charged.
#[allow(clippy::type_complexity)]
fn queue_command(
    app: &Arc<App>,
    room: &Arc<Room>,
    cmd: Incoming<'_>,
) -> Result<(Pending<CommandDone>, Option<ParticipantId>, f64), Refused> {
    let Incoming {
        sender,
        capability,
        key,
        action,
        payload,
        epoch,
        order,
    } = cmd;
    let claims: CapClaims = match capability {
        Capability::Verified(c) => c,
        Capability::Token(t) => app
            .cap_keys
            .verify(CAP_PREFIX, t.expose())
            .map_err(|_| RejectCode::BadCapability)?,
    };
    // A payload the SDK would not send: longer than its limit, or nested so deep that the
    // frames wrapping it (a welcome's replay, an inbox page) would pass the JSON reader's depth
    // limit, and every client resuming past it would fail to decode its welcome.
    if payload.as_str().len() > MAX_CLIENT_PAYLOAD || payload.depth() > MAX_PAYLOAD_DEPTH {
        return Err(RejectCode::BadRequest.into());
    }
    let kind = if action.as_str() == ACTION_RESIGN || action.as_str() == ACTION_TRANSFER {
        ActionKind::Host
    } else {
        app.cfg
            .actions
            .kind(&action)
            .ok_or(RejectCode::ActionNotGranted)?
    };
    // The room's payload bytes (`Config::room_bytes_rate`): every event goes to every member.
    // Not charged to a host capability (participants cannot shut the host out; the host has its
    // command rate), nor to an expired one (refused by the store, or a replay of its first
    // outcome); given back when the store refuses the command or replays it.
    let charged = if claims.role == Role::Host || claims.exp <= app.store.clock_ms() {
        0.0
    } else {
        payload.as_str().len() as f64
    };
    if let Err(ms) = app.room_bytes.spend(room.id.clone(), charged) {
        // Not its sender's command either: the command-rate token it was charged goes back (a
        // participant whose large payloads wait for the room could send nothing else until its
        // own rate refilled too). Only a capability that has not expired is charged bytes, and
        // so had been charged that token, over either transport.
        let who = sender.map_or(&claims.sub, |(p, _)| p);
        app.command_limiter
            .refund((room.id.clone(), who.clone()), 1.0);
        return Err(Refused::Rate(ms));
    }
    // A transfer to no one present is refused, but only after the store has looked for an
    // earlier outcome under this key: a retry of an accepted transfer whose target has left
    // since gets that outcome again.
    let mut refuse = None;
    let next_holder = if action.as_str() == ACTION_RESIGN {
        Some(room.next_holder(Some(&claims.sid)))
    } else if action.as_str() == ACTION_TRANSFER {
        let to = payload
            .get_str("to")
            .and_then(|s| ParticipantId::new(s).ok());
        let members = room.members();
        let m = to.and_then(|to| {
            elect(
                members
                    .iter()
                    .filter(|m| m.id == to && m.session != claims.sid),
            )
        });
        refuse = m.is_none().then_some(RejectCode::BadRequest);
        m.map(|m| Some((m.id.clone(), m.session.clone())))
    } else {
        None
    };
    let (sender_id, sender_session) = match sender {
        Some((p, s)) => (p.clone(), Some(s.clone())),
        None => (claims.sub.clone(), None),
    };
    let old_host = next_holder.as_ref().map(|_| claims.sub.clone());
    let req = CommandReq {
        room: room.id.clone(),
        sender: sender_id,
        sender_session,
        claims,
        kind,
        action,
        payload,
        epoch,
        key,
        next_holder,
        refuse,
        lease_ms: app.cfg.lease_ms,
        order,
    };
    Ok((app.store.command(req, &app.keys), old_host, charged))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hostlease::protocol::codec::{MAX_ACTIONS, MAX_NAME_LEN, MAX_SERVER_FRAME, MAX_SIG_LEN};
    use hostlease::protocol::{
        ActionTable, Assignment, KeyId, ServerTime, SignedAssignment, Snapshot,
    };

    /// The flood burst takes all the SDK may send at once after a resync, with room to spare
    /// for the echoes and the resume around it.
    #[test]
    fn the_flood_burst_takes_the_sdk_s_whole_command_queue() {
        let queue = hostlease::core::Config::default().command_limit as f64;
        assert!(FLOOD_MIN_BURST >= queue + 64.0);
    }

    /// An error frame's message is cut to what a client accepts, at a character boundary.
    #[test]
    fn an_error_message_is_cut_to_what_a_client_accepts() {
        for long in ["é".repeat(200), "x".repeat(300), "€".repeat(100)] {
            let text = encode_server(&error_msg(ErrorCode::BadFrame, &long));
            let Ok(ServerMsg::Error { message, .. }) = decode_server(&text) else {
                panic!("{text}");
            };
            assert!(long.starts_with(message.as_str()));
            assert!(message.len() > hostlease::protocol::codec::MAX_MESSAGE_LEN - 4);
        }
    }

    /// The largest welcome the server can send: a full room of members with the longest ids
    /// and the names that escape longest (control characters, six bytes each in JSON), the
    /// longest action tables, a signed assignment, and a replay filling its whole budget (each
    /// item with its comma). It must fit in the frame the SDK accepts, or a full room would be
    /// one no client can join.
    #[test]
    fn a_full_welcome_fits_in_a_frame() {
        let id = |c: char| c.to_string().repeat(128);
        let member = |i: usize| Member {
            id: ParticipantId::new(format!("{i:0>128}")).unwrap(),
            session: SessionId::new(format!("s{i:0>127}")).unwrap(),
            name: "\u{1}".repeat(MAX_NAME_LEN),
            join_seq: u64::MAX,
            may_host: false,
        };
        let actions = |c: usize| {
            (0..MAX_ACTIONS)
                .map(|i| Action::new(format!("{c}{i:0>127}")).unwrap())
                .collect()
        };
        let welcome = ServerMsg::Welcome {
            you: ParticipantId::new(id('y')).unwrap(),
            session: SessionId::new(id('z')).unwrap(),
            snapshot: Snapshot {
                room: RoomId::new(id('r')).unwrap(),
                current: SignedAssignment {
                    assignment: Assignment {
                        room: RoomId::new(id('r')).unwrap(),
                        host: Some(ParticipantId::new(id('h')).unwrap()),
                        session: Some(SessionId::new(id('s')).unwrap()),
                        epoch: Epoch(u64::MAX),
                        seq: Seq(u64::MAX),
                        lease_ms: u64::MAX,
                        reason: Reason::LeaseLapsed,
                        issued_at: ServerTime(u64::MAX),
                    },
                    kid: Some(KeyId::new(id('k')).unwrap()),
                    sig: Some("s".repeat(MAX_SIG_LEN)),
                },
                members: (0..MAX_MEMBERS).map(member).collect(),
                seq: Seq(u64::MAX),
                lease_remaining_ms: Some(u64::MAX),
                server_time: ServerTime(u64::MAX),
                actions: ActionTable {
                    host: actions(1),
                    participant: actions(2),
                },
            },
            missed: vec![],
            discontinuity: Some(Gap {
                from: Seq(u64::MAX),
                to: Seq(u64::MAX),
            }),
        };
        let size = encode_server(&welcome).len() + REPLAY_BYTES + MAX_REPLAY;
        assert!(size <= MAX_SERVER_FRAME, "{size} B > {MAX_SERVER_FRAME} B");
    }
}
