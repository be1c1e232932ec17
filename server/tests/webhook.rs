//! Durable notification by webhook: signed, retried with backoff, same idempotency key.

mod common;

use std::sync::{Arc, Mutex};

use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use common::*;
use hostlease::protocol::Item;

#[tokio::test]
async fn webhook_is_signed_retried_and_keyed_by_the_outbox_dedup_key() {
    type Seen = Arc<Mutex<Vec<(String, String, String)>>>;
    let seen: Seen = Arc::default();
    let s2 = seen.clone();
    // A receiver that redirects the first delivery of each key elsewhere (where a GET or a POST
    // would be answered 2xx), fails the second, and accepts the third. A redirect is a failure:
    // followed, a 303 turned the POST into a GET without its body, whose 2xx marked the item
    // delivered.
    let followed = Arc::new(Mutex::new(0));
    let f2 = followed.clone();
    let elsewhere = move || {
        let followed = f2.clone();
        async move {
            *followed.lock().unwrap() += 1;
            StatusCode::NO_CONTENT
        }
    };
    let receiver = axum::Router::new()
        .route(
            "/elsewhere",
            axum::routing::get(elsewhere.clone()).post(elsewhere),
        )
        .route(
            "/hook",
            axum::routing::post(move |headers: HeaderMap, body: String| {
                let seen = s2.clone();
                async move {
                    let h = |n: &str| {
                        headers
                            .get(n)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_string()
                    };
                    let key = h("idempotency-key");
                    let mut v = seen.lock().unwrap();
                    let before = v.iter().filter(|(k, _, _)| *k == key).count();
                    v.push((key, h("x-hostlease-signature"), body));
                    match before {
                        0 => (StatusCode::SEE_OTHER, [("location", "/elsewhere")]).into_response(),
                        1 => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
                        _ => StatusCode::NO_CONTENT.into_response(),
                    }
                }
            }),
        );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, receiver).await.unwrap() });

    let cfg = hostlease_server::Config {
        webhook_url: Some(format!("http://{hook}/hook")),
        webhook_secret: Some("shh-0123456789abcdef".into()),
        ..test_config()
    };
    let srv = start(cfg).await;
    let mut a = Sdk::join(
        srv.addr,
        "wh",
        join_token(&srv.app_key, "wh", "alice", true),
    )
    .await;
    a.pump_until("alice host", |s| s.has_authority()).await;

    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        {
            let v = seen.lock().unwrap();
            if v.iter().filter(|(k, _, _)| k == "assignment:wh:1").count() >= 3 {
                break;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "webhook never retried"
        );
        a.pump(std::time::Duration::from_millis(50)).await;
    }
    let v = seen.lock().unwrap().clone();
    for (key, sig, body) in v.iter().filter(|(k, _, _)| k == "assignment:wh:1") {
        assert_eq!(
            sig,
            &hostlease_server::webhook::signature(b"shh-0123456789abcdef", body.as_bytes()),
            "{key}"
        );
        let item: Item = hostlease::protocol::codec::decode_body(body, usize::MAX).unwrap();
        match item {
            Item::Assignment(x) => assert_eq!(x.assignment.host.unwrap().as_str(), "alice"),
            other => panic!("{other:?}"),
        }
    }
    // Delivered once accepted: no third attempt for that key.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let n = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|(k, _, _)| k == "assignment:wh:1")
        .count();
    assert_eq!(n, 3);
    assert_eq!(*followed.lock().unwrap(), 0, "a redirect was followed");
}

/// A server embedded with a webhook (`App::new` and `serve`, without the CLI) keeps an
/// undelivered outbox row past the hour after which rows without a webhook go: housekeeping asked
/// a flag of the store that only the CLI set, and lost the rows a receiver down for an hour had
/// not got.
#[tokio::test]
async fn an_embedded_server_keeps_undelivered_rows_for_its_webhook() {
    let receiver = axum::Router::new().route(
        "/hook",
        axum::routing::post(|| async { StatusCode::INTERNAL_SERVER_ERROR }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, receiver).await.unwrap() });
    // Housekeeping every 600 sweeps: 3 s.
    let srv = start(hostlease_server::Config {
        webhook_url: Some(format!("http://{hook}/hook")),
        webhook_secret: Some("shh-0123456789abcdef".into()),
        sweep_ms: 5,
        ..test_config()
    })
    .await;
    let db = srv.db().await;
    let count = |q: &str| {
        let (db, q) = (db.clone(), q.to_string());
        async move {
            sqlx::query_scalar::<_, i64>(&q)
                .fetch_one(&db)
                .await
                .unwrap()
        }
    };
    let mut a = Sdk::join(
        srv.addr,
        "kw",
        join_token(&srv.app_key, "kw", "alice", true),
    )
    .await;
    a.pump_until("alice host", |s| s.has_authority()).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    while count("SELECT COUNT(*) FROM outbox WHERE notified_at IS NOT NULL").await == 0 {
        assert!(tokio::time::Instant::now() < deadline, "never notified");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // (`NOW`, the store clock, is a function of the store's own connections.)
    let now = hostlease_server::store::Store::clock_ms(&*srv.app.store);
    // Every row two hours old, never delivered; and an idempotency record past its retention,
    // whose going says that housekeeping ran.
    sqlx::query(&format!(
        "UPDATE outbox SET created_at = {now} - 2 * 3600000"
    ))
    .execute(&db)
    .await
    .unwrap();
    sqlx::query(&format!(
        "INSERT INTO idempotency (room, sub, key, request_hash, outcome, created_at) \
         VALUES ('kw', 'x', 'old', '', '', {now} - 49 * 3600000)"
    ))
    .execute(&db)
    .await
    .unwrap();
    let aged = format!("SELECT COUNT(*) FROM outbox WHERE created_at < {now} - 3600000");
    assert!(count(&aged).await > 0);
    let deadline = tokio::time::Instant::now() + WAIT;
    while count("SELECT COUNT(*) FROM idempotency WHERE key = 'old'").await > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "housekeeping never ran"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(count(&aged).await > 0, "the undelivered rows went");
    assert_eq!(
        count("SELECT COUNT(*) FROM outbox WHERE webhook_done_at IS NOT NULL").await,
        0
    );
}

