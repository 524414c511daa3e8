//! TLS on every listener (docs/service.md, "TLS") of a real `freqcap
//! serve`, with certificates made by the test (rcgen): HTTP/1.1 and h2 by
//! ALPN (a rustls client and curl), gRPC (tonic), RESP (redis-cli --tls);
//! plaintext refused cleanly; mutual TLS; certificates reloaded on change
//! and on SIGHUP without dropping open connections; slow handshakes closed.

mod support;

use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use freqcap::grpc::pb;
use freqcap::grpc::pb::freqcap_client::FreqcapClient;
use serde_json::json;
use support::certs::{Ca, Leaf, TlsClient, TlsStream, peer, request};
use support::{Stopped, logged_addr, serve};

/// A node in memory with TLS on its three listeners (`extra` added).
fn node(server: &Leaf, extra: &[&str]) -> Stopped {
    let mut args = vec![
        "--memory".to_owned(),
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--grpc-listen".into(),
        "127.0.0.1:0".into(),
        "--resp-listen".into(),
        "127.0.0.1:0".into(),
        "--tls-cert".into(),
        server.cert.display().to_string(),
        "--tls-key".into(),
        server.key.display().to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    Stopped(serve(args, false))
}

/// A metric's value through a TLS connection.
fn metric(s: &mut TlsStream, name: &str) -> f64 {
    let (status, text) = request(s, "GET", "/metrics", None).expect("metrics");
    assert_eq!(status, 200);
    text.lines()
        .find(|l| l.starts_with(name) && !l.starts_with('#'))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} in /metrics"))
}

fn curl(args: &[&str]) -> String {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10"])
        .args(args)
        .output()
        .expect("curl runs");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn redis_cli(port: &str, args: &[&str]) -> String {
    let (host, port) = port.rsplit_once(':').expect("host:port");
    let out = Command::new("redis-cli")
        .args(["-h", host, "-p", port])
        .args(args)
        .output()
        .expect("redis-cli runs");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Whether the server closes `s` within `limit` (it sends nothing back).
fn closed_within(s: &mut std::net::TcpStream, limit: Duration) -> bool {
    s.set_read_timeout(Some(limit)).expect("timeout");
    let mut buf = [0u8; 64];
    let started = Instant::now();
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) if started.elapsed() < limit => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            _ => return false,
        }
    }
}

async fn grpc_check(addr: &str, ca: &str) -> Result<bool, String> {
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(ca))
        .domain_name("localhost");
    let channel = tonic::transport::Endpoint::from_shared(format!("https://{addr}"))
        .map_err(|e| e.to_string())?
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    let inline = pb::CheckRequest {
        limits: vec![pb::Limit {
            kind: "rate".into(),
            rate: Some(10),
            per: Some("1s".into()),
            ..Default::default()
        }],
        key: "k".into(),
        ..Default::default()
    };
    let r = FreqcapClient::new(channel)
        .check(inline)
        .await
        .map_err(|e| e.to_string())?;
    Ok(r.into_inner().allowed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_listener_speaks_tls_and_plaintext_is_refused_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("freqcap test CA");
    let ca_file = ca.write(dir.path(), "ca.pem");
    let server = ca.leaf(dir.path(), "server", 1);
    let n = node(&server, &[]);
    let grpc = logged_addr(&n.log, "gRPC listening on ");
    let resp = logged_addr(&n.log, "RESP (Redis protocol) listening on ");

    // HTTP: h2 chosen by ALPN when offered, HTTP/1.1 otherwise; the
    // server's certificate is the configured one.
    let h2 = TlsClient::new(&[&ca.pem], None, &["h2", "http/1.1"]);
    let s = h2.connect(&n.addr).expect("TLS handshake");
    assert_eq!(peer(&s), (server.der(), Some("h2".to_owned())));
    let h1 = TlsClient::new(&[&ca.pem], None, &["http/1.1"]);
    let mut s = h1.connect(&n.addr).expect("TLS handshake");
    assert_eq!(peer(&s).1.as_deref(), Some("http/1.1"));
    let (st, body) = request(
        &mut s,
        "PUT",
        "/v1/policies/api",
        Some(&json!({"limits": [{"kind": "rate", "rate": 2, "per": "1m", "name": "per_min"}]})),
    )
    .unwrap();
    assert!(st == 200 || st == 201, "{st} {body}");
    let check = json!({"policy": "api", "key": "client-1"});
    for want in [true, true, false] {
        let (st, body) = request(&mut s, "POST", "/v1/check", Some(&check)).unwrap();
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["allowed"], want, "{st} {body}");
    }
    // curl, over h2 with the test CA.
    let url = format!(
        "https://127.0.0.1:{}/healthz",
        n.addr.rsplit(':').next().unwrap()
    );
    let ca_arg = ca_file.display().to_string();
    let got = curl(&[
        "--http2",
        "--cacert",
        &ca_arg,
        "-o",
        "/dev/null",
        "-w",
        "%{http_version} %{http_code}",
        &url,
    ]);
    assert_eq!(got, "2 200", "{got}");
    // Plaintext HTTP on the TLS port: told to use https, closed.
    let plain = curl(&["-i", &format!("http://{}/healthz", n.addr)]);
    assert!(plain.starts_with("HTTP/1.1 400"), "{plain}");
    assert!(plain.contains("This port speaks TLS"), "{plain}");

    // gRPC over TLS, and refused over h2c.
    assert_eq!(grpc_check(&grpc, &ca.pem).await, Ok(true));
    let h2c = tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(5))
        .connect()
        .await;
    let refused = match h2c {
        Err(_) => true,
        Ok(ch) => FreqcapClient::new(ch)
            .check(pb::CheckRequest::default())
            .await
            .is_err(),
    };
    assert!(refused, "gRPC without TLS on a TLS port must fail");

    // RESP: redis-cli over TLS; plaintext told it speaks TLS.
    let pong = redis_cli(&resp, &["--tls", "--cacert", &ca_arg, "PING"]);
    assert_eq!(pong.trim(), "PONG", "{pong}");
    let plain = redis_cli(&resp, &["PING"]);
    assert!(plain.contains("this port speaks TLS"), "{plain}");

    // Each refusal counted.
    let refused = metric(&mut s, "freqcap_tls_plaintext_refused_total");
    assert!(refused >= 3.0, "{refused}");
}

