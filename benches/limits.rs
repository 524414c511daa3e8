//! Decision throughput of freqcap, next to governor where governor has a peer.
//!
//! Both sides run on their normal real clocks (freqcap: `SystemClock`, through
//! `KeyedLimiter::new`; governor: its default quanta clock, through
//! `RateLimiter::keyed`) with equivalent quotas: 1000 per second, burst 1000.
//!
//! Groups:
//! - `hot_key`: one key, one thread. `freqcap`/`governor` use the 1000/s quota, so
//!   after the first burst almost every call is a *denial*; `*_allowed` use a quota
//!   far above the call rate, so almost every call is *allowed* and debits.
//! - `keyed_1m`: 1 000 000 random `u64` keys, pre-generated into a `Vec` (both
//!   sides pay the same for key generation) and all inserted before measuring, so
//!   the map is at full size; each call takes the next key of the `Vec`.
//!   `freqcap` (1000/s, an interval of whole ns) keeps 8-byte records;
//!   `freqcap_rate_record` (3/s: the TAT needs a remainder) 16-byte ones and
//!   `freqcap_stack_record` (a fixed window: the general record) 32-byte ones,
//!   to show what the entry size costs.
//! - `keyed_1m_2t`: the same with two threads, each doing half the iterations on
//!   its own half of the keys; the reported time is total wall time, so ns/op is
//!   the per-operation throughput time of the pair.
//! - `stack_3`: rate + fixed window + approximate rolling window on one hot key.
//!   governor has no stacks; `governor_3_limiters` checks three keyed limiters in
//!   turn (per second, per minute, per hour), which costs about what a stack does
//!   but is not atomic (a denial by the second still debited the first). As in
//!   `hot_key`, `freqcap` is `admit` (the peer of `check_key`) and
//!   `freqcap_figures` is `check`, which also reports every item's figures.
//! - `window_*`, `budget_even`, `gap`, `concurrency_reserve_release`: one item of
//!   each kind on a hot key, freqcap only. `freqcap` is a limit a hot key exceeds
//!   (mostly denials); `freqcap_allowed` one it does not (mostly allowed debits).
//!
//! Quick run: `cargo bench --bench limits -- --warm-up-time 1 --measurement-time 2`.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Barrier;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use freqcap::{KeyedLimiter, LimiterOptions, PolicyDef};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

/// The key of the hot-key groups.
const HOT: u64 = 0x5eed_cafe_f00d_0042;

/// Keys of the `keyed_1m*` groups.
const N_KEYS: usize = 1_000_000;

/// 1000 per second, burst 1000: the quota both sides use.
const PER_SECOND: &str =
    r#"{"limits": [{"kind": "rate", "rate": 1000, "per": "1s", "burst": 1000}]}"#;

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("quota must be positive")
}

fn policy(json: &str) -> PolicyDef {
    freqcap::model::from_json(json).expect("benchmark policy is valid")
}

/// A freqcap limiter on the system clock with default sizing.
fn freqcap_limiter(json: &str) -> KeyedLimiter<u64> {
    KeyedLimiter::new(&policy(json), LimiterOptions::default()).expect("valid policy")
}

fn governor_limiter(quota: Quota) -> DefaultKeyedRateLimiter<u64> {
    RateLimiter::keyed(quota)
}

/// splitmix64: a bijection on `u64`, so distinct inputs give distinct keys.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `N_KEYS` distinct pseudo-random keys.
fn random_keys() -> Vec<u64> {
    (0..N_KEYS as u64)
        .map(|i| splitmix64(i ^ 0x1234_5678))
        .collect()
}

/// A freqcap limiter sized so a million keys fit with room to spare: 256 MiB
/// (a million one-item records take about 64 MiB of table) and the default
/// shard count.
fn freqcap_1m(keys: &[u64], json: &str) -> KeyedLimiter<u64> {
    let opts = LimiterOptions {
        memory_budget: 256 << 20,
        ..LimiterOptions::default()
    };
    let lim = KeyedLimiter::new(&policy(json), opts).expect("valid policy");
    for k in keys {
        assert!(lim.check(k, 1).allowed);
    }
    assert_eq!(lim.len(), keys.len(), "every key must be held");
    let stats = lim.stats();
    assert_eq!(stats.evicted_idle.load(Ordering::Relaxed), 0);
    assert_eq!(stats.evicted_active.load(Ordering::Relaxed), 0);
    lim
}

