//! Replay (docs/semantics.md §9): the API on a virtual clock. One answer per line,
//! deterministic, reservations expiring by the virtual clock, calendar days in
//! a campaign's time zone, and the same answers as the live server.

use std::sync::Arc;

use freqcap::api::ApiOptions;
use freqcap::engine::EngineOptions;
use freqcap::replay::Replayer;
use freqcap::store::MemoryStore;
use serde_json::{Value, json};

fn replayer() -> Replayer {
    Replayer::new(
        Arc::new(MemoryStore::new()),
        EngineOptions::default(),
        ApiOptions::default(),
    )
    .unwrap()
}

/// One input line.
fn line(at_ms: u64, method: &str, path: &str, body: Value) -> String {
    json!({"at_ms": at_ms, "method": method, "path": path, "body": body}).to_string()
}

/// Replays `lines` and returns the parsed answers.
fn replay(lines: &[String]) -> Vec<Value> {
    let input = lines.join("\n");
    let mut out = Vec::new();
    let summary = replayer().run(input.as_bytes(), &mut out).unwrap();
    assert_eq!(summary.lines as usize, lines.len());
    let text = String::from_utf8(out).unwrap();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// 2026-03-07 00:00:00 UTC, in ms.
const T0: u64 = 1_772_841_600_000;

#[test]
fn one_answer_per_line_bad_lines_are_400_and_leave_the_clock() {
    let lines = vec![
        line(
            T0,
            "PUT",
            "/v1/policies/p",
            json!({"limits": [{"kind": "window", "limit": 1, "window": "1m", "align": "fixed"}]}),
        ),
        "this is not json".to_owned(),
        line(T0 + 10, "POST", "/v1/check", json!({"policy": "p", "key": "k"})),
        // Earlier than the line before: refused, clock stays at T0 + 10.
        line(T0 + 5, "POST", "/v1/check", json!({"policy": "p", "key": "k"})),
        String::new(),
        line(T0 + 20, "POST", "/v1/check", json!({"policy": "p", "key": "k"})),
        // Fields replay does not know are refused too.
        json!({"at_ms": T0 + 30, "method": "GET", "path": "/healthz", "extra": 1}).to_string(),
        // A body may be absent or null for requests that take none.
        json!({"at_ms": T0 + 40, "method": "GET", "path": "/v1/policies/p"}).to_string(),
        json!({"at_ms": T0 + 50, "method": "POST", "path": "/v1/reservations/nope/release", "body": null}).to_string(),
    ];
    let out = replay(&lines);
    let status: Vec<u64> = out.iter().map(|a| a["status"].as_u64().unwrap()).collect();
    assert_eq!(status, [200, 400, 200, 400, 400, 429, 400, 200, 404]);
    assert_eq!(out[1]["body"]["error"]["code"], "invalid_argument");
    assert_eq!(out[3]["at_ms"], T0 + 5);
    assert!(
        out[3]["body"]["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("at_ms:")
    );
    // The check at T0 + 20 was decided at T0 + 20 (clock unchanged by the bad
    // line): the fixed minute resets 40 s later.
    assert_eq!(out[5]["body"]["retry_after_ms"], 60_000 - 20);
    assert_eq!(out[7]["body"]["limits"][0]["limit"], 1);
}

#[test]
fn same_input_same_output_made_ids_included() {
    let lines = vec![
        line(
            T0,
            "PUT",
            "/v1/campaigns/c",
            json!({"caps": [{"kind": "window", "limit": 2, "window": "1d", "align": "calendar"}]}),
        ),
        line(
            T0 + 1,
            "POST",
            "/v1/screen",
            json!({"user": "u", "candidates": [{"campaign": "c"}]}),
        ),
        line(
            T0 + 2,
            "POST",
            "/v1/screen",
            json!({"user": "u", "candidates": [{"campaign": "c"}]}),
        ),
    ];
    let a = replay(&lines);
    let b = replay(&lines);
    assert_eq!(a, b);
    let id = a[1]["body"]["reservation"].as_str().unwrap();
    assert!(id.starts_with("r-"), "{id}");
    assert_ne!(a[1]["body"]["reservation"], a[2]["body"]["reservation"]);
}

#[test]
fn reservations_expire_by_the_virtual_clock() {
    let rate =
        json!({"limits": [{"kind": "window", "limit": 1, "window": "1h", "align": "rolling"}]});
    let lines = vec![
        line(T0, "PUT", "/v1/policies/p", rate),
        line(
            T0,
            "POST",
            "/v1/check",
            json!({"policy": "p", "key": "k", "reserve": true, "ttl_ms": 1000, "reservation_id": "a1"}),
        ),
        // Pending: it counts.
        line(
            T0 + 999,
            "POST",
            "/v1/check",
            json!({"policy": "p", "key": "k"}),
        ),
        // At the deadline it is released, as of the deadline.
        line(
            T0 + 1000,
            "POST",
            "/v1/check",
            json!({"policy": "p", "key": "k"}),
        ),
        // The id is forgotten after its deadline.
        line(T0 + 1001, "POST", "/v1/reservations/a1/commit", Value::Null),
    ];
    let out = replay(&lines);
    let status: Vec<u64> = out.iter().map(|a| a["status"].as_u64().unwrap()).collect();
    assert_eq!(status, [200, 200, 429, 200, 404]);
    assert_eq!(out[1]["body"]["reservation"], "a1");
}

#[test]
fn a_daily_cap_resets_at_the_campaigns_local_midnight() {
    // New York is UTC-5 on 2026-03-07: local midnight is 05:00 UTC.
    let local_midnight = T0 + 5 * 3_600_000;
    let screen = |at: u64, id: &str| {
        line(
            at,
            "POST",
            "/v1/screen",
            json!({"user": "u1", "candidates": [{"campaign": "ny"}], "reservation_id": id}),
        )
    };
    let commit = |at: u64, id: &str| {
        line(
            at,
            "POST",
            &format!("/v1/reservations/{id}/commit"),
            json!({"campaign": "ny"}),
        )
    };
    let lines = vec![
        line(
            T0,
            "PUT",
            "/v1/campaigns/ny",
            json!({"tz": "America/New_York", "caps": [{"name": "daily", "kind": "window", "limit": 1, "window": "1d", "align": "calendar"}]}),
        ),
        // 23:30 local on March 6.
        screen(local_midnight - 1_800_000, "a"),
        commit(local_midnight - 1_799_000, "a"),
        // 23:59:59.999 local: still March 6, capped.
        screen(local_midnight - 1, "b"),
        // 00:00 local March 7 (05:00 UTC, not UTC midnight): a new day.
        screen(local_midnight, "c"),
    ];
    let out = replay(&lines);
    assert_eq!(out[1]["body"]["results"][0]["eligible"], true);
    assert_eq!(out[2]["body"]["outcome"], "committed");
    let denied = &out[3]["body"]["results"][0];
    assert_eq!(denied["eligible"], false);
    assert_eq!(denied["denied_by"]["cap"], "daily");
    assert_eq!(denied["denied_by"]["retry_after_ms"], 1);
    assert_eq!(out[4]["body"]["results"][0]["eligible"], true);
}

#[test]
fn wait_never_sleeps_in_replay() {
    let lines = vec![
        line(
            T0,
            "PUT",
            "/v1/policies/shaped",
            json!({"limits": [{"kind": "gap", "min": "30m"}], "on_limit": "delay", "max_delay_ms": 3_600_000}),
        ),
        line(
            T0,
            "POST",
            "/v1/check",
            json!({"policy": "shaped", "key": "k"}),
        ),
        line(
            T0,
            "POST",
            "/v1/check",
            json!({"policy": "shaped", "key": "k", "wait": true}),
        ),
    ];
    let started = std::time::Instant::now();
    let out = replay(&lines);
    assert_eq!(out[2]["status"], 200);
    assert_eq!(out[2]["body"]["delay_ms"], 1_800_000);
    // Half an hour's wait was not slept (a generous bound: this only guards a sleep).
    assert!(started.elapsed() < std::time::Duration::from_secs(600));
}

/// Removes fields that depend on when a request is handled, so a live answer
/// and a replayed one can be compared ("times aside").
fn without_times(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|k, _| !k.ends_with("_ms") && k != "period_start" && k != "period_end");
            m.values_mut().for_each(without_times);
        }
        Value::Array(a) => a.iter_mut().for_each(without_times),
        _ => {}
    }
}

