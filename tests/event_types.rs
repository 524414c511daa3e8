//! Caps per event type and opting out of an ancestor's cap
//! (docs/semantics.md §6.9; issue 48 item 3): a cap or budget with
//! `"event": "click"` counts only click events and stops a campaign once
//! full; impression caps ignore clicks; `ignore_caps` takes a named
//! ancestor cap out of a campaign's decisions and counts. On one node and
//! on every placement of a fleet alike; bad input is refused naming the
//! field, and a change that would leave an opt-out naming nothing is
//! refused.

mod support;

use freqcap::engine::{EngineError, Event};
use freqcap::model::{CampaignDef, from_json};
use support::engines::{Denial, Node, T0, campaign_def, commit, denials, memory_node, screen};

/// An event of `campaign` for `user`, of type `ty` (`None`: an impression).
fn event(user: &str, campaign: &str, ty: Option<&str>, cost: u64) -> Event {
    Event {
        user: Some(user.into()),
        ids: Vec::new(),
        campaign: campaign.into(),
        cost,
        event_id: None,
        event_type: ty.map(str::to_owned),
    }
}

/// Screens `campaigns` for `user` and commits the first eligible one;
/// returns the denials.
fn show(e: &Node, user: &str, campaigns: &[&str]) -> Vec<Denial> {
    let s = e.screen(&screen(user, campaigns)).expect("screens");
    let d = denials(&s);
    if let Some(id) = &s.reservation {
        let first = campaigns[d.iter().position(Option::is_none).expect("one is eligible")];
        e.commit(id, &commit(first)).expect("commits");
    }
    d
}

/// (name, event type, used) of each cap `user` has of `campaign`.
fn used(e: &Node, user: &str, campaign: &str) -> Vec<(String, String, u64)> {
    e.user_usage(user, campaign)
        .expect("usage")
        .into_iter()
        .map(|c| (c.name, c.event.to_string(), c.used))
        .collect()
}

fn cap(name: &str, event: &str, used: u64) -> (String, String, u64) {
    (name.into(), event.into(), used)
}

fn denied_by(campaign: &str, cap: &str) -> Option<(String, String)> {
    Some((campaign.into(), cap.into()))
}

/// What denied each candidate, its retry left out.
fn caps_of(d: &[Denial]) -> Vec<Option<(String, String)>> {
    d.iter()
        .map(|d| d.as_ref().map(|(c, n, _)| (c.clone(), n.clone())))
        .collect()
}

/// `c` shows a user at most 5 ads a day, and none more once they clicked
/// twice that day.
const CLICK_CAPPED: &str = r#"{"caps": [
    {"kind": "window", "name": "views", "limit": 5, "window": "1d", "align": "calendar"},
    {"kind": "window", "name": "clicks", "event": "click", "limit": 2, "window": "1d",
     "align": "calendar"}]}"#;

#[test]
fn a_click_cap_counts_clicks_only_and_stops_the_campaign_once_full() {
    let (e, _clock) = memory_node(T0);
    e.put_campaign("c", campaign_def(CLICK_CAPPED))
        .expect("defines");
    for _ in 0..2 {
        assert_eq!(show(&e, "u", &["c"]), [None]);
    }
    // Commits are impressions: the click cap counts none of them.
    assert_eq!(
        used(&e, "u", "c"),
        [cap("views", "impression", 2), cap("clicks", "click", 0)]
    );
    // Clicks count on the click cap only.
    assert_eq!(e.events(&[event("u", "c", Some("click"), 1)]).ok(), Some(1));
    assert_eq!(
        used(&e, "u", "c"),
        [cap("views", "impression", 2), cap("clicks", "click", 1)]
    );
    // One click left: still eligible, and a screen holds nothing on it.
    assert_eq!(show(&e, "u", &["c"]), [None]);
    assert_eq!(
        used(&e, "u", "c"),
        [cap("views", "impression", 3), cap("clicks", "click", 1)]
    );
    // The second click fills it: no more ads for this user today.
    e.events(&[event("u", "c", Some("click"), 1)])
        .expect("counts");
    let s = e.screen(&screen("u", &["c"])).expect("screens");
    assert_eq!(caps_of(&denials(&s)), [denied_by("c", "clicks")]);
    assert!(s.reservation.is_none());
    // Another user is untouched; an impression event counts on views only.
    e.events(&[
        event("v", "c", None, 1),
        event("v", "c", Some("impression"), 1),
    ])
    .expect("counts");
    assert_eq!(
        used(&e, "v", "c"),
        [cap("views", "impression", 2), cap("clicks", "click", 0)]
    );
    // A type no cap counts is counted (accepted) and changes nothing.
    assert_eq!(
        e.events(&[event("v", "c", Some("conversion"), 1)]).ok(),
        Some(1)
    );
    assert_eq!(
        used(&e, "v", "c"),
        [cap("views", "impression", 2), cap("clicks", "click", 0)]
    );
}

