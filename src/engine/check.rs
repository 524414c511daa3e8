//! `POST /v1/check`: a request decided against a named policy or inline
//! limits, debited at once or reserved.

use std::sync::Arc;

use smallvec::SmallVec;

use crate::clock::Clock;
use crate::limits::stack::{Pending, Stack};
use crate::limits::{Hold, Item, ItemState};

use super::chain::Defs;
use super::holds::{Held, HeldKind};
use super::hot::{Halt, Reads, RecordKey, waited};
use super::leases::leasable;
use super::persist::{Ack, Changes};
use super::placement::{LEASED_COPY, SeenHere, seen_in_record};
use super::record::PendingEntry;
use super::request::{
    CheckOutcome, CheckRequest, CheckTarget, body_hash, check_cost, check_reservation_id,
    check_ttl, compile_inline,
};
use super::reservations::{Answer, Begin, Claim, Reserved, footprint};
use super::{Conflict, Engine, EngineError, ReservationKind};
use crate::store::StoreError;

/// What a check is decided by: the stack, whose counters they are, and
/// their tags.
struct Target {
    stack: Arc<Stack>,
    def_id: u32,
    tags: Vec<u32>,
    /// Hash namespace of the key: named policy or inline limits.
    namespace: u8,
    /// Shadow mode: the policy's own, or the whole service's.
    shadow: bool,
    /// A named policy's decision counts (per-policy metrics).
    counts: Option<Arc<super::registry::PolicyCounts>>,
}

impl<C: Clock> Engine<C> {
    /// Decides a request against a named policy or inline limits
    /// (docs/semantics.md §3; reserving: §4.1).
    pub fn check(&self, req: &CheckRequest) -> Result<CheckOutcome, EngineError> {
        waited(self.check_with(req, Reads::MayWait))
    }

    /// [`Engine::check`] if it can be decided without waiting on disk (the
    /// key's record is in memory, as it is for any key used lately, or the
    /// store can answer from memory, as RocksDB's bloom filters do for a new
    /// key); `None` otherwise, having changed nothing — call `check` then,
    /// where waiting on disk is fine. An async server decides on its
    /// executor this way and moves only misses to a blocking thread.
    pub fn check_in_memory(&self, req: &CheckRequest) -> Option<Result<CheckOutcome, EngineError>> {
        // With a shared store every decision calls the network: never on
        // the executor.
        self.in_memory_if(false, || self.check_with(req, Reads::MemoryOnly))
    }

