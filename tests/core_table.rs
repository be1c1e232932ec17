//! Table tests: one transition of the core each.

mod common;

// The same tests run in the browser (wasm-bindgen-test), at the default, reduced sizes.
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

use common::*;
use hostlease::core::*;
use hostlease::protocol::*;
use serde_json::json;

fn server(v: &mut HostView, ms: u64, msg: ServerMsg) -> (Vec<ClientMsg>, Vec<Event>) {
    v.handle_server(at(ms), msg);
    drain(v)
}

fn assign(epoch: u64, seq: u64, host: Option<&str>) -> ServerMsg {
    ServerMsg::Assignment(assignment(epoch, seq, host).into())
}

/// Makes `me` (already named host at `epoch`) hold a confirmed lease: probe, echo, confirm.
fn confirm_lease(v: &mut HostView, epoch: u64, echo_at: u64, confirm_at: u64, remaining: u64) {
    let (t, _) = server(
        v,
        echo_at,
        ServerMsg::LeaseProbe {
            nonce: 9,
            epoch: Epoch(epoch),
        },
    );
    assert_eq!(t, vec![ClientMsg::LeaseEcho { nonce: 9 }]);
    server(
        v,
        confirm_at,
        ServerMsg::LeaseConfirm {
            nonce: 9,
            epoch: Epoch(epoch),
            remaining_ms: remaining,
        },
    );
    server(v, confirm_at, host_cap(epoch));
}

fn host_command(v: &mut HostView, ms: u64) -> Result<IdempotencyKey, CommandError> {
    v.command(at(ms), action("poll.open"), js(json!({"q": "?"})), None)
}

// ----- stale drop ---------------------------------------------------------------------------

#[test]
fn older_epoch_is_dropped_newer_is_adopted() {
    let mut v = live("b", "a", 5);
    let (_, ev) = server(&mut v, 20, assign(6, 6, Some("c")));
    assert!(ev.iter().any(
        |e| matches!(e, Event::HostChanged { assignment, .. } if assignment.epoch == Epoch(6))
    ));
    // Epoch 4 on the stream (seq 7) is applied in order but must not move the view back.
    server(&mut v, 21, assign(4, 7, Some("a")));
    assert_eq!(v.epoch(), Some(Epoch(6)));
    assert_eq!(v.assignment().unwrap().host, Some(pid("c")));
    assert_eq!(v.stats().stale_dropped, 1);
    assert_eq!(v.cursor(), Seq(7));
}

#[test]
fn same_epoch_duplicate_is_harmless_and_conflict_is_a_violation() {
    let mut v = live("b", "a", 5);
    let dup = SignedAssignment::from(assignment(5, 5, Some("a")));
    assert!(!v.handle_peer_assignment(at(20), dup));
    let (_, ev) = drain(&mut v);
    assert!(ev.is_empty(), "{ev:?}");
    let conflicting = SignedAssignment::from(assignment(5, 5, Some("c")));
    assert!(!v.handle_peer_assignment(at(21), conflicting));
    let (_, ev) = drain(&mut v);
    assert!(ev.contains(&Event::ProtocolViolation(
        Violation::ConflictingAssignment { epoch: Epoch(5) }
    )));
    assert_eq!(
        v.assignment().unwrap().host,
        Some(pid("a")),
        "the first holder stays"
    );
}

#[test]
fn assignment_for_another_room_is_a_violation() {
    let mut v = live("b", "a", 5);
    let mut other = assignment(9, 6, Some("c"));
    other.room = RoomId::new("elsewhere").unwrap();
    v.handle_peer_assignment(at(20), other.into());
    let (_, ev) = drain(&mut v);
    assert!(ev.contains(&Event::ProtocolViolation(Violation::WrongRoom)));
    assert_eq!(v.epoch(), Some(Epoch(5)));
}

// ----- phases and resync --------------------------------------------------------------------

#[test]
fn phases_connecting_live_offline_resyncing_live() {
    let mut v = HostView::new(config());
    assert_eq!(v.phase(), Phase::Connecting);
    v.handle_connected(at(0), Token::new("jt"));
    let (t, _) = drain(&mut v);
    assert!(matches!(
        &t[..],
        [ClientMsg::Hello {
            resume: Some(Seq(0)),
            epoch_seen: None,
            ..
        }]
    ));
    let snap = snapshot(assignment(1, 1, Some("a")), vec![member("a", 1)], None);
    let (_, ev) = server(&mut v, 5, welcome("b", snap, vec![]));
    assert_eq!(v.phase(), Phase::Live);
    assert!(ev.contains(&Event::Phase(Phase::Live)));
    v.handle_disconnected(at(10));
    assert_eq!(v.phase(), Phase::Offline);
    v.handle_connected(at(20), Token::new("jt"));
    let (t, _) = drain(&mut v);
    assert_eq!(v.phase(), Phase::Resyncing);
    assert!(matches!(
        &t[..],
        [ClientMsg::Hello {
            resume: Some(Seq(1)),
            epoch_seen: Some(Epoch(1)),
            ..
        }]
    ));
    let snap = snapshot(assignment(1, 1, Some("a")), vec![member("a", 1)], None);
    server(&mut v, 25, welcome("b", snap, vec![]));
    assert_eq!(v.phase(), Phase::Live);
}

#[test]
fn no_history_requested_when_replay_is_off() {
    let mut v = HostView::new(Config {
        replay_history: false,
        ..config()
    });
    v.handle_connected(at(0), Token::new("jt"));
    let (t, _) = drain(&mut v);
    assert!(matches!(&t[..], [ClientMsg::Hello { resume: None, .. }]));
}

#[test]
fn input_before_the_snapshot_is_buffered_and_applied_once_in_order() {
    let mut v = connected("b");
    // The stream races ahead of the welcome: 6, 4 (the assignment the snapshot names), 5, 7,
    // 5 (dup), 3 (replayed too).
    for seq in [6, 4, 5, 7, 5, 3] {
        if seq == 4 {
            server(&mut v, 1, assign(2, 4, Some("a")));
        } else {
            server(&mut v, 1, ServerMsg::Event(event(seq, 2, "a")));
        }
    }
    assert_eq!(v.buffered(), 5);
    let snap = snapshot(assignment(2, 4, Some("a")), vec![member("a", 1)], None);
    let missed = vec![
        Item::Event(event(3, 2, "a")),
        Item::Event(event(1, 1, "a")),
        Item::Event(event(2, 1, "a")),
    ];
    let (_, ev) = server(&mut v, 2, welcome("b", snap, missed));
    // Replay 1..=3, then the snapshot at 4 (seq 4 is the assignment), then buffered 5, 6, 7.
    assert_eq!(room_events(&ev), vec![1, 2, 3, 5, 6, 7]);
    assert_eq!(v.cursor(), Seq(7));
    assert_eq!(v.phase(), Phase::Live);
}

/// A late joiner's welcome replays the room's history, past assignments among its events. The
/// snapshot's assignment is adopted first, so the past ones are older than the view and dropped
/// as stale: one `HostChanged`, the current host's, and every room event in order. (Applied in
/// seq order before the snapshot, each past host was announced in turn, all of them after the
/// view already showed the current one.)
#[test]
fn a_replayed_history_announces_only_the_current_host() {
    let mut v = connected("c");
    let snap = snapshot(assignment(3, 6, Some("b")), vec![member("b", 2)], None);
    let missed = vec![
        Item::Assignment(assignment(1, 1, Some("a")).into()),
        Item::Event(event(2, 1, "a")),
        Item::Assignment(assignment(2, 3, Some("x")).into()),
        Item::Event(event(4, 2, "x")),
        Item::Event(event(5, 2, "x")),
        Item::Assignment(assignment(3, 6, Some("b")).into()),
    ];
    let (_, ev) = server(&mut v, 2, welcome("c", snap, missed));
    let hosts: Vec<_> = ev
        .iter()
        .filter_map(|e| match e {
            Event::HostChanged {
                assignment, via, ..
            } => Some((assignment.epoch, *via)),
            _ => None,
        })
        .collect();
    assert_eq!(hosts, vec![(Epoch(3), Source::Snapshot)]);
    assert_eq!(room_events(&ev), vec![2, 4, 5]);
    assert_eq!(v.stats().stale_dropped, 2);
    assert_eq!(v.cursor(), Seq(6));
    assert_eq!(v.phase(), Phase::Live);
}

/// A resuming view's replay keeps seq order, assignments included: no assignment it missed is
/// lost (DESIGN's invariant), each announced among the events it came between.
#[test]
fn a_resumed_replay_announces_every_missed_assignment_in_order() {
    let mut v = live("c", "a", 2);
    v.handle_disconnected(at(20));
    v.handle_connected(at(30), Token::new("jt"));
    drain(&mut v);
    let snap = snapshot(assignment(4, 6, Some("b")), vec![member("b", 2)], None);
    let missed = vec![
        Item::Event(event(3, 2, "a")),
        Item::Assignment(assignment(3, 4, Some("x")).into()),
        Item::Event(event(5, 3, "x")),
        Item::Assignment(assignment(4, 6, Some("b")).into()),
    ];
    let (_, ev) = server(&mut v, 31, welcome("c", snap, missed));
    let order: Vec<String> = ev
        .iter()
        .filter_map(|e| match e {
            Event::HostChanged { assignment, .. } => Some(format!("host {}", assignment.epoch.0)),
            Event::RoomEvent(r) => Some(format!("event {}", r.seq.0)),
            _ => None,
        })
        .collect();
    assert_eq!(order, ["event 3", "host 3", "event 5", "host 4"]);
    assert_eq!(v.epoch(), Some(Epoch(4)));
}

