//! The numbers of a run, per campaign and budget period: delivered against
//! the budget, over-delivery, pacing error, exhaustion, denials by cap, and
//! impressions per user against the frequency cap.

use std::collections::BTreeMap;
use std::fmt::Write;

use jiff::Timestamp;
use jiff::tz::TimeZone;
use serde::Serialize;

use crate::clock::Nanos;

use super::SimCampaign;
use super::runner::{CampaignStats, RunStats};

/// `summary.json`.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub start: String,
    pub end: String,
    pub requests: u64,
    /// Screens that reserved at least one candidate.
    pub reserved: u64,
    pub commits: u64,
    pub late_commits: u64,
    /// Reservations never committed (lost auctions), left to expire.
    pub lost: u64,
    pub commit_errors: u64,
    pub wall_seconds: f64,
    /// Requests simulated per minute of wall time.
    pub requests_per_minute: f64,
    pub campaigns: Vec<CampaignSummary>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CampaignSummary {
    pub id: String,
    pub tz: String,
    /// Cost of one impression.
    pub cost: u64,
    pub pacing: Option<String>,
    /// Budget per period.
    pub amount: Option<u64>,
    /// Requests that named it, how often it was eligible, and won.
    pub candidacies: u64,
    pub eligible: u64,
    pub impressions: u64,
    pub spend: u64,
    /// Clicks sent after its impressions (`ctr` in the campaigns file).
    pub clicks: u64,
    /// Over the periods wholly inside the simulated span.
    pub complete_periods: usize,
    pub budget_total: u64,
    pub delivered: u64,
    pub delivered_pct: Option<f64>,
    /// The largest over-delivery of a complete period, in % of its amount.
    pub over_delivery_pct: Option<f64>,
    /// RMSE of cumulative spend against the target line over all samples of
    /// complete periods, in % of the amount.
    pub pacing_rmse_pct: Option<f64>,
    /// Denied candidacies by the cap that denied.
    pub denials: BTreeMap<String, u64>,
    pub user_cap: Option<UserCapSummary>,
    /// Impressions per (user, local day): how many user-days had 1, 2, ...
    pub impressions_per_user_day: BTreeMap<u32, u64>,
    pub max_impressions_per_user_day: u32,
    /// Spend by the local hour it was reserved in (local start time).
    pub spend_per_hour: BTreeMap<String, u64>,
    pub periods: Vec<PeriodSummary>,
}

