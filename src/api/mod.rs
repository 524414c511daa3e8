//! Where HTTP enters (DESIGN §4): the axum router, request and response
//! bodies, authentication and load shedding. Handlers translate JSON to engine
//! calls and back; every decision is the engine's.

pub mod error;
pub mod headers;
pub mod metrics;
pub mod openapi;

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, FromRequestParts, MatchedPath, Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::clock::{Clock, MAX_REPORTED, Nanos, ceil_ms};
use crate::engine::{
    CheckRequest, CheckTarget, CommitRequest, Engine, EngineError, Event, ScreenCandidate,
    ScreenRequest,
};
use crate::model::{CampaignDef, LimitDef, PolicyDef, Warning};
pub use error::ApiError;
pub use metrics::Metrics;

/// Limits and credentials of the HTTP layer.
#[derive(Debug, Clone)]
pub struct ApiOptions {
    /// Largest request body, bytes (larger: 413 `too_large`).
    pub max_body: usize,
    /// Requests handled at once; past it, 503 `overloaded` at once.
    pub max_in_flight: usize,
    /// Bearer token for decisions (check, screen, commit, release, events,
    /// usage); `None`: open.
    pub decision_token: Option<String>,
    /// Bearer token for definitions (policies, campaigns) and admin endpoints;
    /// `None`: open.
    pub admin_token: Option<String>,
    /// Whether `"wait": true` on a delayed check sleeps (replay never does).
    pub sleep_on_wait: bool,
}

impl Default for ApiOptions {
    fn default() -> Self {
        ApiOptions {
            max_body: 1 << 20,
            max_in_flight: 4096,
            decision_token: None,
            admin_token: None,
            sleep_on_wait: true,
        }
    }
}

/// What every handler shares.
pub struct AppState<C: Clock> {
    pub engine: Arc<Engine<C>>,
    pub options: ApiOptions,
    /// Request counters, and the in-flight count that load shedding reads.
    pub metrics: Metrics,
}

/// Every route, as its template: the `endpoint` label of the metrics (a
/// fixed set, so clients cannot grow the number of series) and the paths of
/// the OpenAPI document.
pub const ROUTES: &[&str] = &[
    "/v1/policies/{name}",
    "/v1/check",
    "/v1/reservations/{id}/commit",
    "/v1/reservations/{id}/release",
    "/v1/campaigns/{id}",
    "/v1/campaigns/{id}/delivery",
    "/v1/screen",
    "/v1/events",
    "/v1/users/{user}/campaigns/{id}",
    "/v1/admin/checkpoint",
    "/metrics",
    "/healthz",
    "/readyz",
    "/openapi.json",
];

/// Paths open to everyone even when tokens are set: probes, scrapes and the
/// API's description carry no data of any client.
fn is_public(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz" | "/metrics" | "/openapi.json")
}

/// Endpoints that change definitions or the service take the admin token
/// only; every other endpoint takes the decision token or the admin token
/// (reading a definition is not administering it).
fn is_admin(method: &Method, path: &str) -> bool {
    let definition = path.starts_with("/v1/policies/")
        || (path.starts_with("/v1/campaigns/") && !path.ends_with("/delivery"));
    path.starts_with("/v1/admin/") || (definition && method != Method::GET)
}

fn figures<C: Clock + 'static>(engine: &Engine<C>) -> metrics::Figures {
    let st = &engine.stats;
    let store = engine.store().stats();
    let get = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    metrics::Figures {
        reservations_open: engine.open_reservations() as u64,
        reservations_expired: get(&st.expired),
        commits: get(&st.commits),
        late_commits: get(&st.late_commits),
        releases: get(&st.releases),
        events: get(&st.events),
        duplicate_events: get(&st.duplicate_events),
        writer_queue_depth: store.queue_depth,
        writer_groups: store.groups,
        writer_batches: store.batches,
        hot_records: engine.hot_len() as u64,
        hot_bytes: engine.hot_bytes() as u64,
        hot_hits: get(&st.hot_hits),
        hot_misses: get(&st.hot_misses),
        disk_live_bytes: store.disk_bytes,
        rocksdb_memtable_bytes: store.memtable_bytes,
        rocksdb_pending_compaction_bytes: store.pending_compaction_bytes,
        rocksdb_estimated_keys: store.estimated_keys,
    }
}

