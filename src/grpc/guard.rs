//! What every gRPC call passes before tonic decodes its message, as HTTP's
//! `src/api/guard.rs`: the connection's probe-only mark, the token (the one
//! access rule of every front, `front::access::authorized`), shedding on
//! queueing delay, the call's deadline, and the body handed to tonic whole
//! messages at a time under the body memory budget ([`super::frames`]).
//!
//! Checked here, on the headers, a call without the token is refused before
//! one byte of its message is buffered: checked in the handler, after tonic
//! had buffered the declared message, 256 unauthenticated streams held
//! 300 MB (security probe, case 1.20).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::clock::Clock;
use crate::front::access::{Access, authorized};
use crate::front::shed;
use crate::front::{AppState, FrontError};
use crate::server::Conn;

/// The access a call needs, from its path (`/package.Service/Method`).
pub fn access(path: &str) -> Access {
    let (service, method) = path
        .trim_start_matches('/')
        .split_once('/')
        .unwrap_or((path, ""));
    match service {
        // As /healthz: a probe must reach an overloaded or misconfigured
        // service. Reflection serves the .proto's descriptors, no data.
        "grpc.health.v1.Health" | "grpc.reflection.v1.ServerReflection" => Access::Public,
        "freqcap.v1.Admin" if !method.starts_with("Get") => Access::Admin,
        _ => Access::Decision,
    }
}

/// What a call does, for shedding: `Commit` and `Release` settle and are
/// never shed ([`shed::Work`]).
fn work(path: &str) -> shed::Work {
    match path {
        "/freqcap.v1.Freqcap/Commit" | "/freqcap.v1.Freqcap/Release" => shed::Work::Settle,
        _ => shed::Work::Decide,
    }
}

/// The middleware (see the module's comment).
pub async fn guard<C: Clock + 'static>(
    State(s): State<Arc<AppState<C>>>,
    req: Request,
    next: Next,
) -> Response {
    let access = access(req.uri().path());
    let conn = req.extensions().get::<Conn>().cloned();
    if access != Access::Public {
        // As HTTP's ([`shed`]): a probe-only connection, the token, then a
        // call that waited past the bound to be run, before its message is
        // read.
        if let Some(c) = &conn {
            s.metrics.queue_delay(c.queue_delay().as_secs_f64());
        }
        if let Err(e) = shed::probe_only(&s.metrics, conn.as_ref()) {
            return refuse(e);
        }
        if !authorized(&s.options, access, req.headers()) {
            return refuse(FrontError::unauthenticated());
        }
        let class = shed::claimed(req.headers());
        let work = work(req.uri().path());
        if let Err(e) = shed::too_busy(&s.shed, &s.options, &s.metrics, conn.as_ref(), class, work)
        {
            return refuse(e);
        }
    }
    // The head is held while the call runs: charged with its messages.
    let mut head = s.body_budget.charge();
    if access != Access::Public
        && let Err(e) = head.add(crate::front::body_budget::head_bytes(req.headers()))
    {
        return refuse(e);
    }
    let (parts, body) = req.into_parts();
    let body = Body::new(super::frames::Whole::new(
        body,
        &s.body_budget,
        s.options.max_body,
    ));
    let req = Request::from_parts(parts, body);
    if access == Access::Public {
        // Health.Watch and reflection streams live as long as their client.
        return next.run(req).await;
    }
    // A call, its message's sending included, takes at most body_timeout:
    // a client trickling a message holds a stream no longer than that.
    match tokio::time::timeout(s.options.body_timeout, next.run(req)).await {
        Ok(r) => r,
        Err(_) => refuse(FrontError::request_timeout(s.options.body_timeout)),
    }
}

/// A refusal as a gRPC answer (HTTP 200 with `grpc-status` in trailers-only
/// form), which every gRPC client reads as the call's status.
fn refuse(e: FrontError) -> Response {
    crate::front::error::status(e)
        .into_http::<Body>()
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_by_service_and_method() {
        for (path, want) in [
            ("/grpc.health.v1.Health/Check", Access::Public),
            (
                "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
                Access::Public,
            ),
            ("/freqcap.v1.Freqcap/Check", Access::Decision),
            ("/freqcap.v1.Admin/GetPolicy", Access::Decision),
            ("/freqcap.v1.Admin/PutCampaign", Access::Admin),
            ("/freqcap.v1.Admin/DeletePolicy", Access::Admin),
            ("/freqcap.v1.Admin/ResetKey", Access::Admin),
            ("/freqcap.v1.Admin/EraseIdentity", Access::Admin),
            (
                "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
                Access::Decision,
            ),
            ("/nonsense", Access::Decision),
        ] {
            assert_eq!(access(path), want, "{path}");
        }
    }
}
