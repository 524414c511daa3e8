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

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};

use crate::clock::{Clock, Nanos};
use crate::cluster::owners::{Owner, Owners};
use crate::limits::adaptive::{AdaptiveState, Controller, Sample};
use crate::limits::concurrency::ConcurrencyState;
use crate::limits::rate::RatePending;
use crate::limits::{ItemState, PendingItem};
use crate::store::codec::{self, StoredCounter, StoredState};
use crate::store::{Cas, Owned, Shared, StoreError};

use super::chain::{Defs, PendingEnd, Repriced, settle_entries};
use super::compact_form::{self, CounterDelta, PendingGroup};
use super::holds::{Held, HeldKind, RememberedId};
use super::hot::{Halt, RecordKey};
use super::record::{Counter, PendingEntry, SubjectRecord};
use super::registry::Registry;
use super::request::CompiledInline;
use super::request::Outcome;
use super::request::compile_inline;
use super::reservations::Settlement;
use super::{Conflict, Engine, EngineError, corrupt, invalid};
use crate::model::LimitDef;

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

/// How long a claim of a user with no record stands (owner mode), unless
/// the owner writes the record first: it fences a deposed owner's write
/// against "absent", which can only come from a decision that checked its
/// lease before a pause and wrote after it. Each user screened and never
/// shown costs Redis a small hash for this long (~100 bytes), so it is
/// not an hour; a claim that ran out under an owner's copy is made again
/// at its next write.
const OWNED_ABSENT_TTL: Nanos = 600 * 1_000_000_000;

/// The error a request gets where this node does not decide.
fn unavailable(message: String) -> Halt {
    EngineError::Store(StoreError::Unavailable(message)).into()
}

/// How a reservation was settled, as its record says.
#[derive(Debug, Clone)]
pub(crate) struct RecordedEnd {
    pub outcome: Outcome,
    /// The committed campaigns (ids); a release lists its candidates.
    pub campaigns: Vec<u32>,
    pub final_cost: Option<u64>,
    /// Committed on another node than the reservation's, which charged the
    /// winners' campaign-side spend ([`RememberedId::charged`]).
    pub charged: bool,
}

/// What a node that committed another node's reservation (and charged its
/// campaign side) tells that node ([`Engine::read_notices`]).
#[derive(Serialize, Deserialize)]
struct Notice {
    id: String,
    campaigns: Vec<u32>,
    final_cost: Option<u64>,
}

/// How long past its deadline a settled id stays in its record: the node
/// that made the reservation learns there, at the deadline, how another node
/// settled it (its campaign-side holds follow), and its sweeper may come a
/// little late.
pub(crate) const SETTLED_GRACE: Nanos = 60 * 1_000_000_000;

impl Held {
    /// The definitions this reservation's debits were made under: `reg`'s,
    /// or the inline limits kept with it (compiled again: settling is rare
    /// next to deciding).
    fn defs<'a>(&self, reg: &'a Registry, compiled: &'a Option<Arc<CompiledInline>>) -> Defs<'a> {
        match compiled {
            Some(c) => Defs::Stack {
                owner: 0,
                stack: &c.stack,
                tags: &c.tags,
            },
            None => Defs::Registry(reg),
        }
    }

    /// The inline limits kept with this reservation, compiled.
    fn compiled(&self) -> Option<Arc<CompiledInline>> {
        let spec = self.inline.as_ref()?;
        let limits: Vec<LimitDef> = serde_json::from_slice(spec).ok()?;
        compile_inline(&limits).ok()
    }
}

/// What a record says of reservation `res` asked again under the same id.
#[derive(Debug, Clone)]
pub(crate) enum SeenHere {
    /// Held, by a request with this body: (index, campaign id) held.
    Held { body: u64, kind: HeldKind },
    /// Settled (committed or released).
    Settled,
}

/// Whether `rec` holds or has settled reservation `res`: a reserve under a
/// caller's id that another node (or this one, in a write whose answer was
/// lost) already made must not hold a second time (docs/cluster.md).
pub(crate) fn seen_in_record(rec: &SubjectRecord, res: u64) -> Option<SeenHere> {
    let meta = rec.shared_meta()?;
    if let Some(h) = meta.held.iter().find(|h| h.res == res) {
        return Some(SeenHere::Held {
            body: h.body,
            kind: h.kind.clone(),
        });
    }
    meta.remembered
        .iter()
        .any(|s| s.res == res)
        .then_some(SeenHere::Settled)
}

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
struct SharedForm<'a, C, P> {
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
struct ExtraState {
    owner: u32,
    tag: u32,
    extra: StoredExtra,
}

