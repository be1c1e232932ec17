// The live-poll demo: the host opens and closes polls, members vote (participant commands, one
// counted per member per poll), everyone sees who hosts, the epoch, the lease, and a timeline of
// every assignment. Members also connect to each other over WebRTC data channels (signalling
// relayed by the server) so that a provisional coordinator can be shown while the server is down.
import { init, connect } from "./pkg/index.js";

const $ = (id) => document.getElementById(id);
let room = null;
const peers = new Map();
// `log` (every room event applied) and `relays` (the SDK's verdict on each relayed assignment)
// are only read by the end-to-end tests, as are `peers` and `room` on `window.demo`. Each list
// keeps its newest `KEEP` entries.
const state = { poll: null, votes: new Map(), pendingVotes: new Map(), timeline: [], log: [], relays: [] };
const KEEP = 1000;
const keep = (list, item) => list.push(item) > KEEP && list.splice(0, list.length - KEEP);
window.demo = { state, peers, get room() { return room; } };

// ----- state from room events --------------------------------------------------------------

// Payloads are whatever a member sent (the server checks no shapes): one that is not what this
// app sends is ignored, never trusted.
const isPoll = (p) => typeof p?.question === "string" && Array.isArray(p.options)
  && p.options.length <= 8 && p.options.every((o) => typeof o === "string");

function applyEvent(e) {
  keep(state.log, { seq: e.seq, epoch: e.epoch, actor: e.actor, action: e.action, payload: e.payload });
  const p = e.payload;
  if (e.action === "poll.open" && isPoll(p)) {
    state.poll = { id: e.seq, question: p.question, options: p.options, open: true };
    state.votes = new Map();
    state.unknown = false;
  } else if (e.action === "poll.close" && state.poll) {
    state.poll.open = false;
  } else if (e.action === "vote" && state.poll?.open && p?.poll === state.poll.id && Number.isInteger(p.option)) {
    state.votes.set(e.actor, p.option); // once per member: the latest choice counts
  }
  render();
}

/** Room events were lost (a replay cut short, or a gap the server could not fill): what the poll
 * is now is not known until the next one opens. */
function onDiscontinuity() {
  state.poll = null;
  state.votes = new Map();
  state.unknown = true;
  render();
}

// ----- rendering -------------------------------------------------------------------------------

/** What changes with time alone (the lease's deadline passing): the status and host controls. */
function renderStatus() {
  if (!room) return;
  const v = room.view;
  $("status").dataset.phase = v.phase;
  $("phase").textContent = v.phase;
  $("host").textContent = v.host ?? "nobody";
  $("epoch").textContent = v.epoch ?? "—";
  $("lease").textContent = v.lease;
  $("me").textContent = v.me ?? "—";
  $("banner").hidden = v.phase !== "offline";
  $("provisional").textContent = v.provisional ?? "nobody reachable";
  for (const id of ["open", "close-poll", "transfer", "resign", "question", "options", "transfer-to"]) $(id).disabled = !v.amHost;
  $("host-card").dataset.amHost = String(v.amHost);
  return v;
}

function render() {
  const v = renderStatus();
  if (!v) return;
  const others = v.members.filter((m) => m.id !== v.me);
  const sel = $("transfer-to");
  const chosen = sel.value;
  sel.replaceChildren(...[...new Set(others.map((m) => m.id))].map((id) => new Option(id, id)));
  if (chosen) sel.value = chosen;
  $("members").replaceChildren(...v.members.map((m) => {
    const li = document.createElement("li");
    li.textContent = `${m.name || m.id}${m.id === v.me ? " (you)" : ""}`;
    if (m.id === v.host && m.session === v.hostSession) li.className = "host";
    return li;
  }));

  const p = state.poll;
  $("poll-question").textContent = p ? p.question : state.unknown ? "Poll unknown (events were missed)" : "No poll yet";
  $("poll-state").textContent = p ? (p.open ? "open — vote below" : "closed") : "the host can open one";
  const counts = p ? p.options.map((_, i) => [...state.votes.values()].filter((o) => o === i).length) : [];
  const total = Math.max(1, counts.reduce((a, b) => a + b, 0));
  const mine = state.votes.get(v.me);
  $("poll-options").replaceChildren(...(p ? p.options : []).map((opt, i) => {
    const li = document.createElement("li");
    const btn = document.createElement("button");
    btn.textContent = opt;
    btn.disabled = !p.open;
    btn.dataset.option = String(i);
    btn.onclick = () => vote(i);
    const bar = document.createElement("div");
    bar.className = "bar";
    bar.style.width = `${(100 * counts[i]) / total}%`;
    const n = document.createElement("span");
    n.textContent = String(counts[i]);
    n.className = "count";
    const note = document.createElement("span");
    const pending = [...state.pendingVotes.values()].some((pv) => pv.poll === p.id && pv.option === i);
    note.className = pending ? "pending" : "muted";
    note.textContent = pending ? "pending…" : mine === i ? "your vote" : "";
    li.append(btn, bar, n, note);
    return li;
  }));

  $("timeline").replaceChildren(...state.timeline.slice().reverse().map((t) => {
    const li = document.createElement("li");
    const time = new Date(t.at).toLocaleTimeString();
    li.append(`${time} · epoch ${t.epoch}: ${t.from ?? "nobody"} → ${t.to ?? "nobody"} `);
    const r = document.createElement("span");
    r.className = "reason";
    r.textContent = `(${t.reason.replace("_", " ")}${t.via === "peer" ? ", via a peer" : ""})`;
    li.append(r);
    return li;
  }));
}

