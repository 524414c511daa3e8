//! `ShouldRateLimit`: the token, an in-flight slot, then each descriptor to
//! its rule ([`super::matching`]), every limited one decided in one
//! all-or-nothing step ([`Engine::check_all`]), and the answer in Envoy's
//! terms: `overall_code`, one status per descriptor, and the IETF
//! `RateLimit`/`RateLimit-Policy`/`Retry-After` fields in
//! `response_headers_to_add` (docs/rls.md).
//!
//! Flow: `should_rate_limit` takes the slot and maps errors; `decide`
//! validates, matches and builds one [`KeyCheck`] per limited descriptor;
//! `answer` turns the engine's [`AllOutcome`] into statuses and headers.
//! An error is a gRPC status, so that Envoy's `failure_mode_deny` decides
//! what it means for traffic (docs/rls.md, "Errors").
//!
//! Cost: three descriptors decided in one step took 22.8 µs of server CPU
//! on hot keys, 5.4 µs more than a one-key gRPC `Check` (BENCHMARKS.md,
//! "gRPC against HTTP/1.1 JSON, and Envoy's rate limit service").

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use tonic::{Request, Response, Status};

use super::config::{Action, Rule, Unit, plain_window};
use super::pb::{
    self, HeaderValue, RateLimitRequest, RateLimitResponse,
    rate_limit_response::{Code, DescriptorStatus, RateLimit, rate_limit::Unit as PbUnit},
};
use super::{RulesHandle, UnknownDomain, matching};
use crate::MAX_EXACT;
use crate::clock::{Clock, Span, ceil_secs};
use crate::engine::request::CompiledInline;
use crate::engine::{AllOutcome, Engine, KeyCheck, MAX_KEYS, Priority, Usage};
use crate::front::call::in_memory_or_blocking;
use crate::front::error::status;
use crate::front::priority;
use crate::front::ratelimit_fields::{HeaderStyle, legacy, sf_int, sf_string, window_ns};
use crate::front::shed;
use crate::front::{AppState, FrontError};
use crate::limits::stack::Decision;

/// Most entries one descriptor may have (Envoy's actions add one each, a
/// handful in practice): 32 of at most `max_id_len` bytes keep the counter's
/// key within the engine's `MAX_KEY_BYTES` (`src/engine/check_all.rs`).
const MAX_ENTRIES: usize = 32;

/// Most request-supplied limit overrides kept compiled; past it they are
/// compiled per call (a client could send many distinct ones, and the cache
/// is never pruned).
const MAX_OVERRIDES: usize = 1024;

/// The service, over the state every front shares.
pub struct Service<C: Clock> {
    /// The engine, options and metrics of every front: an RLS call is shed
    /// and counted in flight with HTTP's, gRPC's and RESP's.
    state: Arc<AppState<C>>,
    /// The rules in force, read once per call; also holds the
    /// `freqcap_rls_*` counters the answers are counted in.
    rules: Arc<RulesHandle>,
    /// Compiled `limit` overrides, by (requests_per_unit, unit) as sent: a
    /// proxy sends the same override on every request; it is compiled once.
    overrides: Mutex<HashMap<(u32, i32), Arc<CompiledInline>>>,
}

impl<C: Clock + 'static> Service<C> {
    /// Mounted on the gRPC listener by `src/grpc/mod.rs` with `rls_config`.
    pub fn new(state: Arc<AppState<C>>, rules: Arc<RulesHandle>) -> Self {
        Service {
            state,
            rules,
            overrides: Mutex::default(),
        }
    }
}