type St<C> = State<Arc<AppState<C>>>;

/// The router of DESIGN §4 over `engine`.
pub fn router<C: Clock + 'static>(engine: Arc<Engine<C>>, options: ApiOptions) -> Router {
    let max_body = options.max_body;
    let figures_of = engine.clone();
    let state = Arc::new(AppState {
        engine,
        options,
        metrics: Metrics::new(metrics::EngineFigures(Box::new(move || {
            figures(&figures_of)
        }))),
    });
    Router::new()
        .route(
            "/v1/policies/{name}",
            put(put_def::<C, PolicyDef>)
                .get(get_def::<C, PolicyDef>)
                .delete(delete_def::<C, PolicyDef>),
        )
        .route("/v1/check", post(check::<C>))
        .route("/v1/reservations/{id}/commit", post(commit::<C>))
        .route("/v1/reservations/{id}/release", post(release::<C>))
        .route(
            "/v1/campaigns/{id}",
            put(put_def::<C, CampaignDef>)
                .get(get_def::<C, CampaignDef>)
                .delete(delete_def::<C, CampaignDef>),
        )
        .route("/v1/campaigns/{id}/delivery", get(delivery::<C>))
        .route("/v1/screen", post(screen::<C>))
        .route("/v1/events", post(events::<C>))
        .route("/v1/users/{user}/campaigns/{id}", get(usage::<C>))
        .route("/v1/admin/checkpoint", post(checkpoint::<C>))
        .route("/metrics", get(metrics_text::<C>))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ready" }))
        .route("/openapi.json", get(openapi_json))
        .fallback(|| async { ApiError::not_found("no such endpoint") })
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .layer(middleware::from_fn_with_state(state.clone(), guard::<C>))
        // axum's own limit would answer 413 in plain text; the handlers read
        // the body themselves and answer in the error shape (see `body`).
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(state)
}

/// The metrics label of a request: its route template, or `other` for a path
/// no route matched.
fn endpoint_label(req: &Request) -> &'static str {
    let Some(m) = req.extensions().get::<MatchedPath>() else {
        return "other";
    };
    ROUTES
        .iter()
        .copied()
        .find(|r| *r == m.as_str())
        .unwrap_or("other")
}

/// Load shedding, authentication and request metrics, before any handler runs.
async fn guard<C: Clock + 'static>(State(s): St<C>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let endpoint = endpoint_label(&req);
    let response = guarded(&s, req, next).await;
    s.metrics.request(
        endpoint,
        response.status().as_u16(),
        started.elapsed().as_secs_f64(),
    );
    response
}

async fn guarded<C: Clock + 'static>(s: &AppState<C>, req: Request, next: Next) -> Response {
    if is_public(req.uri().path()) {
        return next.run(req).await;
    }
    if !authorized(&s.options, &req) {
        return ApiError::unauthenticated().into_response();
    }
    // Past the bound, answer at once rather than queue without limit. Probes
    // and scrapes (public) are never shed: they must see an overloaded
    // service to report it.
    let before = s.metrics.in_flight.inc();
    let _slot = InFlight(&s.metrics);
    if usize::try_from(before).unwrap_or(usize::MAX) >= s.options.max_in_flight {
        s.metrics.overloaded();
        return ApiError::overloaded().into_response();
    }
    next.run(req).await
}

/// Whether the request carries the token its endpoint needs (see [`is_admin`]).
fn authorized(o: &ApiOptions, req: &Request) -> bool {
    let admin_ok = o
        .admin_token
        .as_deref()
        .is_some_and(|t| bearer_matches(req.headers(), t));
    if is_admin(req.method(), req.uri().path()) {
        // With no admin token set, the decision token (if any) guards
        // definitions too: setting one token never leaves them open.
        match (&o.admin_token, &o.decision_token) {
            (Some(_), _) => admin_ok,
            (None, Some(t)) => bearer_matches(req.headers(), t),
            (None, None) => true,
        }
    } else {
        admin_ok
            || o.decision_token
                .as_deref()
                .is_none_or(|t| bearer_matches(req.headers(), t))
    }
}

/// Gives back an in-flight slot when the request ends, also when the client
/// goes away and the handler's future is dropped mid-way.
struct InFlight<'a>(&'a Metrics);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.dec();
    }
}

