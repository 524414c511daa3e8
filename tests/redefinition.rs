//! Edits keep what was counted (docs/semantics.md §5.3, issue 45): every
//! kind of change to a policy's or campaign's item, raised and lowered, on
//! the in-memory store and on RocksDB; deletions within the redefinition
//! grace; `reset`; the upgrade of a data directory an older build wrote.

use std::sync::Arc;

use freqcap::ManualClock;
use freqcap::engine::{
    CheckRequest, CheckTarget, CommitRequest, Engine, EngineError, EngineOptions, Event,
    ScreenCandidate, ScreenRequest,
};
use freqcap::model::{CampaignDef, PolicyDef, from_json};
use freqcap::store::{Durability, MemoryStore, RocksStore};

/// 2023-11-14T22:13:20Z: 22:13:20 UTC, so the day has 1 h 46 m 40 s left
/// and the hour 46 m 40 s.
const T0: u64 = 1_700_000_000_000_000_000;
const SEC: u64 = 1_000_000_000;
const MIN: u64 = 60 * SEC;
const HOUR: u64 = 60 * MIN;

type E = Engine<Arc<ManualClock>>;

fn memory(clock: &Arc<ManualClock>, opts: EngineOptions) -> E {
    Engine::open(Arc::new(MemoryStore::new()), clock.clone(), opts).unwrap()
}

fn rocks(dir: &std::path::Path, clock: &Arc<ManualClock>) -> E {
    let store = Arc::new(RocksStore::open(dir, Durability::Wal).unwrap());
    Engine::open(store, clock.clone(), EngineOptions::default()).unwrap()
}

fn campaign(json: &str) -> CampaignDef {
    from_json(json).unwrap_or_else(|e| panic!("{json}: {e}"))
}

fn policy(json: &str) -> PolicyDef {
    from_json(json).unwrap_or_else(|e| panic!("{json}: {e}"))
}

/// One impression of `camp` for `user` (an event, cost 1).
fn show(e: &E, user: &str, camp: &str) {
    e.events(&[Event {
        user: Some(user.to_owned()),
        ids: Vec::new(),
        campaign: camp.to_owned(),
        cost: 1,
        event_id: None,
        event_type: None,
    }])
    .unwrap();
}

/// Whether `camp` is eligible for `user` now (a dry-run screen).
fn eligible(e: &E, user: &str, camp: &str) -> bool {
    e.screen(&ScreenRequest {
        priority: Default::default(),
        user: Some(user.to_owned()),
        ids: Vec::new(),
        candidates: vec![ScreenCandidate {
            campaign: camp.to_owned(),
            cost: None,
        }],
        reserve: false,
        ttl_ms: None,
        reservation_id: None,
        fingerprint: None,
    })
    .unwrap()
    .results[0]
        .eligible
}

/// Screens and commits `camp` for `user` while it is eligible, at most
/// `max` times; returns how many were shown.
fn deliver(e: &E, user: &str, camp: &str, max: usize) -> usize {
    let mut shown = 0;
    for _ in 0..max {
        let s = e
            .screen(&ScreenRequest {
                priority: Default::default(),
                user: Some(user.to_owned()),
                ids: Vec::new(),
                candidates: vec![ScreenCandidate {
                    campaign: camp.to_owned(),
                    cost: None,
                }],
                reserve: true,
                ttl_ms: Some(1000),
                reservation_id: None,
                fingerprint: None,
            })
            .unwrap();
        let Some(id) = s.reservation else { break };
        let c = CommitRequest {
            campaigns: vec![camp.to_owned()],
            ..CommitRequest::default()
        };
        e.commit(&id, &c).unwrap();
        shown += 1;
    }
    shown
}

/// A check of `key` against policy `name` at cost 1.
fn check(e: &E, name: &str, key: &str) -> freqcap::engine::CheckOutcome {
    e.check(&CheckRequest {
        priority: Default::default(),
        target: CheckTarget::Policy(name.into()),
        key: key.into(),
        cost: 1,
        reserve: false,
        ttl_ms: None,
        reservation_id: None,
        fingerprint: None,
    })
    .unwrap()
}

