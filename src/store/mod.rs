//! Persistence behind a small trait (docs/semantics.md §10.2): an in-memory
//! store for tests, replay and `--memory`, and RocksDB for the service.
//!
//! The engine never waits on disk while it decides. It hands the store batches
//! of puts and deletes in the order it made them ([`Store::submit`], called while
//! it still holds the records the batch snapshots, so two snapshots of one record
//! reach the store in the order they were taken) and, for commits and events,
//! waits on the returned [`Receipt`] after letting go of its locks. Only one
//! place in the engine submits (`engine::persist`), so a new kind of store
//! needs no change to decision code.

pub mod codec;
pub mod lease_args;
pub mod memory;
pub mod rocks;
pub mod shared;
mod shared_memory;

use std::path::PathBuf;

pub use lease_args::{
    LeaseCap, LeaseGrant, LeaseRequest, LineGrant, LineHeld, LineRequest, PlanRequest, Segments,
    SlotsGrant, SlotsHeld, SlotsRequest, TotalRule, reports_later_arg,
};
pub use memory::MemoryStore;
pub use rocks::{RocksOptions, RocksStore};
pub use shared::{
    Cas, Catalog, DefsWrite, HeatReport, HeatTables, Hot, LeaseCalls, Membership, MinuteCounts,
    Owned, OwnedRecords, Records, Shared, Travel, TravelField, TravelSync, TravelView,
};
pub use shared_memory::SharedMemory;

/// The key spaces (RocksDB column families).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Space {
    /// Limit state per subject (user, campaign, policy key).
    State,
    /// Policy and campaign definitions.
    Definitions,
    /// Event ids seen within the dedupe horizon.
    Dedupe,
    /// Format version, the key-hashing secret.
    Meta,
}

impl Space {
    pub const ALL: [Space; 4] = [Space::State, Space::Definitions, Space::Dedupe, Space::Meta];

    /// The column family's name.
    pub fn name(self) -> &'static str {
        match self {
            Space::State => "state",
            Space::Definitions => "definitions",
            Space::Dedupe => "dedupe",
            Space::Meta => "meta",
        }
    }
}

/// One change in a [`Batch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Put(Space, Vec<u8>, Vec<u8>),
    Delete(Space, Vec<u8>),
}

/// (key, value) pairs read from a space.
pub type KeyValues = Vec<(Vec<u8>, Vec<u8>)>;

/// Changes written together, atomically.
pub type Batch = Vec<Op>;

/// How far a write must get before it is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// The group is fsynced before it is acknowledged: survives power loss.
    Fsync,
    /// The group is in the write-ahead log (the OS page cache) before it is
    /// acknowledged: survives a process crash (`kill -9`), not a power loss.
    #[default]
    Wal,
    /// Written without a log: acknowledged once in memory, lost on a crash
    /// unless flushed first (clean shutdown flushes).
    Async,
    /// A redis-cluster store only: acknowledged once the primary applied it
    /// and a replica has it (`WAIT 1`), so a primary's failover keeps it
    /// (docs/cluster.md).
    Replicated,
}

impl std::str::FromStr for Durability {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fsync" => Ok(Durability::Fsync),
            "wal" => Ok(Durability::Wal),
            "async" => Ok(Durability::Async),
            "replicated" => Ok(Durability::Replicated),
            _ => Err(format!(
                "durability must be fsync, wal, async or replicated, got {s:?}"
            )),
        }
    }
}

/// Why the store failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error(
        "data directory {dir} is in use by another process (RocksDB holds a lock on it); \
         stop that process or pick another --data-dir"
    )]
    Locked { dir: PathBuf },
    #[error(
        "data directory {dir} has format version {found}; this build reads versions up to \
         {supported}: run a newer freqcap"
    )]
    UnknownFormat {
        dir: PathBuf,
        found: u8,
        supported: u8,
    },
    #[error("stored value under {key} is unreadable: {message}")]
    Corrupt { key: String, message: String },
    #[error("the store's writer has stopped")]
    Closed,
    /// A failure described in words only: a data directory that cannot be
    /// opened (not because another process holds it: that is
    /// [`StoreError::Locked`]), a missing column family.
    #[error("storage error: {0}")]
    Io(String),
    /// RocksDB failed.
    #[error("storage error: {source}")]
    Rocks {
        #[source]
        source: rocksdb::Error,
    },
    /// The operating system refused (a directory, a thread).
    #[error("storage error: {context}: {source}")]
    Os {
        context: String,
        #[source]
        source: OsError,
    },
    /// A shared store's server for this key cannot be reached now (down,
    /// failing over, or past the call's deadline): nothing may be assumed
    /// applied or not (docs/cluster.md).
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store cannot do this at all (a checkpoint of memory, say): the
    /// request is wrong for this deployment, not the store broken.
    #[error("{0}")]
    Unsupported(&'static str),
}

/// A [`std::io::Error`] that can be cloned (a failed write's error goes to
/// every waiter of its group) and compared (by kind and text).
#[derive(Debug, Clone)]
pub struct OsError(pub std::sync::Arc<std::io::Error>);

