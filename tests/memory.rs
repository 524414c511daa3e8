//! Bytes per key: of each limit kind's state, and of a `KeyedLimiter` entry as
//! the process really allocates it.
//!
//! A counting global allocator (below) tracks the bytes live in this test binary,
//! so the cost of N keys is the difference before and after inserting them, not
//! an estimate. `VmRSS` from `/proc/self/status` is printed beside it as a rough
//! check that includes the allocator's own overhead (it is page-grained and sees
//! memory freed earlier being reused, so it is only reported, not asserted).
//!
//! `cargo test --release --test memory -- --nocapture` prints the figures.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use freqcap::keyed::{RateRecord, Record, RecordLayout, StackRecord, TatRecord};
use freqcap::limits::ItemState;
use freqcap::limits::budget::BudgetState;
use freqcap::limits::concurrency::ConcurrencyState;
use freqcap::limits::rate::RateState;
use freqcap::limits::window::{
    ApproxState, CounterState, Debit, Layout as WindowLayout, LogState, Window,
};
use freqcap::{KeyedLimiter, LimiterOptions, ManualClock, PolicyDef};

/// The system allocator, counting the bytes currently allocated through it.
struct Counting;

/// Bytes requested and not yet freed, over the whole process.
static LIVE: AtomicIsize = AtomicIsize::new(0);

thread_local! {
    /// Bytes this thread allocated minus bytes it freed. Each test measures on
    /// its own thread, so what the harness or another test allocates meanwhile
    /// does not count. (A `const` `Cell` needs no destructor, so it can be used
    /// from inside the allocator at any time.)
    static THREAD_LIVE: Cell<isize> = const { Cell::new(0) };
}

fn add(n: usize) {
    LIVE.fetch_add(n as isize, Ordering::Relaxed);
    let _ = THREAD_LIVE.try_with(|c| c.set(c.get() + n as isize));
}

fn sub(n: usize) {
    LIVE.fetch_sub(n as isize, Ordering::Relaxed);
    let _ = THREAD_LIVE.try_with(|c| c.set(c.get() - n as isize));
}

// SAFETY: every call is forwarded to `System` with the caller's arguments; the
// counting touches only an atomic.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is; the caller upholds `alloc`'s contract.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            add(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            add(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, i.e. from `System`, with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        sub(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from `System` with `layout`; the caller upholds the rest.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            add(new_size);
            sub(layout.size());
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The keyed tests also read the process-wide RSS, so they run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Bytes live from this thread's allocations (see `THREAD_LIVE`).
fn live() -> isize {
    THREAD_LIVE.with(Cell::get)
}

/// Bytes live over the whole process.
fn process_live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// Resident set size in bytes, from `/proc/self/status` (None off Linux).
fn rss() -> Option<isize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: isize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

const N: usize = 200_000;

/// An arbitrary instant (2023-11-14); the manual clock keeps every key active.
const T0: u64 = 1_700_000_000_000_000_000;

