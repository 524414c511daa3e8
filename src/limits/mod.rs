//! The limit algorithms: pure state machines over (state, now, cost), no I/O.
//!
//! Each kind lives in its own module ([`rate`], [`window`], [`budget`],
//! [`concurrency`]; calendar periods in [`calendar`]). This module joins them
//! behind one [`Item`] / [`ItemState`] pair so that a stack of mixed items
//! ([`stack::Stack`]) can be decided all-or-nothing, and a record of several item
//! states can live under one lock.
//!
//! Every item supports four steps:
//! - **probe**: would `cost` fit at `now`? Nothing changes.
//! - **apply**: debit it (immediate, or pending under a reservation), returning a
//!   [`PendingItem`] that remembers what a later release or commit needs.
//! - **release** a pending debit: undo exactly what it took, never more.
//! - **commit** a pending debit with a final cost.

pub mod adaptive;
pub mod budget;
pub mod calendar;
pub mod cell;
pub mod concurrency;
pub mod priority;
pub mod rate;
pub mod schedule;
pub mod stack;
pub mod window;

use crate::clock::{Nanos, Span};
use adaptive::{Adaptive, AdaptiveState, Sample};
use budget::{Budget, BudgetState};
use concurrency::{Concurrency, ConcurrencyState};
use rate::{Rate, RatePending, RateProbe, RateState};
use window::{ApproxState, CounterState, Layout, LogState, Window};

/// The kind of an item, as reported in decisions (`"rate"`, `"gap"`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Rate,
    Gap,
    Window,
    Budget,
    Concurrency,
    Adaptive,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Rate => "rate",
            Kind::Gap => "gap",
            Kind::Window => "window",
            Kind::Budget => "budget",
            Kind::Concurrency => "concurrency",
            Kind::Adaptive => "adaptive",
        }
    }
}

/// A compiled limit item: a definition validated and turned into the numbers its
/// algorithm needs.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    /// GCRA; `gap` items compile to a rate of 1 per `min` with burst 1 and keep
    /// their own kind for reporting.
    Rate {
        rate: Rate,
        kind: Kind,
    },
    Window(Window),
    Budget(Budget),
    Concurrency(Concurrency),
    /// A concurrency limit that moves with reported latency and outcome.
    Adaptive(Adaptive),
}

/// The state of one item for one key.
///
/// 32 bytes: the largest inline variants are 24 bytes, and the two large or
/// growing ones (an exact rolling log, a budget period) are boxed so a plain rate
/// item does not pay for them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ItemState {
    /// Never touched: every kind reads it as its empty state.
    #[default]
    Fresh,
    Rate(RateState),
    Counter(CounterState),
    Log(Box<LogState>),
    Approx(ApproxState),
    Budget(Box<BudgetState>),
    Concurrency(ConcurrencyState),
    Adaptive(Box<AdaptiveState>),
}

impl ItemState {
    /// Heap bytes this state owns: what memory budgets count beside the
    /// 32 bytes inline.
    pub fn heap_bytes(&self) -> usize {
        match self {
            ItemState::Log(l) => {
                std::mem::size_of::<LogState>()
                    + l.debits.capacity() * std::mem::size_of::<window::Debit>()
            }
            ItemState::Budget(_) => std::mem::size_of::<BudgetState>(),
            ItemState::Concurrency(c) => c.deadlines.capacity() * std::mem::size_of::<Nanos>(),
            ItemState::Adaptive(a) => {
                std::mem::size_of::<AdaptiveState>()
                    + a.slots.deadlines.capacity() * std::mem::size_of::<Nanos>()
            }
            ItemState::Fresh
            | ItemState::Rate(_)
            | ItemState::Counter(_)
            | ItemState::Approx(_) => 0,
        }
    }

