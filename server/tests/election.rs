//! Elections, failover and leases, driven through the SDK core over real WebSockets.

mod common;

use std::time::Duration;

use common::*;
use hostlease::core::{Event, Phase};
use hostlease::protocol::{Epoch, ParticipantId, Reason, ServerMsg};

fn host_of(s: &Sdk) -> Option<String> {
    s.view
        .assignment()
        .and_then(|a| a.host.as_ref().map(|h| h.to_string()))
}

#[tokio::test]
async fn election_on_join_then_failover_on_explicit_leave() {
    let srv = start(test_config()).await;
    let mut a = Sdk::join(
        srv.addr,
        "r1",
        join_token(&srv.app_key, "r1", "alice", true),
    )
    .await;
    a.pump_until("alice live and host with authority", |s| {
        s.view.phase() == Phase::Live && s.has_authority()
    })
    .await;
    let e1 = a.view.epoch().unwrap();
    assert_eq!(e1, Epoch(1));
    assert_eq!(a.view.assignment().unwrap().reason, Reason::Elected);

    let mut b = Sdk::join(srv.addr, "r1", join_token(&srv.app_key, "r1", "bob", true)).await;
    // Alice answers her probes meanwhile (a stall of a loaded machine otherwise let her 1.5 s
    // lease lapse, moving the epoch).
    pump_all("bob live", &mut [&mut a, &mut b], |c| {
        c[1].view.phase() == Phase::Live
    })
    .await;
    assert_eq!(host_of(&b).as_deref(), Some("alice"));
    // Joining does not move the epoch.
    a.pump(Duration::from_millis(100)).await;
    assert_eq!(a.view.epoch(), Some(e1));

    a.leave().await;
    b.pump_until("bob host with authority", |s| s.has_authority())
        .await;
    let asg = b.view.assignment().unwrap().clone();
    assert_eq!(asg.host.as_ref().unwrap().as_str(), "bob");
    assert_eq!(asg.epoch, Epoch(e1.0 + 1));
    assert_eq!(asg.reason, Reason::Left);
}

#[tokio::test]
async fn failover_on_silent_lease_lapse() {
    // 2 s leases: bob's first renewal may be a loaded machine's second late before his lease
    // lapses back to (deaf) alice (with 600 ms, an fsync-heavy load made epoch 6 of it).
    let cfg = hostlease_server::Config {
        lease_ms: 2000,
        ..test_config()
    };
    let srv = start(cfg).await;
    let mut a = Sdk::join(
        srv.addr,
        "r2",
        join_token(&srv.app_key, "r2", "alice", true),
    )
    .await;
    a.pump_until("alice host", |s| s.has_authority()).await;
    let mut b = Sdk::join(srv.addr, "r2", join_token(&srv.app_key, "r2", "bob", true)).await;
    pump_all("bob live", &mut [&mut a, &mut b], |c| {
        c[1].view.phase() == Phase::Live
    })
    .await;
    // Alice keeps her socket open but stops answering probes (a frozen tab).
    a.deaf = true;
    let mut both = [&mut a, &mut b];
    pump_all("bob becomes host after the lapse", &mut both, |c| {
        c[1].has_authority()
    })
    .await;
    let asg = b.view.assignment().unwrap().clone();
    assert_eq!(asg.host.as_ref().unwrap().as_str(), "bob");
    assert_eq!(asg.reason, Reason::LeaseLapsed);
    assert_eq!(asg.epoch, Epoch(2));
    // Alice, on the same stream, adopts it and has no authority.
    a.pump_until("alice sees epoch 2", |s| s.view.epoch() == Some(Epoch(2)))
        .await;
    assert!(!a.has_authority());
}

