//! The engine on a shared store (docs/cluster.md): user and policy-key
//! records are read from, and written to, the store several nodes share, by
//! compare-and-set on a version. Reservations live in the records
//! themselves (their pending debits with the deadline, and the ids settled
//! until their deadline), so any node commits, releases or expires them.
//!
//! A decision runs on the node's cached copy of the record (the hot tier
//! holds the version it equals); if another node wrote since, the store
//! answers with the current copy and the decision runs again on it, at most
//! [`MAX_TRIES`] times. Decisions are the same code as on one node: only
//! where the record comes from and goes to differs.
//!
//! Where each part lives:
//! - [`form`]: the stored form of a record (pure: encode and decode).
//! - [`cas`]: shared mode, a decision on a copy written back by
//!   compare-and-set.
//! - [`owned`]: owner mode, a decision on the owner's copy in memory.
//! - [`leased`]: a hot policy key, frozen in the store and decided by each
//!   node on a record of its own within leased grants.
//! - [`in_record`]: reservations kept in a record (holds, settled ids,
//!   who wins a commit) and their settlement across nodes.

mod cas;
mod catalog;
mod event_ids;
mod form;
mod in_record;
mod leased;
mod local;
mod owned;

use crate::clock::{Clock, Nanos};
use crate::cluster::owners::{Owner, Owners};
use crate::engine::definitions::load_registry;
use crate::engine::hot::{Halt, Reads, RecordKey};
use crate::engine::migrate;
use crate::engine::record::SubjectRecord;
use crate::engine::registry::Registry;
use crate::engine::{Engine, EngineError, EngineOptions, Fleet, invalid};
use crate::store::Store;
use crate::store::{Shared, StoreError};

pub(crate) use event_ids::Dedupe;
pub(crate) use in_record::{ForeignWinner, InRecord, RecordedEnd, SeenHere, seen_in_record};
pub(crate) use leased::{FREEZE_HOLD, HotKey, HotKeys, LEASED_COPY};

/// Tries of a decision whose write met other nodes' writes before it gives
/// up with 503 (docs/cluster.md: with affinity, conflicts measured ~0).
pub(crate) const MAX_TRIES: usize = 3;

/// The version of a cached record whose shared copy is unknown (a write
/// that failed may have been applied): it is read again before any decision.
pub(crate) const STALE: u64 = u64::MAX;

/// How long the shared copy outlives the record's idle instant: node clocks
/// differ by milliseconds, and a record that is dropped early would forget
/// debits still counting on a node whose clock is behind.
const EXPIRY_MARGIN: Nanos = 60 * 1_000_000_000;

/// How far a record's own time may hold a decision on it past this node's
/// time. Nodes decide at the cluster's time (Redis's, measured to within half
/// a round trip: under a millisecond), so a record is ahead by that much at
/// most; one further ahead was written by a node deciding at its own wrong
/// clock (an older release, or one that could not read Redis's time), and
/// following it would roll this record's windows early. Decisions on it are
/// held up by this much only, and counted (`record_time_capped`).
pub(crate) const MAX_RECORD_AHEAD: Nanos = 1_000_000_000;

/// Where an engine's records live (docs/cluster.md), fixed when it opens:
/// the one value the engine's operations ask instead of the store's kind.
#[derive(Debug)]
pub(crate) enum Placement {
    /// In this node's own store (memory or RocksDB): one node.
    Local,
    /// In a shared store, each decision written by compare-and-set
    /// ([`cas`]): shared mode.
    Shared,
    /// A user's record in its owner's memory, its committed state in the
    /// shared store ([`owned`]): owner mode. Policy keys' and other
    /// identities' records stay shared.
    Owned(Owners),
}

/// Local time `t` as the cluster's: shifted by the offset a shared store
/// measured, unchanged on one node.
pub(crate) fn cluster_time(t: Nanos, store: &dyn Store) -> Nanos {
    match store.shared().and_then(|s| s.clock_offset()) {
        Some(offset) => crate::cluster::time::shifted(t, offset),
        None => t,
    }
}

