//! Hot keys on a fleet (docs/cluster.md, "Hot keys"; issue 47 item 2):
//! one policy key decided by three nodes at once, as API rate limiting's
//! commonest shape (one key per tenant) is. Before, its compare-and-sets
//! met each other's and 2–7 of 60 calls were answered 503; now the key is
//! frozen in the store once its writes conflict, and leased to the nodes.
//!
//! Real processes: a 3 + 3 Redis Cluster and three freqcap nodes on
//! loopback, started and stopped by the test.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

mod support;

use support::cluster::{Node, Redis, definition_reached, nodes};

/// Calls each load thread makes at most, and how long they run at most.
const CALLS_PER_THREAD: u64 = 40_000;
const RUN_FOR: Duration = Duration::from_secs(8);
/// Load threads per node.
const THREADS_PER_NODE: usize = 4;

/// What the load saw: allowed (200), denied (429), unavailable (503),
/// anything else.
#[derive(Default)]
struct Tally {
    allowed: AtomicU64,
    denied: AtomicU64,
    unavailable: AtomicU64,
    other: AtomicU64,
}

/// What one call was answered.
enum Seen {
    Allowed,
    Denied,
    Unavailable,
    Other,
}

/// Sends checks of `body` to every node from [`THREADS_PER_NODE`] threads
/// each, until [`RUN_FOR`] or [`CALLS_PER_THREAD`]; returns the tally and
/// the calls per second reached.
fn hammer(n: &[Node], body: &Value) -> (Arc<Tally>, f64) {
    hammer_with(
        n.len(),
        |i| &n[i],
        |node| {
            let (st, v) = node.call("POST", "/v1/check", Some(body));
            match st {
                200 => Seen::Allowed,
                429 => Seen::Denied,
                503 => {
                    eprintln!("503: {v}");
                    Seen::Unavailable
                }
                _ => {
                    eprintln!("{st}: {v}");
                    Seen::Other
                }
            }
        },
    )
}

