//! Priorities (docs/semantics.md §2.5; issue 29, item 1): a class's share of
//! an item, decided atomically with the stack; never inverted; exact under
//! concurrency; bad values refused naming the field.

use std::sync::Arc;

use freqcap::ManualClock;
use freqcap::engine::{
    CheckRequest, CheckTarget, Engine, EngineOptions, Priority, ScreenCandidate, ScreenRequest,
};
use freqcap::limits::{Hold, ItemState};
use freqcap::model::{CampaignDef, PolicyDef, from_json};
use freqcap::store::MemoryStore;
use proptest::prelude::*;

/// 2023-11-14T22:13:20Z.
const T0: u64 = 1_700_000_000_000_000_000;
const SEC: u64 = 1_000_000_000;

fn engine(clock: Arc<ManualClock>) -> Engine<Arc<ManualClock>> {
    Engine::open(
        Arc::new(MemoryStore::new()),
        clock,
        EngineOptions::default(),
    )
    .unwrap()
}

fn check(policy: &str, key: &str, class: Priority, reserve: bool) -> CheckRequest {
    CheckRequest {
        target: CheckTarget::Policy(policy.into()),
        key: key.into(),
        cost: 1,
        reserve,
        ttl_ms: None,
        reservation_id: None,
        fingerprint: None,
        priority: class,
    }
}

/// A window of 10 where sheddable may use half and low 0.8: sheddable is
/// refused from its 6th unit, low from its 9th, and critical traffic keeps
/// the last two; each class's figures are its own ceiling.
#[test]
fn lower_classes_are_refused_first_and_see_their_own_ceiling() {
    let clock = Arc::new(ManualClock::new(T0));
    let e = engine(clock.clone());
    let p: PolicyDef = from_json(
        r#"{"limits": [{"kind": "window", "limit": 10, "window": "1h", "align": "fixed",
            "priorities": {"sheddable": 0.5, "low": 0.8}}]}"#,
    )
    .unwrap();
    e.put_policy("api", p).unwrap();
    let take = |class| e.check(&check("api", "k", class, false)).unwrap().decision;
    for i in 0..5 {
        let d = take(Priority::Sheddable);
        assert!(d.allowed, "sheddable unit {i}");
        assert_eq!((d.items[0].limit, d.remaining), (5, 4 - i));
    }
    let d = take(Priority::Sheddable);
    assert!(!d.allowed);
    assert_eq!(d.remaining, 0);
    assert!(d.retry_after.is_some());
    // Low may still use three more (to 8), default two more (to 10).
    for _ in 0..3 {
        assert!(take(Priority::Low).allowed);
    }
    assert!(!take(Priority::Low).allowed);
    let d = take(Priority::Default);
    assert!(d.allowed);
    assert_eq!((d.items[0].limit, d.remaining), (10, 1));
    assert!(take(Priority::Critical).allowed);
    // The item itself is full: no class passes, critical included.
    for class in Priority::ALL {
        assert!(!take(class).allowed, "{class:?}");
    }
    // A class without a share sees the item as defined.
    assert_eq!(take(Priority::High).items[0].limit, 10);
}

/// A campaign cap with priorities: the screen of a sheddable request is
/// refused by that cap while a critical one is still eligible, and only what
/// is eligible is held.
#[test]
fn a_screen_decides_each_cap_as_its_class_sees_it() {
    let clock = Arc::new(ManualClock::new(T0));
    let e = engine(clock.clone());
    let c: CampaignDef = from_json(
        r#"{"caps": [{"kind": "window", "limit": 4, "window": "1d", "align": "fixed",
            "scope": "campaign", "name": "daily", "priorities": {"sheddable": 0.5}}]}"#,
    )
    .unwrap();
    e.put_campaign("c", c).unwrap();
    let screen = |user: &str, class| ScreenRequest {
        user: Some(user.into()),
        ids: Vec::new(),
        candidates: vec![ScreenCandidate {
            campaign: "c".into(),
            cost: None,
        }],
        reserve: true,
        ttl_ms: Some(60_000),
        reservation_id: None,
        fingerprint: None,
        priority: class,
    };
    let a = e.screen(&screen("u1", Priority::Sheddable)).unwrap();
    let b = e.screen(&screen("u2", Priority::Sheddable)).unwrap();
    assert!(a.results[0].eligible && b.results[0].eligible);
    // Two of four held: sheddable's half is taken.
    let refused = e.screen(&screen("u3", Priority::Sheddable)).unwrap();
    let by = refused.results[0].denied_by.as_ref().unwrap();
    assert_eq!(by.cap, "daily");
    assert!(refused.reservation.is_none());
    // Releasing one gives sheddable its unit back.
    e.release(a.reservation.as_deref().unwrap()).unwrap();
    assert!(
        e.screen(&screen("u4", Priority::Sheddable))
            .unwrap()
            .results[0]
            .eligible
    );
    // Critical keeps the other half.
    for u in ["u5", "u6"] {
        assert!(e.screen(&screen(u, Priority::Critical)).unwrap().results[0].eligible);
    }
    assert!(!e.screen(&screen("u7", Priority::Critical)).unwrap().results[0].eligible);
}

