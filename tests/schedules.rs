//! Schedules, dayparting (docs/semantics.md §6.8; issue 48 item 2): a
//! campaign delivers only in its schedule's local hours and its
//! ancestors', on one node and on two nodes of one shared store alike; bad
//! schedules are refused naming the field.

mod support;

use std::sync::Arc;

use freqcap::ManualClock;
use freqcap::engine::{Engine, EngineError, EngineOptions};
use freqcap::model::{CampaignDef, from_json};
use freqcap::store::SharedMemory;
use support::engines::{Denial, Node, campaign_def, commit, denials, memory_node, screen};

const SEC: u64 = 1_000_000_000;
const HOUR: u64 = 3_600 * SEC;
const DAY: u64 = 24 * HOUR;
/// 2023-11-13T00:00:00Z, a Monday; Paris is UTC+1 then, New York UTC−5.
const MON: u64 = 1_699_833_600 * SEC;

/// `office` delivers 09:00–17:00 Paris time on weekdays; `lunch` under it
/// 12:00–14:00 New York time (its campaign's zone) every day.
fn define(e: &Node) {
    e.put_campaign(
        "office",
        campaign_def(
            r#"{"schedule": {"tz": "Europe/Paris", "hours": [
                {"days": ["mon", "tue", "wed", "thu", "fri"], "from": "09:00", "until": "17:00"}]}}"#,
        ),
    )
    .expect("office");
    e.put_campaign(
        "lunch",
        campaign_def(
            r#"{"parent": "office", "tz": "America/New_York",
                "caps": [{"kind": "window", "limit": 5, "window": "1d"}],
                "schedule": {"hours": [
                {"days": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"],
                 "from": "12:00", "until": "14:00"}]}}"#,
        ),
    )
    .expect("lunch");
}

fn off(campaign: &str, retry_s: u64) -> Denial {
    Some((
        campaign.into(),
        "schedule".into(),
        Some(u128::from(retry_s * SEC)),
    ))
}

#[test]
fn a_candidate_is_eligible_only_in_the_hours_of_every_schedule_of_its_chain() {
    // Monday 07:59:59 UTC: 08:59:59 in Paris, 02:59:59 in New York.
    let (e, clock) = memory_node(MON + 8 * HOUR - SEC);
    define(&e);
    let s = e
        .screen(&screen("u", &["office", "lunch"]))
        .expect("screens");
    // lunch's own schedule is the nearest: 12:00 New York is 17:00 UTC.
    assert_eq!(denials(&s), [off("office", 1), off("lunch", 9 * 3_600 + 1)]);
    assert!(s.reservation.is_none(), "nothing held off the schedule");
    clock.set(MON + 8 * HOUR);
    let s = e.screen(&screen("u", &["office"])).expect("screens");
    assert_eq!(denials(&s), [None]);
    // Monday 17:00 UTC: lunch is open (12:00 in New York), office is not
    // (18:00 in Paris): its schedule denies both, until Tuesday 08:00 UTC.
    clock.set(MON + 17 * HOUR);
    let s = e
        .screen(&screen("u", &["office", "lunch"]))
        .expect("screens");
    assert_eq!(
        denials(&s),
        [off("office", 15 * 3_600), off("office", 15 * 3_600)]
    );
    // (In November the two never overlap: office closes at 16:00 UTC,
    // lunch opens at 17:00 UTC.) Saturday noon in Paris: office is closed
    // until Monday 08:00 UTC.
    clock.set(MON + 5 * DAY + 11 * HOUR);
    let s = e.screen(&screen("u", &["office"])).expect("screens");
    assert_eq!(denials(&s), [off("office", 2 * 24 * 3_600 - 3 * 3_600)]);
}

#[test]
fn an_open_schedule_counts_as_ever_and_a_reservation_commits_after_hours() {
    let (e, clock) = memory_node(MON + 16 * HOUR - SEC / 2);
    e.put_campaign(
        "c",
        campaign_def(
            r#"{"caps": [{"kind": "window", "limit": 2, "window": "1d"}],
                "schedule": {"hours": [{"days": ["mon"], "from": "09:00", "until": "16:00"}]}}"#,
        ),
    )
    .expect("defines");
    let s = e.screen(&screen("u", &["c"])).expect("screens");
    assert_eq!(denials(&s), [None]);
    clock.set(MON + 16 * HOUR);
    let late = e.screen(&screen("v", &["c"])).expect("screens");
    assert_eq!(denials(&late), [off("c", 7 * 24 * 3_600 - 7 * 3_600)]);
    e.commit(&s.reservation.expect("reserved in hours"), &commit("c"))
        .expect("a reservation made in hours commits after them");
    assert_eq!(e.user_usage("u", "c").expect("usage")[0].used, 1);
}

