//! Server benchmarks (issue 3): a native load generator built on the SDK core (one
//! `hostlease::core::HostView` per client, every frame decoded with `hostlease::protocol`) against
//! a real `hostlease-server` child process on 127.0.0.1, each throughput next to a baseline
//! measured in the same run. Prints a Markdown table.
//!
//! Run with `cargo bench -p hostlease-server --bench load` (or `cargo xtask bench`).
//!
//! The baseline broadcaster is this same executable started again with
//! `HOSTLEASE_BENCH_BASELINE=1`: a plain tokio-tungstenite accept loop that fans every text frame
//! a publisher connection sends out to all subscribers of the same path, with no logic at all.
//!
//! Scale for a quick try: `HOSTLEASE_BENCH_ROOM_SIZE` (1000; the failover room and the first
//! fan-out), `HOSTLEASE_BENCH_CLIENTS` (10000) in rooms of `HOSTLEASE_BENCH_SMALL_ROOM` (100);
//! `HOSTLEASE_BENCH_KEEP=1` keeps the SQLite files and server logs;
//! `HOSTLEASE_BENCH_ONLY=failover` stops after the explicit-leave failover rounds and prints them.
//! Every wait has a time bound; the whole run takes a few minutes on a 2-core machine.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures_util::{FutureExt, SinkExt, StreamExt};
use hostlease::core::{Config as ViewConfig, Event, HostView, Instant, LeaseState, Phase};
use hostlease::protocol::codec::{decode_server, encode_client, encode_server};
use hostlease::protocol::{
    Action, ActionKind, ActionTable, Assignment, ClientMsg, Epoch, IdempotencyKey, ParticipantId,
    Reason, Role, RoomEvent, RoomId, Seq, ServerMsg, ServerTime, SessionId, SignedAssignment,
    Snapshot, Token,
};
use hostlease_server::store::{CommandReq, GrantOutcome, GrantReq, SqliteStore, Store};
use hostlease_server::tokens::{CapClaims, JoinClaims, Keypair, JOIN_PREFIX};
use serde_json::json;
use tokio::net::TcpStream;
use tokio::sync::{broadcast, mpsc, watch, Semaphore};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

const RELAXED: Ordering = Ordering::Relaxed;
/// Lease TTL the server runs with (its default; silent loss is measured against it). With 2 s,
/// renewals queued behind 20 publishing hosts' commits were late and leases lapsed mid-run.
const LEASE_MS: u64 = 6000;
/// The server's sweep interval (its default).
const SWEEP_MS: u64 = 100;
/// Fan-out runs per size (the median is reported).
const FANOUT_RUNS: usize = 3;
/// Explicit-leave failover rounds and silent-loss rounds.
const LEAVE_ROUNDS: usize = 10;
const SILENT_ROUNDS: usize = 2;
/// Concurrent WebSocket handshakes of the load generator: below the server's accept backlog
/// (1024), so that no SYN is dropped and retried a second later. Browsers would not wait for
/// each other at all; with 256 the storm measured the generator's own queue (clients waited
/// 1.8 s for a turn, then were live 31 ms after their handshake).
const HANDSHAKES: usize = 1000;
/// Bounds of the 10,000-client join and of the reconnect storm.
const JOIN_BOUND_S: u64 = 400;
const STORM_BOUND_S: u64 = 150;
/// Host commands in flight per host (the core allows 256; the server reads on while up to 64 of
/// a connection's commands are being decided and commits queued ones together).
const PIPELINE: usize = 64;

// ----- clock -------------------------------------------------------------------------------------

static T0: OnceLock<std::time::Instant> = OnceLock::new();

fn t0() -> std::time::Instant {
    *T0.get_or_init(std::time::Instant::now)
}

/// Nanoseconds since the bench started (one clock for every task).
fn ns() -> u64 {
    t0().elapsed().as_nanos() as u64
}

fn core_now() -> Instant {
    Instant::from_millis(ns() / 1_000_000)
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// `HOSTLEASE_BENCH_ONLY=failover|storm` runs one part of the bench (for profiling).
fn only(part: &str) -> bool {
    std::env::var("HOSTLEASE_BENCH_ONLY").is_ok_and(|v| v == part)
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    percentile(&v, 0.5)
}

/// Waits until `count()` reaches `total` (bound `bound`), printing progress every 10 s.
async fn wait_progress(
    what: &str,
    bound: Duration,
    total: usize,
    mut count: impl FnMut() -> usize,
) -> bool {
    let start = tokio::time::Instant::now();
    let mut next = start + Duration::from_secs(1);
    // Every 25 ms: a pass over 10,000 clients' counters misses the cache on each, and every
    // 5 ms it took a visible share of the cores the clients and the server need.
    poll_until(bound, Duration::from_millis(25), || {
        let n = count();
        if tokio::time::Instant::now() >= next {
            next += Duration::from_secs(1);
            eprintln!(
                "[load]   {what}: {n} of {total} after {:.0} s",
                start.elapsed().as_secs_f64()
            );
        }
        n >= total
    })
    .await
}

/// Polls `cond` every 5 ms until it holds or `bound` passes.
async fn wait_until(bound: Duration, cond: impl FnMut() -> bool) -> bool {
    poll_until(bound, Duration::from_millis(5), cond).await
}

/// Polls `cond` every `every` until it holds or `bound` passes. What is measured comes from the
/// clients' own timestamps; the poll only notices the end.
async fn poll_until(bound: Duration, every: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        if cond() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(every).await;
    }
}

// ----- processes ---------------------------------------------------------------------------------

struct Proc {
    child: Child,
    addr: SocketAddr,
}

impl Proc {
    /// CPU time (user + system) the process has used so far, in seconds (Linux `/proc`).
    fn cpu_s(&self) -> f64 {
        proc_cpu_s(&format!("/proc/{}/stat", self.child.id()))
    }

