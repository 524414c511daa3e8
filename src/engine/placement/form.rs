//! The stored form of a record in a shared store (docs/cluster.md,
//! "Record layout"): how a record is encoded for shared mode (state,
//! pending debits and holds) and for owner mode (committed state and
//! settled ids only), and decoded. Pure: no I/O.

use crate::clock::Nanos;
use crate::engine::chain::Defs;
use crate::engine::compact_form::{self, CounterDelta, PendingGroup};
use crate::engine::holds::{Held, HeldKind, RememberedId};
use crate::engine::record::{Counter, PendingEntry, SubjectRecord};
use crate::engine::registry::Registry;
use crate::limits::adaptive::{AdaptiveState, Controller};
use crate::limits::concurrency::ConcurrencyState;
use crate::limits::rate::RatePending;
use crate::limits::{ItemState, PendingItem};
use crate::store::codec::{self, StoredCounter, StoredState};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

/// A record as the shared store holds it: the state as it is in memory,
/// pending debits included (they are the cluster's, not one node's). Its
/// counters and pending debits are [`StoredCounter`]s and [`StoredPending`]s
/// in layout 2, delta-coded ([`CounterDelta`]s, [`PendingGroup`]s) in layout
/// 3 (codec's versions); the rest is laid out alike.
///
/// Holds and settled ids are borrowed from the record when it is written (a
/// slice encodes as a `Vec` does) and owned when it is read: no copy of
/// them per encode, twice a decision.
#[derive(Serialize, Deserialize)]
pub(super) struct SharedForm<'a, C, P> {
    /// The latest decision time written here: a node behind it decides on
    /// this record at this time instead (a record never goes back in time),
    /// up to [`MAX_RECORD_AHEAD`] past its own.
    last: Nanos,
    counters: Vec<C>,
    pending: Vec<P>,
    held: Cow<'a, [Held]>,
    remembered: Cow<'a, [RememberedId]>,
    /// What a stored counter leaves out and a shared record must keep.
    extra: Vec<ExtraState>,
}

impl<'a, C, P> SharedForm<'a, C, P> {
    /// The same form with its counters and pending debits mapped.
    fn map_lists<C2, P2>(
        self,
        counters: impl FnOnce(Vec<C>) -> Result<Vec<C2>, String>,
        pending: impl FnOnce(Vec<P>) -> Result<Vec<P2>, String>,
    ) -> Result<SharedForm<'a, C2, P2>, String> {
        Ok(SharedForm {
            last: self.last,
            counters: counters(self.counters)?,
            pending: pending(self.pending)?,
            held: self.held,
            remembered: self.remembered,
            extra: self.extra,
        })
    }
}

/// State beyond a stored counter's (which keeps committed state only): a
/// budget's pending spend and adaptive plan, a concurrency item's holds.
#[derive(Serialize, Deserialize)]
pub(super) struct ExtraState {
    def_id: u32,
    tag: u32,
    extra: StoredExtra,
}

#[derive(Serialize, Deserialize)]
pub(super) enum StoredExtra {
    Budget {
        pending: u64,
        anchor: u64,
        base: u64,
    },
    Concurrency {
        deadlines: Vec<u64>,
    },
    /// An adaptive item's slots and controller: one per key for the whole
    /// fleet (docs/adaptive.md, "On a cluster").
    Adaptive {
        deadlines: Vec<u64>,
        ctl: Option<StoredController>,
    },
}

/// [`Controller`] as stored (its limit as the f64's bits).
#[derive(Serialize, Deserialize)]
pub(super) struct StoredController {
    limit: u64,
    win_start: u64,
    win_n: u32,
    win_dropped: u32,
    win_sum: u64,
    win_inflight: u64,
    base: u64,
    spare: u64,
    base_start: u64,
}

impl From<&Controller> for StoredController {
    fn from(c: &Controller) -> Self {
        StoredController {
            limit: c.limit.to_bits(),
            win_start: c.win_start,
            win_n: c.win_n,
            win_dropped: c.win_dropped,
            win_sum: c.win_sum,
            win_inflight: c.win_inflight,
            base: c.base,
            spare: c.spare,
            base_start: c.base_start,
        }
    }
}

