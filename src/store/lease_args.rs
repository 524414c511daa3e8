//! The arguments and answers of lease calls ([`super::LeaseCalls`]): what a
//! node reports and is granted, absolute so that a retry changes nothing
//! (docs/cluster.md, "Leases").

/// A lease call (`fc_lease_v1`, docs/cluster.md "Leases"): absolute
/// counters, so a retry or a lost reply changes nothing.
#[derive(Debug, Clone, Copy)]
pub struct LeaseRequest<'a> {
    pub key: &'a [u8],
    /// Who holds the grant: a node and its process.
    pub holder: &'a str,
    /// The holder's cumulative committed units in the period.
    pub spent: u64,
    /// Units of headroom (beyond `spent`) it would like to hold now.
    pub want: u64,
    /// The most that may be spent plus held in the period, cluster-wide.
    pub total: u64,
    /// The grant lives this long, by the store's clock.
    pub ttl_ms: u64,
    /// The holder's open holds may be committed until this long from now:
    /// its headroom is not reclaimed before (nor before its grant expires).
    pub grace_ms: u64,
    /// The lease key expires this long from now.
    pub key_expire_ms: u64,
    /// The lease's period [start, end), unix ms (`fc_lease_v2`): at a store
    /// time outside it nothing is granted, and no grant outlives its end.
    pub period_ms: (u64, u64),
    /// How the store computes the total at its own time (`total` is the
    /// caller's, for [`TotalRule::Given`]).
    pub rule: TotalRule,
    /// The period's weighted time, for [`TotalRule::Weighted`] and
    /// [`TotalRule::Planned`]: its id always, its segments when the caller
    /// does not know the store to have them (they are kept with the lease).
    pub segments: Option<(&'a Segments, bool)>,
    /// `Some(b)`: the holder reports its spend later than it commits
    /// (`spend_reports = "batched"`), with at most `b` units (≥ 1) committed
    /// and not reported; once reclaimed, that much of its headroom counts
    /// as spent, since it may have spent it unreported, and the rest goes
    /// back. `None`: it reports each commit before acknowledging it.
    pub reports_later: Option<u64>,
    /// The holder's cumulative units committed of other holders' holds (a
    /// reservation another node made, committed on this one): counted as
    /// spent, not taken from its headroom. Reported before such a commit
    /// is acknowledged (`o:` in `fc_lease_v2`; issue 47).
    pub foreign: u64,
    /// The holder's cumulative units of its own holds that other holders
    /// committed (and reported as their `foreign`): its headroom is
    /// granted − spent − given (`r:`).
    pub given: u64,
}

/// `reports_later` as the functions take it: 0 for `None`, b + 1 for at
/// most b (1, "any", is what builds before the bound sent).
pub fn reports_later_arg(r: Option<u64>) -> u64 {
    r.map_or(0, |b| b.max(1).saturating_add(1))
}

/// A period's weighted time for profile and adaptive pacing: segments
/// (start, unix ms; weight), the first at the period's start. F(t) is the
/// sum of weight × ms up to t. The node makes them (local hours need the
/// time-zone database); the store keeps them with the lease and computes
/// the pacing line at its own time, so no node's clock moves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segments {
    /// A digest of the segments: a call naming another id than the stored
    /// one must send them.
    pub id: u64,
    pub list: Vec<(u64, u64)>,
}

