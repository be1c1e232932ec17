//! Group commit: commands and lease renewals queued together commit in one transaction, each
//! checked against the rows as the decisions before it left them; rejected ones change nothing.

mod common;

use common::write_lock;
use futures_util::future::join_all;
use hostlease::protocol::{
    Action, ActionKind, Epoch, IdempotencyKey, Item, Outcome, ParticipantId, Reason, RejectCode,
    Role, RoomId, Seq, SessionId,
};
use hostlease_server::store::{
    notify_chunks, CommandReq, GrantOutcome, GrantReq, Lost, Renewed, SqliteStore, Store,
    INBOX_RETENTION_MS, PARTICIPANT_RETENTION_MS, RECOVER_MAX,
};
use hostlease_server::tokens::{CapClaims, Keypair};
use serde_json::json;

const LEASE: u64 = 60_000;

/// A store on a fresh file (kept while the directory lives).
async fn temp_store() -> (tempfile::TempDir, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("g.db").display());
    let store = SqliteStore::open(&url).await.unwrap();
    (dir, store)
}

/// Grants `room` to `holder` over `epoch` (an election), which must win.
async fn grant_won(
    store: &SqliteStore,
    keys: &Keypair,
    room: &RoomId,
    epoch: u64,
    holder: (ParticipantId, SessionId),
) {
    let grant = GrantReq {
        room: room.clone(),
        expected_epoch: Epoch(epoch),
        holder: Some(holder),
        lease_ms: LEASE,
        reason: Reason::Elected,
        require_lapsed: false,
        close: false,
    };
    assert!(matches!(
        store.grant(grant, keys).await.unwrap(),
        GrantOutcome::Won { .. }
    ));
}

/// A room TTL stored when the floor was 30 ms is used at the floor, 1 s, by grants and renewals
/// alike: under it the SDK never held the lease, and nothing failed the host over.
#[tokio::test]
async fn a_room_ttl_stored_under_the_floor_is_used_at_the_floor() {
    let (_dir, store) = temp_store().await;
    let keys = Keypair::generate("k1");
    let room = RoomId::new("short").unwrap();
    sqlx::query("INSERT INTO rooms (room, ttl_ms) VALUES ('short', 300)")
        .execute(store.pool())
        .await
        .unwrap();
    let (p, sid) = (
        ParticipantId::new("h").unwrap(),
        SessionId::new("h-s").unwrap(),
    );
    grant_won(&store, &keys, &room, 0, (p.clone(), sid.clone())).await;
    let row = store.room(&room).await.unwrap().unwrap();
    assert_eq!(row.current.unwrap().assignment.lease_ms, 1000);
    let renewed = store.renew(&room, Epoch(1), &p, &sid, LEASE).await.unwrap();
    assert!(
        matches!(renewed, Some(Renewed::Until { lease_ms: 1000, .. })),
        "{renewed:?}"
    );
}

/// Room `group` granted to alice (epoch 1), and her host capability.
async fn hosted(store: &SqliteStore, keys: &Keypair) -> (RoomId, CapClaims) {
    let room = RoomId::new("group").unwrap();
    let host = ParticipantId::new("alice").unwrap();
    let sid = SessionId::new("s-alice").unwrap();
    grant_won(store, keys, &room, 0, (host.clone(), sid.clone())).await;
    let now = store.now_ms().await.unwrap();
    let claims = CapClaims {
        room: room.clone(),
        sub: host,
        sid,
        role: Role::Host,
        epoch: Some(Epoch(1)),
        actions: vec![Action::new("poll.open").unwrap()],
        exp: now + LEASE,
        sat: now,
        kid: keys.kid.clone(),
    };
    (room, claims)
}

/// The host command `poll.open {n}` with idempotency key `key`, sent with `claims`.
fn host_command(claims: &CapClaims, key: &str, n: u64) -> CommandReq {
    CommandReq {
        room: claims.room.clone(),
        sender: claims.sub.clone(),
        sender_session: Some(claims.sid.clone()),
        claims: claims.clone(),
        kind: ActionKind::Host,
        action: Action::new("poll.open").unwrap(),
        payload: json!({ "n": n }).into(),
        epoch: Some(Epoch(1)),
        key: IdempotencyKey::new(key).unwrap(),
        next_holder: None,
        refuse: None,
        lease_ms: LEASE,
        order: None,
    }
}

enum Req {
    Command(Box<CommandReq>),
    Renew(SessionId),
}

enum Got {
    Command(Outcome),
    Renew(Option<Renewed>),
}