impl From<std::io::Error> for OsError {
    fn from(e: std::io::Error) -> Self {
        OsError(std::sync::Arc::new(e))
    }
}

impl std::fmt::Display for OsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for OsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

impl PartialEq for OsError {
    fn eq(&self, other: &Self) -> bool {
        self.0.kind() == other.0.kind() && self.0.to_string() == other.0.to_string()
    }
}

impl Eq for OsError {}

/// Waits for a submitted batch to be durable (per the store's [`Durability`]).
#[derive(Debug)]
pub struct Receipt {
    /// The batch's place in the write order.
    pub seq: u64,
    wait: Wait,
}

#[derive(Debug)]
enum Wait {
    /// Durable at submit.
    Done,
    /// Failed at submit.
    Failed(StoreError),
    /// Durable once the writer's watermark reaches `seq`.
    Watermark(std::sync::Arc<Watermark>),
}

/// The highest sequence the writer has made durable, with a condition variable
/// the writer broadcasts once per group: one wake-up call for every waiter of
/// the group instead of one message per batch.
#[derive(Debug, Default)]
pub struct Watermark {
    state: std::sync::Mutex<WatermarkState>,
    advanced: std::sync::Condvar,
    /// The same broadcast for async waiters ([`Receipt::wait_async`]), so a
    /// server awaits its commits' groups without parking a thread per commit.
    advanced_async: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct WatermarkState {
    written: u64,
    /// Groups whose write failed: (first seq, last seq, error). Rare, so a
    /// list; kept short by dropping the oldest.
    failures: std::collections::VecDeque<(u64, u64, StoreError)>,
    closed: bool,
}

impl Watermark {
    fn lock(&self) -> std::sync::MutexGuard<'_, WatermarkState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Marks sequences up to `last` written (or failed, from `first`).
    pub fn advance(&self, first: u64, last: u64, result: Result<(), StoreError>) {
        let mut s = self.lock();
        s.written = s.written.max(last);
        if let Err(e) = result {
            if s.failures.len() >= 1024 {
                s.failures.pop_front();
            }
            s.failures.push_back((first, last, e));
        }
        drop(s);
        self.advanced.notify_all();
        self.advanced_async.notify_waiters();
    }

    /// No more writes will happen: wakes every waiter.
    pub fn close(&self) {
        self.lock().closed = true;
        self.advanced.notify_all();
        self.advanced_async.notify_waiters();
    }

    fn wait(&self, seq: u64) -> Result<(), StoreError> {
        let mut s = self.lock();
        while s.written < seq && !s.closed {
            s = self
                .advanced
                .wait(s)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        s.result(seq)
    }

    async fn wait_async(&self, seq: u64) -> Result<(), StoreError> {
        loop {
            // Registered before the state is read, so an advance between the
            // read and the await is not missed.
            let advanced = self.advanced_async.notified();
            let mut advanced = std::pin::pin!(advanced);
            advanced.as_mut().enable();
            {
                let s = self.lock();
                if s.written >= seq || s.closed {
                    return s.result(seq);
                }
            }
            advanced.await;
        }
    }
}

impl WatermarkState {
    /// What a waiter for `seq` learns once the writer is past it (or gone).
    fn result(&self, seq: u64) -> Result<(), StoreError> {
        if self.written < seq {
            return Err(StoreError::Closed);
        }
        match self
            .failures
            .iter()
            .find(|(a, b, _)| (*a..=*b).contains(&seq))
        {
            Some((_, _, e)) => Err(e.clone()),
            None => Ok(()),
        }
    }
}

impl Receipt {
    /// A receipt for a batch that is durable already.
    pub fn done(seq: u64) -> Self {
        Receipt {
            seq,
            wait: Wait::Done,
        }
    }

    /// A receipt for a batch that could not be queued.
    pub fn failed(seq: u64, e: StoreError) -> Self {
        Receipt {
            seq,
            wait: Wait::Failed(e),
        }
    }

    /// A receipt durable when `mark` reaches `seq`.
    pub fn watermark(seq: u64, mark: std::sync::Arc<Watermark>) -> Self {
        Receipt {
            seq,
            wait: Wait::Watermark(mark),
        }
    }

    /// Blocks until the batch is durable. Call it without holding record locks.
    pub fn wait(self) -> Result<(), StoreError> {
        match self.wait {
            Wait::Done => Ok(()),
            Wait::Failed(e) => Err(e),
            Wait::Watermark(m) => m.wait(self.seq),
        }
    }

