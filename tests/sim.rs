//! Seeded simulation: a small model authority and N `HostView` cores exchanging messages in
//! simulated time through a fault injector (reorder, duplicate, delay, drop, disconnect and
//! reconnect, WebRTC partitions, local clock drift and forward jumps, noticed or not), and admin reassigns: grants
//! forced on a room whose host may still hold its lease, fenced as the real server fences them.
//!
//! Checked on every schedule:
//! - after every millisecond's deliveries and every tick, at most one core holds host authority,
//!   and only within a lease the model held for that core's session in that core's epoch (the
//!   model's lease history, not the core's own view; a lease lapsed and granted again to the same
//!   session in a new epoch does not cover the old one); every host command a core sends is
//!   checked the same way as it is sent. Clocks drift up to ρ (a third of the clients at either
//!   bound), half the clients keep a lease margin under ρ's share of a lease, and a quarter of the
//!   schedules run on a fast network, so that a core leaving ρ out fails here (checked by hand:
//!   with ρ dropped from the core's deadline a schedule fails within 10,000);
//! - at most one session's host commands are accepted per epoch by the model, and every stale or
//!   replayed host command is refused and changes no state (the model's own rules: a check of the
//!   model, which the real server's tests check of the server);
//! - after the faults heal, every core is live at the newest committed epoch, has applied every
//!   room event exactly once and in order, and no participant command counted twice.
//!
//! `HOSTLEASE_SIM_SCHEDULES` sets how many schedules run (`cargo xtask test` runs 10,000);
//! `HOSTLEASE_SIM_SEED=<seed>` replays one schedule; a failure prints its seed.

#![allow(
    clippy::too_many_arguments,
    clippy::large_enum_variant,
    clippy::collapsible_match
)]

mod common;

// The same tests run in the browser (wasm-bindgen-test), at the default, reduced sizes.
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};

use common::{action, js, pid, room, value};
use hostlease::core::*;
use hostlease::protocol::*;
use serde_json::json;

const DRIFT_PPM: u64 = 10_000;

struct Rng(SplitMix64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0.next_u64() % n.max(1)
    }
    fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
}

#[derive(Clone, Copy)]
struct Faults {
    drop: u64,
    dup: u64,
    reorder: u64,
    max_delay: u64,
    cut: u64,
    jump: u64,
    partition: u64,
    admin: u64,
}

#[derive(Debug)]
enum Packet {
    ToClient {
        client: usize,
        conn: u64,
        msg: ServerMsg,
    },
    ToServer {
        client: usize,
        conn: u64,
        msg: ClientMsg,
    },
    Peer {
        to: usize,
        signed: SignedAssignment,
    },
    /// The server notices a dead connection (its TCP close or a ping timeout).
    ServerSeesClose {
        client: usize,
        conn: u64,
    },
}

#[derive(Default)]
struct Net {
    heap: BinaryHeap<Reverse<(u64, u64)>>,
    packets: HashMap<u64, Packet>,
    next: u64,
    /// Per (direction, client): the latest delivery time, to keep a WebSocket's FIFO order.
    fifo: HashMap<(bool, usize), u64>,
}

impl Net {
    fn push(&mut self, at: u64, p: Packet) {
        self.next += 1;
        self.heap.push(Reverse((at, self.next)));
        self.packets.insert(self.next, p);
    }
    fn pop_due(&mut self, now: u64) -> Option<Packet> {
        let Reverse((at, id)) = *self.heap.peek()?;
        if at > now {
            return None;
        }
        self.heap.pop();
        self.packets.remove(&id)
    }
}

#[derive(Clone)]
struct Claims {
    sub: ParticipantId,
    sid: SessionId,
    role: Role,
    epoch: Option<Epoch>,
    exp: u64,
    actions: Vec<Action>,
}

struct Session {
    client: usize,
    conn: u64,
    pid: ParticipantId,
}

/// The model authority: the rules of DESIGN.md "The authoritative record" and "Capability
/// tokens", in memory, on the global clock.
struct Model {
    ttl: u64,
    epoch: Epoch,
    seq: Seq,
    current: Assignment,
    lease_expires: u64,
    /// No lease is confirmed before this: a forced grant took a lease away that ran until then.
    fenced_until: u64,
    /// epoch → the session granted in it and the span of its lease on the server: from the
    /// grant, or from the fence a forced grant set (the lease it took away runs until then),
    /// until its end, extended by every confirmed echo. A host replaced by force may still act
    /// within the lease it had (cut off, it does not know yet); nobody may act in an epoch
    /// before its lease began or after it ended.
    leases: BTreeMap<Epoch, (SessionId, u64, u64)>,
    log: Vec<Item>,
    members: Vec<Member>,
    sessions: BTreeMap<SessionId, Session>,
    join_seq: u64,
    tokens: HashMap<String, Claims>,
    nonces: Vec<u64>,
    next_nonce: u64,
    last_probe: u64,
    idem: HashMap<(ParticipantId, IdempotencyKey), (String, Outcome)>,
    /// epoch → the one session whose host commands were accepted in it.
    host_of_epoch: BTreeMap<Epoch, SessionId>,
    accepted_host: u64,
    rejected_host: u64,
    /// Forced grants made while a host's lease ran.
    forced_from_a_lease: u64,
    out: Vec<(usize, u64, ServerMsg)>,
}

