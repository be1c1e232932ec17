//! The admin API (each action is a grant like any other), racing triggers, the CLI and
//! graceful shutdown.

mod common;

use std::time::Duration;

use common::*;
use hostlease::core::Phase;
use hostlease::protocol::{Epoch, ErrorCode, Reason, RoomId, ServerMsg};
use hostlease_server::store::{GrantOutcome, GrantReq, Renewed};

#[tokio::test]
async fn admin_reassign_kick_and_close() {
    let srv = start(test_config()).await;
    let base = format!("http://{}/v1/admin/rooms/adm", srv.addr);
    let http = reqwest::Client::new();
    let mut a = Sdk::join(
        srv.addr,
        "adm",
        join_token(&srv.app_key, "adm", "alice", true),
    )
    .await;
    a.pump_until("alice host", |s| s.has_authority()).await;
    let mut b = Sdk::join(
        srv.addr,
        "adm",
        join_token(&srv.app_key, "adm", "bob", true),
    )
    .await;
    // Alice is pumped meanwhile: her lease is renewed only when she echoes its probes.
    pump_all("bob live", &mut [&mut a, &mut b], |x| {
        x[1].view.phase() == Phase::Live
    })
    .await;
    let mut c = Sdk::join(
        srv.addr,
        "adm",
        join_token(&srv.app_key, "adm", "carol", true),
    )
    .await;
    pump_all("carol live", &mut [&mut a, &mut c], |x| {
        x[1].view.phase() == Phase::Live
    })
    .await;

    // The key and only the key: one of another length, a prefix of it, it extended.
    for wrong in [
        "wrong",
        "admin-secret-key-123",
        "admin-secret-key-12345",
        "admin-secret-key-1235",
    ] {
        let r = http
            .post(format!("{base}/reassign"))
            .bearer_auth(wrong)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "{wrong}");
    }
    // The key is checked first: without it a bad body is not looked at.
    for route in ["reassign", "kick", "ttl", "close"] {
        let r = http
            .post(format!("{base}/{route}"))
            .header("content-type", "application/json")
            .body("{not json")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "{route}");
    }
    let r = http
        .post(format!("{base}/reassign"))
        .bearer_auth("admin-secret-key-1234")
        .json(&serde_json::json!({"to": "carol"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut all = [&mut a, &mut b, &mut c];
    pump_all("carol host by admin", &mut all, |x| x[2].has_authority()).await;
    assert_eq!(c.view.assignment().unwrap().reason, Reason::Admin);
    assert_eq!(c.view.epoch(), Some(Epoch(2)));
    // A reassign to the host itself is not a grant: the epoch stays and carol goes on acting (it
    // was a grant fenced against carol herself: no authority until her own lease ran out).
    let same = admin_post(
        srv.addr,
        "adm",
        "reassign",
        serde_json::json!({"to": "carol"}),
    )
    .await;
    assert_eq!(same["epoch"], 2, "{same}");
    c.pump(std::time::Duration::from_millis(600)).await;
    assert_eq!(c.view.epoch(), Some(Epoch(2)));
    c.pump_until("carol acting", |s| s.has_authority()).await;

    // Kicking the host replaces it at once.
    assert_eq!(kick(srv.addr, "adm", "carol").await, 1);
    let mut all = [&mut a, &mut b, &mut c];
    // The kicked client's view closes (it must not join again).
    pump_all("carol kicked, alice host", &mut all, |x| {
        x[0].has_authority() && x[2].view.phase() == Phase::Closed
    })
    .await;
    assert_eq!(a.view.assignment().unwrap().reason, Reason::Kicked);
    assert!(c
        .events
        .iter()
        .any(|e| matches!(e, hostlease::core::Event::ServerError(ErrorCode::Kicked, _))));
    // The kick's error frame is counted like the session's own errors.
    let page = srv.metrics().await;
    assert!(
        page.contains("hostlease_ws_errors_total{code=\"kicked\"}"),
        "{page}"
    );

    // Closing: hostless with reason closed, everyone closed, new joins refused.
    let r = http
        .post(format!("{base}/close"))
        .bearer_auth("admin-secret-key-1234")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut all = [&mut a, &mut b];
    pump_all("room closed", &mut all, |x| {
        x.iter().all(|s| s.view.phase() == Phase::Closed)
    })
    .await;
    let row = srv
        .app
        .store
        .room(&RoomId::new("adm").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert!(row.closed && row.host.is_none());
    let cur = row.current.unwrap().assignment;
    assert_eq!(cur.reason, Reason::Closed);
    let epoch_closed = cur.epoch;
    let mut d = srv.raw("adm", "dan", true).await;
    assert_eq!(d.until_closed().await, Some(ErrorCode::RoomClosed));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let row = srv
        .app
        .store
        .room(&RoomId::new("adm").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        row.epoch, epoch_closed,
        "a closed room is never granted again"
    );
}

/// A grant decided before a room was closed (its row read while the room was open and
/// hostless) loses the compare-and-swap once the close has committed: the epoch does not move
/// for a closed room.
#[tokio::test]
async fn a_closed_room_is_never_granted_again() {
    let srv = start(test_config()).await;
    let room = RoomId::new("closed-cas").unwrap();
    let store = &srv.app.store;
    assert!(store.close_hostless(&room, Epoch::ZERO).await.unwrap());
    for require_lapsed in [true, false] {
        let req = GrantReq {
            room: room.clone(),
            expected_epoch: Epoch::ZERO,
            holder: Some((
                hostlease::protocol::ParticipantId::new("late").unwrap(),
                hostlease::protocol::SessionId::new("s-late").unwrap(),
            )),
            lease_ms: 1000,
            reason: Reason::Elected,
            require_lapsed,
            close: false,
        };
        let out = store.grant(req, &srv.app.keys).await.unwrap();
        assert!(matches!(out, GrantOutcome::Lost(_)), "{out:?}");
    }
    let row = store.room(&room).await.unwrap().unwrap();
    assert!(row.closed && row.host.is_none());
    assert_eq!(row.epoch, Epoch::ZERO);
}

#[tokio::test]
async fn racing_grants_have_exactly_one_winner() {
    let srv = start(test_config()).await;
    let room = RoomId::new("race-inproc").unwrap();
    for round in 0..5u64 {
        let mut tasks = Vec::new();
        for i in 0..8 {
            let app = srv.app.clone();
            let room = room.clone();
            tasks.push(tokio::spawn(async move {
                let req = GrantReq {
                    room,
                    expected_epoch: Epoch(round),
                    holder: Some((
                        hostlease::protocol::ParticipantId::new(format!("p{i}")).unwrap(),
                        hostlease::protocol::SessionId::new(format!("s{i}")).unwrap(),
                    )),
                    lease_ms: 1000,
                    reason: Reason::Admin,
                    require_lapsed: false,
                    close: false,
                };
                matches!(
                    app.store.grant(req, &app.keys).await.unwrap(),
                    GrantOutcome::Won { .. }
                )
            }));
        }
        let mut wins = 0;
        for t in tasks {
            wins += t.await.unwrap() as u32;
        }
        assert_eq!(wins, 1, "round {round}");
        let row = srv.app.store.room(&room).await.unwrap().unwrap();
        assert_eq!(row.epoch, Epoch(round + 1));
    }
}

#[tokio::test]
async fn renewal_of_the_live_host_does_not_move_the_epoch() {
    // A 1.5 s lease probed every 0.5 s: a renewal may come 1 s late (a loaded machine's stall)
    // before the lease lapses; with 300 ms, a 200 ms stall failed the host over.
    let srv = start(test_config()).await;
    let mut a = srv.raw("ren", "alice", true).await;
    let mut confirms = 0;
    let deadline = tokio::time::Instant::now() + WAIT;
    // Several ttl periods of echoed probes: every confirm names epoch 1.
    while confirms < 8 {
        assert!(tokio::time::Instant::now() < deadline);
        match a.next(Duration::from_secs(5)).await.expect("frame") {
            ServerMsg::LeaseProbe { nonce, epoch } => {
                assert_eq!(epoch, Epoch(1));
                a.send(&hostlease::protocol::ClientMsg::LeaseEcho { nonce })
                    .await;
            }
            ServerMsg::LeaseConfirm { epoch, .. } => {
                assert_eq!(epoch, Epoch(1));
                confirms += 1;
            }
            ServerMsg::Assignment(x) => assert_eq!(x.assignment.epoch, Epoch(1)),
            _ => {}
        }
    }
    let row = srv
        .app
        .store
        .room(&RoomId::new("ren").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.epoch, Epoch(1));
}

#[test]
fn cli_keygen_token_and_graceful_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_hostlease-server");
    let key = dir.path().join("k.json");
    let out = std::process::Command::new(bin)
        .args(["keygen", "--out", key.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("public key"));
    // The private key is readable by its owner only.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&key).unwrap().permissions().mode();
    assert_eq!(mode & 0o077, 0, "key file mode {mode:o}");
    let out = std::process::Command::new(bin)
        .args([
            "token",
            "--key",
            key.to_str().unwrap(),
            "--room",
            "r",
            "--participant",
            "p",
            "--may-host",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let token = String::from_utf8(out.stdout).unwrap();
    let k = hostlease_server::tokens::Keypair::load(&key).unwrap();
    let v = hostlease_server::tokens::Verifier::from_keys(&[k.public()]).unwrap();
    let c: hostlease_server::tokens::JoinClaims = v
        .verify(hostlease_server::tokens::JOIN_PREFIX, token.trim())
        .unwrap();
    assert!(c.may_host);
    // A key id prefix may hold `:` (the kid does): the printed `kid:x` is what `serve
    // --app-public-key` takes (it split at the first `:`). One that makes no kid is an error.
    let colon = dir.path().join("colon.json");
    let out = std::process::Command::new(bin)
        .args(["keygen", "--kid-prefix", "acme:prod", "--out"])
        .arg(&colon)
        .output()
        .unwrap();
    assert!(out.status.success());
    let printed = String::from_utf8(out.stdout).unwrap();
    let public = printed
        .lines()
        .find_map(|l| l.strip_prefix("public key (pass to serve --app-public-key): "))
        .unwrap()
        .to_string();
    assert!(public.starts_with("acme:prod-"), "{public}");
    let out = std::process::Command::new(bin)
        .args(["keygen", "--kid-prefix", "a b", "--out"])
        .arg(dir.path().join("space.json"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "an error, not a panic");
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("error: key id prefix"));
    // A token that would be born expired is refused.
    let out = std::process::Command::new(bin)
        .args(["token", "--key", key.to_str().unwrap()])
        .args(["--room", "r", "--participant", "p", "--ttl", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    // A server without any key to verify join tokens with would refuse every join: it does not
    // start, and says what to pass.
    // `serve` on a database and server key of its own in `dir`, named after `name`.
    let serve = |name: &str| {
        let mut c = std::process::Command::new(bin);
        c.args(["serve", "--listen", "127.0.0.1:0"])
            .arg("--db")
            .arg(format!(
                "sqlite://{}",
                dir.path().join(format!("{name}.db")).display()
            ))
            .arg("--server-key")
            .arg(dir.path().join(format!("{name}-server.json")));
        c
    };
    let err = refused_at_start(
        serve("nokey")
            .env_remove("HOSTLEASE_APP_KEY")
            .env_remove("HOSTLEASE_DEV"),
    );
    assert!(err.contains("no key to verify join tokens with"), "{err}");
    assert!(
        !dir.path().join("nokey.db").exists() && !dir.path().join("nokey-server.json").exists(),
        "a server that did not start left files behind"
    );

    // `serve --help` shows no secret the environment holds: the admin key, the webhook's
    // secret, nor its URL (which may carry credentials).
    let out = std::process::Command::new(bin)
        .args(["serve", "--help"])
        .env("HOSTLEASE_ADMIN_KEY", "admin-key-0123456789")
        .env("HOSTLEASE_WEBHOOK_SECRET", "hook-secret-0123456789")
        .env(
            "HOSTLEASE_WEBHOOK_URL",
            "http://user:url-secret@127.0.0.1:9/hook",
        )
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("HOSTLEASE_WEBHOOK_URL"), "{help}");
    for secret in [
        "admin-key-0123456789",
        "hook-secret-0123456789",
        "url-secret",
    ] {
        assert!(!help.contains(secret), "{secret} in:\n{help}");
    }

    // An empty or short admin key (anyone could use the admin API with it) stops the server
    // before it starts, without echoing the key.
    for short in ["", "s3cr3t-15-bytes"] {
        let err = refused_at_start(
            serve("admin")
                .arg("--dev")
                .env("HOSTLEASE_ADMIN_KEY", short),
        );
        assert!(
            err.contains("--admin-key must be 16 bytes or more"),
            "{err}"
        );
        assert!(short.is_empty() || !err.contains(short), "{err}");
    }

    // An action table no client could take (too many actions for a snapshot, or too long for
    // a capability) stops the server before it creates anything. 253 participant actions, the
    // two host ones and the two built-in: 257.
    let many: Vec<String> = (0..253).map(|i| format!("a{i}")).collect();
    let long: Vec<String> = (0..100).map(|i| format!("act-{i:0>23}")).collect();
    for (list, want) in [
        (many, "257 actions"),
        (long, "participant actions are too many"),
    ] {
        let err = refused_at_start(
            serve("actions")
                .arg("--dev")
                .arg("--participant-actions")
                .arg(list.join(",")),
        );
        assert!(err.contains(want), "{err}");
        assert!(!dir.path().join("actions.db").exists(), "{err}");
    }

    // A rate of 0, less, or not a number would refuse every participant command (room bytes),
    // every command and every session (a flood bucket of no frame), or every HTTP request (with a
    // retry time of 584 million years); so would a burst (twice the rate) below one command.
    // Limits that would break every session or every lease are refused by the flag's range
    // too: no room, member or connection at all; a lease past 24 h (one past i64 went negative
    // in the store: every lease lapsed as granted); a heartbeat under a second (a client a slow
    // round trip away given up while answering).
    let rate = "must be a number of";
    let range = "invalid value";
    for (flag, value, want) in [
        ("--room-bytes-rate", "0", rate),
        ("--room-bytes-rate", "-5", rate),
        ("--room-bytes-rate", "NaN", rate),
        ("--signal-bytes-rate", "0", rate),
        ("--signal-bytes-rate", "NaN", rate),
        ("--msg-rate", "0", rate),
        ("--msg-rate", "0.4", rate),
        ("--msg-rate", "NaN", rate),
        ("--http-rate", "-1", rate),
        ("--http-rate", "inf", rate),
        ("--max-rooms", "0", range),
        ("--max-members", "0", range),
        ("--max-connections", "0", range),
        ("--lease-ms", "9223372036854775808", range),
        ("--lease-ms", "86400001", range),
        ("--lease-ms", "999", range),
        ("--heartbeat-ms", "999", range),
    ] {
        let err = refused_at_start(serve("limits").arg("--dev").arg(format!("{flag}={value}")));
        assert!(
            err.contains(want) && err.contains(flag),
            "{flag}={value}: {err}"
        );
    }

    // SIGTERM: the server exits cleanly.
    std::fs::copy(&key, dir.path().join("app-key.json")).unwrap();
    let db = format!("sqlite://{}", dir.path().join("s.db").display());
    // (With the `acme:prod-…` public key keygen printed above: it starts.)
    let mut p = spawn_proc(
        &db,
        dir.path(),
        "term",
        1000,
        &["--app-public-key", &public],
    );
    let pid = p.child.id();
    let st = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        if let Some(status) = p.child.try_wait().unwrap() {
            assert!(status.success(), "exit status {status:?}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "server did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test]
async fn per_room_ttl_applies_from_the_next_grant() {
    let srv = start(test_config()).await;
    let http = reqwest::Client::new();
    let r = http
        .post(format!("http://{}/v1/admin/rooms/ttl/ttl", srv.addr))
        .bearer_auth("admin-secret-key-1234")
        .json(&serde_json::json!({"lease_ms": 3000}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut a = srv.raw("ttl", "alice", true).await;
    let asg = a
        .until(|m| match m {
            ServerMsg::Assignment(x) => Some(x.assignment.clone()),
            _ => None,
        })
        .await;
    assert_eq!(asg.lease_ms, 3000);
    let nonce = a
        .until(|m| match m {
            ServerMsg::LeaseProbe { nonce, .. } => Some(*nonce),
            _ => None,
        })
        .await;
    a.send(&hostlease::protocol::ClientMsg::LeaseEcho { nonce })
        .await;
    let remaining = a
        .until(|m| match m {
            ServerMsg::LeaseConfirm { remaining_ms, .. } => Some(*remaining_ms),
            _ => None,
        })
        .await;
    assert_eq!(remaining, 3000);
    // Another room keeps the server default.
    let mut b = srv.raw("dflt", "bob", true).await;
    let asg = b
        .until(|m| match m {
            ServerMsg::Assignment(x) => Some(x.assignment.clone()),
            _ => None,
        })
        .await;
    assert_eq!(asg.lease_ms, 1500);
}

/// A misspelt admin body is refused 400 and changes nothing: unknown fields were ignored, so a
/// reassign with a kick's `participant` went to whoever was next (200, the epoch moved) and a TTL
/// body without `lease_ms` set the room back to the server default.
#[tokio::test]
async fn a_misspelt_admin_body_is_refused_and_changes_nothing() {
    let srv = start(test_config()).await;
    let post = |route: &'static str, body: serde_json::Value| {
        let url = format!("http://{}/v1/admin/rooms/typo/{route}", srv.addr);
        async move {
            reqwest::Client::new()
                .post(url)
                .bearer_auth("admin-secret-key-1234")
                .json(&body)
                .send()
                .await
                .unwrap()
                .status()
        }
    };
    assert_eq!(
        post("ttl", serde_json::json!({"lease_ms": 3000})).await,
        200
    );
    let mut a = srv.raw("typo", "alice", true).await;
    a.until_host().await;
    let mut b = srv.raw("typo", "bob", true).await;
    b.until_capability().await;
    for (route, body) in [
        ("reassign", serde_json::json!({"participant": "bob"})),
        ("reassign", serde_json::json!({"To": "bob"})),
        ("kick", serde_json::json!({"to": "bob"})),
        (
            "kick",
            serde_json::json!({"participant": "bob", "why": "x"}),
        ),
        ("ttl", serde_json::json!({})),
        ("ttl", serde_json::json!({"ttl_ms": 60_000})),
        // A lease the SDK could never hold (it keeps 1 % + 250 ms of it back).
        ("ttl", serde_json::json!({"lease_ms": 999})),
        ("ttl", serde_json::json!({"lease_ms": 86_400_001})),
    ] {
        assert_eq!(post(route, body.clone()).await, 400, "{route} {body}");
    }
    let row = srv
        .app
        .store
        .room(&RoomId::new("typo").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.epoch, Epoch(1), "the host stayed");
    assert_eq!(
        row.current.unwrap().assignment.host.unwrap().as_str(),
        "alice"
    );
    // The room's TTL stayed too: the next grant (alice leaves, bob is elected) carries it.
    drop(a);
    let asg = b
        .until(|m| match m {
            ServerMsg::Assignment(x) if x.assignment.epoch == Epoch(2) => {
                Some(x.assignment.clone())
            }
            _ => None,
        })
        .await;
    assert_eq!(asg.lease_ms, 3000);
    // `null` is still the way back to the default.
    assert_eq!(
        post("ttl", serde_json::json!({"lease_ms": null})).await,
        200
    );
}

#[tokio::test]
async fn lowering_the_ttl_under_a_live_host_does_not_fail_it_over() {
    let srv = start(hostlease_server::Config {
        lease_ms: 6000, // a probe every 2 s
        ..test_config()
    })
    .await;
    let mut a = srv.raw("low", "alice", true).await;
    a.until_host().await;
    let mut b = srv.raw("low", "bob", true).await; // someone to fail over to
    b.until_capability().await;
    let r = reqwest::Client::new()
        .post(format!("http://{}/v1/admin/rooms/low/ttl", srv.addr))
        .bearer_auth("admin-secret-key-1234")
        .json(&serde_json::json!({"lease_ms": 1500}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // Alice answers every probe at once. Renewals now grant 1,500 ms: unless the next probe
    // comes within that (not at the 2 s planned under the old lease), the lease lapses and bob
    // is elected although alice never stopped answering. (With 300 ms leases, a 200 ms stall of
    // a loaded machine could fail it over, and at 150 ms a 100 ms one did.)
    let mut short = 0;
    let deadline = tokio::time::Instant::now() + WAIT;
    while short < 10 {
        assert!(tokio::time::Instant::now() < deadline, "too few renewals");
        match a.next(Duration::from_secs(5)).await.expect("frame") {
            ServerMsg::LeaseProbe { nonce, .. } => {
                a.send(&hostlease::protocol::ClientMsg::LeaseEcho { nonce })
                    .await
            }
            ServerMsg::LeaseConfirm {
                epoch,
                remaining_ms,
                ..
            } => {
                assert_eq!(epoch, Epoch(1));
                short += u32::from(remaining_ms == 1500);
            }
            ServerMsg::Assignment(x) => {
                assert_eq!(x.assignment.epoch, Epoch(1), "failed over: {x:?}")
            }
            _ => {}
        }
    }
    let row = srv
        .app
        .store
        .room(&RoomId::new("low").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.epoch, Epoch(1));
}

#[tokio::test]
async fn closing_a_hostless_room_does_not_move_the_epoch() {
    let srv = start(test_config()).await;
    let mut b = srv.raw("hl", "bob", false).await;
    b.until_capability().await;
    let r = reqwest::Client::new()
        .post(format!("http://{}/v1/admin/rooms/hl/close", srv.addr))
        .bearer_auth("admin-secret-key-1234")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(b.until_closed().await, Some(ErrorCode::RoomClosed));
    let row = srv
        .app
        .store
        .room(&RoomId::new("hl").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert!(row.closed);
    assert_eq!(row.epoch, Epoch(0));
}

/// Reassigning a hostless room with no eligible member is not a grant: hostless -> hostless
/// does not move the epoch, neither for a room never granted nor for one whose host left.
#[tokio::test]
async fn reassigning_a_hostless_room_without_candidates_does_not_move_the_epoch() {
    let srv = start(test_config()).await;
    let http = reqwest::Client::new();
    let reassign = |room: &'static str| {
        let (http, addr) = (http.clone(), srv.addr);
        async move {
            let r = http
                .post(format!("http://{addr}/v1/admin/rooms/{room}/reassign"))
                .bearer_auth("admin-secret-key-1234")
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            r.protocol::<hostlease::protocol::SignedAssignment>()
                .await
                .assignment
        }
    };
    let epoch_of = |room: &'static str| {
        let app = srv.app.clone();
        async move {
            app.store
                .room(&RoomId::new(room).unwrap())
                .await
                .unwrap()
                .map_or(Epoch(0), |r| r.epoch)
        }
    };

    // A room never granted, nobody in it.
    for _ in 0..2 {
        let a = reassign("empty").await;
        assert_eq!((a.epoch, a.host), (Epoch(0), None));
        assert_eq!(epoch_of("empty").await, Epoch(0));
    }

    // A room whose host left, with only a member who may not host.
    let mut a = srv.raw("gone", "alice", true).await;
    a.until(|m| matches!(m, ServerMsg::LeaseProbe { .. }).then_some(()))
        .await;
    let mut b = srv.raw("gone", "bob", false).await;
    b.until_capability().await;
    a.send(&hostlease::protocol::ClientMsg::Leave).await;
    let left = b
        .until(|m| match m {
            ServerMsg::Assignment(x) if x.assignment.host.is_none() => Some(x.assignment.epoch),
            _ => None,
        })
        .await;
    assert_eq!(left, Epoch(2));
    for _ in 0..2 {
        let a = reassign("gone").await;
        assert_eq!((a.epoch, a.host), (Epoch(2), None));
        assert_eq!(epoch_of("gone").await, Epoch(2));
    }
}

/// An admin request whose client goes away while the handler waits (here for the room's
/// decision lock) still releases the room: once its last session leaves, the hub leaves the
/// process's map.
#[tokio::test]
async fn a_request_dropped_by_its_client_releases_the_room() {
    let srv = start(test_config()).await;
    let id = RoomId::new("dropped").unwrap();
    let mut a = srv.raw("dropped", "alice", true).await;
    a.until_capability().await;
    // The hub itself, not counted as a holder.
    let hub = srv.app.rooms.lock().unwrap().get(&id).cloned().unwrap();
    let decide = hub.decide.lock().await;
    let r = reqwest::Client::new()
        .post(format!(
            "http://{}/v1/admin/rooms/dropped/reassign",
            srv.addr
        ))
        .bearer_auth("admin-secret-key-1234")
        .timeout(Duration::from_millis(300))
        .send()
        .await;
    assert!(r.is_err(), "the request waits for the decision lock");
    // Let the server see the client gone (and drop the handler's future).
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(decide);
    drop(hub);
    a.send(&hostlease::protocol::ClientMsg::Leave).await;
    assert_eq!(a.until_closed().await, None);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while srv.app.rooms.lock().unwrap().contains_key(&id) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the hub leaked: still in the map after every holder went"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `.` and `..` are not room names: a URL parser removes them from a path (a browser, or the
/// `url` crate, never sends them), so the server refuses them as it refuses any other bad
/// identifier. Sent raw, as a client that does not normalise paths would.
#[tokio::test]
async fn dot_room_names_are_refused() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let srv = start(test_config()).await;
    for (room, code) in [("..", "id_dots"), (".", "id_dots"), ("...", "")] {
        let mut tcp = tokio::net::TcpStream::connect(srv.addr).await.unwrap();
        let req = format!(
            "POST /v1/admin/rooms/{room}/close HTTP/1.1\r\nhost: x\r\n\
             authorization: Bearer admin-secret-key-1234\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        );
        tcp.write_all(req.as_bytes()).await.unwrap();
        let mut got = String::new();
        tcp.read_to_string(&mut got).await.unwrap();
        if code.is_empty() {
            assert!(got.starts_with("HTTP/1.1 200"), "{room}: {got}");
        } else {
            assert!(got.starts_with("HTTP/1.1 400"), "{room}: {got}");
            assert!(got.ends_with(code), "{room}: {got}");
        }
    }
}

/// Two processes creating the same missing key file at once: the one that finds it created by
/// the other uses that key (it failed with "File exists" once the file was created exclusively).
#[test]
fn a_key_file_created_meanwhile_by_another_process_is_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k.json");
    let keys: Vec<_> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..8)
            .map(|_| s.spawn(|| hostlease_server::tokens::Keypair::load_or_create(&path, "srv")))
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let on_disk = hostlease_server::tokens::Keypair::load(&path).unwrap();
    for k in keys {
        let k = k.expect("every process gets a key");
        assert_eq!(k.public().x, on_disk.public().x);
    }
}

/// An admin kick whose HTTP client gives up before the answer still replaces the kicked host
/// (hyper dropped the handler half way: the host stayed in office, its token working, until its
/// lease lapsed).
#[tokio::test]
async fn a_kick_whose_client_goes_away_still_replaces_the_host() {
    let srv = start(hostlease_server::Config {
        lease_ms: 60_000,
        ..test_config()
    })
    .await;
    let id = RoomId::new("kg").unwrap();
    let mut a = srv.raw("kg", "alice", true).await;
    a.until_host().await;
    let mut b = srv.raw("kg", "bob", true).await;
    b.until_capability().await;
    // The kick waits for the room's decisions, held here until its client has given up.
    let hub = srv.app.rooms.lock().unwrap().get(&id).cloned().unwrap();
    let decide = hub.decide.lock().await;
    let r = reqwest::Client::new()
        .post(format!("http://{}/v1/admin/rooms/kg/kick", srv.addr))
        .bearer_auth("admin-secret-key-1234")
        .json(&serde_json::json!({"participant": "alice"}))
        .timeout(Duration::from_millis(300))
        .send()
        .await;
    assert!(r.is_err(), "the client gave up");
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(decide);
    drop(hub);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let row = loop {
        let row = srv.app.store.room(&id).await.unwrap().unwrap();
        if row.host.as_ref().is_some_and(|h| h.as_str() == "bob")
            || tokio::time::Instant::now() >= deadline
        {
            break row;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(row.host.as_ref().map(|h| h.as_str()), Some("bob"));
    let a = b
        .until(|m| match m {
            ServerMsg::Assignment(s) if s.assignment.reason == Reason::Kicked => {
                Some(s.assignment.clone())
            }
            _ => None,
        })
        .await;
    assert_eq!(a.epoch, row.epoch);
}

/// The first line of the server's answer to `head` (a request whose body is announced and never
/// sent), or `None` when nothing came within 5 s.
async fn answer_without_body(addr: std::net::SocketAddr, head: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 256];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .ok()?
        .ok()?;
    String::from_utf8_lossy(&buf[..n])
        .lines()
        .next()
        .map(str::to_string)
}

/// An admin request without the key is refused before its body is read (it used to wait for
/// the whole body, up to 2 MB, however slowly it came), and no route takes a body larger than a
/// client frame (refused before it is read).
#[tokio::test]
async fn requests_are_refused_before_their_bodies_are_read() {
    let srv = start(test_config()).await;
    let admin = "POST /v1/admin/rooms/x/kick HTTP/1.1\r\nHost: x\r\n\
                 Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n";
    let line = answer_without_body(srv.addr, admin).await;
    assert!(
        line.as_deref().is_some_and(|l| l.contains(" 401 ")),
        "{line:?}"
    );
    let big = "POST /v1/rooms/x/commands HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\r\n\
               Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n";
    let line = answer_without_body(srv.addr, big).await;
    assert!(
        line.as_deref().is_some_and(|l| l.contains(" 413 ")),
        "{line:?}"
    );
    // A chunked body announces no length: past the limit it is a 413 all the same.
    let chunk = "x".repeat(70_000);
    let chunked = format!(
        "POST /v1/rooms/x/commands HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\r\n\
         Idempotency-Key: k\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{chunk}\r\n0\r\n\r\n",
        chunk.len()
    );
    let line = answer_without_body(srv.addr, &chunked).await;
    assert!(
        line.as_deref().is_some_and(|l| l.contains(" 413 ")),
        "{line:?}"
    );
}

/// A socket that opens and sends nothing, half a request head, or a head and part of its body,
/// is closed once the header timeout passes (each held a task and a file handle for ever: the
/// body had no deadline at all); a whole request is answered.
#[tokio::test]
async fn sockets_that_send_no_whole_request_head_are_closed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let srv = start(hostlease_server::Config {
        header_timeout_ms: 300,
        ..test_config()
    })
    .await;
    let closed_within = |mut s: tokio::net::TcpStream| async move {
        let mut buf = [0u8; 512];
        // A close reads as end of stream (or a 408 first, then the end).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => continue,
                Err(_) => return false,
            }
        }
    };
    let silent = tokio::net::TcpStream::connect(srv.addr).await.unwrap();
    let mut half = tokio::net::TcpStream::connect(srv.addr).await.unwrap();
    half.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    // No credentials needed: a body was read before any check.
    let mut part_body = tokio::net::TcpStream::connect(srv.addr).await.unwrap();
    part_body
        .write_all(
            b"POST /v1/rooms/r/commands HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nAB",
        )
        .await
        .unwrap();
    let mut one_chunk = tokio::net::TcpStream::connect(srv.addr).await.unwrap();
    one_chunk
        .write_all(b"POST /v1/rooms/r/commands HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nAB\r\n")
        .await
        .unwrap();
    let (a, b, c, d) = tokio::join!(
        closed_within(silent),
        closed_within(half),
        closed_within(part_body),
        closed_within(one_chunk)
    );
    assert!(a, "a socket that sent nothing is still open");
    assert!(b, "a socket that sent half a head is still open");
    assert!(c, "a socket that sent part of its body is still open");
    assert!(d, "a socket that sent one chunk of its body is still open");
    let r = reqwest::get(format!("http://{}/healthz", srv.addr))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

/// A client that stops reading its answer is let go once a write has waited the write timeout
/// (`Config::write_timeout_ms`, 10 s, as for WebSocket sessions): hyper's HTTP/1 server had no
/// deadline for writing an answer, and such a client held it (an inbox page, a file) and the
/// connection for ever.
#[tokio::test]
async fn a_client_that_does_not_read_its_answer_is_let_go_after_the_write_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let www = tempfile::tempdir().unwrap();
    const LEN: usize = 32 << 20;
    std::fs::write(www.path().join("big.bin"), vec![7u8; LEN]).unwrap();
    let srv = start(hostlease_server::Config {
        www: Some(www.path().to_path_buf()),
        write_timeout_ms: 300,
        ..test_config()
    })
    .await;
    // A small receive window, and nothing read for a while: the server's writes wait.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut s = socket.connect(srv.addr).await.unwrap();
    s.write_all(b"GET /big.bin HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    // What the server had handed to the kernel still arrives, then the end: not all of it.
    let mut got = 0;
    let mut buf = vec![0u8; 1 << 16];
    let read_all = async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n,
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), read_all)
        .await
        .expect("the connection ended");
    assert!(got < LEN, "the whole answer came: {got} bytes");
    // The server goes on answering others.
    let r = reqwest::get(format!("http://{}/healthz", srv.addr))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

/// HTTP connections are capped per client address as they are accepted: past the cap a new one
/// is closed at once (it stayed open until its header timeout, and one address sending a request
/// every few seconds on each kept thousands open), and a slot frees when a connection ends. A
/// connection upgraded to a WebSocket no longer counts as one (its session does, apart).
#[tokio::test]
async fn http_connections_past_the_per_address_cap_are_closed_at_once() {
    use tokio::io::AsyncReadExt;
    let srv = start(hostlease_server::Config {
        max_sockets_per_address: 2,
        header_timeout_ms: 60_000,
        ..test_config()
    })
    .await;
    /// Whether the server closed `s` within `within` (end of stream, or a reset).
    async fn closed_within(s: &mut tokio::net::TcpStream, within: Duration) -> bool {
        let mut buf = [0u8; 64];
        let read = tokio::time::timeout(within, s.read(&mut buf)).await;
        matches!(read, Ok(Ok(0)) | Ok(Err(_)))
    }
    let mut first = tokio::net::TcpStream::connect(srv.addr).await.unwrap();
    let mut second = tokio::net::TcpStream::connect(srv.addr).await.unwrap();
    let mut third = tokio::net::TcpStream::connect(srv.addr).await.unwrap();
    // (Closed at once; the bound is for a loaded machine's stalls.)
    assert!(
        closed_within(&mut third, WAIT).await,
        "a third connection stayed open"
    );
    assert!(!closed_within(&mut first, Duration::from_secs(1)).await);
    assert!(!closed_within(&mut second, Duration::from_secs(1)).await);
    drop((first, second));
    // Each slot freed once the server has seen its connection end.
    let healthz = || reqwest::get(format!("http://{}/healthz", srv.addr));
    let mut ok = false;
    for _ in 0..500 {
        if healthz().await.is_ok_and(|r| r.status() == 200) {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(ok, "no slot freed");
    // Two WebSocket sessions from the address, and HTTP still answers.
    let mut a = srv.raw("cap", "alice", false).await;
    let mut b = srv.raw("cap", "bob", false).await;
    let _ = (a.participant_token().await, b.participant_token().await);
    let (x, y) = tokio::join!(healthz(), healthz());
    let statuses = (x.unwrap().status().as_u16(), y.unwrap().status().as_u16());
    assert_eq!(statuses, (200, 200));
}

/// A session that joins while the server is shutting down is told so and closed (it waited for
/// a change of the shutdown flag that had already happened).
#[tokio::test]
async fn a_session_that_joins_during_a_shutdown_is_told() {
    let srv = start(test_config()).await;
    srv.app.shutdown.send_replace(true);
    let mut late = srv.raw("sd2", "alice", false).await;
    assert_eq!(late.until_closed().await, Some(ErrorCode::Internal));
}

/// `--dev`'s `/dev/token` answers a page of another origin (an app's own dev server, Vite on
/// its port: the preflight got 405 and the browser refused the answer) whatever content type it
/// sends (415 without `application/json`), and refuses a `ttl_ms` it cannot add to the clock
/// (a panic) or one of none.
#[tokio::test]
async fn the_dev_token_endpoint_serves_another_origin_and_refuses_bad_ttls() {
    let srv = start(hostlease_server::Config {
        dev: true,
        ..test_config()
    })
    .await;
    let http = reqwest::Client::new();
    let url = format!("http://{}/dev/token", srv.addr);
    let pre = http
        .request(reqwest::Method::OPTIONS, &url)
        .header("Origin", "http://localhost:5173")
        .header("Access-Control-Request-Method", "POST")
        .header("Access-Control-Request-Headers", "content-type")
        .send()
        .await
        .unwrap();
    assert!(pre.status().is_success(), "{}", pre.status());
    assert_eq!(pre.headers()["access-control-allow-origin"], "*");
    // A plain `fetch(url, { method: "POST", body: JSON.stringify(...) })` sends text/plain.
    let r = http
        .post(&url)
        .header("Origin", "http://localhost:5173")
        .header("content-type", "text/plain;charset=UTF-8")
        .body(r#"{"room":"dev","participant":"ann","name":"Ann"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["access-control-allow-origin"], "*");
    let token: serde_json::Value = r.json().await.unwrap();
    let token = hostlease::protocol::Token::new(token["token"].as_str().unwrap());
    let mut ann = Raw::join(srv.addr, "dev", &token, None).await;
    ann.until(|m| matches!(m, ServerMsg::Welcome { .. }).then_some(()))
        .await;
    for ttl in [u64::MAX, 0] {
        let r = http
            .post(&url)
            .body(format!(
                r#"{{"room":"dev","participant":"bob","ttl_ms":{ttl}}}"#
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "ttl_ms {ttl}");
    }
    // The server is still there.
    let r = http
        .post(&url)
        .body(r#"{"room":"dev","participant":"cy"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

/// A kick revokes the capabilities of the participant's sessions begun before it: the kicked
/// session's participant capability kept working over HTTP until it expired (ten minutes). One
/// of a session begun after the kick (joined again with a join token from the app) works.
/// A kick made through this process is applied once: the sweeper (which applies the kicks made
/// through every process on the database) skips it, so a participant who joins again at once is
/// not kicked a second time on the sweeper's next tick.
#[tokio::test]
async fn a_kick_is_applied_once() {
    let srv = start(hostlease_server::Config {
        sweep_ms: 1000,
        ..test_config()
    })
    .await;
    let mut m = srv.raw("ko", "mallory", false).await;
    let _ = m.participant_token().await;
    assert_eq!(kick(srv.addr, "ko", "mallory").await, 1);
    assert_eq!(m.until_closed().await, Some(ErrorCode::Kicked));
    let mut back = srv.raw("ko", "mallory", false).await;
    let _ = back.participant_token().await;
    // Two ticks of the sweeper later, the new session is still open.
    let until = tokio::time::Instant::now() + Duration::from_millis(2500);
    loop {
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        match back.next(left).await {
            Some(ServerMsg::Error { code, .. }) => panic!("the new session was told {code:?}"),
            Some(_) => {}
            None => {
                assert!(
                    tokio::time::Instant::now() >= until,
                    "the new session was closed"
                );
                break;
            }
        }
    }
}

#[tokio::test]
async fn a_kick_revokes_the_capabilities_of_sessions_begun_before_it() {
    use hostlease::protocol::Token;
    let srv = start(test_config()).await;
    use hostlease_server::tokens::{CapClaims, CAP_PREFIX};
    let mut m = srv.raw("kr", "mallory", false).await;
    let old = m.participant_token().await;
    // Every capability of a session carries the session's start, however late it was minted
    // (a resume brings a fresh one).
    tokio::time::sleep(Duration::from_millis(30)).await;
    m.send(&hostlease::protocol::ClientMsg::Resume {
        cursor: hostlease::protocol::Seq(0),
    })
    .await;
    let fresh = m.participant_token().await;
    let sat = |t: &Token| {
        srv.app
            .cap_keys
            .verify::<CapClaims>(CAP_PREFIX, t.expose())
            .unwrap()
            .sat
    };
    assert_ne!(fresh, old);
    assert_eq!(sat(&fresh), sat(&old));
    let http = reqwest::Client::new();
    let vote = |cap: Token, key: &'static str| {
        http.post(format!("http://{}/v1/rooms/kr/commands", srv.addr))
            .bearer_auth(cap.expose())
            .header("Idempotency-Key", key)
            .json(&serde_json::json!({"action": "vote", "payload": {"n": 1}}))
            .send()
    };
    assert_eq!(vote(old.clone(), "before").await.unwrap().status(), 200);
    // A socket opened before the kick, its hello sent after (an SDK reconnecting meanwhile).
    let opened = connect(srv.addr, "kr").await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(kick(srv.addr, "kr", "mallory").await, 1);
    assert_eq!(m.until_closed().await, Some(ErrorCode::Kicked));
    let r = vote(old.clone(), "after").await.unwrap();
    assert_eq!(r.status(), 403);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["code"], "bad_capability", "{body}");
    // Nor is it told who hosts now (its signature is still valid).
    assert!(body.get("current").is_none(), "{body}");
    // One minted after the kick for a session begun before it (a session the kick has not
    // closed yet, on another process, gets a fresh one with each resume) is revoked too.
    let claims: CapClaims = srv.app.cap_keys.verify(CAP_PREFIX, old.expose()).unwrap();
    let late = CapClaims {
        exp: hostlease_server::tokens::now_ms() + 60_000,
        ..claims
    };
    let late = Token::new(srv.app.keys.sign_token(CAP_PREFIX, &late));
    assert_eq!(vote(late, "late").await.unwrap().status(), 403);
    // Let the clock move past the kick's millisecond, then join again.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let mut back = srv.raw("kr", "mallory", false).await;
    let new = back.participant_token().await;
    assert_eq!(vote(new, "new").await.unwrap().status(), 200);
    // The session whose socket was open before the kick began when it joined, after the kick,
    // which did not close it: its capabilities work (they were refused, and the session kept,
    // for the hour the kick is kept).
    let token = join_token(&srv.app_key, "kr", "mallory", false);
    let mut joined = Raw::hello(opened, &token, None).await;
    let cap = joined.participant_token().await;
    assert_eq!(vote(cap, "joined").await.unwrap().status(), 200);
}

/// An admin reassign of `room` to `to`, answered 200.
async fn reassign_to(addr: std::net::SocketAddr, room: &str, to: &str) {
    admin_post(addr, room, "reassign", serde_json::json!({ "to": to })).await;
}

/// `confirmed` (now_ms) is not before `until` (the store clock's ms; 20 ms for the clocks' reads).
fn not_before(confirmed: u64, until: u64, what: &str) {
    assert!(
        confirmed + 20 >= until,
        "{what} confirmed {} ms before the lease taken away ran out",
        until - confirmed
    );
}

/// Answers probes until `r` holds a confirmed lease of `epoch` (a host capability came); when.
/// Any earlier confirm of `epoch` (or capability, or probe of another epoch) fails the test.
async fn confirmed_at(r: &mut Raw, epoch: hostlease::protocol::Epoch) -> u64 {
    loop {
        match r.until(|m| Some(m.clone())).await {
            ServerMsg::LeaseProbe { nonce, .. } => {
                r.send(&hostlease::protocol::ClientMsg::LeaseEcho { nonce })
                    .await
            }
            ServerMsg::Capability {
                role: hostlease::protocol::Role::Host,
                epoch: e,
                ..
            } => {
                assert_eq!(e, Some(epoch));
                return hostlease_server::tokens::now_ms();
            }
            _ => {}
        }
    }
}

/// A forced grant (an admin's reassign, a kick) is fenced: the host it replaces may not know yet
/// (its connection cut) and acts as host until its own deadline, so the successor's lease is
/// confirmed, and it is given its host token, only once the lease taken away has run out on the
/// server, as the store has it (`Store::renew` refuses until then). A resume meanwhile is not told
/// of a lease either: its snapshot's `lease_remaining_ms` would be authority before that (it
/// was the extended lease, and so `lease: held` at once).
#[tokio::test]
async fn a_forced_grant_waits_out_the_lease_it_takes_away() {
    let srv = start(hostlease_server::Config {
        lease_ms: 3000,
        ..test_config()
    })
    .await;
    let room = RoomId::new("fence").unwrap();
    let mut a = srv.raw("fence", "alice", true).await;
    a.until_host().await;
    let mut b = srv.raw("fence", "bob", true).await;
    b.until(|m| matches!(m, ServerMsg::Welcome { .. }).then_some(()))
        .await;
    for (successor, replaced) in [(&mut b, "alice"), (&mut a, "bob")] {
        // The host renewed within the last second (probes come every TTL/3): 2 s or more left.
        let before = srv.app.store.room(&room).await.unwrap().unwrap();
        let epoch = before.epoch.next();
        if replaced == "alice" {
            reassign_to(srv.addr, "fence", "bob").await;
        } else {
            assert_eq!(kick(srv.addr, "fence", "bob").await, 1);
        }
        let seq = successor
            .until(|m| match m {
                ServerMsg::Assignment(s) if s.assignment.epoch == epoch => Some(s.assignment.seq),
                _ => None,
            })
            .await;
        successor
            .send(&hostlease::protocol::ClientMsg::Resume { cursor: seq })
            .await;
        let remaining = successor
            .until(|m| match m {
                ServerMsg::Welcome { snapshot, .. } => Some(snapshot.lease_remaining_ms),
                _ => None,
            })
            .await;
        assert_eq!(remaining, None, "a fenced lease was told in a snapshot");
        let confirmed = confirmed_at(successor, epoch).await;
        not_before(
            confirmed,
            before.lease_expires,
            &format!("the successor of {replaced}"),
        );
    }
}

/// The fence of a forced grant holds for whoever is granted before the lease taken away has run
/// out, not only for the grant's own holder: a kick of the only member is a grant to nobody, and
/// the next member elected (reason `elected`) was confirmed at once; a successor who leaves at
/// once is replaced (reason `left`) by someone who was confirmed at once. Both while the kicked
/// or replaced host, cut off, may still act until its deadline.
#[tokio::test]
async fn a_fence_holds_for_every_grant_until_the_lease_taken_away_runs_out() {
    let srv = start(hostlease_server::Config {
        lease_ms: 3000,
        ..test_config()
    })
    .await;

    // A kick of the only member: nobody is granted; carol, who joins next, is elected.
    let room = RoomId::new("fk").unwrap();
    let mut a = srv.raw("fk", "alice", true).await;
    a.until_host().await;
    let before = srv.app.store.room(&room).await.unwrap().unwrap();
    assert_eq!(kick(srv.addr, "fk", "alice").await, 1);
    let mut c = srv.raw("fk", "carol", true).await;
    let confirmed = confirmed_at(&mut c, Epoch(before.epoch.0 + 2)).await;
    not_before(confirmed, before.lease_expires, "carol (after the kick)");

    // A reassign to bob, who leaves at once: carol replaces him.
    let room = RoomId::new("fl").unwrap();
    let mut a = srv.raw("fl", "alice", true).await;
    a.until_host().await;
    let mut b = srv.raw("fl", "bob", true).await;
    b.until(|m| matches!(m, ServerMsg::Welcome { .. }).then_some(()))
        .await;
    let before = srv.app.store.room(&room).await.unwrap().unwrap();
    reassign_to(srv.addr, "fl", "bob").await;
    // Alice's connection is cut (she is no longer a member to elect); carol joins.
    drop(a);
    let mut c = srv.raw("fl", "carol", true).await;
    c.until(|m| matches!(m, ServerMsg::Welcome { .. }).then_some(()))
        .await;
    b.send(&hostlease::protocol::ClientMsg::Leave).await;
    let granted = c
        .until(|m| match m {
            ServerMsg::Assignment(s) if s.assignment.reason == Reason::Left => {
                Some(s.assignment.clone())
            }
            _ => None,
        })
        .await;
    assert_eq!(granted.host.as_ref().map(|h| h.as_str()), Some("carol"));
    let confirmed = confirmed_at(&mut c, granted.epoch).await;
    not_before(confirmed, before.lease_expires, "carol (after the leave)");
}

/// A renewal never shortens a lease: the holder was told of the lease it had (it keeps the later
/// deadline), so a TTL lowered since applies beyond it only. It used to set the expiry to now +
/// the new TTL: a host whose connection then died lapsed, and its successor was confirmed, while
/// the host still held its lease by the deadline it was given.
#[tokio::test]
async fn a_lowered_ttl_never_shortens_a_lease_already_confirmed() {
    let srv = start(hostlease_server::Config {
        lease_ms: 60_000,
        ..test_config()
    })
    .await;
    let room = RoomId::new("ttl-down").unwrap();
    let mut a = srv.raw("ttl-down", "alice", true).await;
    a.until_host().await;
    let before = srv.app.store.room(&room).await.unwrap().unwrap();
    srv.app.store.set_ttl(&room, Some(1000)).await.unwrap();
    let renewed = srv
        .app
        .store
        .renew(
            &room,
            before.epoch,
            before.host.as_ref().unwrap(),
            before.session.as_ref().unwrap(),
            60_000,
        )
        .await
        .unwrap();
    let Some(Renewed::Until { expires, lease_ms }) = renewed else {
        panic!("not renewed: {renewed:?}");
    };
    assert_eq!(lease_ms, 1000, "the confirm tells the new TTL");
    assert!(
        expires >= before.lease_expires,
        "the lease was shortened by {} ms",
        before.lease_expires - expires
    );
}

/// A forced grant made while the room is fenced keeps the fence it found: the holder it displaces
/// was never confirmed (every renewal refused, every snapshot without a lease), so its lease,
/// which runs from the fence, adds nothing. It used to move the fence to that lease's end, a
/// TTL later with every reassign or kick. Renewals until the fence ends answer `Fenced`, never
/// "gone" (which stops the probing of a healthy holder for good).
#[tokio::test]
async fn a_forced_grant_within_a_fence_keeps_it() {
    let srv = start(hostlease_server::Config {
        lease_ms: 3000,
        ..test_config()
    })
    .await;
    let room = RoomId::new("f2").unwrap();
    let mut a = srv.raw("f2", "alice", true).await;
    a.until_host().await;
    let mut others = Vec::new();
    for p in ["bob", "carol"] {
        let mut r = srv.raw("f2", p, true).await;
        r.until(|m| matches!(m, ServerMsg::Welcome { .. }).then_some(()))
            .await;
        others.push(r);
    }
    let alice = srv.app.store.room(&room).await.unwrap().unwrap();
    for to in ["bob", "carol"] {
        reassign_to(srv.addr, "f2", to).await;
    }
    let row = srv.app.store.room(&room).await.unwrap().unwrap();
    assert_eq!(row.host.as_ref().map(|h| h.as_str()), Some("carol"));
    assert_eq!(row.fenced_until, alice.lease_expires, "the fence moved");
    // Carol's renewals, straight to the store, until the fence ends (bounded: 3 s of lease).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = srv
            .app
            .store
            .renew(
                &room,
                row.epoch,
                row.host.as_ref().unwrap(),
                row.session.as_ref().unwrap(),
                3000,
            )
            .await
            .unwrap();
        match r {
            Some(Renewed::Until { .. }) => break,
            Some(Renewed::Fenced { ms }) => assert!((1..=3000).contains(&ms), "fenced {ms} ms"),
            None => panic!("a fenced holder's renewal answered that the lease is gone"),
        }
        assert!(tokio::time::Instant::now() < deadline, "never renewed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    not_before(
        hostlease_server::tokens::now_ms(),
        alice.lease_expires,
        "carol",
    );
}

/// A kicked host whose connection is gone (dropped, its lease still running) is replaced at
/// once: it is a member of no process, and the kick replaced only the sessions it closed, so the
/// room named the kicked host until the lease lapsed (here a minute; with an admin TTL up to a
/// day). (Its successor is fenced until then, as the fence tests check for every forced grant.)
#[tokio::test]
async fn kicking_a_host_whose_connection_dropped_replaces_it() {
    let srv = start(hostlease_server::Config {
        lease_ms: 60_000,
        ..test_config()
    })
    .await;
    let mut alice = srv.raw("kd", "alice", true).await;
    alice.until_host().await;
    let mut bob = srv.raw("kd", "bob", true).await;
    // The connection drops without a close: the lease is left to run out.
    drop(alice);
    let room = RoomId::new("kd").unwrap();
    let gone = || {
        let hubs = srv.app.rooms.lock().unwrap();
        !hubs[&room]
            .members()
            .iter()
            .any(|m| m.id.as_str() == "alice")
    };
    for _ in 0..300 {
        if gone() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(gone(), "the server never saw the connection drop");
    assert_eq!(kick(srv.addr, "kd", "alice").await, 0);
    let a = bob
        .until(|m| match m {
            ServerMsg::Assignment(x) => Some(x.assignment.clone()),
            _ => None,
        })
        .await;
    assert_eq!(a.reason, Reason::Kicked);
    assert_eq!(a.host.as_ref().map(|h| h.as_str()), Some("bob"));
}

/// A transfer sent over HTTP (a backend holding the host's capability) is fenced like an admin's
/// reassign: the host's SDK did not send it and acts until it hears of the new epoch, which a
/// stalled connection or another process's publisher may hold back, so the successor is
/// confirmed only once the lease taken away has run out. Sent over the host's own socket it is
/// not: the SDK gives its authority up as it sends.
#[tokio::test]
async fn a_transfer_over_http_waits_out_the_lease_it_takes_away() {
    use hostlease::protocol::{Action, ClientMsg, IdempotencyKey};
    let srv = start(hostlease_server::Config {
        lease_ms: 3000,
        ..test_config()
    })
    .await;
    for over_http in [true, false] {
        let name = format!("hx{over_http}");
        let room = RoomId::new(&name).unwrap();
        let mut a = srv.raw(&name, "alice", true).await;
        a.until_host().await;
        let (epoch, token) = a.host_capability().unwrap();
        let mut b = srv.raw(&name, "bob", true).await;
        b.until(|m| matches!(m, ServerMsg::Welcome { .. }).then_some(()))
            .await;
        let before = srv.app.store.room(&room).await.unwrap().unwrap();
        if over_http {
            let resp = reqwest::Client::new()
                .post(format!("http://{}/v1/rooms/{name}/commands", srv.addr))
                .bearer_auth(token.expose())
                .header("Idempotency-Key", "transfer-1")
                .json(&serde_json::json!({
                    "action": "host.transfer",
                    "payload": {"to": "bob"},
                    "epoch": epoch.map(|e| e.0),
                }))
                .send()
                .await
                .unwrap();
            assert!(resp.status().is_success(), "{}", resp.status());
        } else {
            a.send(&ClientMsg::Command {
                id: IdempotencyKey::new("transfer-1").unwrap(),
                action: Action::new("host.transfer").unwrap(),
                payload: serde_json::json!({"to": "bob"}).into(),
                epoch,
                capability: token,
                after: None,
            })
            .await;
        }
        let next = before.epoch.next();
        let reason = b
            .until(|m| match m {
                ServerMsg::Assignment(s) if s.assignment.epoch == next => Some(s.assignment.reason),
                _ => None,
            })
            .await;
        assert_eq!(reason, Reason::Transferred);
        let row = srv.app.store.room(&room).await.unwrap().unwrap();
        if over_http {
            assert_eq!(row.fenced_until, before.lease_expires, "not fenced");
            let confirmed = confirmed_at(&mut b, next).await;
            not_before(
                confirmed,
                before.lease_expires,
                "bob (a transfer over HTTP)",
            );
        } else {
            assert_eq!(
                row.fenced_until, before.fenced_until,
                "fenced over the socket"
            );
            confirmed_at(&mut b, next).await;
        }
    }
}
