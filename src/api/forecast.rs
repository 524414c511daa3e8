//! `POST /v1/forecast`: a forecast of a few campaigns on modelled traffic,
//! small enough to answer in one call (docs/forecast.md). The engine that
//! decides it is a fresh one on a memory store and a virtual clock, not the
//! service's: nothing of the service's state is read or changed.

use std::sync::atomic::{AtomicBool, Ordering};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use schemars::JsonSchema;
use serde::Deserialize;

use super::request::*;
use crate::clock::{MS, SECOND};
use crate::front::FrontError;
use crate::model::CampaignDef;
use crate::simulate::forecast::{Forecast, check_sample, forecast};
use crate::simulate::{
    DEFAULT_DIURNAL, Generator, RunOptions, SimCampaign, SimError, Synthetic, local_days,
};

/// The most requests one call may decide (traffic × days × sample): a
/// forecast of 200 000 requests took 0.87 s of a core here (4 campaigns,
/// `freqcap forecast --requests 200000 --sample 1`); larger ones are the
/// command's (`freqcap forecast`).
pub const MAX_FORECAST_REQUESTS: f64 = 200_000.0;
/// The most campaigns, users and days one call may name.
pub const MAX_FORECAST_CAMPAIGNS: usize = 100;
pub const MAX_FORECAST_USERS: u32 = 1_000_000;
pub const MAX_FORECAST_DAYS: u32 = 7;

