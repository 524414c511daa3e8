//! Campaign definitions (docs/semantics.md §6): caps per user or per campaign, a paced
//! budget, a bound on reservations in flight, and a parent whose caps apply too.

use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};

use crate::MAX_EXACT;
use crate::clock::Nanos;
use crate::limits::budget::MAX_FLIGHT_NS;
use crate::limits::concurrency::Concurrency;
use crate::limits::priority::Classes;
use crate::limits::schedule::Schedule;
use crate::limits::{Item, counter_tag};
use crate::model::error::{DefinitionError, Warning};
use crate::model::event_type::EventType;
use crate::model::identity::Kind;
use crate::model::limit::{LimitDef, MAX_ITEMS, check_tags, check_windows_among};

/// The most caps one campaign may have: as many as a policy's items
/// ([`MAX_ITEMS`]). A campaign's items are its caps, then its budget and
/// max_in_flight, and an item's index is kept in one byte of a stored
/// counter's tag.
pub const MAX_CAPS: usize = MAX_ITEMS;

/// Who a cap counts for (docs/semantics.md §6.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// One counter per (user, campaign).
    User,
    /// One counter shared by every user (and by every child campaign).
    Campaign,
    /// One counter per (identity of this kind, campaign): a household's, a
    /// device's. Never `user` (that is [`Scope::User`]).
    Id(Kind),
}

impl Scope {
    /// `"user"`, `"campaign"` or an identity kind.
    pub fn parse(s: &str) -> Result<Scope, String> {
        match s {
            "user" => Ok(Scope::User),
            "campaign" => Ok(Scope::Campaign),
            _ => Kind::parse(s).map(Scope::Id).map_err(|e| {
                format!(
                    "must be \"campaign\" or an identity kind (\"user\", \"household\", ...): {e}"
                )
            }),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            Scope::User => "user",
            Scope::Campaign => "campaign",
            Scope::Id(k) => k.as_str(),
        }
    }

    /// The identity it counts per, if any (`user` for [`Scope::User`]).
    pub fn kind(&self) -> Option<Kind> {
        match self {
            Scope::User => Some(Kind::USER),
            Scope::Campaign => None,
            Scope::Id(k) => Some(*k),
        }
    }
}

impl Serialize for Scope {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Scope {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Scope::parse(&s).map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for Scope {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Scope".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "\"campaign\", \"user\" or another identity kind (\"household\", \"device\"): 1 to 16 lowercase letters, digits or '_', starting with a letter.",
            "type": "string",
            "pattern": "^[a-z][a-z0-9_]{0,15}$"
        })
    }
}

/// What to do with a screen that names no user (`unknown_user`), or no
/// identity of a cap's kind (the cap's `missing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "lowercase")]
pub enum UnknownUser {
    /// Deny every candidate (fail closed).
    #[default]
    Deny,
    /// Decide without the per-user caps (the caps of the missing kind).
    Allow,
}

/// A cap: a `rate`, `gap` or `window` item with a `scope` (default `user`)
/// and, for an identity other than the user, what a request without one
/// gets (`missing`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CapDef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<Scope>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missing: Option<UnknownUser>,
    /// The event type it counts (default `impression`, what a commit is;
    /// docs/semantics.md §6.9).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<EventType>,
    #[serde(flatten)]
    pub limit: LimitDef,
}

impl CapDef {
    pub fn scope(&self) -> Scope {
        self.scope.unwrap_or(Scope::User)
    }
}

/// Removes `event` from a map-shaped value, returning the event type it
/// names; the error names the field.
fn take_event(value: &mut serde_json::Value) -> Result<Option<EventType>, String> {
    match take(value, "event") {
        None => Ok(None),
        Some(serde_json::Value::String(s)) => EventType::parse(&s)
            .map(Some)
            .map_err(|e| format!("event: {e}")),
        Some(_) => Err("event: must be a string (\"impression\", \"click\")".into()),
    }
}

/// Removes `field` from a map-shaped value, returning it.
fn take(value: &mut serde_json::Value, field: &str) -> Option<serde_json::Value> {
    value.as_object_mut().and_then(|m| m.remove(field))
}

