//! Owner mode (docs/cluster.md, "Owner mode"): the node that owns a user
//! decides on its copy in memory, as on one node; only a change of what is
//! committed is written, fenced by the owner's epoch.

use super::form::{owned_payload, without_last};
use super::in_record::{SETTLED_GRACE, expire_held};
use super::{EXPIRY_MARGIN, STALE, unavailable};
use crate::clock::{Clock, Nanos};
use crate::cluster::owners::{Owner, Owners};
use crate::engine::Engine;
use crate::engine::hot::{Halt, RecordKey};
use crate::engine::record::SubjectRecord;
use crate::store::codec;
use crate::store::{Cas, Owned, Shared};
use std::sync::atomic::Ordering;

/// How long a claim of a user with no record stands (owner mode), unless
/// the owner writes the record first: it fences a deposed owner's write
/// against "absent", which can only come from a decision that checked its
/// lease before a pause and wrote after it. Each user screened and never
/// shown costs Redis a small hash for this long (~100 bytes), so it is
/// not an hour; a claim that ran out under an owner's copy is made again
/// at its next write.
const OWNED_ABSENT_TTL: Nanos = 600 * 1_000_000_000;

impl<C: Clock> Engine<C> {
    /// Owner mode: this node's copy of user record `key` if it owns the
    /// user now and has it in memory (holds included, which the shared
    /// copy lacks); `None` otherwise.
    pub(crate) fn owned_figures(&self, key: RecordKey) -> Option<SubjectRecord> {
        let (owners, RecordKey::User(h)) = (self.owners()?, key) else {
            return None;
        };
        if !matches!(owners.owner(h, self.now()), Owner::Me { .. }) {
            return None;
        }
        self.drop_unowned(self.now());
        self.hot
            .get(&key.hot_key(), |r| {
                (r.write_seq != STALE).then(|| r.figures_copy())
            })
            .flatten()
    }

