//! Flights (docs/semantics.md §6.7; issue 48 item 1): a campaign delivers
//! only in `[start, end)` of its flight and its ancestors', on one node and
//! on two nodes of one shared store alike; bad flights are refused naming
//! the field, and an edit keeps what was counted.

mod support;

use std::sync::Arc;

use freqcap::ManualClock;
use freqcap::engine::{Engine, EngineError, EngineOptions};
use freqcap::model::{CampaignDef, from_json};
use freqcap::store::SharedMemory;
use support::engines::{Denial, Node, campaign_def, commit, denials, memory_node, screen};

const SEC: u64 = 1_000_000_000;
const HOUR: u64 = 3_600 * SEC;
/// 2023-11-15T00:00:00Z.
const NOV15: u64 = 1_700_006_400 * SEC;

/// `adv` flies 2023-11-15 00:00 to 23:00 UTC (its end written at +01:00);
/// `c1` under it flies from 12:00 UTC to 2023-11-20, capped at 2 per user a
/// day; `c2` under it has no flight of its own.
fn define(e: &Node) {
    e.put_campaign(
        "adv",
        campaign_def(
            r#"{"flight": {"start": "2023-11-15T00:00:00Z", "end": "2023-11-16T00:00:00+01:00"}}"#,
        ),
    )
    .expect("adv");
    e.put_campaign(
        "c1",
        campaign_def(
            r#"{"parent": "adv",
                "flight": {"start": "2023-11-15T12:00:00Z", "end": "2023-11-20T00:00:00Z"},
                "caps": [{"kind": "window", "limit": 2, "window": "1d", "align": "calendar"}]}"#,
        ),
    )
    .expect("c1");
    e.put_campaign(
        "c2",
        campaign_def(
            r#"{"parent": "adv", "caps": [{"kind": "window", "limit": 2, "window": "1d"}]}"#,
        ),
    )
    .expect("c2");
}

fn denied(campaign: &str, retry: Option<u64>) -> Denial {
    Some((campaign.into(), "flight".into(), retry.map(u128::from)))
}

#[test]
fn a_candidate_is_eligible_only_inside_every_flight_of_its_chain() {
    let (e, clock) = memory_node(NOV15 - 2 * HOUR);
    define(&e);
    // Before both flights: the nearest flight of the chain names the
    // denial, with the time to its start.
    let s = e.screen(&screen("u", &["c1", "c2"])).expect("screens");
    assert_eq!(
        denials(&s),
        [denied("c1", Some(14 * HOUR)), denied("adv", Some(2 * HOUR))]
    );
    assert!(s.reservation.is_none(), "nothing held outside a flight");
    // Inside adv's flight, before c1's.
    clock.set(NOV15 + 6 * HOUR);
    let s = e.screen(&screen("u", &["c1", "c2"])).expect("screens");
    assert_eq!(denials(&s), [denied("c1", Some(6 * HOUR)), None]);
    // From c1's start, both deliver, and the caps count as ever.
    clock.set(NOV15 + 12 * HOUR);
    for _ in 0..3 {
        let s = e.screen(&screen("u", &["c1"])).expect("screens");
        if let Some(id) = s.reservation {
            e.commit(&id, &commit("c1")).expect("commits");
        }
    }
    assert_eq!(e.user_usage("u", "c1").expect("usage")[0].used, 2);
    // A reservation made just before adv's end commits after it.
    clock.set(NOV15 + 23 * HOUR - SEC / 2);
    let s = e.screen(&screen("v", &["c1", "c2"])).expect("screens");
    assert_eq!(denials(&s), [None, None]);
    clock.set(NOV15 + 23 * HOUR);
    // adv's end (2023-11-16T00:00:00+01:00) ends both: no retry.
    let after = e.screen(&screen("w", &["c1", "c2"])).expect("screens");
    assert_eq!(denials(&after), [denied("adv", None), denied("adv", None)]);
    let id = s.reservation.expect("reserved in the flight");
    e.commit(&id, &commit("c2"))
        .expect("a reservation made in the flight commits after it");
    assert_eq!(e.user_usage("v", "c2").expect("usage")[0].used, 1);
    assert_eq!(e.user_usage("w", "c2").expect("usage")[0].used, 0);
}

