//! `freqcap forecast` and `POST /v1/forecast` (docs/forecast.md): what
//! each campaign would deliver, per day, under all its caps and pacing,
//! from past or modelled traffic, before it is booked.
//!
//! The real engine decides on a virtual clock ([`super::Runner`]), on a
//! sample of the traffic: a request is kept when its household (or, without
//! one, its user) hashes below the sample rate, so every user and household
//! kept is kept whole and per-user and per-household caps decide exactly
//! as in full. What all users share (budgets, campaign caps,
//! max_in_flight) is scaled by the rate, and what the sample delivers is
//! scaled back. The hash sample is the sketch for uniques: the distinct
//! users (households) a campaign reaches in it, divided by the rate, is an
//! unbiased count of those it reaches in full, in memory proportional to
//! the sample. The frequency distribution (impressions per user and day)
//! is the sample's, as shares.

use std::collections::{BTreeMap, HashSet};
use std::time::Instant;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::clock::Nanos;
use crate::model::campaign::{CampaignBudget, Scope};
use crate::model::limit::LimitDef;

use super::runner::{CampaignStats, RunOptions, RunStats, Runner};
use super::traffic::Request;
use super::{SimCampaign, SimError};

/// The most impressions per user and day the frequency distribution lists
/// one by one; the last bucket counts that many or more.
pub const FREQUENCY_BUCKETS: u32 = 10;

/// Above this share of the decided requests from one unit, a forecast
/// warns that its sample is too small: at 0.1 of 1 M requests with Zipf
/// users, shares of 0.12–0.29 came with errors of 5–45 % on a campaign,
/// shares of 0.01–0.02 (and 0.04 in `tests/forecast.rs`) with errors under
/// 5 % (docs/forecast.md).
pub const LARGEST_UNIT_WARNING: f64 = 0.05;

/// What a campaign would deliver.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CampaignForecast {
    pub id: String,
    /// Over the whole span: impressions, budget spend, and the distinct
    /// users (households, when the traffic names them) reached.
    pub impressions: u64,
    pub spend: u64,
    pub users: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub households: Option<u64>,
    /// Per local day of the campaign's zone, in order.
    pub days: Vec<DayForecast>,
    /// Of the users reached on a day, the share that saw it 1, 2, …
    /// times that day (the last: `FREQUENCY_BUCKETS` or more).
    pub frequency: Vec<FrequencyBucket>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DayForecast {
    /// The local date, `YYYY-MM-DD`.
    pub day: String,
    pub impressions: u64,
    pub spend: u64,
    pub users: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub households: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FrequencyBucket {
    /// Impressions per user and day (the last bucket: this many or more).
    pub impressions: u32,
    /// The share of reached user-days, 0 to 1.
    pub share: f64,
}

/// A forecast, and how it was made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Forecast {
    /// The share of users (households) decided, 0 < sample ≤ 1.
    pub sample: f64,
    /// Requests in the traffic, and those the sample decided.
    pub requests: u64,
    pub sampled_requests: u64,
    /// Wall time of the run, in ms.
    pub wall_ms: u64,
    /// The largest share of the decided requests that one household (or
    /// user) made. A sample is only as good as its units are small: when a
    /// few make much of the traffic (bots, a Zipf exponent of 1), whether
    /// they fall in the sample moves every figure. Above
    /// [`LARGEST_UNIT_WARNING`], use a larger sample (docs/forecast.md,
    /// "Accuracy").
    #[serde(default)]
    pub largest_unit_share: f64,
    pub campaigns: Vec<CampaignForecast>,
}

/// A forecast against a full run of the same traffic: the relative error
/// of each campaign's impressions, spend and users (|forecast − full| /
/// full; 0 when both are 0).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ForecastError {
    pub campaigns: Vec<CampaignError>,
    /// The largest of the campaigns' impression errors, and the mean
    /// weighted by full impressions.
    pub max_impressions: f64,
    pub weighted_impressions: f64,
    /// The largest spend and users errors.
    pub max_spend: f64,
    pub max_users: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CampaignError {
    pub id: String,
    pub impressions: f64,
    pub spend: f64,
    pub users: f64,
}

/// Whether a request of `unit` (its household, else its user) is in a
/// sample of `rate`: its keyed hash below `rate` of the hash space. The
/// same unit is in or out on every request, on every run with `seed`.
pub fn in_sample(unit: &str, rate: f64, seed: u64) -> bool {
    use std::hash::Hasher;
    if rate >= 1.0 {
        return true;
    }
    let mut h = siphasher::sip::SipHasher13::new_with_keys(seed, 0x666f_7265_6361_7374);
    h.write(unit.as_bytes());
    (h.finish() as f64) < rate * 18_446_744_073_709_551_616.0
}

