//! Messages to engine requests and engine answers to messages: the same
//! figures as the JSON bodies (docs/semantics.md §8), the same field names
//! in errors.

use serde::Deserialize;

use super::pb;
use crate::engine::{
    CapUsage, CheckOutcome, CheckRequest, CheckTarget, CommitOutcome, CommitRequest, Delivery,
    Event, ScreenCandidate, ScreenOutcome, ScreenRequest,
};
use crate::front::FrontError;
use crate::front::call::ms;
use crate::front::priority;
use crate::front::report::reported;
use crate::front::sample;
use crate::model::LimitDef;

/// Inline limit items, read through the JSON model so that every check
/// and every error (`limits[0].rate: ...`) is the JSON API's.
pub fn limits(items: Vec<pb::Limit>) -> Result<Vec<LimitDef>, FrontError> {
    #[derive(Deserialize)]
    struct Limits {
        limits: Vec<LimitDef>,
    }
    let list = limit_list("limits", items)?;
    definition::<Limits>(serde_json::json!({ "limits": list })).map(|l| l.limits)
}

/// A `CheckRequest` as the engine's. Exactly one of `policy` and `limits`,
/// refused naming `policy` in the JSON API's words; proto3 cannot tell an
/// absent `cost` from 0 without `optional`, so the field is optional and
/// absent means 1, JSON's default.
///
/// `header` is the call's `x-freqcap-priority` metadata, if sent.
pub fn check(r: pb::CheckRequest, header: Option<&[u8]>) -> Result<CheckRequest, FrontError> {
    let priority = priority::of_word(r.priority.as_deref(), header)?;
    let target = match (r.policy, r.limits.is_empty()) {
        (Some(p), true) => CheckTarget::Policy(p),
        (None, false) => CheckTarget::Inline(limits(r.limits)?),
        _ => {
            return Err(FrontError::invalid(
                "policy",
                "give exactly one of \"policy\" (a name) and \"limits\" (inline items)",
            ));
        }
    };
    Ok(CheckRequest {
        priority,
        target,
        key: r.key,
        cost: r.cost.unwrap_or(1),
        reserve: r.reserve,
        ttl_ms: r.ttl_ms,
        reservation_id: r.reservation_id,
        fingerprint: None,
    })
}

/// A check's answer: the figures HTTP's body carries ([`reported`]), so a
/// client moving between the fronts reads the same numbers
/// (`check_answers_equal_http` compares them step by step).
pub fn decision(out: &CheckOutcome) -> pb::Decision {
    let r = reported(out);
    pb::Decision {
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
            .map(|i| pb::Item {
                name: i.name.to_owned(),
                kind: i.kind.to_owned(),
                limit: i.limit,
                remaining: i.remaining,
                reset_after_ms: i.reset_after_ms,
                retry_after_ms: i.retry_after_ms,
                allowed: i.allowed,
            })
            .collect(),
    }
}

/// A `ScreenRequest` as the engine's; candidates keep their order, which
/// the answer's results follow. `header` as [`check`]'s.
pub fn screen(r: pb::ScreenRequest, header: Option<&[u8]>) -> Result<ScreenRequest, FrontError> {
    let (user, ids) = crate::engine::split_ids(r.user, sorted(r.ids))?;
    Ok(ScreenRequest {
        priority: priority::of_word(r.priority.as_deref(), header)?,
        user,
        ids,
        candidates: r
            .candidates
            .into_iter()
            .map(|c| ScreenCandidate {
                campaign: c.campaign,
                cost: c.cost,
            })
            .collect(),
        reserve: r.reserve,
        ttl_ms: r.ttl_ms,
        reservation_id: r.reservation_id,
        fingerprint: None,
    })
}

/// A screen's answer: one result per candidate, in order; campaign ids are
/// strings, as in JSON, so ids never go through a number type.
pub fn screened(out: ScreenOutcome) -> pb::ScreenResponse {
    pb::ScreenResponse {
        reservation: out.reservation,
        results: out
            .results
            .into_iter()
            .map(|r| pb::ScreenResult {
                campaign: r.campaign.to_string(),
                eligible: r.eligible,
                denied_by: r.denied_by.map(denied_by),
                would_deny: r.would_deny.map(denied_by),
                pacing: r.pacing.map(levers),
            })
            .collect(),
    }
}