impl<'de> Deserialize<'de> for CapDef {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        // `scope` and `missing` sit beside the item's own fields; take them
        // out, then read the rest as a limit item, naming the field it
        // rejects (`caps[0].limit`).
        let mut value = serde_json::Value::deserialize(d)?;
        let scope = match take(&mut value, "scope") {
            None => None,
            Some(serde_json::Value::String(s)) => {
                Some(Scope::parse(&s).map_err(|e| D::Error::custom(format!("scope: {e}")))?)
            }
            Some(_) => return Err(D::Error::custom("scope: must be a string")),
        };
        let missing = match take(&mut value, "missing") {
            None => None,
            Some(m) => Some(
                UnknownUser::deserialize(m)
                    .map_err(|_| D::Error::custom("missing: must be \"deny\" or \"allow\""))?,
            ),
        };
        let event = take_event(&mut value).map_err(D::Error::custom)?;
        let limit = crate::model::nested_error(value, None)?;
        Ok(CapDef {
            scope,
            missing,
            event,
            limit,
        })
    }
}

impl JsonSchema for CapDef {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Cap".into()
    }
    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let limit = generator.subschema_for::<LimitDef>();
        let scope = generator.subschema_for::<Scope>();
        let missing = generator.subschema_for::<UnknownUser>();
        let event = generator.subschema_for::<EventType>();
        schemars::json_schema!({
            "description": "A rate, gap or window item with an optional `scope` (default \"user\"), `event`: the event type it counts (default \"impression\"), and, for a cap scoped to another identity kind, `missing`: what a request without that identity gets (default \"deny\").",
            "allOf": [limit],
            "properties": {"scope": scope, "missing": missing, "event": event}
        })
    }
}

/// A budget in a campaign: a budget item whose `kind` may be omitted, and
/// which may count over the campaign's flight (`"per": "flight"`).
#[derive(Debug, Clone, PartialEq)]
pub struct CampaignBudget {
    pub limit: LimitDef,
    pub per: BudgetPer,
    /// The event type it counts (default `impression`: commits and
    /// events without a `type`; docs/semantics.md §6.9).
    pub event: Option<EventType>,
}

/// What a campaign's budget counts over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BudgetPer {
    /// Its calendar period (`per`: `1h`, `1d`, `1w`, `1mo`; default `1d`).
    #[default]
    Calendar,
    /// The campaign's flight, as one period (docs/semantics.md §6.7).
    Flight,
}

impl Serialize for CampaignBudget {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::Error;
        let mut v = serde_json::to_value(&self.limit).map_err(S::Error::custom)?;
        if let Some(m) = v.as_object_mut() {
            if self.per == BudgetPer::Flight {
                m.insert("per".into(), "flight".into());
            }
            if let Some(e) = self.event {
                m.insert("event".into(), e.as_str().into());
            }
        }
        v.serialize(s)
    }
}

impl JsonSchema for CampaignBudget {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "CampaignBudget".into()
    }
    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let limit = generator.subschema_for::<LimitDef>();
        let event = generator.subschema_for::<EventType>();
        schemars::json_schema!({
            "description": "A budget in a campaign: a budget item whose `kind` may be omitted, whose `per` may be \"flight\" when the campaign has a `flight`, and whose `event` is the event type it counts (default \"impression\").",
            "allOf": [limit],
            "properties": {"event": event}
        })
    }
}

impl<'de> Deserialize<'de> for CampaignBudget {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let mut value = serde_json::Value::deserialize(d)?;
        let mut per = BudgetPer::Calendar;
        let event = take_event(&mut value).map_err(D::Error::custom)?;
        if let Some(m) = value.as_object_mut() {
            match m.get("kind") {
                None => {
                    m.insert("kind".into(), "budget".into());
                }
                Some(k) if k == "budget" => {}
                Some(_) => return Err(D::Error::custom("kind: must be \"budget\" or absent")),
            }
            if m.get("per").is_some_and(|p| p == "flight") {
                m.remove("per");
                per = BudgetPer::Flight;
            }
        }
        crate::model::nested_error(value, None).map(|limit| CampaignBudget { limit, per, event })
    }
}

