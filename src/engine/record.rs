//! A subject's record: every counter one subject (a user, a campaign, a policy
//! key) has, and the pending debits of open reservations on them, under one
//! lock (docs/semantics.md §10.2).

use std::collections::HashMap;

use smallvec::SmallVec;

use crate::clock::Nanos;
use crate::keyed::Record;
use crate::limits::adaptive::AdaptiveState;
use crate::limits::{Item, ItemState, PendingItem};
use crate::store::codec::{self, StoredCounter, StoredState};

/// Fewest counters a record has before the sweeper looks for empty ones in it
/// (see [`SubjectRecord`]'s `prune`): below it, the bytes to win are few.
const PRUNE_MIN_COUNTERS: usize = 4;

/// The tag a counter had in records written before format 4 (data
/// directories) or 5 (shared stores): the item's index in the low byte,
/// a fingerprint of its definition as written above. Only the migration
/// of older records reads it (`super::migrate`).
pub fn legacy_tag(index: usize, fingerprint: u32) -> u32 {
    (fingerprint << 8) | (index as u32 & 0xff)
}

/// One counter: the state of item `tag` ([`crate::limits::counter_tag`]) of
/// `def_id` (a campaign's or policy's id; 0 for inline limits). 40 bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Counter {
    pub def_id: u32,
    pub tag: u32,
    pub state: ItemState,
}

/// A pending debit of an open reservation on one counter.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingEntry {
    /// The reservation's sequence number.
    pub res: u64,
    /// Which candidate of a screen (0 for a check).
    pub cand: u32,
    pub def_id: u32,
    pub tag: u32,
    pub item: PendingItem,
    /// Units debited.
    pub n: u64,
}

/// An entry list of one reservation in one record: most hold one entry (a
/// campaign record, one candidate), inline.
type EntryList = SmallVec<[PendingEntry; 1]>;

/// Whether releasing a pending debit of this kind changes what a record
/// stores: a budget's pending units and a concurrency hold are not stored
/// (see `codec::StoredState`), so [`SubjectRecord::to_stored`] skips them.
fn changes_stored(p: &PendingItem) -> bool {
    !matches!(
        p,
        PendingItem::Budget { .. } | PendingItem::Concurrency { .. }
    )
}

/// Estimated bytes a reservation's debit takes in a record holding many
/// (a campaign's): its entry in the record's map (hashbrown runs between 7/16
/// and 7/8 full, so 12/7 of a counter on average).
pub fn map_entry_bytes() -> usize {
    (std::mem::size_of::<(u64, EntryList)>() + 1) * 12 / 7
}

/// Estimated bytes of `entries` debits in a short list (a user's record):
/// a `Vec` grown by doubling is 3/4 full on average.
pub fn list_entry_bytes(entries: usize) -> usize {
    entries * std::mem::size_of::<PendingEntry>() * 4 / 3
}

/// Estimated bytes of a record a reservation keeps in the hot tier (pinned),
/// with `counters` counters: the map's entry, the pending set's box and the
/// counters. Counted for each reservation, though reservations of one user share
/// it: the conservative side.
pub fn pinned_record_bytes(counters: usize) -> usize {
    // The hot tier's tables run between 7/16 and 7/8 full: 12/7 of an entry.
    (std::mem::size_of::<([u64; 2], SubjectRecord)>() + 1) * 12 / 7
        + std::mem::size_of::<PendingSet>()
        + counters * std::mem::size_of::<Counter>()
        // The record's counters, pending set and its list.
        + 3 * ALLOC_OVERHEAD
}

/// What the allocator adds to each heap allocation (its header and size-class
/// rounding), for estimates of bytes: with it, what open reservations account
/// for came within 6 % of the RSS they were measured to take (1 513 bytes
/// each, 500 000 one-candidate screens; `measure_reservation_bytes`).
pub const ALLOC_OVERHEAD: usize = 16;