impl StoredController {
    /// The controller, if its limit is a number (a record is checked, not
    /// trusted: one that is not reads as a key's first reservation).
    fn controller(&self) -> Option<Controller> {
        let limit = f64::from_bits(self.limit);
        limit.is_finite().then_some(Controller {
            limit,
            win_start: self.win_start,
            win_n: self.win_n,
            win_dropped: self.win_dropped,
            win_sum: self.win_sum,
            win_inflight: self.win_inflight,
            base: self.base,
            spare: self.spare,
            base_start: self.base_start,
        })
    }
}

/// A pending debit as layout 2 stores it (~28 bytes; layout 3 takes ~7:
/// 737 bytes for a screen's 100 in compact_form's test).
#[derive(Serialize, Deserialize)]
pub(super) struct StoredPending {
    res: u64,
    cand: u32,
    def_id: u32,
    tag: u32,
    item: StoredPendingItem,
    n: u64,
}

/// [`PendingItem`] as stored (new variants go last).
#[derive(Serialize, Deserialize)]
pub(super) enum StoredPendingItem {
    Rate { n: u64, tat_lo: u64, tat_hi: u64 },
    Counter { window_start: u64 },
    Log { at: u64 },
    Approx { bucket: u64 },
    Budget { period_start: u64 },
    Concurrency { deadline: u64 },
}

impl From<&PendingItem> for StoredPendingItem {
    fn from(p: &PendingItem) -> Self {
        match *p {
            PendingItem::Rate(r) => StoredPendingItem::Rate {
                n: r.n,
                tat_lo: r.tat_r as u64,
                tat_hi: (r.tat_r >> 64) as u64,
            },
            PendingItem::Counter { window_start } => StoredPendingItem::Counter { window_start },
            PendingItem::Log { at } => StoredPendingItem::Log { at },
            PendingItem::Approx { bucket } => StoredPendingItem::Approx { bucket },
            PendingItem::Budget { period_start } => StoredPendingItem::Budget { period_start },
            PendingItem::Concurrency { deadline } => StoredPendingItem::Concurrency { deadline },
        }
    }
}

impl From<StoredPendingItem> for PendingItem {
    fn from(p: StoredPendingItem) -> Self {
        match p {
            StoredPendingItem::Rate { n, tat_lo, tat_hi } => PendingItem::Rate(RatePending {
                n,
                tat_r: (u128::from(tat_hi) << 64) | u128::from(tat_lo),
            }),
            StoredPendingItem::Counter { window_start } => PendingItem::Counter { window_start },
            StoredPendingItem::Log { at } => PendingItem::Log { at },
            StoredPendingItem::Approx { bucket } => PendingItem::Approx { bucket },
            StoredPendingItem::Budget { period_start } => PendingItem::Budget { period_start },
            StoredPendingItem::Concurrency { deadline } => PendingItem::Concurrency { deadline },
        }
    }
}

/// A payload of [`payload`] without its first field, decision time `last`.
pub(super) fn without_last(payload: &[u8], last: Nanos) -> &[u8] {
    payload
        .get(codec::encode(&last).len()..)
        .unwrap_or_default()
}