#[tokio::test] // one thread: every request below is queued before the committer runs
async fn queued_decisions_commit_together_in_order_and_rejections_change_nothing() {
    let (_dir, store) = temp_store().await;
    let keys = Keypair::generate("k1");
    let (room, claims) = hosted(&store, &keys).await;
    let (host, sid) = (claims.sub.clone(), claims.sid.clone());
    let cmd = |key: &str, n: u64, claims: &CapClaims| {
        Req::Command(Box::new(host_command(claims, key, n)))
    };
    let stale = CapClaims {
        epoch: Some(Epoch(0)),
        ..claims.clone()
    };
    let mut reqs: Vec<Req> = (0..20).map(|i| cmd(&format!("k{i}"), i, &claims)).collect();
    reqs.push(cmd("stale", 100, &stale));
    reqs.push(cmd("k3", 999, &claims)); // same key, other payload
    reqs.push(cmd("k4", 4, &claims)); // a retry
    reqs.push(Req::Renew(sid.clone()));
    reqs.push(Req::Renew(SessionId::new("s-other-tab").unwrap()));
    reqs.extend((20..25).map(|i| cmd(&format!("k{i}"), i, &claims)));
    let n_reqs = reqs.len();

    let before = store.group_commits();
    let got = join_all(reqs.into_iter().map(|r| {
        let (store, keys, room, host) = (&store, &keys, &room, &host);
        async move {
            match r {
                Req::Command(c) => Got::Command(store.command(*c, keys).await.unwrap().outcome),
                Req::Renew(s) => {
                    Got::Renew(store.renew(room, Epoch(1), host, &s, LEASE).await.unwrap())
                }
            }
        }
    }))
    .await;
    assert_eq!(
        store.group_commits() - before,
        1,
        "{n_reqs} queued decisions, one transaction"
    );

    // The accepted commands took seq 2.. (the grant has seq 1) in the order they were queued.
    let seq_of = |g: &Got| match g {
        Got::Command(Outcome::Accepted { seq }) => seq.0,
        _ => panic!("not accepted"),
    };
    for (i, g) in got[..20].iter().enumerate() {
        assert_eq!(seq_of(g), 2 + i as u64);
    }
    let code = |g: &Got| match g {
        Got::Command(Outcome::Rejected { code, .. }) => *code,
        _ => panic!("not rejected"),
    };
    assert_eq!(code(&got[20]), RejectCode::StaleEpoch);
    assert_eq!(code(&got[21]), RejectCode::IdempotencyConflict);
    assert_eq!(seq_of(&got[22]), 6, "the retry of k4 replays its outcome");
    assert!(matches!(got[23], Got::Renew(Some(Renewed::Until { .. }))));
    assert!(matches!(got[24], Got::Renew(None)));
    for (i, g) in got[25..].iter().enumerate() {
        assert_eq!(seq_of(g), 22 + i as u64);
    }

    // The room and its log hold exactly the 25 accepted events, in order; nothing else.
    let row = store.room(&room).await.unwrap().unwrap();
    assert_eq!((row.epoch, row.seq), (Epoch(1), Seq(26)));
    let (items, _) = store
        .log_range(&room, Seq(1), Seq(100), 100, usize::MAX)
        .await
        .unwrap();
    let ns: Vec<u64> = items
        .iter()
        .map(|it| match it {
            Item::Event(e) => e.payload.value().unwrap()["n"].as_u64().unwrap(),
            Item::Assignment(_) => panic!("no grant in between"),
        })
        .collect();
    assert_eq!(ns, (0..25).collect::<Vec<_>>());
    // Within a byte budget: the newest items whose JSON fits, oldest first.
    let last3: usize = items[22..]
        .iter()
        .map(|i| hostlease::protocol::codec::encode_body(i).len())
        .sum();
    for (budget, n) in [(last3, 3), (last3 - 1, 2)] {
        let (fit, _) = store
            .log_range(&room, Seq(1), Seq(100), 100, budget)
            .await
            .unwrap();
        assert_eq!(fit, items[25 - n..], "{budget} bytes");
    }

    // A decision queued alone still commits (and is answered) by itself.
    let alone = store.command(host_command(&claims, "k-alone", 7), &keys);
    assert!(matches!(
        alone.await.unwrap().outcome,
        Outcome::Accepted { seq: Seq(27) }
    ));
    assert_eq!(store.group_commits() - before, 2);
}

/// While the committer cannot write (another process holds the database's write lock), commands
/// queue up to `max_queued_commands`; one more is answered `busy` at once and changes nothing,
/// and once the lock is let go the queued ones are decided and new ones queue again.
#[tokio::test]
async fn a_command_past_the_queue_bound_is_refused_at_once() {
    let (dir, mut store) = temp_store().await;
    store.max_queued_commands = 4;
    let keys = Keypair::generate("k1");
    let (room, claims) = hosted(&store, &keys).await;
    let mut lock = write_lock(&dir.path().join("g.db")).await;

    let queued: Vec<_> = (0..4)
        .map(|i| store.command(host_command(&claims, &format!("q{i}"), i), &keys))
        .collect();
    let refused = store.command(host_command(&claims, "over", 4), &keys).await;
    let err = refused
        .map(|_| ())
        .expect_err("the fifth command is refused");
    assert_eq!(err.0, hostlease_server::store::STORE_BUSY);

    sqlx::query("COMMIT").execute(&mut *lock).await.unwrap();
    for (i, q) in join_all(queued).await.into_iter().enumerate() {
        assert!(
            matches!(q.unwrap().outcome, Outcome::Accepted { seq } if seq.0 == 2 + i as u64),
            "queued command {i}"
        );
    }
    let again = store.command(host_command(&claims, "over", 4), &keys).await;
    assert!(matches!(
        again.unwrap().outcome,
        Outcome::Accepted { seq: Seq(6) }
    ));
    let row = store.room(&room).await.unwrap().unwrap();
    assert_eq!(row.seq, Seq(6), "the refused command took no seq");
}

/// Sightings of participants (each join and leave makes one, and no session waits for it) count
/// against the same bound as commands: while the committer cannot write, one past it is refused
/// at once (left out, and counted) instead of queueing (they queued without end while the store
/// stalled).
#[tokio::test]
async fn a_sighting_past_the_queue_bound_is_left_out_at_once() {
    let (dir, mut store) = temp_store().await;
    store.max_queued_commands = 2;
    let mut lock = write_lock(&dir.path().join("g.db")).await;
    let room = RoomId::new("seen").unwrap();
    let p = |s: &str| ParticipantId::new(s).unwrap();
    let (a, b) = (p("a"), p("b"));
    let mut queued = Box::pin(join_all([
        store.remember_participant(&room, &a),
        store.remember_participant(&room, &b),
    ]));
    assert!(futures_util::poll!(&mut queued).is_pending());
    // (A bound on a hang without the fix only: the refusal does not wait.)
    let over = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        store.remember_participant(&room, &p("c")),
    )
    .await
    .expect("a sighting past the bound queued");
    // Left out and counted (`hostlease_participants_not_recorded_total`), not an error to warn of.
    over.unwrap();
    sqlx::query("COMMIT").execute(&mut *lock).await.unwrap();
    for r in queued.await {
        r.unwrap();
    }
    store.remember_participant(&room, &p("d")).await.unwrap();
    let seen: Vec<String> =
        sqlx::query_scalar("SELECT participant FROM participants ORDER BY participant")
            .fetch_all(store.pool())
            .await
            .unwrap();
    assert_eq!(seen, ["a", "b", "d"]);
}

