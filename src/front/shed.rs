//! Load shedding, the same for every front: a request past the in-flight
//! cap, one whose connection waited past `shed_queue_delay` to be run, and
//! one on a connection kept for probes only is answered `overloaded` at
//! once (and counted by reason), before its message is decided.

use super::metrics::Metrics;
use super::{FrontError, FrontOptions};
use crate::server::Conn;

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
        let before = metrics.in_flight.inc();
        let slot = InFlight { metrics };
        if usize::try_from(before).unwrap_or(usize::MAX) >= max {
            metrics.overloaded("in_flight");
            return Err(FrontError::overloaded(
                "too many requests in flight; retry shortly",
            ));
        }
        Ok(slot)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.metrics.in_flight.dec();
    }
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

/// A request that waited past `shed_queue_delay` to be run is shed. On the
/// wait, not only on how many are in flight: when the CPU is the
/// bottleneck, requests queue in the runtime before any handler counts them
/// (2048 connections on /v1/check: 0 % shed by the in-flight count while
/// p99 reached 173 ms). What is accepted waited less than the bound.
pub(crate) fn waited_too_long(
    o: &FrontOptions,
    metrics: &Metrics,
    conn: Option<&Conn>,
) -> Result<(), FrontError> {
    if conn.is_some_and(|c| c.queue_delay() > o.shed_queue_delay) {
        metrics.overloaded("queue_delay");
        return Err(FrontError::overloaded(
            "the server is saturated; retry shortly",
        ));
    }
    Ok(())
}
