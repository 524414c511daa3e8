//! Check, screen, commit, release, events, expiry: the engine's decisions.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, MutexGuard, PoisonError};

use smallvec::SmallVec;

use crate::clock::{Clock, Nanos};
use crate::limits::stack::{Decision, Pending, Stack};
use crate::limits::{Hold, Item, ItemState, Kind};
use crate::model::Scope;
use crate::model::limit::{LimitDef, compile_stack};
use crate::store::{Batch, Op, Receipt, Space, codec};

use super::record::{
    ALLOC_OVERHEAD, PendingEntry, SubjectRecord, list_entry_bytes, map_entry_bytes,
    pinned_record_bytes,
};
use super::registry::{CampaignEntry, Chain, Registry, stack_tags};
use super::reservations::{Begin, Footprint, Settle, Settled, entry_bytes};
use super::{Engine, EngineError, campaign_disk_key, invalid, ms, policy_disk_key, user_disk_key};

/// The state every absent counter reads as.
pub(crate) static FRESH: ItemState = ItemState::Fresh;

/// Default and largest reservation lifetimes (DESIGN §2.5).
pub const DEFAULT_TTL_MS: u64 = 60_000;
pub const MAX_TTL_MS: u64 = 3_600_000;

/// Most reservations a request expires before it is handled (the sweeper
/// expires the rest): see [`Engine::expire_step`].
pub const EXPIRE_BATCH: usize = 16;

/// Reservations the sweeper takes out of the table per hold of its lock.
pub const SWEEP_BATCH: usize = 64;

/// Largest cost: below 2^53 (DESIGN §2.6).
const MAX_COST: u64 = (1 << 53) - 1;

/// What a check is decided against.
#[derive(Debug, Clone, PartialEq)]
pub enum CheckTarget {
    Policy(String),
    Inline(Vec<LimitDef>),
}

/// `POST /v1/check`.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckRequest {
    pub target: CheckTarget,
    pub key: String,
    pub cost: u64,
    pub reserve: bool,
    pub ttl_ms: Option<u64>,
    pub reservation_id: Option<String>,
    /// The request as its caller sent it, hashed (the HTTP layer hashes the
    /// JSON value of the body): a repeat of a reserve under a live id is the
    /// same request only if this matches. `None`: the fields above are
    /// compared instead.
    pub fingerprint: Option<u64>,
}

/// A check's answer: the decision, its stack (for names and kinds), and the
/// reservation made, if any.
#[derive(Debug, Clone)]
pub struct CheckOutcome {
    pub decision: Decision,
    pub stack: Arc<Stack>,
    pub reservation: Option<String>,
}

/// One candidate of a screen.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ScreenCandidate {
    pub campaign: String,
    /// Cost charged to budgets (caps count 1). Default 1.
    pub cost: Option<u64>,
}

/// `POST /v1/screen`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ScreenRequest {
    pub user: Option<String>,
    pub candidates: Vec<ScreenCandidate>,
    pub reserve: bool,
    pub ttl_ms: Option<u64>,
    pub reservation_id: Option<String>,
    /// As [`CheckRequest::fingerprint`].
    pub fingerprint: Option<u64>,
}

