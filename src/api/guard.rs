//! What every request passes before its handler: the `Host` check,
//! authentication, load shedding, and reading the body within its limits.
//! Which token a route needs is decided from the route axum matched and the
//! method, never from the path's text.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::BytesMut;
use http_body_util::BodyExt;

use super::{ROUTES, St};
use crate::clock::Clock;
use crate::front::access::{Access, authorized};
use crate::front::body_budget::{Charge, head_bytes};
use crate::front::shed::{self, InFlight};
use crate::front::{AppState, FrontError, FrontOptions, request_id};
use crate::server::Conn;

/// The access a request needs, from its matched route and method. A path no
/// route matched needs the decision token (its 404 tells nothing to others).
pub fn access(method: &Method, route: Option<&str>) -> Access {
    match route {
        // The page's static files hold no data; what it shows comes from the
        // API, with the decision token when one is set.
        Some("/healthz" | "/readyz" | "/metrics" | "/openapi.json" | "/ui" | "/ui/{file}") => {
            Access::Public
        }
        // Resetting a key and erasing a viewer change state no decision
        // would: an operator's calls.
        Some(
            "/v1/admin/checkpoint"
            | "/v1/policies/{name}/keys/{key}"
            | "/v1/users/{user}"
            | "/v1/ids/{kind}/{ident}",
        ) => Access::Admin,
        Some("/v1/policies/{name}" | "/v1/campaigns/{id}")
            if method != Method::GET && method != Method::HEAD =>
        {
            Access::Admin
        }
        _ => Access::Decision,
    }
}

/// The metrics label of a request: its route template, or `other`.
fn endpoint_label(route: Option<&str>) -> &'static str {
    route
        .and_then(|m| ROUTES.iter().copied().find(|r| *r == m))
        .unwrap_or("other")
}

/// The header a request id comes in and goes out in.
pub const X_REQUEST_ID: header::HeaderName = header::HeaderName::from_static("x-request-id");

/// The caller's `x-request-id` if it is one a log line can carry as it is
/// (1 to 64 visible ASCII characters), else a new one.
fn request_id_of(headers: &axum::http::HeaderMap) -> Arc<str> {
    headers
        .get(&X_REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 64 && v.bytes().all(|b| b.is_ascii_graphic()))
        .map(Arc::from)
        .unwrap_or_else(|| Arc::from(request_id::fresh()))
}

/// The middleware: runs [`guarded`] under the request's id (every log line
/// of the request carries it, and the answer's `x-request-id` says it) and
/// counts the answer.
pub async fn guard<C: Clock + 'static>(State(s): St<C>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let route = req.extensions().get::<MatchedPath>().map(|m| m.as_str());
    let endpoint = endpoint_label(route);
    // `other` (no route matched) needs the decision token, as any unknown route.
    let access = match access(req.method(), Some(endpoint)) {
        // Per-definition series name campaigns, budgets and spend: the data
        // `/v1/campaigns/{id}/delivery` gives only with a token.
        Access::Public if endpoint == "/metrics" && s.options.per_definition_metrics() => {
            Access::Decision
        }
        a => a,
    };
    let id = request_id_of(req.headers());
    let method = req.method().clone();
    let work = match endpoint {
        "/v1/reservations/{id}/commit" | "/v1/reservations/{id}/release" => shed::Work::Settle,
        _ => shed::Work::Decide,
    };
    let mut response = request_id::scope(id.clone(), guarded(&s, access, work, req, next)).await;
    let status = response.status().as_u16();
    let elapsed = started.elapsed();
    s.metrics.request(endpoint, status, elapsed.as_secs_f64());
    // One line per request at debug level (FREQCAP_LOG=freqcap::api=debug):
    // at info, a request writes only what goes wrong.
    tracing::debug!(
        request_id = %id,
        %method,
        endpoint,
        status,
        micros = elapsed.as_micros() as u64,
        "request"
    );
    let headers = response.headers_mut();
    if let Ok(v) = axum::http::HeaderValue::from_str(&id) {
        headers.insert(X_REQUEST_ID, v);
    }
    // No answer is to be sniffed into another type (a 404 under /ui echoes
    // the path it did not find) or framed by another site's page (CSP's
    // frame-ancestors says it to current browsers, this to older ones).
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}

