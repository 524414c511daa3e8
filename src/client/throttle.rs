//! Client-side adaptive throttling (Google SRE book, "Handling Overload";
//! docs/clients.md). Over a sliding window the client counts the requests it
//! attempted and those the server accepted; a new request is rejected
//! locally, without being sent, with probability
//!
//! ```text
//! p = max(0, (requests − K·accepts) / (requests + 1))
//! ```
//!
//! so a server that accepts everything is never spared a request, and one
//! that refuses most of them gets about K times its accepts. Requests
//! rejected locally count as requests (the SRE book's rule: the window sees
//! what the application asked for), so as the server recovers, accepts pull
//! p back down. Pure logic: the time is passed in.
//!
//! A request sent counts when its answer comes ([`AdaptiveThrottle::answered`]),
//! not when it is sent: counted at sending, a burst of calls in flight
//! read as requests without accepts, and p rose to 1 before the first
//! answer. 2048 connections opening an open-loop run at 240 000 checks a
//! second sent 6 005 of 480 001 in two seconds to a server that accepted
//! every one (p = 0.975), and the window, which forgets over 2 minutes,
//! let accepts catch up only slowly.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};

/// The rejection probability for `requests` and `accepts` in the window.
pub fn probability(requests: u64, accepts: u64, k: f64) -> f64 {
    let (r, a) = (requests as f64, accepts as f64);
    ((r - k * a) / (r + 1.0)).max(0.0)
}

/// Bins per window: the window slides by 1/120 of its length (1 s for the
/// default 2 minutes).
const BINS: u32 = 120;

/// What the throttle has seen in its window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ThrottleFigures {
    pub requests: u64,
    pub accepts: u64,
    /// The probability a request is rejected locally now.
    pub probability: f64,
    /// Requests rejected locally since the throttle was made.
    pub rejected_total: u64,
}

struct State {
    /// (bin number, requests, accepts), oldest first, at most [`BINS`].
    bins: VecDeque<(u64, u64, u64)>,
    rng: Xoshiro256PlusPlus,
    rejected_total: u64,
}

/// See the module documentation. Shared by every call of a client.
pub struct AdaptiveThrottle {
    k: f64,
    bin: Duration,
    origin: Instant,
    state: Mutex<State>,
}

impl AdaptiveThrottle {
    /// `k` (2 in the SRE book: the server sees up to twice what it accepts)
    /// over `window` (2 minutes by default); `seed` fixes the draws (tests).
    pub fn new(k: f64, window: Duration, seed: u64) -> AdaptiveThrottle {
        AdaptiveThrottle {
            k,
            bin: (window / BINS).max(Duration::from_millis(1)),
            origin: Instant::now(),
            state: Mutex::new(State {
                bins: VecDeque::new(),
                rng: Xoshiro256PlusPlus::seed_from_u64(seed),
                rejected_total: 0,
            }),
        }
    }

    fn bin_of(&self, now: Instant) -> u64 {
        let since = now.saturating_duration_since(self.origin);
        u64::try_from(since.as_nanos() / self.bin.as_nanos().max(1)).unwrap_or(u64::MAX)
    }

    /// Drops bins older than the window and returns the current one. A
    /// `now` older than the newest bin (threads that read the clock before
    /// another took the lock) counts in the newest: pushed behind it, each
    /// such time added a bin that the window never dropped, and summing
    /// them made every call slower (an open-loop load generator passing its
    /// connections' intended times, out of order by design, spent its core
    /// there: 10 929 checks a second answered, 136 159 without the throttle).
    fn current<'a>(&self, s: &'a mut State, now: Instant) -> &'a mut (u64, u64, u64) {
        let b = self.bin_of(now).max(s.bins.back().map_or(0, |last| last.0));
        while s.bins.front().is_some_and(|f| f.0 + u64::from(BINS) <= b) {
            s.bins.pop_front();
        }
        if s.bins.back().is_none_or(|l| l.0 != b) {
            s.bins.push_back((b, 0, 0));
        }
        // Just pushed if it was missing.
        let last = s.bins.len() - 1;
        &mut s.bins[last]
    }

    fn sums(s: &State) -> (u64, u64) {
        s.bins.iter().fold((0, 0), |(r, a), b| (r + b.1, a + b.2))
    }

    /// Whether a request the application wants to send may go; `false`
    /// if it is to be rejected locally instead, which counts it. One that
    /// may go counts once it is [`answered`](Self::answered).
    pub fn admit(&self, now: Instant) -> bool {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        self.current(&mut s, now);
        let (r, a) = Self::sums(&s);
        let p = probability(r, a, self.k);
        let reject = p > 0.0 && s.rng.random::<f64>() < p;
        if reject {
            self.current(&mut s, now).1 += 1;
            s.rejected_total += 1;
        }
        !reject
    }

    /// Counts a request [`admit`](Self::admit) let go, now that it is over:
    /// `accepted` unless the server refused it (429 or 503) or never
    /// answered.
    pub fn answered(&self, now: Instant, accepted: bool) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let bin = self.current(&mut s, now);
        bin.1 += 1;
        bin.2 += u64::from(accepted);
    }

    pub fn figures(&self, now: Instant) -> ThrottleFigures {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        self.current(&mut s, now);
        let (requests, accepts) = Self::sums(&s);
        ThrottleFigures {
            requests,
            accepts,
            probability: probability(requests, accepts, self.k),
            rejected_total: s.rejected_total,
        }
    }
}

