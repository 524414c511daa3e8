//! `CL.THROTTLE key max_burst count period [quantity]`: redis-cell's command,
//! answered as redis-cell answers it (docs/resp.md, "CL.THROTTLE").
//!
//! It is a check of one inline `rate` item: `count` per `period` seconds
//! with a burst of `max_burst + 1` (redis-cell's `max_burst` counts the units
//! on top of the one an idle key always gets; freqcap's `burst` counts them
//! all, which is the `limit` redis-cell reports), at cost `quantity`. The
//! decision is the engine's; this file only reads arguments and writes the
//! five integers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::engine::{CheckOutcome, CheckRequest, CheckTarget, CompiledInline, compile_inline};
use crate::model::LimitDef;
use crate::model::limit::RateDef;

use super::super::frame::Reply;

/// The largest count or burst an item takes (docs/semantics.md §1.4).
const MAX_UNITS: i64 = (1 << 53) - 1;
/// The longest period, seconds: freqcap's 10 000 days.
const MAX_PERIOD_S: i64 = 10_000 * 86_400;

/// redis-cell's usage line, word for word.
const USAGE: &str =
    "Cell error: Usage: cl.throttle <key> <max_burst> <count per period> <period> [<quantity>]";

/// A parsed `CL.THROTTLE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Throttle {
    pub key: String,
    pub max_burst: u64,
    pub count: u64,
    pub period_s: u64,
    pub quantity: u64,
}

/// An error in redis-cell's words (`Cell error: ...`), for arguments
/// redis-cell itself rejects; freqcap's own checks (negative or too large
/// values, which redis-cell does not check) name the argument the same way.
fn cell(message: impl std::fmt::Display) -> Reply {
    Reply::error(format!("Cell error: {message}"))
}

/// Reads the arguments (after the command's name), in redis-cell's order:
/// arity, then each integer, then the zero-rate check.
pub fn parse(args: &[&[u8]]) -> Result<Throttle, Reply> {
    if args.len() != 4 && args.len() != 5 {
        return Err(Reply::error(USAGE));
    }
    let int = |a: &[u8]| -> Result<i64, Reply> {
        std::str::from_utf8(a)
            .ok()
            .and_then(|s| s.parse::<i64>().ok())
            .ok_or_else(|| {
                cell(format_args!(
                    "Couldn't parse as integer: {}",
                    String::from_utf8_lossy(a)
                ))
            })
    };
    let max_burst = int(args[1])?;
    let count = int(args[2])?;
    let period = int(args[3])?;
    let quantity = match args.get(4) {
        Some(q) => int(q)?,
        None => 1,
    };
    if count == 0 || period == 0 {
        return Err(cell("Zero rates are not supported"));
    }
    for (name, v, max) in [
        ("max_burst", max_burst, MAX_UNITS - 1),
        ("count per period", count, MAX_UNITS),
        ("period", period, MAX_PERIOD_S),
        ("quantity", quantity, MAX_UNITS),
    ] {
        if v < 0 {
            return Err(cell(format_args!("{name} must not be negative, got {v}")));
        }
        if v > max {
            return Err(cell(format_args!("{name} must be at most {max}, got {v}")));
        }
    }
    let key = std::str::from_utf8(args[0])
        .map_err(|_| cell("key must be UTF-8 text"))?
        .to_owned();
    // Each value is in 0..=max now, so the conversions cannot fail.
    let u = |v: i64| u64::try_from(v).unwrap_or(0);
    Ok(Throttle {
        key,
        max_burst: u(max_burst),
        count: u(count),
        period_s: u(period),
        quantity: u(quantity),
    })
}

impl Throttle {
    /// The inline rate item the arguments stand for.
    fn item(&self) -> Result<LimitDef, Reply> {
        let per = format!("{}s", self.period_s)
            .parse()
            .map_err(|e| cell(format_args!("period: {e}")))?;
        Ok(LimitDef::Rate(RateDef {
            name: None,
            rate: self.count,
            per,
            burst: Some(self.max_burst + 1),
        }))
    }

    /// The engine's request: the inline rate item (compiled once per
    /// parameters, through `cache`), decided for `key` at cost `quantity`
    /// (0 peeks).
    pub fn request(self, cache: &Compiled) -> Result<CheckRequest, Reply> {
        let params = (self.max_burst, self.count, self.period_s);
        let compiled = match cache.get(params) {
            Some(c) => c,
            None => {
                let c = compile_inline(&[self.item()?]).map_err(cell)?;
                cache.put(params, c.clone());
                c
            }
        };
        Ok(CheckRequest {
            target: CheckTarget::Compiled(compiled),
            key: self.key,
            cost: self.quantity,
            reserve: false,
            ttl_ms: None,
            reservation_id: None,
            fingerprint: None,
        })
    }
}

