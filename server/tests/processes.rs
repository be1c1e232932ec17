//! Real server processes on one SQLite file: racing elections, kill -9 and restart, and a scan
//! of the logs for tokens.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use hostlease::protocol::{ClientMsg, Epoch, ErrorCode, Item, Reason, Role, ServerMsg, SessionId};
use hostlease_server::tokens::Keypair;
use sqlx::sqlite::SqliteConnectOptions;
use std::str::FromStr;

async fn read_log(db: &str, room: &str) -> Vec<Item> {
    let opts = SqliteConnectOptions::from_str(db).unwrap().read_only(true);
    let pool = sqlx::SqlitePool::connect_with(opts).await.unwrap();
    let rows: Vec<String> = sqlx::query_scalar("SELECT item FROM log WHERE room = ? ORDER BY seq")
        .bind(room)
        .fetch_all(&pool)
        .await
        .unwrap();
    pool.close().await;
    rows.iter()
        .map(|s| hostlease::protocol::codec::decode_body(s, usize::MAX).unwrap())
        .collect()
}

async fn committed_assignments(db: &str, room: &str) -> usize {
    read_log(db, room)
        .await
        .iter()
        .filter(|i| matches!(i, Item::Assignment(_)))
        .count()
}

/// A member that answers probes; after each host grant it either leaves explicitly or goes
/// silent until the lease lapses, then reconnects to the other process. Stops by itself.
async fn churner(
    addrs: [SocketAddr; 2],
    key: Keypair,
    name: String,
    tenures: usize,
) -> (Vec<(Epoch, SessionId)>, Vec<String>) {
    let mut grants = Vec::new();
    let mut tokens = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut round = 0usize;
    while grants.len() < tenures && tokio::time::Instant::now() < deadline {
        let addr = addrs[round % 2];
        round += 1;
        let t = join_token(&key, "race", &name, true);
        let mut r = Raw::join(addr, "race", &t, None).await;
        let mut session = None;
        let mut silent = false;
        let stint = tokio::time::Instant::now() + Duration::from_secs(3);
        loop {
            let left = stint.saturating_duration_since(tokio::time::Instant::now());
            let Some(m) = r.next(left.min(Duration::from_millis(500))).await else {
                if tokio::time::Instant::now() >= stint {
                    break;
                }
                if silent {
                    break;
                }
                continue;
            };
            match m {
                ServerMsg::Welcome { session: s, .. } => session = Some(s),
                ServerMsg::LeaseProbe { nonce, .. } if !silent => {
                    r.send(&ClientMsg::LeaseEcho { nonce }).await
                }
                ServerMsg::Capability {
                    role: Role::Host,
                    epoch: Some(e),
                    ..
                } => {
                    grants.push((e, session.clone().unwrap()));
                    if grants.len() % 2 == 0 {
                        r.send(&ClientMsg::Leave).await;
                        break;
                    }
                    silent = true; // let the lease lapse on the store clock
                }
                ServerMsg::Assignment(a)
                    if silent && a.assignment.session.as_ref() != session.as_ref() =>
                {
                    break; // someone else holds it now
                }
                _ => {}
            }
        }
        tokens.append(&mut r.tokens);
        drop(r);
    }
    (grants, tokens)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_on_one_sqlite_file_one_winner_per_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let key = app_key_file(dir.path());
    let db = format!("sqlite://{}", dir.path().join("shared.db").display());
    // The shortest lease the server takes (1 s): quick lapses, many grants.
    let p1 = spawn_proc(&db, dir.path(), "p1", 1000, &[]);
    let p2 = spawn_proc(&db, dir.path(), "p2", 1000, &[]);
    let addrs = [p1.addr, p2.addr];
    let mut tasks = Vec::new();
    for i in 0..4 {
        let mut a = addrs;
        if i % 2 == 1 {
            a.swap(0, 1);
        }
        tasks.push(tokio::spawn(churner(a, key.clone(), format!("m{i}"), 3)));
    }
    let mut by_epoch: HashMap<Epoch, SessionId> = HashMap::new();
    let mut tokens = Vec::new();
    for t in tasks {
        let (grants, toks) = t.await.unwrap();
        tokens.extend(toks);
        for (e, s) in grants {
            // At most one session is ever granted host authority in an epoch.
            if let Some(prev) = by_epoch.insert(e, s.clone()) {
                assert_eq!(prev, s, "two sessions held epoch {e:?}");
            }
        }
    }
    // Every committed reassignment has its log line before the processes are killed, and none
    // is being made: a grant published by one process can reach its client before the other,
    // which committed it, has written the line; and a lease lapsed just as its churner ended
    // is granted again (to its session, until the server sees it closed), so a kill could come
    // between a commit and its line. Both counts must agree and hold still for 5 s (5 leases).
    let count_lines = || {
        ["p1.log", "p2.log"]
            .iter()
            .map(|name| {
                std::fs::read_to_string(dir.path().join(name))
                    .unwrap()
                    .matches("host reassigned")
                    .count()
            })
            .sum::<usize>()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let (mut counts, mut since) = (None, tokio::time::Instant::now());
    while tokio::time::Instant::now() < deadline {
        let now_counts = (count_lines(), committed_assignments(&db, "race").await);
        let now = tokio::time::Instant::now();
        if counts != Some(now_counts) {
            (counts, since) = (Some(now_counts), now);
        } else if now_counts.0 == now_counts.1 && now - since >= Duration::from_secs(5) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(p1);
    drop(p2);
    let items = read_log(&db, "race").await;
    let assignments: Vec<_> = items
        .iter()
        .filter_map(|i| match i {
            Item::Assignment(a) => Some(a.assignment.clone()),
            _ => None,
        })
        .collect();
    assert!(
        assignments.len() >= 6,
        "too few grants to be a race: {}",
        assignments.len()
    );
    for (i, a) in assignments.iter().enumerate() {
        assert_eq!(
            a.epoch,
            Epoch(i as u64 + 1),
            "epochs must move by exactly one"
        );
    }
    let seqs: Vec<u64> = items.iter().map(|i| i.seq().0).collect();
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "seq must be contiguous"
    );
    for (e, s) in &by_epoch {
        let a = &assignments[(e.0 - 1) as usize];
        assert_eq!(
            a.session.as_ref(),
            Some(s),
            "capability for epoch {e:?} went to a non-holder"
        );
    }
    // No token in either process's log.
    for name in ["p1.log", "p2.log"] {
        let log = std::fs::read_to_string(dir.path().join(name)).unwrap();
        for t in &tokens {
            assert!(!log.contains(t.as_str()), "a token leaked into {name}");
        }
        assert!(
            !log.contains("hlj1.") && !log.contains("hlc1."),
            "token prefix in {name}"
        );
    }
    // One structured line per committed reassignment, whichever process committed it.
    assert_eq!(count_lines(), assignments.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_and_restart_keeps_epochs_and_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let key = app_key_file(dir.path());
    let db = format!("sqlite://{}", dir.path().join("crash.db").display());
    // 2 s leases: alice's one renewal may be a loaded machine's second late.
    let mut p = spawn_proc(&db, dir.path(), "before", 2000, &[]);
    let mut a = Raw::join(p.addr, "k", &join_token(&key, "k", "alice", true), None).await;
    let epoch = a
        .until(|m| match m {
            ServerMsg::LeaseProbe { nonce, epoch } => Some((*nonce, *epoch)),
            _ => None,
        })
        .await;
    a.send(&ClientMsg::LeaseEcho { nonce: epoch.0 }).await;
    a.until(|m| matches!(m, ServerMsg::LeaseConfirm { .. }).then_some(()))
        .await;
    assert_eq!(epoch.1, Epoch(1));
    p.child.kill().unwrap(); // SIGKILL
    p.child.wait().unwrap();
    drop(a);
    let p2 = spawn_proc(&db, dir.path(), "after", 2000, &[]);
    let mut b = Raw::join(p2.addr, "k", &join_token(&key, "k", "bob", true), Some(0)).await;
    let (snap, missed) = b
        .until(|m| match m {
            ServerMsg::Welcome {
                snapshot, missed, ..
            } => Some((snapshot.clone(), missed.clone())),
            _ => None,
        })
        .await;
    // The committed grant survived the crash and is replayed.
    assert_eq!(snap.current.assignment.epoch, Epoch(1));
    assert_eq!(missed.len(), 1);
    // After the dead host's lease lapses, bob is granted epoch 2 (never a reset to 1).
    let e = b
        .until(|m| match m {
            ServerMsg::Assignment(a)
                if a.assignment
                    .host
                    .as_ref()
                    .is_some_and(|h| h.as_str() == "bob") =>
            {
                Some(a.assignment.clone())
            }
            _ => None,
        })
        .await;
    assert_eq!(e.epoch, Epoch(2));
    assert_eq!(e.reason, hostlease::protocol::Reason::LeaseLapsed);
    drop(p2);
    drop(p);
}

/// Two server processes on one fresh SQLite file, with long leases (nothing lapses in a test),
/// and the app key their join tokens are signed with. Keep the directory until the end.
fn two_processes() -> (tempfile::TempDir, Keypair, Proc, Proc) {
    two_processes_with(&[])
}

/// Two processes on one database; the second started with `p2_extra` flags too.
fn two_processes_with(p2_extra: &[&str]) -> (tempfile::TempDir, Keypair, Proc, Proc) {
    let dir = tempfile::tempdir().unwrap();
    let key = app_key_file(dir.path());
    let db = format!("sqlite://{}", dir.path().join("shared.db").display());
    let p1 = spawn_proc(&db, dir.path(), "p1", 60_000, &[]);
    let p2 = spawn_proc(&db, dir.path(), "p2", 60_000, p2_extra);
    (dir, key, p1, p2)
}

/// An admin close made through one process reaches the sessions another process holds on the
/// same database: the closing assignment, then `room_closed`, and no new join there. Both ways
/// of closing are covered: a room with a host (a grant with reason `closed`) and a hostless one
/// (no grant).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_room_closed_through_one_process_closes_on_the_other() {
    let (_dir, key, p1, p2) = two_processes();
    let mut host = Raw::join(p2.addr, "cl", &join_token(&key, "cl", "alice", true), None).await;
    host.until_host().await;
    let mut guest = Raw::join(p2.addr, "cl", &join_token(&key, "cl", "bob", false), None).await;
    let mut lone = Raw::join(
        p2.addr,
        "cl2",
        &join_token(&key, "cl2", "carol", false),
        None,
    )
    .await;
    for r in [&mut guest, &mut lone] {
        r.until_capability().await;
    }
    let http = reqwest::Client::new();
    for room in ["cl", "cl2"] {
        let r = http
            .post(format!("http://{}/v1/admin/rooms/{room}/close", p1.addr))
            .bearer_auth("admin-secret-key-1234")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "close {room}");
    }
    for r in [&mut host, &mut guest] {
        assert_eq!(r.until_closed().await, Some(ErrorCode::RoomClosed));
        let closing = r.seen.iter().position(
            |m| matches!(m, ServerMsg::Assignment(s) if s.assignment.reason == Reason::Closed),
        );
        let error = r.seen.iter().position(
            |m| matches!(m, ServerMsg::Error { code, .. } if *code == ErrorCode::RoomClosed),
        );
        assert!(
            closing.is_some() && closing < error,
            "the closing assignment comes before room_closed"
        );
    }
    assert_eq!(lone.until_closed().await, Some(ErrorCode::RoomClosed));
    for room in ["cl", "cl2"] {
        let mut late = Raw::join(p2.addr, room, &join_token(&key, room, "dan", true), None).await;
        assert_eq!(late.until_closed().await, Some(ErrorCode::RoomClosed));
    }
}

