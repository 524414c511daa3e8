//! `freqcap simulate overload` (docs/adaptive.md; issue 29, item 5): a
//! backend of known capacity behind a concurrency limiter, driven by
//! open-loop clients with deadlines, retries and a priority mix, on a virtual
//! clock. Deterministic: one seed, one answer, on any machine.
//!
//! The limiters are freqcap's own code: the adaptive controller
//! ([`crate::limits::adaptive`]) and the priority ceilings
//! ([`crate::limits::priority::scaled`]); the engine adds nothing to a
//! concurrency decision but the lock that makes it exact, which a
//! single-threaded simulation does not need.
//!
//! The plant: `workers` servers, each serving one request at a time for a
//! lognormal time (mean `service_ms`, σ 0.5), behind one FIFO queue. Its
//! capacity is `workers / service` requests a second; it is halved at a
//! third of the run and doubled back at two thirds. A request whose answer
//! has not come by its deadline is a timeout for its client, which reports
//! it `dropped` and frees its slot; the backend still serves it (the work is
//! wasted, as a real server's is unless it checks deadlines).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::path::{Path, PathBuf};

use plotters::prelude::*;
use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};
use serde::Serialize;

use crate::clock::Nanos;
use crate::limits::adaptive::{Adaptive, Algorithm, Controller, Outcome, Sample};
use crate::limits::priority::{Priority, Share, WHOLE, scaled};

use super::SimError;
use super::plots::COLORS;

const MS: Nanos = 1_000_000;
const SEC: Nanos = 1_000_000_000;

/// Options of `freqcap simulate overload`.
#[derive(Debug, Clone, clap::Args)]
pub struct OverloadArgs {
    /// Folder for overload.json, overload.md and the SVG pictures.
    #[arg(long)]
    pub out: PathBuf,
    /// Servers of the backend (its capacity is workers / service time).
    #[arg(long, default_value_t = 20)]
    pub workers: u32,
    /// Mean service time, ms (lognormal, σ 0.5).
    #[arg(long, default_value_t = 10.0)]
    pub service_ms: f64,
    /// Clients' deadline, ms.
    #[arg(long, default_value_t = 100)]
    pub deadline_ms: u64,
    /// Retries of a refused request (each after 10–30 ms, within its deadline).
    #[arg(long, default_value_t = 1)]
    pub retries: u32,
    /// Offered loads, in multiples of the initial capacity.
    #[arg(long, default_value = "0.5,1,2,4,10", value_delimiter = ',')]
    pub loads: Vec<f64>,
    /// Simulated seconds of each run (a third at capacity, a third at half,
    /// a third at capacity again).
    #[arg(long, default_value_t = 90)]
    pub seconds: u64,
    /// Simulated minutes of the drift run (4× overload, capacity steady).
    #[arg(long, default_value_t = 10)]
    pub drift_minutes: u64,
    /// Share of each class in the traffic, critical to sheddable.
    #[arg(long, default_value = "0.05,0.15,0.3,0.2,0.3", value_delimiter = ',')]
    pub mix: Vec<f64>,
    /// Each class's share of the limit, critical to sheddable (as an item's
    /// `priorities`).
    #[arg(long, default_value = "1,0.7,0.65,0.6,0.5", value_delimiter = ',')]
    pub shares: Vec<f64>,
    /// Gradient's latency tolerance over the no-load latency.
    #[arg(long, default_value_t = 1.5)]
    pub tolerance: f64,
    /// Seed of arrivals, classes and service times.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// Which limiter stands in front of the backend.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Limiter {
    None,
    /// A fixed concurrency limit tuned for the initial capacity.
    Static(u64),
    Adaptive(Algorithm),
}

impl Limiter {
    pub fn name(&self) -> String {
        match self {
            Limiter::None => "none".into(),
            Limiter::Static(n) => format!("static {n}"),
            Limiter::Adaptive(a) => a.as_str().into(),
        }
    }
}

