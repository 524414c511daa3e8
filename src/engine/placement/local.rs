//! One node: records in this node's store (memory or RocksDB), decided on
//! in the hot tier under its shard's lock, loaded from the store on a miss
//! as [`Reads`] allows, and written by the engine's batches (`persist`).

use crate::clock::{Clock, Nanos};
use crate::engine::chain::Defs;
use crate::engine::hot::{Halt, Reads, RecordKey};
use crate::engine::persist::{Ack, Changes};
use crate::engine::record::SubjectRecord;
use crate::engine::{Engine, EngineError, corrupt};
use crate::store::{Op, Receipt, Space};
use std::sync::atomic::Ordering;

impl<C: Clock> Engine<C> {
    /// [`Engine::with_record`] on one node: `f` runs on the hot-tier copy
    /// at `now`.
    pub(super) fn with_local_record<R>(
        &self,
        key: RecordKey,
        now: Nanos,
        reads: Reads,
        mut f: impl FnMut(&mut SubjectRecord, Nanos) -> R,
    ) -> Result<R, Halt> {
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

    /// [`Engine::record_figures`] on one node: from the hot tier if the
    /// record is there (kept there only if it is), else from the store.
    pub(super) fn local_figures(&self, key: RecordKey) -> Result<SubjectRecord, EngineError> {
        if let Some(r) = self.hot.get(&key.hot_key(), SubjectRecord::figures_copy) {
            return Ok(r);
        }
        match self.store.get(Space::State, &key.disk_key())? {
            Some(v) => Ok(SubjectRecord::from_stored(&v).map_err(|m| corrupt(b"user", m))?),
            None => Ok(SubjectRecord::default()),
        }
    }

    /// Where a record emptied by an erasure goes: on one node it is deleted,
    /// not rewritten, so nothing of the viewer stays in the data directory
    /// once compaction has run (the returned write, durable when it is).
    /// `None` on a shared store, which writes the emptied record by
    /// compare-and-set (its version, `write_seq`, is kept for it).
    pub(crate) fn erase_record(
        &self,
        record: RecordKey,
        rec: &mut SubjectRecord,
        now: Nanos,
    ) -> Option<Receipt> {
        if !self.placement.is_local() {
            return None;
        }
        let mut changes = Changes::new();
        changes.op(Op::Delete(Space::State, record.disk_key()));
        let r = self.persist(changes, Defs::Chain(&[]), now, Ack::Durable);
        rec.write_seq = r.seq;
        Some(r)
    }
}
