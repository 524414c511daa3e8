//! Users across regions (docs/regions.md, "Users across regions"): a user's
//! caps are decided in whichever region sees it, on that region's record,
//! into which the units other regions counted are merged as increments.
//!
//! - **Home.** The first region to count a unit for a user claims it as
//!   the user's home at the global tier; every region learns it within a
//!   tick.
//! - **Per-field counters.** Every node process counts the units it
//!   commits (and the events it counts) per user, campaign, event type and
//!   cost: a field of its own at the tier, written whole (no other writer,
//!   so no write loses another's increment). A region applies the units of
//!   other regions' fields to its own records as events, each unit under an
//!   event id of its own, so a unit is counted once per region however
//!   often it is applied (by every node of the region, after a restart).
//!   Each region publishes how far it applied each field.
//! - **The bound.** A user's home decides it freely. Anywhere else, a node
//!   serves a user one screen at a time: after a screen that reserved, no
//!   other until that unit is committed (or its reservation ends) and the
//!   home has applied it (its published position). So at most one unit per
//!   node outside the home is unknown to the home, and the home's record,
//!   which every other region's decisions follow a tick or two late, is at
//!   most that far behind: a cap is exceeded by at most one unit per other
//!   region's node deciding the user (`regions − 1` with one such node per
//!   region), and by nothing for users who stay home.
//!
//! Nothing here is on a decision's path but [`Engine::travel_may_serve`],
//! a lookup in this node's memory. The exchange with the tier runs in the
//! region's tick, once a second ([`Engine::travel_tick`]).

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::clock::{Clock, Nanos};
use crate::store::{Shared, TravelField, TravelSync};

use super::request::{CandidateResult, CommitRequest, DeniedBy, Event, ScreenRequest};
use super::{Engine, EngineError};

/// How long a user's fields are kept at the tier after its last unit, and
/// in a node's memory: a week and a day, the longest cap window most
/// campaigns have (a user seen again after that starts afresh).
pub const TRAVEL_KEEP: Nanos = 8 * 86_400 * 1_000_000_000;

/// Most users a node follows; the least recently counted go first. A user
/// forgotten here is not held back and its units here are no longer
/// published (its home's view of this node stays as it was). A user
/// counted here once takes 248 bytes more in a region than in none
/// (tests/memory.rs, `a_region_keeps_bytes_per_user_it_counted`; 558
/// before fields and homes were shared and kept in vectors), so 200 000
/// users ~50 MB.
const MAX_USERS: usize = 200_000;

/// Most distinct fields and home names kept shared ([`Interner`]): a node
/// has a few per campaign, event type and cost; past this (costs are the
/// client's to choose) the table starts again, users keeping theirs.
const MAX_INTERNED: usize = 65_536;

/// Most open screens a node remembers to count their commits, and their
/// bytes (names, ids and costs other than 1: a screen of 10 000 costed
/// candidates would keep 240 KB); one that ends uncommitted is forgotten
/// at its deadline. While either is reached, a screen in the region is
/// held (`home_region`, retried in 1 s) rather than decided and then not
/// counted: only screens open past either can reach it.
const MAX_SCREENS: usize = 200_000;
const MAX_SCREEN_BYTES: usize = 64 << 20;

/// Users claimed, and synced, per call to the tier (one pipeline each).
const BATCH: usize = 1_000;

/// Most of its travellers a home syncs in one tick.
const MAX_TRAVELLERS: usize = 10_000;

/// The `retry_after` of a screen held until the home has counted the last.
const HELD_RETRY: crate::clock::Span = 1_000_000_000;

/// A count field's bytes, one allocation shared by every user counted
/// under it: 16 bytes a user.
type Field = Arc<[u8]>;

/// Counts or positions by field. A user has a few fields, so a vector
/// (none: no allocation), not a map (a map of one takes ~150 bytes).
#[derive(Debug, Default)]
struct ByField(Vec<(Field, u64)>);

impl ByField {
    fn get(&self, f: &[u8]) -> u64 {
        self.0
            .iter()
            .find(|(k, _)| **k == *f)
            .map_or(0, |(_, n)| *n)
    }

    fn contains(&self, f: &[u8]) -> bool {
        self.0.iter().any(|(k, _)| **k == *f)
    }

