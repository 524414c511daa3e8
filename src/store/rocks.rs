//! RocksDB on local disk, written by one group-commit writer thread.
//!
//! Why one writer: RocksDB's own group commit merges concurrent writers too, but
//! each of them would block a request thread on the WAL; here request threads
//! only enqueue (a crossbeam channel send), and the writer drains everything
//! queued into one `WriteBatch`, so under load one WAL append (and one fsync with
//! `durability = "fsync"`) covers many commits. Batches are written in the
//! order they were submitted, which the engine relies on (see [`super`]).

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};
use rocksdb::compaction_filter::Decision;
use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamilyDescriptor, DB, IteratorMode, Options, ReadOptions,
    ReadTier, WriteBatch, WriteOptions,
};

use super::codec::{FORMAT_VERSION, expiry_of};
use super::{
    Batch, Durability, KeyValues, Op, Receipt, Space, Store, StoreError, StoreStats, Watermark,
};

/// Most batches merged into one group: bounds the time one group holds the
/// acknowledgements of the first batches in it.
const MAX_GROUP: usize = 4096;

/// Most batches queued for the writer; a submitter waits for room beyond
/// it, as RocksDB stalls writes that outrun compaction. Unbounded, a RESP
/// benchmark of 1 M random keys (3 M write-behind decisions at 256 k/s,
/// more than the writer's share of the core could write) queued 1 GB and
/// took the writer 6 s after the load ended; 16 384 batches of one record
/// each (a decision's) are about 5 MB.
const MAX_QUEUED: usize = 4 * MAX_GROUP;

/// Meta key of the format version byte.
const FORMAT_KEY: &[u8] = b"format";

/// Memtables each of the state and dedupe column families may have at once
/// (one filling, one being flushed): RocksDB's default, stated because the
/// memory formula (docs/engine.md, "Memory") counts on it.
pub const MAX_WRITE_BUFFERS: usize = 2;

/// Write buffer of the definitions and meta column families: they hold a few
/// kilobytes, and a memtable allocates its arena in blocks of an eighth of it.
const SMALL_WRITE_BUFFER: usize = 1 << 20;

/// RocksDB's own informational LOG files kept in the data directory, and the
/// size at which one is rolled: at most 5 x 8 MiB (the default keeps 1000).
const KEEP_INFO_LOGS: usize = 5;
const INFO_LOG_BYTES: usize = 8 << 20;

/// RocksDB's memory and disk beyond the engine's own budget: every figure
/// the memory formula of docs/engine.md needs. Config knobs of the same
/// names in `ServeConfig`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RocksOptions {
    /// One LRU cache shared by every column family, for data blocks and also
    /// for index and filter blocks (so those are inside the bound too; the
    /// first level's stay pinned while their file lives).
    pub block_cache_bytes: usize,
    /// Memtable size of the state and dedupe column families; each may have
    /// [`MAX_WRITE_BUFFERS`] at once.
    pub write_buffer_bytes: usize,
    /// Total size of the write-ahead log files: past it, RocksDB flushes the
    /// column families whose data keeps the oldest log alive, and deletes
    /// it. Also bounds what a restart replays.
    pub max_wal_bytes: u64,
    /// How long the writer holds a write-behind batch before writing it
    /// (0: at once). Within the window each key is written once, and a
    /// record that expires within it is not written at all; a crash loses
    /// the window's write-behind debits. Acknowledged writes and flushes are
    /// never held. At most [`MAX_WRITE_BEHIND_MS`].
    pub write_behind_ms: u64,
}

/// The longest write-behind window: a crash must not lose more than a
/// second of immediate debits.
pub const MAX_WRITE_BEHIND_MS: u64 = 1_000;

