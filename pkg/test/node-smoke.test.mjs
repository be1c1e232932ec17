// Packaging smoke test in Node ESM: importing must not crash without a browser, the init guard
// must refuse use before init with a typed error, and the module must load from its bytes.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";

const hl = await import("hostlease");

// Node 20 has no WebSocket: rooms made here dial this stand-in, which never opens (the tests
// below are about the wrapper, not the network; the browser tests use real sockets).
class NeverOpens {
  static throwing = null; // set to an Error to make the constructor throw it
  constructor(url) {
    if (NeverOpens.throwing) throw NeverOpens.throwing;
    NeverOpens.last = url;
    NeverOpens.instance = this;
    this.url = url;
    this.readyState = 0;
  }
  send() {}
  close() {
    this.readyState = 3;
  }
}
globalThis.WebSocket ??= NeverOpens;

test("the package imports in Node without a browser", () => {
  for (const name of ["init", "connect", "fetchInbox", "version", "HostleaseError", "UsageError", "CommandError", "ErrorCode"]) {
    assert.ok(name in hl, `missing export ${name}`);
  }
});

test("use before init throws a UsageError with a code", async () => {
  assert.throws(() => hl.version(), (e) => e instanceof hl.UsageError && e instanceof hl.HostleaseError
    && e instanceof Error && e.code === "NotInitialized");
  await assert.rejects(hl.connect({ url: "ws://127.0.0.1:9", room: "r", token: "t" }),
    (e) => e instanceof hl.HostleaseError && e.code === "NotInitialized");
});

test("init loads the wasm from its bytes; bad arguments are typed errors", async () => {
  const bytes = await readFile(new URL("../wasm/hostlease_bg.wasm", import.meta.url));
  await hl.init(bytes);
  assert.equal(hl.version(), 1);
  await assert.rejects(hl.connect({ room: "r" }), (e) => e instanceof hl.UsageError && e.code === "BadArgument");
  await assert.rejects(hl.connect({ url: "ws://x", room: "r" }), (e) => e.code === "BadArgument");
});

test("connect refuses what it cannot use, and a room refuses what JSON cannot hold, with typed errors", async () => {
  for (const url of ["/relative", "ftp://127.0.0.1/x", "not a url"]) {
    await assert.rejects(hl.connect({ url, room: "r", token: "t" }), (e) => e instanceof hl.UsageError && e.code === "BadArgument", url);
  }
  await assert.rejects(hl.fetchInbox({ url: "/relative", room: "r", token: "t" }), (e) => e instanceof hl.UsageError && e.code === "BadArgument");
  // A room name the server would refuse the socket for (it would be retried for ever).
  for (const room of ["Lunch room", "café", "", "r".repeat(129), "a/b", ".", ".."]) {
    await assert.rejects(hl.connect({ url: "ws://127.0.0.1:9", room, token: "t" }), (e) => e instanceof hl.UsageError && e.code === "BadArgument", room);
    await assert.rejects(hl.fetchInbox({ url: "ws://127.0.0.1:9", room, token: "t" }), (e) => e instanceof hl.UsageError && e.code === "BadArgument", room);
  }
  // A getToken that is not a function, even beside a token (given both, getToken is used).
  for (const getToken of ["oops", 1, {}]) {
    await assert.rejects(hl.connect({ url: "ws://127.0.0.1:9", room: "r", token: "t", getToken }),
      (e) => e instanceof hl.UsageError && e.code === "BadArgument", String(getToken));
  }
  // No join token, no room: connect() itself fails (no `error` listener could exist yet).
  const down = new Error("backend down");
  await assert.rejects(hl.connect({ url: "ws://127.0.0.1:9", room: "r", getToken: () => { throw down; } }),
    (e) => e instanceof hl.ConnectionError && e.code === "TokenUnavailable" && e.cause === down);
  await assert.rejects(hl.connect({ url: "ws://127.0.0.1:9", room: "r", getToken: async () => ({ token: null }) }),
    (e) => e instanceof hl.ConnectionError && e.code === "TokenUnavailable");

  const room = await hl.connect({ url: "ws://127.0.0.1:9", room: "r", token: "t" });
  try {
    for (const bad of [() => 1, Symbol("s"), 1n]) {
      await assert.rejects(room.command("vote", bad), (e) => e instanceof hl.CommandError && e.code === "BadPayload");
      assert.throws(() => room.signal("peer", bad), (e) => e instanceof hl.UsageError && e.code === "BadArgument");
    }
    // Longer than 60,416 bytes of JSON text: a frame the server would refuse, so refused here.
    const big = "x".repeat(60_415);
    await assert.rejects(room.command("vote", big), (e) => e instanceof hl.CommandError && e.code === "BadPayload");
    assert.equal(room.signal("peer", big), false);
    // Nested deeper than 64: the frame carrying it would be too deep for the server to read.
    const deep = (n) => Array.from({ length: n }).reduce((v) => [v], 0);
    await assert.rejects(room.command("vote", deep(65)), (e) => e instanceof hl.CommandError && e.code === "BadPayload");
    assert.equal(room.signal("peer", deep(65)), false);
    const cyclic = {};
    cyclic.self = cyclic;
    await assert.rejects(room.command("vote", cyclic), (e) => e.code === "BadPayload");
    // An action that cannot be made a string is the caller's, not a refusal by the server.
    const action = { toString() { throw new Error("no"); } };
    await assert.rejects(room.command(action), (e) => e instanceof hl.CommandError && e.code === "BadArgument");
    assert.equal(room.signal("peer", undefined), false, "not connected: nothing sent, nothing thrown");
  } finally {
    room.close();
  }
});

test("connect() with an AbortSignal: aborted before it resolves, it rejects Closed and dials nothing; after, the room closes", async () => {
  await hl.init(await readFile(new URL("../wasm/hostlease_bg.wasm", import.meta.url)));
  const url = "ws://127.0.0.1:9";
  const reason = new Error("unmounted");
  const aborted = (e) => e instanceof hl.ConnectionError && e.code === "Closed" && e.cause === reason;
  // Aborted already: no token asked for, no socket.
  NeverOpens.instance = null;
  let tokens = 0;
  await assert.rejects(hl.connect({ url, room: "r", getToken: () => (tokens++, "t"), signal: AbortSignal.abort(reason) }), aborted);
  assert.equal(tokens, 0, "getToken() asked for an aborted connect()");
  assert.equal(NeverOpens.instance, null, "no socket for an aborted connect()");
  // Aborted while getToken() is under way: rejected once it answers, and nothing dialled.
  const ac = new AbortController();
  let answer, asked;
  const asking = new Promise((resolve) => (asked = resolve));
  const getToken = () => new Promise((ok) => { answer = ok; asked(); });
  const connecting = hl.connect({ url, room: "r", getToken, signal: ac.signal });
  await asking;
  ac.abort(reason);
  answer("t");
  await assert.rejects(connecting, aborted);
  assert.equal(NeverOpens.instance, null, "no socket once aborted");
  // Aborted after it resolved: the room closes, as room.close() would.
  const later = new AbortController();
  const room = await hl.connect({ url, room: "r", token: "t", signal: later.signal });
  assert.ok(NeverOpens.instance, "dialled");
  const phases = [];
  room.on("connection", ({ phase }) => phases.push(phase));
  later.abort();
  assert.deepEqual(phases, ["closed"]);
  assert.equal(room.view.phase, "closed");
  await assert.rejects(room.command("vote", 1), (e) => e instanceof hl.CommandError && e.code === "Closed");
});