#[derive(Serialize, Deserialize)]
enum StoredExtra {
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
struct StoredController {
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
struct StoredPending {
    res: u64,
    cand: u32,
    owner: u32,
    tag: u32,
    item: StoredPendingItem,
    n: u64,
}

/// [`PendingItem`] as stored (new variants go last).
#[derive(Serialize, Deserialize)]
enum StoredPendingItem {
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
fn without_last(payload: &[u8], last: Nanos) -> &[u8] {
    payload
        .get(codec::encode(&last).len()..)
        .unwrap_or_default()
}

/// The payload of `rec` as stored in `layout` (2 or 3), with decision time
/// `last`.
fn payload(rec: &SubjectRecord, last: Nanos, layout: u8) -> Vec<u8> {
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
                owner: p.owner,
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
fn owned_payload(rec: &SubjectRecord, last: Nanos, at: Nanos, reg: &Registry) -> Vec<u8> {
    let committed = rec.committed_counters(at, &|owner, tag| Defs::Registry(reg).item(owner, tag));
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
                    owner: c.owner,
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
type MovedSpend = (Vec<(u64, u32, Vec<(u32, u64)>)>, Vec<u64>);

fn moved_spend(rec: &SubjectRecord) -> MovedSpend {
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
fn kept_counters(rec: &SubjectRecord) -> impl Iterator<Item = &Counter> + '_ {
    rec.counters.iter().filter(|c| {
        !c.state.is_empty()
            && !matches!(
                c.state,
                ItemState::Fresh | ItemState::Concurrency(_) | ItemState::Adaptive(_)
            )
    })
}

/// [`kept_counters`] as layout 2 stores them.
fn stored_counters(rec: &SubjectRecord) -> impl Iterator<Item = StoredCounter> + '_ {
    kept_counters(rec).map(|c| StoredCounter {
        owner: c.owner,
        tag: c.tag,
        state: StoredState::from(&c.state),
    })
}

/// `rec`'s form with decision time `last`, its counters as `counters` and
/// its pending debits as `pending`.
fn form<C, P>(
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
                    owner: c.owner,
                    tag: c.tag,
                    extra,
                })
            })
            .collect(),
    }
}

/// Inline checks' limits by reservation, as stored after the bodies.
type InlineSpecs = Vec<(u64, Vec<u8>)>;