/// The fraction of requests rejected locally once the throttle has settled,
/// for a server that accepts at most `capacity` of the `offered` requests
/// sent to it each second: four simulated minutes with the throttle's own
/// draws, the last two measured. The SRE book's steady state is
/// max(0, 1 − K·capacity/offered); docs/clients.md plots both
/// (`cargo run --release --example throttle_curve --features client`).
pub fn simulate(offered: u32, capacity: u32, k: f64, seed: u64) -> f64 {
    let t = AdaptiveThrottle::new(k, Duration::from_secs(120), seed);
    let step = Duration::from_secs(1) / offered.max(1);
    let (mut local, mut measured) = (0u64, 0u64);
    for s in 0..240u32 {
        let mut accepted = 0;
        for i in 0..offered {
            let now = t.origin + Duration::from_secs(u64::from(s)) + step * i;
            let counts = s >= 120;
            measured += u64::from(counts);
            if t.admit(now) {
                let accepts = accepted < capacity;
                accepted += u32::from(accepts);
                t.answered(now, accepts);
            } else if counts {
                local += 1;
            }
        }
    }
    local as f64 / measured.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The SRE book's formula on a table of window counts.
    #[test]
    fn probability_table() {
        for (requests, accepts, want) in [
            (0, 0, 0.0),
            (100, 100, 0.0),
            (100, 50, 0.0),
            (100, 40, 20.0 / 101.0),
            (100, 10, 80.0 / 101.0),
            (100, 0, 100.0 / 101.0),
            (1000, 0, 1000.0 / 1001.0),
        ] {
            let p = probability(requests, accepts, 2.0);
            assert!(
                (p - want).abs() < 1e-12,
                "{requests}/{accepts}: {p} != {want}"
            );
        }
        // K = 1.5 throttles sooner.
        assert!((probability(100, 50, 1.5) - 25.0 / 101.0).abs() < 1e-12);
    }

    #[test]
    fn the_window_forgets() {
        let t = AdaptiveThrottle::new(2.0, Duration::from_secs(120), 1);
        let t0 = t.origin;
        for _ in 0..100 {
            t.answered(t0, false);
        }
        assert_eq!(t.figures(t0).requests, 100);
        assert!(t.figures(t0).probability > 0.9);
        // 2 minutes later nothing is left.
        let later = t0 + Duration::from_secs(121);
        let f = t.figures(later);
        assert_eq!((f.requests, f.accepts, f.probability), (0, 0, 0.0));
    }

    /// Times out of order (threads race to the lock) count in the newest
    /// bin: the window keeps at most one bin a second.
    #[test]
    fn times_out_of_order_add_no_bins() {
        let t = AdaptiveThrottle::new(2.0, Duration::from_secs(120), 1);
        let t0 = t.origin;
        for i in 0..10_000u32 {
            let late = Duration::from_millis(u64::from(i % 2) * 1500);
            t.answered(t0 + Duration::from_secs(1) + late, true);
            t.admit(t0 + late);
        }
        assert_eq!(t.state.lock().unwrap().bins.len(), 2);
        assert_eq!(t.figures(t0).requests, 10_000);
    }

    /// Calls in flight are not refusals: 1 000 calls started before the
    /// first answer, to a server that accepts them all, are all sent, and
    /// the throttle stays open (counted at sending, the n-th went with
    /// probability 1/n: about 7 of the 1 000).
    #[test]
    fn a_burst_in_flight_is_not_throttled() {
        let t = AdaptiveThrottle::new(2.0, Duration::from_secs(120), 1);
        let t0 = t.origin;
        let sent = (0..1000).filter(|_| t.admit(t0)).count();
        assert_eq!(sent, 1000);
        let t1 = t0 + Duration::from_millis(30);
        for _ in 0..sent {
            t.answered(t1, true);
        }
        let f = t.figures(t1);
        assert_eq!((f.requests, f.accepts, f.probability), (1000, 1000, 0.0));
        // Refused, the same burst closes it: p = (1000 - 0) / 1001.
        let t = AdaptiveThrottle::new(2.0, Duration::from_secs(120), 1);
        assert_eq!((0..1000).filter(|_| t.admit(t0)).count(), 1000);
        (0..1000).for_each(|_| t.answered(t1, false));
        assert!(t.figures(t1).probability > 0.99);
        assert!((0..100).filter(|_| t.admit(t1)).count() < 5);
    }

    /// A server that accepts at most 100 requests a second, offered 1 000
    /// a second: the throttle settles where the server is sent about K = 2
    /// times what it accepts, so 80 % are rejected locally
    /// (p = (1 000 − 2·100) / 1 000); with a fixed seed, on a few rates.
    #[test]
    fn sheds_at_the_expected_rate() {
        for (capacity, want) in [(100, 0.8), (250, 0.5), (400, 0.2), (500, 0.0), (900, 0.0)] {
            let shed = simulate(1000, capacity, 2.0, 7);
            assert!(
                (shed - want).abs() < 0.02,
                "capacity {capacity}: shed {shed}"
            );
        }
    }
}