/// Many threads of every class on one concurrency item of 40 (sheddable
/// 0.25, low 0.5): the open reservations never exceed the item, nor a class
/// its ceiling, and critical, never refused while the item had room below
/// its own ceiling, is the last to be refused.
#[test]
fn shares_are_exact_under_concurrency() {
    let clock = Arc::new(ManualClock::new(T0));
    let e = Arc::new(engine(clock));
    let p: PolicyDef = from_json(
        r#"{"limits": [{"kind": "concurrency", "max": 40,
            "priorities": {"sheddable": 0.25, "low": 0.5}}]}"#,
    )
    .unwrap();
    e.put_policy("slots", p).unwrap();
    let classes = [
        Priority::Sheddable,
        Priority::Low,
        Priority::Default,
        Priority::Critical,
    ];
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let e = e.clone();
            std::thread::spawn(move || {
                let mut held = [0u64; 4];
                for i in 0..200 {
                    let c = (t + i) % 4;
                    let d = e.check(&check("slots", "k", classes[c], true)).unwrap();
                    if d.decision.allowed {
                        held[c] += 1;
                    }
                }
                held
            })
        })
        .collect();
    let mut held = [0u64; 4];
    for t in threads {
        let h = t.join().unwrap();
        for c in 0..4 {
            held[c] += h[c];
        }
    }
    let total: u64 = held.iter().sum();
    // Nothing is released: every allowed reservation is still open.
    assert_eq!(total, 40, "{held:?}");
    // A class's reservations were all taken while the item was below its
    // ceiling, so each class holds at most its ceiling.
    assert!(held[0] <= 10, "{held:?}");
    assert!(held[0] + held[1] <= 40, "{held:?}");
    assert!(held[1] <= 20, "{held:?}");
    // Critical asked 400 times and the item filled: it got a share of it.
    assert!(held[3] > 0, "{held:?}");
}

