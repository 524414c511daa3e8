//! `POST /v1/screen`: a user's candidates, each decided over its campaign
//! chain, all-or-nothing; eligible ones reserved under one id.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::MAX_EXACT;
use crate::clock::{Clock, Nanos};
use crate::limits::budget::Levers;
use crate::limits::priority::{Priority, item_for};
use crate::limits::{Hold, Item, Probe, budget_state};
use crate::model::{EventType, Scope};
use crate::store::StoreError;

use super::chain::{
    Defs, FRESH, Locking, PendingEnd, counts_event, guard_of, lock_chain, lock_entries, opted_out,
    probe_units, settle_entries, units,
};
use super::exclusion::Exclusions;
use super::holds::{Held, HeldKind};
use super::hot::{Halt, Reads, RecordKey, waited};
use super::identities::{IdCopy, missing_identity, passes_missing};
use super::leases::{Leases, view};
use super::placement::{SeenHere, seen_in_record};
use super::record::{PendingEntry, SubjectRecord};
use super::registry::{CampaignEntry, Registry};
use super::request::{
    CandidateResult, DeniedBy, ScreenOutcome, ScreenRequest, body_hash, check_cost,
    check_reservation_id, check_ttl,
};
use super::reservations::{Answer, Begin, Claim, HeldCandidate, Reserved, footprint};
use super::{Conflict, Engine, EngineError, ReservationKind, invalid};

/// The retry_after of a denial by a node's exhausted grant: its next
/// refresh is at most a quiet period away.
const LEASE_RETRY: crate::clock::Span = 100_000_000;

/// A reservation being made: its internal number and deadline.
#[derive(Debug, Clone, Copy)]
struct Reserving {
    seq: u64,
    deadline: Nanos,
}

impl<C: Clock> Engine<C> {
    /// Screens candidates for a user (docs/semantics.md §6.4): each candidate
    /// is decided in order, all-or-nothing over its whole chain; eligible
    /// ones hold pending debits under one reservation when `reserve`.
    pub fn screen(&self, req: &ScreenRequest) -> Result<ScreenOutcome, EngineError> {
        waited(self.screen_with(req, Reads::MayWait))
    }

    /// [`Engine::screen`] if the user's record is in memory; `None` (having
    /// changed nothing) if it must be read from the store. See
    /// [`Engine::check_in_memory`].
    pub fn screen_in_memory(
        &self,
        req: &ScreenRequest,
    ) -> Option<Result<ScreenOutcome, EngineError>> {
        // With a shared store every decision calls the network: never on
        // the executor; but in owner mode a user's screen is decided from
        // the owner's memory, calling nothing while its copy is there and
        // its grants last (issue 26: no blocking hop for it).
        // Other identities' records are read, then written, one after the
        // other (`super::identities`): not from memory only, where a miss
        // half-way would leave the user's holds made.
        if !req.ids.is_empty() {
            return None;
        }
        self.in_memory_if(req.user.is_some(), || {
            self.screen_with(req, Reads::MemoryOnly)
        })
    }