/// Calls `call` on a connection `open`ed to each of `nodes` nodes, from
/// [`THREADS_PER_NODE`] threads each, until [`RUN_FOR`] or
/// [`CALLS_PER_THREAD`]; returns the tally and the calls per second reached.
fn hammer_with<S>(
    nodes: usize,
    open: impl Fn(usize) -> S + Sync,
    call: impl Fn(&mut S) -> Seen + Sync,
) -> (Arc<Tally>, f64) {
    let tally = Arc::new(Tally::default());
    let started = Instant::now();
    std::thread::scope(|s| {
        for i in 0..nodes {
            for _ in 0..THREADS_PER_NODE {
                let tally = tally.clone();
                let (open, call) = (&open, &call);
                s.spawn(move || {
                    let mut conn = open(i);
                    for _ in 0..CALLS_PER_THREAD {
                        if started.elapsed() >= RUN_FOR {
                            break;
                        }
                        let c = match call(&mut conn) {
                            Seen::Allowed => &tally.allowed,
                            Seen::Denied => &tally.denied,
                            Seen::Unavailable => &tally.unavailable,
                            Seen::Other => &tally.other,
                        };
                        c.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        }
    });
    let calls = [
        &tally.allowed,
        &tally.denied,
        &tally.unavailable,
        &tally.other,
    ]
    .iter()
    .map(|c| c.load(Ordering::Relaxed))
    .sum::<u64>();
    (tally, calls as f64 / started.elapsed().as_secs_f64())
}

/// Waits until at least `margin` is left of the current hour (fixed 1 h
/// windows), so one run counts in one window.
fn clear_of_the_hour(margin: Duration) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970");
    let into = now.as_secs() % 3600;
    let left = 3600 - into;
    if left < margin.as_secs() {
        std::thread::sleep(Duration::from_secs(left + 1));
    }
}

/// A fixed window decided by three nodes at once, hammered at the rate
/// this machine gives: no call answered 503, never one admitted over the
/// limit (windows are leased in units: exact), and the limit delivered.
#[test]
fn one_key_decided_on_three_nodes_at_once_is_leased_exactly() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let redis = Redis::start(&tmp.path().join("redis"), 8020);
    let n = nodes(tmp.path(), &redis, 3, &["--redis-timeout-ms", "2000"]);
    const LIMIT: u64 = 3_000;
    let policy = json!({"limits": [
        {"kind": "window", "limit": LIMIT, "window": "1h", "align": "fixed"}]});
    let (st, body) = n[0].call_retrying("PUT", "/v1/policies/tenant", Some(&policy));
    assert_eq!(st, 200, "{body}");
    definition_reached(&n[1..], "/v1/policies/tenant");
    clear_of_the_hour(Duration::from_secs(30));
    let check = json!({"policy": "tenant", "key": "acme"});
    let (tally, rate) = hammer(&n, &check);
    let allowed = tally.allowed.load(Ordering::Relaxed);
    let denied = tally.denied.load(Ordering::Relaxed);
    let unavailable = tally.unavailable.load(Ordering::Relaxed);
    let hot: Vec<f64> = n
        .iter()
        .map(|x| x.metric("freqcap_hot_keys_total").unwrap_or(-1.0))
        .collect();
    eprintln!(
        "{rate:.0} calls/s: {allowed} allowed, {denied} denied, {unavailable} unavailable; \
         hot keys per node {hot:?}"
    );
    assert_eq!(unavailable, 0, "calls answered 503");
    assert_eq!(
        tally.other.load(Ordering::Relaxed),
        0,
        "calls answered neither 200, 429 nor 503"
    );
    assert!(
        allowed + denied > 2 * LIMIT,
        "demand must pass the limit: {allowed} + {denied}"
    );
    assert!(allowed <= LIMIT, "{allowed} admitted of {LIMIT}");
    assert!(
        hot.iter().all(|&h| h >= 1.0),
        "every node decided the key on leases: {hot:?}"
    );
    // Every node's figures agree with what was admitted, within the
    // seconds a report takes.
    let mut left = Vec::new();
    for x in &n {
        let (st, d) = x.call(
            "POST",
            "/v1/check",
            Some(&json!({"policy": "tenant", "key": "acme", "cost": 0})),
        );
        assert_eq!(st, 200, "{d}");
        left.push(d["remaining"].as_u64().unwrap_or(u64::MAX));
    }
    eprintln!("remaining as each node reads it: {left:?}");
    assert!(
        allowed * 100 >= LIMIT * 99,
        "{allowed} of {LIMIT} delivered (≥ 99 % when demand is over 2×)"
    );
}

/// A rate (token bucket) decided by three nodes at once: no call answered
/// 503, and the fleet admits within the token line's stated bound, burst +
/// r·(d + 100 ms) in the run's length d, plus one burst at the switch
/// (docs/cluster.md, "Hot keys").
#[test]
fn one_rate_decided_on_three_nodes_at_once_holds_its_line() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let redis = Redis::start(&tmp.path().join("redis"), 8040);
    let n = nodes(tmp.path(), &redis, 3, &["--redis-timeout-ms", "2000"]);
    const RATE: u64 = 200;
    const BURST: u64 = 20;
    let policy = json!({"limits": [
        {"kind": "rate", "rate": RATE, "per": "1s", "burst": BURST}]});
    let (st, body) = n[0].call_retrying("PUT", "/v1/policies/api", Some(&policy));
    assert_eq!(st, 200, "{body}");
    definition_reached(&n[1..], "/v1/policies/api");
    let check = json!({"policy": "api", "key": "acme"});
    let started = Instant::now();
    let (tally, rate) = hammer(&n, &check);
    let secs = started.elapsed().as_secs_f64();
    let allowed = tally.allowed.load(Ordering::Relaxed);
    let denied = tally.denied.load(Ordering::Relaxed);
    let unavailable = tally.unavailable.load(Ordering::Relaxed);
    let line = BURST as f64 + RATE as f64 * secs;
    eprintln!(
        "{rate:.0} calls/s for {secs:.1} s: {allowed} allowed ({:+.1} % against the line's \
         {line:.0}), {denied} denied, {unavailable} unavailable",
        (allowed as f64 / line - 1.0) * 100.0
    );
    assert_eq!(unavailable, 0, "calls answered 503");
    assert_eq!(
        tally.other.load(Ordering::Relaxed),
        0,
        "calls answered neither 200, 429 nor 503"
    );
    assert!(allowed + denied > 2 * allowed, "demand must pass the rate");
    // The line's bound over the run (100 ms of lookahead), one burst more
    // for the switch (the line starts full), and 100 ms of margin for the
    // clocks' ticks.
    let bound = 2.0 * BURST as f64 + RATE as f64 * (secs + 0.2);
    assert!(
        (allowed as f64) <= bound,
        "{allowed} admitted, bound {bound:.0}"
    );
    assert!(
        allowed as f64 >= 0.9 * RATE as f64 * secs,
        "{allowed} admitted in {secs:.1} s at {RATE}/s"
    );
}

/// One Envoy descriptor decided by three nodes at once through the rate
/// limit service (gRPC, `check_all`): no call fails, and the descriptor's
/// limit is admitted exactly.
#[test]
fn one_envoy_descriptor_decided_on_three_nodes_at_once_is_leased_exactly() {
    use freqcap::rls::pb::{
        RateLimitDescriptor, RateLimitRequest, rate_limit_descriptor::Entry,
        rate_limit_response::Code, rate_limit_service_client::RateLimitServiceClient,
    };
    support::away_from_midnight();
    let tmp = tempfile::tempdir().expect("temp dir");
    let redis = Redis::start(&tmp.path().join("redis"), 8060);
    let rules = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/rls");
    let extra = [
        "--rls-config",
        rules.to_str().expect("utf-8 path"),
        "--grpc-listen",
        "127.0.0.1:0",
        "--redis-timeout-ms",
        "2000",
    ];
    let n = nodes(tmp.path(), &redis, 3, &extra);
    let addrs: Vec<String> = n
        .iter()
        .map(|x| support::logged_addr(&x.log, "gRPC listening on "))
        .collect();
    // `wide`: 1 000 a day (tests/rls/internal.yaml).
    const LIMIT: usize = 1_000;
    let request = RateLimitRequest {
        domain: "internal".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "wide".into(),
                value: "w".into(),
            }],
            ..Default::default()
        }],
        hits_addend: 1,
    };
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    let started = Instant::now();
    let (allowed, over, failed) = rt.block_on(async {
        let mut calls = tokio::task::JoinSet::new();
        for addr in &addrs {
            for _ in 0..THREADS_PER_NODE {
                let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                    .expect("an address")
                    .connect()
                    .await
                    .expect("connects");
                let mut c = RateLimitServiceClient::new(ch);
                let r = request.clone();
                calls.spawn(async move {
                    let (mut allowed, mut over, mut failed) = (0, 0, 0);
                    for _ in 0..300 {
                        match c.should_rate_limit(r.clone()).await {
                            Ok(a) if a.get_ref().overall_code == Code::Ok as i32 => allowed += 1,
                            Ok(_) => over += 1,
                            Err(e) => {
                                eprintln!("rls: {e}");
                                failed += 1
                            }
                        }
                    }
                    (allowed, over, failed)
                });
            }
        }
        calls
            .join_all()
            .await
            .into_iter()
            .fold((0, 0, 0), |t, x| (t.0 + x.0, t.1 + x.1, t.2 + x.2))
    });
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "{:.0} calls/s: {allowed} allowed, {over} over the limit, {failed} failed",
        (allowed + over + failed) as f64 / secs
    );
    let hot: Vec<f64> = n
        .iter()
        .map(|x| x.metric("freqcap_hot_keys_total").unwrap_or(-1.0))
        .collect();
    assert_eq!(failed, 0, "calls failed (UNAVAILABLE)");
    assert!(allowed + over > 2 * LIMIT, "demand must pass the limit");
    assert!(
        hot.iter().all(|&h| h >= 1.0),
        "every node decided the descriptor on leases: {hot:?}"
    );
    assert!(allowed <= LIMIT, "{allowed} admitted of {LIMIT}");
    assert!(
        allowed * 100 >= LIMIT * 99,
        "{allowed} of {LIMIT} delivered"
    );
    // Usage reported after the fact (docs/rls.md, "Reports and refunds")
    // counts on the hot key's grants, answered OK; a refund is refused
    // while the key is hot, changing nothing.
    let (report, refund) = rt.block_on(async {
        let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", addrs[0]))
            .expect("an address")
            .connect()
            .await
            .expect("connects");
        let mut c = RateLimitServiceClient::new(ch);
        let mut marked = request.clone();
        marked.descriptors[0].entries.push(Entry {
            key: "x-freqcap-report".into(),
            value: "true".into(),
        });
        let report = c.should_rate_limit(marked).await;
        let mut negative = request.clone();
        negative.descriptors[0].is_negative_hits = true;
        (report, c.should_rate_limit(negative).await)
    });
    let report = report.expect("a report is answered");
    assert_eq!(report.get_ref().overall_code, Code::Ok as i32);
    let refused = refund.expect_err("a refund on a hot key");
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused}");
    assert!(refused.message().contains("hot"), "{refused}");
}

