//! Regions (docs/regions.md): each region is a fleet of its own (its Redis,
//! its nodes), and a global tier — a Redis the regions share, reached over
//! the WAN — leases each campaign's period items (budgets, fixed and
//! calendar campaign windows) to regions as a region's Redis leases them to
//! its nodes: the same lease function, the region as the holder, its
//! spend the sum its nodes reported (absolute, so a retry or a lost reply
//! grants nothing twice).
//!
//! Nothing here is on a decision's path: [`Engine::region_tick`] runs on a
//! thread of its own once a second, and a node's lease calls to its
//! region's Redis use the region's cumulative grant as their total
//! ([`Engine::region_total`]). So Σ over a region's nodes of spent plus
//! headroom stays within the region's grant, and Σ over regions of their
//! grants within the campaign's total: a budget is never exceeded
//! globally while every region reaches the global tier.
//!
//! When it cannot be reached, the region's grant is used for 80 % of its
//! life ([`REGION_TTL`], by this node's clock), and then what the region's
//! safe capacity says ([`SafeCapacity`]).

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::clock::{Clock, Nanos};
use crate::engine::{Engine, EngineError, invalid};
use crate::store::{LeaseRequest, Shared, Store, TotalRule};

use super::region_board::{self, Board, BoardItem, CALLER_TTL};
use super::region_caps::region_safe_slots;
use super::{GrantKey, LeaseView, Leased, lease_key};

/// How long a region's grant lives (by the global tier's clock). A region
/// renews it every second; a partition shorter than 80 % of it is not
/// felt, and a region lost strands at most its headroom for this long.
pub const REGION_TTL: Nanos = 30_000_000_000;

/// A region asks for headroom to last this long at its recent spend rate
/// (renewing every second, it runs short only if its demand grows 10×
/// within a second).
const WANT_AHEAD_SECS: u64 = 10;

/// A board's grant not renewed for this long (its caller renews every
/// second) is renewed by the node that follows it: a caller that does not
/// know a campaign (its definitions behind) leaves no item unrenewed. Past
/// a lapsed claim ([`CALLER_TTL`]): a caller gone is replaced before its
/// grants are renewed by every node; and well within the 24 s they last.
const STALE: Nanos = 2 * CALLER_TTL;

/// Calls to the global tier a node makes at once in a tick.
const SYNC_WORKERS: usize = 32;

/// What a region's nodes may grant themselves once its grant from the
/// global tier is past use (the tier unreachable for 80 % of
/// [`REGION_TTL`]): Doorman's safe capacity, per region. The tier never
/// grants again what a region it lost held: once reclaimed, a region's
/// whole headroom counts as spent there (the region may have spent it
/// unreported), so `keep` and `stop` never go over a total. Slots and
/// token lines differ (src/engine/leases/region_caps.rs): `keep` is `stop`
/// for them (a slot taken late, or a rate's refill, would be held or
/// spent twice), and a share is of the limit or of the rate.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub enum SafeCapacity {
    /// Nothing more than the region spent: it stands still until the tier
    /// answers again.
    Stop,
    /// The last grant, however old (the default): a cut-off region serves
    /// all it was granted, which no other region is granted meanwhile.
    #[default]
    Keep,
    /// This share of each item's total (0 < share ≤ 1), or the last grant
    /// if more: a cut-off region serves up to it, over the total by at most
    /// the share beyond what the tier granted it.
    Share(f64),
}

impl FromStr for SafeCapacity {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "stop" => Ok(SafeCapacity::Stop),
            "keep" => Ok(SafeCapacity::Keep),
            _ => {
                let share = s
                    .strip_prefix("share:")
                    .and_then(|f| f.parse::<f64>().ok())
                    .filter(|f| *f > 0.0 && *f <= 1.0);
                share.map(SafeCapacity::Share).ok_or_else(|| {
                    format!("must be stop, keep or share:F with 0 < F <= 1, got {s:?}")
                })
            }
        }
    }
}

