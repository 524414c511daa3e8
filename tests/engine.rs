//! The engine: screening with reservations, commits, releases, expiry, events,
//! restart and concurrency (issue 3).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use freqcap::ManualClock;
use freqcap::engine::{
    CheckRequest, CheckTarget, CommitRequest, Engine, EngineError, EngineOptions, Event, Outcome,
    ScreenRequest,
};
use freqcap::model::{CampaignDef, PolicyDef, from_json};
use freqcap::store::{Durability, MemoryStore, Op, RocksStore, Space, Store, StoreError};

mod support;

use support::engines::{commit, screen_of};

/// 2023-11-14T22:13:20Z.
const T0: u64 = 1_700_000_000_000_000_000;
const SEC: u64 = 1_000_000_000;

fn campaign(json: &str) -> CampaignDef {
    from_json(json).expect("test campaign is valid")
}

fn memory_engine(clock: Arc<ManualClock>) -> Engine<Arc<ManualClock>> {
    Engine::open(
        Arc::new(MemoryStore::new()),
        clock,
        EngineOptions::default(),
    )
    .unwrap()
}

/// An engine on RocksDB in `dir`.
fn rocks_engine(dir: &std::path::Path, clock: Arc<ManualClock>) -> Engine<Arc<ManualClock>> {
    let store = Arc::new(RocksStore::open(dir, Durability::Wal).unwrap());
    Engine::open(store, clock, EngineOptions::default()).unwrap()
}

/// The harness's screen (support/engines.rs), reserving or not.
fn screen(user: Option<&str>, camps: &[&str], reserve: bool) -> ScreenRequest {
    ScreenRequest {
        reserve,
        ..screen_of(user, &[], camps)
    }
}

