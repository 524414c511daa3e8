//! End-to-end tests of `freqcap serve` (docs/semantics.md §4–§8, docs/service.md): the real
//! binary, started on `127.0.0.1:0` with a temporary data directory, spoken to
//! over HTTP.
//!
//! Each test starts its own server (see [`Server`]), finds its port in the log
//! line `freqcap listening on 127.0.0.1:PORT`, and kills it when dropped. Every
//! wait is bounded in time and every loop in count; nothing asserts on timing.
//! Limits whose refill could race wall-clock time use periods of a minute or
//! more, and calendar-day caps are kept clear of midnight (see
//! [`clear_of_midnight`]).

use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

mod support;

/// How long a server may take to exit after SIGTERM or SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// Any single HTTP exchange.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

const DECISION_TOKEN: &str = "t1";
const ADMIN_TOKEN: &str = "t2";

// ---- the server under test ----

/// One `freqcap serve` child process. Dropping it kills the child.
struct Server {
    child: Child,
    base: String,
    agent: ureq::Agent,
    /// Everything the server wrote to stderr so far.
    log: Arc<Mutex<Vec<String>>>,
    /// Whether it was started with `--decision-token t1 --admin-token t2`.
    tokens: bool,
}

/// An HTTP answer, read in full.
#[derive(Debug)]
struct Resp {
    status: u16,
    headers: ureq::http::HeaderMap,
    text: String,
}

impl Resp {
    fn json(&self) -> Value {
        serde_json::from_str(&self.text)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {:?}", self.text))
    }

    fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .map(|v| v.to_str().expect("header is ASCII").to_owned())
    }
}

/// Which `Authorization` header a request carries.
#[derive(Debug, Clone, Copy)]
enum Auth {
    /// The token docs/semantics.md §8.6 assigns to the endpoint (none if the server has none).
    Right,
    /// No header.
    Missing,
    /// `Bearer <token>`.
    Bearer(&'static str),
    /// The header's whole value.
    Raw(&'static str),
}

impl Server {
    /// Starts `freqcap serve --listen 127.0.0.1:0 --data-dir <dir> <extra>` and
    /// waits until it logs its address.
    fn start(data_dir: &Path, extra: &[&str]) -> Server {
        let mut args: Vec<&std::ffi::OsStr> = vec![
            "--listen".as_ref(),
            "127.0.0.1:0".as_ref(),
            "--data-dir".as_ref(),
            data_dir.as_os_str(),
        ];
        args.extend(extra.iter().map(std::ffi::OsStr::new));
        let support::Served { child, addr, log } = support::serve(args, false);
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(REQUEST_TIMEOUT))
            .build()
            .into();
        let tokens = extra.contains(&"--decision-token");
        Server {
            child,
            base: format!("http://{addr}"),
            agent,
            log,
            tokens,
        }
    }

    fn log_text(&self) -> String {
        support::log_text(&self.log)
    }

    /// The token for an endpoint: admin to change definitions, decision for the
    /// rest. Reading a policy uses the admin token and reading a campaign the
    /// decision one, which src/api accepts (docs/service.md: the admin token is
    /// accepted everywhere, reads take either).
    fn right_token(method: &str, path: &str) -> &'static str {
        let admin = path.starts_with("/v1/policies")
            || (path.starts_with("/v1/campaigns/")
                && !path.ends_with("/delivery")
                && method != "GET");
        if admin { ADMIN_TOKEN } else { DECISION_TOKEN }
    }

    /// One exchange; `Err` only when HTTP itself failed (e.g. the server is gone).
    fn try_request(
        agent: &ureq::Agent,
        base: &str,
        method: &str,
        path: &str,
        auth: Option<String>,
        body: Option<&str>,
    ) -> Result<Resp, ureq::Error> {
        let url = format!("{base}{path}");
        let mut r = match (method, body) {
            ("GET", None) => with_auth(agent.get(&url), &auth).call()?,
            ("DELETE", None) => with_auth(agent.delete(&url), &auth).call()?,
            ("POST", b) => with_auth(agent.post(&url), &auth)
                .header("content-type", "application/json")
                .send(b.unwrap_or(""))?,
            ("PUT", b) => with_auth(agent.put(&url), &auth)
                .header("content-type", "application/json")
                .send(b.unwrap_or(""))?,
            other => panic!("unsupported request {other:?}"),
        };
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        let text = r.body_mut().read_to_string()?;
        Ok(Resp {
            status,
            headers,
            text,
        })
    }

