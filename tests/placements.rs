//! The same scenarios on every place a record can live (issue 46): one node
//! on memory and on RocksDB, two nodes on one shared store in shared mode
//! and in owner mode (tests/support/engines.rs). A fleet must answer what
//! one node answers (docs/semantics.md), so each scenario's expectations
//! are written once, for all of them.

mod support;

use freqcap::engine::{EngineError, Event, Outcome};
use support::engines::{Fleet, KINDS, SEC, commit, screen};

/// A scenario: its name, and what it does and checks on a fleet.
type Scenario = (&'static str, fn(&Fleet));

/// Each scenario with its name.
macro_rules! scenarios {
    ($($f:ident),* $(,)?) => { &[$((stringify!($f), $f as fn(&Fleet))),*] };
}

const SCENARIOS: &[Scenario] = scenarios![
    a_user_cap_binds_at_its_limit,
    released_and_expired_holds_come_back,
    a_campaign_cap_binds_across_users,
    events_count_once_per_id,
    a_raised_cap_keeps_what_was_counted,
    a_repeated_screen_is_the_same_reservation,
    a_parent_cap_and_winners_by_name,
    a_budget_delivers_its_amount,
    a_household_cap_counts_its_members,
    exclusion_labels_admit_one,
];

#[test]
fn every_scenario_on_every_store_kind() {
    for kind in KINDS {
        for (name, scenario) in SCENARIOS {
            let fleet = Fleet::new(kind);
            let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| scenario(&fleet)));
            if let Err(e) = run {
                let why = e
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| e.downcast_ref::<&str>().copied())
                    .unwrap_or("?");
                panic!("{name} on {kind:?}: {why}");
            }
        }
    }
}

/// Screens `user` for `campaign` and commits it if eligible: whether it was.
fn show(f: &Fleet, user: &str, campaign: &str) -> bool {
    let s = f
        .node(user)
        .screen(&screen(user, &[campaign]))
        .expect("screen");
    let Some(id) = s.reservation else {
        return false;
    };
    let o = f.node(user).commit(&id, &commit(campaign)).expect("commit");
    assert_eq!(o.outcome, Outcome::Committed);
    true
}

fn a_user_cap_binds_at_its_limit(f: &Fleet) {
    f.campaign(
        "c",
        r#"{"caps": [{"kind": "window", "limit": 3, "window": "1d"}]}"#,
    );
    let shown = (0..5).filter(|_| show(f, "u1", "c")).count();
    assert_eq!(shown, 3);
    // Another user is untouched; every node reads the same figures.
    assert!(show(f, "u2", "c"));
    for n in &f.nodes {
        let u = n.user_usage("u1", "c").expect("usage");
        assert_eq!(
            (u[0].used, u[0].pending, u[0].remaining),
            (3, 0, 0),
            "{}",
            n.node_id()
        );
    }
    // A day later, the window has rolled.
    f.advance(86_400 * SEC);
    assert!(show(f, "u1", "c"));
}

fn released_and_expired_holds_come_back(f: &Fleet) {
    f.campaign(
        "c",
        r#"{"caps": [{"kind": "window", "limit": 1, "window": "1h"}]}"#,
    );
    let s = f.node("u1").screen(&screen("u1", &["c"])).expect("screen");
    let id = s.reservation.expect("eligible");
    // Held: a second screen is denied while the first is open.
    let again = f.node("u1").screen(&screen("u1", &["c"])).expect("screen");
    assert_eq!(again.reservation, None, "the hold counts");
    let r = f.node("u1").release(&id).expect("release");
    assert_eq!(r.outcome, Outcome::Released);
    // Released: eligible again; this time the hold runs out (1 s).
    let s = f.node("u1").screen(&screen("u1", &["c"])).expect("screen");
    let late = s.reservation.expect("eligible after a release");
    f.advance(2 * SEC);
    assert!(show(f, "u1", "c"), "an expired hold comes back");
    // Its commit, past the deadline, is refused and counts nothing.
    let e = f.node("u1").commit(&late, &commit("c"));
    assert!(
        matches!(
            e,
            Err(EngineError::NotFound(_)) | Err(EngineError::Conflict(_))
        ),
        "{e:?}"
    );
    assert!(!show(f, "u1", "c"), "one shown of 1 an hour");
}