    fn spawn(mut cmd: Command, log: &Path) -> Proc {
        let logf = std::fs::File::create(log).expect("log file");
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(logf)
            .spawn()
            .expect("spawn");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if let Some(a) = line.strip_prefix("listening on ") {
                    let _ = tx.send(a.to_string());
                }
            }
        });
        let addr: SocketAddr = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the process printed its address")
            .parse()
            .expect("address");
        assert!(addr.ip().is_loopback(), "loopback only");
        Proc { child, addr }
    }

    /// SIGTERM, then SIGKILL if it has not exited within 10 s.
    fn stop(&mut self) {
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        for _ in 0..200 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_server(dir: &Path, name: &str, max_members: usize) -> Proc {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hostlease-server"));
    cmd.args([
        "serve",
        "--db",
        &format!("sqlite://{}", dir.join("hostlease.db").display()),
        "--listen",
        "127.0.0.1:0",
        "--server-key",
        dir.join("server-key.json").to_str().unwrap(),
        "--app-key",
        dir.join("app-key.json").to_str().unwrap(),
        "--lease-ms",
        &LEASE_MS.to_string(),
        "--sweep-ms",
        &SWEEP_MS.to_string(),
        "--msg-rate",
        "100000",
        // Every client of the load generator comes from 127.0.0.1, and the WebSocket upgrade is
        // an HTTP request: at the default 50/s per address, joins would be capped at 50/s.
        "--http-rate",
        "100000",
        // And every one of its sockets counts against that one address.
        "--max-sockets-per-address",
        "1000000",
        "--max-members",
        &max_members.max(1000).to_string(),
    ])
    .env("RUST_LOG", "info");
    Proc::spawn(cmd, &dir.join(format!("{name}.log")))
}

fn spawn_baseline(dir: &Path) -> Proc {
    let mut cmd = Command::new(std::env::current_exe().expect("own path"));
    cmd.env("HOSTLEASE_BENCH_BASELINE", "1");
    Proc::spawn(cmd, &dir.join("baseline.log"))
}

/// `utime + stime` of a `/proc/<pid>/stat` file, in seconds (0 when unreadable).
fn proc_cpu_s(stat: &str) -> f64 {
    let text = std::fs::read_to_string(stat).unwrap_or_default();
    // The fields after the parenthesised command name: state is field 3, utime 14, stime 15.
    let rest = text.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
    // SAFETY: sysconf with a valid name has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    ticks as f64 / hz
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (children inherit it); returns it.
fn raise_nofile() -> u64 {
    // SAFETY: getrlimit/setrlimit on a valid, initialised struct.
    unsafe {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return 1024;
        }
        r.rlim_cur = r.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        r.rlim_cur
    }
}

// ----- the baseline broadcaster ------------------------------------------------------------------

/// A minimal WebSocket broadcaster: `/pub/{room}` frames go to every `/sub/{room}` connection.
fn baseline_main() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        // The server's backlog, so that both accept queues are equally deep.
        let listener = hostlease_server::listen("127.0.0.1:0", hostlease_server::LISTEN_BACKLOG)
            .await
            .expect("bind");
        println!("listening on {}", listener.local_addr().expect("addr"));
        type Rooms = Arc<Mutex<HashMap<String, broadcast::Sender<Message>>>>;
        let rooms: Rooms = Arc::default();
        loop {
            let Ok((s, _)) = listener.accept().await else {
                continue;
            };
            let rooms = rooms.clone();
            tokio::spawn(async move {
                let mut path = String::new();
                // The callback's signature is tungstenite's.
                #[allow(clippy::result_large_err)]
                let cb = |req: &tokio_tungstenite::tungstenite::handshake::server::Request,
                          resp| {
                    path = req.uri().path().to_string();
                    Ok(resp)
                };
                let Ok(ws) = tokio_tungstenite::accept_hdr_async(s, cb).await else {
                    return;
                };
                let mut parts = path.trim_start_matches('/').splitn(2, '/');
                let kind = parts.next().unwrap_or_default().to_string();
                let room = parts.next().unwrap_or_default().to_string();
                let tx = rooms
                    .lock()
                    .unwrap()
                    .entry(room)
                    .or_insert_with(|| broadcast::channel(1 << 16).0)
                    .clone();
                let (mut sink, mut stream) = ws.split();
                if kind == "pub" {
                    while let Some(Ok(m)) = stream.next().await {
                        if m.is_text() {
                            let _ = tx.send(m);
                        }
                    }
                } else {
                    let mut rx = tx.subscribe();
                    loop {
                        tokio::select! {
                            m = rx.recv() => match m {
                                Ok(m) => if sink.send(m).await.is_err() { break },
                                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                                Err(broadcast::error::RecvError::Closed) => break,
                            },
                            m = stream.next() => match m {
                                Some(Ok(_)) => {}
                                _ => break,
                            },
                        }
                    }
                }
            });
        }
    });
}

// ----- the load generator: one HostView per client -----------------------------------------------

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// What a client task publishes for the coordinator.
#[derive(Default)]
struct Shared {
    connected: AtomicBool,
    live: AtomicBool,
    /// When the view last became live (ns).
    live_at: AtomicU64,
    /// The newest epoch adopted, and when (ns).
    epoch: AtomicU64,
    epoch_at: AtomicU64,
    cursor: AtomicU64,
    authority: AtomicBool,
    /// Room events applied (once, in order), and when the last one was (ns).
    events: AtomicU64,
    last_event_at: AtomicU64,
    /// When this session last got a `lease_confirm` it had asked for (ns).
    last_confirm_at: AtomicU64,
    failures: AtomicU64,
    done: AtomicBool,
    capture: Mutex<Option<Vec<RoomEvent>>>,
}

enum Ctrl {
    /// Issue this many host commands (pipelined).
    Publish(usize),
    /// Stop answering lease probes (the socket stays open: a silent host).
    Deaf,
    /// Forget the host commands not issued yet (the role moved to another client).
    Cancel,
    /// Leave explicitly (leave frame and close).
    Leave,
    /// Drop the socket and end.
    Quit,
}

#[derive(Clone)]
enum Target {
    /// The server; the address may change (restart), with a generation number.
    Server(watch::Receiver<(u64, SocketAddr)>),
    /// The baseline broadcaster; the welcome is applied locally (the broadcaster has no logic).
    Baseline {
        addr: SocketAddr,
        welcome: Box<ServerMsg>,
    },
}

struct Client {
    sh: Arc<Shared>,
    ctrl: mpsc::UnboundedSender<Ctrl>,
}

struct Gen {
    app_key: Arc<Keypair>,
    handshakes: Arc<Semaphore>,
    next_id: usize,
}

impl Gen {
    fn join_token(&self, room: &str, p: &str) -> Token {
        let claims = JoinClaims {
            room: RoomId::new(room).unwrap(),
            sub: ParticipantId::new(p).unwrap(),
            name: p.to_string(),
            may_host: true,
            exp: hostlease_server::tokens::now_ms() + 3_600_000,
            kid: self.app_key.kid.clone(),
        };
        Token::new(self.app_key.sign_token(JOIN_PREFIX, &claims))
    }

    fn spawn(&mut self, room: &str, target: Target) -> Client {
        self.next_id += 1;
        let p = format!("p{}", self.next_id);
        let token = self.join_token(room, &p);
        let sh = Arc::new(Shared::default());
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(client_task(
            room.to_string(),
            token,
            target,
            self.handshakes.clone(),
            sh.clone(),
            rx,
        ));
        Client { sh, ctrl: tx }
    }
}

struct Local {
    deaf: bool,
    to_publish: usize,
    in_flight: usize,
    k: u64,
}

fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(16 * 1024)
        .write_buffer_size(16 * 1024)
}

async fn flush(view: &mut HostView, ws: &mut Ws, sh: &Shared, st: &mut Local) -> bool {
    let mut sent = false;
    while let Some(m) = view.poll_transmit() {
        if st.deaf && matches!(m, ClientMsg::LeaseEcho { .. }) {
            continue;
        }
        if ws
            .feed(Message::Text(encode_client(&m).into()))
            .await
            .is_err()
        {
            return false;
        }
        sent = true;
    }
    if sent && ws.flush().await.is_err() {
        return false;
    }
    drain_events(view, sh, st);
    true
}

fn drain_events(view: &mut HostView, sh: &Shared, st: &mut Local) {
    while let Some(e) = view.poll_event() {
        match e {
            Event::Phase(p) => {
                let live = p == Phase::Live;
                if live {
                    sh.live_at.store(ns(), RELAXED);
                }
                sh.live.store(live, Ordering::Release);
            }
            Event::HostChanged { assignment, .. } => {
                sh.epoch_at.store(ns(), RELAXED);
                sh.epoch.store(assignment.epoch.0, Ordering::Release);
            }
            Event::Lease(l) => sh
                .authority
                .store(matches!(l, LeaseState::Held { .. }), RELAXED),
            Event::RoomEvent(ev) => {
                if let Some(v) = sh.capture.lock().unwrap().as_mut() {
                    v.push(ev);
                }
                sh.last_event_at.store(ns(), RELAXED);
                sh.events.fetch_add(1, Ordering::Release);
            }
            Event::CommandAccepted { .. } => st.in_flight = st.in_flight.saturating_sub(1),
            Event::CommandFailed { .. } => {
                st.in_flight = st.in_flight.saturating_sub(1);
                sh.failures.fetch_add(1, RELAXED);
            }
            Event::ProtocolViolation(_) | Event::Stalled => {
                sh.failures.fetch_add(1, RELAXED);
            }
            _ => {}
        }
    }
    sh.cursor.store(view.cursor().0, RELAXED);
}

