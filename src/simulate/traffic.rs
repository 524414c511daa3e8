//! Where the simulated ad requests come from: a JSONL log, or a seeded
//! synthetic day (diurnal curve in a time zone, Poisson arrivals, Zipf users,
//! K candidates per request). Both yield requests in time order.

use std::io::BufRead;

use jiff::Timestamp;
use jiff::tz::TimeZone;
use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};
use serde::Deserialize;

use crate::clock::{Nanos, SECOND};
use crate::limits::calendar::local_hour;

/// One ad request: when, who, and the candidate campaigns (indexes into the
/// simulation's campaign list), in the order the ad server would try them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub at: Nanos,
    /// The user's number (dense, for tallies) and the id the engine sees.
    pub user: u32,
    pub user_name: String,
    /// The user's household, if the traffic says (its number and id): a
    /// screen names it (`ids.household`), so household caps apply.
    pub household: Option<(u32, String)>,
    pub candidates: Vec<u16>,
}

/// A typical day of ad traffic by local hour (share of the peak): quiet at
/// night, a morning rise, an evening peak.
pub const DEFAULT_DIURNAL: [f64; 24] = [
    0.30, 0.20, 0.15, 0.12, 0.12, 0.15, 0.30, 0.50, 0.70, 0.85, 0.95, 1.00, 1.00, 0.95, 0.90, 0.90,
    0.95, 1.05, 1.20, 1.30, 1.25, 1.00, 0.70, 0.45,
];

/// Parameters of the synthetic generator.
#[derive(Debug, Clone)]
pub struct Synthetic {
    /// First instant simulated.
    pub start: Nanos,
    /// End of the simulation (exclusive).
    pub end: Nanos,
    /// The zone whose local hours the diurnal curve follows.
    pub tz: TimeZone,
    /// Mean requests per 24 hours.
    pub requests_per_day: f64,
    /// Relative traffic by local hour (any positive scale).
    pub diurnal: [f64; 24],
    /// Distinct users; user ranks follow a Zipf law of exponent `zipf_s`.
    pub users: u32,
    pub zipf_s: f64,
    /// Households the users live in (user rank modulo this); 0: none named.
    pub households: u32,
    /// Candidates per request (at most the number of campaigns).
    pub candidates: usize,
    pub campaigns: usize,
    pub seed: u64,
}

/// Arrival rate is held constant over steps this long (interpolated between
/// local-hour centres), so the Poisson process follows a smooth curve.
const STEP: Nanos = 60 * SECOND;

/// The synthetic request stream (an iterator).
pub struct Generator {
    cfg: Synthetic,
    rng: Xoshiro256PlusPlus,
    /// Cumulative Zipf weights of user ranks, normalised to 1.
    zipf_cdf: Vec<f64>,
    /// Arrivals per ns at the peak of the curve (scale of `diurnal`).
    per_ns: f64,
    /// The current step: its end and its rate (arrivals per ns).
    step_end: Nanos,
    rate: f64,
    now: Nanos,
    /// Scratch for choosing candidates.
    order: Vec<u16>,
}

impl Generator {
    pub fn new(cfg: Synthetic) -> Result<Self, String> {
        if cfg.users == 0 {
            return Err("users: must be at least 1".into());
        }
        if cfg.campaigns == 0 || cfg.campaigns > usize::from(u16::MAX) {
            return Err(format!(
                "campaigns: need 1 to {} campaigns, got {}",
                u16::MAX,
                cfg.campaigns
            ));
        }
        if !(cfg.requests_per_day.is_finite() && cfg.requests_per_day > 0.0) {
            return Err("requests: must be a positive number per day".into());
        }
        if cfg.diurnal.iter().any(|w| !(w.is_finite() && *w >= 0.0))
            || cfg.diurnal.iter().sum::<f64>() <= 0.0
        {
            return Err("diurnal: 24 non-negative weights with a positive sum".into());
        }
        if !(cfg.zipf_s.is_finite() && cfg.zipf_s >= 0.0) {
            return Err("zipf: must be a non-negative exponent".into());
        }
        let mut zipf_cdf = Vec::with_capacity(cfg.users as usize);
        let mut acc = 0.0;
        for rank in 1..=cfg.users {
            acc += 1.0 / f64::from(rank).powf(cfg.zipf_s);
            zipf_cdf.push(acc);
        }
        for x in &mut zipf_cdf {
            *x /= acc;
        }
        // Mean of the curve over a day = the mean of its 24 weights: scale so
        // that a day has `requests_per_day` arrivals on average.
        let mean_w = cfg.diurnal.iter().sum::<f64>() / 24.0;
        let per_ns = cfg.requests_per_day / (86_400.0 * 1e9) / mean_w;
        let order = (0..cfg.campaigns as u16).collect();
        let now = cfg.start;
        Ok(Generator {
            rng: Xoshiro256PlusPlus::seed_from_u64(cfg.seed),
            cfg,
            zipf_cdf,
            per_ns,
            step_end: now,
            rate: 0.0,
            now,
            order,
        })
    }