test("signal() sends to a participant id only: not to one made of undefined or a number", async () => {
  await hl.init(await readFile(new URL("../wasm/hostlease_bg.wasm", import.meta.url)));
  const room = await hl.connect({ url: "ws://127.0.0.1:9", room: "r", token: "t" });
  const ws = NeverOpens.instance;
  const sent = [];
  ws.send = (m) => sent.push(JSON.parse(m));
  ws.readyState = 1;
  ws.onopen?.({});
  try {
    sent.length = 0; // the join
    for (const to of [undefined, null, 7, { toString: () => "peer" }, "two words"]) {
      assert.equal(room.signal(to, { sdp: "x" }), false, String(to));
    }
    assert.deepEqual(sent, []);
    assert.equal(room.signal("peer", { sdp: "x" }), true);
    assert.deepEqual(sent.map((m) => [m.t, m.to]), [["signal", "peer"]]);
  } finally {
    room.close();
  }
});

test("a members listener gets a list of its own: reordering it leaves room.view alone", async () => {
  await hl.init(await readFile(new URL("../wasm/hostlease_bg.wasm", import.meta.url)));
  const room = await hl.connect({ url: "ws://127.0.0.1:9", room: "r", token: "t" });
  const ws = NeverOpens.instance;
  const heard = [];
  room.on("members", ({ members }) => heard.push(members.reverse().map((m) => m.id)));
  ws.readyState = 1;
  ws.onopen?.({});
  const member = (id, join_seq) => ({ id, session: `${id}-s`, join_seq, may_host: true, name: id });
  ws.onmessage({ data: JSON.stringify({ v: 1, t: "welcome", you: "me", session: "me-s", missed: [],
    snapshot: { room: "r", current: { room: "r", host: null, session: null, epoch: 0, seq: 0, lease_ms: 5000, reason: "elected", issued_at: 0 },
      members: [member("me", 1), member("b", 2)], seq: 0, server_time: 0,
      actions: { host: [], participant: ["vote"] } } }) });
  try {
    assert.deepEqual(heard, [["b", "me"]]);
    assert.deepEqual(room.view.members.map((m) => m.id), ["me", "b"], "the view's list was reordered");
  } finally {
    room.close();
  }
});

/** Runs `f` with `Date.now` moved `ms` ahead, and puts the clock back however `f` ends. Only
 * for code that settles in microtasks: no timer of a room may run while the clock is moved. */
async function clockAhead(ms, f) {
  const realNow = Date.now;
  Date.now = () => realNow() + ms;
  try {
    return await f();
  } finally {
    Date.now = realNow;
  }
}

/** `promise`, or a rejection after `ms` (a promise that never settles fails the test). */
const within = (promise, ms, what) => Promise.race([promise,
  new Promise((_, reject) => setTimeout(() => reject(new Error(`${what}: not settled after ${ms} ms`)), ms))]);

test("a command's promise settles even when a listener closes the room while it is being made", async () => {
  const room = await hl.connect({ url: "ws://127.0.0.1:9", room: "r", token: "t" });
  // Before the first snapshot a vote is queued; the `queued` event fires inside command().
  room.on("command", ({ state }) => state === "queued" && room.close());
  await assert.rejects(within(room.command("vote", { option: 1 }), 5_000, "the vote"),
    (e) => e instanceof hl.CommandError && e.code === "Closed");
  await assert.rejects(room.command("vote", { option: 2 }), (e) => e.code === "Closed");
});

test("a room held through a Proxy (Vue's reactive(), MobX) works: view, on, command, stamp, inbox, close", async () => {
  await hl.init(await readFile(new URL("../wasm/hostlease_bg.wasm", import.meta.url)));
  const room = new Proxy(await hl.connect({ url: "ws://127.0.0.1:9", room: "r", token: "t" }), {});
  assert.equal(room.view.phase, "connecting");
  const seen = [];
  const off = room.on("command", ({ state }) => seen.push(state));
  const vote = room.command("vote", { option: 1 });
  assert.deepEqual(seen, ["queued"]);
  off();
  // Not live: not authoritative, as a host command would be refused (a host cut off is not
  // "not the host": its session went with the socket, and it was told NotHost).
  assert.throws(() => room.stamp("x"), (e) => e.code === "NotAuthoritative");
  await assert.rejects(room.command("host.resign"), (e) => e.code === "NotAuthoritative");
  assert.equal(room.acceptStamped("p", { hostleaseEpoch: 1, body: 1 }), null); // no epoch verified yet
  // inbox() reads the token, a private member a Proxy cannot reach: a typed error (no server
  // at this address), not a TypeError.
  await assert.rejects(room.inbox(), (e) => e instanceof hl.ConnectionError && e.code === "Unavailable");
  room.close();
  await assert.rejects(within(vote, 5_000, "the vote"), (e) => e.code === "Closed");
});

test("close() is announced to the connection listeners, and pending commands fail Closed", async () => {
  const room = await hl.connect({ url: "ws://127.0.0.1:9", room: "r", token: "t" });
  const phases = [];
  room.on("connection", ({ phase }) => phases.push(phase));
  const vote = room.command("vote", { option: 1 });
  room.close();
  assert.ok(phases.includes("closed"), JSON.stringify(phases));
  await assert.rejects(within(vote, 5_000, "the vote"), (e) => e.code === "Closed");
});

test("a listener that closes the room sees nothing more of that step after connection: closed", async () => {
  const room = await hl.connect({ url: "ws://127.0.0.1:9", room: "r", token: "t" });
  const seen = [];
  for (const type of ["connection", "provisional", "discontinuity", "lease"]) room.on(type, () => seen.push(type));
  room.on("provisional", () => room.close());
  // One step's events as the driver hands them over (the wrapper's fan-out is what is tested).
  room._onEvents(JSON.stringify([{ type: "provisional", coordinator: null }, { type: "discontinuity", from: 1, to: 2 },
    { type: "lease", state: "unknown" }]));
  assert.deepEqual(seen, ["provisional", "connection"]);
});

test("what a listener's own call makes the driver emit comes after the rest of the step being delivered", async () => {
  const room = await hl.connect({ url: "ws://127.0.0.1:9", room: "r", token: "t" });
  const seen = [];
  room.on("connection", ({ phase }) => {
    seen.push(phase);
    // Not connected: the vote is queued, and its `queued` event is emitted by this call.
    if (phase === "offline") room.command("vote", { option: 1 }).catch(() => {});
  });
  room.on("provisional", ({ coordinator }) => seen.push(`provisional ${coordinator}`));
  room.on("command", ({ state }) => seen.push(state));
  room._onEvents(JSON.stringify([{ type: "connection", phase: "offline" }, { type: "provisional", coordinator: "a" }]));
  assert.deepEqual(seen, ["offline", "provisional a", "queued"]);
  room.close();
});

