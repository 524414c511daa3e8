//! Load shedding, the same for every front: a request whose connection
//! waited past `shed_queue_delay` to be run, and one on a connection kept
//! for probes only, is answered `overloaded` at once (and counted by
//! reason), before its message is decided; so is one past the in-flight
//! cap, or, with `in_flight_wait`, it waits for a slot within what is left
//! of that bound, in the waiting room of [`super::admission`] (adaptive
//! LIFO), and is shed when it runs out.
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
//! target is shed. The runtime orders the connections' tasks, so there the
//! old requests are shed rather than served last; the waiting room, which
//! the server orders, serves the newest first while it stands
//! (docs/service.md, "Adaptive LIFO").
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

use std::time::Duration;

use super::admission::{Codel, Room, Waited, Waiting};
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
/// future is dropped mid-way; giving it back wakes a waiter
/// ([`super::admission`]).
pub(crate) struct InFlight<'a> {
    metrics: &'a Metrics,
    /// The waiting room to wake, and the cap its classes' shares are of.
    room: Option<(&'a Room, usize)>,
}

/// Whether a request of `class` fits under its share of `max` now.
fn fits(metrics: &Metrics, max: usize, class: Priority) -> bool {
    u64::try_from(metrics.in_flight.get()).unwrap_or(0) < scaled(max as u64, in_flight_share(class))
}

impl<'a> InFlight<'a> {
    /// A slot for a request of `class` if its share of `max`
    /// ([`in_flight_share`]) has room now; nothing is counted otherwise.
    pub(crate) fn take(
        metrics: &'a Metrics,
        room: Option<&'a Room>,
        max: usize,
        class: Priority,
    ) -> Option<Self> {
        let before = metrics.in_flight.inc();
        if u64::try_from(before).unwrap_or(u64::MAX) >= scaled(max as u64, in_flight_share(class)) {
            metrics.in_flight.dec();
            return None;
        }
        Some(InFlight {
            metrics,
            room: room.map(|r| (r, max)),
        })
    }

    /// The slot of a settle (commit, release): counted with the others,
    /// never refused ([`Work::Settle`]).
    pub(crate) fn enter_to_settle(shed: &'a Shedder, metrics: &'a Metrics, max: usize) -> Self {
        metrics.in_flight.inc();
        InFlight {
            metrics,
            room: Some((&shed.room, max)),
        }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.metrics.in_flight.dec();
        if let Some((room, max)) = self.room {
            room.wake(|c| fits(self.metrics, max, c));
        }
    }
}

/// One waiter in `freqcap_waiting_requests`, however its wait ends (its
/// caller may go away mid-wait).
struct Counted<'a>(&'a prometheus_client::metrics::gauge::Gauge);

impl<'a> Counted<'a> {
    fn new(g: &'a prometheus_client::metrics::gauge::Gauge) -> Self {
        g.inc();
        Counted(g)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The fewest waiters the room holds, whatever `max_in_flight`: a small
/// cap still queues a burst.
const MIN_ROOM: usize = 16;

/// An in-flight slot for a decision of `class`, the one load-shedding rule
/// of HTTP, gRPC, RLS and RESP: at once while its share of
/// `max_in_flight` has room (also when others wait: a slot given back is
/// taken by whoever runs first, never left idle until a woken waiter is
/// scheduled); else 503 `overloaded` at once, or, with `in_flight_wait`,
/// it waits in the room ([`super::admission`]) for what
/// is left of its queue bound ([`queue_bound`]) after `waited` (its
/// connection's wait to be run), and is then answered 503 `overloaded`
/// (counted as `in_flight`). The room holds `max_in_flight` waiters (at
/// least [`MIN_ROOM`]); past that an arrival is shed at once, since
/// waiting costs CPU (a timer, wakes) that an overloaded server lacks
/// (docs/service.md, "Adaptive LIFO", has the runs).
pub(crate) async fn admit<'a>(
    shed: &'a Shedder,
    o: &FrontOptions,
    metrics: &'a Metrics,
    class: Priority,
    waited: Duration,
) -> Result<InFlight<'a>, FrontError> {
    let (room, max) = (&shed.room, o.max_in_flight);
    if let Some(slot) = InFlight::take(metrics, Some(room), max, class) {
        return Ok(slot);
    }
    if !o.in_flight_wait || room.waiting() >= max.max(MIN_ROOM) {
        metrics.overloaded("in_flight");
        return Err(FrontError::overloaded(
            "too many requests in flight; retry shortly",
        ));
    }
    let standing = shed.queue.is_standing() || room.codel.is_standing();
    let bound = queue_bound(o, standing, class).saturating_sub(waited);
    let target = o.shed_queue_delay / 4;
    let fits = |c| fits(metrics, max, c);
    let mut w = Waiting::join(room, class, &fits);
    let _counted = Counted::new(&metrics.waiting);
    // A slot given back between the try above and joining woke nobody.
    if let Some(slot) = InFlight::take(metrics, Some(room), max, class) {
        return Ok(slot);
    }
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        let waited = w.wait(deadline).await;
        // Woken in time, but run past the bound (a busy runtime runs the
        // woken task late): served now, it would be answered later than
        // the bound promises, so it is shed and the slot goes to the next.
        let late = tokio::time::Instant::now() > deadline;
        room.codel.standing(w.waited(), target);
        match waited {
            Waited::Woken if !late => match InFlight::take(metrics, Some(room), max, class) {
                Some(slot) => {
                    w.done();
                    return Ok(slot);
                }
                None => w.requeue(),
            },
            // Dropped woken, it passes the wake on.
            Waited::Woken => break drop(w),
            Waited::TimedOut => break w.done(),
        }
    }
    metrics.overloaded("in_flight");
    Err(FrontError::overloaded(
        "too many requests in flight; retry shortly",
    ))
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