#[derive(Debug, Clone, Serialize)]
pub struct UserCapSummary {
    pub name: String,
    pub limit: u64,
    pub window: String,
    /// A calendar day in the campaign's zone: the distribution per local day
    /// is exactly what the cap bounds.
    pub per_local_day: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct PeriodSummary {
    /// Local times (RFC 3339 with offset) in the campaign's zone.
    pub start: String,
    pub end: String,
    pub hours: f64,
    /// Wholly inside the simulated span.
    pub complete: bool,
    pub amount: Option<u64>,
    pub delivered: u64,
    pub impressions: u64,
    pub delivered_pct: Option<f64>,
    pub over_delivery_pct: Option<f64>,
    /// RMSE of the sampled cumulative spend against the target line.
    pub pacing_rmse: Option<f64>,
    pub pacing_rmse_pct: Option<f64>,
    /// When delivered spend reached the amount, and 99 % of it.
    pub exhausted_at: Option<String>,
    pub reached_99pct_at: Option<String>,
}

/// `t` as a local RFC 3339 time in `tz`.
pub fn local_time(tz: &TimeZone, t: Nanos) -> String {
    Timestamp::from_nanosecond(i128::from(t))
        .map(|ts| {
            ts.to_zoned(tz.clone())
                .strftime("%Y-%m-%dT%H:%M:%S%:z")
                .to_string()
        })
        .unwrap_or_default()
}

fn pct(x: u64, of: u64) -> f64 {
    if of == 0 {
        0.0
    } else {
        // Rounded to 1/1000 of a percent: enough, and stable in the JSON.
        (x as f64 * 100_000.0 / of as f64).round() / 1000.0
    }
}

/// The periods of a campaign that meet `[start, end)`.
pub fn periods(c: &SimCampaign, start: Nanos, end: Nanos) -> Vec<(Nanos, Nanos)> {
    let mut out = Vec::new();
    let mut p = c.period_of(start);
    while p.0 < end {
        out.push(p);
        let next = c.period_of(p.1);
        // A flight is one period: none follows it (the same comes back).
        if p.1 <= p.0 || next.0 <= p.0 {
            break;
        }
        p = next;
    }
    out
}

/// Squared errors of cumulative spend against the target line in one period:
/// every sample in it, and the period's end (its final delivery against the
/// amount). Returns (sum of squares, count).
fn pacing_errors(
    c: &SimCampaign,
    st: &CampaignStats,
    (ps, pe): (Nanos, Nanos),
    delivered: u64,
) -> (f64, usize) {
    let Some(b) = &c.budget else {
        return (0.0, 0);
    };
    let mut sum = 0.0;
    let mut n = 0;
    for s in st
        .samples
        .iter()
        .filter(|s| s.period_start == ps && s.at < pe)
    {
        let target = b.target.cap(ps, pe, s.at) as f64;
        let e = s.spent as f64 - target;
        sum += e * e;
        n += 1;
    }
    let e = delivered as f64 - b.amount as f64;
    (sum + e * e, n + 1)
}

pub fn summarize(campaigns: &[SimCampaign], stats: &RunStats) -> Summary {
    let mut out = Vec::with_capacity(campaigns.len());
    for (c, st) in campaigns.iter().zip(&stats.campaigns) {
        let amount = c.budget.as_ref().map(|b| b.amount);
        let mut rows = Vec::new();
        let (mut total, mut delivered, mut complete) = (0u64, 0u64, 0usize);
        let mut over: Option<f64> = None;
        let (mut sq, mut nsq) = (0.0, 0usize);
        for (ps, pe) in periods(c, stats.start, stats.end) {
            let tally = st.periods.get(&ps).cloned().unwrap_or_default();
            // A period its schedule never opens in is not judged.
            let open = c.budget.as_ref().is_none_or(|b| b.open_in(ps, pe));
            let amount = amount.filter(|_| open);
            let is_complete = ps >= stats.start && pe <= stats.end && open;
            let (s2, n2) = pacing_errors(c, st, (ps, pe), tally.delivered);
            let rmse = (amount.is_some() && n2 > 0).then(|| (s2 / n2 as f64).sqrt());
            let over_pct = amount.map(|a| pct(tally.delivered.saturating_sub(a), a));
            if is_complete {
                complete += 1;
                delivered += tally.delivered;
                total += amount.unwrap_or(0);
                if let Some(o) = over_pct {
                    over = Some(over.map_or(o, |m: f64| m.max(o)));
                }
                sq += s2;
                nsq += n2;
            }
            rows.push(PeriodSummary {
                start: local_time(&c.tz, ps),
                end: local_time(&c.tz, pe),
                hours: (pe - ps) as f64 / 3.6e12,
                complete: is_complete,
                amount,
                delivered: tally.delivered,
                impressions: tally.impressions,
                delivered_pct: amount.map(|a| pct(tally.delivered, a)),
                over_delivery_pct: over_pct,
                pacing_rmse: rmse.map(|r| (r * 1000.0).round() / 1000.0),
                pacing_rmse_pct: rmse
                    .zip(amount)
                    .map(|(r, a)| (r * 100_000.0 / a as f64).round() / 1000.0),
                exhausted_at: tally.reached_100.map(|t| local_time(&c.tz, t)),
                reached_99pct_at: tally.reached_99.map(|t| local_time(&c.tz, t)),
            });
        }
        let mut dist: BTreeMap<u32, u64> = BTreeMap::new();
        for &k in st.per_user_day.values() {
            *dist.entry(k).or_insert(0) += 1;
        }
        let rmse_all =
            (amount.is_some() && complete > 0 && nsq > 0).then(|| (sq / nsq as f64).sqrt());
        out.push(CampaignSummary {
            id: c.id.clone(),
            tz: c.tz.iana_name().unwrap_or("UTC").to_owned(),
            cost: c.cost,
            pacing: c.budget.as_ref().map(|b| b.pacing.clone()),
            amount,
            candidacies: st.candidacies,
            eligible: st.eligible,
            impressions: st.wins,
            spend: st.spend,
            clicks: st.clicks,
            complete_periods: complete,
            budget_total: total,
            delivered,
            delivered_pct: (amount.is_some() && total > 0).then(|| pct(delivered, total)),
            over_delivery_pct: over,
            pacing_rmse_pct: rmse_all
                .zip(amount)
                .map(|(r, a)| (r * 100_000.0 / a as f64).round() / 1000.0),
            denials: st.denials.clone(),
            user_cap: c.user_cap.as_ref().map(|u| UserCapSummary {
                name: u.name.clone(),
                limit: u.limit,
                window: u.window.clone(),
                per_local_day: u.per_local_day,
            }),
            max_impressions_per_user_day: dist.keys().next_back().copied().unwrap_or(0),
            impressions_per_user_day: dist,
            spend_per_hour: st
                .hourly
                .iter()
                .map(|(&h, &v)| (local_time(&c.tz, h), v))
                .collect(),
            periods: rows,
        });
    }
    let wall = stats.wall.as_secs_f64();
    Summary {
        start: local_time(&TimeZone::UTC, stats.start),
        end: local_time(&TimeZone::UTC, stats.end),
        requests: stats.requests,
        reserved: stats.reserved,
        commits: stats.commits,
        late_commits: stats.late_commits,
        lost: stats.lost,
        commit_errors: stats.commit_errors,
        wall_seconds: (wall * 1000.0).round() / 1000.0,
        requests_per_minute: if wall > 0.0 {
            (stats.requests as f64 * 60.0 / wall).round()
        } else {
            0.0
        },
        campaigns: out,
    }
}

fn opt<T: std::fmt::Display>(x: &Option<T>) -> String {
    x.as_ref().map_or_else(|| "–".to_owned(), |v| v.to_string())
}

/// `summary.md`: the same figures for a person.
pub fn markdown(s: &Summary) -> String {
    let mut m = String::new();
    let _ = writeln!(m, "# Simulation {} – {}\n", s.start, s.end);
    let _ = writeln!(
        m,
        "{} requests, {} reserved, {} committed ({} late), {} lost auctions left to expire, {} failed commits. \
         Simulated in {:.2} s of wall time: {:.0} requests per minute.\n",
        s.requests,
        s.reserved,
        s.commits,
        s.late_commits,
        s.lost,
        s.commit_errors,
        s.wall_seconds,
        s.requests_per_minute
    );
    let _ = writeln!(m, "## Campaigns\n");
    let _ = writeln!(
        m,
        "| campaign | pacing | budget/period | delivered (complete periods) | over-delivery | pacing error (RMSE) | impressions | max per user-day | cap |"
    );
    let _ = writeln!(
        m,
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
    );
    for c in &s.campaigns {
        let _ = writeln!(
            m,
            "| {} | {} | {} | {} of {} ({}%) | {}% | {}% | {} | {} | {} |",
            c.id,
            opt(&c.pacing),
            opt(&c.amount),
            c.delivered,
            c.budget_total,
            opt(&c.delivered_pct),
            opt(&c.over_delivery_pct),
            opt(&c.pacing_rmse_pct),
            c.impressions,
            c.max_impressions_per_user_day,
            c.user_cap.as_ref().map_or_else(
                || "–".to_owned(),
                |u| format!("{} per {}", u.limit, u.window)
            ),
        );
    }
    for c in &s.campaigns {
        let _ = writeln!(m, "\n## {} ({}, {})\n", c.id, opt(&c.pacing), c.tz);
        let _ = writeln!(
            m,
            "Candidate in {} requests, eligible {} times, won {} ({} spent at {} per impression).\n",
            c.candidacies, c.eligible, c.impressions, c.spend, c.cost
        );
        if c.clicks > 0 {
            let _ = writeln!(m, "Clicks after its impressions: {}.\n", c.clicks);
        }
        let _ = writeln!(
            m,
            "| period start | hours | complete | budget | delivered | % | over % | pacing RMSE | RMSE % | 99 % at | exhausted at |"
        );
        let _ = writeln!(
            m,
            "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"
        );
        for p in &c.periods {
            let _ = writeln!(
                m,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                p.start,
                p.hours,
                if p.complete { "yes" } else { "no" },
                opt(&p.amount),
                p.delivered,
                opt(&p.delivered_pct),
                opt(&p.over_delivery_pct),
                opt(&p.pacing_rmse),
                opt(&p.pacing_rmse_pct),
                opt(&p.reached_99pct_at),
                opt(&p.exhausted_at),
            );
        }
        if !c.denials.is_empty() {
            let d: Vec<String> = c.denials.iter().map(|(k, v)| format!("{k}: {v}")).collect();
            let _ = writeln!(m, "\nDenied candidacies by cap: {}.", d.join(", "));
        }
        if !c.impressions_per_user_day.is_empty() {
            let d: Vec<String> = c
                .impressions_per_user_day
                .iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect();
            let _ = writeln!(
                m,
                "\nUser-days by impressions (impressions: user-days): {}.",
                d.join(", ")
            );
        }
        let _ = writeln!(
            m,
            "\n![cumulative spend](spend-{0}.svg) ![spend per hour](hourly-{0}.svg) ![impressions per user](users-{0}.svg)",
            c.id
        );
    }
    m
}
