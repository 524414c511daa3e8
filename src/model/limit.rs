//! Limit and policy definitions as users write them (JSON or TOML), and their
//! validation into compiled [`crate::limits`] items.
//!
//! Definitions keep exactly what was written (optional fields stay absent), so a
//! stored definition is returned as it was given; defaults are applied when
//! compiling.

use jiff::tz::TimeZone;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::MAX_EXACT;
use crate::clock::MS;
use crate::limits::adaptive::Adaptive;
use crate::limits::budget::{Budget, Pacing as CompiledPacing};
use crate::limits::calendar::{Calendar, CalendarUnit};
use crate::limits::concurrency::Concurrency;
use crate::limits::priority::{Classes, Priority, Share, Shares, WHOLE};
use crate::limits::rate::Rate;
use crate::limits::stack::{OnLimit as CompiledOnLimit, Stack};
use crate::limits::window::{Layout, MAX_EXACT_ROLLING_LIMIT, Window};
use crate::limits::{Item, Kind};
use crate::model::duration::Duration;
use crate::model::error::{DefinitionError, Warning};

/// The most items one stack (a policy, or the inline limits of a check) may
/// have: every item is looked up by tag on each decision, and 64 is far
/// more than a real policy needs.
pub const MAX_ITEMS: usize = 64;

/// The longest item name; names appear in HTTP headers.
pub const MAX_NAME_LEN: usize = 64;

/// One limit item. `kind` selects the algorithm (docs/semantics.md §2).
///
/// Serialized with `kind` as a tag; deserialized through the flat
/// [`super::raw::RawLimit`] so that an error inside an item names its field
/// (`limits[0].rate`) — serde's tagged-enum path buffers the item and would lose it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    tag = "kind",
    rename_all = "lowercase",
    try_from = "super::raw::RawLimit"
)]
pub enum LimitDef {
    Rate(RateDef),
    Gap(GapDef),
    Window(WindowDef),
    Budget(BudgetDef),
    Concurrency(ConcurrencyDef),
    Adaptive(AdaptiveLimitDef),
}

/// The JSON Schema of [`LimitDef`]: the tagged form users write. (Deriving it on
/// `LimitDef` would describe the flat reading form instead.)
#[derive(JsonSchema)]
#[serde(tag = "kind", rename_all = "lowercase")]
#[allow(dead_code)] // only its schema is used
enum LimitSchema {
    /// GCRA: `rate` units per `per`, with bursts of up to `burst` (default `rate`).
    Rate(RateDef),
    /// At least `min` between two events (sugar for rate 1 per `min`, burst 1).
    Gap(GapDef),
    /// A counter over fixed, calendar or rolling windows.
    Window(WindowDef),
    /// Spend per calendar period, paced through it.
    Budget(BudgetDef),
    /// Open reservations at once.
    Concurrency(ConcurrencyDef),
    /// Open reservations at once, up to a limit that moves with the latency
    /// and outcome releases report (docs/adaptive.md).
    Adaptive(AdaptiveLimitDef),
}

impl JsonSchema for LimitDef {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "LimitDef".into()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let mut schema = LimitSchema::json_schema(generator);
        schema.insert(
            "description".into(),
            "One limit item; `kind` selects the algorithm (docs/semantics.md §2).".into(),
        );
        schema
    }
}

/// `{"kind": "rate", "rate": 5, "per": "1s", "burst": 10}`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RateDef {
    /// Reported name (1–64 of `A-Z a-z 0-9 . _ : -`, unique in its stack);
    /// default `<kind>-<index>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = "^[A-Za-z0-9._:-]{1,64}$"))]
    pub name: Option<String>,
    /// How much of this item each priority class may use
    /// (docs/semantics.md §2.5); unnamed classes use all of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priorities: Option<PrioritiesDef>,
    /// Units per period, 1 ≤ rate < 2^53.
    #[schemars(range(min = 1, max = 9_007_199_254_740_991_i64))]
    pub rate: u64,
    /// The period (no months: those are calendar periods).
    #[schemars(extend("not" = {"pattern": "mo$"}))]
    pub per: Duration,
    /// Units that may pass at once after idling; default `rate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 9_007_199_254_740_991_i64))]
    pub burst: Option<u64>,
}

/// `{"kind": "gap", "min": "10m"}`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GapDef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = "^[A-Za-z0-9._:-]{1,64}$"))]
    pub name: Option<String>,
    /// How much of this item each priority class may use
    /// (docs/semantics.md §2.5); unnamed classes use all of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priorities: Option<PrioritiesDef>,
    /// Minimum interval between two events (no months).
    #[schemars(extend("not" = {"pattern": "mo$"}))]
    pub min: Duration,
}

/// How windows are laid out in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Align {
    /// `[k·W, (k+1)·W)` aligned to the Unix epoch.
    Fixed,
    /// The calendar hour/day/week/month in `tz`.
    Calendar,
    /// A sliding window `(now − W, now]`.
    Rolling,
}

/// Exactness of a rolling window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// One entry per debit; limit ≤ 4096.
    Exact,
    /// Two buckets, previous one weighted by overlap; any limit, 24 bytes.
    Approximate,
}