fn governor_1m(keys: &[u64]) -> DefaultKeyedRateLimiter<u64> {
    let lim = governor_limiter(Quota::per_second(nz(1000)));
    for k in keys {
        assert!(lim.check_key(k).is_ok());
    }
    assert_eq!(lim.len(), keys.len());
    lim
}

fn hot_key(c: &mut Criterion) {
    let mut g = c.benchmark_group("hot_key");

    // `freqcap` is `admit`, the peer of governor's `check_key` (allow / deny and
    // when to retry); `freqcap_figures` is `check`, which also reports every
    // item's limit, remaining and reset for the RateLimit headers.
    let lim = freqcap_limiter(PER_SECOND);
    g.bench_function("freqcap", |b| {
        b.iter(|| black_box(lim.admit(black_box(&HOT), 1)))
    });
    g.bench_function("freqcap_figures", |b| {
        b.iter(|| black_box(lim.check(black_box(&HOT), 1)))
    });
    let gov = governor_limiter(Quota::per_second(nz(1000)));
    g.bench_function("governor", |b| {
        b.iter(|| black_box(gov.check_key(black_box(&HOT))))
    });

    // A quota far above the call rate: every call is allowed and debits.
    let lim = freqcap_limiter(
        r#"{"limits": [{"kind": "rate", "rate": 4294967295, "per": "1s", "burst": 4294967295}]}"#,
    );
    g.bench_function("freqcap_allowed", |b| {
        b.iter(|| {
            let d = lim.admit(black_box(&HOT), 1);
            debug_assert!(d.allowed);
            black_box(d)
        })
    });
    g.bench_function("freqcap_figures_allowed", |b| {
        b.iter(|| {
            let d = lim.check(black_box(&HOT), 1);
            debug_assert!(d.allowed);
            black_box(d)
        })
    });
    let gov = governor_limiter(Quota::per_second(nz(u32::MAX)));
    g.bench_function("governor_allowed", |b| {
        b.iter(|| black_box(gov.check_key(black_box(&HOT))))
    });
    g.finish();
}

fn keyed_1m(c: &mut Criterion, keys: &[u64]) {
    let mut g = c.benchmark_group("keyed_1m");

    let lim = freqcap_1m(keys, PER_SECOND);
    let mut i = 0usize;
    g.bench_function("freqcap", |b| {
        b.iter(|| {
            let k = &keys[i];
            i += 1;
            if i == keys.len() {
                i = 0;
            }
            black_box(lim.admit(black_box(k), 1))
        })
    });
    g.bench_function("freqcap_figures", |b| {
        b.iter(|| {
            let k = &keys[i];
            i += 1;
            if i == keys.len() {
                i = 0;
            }
            black_box(lim.check(black_box(k), 1))
        })
    });
    assert_eq!(lim.stats().evicted_active.load(Ordering::Relaxed), 0);
    drop(lim);

    // The larger record layouts, on the same keys.
    for (name, json) in [
        (
            "freqcap_rate_record",
            r#"{"limits": [{"kind": "rate", "rate": 3, "per": "1s", "burst": 1000}]}"#,
        ),
        (
            "freqcap_stack_record",
            r#"{"limits": [{"kind": "window", "limit": 1000, "window": "1h", "align": "fixed"}]}"#,
        ),
    ] {
        let lim = freqcap_1m(keys, json);
        let mut i = 0usize;
        g.bench_function(name, |b| {
            b.iter(|| {
                let k = &keys[i];
                i += 1;
                if i == keys.len() {
                    i = 0;
                }
                black_box(lim.admit(black_box(k), 1))
            })
        });
        drop(lim);
    }

    let gov = governor_1m(keys);
    let mut i = 0usize;
    g.bench_function("governor", |b| {
        b.iter(|| {
            let k = &keys[i];
            i += 1;
            if i == keys.len() {
                i = 0;
            }
            black_box(gov.check_key(black_box(k)))
        })
    });
    drop(gov);
    g.finish();
}

