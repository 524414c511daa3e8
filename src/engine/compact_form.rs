//! A shared record's counters and pending debits as stored in record
//! layout 3 (docs/cluster.md, "Record layout"): each number written as the
//! difference from the same number in the entry before it, pending debits
//! grouped per reservation.
//!
//! Why: a screen of 50 candidates with two user caps each leaves 100
//! counters and 100 pending debits in the user's record, and every node
//! reads and writes them. Laid out one by one (layout 2) each repeated its
//! def_id, its tag (5 bytes), its reservation (9) and whole ns times (9
//! each): a screen wrote 4 743 bytes to Redis, and its replica copied them
//! again (issue 26). Consecutive entries of one screen differ little: the
//! next candidate, the next campaign id, the same tag or the next, the same
//! window start or instant. As differences those are one byte each (bincode
//! writes integers as varints, signed ones zigzagged).
//!
//! Times are differences from the previous time of the *same kind*: a
//! screen alternates a daily window's start and a rolling window's instant,
//! hours apart, but each equals its own kind's previous one.

use serde::{Deserialize, Serialize};

use smallvec::SmallVec;

use crate::limits::rate::RatePending;
use crate::limits::{ItemState, PendingItem};
use crate::store::codec::{StoredCounter, StoredState};

use super::record::Counter;

use super::record::PendingEntry;

/// One reservation's debits in a record.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct PendingGroup {
    res: u64,
    entries: Vec<PendingDelta>,
}

/// A debit as the difference from the debit before it (in any group).
#[derive(Debug, Serialize, Deserialize)]
struct PendingDelta {
    cand: i64,
    def_id: i64,
    tag: TagDelta,
    item: ItemDelta,
    n: u64,
}

/// [`PendingItem`] as stored in layout 3 (new variants go last). A time is
/// the difference from the previous time of the same variant.
#[derive(Debug, Serialize, Deserialize)]
enum ItemDelta {
    /// A rate's TAT is its own; it is written whole.
    Rate {
        n: u64,
        tat_lo: u64,
        tat_hi: u64,
    },
    Counter(i64),
    Log(i64),
    Approx(i64),
    Budget(i64),
    Concurrency(i64),
}

/// A counter's tag (`limits::counter_tag`, or an older build's
/// `record::legacy_tag`): its low byte, and the rest as the difference
/// from the last tag of that low byte. Tags of one item name are alike
/// across campaigns (a name hashes alike everywhere), so a record of many
/// campaigns' `daily` caps codes each tag in 2 bytes (a difference from the
/// previous tag took 9).
#[derive(Debug, Serialize, Deserialize)]
struct TagDelta {
    index: u8,
    fingerprint: i64,
}

/// The last tag of each index, while encoding or decoding a list.
struct Tags([u32; 256]);

impl Default for Tags {
    fn default() -> Self {
        Tags([0; 256])
    }
}

impl Tags {
    fn encode(&mut self, tag: u32) -> TagDelta {
        let index = (tag & 0xff) as u8;
        let last = std::mem::replace(&mut self.0[usize::from(index)], tag);
        TagDelta {
            index,
            fingerprint: i64::from(tag >> 8) - i64::from(last >> 8),
        }
    }

    fn decode(&mut self, d: &TagDelta) -> Result<u32, String> {
        let slot = &mut self.0[usize::from(d.index)];
        let fingerprint = i64::from(*slot >> 8)
            .checked_add(d.fingerprint)
            .filter(|f| (0..1 << 24).contains(f))
            .ok_or("a tag's fingerprint out of range")?;
        *slot = ((fingerprint as u32) << 8) | u32::from(d.index);
        Ok(*slot)
    }
}

/// Previous values while encoding or decoding a list.
#[derive(Default)]
struct Prev {
    cand: u32,
    def_id: u32,
    tags: Tags,
    /// Last time per time-carrying variant: Counter, Log, Approx, Budget,
    /// Concurrency.
    times: [u64; 5],
}

/// `to - from` as a signed difference (two's complement: exact for any
/// pair of `u64`s, decoded by [`undelta`]).
fn delta(from: u64, to: u64) -> i64 {
    to.wrapping_sub(from) as i64
}

fn undelta(from: u64, d: i64) -> u64 {
    from.wrapping_add(d as u64)
}

impl Prev {
    fn item(&mut self, item: &PendingItem) -> ItemDelta {
        let (slot, t) = match *item {
            PendingItem::Rate(r) => {
                return ItemDelta::Rate {
                    n: r.n,
                    tat_lo: r.tat_r as u64,
                    tat_hi: (r.tat_r >> 64) as u64,
                };
            }
            PendingItem::Counter { window_start } => (0, window_start),
            PendingItem::Log { at } => (1, at),
            PendingItem::Approx { bucket } => (2, bucket),
            PendingItem::Budget { period_start } => (3, period_start),
            PendingItem::Concurrency { deadline } => (4, deadline),
        };
        let d = delta(self.times[slot], t);
        self.times[slot] = t;
        match slot {
            0 => ItemDelta::Counter(d),
            1 => ItemDelta::Log(d),
            2 => ItemDelta::Approx(d),
            3 => ItemDelta::Budget(d),
            _ => ItemDelta::Concurrency(d),
        }
    }