/// The webhook worker sends a backlog of more than one batch (64 rows) batch after batch while
/// every delivery succeeds, not one batch per pause (which capped delivery at 64 rows per pause:
/// 160 rows/s at the default sweep). Here its pause is 2 s and the backlog seven batches: it is
/// sent with the first pause and the one after the last batch (a few more only if this test
/// polls seconds late), where a pause per batch made seven.
#[tokio::test]
async fn a_webhook_backlog_past_one_batch_is_sent_without_pausing_between_batches() {
    let arrived: Arc<std::sync::atomic::AtomicUsize> = Arc::default();
    let a2 = arrived.clone();
    let receiver = axum::Router::new().route(
        "/hook",
        axum::routing::post(move || {
            let arrived = a2.clone();
            async move {
                arrived.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                StatusCode::NO_CONTENT
            }
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, receiver).await.unwrap() });
    let (dir, store) = fresh_store().await;
    backlog(&store, "wb", 400).await;
    let srv = start_on(
        hostlease_server::Config {
            webhook_url: Some(format!("http://{hook}/hook")),
            webhook_secret: Some("shh-0123456789abcdef".into()),
            sweep_ms: 1000,
            ..test_config()
        },
        dir,
        store,
    )
    .await;
    let deadline = tokio::time::Instant::now() + WAIT;
    let sent = || arrived.load(std::sync::atomic::Ordering::Relaxed);
    while sent() < 400 {
        assert!(tokio::time::Instant::now() < deadline, "backlog never sent");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let pauses = srv
        .app
        .pauses
        .webhook
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(sent(), 400, "each row once");
    assert!(pauses < 7, "{pauses} pauses for seven batches");
}

/// A webhook URL this build cannot deliver to (`https://`: no TLS here; not a URL) is refused
/// when the server starts, not by failing every delivery later; the URL is not echoed. So is a
/// webhook without a signing key of 16 bytes or more (its signatures anyone could compute).
#[test]
fn a_webhook_url_it_cannot_deliver_to_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let ok_url = "http://127.0.0.1:9/hook?secret=s3cr3t";
    let secret = "0123456789abcdef";
    for (url, secret, says) in [
        (
            "https://hooks.invalid/x?secret=s3cr3t",
            secret,
            "--webhook-url must be an http:// URL",
        ),
        ("not a url", secret, "--webhook-url must be an http:// URL"),
        ("http://", secret, "--webhook-url must be an http:// URL"),
        (ok_url, "", "--webhook-url needs --webhook-secret"),
        (ok_url, "short", "--webhook-url needs --webhook-secret"),
    ] {
        let err = refused_at_start(
            std::process::Command::new(env!("CARGO_BIN_EXE_hostlease-server"))
                .args([
                    "serve",
                    "--db",
                    "sqlite::memory:",
                    "--listen",
                    "127.0.0.1:0",
                ])
                .args(["--server-key", dir.path().join("k.json").to_str().unwrap()])
                .args(["--webhook-url", url])
                .args(
                    (!secret.is_empty())
                        .then_some(["--webhook-secret", secret])
                        .into_iter()
                        .flatten(),
                ),
        );
        assert!(err.contains(says), "{url}: {err}");
        assert!(!err.contains("s3cr3t"), "{err}");
    }
}

/// A server embedded with `App::new` and `serve` is checked as the CLI's is: a webhook without a
/// secret of 16 bytes (anyone could sign its deliveries), or any limit that breaks every session,
/// and `serve` returns at once with why (it started, and signed with a guessable key).
#[tokio::test]
async fn an_embedded_server_is_checked_as_the_cli_is() {
    use hostlease_server::{
        store::SqliteStore,
        tokens::{Keypair, Verifier},
        App,
    };
    let dir = tempfile::tempdir().unwrap();
    for (cfg, says) in [
        (
            hostlease_server::Config {
                webhook_url: Some("http://127.0.0.1:9/hook".into()),
                webhook_secret: Some("shh".into()),
                ..test_config()
            },
            "--webhook-secret of 16 bytes",
        ),
        (
            hostlease_server::Config {
                max_members: 0,
                ..test_config()
            },
            "max_members must be at least 1",
        ),
    ] {
        let db = format!("sqlite://{}", dir.path().join("e.db").display());
        let store = SqliteStore::open(&db).await.unwrap();
        let join = Verifier::from_keys(&[Keypair::generate("app").public()]).unwrap();
        let app = App::new(
            cfg,
            std::sync::Arc::new(store),
            Keypair::generate("srv"),
            join,
            None,
        );
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let err = hostlease_server::serve(app, l, std::future::pending())
            .await
            .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
        assert!(err.to_string().contains(says), "{err}");
    }
}