/// A campaign: any capped entity (advertiser, campaign, line item, creative).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CampaignDef {
    /// The parent campaign's id: its caps (and its ancestors') apply too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// IANA time zone for this campaign's calendar caps and budget period when
    /// they name none; default UTC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tz: Option<String>,
    /// Caps: rate, gap or window items, each with a scope; at most 64.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub caps: Vec<CapDef>,
    /// Paced spend per period (campaign scope).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<CampaignBudget>,
    /// Reservations open at once, 1 ≤ n < 2^53.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 9_007_199_254_740_991_i64))]
    pub max_in_flight: Option<u64>,
    /// Screens without a user: `deny` (default) or `allow`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unknown_user: Option<UnknownUser>,
    /// `enforce` (default) or `shadow`: its caps, budget and max_in_flight
    /// are decided and counted but never make a candidate ineligible.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<crate::model::limit::Mode>,
    /// Competitive exclusion: within one screen, at most one eligible
    /// candidate per label, the first in order; a label applies to the
    /// campaign's descendants too. At most 16, each 1 to 64 letters,
    /// digits, `-`, `_`, `.` or `:` (docs/semantics.md §6.4).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub exclusion_labels: Vec<String>,
    /// How many eligible candidates under this campaign (itself and its
    /// descendants) one screen may have, 1 to 10 000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10_000))]
    pub max_per_screen: Option<u32>,
    /// Give eligible candidates the pacing levers of this campaign's budget
    /// in screen answers: a pass probability and a bid multiplier, moved
    /// each minute (docs/pacing.md, "Levers"). Needs a `budget`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pacing_levers: Option<bool>,
    /// The dates it delivers in: outside `[start, end)` a screen answers
    /// its candidates, and its descendants', ineligible (`denied_by.cap`
    /// `"flight"`; docs/semantics.md §6.7).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flight: Option<FlightDef>,
    /// The hours of the week it delivers in (dayparting): outside them a
    /// screen answers its candidates, and its descendants', ineligible
    /// (`denied_by.cap` `"schedule"`; docs/semantics.md §6.8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<ScheduleDef>,
    /// Ancestors' caps this campaign (and its descendants) opts out of,
    /// each `"<ancestor>/<cap name>"`: they neither decide nor count its
    /// impressions and events (docs/semantics.md §6.9). At most 16.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub ignore_caps: Vec<String>,
}

/// A schedule: spans of local hours per day of the week, in one zone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Schedule")]
pub struct ScheduleDef {
    /// IANA time zone of the hours; default the campaign's `tz`, else UTC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tz: Option<String>,
    /// 1 to 64 spans; a candidate is eligible inside any of them.
    #[schemars(length(min = 1, max = 64))]
    pub hours: Vec<HoursDef>,
}

/// One span of a schedule: `[from, until)` of local time on each of `days`.
/// A span past midnight is two (`"22:00"`–`"24:00"`, then `"00:00"`–…).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "ScheduleHours")]
pub struct HoursDef {
    /// Days of the week, 1 to 7 of "mon" … "sun".
    #[schemars(length(min = 1, max = 7))]
    pub days: Vec<Day>,
    /// Local time the span opens at, "HH:MM" from "00:00" to "23:59".
    #[schemars(extend("pattern" = "^([01][0-9]|2[0-3]):[0-5][0-9]$"))]
    pub from: String,
    /// Local time it closes at (excluded), after `from`, up to "24:00".
    #[schemars(extend("pattern" = "^(([01][0-9]|2[0-3]):[0-5][0-9]|24:00)$"))]
    pub until: String,
}

/// A day of the week.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Day {
    Mon,
    Tue,
    Wed,
    Thu,
    Fri,
    Sat,
    Sun,
}

impl Day {
    /// `"mon"` … `"sun"`, as written.
    pub fn as_str(self) -> &'static str {
        match self {
            Day::Mon => "mon",
            Day::Tue => "tue",
            Day::Wed => "wed",
            Day::Thu => "thu",
            Day::Fri => "fri",
            Day::Sat => "sat",
            Day::Sun => "sun",
        }
    }
}

/// The most spans a schedule may have.
pub const MAX_SCHEDULE_SPANS: usize = 64;

/// "HH:MM" as minutes of the day: 00:00 to 23:59, or 24:00 if `end`.
fn minutes(text: &str, end: bool) -> Option<u16> {
    let (h, m) = text.split_once(':')?;
    if h.len() != 2 || m.len() != 2 || !(h.bytes().chain(m.bytes())).all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (h, m): (u16, u16) = (h.parse().ok()?, m.parse().ok()?);
    match (h, m) {
        (24, 0) if end => Some(1_440),
        (0..=23, 0..=59) => Some(h * 60 + m),
        _ => None,
    }
}

