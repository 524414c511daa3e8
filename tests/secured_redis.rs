//! A secured Redis as the store (docs/cluster.md, "A secured Redis"):
//! Debian's redis-server with TLS only and an ACL user (the default user
//! off), certificates made by the test (rcgen). One Redis (`rediss://`)
//! and the 3 + 3 cluster (`rediss-cluster://`, client certificates
//! required), the password from a file or the environment and never in a
//! log line or a metric; in owner mode the nodes forward to each other over
//! mutual TLS.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::certs::{Ca, Leaf, TlsClient, request, request_with_head};
use support::cluster::{OneRedis, Redis};
use support::{Stopped, http, log_text, serve_env};

const USER: &str = "freqcap";
/// Unusual enough that finding it anywhere is a leak.
const PASSWORD: &str = "Pw-7f3a91-never-logged";

/// The test's PKI: a CA, Redis's certificate (as ops/redis-cluster.sh
/// wants them: ca.pem, redis.pem, redis.key in one directory), a node's
/// certificate (server and client) and a client's.
struct Pki {
    ca: Ca,
    ca_file: String,
    node: Leaf,
    client: Leaf,
}

fn pki(dir: &Path) -> Pki {
    std::fs::create_dir_all(dir).unwrap();
    let ca = Ca::new("freqcap test CA");
    let ca_file = ca.write(dir, "ca.pem").display().to_string();
    ca.leaf(dir, "redis", 1);
    let node = ca.leaf(dir, "node", 2);
    let client = ca.leaf(dir, "client", 3);
    Pki {
        ca,
        ca_file,
        node,
        client,
    }
}

/// One redis-server, TLS only on `port`, with the ACL user.
fn one_redis(dir: &Path, tls: &Path, port: u16) -> OneRedis {
    let t = |f: &str| tls.join(f).display().to_string();
    let port = port.to_string();
    let args: Vec<String> = [
        "--port",
        "0",
        "--tls-port",
        &port,
        "--tls-cert-file",
        &t("redis.pem"),
        "--tls-key-file",
        &t("redis.key"),
        "--tls-ca-cert-file",
        &t("ca.pem"),
        "--tls-auth-clients",
        "no",
        "--user",
        "default",
        "off",
        // Keys under fc: only: what docs/cluster.md says the user needs.
        "--user",
        USER,
        "on",
        &format!(">{PASSWORD}"),
        "~fc:*",
        "+@all",
    ]
    .map(str::to_owned)
    .to_vec();
    let cli: Vec<String> = [
        "-p",
        &port,
        "--tls",
        "--cacert",
        &t("ca.pem"),
        "--user",
        USER,
        "--pass",
        PASSWORD,
        "--no-auth-warning",
    ]
    .map(str::to_owned)
    .to_vec();
    OneRedis::start(dir, &args, &cli)
}

/// What a node must never show: the password.
fn assert_no_password(what: &str, text: &str) {
    assert!(
        !text.contains(PASSWORD),
        "{what} shows the password:\n{text}"
    );
}

#[test]
fn one_redis_over_tls_with_an_acl_user_and_the_password_in_a_file() {
    let tmp = tempfile::tempdir().unwrap();
    let p = pki(&tmp.path().join("tls"));
    let _redis = one_redis(tmp.path(), &tmp.path().join("tls"), 8130);
    let pw = tmp.path().join("password");
    std::fs::write(&pw, format!("{PASSWORD}\n")).unwrap();
    let pw = pw.display().to_string();
    let url = format!("rediss://{USER}@127.0.0.1:8130");
    let args = |url: &str| {
        vec![
            "--listen".to_owned(),
            "127.0.0.1:0".into(),
            "--store".into(),
            url.to_owned(),
            "--store-ca".into(),
            p.ca_file.clone(),
            "--store-password-file".into(),
            pw.clone(),
        ]
    };
    // Debug logging: the client crate's lines too must not show it.
    let env = [("FREQCAP_LOG", "debug")];
    let n = Stopped(serve_env(args(&url), &env, false));
    let (st, body) = http(
        &n.addr,
        "PUT",
        "/v1/policies/api",
        Some(json!({"limits": [{"kind": "window", "limit": 2, "window": "1h", "name": "hourly"}]})),
    );
    assert!(st == 200 || st == 201, "{st} {body}");
    let check = json!({"policy": "api", "key": "k1"});
    let allowed =
        |addr: &str| http(addr, "POST", "/v1/check", Some(check.clone())).1["allowed"].clone();
    assert_eq!(
        [allowed(&n.addr), allowed(&n.addr), allowed(&n.addr)],
        [true, true, false]
    );
    let (_, metrics) = http(&n.addr, "GET", "/metrics", None);
    assert_no_password("/metrics", metrics.as_str().unwrap_or_default());
    let log = log_text(&n.log);
    assert!(
        log.contains("state in Redis (rediss://freqcap@127.0.0.1:8130)"),
        "{log}"
    );
    assert_no_password("the log", &log);
    drop(n);

    // A node started again finds the counts in Redis.
    let n = Stopped(serve_env(args(&url), &[], false));
    assert_eq!(allowed(&n.addr), false);
    drop(n);

    // A wrong password stops the start at once, named but not shown.
    let wrong = "Wr0ng-Pa55-also-never-shown";
    let out = Command::new(env!("CARGO_BIN_EXE_freqcap"))
        .args(["serve", "--listen", "127.0.0.1:0", "--grpc-listen", "off"])
        .args([
            "--store",
            &format!("rediss://{USER}:{wrong}@127.0.0.1:8130"),
        ])
        .args(["--store-ca", &p.ca_file])
        .env("FREQCAP_LOG", "debug")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("refused this node's credentials"), "{err}");
    assert!(!err.contains(wrong), "the wrong password is shown:\n{err}");
    assert!(err.contains("Redis at 127.0.0.1:8130 refused"), "{err}");
}

