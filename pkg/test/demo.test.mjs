// End-to-end tests of the live-poll demo (www/): the real hostlease-server serving the demo with
// `--dev --www`, as `cargo xtask demo` does, and 3 Chromium pages per scenario (playwright-core,
// Debian's browser), all inside a loopback-only network namespace (see `cargo xtask test`).
//
// Each page loads the demo through its own fault-injecting TCP proxy, so its WebSocket (same
// origin) can be cut, held and restored on its own; WebRTC data channels between the pages are
// direct. The UI is driven through the DOM; assertions are on the DOM and on the SDK's view
// (`window.demo.room.view`). Waits are for conditions, with generous bounds; nothing asserts that
// something was fast. A screenshot per scenario lands in target/e2e-artifacts/.

import { test, before, after, afterEach } from "node:test";
import assert from "node:assert/strict";
import { cp, copyFile, mkdir, rm } from "node:fs/promises";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";
import { FaultProxy } from "./harness/proxy.mjs";
import { startServer } from "./harness/server.mjs";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));
const WWW = join(ROOT, "target/e2e-www");
const ARTIFACTS = join(ROOT, "target/e2e-artifacts");
const LEASE_MS = 3000; // short, for quick failovers; with margin for a starved CI machine
const ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
  "--disable-background-networking", "--disable-component-update", "--disable-sync",
  "--allow-loopback-in-peer-connection", "--disable-dev-shm-usage"];
const HOST_CONTROLS = ["open", "close-poll", "transfer", "resign", "question", "options", "transfer-to"];

/** The demo laid out as `cargo xtask demo` does: www/ plus the built package under pkg/. */
async function layoutDemo() {
  await rm(WWW, { recursive: true, force: true });
  await cp(join(ROOT, "www"), WWW, { recursive: true });
  await mkdir(join(WWW, "pkg/wasm"), { recursive: true });
  for (const f of ["index.js", "wasm/hostlease.js", "wasm/hostlease_bg.wasm"]) {
    await copyFile(join(ROOT, "pkg", f), join(WWW, "pkg", f));
  }
}

/** The harness proxy, plus a one-way hold: what the page sends reaches the server, the answers
 * do not (a command applied whose result is lost). */
class Proxy extends FaultProxy {
  holdDownstream() {
    for (const p of this.pairs) {
      p.upstream.unpipe(p.client);
      p.upstream.pause();
    }
  }
}

let browser, srv;
const opened = new Set(); // members not closed yet: a failed scenario must not leak its proxies

before(async () => {
  await layoutDemo();
  await mkdir(ARTIFACTS, { recursive: true });
  srv = await startServer({ leaseMs: LEASE_MS, www: WWW });
  browser = await chromium.launch({ executablePath: "/usr/bin/chromium", headless: true, chromiumSandbox: false, args: ARGS });
});

afterEach(async () => {
  await closeAll(...opened);
});

after(async () => {
  await browser?.close();
  await srv?.stop();
});

async function until(what, fn, { timeout = 45_000, every = 150 } = {}) {
  const end = Date.now() + timeout;
  let last;
  while (Date.now() < end) {
    try {
      last = await fn();
    } catch (e) {
      last = `threw: ${e.message}`;
    }
    if (last === true || (last && typeof last !== "string")) return last;
    await new Promise((r) => setTimeout(r, every));
  }
  throw new Error(`timed out waiting for ${what}; last: ${typeof last === "string" ? last : JSON.stringify(last)}`);
}

let roomNo = 0;
const newRoom = (tag) => `${tag}-${process.pid}-${++roomNo}`;