#[tokio::test]
async fn two_tabs_of_one_participant_only_one_holds_the_lease() {
    let srv = start(test_config()).await;
    let t = || join_token(&srv.app_key, "r3", "alice", true);
    let mut tab1 = Sdk::join(srv.addr, "r3", t()).await;
    tab1.pump_until("tab1 host", |s| s.has_authority()).await;
    let mut tab2 = Sdk::join(srv.addr, "r3", t()).await;
    tab2.pump_until("tab2 live", |s| s.view.phase() == Phase::Live)
        .await;
    let mut both = [&mut tab1, &mut tab2];
    // Over several renewals only tab1's session holds the lease.
    for _ in 0..20 {
        pump_all("tick", &mut both, |_| true).await;
        for c in both.iter_mut() {
            c.pump(Duration::from_millis(20)).await;
        }
        assert!(both[0].has_authority() as u8 + both[1].has_authority() as u8 <= 1);
        assert!(!both[1].view.is_named_host());
    }
    let s1 = tab1.view.session().unwrap().clone();
    assert_eq!(tab1.view.assignment().unwrap().session.as_ref(), Some(&s1));
    tab1.leave().await;
    tab2.pump_until("tab2 takes over", |s| s.has_authority())
        .await;
    assert_eq!(
        tab2.view
            .assignment()
            .unwrap()
            .host
            .as_ref()
            .unwrap()
            .as_str(),
        "alice"
    );
    assert_ne!(tab2.view.assignment().unwrap().session.as_ref(), Some(&s1));
}

#[tokio::test]
async fn resign_and_transfer() {
    let srv = start(test_config()).await;
    let mut a = Sdk::join(
        srv.addr,
        "r4",
        join_token(&srv.app_key, "r4", "alice", true),
    )
    .await;
    a.pump_until("alice host", |s| s.has_authority()).await;
    let mut b = Sdk::join(srv.addr, "r4", join_token(&srv.app_key, "r4", "bob", true)).await;
    b.pump_until("bob live", |s| s.view.phase() == Phase::Live)
        .await;

    let now = a.now();
    a.view.resign(now).expect("resign accepted locally");
    a.flush().await;
    let mut both = [&mut a, &mut b];
    // Bob's assignment and Alice's command result travel on different sockets: wait for both.
    pump_all(
        "bob host after resign, alice's resign answered",
        &mut both,
        |c| {
            c[1].has_authority()
                && c[0]
                    .events
                    .iter()
                    .any(|e| matches!(e, Event::CommandAccepted { .. }))
        },
    )
    .await;
    assert_eq!(b.view.assignment().unwrap().reason, Reason::Resigned);
    assert_eq!(b.view.epoch(), Some(Epoch(2)));
    assert!(a
        .events
        .iter()
        .any(|e| matches!(e, Event::CommandAccepted { .. })));

    let now = b.now();
    b.view
        .transfer(now, &ParticipantId::new("alice").unwrap())
        .expect("transfer accepted locally");
    b.flush().await;
    let mut both = [&mut a, &mut b];
    pump_all("alice host after transfer", &mut both, |c| {
        c[0].has_authority()
    })
    .await;
    assert_eq!(a.view.assignment().unwrap().reason, Reason::Transferred);
    assert_eq!(a.view.epoch(), Some(Epoch(3)));
    assert!(!b.has_authority());
}

#[tokio::test]
async fn host_and_participant_commands_become_ordered_room_events() {
    let srv = start(test_config()).await;
    let mut a = Sdk::join(
        srv.addr,
        "r5",
        join_token(&srv.app_key, "r5", "alice", true),
    )
    .await;
    a.pump_until("alice host", |s| s.has_authority()).await;
    let mut b = Sdk::join(srv.addr, "r5", join_token(&srv.app_key, "r5", "bob", false)).await;
    b.pump_until("bob live", |s| s.view.phase() == Phase::Live)
        .await;
    let now = a.now();
    a.view
        .command(
            now,
            hostlease::protocol::Action::new("poll.open").unwrap(),
            serde_json::json!({"q": "?"}).into(),
            None,
        )
        .expect("host command");
    a.flush().await;
    b.pump_until("bob has a participant token", |_| true).await;
    let now = b.now();
    b.view
        .command(
            now,
            hostlease::protocol::Action::new("vote").unwrap(),
            serde_json::json!({"choice": 1}).into(),
            None,
        )
        .expect("participant command");
    b.flush().await;
    let mut both = [&mut a, &mut b];
    pump_all("both see two events", &mut both, |c| {
        c.iter().all(|s| {
            s.events
                .iter()
                .filter(|e| matches!(e, Event::RoomEvent(_)))
                .count()
                == 2
        })
    })
    .await;
    for s in [&a, &b] {
        let evs: Vec<_> = s
            .events
            .iter()
            .filter_map(|e| match e {
                Event::RoomEvent(ev) => Some((ev.seq.0, ev.action.to_string())),
                _ => None,
            })
            .collect();
        assert_eq!(evs[0].1, "poll.open");
        assert_eq!(evs[1].1, "vote");
        assert_eq!(evs[1].0, evs[0].0 + 1);
    }
}

