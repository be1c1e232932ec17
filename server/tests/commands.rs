//! Raw-protocol clients that bypass the SDK's refusals: the rejection matrix and idempotency
//! across WebSocket and HTTP.

mod common;

use common::*;
use hostlease::protocol::{
    Action, ClientMsg, Epoch, IdempotencyKey, Outcome, ParticipantId, RejectCode, Role, RoomId,
    ServerMsg, SessionId, Token,
};
use hostlease_server::tokens::{CapClaims, Keypair, CAP_PREFIX};
use hostlease_server::Config;

struct Granted {
    epoch: Epoch,
    host: Token,
    participant: Token,
    session: SessionId,
}

/// Joins and answers probes until a host capability arrives.
async fn wait_host(r: &mut Raw) -> Granted {
    let mut participant = None;
    let mut session = None;
    loop {
        let m = r.until(|m| Some(m.clone())).await;
        match m {
            ServerMsg::Welcome { session: s, .. } => session = Some(s),
            ServerMsg::LeaseProbe { nonce, .. } => r.send(&ClientMsg::LeaseEcho { nonce }).await,
            ServerMsg::Capability {
                role: Role::Participant,
                token,
                ..
            } => participant = Some(token),
            ServerMsg::Capability {
                role: Role::Host,
                token,
                epoch,
                ..
            } => {
                return Granted {
                    epoch: epoch.unwrap(),
                    host: token,
                    participant: participant.unwrap(),
                    session: session.unwrap(),
                }
            }
            _ => {}
        }
    }
}

fn key(s: &str) -> IdempotencyKey {
    IdempotencyKey::new(s).unwrap()
}

async fn cmd(r: &mut Raw, id: &str, action: &str, epoch: Option<Epoch>, token: &Token) -> Outcome {
    r.send(&ClientMsg::Command {
        id: key(id),
        action: Action::new(action).unwrap(),
        payload: serde_json::json!({"n": id}).into(),
        epoch,
        capability: token.clone(),
        after: None,
    })
    .await;
    let want = key(id);
    r.until(|m| match m {
        ServerMsg::CommandResult { id, outcome } if *id == want => Some(outcome.clone()),
        ServerMsg::LeaseProbe { .. } => None,
        _ => None,
    })
    .await
}

fn cap(
    k: &Keypair,
    room: &str,
    sub: &str,
    sid: &SessionId,
    epoch: Option<Epoch>,
    exp: u64,
) -> Token {
    let claims = CapClaims {
        room: RoomId::new(room).unwrap(),
        sub: ParticipantId::new(sub).unwrap(),
        sid: sid.clone(),
        role: if epoch.is_some() {
            Role::Host
        } else {
            Role::Participant
        },
        epoch,
        actions: vec![
            Action::new("poll.open").unwrap(),
            Action::new("vote").unwrap(),
        ],
        exp,
        sat: 0,
        kid: k.kid.clone(),
    };
    Token::new(k.sign_token(CAP_PREFIX, &claims))
}

fn rejected(o: &Outcome) -> (RejectCode, bool) {
    match o {
        Outcome::Rejected { code, current, .. } => (*code, current.is_some()),
        Outcome::Accepted { .. } => panic!("expected a rejection, got {o:?}"),
    }
}