    /// Raises `f`'s to `n` if below.
    fn raise(&mut self, f: &Field, n: u64) {
        match self.0.iter_mut().find(|(k, _)| *k == *f) {
            Some((_, p)) => *p = (*p).max(n),
            None => self.push(f, n),
        }
    }

    fn add_one(&mut self, f: &Field) {
        match self.0.iter_mut().find(|(k, _)| *k == *f) {
            Some((_, p)) => *p += 1,
            None => self.push(f, 1),
        }
    }

    /// One more field, room for it alone (a push would make room for 4:
    /// 72 bytes more a user with one).
    fn push(&mut self, f: &Field, n: u64) {
        self.0.reserve_exact(1);
        self.0.push((f.clone(), n));
    }

    fn iter(&self) -> impl Iterator<Item = (&Field, u64)> {
        self.0.iter().map(|(f, n)| (f, *n))
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Shares equal values (fields, home names) between users: at most
/// [`MAX_INTERNED`] of them, then it starts again.
struct Interner<T: ?Sized>(Mutex<HashSet<Arc<T>>>);

impl<T: ?Sized + Hash + Eq> Interner<T>
where
    for<'a> Arc<T>: From<&'a T>,
{
    fn new() -> Self {
        Interner(Mutex::default())
    }

    fn get(&self, v: &T) -> Arc<T> {
        let mut set = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(a) = set.get(v) {
            return a.clone();
        }
        if set.len() >= MAX_INTERNED {
            set.clear();
        }
        let a: Arc<T> = Arc::from(v);
        set.insert(a.clone());
        a
    }
}

/// One user as this node knows it.
#[derive(Debug, Default)]
struct Traveller {
    /// Its home region; `None` until claimed.
    home: Option<Arc<str>>,
    /// Units this process counted, by field.
    own: ByField,
    /// How far its home applied each of `own`.
    acked: ByField,
    /// How far this region applied each other region's field.
    applied: ByField,
    /// Until when an allowed screen's reservation is open.
    open_until: Nanos,
    /// When last counted or synced.
    touched: Nanos,
    /// Whether it is exchanged with the tier (counted outside its home).
    travels: bool,
}

impl Traveller {
    /// Whether a unit counted here is not yet applied at its home, or a
    /// screen is open.
    fn waiting(&self, now: Nanos) -> bool {
        self.open_until > now || self.own.iter().any(|(f, n)| self.acked.get(f) < n)
    }
}

/// An open screen of a user, remembered to count its commit.
struct Screened {
    user: String,
    /// Eligible candidates reserved at a cost other than 1.
    eligible: Box<[(Arc<str>, u64)]>,
    /// Its reservation's deadline.
    deadline: Nanos,
}

impl Screened {
    /// What it keeps, with its id: an estimate for [`MAX_SCREEN_BYTES`]
    /// (the map's own entry and allocations' rounding included).
    fn bytes(&self, id: &str) -> usize {
        128 + id.len() + self.user.len() + self.eligible.len() * 24
    }
}

/// Open screens by reservation id, and their bytes.
#[derive(Default)]
struct Screens {
    by_id: HashMap<String, Screened>,
    bytes: usize,
}

impl Screens {
    fn full(&self) -> bool {
        self.by_id.len() >= MAX_SCREENS || self.bytes >= MAX_SCREEN_BYTES
    }

    fn remove(&mut self, id: &str) -> Option<Screened> {
        let s = self.by_id.remove(id)?;
        self.bytes = self.bytes.saturating_sub(s.bytes(id));
        Some(s)
    }

    /// Forgets the screens whose reservations ended by `now`.
    fn forget_ended(&mut self, now: Nanos) {
        let mut freed = 0;
        self.by_id.retain(|id, s| {
            let keep = s.deadline > now;
            if !keep {
                freed += s.bytes(id);
            }
            keep
        });
        self.bytes = self.bytes.saturating_sub(freed);
    }
}

/// This node's travellers (the region's [`super::leases::Regions`] holds it).
pub(crate) struct Travellers {
    /// This node's region.
    here: String,
    /// This process's name in its fields: node id and id nonce.
    source: String,
    users: Mutex<HashMap<String, Traveller>>,
    screens: Mutex<Screens>,
    /// Fields and home names, shared by the users that have them.
    fields: Interner<[u8]>,
    homes: Interner<str>,
    /// Screens held until the home counted the last unit.
    pub held: AtomicU64,
    /// Units of other regions applied here.
    pub applied: AtomicU64,
}

/// A count field: region, process, campaign, event type ("" for an
/// impression) and cost, separated by NULs (none of them holds one: names
/// are printable).
fn field(region: &str, source: &str, campaign: &str, ty: &str, cost: u64) -> Vec<u8> {
    format!("{region}\0{source}\0{campaign}\0{ty}\0{cost}").into_bytes()
}

/// A field's region, campaign, event type and cost.
fn parse_field(f: &[u8]) -> Option<(&str, &str, &str, u64)> {
    let s = std::str::from_utf8(f).ok()?;
    let mut p = s.split('\0');
    let (region, _source, campaign, ty, cost) =
        (p.next()?, p.next()?, p.next()?, p.next()?, p.next()?);
    Some((region, campaign, ty, cost.parse().ok()?))
}

/// An applied position's field at the tier: the applying region, then the
/// count field.
fn applied_field(region: &str, f: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(region.len() + 1 + f.len());
    v.extend_from_slice(region.as_bytes());
    v.push(0);
    v.extend_from_slice(f);
    v
}

/// The event id of unit `k` of `user`'s field `f`: the same in every
/// region and on every node, so each region counts it once.
fn unit_id(user: &str, f: &[u8], k: u64) -> String {
    use siphasher::sip128::{Hasher128, SipHasher13};
    use std::hash::Hasher;
    let mut h = SipHasher13::new();
    h.write(user.as_bytes());
    h.write_u8(0);
    h.write(f);
    h.write_u64(k);
    format!("rg-{:032x}", h.finish128().as_u128())
}

impl Travellers {
    pub(crate) fn new(here: &str, node: &str, nonce: u32) -> Self {
        Travellers {
            here: here.to_owned(),
            source: format!("{node}/{nonce:08x}"),
            users: Mutex::default(),
            screens: Mutex::default(),
            fields: Interner::new(),
            homes: Interner::new(),
            held: AtomicU64::new(0),
            applied: AtomicU64::new(0),
        }
    }

    fn users(&self) -> MutexGuard<'_, HashMap<String, Traveller>> {
        self.users.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn screens(&self) -> MutexGuard<'_, Screens> {
        self.screens.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Users this node follows.
    pub(crate) fn len(&self) -> usize {
        self.users().len()
    }

    /// Whether a screen for `user` may be decided here now: anywhere but
    /// its home, not while a unit of this node's is unknown to the home.
    fn may_serve(&self, user: &str, now: Nanos) -> bool {
        {
            let mut screens = self.screens();
            if screens.full() {
                screens.forget_ended(now);
                if screens.full() {
                    return false;
                }
            }
        }
        match self.users().get(user) {
            None => true,
            Some(t) if t.home.as_deref() == Some(self.here.as_str()) => true,
            Some(t) => !t.waiting(now),
        }
    }

    /// The entry of `user`, made (room made first) if new.
    fn entry<'a>(
        users: &'a mut HashMap<String, Traveller>,
        user: &str,
        now: Nanos,
    ) -> &'a mut Traveller {
        if !users.contains_key(user) && users.len() >= MAX_USERS {
            // The least recently counted tenth goes (one sort per tenth).
            let mut by_age: Vec<(Nanos, String)> =
                users.iter().map(|(u, t)| (t.touched, u.clone())).collect();
            by_age.sort_unstable();
            for (_, u) in by_age.into_iter().take(MAX_USERS / 10) {
                users.remove(&u);
            }
        }
        let t = users.entry(user.to_owned()).or_default();
        t.touched = now;
        t
    }

