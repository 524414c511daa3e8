//! `freqcap simulate`: a day or a week of ad requests through the real engine
//! on a virtual clock, and a report a person can read (docs/semantics.md §10.1,
//! issue 5). See docs/pacing.md.
//!
//! - [`traffic`]: requests from a JSONL log or a seeded synthetic generator.
//! - [`runner`]: the engine on a memory store and a [`crate::ManualClock`]:
//!   screen with reserve, commit the winner after a delay, lose a share.
//! - [`report`]: per campaign and period: delivered vs budget, over-delivery,
//!   pacing error, exhaustion, denials by cap; `summary.json` and `summary.md`.
//! - [`plots`]: SVG pictures of the same.

pub mod forecast;
pub mod overload;
pub mod plots;
pub mod report;
pub mod runner;
pub mod traffic;

use std::path::{Path, PathBuf};

use jiff::tz::TimeZone;
use serde::Deserialize;

use crate::clock::{MS, Nanos, SECOND};
use crate::limits::Item;
use crate::limits::budget::{Budget, Pacing};
use crate::limits::calendar::{Calendar, CalendarUnit};
use crate::model::EventType;
use crate::model::campaign::{CampaignDef, Scope};
use crate::model::limit::{Align, LimitDef};

pub use report::Summary;
pub use runner::{RunOptions, RunStats, Runner};
pub use traffic::{DEFAULT_DIURNAL, Generator, LogReader, Request, Synthetic};

/// A simulation error, said for a person (it names the file, line or field).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SimError(pub String);

/// One campaign of the campaigns file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileCampaign {
    id: String,
    /// Cost of one impression, charged to budgets; default 1.
    #[serde(default)]
    cost: Option<u64>,
    /// The share of its impressions followed by a click (a `"click"`
    /// event, docs/semantics.md §6.9), 0 to 1; default 0.
    #[serde(default)]
    ctr: Option<f64>,
    /// Cost of one click, charged to budgets counting clicks; default
    /// `cost`.
    #[serde(default)]
    click_cost: Option<u64>,
    /// The definition, as `PUT /v1/campaigns/{id}` takes it.
    campaign: CampaignDef,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct CampaignsFile {
    campaigns: Vec<FileCampaign>,
}

/// A campaign's budget, as the report needs it.
#[derive(Debug, Clone)]
pub struct BudgetInfo {
    pub amount: u64,
    /// `goal: impressions`: a commit counts 1 against `amount`, not its cost.
    pub impressions: bool,
    /// `asap`, `even`, `profile`, `adaptive`, `adaptive+profile`,
    /// `throttle` or `throttle+profile`.
    pub pacing: String,
    pub calendar: Calendar,
    /// The line spend is judged against: even time, or the campaign's traffic
    /// profile when it has one, with no tolerance. asap is judged against the
    /// even line too (that it runs ahead of it is the point). Under a
    /// schedule, the line over its open hours only.
    pub target: Budget,
    /// The event type it counts (docs/semantics.md §6.9).
    pub event: EventType,
    /// The campaign's schedule: a period it never opens in has nothing to
    /// deliver (a weekend under a weekday schedule), and is not judged.
    pub schedule: Option<std::sync::Arc<crate::limits::schedule::Schedule>>,
}

impl BudgetInfo {
    /// Whether the period `[start, end)` has time to deliver in.
    pub fn open_in(&self, start: crate::clock::Nanos, end: crate::clock::Nanos) -> bool {
        self.schedule
            .as_ref()
            .is_none_or(|s| !s.open_spans(start, end).is_empty())
    }
}

/// A per-user cap to draw the distribution of impressions against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserCap {
    pub name: String,
    pub limit: u64,
    /// The window as written, e.g. `1d`.
    pub window: String,
    /// True for a calendar day in the campaign's zone: then impressions per
    /// user and local day can never exceed `limit`.
    pub per_local_day: bool,
}

/// A campaign as the simulation uses it.
#[derive(Debug, Clone)]
pub struct SimCampaign {
    pub id: String,
    pub cost: u64,
    pub def: CampaignDef,
    pub tz: TimeZone,
    pub budget: Option<BudgetInfo>,
    pub user_cap: Option<UserCap>,
    /// Clicks that follow its impressions, if any ([`Clicks`]).
    pub clicks: Option<Clicks>,
    day: Calendar,
    hour: Calendar,
}

