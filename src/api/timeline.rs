//! `GET /v1/campaigns/{id}/timeline`: a campaign's day minute by minute, for
//! the ad-ops page (`/ui`) and anyone charting delivery (docs/semantics.md
//! §7.4).

use axum::extract::State;
use schemars::JsonSchema;
use serde::Serialize;

use super::St;
use super::request::*;
use crate::clock::Clock;
use crate::front::FrontError;
use crate::front::call::rfc3339;
use crate::front::call::*;

#[derive(Serialize, JsonSchema)]
/// One minute with activity.
pub(crate) struct MinuteBody {
    /// The minute's start, RFC 3339 (UTC).
    t: String,
    /// Budget spend committed in the minute (final costs).
    spend: u64,
    /// Commits won: impressions.
    commits: u64,
    /// Candidates denied by one of the campaign's caps.
    denied: u64,
}

#[derive(Serialize, JsonSchema)]
/// A point of the pacing line: what the budget's pacing allows by `t`.
pub(crate) struct PacingPoint {
    /// RFC 3339 (UTC).
    t: String,
    cap: u64,
}

#[derive(Serialize, JsonSchema)]
/// Users in memory by how much of the first user-scope cap they used.
pub(crate) struct PerUserBody {
    /// The cap's name.
    cap: String,
    limit: u64,
    /// `users[k]`: users who used `k` of it (`k` from 0 to the limit, or to
    /// 99 then "99 or more").
    users: Vec<u64>,
}

#[derive(Serialize, JsonSchema)]
/// A campaign's current and previous period, minute by minute.
pub(crate) struct TimelineBody {
    campaign: String,
    /// The IANA time zone of its periods.
    tz: String,
    /// RFC 3339 (UTC) start and end of the current period (the budget's; a
    /// UTC day without a budget).
    period_start: String,
    period_end: String,
    /// Start of the previous period, the earliest minute reported.
    previous_start: String,
    /// The server's time of this answer, RFC 3339 (UTC).
    now: String,
    /// Budget per period; null without a budget.
    amount: Option<u64>,
    /// `asap`, `even`, `profile`, `adaptive`, `adaptive+profile`, `throttle` or
    /// `throttle+profile` (a flight's `even` or `profile` keeps its name); null
    /// without a budget.
    pacing: Option<String>,
    /// The pacing line every 15 minutes of the current period (or 2 000
    /// points over a long flight), and where a schedule opens or closes;
    /// empty without a budget.
    pacing_line: Vec<PacingPoint>,
    /// The budget's pacing levers now; null unless it keeps them
    /// (`throttle` pacing, or a campaign with `pacing_levers`).
    levers: Option<super::screen::LeversBody>,
    /// Minutes with activity, oldest first (minutes without any are left
    /// out).
    minutes: Vec<MinuteBody>,
    /// Null when the campaign has no user-scope window or rate cap.
    per_user: Option<PerUserBody>,
    /// Candidates denied by each of its caps (by name; `budget`,
    /// `max_in_flight`, `unknown_user` too) since it was last defined.
    denied_by_cap: Vec<CapCount>,
    /// Open screen reservations holding one of its candidates now.
    reservations_open: u64,
    /// The dates it delivers in (the tightest flight of its chain); null
    /// without one.
    flight: Option<SpanBody>,
    /// Spans of the current period in which a schedule of its chain keeps
    /// it ineligible (off-hours), ordered; empty without a schedule.
    closed: Vec<SpanBody>,
}

#[derive(Serialize, JsonSchema)]
/// An interval of time, `[start, end)`, RFC 3339 (UTC).
pub(crate) struct SpanBody {
    start: String,
    end: String,
}

fn span((a, b): (crate::clock::Nanos, crate::clock::Nanos)) -> SpanBody {
    SpanBody {
        start: rfc3339(a),
        end: rfc3339(b),
    }
}

#[derive(Serialize, JsonSchema)]
pub(crate) struct CapCount {
    cap: String,
    /// Whom the cap counts for: `user`, `campaign` or another identity kind
    /// (`household`); absent for the budget and max_in_flight.
    #[serde(skip_serializing_if = "Option::is_none")]
    scope: Option<crate::model::Scope>,
    denied: u64,
}

#[derive(Serialize, JsonSchema)]
/// `GET /v1/campaigns`: every campaign's id, sorted.
pub(crate) struct CampaignList {
    campaigns: Vec<CampaignItem>,
}

#[derive(Serialize, JsonSchema)]
pub(crate) struct CampaignItem {
    id: String,
    /// Whether it has a budget (a pacing line to draw).
    budget: bool,
}

pub(crate) async fn campaigns<C: Clock + 'static>(State(s): St<C>) -> Json<CampaignList> {
    Json(CampaignList {
        campaigns: s
            .engine
            .campaign_list()
            .into_iter()
            .map(|(id, budget)| CampaignItem { id, budget })
            .collect(),
    })
}

pub(crate) async fn timeline<C: Clock + 'static>(
    State(s): St<C>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<TimelineBody>, FrontError> {
    id_param(&s, "id", &id)?;
    let e = s.engine.clone();
    let t = blocking(move || e.timeline(&id)).await?;
    Ok(Json(TimelineBody {
        campaign: t.campaign,
        tz: t.tz,
        period_start: rfc3339(t.period.0),
        period_end: rfc3339(t.period.1),
        previous_start: rfc3339(t.previous_start),
        now: rfc3339(t.now),
        amount: t.budget.as_ref().map(|b| b.0),
        pacing: t.budget.map(|b| b.1),
        pacing_line: t
            .pacing_line
            .into_iter()
            .map(|(at, cap)| PacingPoint {
                t: rfc3339(at),
                cap,
            })
            .collect(),
        levers: t.levers.map(Into::into),
        minutes: t
            .minutes
            .into_iter()
            .map(|m| MinuteBody {
                t: rfc3339(m.start),
                spend: m.bucket.spend,
                commits: m.bucket.commits,
                denied: m.bucket.denied,
            })
            .collect(),
        per_user: t.per_user.map(|p| PerUserBody {
            cap: p.cap,
            limit: p.limit,
            users: p.users,
        }),
        denied_by_cap: t
            .denied_by_cap
            .into_iter()
            .map(|(cap, scope, denied)| CapCount { cap, scope, denied })
            .collect(),
        reservations_open: t.reservations_open,
        flight: t.flight.map(span),
        closed: t.closed.into_iter().map(span).collect(),
    }))
}