    /// A screen of `user` reserved `eligible` under `id` until `deadline`.
    fn screened(
        &self,
        user: &str,
        id: &str,
        eligible: Vec<(Arc<str>, u64)>,
        times: (Nanos, Nanos),
    ) {
        let (now, deadline) = times;
        {
            let mut users = self.users();
            let t = Self::entry(&mut users, user, now);
            if t.home.as_deref() != Some(self.here.as_str()) {
                t.open_until = t.open_until.max(deadline);
            }
        }
        let screen = Screened {
            user: user.to_owned(),
            eligible: eligible.into_iter().filter(|(_, c)| *c != 1).collect(),
            deadline,
        };
        let mut screens = self.screens();
        // Past the bounds only by the screens decided since `may_serve`
        // saw room (a few, each bounded by the request's size).
        screens.bytes += screen.bytes(id);
        if let Some(old) = screens.by_id.insert(id.to_owned(), screen) {
            screens.bytes = screens.bytes.saturating_sub(old.bytes(id));
        }
    }

    /// Reservation `id` was committed for `campaigns` (at `cost` if given):
    /// its units are counted. A late commit (`user` given, no screen
    /// remembered) counts too.
    fn committed(&self, id: &str, req: &CommitRequest, campaigns: &[Arc<str>], now: Nanos) {
        let screened = self.screens().remove(id);
        let (user, eligible) = match (&screened, &req.user) {
            (Some(s), _) => (s.user.as_str(), &s.eligible[..]),
            (None, Some(u)) => (u.as_str(), &[][..]),
            (None, None) => return,
        };
        let mut users = self.users();
        let t = Self::entry(&mut users, user, now);
        t.open_until = 0;
        for c in campaigns {
            let reserved = eligible.iter().find(|(n, _)| n == c).map(|(_, cost)| *cost);
            let cost = req.cost.or(reserved).unwrap_or(1);
            let f = self
                .fields
                .get(&field(&self.here, &self.source, c, "", cost));
            t.own.add_one(&f);
        }
    }

