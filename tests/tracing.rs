//! Tracing (docs/service.md, "Tracing"; feature `otlp`): a real `freqcap
//! serve` on one Redis exports its spans to an OTLP/HTTP receiver run by
//! the test, which decodes them with opentelemetry-proto. A check sent over
//! HTTP with a W3C `traceparent`, and one over gRPC with it in metadata,
//! each come back as a span tree in the caller's trace: the request's span
//! (its parent the caller's span), the decision within it, and the store's
//! calls within that, each with its round trip as an event.
#![cfg(feature = "otlp")]

mod support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use freqcap::grpc::pb;
use freqcap::grpc::pb::freqcap_client::FreqcapClient;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::json;
use support::{Stopped, logged_addr, serve_env};

/// Spans received so far.
type Received = Arc<Mutex<Vec<Span>>>;

/// An OTLP/HTTP receiver on a free loopback port: every POST's body is an
/// `ExportTraceServiceRequest`, answered 200. Its thread ends with the
/// test process (it only accepts on loopback, a bounded number of times).
fn receiver() -> (String, Received) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let got: Received = Arc::default();
    let spans = got.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(1000) {
            let Ok(stream) = stream else { continue };
            let spans = spans.clone();
            std::thread::spawn(move || serve_posts(stream, &spans));
        }
    });
    (addr, got)
}

/// Reads requests on one kept-alive connection (100 at most).
fn serve_posts(stream: std::net::TcpStream, spans: &Received) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let mut w = stream.try_clone().unwrap();
    let mut r = BufReader::new(stream);
    for _ in 0..100 {
        let mut len = 0usize;
        let mut chunked = false;
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let lower = h.to_ascii_lowercase();
            if let Some(v) = lower.strip_prefix("content-length:") {
                len = v.trim().parse().unwrap_or(0);
            }
            if lower.starts_with("transfer-encoding:") && lower.contains("chunked") {
                chunked = true;
            }
        }
        let mut body = Vec::new();
        if chunked {
            for _ in 0..10_000 {
                let mut size = String::new();
                r.read_line(&mut size).unwrap();
                let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
                let mut chunk = vec![0u8; n + 2];
                r.read_exact(&mut chunk).unwrap();
                if n == 0 {
                    break;
                }
                body.extend_from_slice(&chunk[..n]);
            }
        } else {
            body.resize(len, 0);
            r.read_exact(&mut body).unwrap();
        }
        if let Ok(req) = ExportTraceServiceRequest::decode(body.as_slice()) {
            let mut s = spans.lock().unwrap();
            for rs in req.resource_spans {
                for ss in rs.scope_spans {
                    s.extend(ss.spans);
                }
            }
        }
        let _ = w.write_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n",
        );
    }
}

fn one_redis(dir: &std::path::Path, port: u16) -> support::cluster::OneRedis {
    let port = port.to_string();
    let args = ["--port".to_owned(), port.clone()];
    let cli = ["-p".to_owned(), port];
    support::cluster::OneRedis::start(dir, &args, &cli)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The spans of trace `trace`, by span id, once the request's span and a
/// store call are in (20 s at most).
fn trace_of(got: &Received, trace: &str) -> HashMap<String, Span> {
    let started = Instant::now();
    loop {
        let spans: HashMap<String, Span> = got
            .lock()
            .unwrap()
            .iter()
            .filter(|s| hex(&s.trace_id) == trace)
            .map(|s| (hex(&s.span_id), s.clone()))
            .collect();
        let names: Vec<&str> = spans.values().map(|s| s.name.as_str()).collect();
        if names.contains(&"store.call") && names.iter().any(|n| n.starts_with("POST ")) {
            return spans;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "trace {trace} incomplete: {names:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Checks the tree: the request's span is the caller's child, the decision
/// is the request's, every store call is within the decision, with its
/// round trip as an event.
fn assert_tree(spans: &HashMap<String, Span>, name: &str, caller: &str) {
    let request = spans.values().find(|s| s.name == name).unwrap_or_else(|| {
        panic!(
            "no span {name}: {:?}",
            spans.values().map(|s| &s.name).collect::<Vec<_>>()
        )
    });
    assert_eq!(hex(&request.parent_span_id), caller, "{name}'s parent");
    let request_id = hex(&request.span_id);
    let decides: Vec<&Span> = spans
        .values()
        .filter(|s| s.name == "decide" && hex(&s.parent_span_id) == request_id)
        .collect();
    assert!(!decides.is_empty(), "no decision within {name}");
    let calls: Vec<&Span> = spans.values().filter(|s| s.name == "store.call").collect();
    assert!(!calls.is_empty());
    for c in calls {
        let parent = hex(&c.parent_span_id);
        assert!(
            decides.iter().any(|d| hex(&d.span_id) == parent),
            "a store call outside the decision"
        );
        assert!(
            c.events.iter().any(|e| e.name == "round trip"),
            "a store call without its round trip: {c:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callers_trace_continues_through_the_decision_and_the_store() {
    let tmp = tempfile::tempdir().unwrap();
    let _redis = one_redis(tmp.path(), 8150);
    let (collector, got) = receiver();
    let endpoint = format!("http://{collector}");
    let n = Stopped(serve_env(
        [
            "--listen",
            "127.0.0.1:0",
            "--grpc-listen",
            "127.0.0.1:0",
            "--store",
            "redis://127.0.0.1:8150",
            "--otlp-endpoint",
            &endpoint,
        ],
        &[("OTEL_BSP_SCHEDULE_DELAY", "100")],
        false,
    ));
    let grpc = logged_addr(&n.log, "gRPC listening on ");
    let (st, body) = support::http(
        &n.addr,
        "PUT",
        "/v1/policies/api",
        Some(json!({"limits": [{"kind": "rate", "rate": 100, "per": "1s", "name": "r"}]})),
    );
    assert!(st == 200 || st == 201, "{st} {body}");

    // HTTP, with the caller's traceparent.
    let (t1, p1) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let r = agent
        .post(format!("http://{}/v1/check", n.addr))
        .header("traceparent", format!("00-{t1}-{p1}-01"))
        .send_json(json!({"policy": "api", "key": "traced"}))
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);

    // gRPC, with it in metadata.
    let (t2, p2) = ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331");
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut req = tonic::Request::new(pb::CheckRequest {
        policy: Some("api".into()),
        key: "traced-grpc".into(),
        cost: Some(1),
        ..Default::default()
    });
    req.metadata_mut()
        .insert("traceparent", format!("00-{t2}-{p2}-01").parse().unwrap());
    assert!(
        FreqcapClient::new(ch)
            .check(req)
            .await
            .unwrap()
            .into_inner()
            .allowed
    );

    let http = trace_of(&got, t1);
    assert_tree(&http, "POST /v1/check", p1);
    let grpc = trace_of(&got, t2);
    assert_tree(&grpc, "POST /freqcap.v1.Freqcap/Check", p2);
}