    fn unitem(&mut self, item: ItemDelta) -> PendingItem {
        let (slot, d) = match item {
            ItemDelta::Rate { n, tat_lo, tat_hi } => {
                return PendingItem::Rate(RatePending {
                    n,
                    tat_r: (u128::from(tat_hi) << 64) | u128::from(tat_lo),
                });
            }
            ItemDelta::Counter(d) => (0, d),
            ItemDelta::Log(d) => (1, d),
            ItemDelta::Approx(d) => (2, d),
            ItemDelta::Budget(d) => (3, d),
            ItemDelta::Concurrency(d) => (4, d),
        };
        let t = undelta(self.times[slot], d);
        self.times[slot] = t;
        match slot {
            0 => PendingItem::Counter { window_start: t },
            1 => PendingItem::Log { at: t },
            2 => PendingItem::Approx { bucket: t },
            3 => PendingItem::Budget { period_start: t },
            _ => PendingItem::Concurrency { deadline: t },
        }
    }
}

/// `entries` grouped per reservation (consecutive entries of one
/// reservation share a group; a record lists each reservation's together).
pub(crate) fn encode<'a>(entries: impl Iterator<Item = &'a PendingEntry>) -> Vec<PendingGroup> {
    let mut prev = Prev::default();
    let mut groups: Vec<PendingGroup> = Vec::new();
    for e in entries {
        let d = PendingDelta {
            cand: delta(u64::from(prev.cand), u64::from(e.cand)),
            def_id: delta(u64::from(prev.def_id), u64::from(e.def_id)),
            tag: prev.tags.encode(e.tag),
            item: prev.item(&e.item),
            n: e.n,
        };
        (prev.cand, prev.def_id) = (e.cand, e.def_id);
        match groups.last_mut() {
            Some(g) if g.res == e.res => g.entries.push(d),
            _ => groups.push(PendingGroup {
                res: e.res,
                entries: vec![d],
            }),
        }
    }
    groups
}

/// The entries [`encode`] grouped, in their order. An id that does not fit
/// its type (a corrupt or hostile value) is an error, not a wrap.
pub(crate) fn decode(groups: Vec<PendingGroup>) -> Result<Vec<PendingEntry>, String> {
    let mut prev = Prev::default();
    let mut out = Vec::with_capacity(groups.iter().map(|g| g.entries.len()).sum());
    for g in groups {
        for d in g.entries {
            let cand = narrow(prev.cand, d.cand, "pending debit's candidate")?;
            let def_id = narrow(prev.def_id, d.def_id, "pending debit's def_id")?;
            let tag = prev.tags.decode(&d.tag)?;
            (prev.cand, prev.def_id) = (cand, def_id);
            out.push(PendingEntry {
                res: g.res,
                cand,
                def_id,
                tag,
                item: prev.unitem(d.item),
                n: d.n,
            });
        }
    }
    Ok(out)
}

/// A counter as the difference from the counter before it.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct CounterDelta {
    def_id: i64,
    tag: TagDelta,
    state: StateDelta,
}

/// [`StoredState`] in layout 3 (new variants go last): times are
/// differences from the previous counter's of the same variant; a rate's
/// TAT is its own, written whole.
#[derive(Debug, Serialize, Deserialize)]
enum StateDelta {
    Fresh,
    Rate {
        tat_ns: u64,
        tat_rem: u64,
    },
    RateScaled {
        lo: u64,
        hi: u64,
    },
    Counter {
        start: i64,
        end: i64,
        used: u64,
    },
    /// Each debit's time from the debit before it (the previous log's last
    /// for the first). Inline up to 2 (a user's rolling cap holds a few):
    /// no allocation per counter when encoding; encoded as a `Vec` would be.
    Log {
        debits: SmallVec<[(i64, u64); 2]>,
        sum: u64,
    },
    Approx {
        cur_start: i64,
        prev: u64,
        cur: u64,
    },
    Budget {
        start: i64,
        end: i64,
        spent: u64,
    },
}

/// Previous times of counters, per (variant, field).
#[derive(Default)]
struct Times([u64; 6]);

const C_START: usize = 0;
const C_END: usize = 1;
const LOG_AT: usize = 2;
const A_START: usize = 3;
const B_START: usize = 4;
const B_END: usize = 5;