impl Segments {
    pub fn new(list: Vec<(u64, u64)>) -> Self {
        // FNV-1a: a digest the store compares, not a defence.
        let mut id: u64 = 0xcbf2_9ce4_8422_2325;
        for (s, w) in &list {
            for b in s.to_le_bytes().into_iter().chain(w.to_le_bytes()) {
                id = (id ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        Segments { id, list }
    }

    /// As the store keeps them: `start:weight,start:weight,...`.
    pub fn text(&self) -> String {
        let parts: Vec<String> = self.list.iter().map(|(s, w)| format!("{s}:{w}")).collect();
        parts.join(",")
    }

    /// F(t) for `t` in the period ending at `end` (ms), as `weighted_at` in
    /// src/cluster/functions.lua, in the same doubles.
    fn at(&self, end: u64, t: u64) -> f64 {
        let mut f = 0.0;
        for (i, &(s, w)) in self.list.iter().enumerate() {
            if s >= t {
                break;
            }
            let e = self.list.get(i + 1).map_or(end, |n| n.0);
            f += w as f64 * (t.min(e) - s) as f64;
        }
        f
    }
}

/// How `fc_lease_v2` computes a lease's total at Redis's time, so that no
/// node's clock makes it larger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TotalRule {
    /// The caller's `total`.
    Given,
    /// A fixed total: a window's limit, an `asap` budget's amount.
    Fixed(u64),
    /// Even pacing over the period: min(amount, ceil(amount·(now + look −
    /// start)/(end − start)) + allowance).
    Even {
        amount: u64,
        allowance: u64,
        look_ms: u64,
    },
    /// Profile pacing: min(amount, ceil(amount·F(t)/F(end)) + allowance),
    /// F the weighted time of the request's [`Segments`], t = now + look.
    Weighted {
        amount: u64,
        allowance: u64,
        look_ms: u64,
    },
    /// Adaptive pacing: the fleet's plan (anchor a, base; `fc_plan_v1`'s,
    /// kept with the lease) over the weighted time: min(amount, base +
    /// ceil((amount − base)·(F(t) − F(a))/(F(end) − F(a))) + allowance).
    Planned {
        amount: u64,
        allowance: u64,
        look_ms: u64,
    },
}

impl TotalRule {
    /// The rule's arguments: (rule, amount, allowance, look_ms).
    pub fn args(self) -> (u64, u64, u64, u64) {
        match self {
            TotalRule::Given => (0, 0, 0, 0),
            TotalRule::Fixed(n) => (1, n, 0, 0),
            TotalRule::Even {
                amount,
                allowance,
                look_ms,
            } => (2, amount, allowance, look_ms),
            TotalRule::Weighted {
                amount,
                allowance,
                look_ms,
            } => (3, amount, allowance, look_ms),
            TotalRule::Planned {
                amount,
                allowance,
                look_ms,
            } => (4, amount, allowance, look_ms),
        }
    }

    /// The total at store time `now` (ms) in the period, as `fc_lease_v2`
    /// computes it, given the period's weighted time and the stored plan
    /// (`None`: the store lacks them, and grants nothing).
    pub fn total(
        self,
        given: u64,
        (start, end): (u64, u64),
        now: u64,
        segments: Option<&Segments>,
        plan: Option<(u64, u64)>,
    ) -> Option<u64> {
        let line = |amount: u64, allowance: u64, paced: f64| {
            Some(amount.min((paced.ceil().max(0.0) as u64).saturating_add(allowance)))
        };
        Some(match self {
            TotalRule::Given => given,
            TotalRule::Fixed(n) => n,
            TotalRule::Even {
                amount,
                allowance,
                look_ms,
            } => {
                let t = (now + look_ms).clamp(start, end);
                let span = end.saturating_sub(start).max(1);
                let paced = (u128::from(amount) * u128::from(t - start)).div_ceil(u128::from(span));
                amount.min((paced as u64).saturating_add(allowance))
            }
            TotalRule::Weighted {
                amount,
                allowance,
                look_ms,
            } => {
                let seg = segments?;
                let t = (now + look_ms).clamp(start, end);
                let fe = seg.at(end, end);
                if fe <= 0.0 {
                    return Some(amount);
                }
                return line(amount, allowance, amount as f64 * seg.at(end, t) / fe);
            }
            TotalRule::Planned {
                amount,
                allowance,
                look_ms,
            } => {
                // No plan stored (the lease's key was lost): the line from
                // the period's start.
                let (seg, (a, base)) = (segments?, plan.unwrap_or((start, 0)));
                let a = a.clamp(start, end);
                let t = (now + look_ms).clamp(start, end).max(a);
                let fa = seg.at(end, a);
                let left = seg.at(end, end) - fa;
                if left <= 0.0 {
                    return Some(amount);
                }
                let rest = amount.saturating_sub(base) as f64;
                let paced = base as f64 + (rest * (seg.at(end, t) - fa) / left).ceil();
                return line(amount, allowance, paced);
            }
        })
    }
}

/// A lease's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseGrant {
    /// The holder's cumulative grant: it may spend up to this in the period.
    pub granted: u64,
    /// Spent by every holder (reported).
    pub spent_total: u64,
    /// How long the grant may be used (the store's clock): its life, or
    /// less near the period's end, 0 outside the period.
    pub usable_ms: u64,
    /// The store lacks the weighted time the rule needs (and granted
    /// nothing): call again with the segments.
    pub need_segments: bool,
}

/// A token-line call (`fc_line_v1`, docs/cluster.md "Leases"): a
/// campaign-scope rate or gap, leased in units of a line that rises with
/// Redis's clock; absolute counters, as [`LeaseRequest`].
#[derive(Debug, Clone, Copy)]
pub struct LineRequest<'a> {
    pub key: &'a [u8],
    pub holder: &'a str,
    /// The holder's cumulative committed units on the line.
    pub spent: u64,
    /// Units beyond `spent` it would like to hold now.
    pub want: u64,
    /// The most units that pass at once after idling.
    pub burst: u64,
    /// The line rises `rate` units every `per_us` µs.
    pub rate: u64,
    pub per_us: u64,
    /// A grant may take what the line allows this long from now.
    pub look_us: u64,
    pub ttl_ms: u64,
    pub grace_ms: u64,
    pub key_expire_ms: u64,
    /// As [`LeaseRequest::reports_later`].
    pub reports_later: Option<u64>,
    /// The line is a region's, capped by its caller (`fc_line_cap_v1`):
    /// until a cap is set, it grants nothing (docs/regions.md).
    pub capped: bool,
}