/// The shares of one item as each kind compiles them.
fn item_json(kind: usize, shares: &str) -> String {
    let prio = format!(r#""priorities": {shares}"#);
    match kind {
        0 => format!(r#"{{"kind": "rate", "rate": 10, "per": "1s", "burst": 7, {prio}}}"#),
        1 => format!(r#"{{"kind": "window", "limit": 9, "window": "10s", {prio}}}"#),
        2 => format!(r#"{{"kind": "concurrency", "max": 6, {prio}}}"#),
        _ => {
            format!(r#"{{"kind": "budget", "amount": 50, "per": "1h", "pacing": "asap", {prio}}}"#)
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// At every step of a random run (classes, costs, time passing,
    /// reservations held), a class that would be allowed implies every
    /// higher class would be too: priorities are never inverted.
    #[test]
    fn no_class_is_refused_where_a_lower_one_passes(
        kind in 0usize..4,
        shares in prop::sample::select(vec![
            r#"{"sheddable": 0.3}"#,
            r#"{"sheddable": 0.3, "low": 0.6, "default": 0.9}"#,
            r#"{"critical": 0.9, "high": 0.9, "default": 0.5, "low": 0.5, "sheddable": 0.1}"#,
        ]),
        steps in prop::collection::vec((0usize..5, 1u64..4, 0u64..400), 1..60),
    ) {
        let p: PolicyDef = from_json(&format!(r#"{{"limits": [{}]}}"#, item_json(kind, shares))).unwrap();
        let stack = p.compile().unwrap().stack;
        let mut states = stack.fresh_state();
        let mut now = T0;
        for (class, cost, ms) in steps {
            now += ms * SEC / 1000;
            let hold = Hold::Reserve { deadline: now + 5 * SEC };
            let allowed: Vec<bool> = Priority::ALL
                .iter()
                .map(|&c| {
                    let mut probe: Vec<ItemState> = states.clone();
                    stack.decide_as(&mut probe, now, cost, hold, c).0.allowed
                })
                .collect();
            for hi in 0..5 {
                for lo in hi + 1..5 {
                    prop_assert!(
                        !allowed[lo] || allowed[hi],
                        "{:?} allowed, {:?} refused: {allowed:?}",
                        Priority::ALL[lo],
                        Priority::ALL[hi]
                    );
                }
            }
            stack.decide_as(&mut states, now, cost, hold, Priority::ALL[class]);
        }
    }
}

/// Changing a class's share keeps the item's counts: shares decide who may
/// use them, not what they count.
#[test]
fn changing_a_share_keeps_the_counts() {
    let clock = Arc::new(ManualClock::new(T0));
    let e = engine(clock.clone());
    let def = |share: &str| -> PolicyDef {
        from_json(&format!(
            r#"{{"limits": [{{"kind": "window", "limit": 10, "window": "1h", "align": "fixed",
                "priorities": {{"sheddable": {share}}}}}]}}"#
        ))
        .unwrap()
    };
    e.put_policy("api", def("0.5")).unwrap();
    for _ in 0..4 {
        assert!(
            e.check(&check("api", "k", Priority::Default, false))
                .unwrap()
                .decision
                .allowed
        );
    }
    e.put_policy("api", def("0.3")).unwrap();
    let d = e
        .check(&check("api", "k", Priority::Sheddable, false))
        .unwrap()
        .decision;
    assert!(!d.allowed, "4 used is past sheddable's 3");
    let d = e
        .check(&check("api", "k", Priority::Default, false))
        .unwrap()
        .decision;
    assert_eq!(d.remaining, 5);
}

/// Bad shares are refused naming the field, and nothing is stored.
#[test]
fn bad_shares_name_their_field() {
    for (shares, field, words) in [
        (
            r#"{"sheddable": 1.5}"#,
            "limits[0].priorities.sheddable",
            "at most 1",
        ),
        (
            r#"{"sheddable": 0}"#,
            "limits[0].priorities.sheddable",
            "above 0",
        ),
        (
            r#"{"sheddable": -0.1}"#,
            "limits[0].priorities.sheddable",
            "above 0",
        ),
        (
            r#"{"high": 0.8}"#,
            "limits[0].priorities.high",
            "below default's share",
        ),
        (
            r#"{"low": 0.5, "sheddable": 0.6}"#,
            "limits[0].priorities.low",
            "below sheddable",
        ),
        (
            r#"{"urgent": 0.5}"#,
            "limits[0].priorities",
            "unknown field",
        ),
        (r#"{"low": "half"}"#, "limits[0].priorities.low", ""),
        (
            r#"[null, 0.5]"#,
            "limits[0].priorities",
            "an object of class shares",
        ),
    ] {
        let json = format!(
            r#"{{"limits": [{{"kind": "window", "limit": 10, "window": "1h", "priorities": {shares}}}]}}"#
        );
        let e = match from_json::<PolicyDef>(&json) {
            Err(e) => e,
            Ok(p) => p.compile().map(|_| ()).unwrap_err(),
        };
        assert!(
            e.field.starts_with(field),
            "{shares}: {} {}",
            e.field,
            e.message
        );
        assert!(e.message.contains(words), "{shares}: {}", e.message);
    }
}

/// A class is a word: an object or a number in its place is refused.
#[test]
fn a_class_is_only_a_word() {
    use serde_json::json;
    for bad in [json!({"critical": null}), json!(1), json!("Critical")] {
        assert!(
            serde_json::from_value::<Priority>(bad.clone()).is_err(),
            "{bad}"
        );
    }
    assert_eq!(
        serde_json::from_value::<Priority>(json!("low")).unwrap(),
        Priority::Low
    );
}