/// `{"kind": "window", "limit": 3, "window": "1d", "align": "calendar", "tz": "Europe/Paris"}`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
// A calendar window is 1h, 1d, 1w or 1mo and may take a `tz`; the others take
// no months and no `tz`. Only rolling windows (the default) take a
// `precision`, and an exact one (the default) allows a limit of at most 4096.
#[schemars(extend("allOf" = [
    {
        "if": {"required": ["align"], "properties": {"align": {"const": "calendar"}}},
        "then": {"properties": {"window": {"enum": ["1h", "1d", "1w", "1mo"]}}},
        "else": {"properties": {"window": {"not": {"pattern": "mo$"}}, "tz": {"type": "null"}}},
    },
    {
        "if": {"required": ["align"], "properties": {"align": {"enum": ["fixed", "calendar"]}}},
        "then": {"properties": {"precision": {"type": "null"}}},
        "else": {
            "if": {"required": ["precision"], "properties": {"precision": {"const": "approximate"}}},
            "else": {"properties": {"limit": {"maximum": 4096}}},
        },
    },
]))]
pub struct WindowDef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = "^[A-Za-z0-9._:-]{1,64}$"))]
    pub name: Option<String>,
    /// How much of this item each priority class may use
    /// (docs/semantics.md §2.5); unnamed classes use all of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priorities: Option<PrioritiesDef>,
    /// Units per window, 1 ≤ limit < 2^53.
    #[schemars(range(min = 1, max = 9_007_199_254_740_991_i64))]
    pub limit: u64,
    /// Window length; for calendar windows one of 1h, 1d, 1w, 1mo.
    pub window: Duration,
    /// Default `rolling`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub align: Option<Align>,
    /// IANA time zone of a calendar window; default UTC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tz: Option<String>,
    /// Rolling windows only; default `exact`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<Precision>,
}

/// `"asap"`, `"even"`, `"adaptive"`, `"throttle"`, `{"profile": [24
/// weights]}`, `{"adaptive": {"profile": [24 weights]}}` or `{"throttle":
/// {"profile": [24 weights]}}`.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum Pacing {
    Mode(PacingMode),
    Profile(ProfileDef),
    Adaptive(AdaptiveDef),
    Throttle(ThrottleDef),
}

impl<'de> Deserialize<'de> for Pacing {
    // By hand, because serde's untagged error ("data did not match any variant")
    // does not tell the user what would.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        let hint = r#"expected "asap", "even", "adaptive", "throttle", {"profile": [24 weights]}, {"adaptive": {"profile": [24 weights]}} or {"throttle": {"profile": [24 weights]}}"#;
        match v {
            serde_json::Value::String(s) => match s.as_str() {
                "asap" => Ok(Pacing::Mode(PacingMode::Asap)),
                "even" => Ok(Pacing::Mode(PacingMode::Even)),
                "adaptive" => Ok(Pacing::Mode(PacingMode::Adaptive)),
                "throttle" => Ok(Pacing::Mode(PacingMode::Throttle)),
                _ => Err(serde::de::Error::custom(format!("{hint}, got {s:?}"))),
            },
            // An error inside names its field (`profile[3]`), joined to the
            // outer path by `crate::model::split_path`.
            v @ serde_json::Value::Object(_) if v.get("adaptive").is_some() => {
                crate::model::nested_error(v, Some(hint)).map(Pacing::Adaptive)
            }
            v @ serde_json::Value::Object(_) if v.get("throttle").is_some() => {
                crate::model::nested_error(v, Some(hint)).map(Pacing::Throttle)
            }
            v @ serde_json::Value::Object(_) => {
                crate::model::nested_error(v, Some(hint)).map(Pacing::Profile)
            }
            other => Err(serde::de::Error::custom(format!("{hint}, got {other}"))),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PacingMode {
    /// The whole amount is available from the period's start.
    Asap,
    /// Spend follows real time through the period.
    Even,
    /// What is left is spread over the rest of the period, re-planned every
    /// local hour, all hours weighing the same.
    Adaptive,
    /// Each request passes with a probability re-planned every minute
    /// (docs/pacing.md, "Levers"); the whole amount is the cap.
    Throttle,
}

/// Share of the period's traffic by local hour.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProfileDef {
    /// 24 non-negative weights (local hours 0–23), each at most 1000, rounded to
    /// thousandths, with a positive sum.
    #[schemars(length(min = 24, max = 24))]
    pub profile: Vec<serde_json::Number>,
}

/// `{"adaptive": {"profile": [24 weights]}}`: adaptive pacing whose remaining
/// time is weighted by a traffic profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AdaptiveDef {
    pub adaptive: AdaptiveSpec,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AdaptiveSpec {
    /// 24 non-negative weights (local hours 0–23), as for profile pacing;
    /// absent: every hour weighs the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 24, max = 24))]
    pub profile: Option<Vec<serde_json::Number>>,
}

/// `{"throttle": {"profile": [24 weights]}}`: throttle pacing whose
/// minute targets follow a traffic profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ThrottleDef {
    pub throttle: AdaptiveSpec,
}