/// Checks until denied (at most `max`); returns how many were allowed.
fn allowed(e: &E, name: &str, key: &str, max: usize) -> usize {
    (0..max)
        .take_while(|_| check(e, name, key).decision.allowed)
        .count()
}

/// The issue's repro: a budget of 10 spent 3, raised to 12, reads spent 3
/// and delivers 9 more (it read 0 and delivered 12 before).
#[test]
fn a_raised_budget_keeps_its_spend() {
    let clock = Arc::new(ManualClock::new(T0));
    for e in [
        memory(&clock, EngineOptions::default()),
        rocks(tempfile::tempdir().unwrap().path(), &clock),
    ] {
        let asap = |n: u64| {
            campaign(&format!(
                r#"{{"budget": {{"amount": {n}, "per": "1d", "pacing": "asap"}}}}"#
            ))
        };
        e.put_campaign("c1", asap(10)).unwrap();
        for u in ["a", "b", "c"] {
            show(&e, u, "c1");
        }
        assert_eq!(e.delivery("c1").unwrap().spent, 3);
        let warnings = e.put_campaign("c1", asap(12)).unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        let d = e.delivery("c1").unwrap();
        assert_eq!((d.spent, d.amount), (3, 12));
        let users: Vec<String> = (0..20).map(|i| format!("u{i}")).collect();
        let more: usize = users.iter().map(|u| deliver(&e, u, "c1", 1)).sum();
        assert_eq!(more, 9, "12 - 3 more fit, not 12");
        assert_eq!(e.delivery("c1").unwrap().spent, 12);
        // Lowered below what is spent: nothing more until the period ends.
        e.put_campaign("c1", asap(5)).unwrap();
        assert_eq!(e.delivery("c1").unwrap().spent, 12);
        assert_eq!(deliver(&e, "z", "c1", 3), 0);
    }
}

/// A user cap raised from 3 to 5 after 3 impressions reads used 3 and
/// shows 2 more; lowered from 5 to 2 after 3, it shows none.
#[test]
fn a_user_cap_raised_or_lowered_keeps_what_the_user_saw() {
    let clock = Arc::new(ManualClock::new(T0));
    let e = memory(&clock, EngineOptions::default());
    let cap = |n: u64| {
        campaign(&format!(
            r#"{{"caps": [{{"kind": "window", "limit": {n}, "window": "1d", "align": "calendar"}}]}}"#
        ))
    };
    e.put_campaign("c1", cap(3)).unwrap();
    assert_eq!(deliver(&e, "u1", "c1", 10), 3);
    e.put_campaign("c1", cap(5)).unwrap();
    let u = e.user_usage("u1", "c1").unwrap();
    assert_eq!((u[0].used, u[0].remaining, u[0].limit), (3, 2, 5));
    assert_eq!(deliver(&e, "u1", "c1", 10), 2);

    e.put_campaign("c2", cap(5)).unwrap();
    assert_eq!(deliver(&e, "u1", "c2", 3), 3);
    e.put_campaign("c2", cap(2)).unwrap();
    assert!(!eligible(&e, "u1", "c2"), "3 seen against a cap of 2");
    let u = e.user_usage("u1", "c2").unwrap();
    assert_eq!((u[0].used, u[0].remaining), (3, 0));
    // The next day the lowered cap is the cap.
    clock.set(T0 + 2 * HOUR);
    assert_eq!(deliver(&e, "u1", "c2", 10), 2);
}

