//! Runs requests through the real engine on a virtual clock: screen with
//! reserve, commit the winner after a delay, let a share of reservations
//! expire uncommitted, and sample every campaign's delivery as it goes.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};

use crate::clock::{ManualClock, Nanos};
use crate::engine::{CommitRequest, Engine, EngineOptions, ScreenCandidate, ScreenRequest};
use crate::store::MemoryStore;

use super::traffic::Request;
use super::{SimCampaign, SimError};

/// How the ad server around the engine behaves.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// From the screen to the winner's commit (win and billing latency).
    pub commit_delay: Nanos,
    /// Share of reservations never committed (lost auctions): they expire by TTL.
    pub lost_share: f64,
    /// Reservation lifetime.
    pub ttl_ms: u64,
    /// How often each campaign's delivery is sampled (virtual time).
    pub sample_every: Nanos,
    /// Seeds the lost-auction draws.
    pub seed: u64,
    /// The simulated span: samples are taken from `start` to `end`.
    pub start: Nanos,
    pub end: Nanos,
}

/// One sample of a campaign's budget, as `GET /v1/campaigns/{c}/delivery` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    pub at: Nanos,
    pub period_start: Nanos,
    pub spent: u64,
    pub pending: u64,
    pub cap: u64,
}

/// What one budget period (or, without a budget, one local day) delivered,
/// counted by reservation time as the engine charges it.
#[derive(Debug, Clone, Default)]
pub struct PeriodTally {
    pub end: Nanos,
    pub delivered: u64,
    pub impressions: u64,
    /// When the delivered spend first reached 99 % and 100 % of the amount.
    pub reached_99: Option<Nanos>,
    pub reached_100: Option<Nanos>,
}

/// A request's household as the engine's identities (none, or one).
fn household_ids(h: &Option<(u32, String)>) -> Vec<(String, String)> {
    h.iter()
        .map(|(_, h)| ("household".to_owned(), h.clone()))
        .collect()
}

/// Counts `units` delivered against `c`'s budget in the period of
/// `counted_at`, at `at` (when it reaches 99 % and 100 %), and in its hour.
fn deliver(c: &SimCampaign, st: &mut CampaignStats, units: u64, counted_at: Nanos, at: Nanos) {
    if units == 0 {
        return;
    }
    let (ps, pe) = c.period_of(counted_at);
    let p = st.periods.entry(ps).or_default();
    p.end = pe;
    p.delivered += units;
    if let Some(amount) = c.budget.as_ref().map(|b| b.amount) {
        // 99 %: delivered·100 ≥ 99·amount, in integers.
        if p.reached_99.is_none() && u128::from(p.delivered) * 100 >= u128::from(amount) * 99 {
            p.reached_99 = Some(at);
        }
        if p.reached_100.is_none() && p.delivered >= amount {
            p.reached_100 = Some(at);
        }
    }
    *st.hourly.entry(c.hour_of(counted_at)).or_insert(0) += units;
}

/// Everything recorded about one campaign.
#[derive(Debug, Default)]
pub struct CampaignStats {
    /// Requests naming it, and how often it was eligible, won (committed).
    pub candidacies: u64,
    pub eligible: u64,
    pub wins: u64,
    pub spend: u64,
    /// Clicks sent after its impressions (`ctr`).
    pub clicks: u64,
    /// Denials by the cap that denied (`budget`, a cap's name, ...; a parent's
    /// caps as `parent/cap`).
    pub denials: BTreeMap<String, u64>,
    pub samples: Vec<Sample>,
    /// By period start.
    pub periods: BTreeMap<Nanos, PeriodTally>,
    /// Spend by the start of the local hour it was reserved in.
    pub hourly: BTreeMap<Nanos, u64>,
    /// Impressions per (user, local day start).
    pub per_user_day: HashMap<(u32, Nanos), u32>,
    /// Impressions per (household, local day start), for traffic that
    /// names households.
    pub per_household_day: HashMap<(u32, Nanos), u32>,
}

/// What a run did.
#[derive(Debug, Default)]
pub struct RunStats {
    pub requests: u64,
    /// Screens that reserved something.
    pub reserved: u64,
    pub commits: u64,
    pub late_commits: u64,
    /// Reservations left to expire (lost auctions).
    pub lost: u64,
    pub commit_errors: u64,
    pub wall: Duration,
    pub start: Nanos,
    pub end: Nanos,
    pub campaigns: Vec<CampaignStats>,
}