    /// A reservation ended without a commit: its screen no longer holds.
    fn released(&self, id: &str) {
        if let Some(s) = self.screens().remove(id)
            && let Some(t) = self.users().get_mut(&s.user)
        {
            t.open_until = 0;
        }
    }

    /// An event of `user` counted here.
    fn counted(&self, user: &str, campaign: &str, ty: &str, cost: u64, now: Nanos) {
        let mut users = self.users();
        let t = Self::entry(&mut users, user, now);
        let f = self
            .fields
            .get(&field(&self.here, &self.source, campaign, ty, cost));
        t.own.add_one(&f);
    }
}

/// A traveller's exchange with the tier: its name, home, this node's
/// counts and this region's applied positions.
type Outgoing = (String, Arc<str>, Vec<TravelField>, Vec<TravelField>);

/// Units of other regions to apply here, and where each field then stands.
struct ToApply {
    events: Vec<Event>,
    /// (user, field, position) once applied.
    positions: Vec<(String, Vec<u8>, u64)>,
}

impl<C: Clock> Engine<C> {
    fn travellers(&self) -> Option<&Travellers> {
        self.regions.get().map(|r| &r.travel)
    }

    /// Whether `user`'s screen may be decided now (always outside regions).
    pub(crate) fn travel_may_serve(&self, user: &str, now: Nanos) -> bool {
        let Some(t) = self.travellers() else {
            return true;
        };
        let ok = t.may_serve(user, now);
        if !ok {
            t.held.fetch_add(1, Ordering::Relaxed);
        }
        ok
    }

    /// A screen's answer when its user is held back ([`Travellers`]): every
    /// candidate denied by `home_region`, retried after a second.
    pub(crate) fn travel_held(&self, req: &ScreenRequest) -> Vec<CandidateResult> {
        let reg = self.registry();
        req.candidates
            .iter()
            .map(|c| {
                let name: Arc<str> = match reg.chain(&c.campaign) {
                    Some(chain) => chain[0].name.clone(),
                    None => Arc::from(c.campaign.as_str()),
                };
                CandidateResult {
                    campaign: name.clone(),
                    eligible: false,
                    denied_by: Some(DeniedBy {
                        campaign: name,
                        cap: "home_region".into(),
                        retry_after: Some(HELD_RETRY),
                    }),
                    would_deny: None,
                    pacing: None,
                }
            })
            .collect()
    }

    /// A screen reserved under `id`: remembered, to count its commit.
    pub(crate) fn travel_screened(
        &self,
        req: &ScreenRequest,
        id: &str,
        results: &[CandidateResult],
        deadline: Nanos,
    ) {
        let (Some(t), Some(user)) = (self.travellers(), &req.user) else {
            return;
        };
        let eligible = req
            .candidates
            .iter()
            .zip(results)
            .filter(|(_, r)| r.eligible)
            .map(|(c, r)| (r.campaign.clone(), c.cost.unwrap_or(1)))
            .collect();
        t.screened(user, id, eligible, (self.now(), deadline));
    }