/// A token line's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LineGrant {
    /// The holder's cumulative grant on the line.
    pub granted: u64,
    /// The holder's spent, as the line counts it (the most it reported).
    pub spent: u64,
    /// Spent by every holder (reported).
    pub spent_total: u64,
    /// How long until the line has one more unit to grant (0: now).
    pub retry_ms: u64,
}

/// A plan call (`fc_plan_v1`, docs/cluster.md "Leases"): the adaptive
/// pacing plan of a leased budget's period, made once per slice from the
/// fleet's spend and stored with the lease.
#[derive(Debug, Clone, Copy)]
pub struct PlanRequest<'a> {
    /// The budget's lease key (its period's).
    pub key: &'a [u8],
    /// The start of the slice the caller is in, unix ms.
    pub anchor_ms: u64,
    /// The anchor of the plan the caller knew (0: none), and that plan's
    /// line at `anchor_ms`.
    pub prev_anchor_ms: u64,
    pub prev_line: u64,
    pub key_expire_ms: u64,
}

/// A slots call (`fc_slots_v1`, docs/cluster.md "Leases"): slots held now
/// (absolute, numbered so a late older report changes nothing).
#[derive(Debug, Clone, Copy)]
pub struct SlotsRequest<'a> {
    pub key: &'a [u8],
    pub holder: &'a str,
    /// The holder's call number, rising.
    pub seq: u64,
    /// Slots it holds now.
    pub used: u64,
    /// Slots beyond `used` it would like to be able to take.
    pub want: u64,
    /// The most slots held in sum.
    pub max: u64,
    pub ttl_ms: u64,
    /// Its longest open hold ends this long from now.
    pub hold_ms: u64,
    pub key_expire_ms: u64,
}

/// A slots call's answer (`fc_slots_v2`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlotsGrant {
    /// The slots the holder may hold.
    pub granted: u64,
    /// Its max-min fair share now, before it is raised to what it holds:
    /// what it would be granted holding nothing (a region lowers its
    /// nodes' cap to it: docs/regions.md).
    pub target: u64,
}

/// A cap on what a slots lease's holders may be granted in sum
/// (`fc_slots_cap_v1`), or a token line's (`fc_line_cap_v1`): a region's
/// grant from the global tier, set by its caller in the region's store.
#[derive(Debug, Clone, Copy)]
pub struct LeaseCap<'a> {
    pub key: &'a [u8],
    /// Rising (0: the store's time in ms): an older cap is not set.
    pub seq: u64,
    pub cap: u64,
    pub key_expire_ms: u64,
}

/// What the live holders of a slots lease hold in sum, and the cap in
/// force (a region's, read by its caller for the global tier:
/// docs/regions.md, "Caps across regions").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlotsHeld {
    /// Σ granted: slots the holders may hold.
    pub held: u64,
    /// Σ of each holder's demand at its last call (what it held and
    /// wanted), at least its grant.
    pub demand: u64,
    /// The latest a live holder is kept (its grant's life or its longest
    /// hold), from now.
    pub hold_ms: u64,
    /// The store's clock when read, ms.
    pub now_ms: u64,
    /// The cap in force, and its seq.
    pub cap: u64,
    pub seq: u64,
}

/// What a token line granted in sum, and the cap in force (a region's,
/// read by its caller for the global tier: docs/regions.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LineHeld {
    /// Σ over holders of the more of granted and spent, and the folded
    /// holders' spent: absolute, as the line counts.
    pub granted: u64,
    /// Σ of the live holders' wants at their last call.
    pub wants: u64,
    /// The store's clock when read, ms.
    pub now_ms: u64,
    /// The cap in force, and its seq.
    pub cap: u64,
    pub seq: u64,
}
