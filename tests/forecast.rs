//! Delivery forecasts (docs/forecast.md, issue 30 item 4): the engine on a
//! virtual clock over a hash sample of the traffic, against the whole
//! traffic; `freqcap forecast`; `POST /v1/forecast`.

mod support;

use freqcap::simulate::forecast::{
    LARGEST_UNIT_WARNING, error_against, forecast, in_sample, scaled,
};
use freqcap::simulate::{
    DEFAULT_DIURNAL, Generator, RunOptions, SimCampaign, Synthetic, local_days, parse_campaigns,
};
use serde_json::json;

const CAMPAIGNS: &str = r#"{"campaigns": [
  {"id": "adv", "campaign": {"caps": [{"kind": "window", "limit": 9000, "window": "1d",
      "align": "calendar", "scope": "campaign"}]}},
  {"id": "spring", "cost": 2, "campaign": {"parent": "adv",
    "caps": [{"kind": "window", "limit": 3, "window": "1d", "align": "calendar"},
             {"kind": "window", "limit": 4, "window": "1d", "align": "calendar", "scope": "household"}],
    "budget": {"amount": 12000, "pacing": "even"}}},
  {"id": "summer", "campaign": {"caps": [{"kind": "window", "limit": 2, "window": "1d", "align": "calendar"}],
    "budget": {"amount": 8000, "pacing": "adaptive"}}}
]}"#;

fn campaigns() -> Vec<SimCampaign> {
    parse_campaigns(CAMPAIGNS, false).unwrap()
}

/// A seeded day of 300 000 requests from 60 000 users in 25 000 households.
fn day(n: usize) -> (Generator, RunOptions) {
    let tz = jiff::tz::TimeZone::UTC;
    let (start, end) = local_days("2026-01-05", 1, &tz).unwrap();
    let g = Generator::new(Synthetic {
        start,
        end,
        tz,
        requests_per_day: 300_000.0,
        diurnal: DEFAULT_DIURNAL,
        users: 60_000,
        zipf_s: 0.8,
        households: 25_000,
        candidates: 2,
        campaigns: n,
        seed: 7,
    })
    .unwrap();
    let opts = RunOptions {
        commit_delay: 200_000_000,
        lost_share: 0.1,
        ttl_ms: 60_000,
        sample_every: 3_600_000_000_000,
        seed: 7,
        start,
        end,
    };
    (g, opts)
}

#[test]
fn a_sampled_forecast_is_within_its_sampling_error_of_the_whole_run() {
    let c = campaigns();
    let (g, o) = day(c.len());
    let full = forecast(&c, g, o, 1.0, 7).unwrap();
    let (g, o) = day(c.len());
    let f = forecast(&c, g, o, 0.25, 7).unwrap();
    assert_eq!(f.requests, full.requests);
    assert!(
        f.sampled_requests < full.sampled_requests / 3,
        "{} of {}",
        f.sampled_requests,
        full.sampled_requests
    );
    // Every campaign delivers, and the caps bind: spring's budget (12 000
    // at 2 a piece) and adv's 9 000 campaign cap over its children.
    for c in &full.campaigns {
        assert!(c.impressions > 1000, "{c:?}");
        assert!(c.households.is_some() && c.users >= c.households.unwrap_or(0));
    }
    // No household makes much of the traffic: the sample's error is its
    // size's (docs/forecast.md, "Accuracy").
    assert!(
        f.largest_unit_share > 0.0 && f.largest_unit_share < LARGEST_UNIT_WARNING,
        "{}",
        f.largest_unit_share
    );
    let err = error_against(&f, &full);
    assert!(err.weighted_impressions <= 0.05, "{err:?}");
    // Each campaign within three standard errors of a sample of its
    // impressions, sqrt((1 − r) / (r · n)), and 1 % for the rest: spring's
    // 1 165 of adv's shared 9 000 come out 5.1 % off at 0.25 (one standard
    // error is 5.1 % there), a 8 000-impression budget exactly.
    for (e, c) in err.campaigns.iter().zip(&full.campaigns) {
        let n = c.impressions as f64;
        let bound = 3.0 * ((1.0 - 0.25) / (0.25 * n)).sqrt() + 0.01;
        assert!(e.impressions <= bound, "{e:?} over {bound}");
        assert!(e.users <= bound, "{e:?} over {bound}");
    }
    // The frequency distribution is shares of user-days, and the user cap
    // of 2 leaves nothing past 2 for summer.
    let summer = &f.campaigns[2];
    let total: f64 = summer.frequency.iter().map(|b| b.share).sum();
    assert!((total - 1.0).abs() < 1e-9, "{summer:?}");
    assert!(
        summer.frequency[2..].iter().all(|b| b.share == 0.0),
        "{summer:?}"
    );
}

