// The page the browser tests drive: one room per page, every event recorded, and WebRTC data
// channels to the other members (signalling relayed by the server) attached to the SDK.
import * as hl from "/index.js";

const log = [];
let room = null;
let lastHostCap = null;
let socket = null;
const peers = new Map(); // peer id → RTCPeerConnection

function record(type, payload) {
  const entry = { type, at: Date.now() };
  if (payload instanceof Error) entry.error = { name: payload.name, code: payload.code, isError: true, message: payload.message };
  else entry.payload = payload;
  log.push(entry);
}

function peerConnection(peerId, initiator) {
  const pc = new RTCPeerConnection({ iceServers: [] });
  peers.set(peerId, pc);
  pc.onicecandidate = (e) => e.candidate && room.signal(peerId, { candidate: e.candidate.toJSON() });
  // Recorded when the SDK has taken the channel as open (its own listener, added after this
  // one, runs in the same dispatch); a channel handed over open fires no `open`.
  const attach = (channel) => {
    channel.addEventListener("open", () => record("peer_open", { peer: peerId }));
    room.attachPeer(peerId, channel);
    if (channel.readyState === "open") record("peer_open", { peer: peerId });
  };
  if (initiator) {
    attach(pc.createDataChannel("hostlease"));
    pc.createOffer().then((o) => pc.setLocalDescription(o)).then(() => room.signal(peerId, { sdp: pc.localDescription.toJSON() }));
  } else {
    pc.ondatachannel = (e) => attach(e.channel);
  }
  return pc;
}

async function onSignal({ from, data }) {
  let pc = peers.get(from);
  if (data.sdp) {
    if (!pc) pc = peerConnection(from, false);
    await pc.setRemoteDescription(data.sdp);
    if (data.sdp.type === "offer") {
      await pc.setLocalDescription(await pc.createAnswer());
      room.signal(from, { sdp: pc.localDescription.toJSON() });
    }
  } else if (data.candidate && pc) {
    await pc.addIceCandidate(data.candidate).catch(() => {});
  }
}

function meshWith(members) {
  const me = room.view.me;
  for (const m of members) {
    // The lower id offers, so each pair connects once.
    if (m.id !== me && me < m.id && !peers.has(m.id)) peerConnection(m.id, true);
  }
}

/** A promise's outcome as plain data the test can read: `{ ok }` or `{ err }`. */
const settle = (promise) => promise.then(
  (r) => ({ ok: r }),
  (e) => ({ err: { name: e.name, code: e.code, isError: e instanceof Error, isHostlease: e instanceof hl.HostleaseError } }));

window.T = {
  log,
  async start({ url, room: name, token, tokens, webrtc = true, tokenTtlMs }) {
    await hl.init();
    let i = 0;
    const getToken = tokens ? () => {
      const t = tokens[Math.min(i++, tokens.length - 1)];
      record("token_fetch", { n: i });
      return tokenTtlMs ? { token: t, expiresAt: Date.now() + tokenTtlMs } : t;
    } : undefined;
    room = await hl.connect({ url, room: name, token, getToken });
    // The newest host capability on the wire, for `staleHostCommand` (before any frame arrives:
    // `connect` resolves before the socket's first message event).
    const onMessage = room._onMessage.bind(room);
    room._onMessage = (m) => {
      socket = m.target; // the socket the SDK reads, for `staleHostCommand`
      if (typeof m.data === "string" && m.data.includes('"t":"capability"')) {
        const f = JSON.parse(m.data);
        if (f.role === "host") lastHostCap = f;
      }
      // The server's answer to a `staleHostCommand`, which the SDK does not know.
      if (typeof m.data === "string" && m.data.includes('"t":"command_result"') && m.data.includes('"id":"raw-')) {
        const { outcome, code } = JSON.parse(m.data);
        record("raw_result", { outcome, code });
      }
      onMessage(m);
    };
    for (const t of ["host", "provisional", "members", "event", "discontinuity", "connection", "lease", "command", "relay", "error"]) {
      room.on(t, (p) => record(t, p));
    }
    room.on("signal", (s) => onSignal(s).catch((e) => record("rtc_error", { message: String(e) })));
    if (webrtc) room.on("members", ({ members }) => meshWith(members));
    return true;
  },
  view: () => room.view,
  command: (action, payload) => settle(room.command(action, payload)),
  inbox: (since) => settle(room.inbox({ since })),
  fetchInbox: (options) => settle(hl.fetchInbox(options)),
  // A host command with the newest host token this page ever held and that token's epoch, sent
  // raw around the SDK's gate (as a deposed host's stale tab would); returns its id.
  staleHostCommand(action, payload) {
    if (!lastHostCap) return null;
    const id = `raw-${Date.now()}`;
    const frame = { v: 1, t: "command", id, action, payload: payload ?? null, epoch: lastHostCap.epoch, capability: lastHostCap.token };
    // Sent on the SDK's own socket, around its gate (the SDK has no such hook).
    if (socket?.readyState !== WebSocket.OPEN) return null;
    socket.send(JSON.stringify(frame));
    return id;
  },
  // `room.stamp(body)` as plain data: `{ ok: stamped }` or `{ err: { code, isHostlease } }`.
  stamp(body) {
    try {
      return { ok: room.stamp(body) };
    } catch (e) {
      return { err: { code: e.code, isHostlease: e instanceof hl.CommandError } };
    }
  },
  // `stamp(body)` once this page holds host authority (at most 15 s), checked and stamped in one
  // task: a loaded machine can let the tests' 1.5 s lease lapse for a moment between two calls.
  async stampAsHost(body) {
    for (let i = 0; i < 300 && !room.view.amHost; i++) await new Promise((r) => setTimeout(r, 50));
    return this.stamp(body);
  },
  acceptStamped: (peer, message) => room.acceptStamped(peer, message),
  relay: (peer, assignment) => room._onRelay(peer, assignment),
  // Takes `frames` as if the server sent them; returns the ones that reached the Rust codec.
  frames(frames) {
    const decoded = [];
    const driver = room._driver, handleFrame = driver.handleFrame;
    driver.handleFrame = (text) => (frames.includes(text) && decoded.push(text), handleFrame.call(driver, text));
    try {
      for (const f of frames) room._onMessage({ data: f });
    } finally {
      driver.handleFrame = handleFrame;
    }
    return decoded;
  },
  addThrowingListener: (type) => room.on(type, () => { throw new Error("listener bug"); }),
  // The peers whose data channel the SDK has taken as open (reachable, for the provisional view).
  openPeers: () => [...new Set(log.filter((e) => e.type === "peer_open").map((e) => e.payload.peer))],
  close: () => room.close(),
  // A room in a dedicated module worker instead (`options`: connect's), and its view and log.
  async startWorker(options) {
    this.worker = new Worker("/test/browser/worker.js", { type: "module" });
    return this.askWorker({ start: options });
  },
  askWorker(message) {
    return new Promise((resolve) => {
      this.worker.addEventListener("message", (e) => resolve(e.data), { once: true });
      this.worker.postMessage(message);
    });
  },
  workerView() {
    return this.askWorker({ view: true });
  },
};
window.T.ready = true;