    fn check_with(&self, req: &CheckRequest, reads: Reads) -> Result<CheckOutcome, Halt> {
        self.check_id("key", &req.key)?;
        check_cost("cost", req.cost)?;
        let lifetime = check_ttl(req.ttl_ms)?;
        if let Some(id) = &req.reservation_id {
            check_reservation_id(id)?;
        }
        let now = self.now();
        self.expire_step(now, reads);
        let Target {
            stack,
            def_id,
            tags,
            namespace,
            shadow,
            counts,
        } = self.target(&req.target)?;
        let key = self.hash(namespace, def_id, &req.key);
        let record = RecordKey::PolicyKey(key);
        // With a shared store, an inline check's hold keeps its limits.
        let inline = self.inline_kept(
            &req.target,
            def_id,
            req.reserve,
            req.reserve && req.cost > 0,
        )?;
        // A zero-cost reserve is a peek: no reservation (docs/semantics.md
        // §4.1).
        let body = body_hash(req, req.reservation_id.is_some(), req.fingerprint);
        let claim = if req.reserve && req.cost > 0 {
            let id = match &req.reservation_id {
                Some(id) => id.clone(),
                None => self.reservation_id_in(Some(record)),
            };
            let seq = self.reservation_number(&id);
            match self.reservations.begin(&id, body, now + lifetime, seq) {
                Begin::New { seq } => Some(Claim { id, seq }),
                Begin::Repeat(Answer::Check(a)) => return Ok(*a),
                Begin::Repeat(Answer::Screen(_)) => {
                    return Err(EngineError::Conflict(Conflict::BelongsTo {
                        id,
                        kind: ReservationKind::Screen,
                    })
                    .into());
                }
                Begin::Conflict(c) => return Err(EngineError::Conflict(c).into()),
                Begin::Overloaded(m) => return Err(EngineError::Overloaded(m).into()),
            }
        } else {
            None
        };
        // A hot key (docs/cluster.md, "Hot keys"): its grants are made
        // ready first, outside every lock.
        let hot = self.hot_keys.get(key);
        if let (Some(hk), Some(shared)) = (&hot, self.shared()) {
            hk.decided_by(def_id, &stack, &tags);
            self.prepare_hot(shared, hk, def_id, &stack, &tags, req.cost, now);
        }
        // The decision last written with a hold under the caller's id: if
        // that write's answer is lost, it may have been applied.
        let mut last_held = None;
        let decided = self.with_record(record, now, reads, |rec, now| {
            // The id reserved already, on another node or by this one in a
            // write whose answer was lost: answered from the record, never
            // held twice.
            // (Only a shared record keeps reservations: on one node, none.)
            if let Some(c) = claim.as_ref()
                && let Some(seen) = seen_in_record(rec, c.seq)
            {
                let id = c.id.clone();
                return Err((
                    c.id.clone(),
                    match seen {
                        SeenHere::Held {
                            body: b,
                            kind: HeldKind::Check { .. },
                        } if b == body => {
                            // The figures as they are now (a peek), allowed as
                            // first answered: the record keeps the hold, not
                            // the first answer's figures.
                            let mut states: SmallVec<[ItemState; 4]> = tags
                                .iter()
                                .map(|&t| rec.state(def_id, t).cloned().unwrap_or_default())
                                .collect();
                            let (mut d, _) =
                                stack.decide_as(&mut states, now, 0, Hold::Immediate, req.priority);
                            d.allowed = true;
                            d.retry_after = None;
                            Ok(Box::new(d))
                        }
                        SeenHere::Held {
                            kind: HeldKind::Screen { .. },
                            ..
                        } => Err(Conflict::BelongsTo {
                            id,
                            kind: ReservationKind::Screen,
                        }),
                        SeenHere::Held { .. } => Err(Conflict::DifferentRequest { id }),
                        SeenHere::Settled => Err(Conflict::AlreadySettled { id }),
                    },
                ));
            }
            // On this node's own record of a hot key, each leased item
            // allows within its grant only.
            let leased = (rec.write_seq == LEASED_COPY)
                .then(|| self.hot_keys.get(key))
                .flatten();
            // A zero cost only looks (docs/semantics.md §4.1): nothing to grant.
            if let Some(hk) = leased.as_ref().filter(|_| req.cost > 0) {
                let refusals = self.hot_refusals(hk, rec, def_id, &stack, &tags, req.cost, now);
                if !refusals.is_empty() {
                    return Ok(self.hot_denial(
                        hk,
                        rec,
                        def_id,
                        &stack,
                        &tags,
                        req.priority,
                        &refusals,
                        now,
                    ));
                }
            }
            let hold = match &claim {
                Some(_) => Hold::Reserve {
                    deadline: now + lifetime,
                },
                None => Hold::Immediate,
            };
            let mut states: SmallVec<[ItemState; 4]> = tags
                .iter()
                .map(|&t| std::mem::take(rec.state_mut(def_id, t)))
                .collect();
            let (mut decision, pending) =
                stack.decide_as(&mut states, now, req.cost, hold, req.priority);
            for (&t, s) in tags.iter().zip(states) {
                *rec.state_mut(def_id, t) = s;
            }
            for (item, &t) in stack.items().iter().zip(&tags) {
                rec.touch(def_id, t, item);
            }
            if let (Some(Pending { cost, items }), Some(claim)) = (pending, &claim) {
                for (p, &t) in items.into_iter().zip(&tags) {
                    rec.add_pending(PendingEntry {
                        res: claim.seq,
                        cand: 0,
                        def_id,
                        tag: t,
                        item: p,
                        n: cost,
                    });
                }
                rec.idle_at = rec.idle_at.max(now + lifetime);
                let kept = self.keep_hold(rec, || Held {
                    res: claim.seq,
                    deadline: now + lifetime,
                    kind: HeldKind::Check { policy: def_id },
                    body,
                    inline: inline.clone(),
                    ids: Vec::new(),
                    costs: Vec::new(),
                    maker: 0,
                });
                if kept && req.reservation_id.is_some() {
                    last_held = Some(decision.clone());
                }
            } else if decision.allowed && req.cost > 0 {
                // An immediate debit is written behind: no one waits for it.
                let mut changes = Changes::new();
                changes.record(record, rec);
                let defs = Defs::Stack {
                    def_id,
                    stack: &stack,
                    tags: &tags,
                };
                self.persist(changes, defs, now, Ack::WriteBehind);
            }
            if let Some(hk) = &leased {
                if decision.allowed && req.cost > 0 {
                    self.count_hot_lines(hk, &stack, &tags, req.cost);
                }
                self.hot_figures(hk, rec, def_id, &stack, &tags, &mut decision, now);
            }
            Ok(decision)
        });
        // Writes of this key met other nodes' often this second: freeze it,
        // so that its decisions go to leases (`placement/leased.rs`). A
        // reserve, or an item that cannot be leased, keeps it as it is.
        let gave_up = matches!(decided, Err(Halt::Failed(EngineError::Overloaded(_))));
        if hot.is_none()
            && claim.is_none()
            && self.shared().is_some()
            && (gave_up || self.hot_keys.heated(key, now))
            && stack.items().iter().all(leasable)
        {
            self.freeze(record, now);
            // Given up for conflicts, decided again on leases.
            if gave_up && self.hot_keys.get(key).is_some() {
                return self.check_with(req, reads);
            }
        }
        let mut decision = match decided {
            Ok(Ok(d)) => d,
            Ok(Err((id, seen))) => {
                // Nothing was written or held here: this node's claim goes.
                self.reservations.abandon(&id);
                return match seen {
                    Ok(decision) => Ok(CheckOutcome {
                        would_deny: false,
                        reservation: Some(id),
                        decision: *decision,
                        stack,
                    }),
                    Err(conflict) => Err(EngineError::Conflict(conflict).into()),
                };
            }
            Err(e) => {
                match (&e, &claim, last_held) {
                    // A write whose answer was lost may have been applied:
                    // the reservation stands as decided, as a screen's does
                    // (screen.rs; docs/cluster.md, "Exactly once"). A retry
                    // on this node gets its answer from the table, and a
                    // commit or release here settles it. Given up, the
                    // retry was answered from the record and the release
                    // was 404, the slot held until the TTL
                    // (`a_check_retried_after_an_unconfirmed_write_can_be_released`).
                    (
                        Halt::Failed(EngineError::Store(StoreError::Unavailable(_))),
                        Some(c),
                        Some(decision),
                    ) => {
                        let out = CheckOutcome {
                            would_deny: false,
                            reservation: Some(c.id.clone()),
                            decision,
                            stack: stack.clone(),
                        };
                        self.keep(&c.id, out, key, def_id, tags);
                    }
                    (_, Some(c), _) => self.reservations.abandon(&c.id),
                    (_, None, _) => {}
                }
                return Err(e);
            }
        };
        // Shadow mode: the denial was decided (nothing debited, nothing
        // held) and is answered allowed; a reserve gets its id, holding
        // nothing, so the caller's commit or release works as ever.
        let would_deny = shadow && !decision.allowed;
        if let Some(c) = &counts {
            use std::sync::atomic::Ordering::Relaxed;
            match (would_deny, decision.allowed) {
                (true, _) => c.would_deny.fetch_add(1, Relaxed),
                (false, true) => c.allowed.fetch_add(1, Relaxed),
                (false, false) => c.denied.fetch_add(1, Relaxed),
            };
            if let Some(i) = stack
                .items()
                .iter()
                .position(|i| matches!(i, Item::Adaptive(_)))
            {
                let limit = decision.items.get(i).map_or(0, |f| f.limit);
                c.adaptive_limit.store(limit.saturating_add(1), Relaxed);
            }
        }
        if would_deny {
            decision.allowed = true;
            decision.retry_after = None;
        }
        let out = CheckOutcome {
            would_deny,
            reservation: claim
                .as_ref()
                .filter(|_| decision.allowed)
                .map(|c| c.id.clone()),
            decision,
            stack: stack.clone(),
        };
        match claim {
            Some(c) if out.decision.allowed => self.keep(&c.id, out.clone(), key, def_id, tags),
            // A denied reserve creates nothing.
            Some(c) => self.reservations.abandon(&c.id),
            None => {}
        }
        Ok(out)
    }