test("what a listener's own call makes comes after the other listeners of its event, a relay's too", async () => {
  const room = await hl.connect({ url: "ws://127.0.0.1:9", room: "r", token: "t" });
  const seen = [];
  room.on("relay", ({ reason }) => {
    seen.push(`relay 1 ${reason}`);
    room.command("vote", { option: 1 }).catch(() => {});
  });
  room.on("relay", () => seen.push("relay 2"));
  room.on("command", ({ state }) => seen.push(state));
  room._onEvents(JSON.stringify([{ type: "connection", phase: "offline" }]));
  await room._onRelay("p", { room: "another" }); // reported at once, not from a step
  assert.deepEqual(seen, ["relay 1 unsigned", "relay 2", "queued"]);
  room.close();
});

test("a delivery that fails part-way does not stop the next steps' events", async () => {
  const room = await hl.connect({ url: "ws://127.0.0.1:9", room: "r", token: "t" });
  const seen = [];
  room.on("provisional", ({ coordinator }) => seen.push(coordinator));
  const dispatch = room._dispatch;
  room._dispatch = () => {
    room._dispatch = dispatch;
    throw new Error("a bug in the wrapper");
  };
  assert.throws(() => room._onEvents(JSON.stringify([{ type: "provisional", coordinator: "a" }])));
  room._onEvents(JSON.stringify([{ type: "provisional", coordinator: "b" }]));
  assert.deepEqual(seen, ["b"]);
  room.close();
});

test("a listener that closes the room: the listeners after it do not get that event after connection: closed", async () => {
  const room = await hl.connect({ url: "ws://127.0.0.1:9", room: "r", token: "t" });
  const seen = [];
  room.on("provisional", () => room.close());
  room.on("provisional", () => seen.push("provisional"));
  room.on("connection", ({ phase }) => seen.push(phase));
  room._onEvents(JSON.stringify([{ type: "provisional", coordinator: null }]));
  assert.deepEqual(seen, ["closed"]);
});

test("a listener's error reaches the page (reportError) as well as the error listeners; an error listener's too", async () => {
  const reported = [];
  globalThis.reportError = (e) => reported.push(e.message);
  try {
    const room = await hl.connect({ url: "ws://127.0.0.1:9", room: "r", token: "t" });
    const errors = [];
    room.on("error", (e) => {
      errors.push(e.code);
      throw new Error("error listener bug");
    });
    room.on("provisional", () => {
      throw new Error("listener bug");
    });
    room._onEvents(JSON.stringify([{ type: "provisional", coordinator: null }]));
    assert.deepEqual(errors, ["ListenerError"]);
    assert.deepEqual(reported, ["listener bug", "error listener bug"]);
    room.close();
  } finally {
    delete globalThis.reportError;
  }
});

test("kicked, with an error listener that closes the room: connection: closed is still announced, once", async () => {
  const room = await hl.connect({ url: "ws://127.0.0.1:9", room: "r", token: "t" });
  const ws = NeverOpens.instance;
  const seen = [];
  room.on("error", (e) => { seen.push(`error ${e.code}`); room.close(); });
  room.on("connection", ({ phase }) => seen.push(phase));
  room.on("lease", ({ state }) => seen.push(`lease ${state}`));
  // The stand-in opens, the server welcomes this member and then kicks it: one step of the core
  // reports the error, then (the view closed) the lease and `connection: closed`.
  ws.readyState = 1;
  ws.onopen?.({});
  ws.onmessage({ data: JSON.stringify({ v: 1, t: "welcome", you: "me", session: "me-s", missed: [],
    snapshot: { room: "r", current: { room: "r", host: null, session: null, epoch: 0, seq: 0, lease_ms: 5000, reason: "elected", issued_at: 0 },
      members: [], seq: 0, server_time: 0, actions: { host: [], participant: ["vote"] } } }) });
  assert.equal(room.view.phase, "live");
  seen.length = 0;
  ws.onmessage({ data: JSON.stringify({ v: 1, t: "error", code: "kicked", message: "removed by an admin" }) });
  assert.deepEqual(seen, ["error kicked", "closed"]);
});

test("a host kicked, with an error listener that closes the room: nothing of that step after close() but connection: closed", async () => {
  const room = await hl.connect({ url: "ws://127.0.0.1:9", room: "r", token: "t" });
  const ws = NeverOpens.instance;
  const seen = [];
  room.on("error", (e) => { seen.push(`error ${e.code}`); room.close(); seen.push("close() returned"); });
  room.on("connection", ({ phase }) => seen.push(phase));
  room.on("lease", ({ state }) => seen.push(`lease ${state}`));
  ws.readyState = 1;
  ws.onopen?.({});
  const current = { room: "r", host: "me", session: "me-s", epoch: 1, seq: 1, lease_ms: 5000, reason: "elected", issued_at: 0 };
  ws.onmessage({ data: JSON.stringify({ v: 1, t: "welcome", you: "me", session: "me-s", missed: [],
    snapshot: { room: "r", current, members: [{ id: "me", session: "me-s", join_seq: 1, may_host: true, name: "me" }],
      seq: 1, server_time: 0, actions: { host: [], participant: ["vote"] } } }) });
  assert.equal(room.view.namedHost, true);
  seen.length = 0;
  // The core closes itself in the kick's step (its lease goes with it): the app's close() then
  // had nothing to close, and the rest of the step (the lease) reached the listeners after it.
  ws.onmessage({ data: JSON.stringify({ v: 1, t: "error", code: "kicked", message: "removed by an admin" }) });
  assert.deepEqual(seen, ["error kicked", "closed", "close() returned"]);
});

test("a token fetch that fails after close() reports nothing: connection: closed was the last event", async () => {
  let calls = 0;
  let fail;
  const room = await hl.connect({ url: "ws://127.0.0.1:9", room: "r",
    getToken: () => (calls++ ? new Promise((_, reject) => (fail = reject)) : { token: "t", expiresAt: Date.now() + 60_000 }) });
  const seen = [];
  room.on("error", (e) => seen.push(`error ${e.code}`));
  room.on("connection", ({ phase }) => seen.push(phase));
  // A reconnect 40 s later needs a fresh token (the one held is within its refresh margin).
  await clockAhead(40_000, () => void room._dial());
  assert.equal(calls, 2);
  room.close();
  fail(new Error("backend down"));
  await new Promise((r) => setTimeout(r, 20));
  assert.deepEqual(seen, ["closed"]);
});

test("a background token refresh that fails is tried again in 30 s (it waited for the next reconnect)", async (t) => {
  t.mock.timers.enable({ apis: ["setTimeout"] });
  let calls = 0;
  const room = await hl.connect({ url: "ws://127.0.0.1:9", room: "r",
    getToken: () => (++calls === 2 ? Promise.reject(new Error("backend down")) : { token: "t", expiresAt: Date.now() + 3_600_000 }) });
  const errors = [];
  room.on("error", (e) => errors.push(e.code));
  try {
    await room._refreshToken(); // as its timer would, 59.5 minutes on: the backend is down
    assert.deepEqual([calls, errors], [2, ["TokenUnavailable"]]);
    t.mock.timers.tick(30_000);
    await new Promise((r) => setImmediate(r));
    assert.equal(calls, 3);
  } finally {
    room.close();
  }
});

/** How many times `getToken` is called in the first `ms` of a room whose tokens expire
 * `expiresIn` ms after they are handed out (negative: already expired by this clock). */