/// What one descriptor of a call came to, in the request's order, as
/// `statuses` are.
enum Outcome {
    /// No rule, or its rule replaced by another's `replaces`: OK.
    NoRule,
    /// `unlimited: true`: OK, never counted.
    Unlimited,
    /// `requests_per_unit: 0`: over without asking the engine.
    Block {
        /// Its name, and its shadow flag (a shadow block answers OK).
        rule: Arc<Rule>,
        /// The window the block's reset runs to.
        unit: Unit,
    },
    /// Decided by the engine: the index of its [`KeyCheck`].
    Limited {
        /// Its name, shadow flag and, for `limits`, the items reported.
        rule: Arc<Rule>,
        /// Index into the checks sent, and so into `AllOutcome::decisions`.
        check: usize,
        /// A plain rule's own figures (see [`Action::Limit`]).
        plain: Option<(u32, Unit)>,
        /// Its hits, as asked (the per-rule series count them).
        hits: u64,
        /// Decided, or a report or refund (docs/rls.md, "Reports and
        /// refunds"), which never denies.
        usage: Usage,
    },
}

impl<C: Clock + 'static> Service<C> {
    /// INVALID_ARGUMENT naming `field` (`descriptors[1].entries[0].key`);
    /// Envoy applies `failure_mode_deny` to it as to any error status.
    fn invalid(field: impl AsRef<str>, message: impl std::fmt::Display) -> Status {
        status(FrontError::invalid(field.as_ref(), message))
    }

    /// A `limit` override of the request, as a rule: a fixed window of its
    /// unit, in place of any rule (docs/rls.md, "Matching"). The caller's
    /// own limit: no `replaces` can name it, no per-rule shadow applies.
    fn override_rule(
        &self,
        i: usize,
        o: &pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride,
        name: &str,
    ) -> Result<Arc<Rule>, Status> {
        // envoy.type.v3.RateLimitUnit: 1..6 are second to year (no week).
        // Not the response's `Unit` numbers (WEEK = 7 there): mapped by
        // hand. UNKNOWN (0) is refused: a window needs a length.
        let unit = match o.unit {
            1 => Unit::Second,
            2 => Unit::Minute,
            3 => Unit::Hour,
            4 => Unit::Day,
            5 => Unit::Month,
            6 => Unit::Year,
            u => {
                return Err(Self::invalid(
                    format!("descriptors[{i}].limit.unit"),
                    format!("unit {u} is not second (1) to year (6)"),
                ));
            }
        };
        // 0 blocks, as `requests_per_unit: 0` does in a rules file.
        let action = if o.requests_per_unit == 0 {
            Action::Block(unit)
        } else {
            let key = (o.requests_per_unit, o.unit);
            let cached = self
                .overrides
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .get(&key)
                .cloned();
            let limits = match cached {
                Some(l) => l,
                // Compiled outside the lock: two calls may both compile one
                // override, rather than every call waiting on a compilation.
                None => {
                    let l = plain_window(o.requests_per_unit, unit)
                        .map_err(|e| status(FrontError::from(e)))?;
                    let mut m = self
                        .overrides
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    if m.len() < MAX_OVERRIDES {
                        m.insert(key, l.clone());
                    }
                    l
                }
            };
            Action::Limit {
                limits,
                plain: Some((o.requests_per_unit, unit)),
            }
        };
        Ok(Arc::new(Rule {
            name: name.to_owned(),
            given_name: None,
            replaces: Vec::new(),
            shadow: false,
            action,
        }))
    }

    /// One `ShouldRateLimit`: the request validated (domain, descriptors,
    /// entries and costs, each error naming its field), each descriptor
    /// matched to its rule, `replaces` applied, and every limited
    /// descriptor decided in one all-or-nothing engine step: a request is
    /// debited on every descriptor or on none (envoyproxy/ratelimit debits
    /// each descriptor on its own). An enforced block looks at the others
    /// without debiting them.
    ///
    /// Every validation runs before the engine is asked, so a refused
    /// request debits nothing.
    async fn decide(
        &self,
        mut req: RateLimitRequest,
        header: Option<Vec<u8>>,
    ) -> Result<RateLimitResponse, Status> {
        // The request's class, taken out of the descriptors before they are
        // matched (docs/rls.md, "Priorities").
        let (priority, mut class_only) =
            take_priority(&mut req, header.as_deref()).map_err(status)?;
        // Reports and refunds, marked per descriptor (docs/rls.md, "Reports
        // and refunds").
        let usages = take_reports(&mut req, &mut class_only).map_err(status)?;
        // Entry keys and values are bounded as the API's ids are.
        let max_id = self.state.engine.options().max_id_len;
        if req.domain.is_empty() {
            return Err(Self::invalid("domain", "a non-empty domain is required"));
        }
        if req.descriptors.is_empty() {
            return Err(Self::invalid(
                "descriptors",
                "at least one descriptor is needed",
            ));
        }
        // The engine's bound on one all-or-nothing step: each key is a
        // record lookup under the locks of all of them.
        if req.descriptors.len() > MAX_KEYS {
            return Err(Self::invalid(
                "descriptors",
                format!("at most {MAX_KEYS}, got {}", req.descriptors.len()),
            ));
        }
        // Read once: every descriptor of the call is matched against the
        // same rules, even if a reload lands mid-call.
        let rules = self.rules.current();
        // An unknown domain is an error, where envoyproxy/ratelimit answers
        // OK: a typo in Envoy's `domain` must show, not switch limiting off
        // (docs/rls.md, "Errors"). It also bounds the domain, which goes
        // into every counter key, to a loaded domain's length.
        let Some(root) = rules.domains.get(&req.domain) else {
            if self.rules.unknown_domain == UnknownDomain::Ok {
                // As envoyproxy/ratelimit: every descriptor OK, nothing
                // limited or debited; counted, so a typo can be seen.
                self.rules.counters.unknown_domain.inc();
                self.rules.counters.ok.inc();
                return Ok(RateLimitResponse {
                    overall_code: Code::Ok as i32,
                    statuses: req
                        .descriptors
                        .iter()
                        .map(|_| DescriptorStatus {
                            code: Code::Ok as i32,
                            ..Default::default()
                        })
                        .collect(),
                    response_headers_to_add: Vec::new(),
                });
            }
            let mut known: Vec<&str> = rules.domains.keys().map(String::as_str).collect();
            known.sort_unstable();
            return Err(Self::invalid(
                "domain",
                format!(
                    "no rules for domain {:?} (rls_config has: {})",
                    req.domain,
                    known.join(", ")
                ),
            ));
        };
        // Each descriptor to its rule.
        let mut matched: Vec<Option<Arc<Rule>>> = Vec::with_capacity(req.descriptors.len());
        let mut keys: Vec<String> = Vec::with_capacity(req.descriptors.len());
        for (i, d) in req.descriptors.iter().enumerate() {
            // A descriptor that only gave the class limits nothing: OK.
            if class_only.contains(&i) {
                matched.push(None);
                keys.push(String::new());
                continue;
            }
            if d.entries.is_empty() {
                return Err(Self::invalid(
                    format!("descriptors[{i}].entries"),
                    "at least one entry is needed",
                ));
            }
            if d.entries.len() > MAX_ENTRIES {
                return Err(Self::invalid(
                    format!("descriptors[{i}].entries"),
                    format!("at most {MAX_ENTRIES}, got {}", d.entries.len()),
                ));
            }
            let mut entries = Vec::with_capacity(d.entries.len());
            // The counter's key: the domain and every entry, as
            // envoyproxy/ratelimit keys its counters (a wildcard rule counts
            // each value apart); each part length-prefixed, so no value can
            // spell another descriptor's key.
            let mut key = format!("{}:{}", req.domain.len(), req.domain);
            // The name of an override's limit (only an override needs
            // it): envoyproxy/ratelimit's descriptor key
            // (`key_value.key_value`).
            let mut name = String::new();
            for (j, e) in d.entries.iter().enumerate() {
                if e.key.is_empty() || e.key.len() > max_id {
                    return Err(Self::invalid(
                        format!("descriptors[{i}].entries[{j}].key"),
                        format!("must be 1 to {max_id} bytes, got {}", e.key.len()),
                    ));
                }
                if e.value.len() > max_id {
                    return Err(Self::invalid(
                        format!("descriptors[{i}].entries[{j}].value"),
                        format!("must be at most {max_id} bytes, got {}", e.value.len()),
                    ));
                }
                entries.push((e.key.as_str(), e.value.as_str()));
                // Writing to a String cannot fail.
                let _ = write!(
                    key,
                    "|{}:{}{}:{}",
                    e.key.len(),
                    e.key,
                    e.value.len(),
                    e.value
                );
                if d.limit.is_some() {
                    if !name.is_empty() {
                        name.push('.');
                    }
                    name.push_str(&e.key);
                    if !e.value.is_empty() {
                        name.push('_');
                        name.push_str(&e.value);
                    }
                }
            }
            // A cost is at most 2^53 − 1, as everywhere in the API
            // (docs/semantics.md §5.1).
            if let Some(h) = d.hits_addend
                && h > MAX_EXACT
            {
                return Err(Self::invalid(
                    format!("descriptors[{i}].hits_addend"),
                    format!("at most {MAX_EXACT}, got {h}"),
                ));
            }
            let rule = match &d.limit {
                Some(o) => Some(self.override_rule(i, o, &name)?),
                None => matching::find(root, &entries).cloned(),
            };
            matched.push(rule);
            keys.push(key);
        }
        // `replaces`: a matched rule's name listed by another matched rule
        // is not applied.
        // Taken from every matched rule, replaced or not.
        let replaced: Vec<String> = matched
            .iter()
            .flatten()
            .flat_map(|r| r.replaces.iter().cloned())
            .collect();
        // Envoy's `hits_addend`: 0 (unset) means 1.
        let request_cost = u64::from(req.hits_addend.max(1));
        let mut checks = Vec::new();
        let mut outcomes = Vec::with_capacity(matched.len());
        for ((i, rule), key) in matched.into_iter().enumerate().zip(keys) {
            let Some(rule) = rule.filter(|r| {
                r.given_name
                    .as_deref()
                    .is_none_or(|n| !replaced.iter().any(|r| r == n))
            }) else {
                outcomes.push(Outcome::NoRule);
                continue;
            };
            let usage = usages.get(i).copied().unwrap_or_default();
            match &rule.action {
                Action::Unlimited => outcomes.push(Outcome::Unlimited),
                // A block counts nothing a report or refund could change, and
                // neither ever denies.
                Action::Block(_) if usage != Usage::Decide => outcomes.push(Outcome::NoRule),
                Action::Block(unit) => {
                    let unit = *unit;
                    outcomes.push(Outcome::Block { rule, unit });
                }
                Action::Limit { limits, plain } => {
                    // A descriptor's own hits_addend wins, 0 included (a
                    // check that debits nothing), as in envoyproxy/ratelimit.
                    let cost = req.descriptors[i].hits_addend.unwrap_or(request_cost);
                    outcomes.push(Outcome::Limited {
                        check: checks.len(),
                        plain: *plain,
                        rule: rule.clone(),
                        hits: cost,
                        usage,
                    });
                    // Shadow: debited, never denying (docs/rls.md).
                    checks.push(KeyCheck {
                        priority,
                        limits: limits.clone(),
                        key,
                        cost,
                        enforced: !rule.shadow,
                        usage,
                    });
                }
            }
        }
        // An enforced block denies the request: the others are only looked
        // at (cost 0), so nothing is debited. A shadow block zeroes nothing;
        // nor does any block a report or refund, usage that happened or did
        // not whatever this request is answered.
        let blocked = outcomes
            .iter()
            .any(|o| matches!(o, Outcome::Block { rule, .. } if !rule.shadow));
        if blocked {
            for c in checks.iter_mut().filter(|c| c.usage == Usage::Decide) {
                c.cost = 0;
            }
        }
        // No limited descriptor (no rule, unlimited, blocks only): nothing
        // to ask the engine, which refuses a call with no keys.
        let decided = if checks.is_empty() {
            AllOutcome {
                allowed: true,
                decisions: Vec::new(),
            }
        } else {
            // On the executor when every record is in memory (a hand-off
            // costs more than the decision), else on a blocking thread
            // (`src/front/call.rs`); a store error is mapped below.
            in_memory_or_blocking(
                &self.state,
                checks,
                |e: &Engine<C>, c: &Vec<KeyCheck>| e.check_all_in_memory(c),
                |e: &Engine<C>, c: &Vec<KeyCheck>| e.check_all(c),
            )
            .await
            .map_err(status)?
        };
        // The engine's clock, for the blocks' time to their unit's end.
        let now = self.state.engine.now();
        Ok(self.answer(&req.domain, &outcomes, &decided, blocked, now))
    }

    /// The response: statuses, overall code and header fields, as the
    /// table of docs/rls.md, "Answers", has them. Over is an answer,
    /// OVER_LIMIT, refused by Envoy whatever its `failure_mode_deny`.
    fn answer(
        &self,
        domain: &str,
        outcomes: &[Outcome],
        decided: &AllOutcome,
        blocked: bool,
        now: u64,
    ) -> RateLimitResponse {
        // `--shadow` (docs/semantics.md §6.6): decided and debited as
        // enforced — the engine gated every rule as usual — and answered OK.
        let shadow_all = self.state.engine.options().shadow;
        let shadowed = |rule: &Rule| rule.shadow || shadow_all;
        // A shadow rule's denial never makes `decided.allowed` false (its
        // key is not enforced): only enforced rules make OVER_LIMIT.
        let over = (blocked || !decided.allowed) && !shadow_all;
        let mut statuses = Vec::with_capacity(outcomes.len());
        // Header figures: per limited descriptor (name, limit, window s,
        // remaining, reset s, retry after s if it denied).
        let mut fields: Vec<Field<'_>> = Vec::with_capacity(outcomes.len());
        for o in outcomes {
            let s = match o {
                // No `current_limit`: there is no limit to name.
                Outcome::NoRule => DescriptorStatus {
                    code: Code::Ok as i32,
                    ..DescriptorStatus::default()
                },
                // The most the field holds: it never runs out.
                Outcome::Unlimited => DescriptorStatus {
                    code: Code::Ok as i32,
                    limit_remaining: u32::MAX,
                    ..DescriptorStatus::default()
                },
                Outcome::Block { rule, unit } => {
                    // Seconds to the end of the unit's window, counted from
                    // the epoch as a plain rule's.
                    let secs = unit.secs();
                    let until = secs - (now / 1_000_000_000) % secs;
                    if shadowed(rule) {
                        self.rules.counters.shadow_over.inc();
                    }
                    fields.push(Field {
                        name: &rule.name,
                        limit: 0,
                        window: secs,
                        remaining: 0,
                        reset: until,
                        retry_after: (!shadowed(rule)).then_some(until),
                    });
                    limited(
                        !shadowed(rule),
                        &rule.name,
                        0,
                        Some(*unit),
                        0,
                        u128::from(until) * 1_000_000_000,
                    )
                }
                Outcome::Limited {
                    rule,
                    check,
                    plain,
                    hits,
                    usage,
                } => {
                    // Not reached (`check_all` answers one decision per
                    // key); were it, this descriptor says UNKNOWN, the
                    // proto's zero, rather than the call failing.
                    let Some(d) = decided.decisions.get(*check) else {
                        statuses.push(DescriptorStatus::default());
                        continue;
                    };
                    if !d.allowed && shadowed(rule) {
                        self.rules.counters.shadow_over.inc();
                    }
                    let (limit, unit, window) = figures(rule, d, *plain);
                    // A refund is not a hit: the series count what was used.
                    if *usage != Usage::Refund {
                        self.rules.counters.series.record(&crate::rls::series::Hit {
                            domain,
                            key: &rule.name,
                            hits: *hits,
                            allowed: d.allowed,
                            shadow_over: !d.allowed && shadowed(rule),
                            limit,
                            remaining: d.remaining,
                        });
                    }
                    fields.push(Field {
                        name: &rule.name,
                        limit,
                        window,
                        remaining: d.remaining,
                        reset: ceil_secs(d.reset_after),
                        retry_after: (!d.allowed && !shadowed(rule))
                            .then(|| d.retry_after.map(ceil_secs))
                            .flatten(),
                    });
                    limited(
                        !d.allowed && !shadowed(rule),
                        &rule.name,
                        limit,
                        unit,
                        d.remaining,
                        d.reset_after,
                    )
                }
            };
            statuses.push(s);
        }
        let counter = if over {
            &self.rules.counters.over_limit
        } else {
            &self.rules.counters.ok
        };
        counter.inc();
        RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
            statuses,
            response_headers_to_add: headers(&fields, over, self.state.options.header_style),
        }
    }
}

