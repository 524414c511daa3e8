//! Property tests over random request streams (docs/semantics.md §2).
//!
//! Each limit kind is replayed against an independent model of its semantics
//! (exact integer arithmetic throughout), and the stack's rules are checked on
//! random mixed stacks: denials change nothing, decisions are all-or-nothing,
//! a release never leaves more capacity than a reservation never made. Then
//! high rates are drained for ten simulated seconds without losing or gaining a
//! unit, and the keyed limiter is run under real threads and a small memory
//! budget.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use freqcap::clock::{MS, SECOND};
use freqcap::limits::{ItemState, Kind};
use freqcap::{
    Decision, Hold, KeyedLimiter, LimiterOptions, ManualClock, Nanos, Pending, PolicyDef, Stack,
};
use jiff::Timestamp;
use jiff::tz::TimeZone;
use proptest::prelude::*;
use proptest::sample::select;

/// 2026-05-28T20:26:40Z: far from the epoch, so epoch alignment matters.
const T0: Nanos = 1_780_000_000 * SECOND;
const HOUR: Nanos = 3_600 * SECOND;

// ---------------------------------------------------------------- helpers ----

fn policy_json(items: &[String]) -> String {
    format!(r#"{{"limits":[{}]}}"#, items.join(","))
}

fn policy(items: &[String]) -> PolicyDef {
    freqcap::model::from_json::<PolicyDef>(&policy_json(items)).expect("test policy parses")
}

fn compile(items: &[String]) -> Stack {
    policy(items).compile().expect("test policy compiles").stack
}

fn peek(stack: &Stack, st: &mut [ItemState], now: Nanos) -> Decision {
    stack.decide(st, now, 0, Hold::Immediate).0
}

/// splitmix64: long streams (thousands of steps) come from a seed proptest
/// chooses, rather than from huge generated vectors.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi` (modulo bias is irrelevant here).
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

/// One step of a request stream.
#[derive(Debug, Clone, Copy)]
enum Op {
    Check(u64),
    /// Cost and ttl.
    Reserve(u64, Nanos),
    /// Releases an open reservation (picked modulo the number open).
    Release(usize),
    /// Commits an open reservation at a final cost ≤ the reserved one (the second
    /// field picks it).
    Commit(usize, u64),
    Peek,
}

/// A reservation's ttl: random, or a round value that gaps often add up to, so
/// deadlines land exactly on decision instants.
fn ttl() -> impl Strategy<Value = Nanos> {
    prop_oneof![
        2 => MS..=5 * SECOND,
        1 => select(vec![MS, 50 * MS, 500 * MS, SECOND]),
    ]
}

fn op(max_cost: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1..=max_cost).prop_map(Op::Check),
        2 => (1..=max_cost, ttl()).prop_map(|(c, ttl)| Op::Reserve(c, ttl)),
        1 => any::<usize>().prop_map(Op::Release),
        1 => (any::<usize>(), any::<u64>()).prop_map(|(i, x)| Op::Commit(i, x)),
        1 => Just(Op::Peek),
    ]
}

/// Steps whose gap is `scale · g / 1000` ns, g in 0..=1000: often exactly 0, or
/// a round fraction of `scale`, so that events land exactly on window edges.
fn scaled_steps(
    max_cost: u64,
    len: std::ops::Range<usize>,
) -> impl Strategy<Value = Vec<(u64, Op)>> {
    let gap = prop_oneof![
        2 => Just(0u64),
        2 => select(vec![50u64, 250, 500, 1000]),
        6 => 0u64..=1000,
    ];
    prop::collection::vec((gap, op(max_cost)), len)
}

/// The largest integer a definition or a cost may hold.
const MAX_INT: u64 = (1 << 53) - 1;

/// Integers of a definition's whole range, often near its ends.
fn wide_int() -> impl Strategy<Value = u64> {
    prop_oneof![
        2 => 1u64..=20,
        2 => MAX_INT - 1000..=MAX_INT,
        2 => 1u64..=MAX_INT,
        1 => select(vec![1u64 << 52, 1_000_000_007, 3, 86_400_000]),
    ]
}

// ------------------------------------------------------------- rate (GCRA) ----

const PERS: &[(&str, Nanos)] = &[
    ("1ms", MS),
    ("7ms", 7 * MS),
    ("1s", SECOND),
    ("3s", 3 * SECOND),
    ("1m", 60 * SECOND),
];

/// (rate, per index, burst, events as (gap in thousandths of T, cost)).
type RateCase = (u64, usize, u64, Vec<(u64, u64)>);

fn rate_case() -> impl Strategy<Value = RateCase> {
    (1u64..=20, 0..PERS.len(), 1u64..=25).prop_flat_map(|(rate, per, burst)| {
        let gap = prop_oneof![1 => Just(0u64), 6 => 0u64..=3000];
        (
            Just(rate),
            Just(per),
            Just(burst),
            prop::collection::vec((gap, 1..=burst + 2), 1..80),
        )
    })
}

proptest! {
    /// A rate item never admits more than burst + rate·elapsed/per in any
    /// interval [t_i, t_j] of admitted events, and every decision and figure
    /// matches an exact model of GCRA (docs/semantics.md §2.1) kept in units of 1/rate ns.
    #[test]
    fn rate_never_exceeds_burst_plus_rate_times_elapsed(
        (rate, per_i, burst, events) in rate_case(),
        start_off in 0u64..SECOND,
    ) {
        let (per_s, per_ns) = PERS[per_i];
        let stack = compile(&[format!(
            r#"{{"kind":"rate","rate":{rate},"per":"{per_s}","burst":{burst}}}"#
        )]);
        let (r, per, b) = (u128::from(rate), u128::from(per_ns), u128::from(burst));
        let mut st = stack.fresh_state();
        let mut now = T0 + start_off;
        // The model's TAT times rate: T = per/rate becomes the integer `per`.
        let mut tat: u128 = 0;
        let mut admitted: Vec<(Nanos, u64)> = Vec::new();
        for (g, cost) in events {
            now += (per * u128::from(g) / (r * 1000)) as u64;
            let now_s = u128::from(now) * r;
            let new = tat.max(now_s) + u128::from(cost) * per;
            let fits = new - now_s <= b * per;
            let (d, _) = stack.decide(&mut st, now, cost, Hold::Immediate);
            prop_assert_eq!(d.allowed, fits, "at {} cost {}", now, cost);
            if fits {
                tat = new;
                admitted.push((now, cost));
            } else {
                let retry = (cost <= burst).then(|| (new - b * per - now_s).div_ceil(r) as u64);
                prop_assert_eq!(d.retry_after, retry.map(u128::from));
            }
            let ahead = tat.max(now_s) - now_s;
            prop_assert_eq!(u128::from(d.items[0].remaining), (b * per).saturating_sub(ahead) / per);
            prop_assert_eq!(d.items[0].reset_after, ahead.div_ceil(r));
        }
        // Every interval between two admitted events, both ends included.
        let mut prefix = vec![0u64];
        for &(_, c) in &admitted {
            prefix.push(prefix.last().unwrap() + c);
        }
        for (i, &(ti, _)) in admitted.iter().enumerate() {
            let lo = admitted.partition_point(|e| e.0 < ti);
            for &(tj, _) in &admitted[i..] {
                let hi = admitted.partition_point(|e| e.0 <= tj);
                let units = u128::from(prefix[hi] - prefix[lo]);
                let bound = b + r * u128::from(tj - ti) / per;
                prop_assert!(units <= bound, "{} units in [{}, {}], bound {}", units, ti, tj, bound);
            }
        }
    }
}