/// Compares the bearer token in constant time (for tokens of the same length;
/// a length mismatch returns early, which reveals only the length).
fn bearer_matches(headers: &HeaderMap, want: &str) -> bool {
    // The scheme name is case-insensitive (RFC 9110 §11.1).
    let Some(got) = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
    else {
        return false;
    };
    let (a, b) = (got.as_bytes(), want.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A JSON response. axum's own `Json` serializes into a `BytesMut` that
/// starts at 128 bytes and grows as it writes; a decision is 200–400 bytes
/// and a screen's answer kilobytes, so this one starts at 512 and writes
/// through a plain `Vec`: `check` served 6 % more requests per second for it
/// (99 k → 105 k, same machine, alternating runs).
struct Json<T>(T);

impl<T: Serialize> IntoResponse for Json<T> {
    fn into_response(self) -> Response {
        let mut buf = Vec::with_capacity(512);
        match serde_json::to_writer(&mut buf, &self.0) {
            Ok(()) => (
                [(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                )],
                buf,
            )
                .into_response(),
            Err(e) => ApiError::internal(format!("cannot write the answer: {e}")).into_response(),
        }
    }
}

/// Reads a JSON body: errors name the field (`candidates[2].cost`); a body
/// over the limit is 413.
fn body<T: DeserializeOwned>(bytes: Result<Bytes, BytesRejection>) -> Result<T, ApiError> {
    let bytes = bytes.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large("the request body is over the size limit")
        } else {
            ApiError::invalid("", e.body_text())
        }
    })?;
    let text =
        std::str::from_utf8(&bytes).map_err(|_| ApiError::invalid("", "body is not UTF-8"))?;
    crate::model::from_json(text).map_err(|e| ApiError::invalid(&e.field, e.message))
}

/// Runs an engine call that may wait on disk off the async executor.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, crate::engine::EngineError> + Send + 'static,
) -> Result<T, ApiError> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(ApiError::from),
        Err(e) => Err(ApiError::internal(format!("request task failed: {e}"))),
    }
}

/// The path parameters, with a rejection (say, `%FF` where a string is
/// expected) answered in the error shape rather than axum's plain text.
struct ApiPath<T>(T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(v)) => Ok(ApiPath(v)),
            Err(e) => Err(ApiError::invalid("path", e.body_text())),
        }
    }
}

/// A path parameter over the id length limit is a 400 naming it, not a 404.
fn id_param<C: Clock>(s: &AppState<C>, field: &str, value: &str) -> Result<(), ApiError> {
    let max = s.engine.options().max_id_len;
    if value.is_empty() || value.len() > max {
        return Err(ApiError::invalid(
            field,
            format!("must be 1 to {max} bytes, got {}", value.len()),
        ));
    }
    Ok(())
}

/// An engine call's result.
type Decided<T> = Result<T, EngineError>;

/// Decides `req` here, on the executor, when `here` can (every record it
/// needs is in memory, the usual case: a hand-off to a blocking thread and
/// back would cost more than the decision); else runs `there` on a blocking
/// thread, where reading a cold record from disk is fine.
async fn in_memory_or_blocking<C: Clock + 'static, Q: Send + 'static, T: Send + 'static>(
    s: &AppState<C>,
    req: Q,
    here: fn(&Engine<C>, &Q) -> Option<Decided<T>>,
    there: fn(&Engine<C>, &Q) -> Decided<T>,
) -> Result<T, ApiError> {
    if let Some(r) = here(&s.engine, &req) {
        return r.map_err(ApiError::from);
    }
    let e = s.engine.clone();
    blocking(move || there(&e, &req)).await
}

/// A reported duration: ms rounded up, saturating (DESIGN §2.6).
fn ms(ns: impl Into<crate::clock::Span>) -> u64 {
    ceil_ms(ns).min(MAX_REPORTED)
}

/// Definition warnings (e.g. a redundant cap) are accepted but logged, so the
/// operator sees them.
fn log_warnings(warnings: &[Warning]) {
    for w in warnings {
        tracing::warn!(field = %w.field, "definition warning: {}", w.message);
    }
}

// ---- definitions: policies and campaigns ----

