//! What callers send the engine and what it answers, and the one set of
//! validators every operation checks its fields with (cost, ttl, ids,
//! reservation ids, definition names).

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use crate::MAX_EXACT;
use crate::clock::{MS, Nanos};
use crate::limits::adaptive::Sample;
use crate::limits::priority::Priority;
use crate::limits::stack::{Decision, Stack};
use crate::model::limit::{LimitDef, compile_stack};

use super::{EngineError, invalid};

/// Default and largest reservation lifetimes (docs/semantics.md §4.1).
pub const DEFAULT_TTL_MS: u64 = 60_000;
pub const MAX_TTL_MS: u64 = 3_600_000;

/// What a check is decided against.
#[derive(Debug, Clone, PartialEq)]
pub enum CheckTarget {
    Policy(String),
    Inline(Vec<LimitDef>),
    /// Inline limits compiled once by [`crate::engine::Engine::compile_inline`]:
    /// the same state as `Inline` with those items, without compiling them
    /// again on every request.
    Compiled(std::sync::Arc<CompiledInline>),
}

/// Inline limit items, compiled: for a front that decides the same items
/// over and over (RESP's `CL.THROTTLE`: compiling and fingerprinting them
/// took ~6 % of a core at 500 000 checks/s).
#[derive(Debug, Clone, PartialEq)]
pub struct CompiledInline {
    pub(crate) stack: std::sync::Arc<crate::limits::stack::Stack>,
    pub(crate) tags: Vec<u32>,
}

/// `POST /v1/check`.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckRequest {
    pub target: CheckTarget,
    pub key: String,
    pub cost: u64,
    pub reserve: bool,
    pub ttl_ms: Option<u64>,
    pub reservation_id: Option<String>,
    /// The request as its caller sent it, hashed (the HTTP layer hashes the
    /// JSON value of the body): a repeat of a reserve under a live id is the
    /// same request only if this matches. `None`: the fields above are
    /// compared instead.
    pub fingerprint: Option<u64>,
    /// The request's class (docs/semantics.md §2.5): items with priorities
    /// are decided as this class sees them.
    pub priority: Priority,
}

/// A check's answer: the decision, its stack (for names and kinds), and the
/// reservation made, if any.
#[derive(Debug, Clone)]
pub struct CheckOutcome {
    pub decision: Decision,
    pub stack: Arc<Stack>,
    pub reservation: Option<String>,
    /// Shadow mode: enforcing would have denied; `decision` says allowed,
    /// its figures are enforcement's, and nothing was debited or held
    /// (docs/semantics.md, "Shadow mode").
    pub would_deny: bool,
}

/// One candidate of a screen.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ScreenCandidate {
    pub campaign: String,
    /// Cost charged to budgets (caps count 1). Default 1.
    pub cost: Option<u64>,
}

/// `POST /v1/screen`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ScreenRequest {
    pub user: Option<String>,
    /// The viewer's other identities, (kind, id), e.g. `("household",
    /// "h7")`: a cap scoped to a kind counts on that identity's record
    /// (docs/semantics.md §6.2). At most 7 (with the user, [`crate::model::identity::MAX_IDS`]).
    pub ids: Identities,
    pub candidates: Vec<ScreenCandidate>,
    pub reserve: bool,
    pub ttl_ms: Option<u64>,
    pub reservation_id: Option<String>,
    /// As [`CheckRequest::fingerprint`].
    pub fingerprint: Option<u64>,
    /// As [`CheckRequest::priority`], for every candidate's caps.
    pub priority: Priority,
}

/// Why a candidate is not eligible.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeniedBy {
    /// The campaign of the chain whose cap denied.
    pub campaign: Arc<str>,
    /// The cap's name, or `budget`, `max_in_flight`, `unknown_user`,
    /// `unknown_campaign`.
    pub cap: String,
    pub retry_after: Option<crate::clock::Span>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CandidateResult {
    /// Shared with the definition (see `CampaignEntry::name`): a screen of
    /// thousands of candidates copies no names.
    pub campaign: Arc<str>,
    pub eligible: bool,
    pub denied_by: Option<DeniedBy>,
    /// Shadow mode: eligible, but enforcing would have denied it by this
    /// cap; nothing is held for it, and committing it debits nothing.
    pub would_deny: Option<DeniedBy>,
    /// An eligible candidate whose chain has a campaign with
    /// `pacing_levers`: its budget's levers (docs/pacing.md, "Levers").
    pub pacing: Option<crate::limits::budget::Levers>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScreenOutcome {
    pub reservation: Option<String>,
    pub results: Vec<CandidateResult>,
}

/// `POST /v1/reservations/{id}/commit`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CommitRequest {
    /// Winning campaign(s) of a screen; the rest are released. May be empty
    /// when the screen had exactly one eligible candidate.
    pub campaigns: Vec<String>,
    /// Final cost (the clearing price), charged to budgets instead of the
    /// reserved cost.
    pub cost: Option<u64>,
    pub event_id: Option<String>,
    /// With `campaigns` (one) and `cost`, makes a commit of an unknown or
    /// expired id a late commit.
    pub user: Option<String>,
    /// A late commit's other identities of the viewer, counted as an
    /// event's (docs/semantics.md §4.6); a commit of an open reservation
    /// settles the identities it holds on and ignores these.
    pub ids: Identities,
    /// What happened to the work a check's reservation admitted: an
    /// adaptive item of its stack learns from it (docs/adaptive.md).
    pub sample: Option<Sample>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Committed,
    Released,
    LateCommit,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Committed => "committed",
            Outcome::Released => "released",
            Outcome::LateCommit => "late_commit",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitOutcome {
    pub reservation: String,
    pub outcome: Outcome,
    /// Campaigns committed (for a release: those released). Shared names
    /// (see `CampaignEntry::name`): a release of a large screen copies none.
    pub campaigns: Vec<Arc<str>>,
}

/// An impression that happened without a reservation (`POST /v1/events`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub user: Option<String>,
    /// As [`ScreenRequest::ids`].
    pub ids: Identities,
    pub campaign: String,
    pub cost: u64,
    pub event_id: Option<String>,
    /// Its type as given (`"click"`); `None` is an impression
    /// (docs/semantics.md §6.9). Checked with the batch.
    pub event_type: Option<String>,
}