async function tokenCalls(ms, expiresIn) {
  let calls = 0;
  const room = await hl.connect({ url: "ws://127.0.0.1:9", room: "r",
    getToken: () => (calls++, { token: "t", expiresAt: Date.now() + expiresIn }) });
  try {
    await new Promise((r) => setTimeout(r, ms));
    return calls;
  } finally {
    room.close();
  }
}

test("a token that lives for weeks is not fetched again and again", async () => {
  assert.equal(await tokenCalls(300, 30 * 86_400_000), 1);
});

test("an expiresAt of null (a JSON backend's \"none\") is no expiry: the room connects and does not ask again; a token read by a getter is taken", async () => {
  let calls = 0;
  const room = await hl.connect({ url: "ws://127.0.0.1:9", room: "r",
    getToken: async () => (calls++, JSON.parse('{"token": "t", "expiresAt": null}')) });
  try {
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(calls, 1);
  } finally {
    room.close();
  }
  class Session { get token() { return "t"; } get expiresAt() { return Date.now() + 3_600_000; } }
  (await hl.connect({ url: "ws://127.0.0.1:9", room: "r", getToken: () => new Session() })).close();
});

test("a token that looks spent on arrival (this clock ahead of the backend's) is not asked for again every second", async () => {
  assert.equal(await tokenCalls(2_500, -60_000), 1);
});

test("inbox() without a token rejects with why, and does not also report it to the error listeners; one not expired yet still goes when a fresh one cannot be had", async () => {
  const down = new Error("backend down");
  let calls = 0;
  const room = await hl.connect({ url: "ws://127.0.0.1:9", room: "r",
    getToken: () => { if (calls++) throw down; return { token: "t", expiresAt: Date.now() + 60_000 }; } });
  const errors = [];
  room.on("error", (e) => errors.push(e.code));
  try {
    // 40 s later the token is within its refresh margin: inbox() asks for a fresh one, which
    // fails, and goes with the one it has, 20 s from expiry (no server at this address).
    await clockAhead(40_000, () => assert.rejects(room.inbox(),
      (e) => e instanceof hl.ConnectionError && e.code === "Unavailable"));
    assert.equal(calls, 2);
    // 70 s later that one has expired: why there is no token.
    await clockAhead(70_000, () => assert.rejects(room.inbox(),
      (e) => e instanceof hl.ConnectionError && e.code === "TokenUnavailable" && e.cause === down));
    assert.equal(calls, 3);
    assert.deepEqual(errors, []);
  } finally {
    room.close();
  }
});

test("a refresh that fails while another succeeds goes with the token the other got (one with an expiresAt, or a bare string)", async () => {
  for (const fresh of [{ token: "t2", expiresAt: Date.now() + 3_600_000 }, "t2"]) await refreshRace(fresh);
});

async function refreshRace(fresh) {
  const settle = [];
  let calls = 0;
  const room = await hl.connect({ url: "ws://127.0.0.1:9", room: "r",
    getToken: () => (calls++ ? new Promise((ok, no) => settle.push({ ok, no })) : { token: "t1", expiresAt: Date.now() + 60_000 }) });
  const errors = [];
  room.on("error", (e) => errors.push(e.code));
  try {
    await clockAhead(40_000, async () => {
      // Within the refresh margin: the proactive refresh, and inbox() asking for its own.
      const proactive = room._refreshToken();
      const inbox = room.inbox();
      await new Promise((r) => setTimeout(r, 10));
      assert.equal(settle.length, 2);
      settle[0].ok(fresh);
      await proactive;
      settle[1].no(new Error("backend busy"));
      // Not `TokenUnavailable`: t2 goes (and finds no server at this address).
      await assert.rejects(inbox, (e) => e instanceof hl.ConnectionError && e.code === "Unavailable");
    });
    assert.deepEqual(errors, []);
  } finally {
    room.close();
  }
}

test("room.inbox({ since: null }) is a BadArgument, as fetchInbox's (not a read from 0 again)", async () => {
  const room = await hl.connect({ url: "ws://127.0.0.1:9", room: "r", token: "t" });
  try {
    await assert.rejects(room.inbox({ since: null }), (e) => e instanceof hl.UsageError && e.code === "BadArgument");
  } finally {
    room.close();
  }
});

test("a data channel that closes is let go of; attachPeer() after close() does nothing", async () => {
  const room = await hl.connect({ url: "ws://127.0.0.1:9", room: "r", token: "t" });
  const channel = () => Object.assign(new EventTarget(), { readyState: "connecting", send() {} });
  const ch = channel();
  room.attachPeer("p2", ch);
  assert.equal(room._peers.size, 1);
  ch.dispatchEvent(new Event("close"));
  assert.equal(room._peers.size, 0);
  // One already closing or closed fires no `close` to let go of it by: not kept at all.
  for (const readyState of ["closing", "closed"]) {
    room.attachPeer("p4", Object.assign(channel(), { readyState }));
    assert.equal(room._peers.size, 0, readyState);
  }
  // One attached open (from `ondatachannel`, whose `open` fires after): announced once.
  const peer = room._driver.peer.bind(room._driver);
  const announced = [];
  room._driver.peer = (...a) => (announced.push(a), peer(...a));
  const open = Object.assign(channel(), { readyState: "open" });
  room.attachPeer("p5", open);
  open.dispatchEvent(new Event("open"));
  assert.deepEqual(announced, [["p5", true]]);
  // Attached again, open (a newer channel of the same peer): never unreachable in between.
  room.attachPeer("p5", Object.assign(channel(), { readyState: "open" }));
  assert.deepEqual(announced, [["p5", true], ["p5", true]]);
  // Replaced by one not open yet: unreachable until it opens.
  room.attachPeer("p5", channel());
  assert.deepEqual(announced, [["p5", true], ["p5", true], ["p5", false]]);
  room.close();
  room.attachPeer("p3", channel());
  assert.equal(room._peers.size, 0);
});

test("each on() is a subscription of its own: the same function twice is called twice, each unsubscribe ends its own", async () => {
  const room = await hl.connect({ url: "ws://127.0.0.1:9", room: "r", token: "t" });
  const seen = [];
  const f = (e) => seen.push(e.phase);
  const unsubscribe = room.on("connection", f);
  room.on("connection", f);
  room.on("connection", f);
  unsubscribe(); // another component's cleanup: the other two stay
  room.close();
  assert.deepEqual(seen, ["closed", "closed"]);
});

test("a listener unsubscribed while an event is delivered does not get it; one subscribed meanwhile gets the next", async () => {
  await hl.init(await readFile(new URL("../wasm/hostlease_bg.wasm", import.meta.url)));
  const room = await hl.connect({ url: "ws://127.0.0.1:9", room: "r", token: "t" });
  const seen = [];
  let offB;
  let added = false;
  // A tears down B (a component an earlier listener's render removed) and subscribes C.
  room.on("provisional", ({ coordinator }) => {
    seen.push(`a:${coordinator}`);
    offB();
    if (!added) room.on("provisional", ({ coordinator }) => seen.push(`c:${coordinator}`));
    added = true;
  });
  offB = room.on("provisional", ({ coordinator }) => seen.push(`b:${coordinator}`));
  room._onEvents(JSON.stringify([{ type: "provisional", coordinator: "x" }]));
  room._onEvents(JSON.stringify([{ type: "provisional", coordinator: "y" }]));
  assert.deepEqual(seen, ["a:x", "a:y", "c:y"]);
  room.close();
});

