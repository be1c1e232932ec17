//! HTTP routes: snapshot, commands, inbox, keys, admin, health, metrics, the WebSocket upgrade,
//! and (with `--dev`) the demo's token endpoint and static files.

// Early returns of ready-made responses on the error path of a request handler: boxing them
// would buy nothing.
#![allow(clippy::result_large_err)]

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};

use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, Query, Request, State, WebSocketUpgrade};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use hostlease::protocol::json::ToJson;
use hostlease::protocol::{
    codec::{decode_body, encode_body, MAX_CLIENT_FRAME},
    CommandRequest, DecodeError, IdempotencyKey, KeySet, Member, Outcome, ParticipantId, Reason,
    RejectCode, RoomId, Token,
};
use serde::Deserialize;
use tower_http::cors::{Any, CorsLayer};

use crate::rooms::{correlation_id, App};
use crate::store::GrantReq;
use crate::tokens::{CapClaims, JoinClaims, CAP_PREFIX, JOIN_PREFIX};

/// The bucket a client address counts against (and its open WebSockets): an IPv6 client by its
/// /64 (one subscriber's network: a client that rotates its interface identifier, as privacy
/// addresses do and as an abuser can at will, stays one client), an IPv4-mapped one as the
/// IPv4 address it is.
pub(crate) fn client_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        },
    }
}

/// The process-wide Prometheus recorder (installed once; later calls reuse it).
pub fn metrics_handle() -> Option<metrics_exporter_prometheus::PrometheusHandle> {
    static HANDLE: OnceLock<Option<metrics_exporter_prometheus::PrometheusHandle>> =
        OnceLock::new();
    HANDLE
        .get_or_init(|| {
            metrics_exporter_prometheus::PrometheusBuilder::new()
                .install_recorder()
                .ok()
        })
        .clone()
}

async fn rate_limit(
    State(app): State<Arc<App>>,
    ConnectInfo(addr): ConnectInfo<SocketAddr>,
    req: Request,
    next: Next,
) -> Response {
    match app.http_limiter.admit(client_key(addr.ip())) {
        Ok(()) => next.run(req).await,
        Err(ms) => {
            metrics::counter!("hostlease_http_rate_limited_total").increment(1);
            too_many_requests(ms, "rate limited")
        }
    }
}

/// 429 with `body` and a `Retry-After` of `ms` in whole seconds (at least 1).
fn too_many_requests(ms: u64, body: impl IntoResponse) -> Response {
    retry_after(StatusCode::TOO_MANY_REQUESTS, ms, body)
}

/// `status` with a `Retry-After` of `ms` in whole seconds (at least 1).
fn retry_after(status: StatusCode, ms: u64, body: impl IntoResponse) -> Response {
    let secs = ms.div_ceil(1000).max(1).to_string();
    (status, [(header::RETRY_AFTER, secs)], body).into_response()
}

/// What a browser app served from another origin may read: snapshots, its inbox (the join token
/// travels in the `Authorization` header; no cookies, so no credentials mode) and the public keys
/// that verify relayed assignments. Commands, admin and metrics stay same-origin. CORS sits
/// outside the rate limit, so that a 429 still reaches the page with its `Retry-After`; it is a
/// route layer, so unmatched paths get no CORS headers.
fn browser_reads(app: &Arc<App>) -> Router<Arc<App>> {
    let cors = CorsLayer::new()
        .allow_origin(Any)
        .allow_methods([Method::GET])
        .allow_headers([header::AUTHORIZATION])
        .expose_headers([header::RETRY_AFTER])
        .max_age(std::time::Duration::from_secs(600));
    Router::new()
        .route("/v1/rooms/{room}", get(snapshot))
        .route("/v1/rooms/{room}/inbox", get(inbox))
        .route("/v1/keys", get(keys))
        .route_layer(middleware::from_fn_with_state(app.clone(), rate_limit))
        .route_layer(cors)
}

/// The admin key, checked before anything else, the body included, for every admin route: a
/// request without it is answered at once, whatever body it announces or never sends.
async fn admin_gate(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    match require_admin(&app, req.headers()) {
        Ok(()) => next.run(req).await,
        Err(e) => e,
    }
}

