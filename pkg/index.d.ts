// Types of the hostlease package.

export declare const ErrorCode: Readonly<{
  NotInitialized: "NotInitialized";
  BadArgument: "BadArgument";
  NotHost: "NotHost";
  NotAuthoritative: "NotAuthoritative";
  LeaseExpired: "LeaseExpired";
  NoCapability: "NoCapability";
  StaleEpoch: "StaleEpoch";
  IdempotencyConflict: "IdempotencyConflict";
  UnknownAction: "UnknownAction";
  BadPayload: "BadPayload";
  QueueFull: "QueueFull";
  Timeout: "Timeout";
  Interrupted: "Interrupted";
  Closed: "Closed";
  Rejected: "Rejected";
  Unauthorized: "unauthorized";
  TokenUnavailable: "TokenUnavailable";
  ProtocolViolation: "ProtocolViolation";
  ForgedRelay: "ForgedRelay";
  RelayUnsupported: "RelayUnsupported";
  ListenerError: "ListenerError";
  Unavailable: "Unavailable";
  BadResponse: "BadResponse";
}>;

/** Codes an `error` event carries from the server: its error frame's wire code (a
 * `ConnectionError`), or the decoder's code for a frame it refused (a frame of a type this
 * version does not know is skipped: a newer server's). */
export type ServerErrorCode =
  | "bad_frame" | "frame_too_large" | "unsupported_version" | "rate_limited" | "unauthorized"
  | "room_full" | "too_many_rooms" | "too_many_connections" | "unexpected_message"
  | "room_closed" | "kicked" | "internal" | "unknown"
  | "malformed_frame" | "missing_version" | "invalid_frame";

export type ErrorCodeValue = (typeof ErrorCode)[keyof typeof ErrorCode] | ServerErrorCode | (string & {});

export declare class HostleaseError extends Error {
  readonly code: ErrorCodeValue;
  constructor(code: ErrorCodeValue, message: string, options?: { cause?: unknown });
}
export declare class UsageError extends HostleaseError {}
export declare class CommandError extends HostleaseError {
  /** The server's rejection code when `code` is `Rejected` (`bad_request`, `rate_limited`, ...). */
  reason?: string | undefined;
}
export declare class ConnectionError extends HostleaseError {}
export declare class ProtocolError extends HostleaseError {}

/** Loads the WebAssembly module; await it once before `connect`. Without `input` the `.wasm` is
 * fetched from next to the package's glue (`new URL("hostlease_bg.wasm", import.meta.url)`,
 * which Vite rewrites); esbuild users pass its URL (see the README). A load that fails rejects
 * with a `UsageError` (`NotInitialized`), and `init()` may be called again. */
export declare function init(input?: string | URL | Request | Response | Promise<Response> | BufferSource | WebAssembly.Module): Promise<void>;
/** The wire-protocol major version. Throws a `UsageError` (`NotInitialized`) before `init()`. */
export declare function version(): number;

export type Phase = "connecting" | "live" | "offline" | "resyncing" | "closed";
export type LeaseState = "not_host" | "unknown" | "held" | "expired" | "relinquished";
export type Reason =
  | "elected" | "lease_lapsed" | "left" | "resigned" | "transferred" | "admin" | "kicked" | "closed" | "unknown";

export interface Assignment {
  room: string;
  host: string | null;
  session: string | null;
  epoch: number;
  seq: number;
  lease_ms: number;
  reason: Reason;
  issued_at: number;
  kid?: string;
  sig?: string;
}

export interface Member {
  readonly id: string;
  readonly session: string;
  readonly name: string;
  readonly join_seq: number;
  readonly may_host: boolean;
}

export interface PendingCommand {
  readonly id: string;
  readonly action: string;
  /**
   * Waiting to be sent: made offline (sent after the resync), or behind an older command of its
   * kind that waits to go again or 16 out (commands of a kind go in order, pipelined).
   */
  readonly queued: boolean;
}

