//! Browser bindings (wasm32 only): a `#[wasm_bindgen]` driver around the core that owns the I/O
//! the core refuses to do — the WebSocket, timers, the monotonic clock with sleep detection, the
//! page lifecycle hooks and the reconnect supervisor.
//!
//! What crosses the boundary is JSON text: frames go to the core as the text the socket received
//! (decoded by the same codec as natively, with the same limits), and everything the core reports
//! leaves as one JSON array per step, handed to the wrapper's `emit` callback only after the step
//! has returned and the driver is no longer borrowed. The one exception is the common frame, a
//! room event: the wrapper's socket handler parses it with `JSON.parse`, checks its fields, and
//! tells the core only its seq (`eventSeq`); when that is the next one, the wrapper hands its own
//! object to the listeners, and otherwise it passes the frame's text here like any other. The
//! driver never calls an app listener: the JS wrapper fans events out, so a listener that throws
//! cannot break the SDK.

use crate::prelude::*;
use alloc::rc::{Rc, Weak};
use core::cell::RefCell;

use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use web_sys::WebSocket;

use crate::core::{
    Backoff, CommandError, Config, Event, HostView, Instant, LeaseState, Phase, SplitMix64,
};
use crate::protocol::json::{ToJson, Writer};
use crate::protocol::{
    self, codec, Action, Assignment, Epoch, IdempotencyKey, Json, ParticipantId, RoomEvent, Seq,
    SessionId, SignedAssignment, Token,
};

// Without std (the bundle), a panic traps at once, as it did with std and `panic = "abort"`, but
// without formatting a message first that nothing on wasm32-unknown-unknown could print.
#[cfg(feature = "bundle")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    core::arch::wasm32::unreachable()
}

// The browser build allocates with talc: smaller in the bundle than the default dlmalloc, and
// faster. The page is single-threaded (no `atomics`), which its cell relies on.
#[cfg(not(target_feature = "atomics"))]
#[global_allocator]
static ALLOCATOR: talc::wasm::WasmDynamicTalc = talc::wasm::new_wasm_dynamic_allocator();

/// A command payload or signalling body (JSON text), if it is JSON and leaves room in its frame
/// for the rest (`MAX_CLIENT_PAYLOAD`, `MAX_PAYLOAD_DEPTH`).
fn body(text: &str) -> Option<Json> {
    codec::decode_payload(text).ok()
}

/// The major wire-protocol version this build speaks.
#[wasm_bindgen(js_name = protocolVersion)]
pub fn protocol_version() -> u32 {
    protocol::PROTOCOL_VERSION
}

/// A wall-clock jump beyond the monotonic clock larger than this means the page slept or froze.
const SLEEP_THRESHOLD_MS: f64 = 2_000.0;
/// A wall-clock lead over the monotonic clock between two readings up to this is the clocks'
/// granularity, not time the monotonic clock missed: `Date.now()` counts whole milliseconds, and
/// a browser resisting fingerprinting coarsens both clocks to as much as 100 ms.
const WALL_GRAIN_MS: f64 = 250.0;

/// How long a connection must have stayed live for the reconnect backoff to start over.
const STAYED_LIVE_MS: u64 = 30_000;
/// How long a dial may take to open before it is given up and dialled again with backoff (a
/// connection whose upgrade is never answered: a SYN into a route that went away, a proxy that
/// never replies). The browser's own limit is minutes, and meanwhile nothing else would redial.
/// Fixed, as Ably's and Socket.IO's connect timeouts are: long enough for a TLS handshake over a
/// slow mobile link.
const DIAL_TIMEOUT_MS: u64 = 15_000;

/// Local time: `performance.now()`, plus whatever the wall clock advanced beyond it (a sleeping
/// machine stops `performance.now()` in some browsers). Never goes backwards.
struct Clock {
    /// `window.performance`, looked up once: every input reads the clock, and each lookup is
    /// three calls into JS.
    performance: Option<web_sys::Performance>,
    last_perf: f64,
    last_wall: f64,
    skew: f64,
    /// A sleep was seen and not yet handed to the core (see `take_slept`). Latched, so that a
    /// reading that does not step the core (`view()`, the timer) cannot lose it.
    slept: bool,
}

impl Clock {
    fn new(window: Option<&web_sys::Window>) -> Self {
        let performance = window.and_then(|w| w.performance());
        let last_perf = performance
            .as_ref()
            .map_or_else(js_sys::Date::now, |p| p.now());
        Self {
            performance,
            last_perf,
            last_wall: js_sys::Date::now(),
            skew: 0.0,
            slept: false,
        }
    }

    fn perf_now(&self) -> f64 {
        self.performance
            .as_ref()
            .map_or_else(js_sys::Date::now, |p| p.now())
    }

    /// The current instant.
    fn now(&mut self) -> Instant {
        self.observe(self.perf_now(), js_sys::Date::now())
    }

    /// Whether a sleep was seen since this was last asked (by any reading).
    fn take_slept(&mut self) -> bool {
        core::mem::take(&mut self.slept)
    }

    /// Elapsed time is the larger of the monotonic and the wall-clock deltas, but for a lead of
    /// the wall clock within its granularity (`WALL_GRAIN_MS`): readings a fraction of a
    /// millisecond apart see `Date.now()` lead by up to one, and summed, those leads made local
    /// time run up to twice as fast (expiring leases and timing commands out early).
    fn observe(&mut self, perf: f64, wall: f64) -> Instant {
        let lead = (wall - self.last_wall) - (perf - self.last_perf);
        self.slept |= lead > SLEEP_THRESHOLD_MS;
        if lead > WALL_GRAIN_MS {
            self.skew += lead;
        }
        self.last_perf = perf;
        self.last_wall = wall;
        Instant::from_millis((perf + self.skew).max(0.0) as u64)
    }
}

/// Every DOM callback of the driver: none reads its event, so all share one closure shim.
type Handler = Closure<dyn FnMut()>;