/// `{"kind": "budget", "amount": 100000, "per": "1d", "pacing": "even"}`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BudgetDef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = "^[A-Za-z0-9._:-]{1,64}$"))]
    pub name: Option<String>,
    /// How much of this item each priority class may use
    /// (docs/semantics.md §2.5); unnamed classes use all of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priorities: Option<PrioritiesDef>,
    /// Cost units per period, 1 ≤ amount < 2^53.
    #[schemars(range(min = 1, max = 9_007_199_254_740_991_i64))]
    pub amount: u64,
    /// Calendar period: 1h, 1d (default), 1w or 1mo; in a campaign with a
    /// `flight`, also "flight": the whole flight (docs/semantics.md §6.7).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["1h", "1d", "1w", "1mo", "flight", null]))]
    pub per: Option<Duration>,
    /// Default `even`. `adaptive` spreads what is left over the rest of the
    /// period; `throttle` lets each request pass with a probability
    /// re-planned every minute (docs/pacing.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pacing: Option<Pacing>,
    /// Fraction of amount that spend may run ahead of the pacing line, 0–1,
    /// rounded to basis points; default 0.01.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1))]
    pub tolerance: Option<serde_json::Number>,
    /// IANA time zone of the period; default UTC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tz: Option<String>,
    /// What `amount` counts: `spend` (default: each commit's cost) or
    /// `impressions` (each commit counts 1, whatever its cost).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goal: Option<Goal>,
}

/// What a budget's amount counts (docs/semantics.md §2.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Goal {
    /// Cost units: each commit's cost (the default).
    Spend,
    /// Commits: each counts 1, whatever its cost.
    Impressions,
}

/// `{"kind": "concurrency", "max": 10}`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConcurrencyDef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = "^[A-Za-z0-9._:-]{1,64}$"))]
    pub name: Option<String>,
    /// How much of this item each priority class may use
    /// (docs/semantics.md §2.5); unnamed classes use all of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priorities: Option<PrioritiesDef>,
    /// Open reservations at once, 1 ≤ max < 2^53.
    #[schemars(range(min = 1, max = 9_007_199_254_740_991_i64))]
    pub max: u64,
}

/// `{"kind": "adaptive", "max": 200}`: a concurrency limit between `min`
/// and `max` that the samples releases and commits carry move
/// (docs/adaptive.md, "In the engine").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AdaptiveLimitDef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("pattern" = "^[A-Za-z0-9._:-]{1,64}$"))]
    pub name: Option<String>,
    /// How much of this item each priority class may use
    /// (docs/semantics.md §2.5); unnamed classes use all of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priorities: Option<PrioritiesDef>,
    /// The ceiling, 1 ≤ max ≤ 1 000 000.
    #[schemars(range(min = 1, max = 1_000_000))]
    pub max: u64,
    /// The floor, 1 ≤ min ≤ max; default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub min: Option<u64>,
    /// Where a key starts, min ≤ initial ≤ max; default 20 within them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub initial: Option<u64>,
    /// `vegas` (default), `gradient` or `aimd` (docs/adaptive.md compares
    /// them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub algorithm: Option<AlgorithmName>,
    /// The shortest sample window, 1ms to 1m; default 100ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("not" = {"pattern": "mo$"}))]
    pub window: Option<Duration>,
    /// Gradient: how far above the no-load latency the latency may rise
    /// before the limit shrinks, 1 to 10; default 1.5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10))]
    pub tolerance: Option<serde_json::Number>,
    /// The factor a window with a `dropped` sample shrinks the limit by
    /// (gradient and aimd), 0.5 to 0.99; default 0.9.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.5, max = 0.99))]
    pub backoff: Option<serde_json::Number>,
}

/// An adaptive item's algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AlgorithmName {
    Vegas,
    Gradient,
    Aimd,
}

/// An adaptive item's largest `max`: a key's open slots are kept one by
/// one (8 bytes each).
pub const MAX_ADAPTIVE: u64 = 1_000_000;

/// The fewest samples a window of an adaptive item needs; the no-load
/// latency may rise once every this many windows (docs/adaptive.md).
const ADAPTIVE_MIN_SAMPLES: u32 = 10;
const ADAPTIVE_BASELINE_WINDOWS: u64 = 300;

/// `{"sheddable": 0.5, "low": 0.8}`: the share of an item's limit each
/// priority class may use, 0 < share ≤ 1 (six decimals); a class not named
/// uses the whole item. Shares may not grow from a class to a lower one, so a
/// class is never refused where a lower one passes (docs/semantics.md §2.5).
#[derive(Debug, Clone, Default, PartialEq, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PrioritiesDef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 1), extend("exclusiveMinimum" = 0))]
    pub critical: Option<serde_json::Number>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 1), extend("exclusiveMinimum" = 0))]
    pub high: Option<serde_json::Number>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 1), extend("exclusiveMinimum" = 0))]
    pub default: Option<serde_json::Number>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 1), extend("exclusiveMinimum" = 0))]
    pub low: Option<serde_json::Number>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 1), extend("exclusiveMinimum" = 0))]
    pub sheddable: Option<serde_json::Number>,
}

/// The class names a `priorities` object may use.
const CLASSES: &[&str] = &["critical", "high", "default", "low", "sheddable"];

