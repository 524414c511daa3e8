//! A request's identities other than the user (docs/semantics.md §6.2,
//! "Identity scopes"): a household's, a device's record, each its own.
//!
//! A screen decides on its user's record (locked, or compare-and-set on a
//! shared store) with copies of the other identities' records, so that
//! every cap of every chain is decided in one pass, in order, as one
//! record would be. The holds on those records are then made under each
//! record's own lock, in kind order ([`Engine::confirm_identity`]): a
//! candidate its caps no longer allow there (another screen of the same
//! household took the room since the copy was read) is dropped, its holds
//! everywhere given back ([`Engine::release_dropped`]), and it is answered
//! denied by that cap. A count never goes past a cap; under concurrency a
//! screen may deny what a serial order would have allowed, never the
//! reverse. Records are never locked two at a time: the hot tier's shard
//! locks and a shared store's one-key writes stay as they are.

use std::sync::Arc;

use smallvec::SmallVec;

use crate::clock::{Clock, Nanos};
use crate::limits::Hold;
use crate::limits::priority::item_for;
use crate::model::identity::{Kind, MAX_IDS};
use crate::model::{EventType, Scope, UnknownUser};
use crate::store::Receipt;

use super::chain::{
    Defs, FRESH, Locking, PendingEnd, Repriced, counts_event, lock_entries, opted_out, probe_units,
    settle_entries, units,
};
use super::holds::{Held, HeldKind};
use super::hot::{Halt, Reads, RecordKey};
use super::persist::{Ack, Changes};
use super::record::{PendingEntry, SubjectRecord};
use super::registry::CampaignEntry;
use super::request::{CandidateResult, DeniedBy, ScreenRequest};
use super::reservations::{HeldCandidate, Settlement};
use super::{Engine, EngineError, invalid};

/// One identity of a request other than the user: its kind and its
/// record's key (a keyed hash of kind and id, [`Engine::identity_key`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ident {
    pub kind: Kind,
    pub key: u128,
}

/// A copy of an identity's record a screen decides with.
pub(crate) struct IdCopy {
    pub kind: Kind,
    pub rec: SubjectRecord,
}

/// The denial of a cap scoped to an identity the request does not name.
pub(crate) fn missing_identity(e: &CampaignEntry, kind: Kind) -> DeniedBy {
    DeniedBy {
        campaign: e.name.clone(),
        cap: format!("unknown_{kind}"),
        retry_after: None,
    }
}

/// Whether a cap scoped to `kind` with rule `missing` lets a request
/// without that identity through (it is then decided without the cap).
pub(crate) fn passes_missing(missing: UnknownUser) -> bool {
    missing == UnknownUser::Allow
}

impl<C: Clock> Engine<C> {
    /// The record key of identity (`kind`, `id`): the user's own key for
    /// `user`, else a keyed hash of both (a household named `u1` is not the
    /// user `u1`).
    pub(crate) fn identity_key(&self, kind: Kind, id: &str) -> u128 {
        if kind.is_user() {
            return self.hash(b'u', 0, id);
        }
        let mut bytes = Vec::with_capacity(kind.as_str().len() + 1 + id.len());
        bytes.extend_from_slice(kind.as_str().as_bytes());
        // A kind has no 0 byte: kind and id cannot run into each other.
        bytes.push(0);
        bytes.extend_from_slice(id.as_bytes());
        self.hash_bytes(b'i', 0, &bytes)
    }

    /// The record of identity (`kind`, `id`): a user's, or another
    /// identity's, kept as a policy key's is (any node writes it by
    /// compare-and-set, owner mode included: an owner owns users only).
    pub(crate) fn identity_record(&self, kind: Kind, id: &str) -> RecordKey {
        match kind.is_user() {
            true => RecordKey::User(self.identity_key(kind, id)),
            false => RecordKey::PolicyKey(self.identity_key(kind, id)),
        }
    }