/// What one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub limiter: String,
    pub load: f64,
    /// Requests completed within their deadline, per second, over the
    /// capacity the backend had (time-weighted).
    pub goodput: f64,
    /// Latency of the requests the limiter admitted, ms (timeouts at their
    /// real completion).
    pub admitted_p50_ms: f64,
    pub admitted_p99_ms: f64,
    /// Per class, critical to sheddable: requests completed within their
    /// deadline over requests made (a retried request counts once).
    pub availability: [f64; 5],
    /// After the capacity halves: seconds until the limit stays within 20 %
    /// of the optimum at the new capacity ([`optimum`]); `None` if it never
    /// does (or has no limit, or no optimum was given).
    pub recovery_s: Option<f64>,
    /// Where the limit settles at the halved capacity (its mean over the
    /// second half of that phase) over that optimum: above 1, the queue
    /// the limiter keeps.
    pub settled_over_optimum: Option<f64>,
    /// In the second half of each phase: the largest distance of the limit
    /// from its mean there, over the mean.
    pub oscillation: Option<f64>,
    /// The limit, sampled every 100 ms: (seconds, limit).
    #[serde(skip)]
    pub limit_series: Vec<(f64, f64)>,
}

/// The drift run's figures: the limit's mean over the second and the last
/// minute of a long steady overload.
#[derive(Debug, Clone, Serialize)]
pub struct DriftResult {
    pub limiter: String,
    pub early_mean: f64,
    pub late_mean: f64,
    pub goodput: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// A new request from the clients.
    Arrival,
    /// Request `i` tries again.
    Retry(usize),
    /// A worker finished request `i`.
    Done(usize),
    /// Request `i`'s client gives up.
    Deadline(usize),
    /// Sample the limit.
    Tick,
}

struct Request {
    class: usize,
    first: Nanos,
    admitted: Nanos,
    tries: u32,
    /// Holds a limiter slot.
    holding: bool,
    /// Answered (within or past its deadline) or given up on.
    over: bool,
}

/// The plant and its schedule.
struct Plant {
    workers_at: [u32; 3],
    phase_end: [Nanos; 3],
}

impl Plant {
    fn workers(&self, now: Nanos) -> u32 {
        let i = self.phase_end.iter().position(|&e| now < e).unwrap_or(2);
        self.workers_at[i]
    }
}

/// The default adaptive item of the simulation (and of docs/adaptive.md).
pub fn adaptive_item(algorithm: Algorithm, workers: u32, tolerance: f64) -> Adaptive {
    Adaptive {
        initial: u64::from(workers.max(2) / 2),
        min: 2,
        max: u64::from(workers) * 20,
        algorithm,
        tolerance,
        window: 100 * MS,
        min_samples: 10,
        backoff: 0.9,
        baseline_period: 30 * SEC,
        share: crate::limits::priority::WHOLE,
    }
}

fn shares_of(v: &[f64]) -> Result<[Share; 5], SimError> {
    let a = <[f64; 5]>::try_from(v)
        .map_err(|_| SimError(format!("shares: five numbers, got {}", v.len())))?;
    let mut out = [WHOLE; 5];
    for (o, s) in out.iter_mut().zip(a) {
        if !(s > 0.0 && s <= 1.0) {
            return Err(SimError(format!(
                "shares: each above 0 and at most 1, got {s}"
            )));
        }
        *o = (s * f64::from(WHOLE)).round() as Share;
    }
    Ok(out)
}

fn mix_of(v: &[f64]) -> Result<[f64; 5], SimError> {
    let a = <[f64; 5]>::try_from(v)
        .map_err(|_| SimError(format!("mix: five numbers, got {}", v.len())))?;
    let sum: f64 = a.iter().sum();
    if a.iter().any(|x| x.is_nan() || *x < 0.0) || sum.is_nan() || sum <= 0.0 {
        return Err(SimError("mix: non-negative, with a positive sum".into()));
    }
    Ok(a.map(|x| x / sum))
}

