//! Several keys decided in one step, all or nothing: Envoy's rate limit
//! service (`src/rls/`) sends every descriptor of a request at once, and
//! either every one of them is debited or none is (docs/rls.md,
//! "All or nothing"). envoyproxy/ratelimit increments each descriptor's
//! counter on its own, so a request denied by one descriptor still uses up
//! the others (its issues #185 and #427).
//!
//! How it stays one step: every key of a request is taken under a striped
//! lock ([`KeyLocks`], in one order, so two requests never wait on each
//! other in a cycle); then each key is decided on a copy of its state, and
//! only if every enforced key allows are the copies written back. Only this
//! operation decides these keys (their hash namespace is their own), so no
//! other request sees a state between the two passes.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use smallvec::SmallVec;

use crate::clock::{Clock, Nanos};
use crate::limits::priority::Priority;
use crate::limits::stack::Decision;
use crate::limits::{Hold, ItemState};

use super::chain::{Defs, PendingEnd, Repriced, settle_entries};
use super::holds::{Held, HeldKind};
use super::hot::{Halt, Reads, RecordKey, waited};
use super::leases::leasable;
use super::persist::{Ack, Changes};
use super::placement::LEASED_COPY;
use super::record::PendingEntry;
use super::request::{CompiledInline, check_cost};
use super::{Engine, EngineError, invalid};

/// Hash namespace of the keys this operation decides.
const NAMESPACE: u8 = b'r';

/// Most keys one call may decide (Envoy sends a handful; each is a record
/// lookup under the locks of all of them).
pub const MAX_KEYS: usize = 64;

/// Longest key: an RLS key is its domain and up to 32 entries of at most
/// `max_id_len` bytes each.
const MAX_KEY_BYTES: usize = 1 << 16;

/// Lock stripes: enough that unrelated requests rarely share one, few
/// enough that taking a request's handful stays cheap.
const STRIPES: usize = 64;

/// One key of a [`Engine::check_all`] call.
#[derive(Debug, Clone)]
pub struct KeyCheck {
    /// The limit items the key is decided by.
    pub limits: Arc<CompiledInline>,
    pub key: String,
    pub cost: u64,
    /// `false`: shadow mode (docs/rls.md, "Shadow mode"): decided and
    /// debited when it allows, but its denial never denies the request.
    pub enforced: bool,
    /// The request's class (docs/semantics.md §2.5).
    pub priority: Priority,
    /// Whether the key is decided, or its usage reported or refunded.
    pub usage: Usage,
}

/// What a [`KeyCheck`] does with its cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Usage {
    /// Decided with the call's other keys, all or nothing.
    #[default]
    Decide,
    /// Usage that already happened (Envoy's `apply_on_stream_done`):
    /// debited even past the limit, never denying (`super::reported`).
    Report,
    /// A refund (Envoy's `is_negative_hits`): credited back, floored at
    /// nothing used, never denying.
    Refund,
}

/// The answer of [`Engine::check_all`].
#[derive(Debug, Clone)]
pub struct AllOutcome {
    /// Every enforced key allowed, and every key that allowed was debited.
    pub allowed: bool,
    /// Per key, in the order given. When the request is denied, a key that
    /// would have allowed shows its figures as they are (nothing debited).
    pub decisions: Vec<Decision>,
}

/// The striped locks keys are taken under for the length of one call.
pub(crate) struct KeyLocks {
    stripes: Box<[Mutex<()>]>,
}

impl Default for KeyLocks {
    fn default() -> Self {
        KeyLocks {
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
        }
    }
}

impl KeyLocks {
    /// Takes the stripes of `records`, lowest index first.
    pub(super) fn lock(&self, records: &[RecordKey]) -> Vec<MutexGuard<'_, ()>> {
        let mut idx: SmallVec<[usize; 8]> = records
            .iter()
            .map(|r| r.hot_key()[0] as usize % self.stripes.len())
            .collect();
        idx.sort_unstable();
        idx.dedup();
        idx.into_iter()
            .map(|i| {
                self.stripes[i]
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
            })
            .collect()
    }
}