impl Default for RocksOptions {
    fn default() -> Self {
        RocksOptions {
            // 64 MiB: the filters and indexes of 2 000 000 state keys take
            // about 3 MiB (10 bits of bloom filter per key), and RocksDB's
            // default was a separate 32 MiB cache per column family.
            block_cache_bytes: 64 << 20,
            // 32 MiB: half RocksDB's default, so memtables take at most
            // 2 x 2 x 32 MiB = 128 MiB instead of 256 MiB.
            write_buffer_bytes: 32 << 20,
            // 64 MiB: one full memtable of each big column family. Without a
            // bound, the definitions and meta column families (written once at
            // start, so never flushed) kept every log alive: 116 MB of logs in
            // a 150 MB data dir after 2 000 000 keys.
            max_wal_bytes: 64 << 20,
            // At once: a crash loses at most the queue (docs/engine.md).
            write_behind_ms: 0,
        }
    }
}

/// Whether a failed open failed because another process (or this one) holds
/// the directory's lock. RocksDB says so as an IO error naming the LOCK
/// file: `IO error: While lock file: <dir>/LOCK: Resource temporarily
/// unavailable` from another process (fcntl answers EAGAIN or EACCES), `IO
/// error: lock hold by current process, ...: <dir>/LOCK: No locks available`
/// from this one. Nothing else counts: a path or a corruption message that
/// merely contains "lock" (`block checksum mismatch`) is another error.
fn held_lock(kind: rocksdb::ErrorKind, msg: &str) -> bool {
    if kind != rocksdb::ErrorKind::IOError {
        return false;
    }
    let Some(rest) = msg.strip_prefix("IO error: ") else {
        return false;
    };
    let (file, why) = if let Some(r) = rest.strip_prefix("While lock file: ") {
        match r.rsplit_once(": ") {
            Some((file, why)) => (
                file,
                matches!(
                    why,
                    "Resource temporarily unavailable" | "Permission denied"
                ),
            ),
            None => return false,
        }
    } else if rest.starts_with("lock hold by current process") {
        match rest.rsplit_once(": ") {
            Some((head, "No locks available")) => match head.rsplit_once(": ") {
                Some((_, file)) => (file, true),
                None => return false,
            },
            _ => return false,
        }
    } else {
        return false;
    };
    why && file.ends_with("/LOCK")
}

/// Work for the writer thread.
enum Job {
    Write {
        seq: u64,
        batch: Batch,
        /// Submitted write-behind (no one waits for it): see [`expired_put`].
        behind: bool,
    },
    /// Answered once everything queued before it is written.
    Flush(Sender<Result<(), StoreError>>),
}

/// Counters shared by the writer and readers of [`Store::stats`].
#[derive(Default)]
struct WriterState {
    /// What acknowledged submitters wait on.
    mark: Arc<Watermark>,
    /// Highest sequence written.
    written: AtomicU64,
    submitted: AtomicU64,
    groups: AtomicU64,
    batches: AtomicU64,
    /// The engine's clock, for the compaction filter.
    now: AtomicU64,
}

/// The sending side, behind one lock so that sequence numbers are handed out in
/// the order the batches enter the channel.
struct Submitter {
    next_seq: u64,
    tx: Option<Sender<Job>>,
}

/// See the module documentation.
pub struct RocksStore {
    db: Arc<DB>,
    submitter: Mutex<Submitter>,
    shared: Arc<WriterState>,
    /// Joined on drop, after the channel closes, so every queued batch is
    /// written before the store is gone (the drop guard of the writer).
    writer: Mutex<Option<JoinHandle<()>>>,
}

fn io(source: rocksdb::Error) -> StoreError {
    StoreError::Rocks { source }
}

impl RocksStore {
    /// Opens (or creates) the store in `dir` with the default
    /// [`RocksOptions`]. Fails with [`StoreError::Locked`] when another
    /// process has it open, and [`StoreError::UnknownFormat`] when it was
    /// written by a newer build.
    pub fn open(dir: &Path, durability: Durability) -> Result<Self, StoreError> {
        Self::open_with(dir, durability, RocksOptions::default())
    }

