//! hostlease-server: the reference authority. Elections, leases, epoch CAS, capability tokens,
//! the room log and outbox, fan-out over WebSocket, and the HTTP API.
//!
//! Layout: [`tokens`] (keys and token formats), [`store`] (durable state behind a trait, SQLite;
//! [`clock`], the clock it times leases on),
//! [`rooms`] (in-memory hubs, elections, the publisher and sweeper tasks), [`ws`] (the live
//! session), [`http`] (routes).

pub mod clock;
pub mod http;
pub mod limit;
pub mod rooms;
pub mod store;
pub mod tokens;
pub mod webhook;
pub mod ws;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use hostlease::protocol::{Action, ActionTable};

pub use rooms::App;

/// The lease TTLs the server takes (the CLI, [`Config::check`], the admin API's per-room TTL): 1 s
/// to 24 h. The SDK keeps 1 % + 250 ms of a lease back for drift and safety: a host granted a
/// lease under about 300 ms plus a round trip never held it, was renewed for ever, could never act
/// and was never failed over.
pub const LEASE_MS: std::ops::RangeInclusive<u64> = 1000..=MAX_CAPABILITY_MS;

/// The longest any capability lives: a participant token (`participant_token_ms`) or a host's,
/// which expires with its lease. A kick, which revokes the capabilities minted before it, is
/// kept an hour longer than this.
pub const MAX_CAPABILITY_MS: u64 = 86_400_000;

/// Server configuration (the CLI and environment fill it; tests build it directly).
#[derive(Clone)]
pub struct Config {
    /// Default host lease TTL.
    pub lease_ms: u64,
    pub actions: ActionTable,
    pub max_rooms: usize,
    pub max_members: usize,
    pub max_connections: usize,
    /// Open WebSockets per client address (an IPv6 client counts by its /64): one address
    /// could otherwise take all `max_connections`. Behind a proxy or a large NAT every client
    /// shares an address: raise it there. HTTP connections not upgraded to a WebSocket are
    /// capped apart, at this many per address and `max_connections` in all: a connection past
    /// either is closed as it is accepted.
    pub max_sockets_per_address: usize,
    /// Command rate per participant in a room (its sessions share it): sustained per second, and
    /// burst. A command past it is refused `rate_limited` with a time to retry after; frames of
    /// any kind past four times it (a burst of at least 320) on one connection close that
    /// connection (a flood).
    pub msg_rate: f64,
    pub msg_burst: f64,
    /// Payload bytes of participants' commands per room (per process), per second, and burst (at
    /// least one payload of the largest size). Every event goes to every member, and one that
    /// reads slower than its room sends holds the room's broadcast frames: this bounds what a
    /// room's participants make it send. A command past it is refused `rate_limited`; commands
    /// with a host capability are not charged (participants cannot shut the host out; the host
    /// has its command rate), and a command the store refuses or replays is given back.
    pub room_bytes_rate: f64,
    pub room_bytes_burst: f64,
    /// Signal bytes a participant may have the server deliver in a room, per second, and burst
    /// (at least two frames of the largest size), over all its sessions, each delivery counted (a
    /// signal to a member with three sessions counts three times). Past it signals are dropped
    /// and counted in `hostlease_signals_dropped_total`. Without it only the flood limit held
    /// them (200 frames of 64 KiB a second a connection): one member could keep another's queue
    /// full, so that the real peers' offers and candidates were dropped.
    pub signal_bytes_rate: f64,
    pub signal_bytes_burst: f64,
    /// HTTP requests per second per client address, and burst.
    pub http_rate: f64,
    pub http_burst: f64,
    /// Lifetime of a participant capability token (refreshed at three quarters of it): 1 s..24 h.
    pub participant_token_ms: u64,
    /// How often the lease sweeper and publisher poll the store.
    pub sweep_ms: u64,
    /// At most one presence frame per room per this interval: the first change in a quiet room
    /// goes out at once, the ones that follow within the interval go out together at its end
    /// (0: a frame per change). A burst of n joins then costs each member a few frames, not n.
    pub presence_ms: u64,
    /// A connection with nothing sent for this long gets a `heartbeat` frame (at most
    /// `HEARTBEAT_MS`: the SDK presumes a connection silent for longer dead).
    pub heartbeat_ms: u64,
    /// How long one write to a WebSocket client may take (a client that stops reading blocks
    /// writes once the socket's buffers are full); past it the session ends.
    pub write_timeout_ms: u64,
    /// How long a client has to send a request's head once connected (or once it began one): a
    /// socket that opens and sends nothing, or half a head, is closed after this (each held a
    /// task and a file handle for ever).
    pub header_timeout_ms: u64,
    /// How long an accepted command's result waits for its event to be published, so that the
    /// event reaches the client first (past it the result goes out anyway and the client, which
    /// has not seen the event, resyncs). The wait runs beside the session's other work.
    pub answer_wait_ms: u64,
    /// Items kept in each room's log (older ones are announced as a discontinuity).
    pub log_keep: i64,
    pub admin_key: Option<String>,
    /// Durable notification by HTTP POST of every committed item (`http://` only).
    pub webhook_url: Option<String>,
    /// HMAC-SHA256 key of the webhook signature header.
    pub webhook_secret: Option<String>,
    pub dev: bool,
    pub www: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        let a = |s: &str| Action::new(s).expect("valid action");
        Self {
            lease_ms: 6000,
            actions: ActionTable {
                host: vec![a("poll.open"), a("poll.close")],
                participant: vec![a("vote")],
            },
            max_rooms: 10_000,
            max_members: 1000,
            max_connections: 20_000,
            max_sockets_per_address: 1000,
            msg_rate: 50.0,
            msg_burst: 100.0,
            room_bytes_rate: 1024.0 * 1024.0,
            room_bytes_burst: 4.0 * 1024.0 * 1024.0,
            signal_bytes_rate: 128.0 * 1024.0,
            signal_bytes_burst: 1024.0 * 1024.0,
            http_rate: 50.0,
            http_burst: 100.0,
            participant_token_ms: 600_000,
            sweep_ms: 100,
            presence_ms: 100,
            heartbeat_ms: hostlease::protocol::codec::HEARTBEAT_MS,
            write_timeout_ms: 10_000,
            header_timeout_ms: 10_000,
            answer_wait_ms: 500,
            log_keep: 10_000,
            admin_key: None,
            webhook_url: None,
            webhook_secret: None,
            dev: false,
            www: None,
        }
    }
}

