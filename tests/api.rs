//! The HTTP layer in-process over loopback: metrics, the OpenAPI document,
//! tokens, load shedding, checkpoints, error shapes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use freqcap::api::{ApiOptions, router};
use freqcap::engine::{Engine, EngineOptions};
use freqcap::server::ConnLimits;
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
        Live::start_with(store, options, ConnLimits::default())
    }

    fn start_with(store: Arc<dyn Store>, options: ApiOptions, limits: ConnLimits) -> Live {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let engine =
            Engine::open(store, freqcap::SystemClock::new(), EngineOptions::default()).unwrap();
        let counters = options.connections.clone();
        let app = router(Arc::new(engine), options);
        rt.spawn(freqcap::server::serve(
            listener,
            app,
            limits,
            counters,
            std::future::pending(),
        ));
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

    /// Sends `body` as it is (not re-encoded), as JSON, with `method`;
    /// returns the status and the answer as JSON.
    fn send_text(&self, method: &str, path: &str, body: &str) -> (u16, Value) {
        let url = format!("{}{path}", self.base);
        let r = match method {
            "PUT" => self.agent.put(&url),
            _ => self.agent.post(&url),
        };
        let mut r = r
            .header("Content-Type", "application/json")
            .send(body)
            .unwrap();
        let status = r.status().as_u16();
        let v = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
        (status, v)
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
    // Two checks of `k`: the second found its record in memory; `other` was
    // new (a miss, as the first check of `k`).
    assert_eq!(sample(&text, "freqcap_hot_hits_total"), Some(1.0), "{text}");
    assert_eq!(
        sample(&text, "freqcap_hot_misses_total"),
        Some(2.0),
        "{text}"
    );
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

/// Defines a gap policy in delay mode and sends a `"wait": true` check that
/// is delayed ~2 s and sleeps in its handler, holding one in-flight slot;
/// returns once it holds it. Its answer is the thread's.
fn hold_a_slot(live: &Arc<Live>) -> std::thread::JoinHandle<(u16, Value, ureq::http::HeaderMap)> {
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
    let sleeper = {
        let live = live.clone();
        std::thread::spawn(move || live.send("POST", "/v1/check", Some(wait), None))
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while sample(&live.metrics(), "freqcap_in_flight_requests") != Some(1.0) {
        assert!(Instant::now() < deadline, "the sleeper never got in");
        std::thread::sleep(Duration::from_millis(10));
    }
    sleeper
}

#[test]
fn past_max_in_flight_requests_are_shed_with_503() {
    let options = ApiOptions {
        max_in_flight: 1,
        ..ApiOptions::default()
    };
    let live = Arc::new(Live::start(memory(), options));
    let sleeper = hold_a_slot(&live);
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
        sample(
            &live.metrics(),
            "freqcap_overloaded_total{reason=\"in_flight\"}"
        ),
        Some(1.0)
    );
}

/// Past `max_in_flight`, a request waits for a slot within its queue
/// bound (docs/service.md, "Adaptive LIFO") instead of getting 503 at
/// once: with the only slot held for ~2 s and a bound of 8 s, it is served
/// when the slot comes back, and nothing is counted as shed.
#[test]
fn past_max_in_flight_a_request_waits_for_a_slot_within_its_bound() {
    let options = ApiOptions {
        max_in_flight: 1,
        shed_queue_delay: Duration::from_secs(8),
        in_flight_wait: true,
        ..ApiOptions::default()
    };
    let live = Arc::new(Live::start(memory(), options));
    let sleeper = hold_a_slot(&live);
    let waiter = {
        let live = live.clone();
        std::thread::spawn(move || live.send("GET", "/v1/policies/shaped", None, None).0)
    };
    // It waits while the sleeper holds the slot.
    let deadline = Instant::now() + Duration::from_secs(5);
    while sample(&live.metrics(), "freqcap_waiting_requests") != Some(1.0) {
        assert!(Instant::now() < deadline, "the waiter never queued");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        !sleeper.is_finished(),
        "the sleeper left before the waiter queued"
    );
    assert_eq!(waiter.join().unwrap(), 200);
    assert_eq!(sleeper.join().unwrap().0, 200);
    let m = live.metrics();
    assert_eq!(sample(&m, "freqcap_waiting_requests"), Some(0.0));
    assert_eq!(
        sample(&m, "freqcap_overloaded_total{reason=\"in_flight\"}"),
        Some(0.0)
    );
}

/// A server on RocksDB in a temporary directory, with `backup_dir` inside
/// it: the directory (kept while the test runs), the backups' path, the
/// server.
fn checkpointing() -> (tempfile::TempDir, std::path::PathBuf, Live) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(RocksStore::open(&dir.path().join("data"), Durability::Wal).unwrap());
    let backups = dir.path().join("backups");
    std::fs::create_dir(&backups).unwrap();
    let live = Live::start(
        store,
        ApiOptions {
            backup_dir: Some(backups.clone()),
            ..ApiOptions::default()
        },
    );
    (dir, backups, live)
}

#[test]
fn checkpoint_writes_a_copy_that_opens_with_the_data() {
    let (dir, backups, live) = checkpointing();
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
    let copy = backups.join("backup");
    let body = json!({"dir": copy.to_str().unwrap()});
    let (status, answer, _) = live.send("POST", "/v1/admin/checkpoint", Some(body.clone()), None);
    assert_eq!((status, answer), (200, body.clone()));
    // Named by its name alone, the copy goes into the backup directory too.
    let (status, answer, _) = live.send(
        "POST",
        "/v1/admin/checkpoint",
        Some(json!({"dir": "second"})),
        None,
    );
    let second = backups.join("second");
    assert_eq!(
        (status, answer),
        (200, json!({"dir": second.to_str().unwrap()}))
    );
    assert!(second.join("CURRENT").exists());
    // Anywhere else is refused, naming `dir`, and nothing is written there.
    let outside = dir.path().join("outside");
    let escape = backups.join("..").join("escaped");
    for bad in [
        json!(outside.to_str().unwrap()),
        json!(escape.to_str().unwrap()),
        json!("../escaped"),
        json!("a/b"),
        json!("."),
        json!("x\u{0}y"),
    ] {
        let (status, answer, _) = live.send(
            "POST",
            "/v1/admin/checkpoint",
            Some(json!({ "dir": bad })),
            None,
        );
        assert_eq!(status, 400, "{bad}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.starts_with("dir:"), "{bad}: {message}");
    }
    assert!(!outside.exists() && !dir.path().join("escaped").exists());
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
fn checkpoint_of_memory_or_without_a_backup_dir_is_a_400() {
    let dir = tempfile::tempdir().unwrap();
    let live = Live::start(
        memory(),
        ApiOptions {
            backup_dir: Some(dir.path().to_owned()),
            ..ApiOptions::default()
        },
    );
    let body = json!({"dir": "x"});
    let (status, answer, _) = live.send("POST", "/v1/admin/checkpoint", Some(body.clone()), None);
    assert_eq!(status, 400);
    assert_eq!(answer["error"]["code"], "invalid_argument");
    // No backup directory configured: checkpoints are off.
    let store = Arc::new(RocksStore::open(&dir.path().join("data"), Durability::Wal).unwrap());
    let live = Live::start(store, ApiOptions::default());
    let (status, answer, _) = live.send("POST", "/v1/admin/checkpoint", Some(body), None);
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("dir: checkpoints are off")
    );
}

/// A directory name longer than a file name may be (NAME_MAX, 255 bytes,
/// less the `.tmp` RocksDB adds while it writes) is the client's error, a
/// 400 naming `dir`, not a 500 from the store (case 1.48 of the turn-3
/// probe); 251 bytes are written.
#[test]
fn checkpoint_dir_longer_than_a_file_name_is_a_400() {
    let (_dir, backups, live) = checkpointing();
    let long = "n".repeat(252);
    // By its name, and by its full path inside backup_dir; 2-byte
    // characters count as 2.
    for bad in [
        long.clone(),
        backups.join(&long).to_str().unwrap().to_owned(),
        "é".repeat(126),
    ] {
        let (status, answer, _) = live.send(
            "POST",
            "/v1/admin/checkpoint",
            Some(json!({ "dir": bad })),
            None,
        );
        assert_eq!(status, 400, "{answer}");
        assert_eq!(answer["error"]["code"], "invalid_argument", "{answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("dir:") && message.contains("at most 251 bytes"),
            "{message}"
        );
    }
    let most = "n".repeat(251);
    let (status, answer, _) = live.send(
        "POST",
        "/v1/admin/checkpoint",
        Some(json!({ "dir": most })),
        None,
    );
    assert_eq!(status, 200, "{answer}");
    assert!(backups.join(&most).join("CURRENT").exists());
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

// ---- hostile and careless clients ----

/// Sends raw bytes on a new connection and reads until the server closes it
/// or `wait` passes; returns what was read.
fn raw(addr: &str, bytes: &[u8], wait: Duration) -> String {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(wait)).unwrap();
    c.write_all(bytes).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        match c.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether the server closes a connection by itself within `within`.
fn closed_by_server(c: &mut std::net::TcpStream, within: Duration) -> bool {
    use std::io::Read;
    c.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 1024];
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        match c.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
    false
}

fn short_limits() -> ConnLimits {
    ConnLimits {
        header_timeout: Duration::from_millis(500),
        idle_timeout: Duration::from_secs(1),
        ..ConnLimits::default()
    }
}

#[test]
fn slow_and_idle_connections_are_closed() {
    use std::io::Write;
    let live = Live::start_with(memory(), ApiOptions::default(), short_limits());
    let addr = live.base.trim_start_matches("http://").to_owned();
    // Idle from the start: closed after the idle timeout.
    let mut idle = std::net::TcpStream::connect(&addr).unwrap();
    assert!(closed_by_server(&mut idle, Duration::from_secs(10)));
    // Half a request head, then nothing: closed after the header timeout.
    let mut slow = std::net::TcpStream::connect(&addr).unwrap();
    slow.write_all(b"POST /v1/check HTTP/1.1\r\nHost: localhost\r\n")
        .unwrap();
    assert!(closed_by_server(&mut slow, Duration::from_secs(10)));
    // A kept-alive connection that answered a request, then idles: closed.
    let mut kept = std::net::TcpStream::connect(&addr).unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    assert!(closed_by_server(&mut kept, Duration::from_secs(10)));
    let text = live.metrics();
    assert!(
        sample(&text, "freqcap_http_connections_timed_out_total").unwrap() >= 3.0,
        "{text}"
    );
}

#[test]
fn a_half_sent_body_is_answered_408_and_closed() {
    let options = ApiOptions {
        body_timeout: Duration::from_millis(500),
        ..ApiOptions::default()
    };
    let live = Live::start(memory(), options);
    let addr = live.base.trim_start_matches("http://").to_owned();
    let got = raw(
        &addr,
        b"POST /v1/check HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
        Duration::from_secs(10),
    );
    assert!(got.starts_with("HTTP/1.1 408"), "{got}");
    assert!(got.contains("request_timeout"), "{got}");
}

#[test]
fn an_oversized_body_is_413_before_100_continue() {
    let options = ApiOptions {
        max_body: 1000,
        ..ApiOptions::default()
    };
    let live = Live::start(memory(), options);
    let addr = live.base.trim_start_matches("http://").to_owned();
    let got = raw(
        &addr,
        b"POST /v1/events HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 5000000\r\nExpect: 100-continue\r\n\r\n",
        Duration::from_secs(5),
    );
    assert!(got.starts_with("HTTP/1.1 413"), "{got}");
    assert!(!got.contains("100 Continue"), "{got}");
    assert!(got.contains("too_large"), "{got}");
}

#[test]
fn past_the_connection_cap_only_probes_are_served() {
    use std::io::Write;
    // A reserve of several probe connections: the scrapes below take one
    // each, and a closed one is counted until the server has seen it close.
    let limits = ConnLimits {
        max_connections: 2,
        probe_connections: 8,
        ..ConnLimits::default()
    };
    let live = Live::start_with(memory(), ApiOptions::default(), limits);
    let addr = live.base.trim_start_matches("http://").to_owned();
    // Two clients hold every ordinary connection.
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut c = std::net::TcpStream::connect(&addr).unwrap();
        c.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .unwrap();
        held.push(c);
    }
    // Let the server accept them (bounded wait on its own gauge).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // The scrape itself takes a connection while it lasts: both held
        // ones are in when three are open.
        let open = sample(&live.metrics(), "freqcap_http_connections_open").unwrap();
        if open >= 3.0 {
            break;
        }
        assert!(Instant::now() < deadline, "connections never accepted");
        std::thread::sleep(Duration::from_millis(10));
    }
    // A probe still gets through; a decision on the probe connection is 503.
    let probe = raw(
        &addr,
        b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    );
    assert!(probe.starts_with("HTTP/1.1 200"), "{probe}");
    let check = raw(
        &addr,
        b"GET /v1/policies/p HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    );
    assert!(check.starts_with("HTTP/1.1 503"), "{check}");
    // Freed connections serve everything again.
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, _, _) = live.send("GET", "/v1/policies/p", None, None);
        if status == 404 {
            break;
        }
        assert!(Instant::now() < deadline, "still {status}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn admin_access_follows_the_route_not_the_path_text() {
    let options = ApiOptions {
        decision_token: Some("dec".into()),
        admin_token: Some("adm".into()),
        backup_dir: None,
        ..ApiOptions::default()
    };
    let live = Live::start(memory(), options);
    let campaign =
        json!({"caps": [{"kind": "window", "limit": 3, "window": "1d", "align": "calendar"}]});
    // Every route × method × token: the status class each must get.
    // "auth" = refused (401); "ok" = let through (any status but 401).
    for (method, path, body, none, dec, adm) in [
        (
            "PUT",
            "/v1/campaigns/delivery",
            Some(campaign.clone()),
            "auth",
            "auth",
            "ok",
        ),
        (
            "DELETE",
            "/v1/campaigns/delivery",
            None,
            "auth",
            "auth",
            "ok",
        ),
        ("GET", "/v1/campaigns/delivery", None, "auth", "ok", "ok"),
        (
            "GET",
            "/v1/campaigns/delivery/delivery",
            None,
            "auth",
            "ok",
            "ok",
        ),
        (
            "PUT",
            "/v1/policies/delivery",
            Some(json!({"limits": [{"kind": "gap", "min": "1s"}]})),
            "auth",
            "auth",
            "ok",
        ),
        ("GET", "/v1/policies/delivery", None, "auth", "ok", "ok"),
        (
            "DELETE",
            "/v1/policies/delivery",
            None,
            "auth",
            "auth",
            "ok",
        ),
        (
            "POST",
            "/v1/check",
            Some(json!({"policy": "delivery", "key": "k", "cost": 0})),
            "auth",
            "ok",
            "ok",
        ),
        (
            "POST",
            "/v1/screen",
            Some(json!({"user": "u", "candidates": [{"campaign": "delivery"}], "reserve": false})),
            "auth",
            "ok",
            "ok",
        ),
        (
            "POST",
            "/v1/events",
            Some(json!({"user": "u", "campaign": "delivery"})),
            "auth",
            "ok",
            "ok",
        ),
        (
            "POST",
            "/v1/reservations/r1/commit",
            None,
            "auth",
            "ok",
            "ok",
        ),
        (
            "POST",
            "/v1/reservations/r1/release",
            None,
            "auth",
            "ok",
            "ok",
        ),
        (
            "GET",
            "/v1/users/u/campaigns/delivery",
            None,
            "auth",
            "ok",
            "ok",
        ),
        (
            "POST",
            "/v1/admin/checkpoint",
            Some(json!({"dir": "x"})),
            "auth",
            "auth",
            "ok",
        ),
        ("GET", "/healthz", None, "ok", "ok", "ok"),
        ("GET", "/readyz", None, "ok", "ok", "ok"),
        ("GET", "/metrics", None, "ok", "ok", "ok"),
        ("GET", "/openapi.json", None, "ok", "ok", "ok"),
        ("GET", "/v2/unknown", None, "auth", "ok", "ok"),
    ] {
        for (token, want) in [(None, none), (Some("dec"), dec), (Some("adm"), adm)] {
            let (status, answer, _) = live.send(method, path, body.clone(), token);
            let got = if status == 401 { "auth" } else { "ok" };
            assert_eq!(
                got, want,
                "{method} {path} with {token:?}: {status} {answer}"
            );
        }
    }
}

#[test]
fn bodies_must_say_they_are_json() {
    let live = Live::start(memory(), ApiOptions::default());
    let policy =
        json!({"limits": [{"kind": "window", "limit": 1, "window": "1h", "align": "fixed"}]});
    assert_eq!(
        live.send("PUT", "/v1/policies/p", Some(policy), None).0,
        200
    );
    let url = format!("{}/v1/check", live.base);
    let body = r#"{"policy":"p","key":"k"}"#;
    // A browser's "simple" cross-site POST: text/plain, or no type at all.
    for ct in [
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        None,
    ] {
        let r = live.agent.post(&url);
        let r = match ct {
            Some(ct) => r.header("Content-Type", ct),
            None => r,
        };
        let mut r = r.send(body).unwrap();
        assert_eq!(r.status().as_u16(), 415, "{ct:?}");
        let answer: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
        assert_eq!(answer["error"]["code"], "unsupported_media_type");
    }
    // Nothing was debited: the one allowed check still passes.
    let mut r = live
        .agent
        .post(&url)
        .header("Content-Type", "application/json; charset=utf-8")
        .send(body)
        .unwrap();
    assert_eq!(
        r.status().as_u16(),
        200,
        "{}",
        r.body_mut().read_to_string().unwrap()
    );
    // An empty commit needs no type.
    let r = live
        .agent
        .post(format!("{}/v1/reservations/nope/release", live.base))
        .send_empty()
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
}

#[test]
fn on_loopback_only_loopback_host_names_are_answered() {
    let options = ApiOptions {
        allowed_hosts: Some(vec!["freqcap.internal".into()]),
        ..ApiOptions::default()
    };
    let live = Live::start(memory(), options);
    let addr = live.base.trim_start_matches("http://").to_owned();
    let get = |host: &str| {
        raw(
            &addr,
            format!("GET /healthz HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
            Duration::from_secs(5),
        )
    };
    for ok in [
        "localhost:8080",
        "127.0.0.1",
        "[::1]:80",
        "FREQCAP.internal:9",
    ] {
        assert!(get(ok).starts_with("HTTP/1.1 200"), "{ok}");
    }
    // A rebinding attacker's name resolving to 127.0.0.1.
    for bad in [
        "evil.example",
        "evil.example:8080",
        "localhost.evil.example",
    ] {
        let got = get(bad);
        assert!(got.starts_with("HTTP/1.1 403"), "{bad}: {got}");
        assert!(got.contains("forbidden"), "{got}");
    }
}

#[test]
fn a_body_is_exactly_one_json_object() {
    let live = Live::start(memory(), ApiOptions::default());
    let policy =
        json!({"limits": [{"kind": "window", "limit": 1, "window": "1h", "align": "fixed"}]});
    assert_eq!(
        live.send("PUT", "/v1/policies/p", Some(policy), None).0,
        200
    );
    assert_eq!(
        live.send("PUT", "/v1/campaigns/c", Some(json!({})), None).0,
        200
    );
    let post = |path: &str, body: &str| live.send_text("POST", path, body);
    for (path, body) in [
        ("/v1/check", r#"{"policy":"p","key":"k"} xyz"#),
        (
            "/v1/check",
            r#"{"policy":"p","key":"k"}{"policy":"p","key":"k"}"#,
        ),
        ("/v1/check", r#"["p",null,"k"]"#),
        ("/v1/check", r#"{"policy":"p","key":"k","key":"k2"}"#),
        ("/v1/screen", r#"{"user":"u","candidates":[["c",1]]}"#),
        (
            "/v1/events",
            r#"{"user":"u","campaign":"c"}{"user":"u","campaign":"c"}"#,
        ),
        (
            "/v1/events",
            r#"{"user":"u","campaign":"c","campaign":"c"}"#,
        ),
        (
            "/v1/events",
            r#"[{"user":"u","campaign":"c","cost":1,"cost":2}]"#,
        ),
        ("/v1/events", r#"[["u","c",1,null]]"#),
    ] {
        let (status, answer) = post(path, body);
        assert_eq!(status, 400, "{path} {body}: {answer}");
        assert_eq!(answer["error"]["code"], "invalid_argument", "{body}");
    }
    // Inside a definition too, where parts are read as plain JSON values.
    let (status, answer) = live.send_text(
        "PUT",
        "/v1/campaigns/c2",
        r#"{"caps": [{"kind": "window", "limit": 3, "limit": 5, "window": "1d"}]}"#,
    );
    assert_eq!(status, 400);
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("caps[0].limit: given twice"),
        "{answer}"
    );
    assert_eq!(live.send("GET", "/v1/campaigns/c2", None, None).0, 404);
    // Nothing of the above was counted: the one allowed check passes, and the
    // user has no impression of c.
    assert_eq!(post("/v1/check", r#"{"policy":"p","key":"k"}"#).0, 200);
    let (status, usage, _) = live.send("GET", "/v1/users/u/campaigns/c", None, None);
    assert_eq!(status, 200);
    assert_eq!(usage["caps"], json!([]));
    let (status, answer) = post(
        "/v1/events",
        r#"[{"user":"u","campaign":"c"},{"user":"u","campaign":"c","cost":"x"}]"#,
    );
    assert_eq!(status, 400);
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("[1].cost:"),
        "{answer}"
    );
}

#[test]
fn a_repeated_reserve_is_the_same_only_as_the_same_json_value() {
    let live = Live::start(memory(), ApiOptions::default());
    let policy =
        json!({"limits": [{"kind": "window", "limit": 5, "window": "1h", "align": "fixed"}]});
    assert_eq!(
        live.send("PUT", "/v1/policies/p", Some(policy), None).0,
        200
    );
    let post = |body: &str| live.send_text("POST", "/v1/check", body);
    let first = post(r#"{"policy":"p","key":"k","reserve":true,"reservation_id":"r1"}"#);
    assert_eq!(first.0, 200);
    // Members in another order, other spacing: the same body, the same answer.
    let again = post(r#"{ "reservation_id":"r1", "reserve":true, "key":"k", "policy":"p" }"#);
    assert_eq!(again, first);
    // A member added at its default value is another body.
    for other in [
        r#"{"policy":"p","key":"k","reserve":true,"reservation_id":"r1","cost":1}"#,
        r#"{"policy":"p","key":"k","reserve":true,"reservation_id":"r1","wait":false}"#,
    ] {
        let (status, answer) = post(other);
        assert_eq!(status, 409, "{other}: {answer}");
        assert_eq!(answer["error"]["code"], "conflict");
    }
    // Nothing was debited twice: one reservation holds 1 of 5.
    let (_, peek) = post(r#"{"policy":"p","key":"k","cost":0}"#);
    assert_eq!(peek["remaining"], 4);
}

/// Shadow mode over HTTP (docs/semantics.md §6.6): a denial answered 200
/// with `would_deny`, no `Retry-After`, counted as `would_deny`; a shadow
/// campaign's candidate eligible with `would_deny` naming the cap; nothing
/// debited for either.
#[test]
fn shadow_mode_answers_allowed_with_would_deny() {
    let live = Live::start(memory(), ApiOptions::default());
    let policy = json!({"limits": [{"kind": "window", "limit": 1, "window": "1h", "align": "fixed", "name": "hourly"}],
                        "mode": "shadow"});
    assert_eq!(
        live.send("PUT", "/v1/policies/p", Some(policy), None).0,
        200
    );
    let check = json!({"policy": "p", "key": "k"});
    let (st, first, _) = live.send("POST", "/v1/check", Some(check.clone()), None);
    assert_eq!(st, 200);
    assert!(first.get("would_deny").is_none(), "{first}");
    let (st, v, headers) = live.send("POST", "/v1/check", Some(check), None);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["allowed"], true);
    assert_eq!(v["would_deny"], true);
    assert_eq!(v["remaining"], 0);
    assert_eq!(v["limits"][0]["allowed"], false);
    assert!(v["retry_after_ms"].is_null());
    assert!(!headers.contains_key("retry-after"), "{headers:?}");
    let campaign = json!({"caps": [{"kind": "window", "limit": 1, "window": "1d", "name": "per-user"}],
                          "mode": "shadow"});
    assert_eq!(
        live.send("PUT", "/v1/campaigns/c", Some(campaign), None).0,
        200
    );
    let screen = json!({"user": "u", "candidates": [{"campaign": "c"}]});
    let (_, a, _) = live.send("POST", "/v1/screen", Some(screen.clone()), None);
    let id = a["reservation"].as_str().unwrap().to_owned();
    let commit = json!({"campaign": "c"});
    let path = format!("/v1/reservations/{id}/commit");
    let (st, v, _) = live.send("POST", &path, Some(commit.clone()), None);
    assert_eq!(st, 200, "{v}");
    let (_, b, _) = live.send("POST", "/v1/screen", Some(screen), None);
    assert_eq!(b["results"][0]["eligible"], true, "{b}");
    assert_eq!(b["results"][0]["would_deny"]["cap"], "per-user", "{b}");
    assert!(b["results"][0].get("denied_by").is_none(), "{b}");
    // Committing the would-deny candidate debits nothing: still 1 used.
    let id = b["reservation"].as_str().unwrap().to_owned();
    let path = format!("/v1/reservations/{id}/commit");
    assert_eq!(live.send("POST", &path, Some(commit), None).0, 200);
    let (_, usage, _) = live.send("GET", "/v1/users/u/campaigns/c", None, None);
    assert_eq!(usage["caps"][0]["used"], 1, "{usage}");
    let text = live.metrics();
    let would = r#"freqcap_decisions_total{endpoint="/v1/check",outcome="would_deny"}"#;
    assert_eq!(sample(&text, would), Some(1.0), "{text}");
    let would = r#"freqcap_decisions_total{endpoint="/v1/screen",outcome="would_deny"}"#;
    assert_eq!(sample(&text, would), Some(1.0), "{text}");
}

/// Settling is never shed (docs/service.md, "Shedding"): with the only
/// in-flight slot held, a screen is refused 503 while the commit and the
/// release of reservations made before are served; shed, they would leave
/// their holds open until the TTL.
#[test]
fn commits_and_releases_are_not_shed() {
    let options = ApiOptions {
        max_in_flight: 1,
        ..ApiOptions::default()
    };
    let live = Arc::new(Live::start(memory(), options));
    let campaign = json!({"caps": [{"kind": "window", "limit": 5, "window": "1d"}]});
    assert_eq!(
        live.send("PUT", "/v1/campaigns/c", Some(campaign), None).0,
        200
    );
    let screen = json!({"user": "u", "candidates": [{"campaign": "c"}]});
    let reserve = |live: &Live| {
        let (st, v, _) = live.send("POST", "/v1/screen", Some(screen.clone()), None);
        assert_eq!(st, 200, "{v}");
        v["reservation"].as_str().unwrap().to_owned()
    };
    let (won, lost) = (reserve(&live), reserve(&live));
    let sleeper = hold_a_slot(&live);
    let (st, v, _) = live.send("POST", "/v1/screen", Some(screen.clone()), None);
    assert_eq!(
        (st, &v["error"]["code"]),
        (503, &json!("overloaded")),
        "{v}"
    );
    let commit = json!({"campaign": "c"});
    let path = format!("/v1/reservations/{won}/commit");
    let (st, v, _) = live.send("POST", &path, Some(commit), None);
    assert_eq!(st, 200, "{v}");
    let path = format!("/v1/reservations/{lost}/release");
    let (st, v, _) = live.send("POST", &path, None, None);
    assert_eq!(st, 200, "{v}");
    assert_eq!(sleeper.join().unwrap().0, 200);
    let (_, usage, _) = live.send("GET", "/v1/users/u/campaigns/c", None, None);
    assert_eq!(usage["caps"][0]["used"], 1, "{usage}");
    assert_eq!(usage["caps"][0]["pending"], 0, "{usage}");
}

/// A saturated server sheds the lowest classes first (docs/service.md,
/// "Shedding"): with one of two slots held, a request whose
/// `x-freqcap-priority` says `sheddable` (half the slots) is refused while
/// one with no class is served.
#[test]
fn sheddable_requests_are_shed_before_default_ones() {
    let options = ApiOptions {
        max_in_flight: 2,
        ..ApiOptions::default()
    };
    let live = Arc::new(Live::start(memory(), options));
    let sleeper = hold_a_slot(&live);
    let get = |class: Option<&str>| {
        let mut r = live.agent.get(&format!("{}/v1/policies/shaped", live.base));
        if let Some(c) = class {
            r = r.header("x-freqcap-priority", c);
        }
        r.call().unwrap().status().as_u16()
    };
    assert_eq!(get(Some("sheddable")), 503);
    assert_eq!(get(None), 200);
    assert_eq!(get(Some("critical")), 200);
    assert_eq!(sleeper.join().unwrap().0, 200);
    // Free again: sheddable is served.
    assert_eq!(get(Some("sheddable")), 200);
}

/// Issue 45 over HTTP: the repro (a budget of 10 spent 3, raised to 12:
/// spent 3, 9 more), `?reset=true`, a kind change's `Freqcap-Warning`,
/// resetting one key, erasing a viewer, and a fractional `latency_ms`.
#[test]
fn edits_keep_counts_and_keys_and_viewers_can_be_reset_over_http() {
    let live = Live::start(memory(), ApiOptions::default());
    // The field an error names: its message's first word, before ": ".
    let field = |v: &Value| -> Option<String> {
        v["error"]["message"]
            .as_str()?
            .split_once(": ")
            .map(|(f, _)| f.to_owned())
    };
    let put = |path: &str, body: Value| live.send("PUT", path, Some(body), None);
    let budget = |n: u64| json!({"budget": {"amount": n, "per": "1d", "pacing": "asap"}});
    // One impression for user `u`: screen, then commit the reservation.
    let show = |u: &str| -> bool {
        let screen = json!({"user": u, "candidates": [{"campaign": "c1"}], "reserve": true});
        let (st, s, _) = live.send("POST", "/v1/screen", Some(screen), None);
        assert_eq!(st, 200, "{s}");
        let Some(id) = s["reservation"].as_str() else {
            return false;
        };
        let path = format!("/v1/reservations/{id}/commit");
        let (st, v, _) = live.send("POST", &path, Some(json!({"campaign": "c1"})), None);
        assert_eq!(st, 200, "{v}");
        true
    };
    assert_eq!(put("/v1/campaigns/c1", budget(10)).0, 200);
    for u in ["a", "b", "c"] {
        assert!(show(u));
    }
    assert_eq!(put("/v1/campaigns/c1", budget(12)).0, 200);
    let (_, d, _) = live.send("GET", "/v1/campaigns/c1/delivery", None, None);
    assert_eq!(
        (d["spent"].as_u64(), d["amount"].as_u64()),
        (Some(3), Some(12)),
        "{d}"
    );
    let more = (0..15).filter(|i| show(&format!("u{i}"))).count();
    assert_eq!(more, 9);
    // A fresh start on purpose; a bad query is a 400 naming it.
    let (st, _, _) = put("/v1/campaigns/c1?reset=true", budget(12));
    assert_eq!(st, 200);
    let (_, d, _) = live.send("GET", "/v1/campaigns/c1/delivery", None, None);
    assert_eq!(d["spent"], 0, "{d}");
    for (q, want) in [("reset=yes", "reset"), ("force=1", "force")] {
        let (st, v, _) = put(&format!("/v1/campaigns/c1?{q}"), budget(12));
        assert_eq!(st, 400, "{v}");
        assert_eq!(field(&v).as_deref(), Some(want), "{v}");
    }

    // A user cap raised after 3 impressions: used 3, 2 more.
    let cap = |n: u64| json!({"caps": [{"kind": "window", "limit": n, "window": "1d", "align": "calendar"}]});
    assert_eq!(put("/v1/campaigns/c1", cap(3)).0, 200);
    for _ in 0..3 {
        assert!(show("v"));
    }
    assert!(!show("v"));
    assert_eq!(put("/v1/campaigns/c1", cap(5)).0, 200);
    let (_, u, _) = live.send("GET", "/v1/users/v/campaigns/c1", None, None);
    assert_eq!(
        (
            u["caps"][0]["used"].as_u64(),
            u["caps"][0]["remaining"].as_u64()
        ),
        (Some(3), Some(2)),
        "{u}"
    );
    // Erasing the viewer: 204 (also for one never seen); the cap counts
    // afresh; delivery is not personal and stays.
    let (_, before, _) = live.send("GET", "/v1/campaigns/c1/delivery", None, None);
    for path in [
        "/v1/users/v",
        "/v1/users/never-seen",
        "/v1/ids/household/h7",
    ] {
        let (st, v, _) = live.send("DELETE", path, None, None);
        assert_eq!(st, 204, "{path}: {v}");
    }
    let (_, u, _) = live.send("GET", "/v1/users/v/campaigns/c1", None, None);
    assert_eq!(u["caps"][0]["used"], 0, "{u}");
    let (_, after, _) = live.send("GET", "/v1/campaigns/c1/delivery", None, None);
    assert_eq!(before, after);
    let (st, v, _) = live.send("DELETE", "/v1/ids/Bad-Kind/x", None, None);
    assert_eq!((st, field(&v).as_deref()), (400, Some("kind")), "{v}");
    let long = "x".repeat(257);
    let (st, v, _) = live.send("DELETE", &format!("/v1/users/{long}"), None, None);
    assert_eq!((st, field(&v).as_deref()), (400, Some("user")), "{v}");
    assert_eq!(sample(&live.metrics(), "freqcap_erasures_total"), Some(3.0));

    // A kind change starts the item empty and says so.
    let (st, _, h) = put(
        "/v1/campaigns/c1",
        json!({"caps": [{"kind": "rate", "rate": 5, "per": "1d"}]}),
    );
    assert_eq!(st, 200);
    let warning = h
        .get("freqcap-warning")
        .map(|v| v.to_str().unwrap_or_default().to_owned());
    assert!(
        warning
            .as_deref()
            .is_some_and(|w| w.starts_with("caps[0]: ") && w.contains("start empty")),
        "{warning:?}"
    );

    // A policy window raised from 10 to 20 after 10 checks: 10 left. One
    // key reset, the other untouched.
    let window = |n: u64| json!({"limits": [{"kind": "window", "limit": n, "window": "1h", "align": "fixed"}]});
    assert_eq!(put("/v1/policies/api", window(10)).0, 200);
    let check = |key: &str| {
        let (st, v, _) = live.send(
            "POST",
            "/v1/check",
            Some(json!({"policy": "api", "key": key})),
            None,
        );
        (st, v["remaining"].as_u64())
    };
    for _ in 0..10 {
        assert_eq!(check("k").0, 200);
    }
    assert_eq!(check("k").0, 429);
    assert_eq!(check("k2").0, 200);
    assert_eq!(put("/v1/policies/api", window(20)).0, 200);
    assert_eq!(
        check("k"),
        (200, Some(9)),
        "10 counted, then this one of 20"
    );
    let (st, _, _) = live.send("DELETE", "/v1/policies/api/keys/k", None, None);
    assert_eq!(st, 204);
    assert_eq!(check("k"), (200, Some(19)), "the reset key starts afresh");
    assert_eq!(check("k2"), (200, Some(18)), "the other key is untouched");
    let (st, v, _) = live.send("DELETE", "/v1/policies/nope/keys/k", None, None);
    assert_eq!(st, 404, "{v}");
    let (st, v, _) = live.send(
        "DELETE",
        &format!("/v1/policies/api/keys/{long}"),
        None,
        None,
    );
    assert_eq!((st, field(&v).as_deref()), (400, Some("key")), "{v}");

    // A release's latency may be a fraction of a millisecond.
    let adaptive = json!({"limits": [{"kind": "adaptive", "max": 10}]});
    assert_eq!(put("/v1/policies/backend", adaptive).0, 200);
    let (_, c, _) = live.send(
        "POST",
        "/v1/check",
        Some(json!({"policy": "backend", "key": "b", "reserve": true})),
        None,
    );
    let id = c["reservation"].as_str().unwrap().to_owned();
    let path = format!("/v1/reservations/{id}/release");
    let (st, v, _) = live.send("POST", &path, Some(json!({"latency_ms": 12.5})), None);
    assert_eq!(st, 200, "{v}");
    let (_, c, _) = live.send(
        "POST",
        "/v1/check",
        Some(json!({"policy": "backend", "key": "b", "reserve": true})),
        None,
    );
    let id = c["reservation"].as_str().unwrap().to_owned();
    let path = format!("/v1/reservations/{id}/release");
    let (st, v, _) = live.send("POST", &path, Some(json!({"latency_ms": -1})), None);
    assert_eq!((st, field(&v).as_deref()), (400, Some("latency_ms")), "{v}");
}
