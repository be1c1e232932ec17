//! Test harness: a real server on loopback (in-process or as a child process), raw-protocol
//! clients, and the SDK's `HostView` driven natively over a real WebSocket.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use hostlease::core::{Config as ViewConfig, Event, HostView, Instant};
use hostlease::protocol::{
    codec::{decode_server, encode_client},
    ClientMsg, ParticipantId, RoomId, ServerMsg, Token,
};
use hostlease_server::store::SqliteStore;
use hostlease_server::tokens::{JoinClaims, Keypair, Verifier, JOIN_PREFIX};
use hostlease_server::{App, Config};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

pub const WAIT: Duration = Duration::from_secs(15);

pub struct TestServer {
    pub addr: SocketAddr,
    pub app: Arc<App>,
    pub app_key: Keypair,
    pub dir: tempfile::TempDir,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub fn test_config() -> Config {
    Config {
        lease_ms: 1500,
        sweep_ms: 20,
        admin_key: Some("admin-secret-key-1234".into()),
        ..Config::default()
    }
}

pub async fn start(cfg: Config) -> TestServer {
    start_with(cfg, |_| {}).await
}

/// [`start`] with the store set up by `setup` first.
pub async fn start_with(cfg: Config, setup: impl FnOnce(&mut SqliteStore)) -> TestServer {
    let (dir, mut store) = fresh_store().await;
    setup(&mut store);
    start_on(cfg, dir, store).await
}

/// A store on a fresh file (`h.db` in the directory), for [`start_on`].
pub async fn fresh_store() -> (tempfile::TempDir, SqliteStore) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = format!("sqlite://{}", dir.path().join("h.db").display());
    let store = SqliteStore::open(&db).await.expect("open store");
    (dir, store)
}

/// `n` outbox rows in `room` (as many elections, each over the one before), committed before a
/// server runs: a backlog for the background tasks that work the outbox off.
pub async fn backlog(store: &SqliteStore, room: &str, n: u64) {
    use hostlease::protocol::{Epoch, Reason, SessionId};
    use hostlease_server::store::{GrantOutcome, GrantReq, Store};
    let keys = Keypair::generate("backlog");
    for epoch in 0..n {
        let grant = GrantReq {
            room: RoomId::new(room).unwrap(),
            expected_epoch: Epoch(epoch),
            holder: Some((
                ParticipantId::new("gone").unwrap(),
                SessionId::new(format!("s{epoch}")).unwrap(),
            )),
            lease_ms: 60_000,
            reason: Reason::Elected,
            require_lapsed: false,
            close: false,
        };
        let won = store.grant(grant, &keys).await.expect("grant");
        assert!(matches!(won, GrantOutcome::Won { .. }), "{won:?}");
    }
}

