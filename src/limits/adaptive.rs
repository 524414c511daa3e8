//! `adaptive`: a concurrency limit that moves with the latency and outcome
//! callers report (docs/adaptive.md; issue 29, item 2). Pure logic: a state
//! machine over (state, now, sample), no clock and no I/O, so the engine and
//! `freqcap simulate overload` run the same controller.
//!
//! Samples are gathered in windows (at least [`Adaptive::min_samples`]
//! samples and [`Adaptive::window`] of time); the limit moves once per
//! window, never per sample, so a burst of samples cannot swing it. The
//! traps the anchors document are designed out (docs/adaptive.md, "Traps"):
//! - **no probes, no drift**: the no-load latency is measured from the
//!   traffic as it is; the limit is never lowered to measure it (Envoy's
//!   minRTT probe, envoy #8337). Any window may lower the belief; only a
//!   window with room to spare (less than half the limit used, or the limit
//!   at its floor) may raise it, once a baseline period, so sustained
//!   queueing, which the limiter itself keeps, never becomes the new
//!   "no load" (envoy #11579, concurrency-limits #165);
//! - **no growth on faith**: the limit only grows while callers use at
//!   least half of it (Vegas's rule), and a window with a `dropped` sample
//!   (a timeout, an overload answer) only ever shrinks it, so steady
//!   timeouts cannot raise it (concurrency-limits #137);
//! - **a floor and a ceiling**: `min` ≤ limit ≤ `max` always.

use crate::clock::Nanos;

use super::concurrency::{Concurrency, ConcurrencyState};
use super::priority::{Share, WHOLE, scaled};

/// How the limit moves (docs/adaptive.md compares them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// Gradient of no-load to current latency, as Netflix's Gradient2 but
    /// with a no-load baseline that does not follow sustained queueing:
    /// `L' = L·(1 − s) + (g·L + √L)·s`, `g = clamp(tolerance · base / rtt,
    /// 0.5, 1)`.
    Gradient,
    /// TCP Vegas as in concurrency-limits: the queue the latency implies,
    /// `L·(1 − base/rtt)`, kept between α = 3·log10 L and β = 6·log10 L.
    Vegas,
    /// Additive increase (+1 a window while used), multiplicative decrease
    /// (× `backoff` on a window with a drop); latency plays no part.
    Aimd,
}

impl Algorithm {
    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::Gradient => "gradient",
            Algorithm::Vegas => "vegas",
            Algorithm::Aimd => "aimd",
        }
    }

    pub fn parse(s: &str) -> Option<Algorithm> {
        [Algorithm::Gradient, Algorithm::Vegas, Algorithm::Aimd]
            .into_iter()
            .find(|a| a.as_str() == s)
    }
}

/// What happened to a request that held a slot, as its caller reports it
/// (the JSON word of each is its lowercase name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Completed: its latency counts.
    Ok,
    /// Timed out, refused downstream, overloaded: a sign of too much
    /// concurrency; its latency does not count.
    Dropped,
    /// Not the backend's doing (a client error, a cancel): no signal.
    Ignored,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Dropped => "dropped",
            Outcome::Ignored => "ignored",
        }
    }

    pub fn parse(s: &str) -> Option<Outcome> {
        [Outcome::Ok, Outcome::Dropped, Outcome::Ignored]
            .into_iter()
            .find(|o| o.as_str() == s)
    }
}

/// One report: the latency the caller measured and what happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    pub latency: Nanos,
    pub outcome: Outcome,
}