/** Opens the demo for `name` in `room` through its own proxy to `server`, and joins. */
async function member(server, room, name) {
  const ctx = await browser.newContext({ viewport: { width: 1100, height: 800 } });
  await ctx.grantPermissions(["microphone", "camera"]);
  // Every WebSocket the page opens, for a frame sent raw around the SDK (it has no such hook).
  await ctx.addInitScript(() => {
    const sockets = (window.__sockets = []);
    window.WebSocket = class extends window.WebSocket {
      constructor(...args) {
        super(...args);
        sockets.push(this);
      }
    };
  });
  const page = await ctx.newPage();
  const proxy = new Proxy(server.port);
  const port = await proxy.listen();
  const m = { name, page, ctx, proxy, results: [], consoleErrors: [], pageErrors: [] };
  opened.add(m);
  page.on("pageerror", (e) => m.pageErrors.push(String(e)));
  page.on("console", (msg) => msg.type() === "error" && m.consoleErrors.push(msg.text()));
  // Every command result the server sends this page, and the newest host capability, whatever
  // socket it came on.
  page.on("websocket", (ws) => ws.on("framereceived", ({ payload }) => {
    if (typeof payload !== "string") return;
    try {
      if (payload.includes('"command_result"')) m.results.push(JSON.parse(payload));
      if (payload.includes('"t":"capability"') && JSON.parse(payload).role === "host") m.hostCap = JSON.parse(payload);
    } catch {}
  }));
  await page.goto(`http://127.0.0.1:${port}/?room=${encodeURIComponent(room)}&name=${encodeURIComponent(name)}`);
  assert.equal(await page.inputValue("#room"), room);
  assert.equal(await page.inputValue("#name"), name);
  await page.click("#join-form button[type=submit]");
  await until(`${name} live`, async () => (await view(m))?.phase === "live");
  await page.waitForSelector("#app:not([hidden])");
  m.id = (await view(m)).me;
  return m;
}

const view = (m) => m.page.evaluate(() => window.demo.room?.view ?? null);
const demoState = (m) => m.page.evaluate(() => {
  const s = window.demo.state;
  return { poll: s.poll, log: s.log, relays: s.relays, timeline: s.timeline, pending: s.pendingVotes.size };
});

/** What the page shows. */
const dom = (m) => m.page.evaluate((controls) => {
  const $ = (id) => document.getElementById(id);
  return {
    phase: $("phase").textContent,
    host: $("host").textContent,
    epoch: $("epoch").textContent,
    banner: !$("banner").hidden,
    provisional: $("provisional").textContent,
    controlsDisabled: controls.every((id) => $(id).disabled),
    controlsEnabled: controls.every((id) => !$(id).disabled),
    question: $("poll-question").textContent,
    pollState: $("poll-state").textContent,
    counts: [...document.querySelectorAll("#poll-options .count")].map((e) => Number(e.textContent)),
    pendingNotes: document.querySelectorAll("#poll-options .pending").length,
    timeline: [...document.querySelectorAll("#timeline li")].map((li) => li.textContent),
    hostError: $("host-error").hidden ? null : $("host-error").textContent,
  };
}, HOST_CONTROLS);

/** The error the host card shows, once it shows one. */
async function hostError(m, what) {
  return until(what, async () => {
    const text = (await dom(m)).hostError;
    return text ? { text } : "no error shown";
  }).then((r) => r.text);
}

/** Closes the pages; none may have thrown an uncaught exception on the way. */
async function closeAll(...ms) {
  for (const m of ms) {
    opened.delete(m);
    await m.ctx.close().catch(() => {});
    await m.proxy.close();
  }
  for (const m of ms) assert.deepEqual(m.pageErrors, [], `${m.name}'s page threw`);
}

async function screenshot(m, scenario) {
  await m.page.screenshot({ path: join(ARTIFACTS, `${scenario}.png`), fullPage: true });
}

/** Every page, DOM and SDK, agrees on `host` (an id) and on one epoch; returns that epoch. */
async function agree(ms, host, { timeout } = {}) {
  return until(`all pages agree that ${host} hosts`, async () => {
    let epoch = null;
    for (const m of ms) {
      const [v, d] = [await view(m), await dom(m)];
      if (v.phase !== "live" || v.host !== host || d.host !== host || d.phase !== "live") return `${m.name}: ${v.phase} ${v.host} / ${d.phase} ${d.host}`;
      if (v.amHost !== (m.id === host)) return `${m.name}: amHost ${v.amHost}`;
      if (String(v.epoch) !== d.epoch) return `${m.name}: epoch ${v.epoch} vs DOM ${d.epoch}`;
      if (epoch !== null && v.epoch !== epoch) return `epochs differ: ${epoch} vs ${m.name} ${v.epoch}`;
      epoch = v.epoch;
    }
    return { epoch };
  }, { timeout }).then((r) => r.epoch);
}