/// Checks a sample rate, naming `field`.
pub fn check_sample(field: &str, rate: f64) -> Result<(), SimError> {
    if !(rate.is_finite() && rate > 0.0 && rate <= 1.0) {
        return Err(SimError(format!(
            "{field}: must be more than 0 and at most 1, got {rate}"
        )));
    }
    Ok(())
}

/// `n` scaled by `rate`, rounded, at least 1.
fn scale(n: u64, rate: f64) -> u64 {
    ((n as f64 * rate).round() as u64).max(1)
}

/// The campaigns with what all users share scaled by `rate`: budget
/// amounts, campaign-scope window limits and rates (with their bursts),
/// max_in_flight. A campaign-scope `gap` is left as it is: its spacing
/// holds whatever the traffic, so a sample sees it as a fleet would not
/// (docs/forecast.md, "Accuracy").
pub fn scaled(campaigns: &[SimCampaign], rate: f64) -> Result<Vec<SimCampaign>, SimError> {
    if rate >= 1.0 {
        return Ok(campaigns.to_vec());
    }
    campaigns
        .iter()
        .map(|c| {
            let mut def = c.def.clone();
            for cap in &mut def.caps {
                if cap.scope() != Scope::Campaign {
                    continue;
                }
                match &mut cap.limit {
                    LimitDef::Window(w) => w.limit = scale(w.limit, rate),
                    LimitDef::Rate(r) => {
                        r.rate = scale(r.rate, rate);
                        r.burst = r.burst.map(|b| scale(b, rate));
                    }
                    _ => {}
                }
            }
            if let Some(CampaignBudget {
                limit: LimitDef::Budget(b),
                ..
            }) = &mut def.budget
            {
                b.amount = scale(b.amount, rate);
            }
            def.max_in_flight = def.max_in_flight.map(|m| scale(m, rate));
            let s = SimCampaign::new(&c.id, c.cost, def)?;
            match c.clicks {
                Some(k) => s.with_clicks(k.ctr, k.cost),
                None => Ok(s),
            }
        })
        .collect()
}

/// Runs `traffic` through the engine on a sample of `rate` and forecasts
/// each campaign's delivery.
pub fn forecast(
    campaigns: &[SimCampaign],
    traffic: impl Iterator<Item = Request>,
    opts: RunOptions,
    rate: f64,
    seed: u64,
) -> Result<Forecast, SimError> {
    check_sample("sample", rate)?;
    let t0 = Instant::now();
    let sampled = scaled(campaigns, rate)?;
    let mut requests = 0u64;
    let mut per_unit: std::collections::HashMap<String, u64> = Default::default();
    let kept = traffic.filter(|r| {
        requests += 1;
        let unit = r.household.as_ref().map_or(&r.user_name, |(_, h)| h);
        let keep = in_sample(unit, rate, seed);
        if keep {
            *per_unit.entry(unit.clone()).or_insert(0) += 1;
        }
        keep
    });
    let stats = Runner::new(&sampled, opts)?.run(kept)?;
    let largest = per_unit.values().copied().max().unwrap_or(0);
    Ok(Forecast {
        sample: rate,
        requests,
        sampled_requests: stats.requests,
        wall_ms: t0.elapsed().as_millis() as u64,
        largest_unit_share: if stats.requests == 0 {
            0.0
        } else {
            largest as f64 / stats.requests as f64
        },
        campaigns: campaigns
            .iter()
            .zip(&stats.campaigns)
            .map(|(c, st)| campaign_forecast(c, st, &stats, rate))
            .collect(),
    })
}

/// `n` of a sample of `rate`, scaled back to the whole.
fn unscale(n: u64, rate: f64) -> u64 {
    (n as f64 / rate).round() as u64
}

