//! The bodies the client sends and reads: the JSON of docs/semantics.md §8,
//! field for field (the OpenAPI document, `schemas/openapi.json`, describes
//! the same shapes). Definitions are the crate's own types
//! ([`crate::PolicyDef`], [`crate::model::CampaignDef`]).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::engine::Priority;
use crate::model::LimitDef;

fn is_one(v: &u64) -> bool {
    *v == 1
}

/// `POST /v1/check`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Check {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limits: Option<Vec<LimitDef>>,
    pub key: String,
    #[serde(skip_serializing_if = "is_one")]
    pub cost: u64,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub reserve: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// With an id, a repeated check returns the first answer: only then is a
    /// check retried.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reservation_id: Option<String>,
    /// The request's class (docs/semantics.md §2.5); absent: `default`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<Priority>,
}

impl Check {
    /// `key` against the policy named `policy`, cost 1.
    pub fn policy(policy: impl Into<String>, key: impl Into<String>) -> Check {
        Check {
            policy: Some(policy.into()),
            limits: None,
            key: key.into(),
            cost: 1,
            reserve: false,
            ttl_ms: None,
            reservation_id: None,
            priority: None,
        }
    }

    /// The request's class: items with priorities decide it as that class
    /// sees them.
    pub fn priority(mut self, class: Priority) -> Check {
        self.priority = Some(class);
        self
    }

    pub fn cost(mut self, cost: u64) -> Check {
        self.cost = cost;
        self
    }

    /// Hold the debit until commit, release or `ttl_ms`.
    pub fn reserve(mut self, ttl_ms: Option<u64>) -> Check {
        self.reserve = true;
        self.ttl_ms = ttl_ms;
        self
    }

    /// The caller's reservation id (makes the call safe to retry).
    pub fn id(mut self, id: impl Into<String>) -> Check {
        self.reservation_id = Some(id.into());
        self
    }
}

/// One limit item's figures.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Item {
    pub name: String,
    pub kind: String,
    pub limit: u64,
    pub remaining: u64,
    pub reset_after_ms: u64,
    pub retry_after_ms: Option<u64>,
    pub allowed: bool,
}

/// A check's answer (200 or 429 alike: a denial is an answer).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Decision {
    pub allowed: bool,
    pub delay_ms: u64,
    pub retry_after_ms: Option<u64>,
    pub remaining: u64,
    pub reset_after_ms: u64,
    pub reservation: Option<String>,
    pub limits: Vec<Item>,
    /// Shadow mode: enforcing would have denied (docs/semantics.md,
    /// "Shadow mode").
    #[serde(default)]
    pub would_deny: bool,
    /// Set by the client, not the server: freqcap could not be asked and the
    /// call was made with [`super::FailMode::Open`].
    #[serde(skip)]
    pub failed_open: bool,
}

impl Decision {
    /// The answer of a check that failed open: allowed, nothing known.
    pub(crate) fn open() -> Decision {
        Decision {
            allowed: true,
            delay_ms: 0,
            retry_after_ms: None,
            remaining: 0,
            reset_after_ms: 0,
            reservation: None,
            limits: Vec::new(),
            would_deny: false,
            failed_open: true,
        }
    }
}

/// One candidate of a screen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Candidate {
    pub campaign: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<u64>,
}

/// `POST /v1/screen`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Screen {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The viewer's other identities by kind (`household`, `device`): a
    /// cap scoped to a kind counts on that identity.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub ids: BTreeMap<String, String>,
    pub candidates: Vec<Candidate>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub reserve: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reservation_id: Option<String>,
    /// The request's class, for every candidate's caps; absent: `default`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<Priority>,
}

impl Screen {
    /// `campaigns` for `user`, cost 1 each, without reserving.
    pub fn new<S: Into<String>>(
        user: impl Into<String>,
        campaigns: impl IntoIterator<Item = S>,
    ) -> Screen {
        Screen {
            user: Some(user.into()),
            candidates: campaigns
                .into_iter()
                .map(|c| Candidate {
                    campaign: c.into(),
                    cost: None,
                })
                .collect(),
            reserve: false,
            ttl_ms: None,
            reservation_id: None,
            priority: None,
            ids: BTreeMap::new(),
        }
    }

    /// Names the viewer's identity of `kind` too (`household`, `device`).
    pub fn identity(mut self, kind: impl Into<String>, id: impl Into<String>) -> Screen {
        self.ids.insert(kind.into(), id.into());
        self
    }

    /// The request's class, for every candidate's caps.
    pub fn priority(mut self, class: Priority) -> Screen {
        self.priority = Some(class);
        self
    }

    /// Hold what is eligible until commit, release or `ttl_ms`.
    pub fn reserve(mut self, ttl_ms: Option<u64>) -> Screen {
        self.reserve = true;
        self.ttl_ms = ttl_ms;
        self
    }

    /// The caller's reservation id (makes the call safe to retry).
    pub fn id(mut self, id: impl Into<String>) -> Screen {
        self.reservation_id = Some(id.into());
        self
    }
}

/// Why a candidate is not eligible.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct DeniedBy {
    pub campaign: String,
    pub cap: String,
    pub retry_after_ms: Option<u64>,
}