/// A page lifecycle listener, kept to be removed on `close`.
type Listener = (web_sys::EventTarget, &'static str, Handler);

/// The closures attached to one WebSocket; dropped (detached) when the socket is replaced.
struct Socket {
    ws: WebSocket,
    _open: Handler,
    _close: Handler,
}

impl Socket {
    /// Detaches every handler and closes the socket; the closures stay alive until dropped.
    fn detach(&self) {
        self.ws.set_onopen(None);
        self.ws.set_onmessage(None);
        self.ws.set_onclose(None);
        self.ws.set_onerror(None);
        let _ = self.ws.close();
    }
}

struct State {
    view: HostView,
    url: String,
    emit: js_sys::Function,
    /// The wrapper's message handler (see `Driver::new`), set as each socket's `onmessage`.
    on_message: js_sys::Function,
    socket: Option<Socket>,
    /// The previous socket, detached but kept until the next one replaces it: its handler may be
    /// the code running when it is retired, and a closure must not be dropped while it runs.
    retired: Option<Socket>,
    /// The join token for the connection being opened (used once, in the hello).
    token: Option<Token>,
    timer: Option<i32>,
    /// The instant `timer` is armed for.
    timer_at: Option<Instant>,
    timer_cb: Option<Handler>,
    /// A `pagehide` came since the last `pageshow`.
    pagehide_seen: bool,
    reconnect: Backoff,
    attempt: u32,
    /// When the connection last went live: the backoff starts over only after one that lasted
    /// [`STAYED_LIVE_MS`] (a server that welcomes and drops at once was redialled every 0–500
    /// ms for ever, by every client at the same time after a deploy).
    live_at: Option<Instant>,
    /// With no socket: when to ask for a token and dial. With a socket not yet open: when to
    /// give its dial up ([`DIAL_TIMEOUT_MS`]). `None` while connected, or while a token is awaited.
    reconnect_at: Option<Instant>,
    rng: SplitMix64,
    clock: Clock,
    /// The JSON array of the events not yet handed to `emit` (empty: none).
    out: Writer,
    closed: bool,
    lifecycle: Vec<Listener>,
    /// The page's `window` or a worker's global scope (`None` in Node: no timers, no hooks).
    window: Option<web_sys::Window>,
    /// Inputs the core was given (steps and applied events), counted: the view's JSON is
    /// written again only after one, or when the lease reads otherwise (see `Driver::view`).
    inputs: u32,
    /// What the last `view()` that wrote the JSON read (see there); `u64::MAX` before it.
    viewed: u64,
}

/// What the wrapper receives, one JSON object per event: `{"type": "<name>", ...}`; but for
/// `host`, `members`, `event`, `error` and `token_needed`, the rest is the payload of the
/// wrapper's listeners of that type as it is.
enum JsEvent<'a> {
    Connection {
        phase: &'static str,
    },
    Host {
        assignment: &'a Assignment,
        previous_epoch: Option<Epoch>,
        via: &'static str,
        signed: Option<&'a SignedAssignment>,
    },
    Provisional {
        coordinator: Option<&'a ParticipantId>,
    },
    Members,
    Lease {
        state: &'static str,
    },
    Event {
        event: &'a RoomEvent,
    },
    Discontinuity {
        from: Seq,
        to: Seq,
    },
    CommandQueued {
        id: &'a IdempotencyKey,
    },
    CommandAccepted {
        id: &'a IdempotencyKey,
        seq: Seq,
    },
    CommandFailed {
        id: &'a IdempotencyKey,
        code: &'static str,
        /// The server's rejection code when `code` is `Rejected`.
        reason: Option<&'static str>,
    },
    Error {
        code: &'static str,
        message: &'a str,
    },
    Signal {
        from: &'a ParticipantId,
        from_session: &'a SessionId,
        data: &'a Json,
    },
    /// The supervisor is about to reconnect: the wrapper must call `connect(token)`.
    TokenNeeded,
}

impl ToJson for JsEvent<'_> {
    fn write_json(&self, w: &mut Writer) {
        w.open();
        let ty = |w: &mut Writer, name: &str| w.field("type", name);
        match self {
            JsEvent::Connection { phase } => {
                ty(w, "connection");
                w.field("phase", *phase);
            }
            JsEvent::Host {
                assignment,
                previous_epoch,
                via,
                signed,
            } => {
                ty(w, "host");
                // The signed form when the view holds it (the same fields, and `kid`, `sig`).
                match signed {
                    Some(s) => w.field("assignment", *s),
                    None => w.field("assignment", *assignment),
                }
                w.field("previous_epoch", previous_epoch);
                w.field("via", *via);
            }
            JsEvent::Provisional { coordinator } => {
                ty(w, "provisional");
                w.field("coordinator", coordinator);
            }
            JsEvent::Members => ty(w, "members"),
            JsEvent::Lease { state } => {
                ty(w, "lease");
                w.field("state", *state);
            }
            JsEvent::Event { event } => {
                ty(w, "event");
                w.field("event", *event);
            }
            JsEvent::Discontinuity { from, to } => {
                ty(w, "discontinuity");
                w.field("from", from);
                w.field("to", to);
            }
            // The `command` listeners' payload as it is.
            JsEvent::CommandQueued { id } => {
                ty(w, "command");
                w.field("id", *id);
                w.field("state", "queued");
            }
            JsEvent::CommandAccepted { id, seq } => {
                ty(w, "command");
                w.field("id", *id);
                w.field("state", "accepted");
                w.field("seq", seq);
            }
            JsEvent::CommandFailed { id, code, reason } => {
                ty(w, "command");
                w.field("id", *id);
                w.field("state", "failed");
                w.field("code", *code);
                if let Some(r) = reason {
                    w.field("reason", *r);
                }
            }
            JsEvent::Error { code, message } => {
                ty(w, "error");
                w.field("code", *code);
                w.field("message", *message);
            }
            JsEvent::Signal {
                from,
                from_session,
                data,
            } => {
                ty(w, "signal");
                w.field("from", *from);
                w.field("fromSession", *from_session);
                w.field("data", *data);
            }
            JsEvent::TokenNeeded => ty(w, "token_needed"),
        }
        w.close();
    }
}

/// Appends an event to the array being built in `out`.
fn push_event(out: &mut Writer, e: &JsEvent<'_>) {
    if out.is_empty() {
        // One allocation for a step's events in the usual case, not a doubling series.
        *out = Writer::with_capacity(512);
        out.open_array();
    }
    e.write_json(out);
}

impl State {
    fn now(&mut self) -> Instant {
        let now = self.clock.now();
        if self.clock.take_slept() {
            self.view.handle_wake(now);
        }
        now
    }

    fn push(&mut self, e: JsEvent<'_>) {
        push_event(&mut self.out, &e);
    }

    /// Drains the core after an input: frames to the socket at once, events to `out` (a stalled
    /// connection is dropped, and what that makes is drained too), then the timer for the next
    /// timeout.
    fn drain(&mut self, weak: &Weak<RefCell<State>>) {
        while self.drain_once() {
            self.drop_socket();
        }
        self.arm_timer(weak);
    }

