//! The HTTP layer in-process over loopback: metrics, the OpenAPI document,
//! tokens, load shedding, checkpoints, error shapes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use freqcap::api::{ApiOptions, router};
use freqcap::engine::{Engine, EngineOptions};
use freqcap::store::{Durability, MemoryStore, RocksStore, Store};
use serde_json::{Value, json};

/// A router on the system clock, served on 127.0.0.1 by its own runtime.
struct Live {
    base: String,
    agent: ureq::Agent,
    _rt: tokio::runtime::Runtime,
}

impl Live {
    fn start(store: Arc<dyn Store>, options: ApiOptions) -> Live {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let engine =
            Engine::open(store, freqcap::SystemClock::new(), EngineOptions::default()).unwrap();
        let app = router(Arc::new(engine), options);
        rt.spawn(async move { axum::serve(listener, app).await });
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(10)))
            // A fresh connection per request: the server closes a connection
            // whose request body it answered without reading (a 401 for a
            // PUT), and a pooled one would then fail the next request.
            .max_idle_connections(0)
            .build()
            .into();
        Live {
            base: format!("http://{addr}"),
            agent,
            _rt: rt,
        }
    }

    /// Sends a request; `token` goes in `Authorization: Bearer`. Returns the
    /// status, the body as JSON (or a string) and the response headers.
    fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
        token: Option<&str>,
    ) -> (u16, Value, ureq::http::HeaderMap) {
        let url = format!("{}{path}", self.base);
        let auth = token.map(|t| format!("Bearer {t}"));
        macro_rules! with_auth {
            ($req:expr) => {{
                let r = $req;
                match &auth {
                    Some(a) => r.header("Authorization", a),
                    None => r,
                }
            }};
        }
        let sent = match method {
            "GET" => with_auth!(self.agent.get(&url)).call(),
            "DELETE" => with_auth!(self.agent.delete(&url)).call(),
            "POST" => {
                let r = with_auth!(self.agent.post(&url));
                match body {
                    Some(b) => r.send_json(b),
                    None => r.send_empty(),
                }
            }
            "PUT" => with_auth!(self.agent.put(&url)).send_json(body.unwrap_or(Value::Null)),
            other => panic!("{other}"),
        };
        let mut r = sent.unwrap();
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        let text = r.body_mut().read_to_string().unwrap();
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, value, headers)
    }

    fn metrics(&self) -> String {
        match self.send("GET", "/metrics", None, None) {
            (200, Value::String(text), _) => text,
            other => panic!("{other:?}"),
        }
    }
}

fn memory() -> Arc<dyn Store> {
    Arc::new(MemoryStore::new())
}

/// The value of one sample line `name{labels} value` in exposition text.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn metrics_count_requests_decisions_and_engine_figures() {
    let live = Live::start(memory(), ApiOptions::default());
    let policy =
        json!({"limits": [{"kind": "window", "limit": 1, "window": "1h", "align": "fixed"}]});
    assert_eq!(
        live.send("PUT", "/v1/policies/p", Some(policy), None).0,
        200
    );
    let check = json!({"policy": "p", "key": "k"});
    assert_eq!(
        live.send("POST", "/v1/check", Some(check.clone()), None).0,
        200
    );
    assert_eq!(live.send("POST", "/v1/check", Some(check), None).0, 429);
    let reserve = json!({"policy": "p", "key": "other", "reserve": true, "reservation_id": "r1"});
    assert_eq!(live.send("POST", "/v1/check", Some(reserve), None).0, 200);
    assert_eq!(live.send("GET", "/v1/policies/nope", None, None).0, 404);
    live.send("GET", "/v1/policies/some-id-1", None, None);

    let text = live.metrics();
    let check_ok = r#"freqcap_http_requests_total{endpoint="/v1/check",status="200"}"#;
    assert_eq!(sample(&text, check_ok), Some(2.0), "{text}");
    let denied = r#"freqcap_http_requests_total{endpoint="/v1/check",status="429"}"#;
    assert_eq!(sample(&text, denied), Some(1.0));
    // Ids in paths never become labels: both GETs count under the template.
    let gets = r#"freqcap_http_requests_total{endpoint="/v1/policies/{name}",status="404"}"#;
    assert_eq!(sample(&text, gets), Some(2.0));
    let allowed = r#"freqcap_decisions_total{endpoint="/v1/check",outcome="allowed"}"#;
    assert_eq!(sample(&text, allowed), Some(2.0));
    let denied = r#"freqcap_decisions_total{endpoint="/v1/check",outcome="denied"}"#;
    assert_eq!(sample(&text, denied), Some(1.0));
    assert_eq!(sample(&text, "freqcap_reservations_open"), Some(1.0));
    let latency = r#"freqcap_http_request_duration_seconds_count{endpoint="/v1/check"}"#;
    assert_eq!(sample(&text, latency), Some(3.0));
    for name in [
        "freqcap_writer_queue_depth",
        "freqcap_hot_records",
        "freqcap_hot_hits_total",
        "freqcap_disk_live_bytes",
        "freqcap_rocksdb_memtable_bytes",
        "freqcap_rocksdb_pending_compaction_bytes",
        "freqcap_rocksdb_estimated_keys",
        r#"freqcap_commits_total{outcome="late_commit"}"#,
        "freqcap_in_flight_requests",
    ] {
        assert!(sample(&text, name).is_some(), "{name} missing:\n{text}");
    }
    assert_eq!(
        live.send("POST", "/v1/reservations/r1/commit", None, None)
            .0,
        200
    );
    let text = live.metrics();
    assert_eq!(
        sample(&text, r#"freqcap_commits_total{outcome="committed"}"#),
        Some(1.0)
    );
    assert_eq!(sample(&text, "freqcap_reservations_open"), Some(0.0));
}

