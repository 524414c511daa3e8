//! HTTP's form of the one error ([`FrontError`], docs/semantics.md §8.5):
//! its code's status and `{"error": {"code", "message"}}`, with
//! `Retry-After: 1` on a 503, `Connection: close` on a 408 and
//! `WWW-Authenticate: Bearer` on a 401.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::front::FrontError;
use crate::front::error::bounded;

#[derive(Serialize)]
struct Body<'a> {
    error: Inner<'a>,
}

#[derive(Serialize)]
struct Inner<'a> {
    code: &'a str,
    message: &'a str,
}

impl IntoResponse for FrontError {
    fn into_response(self) -> Response {
        let status = self.code.http_status();
        let body = Body {
            error: Inner {
                code: self.code.as_str(),
                message: &bounded(&self.message),
            },
        };
        let mut r = (status, axum::Json(body)).into_response();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if status == StatusCode::REQUEST_TIMEOUT {
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        if status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::front::Code;

    /// Each code answers its status, and the body names the code.
    #[test]
    fn every_code_has_its_status() {
        for code in Code::ALL {
            let r = FrontError {
                code,
                message: "m".into(),
            }
            .into_response();
            assert_eq!(r.status(), code.http_status(), "{code:?}");
            assert_eq!(
                r.headers().contains_key(header::RETRY_AFTER),
                r.status() == StatusCode::SERVICE_UNAVAILABLE
            );
        }
        assert_eq!(Code::Conflict.http_status(), StatusCode::CONFLICT);
        assert_eq!(Code::InvalidArgument.http_status(), StatusCode::BAD_REQUEST);
    }
}