    /// One pass of [`drain`](Self::drain); `true`: the core gave up on the connection.
    fn drain_once(&mut self) -> bool {
        self.transmit();
        let mut stalled = false;
        while let Some(e) = self.view.poll_event() {
            match &e {
                Event::Phase(p) => {
                    // The connection's first: a resync on it does not start its count again.
                    if *p == Phase::Live {
                        self.live_at.get_or_insert(self.clock.now());
                    }
                    // Closed by the core itself (kicked, room closed): no reconnect.
                    self.closed |= *p == Phase::Closed;
                    self.push(JsEvent::Connection { phase: p.as_str() })
                }
                Event::HostChanged {
                    assignment,
                    previous,
                    via,
                } => {
                    let via = match via {
                        crate::core::Source::Server => "server",
                        crate::core::Source::Snapshot => "snapshot",
                        crate::core::Source::Peer => "peer",
                    };
                    let e = JsEvent::Host {
                        assignment,
                        previous_epoch: previous.as_ref().map(|p| p.epoch),
                        via,
                        signed: self
                            .view
                            .signed_assignment()
                            .filter(|s| s.assignment.epoch == assignment.epoch),
                    };
                    push_event(&mut self.out, &e);
                }
                Event::Provisional { coordinator } => self.push(JsEvent::Provisional {
                    coordinator: coordinator.as_ref(),
                }),
                Event::MembersChanged => self.push(JsEvent::Members),
                Event::Lease(l) => self.push(JsEvent::Lease { state: l.as_str() }),
                Event::RoomEvent(ev) => self.push(JsEvent::Event { event: ev }),
                Event::Discontinuity(g) => self.push(JsEvent::Discontinuity {
                    from: g.from,
                    to: g.to,
                }),
                Event::CommandQueued { id } => self.push(JsEvent::CommandQueued { id }),
                Event::CommandAccepted { id, seq } => {
                    self.push(JsEvent::CommandAccepted { id, seq: *seq })
                }
                Event::CommandFailed { id, error } => self.push(JsEvent::CommandFailed {
                    id,
                    code: error.code(),
                    reason: match error {
                        CommandError::Rejected(r) => Some(r.as_str()),
                        _ => None,
                    },
                }),
                Event::ProtocolViolation(_) => self.push(JsEvent::Error {
                    code: "ProtocolViolation",
                    message: "the server broke a protocol rule; the message was ignored",
                }),
                Event::Signal {
                    from,
                    from_session,
                    data,
                } => self.push(JsEvent::Signal {
                    from,
                    from_session,
                    data,
                }),
                Event::ServerError(code, message) => self.push(JsEvent::Error {
                    code: code.as_str(),
                    message,
                }),
                Event::Stalled => stalled = true,
            }
        }
        stalled
    }

    /// Sends what the core queued on the socket when it is open (a socket that is not drops it:
    /// the core resends what matters after the next welcome).
    fn transmit(&mut self) {
        while let Some(msg) = self.view.poll_transmit() {
            self.send(&msg);
        }
    }

    /// Sends `msg` on the socket if it is open; `true`: it went.
    fn send(&self, msg: &protocol::ClientMsg) -> bool {
        match &self.socket {
            Some(s) if s.ws.ready_state() == WebSocket::OPEN => {
                s.ws.send_with_str(&protocol::encode_client(msg)).is_ok()
            }
            _ => false,
        }
    }

    /// Keeps one browser timer at the earliest of the core's timeout and the reconnect time.
    /// Re-armed only when that instant changes; the one closure lives as long as the driver (it
    /// may be the code running when the timer is re-armed, so it is never replaced).
    fn arm_timer(&mut self, weak: &Weak<RefCell<State>>) {
        let next = [self.view.poll_timeout(), self.reconnect_at]
            .into_iter()
            .flatten()
            .min();
        if next == self.timer_at && (next.is_none() || self.timer.is_some()) {
            return;
        }
        let Some(window) = &self.window else {
            return;
        };
        if let Some(t) = self.timer.take() {
            window.clear_timeout_with_handle(t);
        }
        self.timer_at = next;
        let Some(next) = next else { return };
        let now = self.clock.now();
        let delay = next.ms_since(now).min(i32::MAX as u64) as i32;
        let cb = self.timer_cb.get_or_insert_with(|| {
            let weak = weak.clone();
            Handler::new(move || {
                if let Some(rc) = weak.upgrade() {
                    step(&rc, |s, _| {
                        s.timer = None;
                        s.timer_at = None;
                        let now = s.now();
                        if s.reconnect_at.is_some_and(|t| now >= t) {
                            s.reconnect_at = None;
                            if s.socket.is_some() {
                                // A dial that has not opened in time (see `open`).
                                s.drop_socket();
                            } else {
                                s.push(JsEvent::TokenNeeded);
                            }
                        }
                        s.view.handle_timeout(now);
                    });
                }
            })
        });
        if let Ok(id) = window.set_timeout_with_callback_and_timeout_and_arguments_0(
            cb.as_ref().unchecked_ref(),
            delay,
        ) {
            self.timer = Some(id);
        }
    }

    /// The connection is gone (closed, failed or stalled): tell the core, plan the reconnect.
    fn retire_socket(&mut self) {
        if let Some(s) = self.socket.take() {
            s.detach();
            self.retired = Some(s);
        }
    }

    /// Every caller is a step, whose drain reports what this makes and arms the timer.
    fn drop_socket(&mut self) {
        self.retire_socket();
        let now = self.now();
        self.view.handle_disconnected(now);
        if self
            .live_at
            .take()
            .is_some_and(|t| now >= t.add_ms(STAYED_LIVE_MS))
        {
            self.attempt = 0;
        }
        if !self.closed {
            let delay = self.reconnect.delay_ms(self.attempt, &mut self.rng);
            self.attempt = self.attempt.saturating_add(1);
            self.reconnect_at = Some(now.add_ms(delay));
        }
    }

    /// [`drop_socket`](Self::drop_socket) as a step's input (one copy of the step for the
    /// socket's `close` handler and `dropConnection`).
    fn dropped(&mut self, _: &Weak<RefCell<State>>) {
        self.drop_socket();
    }

    fn open(&mut self, weak: &Weak<RefCell<State>>) -> Result<(), JsValue> {
        self.retire_socket();
        let ws = WebSocket::new(&self.url)?;
        let w = weak.clone();
        let open = Handler::new(move || {
            if let Some(rc) = w.upgrade() {
                step(&rc, |s, _| {
                    let now = s.now();
                    s.reconnect_at = None;
                    let token = s.token.take().unwrap_or_else(|| Token::new(""));
                    s.view.handle_connected(now, token);
                });
            }
        });
        ws.set_onmessage(Some(&self.on_message));
        let w = weak.clone();
        let close = Handler::new(move || {
            if let Some(rc) = w.upgrade() {
                step(&rc, State::dropped);
            }
        });
        ws.set_onopen(Some(open.as_ref().unchecked_ref()));
        ws.set_onclose(Some(close.as_ref().unchecked_ref()));
        self.socket = Some(Socket {
            ws,
            _open: open,
            _close: close,
        });
        // While a socket is set, `reconnect_at` is its dial's deadline (cleared when it opens):
        // the timer gives it up then, and `online` at once.
        self.reconnect_at = Some(self.now().add_ms(DIAL_TIMEOUT_MS));
        Ok(())
    }

    /// One text frame from the server: decode (same codec and limits as natively), then the core.
    fn handle_frame(&mut self, text: &str) {
        let s = self;
        let now = s.now();
        match protocol::decode_server(text) {
            Ok(msg) => s.view.handle_server(now, msg),
            Err(protocol::DecodeError::UnknownType) => {} // a newer server's message
            Err(e) => s.push(JsEvent::Error {
                code: e.code(),
                message: "a frame from the server could not be decoded",
            }),
        }
    }