/// A room closed through another process takes no new session on this one once its closing
/// assignment is published here: a hello was welcomed (and recorded, and elected over) until
/// this process's next sweep closed the room's sessions, up to 5 s later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_room_closed_elsewhere_takes_no_join_once_its_closing_is_published() {
    // The second's sweeps come every 5 s; it publishes what the first commits within 1 s.
    let (_dir, key, p1, p2) = two_processes_with(&["--sweep-ms", "5000"]);
    let mut host = Raw::join(p2.addr, "cj", &join_token(&key, "cj", "alice", true), None).await;
    host.until_host().await;
    admin_post(p1.addr, "cj", "close", serde_json::json!({})).await;
    host.until(|m| match m {
        ServerMsg::Assignment(s) if s.assignment.reason == Reason::Closed => Some(()),
        _ => None,
    })
    .await;
    let mut late = Raw::join(p2.addr, "cj", &join_token(&key, "cj", "bob", true), None).await;
    assert_eq!(late.until_closed().await, Some(ErrorCode::RoomClosed));
    assert!(
        !late
            .seen
            .iter()
            .any(|m| matches!(m, ServerMsg::Welcome { .. })),
        "welcomed into a closed room: {:?}",
        late.seen
    );
}

/// An admin close of a hostless room answers with the assignment it closed at as stored, not
/// this process's copy, which a grant committed through another process reaches only on its
/// next publisher poll (it answered with the host before, already gone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_hostless_room_answers_its_stored_assignment() {
    // The second publishes what the first commits within a second (its poll).
    let (_dir, key, p1, p2) = two_processes_with(&["--sweep-ms", "5000"]);
    let join = |p: &Proc, who: &str, host: bool| {
        let token = join_token(&key, "ch", who, host);
        let addr = p.addr;
        async move { Raw::join(addr, "ch", &token, None).await }
    };
    let mut alice = join(&p1, "alice", true).await;
    alice.until_host().await;
    let mut carol = join(&p1, "carol", false).await;
    carol.until_capability().await;
    let mut bob = join(&p2, "bob", false).await; // the room's hub on the second
    bob.until_capability().await;
    // Alice leaves; no one there may host: the first commits the room hostless.
    alice.ws.close(None).await.unwrap();
    let hostless = carol
        .until(|m| match m {
            ServerMsg::Assignment(s) if s.assignment.host.is_none() => Some(s.assignment.clone()),
            _ => None,
        })
        .await;
    let closed = admin_post(p2.addr, "ch", "close", serde_json::json!({})).await;
    assert_eq!(
        (closed["epoch"].as_u64(), closed["host"].is_null()),
        (Some(hostless.epoch.0), true),
        "{closed}"
    );
}