fn state_key(m: &Model) -> (Epoch, Seq, Option<SessionId>, u64, usize) {
    (
        m.epoch,
        m.seq,
        m.current.session.clone(),
        m.lease_expires,
        m.log.len(),
    )
}

impl Model {
    fn new(ttl: u64) -> Self {
        let current = Assignment {
            room: room(),
            host: None,
            session: None,
            epoch: Epoch::ZERO,
            seq: Seq::ZERO,
            lease_ms: ttl,
            reason: Reason::Elected,
            issued_at: ServerTime(0),
        };
        Self {
            ttl,
            epoch: Epoch::ZERO,
            seq: Seq::ZERO,
            current,
            lease_expires: 0,
            fenced_until: 0,
            leases: BTreeMap::new(),
            log: Vec::new(),
            members: Vec::new(),
            sessions: BTreeMap::new(),
            join_seq: 0,
            tokens: HashMap::new(),
            nonces: Vec::new(),
            next_nonce: 1,
            last_probe: 0,
            idem: HashMap::new(),
            host_of_epoch: BTreeMap::new(),
            accepted_host: 0,
            rejected_host: 0,
            forced_from_a_lease: 0,
            out: Vec::new(),
        }
    }

    fn table() -> ActionTable {
        ActionTable {
            host: vec![action("poll.open")],
            participant: vec![action("vote")],
        }
    }

    fn send(&mut self, sid: &SessionId, msg: ServerMsg) {
        if let Some(s) = self.sessions.get(sid) {
            self.out.push((s.client, s.conn, msg));
        }
    }

    fn broadcast(&mut self, msg: &ServerMsg) {
        let targets: Vec<(usize, u64)> =
            self.sessions.values().map(|s| (s.client, s.conn)).collect();
        for (c, conn) in targets {
            self.out.push((c, conn, msg.clone()));
        }
    }

    fn snapshot(&self, sid: &SessionId, now: u64) -> Snapshot {
        let is_host = self.current.session.as_ref() == Some(sid);
        Snapshot {
            room: room(),
            current: self.current.clone().into(),
            members: self.members.clone(),
            seq: self.seq,
            // No lease to tell of while fenced: it is not confirmed yet.
            lease_remaining_ms: (is_host && self.lease_expires > now && self.fenced_until <= now)
                .then(|| self.lease_expires - now),
            server_time: ServerTime(now),
            actions: Self::table(),
        }
    }

    fn welcome(&mut self, sid: &SessionId, resume: Option<Seq>, now: u64) {
        let missed = match resume {
            Some(c) => self.log.iter().filter(|i| i.seq() > c).cloned().collect(),
            None => Vec::new(),
        };
        let pid = self.sessions[sid].pid.clone();
        let snapshot = self.snapshot(sid, now);
        self.send(
            sid,
            ServerMsg::Welcome {
                you: pid.clone(),
                session: sid.clone(),
                snapshot,
                missed,
                discontinuity: None,
            },
        );
        // Every welcome is followed by a fresh participant token.
        let token = self.issue(Claims {
            sub: pid,
            sid: sid.clone(),
            role: Role::Participant,
            epoch: None,
            exp: now + 3_600_000,
            actions: vec![action("vote")],
        });
        self.send(
            sid,
            ServerMsg::Capability {
                role: Role::Participant,
                token,
                epoch: None,
                actions: vec![action("vote")],
                expires_in_ms: 3_600_000,
            },
        );
    }

    fn issue(&mut self, claims: Claims) -> Token {
        let t = format!("tok{}", self.tokens.len());
        self.tokens.insert(t.clone(), claims);
        Token::new(t)
    }

    fn hello(
        &mut self,
        client: usize,
        conn: u64,
        pid: ParticipantId,
        resume: Option<Seq>,
        now: u64,
    ) {
        let sid = SessionId::new(format!("{pid}-c{conn}")).unwrap();
        self.join_seq += 1;
        let member = Member {
            id: pid.clone(),
            session: sid.clone(),
            name: String::new(),
            join_seq: self.join_seq,
            may_host: true,
        };
        self.sessions.insert(
            sid.clone(),
            Session {
                client,
                conn,
                pid: pid.clone(),
            },
        );
        self.members.push(member.clone());
        sort_members(&mut self.members);
        self.welcome(&sid, resume, now);
        self.broadcast(&ServerMsg::Presence {
            member,
            online: true,
        });
        self.elect(now, None, Reason::Elected);
    }

    fn close(&mut self, sid: &SessionId, now: u64, explicit: bool) {
        if self.sessions.remove(sid).is_none() {
            return;
        }
        let i = self.members.iter().position(|m| &m.session == sid).unwrap();
        let member = self.members.remove(i);
        self.broadcast(&ServerMsg::Presence {
            member,
            online: false,
        });
        if explicit && self.current.session.as_ref() == Some(sid) {
            self.grant(now, None, Reason::Left);
        }
    }

    /// Re-elects if the room has no live host. Re-finding the live host is not a grant.
    fn elect(&mut self, now: u64, exclude: Option<&SessionId>, reason: Reason) {
        let live = self.current.session.is_some() && self.lease_expires > now;
        if live {
            return;
        }
        let reason = if self.current.host.is_some() {
            Reason::LeaseLapsed
        } else {
            reason
        };
        self.grant(now, exclude, reason);
    }

    fn grant(&mut self, now: u64, exclude: Option<&SessionId>, reason: Reason) {
        let next = elect(self.members.iter().filter(|m| Some(&m.session) != exclude))
            .map(|m| (m.id.clone(), m.session.clone()));
        self.grant_to(now, next, reason);
    }