/// The optimum concurrency limit of `workers` servers offered `load` ×
/// the initial capacity (`args.workers`), capacity steady: the smallest
/// static limit whose goodput is within 1 % of the best static limit's,
/// swept from `workers / 2` to `4 × workers`. It is not the workers
/// themselves: the classes below critical may use only their shares of a
/// limit, so more than `workers` keeps every server busy (with the default
/// shares and mix, 15 for 10 workers at 4×: docs/adaptive.md).
pub fn optimum(args: &OverloadArgs, workers: u32, load: f64, span: Nanos) -> Result<u64, SimError> {
    let a = OverloadArgs {
        workers,
        ..args.clone()
    };
    // The same offered rate in multiples of the smaller capacity.
    let load = load * f64::from(args.workers) / f64::from(workers.max(1));
    let mut sweep = Vec::new();
    for l in u64::from(workers / 2).max(1)..=u64::from(workers) * 4 {
        sweep.push((
            l,
            run(&a, Limiter::Static(l), load, span, false, None)?.goodput,
        ));
    }
    let best = sweep.iter().map(|x| x.1).fold(0.0, f64::max);
    Ok(sweep
        .iter()
        .find(|x| x.1 >= 0.99 * best)
        .map_or(u64::from(workers), |x| x.0))
}

