//! The tower layer (src/tower.rs) around an axum router, in-process: 429
//! with the IETF fields, keys kept apart, costs, shaping, and the fail modes
//! of a remote freqcap that cannot be reached.
#![cfg(feature = "tower")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::get;
use freqcap::PolicyDef;
use freqcap::client::{Builder, FailMode};
use freqcap::engine::Priority;
use freqcap::model::from_json;
use freqcap::tower::{FnKey, HeaderKey, RateLimitLayer};
use tower::ServiceExt;

fn policy(json: &str) -> PolicyDef {
    from_json(json).unwrap()
}

fn app(layer: RateLimitLayer) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

async fn call(app: &Router, key: Option<&str>, cost: Option<&str>) -> axum::response::Response {
    let mut r = Request::get("/");
    if let Some(k) = key {
        r = r.header("x-api-key", k);
    }
    if let Some(c) = cost {
        r = r.header("x-cost", c);
    }
    app.clone()
        .oneshot(r.body(Body::empty()).unwrap())
        .await
        .unwrap()
}

fn header(r: &axum::response::Response, name: &str) -> Option<String> {
    r.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
}

#[tokio::test]
async fn denials_are_429_with_the_ietf_fields_and_keys_are_apart() {
    let p =
        policy(r#"{"limits": [{"kind": "rate", "rate": 2, "per": "1m", "name": "per-minute"}]}"#);
    let app = app(RateLimitLayer::local(&p, HeaderKey::new("x-api-key")).unwrap());
    let first = call(&app, Some("a"), None).await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(
        header(&first, "ratelimit-policy").as_deref(),
        Some("\"per-minute\";q=2;w=60")
    );
    assert_eq!(
        header(&first, "ratelimit").as_deref(),
        Some("\"per-minute\";r=1;t=30")
    );
    assert_eq!(call(&app, Some("a"), None).await.status(), StatusCode::OK);
    let denied = call(&app, Some("a"), None).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&denied, "retry-after").as_deref(), Some("30"));
    assert_eq!(
        header(&denied, "ratelimit").as_deref(),
        Some("\"per-minute\";r=0;t=60")
    );
    // Another key has its own limit; requests without the header share `-`.
    assert_eq!(call(&app, Some("b"), None).await.status(), StatusCode::OK);
    assert_eq!(call(&app, None, None).await.status(), StatusCode::OK);
    assert_eq!(call(&app, None, None).await.status(), StatusCode::OK);
    assert_eq!(
        call(&app, None, None).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn costs_come_from_the_request() {
    let p = policy(r#"{"limits": [{"kind": "window", "limit": 10, "window": "1h"}]}"#);
    let layer = RateLimitLayer::local(
        &p,
        FnKey(|_: &axum::http::request::Parts| Some("all".into())),
    )
    .unwrap()
    .cost(|parts| {
        parts
            .headers
            .get("x-cost")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(1)
    });
    let app = app(layer);
    assert_eq!(call(&app, None, Some("7")).await.status(), StatusCode::OK);
    // 3 left: a cost of 4 is refused, 3 passes.
    assert_eq!(
        call(&app, None, Some("4")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    let r = call(&app, None, Some("3")).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert!(header(&r, "ratelimit").unwrap().contains(";r=0;"));
}

#[tokio::test]
async fn shaping_delays_instead_of_refusing() {
    // 10 per second, burst 1: the second request at once would wait 100 ms.
    let p = policy(r#"{"limits": [{"kind": "rate", "rate": 10, "per": "1s", "burst": 1}]}"#);
    let shaped = app(RateLimitLayer::local(&p, HeaderKey::new("x-api-key"))
        .unwrap()
        .shape(Duration::from_millis(500)));
    assert_eq!(
        call(&shaped, Some("k"), None).await.status(),
        StatusCode::OK
    );
    let t = Instant::now();
    assert_eq!(
        call(&shaped, Some("k"), None).await.status(),
        StatusCode::OK
    );
    assert!(
        t.elapsed() >= Duration::from_millis(90),
        "{:?}",
        t.elapsed()
    );
    // A wait over the bound is still refused at once.
    let strict = app(RateLimitLayer::local(&p, HeaderKey::new("x-api-key"))
        .unwrap()
        .shape(Duration::from_millis(50)));
    assert_eq!(
        call(&strict, Some("k"), None).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        call(&strict, Some("k"), None).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn a_remote_freqcap_that_cannot_be_reached() {
    // A port nothing listens on (bound, then closed).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let client = Arc::new(
        Builder::new([format!("127.0.0.1:{port}")])
            .adaptive_throttling(None)
            .build()
            .unwrap(),
    );
    let layer = |mode| {
        RateLimitLayer::remote(
            client.clone(),
            "api",
            Duration::from_millis(200),
            HeaderKey::new("x-api-key"),
        )
        .fail(mode)
    };
    let closed = app(layer(FailMode::Closed));
    assert_eq!(
        call(&closed, Some("k"), None).await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    let open = app(layer(FailMode::Open));
    assert_eq!(call(&open, Some("k"), None).await.status(), StatusCode::OK);
}

/// The application says each request's class (here from a header a trusted
/// proxy sets); a policy with shares refuses batch traffic at its share
/// while interactive traffic keeps the rest.
#[tokio::test]
async fn the_application_gives_each_request_its_class() {
    let p = policy(
        r#"{"limits": [{"kind": "window", "limit": 4, "window": "1h", "priorities": {"sheddable": 0.5}}]}"#,
    );
    let layer = RateLimitLayer::local(&p, FnKey(|_: &_| Some("all".to_owned())))
        .unwrap()
        .priority(
            |parts| match parts.headers.get("x-tier").map(|v| v.as_bytes()) {
                Some(b"batch") => Priority::Sheddable,
                _ => Priority::Critical,
            },
        );
    let app = app(layer);
    let tier = |t: &'static str| {
        let app = app.clone();
        async move {
            app.oneshot(
                Request::get("/")
                    .header("x-tier", t)
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap()
            .status()
        }
    };
    assert_eq!(tier("batch").await, StatusCode::OK);
    assert_eq!(tier("batch").await, StatusCode::OK);
    assert_eq!(tier("batch").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(tier("web").await, StatusCode::OK);
    assert_eq!(tier("web").await, StatusCode::OK);
    assert_eq!(tier("web").await, StatusCode::TOO_MANY_REQUESTS);
}

/// A service whose answers take 50 ms (all of a burst are decided before
/// any ends) and whose status the test sets.
fn measured_app(layer: RateLimitLayer, status: Arc<std::sync::atomic::AtomicU16>) -> Router {
    Router::new()
        .route(
            "/",
            get(move || {
                let status = status.clone();
                async move {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    let s = status.load(std::sync::atomic::Ordering::Relaxed);
                    (StatusCode::from_u16(s).unwrap(), "done")
                }
            }),
        )
        .layer(layer)
}

/// How many of `n` requests sent at once are admitted.
async fn admitted_of(app: &Router, n: usize) -> usize {
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move {
                let r = Request::get("/").header("x-api-key", "a");
                app.oneshot(r.body(Body::empty()).unwrap())
                    .await
                    .unwrap()
                    .status()
            })
        })
        .collect();
    let mut admitted = 0;
    for h in handles {
        if h.await.unwrap() != StatusCode::TOO_MANY_REQUESTS {
            admitted += 1;
        }
    }
    admitted
}

/// With an adaptive policy the layer holds a slot per request and releases
/// it with the latency it measured and the status's outcome: fast answers
/// grow the limit, 503s shrink it to its floor. No code in the application.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_measures_and_the_adaptive_limit_follows_the_service() {
    let p = policy(
        r#"{"limits": [{"kind": "adaptive", "initial": 4, "min": 2, "max": 64, "algorithm": "aimd"}]}"#,
    );
    let status = Arc::new(std::sync::atomic::AtomicU16::new(200));
    let app = measured_app(
        RateLimitLayer::local(&p, HeaderKey::new("x-api-key")).unwrap(),
        status.clone(),
    );
    // At the start, 4 slots: of 6 requests at once, 4 pass.
    assert_eq!(admitted_of(&app, 6).await, 4);
    // Fast, used windows: AIMD adds one a window (100 ms and 10 samples).
    let started = Instant::now();
    let mut grown = false;
    while !grown && started.elapsed() < Duration::from_secs(20) {
        grown = admitted_of(&app, 6).await == 6;
    }
    assert!(grown, "the limit never reached 6 in 20 s");
    // 503s are drops: the limit falls to its floor of 2.
    status.store(503, std::sync::atomic::Ordering::Relaxed);
    let started = Instant::now();
    let mut floor = false;
    while !floor && started.elapsed() < Duration::from_secs(20) {
        floor = admitted_of(&app, 4).await == 2;
    }
    assert!(floor, "the limit never fell to 2 in 20 s");
}

/// `header_style`: the layer names its fields `X-RateLimit-*` when asked,
/// as tower_governor's clients expect.
#[tokio::test]
async fn the_layer_names_its_fields_in_the_style_asked() {
    let p =
        policy(r#"{"limits": [{"kind": "rate", "rate": 2, "per": "1m", "name": "per-minute"}]}"#);
    let layer = RateLimitLayer::local(&p, HeaderKey::new("x-api-key"))
        .unwrap()
        .header_style(freqcap::tower::HeaderStyle::XRatelimit);
    let app = app(layer);
    let first = call(&app, Some("a"), None).await;
    assert_eq!(header(&first, "x-ratelimit-limit").as_deref(), Some("2"));
    assert_eq!(
        header(&first, "x-ratelimit-remaining").as_deref(),
        Some("1")
    );
    assert_eq!(header(&first, "x-ratelimit-reset").as_deref(), Some("30"));
    assert_eq!(header(&first, "ratelimit"), None);
    call(&app, Some("a"), None).await;
    let denied = call(&app, Some("a"), None).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        header(&denied, "x-ratelimit-remaining").as_deref(),
        Some("0")
    );
    assert_eq!(header(&denied, "retry-after").as_deref(), Some("30"));
}
