//! Where an event id is remembered (docs/semantics.md §7.1, docs/cluster.md),
//! the one file that knows both ways: on one node in the store's dedupe
//! space, written in the batch of the event it counts (and claimed in
//! memory until that batch is written); on a shared store claimed in the
//! store for the horizon, fleet-wide, and remembered for a while in the
//! record it was counted in (a retry after a lost answer counts it once).

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, PoisonError};

use crate::clock::{Clock, Nanos};
use crate::engine::Engine;
use crate::engine::holds::RememberedId;
use crate::engine::hot::{Halt, Reads};
use crate::engine::record::SubjectRecord;
use crate::engine::request::Event;
use crate::store::{Op, Space, codec};

/// Event ids claimed whose write may not be on disk yet. The ids seen
/// within the horizon live in the store's dedupe space, each written in the
/// same batch as the event it counts, and are looked up there when an id
/// comes (RocksDB's bloom filters answer a new id from memory): nothing is
/// loaded at open, and memory holds only the ids between their claim and
/// their write, a writer queue's worth. (Kept in memory for the whole
/// horizon, ids cost 76 bytes each of RSS — 612 MB after 30 s of unique-id
/// batches — and a restart with 5 million of them spent 7.7 s loading them
/// before it listened.)
///
/// Sharded by the id's hash, so lookups of different ids rarely wait on
/// each other; a lookup reads the store under its shard's lock, so of two
/// batches claiming the same id, exactly one finds it free.
pub(crate) struct Dedupe {
    shards: Box<[Mutex<DedupeShard>]>,
}

/// Claimed ids not yet known written: by hash, the sequence of the batch
/// that writes it ([`UNSUBMITTED`] until submitted), and in that order.
#[derive(Default)]
struct DedupeShard {
    claimed: HashMap<u128, u64>,
    order: VecDeque<(u64, u128)>,
}

/// The batch sequence of an id claimed but not yet submitted.
const UNSUBMITTED: u64 = u64::MAX;

/// How long a shared record remembers an event id it counted, so that a
/// retry of a write whose answer was lost does not count it again (the
/// cluster-wide claim holds it for the whole horizon, but is given back
/// when the count fails).
const EVENT_RETRY_MEMORY: Nanos = 5 * 60 * 1_000_000_000;

/// An event id's key in a shared store.
fn event_key(h: u128) -> Vec<u8> {
    let mut k = Vec::with_capacity(17);
    k.push(b'e');
    k.extend_from_slice(&h.to_be_bytes());
    k
}

/// Shards of [`Dedupe`].
const DEDUPE_SHARDS: usize = 64;

impl Dedupe {
    pub(crate) fn new() -> Self {
        Dedupe {
            shards: (0..DEDUPE_SHARDS)
                .map(|_| Mutex::new(DedupeShard::default()))
                .collect(),
        }
    }

    fn shard(&self, h: u128) -> std::sync::MutexGuard<'_, DedupeShard> {
        self.shards[(h as usize) % DEDUPE_SHARDS]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl DedupeShard {
    /// Forgets claims whose batch is written: from now on the store has them.
    fn prune(&mut self, written: u64) {
        while let Some(&(seq, h)) = self.order.front() {
            if seq > written {
                break;
            }
            self.order.pop_front();
            if self.claimed.get(&h) == Some(&seq) {
                self.claimed.remove(&h);
            }
        }
    }
}

impl<C: Clock> Engine<C> {
    /// Claims event id `h` unless it was seen within the horizon (`false`:
    /// a duplicate): claimed by a batch not yet written, or in the store.
    /// Under [`Reads::MemoryOnly`], stops where the store would have to read
    /// the disk to tell.
    pub(crate) fn claim_event_id(
        &self,
        h: u128,
        event: &Event,
        now: Nanos,
        reads: Reads,
    ) -> Result<bool, Halt> {
        if let Some(shared) = self.shared() {
            // Cluster-wide: set if absent, expiring with the horizon; a
            // claim already there is a duplicate, whichever node made it
            // (the claim is the count: a user-less event is counted on this
            // node's leased campaign state, which no other node can see).
            // The value, what the event says, is there for whoever reads
            // Redis.
            if reads == Reads::MemoryOnly {
                return Err(Halt::NotInMemory);
            }
            let expiry = now.saturating_add(self.options.dedupe_horizon);
            let token = self
                .hash(
                    b'E',
                    0,
                    &format!(
                        "{}\u{0}{}\u{0}{}",
                        event.user.as_deref().unwrap_or(""),
                        event.campaign,
                        event.cost
                    ),
                )
                .to_be_bytes();
            return Ok(shared.claim(&event_key(h), expiry, &token)?);
        }
        let mut shard = self.dedupe.shard(h);
        // Pruned only once written, so what leaves here is in the store.
        shard.prune(self.store.written_seq());
        if shard.claimed.contains_key(&h) {
            return Ok(false);
        }
        let key = h.to_be_bytes();
        let stored = match reads {
            Reads::MemoryOnly => self
                .store
                .get_cached(Space::Dedupe, &key)
                .ok_or(Halt::NotInMemory)??,
            Reads::MayWait => self.store.get(Space::Dedupe, &key)?,
        };
        // Compaction drops expired ids when it passes them; until then they
        // are still read, and are past their horizon.
        if stored
            .and_then(|v| codec::expiry_of(&v))
            .is_some_and(|exp| exp > now)
        {
            return Ok(false);
        }
        shard.claimed.insert(h, UNSUBMITTED);
        Ok(true)
    }

