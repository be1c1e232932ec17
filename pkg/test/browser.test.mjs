// The built package in real Chromium (playwright-core, Debian's browser) against the real
// hostlease-server, inside a loopback-only network namespace (see `cargo xtask test`).
// Each page reaches the server through its own fault-injecting TCP proxy.
//
// Waits are for conditions, with generous bounds; nothing asserts that something was fast.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { chromium } from "playwright-core";
import { FaultProxy } from "./harness/proxy.mjs";
import { serveStatic } from "./harness/static.mjs";
import { startServer } from "./harness/server.mjs";
import { until } from "./harness/until.mjs";

const ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
  "--disable-background-networking", "--disable-component-update", "--disable-sync",
  "--allow-loopback-in-peer-connection", "--disable-dev-shm-usage"];

let browser, statics, srv;

before(async () => {
  statics = await serveStatic();
  // 5 s leases (probed every 1.7 s): a host keeps its authority through a loaded machine's
  // stall of a second or two; failovers wait that much longer.
  srv = await startServer({ leaseMs: 5000 });
  browser = await chromium.launch({ executablePath: "/usr/bin/chromium", headless: true, chromiumSandbox: false, args: ARGS });
});

// Whatever a failed test left open, so that a failure ends the run instead of hanging it.
const opened = new Set();

after(async () => {
  for (const m of opened) await m.proxy.close();
  await browser?.close();
  await srv?.stop();
  statics?.server.close();
});

/** Opens a page for participant `pid` in `room`, connected through its own proxy (to `server`,
 * by default the one every test shares). */
async function member(room, pid, { webrtc = true, tokenTtl, tokenTtlMs, server = srv, silent = false } = {}) {
  const ctx = await browser.newContext();
  await ctx.grantPermissions(["microphone", "camera"]);
  const page = await ctx.newPage();
  page.on("pageerror", (e) => console.error(`[${pid}] pageerror`, e));
  const proxy = new FaultProxy(server.port);
  const port = await proxy.listen();
  if (silent) proxy.silence();
  await page.goto(`http://127.0.0.1:${statics.port}/`);
  await page.waitForFunction(() => window.T?.ready);
  const tokens = [];
  for (let i = 0; i < 20; i++) tokens.push(await server.mintToken(room, pid, tokenTtl));
  await page.evaluate((o) => window.T.start(o), { url: `ws://127.0.0.1:${port}`, room, tokens, webrtc, tokenTtlMs });
  const m = { pid, page, proxy, ctx, view: () => page.evaluate(() => window.T.view()), log: () => page.evaluate(() => window.T.log) };
  opened.add(m);
  return m;
}

async function closeAll(...ms) {
  for (const m of ms) {
    await m.ctx.close().catch(() => {});
    await m.proxy.close();
    opened.delete(m);
  }
}

const live = (m) => until(`${m.pid} live`, async () => (await m.view()).phase === "live");
const amHost = (m) => until(`${m.pid} host authority`, async () => (await m.view()).amHost);

let roomNo = 0;
const newRoom = () => `room-${process.pid}-${++roomNo}`;

test("the first member becomes host and its host command succeeds with its token", async () => {
  const room = newRoom();
  const a = await member(room, "alice", { webrtc: false });
  await amHost(a);
  const b = await member(room, "bob", { webrtc: false });
  await live(b);
  const [va, vb] = [await a.view(), await b.view()];
  assert.equal(va.host, "alice");
  assert.equal(vb.host, "alice");
  assert.equal(va.epoch, vb.epoch);
  assert.equal(vb.amHost, false);
  const r = await a.page.evaluate(() => window.T.command("poll.open", { question: "Lunch?", options: ["pizza", "soup"] }));
  assert.ok(r.ok, JSON.stringify(r));
  const notHost = await b.page.evaluate(() => window.T.command("poll.open", { question: "mine?" }));
  assert.equal(notHost.err.code, "NotHost");
  assert.ok(notHost.err.isError && notHost.err.isHostlease);
  // Bob sees Alice's event, once.
  await until("bob sees the poll", async () => (await b.log()).some((e) => e.type === "event" && e.payload.action === "poll.open"));
  // Alice got her event before its result, so the result did not look like news of a lost event
  // (which resyncs, and takes her authority away until the welcome).
  assert.deepEqual((await a.log()).filter((e) => e.type === "connection").map((e) => e.payload.phase), ["live"]);
  // Alice's data-channel messages carry her epoch; Bob takes them from her, not from himself.
  const stamped = await a.page.evaluate(() => window.T.stampAsHost({ tick: 1 }));
  assert.deepEqual(stamped.ok, { hostleaseEpoch: va.epoch, body: { tick: 1 } }, JSON.stringify([stamped, await a.view()]));
  assert.deepEqual(await b.page.evaluate((m) => window.T.acceptStamped("alice", m), stamped.ok), { tick: 1 });
  assert.equal(await b.page.evaluate((m) => window.T.acceptStamped("bob", m), stamped.ok), null);
  assert.deepEqual((await b.page.evaluate(() => window.T.stamp({ tick: 2 }))).err, { code: "NotHost", isHostlease: true });
  await closeAll(a, b);
});