#[test]
fn bad_flights_are_refused_naming_the_field_and_change_nothing() {
    let (e, _) = memory_node(NOV15);
    let good = r#"{"flight": {"start": "2023-11-15T00:00:00Z", "end": "2023-11-16T00:00:00Z"}}"#;
    e.put_campaign("c", campaign_def(good))
        .expect("a good flight");
    let cases = [
        (
            r#"{"start": "2023-11-16T00:00:00Z", "end": "2023-11-15T00:00:00Z"}"#,
            "flight.end",
            "after flight.start",
        ),
        (
            r#"{"start": "2023-11-15T00:00:00Z", "end": "2023-11-15T00:00:00Z"}"#,
            "flight.end",
            "after flight.start",
        ),
        (
            r#"{"start": "2023-11-15T00:00:00", "end": "2023-11-16T00:00:00Z"}"#,
            "flight.start",
            "offset",
        ),
        (
            r#"{"start": "2023-11-15T00:00:00Z", "end": "2023-02-30T00:00:00Z"}"#,
            "flight.end",
            "RFC 3339",
        ),
        (
            r#"{"start": "1969-12-31T00:00:00Z", "end": "2023-11-16T00:00:00Z"}"#,
            "flight.start",
            "1970",
        ),
    ];
    for (flight, field, part) in cases {
        let def = campaign_def(&format!(r#"{{"flight": {flight}}}"#));
        match e.put_campaign("c", def) {
            Err(EngineError::InvalidArgument { field: f, message }) => {
                assert_eq!(f, field, "{flight}: {message}");
                assert!(message.contains(part), "{flight}: {message}");
            }
            other => panic!("{flight}: accepted or another error: {other:?}"),
        }
    }
    // Fields a flight does not have are refused at parsing, naming it.
    for bad in [
        r#"{"flight": {"start": "2023-11-15T00:00:00Z", "end": "2023-11-16T00:00:00Z", "tz": "UTC"}}"#,
        r#"{"flight": {"start": "2023-11-15T00:00:00Z"}}"#,
        r#"{"flight": "2023-11-15"}"#,
    ] {
        let err = from_json::<CampaignDef>(bad).expect_err(bad);
        assert!(err.field.starts_with("flight"), "{bad}: {err}");
    }
    // Each refusal left the definition as it was.
    let kept = e.get_campaign("c").expect("still defined");
    assert_eq!(kept, campaign_def(good));
}

#[test]
fn moving_a_flight_keeps_what_was_counted() {
    let (e, clock) = memory_node(NOV15 + HOUR);
    define(&e);
    clock.set(NOV15 + 13 * HOUR);
    let s = e.screen(&screen("u", &["c1"])).expect("screens");
    e.commit(&s.reservation.expect("eligible"), &commit("c1"))
        .expect("commits");
    // The flight ends earlier: out of it now, the count kept.
    e.put_campaign(
        "c1",
        campaign_def(
            r#"{"parent": "adv",
                "flight": {"start": "2023-11-15T12:00:00Z", "end": "2023-11-15T12:30:00Z"},
                "caps": [{"kind": "window", "limit": 2, "window": "1d", "align": "calendar"}]}"#,
        ),
    )
    .expect("edits");
    let s = e.screen(&screen("u", &["c1"])).expect("screens");
    assert_eq!(denials(&s), [denied("c1", None)]);
    // Back in flight: one of the day's two is left.
    define(&e);
    let s = e.screen(&screen("u", &["c1"])).expect("screens");
    assert_eq!(denials(&s), [None]);
    assert_eq!(e.user_usage("u", "c1").expect("usage")[0].used, 1);
}

#[test]
fn shadow_mode_answers_would_deny_outside_a_flight() {
    let (e, _) = memory_node(NOV15 - HOUR);
    e.put_campaign(
        "s",
        campaign_def(
            r#"{"mode": "shadow",
                "flight": {"start": "2023-11-15T00:00:00Z", "end": "2023-11-16T00:00:00Z"}}"#,
        ),
    )
    .expect("defines");
    let s = e.screen(&screen("u", &["s"])).expect("screens");
    let r = &s.results[0];
    assert!(r.eligible);
    let w = r.would_deny.as_ref().expect("would deny");
    assert_eq!((&*w.campaign, w.cap.as_str()), ("s", "flight"));
}