fn a_campaign_cap_binds_across_users(f: &Fleet) {
    f.campaign(
        "c",
        r#"{"caps": [{"kind": "window", "limit": 4, "window": "1d", "align": "calendar", "scope": "campaign"}]}"#,
    );
    let mut shown = 0;
    for u in 0..10 {
        // Renewals and reports of a fleet's leases run between requests.
        f.tick();
        shown += usize::from(show(f, &format!("u{u}"), "c"));
    }
    assert_eq!(shown, 4, "a campaign cap of 4 over 10 users");
}

fn events_count_once_per_id(f: &Fleet) {
    f.campaign(
        "c",
        r#"{"caps": [{"kind": "window", "limit": 2, "window": "1d"}]}"#,
    );
    let event = |id: &str| Event {
        user: Some("u1".into()),
        ids: Vec::new(),
        campaign: "c".into(),
        cost: 1,
        event_id: Some(id.into()),
        event_type: None,
    };
    assert_eq!(f.node("u1").events(&[event("e1")]).expect("events"), 1);
    assert_eq!(f.node("u1").events(&[event("e1")]).expect("a repeat"), 0);
    assert!(show(f, "u1", "c"), "one event of two");
    assert!(!show(f, "u1", "c"), "the event and the impression");
    let u = f.node("u1").user_usage("u1", "c").expect("usage");
    assert_eq!(u[0].used, 2);
}

fn a_raised_cap_keeps_what_was_counted(f: &Fleet) {
    f.campaign(
        "c",
        r#"{"caps": [{"kind": "window", "limit": 3, "window": "1d"}]}"#,
    );
    assert!(show(f, "u1", "c") && show(f, "u1", "c"));
    f.campaign(
        "c",
        r#"{"caps": [{"kind": "window", "limit": 4, "window": "1d"}]}"#,
    );
    let more = (0..4).filter(|_| show(f, "u1", "c")).count();
    assert_eq!(more, 2, "2 of 4 were seen before the edit");
}

fn a_repeated_screen_is_the_same_reservation(f: &Fleet) {
    f.campaign(
        "c",
        r#"{"caps": [{"kind": "window", "limit": 2, "window": "1d"}]}"#,
    );
    let mut req = screen("u1", &["c"]);
    req.reservation_id = Some("ad-1".into());
    let first = f.node("u1").screen(&req).expect("screen");
    assert_eq!(first.reservation.as_deref(), Some("ad-1"));
    // A retry (here perhaps on the other node) is answered as the first
    // was, holding nothing more.
    let again = f.node("u1").screen(&req).expect("a repeat");
    assert_eq!(again.reservation.as_deref(), Some("ad-1"));
    assert!(again.results[0].eligible);
    let u = f.node("u1").user_usage("u1", "c").expect("usage");
    assert_eq!((u[0].used, u[0].pending), (0, 1), "held once");
    // An id the client chose names no record: the commit names the user
    // (docs/cluster.md), so any node finds it.
    let mut c = commit("c");
    c.user = Some("u1".into());
    f.node("u1").commit("ad-1", &c).expect("commit");
    let twice = f.node("u1").commit("ad-1", &c).expect("a repeated commit");
    assert_eq!(twice.outcome, Outcome::Committed);
    let u = f.node("u1").user_usage("u1", "c").expect("usage");
    assert_eq!((u[0].used, u[0].pending), (1, 0), "committed once");
}