fn campaign_forecast(
    c: &SimCampaign,
    st: &CampaignStats,
    _run: &RunStats,
    rate: f64,
) -> CampaignForecast {
    let named_households = !st.per_household_day.is_empty();
    let mut days: BTreeMap<Nanos, (u64, u64, u64)> = BTreeMap::new();
    let mut histogram = vec![0u64; FREQUENCY_BUCKETS as usize];
    for (&(_, day), &n) in &st.per_user_day {
        let d = days.entry(day).or_default();
        d.0 += u64::from(n);
        d.1 += 1;
        let b = n.clamp(1, FREQUENCY_BUCKETS) as usize - 1;
        histogram[b] += 1;
    }
    for &(_, day) in st.per_household_day.keys() {
        days.entry(day).or_default().2 += 1;
    }
    let user_days: u64 = histogram.iter().sum();
    let users: HashSet<u32> = st.per_user_day.keys().map(|&(u, _)| u).collect();
    let households: HashSet<u32> = st.per_household_day.keys().map(|&(h, _)| h).collect();
    let impressions: u64 = days.values().map(|d| d.0).sum();
    CampaignForecast {
        id: c.id.clone(),
        impressions: unscale(impressions, rate),
        spend: unscale(impressions * c.cost, rate),
        users: unscale(users.len() as u64, rate),
        households: named_households.then(|| unscale(households.len() as u64, rate)),
        days: days
            .into_iter()
            .map(|(day, (imps, u, h))| DayForecast {
                day: local_date(c, day),
                impressions: unscale(imps, rate),
                spend: unscale(imps * c.cost, rate),
                users: unscale(u, rate),
                households: named_households.then(|| unscale(h, rate)),
            })
            .collect(),
        frequency: histogram
            .iter()
            .enumerate()
            .map(|(i, &n)| FrequencyBucket {
                impressions: i as u32 + 1,
                share: if user_days == 0 {
                    0.0
                } else {
                    n as f64 / user_days as f64
                },
            })
            .collect(),
    }
}

/// The local date of instant `t` in the campaign's zone.
fn local_date(c: &SimCampaign, t: Nanos) -> String {
    jiff::Timestamp::from_nanosecond(i128::from(t))
        .map(|ts| ts.to_zoned(c.tz.clone()).date().to_string())
        .unwrap_or_default()
}

/// How far `f` is from `full`, campaign by campaign.
pub fn error_against(f: &Forecast, full: &Forecast) -> ForecastError {
    let rel = |a: u64, b: u64| {
        if b == 0 {
            if a == 0 { 0.0 } else { 1.0 }
        } else {
            (a as f64 - b as f64).abs() / b as f64
        }
    };
    let campaigns: Vec<CampaignError> = f
        .campaigns
        .iter()
        .zip(&full.campaigns)
        .map(|(a, b)| CampaignError {
            id: a.id.clone(),
            impressions: rel(a.impressions, b.impressions),
            spend: rel(a.spend, b.spend),
            users: rel(a.users, b.users),
        })
        .collect();
    let total: u64 = full.campaigns.iter().map(|c| c.impressions).sum();
    let weighted = if total == 0 {
        0.0
    } else {
        campaigns
            .iter()
            .zip(&full.campaigns)
            .map(|(e, c)| e.impressions * c.impressions as f64)
            .sum::<f64>()
            / total as f64
    };
    let max = |g: fn(&CampaignError) -> f64| campaigns.iter().map(g).fold(0.0, f64::max);
    ForecastError {
        max_impressions: max(|e| e.impressions),
        weighted_impressions: weighted,
        max_spend: max(|e| e.spend),
        max_users: max(|e| e.users),
        campaigns,
    }
}

/// A forecast as a table a person reads.
pub fn markdown(f: &Forecast, err: Option<&ForecastError>) -> String {
    let mut out = format!(
        "# Forecast\n\nSample {:.3} of users: {} of {} requests decided in {} ms.\n\n\
         | campaign | day | impressions | spend | users | households |\n|---|---|---:|---:|---:|---:|\n",
        f.sample, f.sampled_requests, f.requests, f.wall_ms
    );
    if f.sample < 1.0 && f.largest_unit_share > LARGEST_UNIT_WARNING {
        out += &format!(
            "**Warning:** one household or user made {:.1} % of the decided requests: \
             whether such units fall in the sample moves every figure. Use a larger \
             sample (docs/forecast.md, \"Accuracy\").\n\n",
            100.0 * f.largest_unit_share
        );
    }
    for c in &f.campaigns {
        for d in &c.days {
            out += &format!(
                "| {} | {} | {} | {} | {} | {} |\n",
                c.id,
                d.day,
                d.impressions,
                d.spend,
                d.users,
                d.households.map_or("–".into(), |h| h.to_string())
            );
        }
    }
    out += "\n| campaign | 1 | 2 | 3 | 4 | 5 | 6 | 7 | 8 | 9 | 10+ |\n|---|";
    out += &"---:|".repeat(FREQUENCY_BUCKETS as usize);
    out += "\n";
    for c in &f.campaigns {
        out += &format!("| {} |", c.id);
        for b in &c.frequency {
            out += &format!(" {:.1} % |", 100.0 * b.share);
        }
        out += "\n";
    }
    if let Some(e) = err {
        out += &format!(
            "\nAgainst a full run: impressions within {:.2} % (largest), {:.2} % \
             (weighted); spend within {:.2} %, users within {:.2} %.\n",
            100.0 * e.max_impressions,
            100.0 * e.weighted_impressions,
            100.0 * e.max_spend,
            100.0 * e.max_users
        );
    }
    out
}