/// A key's record and the identity its limits count under in it.
fn stack_id(limits: &CompiledInline) -> u32 {
    // Different limits on one key keep separate records: a record keeps one
    // counter per item index and def_id, and a changed limit starts afresh,
    // as inline limits do (docs/semantics.md §3).
    limits
        .tags
        .iter()
        .fold(0x811c_9dc5u32, |h, &t| (h ^ t).wrapping_mul(0x0100_0193))
}

impl<C: Clock> Engine<C> {
    /// Decides `checks` all or nothing (see the module documentation).
    pub fn check_all(&self, checks: &[KeyCheck]) -> Result<AllOutcome, EngineError> {
        waited(self.check_all_with(checks, Reads::MayWait))
    }

    /// [`Engine::check_all`] if every key's record is in memory; `None`
    /// otherwise, having changed nothing (as [`Engine::check_in_memory`]).
    pub fn check_all_in_memory(
        &self,
        checks: &[KeyCheck],
    ) -> Option<Result<AllOutcome, EngineError>> {
        // With a shared store every key is a call to it: never on the
        // executor.
        self.in_memory_if(false, || self.check_all_with(checks, Reads::MemoryOnly))
    }

    fn check_all_with(&self, checks: &[KeyCheck], reads: Reads) -> Result<AllOutcome, Halt> {
        if checks.is_empty() {
            return Err(invalid("checks", "at least one key is needed").into());
        }
        if checks.len() > MAX_KEYS {
            return Err(invalid(
                "checks",
                format!("at most {MAX_KEYS} keys, got {}", checks.len()),
            )
            .into());
        }
        for c in checks {
            // Keys are hashed, so their length costs nothing past here; the
            // caller bounds what it builds them from (an RLS descriptor's
            // entries each within max_id_len).
            if c.key.is_empty() || c.key.len() > MAX_KEY_BYTES {
                return Err(invalid(
                    "key",
                    format!("must be 1 to {MAX_KEY_BYTES} bytes, got {}", c.key.len()),
                )
                .into());
            }
            check_cost("cost", c.cost)?;
        }
        let now = self.now();
        self.expire_step(now, reads);
        let records: Vec<RecordKey> = checks
            .iter()
            .map(|c| RecordKey::PolicyKey(self.hash(NAMESPACE, stack_id(&c.limits), &c.key)))
            .collect();
        if checks.iter().any(|c| c.usage != Usage::Decide) {
            return self.with_reported(checks, &records, now, reads);
        }
        self.decide_keys(checks, &records, now, reads)
    }

    /// A call with reports or refunds: those are applied first, one key at
    /// a time (`super::reported`), then the other keys are decided all or
    /// nothing on what they leave.
    fn with_reported(
        &self,
        checks: &[KeyCheck],
        records: &[RecordKey],
        now: Nanos,
        reads: Reads,
    ) -> Result<AllOutcome, Halt> {
        self.refuse_hot_refunds(checks, records)?;
        if reads == Reads::MemoryOnly {
            // Nothing may be applied by a call that then stops for a read
            // (it runs again on a blocking thread): every record is found in
            // memory first, and kept there for this call, as `states_of`
            // keeps them.
            for &r in records {
                self.with_record(r, now, reads, |rec, now| {
                    rec.idle_at = rec.idle_at.max(now + 1);
                })?;
            }
        }
        let mut decisions: Vec<Option<Decision>> = vec![None; checks.len()];
        for (i, c) in checks.iter().enumerate() {
            if c.usage != Usage::Decide {
                decisions[i] = Some(self.apply_reported(records[i], c, now, reads)?);
            }
        }
        let decided: Vec<usize> = (0..checks.len())
            .filter(|&i| checks[i].usage == Usage::Decide)
            .collect();
        let mut allowed = true;
        if !decided.is_empty() {
            let sub: Vec<KeyCheck> = decided.iter().map(|&i| checks[i].clone()).collect();
            let sub_records: Vec<RecordKey> = decided.iter().map(|&i| records[i]).collect();
            let out = self.decide_keys(&sub, &sub_records, now, reads)?;
            allowed = out.allowed;
            for (&i, d) in decided.iter().zip(out.decisions) {
                decisions[i] = Some(d);
            }
        }
        Ok(AllOutcome {
            allowed,
            decisions: decisions.into_iter().flatten().collect(),
        })
    }