/// What shedding remembers between requests: whether the connections'
/// queue stands (CoDel), the waiting room for in-flight slots, and the
/// CPU guard.
#[derive(Default)]
pub struct Shedder {
    queue: Codel,
    room: Room,
    cpu: CpuGuard,
}

impl Shedder {
    /// How many decisions wait for an in-flight slot.
    pub fn waiting(&self) -> usize {
        self.room.waiting()
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
        let standing = shed.queue.standing(delay, o.shed_queue_delay / 4);
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
            super::super::figures::EngineFigures(Box::new(Default::default)),
            &crate::server::ConnCounters::default(),
            &Default::default(),
        );
        let take = |class| InFlight::take(&metrics, None, 100, class);
        let held: Vec<_> = (0..50).map(|_| take(Priority::Default).unwrap()).collect();
        assert!(take(Priority::Sheddable).is_none());
        assert!(take(Priority::Low).is_some());
        let more: Vec<_> = (0..25).map(|_| take(Priority::Default).unwrap()).collect();
        assert!(take(Priority::Low).is_none());
        assert!(take(Priority::Default).is_some());
        assert_eq!(metrics.in_flight.get(), 75, "a refused take counts nothing");
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
        let s = Codel::default();
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

    fn metrics() -> Metrics {
        Metrics::new(
            super::super::figures::EngineFigures(Box::new(Default::default)),
            &crate::server::ConnCounters::default(),
            &Default::default(),
        )
    }

    /// One slot, held; options whose queue bound is `bound`.
    fn room(bound: Duration) -> (&'static Shedder, &'static FrontOptions, &'static Metrics) {
        let o = FrontOptions {
            max_in_flight: 1,
            shed_queue_delay: bound,
            in_flight_wait: true,
            ..Default::default()
        };
        (
            Box::leak(Box::default()),
            Box::leak(Box::new(o)),
            Box::leak(Box::new(metrics())),
        )
    }

