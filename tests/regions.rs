//! Regions (docs/regions.md; issue 50): two regions, each a fleet on a
//! Redis of its own, leasing campaigns' budgets and period caps from a
//! global tier (a third Redis). Real processes on loopback: three
//! `redis-server`s and a freqcap node per region, started and stopped by
//! the test.
//!
//! - Demand in both regions delivers a budget and a campaign cap exactly,
//!   never over, though each region decides alone.
//! - The global tier stopped (SIGSTOP: every region cut off from it) for
//!   35 s, past the life of a region's grant: each region serves on its
//!   last grant (`region_safe = keep`); nothing goes over. Healed
//!   (SIGCONT): the rest is delivered to exactly the budget, and the tier's
//!   counts equal what was delivered — nothing counted twice.
//! - A user capped at 3 a day: at home, exactly 3 however fast it is
//!   screened; travelling between the two regions, at most 3 + 1
//!   (`regions − 1` over), and both regions' records converge on every
//!   unit delivered in either (docs/regions.md, "Users across regions").
//! - A node stopped (SIGTERM) exits cleanly, its last spend reported to its
//!   region's Redis and its calls to the tier logged.
//! - A campaign's rolling window, rate and `max_in_flight` hold across the
//!   two regions, not in each (docs/regions.md, "Caps across regions").

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

mod support;

use support::cluster::{Node, OneRedis, redis_cli};

const GLOBAL: u16 = 8160;
const REGION_A: u16 = 8161;
const REGION_B: u16 = 8162;

fn redis(dir: &Path, port: u16) -> OneRedis {
    let d = dir.join(format!("redis-{port}"));
    std::fs::create_dir_all(&d).expect("a directory");
    OneRedis::start(
        &d,
        &["--port".to_owned(), port.to_string()],
        &["-p".to_owned(), port.to_string()],
    )
}

/// A node of region `name` on its Redis at `port`.
fn node(dir: &Path, name: &str, port: u16) -> Node {
    node_on(dir, name, port, GLOBAL)
}

/// A node of region `name` on its Redis at `port`, the global tier at
/// `global`.
fn node_on(dir: &Path, name: &str, port: u16, global: u16) -> Node {
    let store = format!("redis://127.0.0.1:{port}");
    let global = format!("redis://127.0.0.1:{global}");
    Node::start_with(
        &dir.join(name),
        &store,
        name,
        &[],
        &[
            "--durability",
            "wal",
            "--grpc-listen",
            "off",
            "--region",
            name,
            "--global-store",
            &global,
        ],
    )
}

/// One impression of `camp` for a new user through `n`: screened with a
/// hold and committed on the same node. Whether it was delivered.
fn impression(n: &Node, camp: &str, user: &str) -> bool {
    let body = json!({"user": user, "candidates": [{"campaign": camp, "cost": 1}], "reserve": true, "ttl_ms": 2000});
    let (st, out) = n.call("POST", "/v1/screen", Some(&body));
    let Some(id) = out["reservation"].as_str().filter(|_| st == 200) else {
        return false;
    };
    let (st, _) = n.call_retrying(
        "POST",
        &format!("/v1/reservations/{id}/commit"),
        Some(&json!({})),
    );
    st == 200
}

/// Sends impressions of `camp` to both regions in turn, 20 a second each,
/// for `secs` or until `until` delivered in all; returns each region's
/// deliveries.
fn drive(a: &Node, b: &Node, camp: &str, tag: &str, secs: u64, until: u64) -> (u64, u64) {
    let (mut da, mut db) = (0u64, 0u64);
    let end = Instant::now() + Duration::from_secs(secs);
    let mut i = 0u64;
    while Instant::now() < end && da + db < until {
        if impression(a, camp, &format!("{tag}-a{i}")) {
            da += 1;
        }
        if impression(b, camp, &format!("{tag}-b{i}")) {
            db += 1;
        }
        i += 1;
        std::thread::sleep(Duration::from_millis(50));
    }
    (da, db)
}

/// Σ of every region's reported spend (`s:` fields) in the global tier's
/// leases (not its users' homes and counts, `fc:{rt:…}`).
fn global_spent() -> u64 {
    spent_at(GLOBAL)
}

/// Σ of the reported spend (`s:` fields) in the leases of the Redis at
/// `port`.
fn spent_at(port: u16) -> u64 {
    let keys = redis_cli(port, &["--scan"]);
    let mut sum = 0;
    for k in keys
        .lines()
        .filter(|k| !k.is_empty() && !k.starts_with("fc:{rt"))
    {
        let flat = redis_cli(port, &["HGETALL", k]);
        let lines: Vec<&str> = flat.lines().collect();
        for pair in lines.chunks(2) {
            if let [f, v] = pair
                && f.starts_with("s:")
            {
                sum += v.trim().parse::<u64>().unwrap_or(0);
            }
        }
    }
    sum
}

