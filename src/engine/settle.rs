//! Settling reservations: commit (with late commits), release, and expiry
//! at the deadline.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use smallvec::SmallVec;

use crate::clock::{Clock, Nanos};
use crate::limits::adaptive::Sample;
use crate::store::Receipt;

use super::chain::{
    Defs, Locking, PendingEnd, Repriced, guard_of, lock_chain, lock_entries, settle_entries,
};
use super::hot::{Halt, Reads, RecordKey, waited};
use super::persist::{Ack, Changes};
use super::placement::{InRecord, RecordedEnd};
use super::record::SubjectRecord;
use super::request::{
    CommitOutcome, CommitRequest, Event, Outcome, check_cost, check_reservation_id,
};
use super::reservations::{
    Due, Ending, FirstResult, HeldCandidate, Reserved, Settle, Settlement, commit_winners,
};
use super::{Engine, EngineError};

/// Most reservations a request expires before it is handled (the sweeper
/// expires the rest): see [`Engine::expire_step`].
pub const EXPIRE_BATCH: usize = 16;

/// Reservations the sweeper takes out of the table per hold of its lock.
pub const SWEEP_BATCH: usize = 64;

/// After a failed read of how a reservation was settled, the sweeper reads
/// again this much later.
const UNSETTLED_RETRY: Nanos = 1_000_000_000;

/// Most reservations waiting for a read of how they were settled; beyond
/// it, one whose read fails is taken as released (as every one was before
/// issue 25's R3), so a store that stays away cannot grow this without end.
/// At about 200 bytes each: 13 MB.
const MAX_UNSETTLED: usize = 65_536;

/// With a shared store, reservations past their deadline whose record
/// could not be read: another node may have committed them, so this node's
/// campaign-side holds on them stay (they count against its grants: fewer
/// units granted meanwhile, never more) until a read says how they were
/// settled.
#[derive(Default)]
pub(crate) struct Unsettled {
    due: std::sync::Mutex<std::collections::VecDeque<(Nanos, Due)>>,
}

impl Unsettled {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::VecDeque<(Nanos, Due)>> {
        self.due
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Keeps `due` for a read at `at`; gives it back if full.
    fn push(&self, at: Nanos, due: Due) -> Result<(), Due> {
        let mut q = self.lock();
        if q.len() >= MAX_UNSETTLED {
            return Err(due);
        }
        q.push_back((at, due));
        Ok(())
    }

    /// Those whose read is due at `now` (pushed in time order, so a prefix).
    fn take_due(&self, now: Nanos) -> Vec<Due> {
        let mut q = self.lock();
        let n = q.iter().take_while(|(at, _)| *at <= now).count();
        q.drain(..n).map(|(_, d)| d).collect()
    }

    /// How many wait.
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
}

/// A commit settled in memory, its writes queued: [`PendingCommit::wait`] or
/// [`PendingCommit::wait_async`] gives the outcome once they are durable.
/// Dropped unwaited (a client that went away), it still waits, blocking, so
/// that a repeat of the commit learns whether the writes made it.
#[must_use = "a commit is acknowledged only once its writes are durable"]
pub struct PendingCommit<'e> {
    outcome: CommitOutcome,
    wait: CommitWait,
    /// Counted once durable: `commits` or `late_commits`.
    counter: Option<&'e AtomicU64>,
}

enum CommitWait {
    /// Nothing left to wait for (a late commit waited for its event).
    Done,
    /// This call applied the commit: its batch (none if it wrote nothing),
    /// then the latch that answers repeats of it.
    Write(Option<Receipt>, Arc<FirstResult>),
    /// A repeat: the first call's result.
    Repeat(Arc<FirstResult>),
}