/// An admin reassign of a room closed through another process answers with the closing
/// assignment, while that process still holds the room's members (it closes them on its next
/// sweep): it tried a grant, which a closed room's row refuses, and answered 409 "another commit
/// won; retry" to every retry until those members were gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reassigning_a_room_closed_elsewhere_answers_its_closing_assignment() {
    // The second's sweeps (which close a closed room's sessions there) come every 5 s.
    let (_dir, key, p1, p2) = two_processes_with(&["--sweep-ms", "5000"]);
    let mut host = Raw::join(p2.addr, "rc", &join_token(&key, "rc", "alice", true), None).await;
    host.until_host().await;
    let mut other = Raw::join(p2.addr, "rc", &join_token(&key, "rc", "bob", true), None).await;
    other.until_capability().await;
    let closing = admin_post(p1.addr, "rc", "close", serde_json::json!({})).await;
    assert_eq!(closing["reason"], "closed");
    let r = reqwest::Client::new()
        .post(format!("http://{}/v1/admin/rooms/rc/reassign", p2.addr))
        .bearer_auth("admin-secret-key-1234")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    assert_eq!(r.json::<serde_json::Value>().await.unwrap(), closing);
    // Whoever it names (it was 404 for a participant not connected here).
    let named = admin_post(
        p2.addr,
        "rc",
        "reassign",
        serde_json::json!({"to": "nobody"}),
    )
    .await;
    assert_eq!(named, closing);
    assert_eq!(host.until_closed().await, Some(ErrorCode::RoomClosed));
}