#[test]
fn what_all_users_share_is_scaled_by_the_sample() {
    let c = campaigns();
    let s = scaled(&c, 0.25).unwrap();
    let json = |c: &SimCampaign| serde_json::to_value(&c.def).unwrap();
    assert_eq!(json(&s[0])["caps"][0]["limit"], 2250);
    assert_eq!(json(&s[1])["budget"]["amount"], 3000);
    // Per-user and per-household caps are not: the sample keeps users and
    // households whole.
    assert_eq!(json(&s[1])["caps"][0]["limit"], 3);
    assert_eq!(json(&s[1])["caps"][1]["limit"], 4);
    // A unit is in or out the same way every time; about the rate of them are in.
    let kept = (0..100_000)
        .filter(|i| in_sample(&format!("h{i}"), 0.25, 7))
        .count();
    assert!((23_500..26_500).contains(&kept), "{kept}");
    assert!((0..1000).all(|i| {
        let u = format!("u{i}");
        in_sample(&u, 0.25, 7) == in_sample(&u, 0.25, 7)
    }));
}

#[test]
fn the_command_writes_the_forecast_and_its_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("campaigns.json");
    std::fs::write(&file, CAMPAIGNS).unwrap();
    let out = dir.path().join("out");
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_freqcap"))
        .args([
            "forecast",
            "--synthetic",
            "--requests",
            "50000",
            "--users",
            "10000",
        ])
        .args(["--households", "4000", "--sample", "0.5", "--compare"])
        .arg("--campaigns")
        .arg(&file)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(run.status.success(), "{run:?}");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(stdout.contains("| spring | 2026-01-05 |"), "{stdout}");
    assert!(stdout.contains("Against a full run"), "{stdout}");
    // Zipf 1 over 4 000 households: the busiest makes several % of the
    // sample's requests, and the forecast says so.
    assert!(
        stdout.contains("**Warning:** one household or user made"),
        "{stdout}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("forecast.json")).unwrap()).unwrap();
    assert_eq!(report["forecast"]["sample"], 0.5);
    assert_eq!(report["forecast"]["campaigns"].as_array().unwrap().len(), 3);
    assert!(report["error"]["max_impressions"].is_number(), "{report}");
    assert!(out.join("forecast.md").exists());
    // A bad sample is refused, naming it.
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_freqcap"))
        .args(["forecast", "--synthetic", "--sample", "0"])
        .arg("--campaigns")
        .arg(&file)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("sample: must be more than 0"),
        "{bad:?}"
    );
}