async fn guarded<C: Clock + 'static>(
    s: &AppState<C>,
    access: Access,
    work: shed::Work,
    req: Request,
    next: Next,
) -> Response {
    if let Err(e) = host_allowed(&s.options, &req) {
        return e.into_response();
    }
    let conn = req.extensions().get::<Conn>().cloned();
    if let Some(c) = &conn {
        s.metrics.queue_delay(c.queue_delay().as_secs_f64());
    }
    if access == Access::Public {
        return next.run(req).await;
    }
    // Shed before anything is read ([`shed`]): a probe-only connection,
    // then (after the token) a request that waited too long to be run.
    if let Err(e) = shed::probe_only(&s.metrics, conn.as_ref()) {
        return e.into_response();
    }
    if !authorized(&s.options, access, req.headers()) {
        return FrontError::unauthenticated().into_response();
    }
    let class = shed::claimed(req.headers());
    if let Err(e) = shed::too_busy(&s.shed, &s.options, &s.metrics, conn.as_ref(), class, work) {
        return e.into_response();
    }
    // The body first, under the body memory budget, then the in-flight slot:
    // a request counts in flight once it can be decided. Counted from its
    // head, 17 HTTP/2 connections opening 256 streams each and sending no
    // body held all 4096 slots, and every front answered 503 (security
    // probe, case 1.30).
    let mut charge = s.body_budget.charge();
    if let Err(e) = charge.add(head_bytes(req.headers())) {
        return e.into_response();
    }
    let (req, _charge) = match read_body(s, req, charge).await {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let _slot = match work {
        shed::Work::Settle => {
            InFlight::enter_to_settle(&s.shed, &s.metrics, s.options.max_in_flight)
        }
        shed::Work::Decide => {
            let waited = conn.as_ref().map(Conn::queue_delay).unwrap_or_default();
            match shed::admit(&s.shed, &s.options, &s.metrics, class, waited).await {
                Ok(slot) => slot,
                Err(e) => return e.into_response(),
            }
        }
    };
    let response = next.run(req).await;
    // A handler answers 503 only when the engine refuses a reservation past
    // its cap (max_open_reservations, or half the memory budget).
    if response.status() == axum::http::StatusCode::SERVICE_UNAVAILABLE {
        s.metrics.overloaded("reservations");
    }
    response
}

/// Reads the body of a POST or PUT whole, before the handler runs: over
/// `max_body` by its `Content-Length` is 413 before any byte is read (so an
/// `Expect: 100-continue` client gets no `100 Continue`); a body that is not
/// JSON by its `Content-Type` is 415; a body not in within `body_timeout` is
/// 408 and the connection is closed. Each chunk is charged to the body
/// memory budget as it arrives ([`super::body_budget`]), after the head's
/// bytes; the charge is held until the request is answered.
async fn read_body<C: Clock>(
    s: &AppState<C>,
    req: Request,
    mut charge: Charge,
) -> Result<(Request, Charge), FrontError> {
    let o = &s.options;
    if req.method() != Method::POST && req.method() != Method::PUT {
        return Ok((req, charge));
    }
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > o.max_body as u64) {
        return Err(too_large(o.max_body));
    }
    let json = is_json(req.headers());
    if declared.is_some_and(|n| n > 0) && !json {
        return Err(unsupported_media_type(req.headers()));
    }
    let (parts, mut body) = req.into_parts();
    let mut bytes = BytesMut::new();
    let read = async {
        while let Some(frame) = body.frame().await {
            let frame =
                frame.map_err(|e| FrontError::invalid("", format!("cannot read the body: {e}")))?;
            let Ok(data) = frame.into_data() else {
                continue; // trailers
            };
            if bytes.len() + data.len() > o.max_body {
                return Err(too_large(o.max_body));
            }
            charge.add(data.len())?;
            bytes.extend_from_slice(&data);
        }
        Ok(())
    };
    match tokio::time::timeout(o.body_timeout, read).await {
        Err(_) => return Err(FrontError::request_timeout(o.body_timeout)),
        Ok(Err(e)) => return Err(e),
        Ok(Ok(())) => {}
    }
    if !json && !bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(unsupported_media_type(&parts.headers));
    }
    Ok((
        Request::from_parts(parts, Body::from(bytes.freeze())),
        charge,
    ))
}

fn too_large(max_body: usize) -> FrontError {
    FrontError::too_large(format!(
        "the request body is over the size limit of {max_body} bytes"
    ))
}

/// Whether the request says its body is JSON: `application/json`, with any
/// parameters (`; charset=utf-8`), in any case.
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