    fn screen_with(&self, req: &ScreenRequest, reads: Reads) -> Result<ScreenOutcome, Halt> {
        self.check_screen(req)?;
        let idents = self.identities_used(req, self.identities("", &req.ids)?)?;
        let lifetime = check_ttl(req.ttl_ms)?;
        if let Some(id) = &req.reservation_id {
            check_reservation_id(id)?;
        }
        let now = self.now();
        self.expire_step(now, reads);
        let reg = self.registry();
        let deadline = now + lifetime;
        let user = req.user.as_ref().map(|u| self.hash(b'u', 0, u));
        // Copies of the other identities' records, decided with beside the
        // user's; the holds on them are made after (below).
        let copies = idents
            .iter()
            .map(|i| {
                Ok(IdCopy {
                    kind: i.kind,
                    rec: self.identity_copy(i.key, reads)?,
                })
            })
            .collect::<Result<Vec<_>, Halt>>()?;
        let fresh = || {
            copies
                .iter()
                .map(|c| IdCopy {
                    kind: c.kind,
                    rec: c.rec.figures_copy(),
                })
                .collect::<Vec<_>>()
        };
        let body = body_hash(req, req.reservation_id.is_some(), req.fingerprint);
        let claim = if req.reserve {
            let id = match &req.reservation_id {
                Some(id) => id.clone(),
                None => self.reservation_id_in(user.map(RecordKey::User)),
            };
            let seq = self.reservation_number(&id);
            match self.reservations.begin(&id, body, deadline, seq) {
                Begin::New { seq } => Some(Claim { id, seq }),
                Begin::Repeat(Answer::Screen(a)) => return Ok(a),
                Begin::Repeat(Answer::Check(_)) => {
                    return Err(EngineError::Conflict(Conflict::BelongsTo {
                        id,
                        kind: ReservationKind::Check,
                    })
                    .into());
                }
                Begin::Conflict(c) => return Err(EngineError::Conflict(c).into()),
                Begin::Overloaded(m) => return Err(EngineError::Overloaded(m).into()),
            }
        } else {
            None
        };
        let reserving = claim.as_ref().map(|c| Reserving {
            seq: c.seq,
            deadline,
        });
        // In regions, a user away from its home waits for the home to count
        // its last unit here (src/engine/travellers.rs).
        if let Some(u) = &req.user
            && !self.travel_may_serve(u, now)
        {
            if let Some(c) = &claim {
                self.reservations.abandon(&c.id);
            }
            return Ok(ScreenOutcome {
                reservation: None,
                results: self.travel_held(req),
            });
        }
        // Leased campaign state (a shared store): grants are refreshed
        // before any lock is taken, so a decision never waits on one.
        let chains = req.candidates.iter().filter_map(|cand| {
            let chain = reg.chain(&cand.campaign)?;
            Some((&chain[..], cand.cost.unwrap_or(1)))
        });
        let leases = match self.leases_for(chains, now, reads) {
            Ok(l) => l,
            // A grant needs a refresh (a Redis call): not on the executor.
            // Nothing was held yet.
            Err(h) => {
                if let Some(c) = &claim {
                    self.reservations.abandon(&c.id);
                }
                return Err(h);
            }
        };
        let shadow_all = self.options.shadow;
        let run = |user_rec: Option<&mut SubjectRecord>, now: Nanos| {
            let mut ids = fresh();
            screen_candidates(
                &reg, req, user_rec, &mut ids, now, reserving, leases, shadow_all,
            )
        };
        // The record a screen decides in: its user's, or with a shared store
        // a user-less reservation's own (it holds nothing there but the
        // reservation, so any node settles it: docs/cluster.md).
        let record = match (user, reserving) {
            (Some(k), _) => Some((RecordKey::User(k), true)),
            (None, Some(r)) => self.userless_record_of(r.seq).map(|k| (k, false)),
            (None, None) => None,
        };
        // With a shared store, the last decision that held something: if
        // its write's answer is lost (it may have been applied), the
        // reservation is kept as made (below).
        let mut last_held: Option<(Vec<CandidateResult>, Vec<HeldCandidate>)> = None;
        let decided = match record {
            Some((key, of_user)) => self.with_record(key, now, reads, |rec, now| {
                // A shared store may run this again (the record moved under
                // it): what an earlier run held campaign-side goes back
                // first, so a reservation holds once.
                if let Some(r) = reserving.filter(|_| self.placement.may_decide_again()) {
                    undo_campaign_holds(&reg, req, r.seq, now);
                    last_held = None;
                    // The id reserved already, on another node or by this
                    // one in a write whose answer was lost: the record is
                    // the cluster's table of reservations, not this node's.
                    if let Some(seen) = seen_in_record(rec, r.seq) {
                        // What denies the candidates now, decided here on
                        // the copy just checked: no second Redis call.
                        let user_rec = of_user.then_some(&mut *rec);
                        let now_results = screen_candidates(
                            &reg,
                            req,
                            user_rec,
                            &mut fresh(),
                            now,
                            None,
                            None,
                            shadow_all,
                        )
                        .0;
                        return Err((seen, now_results));
                    }
                }
                let (results, held) = run(of_user.then_some(&mut *rec), now);
                if let Some(r) = reserving.filter(|_| !held.is_empty())
                    // Other nodes must know what the debits belong to.
                    && self.keep_hold(rec, || Held {
                        res: r.seq,
                        deadline: r.deadline,
                        kind: HeldKind::Screen {
                            candidates: held.iter().map(|c| (c.index, c.chain[0].id)).collect(),
                        },
                        body,
                        inline: None,
                        // Those it may hold on, known before they are
                        // asked: no second write of this record after.
                        ids: idents.iter().map(|i| i.key).collect(),
                        // What another node that commits it charges.
                        costs: held
                            .iter()
                            .filter_map(|c| {
                                let cost = req.candidates.get(c.index as usize)?.cost?;
                                (cost != 1).then_some((c.index, cost))
                            })
                            .collect(),
                        maker: match req.reservation_id {
                            Some(_) => self.id_nonce,
                            None => 0,
                        },
                    })
                {
                    // Kept until its deadline, and its settled id a grace
                    // after. A user record whose screen held campaign-side
                    // only (a budget, no user cap) had no debit to keep it:
                    // in owner mode, where the copy in memory is the only
                    // one, the hot tier dropped it at once, and its commit
                    // and release answered 404 (issue 47's kill test).
                    rec.idle_at = rec.idle_at.max(r.deadline);
                    if req.reservation_id.is_some() {
                        last_held = Some((results.clone(), held.clone()));
                    }
                }
                Ok((results, held))
            }),
            None => Ok(Ok(run(None, now))),
        };
        let decided = match decided {
            Ok(Err((seen, now_results))) => {
                // Nothing was written and nothing held here: this node's
                // claim of the id goes.
                if let Some(c) = &claim {
                    self.reservations.abandon(&c.id);
                }
                let id = claim.map(|c| c.id).unwrap_or_default();
                return match seen {
                    SeenHere::Held {
                        body: held_body,
                        kind: HeldKind::Screen { candidates },
                    } if held_body == body => Ok(screen_repeat(id, now_results, &candidates)),
                    SeenHere::Held {
                        kind: HeldKind::Check { .. },
                        ..
                    } => Err(EngineError::Conflict(Conflict::BelongsTo {
                        id,
                        kind: ReservationKind::Check,
                    })
                    .into()),
                    SeenHere::Held { .. } => {
                        Err(EngineError::Conflict(Conflict::DifferentRequest { id }).into())
                    }
                    SeenHere::Settled => {
                        Err(EngineError::Conflict(Conflict::AlreadySettled { id }).into())
                    }
                };
            }
            Ok(Ok(x)) => Ok(x),
            Err(e) => Err(e),
        };
        // A write whose answer was lost may have been applied: the
        // reservation stands as decided, as if answered (docs/cluster.md,
        // "Exactly once"). A retry on this node gets its answer from the
        // table, a commit anywhere settles it, and this node charges its
        // campaign-side holds as the record says at the deadline. Before,
        // they were given back here, and such an impression, retried and
        // committed, was charged to the user only (a budget of 5 delivered
        // 6: `a_screen_retried_after_an_unconfirmed_write_is_charged_once`).
        // Only an id the caller chose can be repeated or committed: a
        // node-made one never reached the caller, and its holds go back at
        // once (kept, they stranded up to a TTL of budget: 190 of 200
        // delivered in `leased_budgets_and_campaign_caps_hold_across_nodes`).
        if let (Err(Halt::Failed(EngineError::Store(StoreError::Unavailable(why)))), Some(c)) =
            (&decided, &claim)
            && req.reservation_id.is_some()
            && let Some((results, candidates)) = last_held.take()
        {
            let answer = Answer::Screen(ScreenOutcome {
                reservation: Some(c.id.clone()),
                results,
            });
            let reserved = Reserved::Screen {
                user,
                ids: Vec::new(),
                candidates,
            };
            let bytes = footprint(&c.id, &answer, &reserved);
            self.reservations.finish(&c.id, answer, reserved, bytes);
            if self.options.fail_open {
                // Failed open, as below, its holds kept: a caller that chose
                // the id may still commit it.
                self.stats.failed_open.fetch_add(1, Ordering::Relaxed);
                tracing::debug!("screen failed open: {why}");
                return Ok(ScreenOutcome {
                    reservation: None,
                    results: failed_open(&reg, req),
                });
            }
            return Err(EngineError::Store(StoreError::Unavailable(why.clone())).into());
        }
        let (mut results, mut candidates) = match decided {
            Ok(x) => x,
            Err(Halt::Failed(EngineError::Store(StoreError::Unavailable(why))))
                if self.options.fail_open =>
            {
                // An ad server that prefers serving: every known campaign is
                // eligible, nothing is reserved (docs/cluster.md, faults).
                if let Some(c) = &claim {
                    undo_campaign_holds(&reg, req, c.seq, now);
                    self.reservations.abandon(&c.id);
                }
                self.stats.failed_open.fetch_add(1, Ordering::Relaxed);
                tracing::debug!("screen failed open: {why}");
                return Ok(ScreenOutcome {
                    reservation: None,
                    results: failed_open(&reg, req),
                });
            }
            Err(e) => {
                if let Some(c) = &claim {
                    // The record was not written: nothing is held (on one
                    // node the decision never ran: nothing to give back).
                    undo_campaign_holds(&reg, req, c.seq, now);
                    self.reservations.abandon(&c.id);
                }
                return Err(e);
            }
        };
        // The holds on the other identities' records, each under its own
        // lock; a candidate one no longer allows is dropped.
        let mut ids = Vec::new();
        if let (Some(c), Some(r)) = (&claim, reserving)
            && !idents.is_empty()
            && !candidates.is_empty()
        {
            let records: Vec<RecordKey> = record.iter().map(|(k, _)| *k).collect();
            match self.hold_identities(
                req,
                &idents,
                &mut results,
                &mut candidates,
                &records,
                (r.seq, r.deadline, body),
                now,
                reads,
            ) {
                Ok(held) => ids = held,
                Err(e) => {
                    self.reservations.abandon(&c.id);
                    return Err(e);
                }
            }
        }
        // Counted once the screen stands (a shared store may have run the
        // decision more than once).
        count(&reg, &results);
        let reservation = match claim {
            Some(c) if !candidates.is_empty() => {
                let out = ScreenOutcome {
                    reservation: Some(c.id.clone()),
                    results,
                };
                let answer = Answer::Screen(out.clone());
                let reserved = Reserved::Screen {
                    user,
                    ids,
                    candidates,
                };
                let bytes = footprint(&c.id, &answer, &reserved);
                self.reservations.finish(&c.id, answer, reserved, bytes);
                self.travel_screened(req, &c.id, &out.results, deadline);
                return Ok(out);
            }
            Some(c) => {
                self.reservations.abandon(&c.id);
                None
            }
            None => None,
        };
        Ok(ScreenOutcome {
            reservation,
            results,
        })
    }