fn define(nodes: &[&Node], name: &str, def: &Value) {
    for n in nodes {
        let (st, body) = n.call_retrying("PUT", &format!("/v1/campaigns/{name}"), Some(def));
        assert_eq!(st, 200, "{body}");
    }
}

/// A rolling hour of 8, a rate of 2 a second and `max_in_flight` 3, each
/// wanted in both regions: across the two, the rolling cap exactly, the
/// rate within its bound, and 3 holds in flight — before, each region
/// enforced the whole of each (16, ~44 in 10 s and 6).
#[test]
fn rolling_windows_rates_and_holds_in_flight_hold_across_regions() {
    const G: u16 = 8200;
    let tmp = tempfile::tempdir().expect("temp dir");
    let _global = redis(tmp.path(), G);
    let _ra = redis(tmp.path(), G + 1);
    let _rb = redis(tmp.path(), G + 2);
    let a = node_on(tmp.path(), "a", G + 1, G);
    let b = node_on(tmp.path(), "b", G + 2, G);
    define(
        &[&a, &b],
        "roll",
        &json!({"caps": [{"kind": "window", "limit": 8, "window": "1h", "scope": "campaign"}]}),
    );
    define(
        &[&a, &b],
        "rate",
        &json!({"caps": [{"kind": "rate", "rate": 2, "per": "1s", "burst": 2, "scope": "campaign"}]}),
    );
    define(&[&a, &b], "flight", &json!({"max_in_flight": 3}));

    let (ra, rb) = drive(&a, &b, "roll", "roll", 15, u64::MAX);
    eprintln!("rolling hour of 8: a {ra}, b {rb}");
    assert_eq!(ra + rb, 8, "the rolling cap, across regions");

    let started = Instant::now();
    let (qa, qb) = drive(&a, &b, "rate", "rate", 10, u64::MAX);
    let secs = started.elapsed().as_secs_f64();
    eprintln!("rate of 2/s for {secs:.1} s: a {qa}, b {qb}");
    // The line's bound across regions: burst + rate (d + 4.4 s).
    assert!(
        (qa + qb) as f64 <= 2.0 + 2.0 * (secs + 4.4),
        "{} in {secs:.1} s at 2/s",
        qa + qb
    );
    assert!(qa + qb >= 10, "the rate is served: {}", qa + qb);

    // Holds of a minute, screened in both regions in turn: 3 once both
    // regions asked a while (within 20 s), and no more for 3 s after.
    let mut held = [0u64; 2];
    let mut end = Instant::now() + Duration::from_secs(20);
    let mut i = 0;
    let mut full = false;
    while Instant::now() < end {
        if !full && held[0] + held[1] >= 3 {
            full = true;
            end = Instant::now() + Duration::from_secs(3);
        }
        for (r, n) in [&a, &b].into_iter().enumerate() {
            let body = json!({"user": format!("f{r}-{i}"), "candidates": [{"campaign": "flight"}], "reserve": true, "ttl_ms": 60_000});
            let (st, out) = n.call("POST", "/v1/screen", Some(&body));
            if st == 200 && out["reservation"].is_string() {
                held[r] += 1;
            }
        }
        i += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("max_in_flight 3: a held {}, b held {}", held[0], held[1]);
    assert_eq!(held[0] + held[1], 3, "holds in flight, across regions");
}

#[test]
fn two_regions_share_a_budget_exactly_and_ride_out_a_partition() {
    support::away_from_midnight();
    let tmp = tempfile::tempdir().expect("temp dir");
    let global = redis(tmp.path(), GLOBAL);
    let _ra = redis(tmp.path(), REGION_A);
    let _rb = redis(tmp.path(), REGION_B);
    let a = node(tmp.path(), "a", REGION_A);
    let b = node(tmp.path(), "b", REGION_B);

    // Each region is a fleet of its own: the campaign is defined in both,
    // and numbered by each (region b has one more campaign before it, so
    // the numbers differ: the tier knows campaigns by name).
    define(&[&b], "b-only", &json!({"caps": []}));
    const BUDGET: u64 = 60;
    const CAP: u64 = 30;
    define(
        &[&a, &b],
        "bud",
        &json!({"budget": {"amount": BUDGET, "per": "1d", "pacing": "asap"}}),
    );
    define(
        &[&a, &b],
        "cap",
        &json!({"caps": [{"kind": "window", "limit": CAP, "window": "1d", "align": "fixed", "scope": "campaign"}]}),
    );
    // Demand past both in both regions: each delivers exactly, split
    // between the regions by their demand.
    let (ba, bb) = drive(&a, &b, "bud", "bud", 40, BUDGET);
    let (ca, cb) = drive(&a, &b, "cap", "cap", 40, CAP);
    eprintln!("budget {BUDGET}: a {ba}, b {bb}; cap {CAP}: a {ca}, b {cb}");
    assert_eq!(ba + bb, BUDGET, "the budget, across regions");
    assert_eq!(ca + cb, CAP, "the campaign cap, across regions");
    assert!(ba > 0 && bb > 0 && ca > 0 && cb > 0, "both regions deliver");
    // Past it, neither region delivers more.
    let (xa, xb) = drive(&a, &b, "bud", "more", 3, u64::MAX);
    assert_eq!((xa, xb), (0, 0), "over the budget");

    // A partition: the global tier stops answering every region.
    const P: u64 = 1000;
    define(
        &[&a, &b],
        "part",
        &json!({"budget": {"amount": P, "per": "1d", "pacing": "asap"}}),
    );
    // Both regions hold grants first (they grow with the regions' demand).
    let (pa, pb) = drive(&a, &b, "part", "before", 4, P);
    let pid = global.pid().to_string();
    let signal = |sig: &str| {
        let st = std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .expect("kill runs");
        assert!(st.success(), "kill {sig}");
    };
    signal("-STOP");
    // Cut off for 35 s, past the 31 s after which the tier reclaims a
    // silent region's grant: each region serves on its last grant
    // (`region_safe = keep`), which the tier grants no one else.
    let cut = Instant::now();
    let (qa, qb) = drive(&a, &b, "part", "during", 35, P);
    let reachable = a.metric("freqcap_region_reachable");
    signal("-CONT");
    eprintln!(
        "partition of {:.0} s: before it a {pa}, b {pb}; during it a {qa}, b {qb}",
        cut.elapsed().as_secs_f64()
    );
    assert_eq!(reachable, Some(0.0), "region a saw the tier unreachable");
    assert!(
        pa + pb + qa + qb <= P,
        "over the budget during the partition"
    );
    assert!(
        qa > 0 && qb > 0,
        "each region served on its grant while cut off"
    );
    // Demand was past what was left: only the grants held at the cut
    // bounded what the regions served.
    assert!(
        pa + pb + qa + qb < P,
        "the regions served past their grants while cut off"
    );
    // Healed: the rest is delivered, and not one unit more.
    let (ra, rb) = drive(&a, &b, "part", "after", 60, P - (pa + pb + qa + qb));
    let delivered = pa + pb + qa + qb + ra + rb;
    eprintln!("healed: a {ra}, b {rb}; {delivered} of {P}");
    assert_eq!(delivered, P, "the budget after healing");
    let (xa, xb) = drive(&a, &b, "part", "past", 3, u64::MAX);
    assert_eq!((xa, xb), (0, 0), "over the budget after healing");
    // Nothing counted twice: the tier's counts are what was delivered
    // (spend reports reach it within a couple of seconds).
    let all = BUDGET + CAP + P;
    let until = Instant::now() + Duration::from_secs(15);
    let mut seen = global_spent();
    while seen != all && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(250));
        seen = global_spent();
    }
    assert_eq!(seen, all, "the global tier's counts");
}

