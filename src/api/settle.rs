//! `POST /v1/reservations/{id}/commit` and `/release`: ending a reservation.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, Method, Uri};
use axum::response::{IntoResponse, Response};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::St;
use super::request::*;
use crate::clock::Clock;
use crate::engine::CommitRequest;
use crate::front::FrontError;
use crate::front::call::*;
use crate::front::sample;

/// `campaign`: one name or a list.
#[derive(Deserialize, JsonSchema)]
#[serde(untagged)]
pub(crate) enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize, Default, JsonSchema)]
#[serde(deny_unknown_fields)]
/// `POST /v1/reservations/{id}/commit`; the body may be empty.
pub(crate) struct CommitBody {
    /// A screen's winner(s): committed, the other candidates released. Omitted:
    /// every eligible candidate is committed.
    #[serde(default)]
    campaign: Option<OneOrMany>,
    /// The final cost (e.g. the clearing price): lower returns the difference,
    /// higher is charged anyway.
    #[serde(default)]
    #[schemars(range(max = crate::MAX_EXACT))]
    cost: Option<u64>,
    /// Makes a late commit idempotent within the dedupe horizon.
    #[serde(default)]
    event_id: Option<String>,
    /// With `campaign` and `cost`, an unknown or expired reservation is
    /// counted as a late commit.
    #[serde(default)]
    user: Option<String>,
    /// A late commit's other identities of the viewer (`{"household":
    /// "h7"}`), counted as an event's.
    #[serde(default)]
    #[schemars(extend("maxProperties" = 8))]
    ids: std::collections::BTreeMap<String, String>,
    /// The work's latency in ms, a number from 0 to 3 600 000 (fractions
    /// too), for the stack's adaptive items (docs/adaptive.md); required
    /// with outcome `ok`.
    #[serde(default)]
    #[schemars(range(min = 0, max = 3_600_000))]
    latency_ms: Option<f64>,
    /// `ok` (default with a latency), `dropped` (timed out, overloaded:
    /// shrinks an adaptive limit) or `ignored` (not the backend's doing).
    #[serde(default)]
    #[schemars(extend("enum" = ["ok", "dropped", "ignored"]))]
    outcome: Option<String>,
}

#[derive(Serialize, JsonSchema)]
/// The outcome of a commit or release.
pub(crate) struct SettledBody {
    reservation: String,
    /// `committed`, `released` or `late_commit`.
    outcome: &'static str,
    /// The campaigns committed (or released).
    campaigns: Vec<Arc<str>>,
}

impl From<crate::engine::CommitOutcome> for SettledBody {
    fn from(o: crate::engine::CommitOutcome) -> Self {
        SettledBody {
            reservation: o.reservation,
            outcome: o.outcome.as_str(),
            campaigns: o.campaigns,
        }
    }
}

pub(crate) async fn commit<C: Clock + 'static>(
    State(s): St<C>,
    ApiPath(id): ApiPath<String>,
    headers: HeaderMap,
    uri: Uri,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, FrontError> {
    let bytes = b.map_err(rejected)?;
    let b: CommitBody = optional_body(Ok(bytes.clone()))?;
    let (user, ids) = crate::engine::split_ids(b.user, b.ids)?;
    if let Some(r) = at_owner(&s, &id, user.as_deref(), &headers, &uri, bytes).await {
        return r;
    }
    let req = CommitRequest {
        campaigns: match b.campaign {
            None => Vec::new(),
            Some(OneOrMany::One(c)) => vec![c],
            Some(OneOrMany::Many(v)) => v,
        },
        cost: b.cost,
        event_id: b.event_id,
        user,
        ids,
        sample: sample::of(b.latency_ms, b.outcome.as_deref())?,
    };
    Ok(Json(SettledBody::from(commit_reservation(&s, id, req).await?)).into_response())
}

#[derive(Deserialize, Default, JsonSchema)]
#[serde(deny_unknown_fields)]
/// `POST /v1/reservations/{id}/release`; the body may be empty.
pub(crate) struct ReleaseBody {
    /// With a redis-cluster store, the user whose record holds a reservation
    /// whose id the client chose, released on another node than the one
    /// that made it (docs/cluster.md); not needed otherwise.
    #[serde(default)]
    user: Option<String>,
    // The sample's two fields, as in CommitBody: written twice because
    // serde's `flatten` cannot go with `deny_unknown_fields`.
    /// The work's latency in ms, a number from 0 to 3 600 000 (fractions
    /// too), for the stack's adaptive items (docs/adaptive.md); required
    /// with outcome `ok`.
    #[serde(default)]
    #[schemars(range(min = 0, max = 3_600_000))]
    latency_ms: Option<f64>,
    /// `ok` (default with a latency), `dropped` (timed out, overloaded:
    /// shrinks an adaptive limit) or `ignored` (not the backend's doing).
    #[serde(default)]
    #[schemars(extend("enum" = ["ok", "dropped", "ignored"]))]
    outcome: Option<String>,
}

pub(crate) async fn release<C: Clock + 'static>(
    State(s): St<C>,
    ApiPath(id): ApiPath<String>,
    headers: HeaderMap,
    uri: Uri,
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, FrontError> {
    let bytes = b.map_err(rejected)?;
    let body: ReleaseBody = optional_body(Ok(bytes.clone()))?;
    if let Some(r) = at_owner(&s, &id, body.user.as_deref(), &headers, &uri, bytes).await {
        return r;
    }
    let sample = sample::of(body.latency_ms, body.outcome.as_deref())?;
    let e = s.engine.clone();
    let out = blocking(move || e.release_with(&id, body.user.as_deref(), sample)).await?;
    Ok(Json(SettledBody::from(out)).into_response())
}

/// Owner mode: the answer of the node owning reservation `id`'s user, when
/// that is another node (docs/cluster.md, "Owner mode"); `None`: settle it
/// here.
async fn at_owner<C: Clock + 'static>(
    s: &super::AppState<C>,
    id: &str,
    user: Option<&str>,
    headers: &HeaderMap,
    uri: &Uri,
    bytes: Bytes,
) -> Option<Result<Response, FrontError>> {
    let owner = s.engine.owner_of_reservation(id, user);
    s.forwarder
        .to_owner(owner, Method::POST, uri.path(), headers, bytes)
        .await
}