/// Heap bytes of an entry list beyond its inline room.
fn spilled_bytes(l: &EntryList) -> usize {
    if l.spilled() {
        l.capacity() * std::mem::size_of::<PendingEntry>()
    } else {
        0
    }
}

/// Most entries a [`PendingSet`] keeps in a plain list. A list is scanned to
/// settle one reservation, so this bounds that scan; a hash table of
/// reservations costs at least four buckets (470 bytes), where a user's usual
/// one or two reservations take 80 bytes a debit in a list.
const LIST_MAX: usize = 64;

/// Reservations' entry lists by reservation.
type ResMap = HashMap<u64, EntryList, foldhash::fast::RandomState>;

/// The debits of open reservations held in one record, with running sums:
/// settling one reservation takes its entries out by one hash lookup (or a
/// scan of at most [`LIST_MAX`]), and the pending units of a counter are read
/// from a sum, whatever else is open. (A list scanned on every settle made
/// one budgeted campaign with 576 000 open reservations expire them at 650
/// per second, its lock held all along: a usage read waited 26 s.)
#[derive(Debug, Default, Clone)]
pub struct PendingSet {
    /// Up to [`LIST_MAX`] entries, in the order they came, while `map` is
    /// `None`.
    list: Vec<PendingEntry>,
    /// Past that, all of them: by reservation, each reservation's in the
    /// order they came.
    map: Option<ResMap>,
    /// Pending units per counter (def_id, tag); a record has few counters.
    sums: SmallVec<[(u32, u32, u64); 2]>,
    /// Entries in all, and those whose release changes the stored form.
    len: usize,
    stored: usize,
    /// Heap bytes of the map's entry lists that spilled out of their inline
    /// room.
    spilled: usize,
    /// With a shared store only: the reservations these debits belong to
    /// and the ids settled here, which other nodes must see
    /// (`super::placement`).
    pub(crate) shared: Option<Box<super::holds::SharedMeta>>,
}

impl PendingSet {
    fn sum_mut(&mut self, def_id: u32, tag: u32) -> &mut u64 {
        let pos = match self.sums.iter().position(|s| s.0 == def_id && s.1 == tag) {
            Some(p) => p,
            None => {
                self.sums.push((def_id, tag, 0));
                self.sums.len() - 1
            }
        };
        &mut self.sums[pos].2
    }

    /// The entries by reservation, made from the list if there is none yet.
    fn map(&mut self) -> &mut ResMap {
        if self.map.is_none() {
            let mut m = ResMap::default();
            for e in std::mem::take(&mut self.list) {
                m.entry(e.res).or_default().push(e);
            }
            self.spilled = m.values().map(spilled_bytes).sum();
            self.map = Some(m);
        }
        self.map.get_or_insert_with(ResMap::default)
    }

    fn add(&mut self, entry: PendingEntry) {
        *self.sum_mut(entry.def_id, entry.tag) += entry.n;
        self.len += 1;
        self.stored += usize::from(changes_stored(&entry.item));
        if self.map.is_none() && self.list.len() < LIST_MAX {
            self.list.push(entry);
            return;
        }
        let res = entry.res;
        let list = self.map().entry(res).or_default();
        let before = spilled_bytes(list);
        list.push(entry);
        let after = spilled_bytes(list);
        self.spilled = self.spilled + after - before;
    }

    /// Makes room for `n` more entries of reservation `res`.
    fn reserve(&mut self, res: u64, n: usize) {
        if self.map.is_none() && self.list.len() + n <= LIST_MAX {
            // Exact: `reserve` would make room for 4 at least, 320 bytes for
            // a one-candidate screen's one debit.
            self.list.reserve_exact(n);
            return;
        }
        let list = self.map().entry(res).or_default();
        let before = spilled_bytes(list);
        list.reserve(n);
        let after = spilled_bytes(list);
        self.spilled = self.spilled + after - before;
    }