impl ScheduleDef {
    /// Compiled in zone `tz`, or `default_tz` (the campaign's); errors
    /// name the field (`schedule.hours[0].until`).
    pub fn compile(&self, default_tz: &Option<String>) -> Result<Schedule, DefinitionError> {
        let tz_name = self.tz.as_ref().or(default_tz.as_ref());
        let tz = match tz_name {
            None => jiff::tz::TimeZone::UTC,
            Some(name) => jiff::tz::TimeZone::get(name).map_err(|_| {
                DefinitionError::new(
                    if self.tz.is_some() {
                        "schedule.tz"
                    } else {
                        "tz"
                    },
                    format!("unknown IANA time zone {name:?} (e.g. \"Europe/Paris\", \"UTC\")"),
                )
            })?,
        };
        if self.hours.is_empty() || self.hours.len() > MAX_SCHEDULE_SPANS {
            return Err(DefinitionError::new(
                "schedule.hours",
                format!(
                    "must have 1 to {MAX_SCHEDULE_SPANS} spans, got {}",
                    self.hours.len()
                ),
            ));
        }
        let mut spans = Vec::with_capacity(self.hours.len());
        for (i, h) in self.hours.iter().enumerate() {
            let path = format!("schedule.hours[{i}]");
            if h.days.is_empty() {
                return Err(DefinitionError::new(
                    format!("{path}.days"),
                    "at least one day: \"mon\" … \"sun\"",
                ));
            }
            let from = minutes(&h.from, false).ok_or_else(|| {
                DefinitionError::new(
                    format!("{path}.from"),
                    format!(
                        "must be \"HH:MM\" from \"00:00\" to \"23:59\", got {:?}",
                        h.from
                    ),
                )
            })?;
            let until = minutes(&h.until, true).ok_or_else(|| {
                DefinitionError::new(
                    format!("{path}.until"),
                    format!("must be \"HH:MM\" up to \"24:00\", got {:?}", h.until),
                )
            })?;
            if until <= from {
                return Err(DefinitionError::new(
                    format!("{path}.until"),
                    format!(
                        "must be after from ({:?}), got {:?}; a span past midnight is two: \
                         one until \"24:00\", one from \"00:00\" the next day",
                        h.from, h.until
                    ),
                ));
            }
            let days = h.days.iter().map(|&d| d as u8).collect();
            spans.push((days, from, until));
        }
        Ok(Schedule::new(tz, &spans))
    }
}

/// A flight: `[start, end)`, two RFC 3339 instants with an offset
/// (`"2026-06-01T00:00:00Z"`, `"2026-06-01T00:00:00+02:00"`), as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Flight")]
pub struct FlightDef {
    /// The first instant it delivers at: an RFC 3339 date-time with an offset.
    #[schemars(extend("format" = "date-time"))]
    pub start: String,
    /// The instant it stops delivering at (excluded), after `start`.
    #[schemars(extend("format" = "date-time"))]
    pub end: String,
}

impl FlightDef {
    /// `[start, end)` in ns since the epoch, checked: each an RFC 3339
    /// instant from 1970 on, `end` after `start`. Errors name the field.
    pub fn bounds(&self) -> Result<(Nanos, Nanos), DefinitionError> {
        let at = |field: &str, text: &str| -> Result<Nanos, DefinitionError> {
            let ts: jiff::Timestamp = text.parse().map_err(|e| {
                DefinitionError::new(
                    format!("flight.{field}"),
                    format!(
                        "must be an RFC 3339 date-time with an offset, such as \
                         \"2026-06-01T00:00:00Z\", got {text:?}: {e}"
                    ),
                )
            })?;
            Nanos::try_from(ts.as_nanosecond()).map_err(|_| {
                DefinitionError::new(
                    format!("flight.{field}"),
                    format!("must be from 1970 on, got {text:?}"),
                )
            })
        };
        let (start, end) = (at("start", &self.start)?, at("end", &self.end)?);
        if end <= start {
            return Err(DefinitionError::new(
                "flight.end",
                format!(
                    "must be after flight.start ({:?}), got {:?}",
                    self.start, self.end
                ),
            ));
        }
        Ok((start, end))
    }
}

/// Labels a campaign may carry (`exclusion_labels`).
pub const MAX_EXCLUSION_LABELS: usize = 16;
/// The longest label, in bytes.
pub const MAX_LABEL_LEN: usize = 64;
/// The largest `max_per_screen`.
pub const MAX_PER_SCREEN: u32 = 10_000;

