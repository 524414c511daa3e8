//! Owner mode (`reservations = "owner"`, docs/cluster.md "Owner mode") on a
//! real Redis Cluster with real freqcap processes: each user has one owner
//! among the live nodes, which decides from memory; the others forward.
//!
//! - An owner killed (`kill -9`) and restarted mid-load: no user gets more
//!   acknowledged commits than its cap, and no acknowledged commit is lost.
//! - A node joining takes its share of the users; requests sent to any node
//!   are forwarded to the owner and the caps stay exact across the move.
//! - An owner paused past its lease (SIGSTOP) that wakes up cannot write:
//!   its reservation cannot be committed, and the new owner's count stands.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;

mod support;

use support::cluster::{Node, Redis, definition_reached, redis_cli};

fn owner_node(tmp: &Path, redis: &Redis, id: &str) -> Node {
    Node::start_with(
        &tmp.join(id),
        &redis.seeds,
        id,
        &[],
        &["--reservations", "owner", "--grpc-listen", "off"],
    )
}

/// A campaign capped at `cap` per user per hour, seen by every node.
fn campaign(nodes: &[&Node], camp: &str, cap: u64) {
    let def = json!({"caps": [{"kind": "window", "limit": cap, "window": "1h"}]});
    let (st, body) = nodes[0].call_retrying("PUT", &format!("/v1/campaigns/{camp}"), Some(&def));
    assert_eq!(st, 200, "{body}");
    definition_reached(nodes.iter().copied(), &format!("/v1/campaigns/{camp}"));
}