impl Placement {
    /// The definitions as the engine opens on `store`, and their version
    /// (a shared store's; 0 on one node). On one node a data directory of
    /// an older build has its counters' tags made their items' names
    /// first (`migrate`); a shared store's records are not migrated
    /// (docs/cluster.md, "Upgrades").
    pub(crate) fn open_definitions(
        &self,
        store: &dyn Store,
    ) -> Result<(Registry, u64), EngineError> {
        let Some(shared) = store.shared().filter(|_| !self.is_local()) else {
            let reg = load_registry(store, None)?;
            if migrate::has_name_tags(store)? {
                return Ok((reg, 0));
            }
            let n = migrate::migrate_tags(store, &reg)?;
            if n == 0 {
                return Ok((reg, 0));
            }
            tracing::info!(records = n, "counter tags migrated to item names");
            return Ok((load_registry(store, None)?, 0));
        };
        let version = shared.definitions_version()?;
        Ok((load_registry(store, None)?, version))
    }
    /// One node's own store.
    pub(crate) fn is_local(&self) -> bool {
        matches!(self, Placement::Local)
    }

    /// Whether a decision on a record may run more than once: on a shared
    /// store, when another node wrote the record meanwhile ([`cas`]).
    pub(crate) fn may_decide_again(&self) -> bool {
        !self.is_local()
    }

    /// Whether a decision on a user's record (`of_user`), or on any other
    /// (a policy key's, a user-less reservation's), can be made on the
    /// executor, from memory, with no call to a shared store: always on one
    /// node (a cold record is then read from the store's cache or not at
    /// all, [`Reads`]); in owner mode on a user's record, the owner's copy;
    /// never on a record a shared store keeps.
    pub(crate) fn in_memory(&self, of_user: bool) -> bool {
        match self {
            Placement::Local => true,
            Placement::Shared => false,
            Placement::Owned(_) => of_user,
        }
    }
    /// The placement `options` ask for on `store`; owner mode needs a
    /// shared store.
    pub(crate) fn of(store: &dyn Store, options: &EngineOptions) -> Result<Placement, EngineError> {
        match (store.shared(), &options.fleet) {
            (None, Fleet::Shared) => Ok(Placement::Local),
            (None, Fleet::Owner { .. }) => Err(invalid(
                "reservations",
                "owner mode needs a shared (redis-cluster) store",
            )),
            (Some(_), Fleet::Shared) => Ok(Placement::Shared),
            (Some(_), Fleet::Owner { advertise }) => {
                Ok(Placement::Owned(Owners::new(&options.node_id, advertise)))
            }
        }
    }
}

/// The error a request gets where this node does not decide.
fn unavailable(message: String) -> Halt {
    EngineError::Store(StoreError::Unavailable(message)).into()
}

impl<C: Clock> Engine<C> {
    /// Runs `f` on record `key` (a user or policy key) wherever it lives
    /// ([`Placement`]): the one place a decision learns that. A record that
    /// cannot be loaded is not decided on: `f` is not called.
    ///
    /// `f` gets the record and the time to decide at: `now`, or on a shared
    /// store the record's last decision if that is later ([`cas`], where
    /// `f` may run again after a conflict).
    pub(crate) fn with_record<R>(
        &self,
        key: RecordKey,
        now: Nanos,
        reads: Reads,
        f: impl FnMut(&mut SubjectRecord, Nanos) -> R,
    ) -> Result<R, Halt> {
        let Some(shared) = self.shared().filter(|_| !self.placement.is_local()) else {
            return self.with_local_record(key, now, reads, f);
        };
        // Every shared read and write is a network call: never on the
        // executor (the API moves such calls to a blocking thread). Owner
        // mode decides a screen on a user it owns and holds in memory with
        // none ([`owned`]).
        let memory_only = reads == Reads::MemoryOnly;
        if memory_only && !self.placement.in_memory(matches!(key, RecordKey::User(_))) {
            return Err(Halt::NotInMemory);
        }
        self.with_shared_record(shared, key, now, memory_only, f)
    }

    /// `f`, a decision from memory on the executor (`Reads::MemoryOnly`),
    /// if this placement can make it there: on a user's record (`of_user`)
    /// or any other ([`Placement::in_memory`]). `None`, having changed
    /// nothing, where it cannot, or where `f` found a record on disk only:
    /// the caller then decides on a blocking thread.
    pub(crate) fn in_memory_if<T>(
        &self,
        of_user: bool,
        f: impl FnOnce() -> Result<T, Halt>,
    ) -> Option<Result<T, EngineError>> {
        if !self.placement.in_memory(of_user) {
            return None;
        }
        crate::engine::hot::if_in_memory(f())
    }

    /// A new reservation id, naming the record that keeps the reservation
    /// where other nodes must find it (a shared store); on one node `record`
    /// is not named ([`Engine::new_reservation_id`]).
    pub(crate) fn reservation_id_in(&self, record: Option<RecordKey>) -> String {
        self.new_reservation_id(record.filter(|_| !self.placement.is_local()))
    }