/// One run: `limiter` at `load` × the initial capacity for `span`, the
/// capacity halved over the middle third when `step` is set; the recovery
/// and settled figures against `optimum`, the optimum at the halved
/// capacity ([`optimum`]).
pub fn run(
    args: &OverloadArgs,
    limiter: Limiter,
    load: f64,
    span: Nanos,
    step: bool,
    optimum: Option<u64>,
) -> Result<RunResult, SimError> {
    let shares = shares_of(&args.shares)?;
    let mix = mix_of(&args.mix)?;
    let positive = |x: f64| x.is_finite() && x > 0.0;
    if args.workers < 2 || !positive(args.service_ms) || !positive(load) {
        return Err(SimError("workers ≥ 2, service_ms > 0 and loads > 0".into()));
    }
    let w = args.workers;
    let plant = Plant {
        workers_at: if step { [w, w / 2, w] } else { [w, w, w] },
        phase_end: [span / 3, 2 * span / 3, span],
    };
    let service_mean = args.service_ms * MS as f64;
    // Lognormal σ = 0.5 with the given mean: μ = ln(mean) − σ²/2.
    let (sigma, mu) = (0.5f64, service_mean.ln() - 0.125);
    let capacity = f64::from(w) / (service_mean / SEC as f64);
    let rate = load * capacity;
    let deadline = args.deadline_ms * MS;
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(args.seed);
    let adaptive = match limiter {
        Limiter::Adaptive(a) => Some(adaptive_item(a, w, args.tolerance)),
        _ => None,
    };
    let mut ctl: Option<Controller> = adaptive.as_ref().map(|a| a.fresh(0));
    let limit_now = |ctl: &Option<Controller>| -> Option<u64> {
        match limiter {
            Limiter::None => None,
            Limiter::Static(n) => Some(n),
            Limiter::Adaptive(_) => match (&adaptive, ctl) {
                (Some(a), Some(c)) => Some(a.limit(c)),
                _ => None,
            },
        }
    };

    let mut heap: BinaryHeap<Reverse<(Nanos, u64, Event)>> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut push = |heap: &mut BinaryHeap<_>, t: Nanos, e: Event| {
        seq += 1;
        heap.push(Reverse((t, seq, e)));
    };
    push(&mut heap, 0, Event::Arrival);
    push(&mut heap, 0, Event::Tick);

    let mut reqs: Vec<Request> = Vec::new();
    let mut queue: VecDeque<usize> = VecDeque::new();
    let mut busy = 0u32;
    let mut inflight = 0u64;
    let mut made = [0u64; 5];
    let mut good = [0u64; 5];
    let mut admitted_lat: Vec<u64> = Vec::new();
    let mut series = Vec::new();

    while let Some(Reverse((now, _, ev))) = heap.pop() {
        if now >= span {
            break;
        }
        match ev {
            Event::Tick => {
                if let Some(l) = limit_now(&ctl) {
                    series.push((now as f64 / SEC as f64, l as f64));
                }
                push(&mut heap, now + 100 * MS, Event::Tick);
            }
            Event::Arrival => {
                let u: f64 = rng.random();
                let mut class = 4;
                let mut acc = 0.0;
                for (i, m) in mix.iter().enumerate() {
                    acc += m;
                    if u < acc {
                        class = i;
                        break;
                    }
                }
                made[class] += 1;
                reqs.push(Request {
                    class,
                    first: now,
                    admitted: 0,
                    tries: 0,
                    holding: false,
                    over: false,
                });
                let i = reqs.len() - 1;
                push(&mut heap, now, Event::Retry(i));
                let gap: f64 = -(1.0 - rng.random::<f64>()).ln() / rate;
                push(&mut heap, now + (gap * SEC as f64) as Nanos, Event::Arrival);
            }
            Event::Retry(i) => {
                let r = &mut reqs[i];
                let ceiling = limit_now(&ctl).map(|l| scaled(l, shares[r.class]));
                if ceiling.is_some_and(|c| inflight >= c) {
                    // Refused: try again later if the deadline allows.
                    r.tries += 1;
                    let back = (10.0 + 20.0 * rng.random::<f64>()) * MS as f64;
                    let at = now + back as Nanos;
                    if r.tries <= args.retries && at < r.first + deadline {
                        push(&mut heap, at, Event::Retry(i));
                    } else {
                        r.over = true;
                    }
                    continue;
                }
                r.holding = true;
                r.admitted = now;
                inflight += 1;
                queue.push_back(i);
                push(&mut heap, r.first + deadline, Event::Deadline(i));
            }
            Event::Done(i) => {
                busy -= 1;
                let r = &mut reqs[i];
                let lat = now - r.admitted;
                admitted_lat.push(lat);
                if !r.over {
                    r.over = true;
                    good[r.class] += 1;
                }
                if r.holding {
                    r.holding = false;
                    if let (Some(a), Some(c)) = (&adaptive, ctl.as_mut()) {
                        let s = Sample {
                            latency: lat,
                            outcome: Outcome::Ok,
                        };
                        a.sample(c, now, s, inflight);
                    }
                    inflight -= 1;
                }
            }
            Event::Deadline(i) => {
                let r = &mut reqs[i];
                if r.over {
                    continue;
                }
                r.over = true;
                if r.holding {
                    r.holding = false;
                    if let (Some(a), Some(c)) = (&adaptive, ctl.as_mut()) {
                        let s = Sample {
                            latency: now - r.admitted,
                            outcome: Outcome::Dropped,
                        };
                        a.sample(c, now, s, inflight);
                    }
                    inflight -= 1;
                }
            }
        }
        // Start what the workers can take.
        while busy < plant.workers(now) {
            let Some(i) = queue.pop_front() else { break };
            busy += 1;
            let z = normal(&mut rng);
            let t = (mu + sigma * z).exp().max(1.0) as Nanos;
            push(&mut heap, now + t, Event::Done(i));
        }
    }

    admitted_lat.sort_unstable();
    let pct = |p: f64| -> f64 {
        if admitted_lat.is_empty() {
            return 0.0;
        }
        let i = ((admitted_lat.len() as f64 - 1.0) * p).round() as usize;
        admitted_lat[i] as f64 / MS as f64
    };
    // Capacity over the run, time-weighted: a phase at half counts half.
    let cap_secs: f64 = (0..3)
        .map(|i| {
            let len = plant.phase_end[i] - if i == 0 { 0 } else { plant.phase_end[i - 1] };
            f64::from(plant.workers_at[i]) / f64::from(w) * len as f64 / SEC as f64
        })
        .sum();
    let goodput = good.iter().sum::<u64>() as f64 / (capacity * cap_secs);
    let availability = std::array::from_fn(|c| {
        if made[c] == 0 {
            1.0
        } else {
            good[c] as f64 / made[c] as f64
        }
    });
    let halved = (plant.phase_end[0], plant.phase_end[1]);
    let settled = settled_mean(&series, halved.0, halved.1);
    let oscillation = settled.map(|_| oscillation_of(&series, &plant.phase_end));
    let optimum = optimum.map(|o| o as f64).filter(|_| step);
    let recovery_s = settled
        .zip(optimum)
        .and_then(|(_, o)| recovery(&series, halved.0, o, halved.1));
    let settled_over_optimum = settled.zip(optimum).map(|(m, o)| m / o);
    Ok(RunResult {
        limiter: limiter.name(),
        load,
        goodput,
        admitted_p50_ms: pct(0.5),
        admitted_p99_ms: pct(0.99),
        availability,
        recovery_s,
        settled_over_optimum,
        oscillation,
        limit_series: series,
    })
}