    /// Notes the batch that writes claimed id `h`: once it is written, the
    /// store answers for the id.
    pub(crate) fn submitted_event_id(&self, h: u128, seq: u64) {
        let mut guard = self.dedupe.shard(h);
        let shard = &mut *guard;
        if let Some(s) = shard.claimed.get_mut(&h) {
            *s = seq;
            shard.order.push_back((seq, h));
        }
    }

    /// Gives back the claims of events that were not submitted.
    pub(crate) fn unclaim_event_ids(&self, ids: impl IntoIterator<Item = u128>) {
        if let Some(shared) = self.shared() {
            for h in ids {
                // Best effort: a claim left behind makes a retry of an event
                // that was not counted a duplicate (docs/cluster.md).
                let _ = shared.unclaim(&event_key(h));
            }
            return;
        }
        for h in ids {
            let mut shard = self.dedupe.shard(h);
            if shard.claimed.get(&h) == Some(&UNSUBMITTED) {
                shard.claimed.remove(&h);
            }
        }
    }

    /// The write that remembers event id `h` until `expiry` beside the
    /// records its event changes, in their batch: one node's dedupe space.
    /// `None` on a shared store, whose claim is the fleet's record of it.
    pub(crate) fn event_id_write(&self, h: u128, expiry: Nanos) -> Option<Op> {
        self.placement.is_local().then(|| {
            Op::Put(
                Space::Dedupe,
                h.to_be_bytes().to_vec(),
                codec::frame(expiry, &[]),
            )
        })
    }

    /// Has `rec` remember event id `res` for a while where records remember
    /// them (a shared store: a retry after a write whose answer was lost,
    /// applied or not, then counts it once); `false` if it did already
    /// (counted before). One node: `true` (its dedupe space answers).
    pub(crate) fn remember_event_in(&self, rec: &mut SubjectRecord, res: u64, now: Nanos) -> bool {
        self.placement.is_local() || remember_event(rec, res, now)
    }

    /// Whether event id `h` is remembered within its horizon beside the
    /// records it was counted in (one node's dedupe space); on a shared
    /// store `false`, the record itself says ([`Engine::remember_event_in`]).
    pub(crate) fn event_id_written(&self, h: u128, now: Nanos) -> Result<bool, Halt> {
        if !self.placement.is_local() {
            return Ok(false);
        }
        Ok(self
            .store
            .get(Space::Dedupe, &h.to_be_bytes())?
            .and_then(|v| codec::expiry_of(&v))
            .is_some_and(|exp| exp > now))
    }
}

/// With a shared store, has `rec` remember event `res` for a while (a
/// retry after a write whose answer was lost, applied or not, then counts
/// it once); `false` if it remembers it already (counted before).
fn remember_event(rec: &mut SubjectRecord, res: u64, now: Nanos) -> bool {
    if rec
        .shared_meta()
        .is_some_and(|m| m.remembered.iter().any(|s| s.res == res))
    {
        return false;
    }
    let until = now.saturating_add(EVENT_RETRY_MEMORY);
    rec.shared_meta_mut().remembered.push(RememberedId {
        res,
        deadline: until,
        committed: true,
        campaigns: Vec::new(),
        final_cost: None,
        charged: false,
    });
    rec.idle_at = rec.idle_at.max(until);
    true
}