fn publish_step(view: &mut HostView, st: &mut Local, action: &Action) {
    while st.to_publish > 0 && st.in_flight < PIPELINE {
        st.k += 1;
        let payload = json!({
            "poll": st.k,
            "question": format!("Benchmark question {}: which option do you prefer?", st.k),
            "options": ["alpha", "beta", "gamma", "delta"],
        })
        .into();
        match view.command(core_now(), action.clone(), payload, None) {
            Ok(_) => {
                st.to_publish -= 1;
                st.in_flight += 1;
            }
            Err(_) => break, // no authority yet: retried on the next frame or tick
        }
    }
}

/// Presence frames (single or batched) received by every client together.
static PRESENCE_FRAMES: AtomicU64 = AtomicU64::new(0);

/// One server frame into the view (decode failures are counted).
fn on_frame(view: &mut HostView, sh: &Shared, st: &Local, text: &str) {
    match decode_server(text) {
        Ok(msg) => {
            if matches!(
                msg,
                ServerMsg::Presence { .. } | ServerMsg::PresenceBatch { .. }
            ) {
                PRESENCE_FRAMES.fetch_add(1, RELAXED);
            }
            if !st.deaf && matches!(msg, ServerMsg::LeaseConfirm { .. }) {
                sh.last_confirm_at.store(ns(), RELAXED);
            }
            view.handle_server(core_now(), msg);
        }
        Err(_) => {
            sh.failures.fetch_add(1, RELAXED);
        }
    }
}

/// Waits before a reconnection attempt: for a new server address, or 300 ms. `true`: quit.
async fn wait_retry(target: &Target, gen: u64, ctrl: &mut mpsc::UnboundedReceiver<Ctrl>) -> bool {
    let Target::Server(rx) = target else {
        return true; // the baseline has nothing to reconnect to
    };
    let mut rx = rx.clone();
    tokio::select! {
        _ = tokio::time::timeout(Duration::from_millis(300), rx.wait_for(|(g, _)| *g > gen)) => false,
        c = ctrl.recv() => matches!(c, None | Some(Ctrl::Quit) | Some(Ctrl::Leave)),
    }
}

async fn client_task(
    room: String,
    token: Token,
    target: Target,
    handshakes: Arc<Semaphore>,
    sh: Arc<Shared>,
    mut ctrl: mpsc::UnboundedReceiver<Ctrl>,
) {
    let mut view = HostView::new(ViewConfig {
        replay_history: false,
        lease_margin_ms: 100,
        ..ViewConfig::default()
    });
    let mut st = Local {
        deaf: false,
        to_publish: 0,
        in_flight: 0,
        k: 0,
    };
    let action = Action::new("poll.open").unwrap();
    let mut down_since = ns();
    loop {
        // Give up after a minute without a connection.
        if ns() - down_since > 60_000_000_000 {
            break;
        }
        let (url, gen) = match &target {
            Target::Server(rx) => {
                let (g, a) = *rx.borrow();
                (format!("ws://{a}/v1/rooms/{room}/ws"), g)
            }
            Target::Baseline { addr, .. } => (format!("ws://{addr}/sub/{room}"), 0),
        };
        let conn = {
            let _permit = handshakes.acquire().await;
            tokio::time::timeout(
                Duration::from_secs(10),
                tokio_tungstenite::connect_async_with_config(url, Some(ws_config()), true),
            )
            .await
        };
        let mut ws = match conn {
            Ok(Ok((ws, _))) => ws,
            _ => {
                if wait_retry(&target, gen, &mut ctrl).await {
                    break;
                }
                continue;
            }
        };
        sh.connected.store(true, RELAXED);
        view.handle_connected(core_now(), token.clone());
        if let Target::Baseline { welcome, .. } = &target {
            view.handle_server(core_now(), (**welcome).clone());
        }
        let mut quit = !flush(&mut view, &mut ws, &sh, &mut st).await;
        // One timer per connection, moved only when the view's next deadline moves.
        let timer = tokio::time::sleep(Duration::from_secs(3600));
        tokio::pin!(timer);
        if !quit {
            quit = loop {
                let wake = view.poll_timeout().map(|t| {
                    tokio::time::Instant::from_std(t0() + Duration::from_millis(t.as_millis()))
                });
                if let Some(w) = wake {
                    if timer.deadline() != w {
                        timer.as_mut().reset(w);
                    }
                }
                let retry = st.to_publish > 0 && st.in_flight == 0;
                tokio::select! {
                    c = ctrl.recv() => match c {
                        Some(Ctrl::Publish(n)) => st.to_publish += n,
                        Some(Ctrl::Deaf) => st.deaf = true,
                        Some(Ctrl::Cancel) => st.to_publish = 0,
                        Some(Ctrl::Leave) => {
                            view.leave(core_now());
                            let _ = flush(&mut view, &mut ws, &sh, &mut st).await;
                            let _ = ws.close(None).await;
                            break true;
                        }
                        Some(Ctrl::Quit) | None => break true,
                    },
                    m = ws.next() => {
                        // This frame and those already read with it (up to 64), then one step.
                        let mut m = m;
                        let mut n = 0;
                        let open = loop {
                            match m {
                                Some(Ok(Message::Text(t))) => on_frame(&mut view, &sh, &st, &t),
                                Some(Ok(_)) => {}
                                Some(Err(_)) | None => break false,
                            }
                            n += 1;
                            if n == 64 {
                                break true;
                            }
                            match ws.next().now_or_never() {
                                Some(next) => m = next,
                                None => break true,
                            }
                        };
                        if !open {
                            break false;
                        }
                    }
                    _ = &mut timer, if wake.is_some() => {
                        view.handle_timeout(core_now());
                    }
                    _ = tokio::time::sleep(Duration::from_millis(20)), if retry => {}
                }
                publish_step(&mut view, &mut st, &action);
                if !flush(&mut view, &mut ws, &sh, &mut st).await {
                    break false;
                }
            };
        }
        sh.connected.store(false, RELAXED);
        sh.live.store(false, RELAXED);
        sh.authority.store(false, RELAXED);
        if quit {
            break;
        }
        down_since = ns();
        view.handle_disconnected(core_now());
        while view.poll_transmit().is_some() {}
        drain_events(&mut view, &sh, &mut st);
        st.in_flight = 0;
        if wait_retry(&target, gen, &mut ctrl).await {
            break;
        }
    }
    sh.connected.store(false, RELAXED);
    sh.live.store(false, RELAXED);
    sh.done.store(true, RELAXED);
}

// ----- scenarios ---------------------------------------------------------------------------------

struct Room {
    name: String,
    clients: Vec<Client>,
}

fn all_live(clients: &[Client]) -> bool {
    clients.iter().all(|c| c.sh.live.load(Ordering::Acquire))
}

/// Starts clients of `room` until it has `n` (they connect on their own).
fn spawn_to(g: &mut Gen, room: &mut Room, n: usize, target: &Target) {
    while room.clients.len() < n {
        let c = g.spawn(&room.name, target.clone());
        room.clients.push(c);
    }
}

/// The clients of `rooms` that are live.
fn live_count(rooms: &[Room]) -> usize {
    rooms
        .iter()
        .flat_map(|r| &r.clients)
        .filter(|c| c.sh.live.load(RELAXED))
        .count()
}

async fn fill_room(g: &mut Gen, room: &mut Room, n: usize, target: &Target) -> bool {
    spawn_to(g, room, n, target);
    let bound = Duration::from_secs(30 + n as u64 / 20);
    wait_until(bound, || all_live(&room.clients)).await
}

fn host_of(room: &Room) -> Option<usize> {
    room.clients
        .iter()
        .position(|c| c.sh.authority.load(RELAXED) && !c.sh.done.load(RELAXED))
}

async fn wait_host(room: &Room) -> Option<usize> {
    let mut h = None;
    wait_until(Duration::from_secs(15), || {
        h = host_of(room);
        h.is_some()
    })
    .await;
    h
}

struct FanOut {
    /// Every client applied every event within the bound.
    complete: bool,
    /// Times a room's remaining events went to a new host (the old one lost its lease).
    redispatched: usize,
    deliveries_per_s: f64,
    events_per_s: f64,
    failures: u64,
}