    fn request(&self, method: &str, path: &str, auth: Auth, body: Option<&str>) -> Resp {
        let auth = match auth {
            Auth::Right if self.tokens => {
                Some(format!("Bearer {}", Self::right_token(method, path)))
            }
            Auth::Right | Auth::Missing => None,
            Auth::Bearer(t) => Some(format!("Bearer {t}")),
            Auth::Raw(v) => Some(v.to_owned()),
        };
        Self::try_request(&self.agent, &self.base, method, path, auth, body)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}; server log:\n{}", self.log_text()))
    }

    fn post(&self, path: &str, body: &Value) -> Resp {
        self.request("POST", path, Auth::Right, Some(&body.to_string()))
    }

    /// A request that must answer `status`; returns its JSON body.
    fn expect(&self, method: &str, path: &str, body: Option<&Value>, status: u16) -> Value {
        let text = body.map(Value::to_string);
        let r = self.request(method, path, Auth::Right, text.as_deref());
        assert_eq!(
            r.status, status,
            "{method} {path} {text:?} answered {}: {}",
            r.status, r.text
        );
        if r.text.is_empty() {
            Value::Null
        } else {
            r.json()
        }
    }

    /// Waits (bounded) for the child to exit.
    fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().expect("child status") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the server did not exit within {STOP_TIMEOUT:?}; its log:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The child has not been reaped yet (only `wait_exit` reaps, after
    /// this), so its pid is its own.
    fn signal(&self, sig: libc::c_int) {
        support::signal(&self.child, sig);
    }

    /// SIGTERM, then the exit status: a graceful shutdown.
    fn terminate(mut self) -> ExitStatus {
        self.signal(libc::SIGTERM);
        self.wait_exit()
    }

    /// SIGKILL: the process dies wherever it is.
    fn kill9(mut self) {
        self.signal(libc::SIGKILL);
        let status = self.wait_exit();
        assert!(!status.success(), "a SIGKILLed server exited with {status}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

fn with_auth<B>(r: ureq::RequestBuilder<B>, auth: &Option<String>) -> ureq::RequestBuilder<B> {
    match auth {
        Some(v) => r.header("authorization", v),
        None => r,
    }
}

// ---- helpers ----

/// Tests with calendar-day counters must not straddle UTC midnight (a new day
/// empties them): if midnight is under a minute away, wait until it has passed.
/// At most once a day, and never more than about a minute.
fn clear_of_midnight() {
    let now = jiff::Timestamp::now().as_second();
    let into_day = now.rem_euclid(86_400);
    if into_day > 86_400 - 60 {
        std::thread::sleep(Duration::from_secs((86_400 - into_day + 1) as u64));
    }
}

/// A usage answer without the time-dependent `reset_after_ms` fields, after
/// checking each is within the day.
fn usage_sans_reset(mut u: Value) -> Value {
    for cap in u["caps"].as_array_mut().expect("caps is a list") {
        let r = cap
            .as_object_mut()
            .expect("a cap is an object")
            .remove("reset_after_ms")
            .expect("reset_after_ms is reported");
        let r = r.as_u64().expect("reset_after_ms is an integer");
        assert!(r <= 86_400_000, "reset_after_ms {r} is over a day");
    }
    u
}

fn cap_json(
    campaign: &str,
    name: &str,
    scope: &str,
    kind: &str,
    limit: u64,
    used: u64,
    pending: u64,
) -> Value {
    json!({
        "campaign": campaign, "name": name, "scope": scope, "kind": kind,
        "event": "impression", "limit": limit, "used": used, "pending": pending,
        "remaining": limit - used - pending,
    })
}

/// Checks a delivery answer's period: the current UTC day.
fn assert_today(d: &Value) {
    let start: jiff::Timestamp = d["period_start"]
        .as_str()
        .expect("period_start is a string")
        .parse()
        .expect("period_start is RFC 3339");
    let end: jiff::Timestamp = d["period_end"]
        .as_str()
        .expect("period_end is a string")
        .parse()
        .expect("period_end is RFC 3339");
    let now = jiff::Timestamp::now();
    assert_eq!(start.as_second().rem_euclid(86_400), 0, "{d}");
    assert_eq!(end.as_second() - start.as_second(), 86_400, "{d}");
    assert!(start <= now && now < end, "{d} is not today ({now})");
}

// ---- 1. the ad flow ----

#[test]
fn ad_flow_screen_commit_release_and_caps() {
    clear_of_midnight();
    let dir = tempfile::tempdir().expect("temp dir");
    let s = Server::start(dir.path(), &[]);

    // Definitions: an advertiser with a shared daily cap, two campaigns under it.
    let adv = json!({"caps": [{"name": "adv_daily", "scope": "campaign", "kind": "window",
        "limit": 100, "window": "1d", "align": "calendar"}]});
    let c1 = json!({"parent": "adv",
        "caps": [{"name": "user_daily", "kind": "window", "limit": 2, "window": "1d",
            "align": "calendar"}],
        "budget": {"kind": "budget", "amount": 1000, "pacing": "asap"}});
    // A gap of an hour: only a release that really returns it lets c2 win again.
    let c2 = json!({"parent": "adv", "caps": [{"name": "user_gap", "kind": "gap", "min": "1h"}]});
    for (id, def) in [("adv", &adv), ("c1", &c1), ("c2", &c2)] {
        let stored = s.expect("PUT", &format!("/v1/campaigns/{id}"), Some(def), 200);
        assert_eq!(&stored, def, "PUT answers the stored definition");
        assert_eq!(
            &s.expect("GET", &format!("/v1/campaigns/{id}"), None, 200),
            def
        );
    }

    let screen = |rid: &str| {
        json!({"user": "u1", "candidates": [{"campaign": "c1", "cost": 5}, {"campaign": "c2"}],
            "reserve": true, "reservation_id": rid})
    };
    let both_eligible = |rid: &str| {
        json!({"reservation": rid, "results": [
            {"campaign": "c1", "eligible": true}, {"campaign": "c2", "eligible": true}]})
    };

    // Auction 1: both eligible and held.
    let a1 = s.expect("POST", "/v1/screen", Some(&screen("auction-1")), 200);
    assert_eq!(a1, both_eligible("auction-1"));
    // Repeating the reserve with a live id and the same body: the same answer,
    // nothing held twice; a different body under that id: 409.
    assert_eq!(
        s.expect("POST", "/v1/screen", Some(&screen("auction-1")), 200),
        a1
    );
    let other = json!({"user": "u2", "candidates": [{"campaign": "c1"}],
        "reservation_id": "auction-1"});
    let e = s.expect("POST", "/v1/screen", Some(&other), 409);
    assert_eq!(e["error"]["code"], "conflict");

    let u1c1 = || usage_sans_reset(s.expect("GET", "/v1/users/u1/campaigns/c1", None, 200));
    let u1c2 = || usage_sans_reset(s.expect("GET", "/v1/users/u1/campaigns/c2", None, 200));
    let usage = |c: &str, caps: Vec<Value>| json!({"user": "u1", "campaign": c, "caps": caps});
    // Pending counts like a debit, separately from used; the parent's shared cap
    // holds one for each candidate.
    assert_eq!(
        u1c1(),
        usage(
            "c1",
            vec![
                cap_json("c1", "user_daily", "user", "window", 2, 0, 1),
                cap_json("adv", "adv_daily", "campaign", "window", 100, 0, 2),
            ]
        )
    );
    assert_eq!(
        u1c2(),
        usage(
            "c2",
            vec![
                cap_json("c2", "user_gap", "user", "gap", 1, 0, 1),
                cap_json("adv", "adv_daily", "campaign", "window", 100, 0, 2),
            ]
        )
    );
    let d = s.expect("GET", "/v1/campaigns/c1/delivery", None, 200);
    assert_eq!(
        (&d["spent"], &d["pending"], &d["amount"], &d["cap_now"]),
        (&json!(0), &json!(5), &json!(1000), &json!(1000)),
        "{d}"
    );

    // c1 wins: committed, c2's hold released.
    let commit = json!({"campaign": "c1"});
    let committed = json!({"reservation": "auction-1", "outcome": "committed",
        "campaigns": ["c1"]});
    let path = "/v1/reservations/auction-1/commit";
    assert_eq!(s.expect("POST", path, Some(&commit), 200), committed);
    assert_eq!(
        u1c1(),
        usage(
            "c1",
            vec![
                cap_json("c1", "user_daily", "user", "window", 2, 1, 0),
                cap_json("adv", "adv_daily", "campaign", "window", 100, 1, 0),
            ]
        )
    );
    assert_eq!(
        u1c2(),
        usage(
            "c2",
            vec![
                cap_json("c2", "user_gap", "user", "gap", 1, 0, 0),
                cap_json("adv", "adv_daily", "campaign", "window", 100, 1, 0),
            ]
        )
    );
    // Committing again is a no-op reporting the first outcome; releasing is 409.
    assert_eq!(s.expect("POST", path, Some(&commit), 200), committed);
    let e = s.expect("POST", "/v1/reservations/auction-1/release", None, 409);
    assert_eq!(e["error"]["code"], "conflict");
    assert_eq!(
        u1c1()["caps"][0]["used"],
        1,
        "a repeated commit counts once"
    );

    // Delivery: the budget's day, spent at the reserved cost.
    let d = s.expect("GET", "/v1/campaigns/c1/delivery", None, 200);
    let keys: Vec<&str> = d
        .as_object()
        .expect("object")
        .keys()
        .map(|k| k.as_str())
        .collect();
    let mut want = vec![
        "amount",
        "campaign",
        "cap_now",
        "pacing",
        "pending",
        "period_end",
        "period_start",
        "spent",
    ];
    want.sort_unstable();
    let mut got = keys.clone();
    got.sort_unstable();
    assert_eq!(got, want, "{d}");
    assert_eq!(
        (
            &d["campaign"],
            &d["amount"],
            &d["spent"],
            &d["pending"],
            &d["cap_now"],
            &d["pacing"]
        ),
        (
            &json!("c1"),
            &json!(1000),
            &json!(5),
            &json!(0),
            &json!(1000),
            &json!("asap")
        ),
        "{d}"
    );
    assert_today(&d);
    // A campaign without a budget has no delivery.
    let e = s.expect("GET", "/v1/campaigns/c2/delivery", None, 404);
    assert_eq!(e["error"]["code"], "not_found");

    // Screen and commit c1 until its per-user cap denies (at most 5 rounds).
    let mut wins = 1;
    let mut denial = None;
    for round in 2..=6 {
        let rid = format!("auction-{round}");
        let a = s.expect("POST", "/v1/screen", Some(&screen(&rid)), 200);
        // c2 is eligible every time: each earlier hold of it was released.
        assert_eq!(
            a["results"][1],
            json!({"campaign": "c2", "eligible": true}),
            "{a}"
        );
        if a["results"][0]["eligible"] == json!(true) {
            assert_eq!(a, both_eligible(&rid));
            let p = format!("/v1/reservations/{rid}/commit");
            let ok = s.expect("POST", &p, Some(&commit), 200);
            assert_eq!(ok["outcome"], "committed", "{ok}");
            wins += 1;
        } else {
            denial = Some((rid, a));
            break;
        }
    }
    assert_eq!(wins, 2, "the per-user cap of 2 a day admits exactly 2");
    let (rid, a) = denial.expect("the third screen is denied by the cap");
    let retry = a["results"][0]["denied_by"]["retry_after_ms"]
        .as_u64()
        .expect("retry_after_ms: until the day ends");
    assert!(retry > 0 && retry <= 86_400_000, "{a}");
    assert_eq!(
        a,
        json!({"reservation": rid, "results": [
            {"campaign": "c1", "eligible": false,
             "denied_by": {"campaign": "c1", "cap": "user_daily", "retry_after_ms": retry}},
            {"campaign": "c2", "eligible": true}]})
    );
    // Release the remaining hold: reported with the campaigns it held.
    let released = s.expect(
        "POST",
        &format!("/v1/reservations/{rid}/release"),
        None,
        200,
    );
    assert_eq!(
        released,
        json!({"reservation": rid, "outcome": "released", "campaigns": ["c2"]})
    );
    assert_eq!(
        u1c1(),
        usage(
            "c1",
            vec![
                cap_json("c1", "user_daily", "user", "window", 2, 2, 0),
                cap_json("adv", "adv_daily", "campaign", "window", 100, 2, 0),
            ]
        )
    );
    assert_eq!(
        u1c2()["caps"][0],
        cap_json("c2", "user_gap", "user", "gap", 1, 0, 0)
    );

    // A screen where nothing is eligible reserves nothing; its id is unknown.
    let only_c1 = json!({"user": "u1", "candidates": [{"campaign": "c1"}, {"campaign": "nope"}],
        "reservation_id": "auction-none"});
    let a = s.expect("POST", "/v1/screen", Some(&only_c1), 200);
    assert_eq!(a["reservation"], Value::Null, "{a}");
    assert_eq!(a["results"][0]["denied_by"]["cap"], "user_daily", "{a}");
    assert_eq!(
        a["results"][1],
        json!({"campaign": "nope", "eligible": false,
            "denied_by": {"campaign": "nope", "cap": "unknown_campaign", "retry_after_ms": null}})
    );
    let e = s.expect("POST", "/v1/reservations/auction-none/commit", None, 404);
    assert_eq!(e["error"]["code"], "not_found");

    // Another user is not capped by u1's impressions; the shared cap counts all.
    let u2 = s.expect("GET", "/v1/users/u2/campaigns/c1", None, 200);
    assert_eq!(
        usage_sans_reset(u2),
        json!({"user": "u2", "campaign": "c1", "caps": [
            cap_json("c1", "user_daily", "user", "window", 2, 0, 0),
            cap_json("adv", "adv_daily", "campaign", "window", 100, 2, 0)]})
    );
    let d = s.expect("GET", "/v1/campaigns/c1/delivery", None, 200);
    assert_eq!((&d["spent"], &d["pending"]), (&json!(10), &json!(0)), "{d}");

    // A dry run decides and holds nothing.
    let dry = json!({"user": "u3", "candidates": [{"campaign": "c1"}], "reserve": false,
        "reservation_id": "dry-1"});
    assert_eq!(
        s.expect("POST", "/v1/screen", Some(&dry), 200),
        json!({"reservation": null, "results": [{"campaign": "c1", "eligible": true}]})
    );
    let u3 = || usage_sans_reset(s.expect("GET", "/v1/users/u3/campaigns/c1", None, 200));
    assert_eq!(
        u3()["caps"][0],
        cap_json("c1", "user_daily", "user", "window", 2, 0, 0)
    );
    // A reservation past its deadline is gone: a bare commit is 404; one with
    // user, campaign and cost is a late commit, counted once however often it
    // is repeated (committing twice reports the first outcome).
    let short = json!({"user": "u3", "candidates": [{"campaign": "c1", "cost": 4}],
        "ttl_ms": 1, "reservation_id": "expiring"});
    let a = s.expect("POST", "/v1/screen", Some(&short), 200);
    assert_eq!(a["reservation"], "expiring", "{a}");
    // Not an assertion on time: only makes sure the 1 ms deadline has passed.
    std::thread::sleep(Duration::from_millis(20));
    let path = "/v1/reservations/expiring/commit";
    let e = s.expect("POST", path, Some(&json!({"campaign": "c1"})), 404);
    assert_eq!(e["error"]["code"], "not_found");
    let late = json!({"campaign": "c1", "user": "u3", "cost": 6});
    for _ in 0..2 {
        assert_eq!(
            s.expect("POST", path, Some(&late), 200),
            json!({"reservation": "expiring", "outcome": "late_commit", "campaigns": ["c1"]})
        );
    }
    assert_eq!(
        u3(),
        json!({"user": "u3", "campaign": "c1", "caps": [
            cap_json("c1", "user_daily", "user", "window", 2, 1, 0),
            cap_json("adv", "adv_daily", "campaign", "window", 100, 3, 0)]})
    );
    let d = s.expect("GET", "/v1/campaigns/c1/delivery", None, 200);
    assert_eq!((&d["spent"], &d["pending"]), (&json!(16), &json!(0)), "{d}");
}

/// docs/semantics.md §8.5: every error is `{"error": {"code", "message"}}`, also when a path
/// segment cannot be read at all.
#[test]
fn undecodable_path_segments_answer_in_the_error_shape() {
    let dir = tempfile::tempdir().expect("temp dir");
    let s = Server::start(dir.path(), &[]);
    s.expect("PUT", "/v1/campaigns/c", Some(&json!({})), 200);
    let mut failures = Vec::new();
    for (method, path, body) in [
        ("GET", "/v1/users/%FF/campaigns/c", None),
        ("GET", "/v1/campaigns/%FF", None),
        ("GET", "/v1/campaigns/%FF/delivery", None),
        ("GET", "/v1/policies/%FF", None),
        ("PUT", "/v1/campaigns/%FF", Some("{}")),
        ("POST", "/v1/reservations/%FF/commit", Some("")),
    ] {
        let r = s.request(method, path, Auth::Right, body);
        let b: Value = serde_json::from_str(&r.text).unwrap_or(Value::Null);
        if r.status != 400 || b["error"]["code"] != "invalid_argument" {
            failures.push(format!("{method} {path} → {} {:?}", r.status, r.text));
        }
    }
    assert!(
        failures.is_empty(),
        "not in the error shape:\n{}",
        failures.join("\n")
    );
}

/// `--log-format json`: every line the server writes is one JSON object,
/// the start-up line among them with its address.
#[test]
fn json_logs() {
    let s = support::Stopped(support::serve(
        [
            "--memory",
            "--listen",
            "127.0.0.1:0",
            "--log-format",
            "json",
        ],
        false,
    ));
    let log = support::log_text(&s.log);
    let mut listening = false;
    for line in log.lines() {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(
            v["level"].is_string() && v["timestamp"].is_string(),
            "{line}"
        );
        let msg = v["fields"]["message"].as_str().unwrap_or_default();
        listening |= msg.starts_with("freqcap listening on 127.0.0.1:");
    }
    assert!(listening, "{log}");
}

/// Every request has an id: the caller's `x-request-id`, or one made up;
/// the answer says it, and the request's log lines carry it, as text and as
/// JSON.
#[test]
fn request_ids_in_answers_and_logs() {
    for format in ["text", "json"] {
        let s = support::Stopped(support::serve_env(
            [
                "--memory",
                "--listen",
                "127.0.0.1:0",
                "--log-format",
                format,
            ],
            &[("FREQCAP_LOG", "info,freqcap::api=debug")],
            false,
        ));
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let url = format!("http://{}/v1/policies/nope", s.addr);
        let r = agent
            .get(&url)
            .header("x-request-id", "trace-4f2a")
            .call()
            .unwrap();
        assert_eq!(r.status().as_u16(), 404);
        assert_eq!(r.headers()["x-request-id"], "trace-4f2a");
        // Not one a log line could carry as it is: a new one.
        let r = agent
            .get(&url)
            .header("x-request-id", "has space")
            .call()
            .unwrap();
        let made = r.headers()["x-request-id"].to_str().unwrap().to_owned();
        assert!(!made.is_empty() && made != "has space", "{made}");
        let mut found = (false, false);
        for _ in 0..100 {
            let log = support::log_text(&s.log);
            found = (log.contains("trace-4f2a"), log.contains(&made));
            if found == (true, true) {
                if format == "json" {
                    let line = log.lines().find(|l| l.contains("trace-4f2a")).unwrap();
                    let v: Value = serde_json::from_str(line).unwrap();
                    assert_eq!(v["fields"]["request_id"], "trace-4f2a", "{line}");
                    assert_eq!(v["fields"]["status"], 404, "{line}");
                } else {
                    assert!(log.contains("request_id=trace-4f2a"), "{log}");
                }
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(found, (true, true), "{format}");
    }
}

/// HTTP/2 with prior knowledge (h2c) on the HTTP port, beside HTTP/1.1:
/// curl's own HTTP/2 stack against the same routes, answers and headers.
#[test]
fn http2_prior_knowledge_beside_http1() {
    let dir = tempfile::tempdir().expect("temp dir");
    let s = Server::start(dir.path(), &[]);
    s.expect(
        "PUT",
        "/v1/policies/h2",
        Some(&json!({"limits": [{"kind": "rate", "rate": 1, "per": "1m", "name": "per-minute"}]})),
        200,
    );
    let curl = |version: &str| {
        let out = std::process::Command::new("curl")
            .args([
                "-sS",
                "-i",
                version,
                "-H",
                "content-type: application/json",
                "-d",
                r#"{"policy": "h2", "key": "k"}"#,
                &format!("{}/v1/check", s.base),
            ])
            .output()
            .expect("curl runs");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).expect("utf-8")
    };
    let h2 = curl("--http2-prior-knowledge");
    assert!(h2.starts_with("HTTP/2 200"), "{h2}");
    assert!(h2.contains("ratelimit: \"per-minute\";r=0;t=60"), "{h2}");
    assert!(h2.contains(r#""allowed":true"#), "{h2}");
    // The same key over HTTP/1.1 sees the HTTP/2 request's debit.
    let h1 = curl("--http1.1");
    assert!(h1.starts_with("HTTP/1.1 429"), "{h1}");
    assert!(h1.contains("retry-after: 60"), "{h1}");
}

// ---- 2. the API flow ----

/// The RateLimit fields of a decision must agree with its body.
fn assert_headers_match(r: &Resp, name: &str) {
    let b = r.json();
    let remaining = b["remaining"].as_u64().expect("remaining");
    let reset_ms = b["reset_after_ms"].as_u64().expect("reset_after_ms");
    assert_eq!(
        r.header("ratelimit").as_deref(),
        Some(format!("\"{name}\";r={remaining};t={}", reset_ms.div_ceil(1000)).as_str()),
        "{b}"
    );
    match (r.status, b["retry_after_ms"].as_u64()) {
        (429, Some(ms)) => assert_eq!(
            r.header("retry-after"),
            Some(ms.div_ceil(1000).to_string()),
            "{b}"
        ),
        (429, None) => assert_eq!(r.header("retry-after"), None, "{b}"),
        _ => assert_eq!(
            r.header("retry-after"),
            None,
            "no Retry-After on {}",
            r.status
        ),
    }
}

#[test]
fn api_flow_rate_headers_and_delay() {
    let dir = tempfile::tempdir().expect("temp dir");
    let s = Server::start(dir.path(), &[]);

    // Two a minute: no refill can happen between these requests in practice
    // (one unit takes 30 s).
    let p = json!({"limits": [{"name": "per_sec", "kind": "rate", "rate": 2, "per": "1m"}]});
    assert_eq!(s.expect("PUT", "/v1/policies/p", Some(&p), 200), p);
    assert_eq!(s.expect("GET", "/v1/policies/p", None, 200), p);

    let check = json!({"policy": "p", "key": "client-1"});
    let policy_field = "\"per_sec\";q=2;w=60";

    let r1 = s.post("/v1/check", &check);
    assert_eq!(r1.status, 200, "{}", r1.text);
    // The first debit on an idle key: exactly one emission interval (30 s) to
    // be full again, one unit left.
    assert_eq!(
        r1.json(),
        json!({"allowed": true, "delay_ms": 0, "retry_after_ms": null, "remaining": 1,
            "reset_after_ms": 30_000, "reservation": null,
            "limits": [{"name": "per_sec", "kind": "rate", "limit": 2, "remaining": 1,
                "reset_after_ms": 30_000, "retry_after_ms": null, "allowed": true}]})
    );
    assert_eq!(r1.header("ratelimit-policy").as_deref(), Some(policy_field));
    assert_eq!(
        r1.header("ratelimit").as_deref(),
        Some("\"per_sec\";r=1;t=30")
    );
    assert_headers_match(&r1, "per_sec");

    let r2 = s.post("/v1/check", &check);
    assert_eq!(r2.status, 200, "{}", r2.text);
    let b2 = r2.json();
    assert_eq!(
        (&b2["allowed"], &b2["remaining"]),
        (&json!(true), &json!(0)),
        "{b2}"
    );
    assert_eq!(r2.header("ratelimit-policy").as_deref(), Some(policy_field));
    assert_headers_match(&r2, "per_sec");

    let r3 = s.post("/v1/check", &check);
    assert_eq!(r3.status, 429, "{}", r3.text);
    let b3 = r3.json();
    let retry = b3["retry_after_ms"].as_u64().expect("a denial says when");
    assert!(retry > 0 && retry <= 30_000, "{b3}");
    let reset = b3["reset_after_ms"].as_u64().expect("reset_after_ms");
    assert_eq!(
        b3,
        json!({"allowed": false, "delay_ms": 0, "retry_after_ms": retry, "remaining": 0,
            "reset_after_ms": reset, "reservation": null,
            "limits": [{"name": "per_sec", "kind": "rate", "limit": 2, "remaining": 0,
                "reset_after_ms": reset, "retry_after_ms": retry, "allowed": false}]})
    );
    assert_eq!(r3.header("ratelimit-policy").as_deref(), Some(policy_field));
    assert!(
        r3.header("retry-after").is_some(),
        "429 carries Retry-After"
    );
    assert_headers_match(&r3, "per_sec");
    // A denied request debits nothing: a peek still shows 0 left, not less, and
    // another key is untouched.
    let peek = s.post(
        "/v1/check",
        &json!({"policy": "p", "key": "client-1", "cost": 0}),
    );
    assert_eq!(peek.status, 200, "a peek is always allowed: {}", peek.text);
    assert_eq!(peek.json()["remaining"], 0);
    let other = s.post("/v1/check", &json!({"policy": "p", "key": "client-2"}));
    assert_eq!(
        (other.status, other.json()["remaining"].clone()),
        (200, json!(1))
    );

    // Delay mode: a gap of a minute, waits of up to ten minutes accepted.
    let d = json!({"limits": [{"name": "spacing", "kind": "gap", "min": "1m"}],
        "on_limit": "delay", "max_delay_ms": 600_000});
    assert_eq!(s.expect("PUT", "/v1/policies/d", Some(&d), 200), d);
    let dcheck = json!({"policy": "d", "key": "shaped"});
    let first = s.post("/v1/check", &dcheck);
    assert_eq!(first.status, 200, "{}", first.text);
    assert_eq!(first.json()["delay_ms"], 0);
    assert_eq!(
        first.header("ratelimit-policy").as_deref(),
        Some("\"spacing\";q=1;w=60")
    );
    let second = s.post("/v1/check", &dcheck);
    assert_eq!(
        second.status, 200,
        "a wait within max_delay_ms is allowed: {}",
        second.text
    );
    let b = second.json();
    let delay = b["delay_ms"].as_u64().expect("delay_ms");
    assert!(delay > 0 && delay <= 60_000, "{b}");
    assert_eq!(
        (&b["allowed"], &b["retry_after_ms"], &b["reservation"]),
        (&json!(true), &Value::Null, &Value::Null),
        "{b}"
    );
    assert_eq!(b["limits"][0]["kind"], "gap", "{b}");
    assert_eq!(second.header("retry-after"), None);
    // The next one queues behind the delayed one: a later slot.
    let third = s.post("/v1/check", &dcheck);
    assert_eq!(third.status, 200, "{}", third.text);
    let delay3 = third.json()["delay_ms"].as_u64().expect("delay_ms");
    assert!(
        delay3 > delay && delay3 <= 120_000,
        "{delay3} after {delay}"
    );

    // A wait over max_delay_ms is a plain denial, with delay_ms 0.
    let short = json!({"limits": [{"name": "slow", "kind": "rate", "rate": 1, "per": "1h"}],
        "on_limit": "delay", "max_delay_ms": 1000});
    s.expect("PUT", "/v1/policies/short", Some(&short), 200);
    let sc = json!({"policy": "short", "key": "k"});
    assert_eq!(s.post("/v1/check", &sc).status, 200);
    let denied = s.post("/v1/check", &sc);
    assert_eq!(denied.status, 429, "{}", denied.text);
    let b = denied.json();
    assert_eq!(
        (&b["allowed"], &b["delay_ms"]),
        (&json!(false), &json!(0)),
        "{b}"
    );
    assert_headers_match(&denied, "slow");
    assert_eq!(
        denied.header("ratelimit-policy").as_deref(),
        Some("\"slow\";q=1;w=3600")
    );
}

// ---- 3. restart keeps state ----

#[test]
fn sigterm_restart_keeps_definitions_and_counts() {
    clear_of_midnight();
    let dir = tempfile::tempdir().expect("temp dir");
    let camp = json!({
        "caps": [
            {"name": "per_user", "kind": "window", "limit": 5, "window": "1d"},
            {"name": "total", "scope": "campaign", "kind": "window", "limit": 1000, "window": "1d"}],
        "budget": {"kind": "budget", "amount": 500, "pacing": "asap"}});
    let policy = json!({"limits": [{"name": "hourly", "kind": "rate", "rate": 3, "per": "1h"}]});
    let check = json!({"policy": "rp", "key": "rk"});
    let expected_usage = json!({"user": "ru", "campaign": "r", "caps": [
        cap_json("r", "per_user", "user", "window", 5, 4, 0),
        cap_json("r", "total", "campaign", "window", 1000, 4, 0)]});

    {
        let s = Server::start(dir.path(), &[]);
        s.expect("PUT", "/v1/campaigns/r", Some(&camp), 200);
        s.expect("PUT", "/v1/policies/rp", Some(&policy), 200);
        for i in 0..3 {
            let rid = format!("rs-{i}");
            let sc = json!({"user": "ru", "candidates": [{"campaign": "r", "cost": 10}],
                "reservation_id": rid});
            let a = s.expect("POST", "/v1/screen", Some(&sc), 200);
            assert_eq!(a["results"][0]["eligible"], true, "{a}");
            let c = s.expect(
                "POST",
                &format!("/v1/reservations/{rid}/commit"),
                Some(&json!({"campaign": "r"})),
                200,
            );
            assert_eq!(c["outcome"], "committed", "{c}");
        }
        let ev = json!({"user": "ru", "campaign": "r", "cost": 7, "event_id": "ev-1"});
        assert_eq!(
            s.expect("POST", "/v1/events", Some(&ev), 200),
            json!({"counted": 1, "duplicates": 0})
        );
        // A reservation left open: memory only, gone after the restart.
        let open = json!({"user": "ru", "candidates": [{"campaign": "r", "cost": 100}],
            "reservation_id": "left-open"});
        s.expect("POST", "/v1/screen", Some(&open), 200);
        // Two immediate checks (written behind; the shutdown flushes them).
        for _ in 0..2 {
            assert_eq!(s.post("/v1/check", &check).status, 200);
        }
        let mut with_pending = expected_usage.clone();
        with_pending["caps"][0] = cap_json("r", "per_user", "user", "window", 5, 4, 1);
        with_pending["caps"][1] = cap_json("r", "total", "campaign", "window", 1000, 4, 1);
        assert_eq!(
            usage_sans_reset(s.expect("GET", "/v1/users/ru/campaigns/r", None, 200)),
            with_pending
        );

        let status = s.terminate();
        assert!(status.success(), "SIGTERM: a clean exit, got {status}");
    }

    let s = Server::start(dir.path(), &[]);
    assert_eq!(s.expect("GET", "/v1/campaigns/r", None, 200), camp);
    assert_eq!(s.expect("GET", "/v1/policies/rp", None, 200), policy);
    assert_eq!(
        usage_sans_reset(s.expect("GET", "/v1/users/ru/campaigns/r", None, 200)),
        expected_usage,
        "3 commits and 1 event survive; the open reservation does not"
    );
    let d = s.expect("GET", "/v1/campaigns/r/delivery", None, 200);
    assert_eq!((&d["spent"], &d["pending"]), (&json!(37), &json!(0)), "{d}");
    assert_today(&d);
    // The open reservation is forgotten.
    let e = s.expect("POST", "/v1/reservations/left-open/commit", None, 404);
    assert_eq!(e["error"]["code"], "not_found");
    // The event id is remembered.
    let ev = json!({"user": "ru", "campaign": "r", "cost": 7, "event_id": "ev-1"});
    assert_eq!(
        s.expect("POST", "/v1/events", Some(&ev), 200),
        json!({"counted": 0, "duplicates": 1})
    );
    // The policy key's two debits are still there: one left, then none.
    let r = s.post("/v1/check", &check);
    assert_eq!(
        (r.status, r.json()["remaining"].clone()),
        (200, json!(0)),
        "{}",
        r.text
    );
    assert_eq!(s.post("/v1/check", &check).status, 429);
    assert!(s.terminate().success());
}

// ---- 4. SIGKILL loses no acknowledged commit or event ----

/// A client holding a half-sent request cannot hold the process: SIGTERM
/// drains for the drain timeout, closes what is left, flushes and exits 0,
/// with the write-behind checks on disk.
#[test]
fn sigterm_exits_within_the_drain_deadline_despite_a_half_sent_request() {
    use std::io::Write;
    let dir = tempfile::tempdir().expect("temp dir");
    let s = Server::start(
        dir.path(),
        &["--drain-timeout-secs", "2", "--body-timeout-secs", "600"],
    );
    let policy =
        json!({"limits": [{"kind": "window", "limit": 10, "window": "1h", "align": "fixed"}]});
    s.expect("PUT", "/v1/policies/p", Some(&policy), 200);
    s.expect(
        "POST",
        "/v1/check",
        Some(&json!({"policy": "p", "key": "k"})),
        200,
    );
    let addr = s.base.trim_start_matches("http://").to_owned();
    let mut c = std::net::TcpStream::connect(&addr).expect("connect");
    c.write_all(
        b"POST /v1/check HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
    )
    .expect("write");
    // The half-sent request is being read (its body has 600 s to arrive).
    std::thread::sleep(Duration::from_millis(300));
    let status = s.terminate();
    assert!(status.success(), "exit status {status}");
    drop(c);
    // The check before the signal was flushed.
    let s = Server::start(dir.path(), &[]);
    let a = s.expect(
        "POST",
        "/v1/check",
        Some(&json!({"policy": "p", "key": "k", "cost": 0})),
        200,
    );
    assert_eq!(a["remaining"], 9, "{a}");
}

/// Settings that could never work are refused at start, naming the option.
#[test]
fn empty_tokens_are_refused_at_start() {
    for (var, name) in [
        ("FREQCAP_DECISION_TOKEN", "decision_token"),
        ("FREQCAP_ADMIN_TOKEN", "admin_token"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_freqcap"))
            .args(["serve", "--listen", "127.0.0.1:0", "--memory"])
            .env(var, "")
            .stdin(Stdio::null())
            .output()
            .expect("runs");
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&format!("{name}: must not be empty")), "{err}");
    }
}

#[test]
fn sigkill_loses_no_acknowledged_commit() {
    clear_of_midnight();
    let dir = tempfile::tempdir().expect("temp dir");
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(7)
        ^ std::process::id();
    // Campaign-scope counters only: the rolling day does not end at midnight.
    let camp = json!({
        "caps": [{"name": "total", "scope": "campaign", "kind": "window", "limit": 4096,
            "window": "1d"}],
        "budget": {"kind": "budget", "amount": 1_000_000, "pacing": "asap"}});
    // Events are acknowledged the same way (their WAL group awaited on the
    // executor); they count on a campaign of their own.
    let events_camp = json!({
        "caps": [{"name": "total", "scope": "campaign", "kind": "window", "limit": 4096,
            "window": "1d"}]});
    /// Screens per round at most (so the cap of 4096 never denies).
    const MAX_PER_ROUND: u64 = 1500;
    let mut counted = 0u64;
    let mut counted_events = 0u64;
    for round in 0..2u32 {
        let s = Server::start(dir.path(), &[]);
        if round == 0 {
            s.expect("PUT", "/v1/campaigns/k", Some(&camp), 200);
            s.expect("PUT", "/v1/campaigns/ev", Some(&events_camp), 200);
        }
        let kill_after = 5 + u64::from(seed.rotate_left(round * 7) % 120);
        let acked = Arc::new(AtomicU64::new(0));
        let acked_events = Arc::new(AtomicU64::new(0));
        let killed = Arc::new(AtomicBool::new(false));
        let client = {
            let (agent, base) = (s.agent.clone(), s.base.clone());
            let (acked, acked_events, killed) =
                (acked.clone(), acked_events.clone(), killed.clone());
            std::thread::spawn(move || {
                // Runs until the server is gone. Once `killed` is set, an
                // answer that is not the expected one ends the loop instead of
                // failing: the port may already belong to another test's server.
                for i in 0..MAX_PER_ROUND {
                    let rid = format!("k{round}-{i}");
                    let sc = json!({"user": format!("u{round}-{i}"),
                        "candidates": [{"campaign": "k", "cost": 3}], "reservation_id": rid});
                    let post = |path: &str, body: &Value| {
                        let b = body.to_string();
                        Server::try_request(&agent, &base, "POST", path, None, Some(&b))
                    };
                    let Ok(r) = post("/v1/screen", &sc) else {
                        break;
                    };
                    let eligible = r.status == 200 && r.json()["results"][0]["eligible"] == true;
                    if !eligible && killed.load(Ordering::SeqCst) {
                        break;
                    }
                    assert!(eligible, "screen: {} {}", r.status, r.text);
                    let path = format!("/v1/reservations/{rid}/commit");
                    let Ok(r) = post(&path, &json!({"campaign": "k"})) else {
                        break;
                    };
                    let ok = r.status == 200 && r.json()["outcome"] == "committed";
                    if !ok && killed.load(Ordering::SeqCst) {
                        break;
                    }
                    assert!(ok, "commit: {} {}", r.status, r.text);
                    acked.fetch_add(1, Ordering::SeqCst);
                    let ev = json!({"user": format!("u{round}-{i}"), "campaign": "ev",
                        "event_id": format!("e{round}-{i}")});
                    let Ok(r) = post("/v1/events", &ev) else {
                        break;
                    };
                    let ok = r.status == 200 && r.json()["counted"] == 1;
                    if !ok && killed.load(Ordering::SeqCst) {
                        break;
                    }
                    assert!(ok, "event: {} {}", r.status, r.text);
                    acked_events.fetch_add(1, Ordering::SeqCst);
                }
            })
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while acked.load(Ordering::SeqCst) < kill_after && !client.is_finished() {
            assert!(
                Instant::now() < deadline,
                "only {} commits acknowledged in 30 s",
                acked.load(Ordering::SeqCst)
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        killed.store(true, Ordering::SeqCst);
        s.kill9();
        client
            .join()
            .expect("the client thread saw only valid answers");
        let n = acked.load(Ordering::SeqCst);
        assert!(n >= kill_after, "round {round}: {n} acknowledged");

        let s = Server::start(dir.path(), &[]);
        let u = s.expect("GET", "/v1/users/anyone/campaigns/k", None, 200);
        let used = u["caps"][0]["used"].as_u64().expect("used");
        let d = s.expect("GET", "/v1/campaigns/k/delivery", None, 200);
        let spent = d["spent"].as_u64().expect("spent");
        eprintln!("round {round}: killed after {n} acknowledged commits; used {used}");
        // Every acknowledged commit is there; at most the one in flight more.
        assert!(
            used >= counted + n && used <= counted + n + 1,
            "round {round}: {n} acknowledged after {counted} earlier, {used} counted: {u}"
        );
        assert_eq!(spent, used * 3, "the budget counts the same commits: {d}");
        assert_eq!(
            (&u["caps"][0]["pending"], &d["pending"]),
            (&json!(0), &json!(0))
        );
        counted = used;
        let n = acked_events.load(Ordering::SeqCst);
        let u = s.expect("GET", "/v1/users/anyone/campaigns/ev", None, 200);
        let used = u["caps"][0]["used"].as_u64().expect("used");
        eprintln!("round {round}: {n} acknowledged events; used {used}");
        assert!(
            used >= counted_events + n && used <= counted_events + n + 1,
            "round {round}: {n} events acknowledged after {counted_events}, {used} counted: {u}"
        );
        counted_events = used;
        drop(s);
    }
}

// ---- 5. bad input ----

/// One bad request and what it must answer.
struct Case {
    what: &'static str,
    method: &'static str,
    path: String,
    auth: Auth,
    body: Option<String>,
    status: u16,
    code: &'static str,
    /// Text the message must contain: the offending field (or value).
    names: Option<&'static str>,
}

fn case(
    what: &'static str,
    method: &'static str,
    path: &str,
    body: &str,
    status: u16,
    code: &'static str,
    names: Option<&'static str>,
) -> Case {
    Case {
        what,
        method,
        path: path.to_owned(),
        auth: Auth::Right,
        body: (!body.is_empty() || method == "POST" || method == "PUT").then(|| body.to_owned()),
        status,
        code,
        names,
    }
}

fn unauth(what: &'static str, method: &'static str, path: &str, auth: Auth, body: &str) -> Case {
    Case {
        auth,
        ..case(what, method, path, body, 401, "unauthenticated", None)
    }
}

/// Everything a bad request could wrongly change, read back.
fn snapshot(s: &Server) -> Value {
    let peek = s.post("/v1/check", &json!({"policy": "p", "key": "k", "cost": 0}));
    assert_eq!(peek.status, 200, "{}", peek.text);
    json!({
        "policy": s.expect("GET", "/v1/policies/p", None, 200),
        "base": s.expect("GET", "/v1/campaigns/base", None, 200),
        "child": s.expect("GET", "/v1/campaigns/child", None, 200),
        "orphan": s.expect("GET", "/v1/campaigns/orphan", None, 404)["error"]["code"],
        "usage": usage_sans_reset(s.expect("GET", "/v1/users/u1/campaigns/child", None, 200)),
        "delivery": s.expect("GET", "/v1/campaigns/base/delivery", None, 200),
        "peek": peek.json(),
    })
}

#[test]
fn bad_input_is_rejected_and_changes_nothing() {
    clear_of_midnight();
    let dir = tempfile::tempdir().expect("temp dir");
    let s = Server::start(
        dir.path(),
        &[
            "--max-body",
            "1024",
            "--max-candidates",
            "5",
            "--decision-token",
            DECISION_TOKEN,
            "--admin-token",
            ADMIN_TOKEN,
        ],
    );
    s.expect(
        "PUT",
        "/v1/policies/p",
        Some(&json!({"limits": [{"name": "r", "kind": "rate", "rate": 5, "per": "1h"}]})),
        200,
    );
    let base = json!({"tz": "UTC",
        "caps": [{"name": "daily", "kind": "window", "limit": 10, "window": "1d",
            "align": "calendar"}],
        "budget": {"kind": "budget", "amount": 100, "pacing": "asap"}});
    s.expect("PUT", "/v1/campaigns/base", Some(&base), 200);
    s.expect(
        "PUT",
        "/v1/campaigns/child",
        Some(&json!({"parent": "base", "caps": [{"name": "g", "kind": "gap", "min": "1h"}]})),
        200,
    );
    let ev = json!({"user": "u1", "campaign": "child", "cost": 3, "event_id": "seed"});
    s.expect("POST", "/v1/events", Some(&ev), 200);
    let before = snapshot(&s);
    assert_eq!(before["usage"]["caps"][1]["used"], 1, "{before}");
    assert_eq!(before["delivery"]["spent"], 3, "{before}");

    let mut failures = Vec::new();
    for c in bad_cases() {
        let r = s.request(c.method, &c.path, c.auth, c.body.as_deref());
        let b: Value = serde_json::from_str(&r.text).unwrap_or(Value::Null);
        let code = b["error"]["code"].as_str();
        let message = b["error"]["message"].as_str().unwrap_or("");
        let named = c.names.is_none_or(|f| message.contains(f));
        // docs/service.md: a refused request says which scheme it wants.
        let challenged = c.status != 401
            || r.header("www-authenticate")
                .is_some_and(|v| v.starts_with("Bearer"));
        if r.status != c.status || code != Some(c.code) || message.is_empty() || !named {
            failures.push(format!(
                "{}: {} {} → {} {}, want {} {} naming {:?}",
                c.what,
                c.method,
                &c.path[..c.path.len().min(60)],
                r.status,
                r.text,
                c.status,
                c.code,
                c.names
            ));
        } else if !challenged {
            failures.push(format!("{}: 401 without WWW-Authenticate: Bearer", c.what));
        }
    }
    assert!(failures.is_empty(), "bad answers:\n{}", failures.join("\n"));

    // Nothing changed.
    assert_eq!(snapshot(&s), before);
    // The rejected batches claimed no event ids.
    let ok = json!({"user": "u1", "campaign": "child", "cost": 2, "event_id": "e-ok"});
    assert_eq!(
        s.expect("POST", "/v1/events", Some(&ok), 200),
        json!({"counted": 1, "duplicates": 0})
    );
    // docs/service.md: the admin token is accepted wherever the decision token
    // is, and the scheme name is case-insensitive.
    let check = r#"{"policy":"p","key":"k2"}"#;
    let admin = s.request("POST", "/v1/check", Auth::Bearer(ADMIN_TOKEN), Some(check));
    assert_eq!(admin.status, 200, "{}", admin.text);
    let lower = s.request("POST", "/v1/check", Auth::Raw("bearer t1"), Some(check));
    assert_eq!(lower.status, 200, "{}", lower.text);
    // Health needs no token; the server is alive and logged no panic.
    assert_eq!(
        s.request("GET", "/healthz", Auth::Missing, None).status,
        200
    );
    let log = s.log_text();
    assert!(!log.contains("panicked"), "the server panicked:\n{log}");
    let status = s.terminate();
    assert!(status.success(), "{status}");
}

/// The bad requests, for a server with `--max-body 1024 --max-candidates 5`,
/// tokens t1 (decisions) and t2 (admin), policy `p`, campaigns `base` and
/// `child` (parent `base`).
#[rustfmt::skip]
fn bad_cases() -> Vec<Case> {
    let long = "x".repeat(257);
    let huge_key = "k".repeat(2000);
    let six: Vec<Value> = (0..6).map(|_| json!({"campaign": "base"})).collect();
    let inval = "invalid_argument";
    vec![
        // Syntax and types.
        case("malformed JSON", "POST", "/v1/check", r#"{"policy":"p","key":"#, 400, inval, None),
        case("not JSON", "POST", "/v1/screen", "hello", 400, inval, None),
        case("empty body", "POST", "/v1/check", "", 400, inval, None),
        case("key is a number", "POST", "/v1/check", r#"{"policy":"p","key":5}"#, 400, inval, Some("key")),
        case("cost is a string", "POST", "/v1/check", r#"{"policy":"p","key":"k","cost":"1"}"#, 400, inval, Some("cost")),
        case("candidates is an object", "POST", "/v1/screen",
            r#"{"user":"u1","candidates":{"campaign":"base"}}"#, 400, inval, Some("candidates")),
        case("reserve is a string", "POST", "/v1/screen",
            r#"{"user":"u1","candidates":[{"campaign":"base"}],"reserve":"yes"}"#, 400, inval, Some("reserve")),
        // Unknown fields.
        case("unknown field in check", "POST", "/v1/check",
            r#"{"policy":"p","key":"k","colour":"red"}"#, 400, inval, Some("colour")),
        case("unknown field in candidate", "POST", "/v1/screen",
            r#"{"user":"u1","candidates":[{"campaign":"base","bid":2}]}"#, 400, inval, Some("bid")),
        case("unknown field in commit", "POST", "/v1/reservations/x1/commit",
            r#"{"campaign":"base","price":2}"#, 400, inval, Some("price")),
        case("unknown field in event", "POST", "/v1/events",
            r#"{"campaign":"child","when":1}"#, 400, inval, Some("when")),
        // Sizes and counts.
        case("oversized body", "POST", "/v1/check",
            &json!({"policy": "p", "key": huge_key}).to_string(), 413, "too_large", None),
        case("empty candidates", "POST", "/v1/screen",
            r#"{"user":"u1","candidates":[]}"#, 400, inval, Some("candidates")),
        case("too many candidates", "POST", "/v1/screen",
            &json!({"user": "u1", "candidates": six}).to_string(), 400, inval, Some("candidates")),
        case("too-long key", "POST", "/v1/check",
            &json!({"policy": "p", "key": long}).to_string(), 400, inval, Some("key")),
        case("too-long user", "POST", "/v1/screen",
            &json!({"user": long, "candidates": [{"campaign": "base"}]}).to_string(), 400, inval, Some("user")),
        case("too-long campaign id", "PUT", &format!("/v1/campaigns/{long}"), "{}", 400, inval, Some("id")),
        case("bad reservation id", "POST", "/v1/screen",
            r#"{"user":"u1","candidates":[{"campaign":"base"}],"reservation_id":"a b"}"#, 400, inval, Some("reservation_id")),
        // Numbers.
        case("negative cost", "POST", "/v1/check", r#"{"policy":"p","key":"k","cost":-1}"#, 400, inval, Some("cost")),
        case("cost >= 2^64", "POST", "/v1/check",
            r#"{"policy":"p","key":"k","cost":18446744073709551616}"#, 400, inval, Some("cost")),
        case("cost = 2^53", "POST", "/v1/check",
            r#"{"policy":"p","key":"k","cost":9007199254740992}"#, 400, inval, Some("cost")),
        case("float cost", "POST", "/v1/check", r#"{"policy":"p","key":"k","cost":1.5}"#, 400, inval, Some("cost")),
        case("float candidate cost", "POST", "/v1/screen",
            r#"{"user":"u1","candidates":[{"campaign":"base","cost":0.5}]}"#, 400, inval, Some("candidates[0].cost")),
        case("float event cost", "POST", "/v1/events",
            r#"{"user":"u1","campaign":"child","cost":2.5}"#, 400, inval, Some("cost")),
        case("negative ttl", "POST", "/v1/screen",
            r#"{"user":"u1","candidates":[{"campaign":"base"}],"ttl_ms":-5}"#, 400, inval, Some("ttl_ms")),
        case("zero ttl", "POST", "/v1/check",
            r#"{"policy":"p","key":"k","reserve":true,"ttl_ms":0}"#, 400, inval, Some("ttl_ms")),
        case("ttl over an hour", "POST", "/v1/check",
            r#"{"policy":"p","key":"k","reserve":true,"ttl_ms":3600001}"#, 400, inval, Some("ttl_ms")),
        case("negative commit cost", "POST", "/v1/reservations/x1/commit",
            r#"{"campaign":"base","cost":-3}"#, 400, inval, Some("cost")),
        // References.
        case("unknown campaign in event", "POST", "/v1/events",
            r#"{"user":"u1","campaign":"nope","event_id":"e-nope"}"#, 404, "not_found", Some("nope")),
        case("batch with an unknown campaign", "POST", "/v1/events",
            r#"[{"user":"u1","campaign":"child","cost":2,"event_id":"e-ok"},{"user":"u1","campaign":"nope"}]"#,
            404, "not_found", Some("[1].campaign")),
        case("batch with a bad event", "POST", "/v1/events",
            r#"[{"user":"u1","campaign":"child","event_id":"e-ok"},{"user":"u1","campaign":"child","cost":-1}]"#,
            400, inval, Some("[1].cost")),
        case("late commit to an unknown campaign", "POST", "/v1/reservations/gone-1/commit",
            r#"{"user":"u1","campaign":"nope","cost":1}"#, 404, "not_found", None),
        case("unknown policy", "POST", "/v1/check", r#"{"policy":"nope","key":"k"}"#, 404, "not_found", None),
        case("policy and limits", "POST", "/v1/check",
            r#"{"policy":"p","limits":[{"kind":"gap","min":"1s"}],"key":"k"}"#, 400, inval, Some("policy")),
        case("delete a missing policy", "DELETE", "/v1/policies/nope", "", 404, "not_found", None),
        case("delete a campaign with children", "DELETE", "/v1/campaigns/base", "", 409, "conflict", None),
        // Definitions.
        case("malformed policy", "PUT", "/v1/policies/p", r#"{"limits":["#, 400, inval, None),
        case("negative rate", "PUT", "/v1/policies/p",
            r#"{"limits":[{"kind":"rate","rate":-1,"per":"1s"}]}"#, 400, inval, Some("limits[0].rate")),
        case("rate >= 2^64", "PUT", "/v1/policies/p",
            r#"{"limits":[{"kind":"rate","rate":18446744073709551616,"per":"1s"}]}"#, 400, inval, Some("limits[0].rate")),
        case("float rate", "PUT", "/v1/policies/p",
            r#"{"limits":[{"kind":"rate","rate":1.5,"per":"1s"}]}"#, 400, inval, Some("limits[0].rate")),
        case("zero rate", "PUT", "/v1/policies/p",
            r#"{"limits":[{"kind":"rate","rate":0,"per":"1s"}]}"#, 400, inval, Some("limits[0].rate")),
        case("unknown field in an item", "PUT", "/v1/policies/p",
            r#"{"limits":[{"kind":"rate","rate":1,"per":"1s","bogus":true}]}"#, 400, inval, Some("bogus")),
        case("unknown field in a policy", "PUT", "/v1/policies/p",
            r#"{"limits":[{"kind":"rate","rate":1,"per":"1s"}],"extra":1}"#, 400, inval, Some("extra")),
        case("no limits", "PUT", "/v1/policies/p", r#"{"limits":[]}"#, 400, inval, Some("limits")),
        case("bad duration", "PUT", "/v1/policies/p",
            r#"{"limits":[{"kind":"rate","rate":1,"per":"1 sec"}]}"#, 400, inval, Some("limits[0].per")),
        case("delay without max_delay_ms", "PUT", "/v1/policies/p",
            r#"{"limits":[{"kind":"rate","rate":1,"per":"1s"}],"on_limit":"delay"}"#, 400, inval, Some("max_delay_ms")),
        case("bad time zone", "PUT", "/v1/campaigns/base",
            r#"{"tz":"Mars/Olympus_Mons","caps":[{"kind":"window","limit":1,"window":"1d","align":"calendar"}]}"#,
            400, inval, Some("tz")),
        case("bad time zone in a cap", "PUT", "/v1/campaigns/base",
            r#"{"caps":[{"kind":"window","limit":1,"window":"1d","align":"calendar","tz":"Nowhere/Land"}]}"#,
            400, inval, Some("caps[0].tz")),
        case("parent cycle", "PUT", "/v1/campaigns/base", r#"{"parent":"child"}"#, 400, inval, Some("parent")),
        case("own parent", "PUT", "/v1/campaigns/base", r#"{"parent":"base"}"#, 400, inval, Some("parent")),
        case("missing parent", "PUT", "/v1/campaigns/orphan", r#"{"parent":"ghost"}"#, 400, inval, Some("parent")),
        case("unknown field in a campaign", "PUT", "/v1/campaigns/base", r#"{"colour":"red"}"#, 400, inval, Some("colour")),
        case("bad scope", "PUT", "/v1/campaigns/base",
            r#"{"caps":[{"scope":"Everyone","kind":"gap","min":"1s"}]}"#, 400, inval, Some("scope")),
        case("budget of another kind", "PUT", "/v1/campaigns/base",
            r#"{"budget":{"kind":"rate","rate":1,"per":"1s"}}"#, 400, inval, Some("budget")),
        case("negative max_in_flight", "PUT", "/v1/campaigns/base", r#"{"max_in_flight":-1}"#, 400, inval, Some("max_in_flight")),
        case("shorter window, higher limit", "PUT", "/v1/campaigns/base",
            r#"{"caps":[{"kind":"window","limit":10,"window":"1h"},{"kind":"window","limit":5,"window":"1d"}]}"#,
            400, inval, Some("caps")),
        // Authentication: decisions need a token; definitions the admin one.
        unauth("check without a token", "POST", "/v1/check", Auth::Missing, r#"{"policy":"p","key":"k"}"#),
        unauth("check with a wrong token", "POST", "/v1/check", Auth::Bearer("t3"), r#"{"policy":"p","key":"k"}"#),
        unauth("screen with Basic auth", "POST", "/v1/screen", Auth::Raw("Basic t1"),
            r#"{"user":"u1","candidates":[{"campaign":"child"}]}"#),
        unauth("event without a token", "POST", "/v1/events", Auth::Missing,
            r#"{"user":"u1","campaign":"child","event_id":"e-anon"}"#),
        unauth("usage without a token", "GET", "/v1/users/u1/campaigns/child", Auth::Missing, ""),
        unauth("policy put with the decision token", "PUT", "/v1/policies/p", Auth::Bearer(DECISION_TOKEN),
            r#"{"limits":[{"kind":"rate","rate":99,"per":"1s"}]}"#),
        unauth("policy put without a token", "PUT", "/v1/policies/p", Auth::Missing,
            r#"{"limits":[{"kind":"rate","rate":99,"per":"1s"}]}"#),
        unauth("policy delete with the decision token", "DELETE", "/v1/policies/p", Auth::Bearer(DECISION_TOKEN), ""),
        unauth("campaign put with the decision token", "PUT", "/v1/campaigns/base", Auth::Bearer(DECISION_TOKEN),
            r#"{"caps":[{"kind":"window","limit":99,"window":"1d"}]}"#),
        unauth("campaign delete without a token", "DELETE", "/v1/campaigns/child", Auth::Missing, ""),
    ]
}

/// `header_style`: HTTP checks name their fields IETF's way by default, or
/// as draft 03 (Kong) or `X-RateLimit-*` (Envoy, tower_governor) say.
#[test]
fn header_styles_name_the_fields_of_http_checks() {
    for (style, prefix) in [("draft03", "ratelimit-"), ("x-ratelimit", "x-ratelimit-")] {
        let dir = tempfile::tempdir().expect("temp dir");
        let s = Server::start(dir.path(), &["--header-style", style]);
        let p = json!({"limits": [{"name": "per_min", "kind": "rate", "rate": 2, "per": "1m"}]});
        s.expect("PUT", "/v1/policies/p", Some(&p), 200);
        let check = json!({"policy": "p", "key": "client-1"});
        for (i, want) in [(1, 200), (0, 200), (0, 429)] {
            let r = s.post("/v1/check", &check);
            assert_eq!(r.status, want, "{style}: {}", r.text);
            assert_eq!(
                r.header(&format!("{prefix}limit")).as_deref(),
                Some("2"),
                "{style}"
            );
            assert_eq!(
                r.header(&format!("{prefix}remaining")),
                Some(i.to_string()),
                "{style}"
            );
            let reset: u64 = r
                .header(&format!("{prefix}reset"))
                .unwrap()
                .parse()
                .unwrap();
            assert!((1..=60).contains(&reset), "{style}: {reset}");
            assert_eq!(r.header("ratelimit-policy"), None, "{style}");
            assert_eq!(r.header("ratelimit"), None, "{style}");
            assert_eq!(r.header("retry-after").is_some(), want == 429, "{style}");
        }
    }
}