    /// [`RocksStore::open`] with RocksDB's memory and disk sized by `sizes`.
    pub fn open_with(
        dir: &Path,
        durability: Durability,
        sizes: RocksOptions,
    ) -> Result<Self, StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| StoreError::Os {
            context: format!("cannot create {}", dir.display()),
            source: e.into(),
        })?;
        let shared = Arc::new(WriterState::default());
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        opts.increase_parallelism(2);
        opts.set_max_total_wal_size(sizes.max_wal_bytes);
        // WAL files are not recycled: RocksDB's own note on recycling under
        // point-in-time recovery (our mode) reports a hole in recovered data,
        // and an acknowledged commit must survive kill -9. The total bound
        // above is what limits the logs.
        opts.set_keep_log_file_num(KEEP_INFO_LOGS);
        opts.set_max_log_file_size(INFO_LOG_BYTES);
        let cache = Cache::new_lru_cache(sizes.block_cache_bytes);
        // Flushes and compactions run at the lowest CPU and I/O priority:
        // they can wait, a decision cannot. On a machine with few cores they
        // would otherwise take time slices from the threads serving requests
        // (a memtable flush is tens to hundreds of ms of CPU). They still get
        // every cycle the service leaves idle; a service that leaves none
        // for long enough is stalled by RocksDB (too many memtables), which
        // is the backpressure it should get.
        if let Ok(mut env) = rocksdb::Env::new() {
            env.lower_thread_pool_cpu_priority();
            env.lower_thread_pool_io_priority();
            env.lower_high_priority_thread_pool_cpu_priority();
            env.lower_high_priority_thread_pool_io_priority();
            opts.set_env(&env);
        }
        let cfs = Space::ALL.iter().map(|&s| {
            let mut o = Options::default();
            let mut t = BlockBasedOptions::default();
            t.set_block_cache(&cache);
            // Index and filter blocks count in the cache's bound rather than
            // growing with the data outside it; those of the first level (the
            // newest, most read files) stay pinned, so lookups of new keys keep
            // answering from memory (`Store::get_cached`).
            t.set_cache_index_and_filter_blocks(true);
            t.set_pin_l0_filter_and_index_blocks_in_cache(true);
            // Partitioned: a file's index and filter are cached in blocks of
            // 4 KiB, under a small top level that stays pinned. A whole filter
            // is one block of 1.25 bytes per key, which past the cache's
            // shard size (64 MiB / 64 shards) cannot stay cached: every
            // lookup of a new key read it from disk again, and 6 000 000
            // unique event ids took minutes instead of seconds.
            t.set_index_type(rocksdb::BlockBasedIndexType::TwoLevelIndexSearch);
            t.set_partition_filters(true);
            t.set_metadata_block_size(4096);
            t.set_pin_top_level_index_and_filter(true);
            o.set_max_write_buffer_number(MAX_WRITE_BUFFERS as i32);
            o.set_write_buffer_size(SMALL_WRITE_BUFFER);
            if matches!(s, Space::State | Space::Dedupe) {
                o.set_write_buffer_size(sizes.write_buffer_bytes);
                // Values carry their expiry up front (codec); dead ones are dropped
                // when compaction passes them, judged by the engine's clock.
                let shared = shared.clone();
                o.set_compaction_filter("freqcap-expired", move |_lvl, _k, v: &[u8]| {
                    let now = shared.now.load(Ordering::Relaxed);
                    match expiry_of(v) {
                        Some(e) if now > 0 && e <= now => Decision::Remove,
                        _ => Decision::Keep,
                    }
                });
                o.set_compression_type(rocksdb::DBCompressionType::Lz4);
                // Most reads of a new key find nothing: a bloom filter answers
                // them from memory (see `Store::get_cached`) instead of
                // reading a block of every file that might hold the key.
                t.set_bloom_filter(10.0, false);
                // The same for the memtables, where a miss would otherwise
                // walk a skip list of every key written lately.
                o.set_memtable_whole_key_filtering(true);
                o.set_memtable_prefix_bloom_ratio(0.1);
            }
            o.set_block_based_table_factory(&t);
            ColumnFamilyDescriptor::new(s.name(), o)
        });
        let db = DB::open_cf_descriptors(&opts, dir, cfs).map_err(|e| {
            if held_lock(e.kind(), e.as_ref()) {
                StoreError::Locked {
                    dir: dir.to_path_buf(),
                }
            } else {
                // In words: callers match `Io` for a store that cannot open.
                StoreError::Io(format!("cannot open {}: {e}", dir.display()))
            }
        })?;
        let db = Arc::new(db);
        Self::check_format(&db, dir)?;
        let (tx, rx) = crossbeam_channel::bounded(MAX_QUEUED);
        let hold = std::time::Duration::from_millis(sizes.write_behind_ms.min(MAX_WRITE_BEHIND_MS));
        let writer = {
            let (db, shared) = (db.clone(), shared.clone());
            std::thread::Builder::new()
                .name("freqcap-writer".into())
                .spawn(move || writer_loop(&db, &rx, &shared, durability, hold))
                .map_err(|e| StoreError::Os {
                    context: "cannot start the writer thread".into(),
                    source: e.into(),
                })?
        };
        Ok(RocksStore {
            db,
            submitter: Mutex::new(Submitter {
                next_seq: 1,
                tx: Some(tx),
            }),
            shared,
            writer: Mutex::new(Some(writer)),
        })
    }

    fn check_format(db: &DB, dir: &Path) -> Result<(), StoreError> {
        let meta = cf(db, Space::Meta)?;
        match db.get_cf(meta, FORMAT_KEY).map_err(io)? {
            Some(v) if v.len() == 1 && v[0] == FORMAT_VERSION => Ok(()),
            // An older directory: this build reads its values and writes new
            // ones in its own format, so the marker goes up now. An older
            // build then refuses the directory at open, naming the format,
            // instead of failing later on a value it cannot read.
            Some(v) if v.len() == 1 && v[0] < FORMAT_VERSION => {
                db.put_cf_opt(meta, FORMAT_KEY, [FORMAT_VERSION], &sync_opts())
                    .map_err(io)?;
                tracing::info!(
                    dir = %dir.display(),
                    "data directory upgraded from format {} to {FORMAT_VERSION}; older builds will refuse it",
                    v[0]
                );
                Ok(())
            }
            Some(v) => Err(StoreError::UnknownFormat {
                dir: dir.to_path_buf(),
                found: v.first().copied().unwrap_or(0),
                supported: FORMAT_VERSION,
            }),
            None => db
                .put_cf_opt(meta, FORMAT_KEY, [FORMAT_VERSION], &sync_opts())
                .map_err(io),
        }
    }
}

