//! `hostlease-server`: `serve`, `keygen`, `token`.

use std::path::PathBuf;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use hostlease::protocol::{ParticipantId, PublicKey, RoomId};
use hostlease_server::store::SqliteStore;
use hostlease_server::tokens::{JoinClaims, Keypair, Verifier, JOIN_PREFIX};
use hostlease_server::{App, Config};

#[derive(Parser)]
#[command(
    name = "hostlease-server",
    version,
    about = "The reference hostlease authority"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the server.
    Serve(Box<ServeArgs>),
    /// Generate an Ed25519 key file (`{kid, secret}`) and print its public key.
    Keygen {
        /// Where to write the key file.
        #[arg(long, default_value = "./data/app-key.json")]
        out: PathBuf,
        #[arg(long, default_value = "app")]
        kid_prefix: String,
    },
    /// Mint a join token with an app key file (what the app backend does).
    Token {
        #[arg(long, env = "HOSTLEASE_APP_KEY", default_value = "./data/app-key.json")]
        key: PathBuf,
        #[arg(long)]
        room: String,
        #[arg(long)]
        participant: String,
        /// Lifetime in seconds (1 s to 10 years).
        #[arg(long, default_value_t = 3600, value_parser = clap::value_parser!(u64).range(1..=315_360_000))]
        ttl: u64,
        #[arg(long, default_value = "")]
        name: String,
        #[arg(long)]
        may_host: bool,
    },
}

#[derive(clap::Args)]
struct ServeArgs {
    #[arg(
        long,
        env = "HOSTLEASE_DB",
        default_value = "sqlite://./data/hostlease.db"
    )]
    db: String,
    #[arg(long, env = "HOSTLEASE_LISTEN", default_value = "127.0.0.1:7700")]
    listen: String,
    /// Static files to serve (the demo).
    #[arg(long, env = "HOSTLEASE_WWW")]
    www: Option<PathBuf>,
    /// Development mode: adds `POST /dev/token` (mints join tokens). Never in production.
    #[arg(long, env = "HOSTLEASE_DEV")]
    dev: bool,
    /// The server's signing key file (created if missing).
    #[arg(
        long,
        env = "HOSTLEASE_SERVER_KEY",
        default_value = "./data/server-key.json"
    )]
    server_key: PathBuf,
    /// App backend public keys that sign join tokens, as `kid:x` (base64url); repeatable.
    #[arg(
        long = "app-public-key",
        env = "HOSTLEASE_APP_PUBLIC_KEYS",
        value_delimiter = ','
    )]
    app_public_keys: Vec<String>,
    /// An app key file whose public half verifies join tokens (alternative to the above).
    #[arg(long, env = "HOSTLEASE_APP_KEY")]
    app_key: Option<PathBuf>,
    /// Bearer key of the admin API (admin API disabled when unset).
    #[arg(long, env = "HOSTLEASE_ADMIN_KEY", hide_env_values = true)]
    admin_key: Option<String>,
    /// POST every committed item to this `http://` URL (durable notification).
    #[arg(long, env = "HOSTLEASE_WEBHOOK_URL", hide_env_values = true)]
    webhook_url: Option<String>,
    /// HMAC-SHA256 key of the webhook's `X-Hostlease-Signature` header.
    #[arg(long, env = "HOSTLEASE_WEBHOOK_SECRET", hide_env_values = true)]
    webhook_secret: Option<String>,
    /// Host lease TTL in milliseconds (1 s..24 h, as the admin API's per-room TTL).
    #[arg(long, env = "HOSTLEASE_LEASE_MS", default_value_t = 6000,
          value_parser = clap::value_parser!(u64).range(hostlease_server::LEASE_MS))]
    lease_ms: u64,
    /// Lease sweeper / publisher poll interval in milliseconds.
    #[arg(long, env = "HOSTLEASE_SWEEP_MS", default_value_t = 100)]
    sweep_ms: u64,
    /// At most one presence frame per room per this many milliseconds (changes in between go
    /// out together; 0: one frame per change).
    #[arg(long, env = "HOSTLEASE_PRESENCE_MS", default_value_t = 100)]
    presence_ms: u64,
    /// Host-only actions (comma-separated).
    #[arg(
        long,
        env = "HOSTLEASE_HOST_ACTIONS",
        value_delimiter = ',',
        default_value = "poll.open,poll.close"
    )]
    host_actions: Vec<String>,
    /// Participant actions (comma-separated).
    #[arg(
        long,
        env = "HOSTLEASE_PARTICIPANT_ACTIONS",
        value_delimiter = ',',
        default_value = "vote"
    )]
    participant_actions: Vec<String>,
    /// Rooms open on this process (at least 1: 0 refused every join and every HTTP call).
    #[arg(long, env = "HOSTLEASE_MAX_ROOMS", default_value_t = 10_000,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    max_rooms: usize,
    /// Members of one room (at least 1).
    #[arg(long, env = "HOSTLEASE_MAX_MEMBERS", default_value_t = 1000,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    max_members: usize,
    /// Connections to this process in all (at least 1: 0 closed every connection, `/healthz`'s
    /// too).
    #[arg(long, env = "HOSTLEASE_MAX_CONNECTIONS", default_value_t = 20_000,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    max_connections: usize,
    /// Open WebSockets per client address (an IPv6 client counts by its /64); one more is
    /// refused `too_many_connections`. Plain HTTP connections are capped apart at as many per
    /// address (and `--max-connections` in all); one more is closed as accepted. Behind a proxy
    /// or a large NAT, raise it.
    #[arg(long, env = "HOSTLEASE_MAX_SOCKETS_PER_ADDRESS", default_value_t = 1000,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    max_sockets_per_address: usize,
    /// Accept backlog: connections the kernel queues until they are accepted (capped by
    /// `net.core.somaxconn`). Past it, a new connection's SYN is dropped and retried after 1 s.
    #[arg(long, env = "HOSTLEASE_LISTEN_BACKLOG", default_value_t = hostlease_server::LISTEN_BACKLOG)]
    listen_backlog: u32,
    /// Commands per second per participant in a room, its sessions together (burst is twice
    /// this): a command past it is refused `rate_limited` with a retry time; any frames past
    /// four times it on one connection close that connection.
    #[arg(long, env = "HOSTLEASE_MSG_RATE", default_value_t = 50.0)]
    msg_rate: f64,
    /// Payload bytes of participants' commands per second per room (burst is four times this):
    /// a command past it is refused `rate_limited` with a retry time; commands with a host
    /// capability are not charged.
    #[arg(long, env = "HOSTLEASE_ROOM_BYTES_RATE", default_value_t = 1024.0 * 1024.0)]
    room_bytes_rate: f64,
    /// Signal bytes a participant may have the server deliver per second in a room, each
    /// delivery counted (burst is eight times this): past it signals are dropped.
    #[arg(long, env = "HOSTLEASE_SIGNAL_BYTES_RATE", default_value_t = 128.0 * 1024.0)]
    signal_bytes_rate: f64,
    /// A session the server has sent nothing for this long gets a heartbeat, and one it has heard
    /// nothing from (not even the pong its browser sends for a ping) for three times this is
    /// given up (1000..=15000 ms: below a second, a client a slow round trip away would be given
    /// up while answering; the SDK presumes a server silent for 20 s gone).
    #[arg(long, env = "HOSTLEASE_HEARTBEAT_MS", default_value_t = hostlease::protocol::codec::HEARTBEAT_MS,
          value_parser = clap::value_parser!(u64).range(1000..=hostlease::protocol::codec::HEARTBEAT_MS))]
    heartbeat_ms: u64,
    /// HTTP requests per second per address (burst is twice this).
    #[arg(long, env = "HOSTLEASE_HTTP_RATE", default_value_t = 50.0)]
    http_rate: f64,
    /// Log as JSON lines.
    #[arg(long, env = "HOSTLEASE_LOG_JSON")]
    log_json: bool,
}

