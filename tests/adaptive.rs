//! The `adaptive` limit kind (docs/adaptive.md, "In the engine"; issue 29,
//! item 2): a concurrency limit per key that the samples releases and
//! commits carry move; exact under concurrency; with priorities; one per
//! key for a fleet on a shared store; bad values refused naming the field,
//! on the engine and over HTTP and gRPC.

use std::sync::{Arc, Barrier};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use freqcap::ManualClock;
use freqcap::api::{ApiOptions, router};
use freqcap::engine::{
    CheckRequest, CheckTarget, CommitRequest, Engine, EngineError, EngineOptions, Priority,
};
use freqcap::limits::adaptive::{Outcome, Sample};
use freqcap::model::{CampaignDef, PolicyDef, from_json};
use freqcap::store::{MemoryStore, SharedMemory, Store};
use serde_json::{Value, json};
use tower::ServiceExt;

/// 2023-11-14T22:13:20Z.
const T0: u64 = 1_700_000_000_000_000_000;
const MS: u64 = 1_000_000;

type Node = Engine<Arc<ManualClock>>;

fn engine_on(store: Arc<dyn Store>, clock: Arc<ManualClock>) -> Node {
    Engine::open(store, clock, EngineOptions::default()).unwrap()
}

fn engine(clock: Arc<ManualClock>) -> Node {
    engine_on(Arc::new(MemoryStore::new()), clock)
}

fn policy(json: &str) -> PolicyDef {
    from_json(json).expect("test policy is valid")
}

fn reserve(key: &str, class: Priority) -> CheckRequest {
    CheckRequest {
        target: CheckTarget::Policy("api".into()),
        key: key.into(),
        cost: 1,
        reserve: true,
        ttl_ms: Some(60_000),
        reservation_id: None,
        fingerprint: None,
        priority: class,
    }
}

fn ok(ms: u64) -> Option<Sample> {
    Some(Sample {
        latency: ms * MS,
        outcome: Outcome::Ok,
    })
}

/// Reserves every slot key `k` allows now, returning the ids.
fn fill(e: &Node, k: &str) -> Vec<String> {
    let mut ids = Vec::new();
    for _ in 0..10_000 {
        let out = e.check(&reserve(k, Priority::Default)).unwrap();
        match out.reservation {
            Some(id) if out.decision.allowed => ids.push(id),
            _ => return ids,
        }
    }
    panic!("no limit reached in 10 000 reservations");
}

/// The limit key `k`'s decisions report now (an immediate check holds
/// nothing).
fn limit_now(e: &Node, k: &str) -> u64 {
    let mut r = reserve(k, Priority::Default);
    r.reserve = false;
    let d = e.check(&r).unwrap().decision;
    d.items[0].limit
}

/// `rounds` rounds of 10 ms: every slot taken, then all released with
/// latency `ms` (or dropped); returns the limit after.
fn rounds(e: &Node, clock: &ManualClock, k: &str, n: u32, sample: Option<Sample>) -> u64 {
    for _ in 0..n {
        let ids = fill(e, k);
        clock.advance(10 * MS);
        for id in ids {
            e.release_with(&id, None, sample).unwrap();
        }
    }
    limit_now(e, k)
}

/// Many threads reserving at once get exactly the limit's slots, and the
/// answer's `limit` is the key's current limit, `kind` "adaptive".
#[test]
fn concurrent_reservations_take_exactly_the_current_limit() {
    let clock = Arc::new(ManualClock::new(T0));
    let e = Arc::new(engine(clock));
    e.put_policy(
        "api",
        policy(r#"{"limits": [{"kind": "adaptive", "initial": 8, "min": 2, "max": 100}]}"#),
    )
    .unwrap();
    let threads = 32;
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (e, barrier) = (e.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                let out = e.check(&reserve("k", Priority::Default)).unwrap();
                assert_eq!(out.stack.items()[0].kind().as_str(), "adaptive");
                assert_eq!(out.decision.items[0].limit, 8);
                usize::from(out.decision.allowed)
            })
        })
        .collect();
    let granted: usize = handles.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(granted, 8);
    // Another key has its own slots.
    assert_eq!(fill(&e, "other").len(), 8);
}