impl Times {
    fn delta(&mut self, slot: usize, t: u64) -> i64 {
        let d = delta(self.0[slot], t);
        self.0[slot] = t;
        d
    }

    fn undelta(&mut self, slot: usize, d: i64) -> u64 {
        let t = undelta(self.0[slot], d);
        self.0[slot] = t;
        t
    }
}

/// `counters` as differences, in their order, as their stored states
/// ([`StoredState`]) would be.
pub(crate) fn encode_counters<'a>(
    counters: impl Iterator<Item = &'a Counter>,
) -> Vec<CounterDelta> {
    let (mut def_id, mut tags, mut t) = (0u32, Tags::default(), Times::default());
    // Sized once (a filter's upper bound is the record's counters): grown
    // from empty, this Vec was 5 % of a node's CPU samples under load.
    let mut out = Vec::with_capacity(counters.size_hint().1.unwrap_or(0));
    out.extend(counters.map(|c| {
        let state = match &c.state {
            // Straight from the log: its stored state would copy it.
            ItemState::Log(l) => StateDelta::Log {
                debits: l
                    .debits
                    .iter()
                    .map(|d| (t.delta(LOG_AT, d.at), d.cost))
                    .collect(),
                sum: l.sum,
            },
            other => stored_delta(StoredState::from(other), &mut t),
        };
        let d = CounterDelta {
            def_id: delta(u64::from(def_id), u64::from(c.def_id)),
            tag: tags.encode(c.tag),
            state,
        };
        def_id = c.def_id;
        d
    }));
    out
}

/// A stored state as differences from `t`'s times.
fn stored_delta(state: StoredState, t: &mut Times) -> StateDelta {
    match state {
        StoredState::Fresh => StateDelta::Fresh,
        StoredState::Rate { tat_ns, tat_rem } => StateDelta::Rate { tat_ns, tat_rem },
        StoredState::RateScaled { lo, hi } => StateDelta::RateScaled { lo, hi },
        StoredState::Counter { start, end, used } => StateDelta::Counter {
            start: t.delta(C_START, start),
            end: t.delta(C_END, end),
            used,
        },
        StoredState::Log { debits, sum } => StateDelta::Log {
            debits: debits
                .into_iter()
                .map(|(at, cost)| (t.delta(LOG_AT, at), cost))
                .collect(),
            sum,
        },
        StoredState::Approx {
            cur_start,
            prev,
            cur,
        } => StateDelta::Approx {
            cur_start: t.delta(A_START, cur_start),
            prev,
            cur,
        },
        StoredState::Budget { start, end, spent } => StateDelta::Budget {
            start: t.delta(B_START, start),
            end: t.delta(B_END, end),
            spent,
        },
    }
}

/// The counters [`encode_counters`] wrote, in their order.
pub(crate) fn decode_counters(list: Vec<CounterDelta>) -> Result<Vec<StoredCounter>, String> {
    let (mut def_id, mut tags, mut t) = (0u32, Tags::default(), Times::default());
    list.into_iter()
        .map(|d| {
            def_id = narrow(def_id, d.def_id, "counter's def_id")?;
            let tag = tags.decode(&d.tag)?;
            let state = match d.state {
                StateDelta::Fresh => StoredState::Fresh,
                StateDelta::Rate { tat_ns, tat_rem } => StoredState::Rate { tat_ns, tat_rem },
                StateDelta::RateScaled { lo, hi } => StoredState::RateScaled { lo, hi },
                StateDelta::Counter { start, end, used } => StoredState::Counter {
                    start: t.undelta(C_START, start),
                    end: t.undelta(C_END, end),
                    used,
                },
                StateDelta::Log { debits, sum } => StoredState::Log {
                    debits: debits
                        .into_iter()
                        .map(|(d, cost)| (t.undelta(LOG_AT, d), cost))
                        .collect(),
                    sum,
                },
                StateDelta::Approx {
                    cur_start,
                    prev,
                    cur,
                } => StoredState::Approx {
                    cur_start: t.undelta(A_START, cur_start),
                    prev,
                    cur,
                },
                StateDelta::Budget { start, end, spent } => StoredState::Budget {
                    start: t.undelta(B_START, start),
                    end: t.undelta(B_END, end),
                    spent,
                },
            };
            Ok(StoredCounter { def_id, tag, state })
        })
        .collect()
}

