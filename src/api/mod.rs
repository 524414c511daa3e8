//! Where HTTP enters (docs/semantics.md §8): the axum router, request and response
//! bodies, authentication and load shedding. Handlers translate JSON to engine
//! calls and back; every decision is the engine's.

mod admin;
pub mod body_budget;
mod check;
mod definitions;
pub mod error;
mod events;
pub mod forward;
pub mod guard;
pub mod headers;
pub mod metrics;
pub mod openapi;
pub(crate) mod request;
mod screen;
mod settle;
mod timeline;
mod ui;
mod usage;

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{Method, StatusCode};
use axum::middleware;
use axum::routing::{MethodRouter, get, post, put};

use crate::clock::Clock;
use crate::engine::Engine;
use crate::model::{CampaignDef, PolicyDef};
// The body types, for the OpenAPI document (`openapi.rs` reads them through
// `super::*`).
#[allow(unused_imports)]
use {
    admin::*, check::*, definitions::*, events::*, request::*, screen::*, settle::*, timeline::*,
    usage::*,
};

pub use error::ApiError;
pub use metrics::{ConnCounters, Metrics};
pub(crate) use usage::{pacing_of, rfc3339 as usage_rfc3339};

/// Limits and credentials of the HTTP layer.
#[derive(Debug, Clone)]
pub struct ApiOptions {
    /// Largest request body, bytes (larger: 413 `too_large`).
    pub max_body: usize,
    /// Bytes of request bodies being received at once, every front and
    /// connection together (`src/api/body_budget.rs`); past it 503
    /// `overloaded`. At least `max_body`.
    pub body_memory: usize,
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
    /// A request whose connection waited longer than this to be run is
    /// answered 503 `overloaded` at once (`src/api/guard.rs`).
    pub shed_queue_delay: std::time::Duration,
    /// How long a request may take to send its body: past it, 408.
    pub body_timeout: std::time::Duration,
    /// `Some`: only these `Host` names (and loopback ones) are answered
    /// (the service sets it when it listens on loopback); `None`: any.
    pub allowed_hosts: Option<Vec<String>>,
    /// Where `POST /v1/admin/checkpoint` may write; `None`: checkpoints off.
    pub backup_dir: Option<std::path::PathBuf>,
    /// The listener's figures, exported with the others.
    pub connections: ConnCounters,
    /// Campaigns and policies whose own series `/metrics` exports, and how
    /// many of the most active others (docs/service.md, "Per-definition
    /// metrics").
    pub metrics_definitions: Vec<String>,
    pub metrics_top: usize,
}

impl Default for ApiOptions {
    fn default() -> Self {
        ApiOptions {
            max_body: 1 << 20,
            body_memory: DEFAULT_BODY_MEMORY,
            max_in_flight: 4096,
            decision_token: None,
            admin_token: None,
            sleep_on_wait: true,
            shed_queue_delay: std::time::Duration::from_millis(20),
            body_timeout: guard::DEFAULT_BODY_TIMEOUT,
            allowed_hosts: None,
            backup_dir: None,
            connections: ConnCounters::default(),
            metrics_definitions: Vec::new(),
            metrics_top: 0,
        }
    }
}

/// The default of [`ApiOptions::body_memory`]: 64 bodies of the default
/// `max_body` (1 MiB) at once.
pub const DEFAULT_BODY_MEMORY: usize = 64 << 20;

impl ApiOptions {
    /// Whether `/metrics` carries series named by campaigns and policies
    /// (it then needs a token, as their delivery does).
    pub fn per_definition_metrics(&self) -> bool {
        self.metrics_top > 0 || !self.metrics_definitions.is_empty()
    }
}

/// What every handler shares.
pub struct AppState<C: Clock> {
    pub engine: Arc<Engine<C>>,
    pub options: ApiOptions,
    /// Bytes of request bodies being received, every front together.
    pub body_budget: body_budget::BodyBudget,
    /// Request counters, and the in-flight count that load shedding reads.
    pub metrics: Metrics,
    /// Owner mode: requests about users other nodes own go there.
    pub forwarder: forward::Forwarder,
}

/// Every route, as its template: what the router serves (each through
/// [`endpoint`]), the `endpoint` label of the metrics (a fixed set, so
/// clients cannot grow the number of series) and the paths of the OpenAPI
/// document.
pub const ROUTES: &[&str] = &[
    "/v1/policies/{name}",
    "/v1/check",
    "/v1/reservations/{id}/commit",
    "/v1/reservations/{id}/release",
    "/v1/campaigns/{id}",
    "/v1/campaigns",
    "/v1/campaigns/{id}/delivery",
    "/v1/campaigns/{id}/timeline",
    "/v1/screen",
    "/v1/events",
    "/v1/users/{user}/campaigns/{id}",
    "/v1/admin/checkpoint",
    "/metrics",
    "/healthz",
    "/readyz",
    "/openapi.json",
    "/ui",
    "/ui/{file}",
];

/// Whether a route template is open to everyone (probes, scrapes, the API's
/// description); see [`guard::access`].
pub(crate) fn is_public(route: &str) -> bool {
    guard::access(&Method::GET, Some(route)) == guard::Access::Public
}