    fn hook_lifecycle(&mut self, weak: &Weak<RefCell<State>>) {
        let Some(window) = &self.window else {
            return;
        };
        let doc = window.document();
        for name in [
            "pagehide",
            "pageshow",
            "online",
            "offline",
            "visibilitychange",
        ] {
            let target: web_sys::EventTarget = if name == "visibilitychange" {
                // (Last in the list: `continue` here measured 17 bytes more brotli.)
                let Some(doc) = &doc else { break };
                doc.clone().into()
            } else {
                window.clone().into()
            };
            let w = weak.clone();
            let cb = Handler::new(move || {
                let Some(rc) = w.upgrade() else { return };
                // Becoming hidden changes nothing yet; coming back (and `pageshow`, `online`,
                // `offline`) means timers were throttled or frozen: the lease cannot be trusted.
                // Nor from a `pagehide`: the page is unloaded or frozen in the back-forward
                // cache (whose browser may close the socket, which the server takes for the
                // page leaving: a successor is granted at once), so that, brought back, it
                // reads as no host until the resync, whatever runs before `pageshow` is seen.
                // A `pageshow` is a return only after a `pagehide` (the back-forward cache
                // sends one first): the one after a first load, which may come after the tab
                // went live as host (and was hidden and shown again meanwhile), is not.
                {
                    let mut s = rc.borrow_mut();
                    if name == "visibilitychange"
                        && s.window
                            .as_ref()
                            .and_then(|w| w.document())
                            .is_some_and(|d| d.hidden())
                    {
                        return;
                    }
                    if name == "pageshow" && !core::mem::take(&mut s.pagehide_seen) {
                        return;
                    }
                    s.pagehide_seen |= name == "pagehide";
                }
                step(&rc, |s, _| {
                    let now = s.now();
                    s.view.handle_wake(now);
                    if name == "online" {
                        // The network is back: redial now rather than at the backoff or at the
                        // deadline of a dial begun on the old network (not while a token is
                        // awaited: that dial is on its way, and if it fails the next waits the
                        // first backoff, not the one the outage grew).
                        s.attempt = 0;
                        s.reconnect_at = s.reconnect_at.and(Some(now));
                    }
                });
            });
            if target
                .add_event_listener_with_callback(name, cb.as_ref().unchecked_ref())
                .is_ok()
            {
                self.lifecycle.push((target, name, cb));
            }
        }
    }
}

/// Runs one input against the state, drains it, then hands the events to `emit` with the
/// state no longer borrowed (so a listener may call back into the driver).
fn step(rc: &Rc<RefCell<State>>, f: impl FnOnce(&mut State, &Weak<RefCell<State>>)) {
    let weak = Rc::downgrade(rc);
    f(&mut rc.borrow_mut(), &weak);
    finish_step(rc, &weak);
}

/// The part of a step that is the same for every input (one copy in the wasm, not one per
/// closure).
fn finish_step(rc: &Rc<RefCell<State>>, weak: &Weak<RefCell<State>>) {
    let (emit, events) = {
        let mut s = rc.borrow_mut();
        // (Before the events go out: a listener reads the view as it is after the step.)
        s.inputs = s.inputs.wrapping_add(1);
        s.drain(weak);
        if s.out.is_empty() {
            return;
        }
        s.out.close_array();
        let events = core::mem::take(&mut s.out).finish();
        (s.emit.clone(), events)
    };
    // A throwing `emit` is the wrapper's bug, not the driver's: the state is already consistent.
    let _ = emit.call1(&JsValue::NULL, &JsValue::from_str(&events));
}

/// The browser driver of one room. Use it through the `hostlease` JS package.
#[wasm_bindgen]
pub struct Driver {
    inner: Rc<RefCell<State>>,
}

#[wasm_bindgen]
impl Driver {
    /// `url`: the room's WebSocket URL (no token in it). `emit(eventsJson)` receives every step's events. `seed`: 64 random bits for jitter and idempotency keys (from `crypto`). `onMessage`: the wrapper's handler for every socket's messages, which gives each frame to `eventSeq` or `handleFrame`. `window`: the page's `window` or a worker's global scope (`self`), or `undefined` in Node (then no timers and no lifecycle hooks).
    #[wasm_bindgen(constructor)]
    pub fn new(
        url: String,
        emit: js_sys::Function,
        seed_hi: u32,
        seed_lo: u32,
        on_message: js_sys::Function,
        window: Option<web_sys::Window>,
    ) -> Driver {
        let seed = (u64::from(seed_hi) << 32) | u64::from(seed_lo);
        let config = Config {
            seed,
            ..Config::default()
        };
        let state = State {
            view: HostView::new(config),
            url,
            emit,
            on_message,
            socket: None,
            retired: None,
            token: None,
            timer: None,
            timer_at: None,
            timer_cb: None,
            pagehide_seen: false,
            reconnect: Backoff {
                base_ms: 500,
                cap_ms: 15_000,
            },
            attempt: 0,
            live_at: None,
            reconnect_at: None,
            rng: SplitMix64::new(seed ^ 0xA5A5_A5A5_A5A5_A5A5),
            clock: Clock::new(window.as_ref()),
            out: Writer::new(),
            closed: false,
            lifecycle: Vec::new(),
            window,
            inputs: 0,
            viewed: u64::MAX,
        };
        let inner = Rc::new(RefCell::new(state));
        let weak = Rc::downgrade(&inner);
        inner.borrow_mut().hook_lifecycle(&weak);
        Driver { inner }
    }

    /// Opens a connection whose hello carries `token` (the first frame, never the URL).
    pub fn connect(&self, token: String) -> Result<(), JsValue> {
        let rc = &self.inner;
        let mut result = Ok(());
        step(rc, |s, w| {
            // (A second dial while one is open or opening, two token fetches in flight at once,
            // is not made: it would replace a connection the core was not told had closed.)
            if s.closed || s.socket.is_some() {
                return;
            }
            s.token = Some(Token::new(token));
            s.reconnect_at = None;
            if let Err(e) = s.open(w) {
                result = Err(e);
                s.drop_socket();
            }
        });
        result
    }

    /// Issues a command; `payload` is JSON text. Returns the idempotency key, or throws the
    /// error code as a string for the wrapper to turn into a `HostleaseError`.
    pub fn command(&self, action: String, payload: &str) -> Result<String, JsValue> {
        let action = Action::new(action).map_err(|_| JsValue::from_str("UnknownAction"))?;
        let payload = body(payload).ok_or_else(|| JsValue::from_str("BadPayload"))?;
        let mut result = Err(JsValue::from_str(CommandError::Closed.code()));
        step(&self.inner, |s, _| {
            let now = s.now();
            result = s
                .view
                .command(now, action, payload, None)
                .map(String::from)
                .map_err(|e| JsValue::from_str(e.code()));
        });
        result
    }

    /// A relayed assignment (JSON), already verified by the wrapper against the server's key.
    /// Returns whether it was adopted.
    #[wasm_bindgen(js_name = peerAssignment)]
    pub fn peer_assignment(&self, json: &str) -> bool {
        let Ok(a) = codec::decode_body::<SignedAssignment>(json, codec::MAX_CLIENT_FRAME) else {
            return false;
        };
        if codec::validate_assignment(&a.assignment).is_err() {
            return false;
        }
        let mut adopted = false;
        step(&self.inner, |s, _| {
            let now = s.now();
            adopted = s.view.handle_peer_assignment(now, a);
        });
        adopted
    }