/// A limited descriptor's figures for the header fields
/// (docs/semantics.md §3.5 has their forms).
struct Field<'a> {
    /// The rule's name, leading both fields' entries.
    name: &'a str,
    /// `q`: the rule's limit.
    limit: u64,
    /// `w`: its window, seconds.
    window: u64,
    /// `r`: what is left.
    remaining: u64,
    /// `t`: seconds to the reset, rounded up.
    reset: u64,
    /// Seconds until it would allow, only for an enforced descriptor that
    /// denied: `Retry-After`'s candidates, and `RateLimit`'s when over.
    retry_after: Option<u64>,
}

/// The limit, unit and window (s) `current_limit` and `RateLimit-Policy`
/// report: a plain rule's own; for `limits`, the item with the least
/// remaining (its unit only if its window is exactly one).
fn figures(rule: &Rule, d: &Decision, plain: Option<(u32, Unit)>) -> (u64, Option<Unit>, u64) {
    if let Some((n, unit)) = plain {
        return (u64::from(n), Some(unit), unit.secs());
    }
    // Only a `Limit` rule is `Outcome::Limited`: zeros rather than a
    // panic, should that change.
    let Action::Limit { limits, .. } = &rule.action else {
        return (0, None, 0);
    };
    let t = d.tightest();
    let Some(item) = limits.stack.items().get(t) else {
        return (0, None, 0);
    };
    let window = window_ns(item).unwrap_or(0);
    let unit = u64::try_from(window).ok().and_then(Unit::of_nanos);
    (
        d.items.get(t).map_or(0, |i| i.limit),
        unit,
        ceil_secs(window),
    )
}

