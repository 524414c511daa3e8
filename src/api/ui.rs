//! The ad-ops page at `/ui` (docs/service.md, "The ad-ops page"): static
//! files embedded in the binary, drawing `GET /v1/campaigns` and
//! `GET /v1/campaigns/{id}/timeline` with uPlot (vendored from npm in
//! ui/vendor/, MIT). No CDN: the page works where the service does.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::request::ApiPath;
use crate::front::FrontError;

/// The files, by name, with their content type.
const FILES: &[(&str, &str, &str)] = &[
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("../../ui/app.js"),
    ),
    (
        "app.css",
        "text/css; charset=utf-8",
        include_str!("../../ui/app.css"),
    ),
    (
        "uplot.js",
        "text/javascript; charset=utf-8",
        include_str!("../../ui/vendor/uplot-1.6.32/uPlot.iife.min.js"),
    ),
    (
        "uplot.css",
        "text/css; charset=utf-8",
        include_str!("../../ui/vendor/uplot-1.6.32/uPlot.min.css"),
    ),
];

const INDEX: &str = include_str!("../../ui/index.html");

/// The page's own origin only: no inline script, nothing from elsewhere.
const CSP: &str = "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'";

fn file(content_type: &'static str, body: &'static str) -> Response {
    let mut r = (StatusCode::OK, body).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

pub(crate) async fn index() -> Response {
    file("text/html; charset=utf-8", INDEX)
}

pub(crate) async fn asset(ApiPath(name): ApiPath<String>) -> Result<Response, FrontError> {
    FILES
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, t, b)| file(t, b))
        .ok_or_else(|| FrontError::not_found(format!("no file {name:?} in /ui")))
}