/// The payload of `rec` as stored in `layout` (2 or 3), with decision time
/// `last`.
pub(super) fn payload(rec: &SubjectRecord, last: Nanos, layout: u8) -> Vec<u8> {
    let mut out = if layout >= 3 {
        let counters = compact_form::encode_counters(kept_counters(rec));
        // ~8 bytes a counter and a pending debit (compact_form), ~3 a held
        // screen's candidate, a few dozen for the rest.
        let held: usize = rec.shared_meta().map_or(0, |m| {
            m.held
                .iter()
                .map(|h| match &h.kind {
                    HeldKind::Screen { candidates } => 16 + 3 * candidates.len(),
                    HeldKind::Check { .. } => 24,
                })
                .sum::<usize>()
                + 32 * m.remembered.len()
        });
        let estimate = 64 + 8 * (counters.len() + rec.pending().count()) + held;
        let form = form(rec, last, counters, compact_form::encode(rec.pending()));
        codec::encode_sized(&form, estimate)
    } else {
        let pending = rec
            .pending()
            .map(|p| StoredPending {
                res: p.res,
                cand: p.cand,
                def_id: p.def_id,
                tag: p.tag,
                item: (&p.item).into(),
                n: p.n,
            })
            .collect();
        codec::encode(&form(rec, last, stored_counters(rec).collect(), pending))
    };
    let held = rec.shared_meta().map_or(&[][..], |m| &m.held[..]);
    // Appended, not a field of the form: see [`Held::body`].
    let bodies: Vec<(u64, u64)> = held
        .iter()
        .filter(|h| h.body != 0)
        .map(|h| (h.res, h.body))
        .collect();
    let inline: Vec<(u64, &[u8])> = held
        .iter()
        .filter_map(|h| Some((h.res, &**h.inline.as_ref()?)))
        .collect();
    let ids: Vec<(u64, &[u128])> = held
        .iter()
        .filter(|h| !h.ids.is_empty())
        .map(|h| (h.res, &h.ids[..]))
        .collect();
    let moved = moved_spend(rec);
    let more = !moved.0.is_empty() || !moved.1.is_empty();
    if !bodies.is_empty() || !inline.is_empty() || !ids.is_empty() || more {
        out.extend_from_slice(&codec::encode(&bodies));
    }
    // After the bodies, likewise (see [`Held::inline`]).
    if !inline.is_empty() || !ids.is_empty() || more {
        out.extend_from_slice(&codec::encode(&inline));
    }
    // After the inline limits (see [`Held::ids`]).
    if !ids.is_empty() || more {
        out.extend_from_slice(&codec::encode(&ids));
    }
    // After the ids (see [`Held::costs`], [`RememberedId::charged`]).
    if more {
        out.extend_from_slice(&codec::encode(&moved));
    }
    out
}

/// A record as owner mode stores it: its committed state (every pending
/// debit released, as [`SubjectRecord::to_stored`] does for one node's
/// disk) and the ids of its commits. Open reservations (holds, pending
/// debits, concurrency slots) stay in the owner's memory, as on one node,
/// so a screen writes nothing and a commit writes ~100 bytes (issue 26).
pub(super) fn owned_payload(
    rec: &SubjectRecord,
    last: Nanos,
    at: Nanos,
    reg: &Registry,
) -> Vec<u8> {
    let committed =
        rec.committed_counters(at, &|def_id, tag| Defs::Registry(reg).item(def_id, tag));
    let kept = committed.iter().filter(|c| {
        !c.state.is_empty()
            && !matches!(
                c.state,
                ItemState::Fresh | ItemState::Concurrency(_) | ItemState::Adaptive(_)
            )
    });
    let counters = compact_form::encode_counters(kept);
    let meta = rec.shared_meta();
    let settled = meta.map_or(&[][..], |m| &m.remembered[..]);
    let form = SharedForm::<CounterDelta, PendingGroup> {
        last,
        counters,
        pending: Vec::new(),
        held: Cow::Borrowed(&[]),
        // Releases are not written: only commits change what a later owner
        // must know (a commit retried there is recognised by its settled
        // id), and only until their deadline, as on one node (no other node
        // learns of them there: the grace shared mode keeps them for made
        // a hot user's writes grow with its last two minutes' commits).
        remembered: if settled.iter().all(|x| x.committed && x.deadline > at) {
            Cow::Borrowed(settled)
        } else {
            Cow::Owned(
                settled
                    .iter()
                    .filter(|x| x.committed && x.deadline > at)
                    .cloned()
                    .collect(),
            )
        },
        extra: committed
            .iter()
            .filter_map(|c| match &c.state {
                ItemState::Budget(b) => Some(ExtraState {
                    def_id: c.def_id,
                    tag: c.tag,
                    extra: StoredExtra::Budget {
                        pending: 0,
                        anchor: b.anchor,
                        base: b.base,
                    },
                }),
                _ => None,
            })
            .collect(),
    };
    codec::encode_sized(&form, 64 + 8 * form.counters.len())
}

