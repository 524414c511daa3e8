//! Reservations kept in a record (docs/cluster.md): the holds and settled
//! ids a shared record carries, so that any node commits, releases or
//! expires a reservation; who wins a commit; a commit made on another node
//! than the reservation's, and the notice its maker gets.

use crate::clock::{Clock, Nanos};
use crate::engine::chain::{Defs, PendingEnd, Repriced, settle_entries};
use crate::engine::holds::{Held, HeldKind, RememberedId};
use crate::engine::hot::RecordKey;
use crate::engine::record::SubjectRecord;
use crate::engine::registry::Registry;
use crate::engine::request::Outcome;
use crate::engine::request::compile_inline;
use crate::engine::request::{CheckTarget, CompiledInline};
use crate::engine::reservations::{HeldCandidate, Reserved, Settlement, commit_winners};
use crate::engine::{Conflict, Engine, EngineError};
use crate::limits::adaptive::Sample;
use crate::model::LimitDef;
use crate::store::codec;
use crate::store::{Shared, StoreError};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// How a reservation was settled, as its record says.
#[derive(Debug, Clone)]
pub(crate) struct RecordedEnd {
    pub outcome: Outcome,
    /// The committed campaigns (ids); a release lists its candidates.
    pub campaigns: Vec<u32>,
    pub final_cost: Option<u64>,
    /// Committed on another node than the reservation's, which charged the
    /// winners' campaign-side spend ([`RememberedId::charged`]).
    pub charged: bool,
}

/// What a node that committed another node's reservation (and charged its
/// campaign side) tells that node ([`Engine::read_notices`]).
#[derive(Serialize, Deserialize)]
pub(super) struct Notice {
    id: String,
    campaigns: Vec<u32>,
    final_cost: Option<u64>,
}

/// How long past its deadline a settled id stays in its record: the node
/// that made the reservation learns there, at the deadline, how another node
/// settled it (its campaign-side holds follow), and its sweeper may come a
/// little late.
pub(crate) const SETTLED_GRACE: Nanos = 60 * 1_000_000_000;

impl Held {
    /// The definitions this reservation's debits were made under: `reg`'s,
    /// or the inline limits kept with it (compiled again: settling is rare
    /// next to deciding).
    pub(super) fn defs<'a>(
        &self,
        reg: &'a Registry,
        compiled: &'a Option<Arc<CompiledInline>>,
    ) -> Defs<'a> {
        match compiled {
            Some(c) => Defs::Stack {
                def_id: 0,
                stack: &c.stack,
                tags: &c.tags,
            },
            None => Defs::Registry(reg),
        }
    }

    /// The inline limits kept with this reservation, compiled.
    pub(super) fn compiled(&self) -> Option<Arc<CompiledInline>> {
        let spec = self.inline.as_ref()?;
        let limits: Vec<LimitDef> = serde_json::from_slice(spec).ok()?;
        compile_inline(&limits).ok()
    }
}

/// What a record says of reservation `res` asked again under the same id.
#[derive(Debug, Clone)]
pub(crate) enum SeenHere {
    /// Held, by a request with this body: (index, campaign id) held.
    Held { body: u64, kind: HeldKind },
    /// Settled (committed or released).
    Settled,
}

/// Whether `rec` holds or has settled reservation `res`: a reserve under a
/// caller's id that another node (or this one, in a write whose answer was
/// lost) already made must not hold a second time (docs/cluster.md).
pub(crate) fn seen_in_record(rec: &SubjectRecord, res: u64) -> Option<SeenHere> {
    let meta = rec.shared_meta()?;
    if let Some(h) = meta.held.iter().find(|h| h.res == res) {
        return Some(SeenHere::Held {
            body: h.body,
            kind: h.kind.clone(),
        });
    }
    meta.remembered
        .iter()
        .any(|s| s.res == res)
        .then_some(SeenHere::Settled)
}