/// A campaign's clicks: each impression is followed at once by a `"click"`
/// event with probability `ctr`, costing `cost`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Clicks {
    pub ctr: f64,
    pub cost: u64,
}

impl SimCampaign {
    /// Builds one from its definition; `id` and `cost` as in the file.
    pub fn new(id: &str, cost: u64, def: CampaignDef) -> Result<Self, SimError> {
        let compiled = def
            .compile()
            .map_err(|e| SimError(format!("campaign {id:?}: {e}")))?;
        let tz_name = def.tz.clone().unwrap_or_else(|| "UTC".into());
        let tz = TimeZone::get(&tz_name)
            .map_err(|_| SimError(format!("campaign {id:?}: tz: unknown zone {tz_name:?}")))?;
        let budget = compiled.items.iter().find_map(|c| match &c.item {
            Item::Budget(b) => Some(b),
            _ => None,
        });
        let budget = budget.map(|b| {
            let target_pacing = match &b.pacing {
                Pacing::Profile(w) | Pacing::Adaptive(Some(w)) | Pacing::Throttle(Some(w)) => {
                    Pacing::Profile(w.clone())
                }
                _ => Pacing::Even,
            };
            BudgetInfo {
                amount: b.amount,
                impressions: b.counts_impressions(),
                pacing: b.pacing_name().into(),
                calendar: b.calendar.clone(),
                target: match &compiled.schedule {
                    Some(sc) => Budget::new(b.amount, b.calendar.clone(), target_pacing, 0)
                        .within(sc.clone()),
                    None => Budget::new(b.amount, b.calendar.clone(), target_pacing, 0),
                },
                schedule: compiled.schedule.clone(),
                event: def
                    .budget
                    .as_ref()
                    .and_then(|b| b.event)
                    .unwrap_or_default(),
            }
        });
        let user_cap = def
            .caps
            .iter()
            .enumerate()
            .find_map(|(i, c)| match &c.limit {
                LimitDef::Window(w)
                    if c.scope() == Scope::User && c.event.is_none_or(|e| e.is_impression()) =>
                {
                    Some(UserCap {
                        name: c.limit.reported_name(i),
                        limit: w.limit,
                        window: w.window.to_string(),
                        per_local_day: w.align == Some(Align::Calendar)
                            && w.window.calendar_unit() == Some(CalendarUnit::Day)
                            && w.tz.as_ref().is_none_or(|t| *t == tz_name),
                    })
                }
                _ => None,
            });
        Ok(SimCampaign {
            id: id.to_owned(),
            cost,
            def,
            day: Calendar::new(CalendarUnit::Day, tz.clone()),
            hour: Calendar::new(CalendarUnit::Hour, tz.clone()),
            tz,
            budget,
            user_cap,
            clicks: None,
        })
    }

    /// This campaign with clicks following its impressions; errors name
    /// the field (`ctr`, `click_cost`).
    pub fn with_clicks(mut self, ctr: f64, cost: u64) -> Result<Self, SimError> {
        if !(0.0..=1.0).contains(&ctr) {
            return Err(SimError(format!("ctr: must be from 0 to 1, got {ctr}")));
        }
        if cost == 0 || cost > crate::MAX_EXACT {
            return Err(SimError(format!(
                "click_cost: must be from 1 to 2^53 - 1, got {cost}"
            )));
        }
        self.clicks = (ctr > 0.0).then_some(Clicks { ctr, cost });
        Ok(self)
    }

    /// What an event of type `event` costing `cost` counts against its
    /// budget: nothing if the budget counts another type, else its cost,
    /// or 1 for a goal in impressions.
    fn units_of(&self, event: EventType, cost: u64) -> u64 {
        match &self.budget {
            Some(b) if b.event != event => 0,
            Some(b) if b.impressions => 1,
            _ => cost,
        }
    }

    /// What one commit (an impression) counts against its budget.
    pub fn budget_units(&self) -> u64 {
        self.units_of(EventType::IMPRESSION, self.cost)
    }

    /// What one click counts against its budget.
    pub fn click_units(&self) -> u64 {
        self.clicks
            .map_or(0, |c| self.units_of(EventType::CLICK, c.cost))
    }

    /// The budget period containing `t` (the local day without a budget).
    pub fn period_of(&self, t: Nanos) -> (Nanos, Nanos) {
        match &self.budget {
            Some(b) => b.calendar.bounds(t),
            None => self.day.bounds(t),
        }
    }