#[test]
fn replay_answers_as_the_live_server_does() {
    // A scenario whose figures do not depend on the few ms between live
    // requests: day windows and caller-chosen reservation ids.
    let scenario: Vec<(&str, String, Value)> = vec![
        (
            "PUT",
            "/v1/campaigns/adv".into(),
            json!({"caps": [{"kind": "window", "limit": 100, "window": "1d", "align": "calendar", "scope": "campaign"}]}),
        ),
        (
            "PUT",
            "/v1/campaigns/c1".into(),
            json!({"parent": "adv", "caps": [{"name": "per_user", "kind": "window", "limit": 2, "window": "1d", "align": "calendar"}]}),
        ),
        (
            "PUT",
            "/v1/campaigns/c2".into(),
            json!({"parent": "adv", "caps": [{"kind": "window", "limit": 1, "window": "1d", "align": "calendar"}]}),
        ),
        (
            "POST",
            "/v1/screen".into(),
            json!({"user": "u", "candidates": [{"campaign": "c1"}, {"campaign": "c2"}, {"campaign": "zz"}], "reservation_id": "s1"}),
        ),
        (
            "POST",
            "/v1/reservations/s1/commit".into(),
            json!({"campaign": "c1"}),
        ),
        (
            "POST",
            "/v1/reservations/s1/commit".into(),
            json!({"campaign": "c1"}),
        ),
        ("POST", "/v1/reservations/s1/release".into(), Value::Null),
        ("GET", "/v1/users/u/campaigns/c1".into(), Value::Null),
        ("GET", "/v1/users/u/campaigns/c2".into(), Value::Null),
        (
            "PUT",
            "/v1/policies/p".into(),
            json!({"limits": [{"name": "daily", "kind": "window", "limit": 2, "window": "1d", "align": "fixed"}]}),
        ),
        (
            "POST",
            "/v1/check".into(),
            json!({"policy": "p", "key": "k", "cost": 2}),
        ),
        (
            "POST",
            "/v1/check".into(),
            json!({"policy": "p", "key": "k"}),
        ),
        (
            "POST",
            "/v1/check".into(),
            json!({"policy": "p", "key": "k", "cost": "x"}),
        ),
        (
            "POST",
            "/v1/events".into(),
            json!([{"user": "u", "campaign": "c2", "event_id": "e1"}, {"user": "u", "campaign": "c2", "event_id": "e1"}]),
        ),
        ("DELETE", "/v1/campaigns/adv".into(), Value::Null),
        ("GET", "/v1/nothing".into(), Value::Null),
    ];

    // Live: the same router on the system clock, over real HTTP on loopback.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let engine = freqcap::engine::Engine::open(
        Arc::new(MemoryStore::new()),
        freqcap::SystemClock::new(),
        EngineOptions::default(),
    )
    .unwrap();
    let app = freqcap::api::router(Arc::new(engine), ApiOptions::default());
    rt.spawn(async move { axum::serve(listener, app).await });
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(std::time::Duration::from_secs(10)))
        .build()
        .into();
    let start_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let mut live = Vec::new();
    for (method, path, body) in &scenario {
        let url = format!("http://{addr}{path}");
        let mut r = match (*method, body.is_null()) {
            ("GET", _) => agent.get(&url).call(),
            ("DELETE", _) => agent.delete(&url).call(),
            ("POST", true) => agent.post(&url).send_empty(),
            // The same text replay sends, so even error positions agree.
            ("POST", false) => agent
                .post(&url)
                .content_type("application/json")
                .send(body.to_string()),
            ("PUT", _) => agent
                .put(&url)
                .content_type("application/json")
                .send(body.to_string()),
            _ => unreachable!(),
        }
        .unwrap();
        let status = r.status().as_u16();
        let text = r.body_mut().read_to_string().unwrap();
        let body: Value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        live.push(json!({"status": status, "body": body}));
    }

    let lines: Vec<String> = scenario
        .iter()
        .enumerate()
        .map(|(i, (m, p, b))| line(start_ms + i as u64, m, p, b.clone()))
        .collect();
    let replayed = replay(&lines);
    for (i, (mut l, mut r)) in live.into_iter().zip(replayed).enumerate() {
        let mut r = json!({"status": r["status"].take(), "body": r["body"].take()});
        without_times(&mut r);
        without_times(&mut l);
        assert_eq!(l, r, "line {i}: {:?}", scenario[i]);
    }
}

