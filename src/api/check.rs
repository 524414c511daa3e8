//! `POST /v1/check`: one decision over a policy or inline limits, with the
//! IETF `RateLimit` fields.

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::St;
use super::request::*;
use crate::clock::Clock;
use crate::engine::Priority;
use crate::engine::{CheckRequest, CheckTarget, Engine};
use crate::front::FrontError;
use crate::front::call::*;
use crate::front::outcome::Checked;
use crate::front::priority::{self, header};
use crate::front::ratelimit_fields as headers;
use crate::front::report::reported;
use crate::model::LimitDef;

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
/// `POST /v1/check`: give exactly one of `policy` and `limits`.
pub(crate) struct CheckBody {
    /// The name of a policy defined with `PUT /v1/policies/{name}`.
    #[serde(default)]
    policy: Option<String>,
    /// Inline limit items (state kept per key and item index, apart from
    /// named policies).
    #[serde(default)]
    limits: Option<Vec<LimitDef>>,
    /// The subject limited (a client, an API key, ...); at most 256 bytes.
    key: String,
    /// Units to debit, 0 ≤ cost < 2^53; 0 peeks (always allowed, debits nothing).
    #[serde(default = "one")]
    #[schemars(range(max = crate::MAX_EXACT))]
    cost: u64,
    /// Hold the debit as pending until commit, release or the deadline.
    #[serde(default)]
    reserve: bool,
    /// The reservation's lifetime, 1..=3 600 000 ms (default 60 000).
    #[serde(default)]
    #[schemars(range(min = 1, max = 3_600_000))]
    ttl_ms: Option<u64>,
    /// The caller's id for the reservation (1–128 of `A-Z a-z 0-9 . _ : -`);
    /// repeating a reserve with a live id and the same body returns the first answer.
    #[serde(default)]
    reservation_id: Option<String>,
    /// With a policy whose `on_limit` is `delay`: sleep `delay_ms` before answering.
    #[serde(default)]
    wait: bool,
    /// The request's class (docs/semantics.md §2.5); also the header
    /// `x-freqcap-priority`. Default `default`.
    #[serde(default)]
    priority: Option<Priority>,
}

#[derive(Serialize, JsonSchema)]
/// One limit item's figures, in definition order.
pub(crate) struct ItemBody<'a> {
    /// The item's name, or `<kind>-<index>`.
    name: &'a str,
    /// `rate`, `gap`, `window`, `budget` or `concurrency`.
    kind: &'static str,
    /// burst (rate), 1 (gap), limit (window), amount (budget), max (concurrency).
    limit: u64,
    /// Units that could pass now, after this decision.
    remaining: u64,
    /// Until the item is back to full capacity if nothing else happens; 0 when full.
    reset_after_ms: u64,
    /// When denying: the earliest time the same request could pass; null if
    /// it allows, or if it never can (cost over the burst or limit).
    retry_after_ms: Option<u64>,
    allowed: bool,
}

#[derive(Serialize, JsonSchema)]
/// A decision: allowed only if every item allows; then every item is debited.
pub(crate) struct DecisionBody<'a> {
    allowed: bool,
    /// In delay mode, how long the caller should wait before acting (0 otherwise).
    delay_ms: u64,
    /// Max over denying items; null when allowed or when some item never allows.
    retry_after_ms: Option<u64>,
    /// Min over items.
    remaining: u64,
    /// That of the item with the least remaining (ties to the larger).
    reset_after_ms: u64,
    /// The reservation id when `reserve` held something; null otherwise.
    reservation: Option<String>,
    /// Present (true) only in shadow mode, when enforcing would have denied:
    /// the answer is allowed, nothing was debited or held, and the figures
    /// are enforcement's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    would_deny: bool,
    limits: Vec<ItemBody<'a>>,
}

pub(crate) async fn check<C: Clock + 'static>(
    State(s): St<C>,
    hs: HeaderMap,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, FrontError> {
    let bytes = b.map_err(rejected)?;
    let b: CheckBody = body(Ok(bytes.clone()))?;
    let priority = priority::of_request(b.priority, header(&hs))?;
    // Only a caller's id can be repeated; only then is the body hashed.
    let fp = b.reservation_id.as_ref().and_then(|_| fingerprint(&bytes));
    let target = match (b.policy, b.limits) {
        (Some(p), None) => CheckTarget::Policy(p),
        (None, Some(l)) => CheckTarget::Inline(l),
        _ => {
            return Err(FrontError::invalid(
                "policy",
                "give exactly one of \"policy\" (a name) and \"limits\" (inline items)",
            ));
        }
    };
    let req = CheckRequest {
        priority,
        target,
        key: b.key,
        cost: b.cost,
        reserve: b.reserve,
        ttl_ms: b.ttl_ms,
        reservation_id: b.reservation_id,
        fingerprint: fp,
    };
    let out = in_memory_or_blocking(&s, req, Engine::check_in_memory, Engine::check).await?;
    let d = &out.decision;
    let r = reported(&out);
    let body = DecisionBody {
        allowed: r.allowed,
        delay_ms: r.delay_ms,
        retry_after_ms: r.retry_after_ms,
        remaining: r.remaining,
        reset_after_ms: r.reset_after_ms,
        reservation: out.reservation.clone(),
        would_deny: out.would_deny,
        limits: r
            .items
            .into_iter()
            .map(|i| ItemBody {
                name: i.name,
                kind: i.kind,
                limit: i.limit,
                remaining: i.remaining,
                reset_after_ms: i.reset_after_ms,
                retry_after_ms: i.retry_after_ms,
                allowed: i.allowed,
            })
            .collect(),
    };
    s.metrics
        .decisions("/v1/check", Checked::of_check(&out).as_str(), 1);
    if b.wait && d.delay > 0 && s.options.sleep_on_wait {
        tokio::time::sleep(std::time::Duration::from_nanos(d.delay)).await;
    }
    let status = if d.allowed {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    };
    let mut r = (status, Json(body)).into_response();
    headers::add(r.headers_mut(), &out.stack, d, s.options.header_style);
    Ok(r)
}