/// An admin kick made through one process reaches the member's sessions on another process on
/// the same database: they get `kicked` and close, and a kicked host is replaced there at once
/// (reason `kicked`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kick_through_one_process_reaches_the_other() {
    let (_dir, key, p1, p2) = two_processes();
    let mut host = Raw::join(p2.addr, "kk", &join_token(&key, "kk", "alice", true), None).await;
    host.until_host().await;
    let mut other = Raw::join(p2.addr, "kk", &join_token(&key, "kk", "bob", true), None).await;
    other.until_capability().await;
    // None of alice's sessions is held by p1; p2 kicks them on its next sweep.
    assert_eq!(kick(p1.addr, "kk", "alice").await, 0);
    assert_eq!(host.until_closed().await, Some(ErrorCode::Kicked));
    let a = other
        .until(|m| match m {
            ServerMsg::Assignment(s) if s.assignment.reason == Reason::Kicked => {
                Some(s.assignment.clone())
            }
            _ => None,
        })
        .await;
    assert_eq!(a.host.as_ref().map(|h| h.as_str()), Some("bob"));
}

/// Returns just after a sweep of `p2` (which applies the kicks made through `p1`): a throwaway
/// member kicked through `p1` is closed by it. With `--sweep-ms 5000`, the next is 5 s away.
async fn just_swept(key: &Keypair, p1: &Proc, p2: &Proc, room: &str) {
    let mut sync = Raw::join(p2.addr, room, &join_token(key, room, "sync", false), None).await;
    sync.until_capability().await;
    assert_eq!(kick(p1.addr, room, "sync").await, 0);
    assert_eq!(sync.until_closed().await, Some(ErrorCode::Kicked));
}

