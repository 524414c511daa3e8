//! The hot tier: user and policy-key records in memory, loaded from the
//! store on a miss, and how a read may go ([`Reads`]): an async server
//! decides on its executor what it can decide from memory, and moves only
//! the rest to a blocking thread.

use std::sync::atomic::Ordering;

use crate::clock::{Clock, Nanos};
use crate::store::{Space, StoreError};

use super::record::SubjectRecord;
use super::{Engine, EngineError, corrupt};

/// How far a record lookup may go on a hot-tier miss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reads {
    /// Only what the store has in memory ([`crate::store::Store::get_cached`]):
    /// where it would have to wait on disk, the call stops with
    /// [`Halt::NotInMemory`], having changed nothing.
    MemoryOnly,
    /// The store, waiting on disk if it must.
    MayWait,
}

/// Why an operation stopped before its end. Internal: a `*_in_memory`
/// call turns [`Halt::NotInMemory`] into `None`, and a call that may wait
/// never meets it, so callers see only the [`EngineError`].
#[derive(Debug)]
pub(crate) enum Halt {
    Failed(EngineError),
    /// Under [`Reads::MemoryOnly`]: a record or event id is not in memory.
    NotInMemory,
}

impl From<EngineError> for Halt {
    fn from(e: EngineError) -> Self {
        Halt::Failed(e)
    }
}

impl From<StoreError> for Halt {
    fn from(e: StoreError) -> Self {
        Halt::Failed(e.into())
    }
}

impl Halt {
    /// The error of a call made with [`Reads::MayWait`], which never meets
    /// [`Halt::NotInMemory`] (were it to, by a bug, the caller gets a store
    /// error, not a wrong answer).
    pub(crate) fn into_error(self) -> EngineError {
        match self {
            Halt::Failed(e) => e,
            Halt::NotInMemory => {
                StoreError::Io("a record was not in memory in a call that may wait".into()).into()
            }
        }
    }
}

/// The result of a [`Reads::MayWait`] call.
pub(crate) fn waited<T>(r: Result<T, Halt>) -> Result<T, EngineError> {
    r.map_err(Halt::into_error)
}

/// The result of a [`Reads::MemoryOnly`] call: `None` if it needed the disk.
pub(crate) fn if_in_memory<T>(r: Result<T, Halt>) -> Option<Result<T, EngineError>> {
    match r {
        Ok(x) => Some(Ok(x)),
        Err(Halt::Failed(e)) => Some(Err(e)),
        Err(Halt::NotInMemory) => None,
    }
}

/// A subject's record, by what it belongs to. Users and policy keys are
/// 128-bit keyed hashes of their ids ([`Engine::hash`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RecordKey {
    User(u128),
    /// A key of a named policy or of inline limits.
    PolicyKey(u128),
    Campaign(u32),
}

impl RecordKey {
    /// The record's key in [`Space::State`].
    pub(crate) fn disk_key(self) -> Vec<u8> {
        let mut k = Vec::with_capacity(17);
        match self {
            RecordKey::User(h) => {
                k.push(b'u');
                k.extend_from_slice(&h.to_be_bytes());
            }
            RecordKey::PolicyKey(h) => {
                k.push(b'k');
                k.extend_from_slice(&h.to_be_bytes());
            }
            RecordKey::Campaign(id) => {
                k.push(b'c');
                k.extend_from_slice(&id.to_be_bytes());
            }
        }
        k
    }

    /// The key in the hot tier (users and policy keys; campaigns are not
    /// there): the 128-bit hash split in two words (a `u128` would make every
    /// entry 16-byte aligned: 64 bytes, not 56).
    pub(crate) fn hot_key(self) -> [u64; 2] {
        let h = match self {
            RecordKey::User(h) | RecordKey::PolicyKey(h) => h,
            RecordKey::Campaign(id) => u128::from(id),
        };
        [h as u64, (h >> 64) as u64]
    }
}

impl<C: Clock> Engine<C> {
    /// Runs `f` on the hot-tier record `key` (a user or policy key) under its
    /// shard's lock, loading it from the store on a miss as `reads` allows.
    /// A record that cannot be loaded is not decided on: `f` is not called.
    ///
    /// `f` gets the record and the time to decide at: `now`, or on a shared
    /// store the record's last decision if that is later (see
    /// [`super::shared`], where `f` may run again after a conflict).
    pub(crate) fn with_record<R>(
        &self,
        key: RecordKey,
        now: Nanos,
        reads: Reads,
        mut f: impl FnMut(&mut SubjectRecord, Nanos) -> R,
    ) -> Result<R, Halt> {
        if let Some(shared) = self.shared() {
            // Every shared read and write is a network call: never on the
            // executor (the API moves such calls to a blocking thread).
            // Owner mode decides a screen on a user it owns and holds in
            // memory with none (`super::shared`).
            let memory_only = reads == Reads::MemoryOnly;
            if memory_only && !(self.in_owner_mode() && matches!(key, RecordKey::User(_))) {
                return Err(Halt::NotInMemory);
            }
            return self.with_shared_record(shared, key, now, memory_only, f);
        }
        let written = self.store.written_seq();
        let load = || self.load_record(key, reads);
        self.hot
            .try_with(&key.hot_key(), now, &written, load, |rec| {
                let r = f(rec, now);
                // Until its last batch is written, the copy on disk is older: keep
                // the record at least until then (see `SubjectRecord::write_seq`).
                if rec.write_seq > written {
                    rec.idle_at = rec.idle_at.max(now + 1);
                }
                r
            })
    }

    /// A record read from the store (a fresh one if it has none).
    pub(crate) fn load_record(&self, key: RecordKey, reads: Reads) -> Result<SubjectRecord, Halt> {
        let disk = key.disk_key();
        let read = match reads {
            Reads::MemoryOnly => self
                .store
                .get_cached(Space::State, &disk)
                .ok_or(Halt::NotInMemory)?,
            Reads::MayWait => self.store.get(Space::State, &disk),
        };
        self.stats.hot_misses.fetch_add(1, Ordering::Relaxed);
        match read? {
            Some(v) => Ok(SubjectRecord::from_stored(&v).map_err(|m| corrupt(&disk, m))?),
            None => Ok(SubjectRecord::default()),
        }
    }

    /// A copy of record `key` for reading figures, from the hot tier if it is
    /// there (kept there only if it is), else from the store.
    pub(crate) fn record_figures(&self, key: RecordKey) -> Result<SubjectRecord, EngineError> {
        if let Some(shared) = self.shared() {
            if let Some(r) = self.owned_figures(key) {
                return Ok(r);
            }
            return self.shared_figures(shared, key);
        }
        if let Some(r) = self.hot.get(&key.hot_key(), SubjectRecord::figures_copy) {
            return Ok(r);
        }
        match self.store.get(Space::State, &key.disk_key())? {
            Some(v) => Ok(SubjectRecord::from_stored(&v).map_err(|m| corrupt(b"user", m))?),
            None => Ok(SubjectRecord::default()),
        }
    }
}