#[tokio::test]
async fn rejection_matrix_changes_no_state() {
    // A long sweep interval: a lapsed lease stays recorded, so the expired-lease check is reached.
    // Alice echoes no probe here: her lease (and host token) must outlast the matrix by far.
    let cfg = hostlease_server::Config {
        lease_ms: 6000,
        sweep_ms: 60_000,
        ..test_config()
    };
    let srv = start(cfg).await;
    let room = RoomId::new("m").unwrap();
    let mut a = srv.raw("m", "alice", true).await;
    // The sweeper is slow here, so the join's own election grants alice.
    let g = wait_host(&mut a).await;
    let mut a2 = srv.raw("m", "alice", true).await;
    let _ = a2.participant_token().await;
    let mut b = srv.raw("m", "bob", true).await;
    let pb = b.participant_token().await;
    let before = srv.app.store.room(&room).await.unwrap().unwrap();
    let now = hostlease_server::tokens::now_ms();
    let forger = Keypair::generate(srv.app.keys.kid.as_str());

    let cases: Vec<(&str, usize, Option<Epoch>, Token, RejectCode)> = vec![
        (
            "forged",
            0,
            Some(g.epoch),
            cap(
                &forger,
                "m",
                "alice",
                &g.session,
                Some(g.epoch),
                now + 60_000,
            ),
            RejectCode::BadCapability,
        ),
        (
            "expired-token",
            0,
            Some(g.epoch),
            cap(
                &srv.app.keys,
                "m",
                "alice",
                &g.session,
                Some(g.epoch),
                now - 1,
            ),
            RejectCode::BadCapability,
        ),
        (
            "wrong-room",
            0,
            Some(g.epoch),
            cap(
                &srv.app.keys,
                "other",
                "alice",
                &g.session,
                Some(g.epoch),
                now + 60_000,
            ),
            RejectCode::BadCapability,
        ),
        (
            "stale-epoch-field",
            0,
            Some(Epoch(0)),
            g.host.clone(),
            RejectCode::StaleEpoch,
        ),
        (
            "stale-epoch-token",
            0,
            None,
            cap(
                &srv.app.keys,
                "m",
                "alice",
                &g.session,
                Some(Epoch(0)),
                now + 60_000,
            ),
            RejectCode::StaleEpoch,
        ),
        (
            "participant-token",
            0,
            None,
            g.participant.clone(),
            RejectCode::ActionNotGranted,
        ),
        (
            "bob-uses-alice-token",
            1,
            Some(g.epoch),
            g.host.clone(),
            RejectCode::BadCapability,
        ),
        (
            "bob-own-token",
            1,
            None,
            pb.clone(),
            RejectCode::ActionNotGranted,
        ),
        (
            "other-tab-uses-token",
            2,
            Some(g.epoch),
            g.host.clone(),
            RejectCode::BadCapability,
        ),
    ];
    let mut clients = [a, b, a2];
    for (name, i, epoch, token, want) in cases {
        let o = cmd(&mut clients[i], name, "poll.open", epoch, &token).await;
        assert_eq!(rejected(&o), (want, true), "case {name}");
        let row = srv.app.store.room(&room).await.unwrap().unwrap();
        assert_eq!(
            (row.seq, row.epoch),
            (before.seq, before.epoch),
            "case {name} changed state"
        );
    }
    // A token for a session that is not the holder's (valid signature, right epoch): not host.
    let other_sid = SessionId::new("s-elsewhere").unwrap();
    let http = reqwest::Client::new();
    let resp = http
        .post(format!("http://{}/v1/rooms/m/commands", srv.addr))
        .bearer_auth(
            cap(
                &srv.app.keys,
                "m",
                "alice",
                &other_sid,
                Some(g.epoch),
                now + 60_000,
            )
            .expose(),
        )
        .header("Idempotency-Key", "http-wrong-session")
        .json(&serde_json::json!({"action": "poll.open", "payload": {}}))
        .send()
        .await
        .unwrap();
    let o: Outcome = resp.protocol().await;
    assert_eq!(rejected(&o).0, RejectCode::NotHost);

    // The genuine host token works (the matrix was not rejecting everything).
    let [mut a, _b, _a2] = clients;
    let o = cmd(&mut a, "genuine", "poll.open", Some(g.epoch), &g.host).await;
    assert!(matches!(o, Outcome::Accepted { .. }), "{o:?}");
    let after_ok = srv.app.store.room(&room).await.unwrap().unwrap();
    assert_eq!(after_ok.seq.0, before.seq.0 + 1);

    // Expired lease on the store clock: alice stops echoing; a token that outlives the lease
    // (valid signature, right session and epoch) is refused with lease_expired.
    let long = cap(
        &srv.app.keys,
        "m",
        "alice",
        &g.session,
        Some(g.epoch),
        now + 600_000,
    );
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let row = srv.app.store.room(&room).await.unwrap().unwrap();
        if !row.lease_live() {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "lease never lapsed");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let o = cmd(&mut a, "after-lapse", "poll.open", Some(g.epoch), &long).await;
    assert_eq!(rejected(&o).0, RejectCode::LeaseExpired);
    let row = srv.app.store.room(&room).await.unwrap().unwrap();
    assert_eq!((row.seq, row.epoch), (after_ok.seq, after_ok.epoch));
}