/// Waits out the millisecond a kick was just recorded in: a session begun in it counts as begun
/// before the kick (the times compared are whole milliseconds).
async fn begin_after_the_kick() {
    tokio::time::sleep(Duration::from_millis(2)).await;
}

/// A kick through one process leaves be the session its participant began since on another
/// (it may join again: a kick does not bar it), though that process applies the kick on a later
/// sweep: it closed every session of the participant then, and took the host role from the new
/// one if it had been elected meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kick_applied_late_leaves_the_sessions_begun_since() {
    // The second's sweeps (which apply the first's kicks) come every 5 s.
    let (_dir, key, p1, p2) = two_processes_with(&["--sweep-ms", "5000"]);
    let token = join_token(&key, "kl", "alice", true);
    let mut old = Raw::join(p2.addr, "kl", &token, None).await;
    old.until_host().await;
    just_swept(&key, &p1, &p2, "kl").await;
    assert_eq!(kick(p1.addr, "kl", "alice").await, 0);
    begin_after_the_kick().await;
    // Alice joins again (her page reloaded), before the second applies the kick.
    let mut new = Raw::join(p2.addr, "kl", &token, None).await;
    new.until_capability().await;
    assert_eq!(old.until_closed().await, Some(ErrorCode::Kicked));
    // The kicked host is replaced by the only member left, the session begun since (fenced
    // until the old lease runs out: a minute here), which stays open.
    let a = new
        .until(|m| match m {
            ServerMsg::Assignment(s) if s.assignment.reason == Reason::Kicked => {
                Some(s.assignment.clone())
            }
            _ => None,
        })
        .await;
    let welcomed = new.seen.iter().find_map(|m| match m {
        ServerMsg::Welcome { session, .. } => Some(session.clone()),
        _ => None,
    });
    assert_eq!(
        (a.host.as_ref().map(|h| h.as_str()), a.session),
        (Some("alice"), welcomed)
    );
}