#[test]
fn a_budget_counting_clicks_is_charged_by_clicks_at_their_cost() {
    let (e, _clock) = memory_node(T0);
    e.put_campaign(
        "cpc",
        campaign_def(
            r#"{"budget": {"amount": 100, "per": "1d", "pacing": "asap", "event": "click"}}"#,
        ),
    )
    .expect("defines");
    // Impressions are free to a budget paid per click.
    for u in ["a", "b", "c"] {
        assert_eq!(show(&e, u, &["cpc"]), [None]);
    }
    assert_eq!(e.delivery("cpc").expect("delivery").spent, 0);
    e.events(&[event("a", "cpc", Some("click"), 60)])
        .expect("counts");
    assert_eq!(e.delivery("cpc").expect("delivery").spent, 60);
    // An event is counted unchecked (it happened): 120 of 100, and then the
    // campaign is ineligible.
    e.events(&[event("b", "cpc", Some("click"), 60)])
        .expect("counts");
    assert_eq!(e.delivery("cpc").expect("delivery").spent, 120);
    assert_eq!(
        caps_of(&show(&e, "d", &["cpc"])),
        [denied_by("cpc", "budget")]
    );
    // A goal in clicks: a budget counting click events, 1 each.
    e.put_campaign(
        "cpa",
        campaign_def(
            r#"{"budget": {"amount": 2, "per": "1d", "pacing": "asap", "event": "click",
                            "goal": "impressions"}}"#,
        ),
    )
    .expect("defines");
    e.events(&[
        event("a", "cpa", Some("click"), 70),
        event("b", "cpa", Some("click"), 5),
    ])
    .expect("counts");
    let d = e.delivery("cpa").expect("delivery");
    assert_eq!((d.amount, d.spent), (2, 2));
    assert_eq!(
        caps_of(&show(&e, "d", &["cpa"])),
        [denied_by("cpa", "budget")]
    );
}

