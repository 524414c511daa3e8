//! `CL.THROTTLE`: one key's GCRA with redis-cell's semantics
//! ([`crate::limits::cell`]; docs/resp.md), its TAT kept in the key's
//! record like any other counter, in memory and in the store.
//!
//! A key is any byte string, of any length: its record is the 128-bit keyed
//! SipHash of the bytes ([`Engine::hash_bytes`], namespace `c`, apart from
//! policy and inline keys), so the key itself is never stored. Two keys
//! share a record only if their hashes collide: with n keys in use, a
//! chance of about n²/2^129 (10^-15 for a trillion keys).
//!
//! The record holds one counter, whatever parameters the key is called
//! with: its state is the TAT as whole ns plus a remainder in 1/q ns, and
//! the counter's tag carries q (below 2^24; a larger q keeps whole ns,
//! rounded up), so a call with other parameters reads the same TAT.

use crate::clock::{Clock, Nanos};
use crate::limits::ItemState;
use crate::limits::cell::{CellAnswer, CellError, CellRate, CellTat};
use crate::limits::rate::{RateForm, RateState};

use super::chain::Defs;
use super::hot::{Halt, Reads, RecordKey, waited};
use super::persist::{Ack, Changes};
use super::record::{Counter, SubjectRecord};
use super::{Engine, EngineError};

/// One `CL.THROTTLE key max_burst count period quantity`, its rate compiled.
#[derive(Debug, Clone, Copy)]
pub struct ThrottleRequest<'a> {
    pub key: &'a [u8],
    pub rate: CellRate,
    pub quantity: i64,
}

/// A `CL.THROTTLE`'s answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThrottleOutcome {
    /// As decided, but in shadow mode a limited request is answered allowed
    /// (and has debited nothing): see `would_deny`.
    pub answer: CellAnswer,
    pub would_deny: bool,
}

/// The largest q a counter's tag carries (24 bits above the item index).
const TAG_Q_LIMIT: u64 = 1 << 24;

/// The TAT a cell record keeps, if any.
fn kept_tat(rec: &SubjectRecord) -> Option<CellTat> {
    let c = rec.counters.first()?;
    match &c.state {
        ItemState::Rate(r) => match r.form() {
            RateForm::WholeNs { ns, rem } => Some(CellTat {
                ns,
                rem,
                q: u64::from(c.tag >> 8),
            }),
            RateForm::Scaled(_) => None,
        },
        _ => None,
    }
}

/// Keeps `tat` as the record's one counter.
fn keep_tat(rec: &mut SubjectRecord, tat: CellTat) {
    let (ns, rem, q) = if tat.q < TAG_Q_LIMIT {
        (tat.ns, tat.rem, tat.q)
    } else {
        (tat.ns.saturating_add(u64::from(tat.rem > 0)), 0, 0)
    };
    let counter = Counter {
        def_id: 0,
        // q < 2^24: the shift keeps every bit.
        tag: u32::try_from(q).unwrap_or(0) << 8,
        state: ItemState::Rate(RateState::from_whole_ns(ns, rem)),
    };
    if let [c] = &mut rec.counters[..] {
        *c = counter;
    } else {
        rec.counters = Box::new([counter]);
    }
    // The record must outlive its TAT, as redis-cell's key does.
    rec.idle_at = rec.idle_at.max(ns.saturating_add(1));
}

/// A throttle's answer, or redis-cell's refusal of its arguments (a store
/// that fails is the outer [`EngineError`]).
pub type Throttled = Result<ThrottleOutcome, CellError>;

impl<C: Clock> Engine<C> {
    /// Decides a `CL.THROTTLE` (docs/resp.md): allowed requests move the
    /// key's TAT, written behind as every immediate debit is.
    pub fn throttle(&self, req: &ThrottleRequest<'_>) -> Result<Throttled, EngineError> {
        waited(self.throttle_with(req, Reads::MayWait))
    }

    /// [`Engine::throttle`] if the key's record is in memory (or the store
    /// knows from memory it has none); `None` otherwise, having changed
    /// nothing, as [`Engine::check_in_memory`].
    pub fn throttle_in_memory(
        &self,
        req: &ThrottleRequest<'_>,
    ) -> Option<Result<Throttled, EngineError>> {
        self.in_memory_if(false, || self.throttle_with(req, Reads::MemoryOnly))
    }

    fn throttle_with(&self, req: &ThrottleRequest<'_>, reads: Reads) -> Result<Throttled, Halt> {
        let now = self.now();
        self.expire_step(now, reads);
        let record = RecordKey::PolicyKey(self.hash_bytes(b'c', 0, req.key));
        let shadow = self.options.shadow;
        self.with_record(record, now, reads, |rec, now: Nanos| {
            let step = req.rate.throttle(kept_tat(rec), now, req.quantity);
            if let Ok(a) = step.answer
                && a.limited
                && shadow
            {
                // Decided, debiting nothing (a limited call never does), and
                // answered allowed.
                let allowed = CellAnswer {
                    limited: false,
                    retry_after: None,
                    ..a
                };
                return Ok(ThrottleOutcome {
                    answer: allowed,
                    would_deny: true,
                });
            }
            if let Some(tat) = step.keep.filter(|&t| Some(t) != kept_tat(rec)) {
                keep_tat(rec, tat);
                let mut changes = Changes::new();
                changes.record(record, rec);
                // No definition describes the counter: it is kept until the
                // record's idle_at, its TAT. A refund lowers the TAT, so it
                // is submitted acknowledged: the writer may leave out an
                // expired write-behind record only because those only rise
                // (crate::store::rocks, `expired_put`).
                let ack = if req.quantity < 0 {
                    Ack::Durable
                } else {
                    Ack::WriteBehind
                };
                let _ = self.persist(changes, Defs::Chain(&[]), now, ack);
            }
            step.answer.map(|answer| ThrottleOutcome {
                answer,
                would_deny: false,
            })
        })
    }
}
