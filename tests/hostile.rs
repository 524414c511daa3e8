//! Hostile and careless clients against a real `freqcap serve` (issue 24;
//! the cases of the security probe at d5eefae): HTTP/2 frames written one by
//! one with PyPI's h2 (tests/hostile/h2probe.py), silent sockets, tonic's
//! gRPC client. Each test failed on d5eefae; each is bounded in time.
//!
//! RESP's own hostile clients are in tests/resp.rs.

mod support;

use std::io::{BufRead, BufReader, Read};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tonic::Code;

use support::grpc_node as node;

fn port(addr: &str) -> String {
    addr.rsplit(':').next().unwrap().to_owned()
}

fn probe_script() -> String {
    format!("{}/tests/hostile/h2probe.py", env!("CARGO_MANIFEST_DIR"))
}

/// Runs a probe mode to its end; its JSON line.
fn probe(args: &[&str]) -> Value {
    let out = Command::new("python3")
        .arg(probe_script())
        .args(args)
        .output()
        .expect("python3 runs (make pydeps installs h2)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "h2probe {args:?} failed: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(text.lines().last().unwrap_or("")).expect("a JSON line")
}

/// A probe that holds its streams: started, and returned once it says it
/// holds them. Killed by its PID when dropped; its stdout is kept open so
/// its last line finds a reader.
struct Holding(
    Child,
    #[allow(dead_code)] BufReader<std::process::ChildStdout>,
);

impl Holding {
    fn start(args: &[&str]) -> Holding {
        let mut child = Command::new("python3")
            .arg(probe_script())
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert!(line.contains("holding"), "the probe holds: {line:?}");
        Holding(child, out)
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn channel(addr: &str) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("connects")
}

fn check(policy: &str) -> freqcap::grpc::pb::CheckRequest {
    freqcap::grpc::pb::CheckRequest {
        policy: Some(policy.into()),
        key: "k".into(),
        cost: Some(1),
        ..Default::default()
    }
}

async fn health(addr: &str) -> Result<i32, tonic::Status> {
    let mut h = tonic_health::pb::health_client::HealthClient::new(channel(addr).await);
    h.check(tonic_health::pb::HealthCheckRequest {
        service: String::new(),
    })
    .await
    .map(|r| r.into_inner().status)
}

/// Whether the server closed `s` within `within` (end of stream or reset),
/// not merely stayed silent.
fn closed_by_server(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 4096];
    let until = Instant::now() + within;
    // The server's SETTINGS may come first; read until the end.
    while Instant::now() < until {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
    false
}

/// Item 1 (case 1.20): 256 gRPC streams that each declare a 1 MiB message
/// and send 1 byte. With tokens, refused UNAUTHENTICATED on their headers;
/// without, gathered under the body memory budget. d5eefae: RSS +300 MB
/// from this one connection, for the body timeout.
#[test]
fn declared_grpc_messages_hold_no_memory() {
    for tokens in [true, false] {
        let n = if tokens {
            node(&["--decision-token", "dtok-0123456789abcdef"])
        } else {
            node(&[])
        };
        let pid = n.s.child.id().to_string();
        let v = probe(&["grpc-declare", &port(&n.grpc), &pid, "256", "3"]);
        let grown = v["rss_peak"].as_i64().unwrap() - v["rss_before"].as_i64().unwrap();
        assert!(
            grown < 64 << 20,
            "tokens {tokens}: RSS grew {grown} bytes: {v}"
        );
        if tokens {
            // Every stream refused at once, none buffered.
            assert_eq!(v["grpc_status"]["16"], json!(256), "{v}");
        }
    }
}

/// Item 2 (cases 1.27–1.28): sockets that send nothing are closed after
/// header_timeout_secs, and while they hold every place a probe still gets
/// through (the probe room HTTP has). d5eefae: never closed, and health
/// checks were refused for as long as they stayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_grpc_sockets_are_closed() {
    let n = node(&["--grpc-max-connections", "3", "--header-timeout-secs", "1"]);
    let mut silent: Vec<TcpStream> = (0..3)
        .map(|_| TcpStream::connect(&n.grpc).unwrap())
        .collect();
    // Every place is held: a health check comes in over the cap, as a probe.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let serving = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
    assert_eq!(
        health(&n.grpc).await.expect("a probe gets through"),
        serving
    );
    for s in &mut silent {
        assert!(
            closed_by_server(s, Duration::from_secs(10)),
            "a silent socket is closed by the server"
        );
    }
    let timed_out = support::metric(&n.s.addr, "freqcap_grpc_connections_timed_out_total");
    assert!(timed_out >= Some(3.0), "{timed_out:?}");
    // Their places are free: an ordinary call is served.
    let mut c = freqcap::grpc::pb::freqcap_client::FreqcapClient::new(channel(&n.grpc).await);
    let e = c.check(check("nope")).await.unwrap_err();
    assert_eq!(
        e.code(),
        Code::NotFound,
        "served (the policy is unknown): {e}"
    );
}

/// Item 2 (case 1.29): SIGTERM ends the process within the drain timeout
/// whatever gRPC peers hold: a silent socket, and a Health.Watch stream
/// that never ends. d5eefae: the process exited only when the peer left.
#[test]
fn sigterm_is_not_held_by_grpc_peers() {
    let n = node(&["--drain-timeout-secs", "2"]);
    let _silent = TcpStream::connect(&n.grpc).unwrap();
    let _watch = Holding::start(&["watch", &port(&n.grpc), "60"]);
    let mut n = n;
    support::signal(&n.s.0.child, libc::SIGTERM);
    let until = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(st) = n.s.0.child.try_wait().unwrap() {
            break Some(st);
        }
        if Instant::now() > until {
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let status = status.expect("the server exits while its peers stay (within 30 s)");
    assert!(status.success(), "{status:?}");
    assert!(
        support::log_text(&n.s.log).contains("stopped"),
        "the writer was flushed and the process stopped cleanly"
    );
}

/// Item 3 (case 1.30): HTTP/2 streams that send a head and no body do not
/// count in flight, so they cannot starve other clients. d5eefae: 100 such
/// streams against max_in_flight 16 made every front answer 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_only_streams_do_not_fill_in_flight() {
    let n = node(&["--max-in-flight", "16"]);
    let policy = json!({"limits": [{"kind": "window", "limit": 100, "window": "1h"}]});
    assert_eq!(
        support::http(&n.s.addr, "PUT", "/v1/policies/p", Some(policy)).0,
        200
    );
    let _held = Holding::start(&["hold-headers", &port(&n.s.addr), "100", "30"]);
    assert_eq!(
        support::metric(&n.s.addr, "freqcap_in_flight_requests"),
        Some(0.0),
        "heads waiting for their bodies are not in flight"
    );
    let (status, body) = support::http(
        &n.s.addr,
        "POST",
        "/v1/check",
        Some(json!({"policy": "p", "key": "k"})),
    );
    assert_eq!(status, 200, "{body}");
    let mut c = freqcap::grpc::pb::freqcap_client::FreqcapClient::new(channel(&n.grpc).await);
    let d = c
        .check(check("p"))
        .await
        .expect("gRPC is served too")
        .into_inner();
    assert!(d.allowed);
}

/// The body memory budget: bodies being received are charged as their
/// bytes arrive, and past `body_memory` a request is refused 503 at once.
/// 5 streams each sending 50 000 of 60 000 bytes (and 8 KiB of state and
/// head each) against 196 608: at most three can be held.
#[test]
fn bodies_being_received_are_bounded() {
    let n = node(&[
        "--max-body",
        "65536",
        "--body-memory",
        "196608",
        "--body-timeout-secs",
        "5",
    ]);
    let v = probe(&["bodies", &port(&n.s.addr), "5", "60000", "50000", "2"]);
    assert!(v["status"]["503"].as_i64() >= Some(2), "{v}");
    let shed = support::metric(
        &n.s.addr,
        "freqcap_overloaded_total{reason=\"body_memory\"}",
    );
    assert!(shed >= Some(2.0), "{shed:?}");
}

/// Item 6 (case 1.14): HTTP/2's `:authority` is held to the same names as
/// `Host`. d5eefae: `evil.example` was answered 200.
#[test]
fn http2_authority_is_checked() {
    let n = node(&[]);
    let p = port(&n.s.addr);
    assert_eq!(probe(&["authority", &p, "evil.example"])["status"], 403);
    assert_eq!(
        probe(&["authority", &p, &format!("localhost:{p}")])["status"],
        200
    );
}

fn get(addr: &str, path: &str, token: Option<&str>) -> (u16, ureq::http::HeaderMap) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let mut r = agent.get(format!("http://{addr}{path}"));
    if let Some(t) = token {
        r = r.header("authorization", format!("Bearer {t}"));
    }
    let r = r.call().expect("answers");
    (r.status().as_u16(), r.headers().clone())
}

