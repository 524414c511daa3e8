//! Resetting one key (docs/semantics.md §5.3, "Reset a key"): `DELETE
//! /v1/policies/{name}/keys/{key}` empties every counter the policy keeps
//! for that key, and RESP's `DEL` a `CL.THROTTLE` key's, as redis-cell
//! documents for a reset. Other keys, and the policy itself, are untouched.

use crate::clock::Clock;

use super::chain::Defs;
use super::hot::{Reads, RecordKey, waited};
use super::persist::{Ack, Changes};
use super::placement::LEASED_COPY;
use super::record::SubjectRecord;
use super::{Engine, EngineError};

impl<C: Clock> Engine<C> {
    /// Empties policy `policy`'s counters for `key`: its next check is
    /// decided as a fresh key's. Returns whether it had any. Reservations
    /// open on the key stay open; settling them finds nothing to undo. A
    /// missing policy is 404; the key is checked as a check's.
    pub fn reset_key(&self, policy: &str, key: &str) -> Result<bool, EngineError> {
        self.check_id("key", key)?;
        let id = self
            .registry()
            .policies
            .get(policy)
            .map(|p| p.id)
            .ok_or_else(|| EngineError::NotFound(format!("no policy named {policy:?}")))?;
        let record = RecordKey::PolicyKey(self.hash(b'p', id, key));
        self.empty_counters(record, id)
    }

    /// Empties the `CL.THROTTLE` state of `key` (RESP `DEL`). Returns
    /// whether it had any.
    pub fn reset_throttle(&self, key: &[u8]) -> Result<bool, EngineError> {
        let record = RecordKey::PolicyKey(self.hash_bytes(b'c', 0, key));
        self.empty_counters(record, 0)
    }

    /// Drops every counter of `def_id` in `record`, durably: written and
    /// acknowledged before the answer (on a shared store, by its
    /// compare-and-set).
    fn empty_counters(&self, record: RecordKey, def_id: u32) -> Result<bool, EngineError> {
        let now = self.now();
        let mut hot = false;
        let receipt = self.with_record(record, now, Reads::MayWait, |rec, now| {
            // A hot key's counts are the fleet's leases' (docs/cluster.md,
            // "Hot keys"), not this record's: refused, changing nothing.
            if rec.write_seq == LEASED_COPY {
                hot = true;
                return None;
            }
            if !drop_def(rec, def_id) {
                return None;
            }
            // On a shared store the record is written by compare-and-set as
            // decided, and `persist` writes nothing more.
            let mut changes = Changes::new();
            changes.record(record, rec);
            Some(self.persist(changes, Defs::Chain(&[]), now, Ack::Durable))
        });
        let receipt = waited(receipt)?;
        if hot {
            return Err(EngineError::Overloaded(
                "this key is hot: decided on leases across the fleet until its traffic drops \
                 (docs/cluster.md, \"Hot keys\"); a reset is refused until then, retry later"
                    .into(),
            ));
        }
        match receipt {
            None => Ok(false),
            Some(r) => {
                r.wait()?;
                Ok(true)
            }
        }
    }
}

/// Removes `def_id`'s counters from `rec`; whether it had any.
fn drop_def(rec: &mut SubjectRecord, def_id: u32) -> bool {
    let before = rec.counters.len();
    if !rec.counters.iter().any(|c| c.def_id == def_id) {
        return false;
    }
    let kept: Vec<_> = std::mem::take(&mut rec.counters)
        .into_vec()
        .into_iter()
        .filter(|c| c.def_id != def_id)
        .collect();
    rec.counters = kept.into_boxed_slice();
    before != rec.counters.len()
}
