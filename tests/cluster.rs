//! Several `freqcap serve` nodes on one Redis Cluster (docs/cluster.md), as
//! real processes: a 3-primary + 3-replica cluster started by
//! ops/redis-cluster.sh (which installs Debian's redis-server if missing) and
//! three freqcap nodes, all on loopback, every process stopped by its PID.
//!
//! One test drives the same users through every node, with faults on the
//! way, and then checks from the acknowledged answers it logged:
//! (a) no (user, campaign) pair has more acknowledged commits than its cap,
//!     and the stored count agrees; (b) every acknowledged commit and event
//!     is stored; (d) a node's kill -9 loses nothing acknowledged and its
//!     holds end at their deadline; (e) a Redis primary's kill -9 fails only
//!     requests for its slots, fast, and with `replicated` loses no
//!     acknowledged commit; (f) writes that apply after the node gave up
//!     (CLIENT PAUSE) are not counted twice.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

mod support;

use support::cluster::{Node, Redis, definition_reached, nodes, redis_cli};

const CAP: u64 = 3;
const USERS: usize = 120;
const CAMPAIGNS: usize = 6;

/// What the load generator saw, per (user, campaign).
#[derive(Default)]
struct Ledger {
    /// Commits acknowledged (200).
    acked: HashMap<(usize, usize), u64>,
    /// Commits whose answer was lost or an error (may have applied).
    ambiguous: HashMap<(usize, usize), u64>,
    /// Screens answered 503 / unreachable.
    failed: u64,
    ok: u64,
}

/// Runs `rounds` ad requests per thread: screen 3 campaigns for a user on
/// one node, commit the first eligible one on a node, record the answers.
fn load(
    nodes: &[Arc<Mutex<Option<Arc<Node>>>>],
    ledger: &Mutex<Ledger>,
    threads: usize,
    rounds: usize,
    affinity: bool,
    seed: u64,
) {
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                let mut x = seed ^ (t as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                let mut next = move || {
                    // xorshift64*: a fixed sequence per thread.
                    x ^= x >> 12;
                    x ^= x << 25;
                    x ^= x >> 27;
                    x.wrapping_mul(0x2545_F491_4F6C_DD1D)
                };
                for _ in 0..rounds {
                    let user = (next() % USERS as u64) as usize;
                    let first = (next() % CAMPAIGNS as u64) as usize;
                    let cands: Vec<usize> = (0..3).map(|i| (first + i) % CAMPAIGNS).collect();
                    let pick = |r: u64| {
                        if affinity {
                            user % nodes.len()
                        } else {
                            (r % nodes.len() as u64) as usize
                        }
                    };
                    let screen_node = nodes[pick(next())].lock().unwrap().clone();
                    let commit_node = nodes[pick(next())].lock().unwrap().clone();
                    let (Some(sn), Some(cn)) = (screen_node, commit_node) else {
                        ledger.lock().unwrap().failed += 1;
                        continue;
                    };
                    let body = json!({
                        "user": format!("u{user}"),
                        "candidates": cands.iter().map(|c| json!({"campaign": format!("c{c}")})).collect::<Vec<_>>(),
                        "reserve": true,
                        "ttl_ms": 1000,
                    });
                    let (st, out) = sn.call("POST", "/v1/screen", Some(&body));
                    if st != 200 {
                        ledger.lock().unwrap().failed += 1;
                        continue;
                    }
                    let Some(id) = out["reservation"].as_str() else {
                        ledger.lock().unwrap().ok += 1;
                        continue;
                    };
                    let Some(win) = out["results"]
                        .as_array()
                        .and_then(|r| r.iter().position(|c| c["eligible"] == true))
                    else {
                        continue;
                    };
                    let camp = cands[win];
                    let (st, _) = cn.call(
                        "POST",
                        &format!("/v1/reservations/{id}/commit"),
                        Some(&json!({"campaign": format!("c{camp}")})),
                    );
                    let mut l = ledger.lock().unwrap();
                    l.ok += 1;
                    if st == 200 {
                        *l.acked.entry((user, camp)).or_default() += 1;
                    } else {
                        *l.ambiguous.entry((user, camp)).or_default() += 1;
                    }
                }
            });
        }
    });
}

/// Checks (a) and (b) against what node `n` reads from the cluster.
fn check_ledger(n: &Node, ledger: &Ledger) -> u64 {
    let mut total = 0;
    for user in 0..USERS {
        for camp in 0..CAMPAIGNS {
            let acked = ledger.acked.get(&(user, camp)).copied().unwrap_or(0);
            let ambiguous = ledger.ambiguous.get(&(user, camp)).copied().unwrap_or(0);
            assert!(
                acked <= CAP,
                "u{user} c{camp}: {acked} acknowledged commits, cap {CAP}"
            );
            // A read may meet a shard still settling after a failover:
            // 503 `unavailable` says nothing was read and to retry, as a
            // client would (bounded: 3 s).
            let path = format!("/v1/users/u{user}/campaigns/c{camp}");
            let mut read = n.call("GET", &path, None);
            for _ in 0..30 {
                if read.0 != 503 {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
                read = n.call("GET", &path, None);
            }
            let (st, u) = read;
            assert_eq!(st, 200, "usage of u{user} c{camp}: {u}");
            let used = u["caps"][0]["used"].as_u64().unwrap_or(u64::MAX);
            assert!(used <= CAP, "u{user} c{camp}: stored {used}, cap {CAP}");
            assert!(
                used >= acked && used <= acked + ambiguous,
                "u{user} c{camp}: stored {used}, acknowledged {acked}, ambiguous {ambiguous}"
            );
            total += acked;
        }
    }
    total
}

#[test]
fn three_nodes_on_a_redis_cluster_behave_as_one_through_faults() {
    let tmp = tempfile::tempdir().expect("temp dir");
    const BASE: u16 = 7410;
    let redis = Redis::start(&tmp.path().join("redis"), BASE);
    let start = |i: usize| {
        Arc::new(Node::start(
            &tmp.path().join(format!("n{i}")),
            &redis.seeds,
            &format!("n{i}"),
        ))
    };
    let nodes: Vec<Arc<Mutex<Option<Arc<Node>>>>> = (0..3)
        .map(|i| Arc::new(Mutex::new(Some(start(i)))))
        .collect();
    let node = |i: usize| nodes[i].lock().unwrap().clone().expect("node is up");

    // Definitions put on one node reach the others (polled every 250 ms).
    for c in 0..CAMPAIGNS {
        let def = json!({"caps": [{"kind": "window", "limit": CAP, "window": "1h"}]});
        let (st, body) = node(0).call_retrying("PUT", &format!("/v1/campaigns/c{c}"), Some(&def));
        assert_eq!(st, 200, "{body}");
    }
    // A campaign-scope rate is leased as a token line: accepted (it was
    // refused, naming caps[0], before issue 25's items 4-5).
    let rate = json!({"caps": [{"kind": "rate", "rate": 9, "per": "1s", "scope": "campaign"}]});
    let (st, body) = node(0).call_retrying("PUT", "/v1/campaigns/b", Some(&rate));
    assert_eq!(st, 200, "{body}");
    definition_reached(
        [&*node(1), &*node(2)],
        &format!("/v1/campaigns/c{}", CAMPAIGNS - 1),
    );

    let ledger = Mutex::new(Ledger::default());
    // Spread: each request on a random node.
    load(&nodes, &ledger, 4, 150, false, 1);
    // Affinity: each user on one node.
    load(&nodes, &ledger, 4, 150, true, 2);

    // (d) kill -9 of a node mid-load, with holds it made still open.
    let killer = {
        let n2 = nodes[2].clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            if let Some(n) = n2.lock().unwrap().take() {
                // Other threads may still hold it: kill the process itself.
                let pid = n.child.id() as i32;
                // SAFETY: kill(2) on our own child, not yet reaped.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        })
    };
    load(&nodes, &ledger, 4, 150, false, 3);
    killer.join().unwrap();
    // Holds the dead node made end at their deadline (1 s): after it, no
    // user shows anything pending.
    std::thread::sleep(Duration::from_millis(1300));
    for user in 0..USERS {
        for camp in 0..CAMPAIGNS {
            let (_, u) = node(0).call("GET", &format!("/v1/users/u{user}/campaigns/c{camp}"), None);
            assert_eq!(u["caps"][0]["pending"], 0, "u{user} c{camp}: {u}");
        }
    }
    let acked = check_ledger(&node(0), &ledger.lock().unwrap());
    assert!(
        acked > 100,
        "the load committed too little to test anything: {acked}"
    );
    // The node comes back.
    *nodes[2].lock().unwrap() = Some(start(2));

    // (f) a primary paused for writes: calls past their 100 ms deadline
    // apply later; retries and later decisions must not count them twice.
    let primaries = redis.primaries(BASE);
    assert_eq!(primaries.len(), 3, "three primaries");
    redis_cli(primaries[0], &["CLIENT", "PAUSE", "400", "WRITE"]);
    load(&nodes, &ledger, 4, 100, false, 4);
    check_ledger(&node(0), &ledger.lock().unwrap());

    // (e) kill -9 of a primary: its replica takes over; meanwhile only its
    // slots' requests fail, fast; with `replicated`, nothing acknowledged is
    // lost.
    let victim = primaries[1];
    // SAFETY: kill(2) on a redis-server this test's script started.
    unsafe { libc::kill(redis.pid(victim), libc::SIGKILL) };
    let before = ledger.lock().unwrap().failed;
    let t = Instant::now();
    load(&nodes, &ledger, 4, 60, false, 5);
    let during = t.elapsed();
    let failed = ledger.lock().unwrap().failed - before;
    assert!(
        failed < 240,
        "every request failed while one shard of three was down"
    );
    // Until the replica is promoted, requests keep coming; wait for it
    // (bounded) and for the others to see it.
    let promoted = (0..150).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        redis.primaries(BASE).len() == 3
    });
    assert!(promoted, "no replica took over within 15 s");
    load(&nodes, &ledger, 4, 100, false, 6);
    let total = check_ledger(&node(1), &ledger.lock().unwrap());
    let l = ledger.lock().unwrap();
    eprintln!(
        "cluster test: {total} acknowledged commits, {} ambiguous, {} screens failed ({failed} while a primary was down, {during:?} for 240 requests)",
        l.ambiguous.values().sum::<u64>(),
        l.failed
    );
    drop(l);
    let log = node(0).log.lock().unwrap().len();
    assert!(log > 0);
}

