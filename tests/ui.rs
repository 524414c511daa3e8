//! The ad-ops page (`/ui`) and the timeline it draws
//! (`GET /v1/campaigns/{id}/timeline`, docs/semantics.md §7.4), on a real
//! `freqcap serve`:
//! - the timeline's figures for a seeded campaign, and the same after a
//!   restart (the minutes are kept with the store);
//! - the page in Debian's headless Chromium: no console errors, the seeded
//!   figures in the DOM (the summary, the delivery curve's and the pacing
//!   line's data, denials by cap, impressions per user), and a screenshot
//!   written as an artefact (`$CARGO_TARGET_TMPDIR/ui/spring.png`).

mod support;

use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};

fn serve(data: &Path) -> support::Stopped {
    support::Stopped(support::serve(
        [
            "--data-dir".as_ref(),
            data.as_os_str(),
            "--listen".as_ref(),
            "127.0.0.1:0".as_ref(),
        ],
        false,
    ))
}

/// Campaign `spring` (1 000 a day, paced evenly; 3 per user a day; 100 a day
/// per household, which these screens do not name): seven
/// commits of 10 (u1 three times, u2 to u5 once) and one denial (u1's
/// fourth). The pacing line may run 100 ahead (tolerance 0.1), so the 70
/// fit at any minute of the day: with the default 10, a run at 00:15 UTC
/// found room for two.
fn seed(addr: &str) {
    let campaign = json!({"caps": [{"kind": "window", "limit": 3, "window": "1d", "name": "per-user"},
                                   {"kind": "window", "limit": 100, "window": "1d", "name": "hh",
                                    "scope": "household", "missing": "allow"}],
                          "budget": {"amount": 1000, "pacing": "even", "tolerance": 0.1},
                          "pacing_levers": true});
    assert_eq!(
        support::http(addr, "PUT", "/v1/campaigns/spring", Some(campaign)).0,
        200
    );
    for u in ["u1", "u2", "u3", "u4", "u5", "u1", "u1", "u1"] {
        let (_, v) = support::http(
            addr,
            "POST",
            "/v1/screen",
            Some(json!({"user": u, "candidates": [{"campaign": "spring", "cost": 10}]})),
        );
        if let Some(id) = v["reservation"].as_str() {
            let (st, v) = support::http(
                addr,
                "POST",
                &format!("/v1/reservations/{id}/commit"),
                Some(json!({"campaign": "spring"})),
            );
            assert_eq!(st, 200, "{v}");
        }
    }
}

/// Spend, commits and denials summed over the timeline's minutes.
fn totals(t: &Value) -> (u64, u64, u64) {
    let m = t["minutes"].as_array().unwrap();
    let sum = |k: &str| m.iter().map(|x| x[k].as_u64().unwrap()).sum();
    (sum("spend"), sum("commits"), sum("denied"))
}

#[test]
fn the_timeline_has_the_day_and_keeps_it_across_a_restart() {
    support::away_from_midnight();
    let data = tempfile::tempdir().unwrap();
    let s = serve(data.path());
    seed(&s.addr);
    let (st, t) = support::http(&s.addr, "GET", "/v1/campaigns/spring/timeline", None);
    assert_eq!(st, 200, "{t}");
    assert_eq!(totals(&t), (70, 7, 1), "{t}");
    assert_eq!(t["amount"], 1000);
    assert_eq!(t["pacing"], "even");
    assert_eq!(t["tz"], "UTC");
    // 96 quarter hours and the period's end.
    assert_eq!(t["pacing_line"].as_array().unwrap().len(), 97);
    assert_eq!(t["pacing_line"][96]["cap"], 1000);
    // It keeps pacing levers (`pacing_levers`), as delivery reports them.
    assert!(
        t["levers"]["pass_probability"].as_f64().unwrap() > 0.0,
        "{t}"
    );
    let (_, d) = support::http(&s.addr, "GET", "/v1/campaigns/spring/delivery", None);
    assert!(d["levers"]["bid_multiplier"].as_f64().unwrap() > 0.0, "{d}");
    assert_eq!(t["per_user"]["users"], json!([0, 4, 0, 1]), "{t}");
    let per_user = t["denied_by_cap"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["cap"] == "per-user")
        .unwrap();
    assert_eq!(per_user["denied"], 1);
    assert_eq!(
        support::http(&s.addr, "GET", "/v1/campaigns/nope/timeline", None).0,
        404
    );
    // A restart (SIGTERM: drained and flushed) keeps the minutes.
    support::signal(&s.child, libc::SIGTERM);
    let mut s = s;
    let _ = s.0.child.wait();
    drop(s);
    let s = serve(data.path());
    let (_, t) = support::http(&s.addr, "GET", "/v1/campaigns/spring/timeline", None);
    assert_eq!(totals(&t), (70, 7, 1), "{t}");
}