/** Every page agrees on some host and epoch, twice in a row (the server may still be electing). */
/** A new room with Alice (who becomes host), then Bob and Carol, each on its own page through its
 * own proxy to the shared server; resolves once every page agrees that Alice hosts. */
async function threeMembers(tag) {
  const room = newRoom(tag);
  const a = await member(srv, room, "Alice");
  await until("alice hosts", async () => (await view(a)).amHost);
  const b = await member(srv, room, "Bob");
  const c = await member(srv, room, "Carol");
  const all = [a, b, c];
  const epoch = await agree(all, a.id);
  return { a, b, c, all, epoch };
}

async function agreeOnAny(ms) {
  let prev = null;
  return until("all pages agree on a host", async () => {
    const v = await view(ms[0]);
    const now = v.host ? await agree(ms, v.host, { timeout: 3_000 }).then((epoch) => ({ host: v.host, epoch }), () => null) : null;
    const same = now && prev && now.host === prev.host && now.epoch === prev.epoch;
    prev = now;
    return same ? now : `not yet: ${JSON.stringify(now)}`;
  }, { timeout: 60_000, every: 500 });
}

/** Host controls are enabled on the host's page only. */
async function controlsOnlyFor(ms, host) {
  await until("host controls enabled for the host only", async () => {
    for (const m of ms) {
      const d = await dom(m);
      if (m.id === host ? !d.controlsEnabled : !d.controlsDisabled) return `${m.name}: ${JSON.stringify(d)}`;
    }
    return true;
  });
}

async function openPoll(host, question, options) {
  await host.page.fill("#question", question);
  await host.page.fill("#options", options.join(", "));
  await host.page.click("#open");
}

const castVote = (m, option) => m.page.click(`#poll-options button[data-option="${option}"]`);

/** Every page shows `counts` for the open poll `question`. */
async function countsAre(ms, question, counts, state = "open — vote below") {
  await until(`counts ${counts} everywhere`, async () => {
    for (const m of ms) {
      const d = await dom(m);
      if (d.question !== question || d.pollState !== state || JSON.stringify(d.counts) !== JSON.stringify(counts) || d.pendingNotes) {
        return `${m.name}: ${d.question} ${d.pollState} ${d.counts} pending ${d.pendingNotes}`;
      }
    }
    return true;
  });
}

/** Every page's SDK has its data channels to all the others open. */
async function meshed(ms) {
  await until("the WebRTC mesh is up", async () => {
    for (const m of ms) {
      const open = await m.page.evaluate(() => [...window.demo.peers.values()].filter((pc) => pc.connectionState === "connected").length);
      if (open < ms.length - 1) return `${m.name}: ${open} open`;
    }
    return true;
  }, { timeout: 60_000 });
}

/** Each page's room events: in order, none twice, the same on every page. */
async function sameEventStream(ms) {
  const logs = [];
  for (const m of ms) {
    const seqs = (await demoState(m)).log.map((e) => e.seq);
    assert.deepEqual(seqs, [...new Set(seqs)].sort((x, y) => x - y), `${m.name}: events applied twice or out of order`);
    logs.push(seqs);
  }
  for (const l of logs.slice(1)) assert.deepEqual(l, logs[0], "the pages saw different event streams");
}

const votesBy = async (m, actor) => (await demoState(m)).log.filter((e) => e.action === "vote" && e.actor === actor).map((e) => e.payload.option);

// ----- scenarios -------------------------------------------------------------------------------