/// The status of a descriptor a rule limits: over or not, and the rule's
/// figures. Envoy's fields are `uint32` where freqcap's figures go to
/// 2^53 − 1, so they saturate: an answer is never refused for its size.
fn limited(
    over: bool,
    name: &str,
    limit: u64,
    unit: Option<Unit>,
    remaining: u64,
    reset: Span,
) -> DescriptorStatus {
    DescriptorStatus {
        code: if over { Code::OverLimit } else { Code::Ok } as i32,
        current_limit: Some(RateLimit {
            name: name.to_owned(),
            requests_per_unit: u32::try_from(limit).unwrap_or(u32::MAX),
            unit: pb_unit(unit) as i32,
        }),
        limit_remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
        duration_until_reset: Some(duration(reset)),
    }
}

/// Envoy's unit of a rule's window; `Unknown` for a `limits` stack whose
/// tightest item is not one whole unit long (Envoy's field has no other
/// way to say it).
fn pb_unit(u: Option<Unit>) -> PbUnit {
    match u {
        None => PbUnit::Unknown,
        Some(Unit::Second) => PbUnit::Second,
        Some(Unit::Minute) => PbUnit::Minute,
        Some(Unit::Hour) => PbUnit::Hour,
        Some(Unit::Day) => PbUnit::Day,
        Some(Unit::Week) => PbUnit::Week,
        Some(Unit::Month) => PbUnit::Month,
        Some(Unit::Year) => PbUnit::Year,
    }
}

