//! Slots and token lines across regions (docs/regions.md, "Caps across
//! regions"): a campaign's rolling window or `max_in_flight` (slots held,
//! then given back) and its rate or gap (a token line) are held at the
//! global tier by regions as they are in a region by its nodes
//! (`fc_slots_v2`, `fc_line_v1`, the region as the holder). What a region
//! is granted binds its nodes through a cap its caller sets in the
//! region's store (`fc_slots_cap_v1`, `fc_line_cap_v1`), which the
//! region's lease functions apply at once: no node can be granted past it,
//! whatever board or grant it last read.
//!
//! Each renewal is made of steps that are each safe whatever happens
//! between them: the cap set to what the region may use now and the
//! region's use read, in one call; that use reported to the tier; the cap
//! set to the new grant (raising it up to what the tier granted is safe,
//! and lowering it always is).

use std::sync::atomic::Ordering;

use crate::clock::{Clock, Nanos};
use crate::engine::{Engine, EngineError};
use crate::store::{LeaseCap, LineRequest, Shared, SlotsRequest};

use super::regions::{REGION_TTL, RegionGrant, Regions, SafeCapacity};
use super::{GrantKey, Line, lease_key};

/// What a region asks beyond its nodes' asks while they ask any: a tenth
/// more (at least one), so a node short of a unit seldom waits a tick for
/// the region's grant to grow; nothing for a region whose nodes ask none
/// (what it held goes back to the other regions).
fn spare(asked: u64) -> u64 {
    match asked {
        0 => 0,
        d => (d / 10).max(1),
    }
}

impl<C: Clock> Engine<C> {
    /// Renews region `r`'s slots of item `key` (a rolling window or
    /// `max_in_flight`; its key at the tier `gkey`) as a node renews its
    /// own (`fc_slots_v2`), in three steps, each safe whatever happens
    /// between them:
    ///
    /// 1. the cap on the region's nodes (`fc_slots_cap_v1`, in the
    ///    region's store) set to what the region may use now — its last
    ///    grant while usable, else its safe capacity — and what the nodes
    ///    hold read in the same call. From then on they may hold at most
    ///    the more of what they hold and the cap: the region's use.
    /// 2. that use reported to the tier, with the nodes' asks: the tier
    ///    grants the region at least that use, and says its fair share.
    /// 3. the cap set to the fair share, at most the grant and what the
    ///    nodes need: raising it to what the tier granted is safe at once,
    ///    and lowering it is always safe (the nodes give slots back as
    ///    their holds end, and the region's next report is less).
    pub(super) fn sync_slots(
        &self,
        r: &Regions,
        shared: &dyn Shared,
        global: &dyn Shared,
        (key, gkey): (GrantKey, &[u8]),
        g: RegionGrant,
        now: Nanos,
    ) -> Result<(), EngineError> {
        let lkey = lease_key(key);
        let ttl_ms = REGION_TTL / 1_000_000;
        let cap = LeaseCap {
            key: &lkey,
            // The region's store's clock: it rises for every node of the
            // region, so a cap an earlier caller set late changes nothing.
            seq: 0,
            cap: if now < g.usable_until {
                g.granted.min(g.total)
            } else {
                region_safe_slots(r, &g)
            },
            key_expire_ms: ttl_ms.saturating_add(3_600_000),
        };
        let nodes = shared.slots_cap(&cap)?;
        if nodes.seq != nodes.now_ms {
            // Another node of the region set a later cap: it renews this.
            return Ok(());
        }
        let used = nodes.held.max(nodes.cap);
        // What the nodes asked and a spare, never more than the cap.
        let need = nodes
            .demand
            .saturating_add(spare(nodes.demand))
            .min(g.total);
        let want = need.saturating_sub(used);
        // Held for the region at the tier until its nodes' holds end (a
        // rolling window's debit: the window's length), plus its grant's
        // life: a slot its nodes take while the grant is usable (80 % of
        // that life, by their clock) ends before the tier frees it.
        let hold_ms = nodes.hold_ms.saturating_add(ttl_ms);
        let req = SlotsRequest {
            key: gkey,
            holder: &r.name,
            seq: nodes.seq,
            used,
            want,
            max: g.total,
            ttl_ms,
            hold_ms,
            key_expire_ms: hold_ms.saturating_add(3_600_000),
        };
        let grant = match global.slots(&req) {
            Ok(grant) => grant,
            Err(e) => {
                r.failures.fetch_add(1, Ordering::Relaxed);
                return Err(e.into());
            }
        };
        r.syncs.fetch_add(1, Ordering::Relaxed);
        r.ok_at.fetch_max(self.now(), Ordering::AcqRel);
        // Never more than the nodes need: a cap above it would count as
        // the region's use at its next report, and an idle region would
        // keep its slots from the others for good.
        let granted = grant.granted.min(grant.target).min(need);
        shared.slots_cap(&LeaseCap {
            cap: granted,
            seq: nodes.seq,
            ..cap
        })?;
        noted(r, key, (granted, nodes.held, want), now);
        Ok(())
    }