    fn grant_to(&mut self, now: u64, next: Option<(ParticipantId, SessionId)>, reason: Reason) {
        if next.is_none() && self.current.host.is_none() {
            return; // hostless → hostless does not move the epoch
        }
        // A forced grant (an admin's) fences the room until the lease it takes away has run
        // out; a holder still fenced was never confirmed, and its lease adds nothing.
        if matches!(reason, Reason::Admin | Reason::Kicked)
            && self.fenced_until <= now
            && self.current.host.is_some()
        {
            self.fenced_until = self.fenced_until.max(self.lease_expires);
            if self.lease_expires > now {
                self.forced_from_a_lease += 1;
            }
        }
        self.epoch = self.epoch.next();
        self.seq = self.seq.next();
        self.current = Assignment {
            room: room(),
            host: next.as_ref().map(|n| n.0.clone()),
            session: next.as_ref().map(|n| n.1.clone()),
            epoch: self.epoch,
            seq: self.seq,
            lease_ms: self.ttl,
            reason,
            issued_at: ServerTime(now),
        };
        // The new lease runs from the fence, so that it does not lapse before it can be confirmed.
        self.lease_expires = if next.is_some() {
            now.max(self.fenced_until) + self.ttl
        } else {
            0
        };
        if let Some((_, sid)) = &next {
            let from = now.max(self.fenced_until);
            self.leases
                .insert(self.epoch, (sid.clone(), from, self.lease_expires));
        }
        self.log.push(Item::Assignment(self.current.clone().into()));
        self.broadcast(&ServerMsg::Assignment(self.current.clone().into()));
        self.nonces.clear();
        if let Some((_, sid)) = next {
            self.probe(&sid, now);
        }
    }

    fn probe(&mut self, sid: &SessionId, now: u64) {
        let nonce = self.next_nonce;
        self.next_nonce += 1;
        self.nonces.push(nonce);
        if self.nonces.len() > 3 {
            self.nonces.remove(0);
        }
        self.last_probe = now;
        self.send(
            sid,
            ServerMsg::LeaseProbe {
                nonce,
                epoch: self.epoch,
            },
        );
    }

    fn tick(&mut self, now: u64) {
        if self.current.session.is_some() && self.lease_expires <= now {
            self.elect(now, None, Reason::LeaseLapsed);
        }
        if let Some(sid) = self.current.session.clone() {
            if now >= self.last_probe + self.ttl / 3 {
                self.probe(&sid, now);
            }
        }
    }

    fn echo(&mut self, sid: &SessionId, nonce: u64, now: u64) {
        if self.current.session.as_ref() != Some(sid)
            || !self.nonces.contains(&nonce)
            || self.lease_expires <= now
            // Fenced: nothing confirmed yet (the next probe, after the fence, may be).
            || now < self.fenced_until
        {
            return;
        }
        self.lease_expires = self.lease_expires.max(now + self.ttl);
        if let Some(lease) = self.leases.get_mut(&self.epoch) {
            lease.2 = self.lease_expires;
        }
        let claims = Claims {
            sub: self.current.host.clone().unwrap(),
            sid: sid.clone(),
            role: Role::Host,
            epoch: Some(self.epoch),
            exp: self.lease_expires,
            actions: vec![
                action("poll.open"),
                action(ACTION_RESIGN),
                action(ACTION_TRANSFER),
            ],
        };
        let actions = claims.actions.clone();
        let token = self.issue(claims);
        self.send(
            sid,
            ServerMsg::Capability {
                role: Role::Host,
                token,
                epoch: Some(self.epoch),
                actions,
                expires_in_ms: self.ttl,
            },
        );
        // The token before the confirm, as the real server sends them.
        self.send(
            sid,
            ServerMsg::LeaseConfirm {
                nonce,
                epoch: self.epoch,
                remaining_ms: self.ttl,
            },
        );
    }

    fn reject(&self, code: RejectCode) -> Outcome {
        Outcome::Rejected {
            code,
            current: Some(self.current.clone().into()),
            retry_after_ms: None,
        }
    }

