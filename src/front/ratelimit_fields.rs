//! `RateLimit-Policy`, `RateLimit` (IETF httpapi ratelimit-headers draft-10,
//! structured fields) and `Retry-After` (docs/semantics.md §3.5), or the
//! older names other rate limiters' clients read (`header_style`:
//! `RateLimit-Limit`/`-Remaining`/`-Reset` of draft 03, as Kong sends, or
//! `X-RateLimit-*`, as Envoy, limitador and tower_governor do).

use axum::http::{HeaderMap, HeaderName, HeaderValue};

use crate::clock::{Span, ceil_secs};
use crate::limits::stack::{Decision, Stack};
use crate::limits::window::Layout;
use crate::limits::{Item, calendar};

pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// How the rate-limit fields are named (option `header_style`,
/// docs/service.md, "Rate-limit header fields").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, clap::ValueEnum)]
pub enum HeaderStyle {
    /// `RateLimit-Policy` and `RateLimit` (IETF draft-10 structured fields).
    #[default]
    #[serde(rename = "ietf")]
    Ietf,
    /// `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` (IETF
    /// draft 03, integers; Kong's names).
    #[serde(rename = "draft03")]
    Draft03,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`
    /// (Envoy's, limitador's and tower_governor's clients read these).
    #[serde(rename = "x-ratelimit")]
    #[value(name = "x-ratelimit")]
    XRatelimit,
}

/// The three integer fields of a style other than IETF's: the tightest
/// limit's quota, what remains of it, and the seconds until it resets.
/// `None` for [`HeaderStyle::Ietf`].
pub fn legacy(
    style: HeaderStyle,
    limit: u64,
    remaining: u64,
    reset_secs: u64,
) -> Option<[(HeaderName, u64); 3]> {
    let names = match style {
        HeaderStyle::Ietf => return None,
        HeaderStyle::Draft03 => ["ratelimit-limit", "ratelimit-remaining", "ratelimit-reset"],
        HeaderStyle::XRatelimit => [
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
        ],
    };
    let [l, r, t] = names.map(HeaderName::from_static);
    Some([(l, limit), (r, remaining), (t, reset_secs)])
}

/// The window (`w`) of an item in ns: the time a rate item takes to refill its
/// whole burst, a window's or budget's length; `None` for concurrency and
/// adaptive items.
pub(crate) fn window_ns(item: &Item) -> Option<Span> {
    let ns = match item {
        // burst·T may exceed 64 bits of ns.
        Item::Rate { rate, .. } => return Some(rate.refill_ns()),
        Item::Window(w) => match &w.layout {
            Layout::Fixed { w } | Layout::Rolling { w } | Layout::Approximate { w } => *w,
            Layout::Calendar(c) => calendar::nominal_nanos(c.unit),
        },
        Item::Budget(b) => calendar::nominal_nanos(b.calendar.unit),
        Item::Concurrency(_) | Item::Adaptive(_) => return None,
    };
    Some(Span::from(ns))
}

/// Structured-field integers have at most 15 digits (RFC 8941 §3.3.1);
/// figures that saturate at 2^53 − 1 are clamped to the largest one.
pub(crate) fn sf_int(v: u64) -> u64 {
    v.min(999_999_999_999_999)
}

/// A structured-field string: names are `A-Z a-z 0-9 . _ : -`, so nothing
/// needs escaping, but quotes and backslashes are escaped regardless.
pub(crate) fn sf_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// The `RateLimit-Policy` field value of `stack`: one entry per item.
fn policy(stack: &Stack) -> String {
    let mut out = String::new();
    for (i, item) in stack.items().iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(&sf_string(stack.name(i)));
        out.push_str(&format!(";q={}", sf_int(item.limit())));
        match window_ns(item) {
            Some(w) => out.push_str(&format!(";w={}", sf_int(ceil_secs(w)))),
            None => out.push_str(";qu=\"concurrent-requests\""),
        }
    }
    out
}

/// Adds the rate-limit header fields of a decision on `stack`, named as
/// `style` says.
pub fn add(headers: &mut HeaderMap, stack: &Stack, d: &Decision, style: HeaderStyle) {
    if style != HeaderStyle::Ietf {
        if !d.items.is_empty() {
            let t = d.tightest();
            let f = &d.items[t];
            let limit = stack.items().get(t).map_or(0, Item::limit);
            let reset = ceil_secs(f.reset_after);
            for (name, v) in legacy(style, limit, f.remaining, reset)
                .into_iter()
                .flatten()
            {
                headers.insert(name, HeaderValue::from(sf_int(v)));
            }
        }
        retry_after(headers, d);
        return;
    }
    if let Ok(v) = HeaderValue::from_str(stack.policy_field(policy)) {
        headers.insert(RATELIMIT_POLICY, v);
    }
    if !d.items.is_empty() {
        let t = d.tightest();
        let f = &d.items[t];
        let v = format!(
            "{};r={};t={}",
            sf_string(stack.name(t)),
            sf_int(f.remaining),
            sf_int(ceil_secs(f.reset_after))
        );
        if let Ok(v) = HeaderValue::from_str(&v) {
            headers.insert(RATELIMIT, v);
        }
    }
    retry_after(headers, d);
}

/// `Retry-After` of a denial that has a wait, whatever the style.
fn retry_after(headers: &mut HeaderMap, d: &Decision) {
    if !d.allowed
        && let Some(r) = d.retry_after
        && let Ok(v) = HeaderValue::from_str(&ceil_secs(r).to_string())
    {
        headers.insert(axum::http::header::RETRY_AFTER, v);
    }
}