/// A kick revokes the capabilities of the kicked participant's sessions begun before it, over
/// either transport: a WebSocket session on another process than the kick's sent commands that
/// were accepted until that process's next sweep closed it.
#[tokio::test]
async fn a_kick_revokes_the_capabilities_of_sessions_begun_before_it() {
    let (_dir, store) = temp_store().await;
    let keys = Keypair::generate("k1");
    let (room, claims) = hosted(&store, &keys).await;
    let done = store
        .command(host_command(&claims, "before", 1), &keys)
        .await
        .unwrap();
    assert!(matches!(done.outcome, Outcome::Accepted { .. }));
    store.record_kick(&room, &claims.sub).await.unwrap();
    for (key, session) in [("ws", Some(claims.sid.clone())), ("http", None)] {
        let cmd = CommandReq {
            sender_session: session,
            ..host_command(&claims, key, 2)
        };
        let done = store.command(cmd, &keys).await.unwrap();
        assert_eq!(
            rejection(&done.outcome),
            Some(RejectCode::BadCapability),
            "{key}"
        );
    }
}

/// A host command of a forced grant's holder is refused while the room is fenced (the lease the
/// grant took away may still run), whatever capability it carries: the server issues none then,
/// and the store does not rely on that.
#[tokio::test]
async fn no_host_command_is_accepted_while_the_room_is_fenced() {
    let (_dir, store) = temp_store().await;
    let keys = Keypair::generate("k1");
    let (room, alice) = hosted(&store, &keys).await;
    let bob = (
        ParticipantId::new("bob").unwrap(),
        SessionId::new("s-bob").unwrap(),
    );
    let forced = GrantReq {
        room: room.clone(),
        expected_epoch: Epoch(1),
        holder: Some(bob.clone()),
        lease_ms: LEASE,
        reason: Reason::Admin,
        require_lapsed: false,
        close: false,
    };
    assert!(matches!(
        store.grant(forced, &keys).await.unwrap(),
        GrantOutcome::Won { .. }
    ));
    let claims = CapClaims {
        sub: bob.0,
        sid: bob.1,
        epoch: Some(Epoch(2)),
        ..alice
    };
    let cmd = CommandReq {
        epoch: Some(Epoch(2)),
        ..host_command(&claims, "fenced", 1)
    };
    let done = store.command(cmd, &keys).await.unwrap();
    assert_eq!(rejection(&done.outcome), Some(RejectCode::LeaseExpired));
}

/// The code of a rejection; `None` for an accepted command.
fn rejection(o: &Outcome) -> Option<RejectCode> {
    match o {
        Outcome::Rejected { code, .. } => Some(*code),
        Outcome::Accepted { .. } => None,
    }
}

/// The offline-inbox notifier writes a batch of outbox rows from several rooms in one go: each
/// room's participants who did not get a row live get it (offline, connected only after it, or
/// connected to a process that has not published it yet), the others and other rooms'
/// participants nothing, and a row is written once.
#[tokio::test]
async fn a_notified_batch_reaches_exactly_the_offline_participants_of_each_room() {
    let (_dir, store) = temp_store().await;
    let keys = Keypair::generate("k1");
    let pid = |s: &str| ParticipantId::new(s).unwrap();
    let (r1, r2) = (RoomId::new("one").unwrap(), RoomId::new("two").unwrap());
    for (room, people) in [(&r1, ["ann", "bob", "cat"]), (&r2, ["dan", "eve", "fay"])] {
        for p in people {
            store.remember_participant(room, &pid(p)).await.unwrap();
        }
        for epoch in 0..2 {
            let holder = (pid(people[0]), SessionId::new(format!("s{epoch}")).unwrap());
            grant_won(&store, &keys, room, epoch, holder).await;
        }
    }
    let rows = store.unnotified(256).await.unwrap();
    assert_eq!(rows.len(), 4, "two grants in each room");
    let all = (Seq::ZERO, Seq(u64::MAX));
    let online = [
        ((r1.clone(), pid("ann")), all),
        ((r2.clone(), pid("eve")), all),
        // Subscribed after every row (back before the notifier ran): did not get them live.
        ((r2.clone(), pid("fay")), (Seq(u64::MAX - 1), Seq(u64::MAX))),
        // On a process that has published none of them yet.
        ((r2.clone(), pid("dan")), (Seq::ZERO, Seq::ZERO)),
    ]
    .into_iter()
    .collect();
    assert_eq!(store.notify(&rows, &online).await.unwrap(), 4);
    assert!(store.unnotified(256).await.unwrap().is_empty());
    assert_eq!(
        store.notify(&rows, &online).await.unwrap(),
        0,
        "written once"
    );
    for (room, p, want) in [
        (&r1, "ann", 0),
        (&r1, "bob", 2),
        (&r1, "cat", 2),
        (&r2, "dan", 2),
        (&r2, "eve", 0),
        (&r2, "fay", 2),
        (&r1, "dan", 0),
    ] {
        let got = store
            .inbox(room, &pid(p), 0, 100, usize::MAX)
            .await
            .unwrap()
            .entries;
        assert_eq!(got.len(), want, "{p} in {room:?}");
        assert!(got.iter().all(|e| matches!(e.item, Item::Assignment(_))));
    }
}

/// The notifier's transactions hold the one writer every process commits through: at most 16
/// outbox rows and about 2,048 inbox entries each, a row never split (one past it alone). A room
/// with thousands of participants away made 16 rows half a million inserts in one transaction,
/// seconds in which no lease was renewed anywhere.
#[test]
fn notify_transactions_are_bounded_by_rows_and_by_entries() {
    assert_eq!(notify_chunks(&[1; 40]), vec![0..16, 16..32, 32..40]);
    assert_eq!(notify_chunks(&[1000; 5]), vec![0..2, 2..4, 4..5]);
    assert_eq!(
        notify_chunks(&[30_000, 1, 1, 30_000, 0]),
        vec![0..1, 1..3, 3..4, 4..5]
    );
    assert!(notify_chunks(&[]).is_empty());
}

/// Rows whose entries take more than one transaction all reach every participant away, once.
#[tokio::test]
async fn a_batch_split_by_its_entries_reaches_every_participant_once() {
    let (_dir, store) = temp_store().await;
    let keys = Keypair::generate("k1");
    let room = RoomId::new("big").unwrap();
    // 1,500 participants seen now: two rows are 3,000 entries, two transactions.
    sqlx::query(&format!(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1500) \
         INSERT INTO participants (room, participant, seen_at) SELECT 'big', 'p' || i, {} FROM n",
        hostlease_server::store::NOW
    ))
    .execute(store.pool())
    .await
    .unwrap();
    for epoch in 0..2 {
        let holder = (
            ParticipantId::new("p1").unwrap(),
            SessionId::new(format!("s{epoch}")).unwrap(),
        );
        grant_won(&store, &keys, &room, epoch, holder).await;
    }
    assert_eq!(notify_all(&store).await, 2);
    let entries: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM inbox WHERE room = 'big'")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(entries, 3000);
    let p = ParticipantId::new("p1500").unwrap();
    let got = store.inbox(&room, &p, 0, 100, usize::MAX).await.unwrap();
    assert_eq!(got.entries.len(), 2);
}