#[test]
fn bad_schedules_are_refused_naming_the_field_and_change_nothing() {
    let (e, _) = memory_node(MON);
    let good = r#"{"schedule": {"hours": [{"days": ["mon"], "from": "09:00", "until": "24:00"}]}}"#;
    e.put_campaign("c", campaign_def(good))
        .expect("a good schedule");
    let span = |from: &str, until: &str| {
        format!(
            r#"{{"schedule": {{"hours": [{{"days": ["mon"], "from": "{from}", "until": "{until}"}}]}}}}"#
        )
    };
    let cases = [
        (span("17:00", "09:00"), "schedule.hours[0].until", "after from"),
        (span("09:00", "09:00"), "schedule.hours[0].until", "after from"),
        (span("24:00", "24:00"), "schedule.hours[0].from", "23:59"),
        (span("9:00", "17:00"), "schedule.hours[0].from", "HH:MM"),
        (span("09:00", "24:01"), "schedule.hours[0].until", "24:00"),
        (span("09:60", "17:00"), "schedule.hours[0].from", "HH:MM"),
        (
            r#"{"schedule": {"hours": []}}"#.to_owned(),
            "schedule.hours",
            "1 to 64",
        ),
        (
            r#"{"schedule": {"hours": [{"days": [], "from": "09:00", "until": "10:00"}]}}"#
                .to_owned(),
            "schedule.hours[0].days",
            "at least one day",
        ),
        (
            r#"{"schedule": {"tz": "Mars/Olympus", "hours": [{"days": ["mon"], "from": "09:00", "until": "10:00"}]}}"#
                .to_owned(),
            "schedule.tz",
            "unknown IANA time zone",
        ),
    ];
    for (json, field, part) in &cases {
        match e.put_campaign("c", campaign_def(json)) {
            Err(EngineError::InvalidArgument { field: f, message }) => {
                assert_eq!(f, *field, "{json}: {message}");
                assert!(message.contains(part), "{json}: {message}");
            }
            other => panic!("{json}: accepted or another error: {other:?}"),
        }
    }
    // An unknown day, or a field a schedule does not have, is refused at
    // parsing, naming where.
    for (bad, at) in [
        (
            r#"{"schedule": {"hours": [{"days": ["mon", "funday"], "from": "09:00", "until": "10:00"}]}}"#,
            "schedule.hours[0].days[1]",
        ),
        (
            r#"{"schedule": {"hours": [{"days": ["mon"], "from": "09:00", "until": "10:00", "weeks": 2}]}}"#,
            "schedule.hours[0]",
        ),
        (r#"{"schedule": {"tz": "UTC"}}"#, "schedule"),
    ] {
        let err = from_json::<CampaignDef>(bad).expect_err(bad);
        assert!(err.field.starts_with(at), "{bad}: {err}");
    }
    assert_eq!(
        e.get_campaign("c").expect("still defined"),
        campaign_def(good)
    );
}

#[test]
fn shadow_mode_answers_would_deny_off_the_schedule() {
    let (e, _) = memory_node(MON);
    e.put_campaign(
        "s",
        campaign_def(
            r#"{"mode": "shadow",
                "schedule": {"hours": [{"days": ["tue"], "from": "00:00", "until": "24:00"}]}}"#,
        ),
    )
    .expect("defines");
    let s = e.screen(&screen("u", &["s"])).expect("screens");
    let r = &s.results[0];
    assert!(r.eligible);
    let w = r.would_deny.as_ref().expect("would deny");
    assert_eq!((&*w.campaign, w.cap.as_str()), ("s", "schedule"));
}