/// A burst of joins and leaves (whose presence the server sends in batches) leaves every
/// member's view with exactly the members that are connected, in election order.
#[tokio::test]
async fn a_burst_of_joins_and_leaves_ends_with_every_view_listing_the_members() {
    let srv = start(test_config()).await;
    let mut clients = Vec::new();
    for i in 0..12 {
        let p = format!("p{i:02}");
        clients.push(
            Sdk::join(
                srv.addr,
                "burst",
                join_token(&srv.app_key, "burst", &p, true),
            )
            .await,
        );
    }
    let ids = |n: usize| (0..n).map(|i| format!("p{i:02}")).collect::<Vec<_>>();
    // The members' names, sorted; `None` unless the view keeps them in election order.
    let listed = |s: &Sdk| {
        let members = s.view.members();
        if !members.windows(2).all(|w| w[0].join_seq < w[1].join_seq) {
            return None;
        }
        let mut names: Vec<String> = members.iter().map(|m| m.id.to_string()).collect();
        names.sort();
        Some(names)
    };
    let all = ids(12);
    pump_all(
        "every view lists all twelve members",
        &mut clients.iter_mut().collect::<Vec<_>>(),
        |cs| cs.iter().all(|c| listed(c).as_ref() == Some(&all)),
    )
    .await;
    for c in clients.iter_mut().skip(8) {
        c.leave().await;
    }
    clients.truncate(8);
    let rest = ids(8);
    pump_all(
        "the eight who stayed list exactly themselves",
        &mut clients.iter_mut().collect::<Vec<_>>(),
        |cs| cs.iter().all(|c| listed(c).as_ref() == Some(&rest)),
    )
    .await;
}

/// The sweeper looks only at the rooms this process serves: more abandoned rooms with lapsed
/// leases than one sweep's query used to return (1 000, in lease order) must not keep a live
/// room's lapsed host from being replaced.
#[tokio::test]
async fn abandoned_lapsed_rooms_do_not_starve_a_live_one() {
    use hostlease::protocol::{RoomId, ServerMsg, SessionId};
    use hostlease_server::store::{GrantOutcome, GrantReq};
    let srv = start(test_config()).await;
    // 1 100 rooms granted with a short lease and nobody connected: lapsed, no hub here.
    let mut tasks = Vec::new();
    for i in 0..1100 {
        let app = srv.app.clone();
        tasks.push(tokio::spawn(async move {
            let req = GrantReq {
                room: RoomId::new(format!("gone-{i}")).unwrap(),
                expected_epoch: Epoch(0),
                holder: Some((
                    ParticipantId::new("ghost").unwrap(),
                    SessionId::new(format!("s-{i}")).unwrap(),
                )),
                lease_ms: 30,
                reason: Reason::Elected,
                require_lapsed: false,
                close: false,
            };
            matches!(
                app.store.grant(req, &app.keys).await.unwrap(),
                GrantOutcome::Won { .. }
            )
        }));
    }
    for t in tasks {
        assert!(t.await.unwrap());
    }
    // A live room whose host stops answering probes, with another eligible member.
    let mut a = srv.raw("live", "alice", true).await;
    a.until(|m| matches!(m, ServerMsg::LeaseProbe { .. }).then_some(()))
        .await;
    let mut b = srv.raw("live", "bob", true).await;
    // Alice never echoes: her lease (1.5 s) lapses and the sweeper must give bob the room.
    let got = b
        .until(|m| match m {
            ServerMsg::Assignment(x)
                if x.assignment.host.as_ref().map(|h| h.as_str()) == Some("bob") =>
            {
                Some(x.assignment.clone())
            }
            _ => None,
        })
        .await;
    assert_eq!(got.reason, Reason::LeaseLapsed);
    assert_eq!(got.epoch, Epoch(2));
}