/// One candidate's answer.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ScreenResult {
    pub campaign: String,
    pub eligible: bool,
    #[serde(default)]
    pub denied_by: Option<DeniedBy>,
    /// Shadow mode: eligible, but enforcing would have denied it by this cap.
    #[serde(default)]
    pub would_deny: Option<DeniedBy>,
    /// Under a campaign with `pacing_levers`: its budget's levers
    /// (docs/pacing.md, "Levers").
    #[serde(default)]
    pub pacing: Option<PacingLevers>,
}

/// A budget's pacing levers as of a screen: let a request through with
/// `pass_probability`, and scale its bid by `bid_multiplier`.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
pub struct PacingLevers {
    /// 0.001 to 1.
    pub pass_probability: f64,
    /// 0.1 to 1.
    pub bid_multiplier: f64,
}

/// A screen's answer.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Screened {
    pub reservation: Option<String>,
    pub results: Vec<ScreenResult>,
    /// Set by the client: every candidate answered eligible because freqcap
    /// could not be asked ([`super::FailMode::Open`]).
    #[serde(skip)]
    pub failed_open: bool,
}

/// `POST /v1/reservations/{id}/commit`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Commit {
    /// The winners (default: every campaign the reservation holds).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub campaign: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
    /// Needed only to commit, on another node of a cluster, a reservation
    /// whose id the caller chose.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// A late commit's other identities of the viewer (`household`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub ids: BTreeMap<String, String>,
    /// What happened to the work the reservation admitted, for the
    /// policy's adaptive items.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub report: Option<Report>,
}

pub use crate::limits::adaptive::Outcome;

/// What happened to the work a check's reservation admitted, sent with its
/// commit or release: an `adaptive` item of the policy moves its limit
/// from these (docs/adaptive.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Report {
    pub latency_ms: u64,
    pub outcome: Outcome,
}

impl Report {
    /// A report of work that took `latency` (rounded up to a millisecond,
    /// at most an hour) and ended as `outcome`.
    pub fn new(latency: std::time::Duration, outcome: Outcome) -> Report {
        let ms = latency.as_nanos().div_ceil(1_000_000);
        Report {
            latency_ms: u64::try_from(ms)
                .unwrap_or(u64::MAX)
                .min(crate::front::sample::MAX_LATENCY_MS),
            outcome,
        }
    }

    /// Work started at `start` that ended now as `outcome`.
    pub fn since(start: std::time::Instant, outcome: Outcome) -> Report {
        Report::new(start.elapsed(), outcome)
    }
}

/// A commit's or release's answer.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Settled {
    pub reservation: String,
    /// `committed`, `released` or `late_commit`.
    pub outcome: String,
    #[serde(default)]
    pub campaigns: Vec<String>,
}

/// One event of `POST /v1/events`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Event {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// As [`Screen::ids`].
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub ids: BTreeMap<String, String>,
    pub campaign: String,
    #[serde(skip_serializing_if = "is_one")]
    pub cost: u64,
    /// With an id an event is counted once: only then are events retried.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
    /// Its type, `"impression"` if `None`: only caps and budgets counting
    /// this type count it (`"click"`; docs/semantics.md §6.9).
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub event_type: Option<String>,
}

/// `POST /v1/events`'s answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct EventsCounted {
    pub counted: usize,
    pub duplicates: usize,
}

/// One cap's usage by a user.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct CapUsage {
    pub campaign: String,
    pub name: String,
    pub scope: String,
    pub kind: String,
    /// The event type the cap counts (`impression`, `click`).
    pub event: String,
    pub limit: u64,
    pub used: u64,
    pub pending: u64,
    pub remaining: u64,
    pub reset_after_ms: u64,
}

/// `GET /v1/users/{user}/campaigns/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Usage {
    pub user: String,
    pub campaign: String,
    pub caps: Vec<CapUsage>,
}

/// `GET /v1/ids/{kind}/{ident}/campaigns/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct IdentityUsage {
    pub kind: String,
    pub ident: String,
    pub campaign: String,
    pub caps: Vec<CapUsage>,
}

/// `GET /v1/campaigns/{id}/delivery`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Delivery {
    pub campaign: String,
    pub amount: u64,
    pub spent: u64,
    pub pending: u64,
    pub cap_now: u64,
    pub pacing: serde_json::Value,
    pub period_start: String,
    pub period_end: String,
    /// When the budget keeps them: its pacing levers now.
    #[serde(default)]
    pub levers: Option<PacingLevers>,
}

pub use crate::simulate::forecast::{CampaignForecast, DayForecast, Forecast, FrequencyBucket};

/// `POST /v1/forecast`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ForecastRequest {
    /// Parents before their children.
    pub campaigns: Vec<ForecastCampaign>,
    pub traffic: ForecastTraffic,
    /// The share of users (households) decided; absent: 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sample: Option<f64>,
}

/// A campaign to forecast.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ForecastCampaign {
    pub id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<u64>,
    pub campaign: crate::model::CampaignDef,
}

/// Modelled traffic; the unset fields take the server's defaults.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct ForecastTraffic {
    pub requests: f64,
    pub users: u32,
    #[serde(skip_serializing_if = "is_zero")]
    pub households: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub days: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tz: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zipf: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub candidates: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diurnal: Option<Vec<f64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lost_share: Option<f64>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}