    /// Decides `checks` (every one [`Usage::Decide`]) all or nothing.
    fn decide_keys(
        &self,
        checks: &[KeyCheck],
        records: &[RecordKey],
        now: Nanos,
        reads: Reads,
    ) -> Result<AllOutcome, Halt> {
        if self.shared().is_some() {
            return self.check_all_shared(checks, records, now, reads);
        }
        let _held = self.key_locks.lock(records);

        // Pass 1: decide each key on a copy of its states. A key that comes
        // twice sees its first debit (the copies are kept by record).
        // Each copy with the record and the check it is written back for.
        let mut scratch: Vec<(RecordKey, &KeyCheck, SmallVec<[ItemState; 4]>)> = Vec::new();
        let mut decisions = Vec::with_capacity(checks.len());
        for (c, &record) in checks.iter().zip(records) {
            let earlier = scratch.iter().position(|(r, _, _)| *r == record);
            let mut states = match earlier {
                Some(i) => scratch[i].2.clone(),
                None => self.states_of(record, c, now, reads)?,
            };
            let (d, _) =
                c.limits
                    .stack
                    .decide_as(&mut states, now, c.cost, Hold::Immediate, c.priority);
            // A zero cost only looks: nothing to write back.
            if d.allowed && c.cost > 0 {
                match earlier {
                    Some(i) => scratch[i].2 = states,
                    None => scratch.push((record, c, states)),
                }
            }
            decisions.push(d);
        }
        let allowed = checks
            .iter()
            .zip(&decisions)
            .all(|(c, d)| d.allowed || !c.enforced);

        if !allowed {
            // Nothing is debited: the keys that would have allowed report
            // their figures as they stand.
            for ((c, &record), d) in checks.iter().zip(records).zip(decisions.iter_mut()) {
                if d.allowed {
                    // Read in pass 1 (and kept in memory since), so this
                    // waits on nothing; were one gone, a memory-only call
                    // stops here having changed nothing.
                    let mut states = self.states_of(record, c, now, reads)?;
                    *d = c
                        .limits
                        .stack
                        .decide_as(&mut states, now, 0, Hold::Immediate, c.priority)
                        .0;
                }
            }
            return Ok(AllOutcome { allowed, decisions });
        }

        // Pass 2: write the copies back. The records were read in pass 1, so
        // this waits on nothing unless one was evicted in between; it may
        // wait then (never stopping half way, as `MemoryOnly` could).
        for (record, c, states) in scratch {
            let def_id = 0;
            let tags = &c.limits.tags;
            let stack = &c.limits.stack;
            self.with_record(record, now, Reads::MayWait, |rec, now| {
                for (&t, s) in tags.iter().zip(states.iter()) {
                    *rec.state_mut(def_id, t) = s.clone();
                }
                for (item, &t) in stack.items().iter().zip(tags) {
                    rec.touch(def_id, t, item);
                }
                // Written behind, as an immediate check's debit is.
                let mut changes = Changes::new();
                changes.record(record, rec);
                let defs = Defs::Stack {
                    def_id,
                    stack,
                    tags,
                };
                self.persist(changes, defs, now, Ack::WriteBehind);
            })?;
        }
        Ok(AllOutcome { allowed, decisions })
    }