    /// Every check of DESIGN.md "Capability tokens", then the effect, atomically.
    fn check_and_apply(
        &mut self,
        sid: &SessionId,
        action: &Action,
        payload: &Json,
        epoch: Option<Epoch>,
        cap: &Token,
        now: u64,
    ) -> Outcome {
        let sender = self.sessions[sid].pid.clone();
        let Some(claims) = self.tokens.get(cap.expose()).cloned() else {
            return self.reject(RejectCode::BadCapability);
        };
        if claims.exp <= now || claims.sub != sender || &claims.sid != sid {
            return self.reject(RejectCode::BadCapability);
        }
        if !claims.actions.contains(action) {
            return self.reject(RejectCode::ActionNotGranted);
        }
        let host_action = Self::table().kind(action) != Some(ActionKind::Participant);
        if host_action {
            if claims.role != Role::Host {
                return self.reject(RejectCode::BadCapability);
            }
            if claims.epoch != Some(self.epoch) || epoch != Some(self.epoch) {
                return self.reject(RejectCode::StaleEpoch);
            }
            if self.current.session.as_ref() != Some(sid)
                || self.current.host.as_ref() != Some(&sender)
            {
                return self.reject(RejectCode::NotHost);
            }
            if self.lease_expires <= now {
                return self.reject(RejectCode::LeaseExpired);
            }
        }
        // Effect.
        self.seq = self.seq.next();
        let ev = RoomEvent {
            seq: self.seq,
            epoch: self.epoch,
            actor: sender,
            action: action.clone(),
            payload: payload.clone(),
            at: ServerTime(now),
        };
        self.log.push(Item::Event(ev.clone()));
        self.broadcast(&ServerMsg::Event(ev));
        let seq = self.seq;
        if host_action {
            let holder = self
                .host_of_epoch
                .entry(self.epoch)
                .or_insert_with(|| sid.clone());
            assert_eq!(
                holder, sid,
                "two sessions' host commands accepted in one epoch"
            );
            self.accepted_host += 1;
            match action.as_str() {
                ACTION_RESIGN => self.grant(now, Some(&sid.clone()), Reason::Resigned),
                ACTION_TRANSFER => {
                    let to = payload
                        .get_str("to")
                        .and_then(|s| ParticipantId::new(s).ok());
                    let target = self
                        .members
                        .iter()
                        .find(|m| Some(&m.id) == to.as_ref() && &m.session != sid)
                        .map(|m| (m.id.clone(), m.session.clone()));
                    match target {
                        Some(t) => self.grant_to(now, Some(t), Reason::Transferred),
                        None => self.grant(now, Some(&sid.clone()), Reason::Transferred),
                    }
                }
                _ => {}
            }
        }
        Outcome::Accepted { seq }
    }

    fn command(
        &mut self,
        sid: &SessionId,
        id: IdempotencyKey,
        action: Action,
        payload: Json,
        epoch: Option<Epoch>,
        cap: Token,
        now: u64,
    ) {
        let sender = self.sessions[sid].pid.clone();
        let hash = format!("{action}|{}|{epoch:?}", payload.as_str());
        let key = (sender, id.clone());
        let outcome = match self.idem.get(&key) {
            Some((h, o)) if *h == hash => o.clone(),
            Some(_) => self.reject(RejectCode::IdempotencyConflict),
            None => {
                let before = state_key(self);
                let o = self.check_and_apply(sid, &action, &payload, epoch, &cap, now);
                match &o {
                    Outcome::Accepted { .. } => {
                        self.idem.insert(key, (hash, o.clone()));
                    }
                    Outcome::Rejected { .. } => {
                        assert_eq!(before, state_key(self), "a refused command changed state");
                        if Self::table().kind(&action) != Some(ActionKind::Participant) {
                            self.rejected_host += 1;
                        }
                    }
                }
                o
            }
        };
        self.send(sid, ServerMsg::CommandResult { id, outcome });
    }

    fn handle(&mut self, client: usize, conn: u64, pid: &ParticipantId, msg: ClientMsg, now: u64) {
        let sid = SessionId::new(format!("{pid}-c{conn}")).unwrap();
        match msg {
            ClientMsg::Hello { resume, .. } => {
                if !self.sessions.contains_key(&sid) {
                    self.hello(client, conn, pid.clone(), resume, now);
                }
            }
            _ if !self.sessions.contains_key(&sid) => {}
            ClientMsg::Resume { cursor } => self.welcome(&sid, Some(cursor), now),
            ClientMsg::LeaseEcho { nonce } => self.echo(&sid, nonce, now),
            ClientMsg::Leave => self.close(&sid, now, true),
            ClientMsg::Command {
                id,
                action,
                payload,
                epoch,
                capability,
                ..
            } => self.command(&sid, id, action, payload, epoch, capability, now),
            _ => {}
        }
    }
}

struct Client {
    pid: ParticipantId,
    view: HostView,
    rate_ppm: u64,
    jumped: u64,
    conn: Option<u64>,
    /// A cut connection: the client does not know yet; nothing gets through.
    cut: bool,
    applied: Vec<u64>,
    discontinuities: u64,
    /// Every vote made, by key: its number among this client's votes (in its payload, `n`).
    votes: HashMap<IdempotencyKey, u64>,
    votes_failed: HashSet<IdempotencyKey>,
    isolated: bool,
}

impl Client {
    fn local(&self, global: u64) -> Instant {
        Instant::from_millis(global * self.rate_ppm / 1_000_000 + self.jumped)
    }
}

struct Sim {
    seed: u64,
    rng: Rng,
    faults: Faults,
    now: u64,
    net: Net,
    model: Model,
    clients: Vec<Client>,
    next_conn: u64,
    /// Host command frames seen on the wire, replayed later as a stale client would.
    captured: Vec<(usize, u64, ClientMsg)>,
    healing: bool,
    /// Connections the server has seen close: nothing more arrives on them.
    closed: HashSet<u64>,
    trace: bool,
}