#[tokio::test]
async fn stale_host_token_after_resign_is_refused() {
    let srv = start(test_config()).await;
    let room = RoomId::new("st").unwrap();
    let mut a = srv.raw("st", "alice", true).await;
    let g = wait_host(&mut a).await;
    let mut b = srv.raw("st", "bob", true).await;
    let gb_task = tokio::spawn(async move {
        let g = wait_host(&mut b).await;
        (b, g)
    });
    let o = cmd(&mut a, "resign", "host.resign", Some(g.epoch), &g.host).await;
    assert!(matches!(o, Outcome::Accepted { .. }), "{o:?}");
    let (_b, gb) = gb_task.await.unwrap();
    assert_eq!(gb.epoch, Epoch(g.epoch.0 + 1));
    let before = srv.app.store.room(&room).await.unwrap().unwrap();
    let o = cmd(&mut a, "stale", "poll.open", Some(g.epoch), &g.host).await;
    let (code, has_current) = rejected(&o);
    assert_eq!(code, RejectCode::StaleEpoch);
    assert!(has_current);
    if let Outcome::Rejected {
        current: Some(c), ..
    } = &o
    {
        assert_eq!(c.assignment.epoch, gb.epoch);
        assert_eq!(c.assignment.host.as_ref().unwrap().as_str(), "bob");
    }
    // The old host reconnected (another session) after its token expired, as after a failover:
    // still stale first, with the current assignment (its SDK reloads on that code only).
    let mut again = srv.raw("st", "alice", true).await;
    let _ = again.participant_token().await;
    let expired = cap(
        &srv.app.keys,
        "st",
        "alice",
        &g.session,
        Some(g.epoch),
        hostlease_server::tokens::now_ms() - 1,
    );
    for (name, token) in [
        ("other-session", &g.host),
        ("other-session-expired", &expired),
    ] {
        let o = cmd(&mut again, name, "poll.open", Some(g.epoch), token).await;
        let Outcome::Rejected {
            code,
            current: Some(c),
            ..
        } = &o
        else {
            panic!("{name}: {o:?}")
        };
        assert_eq!(
            (*code, c.assignment.epoch),
            (RejectCode::StaleEpoch, gb.epoch),
            "{name}"
        );
    }
    // (A token of the current epoch, expired or from another session, is still refused
    // `bad_capability`: `rejection_matrix_changes_no_state`.)
    let after = srv.app.store.room(&room).await.unwrap().unwrap();
    assert_eq!((after.seq, after.epoch), (before.seq, before.epoch));
}

/// A refusal says who hosts now only to a session of the room or to a capability that still
/// works. A capability's signature stays valid after it expires: over HTTP (no session) an
/// expired one is refused without the current assignment, whether the store refuses it or the
/// checks before it do (the old host's session still gets it with `stale_epoch`:
/// `stale_host_token_after_resign_is_refused`; a kicked one: `admin.rs`).
#[tokio::test]
async fn an_expired_capability_is_not_told_who_hosts_over_http() {
    let srv = start(test_config()).await;
    let mut a = srv.raw("ex", "alice", true).await;
    let g = wait_host(&mut a).await;
    let http = reqwest::Client::new();
    let now = hostlease_server::tokens::now_ms();
    let bob = SessionId::new("s-bob").unwrap();
    let mut n = 0;
    let mut refusal = |sub: &str, sid: &SessionId, epoch: Option<Epoch>, exp: u64, action: &str| {
        n += 1;
        let token = cap(&srv.app.keys, "ex", sub, sid, epoch, exp);
        let req = http
            .post(format!("http://{}/v1/rooms/ex/commands", srv.addr))
            .bearer_auth(token.expose())
            .header("Idempotency-Key", format!("k{n}"))
            .json(&serde_json::json!({"action": action, "payload": {}}))
            .send();
        async move { rejected(&req.await.unwrap().protocol::<Outcome>().await) }
    };
    for (works, exp) in [(true, now + 60_000), (false, now - 1)] {
        // Refused by the store: a participant's host command; a host token of an epoch gone.
        assert_eq!(
            refusal("bob", &bob, None, exp, "poll.open").await,
            (RejectCode::BadCapability, works)
        );
        assert_eq!(
            refusal(
                "alice",
                &g.session,
                Some(Epoch(g.epoch.0 - 1)),
                exp,
                "poll.open"
            )
            .await,
            (RejectCode::StaleEpoch, works)
        );
    }
    // Refused before the store (no kick check there): never named over HTTP.
    for exp in [now + 60_000, now - 1] {
        assert_eq!(
            refusal("bob", &bob, None, exp, "no.such").await,
            (RejectCode::ActionNotGranted, false)
        );
    }
}