    /// A copy of the item states `c`'s limits have in `record`.
    fn states_of(
        &self,
        record: RecordKey,
        c: &KeyCheck,
        now: Nanos,
        reads: Reads,
    ) -> Result<SmallVec<[ItemState; 4]>, Halt> {
        self.with_record(record, now, reads, |rec, now| {
            // Kept in the hot tier until this call has written it back:
            // pass 2 must find it in memory, not stop half way on a read.
            rec.idle_at = rec.idle_at.max(now + 1);
            c.limits
                .tags
                .iter()
                .map(|&t| rec.state(0, t).cloned().unwrap_or_default())
                .collect()
        })
    }
}

/// How long a key's debit stays pending between the two steps of
/// [`Engine::check_all`] on a shared store. The second step follows at once;
/// this bounds only what a node that died (or lost Redis) between them
/// leaves: past it, any node touching the key drops the hold and the debit
/// stays counted, as if committed, because the key's limits are the
/// caller's inline ones, which other nodes cannot look up to give it back
/// (conservative: never an over-limit allow).
const BETWEEN_STEPS: Nanos = 10_000_000_000;

/// Rounds of tries (each of up to `placement::MAX_TRIES` writes) of the second
/// step on one record before the call fails (its holds then count until
/// [`BETWEEN_STEPS`]).
const SETTLE_ROUNDS: usize = 4;

/// A record's checks on a shared store, decided in one compare-and-set.
struct Group {
    record: RecordKey,
    /// Indices into the call's checks, in the order given.
    checks: SmallVec<[usize; 2]>,
    /// Whether this group's debits are held pending (to commit or release).
    held: bool,
}