/// A compiled `adaptive` item.
#[derive(Debug, Clone, PartialEq)]
pub struct Adaptive {
    pub initial: u64,
    pub min: u64,
    pub max: u64,
    pub algorithm: Algorithm,
    /// Gradient: how far above the no-load latency the latency may be
    /// before the limit shrinks (1.5 in Gradient2).
    pub tolerance: f64,
    /// The shortest sample window.
    pub window: Nanos,
    /// The fewest samples a window needs (unless it has lasted
    /// [`STALE_WINDOWS`] windows).
    pub min_samples: u32,
    /// The factor a window with a drop shrinks the limit by.
    pub backoff: f64,
    /// How often the no-load latency may rise: to the lowest average of the
    /// period's windows with room to spare, if it had any.
    pub baseline_period: Nanos,
    /// The share of the limit a priority class sees, in millionths
    /// ([`WHOLE`] but for a class with a share, docs/semantics.md §2.5).
    pub share: Share,
}

/// An `adaptive` item's state for one key: its open slots, as a
/// concurrency item's, and its controller (`None` until the key's first
/// reservation: a fresh key starts at `initial`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AdaptiveState {
    pub slots: ConcurrencyState,
    pub ctl: Option<Controller>,
}

// `Controller::limit` is clamped between `min` and `max` after every step,
// so it is never NaN and equality is an equivalence.
impl Eq for AdaptiveState {}

/// A window with fewer than `min_samples` closes after this many windows'
/// time anyway, so light traffic still moves the limit.
pub const STALE_WINDOWS: u64 = 10;

/// Gradient's smoothing of each step (Gradient2's 0.2).
const SMOOTHING: f64 = 0.2;

/// The controller's state for one key. 64 bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Controller {
    /// The current limit, kept fractional so small steps add up.
    pub limit: f64,
    /// The sample window: start, samples, their latency sum, drops, and the
    /// most slots held when a sample came.
    pub win_start: Nanos,
    pub win_n: u32,
    pub win_dropped: u32,
    pub win_sum: u64,
    pub win_inflight: u64,
    /// The no-load latency believed (ns); `u64::MAX`: none yet.
    pub base: u64,
    /// The lowest average of this period's windows with room to spare
    /// (`u64::MAX`: none yet): what `base` becomes when the period ends.
    pub spare: u64,
    pub base_start: Nanos,
}

impl Adaptive {
    /// A fresh controller at `now`: the initial limit, no samples.
    pub fn fresh(&self, now: Nanos) -> Controller {
        Controller {
            limit: self.initial as f64,
            win_start: now,
            win_n: 0,
            win_dropped: 0,
            win_sum: 0,
            win_inflight: 0,
            base: u64::MAX,
            spare: u64::MAX,
            base_start: now,
        }
    }

    /// The whole slots a key may hold now.
    pub fn limit(&self, c: &Controller) -> u64 {
        (c.limit.floor() as u64).clamp(self.min, self.max)
    }

    /// The slots a key may hold now as this item's class sees it: the
    /// controller's limit, `initial` before the first reservation, scaled by
    /// the class's share.
    pub fn limit_of(&self, st: &AdaptiveState) -> u64 {
        let whole = st.ctl.as_ref().map_or(self.initial, |c| self.limit(c));
        if self.share == WHOLE {
            whole
        } else {
            scaled(whole, self.share)
        }
    }

    /// The slots as a concurrency item of the current limit: open slots,
    /// `allows`, figures and `retry_after` mean what they mean for
    /// `concurrency` (docs/semantics.md §2.4).
    pub fn slots(&self, st: &AdaptiveState) -> Concurrency {
        Concurrency {
            max: self.limit_of(st),
        }
    }

    /// Takes a slot until `deadline`; a key's first reservation starts its
    /// controller.
    pub fn hold(&self, st: &mut AdaptiveState, deadline: Nanos, now: Nanos) {
        st.ctl.get_or_insert_with(|| self.fresh(now));
        self.slots(st).hold(&mut st.slots, deadline, now);
    }

