//! A check's answer in the figures every front reports (docs/semantics.md
//! §3.3), computed once: durations in ms rounded up, counts saturated at
//! [`MAX_EXACT`], `retry_after_ms` only on a denial. HTTP writes them as
//! JSON, gRPC as a `Decision`, RESP as a map; each front once computed them
//! itself, three times alike.

use super::call::ms;
use crate::MAX_EXACT;
use crate::engine::CheckOutcome;

/// The decision's figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reported<'a> {
    pub allowed: bool,
    pub delay_ms: u64,
    /// When denying: the earliest time the same request could pass; `None`
    /// when it allows, or when it never can.
    pub retry_after_ms: Option<u64>,
    pub remaining: u64,
    pub reset_after_ms: u64,
    /// Each item of the stack, in order.
    pub items: Vec<ReportedItem<'a>>,
}

/// One item's figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportedItem<'a> {
    /// The item's name, or `<kind>-<index>`.
    pub name: &'a str,
    /// `rate`, `gap`, `window`, `budget` or `concurrency`.
    pub kind: &'static str,
    /// burst (rate), 1 (gap), limit (window), amount (budget), max
    /// (concurrency).
    pub limit: u64,
    pub remaining: u64,
    pub reset_after_ms: u64,
    pub retry_after_ms: Option<u64>,
    pub allowed: bool,
}

/// The figures of `out`.
pub fn reported(out: &CheckOutcome) -> Reported<'_> {
    let d = &out.decision;
    Reported {
        allowed: d.allowed,
        delay_ms: ms(d.delay),
        retry_after_ms: if d.allowed {
            None
        } else {
            d.retry_after.map(ms)
        },
        remaining: d.remaining.min(MAX_EXACT),
        reset_after_ms: ms(d.reset_after),
        items: d
            .items
            .iter()
            .enumerate()
            .map(|(i, f)| ReportedItem {
                name: out.stack.name(i),
                kind: out.stack.items()[i].kind().as_str(),
                limit: f.limit,
                remaining: f.remaining.min(MAX_EXACT),
                reset_after_ms: ms(f.reset_after),
                retry_after_ms: f.retry_after.map(ms),
                allowed: f.allowed,
            })
            .collect(),
    }
}
