//! The bytes of request bodies being received, across every front and
//! connection (docs/service.md, "Memory"): what bounds the memory clients can
//! make the server hold *before* a request is decided.
//!
//! Each front charges the bytes it has actually received, chunk by chunk, and
//! gives them back when the body is decided or dropped. A declared length is
//! never charged: a gRPC client that declared 1 MiB messages on 256 streams
//! and sent 1 byte each made tonic reserve the declared length, 300 MB from
//! one 6 KB connection (../shared security probe, case 1.20). Past the budget
//! a request is refused at once (`overloaded`, reason `body_memory`): the
//! server sheds, it does not grow.

use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use axum::http::HeaderMap;

use super::FrontError;

/// The budget: bytes of bodies being received at once.
#[derive(Clone, Debug)]
pub struct BodyBudget {
    bytes: Arc<Semaphore>,
    total: usize,
    /// `freqcap_overloaded_total{reason="body_memory"}`.
    refused: Counter,
}

impl BodyBudget {
    /// A budget of `total` bytes (at least one body of `max_body` fits:
    /// the caller ensures it); each refusal counts in `refused`.
    pub fn new(total: usize, refused: Counter) -> Self {
        // tokio's semaphore holds at most usize::MAX >> 3 permits.
        let total = total.clamp(1, Semaphore::MAX_PERMITS);
        BodyBudget {
            bytes: Arc::new(Semaphore::new(total)),
            total,
            refused,
        }
    }

    /// The budget's size, bytes.
    pub fn total(&self) -> usize {
        self.total
    }

    /// Bytes charged now.
    pub fn in_use(&self) -> usize {
        self.total - self.bytes.available_permits()
    }

    /// An empty charge, grown as bytes arrive.
    pub fn charge(&self) -> Charge {
        Charge {
            budget: self.clone(),
            held: None,
            bytes: 0,
        }
    }
}

/// The bytes one body holds under the budget, given back when dropped.
#[derive(Debug)]
pub struct Charge {
    budget: BodyBudget,
    held: Option<OwnedSemaphorePermit>,
    bytes: usize,
}

impl Charge {
    /// Charges `n` more bytes; `Err` (503 `overloaded`, counted as
    /// `body_memory`) when the budget has no room for them.
    pub fn add(&mut self, n: usize) -> Result<(), FrontError> {
        if n == 0 {
            return Ok(());
        }
        let permit = u32::try_from(n)
            .ok()
            .and_then(|n| self.budget.bytes.clone().try_acquire_many_owned(n).ok());
        let Some(permit) = permit else {
            self.budget.refused.inc();
            return Err(FrontError::overloaded(format!(
                "request bodies being received use the server's body memory ({} bytes); retry shortly",
                self.budget.total
            )));
        };
        match &mut self.held {
            Some(held) => held.merge(permit),
            None => self.held = Some(permit),
        }
        self.bytes += n;
        Ok(())
    }

    /// Gives back `n` of the bytes charged (a message handed on whole, whose
    /// stream goes on).
    pub fn release(&mut self, n: usize) {
        let n = n.min(self.bytes);
        if let Some(held) = &mut self.held {
            drop(held.split(n));
        }
        self.bytes -= n;
    }

    /// Bytes charged.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// What a request holds in memory before its body is in, charged to the
/// body memory budget with its body: the stream's own state and its head.
/// The head counts as HTTP/2 counts a header list (each field's name and
/// value plus 32): it may be 64 KiB, and HPACK lets a client send it in a
/// few bytes. The state is [`REQUEST_STATE`].
pub(crate) fn head_bytes(headers: &HeaderMap) -> usize {
    REQUEST_STATE
        + headers
            .iter()
            .map(|(k, v)| k.as_str().len() + v.len() + 32)
            .sum::<usize>()
}

/// A request's state while it waits for its body (hyper's stream, the
/// router's future), rounded up: 20 HTTP/2 connections × 256 streams that
/// sent a head and no body grew the server's RSS by 39.6 MB, 7.7 KB a
/// stream (`tests/hostile/h2probe.py hold-headers`).
const REQUEST_STATE: usize = 8 * 1024;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_are_bounded_and_given_back() {
        let refused = Counter::default();
        let budget = BodyBudget::new(100, refused.clone());
        let mut a = budget.charge();
        a.add(60).unwrap();
        let mut b = budget.charge();
        assert!(b.add(50).is_err(), "60 + 50 is over 100");
        b.add(40).unwrap();
        assert_eq!(budget.in_use(), 100);
        drop(a);
        assert_eq!(budget.in_use(), 40);
        b.add(60).unwrap();
        assert_eq!(b.bytes(), 100);
        b.release(30);
        assert_eq!(budget.in_use(), 70);
        drop(b);
        assert_eq!(budget.in_use(), 0);
        assert_eq!(refused.get(), 1);
    }
}
