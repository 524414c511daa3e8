//! Waiting for an in-flight slot, with adaptive LIFO (docs/service.md,
//! "Adaptive LIFO").
//!
//! A decision past `max_in_flight` (or past its class's share of it,
//! [`super::shed`]) does not get 503 at once: it waits in this room for a
//! slot, at most what is left of its queue bound after the wait its
//! connection already had, and is shed when that runs out. Each slot given
//! back goes to one waiter: the highest class first, and within a class
//! the oldest while the room drains now and then (FIFO), the *newest*
//! while it stands (CoDel on the room's own waits, [`Codel`]). That is
//! adaptive LIFO as Facebook's "Fail at Scale" describes it: in a standing
//! queue the oldest waiters are the ones whose callers are likeliest to
//! have given up, so serving the newest first keeps the answers that are
//! still wanted fast, and the old ones are shed at the (then shorter)
//! bound. Under no contention the room is not touched: one atomic load.
//!
//! A slot is never handed over: the one given back is counted down, and
//! the woken waiter takes a slot as any request does. A waiter that loses
//! the race to an arrival waits again at the head of its class; one that is
//! woken but gone (its caller went away), or run only after its bound, passes
//! the wake on.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::shed::INTERVAL;
use crate::engine::Priority;

/// CoDel's standing-queue test (Nichols and Jacobson): a queue in which
/// every request for longer than [`INTERVAL`] waited past the target is
/// standing; one that waited under it drained the queue.
pub(crate) struct Codel {
    epoch: Instant,
    /// When the current run of waits over the target began, µs since
    /// `epoch`; [`NO_RUN`] when the last wait was under it. A run, not
    /// "when the queue last drained": an idle server has no queue, and its
    /// first slow request must not read as a standing one.
    above_since_us: AtomicU64,
}

const NO_RUN: u64 = u64::MAX;

impl Default for Codel {
    fn default() -> Self {
        Codel {
            epoch: Instant::now(),
            above_since_us: AtomicU64::new(NO_RUN),
        }
    }
}

impl Codel {
    fn now_us(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// Notes a wait of `delay` against the `target`; whether the queue is
    /// standing.
    pub(crate) fn standing(&self, delay: Duration, target: Duration) -> bool {
        if delay < target {
            self.above_since_us.store(NO_RUN, Relaxed);
            return false;
        }
        let now = self.now_us();
        // The first wait over the target starts the run (a racing one may
        // have started it a moment earlier: either start will do).
        let since = match self
            .above_since_us
            .compare_exchange(NO_RUN, now, Relaxed, Relaxed)
        {
            Ok(_) => now,
            Err(started) => started,
        };
        now.saturating_sub(since) > INTERVAL.as_micros() as u64
    }

    /// Whether the queue stands, by what was noted last (notes nothing).
    pub(crate) fn is_standing(&self) -> bool {
        let since = self.above_since_us.load(Relaxed);
        since != NO_RUN && self.now_us().saturating_sub(since) > INTERVAL.as_micros() as u64
    }
}

struct Waiter {
    id: u64,
    wake: oneshot::Sender<()>,
}

#[derive(Default)]
struct Queues {
    /// By class, highest first ([`Priority::ALL`]'s order).
    by_class: [VecDeque<Waiter>; 5],
    next_id: u64,
}

/// The waiting room, one for every front.
#[derive(Default)]
pub struct Room {
    queues: Mutex<Queues>,
    /// How many wait: read without the lock on every slot given back.
    waiting: AtomicUsize,
    /// Standing or draining, by the waits of the requests it let go.
    pub(crate) codel: Codel,
}

fn class_index(class: Priority) -> usize {
    Priority::ALL.iter().position(|&p| p == class).unwrap_or(2)
}

impl Room {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queues> {
        self.queues.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many requests wait for a slot.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Relaxed)
    }

    /// Queues a waiter of `class`: at the back, or at the front when it
    /// waited already and lost its slot to a racing arrival.
    fn push(&self, class: Priority, front: bool) -> (u64, oneshot::Receiver<()>) {
        let (tx, rx) = oneshot::channel();
        let mut q = self.lock();
        let id = q.next_id;
        q.next_id += 1;
        let w = Waiter { id, wake: tx };
        let lane = &mut q.by_class[class_index(class)];
        if front {
            lane.push_front(w);
        } else {
            lane.push_back(w);
        }
        self.waiting.fetch_add(1, Relaxed);
        (id, rx)
    }