/// A campaign item's lease key at the global tier: by the campaign's name,
/// as every region names it (its number is each region's own), the item's
/// tag (the same for the same item, docs/semantics.md §5.3) and the
/// period's start.
fn global_key(campaign: &str, tag: u32, start: Nanos) -> Vec<u8> {
    let mut v = Vec::with_capacity(campaign.len() + 14);
    v.extend_from_slice(b"rg");
    v.extend_from_slice(campaign.as_bytes());
    v.push(0);
    v.extend_from_slice(&tag.to_be_bytes());
    v.extend_from_slice(&start.to_be_bytes());
    v
}

/// One item's grant to this region, as this node last heard it.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct RegionGrant {
    /// The region's cumulative grant in the period (0: none yet).
    pub granted: u64,
    /// Usable until (this node's clock), 80 % of the grant's life.
    pub usable_until: Nanos,
    /// The region's spend (its nodes' reports) when last read.
    pub spent: u64,
    /// The item's total when last asked (a pacing line moves).
    pub total: u64,
    /// The period's end: forgotten after it.
    pub end: Nanos,
    /// When `spent` was read: the region's spend rate.
    pub read_at: Nanos,
    /// What was last asked for.
    pub want: u64,
    /// How the item is held (src/engine/leases/region_caps.rs for slots
    /// and token lines).
    pub held: Held,
    /// A token line: the units a share safe capacity let the region's
    /// line grant while the tier was out of reach (not reported to it).
    pub forgiven: u64,
}

/// How a campaign item is held across regions.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) enum Held {
    /// Units of a period (a budget, a fixed or calendar window).
    #[default]
    Units,
    /// Slots (a rolling window, `max_in_flight`): `granted` is the slots
    /// the region may hold now, set at each call; `spent` what its nodes
    /// held when last read.
    Slots,
    /// A token line (a rate or gap): `granted` is the cap on what the
    /// region's line grants in sum; `spent` what it had granted when last
    /// read.
    Line(super::Line),
}

impl Held {
    /// How a leasable campaign item is held.
    fn of(item: &crate::limits::Item) -> Held {
        if super::view::held_as_slots(item) {
            return Held::Slots;
        }
        match super::view(item, &crate::engine::chain::FRESH, 0, 0).and_then(|v| v.line) {
            Some(line) => Held::Line(line),
            None => Held::Units,
        }
    }
}

/// This node's view of its region's grants.
pub(crate) struct Regions {
    /// The region's name: its holder name in the global tier.
    pub name: String,
    pub safe: SafeCapacity,
    /// The global tier (a Redis the regions share).
    global: Arc<dyn Store>,
    grants: Mutex<HashMap<GrantKey, RegionGrant>>,
    /// Calls to the global tier answered, and failed.
    pub syncs: AtomicU64,
    pub failures: AtomicU64,
    /// When the global tier last answered (this node's clock).
    pub ok_at: AtomicU64,
    /// This node's name on the region's board (node id and process nonce),
    /// and whether it was the region's caller at its last tick
    /// (src/engine/leases/region_board.rs).
    caller_id: String,
    pub caller: std::sync::atomic::AtomicBool,
    /// Users counted in more than one region (src/engine/travellers.rs).
    pub(crate) travel: crate::engine::travellers::Travellers,
}