/// A node of the secured cluster, in owner mode, with TLS on its listener
/// and client certificates required.
fn owner_node(p: &Pki, tls: &Path, seeds: &str, id: &str) -> Stopped {
    let url = seeds.replacen("://", &format!("://{USER}@"), 1);
    let s = |p: &Path| p.display().to_string();
    let args = vec![
        "--listen".to_owned(),
        "127.0.0.1:0".into(),
        "--store".into(),
        url,
        "--store-ca".into(),
        p.ca_file.clone(),
        "--store-cert".into(),
        s(&tls.join("node.pem")),
        "--store-key".into(),
        s(&tls.join("node.key")),
        "--durability".into(),
        "replicated".into(),
        "--node-id".into(),
        id.into(),
        "--reservations".into(),
        "owner".into(),
        "--tls-cert".into(),
        s(&p.node.cert),
        "--tls-key".into(),
        s(&p.node.key),
        "--tls-client-ca".into(),
        p.ca_file.clone(),
    ];
    Stopped(serve_env(
        args,
        &[
            ("FREQCAP_STORE_PASSWORD", PASSWORD),
            ("FREQCAP_LOG", "debug"),
        ],
        false,
    ))
}

/// A call over mutual TLS, retried (15 s at most) while it answers 503 or
/// the connection fails: owners settle after a node joins.
fn call(
    c: &TlsClient,
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> (u16, String, Value) {
    let started = Instant::now();
    loop {
        let got = c
            .connect(addr)
            .and_then(|mut s| request_with_head(&mut s, method, path, body));
        match got {
            Ok((st, head, text)) if st != 503 => {
                let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
                return (st, head, v);
            }
            other => {
                assert!(
                    started.elapsed() < Duration::from_secs(15),
                    "{method} {path}: {other:?}"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

#[test]
fn a_secured_cluster_with_client_certificates_and_owners_forwarding_over_tls() {
    let tmp = tempfile::tempdir().unwrap();
    let tls = tmp.path().join("tls");
    let p = pki(&tls);
    let tls_dir = tls.display().to_string();
    let redis = Redis::start_env(
        &tmp.path().join("redis"),
        8140,
        &[
            ("REDIS_TLS_DIR", &tls_dir),
            ("REDIS_TLS_AUTH_CLIENTS", "yes"),
            ("REDIS_ACL_USER", USER),
            ("REDIS_ACL_PASSWORD", PASSWORD),
        ],
    );
    assert!(
        redis.seeds.starts_with("rediss-cluster://"),
        "{}",
        redis.seeds
    );
    let a = owner_node(&p, &tls, &redis.seeds, "a");
    let b = owner_node(&p, &tls, &redis.seeds, "b");
    let c = TlsClient::new(&[&p.ca.pem], Some(&p.client), &["http/1.1"]);
    let def = json!({"caps": [{"kind": "window", "limit": 2, "window": "1h"}]});
    let (st, _, body) = call(&c, &a.addr, "PUT", "/v1/campaigns/camp", Some(&def));
    assert_eq!(st, 200, "{body}");
    // b reads definitions from Redis within a second.
    let started = Instant::now();
    while call(&c, &b.addr, "GET", "/v1/campaigns/camp", None).0 != 200 {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "b never saw the campaign"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Both members own users once their leases are active (2 s).
    std::thread::sleep(Duration::from_millis(2_500));

    // Users' impressions all sent to a: b's users are forwarded to b over
    // mutual TLS (the answer names the owner), and every cap holds.
    let (mut forwarded, mut local) = (0, 0);
    for i in 0..64 {
        if forwarded >= 2 && local >= 2 {
            break;
        }
        let user = format!("u{i}");
        let mut got = Vec::new();
        for _ in 0..3 {
            let screen = json!({"user": user, "candidates": [{"campaign": "camp"}], "reserve": true, "ttl_ms": 5000});
            let (st, head, out) = call(&c, &a.addr, "POST", "/v1/screen", Some(&screen));
            assert_eq!(st, 200, "{out}");
            let owner = head.to_ascii_lowercase().contains("x-freqcap-owner:");
            if got.is_empty() {
                if owner { forwarded += 1 } else { local += 1 }
            }
            let eligible = out["results"][0]["eligible"] == true;
            if eligible {
                let id = out["reservation"]
                    .as_str()
                    .expect("a reservation")
                    .to_owned();
                let (st, _, out) = call(
                    &c,
                    &a.addr,
                    "POST",
                    &format!("/v1/reservations/{id}/commit"),
                    Some(&json!({})),
                );
                assert_eq!(
                    (st, out["outcome"].as_str()),
                    (200, Some("committed")),
                    "{out}"
                );
            }
            got.push(eligible);
        }
        assert_eq!(got, [true, true, false], "{user}");
    }
    assert!(
        forwarded >= 2 && local >= 2,
        "forwarded {forwarded}, decided on a {local}"
    );

    for n in [&a, &b] {
        let mut s = c.connect(&n.addr).unwrap();
        let (_, metrics) = request(&mut s, "GET", "/metrics", None).unwrap();
        assert_no_password("/metrics", &metrics);
        assert_no_password("the log", &log_text(&n.log));
    }
}