function showError(el, e) {
  el.hidden = false;
  el.textContent = `${e.code ?? "error"}: ${e.message}`;
  clearTimeout(el.hideTimer);
  el.hideTimer = setTimeout(() => { el.hidden = true; }, 4000);
}

// ----- commands --------------------------------------------------------------------------------

async function vote(option) {
  const p = state.poll;
  if (!p) return;
  const key = `${p.id}:${option}:${Date.now()}`;
  state.pendingVotes.set(key, { poll: p.id, option });
  render();
  try {
    await room.command("vote", { poll: p.id, option });
  } catch (e) {
    showError($("host-error"), e);
  } finally {
    state.pendingVotes.delete(key);
    render();
  }
}

async function hostCommand(action, payload) {
  try {
    await room.command(action, payload);
  } catch (e) {
    showError($("host-error"), e);
  }
}

$("open-form").onsubmit = (ev) => {
  ev.preventDefault();
  const options = $("options").value.split(",").map((s) => s.trim()).filter(Boolean).slice(0, 8);
  if (options.length < 2) return showError($("host-error"), { code: "BadArgument", message: "give at least two options" });
  hostCommand("poll.open", { question: $("question").value.trim(), options });
};
$("close-poll").onclick = () => hostCommand("poll.close", { poll: state.poll?.id ?? null });
$("resign").onclick = () => hostCommand("host.resign", null);
$("transfer").onclick = () => $("transfer-to").value && hostCommand("host.transfer", { to: $("transfer-to").value });

// ----- WebRTC mesh -----------------------------------------------------------------------------

/** Lets go of the link to `peerId`: the SDK's channel first (Safari fires no `close` on a data
 * channel whose connection the app closes), then the connection. */
function drop(peerId) {
  room.detachPeer(peerId);
  peers.get(peerId)?.close();
  peers.delete(peerId);
}

/** Drops `pc` if it is still the link to `peerId` (a newer one may have replaced it); says
 * whether it did. */
function dropIfCurrent(peerId, pc) {
  if (peers.get(peerId) !== pc) return false;
  drop(peerId);
  return true;
}

/** A link to member `peerId` (its session `session`). The member whose id sorts first offers; a
 * link that fails, or whose signalling could not be sent (signals are not queued while the
 * socket is down), is dropped and offered again by the next `mesh()`. Every signal of a link
 * carries its id (`link`, the offer's): an answer or a candidate of a link let go of that
 * arrives late goes nowhere, not to the link made since. */
function peerConnection(peerId, initiator, session, link = Math.random().toString(36).slice(2)) {
  const pc = new RTCPeerConnection({ iceServers: window.HOSTLEASE_ICE_SERVERS ?? [] });
  pc.session = session;
  pc.link = link;
  peers.set(peerId, pc);
  pc.onicecandidate = (e) => e.candidate && room.signal(peerId, { link, candidate: e.candidate.toJSON() });
  pc.onconnectionstatechange = () => {
    if (pc.connectionState === "failed" && dropIfCurrent(peerId, pc)) {
      // Offered again after a pause: a pair that cannot connect at all (no TURN server on a
      // network that needs one) does not renegotiate back to back.
      setTimeout(() => room && mesh(), 10_000);
    }
  };
  if (initiator) {
    room.attachPeer(peerId, pc.createDataChannel("hostlease"));
    pc.createOffer()
      .then((o) => pc.setLocalDescription(o))
      .then(() => room.signal(peerId, { link, sdp: pc.localDescription.toJSON() }) || Promise.reject())
      .catch(() => dropIfCurrent(peerId, pc));
  } else {
    pc.ondatachannel = (e) => room.attachPeer(peerId, e.channel);
  }
  return pc;
}

