//! The flat form a limit item is read in: every field of every kind, optional.
//!
//! Reading the flat form first, then checking which fields the `kind` allows,
//! keeps the path of a type error (`limits[0].rate: invalid value: integer -1`)
//! that a tagged enum would lose, and lets a field that exists but not for this
//! kind get its own message (`limits[0].burst: not a field of a gap item`).

use serde::Deserialize;

use crate::model::duration::Duration;
use crate::model::limit::{
    AdaptiveLimitDef, AlgorithmName, Align, BudgetDef, ConcurrencyDef, GapDef, Goal, LimitDef,
    Pacing, Precision, PrioritiesDef, RateDef, WindowDef,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RawKind {
    Rate,
    Gap,
    Window,
    Budget,
    Concurrency,
    Adaptive,
}

/// `min`: a gap's least interval (a duration) or an adaptive item's floor
/// (a count). By hand, so either reads with the error of its own type.
#[derive(Debug)]
pub enum RawMin {
    Interval(Duration),
    Count(u64),
}

impl<'de> Deserialize<'de> for RawMin {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Min;
        impl serde::de::Visitor<'_> for Min {
            type Value = RawMin;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(r#"a duration such as "10m" (gap) or an integer (adaptive)"#)
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<RawMin, E> {
                Ok(RawMin::Count(v))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RawMin, E> {
                v.parse().map(RawMin::Interval).map_err(E::custom)
            }
        }
        d.deserialize_any(Min)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimit {
    kind: RawKind,
    name: Option<String>,
    priorities: Option<PrioritiesDef>,
    rate: Option<u64>,
    per: Option<Duration>,
    burst: Option<u64>,
    min: Option<RawMin>,
    limit: Option<u64>,
    window: Option<Duration>,
    align: Option<Align>,
    tz: Option<String>,
    precision: Option<Precision>,
    amount: Option<u64>,
    pacing: Option<Pacing>,
    tolerance: Option<serde_json::Number>,
    max: Option<u64>,
    initial: Option<u64>,
    algorithm: Option<AlgorithmName>,
    backoff: Option<serde_json::Number>,
    goal: Option<Goal>,
}

/// An error about one field of the item. Displayed as `field: message`, which
/// [`super::from_json`] turns into the field path `limits[i].field`.
#[derive(Debug)]
pub struct FieldError {
    pub field: &'static str,
    pub message: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

fn required<T>(v: Option<T>, field: &'static str, kind: &str) -> Result<T, FieldError> {
    v.ok_or_else(|| FieldError {
        field,
        message: format!("required for a {kind} item"),
    })
}

impl TryFrom<RawLimit> for LimitDef {
    type Error = FieldError;

    fn try_from(r: RawLimit) -> Result<Self, FieldError> {
        let kind = match r.kind {
            RawKind::Rate => "rate",
            RawKind::Gap => "gap",
            RawKind::Window => "window",
            RawKind::Budget => "budget",
            RawKind::Concurrency => "concurrency",
            RawKind::Adaptive => "adaptive",
        };
        // Which fields this kind takes; any other that is present is an error.
        let allowed: &[&str] = match r.kind {
            RawKind::Rate => &["rate", "per", "burst"],
            RawKind::Gap => &["min"],
            RawKind::Window => &["limit", "window", "align", "tz", "precision"],
            RawKind::Budget => &["amount", "per", "pacing", "tolerance", "tz", "goal"],
            RawKind::Concurrency => &["max"],
            RawKind::Adaptive => &[
                "max",
                "min",
                "initial",
                "algorithm",
                "window",
                "tolerance",
                "backoff",
            ],
        };
        let present = [
            ("rate", r.rate.is_some()),
            ("per", r.per.is_some()),
            ("burst", r.burst.is_some()),
            ("min", r.min.is_some()),
            ("limit", r.limit.is_some()),
            ("window", r.window.is_some()),
            ("align", r.align.is_some()),
            ("tz", r.tz.is_some()),
            ("precision", r.precision.is_some()),
            ("amount", r.amount.is_some()),
            ("pacing", r.pacing.is_some()),
            ("tolerance", r.tolerance.is_some()),
            ("max", r.max.is_some()),
            ("initial", r.initial.is_some()),
            ("algorithm", r.algorithm.is_some()),
            ("backoff", r.backoff.is_some()),
            ("goal", r.goal.is_some()),
        ];
        if let Some((field, _)) = present.iter().find(|(f, p)| *p && !allowed.contains(f)) {
            return Err(FieldError {
                field,
                message: format!(
                    "not a field of a {kind} item (its fields: name, priorities, {})",
                    allowed.join(", ")
                ),
            });
        }
        let name = r.name;
        let priorities = r.priorities;
        Ok(match r.kind {
            RawKind::Rate => LimitDef::Rate(RateDef {
                name,
                priorities,
                rate: required(r.rate, "rate", kind)?,
                per: required(r.per, "per", kind)?,
                burst: r.burst,
            }),
            RawKind::Gap => LimitDef::Gap(GapDef {
                name,
                priorities,
                min: match required(r.min, "min", kind)? {
                    RawMin::Interval(d) => d,
                    RawMin::Count(n) => {
                        return Err(FieldError {
                            field: "min",
                            message: format!(
                                "a gap's min is a duration such as \"10m\", got the integer {n}"
                            ),
                        });
                    }
                },
            }),
            RawKind::Window => LimitDef::Window(WindowDef {
                name,
                priorities,
                limit: required(r.limit, "limit", kind)?,
                window: required(r.window, "window", kind)?,
                align: r.align,
                tz: r.tz,
                precision: r.precision,
            }),
            RawKind::Budget => LimitDef::Budget(BudgetDef {
                name,
                priorities,
                amount: required(r.amount, "amount", kind)?,
                per: r.per,
                pacing: r.pacing,
                tolerance: r.tolerance,
                tz: r.tz,
                goal: r.goal,
            }),
            RawKind::Concurrency => LimitDef::Concurrency(ConcurrencyDef {
                name,
                priorities,
                max: required(r.max, "max", kind)?,
            }),
            RawKind::Adaptive => LimitDef::Adaptive(AdaptiveLimitDef {
                name,
                priorities,
                max: required(r.max, "max", kind)?,
                min: match r.min {
                    None => None,
                    Some(RawMin::Count(n)) => Some(n),
                    Some(RawMin::Interval(d)) => {
                        return Err(FieldError {
                            field: "min",
                            message: format!(
                                "an adaptive item's min is a count of slots, got the duration \"{d}\""
                            ),
                        });
                    }
                },
                initial: r.initial,
                algorithm: r.algorithm,
                window: r.window,
                tolerance: r.tolerance,
                backoff: r.backoff,
            }),
        })
    }
}