test("the first member becomes host; all pages agree on host and epoch; polls and a hand-over work", { timeout: 180_000 }, async () => {
  const { a, b, c, all, epoch } = await threeMembers("first");
  await controlsOnlyFor(all, a.id);
  for (const m of all) {
    const [v, d] = [await view(m), await dom(m)];
    assert.equal(v.members.length, 3, `${m.name} sees every member`);
    assert.equal(d.timeline.length, 1, `${m.name}: ${JSON.stringify((await demoState(m)).timeline)}`);
    assert.match(d.timeline[0], new RegExp(`epoch ${epoch}: nobody → ${a.id} \\(elected\\)`));
  }

  await openPoll(a, "Where do we eat?", ["Pizza", "Sushi", "Tacos"]);
  await countsAre(all, "Where do we eat?", [0, 0, 0]);
  await castVote(a, 1);
  await castVote(b, 1);
  await castVote(c, 0);
  await countsAre(all, "Where do we eat?", [1, 2, 0]);

  // The host hands over through the UI: a second assignment, everyone agrees, nobody votes twice.
  await a.page.selectOption("#transfer-to", b.id);
  await a.page.click("#transfer");
  const epoch2 = await agree(all, b.id);
  assert.ok(epoch2 > epoch, "the hand-over made a new epoch");
  await controlsOnlyFor(all, b.id);
  for (const m of all) {
    const d = await dom(m);
    // A live page may still hear of it from a peer first, a relay being quicker than the server.
    assert.match(d.timeline[0], new RegExp(`epoch ${epoch2}: ${a.id} → ${b.id} \\(transferred(, via a peer)?\\)$`));
  }
  await countsAre(all, "Where do we eat?", [1, 2, 0]);
  await sameEventStream(all);
  await screenshot(b, "first-host");
  // Without faults the console stays clean (with them, Chromium itself logs the failed sockets).
  for (const m of all) assert.deepEqual(m.consoleErrors, [], `${m.name}'s console`);
  await closeAll(...all);
});

test("the host's page is closed: a new host, every page agrees, the timeline shows why", { timeout: 180_000 }, async () => {
  const { a, b, c, epoch } = await threeMembers("closed");

  await a.ctx.close(); // the tab goes away, whatever it managed to say on the way out
  const rest = [b, c];
  const next = await until("a new host", async () => {
    const v = await view(b);
    return v.host && v.host !== a.id && v.epoch > epoch ? { host: v.host } : `${v.host}@${v.epoch}`;
  }, { timeout: 60_000 }).then((r) => r.host);
  assert.ok([b.id, c.id].includes(next));
  const epoch2 = await agree(rest, next);
  await controlsOnlyFor(rest, next);
  for (const m of rest) {
    const t = (await demoState(m)).timeline.at(-1);
    assert.equal(t.to, next);
    assert.equal(t.epoch, epoch2);
    assert.ok(["left", "lease_lapsed"].includes(t.reason), `reason ${t.reason}`);
    const d = await dom(m);
    assert.ok(d.timeline[0].endsWith(`epoch ${epoch2}: ${a.id} → ${next} (${t.reason.replace("_", " ")}${t.via === "peer" ? ", via a peer" : ""})`), d.timeline[0]);
    await until(`${m.name} no longer lists the closed tab`, async () => !(await view(m)).members.some((x) => x.id === a.id));
  }
  await screenshot(next === b.id ? b : c, "host-page-closed");
  await closeAll(a, b, c);
});