/// Why a candidate is not eligible.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeniedBy {
    /// The campaign of the chain whose cap denied.
    pub campaign: Arc<str>,
    /// The cap's name, or `budget`, `max_in_flight`, `unknown_user`,
    /// `unknown_campaign`.
    pub cap: String,
    pub retry_after: Option<crate::clock::Span>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CandidateResult {
    /// Shared with the definition (see `CampaignEntry::name`): a screen of
    /// thousands of candidates copies no names.
    pub campaign: Arc<str>,
    pub eligible: bool,
    pub denied_by: Option<DeniedBy>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScreenOutcome {
    pub reservation: Option<String>,
    pub results: Vec<CandidateResult>,
}

/// The first answer of a reservation, returned again to a repeat.
#[derive(Debug, Clone)]
pub enum Answer {
    /// Boxed: a decision with its figures is several times a screen's size.
    Check(Box<CheckOutcome>),
    Screen(ScreenOutcome),
}

/// `POST /v1/reservations/{id}/commit`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CommitRequest {
    /// Winning campaign(s) of a screen; the rest are released. May be empty
    /// when the screen had exactly one eligible candidate.
    pub campaigns: Vec<String>,
    /// Final cost (the clearing price), charged to budgets instead of the
    /// reserved cost.
    pub cost: Option<u64>,
    pub event_id: Option<String>,
    /// With `campaigns` (one) and `cost`, makes a commit of an unknown or
    /// expired id a late commit.
    pub user: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Committed,
    Released,
    LateCommit,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Committed => "committed",
            Outcome::Released => "released",
            Outcome::LateCommit => "late_commit",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitOutcome {
    pub reservation: String,
    pub outcome: Outcome,
    /// Campaigns committed (for a release: those released). Shared names
    /// (see `CampaignEntry::name`): a release of a large screen copies none.
    pub campaigns: Vec<Arc<str>>,
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
    /// This call applied the commit: its batches, then the latch that
    /// answers repeats of it.
    Writes(Vec<Receipt>, Arc<Settled>),
    /// A repeat: the first call's result.
    Repeat(Arc<Settled>),
}

impl PendingCommit<'_> {
    /// Blocks until the commit is durable.
    pub fn wait(mut self) -> Result<CommitOutcome, EngineError> {
        match std::mem::replace(&mut self.wait, CommitWait::Done) {
            CommitWait::Done => {}
            CommitWait::Writes(receipts, settled) => {
                let written = receipts
                    .into_iter()
                    .try_for_each(|r| r.wait().map_err(EngineError::from));
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
            CommitWait::Writes(receipts, settled) => {
                // The receipts stay in `self` while awaited: should this
                // future be dropped mid-way, `Drop` waits for them all.
                self.wait = CommitWait::Writes(receipts, settled.clone());
                let mut written = Ok(());
                if let CommitWait::Writes(receipts, _) = &self.wait {
                    for r in receipts {
                        if let Err(e) = r.wait_async().await {
                            written = Err(EngineError::from(e));
                            break;
                        }
                    }
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
        if let CommitWait::Writes(receipts, settled) =
            std::mem::replace(&mut self.wait, CommitWait::Done)
            && !settled.is_set()
        {
            let written = receipts
                .into_iter()
                .try_for_each(|r| r.wait().map_err(EngineError::from));
            if written.is_ok()
                && let Some(c) = self.counter.take()
            {
                c.fetch_add(1, Ordering::Relaxed);
            }
            settled.set(written);
        }
    }
}

/// Events counted in memory whose writes are queued
/// ([`Engine::events_deferred`]). Unlike a commit, nothing answers a repeat
/// from it (a repeated event id is a duplicate at once), so dropping it
/// unwaited leaves nothing hanging.
#[must_use = "events are acknowledged only once their writes are durable"]
pub struct PendingEvents<'e> {
    counted: usize,
    receipts: Vec<Receipt>,
    /// Counted once durable: `events`.
    counter: &'e AtomicU64,
}

impl PendingEvents<'_> {
    /// Blocks until the events are durable; returns how many were counted.
    pub fn wait(mut self) -> Result<usize, EngineError> {
        for r in std::mem::take(&mut self.receipts) {
            r.wait()?;
        }
        Ok(self.durable())
    }

    /// [`PendingEvents::wait`] without parking a thread.
    pub async fn wait_async(self) -> Result<usize, EngineError> {
        for r in &self.receipts {
            r.wait_async().await?;
        }
        Ok(self.durable())
    }

    fn durable(&self) -> usize {
        self.counter
            .fetch_add(self.counted as u64, Ordering::Relaxed);
        self.counted
    }
}

/// An impression that happened without a reservation (`POST /v1/events`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub user: Option<String>,
    pub campaign: String,
    pub cost: u64,
    pub event_id: Option<String>,
}

/// What a reservation holds, to settle it.
#[derive(Debug)]
pub enum Holds {
    Check {
        key: u128,
        owner: u32,
        stack: Arc<Stack>,
        tags: Vec<u32>,
    },
    Screen {
        user: Option<u128>,
        /// Eligible candidates: (index in the request, campaign, its chain).
        cands: Vec<(u32, Arc<str>, Chain)>,
    },
}

/// The bytes a reservation accounts for while open (see
/// `reservations::Footprint`): its table entry, its answer and holds, and its
/// debits in every record, with the user or key record they pin. An estimate
/// from the parts' sizes, made once per reservation in O(its candidates and
/// their chains' items).
fn footprint(id: &str, answer: &Answer, holds: &Holds) -> Footprint {
    use std::mem::size_of;
    // The id's three copies, the answer's list, the holds' `Arc` and list.
    let mut outside =
        entry_bytes(id.len()) + size_of::<Holds>() + 2 * size_of::<usize>() + 6 * ALLOC_OVERHEAD;
    outside += match answer {
        Answer::Check(c) => {
            size_of::<CheckOutcome>()
                + if c.decision.items.spilled() {
                    c.decision.items.capacity() * size_of::<crate::limits::ItemFigures>()
                } else {
                    0
                }
        }
        Answer::Screen(o) => {
            o.results.capacity() * size_of::<CandidateResult>()
                + o.results
                    .iter()
                    .filter_map(|r| r.denied_by.as_ref())
                    .map(|d| size_of::<DeniedBy>() + d.cap.capacity())
                    .sum::<usize>()
        }
    };
    let mut inside = 0;
    match holds {
        Holds::Check { tags, .. } => {
            outside += tags.capacity() * size_of::<u32>();
            inside += list_entry_bytes(tags.len()) + pinned_record_bytes(tags.len());
        }
        Holds::Screen { user, cands } => {
            outside += cands.capacity() * size_of::<(u32, Arc<str>, Chain)>();
            let mut user_entries = 0;
            for (_, _, chain) in cands {
                for e in chain.iter() {
                    for cap in &e.compiled.items {
                        match cap.scope {
                            Scope::Campaign => outside += map_entry_bytes(),
                            Scope::User if user.is_some() => user_entries += 1,
                            Scope::User => {}
                        }
                    }
                }
            }
            if user_entries > 0 {
                inside += list_entry_bytes(user_entries) + pinned_record_bytes(user_entries);
            }
        }
    }
    Footprint {
        total: outside + inside,
        outside,
    }
}

/// A hash of a request body, to tell a repeat of a reservation from another
/// request under the same id. Only caller-supplied ids need it (a made id is
/// never sent twice), so the slow Debug rendering is paid only then.
fn body_hash<T: std::fmt::Debug>(x: &T, caller_id: bool, fingerprint: Option<u64>) -> u64 {
    if !caller_id {
        return 0;
    }
    if let Some(f) = fingerprint {
        return f;
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    format!("{x:?}").hash(&mut h);
    h.finish()
}

fn check_cost(field: &str, cost: u64) -> Result<(), EngineError> {
    if cost > MAX_COST {
        return Err(invalid(
            field,
            format!("must be from 0 to 2^53 - 1, got {cost}"),
        ));
    }
    Ok(())
}

fn ttl(ttl_ms: Option<u64>) -> Result<Nanos, EngineError> {
    let t = ttl_ms.unwrap_or(DEFAULT_TTL_MS);
    if t == 0 || t > MAX_TTL_MS {
        return Err(invalid(
            "ttl_ms",
            format!("must be from 1 to {MAX_TTL_MS}, got {t}"),
        ));
    }
    Ok(ms(t))
}

/// Checks a reservation id: 1-128 characters of `A-Z a-z 0-9 . _ : -`.
pub fn check_reservation_id(id: &str) -> Result<(), EngineError> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(invalid(
            "reservation_id",
            "must be 1-128 characters of A-Z a-z 0-9 . _ : -",
        ))
    }
}

/// Units an item of a campaign is charged for an impression of `cost`: caps
/// and max_in_flight count the impression, budgets its cost.
fn units(item: &Item, cost: u64) -> u64 {
    match item {
        Item::Budget(_) => cost,
        _ => 1,
    }
}