/// What a record keeps for a commit made on another node than the
/// reservation's: its holds' costs other than 1, and the settled ids whose
/// committer charged the campaign side (issue 47). Appended after the ids.
pub(super) type MovedSpend = (Vec<(u64, u32, Vec<(u32, u64)>)>, Vec<u64>);

pub(super) fn moved_spend(rec: &SubjectRecord) -> MovedSpend {
    let Some(m) = rec.shared_meta() else {
        return Default::default();
    };
    (
        m.held
            .iter()
            .filter(|h| !h.costs.is_empty() || h.maker != 0)
            .map(|h| (h.res, h.maker, h.costs.clone()))
            .collect(),
        m.remembered
            .iter()
            .filter(|r| r.charged)
            .map(|r| r.res)
            .collect(),
    )
}

/// The counters of `rec` a shared record keeps. Empty ones (a window at
/// 0, an empty log) are left out, as the hot tier's sweep drops them: a
/// user screened against 50 campaigns and shown one kept 49 of them, and
/// every write carried them (~1.8 KB a commit; issue 26). So are those
/// whose stored state is fresh (a concurrency item's: its holds are kept
/// as extra state).
pub(super) fn kept_counters(rec: &SubjectRecord) -> impl Iterator<Item = &Counter> + '_ {
    rec.counters.iter().filter(|c| {
        !c.state.is_empty()
            && !matches!(
                c.state,
                ItemState::Fresh | ItemState::Concurrency(_) | ItemState::Adaptive(_)
            )
    })
}

/// [`kept_counters`] as layout 2 stores them.
pub(super) fn stored_counters(rec: &SubjectRecord) -> impl Iterator<Item = StoredCounter> + '_ {
    kept_counters(rec).map(|c| StoredCounter {
        def_id: c.def_id,
        tag: c.tag,
        state: StoredState::from(&c.state),
    })
}

/// `rec`'s form with decision time `last`, its counters as `counters` and
/// its pending debits as `pending`.
pub(super) fn form<C, P>(
    rec: &SubjectRecord,
    last: Nanos,
    counters: Vec<C>,
    pending: Vec<P>,
) -> SharedForm<'_, C, P> {
    let meta = rec.shared_meta();
    SharedForm {
        last,
        counters,
        pending,
        held: Cow::Borrowed(meta.map_or(&[][..], |m| &m.held[..])),
        remembered: Cow::Borrowed(meta.map_or(&[][..], |m| &m.remembered[..])),
        extra: rec
            .counters
            .iter()
            .filter_map(|c| {
                let extra = match &c.state {
                    ItemState::Budget(b) => StoredExtra::Budget {
                        pending: b.pending,
                        anchor: b.anchor,
                        base: b.base,
                    },
                    ItemState::Concurrency(k) if !k.deadlines.is_empty() => {
                        StoredExtra::Concurrency {
                            deadlines: k.deadlines.clone(),
                        }
                    }
                    ItemState::Adaptive(a) => StoredExtra::Adaptive {
                        deadlines: a.slots.deadlines.clone(),
                        ctl: a.ctl.as_ref().map(StoredController::from),
                    },
                    _ => return None,
                };
                Some(ExtraState {
                    def_id: c.def_id,
                    tag: c.tag,
                    extra,
                })
            })
            .collect(),
    }
}

/// Inline checks' limits by reservation, as stored after the bodies.
pub(super) type InlineSpecs = Vec<(u64, Vec<u8>)>;