/// Policies and campaigns are stored, read and deleted alike; one set of
/// handlers serves both.
trait Definition: Serialize + DeserializeOwned + Clone + Send + 'static {
    /// The path parameter naming it, for errors.
    const PARAM: &'static str;
    /// What it is, for "no policy named ..." errors.
    const WHAT: &'static str;
    fn put<C: Clock>(e: &Engine<C>, name: &str, def: Self) -> Result<Vec<Warning>, EngineError>;
    fn get<C: Clock>(e: &Engine<C>, name: &str) -> Option<Self>;
    fn delete<C: Clock>(e: &Engine<C>, name: &str) -> Result<(), EngineError>;
}

impl Definition for PolicyDef {
    const PARAM: &'static str = "name";
    const WHAT: &'static str = "policy";
    fn put<C: Clock>(e: &Engine<C>, name: &str, def: Self) -> Result<Vec<Warning>, EngineError> {
        e.put_policy(name, def)
    }
    fn get<C: Clock>(e: &Engine<C>, name: &str) -> Option<Self> {
        e.get_policy(name)
    }
    fn delete<C: Clock>(e: &Engine<C>, name: &str) -> Result<(), EngineError> {
        e.delete_policy(name)
    }
}

impl Definition for CampaignDef {
    const PARAM: &'static str = "id";
    const WHAT: &'static str = "campaign";
    fn put<C: Clock>(e: &Engine<C>, name: &str, def: Self) -> Result<Vec<Warning>, EngineError> {
        e.put_campaign(name, def)
    }
    fn get<C: Clock>(e: &Engine<C>, name: &str) -> Option<Self> {
        e.get_campaign(name)
    }
    fn delete<C: Clock>(e: &Engine<C>, name: &str) -> Result<(), EngineError> {
        e.delete_campaign(name)
    }
}

/// PUT: answers the stored definition (DESIGN §2.6).
async fn put_def<C: Clock + 'static, D: Definition>(
    State(s): St<C>,
    ApiPath(name): ApiPath<String>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Json<D>, ApiError> {
    id_param(&s, D::PARAM, &name)?;
    let def: D = body(b)?;
    let e = s.engine.clone();
    let stored = def.clone();
    let warnings = blocking(move || D::put(&e, &name, def)).await?;
    log_warnings(&warnings);
    Ok(Json(stored))
}

async fn get_def<C: Clock + 'static, D: Definition>(
    State(s): St<C>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<D>, ApiError> {
    id_param(&s, D::PARAM, &name)?;
    D::get(&s.engine, &name)
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("no {} named {name:?}", D::WHAT)))
}

async fn delete_def<C: Clock + 'static, D: Definition>(
    State(s): St<C>,
    ApiPath(name): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    id_param(&s, D::PARAM, &name)?;
    let e = s.engine.clone();
    blocking(move || D::delete(&e, &name)).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Serialize, JsonSchema)]
/// A campaign's budget now.
struct DeliveryBody {
    campaign: String,
    /// Budget per period.
    amount: u64,
    /// Committed spend this period.
    spent: u64,
    /// Spend held by open reservations.
    pending: u64,
    /// What pacing allows to be spent (plus pending) by now.
    cap_now: u64,
    /// `asap`, `even` or `{"profile": [...]}`.
    pacing: serde_json::Value,
    /// RFC 3339.
    period_start: String,
    /// RFC 3339.
    period_end: String,
}

fn rfc3339(ns: Nanos) -> String {
    jiff::Timestamp::from_nanosecond(i128::from(ns))
        .map(|t| t.to_string())
        .unwrap_or_default()
}

async fn delivery<C: Clock + 'static>(
    State(s): St<C>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<DeliveryBody>, ApiError> {
    id_param(&s, "id", &id)?;
    let e = s.engine.clone();
    let name = id.clone();
    let d = blocking(move || e.delivery(&name)).await?;
    let pacing = s
        .engine
        .get_campaign(&id)
        .and_then(|c| c.budget)
        .and_then(|b| match b.0 {
            LimitDef::Budget(b) => b
                .pacing
                .map(|p| serde_json::to_value(p).unwrap_or_default()),
            _ => None,
        })
        .unwrap_or_else(|| "even".into());
    Ok(Json(DeliveryBody {
        campaign: d.campaign,
        amount: d.amount,
        spent: d.spent,
        pending: d.pending,
        cap_now: d.cap_now,
        pacing,
        period_start: rfc3339(d.period_start),
        period_end: rfc3339(d.period_end),
    }))
}