impl Regions {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<GrantKey, RegionGrant>> {
        self.grants.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What one region's figures are, for metrics and `/v1/admin`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RegionFigures {
    pub name: String,
    /// Items whose grant this node follows.
    pub items: usize,
    pub syncs: u64,
    pub failures: u64,
    /// Whether the global tier answered within the last 2 s.
    pub reachable: bool,
    /// Whether this node renews its region's grants for the region (its
    /// region's caller) at its last tick.
    pub caller: bool,
    /// Users this node follows across regions.
    pub users: usize,
    /// Screens held until a user's home counted its last unit here.
    pub held: u64,
    /// Units other regions counted, applied to this region's records.
    pub applied: u64,
}

impl<C: Clock> Engine<C> {
    /// Makes this node one of region `name`'s, leasing campaigns' period
    /// items from the global tier `global` (a shared store of its own).
    /// Needs a shared store here too: a region is a fleet.
    pub fn join_region(
        &self,
        name: &str,
        safe: SafeCapacity,
        global: Arc<dyn Store>,
    ) -> Result<(), EngineError> {
        if self.shared().is_none() {
            return Err(invalid(
                "region",
                "a region needs a redis or redis-cluster store: each region is a fleet",
            ));
        }
        if global.shared().is_none() {
            return Err(invalid(
                "global_store",
                "must be a redis or redis-cluster URL",
            ));
        }
        if name.is_empty() || name.len() > 64 || name.chars().any(char::is_control) {
            return Err(invalid(
                "region",
                format!("must be 1 to 64 printable characters, got {name:?}"),
            ));
        }
        let regions = Regions {
            name: name.to_owned(),
            safe,
            global,
            grants: Mutex::default(),
            syncs: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            ok_at: AtomicU64::new(0),
            caller_id: format!("{}/{:x}", self.options.node_id, self.id_nonce),
            caller: Default::default(),
            travel: crate::engine::travellers::Travellers::new(
                name,
                &self.options.node_id,
                self.id_nonce,
            ),
        };
        self.regions
            .set(regions)
            .map_err(|_| invalid("region", "this node already joined a region"))
    }

    /// This node's region's figures; `None` outside regions.
    pub fn region_figures(&self) -> Option<RegionFigures> {
        let r = self.regions.get()?;
        let now = self.now();
        Some(RegionFigures {
            name: r.name.clone(),
            items: r.lock().len(),
            syncs: r.syncs.load(Ordering::Relaxed),
            failures: r.failures.load(Ordering::Relaxed),
            reachable: now.saturating_sub(r.ok_at.load(Ordering::Acquire)) < 2_000_000_000,
            caller: r.caller.load(Ordering::Relaxed),
            users: r.travel.len(),
            held: r.travel.held.load(Ordering::Relaxed),
            applied: r.travel.applied.load(Ordering::Relaxed),
        })
    }

    /// The most this region's nodes may have spent plus held of a
    /// campaign's period item `key` (viewed as `v`), in place of its total,
    /// when this node is in a region; `None` otherwise. Notes the item, so
    /// that [`Engine::region_tick`] asks the global tier for it.
    pub(super) fn region_total(&self, key: GrantKey, v: &LeaseView, now: Nanos) -> Option<u64> {
        let r = self.regions.get()?;
        if !matches!(key.0, Leased::Campaign(_)) {
            return None;
        }
        let mut grants = r.lock();
        let g = grants.entry(key).or_default();
        g.total = v.total;
        g.end = v.end;
        if v.slots {
            g.held = Held::Slots;
        }
        if now < g.usable_until {
            return Some(g.granted.min(v.total));
        }
        // Past its life, a region's slots grant is held for it at the tier
        // only as long as its nodes' holds at its last call, and a slot
        // taken now would be held past that: no new slot (its nodes keep
        // those they hold), or a fixed share (docs/regions.md).
        if v.slots {
            return Some(region_safe_slots(r, g));
        }
        let safe = match r.safe {
            SafeCapacity::Stop => g.spent,
            SafeCapacity::Keep => g.granted.max(g.spent),
            SafeCapacity::Share(f) => g.granted.max((v.total as f64 * f) as u64),
        };
        Some(safe.min(v.total))
    }

    /// Notes token line `key` (a campaign's rate or gap, viewed as `v`) as
    /// one this node leases in a region, so that [`Engine::region_tick`]
    /// asks the global tier for it: what the line grants in the region is
    /// capped in the region's store (src/engine/leases/region_caps.rs).
    ///
    /// Whether it is such a line (a campaign's, in a region): its lease
    /// calls then ask the store to grant nothing until a cap is set.
    pub(super) fn region_line(&self, key: GrantKey, v: &LeaseView) -> bool {
        let (Some(r), Some(line)) = (self.regions.get(), v.line) else {
            return false;
        };
        if !matches!(key.0, Leased::Campaign(_)) {
            return false;
        }
        let mut grants = r.lock();
        let g = grants.entry(key).or_default();
        g.total = v.total;
        g.end = v.end;
        g.held = Held::Line(line);
        true
    }

