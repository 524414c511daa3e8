//! Per-definition metrics (docs/service.md, "Per-definition metrics") on a
//! real `freqcap serve`: the figures of the chosen campaigns and policies,
//! the bound on how many are chosen, and the Grafana board in ops/grafana/
//! naming only metrics the service exports.

mod support;

use std::collections::BTreeSet;

use serde_json::{Value, json};

fn metrics(s: &support::Stopped) -> String {
    support::http(&s.addr, "GET", "/metrics", None)
        .1
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// Every `freqcap_*` name in a string.
fn names_in(s: &str, out: &mut BTreeSet<String>) {
    let mut rest = s;
    while let Some(i) = rest.find("freqcap_") {
        let tail = &rest[i..];
        let n: String = tail
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        rest = &tail[n.len()..];
        out.insert(n);
    }
}

/// Every query of the board (panel targets and template variables).
fn board_queries(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("expr" | "definition", Value::String(q)) => out.push(q.clone()),
                    ("query", Value::String(q)) => out.push(q.clone()),
                    _ => board_queries(x, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| board_queries(x, out)),
        _ => {}
    }
}

fn setup(s: &support::Stopped) {
    let policy =
        json!({"limits": [{"kind": "window", "limit": 1, "window": "1h", "align": "fixed"}]});
    assert_eq!(
        support::http(&s.addr, "PUT", "/v1/policies/p", Some(policy)).0,
        200
    );
    for c in ["c", "c2", "c3"] {
        let campaign = json!({"caps": [{"kind": "window", "limit": 1, "window": "1d", "name": "per-user"}],
                              "budget": {"amount": 1000, "pacing": "asap"}});
        assert_eq!(
            support::http(
                &s.addr,
                "PUT",
                &format!("/v1/campaigns/{c}"),
                Some(campaign)
            )
            .0,
            200
        );
    }
    let check = json!({"policy": "p", "key": "k"});
    assert_eq!(
        support::http(&s.addr, "POST", "/v1/check", Some(check.clone())).0,
        200
    );
    assert_eq!(
        support::http(&s.addr, "POST", "/v1/check", Some(check)).0,
        429
    );
    // c: one screen committed at cost 7, one denied by per-user, one open.
    let screen = |user: &str, c: &str| {
        let (st, v) = support::http(
            &s.addr,
            "POST",
            "/v1/screen",
            Some(json!({"user": user, "candidates": [{"campaign": c, "cost": 7}]})),
        );
        assert_eq!(st, 200, "{v}");
        v
    };
    let v = screen("u1", "c");
    let id = v["reservation"].as_str().unwrap().to_owned();
    let (st, v) = support::http(
        &s.addr,
        "POST",
        &format!("/v1/reservations/{id}/commit"),
        Some(json!({"campaign": "c"})),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(screen("u1", "c")["results"][0]["eligible"], false);
    screen("u2", "c");
    // c2 more active than c3.
    for u in ["a", "b", "c"] {
        screen(u, "c2");
    }
    screen("a", "c3");
}

#[test]
fn chosen_definitions_have_their_own_series_and_no_others() {
    let s = support::Stopped(support::serve(
        [
            "--memory",
            "--listen",
            "127.0.0.1:0",
            "--metrics-definitions",
            "c,p",
            "--metrics-top",
            "1",
        ],
        false,
    ));
    setup(&s);
    let text = metrics(&s);
    let at = |series: &str| sample(&text, series);
    assert_eq!(
        at(r#"freqcap_campaign_spend{campaign="c"}"#),
        Some(7.0),
        "{text}"
    );
    assert_eq!(
        at(r#"freqcap_campaign_spend_pending{campaign="c"}"#),
        Some(7.0)
    );
    assert_eq!(at(r#"freqcap_campaign_budget{campaign="c"}"#), Some(1000.0));
    assert_eq!(
        at(r#"freqcap_campaign_commits_total{campaign="c"}"#),
        Some(1.0)
    );
    assert_eq!(
        at(r#"freqcap_campaign_reservations_open{campaign="c"}"#),
        Some(1.0)
    );
    assert_eq!(
        at(r#"freqcap_campaign_screened_total{campaign="c",outcome="eligible"}"#),
        Some(2.0)
    );
    assert_eq!(
        at(r#"freqcap_campaign_denied_total{campaign="c",cap="per-user"}"#),
        Some(1.0)
    );
    assert_eq!(
        at(r#"freqcap_policy_decisions_total{policy="p",outcome="allowed"}"#),
        Some(1.0)
    );
    assert_eq!(
        at(r#"freqcap_policy_decisions_total{policy="p",outcome="denied"}"#),
        Some(1.0)
    );
    // The listed ones, plus the one most active other (c2), never c3.
    let campaigns: BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.split("campaign=\"").nth(1)?.split('"').next())
        .collect();
    assert_eq!(campaigns, BTreeSet::from(["c", "c2"]), "{text}");
}

#[test]
fn off_by_default() {
    let s = support::Stopped(support::serve(
        ["--memory", "--listen", "127.0.0.1:0"],
        false,
    ));
    setup(&s);
    let text = metrics(&s);
    assert!(!text.contains("campaign=\""), "{text}");
    assert!(!text.contains("policy=\""), "{text}");
}

#[test]
fn the_grafana_board_names_only_exported_metrics() {
    let s = support::Stopped(support::serve(
        [
            "--memory",
            "--listen",
            "127.0.0.1:0",
            "--metrics-definitions",
            "c,p",
        ],
        false,
    ));
    setup(&s);
    let text = metrics(&s);
    // What the service exports: each family's name from its TYPE line, and
    // the sample names OpenMetrics derives from it.
    let mut exported = BTreeSet::new();
    for l in text.lines() {
        if let Some(rest) = l.strip_prefix("# TYPE ") {
            let name = rest.split(' ').next().unwrap_or_default();
            for suffix in ["", "_total", "_bucket", "_sum", "_count", "_created"] {
                exported.insert(format!("{name}{suffix}"));
            }
        }
    }
    let board: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/ops/grafana/freqcap.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let mut queries = Vec::new();
    board_queries(&board, &mut queries);
    assert!(queries.len() >= 20, "{queries:?}");
    let mut named = BTreeSet::new();
    for q in &queries {
        names_in(q, &mut named);
    }
    let missing: Vec<&String> = named.iter().filter(|n| !exported.contains(*n)).collect();
    assert!(missing.is_empty(), "not exported: {missing:?}");
    // It covers the per-campaign series and the service's own.
    for n in [
        "freqcap_campaign_spend",
        "freqcap_campaign_spend_cap_now",
        "freqcap_campaign_denied_total",
        "freqcap_policy_decisions_total",
        "freqcap_http_request_duration_seconds_bucket",
    ] {
        assert!(named.contains(n), "{n}");
    }
}