/// A budget's pacing levers.
fn levers(l: crate::limits::budget::Levers) -> pb::PacingLevers {
    pb::PacingLevers {
        pass_probability: l.pass_probability(),
        bid_multiplier: l.bid_multiplier(),
    }
}

/// The cap that made a candidate ineligible (or would have, in shadow
/// mode), its wait in ms rounded up as every front reports durations.
fn denied_by(d: crate::engine::DeniedBy) -> pb::DeniedBy {
    pb::DeniedBy {
        campaign: d.campaign.to_string(),
        cap: d.cap,
        retry_after_ms: d.retry_after.map(ms),
    }
}

/// A commit: the winners named in `campaign` (empty when the screen had
/// one eligible candidate), the clearing price as `cost`, and, for a late
/// commit, the user (docs/semantics.md §4.6).
pub fn commit(r: &pb::CommitRequest) -> Result<CommitRequest, FrontError> {
    let (user, ids) = crate::engine::split_ids(r.user.clone(), sorted(r.ids.clone()))?;
    Ok(CommitRequest {
        campaigns: r.campaign.clone(),
        cost: r.cost,
        event_id: r.event_id.clone(),
        user,
        ids,
        sample: sample::of(r.latency_ms.map(|ms| ms as f64), r.outcome.as_deref())?,
    })
}

/// How a reservation was settled, its outcome as the JSON API's word
/// (`committed`, `released`, `late_commit`).
pub fn settled(o: CommitOutcome) -> pb::Settled {
    pb::Settled {
        reservation: o.reservation,
        outcome: o.outcome.as_str().to_owned(),
        campaigns: o.campaigns.iter().map(|c| c.to_string()).collect(),
    }
}

/// An event (an impression counted outside a reservation); an absent
/// `cost` is 1, as over JSON.
pub fn event(e: pb::Event) -> Result<Event, FrontError> {
    let (user, ids) = crate::engine::split_ids(e.user, sorted(e.ids))?;
    Ok(Event {
        user,
        ids,
        campaign: e.campaign,
        cost: e.cost.unwrap_or(1),
        event_id: e.event_id,
        event_type: e.r#type,
    })
}

/// A protobuf map's entries in key order, as JSON's object gives them: an
/// error then names the same identity first whichever front it came in.
fn sorted(m: std::collections::HashMap<String, String>) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = m.into_iter().collect();
    v.sort();
    v
}

/// A user's caps on a campaign. The scope is written through serde, so its
/// word is the JSON API's (`user`, `campaign`) and cannot drift from it.
pub fn usage(user: String, campaign: String, kind: String, caps: Vec<CapUsage>) -> pb::Usage {
    pb::Usage {
        user,
        campaign,
        kind,
        caps: caps
            .into_iter()
            .map(|c| pb::CapUsage {
                campaign: c.campaign,
                name: c.name,
                scope: serde_json::to_value(c.scope)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default(),
                kind: c.kind.to_owned(),
                limit: c.limit,
                used: c.used,
                pending: c.pending,
                remaining: c.remaining,
                reset_after_ms: ms(c.reset_after),
                event: c.event.to_string(),
            })
            .collect(),
    }
}

/// A campaign's delivery. `pacing` is the JSON of the budget's pacing (a
/// word or an object, whose shape varies by mode), so a string holding
/// JSON rather than a message per mode; the period bounds are RFC 3339, as
/// HTTP's.
pub fn delivery(d: Delivery, pacing: serde_json::Value) -> pb::Delivery {
    pb::Delivery {
        campaign: d.campaign,
        amount: d.amount,
        spent: d.spent,
        pending: d.pending,
        cap_now: d.cap_now,
        pacing: pacing.to_string(),
        period_start: crate::front::call::rfc3339(d.period_start),
        period_end: crate::front::call::rfc3339(d.period_end),
        levers: d.levers.map(levers),
    }
}

// ---- definitions (the Admin service) ----

/// Flat `Limit`s as a JSON list; `field` names the list in errors.
fn limit_list(field: &str, items: Vec<pb::Limit>) -> Result<serde_json::Value, FrontError> {
    items
        .into_iter()
        .enumerate()
        .map(|(i, l)| limit_json(&format!("{field}[{i}]"), l))
        .collect()
}