test("the esbuild bundle of the packaging smoke loads its .wasm from the URL it imported and goes live", async () => {
  // Built by the package smoke step before this one: `init(wasmUrl)` with the .wasm that
  // `--loader:.wasm=file` copied beside the bundle (as the README tells esbuild users).
  const ctx = await browser.newContext();
  try {
    const page = await ctx.newPage();
    await page.goto(`http://127.0.0.1:${statics.port}/esbuild/`);
    const token = await srv.mintToken("esbuild", "eve");
    const phase = await page.evaluate(async ({ url, token }) => {
      const { start } = await import("./out.js");
      const room = await start(url, "esbuild", token);
      for (let i = 0; i < 300 && room.view.phase !== "live"; i++) await new Promise((r) => setTimeout(r, 50));
      const phase = room.view.phase;
      room.close();
      return phase;
    }, { url: `ws://127.0.0.1:${srv.port}`, token });
    assert.equal(phase, "live");
  } finally {
    await ctx.close();
  }
});

test("after a failover the old host is refused locally and, sent raw, by the server", async () => {
  const room = newRoom();
  const a = await member(room, "alice", { webrtc: false });
  await amHost(a);
  const b = await member(room, "bob", { webrtc: false });
  await live(b);
  const before = (await a.view()).epoch;
  const oldStamp = (await a.page.evaluate(() => window.T.stampAsHost({ tick: 1 }))).ok;
  assert.deepEqual(oldStamp, { hostleaseEpoch: before, body: { tick: 1 } });
  // Alice's connection dies silently; her lease lapses; Bob is elected.
  a.proxy.hold();
  await until("bob elected", async () => (await b.view()).host === "bob" && (await b.view()).amHost, { timeout: 60_000 });
  // Alice's SDK stops acting by itself (its local lease ran out before the server's).
  const local = await a.page.evaluate(() => window.T.command("poll.close", {}));
  assert.ok(["LeaseExpired", "NotAuthoritative", "NotHost"].includes(local.err?.code), JSON.stringify(local));
  // ... and stamps nothing; what she stamped as host is from an older epoch to Bob.
  const cutOff = (await a.page.evaluate(() => window.T.stamp({ tick: 2 }))).err?.code;
  assert.ok(["NotAuthoritative", "NotHost"].includes(cutOff), cutOff);
  assert.equal(await b.page.evaluate((m) => window.T.acceptStamped("alice", m), oldStamp), null);
  a.proxy.restore();
  a.proxy.cut(); // the held connection is dead anyway: drop it so the SDK reconnects
  a.proxy.restore();
  await until("alice resynced to the new epoch", async () => {
    const v = await a.view();
    return v.phase === "live" && v.epoch > before && v.host === "bob";
  }, { timeout: 60_000 });
  const refused = await a.page.evaluate(() => window.T.command("poll.close", {}));
  assert.equal(refused.err?.code, "NotHost");
  assert.equal((await a.page.evaluate(() => window.T.stamp({ tick: 3 }))).err?.code, "NotHost");
  const bobs = (await b.page.evaluate(() => window.T.stampAsHost({ tick: 4 }))).ok;
  assert.equal(bobs?.hostleaseEpoch, (await b.view()).epoch);
  assert.deepEqual(await a.page.evaluate((m) => window.T.acceptStamped("bob", m), bobs), { tick: 4 });
  // Sent raw with her old token and epoch, the server refuses it and the poll is untouched.
  const resyncs = async () => (await a.log()).filter((e) => e.type === "connection" && e.payload.phase === "resyncing").length;
  const resyncsBefore = await resyncs(); // her reconnect resynced already
  const id = await a.page.evaluate(() => window.T.staleHostCommand("poll.close", {}));
  assert.ok(id, "alice held a host token before");
  await until("alice's stale command refused and resynced", async () => (await resyncs()) > resyncsBefore);
  assert.deepEqual((await a.log()).filter((e) => e.type === "raw_result").map((e) => e.payload),
    [{ outcome: "rejected", code: "stale_epoch" }]);
  const events = (await b.log()).filter((e) => e.type === "event" && e.payload.action === "poll.close");
  assert.equal(events.length, 0, "a stale host command took effect");
  await closeAll(a, b);
});