/// Runs a request to its end in a task of its own. Hyper drops the handler of a request whose
/// client went away: half way through, an admin kick left the kicked host in office (with its
/// lease, and a host token that kept working until the lease lapsed), and a committed grant went
/// without its log line.
async fn to_the_end(req: Request, next: Next) -> Response {
    tokio::spawn(next.run(req))
        .await
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// Reads a request's body whole, within the header timeout, for the routes that take one: a
/// client that sent a head and then part of its body (or one chunk of it) held a socket and a
/// task for ever, as one sending half a head did before `header_timeout_ms`.
async fn body_in_time(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    use axum::extract::FromRequest;
    let (parts, body) = req.into_parts();
    let limit = std::time::Duration::from_millis(app.cfg.header_timeout_ms);
    // Read as the `Bytes` extractor reads it: past the body limit (a chunked body, whose length
    // is not announced) that is a 413, as before.
    match tokio::time::timeout(limit, Bytes::from_request(Request::new(body), &())).await {
        Ok(Ok(bytes)) => next.run(Request::from_parts(parts, bytes.into())).await,
        Ok(Err(rejection)) => rejection.into_response(),
        Err(_) => (
            StatusCode::REQUEST_TIMEOUT,
            [(header::CONNECTION, "close")],
            "the body was not sent in time",
        )
            .into_response(),
    }
}

pub fn router(app: Arc<App>) -> Router {
    let mut r = Router::new()
        .route("/v1/rooms/{room}/ws", get(ws_upgrade))
        .route(
            "/v1/rooms/{room}/commands",
            post(command).layer(middleware::from_fn_with_state(app.clone(), body_in_time)),
        )
        .merge(
            Router::new()
                .route("/v1/admin/rooms/{room}/reassign", post(admin_reassign))
                .route("/v1/admin/rooms/{room}/kick", post(admin_kick))
                .route("/v1/admin/rooms/{room}/close", post(admin_close))
                .route("/v1/admin/rooms/{room}/ttl", post(admin_ttl))
                .route_layer(middleware::from_fn(to_the_end))
                // Read once the key is checked: a request without it is refused unread.
                .route_layer(middleware::from_fn_with_state(app.clone(), body_in_time))
                .route_layer(middleware::from_fn_with_state(app.clone(), admin_gate)),
        )
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics_route));
    if app.cfg.dev {
        // Callable from a page of another origin (an app's dev server: Vite on its own port),
        // whatever content type the page sends: it is for development only.
        let cors = CorsLayer::new()
            .allow_origin(Any)
            .allow_methods([Method::POST])
            .allow_headers([header::CONTENT_TYPE]);
        r = r.merge(
            Router::new()
                .route("/dev/token", post(dev_token))
                .route_layer(middleware::from_fn_with_state(app.clone(), body_in_time))
                .route_layer(cors),
        );
    }
    if let Some(dir) = &app.cfg.www {
        r = r.fallback_service(tower_http::services::ServeDir::new(dir));
    }
    // No body this server takes is larger than a client frame: one announced longer is refused
    // (413) at once, before it is read (axum's default let each request hold up to 2 MB).
    r.layer(tower_http::limit::RequestBodyLimitLayer::new(
        MAX_CLIENT_FRAME,
    ))
    .layer(middleware::from_fn_with_state(app.clone(), rate_limit))
    .merge(browser_reads(&app))
    .with_state(app)
}

fn room_id(s: &str) -> Result<RoomId, Response> {
    RoomId::new(s).map_err(|e| (StatusCode::BAD_REQUEST, e.code()).into_response())
}

fn bearer(h: &HeaderMap) -> Option<Token> {
    h.get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(|t| Token::new(t.trim()))
}

async fn ws_upgrade(
    State(app): State<Arc<App>>,
    ConnectInfo(addr): ConnectInfo<SocketAddr>,
    Path(room): Path<String>,
    ws: WebSocketUpgrade,
) -> Response {
    let room = match room_id(&room) {
        Ok(r) => r,
        Err(e) => return e,
    };
    // Twice the protocol limit at the transport, so that an oversized frame reaches the
    // session and is answered with a typed `frame_too_large` error before the close.
    // A small read buffer: tungstenite zero-fills the free part of it before every read attempt
    // (one per wake of the session's loop), and clients send small frames. At the default of
    // 128 KiB that memset was about 30 % of the server's CPU in the fan-out benchmark; frames
    // larger than the buffer still arrive whole (it grows for them).
    ws.read_buffer_size(4096)
        .max_message_size(2 * MAX_CLIENT_FRAME)
        .max_frame_size(2 * MAX_CLIENT_FRAME)
        .on_upgrade(move |socket| crate::ws::run(app, room, client_key(addr.ip()), socket))
}