/// Runs `op` on two threads, each doing half of `iters` calls on its own half of
/// `keys` (continuing where it stopped in the previous sample), and returns the
/// wall time from the moment both are ready until both are done.
fn two_threads<R>(
    iters: u64,
    keys: &[u64],
    cursors: &[AtomicUsize; 2],
    op: impl Fn(&u64) -> R + Sync,
) -> Duration {
    let per_thread = iters.div_ceil(2);
    let half = keys.len() / 2;
    let barrier = Barrier::new(3);
    std::thread::scope(|s| {
        for (t, cursor) in cursors.iter().enumerate() {
            let mine = &keys[t * half..(t + 1) * half];
            let (barrier, op) = (&barrier, &op);
            s.spawn(move || {
                let mut i = cursor.load(Ordering::Relaxed);
                barrier.wait();
                for _ in 0..per_thread {
                    black_box(op(black_box(&mine[i])));
                    i += 1;
                    if i == mine.len() {
                        i = 0;
                    }
                }
                cursor.store(i, Ordering::Relaxed);
            });
        }
        barrier.wait();
        let start = Instant::now();
        // The scope joins both threads before returning.
        start
    })
    .elapsed()
}

fn keyed_1m_2t(c: &mut Criterion, keys: &[u64]) {
    let mut g = c.benchmark_group("keyed_1m_2t");

    let lim = freqcap_1m(keys, PER_SECOND);
    let cursors = [AtomicUsize::new(0), AtomicUsize::new(0)];
    g.bench_function("freqcap", |b| {
        b.iter_custom(|iters| two_threads(iters, keys, &cursors, |k| lim.admit(k, 1)))
    });
    g.bench_function("freqcap_figures", |b| {
        b.iter_custom(|iters| two_threads(iters, keys, &cursors, |k| lim.check(k, 1)))
    });
    assert_eq!(lim.stats().evicted_active.load(Ordering::Relaxed), 0);
    drop(lim);

    let gov = governor_1m(keys);
    let cursors = [AtomicUsize::new(0), AtomicUsize::new(0)];
    g.bench_function("governor", |b| {
        b.iter_custom(|iters| two_threads(iters, keys, &cursors, |k| gov.check_key(k)))
    });
    drop(gov);
    g.finish();
}

fn stack_3(c: &mut Criterion) {
    let mut g = c.benchmark_group("stack_3");
    let lim = freqcap_limiter(
        r#"{"limits": [
            {"kind": "rate", "rate": 1000, "per": "1s", "burst": 1000},
            {"kind": "window", "limit": 60000, "window": "1m", "align": "fixed"},
            {"kind": "window", "limit": 3600000, "window": "1h", "align": "rolling", "precision": "approximate"}
        ]}"#,
    );
    g.bench_function("freqcap", |b| {
        b.iter(|| black_box(lim.admit(black_box(&HOT), 1)))
    });
    g.bench_function("freqcap_figures", |b| {
        b.iter(|| black_box(lim.check(black_box(&HOT), 1)))
    });

    // Three limiters checked in turn, stopping at the first denial.
    let per_s = governor_limiter(Quota::per_second(nz(1000)));
    let per_m = governor_limiter(Quota::per_minute(nz(60_000)));
    let per_h = governor_limiter(Quota::per_hour(nz(3_600_000)));
    g.bench_function("governor_3_limiters", |b| {
        b.iter(|| {
            let k = black_box(&HOT);
            black_box(
                per_s
                    .check_key(k)
                    .and_then(|()| per_m.check_key(k))
                    .and_then(|()| per_h.check_key(k)),
            )
        })
    });

    let lim = freqcap_limiter(
        r#"{"limits": [
            {"kind": "rate", "rate": 4294967295, "per": "1s", "burst": 4294967295},
            {"kind": "window", "limit": 9000000000000000, "window": "1m", "align": "fixed"},
            {"kind": "window", "limit": 9000000000000000, "window": "1h", "align": "rolling", "precision": "approximate"}
        ]}"#,
    );
    g.bench_function("freqcap_allowed", |b| {
        b.iter(|| black_box(lim.admit(black_box(&HOT), 1)))
    });
    g.finish();
}