/// Every room's host publishes `per_room` events; every client of every room must apply all of
/// them. Captures the events seen by one participant per room.
/// `runs` fan-out runs through the server to `clients` clients: each run's figures, and the
/// event frames of the last complete run (or of the first, if none completed) for the baseline.
async fn fanout_runs(
    rooms: &mut [Room],
    per_room: usize,
    runs: usize,
    clients: usize,
) -> (Vec<FanOut>, Vec<Vec<RoomEvent>>) {
    let mut figures = Vec::new();
    let mut captured = Vec::new();
    for _ in 0..runs {
        if let Some((f, c)) = fanout_server(rooms, per_room).await {
            eprintln!(
                "[load] fan-out {clients}: {:.0} deliveries/s, {:.0} events/s",
                f.deliveries_per_s, f.events_per_s
            );
            if f.complete || captured.is_empty() {
                captured = c.into_iter().filter(|v| !v.is_empty()).collect();
            }
            figures.push(f);
        }
    }
    (figures, captured)
}

async fn fanout_server(
    rooms: &mut [Room],
    per_room: usize,
) -> Option<(FanOut, Vec<Vec<RoomEvent>>)> {
    let mut hosts = Vec::new();
    for r in rooms.iter() {
        hosts.push(wait_host(r).await?);
    }
    let before: Vec<Vec<u64>> = rooms
        .iter()
        .map(|r| {
            r.clients
                .iter()
                .map(|c| c.sh.events.load(RELAXED))
                .collect()
        })
        .collect();
    let fail0: u64 = rooms
        .iter()
        .flat_map(|r| &r.clients)
        .map(|c| c.sh.failures.load(RELAXED))
        .sum();
    for (r, &h) in rooms.iter().zip(&hosts) {
        let spy = if h == 0 { 1 } else { 0 };
        *r.clients[spy].sh.capture.lock().unwrap() = Some(Vec::new());
    }
    let start = ns();
    for (r, &h) in rooms.iter().zip(&hosts) {
        let _ = r.clients[h].ctrl.send(Ctrl::Publish(per_room));
    }
    let target = per_room as u64;
    let spies: Vec<usize> = hosts.iter().map(|&h| if h == 0 { 1 } else { 0 }).collect();
    let mut redispatched = 0;
    let ok = wait_until(Duration::from_secs(30), || {
        // A host that lost its role mid-run: the new host publishes what is left.
        for (i, r) in rooms.iter().enumerate() {
            let seen = r.clients[spies[i]].sh.events.load(RELAXED) - before[i][spies[i]];
            if seen >= target {
                continue;
            }
            if let Some(nh) = host_of(r) {
                if nh != hosts[i] {
                    let _ = r.clients[hosts[i]].ctrl.send(Ctrl::Cancel);
                    let _ = r.clients[nh]
                        .ctrl
                        .send(Ctrl::Publish((target - seen) as usize));
                    hosts[i] = nh;
                    redispatched += 1;
                }
            }
        }
        rooms.iter().zip(&before).all(|(r, b)| {
            r.clients
                .iter()
                .zip(b)
                .all(|(c, b0)| c.sh.events.load(Ordering::Acquire) >= b0 + target)
        })
    })
    .await;
    let end = rooms
        .iter()
        .flat_map(|r| &r.clients)
        .map(|c| c.sh.last_event_at.load(RELAXED))
        .max()
        .unwrap_or(start);
    let mut captured = Vec::new();
    for (r, &spy) in rooms.iter().zip(&spies) {
        captured.push(r.clients[spy].sh.capture.lock().unwrap().take().unwrap());
    }
    if !ok {
        eprintln!(
            "fan-out: not every client got every event within the bound (a host lost its lease?)"
        );
    }
    let secs = (end - start) as f64 / 1e9;
    let delivered: u64 = rooms
        .iter()
        .zip(&before)
        .flat_map(|(r, b)| {
            r.clients
                .iter()
                .zip(b)
                .map(|(c, b0)| c.sh.events.load(RELAXED) - b0)
        })
        .sum();
    let committed: u64 = captured.iter().map(|v| v.len() as u64).sum();
    let failures = rooms
        .iter()
        .flat_map(|r| &r.clients)
        .map(|c| c.sh.failures.load(RELAXED))
        .sum::<u64>()
        - fail0;
    Some((
        FanOut {
            complete: ok,
            redispatched,
            deliveries_per_s: delivered as f64 / secs,
            events_per_s: committed as f64 / secs,
            failures,
        },
        captured,
    ))
}

/// The welcome a baseline client applies locally: the room at seq 0, hosted by the actor of the
/// captured events.
fn baseline_welcome(room: &str, ev: &RoomEvent) -> ServerMsg {
    let a = Assignment {
        room: RoomId::new(room).unwrap(),
        host: Some(ev.actor.clone()),
        session: Some(SessionId::new("s-bench-host").unwrap()),
        epoch: ev.epoch,
        seq: Seq::ZERO,
        lease_ms: LEASE_MS,
        reason: Reason::Elected,
        issued_at: ServerTime(0),
    };
    ServerMsg::Welcome {
        you: ParticipantId::new("bench-sub").unwrap(),
        session: SessionId::new("s-bench-sub").unwrap(),
        snapshot: Snapshot {
            room: RoomId::new(room).unwrap(),
            current: SignedAssignment::from(a),
            members: Vec::new(),
            seq: Seq::ZERO,
            lease_remaining_ms: None,
            server_time: ServerTime(0),
            actions: ActionTable {
                host: vec![Action::new("poll.open").unwrap()],
                participant: vec![Action::new("vote").unwrap()],
            },
        },
        missed: Vec::new(),
        discontinuity: None,
    }
}

/// What the baseline broadcaster measured.
#[derive(Default)]
struct BaselineRun {
    /// Deliveries/s per run.
    rates: Vec<f64>,
    /// Per client: the time from publishing one signed assignment until it held it, ms.
    one_frame: Vec<f64>,
    /// The time until every client had connected (all started at once) and was live, s.
    connect_s: f64,
}