/// Releases, as of their deadline, the reservations of `rec` whose deadline
/// is past `at`, and forgets settled ids past theirs: whichever node touches
/// a record first ends a dead node's holds.
pub(super) fn expire_held(rec: &mut SubjectRecord, at: Nanos, reg: &Registry) {
    let Some(meta) = rec.shared_meta() else {
        return;
    };
    if !meta.held.iter().any(|h| h.deadline <= at)
        && !meta
            .remembered
            .iter()
            .any(|s| s.deadline + SETTLED_GRACE <= at)
    {
        return;
    }
    let meta = rec.shared_meta_mut();
    meta.remembered.retain(|s| s.deadline + SETTLED_GRACE > at);
    let (due, kept): (Vec<Held>, Vec<Held>) = std::mem::take(&mut meta.held)
        .into_iter()
        .partition(|h| h.deadline <= at);
    meta.held = kept;
    for h in due {
        let entries = rec.take_pending(h.res, None);
        let compiled = h.compiled();
        settle_entries(
            rec,
            entries,
            h.defs(reg, &compiled),
            PendingEnd::Release,
            h.deadline,
            None,
        );
    }
    rec.drop_empty_shared_meta();
}

/// What settling a reservation in its record found.
#[derive(Debug)]
pub(crate) enum InRecord {
    /// Settled now: the outcome and its campaigns.
    Done(RecordedEnd, Vec<Arc<str>>),
    /// Settled before, the same way: the same answer.
    Repeat(RecordedEnd, Vec<Arc<str>>),
    /// The record holds nothing of it (unknown, or expired and forgotten).
    Unknown,
}

pub(super) fn names(reg: &Registry, ids: &[u32]) -> Vec<Arc<str>> {
    ids.iter()
        .filter_map(|id| reg.campaign_by_id(*id).map(|e| e.name.clone()))
        .collect()
}

/// Settles reservation `res` (id `id`) in `rec`, as of `at`. An error
/// leaves the record unchanged. `charged`: the candidates (indexes) whose
/// campaign-side spend this node reported as committed of another node's
/// holds ([`ForeignWinner`]); if they are exactly the winners, the record
/// says so ([`RememberedId::charged`]).
#[allow(clippy::too_many_arguments)]
pub(super) fn settle_in_record(
    rec: &mut SubjectRecord,
    res: u64,
    id: &str,
    how: Settlement<'_, [String]>,
    sample: Option<Sample>,
    at: Nanos,
    reg: &Registry,
    charged: Option<&[u32]>,
) -> Result<InRecord, EngineError> {
    let meta = rec.shared_meta();
    if let Some(s) = meta.and_then(|m| m.remembered.iter().find(|s| s.res == res)) {
        let outcome = if s.committed {
            Outcome::Committed
        } else {
            Outcome::Released
        };
        return match (how, s.committed) {
            (Settlement::Commit { .. }, true) | (Settlement::Release, false) => {
                let names = names(reg, &s.campaigns);
                let how = RecordedEnd {
                    outcome,
                    campaigns: s.campaigns.clone(),
                    final_cost: s.final_cost,
                    charged: s.charged,
                };
                Ok(InRecord::Repeat(how, names))
            }
            _ => Err(EngineError::Conflict(Conflict::SettledOtherwise {
                id: id.to_owned(),
                outcome,
            })),
        };
    }
    let Some(held) = meta
        .and_then(|m| m.held.iter().find(|h| h.res == res))
        .cloned()
    else {
        return Ok(InRecord::Unknown);
    };
    let (committed, final_cost) = match how {
        Settlement::Commit { final_cost, .. } => (true, final_cost),
        Settlement::Release => (false, None),
    };
    let (chosen, repriced) = match (&held.kind, how) {
        (
            HeldKind::Screen { candidates },
            Settlement::Commit {
                chosen: campaigns, ..
            },
        ) => (winners(candidates, campaigns, reg, id)?, Repriced::Budgets),
        (HeldKind::Screen { candidates }, Settlement::Release) => (
            candidates.iter().map(|&(i, c)| (i, c, false)).collect(),
            Repriced::Budgets,
        ),
        (HeldKind::Check { .. }, _) => (Vec::new(), Repriced::EveryItem),
    };
    let entries = rec.take_pending(res, None);
    let compiled = held.compiled();
    for e in entries {
        let win = match held.kind {
            HeldKind::Check { .. } => committed,
            HeldKind::Screen { .. } => chosen.iter().any(|&(i, _, w)| w && i == e.cand),
        };
        let settling = if win {
            PendingEnd::Commit {
                final_cost,
                repriced,
            }
        } else {
            PendingEnd::Release
        };
        settle_entries(rec, [e], held.defs(reg, &compiled), settling, at, sample);
    }
    // A commit answers with its winners, a release with every candidate
    // (as on one node).
    let shown: Vec<u32> = match (&held.kind, committed) {
        (HeldKind::Screen { candidates }, false) => candidates.iter().map(|&(_, c)| c).collect(),
        _ => chosen
            .iter()
            .filter(|&&(_, _, w)| w)
            .map(|&(_, c, _)| c)
            .collect(),
    };
    let charged = committed
        && charged.is_some_and(|c| {
            let mut won: Vec<u32> = chosen.iter().filter(|w| w.2).map(|w| w.0).collect();
            let mut reported = c.to_vec();
            won.sort_unstable();
            reported.sort_unstable();
            won == reported
        });
    let meta = rec.shared_meta_mut();
    meta.held.retain(|h| h.res != res);
    meta.remembered.push(RememberedId {
        res,
        deadline: held.deadline,
        committed,
        campaigns: shown.clone(),
        final_cost,
        charged,
    });
    rec.idle_at = rec.idle_at.max(held.deadline + SETTLED_GRACE);
    let outcome = if committed {
        Outcome::Committed
    } else {
        Outcome::Released
    };
    let names = names(reg, &shown);
    let how = RecordedEnd {
        outcome,
        campaigns: shown,
        final_cost,
        charged,
    };
    Ok(InRecord::Done(how, names))
}

