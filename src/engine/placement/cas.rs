//! Shared mode (docs/cluster.md): a decision runs on this node's cached
//! copy of a record; its change is written by compare-and-set on the
//! version, and on a conflict the decision runs again on the current copy.

use super::form::{decode, payload, without_last};
use super::in_record::{SETTLED_GRACE, expire_held};
use super::{EXPIRY_MARGIN, MAX_RECORD_AHEAD, MAX_TRIES, STALE, unavailable};
use crate::clock::{Clock, Nanos};
use crate::cluster::owners::Owner;
use crate::engine::hot::{Halt, RecordKey};
use crate::engine::record::SubjectRecord;
use crate::engine::{Engine, EngineError, corrupt};
use crate::store::codec;
use crate::store::{Cas, Shared, StoreError};
use std::sync::atomic::Ordering;

impl<C: Clock> Engine<C> {
    /// Reads record `key` from the shared store (a fresh one if absent),
    /// and its last decision time.
    pub(super) fn read_shared(
        &self,
        shared: &dyn Shared,
        disk: &[u8],
    ) -> Result<(SubjectRecord, Nanos), StoreError> {
        self.stats.hot_misses.fetch_add(1, Ordering::Relaxed);
        match shared.read(disk)? {
            Some((version, value)) => self.decoded(disk, &value, version),
            None => Ok((SubjectRecord::default(), 0)),
        }
    }

    /// Decodes a shared copy, and its last decision time. The engine's time
    /// stays where it is: a record's time holds up decisions on that record
    /// only ([`Engine::record_time`]), so a node whose clock ran ahead moves
    /// no other record (issue 25: one node 600 s ahead let every reader's
    /// "1 per 5 minutes" caps allow a second impression 1 s later).
    pub(super) fn decoded(
        &self,
        disk: &[u8],
        value: &[u8],
        version: u64,
    ) -> Result<(SubjectRecord, Nanos), StoreError> {
        let (mut rec, t) = decode(value, version).map_err(|m| corrupt(disk, m))?;
        // Written by an older build, its counters may carry their former
        // tags (docs/cluster.md, "Record layout").
        self.registry().retag_legacy(&mut rec);
        Ok((rec, t))
    }

    /// The time to decide on a record at: `now`, or the record's own later
    /// time (`last`, its last decision as read, or its version: Redis's time
    /// in µs when it was written, which is all a cached copy keeps), capped
    /// at `now` + [`MAX_RECORD_AHEAD`] (counted).
    pub(super) fn record_time(&self, now: Nanos, last: Nanos, version: u64) -> Nanos {
        let written = match version {
            STALE => 0,
            v => v.saturating_mul(1_000),
        };
        let own = last.max(written);
        if own <= now {
            return now;
        }
        let cap = now.saturating_add(MAX_RECORD_AHEAD);
        if own > cap {
            self.stats
                .record_time_capped
                .fetch_add(1, Ordering::Relaxed);
            return cap;
        }
        own
    }

