//! Definitions that must be rejected, each naming the offending field (docs/semantics.md §5.1:
//! "Anything else is 400"), plus the warnings, TOML parsing and the JSON round
//! trip of valid definitions.

use freqcap::model::{
    CampaignDef, CompiledPolicy, DefinitionError, PolicyDef, from_json, from_toml,
};

/// Parses and compiles a policy, returning the first error.
fn compile(json: &str) -> Result<CompiledPolicy, DefinitionError> {
    from_json::<PolicyDef>(json)?.compile()
}

/// Wraps one item in a policy.
fn one(item: &str) -> String {
    format!(r#"{{"limits":[{item}]}}"#)
}

#[track_caller]
fn rejects(json: &str, field: &str, message_part: &str) {
    match compile(json) {
        Ok(_) => panic!("accepted: {json}"),
        Err(e) => {
            assert_eq!(e.field, field, "field for {json}: {e}");
            assert!(
                e.message.contains(message_part),
                "message for {json} should contain {message_part:?}: {e}"
            );
        }
    }
}

#[test]
fn bad_numbers() {
    let cases = [
        // Zero rate: 1 ≤ rate < 2^53.
        (
            r#"{"kind":"rate","rate":0,"per":"1s"}"#,
            "limits[0].rate",
            "2^53",
        ),
        (
            r#"{"kind":"rate","rate":5,"per":"1s","burst":0}"#,
            "limits[0].burst",
            "got 0",
        ),
        // 2^53 itself is out of range; 2^53 − 1 is the largest.
        (
            r#"{"kind":"rate","rate":9007199254740992,"per":"1s"}"#,
            "limits[0].rate",
            "9007199254740992",
        ),
        (
            r#"{"kind":"window","limit":0,"window":"1m","align":"fixed"}"#,
            "limits[0].limit",
            "got 0",
        ),
        (
            r#"{"kind":"budget","amount":9007199254740992}"#,
            "limits[0].amount",
            "2^53",
        ),
        (
            r#"{"kind":"concurrency","max":0}"#,
            "limits[0].max",
            "got 0",
        ),
        // A negative number where an unsigned integer is expected.
        (
            r#"{"kind":"rate","rate":-1,"per":"1s"}"#,
            "limits[0].rate",
            "integer `-1`",
        ),
        // A float where an integer is expected.
        (
            r#"{"kind":"rate","rate":1.5,"per":"1s"}"#,
            "limits[0].rate",
            "floating point `1.5`",
        ),
        (
            r#"{"kind":"window","limit":2.0,"window":"1m"}"#,
            "limits[0].limit",
            "floating point `2.0`",
        ),
        // A string for a number.
        (
            r#"{"kind":"concurrency","max":"3"}"#,
            "limits[0].max",
            "\"3\"",
        ),
    ];
    for (item, field, part) in cases {
        rejects(&one(item), field, part);
    }
    // The largest accepted value.
    compile(&one(
        r#"{"kind":"rate","rate":9007199254740991,"per":"1s"}"#,
    ))
    .unwrap();
}

#[test]
fn bad_shapes() {
    let cases = [
        // Unknown field in an item.
        (
            one(r#"{"kind":"rate","rate":1,"per":"1s","brust":2}"#),
            "limits[0].brust",
            "unknown field",
        ),
        // Unknown field at the policy level.
        (
            r#"{"limits":[{"kind":"gap","min":"1s"}],"onlimit":"delay"}"#.to_owned(),
            "onlimit",
            "unknown field",
        ),
        // Unknown kind.
        (
            one(r#"{"kind":"bucket","rate":1,"per":"1s"}"#),
            "limits[0].kind",
            "unknown variant `bucket`",
        ),
        // No kind at all.
        (one(r#"{"rate":1,"per":"1s"}"#), "limits[0]", "kind"),
        // A missing required field.
        (
            one(r#"{"kind":"rate","rate":1}"#),
            "limits[0].per",
            "required for a rate item",
        ),
        // A field of another kind.
        (
            one(r#"{"kind":"gap","min":"1s","burst":2}"#),
            "limits[0].burst",
            "not a field of a gap item",
        ),
        (
            one(r#"{"kind":"concurrency","max":1,"per":"1s"}"#),
            "limits[0].per",
            "not a field of a concurrency item",
        ),
        // Unknown enum values.
        (
            one(r#"{"kind":"window","limit":1,"window":"1m","align":"sliding"}"#),
            "limits[0].align",
            "unknown variant `sliding`",
        ),
        (
            r#"{"limits":[{"kind":"gap","min":"1s"}],"on_limit":"queue"}"#.to_owned(),
            "on_limit",
            "unknown variant `queue`",
        ),
    ];
    for (json, field, part) in &cases {
        rejects(json, field, part);
    }
}

#[test]
fn bad_durations() {
    // Durations are <positive integer><ms|s|m|h|d|w>, plus mo for calendar
    // periods; no compounds, no fractions, no spaces, at most 10 000 days.
    for bad in [
        "1h30m", "1.5s", "0s", "-1s", "+1s", "1 s", "1S", "1y", "s", "1", "", "10001d",
    ] {
        rejects(
            &one(&format!(r#"{{"kind":"rate","rate":1,"per":"{bad}"}}"#)),
            "limits[0].per",
            &format!("{bad:?}"),
        );
    }
    // A number is not a duration (it is an adaptive item's min).
    rejects(
        &one(r#"{"kind":"gap","min":1000}"#),
        "limits[0].min",
        "a duration",
    );
    // "mo" only for calendar windows and budgets.
    rejects(
        &one(r#"{"kind":"rate","rate":1,"per":"1mo"}"#),
        "limits[0].per",
        "months",
    );
    rejects(
        &one(r#"{"kind":"gap","min":"1mo"}"#),
        "limits[0].min",
        "months",
    );
    rejects(
        &one(r#"{"kind":"window","limit":1,"window":"1mo","align":"fixed"}"#),
        "limits[0].window",
        "months",
    );
    rejects(
        &one(r#"{"kind":"window","limit":1,"window":"1mo"}"#),
        "limits[0].window",
        "months",
    );
    compile(&one(r#"{"kind":"rate","rate":1,"per":"10000d"}"#)).unwrap();
}

#[test]
fn bad_windows() {
    let cases = [
        // Calendar windows are 1h, 1d, 1w or 1mo.
        (
            r#"{"kind":"window","limit":1,"window":"2d","align":"calendar"}"#,
            "limits[0].window",
            "1h, 1d, 1w, 1mo",
        ),
        (
            r#"{"kind":"window","limit":1,"window":"60m","align":"calendar"}"#,
            "limits[0].window",
            "got \"60m\"",
        ),
        // Unknown time zone.
        (
            r#"{"kind":"window","limit":1,"window":"1d","align":"calendar","tz":"Mars/Olympus"}"#,
            "limits[0].tz",
            "Mars/Olympus",
        ),
        // tz on a non-calendar window (fixed, or rolling by default).
        (
            r#"{"kind":"window","limit":1,"window":"1d","align":"fixed","tz":"UTC"}"#,
            "limits[0].tz",
            "calendar",
        ),
        (
            r#"{"kind":"window","limit":1,"window":"1d","tz":"Europe/Paris"}"#,
            "limits[0].tz",
            "calendar",
        ),
        // precision on a fixed or calendar window.
        (
            r#"{"kind":"window","limit":1,"window":"1m","align":"fixed","precision":"approximate"}"#,
            "limits[0].precision",
            "rolling",
        ),
        (
            r#"{"kind":"window","limit":1,"window":"1d","align":"calendar","precision":"exact"}"#,
            "limits[0].precision",
            "rolling",
        ),
        (
            r#"{"kind":"window","limit":1,"window":"1m","precision":"fuzzy"}"#,
            "limits[0].precision",
            "unknown variant `fuzzy`",
        ),
        // Exact rolling windows allow limit ≤ 4096; the message suggests approximate.
        (
            r#"{"kind":"window","limit":5000,"window":"1h"}"#,
            "limits[0].limit",
            "\"precision\": \"approximate\"",
        ),
        (
            r#"{"kind":"window","limit":4097,"window":"1h","precision":"exact"}"#,
            "limits[0].limit",
            "4096",
        ),
    ];
    for (item, field, part) in cases {
        rejects(&one(item), field, part);
    }
    compile(&one(r#"{"kind":"window","limit":4096,"window":"1h"}"#)).unwrap();
    compile(&one(
        r#"{"kind":"window","limit":5000,"window":"1h","precision":"approximate"}"#,
    ))
    .unwrap();
}

#[test]
fn bad_budgets() {
    let w23 = vec!["1"; 23].join(",");
    let mut neg = vec!["1"; 24];
    neg[3] = "-0.5";
    let neg = neg.join(",");
    let zeros = vec!["0"; 24].join(",");
    // 0.0004 rounds to 0 thousandths: the sum is still zero.
    let tiny = vec!["0.0004"; 24].join(",");
    let big = {
        let mut w = vec!["1"; 24];
        w[0] = "1000.5";
        w.join(",")
    };
    let cases = [
        (
            format!(r#"{{"kind":"budget","amount":100,"pacing":{{"profile":[{w23}]}}}}"#),
            "limits[0].pacing.profile",
            "24 weights",
        ),
        (
            format!(r#"{{"kind":"budget","amount":100,"pacing":{{"profile":[{neg}]}}}}"#),
            "limits[0].pacing.profile[3]",
            "-0.5",
        ),
        (
            format!(r#"{{"kind":"budget","amount":100,"pacing":{{"profile":[{zeros}]}}}}"#),
            "limits[0].pacing.profile",
            "positive sum",
        ),
        (
            format!(r#"{{"kind":"budget","amount":100,"pacing":{{"profile":[{tiny}]}}}}"#),
            "limits[0].pacing.profile",
            "positive sum",
        ),
        (
            format!(r#"{{"kind":"budget","amount":100,"pacing":{{"profile":[{big}]}}}}"#),
            "limits[0].pacing.profile[0]",
            "1000.5",
        ),
        // Adaptive pacing takes an optional profile, checked the same way.
        (
            format!(
                r#"{{"kind":"budget","amount":100,"pacing":{{"adaptive":{{"profile":[{neg}]}}}}}}"#
            ),
            "limits[0].pacing.adaptive.profile[3]",
            "-0.5",
        ),
        (
            format!(
                r#"{{"kind":"budget","amount":100,"per":"1h","pacing":{{"adaptive":{{"profile":[{}]}}}}}}"#,
                vec!["1"; 24].join(",")
            ),
            "limits[0].pacing.adaptive.profile",
            "1d, 1w or 1mo",
        ),
        (
            r#"{"kind":"budget","amount":100,"pacing":{"adaptive":{"weights":[]}}}"#.to_owned(),
            "limits[0].pacing.adaptive.weights",
            "unknown field",
        ),
        (
            r#"{"kind":"budget","amount":100,"pacing":"smooth"}"#.to_owned(),
            "limits[0].pacing",
            "\"adaptive\"",
        ),
        // Throttle pacing takes an optional profile too.
        (
            format!(
                r#"{{"kind":"budget","amount":100,"pacing":{{"throttle":{{"profile":[{neg}]}}}}}}"#
            ),
            "limits[0].pacing.throttle.profile[3]",
            "-0.5",
        ),
        (
            r#"{"kind":"budget","amount":100,"pacing":{"throttle":{"weights":[]}}}"#.to_owned(),
            "limits[0].pacing.throttle.weights",
            "unknown field",
        ),
        (
            r#"{"kind":"budget","amount":100,"pacing":"throttled"}"#.to_owned(),
            "limits[0].pacing",
            "\"throttle\"",
        ),
        // A profile splits a period by local hour: not for an hourly budget.
        (
            format!(
                r#"{{"kind":"budget","amount":100,"per":"1h","pacing":{{"profile":[{}]}}}}"#,
                vec!["1"; 24].join(",")
            ),
            "limits[0].pacing.profile",
            "1d, 1w or 1mo",
        ),
        // Tolerance is a fraction from 0 to 1.
        (
            r#"{"kind":"budget","amount":100,"tolerance":2}"#.to_owned(),
            "limits[0].tolerance",
            "got 2",
        ),
        (
            r#"{"kind":"budget","amount":100,"tolerance":-0.01}"#.to_owned(),
            "limits[0].tolerance",
            "-0.01",
        ),
        // Budget periods are calendar periods.
        (
            r#"{"kind":"budget","amount":100,"per":"2d"}"#.to_owned(),
            "limits[0].per",
            "1h, 1d, 1w, 1mo",
        ),
        (
            r#"{"kind":"budget","amount":100,"tz":"Nowhere/City"}"#.to_owned(),
            "limits[0].tz",
            "Nowhere/City",
        ),
    ];
    for (item, field, part) in &cases {
        rejects(&one(item), field, part);
    }
}

#[test]
fn bad_stacks() {
    // Empty limits.
    rejects(r#"{"limits":[]}"#, "limits", "at least one");
    // Missing limits.
    rejects(r#"{}"#, "", "missing field `limits`");
    // Duplicate names, explicit...
    rejects(
        r#"{"limits":[{"name":"a","kind":"gap","min":"1s"},{"name":"a","kind":"concurrency","max":1}]}"#,
        "limits[1].name",
        "\"a\"",
    );
    // ...or against a default name <kind>-<index>.
    rejects(
        r#"{"limits":[{"name":"rate-1","kind":"gap","min":"1s"},{"kind":"rate","rate":1,"per":"1s"}]}"#,
        "limits[1].name",
        "\"rate-1\"",
    );
    // Bad name characters.
    rejects(
        r#"{"limits":[{"name":"a b","kind":"gap","min":"1s"}]}"#,
        "limits[0].name",
        "A-Z a-z 0-9",
    );
    // A shorter window with a higher limit can never bind: rejected, naming it.
    rejects(
        r#"{"limits":[
            {"kind":"window","limit":5,"window":"1w","align":"calendar"},
            {"kind":"window","limit":10,"window":"1d","align":"calendar"}]}"#,
        "limits[1].limit",
        "never bind",
    );
    rejects(
        r#"{"limits":[
            {"kind":"window","limit":100,"window":"1m","align":"fixed"},
            {"kind":"window","limit":50,"window":"1h"}]}"#,
        "limits[0].limit",
        "never bind",
    );
    // Delay mode needs max_delay_ms, in 1..=3 600 000, and only with delay.
    rejects(
        r#"{"limits":[{"kind":"gap","min":"1s"}],"on_limit":"delay"}"#,
        "max_delay_ms",
        "required",
    );
    rejects(
        r#"{"limits":[{"kind":"gap","min":"1s"}],"on_limit":"delay","max_delay_ms":0}"#,
        "max_delay_ms",
        "got 0",
    );
    rejects(
        r#"{"limits":[{"kind":"gap","min":"1s"}],"on_limit":"delay","max_delay_ms":3600001}"#,
        "max_delay_ms",
        "3600001",
    );
    rejects(
        r#"{"limits":[{"kind":"gap","min":"1s"}],"max_delay_ms":100}"#,
        "max_delay_ms",
        "delay",
    );
    rejects(
        r#"{"limits":[{"kind":"gap","min":"1s"}],"on_limit":"reject","max_delay_ms":100}"#,
        "max_delay_ms",
        "delay",
    );
    // Syntax errors are reported too.
    assert!(compile(r#"{"limits":[{"kind":"gap","min":"1s"}"#).is_err());
}

#[test]
fn same_length_windows_are_a_warning() {
    let p = compile(
        r#"{"limits":[
            {"kind":"window","limit":10,"window":"1h","align":"fixed"},
            {"kind":"window","limit":10,"window":"60m"}]}"#,
    )
    .unwrap();
    assert_eq!(p.warnings.len(), 1, "{:?}", p.warnings);
    assert_eq!(p.warnings[0].field, "limits[1]");
    assert!(
        p.warnings[0].message.contains("redundant"),
        "{:?}",
        p.warnings
    );
    // Different limits: still a warning (the lower limit decides), not an error.
    let p = compile(
        r#"{"limits":[
            {"kind":"window","limit":10,"window":"1d","align":"calendar"},
            {"kind":"window","limit":20,"window":"24h","align":"fixed"}]}"#,
    )
    .unwrap();
    assert_eq!(p.warnings.len(), 1);
    assert_eq!(p.warnings[0].field, "limits[1]");
    // A consistent stack has none.
    let p = compile(
        r#"{"limits":[
            {"kind":"window","limit":10,"window":"1h","align":"fixed"},
            {"kind":"window","limit":100,"window":"1d","align":"fixed"}]}"#,
    )
    .unwrap();
    assert!(p.warnings.is_empty());
}

const FULL_JSON: &str = r#"{
  "limits": [
    {"name": "per-second", "kind": "rate", "rate": 5, "per": "1s", "burst": 10},
    {"kind": "gap", "min": "250ms"},
    {"name": "hourly", "kind": "window", "limit": 1000, "window": "1h", "align": "fixed"},
    {"kind": "window", "limit": 5000, "window": "1d", "align": "calendar", "tz": "Europe/Paris"},
    {"kind": "window", "limit": 20000, "window": "1w", "precision": "approximate"},
    {"kind": "window", "limit": 100000, "window": "1mo", "align": "calendar"},
    {"kind": "budget", "amount": 100000, "per": "1d", "pacing": "even", "tolerance": 0.02,
     "tz": "America/New_York"},
    {"kind": "budget", "amount": 700, "per": "1w", "pacing":
      {"profile": [0.5, 0.25, 0.125, 0.5, 0.5, 0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5,
                   7.5, 8.5, 9.5, 10.5, 11.5, 12.5, 13.5, 14.5, 15.5, 16.5, 17.5, 18.5]}},
    {"kind": "budget", "amount": 50, "pacing": "asap"},
    {"name": "adaptive-flat", "kind": "budget", "amount": 60, "pacing": "adaptive"},
    {"name": "adaptive-evening", "kind": "budget", "amount": 70, "pacing":
      {"adaptive": {"profile": [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0]}}},
    {"name": "in-flight", "kind": "concurrency", "max": 10}
  ],
  "on_limit": "delay",
  "max_delay_ms": 500
}"#;

#[test]
fn valid_definition_round_trips_to_the_same_json_value() {
    let policy: PolicyDef = from_json(FULL_JSON).unwrap();
    let compiled = policy.compile().unwrap();
    assert!(compiled.warnings.is_empty(), "{:?}", compiled.warnings);
    assert_eq!(compiled.stack.items().len(), 12);
    assert_eq!(compiled.stack.name(1), "gap-1");
    // Serialized back, it is the same JSON value: absent fields stay absent,
    // durations keep the unit they were written with.
    let given: serde_json::Value = serde_json::from_str(FULL_JSON).unwrap();
    let back = serde_json::to_value(&policy).unwrap();
    assert_eq!(back, given);
    // And parsing the output again gives the same definition.
    let again: PolicyDef = from_json(&serde_json::to_string(&policy).unwrap()).unwrap();
    assert_eq!(again, policy);
    // Numbers keep the form they were written in: `"tolerance": 0` and integer
    // weights come back as integers, fractions as fractions.
    let json = one(&format!(
        r#"{{"kind":"budget","amount":5,"tolerance":0,"pacing":{{"profile":[{},0.5]}}}}"#,
        vec!["1"; 23].join(",")
    ));
    let p: PolicyDef = from_json(&json).unwrap();
    let given: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(serde_json::to_value(&p).unwrap(), given);
    let again: PolicyDef = from_json(&serde_json::to_string(&p).unwrap()).unwrap();
    assert_eq!(again, p);
    // Minimal items stay minimal.
    for item in [
        r#"{"kind":"rate","rate":1,"per":"60m"}"#,
        r#"{"kind":"window","limit":3,"window":"1d"}"#,
        r#"{"kind":"budget","amount":1}"#,
    ] {
        let json = one(item);
        let p: PolicyDef = from_json(&json).unwrap();
        let given: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(serde_json::to_value(&p).unwrap(), given, "{json}");
    }
}

#[test]
fn toml_parses_to_the_same_policy() {
    let toml = r#"
on_limit = "delay"
max_delay_ms = 500

[[limits]]
name = "per-second"
kind = "rate"
rate = 5
per = "1s"
burst = 10

[[limits]]
kind = "gap"
min = "250ms"

[[limits]]
name = "hourly"
kind = "window"
limit = 1000
window = "1h"
align = "fixed"

[[limits]]
kind = "window"
limit = 5000
window = "1d"
align = "calendar"
tz = "Europe/Paris"

[[limits]]
kind = "window"
limit = 20000
window = "1w"
precision = "approximate"

[[limits]]
kind = "window"
limit = 100000
window = "1mo"
align = "calendar"

[[limits]]
kind = "budget"
amount = 100000
per = "1d"
pacing = "even"
tolerance = 0.02
tz = "America/New_York"

[[limits]]
kind = "budget"
amount = 700
per = "1w"
pacing = { profile = [0.5, 0.25, 0.125, 0.5, 0.5, 0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5,
                      7.5, 8.5, 9.5, 10.5, 11.5, 12.5, 13.5, 14.5, 15.5, 16.5, 17.5, 18.5] }

[[limits]]
kind = "budget"
amount = 50
pacing = "asap"

[[limits]]
name = "adaptive-flat"
kind = "budget"
amount = 60
pacing = "adaptive"

[[limits]]
name = "adaptive-evening"
kind = "budget"
amount = 70
pacing = { adaptive = { profile = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                   0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0] } }

[[limits]]
name = "in-flight"
kind = "concurrency"
max = 10
"#;
    let parsed: PolicyDef = from_toml(toml).unwrap();
    let same: PolicyDef = from_json(FULL_JSON).unwrap();
    assert_eq!(parsed, same);
    parsed.compile().unwrap();

    // TOML errors name the field as JSON ones do.
    let e =
        from_toml::<PolicyDef>("[[limits]]\nkind = \"rate\"\nrate = 5\nper = \"1s\"\nburst = -3\n")
            .unwrap_err();
    assert_eq!(e.field, "limits[0].burst", "{e}");
    let e = from_toml::<PolicyDef>("[[limits]]\nkind = \"gap\"\nmin = \"1h30m\"\n").unwrap_err();
    assert_eq!(e.field, "limits[0].min", "{e}");
    // Validation errors are the same whatever the syntax.
    let e = from_toml::<PolicyDef>("[[limits]]\nkind = \"rate\"\nrate = 0\nper = \"1s\"\n")
        .unwrap()
        .compile()
        .unwrap_err();
    assert_eq!(e.field, "limits[0].rate");
    // Broken TOML.
    assert!(from_toml::<PolicyDef>("[[limits]\nkind = ").is_err());
}

// ------------------------------------------------ wrong types, every field ----

/// A value of the wrong JSON type for each kind of field: an integer field
/// gets a string, a negative number, a fraction and a boolean; a string field
/// a number; an enum field a number; an object or list an integer.
fn wrong_types(field_type: &str) -> &'static [&'static str] {
    match field_type {
        "integer" => &[r#""3""#, "-3", "1.5", "true", "[3]"],
        "string" => &["3", "true", r#"["1s"]"#, r#"{"a":1}"#],
        "number" => &[r#""0.01""#, "true", "[0.5]"],
        "pacing" => &["3", "true", "[1]"],
        "list" => &["3", r#""x""#, r#"{"a":1}"#],
        other => panic!("no wrong values for {other}"),
    }
}

/// A limit kind's fields as (field, type).
type Fields = &'static [(&'static str, &'static str)];

/// Every field of every limit kind, with a valid item of that kind (JSON
/// object members without braces) and the field's type.
const ITEM_FIELDS: &[(&str, &str, Fields)] = &[
    (
        "rate",
        r#""kind":"rate","rate":5,"per":"1s","burst":10,"name":"r""#,
        &[
            ("kind", "string"),
            ("name", "string"),
            ("rate", "integer"),
            ("per", "string"),
            ("burst", "integer"),
        ],
    ),
    (
        "gap",
        r#""kind":"gap","min":"1s","name":"g""#,
        &[("kind", "string"), ("name", "string"), ("min", "string")],
    ),
    (
        "window",
        r#""kind":"window","limit":3,"window":"1d","align":"rolling","precision":"exact","name":"w""#,
        &[
            ("kind", "string"),
            ("name", "string"),
            ("limit", "integer"),
            ("window", "string"),
            ("align", "string"),
            ("precision", "string"),
        ],
    ),
    (
        "calendar window",
        r#""kind":"window","limit":3,"window":"1d","align":"calendar","tz":"UTC""#,
        &[("tz", "string")],
    ),
    (
        "budget",
        r#""kind":"budget","amount":100,"per":"1d","pacing":"even","tolerance":0.01,"tz":"UTC","name":"b""#,
        &[
            ("kind", "string"),
            ("name", "string"),
            ("amount", "integer"),
            ("per", "string"),
            ("pacing", "pacing"),
            ("tolerance", "number"),
            ("tz", "string"),
        ],
    ),
    (
        "concurrency",
        r#""kind":"concurrency","max":2,"name":"c""#,
        &[("kind", "string"), ("name", "string"), ("max", "integer")],
    ),
];

/// `item` (members without braces) with `field` set to `value`.
fn with_field(item: &str, field: &str, value: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(&format!("{{{item}}}")).unwrap();
    let mut m = v.as_object().unwrap().clone();
    m.insert(field.into(), serde_json::from_str(value).unwrap());
    serde_json::Value::Object(m).to_string()
}

#[track_caller]
fn parse_rejects<T: serde::de::DeserializeOwned + std::fmt::Debug>(json: &str, field: &str) {
    match from_json::<T>(json) {
        Ok(v) => panic!("accepted: {json} as {v:?}"),
        Err(e) => assert_eq!(e.field, field, "field for {json}: {e}"),
    }
}

#[test]
fn a_wrong_type_names_the_innermost_field_of_a_policy_item() {
    for (kind, item, fields) in ITEM_FIELDS {
        // The item as given is valid.
        compile(&one(&format!("{{{item}}}"))).unwrap_or_else(|e| panic!("{kind}: {e}"));
        for (field, ty) in *fields {
            for bad in wrong_types(ty) {
                let json = one(&with_field(item, field, bad));
                parse_rejects::<PolicyDef>(&json, &format!("limits[0].{field}"));
                // The second item of a stack is named by its own index.
                let two = format!(
                    r#"{{"limits":[{{"kind":"gap","min":"1m","name":"first"}},{}]}}"#,
                    with_field(item, field, bad)
                );
                parse_rejects::<PolicyDef>(&two, &format!("limits[1].{field}"));
            }
        }
    }
    // The policy's own fields.
    for (json, field) in [
        (r#"{"limits":3}"#, "limits"),
        (r#"{"limits":[3]}"#, "limits[0]"),
        (
            r#"{"limits":[{"kind":"gap","min":"1s"}],"on_limit":3}"#,
            "on_limit",
        ),
        (
            r#"{"limits":[{"kind":"gap","min":"1s"}],"on_limit":"delay","max_delay_ms":"5"}"#,
            "max_delay_ms",
        ),
        (
            r#"{"limits":[{"kind":"gap","min":"1s"}],"on_limit":"delay","max_delay_ms":-5}"#,
            "max_delay_ms",
        ),
    ] {
        parse_rejects::<PolicyDef>(json, field);
    }
}

/// Pacing profiles: a wrong weight or a wrong shape inside names its place.
#[test]
fn a_wrong_type_inside_a_pacing_profile_names_its_place() {
    let mut w: Vec<String> = vec!["1".into(); 24];
    w[5] = r#""x""#.into();
    let bad = w.join(",");
    let cases = [
        (format!(r#"{{"profile":[{bad}]}}"#), "pacing.profile[5]"),
        (r#"{"profile":"x"}"#.to_owned(), "pacing.profile"),
        (r#"{"profile":[1],"extra":1}"#.to_owned(), "pacing.extra"),
        (
            format!(r#"{{"adaptive":{{"profile":[{bad}]}}}}"#),
            "pacing.adaptive.profile[5]",
        ),
        (r#"{"adaptive":3}"#.to_owned(), "pacing.adaptive"),
        (
            r#"{"adaptive":{"profile":3}}"#.to_owned(),
            "pacing.adaptive.profile",
        ),
    ];
    for (pacing, field) in &cases {
        let item = format!(r#"{{"kind":"budget","amount":100,"pacing":{pacing}}}"#);
        parse_rejects::<PolicyDef>(&one(&item), &format!("limits[0].{field}"));
        let campaign = format!(r#"{{"budget":{{"amount":100,"pacing":{pacing}}}}}"#);
        parse_rejects::<CampaignDef>(&campaign, &format!("budget.{field}"));
    }
}

#[test]
fn a_wrong_type_names_the_innermost_field_of_a_campaign() {
    // Caps: rate, gap and window items with a scope.
    for (kind, item, fields) in ITEM_FIELDS {
        if !["rate", "gap", "window", "calendar window"].contains(kind) {
            continue;
        }
        let item = format!(r#"{item},"scope":"user""#);
        let valid = format!(r#"{{"caps":[{{{item}}}]}}"#);
        from_json::<CampaignDef>(&valid)
            .unwrap()
            .compile()
            .unwrap_or_else(|e| panic!("{kind}: {e}"));
        for (field, ty) in fields
            .iter()
            .copied()
            .chain([("scope", "string"), ("missing", "string")])
        {
            for bad in wrong_types(ty) {
                let cap = with_field(&item, field, bad);
                parse_rejects::<CampaignDef>(
                    &format!(r#"{{"caps":[{cap}]}}"#),
                    &format!("caps[0].{field}"),
                );
                parse_rejects::<CampaignDef>(
                    &format!(r#"{{"caps":[{{"kind":"gap","min":"1h","name":"first"}},{cap}]}}"#),
                    &format!("caps[1].{field}"),
                );
            }
        }
    }
    // The budget: a budget item whose kind may be left out.
    let (_, budget, fields) = ITEM_FIELDS.iter().find(|(k, ..)| *k == "budget").unwrap();
    from_json::<CampaignDef>(&format!(r#"{{"budget":{{{budget}}}}}"#))
        .unwrap()
        .compile()
        .unwrap();
    for (field, ty) in *fields {
        for bad in wrong_types(ty) {
            let b = with_field(budget, field, bad);
            parse_rejects::<CampaignDef>(
                &format!(r#"{{"budget":{b}}}"#),
                &format!("budget.{field}"),
            );
        }
    }
    // The campaign's own fields.
    for (field, ty) in [
        ("parent", "string"),
        ("tz", "string"),
        ("unknown_user", "string"),
        ("max_in_flight", "integer"),
        ("caps", "list"),
        ("budget", "list"),
    ] {
        for bad in wrong_types(ty) {
            // A list is the right type for `caps`; an object for `budget`.
            if (field, *bad) == ("budget", r#"{"a":1}"#) {
                continue;
            }
            parse_rejects::<CampaignDef>(&format!(r#"{{"{field}":{bad}}}"#), field);
        }
    }
    parse_rejects::<CampaignDef>(r#"{"caps":[3]}"#, "caps[0]");
    // The issue's cases.
    for limit in [r#""3""#, "-3"] {
        let json = format!(
            r#"{{"caps":[{{"kind":"window","limit":{limit},"window":"1d","scope":"campaign"}}]}}"#
        );
        parse_rejects::<CampaignDef>(&json, "caps[0].limit");
    }
}

/// `exclusion_labels` and `max_per_screen` are checked over HTTP, the 400
/// naming the field, and a rejected PUT leaves nothing behind.
#[test]
fn campaign_screen_rules_name_the_field() {
    use std::sync::Arc;
    let mut r = freqcap::replay::Replayer::new(
        Arc::new(freqcap::store::MemoryStore::new()),
        freqcap::engine::EngineOptions::default(),
        freqcap::api::ApiOptions::default(),
    )
    .unwrap();
    let seventeen: Vec<String> = (0..17).map(|i| format!("l{i}")).collect();
    let too_many = serde_json::json!({ "exclusion_labels": seventeen }).to_string();
    let long = format!(r#"{{"exclusion_labels": ["{}"]}}"#, "a".repeat(65));
    for (def, field) in [
        (r#"{"exclusion_labels": ["ok", ""]}"#, "exclusion_labels[1]"),
        (
            r#"{"exclusion_labels": ["has space"]}"#,
            "exclusion_labels[0]",
        ),
        (long.as_str(), "exclusion_labels[0]"),
        (r#"{"exclusion_labels": ["a", "a"]}"#, "exclusion_labels[1]"),
        (too_many.as_str(), "exclusion_labels"),
        (r#"{"exclusion_labels": "auto"}"#, "exclusion_labels"),
        (r#"{"exclusion_labels": [3]}"#, "exclusion_labels"),
        (r#"{"max_per_screen": 0}"#, "max_per_screen"),
        (r#"{"max_per_screen": 10001}"#, "max_per_screen"),
        (r#"{"max_per_screen": -1}"#, "max_per_screen"),
        (r#"{"max_per_screen": "2"}"#, "max_per_screen"),
        (r#"{"pacing_levers": true}"#, "pacing_levers"),
        (
            r#"{"pacing_levers": "yes", "budget": {"amount": 10}}"#,
            "pacing_levers",
        ),
    ] {
        let line =
            format!(r#"{{"at_ms":1000,"method":"PUT","path":"/v1/campaigns/c","body":{def}}}"#);
        let out = r.line(&line);
        assert_eq!(out["status"], 400, "{def}: {out}");
        let message = out["body"]["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(field), "{def}: {message}");
    }
    let out = r.line(r#"{"at_ms":1000,"method":"GET","path":"/v1/campaigns/c"}"#);
    assert_eq!(out["status"], 404, "{out}");
    let ok = r#"{"exclusion_labels": ["auto", "x:y.z_1-2"], "max_per_screen": 10000}"#;
    let line = format!(r#"{{"at_ms":1000,"method":"PUT","path":"/v1/campaigns/c","body":{ok}}}"#);
    assert_eq!(r.line(&line)["status"], 200);
    let out = r.line(r#"{"at_ms":1000,"method":"GET","path":"/v1/campaigns/c"}"#);
    assert_eq!(out["body"]["exclusion_labels"][1], "x:y.z_1-2", "{out}");
    assert_eq!(out["body"]["max_per_screen"], 10000, "{out}");
}

/// Inline limits of a check are read as a policy's items are.
#[test]
fn a_wrong_type_in_inline_limits_names_the_field() {
    use std::sync::Arc;
    let mut r = freqcap::replay::Replayer::new(
        Arc::new(freqcap::store::MemoryStore::new()),
        freqcap::engine::EngineOptions::default(),
        freqcap::api::ApiOptions::default(),
    )
    .unwrap();
    for (kind, item, fields) in ITEM_FIELDS {
        for (field, ty) in *fields {
            for bad in wrong_types(ty) {
                let body = format!(
                    r#"{{"key":"k","limits":[{{"kind":"gap","min":"1s","name":"first"}},{}]}}"#,
                    with_field(item, field, bad)
                );
                let line =
                    format!(r#"{{"at_ms":1000,"method":"POST","path":"/v1/check","body":{body}}}"#);
                let out = r.line(&line);
                assert_eq!(out["status"], 400, "{kind}.{field} = {bad}: {out}");
                let message = out["body"]["error"]["message"].as_str().unwrap();
                assert!(
                    message.starts_with(&format!("limits[1].{field}: ")),
                    "{kind}.{field} = {bad}: {message}"
                );
            }
        }
    }
}

// ------------------------------------------------------------ item count ----

#[test]
fn a_stack_has_at_most_64_items() {
    // Items are told apart by an index kept in 8 bits; 64 is the cap.
    let items = |n: usize| {
        (0..n)
            .map(|_| r#"{"kind":"rate","rate":1,"per":"1s"}"#)
            .collect::<Vec<_>>()
            .join(",")
    };
    let p = compile(&format!(r#"{{"limits":[{}]}}"#, items(64))).unwrap();
    assert_eq!(p.stack.items().len(), 64);
    for n in [65, 256, 257] {
        rejects(
            &format!(r#"{{"limits":[{}]}}"#, items(n)),
            "limits",
            "at most 64",
        );
    }
    // Campaign caps alike.
    let caps = |n: usize| {
        let v: Vec<String> = (0..n)
            .map(|i| format!(r#"{{"kind":"gap","min":"{}s"}}"#, i + 1))
            .collect();
        format!(r#"{{"caps":[{}]}}"#, v.join(","))
    };
    from_json::<CampaignDef>(&caps(64))
        .unwrap()
        .compile()
        .unwrap();
    let e = from_json::<CampaignDef>(&caps(65))
        .unwrap()
        .compile()
        .unwrap_err();
    assert_eq!(e.field, "caps", "{e}");
    assert!(e.message.contains("at most 64"), "{e}");
}