/// (max_burst, count, period) of a `CL.THROTTLE`.
type Params = (u64, u64, u64);

/// Compiled items by parameters. Callers use a handful of parameter sets,
/// each over many keys; a client sending endless new ones only makes the
/// map start again once it holds [`Compiled::CAP`].
#[derive(Default)]
pub struct Compiled(Mutex<HashMap<Params, Arc<CompiledInline>>>);

impl Compiled {
    const CAP: usize = 4096;

    fn get(&self, p: Params) -> Option<Arc<CompiledInline>> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&p)
            .cloned()
    }

    fn put(&self, p: Params, c: Arc<CompiledInline>) {
        let mut m = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if m.len() >= Self::CAP {
            m.clear();
        }
        m.insert(p, c);
    }
}

/// A duration in seconds as redis-cell reports it: whole seconds, plus one
/// when the rest has a millisecond or more (its `subsec_milliseconds() > 0`),
/// so waiting that long is always enough.
pub fn cell_seconds(ns: u128) -> i64 {
    let whole = ns / 1_000_000_000;
    let up = u128::from((ns % 1_000_000_000) / 1_000_000 > 0);
    i64::try_from(whole + up).unwrap_or(i64::MAX)
}

/// The five integers: limited, limit, remaining, retry_after (−1 when
/// allowed, or when the quantity is over the burst and can never pass),
/// reset_after.
pub fn answer(out: &CheckOutcome) -> Reply {
    let d = &out.decision;
    // One item: its figures are the decision's.
    let (limit, remaining) = d
        .items
        .first()
        .map_or((0, d.remaining), |f| (f.limit, f.remaining));
    let retry = match (d.allowed, d.retry_after) {
        (false, Some(r)) => cell_seconds(r),
        _ => -1,
    };
    let int = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    Reply::Array(vec![
        Reply::Int(i64::from(!d.allowed)),
        Reply::Int(int(limit)),
        Reply::Int(int(remaining)),
        Reply::Int(retry),
        Reply::Int(cell_seconds(d.reset_after)),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Throttle, Reply> {
        let a: Vec<&[u8]> = args.iter().map(|s| s.as_bytes()).collect();
        parse(&a)
    }

    fn err(r: Result<Throttle, Reply>) -> String {
        match r {
            Err(Reply::Error(m)) => m,
            other => panic!("expected an error, got {other:?}"),
        }
    }

    #[test]
    fn redis_cells_errors() {
        assert_eq!(err(p(&["k", "1", "2"])), USAGE);
        assert_eq!(err(p(&["k", "1", "2", "3", "4", "5"])), USAGE);
        assert_eq!(
            err(p(&["k", "x", "2", "3"])),
            "Cell error: Couldn't parse as integer: x"
        );
        assert_eq!(
            err(p(&["k", "1", "0", "3"])),
            "Cell error: Zero rates are not supported"
        );
        assert_eq!(
            err(p(&["k", "1", "2", "0"])),
            "Cell error: Zero rates are not supported"
        );
        assert_eq!(
            err(p(&["k", "-1", "2", "3"])),
            "Cell error: max_burst must not be negative, got -1"
        );
        assert_eq!(
            err(p(&["k", "1", "2", "3", "-2"])),
            "Cell error: quantity must not be negative, got -2"
        );
        assert!(err(p(&["k", "1", "2", "864000001"])).contains("period must be at most"));
        assert!(err(p(&["k", "9007199254740991", "2", "3"])).contains("max_burst must be at most"));
    }

    #[test]
    fn parsed_with_defaults() {
        let t = p(&["user123", "15", "30", "60"]).unwrap();
        assert_eq!(
            t,
            Throttle {
                key: "user123".into(),
                max_burst: 15,
                count: 30,
                period_s: 60,
                quantity: 1
            }
        );
        assert_eq!(p(&["k", "0", "1", "1", "0"]).unwrap().quantity, 0);
    }

    #[test]
    fn seconds_rounded_as_redis_cell_does() {
        const MS: u128 = 1_000_000;
        assert_eq!(cell_seconds(0), 0);
        assert_eq!(cell_seconds(2_000 * MS), 2);
        assert_eq!(cell_seconds(2_001 * MS), 3);
        assert_eq!(cell_seconds(300 * MS), 1);
        // Under a millisecond past the second is not rounded up.
        assert_eq!(cell_seconds(2_000 * MS + 999_999), 2);
        assert_eq!(cell_seconds(u128::MAX), i64::MAX);
    }
}