    /// Checks a screen's user and candidates.
    fn check_screen(&self, req: &ScreenRequest) -> Result<(), EngineError> {
        if let Some(u) = &req.user {
            self.check_id("user", u)?;
        }
        if req.candidates.is_empty() {
            return Err(invalid("candidates", "at least one candidate is needed"));
        }
        if req.candidates.len() > self.options.max_candidates {
            return Err(invalid(
                "candidates",
                format!(
                    "at most {} candidates, got {}",
                    self.options.max_candidates,
                    req.candidates.len()
                ),
            ));
        }
        // Field names are formatted only for an error: this loop runs for every
        // candidate of every screen.
        let max = self.options.max_id_len;
        for (i, c) in req.candidates.iter().enumerate() {
            if c.campaign.is_empty() || c.campaign.len() > max {
                self.check_id(&format!("candidates[{i}].campaign"), &c.campaign)?;
            }
            if c.cost.is_some_and(|n| n > MAX_EXACT) {
                check_cost(&format!("candidates[{i}].cost"), c.cost.unwrap_or(0))?;
            }
        }
        Ok(())
    }
}

/// The answer to a screen repeated under reservation `id`, which the
/// user's record holds (made on another node, or by this one in a write
/// whose answer was lost): the `held` candidates eligible, as first
/// answered; the others denied, by what denies them now (`results`, decided
/// without holding): the record keeps which candidates it holds, ~8 bytes
/// each, not the first answer's reasons.
fn screen_repeat(
    id: String,
    mut results: Vec<CandidateResult>,
    held: &[(u32, u32)],
) -> ScreenOutcome {
    for (i, r) in results.iter_mut().enumerate() {
        if held.iter().any(|&(index, _)| index as usize == i) {
            r.eligible = true;
            r.denied_by = None;
        } else if r.eligible {
            // Denied at first (else it would be held); what denied it then
            // is not remembered, and it is not held now.
            r.eligible = false;
            r.denied_by = Some(DeniedBy {
                campaign: r.campaign.clone(),
                cap: "reserved_before".into(),
                retry_after: None,
            });
        }
    }
    ScreenOutcome {
        reservation: Some(id),
        results,
    }
}