/// Fast, used windows grow the limit; latency far above the no-load
/// latency shrinks it; drops shrink it to its floor and never raise it.
#[test]
fn samples_move_the_limit_between_its_floor_and_ceiling() {
    let clock = Arc::new(ManualClock::new(T0));
    let e = engine(clock.clone());
    e.put_policy(
        "api",
        policy(r#"{"limits": [{"kind": "adaptive", "initial": 10, "min": 3, "max": 60}]}"#),
    )
    .unwrap();
    assert_eq!(limit_now(&e, "k"), 10);
    let grown = rounds(&e, &clock, "k", 100, ok(10));
    assert!(grown > 10, "grew to {grown}");
    assert!(grown <= 60);
    let queued = rounds(&e, &clock, "k", 100, ok(200));
    assert!(queued < grown, "{queued} after {grown}");
    let mut last = queued;
    let dropped = Some(Sample {
        latency: 0,
        outcome: Outcome::Dropped,
    });
    for _ in 0..40 {
        let now = rounds(&e, &clock, "k", 10, dropped);
        assert!(now <= last, "drops raised the limit from {last} to {now}");
        last = now;
    }
    assert_eq!(last, 3);
    // Ignored samples and releases without one change nothing.
    let ignored = Some(Sample {
        latency: 5 * MS,
        outcome: Outcome::Ignored,
    });
    assert_eq!(rounds(&e, &clock, "k", 50, ignored), 3);
    assert_eq!(rounds(&e, &clock, "k", 50, None), 3);
}

/// A commit carries a sample as a release does; an expired slot teaches
/// nothing, and its late release is unknown.
#[test]
fn commits_report_and_expired_slots_do_not() {
    let clock = Arc::new(ManualClock::new(T0));
    let e = engine(clock.clone());
    e.put_policy(
        "api",
        policy(r#"{"limits": [{"kind": "adaptive", "initial": 10, "min": 1, "max": 60, "algorithm": "aimd"}]}"#),
    )
    .unwrap();
    // AIMD: +1 a used window without drops.
    for _ in 0..30 {
        let ids = fill(&e, "k");
        clock.advance(10 * MS);
        for id in ids {
            let c = CommitRequest {
                sample: ok(5),
                ..Default::default()
            };
            e.commit(&id, &c).unwrap();
        }
    }
    let grown = limit_now(&e, "k");
    assert!(grown > 10, "{grown}");
    let ids = fill(&e, "k");
    clock.advance(61_000 * MS);
    for id in &ids {
        let late = e.release_with(id, None, ok(60_000));
        assert!(matches!(late, Err(EngineError::NotFound(_))), "{late:?}");
    }
    assert_eq!(limit_now(&e, "k"), grown);
}

/// Shares apply to the limit as it is: sheddable traffic gets half of the
/// current limit, the rest keep the whole, and it moves with it.
#[test]
fn priorities_take_their_share_of_the_current_limit() {
    let clock = Arc::new(ManualClock::new(T0));
    let e = engine(clock.clone());
    e.put_policy(
        "api",
        policy(
            r#"{"limits": [{"kind": "adaptive", "initial": 10, "min": 2, "max": 40,
                "priorities": {"sheddable": 0.5}}]}"#,
        ),
    )
    .unwrap();
    let take = |class| {
        let out = e.check(&reserve("k", class)).unwrap();
        (out.decision.allowed, out.decision.items[0].limit)
    };
    for _ in 0..5 {
        assert_eq!(take(Priority::Sheddable), (true, 5));
    }
    assert_eq!(take(Priority::Sheddable), (false, 5));
    for _ in 0..5 {
        assert_eq!(take(Priority::Critical), (true, 10));
    }
    assert_eq!(take(Priority::Critical), (false, 10));
}