    /// The number a record keeps reservation `id` under where records keep
    /// reservations (a shared store: the id's hash, the same on every
    /// node); `None` on one node, whose table numbers it.
    pub(crate) fn reservation_number(&self, id: &str) -> Option<u64> {
        (!self.placement.is_local()).then(|| self.res_of(id))
    }

    /// A copy of identity record `key` to decide with, as `reads` allows.
    pub(crate) fn identity_copy(&self, key: u128, reads: Reads) -> Result<SubjectRecord, Halt> {
        let key = RecordKey::PolicyKey(key);
        if !self.placement.is_local() {
            if reads == Reads::MemoryOnly {
                return Err(Halt::NotInMemory);
            }
            return Ok(self.record_figures(key)?);
        }
        if let Some(r) = self.hot.get(&key.hot_key(), SubjectRecord::figures_copy) {
            return Ok(r);
        }
        self.load_record(key, reads)
    }

    /// A copy of record `key` for reading figures, wherever it lives.
    pub(crate) fn record_figures(&self, key: RecordKey) -> Result<SubjectRecord, EngineError> {
        let Some(shared) = self.shared().filter(|_| !self.placement.is_local()) else {
            return self.local_figures(key);
        };
        if let Some(r) = self.owned_figures(key) {
            return Ok(r);
        }
        self.shared_figures(shared, key)
    }

    /// Refuses a check a shared store cannot hold: a reservation of inline
    /// limits (no node but this one knows their items, so no other could
    /// expire it).
    pub(crate) fn check_shareable(
        &self,
        def_id: u32,
        reserving: bool,
        inline: bool,
    ) -> Result<(), EngineError> {
        // Inline limits reserve when the request carries them (kept with
        // the hold, [`Held::inline`]); limits compiled by a front (RESP's
        // `CL.THROTTLE`, Envoy's rules) never reserve.
        if reserving && def_id == 0 && !inline {
            return Err(invalid(
                "reserve",
                "with a shared (redis-cluster) store, only a named policy's or inline limits' check can reserve",
            ));
        }
        Ok(())
    }

    /// The shared side of the store, if several nodes share it.
    pub(crate) fn shared(&self) -> Option<&dyn Shared> {
        self.store.shared()
    }

    /// This node's name among the nodes of a cluster.
    pub fn node_id(&self) -> &str {
        &self.options.node_id
    }

    /// Owner mode: renews this node's lease and reads the members
    /// ([`Owners::renew`]); nothing in shared mode.
    pub fn renew_membership(&self) -> Result<(), EngineError> {
        let (Some(owners), Some(shared)) = (self.owners(), self.shared()) else {
            return Ok(());
        };
        owners.renew(shared).map_err(Into::into)
    }

    /// Owner mode: ends this node's membership lease now (at shutdown,
    /// after the last request); nothing in shared mode.
    pub fn leave_membership(&self) -> Result<(), EngineError> {
        let (Some(owners), Some(shared)) = (self.owners(), self.shared()) else {
            return Ok(());
        };
        owners.leave(shared).map_err(Into::into)
    }

    /// Whether this node runs owner mode.
    pub(crate) fn in_owner_mode(&self) -> bool {
        self.owners().is_some()
    }

    /// Owner mode: where other nodes forward this node's users (`None` in
    /// any other placement).
    pub fn advertised(&self) -> Option<&str> {
        self.owners().map(Owners::addr)
    }

    /// Owner mode: the heavy users the fleet's table in force places with
    /// bounded loads (docs/cluster.md, "Owner mode"); 0 in any other placement.
    pub fn owner_heavy_users(&self) -> u64 {
        self.owners()
            .map_or(0, |o| o.heavy_users(self.now()) as u64)
    }

    /// Owner mode: who owns which user (`None` in any other placement).
    pub(crate) fn owners(&self) -> Option<&Owners> {
        match &self.placement {
            Placement::Owned(owners) => Some(owners),
            Placement::Local | Placement::Shared => None,
        }
    }

    /// Owner mode: who decides on `user` now (`None`: not in owner mode).
    pub fn owner_of_user(&self, user: &str) -> Option<Owner> {
        let owners = self.owners()?;
        Some(owners.owner(self.hash(b'u', 0, user), self.now()))
    }

    /// Owner mode: who decides on identity `id` of `kind` (its record's
    /// owner). `None`: not in owner mode, or a malformed kind (the call
    /// itself then says what is wrong).
    pub fn owner_of_identity(&self, kind: &str, id: &str) -> Option<Owner> {
        let owners = self.owners()?;
        let k = crate::model::identity::Kind::parse(kind).ok()?;
        Some(owners.owner(self.identity_key(k, id), self.now()))
    }