test("a connection that goes silent without closing is given up: provisional, then live again", async () => {
  const room = newRoom();
  const a = await member(room, "alice", { webrtc: false });
  await amHost(a);
  const b = await member(room, "bob", { webrtc: false });
  await live(b);
  // Bob's path stops carrying bytes and reports nothing (no close, no error): only the server's
  // heartbeats, missing for a whole window, tell his SDK that the connection is dead.
  b.proxy.hold();
  await until("bob gives the silent connection up", async () => (await b.log())
    .some((e) => e.type === "connection" && e.payload.phase === "offline"), { timeout: 90_000 });
  const v = await b.view();
  assert.notEqual(v.phase, "live");
  assert.notEqual(v.provisional, null, "a provisional coordinator while the server is unreachable");
  assert.equal(v.amHost, false);
  b.proxy.restore();
  await until("bob live again", async () => (await b.view()).phase === "live", { timeout: 60_000 });
  assert.equal((await b.view()).host, "alice");
  await closeAll(a, b);
});

test("a dial whose upgrade is never answered is given up and dialled again; the room goes live once the path answers", async () => {
  const room = newRoom();
  // Bob's first dial reaches something that takes the connection and never answers it (nor
  // closes it): the browser's own limit for that is minutes, and only the SDK's dial deadline
  // makes it dial again.
  const b = await member(room, "bob", { webrtc: false, silent: true });
  await until("bob dials again", async () => b.proxy.wsDials >= 2, { timeout: 60_000 });
  const v = await b.view();
  assert.notEqual(v.phase, "live");
  assert.equal(v.amHost, false);
  b.proxy.restore();
  await until("bob live", async () => (await b.view()).phase === "live", { timeout: 60_000 });
  await amHost(b);
  await closeAll(b);
});

test("server unreachable: the same provisional coordinator everywhere; back: authoritative, queued votes once", async () => {
  const room = newRoom();
  const a = await member(room, "alice");
  await amHost(a);
  const b = await member(room, "bob");
  const c = await member(room, "carol");
  await Promise.all([live(b), live(c)]);
  // Every page has both channels open (not only Alice's side of hers): a page that has not yet
  // reached Alice when the server goes would rightly name someone else.
  await until("mesh", async () => (await Promise.all([a, b, c].map((m) => m.page.evaluate(() => window.T.openPeers()))))
    .every((open) => open.length === 2), { timeout: 60_000 });
  const epoch = (await a.view()).epoch;
  for (const m of [a, b, c]) m.proxy.cut();
  const coords = await Promise.all([a, b, c].map((m) => until(`${m.pid} provisional`, async () => (await m.view()).provisional)));
  assert.deepEqual(coords, ["alice", "alice", "alice"]);
  for (const m of [a, b, c]) {
    const r = await m.page.evaluate(() => window.T.command("poll.open", { q: "offline?" }));
    assert.equal(r.err?.code, "NotAuthoritative");
  }
  const votes = [b, c].map((m) => m.page.evaluate(() => window.T.command("vote", { option: 1 })));
  await until("votes pending", async () => (await b.view()).pending.some((p) => p.queued));
  for (const m of [a, b, c]) m.proxy.restore();
  const results = await Promise.all(votes);
  for (const r of results) assert.ok(r.ok, JSON.stringify(r));
  for (const m of [a, b, c]) {
    await live(m);
    const v = await m.view();
    assert.ok(v.epoch >= epoch, "the epoch went back");
    assert.equal(v.provisional, null);
    const voteEvents = (await m.log()).filter((e) => e.type === "event" && e.payload.action === "vote");
    await until(`${m.pid} sees both votes`, async () => (await m.log()).filter((e) => e.type === "event" && e.payload.action === "vote").length >= 2);
    const seqs = (await m.log()).filter((e) => e.type === "event").map((e) => e.payload.seq);
    assert.deepEqual(seqs, [...new Set(seqs)].sort((x, y) => x - y), `${m.pid}: events applied twice or out of order`);
    void voteEvents;
  }
  await closeAll(a, b, c);
});