#[test]
fn events_are_counted_once_cluster_wide() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let redis = Redis::start(&tmp.path().join("redis"), 7430);
    let a = Node::start(&tmp.path().join("a"), &redis.seeds, "a");
    let b = Node::start(&tmp.path().join("b"), &redis.seeds, "b");
    let def = json!({"caps": [{"kind": "window", "limit": 10, "window": "1h"}]});
    assert_eq!(a.call_retrying("PUT", "/v1/campaigns/c", Some(&def)).0, 200);
    definition_reached([&b], "/v1/campaigns/c");
    let ev = json!({"user": "u1", "campaign": "c", "event_id": "imp-1"});
    // Counted once. (Should a first try get 503 after its write applied, a
    // replica not confirming it in time, the retry finds it counted and
    // answers it as a duplicate.)
    let (st, body) = a.call_retrying("POST", "/v1/events", Some(&ev));
    let once = body["counted"].as_u64().unwrap_or(0) + body["duplicates"].as_u64().unwrap_or(0);
    assert_eq!((st, once), (200, 1), "{body}");
    let (st, body) = b.call_retrying("POST", "/v1/events", Some(&ev));
    assert_eq!((st, body["counted"].as_u64()), (200, Some(0)), "{body}");
    let (_, u) = b.call("GET", "/v1/users/u1/campaigns/c", None);
    assert_eq!(u["caps"][0]["used"], 1, "{u}");
    // A reservation made on a, committed on b, repeated on a: one impression.
    let s = json!({"user": "u2", "candidates": [{"campaign": "c"}], "reserve": true});
    let (_, out) = a.call_retrying("POST", "/v1/screen", Some(&s));
    let id = out["reservation"].as_str().expect("reserved").to_owned();
    let path = format!("/v1/reservations/{id}/commit");
    assert_eq!(b.call_retrying("POST", &path, Some(&json!({}))).0, 200);
    assert_eq!(a.call_retrying("POST", &path, Some(&json!({}))).0, 200);
    let (_, u) = a.call("GET", "/v1/users/u2/campaigns/c", None);
    assert_eq!(u["caps"][0]["used"], 1, "{u}");
    // The cluster's figures are exported.
    let r = a
        .agent
        .get(format!("{}/metrics", a.base))
        .call()
        .expect("metrics")
        .body_mut()
        .read_to_string()
        .expect("text");
    for name in [
        "freqcap_cas_total",
        "freqcap_cas_conflicts_total",
        "freqcap_redis_calls_total",
        "freqcap_redis_timeouts_total",
        "freqcap_redis_call_seconds_bucket",
    ] {
        assert!(r.contains(name), "{name} missing from /metrics");
    }
    let cas: f64 = r
        .lines()
        .find_map(|l| l.strip_prefix("freqcap_cas_total "))
        .and_then(|v| v.trim().parse().ok())
        .expect("freqcap_cas_total has a value");
    assert!(
        cas >= 2.0,
        "a's event and screen each wrote a record: {cas}"
    );
    // Ready while Redis answers; not ready (503) once it stops answering.
    assert_eq!(a.call("GET", "/readyz", None).0, 200);
    drop(redis);
    let unready = (0..100).any(|_| {
        a.call("GET", "/readyz", None).0 == 503 || {
            std::thread::sleep(Duration::from_millis(100));
            false
        }
    });
    assert!(unready, "still ready 10 s after Redis stopped");
}

/// (c) a budget is never over-delivered in total, and at least 99 % of it
/// is delivered when demand is three times the budget; a campaign cap is
/// exact. Leases, through three nodes.
#[test]
fn leased_budgets_and_campaign_caps_hold_across_nodes() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let redis = Redis::start(&tmp.path().join("redis"), 7450);
    let nodes = nodes(tmp.path(), &redis, 3, &[]);
    const BUDGET: u64 = 200;
    const CAMPAIGN_CAP: u64 = 40;
    let defs = [
        (
            "bud",
            json!({"budget": {"amount": BUDGET, "per": "1d", "pacing": "asap"}}),
        ),
        (
            "cap",
            json!({"caps": [{"kind": "window", "limit": CAMPAIGN_CAP, "window": "1d", "align": "fixed", "scope": "campaign"}]}),
        ),
    ];
    for (name, def) in &defs {
        let (st, body) = nodes[0].call_retrying("PUT", &format!("/v1/campaigns/{name}"), Some(def));
        assert_eq!(st, 200, "{body}");
    }
    definition_reached(&nodes[1..], "/v1/campaigns/cap");
    // Demand: 3 × the budget in impressions of cost 1..=3 (mean 2), and 3 ×
    // the cap, spread over the nodes by four threads; every acknowledged
    // commit is logged with its cost.
    let acked = Mutex::new(HashMap::<&str, u64>::new());
    // Impressions of mean cost 2: 3 × the budget in units.
    let demand = (3 * BUDGET / 2) as usize + 20;
    // Paced, 30 requests a second a thread (about 5 s in all): with most
    // commits on another node than their screen, a hold's units are counted
    // twice until its maker reads the committing node's notice and reports
    // them given (a sweep, 250 ms), so an unpaced burst of 3 s ended with
    // 134–140 of 200 delivered (issue 47; docs/cluster.md).
    let began = Instant::now();
    std::thread::scope(|s| {
        for t in 0..4usize {
            let nodes = &nodes;
            let acked = &acked;
            s.spawn(move || {
                for i in 0..2 * (demand / 4) {
                    let due = began + Duration::from_millis(i as u64 * 1000 / 30);
                    if let Some(d) = due.checked_duration_since(Instant::now()) {
                        std::thread::sleep(d);
                    }
                    let node = &nodes[(t + i) % nodes.len()];
                    let camp = if i % 2 == 0 { "bud" } else { "cap" };
                    let cost = 1 + ((t + i) % 3) as u64;
                    let body = json!({"user": format!("u{t}-{i}"), "candidates": [{"campaign": camp, "cost": cost}], "reserve": true, "ttl_ms": 2000});
                    let (st, out) = node.call("POST", "/v1/screen", Some(&body));
                    let Some(id) = out["reservation"].as_str().filter(|_| st == 200) else {
                        continue;
                    };
                    let commit_node = &nodes[(t + i + 1) % nodes.len()];
                    let (st, _) = commit_node.call_retrying(
                        "POST",
                        &format!("/v1/reservations/{id}/commit"),
                        Some(&json!({})),
                    );
                    if st == 200 {
                        let units = if camp == "bud" { cost } else { 1 };
                        *acked.lock().unwrap().entry(camp).or_default() += units;
                    }
                }
            });
        }
    });
    let acked = acked.into_inner().unwrap();
    let (bud, cap) = (
        acked.get("bud").copied().unwrap_or(0),
        acked.get("cap").copied().unwrap_or(0),
    );
    eprintln!(
        "leases: budget {BUDGET}: {bud} delivered; campaign cap {CAMPAIGN_CAP}: {cap} delivered"
    );
    assert!(bud <= BUDGET, "budget over-delivered: {bud} > {BUDGET}");
    assert!(
        cap <= CAMPAIGN_CAP,
        "campaign cap exceeded: {cap} > {CAMPAIGN_CAP}"
    );
    // Short by at most what each node's grant can be left holding below the
    // next impression's cost (costs 1 to 3: 2 units a node). Measured
    // 197-199 of 200; a bound of 99 % (198) failed once at 197 (2026-12-06).
    let stranded = nodes.len() as u64 * 2;
    assert!(
        bud >= BUDGET - stranded,
        "budget under-delivered: {bud} of {BUDGET} (at most {stranded} may be stranded)"
    );
    assert_eq!(cap, CAMPAIGN_CAP, "campaign cap under-delivered");
    // One truth: every node answers the fleet's delivery and campaign-scope
    // use, what was acknowledged through all three (at d5eefae each node
    // answered its own share, about a third). A commit made on another node
    // than its screen's counts once the screening node learns of it, at the
    // hold's deadline (ttl_ms 2 s here, plus a sweep): polled for 15 s.
    let agree = |k: usize, n: &Node| {
        let until = Instant::now() + Duration::from_secs(15);
        loop {
            let (_, d) = n.call_retrying("GET", "/v1/campaigns/bud/delivery", None);
            let (_, u) = n.call_retrying("GET", "/v1/users/nobody/campaigns/cap", None);
            if (d["spent"] == json!(bud) && u["caps"][0]["used"] == json!(cap))
                || Instant::now() > until
            {
                return (k, d["spent"].clone(), u["caps"][0]["used"].clone());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    for (k, n) in nodes.iter().enumerate() {
        let (k, spent, used) = agree(k, n);
        eprintln!(
            "one truth: node {k}: delivery spent {spent}, campaign cap used {used}; acknowledged {bud} and {cap}"
        );
        assert_eq!(spent, json!(bud), "node {k}'s delivery");
        assert_eq!(used, json!(cap), "node {k}'s campaign-scope usage");
    }

    // max_in_flight: holds (not committed) taken round robin over the nodes
    // never exceed it in all.
    const IN_FLIGHT: usize = 5;
    let def = json!({"max_in_flight": IN_FLIGHT});
    let (st, body) = nodes[0].call_retrying("PUT", "/v1/campaigns/fl", Some(&def));
    assert_eq!(st, 200, "{body}");
    definition_reached(&nodes[1..], "/v1/campaigns/fl");
    let held = (0..4 * IN_FLIGHT)
        .filter(|i| {
            let body = json!({"user": format!("f{i}"), "candidates": [{"campaign": "fl"}], "reserve": true, "ttl_ms": 60_000});
            let (st, out) = nodes[i % nodes.len()].call("POST", "/v1/screen", Some(&body));
            st == 200 && out["results"][0]["eligible"] == true
        })
        .count();
    eprintln!("leases: max_in_flight {IN_FLIGHT}: {held} held at once through 3 nodes");
    assert!(
        held <= IN_FLIGHT,
        "max_in_flight exceeded: {held} > {IN_FLIGHT}"
    );
    assert!(held >= 3, "every node should get a slot: {held}");
}

/// (d) A budget survives a dead node: a node's unspent grant goes back to
/// the pool once its grant and its open holds' deadlines have passed
/// (seconds), so ≥ 99 % of a budget is delivered, and never more, with a
/// node killed (`kill -9`) and restarted a third of the way in. At d5eefae
/// the dead node's headroom stayed stranded for an hour (79–82 % delivered).
#[test]
fn a_budget_is_delivered_after_a_node_dies() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let redis = Redis::start(&tmp.path().join("redis"), 7570);
    let start = |i: usize| {
        Node::start(
            &tmp.path().join(format!("n{i}")),
            &redis.seeds,
            &format!("n{i}"),
        )
    };
    let mut nodes: Vec<Node> = (0..3).map(start).collect();
    const BUDGET: u64 = 300;
    let def = json!({"budget": {"amount": BUDGET, "per": "1d", "pacing": "asap"}});
    let (st, body) = nodes[0].call_retrying("PUT", "/v1/campaigns/dead", Some(&def));
    assert_eq!(st, 200, "{body}");
    definition_reached(&nodes[1..], "/v1/campaigns/dead");
    // One impression of cost 1, screened and committed on the same node
    // (affinity: a dead node's holds committed elsewhere are another case,
    // docs/cluster.md); true if acknowledged.
    let serve = |nodes: &[Node], i: usize| {
        let n = &nodes[i % nodes.len()];
        let body = json!({"user": format!("d{i}"), "candidates": [{"campaign": "dead", "cost": 1}], "reserve": true, "ttl_ms": 1000});
        let (st, out) = n.call("POST", "/v1/screen", Some(&body));
        let Some(id) = out["reservation"].as_str().filter(|_| st == 200) else {
            return false;
        };
        if out["results"][0]["eligible"] != true {
            return false;
        }
        let (st, _) = n.call_retrying(
            "POST",
            &format!("/v1/reservations/{id}/commit"),
            Some(&json!({})),
        );
        st == 200
    };
    let (mut delivered, mut i) = (0u64, 0usize);
    while delivered < BUDGET / 3 && i < 20_000 {
        delivered += u64::from(serve(&nodes, i));
        i += 1;
    }
    nodes[2].kill9();
    nodes[2] = start(2);
    // Demand goes on, well past the budget, for 30 s at most.
    let until = Instant::now() + Duration::from_secs(30);
    while delivered < BUDGET && Instant::now() < until {
        delivered += u64::from(serve(&nodes, i));
        i += 1;
    }
    eprintln!("dead node: budget {BUDGET}: {delivered} delivered over {i} requests");
    assert!(delivered <= BUDGET, "over-delivered: {delivered}");
    assert!(
        delivered * 100 >= BUDGET * 99,
        "under-delivered after a node's death: {delivered} of {BUDGET}"
    );
}

/// Three nodes on a cluster with one campaign capped at 10 per hour, its
/// definition seen by every node.
fn three_nodes(tmp: &Path, redis: &Redis, camp: &str) -> Vec<Node> {
    let nodes = nodes(tmp, redis, 3, &[]);
    let def = json!({"caps": [{"kind": "window", "limit": 10, "window": "1h"}]});
    let (st, body) = nodes[0].call_retrying("PUT", &format!("/v1/campaigns/{camp}"), Some(&def));
    assert_eq!(st, 200, "{body}");
    definition_reached(&nodes[1..], &format!("/v1/campaigns/{camp}"));
    nodes
}

fn used(n: &Node, user: &str, camp: &str) -> Value {
    let (st, u) = n.call("GET", &format!("/v1/users/{user}/campaigns/{camp}"), None);
    assert_eq!(st, 200, "{u}");
    u["caps"][0]["used"].clone()
}

/// A screen under the caller's `reservation_id`, repeated on another node
/// (a retry after a lost answer), is the same reservation: one hold, one
/// debit at commit; a different body under the id is a conflict; a commit
/// and a release retried on other nodes are one operation each.
#[test]
fn a_repeated_reservation_id_is_one_hold_on_any_node() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let redis = Redis::start(&tmp.path().join("redis"), 7530);
    let n = three_nodes(tmp.path(), &redis, "c");
    let screen = json!({"user": "u1", "candidates": [{"campaign": "c"}], "reserve": true,
        "reservation_id": "client-r1", "ttl_ms": 30_000});
    let (st, first) = n[0].call_retrying("POST", "/v1/screen", Some(&screen));
    assert_eq!(
        (st, first["reservation"].as_str()),
        (200, Some("client-r1")),
        "{first}"
    );
    let (st, again) = n[1].call_retrying("POST", "/v1/screen", Some(&screen));
    assert_eq!(st, 200, "{again}");
    assert_eq!(again, first, "a repeat gets the first answer");
    // The same id with another body: 409 on any node.
    let other = json!({"user": "u1", "candidates": [{"campaign": "c", "cost": 2}], "reserve": true,
        "reservation_id": "client-r1", "ttl_ms": 30_000});
    let (st, body) = n[2].call_retrying("POST", "/v1/screen", Some(&other));
    assert_eq!(st, 409, "{body}");
    let (_, u) = n[2].call("GET", "/v1/users/u1/campaigns/c", None);
    assert_eq!(u["caps"][0]["pending"], 1, "one hold, not two: {u}");
    let commit = json!({"user": "u1"});
    let (st, body) = n[2].call_retrying("POST", "/v1/reservations/client-r1/commit", Some(&commit));
    assert_eq!(st, 200, "{body}");
    // The commit retried on the other nodes: the same answer, no debit.
    for node in &n[..2] {
        let (st, b) =
            node.call_retrying("POST", "/v1/reservations/client-r1/commit", Some(&commit));
        assert_eq!((st, &b), (200, &body), "a repeated commit");
    }
    // A screen under the settled id is refused, as on one node.
    let (st, body) = n[1].call_retrying("POST", "/v1/screen", Some(&screen));
    assert_eq!(st, 409, "{body}");
    for node in &n {
        assert_eq!(used(node, "u1", "c"), 1, "one impression, one debit");
    }
    // A release retried on other nodes: one release, nothing debited.
    let screen2 = json!({"user": "u2", "candidates": [{"campaign": "c"}], "reserve": true,
        "reservation_id": "client-r2", "ttl_ms": 30_000});
    assert_eq!(
        n[0].call_retrying("POST", "/v1/screen", Some(&screen2)).0,
        200
    );
    assert_eq!(
        n[1].call_retrying("POST", "/v1/screen", Some(&screen2)).0,
        200
    );
    let release = json!({"user": "u2"});
    let (st, body) =
        n[1].call_retrying("POST", "/v1/reservations/client-r2/release", Some(&release));
    assert_eq!(st, 200, "{body}");
    for node in [&n[2], &n[0]] {
        let (st, b) =
            node.call_retrying("POST", "/v1/reservations/client-r2/release", Some(&release));
        assert_eq!((st, &b), (200, &body), "a repeated release");
    }
    let (st, body) =
        n[2].call_retrying("POST", "/v1/reservations/client-r2/commit", Some(&release));
    assert_eq!(st, 409, "a commit of a released reservation: {body}");
    // A check's reserve repeated on every node: one hold of a limit of 2,
    // so another id still finds room.
    let policy =
        json!({"limits": [{"kind": "window", "limit": 2, "window": "1h", "align": "fixed"}]});
    assert_eq!(
        n[0].call_retrying("PUT", "/v1/policies/p", Some(&policy)).0,
        200
    );
    definition_reached(&n[1..], "/v1/policies/p");
    let check = json!({"policy": "p", "key": "k", "reserve": true, "reservation_id": "client-k1"});
    for node in &n {
        let (st, b) = node.call_retrying("POST", "/v1/check", Some(&check));
        assert_eq!(
            (st, b["reservation"].as_str()),
            (200, Some("client-k1")),
            "{b}"
        );
    }
    let other = json!({"policy": "p", "key": "k", "reserve": true, "reservation_id": "client-k2"});
    let (st, b) = n[1].call_retrying("POST", "/v1/check", Some(&other));
    assert_eq!(st, 200, "one hold of 2, not three: {b}");
    for node in &n {
        let (_, u) = node.call("GET", "/v1/users/u2/campaigns/c", None);
        assert_eq!(
            (&u["caps"][0]["used"], &u["caps"][0]["pending"]),
            (&json!(0), &json!(0)),
            "{u}"
        );
    }
}

