//! redis-cell's `CL.THROTTLE` behaviour, reproduced in freqcap terms.
//!
//! redis-cell (github.com/brandur/redis-cell) is a GCRA rate limiter for Redis:
//!
//! ```text
//! CL.THROTTLE <key> <max_burst> <count per period> <period> [<quantity>]
//! → [limited (0|1), limit, remaining, retry_after (s, -1 if allowed), reset_after (s)]
//! ```
//!
//! **Mapping.** redis-cell's tolerance is T·(max_burst + 1) and it reports
//! `limit = max_burst + 1`: its `max_burst` counts the units that may come *on top
//! of* the one an idle key always gets. freqcap's `burst` is the number of units
//! that pass at once after idling (docs/semantics.md §2.1), which is redis-cell's reported
//! limit. So `CL.THROTTLE k B C P Q` is the policy
//! `{"kind": "rate", "rate": C, "per": "<P>s", "burst": B + 1}` decided for key `k`
//! with cost `Q`, and both report the same `limit`. The response maps to
//! `[!allowed, limit, remaining, retry_after (null ↔ -1), reset_after]`.
//!
//! **Units.** redis-cell reports times truncated to whole seconds (its issue #56:
//! waiting `Retry-After` may not be enough), and the implementation whose table is
//! reproduced here also compares the time difference in whole seconds. freqcap is
//! exact: figures in ns here, whole ms rounded up in the API, so waiting
//! `retry_after` always succeeds. The tables use instants where both agree; the
//! last test shows where freqcap deliberately differs.

use std::sync::Arc;

use freqcap::limits::stack::Decision;
use freqcap::model::from_json;
use freqcap::{ItemFigures, KeyedLimiter, LimiterOptions, ManualClock, PolicyDef};

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;

/// 2026-01-01T00:00:00Z.
const START: u64 = 1_767_225_600_000_000_000;

/// A keyed limiter standing in for `CL.THROTTLE <key> max_burst count period`, on a
/// manual clock.
struct Throttle {
    limiter: KeyedLimiter<String, Arc<ManualClock>>,
    clock: Arc<ManualClock>,
}

impl Throttle {
    fn new(max_burst: u64, count: u64, period_s: u64) -> Throttle {
        let json = format!(
            r#"{{"limits":[{{"kind":"rate","rate":{count},"per":"{period_s}s","burst":{}}}]}}"#,
            max_burst + 1
        );
        let policy: PolicyDef = from_json(&json).unwrap();
        let clock = Arc::new(ManualClock::new(START));
        let limiter =
            KeyedLimiter::with_clock(&policy, LimiterOptions::default(), clock.clone()).unwrap();
        Throttle { limiter, clock }
    }

    /// `CL.THROTTLE key ... quantity` at `START + at`.
    fn throttle(&self, key: &str, at: u64, quantity: u64) -> Decision {
        self.clock.set(START + at);
        self.limiter.check(key, quantity)
    }
}

/// One row of a redis-cell table: at (from START), quantity, then the expected
/// response in freqcap terms.
struct Case {
    at: u64,
    quantity: u64,
    allowed: bool,
    remaining: u64,
    reset_after: u64,
    /// `None` ↔ redis-cell's -1 (allowed, or can never pass).
    retry_after: Option<u64>,
}

const fn case(
    at: u64,
    quantity: u64,
    allowed: bool,
    remaining: u64,
    reset_after: u64,
    retry_after: Option<u64>,
) -> Case {
    Case {
        at,
        quantity,
        allowed,
        remaining,
        reset_after,
        retry_after,
    }
}

fn run(t: &Throttle, key: &str, limit: u64, cases: &[Case]) {
    for (i, c) in cases.iter().enumerate() {
        let d = t.throttle(key, c.at, c.quantity);
        let want = ItemFigures {
            allowed: c.allowed,
            limit,
            remaining: c.remaining,
            reset_after: c.reset_after.into(),
            retry_after: c.retry_after.map(u128::from),
        };
        assert_eq!(d.items.as_slice(), &[want], "case {i}");
        assert_eq!(
            (d.allowed, d.remaining, d.reset_after, d.retry_after),
            (
                c.allowed,
                c.remaining,
                c.reset_after.into(),
                c.retry_after.map(u128::from)
            ),
            "case {i}: decision"
        );
    }
}

