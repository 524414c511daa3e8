//! `RateLimit-Policy`, `RateLimit` (IETF httpapi ratelimit-headers draft-10,
//! structured fields) and `Retry-After` (docs/semantics.md §3.5).

use axum::http::{HeaderMap, HeaderName, HeaderValue};

use crate::clock::{Span, ceil_secs};
use crate::limits::stack::{Decision, Stack};
use crate::limits::window::Layout;
use crate::limits::{Item, calendar};

pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

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

/// Adds the rate-limit header fields of a decision on `stack`.
pub fn add(headers: &mut HeaderMap, stack: &Stack, d: &Decision) {
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
    if !d.allowed
        && let Some(r) = d.retry_after
        && let Ok(v) = HeaderValue::from_str(&ceil_secs(r).to_string())
    {
        headers.insert(axum::http::header::RETRY_AFTER, v);
    }
}
