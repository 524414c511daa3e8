//! Hot keys (docs/cluster.md, "Hot keys"): a policy key that several nodes
//! decide at once met other nodes' writes on most compare-and-sets, and 2–7
//! of 60 calls were answered `UNAVAILABLE` after [`super::MAX_TRIES`]
//! (issue 47). Once a key's writes conflict [`HOT_CONFLICTS`] times within a
//! second on a node, that node freezes the key's record in the store
//! (`fc_hot_v1`), atomically with what it counts: from then on no node
//! writes it (`fc_cas_v3` answers [`crate::store::Cas::Leased`]), and every
//! node decides on a record of its own, in memory, starting empty, whose
//! items allow only within grants of the fleet's limit less what the frozen
//! record counted (`crate::engine::leases::keys`).
//!
//! A freeze lives as long as the periods the fleet leases under it (the
//! nodes using it extend it), so it ends between two periods of a window,
//! whose next one the record written then starts afresh. A node uses a
//! freeze only while it knows it stands ([`USE_MARGIN`] before its expiry),
//! extending it first if need be.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use super::form::decode;
use crate::clock::{Clock, Nanos};
use crate::engine::hot::{Halt, RecordKey};
use crate::engine::record::SubjectRecord;
use crate::engine::{Engine, corrupt};
use crate::limits::stack::Stack;
use crate::store::{Hot, Shared, StoreError};

/// Conflicts of one key's writes on one node within a second that make the
/// key hot. Keys decided by one node at a time (a user's, with affinity)
/// meet ~0 (BENCHMARKS.md); one key decided by three nodes met dozens a
/// second at a few hundred calls a second.
pub(crate) const HOT_CONFLICTS: u32 = 8;

/// A node uses a freeze until this long before its expiry (the store's
/// clock; nodes decide at the cluster's time, within a millisecond of it).
const USE_MARGIN: Nanos = 2_000_000_000;

/// A freeze with no window period to cover lives this long past its last
/// use (extended while in use); a window's lives to its period's end and
/// this much more.
pub(crate) const FREEZE_HOLD: Nanos = 10_000_000_000;

/// The version a hot key's own record carries (never a store's: versions
/// are µs timestamps, ~2^51 now): a decision tells by it that it runs on
/// the node's own record of a hot key, and checks its grants.
pub(crate) const LEASED_COPY: u64 = u64::MAX - 1;

/// The hot keys this node knows of.
#[derive(Default)]
pub(crate) struct HotKeys {
    /// Whether any key is hot here: a decision on a cold key reads one atomic.
    any: AtomicBool,
    keys: Mutex<HashMap<u128, Arc<HotKey>>>,
    /// Write conflicts per policy key in the current second: (second, count).
    conflicts: Mutex<HashMap<u128, (Nanos, u32)>>,
}

/// A stack a hot key is decided by: its definition's id, the stack, and
/// its items' tags.
pub(crate) type DecidedBy = (u32, Arc<Stack>, Vec<u32>);

/// A hot key, as this node decides on it.
pub(crate) struct HotKey {
    pub hash: u128,
    /// When the store froze it (ms, the store's clock): its leases' names.
    pub since_ms: u64,
    /// The record as frozen: what was counted before the key went hot.
    pub seed: SubjectRecord,
    /// This node's decisions since: a record of its own, never stored.
    pub own: Mutex<SubjectRecord>,
    /// The freeze stands until then (this node's clock, less [`USE_MARGIN`]).
    usable_until: AtomicU64,
    /// What this node last asked the freeze to live until.
    asked_until: AtomicU64,
    /// When a decision last used it.
    pub used_at: AtomicU64,
    /// The stacks decided on it (a policy's, or inline ones): the sweeper
    /// renews their grants.
    pub stacks: Mutex<Vec<DecidedBy>>,
}

impl HotKey {
    fn new(hash: u128, since_ms: u64, seed: SubjectRecord) -> Self {
        HotKey {
            hash,
            since_ms,
            seed,
            own: Mutex::new(SubjectRecord {
                write_seq: LEASED_COPY,
                ..SubjectRecord::default()
            }),
            usable_until: AtomicU64::new(0),
            asked_until: AtomicU64::new(0),
            used_at: AtomicU64::new(0),
            stacks: Mutex::new(Vec::new()),
        }
    }