/// A flat `Limit` as its JSON object (an empty `kind` is left out: a
/// campaign's budget may omit it); `field` names it in errors.
fn limit_json(field: &str, l: pb::Limit) -> Result<serde_json::Value, FrontError> {
    use serde_json::{Map, Value};
    // JSON has no NaN or infinity: serde_json would turn them into null,
    // which reads as "not given" and would be dropped silently.
    let tolerance = match l.tolerance {
        Some(t) if !t.is_finite() => {
            return Err(FrontError::invalid(
                &format!("{field}.tolerance"),
                format!("must be a fraction from 0 to 1, got {t}"),
            ));
        }
        t => t,
    };
    // An adaptive item's floor is a count, carried as decimal text.
    let count = l.kind == "adaptive";
    let mut m = Map::new();
    if !l.kind.is_empty() {
        m.insert("kind".into(), Value::from(l.kind));
    }
    let mut put = |k: &str, v: Option<Value>| {
        if let Some(v) = v {
            m.insert(k.into(), v);
        }
    };
    put("scope", l.scope.map(Value::from));
    put("missing", l.missing.map(Value::from));
    put("event", l.event.map(Value::from));
    put("name", l.name.map(Value::from));
    put("rate", l.rate.map(Value::from));
    put("per", l.per.map(Value::from));
    put("burst", l.burst.map(Value::from));
    put(
        "min",
        l.min.map(|m| match m.parse::<u64>() {
            Ok(n) if count => Value::from(n),
            _ => Value::from(m),
        }),
    );
    put("limit", l.limit.map(Value::from));
    put("window", l.window.map(Value::from));
    put("align", l.align.map(Value::from));
    put("tz", l.tz.map(Value::from));
    put("precision", l.precision.map(Value::from));
    put("amount", l.amount.map(Value::from));
    // A mode name, or an object as JSON text.
    put(
        "pacing",
        l.pacing.map(|p| {
            if p.trim_start().starts_with('{') {
                serde_json::from_str(&p).unwrap_or(Value::from(p))
            } else {
                Value::from(p)
            }
        }),
    );
    put("tolerance", tolerance.map(Value::from));
    put("max", l.max.map(Value::from));
    put("initial", l.initial.map(Value::from));
    put("algorithm", l.algorithm.map(Value::from));
    put("goal", l.goal.map(Value::from));
    if let Some(b) = l.backoff {
        let n = serde_json::Number::from_f64(b).ok_or_else(|| {
            FrontError::invalid(
                &format!("{field}.backoff"),
                format!("must be a number from 0.5 to 0.99, got {b}"),
            )
        })?;
        m.insert("backoff".into(), Value::Number(n));
    }
    if !l.priorities.is_empty() {
        let mut shares = Map::new();
        for (class, share) in l.priorities {
            // NaN or infinite has no JSON form; say so rather than drop it.
            let n = serde_json::Number::from_f64(share).ok_or_else(|| {
                FrontError::invalid(
                    &format!("{field}.priorities.{class}"),
                    format!("must be a share above 0 and at most 1, got {share}"),
                )
            })?;
            shares.insert(class, Value::Number(n));
        }
        m.insert("priorities".into(), Value::Object(shares));
    }
    Ok(Value::Object(m))
}