/// Sessions that let their lease lapse are passed over while a member that answers is
/// connected: two sessions that never answer a probe (two tabs frozen in the background, or a
/// client that means harm) handed the role to each other for ever, and bob never got it.
#[tokio::test]
async fn sessions_that_let_the_lease_lapse_do_not_keep_it_from_a_live_member() {
    let srv = start(test_config()).await;
    let t = join_token(&srv.app_key, "deaf", "mallory", true);
    let mut m1 = Raw::join(srv.addr, "deaf", &t, None).await;
    m1.until(|m| matches!(m, ServerMsg::Welcome { .. }).then_some(()))
        .await;
    let mut m2 = Raw::join(srv.addr, "deaf", &t, None).await;
    m2.until(|m| matches!(m, ServerMsg::Welcome { .. }).then_some(()))
        .await;
    // Neither reads again: their sockets stay open, their probes unanswered.
    let mut bob = Raw::join(
        srv.addr,
        "deaf",
        &join_token(&srv.app_key, "deaf", "bob", true),
        None,
    )
    .await;
    // Each lease lapses after 1.5 s: bob is granted after at most the two mallory sessions.
    tokio::time::timeout(Duration::from_secs(10), bob.until_host())
        .await
        .expect("bob, who answers, becomes host");
    let grants: Vec<String> = bob
        .seen
        .iter()
        .filter_map(|m| match m {
            ServerMsg::Assignment(a) => a.assignment.host.as_ref().map(|h| h.to_string()),
            _ => None,
        })
        .collect();
    assert!(grants.len() <= 3, "{grants:?}");
    drop((m1, m2));
}

/// `host` resigns with the newest host capability it was given; the host `watcher` then hears
/// was chosen by the resignation.
async fn resign(host: &mut Raw, watcher: &mut Raw) -> Option<hostlease::protocol::ParticipantId> {
    let (epoch, token) = host.host_capability().expect("a host capability");
    host.send_resign(epoch, token).await;
    watcher
        .until(|m| match m {
            ServerMsg::Assignment(a) if a.assignment.reason == Reason::Resigned => {
                Some(a.assignment.host.clone())
            }
            _ => None,
        })
        .await
}

/// A resignation passes over a session whose lease lapsed too (it picked the first member by
/// join order, the one that had just failed to answer).
#[tokio::test]
async fn a_resignation_passes_over_a_session_whose_lease_lapsed() {
    let srv = start(test_config()).await;
    let mut deaf = srv.raw("rz", "mallory", true).await;
    deaf.until(|m| matches!(m, ServerMsg::Welcome { .. }).then_some(()))
        .await;
    let mut bob = srv.raw("rz", "bob", true).await;
    tokio::time::timeout(Duration::from_secs(10), bob.until_host())
        .await
        .expect("bob becomes host once mallory's lease lapsed");
    let mut carol = srv.raw("rz", "carol", true).await;
    carol
        .until(|m| matches!(m, ServerMsg::Welcome { .. }).then_some(()))
        .await;
    let next = resign(&mut bob, &mut carol).await;
    assert_eq!(next.as_ref().map(|h| h.as_str()), Some("carol"));
    drop(deaf);
}

/// A session whose lease lapsed is passed over only until its page shows it runs again: a
/// command of its own counts, as an echo or a resume does (a former host that missed one renewal
/// was passed over for the rest of its session).
#[tokio::test]
async fn a_lapsed_session_that_sends_a_command_is_eligible_again() {
    let srv = start(test_config()).await;
    let mut deaf = srv.raw("rc", "mallory", true).await;
    let participant = deaf
        .until(|m| match m {
            ServerMsg::Capability {
                role: hostlease::protocol::Role::Participant,
                token,
                ..
            } => Some(token.clone()),
            _ => None,
        })
        .await;
    let mut bob = srv.raw("rc", "bob", true).await;
    tokio::time::timeout(Duration::from_secs(10), bob.until_host())
        .await
        .expect("bob becomes host once mallory's lease lapsed");
    let mut carol = srv.raw("rc", "carol", true).await;
    carol
        .until(|m| matches!(m, ServerMsg::Welcome { .. }).then_some(()))
        .await;
    // Mallory's page is back: it votes.
    deaf.send(&hostlease::protocol::ClientMsg::Command {
        id: hostlease::protocol::IdempotencyKey::new("back").unwrap(),
        action: hostlease::protocol::Action::new("vote").unwrap(),
        payload: hostlease::protocol::json::Json::null(),
        epoch: None,
        capability: participant,
        after: None,
    })
    .await;
    deaf.until(|m| matches!(m, ServerMsg::CommandResult { .. }).then_some(()))
        .await;
    let next = resign(&mut bob, &mut carol).await;
    // First in join order, and no longer passed over.
    assert_eq!(next.as_ref().map(|h| h.as_str()), Some("mallory"));
}