    /// Notes that the store has the freeze to live until `expire_at_ms` (0:
    /// no expiry), as asked until `asked`.
    fn stands_until(&self, expire_at_ms: u64, asked: Nanos) {
        let until = match expire_at_ms {
            0 => Nanos::MAX,
            ms => ms.saturating_mul(1_000_000).saturating_sub(USE_MARGIN),
        };
        self.usable_until.fetch_max(until, Ordering::AcqRel);
        self.asked_until.fetch_max(asked, Ordering::AcqRel);
    }

    /// Whether this node knows the freeze stands at `now`.
    pub(crate) fn usable(&self, now: Nanos) -> bool {
        now < self.usable_until.load(Ordering::Acquire)
    }

    /// Notes the stack `stack` (of `def_id`, its items' `tags`) decided on it.
    pub(crate) fn decided_by(&self, def_id: u32, stack: &Arc<Stack>, tags: &[u32]) {
        let mut s = self.stacks.lock().unwrap_or_else(PoisonError::into_inner);
        if !s.iter().any(|(d, _, t)| *d == def_id && t == tags) {
            s.push((def_id, stack.clone(), tags.to_vec()));
        }
    }
}

impl HotKeys {
    /// Hot key `hash`, if this node knows it is.
    pub(crate) fn get(&self, hash: u128) -> Option<Arc<HotKey>> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        self.lock().get(&hash).cloned()
    }

    /// Every hot key this node knows.
    pub(crate) fn all(&self) -> Vec<Arc<HotKey>> {
        if !self.any.load(Ordering::Acquire) {
            return Vec::new();
        }
        self.lock().values().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u128, Arc<HotKey>>> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts a write conflict on policy key `hash` at `now`: whether the
    /// key is hot by now ([`HOT_CONFLICTS`] in its second).
    pub(crate) fn conflicted(&self, hash: u128, now: Nanos) -> bool {
        let second = now / 1_000_000_000;
        let mut c = self
            .conflicts
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Bounded: keys of past seconds go whenever the map grows.
        if c.len() >= 4096 {
            c.retain(|_, (s, _)| *s == second);
        }
        let e = c.entry(hash).or_insert((second, 0));
        if e.0 != second {
            *e = (second, 0);
        }
        e.1 += 1;
        e.1 >= HOT_CONFLICTS
    }

    /// Whether policy key `hash` met [`HOT_CONFLICTS`] write conflicts in
    /// the second of `now`.
    pub(crate) fn heated(&self, hash: u128, now: Nanos) -> bool {
        let c = self
            .conflicts
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        c.get(&hash)
            .is_some_and(|&(s, n)| s == now / 1_000_000_000 && n >= HOT_CONFLICTS)
    }

    /// Hot key `hash` as the store froze it (since `since_ms`, `value` its
    /// record then): the one this node has if the same freeze, else a new
    /// one (a freeze that ended and came again starts on fresh leases).
    fn learn(&self, hash: u128, since_ms: u64, seed: SubjectRecord, now: Nanos) -> Arc<HotKey> {
        let mut keys = self.lock();
        let hk = match keys.get(&hash) {
            Some(hk) if hk.since_ms == since_ms => hk.clone(),
            _ => {
                let hk = Arc::new(HotKey::new(hash, since_ms, seed));
                // Learned for a decision: in use from now.
                hk.used_at.store(now, Ordering::Release);
                keys.insert(hash, hk.clone());
                hk
            }
        };
        self.any.store(true, Ordering::Release);
        hk
    }

    /// Forgets hot key `hk` (its freeze ended), unless another freeze of
    /// the key replaced it.
    pub(crate) fn forget(&self, hk: &HotKey) {
        let mut keys = self.lock();
        if keys
            .get(&hk.hash)
            .is_some_and(|k| k.since_ms == hk.since_ms)
        {
            keys.remove(&hk.hash);
        }
        self.any.store(!keys.is_empty(), Ordering::Release);
    }
}

impl<C: Clock> Engine<C> {
    /// The hot key a compare-and-set found frozen (`since_ms`, the record
    /// as frozen `value`), as this node now knows it.
    pub(super) fn learn_hot(
        &self,
        key: RecordKey,
        since_ms: u64,
        value: Option<&[u8]>,
    ) -> Result<Arc<HotKey>, StoreError> {
        let RecordKey::PolicyKey(hash) = key else {
            return Err(StoreError::Io(
                "only a policy key's record is frozen as a hot key".into(),
            ));
        };
        if let Some(hk) = self.hot_keys.get(hash)
            && hk.since_ms == since_ms
        {
            return Ok(hk);
        }
        let disk = key.disk_key();
        let seed = match value {
            Some(v) => {
                let (mut rec, _) = decode(v, 0).map_err(|m| corrupt(&disk, m))?;
                self.registry().retag_legacy(&mut rec);
                rec
            }
            None => SubjectRecord::default(),
        };
        self.stats.hot_keys.fetch_add(1, Ordering::Relaxed);
        Ok(self.hot_keys.learn(hash, since_ms, seed, self.now()))
    }

