//! Builders shared by the core's test files.
#![allow(dead_code)]

use hostlease::core::{Config, Event, HostView, Instant};
use hostlease::protocol::*;
use serde_json::json;

/// The config of every `proptest!` block: the default (cases and seed from the environment),
/// but in wasm, which has no environment to read `PROPTEST_RNG_SEED` from, CI's fixed seed
/// (`xtask`'s `CI_PROPTEST_SEED`): every wasm run tries the same cases, as CI's native run does.
pub fn props() -> proptest::test_runner::Config {
    let config = proptest::test_runner::Config::default();
    #[cfg(target_arch = "wasm32")]
    let config = proptest::test_runner::Config {
        rng_seed: proptest::test_runner::RngSeed::Fixed(20261204),
        ..config
    };
    config
}

/// An app payload from a `serde_json` value (the SDK keeps payloads as text).
pub fn js(v: serde_json::Value) -> Json {
    Json::parse(&v.to_string()).unwrap()
}

/// A payload's value, to look inside it.
pub fn value(j: &Json) -> serde_json::Value {
    serde_json::from_str(j.as_str()).unwrap()
}

pub fn pid(s: &str) -> ParticipantId {
    ParticipantId::new(s).unwrap()
}
pub fn sid(s: &str) -> SessionId {
    SessionId::new(s).unwrap()
}
pub fn room() -> RoomId {
    RoomId::new("room-1").unwrap()
}
pub fn action(s: &str) -> Action {
    Action::new(s).unwrap()
}
pub fn at(ms: u64) -> Instant {
    Instant::from_millis(ms)
}

pub fn table() -> ActionTable {
    ActionTable {
        host: vec![action("poll.open"), action("poll.close")],
        participant: vec![action("vote")],
    }
}

/// An assignment naming participant `host` on session `{host}-s`.
pub fn assignment(epoch: u64, seq: u64, host: Option<&str>) -> Assignment {
    Assignment {
        room: room(),
        host: host.map(pid),
        session: host.map(|h| sid(&format!("{h}-s"))),
        epoch: Epoch(epoch),
        seq: Seq(seq),
        lease_ms: 3000,
        reason: Reason::Elected,
        issued_at: ServerTime(1_700_000_000_000 + seq),
    }
}

pub fn member(id: &str, join_seq: u64) -> Member {
    Member {
        id: pid(id),
        session: sid(&format!("{id}-s")),
        name: id.to_uppercase(),
        join_seq,
        may_host: true,
    }
}

pub fn event(seq: u64, epoch: u64, actor: &str) -> RoomEvent {
    RoomEvent {
        seq: Seq(seq),
        epoch: Epoch(epoch),
        actor: pid(actor),
        action: action("vote"),
        payload: js(json!({ "option": seq % 3 })),
        at: ServerTime(1_700_000_000_000 + seq),
    }
}

pub fn snapshot(a: Assignment, members: Vec<Member>, lease_remaining_ms: Option<u64>) -> Snapshot {
    Snapshot {
        room: room(),
        seq: a.seq,
        current: a.into(),
        members,
        lease_remaining_ms,
        server_time: ServerTime(1_700_000_000_000),
        actions: table(),
    }
}

pub fn welcome(me: &str, snap: Snapshot, missed: Vec<Item>) -> ServerMsg {
    ServerMsg::Welcome {
        you: pid(me),
        session: sid(&format!("{me}-s")),
        snapshot: snap,
        missed,
        discontinuity: None,
    }
}

pub fn host_cap(epoch: u64) -> ServerMsg {
    ServerMsg::Capability {
        role: Role::Host,
        token: Token::new(format!("host-token-{epoch}")),
        epoch: Some(Epoch(epoch)),
        actions: vec![
            action("poll.open"),
            action("poll.close"),
            action(ACTION_RESIGN),
            action(ACTION_TRANSFER),
        ],
        expires_in_ms: 3000,
    }
}

pub fn participant_cap() -> ServerMsg {
    ServerMsg::Capability {
        role: Role::Participant,
        token: Token::new("participant-token"),
        epoch: None,
        actions: vec![action("vote")],
        expires_in_ms: 600_000,
    }
}

/// The tests' config: a fixed seed (the default is random per view), so that every run of a
/// test, and a property case replayed from its seed, sees the same jitter and keys.
pub fn config() -> Config {
    Config {
        actions: table(),
        seed: 0x5EED,
        ..Config::default()
    }
}

/// A view for participant `me`, connected at t=0 and drained.
pub fn connected(me: &str) -> HostView {
    let _ = me;
    connected_with(config())
}

fn connected_with(config: Config) -> HostView {
    let mut v = HostView::new(config);
    v.handle_connected(at(0), Token::new("join-token"));
    drain(&mut v);
    v
}

/// A live view for `me` in a room hosted by `host` at `epoch`, with members `a`, `b`, `c`.
pub fn live(me: &str, host: &str, epoch: u64) -> HostView {
    live_with(config(), me, host, epoch)
}

/// [`live`], made with `config`.
pub fn live_with(config: Config, me: &str, host: &str, epoch: u64) -> HostView {
    let mut v = connected_with(config);
    let a = assignment(epoch, epoch, Some(host));
    let lease = if me == host { Some(3000) } else { None };
    let snap = snapshot(
        a,
        vec![member("a", 1), member("b", 2), member("c", 3)],
        lease,
    );
    v.handle_server(at(10), welcome(me, snap, vec![]));
    v.handle_server(at(10), participant_cap());
    if me == host {
        v.handle_server(at(10), host_cap(epoch));
    }
    drain(&mut v);
    v
}

pub fn drain(v: &mut HostView) -> (Vec<ClientMsg>, Vec<Event>) {
    let mut t = Vec::new();
    let mut e = Vec::new();
    while let Some(m) = v.poll_transmit() {
        t.push(m);
    }
    while let Some(ev) = v.poll_event() {
        e.push(ev);
    }
    (t, e)
}

pub fn room_events(events: &[Event]) -> Vec<u64> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::RoomEvent(r) => Some(r.seq.0),
            _ => None,
        })
        .collect()
}