/// Checks `exclusion_labels` and `max_per_screen`, naming the field.
fn check_screen_rules(def: &CampaignDef) -> Result<(), DefinitionError> {
    let labels = &def.exclusion_labels;
    if labels.len() > MAX_EXCLUSION_LABELS {
        return Err(DefinitionError::new(
            "exclusion_labels",
            format!(
                "at most {MAX_EXCLUSION_LABELS} labels, got {}",
                labels.len()
            ),
        ));
    }
    for (i, l) in labels.iter().enumerate() {
        let ok = (1..=MAX_LABEL_LEN).contains(&l.len())
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'));
        if !ok {
            return Err(DefinitionError::new(
                format!("exclusion_labels[{i}]"),
                format!(
                    "a label is 1 to {MAX_LABEL_LEN} letters, digits, '-', '_', '.' or ':', got {l:?}"
                ),
            ));
        }
        if labels[..i].contains(l) {
            return Err(DefinitionError::new(
                format!("exclusion_labels[{i}]"),
                format!("{l:?} is listed twice"),
            ));
        }
    }
    if let Some(n) = def.max_per_screen
        && !(1..=MAX_PER_SCREEN).contains(&n)
    {
        return Err(DefinitionError::new(
            "max_per_screen",
            format!("must be an integer from 1 to {MAX_PER_SCREEN}, got {n}"),
        ));
    }
    Ok(())
}

/// One compiled cap, budget or max_in_flight item of a campaign.
#[derive(Debug, Clone, PartialEq)]
pub struct CompiledCap {
    pub scope: Scope,
    /// For a [`Scope::Id`] cap: what a request without that identity gets
    /// (`deny`, the default, denies by `unknown_<kind>`).
    pub missing: UnknownUser,
    /// The reported name (`denied_by.cap`).
    pub name: String,
    pub item: Item,
    /// The event type it counts: a commit and an event without `type` are
    /// impressions; an item of another type is only probed by a screen
    /// (room for one unit), never held (docs/semantics.md §6.9).
    pub event: EventType,
    /// The item as each priority class sees it (`None`: all see `item`).
    pub classes: Option<Classes>,
    /// Its counter's tag ([`crate::limits::counter_tag`]): its name and
    /// the class of its state, so an edit keeps its counts (docs/semantics.md
    /// §5.3).
    pub tag: u32,
    /// A hash of the item's definition as written: the low bits of the tag
    /// its counters had before format 4, read only to migrate older records.
    pub fingerprint: u32,
}

/// A campaign validated and compiled.
#[derive(Debug, Clone)]
pub struct CompiledCampaign {
    /// Caps in definition order, then the budget (named `budget`), then
    /// max_in_flight (named `max_in_flight`): the order of `denied_by`.
    pub items: Vec<CompiledCap>,
    pub unknown_user: UnknownUser,
    /// Its own flight, `[start, end)` in ns (its ancestors' are theirs).
    pub flight: Option<(Nanos, Nanos)>,
    /// Its own schedule (its ancestors' are theirs).
    pub schedule: Option<Arc<Schedule>>,
    /// `ignore_caps` read: (ancestor, cap name) pairs, whose existence the
    /// registry checks.
    pub ignore_caps: Vec<(String, String)>,
    pub warnings: Vec<Warning>,
}

/// A 32-bit FNV-1a hash of an item's canonical JSON, priorities left out:
/// what counters were tagged by before format 4 (docs/semantics.md §5.3 then
/// said a changed item starts empty). Only the migration of older records
/// reads it.
pub fn fingerprint(def: &LimitDef) -> u32 {
    let def = match def.priorities() {
        Some(_) => std::borrow::Cow::Owned(def.without_priorities()),
        None => std::borrow::Cow::Borrowed(def),
    };
    let text = serde_json::to_string(&*def).unwrap_or_default();
    crate::limits::fnv1a(text.bytes())
}

/// The counter tag of item `name` counting events of type `event`: an
/// impression item's is its name's and kind's (as before event types
/// were), another type's also hashes the type, so an edit from counting
/// impressions to counting clicks starts the counter empty: it counts
/// something else (docs/semantics.md §5.3).
fn event_tag(name: &str, event: EventType, item: &Item) -> u32 {
    match event.is_impression() {
        true => counter_tag(name, item),
        false => counter_tag(&format!("{name}@{event}"), item),
    }
}

/// The most ancestors' caps one campaign may opt out of.
pub const MAX_OPT_OUTS: usize = 16;