    /// Drops the list [`PendingSet::reserve`] made for `res` if it is still
    /// empty.
    fn drop_empty(&mut self, res: u64) {
        if let Some(m) = &mut self.map
            && m.get(&res).is_some_and(|l| l.is_empty())
            && let Some(l) = m.remove(&res)
        {
            self.spilled -= spilled_bytes(&l);
        }
    }

    /// Accounts for entries leaving the set.
    fn forget(&mut self, gone: &[PendingEntry]) {
        for p in gone {
            let s = self.sum_mut(p.def_id, p.tag);
            *s = s.saturating_sub(p.n);
            self.len -= 1;
            self.stored -= usize::from(changes_stored(&p.item));
        }
        self.sums.retain(|s| s.2 > 0);
    }

    fn take(&mut self, res: u64, cand: Option<u32>) -> SmallVec<[PendingEntry; 4]> {
        let mine = |p: &PendingEntry| p.res == res && cand.is_none_or(|c| c == p.cand);
        let mut out: SmallVec<[PendingEntry; 4]> = SmallVec::new();
        match &mut self.map {
            None => {
                self.list.retain(|p| {
                    if mine(p) {
                        out.push(p.clone());
                        false
                    } else {
                        true
                    }
                });
            }
            Some(m) => match cand {
                None => {
                    if let Some(list) = m.remove(&res) {
                        self.spilled -= spilled_bytes(&list);
                        out = list.into_iter().collect();
                    }
                }
                Some(_) => {
                    let Some(list) = m.get_mut(&res) else {
                        return out;
                    };
                    let before = spilled_bytes(list);
                    list.retain(|p| {
                        if mine(p) {
                            out.push(p.clone());
                            false
                        } else {
                            true
                        }
                    });
                    let (empty, after) = (list.is_empty(), spilled_bytes(list));
                    self.spilled = self.spilled + after - before;
                    if empty {
                        m.remove(&res);
                    }
                }
            },
        }
        self.forget(&out);
        out
    }

    fn is_empty(&self) -> bool {
        self.len == 0 && self.shared.is_none()
    }

    fn iter(&self) -> impl Iterator<Item = &PendingEntry> {
        self.list
            .iter()
            .chain(self.map.iter().flat_map(|m| m.values().flatten()))
    }

    /// Reservations with entries here.
    fn reservations(&self) -> usize {
        match &self.map {
            None => {
                let mut r: Vec<u64> = self.list.iter().map(|p| p.res).collect();
                r.sort_unstable();
                r.dedup();
                r.len()
            }
            Some(m) => m.len(),
        }
    }

    fn heap_bytes(&self) -> usize {
        std::mem::size_of::<PendingSet>()
            + self.list.capacity() * std::mem::size_of::<PendingEntry>()
            // hashbrown: one entry and one control byte per bucket, about
            // 8/7 buckets per unit of capacity.
            + self.map.as_ref().map_or(0, |m| {
                m.capacity() * 8 / 7 * (std::mem::size_of::<(u64, EntryList)>() + 1)
                    + self.spilled
            })
            + self.shared.as_ref().map_or(0, |m| m.heap_bytes())
    }

    /// The same sums with no entries: what reading figures needs.
    fn sums_only(&self) -> PendingSet {
        PendingSet {
            sums: self.sums.clone(),
            ..PendingSet::default()
        }
    }
}

/// See the module documentation.
///
/// 40 bytes, so a hot-tier entry with its 16-byte key is 56: the counters are an
/// exact-size boxed slice (a new counter is rare next to decisions on existing
/// ones, so re-allocating then costs less than a `Vec`'s spare capacity on
/// every record), and pending debits, absent most of the time, are boxed.
#[derive(Debug, Default, Clone)]
pub struct SubjectRecord {
    pub counters: Box<[Counter]>,
    /// Debits of open reservations, so a release or commit finds them and a
    /// snapshot for disk can leave them out (reservations are memory-only).
    pub pending: Option<Box<PendingSet>>,
    /// An upper bound of the instant from which every counter equals a fresh one
    /// and nothing is pending: raised on every debit, never lowered except by a
    /// recomputation. An upper bound only keeps a record a little longer.
    pub idle_at: Nanos,
    /// Sequence number of the last store batch holding this record: until the
    /// store has written it, the copy on disk is older and the record must not
    /// be evicted. With a shared store (`super::placement`), records are never
    /// queued; this is then the version of the shared copy this one equals
    /// (`super::placement::STALE`: unknown, read it again before deciding).
    pub write_seq: u64,
}

