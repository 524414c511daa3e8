//! Erasing a viewer (the GDPR's right to erasure; docs/semantics.md §7.6):
//! `DELETE /v1/users/{user}` and `DELETE /v1/ids/{kind}/{id}` remove the
//! record of that identity — every cap counted for it, the debits of its
//! open reservations, the reservation and event ids remembered in it on a
//! shared store. Campaign delivery stays as it was: it is not personal
//! data, and a reservation of the viewer committed later still spends the
//! campaign's budget while counting nothing for the viewer, whose record is
//! gone.

use std::sync::atomic::Ordering;

use crate::clock::Clock;
use crate::model::identity::Kind;

use super::hot::{Reads, RecordKey, waited};
use super::{Engine, EngineError, invalid};

impl<C: Clock> Engine<C> {
    /// Erases user `user` ([`Engine::erase`] of kind `user`).
    pub fn erase_user(&self, user: &str) -> Result<(), EngineError> {
        self.erase("user", user)
    }

    /// Erases identity `id` of `kind` (`user`, `household`, `device`, ...):
    /// its record is emptied, and on a node's own store deleted, durably,
    /// before this returns. Erasing one that has no record is the same
    /// success. Errors name `kind` or `id`.
    pub fn erase(&self, kind: &str, id: &str) -> Result<(), EngineError> {
        let k = Kind::parse(kind).map_err(|e| invalid("kind", e))?;
        self.check_id("id", id)?;
        let record = RecordKey::User(self.identity_key(k, id));
        let now = self.now();
        let receipt = self.with_record(record, now, Reads::MayWait, |rec, now| {
            rec.counters = Box::default();
            rec.pending = None;
            rec.idle_at = 0;
            self.erase_record(record, rec, now)
        });
        if let Some(r) = waited(receipt)? {
            r.wait()?;
        }
        self.stats.erasures.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}