/// `duration_until_reset` from ns, saturating: a window may end past what
/// `i64` seconds hold only in theory, and an answer must not fail for it.
fn duration(ns: Span) -> prost_types::Duration {
    let secs = ns / 1_000_000_000;
    prost_types::Duration {
        seconds: i64::try_from(secs).unwrap_or(i64::MAX),
        // Under 10^9: the cast cannot truncate.
        nanos: (ns % 1_000_000_000) as i32,
    }
}

/// `RateLimit-Policy` (every limited descriptor), `RateLimit` (the one with
/// the least remaining; when over, a denying one) and, when over,
/// `Retry-After` (the longest wait of the denying ones), as HTTP answers
/// carry them (docs/semantics.md §3.5).
fn headers(fields: &[Field<'_>], over: bool, style: HeaderStyle) -> Vec<HeaderValue> {
    if fields.is_empty() {
        return Vec::new();
    }
    if style != HeaderStyle::Ietf {
        return legacy_headers(fields, over, style);
    }
    // One entry per policy: two descriptors matching one rule list it once.
    let mut entries: Vec<String> = Vec::with_capacity(fields.len());
    for f in fields {
        let e = format!(
            "{};q={};w={}",
            sf_string(f.name),
            sf_int(f.limit),
            sf_int(f.window)
        );
        if !entries.contains(&e) {
            entries.push(e);
        }
    }
    let policy = entries.join(", ");
    let tightest = tightest(fields, over);
    let mut out = vec![HeaderValue {
        key: "ratelimit-policy".into(),
        value: policy,
    }];
    if let Some(f) = tightest {
        out.push(HeaderValue {
            key: "ratelimit".into(),
            value: format!(
                "{};r={};t={}",
                sf_string(f.name),
                sf_int(f.remaining),
                sf_int(f.reset)
            ),
        });
    }
    if let Some(r) = wait(fields, over) {
        out.push(HeaderValue {
            key: "retry-after".into(),
            value: r.to_string(),
        });
    }
    out
}

/// The descriptor the fields report: the least remaining, ties to the
/// later reset (§3.3's tightest); when over, among the denying ones, so it
/// explains the refusal, or of all when none has a wait (a cost that can
/// never pass has none).
fn tightest<'a>(fields: &'a [Field<'a>], over: bool) -> Option<&'a Field<'a>> {
    fields
        .iter()
        .filter(|f| !over || f.retry_after.is_some())
        .min_by_key(|f| (f.remaining, std::cmp::Reverse(f.reset)))
        .or_else(|| fields.iter().min_by_key(|f| f.remaining))
}

/// `Retry-After` when over: the longest wait, since the request passes
/// only once every denying descriptor would allow it.
fn wait(fields: &[Field<'_>], over: bool) -> Option<u64> {
    if !over {
        return None;
    }
    fields.iter().filter_map(|f| f.retry_after).max()
}

/// [`headers`] in an older style: the tightest descriptor's limit,
/// remaining and reset as integers, and `Retry-After` when over.
fn legacy_headers(fields: &[Field<'_>], over: bool, style: HeaderStyle) -> Vec<HeaderValue> {
    let mut out = Vec::with_capacity(4);
    if let Some(f) = tightest(fields, over) {
        for (name, v) in legacy(style, f.limit, f.remaining, f.reset)
            .into_iter()
            .flatten()
        {
            out.push(HeaderValue {
                key: name.as_str().to_owned(),
                value: sf_int(v).to_string(),
            });
        }
    }
    if let Some(r) = wait(fields, over) {
        out.push(HeaderValue {
            key: "retry-after".into(),
            value: r.to_string(),
        });
    }
    out
}

/// The descriptor entry key that marks a descriptor as a report: usage
/// known after the response (Envoy's `apply_on_stream_done`), debited even
/// past the limit and never denied (docs/rls.md, "Reports and refunds").
/// Envoy sends it from a `generic_key` action.
pub const REPORT: &str = "x-freqcap-report";

/// Takes the [`REPORT`] entries out of the descriptors (each must say
/// `true`) and reads `is_negative_hits`: per descriptor, whether it is
/// decided, reported, or refunded (a refund wins over a report: its hits
/// are given back either way). A descriptor that held only the marker is
/// added to `marker_only` (answered OK, limiting nothing).
fn take_reports(
    req: &mut RateLimitRequest,
    marker_only: &mut Vec<usize>,
) -> Result<Vec<Usage>, FrontError> {
    let mut usages = Vec::with_capacity(req.descriptors.len());
    for (i, d) in req.descriptors.iter_mut().enumerate() {
        let mut usage = Usage::Decide;
        if d.entries.iter().any(|e| e.key == REPORT) {
            for (j, e) in d.entries.iter().enumerate() {
                if e.key == REPORT && e.value != "true" {
                    return Err(FrontError::invalid(
                        &format!("descriptors[{i}].entries[{j}].value"),
                        format!("{REPORT} must be \"true\", got {:?}", e.value),
                    ));
                }
            }
            d.entries.retain(|e| e.key != REPORT);
            if d.entries.is_empty() && !marker_only.contains(&i) {
                marker_only.push(i);
            }
            usage = Usage::Report;
        }
        if d.is_negative_hits {
            usage = Usage::Refund;
        }
        usages.push(usage);
    }
    Ok(usages)
}

/// Takes the request's class out of its descriptors: every entry whose key
/// is `x-freqcap-priority` (Envoy's `request_headers` action puts a header
/// there) is removed before matching, so rules never see it. Entries that
/// disagree, with each other or with the call's metadata, are refused
/// naming the entry. Returns the class and the descriptors that held
/// nothing else (answered OK, limiting nothing).
fn take_priority(
    req: &mut RateLimitRequest,
    header: Option<&[u8]>,
) -> Result<(Priority, Vec<usize>), FrontError> {
    let mut given: Option<(Priority, String)> = None;
    let mut class_only = Vec::new();
    for (i, d) in req.descriptors.iter_mut().enumerate() {
        if !d.entries.iter().any(|e| e.key == priority::HEADER) {
            continue;
        }
        for (j, e) in d.entries.iter().enumerate() {
            if e.key != priority::HEADER {
                continue;
            }
            let field = format!("descriptors[{i}].entries[{j}].value");
            let p = priority::parse(&field, &e.value)?;
            match &given {
                Some((q, at)) if *q != p => {
                    return Err(FrontError::invalid(
                        &field,
                        format!("{:?} disagrees with {at}, {:?}", p.as_str(), q.as_str()),
                    ));
                }
                Some(_) => {}
                None => given = Some((p, field)),
            }
        }
        d.entries.retain(|e| e.key != priority::HEADER);
        if d.entries.is_empty() {
            class_only.push(i);
        }
    }
    let p = priority::of_request(given.map(|(p, _)| p), header)?;
    Ok((p, class_only))
}

#[tonic::async_trait]
impl<C: Clock + 'static> pb::rate_limit_service_server::RateLimitService for Service<C> {
    /// One call: an in-flight slot (past `max_in_flight`, UNAVAILABLE
    /// `overloaded`), then `decide`. An error's status is its `Code`'s
    /// `grpc_code` (`src/front/error.rs`), but for the rewrite below.
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let answer = async {
            let s = &self.state;
            let waited = request
                .extensions()
                .get::<crate::server::Conn>()
                .map(crate::server::Conn::queue_delay)
                .unwrap_or_default();
            let class = Default::default();
            let _slot = shed::admit(&s.shed, &s.options, &s.metrics, class, waited)
                .await
                .map_err(status)?;
            // Envoy cannot set per-request metadata on its RLS call, but
            // other callers can; Envoy sends the class as a descriptor entry.
            let header = request
                .metadata()
                .get(crate::front::priority::HEADER)
                .map(|v| v.as_bytes().to_vec());
            self.decide(request.into_inner(), header).await
        }
        .await;
        match answer {
            Ok(r) => Ok(Response::new(r)),
            Err(s) => {
                // `freqcap_rls_requests_total{outcome="error"}`.
                self.rules.counters.error.inc();
                // Envoy applies `failure_mode_deny` to an error status, but
                // lets UNKNOWN through as if allowed: an internal error must
                // not read as one (docs/rls.md, "Errors"). So INTERNAL (a
                // store failure) becomes UNAVAILABLE; UNKNOWN, which
                // `grpc_code` never gives, in case a later path does. Never
                // OVER_LIMIT: failing open or closed is the operator's call.
                if s.code() == tonic::Code::Internal || s.code() == tonic::Code::Unknown {
                    return Err(Status::unavailable(s.message().to_owned()));
                }
                Err(s)
            }
        }
    }
}