    pub fn day_of(&self, t: Nanos) -> Nanos {
        self.day.bounds(t).0
    }

    pub fn hour_of(&self, t: Nanos) -> Nanos {
        self.hour.bounds(t).0
    }

    /// The end of the local hour containing `t`.
    pub fn hour_end(&self, t: Nanos) -> Nanos {
        self.hour.bounds(t).1
    }
}

/// Reads a campaigns file (JSON, or TOML when `toml`):
/// `{"campaigns": [{"id", "cost"?, "campaign": {...}}]}`. Parents come first.
pub fn parse_campaigns(text: &str, toml: bool) -> Result<Vec<SimCampaign>, SimError> {
    let file: CampaignsFile = if toml {
        crate::model::from_toml(text)
    } else {
        crate::model::from_json(text)
    }
    .map_err(|e| SimError(e.to_string()))?;
    if file.campaigns.is_empty() || file.campaigns.len() > usize::from(u16::MAX) {
        return Err(SimError(format!(
            "campaigns: need 1 to {} campaigns, got {}",
            u16::MAX,
            file.campaigns.len()
        )));
    }
    let mut out: Vec<SimCampaign> = Vec::with_capacity(file.campaigns.len());
    for (i, c) in file.campaigns.into_iter().enumerate() {
        if out.iter().any(|o| o.id == c.id) {
            return Err(SimError(format!(
                "campaigns[{i}].id: {:?} is used twice",
                c.id
            )));
        }
        let cost = c.cost.unwrap_or(1);
        if cost == 0 || cost > crate::MAX_EXACT {
            return Err(SimError(format!(
                "campaigns[{i}].cost: must be from 1 to 2^53 - 1, got {cost}"
            )));
        }
        let sim = SimCampaign::new(&c.id, cost, c.campaign)?;
        let sim = sim
            .with_clicks(c.ctr.unwrap_or(0.0), c.click_cost.unwrap_or(cost))
            .map_err(|e| SimError(format!("campaigns[{i}].{}", e.0)))?;
        out.push(sim);
    }
    Ok(out)
}

/// The instant local `date` (YYYY-MM-DD) starts in `tz`, and `days` local days later.
pub fn local_days(date: &str, days: u32, tz: &TimeZone) -> Result<(Nanos, Nanos), SimError> {
    let d: jiff::civil::Date = date
        .parse()
        .map_err(|e| SimError(format!("start: not a date YYYY-MM-DD ({e})")))?;
    let at = |d: jiff::civil::Date| -> Result<Nanos, SimError> {
        let z = d
            .to_datetime(jiff::civil::Time::midnight())
            .to_zoned(tz.clone())
            .map_err(|e| SimError(format!("start: {e}")))?;
        u64::try_from(z.timestamp().as_nanosecond())
            .map_err(|_| SimError("start: before 1970".into()))
    };
    let end = d
        .checked_add(jiff::Span::new().days(i64::from(days)))
        .map_err(|e| SimError(format!("days: {e}")))?;
    Ok((at(d)?, at(end)?))
}

/// Options of `freqcap simulate` (also usable from code and tests).
#[derive(Debug, Clone, clap::Args)]
pub struct SimulateArgs {
    /// Campaign definitions: JSON (or TOML by the .toml extension),
    /// `{"campaigns": [{"id": "c1", "cost": 1, "campaign": {...}}]}`.
    #[arg(long)]
    pub campaigns: PathBuf,
    /// A JSONL traffic log: `{"at_ms" | "time", "user", "candidates": [ids]}`
    /// per line, in time order.
    #[arg(long, conflicts_with = "synthetic")]
    pub traffic: Option<PathBuf>,
    /// Generate seeded synthetic traffic instead of reading a log.
    #[arg(long)]
    pub synthetic: bool,
    /// Folder for summary.json, summary.md and the SVG pictures.
    #[arg(long)]
    pub out: PathBuf,
    /// Synthetic: first local day simulated (YYYY-MM-DD, in --tz).
    #[arg(long, default_value = "2026-01-05")]
    pub start: String,
    /// Synthetic: how many local days.
    #[arg(long, default_value_t = 1)]
    pub days: u32,
    /// The zone of the traffic's diurnal curve and of the simulated days
    /// (a log's span is rounded out to whole local days of it).
    #[arg(long, default_value = "UTC")]
    pub tz: String,
    /// Synthetic: mean requests per day.
    #[arg(long, default_value_t = 1_000_000.0)]
    pub requests: f64,
    /// Synthetic: distinct users (Zipf-distributed).
    #[arg(long, default_value_t = 200_000)]
    pub users: u32,
    /// Synthetic: Zipf exponent of user activity.
    #[arg(long, default_value_t = 1.0)]
    pub zipf: f64,
    /// Synthetic: households the users live in (user rank modulo this,
    /// named in each screen as `ids.household`); 0: none.
    #[arg(long, default_value_t = 0)]
    pub households: u32,
    /// Synthetic: candidate campaigns per request.
    #[arg(long, default_value_t = 3)]
    pub candidates: usize,
    /// Synthetic: 24 comma-separated weights of traffic by local hour.
    #[arg(long)]
    pub diurnal: Option<String>,
    /// Seed of the synthetic traffic and of the lost-auction draws.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Delay from screen to the winner's commit, in ms.
    #[arg(long, default_value_t = 200)]
    pub commit_delay_ms: u64,
    /// Share of reservations never committed (they expire by TTL), 0–1.
    #[arg(long, default_value_t = 0.1)]
    pub lost_share: f64,
    /// Reservation TTL in ms.
    #[arg(long, default_value_t = 60_000)]
    pub ttl_ms: u64,
    /// Seconds of virtual time between delivery samples.
    #[arg(long, default_value_t = 60)]
    pub sample_secs: u64,
}

