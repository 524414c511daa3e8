//! A store several nodes share (docs/cluster.md): records versioned and
//! written by compare-and-set, so that nodes deciding on the same subject
//! never both win. [`crate::cluster::RedisStore`] is the real one;
//! [`SharedMemory`] is the same contract in one process, for tests of the
//! engine's shared path without a Redis.
//!
//! The engine holds, per record, the version of the shared copy it decided
//! on. A write names that version; when another node wrote since, the store
//! answers with the current copy ([`Cas::Conflict`]) and the engine decides
//! again on it. Nothing in a shared store knows what a record means.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use super::{Batch, KeyValues, MemoryStore, Receipt, Space, Store, StoreError, StoreStats};
use crate::clock::Nanos;

/// The answer to a compare-and-set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cas {
    /// Written; the record's new version.
    Written(u64),
    /// Another write came first: the current version and value (`None`: the
    /// record is absent, version 0).
    Conflict {
        version: u64,
        value: Option<Vec<u8>>,
    },
}

/// What the engine needs from a shared store beyond [`Store`].
///
/// Promises: a [`Shared::cas`] that answers `Written` was applied once and
/// is as durable as the store's durability mode says; one that fails with an
/// error may or may not have been applied (a timed-out call), so the engine
/// forgets its copy and reads the record again before deciding on it.
/// Versions only grow, also across a record's expiry and re-creation.
pub trait Shared: Send + Sync {
    /// The (version, value) of record `key`; `None` if absent.
    fn read(&self, key: &[u8]) -> Result<Option<(u64, Vec<u8>)>, StoreError>;

    /// Writes `value` under `key` if its version is still `expected` (0:
    /// absent), to expire at `expire_at` (unix ns; 0: never).
    fn cas(
        &self,
        key: &[u8],
        expected: u64,
        value: &[u8],
        expire_at: Nanos,
    ) -> Result<Cas, StoreError>;

    /// Sets `key` if absent, to expire at `expire_at` (an event id within its
    /// horizon): `true` if this call set it.
    fn claim(&self, key: &[u8], expire_at: Nanos) -> Result<bool, StoreError>;

    /// Removes a claim this node made and did not use.
    fn unclaim(&self, key: &[u8]) -> Result<(), StoreError>;

    /// A number that changes whenever a definition is written or deleted
    /// (nodes poll it to apply others' changes).
    fn definitions_version(&self) -> Result<u64, StoreError>;

    /// A definition id no node has used, above `above`.
    fn new_id(&self, above: u32) -> Result<u32, StoreError>;
}

/// Records by key: (version, value).
type Versioned = HashMap<Vec<u8>, (u64, Vec<u8>)>;

/// [`Shared`] in one process: several engines on one `Arc<SharedMemory>`
/// behave as nodes on one cluster.
#[derive(Default)]
pub struct SharedMemory {
    /// Definitions, meta and dedupe ids, as [`MemoryStore`] keeps them.
    plain: MemoryStore,
    records: Mutex<Versioned>,
    claims: Mutex<HashMap<Vec<u8>, Nanos>>,
    definitions: AtomicU64,
    ids: AtomicU64,
    /// CAS calls and conflicts, for tests.
    pub cas_calls: AtomicU64,
    pub cas_conflicts: AtomicU64,
}

impl SharedMemory {
    pub fn new() -> Self {
        Self::default()
    }
}

impl Store for SharedMemory {
    fn get(&self, space: Space, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.plain.get(space, key)
    }

    fn scan(&self, space: Space) -> Result<KeyValues, StoreError> {
        self.plain.scan(space)
    }

    fn submit(&self, batch: Batch, acknowledge: bool) -> Receipt {
        if batch.iter().any(|op| op_space(op) == Space::Definitions) {
            self.definitions.fetch_add(1, Ordering::AcqRel);
        }
        self.plain.submit(batch, acknowledge)
    }

    fn written_seq(&self) -> u64 {
        // Records are written by CAS, never queued: none waits on a batch.
        u64::MAX
    }

    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn set_now(&self, now: u64) {
        self.plain.set_now(now);
    }

    fn stats(&self) -> StoreStats {
        StoreStats::default()
    }

    fn compact(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn checkpoint(&self, _: &std::path::Path) -> Result<(), StoreError> {
        Err(StoreError::Unsupported(
            "a shared store has no checkpoint: back up the Redis Cluster instead",
        ))
    }

    fn shared(&self) -> Option<&dyn Shared> {
        Some(self)
    }
}

fn op_space(op: &super::Op) -> Space {
    match op {
        super::Op::Put(s, ..) | super::Op::Delete(s, ..) => *s,
    }
}

impl Shared for SharedMemory {
    fn read(&self, key: &[u8]) -> Result<Option<(u64, Vec<u8>)>, StoreError> {
        let m = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(m.get(key).cloned())
    }

    fn cas(
        &self,
        key: &[u8],
        expected: u64,
        value: &[u8],
        _expire_at: Nanos,
    ) -> Result<Cas, StoreError> {
        self.cas_calls.fetch_add(1, Ordering::Relaxed);
        let mut m = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        let current = m.get(key).map_or(0, |(v, _)| *v);
        if current != expected {
            self.cas_conflicts.fetch_add(1, Ordering::Relaxed);
            return Ok(Cas::Conflict {
                version: current,
                value: m.get(key).map(|(_, b)| b.clone()),
            });
        }
        let version = current + 1;
        m.insert(key.to_vec(), (version, value.to_vec()));
        Ok(Cas::Written(version))
    }

    fn claim(&self, key: &[u8], expire_at: Nanos) -> Result<bool, StoreError> {
        let mut m = self.claims.lock().unwrap_or_else(PoisonError::into_inner);
        if m.contains_key(key) {
            return Ok(false);
        }
        m.insert(key.to_vec(), expire_at);
        Ok(true)
    }

    fn unclaim(&self, key: &[u8]) -> Result<(), StoreError> {
        let mut m = self.claims.lock().unwrap_or_else(PoisonError::into_inner);
        m.remove(key);
        Ok(())
    }

    fn definitions_version(&self) -> Result<u64, StoreError> {
        Ok(self.definitions.load(Ordering::Acquire))
    }

    fn new_id(&self, above: u32) -> Result<u32, StoreError> {
        let next = self.ids.fetch_add(1, Ordering::AcqRel) + 1;
        let id = next.max(u64::from(above) + 1);
        self.ids.fetch_max(id, Ordering::AcqRel);
        u32::try_from(id).map_err(|_| StoreError::Io("definition ids are used up".into()))
    }
}