/// A lone session that never answers a probe (a page frozen in the background, whose browser
/// still answers pings) is granted again once after its lease lapsed (a stall it may recover
/// from), then the room goes to nobody and stays there until the page answers (a late echo of a
/// probe here; a resume or a command counts too).
/// It was granted anew every lease period for as long as it stayed connected, each grant an
/// assignment in the log, the outbox, every offline member's inbox and the webhook.
#[tokio::test]
async fn a_lone_session_that_never_answers_is_not_granted_every_lease_period() {
    use hostlease::protocol::ClientMsg;
    let srv = start(test_config()).await;
    let mut deaf = srv.raw("lone", "mallory", true).await;
    let mut watcher = srv.raw("lone", "watcher", false).await;
    let mut grants = Vec::new();
    // Until the room goes to nobody (a frame within each 5 s wait, or the test fails).
    loop {
        let a = watcher
            .until(|m| match m {
                ServerMsg::Assignment(a) => Some(a.assignment.clone()),
                _ => None,
            })
            .await;
        if a.host.is_none() {
            assert_eq!(a.reason, Reason::LeaseLapsed);
            break;
        }
        grants.push(a.epoch);
        assert!(grants.len() <= 2, "granted again and again: {grants:?}");
    }
    // Three lease periods more (1.5 s each): no grant.
    while let Some(m) = watcher.next(Duration::from_millis(4_500)).await {
        assert!(
            !matches!(m, ServerMsg::Assignment(_)),
            "granted again without an answer: {m:?}"
        );
    }
    // The page runs again: it answers the last probe it was sent, long after (which renews
    // nothing, but shows it runs), and is elected.
    let mut nonce = None;
    while let Some(m) = deaf.next(Duration::from_millis(200)).await {
        if let ServerMsg::LeaseProbe { nonce: n, .. } = m {
            nonce = Some(n);
        }
    }
    let nonce = nonce.expect("the session was probed");
    deaf.send(&ClientMsg::LeaseEcho { nonce }).await;
    let a = watcher
        .until(|m| match m {
            ServerMsg::Assignment(a) => Some(a.assignment.clone()),
            _ => None,
        })
        .await;
    assert_eq!(a.host.as_ref().map(|h| h.as_str()), Some("mallory"));
}

/// A resignation chooses its successor as it is queued; a successor who leaves before the
/// resignation is committed (its leave found the old host still holding the role, so changed
/// nothing) is replaced at once (reason `left`), not after its lease lapsed unanswered.
#[tokio::test]
async fn a_successor_who_left_before_the_resignation_committed_is_replaced_at_once() {
    use hostlease::protocol::ClientMsg;
    let srv = start(test_config()).await;
    let mut alice = srv.raw("gone", "alice", true).await;
    alice.until_host().await;
    let mut bob = srv.raw("gone", "bob", true).await;
    bob.until(|m| matches!(m, ServerMsg::Welcome { .. }).then_some(()))
        .await;
    let mut carol = srv.raw("gone", "carol", true).await;
    carol
        .until(|m| matches!(m, ServerMsg::Welcome { .. }).then_some(()))
        .await;
    // Another connection holds the database's write lock: the resignation waits to commit.
    let mut lock = write_lock(&srv.dir.path().join("h.db")).await;
    let (epoch, token) = alice.host_capability().expect("a host capability");
    alice.send_resign(epoch, token).await;
    // Queued (bob chosen, first in join order after alice); then bob leaves.
    tokio::time::sleep(Duration::from_millis(200)).await;
    bob.send(&ClientMsg::Leave).await;
    carol
        .until(|m| match m {
            ServerMsg::Presence {
                member,
                online: false,
            } if member.id.as_str() == "bob" => Some(()),
            ServerMsg::PresenceBatch { left, .. }
                if left.iter().any(|m| m.id.as_str() == "bob") =>
            {
                Some(())
            }
            _ => None,
        })
        .await;
    sqlx::query("COMMIT").execute(&mut *lock).await.unwrap();
    let assignment = |m: &ServerMsg| match m {
        ServerMsg::Assignment(a) => Some(a.assignment.clone()),
        _ => None,
    };
    let to_bob = carol.until(assignment).await;
    assert_eq!(
        (to_bob.host.as_ref().map(|h| h.as_str()), to_bob.reason),
        (Some("bob"), Reason::Resigned)
    );
    let after = carol.until(assignment).await;
    // The next in join order: alice (a resignation does not bar her from the next election).
    assert_eq!(
        (after.host.as_ref().map(|h| h.as_str()), after.reason),
        (Some("alice"), Reason::Left),
        "{after:?}"
    );
    assert_eq!(after.epoch, Epoch(to_bob.epoch.0 + 1));
}

