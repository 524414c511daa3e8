//! Counter tags of records written before counters belonged to their item
//! (docs/semantics.md §5.3): a counter was tagged by its item's index and a
//! fingerprint of its definition as written ([`super::record::legacy_tag`]);
//! it is now tagged by its item's name and state class
//! ([`crate::limits::counter_tag`]). Opening a data directory without the marker
//! [`TAGS_KEY`] rewrites every stored record once, before anything is
//! decided, so counts of the definitions in force carry over the upgrade.
//!
//! What cannot be mapped: counters of inline limits (a check's `limits`,
//! Envoy rules, `CL.THROTTLE`), whose definitions live in requests and
//! configuration rather than in the store, keep their old tags and so
//! start empty once; counters of a definition's earlier versions were
//! already read as empty and are dropped.

use std::collections::HashMap;

use crate::store::codec::{self, StoredCounter};
use crate::store::{Op, Space, Store, StoreError};

use super::definitions::legacy_campaign_tags;
use super::registry::{Registry, legacy_stack_tags};

/// Marker in the definitions space: present once the store's records carry
/// name tags (written at the end of a migration, or at once in a new store).
pub(crate) const TAGS_KEY: &[u8] = b"m/tags";

/// Records rewritten per store batch: bounds the batch's memory (a record
/// is ~100 bytes on disk), not its atomicity (a migration cut short is
/// done again, records already rewritten keep their new tags: a new tag is
/// never some definition's old one but by a 2^-32 chance).
const BATCH: usize = 10_000;

/// Whether the store's records were written with name tags (or there are
/// none yet).
pub(crate) fn has_name_tags(store: &dyn Store) -> Result<bool, StoreError> {
    Ok(store.get(Space::Definitions, TAGS_KEY)?.is_some())
}

/// The marker's write.
pub(crate) fn marker_op() -> Op {
    Op::Put(
        Space::Definitions,
        TAGS_KEY.to_vec(),
        codec::frame(0, b"name"),
    )
}

/// Rewrites the tags of every stored record of a store without the marker,
/// for the definitions of `reg`, then sets the marker. Returns how many
/// records were rewritten.
pub(crate) fn migrate_tags(store: &dyn Store, reg: &Registry) -> Result<usize, StoreError> {
    let mut map: HashMap<(u32, u32), u32> = HashMap::new();
    for p in reg.policies.values() {
        for (old, new) in legacy_stack_tags(&p.def.limits).into_iter().zip(&p.tags) {
            map.insert((p.id, old), *new);
        }
    }
    for c in reg.campaigns.values() {
        for (old, new) in legacy_campaign_tags(&c.compiled).into_iter().zip(&c.tags) {
            map.insert((c.id, old), *new);
        }
    }
    let mut ops = Vec::new();
    let mut rewritten = 0;
    for (key, value) in store.scan(Space::State)? {
        if !is_record_key(&key) {
            continue;
        }
        let Some(v) = retagged(&value, &map)? else {
            continue;
        };
        ops.push(Op::Put(Space::State, key, v));
        rewritten += 1;
        if ops.len() >= BATCH {
            super::persist::write_durably(store, std::mem::take(&mut ops))?;
        }
    }
    ops.push(marker_op());
    super::persist::write_durably(store, ops)?;
    Ok(rewritten)
}

/// Whether a state key is a subject record's (`super::hot::RecordKey`):
/// a user's or identity's (`u` + 16 bytes), a policy key's (`k` + 16) or a
/// campaign's (`c` + 4). Timelines and the rest are not.
fn is_record_key(key: &[u8]) -> bool {
    matches!(
        (key.first(), key.len()),
        (Some(b'u' | b'k'), 17) | (Some(b'c'), 5)
    )
}

/// A stored record with its counters' tags mapped by `map` (by def_id and
/// old tag); counters of inline limits (def_id 0) kept as they are, those
/// of a definition no longer in force dropped. `None`: nothing to change.
fn retagged(value: &[u8], map: &HashMap<(u32, u32), u32>) -> Result<Option<Vec<u8>>, StoreError> {
    let bad = |m: String| StoreError::Io(format!("a record could not be migrated: {m}"));
    let (idle, payload) = codec::unframe(value).map_err(bad)?;
    let counters: Vec<StoredCounter> = codec::decode(payload).map_err(bad)?;
    let before = counters.len();
    let mut changed = false;
    let out: Vec<StoredCounter> = counters
        .into_iter()
        .filter_map(|mut c| {
            if c.def_id == 0 {
                return Some(c);
            }
            let new = map.get(&(c.def_id, c.tag))?;
            changed |= *new != c.tag;
            c.tag = *new;
            Some(c)
        })
        .collect();
    if !changed && out.len() == before {
        return Ok(None);
    }
    Ok(Some(codec::frame(idle, &codec::encode(&out))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::codec::StoredState;

    fn record(counters: Vec<(u32, u32, u64)>) -> Vec<u8> {
        let stored: Vec<StoredCounter> = counters
            .into_iter()
            .map(|(def_id, tag, start)| StoredCounter {
                def_id,
                tag,
                state: StoredState::Counter {
                    start,
                    end: start + 10,
                    used: 3,
                },
            })
            .collect();
        codec::frame(77, &codec::encode(&stored))
    }

    #[test]
    fn maps_current_items_keeps_inline_and_drops_older_definitions() {
        let map = HashMap::from([((5, 0x100), 0xabcd), ((5, 0x201), 0x1234)]);
        let v = record(vec![
            (5, 0x100, 1),
            (0, 0x300, 2),
            (5, 0x999, 3),
            (5, 0x201, 4),
        ]);
        let out = retagged(&v, &map).expect("decodes").expect("changed");
        let (idle, payload) = codec::unframe(&out).expect("framed");
        assert_eq!(idle, 77, "the expiry is kept");
        let got: Vec<StoredCounter> = codec::decode(payload).expect("decodes");
        let tags: Vec<(u32, u32)> = got.iter().map(|c| (c.def_id, c.tag)).collect();
        assert_eq!(tags, vec![(5, 0xabcd), (0, 0x300), (5, 0x1234)]);
        // Only inline counters: nothing to write.
        assert!(
            retagged(&record(vec![(0, 1, 1)]), &map)
                .expect("decodes")
                .is_none()
        );
    }

    #[test]
    fn only_record_keys_are_migrated() {
        assert!(is_record_key(&[b'u'; 17]));
        assert!(is_record_key(&[b'k'; 17]));
        assert!(is_record_key(b"c\0\0\0\x01"));
        assert!(!is_record_key(b"t\0\0\0\x01"));
        assert!(!is_record_key(b"c\0\0\0\x01\x02"));
    }
}