    /// [`Engine::with_record`] on a shared store: `f` decides on a copy of
    /// the cached record at the time it is given (never before the record's
    /// last decision); if it changed the record, the change is written by
    /// compare-and-set, and on a conflict `f` runs again on the current copy.
    ///
    /// No lock is held across a Redis call: the hot tier's shard lock only
    /// while the copy is taken and put back, and the record's own gate
    /// ([`crate::engine::gate`]) keeps this node's decisions on the record one at a
    /// time.
    pub(crate) fn with_shared_record<R>(
        &self,
        shared: &dyn Shared,
        key: RecordKey,
        now: Nanos,
        memory_only: bool,
        mut f: impl FnMut(&mut SubjectRecord, Nanos) -> R,
    ) -> Result<R, Halt> {
        if let (Some(owners), RecordKey::User(h)) = (self.owners(), key) {
            return match owners.owner(h, now) {
                Owner::Me { epoch } => {
                    self.with_owned_record(shared, owners, key, now, epoch, memory_only, f)
                }
                _ if memory_only => Err(Halt::NotInMemory),
                Owner::Other { node, addr } => Err(unavailable(format!(
                    "this user is owned by node {node} ({addr}) in owner mode: send the request there \
                     (the HTTP API forwards it)"
                ))),
                Owner::Unsettled(why) => Err(unavailable(why.to_owned())),
            };
        }
        // A hot key is decided on this node's own record, within its
        // leases (`leased.rs`), unless its freeze ended.
        if let RecordKey::PolicyKey(h) = key
            && let Some(hk) = self.hot_keys.get(h)
        {
            if memory_only {
                return Err(Halt::NotInMemory);
            }
            if let Some(r) = self.with_leased_record(shared, &hk, now, |rec, at| f(rec, at))? {
                return Ok(r);
            }
        }
        let disk = key.disk_key();
        let hot_key = key.hot_key();
        let reg = self.registry();
        let _turn = self.gates.enter(hot_key);
        // The last decision time of the copy read from the store in this
        // call (0: none was).
        let mut last = 0;
        // Taken out, not cloned (a screen's record holds a counter per
        // capped candidate): a placeholder marked STALE stays, so anything
        // that reads it without the gate reads the store instead.
        let cached = self.take_copy(hot_key, now);
        // Whether the copy decided on was read from the store in this call
        // (else it is the cached one, perhaps behind the store). A record
        // not in memory is not read first: the decision is made on an empty
        // record and written against "absent" (version 0), and a conflict
        // brings the stored copy to decide on again. A user the node has not
        // seen (about half the screens of a Zipf load over 1 M users) costs
        // one call, not a read and a write; a known one a conflict and a
        // write, as a read and a write before (issue 26).
        let (mut rec, mut fresh) = match cached {
            Some(rec) => (rec, false),
            None => {
                self.stats.hot_misses.fetch_add(1, Ordering::Relaxed);
                (SubjectRecord::default(), false)
            }
        };
        for _ in 0..MAX_TRIES {
            let now = now.max(self.last_now.load(Ordering::Acquire));
            let at = self.record_time(now, last, rec.write_seq);
            // Two encodes a decision, not three: the one written is the one
            // compared (without its decision time, its first field).
            let before = payload(&rec, 0, self.options.record_layout);
            expire_held(&mut rec, at, &reg);
            let r = f(&mut rec, at);
            let after = payload(&rec, at, self.options.record_layout);
            if without_last(&after, at) == without_last(&before, 0) {
                if fresh {
                    self.keep_copy(hot_key, now, rec);
                    return Ok(r);
                }
                // Nothing to write, so no compare-and-set tells whether the
                // cached copy was current: a denial or an unknown id decided
                // on an old copy would be wrong (a release elsewhere, a
                // reservation made elsewhere). Ask for the version; decide
                // again on the current copy if it moved (the record comes
                // back only then).
                match shared.peek(&disk, rec.write_seq)? {
                    None => {
                        self.keep_copy(hot_key, now, rec);
                        return Ok(r);
                    }
                    Some(Some((v, value))) => {
                        let (current, t) = self.decoded(&disk, &value, v)?;
                        (rec, last) = (current, t);
                    }
                    Some(None) => rec = SubjectRecord::default(),
                }
                fresh = true;
                continue;
            }
            // The record lives at least as long as what it must remember
            // for other nodes.
            if let Some(m) = rec.shared_meta() {
                let until = m
                    .held
                    .iter()
                    .map(|h| h.deadline)
                    .chain(m.remembered.iter().map(|s| s.deadline))
                    .max()
                    .unwrap_or(0);
                rec.idle_at = rec.idle_at.max(until.saturating_add(SETTLED_GRACE));
            }
            let value = codec::frame_as(self.options.record_layout, rec.idle_at, &after);
            let expire = rec.idle_at.saturating_add(EXPIRY_MARGIN);
            self.stats.cas.fetch_add(1, Ordering::Relaxed);
            match shared.cas(&disk, rec.write_seq, &value, expire) {
                Ok(Cas::Written(v)) => {
                    rec.write_seq = v;
                    self.keep_copy(hot_key, now, rec);
                    return Ok(r);
                }
                Ok(Cas::Conflict { version, value }) => {
                    self.stats.cas_conflicts.fetch_add(1, Ordering::Relaxed);
                    if let RecordKey::PolicyKey(h) = key {
                        self.hot_keys.conflicted(h, now);
                    }
                    rec = match value {
                        Some(v) => {
                            let (current, t) = self.decoded(&disk, &v, version)?;
                            last = t;
                            current
                        }
                        None => SubjectRecord {
                            write_seq: version,
                            ..SubjectRecord::default()
                        },
                    };
                    fresh = true;
                }
                // Frozen as a hot key (by another node, or this one since
                // the copy was taken): decided on leases from now on.
                Ok(Cas::Leased { since_ms, value }) => {
                    let hk = self.learn_hot(key, since_ms, value.as_deref())?;
                    drop(_turn);
                    return match self.with_leased_record(shared, &hk, now, |rec, at| f(rec, at))? {
                        Some(r) => Ok(r),
                        None => Err(unavailable(
                            "this key's hot-key freeze ended as it was decided; retry".to_owned(),
                        )),
                    };
                }
                // `fc_cas_v1` never fences; an owner-mode record met in
                // shared mode (nodes of both modes on one cluster) is
                // refused rather than decided on.
                Ok(Cas::Fenced(_)) => {
                    return Err(unavailable(
                        "this record is kept by owner mode: every node of a fleet must use the same `reservations` mode"
                            .to_owned(),
                    ));
                }
                Err(e) => {
                    // It may have been applied: the cached copy is read
                    // again before the next decision.
                    let _ = self.hot.try_with(
                        &hot_key,
                        now,
                        &u64::MAX,
                        || Err(()),
                        |cached| cached.write_seq = STALE,
                    );
                    return Err(e.into());
                }
            }
        }
        Err(EngineError::Overloaded(format!(
            "the record changed under {MAX_TRIES} decisions in a row (other nodes wrote it); retry"
        ))
        .into())
    }

    /// A copy of record `key` from the shared store for reading figures,
    /// with the holds past their deadline released.
    pub(crate) fn shared_figures(
        &self,
        shared: &dyn Shared,
        key: RecordKey,
    ) -> Result<SubjectRecord, EngineError> {
        let (mut rec, last) = self.read_shared(shared, &key.disk_key())?;
        let at = self.record_time(self.now(), last, rec.write_seq);
        expire_held(&mut rec, at, &self.registry());
        Ok(rec)
    }
}
