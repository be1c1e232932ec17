// hostlease: the thin JS wrapper around the WebAssembly driver.
//
// The driver (Rust, src/web) owns the WebSocket, timers, the clock and the reconnect supervisor;
// this file owns what is JavaScript's by nature: the init guard, typed listeners, promises,
// Error classes, join-token refresh, and the WebRTC relay with WebCrypto verification.

import initWasm, { Driver, protocolVersion } from "./wasm/hostlease.js";

// ----- errors ----------------------------------------------------------------------------------

/** Stable error codes; they mirror the Rust `code()` strings. Each is its own name, except
 * `Unauthorized`, which is the server's wire code. */
export const ErrorCode = Object.freeze({
  ...Object.fromEntries((
  "NotInitialized BadArgument NotHost NotAuthoritative LeaseExpired NoCapability " +
  "StaleEpoch IdempotencyConflict UnknownAction BadPayload QueueFull Timeout " +
  "Interrupted Closed Rejected TokenUnavailable ProtocolViolation ForgedRelay " +
  "RelayUnsupported ListenerError Unavailable BadResponse"
  ).split(" ").map((code) => [code, code])),
  Unauthorized: "unauthorized",
});

/** Every error the SDK throws or reports is a `HostleaseError` with a stable `.code`. */
export class HostleaseError extends Error {
  constructor(code, message, options) {
    super(message, options);
    this.code = code;
  }
}
/** Misuse of the API: used before `init()`, bad arguments. */
export class UsageError extends HostleaseError {}
/** A command was refused locally or by the server. */
export class CommandError extends HostleaseError {}
/** The connection or its credentials failed. */
export class ConnectionError extends HostleaseError {}
/** A peer or the server broke a protocol rule: a forged relay, `ProtocolViolation`, a malformed
 * HTTP answer (`BadResponse`). (A frame the decoder refuses, like the server's own error frames,
 * is a `ConnectionError` with the decoder's code.) */
export class ProtocolError extends HostleaseError {}
// `.name` spelled out: bundlers rename classes, and `constructor.name` goes with them.
// (An object's shorthand keys are the source names; a minifier keeps them.)
for (const [name, c] of Object.entries({ HostleaseError, UsageError, CommandError, ConnectionError, ProtocolError })) {
  c.prototype.name = name;
}

const COMMAND_MESSAGES = {
  NotHost: "this session is not the host",
  NotAuthoritative: "the server is unreachable or resyncing",
  LeaseExpired: "the host lease expired locally",
  NoCapability: "no capability for this action",
  StaleEpoch: "the host epoch changed: not applied",
  IdempotencyConflict: "the key was used for another request",
  UnknownAction: "the action is not in the room's action table",
  BadPayload: "the payload is not JSON or too large",
  QueueFull: "too many commands pending",
  Timeout: "no result after every retry",
  Interrupted: "the outcome is unknown",
  Closed: "the room was left",
  Rejected: "the server refused the command",
};

function commandError(code) {
  return new CommandError(code, COMMAND_MESSAGES[code] ?? "the command failed");
}

// ----- init ------------------------------------------------------------------------------------

let ready = null;
let initialized = false;

/**
 * Loads the WebAssembly module. Call (and await) once before `connect`. `input` is passed to the
 * wasm-bindgen loader (a URL, a Response, bytes or a compiled module); by default the `.wasm`
 * next to this file is fetched.
 */
export function init(input) {
  if (!ready) {
    ready = initWasm(input === undefined ? undefined : { module_or_path: input }).then(
      () => {
        initialized = true;
      },
      (e) => {
        ready = null;
        throw new UsageError(ErrorCode.NotInitialized, "the hostlease .wasm failed to load", { cause: e });
      },
    );
  }
  return ready;
}

function requireInit() {
  if (!initialized) {
    throw new UsageError(ErrorCode.NotInitialized, "call `await init()` before using hostlease");
  }
}

/** The wire-protocol major version (after `init`). */
export function version() {
  requireInit();
  return protocolVersion();
}

// ----- helpers ---------------------------------------------------------------------------------

// (`atob` takes base64 without its padding: the forgiving-base64 decode of the HTML standard.)
const b64urlDecode = (s) => Uint8Array.from(atob(s.replace(/-/g, "+").replace(/_/g, "/")), (c) => c.charCodeAt(0));

// The room's socket under the server's base: always `room`'s (a full `/ws` URL naming another
// room is only a base); an http(s):// base is dialled as ws(s):// (browsers before 2024 refuse
// http in WebSocket).
const roomUrl = (url, room) => `${httpBase(url).replace(/^http/, "ws")}/v1/rooms/${encodeURIComponent(room)}/ws`;