/// A policy's window raised from 10 to 20 after 10 checks has 10 left
/// (it answered 19 before); lowered to 5, it denies until the window ends.
#[test]
fn a_policy_limit_raised_or_lowered_keeps_its_count() {
    let clock = Arc::new(ManualClock::new(T0));
    let e = memory(&clock, EngineOptions::default());
    let w = |n: u64| {
        policy(&format!(
            r#"{{"limits": [{{"kind": "window", "limit": {n}, "window": "1m", "align": "fixed"}}]}}"#
        ))
    };
    e.put_policy("api", w(10)).unwrap();
    assert_eq!(allowed(&e, "api", "k", 20), 10);
    e.put_policy("api", w(20)).unwrap();
    let peek = check(&e, "api", "k");
    assert_eq!(peek.decision.remaining, 9, "10 counted + this one of 20");
    assert_eq!(allowed(&e, "api", "k", 20), 9);
    e.put_policy("api", w(5)).unwrap();
    assert_eq!(allowed(&e, "api", "k", 5), 0);
    // T0 is at :20 of its minute: the next minute counts afresh.
    clock.set(T0 + 40 * SEC);
    assert_eq!(allowed(&e, "api", "k", 10), 5);
}

/// A fixed window's length raised: the count of the window in progress
/// carries into the new, longer window containing it. Lowered: when in the
/// old window the units were counted is not known, so they stay counted
/// until the old window would have ended, then minutes are minutes.
#[test]
fn a_window_length_change_carries_the_current_count() {
    let clock = Arc::new(ManualClock::new(T0));
    let e = memory(&clock, EngineOptions::default());
    let w = |len: &str| {
        policy(&format!(
            r#"{{"limits": [{{"name": "w", "kind": "window", "limit": 5, "window": "{len}", "align": "fixed"}}]}}"#
        ))
    };
    e.put_policy("p", w("1m")).unwrap();
    assert_eq!(allowed(&e, "p", "k", 3), 3);
    e.put_policy("p", w("1h")).unwrap();
    // 22:13:20: the hour [22:00, 23:00) holds the 3.
    let d = check(&e, "p", "k").decision;
    assert_eq!(d.remaining, 1);
    // An hour window now: 40 s later (a new minute) still counts them.
    clock.set(T0 + 40 * SEC);
    assert_eq!(allowed(&e, "p", "k", 5), 1);
    // Back to a minute: the 5 stay counted until 23:00.
    e.put_policy("p", w("1m")).unwrap();
    assert_eq!(allowed(&e, "p", "k", 5), 0);
    clock.set(T0 + 100 * SEC);
    assert_eq!(allowed(&e, "p", "k", 5), 0);
    clock.set(T0 + 46 * MIN + 40 * SEC - 1);
    assert_eq!(allowed(&e, "p", "k", 5), 0);
    clock.set(T0 + 46 * MIN + 40 * SEC);
    assert_eq!(allowed(&e, "p", "k", 10), 5);
    // A minute later, a new minute.
    clock.set(T0 + 47 * MIN + 40 * SEC);
    assert_eq!(allowed(&e, "p", "k", 10), 5);
}

