//! Open reservations: by id, with their deadlines in an ordered set keyed by
//! (deadline, id), so expiry takes the due ones from the front and never scans
//! the rest (as mini-redis keeps its expirations).
//!
//! **Memory.** Each reservation's bytes are counted (an estimate from its
//! parts: see [`Footprint`]) for as long as the table holds it, open or
//! remembered as settled, together with the debits it holds in records and
//! the user record it keeps in memory. They count against the engine's
//! memory budget: reservations may use up to half of it, and the part that
//! lies outside the hot tier (this table, debits in campaign records)
//! shrinks what the hot tier may use, so the two together stay within the
//! budget. Past that share, or past `max_open_reservations`, a new
//! reservation is refused ([`Begin::Overloaded`]; HTTP 503) rather than
//! allocated.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};

use crate::clock::Nanos;
use crate::limits::stack::Stack;
use crate::model::Scope;

use super::record::{ALLOC_OVERHEAD, list_entry_bytes, map_entry_bytes, pinned_record_bytes};
use super::registry::Chain;
use super::request::{CandidateResult, CheckOutcome, CommitOutcome, DeniedBy, ScreenOutcome};
use super::{Conflict, EngineError};

/// The first answer of a reservation, returned again to a repeat.
#[derive(Debug, Clone)]
pub enum Answer {
    /// Boxed: a decision with its figures is several times a screen's size.
    Check(Box<CheckOutcome>),
    Screen(ScreenOutcome),
}

/// What a reservation has reserved, to settle it: where its pending debits
/// are and the definitions they were made under. (Not to be confused with
/// [`crate::limits::Hold`], how one item is debited.)
#[derive(Debug)]
pub enum Reserved {
    Check {
        /// The policy key's (or inline key's) hashed id.
        key: u128,
        def_id: u32,
        stack: Arc<Stack>,
        tags: Vec<u32>,
    },
    Screen {
        user: Option<u128>,
        /// The other identities' records holding its debits (their keys,
        /// in kind order: `super::identities`).
        ids: Vec<u128>,
        /// The eligible candidates.
        candidates: Vec<HeldCandidate>,
    },
}

/// An eligible candidate of a reserving screen.
#[derive(Debug, Clone)]
pub struct HeldCandidate {
    /// Its index in the request: tags its pending debits.
    pub index: u32,
    pub campaign: Arc<str>,
    pub chain: Chain,
}

/// The bytes a reservation accounts for while open (see [`Footprint`]): its
/// table entry, its answer and what it reserved, and its debits in every
/// record, with the user or key record they pin. An estimate from the
/// parts' sizes, made once per reservation in O(its candidates and their
/// chains' items).
pub fn footprint(id: &str, answer: &Answer, reserved: &Reserved) -> Footprint {
    use std::mem::size_of;
    // The id's three copies, the answer's list, the `Arc` and list of what
    // is reserved.
    let mut outside =
        entry_bytes(id.len()) + size_of::<Reserved>() + 2 * size_of::<usize>() + 6 * ALLOC_OVERHEAD;
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
    match reserved {
        Reserved::Check { tags, .. } => {
            outside += tags.capacity() * size_of::<u32>();
            inside += list_entry_bytes(tags.len()) + pinned_record_bytes(tags.len());
        }
        Reserved::Screen {
            user,
            ids,
            candidates,
        } => {
            outside += candidates.capacity() * size_of::<HeldCandidate>();
            outside += ids.capacity() * size_of::<u128>();
            let mut user_entries = 0;
            let mut id_entries = 0;
            for c in candidates {
                for e in c.chain.iter() {
                    for cap in &e.compiled.items {
                        match cap.scope {
                            Scope::Campaign => outside += map_entry_bytes(),
                            Scope::User if user.is_some() => user_entries += 1,
                            Scope::User => {}
                            Scope::Id(_) => id_entries += 1,
                        }
                    }
                }
            }
            if user_entries > 0 {
                inside += list_entry_bytes(user_entries) + pinned_record_bytes(user_entries);
            }
            // At most this many entries, in the records of `ids`.
            if id_entries > 0 && !ids.is_empty() {
                inside +=
                    ids.len() * (list_entry_bytes(id_entries) + pinned_record_bytes(id_entries));
            }
        }
    }
    Footprint {
        total: outside + inside,
        outside,
    }
}