impl Config {
    /// The action table sessions are given: the configured one with the built-in host actions
    /// (`host.resign`, `host.transfer`) added.
    pub fn action_table(&self) -> ActionTable {
        let mut t = self.actions.clone();
        for b in [
            hostlease::protocol::ACTION_RESIGN,
            hostlease::protocol::ACTION_TRANSFER,
        ] {
            let a = Action::new(b).expect("valid");
            if !t.host.contains(&a) {
                t.host.push(a);
            }
        }
        t
    }

    /// Refuses a configuration that would break every session, lease or delivery: an action
    /// table no client could take ([`Config::check_actions`]), a rate that is not a positive
    /// number (or a burst under one command or request), a limit, timeout or log length of 0, a
    /// lease outside [`LEASE_MS`], a heartbeat past the SDK's, a webhook URL this build cannot
    /// send to or one without a secret of 16 bytes, an admin key under 16 bytes. [`serve`] calls it, so a server embedded
    /// with [`App::new`] is checked as the CLI's is (the CLI names its flags first).
    pub fn check(&self) -> Result<(), String> {
        self.check_actions()?;
        for (name, rate, burst) in [
            ("msg_rate", self.msg_rate, self.msg_burst),
            ("http_rate", self.http_rate, self.http_burst),
            (
                "room_bytes_rate",
                self.room_bytes_rate,
                self.room_bytes_burst,
            ),
            (
                "signal_bytes_rate",
                self.signal_bytes_rate,
                self.signal_bytes_burst,
            ),
        ] {
            if !(rate > 0.0 && rate.is_finite() && burst >= 1.0) {
                return Err(format!(
                    "{name} must be a positive number, with a burst of at least 1"
                ));
            }
        }
        // (A write or a request head given 0 ms timed out as it began: every client that was
        // not instant was dropped. A log kept to 0 items was deleted whole by every
        // housekeeping run: every resume announced a discontinuity.)
        for (name, n) in [
            ("max_rooms", self.max_rooms as u64),
            ("max_members", self.max_members as u64),
            ("max_connections", self.max_connections as u64),
            (
                "max_sockets_per_address",
                self.max_sockets_per_address as u64,
            ),
            ("write_timeout_ms", self.write_timeout_ms),
            ("header_timeout_ms", self.header_timeout_ms),
            ("log_keep", self.log_keep.max(0) as u64),
        ] {
            if n == 0 {
                return Err(format!("{name} must be at least 1"));
            }
        }
        if !LEASE_MS.contains(&self.lease_ms) {
            return Err(format!("lease_ms must be within {LEASE_MS:?}"));
        }
        // 0 made every session's refresh due at once, for ever (a token expired as issued, a
        // capability frame per turn of its loop); past a day, `now + ttl` could overflow.
        if !(1000..=MAX_CAPABILITY_MS).contains(&self.participant_token_ms) {
            return Err(format!(
                "participant_token_ms must be within 1000..={MAX_CAPABILITY_MS}"
            ));
        }
        if !(1..=hostlease::protocol::codec::HEARTBEAT_MS).contains(&self.heartbeat_ms) {
            return Err(format!(
                "heartbeat_ms must be within 1..={}",
                hostlease::protocol::codec::HEARTBEAT_MS
            ));
        }
        // Refused here rather than failing every delivery later (this build speaks no TLS).
        // The URL is not echoed: it may carry a secret.
        if let Some(u) = &self.webhook_url {
            if !reqwest::Url::parse(u).is_ok_and(|u| u.scheme() == "http" && u.has_host()) {
                return Err(
                    "--webhook-url must be an http:// URL (no TLS in this build: put a \
                     TLS-terminating proxy in front of an https receiver)"
                        .into(),
                );
            }
            // Without a key the signature is an HMAC anyone can compute: a receiver would take
            // forged deliveries for the room's events.
            if self.webhook_secret.as_ref().is_none_or(|s| s.len() < 16) {
                return Err(
                    "--webhook-url needs --webhook-secret of 16 bytes or more (the key of the \
                     deliveries' X-Hostlease-Signature; without one anyone can sign a delivery)"
                        .into(),
                );
            }
        }
        // The admin key is the whole of the admin API's authentication: a short one is guessed,
        // and an empty one (an environment variable set to nothing) is a mistake. Not echoed.
        if self.admin_key.as_ref().is_some_and(|k| k.len() < 16) {
            return Err(
                "--admin-key must be 16 bytes or more (leave it unset to turn the admin API off)"
                    .into(),
            );
        }
        Ok(())
    }

