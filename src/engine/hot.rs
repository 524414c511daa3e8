//! The hot tier's words: a record's key ([`RecordKey`], in memory and on
//! disk), how far a read may go on a miss ([`Reads`]: an async server
//! decides on its executor what it can decide from memory, and moves only
//! the rest to a blocking thread), and how a decision stops short
//! ([`Halt`]). Where a record is then found and decided on is
//! `super::placement` ([`crate::engine::Engine::with_record`]).

use crate::store::StoreError;

use super::EngineError;

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
