//! How values are laid out on disk: `[format version: u8][expires: u64 LE][payload]`.
//!
//! The expiry sits at a fixed place so the RocksDB compaction filter can drop a
//! dead value without decoding it: a subject's state once it is idle (equal to a
//! fresh one), a dedupe id once its horizon passed. Payloads are bincode (serde),
//! read with the version byte so a newer build can read an older layout.
//!
//! Stored states mirror [`ItemState`] rather than serializing it directly: the
//! in-memory layout is tuned for size and may change; the disk format changes
//! only with [`FORMAT_VERSION`].

use serde::{Deserialize, Serialize};

use crate::limits::ItemState;
use crate::limits::budget::BudgetState;
use crate::limits::rate::RateState;
use crate::limits::window::{ApproxState, CounterState, Debit, LogState};

/// The newest layout this build writes and reads.
pub const FORMAT_VERSION: u8 = 1;

/// Bytes before the payload.
const HEADER: usize = 9;

/// Frames a payload with its version and expiry.
pub fn frame(expires: u64, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER + payload.len());
    v.push(FORMAT_VERSION);
    v.extend_from_slice(&expires.to_le_bytes());
    v.extend_from_slice(payload);
    v
}

/// The (expiry, payload) of a framed value.
pub fn unframe(value: &[u8]) -> Result<(u64, &[u8]), String> {
    if value.len() < HEADER {
        return Err(format!(
            "value of {} bytes is shorter than its header",
            value.len()
        ));
    }
    if value[0] == 0 || value[0] > FORMAT_VERSION {
        return Err(format!(
            "value has format version {}, this build reads 1 to {FORMAT_VERSION}",
            value[0]
        ));
    }
    let mut e = [0u8; 8];
    e.copy_from_slice(&value[1..HEADER]);
    Ok((u64::from_le_bytes(e), &value[HEADER..]))
}

/// The expiry of a framed value, if it has a readable header.
pub fn expiry_of(value: &[u8]) -> Option<u64> {
    unframe(value).ok().map(|(e, _)| e)
}

fn config() -> bincode::config::Configuration {
    bincode::config::standard()
}

/// Encodes `value` with bincode.
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // Encoding plain data into a Vec cannot fail; an empty payload would be
    // caught as corrupt on read rather than panic here.
    bincode::serde::encode_to_vec(value, config()).unwrap_or_default()
}

/// Decodes a bincode payload.
pub fn decode<T: for<'de> Deserialize<'de>>(payload: &[u8]) -> Result<T, String> {
    bincode::serde::decode_from_slice(payload, config())
        .map(|(v, _)| v)
        .map_err(|e| e.to_string())
}

/// One item state as stored. Reservations are memory-only, so what is stored
/// is committed state: no concurrency holds, no pending budget.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum StoredState {
    Fresh,
    Rate { tat_ns: u64, tat_rem: u64 },
    Counter { start: u64, end: u64, used: u64 },
    Log { debits: Vec<(u64, u64)>, sum: u64 },
    Approx { cur_start: u64, prev: u64, cur: u64 },
    Budget { start: u64, end: u64, spent: u64 },
}

impl From<&ItemState> for StoredState {
    fn from(s: &ItemState) -> Self {
        match s {
            ItemState::Fresh | ItemState::Concurrency(_) => StoredState::Fresh,
            ItemState::Rate(r) => StoredState::Rate {
                tat_ns: r.tat_ns,
                tat_rem: r.tat_rem,
            },
            ItemState::Counter(c) => StoredState::Counter {
                start: c.start,
                end: c.end,
                used: c.used,
            },
            ItemState::Log(l) => StoredState::Log {
                debits: l.debits.iter().map(|d| (d.at, d.cost)).collect(),
                sum: l.sum,
            },
            ItemState::Approx(a) => StoredState::Approx {
                cur_start: a.cur_start,
                prev: a.prev,
                cur: a.cur,
            },
            ItemState::Budget(b) => StoredState::Budget {
                start: b.start,
                end: b.end,
                spent: b.spent,
            },
        }
    }
}

impl From<StoredState> for ItemState {
    fn from(s: StoredState) -> Self {
        match s {
            StoredState::Fresh => ItemState::Fresh,
            StoredState::Rate { tat_ns, tat_rem } => ItemState::Rate(RateState { tat_ns, tat_rem }),
            StoredState::Counter { start, end, used } => {
                ItemState::Counter(CounterState { start, end, used })
            }
            StoredState::Log { debits, sum } => ItemState::Log(Box::new(LogState {
                debits: debits
                    .into_iter()
                    .map(|(at, cost)| Debit { at, cost })
                    .collect(),
                sum,
            })),
            StoredState::Approx {
                cur_start,
                prev,
                cur,
            } => ItemState::Approx(ApproxState {
                cur_start,
                prev,
                cur,
            }),
            StoredState::Budget { start, end, spent } => ItemState::Budget(Box::new(BudgetState {
                start,
                end,
                spent,
                // Nothing pending survives; an adaptive plan is made anew.
                ..BudgetState::default()
            })),
        }
    }
}

/// One counter of a subject: which item of which owner (campaign or policy) it
/// belongs to, and its state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredSlot {
    pub owner: u32,
    pub tag: u32,
    pub state: StoredState,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_reject_unknown_versions() {
        let v = frame(42, b"abc");
        assert_eq!(unframe(&v), Ok((42, &b"abc"[..])));
        let mut newer = v.clone();
        newer[0] = FORMAT_VERSION + 1;
        assert!(unframe(&newer).is_err());
        assert!(unframe(&v[..5]).is_err());
    }

    #[test]
    fn states_round_trip() {
        let slots = vec![
            StoredSlot {
                owner: 7,
                tag: 0x1234_5601,
                state: StoredState::Log {
                    debits: vec![(1, 2), (3, 4)],
                    sum: 6,
                },
            },
            StoredSlot {
                owner: 8,
                tag: 2,
                state: StoredState::Budget {
                    start: 1,
                    end: 2,
                    spent: 3,
                },
            },
        ];
        let bytes = encode(&slots);
        assert_eq!(decode::<Vec<StoredSlot>>(&bytes), Ok(slots.clone()));
        let st: ItemState = slots[0].state.clone().into();
        assert_eq!(StoredState::from(&st), slots[0].state);
    }
}