/// The value of attribute `name` of the element with id `id` in `dom`.
fn attr<'a>(dom: &'a str, id: &str, name: &str) -> Option<&'a str> {
    let start = dom.find(&format!("id=\"{id}\""))?;
    let tag_start = dom[..start].rfind('<')?;
    let tag_end = start + dom[start..].find('>')?;
    let tag = &dom[tag_start..tag_end];
    let key = format!("{name}=\"");
    let v = tag.find(&key)? + key.len();
    Some(&tag[v..v + tag[v..].find('"')?])
}

/// The text of the element with id `id` (no nested elements).
fn text<'a>(dom: &'a str, id: &str) -> Option<&'a str> {
    let start = dom.find(&format!("id=\"{id}\""))?;
    let open = start + dom[start..].find('>')? + 1;
    Some(&dom[open..open + dom[open..].find('<')?])
}

fn chromium(args: &[&str], url: &str) -> std::process::Output {
    Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-dev-shm-usage",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=5000",
            "--window-size=1280,1400",
        ])
        .args(args)
        .arg(url)
        .output()
        .expect("Debian's chromium is installed (make deps, .ci/run)")
}

#[test]
fn the_page_shows_the_seeded_day_in_chromium() {
    support::away_from_midnight();
    let data = tempfile::tempdir().unwrap();
    let s = serve(data.path());
    seed(&s.addr);
    let url = format!("http://{}/ui?campaign=spring", s.addr);
    let profile = tempfile::tempdir().unwrap();
    let user_dir = format!("--user-data-dir={}", profile.path().display());
    let out = chromium(&[&user_dir, "--dump-dom"], &url);
    let dom = String::from_utf8_lossy(&out.stdout).into_owned();
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{log}");
    // No console error or warning, no uncaught exception.
    let console: Vec<&str> = log.lines().filter(|l| l.contains(":CONSOLE")).collect();
    assert!(
        console
            .iter()
            .all(|l| !l.contains("ERROR:CONSOLE") && !l.contains("WARNING:CONSOLE")),
        "{console:#?}"
    );
    assert!(!log.contains("Uncaught"), "{log}");
    // The summary.
    assert_eq!(text(&dom, "spent"), Some("70"), "{dom}");
    assert_eq!(text(&dom, "commits"), Some("7"));
    assert_eq!(text(&dom, "budget"), Some("1,000 (even)"));
    // The pacing levers, as the timeline gave them to the page: drawn as
    // text and kept beside it.
    let pass: f64 = attr(&dom, "levers", "data-pass").unwrap().parse().unwrap();
    let mult: f64 = attr(&dom, "levers", "data-multiplier")
        .unwrap()
        .parse()
        .unwrap();
    assert!((0.001..=1.0).contains(&pass) && (0.1..=1.0).contains(&mult));
    let shown = text(&dom, "levers").unwrap();
    let (p, m) = shown
        .strip_prefix("pass ")
        .and_then(|r| r.split_once(" %, bid × "))
        .unwrap_or_else(|| panic!("{shown}"));
    assert!(
        (p.parse::<f64>().unwrap() - 100.0 * pass).abs() <= 0.05,
        "{shown}"
    );
    assert!((m.parse::<f64>().unwrap() - mult).abs() <= 0.005, "{shown}");
    assert_eq!(text(&dom, "open"), Some("0"));
    assert_eq!(text(&dom, "tz"), Some("UTC"));
    // The delivery curve: the period's start, a point per minute with
    // activity (one or two here: the seeding took under a second), and now
    // if the last such minute ended before it; it ends at 70.
    let points: usize = attr(&dom, "delivery", "data-points")
        .unwrap()
        .parse()
        .unwrap();
    assert!((2..=4).contains(&points), "{points}");
    assert_eq!(attr(&dom, "delivery", "data-last-spend"), Some("70"));
    // ...and the chart draws it, in the minute under way too (it drew 0
    // until the minute ended).
    assert_eq!(attr(&dom, "delivery", "data-drawn-spend"), Some("70"));
    assert_eq!(attr(&dom, "delivery", "data-budget"), Some("1000"));
    // The pacing line now, as the server computes it (even pacing: the
    // day's elapsed fraction of 1 000; the page was drawn a moment before).
    let (_, d) = support::http(&s.addr, "GET", "/v1/campaigns/spring/delivery", None);
    let served = d["cap_now"].as_u64().unwrap() as i64;
    let drawn: i64 = attr(&dom, "delivery", "data-pacing-now")
        .unwrap()
        .parse()
        .unwrap();
    assert!((served - drawn).abs() <= 2, "{served} {drawn}");
    // Uplot drew its canvases.
    assert!(dom.matches("<canvas").count() >= 3, "{dom}");
    // Denials by cap and impressions per user.
    assert!(
        dom.contains(
            "data-cap=\"per-user\" data-scope=\"user\"><td>per-user</td><td>user</td><td>1</td>"
        ),
        "{dom}"
    );
    // Each cap says whom it counts for: a household cap, the household.
    assert!(
        dom.contains("data-cap=\"hh\" data-scope=\"household\"><td>hh</td><td>household</td>"),
        "{dom}"
    );
    assert_eq!(attr(&dom, "per-user", "data-users"), Some("0,4,0,1"));
    // A screenshot, for people.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ui");
    std::fs::create_dir_all(&dir).unwrap();
    let png = dir.join("spring.png");
    let _ = std::fs::remove_file(&png);
    let shot = format!("--screenshot={}", png.display());
    let out = chromium(&[&user_dir, &shot], &url);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bytes = std::fs::read(&png).expect("the screenshot is written");
    assert!(
        bytes.starts_with(b"\x89PNG") && bytes.len() > 20_000,
        "{}",
        bytes.len()
    );
    eprintln!("screenshot: {}", png.display());
}