struct Due {
    at: Nanos,
    reserved_at: Nanos,
    id: String,
    winner: u16,
    user: u32,
    user_name: String,
    household: Option<(u32, String)>,
}

/// The simulation loop. One thread: the order of every step is fixed, so a
/// seed gives the same day twice.
pub struct Runner<'a> {
    campaigns: &'a [SimCampaign],
    opts: RunOptions,
    clock: Arc<ManualClock>,
    engine: Engine<Arc<ManualClock>>,
    rng: Xoshiro256PlusPlus,
    due: VecDeque<Due>,
    next_sample: Nanos,
    stats: RunStats,
}

impl<'a> Runner<'a> {
    /// An engine on a memory store and a manual clock at `opts.start`, with
    /// the campaigns put in file order (parents first).
    pub fn new(campaigns: &'a [SimCampaign], opts: RunOptions) -> Result<Self, SimError> {
        let clock = Arc::new(ManualClock::new(opts.start));
        let options = EngineOptions {
            id_nonce: Some(0),
            ..EngineOptions::default()
        };
        let engine = Engine::open(Arc::new(MemoryStore::new()), clock.clone(), options)
            .map_err(|e| SimError(format!("cannot open the engine: {e}")))?;
        for c in campaigns {
            engine
                .put_campaign(&c.id, c.def.clone())
                .map_err(|e| SimError(format!("campaign {:?}: {e}", c.id)))?;
        }
        let stats = RunStats {
            start: opts.start,
            end: opts.end,
            campaigns: campaigns.iter().map(|_| CampaignStats::default()).collect(),
            ..RunStats::default()
        };
        Ok(Runner {
            campaigns,
            clock,
            engine,
            rng: Xoshiro256PlusPlus::seed_from_u64(opts.seed ^ 0x5eed_1057),
            due: VecDeque::new(),
            next_sample: opts.start,
            opts,
            stats,
        })
    }

    /// Runs every request, then the commits and samples still due up to the end.
    pub fn run(mut self, traffic: impl Iterator<Item = Request>) -> Result<RunStats, SimError> {
        let t0 = Instant::now();
        for req in traffic {
            if req.at >= self.opts.end {
                break;
            }
            self.advance_to(req.at)?;
            self.request(req)?;
        }
        self.advance_to(self.opts.end)?;
        // Commits of the last requests land after the end; they count.
        while let Some(d) = self.due.pop_front() {
            self.commit(d)?;
        }
        self.stats.wall = t0.elapsed();
        Ok(self.stats)
    }

    /// Handles the commits and samples due at or before `t`, in time order
    /// (a sample before a commit at the same instant).
    fn advance_to(&mut self, t: Nanos) -> Result<(), SimError> {
        loop {
            let commit_at = self.due.front().map(|d| d.at).filter(|&a| a <= t);
            let sample_at = Some(self.next_sample).filter(|&s| s <= t && s <= self.opts.end);
            match (commit_at, sample_at) {
                (_, Some(s)) if commit_at.is_none_or(|c| s <= c) => {
                    self.sample(s)?;
                    self.next_sample = s + self.opts.sample_every;
                }
                (Some(_), _) => {
                    if let Some(d) = self.due.pop_front() {
                        self.commit(d)?;
                    }
                }
                _ => return Ok(()),
            }
        }
    }

    fn sample(&mut self, at: Nanos) -> Result<(), SimError> {
        self.clock.set(at);
        for (i, c) in self.campaigns.iter().enumerate() {
            if c.budget.is_none() {
                continue;
            }
            let d = self
                .engine
                .delivery(&c.id)
                .map_err(|e| SimError(format!("delivery of {:?}: {e}", c.id)))?;
            self.stats.campaigns[i].samples.push(Sample {
                at,
                period_start: d.period_start,
                spent: d.spent,
                pending: d.pending,
                cap: d.cap_now,
            });
        }
        Ok(())
    }