/// splitmix64: distinct inputs give distinct keys.
fn key(i: u64) -> u64 {
    let mut z = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[test]
fn state_sizes() {
    let sizes = [
        ("RateState", size_of::<RateState>(), 16),
        ("CounterState", size_of::<CounterState>(), 24),
        ("ApproxState", size_of::<ApproxState>(), 24),
        // 48 until the pacing levers' controller (docs/pacing.md, "Levers"):
        // 24 bytes more in every budget's box, levers or not.
        ("BudgetState (boxed)", size_of::<BudgetState>(), 72),
        ("LogState (boxed)", size_of::<LogState>(), 40),
        ("Debit (per log entry)", size_of::<Debit>(), 16),
        ("ConcurrencyState", size_of::<ConcurrencyState>(), 24),
        ("ItemState", size_of::<ItemState>(), 32),
        ("StackRecord", size_of::<StackRecord>(), 32),
        (
            "TatRecord (one whole-ns rate item)",
            size_of::<TatRecord>(),
            8,
        ),
        ("RateRecord (one rate item)", size_of::<RateRecord>(), 16),
        (
            "(u64, StackRecord) map entry",
            size_of::<(u64, StackRecord)>(),
            40,
        ),
        (
            "(u64, TatRecord) map entry",
            size_of::<(u64, TatRecord)>(),
            16,
        ),
        (
            "(u64, RateRecord) map entry",
            size_of::<(u64, RateRecord)>(),
            24,
        ),
    ];
    println!("inline state sizes:");
    for (name, size, bound) in sizes {
        println!("  {name:<30} {size:>4} bytes");
        assert!(size <= bound, "{name} is {size} bytes, more than {bound}");
    }
    // Per key, an item's state costs its ItemState slot plus what it owns on the
    // heap: a budget adds its box, a log its box and one Debit per entry.
    println!(
        "per item per key: rate/counter/approx/gap {} B, budget {} B, concurrency {} B + 8 per open slot",
        size_of::<ItemState>(),
        size_of::<ItemState>() + size_of::<BudgetState>(),
        size_of::<ItemState>(),
    );
}

#[test]
fn exact_rolling_log_heap() {
    let _g = serial();
    let window = Window {
        limit: 4096,
        layout: WindowLayout::Rolling {
            w: 3_600 * freqcap::clock::SECOND,
        },
    };
    println!("exact rolling log, heap per key (counting allocator):");
    for k in [1u64, 2, 10, 100, 1000, 4096] {
        let before = live();
        let mut rec = StackRecord::One(ItemState::Log(Box::default()));
        let ItemState::Log(log) = &mut rec.states_mut()[0] else {
            unreachable!("just built as a log")
        };
        // Distinct instants, so no two debits share an entry.
        for i in 0..k {
            window.log_push(log, T0 + i, 1);
        }
        assert_eq!(log.debits.len() as u64, k);
        let cap = log.debits.capacity();
        let heap = (live() - before) as usize;
        let accounted = rec.heap_bytes();
        drop(rec);
        // Checked before printing: printing allocates on this thread too.
        let freed = live() == before;
        println!(
            "  k = {k:>4}: {heap:>6} B heap ({:.1} B/entry; capacity {cap}), heap_bytes() says {accounted}",
            heap as f64 / k as f64,
        );
        assert!(freed, "k = {k}: the log must free everything it took");
        // The record's own accounting (what the memory budget sees) is exact.
        assert_eq!(accounted, heap, "heap_bytes() must match the allocator");
        // A box of 40 bytes plus a deque that at most doubles past k entries.
        let bound = size_of::<LogState>() + size_of::<Debit>() * (2 * k as usize).max(8);
        assert!(heap <= bound, "k = {k}: {heap} B > {bound} B");
    }
}

/// Inserts N keys into a limiter for `json` and reports bytes per key three ways:
/// the limiter's own `memory_bytes()`, the counting allocator, and VmRSS.
/// Returns (memory_bytes()/N, allocated/N).
fn keyed_bytes_per_key(label: &str, json: &str, layout: RecordLayout) -> (f64, f64) {
    let _g = serial();
    let policy: PolicyDef = freqcap::model::from_json(json).expect("valid policy");
    let opts = LimiterOptions {
        memory_budget: 256 << 20,
        ..LimiterOptions::default()
    };

    let (live0, process0, rss0) = (live(), process_live(), rss());
    let lim: KeyedLimiter<u64, ManualClock> =
        KeyedLimiter::with_clock(&policy, opts, ManualClock::new(T0)).expect("valid policy");
    let empty = live() - live0;
    assert_eq!(lim.record_layout(), layout, "{label}");
    for i in 0..N as u64 {
        assert!(lim.check(&key(i), 1).allowed);
    }
    let (live1, process1, rss1) = (live(), process_live(), rss());

    assert_eq!(lim.len(), N, "{label}: every key must be held");
    assert_eq!(lim.stats().evicted_idle.load(Ordering::Relaxed), 0);
    assert_eq!(lim.stats().evicted_active.load(Ordering::Relaxed), 0);

    let n = N as f64;
    let reported = lim.memory_bytes() as f64 / n;
    let allocated = (live1 - live0) as f64 / n;
    // Memory an earlier test freed is reused without growing the RSS, so a
    // small or negative delta says nothing; it is only printed.
    let rss_per_key = match (rss0, rss1) {
        (Some(a), Some(b)) if b > a => format!("{:.1} B/key", (b - a) as f64 / n),
        (Some(_), Some(_)) => "n/a (reused freed memory)".to_owned(),
        _ => "n/a".to_owned(),
    };
    println!(
        "{label}: {N} keys, {} shards: memory_bytes() {reported:.1} B/key, \
         allocated {allocated:.1} B/key (process-wide {:.1}; empty limiter {empty} B), \
         VmRSS delta {rss_per_key}",
        opts.shards.next_power_of_two(),
        (process1 - process0) as f64 / n,
    );

    drop(lim);
    let leaked = live() - live0;
    assert!(
        leaked.abs() < 64 << 10,
        "{label}: {leaked} B still live after drop"
    );
    (reported, allocated)
}

/// The limiter's accounting (which its memory budget enforces) must be close to
/// what it really allocates: within 10 %, plus the fixed shard array.
fn assert_accounting(label: &str, reported: f64, allocated: f64) {
    let ratio = reported / allocated;
    assert!(
        (0.9..=1.1).contains(&ratio),
        "{label}: memory_bytes() says {reported:.1} B/key but {allocated:.1} B/key were allocated"
    );
}

#[test]
fn keyed_one_rate_item() {
    let label = "rate 10/h (1 item, whole-ns interval)";
    let (reported, allocated) = keyed_bytes_per_key(
        label,
        r#"{"limits": [{"kind": "rate", "rate": 10, "per": "1h"}]}"#,
        RecordLayout::Tat,
    );
    // A 16-byte entry plus a control byte, in a table kept 7/16 to 7/8 full.
    assert!(
        allocated <= 17.0 * 16.0 / 7.0,
        "{label}: {allocated:.1} B/key"
    );
    assert_accounting(label, reported, allocated);
}

#[test]
fn keyed_one_fractional_rate_item() {
    let label = "rate 3/s (1 item, interval 1/3 s)";
    let (reported, allocated) = keyed_bytes_per_key(
        label,
        r#"{"limits": [{"kind": "rate", "rate": 3, "per": "1s"}]}"#,
        RecordLayout::Rate,
    );
    // A 24-byte entry plus a control byte, in a table kept 7/16 to 7/8 full.
    assert!(
        allocated <= 25.0 * 16.0 / 7.0,
        "{label}: {allocated:.1} B/key"
    );
    assert_accounting(label, reported, allocated);
}

#[test]
fn keyed_one_window_item() {
    let label = "fixed window (1 item)";
    let (reported, allocated) = keyed_bytes_per_key(
        label,
        r#"{"limits": [{"kind": "window", "limit": 100, "window": "1h", "align": "fixed"}]}"#,
        RecordLayout::Stack,
    );
    // A 40-byte entry plus a control byte, in a table kept 7/16 to 7/8 full.
    assert!(
        allocated <= 41.0 * 16.0 / 7.0,
        "{label}: {allocated:.1} B/key"
    );
    assert_accounting(label, reported, allocated);
}

#[test]
fn keyed_stack_of_three() {
    let label = "stack_3 (rate + fixed + approx)";
    let (reported, allocated) = keyed_bytes_per_key(
        label,
        r#"{"limits": [
            {"kind": "rate", "rate": 10, "per": "1h"},
            {"kind": "window", "limit": 100, "window": "1h", "align": "fixed"},
            {"kind": "window", "limit": 1000, "window": "1d", "align": "rolling", "precision": "approximate"}
        ]}"#,
        RecordLayout::Stack,
    );
    // The table entry as above plus a boxed slice of three 32-byte states.
    assert!(
        allocated <= 96.0 + 3.0 * 32.0,
        "{label}: {allocated:.1} B/key"
    );
    assert_accounting(label, reported, allocated);
}

