//! The per-definition metrics' figures (docs/service.md, "Per-definition
//! metrics"), read at scrape time: which definitions are reported (an
//! allow-list, plus the most active ones) and what each has counted.
//! Opt-in and bounded, so what clients send never grows the number of
//! series.
//!
//! With a shared store the most active campaigns are the fleet's (the
//! store's activity totals of today and yesterday, UTC, read every
//! [`FLEET_TOP_EVERY`] by the sweeper, never at a scrape), so every node
//! exports the same campaigns; each exports its own counts of them, which
//! Prometheus sums.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Mutex, PoisonError};

use crate::clock::{Clock, Nanos};

use super::Engine;

/// How often the fleet's most active campaigns are read again: one
/// `ZREVRANGE` per node every 5 s.
pub const FLEET_TOP_EVERY: Nanos = 5_000_000_000;

/// Ids read beyond those exported: room for the allow-listed campaigns and
/// deleted ones still in the totals.
const FLEET_TOP_SPARE: usize = 32;

/// The fleet's most active campaigns as last read, with a shared store.
#[derive(Default)]
pub(crate) struct FleetTop {
    /// How many to read (0: the per-definition metrics are off).
    pub(crate) wanted: AtomicUsize,
    /// When last read (engine time).
    pub(crate) at: AtomicU64,
    /// (campaign id, activity), the most active first; `None` before the
    /// first read.
    pub(crate) top: Mutex<Option<Vec<(u32, u64)>>>,
}

/// One campaign's figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CampaignFigures {
    pub campaign: String,
    /// Candidates found eligible (shadow mode's would-deny ones apart).
    pub eligible: u64,
    pub would_deny: u64,
    /// Denials by each of its items (by name), `unknown_user` included,
    /// zero or not: one series per item whatever the traffic.
    pub denied: Vec<(String, u64)>,
    pub commits: u64,
    /// Open screen reservations holding one of its candidates.
    pub reservations_open: u64,
    /// The budget's amount, spend, pacing line now and pending spend, if it
    /// has a budget.
    pub budget: Option<BudgetFigures>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetFigures {
    pub amount: u64,
    pub spent: u64,
    pub cap_now: u64,
    pub pending: u64,
}

/// One policy's decisions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyFigures {
    pub policy: String,
    pub allowed: u64,
    pub denied: u64,
    pub would_deny: u64,
    /// Its adaptive item's limit in its last decision, if it has one and
    /// has decided.
    pub adaptive_limit: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DefinitionFigures {
    pub campaigns: Vec<CampaignFigures>,
    pub policies: Vec<PolicyFigures>,
}

/// The ids of `all` to report: those listed in `allow`, then the `top`
/// most active of the rest (by `activity`, ties by id).
fn chosen<'a>(
    all: impl Iterator<Item = (&'a str, u64)>,
    allow: &[String],
    top: usize,
) -> Vec<&'a str> {
    let mut listed = Vec::new();
    let mut rest = Vec::new();
    for (id, activity) in all {
        if allow.iter().any(|a| a == id) {
            listed.push(id);
        } else if top > 0 && activity > 0 {
            rest.push((std::cmp::Reverse(activity), id));
        }
    }
    rest.sort_unstable();
    listed.sort_unstable();
    listed.extend(rest.into_iter().take(top).map(|(_, id)| id));
    listed
}

impl<C: Clock> Engine<C> {
    /// Says how many campaigns `/metrics` exports beyond its allow-list
    /// (with a shared store, the sweeper reads that many of the fleet's
    /// most active).
    pub fn set_metrics_top(&self, top: usize, allowed: usize) {
        let n = if top == 0 {
            0
        } else {
            top + allowed + FLEET_TOP_SPARE
        };
        self.fleet_top.wanted.store(n, Relaxed);
    }

    /// The figures of the definitions `allow` names, plus the `top` most
    /// active other campaigns and policies (by decisions counted).
    pub fn definition_figures(&self, allow: &[String], top: usize) -> DefinitionFigures {
        if allow.is_empty() && top == 0 {
            return DefinitionFigures::default();
        }
        let reg = self.registry();
        let activity = |c: &super::registry::CampaignCounts| {
            c.eligible.load(Relaxed)
                + c.would_deny.load(Relaxed)
                + c.unknown_user.load(Relaxed)
                + c.denied.iter().map(|d| d.load(Relaxed)).sum::<u64>()
        };
        // The fleet's activity once read (a shared store), else this node's.
        let fleet: Option<std::collections::HashMap<u32, u64>> = self
            .fleet_top
            .top
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|t| t.iter().copied().collect());
        let names = chosen(
            reg.campaigns.iter().map(|(n, e)| {
                let a = match &fleet {
                    Some(f) => f.get(&e.id).copied().unwrap_or(0),
                    None => activity(&e.counts),
                };
                (n.as_str(), a)
            }),
            allow,
            top,
        );
        let open = self.reservations.open_by_campaign(&names);
        let mut campaigns = Vec::with_capacity(names.len());
        for (name, open) in names.iter().zip(open) {
            let Some(e) = reg.campaigns.get(*name) else {
                continue;
            };
            let c = &e.counts;
            let mut denied: Vec<(String, u64)> = e
                .compiled
                .items
                .iter()
                .zip(c.denied.iter())
                .map(|(cap, n)| (cap.name.clone(), n.load(Relaxed)))
                .collect();
            denied.push(("unknown_user".into(), c.unknown_user.load(Relaxed)));
            if e.def.flight.is_some() {
                denied.push(("flight".into(), c.out_of_flight.load(Relaxed)));
            }
            if e.def.schedule.is_some() {
                denied.push(("schedule".into(), c.off_schedule.load(Relaxed)));
            }
            let budget = e.def.budget.as_ref().and_then(|_| {
                self.delivery(name).ok().map(|d| BudgetFigures {
                    amount: d.amount,
                    spent: d.spent,
                    cap_now: d.cap_now,
                    pending: d.pending,
                })
            });
            campaigns.push(CampaignFigures {
                campaign: (*name).to_owned(),
                eligible: c.eligible.load(Relaxed),
                would_deny: c.would_deny.load(Relaxed),
                denied,
                commits: c.commits.load(Relaxed),
                reservations_open: open,
                budget,
            });
        }
        let policies = chosen(
            reg.policies.iter().map(|(n, p)| {
                let c = &p.counts;
                let a =
                    c.allowed.load(Relaxed) + c.denied.load(Relaxed) + c.would_deny.load(Relaxed);
                (n.as_str(), a)
            }),
            allow,
            top,
        )
        .into_iter()
        .filter_map(|n| {
            let c = &reg.policies.get(n)?.counts;
            Some(PolicyFigures {
                policy: n.to_owned(),
                allowed: c.allowed.load(Relaxed),
                denied: c.denied.load(Relaxed),
                would_deny: c.would_deny.load(Relaxed),
                adaptive_limit: c.adaptive_limit.load(Relaxed).checked_sub(1),
            })
        })
        .collect();
        DefinitionFigures {
            campaigns,
            policies,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::chosen;

    #[test]
    fn the_allow_list_then_the_most_active() {
        let all = [("a", 5), ("b", 0), ("c", 9), ("d", 7), ("e", 7)];
        let allow = vec!["b".to_owned()];
        assert_eq!(chosen(all.into_iter(), &allow, 2), ["b", "c", "d"]);
        assert_eq!(chosen(all.into_iter(), &allow, 0), ["b"]);
        assert_eq!(chosen(all.into_iter(), &[], 10), ["c", "d", "e", "a"]);
    }
}