    /// Keeps a check's reservation `id`, answered `out`: a retry gets the
    /// answer, and a commit or release here settles its holds.
    fn keep(&self, id: &str, out: CheckOutcome, key: u128, def_id: u32, tags: Vec<u32>) {
        let reserved = Reserved::Check {
            key,
            def_id,
            stack: out.stack.clone(),
            tags,
        };
        let answer = Answer::Check(Box::new(out));
        let bytes = footprint(id, &answer, &reserved);
        self.reservations.finish(id, answer, reserved, bytes);
    }

    /// The stack a check's target names, or the inline one compiled.
    fn target(&self, target: &CheckTarget) -> Result<Target, EngineError> {
        match target {
            CheckTarget::Policy(name) => {
                let reg = self.registry();
                let Some(p) = reg.policies.get(name) else {
                    return Err(EngineError::NotFound(format!("no policy named {name:?}")));
                };
                Ok(Target {
                    stack: p.stack.clone(),
                    def_id: p.id,
                    tags: p.tags.clone(),
                    namespace: b'p',
                    shadow: self.options.shadow || p.def.mode == Some(crate::model::Mode::Shadow),
                    counts: Some(p.counts.clone()),
                })
            }
            CheckTarget::Inline(limits) => {
                let c = compile_inline(limits)?;
                Ok(Target {
                    stack: c.stack.clone(),
                    def_id: 0,
                    tags: c.tags.clone(),
                    namespace: b'i',
                    shadow: self.options.shadow,
                    counts: None,
                })
            }
            CheckTarget::Compiled(c) => Ok(Target {
                stack: c.stack.clone(),
                def_id: 0,
                tags: c.tags.clone(),
                namespace: b'i',
                shadow: self.options.shadow,
                counts: None,
            }),
        }
    }
}