/// A record read from the shared store at `version`, and its last decision
/// time.
pub(super) fn decode(value: &[u8], version: u64) -> Result<(SubjectRecord, Nanos), String> {
    let (layout, idle_at, payload) = codec::unframe_versioned(value)?;
    let (form, used) = if layout >= 3 {
        let (f, used): (SharedForm<'_, CounterDelta, PendingGroup>, usize) =
            codec::decode_prefix(payload)?;
        (
            f.map_lists(compact_form::decode_counters, compact_form::decode)?,
            used,
        )
    } else {
        let (f, used): (SharedForm<'_, StoredCounter, StoredPending>, usize) =
            codec::decode_prefix(payload)?;
        let f = f.map_lists(Ok, |pending| {
            Ok(pending
                .into_iter()
                .map(|p| PendingEntry {
                    res: p.res,
                    cand: p.cand,
                    def_id: p.def_id,
                    tag: p.tag,
                    item: p.item.into(),
                    n: p.n,
                })
                .collect())
        })?;
        (f, used)
    };
    let mut bodies: Vec<(u64, u64)> = Vec::new();
    let mut inline: InlineSpecs = Vec::new();
    let mut ids: Vec<(u64, Vec<u128>)> = Vec::new();
    let mut moved: MovedSpend = Default::default();
    if let Some(rest) = payload.get(used..).filter(|r| !r.is_empty()) {
        let more;
        (bodies, more) = codec::decode_prefix(rest)?;
        if let Some(rest) = rest.get(more..).filter(|r| !r.is_empty()) {
            let more;
            (inline, more) = codec::decode_prefix(rest)?;
            if let Some(rest) = rest.get(more..).filter(|r| !r.is_empty()) {
                let more;
                (ids, more) = codec::decode_prefix(rest)?;
                if let Some(rest) = rest.get(more..).filter(|r| !r.is_empty()) {
                    (moved, _) = codec::decode_prefix(rest)?;
                }
            }
        }
    }
    let mut rec = SubjectRecord {
        counters: form
            .counters
            .into_iter()
            .map(|s| Counter {
                def_id: s.def_id,
                tag: s.tag,
                state: s.state.into(),
            })
            .collect(),
        pending: None,
        idle_at,
        write_seq: version,
    };
    for x in form.extra {
        match x.extra {
            StoredExtra::Budget {
                pending,
                anchor,
                base,
            } => {
                if let ItemState::Budget(b) = rec.state_mut(x.def_id, x.tag) {
                    b.pending = pending;
                    b.anchor = anchor;
                    b.base = base;
                }
            }
            StoredExtra::Concurrency { deadlines } => {
                *rec.state_mut(x.def_id, x.tag) =
                    ItemState::Concurrency(ConcurrencyState { deadlines });
            }
            StoredExtra::Adaptive { deadlines, ctl } => {
                *rec.state_mut(x.def_id, x.tag) = ItemState::Adaptive(Box::new(AdaptiveState {
                    slots: ConcurrencyState { deadlines },
                    ctl: ctl.and_then(|c| c.controller()),
                }));
            }
        }
    }
    for p in form.pending {
        rec.add_pending(p);
    }
    if !form.held.is_empty() || !form.remembered.is_empty() {
        let meta = rec.shared_meta_mut();
        meta.held = form.held.into_owned();
        meta.remembered = form.remembered.into_owned();
        for (res, body) in bodies {
            if let Some(h) = meta.held.iter_mut().find(|h| h.res == res) {
                h.body = body;
            }
        }
        for (res, spec) in inline {
            if let Some(h) = meta.held.iter_mut().find(|h| h.res == res) {
                h.inline = Some(spec.into());
            }
        }
        for (res, keys) in ids {
            if let Some(h) = meta.held.iter_mut().find(|h| h.res == res) {
                h.ids = keys;
            }
        }
        for (res, maker, costs) in moved.0 {
            if let Some(h) = meta.held.iter_mut().find(|h| h.res == res) {
                h.costs = costs;
                h.maker = maker;
            }
        }
        for res in moved.1 {
            if let Some(r) = meta.remembered.iter_mut().find(|r| r.res == res) {
                r.charged = true;
            }
        }
    }
    Ok((rec, form.last))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::window::CounterState;

    /// A record with a counter, an empty counter, a held screen carrying
    /// every appended field, and a settled id charged on another node.
    fn record() -> SubjectRecord {
        let mut rec = SubjectRecord {
            counters: vec![
                Counter {
                    def_id: 7,
                    tag: 1,
                    state: ItemState::Counter(CounterState {
                        start: 0,
                        end: 86_400_000_000_000,
                        used: 3,
                    }),
                },
                Counter {
                    def_id: 8,
                    tag: 1,
                    state: ItemState::Counter(CounterState {
                        start: 0,
                        end: 10,
                        used: 0,
                    }),
                },
            ]
            .into_boxed_slice(),
            idle_at: 86_400_000_000_000,
            write_seq: 41,
            ..SubjectRecord::default()
        };
        let meta = rec.shared_meta_mut();
        meta.held.push(Held {
            res: 0xfeed,
            deadline: 5_000,
            kind: HeldKind::Screen {
                candidates: vec![(0, 7), (2, 9)],
            },
            body: 0xb0d1,
            inline: None,
            ids: vec![0xabc],
            costs: vec![(2, 40)],
            maker: 0x1234_5678,
        });
        meta.remembered.push(RememberedId {
            res: 0xbeef,
            deadline: 9_000,
            committed: true,
            campaigns: vec![7],
            final_cost: Some(12),
            charged: true,
        });
        rec
    }

    /// What a record says in every field the shared form keeps.
    fn said(rec: &SubjectRecord) -> String {
        let counters: Vec<_> = kept_counters(rec)
            .map(|c| (c.def_id, c.tag, format!("{:?}", c.state)))
            .collect();
        let meta = rec.shared_meta().map(|m| {
            let held: Vec<_> = m
                .held
                .iter()
                .map(|h| (h.clone(), h.body, h.ids.clone(), h.costs.clone(), h.maker))
                .collect();
            let ids: Vec<_> = m
                .remembered
                .iter()
                .map(|r| (r.clone(), r.charged))
                .collect();
            (held, ids)
        });
        format!("{counters:?} {meta:?} {}", rec.idle_at)
    }

    #[test]
    fn both_layouts_decode_to_what_was_encoded() {
        let rec = record();
        for layout in [2, 3] {
            let bytes = payload(&rec, 1_234, layout);
            let value = codec::frame_as(layout, rec.idle_at, &bytes);
            let (back, last) = decode(&value, 77).expect("decodes");
            assert_eq!(last, 1_234, "layout {layout}");
            assert_eq!(back.write_seq, 77, "the version read is the record's");
            assert_eq!(said(&back), said(&rec), "layout {layout}");
            // Encoded again, it is the same bytes: nothing was lost or
            // reordered.
            assert_eq!(payload(&back, 1_234, layout), bytes, "layout {layout}");
        }
    }

    #[test]
    fn an_empty_counter_is_not_stored() {
        let rec = record();
        let (back, _) = decode(&codec::frame_as(3, 0, &payload(&rec, 0, 3)), 1).expect("decodes");
        assert!(back.counters.iter().all(|c| c.def_id != 8));
        assert!(back.counters.iter().any(|c| c.def_id == 7));
    }

    #[test]
    fn the_decision_time_is_the_first_field_only() {
        let rec = record();
        let a = payload(&rec, 5, 3);
        let b = payload(&rec, 6_000_000, 3);
        assert_ne!(a, b);
        assert_eq!(without_last(&a, 5), without_last(&b, 6_000_000));
    }

    #[test]
    fn owner_mode_keeps_committed_state_and_commits_only() {
        let mut rec = record();
        rec.shared_meta_mut().remembered.push(RememberedId {
            res: 0xdead,
            deadline: 9_000,
            committed: false,
            campaigns: Vec::new(),
            final_cost: None,
            charged: false,
        });
        let reg = Registry::default();
        let bytes = owned_payload(&rec, 0, 1_000, &reg);
        let (back, _) = decode(&codec::frame_as(3, rec.idle_at, &bytes), 1).expect("decodes");
        let meta = back.shared_meta().expect("the commit is kept");
        assert!(meta.held.is_empty(), "holds stay in the owner's memory");
        assert_eq!(
            meta.remembered.iter().map(|r| r.res).collect::<Vec<_>>(),
            vec![0xbeef],
            "a release is not written"
        );
        // Past its deadline, the commit is forgotten too.
        let later = owned_payload(&rec, 0, 10_000, &reg);
        let (back, _) = decode(&codec::frame_as(3, rec.idle_at, &later), 1).expect("decodes");
        assert!(back.shared_meta().is_none_or(|m| m.remembered.is_empty()));
    }
}