impl CampaignDef {
    /// `ignore_caps` read as (ancestor, cap name) pairs; errors name the
    /// entry (`ignore_caps[1]`). Whether they exist is the registry's to
    /// check, as a parent's is.
    fn opt_outs(&self) -> Result<Vec<(String, String)>, DefinitionError> {
        if self.ignore_caps.len() > MAX_OPT_OUTS {
            return Err(DefinitionError::new(
                "ignore_caps",
                format!(
                    "at most {MAX_OPT_OUTS} entries, got {}",
                    self.ignore_caps.len()
                ),
            ));
        }
        let mut out: Vec<(String, String)> = Vec::with_capacity(self.ignore_caps.len());
        for (i, entry) in self.ignore_caps.iter().enumerate() {
            let field = format!("ignore_caps[{i}]");
            let Some((campaign, cap)) = entry
                .split_once('/')
                .filter(|(c, n)| !c.is_empty() && !n.is_empty())
            else {
                return Err(DefinitionError::new(
                    field,
                    format!(
                        "must be \"<ancestor>/<cap name>\" (\"advertiser/daily\"), got {entry:?}"
                    ),
                ));
            };
            let pair = (campaign.to_owned(), cap.to_owned());
            if out.contains(&pair) {
                return Err(DefinitionError::new(
                    field,
                    format!("{entry:?} is given twice"),
                ));
            }
            out.push(pair);
        }
        Ok(out)
    }
}

/// The field naming compiled item `i` of `def` (caps, then the budget, then
/// max_in_flight).
fn cap_path(def: &CampaignDef, i: usize) -> String {
    match i.checked_sub(def.caps.len()) {
        None => format!("caps[{i}].name"),
        Some(0) if def.budget.is_some() => "budget".to_owned(),
        Some(_) => "max_in_flight".to_owned(),
    }
}

/// Gives a calendar window or budget without its own `tz` the campaign's.
fn with_tz(def: &LimitDef, tz: &Option<String>) -> LimitDef {
    let mut def = def.clone();
    if tz.is_some() {
        match &mut def {
            LimitDef::Window(w)
                if w.tz.is_none() && w.align == Some(crate::model::limit::Align::Calendar) =>
            {
                w.tz = tz.clone()
            }
            LimitDef::Budget(b) if b.tz.is_none() => b.tz = tz.clone(),
            _ => {}
        }
    }
    def
}

/// A campaign's budget item counted over its flight `flight`
/// ([`Budget::over_flight`]); errors name the field.
fn over_flight(item: Item, flight: Option<(Nanos, Nanos)>) -> Result<Item, DefinitionError> {
    let Some((start, end)) = flight else {
        return Err(DefinitionError::new(
            "budget.per",
            "\"flight\" counts the budget over the campaign's flight: add a `flight`",
        ));
    };
    if end - start > MAX_FLIGHT_NS {
        return Err(DefinitionError::new(
            "budget.per",
            format!(
                "a budget per flight needs a flight of at most {} days, got {:.1}",
                MAX_FLIGHT_NS / 86_400_000_000_000,
                (end - start) as f64 / 86_400e9
            ),
        ));
    }
    match item {
        Item::Budget(b) => b
            .over_flight(start, end)
            .map(Item::Budget)
            .map_err(|m| DefinitionError::new("budget.pacing", m)),
        item => Ok(item),
    }
}