/// One screen of `camp` for `user` through `n`, committed if eligible:
/// whether it was delivered, and the denial's cap otherwise.
fn serve(n: &Node, camp: &str, user: &str) -> Result<(), String> {
    let body =
        json!({"user": user, "candidates": [{"campaign": camp}], "reserve": true, "ttl_ms": 2000});
    let (st, out) = n.call("POST", "/v1/screen", Some(&body));
    assert_eq!(st, 200, "{out}");
    let Some(id) = out["reservation"].as_str() else {
        return Err(out["results"][0]["denied_by"]["cap"]
            .as_str()
            .unwrap_or("?")
            .to_owned());
    };
    let (st, body) = n.call_retrying(
        "POST",
        &format!("/v1/reservations/{id}/commit"),
        Some(&json!({})),
    );
    assert_eq!(st, 200, "{body}");
    Ok(())
}

/// What region node `n`'s record of `user` has used of `camp`'s cap.
fn used(n: &Node, camp: &str, user: &str) -> u64 {
    let (st, out) = n.call("GET", &format!("/v1/users/{user}/campaigns/{camp}"), None);
    assert_eq!(st, 200, "{out}");
    out["caps"][0]["used"].as_u64().unwrap_or(0)
}

#[test]
fn a_user_is_capped_at_home_exactly_and_across_regions_within_one() {
    const G: u16 = 8170;
    support::away_from_midnight();
    let tmp = tempfile::tempdir().expect("temp dir");
    let _g = redis(tmp.path(), G);
    let _ra = redis(tmp.path(), G + 1);
    let _rb = redis(tmp.path(), G + 2);
    let a = node_on(tmp.path(), "a", G + 1, G);
    let b = node_on(tmp.path(), "b", G + 2, G);
    const CAP: u64 = 3;
    define(
        &[&a, &b],
        "freq",
        &json!({"caps": [{"kind": "window", "limit": CAP, "window": "1d", "align": "fixed", "scope": "user"}]}),
    );

    // At home: screened every 50 ms for 4 s, exactly the cap. Its first
    // unit holds the next screens until the home is claimed (a tick).
    let mut home = 0;
    let mut held = 0;
    for _ in 0..80 {
        match serve(&a, "freq", "stays") {
            Ok(()) => home += 1,
            Err(cap) if cap == "home_region" => held += 1,
            Err(_) => {}
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("at home: {home} delivered, {held} screens held for the home's claim");
    assert_eq!(home, CAP, "a user who stays home");

    // A traveller, first seen in region a (its home), then screened in
    // both regions in turn every 50 ms for 15 s.
    let mut got = [0u64; 2];
    assert_eq!(serve(&a, "freq", "goes"), Ok(()));
    got[0] += 1;
    let mut held_b = 0;
    let end = Instant::now() + Duration::from_secs(15);
    while Instant::now() < end {
        for (i, n) in [&b, &a].into_iter().enumerate() {
            match serve(n, "freq", "goes") {
                Ok(()) => got[1 - i] += 1,
                Err(cap) if cap == "home_region" => held_b += 1,
                Err(_) => {}
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let total = got[0] + got[1];
    eprintln!(
        "traveller: a {} b {}, {held_b} screens held for the home",
        got[0], got[1]
    );
    assert!(got[1] > 0, "served away from home");
    assert!(total >= CAP, "the cap delivered");
    assert!(total <= CAP + 1, "over by more than regions − 1: {total}");
    // Both regions' records converge on every unit delivered (a tick or
    // two each way).
    let until = Instant::now() + Duration::from_secs(15);
    while (used(&a, "freq", "goes"), used(&b, "freq", "goes")) != (total, total)
        && Instant::now() < until
    {
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(used(&a, "freq", "goes"), total, "home's record");
    assert_eq!(used(&b, "freq", "goes"), total, "the other region's record");
    // The one who stayed home is in region b's records not at all.
    assert_eq!(used(&b, "freq", "stays"), 0);
    assert!(a.metric("freqcap_region_applied_total").unwrap_or(0.0) >= 1.0);
    assert!(b.metric("freqcap_region_held_total").unwrap_or(0.0) >= 1.0);
}

/// SIGTERM: the node stops renewing, reports what it spent and exits 0
/// (on a Redis store its shutdown once called Redis from the runtime's
/// own thread and panicked, its last spend unreported).
#[test]
fn a_node_stopped_exits_cleanly_with_its_spend_reported() {
    const G: u16 = 8190;
    const R: u16 = 8191;
    let tmp = tempfile::tempdir().expect("temp dir");
    let _global = redis(tmp.path(), G);
    let _region = redis(tmp.path(), R);
    let mut a = node_on(tmp.path(), "a", R, G);
    define(
        &[&a],
        "bud",
        &json!({"budget": {"amount": 1000, "per": "1d", "pacing": "asap"}}),
    );
    // The region's first grant comes with its first tick.
    let until = Instant::now() + Duration::from_secs(10);
    let mut delivered = 0;
    let mut i = 0;
    while delivered < 5 && Instant::now() < until {
        if impression(&a, "bud", &format!("s{i}")) {
            delivered += 1;
        }
        i += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(delivered, 5, "delivered before the stop");
    support::signal(&a.child, libc::SIGTERM);
    let until = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(st) = a.child.try_wait().expect("waits on the node") {
            break st;
        }
        assert!(Instant::now() < until, "the node did not exit within 30 s");
        std::thread::sleep(Duration::from_millis(50));
    };
    let log = a.log.lock().expect("the log").join("\n");
    assert!(
        status.success(),
        "SIGTERM: a clean exit, got {status}\n{log}"
    );
    assert!(
        log.contains("lease calls made to the global tier, 0 failed"),
        "the node said what it called the tier for:\n{log}"
    );
    assert!(log.contains("stopped"), "{log}");
    assert_eq!(spent_at(R), 5, "the node's spend, in its region's Redis");
}
