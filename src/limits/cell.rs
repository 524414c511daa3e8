//! `CL.THROTTLE`'s GCRA: redis-cell's arithmetic, step for step, in exact
//! rationals (docs/resp.md, "CL.THROTTLE").
//!
//! redis-cell keeps one theoretical arrival time (TAT) per key, whatever
//! parameters each call passes, and applies each call's parameters to it:
//! the emission interval T = period / count, the tolerance
//! τ = T·(max_burst + 1) and the increment T·quantity. So a plan upgrade
//! (`k 10 10 60` after `k 5 10 60`) keeps what the key used and widens its
//! burst, rather than granting a new one. Every argument is a signed
//! integer, and redis-cell answers negative ones with the same formulas;
//! so does this module, signs and all (a negative quantity moves the TAT
//! back: a refund).
//!
//! Where redis-cell truncates T to whole nanoseconds (in floating point),
//! T here is the exact fraction P/Q ns, and time is counted in 1/Q ns, so
//! `3 1 1` admits exactly 3 a second; for a count that divides the period
//! in nanoseconds (every table redis-cell tests with) the two are the same
//! numbers. redis-cell's `i64` nanoseconds overflow (and answer nonsense)
//! once τ or the increment passes 2^63 ns, 292 years: those arguments are
//! refused here ([`CellError::Range`]).

use crate::clock::Nanos;
use crate::limits::rate::Rate;

/// A `CL.THROTTLE`'s parameters, compiled: T = `p`/`q` ns in lowest terms
/// (`p` carries the sign, `q` > 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CellRate {
    p: i128,
    q: i128,
    /// max_burst + 1: redis-cell's reported limit.
    limit: i128,
    /// τ = T·limit, in 1/q ns.
    tau: i128,
}

/// Why a `CL.THROTTLE` is not decided. The texts are redis-cell's where
/// redis-cell has the case (docs/resp.md lists them).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CellError {
    /// A zero count or period, or a rate over one per nanosecond (redis-cell's
    /// truncated interval is then 0).
    #[error("Zero rates are not supported")]
    ZeroRate,
    /// Allowed with a TAT 2 ms or more in the past (a negative quantity or
    /// rate): redis-cell fails to set the key's expiry, having written the
    /// key (see [`CellRate::throttle`]).
    #[error("Error while setting key expire")]
    Expire,
    /// Past the range redis-cell's `i64` nanoseconds hold.
    #[error("{0} must be under 2^63 ns (292 years)")]
    Range(&'static str),
}

/// A TAT as kept between calls: whole nanoseconds, and the rest in 1/`q` ns
/// of the parameters that set it (`rem` < `q`). Parameters of another `q`
/// read it rounded up to the next nanosecond: exact whenever the interval
/// is whole nanoseconds, as redis-cell's always is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CellTat {
    pub ns: Nanos,
    pub rem: u64,
    pub q: u64,
}

impl CellTat {
    /// A TAT in the distant past: an empty key.
    pub const EMPTY: CellTat = CellTat {
        ns: 0,
        rem: 0,
        q: 0,
    };
}

/// A `CL.THROTTLE`'s answer, before redis-cell's rounding to seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CellAnswer {
    pub limited: bool,
    pub limit: i64,
    pub remaining: i64,
    /// ns until the same request would pass; `None` when allowed, or when
    /// the increment is over the tolerance (redis-cell's −1).
    pub retry_after: Option<i128>,
    /// ns until the key is full again (may be negative: see [`CellRate::throttle`]).
    pub reset_after: i128,
}

