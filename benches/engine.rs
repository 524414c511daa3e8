//! The engine's speed and memory (issue 3 §8).
//!
//! - `screen`: a screen of 50 candidates for one user who has 20 active caps
//!   (hot, in memory): `dry` decides without reserving; `reserve_release`
//!   reserves every eligible candidate and releases them.
//! - `commit_wal` / `commit_fsync`: acknowledged commits on RocksDB in a temp
//!   dir, with 1, 16 and 64 concurrent committers. Each committer first reserves
//!   its share (untimed), then all commit at once; the time is wall time for all
//!   commits, so ns/op is the inverse of commits per second.
//! - Before the groups, the hot tier's bytes per (user, campaign) counter with
//!   1 000 000 users x 5 campaigns is measured and printed.
//! - `commit_open/<n>`: commit one reservation of a budgeted campaign that
//!   has `n` other reservations open (1, 10 000, 100 000, 500 000), in
//!   memory: settling one must not cost more with more open.
//! - `expire` (only when named: `cargo bench --bench engine -- expire`):
//!   500 000 reservations open on one budgeted campaign expire at once; prints
//!   the rate, and the latency of dry screens and usage reads another thread
//!   makes meanwhile.
//!
//! Run: `cargo bench --bench engine` (quick: add `-- --warm-up-time 1
//! --measurement-time 3`).

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use freqcap::engine::{
    CommitRequest, Engine, EngineOptions, Event, ScreenCandidate, ScreenRequest,
};
use freqcap::model::CampaignDef;
use freqcap::store::{Durability, MemoryStore, RocksStore, Store};
use freqcap::{ManualClock, SystemClock};

fn campaign(json: &str) -> CampaignDef {
    freqcap::model::from_json(json).expect("bench campaign is valid")
}

/// A per-user daily cap far above what a bench reaches, so every candidate
/// stays eligible.
const CAPPED: &str =
    r#"{"caps": [{"kind": "window", "limit": 1000000000, "window": "1d", "align": "calendar"}]}"#;

fn engine(store: Arc<dyn Store>) -> Engine<SystemClock> {
    Engine::open(store, SystemClock::new(), EngineOptions::default()).expect("engine opens")
}

fn screen_req(user: &str, camps: &[String], reserve: bool) -> ScreenRequest {
    ScreenRequest {
        priority: Default::default(),
        user: Some(user.to_owned()),
        ids: Vec::new(),
        candidates: camps
            .iter()
            .map(|c| ScreenCandidate {
                campaign: c.clone(),
                cost: None,
            })
            .collect(),
        reserve,
        ttl_ms: Some(60_000),
        reservation_id: None,
        fingerprint: None,
    }
}

fn screen(c: &mut Criterion) {
    let e = engine(Arc::new(MemoryStore::new()));
    let camps: Vec<String> = (0..50).map(|i| format!("camp-{i}")).collect();
    for name in &camps {
        e.put_campaign(name, campaign(CAPPED)).expect("stored");
    }
    // The user has seen 20 of the 50: 20 active counters in its record.
    for name in &camps[..20] {
        let ev = Event {
            user: Some("hot-user".into()),
            ids: Vec::new(),
            campaign: name.clone(),
            cost: 1,
            event_id: None,
            event_type: None,
        };
        e.events(&[ev]).expect("counted");
    }
    let mut g = c.benchmark_group("screen");
    let dry = screen_req("hot-user", &camps, false);
    g.bench_function("dry_50", |b| {
        b.iter(|| black_box(e.screen(black_box(&dry))))
    });
    let res = screen_req("hot-user", &camps, true);
    g.bench_function("reserve_release_50", |b| {
        b.iter(|| {
            let s = e.screen(black_box(&res)).expect("screened");
            if let Some(id) = s.reservation {
                e.release(&id).expect("released");
            }
        })
    });
    g.finish();
}