/// An `event_id` counts once whichever nodes it reaches and however often,
/// with a user and without.
#[test]
fn an_event_id_counts_once_on_any_node() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let redis = Redis::start(&tmp.path().join("redis"), 7550);
    let n = three_nodes(tmp.path(), &redis, "c");
    let ev = json!({"user": "u1", "campaign": "c", "cost": 7, "event_id": "imp-1"});
    let bare = json!({"campaign": "c", "cost": 7, "event_id": "imp-2"});
    let mut counted = (0, 0);
    for i in [0, 1, 2, 0] {
        let (st, body) = n[i].call_retrying("POST", "/v1/events", Some(&ev));
        assert_eq!(st, 200, "{body}");
        counted.0 += body["counted"].as_u64().unwrap_or(0);
        let (st, body) = n[i].call_retrying("POST", "/v1/events", Some(&bare));
        assert_eq!(st, 200, "{body}");
        counted.1 += body["counted"].as_u64().unwrap_or(0);
    }
    eprintln!(
        "event ids: with a user counted {}, without {} (of 4 posts each)",
        counted.0, counted.1
    );
    // A user's event whose record write applied but was answered 503 (a
    // replica late to confirm, on a loaded machine) is answered as a
    // duplicate on its retry: the user's record, read below on every node,
    // is the count.
    assert!(
        counted.0 <= 1,
        "the user's event counted once at most: {counted:?}"
    );
    assert_eq!(counted.1, 1, "the user-less event counted once");
    for node in &n {
        assert_eq!(
            used(node, "u1", "c"),
            1,
            "the user's cap counts the event once"
        );
    }
}

/// Debian's libfaketime (package `faketime`): preloaded, it shifts every
/// clock the process reads (wall and monotonic) by `FAKETIME`.
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// Screens `user` for `campaign` on `n` and, if eligible, commits it there:
/// whether the impression was allowed. The screen carries the caller's
/// reservation id, as an ad server retrying after a 503 must: a write whose
/// answer was lost (its replica's acknowledgement came late: seen in 2 runs
/// of 4 on a busy 2-core machine) is then the same reservation when retried,
/// not a second hold that denies the first.
fn impression(n: &Node, user: &str, campaign: &str) -> bool {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let body = json!({
        "user": user,
        "candidates": [{"campaign": campaign}],
        "reserve": true,
        "reservation_id": format!("imp-{}-{user}-{seq}", std::process::id()),
    });
    let (st, out) = n.call_retrying("POST", "/v1/screen", Some(&body));
    assert_eq!(st, 200, "{out}");
    if out["results"][0]["eligible"] != true {
        return false;
    }
    let id = out["reservation"].as_str().expect("a reservation id");
    // With the user: a caller's id names no record, and a retried screen's
    // reservation is known to the record, not to this node's table.
    let (st, out) = n.call_retrying(
        "POST",
        &format!("/v1/reservations/{id}/commit"),
        Some(&json!({"user": user})),
    );
    assert_eq!(st, 200, "{out}");
    true
}

/// The value of metric `name` on node `n` (its first sample).
fn metric(n: &Node, name: &str) -> Option<f64> {
    n.metric(name)
}

/// One node's clock 600 s ahead (libfaketime) must not move any decision:
/// every node decides at the cluster's time (Redis's), not its own.
#[test]
fn a_node_minutes_ahead_keeps_caps_exact() {
    assert!(
        Path::new(LIBFAKETIME).exists(),
        "{LIBFAKETIME} is missing: apt-get install faketime (make deps)"
    );
    let tmp = tempfile::tempdir().expect("temp dir");
    let redis = Redis::start(&tmp.path().join("redis"), 7470);
    let n1 = Node::start(&tmp.path().join("n1"), &redis.seeds, "n1");
    let n3 = Node::start_env(
        &tmp.path().join("n3"),
        &redis.seeds,
        "n3",
        &[("LD_PRELOAD", LIBFAKETIME), ("FAKETIME", "+600s")],
    );
    // "1 per 5 minutes" (a gap cap is rate 1 per D, burst 1).
    let def = json!({"caps": [{"kind": "gap", "min": "5m"}]});
    let (st, body) = n1.call_retrying("PUT", "/v1/campaigns/c5", Some(&def));
    assert_eq!(st, 200, "{body}");
    definition_reached([&n3], "/v1/campaigns/c5");

    // The issue's case: B's first impression on n1; n3 (ahead) serves A; n1
    // reads A; B's second impression on n1, 1 s after the first.
    assert!(impression(&n1, "B", "c5"), "B's first impression");
    assert!(impression(&n1, "C", "c5"), "C's first impression");
    assert!(impression(&n3, "A", "c5"), "A's first impression");
    assert!(!impression(&n1, "A", "c5"), "A again, on n1");
    std::thread::sleep(Duration::from_secs(1));
    let b_again = impression(&n1, "B", "c5");
    // n3's own decisions, as if its clock were right: C seen on n1, then
    // on n3 about 1 s later; D on n3, then on n3 and n1.
    assert!(impression(&n3, "D", "c5"), "D's first impression");
    let c_on_n3 = impression(&n3, "C", "c5");
    let d_on_n3 = impression(&n3, "D", "c5");
    let d_on_n1 = impression(&n1, "D", "c5");
    let offset_n1 = metric(&n1, "freqcap_cluster_clock_offset_seconds");
    let offset_n3 = metric(&n3, "freqcap_cluster_clock_offset_seconds");
    eprintln!(
        "clock: n3 +600 s; second impression 1 s later allowed: B on n1 {b_again}, C on n3 {c_on_n3}, D on n3 {d_on_n3}, D on n1 {d_on_n1}; measured offsets n1 {offset_n1:?} s, n3 {offset_n3:?} s"
    );
    assert!(!b_again, "B's second impression on n1 1 s after the first");
    assert!(!c_on_n3, "C's second impression, on n3, 1 s after n1's");
    assert!(!d_on_n3, "D's second impression on n3 1 s after the first");
    assert!(!d_on_n1, "D's second impression, on n1, after n3's");
    // Reported figures follow the cluster's time too: n3 answers C's wait
    // as about 5 minutes less the 1 s since, not 5 minutes less 10.
    let body = json!({"user": "C", "candidates": [{"campaign": "c5"}]});
    let (st, out) = n3.call_retrying("POST", "/v1/screen", Some(&body));
    assert_eq!(st, 200, "{out}");
    eprintln!("clock: C on n3: {}", out["results"][0]);
    let wait = out["results"][0]["denied_by"]["retry_after_ms"]
        .as_u64()
        .unwrap_or(0);
    assert!(
        (290_000..=300_000).contains(&wait),
        "n3 says C waits {wait} ms, not 5 min less the seconds since"
    );
    let offset_n1 = offset_n1.expect("n1 exports freqcap_cluster_clock_offset_seconds");
    let offset_n3 = offset_n3.expect("n3 exports freqcap_cluster_clock_offset_seconds");
    assert!(offset_n1.abs() < 0.5, "n1's offset {offset_n1}");
    assert!((offset_n3 + 600.0).abs() < 1.0, "n3's offset {offset_n3}");
    assert!(
        n3.log
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("clock") && l.contains("Redis")),
        "n3 logs its clock's offset from Redis's"
    );
    drop((n1, n3));
}

