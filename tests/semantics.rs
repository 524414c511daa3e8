//! Exact figures of every limit kind, computed by hand from docs/semantics.md §2 and checked
//! through the public API: a policy parsed from JSON, compiled to a [`Stack`], and
//! decided over a state vector.
//!
//! Every expected number is derived in a comment from the formulas of docs/semantics.md §2
//! (not from the code). Times are nanoseconds since the Unix epoch; `NOW` is
//! 2026-01-01T00:00:00Z, a Thursday, which is aligned to every whole second,
//! minute, hour and day. Reported nanosecond figures are exact values rounded up
//! (the API rounds them up again to milliseconds).

use freqcap::limits::Kind;
use freqcap::limits::stack::{Decision, Pending, Stack};
use freqcap::model::{PolicyDef, from_json};
use freqcap::{Hold, ItemFigures, limits::ItemState};

const NS: u64 = 1;
const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;
const MIN: u64 = 60 * S;
const H: u64 = 60 * MIN;
const D: u64 = 24 * H;

/// 2026-01-01T00:00:00Z.
const NOW: u64 = 1_767_225_600_000_000_000;

/// Nanoseconds since the epoch of a UTC civil time (Howard Hinnant's
/// days-from-civil), so calendar expectations do not depend on the time-zone
/// library under test.
fn utc(y: i64, m: i64, d: i64, h: u64, mi: u64, s: u64) -> u64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(days).unwrap() * D + h * H + mi * MIN + s * S
}

/// One key's state under a compiled policy.
struct Lim {
    stack: Stack,
    st: Vec<ItemState>,
}

impl Lim {
    fn new(json: &str) -> Lim {
        let policy: PolicyDef = from_json(json).unwrap_or_else(|e| panic!("{json}: {e}"));
        let stack = policy
            .compile()
            .unwrap_or_else(|e| panic!("{json}: {e}"))
            .stack;
        let st = stack.fresh_state();
        Lim { stack, st }
    }

    /// An immediate check; a denial must leave every item's state untouched.
    fn check(&mut self, now: u64, cost: u64) -> Decision {
        let before = self.st.clone();
        let (d, p) = self.stack.decide(&mut self.st, now, cost, Hold::Immediate);
        assert!(p.is_none(), "an immediate check returns no pending debit");
        if !d.allowed || cost == 0 {
            assert_eq!(self.st, before, "a denial or a peek changed state");
        }
        if d.allowed {
            assert_eq!(d.retry_after, None, "an allowed decision has no retry");
            assert!(d.items.iter().all(|f| f.allowed && f.retry_after.is_none()));
        } else {
            assert_eq!(d.delay, 0, "a denial has no delay");
        }
        d
    }

    /// A cost-0 peek: always allowed, changes nothing.
    fn peek(&mut self, now: u64) -> Decision {
        let d = self.check(now, 0);
        assert!(d.allowed);
        assert_eq!(d.delay, 0);
        d
    }

    /// The item figures of a peek, for before/after comparisons.
    fn figures(&mut self, now: u64) -> Vec<ItemFigures> {
        self.peek(now).items.to_vec()
    }

    fn reserve(&mut self, now: u64, cost: u64, ttl: u64) -> (Decision, Option<Pending>) {
        let before = self.st.clone();
        let (d, p) = self.stack.decide(
            &mut self.st,
            now,
            cost,
            Hold::Reserve {
                deadline: now + ttl,
            },
        );
        if !d.allowed || cost == 0 {
            assert!(p.is_none(), "a denied or zero-cost reserve holds nothing");
            assert_eq!(self.st, before);
        } else {
            assert!(p.is_some());
        }
        (d, p)
    }

    fn release(&mut self, p: &Pending, now: u64) {
        self.stack.release(&mut self.st, p, now);
    }

    fn commit(&mut self, p: &Pending, final_cost: u64, now: u64) {
        self.stack.commit(&mut self.st, p, final_cost, now);
    }
}

/// Figures of an item that allows.
fn ok(limit: u64, remaining: u64, reset_after: u64) -> ItemFigures {
    ItemFigures {
        allowed: true,
        limit,
        remaining,
        reset_after: reset_after.into(),
        retry_after: None,
    }
}

/// Figures of an item that denies.
fn no(limit: u64, remaining: u64, reset_after: u64, retry_after: Option<u64>) -> ItemFigures {
    ItemFigures {
        allowed: false,
        limit,
        remaining,
        reset_after: reset_after.into(),
        retry_after: retry_after.map(u128::from),
    }
}

/// Checks the decision-level figures.
#[track_caller]
fn assert_decision(
    d: &Decision,
    allowed: bool,
    retry_after: Option<u64>,
    remaining: u64,
    reset_after: u64,
    delay: u64,
) {
    assert_eq!(
        (
            d.allowed,
            d.retry_after,
            d.remaining,
            d.reset_after,
            d.delay
        ),
        (
            allowed,
            retry_after.map(u128::from),
            remaining,
            reset_after.into(),
            delay
        ),
        "decision (allowed, retry_after, remaining, reset_after, delay) of {d:?}"
    );
}

#[test]
fn civil_helper_matches_the_epoch_constants() {
    assert_eq!(utc(1970, 1, 1, 0, 0, 0), 0);
    assert_eq!(utc(2026, 1, 1, 0, 0, 0), NOW);
    assert_eq!(utc(2026, 3, 1, 0, 0, 0) - utc(2026, 2, 1, 0, 0, 0), 28 * D);
}

// ---------------------------------------------------------------- rate (§2.1)

