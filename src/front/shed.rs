//! Load shedding, the same for every front: a request past the in-flight
//! cap, one whose connection waited past `shed_queue_delay` to be run, and
//! one on a connection kept for probes only is answered `overloaded` at
//! once (and counted by reason), before its message is decided.
//!
//! The lowest classes are shed first (docs/service.md, "Shedding"): a
//! request whose `x-freqcap-priority` header says `low` or `sheddable` may
//! use only part of the in-flight cap and of the queue delay, so a
//! saturated server refuses them before `default` traffic, and `high` and
//! `critical` requests may wait longer before they are shed. `default`
//! (no header) is shed exactly as before. The header is the caller's claim,
//! read before the body; tokens say who may make it.
//!
//! The queue delay bound follows CoDel (Nichols and Jacobson), as
//! Facebook's "Fail at Scale" applies it to a server's queue: a queue that
//! drains now and then is a burst, and a request may wait up to
//! `shed_queue_delay` (20 ms); a queue in which every request for longer
//! than [`INTERVAL`] (100 ms) waited past the target (a quarter of the
//! bound, 5 ms) is standing, and then a request that waited past the
//! target is shed. Serving the fresh requests of a standing queue
//! is what adaptive LIFO is for; the runtime orders tasks here, so the old
//! ones are shed instead of served last (docs/service.md).
//!
//! A CPU guard ([`super::cpu`]) sheds `low` and `sheddable` requests while
//! the process's CPUs are busier than `shed_cpu_permille`.
//!
//! Settling a reservation (commit, release) is never shed ([`Work::Settle`]):
//! it ends work the server admitted already and gives back what it holds.
//! Shed, it left its holds open until their TTL, and the open-reservation
//! cap then refused the screens after it: in an open-loop screen run at 4x
//! (`loadgen --workload screen --conns 2048 --rate 30000`), 34 003 screens
//! were answered 503 `reservations` for holds that shed commits had left
//! behind; none since.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use super::cpu::CpuGuard;
use super::metrics::Metrics;
use super::{FrontError, FrontOptions};
use crate::engine::Priority;
use crate::limits::priority::{Share, WHOLE, scaled};
use crate::server::Conn;

/// The share of `max_in_flight` a class may fill before its requests are
/// shed: `low` three quarters, `sheddable` half, the others all of it.
fn in_flight_share(class: Priority) -> Share {
    match class {
        Priority::Critical | Priority::High | Priority::Default => WHOLE,
        Priority::Low => WHOLE / 4 * 3,
        Priority::Sheddable => WHOLE / 2,
    }
}

/// How long a class may wait to be run, in quarters of `shed_queue_delay`:
/// `sheddable` half of it, `low` three quarters, `default` all of it,
/// `high` one and a half, `critical` twice (40 ms at the 20 ms default,
/// within the 50 ms an accepted request's p99 is held to).
fn queue_delay_quarters(class: Priority) -> u32 {
    match class {
        Priority::Critical => 8,
        Priority::High => 6,
        Priority::Default => 4,
        Priority::Low => 3,
        Priority::Sheddable => 2,
    }
}

/// The class a request's headers claim, for shedding only: a word that is
/// not a class counts as `default` here (the handler refuses it with 400).
pub(crate) fn claimed(headers: &axum::http::HeaderMap) -> Priority {
    super::priority::of_request(None, super::priority::header(headers)).unwrap_or_default()
}

/// An in-flight slot (every front counts into the same gauge), given back
/// when the request ends, also when the client goes away and the handler's
/// future is dropped mid-way.
pub(crate) struct InFlight<'a> {
    metrics: &'a Metrics,
}

impl<'a> InFlight<'a> {
    /// A slot, or 503 `overloaded` (counted) when `max` requests are in
    /// flight already: the one load-shedding rule of HTTP, RESP and gRPC.
    pub(crate) fn try_enter(metrics: &'a Metrics, max: usize) -> Result<Self, FrontError> {
        Self::try_enter_as(metrics, max, Priority::Default)
    }