    /// [`Receipt::wait`] for async callers: no thread is parked meanwhile.
    /// Works on any executor (it awaits a `tokio::sync::Notify`).
    /// By reference, so a caller can keep the receipt while it awaits (and
    /// still wait on it, should its future be dropped mid-way).
    pub async fn wait_async(&self) -> Result<(), StoreError> {
        match &self.wait {
            Wait::Done => Ok(()),
            Wait::Failed(e) => Err(e.clone()),
            Wait::Watermark(m) => m.wait_async(self.seq).await,
        }
    }
}

/// Figures for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Batches submitted and not yet written.
    pub queue_depth: u64,
    /// Groups written since start.
    pub groups: u64,
    /// Batches written since start (batches / groups = mean group size).
    pub batches: u64,
    /// Estimated live bytes of state on disk (RocksDB's estimate; 0 in memory).
    pub disk_bytes: u64,
    /// Bytes in RocksDB's memtables, all column families (0 in memory).
    pub memtable_bytes: u64,
    /// Bytes RocksDB estimates compaction still has to rewrite; a growing
    /// figure means writes outpace compaction (0 in memory).
    pub pending_compaction_bytes: u64,
    /// RocksDB's estimate of keys in the state column family (0 in memory).
    pub estimated_keys: u64,
}

/// What the engine needs from persistence, and what a store promises.
///
/// - **Values** are opaque bytes framed by [`codec`] (format version and
///   expiry up front); keys are grouped in [`Space`]s. The engine writes
///   whole records: a batch never patches part of a value.
/// - **Batches** ([`Store::submit`]) are applied atomically (all of a batch
///   or none of it, also across a crash) and in the order they were
///   submitted: each gets the next sequence number ([`Receipt::seq`]), and
///   a batch is never visible, nor durable, before those submitted before
///   it. The engine submits while it holds the locks of the records in the
///   batch, so the submit order of two batches holding one record is the
///   order their snapshots were taken.
/// - **Durability on acknowledgement**: with `acknowledge`, the receipt's
///   wait returns `Ok` only once the batch (and every batch before it) is
///   as durable as the store's [`Durability`] says, and never `Ok` for a
///   batch that was not written. Without it, the batch is written with a
///   later group and may be lost in a crash. [`Store::written_seq`] is the
///   highest sequence written so far (all before it too): a record whose
///   last batch is above it stays in the engine's memory.
/// - **Reads**: [`Store::get`] returns the value as of at least every
///   written batch (up to [`Store::written_seq`]); it may or may not
///   include batches still queued. The engine reads a key only when it
///   holds no newer copy of it in memory, so it never needs those. [`Store::get_cached`] is the same read if it can be
///   answered without waiting on disk, and `None` otherwise (never a
///   different answer).
///
/// A store of versioned records with compare-and-set (a replicated or
/// clustered key-value store) fits this as it is: it applies each batch as
/// one transaction, versions each key by the batch's sequence, and sets a
/// key only if its version is older, so a batch that arrives late never
/// overwrites a newer one; [`Store::written_seq`] is then the highest
/// sequence below which every batch is applied.
pub trait Store: Send + Sync + 'static {
    /// The value under `key`, as of at least every written batch (see the
    /// trait's documentation).
    fn get(&self, space: Space, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;

    /// Every (key, value) of a space (definitions and dedupe ids at start).
    fn scan(&self, space: Space) -> Result<KeyValues, StoreError>;

    /// Queues `batch` behind every batch submitted before it. With
    /// `acknowledge`, the receipt waits until the batch is durable; without
    /// (write-behind), it is done at once and the batch is written with the
    /// next group.
    fn submit(&self, batch: Batch, acknowledge: bool) -> Receipt;

    /// The highest sequence number whose batch (and all before it) is written.
    fn written_seq(&self) -> u64;

    /// Writes everything queued, durably, and returns when done.
    fn flush(&self) -> Result<(), StoreError>;

    /// Tells the store the engine's clock, so expired state can be dropped on
    /// disk by the engine's own notion of time (a replay's clock, say).
    fn set_now(&self, now: u64);

    fn stats(&self) -> StoreStats;

    /// Compacts now, dropping state and dedupe ids that expired by the
    /// engine's clock (compaction does this on its own as data accumulates).
    fn compact(&self) -> Result<(), StoreError>;

    /// Writes a consistent copy of the store to `dir` (backups).
    fn checkpoint(&self, dir: &std::path::Path) -> Result<(), StoreError>;

    /// [`Store::get`] if it can be answered from memory, without waiting on
    /// disk; `None` if it would have to. A key that was never written is
    /// usually answered here too (by a bloom filter), which is what lets an
    /// async server decide a new key on its executor. By default nothing is:
    /// a store that cannot tell is read on a blocking thread.
    fn get_cached(
        &self,
        _space: Space,
        _key: &[u8],
    ) -> Option<Result<Option<Vec<u8>>, StoreError>> {
        None
    }

    /// The shared side of a store several nodes use at once (docs/cluster.md):
    /// user and policy-key records are then read and written through it, by
    /// compare-and-set, and never through [`Store::submit`]. `None` (the
    /// default) for a store one engine owns.
    fn shared(&self) -> Option<&dyn Shared> {
        None
    }

    /// A Redis store's call figures, for metrics.
    fn redis_stats(&self) -> Option<&shared::CallStats> {
        None
    }
}