impl SubjectRecord {
    /// The state of `def_id`'s item `tag`, if it has one of that definition.
    pub fn state(&self, def_id: u32, tag: u32) -> Option<&ItemState> {
        self.counters
            .iter()
            .find(|s| s.def_id == def_id && s.tag == tag)
            .map(|s| &s.state)
    }

    /// The state of `def_id`'s item `tag`, made (empty) if absent.
    pub fn state_mut(&mut self, def_id: u32, tag: u32) -> &mut ItemState {
        let pos = self
            .counters
            .iter()
            .position(|s| s.def_id == def_id && s.tag == tag);
        let pos = match pos {
            Some(p) => p,
            None => {
                let mut v = std::mem::take(&mut self.counters).into_vec();
                v.reserve_exact(1);
                v.push(Counter {
                    def_id,
                    tag,
                    state: ItemState::Fresh,
                });
                self.counters = v.into_boxed_slice();
                self.counters.len() - 1
            }
        };
        &mut self.counters[pos].state
    }

    /// Raises `idle_at` to cover `item`'s state in counter (`def_id`, `tag`).
    pub fn touch(&mut self, def_id: u32, tag: u32, item: &Item) {
        if let Some(st) = self.state(def_id, tag) {
            self.idle_at = self.idle_at.max(item.idle_at(st));
        }
    }

    /// Takes out the pending entries of reservation `res` (of candidate `cand`,
    /// or of all candidates when `None`): one lookup, whatever else is open.
    pub fn take_pending(&mut self, res: u64, cand: Option<u32>) -> SmallVec<[PendingEntry; 4]> {
        let Some(pending) = self.pending.as_mut() else {
            return SmallVec::new();
        };
        let out = pending.take(res, cand);
        if pending.is_empty() {
            self.pending = None;
        }
        out
    }

    /// Adds a pending debit.
    pub fn add_pending(&mut self, entry: PendingEntry) {
        self.pending.get_or_insert_with(Default::default).add(entry);
    }

    /// Makes room for `n` more pending debits of reservation `res` at once (a
    /// screen reserving many candidates), instead of growing one push at a
    /// time. Call [`SubjectRecord::drop_empty_pending`] after: an empty list
    /// left in place would pin the record as if something were pending.
    pub fn reserve_pending(&mut self, res: u64, n: usize) {
        self.pending
            .get_or_insert_with(Default::default)
            .reserve(res, n);
    }

    /// Drops what [`SubjectRecord::reserve_pending`] made for `res` if
    /// nothing was put in it.
    pub fn drop_empty_pending(&mut self, res: u64) {
        let Some(p) = self.pending.as_mut() else {
            return;
        };
        p.drop_empty(res);
        if p.is_empty() {
            self.pending = None;
        }
    }

    /// The shared-store metadata of this record (`super::placement`), if any.
    pub(crate) fn shared_meta(&self) -> Option<&super::holds::SharedMeta> {
        self.pending.as_ref().and_then(|p| p.shared.as_deref())
    }

    /// The shared-store metadata, made empty if absent.
    pub(crate) fn shared_meta_mut(&mut self) -> &mut super::holds::SharedMeta {
        self.pending
            .get_or_insert_with(Default::default)
            .shared
            .get_or_insert_with(Default::default)
    }

