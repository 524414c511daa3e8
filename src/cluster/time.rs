//! The cluster's time (docs/cluster.md, "Time"): Redis's clock, as this node
//! measures it, so that no node's system clock decides anything.
//!
//! A node's clock minutes off (a VM restored from a snapshot, NTP not running)
//! would otherwise roll its windows, refill its rates and expire holds minutes
//! early or late, and every record it writes would carry its time to the other
//! nodes. Instead every node decides at `local + offset`, where `offset` is
//! Redis's `TIME` minus the local clock, measured once at start (before the
//! node serves) and then every [`INTERVAL`] by a task of the Redis client's own
//! runtime: one `TIME` a second per node, never a call on a decision's path.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use redis::{RedisResult, Value};

use crate::clock::{Clock, Nanos, SECOND, SystemClock};

/// How often the offset is measured again. Clocks that NTP keeps drift by
/// microseconds a second; one that is stepped is followed within this.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// Past this, an offset is logged as a warning (at most once a minute): the
/// node still decides right, but its clock needs fixing (its logs, and any
/// other program on it, read the wrong time).
pub const WARN_AT: Nanos = SECOND;

/// A sample further than this from the smoothed offset replaces it at once (the
/// local clock was stepped); nearer ones are averaged, so the jitter of one
/// round trip (its half is the error bound of a sample; ~0.1–1 ms on loopback
/// with six Redis servers on two cores) moves the offset by a quarter of it.
const STEP: Nanos = 250 * crate::clock::MS;

/// The measured offset of Redis's clock from this node's.
#[derive(Debug)]
pub struct ClusterClock {
    /// The clock measured against: the engine's clock in production
    /// ([`SystemClock`]: wall time, never going back).
    local: SystemClock,
    /// Redis's time minus the local clock's, ns, smoothed.
    offset: AtomicI64,
    /// Samples taken (0: the offset is not measured yet, and is 0).
    samples: AtomicU64,
    /// Local time of the last warning about a large offset (0: never).
    warned_at: AtomicU64,
}

impl Default for ClusterClock {
    fn default() -> Self {
        ClusterClock {
            local: SystemClock::new(),
            offset: AtomicI64::new(0),
            samples: AtomicU64::new(0),
            warned_at: AtomicU64::new(0),
        }
    }
}

impl ClusterClock {
    /// Redis's time minus this node's clock, ns (0 until measured).
    pub fn offset(&self) -> i64 {
        self.offset.load(Ordering::Relaxed)
    }

    /// Samples taken so far.
    pub fn samples(&self) -> u64 {
        self.samples.load(Ordering::Relaxed)
    }

    /// The clock the offset is measured against.
    pub fn local_now(&self) -> Nanos {
        self.local.now()
    }

    /// Takes one sample: `before` and `after` bracket the `TIME` call whose
    /// reply is `reply`. Returns the smoothed offset.
    pub fn sample(&self, before: Nanos, after: Nanos, reply: &Value) -> Option<i64> {
        let redis = time_of(reply)?;
        // The reply was made somewhere in [before, after]: its middle is off
        // by at most half the round trip.
        let mid = i128::from(before) + (i128::from(after) - i128::from(before)) / 2;
        let sample = i64::try_from(i128::from(redis) - mid).ok()?;
        let prev = self.offset();
        let n = self.samples.fetch_add(1, Ordering::Relaxed);
        let next = if n == 0 || sample.abs_diff(prev) > STEP {
            sample
        } else {
            prev + (sample - prev) / 4
        };
        self.offset.store(next, Ordering::Relaxed);
        if next.unsigned_abs() > WARN_AT {
            let now = self.local.now();
            let last = self.warned_at.load(Ordering::Relaxed);
            if last == 0 || now.saturating_sub(last) >= 60 * SECOND {
                self.warned_at.store(now, Ordering::Relaxed);
                tracing::warn!(
                    "this node's clock is {:.3} s {} Redis's: it decides at Redis's time (the cluster's), but fix its clock (NTP)",
                    next.unsigned_abs() as f64 / 1e9,
                    if next < 0 { "ahead of" } else { "behind" },
                );
            }
        }
        Some(next)
    }
}

/// `TIME`'s reply, [seconds, microseconds], in ns.
fn time_of(v: &Value) -> Option<Nanos> {
    let Value::Array(a) = v else { return None };
    let [s, us] = a.as_slice() else { return None };
    let num = |v: &Value| -> Option<u64> {
        match v {
            Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
            Value::Int(i) => u64::try_from(*i).ok(),
            _ => None,
        }
    };
    num(s)?
        .checked_mul(SECOND)?
        .checked_add(num(us)?.checked_mul(1_000)?)
}

/// Applies `offset` (ns) to local time `t`.
pub fn shifted(t: Nanos, offset: i64) -> Nanos {
    if offset >= 0 {
        t.saturating_add(offset.unsigned_abs())
    } else {
        t.saturating_sub(offset.unsigned_abs())
    }
}

/// One sample over `query` (a `TIME` call).
pub async fn measure<F, Fut>(clock: &ClusterClock, query: F) -> RedisResult<Option<i64>>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = RedisResult<Value>>,
{
    let before = clock.local_now();
    let reply = query().await?;
    let after = clock.local_now();
    Ok(clock.sample(before, after, &reply))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(ns: Nanos) -> Value {
        Value::Array(vec![
            Value::BulkString((ns / SECOND).to_string().into_bytes()),
            Value::BulkString(((ns % SECOND) / 1_000).to_string().into_bytes()),
        ])
    }

    #[test]
    fn offsets_are_measured_smoothed_and_follow_steps() {
        let c = ClusterClock::default();
        let t = 1_800_000_000 * SECOND;
        // First sample: taken as it is (Redis 600 s behind this node).
        assert_eq!(
            c.sample(t, t + 2_000, &reply(t + 1_000 - 600 * SECOND)),
            Some(-600 * SECOND as i64)
        );
        // Jitter is averaged: 4 µs off moves it by 1 µs.
        assert_eq!(
            c.sample(t, t, &reply(t + 4_000 - 600 * SECOND)),
            Some(-600 * SECOND as i64 + 1_000)
        );
        // A step of the local clock is followed at once.
        assert_eq!(c.sample(t, t, &reply(t)), Some(0));
        assert_eq!(c.samples(), 3);
        assert_eq!(c.sample(t, t, &Value::Nil), None);
        assert_eq!(shifted(10, -20), 0);
        assert_eq!(shifted(10, 5), 15);
    }
}