#[test]
fn a_seq_buffered_twice_keeps_the_copy_that_came_last() {
    let mut v = connected("b");
    let mut first = event(5, 2, "a");
    first.payload = js(json!("first"));
    let mut second = event(5, 2, "a");
    second.payload = js(json!("second"));
    for e in [event(7, 2, "a"), first, event(6, 2, "a"), second] {
        server(&mut v, 1, ServerMsg::Event(e));
    }
    assert_eq!(v.buffered(), 3);
    let snap = snapshot(assignment(2, 4, Some("a")), vec![member("a", 1)], None);
    let (_, ev) = server(&mut v, 2, welcome("b", snap, vec![]));
    assert_eq!(room_events(&ev), vec![5, 6, 7]);
    let payloads: Vec<_> = ev
        .iter()
        .filter_map(|e| match e {
            Event::RoomEvent(e) => Some(e.payload.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(payloads[0], js(json!("second")));
}

#[test]
fn a_gap_while_live_asks_to_resume_and_the_welcome_fills_it() {
    let mut v = live("b", "a", 2);
    let (_, ev) = server(&mut v, 20, ServerMsg::Event(event(3, 2, "a")));
    assert_eq!(room_events(&ev), vec![3]);
    let (t, ev) = server(&mut v, 21, ServerMsg::Event(event(5, 2, "a")));
    assert!(room_events(&ev).is_empty());
    assert_eq!(t, vec![ClientMsg::Resume { cursor: Seq(3) }]);
    assert_eq!(v.phase(), Phase::Resyncing);
    // Another gap while waiting does not ask again from the same cursor.
    let (t, _) = server(&mut v, 22, ServerMsg::Event(event(7, 2, "a")));
    assert!(t.is_empty());
    let snap = snapshot(assignment(2, 2, Some("a")), vec![member("a", 1)], None);
    let snap = Snapshot {
        seq: Seq(5),
        ..snap
    };
    let (_, ev) = server(
        &mut v,
        23,
        welcome(
            "b",
            snap,
            vec![Item::Event(event(4, 2, "a")), Item::Event(event(5, 2, "a"))],
        ),
    );
    // 4 and 5 from the replay; 7 stays buffered behind the gap at 6, so it asks again.
    assert_eq!(room_events(&ev), vec![4, 5]);
    assert_eq!(v.phase(), Phase::Resyncing);
    let (t, _) = drain(&mut v);
    assert!(t.is_empty());
    let (_, ev) = server(&mut v, 24, ServerMsg::Event(event(6, 2, "a")));
    assert!(room_events(&ev).is_empty(), "still resyncing, buffered");
    let snap = Snapshot {
        seq: Seq(6),
        ..snapshot(assignment(2, 2, Some("a")), vec![], None)
    };
    let (_, ev) = server(
        &mut v,
        25,
        welcome("b", snap, vec![Item::Event(event(6, 2, "a"))]),
    );
    assert_eq!(room_events(&ev), vec![6, 7]);
    assert_eq!(v.phase(), Phase::Live);
}

/// A welcome at seq 10 that replays 9 and 10 and announces `from..=8` as a discontinuity (the
/// server's replay cut to its newest items).
fn welcome_cut_at_9(from: u64) -> ServerMsg {
    ServerMsg::Welcome {
        you: pid("b"),
        session: sid("b-s"),
        snapshot: Snapshot {
            seq: Seq(10),
            ..snapshot(assignment(2, 2, Some("a")), vec![], None)
        },
        missed: vec![
            Item::Event(event(9, 2, "a")),
            Item::Event(event(10, 2, "a")),
        ],
        discontinuity: Some(Gap {
            from: Seq(from),
            to: Seq(8),
        }),
    }
}

#[test]
fn a_gap_the_server_cannot_fill_becomes_a_discontinuity() {
    let mut v = live("b", "a", 2);
    v.handle_disconnected(at(20));
    v.handle_connected(at(30), Token::new("jt"));
    drain(&mut v);
    let (_, ev) = server(&mut v, 31, welcome_cut_at_9(3));
    assert!(ev.contains(&Event::Discontinuity(Gap {
        from: Seq(3),
        to: Seq(8)
    })));
    assert_eq!(room_events(&ev), vec![9, 10]);
}

/// After `welcome_cut_at_9(4)` to a view that holds 5..=8: only 4 is announced lost, 5..=10 are
/// applied in order.
fn only_4_is_lost(v: &HostView, ev: &[Event]) {
    let gaps: Vec<_> = ev
        .iter()
        .filter(|e| matches!(e, Event::Discontinuity(_)))
        .collect();
    assert_eq!(
        gaps,
        [&Event::Discontinuity(Gap {
            from: Seq(4),
            to: Seq(4)
        })]
    );
    assert_eq!(room_events(ev), vec![5, 6, 7, 8, 9, 10]);
    assert_eq!(v.cursor(), Seq(10));
}

/// A live view that lost one item holds what came after it while it resumes. The server replays
/// only the newest items (its byte budget) and announces the rest as a discontinuity, which
/// covers items the view holds: those are applied in order, and only the one lost is announced.
/// (They were dropped as duplicates once the cursor jumped over the server's gap, and announced
/// as lost.)
#[test]
fn a_discontinuity_never_drops_items_the_view_holds() {
    let mut v = live("b", "a", 2);
    server(&mut v, 20, ServerMsg::Event(event(3, 2, "a")));
    // 4 is lost; 5..=8 arrive and wait behind it.
    let (t, _) = server(&mut v, 21, ServerMsg::Event(event(5, 2, "a")));
    assert_eq!(t, vec![ClientMsg::Resume { cursor: Seq(3) }]);
    for seq in 6..=8 {
        server(&mut v, 22, ServerMsg::Event(event(seq, 2, "a")));
    }
    let (_, ev) = server(&mut v, 23, welcome_cut_at_9(4));
    only_4_is_lost(&v, &ev);
    assert_eq!(v.phase(), Phase::Live);
}

/// The same, with the connection lost and made again before the welcome: the items the view
/// holds are still the room's log, and the new hello resumes from the cursor behind them; only
/// the hole neither side fills is announced.
#[test]
fn a_reconnect_keeps_the_items_the_view_holds() {
    let mut v = live("b", "a", 2);
    server(&mut v, 20, ServerMsg::Event(event(3, 2, "a")));
    server(&mut v, 21, ServerMsg::Event(event(5, 2, "a")));
    for seq in 6..=8 {
        server(&mut v, 22, ServerMsg::Event(event(seq, 2, "a")));
    }
    v.handle_disconnected(at(23));
    v.handle_connected(at(24), Token::new("jt"));
    let (t, _) = drain(&mut v);
    assert!(
        matches!(
            &t[..],
            [ClientMsg::Hello {
                resume: Some(Seq(3)),
                ..
            }]
        ),
        "{t:?}"
    );
    let (_, ev) = server(&mut v, 25, welcome_cut_at_9(4));
    only_4_is_lost(&v, &ev);
}

/// A held item the replay left out (at or below the snapshot point, with no discontinuity
/// announced) fills its place: applied in order, not announced as lost.
#[test]
fn a_held_item_fills_a_hole_in_the_replay() {
    let mut v = live("b", "a", 2);
    server(&mut v, 20, ServerMsg::Event(event(3, 2, "a")));
    let (t, _) = server(&mut v, 21, ServerMsg::Event(event(5, 2, "a")));
    assert_eq!(t, vec![ClientMsg::Resume { cursor: Seq(3) }]);
    let snap = Snapshot {
        seq: Seq(6),
        ..snapshot(assignment(2, 2, Some("a")), vec![], None)
    };
    let missed = vec![Item::Event(event(4, 2, "a")), Item::Event(event(6, 2, "a"))];
    let (_, ev) = server(&mut v, 22, welcome("b", snap, missed));
    assert!(
        !ev.iter().any(|e| matches!(e, Event::Discontinuity(_))),
        "{ev:?}"
    );
    assert_eq!(room_events(&ev), vec![4, 5, 6]);
    assert_eq!(v.cursor(), Seq(6));
}

#[test]
fn an_unannounced_hole_in_the_replay_is_reported_not_hidden() {
    let mut v = live("b", "a", 2);
    v.handle_disconnected(at(20));
    v.handle_connected(at(30), Token::new("jt"));
    drain(&mut v);
    let snap = Snapshot {
        seq: Seq(6),
        ..snapshot(assignment(2, 2, Some("a")), vec![], None)
    };
    let (_, ev) = server(
        &mut v,
        31,
        welcome("b", snap, vec![Item::Event(event(5, 2, "a"))]),
    );
    assert!(ev.contains(&Event::Discontinuity(Gap {
        from: Seq(3),
        to: Seq(4)
    })));
    assert!(ev.contains(&Event::Discontinuity(Gap {
        from: Seq(6),
        to: Seq(6)
    })));
    assert_eq!(room_events(&ev), vec![5]);
}

#[test]
fn buffer_overflow_drops_the_buffer_and_forces_a_new_resync() {
    let mut v = HostView::new(Config {
        buffer_limit: 4,
        ..config()
    });
    v.handle_connected(at(0), Token::new("jt"));
    drain(&mut v);
    for seq in 2..=6 {
        v.handle_server(at(1), ServerMsg::Event(event(seq, 1, "a")));
    }
    let (t, _) = drain(&mut v);
    assert_eq!(t, vec![ClientMsg::Resume { cursor: Seq(0) }]);
    assert_eq!(v.stats().buffer_overflows, 1);
    assert_eq!(v.buffered(), 0);
}

#[test]
fn a_standalone_discontinuity_moves_the_cursor() {
    let mut v = live("b", "a", 2);
    let (_, ev) = server(
        &mut v,
        20,
        ServerMsg::Discontinuity(Gap {
            from: Seq(3),
            to: Seq(5),
        }),
    );
    assert!(ev.contains(&Event::Discontinuity(Gap {
        from: Seq(3),
        to: Seq(5)
    })));
    let (_, ev) = server(&mut v, 21, ServerMsg::Event(event(6, 2, "a")));
    assert_eq!(room_events(&ev), vec![6]);
}

#[test]
fn frames_after_a_disconnect_are_ignored() {
    let mut v = live("b", "a", 2);
    v.handle_disconnected(at(20));
    let (_, ev) = server(&mut v, 21, ServerMsg::Event(event(3, 2, "a")));
    assert!(room_events(&ev).is_empty());
    assert_eq!(v.cursor(), Seq(2));
}

// ----- peers --------------------------------------------------------------------------------

#[test]
fn peer_assignments_need_a_first_snapshot() {
    let mut v = connected("b");
    assert!(!v.handle_peer_assignment(at(1), assignment(9, 9, Some("c")).into()));
    assert_eq!(v.epoch(), None);
    assert_eq!(v.stats().peer_assignments_dropped, 1);
}

#[test]
fn a_relayed_assignment_updates_the_host_but_never_grants_authority() {
    let mut v = live("b", "a", 2);
    assert!(v.handle_peer_assignment(at(20), assignment(3, 3, Some("b")).into()));
    assert!(v.is_named_host());
    assert!(!v.has_authority(at(21)));
    assert_eq!(host_command(&mut v, 21), Err(CommandError::LeaseExpired));
    // A host token that arrives without the server confirming a lease is still not enough.
    server(&mut v, 22, host_cap(3));
    assert!(!v.has_authority(at(22)));
    // The peer relay does not move the cursor: seq is the server stream's.
    assert_eq!(v.cursor(), Seq(2));
}

// ----- lease --------------------------------------------------------------------------------

#[test]
fn the_local_lease_is_anchored_at_the_echo_send_time() {
    let mut v = live("a", "a", 2);
    // Echo sent at 1000, confirm arrives at 1400 saying 3000 ms remain: the deadline is
    // 1000 + 3000·(1−0.01) − 250 = 3720, not 1400 + ...
    confirm_lease(&mut v, 2, 1000, 1400, 3000);
    assert_eq!(v.lease(), LeaseState::Held { deadline: at(3720) });
    assert!(v.has_authority(at(3719)));
    assert!(!v.has_authority(at(3720)));
    assert_eq!(v.poll_timeout(), Some(at(3720)));
    host_command(&mut v, 3000).unwrap();
    drain(&mut v);
    // Past the deadline the host stops by itself, even before the timer fires, and says so.
    assert_eq!(
        v.lease_at(at(3719)),
        LeaseState::Held { deadline: at(3720) }
    );
    assert_eq!(v.lease_at(at(3720)), LeaseState::Expired);
    assert_eq!(v.lease(), LeaseState::Held { deadline: at(3720) });
    assert_eq!(host_command(&mut v, 3720), Err(CommandError::LeaseExpired));
    v.handle_timeout(at(3720));
    assert_eq!(v.lease(), LeaseState::Expired);
}

/// A welcome sets the lease from its snapshot anchored at the oldest resume it may answer; a
/// confirmation that came after that send (between two welcomes, with two resumes out), with a
/// later deadline, stands. The welcome replaced it: one that came late made the host `Expired`,
/// its host commands refused, until the next probe.
#[test]
fn a_welcome_keeps_a_lease_confirmed_after_its_resume_was_sent() {
    let cfg = Config {
        buffer_limit: 2,
        ..config()
    };
    let mut v = live_with(cfg, "a", "a", 2);
    // A gap asks to resume at 100; the buffer's overflow asks again at 120.
    let (t, _) = server(&mut v, 100, ServerMsg::Event(event(4, 2, "b")));
    assert_eq!(t, vec![ClientMsg::Resume { cursor: Seq(2) }]);
    server(&mut v, 110, ServerMsg::Event(event(5, 2, "b")));
    let (t, _) = server(&mut v, 120, ServerMsg::Event(event(6, 2, "b")));
    assert_eq!(t, vec![ClientMsg::Resume { cursor: Seq(2) }]);
    let missed = |upto: u64| (3..=upto).map(|s| Item::Event(event(s, 2, "b"))).collect();
    let snap = snapshot(
        assignment(2, 6, Some("a")),
        vec![member("a", 1)],
        Some(3000),
    );
    let (_, ev) = server(&mut v, 300, welcome("a", snap, missed(6)));
    assert_eq!(room_events(&ev), vec![3, 4, 5, 6]);
    assert_eq!(v.phase(), Phase::Live);
    confirm_lease(&mut v, 2, 2000, 2010, 3000);
    let confirmed = LeaseState::Held {
        deadline: at(2000 + 2970 - 250),
    };
    assert_eq!(v.lease(), confirmed);
    // The second resume's welcome, late, with 1 s left when the server wrote it: anchored at
    // 100, past.
    let snap = snapshot(
        assignment(2, 6, Some("a")),
        vec![member("a", 1)],
        Some(1000),
    );
    server(&mut v, 2100, welcome("a", snap, missed(6)));
    assert_eq!(v.lease(), confirmed);
    assert!(v.has_authority(at(2100)));
    // A welcome's later reading still moves the deadline on.
    v.handle_wake(at(2200));
    drain(&mut v);
    let snap = snapshot(
        assignment(2, 6, Some("a")),
        vec![member("a", 1)],
        Some(9000),
    );
    server(&mut v, 2300, welcome("a", snap, vec![]));
    assert_eq!(
        v.lease(),
        LeaseState::Held {
            deadline: at(2200 + 8910 - 250)
        }
    );
}

#[test]
fn a_confirmation_for_another_nonce_or_epoch_is_ignored() {
    let mut v = live("a", "a", 2);
    server(
        &mut v,
        100,
        ServerMsg::LeaseProbe {
            nonce: 1,
            epoch: Epoch(2),
        },
    );
    server(
        &mut v,
        110,
        ServerMsg::LeaseConfirm {
            nonce: 2,
            epoch: Epoch(2),
            remaining_ms: 9000,
        },
    );
    server(
        &mut v,
        110,
        ServerMsg::LeaseConfirm {
            nonce: 1,
            epoch: Epoch(1),
            remaining_ms: 9000,
        },
    );
    // Only the snapshot's lease (anchored at the hello at t=0) holds: 0 + 2970 − 250.
    assert_eq!(v.lease(), LeaseState::Held { deadline: at(2720) });
}

#[test]
fn a_new_grant_has_no_authority_until_its_first_confirmation() {
    let mut v = live("b", "a", 2);
    server(&mut v, 20, assign(3, 3, Some("b")));
    assert!(v.is_named_host());
    assert_eq!(v.lease(), LeaseState::Unknown);
    assert_eq!(host_command(&mut v, 21), Err(CommandError::LeaseExpired));
    confirm_lease(&mut v, 3, 30, 40, 3000);
    assert!(v.has_authority(at(41)));
    host_command(&mut v, 41).unwrap();
}

#[test]
fn wake_from_sleep_makes_the_lease_unknown_and_resyncs() {
    let mut v = live("a", "a", 2);
    confirm_lease(&mut v, 2, 100, 110, 3000);
    assert!(v.has_authority(at(200)));
    v.handle_wake(at(250));
    let (t, ev) = drain(&mut v);
    assert_eq!(v.lease(), LeaseState::Unknown);
    assert!(ev.contains(&Event::Lease(LeaseState::Unknown)));
    assert_eq!(t, vec![ClientMsg::Resume { cursor: Seq(2) }]);
    assert_eq!(
        host_command(&mut v, 251),
        Err(CommandError::NotAuthoritative)
    );
    // The next snapshot sets the lease again, anchored at the resume's send time (250).
    let snap = snapshot(
        assignment(2, 2, Some("a")),
        vec![member("a", 1)],
        Some(2000),
    );
    server(&mut v, 300, welcome("a", snap, vec![]));
    assert_eq!(
        v.lease(),
        LeaseState::Held {
            deadline: at(250 + 1980 - 250)
        }
    );
}

#[test]
fn a_clock_that_goes_backwards_is_clamped() {
    let mut v = live("a", "a", 2);
    confirm_lease(&mut v, 2, 1000, 1010, 3000);
    // An input stamped earlier than one already seen cannot extend the lease.
    assert!(!v.has_authority(at(5000)));
    assert_eq!(host_command(&mut v, 5000), Err(CommandError::LeaseExpired));
    assert_eq!(host_command(&mut v, 10), Err(CommandError::LeaseExpired));
}

#[test]
fn resign_relinquishes_at_once() {
    let mut v = live("a", "a", 2);
    confirm_lease(&mut v, 2, 100, 110, 3000);
    v.resign(at(200)).unwrap();
    let (t, _) = drain(&mut v);
    assert!(
        matches!(&t[..], [ClientMsg::Command { action, epoch: Some(Epoch(2)), .. }] if action.as_str() == ACTION_RESIGN)
    );
    assert_eq!(v.lease(), LeaseState::Relinquished);
    assert_eq!(host_command(&mut v, 201), Err(CommandError::NotHost));
}

#[test]
fn transfer_names_the_target() {
    let mut v = live("a", "a", 2);
    confirm_lease(&mut v, 2, 100, 110, 3000);
    v.transfer(at(200), &pid("c")).unwrap();
    let (t, _) = drain(&mut v);
    assert!(
        matches!(&t[..], [ClientMsg::Command { payload, .. }] if payload == &js(json!({"to": "c"})))
    );
    assert!(!v.has_authority(at(201)));
}

// ----- provisional coordinator --------------------------------------------------------------

#[test]
fn provisional_is_the_last_host_if_reachable() {
    let mut v = live("c", "b", 2);
    v.handle_peer_seen(at(15), pid("b"));
    v.handle_disconnected(at(20));
    let (_, ev) = drain(&mut v);
    assert_eq!(v.provisional(), Some(&pid("b")));
    assert!(ev.contains(&Event::Provisional {
        coordinator: Some(pid("b"))
    }));
    assert_eq!(
        host_command(&mut v, 21),
        Err(CommandError::NotAuthoritative)
    );
}

#[test]
fn provisional_falls_back_to_the_first_reachable_member_in_server_order() {
    let mut v = live("c", "a", 2);
    v.handle_disconnected(at(20));
    // Nobody reachable but me.
    assert_eq!(v.provisional(), Some(&pid("c")));
    v.handle_peer_seen(at(21), pid("b"));
    assert_eq!(v.provisional(), Some(&pid("b")));
    v.handle_peer_seen(at(22), pid("a"));
    assert_eq!(v.provisional(), Some(&pid("a")), "the last host came back");
    v.handle_peer_lost(at(23), &pid("a"));
    assert_eq!(v.provisional(), Some(&pid("b")));
    // A socket open but its hello not answered yet (a server slow to take the hello in a
    // reconnect storm) is not the server reachable: the coordinator stays, and follows the
    // peers (it was cleared, and this page showed none while the others showed theirs).
    v.handle_connected(at(30), Token::new("jt"));
    assert_eq!(v.provisional(), Some(&pid("b")));
    v.handle_peer_lost(at(31), &pid("b"));
    assert_eq!(v.provisional(), Some(&pid("c")));
    v.handle_disconnected(at(32));
    v.handle_connected(at(33), Token::new("jt"));
    assert_eq!(v.provisional(), Some(&pid("c")));
    // The welcome ends it.
    let snap = snapshot(assignment(2, 2, Some("a")), vec![member("a", 1)], None);
    let (_, ev) = server(&mut v, 34, welcome("c", snap, vec![]));
    assert_eq!(v.provisional(), None);
    assert!(
        ev.contains(&Event::Provisional { coordinator: None }),
        "{ev:?}"
    );
}

#[test]
fn a_peer_seen_twice_or_lost_unseen_changes_nothing() {
    let mut v = live("c", "a", 2);
    v.handle_disconnected(at(20));
    v.handle_peer_lost(at(21), &pid("b"));
    assert_eq!(v.provisional(), Some(&pid("c")));
    v.handle_peer_seen(at(22), pid("b"));
    v.handle_peer_seen(at(23), pid("b"));
    assert_eq!(v.provisional(), Some(&pid("b")));
    // One loss undoes both sightings: reachability is a set, not a count.
    v.handle_peer_lost(at(24), &pid("b"));
    assert_eq!(v.provisional(), Some(&pid("c")));
}

#[test]
fn provisional_follows_a_relayed_newer_assignment() {
    let mut v = live("c", "a", 2);
    v.handle_peer_seen(at(15), pid("a"));
    v.handle_peer_seen(at(15), pid("b"));
    v.handle_disconnected(at(20));
    assert_eq!(v.provisional(), Some(&pid("a")));
    v.handle_peer_assignment(at(21), assignment(3, 3, Some("b")).into());
    assert_eq!(v.provisional(), Some(&pid("b")));
}

// ----- commands -----------------------------------------------------------------------------

#[test]
fn host_command_gating_reports_typed_errors() {
    let mut v = live("b", "a", 2);
    assert_eq!(host_command(&mut v, 20), Err(CommandError::NotHost));
    assert_eq!(
        v.command(at(20), action("nope"), js(json!(null)), None),
        Err(CommandError::UnknownAction)
    );
    // Named host, lease confirmed, but no token for this epoch.
    let mut v = live("a", "a", 2);
    server(
        &mut v,
        50,
        ServerMsg::LeaseProbe {
            nonce: 1,
            epoch: Epoch(2),
        },
    );
    let (mut w, _) = welcomed_as_host();
    assert_eq!(host_command(&mut w, 2), Err(CommandError::NoCapability));
    // A token for an older epoch does not count.
    w.handle_server(at(3), host_cap(1));
    assert_eq!(host_command(&mut w, 4), Err(CommandError::NoCapability));
    w.handle_server(at(5), host_cap(2));
    assert!(host_command(&mut w, 6).is_ok());
    // A token that does not grant the action.
    let cap = ServerMsg::Capability {
        role: Role::Host,
        token: Token::new("t"),
        epoch: Some(Epoch(2)),
        actions: vec![action("poll.close")],
        expires_in_ms: 3000,
    };
    w.handle_server(at(7), cap);
    assert_eq!(host_command(&mut w, 8), Err(CommandError::NoCapability));
    drop(v);
}

/// A view whose welcome (at t=1) names it host of epoch 2 with 3 s of lease left, before any
/// token came; with the welcome's events.
fn welcomed_as_host() -> (HostView, Vec<Event>) {
    let mut w = HostView::new(config());
    w.handle_connected(at(0), Token::new("jt"));
    let snap = snapshot(
        assignment(2, 2, Some("a")),
        vec![member("a", 1)],
        Some(3000),
    );
    w.handle_server(at(1), welcome("a", snap, vec![]));
    let (_, ev) = drain(&mut w);
    (w, ev)
}

/// A host whose lease comes before its capability (a welcome naming it with the lease's time
/// left: a resume after the role came back to its session) is told when it may act: the
/// capability's arrival is a `Lease` event. Nothing said so, and `lease: held` had been
/// announced while host commands were refused `NoCapability`.
#[test]
fn the_capability_that_lets_a_held_lease_act_is_announced() {
    let (mut w, ev) = welcomed_as_host();
    assert!(matches!(w.lease(), LeaseState::Held { .. }));
    assert!(ev.contains(&Event::Lease(w.lease())), "{ev:?}");
    assert!(!w.has_authority(at(1)));
    w.handle_server(at(3), host_cap(1));
    assert_eq!(drain(&mut w).1, vec![], "another epoch's token");
    w.handle_server(at(5), host_cap(2));
    assert!(w.has_authority(at(5)));
    assert_eq!(drain(&mut w).1, vec![Event::Lease(w.lease())]);
    // A refreshed token changes nothing the app sees.
    w.handle_server(at(7), host_cap(2));
    assert_eq!(drain(&mut w).1, vec![]);
}

#[test]
fn host_commands_carry_the_token_epoch_and_a_fresh_key() {
    let mut v = live("a", "a", 2);
    let k1 = host_command(&mut v, 20).unwrap();
    let k2 = host_command(&mut v, 21).unwrap();
    assert_ne!(k1, k2);
    let (t, _) = drain(&mut v);
    match &t[0] {
        ClientMsg::Command {
            id,
            epoch,
            capability,
            ..
        } => {
            assert_eq!(id, &k1);
            assert_eq!(*epoch, Some(Epoch(2)));
            assert_eq!(capability.expose(), "host-token-2");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn participant_commands_made_offline_are_queued_and_sent_after_resync_host_commands_never() {
    let mut v = live("a", "a", 2);
    v.handle_disconnected(at(20));
    drain(&mut v);
    let key = v
        .command(at(21), action("vote"), js(json!({"o": 1})), None)
        .unwrap();
    assert_eq!(
        host_command(&mut v, 21),
        Err(CommandError::NotAuthoritative)
    );
    let (t, ev) = drain(&mut v);
    assert!(t.is_empty());
    assert!(ev.contains(&Event::CommandQueued { id: key.clone() }));
    assert_eq!(v.pending().filter(|(_, _, q)| *q).count(), 1);
    v.handle_connected(at(30), Token::new("jt"));
    drain(&mut v);
    let snap = snapshot(assignment(3, 3, Some("b")), vec![], None);
    v.handle_server(at(31), welcome("a", snap, vec![]));
    let (t, _) = drain(&mut v);
    assert!(t.is_empty(), "no participant token yet: {t:?}");
    v.handle_server(at(31), participant_cap());
    let (t, _) = drain(&mut v);
    assert!(matches!(&t[..], [ClientMsg::Command { id, epoch: None, .. }] if id == &key));
    let (_, ev) = server(
        &mut v,
        32,
        ServerMsg::CommandResult {
            id: key.clone(),
            outcome: Outcome::Accepted { seq: Seq(4) },
        },
    );
    assert!(ev.contains(&Event::CommandAccepted {
        id: key,
        seq: Seq(4)
    }));
    assert_eq!(v.pending().count(), 0);
}

/// A vote whose outcome a dropped connection hid is sent again after the next welcome, which
/// needs a participant token: when none follows the welcome, the view resyncs after a command
/// timeout, as for a vote made after it (it waited for the server's unprompted token refresh,
/// minutes away, or for ever).
#[test]
fn a_vote_unknown_across_a_reconnect_without_a_participant_token_resyncs() {
    let (mut v, key) = voted();
    v.handle_disconnected(at(21));
    v.handle_connected(at(30), Token::new("jt"));
    drain(&mut v);
    let snap = snapshot(assignment(2, 2, Some("a")), vec![member("a", 1)], None);
    v.handle_server(at(31), welcome("b", snap, vec![]));
    let (t, _) = drain(&mut v);
    assert!(t.is_empty(), "no participant token yet: {t:?}");
    assert_eq!(v.pending().filter(|(_, _, q)| *q).count(), 1);
    v.handle_timeout(at(31 + Config::default().command_timeout_ms));
    let (t, _) = drain(&mut v);
    assert_eq!(t, vec![ClientMsg::Resume { cursor: Seq(2) }]);
    let snap = snapshot(assignment(2, 2, Some("a")), vec![member("a", 1)], None);
    v.handle_server(at(5_400), welcome("b", snap, vec![]));
    v.handle_server(at(5_400), participant_cap());
    let (t, _) = drain(&mut v);
    assert!(
        t.iter()
            .any(|m| matches!(m, ClientMsg::Command { id, .. } if *id == key)),
        "{t:?}"
    );
}

/// After a resync, commands go in the order they were made: a vote whose resend fell due during
/// the resync before one made meanwhile (it went after it: a changed vote could land before the
/// one it changed, and the room kept the first). Across a reconnect too. Each names the one it
/// was sent behind (`after`), so the server holds it should that one be refused to retry.
#[test]
fn commands_go_again_in_the_order_they_were_made() {
    let (mut v, first) = voted();
    v.handle_wake(at(30));
    v.handle_timeout(at(10_000));
    let second = v
        .command(at(10_001), action("vote"), js(json!(2)), None)
        .unwrap();
    let (t, _) = drain(&mut v);
    assert!(
        !t.iter().any(|m| matches!(m, ClientMsg::Command { .. })),
        "{t:?}"
    );
    let snap = snapshot(assignment(2, 2, Some("a")), vec![member("a", 1)], None);
    let (t, _) = server(&mut v, 10_002, welcome("b", snap.clone(), vec![]));
    assert_eq!(
        sent_after(&t),
        [(first.clone(), None), (second.clone(), Some(first.clone()))]
    );
    v.handle_disconnected(at(10_003));
    let third = v
        .command(at(10_004), action("vote"), js(json!(3)), None)
        .unwrap();
    v.handle_connected(at(10_005), Token::new("jt"));
    drain(&mut v);
    v.handle_server(at(10_006), welcome("b", snap, vec![]));
    v.handle_server(at(10_006), participant_cap());
    let (t, _) = drain(&mut v);
    chained_then_accepted(&mut v, &t, &[first, second, third], 10_007);
}

/// `t` sends the commands `ids` in that order, each naming the one before it (`after`); each is
/// then accepted with nothing more sent, and nothing is left pending.
fn chained_then_accepted(v: &mut HostView, t: &[ClientMsg], ids: &[IdempotencyKey], ms: u64) {
    let chain: Vec<_> = ids
        .iter()
        .enumerate()
        .map(|(k, id)| (id.clone(), k.checked_sub(1).map(|p| ids[p].clone())))
        .collect();
    assert_eq!(sent_after(t), chain);
    for id in ids {
        let (t, _) = server(v, ms, accepted(id.clone()));
        assert_eq!(sent(&t), []);
    }
    assert_eq!(v.pending().count(), 0);
}

/// A participant's view, live, with two votes made at once (both sent, the second after the
/// first).
fn two_votes() -> (HostView, IdempotencyKey, IdempotencyKey) {
    let mut v = live("b", "a", 2);
    let first = v
        .command(at(20), action("vote"), js(json!(1)), None)
        .unwrap();
    let second = v
        .command(at(20), action("vote"), js(json!(2)), None)
        .unwrap();
    (v, first, second)
}

/// `id`'s result: accepted (as seq 2, an item the view has).
fn accepted(id: IdempotencyKey) -> ServerMsg {
    ServerMsg::CommandResult {
        id,
        outcome: Outcome::Accepted { seq: Seq(2) },
    }
}

/// The keys of the commands in `t`, in the order they go, each with the key it names as the
/// one it was sent behind.
fn sent_after(t: &[ClientMsg]) -> Vec<(IdempotencyKey, Option<IdempotencyKey>)> {
    t.iter()
        .filter_map(|m| match m {
            ClientMsg::Command { id, after, .. } => Some((id.clone(), after.clone())),
            _ => None,
        })
        .collect()
}

/// The keys of the commands in `t`, in the order they go.
fn sent(t: &[ClientMsg]) -> Vec<IdempotencyKey> {
    t.iter()
        .filter_map(|m| match m {
            ClientMsg::Command { id, .. } => Some(id.clone()),
            _ => None,
        })
        .collect()
}

/// A participant command refused with a retry time keeps it across a reconnect: it goes again
/// at that time, not at the welcome (where it was refused again and spent an attempt), and one
/// made meanwhile waits behind it.
#[test]
fn a_retry_time_outlasts_a_reconnect() {
    let mut v = live("b", "a", 2);
    let vote = v
        .command(at(20), action("vote"), js(json!(1)), None)
        .unwrap();
    drain(&mut v);
    server(
        &mut v,
        30,
        ServerMsg::CommandResult {
            id: vote.clone(),
            outcome: Outcome::Rejected {
                code: RejectCode::RateLimited,
                current: None,
                retry_after_ms: Some(30_000),
            },
        },
    );
    v.handle_disconnected(at(100));
    v.handle_connected(at(200), Token::new("join-token"));
    let snap = snapshot(assignment(2, 2, Some("a")), vec![member("a", 1)], None);
    server(&mut v, 300, welcome("b", snap, vec![]));
    let (t, _) = server(&mut v, 300, participant_cap());
    assert_eq!(sent(&t), []);
    let later = v
        .command(at(400), action("vote"), js(json!(2)), None)
        .unwrap();
    assert_eq!(sent(&drain(&mut v).0), []);
    // Not before the retry time (30 s after the refusal), then at the next timeout due.
    v.handle_timeout(at(30_029));
    assert_eq!(sent(&drain(&mut v).0), []);
    let due = v.poll_timeout().expect("the retry time");
    v.handle_timeout(due);
    assert_eq!(
        sent_after(&drain(&mut v).0),
        [(vote.clone(), None), (later, Some(vote))]
    );
}

/// A host command refused with a retry time on every attempt, waiting to go again, certainly
/// was not applied: when the connection drops it fails `NotAuthoritative`, not `Interrupted`
/// (outcome unknown), as after one refusal. (Its answers come in order on its one connection.)
#[test]
fn a_host_command_refused_on_every_attempt_fails_with_a_definite_error() {
    let limited = || Outcome::Rejected {
        code: RejectCode::RateLimited,
        current: None,
        retry_after_ms: Some(100),
    };
    for refusals in [1, 2] {
        let mut v = live("a", "a", 2);
        confirm_lease(&mut v, 2, 100, 110, 3000);
        let open = host_command(&mut v, 120).unwrap();
        let mut t = 130;
        for _ in 0..refusals {
            let (tx, _) = drain(&mut v);
            assert_eq!(sent(&tx), std::slice::from_ref(&open));
            server(
                &mut v,
                t,
                ServerMsg::CommandResult {
                    id: open.clone(),
                    outcome: limited(),
                },
            );
            t += 1_000;
            v.handle_timeout(at(t));
        }
        // Refused again, and the connection drops while it waits.
        server(
            &mut v,
            t + 1,
            ServerMsg::CommandResult {
                id: open.clone(),
                outcome: limited(),
            },
        );
        v.handle_disconnected(at(t + 2));
        let (_, ev) = drain(&mut v);
        assert!(
            ev.contains(&Event::CommandFailed {
                id: open.clone(),
                error: CommandError::NotAuthoritative
            }),
            "{refusals}: {ev:?}"
        );
    }
}

/// A host command held behind others (`PIPELINE` of its kind out) stays held through a resync,
/// whatever else is made meanwhile, and goes after the welcome. A participant command made
/// during the resync sent the held ones on the spot, and the host command failed
/// `NotAuthoritative` though made with authority.
#[test]
fn a_held_host_command_waits_out_a_resync_whatever_is_made_meanwhile() {
    let mut v = live("a", "a", 2);
    confirm_lease(&mut v, 2, 100, 110, 3000);
    let out: Vec<_> = (0..PIPELINE)
        .map(|_| host_command(&mut v, 120).unwrap())
        .collect();
    let open = out[0].clone();
    let close = host_command(&mut v, 121).unwrap();
    let (t, _) = drain(&mut v);
    assert_eq!(sent(&t), out);
    // A gap: the view resyncs; the first command's answer comes meanwhile.
    let (t, _) = server(&mut v, 130, ServerMsg::Event(event(4, 2, "b")));
    assert_eq!(t, vec![ClientMsg::Resume { cursor: Seq(2) }]);
    server(&mut v, 140, accepted(open));
    v.command(at(150), action("vote"), js(json!(1)), None)
        .unwrap();
    let (t, ev) = drain(&mut v);
    assert_eq!(sent(&t), []);
    assert!(
        !ev.iter().any(|e| matches!(e, Event::CommandFailed { .. })),
        "{ev:?}"
    );
    // The welcome: the held host command goes, then the vote.
    let snap = snapshot(
        assignment(2, 4, Some("a")),
        vec![member("a", 1)],
        Some(3000),
    );
    let missed = vec![Item::Event(event(3, 2, "b")), Item::Event(event(4, 2, "b"))];
    let (t, ev) = server(&mut v, 200, welcome("a", snap, missed));
    assert!(
        !ev.iter().any(|e| matches!(e, Event::CommandFailed { .. })),
        "{ev:?}"
    );
    assert_eq!(sent(&t).first(), Some(&close));
}

/// A refusal with a retry time does not reorder commands (before: one made meanwhile went at
/// once, and resends due together went newest first; a changed vote refused with the one it
/// changed then landed before it, and the room kept the first, both promises resolved).
/// Commands of a kind are pipelined, each naming the one it went behind (`after`); one refused
/// behind an older one waiting to go again (the server held it) goes again right behind that
/// one, and a resign waits for the host commands made before it.
#[test]
fn a_command_refused_with_a_retry_time_keeps_its_place_in_the_order() {
    let unavailable = |ms| Outcome::Rejected {
        code: RejectCode::Unavailable,
        current: None,
        retry_after_ms: Some(ms),
    };
    let refused = |id: &IdempotencyKey, ms| ServerMsg::CommandResult {
        id: id.clone(),
        outcome: unavailable(ms),
    };
    let (mut v, first, second) = two_votes();
    let (t, _) = drain(&mut v);
    assert_eq!(
        sent_after(&t),
        [(first.clone(), None), (second.clone(), Some(first.clone()))]
    );
    // The first refused with a retry time, the second held behind it by the server: nothing
    // goes until the first goes again, then the second right behind it.
    let (t, _) = server(&mut v, 21, refused(&first, 500));
    assert_eq!(sent(&t), []);
    let (t, _) = server(&mut v, 22, refused(&second, 0));
    assert_eq!(sent(&t), [], "the second waits for the first to go again");
    let queued: Vec<_> = v.pending().filter(|c| c.2).map(|c| c.0.clone()).collect();
    assert_eq!(queued, std::slice::from_ref(&second));
    let third = v
        .command(at(23), action("vote"), js(json!(3)), None)
        .unwrap();
    assert_eq!(
        sent(&drain(&mut v).0),
        [],
        "made behind a refused one: it waits"
    );
    v.handle_timeout(at(1_000));
    let (t, _) = drain(&mut v);
    chained_then_accepted(&mut v, &t, &[first, second, third], 1_001);

    // Host commands wait for host commands only, and those made before a resign are decided
    // before it goes: the host stops acting as the resign goes.
    let mut v = live("a", "a", 2);
    let vote = v
        .command(at(20), action("vote"), js(json!(1)), None)
        .unwrap();
    let open = host_command(&mut v, 20).unwrap();
    let close = v
        .command(at(20), action("poll.close"), js(json!(null)), None)
        .unwrap();
    let resign = v.resign(at(20)).unwrap();
    let (t, _) = drain(&mut v);
    assert_eq!(sent(&t), [vote, open.clone(), close.clone()]);
    assert!(
        matches!(v.lease(), LeaseState::Held { .. }),
        "{:?}",
        v.lease()
    );
    server(&mut v, 21, refused(&open, 500));
    server(&mut v, 21, refused(&close, 0));
    v.handle_timeout(at(1_000));
    let (t, _) = drain(&mut v);
    assert_eq!(sent(&t), [open.clone(), close.clone()]);
    let (t, _) = server(&mut v, 1_001, accepted(open));
    assert_eq!(
        sent(&t),
        [],
        "the resign waits for every host command before it"
    );
    let (t, _) = server(&mut v, 1_002, accepted(close));
    assert_eq!(sent(&t), [resign]);
    assert_eq!(v.lease(), LeaseState::Relinquished);
}

/// A command held behind one refused with a retry time (answered `retry_after_ms: 0`) spends no
/// attempt on it: when the first runs out of attempts and fails, the second goes on its own
/// (naming nothing) and is applied. Counted, its attempts ran out with the first's, and it failed
/// `Timeout` though never looked at by the server. And it goes again right behind the first,
/// even when that one is out again before the hold is answered.
#[test]
fn a_command_held_behind_a_refused_one_spends_no_attempt() {
    let (mut v, first, second) = two_votes();
    let mut now = 20;
    let mut events = Vec::new();
    for _ in 0..Config::default().max_attempts {
        let (t, ev) = drain(&mut v);
        events.extend(ev);
        assert_eq!(sent(&t), [first.clone(), second.clone()]);
        for (id, ms) in [(&first, 100), (&second, 0)] {
            now += 1;
            let (_, ev) = server(
                &mut v,
                now,
                ServerMsg::CommandResult {
                    id: id.clone(),
                    outcome: Outcome::Rejected {
                        code: RejectCode::RateLimited,
                        current: None,
                        retry_after_ms: Some(ms),
                    },
                },
            );
            events.extend(ev);
        }
        match v.poll_timeout() {
            Some(due) => {
                now = due.ms_since(at(0));
                v.handle_timeout(due);
            }
            None => break,
        }
    }
    let (t, ev) = drain(&mut v);
    events.extend(ev);
    assert!(
        events.contains(&Event::CommandFailed {
            id: first.clone(),
            error: CommandError::Timeout
        }),
        "{events:?}"
    );
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, Event::CommandFailed { id, .. } if *id == second)),
        "{events:?}"
    );
    assert_eq!(sent_after(&t), [(second.clone(), None)]);
    server(&mut v, now + 1, accepted(second));
    assert_eq!(v.pending().count(), 0);

    // The first refused at once (at its arrival), and out again before the second's hold is
    // answered (after the store's commit): the second goes again at once, right behind it.
    let (mut v, first, second) = two_votes();
    drain(&mut v);
    server(
        &mut v,
        21,
        ServerMsg::CommandResult {
            id: first.clone(),
            outcome: Outcome::Rejected {
                code: RejectCode::RateLimited,
                current: None,
                retry_after_ms: Some(1),
            },
        },
    );
    let due = v.poll_timeout().expect("the first's retry");
    v.handle_timeout(due);
    assert_eq!(sent(&drain(&mut v).0), std::slice::from_ref(&first));
    let (t, _) = server(
        &mut v,
        due.ms_since(at(0)) + 1,
        ServerMsg::CommandResult {
            id: second.clone(),
            outcome: Outcome::Rejected {
                code: RejectCode::Unavailable,
                current: None,
                retry_after_ms: Some(0),
            },
        },
    );
    assert_eq!(sent_after(&t), [(second.clone(), Some(first.clone()))]);
    // The first refused again, the second held again: nothing goes until the first does.
    let now = due.ms_since(at(0)) + 2;
    for (id, code, ms) in [
        (&first, RejectCode::RateLimited, 500),
        (&second, RejectCode::Unavailable, 0),
    ] {
        let (t, _) = server(
            &mut v,
            now,
            ServerMsg::CommandResult {
                id: id.clone(),
                outcome: Outcome::Rejected {
                    code,
                    current: None,
                    retry_after_ms: Some(ms),
                },
            },
        );
        assert_eq!(sent(&t), []);
    }
    let due = v.poll_timeout().expect("the first's retry");
    v.handle_timeout(due);
    assert_eq!(
        sent_after(&drain(&mut v).0),
        [(first.clone(), None), (second, Some(first))]
    );
}

/// The browser SDK starts without an action table: what an app commands before the first
/// snapshot waits, and is classified when the server's table comes.
#[test]
fn commands_made_before_the_first_snapshot_are_classified_when_the_table_comes() {
    let mut v = HostView::new(Config::default());
    v.handle_connected(at(0), Token::new("join-token"));
    drain(&mut v);
    let vote = v
        .command(at(1), action("vote"), js(json!({"o": 1})), None)
        .unwrap();
    let poll = host_command(&mut v, 1).unwrap();
    let nope = v
        .command(at(1), action("nope"), js(json!(null)), None)
        .unwrap();
    let (t, ev) = drain(&mut v);
    assert!(
        t.iter().all(|m| !matches!(m, ClientMsg::Command { .. })),
        "{t:?}"
    );
    for id in [&vote, &poll, &nope] {
        assert!(ev.contains(&Event::CommandQueued { id: id.clone() }));
    }
    assert_eq!(v.pending().filter(|(_, _, q)| *q).count(), 3);

    // The first member is named host by the snapshot: a host command made before it still had
    // no authority and is refused, never sent.
    let snap = snapshot(
        assignment(1, 1, Some("a")),
        vec![member("a", 1)],
        Some(3000),
    );
    v.handle_server(at(5), welcome("a", snap, vec![]));
    v.handle_server(at(5), participant_cap());
    v.handle_server(at(5), host_cap(1));
    let (t, ev) = drain(&mut v);
    let sent: Vec<_> = t
        .iter()
        .filter_map(|m| match m {
            ClientMsg::Command { id, action, .. } => Some((id, action.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(sent, [(&vote, "vote")]);
    assert!(ev.contains(&Event::CommandFailed {
        id: poll,
        error: CommandError::NotAuthoritative
    }));
    assert!(ev.contains(&Event::CommandFailed {
        id: nope,
        error: CommandError::UnknownAction
    }));
    assert_eq!(v.pending().count(), 1);
    // From now on the table answers at once.
    assert_eq!(
        v.command(at(6), action("nope"), js(json!(null)), None),
        Err(CommandError::UnknownAction)
    );
}

/// Put out of the room by the server, or told its protocol version is no longer taken, the view
/// closes instead of joining again (which would undo a kick, or knock on a closed room, or with
/// the same old version, forever); other error frames leave it as it is.
#[test]
fn kicked_room_closed_or_unsupported_version_closes_the_view() {
    for code in [
        ErrorCode::Kicked,
        ErrorCode::RoomClosed,
        ErrorCode::UnsupportedVersion,
    ] {
        let mut v = live("b", "a", 2);
        let key = v
            .command(at(20), action("vote"), js(json!(1)), None)
            .unwrap();
        drain(&mut v);
        let error = ServerMsg::Error {
            code,
            message: "out".into(),
        };
        let (_, ev) = server(&mut v, 21, error);
        assert_eq!(v.phase(), Phase::Closed, "{code:?}");
        assert!(ev.contains(&Event::ServerError(code, "out".into())));
        // Sent and not answered: it may have been applied before the close.
        assert!(ev.contains(&Event::CommandFailed {
            id: key,
            error: CommandError::Interrupted
        }));
        let (t, ev) = server(&mut v, 22, assign(3, 3, Some("b")));
        assert!(t.is_empty() && ev.is_empty(), "{t:?} {ev:?}");
    }
    let mut v = live("b", "a", 2);
    let limited = ServerMsg::Error {
        code: ErrorCode::RateLimited,
        message: "slow down".into(),
    };
    server(&mut v, 21, limited);
    assert_eq!(v.phase(), Phase::Live);
}

/// A command refused while it is being made is the call's error, never a later event: the
/// caller has no key to match an event with yet.
#[test]
fn a_command_refused_at_once_is_the_calls_error_not_an_event() {
    let mut v = live("b", "a", 2);
    let no_votes = ServerMsg::Capability {
        role: Role::Participant,
        token: Token::new("participant-token-2"),
        epoch: None,
        actions: vec![],
        expires_in_ms: 600_000,
    };
    server(&mut v, 20, no_votes);
    assert_eq!(
        v.command(at(21), action("vote"), js(json!(1)), None),
        Err(CommandError::NoCapability)
    );
    let (t, ev) = drain(&mut v);
    assert!(t.is_empty(), "{t:?}");
    assert!(
        !ev.iter().any(|e| matches!(e, Event::CommandFailed { .. })),
        "{ev:?}"
    );
    assert_eq!(v.pending().count(), 0);
}

fn result(v: &mut HostView, ms: u64, id: &IdempotencyKey, outcome: Outcome) -> Vec<Event> {
    let (_, ev) = server(
        v,
        ms,
        ServerMsg::CommandResult {
            id: id.clone(),
            outcome,
        },
    );
    ev
}

/// A live participant's vote, made at 20 ms and sent.
fn voted() -> (HostView, IdempotencyKey) {
    let mut v = live("b", "a", 2);
    let key = v
        .command(at(20), action("vote"), js(json!(1)), None)
        .unwrap();
    drain(&mut v);
    (v, key)
}

/// [`voted`], then sent once more (no answer came in time): two attempts out, and the time (ms)
/// of the second.
fn resent_once() -> (HostView, IdempotencyKey, u64) {
    let (mut v, key) = voted();
    loop {
        let due = v.poll_timeout().expect("a deadline");
        v.handle_timeout(due);
        let (t, _) = drain(&mut v);
        let sent = t
            .iter()
            .filter(|m| matches!(m, ClientMsg::Command { .. }))
            .count();
        if sent > 0 {
            assert_eq!(sent, 1);
            return (v, key, due.ms_since(at(0)));
        }
    }
}

/// The server's refusal `rate_limited`, to retry in `ms`.
fn rate_limited(ms: u64) -> Outcome {
    Outcome::Rejected {
        code: RejectCode::RateLimited,
        current: None,
        retry_after_ms: Some(ms),
    }
}

/// A live participant's vote (made at 20 ms), unanswered and sent again by `ms`.
fn vote_resent(ms: u64) -> (HostView, IdempotencyKey) {
    let (mut v, key) = voted();
    v.handle_timeout(at(ms));
    let (t, _) = drain(&mut v);
    assert!(
        t.iter()
            .any(|m| matches!(m, ClientMsg::Command { id, .. } if *id == key)),
        "{t:?}"
    );
    (v, key)
}

fn rejected(code: RejectCode) -> Outcome {
    Outcome::Rejected {
        code,
        current: None,
        retry_after_ms: Some(1000),
    }
}

#[test]
fn a_host_command_sent_is_decided_by_its_result_not_by_the_next_epoch() {
    // A resign's own assignment comes before its result (the server answers after the item it
    // committed): the resign is accepted, not failed, and nothing is resynced.
    let mut v = live("a", "a", 2);
    let key = v.resign(at(20)).unwrap();
    drain(&mut v);
    let (_, ev) = server(&mut v, 21, assign(3, 3, Some("b")));
    assert!(
        !ev.iter().any(|e| matches!(e, Event::CommandFailed { .. })),
        "{ev:?}"
    );
    let ev = result(&mut v, 22, &key, Outcome::Accepted { seq: Seq(3) });
    assert!(
        ev.contains(&Event::CommandAccepted {
            id: key,
            seq: Seq(3)
        }),
        "{ev:?}"
    );
    assert!(v.poll_transmit().is_none());
    // One the server refuses fails with its code; one never answered is not resent with a dead
    // token: its timer fails it, outcome unknown (it may have been committed before the epoch).
    let stale = |id: &IdempotencyKey| Event::CommandFailed {
        id: id.clone(),
        error: CommandError::StaleEpoch,
    };
    let mut v = live("a", "a", 2);
    let refused = host_command(&mut v, 20).unwrap();
    drain(&mut v);
    server(&mut v, 21, assign(3, 3, Some("b")));
    let ev = result(&mut v, 22, &refused, rejected(RejectCode::StaleEpoch));
    assert!(ev.contains(&stale(&refused)), "{ev:?}");
    let mut v = live("a", "a", 2);
    let unanswered = host_command(&mut v, 20).unwrap();
    drain(&mut v);
    let (_, ev) = server(&mut v, 21, assign(3, 3, Some("b")));
    assert!(!ev.contains(&stale(&unanswered)), "{ev:?}");
    v.handle_timeout(at(60_000));
    let (t, ev) = drain(&mut v);
    assert!(t.is_empty(), "{t:?}");
    let interrupted = |id: &IdempotencyKey| Event::CommandFailed {
        id: id.clone(),
        error: CommandError::Interrupted,
    };
    assert_eq!(ev, vec![interrupted(&unanswered)]);
    // Sent, then the connection dropped: outcome unknown, and said at once (its promise waited
    // on the outage, for a welcome that can only fail it: it brings no host token before the
    // resend is checked). Nothing more when the welcome brings a new epoch.
    let mut v = live("a", "a", 2);
    let cut = host_command(&mut v, 20).unwrap();
    drain(&mut v);
    v.handle_disconnected(at(21));
    let (_, ev) = drain(&mut v);
    assert!(ev.contains(&interrupted(&cut)), "{ev:?}");
    assert_eq!(v.pending().count(), 0);
    v.handle_connected(at(22), Token::new("join-token"));
    drain(&mut v);
    let snap = snapshot(assignment(3, 3, Some("b")), vec![member("b", 2)], None);
    let (t, ev) = server(&mut v, 23, welcome("a", snap, vec![]));
    assert!(!ev.contains(&stale(&cut)), "{ev:?}");
    assert!(
        !t.iter()
            .any(|m| matches!(m, ClientMsg::Command { id, .. } if *id == cut)),
        "{t:?}"
    );
    // One whose only attempt was refused, waiting to go again, was certainly not applied: not
    // authoritative now, rather than "outcome unknown".
    let mut v = live("a", "a", 2);
    let waiting = host_command(&mut v, 20).unwrap();
    drain(&mut v);
    result(&mut v, 21, &waiting, rejected(RejectCode::RateLimited));
    v.handle_disconnected(at(22));
    let (_, ev) = drain(&mut v);
    let refused = Event::CommandFailed {
        id: waiting.clone(),
        error: CommandError::NotAuthoritative,
    };
    assert!(ev.contains(&refused), "{ev:?}");
    // One whose resend came due during a resync (outcome unknown, kept for the resync's
    // welcome) fails at once too when the connection then drops.
    let mut v = live("a", "a", 2);
    let resyncing = host_command(&mut v, 20).unwrap();
    v.handle_wake(at(30));
    drain(&mut v);
    v.handle_timeout(at(10_000));
    let (_, ev) = drain(&mut v);
    assert!(!ev.contains(&interrupted(&resyncing)), "{ev:?}");
    assert_eq!(v.pending().count(), 1);
    v.handle_disconnected(at(10_001));
    let (_, ev) = drain(&mut v);
    assert!(ev.contains(&interrupted(&resyncing)), "{ev:?}");
    assert_eq!(v.pending().count(), 0);
    // One waiting to be sent again (rejected as retryable) dies with its epoch at once.
    let mut v = live("a", "a", 2);
    let key = host_command(&mut v, 20).unwrap();
    drain(&mut v);
    result(&mut v, 21, &key, rejected(RejectCode::RateLimited));
    let (_, ev) = server(&mut v, 22, assign(3, 3, Some("b")));
    assert!(ev.contains(&stale(&key)), "{ev:?}");
    v.handle_timeout(at(60_000));
    assert!(v.poll_transmit().is_none());
    // So does one whose retryable refusal brings the new epoch itself (`unavailable` carries
    // the room's assignment): it was kept as in flight while adopting it, then resent after
    // its backoff into an epoch that is over and failed `Interrupted`.
    let mut v = live("a", "a", 2);
    let key = host_command(&mut v, 20).unwrap();
    drain(&mut v);
    let outcome = Outcome::Rejected {
        code: RejectCode::Unavailable,
        current: Some(assignment(3, 3, Some("b")).into()),
        retry_after_ms: Some(500),
    };
    let ev = result(&mut v, 21, &key, outcome);
    assert!(ev.contains(&stale(&key)), "{ev:?}");
    assert_eq!(v.pending().count(), 0);
    // A definite answer to a resend decides it, newer epoch or not: refused `rate_limited`,
    // resent, then `stale_epoch` with the room's assignment (the store looks the key up first:
    // no attempt was applied) is `StaleEpoch`, not `Interrupted`.
    let mut v = live("a", "a", 2);
    let key = host_command(&mut v, 20).unwrap();
    drain(&mut v);
    result(&mut v, 21, &key, rejected(RejectCode::RateLimited));
    v.handle_timeout(at(1_100));
    let (t, _) = drain(&mut v);
    assert!(
        t.iter()
            .any(|m| matches!(m, ClientMsg::Command { id, .. } if *id == key)),
        "resent: {t:?}"
    );
    let outcome = Outcome::Rejected {
        code: RejectCode::StaleEpoch,
        current: Some(assignment(3, 3, Some("b")).into()),
        retry_after_ms: None,
    };
    let ev = result(&mut v, 1_101, &key, outcome);
    assert!(ev.contains(&stale(&key)), "{ev:?}");
}

/// A host command held behind one refused `stale_epoch` (the server holds what was sent after a
/// refusal) was never looked at: it fails `StaleEpoch` at once. It failed `Interrupted` (outcome
/// unknown) when sent again into the new epoch after the refusal's resync.
#[test]
fn a_host_command_held_behind_a_stale_one_fails_stale_epoch() {
    let mut v = live("a", "a", 2);
    confirm_lease(&mut v, 2, 100, 110, 3000);
    let first = host_command(&mut v, 120).unwrap();
    let second = host_command(&mut v, 120).unwrap();
    assert_eq!(sent(&drain(&mut v).0), [first.clone(), second.clone()]);
    let outcome = Outcome::Rejected {
        code: RejectCode::StaleEpoch,
        current: Some(assignment(3, 3, Some("b")).into()),
        retry_after_ms: None,
    };
    let mut ev = result(&mut v, 130, &first, outcome);
    let held = Outcome::Rejected {
        code: RejectCode::Unavailable,
        current: None,
        retry_after_ms: Some(0),
    };
    ev.extend(result(&mut v, 131, &second, held));
    for id in [first, second] {
        let failed = Event::CommandFailed {
            id,
            error: CommandError::StaleEpoch,
        };
        assert!(ev.contains(&failed), "{ev:?}");
    }
    assert_eq!(v.pending().count(), 0);
}

#[test]
fn a_stale_epoch_rejection_adopts_the_current_assignment_and_resyncs() {
    let mut v = live("a", "a", 2);
    let key = host_command(&mut v, 20).unwrap();
    drain(&mut v);
    let outcome = Outcome::Rejected {
        code: RejectCode::StaleEpoch,
        current: Some(assignment(4, 5, Some("c")).into()),
        retry_after_ms: None,
    };
    let (t, ev) = server(
        &mut v,
        21,
        ServerMsg::CommandResult {
            id: key.clone(),
            outcome,
        },
    );
    assert!(ev.contains(&Event::CommandFailed {
        id: key,
        error: CommandError::StaleEpoch
    }));
    assert_eq!(v.epoch(), Some(Epoch(4)));
    assert!(!v.has_authority(at(22)));
    assert_eq!(t, vec![ClientMsg::Resume { cursor: Seq(2) }]);
    assert_eq!(v.phase(), Phase::Resyncing);
}

#[test]
fn unanswered_commands_are_resent_with_the_same_key_then_time_out() {
    let mut v = HostView::new(Config {
        max_attempts: 3,
        ..config()
    });
    v.handle_connected(at(0), Token::new("jt"));
    v.handle_server(
        at(1),
        welcome(
            "b",
            snapshot(assignment(1, 1, Some("a")), vec![], None),
            vec![],
        ),
    );
    v.handle_server(at(1), participant_cap());
    drain(&mut v);
    let key = v
        .command(at(2), action("vote"), js(json!(1)), None)
        .unwrap();
    let mut sent = 0;
    let mut now = 2;
    for _ in 0..10 {
        let (t, ev) = drain(&mut v);
        for m in &t {
            assert!(matches!(m, ClientMsg::Command { id, .. } if id == &key));
            sent += 1;
        }
        if ev.contains(&Event::CommandFailed {
            id: key.clone(),
            error: CommandError::Timeout,
        }) {
            break;
        }
        let Some(next) = v.poll_timeout() else { break };
        now = next.as_millis().max(now);
        v.handle_timeout(at(now));
    }
    assert_eq!(sent, 3);
    assert_eq!(v.pending().count(), 0);
}

#[test]
fn rate_limited_commands_wait_at_least_retry_after() {
    let (mut v, key) = voted();
    let outcome = rate_limited(60_000);
    server(
        &mut v,
        30,
        ServerMsg::CommandResult {
            id: key.clone(),
            outcome,
        },
    );
    // Nothing is sent before the retry time: the timeouts on the way are the connection's
    // silence checks (a heartbeat keeps it from being given up).
    while let Some(t) = v.poll_timeout().filter(|t| *t < at(60_030)) {
        v.handle_timeout(t);
        assert!(drain(&mut v).0.is_empty());
        server(&mut v, t.as_millis(), ServerMsg::Heartbeat);
    }
    v.handle_timeout(at(60_029));
    assert!(drain(&mut v).0.is_empty());
    v.handle_timeout(v.poll_timeout().unwrap());
    let (t, _) = drain(&mut v);
    assert!(matches!(&t[..], [ClientMsg::Command { id, .. }] if id == &key));
}

/// A retry time past a minute fails the command with the refusal's code at once: it waited it
/// out, so that a room's byte budget far behind, or a hostile server's `u64::MAX`, left the
/// app's promise pending for as long.
#[test]
fn a_retry_time_past_a_minute_fails_the_command_now() {
    for wait in [MAX_RETRY_AFTER_MS + 1, u64::MAX] {
        let (mut v, key) = voted();
        let outcome = rate_limited(wait);
        let ev = result(&mut v, 30, &key, outcome);
        assert!(
            ev.iter().any(|e| matches!(e, Event::CommandFailed { id, error: CommandError::Rejected(RejectCode::RateLimited) } if id == &key)),
            "{wait}: {ev:?}"
        );
        assert_eq!(v.pending().count(), 0, "{wait}");
    }
    // The same answer to a resend (the first attempt's answer came too late): that attempt
    // may have been applied, the rate limit being checked before the key is looked up.
    let (mut v, key, ms) = resent_once();
    let ev = result(&mut v, ms + 1, &key, rate_limited(u64::MAX));
    assert!(
        !ev.iter().any(|e| matches!(e, Event::CommandFailed { .. })),
        "{ev:?}"
    );
    let ev = result(&mut v, ms + 2, &key, rate_limited(u64::MAX));
    assert!(
        ev.iter().any(|e| matches!(e, Event::CommandFailed { id, error: CommandError::Interrupted } if id == &key)),
        "{ev:?}"
    );
}

#[test]
fn idempotency_conflict_is_reported() {
    let mut v = live("b", "a", 2);
    let key = IdempotencyKey::new("my-key").unwrap();
    v.command(at(20), action("vote"), js(json!(1)), Some(key.clone()))
        .unwrap();
    assert_eq!(
        v.command(at(21), action("vote"), js(json!(2)), Some(key.clone())),
        Err(CommandError::IdempotencyConflict)
    );
    let outcome = Outcome::Rejected {
        code: RejectCode::IdempotencyConflict,
        current: None,
        retry_after_ms: None,
    };
    let (_, ev) = server(
        &mut v,
        22,
        ServerMsg::CommandResult {
            id: key.clone(),
            outcome,
        },
    );
    assert!(ev.contains(&Event::CommandFailed {
        id: key,
        error: CommandError::IdempotencyConflict
    }));
}

#[test]
fn a_host_command_interrupted_by_a_disconnect_is_not_replayed_in_a_new_session() {
    let mut v = live("a", "a", 2);
    let key = host_command(&mut v, 20).unwrap();
    drain(&mut v);
    v.handle_disconnected(at(21));
    v.handle_connected(at(30), Token::new("jt"));
    // Same epoch still names the old session a-s; this connection is a-s2.
    let msg = ServerMsg::Welcome {
        you: pid("a"),
        session: sid("a-s2"),
        snapshot: snapshot(assignment(2, 2, Some("a")), vec![], None),
        missed: vec![],
        discontinuity: None,
    };
    v.handle_server(at(31), msg);
    let (t, ev) = drain(&mut v);
    assert!(
        !t.iter().any(|m| matches!(m, ClientMsg::Command { .. })),
        "{t:?}"
    );
    assert!(ev.contains(&Event::CommandFailed {
        id: key,
        error: CommandError::Interrupted
    }));
}

/// Leaving fails every pending command: `Closed` if it was never sent (made offline), but
/// `Interrupted` if it was sent and not answered, as the server may have applied it (an app told
/// `Closed` would make it again, under a new key).
#[test]
fn leave_fails_pending_commands_and_closes() {
    let mut v = live("b", "a", 2);
    let sent = v
        .command(at(20), action("vote"), js(json!(1)), None)
        .unwrap();
    v.handle_disconnected(at(20));
    let queued = v
        .command(at(20), action("vote"), js(json!(2)), None)
        .unwrap();
    v.leave(at(21));
    let (_, ev) = drain(&mut v);
    assert!(ev.contains(&Event::CommandFailed {
        id: sent,
        error: CommandError::Interrupted
    }));
    assert!(ev.contains(&Event::CommandFailed {
        id: queued,
        error: CommandError::Closed
    }));
    assert_eq!(v.phase(), Phase::Closed);
    let mut v = live("b", "a", 2);
    let key = v
        .command(at(20), action("vote"), js(json!(1)), None)
        .unwrap();
    v.leave(at(21));
    let (t, ev) = drain(&mut v);
    assert_eq!(t.last(), Some(&ClientMsg::Leave));
    assert!(ev.contains(&Event::CommandFailed {
        id: key,
        error: CommandError::Interrupted
    }));
    // Sent, not answered in time and sent again, the second attempt refused as retryable: the
    // first may still be applied.
    let (mut v, key) = vote_resent(11_000);
    result(&mut v, 11_001, &key, rejected(RejectCode::RateLimited));
    v.leave(at(11_002));
    let (_, ev) = drain(&mut v);
    assert!(
        ev.contains(&Event::CommandFailed {
            id: key,
            error: CommandError::Interrupted
        }),
        "{ev:?}"
    );
    assert_eq!(v.phase(), Phase::Closed);
    assert_eq!(
        v.command(at(22), action("vote"), js(json!(1)), None),
        Err(CommandError::Closed)
    );
}

/// A command resent once (no answer came in time), then the first attempt's refusal: while the
/// resend is out, that refusal decides nothing (the resend may be applied: a token refreshed in
/// between, a transfer's member back); the resend's answer decides. Taken as final, the refusal
/// failed the command, and the resend's acceptance was then dropped as not ours: the app was told
/// an applied command failed.
#[test]
fn the_answer_to_an_earlier_attempt_decides_nothing_while_a_later_one_is_out() {
    let failed = |ev: &[Event]| {
        ev.iter().find_map(|e| match e {
            Event::CommandFailed { error, .. } => Some(*error),
            _ => None,
        })
    };
    // Alone, the refusal fails the command.
    let (mut v, key) = voted();
    let alone = failed(&result(
        &mut v,
        21,
        &key,
        rejected(RejectCode::BadCapability),
    ));
    assert!(alone.is_some());
    for (second, want) in [
        (Outcome::Accepted { seq: Seq(3) }, None),
        (rejected(RejectCode::BadCapability), alone),
    ] {
        let (mut v, key, ms) = resent_once();
        let ev = result(&mut v, ms + 1, &key, rejected(RejectCode::BadCapability));
        assert_eq!(failed(&ev), None, "{ev:?}");
        let accepted = matches!(second, Outcome::Accepted { .. });
        let ev = result(&mut v, ms + 2, &key, second);
        assert_eq!(failed(&ev), want, "{ev:?}");
        assert_eq!(
            ev.contains(&Event::CommandAccepted {
                id: key,
                seq: Seq(3)
            }),
            accepted,
            "{ev:?}"
        );
    }
}

/// Left while the hello was still unanswered: no deadline is left behind (the driver would
/// otherwise wake a closed room every few seconds for ever).
#[test]
fn leaving_before_the_welcome_leaves_no_deadline() {
    let mut v = connected("a");
    assert!(v.poll_timeout().is_some(), "the hello's resync deadline");
    v.leave(at(1));
    drain(&mut v);
    assert_eq!(v.phase(), Phase::Closed);
    assert_eq!(v.poll_timeout(), None);
    v.handle_timeout(at(60_000));
    assert_eq!(drain(&mut v), (vec![], vec![]));
}

#[test]
fn the_command_limit_is_enforced() {
    let mut v = HostView::new(Config {
        command_limit: 2,
        ..config()
    });
    v.command(at(0), action("vote"), js(json!(1)), None)
        .unwrap();
    v.command(at(0), action("vote"), js(json!(2)), None)
        .unwrap();
    assert_eq!(
        v.command(at(0), action("vote"), js(json!(3)), None),
        Err(CommandError::QueueFull)
    );
}

#[test]
fn presence_updates_members_in_election_order() {
    let mut v = live("b", "a", 2);
    server(
        &mut v,
        20,
        ServerMsg::Presence {
            member: member("z", 0),
            online: true,
        },
    );
    let ids: Vec<&str> = v.members().iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, ["z", "a", "b", "c"]);
    server(
        &mut v,
        21,
        ServerMsg::Presence {
            member: member("a", 1),
            online: false,
        },
    );
    let ids: Vec<&str> = v.members().iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, ["z", "b", "c"]);
}

#[test]
fn every_error_has_a_stable_code() {
    let all = [
        CommandError::NotHost,
        CommandError::NotAuthoritative,
        CommandError::LeaseExpired,
        CommandError::NoCapability,
        CommandError::StaleEpoch,
        CommandError::IdempotencyConflict,
        CommandError::UnknownAction,
        CommandError::QueueFull,
        CommandError::Timeout,
        CommandError::Interrupted,
        CommandError::Closed,
        CommandError::Rejected(RejectCode::BadRequest),
    ];
    let codes: std::collections::BTreeSet<_> = all.iter().map(|e| e.code()).collect();
    assert_eq!(codes.len(), all.len());
    assert!(all.iter().all(|e| !e.to_string().is_empty()));
}

// ----- election order and backoff -----------------------------------------------------------

#[test]
fn election_is_by_join_seq_then_id_and_skips_the_ineligible() {
    let mut m = vec![member("b", 2), member("a", 2), member("c", 1)];
    m[2].may_host = false;
    assert_eq!(elect(&m).unwrap().id, pid("a"));
    sort_members(&mut m);
    let ids: Vec<&str> = m.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, ["c", "a", "b"]);
    assert!(elect(&[] as &[Member]).is_none());
}

#[test]
fn backoff_is_capped_full_jitter_and_honours_retry_after() {
    let b = Backoff {
        base_ms: 100,
        cap_ms: 1000,
    };
    assert_eq!(b.ceiling_ms(0), 100);
    assert_eq!(b.ceiling_ms(3), 800);
    assert_eq!(b.ceiling_ms(4), 1000);
    assert_eq!(b.ceiling_ms(200), 1000);
    let mut rng = SplitMix64::new(7);
    let delays: Vec<u64> = (0..2000).map(|_| b.delay_ms(10, &mut rng)).collect();
    assert!(delays.iter().all(|d| *d <= 1000));
    assert!(
        delays.iter().any(|d| *d < 100) && delays.iter().any(|d| *d > 900),
        "full jitter spans the range"
    );
    for _ in 0..100 {
        assert!(b.retry_delay_ms(0, Some(5000), &mut rng) >= 5000);
    }
    // Reproducible from the seed.
    let (mut r1, mut r2) = (SplitMix64::new(42), SplitMix64::new(42));
    assert_eq!(b.delay_ms(2, &mut r1), b.delay_ms(2, &mut r2));
}

#[test]
fn a_stale_rejection_of_a_command_we_did_not_send_still_resyncs() {
    let mut v = live("a", "a", 2);
    let outcome = Outcome::Rejected {
        code: RejectCode::StaleEpoch,
        current: Some(assignment(3, 3, Some("b")).into()),
        retry_after_ms: None,
    };
    let (t, _) = server(
        &mut v,
        20,
        ServerMsg::CommandResult {
            id: IdempotencyKey::new("raw-1").unwrap(),
            outcome,
        },
    );
    assert_eq!(v.epoch(), Some(Epoch(3)));
    assert_eq!(t, vec![ClientMsg::Resume { cursor: Seq(2) }]);
}

/// A hello or a resume the server never answers (the connection half-open after a sleep or a
/// network change, with no close reported): after the retry deadline the core gives up on the
/// connection (`Stalled`, the driver dials again) rather than resuming into it for ever.
#[test]
fn an_unanswered_hello_or_resume_stalls_the_connection() {
    let mut v = connected("b");
    let deadline = v.poll_timeout().expect("the hello's deadline");
    v.handle_timeout(deadline);
    let (t, ev) = drain(&mut v);
    assert_eq!((t, ev), (vec![], vec![Event::Stalled]));

    let mut v = live("b", "a", 2);
    v.handle_wake(at(100));
    let (t, _) = drain(&mut v);
    assert_eq!(t, vec![ClientMsg::Resume { cursor: Seq(2) }]);
    let deadline = v.poll_timeout().expect("the resume's deadline");
    v.handle_timeout(deadline);
    let (t, ev) = drain(&mut v);
    assert_eq!((t, ev), (vec![], vec![Event::Stalled]));
    // Dialled again: the hello resumes from the cursor, and its welcome brings the view back.
    v.handle_disconnected(deadline);
    v.handle_connected(deadline, Token::new("join-token"));
    let (t, _) = drain(&mut v);
    assert!(
        matches!(
            t.as_slice(),
            [ClientMsg::Hello {
                resume: Some(Seq(2)),
                ..
            }]
        ),
        "{t:?}"
    );
}

/// At `t`, the live view at `seq` is sent `seq + 2` (`seq + 1` lost): it resumes from `seq`.
fn skip_one(v: &mut HostView, t: u64, seq: u64) {
    let (tx, _) = server(v, t, ServerMsg::Event(event(seq + 2, 2, "a")));
    assert_eq!(tx, vec![ClientMsg::Resume { cursor: Seq(seq) }]);
}

/// At `t`, the welcome that replays `seq + 1` (the item `skip_one` lost) up to `seq + 2`.
fn fill_the_skipped(v: &mut HostView, t: u64, seq: u64) {
    let snap = Snapshot {
        seq: Seq(seq + 2),
        ..snapshot(assignment(2, 2, Some("a")), vec![member("a", 1)], None)
    };
    server(
        v,
        t,
        welcome("b", snap, vec![Item::Event(event(seq + 1, 2, "a"))]),
    );
}

/// A resume waits the timeout and at most the first retry's jitter for its welcome however many
/// resumes the view made before (each answered): the jitter grew with the view's lifetime count
/// of resyncs, so a long-lived view took up to 20 s to notice a connection dead after a gap.
#[test]
fn a_resume_waits_no_longer_for_the_resumes_made_before() {
    let mut v = live("b", "a", 2);
    let mut seq = 2;
    for i in 0..20 {
        let t = 100 + i * 100;
        // A gap (seq + 1 lost): a resume, answered by a welcome that fills it.
        skip_one(&mut v, t, seq);
        fill_the_skipped(&mut v, t + 10, seq);
        assert_eq!(v.phase(), Phase::Live);
        seq += 2;
    }
    assert_eq!(v.stats().resyncs_requested, 20);
    skip_one(&mut v, 5_000, seq);
    let deadline = v.poll_timeout().expect("the resume's deadline");
    assert!(deadline <= at(5_000 + 5_000 + 250), "{deadline:?}");
    v.handle_timeout(deadline);
    assert_eq!(drain(&mut v).1, vec![Event::Stalled]);
}

/// A view that gave up on welcomes (a link too slow for a large one) gives later resumes longer,
/// up to the retry cap, even across the welcomes that came in between (each stall here is
/// followed by a redial and its welcome).
#[test]
fn a_resume_waits_longer_after_welcomes_were_given_up_on() {
    let mut v = live("b", "a", 2);
    let mut seq = 2;
    let mut t = 100;
    let mut waits = Vec::new();
    for _ in 0..26 {
        // A gap: a resume, which goes unanswered until the view gives up on it.
        skip_one(&mut v, t, seq);
        let stalled = loop {
            let d = v.poll_timeout().expect("a deadline");
            v.handle_timeout(d);
            if drain(&mut v).1.contains(&Event::Stalled) {
                break d;
            }
        };
        waits.push(stalled.ms_since(at(t)));
        t = stalled.as_millis() + 10;
        v.handle_disconnected(at(t));
        v.handle_connected(at(t), Token::new("jt"));
        drain(&mut v);
        fill_the_skipped(&mut v, t + 10, seq);
        assert_eq!(v.phase(), Phase::Live);
        seq += 2;
        t += 20;
    }
    assert!(waits[0] <= 5_000 + 250, "{waits:?}");
    assert!(waits.iter().all(|&w| w <= 5_000 + 15_000), "{waits:?}");
    assert!(waits[6..].iter().any(|&w| w > 5_000 + 250), "{waits:?}");
}

/// After a stall, each next hello waits twice as long for its welcome (5 s doubling up to
/// 160 s): a server slow to answer a reconnect storm is not dialled again and again, and a
/// welcome too large to arrive within 20 s on a slow link gets through. A welcome resets it.
#[test]
fn after_a_stall_the_next_hello_waits_longer() {
    let mut v = connected("b");
    let mut t0 = 0;
    for wait in [5_000, 10_000, 20_000, 40_000, 80_000, 160_000, 160_000] {
        // The silence checks on the way (every 20 s) give nothing up: a welcome is awaited, and
        // a large one on a slow link is silence until all of it has arrived.
        while let Some(t) = v.poll_timeout().filter(|t| *t < at(t0 + wait)) {
            v.handle_timeout(t);
            assert_eq!(drain(&mut v).1, vec![], "wait {wait}, at {t:?}");
        }
        assert_eq!(v.poll_timeout(), Some(at(t0 + wait)), "wait {wait}");
        v.handle_timeout(at(t0 + wait - 1));
        assert_eq!(drain(&mut v).1, vec![]);
        v.handle_timeout(at(t0 + wait));
        assert_eq!(drain(&mut v).1, vec![Event::Stalled]);
        t0 += wait + 1_000;
        v.handle_disconnected(at(t0));
        v.handle_connected(at(t0), Token::new("join-token"));
        drain(&mut v);
    }
    let snap = snapshot(assignment(2, 2, Some("a")), vec![], None);
    server(&mut v, t0 + 10, welcome("b", snap, vec![]));
    v.handle_disconnected(at(t0 + 20));
    v.handle_connected(at(t0 + 20), Token::new("join-token"));
    assert_eq!(v.poll_timeout(), Some(at(t0 + 5_020)));
}

/// A wake (`online`, a page shown again) starts the stall count over: a hello awaited for 40 s
/// gets the first 5 s from the wake, and the count goes on from there.
#[test]
fn a_wake_starts_the_stall_count_over() {
    let mut v = connected("b");
    let mut t0 = 0;
    for wait in [5_000, 10_000, 20_000] {
        while let Some(t) = v.poll_timeout().filter(|t| *t <= at(t0 + wait)) {
            v.handle_timeout(t);
        }
        assert_eq!(drain(&mut v).1, vec![Event::Stalled]);
        t0 += wait + 1_000;
        v.handle_disconnected(at(t0));
        v.handle_connected(at(t0), Token::new("join-token"));
        drain(&mut v);
    }
    assert_eq!(
        v.poll_timeout(),
        Some(at(t0 + 20_000)),
        "the fourth hello waits 40 s"
    );
    v.handle_wake(at(t0 + 1_000));
    drain(&mut v);
    assert_eq!(v.poll_timeout(), Some(at(t0 + 6_000)));
    v.handle_timeout(at(t0 + 6_000));
    assert_eq!(drain(&mut v).1, vec![Event::Stalled]);
    v.handle_disconnected(at(t0 + 7_000));
    v.handle_connected(at(t0 + 7_000), Token::new("join-token"));
    // One stall since the wake: 10 s (it would have been 80 s).
    assert_eq!(v.poll_timeout(), Some(at(t0 + 17_000)));
}

/// Two resumes in flight, one welcome back, then another resume: the second welcome answers the
/// second resume, built before the third was sent, so its lease time stays anchored on the
/// first resume's send time (the oldest unanswered), never on the third's.
#[test]
fn a_welcome_is_anchored_on_the_oldest_unanswered_resume() {
    let mut v = HostView::new(Config {
        buffer_limit: 2,
        ..config()
    });
    v.handle_connected(at(0), Token::new("join-token"));
    let lease = |v: &mut HostView, ms: u64| {
        let snap = snapshot(
            assignment(2, 2, Some("a")),
            vec![member("a", 1)],
            Some(3000),
        );
        server(v, ms, welcome("a", snap, vec![]))
    };
    lease(&mut v, 10);
    server(&mut v, 10, host_cap(2));
    v.handle_wake(at(100));
    assert_eq!(
        drain(&mut v).0,
        vec![ClientMsg::Resume { cursor: Seq(2) }],
        "resume 1, at 100"
    );
    // Items past a gap overflow the buffer: resume 2, forced, at 200.
    let mut sent = Vec::new();
    for seq in [10, 11, 12] {
        sent.extend(server(&mut v, 200, ServerMsg::Event(event(seq, 2, "b"))).0);
    }
    assert_eq!(
        sent,
        vec![ClientMsg::Resume { cursor: Seq(2) }],
        "resume 2, at 200"
    );
    assert_eq!(v.stats().buffer_overflows, 1);
    lease(&mut v, 300); // answers resume 1
    assert_eq!(v.phase(), Phase::Live);
    v.handle_wake(at(400)); // resume 3, while resume 2 is unanswered
    lease(&mut v, 410); // answers resume 2: its lease counts from 100 at the latest
                        // 3000 ms less 1 % drift and the 250 ms margin, from 100.
    assert_eq!(v.lease(), LeaseState::Held { deadline: at(2820) });
}

/// A hidden tab runs its timers late: the lease expires on the first input after its deadline,
/// whatever it is, so `lease: expired` never waits for the timer.
#[test]
fn a_lease_expires_on_any_input_after_its_deadline() {
    let mut v = live("a", "a", 2);
    assert_eq!(v.lease(), LeaseState::Held { deadline: at(2720) });
    let (_, ev) = server(&mut v, 2719, ServerMsg::Event(event(3, 2, "b")));
    assert!(!ev.contains(&Event::Lease(LeaseState::Expired)), "{ev:?}");
    let (_, ev) = server(&mut v, 2720, ServerMsg::Event(event(4, 2, "b")));
    assert_eq!(
        ev.first(),
        Some(&Event::Lease(LeaseState::Expired)),
        "{ev:?}"
    );
    assert_eq!(room_events(&ev), vec![4]);
}

/// A live connection on which the server falls silent (a half-open connection: the server or
/// the path gone without a close) is given up once a whole silence window (heartbeat period
/// plus the command timeout, 20 s) passes without a frame; frames of any kind, heartbeats and
/// events told by their seq alone included, keep it.
#[test]
fn a_live_connection_silent_past_the_heartbeat_is_given_up() {
    let mut v = live("b", "a", 2); // connected at 0, welcome at 10
                                   // Ten minutes of a quiet room: a heartbeat every 15 s, nothing given up.
    let mut t = 0;
    while t < 600_000 {
        t += 15_000;
        if let Some(due) = v.poll_timeout().filter(|d| *d <= at(t)) {
            v.handle_timeout(due);
        }
        v.handle_timeout(at(t));
        server(&mut v, t, ServerMsg::Heartbeat);
        assert!(!drain(&mut v).1.contains(&Event::Stalled), "at {t}");
    }
    // Events told by their seq alone count as heard too.
    for i in 1..=3u64 {
        t += 15_000;
        v.handle_timeout(at(t));
        assert!(v.handle_event_seq(Seq(2 + i)));
        assert!(!drain(&mut v).1.contains(&Event::Stalled), "at {t}");
    }
    assert_eq!(v.phase(), Phase::Live);
    // Then silence: given up at the end of the first window that heard nothing, within 40 s.
    let last = t;
    let mut stalled_at = None;
    while stalled_at.is_none() {
        let due = v.poll_timeout().expect("a silence check is armed");
        assert!(due <= at(last + 40_000), "{due:?}");
        v.handle_timeout(due);
        if drain(&mut v).1.contains(&Event::Stalled) {
            stalled_at = Some(due);
        }
    }
    assert!(
        stalled_at.unwrap() > at(last + 20_000 - 1),
        "{stalled_at:?}"
    );
    // Nothing more is armed for this connection; the next one gets its own window.
    assert_eq!(v.poll_timeout(), None);
    v.handle_disconnected(at(last + 41_000));
    v.handle_connected(at(last + 41_000), Token::new("join-token"));
    assert_eq!(v.poll_timeout(), Some(at(last + 46_000)));
}

/// A silence check that runs late (the page's event loop was blocked by a long task or an
/// `alert()`, or a hidden tab's timers were throttled) may run before the frames that waited
/// with it: it gives nothing up, and starts a new window. One on time that heard nothing does.
#[test]
fn a_late_silence_check_gives_nothing_up() {
    let mut v = live("b", "a", 2);
    let first = v.poll_timeout().expect("the silence check");
    v.handle_timeout(first); // heard the welcome: a new window
    assert!(!drain(&mut v).1.contains(&Event::Stalled));
    let second = v.poll_timeout().expect("the next window");
    v.handle_timeout(second.add_ms(30_000)); // 30 s late, nothing heard
    assert!(
        !drain(&mut v).1.contains(&Event::Stalled),
        "a late check decided"
    );
    let third = v.poll_timeout().expect("a new window");
    assert_eq!(third, second.add_ms(30_000 + 20_000));
    v.handle_timeout(third); // on time, nothing heard
    assert!(drain(&mut v).1.contains(&Event::Stalled));
}

#[test]
fn a_command_timeout_out_of_range_is_taken_within_its_bounds() {
    for (ms, taken) in [(0, 100), (u64::MAX, 600_000)] {
        let mut v = HostView::new(Config {
            command_timeout_ms: ms,
            ..Config::default()
        });
        v.handle_connected(Instant(1_000), Token::new("t"));
        // The hello waits `taken` for its welcome (no overflow, no timer due at once).
        assert_eq!(v.poll_timeout(), Some(Instant(1_000 + taken)));
        v.handle_timeout(Instant(1_000 + taken));
        assert!(drain(&mut v).1.contains(&Event::Stalled));
        assert!(v.poll_timeout().unwrap() > Instant(1_000 + taken), "{ms}");
    }
}

#[test]
fn silence_checks_that_all_run_late_still_give_a_dead_connection_up() {
    // A hidden tab: every timer runs a minute late. The first late check decides nothing; the
    // next one, with nothing heard since, gives the connection up (it stayed live for ever).
    let mut v = live("b", "a", 2);
    let first = v.poll_timeout().expect("the silence check");
    v.handle_timeout(first); // heard the welcome: a new window
    let second = v.poll_timeout().unwrap();
    v.handle_timeout(second.add_ms(60_000));
    assert!(!drain(&mut v).1.contains(&Event::Stalled));
    let third = v.poll_timeout().unwrap();
    v.handle_timeout(third.add_ms(60_000));
    assert!(drain(&mut v).1.contains(&Event::Stalled));
    // A frame heard between two late checks keeps the connection.
    let mut v = live("b", "a", 2);
    let first = v.poll_timeout().unwrap();
    v.handle_timeout(first);
    let second = v.poll_timeout().unwrap();
    v.handle_timeout(second.add_ms(60_000));
    let third = v.poll_timeout().unwrap();
    server(&mut v, third.0 + 59_000, ServerMsg::Heartbeat);
    v.handle_timeout(third.add_ms(60_000));
    assert!(!drain(&mut v).1.contains(&Event::Stalled));
    // A late check that heard frames does not spend the grace: the next late one, with frames
    // queued behind it, still decides nothing (it gave a live connection up).
    let mut v = live("b", "a", 2);
    let first = v.poll_timeout().unwrap();
    v.handle_timeout(first);
    let second = v.poll_timeout().unwrap();
    server(&mut v, second.0 + 59_000, ServerMsg::Heartbeat);
    v.handle_timeout(second.add_ms(60_000));
    let third = v.poll_timeout().unwrap();
    v.handle_timeout(third.add_ms(60_000));
    assert!(!drain(&mut v).1.contains(&Event::Stalled));
    let fourth = v.poll_timeout().unwrap();
    v.handle_timeout(fourth.add_ms(60_000));
    assert!(
        drain(&mut v).1.contains(&Event::Stalled),
        "nothing heard for two checks"
    );
}

/// A command sent once and never answered is refused by a local check when it is due to go
/// again (the lease ran out meanwhile, its token expired, the action table changed): it may have
/// been applied, so it fails `Interrupted` (see the room's events), not with the check's error,
/// which says it was not. It failed `LeaseExpired` though the server could still apply the first
/// attempt (a stalled store, on the store clock, within the lease). A command whose attempt was
/// rejected (retryable) and one never sent keep the check's error.
#[test]
fn a_resend_refused_here_after_an_unanswered_attempt_fails_interrupted() {
    let failed = |ev: &[Event], id: &IdempotencyKey| {
        ev.iter().find_map(|e| match e {
            Event::CommandFailed { id: i, error } if i == id => Some(*error),
            _ => None,
        })
    };
    // The host's lease (3 s from the welcome) runs out before the resend is due (5 s + jitter).
    let mut v = live("a", "a", 2);
    let key = host_command(&mut v, 20).unwrap();
    drain(&mut v);
    v.handle_timeout(at(60_000));
    let (t, ev) = drain(&mut v);
    assert!(
        !t.iter().any(|m| matches!(m, ClientMsg::Command { .. })),
        "{t:?}"
    );
    assert_eq!(failed(&ev, &key), Some(CommandError::Interrupted), "{ev:?}");
    // Rejected (rate limited: not applied), then due again after the lease ran out: the check's
    // own error.
    let mut v = live("a", "a", 2);
    let key = host_command(&mut v, 20).unwrap();
    drain(&mut v);
    result(&mut v, 21, &key, rejected(RejectCode::RateLimited));
    v.handle_timeout(at(60_000));
    let (_, ev) = drain(&mut v);
    assert_eq!(
        failed(&ev, &key),
        Some(CommandError::LeaseExpired),
        "{ev:?}"
    );
}

/// A participant command sent and never answered (the connection dropped) goes again with its
/// key after the resync while the server still keeps the key; after a sleep longer than the
/// resend window (an hour short of the server's `IDEMPOTENCY_RETENTION_MS`) a resend could apply
/// it a second time, so it fails `Interrupted` and is not sent.
#[test]
fn an_unanswered_command_is_not_resent_once_the_server_may_have_forgotten_its_key() {
    for (asleep, resent) in [
        (codec::RESEND_WINDOW_MS - 1_000, true),
        (codec::RESEND_WINDOW_MS, false),
    ] {
        let mut v = live("b", "a", 2);
        let key = v
            .command(at(20), action("vote"), js(json!({"o": 1})), None)
            .unwrap();
        let (t, _) = drain(&mut v);
        assert!(matches!(&t[..], [ClientMsg::Command { id, .. }] if id == &key));
        v.handle_disconnected(at(21));
        let back = 20 + asleep;
        v.handle_connected(at(back), Token::new("jt"));
        drain(&mut v);
        let snap = snapshot(assignment(2, 2, Some("a")), vec![member("a", 1)], None);
        v.handle_server(at(back + 1), welcome("b", snap, vec![]));
        v.handle_server(at(back + 1), participant_cap());
        let (t, ev) = drain(&mut v);
        let sent = t
            .iter()
            .any(|m| matches!(m, ClientMsg::Command { id, .. } if id == &key));
        assert_eq!(sent, resent, "asleep {asleep} ms: {t:?}");
        let interrupted = Event::CommandFailed {
            id: key,
            error: CommandError::Interrupted,
        };
        assert_eq!(ev.contains(&interrupted), !resent, "{ev:?}");
    }
}

/// The same when the resend falls due while the view still thinks it is live (the sleep went
/// unnoticed: a clock that counts it, a page not hidden): the participant token has run out, so
/// the command waits for a new one; it is not sent with it, nor after a resync.
#[test]
fn an_unanswered_command_due_again_after_an_unnoticed_sleep_is_not_resent() {
    let mut v = live("b", "a", 2);
    let key = v
        .command(at(20), action("vote"), js(json!({"o": 1})), None)
        .unwrap();
    drain(&mut v);
    let late = 20 + codec::RESEND_WINDOW_MS;
    v.handle_timeout(at(late));
    let (mut t, mut ev) = drain(&mut v);
    let mut step = |v: &mut HostView| {
        let (t2, ev2) = drain(v);
        t.extend(t2);
        ev.extend(ev2);
    };
    v.handle_server(at(late + 1), participant_cap());
    step(&mut v);
    v.handle_disconnected(at(late + 2));
    v.handle_connected(at(late + 3), Token::new("jt"));
    let snap = snapshot(assignment(2, 2, Some("a")), vec![member("a", 1)], None);
    v.handle_server(at(late + 4), welcome("b", snap, vec![]));
    v.handle_server(at(late + 4), participant_cap());
    step(&mut v);
    assert!(
        !t.iter()
            .any(|m| matches!(m, ClientMsg::Command { id, .. } if id == &key)),
        "{t:?}"
    );
    let interrupted = Event::CommandFailed {
        id: key,
        error: CommandError::Interrupted,
    };
    assert!(ev.contains(&interrupted), "{ev:?}");
}

/// Two views of one participant (a page reloaded, a process restarted) make different idempotency
/// keys with the default config: with one fixed seed they made the same ones, and the server
/// answered the second view's first vote with the first view's (kept 48 h) and applied nothing.
#[test]
fn two_views_of_one_participant_do_not_share_idempotency_keys() {
    // The default seed (the tests' own config fixes one).
    let view = || {
        let seed = Config::default().seed;
        live_with(Config { seed, ..config() }, "b", "a", 1)
    };
    let (mut a, mut b) = (view(), view());
    let vote = || js(json!({"option": 1}));
    let ka = a.command(at(20), action("vote"), vote(), None).unwrap();
    let kb = b.command(at(20), action("vote"), vote(), None).unwrap();
    assert_ne!(ka, kb);
}

/// A participant command whose resend finds the participant token run out (the server's refresh
/// late) goes back to the queue and asks for a token: it waited for one the server might never
/// send, with no timer set (only a command made or revalidated asked).
#[test]
fn a_resend_queued_for_want_of_a_participant_token_asks_for_one() {
    let mut v = live("b", "a", 1);
    // The participant token came at 10 and lives 600 s (less the margin).
    v.command(at(599_000), action("vote"), js(json!({"option": 1})), None)
        .unwrap();
    drain(&mut v);
    server(&mut v, 599_500, ServerMsg::Heartbeat);
    v.handle_timeout(at(605_000)); // the resend is due; the token ran out at 599,760
    let (sent, _) = drain(&mut v);
    assert!(sent.is_empty(), "{sent:?}");
    assert!(v.pending().all(|(_, _, queued)| queued));
    let due = v.poll_timeout().expect("a timer");
    v.handle_timeout(due);
    let (sent, _) = drain(&mut v);
    assert!(
        sent.iter().any(|m| matches!(m, ClientMsg::Resume { .. })),
        "{sent:?}"
    );
}