/// The room's snapshot, for the app backend (admin key) or a participant (a join token for the
/// room): it names the members, so it is not for anyone who guesses a room id.
async fn snapshot(
    State(app): State<Arc<App>>,
    Path(room): Path<String>,
    headers: HeaderMap,
) -> Response {
    let room = match room_id(&room) {
        Ok(r) => r,
        Err(e) => return e,
    };
    if !admin_ok(&app, &headers) {
        if let Err(e) = join_claims(&app, &headers, &room) {
            return e;
        }
    }
    let hub = match app.room(&room).await {
        Ok(Some(h)) => h,
        Ok(None) => return (StatusCode::SERVICE_UNAVAILABLE, "too many rooms").into_response(),
        Err(_) => return (StatusCode::SERVICE_UNAVAILABLE, "storage unavailable").into_response(),
    };
    json_body(&app.snapshot(&hub, None))
}

async fn command(
    State(app): State<Arc<App>>,
    Path(room): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let room = match room_id(&room) {
        Ok(r) => r,
        Err(e) => return e,
    };
    let Some(token) = bearer(&headers) else {
        return (StatusCode::UNAUTHORIZED, "missing bearer capability").into_response();
    };
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .and_then(|k| IdempotencyKey::new(k).ok());
    let Some(key) = key else {
        return (
            StatusCode::BAD_REQUEST,
            "missing or invalid Idempotency-Key",
        )
            .into_response();
    };
    // Not UTF-8: refused as the WebSocket path refuses it (a lossy decode would accept it).
    let Ok(text) = std::str::from_utf8(&body) else {
        return (
            StatusCode::BAD_REQUEST,
            DecodeError::Malformed { line: 0, column: 0 }.code(),
        )
            .into_response();
    };
    let req: CommandRequest = match decode_body(text, MAX_CLIENT_FRAME) {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_REQUEST, e.code()).into_response(),
    };
    // Checked before the room is loaded: a request without a capability signed for this room
    // neither loads the room nor takes one of `max_rooms` (it got 503 "too many rooms" when
    // they were all taken). The rest (expiry, holder, epoch) is checked with the room, from these
    // claims (the signature is verified once).
    let Some(claims) = app
        .cap_keys
        .verify::<CapClaims>(CAP_PREFIX, token.expose())
        .ok()
        .filter(|c| c.room == room)
    else {
        metrics::counter!("hostlease_commands_total", "result" => RejectCode::BadCapability.as_str())
            .increment(1);
        let outcome = Outcome::Rejected {
            code: RejectCode::BadCapability,
            current: None,
            retry_after_ms: None,
        };
        return (StatusCode::FORBIDDEN, json_body(&outcome)).into_response();
    };
    // The participant's command rate, shared with its WebSocket sessions; an expired capability
    // is charged to a bucket of its own (see `App::expired_limiter`).
    let limiter = if claims.exp > app.store.clock_ms() {
        &app.command_limiter
    } else {
        &app.expired_limiter
    };
    let bucket = (room.clone(), claims.sub.clone());
    if let Err(ms) = limiter.admit(bucket.clone()) {
        return too_many_requests(ms, json_body(&crate::ws::rate_limited(ms)));
    }
    let loaded = app.room(&room).await;
    if !matches!(loaded, Ok(Some(_))) {
        // Charged before the room is loaded (so that a flood does not load rooms), and given
        // back when it cannot be: the retry of a 503 was refused 429 for a command that never
        // reached a room.
        limiter.refund(bucket, 1.0);
    }
    let hub = match loaded {
        Ok(Some(h)) => h,
        Ok(None) => return (StatusCode::SERVICE_UNAVAILABLE, "too many rooms").into_response(),
        Err(_) => {
            // The store could not be read: counted like a command the store failed to decide.
            metrics::counter!("hostlease_commands_total", "result" => RejectCode::Unavailable.as_str())
                .increment(1);
            return (StatusCode::SERVICE_UNAVAILABLE, "storage unavailable").into_response();
        }
    };
    let outcome = crate::ws::command(
        &app,
        &hub,
        crate::ws::Incoming {
            sender: None,
            capability: crate::ws::Capability::Verified(claims),
            key,
            action: req.action,
            payload: req.payload,
            epoch: req.epoch,
            order: None,
        },
    )
    .await;
    drop(hub);
    let status = match &outcome {
        Outcome::Accepted { .. } => StatusCode::OK,
        Outcome::Rejected { code, .. } => match code {
            RejectCode::BadCapability => StatusCode::FORBIDDEN,
            RejectCode::ActionNotGranted => StatusCode::FORBIDDEN,
            RejectCode::BadRequest => StatusCode::BAD_REQUEST,
            RejectCode::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            RejectCode::RateLimited => StatusCode::TOO_MANY_REQUESTS,
            _ => StatusCode::CONFLICT,
        },
    };
    // A retry time in the body is in the header too (an HTTP client reads that one): over the
    // room's bytes (429, as past the participant's rate), or a store too far behind (503).
    match &outcome {
        Outcome::Rejected {
            retry_after_ms: Some(ms),
            ..
        } => retry_after(status, *ms, json_body(&outcome)),
        _ => (status, json_body(&outcome)).into_response(),
    }
}