/// A standard normal draw (Box–Muller).
fn normal(rng: &mut Xoshiro256PlusPlus) -> f64 {
    let u1: f64 = 1.0 - rng.random::<f64>();
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// The limit's mean over the second half of `[from, until)`.
fn settled_mean(series: &[(f64, f64)], from: Nanos, until: Nanos) -> Option<f64> {
    let (a, b) = (from as f64 / SEC as f64, until as f64 / SEC as f64);
    let mid = (a + b) / 2.0;
    let v: Vec<f64> = series
        .iter()
        .filter(|(t, _)| *t >= mid && *t < b)
        .map(|&(_, l)| l)
        .collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// Seconds from `from` until the limit stays within 20 % of `optimum`
/// (until `until`), or `None` if it never settles there.
fn recovery(series: &[(f64, f64)], from: Nanos, optimum: f64, until: Nanos) -> Option<f64> {
    let (from, until) = (from as f64 / SEC as f64, until as f64 / SEC as f64);
    let near = |l: f64| (l - optimum).abs() <= 0.2 * optimum;
    let phase: Vec<&(f64, f64)> = series
        .iter()
        .filter(|(t, _)| *t >= from && *t < until)
        .collect();
    // The first sample from which every later one in the phase is near.
    let mut settled: Option<f64> = None;
    for (t, l) in phase.iter().rev() {
        if near(*l) {
            settled = Some(*t);
        } else {
            break;
        }
    }
    settled.map(|t| t - from)
}

/// The largest relative distance from the mean in the second half of each
/// phase.
fn oscillation_of(series: &[(f64, f64)], ends: &[Nanos; 3]) -> f64 {
    let mut worst = 0.0f64;
    let mut start = 0.0;
    for &e in ends {
        let end = e as f64 / SEC as f64;
        let mid = (start + end) / 2.0;
        let part: Vec<f64> = series
            .iter()
            .filter(|(t, _)| *t >= mid && *t < end)
            .map(|&(_, l)| l)
            .collect();
        if !part.is_empty() {
            let mean = part.iter().sum::<f64>() / part.len() as f64;
            if mean > 0.0 {
                for l in &part {
                    worst = worst.max((l - mean).abs() / mean);
                }
            }
        }
        start = end;
    }
    worst
}

/// The limiters every table compares.
pub fn limiters(workers: u32) -> Vec<Limiter> {
    vec![
        Limiter::None,
        Limiter::Static(u64::from(workers)),
        Limiter::Adaptive(Algorithm::Gradient),
        Limiter::Adaptive(Algorithm::Vegas),
        Limiter::Adaptive(Algorithm::Aimd),
    ]
}

/// The optimum limits of one load, at the initial and the halved capacity.
#[derive(Debug, Clone, Serialize)]
pub struct Optima {
    pub load: f64,
    pub full: u64,
    pub halved: u64,
}

/// Everything the command reports.
#[derive(Debug, Clone, Serialize)]
pub struct OverloadReport {
    pub workers: u32,
    pub capacity_per_s: f64,
    /// p99 latency at 0.5× load with no limit and the capacity steady: the
    /// unloaded p99 the targets compare with.
    pub unloaded_p99_ms: f64,
    /// The optimum limits ([`optimum`]) at each load.
    pub optima: Vec<Optima>,
    pub runs: Vec<RunResult>,
    pub drift: Vec<DriftResult>,
}

/// Runs the table and the drift runs, writes the report into `--out`.
pub fn main(args: &OverloadArgs) -> Result<OverloadReport, SimError> {
    let span = args.seconds.max(3) * SEC;
    let unloaded = run(args, Limiter::None, 0.5, span, false, None)?;
    let mut runs = Vec::new();
    let mut optima = Vec::new();
    for &load in &args.loads {
        // Each third of the run is a steady phase: the optimum of each.
        let o = Optima {
            load,
            full: optimum(args, args.workers, load, span / 3)?,
            halved: optimum(args, args.workers / 2, load, span / 3)?,
        };
        for l in limiters(args.workers) {
            runs.push(run(args, l, load, span, true, Some(o.halved))?);
        }
        optima.push(o);
    }
    let mut drift = Vec::new();
    let long = args.drift_minutes.max(2) * 60 * SEC;
    for l in limiters(args.workers)
        .into_iter()
        .filter(|l| matches!(l, Limiter::Adaptive(_)))
    {
        let r = run(args, l, 4.0, long, false, None)?;
        let mean = |a: f64, b: f64| {
            let v: Vec<f64> = r
                .limit_series
                .iter()
                .filter(|(t, _)| *t >= a && *t < b)
                .map(|&(_, l)| l)
                .collect();
            v.iter().sum::<f64>() / v.len().max(1) as f64
        };
        let end = long as f64 / SEC as f64;
        drift.push(DriftResult {
            limiter: r.limiter.clone(),
            early_mean: mean(60.0, 120.0),
            late_mean: mean(end - 60.0, end),
            goodput: r.goodput,
        });
    }
    let capacity = f64::from(args.workers) / (args.service_ms / 1000.0);
    let report = OverloadReport {
        workers: args.workers,
        capacity_per_s: capacity,
        unloaded_p99_ms: unloaded.admitted_p99_ms,
        optima,
        runs,
        drift,
    };
    write(args, &report)?;
    Ok(report)
}

fn write(args: &OverloadArgs, r: &OverloadReport) -> Result<(), SimError> {
    let io = |p: &Path| {
        let p = p.display().to_string();
        move |e: std::io::Error| SimError(format!("cannot write {p}: {e}"))
    };
    std::fs::create_dir_all(&args.out).map_err(io(&args.out))?;
    let json = serde_json::to_string_pretty(r).map_err(|e| SimError(e.to_string()))?;
    let jp = args.out.join("overload.json");
    std::fs::write(&jp, json).map_err(io(&jp))?;
    let mp = args.out.join("overload.md");
    std::fs::write(&mp, markdown(args, r)).map_err(io(&mp))?;
    for &load in &args.loads {
        let picked: Vec<&RunResult> = r.runs.iter().filter(|x| x.load == load).collect();
        let sp = args.out.join(format!("limit-{load}x.svg"));
        if let Some(o) = r.optima.iter().find(|o| o.load == load) {
            plot(&sp, o, &picked)?;
        }
    }
    Ok(())
}

/// The table of docs/adaptive.md.
pub fn markdown(args: &OverloadArgs, r: &OverloadReport) -> String {
    let mut s = format!(
        "Backend: {} workers, {} ms mean service (capacity {:.0}/s), deadline {} ms, {} retry; \
         capacity halved over the middle third of {} s; seed {}. Unloaded p99 \
         (0.5×, no limit, capacity steady): {:.1} ms.\n\n\
         Optimum limits (the smallest static limit within 1 % of the best static goodput, \
         each capacity steady), full / halved capacity: {}.\n\n\
         | load | limiter | goodput / C | admitted p50 ms | admitted p99 ms | critical | high | default | low | sheddable | to optimum in s | settled / optimum | oscillation |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        args.workers,
        args.service_ms,
        r.capacity_per_s,
        args.deadline_ms,
        args.retries,
        args.seconds,
        args.seed,
        r.unloaded_p99_ms,
        r.optima
            .iter()
            .map(|o| format!("{}× {} / {}", o.load, o.full, o.halved))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let pc = |x: f64| format!("{:.1} %", x * 100.0);
    for x in &r.runs {
        s.push_str(&format!(
            "| {}× | {} | {} | {:.1} | {:.1} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            x.load,
            x.limiter,
            pc(x.goodput),
            x.admitted_p50_ms,
            x.admitted_p99_ms,
            pc(x.availability[0]),
            pc(x.availability[1]),
            pc(x.availability[2]),
            pc(x.availability[3]),
            pc(x.availability[4]),
            x.recovery_s.map_or("—".into(), |v| format!("{v:.1}")),
            x.settled_over_optimum
                .map_or("—".into(), |v| format!("{v:.2}")),
            x.oscillation
                .map_or("—".into(), |v| format!("±{:.0} %", v * 100.0)),
        ));
    }
    s.push_str(&format!(
        "\nDrift: {} simulated minutes at 4×, capacity steady.\n\n\
         | limiter | limit, 2nd minute | limit, last minute | goodput / C |\n|---|---|---|---|\n",
        args.drift_minutes
    ));
    for d in &r.drift {
        s.push_str(&format!(
            "| {} | {:.1} | {:.1} | {} |\n",
            d.limiter,
            d.early_mean,
            d.late_mean,
            pc(d.goodput)
        ));
    }
    s
}

/// The limit over time of each limiter at one load, with the optimum.
fn plot(path: &Path, o: &Optima, runs: &[&RunResult]) -> Result<(), SimError> {
    let load = o.load;
    let (full, halved) = (o.full as f64, o.halved as f64);
    let fail = |e: &dyn std::fmt::Display| SimError(format!("cannot draw {}: {e}", path.display()));
    let span = runs
        .iter()
        .flat_map(|r| r.limit_series.last().map(|x| x.0))
        .fold(1.0f64, f64::max);
    let y_max = runs
        .iter()
        .flat_map(|r| r.limit_series.iter().map(|x| x.1))
        .fold(full * 1.5, f64::max)
        * 1.1;
    let root = SVGBackend::new(path, (960, 440)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "Concurrency limit at {load}× offered load (capacity halved in the middle third)"
            ),
            ("sans-serif", 17),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..span, 0f64..y_max)
        .map_err(|e| fail(&e))?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("limit")
        .max_light_lines(1)
        .draw()
        .map_err(|e| fail(&e))?;
    let third = span / 3.0;
    let opt = [
        (0.0, full),
        (third, full),
        (third, halved),
        (2.0 * third, halved),
        (2.0 * third, full),
        (span, full),
    ];
    chart
        .draw_series(LineSeries::new(opt, BLACK.stroke_width(1)))
        .map_err(|e| fail(&e))?
        .label("optimum")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], BLACK));
    for (i, r) in runs.iter().enumerate() {
        if r.limit_series.is_empty() {
            continue;
        }
        let c = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(
                r.limit_series.iter().copied(),
                c.stroke_width(2),
            ))
            .map_err(|e| fail(&e))?
            .label(r.limiter.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], c.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| fail(&e))?;
    root.present().map_err(|e| fail(&e))
}

/// The classes, highest first, for labels.
pub fn class_names() -> [&'static str; 5] {
    Priority::ALL.map(Priority::as_str)
}