/// Inbox recovery for sessions ended without a close: an item several of them lost is stored
/// once, each participant gets its range in seq order and an item once (two tabs lost
/// together), one that lost more than `RECOVER_MAX` items gets the newest (a client that never
/// answered a ping confirmed nothing since it joined), and an item trimmed from the log is
/// passed over.
#[tokio::test]
async fn recovered_items_are_stored_once_each_session_its_newest() {
    let (_dir, store) = temp_store().await;
    common::backlog(&store, "rec", RECOVER_MAX + 76).await;
    let room = RoomId::new("rec").unwrap();
    let pid = |s: &str| ParticipantId::new(s).unwrap();
    let lost = |p: &str, after: u64, upto: u64| Lost {
        room: room.clone(),
        participant: pid(p),
        after: Seq(after),
        upto: Seq(upto),
    };
    let top = RECOVER_MAX + 76;
    // One item trimmed from the log meanwhile: nothing to copy.
    sqlx::query("DELETE FROM log WHERE seq = ?")
        .bind((top - 3) as i64)
        .execute(store.pool())
        .await
        .unwrap();
    let n = store
        .recover_inbox(&[
            lost("ann", top - 10, top),
            lost("bob", top - 5, top - 1),
            lost("cat", 0, top),
            lost("ann", top - 2, top), // her other tab
            lost("dan", 7, 7),
        ])
        .await
        .unwrap();
    assert_eq!(n as u64, 9 + 3 + RECOVER_MAX - 1);
    let stored: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM inbox_items")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(stored as u64, RECOVER_MAX - 1, "each item once");
    for (p, from, to) in [
        ("ann", top - 9, top),
        ("bob", top - 4, top - 1),
        ("cat", top - RECOVER_MAX + 1, top),
    ] {
        let want: Vec<u64> = (from..=to).filter(|&s| s != top - 3).collect();
        assert_eq!(inbox_seqs(&store, &room, &pid(p)).await, want, "{p}");
    }
    assert_eq!(inbox_len(&store, &room, &pid("dan")).await, 0);
}

/// A lost session's copy stops at 4 MiB of items, its newest first, but takes its newest item
/// whatever its size.
#[tokio::test]
async fn recovered_items_stop_at_the_byte_budget_but_the_newest_is_always_copied() {
    let (_dir, store) = temp_store().await;
    let pid = |s: &str| ParticipantId::new(s).unwrap();
    let lost = |room: &RoomId, p: &str, upto: u64| Lost {
        room: room.clone(),
        participant: pid(p),
        after: Seq(0),
        upto: Seq(upto),
    };
    // Items padded with `bytes` trailing spaces each (still JSON).
    let pad = |room: &'static str, seqs: std::ops::RangeInclusive<i64>, bytes: i64| {
        sqlx::query("UPDATE log SET item = item || printf('%*s', ?, '') WHERE room = ? AND seq BETWEEN ? AND ?")
            .bind(bytes)
            .bind(room)
            .bind(*seqs.start())
            .bind(*seqs.end())
    };
    common::backlog(&store, "big", 10).await;
    common::backlog(&store, "huge", 3).await;
    pad("big", 8..=10, 3 << 19)
        .execute(store.pool())
        .await
        .unwrap(); // 1.5 MiB each
    pad("huge", 3..=3, 5 << 20)
        .execute(store.pool())
        .await
        .unwrap(); // 5 MiB
    let (big, huge) = (RoomId::new("big").unwrap(), RoomId::new("huge").unwrap());
    store
        .recover_inbox(&[
            lost(&big, "eve", 10),
            lost(&big, "fay", 7),
            lost(&huge, "gus", 3),
        ])
        .await
        .unwrap();
    for (room, p, want) in [
        (&big, "eve", vec![9, 10]), // 3 MiB; the third would make 4.5
        (&big, "fay", (1..=7).collect()),
        (&huge, "gus", vec![3]), // past the budget alone
    ] {
        assert_eq!(inbox_seqs(&store, room, &pid(p)).await, want, "{p}");
    }
}

/// The seqs of the items in `p`'s inbox, in cursor order.
async fn inbox_seqs(store: &SqliteStore, room: &RoomId, p: &ParticipantId) -> Vec<u64> {
    store
        .inbox(room, p, 0, 2 * RECOVER_MAX as i64, usize::MAX)
        .await
        .unwrap()
        .entries
        .iter()
        .map(|e| e.item.seq().0)
        .collect()
}

/// Writes every pending outbox row into the inboxes of the room's participants, all offline.
async fn notify_all(store: &SqliteStore) -> usize {
    let rows = store.unnotified(100).await.unwrap();
    store.notify(&rows, &Default::default()).await.unwrap()
}

async fn inbox_len(store: &SqliteStore, room: &RoomId, p: &ParticipantId) -> usize {
    store
        .inbox(room, p, 0, 100, usize::MAX)
        .await
        .unwrap()
        .entries
        .len()
}