    /// Refuses an action table no client could use: more actions than a snapshot may carry
    /// (`MAX_ACTIONS`, both lists and the built-in ones together), or so many or so long that a
    /// capability listing them, for the longest ids (key id too) the protocol allows, would pass
    /// `MAX_TOKEN_LEN`. Clients refuse either frame, so no client could go live or send a
    /// command in any room; this says so at start instead.
    pub fn check_actions(&self) -> Result<(), String> {
        use hostlease::protocol::{
            codec::MAX_ACTIONS, Epoch, ParticipantId, Role, RoomId, SessionId, MAX_ID_LEN,
            MAX_TOKEN_LEN,
        };
        let t = self.action_table();
        // The host list is looked at first: a participant action also listed there (or named
        // like a built-in one) would be refused to every participant.
        if let Some(a) = t.participant.iter().find(|a| t.host.contains(a)) {
            return Err(format!(
                "{a} is both a host and a participant action (host.resign and host.transfer are \
                 built-in host actions): participants could never send it"
            ));
        }
        let count = t.host.len() + t.participant.len();
        if count > MAX_ACTIONS {
            return Err(format!(
                "{count} actions with the built-in host.resign and host.transfer: at most \
                 {MAX_ACTIONS} fit in a snapshot"
            ));
        }
        let long = |c: char| c.to_string().repeat(MAX_ID_LEN);
        let keys = tokens::Keypair::generate(&long('k'));
        for (role, actions, epoch) in [
            (Role::Host, t.host, Some(Epoch(u64::MAX))),
            (Role::Participant, t.participant, None),
        ] {
            let claims = tokens::CapClaims {
                room: RoomId::new(long('r')).expect("valid id"),
                sub: ParticipantId::new(long('p')).expect("valid id"),
                sid: SessionId::new(long('s')).expect("valid id"),
                role,
                epoch,
                actions,
                exp: u64::MAX,
                sat: u64::MAX,
                kid: keys.kid.clone(),
            };
            let len = keys.sign_token(tokens::CAP_PREFIX, &claims).len();
            if len > MAX_TOKEN_LEN {
                return Err(format!(
                    "the {} actions are too many or too long: a capability listing them would \
                     be {len} bytes, past the {MAX_TOKEN_LEN} clients accept",
                    role.as_str()
                ));
            }
        }
        Ok(())
    }
}