test("room.view is the same object until something in it changes", async () => {
  const room = await hl.connect({ url: "ws://127.0.0.1:9", room: "r", token: "t" });
  const before = room.view;
  assert.equal(room.view, before);
  room.close();
  assert.notEqual(room.view, before);
  assert.equal(room.view.phase, "closed");
  assert.equal(room.view, room.view);
});

test("a closed room the app lets go of is garbage-collected", { skip: !globalThis.gc && "needs node --expose-gc" }, async () => {
  let collected = false;
  const registry = new FinalizationRegistry(() => (collected = true));
  // Its signal, an app-wide one, lives on: it must not hold the room.
  const appWide = new AbortController();
  await (async () => {
    const room = await hl.connect({ url: "ws://127.0.0.1:9", room: "r", token: "t", signal: appWide.signal });
    room.on("host", () => {});
    registry.register(room, "room");
    room.close();
  })();
  for (let i = 0; i < 50 && !collected; i++) {
    globalThis.gc();
    await new Promise((r) => setTimeout(r, 20));
  }
  assert.ok(collected, "the closed room is still reachable");
  appWide.abort(); // (after the room was collected: nothing to close)
});

test("errors carry stable codes and names", () => {
  const e = new hl.CommandError(hl.ErrorCode.StaleEpoch, "x");
  assert.equal(e.name, "CommandError");
  assert.equal(e.code, "StaleEpoch");
  assert.ok(e instanceof hl.HostleaseError);
});

