//! A campaign's day minute by minute (docs/semantics.md §7.4), for the
//! ad-ops page (`/ui`) and `GET /v1/campaigns/{id}/timeline`: spend,
//! commits and cap hits per minute over the current and the previous budget
//! period, the pacing line, and impressions per user against the user cap.
//!
//! Minutes are kept sparse (only those with activity), in memory beside
//! the campaign's record and across its redefinitions, and written to the
//! store behind (at most every 10 s, by the sweeper, and at shutdown), so a
//! restart does not blank the page; a `kill -9` may lose the last 10 s.
//!
//! With a shared store (docs/cluster.md, "Timelines") the minutes are the
//! fleet's: each node adds what it counted since its last flush to the
//! store's copy (at most every [`SHARED_FLUSH_EVERY`]), and a timeline is
//! answered from the store, so every node answers the same figures and a
//! node's restart loses nothing but its last unflushed 2 s.

use std::sync::PoisonError;

use crate::clock::{Clock, Nanos};
use crate::limits::{Item, calendar};
use crate::model::Scope;

use super::minutes::{Bucket, MINUTE, PerUser, Timeline};
use super::record::SubjectRecord;
use super::registry::CampaignEntry;
use super::{Engine, EngineError};

/// How often impressions per user are counted again: a walk of the whole
/// hot tier, one shard lock at a time.
const PER_USER_EVERY: Nanos = 30_000_000_000;

/// How often changed timelines are written: each write is the whole map (at
/// most 2 880 minutes, ~100 KB, for a daily budget; up to ~4 MB for a busy
/// monthly one), so not every second; a `kill -9` may lose this much.
pub const FLUSH_EVERY: Nanos = 10_000_000_000;

/// How often, with a shared store, each node adds its new counts to the
/// fleet's timelines: one round trip (a `MULTI`/`EXEC` of `HINCRBY`s) per
/// campaign with activity, on the sweeper's thread, never a decision's; a
/// `kill -9` may lose this much of the node's counts. Every node's timeline
/// then shows a commit within this plus a sweep (250 ms): under the 2 s
/// docs/cluster.md promises (it was 2 s, which could not keep that bound).
pub const SHARED_FLUSH_EVERY: Nanos = 1_000_000_000;

/// The store key of campaign `id`'s timeline.
pub(crate) fn timeline_key(id: u32) -> Vec<u8> {
    let mut k = b"t".to_vec();
    k.extend_from_slice(&id.to_be_bytes());
    k
}

/// The current period of campaign `c` at `now` and the start of the one
/// before: its budget's, else the UTC day.
pub(crate) fn periods(c: &CampaignEntry, now: Nanos) -> ((Nanos, Nanos), Nanos) {
    match budget_of(c) {
        Some(b) => {
            let (start, end) = b.calendar.bounds(now);
            ((start, end), b.calendar.bounds(start.saturating_sub(1)).0)
        }
        None => {
            let day = calendar::nominal_nanos(calendar::CalendarUnit::Day);
            let start = now - now % day;
            ((start, start + day), start.saturating_sub(day))
        }
    }
}

fn budget_of(c: &CampaignEntry) -> Option<&crate::limits::budget::Budget> {
    c.compiled.items.iter().find_map(|x| match &x.item {
        Item::Budget(b) => Some(b),
        _ => None,
    })
}

/// Adds the campaign's denials counted since the last call to the current
/// minute (see [`Timeline::denied_seen`]).
fn take_denials(c: &CampaignEntry, t: &mut Timeline, now: Nanos) {
    let relaxed = std::sync::atomic::Ordering::Relaxed;
    let total = c.counts.unknown_user.load(relaxed)
        + c.counts.denied.iter().map(|n| n.load(relaxed)).sum::<u64>();
    // A redefinition starts the counts afresh.
    let seen = if total < t.denied_seen {
        0
    } else {
        t.denied_seen
    };
    if total > seen {
        t.add(now, 0, 0, total - seen);
    }
    t.denied_seen = total;
}

/// One minute of the answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Minute {
    pub start: Nanos,
    pub bucket: Bucket,
}

