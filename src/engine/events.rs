//! `POST /v1/events`: impressions that happened without a reservation,
//! counted unchecked and deduplicated by event id within a horizon.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::clock::{Clock, Nanos};
use crate::limits::{Hold, Item, Kind};
use crate::model::Scope;
use crate::store::{Op, Receipt, Space, codec};

use super::chain::{Defs, Locking, guard_of, lock_chain, units};
use super::holds::RememberedId;
use super::hot::{Halt, Reads, RecordKey, if_in_memory, waited};
use super::persist::{Ack, Changes};
use super::record::SubjectRecord;
use super::registry::{CampaignEntry, Registry};
use super::request::{Event, check_cost};
use super::{Engine, EngineError};

/// Event ids claimed whose write may not be on disk yet. The ids seen
/// within the horizon live in the store's dedupe space, each written in the
/// same batch as the event it counts, and are looked up there when an id
/// comes (RocksDB's bloom filters answer a new id from memory): nothing is
/// loaded at open, and memory holds only the ids between their claim and
/// their write, a writer queue's worth. (Kept in memory for the whole
/// horizon, ids cost 76 bytes each of RSS — 612 MB after 30 s of unique-id
/// batches — and a restart with 5 million of them spent 7.7 s loading them
/// before it listened.)
///
/// Sharded by the id's hash, so lookups of different ids rarely wait on
/// each other; a lookup reads the store under its shard's lock, so of two
/// batches claiming the same id, exactly one finds it free.
pub(crate) struct Dedupe {
    shards: Box<[Mutex<DedupeShard>]>,
}

/// Claimed ids not yet known written: by hash, the sequence of the batch
/// that writes it ([`UNSUBMITTED`] until submitted), and in that order.
#[derive(Default)]
struct DedupeShard {
    claimed: HashMap<u128, u64>,
    order: VecDeque<(u64, u128)>,
}

/// The batch sequence of an id claimed but not yet submitted.
const UNSUBMITTED: u64 = u64::MAX;

/// How long a shared record remembers an event id it counted, so that a
/// retry of a write whose answer was lost does not count it again (the
/// cluster-wide claim holds it for the whole horizon, but is given back
/// when the count fails).
const EVENT_RETRY_MEMORY: Nanos = 5 * 60 * 1_000_000_000;

/// Which records an event is counted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sides {
    User,
    Campaign,
    Both,
}

/// An event id's key in a shared store.
fn event_key(h: u128) -> Vec<u8> {
    let mut k = Vec::with_capacity(17);
    k.push(b'e');
    k.extend_from_slice(&h.to_be_bytes());
    k
}

/// Shards of [`Dedupe`].
const DEDUPE_SHARDS: usize = 64;

impl Dedupe {
    pub(crate) fn new() -> Self {
        Dedupe {
            shards: (0..DEDUPE_SHARDS)
                .map(|_| Mutex::new(DedupeShard::default()))
                .collect(),
        }
    }