/// A limit item's JSON object as the flat message.
fn limit_of(v: &serde_json::Value) -> pb::Limit {
    let s = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_owned);
    let n = |k: &str| v.get(k).and_then(serde_json::Value::as_u64);
    pb::Limit {
        kind: s("kind").unwrap_or_default(),
        name: s("name"),
        rate: n("rate"),
        per: s("per"),
        burst: n("burst"),
        min: s("min").or_else(|| n("min").map(|c| c.to_string())),
        limit: n("limit"),
        window: s("window"),
        align: s("align"),
        tz: s("tz"),
        precision: s("precision"),
        amount: n("amount"),
        pacing: v.get("pacing").map(|p| match p.as_str() {
            Some(mode) => mode.to_owned(),
            None => p.to_string(),
        }),
        tolerance: v.get("tolerance").and_then(serde_json::Value::as_f64),
        max: n("max"),
        initial: n("initial"),
        algorithm: s("algorithm"),
        backoff: v.get("backoff").and_then(serde_json::Value::as_f64),
        scope: s("scope"),
        missing: s("missing"),
        event: s("event"),
        goal: s("goal"),
        priorities: v
            .get("priorities")
            .and_then(serde_json::Value::as_object)
            .map(|o| {
                o.iter()
                    .filter_map(|(k, x)| Some((k.clone(), x.as_f64()?)))
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// A definition through the JSON model's own parser: the proto message is
/// turned into the JSON HTTP accepts, so one validator names the bad field
/// (docs/grpc.md) and no rule is written twice.
fn definition<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> Result<T, FrontError> {
    crate::model::from_json::<T>(&v.to_string())
        .map_err(|e| FrontError::invalid(&e.field, e.message))
}

/// A policy message as the model's `PolicyDef`; a bad field is
/// INVALID_ARGUMENT naming it as HTTP's 400 does.
pub fn policy_def(p: pb::Policy) -> Result<crate::model::PolicyDef, FrontError> {
    let mut m = serde_json::Map::new();
    m.insert("limits".into(), limit_list("limits", p.limits)?);
    if let Some(o) = p.on_limit {
        m.insert("on_limit".into(), o.into());
    }
    if let Some(d) = p.max_delay_ms {
        m.insert("max_delay_ms".into(), d.into());
    }
    definition(serde_json::Value::Object(m))
}

/// A campaign message as the model's `CampaignDef`, unset fields left out
/// so the JSON defaults apply (`unknown_user`, `tz`) as over HTTP.
pub fn campaign_def(c: pb::Campaign) -> Result<crate::model::CampaignDef, FrontError> {
    let mut m = serde_json::Map::new();
    if let Some(p) = c.parent {
        m.insert("parent".into(), p.into());
    }
    if let Some(t) = c.tz {
        m.insert("tz".into(), t.into());
    }
    if !c.caps.is_empty() {
        m.insert("caps".into(), limit_list("caps", c.caps)?);
    }
    if let Some(b) = c.budget {
        m.insert("budget".into(), limit_json("budget", b)?);
    }
    if let Some(x) = c.max_in_flight {
        m.insert("max_in_flight".into(), x.into());
    }
    if let Some(u) = c.unknown_user {
        m.insert("unknown_user".into(), u.into());
    }
    if !c.exclusion_labels.is_empty() {
        m.insert("exclusion_labels".into(), c.exclusion_labels.into());
    }
    if let Some(n) = c.max_per_screen {
        m.insert("max_per_screen".into(), n.into());
    }
    if let Some(b) = c.pacing_levers {
        m.insert("pacing_levers".into(), b.into());
    }
    if let Some(sc) = c.schedule {
        let hours: Vec<serde_json::Value> = sc
            .hours
            .into_iter()
            .map(|h| serde_json::json!({"days": h.days, "from": h.from, "until": h.until}))
            .collect();
        let mut o = serde_json::Map::new();
        if let Some(tz) = sc.tz {
            o.insert("tz".into(), tz.into());
        }
        o.insert("hours".into(), hours.into());
        m.insert("schedule".into(), serde_json::Value::Object(o));
    }
    if !c.ignore_caps.is_empty() {
        m.insert("ignore_caps".into(), c.ignore_caps.into());
    }
    if let Some(f) = c.flight {
        m.insert(
            "flight".into(),
            serde_json::json!({"start": f.start, "end": f.end}),
        );
    }
    definition(serde_json::Value::Object(m))
}

/// A stored policy as its message: through its JSON form, the one shape
/// `GET /v1/policies/{name}` answers, so both fronts show the same fields.
pub fn policy(p: &crate::model::PolicyDef) -> pb::Policy {
    let v = serde_json::to_value(p).unwrap_or_default();
    pb::Policy {
        limits: v["limits"]
            .as_array()
            .map_or_else(Vec::new, |l| l.iter().map(limit_of).collect()),
        on_limit: v["on_limit"].as_str().map(str::to_owned),
        max_delay_ms: v["max_delay_ms"].as_u64(),
    }
}

/// A stored campaign as its message, through its JSON form as [`policy`].
pub fn campaign(c: &crate::model::CampaignDef) -> pb::Campaign {
    let v = serde_json::to_value(c).unwrap_or_default();
    pb::Campaign {
        parent: v["parent"].as_str().map(str::to_owned),
        tz: v["tz"].as_str().map(str::to_owned),
        caps: v["caps"]
            .as_array()
            .map_or_else(Vec::new, |l| l.iter().map(limit_of).collect()),
        budget: v.get("budget").filter(|b| b.is_object()).map(limit_of),
        max_in_flight: v["max_in_flight"].as_u64(),
        unknown_user: v["unknown_user"].as_str().map(str::to_owned),
        exclusion_labels: c.exclusion_labels.clone(),
        max_per_screen: c.max_per_screen,
        pacing_levers: c.pacing_levers,
        schedule: c.schedule.as_ref().map(|sc| pb::Schedule {
            tz: sc.tz.clone(),
            hours: sc
                .hours
                .iter()
                .map(|h| pb::ScheduleHours {
                    days: h.days.iter().map(|d| d.as_str().to_owned()).collect(),
                    from: h.from.clone(),
                    until: h.until.clone(),
                })
                .collect(),
        }),
        ignore_caps: c.ignore_caps.clone(),
        flight: c.flight.as_ref().map(|f| pb::Flight {
            start: f.start.clone(),
            end: f.end.clone(),
        }),
    }
}

/// A forecast request as the JSON body `POST /v1/forecast` takes, so the
/// same checks name the same fields.
pub fn forecast_request(
    r: pb::ForecastRequest,
) -> Result<crate::api::forecast::ForecastBody, FrontError> {
    use serde_json::{Map, Value};
    let mut campaigns = Vec::with_capacity(r.campaigns.len());
    for (i, c) in r.campaigns.into_iter().enumerate() {
        let def = match c.campaign {
            Some(def) => campaign_def(def)?,
            None => {
                return Err(FrontError::invalid(
                    &format!("campaigns[{i}].campaign"),
                    "is required",
                ));
            }
        };
        let mut m = Map::new();
        m.insert("id".into(), c.id.into());
        if let Some(ctr) = c.ctr {
            let n = serde_json::Number::from_f64(ctr).ok_or_else(|| {
                FrontError::invalid(
                    &format!("campaigns[{i}].ctr"),
                    format!("must be a number from 0 to 1, got {ctr}"),
                )
            })?;
            m.insert("ctr".into(), Value::Number(n));
        }
        if let Some(cost) = c.click_cost {
            m.insert("click_cost".into(), cost.into());
        }
        if let Some(cost) = c.cost {
            m.insert("cost".into(), cost.into());
        }
        m.insert(
            "campaign".into(),
            serde_json::to_value(def).map_err(FrontError::internal)?,
        );
        campaigns.push(Value::Object(m));
    }
    let t = r.traffic.unwrap_or_default();
    let mut traffic = Map::new();
    traffic.insert("requests".into(), t.requests.into());
    traffic.insert("users".into(), t.users.into());
    traffic.insert("households".into(), t.households.into());
    let mut put = |k: &str, v: Option<Value>| {
        if let Some(v) = v {
            traffic.insert(k.into(), v);
        }
    };
    put("start", t.start.map(Value::from));
    put("days", t.days.map(Value::from));
    put("tz", t.tz.map(Value::from));
    put("zipf", t.zipf.map(Value::from));
    put("candidates", t.candidates.map(Value::from));
    put(
        "diurnal",
        (!t.diurnal.is_empty()).then(|| Value::from(t.diurnal)),
    );
    put("seed", t.seed.map(Value::from));
    put("lost_share", t.lost_share.map(Value::from));
    let mut body = Map::new();
    body.insert("campaigns".into(), Value::Array(campaigns));
    body.insert("traffic".into(), Value::Object(traffic));
    if let Some(s) = r.sample {
        body.insert("sample".into(), s.into());
    }
    serde_json::from_value(Value::Object(body)).map_err(|e| FrontError::invalid("", e))
}

/// A forecast as its message.
pub fn forecast(f: crate::simulate::forecast::Forecast) -> pb::Forecast {
    pb::Forecast {
        sample: f.sample,
        requests: f.requests,
        sampled_requests: f.sampled_requests,
        wall_ms: f.wall_ms,
        largest_unit_share: f.largest_unit_share,
        campaigns: f
            .campaigns
            .into_iter()
            .map(|c| pb::CampaignForecast {
                id: c.id,
                impressions: c.impressions,
                spend: c.spend,
                users: c.users,
                households: c.households,
                days: c
                    .days
                    .into_iter()
                    .map(|d| pb::ForecastDay {
                        day: d.day,
                        impressions: d.impressions,
                        spend: d.spend,
                        users: d.users,
                        households: d.households,
                    })
                    .collect(),
                frequency: c
                    .frequency
                    .into_iter()
                    .map(|b| pb::FrequencyBucket {
                        impressions: b.impressions,
                        share: b.share,
                    })
                    .collect(),
            })
            .collect(),
    }
}