test("a deposed host cut off past its lease, then back with its old token: its close poll does not take effect", { timeout: 180_000 }, async () => {
  const { a, b, c, all, epoch } = await threeMembers("deposed");
  await openPoll(a, "Tea or coffee?", ["Tea", "Coffee"]);
  await countsAre(all, "Tea or coffee?", [0, 0]);
  await castVote(b, 0);
  await castVote(c, 1);
  await countsAre(all, "Tea or coffee?", [1, 1]);
  const pollId = (await demoState(a)).poll.id;

  // Alice's connection goes silent (nothing closed, nothing forwarded) for longer than her lease.
  a.proxy.hold();
  const next = await until("a new host elected", async () => {
    const v = await view(b);
    return v.host && v.host !== a.id && v.epoch > epoch ? { host: v.host } : `${v.host}@${v.epoch}`;
  }, { timeout: 60_000 }).then((r) => r.host);
  await agree([b, c], next);
  // Her SDK stops acting as host by itself, and her UI says so.
  await until("alice's page no longer acts as host", async () => !(await view(a)).amHost && (await dom(a)).controlsDisabled);
  // A stale UI that still offers the button: the SDK refuses the command.
  const forceClose = () => a.page.evaluate(() => {
    const btn = document.getElementById("close-poll");
    btn.disabled = false;
    btn.click();
  });
  await forceClose();
  const offlineErr = await hostError(a, "alice's close refused locally");
  assert.match(offlineErr, /^(LeaseExpired|NotAuthoritative|NotHost):/);

  // Her connection comes back (the held one is dead: drop it so the SDK reconnects).
  a.proxy.restore();
  a.proxy.cut();
  a.proxy.restore();
  const epoch2 = await agree(all, next);
  assert.ok(epoch2 > epoch);
  await controlsOnlyFor(all, next);
  const code = await a.page.evaluate(async (poll) => {
    try {
      await window.demo.room.command("poll.close", { poll });
      return "accepted";
    } catch (e) {
      return e.code;
    }
  }, pollId);
  assert.equal(code, "NotHost");
  await until("alice's hidden error cleared", async () => (await dom(a)).hostError === null, { timeout: 15_000 });
  await forceClose();
  assert.match(await hostError(a, "alice's UI close refused"), /^NotHost:/);

  // Sent raw, around the SDK, with the host token she held and its epoch: the server refuses it.
  assert.ok(a.hostCap, "alice held a host token");
  const rawId = `raw-${Date.now()}`;
  const sent = await a.page.evaluate((frame) => {
    const open = window.__sockets.filter((s) => s.readyState === WebSocket.OPEN).at(-1);
    return open ? (open.send(JSON.stringify(frame)), true) : false;
  },
    { v: 1, t: "command", id: rawId, action: "poll.close", payload: { poll: pollId }, epoch: a.hostCap.epoch, capability: a.hostCap.token });
  assert.ok(sent, "sent on alice's socket");
  const result = await until("the server's answer to the raw command", async () => a.results.find((r) => r.id === rawId));
  assert.equal(result.outcome, "rejected", JSON.stringify(result));
  assert.ok(["stale_epoch", "not_host", "bad_capability", "lease_expired"].includes(result.code), JSON.stringify(result));

  // The poll is untouched everywhere (the server answers after it publishes, so an applied close
  // would be in every stream by now), and nobody's vote moved.
  await agree(all, next);
  await countsAre(all, "Tea or coffee?", [1, 1]);
  for (const m of all) {
    assert.equal((await demoState(m)).log.filter((e) => e.action === "poll.close").length, 0, `${m.name} saw a close`);
  }
  await screenshot(a, "deposed-host");
  await closeAll(...all);
});

test("the server is killed: one provisional coordinator, host controls off; restarted: same epoch line, every vote once", { timeout: 180_000 }, async () => {
  const own = await startServer({ leaseMs: LEASE_MS, www: WWW });
  const all = [];
  try {
    const room = newRoom("killed");
    const a = await member(own, room, "Alice");
    all.push(a);
    await until("alice hosts", async () => (await view(a)).amHost);
    const b = await member(own, room, "Bob");
    all.push(b);
    const c = await member(own, room, "Carol");
    all.push(c);
    const epoch = await agree(all, a.id);
    await openPoll(a, "Ship it?", ["Yes", "No"]);
    await countsAre(all, "Ship it?", [0, 0]);
    await castVote(b, 0);
    await countsAre(all, "Ship it?", [1, 0]);
    await meshed(all);

    await own.kill();
    const coords = await until("every page shows a provisional coordinator", async () => {
      const out = [];
      for (const m of all) {
        const [v, d] = [await view(m), await dom(m)];
        if (v.phase === "live" || !v.provisional || !d.banner || d.provisional !== v.provisional || !d.controlsDisabled || v.amHost) {
          return `${m.name}: ${v.phase} ${v.provisional} banner ${d.banner} ${d.provisional} disabled ${d.controlsDisabled}`;
        }
        out.push(v.provisional);
      }
      return new Set(out).size === 1 ? out : `differ: ${out}`;
    });
    assert.equal(coords[0], a.id, "the host stays the provisional coordinator while everyone reaches it");
    // Votes while the server is gone stay pending, and are sent once it is back.
    await castVote(c, 1);
    await castVote(a, 1);
    await until("the offline votes are pending", async () => (await dom(c)).pendingNotes > 0 && (await dom(a)).pendingNotes > 0);
    await screenshot(c, "server-killed");

    await own.restart();
    const epoch2 = await until("authoritative again", async () => {
      for (const m of all) {
        const [v, d] = [await view(m), await dom(m)];
        if (v.phase !== "live" || d.banner || v.provisional !== null) return `${m.name}: ${v.phase} banner ${d.banner}`;
      }
      return { epoch: (await view(a)).epoch };
    }, { timeout: 60_000 }).then((r) => r.epoch);
    assert.ok(epoch2 >= epoch, `the epoch went back from ${epoch} to ${epoch2}`);
    // Alice's lease may have lapsed while the server was down (then the server elects again,
    // with the next epoch): wait for every page to agree on whoever hosts now.
    const { host, epoch: epoch3 } = await agreeOnAny(all);
    assert.ok(epoch3 >= epoch);
    await controlsOnlyFor(all, host);
    for (const m of all) {
      const epochs = (await demoState(m)).timeline.map((t) => t.epoch);
      assert.deepEqual(epochs, [...epochs].sort((x, y) => x - y), `${m.name}: the epoch line went backwards`);
    }
    await countsAre(all, "Ship it?", [1, 2]);
    for (const m of all) {
      assert.deepEqual(await votesBy(m, a.id), [1], `${m.name}: alice's vote`);
      assert.deepEqual(await votesBy(m, b.id), [0], `${m.name}: bob's vote`);
      assert.deepEqual(await votesBy(m, c.id), [1], `${m.name}: carol's vote`);
    }
    await sameEventStream(all);
  } finally {
    try {
      await closeAll(...all);
    } finally {
      await own.stop(); // this scenario's own server: never left running, whatever failed
    }
  }
});