/// Gives back what reservation `seq` holds in the campaign records of the
/// screen's candidates (a shared store's screen whose user record was not
/// written, or is decided again). Holds nothing: a no-op.
fn undo_campaign_holds(reg: &Registry, req: &ScreenRequest, seq: u64, now: Nanos) {
    let chains = req
        .candidates
        .iter()
        .filter_map(|c| reg.chain(&c.campaign))
        .flat_map(|chain| chain.iter());
    let mut guards = lock_entries(chains, Locking::Settling);
    for (_, g) in guards.iter_mut() {
        let entries = g.take_pending(seq, None);
        if !entries.is_empty() {
            settle_entries(
                g,
                entries,
                Defs::Registry(reg),
                PendingEnd::Release,
                now,
                None,
            );
        }
    }
}

/// A screen's answer when its user's record cannot be reached and
/// `fail_open` is set: every candidate of a known campaign eligible.
fn failed_open(reg: &Registry, req: &ScreenRequest) -> Vec<CandidateResult> {
    req.candidates
        .iter()
        .map(|cand| {
            let name: Arc<str> = match reg.chain(&cand.campaign) {
                Some(chain) => chain[0].name.clone(),
                None => Arc::from(cand.campaign.as_str()),
            };
            let known = reg.chain(&cand.campaign).is_some();
            CandidateResult {
                campaign: name.clone(),
                eligible: known,
                denied_by: (!known).then(|| DeniedBy {
                    campaign: name,
                    cap: "unknown_campaign".into(),
                    retry_after: None,
                }),
                would_deny: None,
                pacing: None,
            }
        })
        .collect()
}

