//! `FC.CHECK policy key [cost]`: a decision against a named policy, answered
//! with the same figures as `POST /v1/check`'s body (docs/resp.md).

use crate::MAX_EXACT;
use crate::engine::{CheckOutcome, CheckRequest, CheckTarget};
use crate::front::call::ms;

use super::super::frame::Reply;

/// Reads `policy key [cost]` (after the command's name).
pub fn parse(args: &[&[u8]]) -> Result<CheckRequest, Reply> {
    if args.len() != 2 && args.len() != 3 {
        return Err(super::arity("fc.check"));
    }
    let text = |field: &str, a: &[u8]| -> Result<String, Reply> {
        String::from_utf8(a.to_vec())
            .map_err(|_| Reply::error(format!("INVALID_ARGUMENT {field}: must be UTF-8 text")))
    };
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
        target: CheckTarget::Policy(text("policy", args[0])?),
        key: text("key", args[1])?,
        cost,
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
    let d = &out.decision;
    let int = |v: u64| Reply::Int(i64::try_from(v).unwrap_or(i64::MAX));
    let retry = |r: Option<u128>| r.map_or(Reply::Null, |r| int(ms(r)));
    let items = d
        .items
        .iter()
        .enumerate()
        .map(|(i, f)| {
            Reply::Map(vec![
                ("name", Reply::bulk(out.stack.name(i))),
                ("kind", Reply::bulk(out.stack.items()[i].kind().as_str())),
                ("limit", int(f.limit)),
                ("remaining", int(f.remaining.min(MAX_EXACT))),
                ("reset_after_ms", int(ms(f.reset_after))),
                ("retry_after_ms", retry(f.retry_after)),
                ("allowed", Reply::Int(i64::from(f.allowed))),
            ])
        })
        .collect();
    Reply::Map(vec![
        ("allowed", Reply::Int(i64::from(d.allowed))),
        ("delay_ms", int(ms(d.delay))),
        (
            "retry_after_ms",
            if d.allowed {
                Reply::Null
            } else {
                retry(d.retry_after)
            },
        ),
        ("remaining", int(d.remaining.min(MAX_EXACT))),
        ("reset_after_ms", int(ms(d.reset_after))),
        ("limits", Reply::Array(items)),
    ])
}