// ------------------------------------------- rate over the whole range ----

/// Periods from 1 ms to the longest a definition allows (10 000 days).
const LONG_PERS: &[(&str, Nanos)] = &[
    ("1ms", MS),
    ("7s", 7 * SECOND),
    ("1d", 86_400 * SECOND),
    ("3w", 21 * 86_400 * SECOND),
    ("10000d", 10_000 * 86_400 * SECOND),
];

/// One step of a stream over the whole range.
#[derive(Debug, Clone, Copy)]
enum WideOp {
    Check(u64),
    Reserve(u64),
    /// Releases an open reservation (picked modulo the number open).
    Release(usize),
    /// Commits an open reservation at any final cost, higher ones included.
    Commit(usize, u64),
    Peek,
}

/// A cost: a fraction of the burst (so many pass), or any in range.
fn wide_op() -> impl Strategy<Value = WideOp> {
    // Thousandths of the burst, or (top bit set) a cost taken as is.
    let cost = prop_oneof![
        3 => 1u64..=1000,
        1 => wide_int().prop_map(|c| c | (1 << 63)),
    ];
    prop_oneof![
        4 => cost.clone().prop_map(WideOp::Check),
        2 => cost.prop_map(WideOp::Reserve),
        1 => any::<usize>().prop_map(WideOp::Release),
        2 => (any::<usize>(), wide_int()).prop_map(|(i, c)| WideOp::Commit(i, c)),
        1 => Just(WideOp::Peek),
    ]
}

/// A gap: none, a few ns, a fraction of the emission interval, or up to a
/// few years, so that streams run until past 2^64 ns only through TATs.
fn wide_gap() -> impl Strategy<Value = (u64, u64)> {
    prop_oneof![
        2 => Just((0u64, 0u64)),
        1 => (1u64..=1000).prop_map(|ns| (0, ns)),
        3 => (1u64..=3000).prop_map(|g| (g, 0)),
        1 => (0u64..=100_000_000_000_000_000).prop_map(|ns| (0, ns)),
    ]
}

proptest! {
    /// Rate items over the whole range definitions allow (rates, bursts and
    /// costs up to 2^53 − 1, periods up to 10 000 days, commits far past the
    /// burst) decide and report exactly what docs/semantics.md §2.1 says, computed here
    /// with TAT·rate in plain `u128` (T = per/rate becomes the integer `per`).
    /// The TAT runs far past 2^64 ns; nothing may be clipped.
    #[test]
    fn rate_is_exact_over_the_whole_range(
        rate in wide_int(),
        per_i in 0..LONG_PERS.len(),
        burst in wide_int(),
        ops in prop::collection::vec((wide_gap(), wide_op()), 1..60),
    ) {
        let (per_s, per_ns) = LONG_PERS[per_i];
        let stack = compile(&[format!(
            r#"{{"kind":"rate","rate":{rate},"per":"{per_s}","burst":{burst}}}"#
        )]);
        let (r, per, b) = (u128::from(rate), u128::from(per_ns), u128::from(burst));
        let tau = b * per;
        let mut st = stack.fresh_state();
        let mut now = T0;
        let mut tat: u128 = 0;
        // Open reservations: (engine's pending, n, tat_r in model units).
        let mut open: Vec<(Pending, u64, u128)> = Vec::new();
        // The model's figures at `now_s`: (remaining, reset_after in ns).
        let figures = |tat: u128, now_s: u128| {
            let ahead = tat.max(now_s) - now_s;
            (tau.saturating_sub(ahead) / per, ahead.div_ceil(r))
        };
        for ((g, ns), op) in ops {
            // g thousandths of T = per/rate ns, plus ns.
            let step = (per * u128::from(g) / (r * 1000)) as u64 + ns;
            now = now.checked_add(step).filter(|t| *t < 1 << 63).unwrap_or(now);
            let now_s = u128::from(now) * r;
            let cost_of = |c: u64| {
                if c >> 63 == 1 {
                    c & MAX_INT
                } else {
                    // c thousandths of the burst, at least 1.
                    (burst / 1000 * c).clamp(1, burst)
                }
            };
            let refund = |tat: u128, n: u64, tat_r: u128| {
                let d = (u128::from(n) * per).min(tat_r.saturating_sub(now_s));
                tat.saturating_sub(d).max(now_s)
            };
            match op {
                WideOp::Check(c) | WideOp::Reserve(c) => {
                    let n = cost_of(c);
                    let reserve = matches!(op, WideOp::Reserve(_));
                    let hold = if reserve {
                        Hold::Reserve { deadline: now + HOUR }
                    } else {
                        Hold::Immediate
                    };
                    let new = tat.max(now_s) + u128::from(n) * per;
                    let fits = new - now_s <= tau;
                    let (d, p) = stack.decide(&mut st, now, n, hold);
                    prop_assert_eq!(d.allowed, fits, "cost {} at {}", n, now);
                    let f = &d.items[0];
                    if fits {
                        tat = new;
                        prop_assert_eq!(f.retry_after, None);
                        if reserve {
                            open.push((p.expect("an allowed reserve holds"), n, new));
                        }
                    } else {
                        let retry = (n <= burst).then(|| (new - tau - now_s).div_ceil(r));
                        prop_assert_eq!(f.retry_after, retry);
                        prop_assert_eq!(d.retry_after, retry);
                    }
                    let (remaining, reset) = figures(tat, now_s);
                    prop_assert_eq!(u128::from(f.remaining), remaining);
                    prop_assert_eq!(f.reset_after, reset);
                }
                WideOp::Release(i) if !open.is_empty() => {
                    let (p, n, tat_r) = open.swap_remove(i % open.len());
                    stack.release(&mut st, &p, now);
                    tat = refund(tat, n, tat_r);
                }
                WideOp::Commit(i, final_cost) if !open.is_empty() => {
                    let (p, n, tat_r) = open.swap_remove(i % open.len());
                    stack.commit(&mut st, &p, final_cost, now);
                    if final_cost < n {
                        tat = refund(tat, n - final_cost, tat_r);
                    } else {
                        tat = tat.max(now_s) + u128::from(final_cost - n) * per;
                    }
                }
                _ => {}
            }
            let d = peek(&stack, &mut st, now);
            let (remaining, reset) = figures(tat, now_s);
            prop_assert_eq!(u128::from(d.items[0].remaining), remaining, "peek at {}", now);
            prop_assert_eq!(d.items[0].reset_after, reset, "peek at {}", now);
        }
    }
}