/// Case 1.13: two `Host` fields are refused, whichever comes first.
#[test]
fn two_host_fields_are_refused() {
    use std::io::Write;
    let n = node(&[]);
    let mut c = TcpStream::connect(&n.s.addr).unwrap();
    c.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nHost: evil.example\r\nConnection: close\r\n\r\n")
        .unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut answer = String::new();
    let _ = c.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
}

/// Item 6 (case 1.6): with only the admin token set, decisions and reads
/// need a token on HTTP too, as on gRPC and RESP. d5eefae: open on HTTP.
#[test]
fn an_admin_token_alone_closes_every_front() {
    let n = node(&["--admin-token", "atok-0123456789abcdef"]);
    assert_eq!(get(&n.s.addr, "/v1/campaigns", None).0, 401);
    assert_eq!(
        get(&n.s.addr, "/v1/campaigns", Some("atok-0123456789abcdef")).0,
        200
    );
    assert_eq!(get(&n.s.addr, "/healthz", None).0, 200);
}

/// Item 5 (case 1.7): with per-definition series, /metrics names campaigns,
/// budgets and spend, so it needs a token as their delivery does; without
/// them it stays open to scrapers. Item 8 (case 1.15): every answer says
/// nosniff, and no page may frame one.
#[test]
fn per_definition_metrics_need_a_token() {
    let t = "dtok-0123456789abcdef";
    let n = node(&["--decision-token", t, "--metrics-top", "10"]);
    assert_eq!(get(&n.s.addr, "/metrics", None).0, 401);
    assert_eq!(get(&n.s.addr, "/metrics", Some(t)).0, 200);
    let plain = node(&["--decision-token", t]);
    let (status, headers) = get(&plain.s.addr, "/metrics", None);
    assert_eq!(status, 200);
    assert_eq!(headers["x-content-type-options"], "nosniff");
    let (status, headers) = get(&plain.s.addr, "/ui/nope.js", None);
    assert_eq!(status, 404);
    assert_eq!(headers["x-content-type-options"], "nosniff");
    assert_eq!(headers["x-frame-options"], "DENY");
}
