//! Request and response plumbing shared by the HTTP handlers: JSON bodies
//! read strictly (one object, errors naming the field), JSON answers and
//! path parameters. The engine calls are every front's (`src/front/call.rs`).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequestParts, Path};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::front::FrontError;

/// A JSON response. axum's own `Json` serializes into a `BytesMut` that
/// starts at 128 bytes and grows as it writes; a decision is 200–400 bytes
/// and a screen's answer kilobytes, so this one starts at 512 and writes
/// through a plain `Vec`: `check` served 6 % more requests per second for it
/// (99 k → 105 k, same machine, alternating runs).
pub(crate) struct Json<T>(pub T);

impl<T: Serialize> IntoResponse for Json<T> {
    fn into_response(self) -> Response {
        let mut buf = Vec::with_capacity(512);
        match serde_json::to_writer(&mut buf, &self.0) {
            Ok(()) => (
                [(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                )],
                buf,
            )
                .into_response(),
            Err(e) => FrontError::internal(format!("cannot write the answer: {e}")).into_response(),
        }
    }
}

/// Reads a JSON body: errors name the field (`candidates[2].cost`); a body
/// over the limit is 413.
pub(crate) fn body<T: DeserializeOwned>(
    bytes: Result<Bytes, BytesRejection>,
) -> Result<T, FrontError> {
    parse::<Object<T>>(bytes).map(|o| o.0)
}

/// A body that could not be read, in the error shape.
pub(crate) fn rejected(e: BytesRejection) -> FrontError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        FrontError::too_large("the request body is over the size limit")
    } else {
        FrontError::invalid("", e.body_text())
    }
}

/// Reads a JSON body of any shape (see [`body`] for an object).
pub(crate) fn parse<T: DeserializeOwned>(
    bytes: Result<Bytes, BytesRejection>,
) -> Result<T, FrontError> {
    let bytes = bytes.map_err(rejected)?;
    let text =
        std::str::from_utf8(&bytes).map_err(|_| FrontError::invalid("", "body is not UTF-8"))?;
    crate::model::from_json::<T>(text).map_err(|e| FrontError::invalid(&e.field, e.message))
}

/// A JSON object read as `T`. serde's derived structs also accept an array,
/// read positionally (`["p", null, "k"]` was taken as a check and debited);
/// wherever the API documents an object, only an object is read.
pub(crate) struct Object<T>(pub T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Fields<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Fields<T> {
            type Value = T;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
            }
        }
        d.deserialize_map(Fields(std::marker::PhantomData))
            .map(Object)
    }
}

impl<T: JsonSchema> JsonSchema for Object<T> {
    fn inline_schema() -> bool {
        T::inline_schema()
    }
    fn schema_name() -> std::borrow::Cow<'static, str> {
        T::schema_name()
    }
    fn schema_id() -> std::borrow::Cow<'static, str> {
        T::schema_id()
    }
    fn json_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
        T::json_schema(g)
    }
}

/// A fingerprint of a body as sent: its JSON value, members in any order
/// (docs/semantics.md §4.5: "the same body" is the same JSON value after parsing). A repeat
/// of a reserve under a live id is recognised by it, so a member added at
/// its default value (`"cost": 1`) is a different body, not a repeat.
pub(crate) fn fingerprint(bytes: &[u8]) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    fn feed(v: &serde_json::Value, h: &mut impl Hasher) {
        use serde_json::Value::*;
        match v {
            Null => 0u8.hash(h),
            Bool(b) => (1u8, b).hash(h),
            // The number as parsed: 1 and 1.0 are different JSON texts but
            // the same value only when serde_json reads them alike.
            Number(n) => (2u8, n.to_string()).hash(h),
            String(s) => (3u8, s).hash(h),
            Array(a) => {
                (4u8, a.len()).hash(h);
                a.iter().for_each(|x| feed(x, h));
            }
            Object(m) => {
                // serde_json's map is ordered by key: the order sent does
                // not matter.
                (5u8, m.len()).hash(h);
                for (k, x) in m {
                    k.hash(h);
                    feed(x, h);
                }
            }
        }
    }
    let v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    feed(&v, &mut h);
    Some(h.finish())
}

/// The path parameters, with a rejection (say, `%FF` where a string is
/// expected) answered in the error shape rather than axum's plain text.
pub(crate) struct ApiPath<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiPath<T> {
    type Rejection = FrontError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, FrontError> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(v)) => Ok(ApiPath(v)),
            Err(e) => Err(FrontError::invalid("path", e.body_text())),
        }
    }
}

/// An empty body reads as `{}` (commit and release may carry none).
pub(crate) fn optional_body<T: DeserializeOwned + Default>(
    b: Result<Bytes, BytesRejection>,
) -> Result<T, FrontError> {
    match &b {
        Ok(bytes) if bytes.iter().all(u8::is_ascii_whitespace) => Ok(T::default()),
        _ => body(b),
    }
}

/// serde default of `cost`.
pub(crate) fn one() -> u64 {
    1
}

/// serde default of `reserve`.
pub(crate) fn yes() -> bool {
    true
}