    /// A request's identities other than the user, checked (an error names
    /// `<at>ids.<kind>`), each with its record key, in kind order: the
    /// order their records are written in.
    pub(crate) fn identities(
        &self,
        at: &str,
        ids: &[(String, String)],
    ) -> Result<Vec<Ident>, EngineError> {
        if ids.len() >= MAX_IDS {
            return Err(invalid(
                format!("{at}ids"),
                format!(
                    "at most {} identities besides the user, got {}",
                    MAX_IDS - 1,
                    ids.len()
                ),
            ));
        }
        let mut out: Vec<Ident> = Vec::with_capacity(ids.len());
        for (kind, id) in ids {
            let field = format!("{at}ids.{kind}");
            let k = Kind::parse(kind).map_err(|e| invalid(&field, e))?;
            if k.is_user() {
                return Err(invalid(
                    field,
                    "the user is given in `user`, not among `ids`",
                ));
            }
            self.check_id(&field, id)?;
            if out.iter().any(|i| i.kind == k) {
                return Err(invalid(field, "given twice"));
            }
            out.push(Ident {
                kind: k,
                key: self.identity_key(k, id),
            });
        }
        out.sort_by_key(|i| i.kind);
        Ok(out)
    }

    /// The identities of `ids` some candidate's chain has a cap for: only
    /// their records are read.
    pub(crate) fn identities_used(
        &self,
        req: &ScreenRequest,
        ids: Vec<Ident>,
    ) -> Result<Vec<Ident>, EngineError> {
        if ids.is_empty() {
            return Ok(ids);
        }
        let reg = self.registry();
        let used = |k: Kind| {
            req.candidates.iter().any(|c| {
                reg.chain(&c.campaign).is_some_and(|chain| {
                    chain
                        .iter()
                        .any(|e| e.compiled.items.iter().any(|i| i.scope == Scope::Id(k)))
                })
            })
        };
        Ok(ids.into_iter().filter(|i| used(i.kind)).collect())
    }