/// The same frames (the captured events, renumbered so that each run continues the stream) to
/// the same number of clients through the baseline broadcaster, after the clients connected all
/// at once. Then `one_frame_rounds` rounds of one signed assignment each (the failover's frame)
/// to the first room.
async fn fanout_baseline(
    g: &mut Gen,
    addr: SocketAddr,
    captured: &[Vec<RoomEvent>],
    room_size: usize,
    runs: usize,
    one_frame_rounds: usize,
) -> BaselineRun {
    let mut rooms = Vec::new();
    let t = std::time::Instant::now();
    for (i, evs) in captured.iter().enumerate() {
        let name = format!("base-{i}");
        let target = Target::Baseline {
            addr,
            welcome: Box::new(baseline_welcome(&name, &evs[0])),
        };
        let mut r = Room {
            name,
            clients: Vec::new(),
        };
        spawn_to(g, &mut r, room_size, &target);
        rooms.push(r);
    }
    let total = rooms.len() * room_size;
    if !wait_progress(
        "baseline connect",
        Duration::from_secs(JOIN_BOUND_S),
        total,
        || live_count(&rooms),
    )
    .await
    {
        eprintln!("baseline: clients did not all connect");
        quit_all(&rooms).await;
        return BaselineRun::default();
    }
    let connect_s = t.elapsed().as_secs_f64();
    let mut out = Vec::new();
    for run in 0..runs {
        // Frames encoded exactly as the server encodes them, before the clock starts.
        let frames: Vec<Vec<String>> = captured
            .iter()
            .map(|evs| {
                evs.iter()
                    .enumerate()
                    .map(|(i, e)| {
                        let mut e = e.clone();
                        e.seq = Seq((run * evs.len() + i + 1) as u64);
                        encode_server(&ServerMsg::Event(e))
                    })
                    .collect()
            })
            .collect();
        let mut pubs = Vec::new();
        for r in &rooms {
            let url = format!("ws://{addr}/pub/{}", r.name);
            let (ws, _) = tokio_tungstenite::connect_async_with_config(url, None, true)
                .await
                .expect("publisher connects");
            pubs.push(ws);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let before: Vec<Vec<u64>> = rooms
            .iter()
            .map(|r| {
                r.clients
                    .iter()
                    .map(|c| c.sh.events.load(RELAXED))
                    .collect()
            })
            .collect();
        let start = ns();
        let mut tasks = Vec::new();
        for (mut ws, fr) in pubs.into_iter().zip(frames) {
            tasks.push(tokio::spawn(async move {
                for f in fr {
                    if ws.feed(Message::Text(f.into())).await.is_err() {
                        break;
                    }
                }
                let _ = ws.flush().await;
                ws
            }));
        }
        let ok = wait_until(Duration::from_secs(60), || {
            rooms
                .iter()
                .zip(&before)
                .zip(captured)
                .all(|((r, b), evs)| {
                    r.clients
                        .iter()
                        .zip(b)
                        .all(|(c, b0)| c.sh.events.load(Ordering::Acquire) >= b0 + evs.len() as u64)
                })
        })
        .await;
        let end = rooms
            .iter()
            .flat_map(|r| &r.clients)
            .map(|c| c.sh.last_event_at.load(RELAXED))
            .max()
            .unwrap_or(start);
        for t in tasks {
            if let Ok(mut ws) = t.await {
                let _ = ws.close(None).await;
            }
        }
        if !ok {
            eprintln!("baseline: not every client got every frame within the bound");
            continue;
        }
        let total: usize = captured.iter().map(Vec::len).sum::<usize>() * room_size;
        out.push(total as f64 / ((end - start) as f64 / 1e9));
    }
    let mut one = Vec::new();
    if let (Some(evs), Some(r)) = (captured.first(), rooms.first()) {
        let url = format!("ws://{addr}/pub/{}", r.name);
        let (mut ws, _) = tokio_tungstenite::connect_async_with_config(url, None, true)
            .await
            .expect("publisher connects");
        for round in 0..one_frame_rounds {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let e0 = evs[0].epoch.0 + round as u64;
            let a = Assignment {
                room: RoomId::new(r.name.as_str()).unwrap(),
                host: Some(ParticipantId::new(format!("p-next-{round}")).unwrap()),
                session: Some(SessionId::new(format!("s-next-{round}")).unwrap()),
                epoch: Epoch(e0 + 1),
                seq: Seq((runs * evs.len() + round + 1) as u64),
                lease_ms: LEASE_MS,
                reason: Reason::Left,
                issued_at: ServerTime(hostlease_server::tokens::now_ms()),
            };
            let frame = encode_server(&ServerMsg::Assignment(g.app_key.sign_assignment(a)));
            let start = ns();
            if ws.send(Message::Text(frame.into())).await.is_err() {
                break;
            }
            let held = |c: &Client| c.sh.epoch.load(Ordering::Acquire) > e0;
            if !wait_until(Duration::from_secs(10), || r.clients.iter().all(held)).await {
                eprintln!("baseline: not every client got the assignment within the bound");
                break;
            }
            let lat: Vec<f64> = r
                .clients
                .iter()
                .map(|c| ms(c.sh.epoch_at.load(RELAXED).saturating_sub(start)))
                .collect();
            eprintln!(
                "[load]   baseline round: all hold after {:.1} ms",
                lat.iter().copied().fold(0.0, f64::max)
            );
            one.extend(lat);
        }
        let _ = ws.close(None).await;
    }
    quit_all(&rooms).await;
    BaselineRun {
        rates: out,
        one_frame: one,
        connect_s,
    }
}

#[derive(Default)]
struct Failover {
    /// Per client: time from the host's leave (or silence) to holding the new assignment, ms.
    samples: Vec<f64>,
    /// Per round: the time until every client held it, ms.
    all_hold: Vec<f64>,
    /// Silent loss, per round: all hold, measured from the host's last renewal, ms.
    since_renewal: Vec<f64>,
}

/// The room's host leaves explicitly (or goes silent: stops answering probes); every other
/// client must adopt the new epoch. The old host is then replaced by a fresh client.
async fn failover(
    g: &mut Gen,
    room: &mut Room,
    rounds: usize,
    silent: bool,
    target: &Target,
) -> Failover {
    let mut f = Failover {
        samples: Vec::new(),
        all_hold: Vec::new(),
        since_renewal: Vec::new(),
    };
    for _ in 0..rounds {
        let Some(h) = wait_host(room).await else {
            eprintln!("failover: no host with authority");
            break;
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        let e0 = room.clients[h].sh.epoch.load(Ordering::Acquire);
        let renewed = room.clients[h].sh.last_confirm_at.load(RELAXED);
        let start = ns();
        let _ = room.clients[h]
            .ctrl
            .send(if silent { Ctrl::Deaf } else { Ctrl::Leave });
        let bound = Duration::from_millis(if silent { 3 * LEASE_MS + 5000 } else { 10_000 });
        let others: Vec<usize> = (0..room.clients.len()).filter(|&i| i != h).collect();
        let ok = wait_until(bound, || {
            others.iter().all(|&i| {
                let c = &room.clients[i].sh;
                c.done.load(RELAXED) || c.epoch.load(Ordering::Acquire) > e0
            })
        })
        .await;
        if !ok {
            eprintln!("failover: not every client adopted the new assignment in time");
        }
        let lat: Vec<u64> = others
            .iter()
            .map(|&i| &room.clients[i].sh)
            .filter(|c| c.epoch.load(Ordering::Acquire) > e0)
            .map(|c| c.epoch_at.load(RELAXED).saturating_sub(start))
            .collect();
        let max = lat.iter().copied().max().unwrap_or(0);
        f.samples.extend(lat.iter().map(|&n| ms(n)));
        f.all_hold.push(ms(max));
        eprintln!(
            "[load]   round: {} clients hold epoch > {e0} after {:.1} ms (first {:.1} ms)",
            lat.len(),
            ms(max),
            ms(lat.iter().copied().min().unwrap_or(0))
        );
        if silent {
            f.since_renewal.push(ms(start + max - renewed));
            let _ = room.clients[h].ctrl.send(Ctrl::Leave);
        }
        let old = room.clients.remove(h);
        wait_until(Duration::from_secs(5), || old.sh.done.load(RELAXED)).await;
        // Keep the room at its size: a fresh participant takes the free place.
        let n = room.clients.len() + 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
        if !fill_room(g, room, n, target).await {
            eprintln!("failover: the replacement client did not get live");
        }
    }
    f
}

struct Storm {
    total: usize,
    /// Clients live again 2 s after the new address was handed out.
    at_2s: usize,
    /// Clients live at the end (all of them, unless the bound passed).
    live_end: usize,
    all: bool,
    first_ms: f64,
    all_live_ms: f64,
    p50_ms: f64,
    p99_ms: f64,
    consistent: bool,
    mismatched: usize,
    /// Presence frames the clients received until all were live.
    presence_frames: u64,
    /// CPU seconds used until all were live: by the new server process, and by the load
    /// generator (the 10,000 clients).
    server_cpu_s: f64,
    gen_cpu_s: f64,
}

/// Restarts the server (SIGTERM, a new process on the same database) and measures, from the
/// moment the new address is handed to the clients, how long until every client is live again;
/// then checks every client against the room's row in the store.
async fn reconnect_storm(
    rooms: &[Room],
    server: &mut Proc,
    dir: &Path,
    addr_tx: &watch::Sender<(u64, SocketAddr)>,
    room_size: usize,
) -> Option<Storm> {
    let clients: Vec<&Client> = rooms.iter().flat_map(|r| &r.clients).collect();
    server.stop();
    if !wait_until(Duration::from_secs(30), || {
        clients.iter().all(|c| !c.sh.connected.load(RELAXED))
    })
    .await
    {
        eprintln!("storm: clients did not notice the stop");
        return None;
    }
    *server = spawn_server(dir, "server-2", room_size);
    let gen = addr_tx.borrow().0 + 1;
    let presence_before = PRESENCE_FRAMES.load(RELAXED);
    let (server_cpu0, gen_cpu0) = (server.cpu_s(), proc_cpu_s("/proc/self/stat"));
    let start = ns();
    addr_tx.send_replace((gen, server.addr));
    let live_now = || {
        clients
            .iter()
            .filter(|c| c.sh.live.load(Ordering::Acquire) && c.sh.live_at.load(RELAXED) > start)
            .count()
    };
    let ok = wait_progress(
        "storm",
        Duration::from_secs(STORM_BOUND_S),
        clients.len(),
        live_now,
    )
    .await;
    let presence_frames = PRESENCE_FRAMES.load(RELAXED) - presence_before;
    let server_cpu_s = server.cpu_s() - server_cpu0;
    let gen_cpu_s = proc_cpu_s("/proc/self/stat") - gen_cpu0;
    let mut lat: Vec<f64> = clients
        .iter()
        .filter(|c| c.sh.live.load(Ordering::Acquire) && c.sh.live_at.load(RELAXED) > start)
        .map(|c| ms(c.sh.live_at.load(RELAXED) - start))
        .collect();
    let live_end = lat.len();
    if !ok {
        eprintln!(
            "storm: {} clients not live within the bound",
            clients.len() - live_end
        );
    }
    lat.sort_by(f64::total_cmp);
    let at_2s = lat.iter().filter(|&&l| l <= 2000.0).count();
    // The authoritative state: each room's row in the store (the new process may grant again
    // when the old host's lease lapses; allow that to settle).
    let store = SqliteStore::open(&format!("sqlite://{}", dir.join("hostlease.db").display()))
        .await
        .ok()?;
    let mut mismatched;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        mismatched = 0;
        for r in rooms {
            let row = store
                .room(&RoomId::new(r.name.as_str()).unwrap())
                .await
                .ok()
                .flatten()?;
            for c in &r.clients {
                if c.sh.epoch.load(Ordering::Acquire) != row.epoch.0
                    || c.sh.cursor.load(RELAXED) != row.seq.0
                    || !c.sh.live.load(RELAXED)
                {
                    mismatched += 1;
                }
            }
        }
        if mismatched == 0 || tokio::time::Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Some(Storm {
        total: clients.len(),
        at_2s,
        live_end,
        all: ok,
        first_ms: lat.first().copied().unwrap_or(f64::NAN),
        all_live_ms: lat.last().copied().unwrap_or(f64::NAN),
        p50_ms: percentile(&lat, 0.5),
        p99_ms: percentile(&lat, 0.99),
        consistent: mismatched == 0,
        mismatched,
        presence_frames,
        server_cpu_s,
        gen_cpu_s,
    })
}

// ----- commits on SQLite -------------------------------------------------------------------------

struct Commits {
    grants: f64,
    commands: f64,
    /// Commands queued 64 at a time.
    pipelined: f64,
    raw: f64,
}

/// The store's commit rate (CAS grants; accepted host commands) beside a raw `INSERT` with the
/// same journal mode and synchronous setting, on files in the same directory, alternating.
async fn commits(dir: &Path) -> Commits {
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
    use std::str::FromStr;
    const N: usize = 1500;
    const BOUND: Duration = Duration::from_secs(3);
    let store = SqliteStore::open(&format!("sqlite://{}", dir.join("commits.db").display()))
        .await
        .expect("store");
    let keys = Keypair::generate("srv-bench");
    let opts =
        SqliteConnectOptions::from_str(&format!("sqlite://{}", dir.join("raw.db").display()))
            .unwrap()
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full);
    let raw = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(opts)
        .await
        .expect("raw db");
    sqlx::query("CREATE TABLE IF NOT EXISTS raw (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")
        .execute(&raw)
        .await
        .unwrap();
    let body = "x".repeat(300);
    let room = RoomId::new("commit-bench").unwrap();
    let holders: Vec<(ParticipantId, SessionId)> = (0..2)
        .map(|i| {
            (
                ParticipantId::new(format!("c{i}")).unwrap(),
                SessionId::new(format!("s-c{i}")).unwrap(),
            )
        })
        .collect();
    let mut epoch = Epoch::ZERO;
    let mut key = 0u64;
    let (mut g, mut c, mut p, mut r) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..5 {
        // raw INSERT + fsync
        let t = std::time::Instant::now();
        let mut n = 0;
        while n < N && t.elapsed() < BOUND {
            sqlx::query("INSERT INTO raw (body) VALUES (?)")
                .bind(&body)
                .execute(&raw)
                .await
                .unwrap();
            n += 1;
        }
        r.push(n as f64 / t.elapsed().as_secs_f64());
        // CAS grants, alternating holders
        let t = std::time::Instant::now();
        let mut n = 0;
        while n < N && t.elapsed() < BOUND {
            let req = GrantReq {
                room: room.clone(),
                expected_epoch: epoch,
                holder: Some(holders[n % 2].clone()),
                lease_ms: 600_000,
                reason: Reason::Elected,
                require_lapsed: false,
                close: false,
            };
            match store.grant(req, &keys).await.expect("grant") {
                GrantOutcome::Won { assignment, .. } => epoch = assignment.assignment.epoch,
                GrantOutcome::Lost(_) => panic!("CAS lost with one writer"),
            }
            n += 1;
        }
        g.push(n as f64 / t.elapsed().as_secs_f64());
        // Accepted host commands of the current holder.
        let row = store.room(&room).await.unwrap().unwrap();
        let (sub, sid) = (row.host.clone().unwrap(), row.session.clone().unwrap());
        let claims = CapClaims {
            room: room.clone(),
            sub: sub.clone(),
            sid: sid.clone(),
            role: Role::Host,
            epoch: Some(row.epoch),
            actions: vec![Action::new("poll.open").unwrap()],
            exp: hostlease_server::tokens::now_ms() + 3_600_000,
            sat: hostlease_server::tokens::now_ms(),
            kid: keys.kid.clone(),
        };
        let command_req = |key: u64| {
            CommandReq {
            room: room.clone(),
            sender: sub.clone(),
            sender_session: Some(sid.clone()),
            claims: claims.clone(),
            kind: ActionKind::Host,
            action: Action::new("poll.open").unwrap(),
            payload: json!({"poll": key, "question": "Which option do you prefer?", "options": ["alpha", "beta", "gamma", "delta"]}).into(),
            epoch: Some(row.epoch),
            key: IdempotencyKey::new(format!("k{key}")).unwrap(),
            next_holder: None,
            refuse: None,
            lease_ms: 600_000,
            order: None,
        }
        };
        let t = std::time::Instant::now();
        let mut n = 0;
        while n < N && t.elapsed() < BOUND {
            key += 1;
            let done = store
                .command(command_req(key), &keys)
                .await
                .expect("command");
            assert!(
                matches!(done.outcome, hostlease::protocol::Outcome::Accepted { .. }),
                "command refused: {:?}",
                done.outcome
            );
            n += 1;
        }
        c.push(n as f64 / t.elapsed().as_secs_f64());
        // The same commands, 64 queued at a time (one host's pipeline): the group committer
        // takes each window into one transaction.
        let t = std::time::Instant::now();
        let mut n = 0;
        while n < N && t.elapsed() < BOUND {
            let window: Vec<_> = (0..64)
                .map(|_| {
                    key += 1;
                    store.command(command_req(key), &keys)
                })
                .collect();
            for done in futures_util::future::join_all(window).await {
                assert!(
                    matches!(
                        done.expect("command").outcome,
                        hostlease::protocol::Outcome::Accepted { .. }
                    ),
                    "command refused"
                );
                n += 1;
            }
        }
        p.push(n as f64 / t.elapsed().as_secs_f64());
    }
    Commits {
        grants: median(g),
        commands: median(c),
        pipelined: median(p),
        raw: median(r),
    }
}

// ----- main --------------------------------------------------------------------------------------

fn fmt_rate(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2} M/s", v / 1e6)
    } else if v >= 1e4 {
        format!("{:.0} k/s", v / 1e3)
    } else {
        format!("{v:.0} /s")
    }
}

