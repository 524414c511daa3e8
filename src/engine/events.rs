//! `POST /v1/events`: impressions that happened without a reservation, and
//! events of other types (clicks), counted unchecked and deduplicated by
//! event id within a horizon.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::clock::{Clock, Nanos};
use crate::limits::{Hold, Kind};
use crate::model::{EventType, Scope};
use crate::store::{Op, Receipt};

use super::chain::{Defs, Locking, counts_event, guard_of, lock_chain, units};
use super::hot::{Halt, Reads, RecordKey, waited};
use super::persist::{Ack, Changes};
use super::record::SubjectRecord;
use super::registry::{CampaignEntry, Registry};
use super::request::{Event, check_cost};
use super::{Engine, EngineError};

/// Which records an event is counted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sides {
    User,
    Campaign,
    Both,
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

/// The ids of `new`'s events that have one.
fn ids<'a>(new: &'a [NewEvent<'_>]) -> impl Iterator<Item = u128> + 'a {
    new.iter().filter_map(|n| n.id)
}

/// An event of a batch that is not a duplicate: its user's hash, and its
/// id's hash if it has an id (claimed).
struct NewEvent<'a> {
    event: &'a Event,
    user: Option<u128>,
    id: Option<u128>,
}

/// An event's type (checked with its batch, [`Engine::check_events`]).
fn type_of(e: &Event) -> EventType {
    e.event_type
        .as_deref()
        .and_then(|t| EventType::parse(t).ok())
        .unwrap_or_default()
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
        waited(self.events_with(events, Reads::MayWait, false))
    }

    /// Units another region counted (`super::travellers`), applied to their
    /// users' records only: each campaign's own side (budgets, campaign
    /// caps) was counted where they happened, and is leased across regions.
    /// Durable before it returns; returns how many were new here.
    pub(crate) fn foreign_events(&self, events: &[Event]) -> Result<usize, EngineError> {
        if events.is_empty() {
            return Ok(0);
        }
        waited(self.events_with(events, Reads::MayWait, true))?.wait()
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
        if events.iter().any(|e| !e.ids.is_empty()) {
            return None;
        }
        self.in_memory_if(false, || self.events_with(events, Reads::MemoryOnly, false))
    }

    /// Counts `events`; `foreign` ones on their users' records only, not
    /// counted again for another region ([`Engine::foreign_events`]).
    fn events_with(
        &self,
        events: &[Event],
        reads: Reads,
        foreign: bool,
    ) -> Result<PendingEvents<'_>, Halt> {
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
                    self.unclaim_event_ids(ids(&new));
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
        // A decision on a shared record may run again (another node wrote
        // it meanwhile): campaign records are then counted once, after.
        let sides = match self.placement.may_decide_again() {
            _ if foreign => Sides::User,
            true => Sides::User,
            false => Sides::Both,
        };
        let mut receipts = Vec::with_capacity(new.len());
        let mut already = 0;
        for (i, n) in new.iter().enumerate() {
            let Some(chain) = reg.chain(&n.event.campaign) else {
                self.unclaim_event_ids(ids(&new[i..=i]));
                continue;
            };
            // Remembered beside the records it counts in (one node), or
            // claimed already, fleet-wide (a shared store).
            let dedupe = n.id.and_then(|h| self.event_id_write(h, expiry));
            let cost = n.event.cost;
            let ty = type_of(n.event);
            // The other identities' records first, each in its own batch
            // that remembers the event: a retry after a crash between them
            // counts each record once (`count_identity_event`).
            let idents = match self.identities("", &n.event.ids) {
                Ok(ids) => ids,
                Err(e) => {
                    self.unclaim_event_ids(ids(&new[i..]));
                    return Err(e.into());
                }
            };
            for ident in idents {
                let used = chain.iter().any(|e| {
                    e.compiled.items.iter().enumerate().any(|(i, c)| {
                        c.scope == Scope::Id(ident.kind) && counts_event(chain, e, i, ty)
                    })
                });
                if !used {
                    continue;
                }
                match self.count_identity_event(chain, ident, (ty, cost), now, n.id, expiry) {
                    Ok(Some(r)) => receipts.push(r),
                    Ok(None) => {}
                    Err(err) => {
                        self.unclaim_event_ids(ids(&new[i..]));
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
                        if let Some(h) = n.id
                            && !self.remember_event_in(rec, h as u64, now)
                        {
                            return (Receipt::done(0), false);
                        }
                        // With a shared store this may run again (the record
                        // moved under it): campaign records are counted once,
                        // after the user record is written.
                        let r = self.count_event(
                            &reg,
                            chain,
                            Some((k, rec)),
                            (ty, cost),
                            now,
                            dedupe.clone(),
                            sides,
                        );
                        (r, true)
                    })
                    .map(|(r, counted)| {
                        if counted && !foreign {
                            self.travel_counted(n.event);
                        }
                        if sides == Sides::User && counted && !foreign {
                            self.count_event(
                                &reg,
                                chain,
                                None,
                                (ty, cost),
                                now,
                                None,
                                Sides::Campaign,
                            );
                        }
                        if !counted {
                            // Counted by an earlier call whose answer was
                            // lost: a duplicate now.
                            already += 1;
                        }
                        r
                    }),
                None => {
                    Ok(self.count_event(&reg, chain, None, (ty, cost), now, dedupe, Sides::Both))
                }
            };
            match counted {
                Ok(r) => {
                    if let Some(h) = n.id {
                        self.submitted_event_id(h, r.seq);
                    }
                    receipts.push(r);
                }
                Err(err) => {
                    self.unclaim_event_ids(ids(&new[i..]));
                    return Err(err);
                }
            }
        }
        // Leased campaign state (a shared store): report the spend now if
        // more is unreported than may be; should it fail, the next renewal
        // reports it (counters are absolute).
        let chains = new
            .iter()
            .filter(|_| !foreign)
            .filter_map(|n| reg.chain(&n.event.campaign))
            .flat_map(|c| c.iter());
        if let Err(e) = self.report_spend(chains) {
            tracing::debug!("spend report after events failed: {e}");
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
            if let Some(t) = &e.event_type {
                EventType::parse(t).map_err(|m| super::invalid(f("type"), m))?;
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

    /// Debits one event of type `ty` and `cost` on every item of a chain
    /// that counts it, unchecked, and writes the records it changed with
    /// the event's id.
    #[allow(clippy::too_many_arguments)]
    fn count_event(
        &self,
        reg: &Registry,
        chain: &[Arc<CampaignEntry>],
        mut user: Option<(u128, &mut SubjectRecord)>,
        (ty, cost): (EventType, u64),
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
                if !counts_event(chain, e, i, ty) {
                    continue;
                }
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
                self.count_on_line(e, t, units(&cap.item, cost));
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

    /// Debits one event of type `ty` and `cost` on the caps of `chain`
    /// scoped to `ident`'s kind that count it, unchecked, on its record,
    /// and writes it. An event with an id is
    /// remembered there (with a shared store in the record, else beside it
    /// in the dedupe space, in the same batch), so that its retry after a
    /// crash that wrote this record and not the user's counts it once here.
    fn count_identity_event(
        &self,
        chain: &[Arc<CampaignEntry>],
        ident: super::identities::Ident,
        (ty, cost): (EventType, u64),
        now: Nanos,
        id: Option<u128>,
        expiry: Nanos,
    ) -> Result<Option<Receipt>, Halt> {
        let mark = id.map(|h| self.hash_bytes(b'e', 1, &(h ^ ident.key).to_be_bytes()));
        if let Some(m) = mark
            && self.event_id_written(m, now)?
        {
            return Ok(None);
        }
        let reg = self.registry();
        self.with_record(
            RecordKey::PolicyKey(ident.key),
            now,
            Reads::MayWait,
            |rec, now| {
                if let Some(m) = mark
                    && !self.remember_event_in(rec, m as u64, now)
                {
                    return None;
                }
                for e in chain {
                    for (i, cap) in e.compiled.items.iter().enumerate() {
                        if cap.scope != Scope::Id(ident.kind) || !counts_event(chain, e, i, ty) {
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
                if let Some(op) = mark.and_then(|m| self.event_id_write(m, expiry)) {
                    changes.op(op);
                }
                changes.record(RecordKey::PolicyKey(ident.key), rec);
                Some(self.persist(changes, Defs::Registry(&reg), now, Ack::Durable))
            },
        )
    }
}