fn unsupported_media_type(headers: &HeaderMap) -> FrontError {
    let got = headers
        .get(header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    FrontError::unsupported_media_type(match got {
        Some(t) => format!("Content-Type: bodies must be application/json, got {t:?}"),
        None => "Content-Type: bodies must be application/json; the header is missing".into(),
    })
}

/// The `Host` check against DNS rebinding: a browser's page on another site
/// can reach a loopback service only under a name its own DNS controls, so a
/// service listening on loopback answers only loopback names (and
/// `allowed_hosts`). The name is the `Host` header's and, over HTTP/2 (and
/// HTTP/1's absolute form), the request target's authority: both are
/// checked, and must agree when both are given (a proxy speaking HTTP/2
/// upstream forwards the browser's name as `:authority`; before, only `Host`
/// was read and `:authority: evil.example` was answered). Requests without
/// either (HTTP/1.0 tools) pass: browsers always send one.
fn host_allowed(o: &FrontOptions, req: &Request) -> Result<(), FrontError> {
    let Some(allowed) = &o.allowed_hosts else {
        return Ok(());
    };
    // Two `Host` fields are a bad request (RFC 9112 §3.2): which one a
    // proxy in front read is anyone's guess.
    if req.headers().get_all(header::HOST).iter().nth(1).is_some() {
        return Err(FrontError::forbidden(
            "a request has one Host field, not several",
        ));
    }
    let host = req.headers().get(header::HOST);
    let authority = req
        .uri()
        .authority()
        .and_then(|a| HeaderValue::from_str(a.as_str()).ok());
    let refuse = |v: &HeaderValue, what: &str| {
        FrontError::forbidden(format!(
            "{what}: {:?} is not a name this service answers to (loopback names, or allowed_hosts)",
            crate::front::error::bounded(&String::from_utf8_lossy(v.as_bytes()))
        ))
    };
    let ok = |v: &HeaderValue| {
        host_name(v).as_deref().is_some_and(|n| {
            is_loopback_name(n) || allowed.iter().any(|a| a.eq_ignore_ascii_case(n))
        })
    };
    if let Some(h) = host
        && !ok(h)
    {
        return Err(refuse(h, "Host"));
    }
    if let Some(a) = &authority {
        if !ok(a) {
            return Err(refuse(a, ":authority"));
        }
        if host.is_some_and(|h| host_name(h) != host_name(a)) {
            return Err(FrontError::forbidden(
                "Host and :authority name different hosts; a request has one",
            ));
        }
    }
    Ok(())
}

/// The name of a `Host` value, without its port; `None` if unreadable.
fn host_name(v: &HeaderValue) -> Option<String> {
    let s = v.to_str().ok()?.trim();
    let name = if let Some(rest) = s.strip_prefix('[') {
        // [::1]:8080
        rest.split(']').next()?
    } else {
        s.rsplit_once(':').map_or(s, |(n, port)| {
            if port.bytes().all(|b| b.is_ascii_digit()) {
                n
            } else {
                s
            }
        })
    };
    Some(name.trim_end_matches('.').to_ascii_lowercase())
}

fn is_loopback_name(n: &str) -> bool {
    n == "localhost"
        || n.ends_with(".localhost")
        || n.parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The time a request may take to send its body.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_without_ports() {
        let n = |s: &'static str| host_name(&HeaderValue::from_static(s));
        assert_eq!(n("localhost:8080").as_deref(), Some("localhost"));
        assert_eq!(n("[::1]:80").as_deref(), Some("::1"));
        assert_eq!(n("127.0.0.1").as_deref(), Some("127.0.0.1"));
        assert_eq!(n("Evil.Example.:80").as_deref(), Some("evil.example"));
        assert!(is_loopback_name("127.3.2.1"));
        assert!(is_loopback_name("app.localhost"));
        assert!(!is_loopback_name("localhost.evil.example"));
        assert!(!is_loopback_name("10.0.0.1"));
    }

    /// Every route and method, by the table of who may call it.
    #[test]
    fn access_is_decided_by_route_and_method() {
        use Access::*;
        for (route, method, want) in [
            ("/v1/policies/{name}", Method::GET, Decision),
            ("/v1/policies/{name}", Method::PUT, Admin),
            ("/v1/policies/{name}", Method::DELETE, Admin),
            ("/v1/campaigns/{id}", Method::GET, Decision),
            ("/v1/campaigns/{id}", Method::PUT, Admin),
            ("/v1/campaigns/{id}", Method::DELETE, Admin),
            ("/v1/campaigns/{id}/delivery", Method::GET, Decision),
            ("/v1/campaigns/{id}/delivery", Method::PUT, Decision),
            ("/v1/admin/checkpoint", Method::POST, Admin),
            ("/v1/policies/{name}/keys/{key}", Method::DELETE, Admin),
            ("/v1/users/{user}", Method::DELETE, Admin),
            ("/v1/ids/{kind}/{ident}", Method::DELETE, Admin),
            ("/v1/check", Method::POST, Decision),
            ("/healthz", Method::GET, Public),
            ("/metrics", Method::GET, Public),
        ] {
            assert_eq!(access(&method, Some(route)), want, "{method} {route}");
        }
        assert_eq!(access(&Method::PUT, None), Decision);
    }
}