test("error names survive a minifying bundler (which renames the classes)", async () => {
  const { execFile } = await import("node:child_process");
  const { mkdtemp, rm } = await import("node:fs/promises");
  const { tmpdir } = await import("node:os");
  const { join } = await import("node:path");
  const dir = await mkdtemp(join(tmpdir(), "hostlease-minified-"));
  try {
    const out = join(dir, "bundle.mjs");
    const esbuild = new URL("../../.tools/node/node_modules/.bin/esbuild", import.meta.url).pathname;
    await new Promise((resolve, reject) => execFile(esbuild, [new URL("../index.js", import.meta.url).pathname,
      "--bundle", "--minify", "--format=esm", "--platform=browser", `--outfile=${out}`, "--log-level=error"],
    (e) => (e ? reject(e) : resolve())));
    const min = await import(out);
    const classes = ["HostleaseError", "UsageError", "CommandError", "ConnectionError", "ProtocolError"];
    for (const name of classes) {
      assert.notEqual(min[name].name, name, "the bundle did rename the class");
      assert.equal(new min[name](min.ErrorCode.Closed, "x").name, name);
    }
    assert.equal(String(new min.CommandError(min.ErrorCode.NotHost, "m")), "CommandError: m");
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

// fetchInbox against a scripted HTTP server on loopback: paging, the token's place, Retry-After,
// and typed errors for every bad answer.
test("a frame past the 4 MiB limit is refused with frame_too_large before it is copied into the wasm", async () => {
  await hl.init(await readFile(new URL("../wasm/hostlease_bg.wasm", import.meta.url)));
  const room = await hl.connect({ url: "ws://127.0.0.1:9", room: "r", token: "t" });
  try {
    const errors = [];
    room.on("error", (e) => errors.push(e));
    // The loader hands back the instance's exports (their names are minified: the memory is
    // found by its type).
    const exports = await (await import("../wasm/hostlease.js")).default();
    const memory = Object.values(exports).find((e) => e instanceof WebAssembly.Memory);
    const before = memory.buffer.byteLength;
    // Longer than the memory as it is: a copy would have to grow it.
    room._onMessage({ data: "x".repeat(Math.max(4 << 20, before) + 1) });
    assert.deepEqual(errors.map((e) => [e.constructor.name, e.code]), [["ConnectionError", "frame_too_large"]]);
    assert.equal(memory.buffer.byteLength, before, "the frame was copied into the wasm's memory");
  } finally {
    room.close();
  }
});

test("fetchInbox pages through the inbox and rejects bad answers with typed errors", async () => {
  const http = await import("node:http");
  const seen = [];
  const CUT = Symbol("cut");
  let answer = null; // (since) => [status, headers, body or CUT]
  const server = http.createServer((req, res) => {
    const u = new URL(req.url, "http://x");
    seen.push({ path: u.pathname, search: u.search, auth: req.headers.authorization });
    const [status, headers, body] = answer(Number(u.searchParams.get("since")));
    if (body === CUT) {
      // Half a page, then the connection goes.
      res.writeHead(status, { "content-type": "application/json", "content-length": "1000" });
      res.write('{"entries": [');
      setTimeout(() => res.socket.destroy(), 50);
      return;
    }
    res.writeHead(status, { "content-type": "application/json", ...headers }).end(body);
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  const url = `ws://127.0.0.1:${server.address().port}`;
  const event = (seq) => ({ kind: "event", seq, epoch: 1, actor: "a", action: "vote", payload: null, at: 0 });
  try {
    // Two pages, the second after a 429 with Retry-After: 0.
    let limited = false;
    answer = (since) => {
      if (since === 0) return [200, {}, JSON.stringify({ entries: [{ cursor: 1, item: event(3) }, { cursor: 2, item: event(4) }], next: 2 })];
      if (!limited) { limited = true; return [429, { "retry-after": "0" }, "{}"]; }
      return [200, {}, JSON.stringify({ entries: [{ cursor: 3, item: event(5) }], unknown_field: true })];
    };
    const page = await hl.fetchInbox({ url, room: "r:1@x", token: "secret-token" });
    assert.deepEqual(page.entries.map((e) => e.cursor), [1, 2, 3]);
    assert.equal(page.next, null);
    assert.ok(seen.every((s) => s.auth === "Bearer secret-token" && !s.search.includes("secret")), "the token left the header");
    assert.equal(seen[0].path, "/v1/rooms/r%3A1%40x/inbox");
    assert.deepEqual(seen.map((s) => s.search), ["?since=0", "?since=2", "?since=2"]);

    // A page that fails after the first: what was read is kept, with the cursor to go on from
    // (it was thrown away, and a link too slow for one page lost every page before it).
    answer = (since) => since === 0
      ? [200, {}, JSON.stringify({ entries: [{ cursor: 1, item: event(3) }, { cursor: 2, item: event(4) }], next: 2 })]
      : [200, {}, CUT];
    const partial = await hl.fetchInbox({ url, room: "r", token: "t" });
    assert.deepEqual([partial.entries.map((e) => e.cursor), partial.next], [[1, 2], 2]);

    // A server behind a path prefix: the inbox is read under it.
    seen.length = 0;
    answer = () => [200, {}, JSON.stringify({ entries: [] })];
    // Browsers without AbortSignal.timeout (Safari 15, Chrome before 103) read it without a
    // time limit: every attempt threw, and the inbox was "unavailable".
    const timeout = AbortSignal.timeout;
    AbortSignal.timeout = undefined;
    try {
      assert.deepEqual(await hl.fetchInbox({ url, room: "r", token: "t" }), { entries: [], next: null });
    } finally {
      AbortSignal.timeout = timeout;
    }
    seen.length = 0;
    await hl.fetchInbox({ url: `${url}/hostlease/`, room: "r", token: "t" });
    await hl.fetchInbox({ url: `${url}/hostlease/v1/rooms/r/ws`, room: "r", token: "t" });
    assert.deepEqual(seen.map((s) => s.path), ["/hostlease/v1/rooms/r/inbox", "/hostlease/v1/rooms/r/inbox"]);

    const rejects = async (body, status, code, Cls) => {
      answer = () => [status, {}, body];
      await assert.rejects(hl.fetchInbox({ url, room: "r", token: "t" }), (e) => e instanceof Cls && e.code === code);
    };
    await rejects("not json", 200, "BadResponse", hl.ProtocolError);
    // A page cut off on its way is the network's failure, not a malformed answer.
    await rejects(CUT, 200, "Unavailable", hl.ConnectionError);
    await rejects(JSON.stringify({ entries: [{ cursor: -1, item: event(1) }] }), 200, "BadResponse", hl.ProtocolError);
    await rejects(JSON.stringify({ entries: [{ cursor: 1, item: { kind: "other" } }] }), 200, "BadResponse", hl.ProtocolError);
    await rejects(JSON.stringify({ entries: [], next: 0 }), 200, "BadResponse", hl.ProtocolError); // a cursor that does not move
    await rejects("{}", 403, "unauthorized", hl.ConnectionError);
    await rejects("{}", 500, "Unavailable", hl.ConnectionError);
    await assert.rejects(hl.fetchInbox({ url, room: "r" }), (e) => e instanceof hl.UsageError && e.code === "BadArgument");
    await assert.rejects(hl.fetchInbox({ url, room: "r", token: "t", since: -1 }), (e) => e.code === "BadArgument");
    for (const bad of ["not a url", "foo://h", "file:///etc"]) {
      await assert.rejects(hl.fetchInbox({ url: bad, room: "r", token: "t" }), (e) => e instanceof hl.UsageError && e.code === "BadArgument", bad);
    }
  } finally {
    server.close();
  }
});

test("connect() fails for a socket that cannot be opened, a getToken that never answers, and an expiresAt in seconds", async () => {
  const wsUnsupported = new SyntaxError("The URL's scheme must be either 'ws' or 'wss'");
  NeverOpens.throwing = wsUnsupported;
  try {
    await assert.rejects(hl.connect({ url: "ws://127.0.0.1:9", room: "r", token: "t" }),
      (e) => e instanceof hl.ConnectionError && e.code === "Unavailable" && e.cause === wsUnsupported);
  } finally {
    NeverOpens.throwing = null;
  }
  let asked = 0;
  await assert.rejects(within(hl.connect({ url: "ws://127.0.0.1:9", room: "r", getToken: () => (asked++, new Promise(() => {})) }), 30_000, "connect"),
    (e) => e instanceof hl.ConnectionError && e.code === "TokenUnavailable");
  assert.equal(asked, 1);
  await assert.rejects(hl.connect({ url: "ws://127.0.0.1:9", room: "r", getToken: () => ({ token: "t", expiresAt: Date.now() / 1000 + 3600 }) }),
    (e) => e instanceof hl.ConnectionError && e.code === "TokenUnavailable");
  // An empty token (a logged-out user, an unset variable) is no token: connect() rejects (it
  // resolved, and the room stayed offline for ever without an error event).
  for (const options of [{ token: "" }, { getToken: () => "" }, { getToken: async () => ({ token: "" }) }]) {
    await assert.rejects(hl.connect({ url: "ws://127.0.0.1:9", room: "r", ...options }),
      (e) => e instanceof hl.ConnectionError && e.code === "TokenUnavailable");
  }
  // An expiresAt that is not a number (arithmetic on it would throw a TypeError).
  for (const expiresAt of [BigInt(Date.now() + 3_600_000), { valueOf() { throw new Error("no"); } }, Symbol("t")]) {
    await assert.rejects(hl.connect({ url: "ws://127.0.0.1:9", room: "r", getToken: () => ({ token: "t", expiresAt }) }),
      (e) => e instanceof hl.ConnectionError && e.code === "TokenUnavailable", typeof expiresAt);
  }
});

test("the join token is not on the room for a logger to print; bad arguments are typed errors", async () => {
  const { inspect } = await import("node:util");
  const room = await hl.connect({ url: "http://127.0.0.1:9", room: "r", token: "secret-join-token" });
  try {
    assert.equal(NeverOpens.last, "ws://127.0.0.1:9/v1/rooms/r/ws", "an http URL is dialled as ws");
    // A full `/ws` URL is a base for `room` (the keys and the inbox are read for `room` too).
    for (const [url, dialled] of [["wss://h:8/pre/v1/rooms/other/ws", "wss://h:8/pre/v1/rooms/r/ws"],
      ["https://h/pre//", "wss://h/pre/v1/rooms/r/ws"]]) {
      const other = await hl.connect({ url, room: "r", token: "t" });
      assert.equal(NeverOpens.last, dialled, url);
      other.close();
    }
    assert.ok(!inspect(room, { depth: 5, showHidden: true }).includes("secret-join-token"));
    assert.ok(!JSON.stringify(room, (k, v) => (typeof v === "bigint" ? String(v) : v)).includes("secret-join-token"));
    // A peer id is a member's id: one the core cannot take would never count as reachable.
    for (const [peer, channel] of [["p", null], ["p", {}], [7, { addEventListener() {} }],
      ["Alice Smith", { addEventListener() {} }]]) {
      assert.throws(() => room.attachPeer(peer, channel), (e) => e instanceof hl.UsageError && e.code === "BadArgument");
    }
  } finally {
    room.close();
  }
  for (const bad of [null, undefined, 5]) {
    await assert.rejects(hl.fetchInbox(bad), (e) => e instanceof hl.UsageError && e.code === "BadArgument");
  }
});

/** A server-signed assignment as a peer relays it, signed with `privateKey` (the signed bytes
 * written out here, not taken from the wrapper: the protocol's "hostlease/v1/assignment" lines). */
async function signedRelay(privateKey, a) {
  const bytes = new TextEncoder().encode(["hostlease/v1/assignment", a.room, a.host, a.session, a.epoch, a.seq, a.lease_ms, a.reason, a.issued_at].join("\n"));
  return { ...a, sig: Buffer.from(await globalThis.crypto.subtle.sign({ name: "Ed25519" }, privateKey, bytes)).toString("base64url") };
}

/** A server on loopback answering the keys' reads with `handler` (node:http's), and its URL. */
async function keysServer(handler) {
  const http = await import("node:http");
  const server = http.createServer(handler);
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  return { server, keysUrl: `http://127.0.0.1:${server.address().port}/v1/keys` };
}

/** A fresh Ed25519 key pair (`key`) and its public key as `GET /v1/keys` publishes it (`x`). */
async function publishedKey() {
  const { subtle } = globalThis.crypto;
  const key = await subtle.generateKey({ name: "Ed25519" }, true, ["sign", "verify"]);
  return { key, x: Buffer.from(await subtle.exportKey("raw", key.publicKey)).toString("base64url") };
}

test("a relay signed with a key published since the keys were read is verified after a refetch, at most once a minute", async () => {
  await hl.init(await readFile(new URL("../wasm/hostlease_bg.wasm", import.meta.url)));
  const [k1, k2] = [await publishedKey(), await publishedKey()];
  const published = [["k1", k1]];
  let fetches = 0;
  const { server, keysUrl } = await keysServer(async (req, res) => {
    fetches++;
    const keys = published.map(([kid, k]) => ({ kid, alg: "Ed25519", x: k.x }));
    res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ keys }));
  });
  const room = await hl.connect({ url: "ws://127.0.0.1:9", room: "r", token: "t", keysUrl });
  const reasons = [];
  room.on("relay", (r) => reasons.push(r.reason));
  const relay = async (kid, k, extra = {}) => {
    const a = { room: "r", host: "p", session: "s", epoch: 1, seq: 1, lease_ms: 1000, reason: "elected", issued_at: 0, kid };
    await room._onRelay("peer", { ...extra, ...(await signedRelay(k.key.privateKey, a)) });
  };
  // A field nobody signed, nested deeper than JSON.stringify can go: not passed on.
  let deep = {};
  for (let i = 0; i < 20_000; i++) deep = { deep };
  const realNow = performance.now.bind(performance);
  let ahead = 0;
  performance.now = () => realNow() + ahead;
  try {
    await relay("k1", k1); // verified; before a first snapshot it is not adopted: "stale"
    await relay("k1", k1, { x: deep }); // the same, with the extra field dropped: "stale"
    published.push(["k2", k2]); // the server's new key
    await relay("k2", k2); // within a minute of the read: not read again
    ahead = 61_000;
    await Promise.all([relay("k2", k2), relay("k2", k2)]); // read again (once), both verified
    await relay("k9", k2); // just read: not again
    ahead = 122_000;
    server.closeAllConnections();
    server.close(); // the next read fails: the keys read before still verify
    await relay("k9", k2);
    await relay("k1", k1);
  } finally {
    performance.now = realNow;
    room.close();
    server.close();
  }
  assert.deepEqual(reasons, ["stale", "stale", "forged", "stale", "stale", "forged", "forged", "stale"]);
  assert.equal(fetches, 2);
});

test("a peer's relays are checked one at a time: a flood while the keys are read holds only the newest", async () => {
  await hl.init(await readFile(new URL("../wasm/hostlease_bg.wasm", import.meta.url)));
  const { key, x } = await publishedKey();
  let answer;
  const asked = new Promise((r) => (answer = r));
  const { server, keysUrl } = await keysServer(async (req, res) => {
    await asked; // held until the relays are in
    res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ keys: [{ kid: "k1", alg: "Ed25519", x }] }));
  });
  const room = await hl.connect({ url: "ws://127.0.0.1:9", room: "r", token: "t", keysUrl });
  const heard = [];
  room.on("relay", (r) => heard.push(`${r.peer} ${r.epoch} ${r.reason}`));
  const channels = {};
  for (const peer of ["a", "b"]) {
    room.attachPeer(peer, (channels[peer] = Object.assign(new EventTarget(), { readyState: "open", send() {} })));
  }
  const relay = async (peer, epoch) => {
    const assignment = await signedRelay(key.privateKey,
      { room: "r", host: "p", session: "s", epoch, seq: epoch, lease_ms: 1000, reason: "elected", issued_at: 0, kid: "k1" });
    channels[peer].dispatchEvent(new MessageEvent("message", { data: JSON.stringify({ t: "hostlease.relay", assignment }) }));
  };
  const until = async (what) => {
    for (let i = 0; i < 500 && !heard.includes(what); i++) await new Promise((r) => setTimeout(r, 10));
  };
  try {
    for (let epoch = 1; epoch <= 50; epoch++) await relay("a", epoch);
    // Not a relay (no assignment): it replaces nothing.
    channels.a.dispatchEvent(new MessageEvent("message", { data: JSON.stringify({ t: "hostlease.relay", assignment: null }) }));
    await relay("b", 7); // another peer's waits for no one's but its own
    answer();
    await until("a 50 stale");
    // One more from "a", checked after every one before it: the flood's middle is never checked.
    await relay("a", 60);
    await until("a 60 stale");
    // Before a first snapshot none is adopted: each checked one is "stale".
    assert.deepEqual(heard.sort(), ["a 1 stale", "a 50 stale", "a 60 stale", "b 7 stale"]);
  } finally {
    room.close();
    server.close();
  }
});

