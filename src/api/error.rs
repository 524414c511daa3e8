//! The error body of every endpoint (docs/semantics.md §8.5): `{"error": {"code", "message"}}`.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::engine::EngineError;

/// An error answer: its status and code go together (`invalid_argument` is
/// always 400, and so on).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

#[derive(Serialize)]
struct Body<'a> {
    error: Inner<'a>,
}

#[derive(Serialize)]
struct Inner<'a> {
    code: &'a str,
    message: &'a str,
}

impl ApiError {
    /// 400 `invalid_argument`; `field` leads the message so the caller can find
    /// what to fix.
    pub fn invalid(field: &str, message: impl std::fmt::Display) -> Self {
        let message = if field.is_empty() {
            message.to_string()
        } else {
            format!("{field}: {message}")
        };
        ApiError {
            status: StatusCode::BAD_REQUEST,
            code: "invalid_argument",
            message: bounded(&message).into_owned(),
        }
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            code: "not_found",
            message: message.into(),
        }
    }

    pub fn unauthenticated() -> Self {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            code: "unauthenticated",
            message: "a valid bearer token is required (Authorization: Bearer <token>)".into(),
        }
    }

    pub fn method_not_allowed() -> Self {
        ApiError {
            status: StatusCode::METHOD_NOT_ALLOWED,
            code: "method_not_allowed",
            message: "this endpoint does not take that method".into(),
        }
    }

    pub fn too_large(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            code: "too_large",
            message: message.into(),
        }
    }

    /// 503 `overloaded`, with `Retry-After: 1`.
    pub fn overloaded(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "overloaded",
            message: message.into(),
        }
    }

    /// 503 `unavailable`, with `Retry-After: 1`: the shared store's shard
    /// holding the request's record cannot be reached now (docs/cluster.md);
    /// nothing was applied, or, for a write whose answer was lost, it is
    /// safe to retry (every write is idempotent).
    pub fn unavailable(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "unavailable",
            message: message.into(),
        }
    }

    /// 403 `forbidden`: a request this service will not answer whoever sends
    /// it (a `Host` it does not serve).
    pub fn forbidden(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::FORBIDDEN,
            code: "forbidden",
            message: message.into(),
        }
    }

    /// 415 `unsupported_media_type`: a body that is not `application/json`.
    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
            code: "unsupported_media_type",
            message: message.into(),
        }
    }

    /// 408 `request_timeout`: the body did not arrive in time; the
    /// connection is closed after the answer.
    pub fn request_timeout(limit: std::time::Duration) -> Self {
        ApiError {
            status: StatusCode::REQUEST_TIMEOUT,
            code: "request_timeout",
            message: format!(
                "the request body did not arrive within {} ms",
                limit.as_millis()
            ),
        }
    }

    pub fn conflict(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::CONFLICT,
            code: "conflict",
            message: message.into(),
        }
    }

    /// 500 `internal`. What went wrong (a RocksDB path or message) is
    /// logged under a request id; the client gets the id only, never the
    /// details of the server's insides.
    pub fn internal(detail: impl std::fmt::Display) -> Self {
        let id = super::guard::current_request_id().unwrap_or_else(request_id);
        tracing::error!(request_id = %id, "internal error: {detail}");
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            code: "internal",
            message: format!("internal error; the server's log has it under request id {id}"),
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::InvalidArgument { field, message } => ApiError::invalid(&field, message),
            EngineError::NotFound(m) => ApiError::not_found(m),
            // Every conflict is one 409; its variant says which.
            EngineError::Conflict(c) => ApiError::conflict(c.to_string()),
            EngineError::Overloaded(m) => ApiError::overloaded(m),
            // Asked of a store that cannot (a checkpoint of memory): the
            // request is wrong for this deployment, nothing is broken.
            EngineError::Store(crate::store::StoreError::Unsupported(m)) => {
                ApiError::invalid("", m)
            }
            EngineError::Store(e @ crate::store::StoreError::Unavailable(_)) => {
                ApiError::unavailable(e.to_string())
            }
            EngineError::Store(e) => ApiError::internal(format_args!("store failed: {e}")),
        }
    }
}

/// The most of a message an answer carries, bytes: messages quote what was
/// wrong, and a client's 100 KB value quoted whole made a gRPC answer's
/// metadata exceed grpc-core's 16 KiB limit, so the client saw
/// RESOURCE_EXHAUSTED instead of the error (security probe, case 1.22).
pub const MAX_MESSAGE: usize = 1024;

/// `text` cut to [`MAX_MESSAGE`] bytes (on a character boundary), saying how
/// long it was.
pub fn bounded(text: &str) -> std::borrow::Cow<'_, str> {
    if text.len() <= MAX_MESSAGE {
        return text.into();
    }
    let mut end = MAX_MESSAGE;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes in all)", &text[..end], text.len()).into()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Body {
            error: Inner {
                code: self.code,
                message: &bounded(&self.message),
            },
        };
        let mut r = (self.status, axum::Json(body)).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if self.status == StatusCode::REQUEST_TIMEOUT {
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        r
    }
}

/// An id for a logged error: the process's start time and a counter, so ids
/// from two runs of the service do not collide in one log.
pub(crate) fn request_id() -> String {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static START: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let start = *START.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    });
    format!("{start:x}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_bounded() {
        let long = format!("domain: {}", "é".repeat(5000));
        let e = ApiError::invalid("x", &long);
        assert!(e.message.len() < MAX_MESSAGE + 40, "{}", e.message.len());
        assert!(e.message.ends_with("(10011 bytes in all)"), "{}", e.message);
        assert_eq!(bounded("short"), "short");
    }

    /// A store failure's text (paths, RocksDB's words) stays in the log;
    /// the client gets a request id to quote.
    #[test]
    fn internal_errors_do_not_show_the_servers_insides() {
        let e = EngineError::Store(crate::store::StoreError::Io(
            "IO error: /var/lib/freqcap/data/000123.sst: No space left on device".into(),
        ));
        let a = ApiError::from(e);
        assert_eq!(a.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(!a.message.contains("/var/lib"), "{}", a.message);
        assert!(!a.message.contains("IO error"), "{}", a.message);
        assert!(a.message.contains("request id"), "{}", a.message);
        let b = ApiError::internal("x");
        assert_ne!(a.message, b.message, "each error has its own id");
    }
}