/// Locks the campaign records of `chain` in ascending id (the lock order).
/// Locks the campaign records of `chain` in ascending id (the lock order).
/// Only those holding campaign-scope items unless `all`: a decision reads and
/// debits nothing else there, so it need not take (or wait for) the others;
/// settling a reservation takes them all, as an item it debited may have been
/// redefined away since.
fn lock_chain(chain: &[Arc<CampaignEntry>], all: bool) -> Guards<'_> {
    fn lock(e: &Arc<CampaignEntry>) -> (u32, MutexGuard<'_, SubjectRecord>) {
        (
            e.id,
            e.record.lock().unwrap_or_else(PoisonError::into_inner),
        )
    }
    let wanted = |e: &&Arc<CampaignEntry>| {
        all || e.compiled.items.iter().any(|c| c.scope == Scope::Campaign)
    };
    let mut guards = Guards::new();
    // Most chains are one or two campaigns: no sort for one.
    match chain {
        [] => {}
        [a] => {
            if wanted(&a) {
                guards.push(lock(a));
            }
        }
        _ => {
            let mut order: SmallVec<[&Arc<CampaignEntry>; 8]> =
                chain.iter().filter(wanted).collect();
            order.sort_unstable_by_key(|e| e.id);
            order.dedup_by_key(|e| e.id);
            for e in order {
                guards.push(lock(e));
            }
        }
    }
    guards
}

/// The locked campaign records of a chain; inline for chains of up to four.
type Guards<'a> = SmallVec<[(u32, MutexGuard<'a, SubjectRecord>); 4]>;

fn guard_of<'a, 'g>(
    guards: &'a mut [(u32, MutexGuard<'g, SubjectRecord>)],
    id: u32,
) -> Option<&'a mut SubjectRecord> {
    guards
        .iter_mut()
        .find(|(g, _)| *g == id)
        .map(|(_, r)| &mut **r)
}

/// The item a slot (`owner`, `tag`) of a campaign belongs to in `chain`.
fn chain_item(chain: &[Arc<CampaignEntry>], owner: u32, tag: u32) -> Option<&Item> {
    let e = chain.iter().find(|e| e.id == owner)?;
    let i = e.tags.iter().position(|&t| t == tag)?;
    Some(&e.compiled.items[i].item)
}

/// The current definition of slot (`owner`, `tag`) in the registry.
fn registry_item(reg: &Registry, owner: u32, tag: u32) -> Option<&Item> {
    if let Some(e) = reg.campaign_by_id(owner) {
        let i = e.tags.iter().position(|&t| t == tag)?;
        return Some(&e.compiled.items[i].item);
    }
    let p = reg.policy_by_id(owner)?;
    let i = p.tags.iter().position(|&t| t == tag)?;
    Some(&p.stack.items()[i])
}

/// Applies a settled reservation's pending entries to `rec`: committed at
/// `final_cost` (budgets only) when `commit`, else released as of `at`.
fn settle_entries<'a>(
    rec: &mut SubjectRecord,
    entries: impl IntoIterator<Item = PendingEntry>,
    def: impl Fn(u32, u32) -> Option<&'a Item>,
    commit: bool,
    final_cost: Option<u64>,
    at: Nanos,
) {
    for p in entries {
        let Some(item) = def(p.owner, p.tag) else {
            continue;
        };
        // A slot redefined since the reservation was made started empty: there
        // is nothing of this debit left in it to settle.
        let Some(slot) = rec
            .slots
            .iter_mut()
            .find(|s| s.owner == p.owner && s.tag == p.tag)
        else {
            continue;
        };
        if commit {
            let fin = match item {
                Item::Budget(_) => final_cost.unwrap_or(p.n),
                _ => p.n,
            };
            item.commit(&mut slot.state, &p.item, p.n, fin, at);
        } else {
            // A counter released back to fresh stays in the record: dropping
            // it one release at a time (and re-adding it at the user's next
            // screen) re-sizes the exact-size slot slice twice per candidate,
            // which measured 5.6x slower for a 50-candidate screen + commit.
            item.release(&mut slot.state, &p.item, p.n, at);
        }
        rec.idle_at = rec.idle_at.max(item.idle_at(&slot.state));
    }
}

/// The candidates a commit naming `campaigns` commits: for each name, the first
/// eligible candidate of that campaign not already chosen (a campaign listed
/// twice in a screen can win twice); every eligible one when none is named.
/// Returns their indexes and names, or which name fits none.
fn winners(
    holds: &Holds,
    campaigns: &[String],
    id: &str,
) -> Result<(Vec<u32>, Vec<Arc<str>>), EngineError> {
    let Holds::Screen { cands, .. } = holds else {
        return Ok((Vec::new(), Vec::new()));
    };
    if campaigns.is_empty() {
        return Ok(cands.iter().map(|c| (c.0, c.1.clone())).unzip());
    }
    let mut chosen = Vec::with_capacity(campaigns.len());
    let mut names = Vec::with_capacity(campaigns.len());
    for (i, name) in campaigns.iter().enumerate() {
        match cands
            .iter()
            .find(|c| *c.1 == **name && !chosen.contains(&c.0))
        {
            Some(c) => {
                chosen.push(c.0);
                names.push(c.1.clone());
            }
            None => {
                let field = if campaigns.len() == 1 {
                    "campaign".to_owned()
                } else {
                    format!("campaign[{i}]")
                };
                return Err(invalid(
                    field,
                    format!(
                        "{name:?} is not an eligible candidate of reservation {id:?} (or is named more often than it was eligible)"
                    ),
                ));
            }
        }
    }
    Ok((chosen, names))
}

impl<C: Clock> Engine<C> {
    /// Releases every reservation whose deadline has passed, as of its
    /// deadline (the sweeper's call): [`SWEEP_BATCH`] at a time, so the
    /// table's lock is held for one batch (about 50 µs) at a time.
    pub fn expire(&self, now: Nanos) {
        while self.expire_up_to(now, SWEEP_BATCH) == SWEEP_BATCH {}
    }