impl<'de> Deserialize<'de> for PrioritiesDef {
    // By hand: a derived struct also reads a JSON array by position
    // (`[null, 0.5]`), which the schema forbids and no one means.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Classes;
        impl<'de> serde::de::Visitor<'de> for Classes {
            type Value = PrioritiesDef;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(r#"an object of class shares, e.g. {"sheddable": 0.5}"#)
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> std::result::Result<PrioritiesDef, A::Error> {
                use serde::de::Error;
                let mut out = PrioritiesDef::default();
                while let Some(k) = m.next_key::<String>()? {
                    let slot = match k.as_str() {
                        "critical" => &mut out.critical,
                        "high" => &mut out.high,
                        "default" => &mut out.default,
                        "low" => &mut out.low,
                        "sheddable" => &mut out.sheddable,
                        _ => return Err(A::Error::unknown_field(&k, CLASSES)),
                    };
                    if slot.is_some() {
                        return Err(A::Error::custom(format!("{k}: given twice")));
                    }
                    *slot = m.next_value::<Option<serde_json::Number>>()?;
                }
                Ok(out)
            }
        }
        d.deserialize_map(Classes)
    }
}

impl PrioritiesDef {
    /// The given share of each class, highest first.
    fn given(&self) -> [Option<&serde_json::Number>; 5] {
        [
            self.critical.as_ref(),
            self.high.as_ref(),
            self.default.as_ref(),
            self.low.as_ref(),
            self.sheddable.as_ref(),
        ]
    }

    /// Validates the shares (errors name `<path>.priorities.<class>`) and
    /// compiles them to millionths.
    pub fn shares(&self, path: &str) -> Result<Shares> {
        let mut out = Shares::default();
        for (i, (p, given)) in Priority::ALL.iter().zip(self.given()).enumerate() {
            let Some(n) = given else { continue };
            let field = format!("{path}.priorities.{}", p.as_str());
            let v = n.as_f64().filter(|v| v.is_finite()).unwrap_or(f64::NAN);
            let millionths = (v * f64::from(WHOLE)).round();
            if !(v > 0.0 && v <= 1.0) || millionths < 1.0 {
                return Err(err(
                    field,
                    format!("must be a share above 0 and at most 1 (six decimals), got {n}"),
                ));
            }
            out.0[i] = millionths as Share;
        }
        // A lower class with a larger share would pass where a higher one is
        // refused: an inversion no one means.
        for i in 1..5 {
            if out.0[i] > out.0[i - 1] {
                let (hi, lo) = (Priority::ALL[i - 1], Priority::ALL[i]);
                return Err(err(
                    format!("{path}.priorities.{}", hi.as_str()),
                    format!(
                        "{} is below {}'s share ({}; an unnamed class has 1): a higher class \
                         may not get less of an item than a lower one",
                        out.0[i - 1] as f64 / f64::from(WHOLE),
                        lo.as_str(),
                        out.0[i] as f64 / f64::from(WHOLE),
                    ),
                ));
            }
        }
        Ok(out)
    }
}

/// What to do when a request is denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OnLimit {
    /// Deny (429).
    Reject,
    /// Allow with a delay when only rate/gap items deny and the wait is at most
    /// `max_delay_ms`.
    Delay,
}

/// Whether a definition's denials are enforced (docs/semantics.md,
/// "Shadow mode").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Denials deny.
    #[default]
    Enforce,
    /// Decided and counted as if enforced, always answered allowed
    /// (`would_deny` says what enforcing would have answered); only what an
    /// enforced decision would have debited is debited.
    Shadow,
}

/// A named policy: a stack of limit items decided all-or-nothing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
// `max_delay_ms` goes with `on_limit: "delay"`, and only with it.
#[schemars(extend(
    "if" = {"required": ["on_limit"], "properties": {"on_limit": {"const": "delay"}}},
    "then" = {"required": ["max_delay_ms"], "properties": {"max_delay_ms": {"type": "integer"}}},
    "else" = {"properties": {"max_delay_ms": {"type": "null"}}},
))]
pub struct PolicyDef {
    /// At least one item, at most 64.
    #[schemars(length(min = 1, max = 64))]
    pub limits: Vec<LimitDef>,
    /// Default `reject`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_limit: Option<OnLimit>,
    /// Longest delay accepted in delay mode, 1 ≤ max_delay_ms ≤ 3 600 000; required
    /// with `on_limit: "delay"`, not allowed otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3600000))]
    pub max_delay_ms: Option<u64>,
    /// `enforce` (default) or `shadow`: try the policy without denying anyone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
}

/// The longest delay delay mode accepts: one hour.
pub const MAX_DELAY_MS: u64 = 3_600_000;

// ---- validation ----

type Result<T> = std::result::Result<T, DefinitionError>;

fn err(field: impl Into<String>, message: impl Into<String>) -> DefinitionError {
    DefinitionError::new(field, message)
}

/// Checks an integer field: 1 ≤ x < 2^53.
fn positive(path: &str, field: &str, x: u64) -> Result<u64> {
    if x == 0 || x > MAX_EXACT {
        return Err(err(
            format!("{path}.{field}"),
            format!("must be an integer from 1 to 2^53 - 1, got {x}"),
        ));
    }
    Ok(x)
}