    fn request(&mut self, req: Request) -> Result<(), SimError> {
        self.clock.set(req.at);
        self.stats.requests += 1;
        let candidates = req
            .candidates
            .iter()
            .map(|&i| {
                let c = &self.campaigns[usize::from(i)];
                ScreenCandidate {
                    campaign: c.id.clone(),
                    cost: Some(c.cost),
                }
            })
            .collect();
        let screen = ScreenRequest {
            priority: Default::default(),
            user: Some(req.user_name.clone()),
            ids: household_ids(&req.household),
            candidates,
            reserve: true,
            ttl_ms: Some(self.opts.ttl_ms),
            reservation_id: None,
            fingerprint: None,
        };
        let out = self
            .engine
            .screen(&screen)
            .map_err(|e| SimError(format!("screen at {}: {e}", req.at)))?;
        let mut winner = None;
        for (k, r) in out.results.iter().enumerate() {
            let ci = req.candidates[k];
            let st = &mut self.stats.campaigns[usize::from(ci)];
            st.candidacies += 1;
            if r.eligible {
                st.eligible += 1;
                // The ad server's auction: the first eligible candidate wins.
                winner.get_or_insert(ci);
            } else if let Some(d) = &r.denied_by {
                let key = if d.campaign == r.campaign {
                    d.cap.clone()
                } else {
                    format!("{}/{}", d.campaign, d.cap)
                };
                *st.denials.entry(key).or_insert(0) += 1;
            }
        }
        let (Some(id), Some(winner)) = (out.reservation, winner) else {
            return Ok(());
        };
        self.stats.reserved += 1;
        if self.opts.lost_share > 0.0 && self.rng.random::<f64>() < self.opts.lost_share {
            self.stats.lost += 1;
            return Ok(());
        }
        self.due.push_back(Due {
            at: req.at + self.opts.commit_delay,
            reserved_at: req.at,
            id,
            winner,
            user: req.user,
            user_name: req.user_name,
            household: req.household,
        });
        Ok(())
    }

    fn commit(&mut self, d: Due) -> Result<(), SimError> {
        self.clock.set(d.at);
        let c = &self.campaigns[usize::from(d.winner)];
        let req = CommitRequest {
            campaigns: vec![c.id.clone()],
            cost: Some(c.cost),
            event_id: None,
            // With user, campaign and cost, a commit after the reservation
            // expired still counts, as a late commit (the impression happened).
            user: Some(d.user_name.clone()),
            ids: household_ids(&d.household),
            sample: None,
        };
        match self.engine.commit(&d.id, &req) {
            Ok(o) => {
                if o.outcome == crate::engine::Outcome::LateCommit {
                    self.stats.late_commits += 1;
                }
            }
            Err(e) => {
                self.stats.commit_errors += 1;
                if self.stats.commit_errors == 1 {
                    eprintln!("simulate: commit of {:?} failed: {e}", d.id);
                }
                return Ok(());
            }
        }
        self.stats.commits += 1;
        let st = &mut self.stats.campaigns[usize::from(d.winner)];
        st.wins += 1;
        st.spend += c.cost;
        deliver(c, st, c.budget_units(), d.reserved_at, d.at);
        let (ps, _) = c.period_of(d.reserved_at);
        st.periods.entry(ps).or_default().impressions += 1;
        *st.per_user_day
            .entry((d.user, c.day_of(d.reserved_at)))
            .or_insert(0) += 1;
        if let Some((h, _)) = &d.household {
            *st.per_household_day
                .entry((*h, c.day_of(d.reserved_at)))
                .or_insert(0) += 1;
        }
        // A click follows, at once, with the campaign's rate.
        if let Some(k) = c.clicks
            && self.rng.random::<f64>() < k.ctr
        {
            let click = crate::engine::Event {
                user: Some(d.user_name.clone()),
                ids: household_ids(&d.household),
                campaign: c.id.clone(),
                cost: k.cost,
                event_id: None,
                event_type: Some(crate::model::EventType::CLICK.to_string()),
            };
            match self.engine.events(&[click]) {
                Ok(_) => {
                    let st = &mut self.stats.campaigns[usize::from(d.winner)];
                    st.clicks += 1;
                    deliver(c, st, c.click_units(), d.at, d.at);
                }
                Err(e) => eprintln!("simulate: a click on {:?} failed: {e}", c.id),
            }
        }
        Ok(())
    }
}