impl PendingCommit<'_> {
    /// Blocks until the commit is durable.
    pub fn wait(mut self) -> Result<CommitOutcome, EngineError> {
        match std::mem::replace(&mut self.wait, CommitWait::Done) {
            CommitWait::Done => {}
            CommitWait::Write(receipt, settled) => {
                let written = receipt.map_or(Ok(()), |r| r.wait().map_err(EngineError::from));
                settled.set(written.clone());
                written?;
            }
            CommitWait::Repeat(settled) => settled.wait()?,
        }
        self.done()
    }

    /// Awaits the commit's durability without parking a thread.
    pub async fn wait_async(mut self) -> Result<CommitOutcome, EngineError> {
        match std::mem::replace(&mut self.wait, CommitWait::Done) {
            CommitWait::Done => {}
            CommitWait::Write(receipt, settled) => {
                // The receipt stays in `self` while awaited: should this
                // future be dropped mid-way, `Drop` waits for it.
                self.wait = CommitWait::Write(receipt, settled.clone());
                let mut written = Ok(());
                if let CommitWait::Write(Some(r), _) = &self.wait
                    && let Err(e) = r.wait_async().await
                {
                    written = Err(EngineError::from(e));
                }
                settled.set(written.clone());
                self.wait = CommitWait::Done;
                written?;
            }
            CommitWait::Repeat(settled) => settled.wait_async().await?,
        }
        self.done()
    }

    fn done(mut self) -> Result<CommitOutcome, EngineError> {
        if let Some(c) = self.counter.take() {
            c.fetch_add(1, Ordering::Relaxed);
        }
        Ok(std::mem::replace(
            &mut self.outcome,
            CommitOutcome {
                reservation: String::new(),
                outcome: Outcome::Committed,
                campaigns: Vec::new(),
            },
        ))
    }
}

impl Drop for PendingCommit<'_> {
    fn drop(&mut self) {
        if let CommitWait::Write(receipt, settled) =
            std::mem::replace(&mut self.wait, CommitWait::Done)
            && !settled.is_set()
        {
            let written = receipt.map_or(Ok(()), |r| r.wait().map_err(EngineError::from));
            if written.is_ok()
                && let Some(c) = self.counter.take()
            {
                c.fetch_add(1, Ordering::Relaxed);
            }
            settled.set(written);
        }
    }
}

impl<C: Clock> Engine<C> {
    /// Releases every reservation whose deadline has passed, as of its
    /// deadline (the sweeper's call): [`SWEEP_BATCH`] at a time, so the
    /// table's lock is held for one batch (about 50 µs) at a time.
    pub fn expire(&self, now: Nanos) {
        while self.expire_up_to(now, SWEEP_BATCH, Reads::MayWait) == SWEEP_BATCH {}
        for due in self.unsettled.take_due(now) {
            self.expire_due(due, Reads::MayWait);
        }
    }

    /// Reservations past their deadline whose record could not be read yet
    /// (figures).
    pub fn unsettled_reservations(&self) -> usize {
        self.unsettled.len()
    }

    /// Releases up to [`EXPIRE_BATCH`] reservations whose deadline has
    /// passed: what a request does first. Expiry of one costs about 1.4 µs
    /// (500 000 due at once: 0.71 s), so a request pays at most about 25 µs
    /// for a backlog, which the sweeper drains; a commit or release of one
    /// still in the backlog expires it first ([`Settle::Expired`]), so no
    /// reservation is settled past its deadline.
    pub(crate) fn expire_step(&self, now: Nanos, reads: Reads) -> usize {
        // With a shared store, expiring may read records: left to the
        // sweeper and to decisions off the executor.
        if reads == Reads::MemoryOnly && !self.placement.in_memory(false) {
            return 0;
        }
        self.expire_up_to(now, EXPIRE_BATCH, reads)
    }

    fn expire_up_to(&self, now: Nanos, most: usize, reads: Reads) -> usize {
        let due = self.reservations.take_due(now, most);
        let n = due.len();
        for d in due {
            self.expire_one(d, reads);
        }
        n
    }

    /// A settle that found its reservation past the deadline expires it (as
    /// the sweeper would have) and then answers as for an unknown id.
    fn expired_is_unknown(&self, settled: Settle, reads: Reads) -> Settle {
        match settled {
            Settle::Expired {
                reserved,
                seq,
                deadline,
            } => {
                self.expire_one(
                    Due {
                        reserved,
                        seq,
                        deadline,
                    },
                    reads,
                );
                Settle::Unknown
            }
            s => s,
        }
    }

    fn expire_one(&self, due: Due, reads: Reads) {
        self.stats.expired.fetch_add(1, Ordering::Relaxed);
        self.expire_due(due, reads);
    }