export interface HostView {
  phase: Phase;
  host: string | null;
  hostSession: string | null;
  epoch: number | null;
  me: string | null;
  session: string | null;
  /** May issue host commands now: live, granted by the server, lease confirmed, token held. */
  amHost: boolean;
  /** The newest assignment names this session (with or without authority). */
  namedHost: boolean;
  lease: LeaseState;
  /** Shown while the server is unreachable (from a session's loss to the next welcome); has no
   * authority. */
  provisional: string | null;
  /** In election order. The view is shared (the same object until it changes): its lists and
   * their entries are read-only. */
  readonly members: readonly Member[];
  cursor: number;
  readonly actions: { readonly host: readonly string[]; readonly participant: readonly string[] };
  readonly pending: readonly PendingCommand[];
  signed: Assignment | null;
}

export interface RoomEventRecord {
  seq: number;
  epoch: number;
  actor: string;
  action: string;
  payload: unknown;
  at: number;
}

export interface EventMap {
  host: {
    host: string | null;
    session: string | null;
    epoch: number;
    reason: Reason;
    previousEpoch: number | null;
    via: "server" | "snapshot" | "peer";
    issuedAt: number;
    assignment: Assignment;
  };
  /** `null`: no provisional coordinator (live again, or offline with no reachable member that
   * may host: `connection` says which). */
  provisional: { coordinator: string | null };
  /** A copy of the view's list, shared by this event's listeners (the view's own is not
   * changed by sorting it; copy it before changing it when other listeners read it). */
  members: { members: Member[] };
  event: RoomEventRecord;
  discontinuity: { from: number; to: number };
  /** `closed` is the last event a room delivers, but for pending commands' outcomes (and the
   * `ListenerError` of a `connection` listener that threw on it). */
  connection: { phase: Phase };
  /** `held` for a new host: from then on it may issue host commands (`view.amHost`). Said
   * again when the host's token comes after the lease (a resume's welcome brings the lease). */
  lease: { state: LeaseState };
  /** `reason`: the server's rejection code when `code` is `Rejected` (`bad_request`, ...). */
  command: { id: string; state: "queued" | "accepted" | "failed"; seq?: number; code?: string; reason?: string | undefined };
  signal: { from: string; fromSession: string; data: unknown };
  /** `stale`: verified, but not adopted: older than (or the same as) what the view has, or come
   * before this client's first snapshot, or with a field the protocol's codec refuses. */
  relay: { peer: string; epoch?: number | undefined; accepted: boolean; reason: "adopted" | "stale" | "forged" | "unsigned" | "unsupported" };
  error: HostleaseError;
}

/** `expiresAt`: milliseconds since the epoch, as `Date.now()`; absent or `null`: no expiry known. */
export type TokenResult = string | { token: string; expiresAt?: number | null | undefined };

interface ConnectOptionsBase {
  /** The server's base URL (`wss://host`, or `https://host`, dialled as `wss://`; a path prefix
   * is kept), or a room's full `/ws` URL (its origin and path prefix are used, for `room`; no
   * query is kept). */
  url: string;
  room: string;
  /** Where the server's public keys are (default: `<server>/v1/keys`). */
  keysUrl?: string | undefined;
  /** Closes the room when it aborts (as `room.close()`). Aborted before `connect()` resolves,
   * `connect()` rejects with a `ConnectionError` (`Closed`, the signal's `reason` as `cause`):
   * at once if it was aborted already (no token asked for), else once a `getToken()` call under
   * way has answered, dialling nothing. The room is not kept alive by the signal. */
  signal?: AbortSignal | undefined;
}

