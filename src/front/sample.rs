//! What a release or commit reports of the work its reservation admitted
//! (`latency_ms`, `outcome`), as every front reads it: the sample an
//! adaptive item learns from (docs/adaptive.md, "In the engine").

use crate::limits::adaptive::{Outcome, Sample};

use super::FrontError;

/// The longest latency a sample may report: an hour. Longer is a clock or
/// unit mistake (seconds sent as milliseconds, a start time of 0), and one
/// such sample would set a key's belief of its latency.
pub const MAX_LATENCY_MS: u64 = 3_600_000;

/// The sample of `latency_ms` and `outcome` as a request gave them, either
/// of which may be absent: none of them is no sample; a latency alone is
/// an `ok` one; `dropped` and `ignored` need no latency (it does not count);
/// `ok` does. Errors name the field. A latency is a non-negative number of
/// milliseconds, fractions too (a client that measures `12.5` sends it);
/// it is kept to the nanosecond.
pub fn of(latency_ms: Option<f64>, outcome: Option<&str>) -> Result<Option<Sample>, FrontError> {
    let outcome = outcome
        .map(|w| {
            Outcome::parse(w).ok_or_else(|| {
                FrontError::invalid(
                    "outcome",
                    format!("expected \"ok\", \"dropped\" or \"ignored\", got {w:?}"),
                )
            })
        })
        .transpose()?;
    if let Some(ms) = latency_ms.filter(|ms| !(0.0..=MAX_LATENCY_MS as f64).contains(ms)) {
        return Err(FrontError::invalid(
            "latency_ms",
            format!(
                "must be a number of milliseconds from 0 to {MAX_LATENCY_MS} (an hour), got {ms}"
            ),
        ));
    }
    let outcome = match (latency_ms, outcome) {
        (None, None) => return Ok(None),
        (None, Some(Outcome::Ok)) => {
            return Err(FrontError::invalid(
                "latency_ms",
                "required with outcome \"ok\": the latency is what an ok sample reports",
            ));
        }
        (_, o) => o.unwrap_or(Outcome::Ok),
    };
    Ok(Some(Sample {
        // Within [0, an hour] (checked above): the product is exact to
        // well under a nanosecond and fits.
        latency: (latency_ms.unwrap_or(0.0) * crate::clock::MS as f64).round() as u64,
        outcome,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_alone_together_and_wrong() {
        assert_eq!(of(None, None).ok(), Some(None));
        let ok = of(Some(12.0), None).ok().flatten();
        assert_eq!(
            ok.map(|s| (s.latency, s.outcome)),
            Some((12_000_000, Outcome::Ok))
        );
        let dropped = of(None, Some("dropped")).ok().flatten();
        assert_eq!(dropped.map(|s| s.outcome), Some(Outcome::Dropped));
        let frac = of(Some(12.5), None).ok().flatten();
        assert_eq!(frac.map(|s| s.latency), Some(12_500_000));
        for (ms, o, field) in [
            (None, Some("ok"), "latency_ms"),
            (Some(1.0), Some("fine"), "outcome"),
            (Some(MAX_LATENCY_MS as f64 + 0.5), None, "latency_ms"),
            (Some(-0.5), None, "latency_ms"),
        ] {
            let e = of(ms, o).err().map(|e| e.message);
            assert!(e.as_deref().is_some_and(|m| m.starts_with(field)), "{e:?}");
        }
    }
}