    /// Releases `due` as of its deadline, or with a shared store settles its
    /// campaign-side holds as its record says (again after a failed read).
    fn expire_due(&self, due: Due, reads: Reads) {
        // With a shared store, a reservation's user-side debits are in its
        // record, and whichever node next touches it releases them as of the
        // deadline (`super::placement`). Its campaign-side holds are this
        // node's: another node may have settled it, and the record says how.
        if let Some(shared) = self.shared()
            && let Reserved::Screen {
                user, candidates, ..
            } = &*due.reserved
        {
            if !candidates.iter().any(|c| holds_campaign_side(&c.chain)) {
                return;
            }
            let record = match user {
                Some(u) => RecordKey::User(*u),
                None => self.userless_record(due.seq),
            };
            // Owner mode: a user's reservation is settled only by its owner,
            // this node (a later owner never knew it): due, it was not, and
            // no read is needed.
            let in_owner_mode = user.is_some() && self.in_owner_mode();
            let read = if in_owner_mode {
                Ok(None)
            } else {
                self.settled_as(shared, record, due.seq)
            };
            let settled = match read {
                Ok(s) => s,
                Err(e) => {
                    // Not known: it may have been committed on another node,
                    // and released here it was never charged (5 over a budget
                    // of 5: `a_failed_read_at_a_deadline_keeps_the_holds_until
                    // _the_store_answers`). Its holds stay until a read says.
                    tracing::warn!("cannot read how a reservation was settled, again in 1 s: {e}");
                    let retry_at = self.now().saturating_add(UNSETTLED_RETRY);
                    let Err(due) = self.unsettled.push(retry_at, due) else {
                        return;
                    };
                    tracing::warn!(
                        "{MAX_UNSETTLED} reservations wait for a read already: released unread"
                    );
                    let (candidates, seq, deadline) = match &*due.reserved {
                        Reserved::Screen { candidates, .. } => (candidates, due.seq, due.deadline),
                        _ => return,
                    };
                    self.settle_held(candidates, seq, &released(), deadline);
                    return;
                }
            };
            let how = settled.unwrap_or_else(released);
            self.settle_held(candidates, due.seq, &how, due.deadline);
            return;
        }
        if matches!(&*due.reserved, Reserved::Check { .. }) && self.shared().is_some() {
            return;
        }
        // A failed write of a release is not fatal: the disk copy never
        // holds pending debits. (Its records hold pending debits, so they
        // are in memory whatever `reads` says.)
        // An expired slot carries no sample: nobody measured it.
        let _ = self.settle_reserved(
            &due.reserved,
            due.seq,
            Settlement::Release,
            None,
            due.deadline,
            reads,
        );
    }

    /// Commits a reservation (docs/semantics.md §4.2, §6.5): the named
    /// winners' debits become permanent, at the final cost if given; the
    /// rest are released. Durable before it returns.
    pub fn commit(&self, id: &str, req: &CommitRequest) -> Result<CommitOutcome, EngineError> {
        self.commit_deferred(id, req)?.wait()
    }