// ---- check ----

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
/// `POST /v1/check`: give exactly one of `policy` and `limits`.
struct CheckBody {
    /// The name of a policy defined with `PUT /v1/policies/{name}`.
    #[serde(default)]
    policy: Option<String>,
    /// Inline limit items (state kept per key and item index, apart from
    /// named policies).
    #[serde(default)]
    limits: Option<Vec<LimitDef>>,
    /// The subject limited (a client, an API key, ...); at most 256 bytes.
    key: String,
    /// Units to debit, 0 ≤ cost < 2^53; 0 peeks (always allowed, debits nothing).
    #[serde(default = "one")]
    #[schemars(range(max = 9007199254740991u64))]
    cost: u64,
    /// Hold the debit as pending until commit, release or the deadline.
    #[serde(default)]
    reserve: bool,
    /// The reservation's lifetime, 1..=3 600 000 ms (default 60 000).
    #[serde(default)]
    #[schemars(range(min = 1, max = 3_600_000))]
    ttl_ms: Option<u64>,
    /// The caller's id for the reservation (1–128 of `A-Z a-z 0-9 . _ : -`);
    /// repeating a reserve with a live id and the same body returns the first answer.
    #[serde(default)]
    reservation_id: Option<String>,
    /// With a policy whose `on_limit` is `delay`: sleep `delay_ms` before answering.
    #[serde(default)]
    wait: bool,
}

fn one() -> u64 {
    1
}

#[derive(Serialize, JsonSchema)]
/// One limit item's figures, in definition order.
struct ItemBody<'a> {
    /// The item's name, or `<kind>-<index>`.
    name: &'a str,
    /// `rate`, `gap`, `window`, `budget` or `concurrency`.
    kind: &'static str,
    /// burst (rate), 1 (gap), limit (window), amount (budget), max (concurrency).
    limit: u64,
    /// Units that could pass now, after this decision.
    remaining: u64,
    /// Until the item is back to full capacity if nothing else happens; 0 when full.
    reset_after_ms: u64,
    /// When denying: the earliest time the same request could pass; null if
    /// it allows, or if it never can (cost over the burst or limit).
    retry_after_ms: Option<u64>,
    allowed: bool,
}

#[derive(Serialize, JsonSchema)]
/// A decision: allowed only if every item allows; then every item is debited.
struct DecisionBody<'a> {
    allowed: bool,
    /// In delay mode, how long the caller should wait before acting (0 otherwise).
    delay_ms: u64,
    /// Max over denying items; null when allowed or when some item never allows.
    retry_after_ms: Option<u64>,
    /// Min over items.
    remaining: u64,
    /// That of the item with the least remaining (ties to the larger).
    reset_after_ms: u64,
    /// The reservation id when `reserve` held something; null otherwise.
    reservation: Option<String>,
    limits: Vec<ItemBody<'a>>,
}

async fn check<C: Clock + 'static>(
    State(s): St<C>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let b: CheckBody = body(b)?;
    let target = match (b.policy, b.limits) {
        (Some(p), None) => CheckTarget::Policy(p),
        (None, Some(l)) => CheckTarget::Inline(l),
        _ => {
            return Err(ApiError::invalid(
                "policy",
                "give exactly one of \"policy\" (a name) and \"limits\" (inline items)",
            ));
        }
    };
    let req = CheckRequest {
        target,
        key: b.key,
        cost: b.cost,
        reserve: b.reserve,
        ttl_ms: b.ttl_ms,
        reservation_id: b.reservation_id,
    };
    let out = in_memory_or_blocking(&s, req, Engine::check_in_memory, Engine::check).await?;
    let d = &out.decision;
    let items = d
        .items
        .iter()
        .enumerate()
        .map(|(i, f)| ItemBody {
            name: out.stack.name(i),
            kind: out.stack.items()[i].kind().as_str(),
            limit: f.limit,
            remaining: f.remaining.min(MAX_REPORTED),
            reset_after_ms: ms(f.reset_after),
            retry_after_ms: f.retry_after.map(ms),
            allowed: f.allowed,
        })
        .collect();
    let body = DecisionBody {
        allowed: d.allowed,
        delay_ms: ms(d.delay),
        retry_after_ms: if d.allowed {
            None
        } else {
            d.retry_after.map(ms)
        },
        remaining: d.remaining.min(MAX_REPORTED),
        reset_after_ms: ms(d.reset_after),
        reservation: out.reservation.clone(),
        limits: items,
    };
    let outcome = match (d.allowed, d.delay > 0) {
        (false, _) => "denied",
        (true, true) => "delayed",
        (true, false) => "allowed",
    };
    s.metrics.decisions("/v1/check", outcome, 1);
    if b.wait && d.delay > 0 && s.options.sleep_on_wait {
        tokio::time::sleep(std::time::Duration::from_nanos(d.delay)).await;
    }
    let status = if d.allowed {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    };
    let mut r = (status, Json(body)).into_response();
    headers::add(r.headers_mut(), &out.stack, d);
    Ok(r)
}