test("a forged relayed assignment is dropped; every error is an Error with a code; a throwing listener does not stop delivery", async () => {
  const room = newRoom();
  const a = await member(room, "alice", { webrtc: false });
  await amHost(a);
  const b = await member(room, "bob", { webrtc: false });
  await live(b);
  await b.page.evaluate(() => window.T.addThrowingListener("event"));
  const signed = (await a.view()).signed;
  assert.ok(signed?.sig, "the server signs assignments");
  const forged = { ...signed, host: "bob", session: (await b.view()).session, epoch: signed.epoch + 1 };
  await b.page.evaluate((f) => window.T.relay("alice", f), forged);
  await until("forged relay reported", async () => (await b.log()).some((e) => e.type === "relay" && e.payload.reason === "forged"));
  // The genuine assignment verifies (the wrapper's signed bytes are the server's) and, as bob
  // already holds its epoch, is reported stale rather than forged.
  await b.page.evaluate((s) => window.T.relay("alice", s), signed);
  await until("genuine relay verified", async () => (await b.log()).some((e) => e.type === "relay" && e.payload.reason === "stale"));
  const vb = await b.view();
  assert.equal(vb.host, "alice");
  assert.equal(vb.epoch, signed.epoch);
  const errors = (await b.log()).filter((e) => e.type === "error");
  assert.ok(errors.length > 0 && errors.every((e) => e.error?.isError && typeof e.error.code === "string"));
  // Delivery continues past the throwing listener.
  await a.page.evaluate(() => window.T.command("poll.open", { q: "still?" }));
  await until("bob still receives events", async () => (await b.log()).some((e) => e.type === "event"));
  assert.ok((await b.log()).some((e) => e.type === "error" && e.error.code === "ListenerError"));
  await closeAll(a, b);
});

test("an event frame is parsed once in JS when it is the next; any frame its checks refuse goes to the Rust codec, which reports it", async () => {
  const room = newRoom();
  const a = await member(room, "alice", { webrtc: false });
  // Host: her own grant (the next seq) is in, and no other item is coming.
  await amHost(a);
  const { cursor, epoch } = await a.view();
  const event = { seq: cursor + 1, epoch, actor: "alice", action: "vote", payload: { option: 2 }, at: 5 };
  const ev = (over) => JSON.stringify({ v: 1, t: "event", ...event, ...over });
  const badActor = ev({ actor: "al ice" });
  const badSeq = ev({ seq: String(cursor + 1) });
  const notJson = ev({}).replace(/}$/, ",}");
  const good = ev({});
  const decoded = await a.page.evaluate((f) => window.T.frames(f), [badActor, badSeq, notJson, good]);
  assert.deepEqual(decoded, [badActor, badSeq, notJson], "only the refused frames reach the codec");
  const log = await a.log();
  const codes = log.filter((e) => e.type === "error").map((e) => e.error.code);
  assert.deepEqual(codes.filter((c) => c === "malformed_frame").length, 3, JSON.stringify(codes));
  const events = log.filter((e) => e.type === "event").map((e) => e.payload);
  assert.deepEqual(events, [event]);
  assert.equal((await a.view()).cursor, cursor + 1);
  // The same frame again is a repeat: the core refuses it by seq, and the codec's path drops it.
  assert.deepEqual(await a.page.evaluate((f) => window.T.frames(f), [good]), [good]);
  assert.equal((await a.log()).filter((e) => e.type === "event").length, 1);
  await closeAll(a);
});