/// Where a reservation is in its life.
#[derive(Debug, Clone)]
pub enum State {
    /// Its first request is being decided; a second with the same id waits for
    /// nothing and gets 409.
    Deciding,
    /// Holding pending debits; the stored first answer.
    Open(Answer),
    /// Settled: remembered until the original deadline so a repeat gets the
    /// first outcome (docs/semantics.md §4.5). A repeat waits on the [`FirstResult`] latch,
    /// so it is not acknowledged before the first one's write is durable.
    Committed(CommitOutcome, Arc<FirstResult>),
    Released(CommitOutcome, Arc<FirstResult>),
}

/// The longest a repeat waits for the first settle of the same id.
const SETTLE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// How a settling call ends a reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    Commit,
    Release,
}

/// Who wins a commit (docs/semantics.md §6.5, "Naming the winners"): for each
/// campaign named, in order, the first candidate of that campaign not
/// already chosen (a campaign listed twice in a screen can win twice). Each
/// name gets its winner's index, or `None` when no candidate is left for
/// it. The one rule, whatever keeps the reservation: this node's table,
/// a shared record, another identity's record or the campaign side (`K`:
/// campaign names or ids, as each keeps them).
pub(crate) fn winners<K: PartialEq>(
    candidates: &[(u32, K)],
    named: impl IntoIterator<Item = K>,
) -> Vec<Option<u32>> {
    let mut chosen: Vec<u32> = Vec::new();
    named
        .into_iter()
        .map(|name| {
            let won = candidates
                .iter()
                .find(|(i, c)| *c == name && !chosen.contains(i))
                .map(|(i, _)| *i);
            chosen.extend(won);
            won
        })
        .collect()
}

/// [`winners`] for a commit as a client asks it: every candidate when it
/// names none; else each of `campaigns` (as `key` makes it) must win one,
/// or the commit is refused naming the first that fits none (nothing is
/// settled). The winners' indexes, in the order named.
pub(crate) fn commit_winners<'c, K: PartialEq>(
    candidates: &[(u32, K)],
    campaigns: &'c [String],
    key: impl Fn(&'c str) -> K,
    id: &str,
) -> Result<Vec<u32>, EngineError> {
    if campaigns.is_empty() {
        return Ok(candidates.iter().map(|(i, _)| *i).collect());
    }
    winners(candidates, campaigns.iter().map(|n| key(n)))
        .into_iter()
        .enumerate()
        .map(|(n, won)| won.ok_or_else(|| super::request::not_a_winner(campaigns, n, id)))
        .collect()
}

/// How a reservation is settled, with what a commit chose: a screen's
/// winning candidate indexes on this node (`[u32]`), or the campaign names
/// a commit gave, settled in a shared record (`[String]`, `placement/in_record.rs`).
#[derive(Debug)]
pub(crate) enum Settlement<'a, C: ?Sized> {
    /// Committed: `chosen` (for a check, empty: its debits), at the final
    /// cost if given; the candidates not chosen are released.
    Commit {
        chosen: &'a C,
        final_cost: Option<u64>,
    },
    Release,
}

// By hand: a derive would ask `C: Copy`, which `[u32]` is not.
impl<C: ?Sized> Clone for Settlement<'_, C> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<C: ?Sized> Copy for Settlement<'_, C> {}

/// Set once the settling call has applied (and, for a commit, durably
/// written) what it settled. A std mutex and condvar: waiters are repeats of
/// one id, rare and short, and they wait on a writer thread, not a task.
#[derive(Debug, Default)]
pub struct FirstResult {
    result: Mutex<Option<Result<(), EngineError>>>,
    done: Condvar,
    /// The same for async repeats.
    done_async: tokio::sync::Notify,
}

impl FirstResult {
    /// Publishes the first call's result to every repeat.
    pub fn set(&self, result: Result<(), EngineError>) {
        *self.result.lock().unwrap_or_else(PoisonError::into_inner) = Some(result);
        self.done.notify_all();
        self.done_async.notify_waiters();
    }