/// A request's identities other than the user: (kind, id).
pub type Identities = Vec<(String, String)>;

/// A request's `user` and `ids` as the fronts take them: `ids` may name the
/// user too (`"ids": {"user": "u1", "household": "h7"}`), the same one as
/// `user` if both are given. Returns the user and the other identities.
pub fn split_ids(
    user: Option<String>,
    ids: impl IntoIterator<Item = (String, String)>,
) -> Result<(Option<String>, Identities), EngineError> {
    let mut user = user;
    let mut others = Vec::new();
    for (kind, id) in ids {
        if kind != "user" {
            others.push((kind, id));
            continue;
        }
        match &user {
            Some(u) if *u != id => {
                return Err(invalid(
                    "ids.user",
                    format!("names user {id:?}, and `user` names {u:?}: give one"),
                ));
            }
            _ => user = Some(id),
        }
    }
    Ok((user, others))
}

/// A hash of a request body, to tell a repeat of a reservation from another
/// request under the same id. Only caller-supplied ids need it (a made id is
/// never sent twice), so the slow Debug rendering is paid only then.
pub(crate) fn body_hash<T: std::fmt::Debug>(
    x: &T,
    caller_id: bool,
    fingerprint: Option<u64>,
) -> u64 {
    if !caller_id {
        return 0;
    }
    if let Some(f) = fingerprint {
        return f;
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    format!("{x:?}").hash(&mut h);
    h.finish()
}

/// A cost (`field` names it): 0 to 2^53 - 1.
pub(crate) fn check_cost(field: &str, cost: u64) -> Result<(), EngineError> {
    if cost > MAX_EXACT {
        return Err(invalid(
            field,
            format!("must be from 0 to 2^53 - 1, got {cost}"),
        ));
    }
    Ok(())
}

/// A reservation's lifetime from its `ttl_ms` field (default
/// [`DEFAULT_TTL_MS`]), in ns.
pub(crate) fn check_ttl(ttl_ms: Option<u64>) -> Result<Nanos, EngineError> {
    let t = ttl_ms.unwrap_or(DEFAULT_TTL_MS);
    if t == 0 || t > MAX_TTL_MS {
        return Err(invalid(
            "ttl_ms",
            format!("must be from 1 to {MAX_TTL_MS}, got {t}"),
        ));
    }
    Ok(t.saturating_mul(MS))
}

/// Whether `s` is 1 to `max` characters of `A-Z a-z 0-9 . _ : -`.
fn is_name(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

/// Checks a reservation id: 1-128 characters of `A-Z a-z 0-9 . _ : -`.
pub fn check_reservation_id(id: &str) -> Result<(), EngineError> {
    if is_name(id, 128) {
        Ok(())
    } else {
        Err(invalid(
            "reservation_id",
            "must be 1-128 characters of A-Z a-z 0-9 . _ : -",
        ))
    }
}

/// Checks a policy or campaign name: 1-256 characters of
/// `A-Z a-z 0-9 . _ : -`.
pub(crate) fn check_def_name(field: &str, name: &str) -> Result<(), EngineError> {
    if is_name(name, 256) {
        Ok(())
    } else {
        Err(invalid(
            field,
            format!("must be 1-256 characters of A-Z a-z 0-9 . _ : -, got {name:?}"),
        ))
    }
}

/// Checks a key, user, campaign or event id: 1 to `max_len` bytes
/// ([`super::EngineOptions::max_id_len`]).
pub(crate) fn check_id(field: &str, id: &str, max_len: usize) -> Result<(), EngineError> {
    if id.is_empty() || id.len() > max_len {
        return Err(invalid(
            field,
            format!("must be 1 to {max_len} bytes, got {}", id.len()),
        ));
    }
    Ok(())
}

/// The error of a commit naming `campaigns[i]`, which is not an eligible
/// candidate of reservation `id` (or is named more often than it was).
pub(crate) fn not_a_winner(campaigns: &[String], i: usize, id: &str) -> EngineError {
    let field = if campaigns.len() == 1 {
        "campaign".to_owned()
    } else {
        format!("campaign[{i}]")
    };
    let name = &campaigns[i];
    invalid(
        field,
        format!(
            "{name:?} is not an eligible candidate of reservation {id:?} (or is named more often than it was eligible)"
        ),
    )
}

/// Compiles inline limit items once, for [`CheckTarget::Compiled`]; the
/// errors name `limits[i]` as a check's would.
pub fn compile_inline(limits: &[LimitDef]) -> Result<Arc<CompiledInline>, EngineError> {
    compile_limits_at("limits", limits)
}

/// [`compile_inline`] for limits written at `path` (an Envoy rule's
/// `descriptors[0].limits`): errors name `path[i]`.
pub fn compile_limits_at(
    path: &str,
    limits: &[LimitDef],
) -> Result<Arc<CompiledInline>, EngineError> {
    if limits.is_empty() {
        return Err(invalid(path, "at least one limit is needed"));
    }
    let c = compile_stack(path, limits, None, None)?;
    Ok(Arc::new(CompiledInline {
        stack: Arc::new(c.stack),
        tags: c.tags,
    }))
}