fn main() {
    if std::env::var_os("HOSTLEASE_BENCH_BASELINE").is_some() {
        baseline_main();
        return;
    }
    let _ = t0();
    let room_size = env_usize("HOSTLEASE_BENCH_ROOM_SIZE", 1000).max(2);
    let small = env_usize("HOSTLEASE_BENCH_SMALL_ROOM", 100).max(2);
    let mut clients = env_usize("HOSTLEASE_BENCH_CLIENTS", 10_000);
    let nofile = raise_nofile();
    let budget = (nofile as usize).saturating_sub(500);
    if budget < clients {
        eprintln!("RLIMIT_NOFILE {nofile} allows only {budget} clients");
        clients = budget;
    }
    let n_rooms = (clients / small).max(1);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(run(room_size, small, n_rooms, nofile));
}

async fn quit_all(rooms: &[Room]) {
    for c in rooms.iter().flat_map(|r| &r.clients) {
        let _ = c.ctrl.send(Ctrl::Quit);
    }
    wait_until(Duration::from_secs(20), || {
        rooms
            .iter()
            .flat_map(|r| &r.clients)
            .all(|c| c.sh.done.load(RELAXED))
    })
    .await;
}

async fn run(room_size: usize, small: usize, n_rooms: usize, nofile: u64) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let d = dir.path().to_path_buf();
    let d = d.as_path();
    let started = std::time::Instant::now();
    let mut rows: Vec<String> = Vec::new();
    let mut notes: Vec<String> = Vec::new();

    eprintln!("[load] commits on SQLite ...");
    let cm = commits(d).await;
    eprintln!(
        "[load] grants {:.0}/s, commands {:.0}/s (64 queued: {:.0}/s), raw {:.0}/s",
        cm.grants, cm.commands, cm.pipelined, cm.raw
    );

    let app_key = Keypair::load_or_create(&d.join("app-key.json"), "app").expect("app key");
    let mut server = spawn_server(d, "server-1", room_size);
    let (addr_tx, addr_rx) = watch::channel((1u64, server.addr));
    let target = Target::Server(addr_rx);
    let mut g = Gen {
        app_key: Arc::new(app_key),
        handshakes: Arc::new(Semaphore::new(HANDSHAKES)),
        next_id: 0,
    };

    let per_room_1 = 100;
    let (mut fan1, mut cap1, mut leave, mut silent, mut join1_s) = (
        Vec::new(),
        Vec::new(),
        Failover::default(),
        Failover::default(),
        0.0,
    );
    if !only("storm") {
        // --- one room of `room_size` -------------------------------------------------------------
        eprintln!("[load] {room_size} clients join room r0 ...");
        let mut rooms = vec![Room {
            name: "r0".into(),
            clients: Vec::new(),
        }];
        let t = std::time::Instant::now();
        assert!(
            fill_room(&mut g, &mut rooms[0], room_size, &target).await,
            "clients did not all get live"
        );
        join1_s = t.elapsed().as_secs_f64();
        eprintln!("[load] joined in {join1_s:.1} s");
        (fan1, cap1) = fanout_runs(&mut rooms[..1], per_room_1, FANOUT_RUNS, room_size).await;
        eprintln!("[load] failover after explicit leave ...");
        leave = failover(&mut g, &mut rooms[0], LEAVE_ROUNDS, false, &target).await;
        if only("failover") {
            let mut v = leave.samples.clone();
            v.sort_by(f64::total_cmp);
            println!(
                "failover after an explicit leave, {room_size} clients: p50 {:.1} ms, p99 {:.1} ms",
                percentile(&v, 0.5),
                percentile(&v, 0.99)
            );
            quit_all(&rooms).await;
            server.stop();
            return;
        }
        eprintln!("[load] silent loss ...");
        silent = failover(&mut g, &mut rooms[0], SILENT_ROUNDS, true, &target).await;

        // The 1,000-member room is done: its clients go.
        quit_all(&rooms).await;
        drop(rooms);
    }

    // --- `clients` clients in rooms of `small` -------------------------------------------------
    let total = n_rooms * small;
    eprintln!("[load] {total} clients join {n_rooms} rooms of {small} ...");
    let t = std::time::Instant::now();
    let mut rooms: Vec<Room> = (0..n_rooms)
        .map(|i| Room {
            name: format!("s{i}"),
            clients: Vec::new(),
        })
        .collect();
    for r in rooms.iter_mut() {
        spawn_to(&mut g, r, small, &target);
    }
    let all_ok = wait_progress("join", Duration::from_secs(JOIN_BOUND_S), total, || {
        live_count(&rooms)
    })
    .await;
    let join_s = t.elapsed().as_secs_f64();
    eprintln!("[load] joined: {all_ok} in {join_s:.1} s");
    // Let the hosts elected during the join renew (or lapse) before measuring.
    tokio::time::sleep(Duration::from_millis(LEASE_MS)).await;
    let per_room_n = (1000 / n_rooms).max(4);
    let runs = if all_ok { FANOUT_RUNS } else { 0 };
    let (fan_n, cap_n) = fanout_runs(&mut rooms, per_room_n, runs, total).await;

    eprintln!("[load] reconnect storm ({total} clients, server restart) ...");
    let storm = if all_ok {
        reconnect_storm(&rooms, &mut server, d, &addr_tx, small).await
    } else {
        None
    };
    if only("storm") {
        if let Some(s) = &storm {
            println!(
                "reconnect storm, {total} clients: {} of {} live at 2 s, all after {:.2} s (p50 {:.2} s, p99 {:.2} s), state consistent: {}; CPU: server {:.2} s, load generator {:.2} s",
                s.at_2s, s.total, s.all_live_ms / 1e3, s.p50_ms / 1e3, s.p99_ms / 1e3, s.consistent, s.server_cpu_s, s.gen_cpu_s
            );
        }
        quit_all(&rooms).await;
        server.stop();
        return;
    }
    quit_all(&rooms).await;
    drop(rooms);
    server.stop();

    // --- the baseline broadcaster -------------------------------------------------------------
    eprintln!("[load] baseline broadcaster ...");
    let baseline = spawn_baseline(d);
    let b1 = if cap1.is_empty() {
        BaselineRun::default()
    } else {
        fanout_baseline(
            &mut g,
            baseline.addr,
            &cap1,
            room_size,
            FANOUT_RUNS,
            LEAVE_ROUNDS,
        )
        .await
    };
    let (base1, mut base_one) = (b1.rates, b1.one_frame);
    base_one.sort_by(f64::total_cmp);
    eprintln!("[load] baseline {room_size}: {base1:?}");
    let bn = if cap_n.is_empty() {
        BaselineRun::default()
    } else {
        fanout_baseline(&mut g, baseline.addr, &cap_n, small, FANOUT_RUNS, 0).await
    };
    let (base_n, base_connect_s) = (bn.rates, bn.connect_s);
    eprintln!("[load] baseline {total}: {base_n:?}");
    drop(baseline);

    // --- the table ------------------------------------------------------------------------------
    let mut s = leave.samples.clone();
    s.sort_by(f64::total_cmp);
    let p99 = percentile(&s, 0.99);
    rows.push(format!(
        "| failover after an explicit leave, {room_size} clients: each client holds the new assignment ({} rounds, {} samples) | p50 {:.1} ms, p99 {:.1} ms; all hold after median {:.1} ms, max {:.1} ms | {} | {} | p99 ≤ 20 ms: {} |",
        leave.all_hold.len(),
        s.len(),
        percentile(&s, 0.5),
        p99,
        median(leave.all_hold.clone()),
        leave.all_hold.iter().copied().fold(0.0, f64::max),
        if base_one.is_empty() {
            "—".to_string()
        } else {
            format!(
                "one signed assignment frame published to {room_size} clients: p50 {:.1} ms, p99 {:.1} ms",
                percentile(&base_one, 0.5),
                percentile(&base_one, 0.99)
            )
        },
        if base_one.is_empty() {
            "—".to_string()
        } else {
            format!("p99 {:.2}× the baseline's", p99 / percentile(&base_one, 0.99))
        },
        if p99 <= 20.0 { "met" } else { "**not met**" }
    ));
    let mut ss = silent.samples.clone();
    ss.sort_by(f64::total_cmp);
    rows.push(format!(
        "| silent loss (host stops answering probes, socket open), TTL {LEASE_MS} ms, sweep {SWEEP_MS} ms: all {} others hold the new assignment ({} rounds) | after the last renewal: median {:.0} ms (TTL + {:.0} ms); after going silent: median {:.0} ms | — | — | documented bound: TTL + sweep + a store round trip, plus the fan-out |",
        room_size - 1,
        silent.since_renewal.len(),
        median(silent.since_renewal.clone()),
        median(silent.since_renewal.clone()) - LEASE_MS as f64,
        median(silent.all_hold.clone()),
    ));
    let fan_row = |label: String, runs: &[FanOut], base: &[f64]| {
        let incomplete = runs.iter().filter(|f| !f.complete).count();
        let note = if incomplete > 0 {
            format!(
                " ({incomplete} of {} runs incomplete within the bound)",
                runs.len()
            )
        } else {
            String::new()
        };
        let d = median(runs.iter().map(|f| f.deliveries_per_s).collect());
        let e = median(runs.iter().map(|f| f.events_per_s).collect());
        let b = median(base.to_vec());
        let ratio = d / b;
        format!(
            "| {label} | {} deliveries ({} events committed and published){note} | {} deliveries | {:.2} | ≥ 0.8: {} |",
            fmt_rate(d),
            fmt_rate(e),
            fmt_rate(b),
            ratio,
            if ratio >= 0.8 { "met" } else { "**not met**" }
        )
    };
    rows.push(fan_row(
        format!("fan-out to {room_size} clients, 1 room ({per_room_1} events per run, median of {FANOUT_RUNS})"),
        &fan1,
        &base1,
    ));
    rows.push(fan_row(
        format!("fan-out to {total} clients, {n_rooms} rooms × {small} ({per_room_n} events per room per run, median of {FANOUT_RUNS})"),
        &fan_n,
        &base_n,
    ));
    match &storm {
        Some(st) => rows.push(format!(
            "| reconnect storm: {total} clients ({n_rooms} rooms × {small}) reconnect after a server restart and hold the authoritative state | {} of {} live at 2 s; {} after {:.1} s (first {:.2} s, p50 {:.2} s, p99 {:.2} s); {} presence frames received meanwhile; CPU until then: server {:.2} s, load generator {:.2} s; state {} | {} | {} | ≤ 2 s: {} |",
            st.at_2s,
            st.total,
            if st.all { "all live".to_string() } else { format!("only {} live (bound)", st.live_end) },
            st.all_live_ms / 1e3,
            st.first_ms / 1e3,
            st.p50_ms / 1e3,
            st.p99_ms / 1e3,
            st.presence_frames,
            st.server_cpu_s,
            st.gen_cpu_s,
            if st.consistent { "matches the store for every client".to_string() } else { format!("**{} clients differ from the store**", st.mismatched) },
            if base_connect_s > 0.0 { format!("the same {total} clients connect all at once (WebSocket handshake, no hello, the welcome applied locally): all live after {base_connect_s:.1} s") } else { "—".to_string() },
            if base_connect_s > 0.0 { format!("{:.2}× the baseline's time", st.all_live_ms / 1e3 / base_connect_s) } else { "—".to_string() },
            if st.all && st.all_live_ms <= 2000.0 && st.consistent { "met" } else { "**not met**" }
        )),
        None => rows.push(format!(
            "| reconnect storm: {total} clients | **not measured** (joined: {all_ok}, {join_s:.0} s) | — | — | ≤ 2 s: **not met** |"
        )),
    }
    rows.push(format!(
        "| commits/s on SQLite: CAS grants (`Store::grant`, one writer, median of 5) | {} | raw `INSERT` + fsync: {} | {:.2} | — |",
        fmt_rate(cm.grants),
        fmt_rate(cm.raw),
        cm.grants / cm.raw
    ));
    rows.push(format!(
        "| commits/s on SQLite: accepted host commands (`Store::command`) | {} | raw `INSERT` + fsync: {} | {:.2} | — |",
        fmt_rate(cm.commands),
        fmt_rate(cm.raw),
        cm.commands / cm.raw
    ));
    rows.push(format!(
        "| commits/s on SQLite: accepted host commands, 64 queued at a time (group commit) | {} | raw `INSERT` + fsync: {} | {:.2} | — |",
        fmt_rate(cm.pipelined),
        fmt_rate(cm.raw),
        cm.pipelined / cm.raw
    ));
    let failures: u64 = fan1.iter().chain(&fan_n).map(|f| f.failures).sum();
    notes.push(format!(
        "hostlease-server child process on 127.0.0.1 (`--lease-ms {LEASE_MS} --sweep-ms {SWEEP_MS} --msg-rate 100000 --http-rate 100000 --max-sockets-per-address 1000000`, other limits at their defaults: rooms of {room_size} stay within `--max-members`); the load generator is one `HostView` per client over tokio-tungstenite (TCP_NODELAY, like browsers), {HANDSHAKES} handshakes at a time, hosts pipelining up to {PIPELINE} commands"
    ));
    notes.push(format!(
        "fan-out: every event is a host command accepted by the server (one SQLite commit with fsync each) and broadcast to the room; the baseline sends the same event frames (re-encoded with the same codec, same sizes) from one publisher connection per room to the same number of `HostView` clients; command failures during fan-out: {failures}"
    ));
    notes.push(format!(
        "{total} clients are {n_rooms} rooms × {small}: every join gets a snapshot listing every member and is announced to the room (at most one presence frame per room per 100 ms, `--presence-ms`), so {total} clients in rooms of {room_size} would cost about {}× the snapshot bytes of rooms of {small}",
        room_size / small
    ));
    let lapsed = std::fs::read_to_string(d.join("server-1.log"))
        .map(|l| l.matches("reason=\"lease_lapsed\"").count())
        .unwrap_or(0)
        .saturating_sub(silent.since_renewal.len());
    let redispatched: usize = fan1.iter().chain(&fan_n).map(|f| f.redispatched).sum();
    notes.push(format!(
        "leases that lapsed under load on the first server process (silent-loss rounds excluded; their hosts were connected and answering probes): {lapsed}; fan-out runs whose remaining events went to a new host: {redispatched}"
    ));
    notes.push(format!(
        "joins (hello to live): {room_size} clients into one room in {join1_s:.1} s; {total} clients into {n_rooms} rooms in {join_s:.1} s"
    ));
    notes.push(format!(
        "RLIMIT_NOFILE raised to {nofile}; total wall time {:.0} s; SQLite files in {}",
        started.elapsed().as_secs_f64(),
        env!("CARGO_TARGET_TMPDIR")
    ));

    println!();
    println!("| benchmark | hostlease-server | baseline (same run) | ratio | goal |");
    println!("|---|---|---|---:|---|");
    for r in &rows {
        println!("{r}");
    }
    println!();
    for n in &notes {
        println!("- {n}");
    }
    if std::env::var_os("HOSTLEASE_BENCH_KEEP").is_some() {
        eprintln!("[load] kept {}", dir.keep().display());
    }
}