#[tokio::test]
async fn idempotent_retries_across_ws_and_http() {
    let srv = start(test_config()).await;
    let room = RoomId::new("idem").unwrap();
    let mut b = srv.raw("idem", "bob", false).await;
    let p = b.participant_token().await;
    let o1 = cmd(&mut b, "k1", "vote", None, &p).await;
    let Outcome::Accepted { seq } = o1 else {
        panic!("{o1:?}")
    };
    let seq_after = srv.app.store.room(&room).await.unwrap().unwrap().seq;

    let http = reqwest::Client::new();
    let post = |key: &'static str, body: serde_json::Value| {
        http.post(format!("http://{}/v1/rooms/idem/commands", srv.addr))
            .bearer_auth(p.expose())
            .header("Idempotency-Key", key)
            .json(&body)
            .send()
    };
    // Same key, same request over HTTP: the recorded outcome, no new effect.
    let r = post(
        "k1",
        serde_json::json!({"action": "vote", "payload": {"n": "k1"}}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.protocol::<Outcome>().await, Outcome::Accepted { seq });
    assert_eq!(
        srv.app.store.room(&room).await.unwrap().unwrap().seq,
        seq_after
    );
    // Same key, different request: a conflict.
    let r = post(
        "k1",
        serde_json::json!({"action": "vote", "payload": {"n": "other"}}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 409);
    let o: Outcome = r.protocol().await;
    assert_eq!(rejected(&o).0, RejectCode::IdempotencyConflict);
    // And over the socket too.
    b.send(&ClientMsg::Command {
        id: key("k1"),
        action: Action::new("vote").unwrap(),
        payload: serde_json::json!({"n": "different"}).into(),
        epoch: None,
        capability: p.clone(),
        after: None,
    })
    .await;
    let o = b
        .until(|m| match m {
            ServerMsg::CommandResult { outcome, .. } => Some(outcome.clone()),
            _ => None,
        })
        .await;
    assert_eq!(rejected(&o).0, RejectCode::IdempotencyConflict);
    assert_eq!(
        srv.app.store.room(&room).await.unwrap().unwrap().seq,
        seq_after
    );
    // Same key on another socket of bob's, with the first socket's token (a client that
    // reconnected and resends): the recorded outcome, as over HTTP; a new key with that token is
    // refused there.
    let mut b2 = srv.raw("idem", "bob", false).await;
    b2.participant_token().await;
    assert_eq!(
        cmd(&mut b2, "k1", "vote", None, &p).await,
        Outcome::Accepted { seq }
    );
    assert_eq!(
        rejected(&cmd(&mut b2, "k9", "vote", None, &p).await).0,
        RejectCode::BadCapability
    );
    assert_eq!(
        srv.app.store.room(&room).await.unwrap().unwrap().seq,
        seq_after
    );
    drop(b2);

    // A rejection that had no effect is not cached: the same key later succeeds.
    let forged = Keypair::generate(srv.app.keys.kid.as_str());
    let sid = SessionId::new("s-x").unwrap();
    let r = http
        .post(format!("http://{}/v1/rooms/idem/commands", srv.addr))
        .bearer_auth(
            cap(
                &forged,
                "idem",
                "bob",
                &sid,
                None,
                hostlease_server::tokens::now_ms() + 60_000,
            )
            .expose(),
        )
        .header("Idempotency-Key", "k2")
        .json(&serde_json::json!({"action": "vote", "payload": {"n": "k2"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let o = cmd(&mut b, "k2", "vote", None, &p).await;
    assert_eq!(o, Outcome::Accepted { seq: seq.next() });

    // A body that is not UTF-8 is refused as malformed (not decoded lossily and applied).
    let before = srv.app.store.room(&room).await.unwrap().unwrap().seq;
    let r = http
        .post(format!("http://{}/v1/rooms/idem/commands", srv.addr))
        .bearer_auth(p.expose())
        .header("Idempotency-Key", "k3")
        .header("content-type", "application/json")
        .body(b"{\"action\":\"vote\",\"payload\":{\"n\":\"\xff\"}}".to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(r.text().await.unwrap(), "malformed_frame");
    assert_eq!(
        srv.app.store.room(&room).await.unwrap().unwrap().seq,
        before
    );
}

/// A retry of an accepted transfer gets its outcome again after the target has left; a new
/// transfer to someone absent is refused without an effect: `stale_epoch` with a host token of an
/// epoch the room has left (the old host is told to resync, not that its request was bad), and
/// `bad_request` with the current one.
#[tokio::test]
async fn a_transfer_retried_after_its_target_left_replays_its_outcome() {
    let srv = start(Config {
        lease_ms: 60_000,
        ..test_config()
    })
    .await;
    let room = RoomId::new("tr").unwrap();
    let mut a = srv.raw("tr", "alice", true).await;
    let g = wait_host(&mut a).await;
    let mut b = srv.raw("tr", "bob", true).await;
    b.participant_token().await;
    let transfer = |k: &str| ClientMsg::Command {
        id: key(k),
        action: Action::new("host.transfer").unwrap(),
        payload: serde_json::json!({"to": "bob"}).into(),
        epoch: Some(g.epoch),
        capability: g.host.clone(),
        after: None,
    };
    let result = |k: &str| {
        let want = key(k);
        move |m: &ServerMsg| match m {
            ServerMsg::CommandResult { id, outcome } if *id == want => Some(outcome.clone()),
            _ => None,
        }
    };
    a.send(&transfer("t1")).await;
    let first = a.until(result("t1")).await;
    assert!(matches!(first, Outcome::Accepted { .. }), "{first:?}");
    // Bob leaves; the room comes back to alice (a long lease: nothing lapses meanwhile), with a
    // capability for the epoch she holds now.
    b.send(&ClientMsg::Leave).await;
    let (epoch, host) = loop {
        match a.until(|m| Some(m.clone())).await {
            ServerMsg::LeaseProbe { nonce, .. } => a.send(&ClientMsg::LeaseEcho { nonce }).await,
            ServerMsg::Capability {
                role: Role::Host,
                token,
                epoch: Some(e),
                ..
            } if e > g.epoch => break (e, token),
            _ => {}
        }
    };
    let before = srv.app.store.room(&room).await.unwrap().unwrap();
    a.send(&transfer("t1")).await;
    assert_eq!(a.until(result("t1")).await, first);
    a.send(&transfer("t2")).await;
    assert_eq!(
        rejected(&a.until(result("t2")).await).0,
        RejectCode::StaleEpoch
    );
    a.send(&ClientMsg::Command {
        id: key("t3"),
        action: Action::new("host.transfer").unwrap(),
        payload: serde_json::json!({"to": "bob"}).into(),
        epoch: Some(epoch),
        capability: host,
        after: None,
    })
    .await;
    assert_eq!(
        rejected(&a.until(result("t3")).await).0,
        RejectCode::BadRequest
    );
    let after = srv.app.store.room(&room).await.unwrap().unwrap();
    assert_eq!((after.seq, after.epoch), (before.seq, before.epoch));
    assert_eq!(after.epoch, epoch);
}

#[tokio::test]
async fn a_burst_of_commands_on_one_socket_is_answered_in_order() {
    // Alice echoes no probe here: her lease must outlast 40 commits on a loaded machine.
    let srv = start(hostlease_server::Config {
        lease_ms: 6000,
        ..test_config()
    })
    .await;
    let mut a = srv.raw("burst", "alice", true).await;
    let g = wait_host(&mut a).await;
    // Sent back to back without waiting: the server reads on while earlier ones commit. One in
    // the middle carries a stale epoch and one reuses a key with another payload.
    const N: usize = 40;
    for i in 0..N {
        let (id, epoch, n) = match i {
            13 => (
                "c13".to_string(),
                Some(Epoch(g.epoch.0 + 1)),
                "c13".to_string(),
            ),
            27 => ("c5".to_string(), Some(g.epoch), "other".to_string()),
            _ => (format!("c{i}"), Some(g.epoch), format!("c{i}")),
        };
        a.send(&ClientMsg::Command {
            id: key(&id),
            action: Action::new("poll.open").unwrap(),
            payload: serde_json::json!({ "n": n }).into(),
            epoch,
            capability: g.host.clone(),
            after: None,
        })
        .await;
    }
    let mut answers = Vec::new();
    while answers.len() < N {
        let m = a
            .until(|m| match m {
                ServerMsg::CommandResult { id, outcome } => Some((id.clone(), outcome.clone())),
                _ => None,
            })
            .await;
        answers.push(m);
    }
    let mut last_seq = 0;
    for (i, (id, outcome)) in answers.iter().enumerate() {
        match i {
            13 => assert_eq!(rejected(outcome).0, RejectCode::StaleEpoch),
            27 => {
                assert_eq!(id, &key("c5"));
                assert_eq!(rejected(outcome).0, RejectCode::IdempotencyConflict);
            }
            _ => {
                assert_eq!(id, &key(&format!("c{i}")), "answers come in the order sent");
                let Outcome::Accepted { seq } = outcome else {
                    panic!("{i}: {outcome:?}")
                };
                if last_seq > 0 {
                    assert_eq!(seq.0, last_seq + 1, "{i}: decided in the order sent");
                }
                last_seq = seq.0;
            }
        }
    }
    let row = srv
        .app
        .store
        .room(&RoomId::new("burst").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.seq.0, last_seq, "the rejected ones changed nothing");
}

/// The value of an unlabelled series in a Prometheus text page (0 when absent).
fn metric(page: &str, name: &str) -> f64 {
    page.lines()
        .filter_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn probe_round_trips_reconnects_and_epoch_ahead_claims_are_measured() {
    let srv = start(test_config()).await;
    let page = || srv.metrics();
    // The recorder is process-wide (other tests run beside this one): compare before and after.
    let before = page().await;
    let mut a = srv.raw("obs", "alice", true).await;
    let g = wait_host(&mut a).await; // answered a probe: one round trip measured
    let ahead = Epoch(g.epoch.0 + 5);
    let o = cmd(&mut a, "far", "poll.open", Some(ahead), &g.host).await;
    assert_eq!(rejected(&o).0, RejectCode::StaleEpoch);
    // A reconnect: a hello from a client that had a view (a first hello with a resume cursor,
    // as the SDK sends to replay the history, is not one).
    let mut b = Raw {
        ws: connect(srv.addr, "obs").await,
        seen: vec![],
        tokens: vec![],
    };
    b.send(&ClientMsg::Hello {
        token: join_token(&srv.app_key, "obs", "bob", false),
        resume: Some(hostlease::protocol::Seq(0)),
        epoch_seen: Some(g.epoch),
    })
    .await;
    b.until(|m| matches!(m, ServerMsg::Welcome { .. }).then_some(()))
        .await;
    let after = page().await;
    for name in [
        "hostlease_probe_rtt_seconds_count",
        "hostlease_epoch_ahead_claims_total",
        "hostlease_reconnects_total",
    ] {
        assert!(
            metric(&after, name) >= metric(&before, name) + 1.0,
            "{name} did not move:\n{after}"
        );
    }
}

/// A payload the SDK would not send is refused `bad_request`, over either transport: one nested
/// deeper than `MAX_PAYLOAD_DEPTH` (accepted, a 127-deep vote made every welcome that replayed
/// it, 129 deep, undecodable: each client resuming past it was locked out of the room), or
/// longer than `MAX_CLIENT_PAYLOAD`. A 64-deep one is accepted, and a joiner's replay of it
/// decodes.
#[tokio::test]
async fn a_payload_too_deep_or_too_long_is_refused_and_replays_stay_decodable() {
    use hostlease::protocol::codec::{MAX_CLIENT_PAYLOAD, MAX_PAYLOAD_DEPTH};
    use hostlease::protocol::{Item, Json};
    let srv = start(test_config()).await;
    let mut b = srv.raw("deep", "bob", false).await;
    let p = b.participant_token().await;
    let nested = |d: usize| Json::parse(&format!("{}{}", "[".repeat(d), "]".repeat(d))).unwrap();
    let mut send = async |id: &str, payload: Json| {
        b.send(&ClientMsg::Command {
            id: key(id),
            action: Action::new("vote").unwrap(),
            payload,
            epoch: None,
            capability: p.clone(),
            after: None,
        })
        .await;
        let want = key(id);
        b.until(|m| match m {
            ServerMsg::CommandResult { id, outcome } if *id == want => Some(outcome.clone()),
            _ => None,
        })
        .await
    };
    let ok = send("d64", nested(MAX_PAYLOAD_DEPTH)).await;
    assert!(matches!(ok, Outcome::Accepted { .. }), "{ok:?}");
    for (id, payload) in [
        ("d65", nested(MAX_PAYLOAD_DEPTH + 1)),
        ("d127", nested(127)),
        (
            "long",
            Json::parse(&format!("\"{}\"", "x".repeat(MAX_CLIENT_PAYLOAD - 1))).unwrap(),
        ),
    ] {
        let o = send(id, payload).await;
        assert_eq!(rejected(&o).0, RejectCode::BadRequest, "{id}");
    }
    let r = reqwest::Client::new()
        .post(format!("http://{}/v1/rooms/deep/commands", srv.addr))
        .bearer_auth(p.expose())
        .header("Idempotency-Key", "h127")
        .header("content-type", "application/json")
        .body(format!(
            "{{\"action\":\"vote\",\"payload\":{}}}",
            nested(127).as_str()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    // A joiner replaying the room's history decodes its welcome (`next` panics otherwise).
    let mut c = Raw::join(
        srv.addr,
        "deep",
        &join_token(&srv.app_key, "deep", "cy", false),
        Some(0),
    )
    .await;
    let missed = c
        .until(|m| match m {
            ServerMsg::Welcome { missed, .. } => Some(missed.clone()),
            _ => None,
        })
        .await;
    let deepest = missed
        .iter()
        .filter_map(|i| match i {
            Item::Event(e) => Some(e.payload.depth()),
            _ => None,
        })
        .max();
    assert_eq!(deepest, Some(MAX_PAYLOAD_DEPTH));
}

/// A store too far behind answers an HTTP command 503 with its retry time in `Retry-After` too
/// (it was in the body only; an HTTP client reads the header).
#[tokio::test]
async fn a_busy_store_s_503_carries_retry_after() {
    let srv = start_with(test_config(), |s| s.max_queued_commands = 0).await;
    let mut m = srv.raw("busy", "mallory", false).await;
    let cap = m.participant_token().await;
    let r = reqwest::Client::new()
        .post(format!("http://{}/v1/rooms/busy/commands", srv.addr))
        .bearer_auth(cap.expose())
        .header("Idempotency-Key", "k1")
        .json(&serde_json::json!({"action": "vote", "payload": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["code"], "unavailable", "{body}");
    assert_eq!(body["retry_after_ms"], 500, "{body}");
}

/// A burst of votes made at once through the SDK's core against the real server, some large
/// enough to run past the room's payload bytes while small ones behind them still fit: they go
/// pipelined (`PIPELINE` out at a time), the server refuses a large one to retry later while
/// those behind it are on the wire and holds those (`after`), and every vote is applied exactly
/// once, in the order made. (Without the hold, the small ones behind a refused large one were
/// applied before it.)
#[tokio::test]
async fn a_burst_of_votes_past_the_room_s_bytes_is_applied_once_in_the_order_made() {
    let srv = start(Config {
        msg_rate: 1000.0,
        msg_burst: 1000.0,
        room_bytes_rate: 20_000.0,
        room_bytes_burst: 40_000.0,
        ..test_config()
    })
    .await;
    let token = join_token(&srv.app_key, "burst", "bob", false);
    let mut b = Sdk::join(srv.addr, "burst", token).await;
    let n = 3 * hostlease::core::PIPELINE;
    let made: Vec<String> = (0..n).map(|i| format!("v{i}")).collect();
    for (i, v) in made.iter().enumerate() {
        // Every fifth 15 kB: the burst takes two, and the third waits for the bytes.
        let pad = if i % 5 == 4 { 15_000 } else { 10 };
        let now = b.now();
        b.view
            .command(
                now,
                Action::new("vote").unwrap(),
                serde_json::json!({ "v": v, "pad": "x".repeat(pad) }).into(),
                None,
            )
            .unwrap();
    }
    b.flush().await;
    let decided = |s: &Sdk| {
        s.events
            .iter()
            .filter(|e| {
                matches!(
                    e,
                    hostlease::core::Event::CommandAccepted { .. }
                        | hostlease::core::Event::CommandFailed { .. }
                )
            })
            .count()
    };
    b.pump_until("every vote decided", |s| decided(s) == n)
        .await;
    let failed: Vec<_> = b
        .events
        .iter()
        .filter(|e| matches!(e, hostlease::core::Event::CommandFailed { .. }))
        .collect();
    assert!(failed.is_empty(), "{failed:?}");
    let applied: Vec<String> = b
        .events
        .iter()
        .filter_map(|e| match e {
            hostlease::core::Event::RoomEvent(e) => e.payload.get_str("v"),
            _ => None,
        })
        .collect();
    assert_eq!(applied, made);
}
