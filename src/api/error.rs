//! The error body of every endpoint (DESIGN §4): `{"error": {"code", "message"}}`.

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
            message,
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

    pub fn overloaded() -> Self {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "overloaded",
            message: "too many requests in flight; retry shortly".into(),
        }
    }

    pub fn conflict(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::CONFLICT,
            code: "conflict",
            message: message.into(),
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            code: "internal",
            message: message.into(),
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::InvalidArgument { field, message } => ApiError::invalid(&field, message),
            EngineError::NotFound(m) => ApiError::not_found(m),
            EngineError::Conflict(m) => ApiError::conflict(m),
            EngineError::Overloaded(m) => ApiError {
                message: m,
                ..ApiError::overloaded()
            },
            EngineError::NotInMemory => ApiError::internal("a record was not in memory"),
            // Asked of a store that cannot (a checkpoint of memory): the
            // request is wrong for this deployment, nothing is broken.
            EngineError::Store(crate::store::StoreError::Unsupported(m)) => {
                ApiError::invalid("", m)
            }
            EngineError::Store(e) => {
                tracing::error!(error = %e, "store failed");
                ApiError::internal(e.to_string())
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Body {
            error: Inner {
                code: self.code,
                message: &self.message,
            },
        };
        let mut r = (self.status, axum::Json(body)).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        r
    }
}