fn sync_opts() -> WriteOptions {
    let mut o = WriteOptions::default();
    o.set_sync(true);
    o
}

fn cf(db: &DB, space: Space) -> Result<&rocksdb::ColumnFamily, StoreError> {
    db.cf_handle(space.name())
        .ok_or_else(|| StoreError::Io(format!("column family {} is missing", space.name())))
}

/// The writer thread: takes what is queued, writes it as one group, then
/// acknowledges every batch in it. Ends when every sender is gone.
///
/// With a write-behind window (`hold`), a group that starts with a
/// write-behind batch gathers batches until the window has passed since it
/// was taken, and ends at once when an acknowledged batch or a flush comes.
fn writer_loop(
    db: &DB,
    rx: &Receiver<Job>,
    shared: &WriterState,
    durability: Durability,
    hold: std::time::Duration,
) {
    let mut opts = WriteOptions::default();
    opts.set_sync(durability == Durability::Fsync);
    opts.disable_wal(durability == Durability::Async);
    let mut flushes = Vec::new();
    // Reused from group to group, to keep its allocation: each op with
    // whether it came write-behind.
    let mut ops: Vec<(Op, bool)> = Vec::new();
    while let Ok(first) = rx.recv() {
        let deadline = std::time::Instant::now() + hold;
        let mut holding = !hold.is_zero();
        let mut first_seq = None;
        let mut last_seq = None;
        let mut n = 0u64;
        let mut next = Some(first);
        while let Some(job) = next.take() {
            match job {
                Job::Write { seq, batch, behind } => {
                    holding &= behind;
                    ops.extend(batch.into_iter().map(|op| (op, behind)));
                    first_seq.get_or_insert(seq);
                    last_seq = Some(seq);
                    n += 1;
                }
                Job::Flush(ack) => {
                    holding = false;
                    flushes.push(ack);
                }
            }
            // A held group has no one waiting on it: it may gather what the
            // queue can hold.
            let cap = if holding { MAX_QUEUED } else { MAX_GROUP };
            if (n as usize) < cap {
                next = if holding {
                    rx.recv_deadline(deadline).ok()
                } else {
                    rx.try_recv().ok()
                };
            }
        }
        let wb = group_batch(db, &mut ops, shared.now.load(Ordering::Relaxed));
        let result = if wb.is_empty() {
            Ok(())
        } else {
            db.write_opt(wb, &opts).map_err(io)
        };
        if let (Some(first), Some(last)) = (first_seq, last_seq) {
            shared.written.store(last, Ordering::Release);
            shared.mark.advance(first, last, result.clone());
        }
        shared.groups.fetch_add(1, Ordering::Relaxed);
        shared.batches.fetch_add(n, Ordering::Relaxed);
        for ack in flushes.drain(..) {
            let flushed = result.clone().and_then(|()| flush_db(db, durability));
            let _ = ack.send(flushed);
        }
    }
}

