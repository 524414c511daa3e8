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
//!
//! Versions:
//! - 1: a rate state is `StoredState::Rate { tat_ns, tat_rem }`, the TAT as
//!   whole ns plus a remainder in 1/q ns; a TAT past 2^64 ns (the year 2554)
//!   was clipped there.
//! - 2: a rate state may also be `StoredState::RateScaled { lo, hi }`, the
//!   TAT·q as a 128-bit integer, exact however far ahead (rates with a large
//!   burst·T); the variant is new, every other one is laid out as in 1, so a
//!   value of version 1 decodes as it always did.
//! - 3: only a shared store's records (docs/cluster.md, "Record layout"):
//!   their pending debits grouped per reservation and delta-coded
//!   (`engine::pending_form`). Data directories stay at 2, so a node's
//!   RocksDB values are read by builds that know 2.

use serde::{Deserialize, Serialize};

use crate::limits::ItemState;
use crate::limits::budget::BudgetState;
use crate::limits::rate::{RateForm, RateState};
use crate::limits::window::{ApproxState, CounterState, Debit, LogState};

/// The newest layout this build writes and reads (it reads every older one).
pub const FORMAT_VERSION: u8 = 2;

/// The newest layout of a shared store's records this build writes and
/// reads (every older one too).
pub const SHARED_FORMAT_VERSION: u8 = 3;

/// Bytes before the payload.
const HEADER: usize = 9;

/// Frames a payload with its version and expiry.
pub fn frame(expires: u64, payload: &[u8]) -> Vec<u8> {
    frame_as(FORMAT_VERSION, expires, payload)
}

/// Frames a payload laid out as `version` with its expiry.
pub fn frame_as(version: u8, expires: u64, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER + payload.len());
    v.push(version);
    v.extend_from_slice(&expires.to_le_bytes());
    v.extend_from_slice(payload);
    v
}

/// The (expiry, payload) of a framed value.
pub fn unframe(value: &[u8]) -> Result<(u64, &[u8]), String> {
    unframe_versioned(value).map(|(_, e, p)| (e, p))
}

/// The (format version, expiry, payload) of a framed value.
pub fn unframe_versioned(value: &[u8]) -> Result<(u8, u64, &[u8]), String> {
    if value.len() < HEADER {
        return Err(format!(
            "value of {} bytes is shorter than its header",
            value.len()
        ));
    }
    if value[0] == 0 || value[0] > SHARED_FORMAT_VERSION {
        return Err(format!(
            "value has format version {}, this build reads 1 to {SHARED_FORMAT_VERSION}",
            value[0]
        ));
    }
    let mut e = [0u8; 8];
    e.copy_from_slice(&value[1..HEADER]);
    Ok((value[0], u64::from_le_bytes(e), &value[HEADER..]))
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

/// Encodes `value` with bincode into a buffer of `capacity` bytes first
/// (an estimate of its size): a record's payload grown from empty was
/// reallocated about ten times per encode, twice a decision.
pub fn encode_sized<T: Serialize>(value: &T, capacity: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(capacity);
    // As `encode`: writing plain data into a Vec cannot fail.
    if bincode::serde::encode_into_std_write(value, &mut out, config()).is_err() {
        out.clear();
    }
    out
}

/// Decodes a bincode payload.
pub fn decode<T: for<'de> Deserialize<'de>>(payload: &[u8]) -> Result<T, String> {
    bincode::serde::decode_from_slice(payload, config())
        .map(|(v, _)| v)
        .map_err(|e| e.to_string())
}

/// Decodes a bincode payload at the start of `payload`, and how many bytes
/// it took (what follows is a later addition older builds leave alone).
pub fn decode_prefix<T: for<'de> Deserialize<'de>>(payload: &[u8]) -> Result<(T, usize), String> {
    bincode::serde::decode_from_slice(payload, config()).map_err(|e| e.to_string())
}

/// One item state as stored. Reservations are memory-only, so what is stored
/// is committed state: no concurrency holds, no pending budget.
///
/// bincode writes a variant as its index: new variants go last, and none is
/// ever removed or reordered, so older values keep decoding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum StoredState {
    Fresh,
    /// A TAT as whole ns plus a remainder in 1/q ns (every rate state of
    /// version 1; in version 2, one read from version 1 and not changed since).
    Rate {
        tat_ns: u64,
        tat_rem: u64,
    },
    Counter {
        start: u64,
        end: u64,
        used: u64,
    },
    Log {
        debits: Vec<(u64, u64)>,
        sum: u64,
    },
    Approx {
        cur_start: u64,
        prev: u64,
        cur: u64,
    },
    Budget {
        start: u64,
        end: u64,
        spent: u64,
    },
    /// Version 2: a TAT·q, exact, as its low and high 64 bits.
    RateScaled {
        lo: u64,
        hi: u64,
    },
}

