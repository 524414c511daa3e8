//! A subject's record: every counter one subject (a user, a campaign, a policy
//! key) has, and the pending debits of open reservations on them, under one
//! lock (DESIGN §6 "records, not loose counters").

use smallvec::SmallVec;

use crate::clock::Nanos;
use crate::keyed::Record;
use crate::limits::{Item, ItemState, PendingItem};
use crate::store::codec::{self, StoredSlot, StoredState};

/// Fewest slots a record has before the sweeper looks for empty ones in it
/// (see [`SubjectRecord`]'s `prune`): below it, the bytes to win are few.
const PRUNE_MIN_SLOTS: usize = 4;

/// Low bits of a slot tag: the item's index in its owner's definition.
const INDEX_BITS: u32 = 8;

// Two items of one owner must never share a tag's index bits: validation caps
// a stack at MAX_ITEMS items and a campaign at MAX_CAPS caps plus its budget
// and max_in_flight.
const _: () = assert!(crate::model::limit::MAX_ITEMS <= 1 << INDEX_BITS);
const _: () = assert!(crate::model::campaign::MAX_CAPS + 2 <= 1 << INDEX_BITS);

/// A slot's tag: the item index in the low byte, its definition's fingerprint
/// above. A slot whose tag differs from the current definition's belongs to an
/// older definition and reads as empty (DESIGN §2.6: a changed item starts
/// empty; an unchanged one at the same index keeps its state).
pub fn tag(index: usize, fingerprint: u32) -> u32 {
    (fingerprint << INDEX_BITS) | (index as u32 & ((1 << INDEX_BITS) - 1))
}

/// One counter: the state of item `tag` of `owner` (a campaign's or policy's
/// id; 0 for inline limits). 40 bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Slot {
    pub owner: u32,
    pub tag: u32,
    pub state: ItemState,
}

/// A pending debit of an open reservation on one slot.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingEntry {
    /// The reservation's sequence number.
    pub res: u64,
    /// Which candidate of a screen (0 for a check).
    pub cand: u32,
    pub owner: u32,
    pub tag: u32,
    pub item: PendingItem,
    /// Units debited.
    pub n: u64,
}

/// See the module documentation.
///
/// 40 bytes, so a hot-tier entry with its 16-byte key is 56: the slots are an
/// exact-size boxed slice (a new counter is rare next to decisions on existing
/// ones, so re-allocating then costs less than a `Vec`'s spare capacity on
/// every record), and pending debits, absent most of the time, are boxed.
#[derive(Debug, Default, Clone)]
pub struct SubjectRecord {
    pub slots: Box<[Slot]>,
    /// Debits of open reservations, so a release or commit finds them and a
    /// snapshot for disk can leave them out (reservations are memory-only).
    pub pending: Option<Box<Vec<PendingEntry>>>,
    /// An upper bound of the instant from which every slot equals a fresh one
    /// and nothing is pending: raised on every debit, never lowered except by a
    /// recomputation. An upper bound only keeps a record a little longer.
    pub idle_at: Nanos,
    /// Sequence number of the last store batch holding this record: until the
    /// store has written it, the copy on disk is older and the record must not
    /// be evicted.
    pub write_seq: u64,
}

impl SubjectRecord {
    /// The state of `owner`'s item `tag`, if it has one of that definition.
    pub fn state(&self, owner: u32, tag: u32) -> Option<&ItemState> {
        self.slots
            .iter()
            .find(|s| s.owner == owner && s.tag == tag)
            .map(|s| &s.state)
    }