    /// Drops the shared-store metadata once it holds nothing.
    pub(crate) fn drop_empty_shared_meta(&mut self) {
        if let Some(p) = self.pending.as_mut() {
            if p.shared.as_ref().is_some_and(|m| m.is_empty()) {
                p.shared = None;
            }
            if p.is_empty() {
                self.pending = None;
            }
        }
    }

    /// Every pending debit (in no particular order).
    pub fn pending(&self) -> impl Iterator<Item = &PendingEntry> {
        self.pending.iter().flat_map(|p| p.iter())
    }

    /// Pending units on counter (`def_id`, `tag`): a running sum.
    pub fn pending_on(&self, def_id: u32, tag: u32) -> u64 {
        self.pending.as_ref().map_or(0, |p| {
            p.sums
                .iter()
                .find(|s| s.0 == def_id && s.1 == tag)
                .map_or(0, |s| s.2)
        })
    }

    /// Open reservations with debits in this record.
    pub fn pending_reservations(&self) -> usize {
        self.pending.as_ref().map_or(0, |p| p.reservations())
    }

    /// A copy for reading figures: the counters and the pending sums, without
    /// the pending entries (a copy of those would cost one per open
    /// reservation).
    pub fn figures_copy(&self) -> SubjectRecord {
        SubjectRecord {
            counters: self.counters.clone(),
            pending: self.pending.as_ref().map(|p| Box::new(p.sums_only())),
            idle_at: self.idle_at,
            write_seq: self.write_seq,
        }
    }

    /// The value to store: committed state only (every pending debit released
    /// as of `now`, as a crash would), framed with the record's idle instant so
    /// compaction drops it once it is dead. `def(def_id, tag)` gives the item a
    /// pending entry's counter belongs to; without it the debit stays counted (the
    /// conservative side).
    pub fn to_stored<'a>(&self, now: Nanos, def: impl Fn(u32, u32) -> Option<&'a Item>) -> Vec<u8> {
        let counters = self.committed_counters(now, &def);
        let mut idle = 0;
        let stored: Vec<StoredCounter> = counters
            .iter()
            .filter_map(|s| {
                if let Some(item) = def(s.def_id, s.tag) {
                    let at = item.idle_at(&s.state);
                    if at <= now {
                        return None;
                    }
                    idle = idle.max(at);
                } else {
                    idle = idle.max(self.idle_at);
                }
                let state = StoredState::from(&s.state);
                (state != StoredState::Fresh).then_some(StoredCounter {
                    def_id: s.def_id,
                    tag: s.tag,
                    state,
                })
            })
            .collect();
        codec::frame(idle, &codec::encode(&stored))
    }

    /// The counters with every pending debit released as of `now` (what a
    /// crash leaves; owner mode writes them, docs/cluster.md): borrowed
    /// when nothing is pending. `def` as in [`SubjectRecord::to_stored`].
    pub fn committed_counters<'a>(
        &self,
        now: Nanos,
        def: &impl Fn(u32, u32) -> Option<&'a Item>,
    ) -> std::borrow::Cow<'_, [Counter]> {
        // Only a record with pending debits needs a copy to release them
        // from; the others (most, and all of an event's) encode in place.
        let mut counters = std::borrow::Cow::Borrowed(&self.counters[..]);
        // Budget and concurrency debits are released a counter at a time, all of
        // them at once, from the running sums: a campaign with a budget is
        // written at every commit, and walking its open reservations' debits
        // each time made a commit's median 5.98 ms with 262 000 open (0.32 ms
        // with none). Releasing them all leaves no pending units in the
        // budget's period and no held concurrency, whatever their order.
        if let Some(p) = &self.pending {
            for &(def_id, tag, _) in &p.sums {
                let Some(item) = def(def_id, tag) else {
                    continue;
                };
                if !matches!(
                    item,
                    Item::Budget(_) | Item::Concurrency(_) | Item::Adaptive(_)
                ) {
                    continue;
                }
                let Some(s) = counters
                    .to_mut()
                    .iter_mut()
                    .find(|s| s.def_id == def_id && s.tag == tag)
                else {
                    continue;
                };
                match &s.state {
                    ItemState::Budget(b) => {
                        let all = PendingItem::Budget {
                            period_start: b.start,
                        };
                        item.release(&mut s.state, &all, u64::MAX, now);
                    }
                    ItemState::Concurrency(_) => {
                        s.state = ItemState::Concurrency(Default::default());
                    }
                    // The slots go; what the controller learned stays.
                    ItemState::Adaptive(a) => {
                        let ctl = a.ctl;
                        s.state = ItemState::Adaptive(Box::new(AdaptiveState {
                            slots: Default::default(),
                            ctl,
                        }));
                    }
                    _ => {}
                }
            }
        }
        // The other kinds are released debit by debit (a rate's refund
        // depends on each debit's time), walked only when there are some.
        let walk = self.pending.as_ref().is_some_and(|p| p.stored > 0);
        let walked = if walk { self.pending.as_deref() } else { None };
        for p in walked.into_iter().flat_map(PendingSet::iter) {
            if !changes_stored(&p.item) {
                continue;
            }
            let Some(item) = def(p.def_id, p.tag) else {
                continue;
            };
            if let Some(s) = counters
                .to_mut()
                .iter_mut()
                .find(|s| s.def_id == p.def_id && s.tag == p.tag)
            {
                item.release(&mut s.state, &p.item, p.n, now);
            }
        }
        counters
    }

    /// A record read back from the store.
    pub fn from_stored(value: &[u8]) -> Result<Self, String> {
        let (idle_at, payload) = codec::unframe(value)?;
        let counters: Vec<StoredCounter> = codec::decode(payload)?;
        Ok(SubjectRecord {
            counters: counters
                .into_iter()
                .map(|s| Counter {
                    def_id: s.def_id,
                    tag: s.tag,
                    state: s.state.into(),
                })
                .collect(),
            pending: None,
            idle_at,
            write_seq: 0,
        })
    }
}