/// A kick applied late (on another process's next sweep) does not take the host role from a
/// session its participant began after it and was elected in since: that grant came after the
/// kick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kick_applied_late_leaves_a_host_elected_since() {
    let (_dir, key, p1, p2) = two_processes_with(&["--sweep-ms", "5000"]);
    let join = |p: &str, host: bool| {
        let token = join_token(&key, "ke", p, host);
        async move { Raw::join(p2.addr, "ke", &token, None).await }
    };
    let mut old = join("alice", true).await;
    old.until_host().await;
    // Carol and dave (no hosts: never elected) mark the second's later sweeps below.
    let (mut carol, mut dave) = (join("carol", false).await, join("dave", false).await);
    carol.until_capability().await;
    dave.until_capability().await;
    just_swept(&key, &p1, &p2, "ke").await;
    assert_eq!(kick(p1.addr, "ke", "alice").await, 0);
    begin_after_the_kick().await;
    // Before the second applies the kick: alice joins again, bob joins, and her old session
    // leaves, so that the new one is elected (it joined before bob).
    let mut new = join("alice", true).await;
    new.until_capability().await;
    let mut bob = join("bob", true).await;
    bob.until_capability().await;
    old.ws.close(None).await.unwrap();
    new.until_host().await;
    // The second's sweeps: the one that kicks carol applied alice's kick too (or one before
    // it did), and dave's comes a sweep (5 s) after it.
    assert_eq!(kick(p1.addr, "ke", "carol").await, 0);
    assert_eq!(carol.until_closed().await, Some(ErrorCode::Kicked));
    assert_eq!(kick(p1.addr, "ke", "dave").await, 0);
    assert_eq!(dave.until_closed().await, Some(ErrorCode::Kicked));
    let kicked = |r: &Raw| {
        r.seen
            .iter()
            .any(|m| matches!(m, ServerMsg::Assignment(s) if s.assignment.reason == Reason::Kicked))
    };
    // (Dave read every frame of the room until his own kick.)
    assert!(!kicked(&dave), "replaced: {:?}", dave.seen);
}

/// A host whose connection is gone, kicked through a process holding none of the room's members:
/// it is replaced by a member of the process that applies the kick on its next sweep. The kicking
/// process left it to that one, which replaced only the sessions it closed (none of a host
/// already gone): the room named the kicked host until its lease lapsed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_gone_and_kicked_through_a_process_without_members_is_replaced() {
    let (_dir, key, p1, p2) = two_processes();
    let mut alice = Raw::join(p2.addr, "kg", &join_token(&key, "kg", "alice", true), None).await;
    alice.until_host().await;
    let mut bob = Raw::join(p2.addr, "kg", &join_token(&key, "kg", "bob", true), None).await;
    bob.until_capability().await;
    // The connection drops without a close: the lease (a minute) is left to run out.
    drop(alice);
    let alice_left = |m: &ServerMsg| match m {
        ServerMsg::Presence {
            member,
            online: false,
        } => member.id.as_str() == "alice",
        ServerMsg::PresenceBatch { left, .. } => left.iter().any(|m| m.id.as_str() == "alice"),
        _ => false,
    };
    bob.until(|m| alice_left(m).then_some(())).await;
    assert_eq!(kick(p1.addr, "kg", "alice").await, 0);
    let a = bob
        .until(|m| match m {
            ServerMsg::Assignment(s)
                if s.assignment.host.as_ref().map(|h| h.as_str()) == Some("bob") =>
            {
                Some(s.assignment.clone())
            }
            _ => None,
        })
        .await;
    assert_eq!(a.reason, Reason::Kicked, "{a:?}");
}

/// No token reaches the log at `RUST_LOG=trace` either: the WebSocket library logs every frame it
/// reads in full at that level (a hello's join token, a command's capability).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_token_is_logged_at_trace_level() {
    // Also with the WebSocket library's own modules named at `trace`: a directive as specific
    // as that won over the one the server added for the library, and every frame was logged.
    for rust_log in [
        "trace",
        "debug,tungstenite::protocol=trace,tungstenite::protocol::frame=trace,tokio_tungstenite=trace",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let key = app_key_file(dir.path());
        let db = format!("sqlite://{}", dir.path().join("tr.db").display());
        let p = spawn_proc_logging(&db, dir.path(), "p1", 60_000, &[], rust_log);
        let token = join_token(&key, "tr", "alice", true);
        let mut alice = Raw::join(p.addr, "tr", &token, None).await;
        alice.until_host().await;
        let (epoch, host_token) = alice.host_capability().expect("a host capability");
        alice.send_resign(epoch, host_token.clone()).await;
        alice
            .until(|m| matches!(m, ServerMsg::CommandResult { .. }).then_some(()))
            .await;
        let log = p.log.clone();
        drop(p);
        let log = std::fs::read_to_string(log).unwrap();
        // (RUST_LOG is honoured: the store's queries are logged at debug.)
        assert!(log.contains(" DEBUG sqlx::query"), "RUST_LOG not honoured: {rust_log}");
        for t in [token.expose(), host_token.expose(), "hlj1.", "hlc1."] {
            assert!(!log.contains(t), "a token in the log with {rust_log}: {t:.8}");
        }
    }
}