test("a page cut off from the server learns the new host from a peer (verified); a forged relay is rejected", { timeout: 180_000 }, async () => {
  const { a, b, c, all, epoch } = await threeMembers("relay");
  await meshed(all);
  // Carol has verified a relay already (each side relays its assignment when a channel opens),
  // so she holds the server's public keys.
  await until("carol verified a relay", async () => (await demoState(c)).relays.some((r) => r.accepted || r.reason === "stale"));

  c.proxy.cut();
  await until("carol offline", async () => (await view(c)).phase === "offline" && (await dom(c)).banner);
  await until("the server saw carol go", async () => !(await view(a)).members.some((m) => m.id === c.id));
  await a.page.selectOption("#transfer-to", b.id);
  await a.page.click("#transfer");
  const epoch2 = await agree([a, b], b.id);
  assert.ok(epoch2 > epoch);

  await until("carol learns bob hosts, through a peer", async () => {
    const [v, d] = [await view(c), await dom(c)];
    return v.host === b.id && v.epoch === epoch2 && d.host === b.id && d.epoch === String(epoch2) ? true : `${v.host}@${v.epoch}`;
  });
  const cv = await view(c);
  assert.equal(cv.phase, "offline", "carol's server connection stayed blocked");
  assert.equal(cv.amHost, false);
  const t = (await demoState(c)).timeline.at(-1);
  assert.deepEqual([t.to, t.epoch, t.reason, t.via], [b.id, epoch2, "transferred", "peer"]);
  assert.ok((await dom(c)).timeline[0].includes(`epoch ${epoch2}: ${a.id} → ${b.id} (transferred, via a peer)`));
  assert.ok((await demoState(c)).relays.some((r) => r.accepted && r.epoch === epoch2), "adopted after verification");
  assert.deepEqual(cv.signed.sig, (await view(a)).signed.sig, "carol holds the server's signature");

  // Alice relays a forged assignment (Carol hosts, one epoch on) over her real data channel.
  const forgedAt = (await demoState(c)).relays.length;
  await a.page.evaluate((to) => {
    const signed = window.demo.room.view.signed;
    const forged = { ...signed, host: to, epoch: signed.epoch + 1 };
    window.demo.room._peers.get(to).channel.send(JSON.stringify({ t: "hostlease.relay", assignment: forged }));
  }, c.id);
  const verdict = await until("carol rejects the forged relay", async () => (await demoState(c)).relays.slice(forgedAt).find((r) => r.epoch === epoch2 + 1));
  assert.deepEqual([verdict.accepted, verdict.reason], [false, "forged"]);
  const after = await view(c);
  assert.deepEqual([after.host, after.epoch, after.amHost], [b.id, epoch2, false]);
  assert.equal((await dom(c)).host, b.id);
  await screenshot(c, "peer-relay");

  c.proxy.restore();
  await agree(all, b.id);
  await closeAll(...all);
});

