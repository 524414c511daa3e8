//! The CPU guard of load shedding (docs/service.md, "Shedding"): how busy
//! this process's CPUs are, read from `getrusage` at most every
//! [`SAMPLE_EVERY`] by whichever request asks, no thread of its own.
//!
//! Why CPU and not only queueing: the queue delay a request sees is
//! measured when its connection's task runs, so under CPU saturation a
//! request may be read before the queue shows; the CPU says the server is
//! out of room first. Only the lowest classes are shed by it (`low`,
//! `sheddable`): a saturated server keeps serving `default` and higher
//! traffic from what it has.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// How often the CPU is read: one `getrusage` every 10 ms at most, a
/// window long enough to average a scheduler's quantum (4 ms on Linux).
pub const SAMPLE_EVERY: Duration = Duration::from_millis(10);

/// The process's CPU use over its last sample window.
pub struct CpuGuard {
    /// Since [`CpuGuard::new`]: when the window started (µs) and the CPU
    /// time used by then (µs).
    window_start_us: AtomicU64,
    cpu_at_start_us: AtomicU64,
    /// The last window's use, in thousandths of the CPUs this process may
    /// run on (1000: all busy).
    busy_permille: AtomicU64,
    epoch: Instant,
    cpus: u64,
}

impl Default for CpuGuard {
    fn default() -> Self {
        CpuGuard::new()
    }
}

impl CpuGuard {
    pub fn new() -> CpuGuard {
        // The CPUs this process may run on (its affinity mask: a server
        // pinned to one core with taskset has one).
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
        CpuGuard {
            window_start_us: AtomicU64::new(0),
            cpu_at_start_us: AtomicU64::new(cpu_time_us()),
            busy_permille: AtomicU64::new(0),
            epoch: Instant::now(),
            cpus,
        }
    }

    /// The last window's use, 0–1000, reading the CPU again if the window
    /// is [`SAMPLE_EVERY`] old. Two requests may both read it at a window's
    /// end; one of them wins the window, and the figure is the same.
    pub fn busy_permille(&self) -> u64 {
        let now = u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX);
        let start = self.window_start_us.load(Relaxed);
        let every = SAMPLE_EVERY.as_micros() as u64;
        if now.saturating_sub(start) >= every
            && self
                .window_start_us
                .compare_exchange(start, now, Relaxed, Relaxed)
                .is_ok()
        {
            let cpu = cpu_time_us();
            let before = self.cpu_at_start_us.swap(cpu, Relaxed);
            let wall = now.saturating_sub(start).max(1).saturating_mul(self.cpus);
            let used = cpu.saturating_sub(before).saturating_mul(1000);
            self.busy_permille.store((used / wall).min(1000), Relaxed);
        }
        self.busy_permille.load(Relaxed)
    }
}

/// User and system CPU time of this process, µs (0 if it cannot be read:
/// the guard then never sheds).
fn cpu_time_us() -> u64 {
    // SAFETY: getrusage writes the struct it is given and nothing else; a
    // zeroed rusage is a valid value of it.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF is a valid `who`.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0;
    }
    let us = |t: libc::timeval| {
        u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000 + u64::try_from(t.tv_usec).unwrap_or(0)
    };
    us(u.ru_utime) + us(u.ru_stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread spinning on every CPU the process may use reads as busy.
    /// (Not "idle reads idle": other tests run in this process meanwhile.)
    #[test]
    fn spinning_reads_busy() {
        let g = CpuGuard::new();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let spinners: Vec<_> = (0..g.cpus)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut x = 0u64;
                    while !stop.load(Relaxed) {
                        x = std::hint::black_box(x.wrapping_add(1));
                    }
                })
            })
            .collect();
        // Windows of 10 ms, read for up to 2 s: busy once one full window
        // has passed with every CPU spinning (half of them at least, on a
        // machine other processes share).
        let mut busiest = 0;
        for _ in 0..200 {
            std::thread::sleep(SAMPLE_EVERY);
            busiest = busiest.max(g.busy_permille());
            if busiest >= 500 {
                break;
            }
        }
        stop.store(true, Relaxed);
        for s in spinners {
            s.join().unwrap();
        }
        assert!(busiest >= 500, "spinning read {busiest}");
    }
}