/// `GET /v1/campaigns/{id}/timeline`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CampaignTimeline {
    pub campaign: String,
    /// The campaign's time zone (its budget's, else the campaign's, else UTC).
    pub tz: String,
    /// The current period and the one before it (the budget's; a UTC day
    /// without a budget).
    pub period: (Nanos, Nanos),
    pub previous_start: Nanos,
    pub now: Nanos,
    /// The budget's amount and pacing name, if it has one.
    pub budget: Option<(u64, String)>,
    /// What the pacing allows by each quarter hour of the current period
    /// (the pacing line), and at `now`; for `throttle`, the line its
    /// controller aims at.
    pub pacing_line: Vec<(Nanos, u64)>,
    /// The budget's pacing levers now, if it keeps them.
    pub levers: Option<crate::limits::budget::Levers>,
    /// Minutes with activity, from `previous_start` on.
    pub minutes: Vec<Minute>,
    /// The first user-scope window or rate cap, and how many users in
    /// memory have used it 0, 1, 2, … times (the last entry: the limit or
    /// more).
    pub per_user: Option<PerUser>,
    /// Candidates denied by each of its items since it was defined (the
    /// per-campaign metrics' counts), `unknown_user` last, each with its
    /// scope (`None`: a budget or max_in_flight).
    pub denied_by_cap: Vec<(String, Option<crate::model::Scope>, u64)>,
    /// Open screen reservations holding one of its candidates.
    pub reservations_open: u64,
    /// The dates its candidates deliver in: the tightest flight of its
    /// chain (docs/semantics.md §6.7), if any.
    pub flight: Option<(Nanos, Nanos)>,
    /// The spans of the current period in which a schedule of its chain
    /// keeps its candidates ineligible (§6.8), ordered and disjoint; at
    /// most [`MAX_CLOSED`].
    pub closed: Vec<(Nanos, Nanos)>,
}

/// The most closed spans a timeline names: a 92-day flight of one span a
/// day has 93.
const MAX_CLOSED: usize = 1_000;

/// The tightest flight of `chain` (each campaign's own, intersected).
fn chain_flight(chain: &[std::sync::Arc<CampaignEntry>]) -> Option<(Nanos, Nanos)> {
    chain
        .iter()
        .filter_map(|e| e.compiled.flight)
        .reduce(|(a, b), (c, d)| (a.max(c), b.min(d).max(a.max(c))))
}

/// The spans of `[start, end)` some schedule of `chain` is closed in.
fn closed_spans(
    chain: &[std::sync::Arc<CampaignEntry>],
    (start, end): (Nanos, Nanos),
) -> Vec<(Nanos, Nanos)> {
    let mut closed: Vec<(Nanos, Nanos)> = Vec::new();
    for s in chain.iter().filter_map(|e| e.compiled.schedule.as_ref()) {
        let mut t = start;
        for (a, b) in s.open_spans(start, end) {
            if t < a {
                closed.push((t, a));
            }
            t = b;
        }
        if t < end {
            closed.push((t, end));
        }
    }
    let mut merged = crate::limits::schedule::merge_spans(closed);
    merged.truncate(MAX_CLOSED);
    merged
}

impl<C: Clock> Engine<C> {
    /// Every campaign's id, sorted, and whether it has a budget (the ad-ops
    /// page's list).
    pub fn campaign_list(&self) -> Vec<(String, bool)> {
        let reg = self.registry();
        let mut v: Vec<(String, bool)> = reg
            .campaigns
            .iter()
            .map(|(n, e)| (n.clone(), e.def.budget.is_some()))
            .collect();
        v.sort_unstable();
        v
    }