    /// Takes the sample a release or commit of the slot held until
    /// `deadline` carries, before the slot is freed: the slots held then,
    /// itself included, are the concurrency the latency was measured at.
    pub fn report(&self, st: &mut AdaptiveState, deadline: Nanos, s: Sample, now: Nanos) {
        let open = self.slots(st).open(&st.slots, now);
        // A slot that expired before its release says nothing of the
        // concurrency now (docs/adaptive.md, "In the engine").
        if st.slots.deadlines.binary_search(&deadline).is_err() || deadline <= now {
            return;
        }
        let c = st.ctl.get_or_insert_with(|| self.fresh(now));
        self.sample(c, now, s, open);
    }

    /// The first instant from which the state may be dropped: its last slot
    /// ended and a baseline period passed since its last window closed (a
    /// key idle that long starts again at `initial`).
    pub fn idle_at(&self, st: &AdaptiveState) -> Nanos {
        let slots = st.slots.deadlines.last().copied().unwrap_or(0);
        let learned = st
            .ctl
            .as_ref()
            .map_or(0, |c| c.win_start.saturating_add(self.baseline_period));
        slots.max(learned)
    }

    /// The no-load latency the controller believes, if it has one.
    pub fn baseline(&self, c: &Controller) -> Option<Nanos> {
        (c.base != u64::MAX).then_some(c.base)
    }

    /// Takes one sample at `now`, reported by a request that held a slot
    /// while `inflight` slots were held (itself included). Returns whether
    /// the limit moved.
    pub fn sample(&self, c: &mut Controller, now: Nanos, s: Sample, inflight: u64) -> bool {
        match s.outcome {
            Outcome::Ignored => return false,
            Outcome::Dropped => c.win_dropped = c.win_dropped.saturating_add(1),
            Outcome::Ok => {
                c.win_n = c.win_n.saturating_add(1);
                c.win_sum = c.win_sum.saturating_add(s.latency);
            }
        }
        c.win_inflight = c.win_inflight.max(inflight);
        let age = now.saturating_sub(c.win_start);
        let full = c.win_n + c.win_dropped >= self.min_samples && age >= self.window;
        let stale = age >= self.window.saturating_mul(STALE_WINDOWS);
        if !(full || stale) {
            return false;
        }
        let before = c.limit;
        self.close_window(c, now);
        c.limit != before
    }

    /// Moves the limit by the window's samples and opens the next window.
    fn close_window(&self, c: &mut Controller, now: Nanos) {
        let avg = (c.win_n > 0).then(|| c.win_sum / u64::from(c.win_n));
        let l = c.limit;
        // Used: at least half the limit was held at some sample.
        let used = (c.win_inflight as f64) * 2.0 >= l;
        // The baseline learns only from windows without drops: a window of
        // timeouts says nothing of the no-load latency.
        if let Some(a) = avg.filter(|_| c.win_dropped == 0).map(|a| a.max(1)) {
            c.base = c.base.min(a);
            if !used || l <= self.min as f64 {
                c.spare = c.spare.min(a);
            }
        }
        if now.saturating_sub(c.base_start) >= self.baseline_period {
            if c.spare != u64::MAX {
                c.base = c.spare;
            }
            c.spare = u64::MAX;
            c.base_start = now;
        }
        let next = if c.win_dropped > 0 {
            match self.algorithm {
                Algorithm::Vegas => l - log10(l),
                _ => l * self.backoff,
            }
        } else {
            match (avg, self.baseline(c)) {
                (Some(rtt), Some(base)) if used => self.step(l, rtt as f64, base as f64),
                // Not used, or nothing measured: no evidence either way.
                _ => l,
            }
        };
        c.limit = next.clamp(self.min as f64, self.max as f64);
        c.win_start = now;
        c.win_n = 0;
        c.win_dropped = 0;
        c.win_sum = 0;
        c.win_inflight = 0;
    }

