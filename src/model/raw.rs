//! The flat form a limit item is read in: every field of every kind, optional.
//!
//! Reading the flat form first, then checking which fields the `kind` allows,
//! keeps the path of a type error (`limits[0].rate: invalid value: integer -1`)
//! that a tagged enum would lose, and lets a field that exists but not for this
//! kind get its own message (`limits[0].burst: not a field of a gap item`).

use serde::Deserialize;

use crate::model::duration::Duration;
use crate::model::limit::{
    Align, BudgetDef, ConcurrencyDef, GapDef, LimitDef, Pacing, Precision, PrioritiesDef, RateDef,
    WindowDef,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RawKind {
    Rate,
    Gap,
    Window,
    Budget,
    Concurrency,
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
    min: Option<Duration>,
    limit: Option<u64>,
    window: Option<Duration>,
    align: Option<Align>,
    tz: Option<String>,
    precision: Option<Precision>,
    amount: Option<u64>,
    pacing: Option<Pacing>,
    tolerance: Option<serde_json::Number>,
    max: Option<u64>,
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
        };
        // Which fields this kind takes; any other that is present is an error.
        let allowed: &[&str] = match r.kind {
            RawKind::Rate => &["rate", "per", "burst"],
            RawKind::Gap => &["min"],
            RawKind::Window => &["limit", "window", "align", "tz", "precision"],
            RawKind::Budget => &["amount", "per", "pacing", "tolerance", "tz"],
            RawKind::Concurrency => &["max"],
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
                min: required(r.min, "min", kind)?,
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
            }),
            RawKind::Concurrency => LimitDef::Concurrency(ConcurrencyDef {
                name,
                priorities,
                max: required(r.max, "max", kind)?,
            }),
        })
    }
}