#[test]
fn the_replay_command_answers_every_line_on_stdout() {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let local_midnight = T0 + 5 * 3_600_000;
    let lines = [
        line(
            T0,
            "PUT",
            "/v1/campaigns/ny",
            json!({"tz": "America/New_York", "caps": [{"name": "daily", "kind": "window", "limit": 1, "window": "1d", "align": "calendar"}]}),
        ),
        line(
            local_midnight - 60_000,
            "POST",
            "/v1/events",
            json!({"user": "u", "campaign": "ny", "event_id": "e1"}),
        ),
        line(
            local_midnight - 1,
            "POST",
            "/v1/screen",
            json!({"user": "u", "candidates": [{"campaign": "ny"}], "reserve": false}),
        ),
        "{not json".to_owned(),
        line(
            local_midnight,
            "POST",
            "/v1/screen",
            json!({"user": "u", "candidates": [{"campaign": "ny"}], "reserve": false}),
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_freqcap"))
        .args(["replay", "--data-dir"])
        .arg(dir.path().join("data"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(lines.join("\n").as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answers: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let status: Vec<u64> = answers
        .iter()
        .map(|a| a["status"].as_u64().unwrap())
        .collect();
    assert_eq!(status, [200, 200, 200, 400, 200]);
    assert_eq!(answers[2]["body"]["results"][0]["eligible"], false);
    assert_eq!(answers[4]["body"]["results"][0]["eligible"], true);
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("replayed 5 lines, 1 answered with an error status")
    );
    // --data-dir keeps what the replay counted.
    let store = Arc::new(
        freqcap::store::RocksStore::open(&dir.path().join("data"), freqcap::store::Durability::Wal)
            .unwrap(),
    );
    let e = freqcap::engine::Engine::open(
        store,
        freqcap::ManualClock::new((local_midnight - 1) * 1_000_000),
        EngineOptions::default(),
    )
    .unwrap();
    assert_eq!(e.user_usage("u", "ny").unwrap()[0].used, 1);
}

/// Pacing levers (docs/pacing.md, "Levers") over HTTP on a virtual clock: a
/// campaign with `pacing_levers` gets its budget's pass probability and bid
/// multiplier with each eligible candidate, the slow start's 0.1 at the
/// day's start, lower once spend runs over the minute's target, higher while
/// it runs under; a `throttle` budget lets about that share through; the
/// same lines answer the same way twice.
#[test]
fn pacing_levers_and_throttle_on_a_virtual_clock() {
    let mut lines = vec![
        line(
            T0,
            "PUT",
            "/v1/campaigns/levers",
            // 14 400 a day: 10 a minute.
            json!({"budget": {"amount": 14_400, "pacing": "even", "tolerance": 1},
                   "pacing_levers": true, "unknown_user": "allow"}),
        ),
        line(
            T0,
            "PUT",
            "/v1/campaigns/thr",
            json!({"budget": {"amount": 1_000_000, "pacing": "throttle"},
                   "unknown_user": "allow"}),
        ),
        line(
            T0,
            "PUT",
            "/v1/campaigns/child",
            json!({"parent": "levers", "unknown_user": "allow"}),
        ),
    ];
    let screen = |at: u64, c: &str| {
        line(
            at,
            "POST",
            "/v1/screen",
            json!({"candidates": [{"campaign": c}], "reserve": false}),
        )
    };
    let event = |at: u64, n: u64| {
        line(
            at,
            "POST",
            "/v1/events",
            json!({"campaign": "levers", "cost": n}),
        )
    };
    // A throttle budget at its slow start: 2 000 screens in the first
    // minute, about a tenth of them eligible.
    for i in 0..2_000u64 {
        lines.push(screen(T0 + 1_000 + i * 20, "thr"));
    }
    // The slow start, on the child too (its parent asks for levers).
    lines.push(screen(T0 + 45_000, "levers"));
    lines.push(screen(T0 + 45_000, "child"));
    // 50 spent in the first minute (5× its target): both levers close.
    lines.push(event(T0 + 50_000, 50));
    lines.push(screen(T0 + 60_000, "levers"));
    // Nothing in the next five minutes: the pass probability opens again.
    lines.push(screen(T0 + 6 * 60_000, "levers"));
    let out = replay(&lines);
    let levers = |i: usize| out[i]["body"]["results"][0]["pacing"].clone();
    let head = 3 + 2_000;
    assert_eq!(
        levers(head),
        json!({"pass_probability": 0.1, "bid_multiplier": 1.0}),
        "{out:?}"
    );
    assert_eq!(
        levers(head),
        json!({"pass_probability": 0.1, "bid_multiplier": 1.0}),
        "{}",
        out[head]
    );
    assert_eq!(levers(head + 1), levers(head));
    assert_eq!(out[head + 2]["status"], 200, "{}", out[head + 2]);
    let closed = levers(head + 3);
    assert_eq!(closed["pass_probability"], 0.09, "{closed}");
    // μ = 0.1·(50/10 − 1) = 0.4: 1/1.4, in millionths.
    assert_eq!(closed["bid_multiplier"], 0.714285, "{closed}");
    let reopened = levers(head + 4);
    assert!(
        reopened["pass_probability"].as_f64().unwrap() > 0.09,
        "{reopened}"
    );
    assert_eq!(reopened["bid_multiplier"], 1.0, "{reopened}");
    // A campaign without pacing_levers answers none.
    let thr = &out[3..head];
    assert!(thr[0]["body"]["results"][0].get("pacing").is_none());
    let passed = thr
        .iter()
        .filter(|o| o["body"]["results"][0]["eligible"] == true)
        .count();
    assert!((150..=250).contains(&passed), "{passed} of 2000 passed");
    // A throttled candidate is denied by `budget`, retried at the next
    // minute (when the probability is re-planned).
    let denied = thr
        .iter()
        .find(|o| o["body"]["results"][0]["eligible"] == false)
        .unwrap();
    let d = &denied["body"]["results"][0]["denied_by"];
    assert_eq!(d["cap"], "budget", "{denied}");
    assert!(d["retry_after_ms"].as_u64().unwrap() <= 60_000, "{denied}");
    // Deterministic: the same lines give the same answers.
    assert_eq!(replay(&lines), out);
}