/// A record read from the shared store at `version`, and its last decision
/// time.
pub(crate) fn decode(value: &[u8], version: u64) -> Result<(SubjectRecord, Nanos), String> {
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
                    owner: p.owner,
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
                owner: s.owner,
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
                if let ItemState::Budget(b) = rec.state_mut(x.owner, x.tag) {
                    b.pending = pending;
                    b.anchor = anchor;
                    b.base = base;
                }
            }
            StoredExtra::Concurrency { deadlines } => {
                *rec.state_mut(x.owner, x.tag) =
                    ItemState::Concurrency(ConcurrencyState { deadlines });
            }
            StoredExtra::Adaptive { deadlines, ctl } => {
                *rec.state_mut(x.owner, x.tag) = ItemState::Adaptive(Box::new(AdaptiveState {
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

/// Releases, as of their deadline, the reservations of `rec` whose deadline
/// is past `at`, and forgets settled ids past theirs: whichever node touches
/// a record first ends a dead node's holds.
fn expire_held(rec: &mut SubjectRecord, at: Nanos, reg: &Registry) {
    let Some(meta) = rec.shared_meta() else {
        return;
    };
    if !meta.held.iter().any(|h| h.deadline <= at)
        && !meta
            .remembered
            .iter()
            .any(|s| s.deadline + SETTLED_GRACE <= at)
    {
        return;
    }
    let meta = rec.shared_meta_mut();
    meta.remembered.retain(|s| s.deadline + SETTLED_GRACE > at);
    let (due, kept): (Vec<Held>, Vec<Held>) = std::mem::take(&mut meta.held)
        .into_iter()
        .partition(|h| h.deadline <= at);
    meta.held = kept;
    for h in due {
        let entries = rec.take_pending(h.res, None);
        let compiled = h.compiled();
        settle_entries(
            rec,
            entries,
            h.defs(reg, &compiled),
            PendingEnd::Release,
            h.deadline,
            None,
        );
    }
    rec.drop_empty_shared_meta();
}

/// What settling a reservation in its record found.
#[derive(Debug)]
pub(crate) enum InRecord {
    /// Settled now: the outcome and its campaigns.
    Done(RecordedEnd, Vec<Arc<str>>),
    /// Settled before, the same way: the same answer.
    Repeat(RecordedEnd, Vec<Arc<str>>),
    /// The record holds nothing of it (unknown, or expired and forgotten).
    Unknown,
}

fn names(reg: &Registry, ids: &[u32]) -> Vec<Arc<str>> {
    ids.iter()
        .filter_map(|id| reg.campaign_by_id(*id).map(|e| e.name.clone()))
        .collect()
}

/// Settles reservation `res` (id `id`) in `rec`, as of `at`. An error
/// leaves the record unchanged. `charged`: the candidates (indexes) whose
/// campaign-side spend this node reported as committed of another node's
/// holds ([`ForeignWinner`]); if they are exactly the winners, the record
/// says so ([`RememberedId::charged`]).
#[allow(clippy::too_many_arguments)]
fn settle_in_record(
    rec: &mut SubjectRecord,
    res: u64,
    id: &str,
    how: Settlement<'_, [String]>,
    sample: Option<Sample>,
    at: Nanos,
    reg: &Registry,
    charged: Option<&[u32]>,
) -> Result<InRecord, EngineError> {
    let meta = rec.shared_meta();
    if let Some(s) = meta.and_then(|m| m.remembered.iter().find(|s| s.res == res)) {
        let outcome = if s.committed {
            Outcome::Committed
        } else {
            Outcome::Released
        };
        return match (how, s.committed) {
            (Settlement::Commit { .. }, true) | (Settlement::Release, false) => {
                let names = names(reg, &s.campaigns);
                let how = RecordedEnd {
                    outcome,
                    campaigns: s.campaigns.clone(),
                    final_cost: s.final_cost,
                    charged: s.charged,
                };
                Ok(InRecord::Repeat(how, names))
            }
            _ => Err(EngineError::Conflict(Conflict::SettledOtherwise {
                id: id.to_owned(),
                outcome,
            })),
        };
    }
    let Some(held) = meta
        .and_then(|m| m.held.iter().find(|h| h.res == res))
        .cloned()
    else {
        return Ok(InRecord::Unknown);
    };
    let (committed, final_cost) = match how {
        Settlement::Commit { final_cost, .. } => (true, final_cost),
        Settlement::Release => (false, None),
    };
    let (chosen, repriced) = match (&held.kind, how) {
        (
            HeldKind::Screen { candidates },
            Settlement::Commit {
                chosen: campaigns, ..
            },
        ) => (winners(candidates, campaigns, reg, id)?, Repriced::Budgets),
        (HeldKind::Screen { candidates }, Settlement::Release) => (
            candidates.iter().map(|&(i, c)| (i, c, false)).collect(),
            Repriced::Budgets,
        ),
        (HeldKind::Check { .. }, _) => (Vec::new(), Repriced::EveryItem),
    };
    let entries = rec.take_pending(res, None);
    let compiled = held.compiled();
    for e in entries {
        let win = match held.kind {
            HeldKind::Check { .. } => committed,
            HeldKind::Screen { .. } => chosen.iter().any(|&(i, _, w)| w && i == e.cand),
        };
        let settling = if win {
            PendingEnd::Commit {
                final_cost,
                repriced,
            }
        } else {
            PendingEnd::Release
        };
        settle_entries(rec, [e], held.defs(reg, &compiled), settling, at, sample);
    }
    // A commit answers with its winners, a release with every candidate
    // (as on one node).
    let shown: Vec<u32> = match (&held.kind, committed) {
        (HeldKind::Screen { candidates }, false) => candidates.iter().map(|&(_, c)| c).collect(),
        _ => chosen
            .iter()
            .filter(|&&(_, _, w)| w)
            .map(|&(_, c, _)| c)
            .collect(),
    };
    let charged = committed
        && charged.is_some_and(|c| {
            let mut won: Vec<u32> = chosen.iter().filter(|w| w.2).map(|w| w.0).collect();
            let mut reported = c.to_vec();
            won.sort_unstable();
            reported.sort_unstable();
            won == reported
        });
    let meta = rec.shared_meta_mut();
    meta.held.retain(|h| h.res != res);
    meta.remembered.push(RememberedId {
        res,
        deadline: held.deadline,
        committed,
        campaigns: shown.clone(),
        final_cost,
        charged,
    });
    rec.idle_at = rec.idle_at.max(held.deadline + SETTLED_GRACE);
    let outcome = if committed {
        Outcome::Committed
    } else {
        Outcome::Released
    };
    let names = names(reg, &shown);
    let how = RecordedEnd {
        outcome,
        campaigns: shown,
        final_cost,
        charged,
    };
    Ok(InRecord::Done(how, names))
}

/// The other identities' records reservation `res` (id `id`) may hold on,
/// as its holder's record `rec` lists them, and how `how` ends it there:
/// `None` when it lists none or is settled already; an error (a commit
/// naming a campaign it does not hold) before anything is settled.
fn identities_ahead(
    rec: &SubjectRecord,
    res: u64,
    id: &str,
    how: Settlement<'_, [String]>,
    reg: &Registry,
) -> Result<Option<(Vec<u128>, RecordedEnd)>, EngineError> {
    let Some(held) = rec
        .shared_meta()
        .and_then(|m| m.held.iter().find(|h| h.res == res))
        .filter(|h| !h.ids.is_empty())
    else {
        return Ok(None);
    };
    let HeldKind::Screen { candidates } = &held.kind else {
        return Ok(None);
    };
    let end = match how {
        Settlement::Commit {
            chosen: campaigns,
            final_cost,
        } => RecordedEnd {
            outcome: Outcome::Committed,
            campaigns: winners(candidates, campaigns, reg, id)?
                .into_iter()
                .filter(|&(_, _, won)| won)
                .map(|(_, c, _)| c)
                .collect(),
            final_cost,
            charged: false,
        },
        Settlement::Release => RecordedEnd {
            outcome: Outcome::Released,
            campaigns: Vec::new(),
            final_cost: None,
            charged: false,
        },
    };
    Ok(Some((held.ids.clone(), end)))
}

/// A winner of a commit made on another node than the reservation's: its
/// candidate index, campaign id and reserved cost. The committing node
/// charges its campaign-side spend ([`Engine::charge_foreign`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ForeignWinner {
    pub cand: u32,
    pub campaign: u32,
    pub cost: u64,
}

/// The winners a commit `how` of reservation `res` would have as `rec`
/// holds it now (empty: not held there, or a release), and the process
/// nonce of the node that made it if the record knows it ([`Held::maker`]).
fn foreign_winners(
    rec: &SubjectRecord,
    res: u64,
    id: &str,
    how: Settlement<'_, [String]>,
    reg: &Registry,
) -> Result<(Vec<ForeignWinner>, u32), EngineError> {
    let (Some(held), Settlement::Commit { chosen, .. }) = (
        rec.shared_meta()
            .and_then(|m| m.held.iter().find(|h| h.res == res)),
        how,
    ) else {
        return Ok((Vec::new(), 0));
    };
    let HeldKind::Screen { candidates } = &held.kind else {
        return Ok((Vec::new(), 0));
    };
    let won = winners(candidates, chosen, reg, id)?
        .into_iter()
        .filter(|w| w.2)
        .map(|(cand, campaign, _)| ForeignWinner {
            cand,
            campaign,
            cost: held.costs.iter().find(|c| c.0 == cand).map_or(1, |c| c.1),
        })
        .collect();
    Ok((won, held.maker))
}

/// Settles reservation `res` in another identity's record (`super::identities`)
/// as its user's record says it ended (`end`): for each campaign committed,
/// its first candidate held here not already chosen wins; the rest are
/// released. Nothing held here: a no-op.
fn settle_identity_in_record(
    rec: &mut SubjectRecord,
    res: u64,
    end: &RecordedEnd,
    at: Nanos,
    reg: &Registry,
) {
    let Some(held) = rec
        .shared_meta()
        .and_then(|m| m.held.iter().find(|h| h.res == res))
        .cloned()
    else {
        return;
    };
    let mut chosen: Vec<u32> = Vec::new();
    if let (HeldKind::Screen { candidates }, Outcome::Committed) = (&held.kind, end.outcome) {
        for c in &end.campaigns {
            if let Some(&(i, _)) = candidates
                .iter()
                .find(|(i, x)| x == c && !chosen.contains(i))
            {
                chosen.push(i);
            }
        }
    }
    let compiled = held.compiled();
    for e in rec.take_pending(res, None) {
        let settling = match chosen.contains(&e.cand) {
            true => PendingEnd::Commit {
                final_cost: end.final_cost,
                repriced: Repriced::Budgets,
            },
            false => PendingEnd::Release,
        };
        settle_entries(rec, [e], held.defs(reg, &compiled), settling, at, None);
    }
    rec.shared_meta_mut().held.retain(|h| h.res != res);
    rec.drop_empty_shared_meta();
}

/// The candidates a commit naming `campaigns` wins, as (index, campaign id,
/// won): as on one node, for each name the first eligible candidate of that
/// campaign not already chosen; every eligible one when none is named.
fn winners(
    candidates: &[(u32, u32)],
    campaigns: &[String],
    reg: &Registry,
    id: &str,
) -> Result<Vec<(u32, u32, bool)>, EngineError> {
    let mut out: Vec<(u32, u32, bool)> = candidates
        .iter()
        .map(|&(i, c)| (i, c, campaigns.is_empty()))
        .collect();
    for (n, name) in campaigns.iter().enumerate() {
        let cid = reg.campaigns.get(name).map(|e| e.id);
        match out.iter_mut().find(|(_, c, won)| Some(*c) == cid && !*won) {
            Some(c) => c.2 = true,
            None => return Err(super::request::not_a_winner(campaigns, n, id)),
        }
    }
    Ok(out)
}

impl<C: Clock> Engine<C> {
    /// Refuses a check a shared store cannot hold: a reservation of inline
    /// limits (no node but this one knows their items, so no other could
    /// expire it).
    pub(crate) fn check_shareable(
        &self,
        owner: u32,
        reserving: bool,
        inline: bool,
    ) -> Result<(), EngineError> {
        // Inline limits reserve when the request carries them (kept with
        // the hold, [`Held::inline`]); limits compiled by a front (RESP's
        // `CL.THROTTLE`, Envoy's rules) never reserve.
        if reserving && owner == 0 && !inline {
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

    /// Owner mode: this node's membership, set once it has joined.
    pub fn set_owners(&self, owners: Arc<Owners>) {
        let _ = self.owners.set(owners);
    }

    /// Owner mode: renews this node's lease and reads the members
    /// ([`Owners::renew`]); nothing in shared mode.
    pub fn renew_membership(&self) -> Result<(), EngineError> {
        let (Some(owners), Some(shared)) = (self.owners.get(), self.shared()) else {
            return Ok(());
        };
        owners.renew(shared).map_err(Into::into)
    }

    /// Owner mode: ends this node's membership lease now (at shutdown,
    /// after the last request); nothing in shared mode.
    pub fn leave_membership(&self) -> Result<(), EngineError> {
        let (Some(owners), Some(shared)) = (self.owners.get(), self.shared()) else {
            return Ok(());
        };
        owners.leave(shared).map_err(Into::into)
    }

    /// Whether this node runs owner mode.
    pub(crate) fn in_owner_mode(&self) -> bool {
        self.owners.get().is_some()
    }

    /// Owner mode: this node's copy of user record `key` if it owns the
    /// user now and has it in memory (holds included, which the shared
    /// copy lacks); `None` otherwise.
    pub(crate) fn owned_figures(&self, key: RecordKey) -> Option<SubjectRecord> {
        let (owners, RecordKey::User(h)) = (self.owners.get()?, key) else {
            return None;
        };
        if !matches!(owners.owner(h, self.now()), Owner::Me { .. }) {
            return None;
        }
        self.drop_unowned(self.now());
        self.hot
            .get(&key.hot_key(), |r| {
                (r.write_seq != STALE).then(|| r.figures_copy())
            })
            .flatten()
    }

    /// Owner mode: who decides on `user` now (`None`: not in owner mode).
    pub fn owner_of_user(&self, user: &str) -> Option<Owner> {
        let owners = self.owners.get()?;
        Some(owners.owner(self.hash(b'u', 0, user), self.now()))
    }

    /// Owner mode: who decides on identity `id` of `kind` (its record's
    /// owner). `None`: not in owner mode, or a malformed kind (the call
    /// itself then says what is wrong).
    pub fn owner_of_identity(&self, kind: &str, id: &str) -> Option<Owner> {
        let owners = self.owners.get()?;
        let k = crate::model::identity::Kind::parse(kind).ok()?;
        Some(owners.owner(self.identity_key(k, id), self.now()))
    }

    /// Owner mode: who decides on reservation `id` (`user`: the user a
    /// commit names): the owner of the user whose record holds it. `None`:
    /// not in owner mode, or a reservation any node settles (a user-less
    /// screen's, a policy key's).
    pub fn owner_of_reservation(&self, id: &str, user: Option<&str>) -> Option<Owner> {
        let owners = self.owners.get()?;
        let h = match Self::record_in_id(id) {
            Some(RecordKey::User(h)) => h,
            Some(_) => return None,
            None => match self.reservations.reserved(id).as_deref() {
                Some(super::reservations::Reserved::Screen { user: Some(u), .. }) => *u,
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

    /// Takes the notices other nodes left this one ([`Notice`]) and gives
    /// up the holds of the reservations they committed, at once rather than
    /// at their deadline. A few hundred a sweep at most (the rest wait for
    /// the next).
    pub(crate) fn read_notices(&self) {
        let Some(shared) = self.shared() else {
            return;
        };
        const MOST: usize = 256;
        let notices = match shared.take_notices(self.id_nonce, MOST) {
            Ok(n) => n,
            Err(e) => {
                tracing::debug!("cannot read this node's notices: {e}");
                return;
            }
        };
        for raw in notices {
            let Ok(n) = codec::decode::<Notice>(&raw) else {
                continue;
            };
            let how = RecordedEnd {
                outcome: Outcome::Committed,
                campaigns: n.campaigns,
                final_cost: n.final_cost,
                charged: true,
            };
            if let Err(e) = self.settle_campaign_side(&n.id, &how) {
                tracing::debug!("a notice of {}: {e}", n.id);
            }
        }
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

    /// Reads record `key` from the shared store (a fresh one if absent),
    /// and its last decision time.
    fn read_shared(
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
    fn decoded(
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
    fn record_time(&self, now: Nanos, last: Nanos, version: u64) -> Nanos {
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
    /// ([`super::gate`]) keeps this node's decisions on the record one at a
    /// time.
    pub(crate) fn with_shared_record<R>(
        &self,
        shared: &dyn Shared,
        key: RecordKey,
        now: Nanos,
        memory_only: bool,
        mut f: impl FnMut(&mut SubjectRecord, Nanos) -> R,
    ) -> Result<R, Halt> {
        if let (Some(owners), RecordKey::User(h)) = (self.owners.get(), key) {
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

    /// [`Engine::with_shared_record`] in owner mode, on a user this node owns
    /// (docs/cluster.md, "Owner mode"): its copy in memory is the record, as
    /// on one node, since no other node decides on it. A user not in memory
    /// is claimed first (`fc_own_v1`: read, and fenced against earlier
    /// owners). Only a change of what is committed is written, by
    /// compare-and-set under this node's epoch; a write refused (a later
    /// owner claimed the record, or it moved) means this node is no longer
    /// the owner: its copy is dropped and the request fails with 503, to be
    /// retried where the user now lives.
    ///
    /// `memory_only` (a screen on the executor, no blocking hop): only on a
    /// copy in memory, with no drop of copies due, and nothing written. A
    /// screen changes nothing committed but the form of its counters (a
    /// window rolled over, a settled id forgotten), which the next commit's
    /// write carries: the stored copy is older, never different in what it
    /// counts.
    #[allow(clippy::too_many_arguments)]
    fn with_owned_record<R>(
        &self,
        shared: &dyn Shared,
        owners: &Owners,
        key: RecordKey,
        now: Nanos,
        epoch: u64,
        memory_only: bool,
        mut f: impl FnMut(&mut SubjectRecord, Nanos) -> R,
    ) -> Result<R, Halt> {
        if memory_only {
            if owners.drop_due(now) {
                return Err(Halt::NotInMemory);
            }
        } else {
            self.drop_unowned(now);
        }
        let drops = owners.drops();
        let disk = key.disk_key();
        let hot_key = key.hot_key();
        let reg = self.registry();
        let _turn = if memory_only {
            self.gates.try_enter(hot_key).ok_or(Halt::NotInMemory)?
        } else {
            self.gates.enter(hot_key)
        };
        let cached = self.take_copy(hot_key, now);
        let (mut rec, last) = match cached {
            Some(rec) => (rec, 0),
            // Its placeholder (if any) stays STALE: the blocking path claims.
            None if memory_only => return Err(Halt::NotInMemory),
            None => {
                self.stats.hot_misses.fetch_add(1, Ordering::Relaxed);
                self.stats.owner_claims.fetch_add(1, Ordering::Relaxed);
                match shared.own(&disk, epoch, OWNED_ABSENT_TTL)? {
                    Owned::Claimed {
                        version,
                        value: Some(v),
                    } => self.decoded(&disk, &v, version)?,
                    Owned::Claimed {
                        version,
                        value: None,
                    } => (
                        SubjectRecord {
                            write_seq: version,
                            ..SubjectRecord::default()
                        },
                        0,
                    ),
                    Owned::Fenced(later) => {
                        return Err(self.deposed(owners, later));
                    }
                }
            }
        };
        let now = now.max(self.last_now.load(Ordering::Acquire));
        let at = self.record_time(now, last, rec.write_seq);
        let before = owned_payload(&rec, 0, at, &reg);
        expire_held(&mut rec, at, &reg);
        let r = f(&mut rec, at);
        let after = owned_payload(&rec, at, at, &reg);
        if memory_only || without_last(&after, at) == without_last(&before, 0) {
            self.keep_owned(owners, drops, hot_key, now, rec);
            return Ok(r);
        }
        if let Some(m) = rec.shared_meta() {
            let until = m.remembered.iter().map(|s| s.deadline).max().unwrap_or(0);
            rec.idle_at = rec.idle_at.max(until.saturating_add(SETTLED_GRACE));
        }
        let value = codec::frame_as(3, rec.idle_at, &after);
        let expire = rec.idle_at.saturating_add(EXPIRY_MARGIN);
        self.stats.cas.fetch_add(1, Ordering::Relaxed);
        let mut expected = rec.write_seq;
        for reclaimed in [false, true] {
            match shared.cas_owned(&disk, expected, &value, expire, epoch) {
                Ok(Cas::Written(v)) => {
                    rec.write_seq = v;
                    self.keep_owned(owners, drops, hot_key, now, rec);
                    return Ok(r);
                }
                Ok(Cas::Fenced(later)) => return Err(self.deposed(owners, later)),
                // The claim of a user with no record ran out (it stands
                // [`OWNED_ABSENT_TTL`]) under this node's copy: nothing
                // committed was lost. Claimed again, still with no record,
                // the copy is written.
                Ok(Cas::Conflict {
                    version: 0,
                    value: None,
                }) if !reclaimed => match shared.own(&disk, epoch, OWNED_ABSENT_TTL)? {
                    Owned::Claimed {
                        version,
                        value: None,
                    } => expected = version,
                    Owned::Claimed { .. } => return Err(self.deposed(owners, epoch)),
                    Owned::Fenced(later) => return Err(self.deposed(owners, later)),
                },
                Ok(Cas::Conflict { .. }) => {
                    self.stats.cas_conflicts.fetch_add(1, Ordering::Relaxed);
                    return Err(self.deposed(owners, epoch));
                }
                // It may have been applied: the copy is not put back (its
                // placeholder is marked STALE), so the next decision claims
                // the record again, reading it.
                Err(e) => return Err(e.into()),
            }
        }
        Err(self.deposed(owners, epoch))
    }

    /// This node's copy of a user it thought it owned was overtaken (a
    /// later owner of epoch `later` claimed or wrote it): the copy is not
    /// put back (its placeholder is STALE), and the request fails with 503
    /// (retried, it goes to the owner).
    fn deposed(&self, owners: &Owners, later: u64) -> Halt {
        self.stats.owner_fenced.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            node = owners.node(),
            later,
            "a user's record was claimed by a later owner: this node no longer decides on it"
        );
        unavailable(
            "this node no longer owns this user (another node claimed it): retry, and the request \
             goes to the owner"
                .to_owned(),
        )
    }

    /// Owner mode: drops the copies of users this node may have stopped
    /// owning since it last did ([`Owners::drop_plan`]). Called by the
    /// periodic tick and before each decision.
    pub(crate) fn drop_unowned(&self, now: Nanos) {
        let Some(owners) = self.owners.get() else {
            return;
        };
        if let Some(plan) = owners.drop_plan(now) {
            let n = self
                .hot
                .retain_keys(|k| plan.keeps(u128::from(k[0]) | (u128::from(k[1]) << 64)));
            owners.dropped(&plan);
            if n > 0 {
                tracing::info!(
                    dropped = n,
                    "owners changed: dropped the copies of users this node no longer owns"
                );
            }
        }
    }

    /// Takes the cached copy of a record out of the hot tier, if it has a
    /// current one; a placeholder marked STALE stays, so anything that reads
    /// it without the gate reads the store instead.
    fn take_copy(&self, hot_key: [u64; 2], now: Nanos) -> Option<SubjectRecord> {
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

    /// Owner mode: [`Engine::keep_copy`], unless copies were dropped while
    /// the decision ran (its user may have moved away meanwhile, and a copy
    /// put back would be stale should it come back): the placeholder then
    /// stays, and the next decision claims the record again.
    fn keep_owned(
        &self,
        owners: &Owners,
        drops: u64,
        hot_key: [u64; 2],
        now: Nanos,
        rec: SubjectRecord,
    ) {
        if owners.drops() == drops {
            self.keep_copy(hot_key, now, rec);
        }
    }

    /// Puts `rec`, as decided and written (or found current), back in the
    /// hot tier under its shard's lock; this record's gate is held, so no
    /// other decision of this node replaced it meanwhile.
    fn keep_copy(&self, hot_key: [u64; 2], now: Nanos, rec: SubjectRecord) {
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

    /// Settles reservation `id` in record `key`: the shared store's answer
    /// is the cluster's.
    pub(crate) fn settle_shared(
        &self,
        shared: &dyn Shared,
        key: RecordKey,
        id: &str,
        how: Settlement<'_, [String]>,
        sample: Option<Sample>,
    ) -> Result<InRecord, EngineError> {
        let res = self.res_of(id);
        let reg = self.registry();
        let now = self.now();
        // A commit of a reservation another node made: this node charges
        // the winners' campaign-side spend, reported before the record says
        // so (and before the commit is acknowledged), so the spend counts
        // even if that node dies before the deadline at which it would have
        // charged it (issue 47: 1 259 of a budget of 1 200 before).
        let charge =
            matches!(how, Settlement::Commit { .. }) && self.reservations.reserved(id).is_none();
        let mut foreign: Result<(Vec<ForeignWinner>, u32), EngineError> = Ok((Vec::new(), 0));
        // The other identities' records the screen held on are settled
        // first, as the holder's record says the reservation ends: then a
        // failure (a conflict, Redis away) leaves the holder's record
        // unsettled and the commit unacknowledged, and its retry settles
        // the rest (an identity record already settled holds nothing of
        // it). Reading the holder's copy writes nothing; a node that holds
        // the user in memory reads nothing either.
        let mut ahead: Result<Option<(Vec<u128>, RecordedEnd)>, EngineError> = Ok(None);
        let read = self.with_shared_record(shared, key, now, false, |rec, _| {
            ahead = identities_ahead(rec, res, id, how, &reg);
            if charge {
                foreign = foreign_winners(rec, res, id, how, &reg);
            }
        });
        super::hot::waited(read)?;
        let settle_ids = |ids: &[u128], end: &RecordedEnd| -> Result<(), EngineError> {
            for k in ids {
                let r = self.with_shared_record(
                    shared,
                    RecordKey::PolicyKey(*k),
                    now,
                    false,
                    |rec, at| settle_identity_in_record(rec, res, end, at, &reg),
                );
                super::hot::waited(r)?;
            }
            Ok(())
        };
        let ahead = ahead?;
        let (foreign, maker) = foreign?;
        let final_cost = match how {
            Settlement::Commit { final_cost, .. } => final_cost,
            Settlement::Release => None,
        };
        let reported: Option<Vec<u32>> = match foreign.is_empty() {
            true => None,
            false => {
                self.charge_foreign(&foreign, final_cost)?;
                Some(foreign.iter().map(|w| w.cand).collect())
            }
        };
        if let Some((ids, end)) = &ahead {
            settle_ids(ids, end)?;
        }
        // The copy read above may have been stale (another node made the
        // reservation since): the identities the settled copy lists, if
        // not settled ahead, are settled after it.
        let mut listed: Vec<u128> = Vec::new();
        let settled = self.with_shared_record(shared, key, now, false, |rec, at| {
            listed = rec
                .shared_meta()
                .and_then(|m| m.held.iter().find(|h| h.res == res))
                .map(|h| h.ids.clone())
                .unwrap_or_default();
            settle_in_record(rec, res, id, how, sample, at, &reg, reported.as_deref())
        });
        let settled = super::hot::waited(settled)??;
        if let InRecord::Done(end, _) = &settled
            && end.charged
        {
            self.count_foreign(&foreign, final_cost, now);
            // The node that made it gives its holds up at once, not at
            // the deadline: until it does, the store counts them twice
            // (fewer units granted). Best effort: failing, it learns at
            // the deadline.
            let maker = Self::maker_in_id(id).unwrap_or(maker);
            if maker != 0 {
                let notice = Notice {
                    id: id.to_owned(),
                    campaigns: end.campaigns.clone(),
                    final_cost: end.final_cost,
                };
                if let Err(e) = shared.notify(maker, &codec::encode(&notice)) {
                    tracing::debug!("cannot tell node {maker:08x} of a commit: {e}");
                }
            }
        }
        if ahead.is_none()
            && !listed.is_empty()
            && let InRecord::Done(end, _) = &settled
        {
            settle_ids(&listed, end)?;
        }
        Ok(settled)
    }

    /// How reservation `res` was settled, as record `key` says (`None`:
    /// not settled there, or forgotten): what the node that made it learns
    /// at its deadline.
    pub(crate) fn settled_as(
        &self,
        shared: &dyn Shared,
        key: RecordKey,
        res: u64,
    ) -> Result<Option<RecordedEnd>, StoreError> {
        let (rec, _) = self.read_shared(shared, &key.disk_key())?;
        Ok(rec
            .shared_meta()
            .and_then(|m| m.remembered.iter().find(|s| s.res == res))
            .map(|s| RecordedEnd {
                charged: s.charged,
                outcome: if s.committed {
                    Outcome::Committed
                } else {
                    Outcome::Released
                },
                campaigns: s.campaigns.clone(),
                final_cost: s.final_cost,
            }))
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