/// Whether `op` puts a record or event id that has already expired at `now`
/// (the engine's clock), which the writer then leaves out of a write-behind
/// batch: compaction would drop it at once (the `freqcap-expired` filter),
/// and it reads as absent. Write-behind batches are immediate debits, which
/// only raise a record, so a copy already on disk expires no later than this
/// one. A change that lowers a record (a `CL.THROTTLE` refund) is submitted
/// acknowledged, and always written.
///
/// It matters when the writer falls behind on short-lived state (a burst
/// of `CL.THROTTLE` on new keys at 100 per second leaves each idle 10 ms
/// after its decision): what expired in the queue costs nothing. In a
/// steady benchmark the bounded queue keeps the writer within a few ms, so
/// it saved nothing measurable there (BENCHMARKS.md).
fn expired_put(op: &Op, now: u64) -> bool {
    match op {
        Op::Put(Space::State | Space::Dedupe, _, v) => {
            matches!(expiry_of(v), Some(e) if now > 0 && e <= now)
        }
        _ => false,
    }
}

/// The group's `WriteBatch`, emptying `ops`: only the last op on each key,
/// and not even that when it is a write-behind put already expired at `now`
/// ([`expired_put`]). A record changed by many requests in one group (a hot
/// key, a busy user) is written once, not once per request: the group is
/// written atomically, so no one could read the versions in between from
/// disk (until written, records are read from memory; see the engine).
/// Column families all exist from `open`, so a missing one cannot happen;
/// it would drop the op.
fn group_batch(db: &DB, ops: &mut Vec<(Op, bool)>, now: u64) -> WriteBatch {
    let mut wb = WriteBatch::default();
    let mut seen = HashSet::with_capacity(ops.len());
    for (op, behind) in ops.iter().rev() {
        let (Op::Put(space, key, _) | Op::Delete(space, key)) = op;
        if !seen.insert((*space, key.as_slice())) {
            continue;
        }
        if *behind && expired_put(op, now) {
            continue;
        }
        let Ok(c) = cf(db, *space) else {
            continue;
        };
        match op {
            Op::Put(_, k, v) => wb.put_cf(c, k, v),
            Op::Delete(_, k) => wb.delete_cf(c, k),
        }
    }
    drop(seen);
    ops.clear();
    wb
}

/// Makes everything written so far durable even under `async`.
fn flush_db(db: &DB, durability: Durability) -> Result<(), StoreError> {
    match durability {
        Durability::Async => db.flush().map_err(io),
        _ => db.flush_wal(true).map_err(io),
    }
}