/// The other identities' records reservation `res` (id `id`) may hold on,
/// as its holder's record `rec` lists them, and how `how` ends it there:
/// `None` when it lists none or is settled already; an error (a commit
/// naming a campaign it does not hold) before anything is settled.
pub(super) fn identities_ahead(
    rec: &SubjectRecord,
    res: u64,
    id: &str,
    how: Settlement<'_, [String]>,
    reg: &Registry,
) -> Result<Option<(Vec<u128>, RecordedEnd)>, EngineError> {
    let Some(held) = rec
        .shared_meta()
        .and_then(|m| m.held.iter().find(|h| h.res == res))
        .filter(|h| !h.ids.is_empty())
    else {
        return Ok(None);
    };
    let HeldKind::Screen { candidates } = &held.kind else {
        return Ok(None);
    };
    let end = match how {
        Settlement::Commit {
            chosen: campaigns,
            final_cost,
        } => RecordedEnd {
            outcome: Outcome::Committed,
            campaigns: winners(candidates, campaigns, reg, id)?
                .into_iter()
                .filter(|&(_, _, won)| won)
                .map(|(_, c, _)| c)
                .collect(),
            final_cost,
            charged: false,
        },
        Settlement::Release => RecordedEnd {
            outcome: Outcome::Released,
            campaigns: Vec::new(),
            final_cost: None,
            charged: false,
        },
    };
    Ok(Some((held.ids.clone(), end)))
}

/// A winner of a commit made on another node than the reservation's: its
/// candidate index, campaign id and reserved cost. The committing node
/// charges its campaign-side spend ([`Engine::charge_foreign`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ForeignWinner {
    pub cand: u32,
    pub campaign: u32,
    pub cost: u64,
}

/// The winners a commit `how` of reservation `res` would have as `rec`
/// holds it now (empty: not held there, or a release), and the process
/// nonce of the node that made it if the record knows it ([`Held::maker`]).
pub(super) fn foreign_winners(
    rec: &SubjectRecord,
    res: u64,
    id: &str,
    how: Settlement<'_, [String]>,
    reg: &Registry,
) -> Result<(Vec<ForeignWinner>, u32), EngineError> {
    let (Some(held), Settlement::Commit { chosen, .. }) = (
        rec.shared_meta()
            .and_then(|m| m.held.iter().find(|h| h.res == res)),
        how,
    ) else {
        return Ok((Vec::new(), 0));
    };
    let HeldKind::Screen { candidates } = &held.kind else {
        return Ok((Vec::new(), 0));
    };
    let won = winners(candidates, chosen, reg, id)?
        .into_iter()
        .filter(|w| w.2)
        .map(|(cand, campaign, _)| ForeignWinner {
            cand,
            campaign,
            cost: held.costs.iter().find(|c| c.0 == cand).map_or(1, |c| c.1),
        })
        .collect();
    Ok((won, held.maker))
}