// ---- screen ----

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
/// A candidate campaign of a screen.
struct CandidateBody {
    campaign: String,
    /// Budget units this impression would cost (default 1); caps count 1.
    #[serde(default)]
    #[schemars(range(max = 9007199254740991u64))]
    cost: Option<u64>,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
/// `POST /v1/screen`.
struct ScreenBody {
    /// The user; without one, campaigns with `unknown_user: "deny"` (the
    /// default) are ineligible.
    #[serde(default)]
    user: Option<String>,
    /// Decided in order, each all-or-nothing over its chain (1 to 10 000 by default).
    candidates: Vec<CandidateBody>,
    /// Hold every eligible candidate under one reservation (default true);
    /// false is a dry run.
    #[serde(default = "yes")]
    reserve: bool,
    /// The reservation's lifetime, 1..=3 600 000 ms (default 60 000).
    #[serde(default)]
    #[schemars(range(min = 1, max = 3_600_000))]
    ttl_ms: Option<u64>,
    /// The caller's id for the reservation, e.g. its auction id.
    #[serde(default)]
    reservation_id: Option<String>,
}

fn yes() -> bool {
    true
}

#[derive(Serialize, JsonSchema)]
/// The first cap in chain order that denied a candidate.
struct DeniedBody {
    /// The campaign in the chain that owns the cap.
    campaign: Arc<str>,
    /// The cap's name, or `budget`, `max_in_flight`, `unknown_user`, `unknown_campaign`.
    cap: String,
    retry_after_ms: Option<u64>,
}

#[derive(Serialize, JsonSchema)]
struct ResultBody {
    campaign: Arc<str>,
    eligible: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    denied_by: Option<DeniedBody>,
}

#[derive(Serialize, JsonSchema)]
/// The screen's answer: one result per candidate, in order.
struct ScreenAnswer {
    /// The reservation holding every eligible candidate; null on a dry run or
    /// when none is eligible.
    reservation: Option<String>,
    results: Vec<ResultBody>,
}

async fn screen<C: Clock + 'static>(
    State(s): St<C>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Json<ScreenAnswer>, ApiError> {
    let b: ScreenBody = body(b)?;
    let req = ScreenRequest {
        user: b.user,
        candidates: b
            .candidates
            .into_iter()
            .map(|c| ScreenCandidate {
                campaign: c.campaign,
                cost: c.cost,
            })
            .collect(),
        reserve: b.reserve,
        ttl_ms: b.ttl_ms,
        reservation_id: b.reservation_id,
    };
    let out = in_memory_or_blocking(&s, req, Engine::screen_in_memory, Engine::screen).await?;
    let eligible = out.results.iter().filter(|r| r.eligible).count() as u64;
    s.metrics.decisions("/v1/screen", "eligible", eligible);
    s.metrics.decisions(
        "/v1/screen",
        "ineligible",
        out.results.len() as u64 - eligible,
    );
    Ok(Json(ScreenAnswer {
        reservation: out.reservation,
        results: out
            .results
            .into_iter()
            .map(|r| ResultBody {
                campaign: r.campaign,
                eligible: r.eligible,
                denied_by: r.denied_by.map(|d| DeniedBody {
                    campaign: d.campaign,
                    cap: d.cap,
                    retry_after_ms: d.retry_after.map(ms),
                }),
            })
            .collect(),
    }))
}

// ---- commit / release ----

/// `campaign`: one name or a list.
#[derive(Deserialize, JsonSchema)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize, Default, JsonSchema)]
#[serde(deny_unknown_fields)]
/// `POST /v1/reservations/{id}/commit`; the body may be empty.
struct CommitBody {
    /// A screen's winner(s): committed, the other candidates released. Omitted:
    /// every eligible candidate is committed.
    #[serde(default)]
    campaign: Option<OneOrMany>,
    /// The final cost (e.g. the clearing price): lower returns the difference,
    /// higher is charged anyway.
    #[serde(default)]
    #[schemars(range(max = 9007199254740991u64))]
    cost: Option<u64>,
    /// Makes a late commit idempotent within the dedupe horizon.
    #[serde(default)]
    event_id: Option<String>,
    /// With `campaign` and `cost`, an unknown or expired reservation is
    /// counted as a late commit.
    #[serde(default)]
    user: Option<String>,
}

#[derive(Serialize, JsonSchema)]
/// The outcome of a commit or release.
struct SettledBody {
    reservation: String,
    /// `committed`, `released` or `late_commit`.
    outcome: &'static str,
    /// The campaigns committed (or released).
    campaigns: Vec<Arc<str>>,
}

impl From<crate::engine::CommitOutcome> for SettledBody {
    fn from(o: crate::engine::CommitOutcome) -> Self {
        SettledBody {
            reservation: o.reservation,
            outcome: o.outcome.as_str(),
            campaigns: o.campaigns,
        }
    }
}

/// An empty body reads as `{}` (commit and release may carry none).
fn optional_body<T: DeserializeOwned + Default>(
    b: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    match &b {
        Ok(bytes) if bytes.iter().all(u8::is_ascii_whitespace) => Ok(T::default()),
        _ => body(b),
    }
}

async fn commit<C: Clock + 'static>(
    State(s): St<C>,
    ApiPath(id): ApiPath<String>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Json<SettledBody>, ApiError> {
    let b: CommitBody = optional_body(b)?;
    let req = CommitRequest {
        campaigns: match b.campaign {
            None => Vec::new(),
            Some(OneOrMany::One(c)) => vec![c],
            Some(OneOrMany::Many(v)) => v,
        },
        cost: b.cost,
        event_id: b.event_id,
        user: b.user,
    };
    // A live reservation is settled here and its writes awaited without
    // parking a thread; a late commit (which may read a cold record) runs on
    // a blocking thread.
    let out = match s.engine.commit_in_memory(&id, &req) {
        Some(pending) => pending?.wait_async().await?,
        None => {
            let e = s.engine.clone();
            blocking(move || e.commit(&id, &req)).await?
        }
    };
    Ok(Json(out.into()))
}

#[derive(Deserialize, Default, JsonSchema)]
#[serde(deny_unknown_fields)]
/// `POST /v1/reservations/{id}/release` takes no fields; the body may be empty.
struct ReleaseBody {}

async fn release<C: Clock + 'static>(
    State(s): St<C>,
    ApiPath(id): ApiPath<String>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Json<SettledBody>, ApiError> {
    let _: ReleaseBody = optional_body(b)?;
    let e = s.engine.clone();
    let out = blocking(move || e.release(&id)).await?;
    Ok(Json(out.into()))
}

// ---- events ----

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
/// An impression that happened without a reservation: counted, not checked.
struct EventBody {
    #[serde(default)]
    user: Option<String>,
    campaign: String,
    /// Budget units (default 1).
    #[serde(default = "one")]
    #[schemars(range(max = 9007199254740991u64))]
    cost: u64,
    /// Counted once within the dedupe horizon (default 24 h).
    #[serde(default)]
    event_id: Option<String>,
}

#[derive(Serialize, JsonSchema)]
struct EventsAnswer {
    /// Events counted now (not duplicates of ones already counted).
    counted: usize,
    /// Events whose `event_id` was already counted within the dedupe horizon.
    duplicates: usize,
}

async fn events<C: Clock + 'static>(
    State(s): St<C>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Json<EventsAnswer>, ApiError> {
    // Read as JSON first: an untagged enum would hide which field is wrong, so
    // each event is read on its own, naming `[i].field`.
    let value: serde_json::Value = body(b)?;
    let list = match value {
        serde_json::Value::Array(v) => v,
        one => vec![one],
    };
    let n = list.len();
    let mut evs = Vec::with_capacity(n);
    for (i, v) in list.into_iter().enumerate() {
        let e: EventBody = serde_path_to_error::deserialize(v).map_err(|e| {
            // serde_path_to_error writes the root as "."; name it as the
            // body ("") or the element ("[i]").
            let path = e.path().to_string();
            let path = if path == "." { "" } else { path.as_str() };
            let field = match (n, path) {
                (1, p) => p.to_owned(),
                (_, "") => format!("[{i}]"),
                (_, p) => format!("[{i}].{p}"),
            };
            ApiError::invalid(&field, e.inner())
        })?;
        evs.push(Event {
            user: e.user,
            campaign: e.campaign,
            cost: e.cost,
            event_id: e.event_id,
        });
    }
    if evs.is_empty() {
        return Err(ApiError::invalid("", "at least one event is needed"));
    }
    // Counted here when every user's record is in memory, and awaited
    // without parking a thread; else on a blocking thread.
    let counted = match s.engine.events_in_memory(&evs) {
        Some(pending) => pending?.wait_async().await?,
        None => {
            let e = s.engine.clone();
            blocking(move || e.events(&evs)).await?
        }
    };
    Ok(Json(EventsAnswer {
        counted,
        duplicates: n - counted,
    }))
}

// ---- usage ----

#[derive(Serialize, JsonSchema)]
/// One cap of the campaign or an ancestor, for the user.
struct CapBody {
    /// The owner of the cap in the chain.
    campaign: String,
    name: String,
    scope: crate::model::Scope,
    kind: &'static str,
    limit: u64,
    used: u64,
    pending: u64,
    remaining: u64,
    reset_after_ms: u64,
}

#[derive(Serialize, JsonSchema)]
/// `GET /v1/users/{user}/campaigns/{id}`: every cap of the campaign and its ancestors.
struct UsageBody {
    user: String,
    campaign: String,
    caps: Vec<CapBody>,
}

async fn usage<C: Clock + 'static>(
    State(s): St<C>,
    ApiPath((user, id)): ApiPath<(String, String)>,
) -> Result<Json<UsageBody>, ApiError> {
    id_param(&s, "user", &user)?;
    id_param(&s, "id", &id)?;
    let e = s.engine.clone();
    let (u, c) = (user.clone(), id.clone());
    let caps = blocking(move || e.user_usage(&u, &c)).await?;
    Ok(Json(UsageBody {
        user,
        campaign: id,
        caps: caps
            .into_iter()
            .map(|c| CapBody {
                campaign: c.campaign,
                name: c.name,
                scope: c.scope,
                kind: c.kind,
                limit: c.limit,
                used: c.used,
                pending: c.pending,
                remaining: c.remaining,
                reset_after_ms: ms(c.reset_after),
            })
            .collect(),
    }))
}