    /// Waiters of `classes`, queued in that order; each notes its index in
    /// `order` when it gets a slot and gives the slot back at once.
    async fn queue(
        (shed, o, m): (&'static Shedder, &'static FrontOptions, &'static Metrics),
        classes: &[Priority],
        order: &std::sync::Arc<std::sync::Mutex<Vec<usize>>>,
    ) -> Vec<tokio::task::JoinHandle<bool>> {
        let mut tasks = Vec::new();
        for (i, &class) in classes.iter().enumerate() {
            let order = order.clone();
            tasks.push(tokio::spawn(async move {
                let slot = admit(shed, o, m, class, Duration::ZERO).await;
                if slot.is_ok() {
                    order.lock().unwrap().push(i);
                }
                slot.is_ok()
            }));
            for _ in 0..100 {
                if shed.waiting() == i + 1 {
                    break;
                }
                tokio::task::yield_now().await;
            }
            assert_eq!(shed.waiting(), i + 1, "waiter {i} did not queue");
        }
        tasks
    }

    /// While the room drains (no standing queue), slots go to the oldest
    /// waiter first; a higher class goes before all of a lower one.
    #[tokio::test(flavor = "current_thread")]
    async fn waiters_are_served_oldest_first_and_by_class() {
        let r = room(Duration::from_secs(4));
        let first = InFlight::take(r.2, Some(&r.0.room), 1, Priority::Default).unwrap();
        let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        use Priority::{Critical, Default as Def, Sheddable};
        let tasks = queue(r, &[Def, Sheddable, Def, Critical], &order).await;
        drop(first);
        for t in tasks {
            assert!(t.await.unwrap());
        }
        assert_eq!(*order.lock().unwrap(), vec![3, 0, 2, 1]);
        assert_eq!((r.0.waiting(), r.2.in_flight.get()), (0, 0));
    }

    /// Adaptive LIFO: while the room's queue stands, the newest waiter is
    /// served first.
    #[tokio::test(flavor = "current_thread")]
    async fn a_standing_room_serves_the_newest_first() {
        let r = room(Duration::from_secs(4));
        let first = InFlight::take(r.2, Some(&r.0.room), 1, Priority::Default).unwrap();
        // Every wait over the target for longer than the interval.
        let codel = &r.0.room.codel;
        assert!(!codel.standing(Duration::from_secs(2), Duration::from_secs(1)));
        std::thread::sleep(INTERVAL + Duration::from_millis(20));
        assert!(codel.standing(Duration::from_secs(2), Duration::from_secs(1)));
        let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let tasks = queue(r, &[Priority::Default; 3], &order).await;
        drop(first);
        for t in tasks {
            assert!(t.await.unwrap());
        }
        assert_eq!(order.lock().unwrap()[0], 2, "{:?}", order.lock().unwrap());
    }

    /// A waiter whose bound runs out is shed, counted, and leaves nothing
    /// behind; one whose caller goes away after it was woken passes the
    /// wake on to the next.
    #[tokio::test(flavor = "current_thread")]
    async fn timed_out_and_abandoned_waiters_leave_no_trace() {
        let r = room(Duration::from_millis(20));
        let first = InFlight::take(r.2, Some(&r.0.room), 1, Priority::Default).unwrap();
        let shed_before = r.2.in_flight.get();
        let e = admit(r.0, r.1, r.2, Priority::Default, Duration::ZERO).await;
        assert!(e.is_err());
        assert_eq!((r.0.waiting(), r.2.in_flight.get()), (0, shed_before));

        let r = room(Duration::from_secs(4));
        let first_again = InFlight::take(r.2, Some(&r.0.room), 1, Priority::Default).unwrap();
        drop(first);
        let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut tasks = queue(r, &[Priority::Default; 2], &order).await;
        // The slot goes back: waiter 0 is woken, and its caller goes away
        // before it runs.
        drop(first_again);
        tasks[0].abort();
        assert!(tasks.pop().unwrap().await.unwrap());
        assert_eq!(*order.lock().unwrap(), vec![1]);
        assert_eq!((r.0.waiting(), r.2.in_flight.get()), (0, 0));
    }

    /// The room holds `max_in_flight` waiters, at least [`MIN_ROOM`]: the
    /// next arrival is shed at once, and those waiting are still served.
    #[tokio::test(flavor = "current_thread")]
    async fn a_full_room_sheds_an_arrival_at_once() {
        let r = room(Duration::from_secs(4));
        let first = InFlight::take(r.2, Some(&r.0.room), 1, Priority::Default).unwrap();
        let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let tasks = queue(r, &[Priority::Default; MIN_ROOM], &order).await;
        let shed = r.2.in_flight.get();
        assert!(
            admit(r.0, r.1, r.2, Priority::Critical, Duration::ZERO)
                .await
                .is_err()
        );
        assert_eq!((r.0.waiting(), r.2.in_flight.get()), (MIN_ROOM, shed));
        drop(first);
        for t in tasks {
            assert!(t.await.unwrap());
        }
        assert_eq!(order.lock().unwrap().len(), MIN_ROOM);
    }
}
