//! The one place the engine writes to its store. A decision collects the
//! records it changed ([`Changes`]); [`Engine::persist`] encodes each once,
//! submits them as one batch and stamps each with the batch's sequence.
//! Definitions and metadata, which are not records, go through
//! [`Engine::write_durably`].

use smallvec::SmallVec;

use crate::clock::{Clock, Nanos};
use crate::store::{Batch, Op, Receipt, Space, Store, StoreError};

use super::chain::Defs;
use super::hot::RecordKey;
use super::record::SubjectRecord;
use super::{Engine, EngineError};

/// Whether the caller waits for a batch to be durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ack {
    /// The receipt waits until the batch is durable (commits, events).
    Durable,
    /// Written behind with the next group; no one waits (an immediate debit).
    WriteBehind,
}

/// What one decision changed and must write together: records, still locked
/// by the caller, and other ops (an event id).
pub(crate) struct Changes<'r> {
    records: SmallVec<[(RecordKey, &'r mut SubjectRecord); 4]>,
    ops: Batch,
}

impl<'r> Changes<'r> {
    pub(crate) fn new() -> Self {
        Changes {
            records: SmallVec::new(),
            ops: Batch::new(),
        }
    }

    /// A record to write, as it is when [`Engine::persist`] runs.
    pub(crate) fn record(&mut self, key: RecordKey, rec: &'r mut SubjectRecord) {
        self.records.push((key, rec));
    }

    /// Another op to write in the same batch, before the records.
    pub(crate) fn op(&mut self, op: Op) {
        self.ops.push(op);
    }
}

impl<C: Clock> Engine<C> {
    /// Writes `changes` as one atomic batch: each record in its disk form
    /// (committed state only, pending debits released as of `now` through
    /// the items `defs` finds), then stamps each with the batch's sequence,
    /// so none leaves memory before the store has written it.
    ///
    /// Called while the caller still holds the records' locks: two snapshots
    /// of one record then reach the store in the order they were taken
    /// (see [`crate::store::Store`]).
    pub(crate) fn persist(
        &self,
        changes: Changes<'_>,
        defs: Defs<'_>,
        now: Nanos,
        ack: Ack,
    ) -> Receipt {
        let Changes { mut records, ops } = changes;
        if self.shared().is_some() {
            // A shared store's records were written by compare-and-set as
            // they were decided (`super::placement`); campaign records hold
            // nothing there (their state is leased, docs/cluster.md).
            return self.store.submit(ops, ack == Ack::Durable);
        }
        let mut batch = ops;
        batch.reserve(records.len());
        for (key, rec) in records.iter() {
            let value = rec.to_stored(now, |def_id, tag| defs.item(def_id, tag));
            batch.push(Op::Put(Space::State, key.disk_key(), value));
        }
        let receipt = self.store.submit(batch, ack == Ack::Durable);
        for (_, rec) in records.iter_mut() {
            rec.write_seq = receipt.seq;
        }
        receipt
    }

    /// Writes `ops` (definitions, metadata) and waits until they are durable.
    pub(crate) fn write_durably(&self, ops: Batch) -> Result<(), EngineError> {
        Ok(write_durably(&*self.store, ops)?)
    }
}

/// [`Engine::write_durably`] before there is an engine (at open).
pub(crate) fn write_durably(store: &dyn Store, ops: Batch) -> Result<(), StoreError> {
    store.submit(ops, true).wait()
}