#[derive(Deserialize)]
struct InboxQuery {
    #[serde(default)]
    since: u64,
}

/// The claims of the request's `Bearer` join token, if it is valid for `room` and unexpired.
fn join_claims(app: &App, headers: &HeaderMap, room: &RoomId) -> Result<JoinClaims, Response> {
    let Some(token) = bearer(headers) else {
        return Err((StatusCode::UNAUTHORIZED, "missing bearer join token").into_response());
    };
    match app
        .join_keys
        .verify::<JoinClaims>(JOIN_PREFIX, token.expose())
    {
        Ok(c) if c.room == *room && c.exp > crate::tokens::now_ms() => Ok(c),
        _ => Err((StatusCode::FORBIDDEN, "join token refused").into_response()),
    }
}

/// Most entries in one inbox page.
pub const INBOX_PAGE: i64 = 256;
/// Most bytes of stored items in one inbox page (one entry at least): past it the page ends and
/// `next` says where to read on.
pub const INBOX_PAGE_BYTES: usize = 1024 * 1024;

/// The durable inbox of the participant named by a join token for the room (Bearer).
async fn inbox(
    State(app): State<Arc<App>>,
    Path(room): Path<String>,
    Query(q): Query<InboxQuery>,
    headers: HeaderMap,
) -> Response {
    let room = match room_id(&room) {
        Ok(r) => r,
        Err(e) => return e,
    };
    let claims = match join_claims(&app, &headers, &room) {
        Ok(c) => c,
        Err(e) => return e,
    };
    match app
        .store
        .inbox(&room, &claims.sub, q.since, INBOX_PAGE, INBOX_PAGE_BYTES)
        .await
    {
        Ok(page) => json_body(&page),
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "storage unavailable").into_response(),
    }
}

/// Public keys are public: any origin may read them (see `browser_reads`), so that an app served
/// from another origin than this server can verify relayed assignments with WebCrypto.
async fn keys(State(app): State<Arc<App>>) -> Response {
    json_body(&KeySet {
        keys: vec![app.keys.public()],
    })
}

async fn healthz(State(app): State<Arc<App>>) -> Response {
    match app.store.now_ms().await {
        Ok(_) => (StatusCode::OK, "ok").into_response(),
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "storage unavailable").into_response(),
    }
}

async fn metrics_route(State(app): State<Arc<App>>) -> Response {
    match &app.metrics {
        Some(h) => h.render().into_response(),
        None => (StatusCode::NOT_FOUND, "metrics recorder not installed").into_response(),
    }
}

/// The admin key check, first in every admin handler: a caller without the key learns nothing
/// about the body or the room (401 whatever it sent).
fn require_admin(app: &App, headers: &HeaderMap) -> Result<(), Response> {
    if admin_ok(app, headers) {
        Ok(())
    } else {
        Err((StatusCode::UNAUTHORIZED, "admin key required").into_response())
    }
}