/// `from + d` as a `u32` id: one that does not fit (a corrupt or hostile
/// value) is an error, not a wrap into another id.
fn narrow(from: u32, d: i64, what: &str) -> Result<u32, String> {
    u32::try_from(undelta(u64::from(from), d)).map_err(|_| format!("{what} out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::codec;
    use proptest::prelude::*;

    fn item() -> impl Strategy<Value = PendingItem> {
        prop_oneof![
            (any::<u64>(), any::<u128>())
                .prop_map(|(n, tat_r)| PendingItem::Rate(RatePending { n, tat_r })),
            any::<u64>().prop_map(|t| PendingItem::Counter { window_start: t }),
            any::<u64>().prop_map(|t| PendingItem::Log { at: t }),
            any::<u64>().prop_map(|t| PendingItem::Approx { bucket: t }),
            any::<u64>().prop_map(|t| PendingItem::Budget { period_start: t }),
            any::<u64>().prop_map(|t| PendingItem::Concurrency { deadline: t }),
        ]
    }

    fn entry() -> impl Strategy<Value = PendingEntry> {
        (
            0u64..4,
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
            item(),
            any::<u64>(),
        )
            .prop_map(|(res, cand, def_id, tag, item, n)| PendingEntry {
                res,
                cand,
                def_id,
                tag,
                item,
                n,
            })
    }

    fn state() -> impl Strategy<Value = StoredState> {
        prop_oneof![
            Just(StoredState::Fresh),
            (any::<u64>(), any::<u64>())
                .prop_map(|(tat_ns, tat_rem)| StoredState::Rate { tat_ns, tat_rem }),
            (any::<u64>(), any::<u64>()).prop_map(|(lo, hi)| StoredState::RateScaled { lo, hi }),
            (any::<u64>(), any::<u64>(), any::<u64>())
                .prop_map(|(start, end, used)| StoredState::Counter { start, end, used }),
            (
                prop::collection::vec((any::<u64>(), any::<u64>()), 0..5),
                any::<u64>()
            )
                .prop_map(|(debits, sum)| StoredState::Log { debits, sum }),
            (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(cur_start, prev, cur)| {
                StoredState::Approx {
                    cur_start,
                    prev,
                    cur,
                }
            }),
            (any::<u64>(), any::<u64>(), any::<u64>())
                .prop_map(|(start, end, spent)| StoredState::Budget { start, end, spent }),
        ]
    }

    proptest! {
        /// Any list of counters, every variant and extreme values included,
        /// comes back as it was through bincode.
        #[test]
        fn counters_round_trip(list in prop::collection::vec(
            (any::<u32>(), any::<u32>(), state()).prop_map(|(def_id, tag, state)| Counter {
                def_id,
                tag,
                state: state.into(),
            }),
            0..30,
        )) {
            let bytes = codec::encode(&encode_counters(list.iter()));
            let back: Vec<CounterDelta> = codec::decode(&bytes).expect("decodes");
            let stored: Vec<StoredCounter> = list
                .iter()
                .map(|c| StoredCounter {
                    def_id: c.def_id,
                    tag: c.tag,
                    state: StoredState::from(&c.state),
                })
                .collect();
            prop_assert_eq!(decode_counters(back).expect("in range"), stored);
        }

        /// Any list of debits, extreme values included, comes back as it
        /// was, in its order, through bincode.
        #[test]
        fn round_trips(entries in prop::collection::vec(entry(), 0..40)) {
            let bytes = codec::encode(&encode(entries.iter()));
            let groups: Vec<PendingGroup> = codec::decode(&bytes).expect("decodes");
            prop_assert_eq!(decode(groups).expect("in range"), entries);
        }
    }

    /// A screen's debits (50 candidates, a daily window and a rolling one
    /// each) take ~7 bytes apiece, where layout 2 took ~28.
    #[test]
    fn a_screens_debits_are_small() {
        let (day, now) = (1_795_000_000_000_000_000u64, 1_795_040_000_123_456_789u64);
        let entries: Vec<PendingEntry> = (0..50u32)
            .flat_map(|c| {
                [
                    PendingItem::Counter { window_start: day },
                    PendingItem::Log { at: now },
                ]
                .into_iter()
                .enumerate()
                .map(move |(i, item)| PendingEntry {
                    res: 0x9e37_79b9_7f4a_7c15,
                    cand: c,
                    def_id: 1000 + c,
                    tag: (0x00ab_cdef << 8) | i as u32,
                    item,
                    n: 1,
                })
            })
            .collect();
        let bytes = codec::encode(&encode(entries.iter())).len();
        eprintln!("{bytes} bytes for a screen's 100 debits");
        assert!(bytes <= 100 * 8, "{bytes} bytes for 100 debits");
    }

    /// A hostile value cannot make an id wrap into another.
    #[test]
    fn an_out_of_range_id_is_an_error() {
        let groups = vec![PendingGroup {
            res: 1,
            entries: vec![PendingDelta {
                cand: 1 << 40,
                def_id: 0,
                tag: TagDelta {
                    index: 0,
                    fingerprint: 0,
                },
                item: ItemDelta::Log(0),
                n: 1,
            }],
        }];
        assert!(decode(groups).is_err());
    }
}