    /// The state of `owner`'s item `tag`, made (empty) if absent; a slot of an
    /// older definition of the same item index is reset.
    pub fn state_mut(&mut self, owner: u32, tag: u32) -> &mut ItemState {
        let index = tag & ((1 << INDEX_BITS) - 1);
        let pos = self
            .slots
            .iter()
            .position(|s| s.owner == owner && s.tag & ((1 << INDEX_BITS) - 1) == index);
        let pos = match pos {
            Some(p) => {
                if self.slots[p].tag != tag {
                    self.slots[p] = Slot {
                        owner,
                        tag,
                        state: ItemState::Fresh,
                    };
                }
                p
            }
            None => {
                let mut v = std::mem::take(&mut self.slots).into_vec();
                v.reserve_exact(1);
                v.push(Slot {
                    owner,
                    tag,
                    state: ItemState::Fresh,
                });
                self.slots = v.into_boxed_slice();
                self.slots.len() - 1
            }
        };
        &mut self.slots[pos].state
    }

    /// Raises `idle_at` to cover `item`'s state in slot (`owner`, `tag`).
    pub fn touch(&mut self, owner: u32, tag: u32, item: &Item) {
        if let Some(st) = self.state(owner, tag) {
            self.idle_at = self.idle_at.max(item.idle_at(st));
        }
    }

    /// Takes out the pending entries of reservation `res` (of candidate `cand`,
    /// or of all candidates when `None`).
    pub fn take_pending(&mut self, res: u64, cand: Option<u32>) -> SmallVec<[PendingEntry; 4]> {
        let mut out = SmallVec::new();
        let Some(pending) = self.pending.as_mut() else {
            return out;
        };
        pending.retain(|p| {
            let mine = p.res == res && cand.is_none_or(|c| c == p.cand);
            if mine {
                out.push(p.clone());
            }
            !mine
        });
        if pending.is_empty() {
            self.pending = None;
        }
        out
    }

    /// Adds a pending debit.
    pub fn add_pending(&mut self, entry: PendingEntry) {
        self.pending
            .get_or_insert_with(Default::default)
            .push(entry);
    }

    /// Makes room for `n` more pending debits at once (a screen reserving
    /// many candidates), instead of growing one push at a time. Call
    /// [`SubjectRecord::drop_empty_pending`] after: an empty list left in
    /// place would pin the record as if something were pending.
    pub fn reserve_pending(&mut self, n: usize) {
        self.pending.get_or_insert_with(Default::default).reserve(n);
    }

    pub fn drop_empty_pending(&mut self) {
        if self.pending.as_ref().is_some_and(|p| p.is_empty()) {
            self.pending = None;
        }
    }

    /// Every pending debit.
    pub fn pending(&self) -> impl Iterator<Item = &PendingEntry> {
        self.pending.iter().flat_map(|p| p.iter())
    }

    /// Pending units on slot (`owner`, `tag`).
    pub fn pending_on(&self, owner: u32, tag: u32) -> u64 {
        self.pending()
            .filter(|p| p.owner == owner && p.tag == tag)
            .map(|p| p.n)
            .sum()
    }

