//! Spend reported to the fleet (at a commit, or batched at renewal, and all
//! of it at shutdown), and a reservation's holds charged by the node that
//! committed it on another node's behalf or given up by the node that made
//! it (docs/cluster.md, "A commit on another node").

use std::sync::Arc;

use crate::clock::{Clock, Nanos};
use crate::limits::ItemState;
use crate::model::Scope;
use crate::store::StoreError;

use crate::engine::registry::CampaignEntry;
use crate::engine::{Engine, SpendReports};

use super::*;

impl<C: Clock> Engine<C> {
    /// Reports this node's committed spend on the leased items of `chains`
    /// (after a commit or an event) where more is unreported than a node
    /// may leave (all of it with `spend_reports = "commit"`, beyond
    /// [`unreported_bound`] with `"batched"`), so a node that dies next
    /// loses none of it, or no more than the bound the store counts as
    /// spent. Reports coalesce: one waiting for another finds its spend
    /// reported and makes no call.
    pub(crate) fn report_spend<'a>(
        &self,
        chains: impl IntoIterator<Item = &'a Arc<CampaignEntry>>,
    ) -> Result<(), StoreError> {
        let Some(shared) = self.shared() else {
            return Ok(());
        };
        let mut due: Vec<(&Arc<CampaignEntry>, usize)> = Vec::new();
        let now = self.now();
        for e in chains {
            if due.iter().any(|(d, _)| d.id == e.id) {
                continue;
            }
            for i in 0..e.compiled.items.len() {
                if self.spend_due(e, i, now).is_some() {
                    due.push((e, i));
                }
            }
        }
        if due.is_empty() {
            // Nothing past its bound (batched reports, most commits): no
            // wait on the reporting lock, which is held across round trips.
            return Ok(());
        }
        let _one = self.leases.one_report();
        let now = self.now();
        for (e, i) in due {
            // Again under the lock: a report made meanwhile may have
            // covered it.
            if let Some((key, v, want)) = self.spend_due(e, i, now) {
                self.lease_call(shared, key, &e.compiled.items[i].item, &v, want, now)?;
            }
        }
        Ok(())
    }

    /// Whether item `i` of campaign `e` has more spend unreported than this
    /// node may leave, and if so its grant, view and want (the headroom it
    /// holds, kept).
    pub(super) fn spend_due(
        &self,
        e: &CampaignEntry,
        i: usize,
        now: Nanos,
    ) -> Option<(GrantKey, LeaseView, u64)> {
        let cap = &e.compiled.items[i];
        if cap.scope != Scope::Campaign || !leasable(&cap.item) {
            return None;
        }
        let (key, v) = campaign_view(&self.leases, e, i, now).filter(|(_, v)| !v.slots)?;
        let (reported, granted, given) = {
            let mut grants = self.leases.lock();
            if v.committed > grants.get(&key).map_or(0, |g| g.reported) {
                // Spend the renewal must report within a second, even on an
                // item this node holds no grant of (an event counted here):
                // it renews only the grants it knows. Before, an event's
                // spend on a budget above 1 000 units was never reported
                // (delivery read 7 on the node that counted it, 0 on the
                // others, for good).
                let g = grants.entry(key).or_default();
                g.end = g.end.max(v.end);
            }
            grants
                .get(&key)
                .map_or((0, 0, 0), |g| (g.reported, g.granted, g.given))
        };
        let may_leave = match self.options.spend_reports {
            SpendReports::Batched => unreported_bound(&cap.item),
            SpendReports::Commit => 0,
        };
        (v.committed.saturating_sub(reported) > may_leave).then(|| {
            (
                key,
                v,
                granted.saturating_sub(v.committed).saturating_sub(given),
            )
        })
    }

    /// The sweeper's part (every 250 ms): renews the grants in use,
    /// reporting their spend, and forgets ended periods.
    pub(crate) fn renew_leases(&self) {
        self.renew_leases_as(false);
    }

    /// At a clean shutdown: reports every unit committed and not reported
    /// yet, and every hold given up, so the fleet reads them at once and
    /// counts no headroom of this node as spent once it is reclaimed.
    pub fn report_all_spend(&self) {
        self.renew_leases_as(true);
    }

    /// Units committed on this node and not reported to the store yet, over
    /// every leased item: what other nodes' delivery, usage and timelines
    /// lack now (`freqcap_unreported_units`; each is reported within a
    /// second of its commit, docs/cluster.md).
    pub fn unreported_units(&self) -> u64 {
        if self.shared().is_none() {
            return 0;
        }
        let now = self.now();
        let keys: Vec<(GrantKey, u64)> = self
            .leases
            .lock()
            .iter()
            .filter(|(_, g)| !g.slots)
            .map(|(k, g)| (*k, g.reported))
            .collect();
        let reg = self.registry();
        keys.into_iter()
            .filter_map(|(key, reported)| {
                let Leased::Campaign(id) = key.0 else {
                    return None;
                };
                let e = reg.campaign_by_id(id)?;
                let i = e.tags.iter().position(|&t| t == key.1)?;
                let (_, v) = campaign_view(&self.leases, e, i, now)
                    .filter(|(k, v)| *k == key && v.line.is_none())?;
                Some(v.committed.saturating_sub(reported))
            })
            .sum::<u64>()
            + self.hot_unreported(now)
    }

    pub(super) fn renew_leases_as(&self, all: bool) {
        let Some(shared) = self.shared() else {
            return;
        };
        let now = self.now();
        self.leases.prune(now);
        // Few: one per leased item per period this node decided on.
        let due: Vec<GrantKey> = self.leases.lock().keys().copied().collect();
        let reg = self.registry();
        for key in due {
            let Leased::Campaign(id) = key.0 else {
                continue;
            };
            let Some(e) = reg.campaign_by_id(id) else {
                continue;
            };
            let Some(i) = e.tags.iter().position(|&t| t == key.1) else {
                continue;
            };
            let Some((_, v)) = campaign_view(&self.leases, e, i, now).filter(|(k, _)| *k == key)
            else {
                continue;
            };
            self.renew_grant(shared, key, &e.compiled.items[i].item, &v, all, now);
        }
        self.renew_hot_keys(shared, all, now);
    }

    /// Renews grant `key` (of `item`, as `v` sees it) if it is due: in use
    /// and lapsing, or with spend or given units unreported (`all`: any
    /// unreported, at shutdown).
    pub(super) fn renew_grant(
        &self,
        shared: &dyn crate::store::Shared,
        key: GrantKey,
        item: &crate::limits::Item,
        v: &LeaseView,
        all: bool,
        now: Nanos,
    ) {
        let Some(g) = self.leases.lock().get(&key).cloned() else {
            return;
        };
        // Only grants in use: one used since the last call is renewed
        // before it lapses, and unreported spend is reported once a
        // second. An idle grant is left to lapse; its headroom stays this
        // node's, and the next decision that needs it refreshes it.
        let lapsing = g.usable_until <= now + LEASE_TTL / 4;
        let in_use = g.used_at >= g.called_at;
        let due = if v.slots {
            // Slots held beyond those in use (and a spare while
            // decisions use the grant) go back once a second, so an
            // idle node keeps none.
            (lapsing && in_use)
                || (g.granted > v.pending + u64::from(in_use)
                    && now >= g.called_at.saturating_add(REPORT_EVERY))
        } else {
            // Units given to other nodes are reported as spend is: until
            // then the store counts them twice (fewer granted, never
            // more).
            // Given units at the next tick (250 ms): while unreported
            // they are counted twice, and a burst of spread commits
            // near a budget's end found the pool short (140 of 200 in
            // `leased_budgets_and_campaign_caps_hold_across_nodes`
            // when they waited for the 1 s renewal).
            let unreported = g.reported < v.committed;
            (lapsing && in_use)
                || g.given_reported < g.given
                || (unreported
                    && (all || lapsing || now >= g.called_at.saturating_add(REPORT_EVERY)))
        };
        if !due {
            return;
        }
        let want = if v.slots {
            u64::from(in_use)
        } else {
            self.want(key, v, 1, now) + v.pending
        };
        if let Err(err) = self.lease_call(shared, key, item, v, want, now) {
            tracing::debug!("lease renewal of {:?} failed: {err}", key.0);
        }
    }

    /// Charges the campaign-side spend of `winners`, committed here of a
    /// reservation another node made (its holds are in that node's grants):
    /// each leased item's units are reported at once as this node's
    /// `foreign` (spent, not out of its grant), so they count even if that
    /// node dies before its deadline; it gives its holds up when it learns
    /// of the commit ([`Engine::give_up_hold`]). An error: nothing more is
    /// reported, and the commit is not acknowledged (a report applied whose
    /// answer was lost counts the units twice: fewer granted, never more).
    pub(crate) fn charge_foreign(
        &self,
        winners: &[crate::engine::placement::ForeignWinner],
        final_cost: Option<u64>,
    ) -> Result<(), StoreError> {
        let Some(shared) = self.shared() else {
            return Ok(());
        };
        let reg = self.registry();
        let _one = self.leases.one_report();
        let now = self.now();
        for w in winners {
            let Some(chain) = reg.chain_by_id(w.campaign) else {
                continue;
            };
            // Budgets are charged the final cost, else what was reserved
            // (docs/semantics.md §6.5); caps the impression.
            let cost = final_cost.unwrap_or(w.cost);
            for e in chain.iter() {
                for (i, cap) in e.compiled.items.iter().enumerate() {
                    if cap.scope != Scope::Campaign || !leasable(&cap.item) {
                        continue;
                    }
                    let Some((key, v)) = campaign_view(&self.leases, e, i, now)
                        .filter(|(_, v)| !v.slots && v.line.is_none())
                    else {
                        continue;
                    };
                    let n = crate::engine::chain::units(&cap.item, cost);
                    let want = {
                        let mut grants = self.leases.lock();
                        let g = grants.entry(key).or_default();
                        g.foreign += n;
                        g.granted
                            .saturating_sub(v.committed)
                            .saturating_sub(g.given)
                    };
                    if let Err(err) = self.lease_call(shared, key, &cap.item, &v, want, now) {
                        let mut grants = self.leases.lock();
                        let g = grants.entry(key).or_default();
                        g.foreign = g.foreign.saturating_sub(n);
                        return Err(err);
                    }
                }
            }
        }
        Ok(())
    }

    /// Gives up `n` units this node holds on item `tag` of campaign `e`
    /// (its state `st`, as of `at`), committed and charged by another node
    /// ([`Engine::charge_foreign`]): out of this node's grant, never spent
    /// here. Reported with the grant's next renewal.
    pub(crate) fn give_up_hold(
        &self,
        e: &CampaignEntry,
        tag: u32,
        st: &ItemState,
        n: u64,
        at: Nanos,
    ) {
        let Some(i) = e.tags.iter().position(|&t| t == tag) else {
            return;
        };
        let Some(v) = view(&e.compiled.items[i].item, st, 0, at) else {
            return;
        };
        self.leases
            .lock()
            .entry((Leased::Campaign(e.id), tag, v.start))
            .or_default()
            .given += n;
    }

    /// This node's grants now (figures): how many, and units held beyond
    /// what was reported spent.
    pub fn grants_outstanding(&self) -> (usize, u64) {
        let g = self.leases.lock();
        (
            g.len(),
            g.values()
                .map(|g| g.granted.saturating_sub(g.reported).saturating_sub(g.given))
                .sum(),
        )
    }

    /// Budget `b` (item `i` of campaign `c`, state `st`)'s levers now, if it
    /// keeps them: on a shared store, the controller this node runs on the
    /// fleet's spend, as a screen answers them.
    pub(crate) fn levers_of(
        &self,
        c: &CampaignEntry,
        i: usize,
        b: &crate::limits::budget::Budget,
        st: Option<&crate::limits::ItemState>,
        now: Nanos,
    ) -> Option<crate::limits::budget::Levers> {
        if !b.has_levers() {
            return None;
        }
        let st = st.unwrap_or(&crate::engine::chain::FRESH);
        Some(match self.placement.is_local() {
            true => b.levers(&crate::limits::budget_state(st), now),
            false => self.leases.levers((c.id, c.tags[i]), b, st, now),
        })
    }
}
