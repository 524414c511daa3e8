//! The one error of every front (docs/semantics.md §8.5): a [`Code`] and a
//! message. Each front writes it in its own terms from the code alone: HTTP
//! its status and `{"error": {"code", "message"}}` (`src/api/error.rs`),
//! gRPC a status code with the same words (`src/grpc/status.rs`), RESP an
//! error whose first word is the code upper-cased (`src/resp/cmd/mod.rs`).
//! Before this enum the fronts matched the code's *string*: a new code would
//! have fallen through to INTERNAL on gRPC unnoticed.

use axum::http::StatusCode;

use crate::engine::EngineError;

/// What went wrong, in the API's words: each code has one HTTP status, one
/// gRPC code and one RESP word, whatever front answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    InvalidArgument,
    NotFound,
    Unauthenticated,
    Forbidden,
    MethodNotAllowed,
    TooLarge,
    UnsupportedMediaType,
    RequestTimeout,
    Conflict,
    /// Shed: too many requests, connections or bytes at once; retry soon.
    Overloaded,
    /// The shared store's shard cannot be reached now; nothing was applied.
    Unavailable,
    Internal,
}

impl Code {
    /// Every code, for the tests of each front's mapping.
    pub const ALL: [Code; 12] = [
        Code::InvalidArgument,
        Code::NotFound,
        Code::Unauthenticated,
        Code::Forbidden,
        Code::MethodNotAllowed,
        Code::TooLarge,
        Code::UnsupportedMediaType,
        Code::RequestTimeout,
        Code::Conflict,
        Code::Overloaded,
        Code::Unavailable,
        Code::Internal,
    ];

    /// The code as the API writes it (`invalid_argument`).
    pub fn as_str(self) -> &'static str {
        match self {
            Code::InvalidArgument => "invalid_argument",
            Code::NotFound => "not_found",
            Code::Unauthenticated => "unauthenticated",
            Code::Forbidden => "forbidden",
            Code::MethodNotAllowed => "method_not_allowed",
            Code::TooLarge => "too_large",
            Code::UnsupportedMediaType => "unsupported_media_type",
            Code::RequestTimeout => "request_timeout",
            Code::Conflict => "conflict",
            Code::Overloaded => "overloaded",
            Code::Unavailable => "unavailable",
            Code::Internal => "internal",
        }
    }

    pub fn http_status(self) -> StatusCode {
        match self {
            Code::InvalidArgument => StatusCode::BAD_REQUEST,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::Forbidden => StatusCode::FORBIDDEN,
            Code::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Code::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Code::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Code::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            Code::Conflict => StatusCode::CONFLICT,
            Code::Overloaded | Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The gRPC status code (docs/grpc.md, "Status codes"), as the gRPC
    /// front mapped the code's string before: `conflict` is ABORTED (gRPC's
    /// "retry at a higher level": the reservation was settled another way);
    /// shedding and an unreachable shard are UNAVAILABLE, which gRPC clients
    /// retry; `too_large` is RESOURCE_EXHAUSTED, as grpc-core answers an
    /// oversized message. The HTTP-only codes (a method or a media type no
    /// gRPC call can send) are INTERNAL as they were.
    pub fn grpc_code(self) -> tonic::Code {
        use tonic::Code as G;
        match self {
            Code::InvalidArgument => G::InvalidArgument,
            Code::NotFound => G::NotFound,
            Code::Unauthenticated => G::Unauthenticated,
            Code::Forbidden => G::PermissionDenied,
            Code::TooLarge => G::ResourceExhausted,
            Code::RequestTimeout => G::DeadlineExceeded,
            Code::Conflict => G::Aborted,
            Code::Overloaded | Code::Unavailable => G::Unavailable,
            Code::MethodNotAllowed | Code::UnsupportedMediaType | Code::Internal => G::Internal,
        }
    }

    /// The first word of a RESP error (`INVALID_ARGUMENT key: ...`): Redis
    /// clients read an error's first word as its kind.
    pub fn resp_word(self) -> &'static str {
        match self {
            Code::InvalidArgument => "INVALID_ARGUMENT",
            Code::NotFound => "NOT_FOUND",
            Code::Unauthenticated => "UNAUTHENTICATED",
            Code::Forbidden => "FORBIDDEN",
            Code::MethodNotAllowed => "METHOD_NOT_ALLOWED",
            Code::TooLarge => "TOO_LARGE",
            Code::UnsupportedMediaType => "UNSUPPORTED_MEDIA_TYPE",
            Code::RequestTimeout => "REQUEST_TIMEOUT",
            Code::Conflict => "CONFLICT",
            Code::Overloaded => "OVERLOADED",
            Code::Unavailable => "UNAVAILABLE",
            Code::Internal => "INTERNAL",
        }
    }
}

/// An error answer: its code, and a message that says what to fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrontError {
    pub code: Code,
    pub message: String,
}

impl FrontError {
    /// 400 `invalid_argument`; `field` leads the message so the caller can find
    /// what to fix.
    pub fn invalid(field: &str, message: impl std::fmt::Display) -> Self {
        let message = if field.is_empty() {
            message.to_string()
        } else {
            format!("{field}: {message}")
        };
        FrontError {
            code: Code::InvalidArgument,
            message: bounded(&message).into_owned(),
        }
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        FrontError {
            code: Code::NotFound,
            message: message.into(),
        }
    }

    pub fn unauthenticated() -> Self {
        FrontError {
            code: Code::Unauthenticated,
            message: "a valid bearer token is required (Authorization: Bearer <token>)".into(),
        }
    }

    pub fn method_not_allowed() -> Self {
        FrontError {
            code: Code::MethodNotAllowed,
            message: "this endpoint does not take that method".into(),
        }
    }