fn check_name(path: &str, name: &Option<String>) -> Result<()> {
    let Some(n) = name else { return Ok(()) };
    let ok = !n.is_empty()
        && n.len() <= MAX_NAME_LEN
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(err(
            format!("{path}.name"),
            format!("must be 1-{MAX_NAME_LEN} characters of A-Z a-z 0-9 . _ : -, got {n:?}"),
        ))
    }
}

fn time_zone(path: &str, tz: &Option<String>) -> Result<TimeZone> {
    match tz {
        None => Ok(TimeZone::UTC),
        Some(name) => TimeZone::get(name).map_err(|_| {
            err(
                format!("{path}.tz"),
                format!("unknown IANA time zone {name:?} (e.g. \"Europe/Paris\", \"UTC\")"),
            )
        }),
    }
}

fn calendar_unit(path: &str, d: &Duration) -> Result<CalendarUnit> {
    d.calendar_unit().ok_or_else(|| {
        err(
            path,
            format!("a calendar period must be one of 1h, 1d, 1w, 1mo, got \"{d}\""),
        )
    })
}

fn fixed_nanos(path: &str, d: &Duration) -> Result<u64> {
    d.nanos().ok_or_else(|| {
        err(
            path,
            "months (\"mo\") are only for calendar windows and budgets",
        )
    })
}

impl LimitDef {
    /// The given name, if any.
    pub fn name(&self) -> Option<&str> {
        match self {
            LimitDef::Rate(d) => d.name.as_deref(),
            LimitDef::Gap(d) => d.name.as_deref(),
            LimitDef::Window(d) => d.name.as_deref(),
            LimitDef::Budget(d) => d.name.as_deref(),
            LimitDef::Concurrency(d) => d.name.as_deref(),
            LimitDef::Adaptive(d) => d.name.as_deref(),
        }
    }

    /// The classes' shares, as written.
    pub fn priorities(&self) -> Option<&PrioritiesDef> {
        match self {
            LimitDef::Rate(d) => d.priorities.as_ref(),
            LimitDef::Gap(d) => d.priorities.as_ref(),
            LimitDef::Window(d) => d.priorities.as_ref(),
            LimitDef::Budget(d) => d.priorities.as_ref(),
            LimitDef::Concurrency(d) => d.priorities.as_ref(),
            LimitDef::Adaptive(d) => d.priorities.as_ref(),
        }
    }

    /// The same item without its priorities: what a counter's fingerprint
    /// hashes, so changing a class's share keeps the counts.
    pub fn without_priorities(&self) -> LimitDef {
        let mut d = self.clone();
        match &mut d {
            LimitDef::Rate(d) => d.priorities = None,
            LimitDef::Gap(d) => d.priorities = None,
            LimitDef::Window(d) => d.priorities = None,
            LimitDef::Budget(d) => d.priorities = None,
            LimitDef::Concurrency(d) => d.priorities = None,
            LimitDef::Adaptive(d) => d.priorities = None,
        }
        d
    }

    /// The compiled `item` as each priority class sees it (`None`: every
    /// class sees the whole item). `path` names the item in errors.
    pub fn classes(&self, path: &str, item: &Item) -> Result<Option<Classes>> {
        match self.priorities() {
            Some(p) => Ok(Classes::new(item, p.shares(path)?)),
            None => Ok(None),
        }
    }

    fn kind(&self) -> Kind {
        match self {
            LimitDef::Rate(_) => Kind::Rate,
            LimitDef::Gap(_) => Kind::Gap,
            LimitDef::Window(_) => Kind::Window,
            LimitDef::Budget(_) => Kind::Budget,
            LimitDef::Concurrency(_) => Kind::Concurrency,
            LimitDef::Adaptive(_) => Kind::Adaptive,
        }
    }

    /// The reported name of this item at `index`: its `name`, or `<kind>-<index>`.
    pub fn reported_name(&self, index: usize) -> String {
        self.name().map_or_else(
            || format!("{}-{index}", self.kind().as_str()),
            str::to_owned,
        )
    }

    /// Validates this item and compiles it. `path` names it in errors, e.g.
    /// `limits[2]`.
    pub fn compile(&self, path: &str) -> Result<Item> {
        check_name(path, &self.name().map(str::to_owned))?;
        match self {
            LimitDef::Rate(d) => {
                let rate = positive(path, "rate", d.rate)?;
                let per = fixed_nanos(&format!("{path}.per"), &d.per)?;
                let burst = positive(path, "burst", d.burst.unwrap_or(rate))?;
                Ok(Item::Rate {
                    rate: Rate::new(rate, per, burst),
                    kind: Kind::Rate,
                })
            }
            LimitDef::Gap(d) => {
                let min = fixed_nanos(&format!("{path}.min"), &d.min)?;
                Ok(Item::Rate {
                    rate: Rate::new(1, min, 1),
                    kind: Kind::Gap,
                })
            }
            LimitDef::Window(d) => compile_window(path, d).map(Item::Window),
            LimitDef::Budget(d) => compile_budget(path, d).map(Item::Budget),
            LimitDef::Concurrency(d) => Ok(Item::Concurrency(Concurrency {
                max: positive(path, "max", d.max)?,
            })),
            LimitDef::Adaptive(d) => compile_adaptive(path, d).map(Item::Adaptive),
        }
    }
}