    /// Whether the first call has published its result.
    pub fn is_set(&self) -> bool {
        self.result
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }

    /// [`FirstResult::wait`] for async callers. Unbounded: the first call always
    /// sets the latch, also when its caller goes away (see `PendingCommit`).
    pub async fn wait_async(&self) -> Result<(), EngineError> {
        loop {
            let done = self.done_async.notified();
            let mut done = std::pin::pin!(done);
            done.as_mut().enable();
            if let Some(r) = self
                .result
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .as_ref()
            {
                return r.clone();
            }
            done.await;
        }
    }

    /// Waits until the first call has its result, and returns it. The wait is
    /// bounded: should the first call never finish (a bug), a repeat gets a
    /// conflict to retry rather than a thread blocked for good.
    pub fn wait(&self) -> Result<(), EngineError> {
        let r = self.result.lock().unwrap_or_else(PoisonError::into_inner);
        let (r, _) = self
            .done
            .wait_timeout_while(r, SETTLE_WAIT, |r| r.is_none())
            .unwrap_or_else(PoisonError::into_inner);
        match r.as_ref() {
            Some(r) => r.clone(),
            None => Err(EngineError::Conflict(Conflict::StillSettling)),
        }
    }
}

/// One reservation.
#[derive(Debug, Clone)]
pub struct Reservation {
    /// Internal number, tagging its pending debits in records.
    pub seq: u64,
    pub deadline: Nanos,
    /// Hash of the request body, to tell a repeat from a different request.
    pub body: u64,
    pub state: State,
    /// What it reserved; shared with whoever settles it. Dropped once settled.
    pub reserved: Option<Arc<Reserved>>,
    /// The bytes counted for it now.
    pub footprint: Footprint,
}

/// Bytes a reservation accounts for: `total` in all, of which `outside` lie
/// outside the hot tier (its entry here, its debits in campaign records); the
/// rest (debits in user and policy-key records, the records they pin) the
/// hot tier holds and counts itself.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Footprint {
    pub total: usize,
    pub outside: usize,
}

/// Bytes of a table entry apart from its answer and what it holds: the map's
/// slot (at hashbrown's 7/8 load), the ordered set's (B-tree nodes are about
/// two-thirds full), the id three times (map key, set key, outcome) and the
/// settle latch.
pub fn entry_bytes(id_len: usize) -> usize {
    (std::mem::size_of::<(String, Reservation)>() + 1) * 8 / 7
        + std::mem::size_of::<(Nanos, String)>() * 3 / 2
        + 3 * id_len
        + std::mem::size_of::<FirstResult>()
}

#[derive(Default)]
struct Table {
    by_id: HashMap<String, Reservation>,
    deadlines: BTreeSet<(Nanos, String)>,
}

/// See the module documentation.
pub struct Reservations {
    /// Most reservations open at once.
    max_open: usize,
    /// Most bytes reservations may account for.
    max_bytes: usize,
    /// Bytes accounted for by every reservation in the table.
    bytes: AtomicUsize,
    /// The part of `bytes` outside the hot tier; the hot tier reads it.
    outside: Arc<AtomicUsize>,
    /// One std mutex: every operation is a map lookup or an ordered-set step,
    /// and it is never held while records are locked.
    table: Mutex<Table>,
    /// The earliest deadline in the table (`u64::MAX` when empty), read without
    /// the lock so requests with nothing due skip it.
    next_deadline: AtomicU64,
    next_seq: AtomicU64,
    open: AtomicU64,
}

impl Default for Reservations {
    fn default() -> Self {
        Self::new(usize::MAX, usize::MAX, Arc::default())
    }
}

impl Reservations {
    /// A table of at most `max_open` open reservations using at most
    /// `max_bytes`, whose bytes outside the hot tier are published in
    /// `outside`.
    pub fn new(max_open: usize, max_bytes: usize, outside: Arc<AtomicUsize>) -> Self {
        Reservations {
            max_open,
            max_bytes,
            bytes: AtomicUsize::new(0),
            outside,
            table: Mutex::new(Table::default()),
            next_deadline: AtomicU64::new(u64::MAX),
            next_seq: AtomicU64::new(1),
            open: AtomicU64::new(0),
        }
    }