test("the keys are read as a peer is attached: its relays verify once the server is unreachable", async () => {
  await hl.init(await readFile(new URL("../wasm/hostlease_bg.wasm", import.meta.url)));
  const { key, x } = await publishedKey();
  let fetches = 0;
  const { server, keysUrl } = await keysServer((req, res) => {
    fetches++;
    res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ keys: [{ kid: "k1", alg: "Ed25519", x }] }));
  });
  const room = await hl.connect({ url: "ws://127.0.0.1:9", room: "r", token: "t", keysUrl });
  const heard = [];
  room.on("relay", (r) => heard.push(r.reason));
  const channel = Object.assign(new EventTarget(), { readyState: "open", send() {} });
  try {
    room.attachPeer("a", channel);
    for (let i = 0; i < 500 && !fetches; i++) await new Promise((r) => setTimeout(r, 10));
    assert.equal(fetches, 1, "the keys were not read as the peer was attached");
    await (room._keys ?? null);
    server.closeAllConnections();
    await new Promise((r) => server.close(r)); // unreachable from here on
    const assignment = await signedRelay(key.privateKey,
      { room: "r", host: "p", session: "s", epoch: 3, seq: 3, lease_ms: 1000, reason: "elected", issued_at: 0, kid: "k1" });
    channel.dispatchEvent(new MessageEvent("message", { data: JSON.stringify({ t: "hostlease.relay", assignment }) }));
    for (let i = 0; i < 500 && !heard.length; i++) await new Promise((r) => setTimeout(r, 10));
    // Verified (before a first snapshot it is not adopted: "stale"), with no read of the keys.
    assert.deepEqual(heard, ["stale"]);
    assert.equal(fetches, 1);
  } finally {
    room.close();
    server.close();
  }
});

test("a malformed key among the server's keys leaves the others usable; none usable is as no Ed25519", async () => {
  await hl.init(await readFile(new URL("../wasm/hostlease_bg.wasm", import.meta.url)));
  const { key, x } = await publishedKey();
  // Too short, not a string, not base64, another algorithm: none of these takes k1 with it.
  const broken = [{ kid: "k0", alg: "Ed25519", x: "AAAA" }, { kid: "k2", alg: "Ed25519", x: 5 },
    { kid: "k3", alg: "Ed25519", x: "!!" }, { kid: "k4", alg: "ES256", x }, null];
  let keys = [...broken, { kid: "k1", alg: "Ed25519", x }];
  const { server, keysUrl } = await keysServer((req, res) =>
    res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ keys })));
  const relay = await signedRelay(key.privateKey, { room: "r", host: "p", session: "s", epoch: 7, seq: 7, lease_ms: 1000, reason: "elected", issued_at: 0, kid: "k1" });
  const relays = [];
  const errors = [];
  try {
    for (const published of [keys, broken]) {
      keys = published;
      const room = await hl.connect({ url: "ws://127.0.0.1:9", room: "r", token: "t", keysUrl });
      room.on("relay", (r) => relays.push(r.reason));
      room.on("error", (e) => errors.push(e.code));
      await room._onRelay("peer", relay);
      room.close();
    }
  } finally {
    server.close();
  }
  // Verified (before a first snapshot it is not adopted: "stale"); then no key usable.
  assert.deepEqual(relays, ["stale", "unsupported"]);
  assert.deepEqual(errors, ["RelayUnsupported"]);
});