impl CampaignDef {
    /// Validates the definition on its own (the parent's existence and cycles
    /// are the registry's to check). Errors name the field (`caps[1].limit`).
    pub fn compile(&self) -> Result<CompiledCampaign, DefinitionError> {
        if let Some(tz) = &self.tz
            && jiff::tz::TimeZone::get(tz).is_err()
        {
            return Err(DefinitionError::new(
                "tz",
                format!("unknown IANA time zone {tz:?} (e.g. \"Europe/Paris\", \"UTC\")"),
            ));
        }
        check_screen_rules(self)?;
        let flight = self.flight.as_ref().map(FlightDef::bounds).transpose()?;
        let schedule = match &self.schedule {
            Some(s) => Some(Arc::new(s.compile(&self.tz)?)),
            None => None,
        };
        if self.caps.len() > MAX_CAPS {
            return Err(DefinitionError::new(
                "caps",
                format!("at most {MAX_CAPS} caps, got {}", self.caps.len()),
            ));
        }
        let mut items = Vec::new();
        let mut names: Vec<String> = Vec::new();
        for (i, cap) in self.caps.iter().enumerate() {
            let path = format!("caps[{i}]");
            if !matches!(
                cap.limit,
                LimitDef::Rate(_) | LimitDef::Gap(_) | LimitDef::Window(_)
            ) {
                return Err(DefinitionError::new(
                    format!("{path}.kind"),
                    "a cap is a rate, gap or window item; use `budget` and `max_in_flight` \
                     for the others",
                ));
            }
            let def = with_tz(&cap.limit, &self.tz);
            let name = cap.limit.reported_name(i);
            if names.contains(&name) {
                return Err(DefinitionError::new(
                    format!("{path}.name"),
                    format!("the name {name:?} is used by another cap"),
                ));
            }
            names.push(name.clone());
            if cap.missing.is_some() && !matches!(cap.scope(), Scope::Id(_)) {
                return Err(DefinitionError::new(
                    format!("{path}.missing"),
                    "only a cap scoped to an identity other than the user (\"household\", \
                     \"device\") has `missing`; a user cap follows the campaign's unknown_user",
                ));
            }
            let item = def.compile(&path)?;
            let event = cap.event.unwrap_or_default();
            items.push(CompiledCap {
                scope: cap.scope(),
                missing: cap.missing.unwrap_or_default(),
                classes: def.classes(&path, &item)?,
                tag: event_tag(&name, event, &item),
                name,
                item,
                event,
                fingerprint: fingerprint(&def),
            });
        }
        // Redundant or contradictory windows are judged per scope: a user cap and
        // a campaign cap of the same length count different things.
        let mut warnings = Vec::new();
        let mut scopes: Vec<Scope> = Vec::new();
        for c in &self.caps {
            if !scopes.contains(&c.scope()) {
                scopes.push(c.scope());
            }
        }
        for scope in scopes {
            let same: Vec<(usize, &LimitDef)> = self
                .caps
                .iter()
                .enumerate()
                .filter(|(_, c)| c.scope() == scope)
                .map(|(i, c)| (i, &c.limit))
                .collect();
            warnings.extend(check_windows_among("caps", &same)?);
        }
        if self.pacing_levers == Some(true) && self.budget.is_none() {
            return Err(DefinitionError::new(
                "pacing_levers",
                "the levers are a budget's: add a `budget`, or leave pacing_levers out",
            ));
        }
        if let Some(CampaignBudget {
            limit: b,
            per,
            event,
        }) = &self.budget
        {
            let def = with_tz(b, &self.tz);
            let event = event.unwrap_or_default();
            let mut item = match def.compile("budget")? {
                Item::Budget(b) if self.pacing_levers == Some(true) => {
                    Item::Budget(b.with_levers())
                }
                item => item,
            };
            // Paced over its schedule's hours only (§6.8).
            if let (Item::Budget(b), Some(sc)) = (&item, &schedule) {
                item = Item::Budget(b.clone().within(sc.clone()));
            }
            if *per == BudgetPer::Flight {
                item = over_flight(item, flight)?;
            }
            items.push(CompiledCap {
                scope: Scope::Campaign,
                missing: UnknownUser::Deny,
                name: "budget".into(),
                classes: def.classes("budget", &item)?,
                tag: event_tag("budget", event, &item),
                item,
                event,
                fingerprint: fingerprint(&def),
            });
        }
        if let Some(max) = self.max_in_flight {
            if max == 0 || max > MAX_EXACT {
                return Err(DefinitionError::new(
                    "max_in_flight",
                    format!("must be an integer from 1 to 2^53 - 1, got {max}"),
                ));
            }
            let item = Item::Concurrency(Concurrency { max });
            items.push(CompiledCap {
                scope: Scope::Campaign,
                missing: UnknownUser::Deny,
                name: "max_in_flight".into(),
                tag: counter_tag("max_in_flight", &item),
                item,
                // A reservation's place: held by a screen, never by an event.
                event: EventType::IMPRESSION,
                classes: None,
                // The definition is the number itself.
                fingerprint: (max as u32) ^ ((max >> 32) as u32) ^ 0x6d69_6621,
            });
        }
        check_tags(
            items
                .iter()
                .enumerate()
                .map(|(i, c)| (cap_path(self, i), c.tag)),
        )?;
        Ok(CompiledCampaign {
            items,
            unknown_user: self.unknown_user.unwrap_or_default(),
            flight,
            schedule,
            ignore_caps: self.opt_outs()?,
            warnings,
        })
    }
}