/** The HTTP base of a ws(s):// or http(s):// URL (its origin and any path prefix, without a
 * room's `/v1/rooms/{room}/ws`); anything else is a `BadArgument`. */
function httpBase(url) {
  let u;
  try {
    u = new URL(url);
  } catch {}
  if (!/^(ws|http)s?:$/.test(u?.protocol)) throw new UsageError(ErrorCode.BadArgument, "`url` must be an absolute ws(s):// or http(s):// URL");
  u.protocol = u.protocol.replace("ws", "http"); // ws: http:, wss: https:
  return u.origin + u.pathname.replace(/(\/v1\/rooms\/[^/]*\/ws)?\/*$/, "");
}

/** `value` as JSON text (`undefined` is `null`); `fail()` is thrown for what JSON cannot hold. */
function toJson(value, fail) {
  let text;
  try {
    text = JSON.stringify(value ?? null);
  } catch {}
  if (text === undefined) throw fail();
  return text;
}

/** 10 s: how long a `getToken()` call (then it counts as failed, and is retried) or an HTTP
 * attempt may take, and the least time between two token fetches. */
const WAIT_MS = 10_000;

/**
 * GET with retries: exponential backoff with full jitter (250 ms doubling, capped at 8 s), never
 * sooner than a 429/503 `Retry-After` (honoured up to a minute). Each attempt is given 10 s
 * (where the browser has `AbortSignal.timeout`: Safari 16, Chrome 103, Firefox 100 and later).
 * Gives up after `attempts`.
 */
async function fetchWithRetry(url, init = {}, attempts = 5) {
  for (let attempt = 1; ; attempt++) {
    let wait = Math.random() * Math.min(8_000, 125 * 2 ** attempt);
    try {
      // (Without AbortSignal.timeout, before Safari 16 and Chrome 103: no limit.)
      const res = await fetch(url, { ...init, signal: AbortSignal.timeout?.(WAIT_MS) });
      if (res.status !== 429 && res.status !== 503) return res;
      if (attempt >= attempts) throw Error(`HTTP ${res.status}`);
      const after = Number(res.headers.get("retry-after"));
      if (after > 0) wait = Math.max(wait, Math.min(after, 60) * 1000);
    } catch (e) {
      if (attempt >= attempts) throw e;
    }
    await new Promise((r) => setTimeout(r, wait));
  }
}

/** A protocol counter (seq, epoch, cursor, time): a non-negative safe integer. */
const count = (n) => Number.isSafeInteger(n) && n >= 0;

/** Pages read per `fetchInbox` call at most (each up to 256 entries and 1 MiB); `next` says where to go on. */
const INBOX_MAX_PAGES = 16;

/** Checks one inbox page's shape; the entries' items are the stream items of the protocol. */
function inboxPage(body) {
  const ok = body && Array.isArray(body.entries)
    && (body.next == null || count(body.next))
    && body.entries.every((e) => e && count(e.cursor) && e.item && (e.item.kind === "assignment" || e.item.kind === "event"));
  if (!ok) throw new ProtocolError(ErrorCode.BadResponse, "the inbox page is malformed");
  return body;
}

// One page of the inbox, or why not, typed.
async function inboxPageAt(pageUrl, token) {
  try {
    const res = await fetchWithRetry(pageUrl, { headers: { authorization: `Bearer ${token}` } });
    if (res.status === 401 || res.status === 403) {
      throw new ConnectionError(ErrorCode.Unauthorized, "the join token was refused");
    }
    if (!res.ok) throw new ConnectionError(ErrorCode.Unavailable, `the inbox answered HTTP ${res.status}`);
    return inboxPage(await res.json());
  } catch (e) {
    // A body that is not JSON is the server's fault; a request that failed, or a page cut off
    // (the 10 s of its attempt ran out on a slow link, or the network went), the network's.
    throw e instanceof HostleaseError ? e : e instanceof SyntaxError
      ? new ProtocolError(ErrorCode.BadResponse, "the inbox page is malformed")
      : new ConnectionError(ErrorCode.Unavailable, "the inbox could not be read", { cause: e });
  }
}

/**
 * Reads a participant's durable inbox over HTTP: what was committed in `room` while it was not
 * connected, in cursor order (copies for a connection that died without a close can repeat items
 * and come after newer ones: order and de-duplicate by `item.seq`). For apps that come back after a while (or a service worker) and want
 * to show what they missed without joining. Options: `url` (the server's base URL, ws(s) or
 * http(s)), `room`, `token` (the participant's join token; it travels in the `Authorization`
 * header, never in the URL), `since` (a cursor from an earlier call; default 0).
 * Resolves with `{ entries: [{ cursor, item }], next }`; `next` is a cursor to pass as `since`
 * when more is left (at most 16 pages of 256 are read per call), else `null`. A page that fails
 * after the first ends the call with what was read and `next` to go on from.
 */
export async function fetchInbox(options) {
  const { url, room, token, since = 0 } = options ?? {};
  if (typeof url !== "string" || !id(room) || typeof token !== "string") {
    throw new UsageError(ErrorCode.BadArgument, `fetchInbox() needs { url, room, token } (room: ${ID})`);
  }
  if (!count(since)) {
    throw new UsageError(ErrorCode.BadArgument, "`since` must be a cursor (a non-negative integer)");
  }
  const base = `${httpBase(url)}/v1/rooms/${encodeURIComponent(room)}/inbox`;
  const entries = [];
  let cursor = since;
  for (let page = 0; page < INBOX_MAX_PAGES; page++) {
    let body;
    try {
      body = await inboxPageAt(`${base}?since=${cursor}`, token);
    } catch (e) {
      // What the pages before this one read is not thrown away: the caller goes on from `next`
      // (and meets the failure there if it lasts: a slow link that cannot bring a page in its
      // 10 s, a token that expired part-way).
      if (!page) throw e;
      break;
    }
    entries.push(...body.entries);
    if (body.next == null) return { entries, next: null };
    if (body.next <= cursor) throw new ProtocolError(ErrorCode.BadResponse, "the inbox cursor went backwards");
    cursor = body.next;
  }
  return { entries, next: cursor };
}

const RELAY_TAG = "hostlease.relay";
const RELAY_MAX = 4096;
const TOKEN_REFRESH_EARLY_MS = 30_000;

// A room event frame as the server writes it, and the Rust codec's checks of its fields' types
// and ranges (src/protocol: counters are u64, here safe integers; identifiers 1-128 of
// A-Z a-z 0-9 - _ . : @). JSON.parse itself is looser than the codec's reader on what only a
// broken server sends (a repeated key, 1e0 for 1, lone surrogates, deep nesting): README.
const EVENT_HEAD = '{"v":1,"t":"event",';
// The codec's limit on a server frame, in UTF-8 bytes (MAX_SERVER_FRAME).
const FRAME_MAX = 4 << 20;
// At most 3 UTF-8 bytes per UTF-16 unit: a frame this long is surely within the limit.
const EVENT_MAX = FRAME_MAX / 3;
const ID = /^(?!\.\.?$)[\w.:@-]{1,128}$/;
const id = (s) => typeof s === "string" && ID.test(s);
/** An assignment's signed fields, in the order they are signed. */
const SIGNED = ["room", "host", "session", "epoch", "seq", "lease_ms", "reason", "issued_at"];
/** The bytes the server signs for an assignment (README, "Signed assignments"): its fields, each
 * checked as the codec would so that no two assignments share them, or `null`. */
const signingBytes = (a) =>
  id(a.room) && (a.host == null && a.session == null || id(a.host) && id(a.session))
    && typeof a.reason === "string" && /^[a-z_]{1,32}$/.test(a.reason)
    && [a.epoch, a.seq, a.lease_ms, a.issued_at].every(count)
    ? new TextEncoder().encode(["hostlease/v1/assignment", ...SIGNED.map((k) => a[k] ?? "")].join("\n"))
    : null;
const isEvent = (m) =>
  m?.v === 1 && m.t === "event" && count(m.seq) && count(m.epoch) && count(m.at) && id(m.actor) && id(m.action);

// ----- Room ------------------------------------------------------------------------------------

/**
 * Connects to a room. Options: `url` (the server's WebSocket base URL, or a full `/ws` URL),
 * `room`, and either `token` (a join token) or `getToken()` returning a token, `{ token,
 * expiresAt }` or a promise of either; `keysUrl` (defaults to the server's `/v1/keys`).
 * Resolves once the first connection attempt has started; watch `connection` events for `live`.
 * `signal` (an `AbortSignal`) closes the room when it aborts; before `connect()` has resolved,
 * it then rejects with a `ConnectionError` (`Closed`, the signal's reason as its `cause`) once a
 * `getToken()` under way has answered.
 */
export async function connect(options) {
  requireInit();
  // A room name the server refuses would be dialled for ever: it is checked here.
  if (typeof options?.url !== "string" || !id(options.room) || (options.getToken == null
    ? typeof options.token !== "string" : typeof options.getToken !== "function")) {
    throw new UsageError(ErrorCode.BadArgument,
      `connect() needs { url, room } (room: ${ID}) and a token or getToken`);
  }
  // (The URL is checked by the Room, as it is made: a BadArgument too.)
  const { signal } = options;
  let room, failed, refused;
  if (!signal?.aborted) {
    room = new Room(options); // (closed by the signal, if it aborts)
    // The first token is the app's answer to "may I join?": no token, no room.
    failed = (await room._refreshToken((e) => (refused = e))) === null ? refused : await room._dial();
  }
  if (signal?.aborted) throw new ConnectionError(ErrorCode.Closed, "connect() aborted", { cause: signal.reason });
  if (failed) {
    room.close();
    throw failed;
  }
  return room;
}

export class Room {
  #token = null; // { token, expiresAt? }: private, so that logging the room never shows it
  // How tokens are got, private too. The rest stays reachable through a Proxy of the room (Vue's
  // `reactive()`, MobX): a `#` member read through one throws.
  #getToken;
  _queue = []; // steps' events not yet delivered (see _onEvents)
  _held = 0; // deliveries and command() calls under way: new events wait in _queue meanwhile

  constructor(options) {
    this.room = options.room;
    this._url = roomUrl(options.url, options.room);
    this._keysUrl = options.keysUrl ?? `${httpBase(options.url)}/v1/keys`;
    this.#getToken = options.getToken ?? (() => options.token);
    this._static = !options.getToken; // a token that cannot be renewed
    this._listeners = new Map(); // type → listeners (an array, replaced on change)
    this._pending = new Map(); // idempotency key → { resolve, reject }
    this._peers = new Map(); // peer id → { channel, listening }
    // Set when first needed (undefined until then): _refreshTimer, _keys (a Promise<Map<kid,
    // CryptoKey>>), _keysAt (when they were asked for), _relayWarned, _closed.
    const [hi, lo] = crypto.getRandomValues(new Uint32Array(2));
    // The driver keeps these two for its life; after `close()` they no longer hold the room, so
    // a closed room the app lets go of is collected (the driver with it).
    const to = { room: this };
    this._release = () => (to.room = null);
    // So does the signal, which may outlive it (an app-wide one): it holds `to` alone.
    options.signal?.addEventListener?.("abort", () => to.room?.close());
    // It reads the token, a `#` member: through a Proxy of the room (Vue's `ref()`) it would
    // throw, so it runs on the room itself.
    this.inbox = this.inbox.bind(this);
    // `self`: a page's window, or a worker's global scope (timers, clock and network events
    // alike); undefined in Node, where the driver then sets no timer.
    this._driver = new Driver(this._url, (json) => to.room?._onEvents(json), hi, lo, (m) => to.room?._onMessage(m), globalThis.self);
  }

  /** The current host view: host, epoch, amHost, lease, phase, provisional, members, pending.
   * The same object until something in it changes (React's `useSyncExternalStore` needs that). */
  get view() {
    // ("" when nothing in it can have changed since the last reading: not written again.)
    const json = this._driver.view();
    return json && json !== this._json ? (this._view = JSON.parse((this._json = json))) : this._view;
  }

  /** Subscribes to `host`, `provisional`, `members`, `event`, `discontinuity`, `connection`,
   * `lease`, `command`, `signal`, `relay` or `error`. Returns the unsubscribe function. */
  on(type, listener) {
    if (typeof listener !== "function") {
      throw new UsageError(ErrorCode.BadArgument, "on(type, listener) needs a function");
    }
    // Each type's listeners are an array replaced on every change, so that a delivery in progress
    // goes on over the array it started with, without copying it for every event; one
    // unsubscribed meanwhile is skipped (as the DOM's removeEventListener: a component torn down
    // by an earlier listener is not called). Each `on` is an entry of its own: the same function
    // subscribed twice (two components sharing a handler) is called twice, and each unsubscribe
    // ends its own subscription only.
    const entry = (payload) => entry.off || listener(payload);
    this._listeners.set(type, [...(this._listeners.get(type) ?? []), entry]);
    return () => {
      entry.off = 1;
      this._listeners.set(type, this._listeners.get(type).filter((l) => l !== entry));
    };
  }

  /** Issues a command. Resolves with `{ id, seq }` once the server applied it; rejects with a
   * `CommandError`. Participant commands made offline stay pending and are sent after the resync. */
  command(action, payload = null) {
    // What the driver emits while it takes the command (a listener may even close the room) is
    // delivered once the promise is there to settle.
    this._held++;
    let result;
    try {
      const id = this._driver.command(String(action), toJson(payload, () => ErrorCode.BadPayload));
      result = new Promise((resolve, reject) => this._pending.set(id, { resolve, reject }));
    } catch (code) {
      // The driver refuses with its code; anything else was thrown on the way there (an action
      // whose toString throws): not the server's refusal (`Rejected`).
      result = Promise.reject(commandError(typeof code === "string" ? code : ErrorCode.BadArgument));
    }
    this._held--;
    this._onEvents();
    return result;
  }

  /** Wraps a message of the host with the epoch it holds authority in. Throws a `CommandError`
   * when this client may not act as host now: `NotHost`, or `NotAuthoritative` while its lease is
   * not held or the room is not live (a deposed or cut-off host stamps nothing its peers would
   * take). */
  stamp(body) {
    const v = this.view;
    // Cut off (not live), a host is no longer named (its session went with the socket): it is
    // not authoritative, as command() says, not "not the host".
    if (!v.amHost) throw commandError(v.namedHost || v.phase !== "live" ? ErrorCode.NotAuthoritative : ErrorCode.NotHost);
    return { hostleaseEpoch: v.epoch, body };
  }

  /** The body of a message `peerId` stamped, or `null` unless it is from the host of the epoch
   * this client's view holds: a deposed host's (an older epoch) and any peer's claiming an epoch
   * the view has not verified are dropped. Stamps are not signed: a newer epoch taken on a
   * stamp's word let any peer pass as host with a made-up one. A new host's election reaches a
   * live client with the server's broadcast, before the new host has confirmed its lease and can
   * stamp; an offline one, by the signed assignment the new host relays over the channel. */
  acceptStamped(peerId, message) {
    const v = this.view;
    // (A hostless epoch has no host to take one from, whatever `peerId` is.)
    return v.host && message?.hostleaseEpoch === v.epoch && peerId === v.host ? message.body ?? null : null;
  }

  /** Relays presence and server-signed assignments over `channel` (an RTCDataChannel). */
  attachPeer(peerId, channel) {
    if (!id(peerId) || typeof channel?.addEventListener !== "function") {
      throw new UsageError(ErrorCode.BadArgument, "attachPeer() needs a peer id and an RTCDataChannel");
    }
    // (One open already replaces the one before without a moment unreachable between.)
    if (channel.readyState === "open") this._peers.get(peerId)?.listening.abort();
    else this.detachPeer(peerId);
    // A channel already closing fires no `close` that would let go of it.
    if (this._closed || /^clos/.test(channel.readyState)) return;
    const onOpen = () => {
      this._driver.peer(peerId, true);
      this._sendRelay(channel, this.view.signed);
      // The keys are read now, while the server is likely reachable: relays matter most once it
      // is not, and a first read then waited out its retries and left them unverifiable.
      this._loadKeys();
    };
    const onClose = () => this.detachPeer(peerId); // let go of a closed channel
    // The channel's relays are checked one at a time; one that comes meanwhile waits, replaced by
    // the next to come (a peer relays its newest assignment): a peer flooding relays while the
    // keys are read holds two, not all it sent. (What is not a relay replaces nothing.)
    let next, checking;
    const onMessage = async (e) => {
      // A string of at most 4 KiB (a signed assignment is under 1 KiB): a peer's larger
      // message is not parsed (a data channel may carry up to 1 GiB).
      if (!(e.data.length <= RELAY_MAX) || !e.data.includes(RELAY_TAG)) return;
      let msg;
      try {
        msg = JSON.parse(e.data);
      } catch {}
      if (!(msg?.t === RELAY_TAG && (next = msg.assignment || next)) || checking) return;
      try {
        for (checking = 1; (msg = next); await this._onRelay(peerId, msg)) next = null;
      } finally {
        checking = 0;
      }
    };
    const listening = new AbortController(); // detachPeer removes them all at once
    const opts = { signal: listening.signal };
    channel.addEventListener("close", onClose, opts);
    channel.addEventListener("message", onMessage, opts);
    this._peers.set(peerId, { channel, listening });
    // Open already (one from `ondatachannel`, whose `open` still fires after it): once only.
    if (channel.readyState === "open") onOpen();
    else channel.addEventListener("open", onOpen, opts);
  }

  detachPeer(peerId) {
    this._peers.get(peerId)?.listening.abort();
    if (this._peers.delete(peerId)) this._driver.peer(peerId, false);
  }

  /** Reads this participant's durable inbox (see `fetchInbox`) with the room's join token. */
  async inbox(options) {
    for (let attempt = 0; ; attempt++) {
      // Why there is no token is this promise's error, not also an `error` event.
      let why;
      const token = await this._token((e) => (why = e));
      if (!token) throw why;
      try {
        // (`since: null`, which fetchInbox refuses, is not 0: a re-read of everything.)
        return await fetchInbox({ url: this._url, room: this.room, token, since: options?.since });
      } catch (e) {
        if (e.code !== ErrorCode.Unauthorized || attempt > 0) throw e;
        this.#token = null; // refused: ask the app for a fresh token, once
      }
    }
  }

  /** Sends WebRTC signalling `data` to member `to` through the server. */
  signal(to, data) {
    // (Not `String(to)`: `undefined` would be sent to a participant named "undefined".)
    return this._driver.signal(id(to) ? to : "", toJson(data, () => new UsageError(ErrorCode.BadArgument, "signal data must be JSON")));
  }

  /** Leaves the room (a host is replaced at once) and stops reconnecting. */
  close() {
    if (this._closed) return;
    this._closed = true;
    clearTimeout(this._refreshTimer);
    clearTimeout(this._keysTimer);
    // The driver first: peers let go of then change nothing (no `provisional` while closing).
    this._driver.close();
    // A core closed already in the step under way (kicked, the room closed: a listener of its
    // `error` closes the room) emitted nothing here: `closed` is announced now all the same, and
    // the rest of that step is not delivered.
    if (!this._ended) this._dispatch({ type: "connection", phase: "closed" });
    this._peers.forEach((_, id) => this.detachPeer(id)); // (deleting as it goes: a Map allows it)
    this._release();
  }

  // ----- internals -----------------------------------------------------------------------------

  /** The token to send, or a falsy value after reporting why there is none (to `fail`). */
  async _token(fail) {
    const t = this.#token;
    // Within its refresh margin a token is fetched again, unless it was fetched in the last 10 s
    // (a short-lived one, or this clock ahead of the backend's: not once per dial).
    if (t && (t.expiresAt === undefined || t.expiresAt - TOKEN_REFRESH_EARLY_MS > Date.now() || this._tokenAt > Date.now() - WAIT_MS)) return t.token;
    // The app's backend failing: the token held now, if it has not expired, still goes (one
    // another refresh got meanwhile; not one refused meanwhile: that clears it).
    return (await this._refreshToken(fail)) ?? (!(this.#token?.expiresAt <= Date.now()) && this.#token?.token);
  }

  /** A fresh token from the app, or `null` after reporting why not (to `fail`, by default the
   * `error` listeners). */
  async _refreshToken(fail = (e) => this._emit("error", e)) {
    let got, timer;
    // Asked again in 30 s unless this call gets a token (which sets the next refresh): a
    // background refresh that failed once was never tried again before the next reconnect.
    clearTimeout(this._refreshTimer);
    if (!this._closed) this._refreshTimer = setTimeout(() => this._refreshToken(), TOKEN_REFRESH_EARLY_MS);
    try {
      // An app backend that never answers must not leave the room waiting for ever.
      got = await Promise.race([this.#getToken(), new Promise((_, no) => (timer = setTimeout(no, WAIT_MS, Error("timed out"))))]);
    } catch (e) {
      fail(new ConnectionError(ErrorCode.TokenUnavailable, "getToken() failed", { cause: e }));
      return null;
    } finally {
      clearTimeout(timer);
    }
    // (An `expiresAt` of `null`, as a JSON backend writes "none", is none.)
    const t = typeof got === "string" ? { token: got } : { token: got?.token, expiresAt: got?.expiresAt ?? undefined };
    if (!(typeof t.token == "string" && t.token) || !(t.expiresAt === undefined || typeof t.expiresAt == "number" && t.expiresAt > 1e12)) {
      fail(new ConnectionError(ErrorCode.TokenUnavailable, "getToken() gave no token, or expiresAt not in ms"));
      return null;
    }
    this.#token = t;
    clearTimeout(this._refreshTimer);
    const left = t.expiresAt - (this._tokenAt = Date.now());
    if (Number.isFinite(left) && !this._closed) {
      // Refresh ahead of expiry so that a reconnect never waits on the app's backend: 30 s
      // before, or half way for a shorter token; at most 2e9 ms, 23 days (a timer
      // waits at most 2^31 - 1 ms).
      // Never sooner than 10 s: a token that looks spent on arrival (this clock ahead of the
      // backend's) is not asked for again every second.
      const wait = left > 2 * TOKEN_REFRESH_EARLY_MS ? left - TOKEN_REFRESH_EARLY_MS : left / 2;
      this._refreshTimer = setTimeout(() => this._refreshToken(), Math.min(2e9, Math.max(WAIT_MS, wait)));
    }
    return t.token;
  }

  async _dial() {
    const token = await this._token();
    if (this._closed) return;
    if (!token) {
      // Try again with the supervisor's backoff.
      this._driver.dropConnection();
      return;
    }
    try {
      this._driver.connect(token);
    } catch (e) {
      const err = new ConnectionError(ErrorCode.Unavailable, "the WebSocket could not be opened", { cause: e });
      this._emit("error", err);
      return err;
    }
  }

  // Every message of the room's socket. The common frame, a room event, is parsed here once
  // with JSON.parse and its fields checked; the core is told its seq alone, and when that is the
  // next one the listeners get this object. Any other frame, an event refused by the checks or
  // by the core (out of order, not live), and a frame too long to be sure of its size go to the
  // driver as text: the Rust codec decodes it with its limits and reports what is wrong.
  _onMessage({ data }) {
    if (typeof data !== "string") return; // binary frames are not part of the protocol
    // Past the 4 MiB limit in UTF-16 units already (a UTF-8 byte or more each): refused here, as
    // the codec would, without first copying it into the wasm's memory (which never shrinks).
    if (data.length > FRAME_MAX) {
      return this._dispatch({ type: "error", code: "frame_too_large", message: "a frame over the limit" });
    }
    if (data.length <= EVENT_MAX && data.startsWith(EVENT_HEAD)) {
      let m;
      try {
        m = JSON.parse(data);
      } catch {}
      if (isEvent(m) && this._driver.eventSeq(m.seq)) {
        const { seq, epoch, actor, action, payload = null, at } = m;
        this._emit("event", { seq, epoch, actor, action, payload, at });
        return;
      }
    }
    this._driver.handleFrame(data);
  }

  // A step's events, as the driver's JSON array (written by the driver: always well-formed), in
  // the order the steps ran: a step a listener runs (a command, a peer detached) waits for the
  // rest of the one being delivered; but a close() announces `closed` at once (nothing but
  // command outcomes follows it).
  _onEvents(json) {
    if (json) this._queue.push(json);
    if (this._held && !this._closed) return;
    this._held++;
    try {
      while (this._queue.length) for (const e of JSON.parse(this._queue.shift())) this._dispatch(e);
    } finally {
      // (Nothing should throw here; if it did, later steps must still be delivered.)
      this._held--;
    }
  }

  // A driver event is `{ type, ...payload }`: the payload of the listeners of `type` as it is,
  // but for the types below.
  _dispatch({ type, ...e }) {
    switch (type) {
      case "connection": {
        // Closed by the server (kicked, room closed): stop refreshing tokens and relaying too.
        const closed = e.phase === "closed";
        if (closed) this.close();
        this._emit(type, e);
        this._ended ||= closed;
        return;
      }
      case "host": {
        const a = e.assignment;
        // Relayed before the listeners see `a`, so that none can change what the peers get.
        for (const p of this._peers.values()) this._sendRelay(p.channel, a);
        e = {
          host: a.host ?? null, session: a.session ?? null, epoch: a.epoch, reason: a.reason,
          previousEpoch: e.previous_epoch ?? null, via: e.via, issuedAt: a.issued_at, assignment: a,
        };
        break;
      }
      case "members":
        // A copy: the view's own list is shared by every reader of `room.view`.
        e = { members: [...this.view.members] };
        break;
      case "event":
        e = e.event;
        break;
      case "command": {
        // `{ id, state, seq? , code?, reason? }`; the promise is settled after the listeners.
        const p = e.state !== "queued" && this._pending.get(e.id);
        this._pending.delete(p && e.id);
        this._emit(type, e);
        if (!p) return;
        if (e.seq != null) return p.resolve({ id: e.id, seq: e.seq });
        const err = commandError(e.code);
        err.reason = e.reason; // the server's code when it refused the command (`Rejected`)
        return p.reject(err);
      }
      case "error": {
        const Cls = e.code === ErrorCode.ProtocolViolation ? ProtocolError : ConnectionError;
        this._emit(type, new Cls(e.code, e.message));
        if (e.code === ErrorCode.Unauthorized) {
          // A fresh token next time; a fixed `token` the server refuses never gets better: the
          // room closes (queued commands fail `Closed`) instead of knocking for ever.
          this.#token = null;
          if (this._static) this.close();
        }
        return;
      }
      case "token_needed":
        if (!this._closed) this._dial();
        return;
    }
    this._emit(type, e);
  }

  _emit(type, payload) {
    // Nothing follows `connection: closed` but command outcomes: not the rest of a step in which
    // a listener closed the room (its close() announced `closed` first), nor a token fetch or a
    // relay check that finishes after it.
    // (Asked before each listener: the one before may have closed the room.) What a listener's
    // own call makes the driver emit waits for the other listeners of this event, whatever
    // emitted it (a step, a relay checked, a fast-path event).
    this._held++;
    try {
      for (const listener of this._listeners.get(type) ?? []) {
        if (this._ended && type !== "command") return;
        try {
          listener(payload);
        } catch (err) {
          // A throwing listener never stops delivery to the others, nor breaks the SDK. Its
          // error goes to the page, as an event listener's does (the console shows it,
          // `onerror` gets it), and to the `error` listeners (but an `error` listener's, which
          // would loop).
          globalThis.reportError?.(err);
          if (type !== "error") {
            this._emit("error", new UsageError(ErrorCode.ListenerError, `a "${type}" listener threw`, { cause: err }));
          }
        }
      }
    } finally {
      if (!--this._held) this._onEvents();
    }
  }

  _sendRelay(channel, signed) {
    // A reason this SDK does not know (a newer server's) was decoded as "unknown": the copy it
    // would relay is not what the server signed, and every peer would report it forged.
    // (Unsigned: none held yet, or the assignment was not signed.)
    if (channel.readyState !== "open" || !signed?.sig || signed.reason === "unknown") return;
    try {
      channel.send(JSON.stringify({ t: RELAY_TAG, assignment: signed }));
    } catch {
      // A closing channel: the peer will get the next one.
    }
  }

  /** The server's keys, a Promise<Map<kid, CryptoKey>>: read once, and read again for a relay
   * whose kid `known` (the map read before) lacks, at most once a minute (a peer cannot make
   * every relay cost a request), keeping `known` when that read fails. */
  _loadKeys(known) {
    if (!this._keys || (known && performance.now() - this._keysAt > 60_000)) {
      this._keysAt = performance.now();
      this._keys = (async () => {
        // (What fails here is never shown: a relay is then "unsupported", with one warning.)
        const res = await fetchWithRetry(this._keysUrl);
        // (Not ok: no body, so no key, read.)
        const body = res.ok && (await res.json());
        const keys = new Map();
        for (const k of body.keys ?? []) {
          // A key that does not import (malformed) leaves the others usable.
          try {
            if (k.alg === "Ed25519") keys.set(k.kid, await crypto.subtle.importKey("raw", b64urlDecode(k.x), "Ed25519", false, ["verify"]));
          } catch {}
        }
        // None usable (a browser without Ed25519 imports none): relays are unsupported.
        if (!keys.size) throw Error();
        return keys;
      })();
      // After a first read fails, relays wait a minute before the keys are read again.
      if (known) this._keys = this._keys.catch(() => known);
      // (Not once closed: the timer would hold the room for a minute.)
      else this._keys.catch(() => this._closed || (this._keysTimer = setTimeout(() => (this._keys = null), 60_000)));
    }
    return this._keys;
  }

  async _onRelay(peerId, signed) {
    // (`signed`: the `assignment` of a relay message, never falsy; anything else.)
    const report = (accepted, reason) => this._emit("relay", { peer: peerId, epoch: count(signed.epoch) ? signed.epoch : undefined, accepted, reason });
    // "unsigned" (or for another room) and "forged" (not verified) are errors too.
    const refuse = (reason) => {
      this._emit("error", new ProtocolError(ErrorCode.ForgedRelay, `a relayed assignment was refused: ${reason}`));
      report(false, reason);
    };
    if (signed.room !== this.room || typeof signed.sig !== "string" || typeof signed.kid !== "string") {
      return refuse("unsigned");
    }
    let keys;
    try {
      keys = await this._loadKeys();
    } catch {
      if (!this._relayWarned) {
        this._relayWarned = true;
        this._emit("error", new ProtocolError(ErrorCode.RelayUnsupported, "no Ed25519 in WebCrypto or no server keys: relays are ignored"));
      }
      return report(false, "unsupported");
    }
    // A key the server published since (restarted with a new key)? Its keys are read again (or
    // a read under way for another relay is waited for).
    const key = keys.get(signed.kid) ?? (await this._loadKeys(keys)).get(signed.kid);
    const bytes = signingBytes(signed);
    let ok;
    try {
      ok = key && bytes && (await crypto.subtle.verify("Ed25519", key, b64urlDecode(signed.sig), bytes));
    } catch {} // a malformed signature: not verified
    if (!ok) return refuse("forged");
    if (this._closed) return;
    // The checked fields only: whatever else the peer put in the object is not passed on (nor
    // serialised: a deeply nested extra field would make JSON.stringify throw).
    const adopted = this._driver.peerAssignment(JSON.stringify(signed, [...SIGNED, "kid", "sig"]));
    report(adopted, adopted ? "adopted" : "stale");
  }
}