/// Envoy's rate limit service on three nodes of one cluster: a request's
/// descriptors live in different slots, and every request is still all or
/// nothing and the limits exact fleet-wide (issue 25). Before, a node with
/// `--rls-config` and a cluster store refused to start. Rules: tests/rls/
/// (`shared` 30 a day, `wide` 1000 a day).
#[test]
fn envoys_rate_limit_service_is_all_or_nothing_across_nodes() {
    use freqcap::rls::pb::{
        RateLimitDescriptor, RateLimitRequest, rate_limit_descriptor::Entry,
        rate_limit_response::Code, rate_limit_service_client::RateLimitServiceClient,
    };
    support::away_from_midnight();
    let tmp = tempfile::tempdir().expect("temp dir");
    let redis = Redis::start(&tmp.path().join("redis"), 7590);
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/rls");
    let extra = [
        "--rls-config",
        rules.to_str().expect("utf-8 path"),
        "--grpc-listen",
        "127.0.0.1:0",
    ];
    let nodes = nodes(tmp.path(), &redis, 3, &extra);
    let addrs: Vec<String> = nodes
        .iter()
        .map(|n| support::logged_addr(&n.log, "gRPC listening on "))
        .collect();
    let desc = |k: &str, v: &str| RateLimitDescriptor {
        entries: vec![Entry {
            key: k.into(),
            value: v.into(),
        }],
        ..Default::default()
    };
    let request = |hits| RateLimitRequest {
        domain: "internal".into(),
        descriptors: vec![desc("shared", "s"), desc("wide", "w")],
        hits_addend: hits,
    };
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    // 20 requests from each node's client, the three at once: 60 for a
    // descriptor of 30 a day.
    let (allowed, failed, mixed) = rt.block_on(async {
        let mut calls = tokio::task::JoinSet::new();
        for addr in &addrs {
            let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                .expect("an address")
                .connect()
                .await
                .expect("connects");
            let mut c = RateLimitServiceClient::new(ch);
            let r = request(0);
            calls.spawn(async move {
                let (mut allowed, mut failed, mut mixed) = (0, 0, 0);
                for _ in 0..20 {
                    match c.should_rate_limit(r.clone()).await {
                        Ok(a) => {
                            let a = a.into_inner();
                            allowed += usize::from(a.overall_code == Code::Ok as i32);
                            // All or nothing: wide allows in every answer
                            // (it has room), shared decides.
                            let over = a.overall_code == Code::OverLimit as i32;
                            mixed += usize::from(
                                (a.statuses[0].code == Code::OverLimit as i32) != over
                                    || a.statuses[1].code != Code::Ok as i32,
                            );
                        }
                        // A write Redis could not confirm in time: the
                        // request may or may not have counted.
                        Err(e) => {
                            eprintln!("rls: {e}");
                            failed += 1
                        }
                    }
                }
                (allowed, failed, mixed)
            });
        }
        calls
            .join_all()
            .await
            .into_iter()
            .fold((0, 0, 0), |t, x| (t.0 + x.0, t.1 + x.1, t.2 + x.2))
    });
    // What wide used, as each node reads it (a request with hits 0 looks).
    let remaining: Vec<u32> = rt.block_on(async {
        let mut out = Vec::new();
        for addr in &addrs {
            let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                .expect("an address")
                .connect()
                .await
                .expect("connects");
            let mut c = RateLimitServiceClient::new(ch);
            let look = RateLimitRequest {
                descriptors: vec![desc("wide", "w")],
                ..request(0)
            };
            // A look counts 1 (Envoy's hits_addend 0 means 1): read the
            // remaining it reports, then account for the looks.
            let a = c.should_rate_limit(look).await.expect("answers");
            out.push(a.into_inner().statuses[0].limit_remaining);
        }
        out
    });
    eprintln!(
        "rls across 3 nodes: {allowed} allowed of 60 (limit 30), {failed} failed, wide remaining {remaining:?}"
    );
    assert_eq!(mixed, 0, "an answer that was not all or nothing");
    assert!(allowed <= 30, "{allowed} allowed over a limit of 30");
    assert!(
        allowed + failed >= 30,
        "{allowed} allowed with {failed} failures: the limit was not reached"
    );
    // wide counted each allowed request once, and each look; a failed one
    // at most once.
    let used = 1000 - remaining[2] as usize - 3;
    assert!(
        (allowed..=allowed + failed).contains(&used),
        "wide used {used} for {allowed} allowed ({failed} failed)"
    );
    assert_eq!(remaining[0] - 1, remaining[1]);
    drop(nodes);
}

/// With one primary paused (`CLIENT PAUSE WRITE`), users whose records live on
/// the other primaries are answered at once, not after the paused ones' calls
/// time out (issue 25, "no lock is held across a Redis round trip"). Before,
/// the hot tier's shard lock was held across the Redis call, so a paused
/// user's write (2 s deadline here) held up every user sharing its shard
/// (1/64 of users each). The measure is an order, not a time: every user
/// answered 200 must be answered before the first paused user's 503.
#[test]
fn a_paused_primary_holds_up_only_its_own_users() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let base = 7490;
    let redis = Redis::start(&tmp.path().join("redis"), base);
    let node = Node::start_with(
        &tmp.path().join("n1"),
        &redis.seeds,
        "n1",
        &[],
        &["--redis-timeout-ms", "2000"],
    );
    let def = json!({"caps": [{"kind": "window", "limit": 5, "window": "1d"}]});
    let (st, body) = node.call_retrying("PUT", "/v1/campaigns/c", Some(&def));
    assert_eq!(st, 200, "{body}");
    let primaries = redis.primaries(base);
    assert_eq!(primaries.len(), 3, "three primaries");
    let paused = redis_cli(primaries[0], &["CLIENT", "PAUSE", "8000", "WRITE"]);
    assert!(paused.contains("OK"), "CLIENT PAUSE: {paused}");
    let started = Instant::now();
    // 120 users at once, each screened once: about a third live on the
    // paused primary.
    // (status, whether a Redis call ran out of time, when answered)
    let answers: Vec<(u16, bool, Duration)> = std::thread::scope(|s| {
        let calls: Vec<_> = (0..120)
            .map(|i| {
                let node = &node;
                s.spawn(move || {
                    let body = json!({"user": format!("p{i}"), "candidates": [{"campaign": "c"}]});
                    let (st, out) = node.call("POST", "/v1/screen", Some(&body));
                    let text = out.to_string();
                    let timed_out = text.contains("no answer within") || text.contains("timed out");
                    (st, timed_out, started.elapsed())
                })
            })
            .collect();
        calls
            .into_iter()
            .map(|c| c.join().expect("a client thread"))
            .collect()
    });
    let _ = redis_cli(primaries[0], &["CLIENT", "UNPAUSE"]);
    // The paused users: their write ran out of time (a 503 of a replica's
    // late WAIT comes at once and says so otherwise).
    let first_failed = answers
        .iter()
        .filter(|(st, timed_out, _)| *st == 503 && *timed_out)
        .map(|(_, _, t)| *t)
        .min();
    let served: Vec<Duration> = answers
        .iter()
        .filter(|(st, _, _)| *st == 200)
        .map(|(_, _, t)| *t)
        .collect();
    let late = served
        .iter()
        .filter(|t| first_failed.is_some_and(|f| **t >= f))
        .count();
    eprintln!(
        "paused primary: {} answered 200 (latest after {:?}), first 503 after {first_failed:?}, {late} answered 200 after it; statuses {:?}",
        served.len(),
        served.iter().max(),
        answers
            .iter()
            .map(|a| a.0)
            .collect::<std::collections::BTreeSet<_>>()
    );
    let first_failed =
        first_failed.expect("some users live on the paused primary (503, no answer in time)");
    assert!(served.len() >= 40, "the other primaries' users were served");
    assert!(
        answers.iter().all(|(st, _, _)| *st == 200 || *st == 503),
        "only 200 and 503"
    );
    assert_eq!(
        late, 0,
        "users of healthy primaries answered after a paused user's call timed out ({first_failed:?})"
    );
}

/// A node started while a primary is dead and its replica not yet promoted
/// (its address the first seed) serves as soon as the failover is over,
/// instead of exiting (issue 25, "fail well": before, it exited at once with
/// "cannot reach Redis ... Connection refused").
#[test]
fn a_node_started_during_a_failover_serves_once_redis_does() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let base = 7510;
    let redis = Redis::start(&tmp.path().join("redis"), base);
    let primaries = redis.primaries(base);
    // The first seed, if it is a primary (else any primary).
    let victim = primaries
        .iter()
        .copied()
        .find(|p| *p == base)
        .unwrap_or(primaries[0]);
    // SAFETY: a pid the cluster script recorded for its own redis-server.
    unsafe { libc::kill(redis.pid(victim), libc::SIGKILL) };
    let node = Node::start(&tmp.path().join("n1"), &redis.seeds, "n1");
    let waited = node
        .log
        .lock()
        .unwrap()
        .iter()
        .any(|l| l.contains("waiting for Redis") || l.contains("Redis answers after"));
    let def = json!({"caps": [{"kind": "window", "limit": 3, "window": "1d"}]});
    let (st, body) = node.call_retrying("PUT", "/v1/campaigns/c", Some(&def));
    assert_eq!(st, 200, "{body}");
    let served = (0..30)
        .filter(|i| {
            let body = json!({"user": format!("f{i}"), "candidates": [{"campaign": "c"}]});
            node.call_retrying("POST", "/v1/screen", Some(&body)).0 == 200
        })
        .count();
    eprintln!("failover: the node waited for Redis: {waited}; {served} of 30 screens served");
    assert!(waited, "the node logged that it waited for Redis");
    assert_eq!(served, 30, "every user served once the failover is over");
}

/// The commits of every minute of `camp`'s timeline on node `n` (0 when the
/// node cannot answer).
fn timeline_commits(n: &Node, camp: &str) -> u64 {
    let (st, t) = n.call("GET", &format!("/v1/campaigns/{camp}/timeline"), None);
    if st != 200 {
        return 0;
    }
    t["minutes"]
        .as_array()
        .map(|m| m.iter().filter_map(|b| b["commits"].as_u64()).sum())
        .unwrap_or(0)
}