test("votes cast during a reconnect are neither lost nor counted twice", { timeout: 180_000 }, async () => {
  const { a, b, c, all } = await threeMembers("votes");
  await openPoll(a, "Best editor?", ["vi", "emacs", "nano"]);
  await countsAre(all, "Best editor?", [0, 0, 0]);

  // Bob's vote reaches the server but its result never reaches him.
  b.proxy.holdDownstream();
  await castVote(b, 0);
  await until("the server applied bob's vote", async () => (await votesBy(a, b.id)).length === 1);
  // His connection then dies; while he is off he changes his mind, and Carol votes.
  b.proxy.cut();
  await until("bob offline", async () => (await view(b)).phase !== "live");
  await castVote(b, 2);
  await castVote(c, 1);
  b.proxy.restore();

  await until("bob live, nothing pending", async () => {
    const [v, s] = [await view(b), await demoState(b)];
    return v.phase === "live" && v.pending.length === 0 && s.pending === 0;
  }, { timeout: 60_000 });
  await countsAre(all, "Best editor?", [0, 1, 1]);
  for (const m of all) {
    assert.deepEqual(await votesBy(m, b.id), [0, 2], `${m.name}: bob's votes`);
    assert.deepEqual(await votesBy(m, c.id), [1], `${m.name}: carol's vote`);
  }
  await sameEventStream(all);
  await screenshot(b, "votes-during-reconnect");
  await closeAll(...all);
});

test("a reloaded page gets its WebRTC links back; payloads the app does not send break no page", { timeout: 180_000 }, async () => {
  const { a, b, c, all } = await threeMembers("reload");
  await meshed(all);
  // Carol's id sorts last: Alice and Bob offer her their links, and must offer them again to the
  // session her reloaded page joins as (the links they held went to a page that is gone, and
  // she offers none).
  assert.ok(a.id < c.id && b.id < c.id, `${a.id} ${b.id} ${c.id}`);
  await c.page.reload();
  await c.page.click("#join-form button[type=submit]");
  await until("carol live again", async () => (await view(c))?.phase === "live");
  assert.equal((await view(c)).me, c.id, "the same participant (the tab keeps its id)");
  await meshed(all);

  // An answer or a candidate of a link let go of (it arrives late, after a reconnect) goes to no
  // link: the one made since would take an answer to an offer it did not make.
  await c.page.evaluate(() => {
    const spied = (window.spied = { calls: 0, signals: 0 });
    for (const f of ["setRemoteDescription", "addIceCandidate"]) {
      const real = RTCPeerConnection.prototype[f];
      RTCPeerConnection.prototype[f] = function (...args) {
        spied.calls++;
        return real.apply(this, args);
      };
    }
    window.demo.room.on("signal", () => spied.signals++);
  });
  const stale = await a.page.evaluate((to) => {
    const sdp = { type: "answer", sdp: [...window.demo.peers.values()][0].localDescription.sdp };
    const candidate = { candidate: "candidate:1 1 udp 1 127.0.0.1 9 typ host", sdpMid: "0" };
    return [{ link: "gone", sdp }, { link: "gone", candidate }, { sdp }, { candidate }]
      .map((data) => window.demo.room.signal(to, data));
  }, c.id);
  assert.deepEqual(stale, [true, true, true, true]);
  await until("carol got the four signals", async () => (await c.page.evaluate(() => window.spied.signals)) === 4);
  assert.equal(await c.page.evaluate(() => window.spied.calls), 0, "a stale signal reached a link");
  await meshed(all);

  // The server checks no payload shapes: a poll without options and a vote without a poll are
  // committed like any other, and every page must go on.
  await a.page.evaluate(() => window.demo.room.command("poll.open", { question: 1 }));
  await b.page.evaluate(() => window.demo.room.command("vote", null));
  await openPoll(a, "Tea?", ["yes", "no"]);
  await countsAre(all, "Tea?", [0, 0]);
  await castVote(c, 1);
  await countsAre(all, "Tea?", [0, 1]);
  await closeAll(...all);
});
