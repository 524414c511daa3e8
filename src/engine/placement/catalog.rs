//! What a fleet shares beside its records, and where this node finds it
//! (docs/cluster.md): the definitions (their version, new ids, a change
//! read anew before it is made, the definitions-writer lock), the periodic
//! tick that applies other nodes' changes and renews grants, the fleet's
//! most active campaigns. On one node all of it is this node's own.

use std::sync::atomic::Ordering;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{MutexGuard, PoisonError};

use crate::clock::{Clock, Nanos};
use crate::engine::definitions::{check_shareable_campaign, load_registry};
use crate::engine::figures::FLEET_TOP_EVERY;
use crate::engine::file_definitions::WRITER_TTL_MS;
use crate::engine::minutes::{Bucket, MINUTE, Timeline};
use crate::engine::registry::Registry;
use crate::engine::timeline::{FLUSH_EVERY, Minute, SHARED_FLUSH_EVERY, periods, timeline_key};
use crate::engine::{Engine, EngineError};
use crate::model::CompiledCampaign;
use crate::model::campaign::CampaignDef;
use crate::store::{Op, Space};

impl<C: Clock> Engine<C> {
    /// With a shared store, what the sweeper does every 250 ms: applies
    /// definitions other nodes changed, and renews this node's grants.
    pub fn cluster_tick(&self) -> Result<(), EngineError> {
        if self.shared().is_none() {
            return Ok(());
        }
        let r = self.refresh_definitions().map(drop);
        if r.is_ok() {
            self.shared_ok_at.fetch_max(self.now(), Ordering::AcqRel);
        }
        // Before the renewal, so that holds given up are reported with it.
        self.read_notices();
        self.renew_leases();
        self.refresh_fleet_top();
        self.drop_unowned(self.now());
        r
    }

    /// Whether the shared store answered lately (its definitions' version
    /// was read within the last 2 s by [`Engine::cluster_tick`]); always
    /// true on one node.
    pub fn shared_reachable(&self) -> bool {
        self.shared().is_none()
            || self
                .now()
                .saturating_sub(self.shared_ok_at.load(Ordering::Acquire))
                < 2_000_000_000
    }

    /// With a shared store: applies the definitions other nodes changed, if
    /// any changed since the last call (the sweeper calls it every 250 ms,
    /// so a change reaches every node within a second). Returns whether it
    /// applied a change.
    pub fn refresh_definitions(&self) -> Result<bool, EngineError> {
        let Some(shared) = self.shared() else {
            return Ok(false);
        };
        let version = shared.definitions_version()?;
        if version == self.defs_version.load(Ordering::Acquire) {
            return Ok(false);
        }
        let _w = self
            .defs_write
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Read after the version: a change made between the two is applied
        // now and again at the next call, never missed.
        // A campaign's record (this node's campaign-side state: its holds
        // and spend under its grants) carries over, as a PUT keeps it.
        let reg = load_registry(&*self.store, Some(&self.registry()))?;
        self.publish(reg);
        self.defs_version.store(version, Ordering::Release);
        Ok(true)
    }

    /// A copy of the definitions to change, taken under `defs_write`: with
    /// a shared store, read anew, so that a change another node made a
    /// moment ago is not undone.
    pub(crate) fn registry_to_change(&self) -> Result<Registry, EngineError> {
        if self.shared().is_some() {
            return Ok(load_registry(&*self.store, Some(&self.registry()))?);
        }
        Ok((*self.registry()).clone())
    }

    /// An id for a new definition: above every id in use, and with a shared
    /// store one no other node hands out.
    pub(crate) fn new_definition_id(&self, reg: &Registry) -> Result<u32, EngineError> {
        match self.shared() {
            Some(shared) => Ok(shared.new_id(reg.max_id)?),
            None => Ok(reg.max_id + 1),
        }
    }

    /// With a shared store: takes the definitions-writer lock if no node
    /// holds it, or renews it if this node does. Returns whether this node
    /// holds it and who does (`None` on one node: it is its own writer).
    pub fn claim_definitions_writer(&self) -> Result<Option<(bool, Option<String>)>, EngineError> {
        let Some(shared) = self.shared() else {
            return Ok(None);
        };
        let me = self.definitions_writer_name();
        let holder = shared.definitions_writer(&me, WRITER_TTL_MS)?;
        Ok(Some((holder.as_deref() == Some(me.as_str()), holder)))
    }

    /// Gives the definitions-writer lock up if this node holds it (at
    /// shutdown: another node takes over at once, not in
    /// [`WRITER_TTL_MS`]).
    pub fn release_definitions_writer(&self) {
        if let Some(shared) = self.shared() {
            let _ = shared.definitions_writer(&self.definitions_writer_name(), 0);
        }
    }

    /// With a shared store, reads the fleet's most active campaigns if the
    /// last read is [`FLEET_TOP_EVERY`] old (the sweeper calls it). A failed
    /// read keeps the last list.
    pub(crate) fn refresh_fleet_top(&self) {
        let Some(shared) = self.shared() else { return };
        let n = self.fleet_top.wanted.load(Relaxed);
        let now = self.now();
        if n == 0 || now.saturating_sub(self.fleet_top.at.load(Relaxed)) < FLEET_TOP_EVERY {
            return;
        }
        self.fleet_top.at.store(now, Relaxed);
        match shared.most_active(now / (1440 * 60_000_000_000), n) {
            Ok(top) => {
                *self
                    .fleet_top
                    .top
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(top);
            }
            Err(e) => tracing::debug!("the fleet's most active campaigns not read: {e}"),
        }
    }

