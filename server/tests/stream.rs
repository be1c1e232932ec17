//! The room stream: welcome and resume (with and without a gap), signalling, presence, limits
//! and abusive clients, signed assignments and the HTTP read API.

mod common;

use std::time::Duration;

use base64::Engine;
use common::*;
use ed25519_dalek::{Signature, VerifyingKey};
use hostlease::protocol::{
    codec::{signing_bytes, MAX_CLIENT_FRAME},
    Action, ClientMsg, Epoch, ErrorCode, IdempotencyKey, InboxPage, Item, KeySet, Outcome,
    ParticipantId, RejectCode, Role, RoomId, Seq, ServerMsg, SessionId, Snapshot, Token,
};
use hostlease_server::store::{
    CommandDone, CommandReq, Delivery, GrantOutcome, GrantReq, Pending, Renewed, RoomRow,
    SqliteStore, StoreResult, Swept,
};
use hostlease_server::tokens::{JoinClaims, Keypair, JOIN_PREFIX};

async fn ptoken(r: &mut Raw) -> Token {
    r.until(|m| match m {
        ServerMsg::Capability {
            role: Role::Participant,
            token,
            ..
        } => Some(token.clone()),
        _ => None,
    })
    .await
}

fn vote_frame(p: &Token, id: &str, payload: serde_json::Value) -> ClientMsg {
    ClientMsg::Command {
        id: IdempotencyKey::new(id).unwrap(),
        action: Action::new("vote").unwrap(),
        payload: payload.into(),
        epoch: None,
        capability: p.clone(),
        after: None,
    }
}

/// A vote posted to the HTTP command endpoint with capability `cap`.
async fn post_vote(srv: &TestServer, room: &str, cap: &str, key: &str) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("http://{}/v1/rooms/{room}/commands", srv.addr))
        .bearer_auth(cap)
        .header("Idempotency-Key", key)
        .json(&serde_json::json!({"action": "vote", "payload": {"n": 1}}))
        .send()
        .await
        .unwrap()
}

/// Reads until the result of command `id`.
/// The vote `{"id": id}` under key `id`, sent after the command `after` names.
fn vote_after(p: &Token, id: &str, after: Option<&str>) -> ClientMsg {
    let mut m = vote_frame(p, id, serde_json::json!({ "id": id }));
    if let ClientMsg::Command { after: a, .. } = &mut m {
        *a = after.map(|a| IdempotencyKey::new(a).unwrap());
    }
    m
}

/// The code of a refusal, `None` for an accepted command.
fn refusal(o: &Outcome) -> Option<RejectCode> {
    match o {
        Outcome::Rejected { code, .. } => Some(*code),
        Outcome::Accepted { .. } => None,
    }
}

async fn result_of(r: &mut Raw, id: &str) -> Outcome {
    let want = IdempotencyKey::new(id).unwrap();
    r.until(|m| match m {
        ServerMsg::CommandResult { id, outcome } if *id == want => Some(outcome.clone()),
        _ => None,
    })
    .await
}

async fn vote(r: &mut Raw, p: &Token, id: &str) -> Seq {
    r.send(&vote_frame(p, id, serde_json::json!({"id": id})))
        .await;
    match result_of(r, id).await {
        Outcome::Accepted { seq } => seq,
        o => panic!("{o:?}"),
    }
}

fn welcome(m: &ServerMsg) -> Option<(Snapshot, Vec<Item>, Option<hostlease::protocol::Gap>)> {
    match m {
        ServerMsg::Welcome {
            snapshot,
            missed,
            discontinuity,
            ..
        } => Some((snapshot.clone(), missed.clone(), *discontinuity)),
        _ => None,
    }
}

/// The SDK takes an accepted seq it has not seen on the stream for a lost event and resyncs (its
/// host has no authority until the welcome), so the sender gets its event before the result.
#[tokio::test]
async fn a_command_result_follows_its_event_on_the_senders_connection() {
    let srv = start(test_config()).await;
    let t = join_token(&srv.app_key, "order", "bob", false);
    let mut b = Raw::join(srv.addr, "order", &t, None).await;
    let p = ptoken(&mut b).await;
    for i in 0..20 {
        let seq = vote(&mut b, &p, &format!("v{i}")).await;
        let before = b
            .seen
            .iter()
            .any(|m| matches!(m, ServerMsg::Event(e) if e.seq == seq));
        assert!(
            before,
            "vote {i}: its result (seq {seq:?}) came before its event"
        );
    }
}

/// A client far behind a room with a large log gets the newest items that fit a welcome's replay
/// budget (1 MiB) and a gap for the rest, never a frame past its 4 MiB limit.
#[tokio::test]
async fn a_welcome_replays_at_most_its_byte_budget() {
    // More than a room's default burst of payload bytes, at once.
    let srv = start(hostlease_server::Config {
        room_bytes_burst: 1e9,
        ..test_config()
    })
    .await;
    let t = join_token(&srv.app_key, "big", "bob", false);
    let mut b = Raw::join(srv.addr, "big", &t, None).await;
    let p = ptoken(&mut b).await;
    let blob = "x".repeat(55_000);
    for i in 0..80 {
        // 80 events of 55 KB: 4.4 MB of log, past the client's frame limit in one welcome.
        let id = format!("big{i}");
        b.send(&vote_frame(&p, &id, serde_json::json!({ "blob": blob })))
            .await;
        let o = result_of(&mut b, &id).await;
        assert!(matches!(o, Outcome::Accepted { .. }), "{o:?}");
    }
    let mut c = Raw::join(srv.addr, "big", &t, Some(0)).await;
    let (snap, missed, gap) = c.until(welcome).await;
    let bytes: usize = missed
        .iter()
        .map(|i| hostlease::protocol::codec::encode_body(i).len())
        .sum();
    assert!(
        bytes <= 1 << 20 && bytes > (1 << 20) - 60_000,
        "{bytes} bytes replayed"
    );
    let seqs: Vec<u64> = missed.iter().map(|i| i.seq().0).collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    assert_eq!(seqs.last().copied(), Some(snap.seq.0));
    assert_eq!(
        gap,
        Some(hostlease::protocol::Gap {
            from: Seq(1),
            to: Seq(seqs[0] - 1)
        })
    );
}