    /// A peer became reachable over WebRTC (`seen`), or stopped being so.
    pub fn peer(&self, peer: &str, seen: bool) {
        if let Ok(p) = ParticipantId::new(peer) {
            step(&self.inner, |s, _| {
                let now = s.now();
                s.view.handle_peer(now, p, seen);
            });
        }
    }

    /// Sends signalling data (JSON) to another member through the server.
    pub fn signal(&self, to: &str, data: &str) -> bool {
        let (Ok(to), Some(data)) = (ParticipantId::new(to), body(data)) else {
            return false;
        };
        self.inner.borrow().send(&protocol::ClientMsg::Signal {
            to,
            to_session: None,
            data,
        })
    }

    /// The view as JSON, or `""` when nothing in it can have changed since the last call that
    /// wrote it: no input since, and the lease and `amHost` read the same now (they move with
    /// time alone). A member list of 1,000 made every read cost ~450 µs in Node, and the
    /// wrapper reads the view for every stamped message it checks.
    pub fn view(&self) -> String {
        let mut s = self.inner.borrow_mut();
        let now = s.clock.now();
        // A sleep seen and not yet handed to the core (the next step does: `lease: unknown`
        // and a resync) already reads as such: a lease held across it is not trusted.
        let slept = s.clock.slept;
        let lease = s.view.lease_at(now);
        let lease = if slept { lease.after_wake() } else { lease };
        let am_host = !slept && s.view.has_authority(now);
        // Between inputs, time changes only these: a lease past its deadline, a sleep, and the
        // authority they end.
        let read = u64::from(s.inputs) << 3
            | u64::from(matches!(lease, LeaseState::Expired)) << 2
            | u64::from(slept) << 1
            | u64::from(am_host);
        if s.viewed == read {
            return String::new();
        }
        s.viewed = read;
        let v = &s.view;
        let a = v.assignment();
        let mut w = Writer::new();
        w.open();
        w.field("phase", v.phase().as_str());
        w.field("host", &a.and_then(|a| a.host.as_ref()));
        w.field("hostSession", &a.and_then(|a| a.session.as_ref()));
        w.field("epoch", &v.epoch());
        w.field("me", &v.me());
        w.field("session", &v.session());
        w.field("amHost", &am_host);
        w.field("namedHost", &v.is_named_host());
        w.field("lease", lease.as_str());
        w.field("provisional", &v.provisional());
        w.field("members", v.members());
        w.field("cursor", &v.cursor());
        w.field("actions", v.actions());
        w.key("pending");
        w.open_array();
        for (id, action, queued) in v.pending() {
            w.open();
            w.field("id", id);
            w.field("action", action);
            w.field("queued", &queued);
            w.close();
        }
        w.close_array();
        w.field("signed", &v.signed_assignment());
        w.close();
        w.finish()
    }

    /// Test hook: the view as `view()` writes it, even when nothing changed since the last.
    #[cfg(test)]
    fn view_value(&self) -> serde_json::Value {
        self.inner.borrow_mut().viewed = u64::MAX;
        serde_json::from_str(&self.view()).unwrap()
    }

    /// Test hook: the core is told a connection opened (no socket is involved).
    #[cfg(test)]
    fn simulate_connected(&self) {
        step(&self.inner, |s, _| {
            let now = s.now();
            s.view.handle_connected(now, Token::new("simulated"));
        });
    }

    /// One server frame as text: decoded by the protocol codec (with its limits), then the
    /// core; the step's events go to `emit`.
    #[wasm_bindgen(js_name = handleFrame)]
    pub fn handle_frame(&self, text: &str) {
        step(&self.inner, |s, _| s.handle_frame(text));
    }

    /// A room event frame the wrapper decoded and checked itself, told by its seq (a safe
    /// integer). Returns `true` when the core applied it (it was the next in order, the view
    /// live): the wrapper then hands the event to the listeners. On `false` nothing changed and
    /// the wrapper must pass the frame to `handleFrame`.
    #[wasm_bindgen(js_name = eventSeq)]
    pub fn event_seq(&self, seq: f64) -> bool {
        // Anything but a safe integer is refused (the wrapper checks; this is the backstop).
        if !(0.0..=9_007_199_254_740_991.0).contains(&seq) || seq != (seq as u64) as f64 {
            return false;
        }
        // Not a whole step: the core needs no clock reading for an event, and taking one in
        // order queues nothing and moves no timeout (`tests/core_props.rs` checks both). A sleep
        // is still noticed before anything that needs time: the clock keeps it until the next
        // step's reading hands it to the core (`Clock::take_slept`).
        let mut s = self.inner.borrow_mut();
        s.inputs = s.inputs.wrapping_add(1);
        s.view.handle_event_seq(Seq(seq as u64))
    }

    /// Test hook: closes the socket as if the network dropped it.
    #[wasm_bindgen(js_name = dropConnection)]
    pub fn drop_connection(&self) {
        step(&self.inner, State::dropped);
    }

    /// Leaves the room (a host is replaced at once) and stops reconnecting.
    pub fn close(&self) {
        step(&self.inner, |s, w| {
            s.closed = true;
            let now = s.now();
            s.view.leave(now);
            // Send the leave before closing (a socket not open would drop it anyway: `send`
            // throws while connecting and discards once closing).
            s.transmit();
            s.retire_socket();
            s.reconnect_at = None;
            for (target, name, cb) in s.lifecycle.drain(..) {
                let _ =
                    target.remove_event_listener_with_callback(name, cb.as_ref().unchecked_ref());
            }
            let _ = w;
        });
    }
}

#[cfg(test)]
mod tests {
    //! Browser tests of the driver (headless Chromium through wasm-bindgen-test).
    use super::*;
    use std::cell::RefCell;
    use std::rc::Rc;
    use wasm_bindgen_test::{wasm_bindgen_test, wasm_bindgen_test_configure};

    wasm_bindgen_test_configure!(run_in_browser);

    #[wasm_bindgen_test]
    fn clock_takes_the_larger_delta_and_detects_sleep() {
        let mut c = Clock {
            performance: None,
            last_perf: 1000.0,
            last_wall: 5000.0,
            skew: 0.0,
            slept: false,
        };
        assert_eq!(c.observe(1100.0, 5100.0), Instant::from_millis(1100));
        assert!(!c.take_slept());
        // The machine slept 60 s: performance.now() barely moved, the wall clock did.
        let t = c.observe(1200.0, 65_200.0);
        assert_eq!(t, Instant::from_millis(1200 + 60_000));
        // A later reading (as `view()` takes) does not lose the sleep: it waits to be taken.
        c.observe(1250.0, 65_250.0);
        assert!(c.take_slept());
        assert!(!c.take_slept());
        // The wall clock set back: local time does not go backwards.
        let t2 = c.observe(1300.0, 1000.0);
        assert!(!c.take_slept());
        assert!(t2 > t);
    }