    fn count(&self, f: Footprint) {
        self.bytes.fetch_add(f.total, Ordering::Relaxed);
        self.outside.fetch_add(f.outside, Ordering::Relaxed);
    }

    fn uncount(&self, f: Footprint) {
        self.bytes.fetch_sub(f.total, Ordering::Relaxed);
        self.outside.fetch_sub(f.outside, Ordering::Relaxed);
    }

    /// Bytes accounted for by reservations (open and remembered).
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }
}

/// A reservation id a request claimed ([`Begin::New`]), and its internal
/// number.
pub struct Claim {
    pub id: String,
    pub seq: u64,
}

/// What [`Reservations::begin`] found.
pub enum Begin {
    /// The id is new: decide, then [`Reservations::finish`] or
    /// [`Reservations::abandon`].
    New { seq: u64 },
    /// The same request again: its first answer.
    Repeat(Answer),
    /// The id is taken by another request, or settled.
    Conflict(Conflict),
    /// No room for another reservation (open count or memory): why.
    Overloaded(String),
}

/// What [`Reservations::settle`] found.
pub enum Settle {
    /// Was open: now settled by this call, which must apply it and then set
    /// `settled`.
    Apply {
        reserved: Arc<Reserved>,
        seq: u64,
        outcome: CommitOutcome,
        /// Candidates to commit (a screen's winners).
        chosen: Vec<u32>,
        settled: Arc<FirstResult>,
    },
    /// Settled before by the same operation: its outcome, to give once the
    /// latch says the first call succeeded.
    Repeat(CommitOutcome, Arc<FirstResult>),
    /// Settled before by the other operation, or still being decided.
    Conflict(Conflict),
    /// The request does not fit the reservation (left open).
    Rejected(EngineError),
    /// Unknown or forgotten id.
    Unknown,
    /// Open, but its deadline has passed and expiry has not got to it yet (a
    /// backlog): taken out as expiry would, for the caller to release as of
    /// `deadline`; then the id is unknown.
    Expired {
        reserved: Arc<Reserved>,
        seq: u64,
        deadline: Nanos,
    },
}

/// A reservation taken out of the table at its deadline, to release.
pub struct Due {
    pub reserved: Arc<Reserved>,
    pub seq: u64,
    pub deadline: Nanos,
}