#[test]
fn rate_three_per_second_figures_are_exact() {
    // T = 1s/3 = 333_333_333⅓ ns, burst = rate = 3, so burst·T = 1 s.
    let mut l = Lim::new(r#"{"limits":[{"kind":"rate","rate":3,"per":"1s"}]}"#);
    // 1st: TAT = NOW + T; remaining = floor((3T − T)/T) = 2; reset = ⌈T⌉.
    let d = l.check(NOW, 1);
    assert_eq!(d.items.as_slice(), &[ok(3, 2, 333_333_334)]);
    assert_decision(&d, true, None, 2, 333_333_334, 0);
    // 2nd: TAT = NOW + 2T = 666_666_666⅔ → ⌈⌉ = 666_666_667.
    assert_eq!(l.check(NOW, 1).items[0], ok(3, 1, 666_666_667));
    // 3rd: TAT = NOW + 3T = NOW + 1 s exactly.
    assert_eq!(l.check(NOW, 1).items[0], ok(3, 0, S));
    // 4th: new = NOW + 4T; new − now = 4T > 3T → denied;
    // retry = new − 3T − now = T → ⌈T⌉ = 333_333_334.
    let d = l.check(NOW, 1);
    assert_eq!(d.items.as_slice(), &[no(3, 0, S, Some(333_333_334))]);
    assert_decision(&d, false, Some(333_333_334), 0, S, 0);
    // 1 ns before the slot: retry = 4T − 3T − 333_333_333 = ⅓ ns → 1;
    // remaining = floor((333_333_333 + 3T − 3T)/T) = 0; reset = 1s − 333_333_333.
    let t = NOW + 333_333_333;
    assert_eq!(l.check(t, 1).items[0], no(3, 0, 666_666_667, Some(1)));
    // At ⌈NOW + T⌉ the 4th unit passes: TAT = NOW + 4T = NOW + 1_333_333_333⅓;
    // reset = ⌈1_333_333_333⅓ − 333_333_334⌉ = ⌈999_999_999⅓⌉ = 1 s;
    // remaining = floor((1 s − 999_999_999⅓ ns)/T) = 0.
    let t = NOW + 333_333_334;
    assert_eq!(l.check(t, 1).items[0], ok(3, 0, S));
}

#[test]
fn rate_three_per_second_admits_exactly_three_per_second() {
    // Polling every millisecond for 10 s: by time t, exactly 3 + floor(3t) units
    // pass (the burst of 3, then one every T = ⅓ s). At t = 10 s: 3 + 30 = 33.
    let mut l = Lim::new(r#"{"limits":[{"kind":"rate","rate":3,"per":"1s"}]}"#);
    let mut admitted = 0u64;
    for ms in 0..=10_000u64 {
        let now = NOW + ms * MS;
        while l.check(now, 1).allowed {
            admitted += 1;
        }
        assert_eq!(admitted, 3 + 3 * ms / 1000, "at {ms} ms");
    }
    assert_eq!(admitted, 33);
}

#[test]
fn rate_burst_and_credit_accumulation() {
    // rate 1 per 1s, burst 5: T = 1 s, burst·T = 5 s.
    let mut l = Lim::new(r#"{"limits":[{"kind":"rate","rate":1,"per":"1s","burst":5}]}"#);
    assert_eq!(l.peek(NOW).items[0], ok(5, 5, 0));
    // 5 at once after idling: new − now = 5 s ≤ 5 s; TAT = NOW + 5 s.
    assert_eq!(l.check(NOW, 5).items[0], ok(5, 0, 5 * S));
    // One more: new = NOW + 6 s, retry = 6 − 5 − 0 = 1 s.
    let d = l.check(NOW, 1);
    assert_eq!(d.items[0], no(5, 0, 5 * S, Some(S)));
    assert_decision(&d, false, Some(S), 0, 5 * S, 0);
    // After 2.5 s: remaining = floor((2.5 + 5 − 5)/1) = 2, reset = 2.5 s.
    assert_eq!(l.peek(NOW + 2_500 * MS).items[0], ok(5, 2, 2_500 * MS));
    // Idling 100 s accumulates only up to the burst.
    let later = NOW + 100 * S;
    assert_eq!(l.peek(later).items[0], ok(5, 5, 0));
    assert_eq!(l.check(later, 5).items[0], ok(5, 0, 5 * S));
    assert_eq!(l.check(later, 1).items[0], no(5, 0, 5 * S, Some(S)));
}

#[test]
fn rate_request_larger_than_burst_never_passes() {
    let mut l = Lim::new(r#"{"limits":[{"kind":"rate","rate":1,"per":"1s","burst":5}]}"#);
    // n = 6 > burst = 5: denied with retry null, on a fresh state...
    let d = l.check(NOW, 6);
    assert_eq!(d.items[0], no(5, 5, 0, None));
    assert_decision(&d, false, None, 5, 0, 0);
    // ...and on a used one.
    l.check(NOW, 2);
    assert_eq!(l.check(NOW, 6).items[0], no(5, 3, 2 * S, None));
    // n = burst is possible: new = NOW + 2 + 5 s, retry = 7 − 5 − 0 = 2 s.
    assert_eq!(l.check(NOW, 5).items[0], no(5, 3, 2 * S, Some(2 * S)));
}

#[test]
fn rate_peek_reports_without_debiting() {
    // rate 10 per 1s, burst 10: T = 100 ms, burst·T = 1 s.
    let mut l = Lim::new(r#"{"limits":[{"kind":"rate","rate":10,"per":"1s"}]}"#);
    l.check(NOW, 4); // TAT = NOW + 400 ms
    // At +150 ms: remaining = floor((150 + 1000 − 400)/100) = floor(7.5) = 7;
    // reset = 400 − 150 = 250 ms.
    let t = NOW + 150 * MS;
    let d = l.peek(t);
    assert_eq!(d.items[0], ok(10, 7, 250 * MS));
    assert_decision(&d, true, None, 7, 250 * MS, 0);
    // Twice, same answer: the peek debited nothing.
    assert_eq!(l.peek(t).items[0], ok(10, 7, 250 * MS));
    // Drain: 7 more → TAT = NOW + 1100 ms, 1100 − 150 = 950 ≤ 1000;
    // remaining = floor((150 + 1000 − 1100)/100) = floor(0.5) = 0.
    assert_eq!(l.check(t, 7).items[0], ok(10, 0, 950 * MS));
    // A peek on an exhausted item is still allowed.
    let d = l.peek(t);
    assert_eq!(d.items[0], ok(10, 0, 950 * MS));
    assert_decision(&d, true, None, 0, 950 * MS, 0);
    // And the next unit: new = 1200 ms, retry = 1200 − 1000 − 150 = 50 ms.
    assert_eq!(l.check(t, 1).items[0], no(10, 0, 950 * MS, Some(50 * MS)));
}

#[test]
fn rate_with_a_period_that_does_not_divide() {
    // 7 per 1m: T = 60/7 s = 8_571_428_571³⁄₇ ns; burst 2 → burst·T = 17_142_857_142⁶⁄₇.
    let mut l = Lim::new(r#"{"limits":[{"kind":"rate","rate":7,"per":"1m","burst":2}]}"#);
    assert_eq!(l.check(NOW, 2).items[0], ok(2, 0, 17_142_857_143));
    // Next: new = 3T, retry = 3T − 2T = T → ⌈⌉ = 8_571_428_572.
    assert_eq!(
        l.check(NOW, 1).items[0],
        no(2, 0, 17_142_857_143, Some(8_571_428_572))
    );
    // At NOW + 8_571_428_572 (just past T) one unit passes: TAT = 3T;
    // reset = ⌈25_714_285_714²⁄₇ − 8_571_428_572⌉ = ⌈17_142_857_142²⁄₇⌉.
    let t = NOW + 8_571_428_572;
    assert_eq!(l.check(t, 1).items[0], ok(2, 0, 17_142_857_143));
}

// ----------------------------------------------------------------- gap (§2.1)

#[test]
fn gap_is_a_minimum_interval() {
    // gap 10m = rate 1 per 10m, burst 1: limit 1.
    let mut l = Lim::new(r#"{"limits":[{"kind":"gap","min":"10m"}]}"#);
    assert_eq!(l.stack.items()[0].kind(), Kind::Gap);
    assert_eq!(l.stack.name(0), "gap-0");
    assert_eq!(l.peek(NOW).items[0], ok(1, 1, 0));
    assert_eq!(l.check(NOW, 1).items[0], ok(1, 0, 10 * MIN));
    // 5 min later: new = NOW + 20m, retry = 20m − 10m − 5m = 5 min.
    let d = l.check(NOW + 5 * MIN, 1);
    assert_eq!(d.items[0], no(1, 0, 5 * MIN, Some(5 * MIN)));
    assert_decision(&d, false, Some(5 * MIN), 0, 5 * MIN, 0);
    // 1 ns early: retry 1 ns.
    let t = NOW + 10 * MIN - NS;
    assert_eq!(l.check(t, 1).items[0], no(1, 0, 1, Some(1)));
    // Exactly 10 min later it passes.
    assert_eq!(l.check(NOW + 10 * MIN, 1).items[0], ok(1, 0, 10 * MIN));
    // Cost 2 > burst 1 never passes.
    assert_eq!(l.check(NOW + 30 * MIN, 2).items[0], no(1, 1, 0, None));
}

// ---------------------------------------------------------- window (§2.2)

#[test]
fn window_fixed_figures() {
    let mut l =
        Lim::new(r#"{"limits":[{"kind":"window","limit":3,"window":"1m","align":"fixed"}]}"#);
    // Window [NOW, NOW + 60 s). At +10 s: remaining 2, reset = 60 − 10 = 50 s.
    let t = NOW + 10 * S;
    assert_eq!(l.check(t, 1).items[0], ok(3, 2, 50 * S));
    assert_eq!(l.check(t, 2).items[0], ok(3, 0, 50 * S));
    // Denied: retry = window end − now = 40 s at +20 s.
    let d = l.check(NOW + 20 * S, 1);
    assert_eq!(d.items[0], no(3, 0, 40 * S, Some(40 * S)));
    assert_decision(&d, false, Some(40 * S), 0, 40 * S, 0);
    // n > limit: never.
    let d = l.check(NOW + 20 * S, 4);
    assert_eq!(d.items[0], no(3, 0, 40 * S, None));
    assert_decision(&d, false, None, 0, 40 * S, 0);
    // The last nanosecond of the window still counts it.
    let t = NOW + 60 * S - NS;
    assert_eq!(l.check(t, 1).items[0], no(3, 0, 1, Some(1)));
    // The next window starts empty: nothing counted → reset 0.
    assert_eq!(l.peek(NOW + 60 * S).items[0], ok(3, 3, 0));
    assert_eq!(l.check(NOW + 60 * S, 1).items[0], ok(3, 2, 60 * S));
}

#[test]
fn window_fixed_is_aligned_to_the_epoch() {
    // NOW = 1_767_225_600 s = 13 × 135_940_430 + 10 s, so the 13 s window holding
    // NOW is [NOW − 10 s, NOW + 3 s).
    let mut l =
        Lim::new(r#"{"limits":[{"kind":"window","limit":1,"window":"13s","align":"fixed"}]}"#);
    assert_eq!(l.check(NOW, 1).items[0], ok(1, 0, 3 * S));
    assert_eq!(l.check(NOW + 2 * S, 1).items[0], no(1, 0, S, Some(S)));
    assert_eq!(l.check(NOW + 3 * S, 1).items[0], ok(1, 0, 13 * S));
}

#[test]
fn window_calendar_day_of_23_hours_in_new_york() {
    // 2026-03-08: New York springs forward (02:00 EST → 03:00 EDT). The local day
    // starts at midnight EST = 05:00Z and ends at midnight EDT on 03-09 = 04:00Z:
    // 23 hours.
    let mut l = Lim::new(
        r#"{"limits":[{"kind":"window","limit":2,"window":"1d","align":"calendar","tz":"America/New_York"}]}"#,
    );
    let start = utc(2026, 3, 8, 5, 0, 0);
    let end = utc(2026, 3, 9, 4, 0, 0);
    assert_eq!(end - start, 23 * H);
    // 1 s before: still 2026-03-07 local (23:59:59 EST), which ends at `start`.
    assert_eq!(l.check(start - S, 2).items[0], ok(2, 0, S));
    assert_eq!(l.peek(start).items[0], ok(2, 2, 0));
    // A debit at the day's first instant: reset = 23 h.
    assert_eq!(l.check(start, 1).items[0], ok(2, 1, 23 * H));
    // At 12:00Z (08:00 EDT): reset = 04:00Z + 1d − 12:00Z = 16 h.
    let noon = utc(2026, 3, 8, 12, 0, 0);
    assert_eq!(l.check(noon, 1).items[0], ok(2, 0, 16 * H));
    assert_eq!(l.check(noon, 1).items[0], no(2, 0, 16 * H, Some(16 * H)));
    assert_eq!(l.check(end - NS, 1).items[0], no(2, 0, 1, Some(1)));
    // 03-09 is a 24 h day.
    assert_eq!(l.check(end, 1).items[0], ok(2, 1, 24 * H));
}

#[test]
fn window_calendar_day_of_25_hours_in_new_york() {
    // 2026-11-01: New York falls back (02:00 EDT → 01:00 EST). The day starts at
    // midnight EDT = 04:00Z and ends at midnight EST on 11-02 = 05:00Z: 25 hours.
    let mut l = Lim::new(
        r#"{"limits":[{"kind":"window","limit":2,"window":"1d","align":"calendar","tz":"America/New_York"}]}"#,
    );
    let start = utc(2026, 11, 1, 4, 0, 0);
    let end = utc(2026, 11, 2, 5, 0, 0);
    assert_eq!(l.check(start, 1).items[0], ok(2, 1, 25 * H));
    // 23:59 EST = 04:59Z on 11-02: 1 minute left.
    let late = utc(2026, 11, 2, 4, 59, 0);
    assert_eq!(l.check(late, 1).items[0], ok(2, 0, MIN));
    assert_eq!(l.check(late, 1).items[0], no(2, 0, MIN, Some(MIN)));
    assert_eq!(l.peek(end).items[0], ok(2, 2, 0));
}

#[test]
fn window_calendar_repeated_hour_is_two_windows() {
    // On 2026-11-01 local 01:00–02:00 happens twice in New York: 05:00–06:00Z
    // (EDT) and 06:00–07:00Z (EST); each is its own 3600 s window.
    let mut l = Lim::new(
        r#"{"limits":[{"kind":"window","limit":1,"window":"1h","align":"calendar","tz":"America/New_York"}]}"#,
    );
    let first = utc(2026, 11, 1, 5, 30, 0); // 01:30 EDT
    let second = utc(2026, 11, 1, 6, 30, 0); // 01:30 EST
    assert_eq!(l.check(first, 1).items[0], ok(1, 0, 30 * MIN));
    assert_eq!(
        l.check(first, 1).items[0],
        no(1, 0, 30 * MIN, Some(30 * MIN))
    );
    assert_eq!(l.check(second, 1).items[0], ok(1, 0, 30 * MIN));
    assert_eq!(
        l.check(second + 10 * MIN, 1).items[0],
        no(1, 0, 20 * MIN, Some(20 * MIN))
    );
}

#[test]
fn window_calendar_day_in_paris() {
    // Europe/Paris is UTC+1 in winter: NOW is 01:00 local on 2026-01-01, whose
    // day runs [2025-12-31T23:00Z, 2026-01-01T23:00Z).
    let mut l = Lim::new(
        r#"{"limits":[{"kind":"window","limit":3,"window":"1d","align":"calendar","tz":"Europe/Paris"}]}"#,
    );
    assert_eq!(l.check(NOW, 1).items[0], ok(3, 2, 23 * H));
    let t = utc(2026, 1, 1, 22, 0, 0);
    assert_eq!(l.check(t, 2).items[0], ok(3, 0, H));
    assert_eq!(l.check(t, 1).items[0], no(3, 0, H, Some(H)));
    assert_eq!(l.peek(utc(2026, 1, 1, 23, 0, 0)).items[0], ok(3, 3, 0));
    // 2026-03-29: Paris springs forward at 01:00Z; that local day runs
    // [03-28T23:00Z, 03-29T22:00Z): 23 hours.
    let start = utc(2026, 3, 28, 23, 0, 0);
    assert_eq!(l.check(start, 1).items[0], ok(3, 2, 23 * H));
}

#[test]
fn window_calendar_iso_week_starts_monday() {
    // NOW is Thursday 2026-01-01: its ISO week (UTC, the default zone) is
    // [Mon 2025-12-29, Mon 2026-01-05), so 4 days remain.
    let mut l =
        Lim::new(r#"{"limits":[{"kind":"window","limit":5,"window":"1w","align":"calendar"}]}"#);
    assert_eq!(l.check(NOW, 1).items[0], ok(5, 4, 4 * D));
    // Sunday 23:59:59 is still the same week.
    let sunday = utc(2026, 1, 4, 23, 59, 59);
    assert_eq!(l.check(sunday, 4).items[0], ok(5, 0, S));
    assert_eq!(l.check(sunday, 1).items[0], no(5, 0, S, Some(S)));
    // Monday 00:00 starts a new 7-day week.
    assert_eq!(
        l.check(utc(2026, 1, 5, 0, 0, 0), 1).items[0],
        ok(5, 4, 7 * D)
    );
}

#[test]
fn window_calendar_month() {
    let mut l =
        Lim::new(r#"{"limits":[{"kind":"window","limit":10,"window":"1mo","align":"calendar"}]}"#);
    // January has 31 days.
    assert_eq!(l.check(NOW, 1).items[0], ok(10, 9, 31 * D));
    // February 2026 has 28.
    let feb = utc(2026, 2, 1, 0, 0, 0);
    assert_eq!(l.check(feb, 10).items[0], ok(10, 0, 28 * D));
    // On Feb 10: retry = Mar 1 − Feb 10 = 19 days; n > limit never passes.
    let t = utc(2026, 2, 10, 0, 0, 0);
    assert_eq!(l.check(t, 1).items[0], no(10, 0, 19 * D, Some(19 * D)));
    assert_eq!(l.check(t, 11).items[0], no(10, 0, 19 * D, None));
}

#[test]
fn window_rolling_exact() {
    // Window (now − 10 s, now], limit 3.
    let mut l = Lim::new(r#"{"limits":[{"kind":"window","limit":3,"window":"10s"}]}"#);
    // Debits at +0, +2, +5 s; reset = newest debit + W − now.
    assert_eq!(l.check(NOW, 1).items[0], ok(3, 2, 10 * S));
    assert_eq!(l.check(NOW + 2 * S, 1).items[0], ok(3, 1, 10 * S));
    assert_eq!(l.check(NOW + 5 * S, 1).items[0], ok(3, 0, 10 * S));
    // At +6 s: used 3, reset = 5 + 10 − 6 = 9 s.
    // n = 1: the debit at +0 leaves at +10 s → retry 4 s.
    let t = NOW + 6 * S;
    let d = l.check(t, 1);
    assert_eq!(d.items[0], no(3, 0, 9 * S, Some(4 * S)));
    assert_decision(&d, false, Some(4 * S), 0, 9 * S, 0);
    // n = 2: the debits at +0 and +2 must leave → +12 s → retry 6 s.
    assert_eq!(l.check(t, 2).items[0], no(3, 0, 9 * S, Some(6 * S)));
    // n = 4 > limit: never.
    assert_eq!(l.check(t, 4).items[0], no(3, 0, 9 * S, None));
    // At +10 s − 1 ns the debit at +0 is still in (now − W, now].
    let t = NOW + 10 * S - NS;
    assert_eq!(l.check(t, 1).items[0], no(3, 0, 5 * S + 1, Some(1)));
    // At +10 s it has left: used 2.
    let t = NOW + 10 * S;
    assert_eq!(l.peek(t).items[0], ok(3, 1, 5 * S));
    assert_eq!(l.check(t, 1).items[0], ok(3, 0, 10 * S));
}

#[test]
fn window_rolling_exact_retry_weighs_costs() {
    let mut l = Lim::new(r#"{"limits":[{"kind":"window","limit":5,"window":"1m"}]}"#);
    l.check(NOW, 3);
    l.check(NOW + 10 * S, 2);
    // At +20 s, used 5. n = 1 or 3: the 3 units at +0 leaving (at +60 s) free
    // enough → retry 40 s. n = 4: the 2 at +10 s must leave too → +70 s → 50 s.
    let t = NOW + 20 * S;
    assert_eq!(l.check(t, 1).items[0], no(5, 0, 50 * S, Some(40 * S)));
    assert_eq!(l.check(t, 3).items[0], no(5, 0, 50 * S, Some(40 * S)));
    assert_eq!(l.check(t, 4).items[0], no(5, 0, 50 * S, Some(50 * S)));
}

#[test]
fn window_rolling_approximate_estimate_and_retry() {
    // Buckets of W = 10 s aligned to the epoch (NOW is a multiple of 10 s).
    let mut l = Lim::new(
        r#"{"limits":[{"kind":"window","limit":10,"window":"10s","precision":"approximate"}]}"#,
    );
    // 6 at +2 s into the bucket [NOW, NOW + 10 s).
    // cur non-empty → reset = cur_start + 2W − now = 20 − 2 = 18 s.
    assert_eq!(l.check(NOW + 2 * S, 6).items[0], ok(10, 4, 18 * S));
    assert_eq!(l.peek(NOW + 4 * S).items[0], ok(10, 4, 16 * S));
    // At +12 s: cur_start = NOW + 10 s, prev = 6, cur = 0:
    // estimate = floor(6·(10 − 2)/10) = floor(4.8) = 4 → remaining 6;
    // cur empty → reset = cur_start + W − now = 20 − 12 = 8 s.
    let t = NOW + 12 * S;
    assert_eq!(l.peek(t).items[0], ok(10, 6, 8 * S));
    // n = 8: 4 + 8 > 10. Fits when floor(6·(NOW + 20 s − t)/10 s) ≤ 2
    // ⇔ 6·(20 s − τ) < 30 s ⇔ τ > 15 s → first instant NOW + 15 s + 1 ns;
    // retry = 3 s + 1 ns.
    let d = l.check(t, 8);
    assert_eq!(d.items[0], no(10, 6, 8 * S, Some(3 * S + 1)));
    assert_decision(&d, false, Some(3 * S + 1), 6, 8 * S, 0);
    // At +15 s the estimate is exactly 3: still 3 + 8 > 10.
    assert_eq!(l.check(NOW + 15 * S, 8).items[0], no(10, 7, 5 * S, Some(1)));
    // 1 ns later it fits: cur = 8, estimate = floor(6·(5 s − 1 ns)/10 s) + 8 = 10;
    // reset = NOW + 30 s − now = 15 s − 1 ns.
    let t = NOW + 15 * S + 1;
    assert_eq!(l.check(t, 8).items[0], ok(10, 0, 15 * S - 1));
}

#[test]
fn window_rolling_approximate_reset_is_zero_when_the_estimate_floors_to_zero() {
    let mut l = Lim::new(
        r#"{"limits":[{"kind":"window","limit":10,"window":"10s","precision":"approximate"}]}"#,
    );
    l.check(NOW + 2 * S, 6);
    // +18 s: estimate = floor(6·2/10) = floor(1.2) = 1, reset = 20 − 18 = 2 s.
    assert_eq!(l.peek(NOW + 18 * S).items[0], ok(10, 9, 2 * S));
    // +19 s: estimate = floor(0.6) = 0 → remaining 10 and reset 0, although
    // the previous bucket is not empty.
    assert_eq!(l.peek(NOW + 19 * S).items[0], ok(10, 10, 0));
}

#[test]
fn window_rolling_approximate_retry_in_the_next_bucket() {
    let mut l = Lim::new(
        r#"{"limits":[{"kind":"window","limit":10,"window":"10s","precision":"approximate"}]}"#,
    );
    assert_eq!(l.check(NOW + S, 10).items[0], ok(10, 0, 19 * S));
    // At +5 s: estimate 10. Within this bucket it stays ≥ 10 (cur alone is 10).
    // In the next, floor(10·(NOW + 20 s − t)/10 s) + 1 ≤ 10 ⇔ 20 s − τ < 10 s
    // ⇔ τ > 10 s → NOW + 10 s + 1 ns; retry = 5 s + 1 ns.
    let d = l.check(NOW + 5 * S, 1);
    assert_eq!(d.items[0], no(10, 0, 15 * S, Some(5 * S + 1)));
    assert_eq!(
        l.check(NOW + 10 * S, 1).items[0],
        no(10, 0, 10 * S, Some(1))
    );
    // n = 4 needs the estimate ≤ 6: 10·(20 s − τ)/10 s < 7 ⇔ τ > 13 s.
    assert_eq!(
        l.check(NOW + 5 * S, 4).items[0],
        no(10, 0, 15 * S, Some(8 * S + 1))
    );
}

// ---------------------------------------------------------- budget (§2.3)

#[test]
fn budget_even_pacing_cap_and_retry() {
    // amount 2400 per UTC day, even pacing, tolerance 0.01 = 100 bp →
    // allowance = floor(2400·100/10 000) = 24. cap = min(2400, ⌈2400·f⌉ + 24).
    let mut l = Lim::new(r#"{"limits":[{"kind":"budget","amount":2400}]}"#);
    // Nothing spent: reset 0. f(NOW) = 0 → cap 24.
    assert_eq!(l.peek(NOW).items[0], ok(2400, 24, 0));
    assert_eq!(l.check(NOW, 24).items[0], ok(2400, 0, D));
    // Need 25 → ⌈2400·f⌉ ≥ 1 ⇔ f > 0: 1 ns later.
    let d = l.check(NOW, 1);
    assert_eq!(d.items[0], no(2400, 0, D, Some(1)));
    assert_decision(&d, false, Some(1), 0, D, 0);
    // At 06:00: cap = ⌈2400/4⌉ + 24 = 624; spent 24 → 600 more fit.
    let t = NOW + 6 * H;
    assert_eq!(l.peek(t).items[0], ok(2400, 600, 18 * H));
    assert_eq!(l.check(t, 600).items[0], ok(2400, 0, 18 * H));
    // n = 10: need 634 ⇔ ⌈2400·f⌉ ≥ 610 ⇔ 2400·f > 609 ⇔ elapsed > 609·36 s
    // = 21 924 s → first instant 21 924 s + 1 ns; now is 21 600 s → 324 s + 1 ns.
    assert_eq!(
        l.check(t, 10).items[0],
        no(2400, 0, 18 * H, Some(324 * S + 1))
    );
    let t2 = NOW + 21_924 * S;
    // cap(t2) = ⌈609⌉ + 24 = 633 < 634.
    assert_eq!(
        l.check(t2, 10).items[0],
        no(2400, 9, D - 21_924 * S, Some(1))
    );
    assert_eq!(
        l.check(t2 + 1, 10).items[0],
        ok(2400, 0, D - 21_924 * S - 1)
    );
    // n = 2400 cannot pass today (634 + 2400 > 2400): the next day's cap must reach
    // 2400 ⇔ ⌈2400·f⌉ ≥ 2376 ⇔ elapsed > 2375·36 s = 85 500 s. From t2 + 1:
    // (86 400 − 21 924) s − 1 ns + 85 500 s + 1 ns = 149 976 s.
    assert_eq!(
        l.check(t2 + 1, 2400).items[0],
        no(2400, 0, D - 21_924 * S - 1, Some(149_976 * S))
    );
    // n > amount: never.
    assert_eq!(
        l.check(t2 + 1, 2401).items[0],
        no(2400, 0, D - 21_924 * S - 1, None)
    );
    // The next day starts empty.
    assert_eq!(l.peek(NOW + D).items[0], ok(2400, 24, 0));
}

#[test]
fn budget_tolerance_is_rounded_to_basis_points() {
    let start_remaining = |amount: u64, tol: &str| {
        let mut l = Lim::new(&format!(
            r#"{{"limits":[{{"kind":"budget","amount":{amount},"tolerance":{tol}}}]}}"#
        ));
        // At the period's start f = 0, so cap = allowance.
        l.peek(NOW).items[0].remaining
    };
    // 0.0125 = 125 bp: floor(1000·125/10 000) = floor(12.5) = 12.
    assert_eq!(start_remaining(1000, "0.0125"), 12);
    // 0.0123 = 123 bp on 10 000: 123.
    assert_eq!(start_remaining(10_000, "0.0123"), 123);
    // 0.00004 = 0.4 bp → 0 bp: nothing ahead of the line.
    assert_eq!(start_remaining(10_000, "0.00004"), 0);
    // 0.00006 = 0.6 bp → 1 bp: floor(10 000·1/10 000) = 1.
    assert_eq!(start_remaining(10_000, "0.00006"), 1);
    assert_eq!(start_remaining(10_000, "0"), 0);
    // Tolerance 1: the whole amount from the start.
    assert_eq!(start_remaining(10_000, "1"), 10_000);
    // Default 0.01.
    let mut l = Lim::new(r#"{"limits":[{"kind":"budget","amount":550}]}"#);
    // floor(550·100/10 000) = floor(5.5) = 5.
    assert_eq!(l.peek(NOW).items[0], ok(550, 5, 0));
}

#[test]
fn budget_asap() {
    let mut l = Lim::new(r#"{"limits":[{"kind":"budget","amount":100,"pacing":"asap"}]}"#);
    assert_eq!(l.peek(NOW).items[0], ok(100, 100, 0));
    let t = NOW + H;
    assert_eq!(l.check(t, 100).items[0], ok(100, 0, 23 * H));
    // Retry across periods for asap: the next period's start.
    let d = l.check(t, 1);
    assert_eq!(d.items[0], no(100, 0, 23 * H, Some(23 * H)));
    assert_decision(&d, false, Some(23 * H), 0, 23 * H, 0);
    assert_eq!(l.check(t, 101).items[0], no(100, 0, 23 * H, None));
    assert_eq!(l.check(NOW + D, 100).items[0], ok(100, 0, D));
}

#[test]
fn budget_monthly_in_a_time_zone() {
    // A monthly asap budget in Europe/Paris: January runs
    // [2025-12-31T23:00Z, 2026-01-31T23:00Z).
    let mut l = Lim::new(
        r#"{"limits":[{"kind":"budget","amount":5,"per":"1mo","pacing":"asap","tz":"Europe/Paris"}]}"#,
    );
    assert_eq!(l.check(NOW, 5).items[0], ok(5, 0, 31 * D - H));
    let d = l.check(NOW, 1);
    assert_eq!(d.items[0], no(5, 0, 31 * D - H, Some(31 * D - H)));
}

#[test]
fn budget_profile_weights_by_local_hour() {
    // amount 4800, tolerance 0; weight 1 for hours 0–11 and 3 for hours 12–23:
    // the day's total is 12 + 36 = 48 weighted hours.
    let mut l = Lim::new(
        r#"{"limits":[{"kind":"budget","amount":4800,"tolerance":0,
            "pacing":{"profile":[1,1,1,1,1,1,1,1,1,1,1,1,3,3,3,3,3,3,3,3,3,3,3,3]}}]}"#,
    );
    assert_eq!(l.peek(NOW).items[0], ok(4800, 0, 0));
    // 06:00: f = 6/48 → cap 600.
    assert_eq!(l.peek(NOW + 6 * H).items[0], ok(4800, 600, 0));
    assert_eq!(l.check(NOW + 6 * H, 600).items[0], ok(4800, 0, 18 * H));
    // 12:00: f = 12/48 → cap 1200.
    assert_eq!(l.peek(NOW + 12 * H).items[0], ok(4800, 600, 12 * H));
    // 18:00: f = (12 + 18)/48 → cap 3000.
    let t = NOW + 18 * H;
    assert_eq!(l.peek(t).items[0], ok(4800, 2400, 6 * H));
    assert_eq!(l.check(t, 2400).items[0], ok(4800, 0, 6 * H));
    // n = 30: need 3030 ⇔ 4800·f > 3029 ⇔ weighted hours > 30.29 ⇔ 3·Δ > 0.29 h
    // ⇔ Δ > 348 s → first instant 18:05:48 + 1 ns.
    assert_eq!(
        l.check(t, 30).items[0],
        no(4800, 0, 6 * H, Some(348 * S + 1))
    );
    let t2 = t + 348 * S;
    // At exactly +348 s the cap is 3029.
    assert_eq!(
        l.check(t2, 30).items[0],
        no(4800, 29, 6 * H - 348 * S, Some(1))
    );
    assert_eq!(
        l.check(t2 + 1, 30).items[0],
        ok(4800, 0, 6 * H - 348 * S - 1)
    );
}

#[test]
fn budget_profile_on_dst_days() {
    // Weight 1 in every hour: on New York's 23 h day (2026-03-08, 05:00Z to
    // 03-09 04:00Z) the skipped hour adds nothing, so at 12:00 EDT = 16:00Z
    // 11 real hours have passed: f = 11/23, cap = 2300·11/23 = 1100.
    let flat = r#"{"limits":[{"kind":"budget","amount":AMOUNT,"tolerance":0,"tz":"America/New_York",
        "pacing":{"profile":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]}}]}"#;
    let mut l = Lim::new(&flat.replace("AMOUNT", "2300"));
    assert_eq!(
        l.peek(utc(2026, 3, 8, 16, 0, 0)).items[0],
        ok(2300, 1100, 0)
    );
    // On the 25 h day (2026-11-01, 04:00Z to 11-02 05:00Z), the repeated hour
    // counts twice: at 12:00 EST = 17:00Z, f = 13/25 → cap = 2500·13/25 = 1300.
    let mut l = Lim::new(&flat.replace("AMOUNT", "2500"));
    assert_eq!(
        l.peek(utc(2026, 11, 1, 17, 0, 0)).items[0],
        ok(2500, 1300, 0)
    );
    // Only local hour 1 weighted, on the 25 h day: it occurs twice (05:00–06:00Z
    // EDT, 06:00–07:00Z EST), total 2 weighted hours. At 05:30Z f = 0.5/2 → 250;
    // at 06:30Z f = 1.5/2 → 750 (amount 1000).
    let mut w = vec!["0"; 24];
    w[1] = "1";
    let mut l = Lim::new(&format!(
        r#"{{"limits":[{{"kind":"budget","amount":1000,"tolerance":0,"tz":"America/New_York",
            "pacing":{{"profile":[{}]}}}}]}}"#,
        w.join(",")
    ));
    assert_eq!(
        l.peek(utc(2026, 11, 1, 5, 30, 0)).items[0],
        ok(1000, 250, 0)
    );
    assert_eq!(
        l.peek(utc(2026, 11, 1, 6, 30, 0)).items[0],
        ok(1000, 750, 0)
    );
    assert_eq!(
        l.peek(utc(2026, 11, 1, 7, 0, 0)).items[0],
        ok(1000, 1000, 0)
    );
}

#[test]
fn budget_at_the_integer_bounds_does_not_overflow() {
    // amount 2^53 − 1 over a month with the heaviest weights: the exact products
    // must fit (overflow checks are on in the test profile).
    let w = vec!["1000"; 24].join(",");
    let mut l = Lim::new(&format!(
        r#"{{"limits":[{{"kind":"budget","amount":9007199254740991,"per":"1mo","tolerance":0,
            "pacing":{{"profile":[{w}]}}}}]}}"#
    ));
    // Flat weights are even pacing: half of January (15.5 days) → f = 1/2;
    // cap = ⌈(2^53 − 1)/2⌉ = 2^52.
    let mid = NOW + 31 * D / 2;
    assert_eq!(l.peek(mid).items[0].remaining, 1 << 52);
    assert!(l.check(mid, 1 << 52).allowed);
    let d = l.check(mid, 1);
    assert!(!d.allowed);
    // need 2^52 + 1 ⇔ (2^53 − 1)·Δ > 2^52·L (L = 31 d, flat weights) ⇔
    // Δ > L/2 + (L/2)/(2^53 − 1) = L/2 + 0.15 ns → 1 ns after the middle.
    assert_eq!(d.retry_after, Some(1), "{d:?}");
}