/// One group of a single-item policy on a hot key: `freqcap` with a limit the key
/// exceeds, and `freqcap_allowed` (when given) with one it does not.
fn single(c: &mut Criterion, group: &str, over: &str, allowed: Option<&str>) {
    let mut g = c.benchmark_group(group);
    let wrap = |item: &str| format!(r#"{{"limits": [{item}]}}"#);
    let lim = freqcap_limiter(&wrap(over));
    g.bench_function("freqcap", |b| {
        b.iter(|| black_box(lim.check(black_box(&HOT), 1)))
    });
    if let Some(item) = allowed {
        let lim = freqcap_limiter(&wrap(item));
        g.bench_function("freqcap_allowed", |b| {
            b.iter(|| {
                let d = lim.check(black_box(&HOT), 1);
                debug_assert!(d.allowed);
                black_box(d)
            })
        });
    }
    g.finish();
}

fn windows(c: &mut Criterion) {
    const HUGE: &str = "9000000000000000";
    single(
        c,
        "window_fixed",
        r#"{"kind": "window", "limit": 1000, "window": "1s", "align": "fixed"}"#,
        Some(&format!(
            r#"{{"kind": "window", "limit": {HUGE}, "window": "1s", "align": "fixed"}}"#
        )),
    );
    single(
        c,
        "window_calendar",
        r#"{"kind": "window", "limit": 1000, "window": "1h", "align": "calendar", "tz": "Europe/Paris"}"#,
        Some(&format!(
            r#"{{"kind": "window", "limit": {HUGE}, "window": "1h", "align": "calendar", "tz": "Europe/Paris"}}"#
        )),
    );
    // Exact logs keep one entry per debit (limit ≤ 4096). Over the limit the log
    // holds 1000 entries; the allowed case uses a 1 ms window, which a hot key
    // cannot fill with 4096 calls, so the log stays short.
    single(
        c,
        "window_rolling_exact",
        r#"{"kind": "window", "limit": 1000, "window": "1s", "align": "rolling", "precision": "exact"}"#,
        Some(
            r#"{"kind": "window", "limit": 4096, "window": "1ms", "align": "rolling", "precision": "exact"}"#,
        ),
    );
    single(
        c,
        "window_rolling_approx",
        r#"{"kind": "window", "limit": 1000, "window": "1s", "align": "rolling", "precision": "approximate"}"#,
        Some(&format!(
            r#"{{"kind": "window", "limit": {HUGE}, "window": "1s", "align": "rolling", "precision": "approximate"}}"#
        )),
    );
    // Even pacing: 1000 a day is a cap the hot key is always at; 9·10^15 a day
    // grows by about 10^5 per microsecond, faster than the key spends.
    single(
        c,
        "budget_even",
        r#"{"kind": "budget", "amount": 1000, "per": "1d", "pacing": "even"}"#,
        Some(&format!(
            r#"{{"kind": "budget", "amount": {HUGE}, "per": "1d", "pacing": "even"}}"#
        )),
    );
    // The shortest gap is 1 ms, so a hot key is nearly always denied.
    single(c, "gap", r#"{"kind": "gap", "min": "1ms"}"#, None);
}

fn concurrency(c: &mut Criterion) {
    let mut g = c.benchmark_group("concurrency_reserve_release");
    let lim = freqcap_limiter(r#"{"limits": [{"kind": "concurrency", "max": 10}]}"#);
    g.bench_function("freqcap", |b| {
        b.iter(|| {
            let (d, pending) = lim.reserve(black_box(&HOT), 1, 30 * freqcap::clock::SECOND);
            debug_assert!(d.allowed);
            if let Some(p) = &pending {
                lim.release(&HOT, p);
            }
            black_box((d, pending))
        })
    });
    g.finish();
}

fn keyed(c: &mut Criterion) {
    let keys = random_keys();
    keyed_1m(c, &keys);
    keyed_1m_2t(c, &keys);
}

criterion_group!(benches, hot_key, keyed, stack_3, windows, concurrency);
criterion_main!(benches);
