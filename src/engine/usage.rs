//! What a user has used of a campaign's caps, and a campaign's budget
//! delivery: figures read without deciding anything.

use std::sync::PoisonError;

use crate::clock::{Clock, Nanos};
use crate::limits::Item;
use crate::model::Kind;

use super::chain::FRESH;
use super::hot::Reads;
use super::record::SubjectRecord;
use super::{Engine, EngineError};

/// One cap's usage for a user (`GET /v1/users/{u}/campaigns/{c}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapUsage {
    /// The campaign in the chain that owns the cap.
    pub campaign: String,
    pub name: String,
    pub scope: crate::model::Scope,
    pub kind: &'static str,
    /// The event type it counts (docs/semantics.md §6.9).
    pub event: crate::model::EventType,
    pub limit: u64,
    /// Committed debits counted now.
    pub used: u64,
    /// Debits of open reservations.
    pub pending: u64,
    pub remaining: u64,
    pub reset_after: crate::clock::Span,
}

/// A campaign's budget now (`GET /v1/campaigns/{c}/delivery`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub campaign: String,
    pub amount: u64,
    pub spent: u64,
    pub pending: u64,
    /// What the pacing allows to have been spent by now in this period.
    pub cap_now: u64,
    pub period_start: Nanos,
    pub period_end: Nanos,
    /// The budget's pacing levers now, if it keeps them (docs/pacing.md,
    /// "Levers").
    pub levers: Option<crate::limits::budget::Levers>,
}

impl<C: Clock> Engine<C> {
    /// Each cap of `campaign` and its ancestors for `user` (docs/semantics.md §7.2).
    pub fn user_usage(&self, user: &str, campaign: &str) -> Result<Vec<CapUsage>, EngineError> {
        self.check_id("user", user)?;
        self.usage_of(Kind::USER, user, campaign)
    }

    /// Each cap of `campaign` and its ancestors scoped to identity kind
    /// `kind` (`household`), for identity `id`, and the campaign-scope ones
    /// (docs/semantics.md §7.2).
    pub fn identity_usage(
        &self,
        kind: &str,
        id: &str,
        campaign: &str,
    ) -> Result<Vec<CapUsage>, EngineError> {
        let k = Kind::parse(kind).map_err(|e| super::invalid("kind", e))?;
        self.check_id(kind, id)?;
        self.usage_of(k, id, campaign)
    }

    fn usage_of(&self, kind: Kind, id: &str, campaign: &str) -> Result<Vec<CapUsage>, EngineError> {
        let now = self.now();
        self.expire_step(now, Reads::MayWait);
        let reg = self.registry();
        let Some(c) = reg.campaigns.get(campaign) else {
            return Err(EngineError::NotFound(format!(
                "no campaign named {campaign:?}"
            )));
        };
        let id_rec = self.record_figures(self.identity_record(kind, id))?;
        let mut out = Vec::new();
        for id in &c.chain {
            let Some(e) = reg.campaign_by_id(*id) else {
                continue;
            };
            // The fleet's use of campaign-scope items, read before the
            // campaign's lock is taken.
            let mut fleet = Vec::with_capacity(e.compiled.items.len());
            for (i, cap) in e.compiled.items.iter().enumerate() {
                fleet.push(match cap.scope {
                    crate::model::Scope::Campaign if matches!(cap.item, Item::Window(_)) => {
                        self.fleet_committed(e, i, now)?
                    }
                    _ => None,
                });
            }
            let camp = e.record.lock().unwrap_or_else(PoisonError::into_inner);
            for (i, cap) in e.compiled.items.iter().enumerate() {
                if !matches!(cap.item, Item::Rate { .. } | Item::Window(_)) {
                    continue;
                }
                // Not the campaign's: it opts out of it (§6.9).
                if c.ignored.contains(&(e.id, e.tags[i])) {
                    continue;
                }
                let rec: &SubjectRecord = match cap.scope {
                    crate::model::Scope::Campaign => &camp,
                    s if s.kind() == Some(kind) => &id_rec,
                    _ => continue,
                };
                let t = e.tags[i];
                let st = rec.state(e.id, t).unwrap_or(&FRESH);
                let (remaining, reset_after) = cap.item.figures(st, now);
                let limit = cap.item.limit();
                let pending = rec.pending_on(e.id, t);
                // A window's own count, which a lowered limit may leave
                // above the limit; the other kinds' from their figures.
                let here = cap
                    .item
                    .counted(st, now)
                    .unwrap_or_else(|| limit.saturating_sub(remaining));
                let (used, remaining) = match fleet[i] {
                    Some(used) => (used, limit.saturating_sub(used).saturating_sub(pending)),
                    None => (here.saturating_sub(pending), remaining),
                };
                out.push(CapUsage {
                    campaign: e.name.to_string(),
                    name: cap.name.clone(),
                    scope: cap.scope,
                    kind: cap.item.kind().as_str(),
                    event: cap.event,
                    limit,
                    used,
                    pending,
                    remaining,
                    reset_after,
                });
            }
        }
        Ok(out)
    }

    /// A campaign's budget delivery now (docs/semantics.md §7.3).
    pub fn delivery(&self, campaign: &str) -> Result<Delivery, EngineError> {
        let now = self.now();
        self.expire_step(now, Reads::MayWait);
        let reg = self.registry();
        let Some(c) = reg.campaigns.get(campaign) else {
            return Err(EngineError::NotFound(format!(
                "no campaign named {campaign:?}"
            )));
        };
        let Some((i, cap)) = c
            .compiled
            .items
            .iter()
            .enumerate()
            .find(|(_, x)| matches!(x.item, Item::Budget(_)))
        else {
            return Err(EngineError::NotFound(format!(
                "campaign {campaign:?} has no budget"
            )));
        };
        let Item::Budget(b) = &cap.item else {
            return Err(EngineError::NotFound(format!(
                "campaign {campaign:?} has no budget"
            )));
        };
        // The fleet's spend, read before the campaign's lock is taken.
        let fleet = self.fleet_committed(c, i, now)?;
        // An adaptive budget on a fleet paces by the fleet's plan: its cap,
        // not the one this node's own spend would plan.
        let fleet_cap = self.fleet_plan_cap(c, i, now);
        let rec = c.record.lock().unwrap_or_else(PoisonError::into_inner);
        let st = match rec.state(c.id, c.tags[i]) {
            Some(crate::limits::ItemState::Budget(s)) => **s,
            _ => Default::default(),
        };
        let v = b.view(&st, now);
        let cap_now = fleet_cap.unwrap_or(v.cap);
        let levers = self.levers_of(c, i, b, rec.state(c.id, c.tags[i]), now);
        Ok(Delivery {
            campaign: c.name.to_string(),
            amount: cap.item.limit(),
            spent: fleet.unwrap_or(v.spent),
            pending: v.pending,
            cap_now,
            period_start: v.period.0,
            period_end: v.period.1,
            levers,
        })
    }
}