// ---- operations ----

/// `POST /v1/admin/checkpoint`: where to write the copy.
#[derive(Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct CheckpointBody {
    /// A directory that does not exist yet, on the server's file system. On
    /// the data directory's file system the copy is made of hard links, so
    /// it costs little space until the live data is compacted away.
    dir: String,
}

async fn checkpoint<C: Clock + 'static>(
    State(s): St<C>,
    b: Result<Bytes, BytesRejection>,
) -> Result<Json<CheckpointBody>, ApiError> {
    let b: CheckpointBody = body(b)?;
    if b.dir.is_empty() {
        return Err(ApiError::invalid("dir", "must name a directory"));
    }
    let dir = std::path::PathBuf::from(&b.dir);
    if dir.exists() {
        return Err(ApiError::conflict(format!(
            "dir: {:?} already exists; name a new directory",
            b.dir
        )));
    }
    let e = s.engine.clone();
    blocking(move || e.store().checkpoint(&dir).map_err(EngineError::from)).await?;
    tracing::info!(dir = %b.dir, "checkpoint written");
    Ok(Json(b))
}

async fn metrics_text<C: Clock + 'static>(State(s): St<C>) -> Result<Response, ApiError> {
    let text = s
        .metrics
        .render()
        .map_err(|_| ApiError::internal("cannot render the metrics"))?;
    let mut r = text.into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(metrics::CONTENT_TYPE),
    );
    Ok(r)
}

async fn openapi_json() -> Response {
    let mut r = openapi::document_text().into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}