/// The system's clocks with the wall clock stepped by `step` ms (NTP, or an operator, setting it).
#[cfg(target_os = "linux")]
struct Stepped(std::sync::Arc<std::sync::atomic::AtomicI64>);

#[cfg(target_os = "linux")]
impl hostlease_server::clock::ClockSource for Stepped {
    fn wall_ns(&self) -> i64 {
        let step = self.0.load(std::sync::atomic::Ordering::Relaxed);
        hostlease_server::clock::SystemClock.wall_ns() + step * 1_000_000
    }
    fn boot_ns(&self) -> Option<i64> {
        hostlease_server::clock::SystemClock.boot_ns()
    }
    fn boot_id(&self) -> Option<String> {
        hostlease_server::clock::SystemClock.boot_id()
    }
}

/// A step of the server's wall clock does not end a lease. The store clock was SQLite's
/// `julianday('now')`, the wall clock: stepped an hour forward, every live lease had run out on
/// it at once, the next renewal was refused and the sweeper granted a successor, while the old
/// host's SDK, timing its lease on its own monotonic clock, still held it: two hosts. Leases are
/// timed on the boot clock now, anchored once per boot, and a store opened on the file afterwards
/// (another process) reads the same clock.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_step_of_the_wall_clock_does_not_end_a_lease() {
    use hostlease_server::clock::StoreClock;
    use hostlease_server::store::{SqliteStore, Store};
    let step = std::sync::Arc::new(std::sync::atomic::AtomicI64::new(0));
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("h.db").display());
    let store = SqliteStore::open_with_clock(&db, StoreClock::new(Stepped(step.clone())))
        .await
        .unwrap();
    let srv = start_on(
        hostlease_server::Config {
            lease_ms: 3000,
            ..test_config()
        },
        dir,
        store,
    )
    .await;
    let room = hostlease::protocol::RoomId::new("step").unwrap();
    let mut a = srv.raw("step", "alice", true).await;
    a.until_host().await;
    let mut b = srv.raw("step", "bob", true).await;
    b.until_capability().await;
    let epoch = srv.app.store.room(&room).await.unwrap().unwrap().epoch;
    let before = srv.app.store.now_ms().await.unwrap();
    step.store(3_600_000, std::sync::atomic::Ordering::Relaxed);
    // Two renewals after the step (probes come every TTL/3), each of them over a sweep.
    let mut renewals = 0;
    while renewals < 2 {
        match a.until(|m| Some(m.clone())).await {
            ServerMsg::LeaseProbe { nonce, .. } => {
                a.send(&hostlease::protocol::ClientMsg::LeaseEcho { nonce })
                    .await
            }
            ServerMsg::LeaseConfirm { epoch: e, .. } if e == epoch => renewals += 1,
            ServerMsg::Assignment(s) => panic!("alice's lease ended with the step: {s:?}"),
            _ => {}
        }
    }
    // What bob was told meanwhile (until a pause in it).
    for _ in 0..100 {
        if b.next(Duration::from_millis(200)).await.is_none() {
            break;
        }
    }
    let row = srv.app.store.room(&room).await.unwrap().unwrap();
    assert_eq!(row.epoch, epoch, "a successor was granted");
    assert_eq!(row.host.as_ref().map(|h| h.as_str()), Some("alice"));
    assert!(
        b.seen
            .iter()
            .all(|m| !matches!(m, ServerMsg::Assignment(s) if s.assignment.epoch != epoch)),
        "bob was told of another epoch"
    );
    // The store clock went on from where it was, not from the stepped wall clock; a store opened
    // on the file now (another process's) reads the same clock.
    let skew = srv.app.store.clock_skew_ms();
    assert!((-3_601_000..-3_599_000).contains(&skew), "skew {skew} ms");
    let after = srv.app.store.now_ms().await.unwrap();
    assert!(
        after >= before && after < before + 1_800_000,
        "{before} then {after}"
    );
    let other = SqliteStore::open_with_clock(&db, StoreClock::new(Stepped(step.clone())))
        .await
        .unwrap();
    let theirs = other.now_ms().await.unwrap();
    assert!(
        theirs >= after && theirs < before + 1_800_000,
        "{after} here, {theirs} there"
    );
}