/// The default accept backlog. A reconnect storm opens thousands of connections at once; a
/// connection that finds the accept queue full has its SYN dropped and retries only after a
/// second. The kernel caps the value at `net.core.somaxconn`.
pub const LISTEN_BACKLOG: u32 = 4096;

/// Binds a listener on `addr` (the first address it resolves to) with an accept backlog of
/// `backlog` (tokio's `TcpListener::bind` uses 1,024).
pub async fn listen(addr: &str, backlog: u32) -> std::io::Result<tokio::net::TcpListener> {
    let addr = tokio::net::lookup_host(addr).await?.next().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the address resolves to nothing",
        )
    })?;
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}

/// A connection whose writes may each wait at most `timeout` for the client to make room:
/// hyper's HTTP/1 server has a deadline for reading a request's head but none for writing the
/// answer, so a client that stopped reading held its answer (an inbox page, a file) and the
/// connection for ever. A write past it fails, and the connection ends.
struct WriteDeadline<S> {
    io: S,
    timeout: std::time::Duration,
    waiting: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl<S> WriteDeadline<S> {
    fn new(io: S, timeout_ms: u64) -> Self {
        Self {
            io,
            timeout: std::time::Duration::from_millis(timeout_ms),
            waiting: None,
        }
    }

    /// `r`, or a `TimedOut` error once writes have waited `timeout` without progress.
    fn deadline<T>(
        &mut self,
        cx: &mut std::task::Context<'_>,
        r: std::task::Poll<std::io::Result<T>>,
    ) -> std::task::Poll<std::io::Result<T>> {
        use std::future::Future;
        if r.is_ready() {
            self.waiting = None;
            return r;
        }
        let timeout = self.timeout;
        let sleep = self
            .waiting
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match sleep.as_mut().poll(cx) {
            std::task::Poll::Ready(()) => std::task::Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client did not read its answer in time",
            ))),
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for WriteDeadline<S> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for WriteDeadline<S> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = std::pin::Pin::new(&mut this.io).poll_write(cx, buf);
        this.deadline(cx, r)
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = std::pin::Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.deadline(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let r = std::pin::Pin::new(&mut this.io).poll_flush(cx);
        this.deadline(cx, r)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let r = std::pin::Pin::new(&mut this.io).poll_shutdown(cx);
        this.deadline(cx, r)
    }
}

