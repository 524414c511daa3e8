//! `CL.THROTTLE key max_burst count period [quantity]`: redis-cell's command,
//! answered as redis-cell 0.5 answers it (docs/resp.md, "CL.THROTTLE").
//!
//! This file reads the arguments in redis-cell's order and writes its five
//! integers; the decision is the engine's ([`crate::engine::Engine::throttle`]),
//! by redis-cell's arithmetic ([`crate::limits::cell`]).

use crate::engine::{ThrottleOutcome, ThrottleRequest};
use crate::limits::cell::{CellError, CellRate, cell_seconds};

use super::super::frame::Reply;

/// redis-cell's usage line, word for word: callers that match on its
/// errors keep working (docs/resp.md, "CL.THROTTLE", "Errors").
const USAGE: &str = "Cell error: Store error: Usage: cl.throttle <key> <max_burst> \
                     <count per period> <period> [<quantity>]";

/// An error in redis-cell 0.5's words: every one of its errors reads
/// `Cell error: Store error: ...`.
pub fn cell(message: impl std::fmt::Display) -> Reply {
    Reply::error(format!("Cell error: Store error: {message}"))
}

/// A rate refused by [`CellRate::new`], or a decision refused by the
/// engine (a refund into the past), in redis-cell's words.
impl From<CellError> for Reply {
    fn from(e: CellError) -> Reply {
        cell(e)
    }
}

/// Reads the arguments (after the command's name) in redis-cell's order:
/// arity, then each integer, then the rate (a zero rate, or one out of
/// range). The key is any bytes.
pub fn parse<'a>(args: &[&'a [u8]]) -> Result<ThrottleRequest<'a>, Reply> {
    // Not Redis's arity error: redis-cell answers its usage line.
    if args.len() != 4 && args.len() != 5 {
        return Err(Reply::error(USAGE));
    }
    // Signed, as redis-cell reads them (docs/resp.md, "Signed arguments").
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
    // Default 1; 0 peeks, as in redis-cell.
    let quantity = match args.get(4) {
        Some(q) => int(q)?,
        None => 1,
    };
    Ok(ThrottleRequest {
        key: args[0],
        rate: CellRate::new(max_burst, count, period)?,
        quantity,
    })
}

/// The five integers: limited, limit, remaining, retry_after (−1 when
/// allowed, or when the quantity is over the burst and can never pass),
/// reset_after.
pub fn answer(out: &ThrottleOutcome) -> Reply {
    let a = &out.answer;
    // Whole seconds rounded as redis-cell does; the same under RESP2 and 3.
    Reply::Array(vec![
        Reply::Int(i64::from(a.limited)),
        Reply::Int(a.limit),
        Reply::Int(a.remaining),
        Reply::Int(a.retry_after.map_or(-1, cell_seconds)),
        Reply::Int(cell_seconds(a.reset_after)),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p<'a>(args: &[&'a str]) -> Result<ThrottleRequest<'a>, Reply> {
        let a: Vec<&[u8]> = args.iter().map(|s| s.as_bytes()).collect();
        parse(&a)
    }

    fn err(r: Result<ThrottleRequest<'_>, Reply>) -> String {
        match r {
            Err(Reply::Error(m)) => m,
            other => panic!("expected an error, got {other:?}"),
        }
    }

    #[test]
    fn redis_cells_errors_in_its_order() {
        assert_eq!(err(p(&["k", "1", "2"])), USAGE);
        assert_eq!(err(p(&["k", "1", "2", "3", "4", "5"])), USAGE);
        assert_eq!(
            err(p(&["k", "x", "2", "3"])),
            "Cell error: Store error: Couldn't parse as integer: x"
        );
        // The first bad integer is named, before any rate check.
        assert_eq!(
            err(p(&["k", "1", "0", "y"])),
            "Cell error: Store error: Couldn't parse as integer: y"
        );
        assert_eq!(
            err(p(&["k", "1", "0", "3"])),
            "Cell error: Store error: Zero rates are not supported"
        );
        assert_eq!(
            err(p(&["k", "1", "2", "0", "z"])),
            "Cell error: Store error: Couldn't parse as integer: z"
        );
        assert!(err(p(&["k", "9223372036854775806", "2", "3"])).contains("under 2^63 ns"));
    }

    #[test]
    fn any_key_and_signed_arguments() {
        let long = "k".repeat(100_000);
        let t = p(&[&long, "15", "30", "60"]).unwrap();
        assert_eq!((t.key.len(), t.quantity), (100_000, 1));
        assert_eq!(p(&["", "-1", "-2", "3", "-4"]).unwrap().quantity, -4);
        let bin: [&[u8]; 4] = [b"\xff\x00", b"1", b"1", b"1"];
        assert_eq!(parse(&bin).unwrap().key, b"\xff\x00");
    }
}