fn gcd(a: u128, b: u128) -> u128 {
    // Every call compiles a rate: in u64 (the usual sizes) a step is a
    // fraction of the cost of a u128 one.
    if let (Ok(mut a), Ok(mut b)) = (u64::try_from(a), u64::try_from(b)) {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        return u128::from(a);
    }
    let (mut a, mut b) = (a, b);
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// 2^63 − 1: redis-cell's largest span in ns.
const MAX_SPAN_NS: i128 = i64::MAX as i128;

impl CellRate {
    /// The rate of `count` per `period_s` seconds with a burst of
    /// `max_burst` on top of the first unit, as redis-cell reads them.
    pub fn new(max_burst: i64, count: i64, period_s: i64) -> Result<CellRate, CellError> {
        let period_ns = i128::from(period_s) * 1_000_000_000;
        let count = i128::from(count);
        // redis-cell's interval is trunc(period_ns / count): zero for a zero
        // count or period, and for more than one per nanosecond.
        if count == 0 || period_ns == 0 || period_ns.abs() < count.abs() {
            return Err(CellError::ZeroRate);
        }
        let g = gcd(period_ns.unsigned_abs(), count.unsigned_abs());
        // g divides both, and both are below 2^94: the quotients fit.
        let g = i128::try_from(g).map_err(|_| CellError::Range("period / count"))?;
        let sign = if count < 0 { -1 } else { 1 };
        let (p, q) = (period_ns / g * sign, count.abs() / g);
        let limit = i128::from(max_burst) + 1;
        let tau = p
            .checked_mul(limit)
            .filter(|t| (t / q).abs() <= MAX_SPAN_NS)
            .ok_or(CellError::Range("(max_burst + 1) × period / count"))?;
        Ok(CellRate { p, q, limit, tau })
    }

    /// The same limit as a token line ([`Rate`]: `q` units every `p` ns, a
    /// burst of max_burst + 1, the same τ), for a fleet that leases a hot
    /// key's line (docs/cluster.md, "Hot keys"). `None` where no line
    /// holds it: a negative count or period, a burst below one, a rate or
    /// burst from 2^53, a period over 10 000 days ([`Rate::new`]'s range).
    pub fn line(&self) -> Option<Rate> {
        const MAX_UNITS: u64 = 1 << 53;
        const MAX_PER_NS: u64 = 10_000 * 86_400 * 1_000_000_000;
        let (Ok(p), Ok(q), Ok(burst)) = (
            u64::try_from(self.p),
            u64::try_from(self.q),
            u64::try_from(self.limit),
        ) else {
            return None;
        };
        let ok = (1..=MAX_PER_NS).contains(&p)
            && (1..MAX_UNITS).contains(&q)
            && (1..MAX_UNITS).contains(&burst);
        ok.then(|| Rate::new(q, p, burst))
    }

    /// T·quantity in 1/q ns, within redis-cell's range.
    fn increment(&self, quantity: i64) -> Result<i128, CellError> {
        self.p
            .checked_mul(i128::from(quantity))
            .filter(|i| (i / self.q).abs() <= MAX_SPAN_NS)
            .ok_or(CellError::Range("quantity × period / count"))
    }

    /// `tat` in this rate's 1/q ns: exact when it was set with the same q,
    /// else its next whole nanosecond.
    fn scaled(&self, tat: CellTat) -> i128 {
        let ns = i128::from(tat.ns);
        if i128::from(tat.q) == self.q {
            ns * self.q + i128::from(tat.rem)
        } else {
            (ns + i128::from(tat.rem > 0)) * self.q
        }
    }

    /// A TAT in 1/q ns as kept ([`CellTat`]); `None` if it is before the
    /// epoch or past 2^64 ns (neither is ever written: a written TAT is
    /// within a millisecond before now and τ after it).
    fn kept(&self, tat: i128) -> Option<CellTat> {
        let ns = Nanos::try_from(tat.div_euclid(self.q)).ok()?;
        let rem = u64::try_from(tat.rem_euclid(self.q)).ok()?;
        let q = u64::try_from(self.q).ok()?;
        Some(CellTat { ns, rem, q })
    }

    /// A span in 1/q ns as whole ns: rounded up when positive (waiting it
    /// is enough), toward zero when negative.
    fn ns(&self, span: i128) -> i128 {
        if span > 0 {
            (span + self.q - 1) / self.q
        } else {
            span / self.q
        }
    }

    /// Decides `quantity` at `now` on a key whose TAT is `stored` (`None`:
    /// absent, or expired: redis-cell's key expires at its TAT).
    ///
    /// redis-cell's steps (its `RateLimiter::rate_limit`): tat = stored or
    /// now; new_tat = max(now, tat) + increment; limited if new_tat − τ is
    /// after now, with retry_after = new_tat − τ − now when the increment
    /// fits in τ (else −1) and reset_after = tat − now; else new_tat is
    /// written, and reset_after = new_tat − now. remaining is
    /// trunc((τ − reset_after) / T) when that is above −T, else 0.
    pub fn throttle(&self, stored: Option<CellTat>, now: Nanos, quantity: i64) -> CellStep {
        let increment = match self.increment(quantity) {
            Ok(i) => i,
            Err(e) => {
                return CellStep {
                    answer: Err(e),
                    keep: None,
                };
            }
        };
        let now = i128::from(now) * self.q;
        let stored = stored.map(|t| self.scaled(t)).filter(|&t| t > now);
        let tat = stored.unwrap_or(now);
        let new_tat = tat.max(now) + increment;
        let wait = new_tat - self.tau - now;
        let (limited, ttl, retry_after) = if wait > 0 {
            let retry = (increment <= self.tau).then(|| self.ns(wait));
            (true, tat - now, retry)
        } else {
            (false, new_tat - now, None)
        };
        // A TAT before the epoch is as empty as one just past.
        let keep = (!limited).then(|| self.kept(new_tat).unwrap_or(CellTat::EMPTY));
        // redis-cell sets the key's expiry in whole ms, truncated toward
        // zero, after writing it; Redis refuses a negative expiry, except
        // −1 ms, its "no expiry". So the TAT moved (a refund past now
        // leaves the key empty) and the answer is the error.
        if !limited && self.ns(ttl) / 1_000_000 < -1 {
            return CellStep {
                answer: Err(CellError::Expire),
                keep,
            };
        }
        let next = self.tau - ttl;
        let remaining = if next > -self.p { next / self.p } else { 0 };
        let sat = |v: i128| i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX });
        CellStep {
            answer: Ok(CellAnswer {
                limited,
                limit: sat(self.limit),
                remaining: sat(remaining),
                retry_after,
                reset_after: self.ns(ttl),
            }),
            keep,
        }
    }
}