impl Sim {
    fn new(seed: u64) -> Self {
        let mut rng = Rng(SplitMix64::new(seed));
        let n = rng.range(2, 5) as usize;
        let ttl = rng.range(300, 1500);
        let faults = Faults {
            drop: rng.range(0, 60),
            dup: rng.range(0, 60),
            reorder: rng.range(0, 40),
            // A quarter of the schedules on a fast network: a confirm then arrives with most
            // of its lease left, and a lease kept past the server's by a clock error shows.
            max_delay: if rng.chance(250) {
                rng.range(1, 4)
            } else {
                rng.range(1, ttl / 4)
            },
            cut: rng.range(0, 15),
            jump: rng.range(0, 5),
            partition: rng.range(0, 10),
            admin: rng.range(0, 5),
        };
        let clients = (0..n)
            .map(|i| {
                let margin_small = rng.chance(500);
                let config = Config {
                    drift_ppm: DRIFT_PPM,
                    // Half the clients keep a margin of 5 ms only, under the 1 % of a lease
                    // that ρ keeps back (up to 15 ms here): a core that left ρ out would act
                    // past the server's lease, and the split-brain check would see it.
                    lease_margin_ms: if margin_small { 5 } else { 20 },
                    command_timeout_ms: ttl,
                    seed: seed ^ (i as u64 + 1).wrapping_mul(0x9E37),
                    buffer_limit: 64,
                    retry: Backoff {
                        base_ms: 20,
                        cap_ms: 500,
                    },
                    max_attempts: 50,
                    ..Config::default()
                };
                Client {
                    pid: pid(&format!("p{i}")),
                    view: HostView::new(config),
                    // Local clocks run within ±ρ of the server's: a third at either bound
                    // (the slowest makes a lease look longest), the rest anywhere between.
                    rate_ppm: match rng.below(6) {
                        0 => 1_000_000 - DRIFT_PPM,
                        1 => 1_000_000 + DRIFT_PPM,
                        _ => 1_000_000 - DRIFT_PPM + rng.below(2 * DRIFT_PPM + 1),
                    },
                    jumped: 0,
                    conn: None,
                    cut: false,
                    applied: Vec::new(),
                    discontinuities: 0,
                    votes: HashMap::new(),
                    votes_failed: HashSet::new(),
                    isolated: false,
                }
            })
            .collect();
        Self {
            seed,
            rng,
            faults,
            now: 0,
            net: Net::default(),
            model: Model::new(ttl),
            clients,
            next_conn: 0,
            captured: Vec::new(),
            healing: false,
            closed: HashSet::new(),
            trace: std::env::var_os("HOSTLEASE_SIM_TRACE").is_some(),
        }
    }

    fn delay(&mut self) -> u64 {
        self.rng.range(1, self.faults.max_delay)
    }

    /// Schedules a frame on a WebSocket link: FIFO, unless the injector reorders, drops or
    /// duplicates it (the latter three only while faults are on).
    fn schedule(&mut self, to_server: bool, client: usize, p: Packet) {
        let faulty = !self.healing;
        if faulty && self.rng.chance(self.faults.drop) {
            return;
        }
        let mut at = self.now + self.delay();
        let key = (to_server, client);
        if !(faulty && self.rng.chance(self.faults.reorder)) {
            at = at.max(*self.net.fifo.get(&key).unwrap_or(&0));
            self.net.fifo.insert(key, at);
        }
        if faulty && self.rng.chance(self.faults.dup) {
            let copy = match &p {
                Packet::ToClient { client, conn, msg } => Packet::ToClient {
                    client: *client,
                    conn: *conn,
                    msg: msg.clone(),
                },
                Packet::ToServer { client, conn, msg } => Packet::ToServer {
                    client: *client,
                    conn: *conn,
                    msg: msg.clone(),
                },
                _ => unreachable!(),
            };
            let later = at + self.delay();
            self.net.push(later, copy);
        }
        self.net.push(at, p);
    }

    fn flush_model(&mut self) {
        for (client, conn, msg) in std::mem::take(&mut self.model.out) {
            if self.clients[client].cut && self.clients[client].conn == Some(conn) {
                continue;
            }
            self.schedule(false, client, Packet::ToClient { client, conn, msg });
        }
    }

    /// Drains the outputs of the last input, then fires timers and drains again: each batch is
    /// checked right after the input that produced it.
    fn pump(&mut self, i: usize) {
        self.drain_outputs(i);
        let local = self.clients[i].local(self.now);
        self.clients[i].view.handle_timeout(local);
        self.drain_outputs(i);
    }

    fn drain_outputs(&mut self, i: usize) {
        let local = self.clients[i].local(self.now);
        while let Some(msg) = self.clients[i].view.poll_transmit() {
            if let ClientMsg::Command { action, .. } = &msg {
                let relinquishing = matches!(action.as_str(), ACTION_RESIGN | ACTION_TRANSFER);
                if Model::table().kind(action) != Some(ActionKind::Participant) {
                    // The core emits a host command only with authority at that instant (resign
                    // and transfer give it up as they are sent; `act` checks them beforehand).
                    assert!(
                        relinquishing
                            || (self.clients[i].view.has_authority(local)
                                && self.server_lease_holds(self.clients[i].view.assignment())),
                        "seed {}: host command without authority at {local:?}: {msg:?} {:#?}",
                        self.seed,
                        self.clients[i].view
                    );
                    if let Some(conn) = self.clients[i].conn {
                        self.captured.push((i, conn, msg.clone()));
                    }
                }
            }
            if self.trace {
                eprintln!(
                    "t={} {} sends {:?} (lease {:?})",
                    self.now,
                    self.clients[i].pid,
                    msg,
                    self.clients[i].view.lease()
                );
            }
            let (Some(conn), false) = (self.clients[i].conn, self.clients[i].cut) else {
                continue;
            };
            self.schedule(
                true,
                i,
                Packet::ToServer {
                    client: i,
                    conn,
                    msg,
                },
            );
        }
        let mut stalled = false;
        while let Some(ev) = self.clients[i].view.poll_event() {
            let c = &mut self.clients[i];
            match ev {
                Event::RoomEvent(e) => {
                    if let Some(last) = c.applied.last() {
                        assert!(
                            e.seq.0 > *last,
                            "seed {}: event {} applied after {}",
                            self.seed,
                            e.seq.0,
                            last
                        );
                    }
                    c.applied.push(e.seq.0);
                }
                Event::Discontinuity(_) => c.discontinuities += 1,
                Event::CommandFailed { id, .. } => {
                    c.votes_failed.insert(id);
                }
                Event::ProtocolViolation(v) => {
                    panic!("seed {}: protocol violation {v:?}", self.seed)
                }
                Event::Stalled => stalled = true,
                _ => {}
            }
        }
        if stalled {
            // What the driver does: drop the connection and dial again.
            self.disconnect(i, 1);
            self.connect(i);
        }
    }