#[test]
fn budget_reservations_count_while_pending() {
    let mut l = Lim::new(r#"{"limits":[{"kind":"budget","amount":100,"pacing":"asap"}]}"#);
    let (d, p) = l.reserve(NOW, 60, MIN);
    assert_eq!(d.items[0], ok(100, 40, D));
    let p = p.unwrap();
    // Pending counts exactly like spend.
    assert_eq!(l.check(NOW, 41).items[0], no(100, 40, D, Some(D)));
    // Release restores it.
    l.release(&p, NOW + S);
    assert_eq!(l.peek(NOW + S).items[0], ok(100, 100, 0));
    // Commit at a lower cost returns the difference...
    let (_, p) = l.reserve(NOW + S, 60, MIN);
    l.commit(&p.unwrap(), 25, NOW + 2 * S);
    assert_eq!(l.peek(NOW + 2 * S).items[0], ok(100, 75, D - 2 * S));
    // ...and a higher one is charged even past the amount; remaining shows 0.
    let (_, p) = l.reserve(NOW + 2 * S, 50, MIN);
    l.commit(&p.unwrap(), 90, NOW + 3 * S);
    assert_eq!(l.peek(NOW + 3 * S).items[0], ok(100, 0, D - 3 * S));
}

#[test]
fn budget_commit_after_midnight_belongs_to_the_old_day() {
    let mut l = Lim::new(r#"{"limits":[{"kind":"budget","amount":100,"pacing":"asap"}]}"#);
    let t = NOW + D - S; // 23:59:59
    let (_, p) = l.reserve(t, 30, MIN);
    // Committed after midnight: charged to the old day, the new one is untouched.
    l.commit(&p.unwrap(), 30, NOW + D + S);
    assert_eq!(l.peek(NOW + D + S).items[0], ok(100, 100, 0));
}

// ----------------------------------------------------- concurrency (§2.4)

#[test]
fn concurrency_reserve_holds_and_immediate_does_not() {
    let mut l = Lim::new(r#"{"limits":[{"kind":"concurrency","max":2}]}"#);
    // An immediate check is allowed iff open < max and holds nothing.
    assert_eq!(l.check(NOW, 1).items[0], ok(2, 2, 0));
    // Reserve until +60 s: remaining 1, reset = latest deadline − now = 60 s.
    let (d, a) = l.reserve(NOW, 1, 60 * S);
    assert_eq!(d.items[0], ok(2, 1, 60 * S));
    // Counts reservations, not cost: a cost-5 reserve takes one slot. Until +31 s.
    let (d, b) = l.reserve(NOW + S, 5, 30 * S);
    assert_eq!(d.items[0], ok(2, 0, 59 * S));
    // Full: retry = earliest deadline − now = 31 − 2 = 29 s.
    let t = NOW + 2 * S;
    let (d, _) = l.reserve(t, 1, 60 * S);
    assert_eq!(d.items[0], no(2, 0, 58 * S, Some(29 * S)));
    assert_decision(&d, false, Some(29 * S), 0, 58 * S, 0);
    // An immediate check on a full item is denied the same way.
    assert_eq!(l.check(t, 1).items[0], no(2, 0, 58 * S, Some(29 * S)));
    // A peek is allowed even when full.
    assert_eq!(l.peek(t).items[0], ok(2, 0, 58 * S));
    // A zero-cost reserve holds nothing.
    let (d, p) = l.reserve(t, 0, 60 * S);
    assert!(d.allowed && p.is_none());
    // A deadline ≤ now has expired: at +31 s `b` no longer holds a slot.
    let t = NOW + 31 * S;
    assert_eq!(l.peek(t).items[0], ok(2, 1, 29 * S));
    let (d, c) = l.reserve(t, 1, 10 * S);
    assert_eq!(d.items[0], ok(2, 0, 29 * S));
    // Releasing the expired `b` does not free a second slot.
    l.release(&b.unwrap(), t);
    assert_eq!(l.peek(t).items[0], ok(2, 0, 29 * S));
    // Commit and release both free their slot.
    l.commit(&a.unwrap(), 1, t);
    assert_eq!(l.peek(t).items[0], ok(2, 1, 10 * S));
    l.release(&c.unwrap(), t);
    assert_eq!(l.peek(t).items[0], ok(2, 2, 0));
}

// ---------------------------------------------------------- stack (§2, §2.6)

#[test]
fn stack_is_all_or_nothing() {
    let mut l = Lim::new(
        r#"{"limits":[
            {"kind":"rate","rate":10,"per":"1s"},
            {"kind":"window","limit":3,"window":"1m","align":"fixed"},
            {"kind":"budget","amount":100,"pacing":"asap"}]}"#,
    );
    for _ in 0..3 {
        assert!(l.check(NOW, 1).allowed);
    }
    // rate: TAT = NOW + 300 ms → remaining floor((1000 − 300)/100) = 7, reset
    // 300 ms; window: 3 used of 3, reset 60 s; budget: 97 left, reset 24 h.
    let before = l.figures(NOW);
    assert_eq!(
        before,
        [ok(10, 7, 300 * MS), ok(3, 0, 60 * S), ok(100, 97, D)]
    );
    let d = l.check(NOW, 1);
    assert_eq!(
        d.items.as_slice(),
        &[
            ok(10, 7, 300 * MS),
            no(3, 0, 60 * S, Some(60 * S)),
            ok(100, 97, D)
        ]
    );
    assert_decision(&d, false, Some(60 * S), 0, 60 * S, 0);
    // Nothing was debited: the rate and budget items show the same figures.
    assert_eq!(l.figures(NOW), before);
    // The same with a reserve.
    let (d, p) = l.reserve(NOW, 1, MIN);
    assert!(!d.allowed && p.is_none());
    assert_eq!(l.figures(NOW), before);
}

#[test]
fn stack_decision_remaining_is_the_min_and_reset_is_the_tightest_items() {
    // Equal remaining: the tie goes to the larger reset_after, whatever the order.
    for json in [
        r#"{"limits":[{"kind":"rate","rate":2,"per":"1s"},{"kind":"window","limit":2,"window":"1m","align":"fixed"}]}"#,
        r#"{"limits":[{"kind":"window","limit":2,"window":"1m","align":"fixed"},{"kind":"rate","rate":2,"per":"1s"}]}"#,
    ] {
        let mut l = Lim::new(json);
        // rate: T = 500 ms → remaining 1, reset 500 ms; window: 1 left, reset 50 s.
        let d = l.check(NOW + 10 * S, 1);
        assert_decision(&d, true, None, 1, 50 * S, 0);
    }
    // Different remaining: the item with the least decides.
    let mut l = Lim::new(
        r#"{"limits":[{"kind":"rate","rate":1,"per":"1s","burst":2},{"kind":"window","limit":10,"window":"1m","align":"fixed"}]}"#,
    );
    let d = l.check(NOW + 10 * S, 2);
    assert_eq!(d.items.as_slice(), &[ok(2, 0, 2 * S), ok(10, 8, 50 * S)]);
    assert_decision(&d, true, None, 0, 2 * S, 0);
}

#[test]
fn stack_retry_is_the_max_over_denying_items_and_null_if_any_never() {
    let mut l = Lim::new(
        r#"{"limits":[{"kind":"rate","rate":1,"per":"1s","burst":5},{"kind":"window","limit":3,"window":"1m","align":"fixed"}]}"#,
    );
    assert!(l.check(NOW + 10 * S, 3).allowed);
    // n = 1: rate TAT = now + 3 s, new = now + 4 s ≤ now + 5 s → the rate
    // allows; only the window denies (retry 50 s).
    let d = l.check(NOW + 10 * S, 1);
    assert_decision(&d, false, Some(50 * S), 0, 50 * S, 0);
    // n = 3: rate new = now + 6 s → retry 1 s; window retry 50 s → max 50 s.
    let d = l.check(NOW + 10 * S, 3);
    assert_eq!(
        d.items.as_slice(),
        &[no(5, 2, 3 * S, Some(S)), no(3, 0, 50 * S, Some(50 * S))]
    );
    assert_decision(&d, false, Some(50 * S), 0, 50 * S, 0);
    // n = 4: rate retry 2 s, window never (4 > 3) → the decision never passes.
    let d = l.check(NOW + 10 * S, 4);
    assert_eq!(
        d.items.as_slice(),
        &[no(5, 2, 3 * S, Some(2 * S)), no(3, 0, 50 * S, None)]
    );
    assert_decision(&d, false, None, 0, 50 * S, 0);
    // Names default to <kind>-<index>.
    assert_eq!((l.stack.name(0), l.stack.name(1)), ("rate-0", "window-1"));
}

// ------------------------------------------------------ delay mode (§2.6)

#[test]
fn delay_mode_debits_the_future_slot() {
    let mut l = Lim::new(
        r#"{"limits":[{"kind":"rate","rate":1,"per":"1s","burst":1}],"on_limit":"delay","max_delay_ms":1500}"#,
    );
    let d = l.check(NOW, 1);
    assert_eq!(d.items[0], ok(1, 0, S));
    assert_decision(&d, true, None, 0, S, 0);
    // Second at NOW: wait = new − burst·T − now = 2 − 1 − 0 = 1 s ≤ 1.5 s →
    // allowed with delay 1 s; TAT = NOW + 2 s, figures after the debit.
    let d = l.check(NOW, 1);
    assert_eq!(d.items[0], ok(1, 0, 2 * S));
    assert_decision(&d, true, None, 0, 2 * S, S);
    // Third at NOW: wait 2 s > 1.5 s → a plain denial, delay 0, nothing debited.
    let d = l.check(NOW, 1);
    assert_eq!(d.items[0], no(1, 0, 2 * S, Some(2 * S)));
    assert_decision(&d, false, Some(2 * S), 0, 2 * S, 0);
    // At +500 ms: wait = 3 − 1 − 0.5 = 1.5 s, exactly the maximum → delayed.
    let d = l.check(NOW + 500 * MS, 1);
    assert_eq!(d.items[0], ok(1, 0, 2_500 * MS));
    assert_decision(&d, true, None, 0, 2_500 * MS, 1_500 * MS);
    // n > burst: never, so never delayed.
    let d = l.check(NOW + 10 * S, 2);
    assert_decision(&d, false, None, 1, 0, 0);
}

#[test]
fn delay_mode_with_gap_and_other_items() {
    // A gap is shapeable too: min 2 s, at +500 ms the wait is 1.5 s.
    let mut l = Lim::new(
        r#"{"limits":[{"kind":"gap","min":"2s"}],"on_limit":"delay","max_delay_ms":2000}"#,
    );
    l.check(NOW, 1);
    let d = l.check(NOW + 500 * MS, 1);
    assert_decision(&d, true, None, 0, 3_500 * MS, 1_500 * MS);

    // An allowing window is debited now beside the delayed rate.
    let mut l = Lim::new(
        r#"{"limits":[{"kind":"rate","rate":1,"per":"1s","burst":1},{"kind":"window","limit":5,"window":"1m","align":"fixed"}],
            "on_limit":"delay","max_delay_ms":5000}"#,
    );
    l.check(NOW, 1);
    let d = l.check(NOW, 1);
    assert_eq!(d.items.as_slice(), &[ok(1, 0, 2 * S), ok(5, 3, 60 * S)]);
    assert_decision(&d, true, None, 0, 2 * S, S);

    // A denying window makes it a plain denial, even with a short rate wait.
    let mut l = Lim::new(
        r#"{"limits":[{"kind":"rate","rate":1,"per":"1s","burst":1},{"kind":"window","limit":1,"window":"1m","align":"fixed"}],
            "on_limit":"delay","max_delay_ms":5000}"#,
    );
    l.check(NOW, 1);
    let d = l.check(NOW, 1);
    assert_eq!(
        d.items.as_slice(),
        &[no(1, 0, S, Some(S)), no(1, 0, 60 * S, Some(60 * S))]
    );
    assert_decision(&d, false, Some(60 * S), 0, 60 * S, 0);
}