/// Two nodes on one shared store answer every instant alike (a fleet
/// answers as one node, docs/semantics.md).
#[test]
fn two_nodes_of_a_fleet_answer_a_flight_alike() {
    let store = Arc::new(SharedMemory::new());
    let clock = Arc::new(ManualClock::new(NOV15 - HOUR));
    let a = Engine::open(store.clone(), clock.clone(), EngineOptions::default()).expect("a");
    let b = Engine::open(store.clone(), clock.clone(), EngineOptions::default()).expect("b");
    define(&a);
    assert!(b.refresh_definitions().expect("b reads a's definitions"));
    for at in [
        NOV15 - HOUR,
        NOV15,
        NOV15 + 12 * HOUR,
        NOV15 + 23 * HOUR - 1,
        NOV15 + 23 * HOUR,
    ] {
        clock.set(at);
        let on_a = a.screen(&screen("u", &["c1", "c2"])).expect("a screens");
        let on_b = b.screen(&screen("u", &["c1", "c2"])).expect("b screens");
        assert_eq!(denials(&on_a), denials(&on_b), "at {at}");
        for (s, n) in [(on_a, &a), (on_b, &b)] {
            if let Some(id) = s.reservation {
                n.release(&id).expect("releases");
            }
        }
    }
}

/// A budget of 1 000 over a ten-day flight from 2023-11-15, paced `even`
/// with no tolerance.
fn flight_budget(e: &Node, end: &str) {
    e.put_campaign(
        "b",
        campaign_def(&format!(
            r#"{{"flight": {{"start": "2023-11-15T00:00:00Z", "end": "{end}"}},
                "budget": {{"amount": 1000, "per": "flight", "pacing": "even", "tolerance": 0}}}}"#
        )),
    )
    .expect("a budget per flight");
}

/// Spends `cost` on `b` now, through a screen and its commit.
fn spend(e: &Node, user: &str, cost: u64) {
    let mut req = screen(user, &["b"]);
    req.candidates[0].cost = Some(cost);
    let s = e.screen(&req).expect("screens");
    assert_eq!(denials(&s), [None], "{cost} fits");
    e.commit(&s.reservation.expect("reserved"), &commit("b"))
        .expect("commits");
}

#[test]
fn a_budget_per_flight_paces_day_by_day_and_catches_up_at_most_twice_the_even_share() {
    let (e, clock) = memory_node(NOV15);
    flight_budget(&e, "2023-11-25T00:00:00Z");
    let day = 24 * HOUR;
    let d = e.delivery("b").expect("delivery");
    assert_eq!(
        (d.period_start, d.period_end, d.amount),
        (NOV15, NOV15 + 10 * day, 1000),
        "one period: the flight"
    );
    // Half of day 0: half of the even share, 100 a day.
    clock.set(NOV15 + 12 * HOUR);
    assert_eq!(e.delivery("b").expect("delivery").cap_now, 50);
    spend(&e, "u1", 20);
    // Day 1 re-plans what is left (980) over the 9 days left: 108.9 a day.
    clock.set(NOV15 + day + 12 * HOUR);
    let d = e.delivery("b").expect("delivery");
    assert_eq!((d.spent, d.cap_now), (20, 20 + 55));
    // Nothing more until day 8: 980 over 2 days would be 490 a day, but a
    // day catches up at most twice the even share, 200.
    clock.set(NOV15 + 8 * day + 12 * HOUR);
    assert_eq!(e.delivery("b").expect("delivery").cap_now, 20 + 100);
    spend(&e, "u2", 100);
    let mut over = screen("u3", &["b"]);
    over.candidates[0].cost = Some(1);
    let s = e.screen(&over).expect("screens");
    let by = s.results[0]
        .denied_by
        .as_ref()
        .expect("over the day's line");
    assert_eq!(by.cap, "budget");
    assert!(by.retry_after.is_some_and(|r| r > 0), "{by:?}");
    // After the flight, what it delivered stays readable.
    clock.set(NOV15 + 10 * day + HOUR);
    let d = e.delivery("b").expect("delivery");
    assert_eq!(
        (d.spent, d.period_start, d.period_end),
        (120, NOV15, NOV15 + 10 * day)
    );
    // Moving the end re-plans without forgetting what was spent (§5.3).
    flight_budget(&e, "2023-11-30T00:00:00Z");
    let d = e.delivery("b").expect("delivery");
    assert_eq!((d.spent, d.period_end), (120, NOV15 + 15 * day));
    assert!(d.cap_now > 120 && d.cap_now <= 120 + 200, "{d:?}");
}