    /// [`Engine::commit`] in two steps: this settles the reservation in
    /// memory and queues its writes; the returned [`PendingCommit`] waits for
    /// them to be durable, blocking or async. Nothing is acknowledged (to
    /// this caller or to a repeat of the same commit) before that.
    pub fn commit_deferred(
        &self,
        id: &str,
        req: &CommitRequest,
    ) -> Result<PendingCommit<'_>, EngineError> {
        waited(self.counted_commit(id, req, Reads::MayWait))
    }

    /// [`Engine::commit_deferred`] if it needs no read of the store (the
    /// reservation is live, or settled and remembered); `None`, having
    /// changed nothing, for a late commit, which may read a cold record — call
    /// `commit` then, where waiting on disk is fine.
    pub fn commit_in_memory(
        &self,
        id: &str,
        req: &CommitRequest,
    ) -> Option<Result<PendingCommit<'_>, EngineError>> {
        // With a shared store every commit calls the network (owner mode's
        // too: it writes what it commits): never on the executor.
        self.in_memory_if(false, || self.counted_commit(id, req, Reads::MemoryOnly))
    }

    /// [`Engine::commit_with`], and a commit applied here (not a repeat)
    /// counted for its user across regions (`super::travellers`).
    fn counted_commit(
        &self,
        id: &str,
        req: &CommitRequest,
        reads: Reads,
    ) -> Result<PendingCommit<'_>, Halt> {
        let p = self.commit_with(id, req, reads)?;
        if p.counter.is_some() && p.outcome.outcome == Outcome::Committed {
            self.travel_committed(id, req, &p.outcome.campaigns);
        }
        Ok(p)
    }

    fn commit_with(
        &self,
        id: &str,
        req: &CommitRequest,
        reads: Reads,
    ) -> Result<PendingCommit<'_>, Halt> {
        check_reservation_id(id)?;
        if let Some(c) = req.cost {
            check_cost("cost", c)?;
        }
        if let Some(e) = &req.event_id {
            self.check_id("event_id", e)?;
        }
        // A winner that names no campaign at all is 404 (docs/semantics.md
        // §6.5), before anything is settled; one that exists but was not
        // eligible is 400.
        {
            let reg = self.registry();
            if let Some(name) = req
                .campaigns
                .iter()
                .find(|c| !reg.campaigns.contains_key(*c))
            {
                return Err(EngineError::NotFound(format!("no campaign named {name:?}")).into());
            }
        }
        if let Some((shared, key)) = self.shared_record_of(id, req.user.as_deref()) {
            if reads == Reads::MemoryOnly {
                return Err(Halt::NotInMemory);
            }
            let how = Settlement::Commit {
                chosen: req.campaigns.as_slice(),
                final_cost: req.cost,
            };
            let (how, names, counter) =
                match self.settle_shared(shared, key, id, how, req.sample)? {
                    InRecord::Done(how, names) => (how, names, Some(&self.stats.commits)),
                    InRecord::Repeat(how, names) => (how, names, None),
                    InRecord::Unknown => return Ok(self.late_commit(id, req)?),
                };
            // Acknowledged once the spend is reported too (a repeat reports
            // what a failed report left behind).
            self.settle_campaign_side(id, &how)?;
            return Ok(PendingCommit {
                outcome: CommitOutcome {
                    reservation: id.to_owned(),
                    outcome: how.outcome,
                    campaigns: names,
                },
                wait: CommitWait::Done,
                counter,
            });
        }
        let now = self.now();
        self.expire_step(now, reads);
        let settled = self
            .reservations
            .settle(id, Ending::Commit, now, |reserved| {
                let (chosen, campaigns) = winners(reserved, &req.campaigns, id)?;
                let outcome = CommitOutcome {
                    reservation: id.to_owned(),
                    outcome: Outcome::Committed,
                    campaigns,
                };
                Ok((outcome, chosen))
            });
        match self.expired_is_unknown(settled, reads) {
            Settle::Apply {
                reserved,
                seq,
                outcome,
                chosen,
                settled,
            } => {
                // The reservation's user record holds its pending debits, so
                // it is pinned in memory: this never reads the store.
                let how = Settlement::Commit {
                    chosen: chosen.as_slice(),
                    final_cost: req.cost,
                };
                match self.settle_reserved(&reserved, seq, how, req.sample, now, reads) {
                    Ok(receipt) => Ok(PendingCommit {
                        outcome,
                        wait: CommitWait::Write(receipt, settled),
                        counter: Some(&self.stats.commits),
                    }),
                    Err(e) => {
                        let e = e.into_error();
                        // A repeat of this commit answers only with this result.
                        settled.set(Err(e.clone()));
                        Err(e.into())
                    }
                }
            }
            Settle::Rejected(e) => Err(e.into()),
            // Not acknowledged before the first commit is durable.
            Settle::Repeat(outcome, settled) => Ok(PendingCommit {
                outcome,
                wait: CommitWait::Repeat(settled),
                counter: None,
            }),
            Settle::Conflict(c) => Err(EngineError::Conflict(c).into()),
            // A late commit counts an event, which may read a cold user
            // record: a memory-only call refuses it (nothing was settled).
            Settle::Unknown | Settle::Expired { .. } if reads == Reads::MemoryOnly => {
                Err(Halt::NotInMemory)
            }
            Settle::Unknown | Settle::Expired { .. } => Ok(self.late_commit(id, req)?),
        }
    }

    /// A commit of an unknown or expired id: the impression happened
    /// although its reservation is gone (docs/semantics.md §4.6).
    fn late_commit(&self, id: &str, req: &CommitRequest) -> Result<PendingCommit<'_>, EngineError> {
        let (Some(user), [campaign], Some(cost)) = (&req.user, req.campaigns.as_slice(), req.cost)
        else {
            return Err(EngineError::NotFound(format!(
                "no open reservation {id:?} (unknown or expired); a commit with \
                 user, one campaign and cost is counted as a late commit"
            )));
        };
        // Without an event id, the reservation id dedupes it: a retried late
        // commit is counted once (docs/semantics.md §4.6).
        let event_id = req
            .event_id
            .clone()
            .unwrap_or_else(|| format!("late-commit:{id}"));
        self.events(&[Event {
            user: Some(user.clone()),
            ids: req.ids.clone(),
            campaign: campaign.clone(),
            cost,
            event_id: Some(event_id),
            event_type: None,
        }])?;
        Ok(PendingCommit {
            outcome: CommitOutcome {
                reservation: id.to_owned(),
                outcome: Outcome::LateCommit,
                campaigns: vec![Arc::from(campaign.as_str())],
            },
            wait: CommitWait::Done,
            counter: Some(&self.stats.late_commits),
        })
    }

    /// Releases a reservation: its pending debits are undone
    /// (docs/semantics.md §4.3).
    pub fn release(&self, id: &str) -> Result<CommitOutcome, EngineError> {
        self.release_for(id, None)
    }

    /// [`Engine::release`]; with a shared store, `user` finds a reservation
    /// whose id the client chose, made on another node (its user's record
    /// holds it), as a commit's `user` does.
    pub fn release_for(&self, id: &str, user: Option<&str>) -> Result<CommitOutcome, EngineError> {
        self.release_with(id, user, None)
    }

    /// [`Engine::release_for`] with what happened to the work the
    /// reservation admitted: an adaptive item of its stack takes `sample`
    /// before its slot is freed (docs/adaptive.md, "In the engine").
    pub fn release_with(
        &self,
        id: &str,
        user: Option<&str>,
        sample: Option<Sample>,
    ) -> Result<CommitOutcome, EngineError> {
        check_reservation_id(id)?;
        if let Some(u) = user {
            self.check_id("user", u)?;
        }
        // Its screen no longer holds its user back (`super::travellers`).
        self.travel_released(id);
        if let Some((shared, key)) = self.shared_record_of(id, user) {
            return match self.settle_shared(shared, key, id, Settlement::Release, sample)? {
                InRecord::Done(how, campaigns) => {
                    self.stats.releases.fetch_add(1, Ordering::Relaxed);
                    self.settle_campaign_side(id, &how)?;
                    Ok(CommitOutcome {
                        reservation: id.to_owned(),
                        outcome: how.outcome,
                        campaigns,
                    })
                }
                InRecord::Repeat(how, campaigns) => {
                    self.settle_campaign_side(id, &how)?;
                    Ok(CommitOutcome {
                        reservation: id.to_owned(),
                        outcome: how.outcome,
                        campaigns,
                    })
                }
                InRecord::Unknown => Err(EngineError::NotFound(format!(
                    "no open reservation {id:?} (unknown or expired)"
                ))),
            };
        }
        let now = self.now();
        self.expire_step(now, Reads::MayWait);
        let settled = self
            .reservations
            .settle(id, Ending::Release, now, |reserved| {
                let campaigns = match reserved {
                    Reserved::Check { .. } => Vec::new(),
                    Reserved::Screen { candidates, .. } => {
                        candidates.iter().map(|c| c.campaign.clone()).collect()
                    }
                };
                let outcome = CommitOutcome {
                    reservation: id.to_owned(),
                    outcome: Outcome::Released,
                    campaigns,
                };
                Ok((outcome, Vec::new()))
            });
        match self.expired_is_unknown(settled, Reads::MayWait) {
            Settle::Apply {
                reserved,
                seq,
                outcome,
                settled,
                ..
            } => {
                let applied = waited(self.settle_reserved(
                    &reserved,
                    seq,
                    Settlement::Release,
                    sample,
                    now,
                    Reads::MayWait,
                ))
                .map(drop);
                settled.set(applied.clone());
                applied?;
                self.stats.releases.fetch_add(1, Ordering::Relaxed);
                Ok(outcome)
            }
            Settle::Rejected(e) => Err(e),
            Settle::Repeat(o, settled) => settled.wait().map(|()| o),
            Settle::Conflict(c) => Err(EngineError::Conflict(c)),
            Settle::Unknown | Settle::Expired { .. } => Err(EngineError::NotFound(format!(
                "no open reservation {id:?} (unknown or expired)"
            ))),
        }
    }

    /// With a shared store, on the node that made reservation `id`: settles
    /// its campaign-side holds as its record says it was settled, forgets
    /// it, and reports the spend (an error: the commit is not acknowledged,
    /// and its repeat reports again).
    pub(crate) fn settle_campaign_side(
        &self,
        id: &str,
        how: &RecordedEnd,
    ) -> Result<(), EngineError> {
        if let Some(reserved) = self.reservations.reserved(id) {
            if let Reserved::Screen { candidates, .. } = &*reserved {
                let now = self.now();
                self.settle_held(candidates, self.res_of(id), how, now);
            }
            self.reservations.forget(id);
        }
        if how.outcome == Outcome::Committed {
            let reg = self.registry();
            let chains: Vec<Arc<super::registry::CampaignEntry>> = how
                .campaigns
                .iter()
                .filter_map(|c| reg.chain_by_id(*c))
                .flat_map(|chain| chain.iter().cloned())
                .collect();
            self.report_spend(chains.iter())?;
        }
        Ok(())
    }

    /// Counts a commit this node made of another node's reservation, whose
    /// campaign side it charged ([`Engine::charge_foreign`]): the winners'
    /// commits and timelines, as the node that made it would have.
    pub(crate) fn count_foreign(
        &self,
        winners: &[super::placement::ForeignWinner],
        final_cost: Option<u64>,
        now: Nanos,
    ) {
        let reg = self.registry();
        for w in winners {
            let Some(chain) = reg.chain_by_id(w.campaign) else {
                continue;
            };
            chain[0].counts.commits.fetch_add(1, Ordering::Relaxed);
            for (depth, e) in chain.iter().enumerate() {
                // A budget this commit charged: one counting impressions
                // that the winner does not opt out of (§6.9).
                let budget = e.compiled.items.iter().enumerate().any(|(i, cap)| {
                    cap.scope == crate::model::Scope::Campaign
                        && matches!(cap.item, crate::limits::Item::Budget(_))
                        && super::chain::counts_event(
                            chain,
                            e,
                            i,
                            crate::model::EventType::IMPRESSION,
                        )
                });
                let spend = if budget {
                    final_cost.unwrap_or(w.cost)
                } else {
                    0
                };
                e.timeline
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .add(now, spend, u64::from(depth == 0), 0);
            }
        }
    }

    /// Settles the campaign-side holds of `candidates` (reservation `seq`)
    /// as `how` says, as of `at`: the committed campaigns' first unchosen
    /// candidates win, the rest are released.
    fn settle_held(&self, candidates: &[HeldCandidate], seq: u64, how: &RecordedEnd, at: Nanos) {
        let mut winners: Vec<u32> = Vec::new();
        if how.outcome == Outcome::Committed {
            let reg = self.registry();
            let named: Vec<(u32, &str)> =
                candidates.iter().map(|c| (c.index, &*c.campaign)).collect();
            // A campaign deleted since is no one's winner.
            let names: Vec<Arc<str>> = how
                .campaigns
                .iter()
                .filter_map(|id| reg.campaign_by_id(*id).map(|e| e.name.clone()))
                .collect();
            winners = super::reservations::winners(&named, names.iter().map(|n| &**n))
                .into_iter()
                .flatten()
                .collect();
        }
        let settlement = if how.outcome == Outcome::Committed {
            Settlement::Commit {
                chosen: winners.as_slice(),
                final_cost: how.final_cost,
            }
        } else {
            Settlement::Release
        };
        let now = self.now();
        // In a shared store this writes no record (campaign records are this
        // node's; `persist` submits nothing for them).
        // Committed on another node that charged the campaign side: the
        // winners' leased holds are given up, not charged here.
        let _ = self.settle_candidates(
            None,
            None,
            candidates,
            seq,
            settlement,
            at,
            now,
            how.charged,
        );
    }

    /// Settles what a reservation reserved, as of `at`; a commit's changed
    /// records are written in one batch, whose receipt it returns.
    fn settle_reserved(
        &self,
        reserved: &Reserved,
        seq: u64,
        how: Settlement<'_, [u32]>,
        sample: Option<Sample>,
        at: Nanos,
        reads: Reads,
    ) -> Result<Option<Receipt>, Halt> {
        let now = self.now();
        match reserved {
            Reserved::Check {
                key,
                def_id,
                stack,
                tags,
            } => {
                let record = RecordKey::PolicyKey(*key);
                let defs = Defs::Stack {
                    def_id: *def_id,
                    stack,
                    tags,
                };
                self.with_record(record, now, reads, |rec, now| {
                    let entries = rec.take_pending(seq, None);
                    let Settlement::Commit { final_cost, .. } = how else {
                        settle_entries(rec, entries, defs, PendingEnd::Release, at, sample);
                        return None;
                    };
                    let settling = PendingEnd::Commit {
                        final_cost,
                        repriced: Repriced::EveryItem,
                    };
                    settle_entries(rec, entries, defs, settling, at, sample);
                    let mut changes = Changes::new();
                    changes.record(record, rec);
                    Some(self.persist(changes, defs, now, Ack::Durable))
                })
            }
            Reserved::Screen {
                user,
                ids,
                candidates,
            } => {
                // The other identities' records first, each in its own
                // batch: the user's, last, is durable only once they are.
                for key in ids {
                    self.settle_identity(*key, candidates, seq, how, at, reads)?;
                }
                let settle = |user_rec: Option<&mut SubjectRecord>| {
                    self.settle_candidates(*user, user_rec, candidates, seq, how, at, now, false)
                };
                match user {
                    Some(k) => match self
                        .with_record(RecordKey::User(*k), now, reads, |rec, _| settle(Some(rec)))
                    {
                        // Not in memory, in a memory-only call: then it holds
                        // nothing of this reservation (pending debits pin a
                        // record), and its copy on disk is unchanged by
                        // settling it. Settle the rest.
                        Err(Halt::NotInMemory) => Ok(settle(None)),
                        r => r,
                    },
                    None => Ok(settle(None)),
                }
            }
        }
    }

    /// Settles a screen's candidates, under the user's record lock: the
    /// winners' debits committed, the others released; then writes, in one
    /// batch, every campaign record of a winner's chain and the user's.
    /// `given_up`: the winners were committed on another node, which
    /// charged their leased items and counted the commit
    /// ([`Engine::charge_foreign`]): their holds on those items are given up
    /// ([`Engine::give_up_hold`]) and the commit is not counted here.
    #[allow(clippy::too_many_arguments)]
    fn settle_candidates(
        &self,
        user: Option<u128>,
        mut user_rec: Option<&mut SubjectRecord>,
        candidates: &[HeldCandidate],
        seq: u64,
        how: Settlement<'_, [u32]>,
        at: Nanos,
        now: Nanos,
        given_up: bool,
    ) -> Option<Receipt> {
        let (winners, final_cost) = match how {
            Settlement::Commit { chosen, final_cost } => (chosen, final_cost),
            Settlement::Release => (&[][..], None),
        };
        let settling = |win: bool| match win {
            true => PendingEnd::Commit {
                final_cost,
                repriced: Repriced::Budgets,
            },
            false => PendingEnd::Release,
        };
        // The user's entries of this reservation, taken in one pass; a
        // screen pushed them in candidate order.
        let mut mine = match user_rec.as_deref_mut() {
            Some(u) => u.take_pending(seq, None),
            None => SmallVec::new(),
        };
        mine.sort_by_key(|p| p.cand);
        // Every chain's records at once, each once, in the lock order: the
        // winners' are then written together, each encoded once.
        let mut guards = match candidates {
            [one] => lock_chain(&one.chain, Locking::Settling),
            _ => lock_entries(
                candidates.iter().flat_map(|c| c.chain.iter()),
                Locking::Settling,
            ),
        };
        let mut written: SmallVec<[u32; 8]> = SmallVec::new();
        let mut next = 0;
        for c in candidates {
            let win = winners.contains(&c.index);
            if win && !given_up {
                c.chain[0]
                    .counts
                    .commits
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            let defs = Defs::Chain(&c.chain);
            let end = next + mine[next..].partition_point(|p| p.cand <= c.index);
            if let Some(u) = user_rec.as_deref_mut() {
                let entries = mine[next..end].iter().cloned();
                settle_entries(u, entries, defs, settling(win), at, None);
            }
            next = end;
            for (depth, e) in c.chain.iter().enumerate() {
                let mut spend = 0;
                if let Some(g) = guard_of(&mut guards, e.id) {
                    let mut entries = g.take_pending(seq, Some(c.index));
                    if win && given_up {
                        let (moved, kept): (SmallVec<[_; 4]>, SmallVec<[_; 4]>) = entries
                            .into_iter()
                            .partition(|p| super::leases::leased_in_units(e, p.tag));
                        for p in &moved {
                            let st = g.state(e.id, p.tag).unwrap_or(&super::chain::FRESH);
                            self.give_up_hold(e, p.tag, st, p.n, at);
                        }
                        settle_entries(g, moved, defs, PendingEnd::Release, at, None);
                        entries = kept;
                    }
                    if win && !given_up {
                        self.commit_lines(e, &entries);
                        // The budget's spend: the final cost, else what was
                        // reserved (docs/semantics.md §6.5).
                        spend = entries
                            .iter()
                            .filter(|p| is_budget(e, p.tag))
                            .map(|p| final_cost.unwrap_or(p.n))
                            .sum();
                    }
                    settle_entries(g, entries, defs, settling(win), at, None);
                }
                if win && !given_up {
                    e.timeline
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .add(at.max(now), spend, u64::from(depth == 0), 0);
                }
                if win && !written.contains(&e.id) {
                    written.push(e.id);
                }
            }
        }
        if written.is_empty() {
            return None;
        }
        let reg = self.registry();
        let mut changes = Changes::new();
        for (id, g) in guards.iter_mut() {
            if written.contains(id) {
                changes.record(RecordKey::Campaign(*id), g);
            }
        }
        if let (Some(u), Some(k)) = (user_rec, user) {
            changes.record(RecordKey::User(k), u);
        }
        Some(self.persist(changes, Defs::Registry(&reg), now, Ack::Durable))
    }
}