/// Waits (15 s at most) until every node answers a user's screen, then
/// until every node's lease is active.
fn fleet_ready(nodes: &[&Node], camp: &str) {
    for (i, n) in nodes.iter().enumerate() {
        let until = Instant::now() + Duration::from_secs(15);
        loop {
            let body = json!({"user": format!("probe{i}"), "candidates": [{"campaign": camp}], "reserve": false});
            let (st, out) = n.call("POST", "/v1/screen", Some(&body));
            if st == 200 {
                break;
            }
            assert!(Instant::now() < until, "{} not ready: {st} {out}", n.base);
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    // Every node has joined; each owns its users one lease (2 s) after it
    // did, and until then users move: past that, owners hold still.
    std::thread::sleep(Duration::from_millis(2_500));
}

/// Screens `user` on `n` and commits the reservation there: Some(true) if
/// the commit was acknowledged, Some(false) if the screen found the user
/// capped, None if either failed (503, unreachable: the commit may or may
/// not have been applied).
fn impression(n: &Node, user: &str, camp: &str) -> Option<bool> {
    let body =
        json!({"user": user, "candidates": [{"campaign": camp}], "reserve": true, "ttl_ms": 5000});
    let (st, out) = n.call("POST", "/v1/screen", Some(&body));
    if st != 200 {
        return None;
    }
    if out["results"][0]["eligible"] != true {
        return Some(false);
    }
    let id = out["reservation"].as_str()?;
    let (st, out) = n.call(
        "POST",
        &format!("/v1/reservations/{id}/commit"),
        Some(&json!({})),
    );
    (st == 200 && out["outcome"] == "committed").then_some(true)
}

/// [`impression`], again (every 100 ms, 3 s at most) while it fails: a
/// user whose owner is changing is answered 503 for up to half a second.
fn impression_retrying(n: &Node, user: &str, camp: &str) -> Option<bool> {
    for _ in 0..30 {
        if let Some(r) = impression(n, user, camp) {
            return Some(r);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

/// `used` of the user's cap, asked of `n` (forwarded to the owner),
/// retried while the owner is changing.
fn used(n: &Node, user: &str, camp: &str) -> u64 {
    let (st, u) = n.call_retrying("GET", &format!("/v1/users/{user}/campaigns/{camp}"), None);
    assert_eq!(st, 200, "{u}");
    u["caps"][0]["used"].as_u64().unwrap_or(u64::MAX)
}

fn sum_metric(nodes: &[&Node], name: &str) -> f64 {
    nodes.iter().filter_map(|n| n.metric(name)).sum()
}

#[test]
fn an_owner_killed_mid_load_loses_no_commit_and_no_cap() {
    const CAP: u64 = 3;
    const USERS: usize = 40;
    let tmp = tempfile::tempdir().expect("temp dir");
    let redis = Redis::start(&tmp.path().join("redis"), 7640);
    let mut nodes: Vec<Node> = ["o0", "o1", "o2"]
        .iter()
        .map(|id| owner_node(tmp.path(), &redis, id))
        .collect();
    campaign(&nodes.iter().collect::<Vec<_>>(), "k", CAP);
    fleet_ready(&nodes.iter().collect::<Vec<_>>(), "k");
    let mut acked: HashMap<usize, u64> = HashMap::new();
    let (mut ok, mut failed) = (0u64, 0u64);
    // Each request goes to the next node in turn, whoever owns its user:
    // two in three are forwarded.
    let mut round = |nodes: &[Node], i: usize, acked: &mut HashMap<usize, u64>| {
        let user = i % USERS;
        match impression(&nodes[i % nodes.len()], &format!("u{user}"), "k") {
            Some(true) => {
                *acked.entry(user).or_default() += 1;
                ok += 1;
            }
            Some(false) => ok += 1,
            None => failed += 1,
        }
    };
    for i in 0..150 {
        round(&nodes, i, &mut acked);
    }
    nodes[2].kill9();
    for i in 150..300 {
        round(&nodes, i, &mut acked);
    }
    nodes[2] = owner_node(tmp.path(), &redis, "o2");
    // Past the restarted node's activation (one lease), then more load.
    let until = Instant::now() + Duration::from_secs(4);
    let mut i = 300;
    while Instant::now() < until || i < 600 {
        round(&nodes, i, &mut acked);
        i += 1;
        if i > 5_000 {
            break;
        }
    }
    eprintln!("owner killed: {ok} answered, {failed} failed over {i} requests");
    assert!(
        ok > failed,
        "most requests must be answered: {ok} vs {failed}"
    );
    let all: Vec<&Node> = nodes.iter().collect();
    for user in 0..USERS {
        let a = acked.get(&user).copied().unwrap_or(0);
        let stored = used(&nodes[user % 3], &format!("u{user}"), "k");
        assert!(
            a <= CAP,
            "user u{user}: {a} acknowledged commits over its cap {CAP}"
        );
        assert!(
            stored >= a,
            "user u{user}: {a} commits acknowledged, {stored} stored (one was lost)"
        );
        assert!(
            stored <= CAP,
            "user u{user}: {stored} stored over its cap {CAP}"
        );
    }
    // Forwarding and claims happened on every node.
    assert!(sum_metric(&all, "freqcap_owner_claims") >= USERS as f64);
}

#[test]
fn a_member_joining_takes_its_users_and_requests_are_forwarded() {
    const CAP: u64 = 3;
    const USERS: usize = 30;
    let tmp = tempfile::tempdir().expect("temp dir");
    let redis = Redis::start(&tmp.path().join("redis"), 7660);
    let a = owner_node(tmp.path(), &redis, "j0");
    let b = owner_node(tmp.path(), &redis, "j1");
    campaign(&[&a, &b], "j", CAP);
    fleet_ready(&[&a, &b], "j");
    // One impression each, all sent to a (half forwarded to b).
    for u in 0..USERS {
        assert_eq!(
            impression_retrying(&a, &format!("u{u}"), "j"),
            Some(true),
            "u{u}"
        );
    }
    let c = owner_node(tmp.path(), &redis, "j2");
    fleet_ready(&[&a, &b, &c], "j");
    let nodes = [&a, &b, &c];
    // Five more attempts per user, through every node in turn: exactly two
    // more fit under the cap, wherever the user now lives.
    let mut allowed: HashMap<usize, u64> = HashMap::new();
    for round in 0..5 {
        for u in 0..USERS {
            let n = nodes[(u + round) % 3];
            let r = impression_retrying(n, &format!("u{u}"), "j");
            if r.expect("answered within 3 s") {
                *allowed.entry(u).or_default() += 1;
            }
        }
    }
    for u in 0..USERS {
        assert_eq!(allowed.get(&u).copied().unwrap_or(0), CAP - 1, "u{u}");
        for n in nodes {
            assert_eq!(
                used(n, &format!("u{u}"), "j"),
                CAP,
                "u{u} asked of {}",
                n.base
            );
        }
    }
    // Events of many users posted to one node: each owner counts its own
    // (one forwarded request per owner), the counts summed in the answer.
    let events: Vec<_> = (0..USERS)
        .map(|u| json!({"user": format!("u{u}"), "campaign": "j", "event_id": format!("e{u}")}))
        .collect();
    let (st, out) = a.call_retrying("POST", "/v1/events", Some(&json!(events)));
    assert_eq!(st, 200, "{out}");
    assert_eq!(out["counted"], USERS, "{out}");
    let (st, out) = b.call_retrying("POST", "/v1/events", Some(&json!(events)));
    assert_eq!((st, &out["duplicates"]), (200, &json!(USERS)), "{out}");
    // An answer given through another node names the owner, so a client
    // can send the user's next requests there.
    let elsewhere = (0..USERS).find(|u| {
        let r = a
            .agent
            .get(&format!("{}/v1/users/u{u}/campaigns/j", a.base))
            .call();
        r.ok()
            .and_then(|r| r.headers().get("x-freqcap-owner").cloned())
            .is_some_and(|v| {
                let owner = format!("http://{}", v.to_str().unwrap_or(""));
                owner == b.base || owner == c.base
            })
    });
    let u = elsewhere.expect("an answer named another owner");
    // The owner's refusal comes back as it gave it: an unknown campaign is
    // a 404, not a 503 to retry.
    let bad = json!({"user": format!("u{u}"), "campaign": "nope"});
    let (st, out) = a.call_retrying("POST", "/v1/events", Some(&bad));
    assert_eq!(
        (st, &out["error"]["code"]),
        (404, &json!("not_found")),
        "{out}"
    );
    // c owns a share of the users: it claimed them.
    let claimed = c.metric("freqcap_owner_claims").unwrap_or(0.0);
    assert!(claimed >= 3.0, "the new member claimed {claimed} users");
    // c stops (SIGTERM): it leaves the members, and its users are a's and
    // b's again, their counts intact.
    let mut c = c;
    support::signal(&c.child, libc::SIGTERM);
    let until = Instant::now() + Duration::from_secs(15);
    while c.child.try_wait().ok().flatten().is_none() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    // Its last lines may still be on their way from its stderr.
    let left = (0..40).any(|_| {
        support::log_text(&c.log).contains("left the fleet") || {
            std::thread::sleep(Duration::from_millis(50));
            false
        }
    });
    assert!(left, "{}", support::log_text(&c.log));
    c.kill9();
    // Each user's count: CAP impressions, and the event counted past the
    // cap (an event is an impression shown; usage reports what is counted,
    // docs/semantics.md §7.2).
    for u in 0..USERS {
        assert_eq!(
            used(&a, &format!("u{u}"), "j"),
            CAP + 1,
            "u{u} after c left"
        );
    }
}

#[test]
fn a_paused_owner_that_wakes_up_cannot_write() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let redis = Redis::start(&tmp.path().join("redis"), 7680);
    let a = owner_node(tmp.path(), &redis, "p0");
    let b = owner_node(tmp.path(), &redis, "p1");
    campaign(&[&a, &b], "p", 1);
    fleet_ready(&[&a, &b], "p");
    // A user a owns: a screen sent to a that a claimed itself.
    let user = (0..200)
        .map(|i| format!("w{i}"))
        .find(|u| {
            let before = a.metric("freqcap_owner_claims").unwrap_or(0.0);
            let body = json!({"user": u, "candidates": [{"campaign": "p"}], "reserve": false});
            a.call("POST", "/v1/screen", Some(&body)).0 == 200
                && a.metric("freqcap_owner_claims").unwrap_or(0.0) > before
        })
        .expect("a owns one of 200 users");
    let body =
        json!({"user": user, "candidates": [{"campaign": "p"}], "reserve": true, "ttl_ms": 60000});
    let (st, out) = a.call("POST", "/v1/screen", Some(&body));
    assert_eq!(st, 200, "{out}");
    assert_eq!(out["results"][0]["eligible"], true, "{out}");
    let held = out["reservation"]
        .as_str()
        .expect("a reservation")
        .to_owned();
    // a pauses past its lease: b becomes the user's owner, and shows the
    // user its one impression (it never knew a's hold).
    support::signal(&a.child, libc::SIGSTOP);
    std::thread::sleep(Duration::from_millis(3_500));
    let shown = impression_retrying(&b, &user, "p");
    assert_eq!(shown, Some(true), "b, the owner now, shows the user once");
    support::signal(&a.child, libc::SIGCONT);
    // Woken, a must not write what it decided before its pause: its
    // reservation's commit is refused, now and after a rejoined.
    let until = Instant::now() + Duration::from_secs(5);
    let mut answers = Vec::new();
    while Instant::now() < until {
        let (st, out) = a.call(
            "POST",
            &format!("/v1/reservations/{held}/commit"),
            Some(&json!({})),
        );
        assert_ne!(
            st, 200,
            "the woken owner committed its old reservation: {out}"
        );
        answers.push(st);
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("woken owner's commit answers: {answers:?}");
    for n in [&a, &b] {
        assert_eq!(used(n, &user, "p"), 1, "asked of {}", n.base);
    }
    let log = support::log_text(&a.log);
    assert!(
        log.contains("membership lease ran out"),
        "the woken node rejoined with a new epoch:\n{log}"
    );
}

/// A claim of a user with no record stands 10 minutes; one that ran out
/// (deleted here, as its expiry would) under the owner's copy is made
/// again at the commit, which is acknowledged and counted once.
#[test]
fn a_claim_that_ran_out_is_made_again_at_the_commit() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let redis = Redis::start(&tmp.path().join("redis"), 7740);
    let a = owner_node(tmp.path(), &redis, "c0");
    campaign(&[&a], "q", 2);
    fleet_ready(&[&a], "q");
    let claims = |pattern: &str| -> Vec<(u16, String)> {
        redis
            .primaries(7740)
            .into_iter()
            .flat_map(|p| {
                redis_cli(p, &["--scan", "--pattern", pattern])
                    .lines()
                    .map(|k| (p, k.to_owned()))
                    .collect::<Vec<_>>()
            })
            .filter(|(p, k)| redis_cli(*p, &["HEXISTS", k, "b"]).trim() == "0")
            .collect()
    };
    let before = claims("fc:{u:*}");
    let body = json!({"user": "late", "candidates": [{"campaign": "q"}], "reserve": true});
    let (st, out) = a.call("POST", "/v1/screen", Some(&body));
    assert_eq!(st, 200, "{out}");
    let id = out["reservation"]
        .as_str()
        .expect("a reservation")
        .to_owned();
    let after = claims("fc:{u:*}");
    let fresh: Vec<_> = after.iter().filter(|c| !before.contains(c)).collect();
    assert_eq!(fresh.len(), 1, "one claim, with no record: {after:?}");
    let (port, key) = fresh[0];
    let ttl: i64 = redis_cli(*port, &["PTTL", key])
        .trim()
        .parse()
        .unwrap_or(-1);
    assert!(
        (1..=600_000).contains(&ttl),
        "the claim stands 10 minutes at most: {ttl} ms"
    );
    assert_eq!(redis_cli(*port, &["DEL", key]).trim(), "1");
    let (st, out) = a.call(
        "POST",
        &format!("/v1/reservations/{id}/commit"),
        Some(&json!({})),
    );
    assert_eq!((st, &out["outcome"]), (200, &json!("committed")), "{out}");
    assert_eq!(used(&a, "late", "q"), 1);
    assert_eq!(
        redis_cli(*port, &["HEXISTS", key, "b"]).trim(),
        "1",
        "the commit wrote the record"
    );
}

/// Issue 45 in owner mode: a user cap raised after 2 impressions keeps
/// them (used 2, 1 more), on every node; the user erased through any node
/// (forwarded to the owner) reads empty on every node and starts afresh.
#[test]
fn an_edit_keeps_counts_and_an_erasure_reaches_the_owner() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let redis = Redis::start(&tmp.path().join("redis"), 7920);
    let n: Vec<Node> = (0..3)
        .map(|i| owner_node(tmp.path(), &redis, &format!("n{i}")))
        .collect();
    let nodes: Vec<&Node> = n.iter().collect();
    campaign(&nodes, "c", 2);
    fleet_ready(&nodes, "c");
    let shown = (0..3)
        .filter(|i| impression_retrying(&n[i % 3], "u", "c") == Some(true))
        .count();
    assert_eq!(shown, 2);
    campaign(&nodes, "c", 3);
    for node in &n {
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            let (st, u) = node.call_retrying("GET", "/v1/users/u/campaigns/c", None);
            assert_eq!(st, 200, "{u}");
            if u["caps"][0]["limit"] == 3 {
                assert_eq!(u["caps"][0]["used"], 2, "{u}");
                break;
            }
            assert!(
                Instant::now() < until,
                "the edit did not reach {}",
                node.base
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    assert_eq!(impression_retrying(&n[1], "u", "c"), Some(true));
    assert_eq!(impression_retrying(&n[2], "u", "c"), Some(false));
    for (i, node) in n.iter().enumerate() {
        let (st, body) = node.call_retrying("DELETE", "/v1/users/u", None);
        assert_eq!(st, 204, "node {i}: {body}");
        for other in &n {
            let (st, u) = other.call_retrying("GET", "/v1/users/u/campaigns/c", None);
            assert_eq!((st, &u["caps"][0]["used"]), (200, &json!(0)), "{u}");
        }
        assert_eq!(impression_retrying(&n[(i + 1) % 3], "u", "c"), Some(true));
    }
}

/// Balanced owners (docs/cluster.md, "Owner mode"): a user that makes most
/// of the requests is measured by its owner and placed by the fleet's table
/// of heavy users on every node; across the table's arrival (a change of
/// owners like a member's) every user still gets exactly its cap, asked
/// through every node.
#[test]
fn a_heavy_user_is_placed_by_the_fleets_table_and_caps_hold_across_it() {
    const CAP: u64 = 3;
    let tmp = tempfile::tempdir().expect("temp dir");
    let redis = Redis::start(&tmp.path().join("redis"), 8000);
    let n: Vec<Node> = (0..3)
        .map(|i| owner_node(tmp.path(), &redis, &format!("n{i}")))
        .collect();
    let nodes: Vec<&Node> = n.iter().collect();
    campaign(&nodes, "c", CAP);
    fleet_ready(&nodes, "c");
    for node in &n {
        assert_eq!(node.metric("freqcap_owner_heavy_users"), Some(0.0));
    }
    // "hot" makes 200 of the ~260 screens (dry: nothing held), through
    // every node; 30 light users make 2 each.
    let screen = |node: &Node, user: &str| {
        let body = json!({"user": user, "candidates": [{"campaign": "c"}], "reserve": false});
        node.call_retrying("POST", "/v1/screen", Some(&body)).0
    };
    for i in 0..200 {
        assert_eq!(screen(&n[i % 3], "hot"), 200);
        if i % 3 == 0 && i < 180 {
            assert_eq!(screen(&n[i % 3], &format!("light{}", i / 6)), 200);
        }
    }
    // Impressions through the table's arrival: reported within 2 s, made at
    // once (the first), applied 6 s later, read by every node by then.
    let until = Instant::now() + Duration::from_secs(20);
    let mut shown: HashMap<String, u64> = HashMap::new();
    let mut round = 0;
    while nodes
        .iter()
        .any(|node| node.metric("freqcap_owner_heavy_users").unwrap_or(0.0) < 1.0)
    {
        assert!(
            Instant::now() < until,
            "the table of heavy users did not reach every node within 20 s"
        );
        for (i, user) in ["hot", "light1", "light2"].iter().enumerate() {
            if impression_retrying(&n[(round + i) % 3], user, "c") == Some(true) {
                *shown.entry((*user).to_owned()).or_default() += 1;
            }
        }
        round += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    for user in ["hot", "light1", "light2", "light3"] {
        for i in 0..(CAP as usize + 2) {
            if impression_retrying(&n[i % 3], user, "c") == Some(true) {
                *shown.entry(user.to_owned()).or_default() += 1;
            }
        }
        // (An impression whose commit answer was lost is not in `shown`.)
        assert!(
            shown.get(user).copied().unwrap_or(0) <= CAP,
            "{user}: {shown:?}"
        );
        for node in &n {
            assert_eq!(used(node, user, "c"), CAP, "{user} on {}", node.base);
        }
    }
}
