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
//!
//! On a fleet, a key whose writes conflict is frozen and leased as a policy
//! key is (docs/cluster.md, "Hot keys"): each node decides on a TAT of its
//! own, and a debit allows only within the node's grant of the key's token
//! line (the same T and τ, [`CellRate::line`]).

use crate::clock::{Clock, Nanos};
use std::sync::Arc;

use crate::limits::cell::{CellAnswer, CellError, CellRate, CellTat};
use crate::limits::rate::{RateForm, RateState};
use crate::limits::stack::{OnLimit, Stack};
use crate::limits::{Item, ItemState, Kind};

use super::chain::Defs;
use super::hot::{Halt, Reads, RecordKey, waited};
use super::persist::{Ack, Changes};
use super::placement::LEASED_COPY;
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
        let hash = self.hash_bytes(b'c', 0, req.key);
        let record = RecordKey::PolicyKey(hash);
        let shadow = self.options.shadow;
        // A hot key (docs/cluster.md, "Hot keys"): its token line's grant
        // is made ready first, outside every lock.
        let hot = self.hot_keys.get(hash);
        let mut line = None;
        if let (Some(hk), Some(shared)) = (&hot, self.shared()) {
            line = line_stack(req);
            if let Some(stack) = &line {
                hk.decided_by(CELL_DEF, stack, &LINE_TAGS);
                self.prepare_hot(shared, hk, CELL_DEF, stack, &LINE_TAGS, cost(req), now);
            }
        }
        let decided = self.with_record(record, now, reads, |rec, now: Nanos| {
            let step = req.rate.throttle(kept_tat(rec), now, req.quantity);
            let mut answer = step.answer;
            // Limited by this node's grant of a hot key's line, not by the TAT.
            let mut refused = false;
            // On this node's own record of a hot key, a debit allows within
            // the node's grant of the key's token line only.
            let leased = (rec.write_seq == LEASED_COPY)
                .then(|| self.hot_keys.get(hash))
                .flatten()
                .and_then(|hk| Some((hk, line.clone().or_else(|| line_stack(req))?)));
            if let (Some((hk, stack)), Ok(a)) = (&leased, &answer)
                && !a.limited
                && req.quantity > 0
                && let Some(&(_, retry)) = self
                    .hot_refusals(hk, rec, CELL_DEF, stack, &LINE_TAGS, cost(req), now)
                    .first()
            {
                // The figures as they are (a look debits nothing), limited
                // until the grant has room.
                refused = true;
                let look = req.rate.throttle(kept_tat(rec), now, 0).answer;
                answer = look.map(|l| CellAnswer {
                    limited: true,
                    retry_after: Some(i128::try_from(retry).unwrap_or(i128::MAX)),
                    ..l
                });
            }
            if let Ok(a) = answer
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
            // (An error may move the TAT too, as redis-cell's does: see
            // `CellRate::throttle`.)
            if let Some(tat) = step.keep.filter(|&t| !refused && Some(t) != kept_tat(rec)) {
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
                if let Some((hk, stack)) = &leased
                    && req.quantity > 0
                {
                    self.count_hot_lines(hk, stack, &LINE_TAGS, cost(req));
                }
            }
            answer.map(|answer| ThrottleOutcome {
                answer,
                would_deny: false,
            })
        });
        // Writes of this key met other nodes' often this second: freeze it,
        // so that its decisions go to leases of its token line
        // (`placement/leased.rs`), as a policy key's are. Parameters no
        // line holds keep it as it is.
        let gave_up = matches!(decided, Err(Halt::Failed(EngineError::Overloaded(_))));
        if hot.is_none()
            && self.shared().is_some()
            && req.quantity > 0
            && (gave_up || self.hot_keys.heated(hash, now))
            && req.rate.line().is_some()
        {
            self.freeze(record, now);
            // Given up for conflicts, decided again on leases.
            if gave_up && self.hot_keys.get(hash).is_some() {
                return self.throttle_with(req, reads);
            }
        }
        decided
    }
}

/// The definition id a hot `CL.THROTTLE` key's line is leased under (no
/// definition has it: a key's parameters come with each call), and its tag.
const CELL_DEF: u32 = u32::MAX;
const LINE_TAGS: [u32; 1] = [0];

/// The token line of `req`'s parameters as a one-item stack, if a line
/// holds them ([`CellRate::line`]).
fn line_stack(req: &ThrottleRequest<'_>) -> Option<Arc<Stack>> {
    let rate = req.rate.line()?;
    Some(Arc::new(Stack::new(
        vec![Item::Rate {
            rate,
            kind: Kind::Rate,
        }],
        vec![String::new()],
        OnLimit::Reject,
    )))
}

/// `req`'s debit in units of its line (a refund debits none).
fn cost(req: &ThrottleRequest<'_>) -> u64 {
    u64::try_from(req.quantity).unwrap_or(0)
}