/// Whether counter `tag` of campaign `e` is its budget's.
fn is_budget(e: &super::registry::CampaignEntry, tag: u32) -> bool {
    e.tags
        .iter()
        .zip(&e.compiled.items)
        .any(|(&t, x)| t == tag && matches!(x.item, crate::limits::Item::Budget(_)))
}

/// Whether a chain holds anything campaign-side (a campaign-scope item).
fn holds_campaign_side(chain: &[Arc<super::registry::CampaignEntry>]) -> bool {
    chain.iter().any(|e| {
        e.compiled
            .items
            .iter()
            .any(|c| c.scope == crate::model::Scope::Campaign)
    })
}

/// The candidates a commit naming `campaigns` commits
/// ([`super::reservations::commit_winners`]): their indexes and names.
fn winners(
    reserved: &Reserved,
    campaigns: &[String],
    id: &str,
) -> Result<(Vec<u32>, Vec<Arc<str>>), EngineError> {
    let Reserved::Screen { candidates, .. } = reserved else {
        return Ok((Vec::new(), Vec::new()));
    };
    let named: Vec<(u32, &str)> = candidates.iter().map(|c| (c.index, &*c.campaign)).collect();
    let chosen = commit_winners(&named, campaigns, |n| n, id)?;
    let names = chosen
        .iter()
        .filter_map(|i| candidates.iter().find(|c| c.index == *i))
        .map(|c| c.campaign.clone())
        .collect();
    Ok((chosen, names))
}

/// How a reservation with no record of its settlement was settled.
fn released() -> RecordedEnd {
    RecordedEnd {
        outcome: Outcome::Released,
        campaigns: Vec::new(),
        final_cost: None,
        charged: false,
    }
}