test("a reconnect resyncs: events made while cut off are applied once, in order", async () => {
  const room = newRoom();
  const a = await member(room, "alice", { webrtc: false });
  await amHost(a);
  const b = await member(room, "bob", { webrtc: false });
  await live(b);
  assert.ok((await a.page.evaluate(() => window.T.command("poll.open", { question: "q", options: ["x", "y"] }))).ok);
  await until("bob has the poll", async () => (await b.log()).some((e) => e.type === "event"));
  b.proxy.cut();
  await until("bob offline", async () => (await b.view()).phase === "offline");
  for (let i = 0; i < 5; i++) {
    const r = await a.page.evaluate((n) => window.T.command("vote", { option: n % 2 }), i);
    assert.ok(r.ok, JSON.stringify(r));
  }
  b.proxy.restore();
  await live(b);
  await until("bob caught up", async () => (await b.log()).filter((e) => e.type === "event").length >= 6);
  const seqs = (await b.log()).filter((e) => e.type === "event").map((e) => e.payload.seq);
  const aSeqs = (await a.log()).filter((e) => e.type === "event").map((e) => e.payload.seq);
  assert.deepEqual(seqs, aSeqs, "bob's events differ from alice's");
  assert.deepEqual(seqs, [...new Set(seqs)].sort((x, y) => x - y), "applied twice or out of order");
  await closeAll(a, b);
});

test("a page shown again, one hidden into the back-forward cache (pagehide), or a network change, marks the lease unknown and resyncs; a page going hidden, or a first load's pageshow, does not", async () => {
  const room = newRoom();
  const a = await member(room, "alice", { webrtc: false });
  await amHost(a);
  // The hooks run inside dispatchEvent, so the view has changed (or not) when it returns.
  const hideThenShow = () => {
    Object.defineProperty(document, "hidden", { configurable: true, get: () => true });
    Object.defineProperty(document, "visibilityState", { configurable: true, get: () => "hidden" });
    document.dispatchEvent(new Event("visibilitychange"));
    const hidden = window.T.view();
    // The real getters again: this headless page is visible.
    delete document.hidden;
    delete document.visibilityState;
    document.dispatchEvent(new Event("visibilitychange"));
    const shown = window.T.view();
    return [hidden.lease, hidden.phase, shown.lease, shown.phase, shown.amHost];
  };
  assert.deepEqual(await a.page.evaluate(hideThenShow), ["held", "live", "unknown", "resyncing", false]);
  // (After the pagehide, the next pageshow is a return, as from the back-forward cache.)
  for (const type of ["pagehide", "pageshow", "offline", "online"]) {
    // The resync answers and a lease probe confirms the lease again before the next one.
    await amHost(a);
    const after = await a.page.evaluate((type) => {
      window.dispatchEvent(new Event(type));
      const v = window.T.view();
      return [v.lease, v.phase];
    }, type);
    assert.deepEqual(after, ["unknown", "resyncing"], type);
  }
  // A pageshow without a pagehide since the last one is a first load's (it fires when `load`
  // does, which slow images can put after the tab went live as host, and after the tab was
  // hidden and shown again meanwhile, a wake of its own): nothing changes.
  await amHost(a);
  await a.page.evaluate(hideThenShow);
  await amHost(a);
  const first = await a.page.evaluate(() => {
    window.dispatchEvent(new PageTransitionEvent("pageshow", { persisted: false }));
    const v = window.T.view();
    return [v.lease, v.phase, v.amHost];
  });
  assert.deepEqual(first, ["held", "live", true]);
  await amHost(a);
  await closeAll(a);
});