    /// [`Engine::with_record`] on hot key `hk`: `f` decides on this node's
    /// own record of it, written nowhere (what it spends is reported on its
    /// leases). `None` if the freeze ended (the key is cold again: decide
    /// by compare-and-set).
    pub(super) fn with_leased_record<R>(
        &self,
        shared: &dyn Shared,
        hk: &HotKey,
        now: Nanos,
        f: impl FnOnce(&mut SubjectRecord, Nanos) -> R,
    ) -> Result<Option<R>, Halt> {
        if (!hk.usable(now) || self.hot_due(hk, now)) && !self.extend_hot(shared, hk, now)? {
            return Ok(None);
        }
        hk.used_at.fetch_max(now, Ordering::AcqRel);
        let reg = self.registry();
        let mut own = hk.own.lock().unwrap_or_else(PoisonError::into_inner);
        // Its holds expire here: no other node reads this record.
        super::in_record::expire_held(&mut own, now, &reg);
        Ok(Some(f(&mut own, now)))
    }

    /// Extends hot key `hk`'s freeze to cover what this node leases under
    /// it: whether it still stands (if not, this node forgets the key).
    pub(crate) fn extend_hot(
        &self,
        shared: &dyn Shared,
        hk: &HotKey,
        now: Nanos,
    ) -> Result<bool, Halt> {
        let until = self.hot_until(hk, now);
        let disk = RecordKey::PolicyKey(hk.hash).disk_key();
        match shared.hot(&disk, until, false)? {
            Hot::Frozen {
                since_ms,
                expire_at_ms,
                ..
            } if since_ms == hk.since_ms => {
                hk.stands_until(expire_at_ms, until);
                Ok(true)
            }
            _ => {
                self.hot_keys.forget(hk);
                Ok(false)
            }
        }
    }

    /// Whether hot key `hk`'s freeze still stands, without extending it:
    /// if not, this node forgets the key.
    pub(crate) fn hot_stands(&self, shared: &dyn Shared, hk: &HotKey) -> Result<bool, Halt> {
        let disk = RecordKey::PolicyKey(hk.hash).disk_key();
        match shared.hot(&disk, 0, false)? {
            Hot::Frozen {
                since_ms,
                expire_at_ms,
                ..
            } if since_ms == hk.since_ms => {
                hk.stands_until(expire_at_ms, 0);
                Ok(true)
            }
            _ => {
                self.hot_keys.forget(hk);
                Ok(false)
            }
        }
    }

    /// Whether hot key `hk`'s freeze should be extended before a decision
    /// now: what this node asked it to live until is less than half a
    /// [`FREEZE_HOLD`] past now, or past the periods it leases
    /// ([`Engine::hot_until`]).
    pub(crate) fn hot_due(&self, hk: &HotKey, now: Nanos) -> bool {
        let asked = hk.asked_until.load(Ordering::Acquire);
        asked < self.hot_until(hk, now).saturating_sub(FREEZE_HOLD / 2)
    }

    /// Freezes policy key `key`'s record as it is in the store, so its
    /// decisions go to leases seeded from one copy; a freeze that fails
    /// leaves the key as it was. Holds open in the frozen record count as
    /// spent on its leases (a release of one gives nothing back). Called
    /// after a decision on a key [`HotKeys::heated`], or given up for
    /// conflicts.
    pub(crate) fn freeze(&self, key: RecordKey, now: Nanos) {
        let Some(shared) = self.shared() else {
            return;
        };
        let until = now.saturating_add(FREEZE_HOLD);
        match shared.hot(&key.disk_key(), until, true) {
            Ok(Hot::Frozen {
                since_ms,
                expire_at_ms,
                value,
            }) => match self.learn_hot(key, since_ms, value.as_deref()) {
                Ok(hk) => {
                    hk.stands_until(expire_at_ms, until);
                    tracing::info!("policy key {:032x} is hot: decided on leases", hk.hash);
                }
                Err(e) => tracing::warn!("a hot key's frozen record: {e}"),
            },
            Ok(Hot::Cold { .. }) => {}
            Err(e) => tracing::debug!("freezing a hot key failed: {e}"),
        }
    }
}