#[test]
fn the_api_forecasts_a_small_sample_and_names_bad_fields() {
    let data = tempfile::tempdir().unwrap();
    let s = support::Stopped(support::serve(
        [
            "--data-dir".as_ref(),
            data.path().as_os_str(),
            "--listen".as_ref(),
            "127.0.0.1:0".as_ref(),
        ],
        false,
    ));
    let campaigns: serde_json::Value = serde_json::from_str(CAMPAIGNS).unwrap();
    let body = json!({"campaigns": campaigns["campaigns"],
                      "traffic": {"requests": 20000, "users": 5000, "households": 2000, "seed": 3},
                      "sample": 0.5});
    let (st, f) = support::http(&s.addr, "POST", "/v1/forecast", Some(body.clone()));
    assert_eq!(st, 200, "{f}");
    assert_eq!(f["sample"], 0.5);
    let spring = &f["campaigns"][1];
    assert_eq!(spring["id"], "spring");
    assert_eq!(spring["days"][0]["day"], "2026-01-05");
    assert!(spring["impressions"].as_u64().unwrap() > 0, "{f}");
    assert!(spring["households"].as_u64().unwrap() > 0, "{f}");
    // The same body, the same forecast (seeded; wall time aside).
    let (_, again) = support::http(&s.addr, "POST", "/v1/forecast", Some(body));
    assert_eq!(again["campaigns"], f["campaigns"]);
    // Nothing of the service's own state was made.
    assert_eq!(
        support::http(&s.addr, "GET", "/v1/campaigns/spring", None).0,
        404
    );
    let field = |b: serde_json::Value| {
        let (st, e) = support::http(&s.addr, "POST", "/v1/forecast", Some(b));
        assert_eq!(st, 400, "{e}");
        let m = e["error"]["message"].as_str().unwrap_or_default();
        m.split(':').next().unwrap_or_default().to_owned()
    };
    let c = campaigns["campaigns"].clone();
    assert_eq!(
        field(json!({"campaigns": c, "traffic": {"requests": 1000, "users": 10}, "sample": 0})),
        "sample"
    );
    assert_eq!(
        field(json!({"campaigns": c, "traffic": {"requests": 5e6, "users": 10}})),
        "traffic.requests"
    );
    assert_eq!(
        field(json!({"campaigns": c, "traffic": {"requests": 1000, "users": 10, "days": 9}})),
        "traffic.days"
    );
    assert_eq!(
        field(
            json!({"campaigns": [{"id": "x", "campaign": {"parent": "nope"}}],
                     "traffic": {"requests": 1000, "users": 10}})
        ),
        "campaigns[0].campaign.parent"
    );
}

/// Forecasts understand flights and schedules (issue 48 item 4): the
/// engine decides on the virtual clock, so a campaign delivers only on the
/// days of its flight and of its schedule.
#[test]
fn a_forecast_delivers_only_inside_flights_and_schedules() {
    let c = parse_campaigns(
        r#"{"campaigns": [
          {"id": "always", "campaign": {}},
          {"id": "tuesday-flight", "campaign": {"flight":
              {"start": "2026-01-06T00:00:00Z", "end": "2026-01-07T00:00:00Z"}}},
          {"id": "wednesday-mornings", "campaign": {"schedule": {"tz": "UTC", "hours":
              [{"days": ["wed"], "from": "06:00", "until": "12:00"}]}}}
        ]}"#,
        false,
    )
    .unwrap();
    let tz = jiff::tz::TimeZone::UTC;
    // Monday 2026-01-05 to Wednesday 2026-01-07.
    let (start, end) = local_days("2026-01-05", 3, &tz).unwrap();
    let g = Generator::new(Synthetic {
        start,
        end,
        tz,
        requests_per_day: 20_000.0,
        diurnal: DEFAULT_DIURNAL,
        users: 5_000,
        zipf_s: 0.8,
        households: 0,
        candidates: 3,
        campaigns: c.len(),
        seed: 11,
    })
    .unwrap();
    let opts = RunOptions {
        commit_delay: 200_000_000,
        lost_share: 0.0,
        ttl_ms: 60_000,
        sample_every: 3_600_000_000_000,
        seed: 11,
        start,
        end,
    };
    let f = forecast(&c, g, opts, 1.0, 11).unwrap();
    // Impressions on each of the three days (a day without any is absent).
    let by_day = |id: &str| -> Vec<u64> {
        let c = f.campaigns.iter().find(|c| c.id == id).expect(id);
        ["2026-01-05", "2026-01-06", "2026-01-07"]
            .iter()
            .map(|day| {
                c.days
                    .iter()
                    .find(|d| d.day == *day)
                    .map_or(0, |d| d.impressions)
            })
            .collect()
    };
    let always = by_day("always");
    assert!(always.iter().all(|&n| n > 0), "{always:?}");
    let flight = by_day("tuesday-flight");
    assert!(
        flight[0] == 0 && flight[1] > 0 && flight[2] == 0,
        "{flight:?}"
    );
    let mornings = by_day("wednesday-mornings");
    assert!(
        mornings[0] == 0 && mornings[1] == 0 && mornings[2] > 0,
        "{mornings:?}"
    );
    // Six hours of a day's traffic at most, shared with the others.
    assert!(mornings[2] < always[2], "{mornings:?} {always:?}");
}
