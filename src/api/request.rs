//! Request and response plumbing shared by the handlers: JSON bodies read
//! strictly (one object, errors naming the field), JSON answers, path
//! parameters, running engine calls in memory or on a blocking thread, and
//! reported units.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequestParts, Path};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::{ApiError, AppState};
use crate::clock::{Clock, MAX_REPORTED, ceil_ms};
use crate::engine::{Engine, EngineError};
use crate::model::Warning;

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
            Err(e) => ApiError::internal(format!("cannot write the answer: {e}")).into_response(),
        }
    }
}

/// Reads a JSON body: errors name the field (`candidates[2].cost`); a body
/// over the limit is 413.
pub(crate) fn body<T: DeserializeOwned>(
    bytes: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    parse::<Object<T>>(bytes).map(|o| o.0)
}

/// A body that could not be read, in the error shape.
pub(crate) fn rejected(e: BytesRejection) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::too_large("the request body is over the size limit")
    } else {
        ApiError::invalid("", e.body_text())
    }
}

/// Reads a JSON body of any shape (see [`body`] for an object).
pub(crate) fn parse<T: DeserializeOwned>(
    bytes: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    let bytes = bytes.map_err(rejected)?;
    let text =
        std::str::from_utf8(&bytes).map_err(|_| ApiError::invalid("", "body is not UTF-8"))?;
    crate::model::from_json::<T>(text).map_err(|e| ApiError::invalid(&e.field, e.message))
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

/// Runs an engine call that may wait on disk off the async executor.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, crate::engine::EngineError> + Send + 'static,
) -> Result<T, ApiError> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(ApiError::from),
        Err(e) => Err(ApiError::internal(format!("request task failed: {e}"))),
    }
}

/// The path parameters, with a rejection (say, `%FF` where a string is
/// expected) answered in the error shape rather than axum's plain text.
pub(crate) struct ApiPath<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(v)) => Ok(ApiPath(v)),
            Err(e) => Err(ApiError::invalid("path", e.body_text())),
        }
    }
}

/// A path parameter over the id length limit is a 400 naming it, not a 404.
pub(crate) fn id_param<C: Clock>(
    s: &AppState<C>,
    field: &str,
    value: &str,
) -> Result<(), ApiError> {
    let max = s.engine.options().max_id_len;
    if value.is_empty() || value.len() > max {
        return Err(ApiError::invalid(
            field,
            format!("must be 1 to {max} bytes, got {}", value.len()),
        ));
    }
    Ok(())
}

/// An engine call's result.
pub(crate) type Decided<T> = Result<T, EngineError>;

/// Decides `req` here, on the executor, when `here` can (every record it
/// needs is in memory, the usual case: a hand-off to a blocking thread and
/// back would cost more than the decision); else runs `there` on a blocking
/// thread, where reading a cold record from disk is fine.
pub(crate) async fn in_memory_or_blocking<
    C: Clock + 'static,
    Q: Send + 'static,
    T: Send + 'static,
>(
    s: &AppState<C>,
    req: Q,
    here: fn(&Engine<C>, &Q) -> Option<Decided<T>>,
    there: fn(&Engine<C>, &Q) -> Decided<T>,
) -> Result<T, ApiError> {
    if let Some(r) = here(&s.engine, &req) {
        return r.map_err(ApiError::from);
    }
    let e = s.engine.clone();
    blocking(move || there(&e, &req)).await
}

/// Commits reservation `id` for every front: a live reservation is settled
/// here and its writes awaited without parking a thread; a late commit
/// (which may read a cold record) runs on a blocking thread.
pub(crate) async fn commit_reservation<C: Clock + 'static>(
    s: &AppState<C>,
    id: String,
    req: crate::engine::CommitRequest,
) -> Result<crate::engine::CommitOutcome, ApiError> {
    match s.engine.commit_in_memory(&id, &req) {
        Some(pending) => Ok(pending?.wait_async().await?),
        None => {
            let e = s.engine.clone();
            blocking(move || e.commit(&id, &req)).await
        }
    }
}

/// Counts events for every front: here when every user's record is in
/// memory, awaited without parking a thread; else on a blocking thread.
/// The number counted (the rest were duplicates).
pub(crate) async fn count_events<C: Clock + 'static>(
    s: &AppState<C>,
    evs: Vec<crate::engine::Event>,
) -> Result<usize, ApiError> {
    if evs.is_empty() {
        return Err(ApiError::invalid("", "at least one event is needed"));
    }
    match s.engine.events_in_memory(&evs) {
        Some(pending) => Ok(pending?.wait_async().await?),
        None => {
            let e = s.engine.clone();
            blocking(move || e.events(&evs)).await
        }
    }
}

/// A reported duration: ms rounded up, saturating (docs/semantics.md §1.5).
pub(crate) fn ms(ns: impl Into<crate::clock::Span>) -> u64 {
    ceil_ms(ns).min(MAX_REPORTED)
}

/// Definition warnings (e.g. a redundant cap) are accepted but logged, so the
/// operator sees them.
pub(crate) fn log_warnings(warnings: &[Warning]) {
    for w in warnings {
        tracing::warn!(field = %w.field, "definition warning: {}", w.message);
    }
}

/// An empty body reads as `{}` (commit and release may carry none).
pub(crate) fn optional_body<T: DeserializeOwned + Default>(
    b: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
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