/// One forecast at a time: each takes a core for up to seconds.
static RUNNING: AtomicBool = AtomicBool::new(false);

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
/// A campaign to forecast, as `PUT /v1/campaigns/{id}` takes it.
pub struct ForecastCampaign {
    id: String,
    /// Cost of one impression, charged to budgets; default 1.
    #[serde(default)]
    #[schemars(range(min = 1, max = crate::MAX_EXACT))]
    cost: Option<u64>,
    /// The share of its impressions followed by a click event, 0 to 1;
    /// default 0 (docs/forecast.md).
    #[serde(default)]
    #[schemars(range(min = 0.0, max = 1.0))]
    ctr: Option<f64>,
    /// Cost of one click, charged to budgets counting clicks; default
    /// `cost`.
    #[serde(default)]
    #[schemars(range(min = 1, max = crate::MAX_EXACT))]
    click_cost: Option<u64>,
    campaign: CampaignDef,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
/// Modelled traffic (`freqcap simulate --synthetic`'s): Poisson arrivals
/// on a diurnal curve, Zipf-distributed users.
pub struct TrafficBody {
    /// Mean requests per day.
    requests: f64,
    /// Distinct users, at most 1 000 000.
    #[schemars(range(min = 1, max = 1_000_000))]
    users: u32,
    /// Households the users live in (user rank modulo this); default none.
    #[serde(default)]
    households: u32,
    /// First local day, YYYY-MM-DD; default 2026-01-05.
    #[serde(default)]
    start: Option<String>,
    /// Days, 1 to 7; default 1.
    #[serde(default)]
    #[schemars(range(min = 1, max = 7))]
    days: Option<u32>,
    /// Zone of the diurnal curve and the days; default UTC.
    #[serde(default)]
    tz: Option<String>,
    /// Zipf exponent of user activity; default 1.
    #[serde(default)]
    zipf: Option<f64>,
    /// Candidate campaigns per request; default 3.
    #[serde(default)]
    candidates: Option<usize>,
    /// 24 weights of traffic by local hour.
    #[serde(default)]
    diurnal: Option<Vec<f64>>,
    /// Seed of the traffic, the sample and the lost auctions; default 1.
    #[serde(default)]
    seed: Option<u64>,
    /// Share of reservations never committed, 0 to 1; default 0.1.
    #[serde(default)]
    lost_share: Option<f64>,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
/// `POST /v1/forecast`.
pub struct ForecastBody {
    /// The campaigns, parents before their children (1 to 100).
    campaigns: Vec<Object<ForecastCampaign>>,
    traffic: TrafficBody,
    /// The share of users (households) to decide, more than 0 and at most
    /// 1; default 1 (the whole traffic).
    #[serde(default)]
    sample: Option<f64>,
}

/// A [`SimError`] as the API's 400: its text starts with the field it names.
fn refused(e: SimError) -> FrontError {
    let (field, message) = e.0.split_once(": ").unwrap_or(("", &e.0));
    FrontError::invalid(field, message)
}

/// Frees the one forecast slot when the call ends, however it ends.
struct Slot;

impl Drop for Slot {
    fn drop(&mut self) {
        RUNNING.store(false, Ordering::Release);
    }
}

pub(crate) async fn forecast_endpoint(
    b: Result<Bytes, BytesRejection>,
) -> Result<Response, FrontError> {
    let b: ForecastBody = body(b)?;
    Ok(Json::<Forecast>(run_forecast(b).await?).into_response())
}

/// Checks a forecast, then runs it off the async threads, one at a time
/// (HTTP's and gRPC's).
pub async fn run_forecast(b: ForecastBody) -> Result<Forecast, FrontError> {
    let (campaigns, traffic, opts, rate, seed) = prepare(b).map_err(refused)?;
    if RUNNING
        .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        return Err(FrontError::overloaded(
            "forecast: another forecast is running; retry when it is done",
        ));
    }
    let slot = Slot;
    tokio::task::spawn_blocking(move || {
        let _slot = slot;
        forecast(&campaigns, traffic, opts, rate, seed)
    })
    .await
    .map_err(|_| FrontError::internal("the forecast stopped"))?
    .map_err(refused)
}

type Prepared = (Vec<SimCampaign>, Generator, RunOptions, f64, u64);

/// Checks the body, naming the field, and builds what the run needs.
fn prepare(b: ForecastBody) -> Result<Prepared, SimError> {
    let t = b.traffic;
    let rate = b.sample.unwrap_or(1.0);
    check_sample("sample", rate)?;
    if b.campaigns.is_empty() || b.campaigns.len() > MAX_FORECAST_CAMPAIGNS {
        return Err(SimError(format!(
            "campaigns: 1 to {MAX_FORECAST_CAMPAIGNS} campaigns, got {}",
            b.campaigns.len()
        )));
    }
    let days = t.days.unwrap_or(1);
    if !(1..=MAX_FORECAST_DAYS).contains(&days) {
        return Err(SimError(format!(
            "traffic.days: 1 to {MAX_FORECAST_DAYS}, got {days}"
        )));
    }
    if !(1..=MAX_FORECAST_USERS).contains(&t.users) {
        return Err(SimError(format!(
            "traffic.users: 1 to {MAX_FORECAST_USERS}, got {}",
            t.users
        )));
    }
    let decided = t.requests * f64::from(days) * rate;
    if !(t.requests.is_finite() && t.requests > 0.0) || decided > MAX_FORECAST_REQUESTS {
        return Err(SimError(format!(
            "traffic.requests: more than 0, and at most {MAX_FORECAST_REQUESTS} decided in \
             all (requests × days × sample = {decided}); larger forecasts are `freqcap forecast`'s"
        )));
    }
    let lost = t.lost_share.unwrap_or(0.1);
    if !(0.0..=1.0).contains(&lost) {
        return Err(SimError(format!(
            "traffic.lost_share: from 0 to 1, got {lost}"
        )));
    }
    let mut campaigns: Vec<SimCampaign> = Vec::with_capacity(b.campaigns.len());
    for (i, Object(c)) in b.campaigns.into_iter().enumerate() {
        if campaigns.iter().any(|o| o.id == c.id) {
            return Err(SimError(format!(
                "campaigns[{i}].id: {:?} is used twice",
                c.id
            )));
        }
        if let Some(p) = &c.campaign.parent
            && !campaigns.iter().any(|o| o.id == *p)
        {
            return Err(SimError(format!(
                "campaigns[{i}].campaign.parent: {p:?} is not a campaign listed before it"
            )));
        }
        let cost = c.cost.unwrap_or(1);
        if cost == 0 || cost > crate::MAX_EXACT {
            return Err(SimError(format!(
                "campaigns[{i}].cost: from 1 to 2^53 - 1, got {cost}"
            )));
        }
        let sim = SimCampaign::new(&c.id, cost, c.campaign)
            .map_err(|e| SimError(format!("campaigns[{i}].campaign: {e}")))?;
        let sim = sim
            .with_clicks(c.ctr.unwrap_or(0.0), c.click_cost.unwrap_or(cost))
            .map_err(|e| SimError(format!("campaigns[{i}].{}", e.0)))?;
        campaigns.push(sim);
    }
    let tz_name = t.tz.unwrap_or_else(|| "UTC".into());
    let tz = jiff::tz::TimeZone::get(&tz_name)
        .map_err(|_| SimError(format!("traffic.tz: unknown zone {tz_name:?}")))?;
    let start = t.start.unwrap_or_else(|| "2026-01-05".into());
    let (start, end) =
        local_days(&start, days, &tz).map_err(|e| SimError(format!("traffic.{}", e.0)))?;
    let diurnal = match t.diurnal {
        None => DEFAULT_DIURNAL,
        Some(v) => <[f64; 24]>::try_from(v.as_slice())
            .map_err(|_| SimError(format!("traffic.diurnal: 24 weights, got {}", v.len())))?,
    };
    let seed = t.seed.unwrap_or(1);
    let generator = Generator::new(Synthetic {
        start,
        end,
        tz,
        requests_per_day: t.requests,
        diurnal,
        users: t.users,
        zipf_s: t.zipf.unwrap_or(1.0),
        households: t.households,
        candidates: t.candidates.unwrap_or(3),
        campaigns: campaigns.len(),
        seed,
    })
    .map_err(|e| SimError(format!("traffic.{e}")))?;
    let opts = RunOptions {
        commit_delay: 200 * MS,
        lost_share: lost,
        ttl_ms: 60_000,
        sample_every: 3600 * SECOND,
        seed,
        start,
        end,
    };
    Ok((campaigns, generator, opts, rate, seed))
}