    /// [`InFlight::try_enter`] for a request of class `class`, which may
    /// fill only its share of `max` ([`in_flight_share`]).
    pub(crate) fn try_enter_as(
        metrics: &'a Metrics,
        max: usize,
        class: Priority,
    ) -> Result<Self, FrontError> {
        let before = metrics.in_flight.inc();
        let slot = InFlight { metrics };
        let ceiling = scaled(max as u64, in_flight_share(class));
        if u64::try_from(before).unwrap_or(u64::MAX) >= ceiling {
            metrics.overloaded("in_flight");
            return Err(FrontError::overloaded(
                "too many requests in flight; retry shortly",
            ));
        }
        Ok(slot)
    }

    /// The slot of a settle (commit, release): counted with the others,
    /// never refused ([`Work::Settle`]).
    pub(crate) fn enter_to_settle(metrics: &'a Metrics) -> Self {
        metrics.in_flight.inc();
        InFlight { metrics }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.metrics.in_flight.dec();
    }
}

/// What a request does, for shedding: a decision takes new work on; a
/// settle (commit, release) finishes work admitted already and is not shed
/// on the in-flight cap, the queue delay or the CPU (the module's comment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Work {
    Decide,
    Settle,
}

/// A connection over the connection cap is kept for probes only: its
/// other requests are shed.
pub(crate) fn probe_only(metrics: &Metrics, conn: Option<&Conn>) -> Result<(), FrontError> {
    if conn.is_some_and(Conn::probe_only) {
        metrics.overloaded("connections");
        return Err(FrontError::overloaded(
            "too many connections; retry shortly",
        ));
    }
    Ok(())
}

/// How long a queue must go without draining to be standing (CoDel's
/// interval, 100 ms: a few scheduling rounds of a busy runtime).
pub const INTERVAL: Duration = Duration::from_millis(100);

/// What shedding remembers between requests: since when every request
/// waited past the target (CoDel), and the CPU guard.
pub struct Shedder {
    epoch: Instant,
    /// When the current run of requests over the target began, µs since
    /// `epoch`; [`NO_RUN`] when the last request waited under it. A run,
    /// not "when the queue last drained": an idle server has no queue,
    /// and its first slow request must not read as a standing one.
    above_since_us: AtomicU64,
    cpu: CpuGuard,
}

const NO_RUN: u64 = u64::MAX;

impl Default for Shedder {
    fn default() -> Self {
        Shedder {
            epoch: Instant::now(),
            above_since_us: AtomicU64::new(NO_RUN),
            cpu: CpuGuard::new(),
        }
    }
}