fn figures<C: Clock + 'static>(
    engine: &Engine<C>,
    allow: &[String],
    top: usize,
) -> metrics::Figures {
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
        hot_hits: engine.hot_hits(),
        hot_misses: get(&st.hot_misses),
        disk_live_bytes: store.disk_bytes,
        rocksdb_memtable_bytes: store.memtable_bytes,
        rocksdb_pending_compaction_bytes: store.pending_compaction_bytes,
        rocksdb_estimated_keys: store.estimated_keys,
        cas: get(&st.cas),
        cas_conflicts: get(&st.cas_conflicts),
        owner_claims: get(&st.owner_claims),
        owner_fenced: get(&st.owner_fenced),
        failed_open: get(&st.failed_open),
        lease_calls: get(&st.lease_calls),
        record_time_capped: get(&st.record_time_capped),
        grants: engine.grants_outstanding().0 as u64,
        grant_units: engine.grants_outstanding().1,
        unsettled: engine.unsettled_reservations() as u64,
        redis: engine.store().redis_stats().map(|r| metrics::RedisFigures {
            calls: get(&r.calls),
            errors: get(&r.errors),
            timeouts: get(&r.timeouts),
            unreplicated: get(&r.unreplicated),
            clock_offset_ns: engine
                .store()
                .shared()
                .and_then(|s| s.clock_offset())
                .unwrap_or(0),
            latency_sum_us: get(&r.latency_us),
            buckets: std::array::from_fn(|i| get(&r.latency_buckets[i])),
        }),
        definitions: engine.definition_figures(allow, top),
    }
}

type St<C> = State<Arc<AppState<C>>>;

/// The handlers of one route of [`ROUTES`], by method.
fn endpoint<C: Clock + 'static>(route: &str) -> Option<MethodRouter<Arc<AppState<C>>>> {
    Some(match route {
        "/v1/policies/{name}" => put(put_def::<C, PolicyDef>)
            .get(get_def::<C, PolicyDef>)
            .delete(delete_def::<C, PolicyDef>),
        "/v1/check" => post(check::<C>),
        "/v1/reservations/{id}/commit" => post(commit::<C>),
        "/v1/reservations/{id}/release" => post(release::<C>),
        "/v1/campaigns/{id}" => put(put_def::<C, CampaignDef>)
            .get(get_def::<C, CampaignDef>)
            .delete(delete_def::<C, CampaignDef>),
        "/v1/campaigns" => get(campaigns::<C>),
        "/v1/campaigns/{id}/delivery" => get(delivery::<C>),
        "/v1/campaigns/{id}/timeline" => get(timeline::<C>),
        "/v1/screen" => post(screen::<C>),
        "/v1/events" => post(events::<C>),
        "/v1/users/{user}/campaigns/{id}" => get(usage::<C>),
        "/v1/admin/checkpoint" => post(checkpoint::<C>),
        "/metrics" => get(metrics_text::<C>),
        "/healthz" => get(|| async { "ok" }),
        "/readyz" => get(readyz::<C>),
        "/openapi.json" => get(openapi_json),
        "/ui" => get(ui::index),
        "/ui/{file}" => get(ui::asset),
        _ => return None,
    })
}

/// `GET /readyz`: 503 while a shared store does not answer, so a load
/// balancer sends the node's traffic elsewhere (docs/cluster.md, "Faults").
async fn readyz<C: Clock + 'static>(State(s): St<C>) -> (StatusCode, &'static str) {
    if s.engine.shared_reachable() {
        (StatusCode::OK, "ready")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: the shared store does not answer",
        )
    }
}

/// The router of docs/semantics.md §8.1 over `engine`.
pub fn router<C: Clock + 'static>(engine: Arc<Engine<C>>, options: ApiOptions) -> Router {
    router_for(app_state(engine, options))
}

/// What every front shares: the engine, the options (tokens, the in-flight
/// cap, load shedding) and the metrics, whose in-flight gauge is the one
/// load-shedding counter of HTTP and RESP alike.
pub fn app_state<C: Clock + 'static>(
    engine: Arc<Engine<C>>,
    options: ApiOptions,
) -> Arc<AppState<C>> {
    let figures_of = engine.clone();
    let (allow, top) = (options.metrics_definitions.clone(), options.metrics_top);
    engine.set_metrics_top(top, allow.len());
    let metrics = Metrics::new(
        metrics::EngineFigures(Box::new(move || figures(&figures_of, &allow, top))),
        &options.connections,
    );
    // Room for one largest body and its head whatever was configured.
    let body_budget = body_budget::BodyBudget::new(
        options.body_memory.max(options.max_body + (128 << 10)),
        metrics.overloaded_counter("body_memory"),
    );
    let forwarder = forward::Forwarder::new(engine.node_id());
    Arc::new(AppState {
        engine,
        forwarder,
        options,
        metrics,
        body_budget,
    })
}

/// The HTTP router over a shared state.
pub fn router_for<C: Clock + 'static>(state: Arc<AppState<C>>) -> Router {
    let max_body = state.options.max_body;
    // The router is built from ROUTES, so the metrics labels and the
    // OpenAPI paths cannot drift from what is served.
    let mut app = Router::new();
    for route in ROUTES {
        if let Some(methods) = endpoint::<C>(route) {
            app = app.route(route, methods);
        }
    }
    app.fallback(|| async { ApiError::not_found("no such endpoint") })
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .layer(middleware::from_fn_with_state(
            state.clone(),
            guard::guard::<C>,
        ))
        // axum's own limit would answer 413 in plain text; the handlers read
        // the body themselves and answer in the error shape (see `body`).
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every route in ROUTES is served.
    #[test]
    fn every_route_has_handlers() {
        for route in ROUTES {
            assert!(
                endpoint::<crate::clock::ManualClock>(route).is_some(),
                "{route}"
            );
        }
    }
}