    /// The value to store: committed state only (every pending debit released
    /// as of `now`, as a crash would), framed with the record's idle instant so
    /// compaction drops it once it is dead. `def(owner, tag)` gives the item a
    /// pending entry's slot belongs to; without it the debit stays counted (the
    /// conservative side).
    pub fn to_stored<'a>(&self, now: Nanos, def: impl Fn(u32, u32) -> Option<&'a Item>) -> Vec<u8> {
        // Only a record with pending debits needs a copy to release them
        // from; the others (most, and all of an event's) encode in place.
        let mut slots = std::borrow::Cow::Borrowed(&self.slots[..]);
        for p in self.pending() {
            let Some(item) = def(p.owner, p.tag) else {
                continue;
            };
            if let Some(s) = slots
                .to_mut()
                .iter_mut()
                .find(|s| s.owner == p.owner && s.tag == p.tag)
            {
                item.release(&mut s.state, &p.item, p.n, now);
            }
        }
        let mut idle = 0;
        let stored: Vec<StoredSlot> = slots
            .iter()
            .filter_map(|s| {
                if let Some(item) = def(s.owner, s.tag) {
                    let at = item.idle_at(&s.state);
                    if at <= now {
                        return None;
                    }
                    idle = idle.max(at);
                } else {
                    idle = idle.max(self.idle_at);
                }
                let state = StoredState::from(&s.state);
                (state != StoredState::Fresh).then_some(StoredSlot {
                    owner: s.owner,
                    tag: s.tag,
                    state,
                })
            })
            .collect();
        codec::frame(idle, &codec::encode(&stored))
    }

    /// A record read back from the store.
    pub fn from_stored(value: &[u8]) -> Result<Self, String> {
        let (idle_at, payload) = codec::unframe(value)?;
        let slots: Vec<StoredSlot> = codec::decode(payload)?;
        Ok(SubjectRecord {
            slots: slots
                .into_iter()
                .map(|s| Slot {
                    owner: s.owner,
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

/// Heap bytes owned by one item state.
fn state_heap_bytes(s: &ItemState) -> usize {
    use crate::limits::window::{Debit, LogState};
    match s {
        ItemState::Log(l) => {
            std::mem::size_of::<LogState>() + l.debits.capacity() * std::mem::size_of::<Debit>()
        }
        ItemState::Budget(_) => std::mem::size_of::<crate::limits::budget::BudgetState>(),
        ItemState::Concurrency(c) => c.deadlines.capacity() * std::mem::size_of::<Nanos>(),
        _ => 0,
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

    /// Drops empty slots ([`ItemState::is_empty`]): a user screened against
    /// 50 campaigns and shown one keeps 49 counters at 0 after the release,
    /// 40 bytes each plus a rolling log's box, for as long as the user stays
    /// active. Dropping them on each release instead made screen + commit
    /// 5.6× slower (the slots are re-made by the next screen); once per sweep
    /// it costs little. Records with few slots, or with open reservations
    /// (whose debits name their slots), are left alone: only inline fields
    /// are read for them.
    fn prune(&mut self, _: &u64) -> usize {
        if self.slots.len() < PRUNE_MIN_SLOTS || self.pending.is_some() {
            return 0;
        }
        if !self.slots.iter().any(|s| s.state.is_empty()) {
            return 0;
        }
        let before = self.heap_bytes();
        let kept: Vec<Slot> = std::mem::take(&mut self.slots)
            .into_vec()
            .into_iter()
            .filter(|s| !s.state.is_empty())
            .collect();
        self.slots = kept.into_boxed_slice();
        before - self.heap_bytes()
    }

    fn heap_bytes(&self) -> usize {
        std::mem::size_of_val::<[Slot]>(&self.slots)
            + self.pending.as_ref().map_or(0, |p| {
                std::mem::size_of::<Vec<PendingEntry>>()
                    + p.capacity() * std::mem::size_of::<PendingEntry>()
            })
            + self
                .slots
                .iter()
                .map(|s| state_heap_bytes(&s.state))
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
            slots: states
                .into_iter()
                .enumerate()
                .map(|(i, state)| Slot {
                    owner: i as u32,
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
        assert_eq!(r.slots.len(), 1);
        assert_eq!((r.slots[0].owner, &r.slots[0].state), (1, &counter(2)));
        assert_eq!(r.prune(&0), 0, "nothing left to drop");
    }

    #[test]
    fn prune_leaves_small_records_and_open_reservations_alone() {
        let mut small = record(vec![counter(0), counter(0), counter(1)]);
        assert_eq!(small.prune(&0), 0);
        assert_eq!(small.slots.len(), 3);
        let mut held = record(vec![counter(0); 5]);
        held.add_pending(PendingEntry {
            res: 1,
            cand: 0,
            owner: 0,
            tag: 0,
            item: PendingItem::Counter { window_start: 0 },
            n: 1,
        });
        assert_eq!(held.prune(&0), 0);
        assert_eq!(held.slots.len(), 5);
    }

    #[test]
    fn sizes_are_as_documented() {
        assert_eq!(std::mem::size_of::<Slot>(), 40);
        assert_eq!(std::mem::size_of::<SubjectRecord>(), 40);
        assert_eq!(std::mem::size_of::<([u64; 2], SubjectRecord)>(), 56);
    }
}