    /// The curve at `t`: linear between the centres of local hours.
    fn weight_at(&self, t: Nanos) -> f64 {
        let (h, into) = match Timestamp::from_nanosecond(i128::from(t)) {
            Ok(ts) => {
                let z = ts.to_zoned(self.cfg.tz.clone());
                let secs = i32::from(z.minute()) * 60 + i32::from(z.second());
                (
                    usize::from(z.hour().unsigned_abs()),
                    f64::from(secs) / 3600.0,
                )
            }
            Err(_) => (local_hour(&self.cfg.tz, t), 0.0),
        };
        let (a, b, x) = if into < 0.5 {
            (
                self.cfg.diurnal[(h + 23) % 24],
                self.cfg.diurnal[h],
                into + 0.5,
            )
        } else {
            (
                self.cfg.diurnal[h],
                self.cfg.diurnal[(h + 1) % 24],
                into - 0.5,
            )
        };
        a + (b - a) * x
    }

    fn user(&mut self) -> u32 {
        let u: f64 = self.rng.random();
        self.zipf_cdf
            .partition_point(|&c| c < u)
            .min(self.zipf_cdf.len() - 1) as u32
    }
}

impl Iterator for Generator {
    type Item = Request;

    fn next(&mut self) -> Option<Request> {
        // Poisson arrivals with a piecewise-constant rate: the process is
        // memoryless, so a gap that runs past the step is drawn again from
        // the step's end at the next step's rate.
        loop {
            if self.now >= self.cfg.end {
                return None;
            }
            if self.now >= self.step_end {
                let mid = self.now + STEP / 2;
                self.rate = self.weight_at(mid) * self.per_ns;
                self.step_end = (self.now - self.now % STEP + STEP).min(self.cfg.end);
            }
            if self.rate <= 0.0 {
                self.now = self.step_end;
                continue;
            }
            let u: f64 = self.rng.random();
            // 1 − u is in (0, 1]: the logarithm is finite.
            let gap = -(1.0 - u).ln() / self.rate;
            let at = self.now as f64 + gap;
            if at >= self.step_end as f64 {
                self.now = self.step_end;
                continue;
            }
            self.now = (at as Nanos).max(self.now);
            break;
        }
        let user = self.user();
        // K distinct campaigns in random order: a partial Fisher–Yates shuffle.
        let k = self.cfg.candidates.clamp(1, self.order.len());
        for i in 0..k {
            let j = self.rng.random_range(i..self.order.len());
            self.order.swap(i, j);
        }
        let household = (self.cfg.households > 0).then(|| {
            let h = user % self.cfg.households;
            (h, format!("h{h}"))
        });
        Some(Request {
            at: self.now,
            user,
            user_name: format!("u{user}"),
            household,
            candidates: self.order[..k].to_vec(),
        })
    }
}

/// One line of a traffic log.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LogLine {
    /// Unix milliseconds, or `time` as RFC 3339.
    at_ms: Option<u64>,
    time: Option<String>,
    user: String,
    /// The user's household, if known.
    #[serde(default)]
    household: Option<String>,
    candidates: Vec<String>,
}

/// Reads a JSONL traffic log: `{"at_ms" | "time", "user", "candidates": [...]}`
/// per line, in time order. Users and campaigns are interned; an unknown
/// campaign is an error naming the line.
pub struct LogReader<R> {
    lines: std::io::Lines<R>,
    line_no: usize,
    last: Nanos,
    campaigns: std::collections::HashMap<String, u16>,
    users: std::collections::HashMap<String, u32>,
    households: std::collections::HashMap<String, u32>,
    /// The first error met; the iterator stops there.
    pub error: Option<String>,
}

impl<R: BufRead> LogReader<R> {
    pub fn new(reader: R, campaign_names: &[String]) -> Self {
        LogReader {
            lines: reader.lines(),
            line_no: 0,
            last: 0,
            campaigns: campaign_names
                .iter()
                .enumerate()
                .map(|(i, n)| (n.clone(), i as u16))
                .collect(),
            users: Default::default(),
            households: Default::default(),
            error: None,
        }
    }

