//! Tracing of requests (docs/service.md, "Tracing"): one span per HTTP or
//! gRPC request, continuing the caller's W3C `traceparent` (a header, or
//! gRPC metadata, which is a header too); the engine's decision and each
//! store call are spans within it (`src/front/call.rs`,
//! `src/cluster/conn.rs`).
//!
//! Every span has the target [`TARGET`], which the log's filter leaves off
//! unless `FREQCAP_LOG` names it: without an exporter (feature `otlp`) no
//! layer wants them, and a disabled span costs one cached interest check.

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

/// The target of every tracing span.
pub const TARGET: &str = "freqcap::trace";

/// A W3C trace context (`traceparent`, version 00): the caller's trace and
/// span ids, as lowercase hex.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent<'a> {
    pub trace_id: &'a str,
    pub parent_id: &'a str,
    pub sampled: bool,
}

/// Parses `traceparent` (W3C Trace Context §3.2): `00-<32 hex>-<16
/// hex>-<2 hex>`; all-zero ids and unknown forms are ignored (the request
/// starts a trace of its own), as the recommendation says.
pub fn parse_traceparent(v: &str) -> Option<TraceParent<'_>> {
    let mut parts = v.trim().split('-');
    let (version, trace_id, parent_id, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    // Version 00 has exactly four fields; a later version may add more.
    if !hex(version, 2) || version == "ff" || (version == "00" && parts.next().is_some()) {
        return None;
    }
    if !hex(trace_id, 32) || !hex(parent_id, 16) || !hex(flags, 2) {
        return None;
    }
    if trace_id.bytes().all(|b| b == b'0') || parent_id.bytes().all(|b| b == b'0') {
        return None;
    }
    let sampled = u8::from_str_radix(flags, 16).is_ok_and(|f| f & 1 == 1);
    Some(TraceParent {
        trace_id,
        parent_id,
        sampled,
    })
}

/// `router` with [`traced`] around it when a layer wants the spans (an
/// exporter is on, or `FREQCAP_LOG` names [`TARGET`]); else as it is, so
/// tracing off costs requests nothing.
pub fn layer(router: axum::Router) -> axum::Router {
    if tracing::enabled!(target: TARGET, tracing::Level::INFO) {
        router.layer(axum::middleware::from_fn(traced))
    } else {
        router
    }
}

/// The middleware of the HTTP and gRPC routers: the request runs in its
/// span.
pub async fn traced(req: Request, next: Next) -> Response {
    if !tracing::enabled!(target: TARGET, tracing::Level::INFO) {
        return next.run(req).await;
    }
    let parent = req
        .headers()
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .and_then(parse_traceparent);
    let span = tracing::info_span!(
        target: TARGET,
        "request",
        otel.name = format!("{} {}", req.method(), req.uri().path()),
        otel.kind = "server",
        http.request.method = %req.method(),
        url.path = req.uri().path(),
        http.response.status_code = tracing::field::Empty,
    );
    if let Some(p) = parent {
        continue_trace(&span, &p);
    }
    let res = next.run(req).instrument(span.clone()).await;
    span.record("http.response.status_code", res.status().as_u16());
    res
}

/// Makes the caller's span the parent of `span` (with an exporter; without
/// one spans go nowhere, so there is nothing to continue).
#[cfg(feature = "otlp")]
fn continue_trace(span: &tracing::Span, p: &TraceParent<'_>) {
    use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId};
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let (Ok(trace_id), Ok(span_id)) =
        (TraceId::from_hex(p.trace_id), SpanId::from_hex(p.parent_id))
    else {
        return;
    };
    let flags = if p.sampled {
        TraceFlags::SAMPLED
    } else {
        TraceFlags::default()
    };
    let remote = SpanContext::new(trace_id, span_id, flags, true, Default::default());
    let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(remote));
}

#[cfg(not(feature = "otlp"))]
fn continue_trace(_: &tracing::Span, _: &TraceParent<'_>) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_is_parsed_as_w3c_says() {
        let p =
            parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        assert_eq!(p.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(p.parent_id, "00f067aa0ba902b7");
        assert!(p.sampled);
        let p =
            parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").unwrap();
        assert!(!p.sampled);
        // A later version may carry more fields.
        assert!(
            parse_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x")
                .is_some()
        );
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
        ] {
            assert_eq!(parse_traceparent(bad), None, "{bad}");
        }
    }
}