impl Record for SubjectRecord {
    /// The store's written watermark ([`crate::store::Store::written_seq`]).
    /// The idle instant is kept in the record, so no definitions are needed.
    type Ctx = u64;

    fn idle_at(&self, _: &u64) -> Nanos {
        self.idle_at
    }

    /// Open reservations' debits exist only here, and a record whose last
    /// batch is not yet written would be read back older than it is.
    fn pinned(&self, written: &u64) -> bool {
        self.pending.is_some() || self.write_seq > *written
    }

    /// Drops empty counters ([`ItemState::is_empty`]): a user screened against
    /// 50 campaigns and shown one keeps 49 counters at 0 after the release,
    /// 40 bytes each plus a rolling log's box, for as long as the user stays
    /// active. Dropping them on each release instead made screen + commit
    /// 5.6× slower (the counters are re-made by the next screen); once per sweep
    /// it costs little. Records with few counters, or with open reservations
    /// (whose debits name their counters), are left alone: only inline fields
    /// are read for them.
    fn prune(&mut self, _: &u64) -> usize {
        if self.counters.len() < PRUNE_MIN_COUNTERS || self.pending.is_some() {
            return 0;
        }
        if !self.counters.iter().any(|s| s.state.is_empty()) {
            return 0;
        }
        let before = self.heap_bytes();
        let kept: Vec<Counter> = std::mem::take(&mut self.counters)
            .into_vec()
            .into_iter()
            .filter(|s| !s.state.is_empty())
            .collect();
        self.counters = kept.into_boxed_slice();
        before - self.heap_bytes()
    }