/// The campaigns node `n` exports per-campaign series for, sorted.
fn exported_campaigns(n: &Node) -> Vec<String> {
    let url = format!("{}/metrics", n.base);
    let Ok(mut r) = n.agent.get(&url).call() else {
        return Vec::new();
    };
    let text = r.body_mut().read_to_string().unwrap_or_default();
    let mut out: Vec<String> = text
        .lines()
        .filter(|l| l.starts_with("freqcap_campaign_commits"))
        .filter_map(|l| l.split("campaign=\"").nth(1)?.split('"').next())
        .map(str::to_owned)
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Polls `f` (every 100 ms, `secs` at most) until it holds.
fn within(secs: u64, what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..secs * 10 {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("not within {secs} s: {what}");
}

/// A campaign's timeline (and so /ui) is the fleet's (issue 25): commits
/// made on three nodes show on every node, a node's kill -9 and restart
/// loses none of them (it flushed before it died), and every node exports
/// the same most active campaign in its per-campaign metrics.
#[test]
fn timelines_and_top_metrics_are_the_fleets() {
    let tmp = tempfile::tempdir().unwrap();
    let redis = Redis::start(&tmp.path().join("redis"), 7600);
    let env = [("FREQCAP_METRICS_TOP", "1")];
    let start = |i: usize| {
        Node::start_env(
            &tmp.path().join(format!("n{i}")),
            &redis.seeds,
            &format!("n{i}"),
            &env,
        )
    };
    let mut nodes: Vec<Node> = (0..3).map(start).collect();
    let def = json!({"caps": [{"kind": "window", "limit": 1000, "window": "1h"}]});
    // tb has a budget too: its figures in /metrics read the fleet's spend.
    let budgeted = json!({
        "caps": [{"kind": "window", "limit": 1000, "window": "1h"}],
        "budget": {"amount": 100000, "per": "1d", "pacing": "asap"},
    });
    for camp in ["ta", "tb", "tc"] {
        let path = format!("/v1/campaigns/{camp}");
        let def = if camp == "tb" { &budgeted } else { &def };
        let (st, body) = nodes[0].call_retrying("PUT", &path, Some(def));
        assert_eq!(st, 200, "{body}");
        definition_reached(&nodes[1..], &path);
    }
    // tb is the fleet's most active (6 commits), but no node's own: n0 saw
    // only ta (5), n1 3 of tb, n2 3 of tb and 4 of tc.
    let plan = [(0, "ta", 5), (1, "tb", 3), (2, "tb", 3), (2, "tc", 4)];
    let mut acked: HashMap<&str, u64> = HashMap::new();
    for (i, camp, n) in plan {
        for k in 0..n {
            if impression(&nodes[i], &format!("tl-{i}-{k}"), camp) {
                *acked.entry(camp).or_default() += 1;
            }
        }
    }
    assert_eq!(acked.values().sum::<u64>(), 15, "{acked:?}");
    let fleet_figures = |nodes: &[Node]| {
        nodes.iter().all(|n| {
            acked
                .iter()
                .all(|(camp, want)| timeline_commits(n, camp) == *want)
        })
    };
    within(30, "every node's timelines sum the fleet's commits", || {
        fleet_figures(&nodes)
    });
    within(30, "every node exports the fleet's top campaign", || {
        nodes.iter().all(|n| exported_campaigns(n) == ["tb"])
    });
    // kill -9 the node with two campaigns' commits, and start it again.
    nodes[2].kill9();
    nodes[2] = start(2);
    within(30, "the timelines keep the dead node's commits", || {
        fleet_figures(&nodes)
    });
}

/// A campaign file in `dir`/campaigns.
fn campaign_file(dir: &Path, id: &str) {
    let d = dir.join("campaigns");
    std::fs::create_dir_all(&d).unwrap();
    let text = r#"{"caps": [{"kind": "window", "limit": 5, "window": "1h"}]}"#;
    std::fs::write(d.join(format!("{id}.json")), text).unwrap();
}

/// Every campaign node `n` serves, sorted (empty if it cannot answer).
fn campaign_ids(n: &Node) -> Vec<String> {
    let (_, v) = n.call("GET", "/v1/campaigns", None);
    let mut ids: Vec<String> = v["campaigns"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|c| c["id"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    ids.sort();
    ids
}

/// Definitions as files on a fleet (issue 25, R10): three nodes whose
/// `--definitions` name different directories do not undo each other's
/// definitions: one node at a time writes its directory (the first to
/// start), the others apply what is in the store; when the writer dies,
/// another takes over within seconds and its directory is applied whole.
#[test]
fn definition_directories_have_one_writer_on_a_fleet() {
    let tmp = tempfile::tempdir().unwrap();
    let redis = Redis::start(&tmp.path().join("redis"), 7620);
    let dirs: Vec<PathBuf> = ["da", "db", "dc"]
        .iter()
        .map(|id| {
            let d = tmp.path().join(format!("defs-{id}"));
            campaign_file(&d, id);
            d
        })
        .collect();
    let start = |i: usize| {
        let dir = dirs[i].to_string_lossy().into_owned();
        Node::start_env(
            &tmp.path().join(format!("n{i}")),
            &redis.seeds,
            &format!("n{i}"),
            &[("FREQCAP_DEFINITIONS", dir.as_str())],
        )
    };
    let mut nodes = vec![start(0)];
    within(10, "n0 serves its directory", || {
        campaign_ids(&nodes[0]) == ["da"]
    });
    nodes.push(start(1));
    nodes.push(start(2));
    // For 5 s (two polls of every directory and more): every node serves
    // the writer's directory, and only that.
    for _ in 0..50 {
        for (i, n) in nodes.iter().enumerate() {
            assert_eq!(campaign_ids(n), ["da"], "n{i}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    nodes[0].kill9();
    let mut took_over = Vec::new();
    within(
        20,
        "another node takes over and applies its directory",
        || {
            let a = campaign_ids(&nodes[1]);
            let b = campaign_ids(&nodes[2]);
            took_over = a.clone();
            a == b && (a == ["db"] || a == ["dc"])
        },
    );
    // And it stays so.
    for _ in 0..30 {
        assert_eq!(campaign_ids(&nodes[1]), took_over);
        assert_eq!(campaign_ids(&nodes[2]), took_over);
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Screens `user` for `campaign` on `n` and commits it there if eligible:
/// (allowed, the denial's retry_after_ms).
fn screen_and_commit(n: &Node, user: &str, campaign: &str) -> (bool, Option<u64>) {
    let body = json!({"user": user, "candidates": [{"campaign": campaign}], "reserve": true, "ttl_ms": 2000});
    let (st, out) = n.call("POST", "/v1/screen", Some(&body));
    let r = &out["results"][0];
    if st != 200 || r["eligible"] != true {
        return (false, r["denied_by"]["retry_after_ms"].as_u64());
    }
    let Some(id) = out["reservation"].as_str() else {
        return (false, None);
    };
    let (st, _) = n.call_retrying(
        "POST",
        &format!("/v1/reservations/{id}/commit"),
        Some(&json!({})),
    );
    (st == 200, None)
}

/// A campaign-scope rate (5/s, burst 5) and gap (2 s) on three real nodes:
/// token lines leased at Redis's time (docs/cluster.md, "Leases"). The
/// fleet admits in any interval of length d at most burst + 5·(d + 2 s);
/// impressions of the gap are at least 2 s − 1.6 s apart. Times are the
/// test's: an impression was decided between its screen's start and its
/// commit's answer, and each bound is checked on the widest interval those
/// allow (a slow request cannot fail it).
#[test]
fn campaign_rates_and_gaps_hold_across_nodes() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let redis = Redis::start(&tmp.path().join("redis"), 7700);
    let nodes = nodes(tmp.path(), &redis, 3, &[]);
    let defs = [
        (
            "rate",
            json!({"caps": [{"kind": "rate", "rate": 5, "per": "1s", "burst": 5, "scope": "campaign"}]}),
        ),
        (
            "gap",
            json!({"caps": [{"kind": "gap", "min": "2s", "scope": "campaign"}]}),
        ),
    ];
    for (name, def) in &defs {
        let (st, body) = nodes[0].call_retrying("PUT", &format!("/v1/campaigns/{name}"), Some(def));
        assert_eq!(st, 200, "{body}");
        definition_reached(&nodes[1..], &format!("/v1/campaigns/{name}"));
    }
    // Three threads, one per node, for 12 s: (start, end) of every allowed
    // impression, and every denial's retry_after_ms, per campaign.
    let start = Instant::now();
    let run = Duration::from_secs(12);
    let seen = Mutex::new(HashMap::<&str, (Vec<(f64, f64)>, Vec<u64>)>::new());
    std::thread::scope(|s| {
        for (t, node) in nodes.iter().enumerate() {
            let (seen, start) = (&seen, start);
            s.spawn(move || {
                let mut i = 0;
                while start.elapsed() < run && i < 100_000 {
                    let camp = if i % 2 == 0 { "rate" } else { "gap" };
                    let t0 = start.elapsed().as_secs_f64();
                    let (ok, retry) = screen_and_commit(node, &format!("u{t}-{i}"), camp);
                    let t1 = start.elapsed().as_secs_f64();
                    let mut seen = seen.lock().unwrap();
                    let e = seen.entry(camp).or_default();
                    if ok {
                        e.0.push((t0, t1));
                    } else if let Some(r) = retry {
                        e.1.push(r);
                    }
                    i += 1;
                }
            });
        }
    });
    let elapsed = start.elapsed().as_secs_f64();
    let mut seen = seen.into_inner().unwrap();
    let (mut rate, rate_retries) = seen.remove("rate").unwrap_or_default();
    let (mut gap, gap_retries) = seen.remove("gap").unwrap_or_default();
    rate.sort_by(|a, b| a.0.total_cmp(&b.0));
    gap.sort_by(|a, b| a.0.total_cmp(&b.0));
    // The most units any interval held beyond one node's line 5 + 5·d, d
    // the widest the interval may have been.
    let mut ahead = i64::MIN;
    for i in 0..rate.len() {
        for j in i..rate.len() {
            let d = rate[j].1 - rate[i].0;
            let line = 5 + (5.0 * d).floor() as i64;
            ahead = ahead.max((j - i + 1) as i64 - line);
        }
    }
    let closest = gap
        .windows(2)
        .map(|w| w[1].1 - w[0].0)
        .fold(f64::INFINITY, f64::min);
    eprintln!(
        "lines: rate 5/s burst 5: {} admitted in {elapsed:.1} s (one node's line {:.0}), at most {ahead} ahead of it; \
         gap 2 s: {} impressions, closest {closest:.2} s apart; retry_after_ms rate {:?}..{:?}, gap {:?}..{:?}",
        rate.len(),
        5.0 + 5.0 * elapsed,
        gap.len(),
        rate_retries.iter().min(),
        rate_retries.iter().max(),
        gap_retries.iter().min(),
        gap_retries.iter().max(),
    );
    assert!(
        ahead <= 10,
        "the rate ran {ahead} units ahead of its line (bound 10)"
    );
    assert!(
        rate.len() as f64 >= 5.0 * elapsed * 0.7,
        "the rate under-delivered: {} in {elapsed:.1} s",
        rate.len()
    );
    assert!(
        closest >= 0.4,
        "two impressions of a 2 s gap {closest:.2} s apart"
    );
    assert!(
        gap.len() as f64 >= elapsed / 2.0 * 0.7,
        "the gap under-delivered: {} in {elapsed:.1} s",
        gap.len()
    );
    assert!(
        rate_retries.iter().all(|&r| (1..=1000).contains(&r)),
        "a rate's retry_after_ms: {rate_retries:?}"
    );
    assert!(
        gap_retries.iter().all(|&r| (1..=2000).contains(&r)),
        "a gap's retry_after_ms: {gap_retries:?}"
    );
}

/// An adaptive budget on three real nodes paces by one plan, made in Redis
/// (`fc_plan_v1`) from the fleet's spend: with demand far above the pace,
/// the fleet delivers the plan's line (what one node would: the plan of a
/// slice first touched with nothing spent starts from 0), never more than
/// the line a grant's life (2 s) ahead, and every node answers the same
/// spend and cap.
#[test]
fn adaptive_pacing_holds_across_nodes() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let redis = Redis::start(&tmp.path().join("redis"), 7720);
    let nodes = nodes(tmp.path(), &redis, 3, &[]);
    // 2000 a day: about 100 an hour, so the line at any time of day is a
    // few hundred at most, and rises ~0.03 a second.
    let def = json!({"budget": {"amount": 2000, "per": "1d", "pacing": "adaptive"}});
    let (st, body) = nodes[0].call_retrying("PUT", "/v1/campaigns/ad", Some(&def));
    assert_eq!(st, 200, "{body}");
    definition_reached(&nodes[1..], "/v1/campaigns/ad");
    let delivery = |n: &Node| {
        let (st, d) = n.call_retrying("GET", "/v1/campaigns/ad/delivery", None);
        assert_eq!(st, 200, "{d}");
        (
            d["spent"].as_u64().unwrap_or(0),
            d["cap_now"].as_u64().unwrap_or(0),
        )
    };
    let (_, cap_before) = delivery(&nodes[0]);
    let delivered = Mutex::new(0u64);
    let start = Instant::now();
    std::thread::scope(|s| {
        for (t, node) in nodes.iter().enumerate() {
            let delivered = &delivered;
            s.spawn(move || {
                let mut i = 0;
                while start.elapsed() < Duration::from_secs(8) && i < 100_000 {
                    if screen_and_commit(node, &format!("a{t}-{i}"), "ad").0 {
                        *delivered.lock().unwrap() += 1;
                    }
                    i += 1;
                }
            });
        }
    });
    let delivered = delivered.into_inner().unwrap();
    let answers: Vec<(u64, u64)> = nodes.iter().map(delivery).collect();
    eprintln!(
        "adaptive: cap before {cap_before}; {delivered} delivered through 3 nodes; (spent, cap_now) per node {answers:?}"
    );
    let cap_after = answers[0].1;
    assert!(
        delivered >= cap_before && delivered <= cap_after + 1,
        "delivered {delivered}, the plan's cap {cap_before}..{cap_after}"
    );
    for (k, a) in answers.iter().enumerate() {
        assert_eq!(a.0, delivered, "node {k}'s spend");
        assert!(a.1.abs_diff(cap_after) <= 1, "node {k}'s cap {a:?}");
    }
}

/// An `adaptive` item on a cluster (docs/adaptive.md, "On a cluster"): its
/// slots and its controller are in the key's record, so two nodes admit
/// against one limit per key, and what one node's releases teach, the
/// other decides by.
#[test]
fn an_adaptive_limit_is_one_per_key_across_nodes() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let redis = Redis::start(&tmp.path().join("redis"), 7760);
    // A replica's confirmation may wait 2 s: fewer reserves answered 503
    // after they applied (a retried one stands as decided since
    // `a_check_retried_after_an_unconfirmed_write_can_be_released`).
    let n = nodes(tmp.path(), &redis, 2, &["--redis-timeout-ms", "2000"]);
    let def = json!({"limits": [{"kind": "adaptive", "initial": 4, "min": 1, "max": 40,
        "algorithm": "aimd", "window": "1ms"}]});
    let (st, body) = n[0].call_retrying("PUT", "/v1/policies/api", Some(&def));
    assert_eq!(st, 200, "{body}");
    definition_reached(&n[1..], "/v1/policies/api");
    // The caller's ids make a reserve retried after a 503 the same hold.
    let reserve = |node: &Node, id: String| {
        let body = json!({"policy": "api", "key": "k", "reserve": true, "ttl_ms": 60_000,
            "reservation_id": id});
        let (st, d) = node.call_retrying("POST", "/v1/check", Some(&body));
        assert!(st == 200 || st == 429, "{st} {d}");
        (st == 200).then_some(id)
    };
    // Four slots for the fleet: two taken on each node, then none on either.
    let mut held = Vec::new();
    for (i, node) in [0, 1, 0, 1].into_iter().enumerate() {
        held.push((node, reserve(&n[node], format!("a{i}")).expect("a slot")));
    }
    assert_eq!(reserve(&n[0], "a4".into()), None);
    assert_eq!(reserve(&n[1], "a5".into()), None);
    let release = |node: &Node, id: &str| {
        let body = json!({"latency_ms": 2, "outcome": "ok"});
        let (st, r) = node.call_retrying(
            "POST",
            &format!("/v1/reservations/{id}/release"),
            Some(&body),
        );
        assert_eq!(st, 200, "{r}");
    };
    for (node, id) in &held {
        release(&n[*node], id);
    }
    // Node 0 fills and releases with fast samples (windows of 1 ms and 10
    // samples); node 1 reads the limit it learned.
    let limit_on = |node: &Node| {
        let (st, d) = node.call_retrying(
            "POST",
            "/v1/check",
            Some(&json!({"policy": "api", "key": "k", "cost": 0})),
        );
        assert_eq!(st, 200, "{d}");
        d["limits"][0]["limit"].as_u64().unwrap_or(0)
    };
    let mut learned = 4;
    for round in 0..60 {
        let ids: Vec<String> = (0..40)
            .map_while(|i| reserve(&n[0], format!("r{round}-{i}")))
            .collect();
        for id in &ids {
            release(&n[0], id);
        }
        learned = limit_on(&n[1]);
        if learned > 6 {
            break;
        }
    }
    assert!(learned > 6, "node 1 never saw the limit grow: {learned}");
    assert_eq!(limit_on(&n[0]), learned);
}

/// Exclusion within a screen on a cluster (docs/semantics.md §6.4): a rule
/// of one screen, decided on whichever node serves it with the labels the
/// other node defined; the excluded candidate holds nothing anywhere.
#[test]
fn exclusion_labels_hold_on_a_cluster() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let redis = Redis::start(&tmp.path().join("redis"), 7780);
    let n = nodes(tmp.path(), &redis, 2, &[]);
    for (id, def) in [
        (
            "autos",
            json!({"exclusion_labels": ["auto"], "max_per_screen": 1}),
        ),
        ("maker-a", json!({"parent": "autos"})),
        (
            "maker-b",
            json!({"parent": "autos",
            "caps": [{"kind": "window", "limit": 1, "window": "1d"}]}),
        ),
        ("rival", json!({"exclusion_labels": ["auto"]})),
    ] {
        let (st, body) = n[0].call_retrying("PUT", &format!("/v1/campaigns/{id}"), Some(&def));
        assert_eq!(st, 200, "{body}");
    }
    definition_reached(&n[1..], "/v1/campaigns/rival");
    // Ids the client chooses: a retry after a write whose answer was lost
    // (a replica slow to confirm it on a loaded machine) is the same
    // reservation, answered as first made, not a second one.
    let screen = |id: &str| {
        json!({"user": "u", "reservation_id": id, "candidates": [
        {"campaign": "maker-b"}, {"campaign": "maker-a"}, {"campaign": "rival"}]})
    };
    let (st, s) = n[1].call_retrying("POST", "/v1/screen", Some(&screen("ex-1")));
    assert_eq!(st, 200, "{s}");
    let eligible: Vec<bool> = (0..3)
        .map(|i| s["results"][i]["eligible"].as_bool().unwrap_or(true))
        .collect();
    assert_eq!(eligible, [true, false, false], "{s}");
    assert_eq!(s["results"][1]["denied_by"]["cap"], "exclusion:auto", "{s}");
    assert_eq!(s["results"][2]["denied_by"]["campaign"], "rival", "{s}");
    let id = s["reservation"].as_str().expect("held").to_owned();
    let path = format!("/v1/reservations/{id}/commit");
    let commit = json!({"campaign": "maker-b", "user": "u"});
    let (st, c) = n[0].call_retrying("POST", &path, Some(&commit));
    assert_eq!(st, 200, "{c}");
    // maker-b is capped for u now: it takes no label, maker-a is held.
    let (st, s) = n[0].call_retrying("POST", "/v1/screen", Some(&screen("ex-2")));
    assert_eq!(st, 200, "{s}");
    assert_eq!(s["results"][0]["denied_by"]["cap"], "window-0", "{s}");
    assert_eq!(s["results"][1]["eligible"], true, "{s}");
    assert_eq!(s["results"][2]["denied_by"]["cap"], "exclusion:auto", "{s}");
}

/// Pacing levers on a cluster (docs/pacing.md, "Levers"): each node runs the
/// controller on the fleet's spend, not its own share of it. Node 0 spends
/// 30 % of two budgets at a local time between 01:00 and 02:00, far ahead of
/// either line (at most an eighth of the day): node 1, which spent nothing
/// itself, answers the slow start's 0.1 (on its own spend it would be behind
/// and answer 1), and its `throttle` budget lets about a tenth through.
#[test]
fn pacing_levers_follow_the_fleets_spend() {
    let hour = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs()
        / 3600
        % 24;
    // The zone whose local hour is 01 now: UTC+o, o in -12..=14.
    let o = (1 - hour as i64).rem_euclid(24);
    let o = if o > 14 { o - 24 } else { o };
    let tz = match o {
        0 => "UTC".to_owned(),
        o if o > 0 => format!("Etc/GMT-{o}"),
        o => format!("Etc/GMT+{}", -o),
    };
    let tmp = tempfile::tempdir().expect("temp dir");
    let redis = Redis::start(&tmp.path().join("redis"), 7860);
    // Each commit's spend is in the store before it is answered.
    let n = nodes(tmp.path(), &redis, 2, &["--spend-reports", "commit"]);
    for (id, pacing, levers) in [("paced", "even", true), ("thr", "throttle", false)] {
        // A tolerance of 1 keeps the even budget's cap at its amount: the
        // candidate stays eligible, ahead of its line, with levers to give.
        let def = json!({"tz": tz, "unknown_user": "allow", "pacing_levers": levers,
            "budget": {"amount": 10_000, "pacing": pacing, "tolerance": 1}});
        let (st, body) = n[0].call_retrying("PUT", &format!("/v1/campaigns/{id}"), Some(&def));
        assert_eq!(st, 200, "{body}");
    }
    definition_reached(&n[1..], "/v1/campaigns/thr");
    for id in ["paced", "thr"] {
        let ev = json!({"campaign": id, "cost": 3_000});
        let (st, body) = n[0].call_retrying("POST", "/v1/events", Some(&ev));
        assert_eq!(st, 200, "{body}");
    }
    let dry = |c: &str| json!({"candidates": [{"campaign": c}], "reserve": false});
    for node in &n {
        // A screen refused for want of headroom (`retry_after_ms`: a lease
        // call under way, or timed out under a full run's load; seen once,
        // in a full run, 2026-12-06) is tried again, 5 times at most, as
        // an ad server's next request would be.
        let mut tries = 0;
        let s = loop {
            let (st, s) = node.call_retrying("POST", "/v1/screen", Some(&dry("paced")));
            assert_eq!(st, 200, "{s}");
            tries += 1;
            if s["results"][0]["eligible"] == true || tries == 5 {
                break s;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        assert_eq!(s["results"][0]["eligible"], true, "{s}");
        assert_eq!(
            s["results"][0]["pacing"]["pass_probability"], 0.1,
            "{tz}: {s}"
        );
    }
    let mut passed = 0;
    for _ in 0..300 {
        let (st, s) = n[1].call_retrying("POST", "/v1/screen", Some(&dry("thr")));
        assert_eq!(st, 200, "{s}");
        if s["results"][0]["eligible"] == true {
            passed += 1;
        } else {
            assert_eq!(s["results"][0]["denied_by"]["cap"], "budget", "{s}");
        }
    }
    // About 30 of 300 at 0.1 (0 would happen once in 10^13 runs); on the
    // node's own spend all 300 would pass.
    assert!((1..=100).contains(&passed), "{tz}: {passed} of 300 passed");
}

/// Issue 30 item 1: a household cap across three nodes of one Redis
/// Cluster, over HTTP: screens of the household's users on every node,
/// commits on another node than the screen's, exact at the cap; the count
/// read on any node, and after a node is killed with SIGKILL.
#[test]
fn a_household_cap_is_exact_across_nodes() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let redis = Redis::start(&tmp.path().join("redis"), 7880);
    let mut n = nodes(tmp.path(), &redis, 3, &[]);
    let def = json!({"caps": [
        {"name": "hh_daily", "kind": "window", "limit": 4, "window": "1d", "scope": "household"},
        {"name": "user_daily", "kind": "window", "limit": 3, "window": "1d"}]});
    let (st, body) = n[0].call_retrying("PUT", "/v1/campaigns/c", Some(&def));
    assert_eq!(st, 200, "{body}");
    definition_reached(&n[1..], "/v1/campaigns/c");
    let mut shown = 0u64;
    // Screens answered 503 (a write a replica did not confirm in time, on
    // a loaded machine): such a write may have been applied, and its hold
    // on the household then stands until its deadline (docs/cluster.md),
    // so each may keep one impression from being shown in this loop. The
    // cap is never passed either way.
    let mut unconfirmed = 0u64;
    for i in 0..12 {
        let s = json!({"user": format!("u{i}"), "ids": {"household": "h1"},
                       "candidates": [{"campaign": "c"}]});
        let mut r = n[i % 3].call("POST", "/v1/screen", Some(&s));
        for _ in 0..20 {
            if r.0 != 503 {
                break;
            }
            eprintln!("screen {i} answered 503: {}", r.1);
            unconfirmed += 1;
            std::thread::sleep(Duration::from_millis(100));
            r = n[i % 3].call("POST", "/v1/screen", Some(&s));
        }
        let (st, out) = r;
        assert_eq!(st, 200, "{out}");
        if out["results"][0]["eligible"] == true {
            let id = out["reservation"].as_str().expect("a reservation");
            let path = format!("/v1/reservations/{id}/commit");
            let (st, c) =
                n[(i + 1) % 3].call_retrying("POST", &path, Some(&json!({"campaign": "c"})));
            assert_eq!(st, 200, "{c}");
            shown += 1;
        } else {
            assert_eq!(out["results"][0]["denied_by"]["cap"], "hh_daily", "{out}");
        }
    }
    assert!(
        shown <= 4 && shown + unconfirmed >= 4,
        "{shown} shown, {unconfirmed} unconfirmed"
    );
    n[0].kill9();
    for node in &n[1..] {
        let (st, u) = node.call_retrying("GET", "/v1/ids/household/h1/campaigns/c", None);
        assert_eq!(st, 200, "{u}");
        assert_eq!(u["caps"][0]["name"], "hh_daily", "{u}");
        assert_eq!(u["caps"][0]["used"], shown, "{u}");
        let pending = u["caps"][0]["pending"].as_u64().unwrap_or(u64::MAX);
        assert!(pending <= unconfirmed && shown + pending <= 4, "{u}");
    }
    let s = json!({"user": "u99", "ids": {"household": "h1"}, "candidates": [{"campaign": "c"}]});
    let (_, out) = n[2].call_retrying("POST", "/v1/screen", Some(&s));
    assert_eq!(out["results"][0]["denied_by"]["cap"], "hh_daily", "{out}");
}

/// Waits (5 s at most) until every node serves campaign `camp` with
/// `field` (a JSON pointer) equal to `want`: an edit reaches every node
/// within a second.
fn edit_reached(nodes: &[Node], camp: &str, field: &str, want: &Value) {
    for n in nodes {
        within(5, "the edit to reach every node", || {
            let (st, d) = n.call("GET", &format!("/v1/campaigns/{camp}"), None);
            st == 200 && d.pointer(field) == Some(want)
        });
    }
}

/// Issue 45 on a fleet (shared mode, three nodes): a raised budget keeps
/// the fleet's spend and a raised user cap what the user saw, on every
/// node; one policy key reset on one node is fresh on the others; a user
/// erased on one node reads empty on all, while delivery stays.
#[test]
fn edits_resets_and_erasures_hold_on_a_fleet() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let redis = Redis::start(&tmp.path().join("redis"), 7900);
    let n = nodes(tmp.path(), &redis, 3, &[]);
    let def = |amount: u64, cap: u64| {
        json!({"budget": {"amount": amount, "per": "1d", "pacing": "asap"},
               "caps": [{"kind": "window", "limit": cap, "window": "1d", "align": "calendar"}]})
    };
    let (st, body) = n[0].call_retrying("PUT", "/v1/campaigns/c1", Some(&def(10, 3)));
    assert_eq!(st, 200, "{body}");
    definition_reached(&n[1..], "/v1/campaigns/c1");
    // 3 impressions of user v, then 3 of other users, across the nodes.
    // Leased: a node may be refused while another holds budget units it
    // has not spent, until they come back (seconds), so a refusal is tried
    // again a little later.
    let show = |user: &str, want: u64| -> u64 {
        let mut shown = 0;
        for i in 0..40 {
            if shown == want {
                break;
            }
            if screen_and_commit(&n[i % 3], user, "c1").0 {
                shown += 1;
            } else {
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        shown
    };
    assert_eq!(show("v", 3), 3);
    for u in ["a", "b", "c"] {
        assert_eq!(show(u, 1), 1);
    }
    let (st, body) = n[1].call_retrying("PUT", "/v1/campaigns/c1", Some(&def(12, 5)));
    assert_eq!(st, 200, "{body}");
    edit_reached(&n, "c1", "/budget/amount", &json!(12));
    for node in &n {
        within(5, "delivery to read the fleet's 6", || {
            let (_, d) = node.call("GET", "/v1/campaigns/c1/delivery", None);
            d["spent"] == 6 && d["amount"] == 12
        });
        assert_eq!(used(node, "v", "c1"), 3);
    }
    // v sees 2 more (5 - 3) and no third, the budget fits 12 - 6 - 2 = 4
    // more.
    assert_eq!(show("v", 3), 2);
    // Leased: a node may be refused while another holds units it has not
    // spent, until they come back (seconds): a refusal is retried a
    // little later, up to 30 tries.
    let mut more = 0;
    for i in 0..30 {
        if screen_and_commit(&n[i % 3], &format!("w{i}"), "c1").0 {
            more += 1;
        } else {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    assert_eq!(more, 4, "12 in all, not 12 more");
    for node in &n {
        within(5, "delivery to read 12", || {
            node.call("GET", "/v1/campaigns/c1/delivery", None).1["spent"] == 12
        });
    }

    // One policy key reset on one node: fresh on every node, the other
    // key untouched.
    let policy =
        json!({"limits": [{"kind": "window", "limit": 3, "window": "1h", "align": "fixed"}]});
    let (st, body) = n[0].call_retrying("PUT", "/v1/policies/api", Some(&policy));
    assert_eq!(st, 200, "{body}");
    definition_reached(&n[1..], "/v1/policies/api");
    let check = |node: &Node, key: &str| {
        let (st, v) = node.call_retrying(
            "POST",
            "/v1/check",
            Some(&json!({"policy": "api", "key": key})),
        );
        (st, v["remaining"].as_u64())
    };
    for node in &n {
        assert_eq!(check(node, "k").0, 200);
    }
    assert_eq!(check(&n[0], "k").0, 429);
    assert_eq!(check(&n[0], "k2"), (200, Some(2)));
    let (st, body) = n[2].call_retrying("DELETE", "/v1/policies/api/keys/k", None);
    assert_eq!(st, 204, "{body}");
    assert_eq!(check(&n[0], "k"), (200, Some(2)));
    assert_eq!(check(&n[1], "k2"), (200, Some(1)));

    // v erased on n1: every node reads v empty; delivery stays.
    let (_, before) = n[0].call("GET", "/v1/campaigns/c1/delivery", None);
    let (st, body) = n[1].call_retrying("DELETE", "/v1/users/v", None);
    assert_eq!(st, 204, "{body}");
    for node in &n {
        assert_eq!(used(node, "v", "c1"), 0);
        let (_, d) = node.call("GET", "/v1/campaigns/c1/delivery", None);
        assert_eq!(d["spent"], before["spent"], "{d}");
    }
}

/// Issue 47, item 0: a budget is never exceeded, and ≥ 99 % of it is
/// delivered, through a node's `kill -9`, run 10 times: budgets of 1 200
/// (above 1 000, so spend is reported in batches), demand three times the
/// budget, routing alternately spread (each commit on another node than its
/// screen) and affine (screen and commit on one node). In each run the
/// victim holds 30 open reservations when it is killed; the client commits
/// them on the other nodes, and each acknowledged one counts. Before, those
/// commits were charged only by the dead node at their deadline, so never:
/// 1 259 of a budget of 1 200 in `tests/shared.rs`, +3.3 % in the issue's
/// load run. Every node's delivery then reads what was acknowledged (plus
/// at most the unit the dead node may have committed unreported).
#[test]
fn budgets_hold_through_repeated_node_kills() {
    kill_runs(7940, &[], 10);
}

/// The same in owner mode, 4 runs: a commit sent to another node is
/// forwarded to the user's owner, so a dead owner's open reservations are
/// not committed elsewhere (404), and its headroom comes back as a shared
/// node's does.
#[test]
fn budgets_hold_through_node_kills_in_owner_mode() {
    kill_runs(7960, &["--reservations", "owner"], 4);
}

/// `runs` runs of [`budgets_hold_through_repeated_node_kills`] on a Redis
/// Cluster at `base_port`, the nodes started with `extra` arguments.
fn kill_runs(base_port: u16, extra: &[&str], runs: usize) {
    let tmp = tempfile::tempdir().expect("temp dir");
    let redis = Redis::start(&tmp.path().join("redis"), base_port);
    let start = |i: usize, run: usize| {
        Node::start_with(
            &tmp.path().join(format!("n{i}-{run}")),
            &redis.seeds,
            &format!("n{i}"),
            &[],
            extra,
        )
    };
    let mut nodes: Vec<Node> = (0..3).map(|i| start(i, 0)).collect();
    const BUDGET: u64 = 1200;
    let mut report = Vec::new();
    for run in 0..runs {
        let spread = run % 2 == 0;
        let camp = format!("k{run}");
        let def = json!({"budget": {"amount": BUDGET, "per": "1d", "pacing": "asap"}});
        let path = format!("/v1/campaigns/{camp}");
        let (st, body) = nodes[0].call_retrying("PUT", &path, Some(&def));
        assert_eq!(st, 200, "{body}");
        definition_reached(&nodes[1..], &path);
        // A screen on node `on` (reservations of 2 s): its id if eligible.
        let screen = |nodes: &[Node], on: usize, i: usize| -> Option<String> {
            let body = json!({"user": format!("{camp}-{i}"), "candidates": [{"campaign": camp, "cost": 1}], "reserve": true, "ttl_ms": 2000});
            let (st, out) = nodes[on].call("POST", "/v1/screen", Some(&body));
            (st == 200 && out["results"][0]["eligible"] == true)
                .then(|| out["reservation"].as_str().map(str::to_owned))
                .flatten()
        };
        let commit = |nodes: &[Node], on: usize, id: &str| -> bool {
            let path = format!("/v1/reservations/{id}/commit");
            nodes[on].call_retrying("POST", &path, Some(&json!({}))).0 == 200
        };
        let serve = |nodes: &[Node], i: usize| -> u64 {
            let on = i % 3;
            let Some(id) = screen(nodes, on, i) else {
                return 0;
            };
            u64::from(commit(nodes, if spread { (on + 1) % 3 } else { on }, &id))
        };
        // Demand of 3 × the budget at 300 requests a second (12 s): a
        // steady stream, as an ad server's, not a burst that ends before a
        // dead node's grant and holds (2 s each) can end.
        let began = Instant::now();
        let pace = |i: usize| {
            let due = began + Duration::from_micros(i as u64 * 1_000_000 / 300);
            if let Some(d) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(d);
            }
        };
        let (mut acked, mut i) = (0u64, 0usize);
        while acked < BUDGET / 3 && i < 3 * BUDGET as usize {
            pace(i);
            acked += serve(&nodes, i);
            i += 1;
        }
        // The victim holds 30 reservations, and dies.
        let victim = run % 3;
        let held: Vec<String> = (0..30)
            .filter_map(|k| screen(&nodes, victim, 100_000 + k))
            .collect();
        nodes[victim].kill9();
        // The client commits them on the others: each acknowledged counts.
        // (In owner mode they go to the dead owner: not acknowledged. A
        // few tries each, not a client's patience: 30 of them.)
        for (k, id) in held.iter().enumerate() {
            let on = (victim + 1 + k % 2) % 3;
            let path = format!("/v1/reservations/{id}/commit");
            for _ in 0..3 {
                match nodes[on].call("POST", &path, Some(&json!({}))).0 {
                    200 => {
                        acked += 1;
                        break;
                    }
                    503 => std::thread::sleep(Duration::from_millis(100)),
                    _ => break,
                }
            }
        }
        nodes[victim] = start(victim, run + 1);
        // Demand goes on to three times the budget, for 30 s at most.
        let until = Instant::now() + Duration::from_secs(30);
        while acked < BUDGET && i < 3 * BUDGET as usize && Instant::now() < until {
            pace(i);
            acked += serve(&nodes, i);
            i += 1;
        }
        // Every node reads the fleet's delivery within 2 s.
        let mut reads = Vec::new();
        for n in &nodes {
            let mut spent = 0;
            for _ in 0..20 {
                let (st, d) = n.call("GET", &format!("/v1/campaigns/{camp}/delivery"), None);
                spent = d["spent"].as_u64().unwrap_or(0);
                if st == 200 && spent >= acked {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            reads.push(spent);
        }
        eprintln!(
            "run {run} ({}): {} held by the victim, {acked} of {BUDGET} acknowledged over {i} requests; delivery read {reads:?}",
            if spread { "spread" } else { "affinity" },
            held.len()
        );
        report.push((run, acked, reads.clone()));
        assert!(acked <= BUDGET, "run {run}: over the budget: {acked}");
        assert!(
            acked * 100 >= BUDGET * 99,
            "run {run}: under-delivered: {acked} of {BUDGET}"
        );
        for r in reads {
            assert!(
                (acked..=acked + 1).contains(&r),
                "run {run}: delivery read {r} for {acked} acknowledged"
            );
        }
    }
    eprintln!("repeated kills: {report:?}");
}

/// Issue 47, item 1, as the issue tried it: a campaign with a budget of
/// 10¹² (so spend is reported in batches) and a campaign-scope cap, 300 ads
/// screened on one node and committed on the next (reservations of the
/// default 60 s), and an event posted to n1, n2, n3, n1; then nothing. 2 s
/// after the last acknowledgement, every node's delivery, timeline and
/// campaign-scope `used` equal what was acknowledged. Before: delivery 62 %
/// of the acknowledged spend, timelines 62 % of the commits, `used` 62 %
/// (cross-node commits counted at their reservation's deadline, a minute
/// on), and the event's 7 on one node only, for good.
#[test]
fn an_idle_campaigns_figures_converge_on_every_node() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let redis = Redis::start(&tmp.path().join("redis"), 7980);
    // Per-campaign series for `big` (docs/service.md, "Per-definition metrics").
    let nodes = nodes(tmp.path(), &redis, 3, &["--metrics-definitions", "big"]);
    let def = json!({
        "budget": {"amount": 1_000_000_000_000u64, "per": "1d", "pacing": "asap"},
        "caps": [{"kind": "window", "limit": 1_000_000_000u64, "window": "1d", "align": "fixed", "scope": "campaign"}]
    });
    let (st, body) = nodes[0].call_retrying("PUT", "/v1/campaigns/big", Some(&def));
    assert_eq!(st, 200, "{body}");
    definition_reached(&nodes[1..], "/v1/campaigns/big");
    let (mut cost, mut commits) = (0u64, 0u64);
    let mut refused = None;
    for i in 0..300usize {
        let c = 1 + (i as u64 % 5);
        let body = json!({"user": format!("big-{i}"), "candidates": [{"campaign": "big", "cost": c}], "reserve": true});
        // A node's grant follows its recent rate: a screen refused for want
        // of headroom is tried again (5 times at most, 50 ms apart), as an
        // ad server's next request would be.
        let mut held = None;
        for _ in 0..5 {
            let (st, out) = nodes[i % 3].call_retrying("POST", "/v1/screen", Some(&body));
            held = out["reservation"]
                .as_str()
                .filter(|_| st == 200)
                .map(str::to_owned);
            if held.is_some() {
                break;
            }
            refused = Some(format!("{st} {}", out["results"][0]["denied_by"]));
            std::thread::sleep(Duration::from_millis(50));
        }
        let Some(id) = held else {
            continue;
        };
        let path = format!("/v1/reservations/{id}/commit");
        if nodes[(i + 1) % 3]
            .call_retrying("POST", &path, Some(&json!({})))
            .0
            == 200
        {
            cost += c;
            commits += 1;
        }
    }
    let ev = json!({"campaign": "big", "cost": 7, "event_id": "imp-big"});
    let mut counted = 0;
    for i in [0, 1, 2, 0] {
        let (st, body) = nodes[i].call_retrying("POST", "/v1/events", Some(&ev));
        assert_eq!(st, 200, "{body}");
        counted += body["counted"].as_u64().unwrap_or(0);
    }
    assert_eq!(counted, 1, "the event counted once");
    std::thread::sleep(Duration::from_secs(2));
    let mut read = Vec::new();
    for n in &nodes {
        let (_, d) = n.call("GET", "/v1/campaigns/big/delivery", None);
        let (_, u) = n.call("GET", "/v1/users/anyone/campaigns/big", None);
        read.push((
            d["spent"].as_u64().unwrap_or(0),
            timeline_commits(n, "big"),
            u["caps"][0]["used"].as_u64().unwrap_or(0),
            n.metric("freqcap_unreported_units").unwrap_or(-1.0),
            n.metric("freqcap_campaign_spend{").unwrap_or(-1.0),
        ));
    }
    eprintln!(
        "idle campaign: {commits} commits of {cost} acknowledged, and an event of 7; \
         (delivery, timeline commits, campaign-scope used, unreported, \
         freqcap_campaign_spend) per node: {read:?}"
    );
    // Screens refused while a node's grants are small are not the point
    // here (18 of 300 got through once, in a full run, before the retries
    // above): what was acknowledged is, and it is batched at any count.
    assert!(
        commits >= 30,
        "{commits} of 300 ads acknowledged; the last refusal: {refused:?}"
    );
    for (spent, timeline, used, unreported, spend_series) in read {
        assert_eq!(spent, cost + 7, "delivery");
        assert_eq!(spend_series, (cost + 7) as f64, "freqcap_campaign_spend");
        assert_eq!(timeline, commits, "timeline commits");
        assert_eq!(used, commits + 1, "campaign-scope used");
        assert_eq!(unreported, 0.0, "freqcap_unreported_units");
    }
}

/// The ad-ops rules of issue 48 on two real nodes of a Redis Cluster, in
/// shared mode: a flight that ended and a schedule closed now deny on both
/// nodes; a click counted on one node fills a click cap the other one
/// screens by; an opt-out of an ancestor's campaign cap holds while the cap
/// binds its siblings fleet-wide; a budget under a schedule is paced over
/// its open hour, not the day, through the leases Redis computes.
#[test]
fn flights_schedules_click_caps_and_opt_outs_hold_on_a_cluster() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let redis = Redis::start(&tmp.path().join("redis"), 8100);
    let n = nodes(tmp.path(), &redis, 2, &[]);
    let now = jiff::Timestamp::now();
    let hour = now.as_second().rem_euclid(86_400) / 3_600;
    let hm = |h: i64| {
        if h >= 24 {
            "24:00".to_owned()
        } else {
            format!("{h:02}:00")
        }
    };
    let every_day = json!(["mon", "tue", "wed", "thu", "fri", "sat", "sun"]);
    for (id, def) in [
        (
            "adv",
            json!({"caps": [{"kind": "window", "name": "daily", "limit": 2, "window": "1d",
                             "scope": "campaign"}]}),
        ),
        ("brand", json!({"parent": "adv"})),
        (
            "house",
            json!({"parent": "adv", "ignore_caps": ["adv/daily"],
                   "caps": [{"kind": "window", "name": "clicks", "event": "click",
                             "limit": 1, "window": "1d"}]}),
        ),
        (
            "old",
            json!({"flight": {"start": "2020-01-01T00:00:00Z", "end": "2020-02-01T00:00:00Z"}}),
        ),
        (
            "later",
            json!({"schedule": {"tz": "UTC", "hours": [
                {"days": every_day, "from": hm((hour + 2) % 24), "until": hm((hour + 2) % 24 + 1)}]}}),
        ),
        (
            "hour",
            json!({"schedule": {"tz": "UTC", "hours": [
                       {"days": every_day, "from": hm(hour), "until": hm(hour + 1)}]},
                   "budget": {"amount": 6000, "per": "1d", "pacing": "even"}}),
        ),
    ] {
        let (st, body) = n[0].call_retrying("PUT", &format!("/v1/campaigns/{id}"), Some(&def));
        assert_eq!(st, 200, "{body}");
    }
    definition_reached(&n[1..], "/v1/campaigns/hour");
    // A flight that ended, a schedule closed now: on both nodes.
    for node in &n {
        let (st, s) = node.call_retrying(
            "POST",
            "/v1/screen",
            Some(&json!({"user": "v", "candidates": [{"campaign": "old"}, {"campaign": "later"}]})),
        );
        assert_eq!(st, 200, "{s}");
        assert_eq!(s["results"][0]["denied_by"]["cap"], "flight", "{s}");
        assert_eq!(s["results"][1]["denied_by"]["cap"], "schedule", "{s}");
        let retry = s["results"][1]["denied_by"]["retry_after_ms"]
            .as_u64()
            .unwrap_or(0);
        assert!((3_600_000..=7_200_000).contains(&retry), "{s}");
    }
    // adv's campaign cap of 2 binds brand fleet-wide; house opted out. A
    // node whose grant of a leased cap is empty answers "retry soon"
    // (another may have room): asked for up to 3 s.
    let shown = |node: &Node, user: &str, camp: &str| {
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(3) {
            if screen_and_commit(node, user, camp).0 {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    };
    assert!(shown(&n[0], "a", "brand"));
    assert!(shown(&n[1], "b", "brand"));
    assert!(!shown(&n[1], "c", "brand"));
    assert!(!shown(&n[0], "c", "brand"));
    for (i, u) in ["c", "d", "e"].into_iter().enumerate() {
        assert!(shown(&n[i % 2], u, "house"), "house for {u}");
    }
    // A click on node 0 fills c's click cap on house; node 1 screens by it.
    let (st, e) = n[0].call_retrying(
        "POST",
        "/v1/events",
        Some(&json!({"user": "c", "campaign": "house", "type": "click", "event_id": "click-c"})),
    );
    assert_eq!((st, &e["counted"]), (200, &json!(1)), "{e}");
    let (st, s) = n[1].call_retrying(
        "POST",
        "/v1/screen",
        Some(&json!({"user": "c", "candidates": [{"campaign": "house"}]})),
    );
    assert_eq!(st, 200, "{s}");
    assert_eq!(s["results"][0]["denied_by"]["cap"], "clicks", "{s}");
    let (st, u) = n[1].call_retrying("GET", "/v1/users/c/campaigns/house", None);
    assert_eq!(st, 200, "{u}");
    assert_eq!(u["caps"][0]["event"], "click", "{u}");
    assert_eq!(u["caps"][0]["used"], 1, "{u}");
    assert_eq!(
        u["caps"].as_array().map(Vec::len),
        Some(1),
        "adv/daily opted out: {u}"
    );
    // The scheduled budget: 6 000 over its open hour, 100 a minute (plus
    // the 1 % tolerance, 60); over the whole day it would be ~4 a minute.
    // Each commit goes to the node that screened (one committed elsewhere
    // holds its place there until its deadline, docs/cluster.md).
    let minutes = |t: jiff::Timestamp| (t.as_second().rem_euclid(3_600)) as f64 / 60.0;
    let before = jiff::Timestamp::now();
    let mut admitted = 0u64;
    for i in 0..200 {
        let body =
            json!({"user": format!("h{i}"), "candidates": [{"campaign": "hour", "cost": 50}]});
        let (st, s) = n[i % 2].call_retrying("POST", "/v1/screen", Some(&body));
        assert_eq!(st, 200, "{s}");
        let Some(id) = s["reservation"].as_str() else {
            continue;
        };
        let (st, c) = n[i % 2].call_retrying(
            "POST",
            &format!("/v1/reservations/{id}/commit"),
            Some(&json!({"campaign": "hour"})),
        );
        assert_eq!(st, 200, "{c}");
        admitted += 50;
    }
    let after = jiff::Timestamp::now();
    // Still in the same hour (else the bounds below mean nothing).
    if after.as_second() / 3_600 == before.as_second() / 3_600 {
        // Below: a grant renewed on the next request lags by a screen or
        // two on each node.
        let low = 0.8 * 100.0 * minutes(before) - 100.0;
        let high = 100.0 * minutes(after) + 60.0 + 50.0 + 100.0 * 10.0 / 60.0;
        let a = admitted as f64;
        eprintln!("admitted {admitted} against a line from {low} to {high}");
        assert!(
            low <= a && a <= high,
            "{admitted} of a line from {low} to {high}"
        );
    }
}