/// Offline inboxes are bounded: housekeeping deletes entries past their retention and forgets
/// participants not seen for long, who then get no more entries (until they join again). With
/// the default retentions, fresh entries and participants stay.
#[tokio::test]
async fn inbox_entries_and_forgotten_participants_are_pruned() {
    let (_dir, mut store) = temp_store().await;
    let keys = Keypair::generate("k1");
    let room = RoomId::new("inbox").unwrap();
    let away = ParticipantId::new("away").unwrap();
    store.remember_participant(&room, &away).await.unwrap();
    let holder = (
        ParticipantId::new("h").unwrap(),
        SessionId::new("h-s").unwrap(),
    );
    grant_won(&store, &keys, &room, 0, holder.clone()).await;
    assert_eq!(notify_all(&store).await, 1);
    assert_eq!(inbox_len(&store, &room, &away).await, 1);
    store.housekeeping(10_000, false).await.unwrap();
    assert_eq!(
        inbox_len(&store, &room, &away).await,
        1,
        "a fresh entry is kept"
    );

    // Past the inbox retention: the entry goes; the participant (seen just now) stays.
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    store.inbox_retention_ms = 10;
    store.housekeeping(10_000, false).await.unwrap();
    assert_eq!(inbox_len(&store, &room, &away).await, 0);
    grant_won(&store, &keys, &room, 1, holder.clone()).await;
    notify_all(&store).await;
    assert_eq!(inbox_len(&store, &room, &away).await, 1, "still remembered");

    // Not seen for longer than the participant retention: forgotten, no more entries.
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    store.inbox_retention_ms = INBOX_RETENTION_MS;
    store.participant_retention_ms = 10;
    store.housekeeping(10_000, false).await.unwrap();
    assert_eq!(
        inbox_len(&store, &room, &away).await,
        1,
        "the entry is within its retention"
    );
    grant_won(&store, &keys, &room, 2, holder.clone()).await;
    notify_all(&store).await;
    assert_eq!(
        inbox_len(&store, &room, &away).await,
        1,
        "a forgotten participant gets no entry"
    );
    // Joining again makes it known again.
    store.participant_retention_ms = PARTICIPANT_RETENTION_MS;
    store.remember_participant(&room, &away).await.unwrap();
    grant_won(&store, &keys, &room, 3, holder).await;
    notify_all(&store).await;
    assert_eq!(inbox_len(&store, &room, &away).await, 2);

    // A backlog larger than one delete batch goes entirely (in several statements), and rows
    // written by a process of the code before the retention (created_at 0) count from now.
    let old = hostlease_server::store::NOW;
    sqlx::query(&format!(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2500) \
         INSERT INTO inbox (room, participant, item, created_at) \
         SELECT 'inbox', 'away', '{{}}', {old} - 3600000 FROM n"
    ))
    .execute(store.pool())
    .await
    .unwrap();
    sqlx::query("INSERT INTO inbox (room, participant, item) VALUES ('inbox', 'away', '{}')")
        .execute(store.pool())
        .await
        .unwrap();
    store.inbox_retention_ms = 60_000;
    store.housekeeping(10_000, false).await.unwrap();
    let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM inbox")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(
        left, 3,
        "the 2,500 old rows go; the fresh two and the unstamped one stay"
    );
}

/// An inbox page ends at its byte budget (one entry at least) or its length, with the cursor to
/// read on from; an entry that no longer decodes is passed over, not the end of the reading; a
/// page that ends exactly with the inbox says so; a cursor past `i64::MAX` is the end (it wrapped
/// to the first page). A page was read whole: 256 entries of up to 59 KiB.
#[tokio::test]
async fn an_inbox_page_ends_at_its_byte_budget() {
    let (_dir, store) = temp_store().await;
    let keys = Keypair::generate("k1");
    let room = RoomId::new("pages").unwrap();
    let pid = |s: &str| ParticipantId::new(s).unwrap();
    let p = pid("p0");
    store.remember_participant(&room, &p).await.unwrap();
    let holder = (pid("h"), SessionId::new("h-s").unwrap());
    grant_won(&store, &keys, &room, 0, holder).await;
    assert_eq!(notify_all(&store).await, 1);
    let text: String = sqlx::query_scalar("SELECT item FROM inbox_items")
        .fetch_one(store.pool())
        .await
        .unwrap();
    // Four more entries, the third of them an item that no longer decodes.
    for item in [&text, &text, "{\"t\":\"gone\"}", &text] {
        sqlx::query(&format!(
            "INSERT INTO inbox (room, participant, item, created_at) VALUES ('pages', 'p0', ?, {})",
            hostlease_server::store::NOW
        ))
        .bind(item)
        .execute(store.pool())
        .await
        .unwrap();
    }
    let page = |since: u64, limit: i64, bytes: usize| {
        let (store, room, p) = (&store, &room, &p);
        async move { store.inbox(room, p, since, limit, bytes).await.unwrap() }
    };
    let cursors = |pg: &hostlease::protocol::InboxPage| -> Vec<u64> {
        pg.entries.iter().map(|e| e.cursor).collect()
    };
    let all = page(0, 10, usize::MAX).await;
    let c = cursors(&all);
    assert_eq!((c.len(), all.next), (4, None), "{c:?}");
    // Two items' worth of bytes: two entries.
    let first = page(0, 10, 2 * text.len()).await;
    assert_eq!((cursors(&first), first.next), (c[..2].to_vec(), Some(c[1])));
    // Less than one item's: one entry all the same.
    let one = page(c[1], 10, 1).await;
    assert_eq!((cursors(&one), one.next), (vec![c[2]], Some(c[2])));
    // The undecodable entry is passed over: the page after it goes on.
    let rest = page(c[2], 10, usize::MAX).await;
    assert_eq!((cursors(&rest), rest.next), (vec![c[3]], None));
    // A page of one that holds only the undecodable entry is empty, and goes on past it.
    let skipped = page(c[2], 1, usize::MAX).await;
    assert!(skipped.entries.is_empty());
    let after = skipped.next.expect("more is left");
    assert!(c[2] < after && after < c[3]);
    let last = page(after, 1, usize::MAX).await;
    assert_eq!(
        (cursors(&last), last.next),
        (vec![c[3]], None),
        "the page ends exactly with the inbox"
    );
    let short = page(0, 1, usize::MAX).await;
    assert_eq!((cursors(&short), short.next), (vec![c[0]], Some(c[0])));
    let past = page(u64::MAX, 10, usize::MAX).await;
    assert_eq!((past.entries.len(), past.next), (0, None));
}