#[tokio::test]
async fn resume_replays_missed_items_and_announces_a_gap() {
    let srv = start(test_config()).await;
    let t = join_token(&srv.app_key, "rs", "bob", false);
    let mut b = Raw::join(srv.addr, "rs", &t, None).await;
    let p = ptoken(&mut b).await;
    let mut last = Seq(0);
    for i in 0..5 {
        last = vote(&mut b, &p, &format!("v{i}")).await;
    }
    assert_eq!(last, Seq(5));
    // Reconnect resuming after seq 2: items 3..=5 are replayed, in order, and nothing else.
    // The vote's result follows its event, but the server waits for the outbox worker only so
    // long (the snapshot is taken at the subscription point), so join until it has caught up.
    let mut attempts = 0;
    let (mut c, snap, missed, gap) = loop {
        let mut c = Raw::join(srv.addr, "rs", &t, Some(2)).await;
        let (snap, missed, gap) = c.until(welcome).await;
        attempts += 1;
        if snap.seq == Seq(5) || attempts == 100 {
            break (c, snap, missed, gap);
        }
        drop(c);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(snap.seq, Seq(5));
    assert_eq!(
        missed.iter().map(|i| i.seq().0).collect::<Vec<_>>(),
        vec![3, 4, 5]
    );
    assert_eq!(gap, None);
    // A live `resume` frame answers with a fresh welcome.
    c.send(&ClientMsg::Resume { cursor: Seq(4) }).await;
    let (snap, missed, _) = c.until(welcome).await;
    assert_eq!(snap.seq, Seq(5));
    assert_eq!(missed.len(), 1);

    // Trim the log to its newest 2 items: resuming from 0 announces 1..=3 as a gap.
    srv.app.store.housekeeping(2, false).await.unwrap();
    let mut d = Raw::join(srv.addr, "rs", &t, Some(0)).await;
    let (_, missed, gap) = d.until(welcome).await;
    let gap = gap.expect("a discontinuity");
    assert_eq!((gap.from, gap.to), (Seq(1), Seq(3)));
    assert_eq!(
        missed.iter().map(|i| i.seq().0).collect::<Vec<_>>(),
        vec![4, 5]
    );
}

#[tokio::test]
async fn presence_and_signalling_stay_in_the_room() {
    let srv = start(test_config()).await;
    let mut a = srv.raw("sg", "alice", false).await;
    let _ = ptoken(&mut a).await;
    let mut b = srv.raw("sg", "bob", false).await;
    let _ = ptoken(&mut b).await;
    let mut x = srv.raw("other", "bob", false).await;
    let _ = ptoken(&mut x).await;
    a.until(|m| match m {
        ServerMsg::Presence {
            member,
            online: true,
        } if member.id.as_str() == "bob" => Some(()),
        _ => None,
    })
    .await;
    a.send(&ClientMsg::Signal {
        to: hostlease::protocol::ParticipantId::new("bob").unwrap(),
        to_session: None,
        data: serde_json::json!({"sdp": "offer"}).into(),
    })
    .await;
    let (from, data) = b
        .until(|m| match m {
            ServerMsg::Signal { from, data, .. } => Some((from.clone(), data.clone())),
            _ => None,
        })
        .await;
    assert_eq!(from.as_str(), "alice");
    assert_eq!(data.value().unwrap()["sdp"], "offer");
    // The "bob" of another room gets nothing.
    while let Some(m) = x.next(Duration::from_millis(300)).await {
        assert!(
            !matches!(m, ServerMsg::Signal { .. }),
            "signal leaked across rooms"
        );
    }
    b.send(&ClientMsg::Leave).await;
    a.until(|m| match m {
        ServerMsg::Presence {
            member,
            online: false,
        } if member.id.as_str() == "bob" => Some(()),
        _ => None,
    })
    .await;
}

/// A member's signals are held to a byte rate (`Config::signal_bytes_rate`, after its burst,
/// each delivery counted): past it they are dropped and counted, and another member's signals
/// still come. Only the flood limit held them (200 frames of 64 KiB a second a connection): one
/// member could keep another's queue full of its own.
#[tokio::test]
async fn a_members_signals_are_held_to_a_byte_rate() {
    let cfg = test_config();
    let (rate, burst) = (cfg.signal_bytes_rate, cfg.signal_bytes_burst);
    let srv = start(cfg).await;
    let mut a = srv.raw("sr", "alice", false).await;
    let _ = ptoken(&mut a).await;
    let mut c = srv.raw("sr", "carol", false).await;
    let _ = ptoken(&mut c).await;
    let mut b = srv.raw("sr", "bob", false).await;
    let _ = ptoken(&mut b).await;
    let signal = |data: serde_json::Value| ClientMsg::Signal {
        to: hostlease::protocol::ParticipantId::new("bob").unwrap(),
        to_session: None,
        data: data.into(),
    };
    let started = tokio::time::Instant::now();
    let sent = 60;
    for _ in 0..sent {
        a.send(&signal(serde_json::json!("x".repeat(60_000)))).await;
    }
    let (mut got, mut len) = (0, 0);
    while let Some(m) = b.next(Duration::from_millis(500)).await {
        if let ServerMsg::Signal { .. } = &m {
            got += 1;
            len = hostlease::protocol::codec::encode_server(&m).len();
        }
    }
    // The burst's worth, and what the rate refilled while they came (a bound read off the
    // clock, never a deadline).
    let burst = (burst / len as f64).floor() as usize;
    let refilled = started.elapsed().as_secs_f64() * rate / len as f64;
    assert!(
        got >= burst,
        "{got} of {sent}: less than the burst ({burst})"
    );
    assert!(
        (got as f64) <= burst as f64 + refilled.ceil(),
        "{got} of {sent} in {:?}: more than the burst ({burst}) and the rate",
        started.elapsed()
    );
    let page = srv.metrics().await;
    assert!(
        page.contains("hostlease_signals_dropped_total"),
        "the drops are counted"
    );
    // Carol's signals are hers to spend.
    c.send(&signal(serde_json::json!({"sdp": "offer"}))).await;
    let from = b
        .until(|m| match m {
            ServerMsg::Signal { from, .. } => Some(from.clone()),
            _ => None,
        })
        .await;
    assert_eq!(from.as_str(), "carol");
}

#[tokio::test]
async fn abusive_clients_get_a_typed_error_and_a_close_without_affecting_others() {
    let cfg = hostlease_server::Config {
        msg_rate: 5.0,
        msg_burst: 10.0,
        ..test_config()
    };
    let srv = start(cfg).await;
    let mut good = srv.raw("ok", "g", false).await;
    let gp = ptoken(&mut good).await;

    // Not a hello first.
    let mut c = Raw {
        ws: connect(srv.addr, "bad").await,
        seen: vec![],
        tokens: vec![],
    };
    c.send(&ClientMsg::Leave).await;
    assert_eq!(c.until_closed().await, Some(ErrorCode::UnexpectedMessage));
    // Malformed.
    let mut c = Raw {
        ws: connect(srv.addr, "bad").await,
        seen: vec![],
        tokens: vec![],
    };
    c.send_text("{not json".into()).await;
    assert_eq!(c.until_closed().await, Some(ErrorCode::BadFrame));
    // Unknown major version.
    let mut c = Raw {
        ws: connect(srv.addr, "bad").await,
        seen: vec![],
        tokens: vec![],
    };
    c.send_text(r#"{"v":9,"t":"hello","token":"x"}"#.into())
        .await;
    assert_eq!(c.until_closed().await, Some(ErrorCode::UnsupportedVersion));
    // Forged join token.
    let forged = hostlease_server::tokens::Keypair::generate(srv.app_key.kid.as_str());
    let mut c = Raw::join(
        srv.addr,
        "bad",
        &join_token(&forged, "bad", "eve", true),
        None,
    )
    .await;
    assert_eq!(c.until_closed().await, Some(ErrorCode::Unauthorized));
    // A join token for another room.
    let mut c = Raw::join(
        srv.addr,
        "bad",
        &join_token(&srv.app_key, "elsewhere", "eve", true),
        None,
    )
    .await;
    assert_eq!(c.until_closed().await, Some(ErrorCode::Unauthorized));
    // Oversized frame on a live socket.
    let mut c = srv.raw("bad", "big", false).await;
    let _ = ptoken(&mut c).await;
    let big = format!(
        r#"{{"v":1,"t":"signal","to":"x","data":"{}"}}"#,
        "a".repeat(MAX_CLIENT_FRAME + 10)
    );
    c.send_text(big).await;
    assert_eq!(c.until_closed().await, Some(ErrorCode::FrameTooLarge));
    // Past the transport's own limit (twice the protocol's): the same typed error, live and as
    // the first frame (it was a dropped connection, and `unexpected_message` before a hello).
    let huge = format!(
        r#"{{"v":1,"t":"signal","to":"x","data":"{}"}}"#,
        "a".repeat(2 * MAX_CLIENT_FRAME + 10)
    );
    let mut c = srv.raw("bad", "huge", false).await;
    let _ = ptoken(&mut c).await;
    c.send_text(huge.clone()).await;
    assert_eq!(c.until_closed().await, Some(ErrorCode::FrameTooLarge));
    let mut c = Raw {
        ws: connect(srv.addr, "bad").await,
        seen: vec![],
        tokens: vec![],
    };
    c.send_text(huge).await;
    assert_eq!(c.until_closed().await, Some(ErrorCode::FrameTooLarge));
    // Flooding (with frames that cost nothing to answer: a burst of resumes is paced instead,
    // and the paced reads leave the rest waiting in the socket).
    let mut c = srv.raw("bad", "flood", false).await;
    let _ = ptoken(&mut c).await;
    // (Past the flood burst's floor of 320 frames.)
    for _ in 0..1000 {
        if !c
            .send_text(r#"{"v":1,"t":"lease_echo","nonce":1}"#.into())
            .await
        {
            break;
        }
    }
    assert_eq!(c.until_closed().await, Some(ErrorCode::RateLimited));

    // The well-behaved client in another room still works.
    let seq = vote(&mut good, &gp, "still-fine").await;
    assert_eq!(seq, Seq(1));
}

#[tokio::test]
async fn assignments_are_signed_and_http_reads_work() {
    let srv = start(test_config()).await;
    let mut a = Sdk::join(
        srv.addr,
        "sig",
        join_token(&srv.app_key, "sig", "alice", true),
    )
    .await;
    a.pump_until("alice host", |s| s.has_authority()).await;
    let http = reqwest::Client::new();
    let base = format!("http://{}", srv.addr);
    let keys: KeySet = http
        .get(format!("{base}/v1/keys"))
        .send()
        .await
        .unwrap()
        .protocol()
        .await;
    assert_eq!(keys.keys.len(), 1);
    assert_eq!(keys.keys[0].alg, "Ed25519");
    let x = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(&keys.keys[0].x)
        .unwrap();
    let vk = VerifyingKey::from_bytes(&x.try_into().unwrap()).unwrap();

    // The snapshot names the members: it is read with a join token for the room (a participant)
    // or the admin key (the app backend), not by anyone who knows the room id.
    let status = |auth: Option<String>| {
        let mut req = http.get(format!("{base}/v1/rooms/sig"));
        if let Some(a) = auth {
            req = req.bearer_auth(a);
        }
        async move { req.send().await.unwrap().status().as_u16() }
    };
    let other_room = join_token(&srv.app_key, "other", "bob", false);
    let expired = {
        let claims = JoinClaims {
            room: RoomId::new("sig").unwrap(),
            sub: ParticipantId::new("bob").unwrap(),
            name: String::new(),
            may_host: false,
            exp: hostlease_server::tokens::now_ms() - 1,
            kid: srv.app_key.kid.clone(),
        };
        srv.app_key.sign_token(JOIN_PREFIX, &claims)
    };
    assert_eq!(status(None).await, 401);
    assert_eq!(status(Some("admin-secret-key-123".into())).await, 403);
    assert_eq!(status(Some(other_room.expose().into())).await, 403);
    assert_eq!(status(Some(expired)).await, 403);
    assert_eq!(status(Some("admin-secret-key-1234".into())).await, 200);
    let bob = join_token(&srv.app_key, "sig", "bob", false);
    let snap: Snapshot = http
        .get(format!("{base}/v1/rooms/sig"))
        .bearer_auth(bob.expose())
        .send()
        .await
        .unwrap()
        .protocol()
        .await;
    assert_eq!(
        snap.current.assignment.host.as_ref().unwrap().as_str(),
        "alice"
    );
    assert_eq!(snap.current.kid.as_ref(), Some(&keys.keys[0].kid));
    let sig = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(snap.current.sig.as_ref().unwrap())
        .unwrap();
    vk.verify_strict(
        &signing_bytes(&snap.current.assignment),
        &Signature::from_slice(&sig).unwrap(),
    )
    .expect("assignment signature verifies against /v1/keys");
    assert!(snap
        .actions
        .host
        .iter()
        .any(|a| a.as_str() == "host.resign"));
    assert!(snap
        .actions
        .participant
        .iter()
        .any(|a| a.as_str() == "vote"));
    assert_eq!(snap.members.len(), 1);

    assert_eq!(
        http.get(format!("{base}/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let m = srv.metrics().await;
    assert!(m.contains("hostlease_assignments_total"), "{m}");
    // The admin API wants its key.
    let r = http
        .post(format!("{base}/v1/admin/rooms/sig/close"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
}

#[tokio::test]
async fn offline_members_get_a_durable_inbox() {
    let srv = start(test_config()).await;
    let tb = join_token(&srv.app_key, "ib", "bob", false);
    let mut b = Raw::join(srv.addr, "ib", &tb, None).await;
    let _ = ptoken(&mut b).await;
    b.send(&ClientMsg::Leave).await;
    let _ = b.until_closed().await;
    let mut c = srv.raw("ib", "carol", false).await;
    let p = ptoken(&mut c).await;
    // Wait until bob is gone from the membership, then act.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let seq = vote(&mut c, &p, "while-bob-away").await;
    inbox_with(&srv, "ib", &tb, seq).await;
}

/// A member whose page was reloaded (a fresh hello, no cursor) before the notifier ran gets what
/// was committed while it was gone in its inbox: its welcome came after it, and the stream only
/// carries what follows. A member connected all along does not.
#[tokio::test]
async fn a_member_back_before_the_notifier_ran_still_gets_what_it_missed() {
    // The notifier runs every 2 s: bob is back long before it looks.
    let srv = start(hostlease_server::Config {
        sweep_ms: 1000,
        ..test_config()
    })
    .await;
    let tb = join_token(&srv.app_key, "ib2", "bob", false);
    let mut c = srv.raw("ib2", "carol", false).await;
    let p = ptoken(&mut c).await;
    let mut b = Raw::join(srv.addr, "ib2", &tb, None).await;
    let _ = ptoken(&mut b).await;
    b.send(&ClientMsg::Leave).await;
    let _ = b.until_closed().await;
    let seq = vote(&mut c, &p, "while-bob-away").await;
    let mut b = Raw::join(srv.addr, "ib2", &tb, None).await;
    let _ = ptoken(&mut b).await;
    inbox_with(&srv, "ib2", &tb, seq).await;
    // Written in the same pass: carol, connected throughout, got it live and has no entry.
    let tc = join_token(&srv.app_key, "ib2", "carol", false);
    let page: InboxPage = reqwest::Client::new()
        .get(format!("http://{}/v1/rooms/ib2/inbox?since=0", srv.addr))
        .bearer_auth(tc.expose())
        .send()
        .await
        .unwrap()
        .protocol()
        .await;
    assert!(page.entries.iter().all(|e| e.item.seq() != seq), "{page:?}");
    drop(b);
}

/// The notifier works off a backlog of more than one batch (256 rows) batch after batch, not one
/// batch per pause: it paused before every batch, so that a process committing more than 1,280
/// rows a second fell behind for good. Here its pause is 2 s and the backlog six batches: it is
/// worked off with the first pause and the one after the last batch (a few more only if this
/// test polls seconds late), where a pause per batch made six.
#[tokio::test]
async fn a_backlog_past_one_batch_is_notified_without_pausing_between_batches() {
    let (dir, store) = fresh_store().await;
    let room = RoomId::new("backlog").unwrap();
    let bob = ParticipantId::new("bob").unwrap();
    hostlease_server::store::Store::remember_participant(&store, &room, &bob)
        .await
        .unwrap();
    backlog(&store, "backlog", 1300).await;
    let srv = start_on(
        hostlease_server::Config {
            sweep_ms: 1000,
            ..test_config()
        },
        dir,
        store,
    )
    .await;
    let db = srv.db().await;
    until_notified(&db).await;
    let pauses = srv
        .app
        .pauses
        .notifier
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM inbox WHERE participant = 'bob'").await,
        1300
    );
    assert!(pauses < 6, "{pauses} pauses for six batches");
}

/// A host's lease echoes answer the server's own probes and do not count against its flood
/// limit: with a low message rate and a short lease, the echoes alone (two a second here,
/// against a flood refill of 0.8) drained it and the healthy host was closed `rate_limited`.
#[tokio::test]
async fn lease_echoes_do_not_count_against_the_flood_limit() {
    let srv = start(hostlease_server::Config {
        msg_rate: 0.2,
        msg_burst: 1.0,
        lease_ms: 1500,
        ..test_config()
    })
    .await;
    let mut a = srv.raw("echoes", "alice", true).await;
    // The flood burst spent but for a few frames first (its floor would take minutes of echoes
    // to drain).
    use futures_util::SinkExt;
    for _ in 0..hostlease_server::ws::FLOOD_MIN_BURST as usize - 4 {
        let ping = tokio_tungstenite::tungstenite::Message::Ping(vec![1u8].into());
        a.ws.send(ping).await.unwrap();
    }
    let until = tokio::time::Instant::now() + Duration::from_secs(8);
    let mut echoed = 0;
    while let Some(left) = until
        .checked_duration_since(tokio::time::Instant::now())
        .filter(|d| !d.is_zero())
    {
        match a.next(left).await {
            Some(ServerMsg::LeaseProbe { nonce, .. }) => {
                a.send(&ClientMsg::LeaseEcho { nonce }).await;
                echoed += 1;
            }
            Some(ServerMsg::Error { code, .. }) => panic!("{code:?} after {echoed} echoes"),
            Some(_) => {}
            None if tokio::time::Instant::now() < until => panic!("closed after {echoed} echoes"),
            None => break,
        }
    }
    assert!(echoed >= 10, "{echoed} probes answered in 8 s");
}

/// A browser app on another origin may read snapshots, its inbox (with its token in the
/// `Authorization` header) and the keys; it may not reach commands or the admin API.
#[tokio::test]
async fn browser_reads_allow_other_origins_and_nothing_else_does() {
    let srv = start(test_config()).await;
    let http = reqwest::Client::new();
    let base = format!("http://{}", srv.addr);
    let preflight = |path: &str, method: &str, headers: &str| {
        http.request(reqwest::Method::OPTIONS, format!("{base}{path}"))
            .header("origin", "https://app.example")
            .header("access-control-request-method", method)
            .header("access-control-request-headers", headers)
            .send()
    };
    let r = preflight("/v1/rooms/co/inbox", "GET", "authorization")
        .await
        .unwrap();
    let h = r.headers();
    assert_eq!(h["access-control-allow-origin"], "*");
    assert!(h["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .contains("authorization"));
    assert!(h.get("access-control-allow-credentials").is_none());
    for path in ["/v1/keys", "/v1/rooms/co"] {
        let r = http
            .get(format!("{base}{path}"))
            .header("origin", "https://app.example")
            .send()
            .await
            .unwrap();
        assert_eq!(r.headers()["access-control-allow-origin"], "*", "{path}");
    }
    for path in [
        "/v1/rooms/co/commands",
        "/v1/admin/rooms/co/close",
        "/no/such/path",
    ] {
        let r = preflight(path, "POST", "authorization").await.unwrap();
        assert!(
            r.headers().get("access-control-allow-origin").is_none(),
            "{path} is open to other origins"
        );
    }
}

#[tokio::test]
async fn migrations_apply_to_an_empty_database() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("fresh.db").display());
    // Every file of `migrations/`, each once.
    let files = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations"))
        .unwrap()
        .count() as i64;
    let s = hostlease_server::store::SqliteStore::open(&url)
        .await
        .unwrap();
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM _sqlx_migrations WHERE success = 1")
        .fetch_one(s.pool())
        .await
        .unwrap();
    assert_eq!(n, files);
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(s.pool())
        .await
        .unwrap();
    assert_eq!(mode, "wal");
    let sync: i64 = sqlx::query_scalar("PRAGMA synchronous")
        .fetch_one(s.pool())
        .await
        .unwrap();
    assert_eq!(sync, 2, "synchronous=FULL");
    drop(s);
    // Opening again applies nothing new and keeps the data.
    let s = hostlease_server::store::SqliteStore::open(&url)
        .await
        .unwrap();
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM _sqlx_migrations")
        .fetch_one(s.pool())
        .await
        .unwrap();
    assert_eq!(n, files);
}

#[tokio::test]
async fn room_member_and_http_limits() {
    let cfg = hostlease_server::Config {
        max_rooms: 1,
        max_members: 1,
        http_rate: 1.0,
        http_burst: 3.0,
        ..test_config()
    };
    let srv = start(cfg).await;
    let mut a = srv.raw("one", "a", false).await;
    let _ = ptoken(&mut a).await;
    let mut b = srv.raw("one", "b", false).await;
    assert_eq!(b.until_closed().await, Some(ErrorCode::RoomFull));
    let mut c = srv.raw("two", "c", false).await;
    assert_eq!(c.until_closed().await, Some(ErrorCode::TooManyRooms));
    // The first member is unaffected.
    a.send(&ClientMsg::Resume { cursor: Seq(0) }).await;
    a.until(welcome).await;
    let http = reqwest::Client::new();
    let mut statuses = Vec::new();
    let mut retry_after = None;
    for _ in 0..6 {
        let r = http
            .get(format!("http://{}/v1/keys", srv.addr))
            .header("origin", "https://app.example")
            .send()
            .await
            .unwrap();
        if r.status() == 429 {
            retry_after = r
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().to_string());
            // A page on another origin can read the refusal and when to come back.
            assert_eq!(r.headers()["access-control-allow-origin"], "*");
            let exposed = r.headers()["access-control-expose-headers"]
                .to_str()
                .unwrap();
            assert!(exposed.contains("retry-after"), "{exposed}");
        }
        statuses.push(r.status().as_u16());
    }
    assert!(statuses.contains(&429), "{statuses:?}");
    // (The WebSocket upgrades above count against the same per-address bucket.)
    let secs: u64 = retry_after.expect("Retry-After").parse().unwrap();
    assert!(secs >= 1);
}

/// A command with a capability not signed by this server is refused as such before any room is
/// loaded: with every room slot taken it is 403 `bad_capability`, not 503 "too many rooms".
#[tokio::test]
async fn a_forged_command_loads_no_room() {
    let srv = start(hostlease_server::Config {
        max_rooms: 1,
        ..test_config()
    })
    .await;
    let mut a = srv.raw("one", "a", false).await;
    let _ = ptoken(&mut a).await;
    let forged = Keypair::generate(srv.app.keys.kid.as_str());
    let claims = hostlease_server::tokens::CapClaims {
        room: RoomId::new("two").unwrap(),
        sub: ParticipantId::new("c").unwrap(),
        sid: SessionId::new("s-1").unwrap(),
        role: Role::Host,
        epoch: Some(Epoch(1)),
        actions: vec![],
        exp: hostlease_server::tokens::now_ms() + 60_000,
        sat: 0,
        kid: srv.app.keys.kid.clone(),
    };
    let r = reqwest::Client::new()
        .post(format!("http://{}/v1/rooms/two/commands", srv.addr))
        .bearer_auth(forged.sign_token(hostlease_server::tokens::CAP_PREFIX, &claims))
        .header("Idempotency-Key", "forged-1")
        .json(&serde_json::json!({"action": "poll.open", "payload": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let o: Outcome = r.protocol().await;
    assert!(
        matches!(
            o,
            Outcome::Rejected {
                code: RejectCode::BadCapability,
                ..
            }
        ),
        "{o:?}"
    );
}

/// A command whose room cannot be loaded (every room slot taken) gives back the command-rate
/// token it was charged: with a burst of one, the retry of a 503 was refused 429 `rate_limited`
/// for a command that never reached a room.
#[tokio::test]
async fn a_command_whose_room_cannot_be_loaded_keeps_its_rate_token() {
    let srv = start(hostlease_server::Config {
        max_rooms: 1,
        msg_rate: 0.01,
        msg_burst: 1.0,
        ..test_config()
    })
    .await;
    let mut a = srv.raw("one", "a", false).await;
    let _ = ptoken(&mut a).await;
    let claims = hostlease_server::tokens::CapClaims {
        room: RoomId::new("two").unwrap(),
        sub: ParticipantId::new("c").unwrap(),
        sid: SessionId::new("s-1").unwrap(),
        role: Role::Participant,
        epoch: None,
        actions: vec![Action::new("vote").unwrap()],
        exp: hostlease_server::tokens::now_ms() + 60_000,
        sat: 0,
        kid: srv.app.keys.kid.clone(),
    };
    let token = srv
        .app
        .keys
        .sign_token(hostlease_server::tokens::CAP_PREFIX, &claims);
    for attempt in 0..3 {
        let r = reqwest::Client::new()
            .post(format!("http://{}/v1/rooms/two/commands", srv.addr))
            .bearer_auth(&token)
            .header("Idempotency-Key", "full-1")
            .json(&serde_json::json!({"action": "vote", "payload": 1}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 503, "attempt {attempt}");
    }
}

/// A probe's nonce is spent by its first echo: echoing it again renews nothing and is not
/// confirmed again.
#[tokio::test]
async fn a_probe_nonce_is_confirmed_once() {
    let srv = start(hostlease_server::Config {
        lease_ms: 6000,
        ..test_config()
    })
    .await;
    let mut a = srv.raw("once", "alice", true).await;
    let nonce = a
        .until(|m| match m {
            ServerMsg::LeaseProbe { nonce, .. } => Some(*nonce),
            _ => None,
        })
        .await;
    for _ in 0..3 {
        a.send(&ClientMsg::LeaseEcho { nonce }).await;
    }
    a.until(|m| matches!(m, ServerMsg::LeaseConfirm { nonce: n, .. } if *n == nonce).then_some(()))
        .await;
    // No second one in the next second (well within the next probe, ttl/3 = 2 s, which would
    // carry another nonce anyway).
    let deadline = tokio::time::Instant::now() + Duration::from_millis(1000);
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            break;
        }
        match a.next(left).await {
            Some(ServerMsg::LeaseConfirm { nonce: n, .. }) => {
                assert_ne!(n, nonce, "one confirmation (one renewal) per probe")
            }
            Some(_) => {}
            None => break,
        }
    }
}

/// A resume gets a fresh participant token after its welcome, as a hello does: the SDK resumes
/// when its token ran out with votes waiting (a sleep), and would otherwise wait for the refresh.
#[tokio::test]
async fn a_resume_brings_a_fresh_participant_token() {
    let srv = start(test_config()).await;
    let t = join_token(&srv.app_key, "fresh", "bob", false);
    let mut b = Raw::join(srv.addr, "fresh", &t, None).await;
    ptoken(&mut b).await;
    b.send(&ClientMsg::Resume { cursor: Seq(0) }).await;
    b.until(welcome).await;
    // The next refresh is minutes away (3/4 of the token's life): this one is the resume's.
    ptoken(&mut b).await;
}

fn probe(m: &ServerMsg) -> Option<u64> {
    match m {
        ServerMsg::LeaseProbe { nonce, .. } => Some(*nonce),
        _ => None,
    }
}

/// An echo slower than the probe interval still renews (the server keeps its last few probes,
/// as the client keeps its last few echoes); an older probe's echo after a newer one's does not.
#[tokio::test]
async fn an_echo_slower_than_the_probe_interval_still_renews() {
    // A probe every second: the newer probe's echo comes a second before the lease the first
    // echo renewed runs out (with 1.5 s leases, 500 ms: a loaded machine's stall away).
    let srv = start(hostlease_server::Config {
        lease_ms: 3000,
        ..test_config()
    })
    .await;
    let mut a = srv.raw("slow", "alice", true).await;
    let confirmed = |want: u64| {
        move |m: &ServerMsg| match m {
            ServerMsg::LeaseConfirm { nonce, .. } if *nonce == want => Some(()),
            _ => None,
        }
    };
    let first = a.until(probe).await;
    let _second = a.until(probe).await; // the first is still unanswered a whole interval later
    a.send(&ClientMsg::LeaseEcho { nonce: first }).await;
    a.until(confirmed(first)).await;
    let older = a.until(probe).await;
    let newer = a.until(probe).await;
    a.send(&ClientMsg::LeaseEcho { nonce: newer }).await;
    a.until(confirmed(newer)).await;
    a.send(&ClientMsg::LeaseEcho { nonce: older }).await;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(1000);
    while let Some(m) = a
        .next(deadline.saturating_duration_since(tokio::time::Instant::now()))
        .await
    {
        assert!(confirmed(older)(&m).is_none(), "a spent probe renewed");
    }
}

/// A renewal's host token comes before its confirm: the client's lease is held from the confirm
/// on, and it can act as host from that moment (the SDK's `lease: held` means authority).
#[tokio::test]
async fn a_renewal_sends_the_host_token_before_the_confirm() {
    let srv = start(test_config()).await;
    let mut a = srv.raw("order", "alice", true).await;
    for round in 0..2 {
        let nonce = a
            .until(|m| match m {
                ServerMsg::LeaseProbe { nonce, .. } => Some(*nonce),
                _ => None,
            })
            .await;
        a.send(&ClientMsg::LeaseEcho { nonce }).await;
        let mut host_token = false;
        loop {
            match a.next(Duration::from_secs(5)).await.expect("the confirm") {
                ServerMsg::Capability {
                    role: Role::Host, ..
                } => host_token = true,
                ServerMsg::LeaseConfirm { nonce: n, .. } if n == nonce => break,
                _ => {}
            }
        }
        assert!(
            host_token,
            "round {round}: the confirm came before the host token"
        );
    }
}

/// Commands past the connection's rate are refused `rate_limited` with a time to retry after,
/// spaced at the rate, and the connection stays open; the refused command goes through later.
#[tokio::test]
async fn commands_past_the_rate_are_refused_with_a_retry_time_not_closed() {
    let srv = start(hostlease_server::Config {
        msg_rate: 5.0,
        msg_burst: 10.0,
        ..test_config()
    })
    .await;
    let mut b = srv.raw("burst", "bob", false).await;
    let p = ptoken(&mut b).await;
    let send = |i: usize| vote_frame(&p, &format!("b{i}"), serde_json::json!({"id": i}));
    for i in 0..25 {
        b.send(&send(i)).await; // 25 frames: within the flood limit (4 × 10)
    }
    let mut outcomes = Vec::new();
    while outcomes.len() < 25 {
        outcomes.push(
            b.until(|m| match m {
                ServerMsg::CommandResult { id, outcome } => Some((id.clone(), outcome.clone())),
                _ => None,
            })
            .await,
        );
    }
    let accepted = outcomes
        .iter()
        .take_while(|(_, o)| matches!(o, Outcome::Accepted { .. }))
        .count();
    assert!((10..25).contains(&accepted), "{outcomes:?}");
    let waits: Vec<u64> = outcomes[accepted..]
        .iter()
        .map(|(_, o)| match o {
            Outcome::Rejected {
                code: RejectCode::RateLimited,
                retry_after_ms: Some(ms),
                ..
            } => *ms,
            o => panic!("{o:?}"),
        })
        .collect();
    assert!(waits.windows(2).all(|w| w[0] < w[1]), "{waits:?}");
    assert!(
        waits[0] <= 200,
        "the first refused may come back within a token's time: {waits:?}"
    );
    // Still open: after its wait, the first refused command goes through.
    tokio::time::sleep(Duration::from_millis(waits[0])).await;
    b.send(&send(accepted)).await;
    let again = result_of(&mut b, outcomes[accepted].0.as_str()).await;
    assert!(matches!(again, Outcome::Accepted { .. }), "{again:?}");
}

/// A command sent after one refused with a retry time is held — refused `unavailable` with a
/// retry time of 0, not looked at — until that one is decided again, and a held one holds those
/// sent after it: pipelined commands keep their order across a refusal. One sent after an
/// accepted command, or after none, is not held.
#[tokio::test]
async fn a_command_sent_after_a_refused_one_is_held_until_that_one_goes_again() {
    let srv = start(hostlease_server::Config {
        msg_rate: 10.0,
        msg_burst: 3.0,
        ..test_config()
    })
    .await;
    let mut b = srv.raw("held", "bob", false).await;
    let p = ptoken(&mut b).await;
    let frame = |id: &str, after: Option<&str>| vote_after(&p, id, after);
    // Sends `batch` at once; their outcomes, and the ids of the events seen meanwhile.
    let mut events = Vec::new();
    let mut round = async |b: &mut Raw, batch: &[(&str, Option<&str>)]| {
        for (id, after) in batch {
            b.send(&frame(id, *after)).await;
        }
        let mut outcomes = Vec::new();
        while outcomes.len() < batch.len() {
            let m = b
                .until(|m| match m {
                    ServerMsg::CommandResult { .. } | ServerMsg::Event(_) => Some(m.clone()),
                    _ => None,
                })
                .await;
            match m {
                ServerMsg::CommandResult { id, outcome } => {
                    outcomes.push((id.as_str().to_string(), outcome))
                }
                ServerMsg::Event(e) => events.push(e.payload.get_str("id").unwrap().to_string()),
                _ => unreachable!(),
            }
        }
        tokio::time::sleep(Duration::from_millis(350)).await; // the burst back
        outcomes
    };
    let accepted = |o: &Outcome| matches!(o, Outcome::Accepted { .. });
    let held = |o: &Outcome| {
        matches!(
            o,
            Outcome::Rejected {
                code: RejectCode::Unavailable,
                retry_after_ms: Some(0),
                current: None,
            }
        )
    };
    let o = round(
        &mut b,
        &[("a", None), ("b", None), ("c", None), ("d", None)],
    )
    .await;
    assert!(o[..3].iter().all(|(_, o)| accepted(o)), "{o:?}");
    assert_eq!(refusal(&o[3].1), Some(RejectCode::RateLimited), "{o:?}");
    let o = round(
        &mut b,
        &[("e", Some("d")), ("f", Some("e")), ("g", Some("b"))],
    )
    .await;
    assert!(held(&o[0].1) && held(&o[1].1), "{o:?}");
    assert!(accepted(&o[2].1), "{o:?}");
    let o = round(&mut b, &[("d", None), ("e", Some("d")), ("f", Some("e"))]).await;
    assert!(o.iter().all(|(_, o)| accepted(o)), "{o:?}");
    assert_eq!(events, ["a", "b", "c", "g", "d", "e", "f"]);
}

/// A refusal for good holds the commands sent after it too (an attempt refused for good may have
/// a resend already on the wire, with a fresh token), and a held command gives its command-rate
/// token back: those behind a refused one do not spend their sender's rate at every round.
#[tokio::test]
async fn a_refusal_for_good_holds_those_after_it_and_a_held_command_spends_no_rate() {
    let srv = start(hostlease_server::Config {
        msg_rate: 0.01,
        msg_burst: 4.0,
        ..test_config()
    })
    .await;
    let mut b = srv.raw("held-good", "bob", false).await;
    let p = ptoken(&mut b).await;
    let key = |id: &str| IdempotencyKey::new(id).unwrap();
    let frame = |id: &str, after: Option<&str>, cap: &Token| vote_after(cap, id, after);
    let forged = Token::new("v4.public.not-a-capability");
    b.send(&frame("k", None, &forged)).await;
    let o = result_of(&mut b, "k").await;
    assert_eq!(refusal(&o), Some(RejectCode::BadCapability), "{o:?}");
    for (id, after) in [("x1", "k"), ("x2", "x1"), ("x3", "x2")] {
        b.send(&frame(id, Some(after), &p)).await;
        let o = result_of(&mut b, id).await;
        assert_eq!(o, hostlease_server::store::held(), "{id}");
    }
    // The same behind a refusal the store decides: a host action with a participant token.
    b.send(&ClientMsg::Command {
        id: key("h"),
        action: Action::new("poll.open").unwrap(),
        payload: serde_json::json!({}).into(),
        epoch: None,
        capability: p.clone(),
        after: None,
    })
    .await;
    let o = result_of(&mut b, "h").await;
    assert_eq!(refusal(&o), Some(RejectCode::ActionNotGranted), "{o:?}");
    b.send(&frame("z", Some("h"), &p)).await;
    assert_eq!(
        result_of(&mut b, "z").await,
        hostlease_server::store::held()
    );
    // The burst of 4: one spent by the forged command, one by the host action, none by the four
    // held.
    for id in ["y1", "y2"] {
        b.send(&frame(id, None, &p)).await;
        let o = result_of(&mut b, id).await;
        assert!(matches!(o, Outcome::Accepted { .. }), "{id}: {o:?}");
    }
    // And no more than they took: the burst is spent.
    b.send(&frame("y3", None, &p)).await;
    let o = result_of(&mut b, "y3").await;
    assert_eq!(refusal(&o), Some(RejectCode::RateLimited), "{o:?}");
}

/// The command rate is the participant's in the room, not each connection's: a second session
/// of the same join token (16 sessions multiplied it by 16), a session opened after the others
/// closed, and the HTTP command endpoint get no more commands through, while another participant
/// keeps its own.
#[tokio::test]
async fn a_participant_s_sessions_share_its_command_rate() {
    let srv = start(hostlease_server::Config {
        msg_rate: 0.1,
        msg_burst: 3.0,
        ..test_config()
    })
    .await;
    async fn outcome(r: &mut Raw, p: &Token, id: &str) -> Outcome {
        r.send(&vote_frame(p, id, serde_json::json!({ "id": id })))
            .await;
        result_of(r, id).await
    }
    let limited = |o: &Outcome| {
        matches!(
            o,
            Outcome::Rejected {
                code: RejectCode::RateLimited,
                retry_after_ms: Some(_),
                ..
            }
        )
    };
    let mut first = srv.raw("shared-rate", "bob", false).await;
    let mut second = srv.raw("shared-rate", "bob", false).await;
    let mut carol = srv.raw("shared-rate", "carol", false).await;
    let (p1, p2, pc) = (
        ptoken(&mut first).await,
        ptoken(&mut second).await,
        ptoken(&mut carol).await,
    );
    for i in 0..3 {
        let o = outcome(&mut first, &p1, &format!("f{i}")).await;
        assert!(matches!(o, Outcome::Accepted { .. }), "{o:?}");
    }
    let o = outcome(&mut second, &p2, "s0").await;
    assert!(
        limited(&o),
        "the second session had a rate of its own: {o:?}"
    );
    let o = outcome(&mut carol, &pc, "c0").await;
    assert!(matches!(o, Outcome::Accepted { .. }), "{o:?}");
    // Over HTTP, with the same participant's capability: refused, 429 with a Retry-After.
    let r = post_vote(&srv, "shared-rate", p1.expose(), "h0").await;
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["code"], "rate_limited", "{body}");
    // Every session gone, and a new one: still spent.
    drop((first, second));
    let mut again = srv.raw("shared-rate", "bob", false).await;
    let p = ptoken(&mut again).await;
    let o = outcome(&mut again, &p, "a0").await;
    assert!(limited(&o), "a reconnect had a fresh burst: {o:?}");
}

/// A capability that has expired costs its participant nothing over HTTP: anyone holding an old
/// one (its signature stays good) could otherwise keep the participant's command rate spent. It
/// has a rate of its own: uncharged, it brought the store's writer commands without limit (each
/// refused only there, after the room's row, the payload's hash and the key were looked at).
#[tokio::test]
async fn an_expired_capability_has_a_rate_of_its_own() {
    let srv = start(hostlease_server::Config {
        msg_rate: 0.1,
        msg_burst: 2.0,
        ..test_config()
    })
    .await;
    let mut bob = srv.raw("spent", "bob", false).await;
    let p = ptoken(&mut bob).await;
    let claims: hostlease_server::tokens::CapClaims = srv
        .app
        .cap_keys
        .verify(hostlease_server::tokens::CAP_PREFIX, p.expose())
        .unwrap();
    let old = hostlease_server::tokens::CapClaims {
        exp: hostlease_server::tokens::now_ms() - 1,
        ..claims
    };
    let old = srv
        .app
        .keys
        .sign_token(hostlease_server::tokens::CAP_PREFIX, &old);
    let mut statuses = Vec::new();
    for i in 0..4 {
        let r = post_vote(&srv, "spent", &old, &format!("old-{i}")).await;
        assert_ne!(r.status(), 200);
        statuses.push(r.status());
    }
    // A burst of 2 at 0.1/s: the first two reach the store (and are refused there), the rest are
    // refused at the door.
    assert!(statuses[..2].iter().all(|s| *s != 429), "{statuses:?}");
    assert_eq!(statuses[3], 429, "{statuses:?}");
    for i in 0..2 {
        let id = format!("live-{i}");
        bob.send(&vote_frame(&p, &id, serde_json::json!({ "i": i })))
            .await;
        let o = result_of(&mut bob, &id).await;
        assert!(matches!(o, Outcome::Accepted { .. }), "{o:?}");
    }
}

/// A welcome that tells its host of its lease brings the host capability with it, and the
/// capability works: the one a confirm brought while the client resynced (for an epoch it had
/// not applied yet) was dropped, and host commands failed `NoCapability` until the next renewal.
#[tokio::test]
async fn a_welcome_telling_the_host_of_its_lease_brings_its_capability() {
    let srv = start(test_config()).await;
    let mut h = srv.raw("wcap", "alice", true).await;
    h.until_host().await;
    h.send(&ClientMsg::Resume { cursor: Seq(0) }).await;
    let remaining = h
        .until(|m| match m {
            ServerMsg::Welcome { snapshot, .. } => Some(snapshot.lease_remaining_ms),
            _ => None,
        })
        .await
        .expect("the host is told of its lease");
    // What comes up to the fresh participant token (probes go unanswered: no confirm).
    let mut host = Vec::new();
    loop {
        match h.next(WAIT).await.expect("a frame") {
            ServerMsg::Capability {
                role: Role::Host,
                token,
                epoch,
                expires_in_ms,
                ..
            } => host.push((token, epoch, expires_in_ms)),
            ServerMsg::Capability {
                role: Role::Participant,
                ..
            } => break,
            _ => {}
        }
    }
    assert_eq!(host.len(), 1, "one host capability with the welcome");
    let (token, epoch, expires_in_ms) = host.pop().unwrap();
    assert_eq!((epoch, expires_in_ms), (Some(Epoch(1)), remaining));
    h.send(&ClientMsg::Command {
        id: IdempotencyKey::new("open-1").unwrap(),
        action: Action::new("poll.open").unwrap(),
        payload: serde_json::json!({}).into(),
        epoch: Some(Epoch(1)),
        capability: token,
        after: None,
    })
    .await;
    let o = result_of(&mut h, "open-1").await;
    assert!(matches!(o, Outcome::Accepted { .. }), "{o:?}");
}

/// The SDK's core retries refused commands after the server's retry time: a burst past the
/// rate (votes queued while offline, sent at once) all land, once each, on one connection. Also
/// past four times the burst, which was a flood that closed the connection (the SDK sends up to
/// its `command_limit` at once after a resync: each reconnect sent them again, and was closed
/// again).
#[tokio::test]
async fn an_sdk_burst_past_the_rate_lands_without_a_reconnect() {
    let srv = start(hostlease_server::Config {
        msg_rate: 20.0,
        msg_burst: 5.0,
        ..test_config()
    })
    .await;
    let mut b = Sdk::join(
        srv.addr,
        "sdk-burst",
        join_token(&srv.app_key, "sdk-burst", "bob", false),
    )
    .await;
    b.pump_until("bob live", |s| {
        s.view.phase() == hostlease::core::Phase::Live
    })
    .await;
    b.pump_until("bob has a participant token", |_| true).await;
    let now = b.now();
    for i in 0..40 {
        b.view
            .command(
                now,
                Action::new("vote").unwrap(),
                serde_json::json!({"i": i}).into(),
                None,
            )
            .expect("queued");
    }
    b.flush().await;
    let accepted = |s: &Sdk| {
        s.events
            .iter()
            .filter(|e| matches!(e, hostlease::core::Event::CommandAccepted { .. }))
            .count()
    };
    b.pump_until("all 40 accepted", |s| accepted(s) == 40).await;
    let refused = srv.metrics().await;
    assert!(
        refused.contains(r#"result="rate_limited""#),
        "the burst was not refused at all"
    );
    assert!(
        !b.events.iter().any(
            |e| matches!(e, hostlease::core::Event::CommandFailed { .. })
                || *e == hostlease::core::Event::Phase(hostlease::core::Phase::Offline)
        ),
        "{:?}",
        b.events
    );
    let votes = b
        .events
        .iter()
        .filter(
            |e| matches!(e, hostlease::core::Event::RoomEvent(ev) if ev.action.as_str() == "vote"),
        )
        .count();
    assert_eq!(votes, 40);
}

/// Control frames count against the per-connection flood limit: a ping flood is closed like
/// any other flood.
#[tokio::test]
async fn a_ping_flood_is_rate_limited() {
    let srv = start(hostlease_server::Config {
        msg_rate: 5.0,
        msg_burst: 10.0,
        ..test_config()
    })
    .await;
    let mut c = srv.raw("pings", "flood", false).await;
    let _ = ptoken(&mut c).await;
    use futures_util::SinkExt;
    for _ in 0..1000 {
        let ping = tokio_tungstenite::tungstenite::Message::Ping(vec![1u8, 2, 3].into());
        if c.ws.send(ping).await.is_err() {
            break;
        }
    }
    assert_eq!(c.until_closed().await, Some(ErrorCode::RateLimited));
}

/// A client that stops reading cannot hold its session forever: once the socket's buffers are
/// full, a write outlasts the write timeout and the session ends (its member entry goes).
#[tokio::test]
async fn a_client_that_stops_reading_is_dropped_after_the_write_timeout() {
    use futures_util::SinkExt;
    let srv = start(hostlease_server::Config {
        write_timeout_ms: 300,
        msg_rate: 1e6,
        msg_burst: 1e6,
        signal_bytes_rate: 1e9,
        signal_bytes_burst: 1e9,
        ..test_config()
    })
    .await;
    let id = RoomId::new("stall").unwrap();
    // The stalled client: a small receive buffer, so that the server's writes block soon.
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let tcp = sock.connect(srv.addr).await.unwrap();
    let (ws, _) = tokio_tungstenite::client_async(
        format!("ws://{}/v1/rooms/stall/ws", srv.addr),
        tokio_tungstenite::MaybeTlsStream::Plain(tcp),
    )
    .await
    .unwrap();
    let mut stalled = Raw {
        ws,
        seen: vec![],
        tokens: vec![],
    };
    stalled
        .send(&ClientMsg::Hello {
            token: join_token(&srv.app_key, "stall", "stalled", false),
            resume: None,
            epoch_seen: None,
        })
        .await;
    let _ = ptoken(&mut stalled).await;
    // From here on `stalled` reads nothing. Another member signals it large frames.
    let mut sender = srv.raw("stall", "sender", false).await;
    let _ = ptoken(&mut sender).await;
    let members = |srv: &TestServer| {
        let hub = srv.app.rooms.lock().unwrap().get(&id).cloned();
        hub.map_or(vec![], |h| {
            h.members()
                .into_iter()
                .map(|m| m.id.to_string())
                .collect::<Vec<_>>()
        })
    };
    assert!(members(&srv).contains(&"stalled".to_string()));
    let signal = format!(
        r#"{{"v":1,"t":"signal","to":"stalled","data":"{}"}}"#,
        "a".repeat(60_000)
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut sent = 0;
    while members(&srv).contains(&"stalled".to_string()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stalled session still holds its member entry after {sent} signals"
        );
        if sent < 400 {
            for _ in 0..20 {
                sender
                    .ws
                    .send(tokio_tungstenite::tungstenite::Message::Text(
                        signal.clone().into(),
                    ))
                    .await
                    .unwrap();
                sent += 1;
            }
        } else {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    drop(stalled);
}

#[tokio::test]
async fn a_display_name_is_cut_to_its_byte_limit_on_a_character_boundary() {
    use hostlease_server::tokens::{JoinClaims, JOIN_PREFIX};
    let srv = start(test_config()).await;
    // 64 characters, 128 bytes: a cut by characters would keep it whole, and every frame that
    // names alice (bob's welcome, presence) would be refused by the protocol's 64-byte limit.
    let claims = JoinClaims {
        room: RoomId::new("nm").unwrap(),
        sub: hostlease::protocol::ParticipantId::new("alice").unwrap(),
        name: "é".repeat(64),
        may_host: false,
        exp: hostlease_server::tokens::now_ms() + 60_000,
        kid: srv.app_key.kid.clone(),
    };
    let token = Token::new(srv.app_key.sign_token(JOIN_PREFIX, &claims));
    let mut a = Raw::join(srv.addr, "nm", &token, None).await;
    let _ = ptoken(&mut a).await;
    // `Raw::next` decodes every frame with the SDK's decoder and panics on one it refuses.
    let mut b = srv.raw("nm", "bob", false).await;
    let (snapshot, _, _) = b.until(welcome).await;
    let alice = snapshot.members.iter().find(|m| m.id.as_str() == "alice");
    assert_eq!(alice.expect("alice is a member").name, "é".repeat(32));
}

/// A connection with nothing to hear gets a heartbeat after the configured quiet time (the SDK
/// gives a connection up after a heartbeat period plus a margin without a frame).
#[tokio::test]
async fn a_quiet_connection_gets_heartbeats() {
    let srv = start(hostlease_server::Config {
        heartbeat_ms: 300,
        ..test_config()
    })
    .await;
    let mut a = srv.raw("hb", "alice", false).await;
    let _ = ptoken(&mut a).await;
    // Six periods: a client that sends nothing but answers the server's pings (the test client
    // does while it reads, as a browser always does) is not taken for a dead one.
    for _ in 0..6 {
        a.until(|m| matches!(m, ServerMsg::Heartbeat).then_some(()))
            .await;
    }
}

/// A client that stops answering (gone without a close: no frame, not even the pong for a ping)
/// is given up after a few heartbeat periods, and the room hears that it left; before, its
/// session and member entry stayed until the kernel gave the TCP connection up.
#[tokio::test]
async fn a_client_that_answers_nothing_is_given_up() {
    // Periods long enough that bob, who answers, is never late by one on a loaded machine.
    let srv = start(hostlease_server::Config {
        heartbeat_ms: 500,
        ..test_config()
    })
    .await;
    let mut a = srv.raw("dead", "alice", false).await;
    let _ = ptoken(&mut a).await;
    // From here alice reads nothing, so the pings queue unanswered.
    let mut b = srv.raw("dead", "bob", false).await;
    b.until(left("alice")).await;
    // (The recorder is shared by this file's tests: at least alice.)
    let given_up: f64 = srv
        .metrics()
        .await
        .lines()
        .find_map(|l| l.strip_prefix("hostlease_ws_unresponsive_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0);
    assert!(given_up >= 1.0, "{given_up}");
    drop(a);
}

/// Matches the room hearing that `who` left.
fn left(who: &str) -> impl FnMut(&ServerMsg) -> Option<()> + '_ {
    move |m| match m {
        ServerMsg::Presence {
            member,
            online: false,
        } if member.id.as_str() == who => Some(()),
        ServerMsg::PresenceBatch { left, .. } if left.iter().any(|m| m.id.as_str() == who) => {
            Some(())
        }
        _ => None,
    }
}

/// A client gone without a close gets in its inbox what was published after the last item it
/// confirmed (by the pong to a ping, which carries the last seq sent), and not what it
/// confirmed. The notifier counts what is published while a session is listed as got live, and
/// a dead connection stays listed for a few heartbeat periods: those items reached neither the
/// client nor its inbox.
#[tokio::test]
async fn a_client_gone_silent_gets_what_it_did_not_confirm_in_its_inbox() {
    let srv = start(hostlease_server::Config {
        heartbeat_ms: 1000,
        ..test_config()
    })
    .await;
    let ta = join_token(&srv.app_key, "gone", "alice", false);
    let mut a = Raw::join(srv.addr, "gone", &ta, None).await;
    let _ = ptoken(&mut a).await;
    let confirmed = vote_and_leave(&srv, "gone", "bob", "confirmed").await;
    // Alice reads it and two heartbeats after: a ping went between (one a period), and reading
    // on sent its pong.
    a.until(|m| matches!(m, ServerMsg::Event(e) if e.seq == confirmed).then_some(()))
        .await;
    for _ in 0..2 {
        a.until(|m| matches!(m, ServerMsg::Heartbeat).then_some(()))
            .await;
    }
    // From here alice reads nothing and answers no ping; her connection stays open.
    let inbox = missed_while_silent(&srv, "gone", &ta).await;
    assert_eq!(inbox.len(), 1, "{inbox:?} (confirmed: {confirmed:?})");
    drop(a);
}

/// A client that is never quiet (a host echoing its lease probes, three a lease, more often
/// than the heartbeat period) is pinged every period all the same: its pongs confirm what it
/// has, and gone without a close it gets only what came after in its inbox. Pinged only when
/// quiet, it confirmed nothing after its welcome and got everything since in its inbox again.
#[tokio::test]
async fn a_client_never_quiet_is_pinged_and_confirms_what_it_has() {
    let srv = start(hostlease_server::Config {
        heartbeat_ms: 1000,
        ..test_config()
    })
    .await;
    let ta = join_token(&srv.app_key, "busy-gone", "alice", true);
    let mut a = Raw::join(srv.addr, "busy-gone", &ta, None).await;
    a.until_host().await;
    let confirmed = vote_and_leave(&srv, "busy-gone", "bob", "confirmed").await;
    // Alice answers every probe for three heartbeat periods: never quiet, pinged all the same.
    let end = tokio::time::Instant::now() + Duration::from_secs(3);
    let mut seen = false;
    while let Some(m) = a
        .next(end.saturating_duration_since(tokio::time::Instant::now()))
        .await
    {
        match m {
            ServerMsg::LeaseProbe { nonce, .. } => a.send(&ClientMsg::LeaseEcho { nonce }).await,
            ServerMsg::Event(e) if e.seq == confirmed => seen = true,
            _ => {}
        }
    }
    assert!(seen);
    // Gone silent: her lease lapses (no one else may host) and she is given up.
    let inbox = missed_while_silent(&srv, "busy-gone", &ta).await;
    assert!(
        inbox.iter().all(|&s| s > confirmed),
        "{inbox:?} (confirmed: {confirmed:?})"
    );
    drop(a);
}

/// A session the server closed (here for a malformed frame) is not taken for a lost one: its
/// close went after everything sent before it, so nothing is copied to its inbox (a client
/// that had read it all found it there again).
#[tokio::test]
async fn a_session_the_server_closed_gets_no_copies_in_its_inbox() {
    let srv = start(test_config()).await;
    let ta = join_token(&srv.app_key, "closed-on", "alice", false);
    let mut a = Raw::join(srv.addr, "closed-on", &ta, None).await;
    let _ = ptoken(&mut a).await;
    let got = vote_and_leave(&srv, "closed-on", "bob", "got").await;
    a.until(|m| matches!(m, ServerMsg::Event(e) if e.seq == got).then_some(()))
        .await;
    // Once the notifier has counted it as got live (after, it would go to her inbox anyway).
    until_notified(&srv.db().await).await;
    a.send_text("{not json".into()).await;
    assert_eq!(a.until_closed().await, Some(ErrorCode::BadFrame));
    // What follows goes to her inbox, as to anyone away; what she got live does not.
    let later = vote_and_leave(&srv, "closed-on", "bob", "later").await;
    let inbox = inbox_with(&srv, "closed-on", &ta, later).await;
    assert_eq!(inbox, [later]);
}

/// The gap a resume on a live session cannot fill (its replay is past the 1 MiB budget) goes
/// to the participant's inbox: it was published while the session was listed, so the notifier
/// counted it as got live, and the client had it nowhere to read.
#[tokio::test]
async fn a_gap_a_live_resume_cannot_fill_goes_to_the_inbox() {
    let srv = start(test_config()).await;
    let ta = join_token(&srv.app_key, "gap", "alice", false);
    let mut a = Raw::join(srv.addr, "gap", &ta, None).await;
    let _ = ptoken(&mut a).await;
    let mut b = srv.raw("gap", "bob", false).await;
    let p = ptoken(&mut b).await;
    // 1.2 MB of votes, in the room's byte burst.
    let big = "x".repeat(50_000);
    for i in 0..24 {
        b.send(&vote_frame(
            &p,
            &format!("v{i}"),
            serde_json::json!({ "big": big }),
        ))
        .await;
        let o = result_of(&mut b, &format!("v{i}")).await;
        assert!(matches!(o, Outcome::Accepted { .. }), "{o:?}");
    }
    a.send(&ClientMsg::Resume { cursor: Seq(0) }).await;
    let (_, _, gap) = a.until(welcome).await;
    let gap = gap.expect("a gap");
    let want: Vec<Seq> = (gap.from.0..=gap.to.0).map(Seq).collect();
    let mut inbox = inbox_with(&srv, "gap", &ta, gap.to).await;
    inbox.sort();
    assert_eq!(inbox, want);
    // Resuming from 0 again queues nothing more (each was up to 1,024 items written): two
    // turns of the notifier later, each item of the gap is there once.
    a.send(&ClientMsg::Resume { cursor: Seq(0) }).await;
    let (_, _, again) = a.until(welcome).await;
    assert_eq!(again, Some(gap));
    let turns = || {
        srv.app
            .pauses
            .notifier
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let (from, deadline) = (turns(), tokio::time::Instant::now() + WAIT);
    while turns() < from + 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the notifier stopped"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut inbox = inbox_with(&srv, "gap", &ta, gap.to).await;
    inbox.sort();
    assert_eq!(inbox, want);
}

/// The count `q` reads from `db`.
async fn count(db: &sqlx::SqlitePool, q: &str) -> i64 {
    sqlx::query_scalar(q).fetch_one(db).await.unwrap()
}

/// Waits until the notifier has worked off every outbox row of `db`.
async fn until_notified(db: &sqlx::SqlitePool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while count(db, "SELECT COUNT(*) FROM outbox WHERE notified_at IS NULL").await > 0 {
        assert!(tokio::time::Instant::now() < deadline, "never notified");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `p` joins `room`, votes (idempotency key `key`) and leaves; the vote's seq.
async fn vote_and_leave(srv: &TestServer, room: &str, p: &str, key: &str) -> Seq {
    let mut b = srv.raw(room, p, false).await;
    let token = ptoken(&mut b).await;
    let seq = vote(&mut b, &token, key).await;
    b.send(&ClientMsg::Leave).await;
    let _ = b.until_closed().await;
    seq
}

/// Carol joins `room`, votes, and waits for alice (silent) to be given up; the seqs of alice's
/// inbox (`ta`: her join token) once it holds the vote.
async fn missed_while_silent(srv: &TestServer, room: &str, ta: &Token) -> Vec<Seq> {
    let mut c = srv.raw(room, "carol", false).await;
    let token = ptoken(&mut c).await;
    let missed = vote(&mut c, &token, "missed").await;
    c.until(left("alice")).await;
    inbox_with(srv, room, ta, missed).await
}

/// The seqs in the inbox of `token`'s participant once it holds `seq`.
async fn inbox_with(srv: &TestServer, room: &str, token: &Token, seq: Seq) -> Vec<Seq> {
    let http = reqwest::Client::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let page: InboxPage = http
            .get(format!("http://{}/v1/rooms/{room}/inbox?since=0", srv.addr))
            .bearer_auth(token.expose())
            .send()
            .await
            .unwrap()
            .protocol()
            .await;
        let seqs: Vec<Seq> = page.entries.iter().map(|e| e.item.seq()).collect();
        if seqs.contains(&seq) {
            return seqs;
        }
        assert!(tokio::time::Instant::now() < deadline, "{page:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A burst of resumes (each a log read and a welcome of up to 1 MiB) is answered in full, on
/// the same connection, but past the resume burst at the resume rate: the paced ones are
/// counted.
#[tokio::test]
async fn a_burst_of_resumes_is_paced_not_refused() {
    let srv = start(test_config()).await;
    let mut a = srv.raw("rs", "alice", false).await;
    let _ = ptoken(&mut a).await;
    for _ in 0..20 {
        a.send(&ClientMsg::Resume { cursor: Seq(0) }).await;
    }
    for _ in 0..20 {
        a.until(welcome).await;
    }
    let page = srv.metrics().await;
    let paced: f64 = page
        .lines()
        .find_map(|l| l.strip_prefix("hostlease_resumes_paced_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0);
    assert!(paced >= 5.0, "paced {paced}:\n{page}");
}

/// A command the room's bytes refuse does not spend its sender's command rate: a participant
/// whose large payloads wait for the room could send nothing else until its own rate refilled.
#[tokio::test]
async fn a_command_refused_for_room_bytes_keeps_its_command_rate_token() {
    let srv = start(hostlease_server::Config {
        msg_rate: 1.0,
        msg_burst: 2.0,
        room_bytes_rate: 1.0,
        room_bytes_burst: 50_000.0,
        ..test_config()
    })
    .await;
    let text = |n: usize| serde_json::json!({ "t": "x".repeat(n) });
    let mut bob = srv.raw("rb", "bob", false).await;
    let pb = ptoken(&mut bob).await;
    // One command token and 50 kB of the room's 60 kB (a burst holds one largest payload).
    bob.send(&vote_frame(&pb, "b0", text(50_000))).await;
    let o = result_of(&mut bob, "b0").await;
    assert!(matches!(o, Outcome::Accepted { .. }), "{o:?}");
    for id in ["b1", "b2", "b3"] {
        bob.send(&vote_frame(&pb, id, text(20_000))).await;
        let o = result_of(&mut bob, id).await;
        assert!(
            matches!(
                o,
                Outcome::Rejected {
                    code: RejectCode::RateLimited,
                    ..
                }
            ),
            "{id}: {o:?}"
        );
    }
    // Bob's second command token is still there (at 1 a second, the test's few milliseconds
    // refill almost none of it).
    bob.send(&vote_frame(&pb, "b4", text(10))).await;
    let o = result_of(&mut bob, "b4").await;
    assert!(matches!(o, Outcome::Accepted { .. }), "{o:?}");
}

/// A room's payload bytes from participants are bounded (`room_bytes_rate`): every event goes
/// to every member. Past them a command is refused `rate_limited` with a retry time, over
/// WebSocket and over HTTP (429, `Retry-After`); commands the store refuses give their bytes
/// back; the host's commands are not charged; another room is not held up.
#[tokio::test]
async fn a_room_s_payload_bytes_are_bounded_but_never_shut_the_host_out() {
    let srv = start(hostlease_server::Config {
        room_bytes_rate: 1.0,
        room_bytes_burst: 120_000.0,
        ..test_config()
    })
    .await;
    let big = |id: &str| serde_json::json!({ "id": id, "text": "x".repeat(50_000) });
    let mut alice = srv.raw("bytes", "alice", true).await;
    alice.until_host().await;
    let (epoch, host_cap) = alice.host_capability().unwrap();
    let mut bob = srv.raw("bytes", "bob", false).await;
    let mut carol = srv.raw("bytes", "carol", false).await;
    let (pb, pc) = (ptoken(&mut bob).await, ptoken(&mut carol).await);
    bob.send(&vote_frame(&pb, "b0", big("b0"))).await;
    assert!(matches!(
        result_of(&mut bob, "b0").await,
        Outcome::Accepted { .. }
    ));
    // A host action with a participant's capability: refused by the store, its bytes given
    // back (twice 50 kB, which would leave nothing for carol's vote).
    for id in ["not-host-1", "not-host-2"] {
        carol
            .send(&ClientMsg::Command {
                id: IdempotencyKey::new(id).unwrap(),
                action: Action::new("poll.open").unwrap(),
                payload: big(id).into(),
                epoch,
                capability: pc.clone(),
                after: None,
            })
            .await;
        let o = result_of(&mut carol, id).await;
        assert!(matches!(o, Outcome::Rejected { .. }), "{o:?}");
    }
    carol.send(&vote_frame(&pc, "c0", big("c0"))).await;
    let o = result_of(&mut carol, "c0").await;
    assert!(matches!(o, Outcome::Accepted { .. }), "{o:?}");
    // 100 kB of the 120 kB spent: the next 50 kB waits.
    carol.send(&vote_frame(&pc, "c1", big("c1"))).await;
    let o = result_of(&mut carol, "c1").await;
    assert!(
        matches!(
            o,
            Outcome::Rejected {
                code: RejectCode::RateLimited,
                retry_after_ms: Some(ms),
                ..
            } if ms > 1_000
        ),
        "{o:?}"
    );
    let r = reqwest::Client::new()
        .post(format!("http://{}/v1/rooms/bytes/commands", srv.addr))
        .bearer_auth(pb.expose())
        .header("Idempotency-Key", "h0")
        .json(&serde_json::json!({ "action": "vote", "payload": big("h0") }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    // The host's command goes through all the same.
    alice
        .send(&ClientMsg::Command {
            id: IdempotencyKey::new("open").unwrap(),
            action: Action::new("poll.open").unwrap(),
            payload: big("open").into(),
            epoch,
            capability: host_cap,
            after: None,
        })
        .await;
    let o = result_of(&mut alice, "open").await;
    assert!(matches!(o, Outcome::Accepted { .. }), "{o:?}");
    // Another room has bytes of its own.
    let mut dan = srv.raw("other-bytes", "dan", false).await;
    let pd = ptoken(&mut dan).await;
    dan.send(&vote_frame(&pd, "d0", big("d0"))).await;
    assert!(matches!(
        result_of(&mut dan, "d0").await,
        Outcome::Accepted { .. }
    ));
}

/// A member's last sighting (which keeps it known for its offline inbox) is written again when
/// it leaves, not only when it joined: one connected for longer than the retention is not
/// forgotten the moment it goes.
#[tokio::test]
async fn leaving_refreshes_a_members_last_sighting() {
    let srv = start(test_config()).await;
    let url = format!("sqlite://{}", srv.dir.path().join("h.db").display());
    let db = sqlx::SqlitePool::connect(&url).await.unwrap();
    let seen = |db: sqlx::SqlitePool| async move {
        sqlx::query_scalar::<_, i64>(
            "SELECT seen_at FROM participants WHERE room = 'sn' AND participant = 'alice'",
        )
        .fetch_optional(&db)
        .await
        .unwrap()
    };
    let mut a = srv.raw("sn", "alice", false).await;
    let _ = ptoken(&mut a).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    while seen(db.clone()).await.is_none() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "alice never recorded"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // As if alice had joined three days ago and stayed connected since.
    let old = hostlease_server::tokens::now_ms() as i64 - 3 * 24 * 3600 * 1000;
    sqlx::query("UPDATE participants SET seen_at = ? WHERE participant = 'alice'")
        .bind(old)
        .execute(&db)
        .await
        .unwrap();
    a.send(&ClientMsg::Leave).await;
    while seen(db.clone()).await.unwrap() == old {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the leave did not refresh it"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(seen(db.clone()).await.unwrap() > old + 24 * 3600 * 1000);
}

/// The SQLite store, slowed where a test needs it.
struct Slowed {
    store: std::sync::Arc<hostlease_server::store::SqliteStore>,
    slow: Slow,
}

#[derive(Default)]
struct Slow {
    /// The outbox's newest id is answered this late (as a reader pool busy with a reconnect
    /// storm does at start-up).
    start: Duration,
    /// No command is answered until this reads `true` (a stalled writer).
    held: Option<tokio::sync::watch::Receiver<bool>>,
    /// No command reaches the store until this reads `true` (queued behind a writer busy with
    /// a group of others).
    queued: Option<tokio::sync::watch::Receiver<bool>>,
    /// A recorded kick is answered this late (it is committed, and visible, at once).
    kick: Duration,
    /// The publisher reads nothing from the outbox until this reads `true` (it lags).
    outbox: Option<tokio::sync::watch::Receiver<bool>>,
}

#[async_trait::async_trait]
impl hostlease_server::store::Store for Slowed {
    async fn outbox_max_id(&self) -> StoreResult<i64> {
        tokio::time::sleep(self.slow.start).await;
        self.store.outbox_max_id().await
    }
    async fn now_ms(&self) -> StoreResult<u64> {
        self.store.now_ms().await
    }
    fn clock_ms(&self) -> u64 {
        self.store.clock_ms()
    }
    fn clock_skew_ms(&self) -> i64 {
        self.store.clock_skew_ms()
    }
    async fn room(&self, r: &RoomId) -> StoreResult<Option<RoomRow>> {
        self.store.room(r).await
    }
    async fn grant(&self, q: GrantReq, s: &Keypair) -> StoreResult<GrantOutcome> {
        self.store.grant(q, s).await
    }
    async fn renew(
        &self,
        r: &RoomId,
        e: Epoch,
        h: &ParticipantId,
        s: &SessionId,
        l: u64,
    ) -> StoreResult<Option<Renewed>> {
        self.store.renew(r, e, h, s, l).await
    }
    async fn close_hostless(&self, r: &RoomId, e: Epoch) -> StoreResult<bool> {
        self.store.close_hostless(r, e).await
    }
    async fn set_ttl(&self, r: &RoomId, t: Option<u64>) -> StoreResult<()> {
        self.store.set_ttl(r, t).await
    }
    fn command(&self, q: CommandReq, s: &Keypair) -> Pending<CommandDone> {
        if let Some(mut queued) = self.slow.queued.clone() {
            let (store, s) = (self.store.clone(), s.clone());
            return Box::pin(async move {
                let _ = queued.wait_for(|open| *open).await;
                store.command(q, &s).await
            });
        }
        let done = self.store.command(q, s);
        let Some(mut held) = self.slow.held.clone() else {
            return done;
        };
        Box::pin(async move {
            let _ = held.wait_for(|open| *open).await;
            done.await
        })
    }
    async fn log_range(
        &self,
        r: &RoomId,
        a: Seq,
        u: Seq,
        l: usize,
        b: usize,
    ) -> StoreResult<(Vec<Item>, Option<Seq>)> {
        self.store.log_range(r, a, u, l, b).await
    }
    async fn outbox_after(&self, a: i64, l: i64) -> StoreResult<Vec<(i64, RoomId, Item)>> {
        if let Some(mut open) = self.slow.outbox.clone() {
            let _ = open.wait_for(|open| *open).await;
        }
        self.store.outbox_after(a, l).await
    }
    async fn unnotified(&self, l: i64) -> StoreResult<Vec<(i64, RoomId, Seq, String)>> {
        self.store.unnotified(l).await
    }
    async fn notify(
        &self,
        r: &[(i64, RoomId, Seq, String)],
        o: &hostlease_server::store::Online,
    ) -> StoreResult<usize> {
        self.store.notify(r, o).await
    }
    async fn recover_inbox(&self, l: &[hostlease_server::store::Lost]) -> StoreResult<usize> {
        self.store.recover_inbox(l).await
    }
    async fn webhook_due(&self, l: i64, c: u64) -> StoreResult<Vec<Delivery>> {
        self.store.webhook_due(l, c).await
    }
    async fn webhook_result(&self, i: &Delivery, d: bool, r: u64) -> StoreResult<()> {
        self.store.webhook_result(i, d, r).await
    }
    async fn remember_participant(&self, r: &RoomId, p: &ParticipantId) -> StoreResult<()> {
        self.store.remember_participant(r, p).await
    }
    async fn inbox(
        &self,
        r: &RoomId,
        p: &ParticipantId,
        s: u64,
        l: i64,
        b: usize,
    ) -> StoreResult<InboxPage> {
        self.store.inbox(r, p, s, l, b).await
    }
    async fn lapsed_rooms(&self, r: &[RoomId]) -> StoreResult<Swept> {
        self.store.lapsed_rooms(r).await
    }
    async fn record_kick(&self, r: &RoomId, p: &ParticipantId) -> StoreResult<i64> {
        let id = self.store.record_kick(r, p).await;
        tokio::time::sleep(self.slow.kick).await;
        id
    }
    async fn kicks_after(&self, a: i64, l: i64) -> StoreResult<Vec<hostlease_server::store::Kick>> {
        self.store.kicks_after(a, l).await
    }
    async fn kicks_max_id(&self) -> StoreResult<i64> {
        self.store.kicks_max_id().await
    }
    async fn housekeeping(&self, k: i64, w: bool) -> StoreResult<()> {
        self.store.housekeeping(k, w).await
    }
}

/// A server on a [`Slowed`] store in `dir`: its app, address and app key.
async fn serve_slowed(
    dir: &tempfile::TempDir,
    cfg: hostlease_server::Config,
    slow: Slow,
) -> (
    std::sync::Arc<hostlease_server::App>,
    std::net::SocketAddr,
    Keypair,
) {
    let db = format!("sqlite://{}", dir.path().join("h.db").display());
    let store = Slowed {
        store: std::sync::Arc::new(SqliteStore::open(&db).await.unwrap()),
        slow,
    };
    let app_key = Keypair::generate("app-1");
    let join = hostlease_server::tokens::Verifier::from_keys(&[app_key.public()]).unwrap();
    let app = hostlease_server::App::new(
        cfg,
        std::sync::Arc::new(store),
        Keypair::generate("srv-1"),
        join,
        None,
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let a = app.clone();
    tokio::spawn(async move { hostlease_server::serve(a, listener, std::future::pending()).await });
    (app, addr, app_key)
}

/// A client whose frames the server is not reading (64 commands of its own wait on a stalled
/// store: it reads no more until one is answered) is not given up for the silence, however long
/// the stall: the pongs it sent wait unread, and that silence is the server's.
#[tokio::test]
async fn a_client_the_server_stopped_reading_is_not_given_up() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = hostlease_server::Config {
        heartbeat_ms: 200,
        ..test_config()
    };
    let (open, held) = tokio::sync::watch::channel(false);
    let (_app, addr, app_key) = serve_slowed(
        &dir,
        cfg,
        Slow {
            held: Some(held),
            ..Slow::default()
        },
    )
    .await;
    let mut a = Raw::join(
        addr,
        "busy",
        &join_token(&app_key, "busy", "alice", false),
        None,
    )
    .await;
    let p = ptoken(&mut a).await;
    for i in 0..70 {
        a.send(&vote_frame(
            &p,
            &format!("v{i}"),
            serde_json::json!({ "option": i }),
        ))
        .await;
    }
    // Eight heartbeat periods with every command stuck; alice reads on, answering each ping.
    for _ in 0..8 {
        a.until(|m| matches!(m, ServerMsg::Heartbeat).then_some(()))
            .await;
    }
    open.send_replace(true);
    for i in 0..70 {
        let o = result_of(&mut a, &format!("v{i}")).await;
        assert!(matches!(o, Outcome::Accepted { .. }), "{o:?}");
    }
}

/// A result waiting for its event to be published (the publisher lags) holds up nothing else of
/// its session: heartbeats go out meanwhile, and once the event is published it goes out, then
/// the result. The wait ran in the session's loop, 500 ms for each result in turn, so that a
/// host's burst of commands left its lease echoes unread until the lease lapsed; here the wait
/// is a minute, and nothing at all came out of the session for that long.
#[tokio::test]
async fn a_result_waiting_for_its_event_holds_up_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let (publish, mut a) = vote_while_the_publisher_lags(&dir, 200).await;
    // Decided, its event not published: the session goes on.
    for _ in 0..3 {
        let m = a
            .until(|m| (!matches!(m, ServerMsg::Presence { .. })).then(|| m.clone()))
            .await;
        assert!(matches!(m, ServerMsg::Heartbeat), "{m:?}");
    }
    publish.send_replace(true);
    event_then_result(&mut a).await;
}

/// A leave answers the commands sent before it the same way: each result after its event (the
/// results went out as they came, and the session then closed with the event unsent).
#[tokio::test]
async fn a_leave_answers_each_command_after_its_event() {
    let dir = tempfile::tempdir().unwrap();
    let (publish, mut a) = vote_while_the_publisher_lags(&dir, 15_000).await;
    a.send(&ClientMsg::Leave).await;
    publish.send_replace(true);
    event_then_result(&mut a).await;
}

/// A server whose publisher reads nothing until the returned sender says `true`, with results
/// that wait a minute for their event, and heartbeats every `heartbeat_ms`; alice, in its room
/// `lag`, has sent vote `v`, which the store has committed.
async fn vote_while_the_publisher_lags(
    dir: &tempfile::TempDir,
    heartbeat_ms: u64,
) -> (tokio::sync::watch::Sender<bool>, Raw) {
    let cfg = hostlease_server::Config {
        heartbeat_ms,
        answer_wait_ms: 60_000,
        ..test_config()
    };
    let (publish, outbox) = tokio::sync::watch::channel(false);
    let (app, addr, app_key) = serve_slowed(
        dir,
        cfg,
        Slow {
            outbox: Some(outbox),
            ..Slow::default()
        },
    )
    .await;
    let room = RoomId::new("lag").unwrap();
    let mut a = Raw::join(
        addr,
        "lag",
        &join_token(&app_key, "lag", "alice", false),
        None,
    )
    .await;
    let p = ptoken(&mut a).await;
    a.send(&vote_frame(&p, "v", serde_json::json!({ "option": 1 })))
        .await;
    let deadline = tokio::time::Instant::now() + WAIT;
    while app.store.room(&room).await.unwrap().map(|r| r.seq) != Some(Seq(1)) {
        assert!(tokio::time::Instant::now() < deadline, "never committed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    (publish, a)
}

/// The notifier waits (up to a second) for the rows it read to be published here before it
/// reads who is connected: a member connected throughout gets a row its process published a
/// moment late live, and no inbox copy of it (it got one: counted as away for it).
#[tokio::test]
async fn a_member_connected_throughout_gets_no_copy_of_a_row_published_late() {
    let dir = tempfile::tempdir().unwrap();
    let (publish, mut a) = vote_while_the_publisher_lags(&dir, 15_000).await;
    // The notifier (every 40 ms) reads the row meanwhile.
    tokio::time::sleep(Duration::from_millis(150)).await;
    publish.send_replace(true);
    event_then_result(&mut a).await;
    let db = sqlx::SqlitePool::connect(&format!("sqlite://{}", dir.path().join("h.db").display()))
        .await
        .unwrap();
    until_notified(&db).await;
    assert_eq!(count(&db, "SELECT COUNT(*) FROM participants").await, 1);
    assert_eq!(count(&db, "SELECT COUNT(*) FROM inbox").await, 0);
}

/// Reads the event of vote `v` (seq 1), then its result, and nothing else in between.
async fn event_then_result(a: &mut Raw) {
    let not_routine = |m: &ServerMsg| {
        (!matches!(m, ServerMsg::Heartbeat | ServerMsg::Presence { .. })).then(|| m.clone())
    };
    let m = a.until(not_routine).await;
    assert!(
        matches!(&m, ServerMsg::Event(e) if e.seq == Seq(1)),
        "the event first: {m:?}"
    );
    let m = a.until(not_routine).await;
    assert!(
        matches!(
            &m,
            ServerMsg::CommandResult {
                outcome: Outcome::Accepted { seq: Seq(1) },
                ..
            }
        ),
        "then the result: {m:?}"
    );
}

/// The server accepts connections only once its publisher knows where the outbox stands: a
/// grant committed for the first member to join, while that read was still under way, was never
/// published (the member never heard it was host, never got probed, and its lease lapsed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_commits_while_the_server_starts_is_published() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = hostlease_server::Config {
        lease_ms: 60_000,
        sweep_ms: 20,
        ..hostlease_server::Config::default()
    };
    let (app, addr, app_key) = serve_slowed(
        &dir,
        cfg,
        Slow {
            start: Duration::from_millis(1500),
            ..Slow::default()
        },
    )
    .await;
    let mut alice = Raw::join(
        addr,
        "start",
        &join_token(&app_key, "start", "alice", true),
        None,
    )
    .await;
    let got = tokio::time::timeout(
        Duration::from_secs(10),
        alice.until(|m| match m {
            ServerMsg::Assignment(a) => Some(a.assignment.clone()),
            _ => None,
        }),
    )
    .await
    .expect("the grant is published to the member it elected");
    assert_eq!(got.host.as_ref().map(|h| h.as_str()), Some("alice"));
    let row = app.store.room(&got.room).await.unwrap().unwrap();
    assert_eq!(row.epoch, got.epoch);
}

/// A kick's answer counts the sessions it closed, however long its record takes to answer: the
/// sweeper (which applies the kicks made through every process) read the committed kick first,
/// closed the session itself, and the answer said `{"kicked": 0}`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kick_counts_the_sessions_it_closed_however_slow_its_record() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = hostlease_server::Config {
        sweep_ms: 20,
        ..test_config()
    };
    let (_app, addr, app_key) = serve_slowed(
        &dir,
        cfg,
        Slow {
            kick: Duration::from_millis(300),
            ..Slow::default()
        },
    )
    .await;
    let mut a = Raw::join(
        addr,
        "kk",
        &join_token(&app_key, "kk", "alice", false),
        None,
    )
    .await;
    let _ = ptoken(&mut a).await;
    assert_eq!(kick(addr, "kk", "alice").await, 1);
    assert_eq!(a.until_closed().await, Some(ErrorCode::Kicked));
}

/// One client address holds at most `max_sockets_per_address` open WebSockets, whoever they
/// are for (it could take all `max_connections` before); a socket that closes frees its place.
#[tokio::test]
async fn one_address_cannot_take_every_connection() {
    let srv = start(hostlease_server::Config {
        max_sockets_per_address: 3,
        ..test_config()
    })
    .await;
    let welcomed = |m: &ServerMsg| matches!(m, ServerMsg::Welcome { .. }).then_some(());
    let mut held = Vec::new();
    for (room, p) in [("a1", "ann"), ("a2", "bob"), ("a2", "cy")] {
        let mut r = srv.raw(room, p, false).await;
        r.until(welcomed).await;
        held.push(r);
    }
    let mut one_more = srv.raw("a3", "dee", false).await;
    assert_eq!(
        one_more.until_closed().await,
        Some(ErrorCode::TooManyConnections)
    );
    assert!(srv
        .metrics()
        .await
        .contains("hostlease_ws_address_refused_total 1"));
    drop(held.pop());
    // The closed socket's place is freed once its session has ended (bounded retries: each
    // refused attempt is closed, so it frees its own place too).
    let mut back = false;
    for _ in 0..50 {
        let mut r = srv.raw("a3", "dee", false).await;
        let got = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match r.next(Duration::from_secs(5)).await {
                    Some(ServerMsg::Welcome { .. }) => return true,
                    Some(ServerMsg::Error { .. }) | None => return false,
                    Some(_) => {}
                }
            }
        })
        .await;
        if got == Ok(true) {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(back, "a place freed by a closed socket is taken again");
}

/// One participant holds at most 16 sessions in a room: one join token no longer fills the room
/// (every other member then refused `room_full`).
#[tokio::test]
async fn one_participant_cannot_fill_the_room() {
    let srv = start(test_config()).await;
    let mut held = Vec::new();
    for _ in 0..hostlease_server::ws::MAX_SESSIONS_PER_PARTICIPANT {
        let mut r = srv.raw("cap", "carol", false).await;
        r.until(|m| matches!(m, ServerMsg::Welcome { .. }).then_some(()))
            .await;
        held.push(r);
    }
    let mut one_more = srv.raw("cap", "carol", false).await;
    assert_eq!(
        one_more.until_closed().await,
        Some(ErrorCode::TooManyConnections)
    );
    let mut dan = srv.raw("cap", "dan", false).await;
    dan.until(|m| matches!(m, ServerMsg::Welcome { .. }).then_some(()))
        .await;
}

/// A host's commands sent just before its socket closes (a page unloading: a close frame, no
/// `leave`) are decided before the leave's grant: the grant was committed first (the commands
/// were queued behind a busy writer, or not yet sent to the store at all) and the host's last
/// command refused `stale_epoch`.
#[tokio::test]
async fn commands_sent_before_a_close_are_decided_before_the_host_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let (open, mut alice, mut bob) = host_command_held(&dir, test_config()).await;
    alice.ws.close(None).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    open.send_replace(true);
    let first = bob
        .until(|m| match m {
            ServerMsg::Event(e) => Some(format!("event {}", e.action.as_str())),
            ServerMsg::Assignment(a)
                if a.assignment.reason == hostlease::protocol::Reason::Left =>
            {
                Some("left".into())
            }
            _ => None,
        })
        .await;
    assert_eq!(first, "event poll.open");
}

/// A socket closed (or a leave sent) while its commands wait on a stalled store still ends as a
/// leave, its host replaced, once a write's time has passed: the commands are waited for no
/// longer.
#[tokio::test]
async fn a_close_waits_for_a_stalled_store_no_longer_than_a_write() {
    for leave in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let cfg = hostlease_server::Config {
            write_timeout_ms: 300,
            ..test_config()
        };
        // (The store is never let go.)
        let (_held, mut alice, mut bob) = host_command_held(&dir, cfg).await;
        if leave {
            alice.send(&ClientMsg::Leave).await;
        } else {
            alice.ws.close(None).await.unwrap();
        }
        let host = bob
            .until(|m| match m {
                ServerMsg::Assignment(a)
                    if a.assignment.reason == hostlease::protocol::Reason::Left =>
                {
                    Some(a.assignment.host.clone())
                }
                _ => None,
            })
            .await;
        assert_eq!(host.as_ref().map(|h| h.as_str()), Some("bob"), "{leave}");
    }
}

/// A server on a store whose commands wait until the returned sender says `true`; alice its host
/// with a host command (`poll.open`) sent and held there, bob a member.
async fn host_command_held(
    dir: &tempfile::TempDir,
    cfg: hostlease_server::Config,
) -> (tokio::sync::watch::Sender<bool>, Raw, Raw) {
    let (open, queued) = tokio::sync::watch::channel(false);
    let (_app, addr, app_key) = serve_slowed(
        dir,
        cfg,
        Slow {
            queued: Some(queued),
            ..Slow::default()
        },
    )
    .await;
    let mut alice = Raw::join(addr, "ch", &join_token(&app_key, "ch", "alice", true), None).await;
    alice.until_host().await;
    let (epoch, host_cap) = alice.host_capability().unwrap();
    let mut bob = Raw::join(addr, "ch", &join_token(&app_key, "ch", "bob", true), None).await;
    bob.until(|m| matches!(m, ServerMsg::Welcome { .. }).then_some(()))
        .await;
    alice
        .send(&ClientMsg::Command {
            id: IdempotencyKey::new("held").unwrap(),
            action: Action::new("poll.open").unwrap(),
            payload: serde_json::json!({}).into(),
            epoch,
            capability: host_cap,
            after: None,
        })
        .await;
    (open, alice, bob)
}