/// Checks a count of an adaptive item: 1 ≤ x ≤ [`MAX_ADAPTIVE`].
fn slots(path: &str, field: &str, x: u64) -> Result<u64> {
    if x == 0 || x > MAX_ADAPTIVE {
        return Err(err(
            format!("{path}.{field}"),
            format!("must be an integer from 1 to {MAX_ADAPTIVE}, got {x}"),
        ));
    }
    Ok(x)
}

/// A number field of an adaptive item within `range`, or its default.
fn fraction_in(
    path: &str,
    field: &str,
    v: &Option<serde_json::Number>,
    default: f64,
    range: std::ops::RangeInclusive<f64>,
) -> Result<f64> {
    let Some(n) = v else { return Ok(default) };
    let x = n.as_f64().filter(|x| x.is_finite()).unwrap_or(f64::NAN);
    if !range.contains(&x) {
        return Err(err(
            format!("{path}.{field}"),
            format!(
                "must be a number from {} to {}, got {n}",
                range.start(),
                range.end()
            ),
        ));
    }
    Ok(x)
}

fn compile_adaptive(path: &str, d: &AdaptiveLimitDef) -> Result<Adaptive> {
    use crate::limits::adaptive::Algorithm;
    let max = slots(path, "max", d.max)?;
    let min = slots(path, "min", d.min.unwrap_or(1))?;
    if min > max {
        return Err(err(
            format!("{path}.min"),
            format!("must be at most max ({max}), got {min}"),
        ));
    }
    let initial = slots(path, "initial", d.initial.unwrap_or(20_u64.clamp(min, max)))?;
    if !(min..=max).contains(&initial) {
        return Err(err(
            format!("{path}.initial"),
            format!("must be from min ({min}) to max ({max}), got {initial}"),
        ));
    }
    let window = match &d.window {
        None => 100 * MS,
        Some(w) => {
            let field = format!("{path}.window");
            let ns = fixed_nanos(&field, w)?;
            if !(MS..=60_000 * MS).contains(&ns) {
                return Err(err(field, format!("must be from 1ms to 1m, got \"{w}\"")));
            }
            ns
        }
    };
    let algorithm = match d.algorithm.unwrap_or(AlgorithmName::Vegas) {
        AlgorithmName::Vegas => Algorithm::Vegas,
        AlgorithmName::Gradient => Algorithm::Gradient,
        AlgorithmName::Aimd => Algorithm::Aimd,
    };
    if d.tolerance.is_some() && algorithm != Algorithm::Gradient {
        return Err(err(
            format!("{path}.tolerance"),
            "only the gradient algorithm takes a tolerance",
        ));
    }
    if d.backoff.is_some() && algorithm == Algorithm::Vegas {
        return Err(err(
            format!("{path}.backoff"),
            "vegas backs off by its own rule (log10 of the limit); only gradient and aimd \
             take a backoff",
        ));
    }
    Ok(Adaptive {
        initial,
        min,
        max,
        algorithm,
        tolerance: fraction_in(path, "tolerance", &d.tolerance, 1.5, 1.0..=10.0)?,
        window,
        min_samples: ADAPTIVE_MIN_SAMPLES,
        backoff: fraction_in(path, "backoff", &d.backoff, 0.9, 0.5..=0.99)?,
        baseline_period: window.saturating_mul(ADAPTIVE_BASELINE_WINDOWS),
        share: WHOLE,
    })
}

fn compile_window(path: &str, d: &WindowDef) -> Result<Window> {
    let limit = positive(path, "limit", d.limit)?;
    let align = d.align.unwrap_or(Align::Rolling);
    if d.tz.is_some() && align != Align::Calendar {
        return Err(err(
            format!("{path}.tz"),
            "only calendar windows (align \"calendar\") take a time zone",
        ));
    }
    if d.precision.is_some() && align != Align::Rolling {
        return Err(err(
            format!("{path}.precision"),
            "only rolling windows take a precision",
        ));
    }
    let wpath = format!("{path}.window");
    let layout = match align {
        Align::Fixed => Layout::Fixed {
            w: fixed_nanos(&wpath, &d.window)?,
        },
        Align::Calendar => Layout::Calendar(Calendar::new(
            calendar_unit(&wpath, &d.window)?,
            time_zone(path, &d.tz)?,
        )),
        Align::Rolling => {
            let w = fixed_nanos(&wpath, &d.window)?;
            match d.precision.unwrap_or(Precision::Exact) {
                Precision::Approximate => Layout::Approximate { w },
                Precision::Exact => {
                    if limit > MAX_EXACT_ROLLING_LIMIT {
                        return Err(err(
                            format!("{path}.limit"),
                            format!(
                                "an exact rolling window keeps one entry per debit and allows a limit of at most {MAX_EXACT_ROLLING_LIMIT}; use \"precision\": \"approximate\" for {limit}"
                            ),
                        ));
                    }
                    Layout::Rolling { w }
                }
            }
        }
    };
    Ok(Window { limit, layout })
}