/// A server on `store` (from [`fresh_store`], set up beforehand).
pub async fn start_on(cfg: Config, dir: tempfile::TempDir, store: SqliteStore) -> TestServer {
    let app_key = Keypair::generate("app-1");
    let join = Verifier::from_keys(&[app_key.public()]).expect("verifier");
    // With `dev`, `/dev/token` signs with the app key.
    let dev_key = cfg.dev.then(|| app_key.clone());
    let app = App::new(
        cfg,
        Arc::new(store),
        Keypair::generate("srv-1"),
        join,
        dev_key,
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let a = app.clone();
    let task = tokio::spawn(async move {
        let _ = hostlease_server::serve(a, listener, std::future::pending()).await;
    });
    TestServer {
        addr,
        app,
        app_key,
        dir,
        task,
    }
}

impl TestServer {
    /// A raw-protocol client joined to `room` as `p` with a join token from the app key.
    pub async fn raw(&self, room: &str, p: &str, may_host: bool) -> Raw {
        Raw::join(
            self.addr,
            room,
            &join_token(&self.app_key, room, p, may_host),
            None,
        )
        .await
    }

    /// A pool of the server's database (another connection to its file).
    pub async fn db(&self) -> sqlx::SqlitePool {
        let url = format!("sqlite://{}", self.dir.path().join("h.db").display());
        sqlx::SqlitePool::connect(&url)
            .await
            .expect("the server's database")
    }

    /// The server's Prometheus page.
    pub async fn metrics(&self) -> String {
        reqwest::get(format!("http://{}/metrics", self.addr))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }
}

pub fn join_token(key: &Keypair, room: &str, p: &str, may_host: bool) -> Token {
    let claims = JoinClaims {
        room: RoomId::new(room).unwrap(),
        sub: ParticipantId::new(p).unwrap(),
        name: p.to_string(),
        may_host,
        exp: hostlease_server::tokens::now_ms() + 3_600_000,
        kid: key.kid.clone(),
    };
    Token::new(key.sign_token(JOIN_PREFIX, &claims))
}

pub type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

pub async fn connect(addr: SocketAddr, room: &str) -> Ws {
    let url = format!("ws://{addr}/v1/rooms/{room}/ws");
    let (ws, _) = tokio_tungstenite::connect_async(url)
        .await
        .expect("connect");
    ws
}

/// A client that speaks the raw protocol and bypasses every SDK refusal.
pub struct Raw {
    pub ws: Ws,
    pub seen: Vec<ServerMsg>,
    /// Every token this client received (for the log scan).
    pub tokens: Vec<String>,
}

impl Raw {
    pub async fn join(addr: SocketAddr, room: &str, token: &Token, resume: Option<u64>) -> Raw {
        Raw::hello(connect(addr, room).await, token, resume).await
    }

    /// Sends the hello on `ws`, a socket opened before.
    pub async fn hello(ws: Ws, token: &Token, resume: Option<u64>) -> Raw {
        let mut r = Raw {
            ws,
            seen: Vec::new(),
            tokens: vec![token.expose().to_string()],
        };
        r.send(&ClientMsg::Hello {
            token: token.clone(),
            resume: resume.map(hostlease::protocol::Seq),
            epoch_seen: None,
        })
        .await;
        r
    }

    /// The newest host capability this client was given: its epoch and token.
    pub fn host_capability(&self) -> Option<(Option<hostlease::protocol::Epoch>, Token)> {
        self.seen.iter().rev().find_map(|m| match m {
            ServerMsg::Capability {
                role: hostlease::protocol::Role::Host,
                epoch,
                token,
                ..
            } => Some((*epoch, token.clone())),
            _ => None,
        })
    }

    /// Sends `host.resign` (idempotency key `bye`) with `capability`, a host capability of
    /// `epoch`.
    pub async fn send_resign(
        &mut self,
        epoch: Option<hostlease::protocol::Epoch>,
        capability: Token,
    ) {
        self.send(&ClientMsg::Command {
            id: hostlease::protocol::IdempotencyKey::new("bye").unwrap(),
            action: hostlease::protocol::Action::new("host.resign").unwrap(),
            payload: hostlease::protocol::json::Json::null(),
            epoch,
            capability,
            after: None,
        })
        .await;
    }

    pub async fn send(&mut self, m: &ClientMsg) {
        self.ws
            .send(Message::Text(encode_client(m).into()))
            .await
            .expect("send");
    }

    pub async fn send_text(&mut self, t: String) -> bool {
        self.ws.send(Message::Text(t.into())).await.is_ok()
    }

    /// The next server frame, `None` on close or timeout.
    pub async fn next(&mut self, within: Duration) -> Option<ServerMsg> {
        loop {
            let m = tokio::time::timeout(within, self.ws.next()).await.ok()??;
            match m {
                Ok(Message::Text(t)) => {
                    let msg = decode_server(t.as_str()).expect("server frame decodes");
                    if let ServerMsg::Capability { token, .. } = &msg {
                        self.tokens.push(token.expose().to_string());
                    }
                    self.seen.push(msg.clone());
                    return Some(msg);
                }
                Ok(Message::Close(_)) | Err(_) => return None,
                Ok(_) => continue,
            }
        }
    }

    /// Reads until `pred` matches (returning the match); panics after `WAIT`.
    pub async fn until<T>(&mut self, mut pred: impl FnMut(&ServerMsg) -> Option<T>) -> T {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let m = self.next(left).await.expect("frame before timeout");
            if let Some(t) = pred(&m) {
                return t;
            }
        }
    }

    /// Answers lease probes until a host capability arrives (the server grants host authority
    /// once the first probe is answered).
    pub async fn until_host(&mut self) {
        loop {
            match self
                .next(WAIT)
                .await
                .expect("a frame before the host capability")
            {
                ServerMsg::LeaseProbe { nonce, .. } => {
                    self.send(&ClientMsg::LeaseEcho { nonce }).await
                }
                ServerMsg::Capability {
                    role: hostlease::protocol::Role::Host,
                    ..
                } => return,
                _ => {}
            }
        }
    }

    /// Reads until a capability (of either role) arrives: the session is in the room.
    pub async fn until_capability(&mut self) {
        self.until(|m| matches!(m, ServerMsg::Capability { .. }).then_some(()))
            .await
    }

    /// Reads until a participant capability arrives.
    pub async fn participant_token(&mut self) -> Token {
        self.until(|m| match m {
            ServerMsg::Capability {
                role: hostlease::protocol::Role::Participant,
                token,
                ..
            } => Some(token.clone()),
            _ => None,
        })
        .await
    }

    /// Reads until the connection closes; returns the error code of the last error frame.
    pub async fn until_closed(&mut self) -> Option<hostlease::protocol::ErrorCode> {
        let mut code = None;
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                panic!("connection did not close");
            }
            match self.next(left).await {
                Some(ServerMsg::Error { code: c, .. }) => code = Some(c),
                Some(_) => {}
                None => return code,
            }
        }
    }
}

