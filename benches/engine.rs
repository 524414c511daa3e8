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
//!
//! Run: `cargo bench --bench engine` (quick: add `-- --warm-up-time 1
//! --measurement-time 3`).

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use freqcap::SystemClock;
use freqcap::engine::{
    CommitRequest, Engine, EngineOptions, Event, ScreenCandidate, ScreenRequest,
};
use freqcap::model::CampaignDef;
use freqcap::store::{Durability, MemoryStore, RocksStore, Store};

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
        user: Some(user.to_owned()),
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
            campaign: name.clone(),
            cost: 1,
            event_id: None,
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
                campaign: c.clone(),
                cost: 1,
                event_id: None,
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

criterion_group!(benches, memory, screen, commit_wal, commit_fsync);
criterion_main!(benches);