    /// Refuses a campaign its placement cannot keep: with a shared store,
    /// one whose campaign-scope state no lease can share
    /// ([`check_shareable_campaign`]); anything on one node.
    pub(crate) fn check_placeable_campaign(
        &self,
        def: &CampaignDef,
        compiled: &CompiledCampaign,
    ) -> Result<(), EngineError> {
        if self.placement.is_local() {
            return Ok(());
        }
        check_shareable_campaign(def, compiled)
    }

    /// Where campaign `id`'s minutes `from` to `to` are read: the fleet's,
    /// as every node answers them, from a shared store (this node's last
    /// unflushed counts are not in yet); this node's own on one node.
    pub(crate) fn timeline_minutes(
        &self,
        id: u32,
        timeline: MutexGuard<'_, Timeline>,
        from: u64,
        to: u64,
    ) -> Result<Vec<Minute>, EngineError> {
        let Some(shared) = self.shared() else {
            return Ok(timeline
                .minutes
                .range(from..)
                .map(|(m, b)| Minute {
                    start: m * MINUTE,
                    bucket: *b,
                })
                .collect());
        };
        drop(timeline);
        Ok(shared
            .timeline_read(id, from, to)?
            .into_iter()
            .map(|(m, [spend, commits, denied])| Minute {
                start: m * MINUTE,
                bucket: Bucket {
                    spend,
                    commits,
                    denied,
                },
            })
            .collect())
    }

    /// How often timelines are written: a shared store's every
    /// [`SHARED_FLUSH_EVERY`] (the fleet's figures converge within it), one
    /// node's every [`FLUSH_EVERY`] (behind, for a restart).
    pub(crate) fn timelines_flush_every(&self) -> Nanos {
        match self.placement.is_local() {
            true => FLUSH_EVERY,
            false => SHARED_FLUSH_EVERY,
        }
    }

    /// Writes the timelines changed since they were last written: to the
    /// fleet's in a shared store ([`flush_shared`]), else to this node's
    /// store, behind.
    pub(crate) fn write_timelines(&self, reg: &Registry, now: Nanos) {
        if let Some(shared) = self.shared() {
            return flush_shared(shared, reg, now);
        }
        let mut ops = Vec::new();
        for c in reg.campaigns.values() {
            let mut t = c.timeline.lock().unwrap_or_else(PoisonError::into_inner);
            t.prune(periods(c, now).1);
            t.pending.clear();
            if t.dirty {
                t.dirty = false;
                ops.push(Op::Put(Space::State, timeline_key(c.id), t.to_stored()));
            }
        }
        if !ops.is_empty() {
            let _ = self.store.submit(ops, false);
        }
    }
}

/// Adds every campaign's counts since the last flush to the fleet's
/// timelines, and their activity to the fleet's totals. A campaign whose
/// write failed keeps its counts for the next flush (the write is one
/// `MULTI`/`EXEC`: a failure applied none of it, unless its answer was
/// lost after it applied, the one case counted twice).
fn flush_shared(shared: &dyn crate::store::Shared, reg: &Registry, now: Nanos) {
    let mut activity = Vec::new();
    for c in reg.campaigns.values() {
        let pending = {
            let mut t = c.timeline.lock().unwrap_or_else(PoisonError::into_inner);
            // Answered from the store: this node keeps only its new counts.
            t.minutes.clear();
            t.dirty = false;
            std::mem::take(&mut t.pending)
        };
        if pending.is_empty() {
            continue;
        }
        let minutes: Vec<crate::store::MinuteCounts> = pending
            .iter()
            .map(|(m, b)| (*m, [b.spend, b.commits, b.denied]))
            .collect();
        let ((start, end), _) = periods(c, now);
        // Two periods: the current one and the one before it.
        let keep_for = 2 * (end - start);
        match shared.timeline_add(c.id, &minutes, keep_for) {
            Ok(()) => {
                let n: u64 = pending.values().map(|b| b.commits + b.denied).sum();
                if n > 0 {
                    activity.push((c.id, n));
                }
            }
            Err(e) => {
                tracing::debug!(
                    "timeline of {:?} not flushed, kept for the next: {e}",
                    c.name
                );
                let mut t = c.timeline.lock().unwrap_or_else(PoisonError::into_inner);
                for (m, b) in pending {
                    let p = t.pending.entry(m).or_default();
                    p.spend = p.spend.saturating_add(b.spend);
                    p.commits += b.commits;
                    p.denied += b.denied;
                }
            }
        }
    }
    // Only ranks the campaigns /metrics exports: a lost update is not
    // retried (every node still reads the same totals).
    let day = now / (1440 * MINUTE);
    if let Err(e) = shared.activity_add(day, &activity) {
        tracing::debug!("campaign activity not added: {e}");
    }
}