impl Reservations {
    /// The latest deadline of an open reservation (0 when none is open):
    /// until then another node may commit one of this node's holds.
    pub fn latest_deadline(&self) -> Nanos {
        self.lock().deadlines.last().map_or(0, |d| d.0)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed) as usize
    }

    /// Open screen reservations holding each of `campaigns` (as a
    /// candidate), for the per-campaign metrics: one pass over the table
    /// under its lock, at scrape time only.
    pub fn open_by_campaign(&self, campaigns: &[&str]) -> Vec<u64> {
        let index: HashMap<&str, usize> =
            campaigns.iter().enumerate().map(|(i, c)| (*c, i)).collect();
        let mut n = vec![0u64; campaigns.len()];
        let t = self.lock();
        for r in t.by_id.values() {
            if let (State::Open(_), Some(reserved)) = (&r.state, &r.reserved)
                && let Reserved::Screen { candidates, .. } = &**reserved
            {
                for c in candidates {
                    if let Some(&i) = index.get(&*c.campaign) {
                        n[i] += 1;
                    }
                }
            }
        }
        n
    }

    /// A fresh internal number (also for generated ids).
    pub fn next_seq(&self) -> u64 {
        self.next_seq.fetch_add(1, Ordering::Relaxed)
    }

    /// Claims `id` for a new reservation with `deadline`, numbered `seq`
    /// (with a shared store, the id's hash, the same on every node) or a
    /// fresh number.
    pub fn begin(&self, id: &str, body: u64, deadline: Nanos, seq: Option<u64>) -> Begin {
        let mut t = self.lock();
        if let Some(r) = t.by_id.get(id) {
            return match &r.state {
                State::Open(a) if r.body == body => Begin::Repeat(a.clone()),
                State::Open(_) => Begin::Conflict(Conflict::DifferentRequest { id: id.into() }),
                State::Deciding => Begin::Conflict(Conflict::BeingDecided { id: id.into() }),
                State::Committed(..) | State::Released(..) => {
                    Begin::Conflict(Conflict::AlreadySettled { id: id.into() })
                }
            };
        }
        let open = self.open();
        if open >= self.max_open {
            return Begin::Overloaded(format!(
                "{open} reservations are open, the most max_open_reservations allows; \
                 commit or release some, or retry shortly"
            ));
        }
        let bytes = self.bytes();
        if bytes >= self.max_bytes {
            return Begin::Overloaded(format!(
                "open reservations use {bytes} bytes, their share (half) of the memory \
                 budget; commit or release some, or retry shortly"
            ));
        }
        let seq = seq.unwrap_or_else(|| self.next_seq());
        t.by_id.insert(
            id.to_owned(),
            Reservation {
                seq,
                deadline,
                body,
                state: State::Deciding,
                reserved: None,
                footprint: Footprint::default(),
            },
        );
        Begin::New { seq }
    }

    /// Records the answer of a reservation that now holds debits, and the
    /// bytes it accounts for.
    pub fn finish(&self, id: &str, answer: Answer, reserved: Reserved, footprint: Footprint) {
        let mut t = self.lock();
        let Some(r) = t.by_id.get_mut(id) else { return };
        r.state = State::Open(answer);
        r.reserved = Some(Arc::new(reserved));
        r.footprint = footprint;
        self.count(footprint);
        let deadline = r.deadline;
        t.deadlines.insert((deadline, id.to_owned()));
        self.open.fetch_add(1, Ordering::Relaxed);
        self.next_deadline.fetch_min(deadline, Ordering::AcqRel);
    }

    /// What open reservation `id` reserved, if this node made it.
    pub fn reserved(&self, id: &str) -> Option<Arc<Reserved>> {
        self.lock().by_id.get(id).and_then(|r| r.reserved.clone())
    }

    /// Forgets reservation `id`, settled elsewhere (a shared store: its
    /// record says how); its deadline entry is skipped when it comes.
    pub fn forget(&self, id: &str) {
        let mut t = self.lock();
        if let Some(r) = t.by_id.remove(id) {
            self.uncount(r.footprint);
            if matches!(r.state, State::Open(_)) {
                self.open.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// Forgets a claim whose request reserved nothing (denied, or failed).
    pub fn abandon(&self, id: &str) {
        self.lock().by_id.remove(id);
    }

    /// Settles `id` as `ending` says, if open. `outcome` computes, from what
    /// the reservation reserved, the outcome to remember and the candidates
    /// to commit; an error from it leaves the reservation open.
    pub fn settle(
        &self,
        id: &str,
        ending: Ending,
        now: Nanos,
        outcome: impl FnOnce(&Reserved) -> Result<(CommitOutcome, Vec<u32>), EngineError>,
    ) -> Settle {
        let mut t = self.lock();
        let Some(r) = t.by_id.get_mut(id) else {
            return Settle::Unknown;
        };
        if r.deadline <= now && matches!(r.state, State::Open(_)) {
            let deadline = r.deadline;
            let taken = t.by_id.remove(id);
            t.deadlines.remove(&(deadline, id.to_owned()));
            return match taken {
                Some(r) => {
                    self.uncount(r.footprint);
                    self.open.fetch_sub(1, Ordering::Relaxed);
                    match r.reserved {
                        Some(reserved) => Settle::Expired {
                            reserved,
                            seq: r.seq,
                            deadline,
                        },
                        None => Settle::Unknown,
                    }
                }
                None => Settle::Unknown,
            };
        }
        match &r.state {
            State::Open(_) => {
                let Some(reserved) = r.reserved.clone() else {
                    return Settle::Unknown;
                };
                let (o, chosen) = match outcome(&reserved) {
                    Ok(x) => x,
                    Err(e) => return Settle::Rejected(e),
                };
                // Remembered until the deadline is the outcome only: what it
                // held goes (its debits leave the records as this settles).
                r.reserved = None;
                let settled_bytes = entry_bytes(id.len())
                    + o.campaigns.capacity() * std::mem::size_of::<Arc<str>>();
                let now_counted = Footprint {
                    total: settled_bytes,
                    outside: settled_bytes,
                };
                self.uncount(r.footprint);
                self.count(now_counted);
                r.footprint = now_counted;
                let settled = Arc::new(FirstResult::default());
                r.state = match ending {
                    Ending::Commit => State::Committed(o.clone(), settled.clone()),
                    Ending::Release => State::Released(o.clone(), settled.clone()),
                };
                self.open.fetch_sub(1, Ordering::Relaxed);
                Settle::Apply {
                    reserved,
                    seq: r.seq,
                    outcome: o,
                    chosen,
                    settled,
                }
            }
            State::Committed(o, s) if ending == Ending::Commit => {
                Settle::Repeat(o.clone(), s.clone())
            }
            State::Released(o, s) if ending == Ending::Release => {
                Settle::Repeat(o.clone(), s.clone())
            }
            State::Committed(..) => Settle::Conflict(Conflict::SettledOtherwise {
                id: id.into(),
                outcome: super::Outcome::Committed,
            }),
            State::Released(..) => Settle::Conflict(Conflict::SettledOtherwise {
                id: id.into(),
                outcome: super::Outcome::Released,
            }),
            State::Deciding => Settle::Conflict(Conflict::BeingDecided { id: id.into() }),
        }
    }

    /// Takes up to `most` reservations whose deadline is ≤ `now` out of the
    /// table (the earliest first) and returns those still open, with their
    /// deadlines, for release. The lock is held for those only: taking all of
    /// 500 000 due at once held it for 0.4 s, and every request waited.
    pub fn take_due(&self, now: Nanos, most: usize) -> Vec<Due> {
        if self.next_deadline.load(Ordering::Acquire) > now {
            return Vec::new();
        }
        let mut t = self.lock();
        let mut due = Vec::new();
        let mut taken = 0;
        while let Some((deadline, id)) = t.deadlines.first().cloned() {
            if deadline > now || taken >= most {
                break;
            }
            taken += 1;
            t.deadlines.pop_first();
            if let Some(r) = t.by_id.remove(&id) {
                self.uncount(r.footprint);
                if let (State::Open(_), Some(reserved)) = (&r.state, r.reserved) {
                    self.open.fetch_sub(1, Ordering::Relaxed);
                    due.push(Due {
                        reserved,
                        seq: r.seq,
                        deadline,
                    });
                }
            }
        }
        let next = t.deadlines.first().map_or(u64::MAX, |d| d.0);
        self.next_deadline.store(next, Ordering::Release);
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HELD: [(u32, &str); 4] = [(0, "a"), (2, "b"), (3, "a"), (5, "c")];

    #[test]
    fn each_name_wins_its_first_candidate_not_chosen() {
        assert_eq!(winners(&HELD, ["a", "a", "c"]), [Some(0), Some(3), Some(5)]);
        assert_eq!(winners(&HELD, ["b", "a"]), [Some(2), Some(0)]);
        // A third "a" fits none; the names after it still win.
        assert_eq!(
            winners(&HELD, ["a", "a", "a", "b"]),
            [Some(0), Some(3), None, Some(2)]
        );
        assert_eq!(winners(&HELD, ["z"]), [None]);
        assert!(winners(&HELD, std::iter::empty()).is_empty());
    }

    #[test]
    fn a_commit_naming_none_wins_all_and_a_name_fitting_none_is_refused() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            commit_winners(&HELD, &[], |n| n, "r").expect("all"),
            [0, 2, 3, 5]
        );
        let two_a = names(&["a", "c", "a"]);
        assert_eq!(
            commit_winners(&HELD, &two_a, |n| n, "r").expect("named"),
            [0, 5, 3]
        );
        let three_b = names(&["b", "b"]);
        let e = commit_winners(&HELD, &three_b, |n| n, "r").expect_err("b once");
        assert!(e.to_string().contains("campaign[1]"), "{e}");
    }
}