    /// Whether every item reads this state as [`ItemState::Fresh`] at every
    /// instant, so it can be dropped without knowing its definition: nothing
    /// counted in a window, no open slot. Rate and budget states depend on
    /// the clock and their definition, so they are never judged empty here.
    pub fn is_empty(&self) -> bool {
        match self {
            ItemState::Fresh => true,
            ItemState::Counter(c) => c.used == 0,
            ItemState::Log(l) => l.debits.is_empty(),
            ItemState::Approx(a) => a.cur == 0 && a.prev == 0,
            ItemState::Concurrency(c) => c.deadlines.is_empty(),
            // A learned limit is not a fresh one.
            ItemState::Rate(_) | ItemState::Budget(_) | ItemState::Adaptive(_) => false,
        }
    }
}

/// What a pending debit on one item must remember to be released or committed
/// exactly (docs/semantics.md §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PendingItem {
    Rate(RatePending),
    /// Fixed or calendar window: the window it was charged in.
    Counter {
        window_start: Nanos,
    },
    /// Exact rolling window: the time of the debit.
    Log {
        at: Nanos,
    },
    /// Approximate rolling window: the bucket it was charged in.
    Approx {
        bucket: Nanos,
    },
    /// Budget: the period it was charged in.
    Budget {
        period_start: Nanos,
    },
    /// Concurrency and adaptive: the slot, identified by its deadline.
    Concurrency {
        deadline: Nanos,
    },
}

/// The figures of one item in a decision (docs/semantics.md §3.3). Times in ns, exact
/// values rounded up; the API rounds them up again to milliseconds. A [`Span`],
/// not [`Nanos`]: a rate item's can exceed 2^64 ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ItemFigures {
    pub allowed: bool,
    pub limit: u64,
    pub remaining: u64,
    pub reset_after: Span,
    /// `None` when the item allows, and when it denies a request that can never
    /// pass.
    pub retry_after: Option<Span>,
}

/// How a debit is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// Applied at once; nothing to release later.
    Immediate,
    /// Pending under a reservation that expires at `deadline`.
    Reserve { deadline: Nanos },
}

/// Result of probing one item.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Probe {
    pub allowed: bool,
    /// For rate items, the computed slot (used again by apply, and by delay mode).
    rate: Option<RateProbe>,
}

impl Probe {
    /// A probe of an item that is not a rate.
    pub(crate) fn plain(allowed: bool) -> Probe {
        Probe {
            allowed,
            rate: None,
        }
    }
}

// Typed views of an item's state. A state of the wrong variant can only come from
// an item whose definition changed without its state being reset; reading it as
// fresh is the documented rule for a changed item (docs/semantics.md §5.3).
macro_rules! state_as {
    ($fn:ident, $fn_mut:ident, $variant:ident, $ty:ty) => {
        // The exact rolling log is read in place, never copied, so its reader
        // goes unused.
        #[allow(dead_code)]
        fn $fn(st: &ItemState) -> $ty {
            match st {
                ItemState::$variant(s) => {
                    let r: &$ty = std::borrow::Borrow::borrow(s);
                    r.clone()
                }
                _ => <$ty>::default(),
            }
        }
        fn $fn_mut(st: &mut ItemState) -> &mut $ty {
            if !matches!(st, ItemState::$variant(_)) {
                *st = ItemState::$variant(Default::default());
            }
            match st {
                ItemState::$variant(s) => std::borrow::BorrowMut::borrow_mut(s),
                // Just set above.
                _ => unreachable!("state variant was set on the line before"),
            }
        }
    };
}

// `Borrow` reads both the inline variants and the boxed ones (`Box<T>: Borrow<T>`).
state_as!(rate_of, rate_mut, Rate, RateState);
state_as!(counter_of, counter_mut, Counter, CounterState);
state_as!(log_of, log_mut, Log, LogState);
state_as!(approx_of, approx_mut, Approx, ApproxState);
state_as!(budget_of, budget_mut, Budget, BudgetState);

/// A budget item's state, as of its last write (fresh: the default).
pub(crate) fn budget_state(st: &ItemState) -> BudgetState {
    budget_of(st)
}
state_as!(conc_of, conc_mut, Concurrency, ConcurrencyState);
state_as!(adaptive_of, adaptive_mut, Adaptive, AdaptiveState);