fn admin_ok(app: &App, headers: &HeaderMap) -> bool {
    match (&app.cfg.admin_key, bearer(headers)) {
        (Some(k), Some(t)) => {
            // The keys' SHA-256 digests compared in constant time: neither the key's bytes nor
            // its length show in the time a guess takes (the length was compared first, and a
            // guess of another length answered at once).
            use sha2::{Digest, Sha256};
            let (a, b) = (
                Sha256::digest(k.as_bytes()),
                Sha256::digest(t.expose().as_bytes()),
            );
            a.iter()
                .zip(b.iter())
                .fold(0u8, |acc, (x, y)| acc | (x ^ y))
                == 0
        }
        _ => false,
    }
}

/// `reassign`'s body. Unknown fields are refused: a misspelt `to` (or a kick's `participant`)
/// would otherwise reassign to whoever is next, answered 200.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ReassignBody {
    #[serde(default)]
    to: Option<ParticipantId>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KickBody {
    participant: ParticipantId,
}

/// The room of an admin request whose key was checked (`require_admin`).
async fn admin_room(app: &Arc<App>, room: &str) -> Result<crate::rooms::HeldRoom, Response> {
    let room = room_id(room)?;
    match app.room(&room).await {
        Ok(Some(h)) => Ok(h),
        _ => Err((StatusCode::SERVICE_UNAVAILABLE, "room unavailable").into_response()),
    }
}

fn parse_reassign_body(body: &Bytes) -> Result<ReassignBody, Response> {
    if body.is_empty() {
        return Ok(ReassignBody::default());
    }
    serde_json::from_slice(body).map_err(|_| (StatusCode::BAD_REQUEST, "bad body").into_response())
}

/// `POST /v1/admin/rooms/{room}/reassign {"to"?: participant}`: a grant like any other.
async fn admin_reassign(
    State(app): State<Arc<App>>,
    Path(room): Path<String>,
    body: Bytes,
) -> Response {
    let body = match parse_reassign_body(&body) {
        Ok(b) => b,
        Err(e) => return e,
    };
    let hub = match admin_room(&app, &room).await {
        Ok(h) => h,
        Err(e) => return e,
    };
    admin_reassign_in(&app, &hub, body).await
}

async fn admin_reassign_in(
    app: &Arc<App>,
    hub: &Arc<crate::rooms::Room>,
    body: ReassignBody,
) -> Response {
    let _g = hub.decide.lock().await;
    let row = match app.store.room(&hub.id).await {
        Ok(r) => r,
        Err(_) => return (StatusCode::SERVICE_UNAVAILABLE, "storage unavailable").into_response(),
    };
    // The answer that is not a grant: the current assignment (the row's, or the hub's genesis
    // for a room never granted).
    let current = |row: Option<crate::store::RoomRow>| {
        json_body(
            &row.and_then(|r| r.current)
                .unwrap_or_else(|| hub.state.lock().expect("room lock").current.clone()),
        )
    };
    // A closed room is never granted again: a grant would lose to its row every time (409,
    // "retry", for as long as another process still held members it had not closed yet). Its
    // closing assignment is the answer, whoever `to` names.
    if row.as_ref().is_some_and(|r| r.closed) {
        return current(row);
    }
    let cur_session = row.as_ref().and_then(|r| r.session.clone());
    let next = match &body.to {
        Some(to) => hostlease::core::elect(hub.members().iter().filter(|m| &m.id == to))
            .map(|m| (m.id.clone(), m.session.clone())),
        None => hub.next_holder(cur_session.as_ref()),
    };
    if body.to.is_some() && next.is_none() {
        return (
            StatusCode::NOT_FOUND,
            "participant not connected or may not host",
        )
            .into_response();
    }
    if let Some(r) = row.as_ref().filter(|r| {
        r.lease_live()
            && next
                .as_ref()
                .is_some_and(|(p, s)| r.host.as_ref() == Some(p) && r.session.as_ref() == Some(s))
    }) {
        // To the session that holds the role on a live lease: not a grant. (It was one, fenced
        // against the holder itself: the host lost its authority until its own lease ran out.)
        if let Some(current) = r.current.clone() {
            return json_body(&current);
        }
    }
    if next.is_none() && row.as_ref().is_none_or(|r| r.host.is_none()) {
        // Hostless -> hostless is not a grant: the epoch stays.
        return current(row);
    }
    let epoch = row
        .as_ref()
        .map_or(hostlease::protocol::Epoch::ZERO, |r| r.epoch);
    let req = app.grant_req(hub, epoch, next, Reason::Admin, false);
    let res = app.grant(req, row.as_ref(), &correlation_id()).await;
    match res {
        Ok(Some(a)) => json_body(&a),
        Ok(None) => (StatusCode::CONFLICT, "another commit won; retry").into_response(),
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "storage unavailable").into_response(),
    }
}