#[test]
fn readme_example_user123_15_30_60() {
    // CL.THROTTLE user123 15 30 60 → [0, 16, 15, -1, 2]: max_burst 15 → burst 16,
    // 30 per 60 s → T = 2 s. The first unit: TAT = now + 2 s, remaining
    // floor((16·2 − 2)/2) = 15, reset 2 s.
    let t = Throttle::new(15, 30, 60);
    let d = t.throttle("user123", 0, 1);
    assert_eq!(d.items.as_slice(), &[ok(16, 15, 2 * S)]);
    // 15 more at the same instant drain the bucket: after k units TAT = 2k s,
    // remaining 16 − k; after 16, remaining 0 and reset 32 s.
    for k in 2..=16 {
        let d = t.throttle("user123", 0, 1);
        assert_eq!(d.items[0], ok(16, 16 - k, 2 * k * S), "unit {k}");
    }
    // The 17th: new TAT 34 s, retry = 34 − 32 = 2 s → [1, 16, 0, 2, 32].
    let d = t.throttle("user123", 0, 1);
    assert_eq!(d.items[0], no(16, 0, 32 * S, Some(2 * S)));
    // It passes after exactly one emission interval.
    assert!(t.throttle("user123", 2 * S, 1).allowed);
    // Another key is its own bucket.
    assert_eq!(t.throttle("user456", 2 * S, 1).items[0], ok(16, 15, 2 * S));
    // A quantity of 3 on a fresh key: TAT 6 s, remaining floor((32 − 6)/2) = 13.
    assert_eq!(t.throttle("user789", 2 * S, 3).items[0], ok(16, 13, 6 * S));
}

#[test]
fn limit_5_one_per_second_table() {
    // redis-cell's own table: limit 5 (max_burst 4), 1 per second; T = 1 s,
    // burst·T = 5 s. Rows: at, quantity, allowed, remaining, reset_after, retry.
    let cases = [
        // A request larger than the burst can never pass: retry null (-1); nothing
        // is debited, so remaining 5 and reset 0.
        case(0, 6, false, 5, 0, None),
        // Drain the burst: TAT = k s, remaining 5 − k, reset k s.
        case(0, 1, true, 4, S, None),
        case(0, 1, true, 3, 2 * S, None),
        case(0, 1, true, 2, 3 * S, None),
        case(0, 1, true, 1, 4 * S, None),
        case(0, 1, true, 0, 5 * S, None),
        // Denied: new TAT 6 s, retry = 6 − 5 − 0 = 1 s.
        case(0, 1, false, 0, 5 * S, Some(S)),
        // Partial refill. At 3 s: new TAT 6 s, 6 − 3 ≤ 5; remaining
        // floor((3 + 5 − 6)/1) = 2, reset 3 s.
        case(3_000 * MS, 1, true, 2, 3 * S, None),
        // At 3.1 s: TAT 7 s; remaining floor(3.1 + 5 − 7) = floor(1.1) = 1,
        // reset 3.9 s.
        case(3_100 * MS, 1, true, 1, 3_900 * MS, None),
        // At 4 s: TAT 8 s; remaining floor(4 + 5 − 8) = 1, reset 4 s.
        case(4_000 * MS, 1, true, 1, 4 * S, None),
        // At 8 s: the bucket is full again; TAT = 8 + 1 = 9 s → remaining 4, reset 1 s.
        case(8_000 * MS, 1, true, 4, S, None),
        // At 9.5 s: TAT 9 s < now → TAT = 10.5 s → remaining 4, reset 1 s.
        case(9_500 * MS, 1, true, 4, S, None),
        // Peek (quantity 0): the same figures, nothing debited.
        case(9_500 * MS, 0, true, 4, S, None),
        // Quantity 2: TAT 12.5 s → remaining floor(9.5 + 5 − 12.5) = 2, reset 3 s.
        case(9_500 * MS, 2, true, 2, 3 * S, None),
        // Quantity 5 (≤ burst, so it can pass later): new TAT 17.5 s, 17.5 − 9.5 = 8
        // > 5 → denied, retry = 17.5 − 5 − 9.5 = 3 s; state unchanged.
        case(9_500 * MS, 5, false, 2, 3 * S, Some(3 * S)),
    ];
    run(&Throttle::new(4, 1, 1), "foo", 5, &cases);
}