    fn shard(&self, h: u128) -> std::sync::MutexGuard<'_, DedupeShard> {
        self.shards[(h as usize) % DEDUPE_SHARDS]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl DedupeShard {
    /// Forgets claims whose batch is written: from now on the store has them.
    fn prune(&mut self, written: u64) {
        while let Some(&(seq, h)) = self.order.front() {
            if seq > written {
                break;
            }
            self.order.pop_front();
            if self.claimed.get(&h) == Some(&seq) {
                self.claimed.remove(&h);
            }
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

/// An event of a batch that is not a duplicate: its user's hash, and its
/// id's hash if it has an id (claimed).
struct NewEvent<'a> {
    event: &'a Event,
    user: Option<u128>,
    id: Option<u128>,
}

impl<C: Clock> Engine<C> {
    /// Counts impressions that happened without a reservation
    /// (docs/semantics.md §7.1): no check, idempotent by `event_id` within
    /// the dedupe horizon. A batch with any invalid event applies nothing.
    /// Durable before it returns. Returns how many events were counted
    /// (duplicates are not).
    pub fn events(&self, events: &[Event]) -> Result<usize, EngineError> {
        self.events_deferred(events)?.wait()
    }

    /// [`Engine::events`] up to the writes: counts the events in memory and
    /// queues their writes; the returned [`PendingEvents`] waits for them to
    /// be durable, blocking or async.
    pub fn events_deferred(&self, events: &[Event]) -> Result<PendingEvents<'_>, EngineError> {
        waited(self.events_with(events, Reads::MayWait))
    }

    /// [`Engine::events_deferred`] if every user's record is in memory;
    /// `None`, having changed nothing, if one must be read from disk. See
    /// [`Engine::check_in_memory`].
    pub fn events_in_memory(
        &self,
        events: &[Event],
    ) -> Option<Result<PendingEvents<'_>, EngineError>> {
        // With a shared store every decision calls the network: never on
        // the executor.
        // Other identities' records are written one after the other
        // (`super::identities`): not from memory only.
        if self.shared().is_some() || events.iter().any(|e| !e.ids.is_empty()) {
            return None;
        }
        if_in_memory(self.events_with(events, Reads::MemoryOnly))
    }

    fn events_with(&self, events: &[Event], reads: Reads) -> Result<PendingEvents<'_>, Halt> {
        let reg = self.registry();
        self.check_events(&reg, events)?;
        let now = self.now();
        self.expire_step(now, reads);
        // Every user's record is read before anything is claimed or counted,
        // so a record that cannot be read (or, in a memory-only call, is on
        // disk) fails the batch with nothing applied.
        let users: Vec<Option<u128>> = events
            .iter()
            .map(|e| e.user.as_ref().map(|u| self.hash(b'u', 0, u)))
            .collect();
        for &k in users.iter().flatten() {
            self.with_record(RecordKey::User(k), now, reads, |_, _| ())?;
        }
        // Claim the ids: of two concurrent batches with the same id, one
        // counts it. Still memory-only in such a call: an id the store cannot
        // look up from memory gives back every claim and fails the batch
        // with nothing applied.
        let expiry = now.saturating_add(self.options.dedupe_horizon);
        let mut new = Vec::with_capacity(events.len());
        let mut duplicates = 0;
        for (event, &user) in events.iter().zip(&users) {
            let Some(id) = &event.event_id else {
                new.push(NewEvent {
                    event,
                    user,
                    id: None,
                });
                continue;
            };
            let h = self.hash(b'e', 0, id);
            match self.claim_event_id(h, event, now, reads) {
                Ok(true) => new.push(NewEvent {
                    event,
                    user,
                    id: Some(h),
                }),
                Ok(false) => duplicates += 1,
                Err(err) => {
                    self.unclaim_event_ids(&new);
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
        let reads = Reads::MayWait;
        let shared = self.shared().is_some();
        let mut receipts = Vec::with_capacity(new.len());
        let mut already = 0;
        for (i, n) in new.iter().enumerate() {
            let Some(chain) = reg.chain(&n.event.campaign) else {
                self.unclaim_event_ids(&new[i..=i]);
                continue;
            };
            // A shared store claimed the id already, cluster-wide.
            let dedupe = n.id.filter(|_| !shared).map(|h| {
                Op::Put(
                    Space::Dedupe,
                    h.to_be_bytes().to_vec(),
                    codec::frame(expiry, &[]),
                )
            });
            let cost = n.event.cost;
            // The other identities' records first, each in its own batch
            // that remembers the event: a retry after a crash between them
            // counts each record once (`count_identity_event`).
            let idents = match self.identities("", &n.event.ids) {
                Ok(ids) => ids,
                Err(e) => {
                    self.unclaim_event_ids(&new[i..]);
                    return Err(e.into());
                }
            };
            for ident in idents {
                let used = chain.iter().any(|e| {
                    e.compiled
                        .items
                        .iter()
                        .any(|c| c.scope == Scope::Id(ident.kind))
                });
                if !used {
                    continue;
                }
                match self.count_identity_event(chain, ident, cost, now, n.id, expiry) {
                    Ok(Some(r)) => receipts.push(r),
                    Ok(None) => {}
                    Err(err) => {
                        self.unclaim_event_ids(&new[i..]);
                        return Err(err);
                    }
                }
            }
            let counted = match n.user {
                Some(k) => self
                    .with_record(RecordKey::User(k), now, reads, |rec, now| {
                        // With a shared store, the record also remembers the id
                        // for a while: a retry after a write whose answer was
                        // lost (applied or not, nobody knows) counts it once.
                        if let Some(h) = n.id.filter(|_| shared)
                            && !remember_event(rec, h as u64, now)
                        {
                            return (Receipt::done(0), false);
                        }
                        // With a shared store this may run again (the record
                        // moved under it): campaign records are counted once,
                        // after the user record is written.
                        let sides = if shared { Sides::User } else { Sides::Both };
                        let r = self.count_event(
                            &reg,
                            chain,
                            Some((k, rec)),
                            cost,
                            now,
                            dedupe.clone(),
                            sides,
                        );
                        (r, true)
                    })
                    .map(|(r, counted)| {
                        if shared && counted {
                            self.count_event(&reg, chain, None, cost, now, None, Sides::Campaign);
                        }
                        if !counted {
                            // Counted by an earlier call whose answer was
                            // lost: a duplicate now.
                            already += 1;
                        }
                        r
                    }),
                None => Ok(self.count_event(&reg, chain, None, cost, now, dedupe, Sides::Both)),
            };
            match counted {
                Ok(r) => {
                    if let Some(h) = n.id {
                        self.submitted_event_id(h, r.seq);
                    }
                    receipts.push(r);
                }
                Err(err) => {
                    self.unclaim_event_ids(&new[i..]);
                    return Err(err);
                }
            }
        }
        if shared {
            // Leased campaign state: report the spend now if more is
            // unreported than may be; should it fail, the next renewal
            // reports it (counters are absolute).
            let chains: Vec<Arc<CampaignEntry>> = new
                .iter()
                .filter_map(|n| reg.chain(&n.event.campaign))
                .flat_map(|c| c.iter().cloned())
                .collect();
            if let Err(e) = self.report_spend(chains.iter()) {
                tracing::debug!("spend report after events failed: {e}");
            }
        }
        self.stats
            .duplicate_events
            .fetch_add(already as u64, Ordering::Relaxed);
        Ok(PendingEvents {
            counted: new.len() - already,
            receipts,
            counter: &self.stats.events,
        })
    }

    /// Checks every event of a batch (field names indexed in a batch of
    /// several).
    fn check_events(&self, reg: &Registry, events: &[Event]) -> Result<(), EngineError> {
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
            self.identities(&f(""), &e.ids)?;
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
        Ok(())
    }

    /// Claims event id `h` unless it was seen within the horizon (`false`:
    /// a duplicate): claimed by a batch not yet written, or in the store.
    /// Under [`Reads::MemoryOnly`], stops where the store would have to read
    /// the disk to tell.
    fn claim_event_id(
        &self,
        h: u128,
        event: &Event,
        now: Nanos,
        reads: Reads,
    ) -> Result<bool, Halt> {
        if let Some(shared) = self.shared() {
            // Cluster-wide: set if absent, expiring with the horizon; a
            // claim already there is a duplicate, whichever node made it
            // (the claim is the count: a user-less event is counted on this
            // node's leased campaign state, which no other node can see).
            // The value, what the event says, is there for whoever reads
            // Redis.
            if reads == Reads::MemoryOnly {
                return Err(Halt::NotInMemory);
            }
            let expiry = now.saturating_add(self.options.dedupe_horizon);
            let token = self
                .hash(
                    b'E',
                    0,
                    &format!(
                        "{}\u{0}{}\u{0}{}",
                        event.user.as_deref().unwrap_or(""),
                        event.campaign,
                        event.cost
                    ),
                )
                .to_be_bytes();
            return Ok(shared.claim(&event_key(h), expiry, &token)?);
        }
        let mut shard = self.dedupe.shard(h);
        // Pruned only once written, so what leaves here is in the store.
        shard.prune(self.store.written_seq());
        if shard.claimed.contains_key(&h) {
            return Ok(false);
        }
        let key = h.to_be_bytes();
        let stored = match reads {
            Reads::MemoryOnly => self
                .store
                .get_cached(Space::Dedupe, &key)
                .ok_or(Halt::NotInMemory)??,
            Reads::MayWait => self.store.get(Space::Dedupe, &key)?,
        };
        // Compaction drops expired ids when it passes them; until then they
        // are still read, and are past their horizon.
        if stored
            .and_then(|v| codec::expiry_of(&v))
            .is_some_and(|exp| exp > now)
        {
            return Ok(false);
        }
        shard.claimed.insert(h, UNSUBMITTED);
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
    fn unclaim_event_ids(&self, new: &[NewEvent<'_>]) {
        if let Some(shared) = self.shared() {
            for h in new.iter().filter_map(|n| n.id) {
                // Best effort: a claim left behind makes a retry of an event
                // that was not counted a duplicate (docs/cluster.md).
                let _ = shared.unclaim(&event_key(h));
            }
            return;
        }
        for h in new.iter().filter_map(|n| n.id) {
            let mut shard = self.dedupe.shard(h);
            if shard.claimed.get(&h) == Some(&UNSUBMITTED) {
                shard.claimed.remove(&h);
            }
        }
    }

    /// Debits one impression on every item of a chain, unchecked, and writes
    /// the records it changed with the event's id.
    #[allow(clippy::too_many_arguments)]
    fn count_event(
        &self,
        reg: &Registry,
        chain: &[Arc<CampaignEntry>],
        mut user: Option<(u128, &mut SubjectRecord)>,
        cost: u64,
        now: Nanos,
        dedupe: Option<Op>,
        sides: Sides,
    ) -> Receipt {
        let mut guards = match sides {
            Sides::User => Default::default(),
            Sides::Campaign | Sides::Both => lock_chain(chain, Locking::Deciding),
        };
        for e in chain {
            for (i, cap) in e.compiled.items.iter().enumerate() {
                if (sides == Sides::User && cap.scope == Scope::Campaign)
                    || (sides == Sides::Campaign && cap.scope == Scope::User)
                {
                    continue;
                }
                // Counted on their own records (`count_identity_event`).
                if matches!(cap.scope, Scope::Id(_)) {
                    continue;
                }
                // An impression holds no place of max_in_flight.
                if cap.item.kind() == Kind::Concurrency {
                    continue;
                }
                let t = e.tags[i];
                let rec: &mut SubjectRecord = match cap.scope {
                    Scope::User => match user.as_mut() {
                        Some((_, u)) => u,
                        None => continue,
                    },
                    Scope::Campaign => match guard_of(&mut guards, e.id) {
                        Some(r) => r,
                        None => continue,
                    },
                    Scope::Id(_) => continue,
                };
                let st = rec.state_mut(e.id, t);
                cap.item
                    .apply(st, now, units(&cap.item, cost), Hold::Immediate);
                if cap.scope == Scope::Campaign && self.shared().is_some() {
                    // A token line counts this node's spend itself.
                    if let Item::Rate { .. } = cap.item {
                        self.leases
                            .commit_line((e.id, t, 0), units(&cap.item, cost));
                    }
                }
                rec.touch(e.id, t, &cap.item);
            }
        }
        let mut changes = Changes::new();
        if let Some(op) = dedupe {
            changes.op(op);
        }
        for (id, g) in guards.iter_mut() {
            changes.record(RecordKey::Campaign(*id), g);
        }
        if let Some((k, u)) = user {
            changes.record(RecordKey::User(k), u);
        }
        self.persist(changes, Defs::Registry(reg), now, Ack::Durable)
    }

    /// Debits one impression on the caps of `chain` scoped to `ident`'s
    /// kind, unchecked, on its record, and writes it. An event with an id is
    /// remembered there (with a shared store in the record, else beside it
    /// in the dedupe space, in the same batch), so that its retry after a
    /// crash that wrote this record and not the user's counts it once here.
    fn count_identity_event(
        &self,
        chain: &[Arc<CampaignEntry>],
        ident: super::identities::Ident,
        cost: u64,
        now: Nanos,
        id: Option<u128>,
        expiry: Nanos,
    ) -> Result<Option<Receipt>, Halt> {
        let shared = self.shared().is_some();
        let mark = id.map(|h| self.hash_bytes(b'e', 1, &(h ^ ident.key).to_be_bytes()));
        if !shared
            && let Some(m) = mark
            && self
                .store
                .get(Space::Dedupe, &m.to_be_bytes())?
                .and_then(|v| codec::expiry_of(&v))
                .is_some_and(|exp| exp > now)
        {
            return Ok(None);
        }
        let reg = self.registry();
        self.with_record(
            RecordKey::PolicyKey(ident.key),
            now,
            Reads::MayWait,
            |rec, now| {
                if shared
                    && let Some(m) = mark
                    && !remember_event(rec, m as u64, now)
                {
                    return None;
                }
                for e in chain {
                    for (i, cap) in e.compiled.items.iter().enumerate() {
                        if cap.scope != Scope::Id(ident.kind) {
                            continue;
                        }
                        let t = e.tags[i];
                        let n = units(&cap.item, cost);
                        cap.item
                            .apply(rec.state_mut(e.id, t), now, n, Hold::Immediate);
                        rec.touch(e.id, t, &cap.item);
                    }
                }
                let mut changes = Changes::new();
                if let Some(m) = mark.filter(|_| !shared) {
                    changes.op(Op::Put(
                        Space::Dedupe,
                        m.to_be_bytes().to_vec(),
                        codec::frame(expiry, &[]),
                    ));
                }
                changes.record(RecordKey::PolicyKey(ident.key), rec);
                Some(self.persist(changes, Defs::Registry(&reg), now, Ack::Durable))
            },
        )
    }
}

/// With a shared store, has `rec` remember event `res` for a while (a
/// retry after a write whose answer was lost, applied or not, then counts
/// it once); `false` if it remembers it already (counted before).
fn remember_event(rec: &mut SubjectRecord, res: u64, now: Nanos) -> bool {
    if rec
        .shared_meta()
        .is_some_and(|m| m.remembered.iter().any(|s| s.res == res))
    {
        return false;
    }
    let until = now.saturating_add(EVENT_RETRY_MEMORY);
    rec.shared_meta_mut().remembered.push(RememberedId {
        res,
        deadline: until,
        committed: true,
        campaigns: Vec::new(),
        final_cost: None,
        charged: false,
    });
    rec.idle_at = rec.idle_at.max(until);
    true
}