    fn parse(&mut self, text: &str) -> Result<Request, String> {
        let line: LogLine = crate::model::from_json(text).map_err(|e| e.to_string())?;
        let at = match (line.at_ms, &line.time) {
            (Some(ms), None) => ms
                .checked_mul(1_000_000)
                .ok_or_else(|| "at_ms: too large".to_owned())?,
            (None, Some(t)) => {
                let ts: Timestamp = t
                    .parse()
                    .map_err(|e| format!("time: not an RFC 3339 time ({e})"))?;
                u64::try_from(ts.as_nanosecond()).map_err(|_| "time: before 1970".to_owned())?
            }
            _ => return Err("one of at_ms or time is needed (not both)".into()),
        };
        if at < self.last {
            return Err(
                "at_ms: earlier than the line before (the log must be in time order)".into(),
            );
        }
        self.last = at;
        let candidates =
            line.candidates
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    self.campaigns.get(c).copied().ok_or_else(|| {
                        format!("candidates[{i}]: {c:?} is not in the campaigns file")
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
        if candidates.is_empty() {
            return Err("candidates: at least one is needed".into());
        }
        let next = self.users.len() as u32;
        let user = *self.users.entry(line.user.clone()).or_insert(next);
        let household = line.household.map(|h| {
            let next = self.households.len() as u32;
            (*self.households.entry(h.clone()).or_insert(next), h)
        });
        Ok(Request {
            at,
            user,
            user_name: line.user,
            household,
            candidates,
        })
    }
}

impl<R: BufRead> Iterator for LogReader<R> {
    type Item = Request;

    fn next(&mut self) -> Option<Request> {
        if self.error.is_some() {
            return None;
        }
        loop {
            let text = match self.lines.next()? {
                Ok(t) => t,
                Err(e) => {
                    self.error = Some(format!("line {}: {e}", self.line_no + 1));
                    return None;
                }
            };
            self.line_no += 1;
            if text.trim().is_empty() {
                continue;
            }
            return match self.parse(&text) {
                Ok(r) => Some(r),
                Err(e) => {
                    self.error = Some(format!("line {}: {e}", self.line_no));
                    None
                }
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day(seed: u64) -> Synthetic {
        Synthetic {
            households: 0,
            start: 1_767_225_600 * SECOND, // 2026-01-01T00:00:00Z
            end: 1_767_225_600 * SECOND + 86_400 * SECOND,
            tz: TimeZone::UTC,
            requests_per_day: 100_000.0,
            diurnal: DEFAULT_DIURNAL,
            users: 1000,
            zipf_s: 1.0,
            candidates: 3,
            campaigns: 5,
            seed,
        }
    }

    #[test]
    fn seeded_days_repeat_and_follow_the_curve() {
        let a: Vec<Request> = Generator::new(day(7)).unwrap().take(1000).collect();
        let b: Vec<Request> = Generator::new(day(7)).unwrap().take(1000).collect();
        assert_eq!(a, b);
        let all: Vec<Request> = Generator::new(day(7)).unwrap().collect();
        // Poisson: the count is within a few standard deviations (≈ 316).
        assert!(
            (all.len() as f64 - 100_000.0).abs() < 2_000.0,
            "{}",
            all.len()
        );
        assert!(all.windows(2).all(|w| w[0].at <= w[1].at));
        let hour = |h: u64| {
            all.iter()
                .filter(|r| (r.at / SECOND / 3600) % 24 == h)
                .count()
        };
        // 19:00 (weight 1.3) is far busier than 03:00 (0.12).
        assert!(hour(19) > 8 * hour(3));
        // Zipf: the first user is the most frequent.
        let top = all.iter().filter(|r| r.user == 0).count();
        assert!(all.iter().filter(|r| r.user == 500).count() * 100 < top);
        assert!(all.iter().all(|r| r.candidates.len() == 3));
    }

    #[test]
    fn log_lines_are_checked() {
        let names = vec!["a".to_owned(), "b".to_owned()];
        let text = "{\"at_ms\": 1000, \"user\": \"x\", \"candidates\": [\"b\", \"a\"]}\n\n\
                    {\"time\": \"1970-01-01T00:00:02Z\", \"user\": \"y\", \"candidates\": [\"a\"]}\n\
                    {\"at_ms\": 1500, \"user\": \"x\", \"candidates\": [\"a\"]}\n";
        let mut r = LogReader::new(text.as_bytes(), &names);
        let got: Vec<Request> = r.by_ref().collect();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].candidates, vec![1, 0]);
        assert_eq!(got[1].at, 2 * SECOND);
        assert_eq!(
            r.error.as_deref().map(|e| e.starts_with("line 4: at_ms")),
            Some(true)
        );
        let mut r = LogReader::new(
            "{\"at_ms\": 1, \"user\": \"x\", \"candidates\": [\"z\"]}".as_bytes(),
            &names,
        );
        assert!(r.next().is_none());
        assert!(r.error.unwrap().contains("candidates[0]"));
    }
}