/// Settles reservation `res` in another identity's record (`crate::engine::identities`)
/// as its user's record says it ended (`end`): for each campaign committed,
/// its first candidate held here not already chosen wins; the rest are
/// released. Nothing held here: a no-op.
pub(super) fn settle_identity_in_record(
    rec: &mut SubjectRecord,
    res: u64,
    end: &RecordedEnd,
    at: Nanos,
    reg: &Registry,
) {
    let Some(held) = rec
        .shared_meta()
        .and_then(|m| m.held.iter().find(|h| h.res == res))
        .cloned()
    else {
        return;
    };
    let chosen: Vec<u32> = match (&held.kind, end.outcome) {
        (HeldKind::Screen { candidates }, Outcome::Committed) => {
            crate::engine::reservations::winners(candidates, end.campaigns.iter().copied())
                .into_iter()
                .flatten()
                .collect()
        }
        _ => Vec::new(),
    };
    let compiled = held.compiled();
    for e in rec.take_pending(res, None) {
        let settling = match chosen.contains(&e.cand) {
            true => PendingEnd::Commit {
                final_cost: end.final_cost,
                repriced: Repriced::Budgets,
            },
            false => PendingEnd::Release,
        };
        settle_entries(rec, [e], held.defs(reg, &compiled), settling, at, None);
    }
    rec.shared_meta_mut().held.retain(|h| h.res != res);
    rec.drop_empty_shared_meta();
}

/// The candidates a commit naming `campaigns` wins, as (index, campaign id,
/// won): as on one node, for each name the first eligible candidate of that
/// campaign not already chosen; every eligible one when none is named.
pub(super) fn winners(
    candidates: &[(u32, u32)],
    campaigns: &[String],
    reg: &Registry,
    id: &str,
) -> Result<Vec<(u32, u32, bool)>, EngineError> {
    // By id; a name no campaign has fits no candidate.
    let by_id: Vec<(u32, Option<u32>)> = candidates.iter().map(|&(i, c)| (i, Some(c))).collect();
    let won = commit_winners(
        &by_id,
        campaigns,
        |n| reg.campaigns.get(n).map(|e| e.id),
        id,
    )?;
    Ok(candidates
        .iter()
        .map(|&(i, c)| (i, c, won.contains(&i)))
        .collect())
}

impl<C: Clock> Engine<C> {
    /// With a shared store, the record holding reservation `id`: named in a
    /// node-made id, else known to this node's table, else the user a
    /// commit names (a client-chosen id reserved on another node), else a
    /// user-less screen's own record ([`Engine::userless_record`]). `None`
    /// on one node.
    pub(crate) fn shared_record_of(
        &self,
        id: &str,
        user: Option<&str>,
    ) -> Option<(&dyn Shared, RecordKey)> {
        let shared = self.shared()?;
        let key = match Self::record_in_id(id) {
            Some(k) => k,
            None => match self.reservations.reserved(id) {
                Some(r) => match &*r {
                    Reserved::Check { key, .. } => RecordKey::PolicyKey(*key),
                    Reserved::Screen { user: Some(u), .. } => RecordKey::User(*u),
                    Reserved::Screen { user: None, .. } => self.userless_record(self.res_of(id)),
                },
                // Not this node's: the user's record the caller names, or
                // a user-less screen's own record.
                None => match user {
                    Some(u) => RecordKey::User(self.hash(b'u', 0, u)),
                    None => self.userless_record(self.res_of(id)),
                },
            },
        };
        Some((shared, key))
    }

    /// Where records keep reservations, forgets the hold of reservation
    /// `res` in `rec` (settled there); nothing on one node.
    pub(crate) fn forget_hold(&self, rec: &mut SubjectRecord, res: u64) {
        if self.placement.is_local() {
            return;
        }
        rec.shared_meta_mut().held.retain(|h| h.res != res);
        rec.drop_empty_shared_meta();
    }