/// An item in several offline inboxes is stored once, each participant's row pointing at it (a
/// copy per row made one 58 KB vote in a room with 300 away a 17 MB transaction); a row of the
/// code before (its own copy, no pointer) still reads; an item goes once it is old and no row
/// points at it.
#[tokio::test]
async fn an_item_in_many_inboxes_is_stored_once() {
    let (_dir, mut store) = temp_store().await;
    let keys = Keypair::generate("k1");
    let room = RoomId::new("many").unwrap();
    let away: Vec<ParticipantId> = (0..3)
        .map(|i| ParticipantId::new(format!("p{i}")).unwrap())
        .collect();
    for p in &away {
        store.remember_participant(&room, p).await.unwrap();
    }
    let holder = (
        ParticipantId::new("h").unwrap(),
        SessionId::new("h-s").unwrap(),
    );
    grant_won(&store, &keys, &room, 0, holder).await;
    assert_eq!(notify_all(&store).await, 1);
    let pool = store.pool().clone();
    let count = |q: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(q)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    assert_eq!(count("SELECT COUNT(*) FROM inbox_items").await, 1);
    assert_eq!(count("SELECT COUNT(*) FROM inbox").await, 3);
    assert_eq!(
        count("SELECT COALESCE(SUM(LENGTH(item)), 0) FROM inbox").await,
        0,
        "no row holds a copy"
    );
    for p in &away {
        let got = store
            .inbox(&room, p, 0, 10, usize::MAX)
            .await
            .unwrap()
            .entries;
        assert_eq!(got.len(), 1, "{p:?}");
        assert!(matches!(got[0].item, Item::Assignment(_)), "{got:?}");
    }
    let text: String = sqlx::query_scalar("SELECT item FROM inbox_items")
        .fetch_one(store.pool())
        .await
        .unwrap();
    sqlx::query(&format!(
        "INSERT INTO inbox (room, participant, item, created_at) VALUES ('many', 'p0', ?, {})",
        hostlease_server::store::NOW
    ))
    .bind(&text)
    .execute(store.pool())
    .await
    .unwrap();
    assert_eq!(
        store
            .inbox(&room, &away[0], 0, 10, usize::MAX)
            .await
            .unwrap()
            .entries
            .len(),
        2
    );
    // An item past the retention stays while a row within it points at it (the row is written
    // after its item, and housekeeping reads the clock once per delete).
    sqlx::query(&format!(
        "UPDATE inbox_items SET created_at = {} - 3600000",
        hostlease_server::store::NOW
    ))
    .execute(store.pool())
    .await
    .unwrap();
    store.inbox_retention_ms = 60_000;
    store.housekeeping(10_000, false).await.unwrap();
    assert_eq!(count("SELECT COUNT(*) FROM inbox_items").await, 1);
    for p in &away {
        assert!(
            !store
                .inbox(&room, p, 0, 10, usize::MAX)
                .await
                .unwrap()
                .entries
                .is_empty(),
            "{p:?}"
        );
    }
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    store.inbox_retention_ms = 10;
    store.housekeeping(10_000, false).await.unwrap();
    assert_eq!(count("SELECT COUNT(*) FROM inbox_items").await, 0);
    assert_eq!(count("SELECT COUNT(*) FROM inbox").await, 0);
}

/// Housekeeping's deletes go a batch at a time through an index, never over a whole table (a
/// full scan of the room log or of the idempotency records on the one writer connection held up
/// every lease renewal queued behind it, for seconds with millions of rows).
#[tokio::test]
async fn housekeeping_deletes_find_their_rows_through_an_index() {
    let (_dir, store) = temp_store().await;
    for q in hostlease_server::store::prune_sql() {
        let plan: Vec<(i64, i64, i64, String)> = sqlx::query_as(&format!("EXPLAIN QUERY PLAN {q}"))
            .bind(1_000i64)
            .bind(1_000i64)
            .fetch_all(store.pool())
            .await
            .unwrap();
        let steps: Vec<&str> = plan.iter().map(|r| r.3.as_str()).collect();
        assert!(
            steps.iter().all(|s| !s.starts_with("SCAN ")),
            "{q}\n{steps:?}"
        );
        assert!(q.contains(" LIMIT "), "{q}");
    }
    // Delivered outbox rows, and (without a webhook) unclaimed ones, are found through an index
    // of those alone: through the one of all rows by age, each run walked every row still
    // waiting for a receiver that is down.
    let sql = hostlease_server::store::prune_sql();
    for (q, index) in [
        (&sql[4], "outbox_done_by_age"),
        (&sql[5], "outbox_unclaimed_by_age"),
    ] {
        let plan: Vec<(i64, i64, i64, String)> = sqlx::query_as(&format!("EXPLAIN QUERY PLAN {q}"))
            .bind(1_000i64)
            .fetch_all(store.pool())
            .await
            .unwrap();
        assert!(plan.iter().any(|r| r.3.contains(index)), "{q}\n{plan:?}");
    }
}

/// Each room's log is trimmed to its newest items (a backlog larger than one batch entirely),
/// a short log is left alone, a closed room's log goes whole (no one may join it to read it; it
/// was kept for ever), and a backlog of old idempotency records goes entirely.
#[tokio::test]
async fn housekeeping_trims_every_room_log_and_old_idempotency_records() {
    let (_dir, store) = temp_store().await;
    let now = hostlease_server::store::NOW;
    for (room, seq, closed) in [
        ("a", 2500, false),
        ("b", 5, false),
        ("c", 1200, false),
        ("d", 50, true),
        ("e", 1500, true),
    ] {
        sqlx::query("INSERT INTO rooms (room, seq, closed) VALUES (?, ?, ?)")
            .bind(room)
            .bind(seq)
            .bind(closed)
            .execute(store.pool())
            .await
            .unwrap();
        sqlx::query(&format!(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {seq}) \
             INSERT INTO log (room, seq, item) SELECT '{room}', i, '{{}}' FROM n"
        ))
        .execute(store.pool())
        .await
        .unwrap();
    }
    sqlx::query(&format!(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2500) \
         INSERT INTO idempotency (room, sub, key, request_hash, outcome, created_at) \
         SELECT 'a', 'p', 'k' || i, 'h', 'o', {now} - 3 * 86400000 FROM n"
    ))
    .execute(store.pool())
    .await
    .unwrap();
    sqlx::query(&format!(
        "INSERT INTO idempotency (room, sub, key, request_hash, outcome, created_at) \
         VALUES ('a', 'p', 'fresh', 'h', 'o', {now})"
    ))
    .execute(store.pool())
    .await
    .unwrap();
    store.housekeeping(100, false).await.unwrap();
    for (room, first, last) in [("a", 2401, 2500), ("b", 1, 5), ("c", 1101, 1200)] {
        let (lo, hi, n): (i64, i64, i64) =
            sqlx::query_as("SELECT MIN(seq), MAX(seq), COUNT(*) FROM log WHERE room = ?")
                .bind(room)
                .fetch_one(store.pool())
                .await
                .unwrap();
        assert_eq!((lo, hi, n), (first, last, last - first + 1), "room {room}");
    }
    let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM log WHERE room IN ('d', 'e')")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(left, 0, "closed rooms' logs");
    // Trimmed, the open rooms are listed again (their logs grow); a closed one is not.
    let listed: Vec<(String, i64, bool)> = sqlx::query_as(hostlease_server::store::LOG_TRIM_ROOMS)
        .bind("")
        .bind(100i64)
        .fetch_all(store.pool())
        .await
        .unwrap();
    let listed: Vec<&str> = listed.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(listed, ["a", "c"]);
    let keys: Vec<String> = sqlx::query_scalar("SELECT key FROM idempotency")
        .fetch_all(store.pool())
        .await
        .unwrap();
    assert_eq!(keys, vec!["fresh".to_string()]);
}