/// Two nodes on one shared store answer every instant alike.
#[test]
fn two_nodes_of_a_fleet_answer_a_schedule_alike() {
    let store = Arc::new(SharedMemory::new());
    let clock = Arc::new(ManualClock::new(MON));
    let a = Engine::open(store.clone(), clock.clone(), EngineOptions::default()).expect("a");
    let b = Engine::open(store.clone(), clock.clone(), EngineOptions::default()).expect("b");
    define(&a);
    assert!(b.refresh_definitions().expect("b reads a's definitions"));
    for at in [
        MON + 8 * HOUR - 1,
        MON + 8 * HOUR,
        MON + 16 * HOUR,
        MON + 17 * HOUR,
        MON + 5 * DAY + 17 * HOUR,
    ] {
        clock.set(at);
        let on_a = a
            .screen(&screen("u", &["office", "lunch"]))
            .expect("a screens");
        let on_b = b
            .screen(&screen("u", &["office", "lunch"]))
            .expect("b screens");
        assert_eq!(denials(&on_a), denials(&on_b), "at {at}");
        for (s, n) in [(on_a, &a), (on_b, &b)] {
            if let Some(id) = s.reservation {
                n.release(&id).expect("releases");
            }
        }
    }
}

/// A budget under a schedule is paced over the scheduled hours only
/// (docs/semantics.md §6.8): its line stands still off-hours, so a day's
/// budget is spent within the day's hours, none outside them, on every
/// place a record can live (one node on memory or RocksDB; two nodes of a
/// shared store in shared and in owner mode).
#[test]
fn a_budget_is_paced_over_the_scheduled_hours_only_on_every_placement() {
    use freqcap::Clock;
    use support::engines::{Fleet, KINDS, T0};
    // T0 is Tuesday 2023-11-14 22:13:20 UTC; Wednesday starts 1:46:40 on.
    let wed = T0 + 6_400 * SEC;
    let mut answers = Vec::new();
    for kind in KINDS {
        let f = Fleet::new(kind);
        f.campaign(
            "day",
            r#"{"schedule": {"hours": [{"days": ["mon", "tue", "wed", "thu", "fri"],
                                        "from": "09:00", "until": "17:00"}]},
                "budget": {"amount": 800, "per": "1d", "pacing": "even"}}"#,
        );
        f.advance(wed.saturating_sub(f.clock.now()));
        // A screen every minute through Wednesday, cost 4 each (5 760
        // units asked for an 800 budget), by hour of the day.
        let mut spend = [0u64; 24];
        let mut line = Vec::new();
        for i in 0..1_440u64 {
            let user = format!("u{}", i % 64);
            let mut req = screen(&user, &["day"]);
            req.candidates[0].cost = Some(4);
            let (n, s) = f.screen(&user, &req);
            if let Some(id) = s.reservation {
                n.commit(&id, &commit("day")).expect("commits");
                spend[(i / 60) as usize] += 4;
            }
            if i % 60 == 0 {
                line.push(f.nodes[0].delivery("day").expect("delivery").cap_now);
            }
            f.advance(60 * SEC);
        }
        answers.push((kind, spend, line));
    }
    let (_, _, line) = &answers[0];
    // The cap: the line, 0 until 09:00 and 100 an hour (800 over 8 hours),
    // plus the default tolerance of 1 % (8); 800 from 17:00.
    assert_eq!(line[8], 8, "the cap at 08:00");
    assert_eq!(line[9], 8, "the cap at 09:00");
    assert_eq!(line[13], 408, "the cap at 13:00");
    assert_eq!(line[17], 800, "the cap at 17:00");
    assert_eq!(line[20], 800, "the cap at 20:00");
    // Spend: none before 09:00 or from 17:00; about 100 an hour in between
    // (commits of 4 along the line); within 2 % of the day's 800 at the
    // close, on every placement.
    for (kind, s, _) in &answers {
        assert_eq!(s[..9], [0; 9], "{kind:?}: nothing before the hours");
        assert_eq!(s[17..], [0; 7], "{kind:?}: nothing after them");
        assert!(
            s[9..17].iter().all(|h| (88..=112).contains(h)),
            "{kind:?}: {s:?}"
        );
        let day: u64 = s.iter().sum();
        assert!((784..=800).contains(&day), "{kind:?}: {day} of 800 ({s:?})");
    }
}