impl<C: Clock> Engine<C> {
    /// [`Engine::check_all`] on a shared store (docs/cluster.md, "Several
    /// keys at once"): keys live in records spread over Redis's slots, so no
    /// single write takes them all. Each record is decided with its debits
    /// held pending under one reservation (a compare-and-set per record,
    /// seen at once by every node); then, if every enforced key allowed, the
    /// holds are committed, else released: all or nothing once the call
    /// answers. A single record needs one step: its write is the decision.
    fn check_all_shared(
        &self,
        checks: &[KeyCheck],
        records: &[RecordKey],
        now: Nanos,
        reads: Reads,
    ) -> Result<AllOutcome, Halt> {
        let mut groups: Vec<Group> = Vec::new();
        for (i, &record) in records.iter().enumerate() {
            match groups.iter_mut().find(|g| g.record == record) {
                Some(g) => g.checks.push(i),
                None => groups.push(Group {
                    record,
                    checks: smallvec::smallvec![i],
                    held: false,
                }),
            }
        }
        let res = self.res_of(&self.new_reservation_id(None));
        let hold = match groups.len() {
            1 => Hold::Immediate,
            _ => Hold::Reserve {
                deadline: now + BETWEEN_STEPS,
            },
        };
        let mut decisions: Vec<Option<Decision>> = vec![None; checks.len()];
        let mut allowed = true;
        for gi in 0..groups.len() {
            let g = &groups[gi];
            let limits = &checks[g.checks[0]].limits;
            let cost: u64 = g.checks.iter().map(|&i| checks[i].cost).sum();
            // A hot key (docs/cluster.md, "Hot keys"): its grants are made
            // ready first, outside every lock.
            let hot = match g.record {
                RecordKey::PolicyKey(h) => self.hot_keys.get(h),
                _ => None,
            };
            if let (Some(hk), Some(shared)) = (&hot, self.shared()) {
                hk.decided_by(0, &limits.stack, &limits.tags);
                self.prepare_hot(shared, hk, 0, &limits.stack, &limits.tags, cost, now);
            }
            // After a denial nothing more is debited: the rest only report.
            let decided = self.with_record(g.record, now, reads, |rec, now| {
                // On this node's own record of a hot key, the group's cost
                // must fit its grants (all of it: conservative for a key
                // given twice).
                let leased = match g.record {
                    RecordKey::PolicyKey(h) if rec.write_seq == LEASED_COPY => self.hot_keys.get(h),
                    _ => None,
                };
                if let Some(hk) = leased.as_ref().filter(|_| allowed && cost > 0) {
                    let (stack, tags) = (&limits.stack, &limits.tags);
                    let refusals = self.hot_refusals(hk, rec, 0, stack, tags, cost, now);
                    if !refusals.is_empty() {
                        let ds: SmallVec<[Decision; 2]> = g
                            .checks
                            .iter()
                            .map(|&i| {
                                let c = &checks[i];
                                self.hot_denial(hk, rec, 0, stack, tags, c.priority, &refusals, now)
                            })
                            .collect();
                        let allows = g.checks.iter().all(|&i| !checks[i].enforced);
                        return (ds, allows, false);
                    }
                }
                let mut out = decide_group(rec, checks, &g.checks, now, res, hold, allowed);
                if let Some(hk) = &leased {
                    if out.1 && allowed && cost > 0 {
                        self.count_hot_lines(hk, &limits.stack, &limits.tags, cost);
                    }
                    for d in out.0.iter_mut() {
                        self.hot_figures(hk, rec, 0, &limits.stack, &limits.tags, d, now);
                    }
                }
                out
            });
            // Writes of this key met other nodes' often: freeze it, so its
            // decisions go to leases, and decide a call given up for
            // conflicts again on them (nothing is held yet). Only a request
            // of one key does: a hot key's figures are the fleet's as its
            // node last heard (a second old), and a request of several keys
            // answers every key's figures, which Envoy's callers compare
            // across nodes (`envoys_rate_limit_service_is_all_or_nothing_across_nodes`).
            // A call of one key freezes it when it was itself given up,
            // not on conflicts counted of several-key requests (which a
            // look right after them would otherwise freeze).
            let gave_up = matches!(decided, Err(Halt::Failed(EngineError::Overloaded(_))));
            if let RecordKey::PolicyKey(h) = g.record
                && groups.len() == 1
                && hot.is_none()
                && gave_up
                && limits.stack.items().iter().all(leasable)
            {
                self.freeze(g.record, now);
                if gave_up && self.hot_keys.get(h).is_some() {
                    return self.check_all_shared(checks, records, now, reads);
                }
            }
            let (ds, group_allows, held) = match decided {
                Ok(x) => x,
                Err(e) => {
                    // The call fails whole: what it holds goes back now (a
                    // failed give-back counts until BETWEEN_STEPS, never
                    // allowing more than the limits).
                    let _ = self.settle_groups(checks, &groups[..gi], res, now, reads, false);
                    return Err(e);
                }
            };
            let g = &mut groups[gi];
            g.held = held;
            allowed &= group_allows;
            for (&i, d) in g.checks.iter().zip(ds) {
                decisions[i] = Some(d);
            }
        }
        // Second step: every hold committed, or released.
        self.settle_groups(checks, &groups, res, now, reads, allowed)?;
        if !allowed {
            // The keys that would have allowed report their figures as they
            // stand (their holds are given back): one more read of each.
            for g in &groups {
                let first = &checks[g.checks[0]];
                let limits = &first.limits;
                let figures = self.with_record(g.record, now, reads, |rec, now| {
                    let mut states = states_in(rec, &limits.tags);
                    let peek = limits.stack.decide_as(
                        &mut states,
                        now,
                        0,
                        Hold::Immediate,
                        first.priority,
                    );
                    peek.0
                })?;
                for &i in &g.checks {
                    if let Some(d) = decisions[i].as_mut().filter(|d| d.allowed) {
                        *d = figures.clone();
                    }
                }
            }
        }
        Ok(AllOutcome {
            allowed,
            decisions: decisions.into_iter().flatten().collect(),
        })
    }
}