    /// Until when this node may take slots of a slots item `key` (a
    /// rolling window or `max_in_flight`) on its region's grant, by this
    /// node's clock: the region's grant's usable life, unless the region's
    /// safe capacity is a share (which it may take however long it is cut
    /// off). `None` outside regions.
    pub(super) fn region_slots_until(&self, key: GrantKey) -> Option<Nanos> {
        let r = self.regions.get()?;
        if matches!(r.safe, SafeCapacity::Share(_)) {
            return None;
        }
        r.lock().get(&key).map(|g| g.usable_until)
    }

    /// Renews this region's grant of every item its nodes lease from the
    /// global tier: the region's spend (from its own Redis) reported, and
    /// headroom for [`WANT_AHEAD_SECS`] of its recent spend asked. Called
    /// once a second, off every decision's path (`src/service/run.rs`).
    /// One node of the region makes the calls, its caller; the others
    /// adopt what it publishes on the region's board, and call only for
    /// items it does not renew yet (src/engine/leases/region_board.rs).
    /// Returns the first error met; every item is tried.
    pub fn region_tick(&self) -> Result<(), EngineError> {
        let (Some(r), Some(shared)) = (self.regions.get(), self.shared()) else {
            return Ok(());
        };
        let Some(global) = r.global.shared() else {
            return Ok(());
        };
        let now = self.now();
        let mut first_err: Option<EngineError> = None;
        // The board unread (the region's Redis not answering): this node
        // renews what it follows itself, and publishes nothing.
        let board = match region_board::read(shared) {
            Ok(b) => Some(b),
            Err(e) => {
                first_err = Some(e.into());
                None
            }
        };
        let calls = board
            .as_ref()
            .is_none_or(|(_, b)| b.calls(&r.caller_id, now));
        r.caller.store(calls, Ordering::Relaxed);
        // Each region numbers its campaigns itself: the tier knows them by
        // name (a campaign deleted here is no longer renewed).
        let reg = self.registry();
        let items: Vec<(GrantKey, RegionGrant, Vec<u8>)> = {
            let mut grants = r.lock();
            grants.retain(|k, g| {
                g.end > now
                    && campaign_of(k).is_some_and(|id| reg.campaigns_by_id.contains_key(&id))
            });
            if let Some((_, b)) = &board {
                adopt(&mut grants, b, calls, now);
            }
            grants
                .iter()
                .filter(|(k, _)| {
                    // Not the caller: what the board does not renew.
                    calls
                        || board.as_ref().is_none_or(|(_, b)| {
                            b.items
                                .get(*k)
                                .is_none_or(|i| i.read_at.saturating_add(STALE) < now)
                        })
                })
                .filter_map(|(k, g)| {
                    let e = reg.campaigns_by_id.get(&campaign_of(k)?)?;
                    // A board's item this node did not lease itself: what
                    // kind it is, from the campaign's definition.
                    let i = e.tags.iter().position(|t| *t == k.1)?;
                    let g = RegionGrant {
                        held: Held::of(&e.compiled.items[i].item),
                        ..*g
                    };
                    Some((*k, g, global_key(&e.name, k.1, k.2)))
                })
                .collect()
        };
        // One call per item, each a WAN round trip (80 ms, say): made
        // [`SYNC_WORKERS`] at a time, so a region of many campaigns renews
        // them all within its tick (400 items a second at 80 ms).
        let next = AtomicUsize::new(0);
        let errors: Mutex<Option<EngineError>> = Mutex::new(None);
        std::thread::scope(|scope| {
            for _ in 0..items.len().min(SYNC_WORKERS) {
                scope.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some((key, g, gkey)) = items.get(i) else {
                            break;
                        };
                        if let Err(e) = self.sync_item(r, shared, global, (*key, gkey), *g, now) {
                            errors
                                .lock()
                                .unwrap_or_else(PoisonError::into_inner)
                                .get_or_insert(e);
                        }
                    }
                });
            }
        });
        if let Some(e) = errors.into_inner().unwrap_or_else(PoisonError::into_inner) {
            first_err.get_or_insert(e);
        }
        if let Some(read) = board {
            let synced: Vec<GrantKey> = items.iter().map(|(k, ..)| *k).collect();
            if let Err(e) = self.publish_board(r, shared, read, calls, &synced, now) {
                first_err.get_or_insert(e);
            }
        }
        // Users across regions: their homes, counts and applied units.
        let travel = self.travel_tick(global);
        match (first_err, travel) {
            (Some(e), _) | (None, Err(e)) => Err(e),
            (None, Ok(())) => Ok(()),
        }
    }

    /// Writes what this tick renewed to the region's board: the caller its
    /// every item (its claim renewed); another node the items it renewed
    /// that the board did not hold (asks for the caller) or held stale.
    fn publish_board(
        &self,
        r: &Regions,
        shared: &dyn Shared,
        read: (u64, Board),
        calls: bool,
        synced: &[GrantKey],
        now: Nanos,
    ) -> Result<(), EngineError> {
        let mine: HashMap<GrantKey, BoardItem> = {
            let grants = r.lock();
            let keys: Box<dyn Iterator<Item = &GrantKey>> = if calls {
                Box::new(grants.keys())
            } else {
                Box::new(synced.iter())
            };
            keys.filter_map(|k| Some((*k, grants.get(k)?.item())))
                .collect()
        };
        if !calls && mine.is_empty() {
            return Ok(());
        }
        region_board::write(shared, read, now, |current| {
            if calls {
                // Another node claimed the region since this tick began.
                if current.caller != r.caller_id && current.until > now {
                    return None;
                }
                let mut next = Board {
                    caller: r.caller_id.clone(),
                    until: now.saturating_add(CALLER_TTL),
                    items: mine.clone(),
                };
                // Asks other nodes added meanwhile: renewed next tick.
                for (k, i) in &current.items {
                    if i.end > now {
                        next.items.entry(*k).or_insert(*i);
                    }
                }
                Some(next)
            } else {
                // Items new to the board, or renewed here since it did.
                let mut next = current.clone();
                let mut newer = false;
                for (k, i) in &mine {
                    if next.items.get(k).is_none_or(|b| b.read_at < i.read_at) {
                        next.items.insert(*k, *i);
                        newer = true;
                    }
                }
                newer.then_some(next)
            }
        })?;
        Ok(())
    }

    /// Renews region `r`'s grant of item `key` (as last heard, `g`; its
    /// lease key at the tier `gkey`): its spend read from the region's
    /// Redis (`shared`), reported to the global tier (`global`) with what
    /// it asks for.
    fn sync_item(
        &self,
        r: &Regions,
        shared: &dyn Shared,
        global: &dyn Shared,
        (key, gkey): (GrantKey, &[u8]),
        g: RegionGrant,
        now: Nanos,
    ) -> Result<(), EngineError> {
        match g.held {
            Held::Slots => return self.sync_slots(r, shared, global, (key, gkey), g, now),
            Held::Line(line) => {
                return self.sync_line(r, shared, global, (key, gkey), g, line, now);
            }
            Held::Units => {}
        }
        let lkey = lease_key(key);
        // The region's spend: every node's report, in its own Redis.
        let spent = shared.lease_spent(&lkey)?.max(g.spent);
        // Headroom for WANT_AHEAD_SECS at the recent rate; twice the
        // last ask when the region used what it had (its demand is
        // unknown past its grant); a hundredth of the total to start.
        let rate = match g.read_at {
            0 => 0,
            at if now > at => {
                (u128::from(spent.saturating_sub(g.spent)) * 1_000_000_000 / u128::from(now - at))
                    as u64
            }
            _ => 0,
        };
        // Never more than the total: a region short every second (its
        // item spent out) would otherwise double its ask past 2^53 within
        // a minute, which the tier refuses (its numbers are doubles), and
        // fall back to its safe capacity.
        let short = g.granted > 0 && spent >= g.granted;
        let want = (rate.saturating_mul(WANT_AHEAD_SECS))
            .max(if short { g.want.saturating_mul(2) } else { 0 })
            .max(g.total / 100)
            .min(g.total)
            .max(1);
        let ttl_ms = REGION_TTL / 1_000_000;
        let req = LeaseRequest {
            key: gkey,
            holder: &r.name,
            spent,
            want,
            total: g.total,
            ttl_ms,
            // The region's nodes hold nothing past their own grants'
            // life (2 s) beyond what the region's grant covers.
            grace_ms: 1_000,
            key_expire_ms: g.end.saturating_sub(now) / 1_000_000 + 3_600_000,
            period_ms: (key.2 / 1_000_000, g.end.div_ceil(1_000_000)),
            rule: TotalRule::Given,
            segments: None,
            // A region reports its spend a second late, and not at all
            // while cut off: once reclaimed, its whole headroom counts
            // as spent, so the tier never grants it to another region
            // while this one may still spend it (2^52: all of it).
            reports_later: Some(1 << 52),
            foreign: 0,
            given: 0,
        };
        match global.lease(&req) {
            Ok(grant) => {
                r.syncs.fetch_add(1, Ordering::Relaxed);
                r.ok_at.fetch_max(self.now(), Ordering::AcqRel);
                let mut grants = r.lock();
                if let Some(x) = grants.get_mut(&key) {
                    x.granted = grant.granted;
                    x.usable_until = now.saturating_add(grant.usable_ms.saturating_mul(800_000));
                    x.spent = spent;
                    x.read_at = now;
                    x.want = want;
                }
            }
            Err(e) => {
                r.failures.fetch_add(1, Ordering::Relaxed);
                // What a stopped region may still grant: its spend.
                if let Some(x) = r.lock().get_mut(&key) {
                    x.spent = x.spent.max(spent);
                }
                return Err(e.into());
            }
        }
        Ok(())
    }
}