/// The body of a screen, under the user's record lock: every candidate's
/// result, and the eligible ones when reserving.
#[allow(clippy::too_many_arguments)]
fn screen_candidates(
    reg: &Registry,
    req: &ScreenRequest,
    mut user_rec: Option<&mut SubjectRecord>,
    ids: &mut [IdCopy],
    now: Nanos,
    reserving: Option<Reserving>,
    leases: Option<&Leases>,
    shadow_all: bool,
) -> (Vec<CandidateResult>, Vec<HeldCandidate>) {
    let mut results = Vec::with_capacity(req.candidates.len());
    let mut held = Vec::new();
    let mut exclusions = Exclusions::default();
    let rules = reg.screen_rules;
    if let Some(r) = reserving {
        held.reserve(req.candidates.len());
        if let Some(u) = user_rec.as_deref_mut() {
            u.reserve_pending(r.seq, req.candidates.len());
        }
    }
    for (ci, cand) in req.candidates.iter().enumerate() {
        let Some(chain) = reg.chain(&cand.campaign) else {
            let name: Arc<str> = Arc::from(cand.campaign.as_str());
            results.push(CandidateResult {
                campaign: name.clone(),
                eligible: false,
                denied_by: Some(DeniedBy {
                    campaign: name,
                    cap: "unknown_campaign".into(),
                    retry_after: None,
                }),
                would_deny: None,
                pacing: None,
            });
            continue;
        };
        let cost = cand.cost.unwrap_or(1);
        let index = ci as u32;
        // Excluded within the screen: denied before its items are asked,
        // holding nothing. In shadow mode, as if enforced: nothing held,
        // and an enforced item of the chain may still deny for real.
        let excluded = if rules {
            exclusions.excluded(chain)
        } else {
            None
        };
        let excluded_by = |(by, cap): (&CampaignEntry, String)| DeniedBy {
            campaign: by.name.clone(),
            cap,
            retry_after: None,
        };
        let verdict = match excluded {
            Some(x) if !in_shadow(x.0, shadow_all) => Verdict::Denied(excluded_by(x)),
            excluded => {
                let verdict = decide_chain(
                    chain,
                    user_rec.as_deref_mut(),
                    ids,
                    now,
                    cost,
                    index,
                    reserving.filter(|_| excluded.is_none()),
                    leases,
                    shadow_all,
                    req.priority,
                );
                match (excluded, verdict) {
                    (Some(_), Verdict::Denied(real)) => Verdict::Denied(real),
                    (Some(x), Verdict::Allowed(l) | Verdict::WouldDeny(_, l)) => {
                        Verdict::WouldDeny(excluded_by(x), l)
                    }
                    (None, verdict) => verdict,
                }
            }
        };
        if rules && matches!(verdict, Verdict::Allowed(_)) {
            exclusions.take(chain);
        }
        let (denied, would_deny, pacing) = match verdict {
            Verdict::Allowed(l) => (None, None, l),
            Verdict::Denied(d) => (Some(d), None, None),
            Verdict::WouldDeny(d, l) => (None, Some(d), l),
        };
        // The chain starts with the candidate's own entry.
        let name = chain[0].name.clone();
        // A shadow denial is held too, holding nothing: its commit works,
        // and debits nothing, as enforcing would have.
        if denied.is_none() && reserving.is_some() {
            held.push(HeldCandidate {
                index,
                campaign: name.clone(),
                chain: chain.clone(),
            });
        }
        results.push(CandidateResult {
            campaign: name,
            eligible: denied.is_none(),
            denied_by: denied,
            would_deny,
            pacing,
        });
    }
    if let (Some(u), Some(r)) = (user_rec, reserving) {
        u.drop_empty_pending(r.seq);
    }
    (results, held)
}