    fn connect(&mut self, i: usize) {
        if self.clients[i].conn.is_some() {
            return;
        }
        self.next_conn += 1;
        let c = &mut self.clients[i];
        c.conn = Some(self.next_conn);
        c.cut = false;
        let local = c.local(self.now);
        c.view
            .handle_connected(local, Token::new(format!("join-{}", c.pid)));
        self.pump(i);
    }

    fn disconnect(&mut self, i: usize, server_notices_after: u64) {
        let c = &mut self.clients[i];
        let Some(conn) = c.conn.take() else { return };
        let local = c.local(self.now);
        c.view.handle_disconnected(local);
        self.net.push(
            self.now + server_notices_after,
            Packet::ServerSeesClose { client: i, conn },
        );
        self.pump(i);
    }

    fn deliver(&mut self, p: Packet) {
        if self.trace {
            eprintln!("t={} {:?}", self.now, p);
        }
        match p {
            Packet::ToClient { client, conn, msg } => {
                let c = &mut self.clients[client];
                if c.conn != Some(conn) || c.cut {
                    return;
                }
                let local = c.local(self.now);
                c.view.handle_server(local, msg);
                self.pump(client);
            }
            Packet::ToServer { client, conn, msg } => {
                if self.closed.contains(&conn) {
                    return;
                }
                let pid = self.clients[client].pid.clone();
                self.model.handle(client, conn, &pid, msg, self.now);
                self.flush_model();
            }
            Packet::Peer { to, signed } => {
                if self.clients[to].isolated {
                    return;
                }
                let local = self.clients[to].local(self.now);
                // The driver has verified the server's signature; the core sees only valid ones.
                self.clients[to].view.handle_peer_assignment(local, signed);
                self.pump(to);
            }
            Packet::ServerSeesClose { client, conn } => {
                self.closed.insert(conn);
                let sid = SessionId::new(format!("{}-c{conn}", self.clients[client].pid)).unwrap();
                self.model.close(&sid, self.now, false);
                self.flush_model();
            }
        }
    }

    fn relay(&mut self) {
        let n = self.clients.len();
        for from in 0..n {
            if self.clients[from].isolated {
                continue;
            }
            let Some(signed) = self.clients[from].view.signed_assignment().cloned() else {
                continue;
            };
            for to in (0..n).filter(|t| *t != from) {
                if self.rng.chance(300) {
                    let at = self.now + self.delay() * 2;
                    self.net.push(
                        at,
                        Packet::Peer {
                            to,
                            signed: signed.clone(),
                        },
                    );
                }
            }
        }
    }

    fn set_isolated(&mut self, i: usize, isolated: bool) {
        if self.clients[i].isolated == isolated {
            return;
        }
        self.clients[i].isolated = isolated;
        let n = self.clients.len();
        for j in (0..n).filter(|j| *j != i) {
            let (pi, pj) = (self.clients[i].pid.clone(), self.clients[j].pid.clone());
            let (li, lj) = (
                self.clients[i].local(self.now),
                self.clients[j].local(self.now),
            );
            if isolated {
                self.clients[i].view.handle_peer_lost(li, &pj);
                self.clients[j].view.handle_peer_lost(lj, &pi);
            } else if !self.clients[j].isolated {
                self.clients[i].view.handle_peer_seen(li, pj);
                self.clients[j].view.handle_peer_seen(lj, pi);
            }
            self.pump(j);
        }
        self.pump(i);
    }