fn commits(c: &mut Criterion, durability: Durability, group: &str) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Arc::new(RocksStore::open(dir.path(), durability).expect("store opens"));
    let e = engine(store);
    e.put_campaign("c", campaign(CAPPED)).expect("stored");
    let camps = vec!["c".to_owned()];
    let mut g = c.benchmark_group(group);
    g.sample_size(10);
    for committers in [1usize, 16, 64] {
        g.bench_function(format!("{committers}"), |b| {
            b.iter_custom(|iters| {
                let per = (iters as usize).div_ceil(committers);
                let barrier = Barrier::new(committers + 1);
                let mut total = Duration::ZERO;
                std::thread::scope(|s| {
                    for t in 0..committers {
                        let (e, camps, barrier) = (&e, &camps, &barrier);
                        s.spawn(move || {
                            let ids: Vec<String> = (0..per)
                                .map(|i| {
                                    let user = format!("u{t}-{i}");
                                    e.screen(&screen_req(&user, camps, true))
                                        .expect("screened")
                                        .reservation
                                        .expect("eligible")
                                })
                                .collect();
                            barrier.wait();
                            let req = CommitRequest {
                                campaigns: vec!["c".into()],
                                ..CommitRequest::default()
                            };
                            for id in ids {
                                e.commit(&id, &req).expect("committed");
                            }
                            barrier.wait();
                        });
                    }
                    barrier.wait();
                    let start = Instant::now();
                    barrier.wait();
                    total = start.elapsed();
                });
                // Time per commit, scaled back to the iterations asked for.
                total.mul_f64(iters as f64 / (per * committers) as f64)
            })
        });
    }
    g.finish();
}

fn commit_wal(c: &mut Criterion) {
    commits(c, Durability::Wal, "commit_wal");
}

fn commit_fsync(c: &mut Criterion) {
    commits(c, Durability::Fsync, "commit_fsync");
}

/// Hot-tier bytes per (user, campaign) counter with 1 000 000 users x 5
/// campaigns, each counter debited once.
fn memory_per_counter() {
    let users = 1_000_000;
    let e = engine(Arc::new(MemoryStore::new()));
    let camps: Vec<String> = (0..5).map(|i| format!("m{i}")).collect();
    for name in &camps {
        e.put_campaign(name, campaign(CAPPED)).expect("stored");
    }
    let start = Instant::now();
    for u in 0..users {
        let user = format!("user-{u}");
        let evs: Vec<Event> = camps
            .iter()
            .map(|c| Event {
                user: Some(user.clone()),
                ids: Vec::new(),
                campaign: c.clone(),
                cost: 1,
                event_id: None,
                event_type: None,
            })
            .collect();
        e.events(&evs).expect("counted");
    }
    let counters = users * camps.len();
    println!(
        "hot tier: {} records, {} bytes, {:.1} bytes per (user, campaign) counter \
         ({} counters, filled in {:.1?})",
        e.hot_len(),
        e.hot_bytes(),
        e.hot_bytes() as f64 / counters as f64,
        counters,
        start.elapsed()
    );
}

fn memory(_: &mut Criterion) {
    // Only under `cargo bench` (which passes --bench), not when `cargo test`
    // runs the benches once as a smoke test; FREQCAP_BENCH_SKIP_MEMORY skips it.
    let benching = std::env::args().any(|a| a == "--bench");
    if benching && std::env::var_os("FREQCAP_BENCH_SKIP_MEMORY").is_none() {
        memory_per_counter();
    }
}

/// A budgeted campaign (and a per-user cap): each reservation holds a debit
/// in the campaign's record and one in its user's.
const BUDGETED: &str = r#"{"budget": {"amount": 1000000000000, "per": "1d", "pacing": "asap"},
    "caps": [{"kind": "window", "limit": 5, "window": "1d", "align": "calendar"}]}"#;

/// Room for 500 000 open reservations (about 1.4 kB each are accounted).
fn roomy() -> EngineOptions {
    EngineOptions {
        memory_budget: 4 << 30,
        max_open_reservations: 2_000_000,
        ..EngineOptions::default()
    }
}