    /// Removes `dropped` from what a shared record says reservation `seq`
    /// holds: a commit on another node must not find them.
    pub(crate) fn forget_candidates(
        &self,
        rec: &mut SubjectRecord,
        seq: u64,
        dropped: &[&HeldCandidate],
    ) {
        if self.placement.is_local() {
            return;
        }
        let meta = rec.shared_meta_mut();
        for h in meta.held.iter_mut().filter(|h| h.res == seq) {
            if let HeldKind::Screen { candidates } = &mut h.kind {
                candidates.retain(|(i, _)| !dropped.iter().any(|c| c.index == *i));
            }
        }
        meta.held.retain(
            |h| !matches!(&h.kind, HeldKind::Screen { candidates } if candidates.is_empty()),
        );
        rec.drop_empty_shared_meta();
    }

    /// Where records keep reservations (a shared store), has `rec` keep the
    /// hold `held` makes, so that any node settles or expires its debits
    /// (in owner mode the owner's copy keeps it, and the stored form leaves
    /// it out: [`super::form`]); `true` if kept. One node keeps it in its
    /// reservation table alone: nothing here.
    pub(crate) fn keep_hold(&self, rec: &mut SubjectRecord, held: impl FnOnce() -> Held) -> bool {
        if self.placement.is_local() {
            return false;
        }
        rec.shared_meta_mut().held.push(held());
        true
    }

    /// The record a user-less screen's reservation `seq` is kept in where
    /// records keep reservations (a shared store: its own, so that any node
    /// settles it); `None` on one node.
    pub(crate) fn userless_record_of(&self, seq: u64) -> Option<RecordKey> {
        (!self.placement.is_local()).then(|| self.userless_record(seq))
    }

    /// The limits an inline check's hold keeps where records keep
    /// reservations (`reserve`: any node settles it, and only the record
    /// knows its items): their JSON, made once per reserving check. Refuses
    /// a check a shared store cannot hold (`reserving`: it would hold
    /// something; [`Engine::check_shareable`]). `None` on one node.
    pub(crate) fn inline_kept(
        &self,
        target: &CheckTarget,
        def_id: u32,
        reserve: bool,
        reserving: bool,
    ) -> Result<Option<Arc<[u8]>>, EngineError> {
        if self.placement.is_local() {
            return Ok(None);
        }
        let inline = match target {
            CheckTarget::Inline(limits) if reserve && def_id == 0 => {
                serde_json::to_vec(limits).ok().map(Arc::<[u8]>::from)
            }
            _ => None,
        };
        self.check_shareable(def_id, reserving, inline.is_some())?;
        Ok(inline)
    }

    /// Takes the notices other nodes left this one ([`Notice`]) and gives
    /// up the holds of the reservations they committed, at once rather than
    /// at their deadline. A few hundred a sweep at most (the rest wait for
    /// the next).
    pub(crate) fn read_notices(&self) {
        let Some(shared) = self.shared() else {
            return;
        };
        const MOST: usize = 256;
        let notices = match shared.take_notices(self.id_nonce, MOST) {
            Ok(n) => n,
            Err(e) => {
                tracing::debug!("cannot read this node's notices: {e}");
                return;
            }
        };
        for raw in notices {
            let Ok(n) = codec::decode::<Notice>(&raw) else {
                continue;
            };
            let how = RecordedEnd {
                outcome: Outcome::Committed,
                campaigns: n.campaigns,
                final_cost: n.final_cost,
                charged: true,
            };
            if let Err(e) = self.settle_campaign_side(&n.id, &how) {
                tracing::debug!("a notice of {}: {e}", n.id);
            }
        }
    }