    fn heap_bytes(&self) -> usize {
        std::mem::size_of_val::<[Counter]>(&self.counters)
            + self.pending.as_ref().map_or(0, |p| p.heap_bytes())
            + self
                .counters
                .iter()
                .map(|s| s.state.heap_bytes())
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counter(used: u64) -> ItemState {
        ItemState::Counter(crate::limits::window::CounterState {
            start: 0,
            end: 10,
            used,
        })
    }

    fn record(states: Vec<ItemState>) -> SubjectRecord {
        SubjectRecord {
            counters: states
                .into_iter()
                .enumerate()
                .map(|(i, state)| Counter {
                    def_id: i as u32,
                    tag: 0,
                    state,
                })
                .collect(),
            idle_at: 10,
            ..SubjectRecord::default()
        }
    }

    #[test]
    fn prune_drops_empty_slots_and_keeps_the_rest() {
        let mut r = record(vec![
            counter(0),
            counter(2),
            ItemState::Log(Box::default()),
            ItemState::Fresh,
            counter(0),
        ]);
        let before = r.heap_bytes();
        let freed = r.prune(&0);
        assert_eq!(before - freed, r.heap_bytes(), "reports what it freed");
        assert_eq!(r.counters.len(), 1);
        assert_eq!(
            (r.counters[0].def_id, &r.counters[0].state),
            (1, &counter(2))
        );
        assert_eq!(r.prune(&0), 0, "nothing left to drop");
    }

    #[test]
    fn prune_leaves_small_records_and_open_reservations_alone() {
        let mut small = record(vec![counter(0), counter(0), counter(1)]);
        assert_eq!(small.prune(&0), 0);
        assert_eq!(small.counters.len(), 3);
        let mut held = record(vec![counter(0); 5]);
        held.add_pending(PendingEntry {
            res: 1,
            cand: 0,
            def_id: 0,
            tag: 0,
            item: PendingItem::Counter { window_start: 0 },
            n: 1,
        });
        assert_eq!(held.prune(&0), 0);
        assert_eq!(held.counters.len(), 5);
    }

    fn entry(res: u64, cand: u32, def_id: u32, n: u64) -> PendingEntry {
        PendingEntry {
            res,
            cand,
            def_id,
            tag: 0,
            item: PendingItem::Budget { period_start: 0 },
            n,
        }
    }

    /// Settling takes one reservation's entries (or one candidate's) and
    /// keeps the sums and byte count as they would be from scratch.
    #[test]
    fn pending_sets_take_by_reservation_and_keep_their_sums() {
        let mut r = record(vec![counter(0), counter(0)]);
        let empty = r.heap_bytes();
        for res in 1..=1000 {
            r.add_pending(entry(res, 0, 0, 2));
            r.add_pending(entry(res, 1, 1, 3));
        }
        r.add_pending(entry(7, 2, 0, 5));
        assert_eq!((r.pending_on(0, 0), r.pending_on(1, 0)), (2005, 3000));
        assert_eq!(r.pending_reservations(), 1000);
        let taken = r.take_pending(7, Some(2));
        assert_eq!(taken.as_slice(), &[entry(7, 2, 0, 5)]);
        let taken = r.take_pending(7, None);
        assert_eq!(taken.len(), 2);
        assert!(r.take_pending(7, None).is_empty());
        assert_eq!((r.pending_on(0, 0), r.pending_on(1, 0)), (1998, 2997));
        let figures = r.figures_copy();
        assert_eq!(figures.pending_on(1, 0), 2997);
        assert_eq!(figures.pending().count(), 0, "a copy without the entries");
        for res in 1..=1000 {
            r.take_pending(res, Some(1));
            r.take_pending(res, Some(0));
        }
        assert!(r.pending.is_none(), "an empty set is dropped");
        assert_eq!(r.heap_bytes(), empty);
        // A reserved list left empty is dropped too.
        r.reserve_pending(5, 50);
        assert!(r.heap_bytes() > empty);
        r.drop_empty_pending(5);
        assert!(r.pending.is_none());
    }

    #[test]
    fn sizes_are_as_documented() {
        assert_eq!(std::mem::size_of::<Counter>(), 40);
        assert_eq!(std::mem::size_of::<SubjectRecord>(), 40);
        assert_eq!(std::mem::size_of::<([u64; 2], SubjectRecord)>(), 56);
    }
}