impl Shedder {
    fn now_us(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// Notes a request that waited `delay` against the `target`; whether
    /// the queue is standing: every request for longer than [`INTERVAL`]
    /// waited past the target.
    fn standing(&self, delay: Duration, target: Duration) -> bool {
        if delay < target {
            self.above_since_us.store(NO_RUN, Relaxed);
            return false;
        }
        let now = self.now_us();
        // The first request over the target starts the run (a racing one
        // may have started it a moment earlier: either start will do).
        let since = match self
            .above_since_us
            .compare_exchange(NO_RUN, now, Relaxed, Relaxed)
        {
            Ok(_) => now,
            Err(started) => started,
        };
        now.saturating_sub(since) > INTERVAL.as_micros() as u64
    }
}

/// The bound a request of `class` may wait to be run: `shed_queue_delay`,
/// or CoDel's target (a quarter of it) while the queue stands, in the
/// class's quarters ([`queue_delay_quarters`]).
fn queue_bound(o: &FrontOptions, standing: bool, class: Priority) -> Duration {
    let base = if standing {
        o.shed_queue_delay / 4
    } else {
        o.shed_queue_delay
    };
    base * queue_delay_quarters(class) / 4
}

/// A request that waited past its bound to be run is shed ([`queue_bound`]:
/// CoDel), and a `low` or `sheddable` one while the CPU guard is up. On
/// the wait, not only on how many are in flight: when the CPU is the
/// bottleneck, requests queue in the runtime before any handler counts
/// them (2048 connections on /v1/check: 0 % shed by the in-flight count
/// while p99 reached 173 ms). What is accepted waited less than the bound.
/// A settle is never shed ([`Work`]).
pub(crate) fn too_busy(
    shed: &Shedder,
    o: &FrontOptions,
    metrics: &Metrics,
    conn: Option<&Conn>,
    class: Priority,
    work: Work,
) -> Result<(), FrontError> {
    if work == Work::Settle {
        return Ok(());
    }
    if let Some(c) = conn {
        let delay = c.queue_delay();
        let standing = shed.standing(delay, o.shed_queue_delay / 4);
        if delay > queue_bound(o, standing, class) {
            metrics.overloaded("queue_delay");
            return Err(FrontError::overloaded(
                "the server is saturated; retry shortly",
            ));
        }
    }
    if o.shed_cpu_permille > 0
        && matches!(class, Priority::Low | Priority::Sheddable)
        && shed.cpu.busy_permille() >= o.shed_cpu_permille
    {
        metrics.overloaded("cpu");
        return Err(FrontError::overloaded(
            "the server's CPU is saturated; retry shortly",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Default is shed exactly as before; lower classes earlier, higher
    /// ones later, never inverted.
    #[test]
    fn lower_classes_are_shed_first() {
        let metrics = Metrics::new(
            super::super::metrics::EngineFigures(Box::new(Default::default)),
            &crate::server::ConnCounters::default(),
        );
        let held: Vec<_> = (0..50)
            .map(|_| InFlight::try_enter(&metrics, 100).unwrap())
            .collect();
        assert!(InFlight::try_enter_as(&metrics, 100, Priority::Sheddable).is_err());
        assert!(InFlight::try_enter_as(&metrics, 100, Priority::Low).is_ok());
        let more: Vec<_> = (0..25)
            .map(|_| InFlight::try_enter(&metrics, 100).unwrap())
            .collect();
        assert!(InFlight::try_enter_as(&metrics, 100, Priority::Low).is_err());
        assert!(InFlight::try_enter_as(&metrics, 100, Priority::Default).is_ok());
        drop((held, more));
        let mut last = u32::MAX;
        for p in Priority::ALL {
            assert!(queue_delay_quarters(p) <= last, "{p:?}");
            last = queue_delay_quarters(p);
        }
        assert_eq!(queue_delay_quarters(Priority::Default), 4);
        assert_eq!(in_flight_share(Priority::Default), WHOLE);
    }

    /// CoDel: a queue that drained in the last interval allows the whole
    /// bound; one that has not (every request over the target for longer
    /// than the interval) allows only the target, by class.
    #[test]
    fn a_standing_queue_lowers_the_bound_to_the_target() {
        let o = FrontOptions::default();
        let s = Shedder::default();
        let target = o.shed_queue_delay / 4;
        let ms = Duration::from_millis;
        // An idle server's first slow request is a burst, not a queue.
        std::thread::sleep(INTERVAL + ms(20));
        assert!(!s.standing(ms(12), target));
        // A burst: over the target, but the queue drained just now.
        assert!(!s.standing(ms(1), target));
        assert!(!s.standing(ms(12), target));
        assert_eq!(queue_bound(&o, false, Priority::Default), ms(20));
        // Every request over the target for longer than the interval.
        std::thread::sleep(INTERVAL + ms(20));
        assert!(s.standing(ms(12), target));
        assert_eq!(queue_bound(&o, true, Priority::Default), ms(5));
        assert_eq!(queue_bound(&o, true, Priority::Critical), ms(10));
        assert_eq!(
            queue_bound(&o, true, Priority::Sheddable),
            Duration::from_micros(2500)
        );
        // One request under the target: the queue drained; the bound is back.
        assert!(!s.standing(ms(2), target));
        assert!(!s.standing(ms(12), target));
    }
}
