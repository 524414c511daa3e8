//! Keys of an [`Engine::check_all`] call that are not decided: usage
//! reported after the fact, debited even past the limit, and refunds,
//! credited back floored at nothing used (docs/rls.md, "Reports and
//! refunds": Envoy's `apply_on_stream_done` and `is_negative_hits`). Both
//! are applied before the call's decisions, whatever those answer: the
//! usage happened, or did not, whether or not this request passes.

use smallvec::SmallVec;

use crate::clock::{Clock, Nanos};
use crate::limits::stack::Decision;
use crate::limits::{Hold, ItemState};

use super::chain::Defs;
use super::check_all::{KeyCheck, Usage};
use super::hot::{Halt, Reads, RecordKey};
use super::persist::{Ack, Changes};
use super::placement::LEASED_COPY;
use super::{Engine, EngineError};

impl<C: Clock> Engine<C> {
    /// Applies report or refund `c` to its `record` and answers the key's
    /// figures after it (always allowed: it decides nothing).
    pub(crate) fn apply_reported(
        &self,
        record: RecordKey,
        c: &KeyCheck,
        now: Nanos,
        reads: Reads,
    ) -> Result<Decision, Halt> {
        let (stack, tags) = (&c.limits.stack, &c.limits.tags);
        let hot = match record {
            RecordKey::PolicyKey(h) => self.hot_keys.get(h),
            _ => None,
        };
        if let Some(hk) = &hot {
            hk.decided_by(0, stack, tags);
        }
        // Decided under the key's stripe as `check_all`'s own keys are, so
        // no decision of it sees a state between read and write.
        let _held = (self.shared().is_none()).then(|| self.key_locks.lock(&[record]));
        let decided = self.with_record(record, now, reads, |rec, now| {
            let leased = rec.write_seq == LEASED_COPY;
            // A hot key's counts are the fleet's leases' (docs/cluster.md,
            // "Hot keys"): this node's record holds only what it counted
            // since, so a refund could give back only that. Refused, changing
            // nothing, as a reset is; a report is counted on it as a
            // decision that allowed.
            if leased && c.usage == Usage::Refund {
                return None;
            }
            let mut states: SmallVec<[ItemState; 4]> = tags
                .iter()
                .map(|&t| rec.state(0, t).cloned().unwrap_or_default())
                .collect();
            match c.usage {
                Usage::Report => stack.force(&mut states, now, c.cost),
                Usage::Refund => stack.credit(&mut states, now, c.cost),
                Usage::Decide => {}
            }
            let peek = stack
                .decide_as(&mut states, now, 0, Hold::Immediate, c.priority)
                .0;
            if c.cost > 0 {
                for (&t, s) in tags.iter().zip(states) {
                    *rec.state_mut(0, t) = s;
                }
                for (item, &t) in stack.items().iter().zip(tags) {
                    rec.touch(0, t, item);
                }
                if let (true, Some(hk)) = (leased, &hot)
                    && c.usage == Usage::Report
                {
                    self.count_hot_lines(hk, stack, tags, c.cost);
                }
                // Written behind, as a decided key's debit is; on a shared
                // store the compare-and-set wrote it.
                let mut changes = Changes::new();
                changes.record(record, rec);
                let defs = Defs::Stack {
                    def_id: 0,
                    stack,
                    tags,
                };
                let _ = self.persist(changes, defs, now, Ack::WriteBehind);
            }
            Some(peek)
        })?;
        decided.ok_or_else(|| hot_refund().into())
    }

    /// Refuses a call with a refund on a key known to be hot before any of
    /// its reports is applied, so that a refused call changes nothing.
    pub(crate) fn refuse_hot_refunds(
        &self,
        checks: &[KeyCheck],
        records: &[RecordKey],
    ) -> Result<(), EngineError> {
        for (c, r) in checks.iter().zip(records) {
            if let (Usage::Refund, RecordKey::PolicyKey(h)) = (c.usage, r)
                && self.hot_keys.get(*h).is_some()
            {
                return Err(hot_refund());
            }
        }
        Ok(())
    }
}

/// A refund on a hot key, refused.
fn hot_refund() -> EngineError {
    EngineError::Overloaded(
        "this key is hot: decided on leases across the fleet until its traffic drops \
         (docs/cluster.md, \"Hot keys\"); a refund is refused until then, retry later"
            .into(),
    )
}