impl<C: Clock> Engine<C> {
    /// Commits (`commit`) or releases what reservation `res` holds in the
    /// records of `groups`.
    fn settle_groups(
        &self,
        checks: &[KeyCheck],
        groups: &[Group],
        res: u64,
        now: Nanos,
        reads: Reads,
        commit: bool,
    ) -> Result<(), Halt> {
        let how = if commit {
            PendingEnd::Commit {
                final_cost: None,
                repriced: Repriced::EveryItem,
            }
        } else {
            PendingEnd::Release
        };
        for g in groups.iter().filter(|g| g.held) {
            let limits = &checks[g.checks[0]].limits;
            let settle = || {
                self.with_record(g.record, now, reads, |rec, at| {
                    let entries = rec.take_pending(res, None);
                    let defs = Defs::Stack {
                        def_id: 0,
                        stack: &limits.stack,
                        tags: &limits.tags,
                    };
                    settle_entries(rec, entries, defs, how, at, None);
                    rec.shared_meta_mut().held.retain(|h| h.res != res);
                    rec.drop_empty_shared_meta();
                })
            };
            // Settling cannot be refused, only outpaced: a key hot on several
            // nodes at once changes under it (3 nodes on one key: 4 calls of
            // 60 failed after 3 tries), so it tries again before giving up.
            let mut tried = settle();
            for _ in 1..SETTLE_ROUNDS {
                if tried.is_ok() {
                    break;
                }
                tried = settle();
            }
            tried?;
        }
        Ok(())
    }
}

/// Decides the checks `idx` of one record, in order (a key that comes twice
/// sees its first debit), on a copy of its states; writes the debits (held
/// under `res` for a [`Hold::Reserve`]) only if `debit` and every enforced
/// check of the group allows. Returns the decisions, whether the group
/// allows, and whether it holds anything.
fn decide_group(
    rec: &mut super::record::SubjectRecord,
    checks: &[KeyCheck],
    idx: &[usize],
    now: Nanos,
    res: u64,
    hold: Hold,
    debit: bool,
) -> (SmallVec<[Decision; 2]>, bool, bool) {
    let limits = &checks[idx[0]].limits;
    let mut states = states_in(rec, &limits.tags);
    let mut decisions = SmallVec::new();
    let mut pending = Vec::new();
    let mut allows = true;
    for &i in idx {
        let c = &checks[i];
        let (d, p) = limits
            .stack
            .decide_as(&mut states, now, c.cost, hold, c.priority);
        allows &= d.allowed || !c.enforced;
        if let Some(p) = p {
            pending.push((i, p));
        }
        decisions.push(d);
    }
    let debited = idx.iter().any(|&i| checks[i].cost > 0);
    if !(debit && allows && debited) {
        return (decisions, allows, false);
    }
    for (&t, s) in limits.tags.iter().zip(states) {
        *rec.state_mut(0, t) = s;
    }
    for (item, &t) in limits.stack.items().iter().zip(&limits.tags) {
        rec.touch(0, t, item);
    }
    let held = !pending.is_empty();
    for (i, p) in pending {
        for (item, &t) in p.items.into_iter().zip(&limits.tags) {
            rec.add_pending(PendingEntry {
                res,
                cand: i as u32,
                def_id: 0,
                tag: t,
                item,
                n: p.cost,
            });
        }
    }
    if let (true, Hold::Reserve { deadline }) = (held, hold) {
        rec.idle_at = rec.idle_at.max(deadline);
        rec.shared_meta_mut().held.push(Held {
            res,
            deadline,
            // Owner 0: inline limits no other node can look up (see
            // BETWEEN_STEPS for what that means at the deadline).
            kind: HeldKind::Check { policy: 0 },
            body: 0,
            inline: None,
            ids: Vec::new(),
            costs: Vec::new(),
            maker: 0,
        });
    }
    (decisions, allows, held)
}

/// A copy of the states of items `tags` (def_id 0) in `rec`.
fn states_in(rec: &super::record::SubjectRecord, tags: &[u32]) -> SmallVec<[ItemState; 4]> {
    tags.iter()
        .map(|&t| rec.state(0, t).cloned().unwrap_or_default())
        .collect()
}