/// The idempotency hash: the same request written differently (whitespace, key order, escapes)
/// hashes the same, as the old `serde_json::Value` form did for every payload it could read
/// exactly; two different numbers that one `f64` stands for do not (the second request was
/// answered as a repeat of the first, its payload dropped).
#[test]
fn the_request_hash_tells_every_different_payload_apart() {
    use hostlease::protocol::json::Json;
    use hostlease_server::store::request_hash;
    use sha2::{Digest, Sha256};
    let vote = Action::new("vote").unwrap();
    let hash = |text: &str| request_hash(&vote, &Json::parse(text).unwrap());
    for (a, b) in [
        (
            r#"{"n":18446744073709551616}"#,
            r#"{"n":18446744073709551617}"#,
        ),
        (r#"{"n":9007199254740993}"#, r#"{"n":9007199254740992.0}"#),
        (r#"[0.1000000000000000055511151231257827]"#, r#"[0.1]"#),
    ] {
        assert_ne!(hash(a), hash(b), "{a} and {b}");
    }
    assert_eq!(
        hash(r#" { "b" : [1, true, null], "a": "x\u00e9\/", "a": "y" } "#),
        hash(r#"{"a":"y","b":[1,true,null]}"#)
    );
    // Stored hashes of payloads the old form read exactly stay valid across the upgrade.
    for text in [
        r#"{"choice":"b","n":3,"ratio":0.25,"tags":["x","é\u0001"],"z":{"k":-7}}"#,
        r#"[1, 2.5, "\"quoted\"", {"b":false,"a":null}]"#,
        r#""plain""#,
        "12",
    ] {
        let old = {
            let v: serde_json::Value = serde_json::from_str(text).unwrap();
            let mut h = Sha256::new();
            h.update(b"vote\n");
            h.update(v.to_string().as_bytes());
            h.finalize()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        };
        assert_eq!(hash(text), old, "{text}");
    }
}

/// A store whose room `room` had three grants (epochs 1 to 3, seqs 1 to 3), their outbox rows
/// notified.
async fn three_notified_grants(room: &str) -> (tempfile::TempDir, SqliteStore) {
    let (dir, store) = temp_store().await;
    let keys = Keypair::generate("k1");
    let room = RoomId::new(room).unwrap();
    let holder = (
        ParticipantId::new("h").unwrap(),
        SessionId::new("h-s").unwrap(),
    );
    for epoch in 0..3 {
        grant_won(&store, &keys, &room, epoch, holder.clone()).await;
    }
    notify_all(&store).await;
    (dir, store)
}

/// A webhook delivery is retried for 24 h after its commit, however many attempts failed (it was
/// given up after 12, some 10–20 minutes of backoff: a receiver down for a deploy lost what was
/// committed meanwhile); past that it is no longer tried, and housekeeping deletes it.
#[tokio::test]
async fn webhook_deliveries_are_retried_for_a_day_then_given_up() {
    let (_dir, store) = three_notified_grants("wh").await;
    let now = hostlease_server::store::NOW;
    // Two failed 40 times; the first was committed two hours ago, the second 25 hours ago. The
    // third, two hours ago too, was delivered.
    for (seq, age_h) in [(1, 2), (2, 25), (3, 2)] {
        sqlx::query(&format!(
            "UPDATE outbox SET webhook_attempts = 40, created_at = {now} - {age_h} * 3600000 \
             WHERE seq = ?"
        ))
        .bind(seq)
        .execute(store.pool())
        .await
        .unwrap();
    }
    sqlx::query(&format!(
        "UPDATE outbox SET webhook_done_at = {now} WHERE seq = 3"
    ))
    .execute(store.pool())
    .await
    .unwrap();
    let due = store.webhook_due(64, 30_000).await.unwrap();
    assert_eq!(
        due.iter()
            .map(|r| (r.key.as_str(), r.attempts))
            .collect::<Vec<_>>(),
        vec![("assignment:wh:1", 40)],
        "retried after 40 failures within the day; not past it"
    );
    // Another process on the file, without a webhook, keeps the row the webhook worker holds
    // too: its hour's retention deleted it, never delivered and never counted as given up.
    for webhook in [false, true] {
        store.housekeeping(10_000, webhook).await.unwrap();
        let left: Vec<i64> = sqlx::query_scalar("SELECT seq FROM outbox ORDER BY seq")
            .fetch_all(store.pool())
            .await
            .unwrap();
        assert_eq!(
            left,
            vec![1],
            "the row given up and the one delivered are deleted, the other kept ({webhook})"
        );
    }
    // Past its 24 h, the claimed row is the webhook process's to count as given up first: the
    // other keeps it an hour more.
    let seqs = || async {
        sqlx::query_scalar::<_, i64>("SELECT seq FROM outbox")
            .fetch_all(store.pool())
            .await
            .unwrap()
    };
    sqlx::query(&format!(
        "UPDATE outbox SET created_at = {now} - 24 * 3600000 - 1800000 WHERE seq = 1"
    ))
    .execute(store.pool())
    .await
    .unwrap();
    store.housekeeping(10_000, false).await.unwrap();
    assert_eq!(seqs().await, vec![1]);
    store.housekeeping(10_000, true).await.unwrap();
    assert_eq!(seqs().await, Vec::<i64>::new());
}

/// A process without a webhook deletes the rows no worker claimed after an hour, but not while a
/// webhook worker on the file is behind (it claimed, put off or delivered a row within that hour): a
/// receiver that hangs holds each send its 10 s, the worker claims ~3 rows a second, and rows
/// committed faster grew an hour old unclaimed and were deleted, never delivered nor counted.
#[tokio::test]
async fn unclaimed_outbox_rows_are_kept_while_a_webhook_worker_is_behind() {
    let (_dir, store) = three_notified_grants("wb").await;
    let now = hostlease_server::store::NOW;
    // All committed two hours ago; the worker has claimed only the first.
    sqlx::query(&format!("UPDATE outbox SET created_at = {now} - 7200000"))
        .execute(store.pool())
        .await
        .unwrap();
    let seqs = || async {
        sqlx::query_scalar::<_, i64>("SELECT seq FROM outbox ORDER BY seq")
            .fetch_all(store.pool())
            .await
            .unwrap()
    };
    let claimed = store.webhook_due(1, 30_000).await.unwrap();
    assert_eq!(claimed.len(), 1);
    store.housekeeping(10_000, false).await.unwrap();
    assert_eq!(
        seqs().await,
        [1, 2, 3],
        "deleted while the worker is behind"
    );
    // Delivered: between that answer and its next claim the worker has no row in flight. The
    // delivered row goes (its hour is past), the others stay.
    store.webhook_result(&claimed[0], true, 0).await.unwrap();
    store.housekeeping(10_000, false).await.unwrap();
    assert_eq!(
        seqs().await,
        [2, 3],
        "deleted between two of the worker's claims"
    );
    // Nothing in flight, put off or delivered since: no worker is running, the rows go.
    store.housekeeping(10_000, false).await.unwrap();
    assert_eq!(seqs().await, Vec::<i64>::new());
}

/// Processes started together on a fresh file (or on an upgraded one) all open it: sqlx's
/// SQLite migrator takes no lock, so each read the applied list, and all but the first to
/// commit failed on `table rooms already exists` and exited.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stores_opened_at_once_on_one_file_all_open() {
    for _ in 0..10 {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("m.db").display());
        let opening = (0..4).map(|_| {
            let url = url.clone();
            tokio::spawn(async move { SqliteStore::open(&url).await.map(drop) })
        });
        for r in join_all(opening).await {
            let r = r.expect("the open task ran");
            assert!(r.is_ok(), "{:?}", r.err());
        }
    }
}

/// A kick is kept as long as a capability minted before it can live (a day) and an hour: it
/// revokes them over HTTP, and deleted after an hour, a day-long participant token from before
/// it worked again.
#[tokio::test]
async fn kicks_are_kept_as_long_as_the_capabilities_they_revoke() {
    let (_dir, store) = temp_store().await;
    let now = hostlease_server::store::NOW;
    let keep = hostlease_server::store::KICK_RETENTION_MS;
    assert!(keep > hostlease_server::MAX_CAPABILITY_MS as i64);
    for (p, age) in [
        ("recent", 7_200_000),
        ("day", keep - 60_000),
        ("old", keep + 60_000),
    ] {
        sqlx::query(&format!(
            "INSERT INTO kicks (room, participant, created_at) VALUES ('k', ?, {now} - ?)"
        ))
        .bind(p)
        .bind(age)
        .execute(store.pool())
        .await
        .unwrap();
    }
    store.housekeeping(10_000, false).await.unwrap();
    let left: Vec<String> = sqlx::query_scalar("SELECT participant FROM kicks ORDER BY id")
        .fetch_all(store.pool())
        .await
        .unwrap();
    assert_eq!(left, ["recent", "day"]);
}

/// A delivery failure recorded after its claim ran out (the writer was slow) does not cut short
/// the claim of the process sending the row since: it set the next attempt 500 ms away, and a
/// third process sent the row while the second still was.
#[tokio::test]
async fn a_late_webhook_failure_does_not_cut_another_process_s_claim_short() {
    let (dir, a) = temp_store().await;
    let url = format!("sqlite://{}", dir.path().join("g.db").display());
    let b = SqliteStore::open(&url).await.unwrap();
    let keys = Keypair::generate("k1");
    let holder = (
        ParticipantId::new("h").unwrap(),
        SessionId::new("h-s").unwrap(),
    );
    grant_won(&a, &keys, &RoomId::new("wl").unwrap(), 0, holder).await;
    notify_all(&a).await;
    let mine = a.webhook_due(64, 50).await.unwrap();
    assert_eq!(mine.len(), 1);
    tokio::time::sleep(std::time::Duration::from_millis(60)).await;
    let theirs = b.webhook_due(64, 30_000).await.unwrap();
    assert_eq!(
        theirs.len(),
        1,
        "the claim ran out: another process takes the row"
    );
    a.webhook_result(&mine[0], false, 200).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(a.webhook_due(64, 50).await.unwrap().is_empty());
    // Its own failure, within its claim, is recorded.
    b.webhook_result(&theirs[0], false, 0).await.unwrap();
    assert_eq!(a.webhook_due(64, 50).await.unwrap().len(), 1);
}

/// The store clock is one reading a statement, as SQLite's `julianday('now')` is: a grant reads
/// its fence twice in one statement (for the new lease and for the fence it leaves), and two
/// readings a millisecond apart across the fence's end made a lease that ran out before its own
/// fence (a holder never confirmed). Each statement reads it afresh.
#[tokio::test]
async fn the_store_clock_is_one_reading_a_statement() {
    let (_dir, store) = temp_store().await;
    let now = hostlease_server::store::NOW;
    let (readings, first): (i64, i64) = sqlx::query_as(&format!(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300000) \
         SELECT COUNT(DISTINCT {now}), MIN({now}) FROM n"
    ))
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(
        readings, 1,
        "one statement read the store clock {readings} times"
    );
    // Each statement reads it afresh, a prepared statement run again too (the connection keeps
    // it): never going back, and on past the first statement's.
    let mut c = store.pool().acquire().await.unwrap();
    let mut last = first;
    for _ in 0..10_000 {
        let later: i64 = sqlx::query_scalar(&format!("SELECT {now}"))
            .fetch_one(&mut *c)
            .await
            .unwrap();
        assert!(later >= last, "{last} then {later}");
        if later > last && last > first {
            return;
        }
        last = later;
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    panic!("every statement read the clock of the first: {first}");
}