    fn act(&mut self) {
        let n = self.clients.len();
        let i = self.rng.below(n as u64) as usize;
        let local = self.clients[i].local(self.now);
        let f = self.faults;
        match self.rng.below(100) {
            0..=24 => {
                let _ = self.clients[i].view.command(
                    local,
                    action("poll.open"),
                    js(json!({ "at": self.now })),
                    None,
                );
            }
            25..=49 => {
                let n = self.clients[i].votes.len() as u64;
                if let Ok(id) = self.clients[i].view.command(
                    local,
                    action("vote"),
                    js(json!({ "by": i, "at": self.now, "n": n })),
                    None,
                ) {
                    self.clients[i].votes.insert(id, n);
                }
            }
            50..=55 => {
                let had = self.clients[i].view.has_authority(local);
                let to = self.clients[(i + 1) % n].pid.clone();
                let r = if self.rng.chance(500) {
                    self.clients[i].view.resign(local)
                } else {
                    self.clients[i].view.transfer(local, &to)
                };
                assert!(
                    r.is_err() || had,
                    "seed {}: resign/transfer without authority",
                    self.seed
                );
            }
            56..=64 if self.rng.chance(f.cut * 60) => {
                if self.clients[i].conn.is_some() {
                    if self.rng.chance(500) {
                        // Silent cut: neither side knows for a while.
                        self.clients[i].cut = true;
                    } else {
                        let after = self.rng.range(1, self.model.ttl * 2);
                        self.disconnect(i, after);
                    }
                }
            }
            65..=72 => {
                let c = &self.clients[i];
                if c.cut && self.rng.chance(300) {
                    let after = self.rng.range(1, self.model.ttl);
                    self.disconnect(i, after);
                } else if c.conn.is_none() {
                    self.connect(i);
                }
            }
            73..=74 if self.rng.chance(f.jump * 100) => {
                // The tab slept: the local clock leaps forward (the driver's clock is the
                // larger of the monotonic and the wall-clock deltas), and the driver notices,
                // or (half the time) does not: no lease may outlive the leap either way.
                let jump = self.rng.range(1, self.model.ttl * 3);
                let notice = self.rng.chance(500);
                let c = &mut self.clients[i];
                c.jumped += jump;
                let local = c.local(self.now);
                if notice {
                    c.view.handle_wake(local);
                }
            }
            75..=77 if self.rng.chance(f.partition * 100) => {
                let iso = !self.clients[i].isolated;
                self.set_isolated(i, iso);
            }
            81..=82 if self.rng.chance(f.admin * 100) => {
                // The app's backend reassigns the room (admin API): to a member it names, or to
                // whoever the election picks but the current host.
                let now = self.now;
                let m = &mut self.model;
                let others: Vec<(ParticipantId, SessionId)> = m
                    .members
                    .iter()
                    .filter(|x| m.current.session.as_ref() != Some(&x.session))
                    .map(|x| (x.id.clone(), x.session.clone()))
                    .collect();
                if !others.is_empty() && self.rng.chance(500) {
                    let to = others[self.rng.below(others.len() as u64) as usize].clone();
                    m.grant_to(now, Some(to), Reason::Admin);
                } else {
                    let current = m.current.session.clone();
                    m.grant(now, current.as_ref(), Reason::Admin);
                }
                self.flush_model();
            }
            78..=80 => {
                // A stale or replayed host command, sent raw, bypassing the SDK's gate.
                if !self.captured.is_empty() {
                    let k = self.rng.below(self.captured.len() as u64) as usize;
                    let (c, conn, msg) = self.captured[k].clone();
                    let msg = match msg {
                        ClientMsg::Command {
                            action,
                            payload,
                            epoch,
                            capability,
                            ..
                        } => ClientMsg::Command {
                            id: IdempotencyKey::new(format!("replay{}", self.rng.below(u64::MAX)))
                                .unwrap(),
                            action,
                            payload,
                            epoch,
                            capability,
                            after: None,
                        },
                        m => m,
                    };
                    self.net.push(
                        self.now + 1,
                        Packet::ToServer {
                            client: c,
                            conn,
                            msg,
                        },
                    );
                }
            }
            _ => {}
        }
        self.pump(i);
    }

    fn step(&mut self, dt: u64) {
        let end = self.now + dt;
        while self.now < end {
            self.now += 1;
            while let Some(p) = self.net.pop_due(self.now) {
                self.deliver(p);
            }
            self.check_split_brain();
            if self.now % 10 == 0 {
                self.model.tick(self.now);
                self.flush_model();
                for i in 0..self.clients.len() {
                    self.pump(i);
                }
                self.check_split_brain();
            }
            if self.now % 50 == 0 {
                self.relay();
            }
        }
    }

    /// Whether the server held a lease, at `now`, for the session and epoch `a` names: the only
    /// ground on which a client may act as host (checked against the model, not the core).
    fn server_lease_holds(&self, a: Option<&Assignment>) -> bool {
        a.and_then(|a| Some((a.session.as_ref()?, self.model.leases.get(&a.epoch)?)))
            .is_some_and(|(sid, (held, from, end))| {
                sid == held && *from <= self.now && self.now < *end
            })
    }

    /// At most one client holds host authority, and only within a lease the server held for
    /// its session in its epoch. Checked after every millisecond's deliveries and after every
    /// tick: a lease the model lets lapse and grants again (to the same session, in a new epoch)
    /// does not cover a client still acting in the old one.
    fn check_split_brain(&self) {
        let with_authority: Vec<&Client> = self
            .clients
            .iter()
            .filter(|c| c.view.has_authority(c.local(self.now)))
            .collect();
        assert!(
            with_authority.len() <= 1,
            "seed {}: split brain at t={}: {:?}",
            self.seed,
            self.now,
            with_authority
                .iter()
                .map(|c| c.pid.as_str())
                .collect::<Vec<_>>()
        );
        for c in with_authority {
            assert!(
                self.server_lease_holds(c.view.assignment()),
                "seed {}: {} acts as host at t={} in {:?} without the server's lease for it ({:?})",
                self.seed,
                c.pid.as_str(),
                self.now,
                c.view.assignment(),
                self.model.leases.last_key_value()
            );
        }
    }

    fn run(&mut self, steps: u64) {
        for i in 0..self.clients.len() {
            self.connect(i);
        }
        for _ in 0..steps {
            let dt = self.rng.range(1, 40);
            self.step(dt);
            if self.rng.chance(500) {
                self.act();
            }
        }
        // Heal: no more faults, everyone connected and reachable, time for leases to settle.
        self.healing = true;
        // Connections are dialled afresh once the network is back (frames dropped at the very
        // end of a stream cannot be noticed by anyone until something newer arrives).
        for i in 0..self.clients.len() {
            self.disconnect(i, 1);
            self.set_isolated(i, false);
        }
        self.step(self.model.ttl * 3);
        for i in 0..self.clients.len() {
            if self.clients[i].conn.is_none() {
                self.connect(i);
            }
        }
        self.step(self.model.ttl * 12);
        self.check_converged();
    }

