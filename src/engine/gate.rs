//! One decision at a time per record on a shared store, with no lock held
//! across a Redis call (docs/cluster.md, "Faults").
//!
//! A shared record is decided on a copy taken from the hot tier and written
//! by compare-and-set; the hot tier's shard lock is held only to take the
//! copy and to put the result back. Two decisions on the same record on this
//! node would then both decide on one version, and the second would lose its
//! write and decide again, so decisions on one record still go one at a time,
//! through its gate. A gate is per record: a user whose primary is slow (or
//! paused) keeps only that user's requests waiting. Before, the hot-shard
//! lock was held across the Redis call, so one slow primary stalled every
//! user of the 1/64 of users sharing each of its users' shards.

use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Duration;

/// Stripes of gates: waiters wake only for their stripe's records.
const STRIPES: usize = 256;

/// The longest a decision waits for the one ahead of it on its record. A
/// decision's Redis calls each have a deadline (the store's call timeout,
/// 100 ms by default, times a few tries), so this is only a backstop; past
/// it, the decision goes ahead and the compare-and-set keeps it correct.
const MAX_WAIT: Duration = Duration::from_secs(5);

/// One stripe: the records of it being decided, and their waiters.
type Stripe = (Mutex<Vec<[u64; 2]>>, Condvar);

/// The records being decided now, by stripe.
pub(crate) struct Gates {
    stripes: Box<[Stripe]>,
}

impl Default for Gates {
    fn default() -> Self {
        Gates {
            stripes: (0..STRIPES)
                .map(|_| (Mutex::new(Vec::new()), Condvar::new()))
                .collect(),
        }
    }
}

/// A decision's turn on its record, given up on drop.
pub(crate) struct Turn<'a> {
    gates: &'a Gates,
    key: [u64; 2],
}

impl Gates {
    /// Waits until no other decision on record `key` is under way (at most
    /// [`MAX_WAIT`]), then takes the turn.
    pub(crate) fn enter(&self, key: [u64; 2]) -> Turn<'_> {
        let (lock, cond) = &self.stripes[stripe(key)];
        let mut busy = lock.lock().unwrap_or_else(PoisonError::into_inner);
        let started = std::time::Instant::now();
        while busy.contains(&key) {
            let left = MAX_WAIT.saturating_sub(started.elapsed());
            if left.is_zero() {
                break;
            }
            busy = cond
                .wait_timeout(busy, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        busy.push(key);
        Turn { gates: self, key }
    }
}

impl Gates {
    /// The turn on record `key` if no other decision on it is under way;
    /// `None` otherwise (a caller on the executor must not wait for one
    /// that is calling Redis).
    pub(crate) fn try_enter(&self, key: [u64; 2]) -> Option<Turn<'_>> {
        let (lock, _) = &self.stripes[stripe(key)];
        let mut busy = lock.lock().unwrap_or_else(PoisonError::into_inner);
        if busy.contains(&key) {
            return None;
        }
        busy.push(key);
        Some(Turn { gates: self, key })
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let (lock, cond) = &self.gates.stripes[stripe(self.key)];
        let mut busy = lock.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(i) = busy.iter().position(|k| *k == self.key) {
            busy.swap_remove(i);
        }
        drop(busy);
        cond.notify_all();
    }
}

fn stripe(key: [u64; 2]) -> usize {
    (key[0] ^ key[1].rotate_left(17)) as usize % STRIPES
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn one_turn_at_a_time_per_record_and_none_across_records() {
        let gates = Arc::new(Gates::default());
        let inside = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (gates, inside, most) = (gates.clone(), inside.clone(), most.clone());
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        let _turn = gates.enter([7, 7]);
                        let n = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(n, Ordering::SeqCst);
                        std::thread::yield_now();
                        inside.fetch_sub(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(
            most.load(Ordering::SeqCst),
            1,
            "one at a time on one record"
        );
        // Another record's turn is not held up by a record in use.
        let _a = gates.enter([1, 2]);
        let _b = gates.enter([3, 4]);
        let _c = gates.enter([1, 3]);
    }
}
