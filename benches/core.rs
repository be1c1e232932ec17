//! Benchmarks of the core, printed as a table. Each figure is the median of several runs, next
//! to a baseline measured in the same run, so that the ratio means something on a shared machine.
//!
//! Run with `cargo xtask bench`.

use std::hint::black_box;
use std::time::Instant as Clock;

use hostlease::core::{Config, HostView, Instant};
use hostlease::protocol::*;

const RUNS: usize = 7;

fn pid(s: &str) -> ParticipantId {
    ParticipantId::new(s).unwrap()
}

fn room() -> RoomId {
    RoomId::new("bench-room").unwrap()
}

fn hosts() -> Vec<(ParticipantId, SessionId)> {
    (0..8)
        .map(|i| {
            (
                pid(&format!("p{i}")),
                SessionId::new(format!("p{i}-s")).unwrap(),
            )
        })
        .collect()
}

fn assignment(epoch: u64, seq: u64, host: &(ParticipantId, SessionId)) -> Assignment {
    Assignment {
        room: room(),
        host: Some(host.0.clone()),
        session: Some(host.1.clone()),
        epoch: Epoch(epoch),
        seq: Seq(seq),
        lease_ms: 5000,
        reason: Reason::Elected,
        issued_at: ServerTime(seq),
    }
}

fn event(seq: u64) -> RoomEvent {
    RoomEvent {
        seq: Seq(seq),
        epoch: Epoch(1),
        actor: pid("p1"),
        action: Action::new("vote").unwrap(),
        payload: Json::parse(&(seq % 4).to_string()).unwrap(),
        at: ServerTime(seq),
    }
}

fn welcome(seq: u64, current: Assignment) -> ServerMsg {
    ServerMsg::Welcome {
        you: pid("me"),
        session: SessionId::new("me-s").unwrap(),
        snapshot: Snapshot {
            room: room(),
            current: current.into(),
            members: vec![],
            seq: Seq(seq),
            lease_remaining_ms: None,
            server_time: ServerTime(0),
            actions: ActionTable::default(),
        },
        missed: vec![],
        discontinuity: None,
    }
}

fn live_view() -> HostView {
    let mut v = HostView::new(Config {
        replay_history: false,
        buffer_limit: 1 << 20,
        ..Config::default()
    });
    v.handle_connected(Instant::ZERO, Token::new("jt"));
    v.handle_server(Instant::ZERO, welcome(0, assignment(0, 0, &hosts()[0])));
    while v.poll_event().is_some() {}
    while v.poll_transmit().is_some() {}
    v
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.partial_cmp(b).unwrap());
    xs[xs.len() / 2]
}

/// Items per second of `f(n)`, median of RUNS runs, with inputs built outside the timing.
fn rate<I>(n: usize, mut build: impl FnMut() -> I, mut f: impl FnMut(I)) -> f64 {
    median(
        (0..RUNS)
            .map(|_| {
                let input = build();
                let t = Clock::now();
                f(input);
                n as f64 / t.elapsed().as_secs_f64()
            })
            .collect(),
    )
}

/// The least an implementation of the stale-drop rule can do: compare, store, count.
struct Bare {
    epoch: u64,
    holder: usize,
    changes: u64,
}