/// `adv` caps each user at 2 a day (`daily`) and spends at most 100 a day;
/// `house` under it opts out of `daily`, and `promo` under `house` with it;
/// `brand` under `adv` does not.
fn define_opt_outs(e: &Node) {
    e.put_campaign(
        "adv",
        campaign_def(
            r#"{"caps": [{"kind": "window", "name": "daily", "limit": 2, "window": "1d"}],
                "budget": {"amount": 100, "per": "1d", "pacing": "asap"}}"#,
        ),
    )
    .expect("adv");
    e.put_campaign(
        "house",
        campaign_def(
            r#"{"parent": "adv", "ignore_caps": ["adv/daily"],
                "caps": [{"kind": "window", "name": "own", "limit": 3, "window": "1d"}]}"#,
        ),
    )
    .expect("house");
    e.put_campaign("promo", campaign_def(r#"{"parent": "house"}"#))
        .expect("promo");
    e.put_campaign("brand", campaign_def(r#"{"parent": "adv"}"#))
        .expect("brand");
}

#[test]
fn a_campaign_opting_out_of_an_ancestor_cap_is_neither_stopped_nor_counted_by_it() {
    let (e, _clock) = memory_node(T0);
    define_opt_outs(&e);
    // Two on brand fill adv's daily cap for u: brand is done, house and
    // promo (which inherits house's opt-out) are not.
    assert_eq!(show(&e, "u", &["brand"]), [None]);
    assert_eq!(show(&e, "u", &["brand"]), [None]);
    assert_eq!(
        caps_of(&show(&e, "u", &["brand", "house", "promo"])),
        [denied_by("adv", "daily"), None, None]
    );
    // That commit was house's: adv's daily cap did not count it, house's
    // own cap did, and adv's budget (not opted out of) did.
    assert_eq!(used(&e, "u", "brand"), [cap("daily", "impression", 2)]);
    assert_eq!(used(&e, "u", "house"), [cap("own", "impression", 1)]);
    assert_eq!(e.delivery("adv").expect("delivery").spent, 3);
    // Events and late commits of promo skip adv's daily cap likewise.
    e.events(&[event("w", "promo", None, 1), event("w", "promo", None, 1)])
        .expect("counts");
    assert_eq!(used(&e, "w", "brand"), [cap("daily", "impression", 0)]);
    assert_eq!(used(&e, "w", "promo"), [cap("own", "impression", 2)]);
    let late = freqcap::engine::CommitRequest {
        user: Some("w".into()),
        cost: Some(1),
        ..commit("promo")
    };
    e.commit("gone-reservation", &late).expect("a late commit");
    assert_eq!(used(&e, "w", "brand"), [cap("daily", "impression", 0)]);
    assert_eq!(used(&e, "w", "promo"), [cap("own", "impression", 3)]);
    assert_eq!(e.delivery("adv").expect("delivery").spent, 6);
    // Without the opt-out, adv's cap applies to house again, and what it
    // counted before is all it has (none of house's): the edit keeps counts.
    e.put_campaign(
        "house",
        campaign_def(
            r#"{"parent": "adv",
                "caps": [{"kind": "window", "name": "own", "limit": 3, "window": "1d"}]}"#,
        ),
    )
    .expect("house without its opt-out");
    assert_eq!(
        used(&e, "w", "house"),
        [cap("own", "impression", 3), cap("daily", "impression", 0)]
    );
    assert_eq!(
        caps_of(&show(&e, "u", &["house"])),
        [denied_by("adv", "daily")]
    );
}

#[test]
fn bad_event_types_and_opt_outs_are_refused_naming_the_field_and_change_nothing() {
    let (e, _clock) = memory_node(T0);
    define_opt_outs(&e);
    let field = |json: &str| match from_json::<CampaignDef>(json) {
        Err(err) => err.field,
        Ok(def) => match e.put_campaign("x", def) {
            Err(EngineError::InvalidArgument { field, .. }) => field,
            other => panic!("{json}: {other:?}"),
        },
    };
    let cases = [
        (
            r#"{"caps": [{"kind": "rate", "rate": 1, "per": "1h", "event": "Click"}]}"#,
            "caps[0].event",
        ),
        (
            r#"{"caps": [{"kind": "rate", "rate": 1, "per": "1h", "event": 3}]}"#,
            "caps[0].event",
        ),
        (
            r#"{"budget": {"amount": 5, "event": "two words"}}"#,
            "budget.event",
        ),
        (
            r#"{"parent": "adv", "ignore_caps": ["adv"]}"#,
            "ignore_caps[0]",
        ),
        (
            r#"{"parent": "adv", "ignore_caps": ["/daily"]}"#,
            "ignore_caps[0]",
        ),
        (
            r#"{"parent": "adv", "ignore_caps": ["adv/daily", "adv/daily"]}"#,
            "ignore_caps[1]",
        ),
        // Not an ancestor (a sibling, and itself).
        (
            r#"{"parent": "adv", "ignore_caps": ["brand/x"]}"#,
            "ignore_caps[0]",
        ),
        (r#"{"ignore_caps": ["adv/daily"]}"#, "ignore_caps[0]"),
        // An ancestor without that cap.
        (
            r#"{"parent": "house", "ignore_caps": ["adv/daily", "adv/weekly"]}"#,
            "ignore_caps[1]",
        ),
    ];
    for (json, want) in cases {
        assert!(field(json).ends_with(want), "{json}: {}", field(json));
    }
    assert!(e.get_campaign("x").is_none(), "nothing was defined");
    // A bad event type fails its batch, naming the event, with nothing
    // counted.
    match e.events(&[
        event("u", "brand", None, 1),
        event("u", "brand", Some("Click"), 1),
    ]) {
        Err(EngineError::InvalidArgument { field, .. }) => assert_eq!(field, "[1].type"),
        other => panic!("{other:?}"),
    }
    assert_eq!(used(&e, "u", "brand"), [cap("daily", "impression", 0)]);
    // A change of adv that drops `daily`, or of house that leaves adv's
    // chain, would leave house's opt-out naming nothing: refused, as it was.
    let before = e.get_campaign("adv");
    match e.put_campaign("adv", campaign_def(r#"{"caps": []}"#)) {
        Err(EngineError::Conflict(c)) => assert!(c.to_string().contains("adv/daily"), "{c}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(e.get_campaign("adv"), before);
    e.put_campaign("other", campaign_def("{}")).expect("other");
    match e.put_campaign("promo", campaign_def(r#"{"parent": "other"}"#)) {
        Ok(_) => {}
        other => panic!("promo opts out of nothing itself: {other:?}"),
    }
    match e.put_campaign(
        "house",
        campaign_def(r#"{"parent": "other", "ignore_caps": []}"#),
    ) {
        Ok(_) => {}
        other => panic!("house may drop its opt-out with its parent: {other:?}"),
    }
}

#[test]
fn a_cap_changed_to_count_clicks_starts_empty_and_back_again() {
    let (e, _clock) = memory_node(T0);
    let def = |ev: &str| {
        campaign_def(&format!(
            r#"{{"caps": [{{"kind": "window", "name": "n", "limit": 5, "window": "1d"{ev}}}]}}"#
        ))
    };
    e.put_campaign("c", def("")).expect("defines");
    show(&e, "u", &["c"]);
    assert_eq!(used(&e, "u", "c"), [cap("n", "impression", 1)]);
    // Counting clicks is counting something else: the cap starts empty.
    e.put_campaign("c", def(r#", "event": "click""#))
        .expect("redefines");
    assert_eq!(used(&e, "u", "c"), [cap("n", "click", 0)]);
    // "impression" written out is the default: the count is there again.
    e.put_campaign("c", def(r#", "event": "impression""#))
        .expect("redefines");
    assert_eq!(used(&e, "u", "c"), [cap("n", "impression", 1)]);
}

/// The same click cap and opt-out on every place a record can live (one
/// node on memory or RocksDB; two nodes of a shared store in shared and in
/// owner mode, `support::engines`): a fleet answers what one node answers.
#[test]
fn click_caps_and_opt_outs_answer_alike_on_every_placement() {
    use support::engines::{Fleet, KINDS};
    let mut answers = Vec::new();
    for kind in KINDS {
        let f = Fleet::new(kind);
        f.campaign("c", CLICK_CAPPED);
        f.campaign(
            "adv",
            r#"{"caps": [{"kind": "window", "name": "daily", "limit": 1, "window": "1d",
                          "scope": "campaign"}]}"#,
        );
        f.campaign(
            "house",
            r#"{"parent": "adv", "ignore_caps": ["adv/daily"]}"#,
        );
        f.campaign("brand", r#"{"parent": "adv"}"#);
        // Per round and user: a screen of c, a click on it, a screen of
        // brand and house.
        let mut seen = Vec::new();
        for _round in 0..3 {
            for u in ["u1", "u2"] {
                let n = f.node(u);
                seen.push(show(n, u, &["c"]));
                n.events(&[event(u, "c", Some("click"), 1)])
                    .expect("counts");
                let n = f.node(u);
                seen.push(show(n, u, &["brand", "house"]));
            }
            f.tick();
        }
        let n = f.node("u1");
        let usage = used(n, "u1", "c");
        // Retries differ by design: a fleet's leased campaign cap answers
        // "soon" (another node may have room), one node the window's end.
        let seen: Vec<_> = seen.iter().map(|d| caps_of(d)).collect();
        answers.push((kind, seen, usage));
    }
    let (_, first, usage) = &answers[0];
    // Events are counted unchecked (they happened): the third click too.
    assert_eq!(
        *usage,
        [cap("views", "impression", 2), cap("clicks", "click", 3)]
    );
    // c: eligible twice per user, then its click cap is full.
    assert_eq!(first[0], [None]);
    assert_eq!(first[4], [None]);
    assert_eq!(first[8], [denied_by("c", "clicks")]);
    // brand: one for the whole campaign (scope campaign), house always.
    assert_eq!(first[1], [None, None]);
    assert_eq!(first[3], [denied_by("adv", "daily"), None]);
    for (kind, seen, u) in &answers[1..] {
        assert_eq!((seen, u), (first, usage), "{kind:?} answers as one node");
    }
}