impl Store for RocksStore {
    fn get(&self, space: Space, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        // A read that may reach a file (get_cached answered from memory).
        let _call = tracing::info_span!(
            target: crate::front::trace::TARGET,
            "store.call",
            db.system = "rocksdb",
            call = "get"
        )
        .entered();
        self.db.get_cf(cf(&self.db, space)?, key).map_err(io)
    }

    fn get_cached(&self, space: Space, key: &[u8]) -> Option<Result<Option<Vec<u8>>, StoreError>> {
        let c = match cf(&self.db, space) {
            Ok(c) => c,
            Err(e) => return Some(Err(e)),
        };
        // Memtables and the block cache only: RocksDB answers `Incomplete`
        // where it would have to read a file.
        let mut o = ReadOptions::default();
        o.set_read_tier(ReadTier::BlockCache);
        match self.db.get_cf_opt(c, key, &o) {
            Err(e) if e.kind() == rocksdb::ErrorKind::Incomplete => None,
            r => Some(r.map_err(io)),
        }
    }

    fn scan(&self, space: Space) -> Result<KeyValues, StoreError> {
        let c = cf(&self.db, space)?;
        self.db
            .iterator_cf(c, IteratorMode::Start)
            .map(|kv| kv.map(|(k, v)| (k.to_vec(), v.to_vec())).map_err(io))
            .collect()
    }

    fn submit(&self, batch: Batch, acknowledge: bool) -> Receipt {
        let mut s = self
            .submitter
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let seq = s.next_seq;
        s.next_seq += 1;
        let sent = s.tx.as_ref().is_some_and(|tx| {
            tx.send(Job::Write {
                seq,
                batch,
                behind: !acknowledge,
            })
            .is_ok()
        });
        drop(s);
        self.shared.submitted.fetch_max(seq, Ordering::Relaxed);
        match (sent, acknowledge) {
            (false, _) => Receipt::failed(seq, StoreError::Closed),
            (true, false) => Receipt::done(seq),
            (true, true) => Receipt::watermark(seq, self.shared.mark.clone()),
        }
    }

    fn written_seq(&self) -> u64 {
        self.shared.written.load(Ordering::Acquire)
    }

    fn flush(&self) -> Result<(), StoreError> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        {
            let s = self
                .submitter
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let Some(q) = s.tx.as_ref() else {
                return Err(StoreError::Closed);
            };
            q.send(Job::Flush(tx)).map_err(|_| StoreError::Closed)?;
        }
        rx.recv().unwrap_or(Err(StoreError::Closed))
    }

    fn set_now(&self, now: u64) {
        self.shared.now.fetch_max(now, Ordering::Relaxed);
    }

    fn stats(&self) -> StoreStats {
        let submitted = self.shared.submitted.load(Ordering::Relaxed);
        let written = self.written_seq();
        // Property reads are in-memory lookups in RocksDB: cheap per scrape.
        let state = |name: &str| {
            cf(&self.db, Space::State)
                .ok()
                .and_then(|c| self.db.property_int_value_cf(c, name).ok().flatten())
                .unwrap_or(0)
        };
        let all = |name: &str| {
            [Space::State, Space::Definitions, Space::Dedupe, Space::Meta]
                .into_iter()
                .filter_map(|s| cf(&self.db, s).ok())
                .filter_map(|c| self.db.property_int_value_cf(c, name).ok().flatten())
                .sum::<u64>()
        };
        StoreStats {
            queue_depth: submitted.saturating_sub(written),
            groups: self.shared.groups.load(Ordering::Relaxed),
            batches: self.shared.batches.load(Ordering::Relaxed),
            disk_bytes: state("rocksdb.estimate-live-data-size"),
            memtable_bytes: all("rocksdb.cur-size-all-mem-tables"),
            pending_compaction_bytes: all("rocksdb.estimate-pending-compaction-bytes"),
            estimated_keys: state("rocksdb.estimate-num-keys"),
        }
    }

    fn compact(&self) -> Result<(), StoreError> {
        self.flush()?;
        for s in [Space::State, Space::Dedupe] {
            let c = cf(&self.db, s)?;
            self.db.compact_range_cf(c, None::<&[u8]>, None::<&[u8]>);
        }
        Ok(())
    }

    fn checkpoint(&self, dir: &Path) -> Result<(), StoreError> {
        self.flush()?;
        let cp = rocksdb::checkpoint::Checkpoint::new(&self.db).map_err(io)?;
        cp.create_checkpoint(dir).map_err(io)
    }
}

