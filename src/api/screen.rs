//! `POST /v1/screen`: candidates decided in order, the eligible ones held
//! under one reservation.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, Method};
use axum::response::{IntoResponse, Response};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::St;
use super::request::*;
use crate::clock::Clock;
use crate::engine::Priority;
use crate::engine::{Engine, ScreenCandidate, ScreenRequest};
use crate::front::FrontError;
use crate::front::call::*;
use crate::front::priority;

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
/// A candidate campaign of a screen.
pub(crate) struct CandidateBody {
    campaign: String,
    /// Budget units this impression would cost (default 1); caps count 1.
    #[serde(default)]
    #[schemars(range(max = crate::MAX_EXACT))]
    cost: Option<u64>,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
/// `POST /v1/screen`.
pub(crate) struct ScreenBody {
    /// The user; without one, campaigns with `unknown_user: "deny"` (the
    /// default) are ineligible.
    #[serde(default)]
    user: Option<String>,
    /// The viewer's identities by kind, e.g. `{"household": "h7", "device":
    /// "d2"}` (`user` may be given here too): a cap scoped to a kind counts
    /// on that identity (docs/semantics.md §6.2). At most 8 with the user.
    #[serde(default)]
    #[schemars(extend("maxProperties" = 8))]
    ids: std::collections::BTreeMap<String, String>,
    /// Decided in order, each all-or-nothing over its chain (1 to 10 000 by default).
    candidates: Vec<Object<CandidateBody>>,
    /// Hold every eligible candidate under one reservation (default true);
    /// false is a dry run.
    #[serde(default = "yes")]
    reserve: bool,
    /// The reservation's lifetime, 1..=3 600 000 ms (default 60 000).
    #[serde(default)]
    #[schemars(range(min = 1, max = 3_600_000))]
    ttl_ms: Option<u64>,
    /// The caller's id for the reservation, e.g. its auction id.
    #[serde(default)]
    reservation_id: Option<String>,
    /// The request's class, for every candidate's caps (docs/semantics.md
    /// §2.5); also the header `x-freqcap-priority`. Default `default`.
    #[serde(default)]
    priority: Option<Priority>,
}

#[derive(Serialize, JsonSchema)]
/// The first cap in chain order that denied a candidate.
pub(crate) struct DeniedBody {
    /// The campaign in the chain that owns the cap.
    campaign: Arc<str>,
    /// The cap's name, or `budget`, `max_in_flight`, `unknown_user`, `unknown_campaign`.
    cap: String,
    retry_after_ms: Option<u64>,
}

#[derive(Serialize, JsonSchema)]
pub(crate) struct ResultBody {
    campaign: Arc<str>,
    eligible: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    denied_by: Option<DeniedBody>,
    /// Shadow mode only: eligible, but enforcing would have denied it by
    /// this cap; nothing is held for it and committing it debits nothing.
    #[serde(skip_serializing_if = "Option::is_none")]
    would_deny: Option<DeniedBody>,
    /// An eligible candidate under a campaign with `pacing_levers`: its
    /// budget's levers (docs/pacing.md, "Levers").
    #[serde(skip_serializing_if = "Option::is_none")]
    pacing: Option<LeversBody>,
}

#[derive(Serialize, JsonSchema)]
/// A budget's pacing levers (docs/pacing.md, "Levers").
pub(crate) struct LeversBody {
    /// The share of requests to let through, 0.001 to 1.
    pass_probability: f64,
    /// The factor to scale bids by, 0.1 to 1.
    bid_multiplier: f64,
}

impl From<crate::limits::budget::Levers> for LeversBody {
    fn from(l: crate::limits::budget::Levers) -> Self {
        LeversBody {
            pass_probability: l.pass_probability(),
            bid_multiplier: l.bid_multiplier(),
        }
    }
}

#[derive(Serialize, JsonSchema)]
/// The screen's answer: one result per candidate, in order.
pub(crate) struct ScreenAnswer {
    /// The reservation holding every eligible candidate; null on a dry run or
    /// when none is eligible.
    reservation: Option<String>,
    results: Vec<ResultBody>,
}

pub(crate) async fn screen<C: Clock + 'static>(
    State(s): St<C>,
    headers: HeaderMap,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, FrontError> {
    let bytes = b.map_err(rejected)?;
    let b: ScreenBody = body(Ok(bytes.clone()))?;
    let priority = priority::of_request(b.priority, priority::header(&headers))?;
    let (user, ids) = crate::engine::split_ids(b.user, b.ids)?;
    let owner = user.as_deref().and_then(|u| s.engine.owner_of_user(u));
    if let Some(r) = s
        .forwarder
        .to_owner(owner, Method::POST, "/v1/screen", &headers, bytes.clone())
        .await
    {
        return r;
    }
    let fp = b.reservation_id.as_ref().and_then(|_| fingerprint(&bytes));
    let req = ScreenRequest {
        priority,
        user,
        ids,
        candidates: b
            .candidates
            .into_iter()
            .map(|Object(c)| ScreenCandidate {
                campaign: c.campaign,
                cost: c.cost,
            })
            .collect(),
        reserve: b.reserve,
        ttl_ms: b.ttl_ms,
        reservation_id: b.reservation_id,
        fingerprint: fp,
    };
    let out = in_memory_or_blocking(&s, req, Engine::screen_in_memory, Engine::screen).await?;
    for (outcome, n) in crate::front::outcome::screened(&out.results) {
        s.metrics.decisions("/v1/screen", outcome, n);
    }
    Ok(Json(ScreenAnswer {
        reservation: out.reservation,
        results: out
            .results
            .into_iter()
            .map(|r| ResultBody {
                campaign: r.campaign,
                eligible: r.eligible,
                denied_by: r.denied_by.map(denied_body),
                would_deny: r.would_deny.map(denied_body),
                pacing: r.pacing.map(LeversBody::from),
            })
            .collect(),
    })
    .into_response())
}

fn denied_body(d: crate::engine::DeniedBy) -> DeniedBody {
    DeniedBody {
        campaign: d.campaign,
        cap: d.cap,
        retry_after_ms: d.retry_after.map(ms),
    }
}