/// How long a shutdown waits for requests under way and for WebSocket sessions to close.
const SHUTDOWN_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Serves `app` on `listener` until `shutdown` resolves, then stops the background tasks.
/// Connections are served by hyper's HTTP/1.1 server with `Config::header_timeout_ms`; after
/// `shutdown`, no new connection is taken, requests under way and the sessions (told by
/// `App::shutdown`, which the caller sets) get up to [`SHUTDOWN_WAIT`] to finish.
pub async fn serve(
    app: Arc<App>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use tower::{Service, ServiceExt};
    app.cfg
        .check()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    tokio::pin!(shutdown);
    // A store that does not answer at start is waited for, but not past a shutdown.
    let tasks = tokio::select! {
        tasks = rooms::spawn_background(app.clone()) => tasks,
        () = &mut shutdown => return Ok(()),
    };
    let mut make = http::router(app.clone()).into_make_service_with_connect_info::<SocketAddr>();
    let mut http1 = hyper::server::conn::http1::Builder::new();
    http1
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(std::time::Duration::from_millis(app.cfg.header_timeout_ms));
    // Told to every connection at shutdown. HTTP connections are counted until their task ends
    // (an upgraded one is then counted as a WebSocket session).
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let open: Arc<limit::Sockets> = Arc::default();
    loop {
        let (socket, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file handles, or a connection reset before it was taken: wait a
                    // little rather than spin (as `axum::serve` does).
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Frames go out as they are written: with Nagle's algorithm a small frame written while
        // the one before is unacknowledged (a command's result after its event) waited for the
        // client's delayed ACK, 40 ms on Linux, on every command of a host sending one at a time.
        let _ = socket.set_nodelay(true);
        let (held, total, from_address) = limit::Counted::new(&open, http::client_key(remote.ip()));
        if total > app.cfg.max_connections || from_address > app.cfg.max_sockets_per_address {
            // Closed at once (a task and a file handle each otherwise: one address sending a
            // request every few seconds on each kept thousands open, under its request rate).
            metrics::counter!("hostlease_http_connections_refused_total").increment(1);
            continue;
        }
        let service = match make.call(remote).await {
            Ok(s) => s,
            Err(never) => match never {},
        };
        let hyper_service =
            hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                service.clone().oneshot(request)
            });
        let socket = WriteDeadline::new(socket, app.cfg.write_timeout_ms);
        let conn = http1
            .serve_connection(hyper_util::rt::TokioIo::new(socket), hyper_service)
            .with_upgrades();
        let mut stopped = stopped.clone();
        tokio::spawn(async move {
            let _held = held;
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => return,
                _ = stopped.wait_for(|s| *s) => {}
            }
            // The request under way is answered; no other is read.
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        });
    }
    drop(listener);
    let _ = stop.send(true);
    // HTTP connections answer what is under way; WebSocket sessions (no longer HTTP
    // connections once upgraded) send their close.
    let deadline = tokio::time::Instant::now() + SHUTDOWN_WAIT;
    while (open.total() > 0 || app.ws_sockets.total() > 0) && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    for t in tasks {
        t.abort();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(host: usize, participant: usize, name_len: usize) -> Config {
        let names = |prefix: char, n: usize| {
            (0..n)
                .map(|i| Action::new(format!("{prefix}{i:0>w$}", w = name_len - 1)).unwrap())
                .collect()
        };
        Config {
            actions: ActionTable {
                host: names('h', host),
                participant: names('p', participant),
            },
            ..Config::default()
        }
    }

    #[test]
    fn a_configuration_that_breaks_every_session_is_refused() {
        assert!(Config::default().check().is_ok());
        let bad = [
            Config {
                lease_ms: 999,
                ..Config::default()
            },
            Config {
                participant_token_ms: 0,
                ..Config::default()
            },
            Config {
                participant_token_ms: u64::MAX,
                ..Config::default()
            },
            Config {
                lease_ms: u64::MAX,
                ..Config::default()
            },
            Config {
                max_rooms: 0,
                ..Config::default()
            },
            Config {
                msg_rate: f64::NAN,
                ..Config::default()
            },
            Config {
                http_burst: 0.5,
                ..Config::default()
            },
            Config {
                signal_bytes_rate: 0.0,
                ..Config::default()
            },
            Config {
                heartbeat_ms: 0,
                ..Config::default()
            },
            Config {
                write_timeout_ms: 0,
                ..Config::default()
            },
            Config {
                header_timeout_ms: 0,
                ..Config::default()
            },
            Config {
                log_keep: 0,
                ..Config::default()
            },
            Config {
                log_keep: -5,
                ..Config::default()
            },
            Config {
                admin_key: Some("short".into()),
                ..Config::default()
            },
            Config {
                webhook_url: Some("https://example.invalid/h".into()),
                webhook_secret: Some("0123456789abcdef".into()),
                ..Config::default()
            },
        ];
        for c in bad {
            assert!(
                c.check().is_err(),
                "{:?}",
                (c.lease_ms, c.participant_token_ms, c.max_rooms, c.msg_rate)
            );
        }
    }

    #[test]
    fn an_action_table_no_client_could_take_is_refused() {
        assert!(Config::default().check_actions().is_ok());
        // Two built-in host actions join the configured ones in every snapshot.
        assert!(with(54, 200, 4).check_actions().is_ok());
        let err = with(55, 200, 4).check_actions().unwrap_err();
        assert!(err.contains("257 actions"), "{err}");
        // Within the count, but a capability listing them would pass MAX_TOKEN_LEN, either list.
        let err = with(2, 100, 27).check_actions().unwrap_err();
        assert!(err.starts_with("the participant actions"), "{err}");
        let err = with(100, 1, 27).check_actions().unwrap_err();
        assert!(err.starts_with("the host actions"), "{err}");
        // An action in both lists, a built-in one among the participant actions.
        for (host, participant) in [("vote", "vote"), ("poll.open", "host.resign")] {
            let mut c = Config::default();
            c.actions.host = vec![Action::new(host).unwrap()];
            c.actions.participant =
                vec![Action::new("x").unwrap(), Action::new(participant).unwrap()];
            let err = c.check_actions().unwrap_err();
            assert!(err.starts_with(&format!("{participant} is both")), "{err}");
        }
    }
}