/// A host that resigns and drops its connection at once (before the answer can reach it): the
/// resignation is committed by the store all the same, and the server still writes its one
/// reassignment log line (it was lost with the connection's task).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resign_whose_connection_drops_at_once_is_still_logged() {
    let dir = tempfile::tempdir().unwrap();
    let key = app_key_file(dir.path());
    let db = format!("sqlite://{}", dir.path().join("rs.db").display());
    // A long lease: no lapse adds a reassignment while the test runs.
    let p = spawn_proc(&db, dir.path(), "p1", 60_000, &[]);
    let mut alice = Raw::join(p.addr, "rs", &join_token(&key, "rs", "alice", true), None).await;
    alice.until_host().await;
    let (epoch, host_token) = alice.host_capability().expect("a host capability");
    let mut bob = Raw::join(p.addr, "rs", &join_token(&key, "rs", "bob", true), None).await;
    bob.until_capability().await;
    alice.send_resign(epoch, host_token).await;
    drop(alice);
    bob.until_host().await;
    let log = dir.path().join("p1.log");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let lines = loop {
        let n = std::fs::read_to_string(&log)
            .unwrap()
            .matches("host reassigned")
            .count();
        if n >= 2 || tokio::time::Instant::now() >= deadline {
            break n;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let items = read_log(&db, "rs").await;
    let reasons: Vec<Reason> = items
        .iter()
        .filter_map(|i| match i {
            Item::Assignment(a) => Some(a.assignment.reason),
            _ => None,
        })
        .collect();
    assert_eq!(
        reasons.len(),
        2,
        "the first grant and the resignation: {reasons:?}"
    );
    assert_eq!(reasons[1], Reason::Resigned);
    assert_eq!(
        lines,
        reasons.len(),
        "one log line per committed reassignment"
    );
}

/// SIGTERM: every open session is told `internal` ("server shutting down") before its socket
/// closes, and a request whose body never comes does not keep the process from exiting (the
/// runtime used to stop once the HTTP connections had drained, cutting most sessions off
/// mid-close, and waited for ever for that request).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_tells_every_session_and_exits() {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let key = app_key_file(dir.path());
    let db = format!("sqlite://{}", dir.path().join("sd.db").display());
    let mut p = spawn_proc(&db, dir.path(), "sd", 60_000, &[]);
    let mut sessions = Vec::new();
    for i in 0..100 {
        let t = join_token(&key, "sd", &format!("p{i}"), false);
        let mut r = Raw::join(p.addr, "sd", &t, None).await;
        r.until(|m| matches!(m, ServerMsg::Welcome { .. }).then_some(()))
            .await;
        sessions.push(r);
    }
    let mut slow = tokio::net::TcpStream::connect(p.addr).await.unwrap();
    slow.write_all(
        b"POST /v1/rooms/sd/commands HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{",
    )
    .await
    .unwrap();
    let st = std::process::Command::new("kill")
        .args(["-TERM", &p.child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let told = futures_util::future::join_all(sessions.iter_mut().map(|r| r.until_closed())).await;
    let missed = told
        .iter()
        .filter(|c| **c != Some(ErrorCode::Internal))
        .count();
    assert_eq!(
        missed, 0,
        "sessions cut off without `internal`: {missed} of 100"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = p.child.try_wait().unwrap() {
            assert!(status.success(), "exit status {status:?}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "still running");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(slow);
}
