//! One caller per region (docs/regions.md, "One caller per region"), in one
//! process on a manual clock: region `a` is three nodes on one shared
//! store, region `b` one node, both leasing a budget from one global tier.
//! The tier gets one call per item and tick per region, not per node; the
//! caller's grants reach every node of its region; a caller that stops
//! ticking is replaced within seconds, and the budget is delivered exactly.

mod support;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use freqcap::engine::{Engine, EngineOptions, SafeCapacity};
use freqcap::model::from_json;
use freqcap::store::SharedMemory;
use freqcap::{Clock, ManualClock};
use support::engines::{commit, screen};

/// 2023-11-14T22:13:20Z.
const T0: u64 = 1_700_000_000_000_000_000;
const SEC: u64 = 1_000_000_000;
const BUDGET: u64 = 300;

type Node = Engine<Arc<ManualClock>>;

fn node(store: Arc<SharedMemory>, clock: &Arc<ManualClock>, id: &str) -> Node {
    let options = EngineOptions {
        node_id: id.to_owned(),
        ..EngineOptions::default()
    };
    Engine::open(store, clock.clone(), options).expect("a node opens")
}

/// Region `a`'s three nodes (one store) and region `b`'s one, on `tier`.
fn regions(clock: &Arc<ManualClock>, tier: &Arc<SharedMemory>) -> (Vec<Node>, Node) {
    let store = |c: &Arc<ManualClock>| {
        let c = c.clone();
        Arc::new(SharedMemory::with_clock(move || c.now() / 1_000))
    };
    let a_store = store(clock);
    let a: Vec<Node> = (0..3)
        .map(|i| node(a_store.clone(), clock, &format!("a{i}")))
        .collect();
    let b = node(store(clock), clock, "b0");
    let def = r#"{"budget": {"amount": 300, "per": "1d", "pacing": "asap"}}"#;
    a[0].put_campaign("camp", from_json(def).expect("a valid campaign"))
        .expect("defined in a");
    b.put_campaign("camp", from_json(def).expect("a valid campaign"))
        .expect("defined in b");
    for n in a.iter().chain([&b]) {
        n.cluster_tick().expect("definitions read");
        n.join_region(
            if n.options().node_id.starts_with('a') {
                "a"
            } else {
                "b"
            },
            SafeCapacity::Keep,
            tier.clone(),
        )
        .expect("joins its region");
    }
    (a, b)
}

/// A screen of `camp` for a new user, committed if eligible.
fn serve(n: &Node, user: &str) -> bool {
    let out = n.screen(&screen(user, &["camp"])).expect("a screen");
    match out.reservation {
        Some(id) => {
            n.commit(&id, &commit("camp")).expect("a commit");
            true
        }
        None => false,
    }
}

fn caller(n: &Node) -> bool {
    n.region_figures().expect("in a region").caller
}

#[test]
fn one_node_per_region_calls_the_tier_and_every_node_serves_on_its_grants() {
    let clock = Arc::new(ManualClock::new(T0));
    let tier = Arc::new(SharedMemory::new());
    let (a, b) = regions(&clock, &tier);
    let mut delivered = [0u64; 4];
    let mut users = 0u64;
    // Every node sees demand, then every live node ticks; one second a
    // round. `ticking[i]`: whether a[i] still ticks (b always does).
    let mut round = |ticking: &[bool; 3], delivered: &mut [u64; 4]| -> u64 {
        for (i, n) in a.iter().chain([&b]).enumerate() {
            for _ in 0..2 {
                users += 1;
                if serve(n, &format!("u{users}")) {
                    delivered[i] += 1;
                }
            }
        }
        let before = tier.lease_calls.load(Ordering::Relaxed);
        for (n, t) in a.iter().zip(ticking) {
            if *t {
                n.region_tick().expect("the tier answers");
            }
        }
        b.region_tick().expect("the tier answers");
        clock.advance(SEC);
        tier.lease_calls.load(Ordering::Relaxed) - before
    };
    // The first tick of a's first node makes it a's caller.
    let all = [true; 3];
    let mut calls = Vec::new();
    for _ in 0..10 {
        calls.push(round(&all, &mut delivered));
    }
    eprintln!("calls per round {calls:?}, delivered {delivered:?}");
    assert_eq!(
        calls,
        vec![2; 10],
        "one call per item and round per region (three nodes in a)"
    );
    let callers: Vec<bool> = a.iter().map(caller).collect();
    assert_eq!(callers, [true, false, false], "a's caller");
    assert!(caller(&b), "b's only node calls for b");
    assert!(
        delivered[..3].iter().all(|d| *d > 0),
        "each of a's nodes served on the grant its caller renewed: {delivered:?}"
    );
    // a's caller stops ticking: within its claim's 5 s another takes over,
    // and a's grants are renewed on (its nodes keep serving).
    let without_a0 = [false, true, true];
    let before = delivered;
    let mut calls = Vec::new();
    for _ in 0..10 {
        calls.push(round(&without_a0, &mut delivered));
    }
    eprintln!("a0 stopped: calls per round {calls:?}, delivered {delivered:?}");
    assert!(
        calls[..4].iter().all(|c| *c == 1),
        "b alone while a0's claim lasts: {calls:?}"
    );
    assert!(
        calls[6..].iter().all(|c| *c == 2),
        "a renewed again, by one node: {calls:?}"
    );
    assert_eq!(
        a[1..].iter().filter(|n| caller(n)).count(),
        1,
        "one new caller in a"
    );
    assert!(
        (1..3).all(|i| delivered[i] > before[i]),
        "a's other nodes served on: {before:?} then {delivered:?}"
    );
    // Until the budget is spent: exactly it, never more.
    for _ in 0..200 {
        round(&without_a0, &mut delivered);
        let sum: u64 = delivered.iter().sum();
        assert!(sum <= BUDGET, "{delivered:?} of {BUDGET}");
        if sum == BUDGET {
            break;
        }
    }
    assert_eq!(
        delivered.iter().sum::<u64>(),
        BUDGET,
        "the budget delivered: {delivered:?}"
    );
}