impl Drop for RocksStore {
    fn drop(&mut self) {
        // Closing the channel ends the writer once it has written what is queued.
        self.submitter
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .tx
            .take();
        if let Some(h) = self
            .writer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            let _ = h.join();
        }
        // Anyone still waiting (the writer died) is told, not left hanging.
        self.shared.mark.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Write-behind batches submitted faster than the writer writes them wait
    /// for room: the queue stays within its bound, and all are written.
    #[test]
    fn the_write_queue_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(RocksStore::open(dir.path(), Durability::Wal).unwrap());
        const N: u64 = 300_000;
        let deepest = std::thread::scope(|s| {
            let submitter = {
                let store = store.clone();
                s.spawn(move || {
                    for i in 0..N {
                        let key = (i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
                            .to_be_bytes()
                            .to_vec();
                        store.submit(vec![Op::Put(Space::State, key, vec![7; 32])], false);
                    }
                })
            };
            let mut deepest = 0;
            let t0 = std::time::Instant::now();
            while !submitter.is_finished() && t0.elapsed() < std::time::Duration::from_secs(60) {
                deepest = deepest.max(store.stats().queue_depth);
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
            deepest
        });
        // Queued, plus one group the writer holds while writing it.
        assert!(
            deepest <= (MAX_QUEUED + MAX_GROUP) as u64,
            "{deepest} batches queued"
        );
        assert!(deepest > 0, "the queue was never seen with anything in it");
        store.flush().unwrap();
        assert_eq!(store.written_seq(), N);
    }

    /// A write-behind put of a record already expired by the engine's clock
    /// is left out (it reads as absent either way); an acknowledged one, and
    /// a live one, are written.
    #[test]
    fn expired_write_behind_puts_are_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let store = RocksStore::open(dir.path(), Durability::Wal).unwrap();
        store.set_now(1_000);
        let put = |k: &[u8], expires| {
            vec![Op::Put(
                Space::State,
                k.to_vec(),
                super::super::codec::frame(expires, b"x"),
            )]
        };
        store.submit(put(b"behind-expired", 1_000), false);
        store.submit(put(b"behind-live", 1_001), false);
        store
            .submit(put(b"acked-expired", 500), true)
            .wait()
            .unwrap();
        store.flush().unwrap();
        assert_eq!(store.get(Space::State, b"behind-expired").unwrap(), None);
        assert!(store.get(Space::State, b"behind-live").unwrap().is_some());
        assert!(store.get(Space::State, b"acked-expired").unwrap().is_some());
    }