    /// Holds, on identity `ident`'s record, what its caps charge each of
    /// `held` (reservation `seq`), in order, skipping those in `dropped`
    /// and those holding nothing (`idle`: shadow-mode denials). A candidate
    /// the record's caps no longer allow is added to `dropped`, with the
    /// cap that denies it. Returns whether anything was held.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn confirm_identity(
        &self,
        ident: Ident,
        req: &ScreenRequest,
        held: &[HeldCandidate],
        idle: &[u32],
        dropped: &mut Vec<(u32, DeniedBy)>,
        (seq, deadline, body): (u64, Nanos, u64),
        now: Nanos,
        reads: Reads,
    ) -> Result<bool, Halt> {
        let before = dropped.len();
        let out = self.with_record(RecordKey::PolicyKey(ident.key), now, reads, |rec, now| {
            // A shared store may run this again on a fresh copy.
            dropped.truncate(before);
            let mut confirmed: Vec<(u32, u32)> = Vec::new();
            for c in held {
                if idle.contains(&c.index) || dropped.iter().any(|(i, _)| *i == c.index) {
                    continue;
                }
                let cost = req
                    .candidates
                    .get(c.index as usize)
                    .and_then(|x| x.cost)
                    .unwrap_or(1);
                if let Some(d) = probe_kind(rec, &c.chain, ident.kind, cost, req, now) {
                    dropped.push((c.index, d));
                    continue;
                }
                let mut any = false;
                for e in c.chain.iter() {
                    for (i, cap) in e.compiled.items.iter().enumerate() {
                        if cap.scope != Scope::Id(ident.kind)
                            || !counts_event(&c.chain, e, i, EventType::IMPRESSION)
                        {
                            continue;
                        }
                        let t = e.tags[i];
                        let n = units(&cap.item, cost);
                        let p = cap.item.apply(
                            rec.state_mut(e.id, t),
                            now,
                            n,
                            Hold::Reserve { deadline },
                        );
                        rec.add_pending(PendingEntry {
                            res: seq,
                            cand: c.index,
                            def_id: e.id,
                            tag: t,
                            item: p,
                            n,
                        });
                        rec.touch(e.id, t, &cap.item);
                        any = true;
                    }
                }
                if any {
                    confirmed.push((c.index, c.chain[0].id));
                }
            }
            if confirmed.is_empty() {
                return false;
            }
            rec.idle_at = rec.idle_at.max(deadline);
            // Any node expires it at its deadline, as a user record's.
            self.keep_hold(rec, || Held {
                res: seq,
                deadline,
                kind: HeldKind::Screen {
                    candidates: confirmed,
                },
                body,
                inline: None,
                ids: Vec::new(),
                costs: Vec::new(),
                maker: 0,
            });
            true
        });
        if out.is_err() {
            dropped.truncate(before);
        }
        out
    }

    /// A screen's holds on its other identities' records (`idents`, in
    /// kind order), made after its user's (`records`: the record it decided
    /// in, if any): each confirmed in turn; a candidate one no longer allows
    /// is dropped, its holds given back everywhere and its result denied by
    /// that cap. Returns the identity records that hold something. On an
    /// error every hold of the screen is given back.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn hold_identities(
        &self,
        req: &ScreenRequest,
        idents: &[Ident],
        results: &mut [CandidateResult],
        candidates: &mut Vec<HeldCandidate>,
        records: &[RecordKey],
        (seq, deadline, body): (u64, Nanos, u64),
        now: Nanos,
        reads: Reads,
    ) -> Result<Vec<u128>, Halt> {
        // Shadow-mode denials are held, holding nothing.
        let idle: Vec<u32> = candidates
            .iter()
            .filter(|c| {
                results
                    .get(c.index as usize)
                    .is_some_and(|r| r.would_deny.is_some())
            })
            .map(|c| c.index)
            .collect();
        let mut dropped: Vec<(u32, DeniedBy)> = Vec::new();
        let mut held: Vec<u128> = Vec::new();
        for ident in idents {
            let at = (seq, deadline, body);
            match self.confirm_identity(
                *ident,
                req,
                candidates,
                &idle,
                &mut dropped,
                at,
                now,
                reads,
            ) {
                Ok(true) => held.push(ident.key),
                Ok(false) => {}
                Err(e) => {
                    let all: Vec<&HeldCandidate> = candidates.iter().collect();
                    let mut keys = records.to_vec();
                    keys.extend(held.iter().map(|k| RecordKey::PolicyKey(*k)));
                    self.release_dropped(&keys, &all, seq, now, reads);
                    return Err(e);
                }
            }
        }
        if dropped.is_empty() {
            return Ok(held);
        }
        self.stats
            .identity_rechecks
            .fetch_add(dropped.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let gone: Vec<&HeldCandidate> = candidates
            .iter()
            .filter(|c| dropped.iter().any(|(i, _)| *i == c.index))
            .collect();
        let mut keys = records.to_vec();
        keys.extend(held.iter().map(|k| RecordKey::PolicyKey(*k)));
        self.release_dropped(&keys, &gone, seq, now, reads);
        for (i, d) in dropped.iter() {
            if let Some(r) = results.get_mut(*i as usize) {
                r.eligible = false;
                r.denied_by = Some(d.clone());
                r.would_deny = None;
                r.pacing = None;
            }
        }
        candidates.retain(|c| !dropped.iter().any(|(i, _)| *i == c.index));
        Ok(held)
    }

    /// Gives back what reservation `seq` holds for `dropped` candidates: in
    /// the records `records` (the user's, the identities' confirmed) and in
    /// their chains' campaign records. A record that cannot be reached
    /// keeps its holds until the reservation's deadline, as any.
    pub(crate) fn release_dropped(
        &self,
        records: &[RecordKey],
        dropped: &[&HeldCandidate],
        seq: u64,
        now: Nanos,
        reads: Reads,
    ) {
        for key in records {
            let r = self.with_record(*key, now, reads, |rec, now| {
                for c in dropped {
                    let entries = rec.take_pending(seq, Some(c.index));
                    settle_entries(
                        rec,
                        entries,
                        Defs::Chain(&c.chain),
                        PendingEnd::Release,
                        now,
                        None,
                    );
                }
                self.forget_candidates(rec, seq, dropped);
            });
            if let Err(e) = r {
                tracing::debug!("a dropped candidate's holds wait for their deadline: {e:?}");
            }
        }
        let chains = dropped.iter().flat_map(|c| c.chain.iter());
        let mut guards = lock_entries(chains, Locking::Settling);
        for c in dropped {
            for e in c.chain.iter() {
                if let Some(g) = super::chain::guard_of(&mut guards, e.id) {
                    let entries = g.take_pending(seq, Some(c.index));
                    settle_entries(
                        g,
                        entries,
                        Defs::Chain(&c.chain),
                        PendingEnd::Release,
                        now,
                        None,
                    );
                }
            }
        }
    }

    /// Settles reservation `seq`'s holds on identity record `key`: the
    /// winners' committed, the rest released, the record written (for a
    /// commit) in its own batch, before the user's: the user's receipt, later
    /// in the write order, is durable only once this one is.
    pub(crate) fn settle_identity(
        &self,
        key: u128,
        candidates: &[HeldCandidate],
        seq: u64,
        how: Settlement<'_, [u32]>,
        at: Nanos,
        reads: Reads,
    ) -> Result<Option<Receipt>, Halt> {
        let (winners, final_cost) = match how {
            Settlement::Commit { chosen, final_cost } => (chosen, final_cost),
            Settlement::Release => (&[][..], None),
        };
        let now = self.now();
        let record = RecordKey::PolicyKey(key);
        let r = self.with_record(record, now, reads, |rec, now| {
            let mine = rec.take_pending(seq, None);
            self.forget_hold(rec, seq);
            if mine.is_empty() {
                return None;
            }
            let mut won = false;
            for c in candidates {
                let win = winners.contains(&c.index);
                let how = match win {
                    true => PendingEnd::Commit {
                        final_cost,
                        repriced: Repriced::Budgets,
                    },
                    false => PendingEnd::Release,
                };
                let entries: SmallVec<[PendingEntry; 4]> =
                    mine.iter().filter(|p| p.cand == c.index).cloned().collect();
                won |= win && !entries.is_empty();
                settle_entries(rec, entries, Defs::Chain(&c.chain), how, at, None);
            }
            if !won {
                return None;
            }
            let reg = self.registry();
            let mut changes = Changes::new();
            changes.record(record, rec);
            Some(self.persist(changes, Defs::Registry(&reg), now, Ack::Durable))
        });
        match r {
            // Not in memory in a memory-only call: it holds nothing of this
            // reservation (pending debits pin a record).
            Err(Halt::NotInMemory) => Ok(None),
            r => r,
        }
    }
}

/// The first cap scoped to `kind` in `chain` that denies one more of
/// `cost` on `rec` as of `now`, as the request's class sees it; caps of
/// campaigns in shadow mode are not asked (they hold nothing on denial
/// either way).
fn probe_kind(
    rec: &SubjectRecord,
    chain: &[Arc<CampaignEntry>],
    kind: Kind,
    cost: u64,
    req: &ScreenRequest,
    now: Nanos,
) -> Option<DeniedBy> {
    for e in chain {
        if e.def.mode == Some(crate::model::Mode::Shadow) {
            continue;
        }
        for (i, cap) in e.compiled.items.iter().enumerate() {
            if cap.scope != Scope::Id(kind) || opted_out(chain, e, i) {
                continue;
            }
            let st = rec.state(e.id, e.tags[i]).unwrap_or(&FRESH);
            let n = probe_units(cap, cost);
            let seen = item_for(&cap.item, cap.classes.as_ref(), req.priority);
            let p = seen.probe(st, now, n);
            if !p.allowed {
                return Some(DeniedBy {
                    campaign: e.name.clone(),
                    cap: cap.name.clone(),
                    retry_after: seen.retry(st, &p, now, n),
                });
            }
        }
    }
    None
}