/// The SDK core driven natively over a real WebSocket.
pub struct Sdk {
    pub view: HostView,
    pub ws: Ws,
    pub events: Vec<Event>,
    pub tokens: Vec<String>,
    start: std::time::Instant,
    /// Ignore lease probes (simulates a frozen host whose socket stays open).
    pub deaf: bool,
}

impl Sdk {
    pub async fn join(addr: SocketAddr, room: &str, token: Token) -> Sdk {
        let ws = connect(addr, room).await;
        let mut s = Sdk {
            view: HostView::new(ViewConfig {
                lease_margin_ms: 100,
                ..ViewConfig::default()
            }),
            ws,
            events: Vec::new(),
            tokens: vec![token.expose().to_string()],
            start: std::time::Instant::now(),
            deaf: false,
        };
        let now = s.now();
        s.view.handle_connected(now, token);
        s.flush().await;
        s
    }

    pub fn now(&self) -> Instant {
        Instant::from_millis(self.start.elapsed().as_millis() as u64)
    }

    pub async fn flush(&mut self) {
        while let Some(m) = self.view.poll_transmit() {
            if self.deaf && matches!(m, ClientMsg::LeaseEcho { .. }) {
                continue;
            }
            let _ = self.ws.send(Message::Text(encode_client(&m).into())).await;
        }
        while let Some(e) = self.view.poll_event() {
            self.events.push(e);
        }
    }

    /// Drives the view for at most `d`.
    pub async fn pump(&mut self, d: Duration) {
        let deadline = tokio::time::Instant::now() + d;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return;
            }
            let step = left.min(Duration::from_millis(20));
            match tokio::time::timeout(step, self.ws.next()).await {
                Ok(Some(Ok(Message::Text(t)))) => {
                    let msg = decode_server(t.as_str()).expect("server frame decodes");
                    if let ServerMsg::Capability { token, .. } = &msg {
                        self.tokens.push(token.expose().to_string());
                    }
                    let now = self.now();
                    self.view.handle_server(now, msg);
                }
                Ok(Some(Ok(_))) => {}
                Ok(Some(Err(_))) | Ok(None) => {
                    let now = self.now();
                    self.view.handle_disconnected(now);
                    self.flush().await;
                    return;
                }
                Err(_) => {}
            }
            let now = self.now();
            self.view.handle_timeout(now);
            self.flush().await;
        }
    }

    /// Drives the view until `cond` holds; panics after `WAIT`.
    pub async fn pump_until(&mut self, what: &str, mut cond: impl FnMut(&Sdk) -> bool) {
        let deadline = tokio::time::Instant::now() + WAIT;
        while !cond(self) {
            if tokio::time::Instant::now() > deadline {
                panic!("timed out waiting for: {what}");
            }
            self.pump(Duration::from_millis(20)).await;
        }
    }

    pub fn has_authority(&self) -> bool {
        self.view.has_authority(self.now())
    }

    pub async fn leave(&mut self) {
        let now = self.now();
        self.view.leave(now);
        self.flush().await;
        let _ = self.ws.close(None).await;
    }
}

/// Kicks `p` from `room` through the admin API of the server at `addr`: how many sessions that
/// server closed (the `kicked` of its answer).
pub async fn kick(addr: SocketAddr, room: &str, p: &str) -> u64 {
    let body = admin_post(addr, room, "kick", serde_json::json!({ "participant": p })).await;
    body["kicked"].as_u64().expect("a count of kicked sessions")
}

