//! `FC.CHECK policy key [cost] [PRIORITY class]`: a decision against a
//! named policy, of a priority class (docs/semantics.md §2.5), answered
//! with the same figures as `POST /v1/check`'s body (docs/resp.md).
//!
//! It answers about 20 values where `CL.THROTTLE` answers five: 0.88–0.96×
//! redis-cell's throughput, 0.46× pipelined on a million keys
//! (BENCHMARKS.md, "Against redis-cell itself").

use crate::engine::{CheckOutcome, CheckRequest, CheckTarget};
use crate::front::report::reported;

use super::super::frame::Reply;

/// Reads `policy key [cost] [PRIORITY class]` (after the command's name).
/// Errors lead with `INVALID_ARGUMENT` and the field, as the engine's own
/// would.
pub fn parse(args: &[&[u8]]) -> Result<CheckRequest, Reply> {
    // An option keyword after the positions, as Redis's own commands take
    // theirs (`SET key value EX 10`).
    let (args, priority) = match args {
        [head @ .., kw, class] if kw.eq_ignore_ascii_case(b"priority") && head.len() >= 2 => {
            let word = std::str::from_utf8(class).unwrap_or("\u{fffd}");
            let p = crate::front::priority::parse("priority", word)
                .map_err(|e| Reply::error(format!("INVALID_ARGUMENT {}", e.message)))?;
            (head, p)
        }
        _ => (args, Default::default()),
    };
    if args.len() != 2 && args.len() != 3 {
        return Err(super::arity("fc.check"));
    }
    let text = |field: &str, a: &[u8]| -> Result<String, Reply> {
        String::from_utf8(a.to_vec())
            .map_err(|_| Reply::error(format!("INVALID_ARGUMENT {field}: must be UTF-8 text")))
    };
    // Only the syntax here: the engine refuses a cost over 2^53 − 1 in
    // the same words (docs/semantics.md §5.1).
    let cost = match args.get(2) {
        None => 1,
        Some(c) => std::str::from_utf8(c)
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or_else(|| {
                Reply::error(format!(
                    "INVALID_ARGUMENT cost: must be an integer from 0 to 2^53 - 1, got {:?}",
                    String::from_utf8_lossy(c)
                ))
            })?,
    };
    Ok(CheckRequest {
        priority,
        target: CheckTarget::Policy(text("policy", args[0])?),
        key: text("key", args[1])?,
        cost,
        // RESP has no commit or release: an immediate debit.
        reserve: false,
        ttl_ms: None,
        reservation_id: None,
        fingerprint: None,
    })
}

/// The decision as a map (a flat array of pairs under RESP2), field for
/// field as the HTTP body: `allowed` is 1 or 0, a null `retry_after_ms` is
/// a null.
pub fn answer(out: &CheckOutcome) -> Reply {
    let r = reported(out);
    let int = |v: u64| Reply::Int(i64::try_from(v).unwrap_or(i64::MAX));
    let retry = |r: Option<u64>| r.map_or(Reply::Null, int);
    let items = r
        .items
        .iter()
        .map(|i| {
            Reply::Map(vec![
                ("name", Reply::bulk(i.name)),
                ("kind", Reply::bulk(i.kind)),
                ("limit", int(i.limit)),
                ("remaining", int(i.remaining)),
                ("reset_after_ms", int(i.reset_after_ms)),
                ("retry_after_ms", retry(i.retry_after_ms)),
                ("allowed", Reply::Int(i64::from(i.allowed))),
            ])
        })
        .collect();
    Reply::Map(vec![
        ("allowed", Reply::Int(i64::from(r.allowed))),
        ("delay_ms", int(r.delay_ms)),
        ("retry_after_ms", retry(r.retry_after_ms)),
        ("remaining", int(r.remaining)),
        ("reset_after_ms", int(r.reset_after_ms)),
        ("limits", Reply::Array(items)),
    ])
}