/// Advertiser `adv` (campaign cap 4 per day) with two campaigns, each capped at
/// 2 per user per day.
fn ad_setup<C: freqcap::Clock>(e: &Engine<C>) {
    e.put_campaign(
        "adv",
        campaign(r#"{"caps": [{"kind": "window", "limit": 4, "window": "1d", "align": "calendar", "scope": "campaign"}]}"#),
    )
    .unwrap();
    for c in ["c1", "c2"] {
        e.put_campaign(
            c,
            campaign(r#"{"parent": "adv", "caps": [{"kind": "window", "limit": 2, "window": "1d", "align": "calendar"}]}"#),
        )
        .unwrap();
    }
}

#[test]
fn screen_commit_release_and_caps() {
    let clock = Arc::new(ManualClock::new(T0));
    let e = memory_engine(clock.clone());
    ad_setup(&e);
    let s = e
        .screen(&screen(Some("u1"), &["c1", "c2", "nope"], true))
        .unwrap();
    let id = s.reservation.clone().expect("eligible candidates reserve");
    assert!(s.results[0].eligible && s.results[1].eligible);
    let nope = s.results[2].denied_by.as_ref().unwrap();
    assert_eq!(nope.cap, "unknown_campaign");
    // Pending debits count: the user's c1 cap shows one pending.
    let u = e.user_usage("u1", "c1").unwrap();
    assert_eq!((u[0].used, u[0].pending, u[0].remaining), (0, 1, 1));
    // Commit c1: c2 is released.
    let o = e.commit(&id, &commit("c1")).unwrap();
    assert_eq!(o.outcome, Outcome::Committed);
    assert_eq!(o.campaigns, vec![std::sync::Arc::from("c1")]);
    let u = e.user_usage("u1", "c1").unwrap();
    assert_eq!((u[0].used, u[0].pending, u[0].remaining), (1, 0, 1));
    assert_eq!(u[1].campaign, "adv");
    assert_eq!((u[1].used, u[1].remaining), (1, 3));
    let u2 = e.user_usage("u1", "c2").unwrap();
    assert_eq!((u2[0].used, u2[0].pending), (0, 0));
    // Committing again repeats the first outcome; releasing is a conflict.
    assert_eq!(e.commit(&id, &commit("c1")).unwrap(), o);
    assert!(matches!(e.release(&id), Err(EngineError::Conflict(_))));
    // The user cap binds after two impressions of c1.
    let s = e.screen(&screen(Some("u1"), &["c1"], true)).unwrap();
    e.commit(s.reservation.as_deref().unwrap(), &commit("c1"))
        .unwrap();
    let s = e.screen(&screen(Some("u1"), &["c1", "c2"], false)).unwrap();
    assert!(!s.results[0].eligible);
    let d = s.results[0].denied_by.as_ref().unwrap();
    assert_eq!((&*d.campaign, d.cap.as_str()), ("c1", "window-0"));
    assert!(s.results[1].eligible);
    assert_eq!(s.reservation, None, "a dry run reserves nothing");
    // The advertiser's shared cap binds across users: 2 used, 2 more.
    for u in ["u2", "u3"] {
        let s = e.screen(&screen(Some(u), &["c2"], true)).unwrap();
        e.commit(s.reservation.as_deref().unwrap(), &commit("c2"))
            .unwrap();
    }
    let s = e.screen(&screen(Some("u4"), &["c1", "c2"], true)).unwrap();
    assert_eq!(s.reservation, None);
    for r in &s.results {
        let d = r.denied_by.as_ref().unwrap();
        assert_eq!((&*d.campaign, d.cap.as_str()), ("adv", "window-0"));
        assert!(d.retry_after.is_some());
    }
}

#[test]
fn release_and_expiry_return_capacity() {
    let clock = Arc::new(ManualClock::new(T0));
    let e = memory_engine(clock.clone());
    e.put_campaign("solo", campaign(r#"{"caps": [{"kind": "window", "limit": 1, "window": "1h", "align": "fixed", "scope": "campaign"}], "max_in_flight": 1}"#)).unwrap();
    let a = e.screen(&screen(Some("u"), &["solo"], true)).unwrap();
    let denied = e.screen(&screen(Some("v"), &["solo"], true)).unwrap();
    assert_eq!(denied.reservation, None);
    assert_eq!(
        denied.results[0].denied_by.as_ref().unwrap().cap,
        "window-0"
    );
    // Released: capacity is back.
    e.release(a.reservation.as_deref().unwrap()).unwrap();
    let b = e.screen(&screen(Some("v"), &["solo"], true)).unwrap();
    assert!(b.results[0].eligible);
    // Expired (ttl 1 s): capacity is back, and the id is forgotten.
    clock.advance(SEC);
    let c = e.screen(&screen(Some("w"), &["solo"], true)).unwrap();
    assert!(c.results[0].eligible);
    assert_eq!(e.stats.expired.load(Ordering::Relaxed), 1);
    assert!(matches!(
        e.commit(b.reservation.as_deref().unwrap(), &commit("solo")),
        Err(EngineError::NotFound(_))
    ));
}

#[test]
fn a_retried_late_commit_without_event_id_counts_once() {
    let clock = Arc::new(ManualClock::new(T0));
    let e = memory_engine(clock.clone());
    ad_setup(&e);
    let late = CommitRequest {
        campaigns: vec!["c1".into()],
        cost: Some(1),
        user: Some("u".into()),
        event_id: None,
        sample: None,
        ids: Vec::new(),
    };
    for _ in 0..3 {
        assert_eq!(
            e.commit("gone-1", &late).unwrap().outcome,
            Outcome::LateCommit
        );
    }
    assert_eq!(e.user_usage("u", "c1").unwrap()[0].used, 1);
    // Another reservation's late commit is another impression.
    e.commit("gone-2", &late).unwrap();
    assert_eq!(e.user_usage("u", "c1").unwrap()[0].used, 2);
}

#[test]
fn a_commit_naming_an_unknown_campaign_is_404_and_settles_nothing() {
    let clock = Arc::new(ManualClock::new(T0));
    let e = memory_engine(clock.clone());
    ad_setup(&e);
    let s = e.screen(&screen(Some("u1"), &["c1", "c2"], true)).unwrap();
    let id = s.reservation.unwrap();
    let named = |c: &str| CommitRequest {
        campaigns: vec![c.into()],
        ..Default::default()
    };
    assert!(matches!(
        e.commit(&id, &named("nope")),
        Err(EngineError::NotFound(_))
    ));
    // A campaign that exists but was not a candidate is a 400 naming the field.
    e.put_campaign(
        "c3",
        campaign(r#"{"caps": [{"kind": "gap", "min": "1s"}]}"#),
    )
    .unwrap();
    match e.commit(&id, &named("c3")) {
        Err(EngineError::InvalidArgument { field, .. }) => assert_eq!(field, "campaign"),
        other => panic!("{other:?}"),
    }
    // The reservation is still open: the real winner commits.
    assert_eq!(
        e.commit(&id, &named("c1")).unwrap().outcome,
        Outcome::Committed
    );
}

#[test]
fn late_commits_and_duplicate_events_count_once() {
    let clock = Arc::new(ManualClock::new(T0));
    let e = memory_engine(clock.clone());
    ad_setup(&e);
    let late = CommitRequest {
        campaigns: vec!["c1".into()],
        cost: Some(1),
        user: Some("u".into()),
        event_id: Some("imp-1".into()),
        sample: None,
        ids: Vec::new(),
    };
    let o = e.commit("gone-123", &late).unwrap();
    assert_eq!(o.outcome, Outcome::LateCommit);
    // Without user/campaign/cost it is a 404.
    assert!(matches!(
        e.commit("gone-123", &CommitRequest::default()),
        Err(EngineError::NotFound(_))
    ));
    let ev = |id: &str| Event {
        user: Some("u".into()),
        ids: Vec::new(),
        campaign: "c1".into(),
        cost: 1,
        event_id: Some(id.into()),
        event_type: None,
    };
    assert_eq!(
        e.events(&[ev("imp-1"), ev("imp-2"), ev("imp-2")]).unwrap(),
        1
    );
    let u = e.user_usage("u", "c1").unwrap();
    assert_eq!(u[0].used, 2, "late commit + one new event");
    // Events past the cap are still counted (they happened).
    assert_eq!(e.events(&[ev("imp-3")]).unwrap(), 1);
    assert_eq!(e.user_usage("u", "c1").unwrap()[0].remaining, 0);
    // An unknown campaign fails the whole batch.
    let bad = Event {
        campaign: "nope".into(),
        ..ev("imp-4")
    };
    assert!(matches!(
        e.events(&[ev("imp-5"), bad]),
        Err(EngineError::NotFound(_))
    ));
    assert_eq!(
        e.events(&[ev("imp-5")]).unwrap(),
        1,
        "imp-5 was not applied"
    );
    // After the dedupe horizon an id counts again.
    clock.advance(24 * 3600 * SEC);
    assert_eq!(e.events(&[ev("imp-1")]).unwrap(), 1);
}

#[test]
fn budget_commit_at_final_cost() {
    let clock = Arc::new(ManualClock::new(T0));
    let e = memory_engine(clock.clone());
    e.put_campaign(
        "b",
        campaign(r#"{"budget": {"amount": 1000, "per": "1d", "pacing": "asap"}}"#),
    )
    .unwrap();
    let mut req = screen(Some("u"), &["b"], true);
    req.candidates[0].cost = Some(300);
    let s = e.screen(&req).unwrap();
    let d = e.delivery("b").unwrap();
    assert_eq!((d.spent, d.pending, d.amount), (0, 300, 1000));
    let c = CommitRequest {
        cost: Some(120),
        ..commit("b")
    };
    e.commit(s.reservation.as_deref().unwrap(), &c).unwrap();
    let d = e.delivery("b").unwrap();
    assert_eq!((d.spent, d.pending), (120, 0));
    assert!(d.period_start <= T0 && T0 < d.period_end);
}

#[test]
fn check_with_policies_reserve_and_idempotent_ids() {
    let clock = Arc::new(ManualClock::new(T0));
    let e = memory_engine(clock.clone());
    let p: PolicyDef =
        from_json(r#"{"limits": [{"kind": "rate", "rate": 2, "per": "1s"}]}"#).unwrap();
    e.put_policy("api", p).unwrap();
    let req = |reserve: bool, id: Option<&str>| CheckRequest {
        priority: Default::default(),
        target: CheckTarget::Policy("api".into()),
        key: "client".into(),
        cost: 1,
        reserve,
        ttl_ms: None,
        reservation_id: id.map(str::to_owned),
        fingerprint: None,
    };
    let a = e.check(&req(true, Some("auction-1"))).unwrap();
    assert!(a.decision.allowed);
    assert_eq!(a.reservation.as_deref(), Some("auction-1"));
    // The same request again returns the first answer without deciding.
    let again = e.check(&req(true, Some("auction-1"))).unwrap();
    assert_eq!(again.decision, a.decision);
    assert!(e.check(&req(false, None)).unwrap().decision.allowed);
    let denied = e.check(&req(false, None)).unwrap();
    assert!(!denied.decision.allowed);
    e.release("auction-1").unwrap();
    assert!(e.check(&req(false, None)).unwrap().decision.allowed);
    // A released id cannot be reserved again while remembered.
    assert!(matches!(
        e.check(&req(true, Some("auction-1"))),
        Err(EngineError::Conflict(_))
    ));
    // Unknown policy: 404; inline limits work without a definition.
    let mut r = req(false, None);
    r.target = CheckTarget::Policy("none".into());
    assert!(matches!(e.check(&r), Err(EngineError::NotFound(_))));
    r.target = CheckTarget::Inline(vec![
        from_json(r#"{"kind": "window", "limit": 1, "window": "1m"}"#).unwrap(),
    ]);
    assert!(e.check(&r).unwrap().decision.allowed);
    assert!(!e.check(&r).unwrap().decision.allowed);
}

#[test]
fn a_stack_of_more_than_64_items_is_refused() {
    // Stacks are bounded (docs/semantics.md §5.1); within the bound every
    // item has its own counter, the two unnamed windows too (`window-0`
    // and `window-<n-1>`).
    let clock = Arc::new(ManualClock::new(T0));
    let e = memory_engine(clock);
    let window = r#"{"kind": "window", "limit": 2, "window": "1m", "align": "fixed"}"#;
    let items = |n: usize| -> Vec<freqcap::model::LimitDef> {
        (0..n)
            .map(|i| {
                let json = if i == 0 || i + 1 == n {
                    window.to_owned()
                } else {
                    format!(r#"{{"kind": "rate", "rate": 1000, "per": "1s", "name": "r{i}"}}"#)
                };
                from_json(&json).unwrap()
            })
            .collect()
    };
    let req = |n: usize| CheckRequest {
        priority: Default::default(),
        target: CheckTarget::Inline(items(n)),
        key: "k".into(),
        cost: 1,
        reserve: false,
        ttl_ms: None,
        reservation_id: None,
        fingerprint: None,
    };
    for n in [65, 257] {
        match e.check(&req(n)) {
            Err(EngineError::InvalidArgument { field, message }) => {
                assert_eq!(field, "limits", "{message}");
                assert!(message.contains("at most 64"), "{message}");
            }
            other => panic!("{n} items: {other:?}"),
        }
        let p = PolicyDef {
            limits: items(n),
            on_limit: None,
            max_delay_ms: None,
            mode: None,
        };
        assert!(matches!(
            e.put_policy("big", p),
            Err(EngineError::InvalidArgument { ref field, .. }) if field == "limits"
        ));
    }
    // 64 items are fine, each with its own counter: the first and the last
    // window each count 1 per check, so two checks pass and the third does not.
    let d: Vec<bool> = (0..3)
        .map(|_| e.check(&req(64)).unwrap().decision.allowed)
        .collect();
    assert_eq!(d, [true, true, false]);
    let last = e.check(&req(64)).unwrap().decision;
    assert_eq!((last.items[0].remaining, last.items[63].remaining), (0, 0));
    let big = PolicyDef {
        limits: items(64),
        on_limit: None,
        max_delay_ms: None,
        mode: None,
    };
    e.put_policy("big", big).unwrap();
}

#[test]
fn definitions_are_validated() {
    let clock = Arc::new(ManualClock::new(T0));
    let e = memory_engine(clock);
    ad_setup(&e);
    let err = e
        .put_campaign("x", campaign(r#"{"parent": "missing"}"#))
        .unwrap_err();
    assert!(matches!(err, EngineError::InvalidArgument { ref field, .. } if field == "parent"));
    // adv -> c1 -> adv would be a cycle.
    let err = e
        .put_campaign("adv", campaign(r#"{"parent": "c1"}"#))
        .unwrap_err();
    assert!(matches!(err, EngineError::InvalidArgument { ref field, .. } if field == "parent"));
    assert_eq!(
        e.get_campaign("adv").unwrap().parent,
        None,
        "a rejected put leaves the old one"
    );
    assert!(matches!(
        e.delete_campaign("adv"),
        Err(EngineError::Conflict(_))
    ));
    assert!(matches!(
        e.delete_campaign("zzz"),
        Err(EngineError::NotFound(_))
    ));
    let err = from_json::<CampaignDef>(r#"{"caps": [{"kind": "rate", "rate": 0, "per": "1s"}]}"#)
        .unwrap()
        .compile()
        .unwrap_err();
    assert_eq!(err.field, "caps[0].rate");
    let err = from_json::<CampaignDef>(
        r#"{"caps": [{"kind": "window", "limit": 1, "window": "1d", "scope": "every one"}]}"#,
    )
    .unwrap_err();
    assert_eq!(err.field, "caps[0].scope");
    let err = from_json::<CampaignDef>(r#"{"tz": "Mars/Olympus"}"#)
        .unwrap()
        .compile()
        .unwrap_err();
    assert_eq!(err.field, "tz");
    let err = from_json::<CampaignDef>(r#"{"caps": [{"kind": "concurrency", "max": 1}]}"#)
        .unwrap()
        .compile()
        .unwrap_err();
    assert_eq!(err.field, "caps[0].kind");
}

#[test]
fn unknown_user_deny_and_allow() {
    let clock = Arc::new(ManualClock::new(T0));
    let e = memory_engine(clock);
    e.put_campaign(
        "closed",
        campaign(r#"{"caps": [{"kind": "window", "limit": 1, "window": "1d"}]}"#),
    )
    .unwrap();
    e.put_campaign("open", campaign(r#"{"unknown_user": "allow", "caps": [{"kind": "window", "limit": 1, "window": "1d"}]}"#)).unwrap();
    let s = e.screen(&screen(None, &["closed", "open"], false)).unwrap();
    assert_eq!(s.results[0].denied_by.as_ref().unwrap().cap, "unknown_user");
    assert!(s.results[1].eligible);
}

#[test]
fn daily_caps_reset_at_local_midnight() {
    // 2024-03-09T23:30:00-05:00 (New York), the evening before DST starts.
    let t = 1_710_045_000 * SEC;
    let clock = Arc::new(ManualClock::new(t));
    let e = memory_engine(clock.clone());
    e.put_campaign("ny", campaign(r#"{"tz": "America/New_York", "caps": [{"kind": "window", "limit": 1, "window": "1d", "align": "calendar"}]}"#)).unwrap();
    let s = e.screen(&screen(Some("u"), &["ny"], true)).unwrap();
    e.commit(s.reservation.as_deref().unwrap(), &commit("ny"))
        .unwrap();
    let u = e.user_usage("u", "ny").unwrap();
    assert_eq!(
        u[0].reset_after,
        u128::from(30 * 60 * SEC),
        "local midnight is 30 minutes away"
    );
    clock.advance(30 * 60 * SEC - 1);
    assert!(
        !e.screen(&screen(Some("u"), &["ny"], false))
            .unwrap()
            .results[0]
            .eligible
    );
    clock.advance(1);
    assert!(
        e.screen(&screen(Some("u"), &["ny"], false))
            .unwrap()
            .results[0]
            .eligible
    );
    // That local day has 23 hours.
    let s = e.screen(&screen(Some("u"), &["ny"], true)).unwrap();
    e.commit(s.reservation.as_deref().unwrap(), &commit("ny"))
        .unwrap();
    assert_eq!(
        e.user_usage("u", "ny").unwrap()[0].reset_after,
        u128::from(23 * 3600 * SEC)
    );
}

/// Several threads screen and commit the same campaigns for overlapping users,
/// with a shared parent: no cap or budget is ever exceeded, and the engine's
/// counts equal the acknowledged commits.
#[test]
fn zero_over_delivery_under_threads() {
    let clock = Arc::new(ManualClock::new(T0));
    let e = memory_engine(clock.clone());
    e.put_campaign("adv", campaign(r#"{"caps": [{"kind": "window", "limit": 150, "window": "1d", "align": "calendar", "scope": "campaign"}]}"#)).unwrap();
    let camps = ["k1", "k2", "k3"];
    for c in camps {
        e.put_campaign(c, campaign(r#"{"parent": "adv", "caps": [{"kind": "window", "limit": 3, "window": "1d", "align": "calendar"}, {"kind": "rate", "rate": 100, "per": "1d", "scope": "campaign"}], "budget": {"amount": 2000, "pacing": "asap"}, "max_in_flight": 8}"#)).unwrap();
    }
    let committed: Mutex<HashMap<(String, String), u64>> = Mutex::new(HashMap::new());
    let spent: Vec<AtomicU64> = camps.iter().map(|_| AtomicU64::new(0)).collect();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (e, committed, spent) = (&e, &committed, &spent);
            s.spawn(move || {
                let mut x = t * 7919 + 1;
                for _ in 0..400 {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let user = format!("u{}", (x >> 33) % 30);
                    let mut req = screen(Some(&user), &camps, true);
                    for c in &mut req.candidates {
                        c.cost = Some(1 + (x >> 40) % 40);
                    }
                    let s = e.screen(&req).unwrap();
                    let Some(id) = s.reservation else { continue };
                    let eligible: Vec<usize> = (0..3).filter(|&i| s.results[i].eligible).collect();
                    let w = eligible[(x >> 20) as usize % eligible.len()];
                    if (x >> 10) % 5 == 0 {
                        e.release(&id).unwrap();
                        continue;
                    }
                    let cost = req.candidates[w].cost.unwrap();
                    e.commit(&id, &commit(camps[w])).unwrap();
                    *committed
                        .lock()
                        .unwrap()
                        .entry((user, camps[w].to_owned()))
                        .or_default() += 1;
                    spent[w].fetch_add(cost, Ordering::Relaxed);
                }
            });
        }
    });
    let committed = committed.into_inner().unwrap();
    let mut per_campaign = [0u64; 3];
    for ((user, c), n) in &committed {
        assert!(*n <= 3, "{user} saw {c} {n} times");
        let u = e.user_usage(user, c).unwrap();
        assert_eq!(u[0].used, *n, "{user}/{c}");
        per_campaign[camps.iter().position(|x| x == c).unwrap()] += n;
    }
    let total: u64 = per_campaign.iter().sum();
    assert!(total <= 150, "advertiser cap: {total}");
    assert!(total > 0);
    for (i, c) in camps.iter().enumerate() {
        assert!(per_campaign[i] <= 100, "{c} rate cap");
        let d = e.delivery(c).unwrap();
        assert!(d.spent <= 2000, "{c} budget {}", d.spent);
        assert_eq!(d.spent, spent[i].load(Ordering::Relaxed));
        assert_eq!(d.pending, 0);
    }
    assert_eq!(e.open_reservations(), 0);
}

#[test]
fn restart_keeps_counters_and_definitions() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    {
        let e = rocks_engine(dir.path(), clock.clone());
        ad_setup(&e);
        e.put_campaign(
            "bud",
            campaign(r#"{"budget": {"amount": 50, "pacing": "asap"}}"#),
        )
        .unwrap();
        let s = e.screen(&screen(Some("u1"), &["c1"], true)).unwrap();
        e.commit(s.reservation.as_deref().unwrap(), &commit("c1"))
            .unwrap();
        e.events(&[Event {
            user: Some("u1".into()),
            ids: Vec::new(),
            campaign: "c1".into(),
            cost: 1,
            event_id: Some("ev-1".into()),
            event_type: None,
        }])
        .unwrap();
        // An open reservation is lost with the process: it counts as released.
        let open = e.screen(&screen(Some("u2"), &["c2"], true)).unwrap();
        assert!(open.reservation.is_some());
    }
    let e = rocks_engine(dir.path(), clock.clone());
    assert!(e.get_campaign("c1").is_some());
    let u = e.user_usage("u1", "c1").unwrap();
    assert_eq!((u[0].used, u[0].remaining), (2, 0));
    assert_eq!(u[1].used, 2, "the advertiser's shared counter");
    assert_eq!(e.user_usage("u2", "c2").unwrap()[0].used, 0);
    // The dedupe id survived too.
    let again = Event {
        user: Some("u1".into()),
        ids: Vec::new(),
        campaign: "c1".into(),
        cost: 1,
        event_id: Some("ev-1".into()),
        event_type: None,
    };
    assert_eq!(e.events(&[again]).unwrap(), 0);
}

#[test]
fn store_refuses_a_held_directory_and_newer_formats() {
    let dir = tempfile::tempdir().unwrap();
    let first = RocksStore::open(dir.path(), Durability::Wal).unwrap();
    match RocksStore::open(dir.path(), Durability::Wal) {
        Err(StoreError::Locked { .. }) => {}
        other => panic!("expected Locked, got {:?}", other.map(|_| ())),
    }
    first
        .submit(
            vec![freqcap::store::Op::Put(
                freqcap::store::Space::Meta,
                b"format".to_vec(),
                vec![99],
            )],
            true,
        )
        .wait()
        .unwrap();
    drop(first);
    match RocksStore::open(dir.path(), Durability::Wal) {
        Err(StoreError::UnknownFormat { found: 99, .. }) => {}
        other => panic!("expected UnknownFormat, got {:?}", other.map(|_| ())),
    }
}

/// A directory of an older format is marked with this build's format when
/// opened, so an older build refuses it whole rather than a value at a time.
#[test]
fn an_older_format_is_raised_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let put_format = |s: &RocksStore, v: u8| {
        s.submit(
            vec![freqcap::store::Op::Put(
                freqcap::store::Space::Meta,
                b"format".to_vec(),
                vec![v],
            )],
            true,
        )
        .wait()
        .unwrap();
    };
    let first = RocksStore::open(dir.path(), Durability::Wal).unwrap();
    put_format(&first, 1);
    drop(first);
    let again = RocksStore::open(dir.path(), Durability::Wal).unwrap();
    assert_eq!(
        again.get(freqcap::store::Space::Meta, b"format").unwrap(),
        Some(vec![freqcap::store::codec::FORMAT_VERSION])
    );
}

#[test]
fn expired_state_leaves_memory_and_disk() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let store = Arc::new(RocksStore::open(dir.path(), Durability::Wal).unwrap());
    let e = Engine::open(store.clone(), clock.clone(), EngineOptions::default()).unwrap();
    e.put_campaign(
        "h",
        campaign(r#"{"caps": [{"kind": "window", "limit": 5, "window": "1h", "align": "fixed"}]}"#),
    )
    .unwrap();
    for u in 0..100 {
        e.events(&[Event {
            user: Some(format!("once-{u}")),
            ids: Vec::new(),
            campaign: "h".into(),
            cost: 1,
            event_id: None,
            event_type: None,
        }])
        .unwrap();
    }
    let states = |s: &RocksStore| s.scan(freqcap::store::Space::State).unwrap().len();
    // The campaign has no campaign-scope counter, so it has no record to write.
    assert_eq!(states(&store), 100, "100 users");
    assert_eq!(e.hot_len(), 100);
    clock.advance(3600 * SEC);
    assert_eq!(e.sweep(), 100, "idle records leave memory");
    store.compact().unwrap();
    assert_eq!(states(&store), 0, "and disk, once their window has passed");
}

/// Threads screen, commit, release and count events over overlapping users and
/// a two-level hierarchy while another thread keeps redefining a campaign:
/// everything finishes (no deadlock) and no cap is exceeded.
#[test]
fn stress_with_shared_ancestors_and_redefinitions() {
    let clock = Arc::new(ManualClock::new(T0));
    let e = memory_engine(clock.clone());
    e.put_campaign("root", campaign(r#"{"caps": [{"kind": "window", "limit": 400, "window": "1d", "align": "calendar", "scope": "campaign"}]}"#)).unwrap();
    for m in ["mid-a", "mid-b"] {
        e.put_campaign(m, campaign(r#"{"parent": "root", "caps": [{"kind": "window", "limit": 5, "window": "1d", "align": "calendar"}]}"#)).unwrap();
    }
    let leaves: Vec<String> = (0..6).map(|i| format!("leaf-{i}")).collect();
    for (i, l) in leaves.iter().enumerate() {
        let parent = if i % 2 == 0 { "mid-a" } else { "mid-b" };
        e.put_campaign(l, campaign(&format!(r#"{{"parent": "{parent}", "caps": [{{"kind": "window", "limit": 2, "window": "1d", "align": "calendar"}}], "max_in_flight": 4}}"#))).unwrap();
    }
    let done = std::sync::atomic::AtomicBool::new(false);
    let won: Mutex<HashMap<(String, String), u64>> = Mutex::new(HashMap::new());
    std::thread::scope(|s| {
        let (e, leaves, done, won) = (&e, &leaves, &done, &won);
        s.spawn(move || {
            // Redefine a leaf back and forth (same caps, other max_in_flight).
            let mut n = 0u64;
            while !done.load(Ordering::Relaxed) {
                let m = 3 + n % 2;
                e.put_campaign("leaf-0", campaign(&format!(r#"{{"parent": "mid-a", "caps": [{{"kind": "window", "limit": 2, "window": "1d", "align": "calendar"}}], "max_in_flight": {m}}}"#))).unwrap();
                n += 1;
                std::thread::yield_now();
            }
        });
        let workers: Vec<_> = (0..4u64)
            .map(|t| {
                s.spawn(move || {
                    let mut x = t + 11;
                    for _ in 0..500 {
                        x = x
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        let user = format!("u{}", (x >> 33) % 40);
                        let names: Vec<&str> = (0..4)
                            .map(|k| leaves[((x >> (8 * k)) % 6) as usize].as_str())
                            .collect();
                        match (x >> 50) % 4 {
                            0 => {
                                // Events go to users of their own: they are
                                // counted unchecked and could pass caps.
                                e.events(&[Event {
                                    user: Some(format!("e-{user}")),
                                    ids: Vec::new(),
                                    campaign: names[0].to_owned(),
                                    cost: 1,
                                    event_id: Some(format!("ev-{t}-{x}")),
                                    event_type: None,
                                }])
                                .unwrap();
                            }
                            _ => {
                                let s = e.screen(&screen(Some(&user), &names, true)).unwrap();
                                let Some(id) = s.reservation else { continue };
                                if (x >> 45) % 3 == 0 {
                                    e.release(&id).unwrap();
                                } else {
                                    let w = s.results.iter().find(|r| r.eligible).unwrap();
                                    e.commit(&id, &commit(&w.campaign)).unwrap();
                                    *won.lock()
                                        .unwrap()
                                        .entry((user, w.campaign.to_string()))
                                        .or_default() += 1;
                                }
                            }
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        done.store(true, Ordering::Relaxed);
    });
    let won = won.into_inner().unwrap();
    let mut per_mid: HashMap<(String, &str), u64> = HashMap::new();
    let mut total = 0;
    for ((user, leaf), n) in &won {
        assert!(*n <= 2, "{user} won {leaf} {n} times");
        let i: usize = leaf[5..].parse().unwrap();
        let mid = if i.is_multiple_of(2) {
            "mid-a"
        } else {
            "mid-b"
        };
        *per_mid.entry((user.clone(), mid)).or_default() += n;
        total += n;
        let u = e.user_usage(user, leaf).unwrap();
        assert_eq!(u[0].used, *n, "{user}/{leaf}");
    }
    for ((user, mid), n) in &per_mid {
        assert!(*n <= 5, "{user} got {n} of {mid}");
    }
    assert!(total > 0 && total <= 400);
    assert_eq!(e.open_reservations(), 0);
}

/// With a hot tier far too small for the users in play, records are dropped
/// and read back from the store, yet nothing is lost: records holding open
/// reservations are never dropped, committed ones come back from disk. (The
/// reservations themselves take at most half of the budget: as many as fit.)
#[test]
fn tiny_hot_tier_loses_nothing() {
    let clock = Arc::new(ManualClock::new(T0));
    let options = EngineOptions {
        memory_budget: 64 << 10,
        shards: 1,
        ..EngineOptions::default()
    };
    let e = Engine::open(Arc::new(MemoryStore::new()), clock.clone(), options).unwrap();
    e.put_campaign(
        "c",
        campaign(
            r#"{"caps": [{"kind": "window", "limit": 2, "window": "1d", "align": "calendar"}]}"#,
        ),
    )
    .unwrap();
    let mut users = Vec::new();
    let mut ids = Vec::new();
    for u in 0..600 {
        let user = format!("user-{u}");
        match e.screen(&screen(Some(&user), &["c"], true)) {
            Ok(s) => ids.push(s.reservation.unwrap()),
            Err(EngineError::Overloaded(_)) => break,
            Err(other) => panic!("{other}"),
        }
        users.push(user);
    }
    assert!(ids.len() >= 20, "{} reservations fit", ids.len());
    // Other users' records crowd the hot tier; none holding a reservation
    // goes (its pending debit would read 0 from the store's copy).
    let crowd = |from: u64| {
        for u in from..from + 2000 {
            e.events(&[Event {
                user: Some(format!("other-{u}")),
                ids: Vec::new(),
                campaign: "c".into(),
                cost: 1,
                event_id: None,
                event_type: None,
            }])
            .unwrap();
        }
    };
    crowd(0);
    assert!(e.hot_stats().evicted_active.load(Ordering::Relaxed) > 0);
    for u in &users {
        assert_eq!(e.user_usage(u, "c").unwrap()[0].pending, 1, "{u}");
    }
    for id in &ids {
        e.commit(id, &commit("c")).unwrap();
    }
    // Now committed and written: new users push them out.
    let evicted = e.hot_stats().evicted_active.load(Ordering::Relaxed);
    crowd(2000);
    assert!(e.hot_stats().evicted_active.load(Ordering::Relaxed) > evicted);
    for u in &users {
        // Settled ids are remembered until their deadline: let them go.
        clock.advance(2 * SEC);
        let s = e.screen(&screen(Some(u), &["c"], true)).unwrap();
        e.commit(s.reservation.as_deref().unwrap(), &commit("c"))
            .unwrap();
        let again = e.screen(&screen(Some(u), &["c"], false)).unwrap();
        assert!(
            !again.results[0].eligible,
            "{u}: the first impression was lost"
        );
    }
}

/// A store around `inner` that tests can break and that counts what the
/// engine asks of it: acknowledged writes fail while `failing` is set (a disk
/// that stopped taking writes); made with `new` it answers nothing from
/// memory, as RocksDB with nothing cached after a restart with a large data
/// set; made with `counting` it answers as `inner` does.
struct Doctored<S> {
    inner: S,
    failing: std::sync::atomic::AtomicBool,
    /// Whether it answers from memory what the inner store can.
    cached: bool,
    /// Scans of the dedupe space (event ids must not be loaded at open).
    dedupe_scans: AtomicU64,
    /// Batches submitted to be acknowledged (commits, events, definitions).
    acknowledged: AtomicU64,
}

impl<S: Store> Doctored<S> {
    fn new(inner: S) -> Self {
        Doctored {
            inner,
            failing: std::sync::atomic::AtomicBool::new(false),
            cached: false,
            dedupe_scans: AtomicU64::new(0),
            acknowledged: AtomicU64::new(0),
        }
    }

    /// A store that only counts: it answers from memory as the inner one does.
    fn counting(inner: S) -> Self {
        Doctored {
            cached: true,
            ..Doctored::new(inner)
        }
    }
}

impl<S: Store> Store for Doctored<S> {
    fn get(&self, space: Space, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(space, key)
    }
    fn scan(&self, space: Space) -> Result<freqcap::store::KeyValues, StoreError> {
        if space == Space::Dedupe {
            self.dedupe_scans.fetch_add(1, Ordering::Relaxed);
        }
        self.inner.scan(space)
    }
    fn submit(&self, batch: freqcap::store::Batch, acknowledge: bool) -> freqcap::store::Receipt {
        if acknowledge && self.failing.load(Ordering::SeqCst) {
            return freqcap::store::Receipt::failed(0, StoreError::Io("disk gone".into()));
        }
        if acknowledge {
            self.acknowledged.fetch_add(1, Ordering::Relaxed);
        }
        self.inner.submit(batch, acknowledge)
    }
    fn written_seq(&self) -> u64 {
        self.inner.written_seq()
    }
    fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush()
    }
    fn set_now(&self, now: u64) {
        self.inner.set_now(now)
    }
    fn stats(&self) -> freqcap::store::StoreStats {
        self.inner.stats()
    }
    fn compact(&self) -> Result<(), StoreError> {
        self.inner.compact()
    }
    fn checkpoint(&self, dir: &std::path::Path) -> Result<(), StoreError> {
        self.inner.checkpoint(dir)
    }
    fn get_cached(&self, space: Space, key: &[u8]) -> Option<Result<Option<Vec<u8>>, StoreError>> {
        if self.cached {
            self.inner.get_cached(space, key)
        } else {
            None
        }
    }
}

#[test]
fn a_repeated_commit_is_never_acknowledged_when_the_first_was_not_written() {
    let store = Arc::new(Doctored::new(MemoryStore::new()));
    let clock = Arc::new(ManualClock::new(T0));
    let e = Engine::open(store.clone(), clock, EngineOptions::default()).unwrap();
    ad_setup(&e);
    let s = e.screen(&screen(Some("u1"), &["c1"], true)).unwrap();
    let id = s.reservation.unwrap();
    store.failing.store(true, Ordering::SeqCst);
    assert!(matches!(
        e.commit(&id, &commit("c1")),
        Err(EngineError::Store(_))
    ));
    // The retry must not say "committed": nothing was written.
    assert!(matches!(
        e.commit(&id, &commit("c1")),
        Err(EngineError::Store(_))
    ));
    // With the disk back, a settled reservation's repeat still reports the
    // first failure; a new reservation commits.
    store.failing.store(false, Ordering::SeqCst);
    let s = e.screen(&screen(Some("u2"), &["c1"], true)).unwrap();
    let id2 = s.reservation.unwrap();
    assert_eq!(
        e.commit(&id2, &commit("c1")).unwrap().outcome,
        Outcome::Committed
    );
    assert_eq!(
        e.commit(&id2, &commit("c1")).unwrap().outcome,
        Outcome::Committed
    );
}

#[test]
fn a_reserving_screen_that_holds_nothing_leaves_the_user_record_idle() {
    let clock = Arc::new(ManualClock::new(T0));
    let e = memory_engine(clock.clone());
    ad_setup(&e);
    // u9 reaches c1's cap of 2 a day; a reserving screen of c1 then holds nothing.
    let ev = |id: &str| Event {
        user: Some("u9".into()),
        ids: Vec::new(),
        campaign: "c1".into(),
        cost: 1,
        event_id: Some(id.into()),
        event_type: None,
    };
    e.events(&[ev("a"), ev("b")]).unwrap();
    let s = e.screen(&screen(Some("u9"), &["c1"], true)).unwrap();
    assert!(s.reservation.is_none() && !s.results[0].eligible);
    assert_eq!(e.hot_len(), 1);
    // Two days on, the day's counter is idle: the record leaves memory.
    clock.advance(2 * 86_400 * SEC);
    e.sweep();
    assert_eq!(e.hot_len(), 0);
}

#[test]
fn in_memory_decisions_refuse_cold_records_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let store = Arc::new(Doctored::new(
        RocksStore::open(dir.path(), Durability::Wal).unwrap(),
    ));
    let e = Engine::open(store, clock, EngineOptions::default()).unwrap();
    ad_setup(&e);
    e.put_policy(
        "p",
        from_json(
            r#"{"limits": [{"kind": "window", "limit": 2, "window": "1h", "align": "fixed"}]}"#,
        )
        .unwrap(),
    )
    .unwrap();
    let check = CheckRequest {
        priority: Default::default(),
        target: CheckTarget::Policy("p".into()),
        key: "k".into(),
        cost: 1,
        reserve: true,
        ttl_ms: None,
        reservation_id: Some("r1".into()),
        fingerprint: None,
    };
    // A key not in memory is refused, and nothing was claimed or debited
    // (the same reservation id is free for the real call).
    assert!(e.check_in_memory(&check).is_none());
    let first = e.check(&check).unwrap();
    assert_eq!(first.reservation.as_deref(), Some("r1"));
    // Now the record is hot: decided in memory, and the repeat of a live id
    // gets the stored first answer.
    let again = e.check_in_memory(&check).expect("hot").unwrap();
    assert_eq!(again.decision.remaining, first.decision.remaining);
    let s = screen(Some("cold-user"), &["c1"], true);
    assert!(e.screen_in_memory(&s).is_none());
    assert!(e.screen(&s).unwrap().results[0].eligible);
    assert!(e.screen_in_memory(&s).expect("hot").unwrap().results[0].eligible);
    // After both, the user holds exactly two pending impressions.
    assert_eq!(e.user_usage("cold-user", "c1").unwrap()[0].pending, 2);

    // Events with a user not in memory are refused as a whole: no id
    // claimed, nothing counted (not even for the user in memory or the
    // campaign), so the real call counts them all.
    let event = |user: &str, id: &str| Event {
        user: Some(user.into()),
        ids: Vec::new(),
        campaign: "c1".into(),
        cost: 1,
        event_id: Some(id.into()),
        event_type: None,
    };
    let batch = [event("cold-user", "e1"), event("cold-2", "e2")];
    assert!(e.events_in_memory(&batch).is_none());
    let adv_used = || e.user_usage("cold-2", "c1").unwrap()[1].used;
    assert_eq!(adv_used(), 0, "the campaign-scope cap of `adv`");
    assert_eq!(e.events(&batch).unwrap(), 2);
    assert_eq!(e.user_usage("cold-2", "c1").unwrap()[0].used, 1);
    assert_eq!(adv_used(), 2);
    // Both users are in memory now (an event leaves a live counter), but
    // event ids are looked up in the store, which answers nothing from
    // memory here: refused as a whole, nothing claimed.
    assert!(
        e.events_in_memory(&[event("cold-user", "e3"), event("cold-2", "e4")])
            .is_none()
    );
    let no_id = |user: &str| Event {
        event_id: None,
        event_type: None,
        ..event(user, "")
    };
    let pending = e.events_in_memory(&[no_id("cold-user"), no_id("cold-2")]);
    assert_eq!(pending.expect("hot").unwrap().wait().unwrap(), 2);
    assert_eq!(e.user_usage("cold-2", "c1").unwrap()[0].used, 2);
    assert_eq!(
        e.events(&[event("cold-user", "e3"), event("cold-2", "e4")])
            .unwrap(),
        2
    );
    assert_eq!(e.events(&[event("cold-user", "e3")]).unwrap(), 0);
}

#[test]
fn rocksdb_answers_from_memory_what_it_can() {
    let dir = tempfile::tempdir().unwrap();
    let put = |s: &RocksStore, k: &[u8]| {
        s.submit(vec![Op::Put(Space::State, k.to_vec(), b"v".to_vec())], true)
            .wait()
            .unwrap()
    };
    // `None`: it would need a file read; `Some(value or None)`: answered.
    let cached = |s: &RocksStore, k: &[u8]| s.get_cached(Space::State, k).map(Result::unwrap);
    let v = Some(b"v".to_vec());
    {
        let s = RocksStore::open(dir.path(), Durability::Wal).unwrap();
        assert_eq!(cached(&s, b"absent"), Some(None), "never written");
        put(&s, b"on-disk");
        assert_eq!(cached(&s, b"on-disk"), Some(v.clone()), "in the memtable");
        // Into a file, which the restart below does not read.
        s.compact().unwrap();
    }
    let s = RocksStore::open(dir.path(), Durability::Wal).unwrap();
    assert_eq!(cached(&s, b"on-disk"), None, "needs a read");
    assert_eq!(s.get(Space::State, b"on-disk").unwrap(), v);
    assert_eq!(cached(&s, b"on-disk"), Some(v), "the read cached its block");
    // The file's bloom filter rules out keys it does not hold.
    assert_eq!(cached(&s, b"absent"), Some(None));
}

#[test]
fn a_memory_store_never_refuses_in_memory_decisions() {
    let clock = Arc::new(ManualClock::new(T0));
    let e = memory_engine(clock);
    ad_setup(&e);
    let s = screen(Some("new-user"), &["c1"], false);
    assert!(
        e.screen_in_memory(&s)
            .expect("memory store")
            .unwrap()
            .results[0]
            .eligible
    );
}

#[test]
fn deferred_commits_are_acknowledged_once_durable_sync_async_or_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let e = rocks_engine(dir.path(), clock);
    ad_setup(&e);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let reserve = |u: &str| {
        e.screen(&screen(Some(u), &["c1"], true))
            .unwrap()
            .reservation
            .unwrap()
    };
    // Async: awaited without a thread parked.
    let a = reserve("ua");
    let pending = e
        .commit_in_memory(&a, &commit("c1"))
        .expect("live")
        .unwrap();
    let o = rt.block_on(pending.wait_async()).unwrap();
    assert_eq!(o.outcome, Outcome::Committed);
    // A repeat, async too, gets the same outcome.
    let again = e
        .commit_in_memory(&a, &commit("c1"))
        .expect("remembered")
        .unwrap();
    assert_eq!(rt.block_on(again.wait_async()).unwrap(), o);
    // Dropped unwaited (a client gone): the writes still complete, and a
    // repeat reports the commit.
    let b = reserve("ub");
    drop(e.commit_deferred(&b, &commit("c1")).unwrap());
    assert_eq!(
        e.commit(&b, &commit("c1")).unwrap().outcome,
        Outcome::Committed
    );
    assert_eq!(e.user_usage("ub", "c1").unwrap()[0].used, 1);
    // A late commit is not decided in memory (it may read a cold record).
    let late = CommitRequest {
        campaigns: vec!["c1".into()],
        cost: Some(1),
        user: Some("uc".into()),
        event_id: None,
        sample: None,
        ids: Vec::new(),
    };
    assert!(e.commit_in_memory("gone", &late).is_none());
    assert_eq!(
        e.commit("gone", &late).unwrap().outcome,
        Outcome::LateCommit
    );
    assert_eq!(e.stats.commits.load(Ordering::Relaxed), 2);
    assert_eq!(e.stats.late_commits.load(Ordering::Relaxed), 1);
}

#[test]
fn the_sweeper_drops_the_counters_a_screen_left_at_zero() {
    let clock = Arc::new(ManualClock::new(T0));
    let e = memory_engine(clock.clone());
    let names: Vec<String> = (0..10).map(|i| format!("c{i}")).collect();
    for n in &names {
        e.put_campaign(
            n,
            campaign(r#"{"caps": [{"kind": "window", "limit": 2, "window": "1d", "align": "calendar"}]}"#),
        )
        .unwrap();
    }
    let camps: Vec<&str> = names.iter().map(String::as_str).collect();
    let id = e
        .screen(&screen(Some("u"), &camps, true))
        .unwrap()
        .reservation
        .unwrap();
    e.commit(&id, &commit("c3")).unwrap();
    let before = e.hot_bytes();
    clock.advance(SEC);
    assert_eq!(e.sweep(), 0, "the user is active: kept");
    assert!(e.hot_bytes() < before, "{} !< {before}", e.hot_bytes());
    // Nothing a decision sees changed: c3 has one impression, the others none.
    for c in &camps {
        let used = e.user_usage("u", c).unwrap()[0].used;
        assert_eq!(used, u64::from(*c == "c3"), "{c}");
    }
    let again = e.screen(&screen(Some("u"), &camps, false)).unwrap();
    assert!(again.results.iter().all(|r| r.eligible));
}

#[test]
fn idle_records_stay_in_memory_for_the_grace_then_leave() {
    let clock = Arc::new(ManualClock::new(T0));
    let options = EngineOptions {
        idle_grace: 10 * SEC,
        ..EngineOptions::default()
    };
    let e = Engine::open(Arc::new(MemoryStore::new()), clock.clone(), options).unwrap();
    let p = r#"{"limits": [{"kind": "rate", "rate": 1, "per": "1s"}]}"#;
    e.put_policy("p", from_json(p).unwrap()).unwrap();
    let check = CheckRequest {
        priority: Default::default(),
        target: CheckTarget::Policy("p".into()),
        key: "k".into(),
        cost: 1,
        reserve: false,
        ttl_ms: None,
        reservation_id: None,
        fingerprint: None,
    };
    assert!(e.check(&check).unwrap().decision.allowed);
    // Idle after 1 s (the bucket is full again); kept through the grace.
    clock.advance(5 * SEC);
    assert_eq!(e.sweep(), 0);
    assert_eq!(e.hot_len(), 1);
    clock.advance(6 * SEC);
    assert_eq!(e.sweep(), 1, "idle for more than 10 s");
    assert_eq!(e.hot_len(), 0);
    // Kept or not, an idle record answers as a fresh one.
    assert!(e.check(&check).unwrap().decision.allowed);
}

// ---- memory bounds (hardening issue, items 4-7 and 19) ----

/// A campaign with a daily budget far above what a test spends, and a user
/// cap, so each reservation holds debits in the user's record and the
/// campaign's.
const BUDGETED: &str = r#"{"budget": {"amount": 1000000000, "per": "1d", "pacing": "asap"},
    "caps": [{"kind": "window", "limit": 5, "window": "1d", "align": "calendar"}]}"#;

#[test]
fn open_reservations_past_the_cap_are_refused_as_overloaded() {
    let clock = Arc::new(ManualClock::new(T0));
    let options = EngineOptions {
        max_open_reservations: 3,
        ..EngineOptions::default()
    };
    let e = Engine::open(Arc::new(MemoryStore::new()), clock.clone(), options).unwrap();
    e.put_campaign("b", campaign(BUDGETED)).unwrap();
    let ids: Vec<String> = (0..3)
        .map(|u| {
            e.screen(&screen(Some(&format!("u{u}")), &["b"], true))
                .unwrap()
                .reservation
                .unwrap()
        })
        .collect();
    match e.screen(&screen(Some("u3"), &["b"], true)) {
        Err(EngineError::Overloaded(m)) => assert!(m.contains("max_open_reservations"), "{m}"),
        other => panic!("expected Overloaded, got {other:?}"),
    }
    let check = CheckRequest {
        priority: Default::default(),
        target: CheckTarget::Inline(vec![
            from_json(r#"{"kind": "rate", "rate": 10, "per": "1s"}"#).unwrap(),
        ]),
        key: "k".into(),
        cost: 1,
        reserve: true,
        ttl_ms: None,
        reservation_id: None,
        fingerprint: None,
    };
    assert!(matches!(e.check(&check), Err(EngineError::Overloaded(_))));
    // Nothing was reserved by the refused ones; decisions without a
    // reservation and repeats of a live one still work.
    assert_eq!(e.open_reservations(), 3);
    assert!(
        e.screen(&screen(Some("u3"), &["b"], false))
            .unwrap()
            .results[0]
            .eligible
    );
    assert_eq!(e.delivery("b").unwrap().pending, 3);
    // A settled one makes room.
    e.release(&ids[0]).unwrap();
    assert!(
        e.screen(&screen(Some("u3"), &["b"], true))
            .unwrap()
            .reservation
            .is_some()
    );
    // So does expiry.
    clock.advance(2 * SEC);
    assert!(
        e.screen(&screen(Some("u4"), &["b"], true))
            .unwrap()
            .reservation
            .is_some()
    );
    assert_eq!(e.open_reservations(), 1);
}

/// Reserving screens for unique users pin one record each: with no bound,
/// 577 000 of them took a 32 MiB hot tier to 281 MB. Reservations take at
/// most half the budget, and the hot tier makes room for what they hold
/// outside it.
#[test]
fn reservations_stay_within_the_memory_budget() {
    let clock = Arc::new(ManualClock::new(T0));
    let budget = 4 << 20;
    let options = EngineOptions {
        memory_budget: budget,
        shards: 4,
        ..EngineOptions::default()
    };
    let e = Engine::open(Arc::new(MemoryStore::new()), clock.clone(), options).unwrap();
    e.put_campaign("b", campaign(BUDGETED)).unwrap();
    let (mut held, mut refused) = (0u64, 0u64);
    for u in 0..40_000 {
        match e.screen(&screen(Some(&format!("user-{u}")), &["b"], true)) {
            Ok(s) => {
                assert!(s.reservation.is_some());
                held += 1;
            }
            Err(EngineError::Overloaded(_)) => refused += 1,
            Err(other) => panic!("unexpected {other}"),
        }
        assert!(
            e.hot_bytes() <= budget,
            "hot tier at {} bytes",
            e.hot_bytes()
        );
    }
    assert!(refused > 0 && held > 1000, "held {held}, refused {refused}");
    assert!(e.reservation_bytes() <= budget / 2 + 4096);
    assert!(e.hot_bytes() + e.reservation_bytes() <= budget * 3 / 2);
    assert_eq!(e.delivery("b").unwrap().pending, held);
    // Expired, they make room again.
    clock.advance(2 * SEC);
    e.sweep();
    assert_eq!((e.open_reservations(), e.reservation_bytes()), (0, 0));
    assert_eq!(e.delivery("b").unwrap().pending, 0);
    assert!(e.screen(&screen(Some("again"), &["b"], true)).is_ok());
}

#[test]
fn a_reserve_past_the_cap_answers_503_overloaded() {
    use tower::ServiceExt;
    let options = EngineOptions {
        max_open_reservations: 1,
        ..EngineOptions::default()
    };
    let e = Engine::open(
        Arc::new(MemoryStore::new()),
        freqcap::SystemClock::new(),
        options,
    )
    .unwrap();
    e.put_campaign("b", campaign(BUDGETED)).unwrap();
    let app = freqcap::api::router(Arc::new(e), freqcap::api::ApiOptions::default());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let send = |user: &str| {
        let body = format!(
            r#"{{"user": "{user}", "candidates": [{{"campaign": "b"}}], "reserve": true}}"#
        );
        let req = axum::http::Request::builder()
            .method("POST")
            .uri("/v1/screen")
            .header("content-type", "application/json")
            .body(axum::body::Body::from(body))
            .unwrap();
        rt.block_on(async {
            let r = app.clone().oneshot(req).await.unwrap();
            let status = r.status().as_u16();
            let retry = r.headers().get("retry-after").cloned();
            let bytes = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
            let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            (status, v, retry)
        })
    };
    assert_eq!(send("u1").0, 200);
    let (status, body, retry) = send("u2");
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "overloaded", "{body}");
    assert!(retry.is_some());
}

/// Many open reservations on one budgeted campaign, settled every way: the
/// figures that sum pending debits (delivery, usage) stay exact throughout.
#[test]
fn many_open_reservations_on_one_budget_settle_exactly() {
    let clock = Arc::new(ManualClock::new(T0));
    let e = memory_engine(clock.clone());
    e.put_campaign("b", campaign(BUDGETED)).unwrap();
    let n = 20_000u64;
    let mut ids = Vec::new();
    for u in 0..n {
        let mut req = screen(Some(&format!("u{u}")), &["b", "b"], true);
        req.candidates[0].cost = Some(3);
        req.ttl_ms = Some(if u % 4 == 3 { 1000 } else { 60_000 });
        ids.push(e.screen(&req).unwrap().reservation.unwrap());
    }
    let d = e.delivery("b").unwrap();
    assert_eq!((d.spent, d.pending), (0, n * 4));
    let usage = e.user_usage("u0", "b").unwrap();
    assert_eq!((usage[0].pending, usage[0].used), (2, 0));
    // A quarter committed (the first candidate, at cost 5), a quarter
    // released, a quarter committed whole, a quarter expired.
    for (u, id) in ids.iter().enumerate() {
        match u % 4 {
            0 => {
                let c = CommitRequest {
                    cost: Some(5),
                    ..commit("b")
                };
                e.commit(id, &c).unwrap();
            }
            1 => {
                e.release(id).unwrap();
            }
            2 => {
                e.commit(id, &CommitRequest::default()).unwrap();
            }
            _ => {}
        }
    }
    let q = n / 4;
    let d = e.delivery("b").unwrap();
    // Committed whole at the reserved costs: 3 + 1 each.
    assert_eq!(d.spent, q * 5 + q * 4);
    assert_eq!(d.pending, q * 4);
    let usage = e.user_usage("u0", "b").unwrap();
    assert_eq!((usage[0].pending, usage[0].used), (0, 1));
    let usage = e.user_usage("u3", "b").unwrap();
    assert_eq!((usage[0].pending, usage[0].used), (2, 0));
    clock.advance(2 * SEC);
    // A request expires a batch of what is due; the sweeper, the rest.
    e.sweep();
    let d = e.delivery("b").unwrap();
    assert_eq!((d.spent, d.pending), (q * 9, 0));
    assert_eq!(e.open_reservations(), 0);
    let usage = e.user_usage("u3", "b").unwrap();
    assert_eq!((usage[0].pending, usage[0].used), (0, 0));
    assert_eq!(e.stats.expired.load(Ordering::Relaxed), q);
}

/// A commit naming several winners writes one batch: the user record and
/// every winner's campaign records together (each encoded once), so it is
/// durable whole or not at all.
#[test]
fn a_commit_of_several_winners_is_one_batch() {
    let store = Arc::new(Doctored::counting(MemoryStore::new()));
    let clock = Arc::new(ManualClock::new(T0));
    let e = Engine::open(store.clone(), clock, EngineOptions::default()).unwrap();
    let camp: CampaignDef = from_json(
        r#"{"caps": [{"kind": "window", "limit": 3, "window": "1d"}],
            "budget": {"amount": 1000, "pacing": "asap"}}"#,
    )
    .unwrap();
    for c in ["c1", "c2", "c3"] {
        e.put_campaign(c, camp.clone()).unwrap();
    }
    let s = e
        .screen(&screen(Some("u"), &["c1", "c2", "c3"], true))
        .unwrap();
    let id = s.reservation.unwrap();
    let before = store.acknowledged.load(Ordering::Relaxed);
    let c = e
        .commit(
            &id,
            &CommitRequest {
                campaigns: vec!["c1".into(), "c2".into()],
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(c.campaigns.len(), 2);
    assert_eq!(store.acknowledged.load(Ordering::Relaxed) - before, 1);
    let used = |c: &str| e.user_usage("u", c).unwrap()[0].used;
    assert_eq!((used("c1"), used("c2"), used("c3")), (1, 1, 0));
}

/// Each 409 is its own case, so a front can map it without reading text;
/// the messages are the ones clients have always seen.
#[test]
fn conflicts_say_which_case_they_are() {
    use freqcap::engine::{Conflict, ReservationKind};
    let e = memory_engine(Arc::new(ManualClock::new(T0)));
    let p: PolicyDef = from_json(
        r#"{"limits": [{"kind": "window", "limit": 5, "window": "1h", "align": "fixed"}]}"#,
    )
    .unwrap();
    e.put_policy("p", p).unwrap();
    let check = |id: &str, cost: u64| CheckRequest {
        priority: Default::default(),
        target: CheckTarget::Policy("p".into()),
        key: "k".into(),
        cost,
        reserve: true,
        ttl_ms: None,
        reservation_id: Some(id.into()),
        fingerprint: None,
    };
    e.check(&check("r1", 1)).unwrap();
    let conflict = |r: Result<_, EngineError>| match r {
        Err(EngineError::Conflict(c)) => c,
        other => panic!("expected a conflict, got {:?}", other.map(|_| ())),
    };
    let c = conflict(e.check(&check("r1", 2)).map(|_| ()));
    assert_eq!(c, Conflict::DifferentRequest { id: "r1".into() });
    assert_eq!(
        c.to_string(),
        "reservation \"r1\" exists with a different request"
    );
    // The same body sent to the other endpoint under a live id (the HTTP
    // layer's fingerprint of it matches).
    e.put_campaign("c", from_json("{}").unwrap()).unwrap();
    e.check(&CheckRequest {
        priority: Default::default(),
        fingerprint: Some(7),
        ..check("r2", 1)
    })
    .unwrap();
    let mut sc = screen(Some("u"), &["c"], true);
    sc.reservation_id = Some("r2".into());
    sc.fingerprint = Some(7);
    let c = conflict(e.screen(&sc).map(|_| ()));
    assert_eq!(
        c,
        Conflict::BelongsTo {
            id: "r2".into(),
            kind: ReservationKind::Check
        }
    );
    assert_eq!(c.to_string(), "reservation \"r2\" belongs to a check");
    e.release("r1").unwrap();
    let c = conflict(e.commit("r1", &CommitRequest::default()).map(|_| ()));
    assert_eq!(
        c,
        Conflict::SettledOtherwise {
            id: "r1".into(),
            outcome: Outcome::Released
        }
    );
    let c = conflict(e.check(&check("r1", 1)).map(|_| ()));
    assert_eq!(c, Conflict::AlreadySettled { id: "r1".into() });
    e.put_campaign("parent", from_json("{}").unwrap()).unwrap();
    e.put_campaign("child", from_json(r#"{"parent": "parent"}"#).unwrap())
        .unwrap();
    let c = conflict(e.delete_campaign("parent"));
    assert_eq!(
        c,
        Conflict::HasChildren {
            name: "parent".into()
        }
    );
}

/// Event ids are looked up in the store when they come, not loaded at open
/// (loading 5 million took a restart 7.7 s): still, an acknowledged id is
/// counted once across restarts, until its horizon passes.
#[test]
fn restart_loads_no_event_ids_and_each_still_counts_once() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let options = EngineOptions {
        dedupe_horizon: 3600 * SEC,
        ..EngineOptions::default()
    };
    let open = |clock: Arc<ManualClock>| {
        let store = Arc::new(Doctored::counting(
            RocksStore::open(dir.path(), Durability::Wal).unwrap(),
        ));
        let e = Engine::open(store.clone(), clock, options.clone()).unwrap();
        (e, store)
    };
    let ev = |i: u64| Event {
        user: Some(format!("u{}", i % 7)),
        ids: Vec::new(),
        campaign: "c".into(),
        cost: 1,
        event_id: Some(format!("e{i}")),
        event_type: None,
    };
    let batch = |r: std::ops::Range<u64>| r.map(ev).collect::<Vec<_>>();
    {
        let (e, _) = open(clock.clone());
        e.put_campaign("c", campaign(BUDGETED)).unwrap();
        assert_eq!(e.events(&batch(0..3000)).unwrap(), 3000);
        // Again within the batch and across batches: once.
        assert_eq!(e.events(&[ev(3000), ev(3000), ev(5)]).unwrap(), 1);
        // Into files, so the next run reads some from disk.
        e.store().compact().unwrap();
        assert_eq!(e.events(&batch(2990..3010)).unwrap(), 9);
    }
    clock.advance(60 * SEC);
    let (e, store) = open(clock.clone());
    assert_eq!(
        store.dedupe_scans.load(Ordering::Relaxed),
        0,
        "no eager load"
    );
    assert_eq!(e.events(&batch(0..3010)).unwrap(), 0);
    assert_eq!(e.events(&batch(3005..3020)).unwrap(), 10);
    // Past the horizon an id counts again.
    clock.advance(3600 * SEC);
    assert_eq!(e.events(&batch(0..10)).unwrap(), 10);
    assert_eq!(e.events(&batch(0..10)).unwrap(), 0);
}

/// Of batches racing with the same ids, each id is counted by one.
#[test]
fn racing_batches_with_the_same_ids_count_each_once() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let e = rocks_engine(dir.path(), clock);
    e.put_campaign("c", campaign(BUDGETED)).unwrap();
    let counted = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (e, counted) = (&e, &counted);
            s.spawn(move || {
                for round in 0..200u64 {
                    let evs: Vec<Event> = (0..10)
                        .map(|i| Event {
                            user: None,
                            ids: Vec::new(),
                            campaign: "c".into(),
                            cost: 1,
                            event_id: Some(format!("id-{round}-{}", (i + t) % 10)),
                            event_type: None,
                        })
                        .collect();
                    let n = e.events(&evs).unwrap();
                    counted.fetch_add(n as u64, Ordering::Relaxed);
                }
            });
        }
    });
    assert_eq!(counted.load(Ordering::Relaxed), 200 * 10);
    assert_eq!(e.delivery("c").unwrap().spent, 200 * 10);
}

/// The write-ahead log stays within its bound: before the bound, column
/// families written once at start (definitions, meta) kept every log file
/// alive (116 MB of a 150 MB data dir after 2 000 000 keys).
#[test]
fn the_write_ahead_log_stays_within_its_bound() {
    use freqcap::store::RocksOptions;
    let dir = tempfile::tempdir().unwrap();
    let sizes = RocksOptions {
        block_cache_bytes: 8 << 20,
        write_buffer_bytes: 1 << 20,
        max_wal_bytes: 2 << 20,
        ..RocksOptions::default()
    };
    let store = RocksStore::open_with(dir.path(), Durability::Wal, sizes).unwrap();
    store
        .submit(
            vec![Op::Put(Space::Definitions, b"p/x".to_vec(), b"v".to_vec())],
            true,
        )
        .wait()
        .unwrap();
    let value = vec![7u8; 200];
    let mut most = 0;
    for round in 0..60u32 {
        let batch = (0..1000u32)
            .map(|i| {
                let k = (round * 1000 + i).to_be_bytes().to_vec();
                Op::Put(Space::State, k, value.clone())
            })
            .collect();
        store.submit(batch, true).wait().unwrap();
        let wal: u64 = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(Result::ok)
            .filter(|f| f.file_name().to_string_lossy().ends_with(".log"))
            .filter_map(|f| f.metadata().ok())
            .map(|m| m.len())
            .sum();
        most = most.max(wal);
    }
    // 12 MB written; the bound plus the log being written and one memtable
    // being flushed.
    assert!(most <= 5 << 20, "{most} bytes of write-ahead log");
    assert_eq!(
        store.get(Space::Definitions, b"p/x").unwrap().as_deref(),
        Some(&b"v"[..])
    );
}

/// Only RocksDB's lock error means "in use by another process": not a data
/// dir whose path says "lock", nor a corrupt store.
#[test]
fn only_a_held_lock_is_reported_as_in_use() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("lock-block").join("data");
    drop(RocksStore::open(&dir, Durability::Wal).unwrap());
    // A real second open, while the first holds it.
    let first = RocksStore::open(&dir, Durability::Wal).unwrap();
    match RocksStore::open(&dir, Durability::Wal) {
        Err(StoreError::Locked { .. }) => {}
        other => panic!("expected Locked, got {:?}", other.map(|_| ())),
    }
    drop(first);
    // A corrupt store under a path with "lock" in it.
    std::fs::write(dir.join("CURRENT"), b"MANIFEST-999999\n").unwrap();
    match RocksStore::open(&dir, Durability::Wal) {
        Err(StoreError::Io(m)) => assert!(m.contains("cannot open"), "{m}"),
        other => panic!("expected Io, got {:?}", other.map(|_| ())),
    }
}

/// A backlog of due reservations is expired a batch per request (and wholly
/// by the sweeper), so no request waits for all of it; a reservation still in
/// the backlog is expired when it is committed or released, never settled.
#[test]
fn a_backlog_of_due_reservations_is_expired_a_batch_per_request() {
    let clock = Arc::new(ManualClock::new(T0));
    let e = memory_engine(clock.clone());
    e.put_campaign("b", campaign(BUDGETED)).unwrap();
    let batch = freqcap::engine::EXPIRE_BATCH as u64;
    let n = 3 * batch;
    let ids: Vec<String> = (0..n)
        .map(|u| {
            e.screen(&screen(Some(&format!("u{u}")), &["b"], true))
                .unwrap()
                .reservation
                .unwrap()
        })
        .collect();
    clock.advance(2 * SEC);
    assert_eq!(e.delivery("b").unwrap().pending, n - batch);
    assert_eq!(e.open_reservations() as u64, n - batch);
    // The last one is still open in the table, past its deadline.
    let last = ids.last().unwrap();
    match e.commit(last, &commit("b")) {
        Err(EngineError::NotFound(_)) => {}
        other => panic!("expected NotFound, got {other:?}"),
    }
    assert!(matches!(e.release(last), Err(EngineError::NotFound(_))));
    let u = format!("u{}", n - 1);
    assert_eq!(e.user_usage(&u, "b").unwrap()[0].pending, 0);
    e.sweep();
    assert_eq!(e.open_reservations(), 0);
    assert_eq!(e.delivery("b").unwrap().pending, 0);
    assert_eq!(e.stats.expired.load(Ordering::Relaxed), n);
}

// ---- measurements (ignored by default; run by name with --ignored) ----

/// Resident set size of this process, bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Bytes of the files in `dir` whose names end with `suffix`.
fn bytes_of(dir: &std::path::Path, suffix: &str) -> u64 {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|f| f.file_name().to_string_lossy().ends_with(suffix))
                .filter_map(|f| f.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// Unique event ids through the engine on RocksDB: ids per second and RSS
/// growth per id. Leaves the data dir for `loadgen restart`.
/// `FREQCAP_MEASURE_DIR=/tmp/ids FREQCAP_MEASURE_N=3000000 engine-test
/// measure_event_ids --ignored --nocapture`
#[test]
#[ignore = "a measurement, run by name"]
fn measure_event_ids() {
    let Ok(dir) = std::env::var("FREQCAP_MEASURE_DIR") else {
        return;
    };
    let n: u64 = std::env::var("FREQCAP_MEASURE_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3_000_000);
    // `memory`: the memory store instead.
    let store: Arc<dyn Store> = if dir == "memory" {
        Arc::new(MemoryStore::new())
    } else {
        Arc::new(RocksStore::open(dir.as_ref(), Durability::Wal).unwrap())
    };
    let e = Engine::open(store, freqcap::SystemClock::new(), EngineOptions::default()).unwrap();
    e.put_campaign(
        "c",
        campaign(r#"{"caps": [{"kind": "window", "limit": 1000000000000, "window": "1d", "align": "calendar", "scope": "campaign"}]}"#),
    )
    .unwrap();
    let before = rss();
    let start = std::time::Instant::now();
    let batch = 1000;
    for b in 0..n / batch {
        let evs: Vec<Event> = (0..batch)
            .map(|i| Event {
                user: None,
                ids: Vec::new(),
                campaign: "c".into(),
                cost: 1,
                event_id: Some(format!("m-{}", b * batch + i)),
                event_type: None,
            })
            .collect();
        assert_eq!(e.events(&evs).unwrap(), batch as usize);
    }
    let secs = start.elapsed().as_secs_f64();
    let after = rss();
    e.flush().unwrap();
    println!(
        "{n} unique event ids in batches of {batch}: {:.0} ids/s; RSS {} -> {} MB, {:.1} B per id; \
         data dir {} MB ({} MB of write-ahead log)",
        n as f64 / secs,
        before >> 20,
        after >> 20,
        after.saturating_sub(before) as f64 / n as f64,
        (bytes_of(dir.as_ref(), ".sst") + bytes_of(dir.as_ref(), ".log")) >> 20,
        bytes_of(dir.as_ref(), ".log") >> 20,
    );
}

/// 2 000 000 distinct keys checked (inline rate limit) with a 32 MiB budget
/// on RocksDB at the default sizes: RSS and what the data dir holds.
/// `FREQCAP_MEASURE_DIR=/tmp/keys engine-test measure_distinct_keys
/// --ignored --nocapture`
#[test]
#[ignore = "a measurement, run by name"]
fn measure_distinct_keys() {
    let Ok(dir) = std::env::var("FREQCAP_MEASURE_DIR") else {
        return;
    };
    let n: u64 = std::env::var("FREQCAP_MEASURE_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000_000);
    let store = Arc::new(RocksStore::open(dir.as_ref(), Durability::Wal).unwrap());
    let options = EngineOptions {
        memory_budget: 32 << 20,
        ..EngineOptions::default()
    };
    let e = Engine::open(store, freqcap::SystemClock::new(), options).unwrap();
    let limits = vec![from_json(r#"{"kind": "rate", "rate": 10, "per": "1h"}"#).unwrap()];
    let start = std::time::Instant::now();
    for k in 0..n {
        let req = CheckRequest {
            priority: Default::default(),
            target: CheckTarget::Inline(limits.clone()),
            key: format!("key-{k}"),
            cost: 1,
            reserve: false,
            ttl_ms: None,
            reservation_id: None,
            fingerprint: None,
        };
        assert!(e.check(&req).unwrap().decision.allowed);
    }
    e.flush().unwrap();
    let d: &std::path::Path = dir.as_ref();
    println!(
        "{n} distinct keys in {:.1?}: RSS {} MB (hot tier {} MB); data dir: {} MB of tables, \
         {} MB of write-ahead log; memtables {} MB",
        start.elapsed(),
        rss() >> 20,
        e.hot_bytes() >> 20,
        bytes_of(d, ".sst") >> 20,
        bytes_of(d, ".log") >> 20,
        e.store().stats().memtable_bytes >> 20,
    );
}

/// RSS per open reservation: one-candidate screens of unique users on one
/// budgeted campaign, against what the engine accounts for them.
/// `FREQCAP_MEASURE_N=500000 engine-test measure_reservation_bytes
/// --ignored --nocapture`
#[test]
#[ignore = "a measurement, run by name"]
fn measure_reservation_bytes() {
    let Some(n) = std::env::var("FREQCAP_MEASURE_N")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    else {
        return;
    };
    let options = EngineOptions {
        memory_budget: 8 << 30,
        max_open_reservations: 10_000_000,
        ..EngineOptions::default()
    };
    let e = Engine::open(
        Arc::new(MemoryStore::new()),
        freqcap::SystemClock::new(),
        options,
    )
    .unwrap();
    e.put_campaign("b", campaign(BUDGETED)).unwrap();
    let before = rss();
    for u in 0..n {
        let mut req = screen(Some(&format!("user-{u}")), &["b"], true);
        req.ttl_ms = Some(3_600_000);
        e.screen(&req).unwrap().reservation.unwrap();
    }
    let grown = rss().saturating_sub(before);
    println!(
        "{n} open reservations: RSS +{} MB, {:.0} B each; accounted {:.0} B each \
         (hot tier {} MB)",
        grown >> 20,
        grown as f64 / n as f64,
        e.reservation_bytes() as f64 / n as f64,
        e.hot_bytes() >> 20
    );
}

/// The memory store keeps event ids for one horizon, as RocksDB's compaction
/// filter does: with ids now looked up in the store, it is their only copy.
#[test]
fn the_memory_store_forgets_event_ids_past_their_horizon() {
    let clock = Arc::new(ManualClock::new(T0));
    let options = EngineOptions {
        dedupe_horizon: 10 * SEC,
        ..EngineOptions::default()
    };
    let store = Arc::new(MemoryStore::new());
    let e = Engine::open(store.clone(), clock.clone(), options).unwrap();
    e.put_campaign("c", campaign(BUDGETED)).unwrap();
    let ev = |i: u64| Event {
        user: None,
        ids: Vec::new(),
        campaign: "c".into(),
        cost: 1,
        event_id: Some(format!("e{i}")),
        event_type: None,
    };
    assert_eq!(
        e.events(&(0..100).map(ev).collect::<Vec<_>>()).unwrap(),
        100
    );
    clock.advance(5 * SEC);
    assert_eq!(
        e.events(&(50..150).map(ev).collect::<Vec<_>>()).unwrap(),
        50
    );
    assert_eq!(store.scan(Space::Dedupe).unwrap().len(), 150);
    clock.advance(6 * SEC);
    // The first hundred are past their horizon: gone, and counted again.
    assert_eq!(e.events(&[ev(0)]).unwrap(), 1);
    assert_eq!(store.scan(Space::Dedupe).unwrap().len(), 51);
    assert_eq!(e.events(&[ev(120)]).unwrap(), 0);
}

/// Reports and refunds of `Engine::check_all` (docs/rls.md, "Reports and
/// refunds") on every kind of item a key's limits can have: a report is
/// debited past the limit and never denies, a refund is credited back
/// floored at nothing used, a decided key beside a report still decides
/// after it, and what they leave survives a restart on RocksDB.
#[test]
fn reports_go_past_the_limit_and_refunds_stop_at_nothing_used() {
    use freqcap::engine::{KeyCheck, Usage, compile_inline};
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let kinds = [
        r#"{"kind": "window", "limit": 10, "window": "1h", "align": "fixed"}"#,
        r#"{"kind": "window", "limit": 10, "window": "1h", "align": "rolling", "precision": "exact"}"#,
        r#"{"kind": "window", "limit": 10, "window": "1h", "align": "rolling", "precision": "approximate"}"#,
        r#"{"kind": "rate", "rate": 10, "per": "1h", "burst": 10}"#,
        r#"{"kind": "budget", "amount": 10, "pacing": "asap"}"#,
    ];
    for (k, def) in kinds.iter().enumerate() {
        let defs: Vec<freqcap::model::LimitDef> = from_json(&format!("[{def}]")).unwrap();
        let limits = compile_inline(&defs).unwrap();
        let key = |cost, usage| KeyCheck {
            priority: Default::default(),
            limits: limits.clone(),
            key: format!("k{k}"),
            cost,
            enforced: true,
            usage,
        };
        let left = |e: &Engine<Arc<ManualClock>>| {
            e.check_all(&[key(0, Usage::Decide)]).unwrap().decisions[0].remaining
        };
        {
            let e = rocks_engine(dir.path(), clock.clone());
            assert!(
                e.check_all(&[key(8, Usage::Decide)]).unwrap().allowed,
                "{def}"
            );
            let o = e.check_all(&[key(5, Usage::Report)]).unwrap();
            assert!(o.allowed && o.decisions[0].allowed, "{def}");
            assert_eq!(left(&e), 0, "{def}");
            // 13 − 4 = 9: one left (a report capped at the limit would
            // have left 4).
            let o = e.check_all(&[key(4, Usage::Refund)]).unwrap();
            assert!(o.allowed, "{def}");
            assert_eq!(o.decisions[0].remaining, 1, "{def}");
            e.flush().unwrap();
        }
        // After a restart: what they left, then a refund past nothing used.
        let e = rocks_engine(dir.path(), clock.clone());
        assert_eq!(left(&e), 1, "{def}");
        e.check_all(&[key(100, Usage::Refund)]).unwrap();
        assert_eq!(left(&e), 10, "{def}: floored at nothing used");
        // A report beside a decided key that denies is applied all the
        // same; the decided key is decided after it.
        let o = e
            .check_all(&[key(6, Usage::Report), key(5, Usage::Decide)])
            .unwrap();
        assert!(!o.allowed && o.decisions[0].allowed && !o.decisions[1].allowed);
        assert_eq!(left(&e), 4, "{def}");
        // From memory (the server's first try) as from the store.
        let o = e
            .check_all_in_memory(&[key(4, Usage::Refund), key(2, Usage::Decide)])
            .expect("in memory")
            .unwrap();
        assert!(o.allowed);
        assert_eq!(left(&e), 6, "{def}");
    }
}

/// `Engine::check_all` (Envoy's rate limit service, docs/rls.md): several
/// keys all or nothing, a key given twice, shadow keys, a cost of 0, and
/// counts kept across a restart on RocksDB.
#[test]
fn check_all_is_all_or_nothing() {
    use freqcap::engine::{KeyCheck, compile_inline};
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let limits = |n: u64| {
        let defs: Vec<freqcap::model::LimitDef> = from_json(&format!(
            r#"[{{"kind": "window", "limit": {n}, "window": "1h", "align": "fixed"}}]"#
        ))
        .unwrap();
        compile_inline(&defs).unwrap()
    };
    let (two, ten) = (limits(2), limits(10));
    let key = |l: &Arc<freqcap::engine::CompiledInline>, k: &str, cost, enforced| KeyCheck {
        priority: Default::default(),
        limits: l.clone(),
        key: k.into(),
        cost,
        enforced,
        usage: Default::default(),
    };
    let remaining = |o: &freqcap::engine::AllOutcome| -> Vec<u64> {
        o.decisions.iter().map(|d| d.remaining).collect()
    };
    {
        let e = rocks_engine(dir.path(), clock.clone());
        let pair = [key(&two, "narrow", 1, true), key(&ten, "wide", 1, true)];
        let o = e.check_all(&pair).unwrap();
        assert!(o.allowed);
        assert_eq!(remaining(&o), [1, 9]);
        // Cost 2 on narrow cannot be paid: nothing moves, wide included,
        // and wide reports what it has.
        let o = e
            .check_all(&[key(&two, "narrow", 2, true), key(&ten, "wide", 1, true)])
            .unwrap();
        assert!(!o.allowed);
        assert!(!o.decisions[0].allowed && o.decisions[1].allowed);
        assert_eq!(remaining(&o), [1, 9]);
        // A key given twice sees its first debit: with 1 left, the second
        // is over (it saw 0 left), and the first is not debited either.
        let twice = [key(&two, "narrow", 1, true), key(&two, "narrow", 1, true)];
        let o = e.check_all(&twice).unwrap();
        assert!(!o.allowed);
        assert!(o.decisions[0].allowed && !o.decisions[1].allowed);
        assert_eq!(remaining(&o), [1, 0]);
        let o = e.check_all(&twice[..1]).unwrap();
        assert!(o.allowed);
        assert_eq!(remaining(&o), [0]);
        // A shadow key over its limit does not deny, and is not debited
        // further; the enforced one is.
        let o = e
            .check_all(&[key(&two, "narrow", 1, false), key(&ten, "wide", 1, true)])
            .unwrap();
        assert!(o.allowed);
        assert!(!o.decisions[0].allowed);
        assert_eq!(remaining(&o), [0, 8]);
        // Cost 0 looks without debiting.
        let o = e.check_all(&[key(&ten, "wide", 0, true)]).unwrap();
        assert_eq!(remaining(&o), [8]);
        // Bad input is refused whole.
        assert!(matches!(
            e.check_all(&[]),
            Err(EngineError::InvalidArgument { .. })
        ));
        let o = e.check_all(&[key(&ten, "", 1, true)]);
        assert!(
            matches!(o, Err(EngineError::InvalidArgument { .. })),
            "{o:?}"
        );
        e.flush().unwrap();
    }
    // Counts survive a restart.
    let e = rocks_engine(dir.path(), clock.clone());
    let o = e.check_all(&[key(&ten, "wide", 0, true)]).unwrap();
    assert_eq!(remaining(&o), [8]);
    // And reset with the window (the next hour from the epoch).
    clock.set(T0 - T0 % (3600 * SEC) + 3600 * SEC);
    let o = e.check_all(&[key(&ten, "wide", 1, true)]).unwrap();
    assert_eq!(remaining(&o), [9]);
}

/// Shadow mode (docs/semantics.md, "Shadow mode") debits exactly what
/// enforcing debits: the same stream of checks, screens, commits and
/// releases through two engines, one enforcing and one with every
/// definition in shadow mode, gives the same figures at every step and at
/// the end; each shadow answer is allowed, with `would_deny` exactly where
/// the enforced one denied (by the same cap). Once per definition-level
/// `mode` and once per `--shadow` (the engine option).
#[test]
fn shadow_debits_what_enforcement_debits() {
    for whole_service in [false, true] {
        let clock = Arc::new(ManualClock::new(T0));
        let enforced = memory_engine(clock.clone());
        let shadow = Engine::open(
            Arc::new(MemoryStore::new()),
            clock.clone(),
            EngineOptions {
                shadow: whole_service,
                ..EngineOptions::default()
            },
        )
        .unwrap();
        let mode = if whole_service {
            ""
        } else {
            r#", "mode": "shadow""#
        };
        for (e, m) in [(&enforced, ""), (&shadow, mode)] {
            let p: PolicyDef = from_json(&format!(
                r#"{{"limits": [{{"kind": "rate", "rate": 3, "per": "1m"}},
                               {{"kind": "window", "limit": 10, "window": "1h", "align": "fixed"}}]{m}}}"#
            ))
            .unwrap();
            e.put_policy("p", p).unwrap();
            e.put_campaign(
                "brand",
                campaign(&format!(
                    r#"{{"caps": [{{"kind": "window", "limit": 25, "window": "1d", "scope": "campaign", "name": "brand-daily"}}]{m}}}"#
                )),
            )
            .unwrap();
            for c in ["c1", "c2"] {
                e.put_campaign(
                    c,
                    campaign(&format!(
                        r#"{{"parent": "brand", "caps": [{{"kind": "window", "limit": 2, "window": "1d", "name": "per-user"}}],
                            "budget": {{"amount": 40, "pacing": "asap"}}, "max_in_flight": 3{m}}}"#
                    )),
                )
                .unwrap();
            }
        }
        // A fixed pseudo-random stream (an LCG: the same on every run).
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |n: u64| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (x >> 33) % n
        };
        let (mut would, mut denied) = (0, 0);
        for step in 0..600 {
            clock.advance(next(4_000) * 1_000_000);
            match next(3) {
                0 => {
                    let req = CheckRequest {
                        priority: Default::default(),
                        target: CheckTarget::Policy("p".into()),
                        key: format!("k{}", next(3)),
                        cost: 1 + next(2),
                        reserve: next(3) == 0,
                        ttl_ms: Some(2_000),
                        reservation_id: None,
                        fingerprint: None,
                    };
                    let a = enforced.check(&req).unwrap();
                    let b = shadow.check(&req).unwrap();
                    assert!(b.decision.allowed, "step {step}");
                    assert_eq!(b.would_deny, !a.decision.allowed, "step {step}");
                    assert_eq!(b.decision.remaining, a.decision.remaining, "step {step}");
                    assert_eq!(a.reservation.is_some(), a.decision.allowed && req.reserve);
                    assert_eq!(b.reservation.is_some(), req.reserve, "step {step}");
                    would += usize::from(b.would_deny);
                    // The caller settles what it reserved, the same way.
                    let commit = next(2) == 0;
                    for (e, out) in [(&enforced, &a), (&shadow, &b)] {
                        if let Some(id) = &out.reservation {
                            if commit {
                                e.commit(id, &CommitRequest::default()).unwrap();
                            } else {
                                e.release(id).unwrap();
                            }
                        }
                    }
                }
                _ => {
                    let user = format!("u{}", next(4));
                    let req = screen(Some(&user), &["c1", "c2"], true);
                    let a = enforced.screen(&req).unwrap();
                    let b = shadow.screen(&req).unwrap();
                    for (ra, rb) in a.results.iter().zip(&b.results) {
                        assert!(rb.eligible, "step {step}");
                        assert_eq!(
                            rb.would_deny.as_ref().map(|d| (&d.campaign, &d.cap)),
                            ra.denied_by.as_ref().map(|d| (&d.campaign, &d.cap)),
                            "step {step}"
                        );
                        denied += usize::from(!ra.eligible);
                    }
                    // The winner is the first candidate enforcing allows.
                    let winner = a.results.iter().position(|r| r.eligible);
                    assert_eq!(
                        winner,
                        b.results.iter().position(|r| r.would_deny.is_none())
                    );
                    // Most auctions are won; some are lost (all released).
                    let won = winner.filter(|_| next(4) != 0);
                    for (e, out) in [(&enforced, &a), (&shadow, &b)] {
                        let Some(id) = &out.reservation else { continue };
                        match won {
                            Some(w) => {
                                let c = CommitRequest {
                                    campaigns: vec![out.results[w].campaign.to_string()],
                                    ..CommitRequest::default()
                                };
                                e.commit(id, &c).unwrap();
                            }
                            None => {
                                e.release(id).unwrap();
                            }
                        }
                    }
                }
            }
            // The figures agree at every step.
            for c in ["c1", "c2"] {
                assert_eq!(
                    enforced.delivery(c).unwrap(),
                    shadow.delivery(c).unwrap(),
                    "step {step}"
                );
                for u in 0..4 {
                    let u = format!("u{u}");
                    assert_eq!(
                        enforced.user_usage(&u, c).unwrap(),
                        shadow.user_usage(&u, c).unwrap(),
                        "step {step}"
                    );
                }
            }
        }
        // The stream met denials of both kinds, so the comparison had
        // something to compare.
        assert!(would > 20 && denied > 20, "{would} {denied}");
    }
}

/// Exclusion within a screen (docs/semantics.md §6.4): of candidates
/// sharing a label (their own or an ancestor's), the first eligible one is
/// held and the others are denied `exclusion:<label>`, holding nothing; a
/// candidate its caps deny takes no label; `max_per_screen` on a parent
/// bounds its children per screen; a shadow label answers `would_deny`.
#[test]
fn exclusion_labels_and_max_per_screen_within_a_screen() {
    let clock = Arc::new(ManualClock::new(T0));
    let e = memory_engine(clock);
    let put = |id: &str, json: &str| e.put_campaign(id, campaign(json)).unwrap();
    put(
        "autos",
        r#"{"exclusion_labels": ["auto"], "max_per_screen": 5}"#,
    );
    put("maker-a", r#"{"parent": "autos"}"#);
    put(
        "maker-b",
        r#"{"parent": "autos", "caps": [{"kind": "window", "limit": 1, "window": "1d"}]}"#,
    );
    put("bank", r#"{"exclusion_labels": ["finance", "x:y"]}"#);
    put("insurer", r#"{"exclusion_labels": ["finance"]}"#);
    put("shop", r#"{"max_per_screen": 2}"#);
    let denied = |r: &freqcap::engine::ScreenOutcome, i: usize| {
        let d = r.results[i].denied_by.as_ref();
        d.map(|d| (d.campaign.to_string(), d.cap.clone()))
    };
    let s = e
        .screen(&screen(
            Some("u"),
            &[
                "maker-b", "maker-a", "bank", "insurer", "shop", "shop", "shop",
            ],
            true,
        ))
        .unwrap();
    let eligible: Vec<bool> = s.results.iter().map(|r| r.eligible).collect();
    assert_eq!(eligible, [true, false, true, false, true, true, false]);
    assert_eq!(
        denied(&s, 1),
        Some(("autos".into(), "exclusion:auto".into()))
    );
    assert_eq!(
        denied(&s, 3),
        Some(("insurer".into(), "exclusion:finance".into()))
    );
    assert_eq!(
        denied(&s, 6),
        Some(("shop".into(), "max_per_screen".into()))
    );
    // The excluded hold nothing: committing one is a 400, and the
    // eligible commit as ever.
    let id = s.reservation.clone().unwrap();
    assert!(matches!(
        e.commit(&id, &commit("maker-a")),
        Err(EngineError::InvalidArgument { .. })
    ));
    e.commit(&id, &commit("maker-b")).unwrap();
    // maker-b is now capped for u: it takes no label, and maker-a is held.
    let s = e
        .screen(&screen(Some("u"), &["maker-b", "maker-a"], false))
        .unwrap();
    assert_eq!(denied(&s, 0), Some(("maker-b".into(), "window-0".into())));
    assert!(s.results[1].eligible, "{:?}", s.results[1]);
    // A shadow label: answered eligible, would_deny, holding nothing.
    put(
        "insurer",
        r#"{"exclusion_labels": ["finance"], "mode": "shadow"}"#,
    );
    let s = e
        .screen(&screen(Some("v"), &["bank", "insurer"], true))
        .unwrap();
    assert!(s.results[1].eligible);
    let w = s.results[1].would_deny.as_ref().unwrap();
    assert_eq!(w.cap, "exclusion:finance");
}
