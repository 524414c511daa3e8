//! A store in memory: for tests, replay and `freqcap serve --memory`. Every batch
//! is applied at submit, so it is "durable" as soon as it is submitted (for as
//! long as the process lives). Event ids (the dedupe space) are dropped once
//! past their horizon, as RocksDB's compaction filter drops them, so they
//! take memory for one horizon's ids; state is dropped only by `compact`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use super::{Batch, KeyValues, Op, Receipt, Space, Store, StoreError, StoreStats};

/// Every value of one space, by key. A hash map, not an ordered one: every
/// decision that debits writes its record here behind the hot tier, and a
/// `BTreeMap` of a million keys spent ~20 % of a core comparing keys on
/// insert (RESP `CL.THROTTLE` over 1 000 000 keys, perf); only `scan`, at
/// start, wants order, and sorts.
type Entries = hashbrown::HashMap<Vec<u8>, Vec<u8>, foldhash::fast::RandomState>;

/// One map per space, indexed by [`slot`].
type Spaces = [Entries; Space::ALL.len()];

fn slot(space: Space) -> usize {
    space as usize
}

/// See the module documentation.
pub struct MemoryStore {
    /// One ordered map per space. A std mutex: held for a map operation, never
    /// across a wait.
    spaces: Mutex<Spaces>,
    seq: AtomicU64,
    batches: AtomicU64,
    now: AtomicU64,
    /// Dedupe keys in the order written, with their expiry. The horizon is
    /// fixed, so this is expiry order (up to clock steps), and expired ids
    /// leave from the front.
    dedupe_order: Mutex<VecDeque<(u64, Vec<u8>)>>,
    /// The front's expiry (`u64::MAX` when empty), read without a lock.
    next_expiry: AtomicU64,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore {
            spaces: Mutex::default(),
            seq: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            now: AtomicU64::new(0),
            dedupe_order: Mutex::default(),
            next_expiry: AtomicU64::new(u64::MAX),
        }
    }
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }
}

impl Store for MemoryStore {
    fn get(&self, space: Space, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let m = self.spaces.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(m[slot(space)].get(key).cloned())
    }

    fn scan(&self, space: Space) -> Result<KeyValues, StoreError> {
        let m = self.spaces.lock().unwrap_or_else(PoisonError::into_inner);
        let mut all: KeyValues = m[slot(space)]
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        all.sort_unstable();
        Ok(all)
    }

    fn submit(&self, batch: Batch, _acknowledge: bool) -> Receipt {
        let mut m = self.spaces.lock().unwrap_or_else(PoisonError::into_inner);
        for op in batch {
            match op {
                Op::Put(s, k, v) => {
                    if s == Space::Dedupe
                        && let Some(exp) = super::codec::expiry_of(&v)
                    {
                        let mut order = self
                            .dedupe_order
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner);
                        if order.is_empty() {
                            self.next_expiry.store(exp, Ordering::Relaxed);
                        }
                        order.push_back((exp, k.clone()));
                    }
                    m[slot(s)].insert(k, v);
                }
                Op::Delete(s, k) => {
                    m[slot(s)].remove(&k);
                }
            }
        }
        self.batches.fetch_add(1, Ordering::Relaxed);
        Receipt::done(self.seq.fetch_add(1, Ordering::Relaxed) + 1)
    }

    fn written_seq(&self) -> u64 {
        self.seq.load(Ordering::Relaxed)
    }

    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn set_now(&self, now: u64) {
        self.now.fetch_max(now, Ordering::Relaxed);
        if self.next_expiry.load(Ordering::Relaxed) > now {
            return;
        }
        let mut m = self.spaces.lock().unwrap_or_else(PoisonError::into_inner);
        let mut order = self
            .dedupe_order
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        while let Some((exp, _)) = order.front() {
            if *exp > now {
                break;
            }
            if let Some((_, k)) = order.pop_front() {
                let dedupe = &mut m[slot(Space::Dedupe)];
                // Written again since (a later horizon): keep it.
                if dedupe
                    .get(&k)
                    .and_then(|v| super::codec::expiry_of(v))
                    .is_some_and(|e| e <= now)
                {
                    dedupe.remove(&k);
                }
            }
        }
        let next = order.front().map_or(u64::MAX, |f| f.0);
        self.next_expiry.store(next, Ordering::Relaxed);
    }

    fn compact(&self) -> Result<(), StoreError> {
        let now = self.now.load(Ordering::Relaxed);
        let mut m = self.spaces.lock().unwrap_or_else(PoisonError::into_inner);
        for s in [Space::State, Space::Dedupe] {
            m[slot(s)].retain(|_, v| super::codec::expiry_of(v).is_none_or(|e| e > now));
        }
        Ok(())
    }

    fn stats(&self) -> StoreStats {
        let b = self.batches.load(Ordering::Relaxed);
        StoreStats {
            queue_depth: 0,
            groups: b,
            batches: b,
            disk_bytes: 0,
            memtable_bytes: 0,
            pending_compaction_bytes: 0,
            estimated_keys: 0,
        }
    }

    /// Everything is in memory: an engine reads this store from an async
    /// executor as readily as its own hot tier.
    fn get_cached(&self, space: Space, key: &[u8]) -> Option<Result<Option<Vec<u8>>, StoreError>> {
        Some(self.get(space, key))
    }

    fn checkpoint(&self, _dir: &std::path::Path) -> Result<(), StoreError> {
        Err(StoreError::Unsupported(
            "the service runs in memory (--memory): there is no data directory to checkpoint",
        ))
    }
}