fn parse_diurnal(text: &str) -> Result<[f64; 24], SimError> {
    let v: Vec<f64> = text
        .split(',')
        .map(|x| x.trim().parse::<f64>())
        .collect::<Result<_, _>>()
        .map_err(|e| SimError(format!("diurnal: {e}")))?;
    <[f64; 24]>::try_from(v.as_slice())
        .map_err(|_| SimError(format!("diurnal: needs 24 weights, got {}", v.len())))
}

/// Runs a simulation as the command does, without writing anything.
pub fn simulate(args: &SimulateArgs, campaigns: &[SimCampaign]) -> Result<RunStats, SimError> {
    let (traffic, opts) = traffic(args, campaigns)?;
    Runner::new(campaigns, opts)?.run(traffic)
}

/// The requests a simulation runs (the log's, or the synthetic day's), and
/// the options its runner takes.
pub fn traffic(
    args: &SimulateArgs,
    campaigns: &[SimCampaign],
) -> Result<(Box<dyn Iterator<Item = Request>>, RunOptions), SimError> {
    let tz =
        TimeZone::get(&args.tz).map_err(|_| SimError(format!("tz: unknown zone {:?}", args.tz)))?;
    if !(0.0..=1.0).contains(&args.lost_share) {
        return Err(SimError(format!(
            "lost-share: must be from 0 to 1, got {}",
            args.lost_share
        )));
    }
    if args.sample_secs == 0 {
        return Err(SimError("sample-secs: must be at least 1".into()));
    }
    let opts = |start, end| RunOptions {
        commit_delay: args.commit_delay_ms.saturating_mul(MS),
        lost_share: args.lost_share,
        ttl_ms: args.ttl_ms,
        sample_every: args.sample_secs.saturating_mul(SECOND),
        seed: args.seed,
        start,
        end,
    };
    if let Some(path) = &args.traffic {
        let file = std::fs::File::open(path)
            .map_err(|e| SimError(format!("cannot read {}: {e}", path.display())))?;
        let names: Vec<String> = campaigns.iter().map(|c| c.id.clone()).collect();
        let mut reader = LogReader::new(std::io::BufReader::new(file), &names);
        let requests: Vec<Request> = reader.by_ref().collect();
        if let Some(e) = reader.error {
            return Err(SimError(format!("{}: {e}", path.display())));
        }
        let (Some(first), Some(last)) = (requests.first(), requests.last()) else {
            return Err(SimError(format!("{}: no requests", path.display())));
        };
        let day = Calendar::new(CalendarUnit::Day, tz);
        let (start, end) = (day.bounds(first.at).0, day.bounds(last.at).1);
        return Ok((Box::new(requests.into_iter()), opts(start, end)));
    }
    if !args.synthetic {
        return Err(SimError("give --traffic FILE or --synthetic".into()));
    }
    let (start, end) = local_days(&args.start, args.days.max(1), &tz)?;
    let diurnal = match &args.diurnal {
        Some(t) => parse_diurnal(t)?,
        None => DEFAULT_DIURNAL,
    };
    let generator = Generator::new(Synthetic {
        start,
        end,
        tz,
        requests_per_day: args.requests,
        diurnal,
        users: args.users,
        zipf_s: args.zipf,
        households: args.households,
        candidates: args.candidates,
        campaigns: campaigns.len(),
        seed: args.seed,
    })
    .map_err(SimError)?;
    Ok((Box::new(generator), opts(start, end)))
}