    /// With a write-behind window, a record that expires within it is never
    /// written, a live one is written once the window has passed, and an
    /// acknowledged batch or a flush is not held.
    #[test]
    fn a_write_behind_window_holds_only_write_behind_batches() {
        let dir = tempfile::tempdir().unwrap();
        let sizes = RocksOptions {
            write_behind_ms: 300,
            ..RocksOptions::default()
        };
        let store = RocksStore::open_with(dir.path(), Durability::Wal, sizes).unwrap();
        let put = |k: &[u8], expires| {
            vec![Op::Put(
                Space::State,
                k.to_vec(),
                super::super::codec::frame(expires, b"x"),
            )]
        };
        store.set_now(1_000);
        let t0 = std::time::Instant::now();
        store.submit(put(b"short", 1_500), false);
        store.submit(put(b"long", 10_000), false);
        // The engine's clock passes the first record's expiry in the window.
        store.set_now(2_000);
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(store.written_seq(), 0, "a write-behind batch was not held");
        // An acknowledged batch ends the window at once.
        store.submit(put(b"acked", 10_000), true).wait().unwrap();
        assert!(t0.elapsed() < std::time::Duration::from_millis(300));
        assert_eq!(store.get(Space::State, b"short").unwrap(), None);
        assert!(store.get(Space::State, b"long").unwrap().is_some());
        assert!(store.get(Space::State, b"acked").unwrap().is_some());
        // A write-behind batch alone waits out the window.
        store.submit(put(b"later", 10_000), false);
        let t1 = std::time::Instant::now();
        let deadline = t1 + std::time::Duration::from_secs(10);
        while store.written_seq() < 4 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(t1.elapsed() >= std::time::Duration::from_millis(290));
        assert!(store.get(Space::State, b"later").unwrap().is_some());
    }

    /// Only RocksDB's own lock errors mean "in use".
    #[test]
    fn only_the_lock_files_error_means_held() {
        use rocksdb::ErrorKind::{Corruption, IOError};
        let held = [
            "IO error: While lock file: /var/lib/freqcap/data/LOCK: Resource temporarily unavailable",
            "IO error: While lock file: /tmp/a: b/LOCK: Permission denied",
            "IO error: lock hold by current process, acquire time 1700000000 acquiring thread \
             1234: /tmp/x/LOCK: No locks available",
        ];
        for m in held {
            assert!(held_lock(IOError, m), "{m}");
        }
        let not = [
            (
                Corruption,
                "Corruption: block checksum mismatch: stored = 1, computed = 2",
            ),
            (
                IOError,
                "IO error: No such file or directory: While opening a file for sequentially reading: /srv/lock/data/CURRENT: No such file or directory",
            ),
            (
                IOError,
                "IO error: While lock file: /tmp/x/LOCK: No space left on device",
            ),
            (
                IOError,
                "IO error: while open a file for lock: /tmp/x/LOCK: Permission denied",
            ),
            (
                Corruption,
                "Corruption: While lock file: /tmp/x/LOCK: Resource temporarily unavailable",
            ),
            (
                IOError,
                "IO error: While lock file: /tmp/lock/MANIFEST: Resource temporarily unavailable",
            ),
        ];
        for (k, m) in not {
            assert!(!held_lock(k, m), "{m}");
        }
    }

    /// A group keeps the last op on each key, whatever came before it.
    #[test]
    fn a_group_writes_each_key_once_and_the_last_op_wins() {
        let dir = tempfile::tempdir().unwrap();
        let store = RocksStore::open(dir.path(), Durability::Wal).unwrap();
        let put = |k: &str, v: &str| Op::Put(Space::State, k.into(), v.into());
        let del = |k: &str| Op::Delete(Space::State, k.into());
        let mut ops: Vec<(Op, bool)> = vec![
            put("a", "1"),
            put("b", "1"),
            put("a", "2"),
            del("b"),
            del("c"),
            put("c", "1"),
            put("a", "3"),
            // Same key bytes in another space: a different key.
            Op::Put(Space::Dedupe, b"a".to_vec(), b"x".to_vec()),
        ]
        .into_iter()
        .map(|op| (op, false))
        .collect();
        let wb = group_batch(&store.db, &mut ops, 0);
        assert!(ops.is_empty(), "the ops are taken");
        assert_eq!(wb.len(), 4, "one op per key");
        store.db.write(wb).unwrap();
        let get = |s, k: &str| store.get(s, k.as_bytes()).unwrap();
        assert_eq!(get(Space::State, "a").as_deref(), Some(&b"3"[..]));
        assert_eq!(get(Space::State, "b"), None);
        assert_eq!(get(Space::State, "c").as_deref(), Some(&b"1"[..]));
        assert_eq!(get(Space::Dedupe, "a").as_deref(), Some(&b"x"[..]));
    }
}