fn main() {
    let hosts = hosts();
    let n = 1_000_000;

    // 1. Assignments applied per second (server stream, in order, each a new epoch).
    let msgs = || -> Vec<ServerMsg> {
        (1..=n as u64)
            .map(|e| {
                ServerMsg::Assignment(assignment(e, e, &hosts[e as usize % hosts.len()]).into())
            })
            .collect()
    };
    let core_assign = rate(
        n,
        || (live_view(), msgs()),
        |(mut v, msgs)| {
            for m in msgs {
                v.handle_server(Instant::ZERO, m);
                while let Some(e) = v.poll_event() {
                    black_box(e);
                }
            }
            black_box(v.epoch());
        },
    );
    let bare_assign = rate(n, msgs, |msgs| {
        let mut b = Bare {
            epoch: 0,
            holder: 0,
            changes: 0,
        };
        for m in msgs {
            if let ServerMsg::Assignment(a) = m {
                if a.assignment.epoch.0 > b.epoch {
                    b.epoch = a.assignment.epoch.0;
                    b.holder = a.assignment.host.map_or(0, |h| h.as_str().len());
                    b.changes += 1;
                }
            }
        }
        black_box((b.epoch, b.holder, b.changes));
    });

    // 2. Stale and duplicate assignments dropped per second (relayed by peers).
    let stale = || -> (HostView, Vec<SignedAssignment>) {
        let mut v = live_view();
        v.handle_server(
            Instant::ZERO,
            ServerMsg::Assignment(assignment(1_000_000, 1, &hosts[1]).into()),
        );
        while v.poll_event().is_some() {}
        let relays = (0..n as u64)
            .map(|e| assignment(e % 1_000_000, 1, &hosts[2]).into())
            .collect();
        (v, relays)
    };
    let core_stale = rate(n, stale, |(mut v, relays)| {
        for a in relays {
            black_box(v.handle_peer_assignment(Instant::ZERO, a));
        }
    });

    // 3. Events through a resync per second: buffered while resyncing, applied after the welcome.
    let k = 100_000usize;
    let resync_input = || -> (HostView, Vec<ServerMsg>) {
        let mut v = live_view();
        v.handle_disconnected(Instant::ZERO);
        v.handle_connected(Instant::ZERO, Token::new("jt"));
        while v.poll_transmit().is_some() {}
        while v.poll_event().is_some() {}
        let evs = (1..=k as u64)
            .rev()
            .map(|s| ServerMsg::Event(event(s)))
            .collect();
        (v, evs)
    };
    let core_resync = rate(k, resync_input, |(mut v, evs)| {
        for m in evs {
            v.handle_server(Instant::ZERO, m);
        }
        v.handle_server(Instant::ZERO, welcome(0, assignment(0, 0, &hosts[0])));
        let mut applied = 0;
        while let Some(e) = v.poll_event() {
            applied += matches!(e, hostlease::core::Event::RoomEvent(_)) as usize;
        }
        assert_eq!(applied, k);
    });
    let bare_resync = rate(
        k,
        || (1..=k as u64).rev().map(event).collect::<Vec<_>>(),
        |evs| {
            let mut buf = std::collections::BTreeMap::new();
            for e in evs {
                buf.insert(e.seq, e);
            }
            let mut cursor = 0;
            for (s, e) in buf {
                if s.0 == cursor + 1 {
                    cursor = s.0;
                    black_box(e);
                }
            }
            assert_eq!(cursor as usize, k);
        },
    );

    // 4. A full reconnect + resync of 1,000 buffered events, per second.
    let reconnects = 200usize;
    let full = rate(
        reconnects,
        || {
            let evs: Vec<Vec<ServerMsg>> = (0..reconnects)
                .map(|r| {
                    let base = r as u64 * 1000;
                    (base + 1..=base + 1000)
                        .map(|s| ServerMsg::Event(event(s)))
                        .collect()
                })
                .collect();
            (live_view(), evs)
        },
        |(mut v, batches)| {
            for (r, batch) in batches.into_iter().enumerate() {
                v.handle_disconnected(Instant::ZERO);
                v.handle_connected(Instant::ZERO, Token::new("jt"));
                for m in batch {
                    v.handle_server(Instant::ZERO, m);
                }
                v.handle_server(
                    Instant::ZERO,
                    welcome(r as u64 * 1000, assignment(0, 0, &hosts[0])),
                );
                while v.poll_transmit().is_some() {}
                while let Some(e) = v.poll_event() {
                    black_box(e);
                }
            }
        },
    );

    // 5. Frames decoded per second (the codec the browser driver uses), against serde_json
    // parsing the same text into an untyped Value.
    let texts = || -> Vec<String> {
        (1..=200_000u64)
            .map(|s| hostlease::protocol::encode_server(&ServerMsg::Event(event(s))))
            .collect()
    };
    let decode = rate(200_000, texts, |t| {
        for x in t {
            black_box(hostlease::protocol::decode_server(&x).unwrap());
        }
    });
    let untyped = rate(200_000, texts, |t| {
        for x in t {
            black_box(serde_json::from_str::<serde_json::Value>(&x).unwrap());
        }
    });

    println!();
    println!("| benchmark (median of {RUNS}) | hostlease core | bare baseline | core / baseline |");
    println!("|---|---:|---:|---:|");
    println!(
        "| assignments applied (new epoch each) | {:.2} M/s | {:.2} M/s | {:.2} |",
        core_assign / 1e6,
        bare_assign / 1e6,
        core_assign / bare_assign
    );
    println!(
        "| stale relayed assignments dropped | {:.2} M/s | — | — |",
        core_stale / 1e6
    );
    println!(
        "| events through a resync (100k buffered, reversed) | {:.2} M/s | {:.2} M/s | {:.2} |",
        core_resync / 1e6,
        bare_resync / 1e6,
        core_resync / bare_resync
    );
    println!(
        "| reconnect + resync of 1,000 buffered events | {:.0} /s ({:.0} µs each) | — | — |",
        full,
        1e6 / full
    );
    println!(
        "| event frames decoded (typed, validated) | {:.2} M/s | {:.2} M/s (untyped serde_json::Value) | {:.2} |",
        decode / 1e6,
        untyped / 1e6,
        decode / untyped
    );
    println!();
    println!("bare baseline: the least code that implements the same rule (an epoch compare and store; a BTreeMap reorder buffer), fed the same inputs in the same run.");
}