    /// Renews region `r`'s share of token line `key` (a campaign's rate
    /// or gap `line`; its key at the tier `gkey`):
    ///
    /// 1. the region's line frozen (`fc_line_cap_v1` with cap 0: its nodes
    ///    keep what they were granted, and are granted no more), and what
    ///    it granted in sum read in the same call;
    /// 2. that sum reported to the tier's line as the region's spend (its
    ///    headroom of the last tick goes back there: a region is not
    ///    charged for units its nodes did not take), asking for its nodes'
    ///    asks;
    /// 3. the cap set to that sum plus what the tier granted anew.
    ///
    /// The tier unreachable, the line stays frozen: a rate refills, so
    /// "keep" has nothing to keep beyond the units the nodes hold (2 s of
    /// theirs at most); with a share `f` safe capacity the cap rises by
    /// `f` of the rate over the time since it last rose instead (`g`: the
    /// region's grant as last heard).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn sync_line(
        &self,
        r: &Regions,
        shared: &dyn Shared,
        global: &dyn Shared,
        (key, gkey): (GrantKey, &[u8]),
        g: RegionGrant,
        line: Line,
        now: Nanos,
    ) -> Result<(), EngineError> {
        let lkey = lease_key(key);
        let ttl_ms = REGION_TTL / 1_000_000;
        // As the nodes' calls keep the line's key: an hour past its refill.
        let key_expire_ms = line.refill_ms.saturating_add(3_600_000);
        let cap = LeaseCap {
            key: &lkey,
            // The region's store's clock (see `sync_slots`).
            seq: 0,
            cap: 0,
            key_expire_ms,
        };
        let frozen = shared.line_cap(&cap)?;
        if frozen.seq != frozen.now_ms {
            return Ok(());
        }
        let want = frozen.wants.saturating_add(spare(frozen.wants));
        let req = LineRequest {
            key: gkey,
            holder: &r.name,
            // Less what a share let it take while the tier was out of
            // reach: the overshoot the share allows, not charged to the
            // line afterwards (it would pause the rate for that long).
            spent: frozen.granted.saturating_sub(g.forgiven),
            want,
            burst: line.burst,
            rate: line.rate,
            per_us: line.per_us,
            // The region is granted units once a tick: a second of the
            // line ahead, and its nodes' lookahead (none for a gap).
            look_us: match line.look_us {
                0 => 0,
                l => l.saturating_add(1_000_000),
            },
            ttl_ms,
            grace_ms: 1_000,
            key_expire_ms,
            // Once reclaimed, the region's headroom counts as taken: its
            // nodes may still take it under the cap set in step 3.
            reports_later: Some(1 << 52),
            capped: false,
        };
        let (cap_to, result) = match global.line(&req) {
            Ok(grant) => {
                r.syncs.fetch_add(1, Ordering::Relaxed);
                r.ok_at.fetch_max(self.now(), Ordering::AcqRel);
                let new = grant.granted.saturating_sub(grant.spent);
                (Some(frozen.granted.saturating_add(new)), Ok(()))
            }
            Err(e) => {
                r.failures.fetch_add(1, Ordering::Relaxed);
                let share = match r.safe {
                    // f of what the line gave since the cap last rose, in
                    // whole units (the rest is counted at a later tick).
                    SafeCapacity::Share(f) if g.read_at > 0 => {
                        let secs = now.saturating_sub(g.read_at) as f64 / 1e9;
                        let per_sec = line.rate as f64 * 1e6 / line.per_us.max(1) as f64;
                        let more = (per_sec * f * secs).floor() as u64;
                        (more > 0).then(|| {
                            if let Some(x) = r.lock().get_mut(&key) {
                                x.forgiven = x.forgiven.saturating_add(more);
                            }
                            g.granted.max(frozen.granted).saturating_add(more)
                        })
                    }
                    _ => None,
                };
                (share, Err(e.into()))
            }
        };
        if let Some(c) = cap_to {
            shared.line_cap(&LeaseCap {
                cap: c,
                seq: frozen.seq,
                ..cap
            })?;
            noted(r, key, (c, frozen.granted, want), now);
        }
        result
    }
}

/// Notes region `r`'s new cap of item `key` with what its nodes held (or
/// its line granted) and what it asked: usable for 80 % of a grant's life.
fn noted(r: &Regions, key: GrantKey, (cap, spent, want): (u64, u64, u64), now: Nanos) {
    if let Some(x) = r.lock().get_mut(&key) {
        x.granted = cap;
        x.usable_until = now.saturating_add(REGION_TTL / 10 * 8);
        x.spent = spent;
        x.read_at = now;
        x.want = want;
    }
}

/// What region `r`'s nodes may hold of slots item `g` past its grant's
/// life: a slot taken then would be held past the time the tier frees the
/// region's (the holds it knew of, and a grant's life), so none beyond
/// those they hold, or a fixed share.
pub(super) fn region_safe_slots(r: &Regions, g: &RegionGrant) -> u64 {
    match r.safe {
        SafeCapacity::Share(f) => (g.total as f64 * f) as u64,
        SafeCapacity::Stop | SafeCapacity::Keep => 0,
    }
}