async function onSignal({ from, fromSession, data }) {
  let pc = peers.get(from);
  if (typeof data?.link !== "string") return;
  if (data.sdp?.type === "offer") {
    // An offer starts the link again (the other side reloaded, or dropped a failed link).
    if (pc) drop(from);
    pc = peerConnection(from, false, fromSession, data.link);
    await pc.setRemoteDescription(data.sdp);
    await pc.setLocalDescription(await pc.createAnswer());
    if (!room.signal(from, { link: data.link, sdp: pc.localDescription.toJSON() })) dropIfCurrent(from, pc);
  } else if (pc?.link !== data.link) {
    // An answer or a candidate of a link let go of.
  } else if (data.sdp) {
    await pc.setRemoteDescription(data.sdp);
  } else if (data.candidate) {
    await pc.addIceCandidate(data.candidate).catch(() => {});
  }
}

/** One link per other member, made by the side whose id sorts first, and made again when the
 * member is back as a new session (a page reloaded: the old link goes to a page that is gone;
 * a reconnect is a new session too, and costs a renegotiation).
 * A member the server no longer lists keeps its link: cut off from the server, it is reachable
 * over WebRTC still (the provisional view counts on it); a link to a page that is gone fails by
 * itself. */
function mesh() {
  const v = room.view;
  if (v.phase !== "live") return; // signals need the socket; `connection` → live meshes again
  const sessions = new Map(v.members.filter((m) => m.id !== v.me && v.me < m.id).map((m) => [m.id, m.session]));
  for (const [id, session] of sessions) {
    if (peers.has(id) && peers.get(id).session !== session) drop(id);
    if (!peers.has(id)) peerConnection(id, true, session);
  }
}

// ----- join ------------------------------------------------------------------------------------

/** A participant id from the display name, unique per tab (so two tabs are two participants). */
function participantId(name) {
  const key = `hostlease-demo-id:${name}`;
  let id = sessionStorage.getItem(key);
  if (!id) {
    id = `${name.toLowerCase().replace(/[^a-z0-9]+/g, "-").replace(/^-|-$/g, "").slice(0, 24) || "guest"}-${Math.random().toString(36).slice(2, 6)}`;
    sessionStorage.setItem(key, id);
  }
  return id;
}

async function devToken(roomName, name) {
  const res = await fetch("/dev/token", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ room: roomName, participant: participantId(name), name, may_host: true }),
  });
  if (!res.ok) throw Object.assign(new Error(`the dev token endpoint answered ${res.status}`), { code: "TokenUnavailable" });
  const body = await res.json();
  return { token: body.token, expiresAt: Date.now() + 3_600_000 };
}

let joining = false;
$("join-form").onsubmit = async (ev) => {
  ev.preventDefault();
  if (joining || room) return; // a second submit while the first joins would open a second room
  joining = true;
  const roomName = $("room").value.trim();
  const name = $("name").value.trim();
  try {
    await init();
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    room = await connect({ url: `${scheme}://${location.host}`, room: roomName, getToken: () => devToken(roomName, name) });
  } catch (e) {
    return showError($("join-error"), e);
  } finally {
    joining = false;
  }
  $("join").hidden = true;
  $("app").hidden = false;
  history.replaceState(null, "", `?room=${encodeURIComponent(roomName)}&name=${encodeURIComponent(name)}`);
  room.on("event", applyEvent);
  room.on("host", (h) => {
    const prev = state.timeline.at(-1);
    // A new room's hostless epoch 0 is no assignment: "nobody → nobody (elected)" misled.
    if (!prev && h.host === null && h.epoch === 0) return render();
    keep(state.timeline, { at: h.issuedAt || Date.now(), epoch: h.epoch, from: prev?.to ?? null, to: h.host, reason: h.reason, via: h.via });
    render();
  });
  for (const t of ["members", "connection", "lease", "provisional", "command"]) room.on(t, render);
  room.on("discontinuity", onDiscontinuity);
  room.on("members", mesh);
  room.on("connection", mesh);
  room.on("signal", (s) => onSignal(s).catch(() => {}));
  room.on("relay", (r) => keep(state.relays, r));
  room.on("error", (e) => console.warn("hostlease:", e.code, e.message));
  // The lease's deadline passes with no event until the next step: the status and host controls
  // are read again every second (not the lists, which an open menu or the focus would lose).
  setInterval(renderStatus, 1000);
  render();
};

const params = new URLSearchParams(location.search);
if (params.get("room")) $("room").value = params.get("room");
if (params.get("name")) $("name").value = params.get("name");