/// `POST /v1/admin/rooms/{room}/{action}` with `body` to the server at `addr`, with the admin
/// key; answered 200 with JSON, which it returns.
pub async fn admin_post(
    addr: SocketAddr,
    room: &str,
    action: &str,
    body: serde_json::Value,
) -> serde_json::Value {
    let r = reqwest::Client::new()
        .post(format!("http://{addr}/v1/admin/rooms/{room}/{action}"))
        .bearer_auth("admin-secret-key-1234")
        .json(&body)
        .send()
        .await
        .expect("the admin request is answered");
    assert_eq!(r.status(), 200, "{action} {room}");
    r.json().await.expect("a JSON answer")
}

/// Drives several SDK clients together until `cond` holds over all of them.
pub async fn pump_all(
    what: &str,
    clients: &mut [&mut Sdk],
    mut cond: impl FnMut(&[&mut Sdk]) -> bool,
) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !cond(clients) {
        if tokio::time::Instant::now() > deadline {
            panic!("timed out waiting for: {what}");
        }
        for c in clients.iter_mut() {
            c.pump(Duration::from_millis(5)).await;
        }
    }
}

/// A server child process on `db`.
pub struct Proc {
    pub child: Child,
    pub addr: SocketAddr,
    pub log: PathBuf,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn spawn_proc(
    db: &str,
    dir: &std::path::Path,
    name: &str,
    lease_ms: u64,
    extra: &[&str],
) -> Proc {
    spawn_proc_logging(db, dir, name, lease_ms, extra, "debug")
}

/// [`spawn_proc`] with `RUST_LOG` set to `rust_log`.
pub fn spawn_proc_logging(
    db: &str,
    dir: &std::path::Path,
    name: &str,
    lease_ms: u64,
    extra: &[&str],
    rust_log: &str,
) -> Proc {
    let log = dir.join(format!("{name}.log"));
    let logf = std::fs::File::create(&log).expect("log file");
    let mut child = Command::new(env!("CARGO_BIN_EXE_hostlease-server"))
        .args([
            "serve",
            "--db",
            db,
            "--listen",
            "127.0.0.1:0",
            "--server-key",
            dir.join("server-key.json").to_str().unwrap(),
            "--app-key",
            dir.join("app-key.json").to_str().unwrap(),
            "--lease-ms",
            &lease_ms.to_string(),
            "--admin-key",
            "admin-secret-key-1234",
        ])
        // 20 ms unless the caller says otherwise (a flag given twice is refused).
        .args(if extra.contains(&"--sweep-ms") {
            &[][..]
        } else {
            &["--sweep-ms", "20"][..]
        })
        .args(extra)
        .env("RUST_LOG", rust_log)
        .stdout(Stdio::piped())
        .stderr(logf)
        .spawn()
        .expect("spawn server");
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
    let addr = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("server printed its address")
        .parse()
        .expect("address");
    Proc { child, addr, log }
}

/// Another connection to the SQLite file at `db` holding its write lock (`BEGIN IMMEDIATE`) until
/// `COMMIT` is sent on it: the store's writer cannot commit meanwhile.
pub async fn write_lock(db: &std::path::Path) -> sqlx::pool::PoolConnection<sqlx::Sqlite> {
    let url = format!("sqlite://{}", db.display());
    let other = sqlx::SqlitePool::connect(&url).await.unwrap();
    let mut lock = other.acquire().await.unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut *lock)
        .await
        .unwrap();
    lock
}

/// Creates the app key file the child processes verify join tokens with.
pub fn app_key_file(dir: &std::path::Path) -> Keypair {
    let p = dir.join("app-key.json");
    Keypair::load_or_create(&p, "app").expect("app key")
}

/// An HTTP response body of a protocol type, read with the protocol's own decoder.
#[allow(dead_code)]
pub trait ProtocolBody {
    async fn protocol<T: hostlease::protocol::json::FromJson>(self) -> T;
}

impl ProtocolBody for reqwest::Response {
    async fn protocol<T: hostlease::protocol::json::FromJson>(self) -> T {
        let text = self.text().await.expect("response body");
        hostlease::protocol::codec::decode_body(&text, usize::MAX).expect("a protocol body")
    }
}

/// Runs `serve` (`cmd`, expected to refuse to start) and returns what it wrote to stderr. A
/// server that starts anyway would serve on: it is killed after `WAIT` and the test fails.
#[track_caller]
pub fn refused_at_start(cmd: &mut std::process::Command) -> String {
    let mut child = cmd
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + WAIT;
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("the server started");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success(), "exit status {:?}", out.status);
    String::from_utf8_lossy(&out.stderr).into_owned()
}