// ---------------------------------------------------- reservations (§2.5)

#[test]
fn rate_release_restores_capacity() {
    let mut l = Lim::new(r#"{"limits":[{"kind":"rate","rate":1,"per":"1s","burst":5}]}"#);
    let (d, p) = l.reserve(NOW, 2, MIN);
    assert_eq!(d.items[0], ok(5, 3, 2 * S));
    // Pending counts: 4 more would need TAT 6 s > 5 s.
    assert_eq!(l.check(NOW, 4).items[0], no(5, 3, 2 * S, Some(S)));
    // Released at once: d = min(2 s, tat_r − now = 2 s) → back to full.
    l.release(&p.unwrap(), NOW);
    assert_eq!(l.peek(NOW).items[0], ok(5, 5, 0));
}

#[test]
fn rate_release_after_time_passed_refunds_only_the_unpaid_part() {
    let mut l = Lim::new(r#"{"limits":[{"kind":"rate","rate":1,"per":"1s","burst":5}]}"#);
    // Reserve 2 (tat_r = NOW + 2 s), then 1 immediately (TAT = NOW + 3 s).
    let (_, p) = l.reserve(NOW, 2, MIN);
    l.check(NOW, 1);
    // At +1.5 s, before: remaining = floor((1.5 + 5 − 3)/1) = 3, reset 1.5 s.
    // Release: d = min(2 s, tat_r − now = 0.5 s) = 0.5 s → TAT = 2.5 s:
    // remaining = floor((1.5 + 5 − 2.5)/1) = 4, reset 1 s.
    let t = NOW + 1_500 * MS;
    assert_eq!(l.peek(t).items[0], ok(5, 3, 1_500 * MS));
    l.release(&p.unwrap(), t);
    assert_eq!(l.peek(t).items[0], ok(5, 4, S));

    // Alone: reserve 2, release at +1.5 s → d = 0.5 s, TAT = max(1.5, 1.5) → full;
    // never more than if it had not been made.
    let mut l = Lim::new(r#"{"limits":[{"kind":"rate","rate":1,"per":"1s","burst":5}]}"#);
    let (_, p) = l.reserve(NOW, 2, MIN);
    l.release(&p.unwrap(), t);
    assert_eq!(l.peek(t).items[0], ok(5, 5, 0));
    // Released after it was fully paid back by time: nothing to refund.
    let (_, p) = l.reserve(t, 2, MIN);
    l.check(t + 3 * S, 1); // TAT = t + 4 s
    l.release(&p.unwrap(), t + 3 * S);
    assert_eq!(l.peek(t + 3 * S).items[0], ok(5, 4, S));
}

#[test]
fn rate_expiry_refunds_as_of_the_deadline() {
    // Reserve 3 at NOW until +2 s (tat_r = NOW + 3 s); the engine gets to the
    // expiry later but releases as of the deadline: d = min(3 s, 1 s) = 1 s →
    // TAT = max(3 − 1, 2) = NOW + 2 s.
    let mut l = Lim::new(r#"{"limits":[{"kind":"rate","rate":1,"per":"1s","burst":5}]}"#);
    let (_, p) = l.reserve(NOW, 3, 2 * S);
    l.release(&p.unwrap(), NOW + 2 * S);
    assert_eq!(l.peek(NOW + 2 * S).items[0], ok(5, 5, 0));
}

#[test]
fn rate_commit_with_lower_and_higher_cost() {
    let mut l = Lim::new(r#"{"limits":[{"kind":"rate","rate":1,"per":"1s","burst":5}]}"#);
    // Reserve 4 (TAT 4 s), commit 1: the 3 not used are released, d = 3 s → TAT 1 s.
    let (_, p) = l.reserve(NOW, 4, MIN);
    l.commit(&p.unwrap(), 1, NOW);
    assert_eq!(l.peek(NOW).items[0], ok(5, 4, S));
    // Reserve 2 (TAT 3 s), commit 7: TAT advances by 5 more → 8 s, past the burst:
    // remaining 0, reset 8 s; the next unit waits 9 − 5 = 4 s.
    let (_, p) = l.reserve(NOW, 2, MIN);
    l.commit(&p.unwrap(), 7, NOW);
    assert_eq!(l.peek(NOW).items[0], ok(5, 0, 8 * S));
    assert_eq!(l.check(NOW, 1).items[0], no(5, 0, 8 * S, Some(4 * S)));
}

#[test]
fn window_reservations_release_and_commit() {
    let mut l =
        Lim::new(r#"{"limits":[{"kind":"window","limit":10,"window":"1m","align":"fixed"}]}"#);
    let t = NOW + 10 * S;
    let (d, p) = l.reserve(t, 4, MIN);
    assert_eq!(d.items[0], ok(10, 6, 50 * S));
    l.release(&p.unwrap(), t);
    assert_eq!(l.peek(t).items[0], ok(10, 10, 0));
    // Commit lower: 4 reserved, 2 charged.
    let (_, p) = l.reserve(t, 4, MIN);
    l.commit(&p.unwrap(), 2, t);
    assert_eq!(l.peek(t).items[0], ok(10, 8, 50 * S));
    // Commit higher, past the limit: remaining shows 0.
    let (_, p) = l.reserve(t, 4, MIN);
    l.commit(&p.unwrap(), 15, t);
    assert_eq!(l.peek(t).items[0], ok(10, 0, 50 * S));
    // A reservation whose window has ended: release and commit change nothing in
    // the new window.
    let t2 = NOW + 60 * S;
    let mut l =
        Lim::new(r#"{"limits":[{"kind":"window","limit":10,"window":"1m","align":"fixed"}]}"#);
    let (_, a) = l.reserve(t, 3, MIN);
    let (_, b) = l.reserve(t, 3, MIN);
    l.check(t2 + S, 1);
    l.release(&a.unwrap(), t2 + 2 * S);
    l.commit(&b.unwrap(), 5, t2 + 2 * S);
    assert_eq!(l.peek(t2 + 2 * S).items[0], ok(10, 9, 58 * S));
}

#[test]
fn rolling_reservations_release_and_commit() {
    let mut l = Lim::new(r#"{"limits":[{"kind":"window","limit":5,"window":"10s"}]}"#);
    let (_, p) = l.reserve(NOW + S, 2, MIN);
    l.check(NOW + 2 * S, 1);
    assert_eq!(l.peek(NOW + 3 * S).items[0], ok(5, 2, 9 * S));
    l.release(&p.unwrap(), NOW + 3 * S);
    assert_eq!(l.peek(NOW + 3 * S).items[0], ok(5, 4, 9 * S));
    // Commit lower: the debit at +4 s keeps 1 of its 3 units.
    let (_, p) = l.reserve(NOW + 4 * S, 3, MIN);
    l.commit(&p.unwrap(), 1, NOW + 5 * S);
    assert_eq!(l.peek(NOW + 5 * S).items[0], ok(5, 3, 9 * S));
    // A debit that has left the window is not touched by a release.
    let (_, p) = l.reserve(NOW + 6 * S, 2, MIN);
    l.release(&p.unwrap(), NOW + 16 * S);
    assert_eq!(l.peek(NOW + 16 * S).items[0], ok(5, 5, 0));

    // Approximate: a release goes back to the bucket it was charged in.
    let mut l = Lim::new(
        r#"{"limits":[{"kind":"window","limit":10,"window":"10s","precision":"approximate"}]}"#,
    );
    let (_, p) = l.reserve(NOW + 8 * S, 5, MIN);
    l.check(NOW + 12 * S, 1);
    // prev = 5, cur = 1 at +12 s: floor(5·0.8) + 1 = 5.
    assert_eq!(l.peek(NOW + 12 * S).items[0], ok(10, 5, 18 * S));
    l.release(&p.unwrap(), NOW + 12 * S);
    assert_eq!(l.peek(NOW + 12 * S).items[0], ok(10, 9, 18 * S));
}

#[test]
fn stack_release_and_commit_cover_every_item() {
    let mut l = Lim::new(
        r#"{"limits":[
            {"kind":"rate","rate":1,"per":"1s","burst":5},
            {"kind":"window","limit":10,"window":"1m","align":"fixed"},
            {"kind":"budget","amount":100,"pacing":"asap"},
            {"kind":"concurrency","max":1}]}"#,
    );
    let fresh = l.figures(NOW);
    let (d, p) = l.reserve(NOW, 3, MIN);
    assert_eq!(
        d.items.as_slice(),
        &[
            ok(5, 2, 3 * S),
            ok(10, 7, MIN),
            ok(100, 97, D),
            ok(1, 0, MIN)
        ]
    );
    assert_decision(&d, true, None, 0, MIN, 0);
    l.release(&p.unwrap(), NOW);
    assert_eq!(l.figures(NOW), fresh);
    let (_, p) = l.reserve(NOW, 3, MIN);
    l.commit(&p.unwrap(), 2, NOW);
    assert_eq!(
        l.figures(NOW),
        [ok(5, 3, 2 * S), ok(10, 8, MIN), ok(100, 98, D), ok(1, 1, 0)]
    );
}

// ------------------------------------------ through the API, on replay ----
//
// The figures below are the JSON an HTTP client reads: `freqcap replay` runs
// the service's router on a virtual clock, so each answer is pinned exactly.

mod replay {
    use std::sync::Arc;

    use freqcap::api::ApiOptions;
    use freqcap::engine::EngineOptions;
    use freqcap::replay::Replayer;
    use freqcap::store::MemoryStore;
    use serde_json::{Value, json};

    /// NOW in ms.
    pub const T: u64 = super::NOW / super::MS;
    /// The largest reported figure, 2^53 − 1 (docs/semantics.md §1.5, saturation).
    pub const MAX: u64 = (1 << 53) - 1;

    pub struct Api(Replayer);

    impl Api {
        pub fn new() -> Api {
            Api(Replayer::new(
                Arc::new(MemoryStore::new()),
                EngineOptions::default(),
                ApiOptions::default(),
            )
            .unwrap())
        }

        /// One request at `at_ms`: (status, body).
        pub fn at(&mut self, at_ms: u64, method: &str, path: &str, body: Value) -> (u64, Value) {
            let line = json!({"at_ms": at_ms, "method": method, "path": path, "body": body});
            let mut out = self.0.line(&line.to_string());
            (out["status"].as_u64().unwrap(), out["body"].take())
        }

        pub fn put_policy(&mut self, at_ms: u64, name: &str, def: Value) {
            let (status, body) = self.at(at_ms, "PUT", &format!("/v1/policies/{name}"), def);
            assert_eq!(status, 200, "{body}");
        }

        /// A check of `cost` on key "k" of policy `p`: (status, body).
        pub fn check(&mut self, at_ms: u64, p: &str, cost: u64) -> (u64, Value) {
            self.at(
                at_ms,
                "POST",
                "/v1/check",
                json!({"policy": p, "key": "k", "cost": cost}),
            )
        }
    }

    /// The decision's figures: (allowed, retry_after_ms, remaining, reset_after_ms).
    #[track_caller]
    pub fn figures(body: &Value) -> (bool, Option<u64>, u64, u64) {
        (
            body["allowed"].as_bool().unwrap(),
            body["retry_after_ms"].as_u64(),
            body["remaining"].as_u64().unwrap(),
            body["reset_after_ms"].as_u64().unwrap(),
        )
    }
}

#[test]
fn rate_near_2_53_keeps_its_tat_exact_far_past_the_year_2554() {
    use replay::{Api, MAX, T, figures};
    use serde_json::json;
    // rate 1 per 1d, burst B = 2^53 − 1: T = 1 d = 86_400_000 ms, and
    // burst·T = B days, about 2.5·10^16 years: the TAT is far past what 64-bit
    // ns reach (the year 2554).
    const B: u64 = (1 << 53) - 1;
    let mut api = Api::new();
    api.put_policy(
        T,
        "huge",
        json!({"limits": [{"kind": "rate", "rate": 1, "per": "1d", "burst": B}]}),
    );
    // Cost B: new − now = B·T = burst·T → allowed; TAT = now + B·T.
    // remaining = floor((B·T − B·T)/T) = 0; reset_after = B·T = B·86_400_000 ms,
    // over 2^53 − 1: saturated.
    let (status, body) = api.check(T, "huge", B);
    assert_eq!(status, 200, "{body}");
    assert_eq!(figures(&body), (true, None, 0, MAX));
    assert_eq!(body["limits"][0]["limit"], B);
    assert_eq!(body["limits"][0]["reset_after_ms"], MAX);
    // Cost 1 at the same instant: new − now = (B + 1)·T > B·T → denied;
    // retry_after = new − B·T − now = T = 86_400_000 ms.
    let (status, body) = api.check(T, "huge", 1);
    assert_eq!(status, 429, "{body}");
    assert_eq!(figures(&body), (false, Some(86_400_000), 0, MAX));
    // A reserve is denied alike and holds nothing.
    let (status, body) = api.at(
        T,
        "POST",
        "/v1/check",
        json!({"policy": "huge", "key": "k", "reserve": true, "reservation_id": "r0"}),
    );
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["reservation"], serde_json::Value::Null);
    // One day later one unit has come back: new − now = B·T again → allowed.
    // Reserved and released at once: refund d = min(T, tat_r − now) = T, so
    // TAT is back at NOW + B·T and the unit can be taken again, once.
    let day = 86_400_000;
    let (status, body) = api.at(
        T + day,
        "POST",
        "/v1/check",
        json!({"policy": "huge", "key": "k", "reserve": true, "reservation_id": "r1"}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(figures(&body), (true, None, 0, MAX));
    let (status, body) = api.at(
        T + day,
        "POST",
        "/v1/reservations/r1/release",
        serde_json::Value::Null,
    );
    assert_eq!(status, 200, "{body}");
    let (status, body) = api.check(T + day, "huge", 1);
    assert_eq!(status, 200, "{body}");
    assert_eq!(figures(&body), (true, None, 0, MAX));
    let (status, body) = api.check(T + day, "huge", 1);
    assert_eq!(status, 429, "{body}");
    assert_eq!(figures(&body), (false, Some(86_400_000), 0, MAX));
}

#[test]
fn rate_figures_beyond_64_bit_nanoseconds_are_exact() {
    use replay::{Api, T, figures};
    use serde_json::json;
    let mut api = Api::new();
    // rate 1 per 1d, burst 300 000: burst·T = 300 000 d = 2.592·10^19 ns, more
    // than 2^64 ns (1.8·10^19) but far below the saturation of 2^53 − 1 ms.
    api.put_policy(
        T,
        "long",
        json!({"limits": [{"kind": "rate", "rate": 1, "per": "1d", "burst": 300_000}]}),
    );
    let (status, body) = api.check(T, "long", 300_000);
    assert_eq!(status, 200, "{body}");
    // reset_after = 300 000 · 86 400 000 ms.
    assert_eq!(figures(&body), (true, None, 0, 25_920_000_000_000));
    // A day later: TAT − now = 299 999 d; one unit fits (new − now = burst·T).
    let day = 86_400_000;
    let (status, body) = api.check(T + day, "long", 1);
    assert_eq!(status, 200, "{body}");
    assert_eq!(figures(&body), (true, None, 0, 25_920_000_000_000));

    // rate 1000 per 1d: T = 86.4 s. Reserve 1 (TAT = NOW + T), commit at cost
    // 200 000 000: the extra 199 999 999 units advance TAT from max(TAT, now):
    // TAT = NOW + 200 000 000·T = NOW + 1.728·10^19 ns, past 2^64 ns since the
    // epoch. (A new replay: its clock cannot go back to NOW.)
    let mut api = Api::new();
    api.put_policy(
        T,
        "paid",
        json!({"limits": [{"kind": "rate", "rate": 1000, "per": "1d"}]}),
    );
    let (status, body) = api.at(
        T,
        "POST",
        "/v1/check",
        json!({"policy": "paid", "key": "k", "reserve": true, "reservation_id": "c1"}),
    );
    assert_eq!(status, 200, "{body}");
    let (status, body) = api.at(
        T,
        "POST",
        "/v1/reservations/c1/commit",
        json!({"cost": 200_000_000}),
    );
    assert_eq!(status, 200, "{body}");
    // reset_after = 200 000 000 · 86 400 ms = 17 280 000 000 000 ms.
    let (status, body) = api.check(T, "paid", 0);
    assert_eq!(status, 200, "{body}");
    assert_eq!(figures(&body), (true, None, 0, 17_280_000_000_000));
    // retry_after = TAT + T − 1000·T − now = 199 999 001 · 86 400 ms.
    let (status, body) = api.check(T, "paid", 1);
    assert_eq!(status, 429, "{body}");
    assert_eq!(
        figures(&body),
        (false, Some(17_279_913_686_400), 0, 17_280_000_000_000)
    );
}

#[test]
fn approximate_retry_into_an_empty_next_bucket_is_exact() {
    use replay::{Api, T, figures};
    use serde_json::json;
    // limit L = 2^53 − 1 per 1 s, approximate; NOW is a whole second.
    const L: u64 = (1 << 53) - 1;
    let mut api = Api::new();
    api.put_policy(
        T,
        "approx",
        json!({"limits": [{"kind": "window", "limit": L, "window": "1s", "precision": "approximate"}]}),
    );
    // +100 ms: cost 2^52 in the bucket [NOW, NOW + 1 s). remaining = L − 2^52;
    // reset = cur_start + 2W − now = 1900 ms.
    let (status, body) = api.check(T + 100, "approx", 1 << 52);
    assert_eq!(status, 200, "{body}");
    assert_eq!(figures(&body), (true, None, L - (1 << 52), 1900));
    // +1500 ms: prev = 2^52, cur = 0: estimate = floor(2^52 · 500/1000) = 2^51;
    // cost L does not fit. In this bucket the estimate stays ≥ 1 until its end
    // (2^52 · 1 ns / 1 s > 1), and the next bucket starts empty: L fits from its
    // first instant, NOW + 2 s. retry = 500 ms exactly; reset = cur_start + W −
    // now = 500 ms (the current bucket is empty).
    let (status, body) = api.check(T + 1500, "approx", L);
    assert_eq!(status, 429, "{body}");
    assert_eq!(figures(&body), (false, Some(500), L - (1 << 51), 500));
    assert_eq!(body["limits"][0]["retry_after_ms"], 500);
    // At the retry instant it passes.
    let (status, body) = api.check(T + 2000, "approx", L);
    assert_eq!(status, 200, "{body}");
    assert_eq!(figures(&body), (true, None, 0, 2000));
}