/// The largest profile weight, so the exact pacing arithmetic stays within 128 bits
/// (see [`crate::limits::budget`]).
pub const MAX_PROFILE_WEIGHT: f64 = 1000.0;

/// Checks a traffic profile (`field` names it in errors) and returns its
/// weights in thousandths.
fn profile_weights(
    field: &str,
    unit: CalendarUnit,
    profile: &[serde_json::Number],
) -> Result<[u64; 24]> {
    if unit == CalendarUnit::Hour {
        return Err(err(
            field,
            "a profile shares a period by local hour, so it needs a period of 1d, 1w or 1mo",
        ));
    }
    if profile.len() != 24 {
        return Err(err(
            field,
            format!(
                "needs 24 weights, one per local hour, got {}",
                profile.len()
            ),
        ));
    }
    let mut w = [0u64; 24];
    for (i, x) in profile.iter().enumerate() {
        // Non-finite values cannot be JSON numbers; as_f64 only fails for
        // arbitrary-precision ones, which this build does not enable.
        let x = x.as_f64().unwrap_or(f64::NAN);
        if !(x.is_finite() && (0.0..=MAX_PROFILE_WEIGHT).contains(&x)) {
            return Err(err(
                format!("{field}[{i}]"),
                format!("must be a number from 0 to {MAX_PROFILE_WEIGHT}, got {x}"),
            ));
        }
        // In range, so the cast is exact after rounding.
        w[i] = (x * 1000.0).round() as u64;
    }
    if w.iter().all(|&x| x == 0) {
        return Err(err(field, "the weights must have a positive sum"));
    }
    Ok(w)
}

fn compile_budget(path: &str, d: &BudgetDef) -> Result<Budget> {
    let amount = positive(path, "amount", d.amount)?;
    let unit = match &d.per {
        None => CalendarUnit::Day,
        Some(p) => calendar_unit(&format!("{path}.per"), p)?,
    };
    let tz = time_zone(path, &d.tz)?;
    let pacing = match &d.pacing {
        None | Some(Pacing::Mode(PacingMode::Even)) => CompiledPacing::Even,
        Some(Pacing::Mode(PacingMode::Asap)) => CompiledPacing::Asap,
        Some(Pacing::Mode(PacingMode::Adaptive)) => CompiledPacing::Adaptive(None),
        Some(Pacing::Profile(p)) => {
            let w = profile_weights(&format!("{path}.pacing.profile"), unit, &p.profile)?;
            CompiledPacing::Profile(Box::new(w))
        }
        Some(Pacing::Adaptive(a)) => match &a.adaptive.profile {
            None => CompiledPacing::Adaptive(None),
            Some(p) => {
                let field = format!("{path}.pacing.adaptive.profile");
                CompiledPacing::Adaptive(Some(Box::new(profile_weights(&field, unit, p)?)))
            }
        },
        Some(Pacing::Mode(PacingMode::Throttle)) => CompiledPacing::Throttle(None),
        Some(Pacing::Throttle(t)) => match &t.throttle.profile {
            None => CompiledPacing::Throttle(None),
            Some(p) => {
                let field = format!("{path}.pacing.throttle.profile");
                CompiledPacing::Throttle(Some(Box::new(profile_weights(&field, unit, p)?)))
            }
        },
    };
    let tol = d
        .tolerance
        .as_ref()
        .map_or(0.01, |t| t.as_f64().unwrap_or(f64::NAN));
    if !(tol.is_finite() && (0.0..=1.0).contains(&tol)) {
        return Err(err(
            format!("{path}.tolerance"),
            format!("must be a fraction from 0 to 1, got {tol}"),
        ));
    }
    let bp = (tol * 10_000.0).round() as u128;
    let allowance = (u128::from(amount) * bp / 10_000) as u64;
    let b = Budget::new(amount, Calendar::new(unit, tz), pacing, allowance);
    Ok(match d.goal {
        Some(Goal::Impressions) => b.counting_impressions(),
        Some(Goal::Spend) | None => b,
    })
}

/// Nominal window length and limit of a window item, for stack validation.
fn window_span(d: &WindowDef) -> Option<(u64, u64)> {
    let ns = d.window.nanos().or_else(|| {
        d.window
            .calendar_unit()
            .map(crate::limits::calendar::nominal_nanos)
    })?;
    Some((ns, d.limit))
}

/// Checks a stack of window items for contradictions: a shorter window with a
/// higher limit than a longer one can never bind (rejected); two windows of the
/// same length are redundant (a warning, the lower limit wins).
pub fn check_windows(path: &str, limits: &[LimitDef]) -> Result<Vec<Warning>> {
    let all: Vec<(usize, &LimitDef)> = limits.iter().enumerate().collect();
    check_windows_among(path, &all)
}