#[test]
fn keyed_exact_rolling_one_debit() {
    let label = "rolling exact (1 debit/key)";
    let (reported, allocated) = keyed_bytes_per_key(
        label,
        r#"{"limits": [{"kind": "window", "limit": 100, "window": "1h", "align": "rolling", "precision": "exact"}]}"#,
        RecordLayout::Stack,
    );
    // The table entry, the 40-byte log box and a deque buffer of a few entries.
    assert!(
        allocated <= 96.0 + 40.0 + 4.0 * 16.0,
        "{label}: {allocated:.1} B/key"
    );
    assert_accounting(label, reported, allocated);
}

/// Bytes a node in a region keeps per user it counted (src/engine/
/// travellers.rs: a user's entry, its count field, its open screen until
/// committed): one user's screen and commit on a node in a region, less the
/// same on a node in no region, over 20 000 new users. Bounds what
/// `MAX_USERS` users take.
#[test]
fn a_region_keeps_bytes_per_user_it_counted() {
    use std::sync::Arc;

    use freqcap::engine::{
        CommitRequest, Engine, EngineOptions, SafeCapacity, ScreenCandidate, ScreenRequest,
    };
    use freqcap::model::from_json;
    use freqcap::store::SharedMemory;

    const USERS: usize = 20_000;
    let _g = serial();
    let per_user = |region: bool| -> f64 {
        let clock = Arc::new(ManualClock::new(1_700_000_000_000_000_000));
        let options = EngineOptions {
            node_id: "n0".into(),
            ..EngineOptions::default()
        };
        let n = Engine::open(Arc::new(SharedMemory::new()), clock, options).expect("opens");
        if region {
            n.join_region(
                "a-region",
                SafeCapacity::Keep,
                Arc::new(SharedMemory::new()),
            )
            .expect("joins");
        }
        n.put_campaign(
            "a-campaign",
            from_json(
                r#"{"caps": [{"kind": "window", "limit": 3, "window": "1d", "align": "fixed"}]}"#,
            )
            .expect("a campaign"),
        )
        .expect("defined");
        let serve = |u: usize| {
            let req = ScreenRequest {
                priority: Default::default(),
                user: Some(format!("user-{u:08}")),
                ids: Default::default(),
                candidates: vec![ScreenCandidate {
                    campaign: "a-campaign".into(),
                    cost: None,
                }],
                reserve: true,
                ttl_ms: Some(1000),
                reservation_id: None,
                fingerprint: None,
            };
            let out = n.screen(&req).expect("a screen");
            let id = out.reservation.expect("eligible: a new user");
            let commit = CommitRequest {
                campaigns: vec!["a-campaign".into()],
                ..CommitRequest::default()
            };
            n.commit(&id, &commit).expect("a commit");
        };
        // Warm: the maps' first growth and the campaign's records.
        for u in 0..1_000 {
            serve(u);
        }
        let before = live();
        for u in 1_000..1_000 + USERS {
            serve(u);
        }
        (live() - before) as f64 / USERS as f64
    };
    let plain = per_user(false);
    let in_region = per_user(true);
    let travel = in_region - plain;
    println!(
        "bytes per user counted: {plain:.0} in no region, {in_region:.0} in a region: \
         {travel:.0} for users across regions"
    );
    // 248 measured (558 with a map per user's fields): src/engine/
    // travellers.rs MAX_USERS (200 000) users of one field each within
    // 60 MB.
    assert!(travel <= 300.0, "{travel:.0} B a user across regions");
}