/// Two nodes on one shared store share one controller and one set of
/// slots per key: what one node's releases teach, the other decides by.
#[test]
fn a_fleet_shares_one_limit_per_key() {
    let store = Arc::new(SharedMemory::new());
    let (ca, cb) = (
        Arc::new(ManualClock::new(T0)),
        Arc::new(ManualClock::new(T0)),
    );
    let a = engine_on(store.clone(), ca.clone());
    let b = engine_on(store.clone(), cb.clone());
    let def = policy(r#"{"limits": [{"kind": "adaptive", "initial": 6, "min": 2, "max": 50}]}"#);
    a.put_policy("api", def.clone()).unwrap();
    b.put_policy("api", def).unwrap();
    // Slots: six for the fleet, wherever they are taken.
    let on_a = fill(&a, "k");
    assert_eq!(on_a.len(), 6);
    assert!(fill(&b, "k").is_empty());
    for id in on_a {
        a.release(&id).unwrap();
    }
    // Node a teaches, node b sees the limit it learned.
    for _ in 0..100 {
        let ids = fill(&a, "k");
        ca.advance(10 * MS);
        cb.advance(10 * MS);
        for id in ids {
            a.release_with(&id, None, ok(10)).unwrap();
        }
    }
    let learned = limit_now(&a, "k");
    assert!(learned > 6, "{learned}");
    assert_eq!(limit_now(&b, "k"), learned);
    assert_eq!(fill(&b, "k").len() as u64, learned);
}

/// Bad definitions are refused naming the field.
#[test]
fn bad_definitions_name_the_field() {
    let cases = [
        (r#"{"kind": "adaptive"}"#, "limits[0].max"),
        (r#"{"kind": "adaptive", "max": 0}"#, "limits[0].max"),
        (r#"{"kind": "adaptive", "max": 2000000}"#, "limits[0].max"),
        (
            r#"{"kind": "adaptive", "max": 10, "min": 20}"#,
            "limits[0].min",
        ),
        (
            r#"{"kind": "adaptive", "max": 10, "min": "1s"}"#,
            "limits[0].min",
        ),
        (
            r#"{"kind": "adaptive", "max": 10, "initial": 11}"#,
            "limits[0].initial",
        ),
        (
            r#"{"kind": "adaptive", "max": 10, "algorithm": "bbr"}"#,
            "limits[0].algorithm",
        ),
        (
            r#"{"kind": "adaptive", "max": 10, "tolerance": 2}"#,
            "limits[0].tolerance",
        ),
        (
            r#"{"kind": "adaptive", "max": 10, "algorithm": "gradient", "tolerance": 0.5}"#,
            "limits[0].tolerance",
        ),
        (
            r#"{"kind": "adaptive", "max": 10, "backoff": 0.9}"#,
            "limits[0].backoff",
        ),
        (
            r#"{"kind": "adaptive", "max": 10, "algorithm": "aimd", "backoff": 1.5}"#,
            "limits[0].backoff",
        ),
        (
            r#"{"kind": "adaptive", "max": 10, "window": "0ms"}"#,
            "limits[0].window",
        ),
        (
            r#"{"kind": "adaptive", "max": 10, "rate": 5}"#,
            "limits[0].rate",
        ),
        (r#"{"kind": "gap", "min": 5}"#, "limits[0].min"),
    ];
    for (item, field) in cases {
        let text = format!(r#"{{"limits": [{item}]}}"#);
        let e = from_json::<PolicyDef>(&text)
            .map_err(|e| e.to_string())
            .and_then(|p| p.compile().map(drop).map_err(|e| e.to_string()))
            .expect_err(item);
        assert!(e.starts_with(field), "{item}: {e}");
    }
    // A campaign's cap is never adaptive: slots belong to a check's
    // reservation.
    let c: CampaignDef = from_json(r#"{"caps": [{"kind": "adaptive", "max": 10}]}"#).unwrap();
    let e = c.compile().map(drop).unwrap_err().to_string();
    assert!(e.starts_with("caps[0].kind"), "{e}");
}

async fn post(app: &axum::Router, path: &str, body: Value) -> (StatusCode, Value) {
    let r = app
        .clone()
        .oneshot(
            Request::post(path)
                .header("content-type", "application/json")
                .body(Body::from(body.to_string()))
                .unwrap(),
        )
        .await
        .unwrap();
    let status = r.status();
    let bytes = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// Over HTTP: a release's `latency_ms` and `outcome` reach the item, and
/// bad ones are a 400 naming the field, settling nothing.
#[tokio::test]
async fn http_releases_report_and_bad_samples_are_400() {
    let clock = Arc::new(ManualClock::new(T0));
    let e = Arc::new(engine(clock.clone()));
    e.put_policy(
        "api",
        policy(r#"{"limits": [{"kind": "adaptive", "initial": 4, "min": 1, "max": 50, "algorithm": "aimd"}]}"#),
    )
    .unwrap();
    let options = ApiOptions {
        metrics_definitions: vec!["api".to_owned()],
        ..ApiOptions::default()
    };
    let app = router(e.clone(), options);
    let check = json!({"policy": "api", "key": "k", "reserve": true, "ttl_ms": 60000});
    let (s, d) = post(&app, "/v1/check", check.clone()).await;
    assert_eq!(s, StatusCode::OK, "{d}");
    assert_eq!(d["limits"][0]["kind"], "adaptive");
    let id = d["reservation"].as_str().unwrap().to_owned();
    let release = format!("/v1/reservations/{id}/release");
    for (body, field) in [
        (json!({"outcome": "slow", "latency_ms": 3}), "outcome"),
        (json!({"outcome": "ok"}), "latency_ms"),
        (json!({"latency_ms": 3_600_001}), "latency_ms"),
        (json!({"latency_ms": -1}), "latency_ms"),
    ] {
        let (s, err) = post(&app, &release, body.clone()).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}: {err}");
        let msg = err["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains(field), "{body}: {err}");
    }
    // Nothing was settled: the release with a good sample still applies.
    let (s, d) = post(&app, &release, json!({"latency_ms": 3, "outcome": "ok"})).await;
    assert_eq!(
        (s, d["outcome"].as_str()),
        (StatusCode::OK, Some("released"))
    );
    // Windows of ok samples grow an AIMD limit, as the answer's limit shows.
    for _ in 0..20 {
        let mut ids = Vec::new();
        loop {
            let (_, d) = post(&app, "/v1/check", check.clone()).await;
            if d["allowed"] != true {
                break;
            }
            ids.push(d["reservation"].as_str().unwrap().to_owned());
        }
        clock.advance(10 * MS);
        for id in ids {
            let path = format!("/v1/reservations/{id}/commit");
            let (s, d) = post(&app, &path, json!({"latency_ms": 2})).await;
            assert_eq!(s, StatusCode::OK, "{d}");
        }
    }
    let (_, d) = post(&app, "/v1/check", json!({"policy": "api", "key": "k"})).await;
    let limit = d["limits"][0]["limit"].as_u64().unwrap();
    assert!(limit > 4, "{d}");
    // The metric says the limit of the policy's last decision.
    let r = app
        .clone()
        .oneshot(Request::get("/metrics").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let text = axum::body::to_bytes(r.into_body(), 1 << 22).await.unwrap();
    let text = String::from_utf8_lossy(&text);
    let series = r#"freqcap_policy_adaptive_limit{policy="api"} "#;
    let exported = text.lines().find_map(|l| l.strip_prefix(series));
    assert_eq!(exported, Some(limit.to_string().as_str()), "{text}");
}