    /// [`Engine::with_shared_record`] in owner mode, on a user this node owns
    /// (docs/cluster.md, "Owner mode"): its copy in memory is the record, as
    /// on one node, since no other node decides on it. A user not in memory
    /// is claimed first (`fc_own_v1`: read, and fenced against earlier
    /// owners). Only a change of what is committed is written, by
    /// compare-and-set under this node's epoch; a write refused (a later
    /// owner claimed the record, or it moved) means this node is no longer
    /// the owner: its copy is dropped and the request fails with 503, to be
    /// retried where the user now lives.
    ///
    /// `memory_only` (a screen on the executor, no blocking hop): only on a
    /// copy in memory, with no drop of copies due, and nothing written. A
    /// screen changes nothing committed but the form of its counters (a
    /// window rolled over, a settled id forgotten), which the next commit's
    /// write carries: the stored copy is older, never different in what it
    /// counts.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn with_owned_record<R>(
        &self,
        shared: &dyn Shared,
        owners: &Owners,
        key: RecordKey,
        now: Nanos,
        epoch: u64,
        memory_only: bool,
        mut f: impl FnMut(&mut SubjectRecord, Nanos) -> R,
    ) -> Result<R, Halt> {
        if memory_only {
            if owners.drop_due(now) {
                return Err(Halt::NotInMemory);
            }
        } else {
            self.drop_unowned(now);
        }
        let drops = owners.drops();
        let disk = key.disk_key();
        let hot_key = key.hot_key();
        let reg = self.registry();
        let _turn = if memory_only {
            self.gates.try_enter(hot_key).ok_or(Halt::NotInMemory)?
        } else {
            self.gates.enter(hot_key)
        };
        let cached = self.take_copy(hot_key, now);
        let (mut rec, last) = match cached {
            Some(rec) => (rec, 0),
            // Its placeholder (if any) stays STALE: the blocking path claims.
            None if memory_only => return Err(Halt::NotInMemory),
            None => {
                self.stats.hot_misses.fetch_add(1, Ordering::Relaxed);
                self.stats.owner_claims.fetch_add(1, Ordering::Relaxed);
                match shared.own(&disk, epoch, OWNED_ABSENT_TTL)? {
                    Owned::Claimed {
                        version,
                        value: Some(v),
                    } => self.decoded(&disk, &v, version)?,
                    Owned::Claimed {
                        version,
                        value: None,
                    } => (
                        SubjectRecord {
                            write_seq: version,
                            ..SubjectRecord::default()
                        },
                        0,
                    ),
                    Owned::Fenced(later) => {
                        return Err(self.deposed(owners, later));
                    }
                }
            }
        };
        let now = now.max(self.last_now.load(Ordering::Acquire));
        let at = self.record_time(now, last, rec.write_seq);
        // A memory-only decision writes nothing, so it encodes nothing.
        let before = (!memory_only).then(|| owned_payload(&rec, 0, at, &reg));
        expire_held(&mut rec, at, &reg);
        let r = f(&mut rec, at);
        let Some(before) = before else {
            self.keep_owned(owners, drops, hot_key, now, rec);
            return Ok(r);
        };
        let after = owned_payload(&rec, at, at, &reg);
        if without_last(&after, at) == without_last(&before, 0) {
            self.keep_owned(owners, drops, hot_key, now, rec);
            return Ok(r);
        }
        if let Some(m) = rec.shared_meta() {
            let until = m.remembered.iter().map(|s| s.deadline).max().unwrap_or(0);
            rec.idle_at = rec.idle_at.max(until.saturating_add(SETTLED_GRACE));
        }
        let value = codec::frame_as(3, rec.idle_at, &after);
        let expire = rec.idle_at.saturating_add(EXPIRY_MARGIN);
        self.stats.cas.fetch_add(1, Ordering::Relaxed);
        let mut expected = rec.write_seq;
        for reclaimed in [false, true] {
            match shared.cas_owned(&disk, expected, &value, expire, epoch) {
                Ok(Cas::Written(v)) => {
                    rec.write_seq = v;
                    self.keep_owned(owners, drops, hot_key, now, rec);
                    return Ok(r);
                }
                Ok(Cas::Fenced(later)) => return Err(self.deposed(owners, later)),
                // The claim of a user with no record ran out (it stands
                // [`OWNED_ABSENT_TTL`]) under this node's copy: nothing
                // committed was lost. Claimed again, still with no record,
                // the copy is written.
                Ok(Cas::Conflict {
                    version: 0,
                    value: None,
                }) if !reclaimed => match shared.own(&disk, epoch, OWNED_ABSENT_TTL)? {
                    Owned::Claimed {
                        version,
                        value: None,
                    } => expected = version,
                    Owned::Claimed { .. } => return Err(self.deposed(owners, epoch)),
                    Owned::Fenced(later) => return Err(self.deposed(owners, later)),
                },
                Ok(Cas::Conflict { .. }) => {
                    self.stats.cas_conflicts.fetch_add(1, Ordering::Relaxed);
                    return Err(self.deposed(owners, epoch));
                }
                // Only a policy key's record is frozen as hot, never a
                // user's: answered as a foreign write.
                Ok(Cas::Leased { .. }) => return Err(self.deposed(owners, epoch)),
                // It may have been applied: the copy is not put back (its
                // placeholder is marked STALE), so the next decision claims
                // the record again, reading it.
                Err(e) => return Err(e.into()),
            }
        }
        Err(self.deposed(owners, epoch))
    }

    /// This node's copy of a user it thought it owned was overtaken (a
    /// later owner of epoch `later` claimed or wrote it): the copy is not
    /// put back (its placeholder is STALE), and the request fails with 503
    /// (retried, it goes to the owner).
    pub(super) fn deposed(&self, owners: &Owners, later: u64) -> Halt {
        self.stats.owner_fenced.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            node = owners.node(),
            later,
            "a user's record was claimed by a later owner: this node no longer decides on it"
        );
        unavailable(
            "this node no longer owns this user (another node claimed it): retry, and the request \
             goes to the owner"
                .to_owned(),
        )
    }

    /// Owner mode: drops the copies of users this node may have stopped
    /// owning since it last did ([`Owners::drop_plan`]). Called by the
    /// periodic tick and before each decision.
    pub(crate) fn drop_unowned(&self, now: Nanos) {
        let Some(owners) = self.owners() else {
            return;
        };
        if let Some(plan) = owners.drop_plan(now) {
            let n = self
                .hot
                .retain_keys(|k| plan.keeps(u128::from(k[0]) | (u128::from(k[1]) << 64)));
            owners.dropped(&plan);
            if n > 0 {
                tracing::info!(
                    dropped = n,
                    "owners changed: dropped the copies of users this node no longer owns"
                );
            }
        }
    }

    /// Owner mode: [`Engine::keep_copy`], unless copies were dropped while
    /// the decision ran (its user may have moved away meanwhile, and a copy
    /// put back would be stale should it come back): the placeholder then
    /// stays, and the next decision claims the record again.
    pub(super) fn keep_owned(
        &self,
        owners: &Owners,
        drops: u64,
        hot_key: [u64; 2],
        now: Nanos,
        rec: SubjectRecord,
    ) {
        if owners.drops() == drops {
            self.keep_copy(hot_key, now, rec);
        }
    }
}