/// One `CL.THROTTLE` key decided by three nodes at once over RESP: no call
/// answered an error, and the fleet admits within the key's token line's
/// bound, as a policy rate's (docs/cluster.md, "Hot keys").
#[test]
fn one_throttled_key_decided_on_three_nodes_at_once_holds_its_line() {
    use std::io::{BufRead, BufReader, Write};
    use std::net::TcpStream;
    let tmp = tempfile::tempdir().expect("temp dir");
    let redis = Redis::start(&tmp.path().join("redis"), 8080);
    let extra = ["--resp-listen", "127.0.0.1:0", "--redis-timeout-ms", "2000"];
    let n = nodes(tmp.path(), &redis, 3, &extra);
    let addrs: Vec<String> = n
        .iter()
        .map(|x| support::logged_addr(&x.log, "RESP (Redis protocol) listening on "))
        .collect();
    // redis-cell's words: a burst of 19 on top of the first call, 200 a second.
    const RATE: u64 = 200;
    const BURST: u64 = 20;
    let cmd: Vec<u8> = {
        let args = ["CL.THROTTLE", "tenant:acme", "19", "200", "1", "1"];
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
        }
        out
    };
    let started = Instant::now();
    let (tally, rate) = hammer_with(
        n.len(),
        |i| {
            let s = TcpStream::connect(&addrs[i]).expect("connects over RESP");
            s.set_read_timeout(Some(Duration::from_secs(10)))
                .expect("a timeout");
            BufReader::new(s)
        },
        |conn| {
            conn.get_mut().write_all(&cmd).expect("writes");
            let mut line = String::new();
            conn.read_line(&mut line).expect("a reply in time");
            if let Some(e) = line.strip_prefix('-') {
                eprintln!("CL.THROTTLE: {}", e.trim_end());
                return Seen::Unavailable;
            }
            assert_eq!(line, "*5\r\n", "an array of five integers");
            let mut ints = [0i64; 5];
            for v in &mut ints {
                line.clear();
                conn.read_line(&mut line).expect("a reply in time");
                *v = line
                    .trim_end()
                    .strip_prefix(':')
                    .and_then(|x| x.parse().ok())
                    .expect("an integer");
            }
            match ints[0] {
                0 => Seen::Allowed,
                1 => Seen::Denied,
                _ => Seen::Other,
            }
        },
    );
    let secs = started.elapsed().as_secs_f64();
    let allowed = tally.allowed.load(Ordering::Relaxed);
    let denied = tally.denied.load(Ordering::Relaxed);
    let failed = tally.unavailable.load(Ordering::Relaxed);
    let line = BURST as f64 + RATE as f64 * secs;
    let hot: Vec<f64> = n
        .iter()
        .map(|x| x.metric("freqcap_hot_keys_total").unwrap_or(-1.0))
        .collect();
    eprintln!(
        "{rate:.0} calls/s for {secs:.1} s: {allowed} allowed ({:+.1} % against the line's \
         {line:.0}), {denied} limited, {failed} errors; hot keys per node {hot:?}",
        (allowed as f64 / line - 1.0) * 100.0
    );
    assert_eq!(failed, 0, "calls answered an error");
    assert_eq!(
        tally.other.load(Ordering::Relaxed),
        0,
        "replies neither 0 nor 1"
    );
    assert!(allowed + denied > 2 * allowed, "demand must pass the rate");
    assert!(
        hot.iter().all(|&h| h >= 1.0),
        "every node decided the key on leases: {hot:?}"
    );
    // As a policy rate's: the line over the run with 100 ms of lookahead,
    // one burst more at the switch, 100 ms of margin for the clocks' ticks.
    let bound = 2.0 * BURST as f64 + RATE as f64 * (secs + 0.2);
    assert!(
        (allowed as f64) <= bound,
        "{allowed} admitted, bound {bound:.0}"
    );
    assert!(
        allowed as f64 >= 0.9 * RATE as f64 * secs,
        "{allowed} admitted in {secs:.1} s at {RATE}/s"
    );
}