    /// Readings 0.4 ms apart for a second: `Date.now()` (whole milliseconds) leads the monotonic
    /// clock by up to 1 ms at each, which is its grain, not time missed: a second is a second
    /// (it was 1.6 s when every lead was added).
    #[wasm_bindgen_test]
    fn frequent_readings_do_not_make_the_clock_run_fast() {
        let mut c = Clock {
            performance: None,
            last_perf: 0.0,
            last_wall: 0.0,
            skew: 0.0,
            slept: false,
        };
        let mut t = Instant::ZERO;
        for i in 1..=2500 {
            let perf = 0.4 * f64::from(i);
            t = c.observe(perf, perf.floor());
        }
        assert_eq!(t, Instant::from_millis(1000));
        assert!(!c.take_slept());
    }

    #[wasm_bindgen_test]
    fn real_clock_is_monotonic() {
        let mut c = Clock::new(web_sys::window().as_ref());
        let a = c.now();
        let b = c.now();
        assert!(b >= a);
    }

    fn noop() -> js_sys::Function {
        js_sys::Function::new_no_args("")
    }

    fn collector() -> (js_sys::Function, Rc<RefCell<Vec<serde_json::Value>>>) {
        let seen = Rc::new(RefCell::new(Vec::new()));
        let s = seen.clone();
        let f = Closure::<dyn FnMut(String)>::new(move |json: String| {
            let v: Vec<serde_json::Value> = serde_json::from_str(&json).unwrap();
            s.borrow_mut().extend(v);
        });
        let func: js_sys::Function = f.as_ref().unchecked_ref::<js_sys::Function>().clone();
        f.forget();
        (func, seen)
    }

    /// A driver dialling `url` from this page, handing its events to `emit`; `seed`: its low
    /// 32 random bits.
    fn driver(url: &str, emit: js_sys::Function, seed: u32) -> Driver {
        Driver::new(url.into(), emit, 0, seed, noop(), web_sys::window())
    }

    /// The server's host capability for epoch 1 (`poll.open`), lasting `expires_in_ms`.
    fn host_token(d: &Driver, expires_in_ms: u64) {
        d.handle_frame(&protocol::encode_server(&protocol::ServerMsg::Capability {
            role: crate::protocol::Role::Host,
            token: Token::new("host-token"),
            epoch: Some(Epoch(1)),
            actions: vec![Action::new("poll.open").unwrap()],
            expires_in_ms,
        }));
    }

    async fn sleep(ms: i32) {
        let p = js_sys::Promise::new(&mut |resolve, _| {
            web_sys::window()
                .unwrap()
                .set_timeout_with_callback_and_timeout_and_arguments_0(&resolve, ms)
                .unwrap();
        });
        wasm_bindgen_futures::JsFuture::from(p).await.unwrap();
    }

    fn has(events: &[serde_json::Value], ty: &str, key: &str, val: &str) -> bool {
        events
            .iter()
            .any(|e| e["type"] == ty && (key.is_empty() || e[key] == val))
    }

    #[wasm_bindgen_test]
    async fn an_unreachable_server_goes_offline_and_the_supervisor_asks_for_a_token() {
        let (emit, seen) = collector();
        // Port 9 on loopback: nothing listens, the socket fails at once.
        let d = driver("ws://127.0.0.1:9/v1/rooms/r/ws", emit, 2);
        d.connect("join-token".into()).unwrap();
        for _ in 0..100 {
            if has(&seen.borrow(), "token_needed", "", "") {
                break;
            }
            sleep(50).await;
        }
        let events = seen.borrow().clone();
        assert!(has(&events, "connection", "phase", "offline"), "{events:?}");
        assert!(
            has(&events, "token_needed", "", ""),
            "the supervisor never asked to reconnect: {events:?}"
        );
        // The wrapper is fetching a token (no `connect` yet): `online` must not start a second
        // dial beside it.
        let window = web_sys::window().unwrap();
        window
            .dispatch_event(&web_sys::Event::new("online").unwrap())
            .unwrap();
        sleep(300).await;
        let asked = seen
            .borrow()
            .iter()
            .filter(|e| e["type"] == "token_needed")
            .count();
        assert_eq!(asked, 1, "{:?}", seen.borrow());
        // But the backoff the outage grew starts over: if that dial fails, the next waits the
        // first step, not up to 15 s after the network came back.
        assert_eq!(d.inner.borrow().attempt, 0);
        let view = d.view_value();
        assert_eq!(view["phase"], "offline");
        assert_eq!(view["amHost"], false);
        d.close();
        assert_eq!(d.view_value()["phase"], "closed");
    }