    fn check_converged(&self) {
        let seed = self.seed;
        let log_events: Vec<u64> = self
            .model
            .log
            .iter()
            .filter_map(|i| match i {
                Item::Event(e) => Some(e.seq.0),
                _ => None,
            })
            .collect();
        for c in &self.clients {
            let v = &c.view;
            assert_eq!(v.phase(), Phase::Live, "seed {seed}: {} not live", c.pid);
            assert_eq!(
                v.epoch(),
                Some(self.model.epoch),
                "seed {seed}: {} not at the newest epoch",
                c.pid
            );
            assert_eq!(
                v.cursor(),
                self.model.seq,
                "seed {seed}: {} cursor behind",
                c.pid
            );
            assert_eq!(
                c.discontinuities, 0,
                "seed {seed}: the model never trims its log"
            );
            assert_eq!(
                c.applied, log_events,
                "seed {seed}: {} events not applied exactly once in order",
                c.pid
            );
            assert_eq!(
                v.pending().count(),
                0,
                "seed {seed}: {} has unresolved commands: {v:#?}",
                c.pid
            );
        }
        // Each vote the SDK did not report failed was counted exactly once, and no other: the
        // same votes (by client and number), not merely as many.
        let mut counted: HashMap<(String, u64), usize> = HashMap::new();
        for item in &self.model.log {
            if let Item::Event(e) = item {
                if e.action.as_str() == "vote" {
                    *counted
                        .entry((
                            e.actor.to_string(),
                            value(&e.payload)["n"].as_u64().unwrap(),
                        ))
                        .or_default() += 1;
                }
            }
        }
        assert!(
            counted.values().all(|n| *n == 1),
            "seed {seed}: a vote was counted twice"
        );
        let mut made: Vec<(String, u64)> = self
            .clients
            .iter()
            .flat_map(|c| {
                c.votes
                    .iter()
                    .filter(|(id, _)| !c.votes_failed.contains(*id))
                    .map(|(_, n)| (c.pid.to_string(), *n))
            })
            .collect();
        let mut got: Vec<(String, u64)> = counted.into_keys().collect();
        made.sort();
        got.sort();
        assert_eq!(got, made, "seed {seed}: votes lost or invented");
        // Liveness after healing: somebody hosts and holds authority.
        let host = self
            .clients
            .iter()
            .filter(|c| c.view.has_authority(c.local(self.now)))
            .count();
        if host != 1 {
            for c in &self.clients {
                eprintln!(
                    "{} named={} lease={:?} epoch={:?} phase={:?}",
                    c.pid,
                    c.view.is_named_host(),
                    c.view.lease(),
                    c.view.epoch(),
                    c.view.phase()
                );
            }
            eprintln!(
                "model: {:?} expires={} now={} nonces={:?} members={:?}",
                self.model.current,
                self.model.lease_expires,
                self.now,
                self.model.nonces,
                self.model
                    .members
                    .iter()
                    .map(|m| m.session.as_str())
                    .collect::<Vec<_>>()
            );
            for c in &self.clients {
                eprintln!(
                    "{} session={:?} cut={} conn={:?}",
                    c.pid,
                    c.view.session(),
                    c.cut,
                    c.conn
                );
            }
        }
        assert_eq!(host, 1, "seed {seed}: nobody holds authority after healing");
    }
}

fn run_seed(seed: u64) -> (u64, u64, u64) {
    let result = std::panic::catch_unwind(|| {
        let mut sim = Sim::new(seed);
        let steps = sim.rng.range(100, 300);
        sim.run(steps);
        let m = &sim.model;
        (m.accepted_host, m.rejected_host, m.forced_from_a_lease)
    });
    match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("simulation failed; reproduce with HOSTLEASE_SIM_SEED={seed}");
            std::panic::resume_unwind(e)
        }
    }
}

#[test]
fn seeded_schedules_keep_every_invariant() {
    if let Ok(seed) = std::env::var("HOSTLEASE_SIM_SEED") {
        let seed = seed.parse().expect("HOSTLEASE_SIM_SEED must be a u64");
        run_seed(seed);
        return;
    }
    let schedules: u64 = std::env::var("HOSTLEASE_SIM_SCHEDULES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let base: u64 = std::env::var("HOSTLEASE_SIM_BASE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x0004_0571_EA5E);
    let (mut accepted, mut rejected, mut forced) = (0, 0, 0);
    for k in 0..schedules {
        let (a, r, f) = run_seed(base.wrapping_add(k));
        accepted += a;
        rejected += r;
        forced += f;
    }
    println!(
        "simulation: {schedules} schedules, {accepted} host commands accepted, {rejected} stale \
         ones refused, {forced} admin reassigns of a host within its lease"
    );
    // The schedules must actually exercise both sides of the gate.
    assert!(
        accepted > schedules / 2,
        "too few host commands accepted: {accepted}"
    );
    assert!(
        rejected > schedules / 10,
        "too few stale host commands tried: {rejected}"
    );
    assert!(
        forced > schedules / 10,
        "too few hosts reassigned by force: {forced}"
    );
}