    /// Releases up to [`EXPIRE_BATCH`] reservations whose deadline has
    /// passed: what a request does first. Expiry of one costs about 1.4 µs
    /// (500 000 due at once: 0.71 s), so a request pays at most about 25 µs
    /// for a backlog, which the sweeper drains; a commit or release of one
    /// still in the backlog expires it first ([`Settle::Expired`]), so no
    /// reservation is settled past its deadline.
    pub(crate) fn expire_step(&self, now: Nanos) -> usize {
        self.expire_up_to(now, EXPIRE_BATCH)
    }

    fn expire_up_to(&self, now: Nanos, most: usize) -> usize {
        let due = self.reservations.take_due(now, most);
        let n = due.len();
        for (holds, seq, deadline) in due {
            self.expire_one(&holds, seq, deadline);
        }
        n
    }

    /// A settle that found its reservation past the deadline expires it (as
    /// the sweeper would have) and then answers as for an unknown id.
    fn expired_is_unknown(&self, settled: Settle) -> Settle {
        match settled {
            Settle::Expired {
                holds,
                seq,
                deadline,
            } => {
                self.expire_one(&holds, seq, deadline);
                Settle::Unknown
            }
            s => s,
        }
    }

    fn expire_one(&self, holds: &Holds, seq: u64, deadline: Nanos) {
        self.stats.expired.fetch_add(1, Ordering::Relaxed);
        // A failed write of a release is not fatal: the disk copy never
        // holds pending debits.
        let _ = self.apply_holds(holds, seq, &[], false, None, deadline);
    }

    // ---- check ----

    /// Decides a request against a named policy or inline limits (DESIGN §2).
    pub fn check(&self, req: &CheckRequest) -> Result<CheckOutcome, EngineError> {
        self.check_id("key", &req.key)?;
        check_cost("cost", req.cost)?;
        let deadline_in = ttl(req.ttl_ms)?;
        if let Some(id) = &req.reservation_id {
            check_reservation_id(id)?;
        }
        let now = self.now();
        self.expire_step(now);
        let (stack, owner, tags, ns) = match &req.target {
            CheckTarget::Policy(name) => {
                let reg = self.registry();
                let Some(p) = reg.policies.get(name) else {
                    return Err(EngineError::NotFound(format!("no policy named {name:?}")));
                };
                (p.stack.clone(), p.id, p.tags.clone(), b'p')
            }
            CheckTarget::Inline(limits) => {
                if limits.is_empty() {
                    return Err(invalid("limits", "at least one limit is needed"));
                }
                let c = compile_stack("limits", limits, None, None)?;
                (Arc::new(c.stack), 0, stack_tags(limits), b'i')
            }
        };
        let key = self.hash(ns, owner, &req.key);
        // A zero-cost reserve is a peek: no reservation (DESIGN §2.6).
        let reserve = req.reserve && req.cost > 0;
        let mut claimed = None;
        if reserve {
            let id = match &req.reservation_id {
                Some(id) => id.clone(),
                None => self.new_reservation_id(),
            };
            match self.reservations.begin(
                &id,
                body_hash(req, req.reservation_id.is_some(), req.fingerprint),
                now + deadline_in,
            ) {
                Begin::New { seq } => claimed = Some((id, seq)),
                Begin::Repeat(Answer::Check(a)) => return Ok(*a),
                Begin::Repeat(Answer::Screen(_)) => {
                    return Err(EngineError::Conflict(format!(
                        "reservation {id:?} belongs to a screen"
                    )));
                }
                Begin::Conflict(m) => return Err(EngineError::Conflict(m)),
                Begin::Overloaded(m) => return Err(EngineError::Overloaded(m)),
            }
        }
        let disk = policy_disk_key(key);
        let hold = match claimed {
            Some(_) => Hold::Reserve {
                deadline: now + deadline_in,
            },
            None => Hold::Immediate,
        };
        let result = self.with_record(key, &disk, now, |rec| {
            let mut states: SmallVec<[ItemState; 4]> = tags
                .iter()
                .map(|&t| std::mem::take(rec.state_mut(owner, t)))
                .collect();
            let (decision, pending) = stack.decide(&mut states, now, req.cost, hold);
            for (&t, s) in tags.iter().zip(states) {
                *rec.state_mut(owner, t) = s;
            }
            for (item, &t) in stack.items().iter().zip(&tags) {
                rec.touch(owner, t, item);
            }
            let mut receipt = None;
            if let (Some(Pending { cost, items }), Some((_, seq))) = (pending, &claimed) {
                for (p, &t) in items.into_iter().zip(&tags) {
                    rec.add_pending(PendingEntry {
                        res: *seq,
                        cand: 0,
                        owner,
                        tag: t,
                        item: p,
                        n: cost,
                    });
                }
                rec.idle_at = rec.idle_at.max(now + deadline_in);
            } else if decision.allowed && req.cost > 0 {
                // An immediate debit is written behind: no one waits for it.
                let (st, tg): (&Stack, &[u32]) = (&stack, &tags);
                let value = rec.to_stored(now, move |o, t| {
                    (o == owner)
                        .then(|| tg.iter().position(|&x| x == t))
                        .flatten()
                        .map(|i| &st.items()[i])
                });
                let r = self
                    .store
                    .submit(vec![Op::Put(Space::State, disk.clone(), value)], false);
                rec.write_seq = r.seq;
                receipt = Some(r);
            }
            Ok((decision, receipt))
        });
        let (decision, _receipt) = match result {
            Ok(x) => x,
            Err(e) => {
                if let Some((id, _)) = &claimed {
                    self.reservations.abandon(id);
                }
                return Err(e);
            }
        };
        let out = CheckOutcome {
            reservation: claimed
                .as_ref()
                .filter(|_| decision.allowed)
                .map(|(id, _)| id.clone()),
            decision,
            stack: stack.clone(),
        };
        match claimed {
            Some((id, _)) if out.decision.allowed => {
                let answer = Answer::Check(Box::new(out.clone()));
                let holds = Holds::Check {
                    key,
                    owner,
                    stack,
                    tags,
                };
                let bytes = footprint(&id, &answer, &holds);
                self.reservations.finish(&id, answer, holds, bytes);
            }
            // A denied reserve creates nothing.
            Some((id, _)) => self.reservations.abandon(&id),
            None => {}
        }
        Ok(out)
    }

    // ---- screen ----