test("where WebCrypto has no Ed25519, relays are ignored and one RelayUnsupported warning says so", async () => {
  await hl.init(await readFile(new URL("../wasm/hostlease_bg.wasm", import.meta.url)));
  const { subtle } = globalThis.crypto;
  const { key, x } = await publishedKey();
  // The server's keys are there; the browser cannot use them (as Safari before 17 and Chromium
  // before 113 answer importKey for Ed25519).
  const { server, keysUrl } = await keysServer((req, res) =>
    res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ keys: [{ kid: "k1", alg: "Ed25519", x }] })));
  const realImport = subtle.importKey;
  subtle.importKey = function (format, data, alg, ...rest) {
    if ((alg?.name ?? alg) === "Ed25519") return Promise.reject(new DOMException("Unrecognized name.", "NotSupportedError"));
    return realImport.call(this, format, data, alg, ...rest);
  };
  // The keys are read again a minute after a failed read; close() clears that timer (it held
  // the closed room, and this test, for a minute).
  const timers = () => process.getActiveResourcesInfo().filter((r) => r === "Timeout").length;
  const before = timers();
  const room = await hl.connect({ url: "ws://127.0.0.1:9", room: "r", token: "t", keysUrl });
  try {
    const errors = [];
    const relays = [];
    room.on("error", (e) => errors.push([e.constructor.name, e.code]));
    room.on("relay", (r) => relays.push([r.accepted, r.reason]));
    const relay = await signedRelay(key.privateKey, { room: "r", host: "p", session: "s", epoch: 7, seq: 7, lease_ms: 1000, reason: "elected", issued_at: 0, kid: "k1" });
    await room._onRelay("peer", relay);
    await room._onRelay("peer", relay);
    assert.deepEqual(relays, [[false, "unsupported"], [false, "unsupported"]]);
    assert.deepEqual(errors, [["ProtocolError", "RelayUnsupported"]], "one warning, not one per relay");
    assert.equal(room.view.epoch, null, "an unverified relay reached the view");
  } finally {
    subtle.importKey = realImport;
    room.close();
    server.close();
  }
  assert.equal(timers(), before, "a timer of the closed room is still set");
});

test("an assignment whose reason this SDK does not know is not relayed (the copy would not verify)", async () => {
  const room = await hl.connect({ url: "ws://127.0.0.1:9", room: "r", token: "t" });
  const ws = NeverOpens.instance;
  const relayed = [];
  const channel = Object.assign(new EventTarget(), { readyState: "open", send: (m) => relayed.push(JSON.parse(m).assignment.reason) });
  room.attachPeer("p2", channel);
  ws.readyState = 1;
  ws.onopen?.({});
  const signed = (epoch, reason) =>
    ({ room: "r", host: "p2", session: "p2-s", epoch, seq: epoch, lease_ms: 5000, reason, issued_at: 0, kid: "k1", sig: "c2lnbmF0dXJl" });
  ws.onmessage({ data: JSON.stringify({ v: 1, t: "welcome", you: "me", session: "me-s", missed: [],
    snapshot: { room: "r", current: signed(1, "elected"), members: [], seq: 1, server_time: 0, actions: { host: [], participant: ["vote"] } } }) });
  ws.onmessage({ data: JSON.stringify({ v: 1, t: "assignment", ...signed(2, "a_reason_from_a_newer_server") }) });
  ws.onmessage({ data: JSON.stringify({ v: 1, t: "assignment", ...signed(3, "resigned") }) });
  assert.equal(room.view.epoch, 3);
  room.close();
  assert.deepEqual(relayed, ["elected", "resigned"]);
});

test("a peer's relay message past 4 KiB is not parsed; a binary one is ignored", async () => {
  await hl.init(await readFile(new URL("../wasm/hostlease_bg.wasm", import.meta.url)));
  const room = await hl.connect({ url: "ws://127.0.0.1:9", room: "r", token: "t" });
  const channel = Object.assign(new EventTarget(), { readyState: "open", send() {} });
  room.attachPeer("p2", channel);
  const heard = [];
  room.on("relay", ({ reason }) => heard.push(reason));
  const relay = (pad) => JSON.stringify({ t: "hostlease.relay", assignment: { room: "elsewhere" }, pad });
  const send = (data) => channel.dispatchEvent(new MessageEvent("message", { data }));
  send(relay("x".repeat(4096)));
  send(new TextEncoder().encode(relay("")).buffer);
  send(relay("x".repeat(4000)));
  await new Promise((r) => setTimeout(r, 0));
  // Only the last was read (and refused: for another room).
  assert.deepEqual(heard, ["unsigned"]);
  room.close();
});

test("acceptStamped takes only the host of the view's verified epoch: a made-up epoch neither passes nor locks the host out", async () => {
  const room = await hl.connect({ url: "ws://127.0.0.1:9", room: "r", token: "t" });
  const ws = NeverOpens.instance;
  ws.readyState = 1;
  ws.onopen?.({});
  const a = (epoch, host) => ({ room: "r", host, session: `${host}-s`, epoch, seq: epoch, lease_ms: 5000, reason: "elected", issued_at: 0 });
  ws.onmessage({ data: JSON.stringify({ v: 1, t: "welcome", you: "me", session: "me-s", missed: [],
    snapshot: { room: "r", current: a(3, "h"), members: [], seq: 3, server_time: 0, actions: { host: [], participant: ["vote"] } } }) });
  const m = (epoch, body) => ({ hostleaseEpoch: epoch, body });
  try {
    assert.equal(room.acceptStamped("h", m(3, "h3")), "h3");
    assert.equal(room.acceptStamped("c", m(3, "c3")), null, "epoch 3 is h's");
    // Stamps are not signed: an epoch the view has not verified is no one's yet (it was taken,
    // and any peer passed as host with a made-up one).
    assert.equal(room.acceptStamped("b", m(4, "b4")), null);
    assert.equal(room.acceptStamped("mallory", m(2 ** 53 - 1, "m")), null);
    assert.equal(room.acceptStamped("h", m(3, "still")), "still", "the real host is not locked out");
    assert.equal(room.acceptStamped("h", { hostleaseEpoch: 3 }), null, "no body");
    // The view learns epoch 4 (from the server): epoch 3 is now a deposed host's.
    ws.onmessage({ data: JSON.stringify({ v: 1, t: "assignment", ...a(4, "b") }) });
    assert.equal(room.acceptStamped("h", m(3, "late")), null);
    assert.equal(room.acceptStamped("b", m(4, "b4")), "b4");
    // A hostless epoch: no one's, whatever peer id the app passes.
    ws.onmessage({ data: JSON.stringify({ v: 1, t: "assignment", ...a(5, "b"), host: null, session: null, reason: "left" }) });
    assert.equal(room.view.host, null);
    for (const peer of ["b", null, undefined]) assert.equal(room.acceptStamped(peer, m(5, "x")), null, String(peer));
  } finally {
    room.close();
  }
});