#[test]
fn a_budget_per_flight_is_refused_without_a_flight_or_with_what_it_cannot_pace() {
    let (e, _) = memory_node(NOV15);
    let cases = [
        (
            r#"{"budget": {"amount": 10, "per": "flight"}}"#,
            "budget.per",
            "add a `flight`",
        ),
        (
            r#"{"flight": {"start": "2023-01-01T00:00:00Z", "end": "2023-06-01T00:00:00Z"},
                "budget": {"amount": 10, "per": "flight"}}"#,
            "budget.per",
            "at most 92 days",
        ),
        (
            r#"{"flight": {"start": "2023-11-15T00:00:00Z", "end": "2023-11-25T00:00:00Z"},
                "budget": {"amount": 10, "per": "flight", "pacing": "throttle"}}"#,
            "budget.pacing",
            "throttle",
        ),
    ];
    for (json, field, part) in cases {
        match e.put_campaign("c", campaign_def(json)) {
            Err(EngineError::InvalidArgument { field: f, message }) => {
                assert_eq!(f, field, "{json}: {message}");
                assert!(message.contains(part), "{json}: {message}");
            }
            other => panic!("{json}: accepted or another error: {other:?}"),
        }
    }
    // A policy has no flight: "flight" is not a period of its budgets.
    let err = from_json::<freqcap::model::PolicyDef>(
        r#"{"limits": [{"kind": "budget", "amount": 10, "per": "flight"}]}"#,
    )
    .expect_err("no flight in a policy");
    assert!(err.field.contains("per"), "{err}");
    // The definition reads back as written.
    let json = r#"{"flight": {"start": "2023-11-15T00:00:00Z", "end": "2023-11-25T00:00:00Z"},
                   "budget": {"amount": 10, "per": "flight"}}"#;
    e.put_campaign("c", campaign_def(json)).expect("defines");
    let back = serde_json::to_value(e.get_campaign("c").expect("defined")).expect("json");
    assert_eq!(back["budget"]["per"], "flight", "{back}");
    assert_eq!(back["budget"]["kind"], "budget", "{back}");
}

/// Two nodes of a fleet spend one budget per flight: together they never
/// pass its day's line (the fleet's plan), and both read the same period.
#[test]
fn two_nodes_of_a_fleet_hold_a_budget_per_flight_to_its_line() {
    let store = Arc::new(SharedMemory::new());
    let clock = Arc::new(ManualClock::new(NOV15));
    let a = Engine::open(store.clone(), clock.clone(), EngineOptions::default()).expect("a");
    let b = Engine::open(store.clone(), clock.clone(), EngineOptions::default()).expect("b");
    flight_budget(&a, "2023-11-25T00:00:00Z");
    assert!(b.refresh_definitions().expect("b reads a's definitions"));
    // Half of day 0: a line of 50. Each node spends what it is allowed, 5
    // at a time, taking turns.
    clock.set(NOV15 + 12 * HOUR);
    let mut admitted = 0;
    for i in 0..40 {
        let n = if i % 2 == 0 { &a } else { &b };
        let mut req = screen(&format!("u{i}"), &["b"]);
        req.candidates[0].cost = Some(5);
        let s = n.screen(&req).expect("screens");
        if let Some(id) = s.reservation {
            n.commit(&id, &commit("b")).expect("commits");
            admitted += 5;
        }
    }
    assert!(admitted <= 50, "{admitted} admitted against a line of 50");
    assert!(admitted >= 40, "{admitted} admitted against a line of 50");
    for n in [&a, &b] {
        let d = n.delivery("b").expect("delivery");
        assert_eq!((d.period_start, d.period_end), (NOV15, NOV15 + 240 * HOUR));
    }
}