    /// Takes waiter `id` out of the queue; false if it was woken already.
    fn remove(&self, class: Priority, id: u64) -> bool {
        let mut q = self.lock();
        let lane = &mut q.by_class[class_index(class)];
        match lane.iter().position(|w| w.id == id) {
            Some(i) => {
                lane.remove(i);
                self.waiting.fetch_sub(1, Relaxed);
                true
            }
            None => false,
        }
    }

    /// A slot was given back: wakes one waiter that may take it, the
    /// highest class first (`fits` says whether a class's share has room),
    /// the oldest of its class or, while the room stands, the newest.
    pub(crate) fn wake(&self, fits: impl Fn(Priority) -> bool) {
        if self.waiting.load(Relaxed) == 0 {
            return;
        }
        let lifo = self.codel.is_standing();
        let mut q = self.lock();
        for (i, class) in Priority::ALL.into_iter().enumerate() {
            if !fits(class) {
                continue;
            }
            let lane = &mut q.by_class[i];
            while let Some(w) = if lifo {
                lane.pop_back()
            } else {
                lane.pop_front()
            } {
                self.waiting.fetch_sub(1, Relaxed);
                // A waiter whose caller went away does not take the wake.
                if w.wake.send(()).is_ok() {
                    return;
                }
            }
        }
    }
}

/// How a wait for a slot ended.
pub(crate) enum Waited {
    /// Woken for a slot: try to take it.
    Woken,
    /// The bound ran out first.
    TimedOut,
}

/// One request waiting in the room: takes itself out when its wait ends
/// without a wake, or passes the wake on when it was woken but is dropped
/// before it took the slot (its caller went away).
pub(crate) struct Waiting<'a> {
    room: &'a Room,
    class: Priority,
    id: u64,
    rx: oneshot::Receiver<()>,
    since: Instant,
    woken: bool,
    fits: &'a (dyn Fn(Priority) -> bool + Sync),
}

impl<'a> Waiting<'a> {
    pub(crate) fn join(
        room: &'a Room,
        class: Priority,
        fits: &'a (dyn Fn(Priority) -> bool + Sync),
    ) -> Self {
        let (id, rx) = room.push(class, false);
        Waiting {
            room,
            class,
            id,
            rx,
            since: Instant::now(),
            woken: false,
            fits,
        }
    }

    /// How long it has waited.
    pub(crate) fn waited(&self) -> Duration {
        self.since.elapsed()
    }

    /// Waits until woken or `deadline`.
    pub(crate) async fn wait(&mut self, deadline: tokio::time::Instant) -> Waited {
        match tokio::time::timeout_at(deadline, &mut self.rx).await {
            Ok(Ok(())) => {
                self.woken = true;
                Waited::Woken
            }
            // The sender is only dropped unsent when the room is.
            Ok(Err(_)) => Waited::TimedOut,
            Err(_) => {
                if self.room.remove(self.class, self.id) {
                    Waited::TimedOut
                } else {
                    // Woken as the bound ran out: the wake is ours.
                    self.woken = self.rx.try_recv().is_ok();
                    if self.woken {
                        Waited::Woken
                    } else {
                        Waited::TimedOut
                    }
                }
            }
        }
    }

    /// Woken, but the slot went to a racing arrival: waits again at the
    /// head of its class.
    pub(crate) fn requeue(&mut self) {
        let (id, rx) = self.room.push(self.class, true);
        self.id = id;
        self.rx = rx;
        self.woken = false;
    }

    /// The wait is over and the slot taken (or the request shed): nothing
    /// to pass on.
    pub(crate) fn done(mut self) {
        self.woken = false;
        self.id = u64::MAX;
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.id == u64::MAX {
            return;
        }
        if self.woken || !self.room.remove(self.class, self.id) {
            // Woken (now or a moment ago) but not taking the slot: the next
            // waiter may.
            self.room.wake(self.fits);
        }
    }
}
