//! Reads of state: `GET /v1/users/{user}/campaigns/{id}` (a user's usage of
//! every cap in a campaign's chain) and `GET /v1/campaigns/{id}/delivery`
//! (a budget's spend against its pacing line).

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, Uri};
use axum::response::{IntoResponse, Response};
use schemars::JsonSchema;
use serde::Serialize;

use super::St;
use super::request::*;
use crate::clock::Clock;
use crate::front::FrontError;
use crate::front::call::*;

#[derive(Serialize, JsonSchema)]
/// A campaign's budget now.
pub(crate) struct DeliveryBody {
    campaign: String,
    /// Budget per period.
    amount: u64,
    /// Committed spend this period.
    spent: u64,
    /// Spend held by open reservations.
    pending: u64,
    /// What pacing allows to be spent (plus pending) by now.
    cap_now: u64,
    /// `asap`, `even` or `{"profile": [...]}`.
    pacing: serde_json::Value,
    /// RFC 3339.
    period_start: String,
    /// RFC 3339.
    period_end: String,
    /// The budget's pacing levers now, when it keeps them (`throttle`
    /// pacing, or a campaign with `pacing_levers`).
    #[serde(skip_serializing_if = "Option::is_none")]
    levers: Option<super::screen::LeversBody>,
}

pub(crate) async fn delivery<C: Clock + 'static>(
    State(s): St<C>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<DeliveryBody>, FrontError> {
    id_param(&s, "id", &id)?;
    let e = s.engine.clone();
    let name = id.clone();
    let d = blocking(move || e.delivery(&name)).await?;
    let pacing = pacing_of(&s.engine, &id);
    Ok(Json(DeliveryBody {
        campaign: d.campaign,
        amount: d.amount,
        spent: d.spent,
        pending: d.pending,
        cap_now: d.cap_now,
        pacing,
        period_start: rfc3339(d.period_start),
        period_end: rfc3339(d.period_end),
        levers: d.levers.map(Into::into),
    }))
}

#[derive(Serialize, JsonSchema)]
/// One cap of the campaign or an ancestor, for the user.
pub(crate) struct CapBody {
    /// The owner of the cap in the chain.
    campaign: String,
    name: String,
    scope: crate::model::Scope,
    kind: &'static str,
    /// The event type it counts: "impression", "click", ...
    event: crate::model::EventType,
    limit: u64,
    used: u64,
    pending: u64,
    remaining: u64,
    reset_after_ms: u64,
}

#[derive(Serialize, JsonSchema)]
/// `GET /v1/users/{user}/campaigns/{id}`: every cap of the campaign and its ancestors.
pub(crate) struct UsageBody {
    user: String,
    campaign: String,
    caps: Vec<CapBody>,
}

#[derive(Serialize, JsonSchema)]
/// `GET /v1/ids/{kind}/{ident}/campaigns/{id}`: every cap of the campaign
/// and its ancestors scoped to `kind`, for one identity, and the
/// campaign-scope ones.
pub(crate) struct IdentityUsageBody {
    kind: String,
    ident: String,
    campaign: String,
    caps: Vec<CapBody>,
}

pub(crate) async fn identity_usage<C: Clock + 'static>(
    State(s): St<C>,
    ApiPath((kind, ident, id)): ApiPath<(String, String, String)>,
) -> Result<Response, FrontError> {
    id_param(&s, "ident", &ident)?;
    id_param(&s, "id", &id)?;
    let e = s.engine.clone();
    let (k, i, c) = (kind.clone(), ident.clone(), id.clone());
    let caps = blocking(move || e.identity_usage(&k, &i, &c)).await?;
    Ok(Json(IdentityUsageBody {
        kind,
        ident,
        campaign: id,
        caps: caps.into_iter().map(cap_body).collect(),
    })
    .into_response())
}

fn cap_body(c: crate::engine::CapUsage) -> CapBody {
    CapBody {
        campaign: c.campaign,
        name: c.name,
        scope: c.scope,
        kind: c.kind,
        event: c.event,
        limit: c.limit,
        used: c.used,
        pending: c.pending,
        remaining: c.remaining,
        reset_after_ms: ms(c.reset_after),
    }
}

pub(crate) async fn usage<C: Clock + 'static>(
    State(s): St<C>,
    ApiPath((user, id)): ApiPath<(String, String)>,
    headers: HeaderMap,
    uri: Uri,
) -> Result<Response, FrontError> {
    id_param(&s, "user", &user)?;
    id_param(&s, "id", &id)?;
    // Owner mode: the owner's figures include the holds only it knows.
    let owner = s.engine.owner_of_user(&user);
    if let Some(r) = s
        .forwarder
        .to_owner(owner, Method::GET, uri.path(), &headers, Bytes::new())
        .await
    {
        return r;
    }
    let e = s.engine.clone();
    let (u, c) = (user.clone(), id.clone());
    let caps = blocking(move || e.user_usage(&u, &c)).await?;
    Ok(Json(UsageBody {
        user,
        campaign: id,
        caps: caps.into_iter().map(cap_body).collect(),
    })
    .into_response())
}