#[test]
fn mutual_tls_requires_a_client_certificate_from_the_configured_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("freqcap test CA");
    let ca_file = ca.write(dir.path(), "ca.pem");
    let server = ca.leaf(dir.path(), "server", 1);
    let client = ca.leaf(dir.path(), "client", 2);
    let stranger_ca = Ca::new("another CA");
    let stranger = stranger_ca.leaf(dir.path(), "stranger", 3);
    let n = node(
        &server,
        &["--tls-client-ca", &ca_file.display().to_string()],
    );

    let ok = TlsClient::new(&[&ca.pem], Some(&client), &["http/1.1"]);
    let mut s = ok.connect(&n.addr).expect("handshake");
    assert_eq!(
        request(&mut s, "GET", "/healthz", None).map(|r| r.0),
        Ok(200)
    );

    // No certificate, or one of another CA: no answer (TLS 1.3 sends the
    // verdict after the client's Finished, so it shows at the first read).
    for (what, client) in [("none", None), ("another CA's", Some(&stranger))] {
        let c = TlsClient::new(&[&ca.pem], client, &["http/1.1"]);
        let answered = c
            .connect(&n.addr)
            .and_then(|mut s| request(&mut s, "GET", "/healthz", None));
        assert!(answered.is_err(), "{what} certificate: {answered:?}");
    }
    // curl with and without the client certificate.
    let url = format!(
        "https://127.0.0.1:{}/healthz",
        n.addr.rsplit(':').next().unwrap()
    );
    let ca_arg = ca_file.display().to_string();
    let (cert, key) = (
        client.cert.display().to_string(),
        client.key.display().to_string(),
    );
    let got = curl(&[
        "--cacert",
        &ca_arg,
        "--cert",
        &cert,
        "--key",
        &key,
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        &url,
    ]);
    assert_eq!(got, "200", "{got}");
    let got = curl(&[
        "--cacert",
        &ca_arg,
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        &url,
    ]);
    assert!(
        got.starts_with("000"),
        "without a client certificate: {got}"
    );

    let failures = metric(&mut s, "freqcap_tls_handshake_failures_total");
    assert!(failures >= 3.0, "{failures}");
}

/// Replaces `path` with `text` at once (a rename), its modification time
/// set to `mtime` when given.
fn replace(path: &Path, text: &str, mtime: Option<std::time::SystemTime>) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    if let Some(t) = mtime {
        std::fs::File::options()
            .write(true)
            .open(&tmp)
            .unwrap()
            .set_modified(t)
            .unwrap();
    }
    std::fs::rename(&tmp, path).unwrap();
}