// ----------------------------------------------------------------- windows ----

/// A debit as the model sees it: its time, its cost as of now (after releases
/// and commits), and the window (or bucket) it was charged in.
#[derive(Debug, Clone, Copy)]
struct Ev {
    at: Nanos,
    cost: u64,
    key: (i64, i64, i64),
}

/// An independent model of a window item's counting (docs/semantics.md §2.2).
enum Model {
    Fixed(Nanos),
    Rolling(Nanos),
    Approx(Nanos),
    /// Zone and unit (`1h`, `1d`, `1w`, `1mo`).
    Calendar(TimeZone, &'static str),
}

impl Model {
    /// The window (fixed, calendar) or bucket (approximate) an instant is in.
    /// Calendar windows are the local hour (told apart by offset when repeated),
    /// local date, ISO week or month: a period starts at the first instant
    /// with its local date, which is exactly grouping instants by local date.
    fn key(&self, t: Nanos) -> (i64, i64, i64) {
        match self {
            Model::Fixed(w) | Model::Approx(w) => ((t / w) as i64, 0, 0),
            Model::Rolling(_) => (0, 0, 0),
            Model::Calendar(tz, unit) => {
                let z = Timestamp::from_nanosecond(i128::from(t))
                    .unwrap()
                    .to_zoned(tz.clone());
                let d = z.date();
                let day =
                    i64::from(d.year()) * 10_000 + i64::from(d.month()) * 100 + i64::from(d.day());
                match *unit {
                    "1h" => (day, i64::from(z.hour()), i64::from(z.offset().seconds())),
                    "1d" => (day, 0, 0),
                    "1w" => {
                        let w = d.iso_week_date();
                        (i64::from(w.year()), i64::from(w.week()), 0)
                    }
                    _ => (i64::from(d.year()), i64::from(d.month()), 0),
                }
            }
        }
    }

    /// What the item counts at `now` (the decision's `used`).
    fn used(&self, evs: &[Ev], now: Nanos) -> u64 {
        match self {
            Model::Fixed(_) | Model::Calendar(..) => {
                let k = self.key(now);
                evs.iter().filter(|e| e.key == k).map(|e| e.cost).sum()
            }
            Model::Rolling(w) => evs.iter().filter(|e| e.at + w > now).map(|e| e.cost).sum(),
            Model::Approx(w) => {
                let cs = now / w * w;
                let cur: u64 = evs.iter().filter(|e| e.at >= cs).map(|e| e.cost).sum();
                let prev: u64 = evs
                    .iter()
                    .filter(|e| e.at >= cs - w && e.at < cs)
                    .map(|e| e.cost)
                    .sum();
                let left = u128::from(w - (now - cs));
                (u128::from(prev) * left / u128::from(*w)) as u64 + cur
            }
        }
    }

    /// The true count the limit promises to bound: the window's content, or for
    /// an approximate window the current bucket's.
    fn true_count(&self, evs: &[Ev], now: Nanos) -> u64 {
        match self {
            Model::Approx(w) => {
                let cs = now / w * w;
                evs.iter().filter(|e| e.at >= cs).map(|e| e.cost).sum()
            }
            _ => self.used(evs, now),
        }
    }