    /// The next limit from a used window without drops, of average latency
    /// `rtt` against the no-load `base`.
    fn step(&self, l: f64, rtt: f64, base: f64) -> f64 {
        match self.algorithm {
            Algorithm::Gradient => {
                let g = (self.tolerance * base / rtt).clamp(0.5, 1.0);
                l * (1.0 - SMOOTHING) + (g * l + l.sqrt()) * SMOOTHING
            }
            Algorithm::Vegas => {
                let queue = (l * (1.0 - base / rtt)).ceil();
                let lg = log10(l);
                if queue <= lg {
                    l + 6.0 * lg
                } else if queue < 3.0 * lg {
                    l + lg
                } else if queue > 6.0 * lg {
                    l - lg
                } else {
                    l
                }
            }
            Algorithm::Aimd => l + 1.0,
        }
    }
}

/// log10 of a limit, at least 1 (concurrency-limits' step for small limits).
fn log10(l: f64) -> f64 {
    l.log10().max(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;

    fn item(algorithm: Algorithm) -> Adaptive {
        Adaptive {
            initial: 20,
            min: 4,
            max: 400,
            algorithm,
            tolerance: 1.5,
            window: 100 * MS,
            min_samples: 10,
            backoff: 0.9,
            baseline_period: 30_000 * MS,
            share: WHOLE,
        }
    }

    /// Feeds `windows` windows of `n` samples of latency `lat` (ms) with
    /// `inflight` held, 100 ms apart.
    fn feed(
        a: &Adaptive,
        c: &mut Controller,
        now: &mut Nanos,
        windows: u32,
        lat: u64,
        inflight: u64,
        outcome: Outcome,
    ) {
        for _ in 0..windows {
            for _ in 0..10 {
                *now += 10 * MS;
                a.sample(
                    c,
                    *now,
                    Sample {
                        latency: lat * MS,
                        outcome,
                    },
                    inflight,
                );
            }
        }
    }

    #[test]
    fn grows_while_used_and_fast_then_shrinks_under_queueing() {
        for alg in [Algorithm::Gradient, Algorithm::Vegas, Algorithm::Aimd] {
            let a = item(alg);
            let mut now = 0;
            let mut c = a.fresh(now);
            // Used and at no-load latency: it grows.
            feed(&a, &mut c, &mut now, 30, 10, 1000, Outcome::Ok);
            let grown = a.limit(&c);
            assert!(grown > 20, "{alg:?} {grown}");
            // Drops shrink it, whatever the algorithm.
            feed(&a, &mut c, &mut now, 5, 10, 1000, Outcome::Dropped);
            assert!(a.limit(&c) < grown, "{alg:?}");
        }
    }

    #[test]
    fn latency_over_the_baseline_shrinks_a_gradient_limit_to_its_floor() {
        let a = item(Algorithm::Gradient);
        let mut now = 0;
        let mut c = a.fresh(now);
        feed(&a, &mut c, &mut now, 10, 10, 1000, Outcome::Ok);
        feed(&a, &mut c, &mut now, 200, 40, 1000, Outcome::Ok);
        assert_eq!(a.limit(&c), a.min);
    }

    #[test]
    fn an_unused_limit_does_not_grow_and_steady_timeouts_never_raise_it() {
        let a = item(Algorithm::Gradient);
        let mut now = 0;
        let mut c = a.fresh(now);
        feed(&a, &mut c, &mut now, 100, 10, 3, Outcome::Ok);
        assert_eq!(a.limit(&c), 20);
        // Timeouts at one steady latency (zero variance): only down.
        let mut last = a.limit(&c);
        for _ in 0..50 {
            feed(&a, &mut c, &mut now, 1, 1000, 1000, Outcome::Dropped);
            assert!(a.limit(&c) <= last);
            last = a.limit(&c);
        }
        assert_eq!(last, a.min);
    }

    #[test]
    fn ignored_samples_change_nothing() {
        let a = item(Algorithm::Aimd);
        let mut c = a.fresh(0);
        let before = c;
        for t in 1..1000 {
            a.sample(
                &mut c,
                t * MS,
                Sample {
                    latency: MS,
                    outcome: Outcome::Ignored,
                },
                100,
            );
        }
        assert_eq!(c, before);
    }
}