#[test]
fn openapi_is_served_and_matches_the_checked_in_file() {
    let live = Live::start(memory(), ApiOptions::default());
    let (status, served, headers) = live.send("GET", "/openapi.json", None, None);
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "application/json");
    let file = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/openapi.json"),
    )
    .unwrap();
    // Not assert_eq!: a mismatch would print two 60 KB documents.
    assert!(
        served == serde_json::from_str::<Value>(&file).unwrap(),
        "the served document differs from schemas/openapi.json; run `make schemas`"
    );
}

#[test]
fn tokens_guard_decisions_and_definitions_separately() {
    let options = ApiOptions {
        decision_token: Some("dec".into()),
        admin_token: Some("adm".into()),
        ..ApiOptions::default()
    };
    let live = Live::start(memory(), options);
    let policy = json!({"limits": [{"kind": "gap", "min": "1s"}]});
    let check = json!({"policy": "p", "key": "k", "cost": 0});
    // Definitions: the admin token only.
    let put = |t| live.send("PUT", "/v1/policies/p", Some(policy.clone()), t);
    let (status, body, headers) = put(None);
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (401, Some("unauthenticated"))
    );
    assert_eq!(headers["www-authenticate"], "Bearer");
    assert_eq!(put(Some("dec")).0, 401);
    assert_eq!(put(Some("adm")).0, 200);
    // Decisions: the decision token, or the admin token.
    assert_eq!(
        live.send("POST", "/v1/check", Some(check.clone()), None).0,
        401
    );
    assert_eq!(
        live.send("POST", "/v1/check", Some(check.clone()), Some("nope"))
            .0,
        401
    );
    assert_eq!(
        live.send("POST", "/v1/check", Some(check.clone()), Some("dec"))
            .0,
        200
    );
    assert_eq!(
        live.send("POST", "/v1/check", Some(check), Some("adm")).0,
        200
    );
    // Reading a definition takes either; deleting it the admin token.
    assert_eq!(live.send("GET", "/v1/policies/p", None, Some("dec")).0, 200);
    assert_eq!(
        live.send("DELETE", "/v1/policies/p", None, Some("dec")).0,
        401
    );
    assert_eq!(
        live.send(
            "POST",
            "/v1/admin/checkpoint",
            Some(json!({"dir": "/nonexistent/x"})),
            Some("dec")
        )
        .0,
        401
    );
    // Probes, scrapes and the API description are open.
    for path in ["/healthz", "/readyz", "/metrics", "/openapi.json"] {
        assert_eq!(live.send("GET", path, None, None).0, 200, "{path}");
    }
    // The scheme name is case-insensitive.
    let url = format!("{}/v1/policies/p", live.base);
    let r = live
        .agent
        .get(&url)
        .header("Authorization", "bearer dec")
        .call()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
}

#[test]
fn a_decision_token_alone_also_guards_definitions() {
    let options = ApiOptions {
        decision_token: Some("dec".into()),
        ..ApiOptions::default()
    };
    let live = Live::start(memory(), options);
    let policy = json!({"limits": [{"kind": "gap", "min": "1s"}]});
    assert_eq!(
        live.send("PUT", "/v1/policies/p", Some(policy.clone()), None)
            .0,
        401
    );
    assert_eq!(
        live.send("PUT", "/v1/policies/p", Some(policy), Some("dec"))
            .0,
        200
    );
}