fn a_parent_cap_and_winners_by_name(f: &Fleet) {
    f.campaign(
        "adv",
        r#"{"caps": [{"kind": "window", "limit": 3, "window": "1d"}]}"#,
    );
    for c in ["a", "b"] {
        f.campaign(
            c,
            r#"{"parent": "adv", "caps": [{"kind": "window", "limit": 2, "window": "1d"}]}"#,
        );
    }
    // Both held; the commit names b: a is released.
    let s = f
        .node("u1")
        .screen(&screen("u1", &["a", "b", "a"]))
        .expect("screen");
    let id = s.reservation.expect("eligible");
    let o = f.node("u1").commit(&id, &commit("b")).expect("commit");
    assert_eq!(o.campaigns, vec![std::sync::Arc::from("b")]);
    let a = f.node("u1").user_usage("u1", "a").expect("usage");
    assert_eq!((a[0].used, a[0].pending), (0, 0), "a released");
    assert_eq!(a[1].used, 1, "the parent counted b's");
    // A campaign named more often than it was held is refused, settling nothing.
    let s = f.node("u1").screen(&screen("u1", &["a"])).expect("screen");
    let id = s.reservation.expect("eligible");
    let mut twice = commit("a");
    twice.campaigns.push("a".into());
    assert!(matches!(
        f.node("u1").commit(&id, &twice),
        Err(EngineError::InvalidArgument { .. })
    ));
    assert_eq!(
        f.node("u1")
            .commit(&id, &commit("a"))
            .expect("commit")
            .outcome,
        Outcome::Committed
    );
    // The parent's 3 bind before a's own 2.
    assert!(show(f, "u1", "b"));
    assert!(!show(f, "u1", "a"), "adv: 3 of 3");
}

fn a_budget_delivers_its_amount(f: &Fleet) {
    f.campaign(
        "c",
        r#"{"budget": {"amount": 6, "per": "1d", "pacing": "asap"}}"#,
    );
    let mut shown = 0;
    for u in 0..12 {
        f.tick();
        shown += usize::from(show(f, &format!("u{u}"), "c"));
    }
    assert_eq!(shown, 6, "a budget of 6 over 12 users");
    f.tick();
    for n in &f.nodes {
        let d = n.delivery("c").expect("delivery");
        assert_eq!((d.spent, d.pending), (6, 0), "{}", n.node_id());
    }
}

fn a_household_cap_counts_its_members(f: &Fleet) {
    f.campaign(
        "c",
        r#"{"caps": [
            {"name": "hh_daily", "kind": "window", "limit": 2, "window": "1d", "scope": "household"},
            {"name": "user_daily", "kind": "window", "limit": 5, "window": "1d"}]}"#,
    );
    let shown = |user: &str| {
        let mut req = screen(user, &["c"]);
        req.ids = vec![("household".into(), "h1".into())];
        let s = f.node(user).screen(&req).expect("screen");
        match s.reservation {
            Some(id) => {
                f.node(user).commit(&id, &commit("c")).expect("commit");
                None
            }
            None => s.results[0].denied_by.as_ref().map(|d| d.cap.clone()),
        }
    };
    assert_eq!(shown("u1"), None);
    assert_eq!(shown("u2"), None);
    assert_eq!(
        shown("u3").as_deref(),
        Some("hh_daily"),
        "2 a day per household"
    );
    let hh = f
        .node("u1")
        .identity_usage("household", "h1", "c")
        .expect("usage");
    let cap = hh
        .iter()
        .find(|c| c.name == "hh_daily")
        .expect("the household cap");
    assert_eq!((cap.used, cap.pending), (2, 0));
}

fn exclusion_labels_admit_one(f: &Fleet) {
    f.campaign(
        "autos",
        r#"{"exclusion_labels": ["auto"], "max_per_screen": 1}"#,
    );
    f.campaign("maker-a", r#"{"parent": "autos"}"#);
    f.campaign("rival", r#"{"exclusion_labels": ["auto"]}"#);
    let s = f
        .node("u1")
        .screen(&screen("u1", &["maker-a", "rival"]))
        .expect("screen");
    let eligible: Vec<bool> = s.results.iter().map(|r| r.eligible).collect();
    assert_eq!(eligible, [true, false]);
    let d = s.results[1].denied_by.as_ref().expect("denied");
    assert_eq!(d.cap, "exclusion:auto");
}