    /// The reconnect backoff starts over only after a connection that stayed live for 30 s: a
    /// server that welcomes and drops at once is not redialled within 500 ms for ever.
    #[wasm_bindgen_test]
    fn the_backoff_starts_over_only_after_a_connection_that_lasted() {
        let d = driver("ws://127.0.0.1:9/ws", noop(), 6);
        let welcome = r#"{"v":1,"t":"welcome","you":"me","session":"me-s","missed":[],"snapshot":{"room":"r","current":{"room":"r","host":null,"session":null,"epoch":0,"seq":0,"lease_ms":0,"reason":"elected","issued_at":0},"members":[],"seq":0,"server_time":0,"lease_remaining_ms":0,"actions":{"host":[],"participant":["vote"]}}}"#;
        let live_then_dropped = |lasted_ms: f64| {
            d.simulate_connected();
            d.handle_frame(welcome);
            let mut s = d.inner.borrow_mut();
            assert_eq!(s.view.phase(), Phase::Live);
            s.clock.skew += lasted_ms; // the connection stays up this long
            s.drop_socket();
            s.attempt
        };
        assert_eq!(live_then_dropped(0.0), 1);
        assert_eq!(
            live_then_dropped(10.0),
            2,
            "dropped at once: the backoff grows"
        );
        assert_eq!(live_then_dropped(5_000.0), 3);
        assert_eq!(live_then_dropped(31_000.0), 1, "lasted 31 s: starts over");
        assert_eq!(live_then_dropped(0.0), 2);
        // 29 s live, then a resync on the same connection (a gap, the welcome that fills it),
        // then 2 s more: the connection lasted 31 s.
        d.simulate_connected();
        d.handle_frame(welcome);
        d.inner.borrow_mut().clock.skew += 29_000.0;
        d.handle_frame(r#"{"v":1,"t":"event","seq":2,"epoch":0,"actor":"p1","action":"vote","payload":{},"at":2}"#);
        assert_ne!(
            d.inner.borrow().view.phase(),
            Phase::Live,
            "the gap resyncs"
        );
        d.handle_frame(&welcome.replace(r#""seq":0,"server_time""#, r#""seq":2,"server_time""#));
        let mut s = d.inner.borrow_mut();
        assert_eq!(s.view.phase(), Phase::Live);
        s.clock.skew += 2_000.0;
        s.drop_socket();
        assert_eq!(s.attempt, 1, "lasted 31 s across a resync: starts over");
        drop(s);
        d.close();
    }

    /// Every dial has a deadline of 15 s, whatever came before it (the timer gives the dial up
    /// then: see the browser test with a proxy that never answers).
    #[wasm_bindgen_test]
    fn every_dial_has_a_deadline() {
        let d = driver("ws://127.0.0.1:9/ws", noop(), 8);
        let mut deadlines = Vec::new();
        for _ in 0..3 {
            d.connect("t".into()).unwrap();
            let mut s = d.inner.borrow_mut();
            let now = s.clock.now();
            let at = s.reconnect_at.expect("a dial has a deadline");
            assert!(s.socket.is_some());
            // Rounded to seconds: the clock moves on between the two readings.
            deadlines.push((at.ms_since(now) + 500) / 1000);
            s.drop_socket(); // as the timer does at the deadline
            assert!(
                s.socket.is_none() && s.reconnect_at.is_some(),
                "a backoff wait follows"
            );
        }
        assert_eq!(deadlines, [15, 15, 15]);
        d.close();
    }

    /// A second `connect` while a dial is open or opening (two token fetches in flight at once:
    /// an `online` event while `getToken` answered slowly) makes no second socket: it replaced
    /// the first without the core being told that one had closed, and the core kept the session
    /// and host token of a connection that was gone.
    #[wasm_bindgen_test]
    fn a_second_dial_while_one_is_open_or_opening_is_not_made() {
        let d = driver("ws://127.0.0.1:9/ws", noop(), 8);
        let socket = |d: &Driver| -> JsValue {
            d.inner
                .borrow()
                .socket
                .as_ref()
                .expect("dialled")
                .ws
                .clone()
                .into()
        };
        d.connect("t".into()).unwrap();
        let first = socket(&d);
        d.connect("t".into()).unwrap();
        assert!(
            js_sys::Object::is(&first, &socket(&d)),
            "the first dial was replaced"
        );
        d.close();
    }

    /// `view().lease` reads `expired` once the deadline has passed, before the timer that
    /// records it has run (here: the clock moved on within one task, which no timer can
    /// interrupt).
    #[wasm_bindgen_test]
    fn the_view_reads_an_expired_lease_before_the_timer_runs() {
        let d = driver("ws://127.0.0.1:9/ws", noop(), 5);
        d.simulate_connected();
        // This session is the host with 60 s of lease left: held for 60,000·0.99 − 250 ms.
        d.handle_frame(r#"{"v":1,"t":"welcome","you":"me","session":"me-s","missed":[],"snapshot":{"room":"r","current":{"room":"r","host":"me","session":"me-s","epoch":1,"seq":1,"lease_ms":60000,"reason":"elected","issued_at":0},"members":[],"seq":1,"server_time":0,"lease_remaining_ms":60000,"actions":{"host":[],"participant":["vote"]}}}"#);
        // Read as the wrapper reads it: `""` while nothing in it can have changed.
        let lease = || -> Option<String> {
            let json = d.view();
            let view: serde_json::Value = serde_json::from_str(&json).ok()?;
            Some(view["lease"].as_str().unwrap().to_owned())
        };
        assert_eq!(lease().as_deref(), Some("held"));
        assert_eq!(d.view(), "", "written again with nothing changed");
        // Time alone changes the lease: written again, with no step between.
        d.inner.borrow_mut().clock.skew += 60_000.0;
        assert_eq!(lease().as_deref(), Some("expired"));
        assert_eq!(d.view(), "");
        // Any input may change it (here, a heartbeat changes nothing: the wrapper compares).
        d.handle_frame(r#"{"v":1,"t":"heartbeat"}"#);
        assert_eq!(lease().as_deref(), Some("expired"));
        // And so does an event told by its seq (the cursor).
        assert!(d.event_seq(2.0));
        assert_eq!(d.view_value()["cursor"], 2);
        assert!(d.event_seq(3.0));
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&d.view()).unwrap()["cursor"],
            3
        );
    }

    /// A sleep the clock has seen reads as an unknown lease without authority at once, before
    /// the step that hands it to the core (and announces it) has run.
    #[wasm_bindgen_test]
    fn the_view_reads_a_sleep_before_the_next_step() {
        let (emit, seen) = collector();
        let d = driver("ws://127.0.0.1:9/ws", emit, 7);
        d.simulate_connected();
        d.handle_frame(r#"{"v":1,"t":"welcome","you":"me","session":"me-s","missed":[],"snapshot":{"room":"r","current":{"room":"r","host":"me","session":"me-s","epoch":1,"seq":1,"lease_ms":60000,"reason":"elected","issued_at":0},"members":[],"seq":1,"server_time":0,"lease_remaining_ms":60000,"actions":{"host":["poll.open"],"participant":["vote"]}}}"#);
        host_token(&d, 60_000);
        let view = || d.view_value();
        assert_eq!(
            (view()["amHost"].clone(), view()["lease"].clone()),
            (true.into(), "held".into())
        );
        // The wall clock ran 5 s ahead of the monotonic one (a sleep), well within the lease.
        d.inner.borrow_mut().clock.last_wall -= 5_000.0;
        assert_eq!(
            (view()["amHost"].clone(), view()["lease"].clone()),
            (false.into(), "unknown".into())
        );
        seen.borrow_mut().clear();
        // The next step hands the sleep to the core, which says so.
        d.handle_frame(r#"{"v":1,"t":"heartbeat"}"#);
        assert!(
            has(&seen.borrow(), "lease", "state", "unknown"),
            "{:?}",
            seen.borrow()
        );
        assert_eq!(view()["lease"], "unknown");
        d.close();
    }

    /// Between inputs, `view()` writes the view again when time alone changes what it reads: a
    /// sleep seen (the lease `unknown`, authority or none) and a host token run out (`amHost`
    /// false, the lease still held); otherwise it returns `""`.
    #[wasm_bindgen_test]
    fn the_view_is_written_again_when_time_alone_changes_it() {
        let welcome = r#"{"v":1,"t":"welcome","you":"me","session":"me-s","missed":[],"snapshot":{"room":"r","current":{"room":"r","host":"me","session":"me-s","epoch":1,"seq":1,"lease_ms":60000,"reason":"elected","issued_at":0},"members":[],"seq":1,"server_time":0,"lease_remaining_ms":60000,"actions":{"host":["poll.open"],"participant":["vote"]}}}"#;
        let read = |d: &Driver| -> Option<(bool, String)> {
            let view: serde_json::Value = serde_json::from_str(&d.view()).ok()?;
            Some((
                view["amHost"].as_bool().unwrap(),
                view["lease"].as_str().unwrap().to_owned(),
            ))
        };
        // Named host, no host token yet: a sleep changes the lease alone.
        let d = driver("ws://127.0.0.1:9/ws", noop(), 11);
        d.simulate_connected();
        d.handle_frame(welcome);
        assert_eq!(read(&d), Some((false, "held".into())));
        assert_eq!(read(&d), None, "written again with nothing changed");
        d.inner.borrow_mut().clock.last_wall -= 5_000.0;
        assert_eq!(read(&d), Some((false, "unknown".into())));
        d.close();
        // A host token that runs out before the lease: `amHost` alone changes.
        let d = driver("ws://127.0.0.1:9/ws", noop(), 12);
        d.simulate_connected();
        d.handle_frame(welcome);
        host_token(&d, 1_000);
        assert_eq!(read(&d), Some((true, "held".into())));
        assert_eq!(read(&d), None);
        d.inner.borrow_mut().clock.skew += 2_000.0;
        assert_eq!(read(&d), Some((false, "held".into())));
        d.close();
    }

    /// An event told by its seq is applied when it is the next one of a live view, and then
    /// nothing goes to `emit` (the wrapper delivers it); otherwise nothing changes, and the
    /// frame's text takes the codec's path: a gap resyncs, the welcome releases the buffered
    /// events in seq order, a stale frame is dropped.
    #[wasm_bindgen_test]
    fn an_event_told_by_its_seq_is_applied_only_in_order() {
        let (emit, seen) = collector();
        let take = || core::mem::take(&mut *seen.borrow_mut());
        let events = |got: &[serde_json::Value]| -> Vec<u64> {
            got.iter()
                .filter(|e| e["type"] == "event")
                .map(|e| e["event"]["seq"].as_u64().unwrap())
                .collect()
        };
        let welcome = |seq: u64| {
            format!(
                r#"{{"v":1,"t":"welcome","you":"me","session":"me-s","missed":[],"snapshot":{{"room":"r","current":{{"room":"r","host":null,"session":null,"epoch":0,"seq":0,"lease_ms":5000,"reason":"elected","issued_at":0}},"members":[],"seq":{seq},"server_time":0,"actions":{{"host":[],"participant":["vote"]}}}}}}"#
            )
        };
        let ev = |seq: u64| {
            format!(
                r#"{{"v":1,"t":"event","seq":{seq},"epoch":1,"actor":"p1","action":"vote","payload":{{"option":{seq}}},"at":{seq}}}"#
            )
        };
        let d = driver("ws://127.0.0.1:9/ws", emit, 1);
        d.simulate_connected();
        assert!(!d.event_seq(1.0), "not live before the welcome");
        d.handle_frame(&welcome(0));
        assert!(take().iter().any(|e| e["type"] == "members"));

        assert!(d.event_seq(1.0));
        assert_eq!(take(), Vec::<serde_json::Value>::new());
        for bad in [2.5, -2.0, f64::NAN, 1e300] {
            assert!(!d.event_seq(bad), "{bad}");
        }

        // A gap: refused by seq, then the frame: seq 3 is held back and the view resyncs.
        assert!(!d.event_seq(3.0));
        d.handle_frame(&ev(3));
        let got = take();
        assert!(!got.is_empty() && events(&got).is_empty(), "{got:?}");
        assert!(!d.event_seq(2.0), "resyncing");
        d.handle_frame(&ev(2));
        assert_eq!(
            events(&take()),
            [0u64; 0],
            "nothing delivered while resyncing"
        );
        d.handle_frame(&welcome(1));
        assert_eq!(events(&take()), [2, 3]);

        assert!(!d.event_seq(3.0), "a stale seq");
        d.handle_frame(&ev(3));
        assert_eq!(events(&take()), [0u64; 0], "a stale frame");
        assert!(d.event_seq(4.0));
    }

    /// A command the server refuses with a code of its own fails `Rejected`, and the server's
    /// code goes to the wrapper as `reason`; the other failures carry none.
    #[wasm_bindgen_test]
    fn a_server_rejection_carries_its_reason() {
        use crate::protocol::{
            Action, IdempotencyKey, Outcome, RejectCode, Role, ServerMsg, Token,
        };
        let (emit, seen) = collector();
        let d = driver("ws://127.0.0.1:9/ws", emit, 3);
        d.simulate_connected();
        d.handle_frame(
            r#"{"v":1,"t":"welcome","you":"me","session":"me-s","missed":[],"snapshot":{"room":"r","current":{"room":"r","host":null,"session":null,"epoch":0,"seq":0,"lease_ms":5000,"reason":"elected","issued_at":0},"members":[],"seq":0,"server_time":0,"actions":{"host":[],"participant":["vote"]}}}"#,
        );
        d.handle_frame(&protocol::encode_server(&ServerMsg::Capability {
            role: Role::Participant,
            token: Token::new("participant-token"),
            epoch: None,
            actions: vec![Action::new("vote").unwrap()],
            expires_in_ms: 600_000,
        }));
        let failed = |id: &str, code| {
            d.handle_frame(&protocol::encode_server(&ServerMsg::CommandResult {
                id: IdempotencyKey::new(id).unwrap(),
                outcome: Outcome::Rejected {
                    code,
                    current: None,
                    retry_after_ms: None,
                },
            }));
            let got = seen.borrow();
            got.iter()
                .rfind(|e| e["type"] == "command" && e["state"] == "failed" && e["id"] == id)
                .cloned()
                .unwrap_or_else(|| panic!("no failed command for {id}: {got:?}"))
        };
        let id = d.command("vote".into(), "1").unwrap();
        let e = failed(&id, RejectCode::BadRequest);
        assert_eq!(
            (&e["code"], &e["reason"]),
            (&"Rejected".into(), &"bad_request".into())
        );
        let id = d.command("vote".into(), "2").unwrap();
        let e = failed(&id, RejectCode::BadCapability);
        assert_eq!(e["code"], "NoCapability");
        assert!(e.get("reason").is_none(), "{e}");
    }

    #[wasm_bindgen_test]
    fn errors_are_codes_for_the_wrapper() {
        let (emit, _) = collector();
        let d = driver("ws://127.0.0.1:9/ws", emit, 7);
        let code = |r: Result<String, JsValue>| r.unwrap_err().as_string().unwrap();
        // No table yet: it waits for the server's (see core_table's
        // commands_made_before_the_first_snapshot_are_classified_when_the_table_comes).
        assert_eq!(d.command("poll.open".into(), "{}").unwrap().len(), 32);
        assert_eq!(
            code(d.command("not an action".into(), "{}")),
            "UnknownAction"
        );
        assert_eq!(
            code(d.command("host.resign".into(), "{not json")),
            "BadPayload"
        );
        assert_eq!(
            code(d.command("host.resign".into(), "null")),
            "NotAuthoritative"
        );
        // Nested past MAX_PAYLOAD_DEPTH: the frame carrying it would be too deep for the
        // server to read (it closes the connection), so it is refused here.
        let deep = |n: usize| "[".repeat(n) + &"]".repeat(n);
        assert_eq!(
            code(d.command("host.resign".into(), &deep(65))),
            "BadPayload"
        );
        assert_eq!(
            code(d.command("host.resign".into(), &deep(64))),
            "NotAuthoritative"
        );
        assert!(!d.signal("peer", &deep(65)));
        assert!(!d.peer_assignment("{}"));
        d.close();
        assert_eq!(code(d.command("host.resign".into(), "null")), "Closed");
    }
}