#[test]
fn peek_does_not_debit() {
    let t = Throttle::new(4, 1, 1);
    t.throttle("k", 0, 2);
    for _ in 0..3 {
        let d = t.throttle("k", 500 * MS, 0);
        // TAT 2 s: remaining floor(0.5 + 5 − 2) = 3, reset 1.5 s.
        assert_eq!(d.items[0], ok(5, 3, 1_500 * MS));
        assert!(d.allowed);
    }
    // A peek on a key never seen stores nothing.
    let before = t.limiter.len();
    assert_eq!(t.throttle("never-seen", S, 0).items[0], ok(5, 5, 0));
    assert_eq!(t.limiter.len(), before);
}

#[test]
fn max_burst_zero_is_one_unit_at_a_time() {
    // CL.THROTTLE thekey 0 2 1 (redis-cell issue #12): burst 1, 2 per second, so
    // T = 500 ms and limit 1: every unit must wait for the previous one.
    let t = Throttle::new(0, 2, 1);
    let cases = [
        case(0, 1, true, 0, 500 * MS, None),
        case(250 * MS, 1, false, 0, 250 * MS, Some(250 * MS)),
        case(500 * MS, 1, true, 0, 500 * MS, None),
        // Quantity 2 > burst 1: never.
        case(2 * S, 2, false, 1, 0, None),
    ];
    run(&t, "thekey", 1, &cases);
}

#[test]
fn separate_keys_are_separate_limits() {
    // CL.THROTTLE user123-read-rate 15 30 60 and user123-write-rate 5 10 60: two
    // buckets; draining one leaves the other alone.
    let read = Throttle::new(15, 30, 60);
    let write = Throttle::new(5, 10, 60);
    // write: burst 6, T = 6 s.
    for _ in 0..6 {
        assert!(write.throttle("user123-write-rate", 0, 1).allowed);
    }
    let d = write.throttle("user123-write-rate", 0, 1);
    assert_eq!(d.items[0], no(6, 0, 36 * S, Some(6 * S)));
    assert_eq!(
        read.throttle("user123-read-rate", 0, 1).items[0],
        ok(16, 15, 2 * S)
    );
}

#[test]
fn waiting_retry_after_always_succeeds() {
    // redis-cell decides with the time difference truncated to whole seconds, so
    // after draining a 5-unit bucket it admits a request at 0.3 s (diff −0.7 s
    // truncates to 0) and reports retry_after in whole seconds rounded down.
    // freqcap is exact: at 0.3 s the next unit is 0.7 s away.
    let t = Throttle::new(4, 1, 1);
    t.throttle("k", 0, 5);
    let d = t.throttle("k", 300 * MS, 1);
    assert_eq!(d.items[0], no(5, 0, 4_700 * MS, Some(700 * MS)));
    // 1 ns early is still too early; exactly retry_after later passes.
    assert!(!t.throttle("k", S - 1, 1).allowed);
    assert!(t.throttle("k", S, 1).allowed);
}

fn ok(limit: u64, remaining: u64, reset_after: u64) -> ItemFigures {
    ItemFigures {
        allowed: true,
        limit,
        remaining,
        reset_after: reset_after.into(),
        retry_after: None,
    }
}

fn no(limit: u64, remaining: u64, reset_after: u64, retry_after: Option<u64>) -> ItemFigures {
    ItemFigures {
        allowed: false,
        limit,
        remaining,
        reset_after: reset_after.into(),
        retry_after: retry_after.map(u128::from),
    }
}