/// `"goal": "impressions"` (issue 48 item 1): a budget that counts commits,
/// 1 each, whatever their cost, and whose final cost at commit does not
/// change what was counted.
#[test]
fn a_goal_in_impressions_counts_commits_not_their_cost() {
    let (e, _) = memory_node(NOV15 + HOUR);
    e.put_campaign(
        "b",
        campaign_def(
            r#"{"flight": {"start": "2023-11-15T00:00:00Z", "end": "2023-11-25T00:00:00Z"},
                "budget": {"amount": 3, "per": "flight", "pacing": "asap", "goal": "impressions"}}"#,
        ),
    )
    .expect("a goal in impressions");
    for (i, cost) in [500, 1, 9_000].into_iter().enumerate() {
        let mut req = screen(&format!("u{i}"), &["b"]);
        req.candidates[0].cost = Some(cost);
        let s = e.screen(&req).expect("screens");
        assert_eq!(denials(&s), [None], "commit {i} of cost {cost}");
        let mut c = commit("b");
        c.cost = Some(cost * 2);
        e.commit(&s.reservation.expect("reserved"), &c)
            .expect("commits");
    }
    let d = e.delivery("b").expect("delivery");
    assert_eq!((d.amount, d.spent), (3, 3));
    let s = e.screen(&screen("u9", &["b"])).expect("screens");
    assert_eq!(
        s.results[0].denied_by.as_ref().map(|d| d.cap.as_str()),
        Some("budget")
    );
    // Anything but "spend" or "impressions" is refused, naming the field.
    let err = from_json::<CampaignDef>(r#"{"budget": {"amount": 3, "goal": "clicks"}}"#)
        .expect_err("an unknown goal");
    assert!(err.field.contains("goal"), "{err}");
}

/// The same flight, schedule and budget per flight on every place a record
/// can live (one node on memory or RocksDB; two nodes of a shared store in
/// shared and in owner mode, `support::engines`): a fleet answers what one
/// node answers.
#[test]
fn flights_schedules_and_flight_budgets_answer_alike_on_every_placement() {
    use support::engines::{Fleet, KINDS, T0};
    let mut answers = Vec::new();
    for kind in KINDS {
        let f = Fleet::new(kind);
        // T0 is 2023-11-14T22:13:20Z, a Tuesday.
        f.campaign(
            "fl",
            r#"{"flight": {"start": "2023-11-15T00:00:00Z", "end": "2023-11-17T00:00:00Z"},
                "budget": {"amount": 100, "per": "flight", "pacing": "asap"}}"#,
        );
        f.campaign(
            "sc",
            r#"{"schedule": {"hours": [{"days": ["wed"], "from": "00:00", "until": "12:00"}]}}"#,
        );
        let mut seen = Vec::new();
        // The same instants on every kind (owner mode's joining moved its
        // clock a few seconds already).
        for (i, at) in [10 * SEC, 2 * HOUR, 15 * HOUR].into_iter().enumerate() {
            use freqcap::Clock;
            f.advance((T0 + at).saturating_sub(f.clock.now()));
            let user = format!("u{i}");
            let n = f.node(&user);
            let s = n.screen(&screen(&user, &["fl", "sc"])).expect("screens");
            seen.push(denials(&s));
            if let Some(id) = s.reservation {
                n.commit(&id, &commit("fl")).expect("commits");
            }
        }
        f.tick();
        let spent = f.nodes[0].delivery("fl").expect("delivery").spent;
        answers.push((kind, seen, spent));
    }
    let (_, first, spent) = &answers[0];
    // Before both; inside both (Wednesday 00:13); inside the flight only.
    assert_eq!(first[0][0].as_ref().map(|d| d.1.as_str()), Some("flight"));
    assert_eq!(first[1], [None, None]);
    assert_eq!(first[2][0], None);
    assert_eq!(first[2][1].as_ref().map(|d| d.1.as_str()), Some("schedule"));
    assert_eq!(*spent, 2, "two commits in the flight");
    for (kind, seen, s) in &answers[1..] {
        assert_eq!((seen, s), (first, spent), "{kind:?} answers as one node");
    }
}