/// [`check_windows`] over some items of a list, given with their indexes in it
/// (a campaign judges its user caps and its campaign caps apart).
pub fn check_windows_among(path: &str, limits: &[(usize, &LimitDef)]) -> Result<Vec<Warning>> {
    let mut warnings = Vec::new();
    let def = |i: usize| limits.iter().find(|(j, _)| *j == i).map(|(_, l)| *l);
    let spans: Vec<(usize, u64, u64)> = limits
        .iter()
        .filter_map(|&(i, l)| match l {
            LimitDef::Window(d) => window_span(d).map(|(w, lim)| (i, w, lim)),
            _ => None,
        })
        .collect();
    for &(i, wi, li) in &spans {
        for &(j, wj, lj) in &spans {
            if wi < wj && li > lj {
                return Err(err(
                    format!("{path}[{i}].limit"),
                    format!(
                        "{li} per {} can never bind beside {lj} per {} ({path}[{j}]): a shorter window must have a lower limit",
                        window_of(def(i)),
                        window_of(def(j))
                    ),
                ));
            }
            if i < j && wi == wj {
                warnings.push(Warning {
                    field: format!("{path}[{j}]"),
                    message: format!(
                        "redundant: {path}[{i}] has a window of the same length; the lower limit decides"
                    ),
                });
            }
        }
    }
    Ok(warnings)
}

fn window_of(l: Option<&LimitDef>) -> String {
    match l {
        Some(LimitDef::Window(d)) => d.window.to_string(),
        _ => String::new(),
    }
}

/// A validated policy, compiled, with any warnings the validation raised.
#[derive(Debug, Clone)]
pub struct CompiledPolicy {
    pub stack: Stack,
    /// Each item's counter tag ([`crate::limits::counter_tag`]).
    pub tags: Vec<u32>,
    pub warnings: Vec<Warning>,
}

/// Refuses a definition two of whose items would share a counter tag
/// (`(field naming the item, tag)` in order): their names differ, but
/// their 32-bit hashes agree, about once in 4 × 10^9 pairs. Renaming one
/// item is the way out, and the error says so.
pub fn check_tags(items: impl Iterator<Item = (String, u32)>) -> Result<()> {
    let mut seen: Vec<(String, u32)> = Vec::new();
    for (field, tag) in items {
        if let Some((other, _)) = seen.iter().find(|(_, t)| *t == tag) {
            return Err(err(
                field,
                format!(
                    "this item's counter would share an id with {other}'s (a hash collision \
                     of their names): rename one of them"
                ),
            ));
        }
        seen.push((field, tag));
    }
    Ok(())
}

impl PolicyDef {
    /// Validates the whole definition; errors name the offending field
    /// (`limits[1].burst`, `max_delay_ms`, ...).
    pub fn compile(&self) -> Result<CompiledPolicy> {
        if self.limits.is_empty() {
            return Err(err("limits", "a policy needs at least one limit"));
        }
        compile_stack("limits", &self.limits, self.on_limit, self.max_delay_ms)
    }
}

/// Validates and compiles a list of items (a policy's, or inline limits of a
/// check), rejecting duplicate names and contradictory windows.
pub fn compile_stack(
    path: &str,
    limits: &[LimitDef],
    on_limit: Option<OnLimit>,
    max_delay_ms: Option<u64>,
) -> Result<CompiledPolicy> {
    if limits.len() > MAX_ITEMS {
        return Err(err(
            path,
            format!("at most {MAX_ITEMS} items, got {}", limits.len()),
        ));
    }
    let mut items = Vec::with_capacity(limits.len());
    let mut classes = Vec::with_capacity(limits.len());
    let mut names: Vec<String> = Vec::with_capacity(limits.len());
    let mut tags = Vec::with_capacity(limits.len());
    for (i, l) in limits.iter().enumerate() {
        let p = format!("{path}[{i}]");
        let item = l.compile(&p)?;
        classes.push(l.classes(&p, &item)?);
        let name = l.reported_name(i);
        tags.push((
            format!("{p}.name"),
            crate::limits::counter_tag(&name, &item),
        ));
        items.push(item);
        if names.contains(&name) {
            return Err(err(
                format!("{p}.name"),
                format!("the name {name:?} is used by another item"),
            ));
        }
        names.push(name);
    }
    let warnings = check_windows(path, limits)?;
    let on_limit = match (on_limit.unwrap_or(OnLimit::Reject), max_delay_ms) {
        (OnLimit::Reject, None) => CompiledOnLimit::Reject,
        (OnLimit::Reject, Some(_)) => {
            return Err(err(
                "max_delay_ms",
                "only meaningful with \"on_limit\": \"delay\"",
            ));
        }
        (OnLimit::Delay, None) => {
            return Err(err(
                "max_delay_ms",
                "required with \"on_limit\": \"delay\": the longest wait to accept",
            ));
        }
        (OnLimit::Delay, Some(ms)) => {
            if ms == 0 || ms > MAX_DELAY_MS {
                return Err(err(
                    "max_delay_ms",
                    format!("must be from 1 to {MAX_DELAY_MS}, got {ms}"),
                ));
            }
            CompiledOnLimit::Delay { max_delay: ms * MS }
        }
    };
    check_tags(tags.iter().cloned())?;
    Ok(CompiledPolicy {
        stack: Stack::new(items, names, on_limit).with_classes(classes),
        tags: tags.into_iter().map(|(_, t)| t).collect(),
        warnings,
    })
}