/// What a [`CellRate::throttle`] answers, and the TAT to keep (`None`:
/// nothing changes). An error may move the TAT, as redis-cell's does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CellStep {
    pub answer: Result<CellAnswer, CellError>,
    pub keep: Option<CellTat>,
}

/// A duration in whole seconds as redis-cell reports it: truncated toward
/// zero, plus one when positive with a millisecond or more left over (its
/// `subsec_milliseconds() > 0`).
pub fn cell_seconds(ns: i128) -> i64 {
    let whole = ns / 1_000_000_000;
    let up = i128::from(ns % 1_000_000_000 >= 1_000_000);
    i64::try_from(whole + up).unwrap_or(if ns < 0 { i64::MIN } else { i64::MAX })
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;
    const MS: Nanos = 1_000_000;
    const START: Nanos = 1_767_225_600 * S;

    /// redis-cell's own arithmetic, transcribed in integers for intervals of
    /// whole ns (its `Rate::per_period` and `RateLimiter::rate_limit`), as
    /// the reference the exact version must equal there.
    fn reference(
        stored: Option<i128>,
        now: i128,
        b: i64,
        count: i64,
        period: i64,
        q: i64,
    ) -> (bool, i64, i64, i128, i128, Option<i128>) {
        let t = i128::from(period) * 1_000_000_000 / i128::from(count);
        let dvt = t * (i128::from(b) + 1);
        let inc = t * i128::from(q);
        let tat = stored.filter(|&s| s > now).unwrap_or(now);
        let new_tat = if now > tat { now } else { tat } + inc;
        let diff = now - (new_tat - dvt);
        let (limited, ttl, retry, keep) = if diff < 0 {
            let retry = if inc <= dvt { -diff } else { -(S as i128) };
            (true, tat - now, retry, None)
        } else {
            (false, new_tat - now, -(S as i128), Some(new_tat))
        };
        let next = dvt - ttl;
        // redis-cell divides whole microseconds in f64; for these tables
        // the quotient is the same as the exact one truncated.
        let remaining = if next > -t { (next / t) as i64 } else { 0 };
        (limited, b + 1, remaining, retry, ttl, keep)
    }

    fn run(steps: &[(Nanos, i64, i64, i64, i64)]) {
        let mut mine: Option<CellTat> = None;
        let mut theirs: Option<i128> = None;
        for (i, &(at, b, count, period, q)) in steps.iter().enumerate() {
            let now = START + at;
            let rate = CellRate::new(b, count, period).unwrap();
            let CellStep { answer, keep } = rate.throttle(mine, now, q);
            let a = answer.unwrap();
            let (limited, limit, remaining, retry, ttl, keep_ref) =
                reference(theirs, i128::from(now), b, count, period, q);
            assert_eq!(a.limited, limited, "step {i}");
            assert_eq!(a.limit, limit, "step {i}");
            assert_eq!(a.remaining, remaining, "step {i}");
            assert_eq!(a.retry_after.unwrap_or(-(S as i128)), retry, "step {i}");
            assert_eq!(a.reset_after, ttl, "step {i}");
            if let Some(k) = keep {
                mine = Some(k);
            }
            if let Some(k) = keep_ref {
                theirs = Some(k);
            }
        }
    }

    #[test]
    fn new_parameters_apply_to_the_same_tat() {
        run(&[
            (0, 5, 10, 60, 1),
            (0, 5, 10, 60, 1),
            (0, 5, 10, 60, 1),
            // Plan upgrade: the key keeps its three used units.
            (0, 10, 10, 60, 1),
            (250 * MS, 2, 10, 60, 1),
            (1_250 * MS, 5, 20, 60, 2),
            (7_999 * MS, 5, 10, 30, 1),
            (8 * S, 5, 10, 120, 0),
            (20 * S, 5, 10, 60, 7),
        ]);
    }

    #[test]
    fn negative_arguments_answer_as_redis_cell_does() {
        // Each on a fresh key: redis-cell's answers, read from the module.
        let fresh = |b, c, p, q| {
            CellRate::new(b, c, p)
                .unwrap()
                .throttle(None, START, q)
                .answer
        };
        let five = |r: Result<CellAnswer, CellError>| {
            r.map(|a| {
                [
                    i64::from(a.limited),
                    a.limit,
                    a.remaining,
                    a.retry_after.map_or(-1, cell_seconds),
                    cell_seconds(a.reset_after),
                ]
            })
        };
        assert_eq!(five(fresh(-1, 1, 1, 1)), Ok([1, 0, 0, -1, 0]));
        assert_eq!(five(fresh(-5, 1, 1, 1)), Ok([1, -4, 0, -1, 0]));
        assert_eq!(five(fresh(-1, 1, 1, 0)), Ok([0, 0, 0, -1, 0]));
        assert_eq!(five(fresh(5, -1, 1, 1)), Ok([1, 6, 0, -1, 0]));
        assert_eq!(five(fresh(5, 1, -1, 1)), Ok([1, 6, 0, -1, 0]));
        assert_eq!(five(fresh(5, -1, -1, 1)), Ok([0, 6, 5, -1, 1]));
        assert_eq!(five(fresh(0, -1, 1, 1)), Err(CellError::Expire));
        assert_eq!(five(fresh(5, 1, 1, -1)), Err(CellError::Expire));
    }

    #[test]
    fn a_negative_quantity_refunds() {
        let r = CellRate::new(5, 1, 1).unwrap();
        let mut tat = None;
        for _ in 0..3 {
            tat = r.throttle(tat, START, 1).keep;
        }
        let step = r.throttle(tat, START, -2);
        let a = step.answer.unwrap();
        assert_eq!((a.limited, a.remaining), (false, 5));
        assert_eq!(step.keep.map(|t| t.ns), Some(START + S));
        // A refund past now is refused, and empties the key, as
        // redis-cell's does.
        let step = r.throttle(step.keep, START, -3);
        assert_eq!(step.answer, Err(CellError::Expire));
        assert_eq!(step.keep.map(|t| t.ns), Some(START - 2 * S));
    }

    #[test]
    fn three_a_second_is_exact_where_redis_cell_truncates() {
        let r = CellRate::new(2, 3, 1).unwrap();
        let mut tat = None;
        let mut allowed = 0;
        // One request every ms for 1000 s: the burst of 3, then exactly 3 a
        // second.
        for ms in 0..1_000_000u64 {
            let step = r.throttle(tat, START + ms * MS, 1);
            if !step.answer.unwrap().limited {
                allowed += 1;
                tat = step.keep;
            }
        }
        assert_eq!(allowed, 3 + 3 * 999 + 2);
    }

    #[test]
    fn errors_and_ranges() {
        assert_eq!(CellRate::new(1, 0, 1), Err(CellError::ZeroRate));
        assert_eq!(CellRate::new(1, 1, 0), Err(CellError::ZeroRate));
        assert_eq!(CellRate::new(1, 2_000_000_000, 1), Err(CellError::ZeroRate));
        assert!(CellRate::new(1, 1_000_000_000, 1).is_ok());
        assert!(matches!(
            CellRate::new(i64::MAX, 1, 1),
            Err(CellError::Range(_))
        ));
        assert!(matches!(
            CellRate::new(0, 1, 300 * 365 * 86_400),
            Err(CellError::Range(_))
        ));
        let r = CellRate::new(0, 1, 1).unwrap();
        assert!(matches!(
            r.throttle(None, START, i64::MAX).answer,
            Err(CellError::Range(_))
        ));
    }

    #[test]
    fn a_tat_of_another_q_is_read_rounded_up() {
        let thirds = CellRate::new(2, 3, 1).unwrap();
        let kept = thirds.throttle(None, START, 1).keep.unwrap();
        assert_eq!((kept.ns, kept.rem, kept.q), (START + 333_333_333, 1, 3));
        let whole = CellRate::new(2, 1, 1).unwrap();
        assert_eq!(whole.scaled(kept), i128::from(START + 333_333_334));
        assert_eq!(thirds.scaled(kept), i128::from(START + 333_333_333) * 3 + 1);
    }

    #[test]
    fn a_rate_and_its_token_line_decide_alike() {
        use crate::limits::rate::RateState;
        // 200 per second with a burst of 19 on top of the first unit, and
        // 7 per 3 s (T = 428 571 428 4/7 ns): a hot key's line must allow
        // what the key's own GCRA allows, call by call.
        for (b, count, period) in [(19, 200, 1), (4, 7, 3)] {
            let cell = CellRate::new(b, count, period).unwrap();
            let line = cell.line().expect("a line");
            assert_eq!(line.burst(), u64::try_from(b + 1).unwrap());
            let (mut tat, mut st) = (None, RateState::default());
            for i in 0..400u64 {
                let now = START + i * 1_700_000;
                let n = 1 + i % 3;
                let step = cell.throttle(tat, now, i64::try_from(n).unwrap());
                let probe = line.probe(&st, now, n);
                let limited = step.answer.unwrap().limited;
                assert_eq!(probe.allowed, !limited, "call {i} of {count}/{period}s");
                if probe.allowed {
                    line.apply(&mut st, &probe, n);
                    tat = step.keep;
                }
            }
        }
        // No line holds a negative count or a burst below one.
        assert!(CellRate::new(5, -1, 1).unwrap().line().is_none());
        assert!(CellRate::new(-1, 1, 1).map_or(true, |r| r.line().is_none()));
    }

    #[test]
    fn seconds_rounded_as_redis_cell_does() {
        assert_eq!(cell_seconds(0), 0);
        assert_eq!(cell_seconds(2_000 * MS as i128), 2);
        assert_eq!(cell_seconds(2_001 * MS as i128), 3);
        assert_eq!(cell_seconds(300 * MS as i128), 1);
        assert_eq!(cell_seconds(2_000 * MS as i128 + 999_999), 2);
        assert_eq!(cell_seconds(-1_500 * MS as i128), -1);
        assert_eq!(cell_seconds(i128::MAX), i64::MAX);
    }
}