/** `token` or `getToken`, one of the two (given both, `getToken` is used). */
export type ConnectOptions = ConnectOptionsBase & (
  | {
    /** A join token from your backend. If the server refuses it, the room closes. */
    token: string;
    getToken?: undefined;
  }
  | {
    token?: string | undefined;
    /** Called for the first connection's join token, 30 s ahead of `expiresAt` (half way for a
     * token of a minute or less, and never sooner than 10 s after the last answer: give tokens
     * at least 20 s), and when the server refuses the token it has; a token without
     * `expiresAt` is used again for every reconnect until it is refused. An answer that takes
     * longer than 10 s counts as failed (`TokenUnavailable`) and is asked again later; meanwhile
     * the token it has goes on being used until its `expiresAt`. */
    getToken: () => TokenResult | Promise<TokenResult>;
  }
);

export interface Stamped<T> {
  hostleaseEpoch: number;
  body: T;
}

export declare class Room {
  /** Rooms come from `connect()`, which checks the options and fetches the first token. */
  private constructor();
  readonly room: string;
  /** The same object until something in it changes (fit for `useSyncExternalStore`); read-only.
   * Every change comes with an event but these: a command sent while live (in `pending` as soon
   * as `command()` returns), a queued command sent after the resync or once the command it waited
   * behind is decided (`queued` turns false before its `command` event), one sent before a
   * reconnect that waits behind another after it (`queued` turns true), and the lease's deadline
   * passing or a sleep just noticed (`amHost` and
   * `lease` read them at once, before the next step's `lease` event). Events are delivered after
   * the step that produced them, so a listener sees `view` as it is after the whole step: a
   * resume that replays two host changes emits both `host` events, and `view` already shows the
   * second in the first's listener. A listener acts on its event's payload. */
  readonly view: HostView;
  /** Subscribes `listener`; returns the unsubscribe function. Each call is a subscription of
   * its own; the returned function ends it. An event goes to the listeners subscribed when its
   * delivery began and not removed since (as the DOM's `removeEventListener`). Throws a `UsageError` (`BadArgument`)
   * when `listener` is not a function. */
  on<K extends keyof EventMap>(type: K, listener: (payload: EventMap[K]) => void): () => void;
  /** Resolves once the server applied the command; rejects with a `CommandError`: refused here
   * (`NotHost`, `NotAuthoritative`, `LeaseExpired`, `NoCapability`, `UnknownAction`, `BadPayload`, `QueueFull`,
   * `BadArgument`), by the server (`StaleEpoch`, `NotHost`, `LeaseExpired`, `NoCapability`, `IdempotencyConflict`,
   * `Rejected` with its code in `.reason`; a refusal the server says to retry in more than a
   * minute, e.g. `rate_limited`, is `Rejected` at once rather than waited out, or `Interrupted`
   * if it answered a resend),
   * or unknown (`Timeout`, `Interrupted`, `Closed`). A command already sent once and never
   * answered that a check here refuses when it is due again fails `Interrupted`: the first attempt
   * may have been applied. So does one sent and never answered that would go again 47 h or
   * more after it was made (a device asleep that long; the server keeps idempotency keys 48 h,
   * and a resend could apply it twice). A participant command made offline stays pending and
   * is sent after the resync. */
  command(action: string, payload?: unknown): Promise<{ id: string; seq: number }>;
  /** Tags a message of the host with its epoch; throws a `CommandError` (`NotHost`, or
   * `NotAuthoritative` while the lease is not held or the room is not live; a host command says
   * why more finely: `LeaseExpired`, `NoCapability`, ...) when this tab may not act as host. */
  stamp<T>(body: T): Stamped<T>;
  /** The body of a message `peerId` stamped (stamp a non-null body: a `null` one cannot be told
   * from a refusal) when `peerId` is the host of the epoch this tab's view holds, else `null`: a
   * deposed host's (an older epoch), another peer's, or one claiming an epoch the view has not
   * verified (stamps are not signed: a newer epoch is not taken on a stamp's word). */
  acceptStamped<T>(peerId: string, message: Stamped<T>): T | null;
  /** `peerId`: the peer's participant id (`members[].id`); one channel per peer id, so a channel
   * attached for a peer id replaces (detaches) the one attached before, even a channel already
   * closing, which is then not attached. Does nothing
   * else after `close()`; a channel that closes is detached (call `detachPeer` when closing the
   * `RTCPeerConnection` yourself: Safari then fires no `close` on its channels). Throws a `UsageError` (`BadArgument`) for a peer id that is not a valid
   * participant id (1-128 of `A-Z a-z 0-9 - _ . : @`, not `.` or `..`) or a `channel` that is not an event target. The SDK sends and reads its own
   * `{"t":"hostlease.relay"}` messages on `channel`: best a channel of its own. */
  attachPeer(peerId: string, channel: RTCDataChannel): void;
  detachPeer(peerId: string): void;
  /** Sends WebRTC signalling `data` (an offer, an answer, an ICE candidate) to member `to`
   * through the server, which hands it to each of that member's sessions as a `signal` event
   * (`{ from, fromSession, data }`). Returns whether it went out: `false` while the socket is not
   * open (signals are not queued: send them again after `connection` says `live`), for a `to`
   * that is not a valid participant id (or not a string) (a valid id of nobody in the room is sent, and dropped by
   * the server), or for data past the payload limits (60,416 bytes of JSON, 64
   * levels of nesting). Throws a `UsageError` (`BadArgument`) for data JSON cannot hold. */
  signal(to: string, data: unknown): boolean;
  /** This participant's durable inbox, read over HTTP with the room's join token (see
   * `fetchInbox`; a refused token is asked of `getToken` once more, and `getToken` failing
   * rejects with `TokenUnavailable`). */
  inbox(options?: { since?: number | undefined }): Promise<InboxPage>;
  /** Leaves the room (a host's role passes on at once) and stops reconnecting. Pending commands
   * fail `Closed`; one sent and not yet answered fails `Interrupted` (it may have been applied). */
  close(): void;
}