    /// A campaign's timeline (docs/semantics.md §7.4).
    pub fn timeline(&self, campaign: &str) -> Result<CampaignTimeline, EngineError> {
        let now = self.now();
        let reg = self.registry();
        let Some(c) = reg.campaigns.get(campaign) else {
            return Err(EngineError::NotFound(format!(
                "no campaign named {campaign:?}"
            )));
        };
        let budget = budget_of(c);
        let tz = c
            .def
            .budget
            .as_ref()
            .and_then(|b| match &b.limit {
                crate::model::LimitDef::Budget(d) => d.tz.clone(),
                _ => None,
            })
            .or_else(|| c.def.tz.clone())
            .unwrap_or_else(|| "UTC".into());
        let (period, previous_start) = periods(c, now);
        let chain = reg.chain(campaign).map(|c| &c[..]).unwrap_or_default();
        let closed = closed_spans(chain, period);
        let mut pacing_line = Vec::new();
        if let Some(b) = budget {
            let (start, end) = period;
            // Every quarter hour, or 2 000 points over a long flight; and
            // where a schedule opens or closes, where the line bends.
            let step = (15 * MINUTE).max((end - start) / 2_000);
            let mut times: Vec<Nanos> = (0..)
                .map(|i| start + i * step)
                .take_while(|t| *t < end)
                .take(5_000)
                .collect();
            times.extend(closed.iter().flat_map(|&(a, b)| [a, b]));
            times.push(end);
            times.sort_unstable();
            times.dedup();
            pacing_line = times
                .into_iter()
                .map(|t| (t, b.line(start, end, t)))
                .collect();
        }
        // The levers, as a screen would answer them now.
        let levers = c
            .compiled
            .items
            .iter()
            .position(|x| matches!(x.item, Item::Budget(_)))
            .zip(budget)
            .and_then(|(i, b)| {
                let rec = c.record.lock().unwrap_or_else(PoisonError::into_inner);
                self.levers_of(c, i, b, rec.state(c.id, c.tags[i]), now)
            });
        let mut timeline = c.timeline.lock().unwrap_or_else(PoisonError::into_inner);
        take_denials(c, &mut timeline, now);
        let minutes =
            self.timeline_minutes(c.id, timeline, previous_start / MINUTE, now / MINUTE)?;
        let budget_figures = budget.map(|b| (b.amount, b.pacing_name().to_owned()));
        let per_user = {
            let mut cached = c
                .counts
                .per_user
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            match &*cached {
                Some((at, p)) if now.saturating_sub(*at) < PER_USER_EVERY => Some(p.clone()),
                _ => {
                    let p = self.per_user(c);
                    *cached = p.clone().map(|p| (now, p));
                    p
                }
            }
        };
        let relaxed = std::sync::atomic::Ordering::Relaxed;
        let mut denied_by_cap: Vec<(String, Option<Scope>, u64)> = c
            .compiled
            .items
            .iter()
            .zip(c.counts.denied.iter())
            .map(|(cap, n)| {
                let counted = !matches!(cap.item, Item::Budget(_) | Item::Concurrency(_));
                let scope = counted.then_some(cap.scope);
                (cap.name.clone(), scope, n.load(relaxed))
            })
            .collect();
        denied_by_cap.push((
            "unknown_user".into(),
            Some(Scope::User),
            c.counts.unknown_user.load(relaxed),
        ));
        if c.def.flight.is_some() {
            denied_by_cap.push(("flight".into(), None, c.counts.out_of_flight.load(relaxed)));
        }
        if c.def.schedule.is_some() {
            denied_by_cap.push(("schedule".into(), None, c.counts.off_schedule.load(relaxed)));
        }
        let reservations_open = self.reservations.open_by_campaign(&[&c.name])[0];
        Ok(CampaignTimeline {
            denied_by_cap,
            reservations_open,
            campaign: c.name.to_string(),
            tz,
            period,
            previous_start,
            now,
            budget: budget_figures,
            pacing_line,
            levers,
            minutes,
            per_user,
            flight: chain_flight(chain),
            closed,
        })
    }

    /// How many users in memory used the campaign's first user-scope cap
    /// how often (the hot tier holds every user seen within `idle_grace`).
    fn per_user(&self, c: &CampaignEntry) -> Option<PerUser> {
        let now = self.now();
        let (i, cap) = c.compiled.items.iter().enumerate().find(|(_, x)| {
            x.scope == Scope::User && matches!(x.item, Item::Window(_) | Item::Rate { .. })
        })?;
        let limit = cap.item.limit();
        let n = usize::try_from(limit.min(99)).unwrap_or(99) + 1;
        let mut users = vec![0u64; n];
        let tag = c.tags[i];
        self.hot.for_each(|rec: &SubjectRecord| {
            if let Some(st) = rec.state(c.id, tag) {
                let (remaining, _) = cap.item.figures(st, now);
                let used = limit.saturating_sub(remaining);
                if let Some(u) = users.get_mut(usize::try_from(used).unwrap_or(n - 1).min(n - 1)) {
                    *u += 1;
                }
            }
        });
        Some(PerUser {
            cap: cap.name.clone(),
            limit,
            users,
        })
    }

    /// Adds the denials counted since the last call to each campaign's
    /// minutes; writes the timelines changed since they were last written
    /// (behind), at most every [`FLUSH_EVERY`] unless `force` (shutdown),
    /// and drops minutes older than the previous period (the sweeper calls
    /// it every second).
    pub fn flush_timelines(&self, force: bool) {
        let now = self.now();
        let reg = self.registry();
        // Denials reach the minutes every call (every second).
        for c in reg.campaigns.values() {
            take_denials(
                c,
                &mut c.timeline.lock().unwrap_or_else(PoisonError::into_inner),
                now,
            );
        }
        let last = self
            .timelines_flushed_at
            .load(std::sync::atomic::Ordering::Relaxed);
        if !force && now.saturating_sub(last) < self.timelines_flush_every() {
            return;
        }
        self.timelines_flushed_at
            .store(now, std::sync::atomic::Ordering::Relaxed);
        self.write_timelines(&reg, now);
    }
}