    /// Whether a release or commit at `now` still reaches the debit: its window
    /// is current (fixed, calendar), it is in the window (rolling), or its
    /// bucket is current or previous (approximate). Otherwise it no longer
    /// counts anywhere and nothing changes.
    fn reaches(&self, e: &Ev, now: Nanos) -> bool {
        match self {
            Model::Fixed(_) | Model::Calendar(..) => e.key == self.key(now),
            Model::Rolling(w) => e.at + w > now,
            Model::Approx(w) => e.at / w + 1 >= now / w,
        }
    }
}

/// Replays `steps` (gaps in thousandths of `scale`) on a one-window stack and
/// checks every decision and figure against `model`.
fn run_window(
    stack: &Stack,
    limit: u64,
    model: &Model,
    start: Nanos,
    scale: Nanos,
    steps: &[(u64, Op)],
) -> Result<(), TestCaseError> {
    let mut st = stack.fresh_state();
    let mut evs: Vec<Ev> = Vec::new();
    let mut open: Vec<(Pending, usize)> = Vec::new();
    let mut now = start;
    for &(g, op) in steps {
        now += scale * g / 1000;
        match op {
            Op::Check(cost) | Op::Reserve(cost, _) => {
                let hold = match op {
                    Op::Reserve(_, ttl) => Hold::Reserve {
                        deadline: now + ttl,
                    },
                    _ => Hold::Immediate,
                };
                let used = model.used(&evs, now);
                let (d, p) = stack.decide(&mut st, now, cost, hold);
                prop_assert_eq!(
                    d.allowed,
                    used + cost <= limit,
                    "at {} used {} cost {}",
                    now,
                    used,
                    cost
                );
                if d.allowed {
                    evs.push(Ev {
                        at: now,
                        cost,
                        key: model.key(now),
                    });
                    if let Some(p) = p {
                        open.push((p, evs.len() - 1));
                    }
                }
                let count = model.true_count(&evs, now);
                prop_assert!(
                    count <= limit,
                    "{} counted at {}, limit {}",
                    count,
                    now,
                    limit
                );
                prop_assert_eq!(d.remaining, limit.saturating_sub(model.used(&evs, now)));
            }
            Op::Release(i) if !open.is_empty() => {
                let (p, e) = open.swap_remove(i % open.len());
                stack.release(&mut st, &p, now);
                if model.reaches(&evs[e], now) {
                    evs[e].cost = 0;
                }
            }
            Op::Commit(i, x) if !open.is_empty() => {
                let (p, e) = open.swap_remove(i % open.len());
                let fin = p.cost - x % (p.cost + 1);
                stack.commit(&mut st, &p, fin, now);
                if model.reaches(&evs[e], now) {
                    evs[e].cost = fin;
                }
            }
            _ => {
                let d = peek(stack, &mut st, now);
                prop_assert_eq!(d.remaining, limit.saturating_sub(model.used(&evs, now)));
            }
        }
    }
    Ok(())
}

const WINDOWS: &[(&str, Nanos)] = &[
    ("10ms", 10 * MS),
    ("250ms", 250 * MS),
    ("1s", SECOND),
    ("7s", 7 * SECOND),
    ("1m", 60 * SECOND),
];

proptest! {
    /// No window (t − W, t] of an exact rolling item ever holds more than its
    /// limit, and it allows exactly when the debits in the window leave room.
    #[test]
    fn rolling_exact_window_never_over_limit(
        limit in 1u64..=12,
        w in 0..WINDOWS.len(),
        start_off in 0u64..=SECOND,
        steps in scaled_steps(13, 1..80),
    ) {
        let (ws, wn) = WINDOWS[w];
        let stack = compile(&[format!(r#"{{"kind":"window","limit":{limit},"window":"{ws}"}}"#)]);
        run_window(&stack, limit, &Model::Rolling(wn), T0 + start_off, wn / 2, &steps)?;
    }

    /// A fixed window [k·W, (k+1)·W) never counts more than its limit.
    #[test]
    fn fixed_window_never_over_limit(
        limit in 1u64..=12,
        w in 0..WINDOWS.len(),
        start_off in 0u64..=60 * SECOND,
        steps in scaled_steps(13, 1..80),
    ) {
        let (ws, wn) = WINDOWS[w];
        let stack = compile(&[format!(
            r#"{{"kind":"window","limit":{limit},"window":"{ws}","align":"fixed"}}"#
        )]);
        run_window(&stack, limit, &Model::Fixed(wn), T0 + start_off, wn / 2, &steps)?;
    }

    /// Approximate rolling windows: decisions follow the floored two-bucket
    /// estimate exactly, and the estimate never lets the true count of the
    /// current bucket exceed the limit.
    #[test]
    fn approximate_window_never_lets_current_bucket_exceed_limit(
        limit in 1u64..=30,
        w in 0..WINDOWS.len(),
        start_off in 0u64..=60 * SECOND,
        steps in scaled_steps(31, 1..80),
    ) {
        let (ws, wn) = WINDOWS[w];
        let stack = compile(&[format!(
            r#"{{"kind":"window","limit":{limit},"window":"{ws}","precision":"approximate"}}"#
        )]);
        run_window(&stack, limit, &Model::Approx(wn), T0 + start_off, wn / 2, &steps)?;
    }
}

/// Approximate windows up to the longest a definition allows.
const APPROX_WINDOWS: &[(&str, Nanos)] = &[
    ("7ms", 7 * MS),
    ("1s", SECOND),
    ("1m", 60 * SECOND),
    ("1d", 86_400 * SECOND),
    ("10000d", 10_000 * 86_400 * SECOND),
];

proptest! {
    /// An approximate window's `retry_after` is the earliest instant at which
    /// the decaying estimate plus n fits (docs/semantics.md §2.2): at now + retry it fits,
    /// one ns earlier it does not, by an independent model of the estimate
    /// (the debits bucketed from scratch). Limits and costs span the whole
    /// range, up to 2^53 − 1.
    #[test]
    fn approximate_retry_is_the_earliest_instant_that_fits(
        limit in wide_int(),
        w_i in 0..APPROX_WINDOWS.len(),
        start_off in 0u64..=1000,
        debits in prop::collection::vec((0u64..=1500, 1u64..=1000), 0..8),
        probe in 0u64..=1500,
        n_permille in prop_oneof![1u64..=1000, Just(1000)],
    ) {
        let (ws, w) = APPROX_WINDOWS[w_i];
        let stack = compile(&[format!(
            r#"{{"kind":"window","limit":{limit},"window":"{ws}","precision":"approximate"}}"#
        )]);
        let model = Model::Approx(w);
        let at = |thousandths: u64| (u128::from(w) * u128::from(thousandths) / 1000) as u64;
        let cost = |permille: u64| (limit / 1000 * permille).clamp(1, limit);
        let mut st = stack.fresh_state();
        let mut evs: Vec<Ev> = Vec::new();
        let mut now = T0 + at(start_off);
        for (gap, permille) in debits {
            now += at(gap);
            let n = cost(permille);
            let fits = model.used(&evs, now) + n <= limit;
            let (d, _) = stack.decide(&mut st, now, n, Hold::Immediate);
            prop_assert_eq!(d.allowed, fits);
            if fits {
                evs.push(Ev { at: now, cost: n, key: model.key(now) });
            }
        }
        now += at(probe);
        let n = cost(n_permille);
        let fits_at = |t: Nanos| model.used(&evs, t) + n <= limit;
        let d = peek(&stack, &mut st, now);
        prop_assert_eq!(u128::from(d.items[0].remaining), u128::from(limit - model.used(&evs, now).min(limit)));
        let (d, _) = stack.decide(&mut st, now, n, Hold::Immediate);
        prop_assert_eq!(d.allowed, fits_at(now));
        if !d.allowed {
            let retry = d.items[0].retry_after.expect("n ≤ limit can pass later");
            let retry = u64::try_from(retry).unwrap();
            prop_assert!(retry > 0);
            prop_assert!(fits_at(now + retry), "n {} does not fit at now + retry {}", n, retry);
            prop_assert!(!fits_at(now + retry - 1), "n {} fits 1 ns before retry {}", n, retry);
        }
    }
}

/// Time zones with DST: New York and Paris (an hour skipped at 02:00),
/// Santiago (midnight skipped: a day starts at 01:00).
const ZONES: &[&str] = &["America/New_York", "Europe/Paris", "America/Santiago"];

/// Calendar units with the gap scale of their streams.
const UNITS: &[(&str, Nanos)] = &[
    ("1h", 20 * 60 * SECOND),
    ("1d", 4 * HOUR),
    ("1w", 24 * HOUR),
    ("1mo", 4 * 24 * HOUR),
];

/// DST transitions of 2025–2027 in `tz`, and the starts of their local days.
fn anchors(tz: &TimeZone) -> Vec<Nanos> {
    let from: Timestamp = "2025-01-01T00:00:00Z".parse().unwrap();
    let mut out = Vec::new();
    for t in tz.following(from).take(6) {
        let ts = t.timestamp();
        out.push(ts.as_nanosecond() as Nanos);
        let day = ts.to_zoned(tz.clone()).start_of_day().unwrap();
        out.push(day.timestamp().as_nanosecond() as Nanos);
    }
    out
}

proptest! {
    /// Calendar windows (hour, day, ISO week, month) in DST zones never count
    /// more than their limit, over streams that cross DST transitions and
    /// midnights; each window is the set of instants sharing a local hour
    /// (and offset), date, ISO week or month, as computed by jiff.
    #[test]
    fn calendar_window_never_over_limit_across_dst(
        limit in 1u64..=8,
        zone in 0..ZONES.len(),
        unit in 0..UNITS.len(),
        anchor in any::<prop::sample::Index>(),
        back in 0u64..=20_000,
        steps in scaled_steps(9, 1..80),
    ) {
        let tz = TimeZone::get(ZONES[zone]).unwrap();
        let (us, scale) = UNITS[unit];
        let stack = compile(&[format!(
            r#"{{"kind":"window","limit":{limit},"window":"{us}","align":"calendar","tz":"{}"}}"#,
            ZONES[zone]
        )]);
        let a = anchors(&tz);
        let start = a[anchor.index(a.len())] - scale * back / 1000;
        run_window(&stack, limit, &Model::Calendar(tz, us), start, scale, &steps)?;
    }
}

// ------------------------------------------------------------------ budget ----

/// `[start, end)` of the New York hour or day containing `t`, computed apart
/// from the crate: New York's offsets are whole hours, so its local hours are
/// UTC hours; its days run from one local midnight to the next.
fn ny_period(unit: &str, t: Nanos) -> (Nanos, Nanos) {
    if unit == "1h" {
        return (t / HOUR * HOUR, t / HOUR * HOUR + HOUR);
    }
    let tz = TimeZone::get("America/New_York").unwrap();
    let z = Timestamp::from_nanosecond(i128::from(t))
        .unwrap()
        .to_zoned(tz.clone());
    let ns = |z: jiff::Zoned| z.start_of_day().unwrap().timestamp().as_nanosecond() as Nanos;
    let next = z.date().tomorrow().unwrap().to_zoned(tz).unwrap();
    (ns(z), ns(next))
}

proptest! {
    /// A budget allows exactly while spent + pending + n ≤ cap(now) (docs/semantics.md
    /// §2.3): cap = amount (asap) or min(amount, ceil(amount·f) + allowance)
    /// with f the share of the period elapsed (even); reservations count as
    /// pending in the period they were made in, and a release or commit only
    /// touches that period.
    #[test]
    fn budget_follows_its_pacing_line(
        amount in 1u64..=100,
        per in select(vec!["1h", "1d"]),
        even in any::<bool>(),
        bp in select(vec![0u64, 100, 1_000, 2_500]),
        anchor in any::<prop::sample::Index>(),
        back in 0u64..=20_000,
        steps in scaled_steps(8, 1..80),
    ) {
        let tz = TimeZone::get("America/New_York").unwrap();
        let pacing = if even { "even" } else { "asap" };
        let tol = bp as f64 / 10_000.0;
        let stack = compile(&[format!(
            r#"{{"kind":"budget","amount":{amount},"per":"{per}","pacing":"{pacing}","tolerance":{tol},"tz":"America/New_York"}}"#
        )]);
        let scale = if per == "1h" { 20 * 60 * SECOND } else { 4 * HOUR };
        let allowance = amount * bp / 10_000;
        let cap = |now: Nanos| {
            if !even {
                return amount;
            }
            let (s, e) = ny_period(per, now);
            let paced = (u128::from(amount) * u128::from(now - s)).div_ceil(u128::from(e - s)) as u64;
            (paced + allowance).min(amount)
        };
        let a = anchors(&tz);
        let mut now = a[anchor.index(a.len())] - scale * back / 1000;
        let mut st = stack.fresh_state();
        // Per period start: (spent, pending).
        let mut periods: HashMap<Nanos, (u64, u64)> = HashMap::new();
        let mut open: Vec<(Pending, Nanos)> = Vec::new();
        for (g, op) in steps {
            now += scale * g / 1000;
            let p0 = ny_period(per, now).0;
            let (spent, pending) = periods.get(&p0).copied().unwrap_or_default();
            match op {
                Op::Check(cost) | Op::Reserve(cost, _) => {
                    let hold = match op {
                        Op::Reserve(_, ttl) => Hold::Reserve { deadline: now + ttl },
                        _ => Hold::Immediate,
                    };
                    let (d, p) = stack.decide(&mut st, now, cost, hold);
                    let fits = spent + pending + cost <= cap(now);
                    prop_assert_eq!(d.allowed, fits, "at {}: {}+{}+{} vs cap {}", now, spent, pending, cost, cap(now));
                    let e = periods.entry(p0).or_default();
                    if fits {
                        match p {
                            Some(p) => {
                                e.1 += cost;
                                open.push((p, p0));
                            }
                            None => e.0 += cost,
                        }
                    }
                    prop_assert_eq!(d.remaining, cap(now).saturating_sub(e.0 + e.1));
                }
                Op::Release(i) if !open.is_empty() => {
                    let (p, at) = open.swap_remove(i % open.len());
                    stack.release(&mut st, &p, now);
                    if at == p0 {
                        periods.get_mut(&at).unwrap().1 -= p.cost;
                    }
                }
                Op::Commit(i, x) if !open.is_empty() => {
                    let (p, at) = open.swap_remove(i % open.len());
                    let fin = p.cost - x % (p.cost + 1);
                    stack.commit(&mut st, &p, fin, now);
                    if at == p0 {
                        let e = periods.get_mut(&at).unwrap();
                        e.1 -= p.cost;
                        e.0 += fin;
                    }
                }
                _ => {
                    let d = peek(&stack, &mut st, now);
                    prop_assert_eq!(d.remaining, cap(now).saturating_sub(spent + pending));
                }
            }
        }
    }
}

// ------------------------------------------------------------- concurrency ----

proptest! {
    /// A concurrency item counts open reservations exactly (docs/semantics.md §2.4, §4.4):
    /// a reserve is allowed iff fewer than `max` are open (a deadline ≤ now has
    /// expired), an immediate check iff one is free and holds nothing; commit
    /// and release free the slot; remaining, reset_after and retry_after follow
    /// the open deadlines.
    #[test]
    fn concurrency_counts_open_reservations(
        max in 1u64..=5,
        start_off in 0u64..=SECOND,
        steps in scaled_steps(3, 1..80),
    ) {
        let stack = compile(&[format!(r#"{{"kind":"concurrency","max":{max}}}"#)]);
        let mut st = stack.fresh_state();
        // Open reservations: their pending debits and deadlines.
        let mut open: Vec<(Pending, Nanos)> = Vec::new();
        let mut now = T0 + start_off;
        for (g, op) in steps {
            now += SECOND * g / 1000;
            let mut live: Vec<Nanos> = open.iter().map(|o| o.1).filter(|&d| d > now).collect();
            let n = live.len() as u64;
            match op {
                Op::Check(cost) | Op::Reserve(cost, _) => {
                    let hold = match op {
                        Op::Reserve(_, ttl) => Hold::Reserve { deadline: now + ttl },
                        _ => Hold::Immediate,
                    };
                    let (d, p) = stack.decide(&mut st, now, cost, hold);
                    prop_assert_eq!(d.allowed, n < max, "at {}: {} open of {}", now, n, max);
                    if let (Some(p), Hold::Reserve { deadline }) = (p, hold) {
                        open.push((p, deadline));
                        live.push(deadline);
                    }
                    let f = d.items[0];
                    prop_assert_eq!(f.remaining, max - live.len() as u64);
                    prop_assert_eq!(f.reset_after, u128::from(live.iter().max().map_or(0, |d| d - now)));
                    let retry = live.iter().min().map(|d| d - now).filter(|_| !d.allowed);
                    prop_assert_eq!(f.retry_after, retry.map(u128::from));
                }
                Op::Release(i) if !open.is_empty() => {
                    let (p, _) = open.swap_remove(i % open.len());
                    stack.release(&mut st, &p, now);
                }
                Op::Commit(i, x) if !open.is_empty() => {
                    let (p, _) = open.swap_remove(i % open.len());
                    stack.commit(&mut st, &p, x % 5, now);
                }
                _ => {
                    let d = peek(&stack, &mut st, now);
                    prop_assert!(d.allowed);
                    prop_assert_eq!(d.remaining, max - n);
                }
            }
        }
    }
}

// ------------------------------------------------------------ mixed stacks ----

/// One item definition of any kind, with small numbers so limits bind.
fn item_json() -> impl Strategy<Value = String> {
    let profile = format!(
        r#"{{"profile":[{}]}}"#,
        (0..24)
            .map(|h| ((h * 7) % 5).to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
    prop_oneof![
        (1u64..=10, select(vec!["10ms", "1s", "3s"]), 1u64..=10).prop_map(|(r, p, b)| format!(
            r#"{{"kind":"rate","rate":{r},"per":"{p}","burst":{b}}}"#
        )),
        select(vec!["5ms", "1s"]).prop_map(|m| format!(r#"{{"kind":"gap","min":"{m}"}}"#)),
        (
            1u64..=10,
            select(vec!["100ms", "1s", "1m"]),
            select(vec![r#""align":"fixed""#, r#""align":"rolling""#, r#""precision":"approximate""#]),
        )
            .prop_map(|(l, w, a)| format!(r#"{{"kind":"window","limit":{l},"window":"{w}",{a}}}"#)),
        (1u64..=10, select(vec!["1h", "1d"])).prop_map(|(l, w)| format!(
            r#"{{"kind":"window","limit":{l},"window":"{w}","align":"calendar","tz":"America/New_York"}}"#
        )),
        (
            1u64..=50,
            select(vec!["1h", "1d"]),
            select(vec![r#""asap""#.to_owned(), r#""even""#.to_owned(), profile]),
            select(vec![0.0, 0.01, 0.1]),
        )
            .prop_map(|(a, per, pacing, tol)| {
                // A profile shares a period by local hour: not for 1h periods.
                let pacing = if per == "1h" && pacing.contains("profile") {
                    r#""even""#.to_owned()
                } else {
                    pacing
                };
                format!(
                    r#"{{"kind":"budget","amount":{a},"per":"{per}","pacing":{pacing},"tolerance":{tol},"tz":"America/New_York"}}"#
                )
            }),
        (1u64..=4).prop_map(|m| format!(r#"{{"kind":"concurrency","max":{m}}}"#)),
    ]
}

/// Gaps in ns: often none, mostly short, sometimes across windows and periods.
fn mixed_gap() -> impl Strategy<Value = Nanos> {
    prop_oneof![
        2 => Just(0u64),
        1 => select(vec![MS, 50 * MS, 500 * MS, SECOND]),
        6 => 0..=50 * MS,
        2 => 0..=2 * SECOND,
        1 => 0..=2 * HOUR,
    ]
}

fn mixed_steps(len: std::ops::Range<usize>) -> impl Strategy<Value = Vec<(Nanos, Op)>> {
    prop::collection::vec((mixed_gap(), op(6)), len)
}

/// One decision seen by a replay.
struct Seen<'a> {
    before: &'a [ItemState],
    after: &'a [ItemState],
    now: Nanos,
    cost: u64,
    hold: Hold,
    decision: &'a Decision,
    pending: &'a Option<Pending>,
}

/// Replays `steps` on `stack` from `st`, calling `check` on every decision;
/// returns the time of the last step.
fn replay(
    stack: &Stack,
    st: &mut Vec<ItemState>,
    start: Nanos,
    steps: &[(Nanos, Op)],
    mut check: impl FnMut(&Seen) -> Result<(), TestCaseError>,
) -> Result<Nanos, TestCaseError> {
    let mut open: Vec<Pending> = Vec::new();
    let mut now = start;
    for &(gap, op) in steps {
        now += gap;
        let (cost, hold) = match op {
            Op::Check(c) => (c, Hold::Immediate),
            Op::Reserve(c, ttl) => (
                c,
                Hold::Reserve {
                    deadline: now + ttl,
                },
            ),
            Op::Release(i) if !open.is_empty() => {
                let p = open.swap_remove(i % open.len());
                stack.release(st, &p, now);
                continue;
            }
            Op::Commit(i, x) if !open.is_empty() => {
                let p = open.swap_remove(i % open.len());
                stack.commit(st, &p, p.cost - x % (p.cost + 1), now);
                continue;
            }
            _ => (0, Hold::Immediate),
        };
        let before = st.clone();
        let (decision, pending) = stack.decide(st, now, cost, hold);
        check(&Seen {
            before: &before,
            after: st,
            now,
            cost,
            hold,
            decision: &decision,
            pending: &pending,
        })?;
        if let Some(p) = pending {
            open.push(p);
        }
    }
    Ok(now)
}

/// The stack of `items`, or `None` when the validator rejects the combination
/// (a shorter window with a higher limit than a longer one).
fn try_compile(items: &[String]) -> Option<Stack> {
    policy(items).compile().ok().map(|c| c.stack)
}

proptest! {
    /// A denied request, and a peek, change nothing: the state vector before
    /// the decision equals the one after, and no reservation is made.
    #[test]
    fn denied_requests_change_nothing(
        items in prop::collection::vec(item_json(), 1..=3),
        start_off in 0u64..=24 * HOUR,
        steps in mixed_steps(1..80),
    ) {
        let stack = try_compile(&items);
        prop_assume!(stack.is_some());
        let stack = stack.unwrap();
        let mut st = stack.fresh_state();
        replay(&stack, &mut st, T0 + start_off, &steps, |s| {
            if !s.decision.allowed || s.cost == 0 {
                prop_assert_eq!(s.before, s.after, "denied at {} cost {}", s.now, s.cost);
                prop_assert!(s.pending.is_none());
            }
            Ok(())
        })?;
    }

    /// A 2–3 item stack is all-or-nothing: allowed exactly when every item alone
    /// would allow; then every item's state is what it alone would have made it
    /// (and changed, except a concurrency item under an immediate check, which
    /// holds nothing); when denied, no item's state changed.
    #[test]
    fn stack_is_all_or_nothing(
        items in prop::collection::vec(item_json(), 2..=3),
        start_off in 0u64..=24 * HOUR,
        steps in mixed_steps(1..80),
    ) {
        let stack = try_compile(&items);
        prop_assume!(stack.is_some());
        let stack = stack.unwrap();
        let singles: Vec<Stack> = items.iter().map(|i| compile(std::slice::from_ref(i))).collect();
        let mut st = stack.fresh_state();
        replay(&stack, &mut st, T0 + start_off, &steps, |s| {
            if s.cost == 0 {
                return Ok(());
            }
            let alone: Vec<(Decision, Vec<ItemState>)> = singles
                .iter()
                .zip(s.before)
                .map(|(single, b)| {
                    let mut one = vec![b.clone()];
                    let (d, _) = single.decide(&mut one, s.now, s.cost, s.hold);
                    (d, one)
                })
                .collect();
            let all = alone.iter().all(|(d, _)| d.allowed);
            prop_assert_eq!(s.decision.allowed, all);
            for (i, (d, one)) in alone.iter().enumerate() {
                let changed = s.before[i] != s.after[i];
                if s.decision.allowed {
                    prop_assert_eq!(&s.after[i], &one[0], "item {}", i);
                    prop_assert_eq!(s.decision.items[i], d.items[0], "item {}", i);
                    let holds_nothing = stack.items()[i].kind() == Kind::Concurrency
                        && s.hold == Hold::Immediate;
                    prop_assert!(changed || holds_nothing, "item {} unchanged by an allowed debit", i);
                } else {
                    prop_assert!(!changed, "item {} changed by a denied request", i);
                    if !d.allowed {
                        prop_assert_eq!(s.decision.items[i], d.items[0], "item {}", i);
                    }
                }
            }
            Ok(())
        })?;
    }

    /// A release never leaves more capacity than a reservation never made:
    /// twin states share a history; only one makes the reservation, both take
    /// every debit (immediate or reserved) it allows afterwards (which the twin
    /// must allow too), then it is released; at every later instant each
    /// item's remaining in the released state is at most the twin's.
    #[test]
    fn release_never_raises_capacity(
        items in prop::collection::vec(item_json(), 1..=3),
        start_off in 0u64..=24 * HOUR,
        prefix in mixed_steps(0..40),
        (gap_r, cost, ttl) in (mixed_gap(), 1u64..=6, ttl()),
        middle in prop::collection::vec((mixed_gap(), 1u64..=6, prop::option::of(ttl())), 0..10),
        gap_rel in mixed_gap(),
        peeks in prop::collection::vec(mixed_gap(), 1..8),
    ) {
        let stack = try_compile(&items);
        prop_assume!(stack.is_some());
        let stack = stack.unwrap();
        let mut a = stack.fresh_state();
        let mut now = replay(&stack, &mut a, T0 + start_off, &prefix, |_| Ok(()))?;
        let mut b = a.clone();
        now += gap_r;
        let (_, pending) = stack.decide(&mut a, now, cost, Hold::Reserve { deadline: now + ttl });
        let Some(pending) = pending else { return Ok(()) };
        for (gap, c, ttl) in middle {
            now += gap;
            let hold = ttl.map_or(Hold::Immediate, |ttl| Hold::Reserve { deadline: now + ttl });
            if stack.decide(&mut a, now, c, hold).0.allowed {
                let twin = stack.decide(&mut b, now, c, hold).0;
                prop_assert!(twin.allowed, "the twin without the reservation denied at {}", now);
            }
        }
        now += gap_rel;
        stack.release(&mut a, &pending, now);
        for gap in peeks {
            now += gap;
            let (da, db) = (peek(&stack, &mut a, now), peek(&stack, &mut b, now));
            for (i, (fa, fb)) in da.items.iter().zip(&db.items).enumerate() {
                prop_assert!(
                    fa.remaining <= fb.remaining,
                    "item {} ({}): {} remaining after release > {} without the reservation, at {}",
                    i, stack.name(i), fa.remaining, fb.remaining, now
                );
            }
        }
    }
}

// -------------------------------------------------------------- high rates ----

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// At 100 000/s and 1 000 000/s (and a prime rate whose interval is not a
    /// whole number of ns), draining as fast as allowed at many poll instants
    /// over 10 simulated seconds admits exactly burst + rate·elapsed: no unit
    /// lost or gained to rounding, whether taken whole, one by one, or reserved,
    /// released and taken again. Polls come at most (burst − 1)·T apart, so the
    /// bucket never fills up and no credit is capped away.
    #[test]
    fn high_rates_lose_and_gain_nothing(
        rate in select(vec![100_000u64, 1_000_000, 999_983]),
        burst_us in 200u64..=2_000,
        max_gap in select(vec![50_000u64, 300_000, 1_000_000]),
        seed in any::<u64>(),
        start_off in 0u64..SECOND,
    ) {
        // A burst worth `burst_us` of traffic, and polls close enough to drain it.
        let burst = rate * burst_us / 1_000_000;
        let max_gap = max_gap.min((burst - 1) * SECOND / rate);
        let stack = compile(&[format!(r#"{{"kind":"rate","rate":{rate},"per":"1s","burst":{burst}}}"#)]);
        let mut st = stack.fresh_state();
        let mut rng = Rng(seed);
        let t0 = T0 + start_off;
        let mut now = t0;
        let mut total = 0u64;
        let mut polls = 0u32;
        while now <= t0 + 10 * SECOND {
            let expected = u128::from(burst) + u128::from(now - t0) * u128::from(rate) / u128::from(SECOND);
            let r = peek(&stack, &mut st, now).remaining;
            prop_assert_eq!(u128::from(total + r), expected, "at +{} ns", now - t0);
            if r > 0 {
                match rng.next() % 4 {
                    0 => {
                        let (d, p) = stack.decide(&mut st, now, r, Hold::Reserve { deadline: now + SECOND });
                        prop_assert!(d.allowed);
                        prop_assert_eq!(d.remaining, 0);
                        stack.release(&mut st, &p.unwrap(), now);
                        prop_assert_eq!(peek(&stack, &mut st, now).remaining, r);
                        prop_assert!(stack.decide(&mut st, now, r, Hold::Immediate).0.allowed);
                    }
                    1 if r <= 16 => {
                        for _ in 0..r {
                            prop_assert!(stack.decide(&mut st, now, 1, Hold::Immediate).0.allowed);
                        }
                    }
                    _ => prop_assert!(stack.decide(&mut st, now, r, Hold::Immediate).0.allowed),
                }
            }
            prop_assert!(!stack.decide(&mut st, now, 1, Hold::Immediate).0.allowed);
            total += r;
            polls += 1;
            // Mostly coarse polls, with runs of gaps shorter than the interval.
            now += if rng.next().is_multiple_of(4) { rng.range(1, 3_000) } else { rng.range(1, max_gap) };
        }
        prop_assert!(polls > 1000);
    }
}

// ----------------------------------------------------------- keyed limiter ----

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// Four threads hammering overlapping keys at one frozen instant never admit
    /// more than a key's capacity (the least of its rate burst and its window
    /// limit) in total; draining afterwards reaches it exactly.
    #[test]
    fn keyed_limiter_threads_never_over_admit(
        burst in 1u64..=40,
        limit in 1u64..=40,
        nkeys in 1u64..=6,
        max_cost in 1u64..=3,
        rounds in 20u64..=200,
    ) {
        let policy = policy(&[
            format!(r#"{{"kind":"rate","rate":1,"per":"1h","burst":{burst}}}"#),
            format!(r#"{{"kind":"window","limit":{limit},"window":"1d","align":"fixed"}}"#),
        ]);
        let clock = ManualClock::new(T0);
        let limiter = KeyedLimiter::<u64, _>::with_clock(&policy, LimiterOptions::default(), clock).unwrap();
        let admitted: Vec<AtomicU64> = (0..nkeys).map(|_| AtomicU64::new(0)).collect();
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let (limiter, admitted) = (&limiter, &admitted);
                s.spawn(move || {
                    for i in 0..rounds * nkeys {
                        let key = (i + t) % nkeys;
                        let cost = 1 + (i * 7 + t) % max_cost;
                        if limiter.check(&key, cost).allowed {
                            admitted[key as usize].fetch_add(cost, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        let cap = burst.min(limit);
        for (key, a) in admitted.iter().enumerate() {
            let mut a = a.load(Ordering::Relaxed);
            prop_assert!(a <= cap, "key {}: {} admitted, capacity {}", key, a, cap);
            while limiter.check(&(key as u64), 1).allowed {
                a += 1;
            }
            prop_assert_eq!(a, cap, "key {}", key);
        }
    }

    /// With a small memory budget and many distinct keys that go idle soon after
    /// use (at most `active` requests in any stretch of the idle time),
    /// `memory_bytes()` never exceeds the budget, idle keys are evicted, and
    /// every decision equals that of an unbounded map of states: eviction is
    /// lossless. Records without heap (rate, fixed window) never force out an
    /// active key; exact rolling logs own heap, which a tiny shard share may
    /// not fit for every active key, so for them losslessness is checked up to
    /// the first active eviction (the budget must hold regardless).
    #[test]
    fn keyed_limiter_memory_bounded_and_eviction_lossless(
        budget_kib in 4usize..=32,
        shards in select(vec![1usize, 2, 4, 8]),
        active in 1u64..=4,
        kind in 0usize..3,
        nops in 3_000usize..=6_000,
        seed in any::<u64>(),
    ) {
        // Every policy returns a key to fresh at most 10 ms after its last debit.
        let item = [
            r#"{"kind":"rate","rate":1,"per":"10ms","burst":1}"#,
            r#"{"kind":"window","limit":3,"window":"10ms","align":"fixed"}"#,
            r#"{"kind":"window","limit":3,"window":"10ms"}"#,
        ][kind];
        let owns_heap = kind == 2;
        let policy = policy(&[item.to_owned()]);
        let idle = 10 * MS;
        let memory_budget = budget_kib << 10;
        let options = LimiterOptions { memory_budget, shards };
        let clock = std::sync::Arc::new(ManualClock::new(T0));
        let limiter = KeyedLimiter::<u64, _>::with_clock(&policy, options, clock.clone()).unwrap();
        let stack = limiter.stack().clone();
        let mut reference: HashMap<u64, Vec<ItemState>> = HashMap::new();
        let mut rng = Rng(seed);
        let mut next_key = 0u64;
        for _ in 0..nops {
            let now = clock.advance(rng.range(idle / active, 2 * idle / active));
            // Mostly new keys; some return after their state went idle.
            let key = if next_key > 0 && rng.next().is_multiple_of(4) {
                next_key - rng.range(1, next_key.min(200))
            } else {
                next_key += 1;
                next_key - 1
            };
            let cost = rng.range(1, 2);
            let got = limiter.check(&key, cost);
            let st = reference.entry(key).or_insert_with(|| stack.fresh_state());
            let (want, _) = stack.decide(st, now, cost, Hold::Immediate);
            if limiter.stats().evicted_active.load(Ordering::Relaxed) == 0 {
                prop_assert_eq!(&got, &want, "key {} at {}", key, now);
            }
            let used = limiter.memory_bytes();
            prop_assert!(used <= memory_budget, "{} bytes used, budget {}", used, memory_budget);
        }
        if !owns_heap {
            prop_assert_eq!(limiter.stats().evicted_active.load(Ordering::Relaxed), 0);
        }
        prop_assert!(limiter.stats().evicted_idle.load(Ordering::Relaxed) > 0);
    }
}