/** Resolves once the first connection attempt has started (watch `connection` for `live`; a
 * server that cannot be reached is retried with backoff). Rejects with `NotInitialized` (before
 * `init()`), `BadArgument` (bad options, URL or room name), `TokenUnavailable` (no first token),
 * `Unavailable` (the browser refused to create the WebSocket) or `Closed` (`signal` aborted). */
export declare function connect(options: ConnectOptions): Promise<Room>;

/** One stream item: an assignment (signed by the server) or a room event. */
export type InboxItem =
  | ({ kind: "assignment" } & Assignment)
  | ({ kind: "event" } & RoomEventRecord);

export interface InboxEntry {
  cursor: number;
  item: InboxItem;
}

export interface InboxPage {
  /** In cursor order. An item can repeat one the page got live (a connection that died without
   * a close), and come after newer ones: order and de-duplicate by `item.seq`. */
  entries: InboxEntry[];
  /** Pass as `since` to read on; `null` when everything was read (to read only newer entries
   * later, keep the last entry's `cursor` and pass that). */
  next: number | null;
}

export interface FetchInboxOptions {
  /** The server's base URL, `ws(s)://` or `http(s)://`. */
  url: string;
  room: string;
  /** The participant's join token (sent in the Authorization header). */
  token: string;
  /** A cursor from an earlier page's `next` (default 0; `next` is `null` when there is no more
   * to read: a `null` here is a `BadArgument`). */
  since?: number | undefined;
}

/** Reads a participant's durable inbox over HTTP, without joining the room: up to 16 pages a
 * call. A page that fails after the first ends the call with what was read and `next` to go on
 * from. Rejects (the first page failing, or any page's `next` going backwards) with a
 * `UsageError` (`BadArgument`: bad options), a `ConnectionError` (`unauthorized`: the token was
 * refused; `Unavailable`: the server could not be reached or answered an error) or a
 * `ProtocolError` (`BadResponse`: a page that is not an inbox page). */
export declare function fetchInbox(options: FetchInboxOptions): Promise<InboxPage>;