fn actions(v: &[String]) -> Result<Vec<hostlease::protocol::Action>, String> {
    v.iter()
        .filter(|s| !s.is_empty())
        .map(|s| {
            hostlease::protocol::Action::new(s.as_str()).map_err(|e| format!("action {s:?}: {e}"))
        })
        .collect()
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Serve(a) => serve(*a),
        Cmd::Keygen { out, kid_prefix } => keygen(out, &kid_prefix),
        Cmd::Token {
            key,
            room,
            participant,
            ttl,
            name,
            may_host,
        } => mint(key, room, participant, ttl, name, may_host),
    };
    match res {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn keygen(out: PathBuf, prefix: &str) -> Result<(), String> {
    if out.exists() {
        return Err(format!("{} exists; not overwriting", out.display()));
    }
    let k = Keypair::load_or_create(&out, prefix)?;
    let p = k.public();
    println!("wrote {}", out.display());
    println!(
        "public key (pass to serve --app-public-key): {}:{}",
        p.kid, p.x
    );
    Ok(())
}

fn mint(
    key: PathBuf,
    room: String,
    participant: String,
    ttl: u64,
    name: String,
    may_host: bool,
) -> Result<(), String> {
    let k = Keypair::load(&key)?;
    let claims = JoinClaims {
        room: RoomId::new(room).map_err(|e| e.to_string())?,
        sub: ParticipantId::new(participant).map_err(|e| e.to_string())?,
        name,
        may_host,
        exp: hostlease_server::tokens::now_ms() + ttl * 1000,
        kid: k.kid.clone(),
    };
    println!("{}", k.sign_token(JOIN_PREFIX, &claims));
    Ok(())
}

fn serve(a: ServeArgs) -> Result<(), String> {
    // Not a number, 0 or less would refuse every participant command (or none at all); a
    // burst below one command or request would refuse every one of them, and a flood
    // bucket below one frame (four times the command rate) would close every session.
    for (flag, rate, unit, least) in [
        ("--room-bytes-rate", a.room_bytes_rate, "bytes", 1.0),
        ("--signal-bytes-rate", a.signal_bytes_rate, "bytes", 1.0),
        ("--msg-rate", a.msg_rate, "commands", 0.5),
        ("--http-rate", a.http_rate, "requests", 0.5),
    ] {
        if !(rate >= least && rate.is_finite()) {
            return Err(format!(
                "{flag} must be a number of {unit} per second, at least {least}"
            ));
        }
    }
    let cfg = Config {
        lease_ms: a.lease_ms,
        actions: hostlease::protocol::ActionTable {
            host: actions(&a.host_actions)?,
            participant: actions(&a.participant_actions)?,
        },
        max_rooms: a.max_rooms,
        max_members: a.max_members,
        max_connections: a.max_connections,
        max_sockets_per_address: a.max_sockets_per_address,
        msg_rate: a.msg_rate,
        msg_burst: a.msg_rate * 2.0,
        room_bytes_rate: a.room_bytes_rate,
        room_bytes_burst: a.room_bytes_rate * 4.0,
        signal_bytes_rate: a.signal_bytes_rate,
        signal_bytes_burst: a.signal_bytes_rate * 8.0,
        http_rate: a.http_rate,
        http_burst: a.http_rate * 2.0,
        sweep_ms: a.sweep_ms,
        presence_ms: a.presence_ms,
        heartbeat_ms: a.heartbeat_ms,
        admin_key: a.admin_key,
        webhook_url: a.webhook_url,
        webhook_secret: a.webhook_secret,
        dev: a.dev,
        www: a.www,
        ..Config::default()
    };
    // The webhook, the admin key and the limits too: before the keys are read or anything is
    // created.
    cfg.check()?;
    // The WebSocket library logs every frame it reads or writes in full at `trace` (a hello's
    // join token, every command's capability): it is held at `debug` whatever RUST_LOG says, so
    // that no token reaches a log. (A directive added to RUST_LOG's did not hold it: a more
    // specific one, `tungstenite::protocol=trace`, wins over it.)
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let no_frames = tracing_subscriber::filter::filter_fn(|m| {
        *m.level() <= tracing::Level::DEBUG
            || !(m.target().starts_with("tungstenite")
                || m.target().starts_with("tokio_tungstenite"))
    });
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if a.log_json {
        fmt.json().finish().with(no_frames).init();
    } else {
        fmt.with_ansi(false).finish().with(no_frames).init();
    }
    let rt = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    rt.block_on(async move {
        // The keys first: a server that could take no join token stops before it creates a
        // database or a key file.
        let mut join_keys = Verifier::default();
        for s in &a.app_public_keys {
            // The key is the part after the last `:` (a kid may hold `:`, base64url never).
            let (kid, x) = s.rsplit_once(':').ok_or("app public key must be kid:x")?;
            join_keys.add(&PublicKey {
                kid: hostlease::protocol::KeyId::new(kid).map_err(|e| e.to_string())?,
                alg: "Ed25519".into(),
                x: x.to_string(),
            })?;
        }
        if let Some(p) = &a.app_key {
            join_keys.add(&Keypair::load(p)?.public())?;
        }
        let dev_key = if a.dev {
            let k = Keypair::generate_random_kid("dev")?;
            join_keys.add(&k.public())?;
            tracing::warn!("DEV MODE IS ON: POST /dev/token mints join tokens for anyone. Never run this in production.");
            Some(k)
        } else {
            None
        };
        if join_keys.is_empty() {
            // It would refuse every join: say so now rather than `unauthorized` to every client.
            return Err("no key to verify join tokens with: pass --app-key <file> (from `keygen`), \
                        --app-public-key kid:x, or --dev"
                .into());
        }
        let store = SqliteStore::open(&a.db).await.map_err(|e| e.to_string())?;
        let keys = Keypair::load_or_create(&a.server_key, "srv")?;
        let app = App::new(cfg, Arc::new(store), keys, join_keys, dev_key);
        let listener = hostlease_server::listen(&a.listen, a.listen_backlog)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", a.listen))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        // The handlers are in place before anyone is told the port: a SIGTERM sent as soon as
        // "listening" is read is a graceful shutdown, not the default action's kill.
        use tokio::signal::unix::{signal, SignalKind};
        let handler = |kind| signal(kind).map_err(|e| format!("signal handler: {e}"));
        let (mut int, mut term) = (
            handler(SignalKind::interrupt())?,
            handler(SignalKind::terminate())?,
        );
        tracing::info!(%addr, "listening");
        // Tests and supervisors read this line to find the port.
        println!("listening on {addr}");
        let app2 = app.clone();
        let shutdown = async move {
            tokio::select! { _ = int.recv() => {}, _ = term.recv() => {} }
            tracing::info!("shutting down");
            app2.shutdown.send_replace(true);
        };
        hostlease_server::serve(app, listener, shutdown).await.map_err(|e| e.to_string())
    })
}