/// `freqcap simulate`: reads the campaigns, runs, writes the report.
pub fn main(args: &SimulateArgs) -> Result<Summary, SimError> {
    let text = std::fs::read_to_string(&args.campaigns)
        .map_err(|e| SimError(format!("cannot read {}: {e}", args.campaigns.display())))?;
    let toml = args.campaigns.extension().is_some_and(|e| e == "toml");
    let campaigns = parse_campaigns(&text, toml)
        .map_err(|e| SimError(format!("{}: {e}", args.campaigns.display())))?;
    let stats = simulate(args, &campaigns)?;
    let summary = report::summarize(&campaigns, &stats);
    write_report(&args.out, &campaigns, &stats, &summary)?;
    Ok(summary)
}

/// Options of `freqcap forecast`: a simulation's, and the sample.
#[derive(Debug, Clone, clap::Args)]
pub struct ForecastArgs {
    #[command(flatten)]
    pub sim: SimulateArgs,
    /// The share of users (households, when the traffic names them) to
    /// decide, more than 0 and at most 1.
    #[arg(long, default_value_t = 0.1)]
    pub sample: f64,
    /// Also run the whole traffic and report the forecast's error against it.
    #[arg(long)]
    pub compare: bool,
}

/// What `freqcap forecast` found: the forecast, and with `--compare` the
/// full run and the error against it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ForecastReport {
    pub forecast: forecast::Forecast,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub full: Option<forecast::Forecast>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<forecast::ForecastError>,
}

/// `freqcap forecast`: reads the campaigns, forecasts on a sample (and runs
/// the whole traffic with `--compare`), writes forecast.json and
/// forecast.md into `--out`.
pub fn forecast_main(args: &ForecastArgs) -> Result<ForecastReport, SimError> {
    forecast::check_sample("sample", args.sample)?;
    let text = std::fs::read_to_string(&args.sim.campaigns)
        .map_err(|e| SimError(format!("cannot read {}: {e}", args.sim.campaigns.display())))?;
    let toml = args.sim.campaigns.extension().is_some_and(|e| e == "toml");
    let campaigns = parse_campaigns(&text, toml)
        .map_err(|e| SimError(format!("{}: {e}", args.sim.campaigns.display())))?;
    let run = |rate: f64| {
        let (requests, opts) = traffic(&args.sim, &campaigns)?;
        forecast::forecast(&campaigns, requests, opts, rate, args.sim.seed)
    };
    let f = run(args.sample)?;
    let full = if args.compare { Some(run(1.0)?) } else { None };
    let error = full.as_ref().map(|full| forecast::error_against(&f, full));
    let report = ForecastReport {
        forecast: f,
        full,
        error,
    };
    let dir = &args.sim.out;
    std::fs::create_dir_all(dir)
        .map_err(|e| SimError(format!("cannot create {}: {e}", dir.display())))?;
    let write = |name: &str, text: String| {
        let p = dir.join(name);
        std::fs::write(&p, text).map_err(|e| SimError(format!("cannot write {}: {e}", p.display())))
    };
    let json = serde_json::to_string_pretty(&report).map_err(|e| SimError(e.to_string()))?;
    write("forecast.json", json + "\n")?;
    write(
        "forecast.md",
        forecast::markdown(&report.forecast, report.error.as_ref()),
    )?;
    Ok(report)
}

/// Writes summary.json, summary.md and the pictures into `dir`.
pub fn write_report(
    dir: &Path,
    campaigns: &[SimCampaign],
    stats: &RunStats,
    summary: &Summary,
) -> Result<(), SimError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| SimError(format!("cannot create {}: {e}", dir.display())))?;
    let write = |name: &str, text: String| {
        let p = dir.join(name);
        std::fs::write(&p, text).map_err(|e| SimError(format!("cannot write {}: {e}", p.display())))
    };
    let json = serde_json::to_string_pretty(summary).map_err(|e| SimError(e.to_string()))?;
    write("summary.json", json + "\n")?;
    write("summary.md", report::markdown(summary))?;
    plots::all(dir, campaigns, stats, summary)
}