/// What a candidate's chain came to; an eligible one with its pacing
/// levers, if a campaign of its chain asks for them.
enum Verdict {
    Allowed(Option<Levers>),
    /// By the first denying cap of an enforced campaign, in chain order.
    Denied(DeniedBy),
    /// Only campaigns in shadow mode deny: the first of their denying caps.
    WouldDeny(DeniedBy, Option<Levers>),
}

/// The pacing levers of a chain (docs/pacing.md, "Levers"): of each
/// campaign with `pacing_levers`, its budget's as of `now`, the tightest of
/// them; with a shared store, as the fleet's spend moves them (`leases`).
fn chain_levers(
    chain: &[Arc<CampaignEntry>],
    guards: &mut [(u32, std::sync::MutexGuard<'_, SubjectRecord>)],
    now: Nanos,
    leases: Option<&Leases>,
) -> Option<Levers> {
    let mut out: Option<Levers> = None;
    for e in chain.iter().filter(|e| e.def.pacing_levers == Some(true)) {
        let Some(i) = e.compiled.items.iter().position(|c| c.name == "budget") else {
            continue;
        };
        let Item::Budget(b) = &e.compiled.items[i].item else {
            continue;
        };
        let Some(rec) = guard_of(guards, e.id) else {
            continue;
        };
        let t = e.tags[i];
        let st = rec.state(e.id, t).unwrap_or(&FRESH);
        let l = match leases {
            Some(l) => l.levers((e.id, t), b, st, now),
            None => b.levers(&budget_state(st), now),
        };
        out = Some(out.map_or(l, |o| o.min(l)));
    }
    out
}

/// Counts a screen's results for the per-campaign metrics (and, through
/// them, the timelines' denials): eligible or would-deny on the candidate's
/// campaign, a denial on the campaign of the cap that denied; a relaxed
/// atomic add each, no lock.
fn count(reg: &Registry, results: &[CandidateResult]) {
    use std::sync::atomic::Ordering::Relaxed;
    for r in results {
        let Some(own) = reg.campaigns.get(&*r.campaign) else {
            continue;
        };
        if r.would_deny.is_some() {
            own.counts.would_deny.fetch_add(1, Relaxed);
        } else if r.eligible {
            own.counts.eligible.fetch_add(1, Relaxed);
        }
        if let Some(d) = &r.denied_by {
            let Some(e) = reg.campaigns.get(&*d.campaign) else {
                continue;
            };
            // A missing identity's denial (`unknown_household`) counts on
            // the first cap of that kind: it is that cap's rule that denied.
            let missing_kind = d.cap.strip_prefix("unknown_");
            if d.cap == "unknown_user" {
                e.counts.unknown_user.fetch_add(1, Relaxed);
            } else if d.cap == "flight" {
                e.counts.out_of_flight.fetch_add(1, Relaxed);
            } else if d.cap == "schedule" {
                e.counts.off_schedule.fetch_add(1, Relaxed);
            } else if let Some(i) = e.compiled.items.iter().position(|c| {
                c.name == d.cap
                    || (missing_kind.is_some() && missing_kind == Some(c.scope.as_str()))
            }) && let Some(n) = e.counts.denied.get(i)
            {
                n.fetch_add(1, Relaxed);
            }
        }
    }
}

/// Whether campaign `e`'s denials are only counted (docs/semantics.md,
/// "Shadow mode").
fn in_shadow(e: &CampaignEntry, shadow_all: bool) -> bool {
    shadow_all || e.def.mode == Some(crate::model::Mode::Shadow)
}

/// Decides candidate `cand` over its chain, all-or-nothing; when
/// `reserving` and it is allowed, debits it as pending. A denial by a
/// campaign in shadow mode does not stop the probe: an enforced cap further
/// on may deny for real.
/// With a shared store, `leases` holds this node's grants: a leased item
/// allows only within them (see [`super::leases`]).
#[allow(clippy::too_many_arguments)]
fn decide_chain(
    chain: &[Arc<CampaignEntry>],
    mut user: Option<&mut SubjectRecord>,
    ids: &mut [IdCopy],
    now: Nanos,
    cost: u64,
    cand: u32,
    reserving: Option<Reserving>,
    leases: Option<&Leases>,
    shadow_all: bool,
    class: Priority,
) -> Verdict {
    let mut shadowed: Option<DeniedBy> = None;
    // Out of a flight of the chain (its own, or an ancestor's: the
    // tightest applies, docs/semantics.md §6.7): ineligible, before any
    // cap is asked. Before the start, a retry may pass at the start.
    for e in chain {
        if let Some((start, end)) = e.compiled.flight
            && !(start..end).contains(&now)
        {
            let d = DeniedBy {
                campaign: e.name.clone(),
                cap: "flight".into(),
                retry_after: (now < start).then(|| crate::clock::Span::from(start - now)),
            };
            if !in_shadow(e, shadow_all) {
                return Verdict::Denied(d);
            }
            shadowed.get_or_insert(d);
        }
        // Off its schedule's hours (docs/semantics.md §6.8), likewise; a
        // retry may pass when its next span opens.
        if let Some(s) = &e.compiled.schedule
            && !s.open_at(now)
        {
            let d = DeniedBy {
                campaign: e.name.clone(),
                cap: "schedule".into(),
                retry_after: s.next_open(now).map(|t| crate::clock::Span::from(t - now)),
            };
            if !in_shadow(e, shadow_all) {
                return Verdict::Denied(d);
            }
            shadowed.get_or_insert(d);
        }
    }
    if user.is_none() {
        for e in chain {
            if e.compiled.unknown_user == crate::model::UnknownUser::Deny {
                let d = DeniedBy {
                    campaign: e.name.clone(),
                    cap: "unknown_user".into(),
                    retry_after: None,
                };
                if !in_shadow(e, shadow_all) {
                    return Verdict::Denied(d);
                }
                shadowed.get_or_insert(d);
            }
        }
    }
    let mut guards = lock_chain(chain, Locking::Deciding);
    // Probe every item first; nothing changes unless all allow.
    for e in chain {
        for (i, cap) in e.compiled.items.iter().enumerate() {
            if opted_out(chain, e, i) {
                continue;
            }
            let t = e.tags[i];
            let rec: &SubjectRecord = match cap.scope {
                Scope::User => match user.as_deref() {
                    Some(u) => u,
                    None => continue,
                },
                Scope::Campaign => match guard_of(&mut guards, e.id) {
                    Some(r) => r,
                    None => continue,
                },
                Scope::Id(k) => match ids.iter().find(|c| c.kind == k) {
                    Some(c) => &c.rec,
                    None if passes_missing(cap.missing) => continue,
                    None => {
                        let d = missing_identity(e, k);
                        if !in_shadow(e, shadow_all) {
                            return Verdict::Denied(d);
                        }
                        shadowed.get_or_insert(d);
                        continue;
                    }
                },
            };
            let st = rec.state(e.id, t).unwrap_or(&FRESH);
            let n = probe_units(cap, cost);
            // As the request's class sees the cap (docs/semantics.md §2.5);
            // the debit below is the cap's own, whose state all share.
            let seen = item_for(&cap.item, cap.classes.as_ref(), class);
            // A throttle leased from a shared store draws with the fleet's
            // controller (below), not this node's record's: that one sees
            // a node's share of the spend.
            let fleet_throttle = match (leases, seen) {
                (Some(l), Item::Budget(b)) if cap.scope == Scope::Campaign && b.throttles() => {
                    Some((l, b))
                }
                _ => None,
            };
            let p = match fleet_throttle {
                Some((_, b)) => Probe::plain(b.fits(&budget_state(st), now, n)),
                None => seen.probe(st, now, n),
            };
            let leased_out = match leases {
                Some(l) if cap.scope == Scope::Campaign => {
                    view(&cap.item, st, rec.pending_on(e.id, t), now).and_then(|v| {
                        let key = (crate::engine::leases::Leased::Campaign(e.id), t, v.start);
                        (!l.allows(key, &v, n, now)).then(|| l.retry_after(key, now))
                    })
                }
                _ => None,
            };
            if let Some(line_retry) = leased_out {
                // This node's grant has no room: another node may have
                // some; a retry soon may find a refreshed grant here. A
                // token line knows when it has a unit more: then.
                let d = DeniedBy {
                    campaign: e.name.clone(),
                    cap: cap.name.clone(),
                    retry_after: Some(line_retry.map_or(LEASE_RETRY, crate::clock::Span::from)),
                };
                if !in_shadow(e, shadow_all) {
                    return Verdict::Denied(d);
                }
                shadowed.get_or_insert(d);
                continue;
            }
            let thrown = fleet_throttle
                .is_some_and(|(l, b)| p.allowed && !l.throttle_passes((e.id, t), b, st, now, n));
            if !p.allowed || thrown {
                let d = DeniedBy {
                    campaign: e.name.clone(),
                    cap: cap.name.clone(),
                    retry_after: seen.retry(st, &p, now, n),
                };
                if !in_shadow(e, shadow_all) {
                    return Verdict::Denied(d);
                }
                shadowed.get_or_insert(d);
            }
        }
    }
    let levers = chain_levers(chain, &mut guards, now, leases);
    if let Some(d) = shadowed {
        // Enforcing would have denied: nothing is debited or held.
        return Verdict::WouldDeny(d, levers);
    }
    let Some(Reserving { seq, deadline }) = reserving else {
        return Verdict::Allowed(levers);
    };
    for e in chain {
        for (i, cap) in e.compiled.items.iter().enumerate() {
            if !counts_event(chain, e, i, EventType::IMPRESSION) {
                continue;
            }
            let t = e.tags[i];
            let rec: &mut SubjectRecord = match cap.scope {
                Scope::User => match user.as_deref_mut() {
                    Some(u) => u,
                    None => continue,
                },
                Scope::Campaign => match guard_of(&mut guards, e.id) {
                    Some(r) => r,
                    None => continue,
                },
                // A copy: what this screen's later candidates see; the
                // record's own holds are made after (`hold_identities`).
                Scope::Id(k) => match ids.iter_mut().find(|c| c.kind == k) {
                    Some(c) => &mut c.rec,
                    None => continue,
                },
            };
            let n = units(&cap.item, cost);
            let st = rec.state_mut(e.id, t);
            let p = cap.item.apply(st, now, n, Hold::Reserve { deadline });
            rec.add_pending(PendingEntry {
                res: seq,
                cand,
                def_id: e.id,
                tag: t,
                item: p,
                n,
            });
            rec.touch(e.id, t, &cap.item);
            rec.idle_at = rec.idle_at.max(deadline);
        }
    }
    Verdict::Allowed(levers)
}