    pub fn too_large(message: impl Into<String>) -> Self {
        FrontError {
            code: Code::TooLarge,
            message: message.into(),
        }
    }

    /// 503 `overloaded`, with `Retry-After: 1`.
    pub fn overloaded(message: impl Into<String>) -> Self {
        FrontError {
            code: Code::Overloaded,
            message: message.into(),
        }
    }

    /// 503 `unavailable`, with `Retry-After: 1`: the shared store's shard
    /// holding the request's record cannot be reached now (docs/cluster.md);
    /// nothing was applied, or, for a write whose answer was lost, it is
    /// safe to retry (every write is idempotent).
    pub fn unavailable(message: impl Into<String>) -> Self {
        FrontError {
            code: Code::Unavailable,
            message: message.into(),
        }
    }

    /// 403 `forbidden`: a request this service will not answer whoever sends
    /// it (a `Host` it does not serve).
    pub fn forbidden(message: impl Into<String>) -> Self {
        FrontError {
            code: Code::Forbidden,
            message: message.into(),
        }
    }

    /// 415 `unsupported_media_type`: a body that is not `application/json`.
    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        FrontError {
            code: Code::UnsupportedMediaType,
            message: message.into(),
        }
    }

    /// 408 `request_timeout`: the body did not arrive in time; the
    /// connection is closed after the answer.
    pub fn request_timeout(limit: std::time::Duration) -> Self {
        FrontError {
            code: Code::RequestTimeout,
            message: format!(
                "the request body did not arrive within {} ms",
                limit.as_millis()
            ),
        }
    }

    pub fn conflict(message: impl Into<String>) -> Self {
        FrontError {
            code: Code::Conflict,
            message: message.into(),
        }
    }

    /// 500 `internal`. What went wrong (a RocksDB path or message) is
    /// logged under a request id; the client gets the id only, never the
    /// details of the server's insides.
    pub fn internal(detail: impl std::fmt::Display) -> Self {
        let id = super::request_id::current().unwrap_or_else(super::request_id::fresh);
        tracing::error!(request_id = %id, "internal error: {detail}");
        FrontError {
            code: Code::Internal,
            message: format!("internal error; the server's log has it under request id {id}"),
        }
    }
}

impl From<EngineError> for FrontError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::InvalidArgument { field, message } => FrontError::invalid(&field, message),
            EngineError::NotFound(m) => FrontError::not_found(m),
            // Every conflict is one 409; its variant says which.
            EngineError::Conflict(c) => FrontError::conflict(c.to_string()),
            EngineError::Overloaded(m) => FrontError::overloaded(m),
            // Asked of a store that cannot (a checkpoint of memory): the
            // request is wrong for this deployment, nothing is broken.
            EngineError::Store(crate::store::StoreError::Unsupported(m)) => {
                FrontError::invalid("", m)
            }
            EngineError::Store(e @ crate::store::StoreError::Unavailable(_)) => {
                FrontError::unavailable(e.to_string())
            }
            EngineError::Store(e) => FrontError::internal(format_args!("store failed: {e}")),
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

/// gRPC's form of an error (docs/grpc.md, "Status codes"): its code's
/// status code, the API's code leading the message, so clients see the same
/// words as over HTTP; UNAVAILABLE carries gRPC's retry pushback of a
/// second, as HTTP's `Retry-After: 1`.
impl From<FrontError> for tonic::Status {
    fn from(e: FrontError) -> tonic::Status {
        let code = e.code.grpc_code();
        let mut s = tonic::Status::new(
            code,
            format!("{}: {}", e.code.as_str(), bounded(&e.message)),
        );
        if code == tonic::Code::Unavailable {
            s.metadata_mut().insert(
                "grpc-retry-pushback-ms",
                tonic::metadata::MetadataValue::from_static("1000"),
            );
        }
        s
    }
}

/// An error as a gRPC status, for the gRPC services' `map_err(status)`.
pub fn status(e: FrontError) -> tonic::Status {
    tonic::Status::from(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each code's gRPC status, as the gRPC front answered it when it
    /// matched the code's string.
    #[test]
    fn grpc_codes() {
        use tonic::Code as G;
        for (code, want) in [
            (Code::InvalidArgument, G::InvalidArgument),
            (Code::NotFound, G::NotFound),
            (Code::Conflict, G::Aborted),
            (Code::Unauthenticated, G::Unauthenticated),
            (Code::Forbidden, G::PermissionDenied),
            (Code::TooLarge, G::ResourceExhausted),
            (Code::Overloaded, G::Unavailable),
            (Code::Unavailable, G::Unavailable),
            (Code::RequestTimeout, G::DeadlineExceeded),
            (Code::Internal, G::Internal),
        ] {
            let s = tonic::Status::from(FrontError {
                code,
                message: "m".into(),
            });
            assert_eq!(s.code(), want, "{code:?}");
            assert_eq!(s.message(), format!("{}: m", code.as_str()));
            assert_eq!(
                s.metadata().contains_key("grpc-retry-pushback-ms"),
                want == G::Unavailable
            );
        }
        for code in Code::ALL {
            assert_eq!(code.resp_word(), code.as_str().to_ascii_uppercase());
        }
    }

    #[test]
    fn messages_are_bounded() {
        let long = format!("domain: {}", "é".repeat(5000));
        let e = FrontError::invalid("x", &long);
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
        let a = FrontError::from(e);
        assert_eq!(a.code, Code::Internal);
        assert!(!a.message.contains("/var/lib"), "{}", a.message);
        assert!(!a.message.contains("IO error"), "{}", a.message);
        assert!(a.message.contains("request id"), "{}", a.message);
        let b = FrontError::internal("x");
        assert_ne!(a.message, b.message, "each error has its own id");
    }
}