test("a quiet page is not taken for a dead one: Chromium answers the server's pings", async () => {
  // A server that pings every session every 2 s and gives one up after 6 s without a frame:
  // bob, no host (no lease probes to echo) and sending nothing, is heard only by the pongs
  // Chromium sends for those pings, through his proxy. (With 400 ms, a pong had 800 ms to get
  // through a loaded machine's test process and Chromium; with 1 s, 2 s.)
  const quick = await startServer({ heartbeatMs: 2000 });
  try {
    const room = newRoom();
    const a = await member(room, "alice", { webrtc: false, server: quick });
    await amHost(a);
    const b = await member(room, "bob", { webrtc: false, server: quick });
    await live(b);
    // Six periods: a bounded wait, nothing timed.
    await new Promise((r) => setTimeout(r, 12_000));
    const phases = (await b.log()).filter((e) => e.type === "connection").map((e) => e.payload.phase);
    assert.deepEqual(phases.filter((p) => p !== "connecting"), ["live"], `bob's connection: ${phases}`);
    const metrics = await (await fetch(`${quick.base}/metrics`)).text();
    assert.ok(!/hostlease_ws_unresponsive_total [1-9]/.test(metrics), metrics);
    // The check can fail: a page that stops answering (its path held) is given up.
    b.proxy.hold();
    await until("the server gives up bob's held connection", async () =>
      /hostlease_ws_unresponsive_total [1-9]/.test(await (await fetch(`${quick.base}/metrics`)).text()), { timeout: 30_000 });
    await closeAll(a, b);
  } finally {
    await quick.stop();
  }
});

test("in a Web Worker the SDK has timers too: a connection cut there comes back by itself", async () => {
  const room = newRoom();
  const a = await member(room, "alice", { webrtc: false });
  await amHost(a);
  const ctx = await browser.newContext();
  const page = await ctx.newPage();
  page.on("pageerror", (e) => console.error("[worker page] pageerror", e));
  const proxy = new FaultProxy(srv.port);
  const port = await proxy.listen();
  const w = { pid: "wendy", page, proxy, ctx };
  opened.add(w);
  await page.goto(`http://127.0.0.1:${statics.port}/`);
  await page.waitForFunction(() => window.T?.ready);
  const token = await srv.mintToken(room, "wendy");
  await page.evaluate((o) => window.T.startWorker(o), { url: `ws://127.0.0.1:${port}`, room, token });
  const view = async () => (await page.evaluate(() => window.T.workerView())).view;
  await until("the worker's room is live", async () => (await view()).phase === "live");
  assert.equal((await view()).host, "alice");
  // Cut: the socket closes; the reconnect waits on a timer (the worker's: it had none before).
  proxy.cut();
  await until("the worker's room is offline", async () => (await view()).phase === "offline");
  proxy.restore();
  await until("the worker's room is live again", async () => (await view()).phase === "live", { timeout: 60_000 });
  assert.equal((await view()).host, "alice");
  await closeAll(w, a);
});

test("the join token is refreshed before it expires, without dropping the connection", async () => {
  const room = newRoom();
  // Expiring in 35 s: the wrapper refreshes 30 s ahead, so after about 5 s.
  const a = await member(room, "alice", { webrtc: false, tokenTtlMs: 35_000 });
  await live(a);
  await until("second token fetch", async () => (await a.log()).filter((e) => e.type === "token_fetch").length >= 2, { timeout: 30_000 });
  const log = await a.log();
  const phases = log.filter((e) => e.type === "connection").map((e) => e.payload.phase);
  assert.ok(!phases.includes("offline"), `the refresh dropped the connection: ${phases}`);
  const firstLive = log.find((e) => e.type === "connection" && e.payload.phase === "live").at;
  const refresh = log.filter((e) => e.type === "token_fetch")[1].at;
  assert.ok(refresh - firstLive < 35_000, "refreshed only after expiry");
  await closeAll(a);
});