/// A grant key's campaign (the only items leased across regions).
fn campaign_of(k: &GrantKey) -> Option<u32> {
    match k.0 {
        Leased::Campaign(id) => Some(id),
        Leased::Key { .. } => None,
    }
}

impl RegionGrant {
    fn item(&self) -> BoardItem {
        BoardItem {
            granted: self.granted,
            usable_until: self.usable_until,
            spent: self.spent,
            read_at: self.read_at,
            want: self.want,
            total: self.total,
            end: self.end,
        }
    }
}

/// Takes the board's grants where they are newer than this node's; the
/// caller (`calls`) also takes the items it did not follow (other nodes'
/// asks, or the last caller's), to renew them.
fn adopt(grants: &mut HashMap<GrantKey, RegionGrant>, board: &Board, calls: bool, now: Nanos) {
    for (k, i) in &board.items {
        if i.end <= now {
            continue;
        }
        match grants.get_mut(k) {
            Some(g) if i.read_at > g.read_at => {
                g.granted = i.granted;
                g.usable_until = i.usable_until;
                g.spent = g.spent.max(i.spent);
                g.read_at = i.read_at;
                g.want = i.want;
            }
            Some(_) => {}
            None if calls => {
                grants.insert(
                    *k,
                    RegionGrant {
                        granted: i.granted,
                        usable_until: i.usable_until,
                        spent: i.spent,
                        total: i.total,
                        end: i.end,
                        read_at: i.read_at,
                        want: i.want,
                        // Known from the campaign at the tick.
                        held: Held::Units,
                        forgiven: 0,
                    },
                );
            }
            None => {}
        }
    }
}