/// A calendar window's time zone or alignment changed: the count stays in
/// the window it was counted in, widened to the new definition's window
/// containing that window's start.
#[test]
fn a_calendar_window_keeps_its_count_across_tz_and_alignment() {
    let clock = Arc::new(ManualClock::new(T0));
    let e = memory(&clock, EngineOptions::default());
    let day = |extra: &str| {
        campaign(&format!(
            r#"{{"caps": [{{"name": "daily", "kind": "window", "limit": 4, "window": "1d"{extra}}}]}}"#
        ))
    };
    e.put_campaign("c", day(r#", "align": "calendar""#))
        .unwrap();
    assert_eq!(deliver(&e, "u", "c", 3), 3);
    e.put_campaign(
        "c",
        day(r#", "align": "calendar", "tz": "America/New_York""#),
    )
    .unwrap();
    let u = e.user_usage("u", "c").unwrap();
    assert_eq!((u[0].used, u[0].remaining), (3, 1));
    // The UTC day began on New York's previous day, which ended before it:
    // the count stays until the UTC day's end, 1 h 46 m 40 s away.
    assert_eq!(u[0].reset_after, u128::from(HOUR + 46 * MIN + 40 * SEC));
    e.put_campaign("c", day(r#", "align": "fixed""#)).unwrap();
    let u = e.user_usage("u", "c").unwrap();
    assert_eq!((u[0].used, u[0].remaining), (3, 1));
    assert_eq!(deliver(&e, "u", "c", 3), 1);
}

/// A budget's period changed: the spend of the period in progress carries
/// into the new period containing its start; a shorter period keeps it
/// until the old one would have ended.
#[test]
fn a_budget_period_change_carries_its_spend() {
    let clock = Arc::new(ManualClock::new(T0));
    let e = memory(&clock, EngineOptions::default());
    let b = |per: &str, amount: u64| {
        campaign(&format!(
            r#"{{"budget": {{"amount": {amount}, "per": "{per}", "pacing": "asap"}}}}"#
        ))
    };
    e.put_campaign("c", b("1d", 10)).unwrap();
    assert_eq!(deliver(&e, "u", "c", 4), 4);
    e.put_campaign("c", b("1w", 70)).unwrap();
    let d = e.delivery("c").unwrap();
    assert_eq!(d.spent, 4);
    // 2023-11-14 is a Tuesday: the week began Monday 13th at 00:00 UTC.
    assert_eq!(d.period_end - d.period_start, 7 * 24 * HOUR);
    assert!(d.period_start <= T0 && T0 < d.period_end);
    // One more under the week: the record now holds the week.
    assert_eq!(deliver(&e, "v", "c", 1), 1);
    e.put_campaign("c", b("1h", 6)).unwrap();
    let d = e.delivery("c").unwrap();
    assert_eq!((d.spent, d.period_end - d.period_start), (5, 7 * 24 * HOUR));
    assert_eq!(deliver(&e, "u", "c", 5), 1);
    // Monday 20th: hours are hours.
    clock.set(T0 + 5 * 24 * HOUR + 2 * HOUR);
    let d = e.delivery("c").unwrap();
    assert_eq!((d.spent, d.period_end - d.period_start), (0, HOUR));
    assert_eq!(deliver(&e, "u", "c", 10), 6);
}

/// A rate's parameters changed: its theoretical arrival time is kept, as
/// redis-cell keeps it.
#[test]
fn a_rate_change_keeps_its_arrival_time() {
    let clock = Arc::new(ManualClock::new(T0));
    let e = memory(&clock, EngineOptions::default());
    let r = |rate: u64, burst: u64| {
        policy(&format!(
            r#"{{"limits": [{{"kind": "rate", "rate": {rate}, "per": "1m", "burst": {burst}}}]}}"#
        ))
    };
    e.put_policy("p", r(1, 3)).unwrap();
    assert_eq!(allowed(&e, "p", "k", 10), 3);
    // A larger burst over the same arrival time: 2 more, not 5.
    e.put_policy("p", r(1, 5)).unwrap();
    assert_eq!(allowed(&e, "p", "k", 10), 2);
    // A faster rate: the arrival time (5 min ahead) is where it was; one
    // more a minute at 1/min, still none now at the burst of 5.
    e.put_policy("p", r(60, 5)).unwrap();
    assert_eq!(allowed(&e, "p", "k", 10), 0);
}

/// An exact rolling window's length changed: its debits are kept.
#[test]
fn a_rolling_window_keeps_its_debits() {
    let clock = Arc::new(ManualClock::new(T0));
    let e = memory(&clock, EngineOptions::default());
    let w = |len: &str| {
        policy(&format!(
            r#"{{"limits": [{{"kind": "window", "limit": 4, "window": "{len}"}}]}}"#
        ))
    };
    e.put_policy("p", w("1m")).unwrap();
    assert_eq!(allowed(&e, "p", "k", 2), 2);
    clock.set(T0 + 50 * SEC);
    assert_eq!(allowed(&e, "p", "k", 1), 1);
    e.put_policy("p", w("10m")).unwrap();
    assert_eq!(allowed(&e, "p", "k", 10), 1, "3 of 4 counted");
    e.put_policy("p", w("30s")).unwrap();
    // Only the debit at +50 s is within 30 s: 3 more fit, minus the one
    // just taken at +50 s too.
    assert_eq!(allowed(&e, "p", "k", 10), 2);
}

/// A change of kind, or of a window's algorithm, starts the item empty,
/// and the answer's warnings say so; an unchanged class warns nothing.
#[test]
fn a_kind_change_starts_empty_with_a_warning() {
    let clock = Arc::new(ManualClock::new(T0));
    let e = memory(&clock, EngineOptions::default());
    e.put_policy(
        "p",
        policy(r#"{"limits": [{"name": "a", "kind": "window", "limit": 2, "window": "1h", "align": "fixed"}]}"#),
    )
    .unwrap();
    assert_eq!(allowed(&e, "p", "k", 5), 2);
    let w = e
        .put_policy(
            "p",
            policy(r#"{"limits": [{"name": "a", "kind": "rate", "rate": 2, "per": "1h"}]}"#),
        )
        .unwrap();
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(w[0].field, "limits[0]");
    assert!(w[0].message.contains("start empty"), "{}", w[0].message);
    assert_eq!(allowed(&e, "p", "k", 5), 2, "the rate starts empty");
    let w = e
        .put_policy(
            "p",
            policy(r#"{"limits": [{"name": "a", "kind": "window", "limit": 2, "window": "1h", "precision": "approximate"}]}"#),
        )
        .unwrap();
    assert_eq!(w.len(), 1, "{w:?}");
    let w = e
        .put_policy(
            "p",
            policy(r#"{"limits": [{"name": "a", "kind": "window", "limit": 2, "window": "2h", "precision": "approximate"}]}"#),
        )
        .unwrap();
    assert_eq!(
        w.len(),
        1,
        "an approximate window's length is its class: {w:?}"
    );
    let w = e
        .put_policy(
            "p",
            policy(r#"{"limits": [{"name": "a", "kind": "window", "limit": 3, "window": "2h", "precision": "approximate"}]}"#),
        )
        .unwrap();
    assert!(w.is_empty(), "{w:?}");
}

/// Adding, removing or reordering other items moves no one's counter.
#[test]
fn other_items_do_not_move_a_counter() {
    let clock = Arc::new(ManualClock::new(T0));
    let e = memory(&clock, EngineOptions::default());
    e.put_campaign(
        "c",
        campaign(r#"{"caps": [{"name": "day", "kind": "window", "limit": 5, "window": "1d", "align": "calendar"}],
                     "budget": {"amount": 100, "pacing": "asap"}, "max_in_flight": 50}"#),
    )
    .unwrap();
    assert_eq!(deliver(&e, "u", "c", 2), 2);
    e.put_campaign(
        "c",
        campaign(r#"{"caps": [{"name": "hour", "kind": "window", "limit": 4, "window": "1h", "align": "fixed"},
                              {"name": "day", "kind": "window", "limit": 5, "window": "1d", "align": "calendar"}],
                     "budget": {"amount": 100, "pacing": "asap"}}"#),
    )
    .unwrap();
    let u = e.user_usage("u", "c").unwrap();
    let day = u.iter().find(|c| c.name == "day").unwrap();
    let hour = u.iter().find(|c| c.name == "hour").unwrap();
    assert_eq!((day.used, hour.used), (2, 0), "the new cap starts empty");
    assert_eq!(e.delivery("c").unwrap().spent, 2, "the budget moved index");
    assert_eq!(deliver(&e, "u", "c", 10), 3);
}

/// An open reservation across an edit of the limit is committed into the
/// same counter, once.
#[test]
fn a_reservation_open_across_an_edit_settles_into_the_counter() {
    let clock = Arc::new(ManualClock::new(T0));
    let e = memory(&clock, EngineOptions::default());
    let b = |n: u64| {
        campaign(&format!(
            r#"{{"budget": {{"amount": {n}, "pacing": "asap"}}, "max_in_flight": {n}}}"#
        ))
    };
    e.put_campaign("c", b(10)).unwrap();
    let s = e
        .screen(&ScreenRequest {
            priority: Default::default(),
            user: Some("u".into()),
            ids: Vec::new(),
            candidates: vec![ScreenCandidate {
                campaign: "c".into(),
                cost: Some(4),
            }],
            reserve: true,
            ttl_ms: Some(10_000),
            reservation_id: None,
            fingerprint: None,
        })
        .unwrap();
    let id = s.reservation.unwrap();
    e.put_campaign("c", b(20)).unwrap();
    let d = e.delivery("c").unwrap();
    assert_eq!((d.spent, d.pending, d.amount), (0, 4, 20));
    let c = CommitRequest {
        campaigns: vec!["c".into()],
        ..CommitRequest::default()
    };
    e.commit(&id, &c).unwrap();
    let d = e.delivery("c").unwrap();
    assert_eq!((d.spent, d.pending), (4, 0));
}

/// Deleted and re-created within the grace: an edit. After it, or with
/// `reset`, a fresh start.
#[test]
fn delete_and_recreate_within_the_grace_is_an_edit() {
    let clock = Arc::new(ManualClock::new(T0));
    let opts = EngineOptions {
        redefine_grace: HOUR,
        ..EngineOptions::default()
    };
    let e = memory(&clock, opts);
    let def = || {
        campaign(
            r#"{"budget": {"amount": 10, "pacing": "asap"}, "caps": [{"kind": "window", "limit": 3, "window": "1d", "align": "calendar"}]}"#,
        )
    };
    e.put_campaign("c", def()).unwrap();
    assert_eq!(deliver(&e, "u", "c", 2), 2);
    e.delete_campaign("c").unwrap();
    assert!(matches!(e.delivery("c"), Err(EngineError::NotFound(_))));
    clock.set(T0 + 10 * MIN);
    e.put_campaign("c", def()).unwrap();
    assert_eq!(e.delivery("c").unwrap().spent, 2);
    assert_eq!(e.user_usage("u", "c").unwrap()[0].used, 2);
    // Past the grace: a fresh start.
    e.delete_campaign("c").unwrap();
    clock.set(T0 + 10 * MIN + HOUR);
    e.put_campaign("c", def()).unwrap();
    assert_eq!(e.delivery("c").unwrap().spent, 0);
    assert_eq!(e.user_usage("u", "c").unwrap()[0].used, 0);
    assert_eq!(deliver(&e, "u", "c", 1), 1);
    // Reset on purpose.
    e.put_campaign_as("c", def(), true).unwrap();
    assert_eq!(e.delivery("c").unwrap().spent, 0);
    assert_eq!(e.user_usage("u", "c").unwrap()[0].used, 0);

    let p = || {
        policy(r#"{"limits": [{"kind": "window", "limit": 3, "window": "1h", "align": "fixed"}]}"#)
    };
    e.put_policy("p", p()).unwrap();
    assert_eq!(allowed(&e, "p", "k", 2), 2);
    e.delete_policy("p").unwrap();
    e.put_policy("p", p()).unwrap();
    assert_eq!(allowed(&e, "p", "k", 5), 1, "re-created within the grace");
    e.put_policy_as("p", p(), true).unwrap();
    assert_eq!(allowed(&e, "p", "k", 5), 3, "reset");
}

/// With a grace of 0, a deletion is final.
#[test]
fn a_zero_grace_makes_deletions_final() {
    let clock = Arc::new(ManualClock::new(T0));
    let opts = EngineOptions {
        redefine_grace: 0,
        ..EngineOptions::default()
    };
    let e = memory(&clock, opts);
    let def = || campaign(r#"{"budget": {"amount": 10, "pacing": "asap"}}"#);
    e.put_campaign("c", def()).unwrap();
    assert_eq!(deliver(&e, "u", "c", 2), 2);
    e.delete_campaign("c").unwrap();
    e.put_campaign("c", def()).unwrap();
    assert_eq!(e.delivery("c").unwrap().spent, 0);
}

/// On RocksDB, the kept counts and a deletion within the grace survive a
/// restart.
#[test]
fn edits_and_deletions_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let def = |n: u64| {
        campaign(&format!(
            r#"{{"budget": {{"amount": {n}, "pacing": "asap"}}, "caps": [{{"kind": "window", "limit": {n}, "window": "1d", "align": "calendar"}}]}}"#
        ))
    };
    {
        let e = rocks(dir.path(), &clock);
        e.put_campaign("c", def(5)).unwrap();
        assert_eq!(deliver(&e, "u", "c", 3), 3);
        e.put_campaign("c", def(6)).unwrap();
        e.delete_campaign("c").unwrap();
    }
    let e = rocks(dir.path(), &clock);
    assert!(e.get_campaign("c").is_none());
    e.put_campaign("c", def(7)).unwrap();
    assert_eq!(e.delivery("c").unwrap().spent, 3);
    assert_eq!(e.user_usage("u", "c").unwrap()[0].used, 3);
    assert_eq!(deliver(&e, "u", "c", 10), 4);
}

/// Two items whose names hash alike are refused naming the item (found by
/// search: FNV-1a of "window/count\0" + name).
#[test]
fn names_whose_counters_would_collide_are_refused() {
    use freqcap::limits::fnv1a;
    let tag = |n: &str| fnv1a(b"window/count\0".iter().copied().chain(n.bytes()));
    // A pair of names with the same tag, found by a bounded search.
    let mut seen = std::collections::HashMap::new();
    let mut pair = None;
    // FNV-1a of names that differ in a few trailing digits collides later
    // than random tags would: the first pair here is n439599 / n622382.
    for i in 0u32..2_000_000 {
        let n = format!("n{i}");
        if let Some(other) = seen.insert(tag(&n), n.clone()) {
            pair = Some((other, n));
            break;
        }
    }
    let Some((a, b)) = pair else {
        panic!("no colliding pair found");
    };
    let p = policy(&format!(
        r#"{{"limits": [{{"name": "{a}", "kind": "window", "limit": 2, "window": "1h", "align": "fixed"}},
                        {{"name": "{b}", "kind": "window", "limit": 1, "window": "1h", "align": "fixed"}}]}}"#
    ));
    let err = p.compile().unwrap_err();
    assert_eq!(err.field, "limits[1].name");
}

/// 2026-01-15T12:00:00Z, when `tests/data/datadir-wave3` was written.
const FIXTURE_AT: u64 = 1_768_478_400_000_000_000;

/// Copies a directory's files (no subdirectories) into a new one.
fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for f in std::fs::read_dir(from).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), to.join(f.file_name())).unwrap();
    }
}

/// A data directory the previous release wrote (tests/data/datadir-wave3:
/// c1 spent 2 of 10, u1 saw it twice of 3, policy key `k` checked 4 times
/// of 10) keeps every count when this build opens it, and keeps it again
/// through an edit and a restart.
#[test]
fn a_data_dir_of_the_previous_release_keeps_its_counts() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    copy_dir(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/datadir-wave3"),
        &dir,
    );
    let clock = Arc::new(ManualClock::new(FIXTURE_AT + 30 * MIN));
    {
        let e = rocks(&dir, &clock);
        let d = e.delivery("c1").unwrap();
        assert_eq!((d.spent, d.amount), (2, 10));
        let u = e.user_usage("u1", "c1").unwrap();
        assert_eq!((u[0].name.as_str(), u[0].used), ("daily", 2));
        let c = check(&e, "api", "k");
        assert_eq!(
            c.decision.items[0].remaining, 5,
            "4 counted, then this one of 10"
        );
        // An edit after the upgrade keeps them too.
        e.put_campaign(
            "c1",
            campaign(r#"{"budget": {"amount": 12, "per": "1d", "pacing": "asap"}, "caps": [{"name": "daily", "kind": "window", "limit": 4, "window": "1d", "align": "calendar"}]}"#),
        )
        .unwrap();
        assert_eq!(e.delivery("c1").unwrap().spent, 2);
        assert_eq!(deliver(&e, "u1", "c1", 5), 2);
    }
    let e = rocks(&dir, &clock);
    assert_eq!(e.delivery("c1").unwrap().spent, 4);
    assert_eq!(e.user_usage("u1", "c1").unwrap()[0].used, 4);
    assert_eq!(check(&e, "api", "k").decision.items[0].remaining, 4);
}
