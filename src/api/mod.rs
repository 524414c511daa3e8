//! Where HTTP enters (docs/semantics.md §8): the axum router, request and response
//! bodies, authentication and load shedding. Handlers translate JSON to engine
//! calls and back; every decision is the engine's.

mod admin;
mod check;
mod definitions;
mod erase;
pub mod error;
mod events;
pub mod forecast;
pub mod guard;
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
use axum::routing::{MethodRouter, delete, get, post, put};

use crate::clock::Clock;
use crate::engine::Engine;
use crate::model::{CampaignDef, PolicyDef};
// The body types, for the OpenAPI document (`openapi.rs` reads them through
// `super::*`).
#[allow(unused_imports)]
use {
    admin::*, check::*, definitions::*, erase::*, events::*, forecast::*, request::*, screen::*,
    settle::*, timeline::*, usage::*,
};

// The shared state and options, under the names the library's users (the
// tests, replay, embedders) build a router with.
pub use crate::front::{AppState, FrontOptions as ApiOptions, app_state};
use crate::front::{FrontError, FrontOptions};

/// Every route, as its template: what the router serves (each through
/// [`endpoint`]), the `endpoint` label of the metrics (a fixed set, so
/// clients cannot grow the number of series) and the paths of the OpenAPI
/// document.
pub const ROUTES: &[&str] = &[
    "/v1/policies/{name}",
    "/v1/policies/{name}/keys/{key}",
    "/v1/check",
    "/v1/reservations/{id}/commit",
    "/v1/reservations/{id}/release",
    "/v1/campaigns/{id}",
    "/v1/campaigns",
    "/v1/campaigns/{id}/delivery",
    "/v1/campaigns/{id}/timeline",
    "/v1/screen",
    "/v1/events",
    "/v1/users/{user}",
    "/v1/users/{user}/campaigns/{id}",
    "/v1/ids/{kind}/{ident}",
    "/v1/ids/{kind}/{ident}/campaigns/{id}",
    "/v1/forecast",
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
    guard::access(&Method::GET, Some(route)) == crate::front::Access::Public
}

type St<C> = State<Arc<AppState<C>>>;

/// The handlers of one route of [`ROUTES`], by method.
fn endpoint<C: Clock + 'static>(route: &str) -> Option<MethodRouter<Arc<AppState<C>>>> {
    Some(match route {
        "/v1/policies/{name}" => put(put_def::<C, PolicyDef>)
            .get(get_def::<C, PolicyDef>)
            .delete(delete_def::<C, PolicyDef>),
        "/v1/policies/{name}/keys/{key}" => delete(reset_key::<C>),
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
        "/v1/users/{user}" => delete(erase_user::<C>),
        "/v1/users/{user}/campaigns/{id}" => get(usage::<C>),
        "/v1/ids/{kind}/{ident}" => delete(erase_identity::<C>),
        "/v1/ids/{kind}/{ident}/campaigns/{id}" => get(identity_usage::<C>),
        "/v1/forecast" => post(forecast_endpoint),
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
pub fn router<C: Clock + 'static>(engine: Arc<Engine<C>>, options: FrontOptions) -> Router {
    router_for(app_state(engine, options))
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
    let app = app
        .fallback(|| async { FrontError::not_found("no such endpoint") })
        .method_not_allowed_fallback(|| async { FrontError::method_not_allowed() })
        .layer(middleware::from_fn_with_state(
            state.clone(),
            guard::guard::<C>,
        ))
        // axum's own limit would answer 413 in plain text; the handlers read
        // the body themselves and answer in the error shape (see `body`).
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(state);
    // Outermost: the request's span covers its guard too.
    crate::front::trace::layer(app)
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