impl From<&ItemState> for StoredState {
    fn from(s: &ItemState) -> Self {
        match s {
            // Slots are open reservations, memory-only; an adaptive item's
            // learned limit is too: a restarted node starts its keys at
            // `initial` (docs/adaptive.md, "In the engine").
            ItemState::Fresh | ItemState::Concurrency(_) | ItemState::Adaptive(_) => {
                StoredState::Fresh
            }
            ItemState::Rate(r) => match r.form() {
                RateForm::Scaled(tat) => StoredState::RateScaled {
                    lo: tat as u64,
                    hi: (tat >> 64) as u64,
                },
                RateForm::WholeNs { ns, rem } => StoredState::Rate {
                    tat_ns: ns,
                    tat_rem: rem,
                },
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
            StoredState::Rate { tat_ns, tat_rem } => {
                ItemState::Rate(RateState::from_whole_ns(tat_ns, tat_rem))
            }
            StoredState::RateScaled { lo, hi } => ItemState::Rate(RateState::from_scaled(
                (u128::from(hi) << 64) | u128::from(lo),
            )),
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

/// One counter of a subject: which item of which definition (`def_id`, a campaign or policy) it
/// belongs to, and its state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredCounter {
    pub def_id: u32,
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
        newer[0] = SHARED_FORMAT_VERSION + 1;
        assert!(unframe(&newer).is_err());
        assert!(unframe(&v[..5]).is_err());
    }

    /// A value written by a build of format version 1, byte by byte: it reads
    /// back as the same TAT, remainder included.
    #[test]
    fn decodes_a_value_of_format_version_1() {
        use crate::limits::rate::Rate;
        let v1: Vec<u8> = [
            // Version 1, expiry 1_767_225_660_000_000_000 (u64 LE).
            &[1u8, 0, 88, 65, 230, 95, 114, 134, 24][..],
            // bincode (standard: varints, little endian): a Vec of 2 counters.
            &[2],
            // Counter 1: def_id 7, tag 0x1201 (251 = a u16 follows), variant 1
            // (Rate), tat_ns 1_767_225_601_000_000_000 (253 = a u64 follows),
            // tat_rem 1.
            &[7, 251, 0x01, 0x12, 1],
            &[253, 0, 202, 148, 41, 82, 114, 134, 24],
            &[1],
            // Counter 2: def_id 8, tag 2, variant 2 (Counter) {1, 2, 3}.
            &[8, 2, 2, 1, 2, 3],
        ]
        .concat();
        let (expires, payload) = unframe(&v1).unwrap();
        assert_eq!(expires, 1_767_225_660_000_000_000);
        let counters: Vec<StoredCounter> = decode(payload).unwrap();
        let tat_ns = 1_767_225_601_000_000_000;
        assert_eq!(
            counters,
            [
                StoredCounter {
                    def_id: 7,
                    tag: 0x1201,
                    state: StoredState::Rate { tat_ns, tat_rem: 1 },
                },
                StoredCounter {
                    def_id: 8,
                    tag: 2,
                    state: StoredState::Counter {
                        start: 1,
                        end: 2,
                        used: 3
                    },
                },
            ]
        );
        // 3 per second (T = 1/3 s, burst 3·T = 1 s): the TAT is 1 s + ⅓ ns
        // after `now`, so nothing remains and the reset is ⌈1 s + ⅓ ns⌉.
        let rate = Rate::new(3, 1_000_000_000, 3);
        let ItemState::Rate(st) = ItemState::from(counters[0].state.clone()) else {
            panic!("a rate state");
        };
        let now = tat_ns - 1_000_000_000;
        assert_eq!(rate.figures(&st, now), (0, 1_000_000_001));
        // Written back unchanged, it keeps the version 1 form.
        assert_eq!(StoredState::from(&ItemState::Rate(st)), counters[0].state);
    }

    /// Version 2 keeps a TAT far past 2^64 ns exactly.
    #[test]
    fn a_scaled_tat_round_trips() {
        use crate::limits::rate::MAX_TAT;
        for tat in [0, 1, u128::from(u64::MAX) + 1, (1 << 117) + 12_345, MAX_TAT] {
            let st = ItemState::Rate(RateState::from_scaled(tat));
            let stored = StoredState::from(&st);
            assert_eq!(
                stored,
                StoredState::RateScaled {
                    lo: tat as u64,
                    hi: (tat >> 64) as u64
                }
            );
            let bytes = encode(&vec![StoredCounter {
                def_id: 1,
                tag: 1,
                state: stored.clone(),
            }]);
            let back: Vec<StoredCounter> = decode(&bytes).unwrap();
            assert_eq!(ItemState::from(back[0].state.clone()), st);
        }
        assert_eq!(frame(0, b"")[0], 2);
    }

    #[test]
    fn states_round_trip() {
        let counters = vec![
            StoredCounter {
                def_id: 7,
                tag: 0x1234_5601,
                state: StoredState::Log {
                    debits: vec![(1, 2), (3, 4)],
                    sum: 6,
                },
            },
            StoredCounter {
                def_id: 8,
                tag: 2,
                state: StoredState::Budget {
                    start: 1,
                    end: 2,
                    spent: 3,
                },
            },
        ];
        let bytes = encode(&counters);
        assert_eq!(decode::<Vec<StoredCounter>>(&bytes), Ok(counters.clone()));
        let st: ItemState = counters[0].state.clone().into();
        assert_eq!(StoredState::from(&st), counters[0].state);
    }
}