/// A campaign with a flight and a schedule (docs/semantics.md §6.7, §6.8):
/// the timeline names the flight and the current period's off-hours (the
/// flight, for a budget per flight), and the page shows both in its summary
/// and shades the off-hours under the pacing line, which stands still in
/// them.
#[test]
fn the_page_shows_a_flight_and_its_off_hours_in_chromium() {
    let data = tempfile::tempdir().unwrap();
    let s = serve(data.path());
    let now = jiff::Timestamp::now();
    let day = |d: i64| {
        let t = now.as_second() - now.as_second().rem_euclid(86_400) + d * 86_400;
        jiff::Timestamp::from_second(t).unwrap().to_string()
    };
    let (start, end) = (day(-1), day(9));
    let campaign = json!({
        "flight": {"start": start, "end": end},
        "schedule": {"hours": [{"days": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"],
                                "from": "09:00", "until": "17:00"}]},
        "budget": {"amount": 10000, "per": "flight"}});
    let (st, v) = support::http(&s.addr, "PUT", "/v1/campaigns/daypart", Some(campaign));
    assert_eq!(st, 200, "{v}");
    let (st, t) = support::http(&s.addr, "GET", "/v1/campaigns/daypart/timeline", None);
    assert_eq!(st, 200, "{t}");
    // The flight is the period; closed from its start to 09:00, 17:00 to
    // 09:00 each night, and from the last 17:00 to its end: 11 spans.
    assert_eq!(t["flight"], json!({"start": start, "end": end}), "{t}");
    assert_eq!(
        (&t["period_start"], &t["period_end"]),
        (&t["flight"]["start"], &t["flight"]["end"])
    );
    let closed = t["closed"].as_array().unwrap();
    assert_eq!(closed.len(), 11, "{t}");
    // The line stands still in each closed span, and rises in the open ones.
    let line: Vec<(String, u64)> = t["pacing_line"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["t"].as_str().unwrap().to_owned(),
                p["cap"].as_u64().unwrap(),
            )
        })
        .collect();
    let cap_at = |at: &Value| {
        line.iter()
            .find(|(x, _)| x == at.as_str().unwrap())
            .map(|p| p.1)
    };
    for c in &closed[1..closed.len() - 1] {
        assert_eq!(cap_at(&c["start"]), cap_at(&c["end"]), "{c}");
    }
    assert!(cap_at(&closed[2]["start"]) > cap_at(&closed[1]["end"]));
    let url = format!("http://{}/ui?campaign=daypart", s.addr);
    let profile = tempfile::tempdir().unwrap();
    let user_dir = format!("--user-data-dir={}", profile.path().display());
    let out = chromium(&[&user_dir, "--dump-dom"], &url);
    let dom = String::from_utf8_lossy(&out.stdout).into_owned();
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{log}");
    assert!(
        !log.contains("Uncaught") && !log.contains("ERROR:CONSOLE"),
        "{log}"
    );
    assert_eq!(
        text(&dom, "flight"),
        Some(format!("{start} to {end}").as_str()),
        "{dom}"
    );
    assert!(
        text(&dom, "off-hours").is_some_and(|x| x.starts_with("11 spans, ")),
        "{dom}"
    );
    assert_eq!(attr(&dom, "delivery", "data-closed-spans"), Some("11"));
    // A flight's even pacing is named so, though re-planned daily.
    assert!(dom.contains("pacing line (even)"), "{dom}");
    // The delivery and hourly charts (no user cap: no third).
    assert!(dom.matches("<canvas").count() >= 2, "{dom}");
}