/// `POST /v1/admin/rooms/{room}/kick {"participant": p}`: closes its sessions; a kicked host is
/// replaced at once (reason `kicked`).
async fn admin_kick(
    State(app): State<Arc<App>>,
    Path(room): Path<String>,
    body: Bytes,
) -> Response {
    let Ok(KickBody { participant: p }) = serde_json::from_slice(&body) else {
        return (StatusCode::BAD_REQUEST, "participant required").into_response();
    };
    let hub = match admin_room(&app, &room).await {
        Ok(h) => h,
        Err(e) => return e,
    };
    let Ok(kicked) = app.kick(hub.hub(), &p).await else {
        return (StatusCode::SERVICE_UNAVAILABLE, "could not kick").into_response();
    };
    drop(hub);
    (
        StatusCode::OK,
        Json(serde_json::json!({ "kicked": kicked })),
    )
        .into_response()
}

/// `ttl`'s body: `lease_ms` must be there (`null` for the server default) and nothing else: a
/// misspelt field would otherwise set the room back to the default, answered 200.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TtlBody {
    #[serde(deserialize_with = "Option::deserialize")]
    lease_ms: Option<u64>,
}

/// `POST /v1/admin/rooms/{room}/ttl {"lease_ms": n | null}`: the room's lease TTL, from the next
/// grant or renewal on (`null`: back to the server default); within [`crate::LEASE_MS`].
async fn admin_ttl(State(app): State<Arc<App>>, Path(room): Path<String>, body: Bytes) -> Response {
    // Parsed after the key check (an extractor would parse it before the handler runs).
    let Ok(body) = serde_json::from_slice::<TtlBody>(&body) else {
        return (StatusCode::BAD_REQUEST, "bad body").into_response();
    };
    let room = match room_id(&room) {
        Ok(r) => r,
        Err(e) => return e,
    };
    if body.lease_ms.is_some_and(|t| !crate::LEASE_MS.contains(&t)) {
        let why = format!("lease_ms must be within {:?}", crate::LEASE_MS);
        return (StatusCode::BAD_REQUEST, why).into_response();
    }
    match app.store.set_ttl(&room, body.lease_ms).await {
        Ok(()) => (
            StatusCode::OK,
            Json(serde_json::json!({"lease_ms": body.lease_ms})),
        )
            .into_response(),
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "storage unavailable").into_response(),
    }
}