    /// Screens candidates for a user (DESIGN §3): each candidate is decided in
    /// order, all-or-nothing over its whole chain; eligible ones hold pending
    /// debits under one reservation when `reserve`.
    pub fn screen(&self, req: &ScreenRequest) -> Result<ScreenOutcome, EngineError> {
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
            if c.cost.is_some_and(|n| n > MAX_COST) {
                check_cost(&format!("candidates[{i}].cost"), c.cost.unwrap_or(0))?;
            }
        }
        let deadline_in = ttl(req.ttl_ms)?;
        if let Some(id) = &req.reservation_id {
            check_reservation_id(id)?;
        }
        let now = self.now();
        self.expire_step(now);
        let reg = self.registry();
        let deadline = now + deadline_in;
        let mut claimed = None;
        if req.reserve {
            let id = match &req.reservation_id {
                Some(id) => id.clone(),
                None => self.new_reservation_id(),
            };
            match self.reservations.begin(
                &id,
                body_hash(req, req.reservation_id.is_some(), req.fingerprint),
                deadline,
            ) {
                Begin::New { seq } => claimed = Some((id, seq)),
                Begin::Repeat(Answer::Screen(a)) => return Ok(a),
                Begin::Repeat(Answer::Check(_)) => {
                    return Err(EngineError::Conflict(format!(
                        "reservation {id:?} belongs to a check"
                    )));
                }
                Begin::Conflict(m) => return Err(EngineError::Conflict(m)),
                Begin::Overloaded(m) => return Err(EngineError::Overloaded(m)),
            }
        }
        let seq = claimed.as_ref().map(|(_, s)| *s);
        let user = req.user.as_ref().map(|u| self.hash(b'u', 0, u));
        let run = |user_rec: Option<&mut SubjectRecord>| {
            self.screen_locked(&reg, req, user_rec, now, seq.map(|s| (s, deadline)))
        };
        let result = match user {
            Some(k) => self.with_record(k, &user_disk_key(k), now, |rec| Ok(run(Some(rec)))),
            None => Ok(run(None)),
        };
        let (results, cands) = match result {
            Ok(x) => x,
            Err(e) => {
                if let Some((id, _)) = &claimed {
                    self.reservations.abandon(id);
                }
                return Err(e);
            }
        };
        let reservation = match claimed {
            Some((id, _)) if !cands.is_empty() => {
                let out = ScreenOutcome {
                    reservation: Some(id.clone()),
                    results,
                };
                let answer = Answer::Screen(out.clone());
                let holds = Holds::Screen { user, cands };
                let bytes = footprint(&id, &answer, &holds);
                self.reservations.finish(&id, answer, holds, bytes);
                return Ok(out);
            }
            Some((id, _)) => {
                self.reservations.abandon(&id);
                None
            }
            None => None,
        };
        Ok(ScreenOutcome {
            reservation,
            results,
        })
    }

    /// The body of a screen, under the user's record lock.
    #[allow(clippy::type_complexity)]
    fn screen_locked(
        &self,
        reg: &Registry,
        req: &ScreenRequest,
        mut user_rec: Option<&mut SubjectRecord>,
        now: Nanos,
        hold: Option<(u64, Nanos)>,
    ) -> (Vec<CandidateResult>, Vec<(u32, Arc<str>, Chain)>) {
        let mut results = Vec::with_capacity(req.candidates.len());
        let mut held = Vec::new();
        if let Some((seq, _)) = hold {
            held.reserve(req.candidates.len());
            if let Some(u) = user_rec.as_deref_mut() {
                u.reserve_pending(seq, req.candidates.len());
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
                });
                continue;
            };
            let cost = cand.cost.unwrap_or(1);
            let denied = self.decide_chain(
                chain,
                user_rec.as_deref_mut(),
                now,
                cost,
                hold.map(|(s, d)| (s, ci as u32, d)),
            );
            // The chain starts with the candidate's own entry.
            let name = chain[0].name.clone();
            if denied.is_none() && hold.is_some() {
                held.push((ci as u32, name.clone(), chain.clone()));
            }
            results.push(CandidateResult {
                campaign: name,
                eligible: denied.is_none(),
                denied_by: denied,
            });
        }
        if let (Some(u), Some((seq, _))) = (user_rec, hold) {
            u.drop_empty_pending(seq);
        }
        (results, held)
    }

    /// Decides one candidate over its chain, all-or-nothing; with `hold`
    /// (reservation seq, candidate index, deadline) debits it as pending.
    /// Returns the first denying cap in chain order.
    fn decide_chain(
        &self,
        chain: &[Arc<CampaignEntry>],
        mut user: Option<&mut SubjectRecord>,
        now: Nanos,
        cost: u64,
        hold: Option<(u64, u32, Nanos)>,
    ) -> Option<DeniedBy> {
        if user.is_none()
            && let Some(e) = chain
                .iter()
                .find(|e| e.compiled.unknown_user == crate::model::UnknownUser::Deny)
        {
            return Some(DeniedBy {
                campaign: e.name.clone(),
                cap: "unknown_user".into(),
                retry_after: None,
            });
        }
        let mut guards = lock_chain(chain, false);
        // Probe every item first; nothing changes unless all allow.
        for e in chain {
            for (i, cap) in e.compiled.items.iter().enumerate() {
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
                };
                let st = rec.state(e.id, t).unwrap_or(&FRESH);
                let n = units(&cap.item, cost);
                let p = cap.item.probe(st, now, n);
                if !p.allowed {
                    return Some(DeniedBy {
                        campaign: e.name.clone(),
                        cap: cap.name.clone(),
                        retry_after: cap.item.retry(st, &p, now, n),
                    });
                }
            }
        }
        let (seq, cand, deadline) = hold?;
        for e in chain {
            for (i, cap) in e.compiled.items.iter().enumerate() {
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
                };
                let n = units(&cap.item, cost);
                let st = rec.state_mut(e.id, t);
                let p = cap.item.apply(st, now, n, Hold::Reserve { deadline });
                rec.add_pending(PendingEntry {
                    res: seq,
                    cand,
                    owner: e.id,
                    tag: t,
                    item: p,
                    n,
                });
                rec.touch(e.id, t, &cap.item);
                rec.idle_at = rec.idle_at.max(deadline);
            }
        }
        None
    }

    // ---- commit / release ----

    /// Commits a reservation (DESIGN §2.5): the named winners' debits become
    /// permanent, at the final cost if given; the rest are released. Durable
    /// before it returns.
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
        check_reservation_id(id)?;
        if let Some(c) = req.cost {
            check_cost("cost", c)?;
        }
        if let Some(e) = &req.event_id {
            self.check_id("event_id", e)?;
        }
        // A winner that names no campaign at all is 404 (DESIGN §3), before
        // anything is settled; one that exists but was not eligible is 400.
        {
            let reg = self.registry();
            if let Some(name) = req
                .campaigns
                .iter()
                .find(|c| !reg.campaigns.contains_key(*c))
            {
                return Err(EngineError::NotFound(format!("no campaign named {name:?}")));
            }
        }
        let now = self.now();
        self.expire_step(now);
        let settled = self.reservations.settle(id, true, now, |holds| {
            let (chosen, campaigns) = winners(holds, &req.campaigns, id)?;
            let outcome = CommitOutcome {
                reservation: id.to_owned(),
                outcome: Outcome::Committed,
                campaigns,
            };
            Ok((outcome, chosen))
        });
        match self.expired_is_unknown(settled) {
            Settle::Apply {
                holds,
                seq,
                outcome,
                chosen,
                settled,
            } => {
                // The reservation's user record holds its pending debits, so
                // it is pinned in memory: this never reads the store.
                match self.apply_holds(&holds, seq, &chosen, true, req.cost, now) {
                    Ok(receipts) => Ok(PendingCommit {
                        outcome,
                        wait: CommitWait::Writes(receipts, settled),
                        counter: Some(&self.stats.commits),
                    }),
                    Err(e) => {
                        // A repeat of this commit answers only with this result.
                        settled.set(Err(e.clone()));
                        Err(e)
                    }
                }
            }
            Settle::Rejected(e) => Err(e),
            // Not acknowledged before the first commit is durable.
            Settle::Repeat(outcome, settled) => Ok(PendingCommit {
                outcome,
                wait: CommitWait::Repeat(settled),
                counter: None,
            }),
            Settle::Conflict(m) => Err(EngineError::Conflict(m)),
            // A late commit counts an event, which may read a cold user
            // record: a memory-only call refuses it (nothing was settled).
            Settle::Unknown | Settle::Expired { .. } if super::memory_only() => {
                Err(EngineError::NotInMemory)
            }
            Settle::Unknown | Settle::Expired { .. } => {
                // A late commit: the impression happened although its
                // reservation is gone.
                match (&req.user, req.campaigns.as_slice(), req.cost) {
                    (Some(user), [campaign], Some(cost)) => {
                        // Without an event id, the reservation id dedupes it:
                        // a retried late commit is counted once (DESIGN §2.5,
                        // committing twice is a no-op).
                        let event_id = req
                            .event_id
                            .clone()
                            .unwrap_or_else(|| format!("late-commit:{id}"));
                        self.events(&[Event {
                            user: Some(user.clone()),
                            campaign: campaign.clone(),
                            cost,
                            event_id: Some(event_id),
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
                    _ => Err(EngineError::NotFound(format!(
                        "no open reservation {id:?} (unknown or expired); a commit with \
                         user, one campaign and cost is counted as a late commit"
                    ))),
                }
            }
        }
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
        let _only = super::MemoryOnly::set();
        match self.commit_deferred(id, req) {
            Err(EngineError::NotInMemory) => None,
            r => Some(r),
        }
    }

    /// Releases a reservation: its pending debits are undone.
    pub fn release(&self, id: &str) -> Result<CommitOutcome, EngineError> {
        check_reservation_id(id)?;
        let now = self.now();
        self.expire_step(now);
        let settled = self.reservations.settle(id, false, now, |holds| {
            let campaigns = match holds {
                Holds::Check { .. } => Vec::new(),
                Holds::Screen { cands, .. } => cands.iter().map(|c| c.1.clone()).collect(),
            };
            let outcome = CommitOutcome {
                reservation: id.to_owned(),
                outcome: Outcome::Released,
                campaigns,
            };
            Ok((outcome, Vec::new()))
        });
        match self.expired_is_unknown(settled) {
            Settle::Apply {
                holds,
                seq,
                outcome,
                settled,
                ..
            } => {
                let applied = self
                    .apply_holds(&holds, seq, &[], false, None, now)
                    .map(drop);
                settled.set(applied.clone());
                applied?;
                self.stats.releases.fetch_add(1, Ordering::Relaxed);
                Ok(outcome)
            }
            Settle::Rejected(e) => Err(e),
            Settle::Repeat(o, settled) => settled.wait().map(|()| o),
            Settle::Conflict(m) => Err(EngineError::Conflict(m)),
            Settle::Unknown | Settle::Expired { .. } => Err(EngineError::NotFound(format!(
                "no open reservation {id:?} (unknown or expired)"
            ))),
        }
    }

    /// Settles a reservation's debits: candidates in `winners` (all of a
    /// check when `commit`) are committed, the rest released, as of `at`.
    /// Returns receipts to wait on (commits are written durably).
    fn apply_holds(
        &self,
        holds: &Holds,
        seq: u64,
        winners: &[u32],
        commit: bool,
        final_cost: Option<u64>,
        at: Nanos,
    ) -> Result<Vec<Receipt>, EngineError> {
        let now = self.now();
        match holds {
            Holds::Check {
                key,
                owner,
                stack,
                tags,
            } => {
                let disk = policy_disk_key(*key);
                let owner = *owner;
                let (stack, tags): (&Stack, &[u32]) = (stack, tags);
                let def = move |o: u32, t: u32| {
                    (o == owner)
                        .then(|| tags.iter().position(|&x| x == t))
                        .flatten()
                        .map(|i| &stack.items()[i])
                };
                self.with_record(*key, &disk, now, |rec| {
                    let entries = rec.take_pending(seq, None);
                    for p in entries {
                        let Some(item) = def(p.owner, p.tag) else {
                            continue;
                        };
                        let Some(slot) = rec
                            .slots
                            .iter_mut()
                            .find(|s| s.owner == p.owner && s.tag == p.tag)
                        else {
                            continue;
                        };
                        if commit {
                            let fin = final_cost.unwrap_or(p.n);
                            item.commit(&mut slot.state, &p.item, p.n, fin, at);
                        } else {
                            item.release(&mut slot.state, &p.item, p.n, at);
                        }
                        rec.idle_at = rec.idle_at.max(item.idle_at(&slot.state));
                    }
                    if !commit {
                        return Ok(Vec::new());
                    }
                    let value = rec.to_stored(now, def);
                    let r = self
                        .store
                        .submit(vec![Op::Put(Space::State, disk.clone(), value)], true);
                    rec.write_seq = r.seq;
                    Ok(vec![r])
                })
            }
            Holds::Screen { user, cands } => {
                let reg = self.registry();
                let reg: &Registry = &reg;
                let work = |mut user_rec: Option<&mut SubjectRecord>| {
                    let mut receipts = Vec::new();
                    // The user's entries of this reservation, taken in one pass;
                    // a screen pushed them in candidate order.
                    let mut mine = match user_rec.as_deref_mut() {
                        Some(u) => u.take_pending(seq, None),
                        None => SmallVec::new(),
                    };
                    mine.sort_by_key(|p| p.cand);
                    let mut next = 0;
                    for (ci, _, chain) in cands {
                        let win = commit && winners.contains(ci);
                        let mut guards = lock_chain(chain, true);
                        let chain_ref: &[Arc<CampaignEntry>] = chain;
                        let def = move |o: u32, t: u32| chain_item(chain_ref, o, t);
                        let end = next + mine[next..].partition_point(|p| p.cand <= *ci);
                        if let Some(u) = user_rec.as_deref_mut() {
                            let entries = mine[next..end].iter().cloned();
                            settle_entries(u, entries, def, win, final_cost, at);
                        }
                        next = end;
                        let mut batch: Batch = Vec::new();
                        for (id, g) in guards.iter_mut() {
                            let entries = g.take_pending(seq, Some(*ci));
                            settle_entries(g, entries, def, win, final_cost, at);
                            if win {
                                let value = g.to_stored(now, move |o, t| registry_item(reg, o, t));
                                batch.push(Op::Put(Space::State, campaign_disk_key(*id), value));
                            }
                        }
                        if win {
                            if let (Some(u), Some(k)) = (user_rec.as_deref_mut(), user) {
                                let value = u.to_stored(now, move |o, t| registry_item(reg, o, t));
                                batch.push(Op::Put(Space::State, user_disk_key(*k), value));
                            }
                            let r = self.store.submit(batch, true);
                            if let Some(u) = user_rec.as_deref_mut() {
                                u.write_seq = r.seq;
                            }
                            for (_, g) in guards.iter_mut() {
                                g.write_seq = r.seq;
                            }
                            receipts.push(r);
                        }
                    }
                    receipts
                };
                match user {
                    Some(k) => {
                        match self
                            .with_record(*k, &user_disk_key(*k), now, |rec| Ok(work(Some(rec))))
                        {
                            // Not in memory, in a memory-only call: then it
                            // holds nothing of this reservation (pending
                            // debits pin a record), and its copy on disk is
                            // unchanged by settling it. Settle the rest.
                            Err(EngineError::NotInMemory) => Ok(work(None)),
                            r => r,
                        }
                    }
                    None => Ok(work(None)),
                }
            }
        }
    }

    // ---- events ----

    /// Counts impressions that happened without a reservation (DESIGN §3): no
    /// check, idempotent by `event_id` within the dedupe horizon. A batch with
    /// any invalid event applies nothing. Durable before it returns. Returns
    /// how many events were counted (duplicates are not).
    pub fn events(&self, events: &[Event]) -> Result<usize, EngineError> {
        self.events_deferred(events)?.wait()
    }

    /// [`Engine::events`] up to the writes: counts the events in memory and
    /// queues their writes; the returned [`PendingEvents`] waits for them to
    /// be durable, blocking or async.
    pub fn events_deferred(&self, events: &[Event]) -> Result<PendingEvents<'_>, EngineError> {
        let reg = self.registry();
        for (i, e) in events.iter().enumerate() {
            let f = |x: &str| {
                if events.len() == 1 {
                    x.to_owned()
                } else {
                    format!("[{i}].{x}")
                }
            };
            if let Some(u) = &e.user {
                self.check_id(&f("user"), u)?;
            }
            self.check_id(&f("campaign"), &e.campaign)?;
            check_cost(&f("cost"), e.cost)?;
            if let Some(id) = &e.event_id {
                self.check_id(&f("event_id"), id)?;
            }
            if !reg.campaigns.contains_key(&e.campaign) {
                return Err(EngineError::NotFound(format!(
                    "{}: no campaign named {:?}",
                    f("campaign"),
                    e.campaign
                )));
            }
        }
        let now = self.now();
        self.expire_step(now);
        // Every user's record is read before anything is claimed or counted,
        // so a record that cannot be read (or, in a memory-only call, is on
        // disk) fails the batch with nothing applied.
        let users: Vec<Option<u128>> = events
            .iter()
            .map(|e| e.user.as_ref().map(|u| self.hash(b'u', 0, u)))
            .collect();
        for &k in users.iter().flatten() {
            self.with_record(k, &user_disk_key(k), now, |_| Ok(()))?;
        }
        // Claim the ids: of two concurrent batches with the same id, one
        // counts it. Still memory-only in such a call: an id the store cannot
        // look up from memory gives back every claim and fails the batch
        // with nothing applied.
        let expiry = now.saturating_add(self.options.dedupe_horizon);
        let mut fresh = Vec::with_capacity(events.len());
        let mut duplicates = 0;
        for (e, &user) in events.iter().zip(&users) {
            let Some(id) = &e.event_id else {
                fresh.push((e, user, None));
                continue;
            };
            let h = self.hash(b'e', 0, id);
            match self.claim_event_id(h, now) {
                Ok(true) => fresh.push((e, user, Some(h))),
                Ok(false) => duplicates += 1,
                Err(err) => {
                    self.unclaim_event_ids(&fresh);
                    return Err(err);
                }
            }
        }
        self.stats
            .duplicate_events
            .fetch_add(duplicates, Ordering::Relaxed);
        // From here on a miss reads the store even in a memory-only call: a
        // record just read may have been dropped again (an idle one is not
        // kept), and reading it anew, from memory as it just was, is better
        // than stopping with half the batch applied.
        let _may_read = super::MemoryOnly::lift();
        let mut receipts = Vec::with_capacity(fresh.len());
        for (i, &(e, user, h)) in fresh.iter().enumerate() {
            let Some(chain) = reg.chain(&e.campaign) else {
                self.unclaim_event_ids(&fresh[i..=i]);
                continue;
            };
            let mut extra: Batch = Vec::new();
            if let Some(h) = h {
                extra.push(Op::Put(
                    Space::Dedupe,
                    h.to_be_bytes().to_vec(),
                    codec::frame(expiry, &[]),
                ));
            }
            let r = match user {
                Some(k) => self.with_record(k, &user_disk_key(k), now, |rec| {
                    Ok(self.count_event(&reg, chain, Some((rec, k)), e.cost, now, extra))
                }),
                None => Ok(self.count_event(&reg, chain, None, e.cost, now, extra)),
            };
            match r {
                Ok(r) => {
                    if let Some(h) = h {
                        self.submitted_event_id(h, r.seq);
                    }
                    receipts.push(r);
                }
                Err(err) => {
                    self.unclaim_event_ids(&fresh[i..]);
                    return Err(err);
                }
            }
        }
        Ok(PendingEvents {
            counted: fresh.len(),
            receipts,
            counter: &self.stats.events,
        })
    }

    /// Claims event id `h` unless it was seen within the horizon (`false`:
    /// a duplicate): claimed by a batch not yet written, or in the store. In
    /// a memory-only call, fails with [`EngineError::NotInMemory`] where the
    /// store would have to read the disk to tell.
    fn claim_event_id(&self, h: u128, now: Nanos) -> Result<bool, EngineError> {
        let mut shard = self.dedupe.shard(h);
        // Pruned only once written, so what leaves here is in the store.
        shard.prune(self.store.written_seq());
        if shard.claimed.contains_key(&h) {
            return Ok(false);
        }
        let key = h.to_be_bytes();
        let stored = if super::memory_only() {
            match self.store.get_cached(Space::Dedupe, &key) {
                Some(r) => r?,
                None => return Err(EngineError::NotInMemory),
            }
        } else {
            self.store.get(Space::Dedupe, &key)?
        };
        // Compaction drops expired ids when it passes them; until then they
        // are still read, and are past their horizon.
        if stored
            .and_then(|v| codec::expiry_of(&v))
            .is_some_and(|exp| exp > now)
        {
            return Ok(false);
        }
        shard.claimed.insert(h, super::UNSUBMITTED);
        Ok(true)
    }

    /// Notes the batch that writes claimed id `h`: once it is written, the
    /// store answers for the id.
    fn submitted_event_id(&self, h: u128, seq: u64) {
        let mut guard = self.dedupe.shard(h);
        let shard = &mut *guard;
        if let Some(s) = shard.claimed.get_mut(&h) {
            *s = seq;
            shard.order.push_back((seq, h));
        }
    }

    /// Gives back the claims of events that were not submitted.
    fn unclaim_event_ids<E>(&self, fresh: &[(E, Option<u128>, Option<u128>)]) {
        for &(_, _, h) in fresh {
            if let Some(h) = h {
                let mut shard = self.dedupe.shard(h);
                if shard.claimed.get(&h) == Some(&super::UNSUBMITTED) {
                    shard.claimed.remove(&h);
                }
            }
        }
    }

    /// [`Engine::events_deferred`] if every user's record is in memory;
    /// `None`, having changed nothing, if one must be read from disk. See
    /// [`Engine::check_in_memory`].
    pub fn events_in_memory(
        &self,
        events: &[Event],
    ) -> Option<Result<PendingEvents<'_>, EngineError>> {
        let _only = super::MemoryOnly::set();
        match self.events_deferred(events) {
            Err(EngineError::NotInMemory) => None,
            r => Some(r),
        }
    }

    /// Debits one impression on every item of a chain, unchecked, and submits
    /// the records it changed.
    fn count_event(
        &self,
        reg: &Registry,
        chain: &[Arc<CampaignEntry>],
        mut user: Option<(&mut SubjectRecord, u128)>,
        cost: u64,
        now: Nanos,
        mut batch: Batch,
    ) -> Receipt {
        let mut guards = lock_chain(chain, false);
        for e in chain {
            for (i, cap) in e.compiled.items.iter().enumerate() {
                // An impression holds no slot of max_in_flight.
                if cap.item.kind() == Kind::Concurrency {
                    continue;
                }
                let t = e.tags[i];
                let rec: &mut SubjectRecord = match cap.scope {
                    Scope::User => match user.as_mut() {
                        Some((u, _)) => u,
                        None => continue,
                    },
                    Scope::Campaign => match guard_of(&mut guards, e.id) {
                        Some(r) => r,
                        None => continue,
                    },
                };
                let st = rec.state_mut(e.id, t);
                cap.item
                    .apply(st, now, units(&cap.item, cost), Hold::Immediate);
                rec.touch(e.id, t, &cap.item);
            }
        }
        let def = move |o: u32, t: u32| registry_item(reg, o, t);
        for (id, g) in guards.iter() {
            batch.push(Op::Put(
                Space::State,
                campaign_disk_key(*id),
                g.to_stored(now, def),
            ));
        }
        if let Some((u, k)) = user.as_mut() {
            batch.push(Op::Put(
                Space::State,
                user_disk_key(*k),
                u.to_stored(now, def),
            ));
        }
        let r = self.store.submit(batch, true);
        if let Some((u, _)) = user.as_mut() {
            u.write_seq = r.seq;
        }
        for (_, g) in guards.iter_mut() {
            g.write_seq = r.seq;
        }
        r
    }
}