test("a member who left reads what it missed from its durable inbox, with its join token in a header", async () => {
  const room = newRoom();
  const a = await member(room, "alice", { webrtc: false });
  await amHost(a);
  const b = await member(room, "bob", { webrtc: false });
  await live(b);
  await b.page.evaluate(() => window.T.close());
  // Bob's leave reaches the server; the poll opened after it is in his inbox.
  await until("bob gone from alice's members", async () => !(await a.view()).members.some((m) => m.id === "bob"));
  const opened = await a.page.evaluate(() => window.T.command("poll.open", { question: "while bob was away", options: ["a", "b"] }));
  assert.ok(opened.ok, JSON.stringify(opened));
  let lastErr = null; // a transient refusal (503, 429) is retried; the last one explains a timeout
  const page = await until("bob's inbox has the poll", async () => {
    const r = await b.page.evaluate(() => window.T.inbox(0));
    lastErr = r.err ?? lastErr;
    return r.ok?.entries.some((e) => e.item.kind === "event" && e.item.seq === opened.ok.seq) ? r.ok : false;
  }).catch((e) => {
    throw new Error(`${e.message}; last inbox error: ${JSON.stringify(lastErr)}`);
  });
  const cursors = page.entries.map((e) => e.cursor);
  assert.deepEqual(cursors, [...cursors].sort((x, y) => x - y), "inbox entries out of order");
  assert.equal(page.next, null);
  // Read on from the last cursor: nothing new.
  const rest = await b.page.evaluate((c) => window.T.inbox(c), cursors.at(-1));
  assert.deepEqual(rest.ok?.entries, []);
  // A forged token is refused with a typed error, never a string.
  const refused = await b.page.evaluate(({ url, room }) => window.T.fetchInbox({ url, room, token: "v1.forged.token" }),
    { url: `ws://127.0.0.1:${b.proxy.server.address().port}`, room });
  assert.equal(refused.err?.code, "unauthorized");
  assert.ok(refused.err.isHostlease && refused.err.name === "ConnectionError");
  await closeAll(a, b);
});

test("a kicked member's page closes and stays out; closing the room closes every page", async () => {
  const room = newRoom();
  const a = await member(room, "alice", { webrtc: false });
  await amHost(a);
  const b = await member(room, "bob", { webrtc: false });
  await live(b);
  const dialed = b.proxy.accepted;
  assert.deepEqual(await srv.admin(room, "kick", { participant: "bob" }), { kicked: 1 });
  await until("bob's page closed", async () => (await b.view()).phase === "closed");
  const errors = (m) => m.log().then((log) => log.filter((e) => e.type === "error").map((e) => e.error.code));
  assert.ok((await errors(b)).includes("kicked"), JSON.stringify(await errors(b)));
  await until("bob gone from alice's members", async () => !(await a.view()).members.some((m) => m.id === "bob"));
  // Longer than the supervisor's first reconnect delays: a page that would rejoin has by now.
  await new Promise((r) => setTimeout(r, 3_000));
  assert.equal(b.proxy.accepted, dialed, "the kicked page dialled the server again");
  assert.equal((await b.view()).phase, "closed");
  const refused = await b.page.evaluate(() => window.T.command("vote", { option: 0 }));
  assert.equal(refused.err?.code, "Closed");

  await srv.admin(room, "close");
  await until("alice's page closed", async () => (await a.view()).phase === "closed");
  assert.ok((await errors(a)).includes("room_closed"), JSON.stringify(await errors(a)));
  await closeAll(a, b);
});

test("a fixed join token the server refuses closes the room (its error says why): its queued vote fails Closed and it does not dial again", async () => {
  const room = newRoom();
  const ctx = await browser.newContext();
  const page = await ctx.newPage();
  const proxy = new FaultProxy(srv.port);
  const port = await proxy.listen();
  const m = { pid: "mallory", page, proxy, ctx };
  opened.add(m);
  await page.goto(`http://127.0.0.1:${statics.port}/`);
  await page.waitForFunction(() => window.T?.ready);
  // A token the app minted for another room: the server refuses it at hello.
  const token = await srv.mintToken(`${room}-other`, "mallory");
  await page.evaluate((o) => window.T.start(o), { url: `ws://127.0.0.1:${port}`, room, token, webrtc: false });
  const vote = page.evaluate(() => window.T.command("vote", { option: 1 }));
  await until("the page closed", async () => (await page.evaluate(() => window.T.view())).phase === "closed");
  assert.equal((await vote).err?.code, "Closed");
  const log = await page.evaluate(() => window.T.log);
  // With the server's own words (it was a generic "the server sent an error frame").
  assert.ok(log.some((e) => e.type === "error" && e.error.code === "unauthorized" && e.error.message === "join token refused"), JSON.stringify(log));
  const dialed = proxy.accepted;
  // Longer than the supervisor's first reconnect delays: a page that would knock again has by now.
  await new Promise((r) => setTimeout(r, 3_000));
  assert.equal(proxy.accepted, dialed, "the page dialled again with the refused token");
  await closeAll(m);
});