/// Opens `n` reservations of campaign "b", one per user `{prefix}{i}`.
fn open_many<C: freqcap::Clock>(e: &Engine<C>, prefix: &str, n: usize, ttl_ms: u64) {
    let camps = vec!["b".to_owned()];
    for i in 0..n {
        let mut req = screen_req(&format!("{prefix}{i}"), &camps, true);
        req.ttl_ms = Some(ttl_ms);
        e.screen(&req)
            .expect("screened")
            .reservation
            .expect("eligible");
    }
}

fn commit_open(c: &mut Criterion) {
    let mut g = c.benchmark_group("commit_open");
    let camps = vec!["b".to_owned()];
    let commit = CommitRequest {
        campaigns: vec!["b".into()],
        ..CommitRequest::default()
    };
    // `cargo test` runs each bench once as a smoke test: the small sizes only.
    let benching = std::env::args().any(|a| a == "--bench");
    let sizes: &[usize] = if benching {
        &[1, 10_000, 100_000, 500_000]
    } else {
        &[1, 10_000]
    };
    for &open in sizes {
        // Made on first use, so a filter that skips this size skips filling it.
        let mut engine: Option<Engine<SystemClock>> = None;
        let mut next = 0u64;
        g.bench_function(format!("{open}"), |b| {
            let e = engine.get_or_insert_with(|| {
                let e = Engine::open(Arc::new(MemoryStore::new()), SystemClock::new(), roomy())
                    .expect("engine opens");
                e.put_campaign("b", campaign(BUDGETED)).expect("stored");
                open_many(&e, "open-", open, 3_600_000);
                e
            });
            b.iter_batched(
                || {
                    next += 1;
                    e.screen(&screen_req(&format!("c-{next}"), &camps, true))
                        .expect("screened")
                        .reservation
                        .expect("eligible")
                },
                |id| black_box(e.commit(&id, &commit).expect("committed")),
                criterion::BatchSize::SmallInput,
            )
        });
    }
    g.finish();
}

/// 500 000 reservations of one budgeted campaign expire at once; another
/// thread meanwhile screens (dry) and reads usage on the same campaign.
fn expiry_rate() {
    let n = 500_000;
    let t0 = 1_700_000_000_000_000_000;
    let clock = Arc::new(ManualClock::new(t0));
    let e =
        Engine::open(Arc::new(MemoryStore::new()), clock.clone(), roomy()).expect("engine opens");
    e.put_campaign("b", campaign(BUDGETED)).expect("stored");
    open_many(&e, "exp-", n, 1000);
    clock.advance(2_000_000_000);
    let done = std::sync::atomic::AtomicBool::new(false);
    let camps = vec!["b".to_owned()];
    let (elapsed, lat) = std::thread::scope(|s| {
        let other = s.spawn(|| {
            let dry = screen_req("other-user", &camps, false);
            let mut lat = Vec::new();
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let t = Instant::now();
                black_box(e.screen_in_memory(&dry));
                black_box(e.user_usage("other-user", "b").ok());
                lat.push(t.elapsed());
            }
            lat
        });
        let start = Instant::now();
        // The sweeper's call: expires everything due.
        e.sweep();
        let elapsed = start.elapsed();
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        (elapsed, other.join().expect("reader"))
    });
    let mut lat = lat;
    lat.sort();
    let q = |p: f64| lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)));
    println!(
        "expiry: {n} reservations of one budgeted campaign in {elapsed:.2?}: {:.0}/s; \
         meanwhile {} dry screen + usage reads, p50 {:?}, p99 {:?}, max {:?}; open now {}",
        n as f64 / elapsed.as_secs_f64(),
        lat.len(),
        q(0.5),
        q(0.99),
        lat.last(),
        e.open_reservations()
    );
}

fn expire(_: &mut Criterion) {
    // Only when asked for by name: it takes a minute and a gigabyte.
    if std::env::args().any(|a| a == "expire") {
        expiry_rate();
    }
}

criterion_group!(
    benches,
    memory,
    screen,
    commit_wal,
    commit_fsync,
    commit_open,
    expire
);
criterion_main!(benches);