/// An adaptive state read in place (the fresh one for another variant).
fn adaptive_ref(st: &ItemState) -> &AdaptiveState {
    static FRESH: AdaptiveState = AdaptiveState {
        slots: ConcurrencyState {
            deadlines: Vec::new(),
        },
        ctl: None,
    };
    match st {
        ItemState::Adaptive(a) => a,
        _ => &FRESH,
    }
}

/// A counter's tag: a hash of the item's name (explicit, or `<kind>-<index>`)
/// and of what its state means ([`Item::state_class`]). The counter belongs
/// to the item, not to its definition as written (docs/semantics.md §5.3): a
/// changed limit, amount, length or time zone keeps it, and the item's own
/// reading converts what must be; adding, removing or moving another item
/// leaves it where it is. A change of kind (or of a window's algorithm)
/// gives another tag, so the item starts empty. Two items of one owner never
/// share a tag: compiling refuses a definition where they would.
pub fn counter_tag(name: &str, item: &Item) -> u32 {
    let class = item.state_class();
    fnv1a(class.bytes().chain([0]).chain(name.bytes()))
}

/// 32-bit FNV-1a. Not for security: it only tells one item from another
/// within one owner's definition.
pub fn fnv1a(bytes: impl Iterator<Item = u8>) -> u32 {
    bytes.fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

impl Item {
    /// What this item's counter holds, as far as its meaning goes: a rate's
    /// or a gap's theoretical arrival time, a fixed or calendar window's
    /// count, an exact rolling log, an approximate window's buckets of one
    /// length, a budget's period, open slots. An edit that keeps the class
    /// keeps the counter (converted where it must be, docs/semantics.md
    /// §5.3); one that changes it starts the item empty.
    pub fn state_class(&self) -> std::borrow::Cow<'static, str> {
        use std::borrow::Cow;
        match self {
            Item::Rate { kind, .. } => Cow::Borrowed(kind.as_str()),
            Item::Window(w) => match &w.layout {
                // Both count units in one window; their bounds convert.
                Layout::Fixed { .. } | Layout::Calendar(_) => Cow::Borrowed("window/count"),
                Layout::Rolling { .. } => Cow::Borrowed("window/log"),
                // Buckets of another length cannot be re-cut: the length is
                // part of what the state means.
                Layout::Approximate { w } => Cow::Owned(format!("window/approximate/{w}")),
            },
            Item::Budget(_) => Cow::Borrowed("budget"),
            Item::Concurrency(_) => Cow::Borrowed("concurrency"),
            Item::Adaptive(_) => Cow::Borrowed("adaptive"),
        }
    }

    pub fn kind(&self) -> Kind {
        match self {
            Item::Rate { kind, .. } => *kind,
            Item::Window(_) => Kind::Window,
            Item::Budget(_) => Kind::Budget,
            Item::Concurrency(_) => Kind::Concurrency,
            Item::Adaptive(_) => Kind::Adaptive,
        }
    }

    /// The `limit` figure of the definition: burst (rate), 1 (gap), limit
    /// (window), amount (budget), max (concurrency), the ceiling `max`
    /// (adaptive; [`Item::limit_at`] is its current limit).
    pub fn limit(&self) -> u64 {
        match self {
            Item::Rate { rate, .. } => rate.burst(),
            Item::Window(w) => w.limit,
            Item::Budget(b) => b.limit(),
            Item::Concurrency(c) => c.max,
            Item::Adaptive(a) => a.max,
        }
    }

    /// The `limit` figure a decision reports for state `st`: [`Item::limit`],
    /// but an adaptive item's limit as it is now for this key.
    pub fn limit_at(&self, st: &ItemState) -> u64 {
        match self {
            Item::Adaptive(a) => a.limit_of(adaptive_ref(st)),
            _ => self.limit(),
        }
    }

    /// This item as a class with `share` (millionths, below the whole)
    /// sees it: its limit at ⌈share × limit⌉, over the same state
    /// ([`priority`]). A rate keeps its rate and lowers its burst (the TAT
    /// means the same to both); a budget keeps its pacing and scales the cap
    /// it computes, since scaling its amount would move an adaptive plan.
    pub fn for_share(&self, share: priority::Share) -> Item {
        match self {
            Item::Rate { rate, kind } => Item::Rate {
                rate: rate.with_burst(priority::scaled(rate.burst(), share)),
                kind: *kind,
            },
            Item::Window(w) => Item::Window(Window {
                limit: priority::scaled(w.limit, share),
                layout: w.layout.clone(),
            }),
            Item::Budget(b) => Item::Budget(b.with_share(share)),
            Item::Concurrency(c) => Item::Concurrency(Concurrency {
                max: priority::scaled(c.max, share),
            }),
            // The limit moves, so the share is applied to it when read.
            Item::Adaptive(a) => Item::Adaptive(Adaptive { share, ..a.clone() }),
        }
    }

    /// Would `n` units fit at `now`? Changes nothing. (n > 0.)
    pub(crate) fn probe(&self, st: &ItemState, now: Nanos, n: u64) -> Probe {
        let plain = |allowed| Probe {
            allowed,
            rate: None,
        };
        match self {
            Item::Rate { rate, .. } => {
                let p = match st {
                    ItemState::Rate(s) => rate.probe(s, now, n),
                    _ => rate.probe(&RateState::default(), now, n),
                };
                Probe {
                    allowed: p.allowed,
                    rate: Some(p),
                }
            }
            Item::Window(w) => {
                let used = self.used(st, now);
                plain(used.checked_add(n).is_some_and(|u| u <= w.limit))
            }
            Item::Budget(b) => plain(b.allows(&budget_of(st), now, n)),
            Item::Concurrency(c) => match st {
                ItemState::Concurrency(s) => plain(c.allows(s, now)),
                _ => plain(c.allows(&ConcurrencyState::default(), now)),
            },
            Item::Adaptive(a) => {
                let s = adaptive_ref(st);
                plain(a.slots(s).allows(&s.slots, now))
            }
        }
    }

    /// Units a window item counts at `now` (pending and committed), which
    /// may be more than its limit after the limit was lowered
    /// (docs/semantics.md §5.3); `None` for the other kinds, whose use is
    /// read from their figures.
    pub fn counted(&self, st: &ItemState, now: Nanos) -> Option<u64> {
        matches!(self, Item::Window(_)).then(|| self.used(st, now))
    }

    /// Units counted by a window item at `now` (pending and committed).
    fn used(&self, st: &ItemState, now: Nanos) -> u64 {
        let Item::Window(w) = self else { return 0 };
        match &w.layout {
            Layout::Fixed { .. } | Layout::Calendar(_) => w.counter_view(&counter_of(st), now).used,
            Layout::Rolling { .. } => match st {
                ItemState::Log(l) => w.log_used(l, now),
                _ => 0,
            },
            Layout::Approximate { .. } => w.approx_view(&approx_of(st), now).used,
        }
    }

    /// `retry_after` for a denied probe (docs/semantics.md §2.1–§2.4, §5.5).
    pub(crate) fn retry(&self, st: &ItemState, probe: &Probe, now: Nanos, n: u64) -> Option<Span> {
        let wait = match self {
            Item::Rate { rate, .. } => {
                return probe.rate.and_then(|p| rate.retry_after(&p, now, n));
            }
            Item::Window(w) => match &w.layout {
                Layout::Fixed { .. } | Layout::Calendar(_) => {
                    w.counter_retry(&counter_of(st), now, n)
                }
                Layout::Rolling { .. } => match st {
                    ItemState::Log(l) => w.log_retry(l, now, n),
                    _ => w.log_retry(&LogState::default(), now, n),
                },
                Layout::Approximate { .. } => w.approx_retry(&approx_of(st), now, n),
            },
            Item::Budget(b) => b.retry(&budget_of(st), now, n),
            Item::Concurrency(c) => c.retry(&conc_of(st), now),
            Item::Adaptive(a) => {
                let s = adaptive_ref(st);
                a.slots(s).retry(&s.slots, now)
            }
        };
        // Only a rate item's wait can exceed 64 bits of ns.
        wait.map(Span::from)
    }

    /// Debits `n` units (the probe allowed it, or delay mode accepted its future
    /// slot). Returns what a release of this debit needs.
    pub(crate) fn apply(&self, st: &mut ItemState, now: Nanos, n: u64, hold: Hold) -> PendingItem {
        match self {
            Item::Rate { rate, .. } => {
                // Recomputed rather than carried over from the probe: the same
                // arithmetic on the same state gives the same slot (also the
                // future one delay mode accepted).
                let st = rate_mut(st);
                let p = rate.probe(st, now, n);
                PendingItem::Rate(rate.apply(st, &p, n))
            }
            Item::Window(w) => match &w.layout {
                Layout::Fixed { .. } | Layout::Calendar(_) => {
                    let s = counter_mut(st);
                    *s = w.current_counter(s, now);
                    s.used = s.used.saturating_add(n);
                    PendingItem::Counter {
                        window_start: s.start,
                    }
                }
                Layout::Rolling { .. } => PendingItem::Log {
                    at: w.log_push(log_mut(st), now, n),
                },
                Layout::Approximate { .. } => {
                    let s = approx_mut(st);
                    *s = w.current_approx(s, now);
                    s.cur = s.cur.saturating_add(n);
                    PendingItem::Approx {
                        bucket: s.cur_start,
                    }
                }
            },
            Item::Budget(b) => {
                let s = budget_mut(st);
                *s = b.current(s, now);
                match hold {
                    Hold::Immediate => s.spent = s.spent.saturating_add(n),
                    Hold::Reserve { .. } => s.pending = s.pending.saturating_add(n),
                }
                PendingItem::Budget {
                    period_start: s.start,
                }
            }
            Item::Concurrency(c) => {
                // An immediate check holds nothing (docs/semantics.md §2.4).
                let deadline = match hold {
                    Hold::Reserve { deadline } => {
                        c.hold(conc_mut(st), deadline, now);
                        deadline
                    }
                    Hold::Immediate => 0,
                };
                PendingItem::Concurrency { deadline }
            }
            Item::Adaptive(a) => {
                let deadline = match hold {
                    Hold::Reserve { deadline } => {
                        a.hold(adaptive_mut(st), deadline, now);
                        deadline
                    }
                    Hold::Immediate => 0,
                };
                PendingItem::Concurrency { deadline }
            }
        }
    }

    /// Figures of the state as it is at `now`: (remaining, reset_after).
    pub fn figures(&self, st: &ItemState, now: Nanos) -> (u64, Span) {
        let (remaining, reset_after) = match self {
            Item::Rate { rate, .. } => {
                // Only a rate item's reset can exceed 64 bits of ns.
                return match st {
                    ItemState::Rate(s) => rate.figures(s, now),
                    _ => (rate.burst(), 0),
                };
            }
            Item::Window(w) => {
                let view = match &w.layout {
                    Layout::Fixed { .. } | Layout::Calendar(_) => {
                        w.counter_view(&counter_of(st), now)
                    }
                    Layout::Rolling { .. } => match st {
                        ItemState::Log(l) => w.log_view(l, now),
                        _ => w.log_view(&LogState::default(), now),
                    },
                    Layout::Approximate { .. } => w.approx_view(&approx_of(st), now),
                };
                (w.limit.saturating_sub(view.used), view.reset_after)
            }
            Item::Budget(b) => {
                let v = b.view(&budget_of(st), now);
                let reset = if v.spent + v.pending > 0 {
                    v.period.1 - now
                } else {
                    0
                };
                (v.remaining(), reset)
            }
            Item::Concurrency(c) => match st {
                ItemState::Concurrency(s) => c.figures(s, now),
                _ => (c.max, 0),
            },
            Item::Adaptive(a) => {
                let s = adaptive_ref(st);
                a.slots(s).figures(&s.slots, now)
            }
        };
        (remaining, Span::from(reset_after))
    }

    /// Undoes a pending debit of `n` units as of `now` (docs/semantics.md §4.3): the debit
    /// goes back to the window or period it was charged in, if that is still
    /// current; a rate refund covers only what time has not already paid back.
    pub fn release(&self, st: &mut ItemState, pending: &PendingItem, n: u64, now: Nanos) {
        self.adjust(st, pending, -i128::from(n), now);
        match (self, pending) {
            (Item::Rate { rate, .. }, PendingItem::Rate(p)) => {
                rate.release(rate_mut(st), p, n, now)
            }
            (Item::Concurrency(c), PendingItem::Concurrency { deadline }) => {
                c.free(conc_mut(st), *deadline)
            }
            (Item::Adaptive(a), PendingItem::Concurrency { deadline }) => {
                let s = adaptive_mut(st);
                a.slots(s).free(&mut s.slots, *deadline)
            }
            (Item::Budget(b), PendingItem::Budget { period_start }) => {
                let s = budget_mut(st);
                *s = b.current(s, now);
                if charged_in(s.start, s.end, *period_start) {
                    s.pending = s.pending.saturating_sub(n);
                }
            }
            _ => {}
        }
    }

    /// Makes a pending debit of `n` permanent at `final_cost` (docs/semantics.md §4.2): a
    /// lower cost returns the difference, a higher one is charged even past the
    /// limit, always in the window or period the reservation was charged in.
    pub fn commit(
        &self,
        st: &mut ItemState,
        pending: &PendingItem,
        n: u64,
        final_cost: u64,
        now: Nanos,
    ) {
        match (self, pending) {
            (Item::Rate { rate, .. }, PendingItem::Rate(p)) => {
                if final_cost < n {
                    rate.release(rate_mut(st), p, n - final_cost, now);
                } else if final_cost > n {
                    rate.charge_extra(rate_mut(st), final_cost - n, now);
                }
            }
            (Item::Concurrency(c), PendingItem::Concurrency { deadline }) => {
                c.free(conc_mut(st), *deadline)
            }
            (Item::Adaptive(a), PendingItem::Concurrency { deadline }) => {
                let s = adaptive_mut(st);
                a.slots(s).free(&mut s.slots, *deadline)
            }
            (Item::Budget(b), PendingItem::Budget { period_start }) => {
                let s = budget_mut(st);
                *s = b.current(s, now);
                if charged_in(s.start, s.end, *period_start) {
                    s.pending = s.pending.saturating_sub(n);
                    s.spent = s.spent.saturating_add(final_cost);
                }
            }
            _ => self.adjust(st, pending, i128::from(final_cost) - i128::from(n), now),
        }
    }

    /// Gives back `n` units used at some earlier time, as of `now`, floored
    /// at nothing used (a refund, docs/rls.md "Reports and refunds"): a
    /// window's or budget's count in its current window or period goes down,
    /// the newest debits of an exact rolling window first (they would stay
    /// counted longest); a rate's time owed goes back, never before `now`.
    /// Concurrency and adaptive items count nothing an immediate use left.
    pub fn credit(&self, st: &mut ItemState, n: u64, now: Nanos) {
        if n == 0 || matches!(st, ItemState::Fresh) {
            return;
        }
        match self {
            Item::Rate { rate, .. } => rate.credit(rate_mut(st), n, now),
            Item::Window(w) => match &w.layout {
                Layout::Fixed { .. } | Layout::Calendar(_) => {
                    let s = counter_mut(st);
                    *s = w.current_counter(s, now);
                    s.used = s.used.saturating_sub(n);
                }
                Layout::Rolling { .. } => w.log_credit(log_mut(st), n, now),
                Layout::Approximate { .. } => w.approx_credit(approx_mut(st), n, now),
            },
            Item::Budget(b) => {
                let s = budget_mut(st);
                *s = b.current(s, now);
                s.spent = s.spent.saturating_sub(n);
            }
            Item::Concurrency(_) | Item::Adaptive(_) => {}
        }
    }

    /// Gives an adaptive item the sample a release or commit of `pending`
    /// carries, before that settles it (docs/adaptive.md, "In the engine");
    /// other kinds take no samples.
    pub fn report(&self, st: &mut ItemState, pending: &PendingItem, s: Sample, now: Nanos) {
        if let (Item::Adaptive(a), PendingItem::Concurrency { deadline }) = (self, pending) {
            a.report(adaptive_mut(st), *deadline, s, now);
        }
    }

    /// Adds `delta` to a window debit where it was charged, if still counted.
    fn adjust(&self, st: &mut ItemState, pending: &PendingItem, delta: i128, now: Nanos) {
        let Item::Window(w) = self else { return };
        match *pending {
            PendingItem::Counter { window_start } => {
                let s = counter_mut(st);
                *s = w.current_counter(s, now);
                if charged_in(s.start, s.end, window_start) {
                    s.used = (i128::from(s.used) + delta).clamp(0, i128::from(u64::MAX)) as u64;
                }
            }
            PendingItem::Log { at } => w.log_adjust(log_mut(st), at, delta, now),
            PendingItem::Approx { bucket } => w.approx_adjust(approx_mut(st), bucket, delta, now),
            _ => {}
        }
    }

    /// The first instant from which this state equals a fresh one if nothing else
    /// happens; a record whose items are all idle can be dropped without changing
    /// any future answer.
    pub fn idle_at(&self, st: &ItemState) -> Nanos {
        match (self, st) {
            (_, ItemState::Fresh) => 0,
            (Item::Rate { rate, .. }, ItemState::Rate(s)) => rate.idle_at(s),
            (Item::Window(_), ItemState::Counter(s)) => {
                if s.used == 0 {
                    0
                } else {
                    s.end
                }
            }
            (Item::Window(w), ItemState::Log(l)) => l
                .debits
                .back()
                .map_or(0, |d| d.at.saturating_add(window_len(w))),
            (Item::Window(w), ItemState::Approx(a)) => {
                let len = window_len(w);
                if a.cur > 0 {
                    a.cur_start.saturating_add(2 * len)
                } else if a.prev > 0 {
                    a.cur_start.saturating_add(len)
                } else {
                    0
                }
            }
            (Item::Budget(b), ItemState::Budget(s)) => b.idle_at(s),
            (Item::Concurrency(c), ItemState::Concurrency(s)) => c.idle_at(s),
            (Item::Adaptive(a), ItemState::Adaptive(s)) => a.idle_at(s),
            // A state of another kind is read as fresh.
            _ => 0,
        }
    }
}

/// Whether a debit charged in the window or period starting at `at` is
/// counted in `[start, end)`: the same window, or one an edit converted it
/// into (docs/semantics.md §5.3: a longer window that contains it). A debit
/// of an earlier window, or of a longer one an edit shortened, is not: its
/// release or commit changes nothing there, which keeps the units counted.
fn charged_in(start: Nanos, end: Nanos, at: Nanos) -> bool {
    start <= at && at < end
}

fn window_len(w: &Window) -> Nanos {
    match &w.layout {
        Layout::Fixed { w } | Layout::Rolling { w } | Layout::Approximate { w } => *w,
        Layout::Calendar(c) => calendar::nominal_nanos(c.unit),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_sizes_are_as_documented() {
        assert_eq!(std::mem::size_of::<RateState>(), 16);
        assert_eq!(std::mem::size_of::<CounterState>(), 24);
        assert_eq!(std::mem::size_of::<ApproxState>(), 24);
        assert_eq!(std::mem::size_of::<BudgetState>(), 72);
        assert_eq!(std::mem::size_of::<ItemState>(), 32);
    }
}