#[test]
fn past_max_in_flight_requests_are_shed_with_503() {
    let options = ApiOptions {
        max_in_flight: 1,
        ..ApiOptions::default()
    };
    let live = Arc::new(Live::start(memory(), options));
    let shaped = json!({"limits": [{"kind": "gap", "min": "2s"}], "on_limit": "delay", "max_delay_ms": 10_000});
    assert_eq!(
        live.send("PUT", "/v1/policies/shaped", Some(shaped), None)
            .0,
        200
    );
    let wait = json!({"policy": "shaped", "key": "k", "wait": true});
    assert_eq!(
        live.send("POST", "/v1/check", Some(wait.clone()), None).0,
        200
    );
    // This one is delayed ~2 s and sleeps in the handler, holding the only slot.
    let sleeper = {
        let live = live.clone();
        std::thread::spawn(move || live.send("POST", "/v1/check", Some(wait), None))
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while sample(&live.metrics(), "freqcap_in_flight_requests") != Some(1.0) {
        assert!(Instant::now() < deadline, "the sleeper never got in");
        std::thread::sleep(Duration::from_millis(10));
    }
    let (status, body, headers) = live.send("GET", "/v1/policies/shaped", None, None);
    assert_eq!(status, 503);
    assert_eq!(body["error"]["code"], "overloaded");
    assert_eq!(headers["retry-after"], "1");
    // Probes are never shed.
    assert_eq!(live.send("GET", "/healthz", None, None).0, 200);
    let (status, body, _) = sleeper.join().unwrap();
    assert_eq!(status, 200);
    assert!(body["delay_ms"].as_u64().unwrap() > 0);
    // The slot came back.
    assert_eq!(live.send("GET", "/v1/policies/shaped", None, None).0, 200);
    assert_eq!(
        sample(&live.metrics(), "freqcap_overloaded_total"),
        Some(1.0)
    );
}

#[test]
fn checkpoint_writes_a_copy_that_opens_with_the_data() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(RocksStore::open(&dir.path().join("data"), Durability::Wal).unwrap());
    let live = Live::start(store, ApiOptions::default());
    let campaign = json!({"caps": [{"name": "daily", "kind": "window", "limit": 5, "window": "1d", "align": "calendar"}]});
    assert_eq!(
        live.send("PUT", "/v1/campaigns/c", Some(campaign), None).0,
        200
    );
    let event = json!({"user": "u", "campaign": "c", "event_id": "e1"});
    assert_eq!(live.send("POST", "/v1/events", Some(event), None).0, 200);

    // On RocksDB the store's figures are real: the memtables hold the writes.
    let text = live.metrics();
    assert!(
        sample(&text, "freqcap_rocksdb_memtable_bytes").unwrap() > 0.0,
        "{text}"
    );
    let copy = dir.path().join("backup");
    let body = json!({"dir": copy.to_str().unwrap()});
    let (status, answer, _) = live.send("POST", "/v1/admin/checkpoint", Some(body.clone()), None);
    assert_eq!((status, answer), (200, body.clone()));
    // The same directory again: it exists now.
    let (status, answer, _) = live.send("POST", "/v1/admin/checkpoint", Some(body), None);
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (409, Some("conflict"))
    );
    let (status, answer, _) = live.send(
        "POST",
        "/v1/admin/checkpoint",
        Some(json!({"dir": ""})),
        None,
    );
    assert_eq!(status, 400);
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("dir:")
    );

    // The copy opens on its own, with the definition and the counted event.
    let restored = Arc::new(RocksStore::open(&copy, Durability::Wal).unwrap());
    let e = Engine::open(
        restored,
        freqcap::SystemClock::new(),
        EngineOptions::default(),
    )
    .unwrap();
    assert!(e.get_campaign("c").is_some());
    assert_eq!(e.user_usage("u", "c").unwrap()[0].used, 1);
}

#[test]
fn checkpoint_of_memory_is_a_400() {
    let live = Live::start(memory(), ApiOptions::default());
    let dir = tempfile::tempdir().unwrap();
    let body = json!({"dir": dir.path().join("x").to_str().unwrap()});
    let (status, answer, _) = live.send("POST", "/v1/admin/checkpoint", Some(body), None);
    assert_eq!(status, 400);
    assert_eq!(answer["error"]["code"], "invalid_argument");
}

#[test]
fn wrong_methods_unknown_paths_and_long_ids_answer_in_the_error_shape() {
    let live = Live::start(memory(), ApiOptions::default());
    let (status, body, _) = live.send("DELETE", "/v1/check", None, None);
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (405, Some("method_not_allowed"))
    );
    let (status, body, _) = live.send("GET", "/v2/anything", None, None);
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
    let long = "x".repeat(257);
    for path in [
        format!("/v1/policies/{long}"),
        format!("/v1/campaigns/{long}"),
        format!("/v1/campaigns/{long}/delivery"),
        format!("/v1/users/{long}/campaigns/c"),
    ] {
        let (status, body, _) = live.send("GET", &path, None, None);
        assert_eq!(status, 400, "{path}");
        assert_eq!(body["error"]["code"], "invalid_argument");
    }
}
