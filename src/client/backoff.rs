//! When to try again: exponential backoff with full jitter (AWS's
//! "Exponential Backoff And Jitter": a uniform draw in [0, min(cap, base·2^n)]
//! spreads retries of clients that failed together, where plain exponential
//! backoff keeps them in step), never sooner than the server asked with
//! `Retry-After` or `retry_after_ms` (docs/clients.md).

use std::time::Duration;

use rand::RngExt;

/// How a call is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The first delay's upper bound.
    pub base: Duration,
    /// No delay's upper bound exceeds this.
    pub cap: Duration,
    /// Retries after the first try (0: none).
    pub max_retries: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            base: Duration::from_millis(10),
            cap: Duration::from_secs(1),
            max_retries: 3,
        }
    }
}

impl Backoff {
    /// The upper bound of the delay before retry `n` (0 for the first retry).
    pub fn bound(&self, n: u32) -> Duration {
        let factor = 1u32.checked_shl(n.min(31)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// The delay before retry `n`: a uniform draw below [`Backoff::bound`],
    /// and at least what the server asked.
    pub fn delay(&self, n: u32, asked: Option<Duration>, rng: &mut impl rand::Rng) -> Duration {
        let bound = u64::try_from(self.bound(n).as_micros()).unwrap_or(u64::MAX);
        let jittered = Duration::from_micros(rng.random_range(0..=bound));
        asked.map_or(jittered, |a| a.max(jittered))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::Xoshiro256PlusPlus;

    #[test]
    fn bounds_double_up_to_the_cap() {
        let b = Backoff::default();
        let ms = |n| b.bound(n).as_millis();
        assert_eq!([ms(0), ms(1), ms(2), ms(3)], [10, 20, 40, 80]);
        assert_eq!(ms(7), 1000);
        assert_eq!(ms(40), 1000);
    }

    #[test]
    fn full_jitter_and_the_servers_delay() {
        let b = Backoff::default();
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(3);
        let draws: Vec<Duration> = (0..1000).map(|_| b.delay(3, None, &mut rng)).collect();
        assert!(draws.iter().all(|d| *d <= Duration::from_millis(80)));
        // Spread over the whole range, not bunched at the top.
        let low = draws
            .iter()
            .filter(|d| **d < Duration::from_millis(40))
            .count();
        assert!((400..600).contains(&low), "{low}");
        // Retry-After wins when longer.
        let asked = Some(Duration::from_secs(2));
        assert_eq!(b.delay(0, asked, &mut rng), Duration::from_secs(2));
    }
}