/// Polls new connections until one presents `want`, 15 s at most.
fn served_within(client: &TlsClient, addr: &str, want: &Leaf) -> bool {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(15) {
        if let Ok(s) = client.connect(addr)
            && peer(&s).0 == want.der()
        {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

#[test]
fn renewed_certificates_reach_new_connections_and_open_ones_stay() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("freqcap test CA");
    let a = ca.leaf(dir.path(), "server", 1);
    let n = node(&a, &[]);
    let client = TlsClient::new(&[&ca.pem], None, &["http/1.1"]);
    let mut open = client.connect(&n.addr).unwrap();
    assert_eq!(peer(&open).0, a.der());
    assert_eq!(
        request(&mut open, "GET", "/healthz", None).map(|r| r.0),
        Ok(200)
    );

    // The files change: new connections get the new certificate within
    // the watch interval; the open one goes on with its session.
    let b = ca.leaf(dir.path(), "server-b", 2);
    replace(&a.key, &b.key_pem, None);
    replace(&a.cert, &b.cert_pem, None);
    assert!(served_within(&client, &n.addr, &b), "B never served");
    assert_eq!(
        request(&mut open, "GET", "/healthz", None).map(|r| r.0),
        Ok(200)
    );
    assert_eq!(peer(&open).0, a.der());

    // SIGHUP: files of the same size and modification time as B's, which
    // the watch cannot tell from B's, are loaded on the signal.
    let c = ca.leaf(dir.path(), "server-c", 3);
    assert_eq!(
        (c.cert_pem.len(), c.key_pem.len()),
        (b.cert_pem.len(), b.key_pem.len()),
        "same-shaped certificates"
    );
    let mtime = |p: &Path| std::fs::metadata(p).unwrap().modified().unwrap();
    let (cert_t, key_t) = (mtime(&a.cert), mtime(&a.key));
    replace(&a.key, &c.key_pem, Some(key_t));
    replace(&a.cert, &c.cert_pem, Some(cert_t));
    std::thread::sleep(Duration::from_secs(3));
    let s = client.connect(&n.addr).unwrap();
    assert_eq!(peer(&s).0, b.der(), "reloaded without a change or signal");
    support::signal(&n.0.child, libc::SIGHUP);
    assert!(
        served_within(&client, &n.addr, &c),
        "C never served after SIGHUP"
    );
    assert!(support::log_text(&n.log).contains("TLS certificates reloaded (SIGHUP)"));

    // A broken key is refused: C stays, counted, tried again only when
    // the file changes again.
    replace(&a.key, "not a key", None);
    let mut s = client.connect(&n.addr).unwrap();
    let started = Instant::now();
    while metric(&mut s, "freqcap_tls_reload_failures_total") < 1.0 {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "no failed reload"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(metric(&mut s, "freqcap_tls_reload_failures_total"), 1.0);
    let s = client.connect(&n.addr).unwrap();
    assert_eq!(peer(&s).0, c.der());
    assert!(support::log_text(&n.log).contains("TLS certificates not reloaded"));
}

#[test]
fn silent_and_half_sent_handshakes_are_closed_within_the_header_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("freqcap test CA");
    let server = ca.leaf(dir.path(), "server", 1);
    let n = node(&server, &["--header-timeout-secs", "1"]);
    let addr = n.addr.clone();
    let mut silent = std::net::TcpStream::connect(&addr).unwrap();
    let mut half = std::net::TcpStream::connect(&addr).unwrap();
    // A TLS record header announcing 512 bytes, and 5 of them.
    half.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 1, 0, 1, 252, 3])
        .unwrap();
    let started = Instant::now();
    assert!(closed_within(&mut silent, Duration::from_secs(10)));
    assert!(closed_within(&mut half, Duration::from_secs(10)));
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(900), "closed early: {took:?}");
    let client = TlsClient::new(&[&ca.pem], None, &["http/1.1"]);
    let mut s = client.connect(&addr).unwrap();
    assert!(metric(&mut s, "freqcap_tls_handshake_failures_total") >= 2.0);
}

#[test]
fn bad_tls_settings_stop_the_start_naming_the_option() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("freqcap test CA");
    let a = ca.leaf(dir.path(), "a", 1);
    let b = ca.leaf(dir.path(), "b", 2);
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "hello").unwrap();
    let p = |l: &Path| l.display().to_string();
    for (args, want) in [
        (
            vec!["--tls-cert", &p(&a.cert)],
            "tls_key: required with tls_cert",
        ),
        (
            vec!["--tls-key", &p(&a.key)],
            "tls_cert: required with tls_key",
        ),
        (
            vec!["--tls-client-ca", &p(&a.cert)],
            "tls_client_ca: needs tls_cert and tls_key",
        ),
        (
            vec!["--tls-cert", &p(&garbage), "--tls-key", &p(&a.key)],
            "tls_cert: no certificate",
        ),
        (
            vec!["--tls-cert", &p(&a.cert), "--tls-key", &p(&garbage)],
            "tls_key: no private key",
        ),
        (
            vec!["--tls-cert", &p(&a.cert), "--tls-key", &p(&b.key)],
            "tls_key:",
        ),
        (
            vec!["--tls-cert", "/nonexistent.pem", "--tls-key", &p(&a.key)],
            "tls_cert: cannot read /nonexistent.pem",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_freqcap"))
            .args([
                "serve",
                "--memory",
                "--listen",
                "127.0.0.1:0",
                "--grpc-listen",
                "off",
            ])
            .args(&args)
            .env("FREQCAP_LOG", "error")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} started");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}