/// `POST /v1/admin/rooms/{room}/close`: a hostless grant (reason `closed`); every session is
/// closed and new joins are refused.
async fn admin_close(State(app): State<Arc<App>>, Path(room): Path<String>) -> Response {
    let hub = match admin_room(&app, &room).await {
        Ok(h) => h,
        Err(e) => return e,
    };
    let g = hub.decide.lock().await;
    let mut res = Ok(None);
    // A hostless room's close is no grant: its answer is the stored assignment it closed at
    // (this process's copy may not have the newest yet: one committed through another process
    // is published here on its next poll).
    let mut closed_without_grant = None;
    for _ in 0..5 {
        let row = match app.store.room(&hub.id).await {
            Ok(r) => r,
            Err(_) => break,
        };
        if row.as_ref().is_none_or(|r| r.host.is_none()) {
            // Already hostless: closing is not a grant, the epoch stays.
            let epoch = row
                .as_ref()
                .map_or(hostlease::protocol::Epoch::ZERO, |r| r.epoch);
            match app.store.close_hostless(&hub.id, epoch).await {
                Ok(true) => {
                    // (No row: a room never granted, its genesis assignment.)
                    closed_without_grant =
                        Some(row.and_then(|r| r.current).unwrap_or_else(|| {
                            hub.state.lock().expect("room lock").current.clone()
                        }));
                    break;
                }
                Ok(false) => continue,
                Err(_) => break,
            }
        }
        let req = GrantReq {
            close: true,
            ..app.grant_req(
                &hub,
                row.as_ref()
                    .map_or(hostlease::protocol::Epoch::ZERO, |r| r.epoch),
                None,
                Reason::Closed,
                false,
            )
        };
        res = app.grant(req, row.as_ref(), &correlation_id()).await;
        if !matches!(res, Ok(None)) {
            break;
        }
    }
    drop(g);
    // Once the close is committed, the sessions here are closed after the closing assignment
    // went out to them, in a task of its own (an admin client that goes away mid-way cannot
    // leave them open). A close that did not commit leaves the room as it was.
    let seq = match &res {
        Ok(Some(a)) => Some(a.assignment.seq),
        _ if closed_without_grant.is_some() => Some(hostlease::protocol::Seq::ZERO),
        _ => None,
    };
    if let Some(seq) = seq {
        let bound = std::time::Duration::from_millis(app.cfg.sweep_ms.clamp(50, 1000) * 4);
        let (app, hub) = (app.clone(), hub.hub().clone());
        let _ = tokio::spawn(async move { app.close_here(&hub, seq, bound).await }).await;
    }
    match (res, closed_without_grant) {
        (Ok(Some(a)), _) => json_body(&a),
        (_, Some(stored)) => json_body(&stored),
        _ => (StatusCode::SERVICE_UNAVAILABLE, "could not close").into_response(),
    }
}

#[derive(Deserialize)]
struct DevTokenReq {
    room: RoomId,
    participant: ParticipantId,
    #[serde(default)]
    name: String,
    #[serde(default = "yes")]
    may_host: bool,
    #[serde(default)]
    ttl_ms: Option<u64>,
}
fn yes() -> bool {
    true
}

/// The longest a dev join token lives (a larger `ttl_ms` overflowed the expiry: a panic).
const MAX_DEV_TTL_MS: u64 = 30 * 24 * 3_600_000;

/// `--dev` only: mints a join token with the dev app key (for the demo).
async fn dev_token(State(app): State<Arc<App>>, body: Bytes) -> Response {
    let Some(k) = &app.dev_app_key else {
        return (StatusCode::NOT_FOUND, "no dev key").into_response();
    };
    let Ok(req) = serde_json::from_slice::<DevTokenReq>(&body) else {
        return (
            StatusCode::BAD_REQUEST,
            "expected {\"room\", \"participant\", \"name\"?, \"may_host\"?, \"ttl_ms\"?}",
        )
            .into_response();
    };
    let ttl_ms = req.ttl_ms.unwrap_or(3_600_000);
    if !(1..=MAX_DEV_TTL_MS).contains(&ttl_ms) {
        return (StatusCode::BAD_REQUEST, "ttl_ms: 1 to 30 days").into_response();
    }
    let claims = JoinClaims {
        room: req.room,
        sub: req.participant,
        name: Member::clamp_name(&req.name).to_string(),
        may_host: req.may_host,
        exp: crate::tokens::now_ms() + ttl_ms,
        kid: k.kid.clone(),
    };
    Json(serde_json::json!({ "token": k.sign_token(JOIN_PREFIX, &claims) })).into_response()
}

/// A protocol value as an `application/json` response (written by the protocol's own encoder,
/// the one the SDK reads with).
fn json_body<T: ToJson + ?Sized>(value: &T) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        encode_body(value),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::Limiter;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ipv6_clients_of_one_64_share_a_bucket() {
        assert_eq!(client_key(ip("2001:db8:1:2:aaaa::1")), ip("2001:db8:1:2::"));
        assert_eq!(client_key(ip("::ffff:192.0.2.7")), ip("192.0.2.7"));
        assert_eq!(client_key(ip("192.0.2.7")), ip("192.0.2.7"));
        let l = Limiter::new(1e-9, 2.0);
        let check = |a: &str| l.admit(client_key(ip(a)));
        assert!(check("2001:db8::1").is_ok());
        assert!(check("2001:db8::2:3").is_ok());
        // The /64's burst is spent, whatever interface identifier comes next.
        assert!(check("2001:db8::ffff:1").is_err());
        // Another /64 has its own.
        assert!(check("2001:db8:0:1::1").is_ok());
    }
}