    /// A commit applied (not a repeat): its units counted.
    pub(crate) fn travel_committed(&self, id: &str, req: &CommitRequest, campaigns: &[Arc<str>]) {
        if let Some(t) = self.travellers() {
            t.committed(id, req, campaigns, self.now());
        }
    }

    /// A reservation released.
    pub(crate) fn travel_released(&self, id: &str) {
        if let Some(t) = self.travellers() {
            t.released(id);
        }
    }

    /// An event counted for its user.
    pub(crate) fn travel_counted(&self, e: &Event) {
        if let (Some(t), Some(user)) = (self.travellers(), &e.user) {
            let ty = e.event_type.as_deref().unwrap_or("");
            t.counted(user, &e.campaign, ty, e.cost, self.now());
        }
    }

    /// The region's exchange with the tier `global` for its users, once a
    /// tick: homes claimed for users first counted here, this node's
    /// counts and the region's applied positions written, other regions'
    /// units applied here. Returns the first error; what failed is tried
    /// again next tick.
    pub(crate) fn travel_tick(&self, global: &dyn Shared) -> Result<(), EngineError> {
        let Some(t) = self.travellers() else {
            return Ok(());
        };
        let now = self.now();
        let keep_ms = TRAVEL_KEEP / 1_000_000;
        // Screens whose reservations ended uncommitted.
        t.screens().forget_ended(now);
        // Homes for users counted (or screened) here whose home is unknown.
        let unclaimed: Vec<String> = {
            let mut users = t.users();
            users.retain(|_, u| u.touched.saturating_add(TRAVEL_KEEP) > now);
            users
                .iter()
                .filter(|(_, u)| u.home.is_none() && (!u.own.is_empty() || u.open_until > 0))
                .map(|(k, _)| k.clone())
                .take(BATCH * 10)
                .collect()
        };
        for chunk in unclaimed.chunks(BATCH) {
            let names: Vec<&str> = chunk.iter().map(String::as_str).collect();
            let homes = global.claim_homes(&t.here, &names, keep_ms)?;
            let mut users = t.users();
            for (user, home) in chunk.iter().zip(homes) {
                if let Some(u) = users.get_mut(user) {
                    u.travels = home != t.here;
                    u.home = Some(t.homes.get(&home));
                }
            }
        }
        // Users of this home that other regions counted.
        let travellers = global.travellers_of(&t.here, MAX_TRAVELLERS)?;
        {
            let mut users = t.users();
            for user in travellers {
                let u = Travellers::entry(&mut users, &user, now);
                u.home = Some(t.homes.get(&t.here));
                u.travels = true;
            }
        }
        // Every traveller's counts and applied positions out, the tier's in.
        let syncs: Vec<Outgoing> = {
            let users = t.users();
            users
                .iter()
                .filter(|(_, u)| u.travels)
                .filter_map(|(name, u)| {
                    let home = u.home.clone()?;
                    let counts = u.own.iter().map(|(f, n)| (f.to_vec(), n)).collect();
                    let applied = u
                        .applied
                        .iter()
                        .map(|(f, n)| (applied_field(&t.here, f), n))
                        .collect();
                    Some((name.clone(), home, counts, applied))
                })
                .collect()
        };
        let reg = self.registry();
        let mut first_err = None;
        for chunk in syncs.chunks(BATCH) {
            let req: Vec<TravelSync<'_>> = chunk
                .iter()
                .map(|(user, home, counts, applied)| TravelSync {
                    user,
                    home,
                    here: &t.here,
                    counts,
                    applied,
                    keep_ms,
                })
                .collect();
            let views = global.travel_sync(&req)?;
            let mut todo = ToApply {
                events: Vec::new(),
                positions: Vec::new(),
            };
            {
                let mut users = t.users();
                for ((user, home, _, _), view) in chunk.iter().zip(views) {
                    let Some(u) = users.get_mut(user) else {
                        continue;
                    };
                    u.touched = now;
                    for (af, n) in &view.applied {
                        let Some(cut) = af.iter().position(|b| *b == 0) else {
                            continue;
                        };
                        let (region, f) = (&af[..cut], &af[cut + 1..]);
                        if region == t.here.as_bytes() {
                            // The region's positions, as any of its nodes
                            // left them (this one, before a restart).
                            u.applied.raise(&t.fields.get(f), *n);
                        }
                        if region == home.as_bytes() && u.own.contains(f) {
                            u.acked.raise(&t.fields.get(f), *n);
                        }
                    }
                    for (f, n) in &view.counts {
                        let Some((region, campaign, ty, cost)) = parse_field(f) else {
                            continue;
                        };
                        // This region's units are in its records already.
                        if region == t.here {
                            continue;
                        }
                        let from = u.applied.get(f);
                        if *n <= from {
                            continue;
                        }
                        // A campaign this region does not define counts
                        // nothing here.
                        if reg.chain(campaign).is_some() {
                            for k in from + 1..=*n {
                                todo.events.push(Event {
                                    user: Some(user.clone()),
                                    ids: Vec::new(),
                                    campaign: campaign.to_owned(),
                                    cost,
                                    event_id: Some(unit_id(user, f, k)),
                                    event_type: (!ty.is_empty()).then(|| ty.to_owned()),
                                });
                            }
                        }
                        todo.positions.push((user.clone(), f.clone(), *n));
                    }
                }
            }
            if todo.events.is_empty() && todo.positions.is_empty() {
                continue;
            }
            match self.apply_foreign(&todo.events) {
                Ok(n) => {
                    t.applied.fetch_add(n as u64, Ordering::Relaxed);
                    let mut users = t.users();
                    for (user, f, n) in todo.positions {
                        if let Some(u) = users.get_mut(&user) {
                            u.applied.raise(&t.fields.get(&f), n);
                        }
                    }
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Applies other regions' units; a batch this region refuses (a
    /// campaign defined otherwise here, a type it does not know) is applied
    /// one unit at a time, the refused ones left out and logged: one unit
    /// never holds back the rest. Returns how many were new here.
    fn apply_foreign(&self, events: &[Event]) -> Result<usize, EngineError> {
        let refused = |e: &EngineError| {
            matches!(
                e,
                EngineError::InvalidArgument { .. } | EngineError::NotFound(_)
            )
        };
        match self.foreign_events(events) {
            Err(e) if refused(&e) => {
                let mut n = 0;
                for ev in events {
                    match self.foreign_events(std::slice::from_ref(ev)) {
                        Ok(k) => n += k,
                        Err(e) if refused(&e) => {
                            tracing::warn!(
                                campaign = %ev.campaign,
                                "another region's unit is refused here, left out: {e}"
                            );
                        }
                        Err(e) => return Err(e),
                    }
                }
                Ok(n)
            }
            r => r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Screens of 10 000 candidates at a cost of 2 (240 KB each) fill
    /// [`MAX_SCREEN_BYTES`] after 280: then every screen is held until
    /// they end, and memory stays within it.
    #[test]
    fn open_screens_past_their_bytes_hold_new_screens_until_they_end() {
        let t = Travellers::new("r", "n", 1);
        let costly: Vec<(Arc<str>, u64)> = (0..10_000)
            .map(|i| (Arc::from(format!("c{i}").as_str()), 2))
            .collect();
        let mut n = 0;
        while t.may_serve(&format!("u{n}"), 0) && n < 1_000 {
            t.screened(&format!("u{n}"), &format!("r{n}"), costly.clone(), (0, 10));
            n += 1;
        }
        assert_eq!(n, 280, "screens remembered before the bound");
        assert!(t.screens().bytes < MAX_SCREEN_BYTES + 250_000);
        assert!(!t.may_serve("someone-else", 5), "held while full");
        assert!(t.may_serve("someone-else", 10), "room once they ended");
        assert_eq!(t.screens().bytes, 0);
        // Candidates at the default cost keep nothing but the screen.
        let plain: Vec<(Arc<str>, u64)> = costly.iter().map(|(c, _)| (c.clone(), 1)).collect();
        t.screened("u", "r", plain, (10, 20));
        assert_eq!(t.screens().bytes, 128 + 1 + 1);
    }
}