    /// Owner mode: who decides on reservation `id` (`user`: the user a
    /// commit names): the owner of the user whose record holds it. `None`:
    /// not in owner mode, or a reservation any node settles (a user-less
    /// screen's, a policy key's).
    pub fn owner_of_reservation(&self, id: &str, user: Option<&str>) -> Option<Owner> {
        let owners = self.owners()?;
        let h = match Self::record_in_id(id) {
            Some(RecordKey::User(h)) => h,
            Some(_) => return None,
            None => match self.reservations.reserved(id).as_deref() {
                Some(crate::engine::reservations::Reserved::Screen { user: Some(u), .. }) => *u,
                Some(_) => return None,
                None => self.hash(b'u', 0, user?),
            },
        };
        Some(owners.owner(h, self.now()))
    }

    /// A reservation id's hash: the `res` of its pending debits in a shared
    /// record (and the local table's number for it), the same on every node.
    pub(crate) fn res_of(&self, id: &str) -> u64 {
        self.hash(b'r', 0, id) as u64
    }

    /// The record of user-less screen reservation `seq` with a shared store:
    /// it holds the reservation only (its holds are campaign-side, the
    /// reserving node's), so that any node commits or releases it and the
    /// reserving node learns there, at the deadline, how it was settled.
    pub(crate) fn userless_record(&self, seq: u64) -> RecordKey {
        RecordKey::PolicyKey(self.hash(b'n', 0, &format!("{seq:016x}")))
    }

    /// The record a node-made reservation id names (its last part), if it
    /// names one: `u<32 hex>` a user's, `k<32 hex>` a policy key's.
    pub(crate) fn record_in_id(id: &str) -> Option<RecordKey> {
        let last = id.rsplit('-').next()?;
        let (kind, hex) = last.split_at_checked(1)?;
        if hex.len() != 32 {
            return None;
        }
        let h = u128::from_str_radix(hex, 16).ok()?;
        match kind {
            "u" => Some(RecordKey::User(h)),
            "k" => Some(RecordKey::PolicyKey(h)),
            _ => None,
        }
    }

    /// The process nonce in a node-made reservation id
    /// (`r-<nonce>-<seq>-<record>`, [`Engine::new_reservation_id`]).
    pub(crate) fn maker_in_id(id: &str) -> Option<u32> {
        let mut parts = id.split('-');
        let (Some("r"), Some(nonce), Some(_), Some(_), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return None;
        };
        (nonce.len() == 8)
            .then(|| u32::from_str_radix(nonce, 16).ok())
            .flatten()
    }

    /// The suffix a node-made reservation id carries with a shared store:
    /// the record holding it, so that any node finds it.
    pub(crate) fn id_suffix(key: RecordKey) -> String {
        match key {
            RecordKey::User(h) => format!("-u{h:032x}"),
            RecordKey::PolicyKey(h) => format!("-k{h:032x}"),
            RecordKey::Campaign(_) => String::new(),
        }
    }

    /// Takes the cached copy of a record out of the hot tier, if it has a
    /// current one; a placeholder marked STALE stays, so anything that reads
    /// it without the gate reads the store instead.
    pub(super) fn take_copy(&self, hot_key: [u64; 2], now: Nanos) -> Option<SubjectRecord> {
        self.hot
            .try_with(
                &hot_key,
                now,
                &u64::MAX,
                || Err(()),
                |rec| {
                    (rec.write_seq != STALE).then(|| {
                        std::mem::replace(
                            rec,
                            SubjectRecord {
                                write_seq: STALE,
                                ..SubjectRecord::default()
                            },
                        )
                    })
                },
            )
            .ok()
            .flatten()
    }

    /// Puts `rec`, as decided and written (or found current), back in the
    /// hot tier under its shard's lock; this record's gate is held, so no
    /// other decision of this node replaced it meanwhile.
    pub(super) fn keep_copy(&self, hot_key: [u64; 2], now: Nanos, rec: SubjectRecord) {
        let slot = std::cell::Cell::new(Some(rec));
        let _ = self.hot.try_with(
            &hot_key,
            now,
            &u64::MAX,
            || Ok::<_, ()>(slot.take().unwrap_or_default()),
            |cached| {
                if let Some(rec) = slot.take() {
                    *cached = rec;
                }
            },
        );
    }
}