    /// Settles reservation `id` in record `key`: the shared store's answer
    /// is the cluster's.
    pub(crate) fn settle_shared(
        &self,
        shared: &dyn Shared,
        key: RecordKey,
        id: &str,
        how: Settlement<'_, [String]>,
        sample: Option<Sample>,
    ) -> Result<InRecord, EngineError> {
        let res = self.res_of(id);
        let reg = self.registry();
        let now = self.now();
        // A commit of a reservation another node made: this node charges
        // the winners' campaign-side spend, reported before the record says
        // so (and before the commit is acknowledged), so the spend counts
        // even if that node dies before the deadline at which it would have
        // charged it (issue 47: 1 259 of a budget of 1 200 before).
        let charge =
            matches!(how, Settlement::Commit { .. }) && self.reservations.reserved(id).is_none();
        let mut foreign: Result<(Vec<ForeignWinner>, u32), EngineError> = Ok((Vec::new(), 0));
        // The other identities' records the screen held on are settled
        // first, as the holder's record says the reservation ends: then a
        // failure (a conflict, Redis away) leaves the holder's record
        // unsettled and the commit unacknowledged, and its retry settles
        // the rest (an identity record already settled holds nothing of
        // it). Reading the holder's copy writes nothing; a node that holds
        // the user in memory reads nothing either.
        let mut ahead: Result<Option<(Vec<u128>, RecordedEnd)>, EngineError> = Ok(None);
        let read = self.with_shared_record(shared, key, now, false, |rec, _| {
            ahead = identities_ahead(rec, res, id, how, &reg);
            if charge {
                foreign = foreign_winners(rec, res, id, how, &reg);
            }
        });
        crate::engine::hot::waited(read)?;
        let settle_ids = |ids: &[u128], end: &RecordedEnd| -> Result<(), EngineError> {
            for k in ids {
                let r = self.with_shared_record(
                    shared,
                    RecordKey::PolicyKey(*k),
                    now,
                    false,
                    |rec, at| settle_identity_in_record(rec, res, end, at, &reg),
                );
                crate::engine::hot::waited(r)?;
            }
            Ok(())
        };
        let ahead = ahead?;
        let (foreign, maker) = foreign?;
        let final_cost = match how {
            Settlement::Commit { final_cost, .. } => final_cost,
            Settlement::Release => None,
        };
        let reported: Option<Vec<u32>> = match foreign.is_empty() {
            true => None,
            false => {
                self.charge_foreign(&foreign, final_cost)?;
                Some(foreign.iter().map(|w| w.cand).collect())
            }
        };
        if let Some((ids, end)) = &ahead {
            settle_ids(ids, end)?;
        }
        // The copy read above may have been stale (another node made the
        // reservation since): the identities the settled copy lists, if
        // not settled ahead, are settled after it.
        let mut listed: Vec<u128> = Vec::new();
        let settled = self.with_shared_record(shared, key, now, false, |rec, at| {
            listed = rec
                .shared_meta()
                .and_then(|m| m.held.iter().find(|h| h.res == res))
                .map(|h| h.ids.clone())
                .unwrap_or_default();
            settle_in_record(rec, res, id, how, sample, at, &reg, reported.as_deref())
        });
        let settled = crate::engine::hot::waited(settled)??;
        if let InRecord::Done(end, _) = &settled
            && end.charged
        {
            self.count_foreign(&foreign, final_cost, now);
            // The node that made it gives its holds up at once, not at
            // the deadline: until it does, the store counts them twice
            // (fewer units granted). Best effort: failing, it learns at
            // the deadline.
            let maker = Self::maker_in_id(id).unwrap_or(maker);
            if maker != 0 {
                let notice = Notice {
                    id: id.to_owned(),
                    campaigns: end.campaigns.clone(),
                    final_cost: end.final_cost,
                };
                if let Err(e) = shared.notify(maker, &codec::encode(&notice)) {
                    tracing::debug!("cannot tell node {maker:08x} of a commit: {e}");
                }
            }
        }
        if ahead.is_none()
            && !listed.is_empty()
            && let InRecord::Done(end, _) = &settled
        {
            settle_ids(&listed, end)?;
        }
        Ok(settled)
    }

    /// How reservation `res` was settled, as record `key` says (`None`:
    /// not settled there, or forgotten): what the node that made it learns
    /// at its deadline.
    pub(crate) fn settled_as(
        &self,
        shared: &dyn Shared,
        key: RecordKey,
        res: u64,
    ) -> Result<Option<RecordedEnd>, StoreError> {
        let (rec, _) = self.read_shared(shared, &key.disk_key())?;
        Ok(rec
            .shared_meta()
            .and_then(|m| m.remembered.iter().find(|s| s.res == res))
            .map(|s| RecordedEnd {
                charged: s.charged,
                outcome: if s.committed {
                    Outcome::Committed
                } else {
                    Outcome::Released
                },
                campaigns: s.campaigns.clone(),
                final_cost: s.final_cost,
            }))
    }
}
