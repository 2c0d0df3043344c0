//! [`bench_crossings`]: what one crossing of the boundary costs, next to the hardware floor and
//! the alternatives (an OS channel, a pipe: stand-ins for a call across the boundary).
//!
//! # Method
//!
//! Every latency case is a ping-pong between two threads pinned to two different cores: thread
//! A sends, thread B answers through the opposite direction, A times the round trip. One-way
//! crossing = (round trip − timer overhead) / 2. Timing uses the TSC (`rdtsc` between two
//! `lfence`s, so the read can neither start before the answer is seen nor be hoisted out of the
//! spin loop by speculation; an unfenced `rdtsc` under-reported the single-line floor as ~28
//! cycles on this VM). The timer overhead (median of back-to-back reads, ~40 cycles here) is
//! subtracted. On other architectures the unit is nanoseconds from the monotonic clock.
//!
//! The cases run interleaved, `rounds` times each, so drift of the host (this is a VM) hits
//! them alike; every round spawns fresh threads and fresh channels and starts with `warmup`
//! unrecorded round trips.
//!
//! | case | what crosses |
//! | --- | --- |
//! | `ring` | a [`Boundary`] exactly as the pipeline uses it: the core [`push`](CoreSide::push)es a 256-byte `Arc<[u8]>` record, the host [`wait_pop`](HostSide::wait_pop)s it and pushes it back through the other ring. The same `Arc` goes round (no allocation, no refcount traffic). |
//! | `ring_unpaired` | the same through two separate rings ([`ring::ring`](crate::ring::ring) twice): the layout without a record and its answer sharing a line, for comparison. |
//! | `floor` | two threads exchanging a counter through one cache-padded `AtomicU64` (Release store, Acquire spin): one cache-line transfer per crossing, the hardware floor. |
//! | `floor_two_line` | the same, with one padded atomic per direction (the answer goes through a different line than the request): roughly what two rings with separate slot arrays pay, and what the boundary's paired layout avoids (see [`ring`](crate::ring)). |
//! | `rtrb` | two `rtrb` rings (the crate DESIGN.md first picked), same record, spinning `pop`. |
//! | `mpsc` | two `std::sync::mpsc` channels, blocking `recv`. |
//! | `pipe` | two OS pipes, `write` and `read` of 8 bytes each way (a system call per crossing). |
//!
//! Streaming: the core pushes `stream_items` records ([`CoreSide::push_blocking`]) while the host
//! drains them with [`HostSide::pop_batch`] (one `spin_loop` when it finds the ring empty); the
//! records are cloned before the clock starts and collected afterwards, so the rate is the ring's
//! alone. `rtrb` is streamed the same way for comparison.
//!
//! For scale: the PSL paper's ring measured 461 (app → enclave) and 526 (enclave → app) cycles a
//! crossing, against 8,600–20,500 for SGX SDK ecalls/ocalls.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Barrier};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::boundary::{Boundary, CoreSide, HostSide};
use crate::padded::CachePadded;
use crate::ring::ring;
use crate::SealedRecord;

/// How long a benchmark thread waits for its peer before declaring it stuck.
const STALL: Duration = Duration::from_secs(30);

/// What [`bench_crossings`] runs.
#[derive(Debug, Clone, Serialize)]
pub struct CrossingConfig {
    /// Recorded round trips per latency case, split over `rounds`.
    pub round_trips: usize,
    /// Unrecorded round trips at the start of every round of every case.
    pub warmup: usize,
    /// How many times the cases run, interleaved.
    pub rounds: usize,
    /// Size of the record that crosses (`ring`, `rtrb`, `mpsc`, streaming).
    pub record_bytes: usize,
    /// Capacity of each ring.
    pub ring_capacity: usize,
    /// Records per streaming run (one run per round; the median run is reported).
    pub stream_items: usize,
    /// The most records the streaming consumer takes per `pop_batch`.
    pub stream_batch: usize,
    /// Include the `mpsc` and `pipe` cases (tens of µs a round trip).
    pub os_cases: bool,
    /// Pin the two threads to two different cores (when there are two).
    pub pin: bool,
}

impl Default for CrossingConfig {
    fn default() -> Self {
        CrossingConfig {
            round_trips: 20_000,
            warmup: 2_000,
            rounds: 3,
            record_bytes: 256,
            ring_capacity: 1024,
            stream_items: 2_000_000,
            stream_batch: 256,
            os_cases: true,
            pin: true,
        }
    }
}

/// One latency case: one-way crossing, in [`CrossingReport::unit`]s.
#[derive(Debug, Clone, Serialize)]
pub struct CaseReport {
    /// `ring`, `ring_unpaired`, `floor`, `floor_two_line`, `rtrb`, `mpsc` or `pipe`.
    pub name: &'static str,
    /// Recorded round trips.
    pub samples: usize,
    /// 10th percentile.
    pub p10: f64,
    /// Median.
    pub median: f64,
    /// 90th percentile.
    pub p90: f64,
    /// The median in nanoseconds (from the TSC frequency estimate), when known.
    pub median_ns: Option<f64>,
}

/// What [`bench_crossings`] measured. Latencies are one-way crossings in `unit`s (TSC cycles on
/// x86-64, else nanoseconds); `0.0` for a case that did not run.
#[derive(Debug, Clone, Serialize)]
pub struct CrossingReport {
    /// `"tsc_cycles"` or `"ns"`.
    pub unit: &'static str,
    /// Measured TSC frequency (x86-64 only).
    pub tsc_ghz: Option<f64>,
    /// True if both threads of every case ran pinned to two different cores.
    pub pinned: bool,
    /// The two cores used, when pinned.
    pub cores: Vec<usize>,
    /// Cores the benchmark could use (the calling thread's affinity mask).
    pub cores_available: usize,
    /// Share of CPU time that was idle in the 200 ms before the run (Linux only). Well below
    /// 100 means other processes were running: the latency medians usually survive that (the
    /// benchmark threads spin on their pinned cores), the streaming rates do not.
    pub cpu_idle_before_pct: Option<f64>,
    /// Median cost of reading the timer twice, subtracted from every round trip.
    pub timer_overhead: f64,
    /// The [`Boundary`] rings, as the pipeline uses them.
    pub ring_cycles_median: f64,
    /// 10th percentile of `ring`.
    pub ring_cycles_p10: f64,
    /// 90th percentile of `ring`.
    pub ring_cycles_p90: f64,
    /// Two separate rings (no shared line between a record and its answer).
    pub ring_unpaired_cycles_median: f64,
    /// One cache line, both directions: the hardware floor.
    pub floor_cycles_median: f64,
    /// 10th percentile of `floor`.
    pub floor_cycles_p10: f64,
    /// 90th percentile of `floor`.
    pub floor_cycles_p90: f64,
    /// One cache line per direction (what unpaired rings pay; for comparison).
    pub floor_two_line_cycles_median: f64,
    /// Two `rtrb` rings.
    pub rtrb_cycles_median: f64,
    /// Two `std::sync::mpsc` channels.
    pub mpsc_cycles_median: f64,
    /// Two OS pipes.
    pub pipe_cycles_median: f64,
    /// `ring_cycles_median / floor_cycles_median` (the project's goal: at most 1.25).
    pub ring_over_floor: f64,
    /// `ring_cycles_median / floor_two_line_cycles_median`.
    pub ring_over_two_line_floor: f64,
    /// `rtrb_cycles_median / floor_cycles_median`.
    pub rtrb_over_floor: f64,
    /// Records per second through one Boundary ring (median run).
    pub ring_stream_items_per_s: f64,
    /// Push calls that found the ring full during that run (backpressure at work).
    pub ring_stream_full_events: u64,
    /// Records per second through one `rtrb` ring, same harness.
    pub rtrb_stream_items_per_s: f64,
    /// Every latency case in full.
    pub cases: Vec<CaseReport>,
    /// The configuration used.
    pub config: CrossingConfig,
    /// How the run went: pinning, skipped cases.
    pub notes: Vec<String>,
}

/// The top-level keys of a serialized [`CrossingReport`] that benchmarks quote.
pub const HEADLINE_KEYS: [&str; 8] = [
    "ring_cycles_median",
    "floor_cycles_median",
    "mpsc_cycles_median",
    "pipe_cycles_median",
    "ring_stream_items_per_s",
    "ring_over_floor",
    "pinned",
    "tsc_ghz",
];

/// Runs the crossing benchmark; see the [module docs](self). Takes about
/// `rounds × (5 fast cases + 2 OS cases) × (round_trips / rounds + warmup)` round trips: a few
/// seconds with the defaults, dominated by the `mpsc` and `pipe` cases.
///
/// # Panics
/// If a benchmark thread panics or its peer stops answering for 30 s.
pub fn bench_crossings(cfg: CrossingConfig) -> CrossingReport {
    let mut notes = Vec::new();

    let cpu_idle_before_pct = cpu_idle_pct(Duration::from_millis(200));
    if let Some(idle) = cpu_idle_before_pct.filter(|&idle| idle < 90.0) {
        notes.push(format!("only {idle:.0}% of the CPU was idle before the run: other load may skew the numbers"));
    }

    // `get_core_ids` reads the *calling* thread's mask: read it once, before anything is pinned.
    let available = core_affinity::get_core_ids().unwrap_or_default();
    let pins = choose_pins(cfg.pin, &available, &mut notes);
    let env = Env {
        pins,
        pin_failed: AtomicBool::new(false),
        warmup: cfg.warmup,
        record: Arc::from(vec![0x5a_u8; cfg.record_bytes]),
        capacity: cfg.ring_capacity.max(1),
    };

    let overhead = timer_overhead();
    let tsc_ghz = tsc_ghz();

    let cases = latency_cases(cfg.os_cases, &mut notes);
    let (samples, ring_runs, rtrb_runs) = run_rounds(&cfg, &env, &cases);

    let case_reports: Vec<CaseReport> =
        cases.iter().zip(samples).map(|((name, _), s)| summarize(name, s, overhead, tsc_ghz)).collect();
    let get = |name: &str| case_reports.iter().find(|c| c.name == name);
    let median = |name: &str| get(name).map_or(0.0, |c| c.median);
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };

    let (ring_stream, ring_full) = median_run(ring_runs);
    let (rtrb_stream, _) = median_run(rtrb_runs);

    let pinned = pins.is_some() && !env.pin_failed.load(Ordering::Relaxed);
    if pins.is_some() && !pinned {
        notes.push("setting a thread's affinity failed: some threads ran unpinned".to_string());
    }
    CrossingReport {
        unit: clock::UNIT,
        tsc_ghz,
        pinned,
        cores: pins.map(|(a, b)| vec![a.id, b.id]).unwrap_or_default(),
        cores_available: available.len(),
        cpu_idle_before_pct,
        timer_overhead: overhead,
        ring_cycles_median: median("ring"),
        ring_cycles_p10: get("ring").map_or(0.0, |c| c.p10),
        ring_cycles_p90: get("ring").map_or(0.0, |c| c.p90),
        ring_unpaired_cycles_median: median("ring_unpaired"),
        floor_cycles_median: median("floor"),
        floor_cycles_p10: get("floor").map_or(0.0, |c| c.p10),
        floor_cycles_p90: get("floor").map_or(0.0, |c| c.p90),
        floor_two_line_cycles_median: median("floor_two_line"),
        rtrb_cycles_median: median("rtrb"),
        mpsc_cycles_median: median("mpsc"),
        pipe_cycles_median: median("pipe"),
        ring_over_floor: ratio(median("ring"), median("floor")),
        ring_over_two_line_floor: ratio(median("ring"), median("floor_two_line")),
        rtrb_over_floor: ratio(median("rtrb"), median("floor")),
        ring_stream_items_per_s: ring_stream,
        ring_stream_full_events: ring_full,
        rtrb_stream_items_per_s: rtrb_stream,
        cases: case_reports,
        config: cfg,
        notes,
    }
}

/// One streaming run: records per second, and push calls that found the ring full.
type StreamRun = (f64, u64);

/// A latency case: `n` recorded round trips (after the warmup) in the given environment.
type Case = fn(&Env, usize) -> Vec<u64>;

/// The two cores to pin the threads to, if pinning is on and two are available (else a note why not).
fn choose_pins(
    pin: bool,
    available: &[core_affinity::CoreId],
    notes: &mut Vec<String>,
) -> Option<(core_affinity::CoreId, core_affinity::CoreId)> {
    if !pin {
        notes.push("pinning disabled by the configuration: threads ran unpinned".to_string());
        None
    } else if available.len() < 2 {
        notes.push(format!("only {} core(s) available: threads ran unpinned", available.len()));
        None
    } else {
        Some((available[0], available[1]))
    }
}

/// The latency cases to run, by name: the OS ones only if `os_cases` (else a note).
fn latency_cases(os_cases: bool, notes: &mut Vec<String>) -> Vec<(&'static str, Case)> {
    let mut cases: Vec<(&'static str, Case)> = vec![
        ("ring", case_ring),
        ("ring_unpaired", case_ring_unpaired),
        ("floor", case_floor),
        ("floor_two_line", case_floor_two_line),
        ("rtrb", case_rtrb),
    ];
    if os_cases {
        cases.push(("mpsc", case_mpsc));
        cases.push(("pipe", case_pipe));
    } else {
        notes.push("mpsc and pipe cases skipped by the configuration".to_string());
    }
    cases
}

/// Runs the cases (and streaming runs) interleaved, `rounds` times: each case's samples, then
/// the ring and `rtrb` streaming runs.
fn run_rounds(
    cfg: &CrossingConfig,
    env: &Env,
    cases: &[(&'static str, Case)],
) -> (Vec<Vec<u64>>, Vec<StreamRun>, Vec<StreamRun>) {
    let rounds = cfg.rounds.max(1);
    let per_round = cfg.round_trips.max(1).div_ceil(rounds);
    let mut samples: Vec<Vec<u64>> = vec![Vec::with_capacity(per_round * rounds); cases.len()];
    let mut ring_runs = Vec::with_capacity(rounds);
    let mut rtrb_runs = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        for (i, (_, case)) in cases.iter().enumerate() {
            let got = case(env, per_round);
            samples[i].extend(got);
        }
        if cfg.stream_items > 0 {
            ring_runs.push(stream_ring(env, cfg.stream_items, cfg.stream_batch.max(1)));
            rtrb_runs.push((stream_rtrb(env, cfg.stream_items, cfg.stream_batch.max(1)), 0));
        }
    }
    (samples, ring_runs, rtrb_runs)
}

/// What every case needs.
struct Env {
    pins: Option<(core_affinity::CoreId, core_affinity::CoreId)>,
    pin_failed: AtomicBool,
    warmup: usize,
    record: SealedRecord,
    capacity: usize,
}

impl Env {
    /// Runs `a` and `b` on two fresh threads, pinned to the two cores; returns what they return.
    fn pair<RA: Send, RB: Send>(&self, a: impl FnOnce() -> RA + Send, b: impl FnOnce() -> RB + Send) -> (RA, RB) {
        std::thread::scope(|s| {
            let hb = s.spawn(|| {
                self.pin(1);
                b()
            });
            let ha = s.spawn(|| {
                self.pin(0);
                a()
            });
            let ra = ha.join().expect("benchmark thread A panicked");
            let rb = hb.join().expect("benchmark thread B panicked");
            (ra, rb)
        })
    }

    fn pin(&self, which: usize) {
        if let Some((a, b)) = self.pins {
            if !core_affinity::set_for_current(if which == 0 { a } else { b }) {
                self.pin_failed.store(true, Ordering::Relaxed);
            }
        }
    }
}

/// The timer: fenced TSC reads on x86-64, monotonic nanoseconds elsewhere.
#[cfg(target_arch = "x86_64")]
mod clock {
    pub(crate) const UNIT: &str = "tsc_cycles";

    /// The TSC, read between two `lfence`s: the read waits for every earlier instruction (so
    /// it cannot run ahead of the spin loop that saw the answer, which branch prediction would
    /// otherwise allow) and later instructions wait for it.
    #[inline(always)]
    pub(crate) fn ticks() -> u64 {
        use core::arch::x86_64::{_mm_lfence, _rdtsc};
        // SAFETY: `lfence` needs SSE2 and `rdtsc` the TSC, both part of the x86-64 baseline;
        // neither reads or writes memory the program can see.
        unsafe {
            _mm_lfence();
            let t = _rdtsc();
            _mm_lfence();
            t
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod clock {
    use std::sync::OnceLock;
    use std::time::Instant;

    pub(crate) const UNIT: &str = "ns";

    #[inline(always)]
    pub(crate) fn ticks() -> u64 {
        static BASE: OnceLock<Instant> = OnceLock::new();
        BASE.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}

use clock::ticks;

/// Idle share of all CPUs over `window`, from `/proc/stat` (Linux); `None` elsewhere.
fn cpu_idle_pct(window: Duration) -> Option<f64> {
    fn sample() -> Option<(u64, u64)> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let line = stat.lines().next()?.strip_prefix("cpu ")?;
        let v: Vec<u64> = line.split_whitespace().filter_map(|f| f.parse().ok()).collect();
        // user nice system idle iowait irq softirq steal (guest time is inside user)
        let total: u64 = v.iter().take(8).sum();
        let idle = v.get(3)? + v.get(4).copied().unwrap_or(0);
        Some((total, idle))
    }
    let (t0, i0) = sample()?;
    std::thread::sleep(window);
    let (t1, i1) = sample()?;
    let total = t1.checked_sub(t0).filter(|&t| t > 0)?;
    Some(100.0 * i1.saturating_sub(i0) as f64 / total as f64)
}

fn timer_overhead() -> f64 {
    let mut v: Vec<u64> = (0..10_001)
        .map(|_| {
            let a = ticks();
            let b = ticks();
            b.wrapping_sub(a)
        })
        .collect();
    v.sort_unstable();
    v[v.len() / 2] as f64
}

/// TSC ticks per nanosecond, measured against the monotonic clock over ~20 ms.
fn tsc_ghz() -> Option<f64> {
    if clock::UNIT != "tsc_cycles" {
        return None;
    }
    let i0 = Instant::now();
    let t0 = ticks();
    while i0.elapsed() < Duration::from_millis(20) {
        std::hint::spin_loop();
    }
    let t1 = ticks();
    let ns = i0.elapsed().as_nanos() as f64;
    Some(t1.wrapping_sub(t0) as f64 / ns)
}

fn summarize(name: &'static str, mut rt: Vec<u64>, overhead: f64, ghz: Option<f64>) -> CaseReport {
    rt.sort_unstable();
    let one_way = |q: f64| -> f64 {
        if rt.is_empty() {
            return 0.0;
        }
        let i = ((rt.len() - 1) as f64 * q).round() as usize;
        ((rt[i] as f64 - overhead) / 2.0).max(0.0)
    };
    let median = one_way(0.5);
    CaseReport {
        name,
        samples: rt.len(),
        p10: one_way(0.1),
        median,
        p90: one_way(0.9),
        median_ns: match clock::UNIT {
            "ns" => Some(median),
            _ => ghz.map(|g| median / g),
        },
    }
}

/// The median run by rate, with its full-event count.
fn median_run(mut runs: Vec<(f64, u64)>) -> (f64, u64) {
    if runs.is_empty() {
        return (0.0, 0);
    }
    runs.sort_by(|a, b| a.0.total_cmp(&b.0));
    runs[runs.len() / 2]
}

/// Records `n` round trips after `warmup` unrecorded ones; `round_trip` does one.
#[inline(always)]
fn timed(warmup: usize, n: usize, mut round_trip: impl FnMut(usize)) -> Vec<u64> {
    let mut out = Vec::with_capacity(n);
    for i in 0..warmup + n {
        let t0 = ticks();
        round_trip(i);
        let t1 = ticks();
        if i >= warmup {
            out.push(t1.wrapping_sub(t0));
        }
    }
    out
}

fn case_ring(env: &Env, n: usize) -> Vec<u64> {
    let (mut core, mut host): (CoreSide, HostSide) = Boundary::new(env.capacity);
    let total = env.warmup + n;
    let record = Arc::clone(&env.record);
    env.pair(
        move || {
            let mut rec = Some(record);
            timed(env.warmup, n, |_| {
                let out = rec.take().expect("the record is back");
                core.push(out).expect("one record in flight always fits");
                rec = Some(core.wait_pop(STALL).expect("host side stopped answering"));
            })
        },
        move || {
            for _ in 0..total {
                let r = host.wait_pop(STALL).expect("core side stopped sending");
                host.push(r).expect("one record in flight always fits");
            }
        },
    )
    .0
}

fn case_ring_unpaired(env: &Env, n: usize) -> Vec<u64> {
    let (mut to_b, mut from_a) = ring::<SealedRecord>(env.capacity);
    let (mut to_a, mut from_b) = ring::<SealedRecord>(env.capacity);
    let total = env.warmup + n;
    let record = Arc::clone(&env.record);
    env.pair(
        move || {
            let mut rec = Some(record);
            timed(env.warmup, n, |_| {
                to_b.push(rec.take().expect("the record is back")).expect("one record in flight always fits");
                rec = Some(from_b.wait_pop(STALL).expect("thread B stopped answering"));
            })
        },
        move || {
            for _ in 0..total {
                let r = from_a.wait_pop(STALL).expect("thread A stopped sending");
                to_a.push(r).expect("one record in flight always fits");
            }
        },
    )
    .0
}

fn case_rtrb(env: &Env, n: usize) -> Vec<u64> {
    let (mut to_b, mut from_a) = rtrb::RingBuffer::<SealedRecord>::new(env.capacity);
    let (mut to_a, mut from_b) = rtrb::RingBuffer::<SealedRecord>::new(env.capacity);
    let total = env.warmup + n;
    let record = Arc::clone(&env.record);
    fn spin_pop(c: &mut rtrb::Consumer<SealedRecord>) -> SealedRecord {
        loop {
            if let Ok(r) = c.pop() {
                return r;
            }
            std::hint::spin_loop();
        }
    }
    env.pair(
        move || {
            let mut rec = Some(record);
            timed(env.warmup, n, |_| {
                to_b.push(rec.take().expect("the record is back")).expect("one record in flight always fits");
                rec = Some(spin_pop(&mut from_b));
            })
        },
        move || {
            for _ in 0..total {
                let r = spin_pop(&mut from_a);
                to_a.push(r).expect("one record in flight always fits");
            }
        },
    )
    .0
}

fn case_floor(env: &Env, n: usize) -> Vec<u64> {
    let line = CachePadded(AtomicU64::new(0));
    let total = (env.warmup + n) as u64;
    // A writes odd values, B answers with the next even one: one line, ping-ponged.
    let spin_until = |v: u64| {
        while line.load(Ordering::Acquire) != v {
            std::hint::spin_loop();
        }
    };
    env.pair(
        || {
            timed(env.warmup, n, |i| {
                let i = i as u64;
                line.store(2 * i + 1, Ordering::Release);
                spin_until(2 * i + 2);
            })
        },
        || {
            for i in 0..total {
                spin_until(2 * i + 1);
                line.store(2 * i + 2, Ordering::Release);
            }
        },
    )
    .0
}

fn case_floor_two_line(env: &Env, n: usize) -> Vec<u64> {
    let to_b = CachePadded(AtomicU64::new(0));
    let to_a = CachePadded(AtomicU64::new(0));
    let total = (env.warmup + n) as u64;
    fn spin_until(line: &AtomicU64, v: u64) {
        while line.load(Ordering::Acquire) != v {
            std::hint::spin_loop();
        }
    }
    env.pair(
        || {
            timed(env.warmup, n, |i| {
                let v = i as u64 + 1;
                to_b.store(v, Ordering::Release);
                spin_until(&to_a, v);
            })
        },
        || {
            for v in 1..=total {
                spin_until(&to_b, v);
                to_a.store(v, Ordering::Release);
            }
        },
    )
    .0
}

fn case_mpsc(env: &Env, n: usize) -> Vec<u64> {
    let (to_b, from_a) = mpsc::channel::<SealedRecord>();
    let (to_a, from_b) = mpsc::channel::<SealedRecord>();
    let total = env.warmup + n;
    let record = Arc::clone(&env.record);
    env.pair(
        move || {
            let mut rec = Some(record);
            timed(env.warmup, n, |_| {
                to_b.send(rec.take().expect("the record is back")).expect("thread B is gone");
                rec = Some(from_b.recv_timeout(STALL).expect("thread B stopped answering"));
            })
        },
        move || {
            for _ in 0..total {
                let r = from_a.recv_timeout(STALL).expect("thread A stopped sending");
                to_a.send(r).expect("thread A is gone");
            }
        },
    )
    .0
}

fn case_pipe(env: &Env, n: usize) -> Vec<u64> {
    let (mut from_a, mut to_b) = std::io::pipe().expect("pipe");
    let (mut from_b, mut to_a) = std::io::pipe().expect("pipe");
    let total = env.warmup + n;
    env.pair(
        move || {
            let mut buf = [0u8; 8];
            timed(env.warmup, n, |i| {
                to_b.write_all(&(i as u64).to_le_bytes()).expect("pipe write");
                from_b.read_exact(&mut buf).expect("pipe read");
            })
        },
        move || {
            let mut buf = [0u8; 8];
            for _ in 0..total {
                from_a.read_exact(&mut buf).expect("pipe read");
                to_a.write_all(&buf).expect("pipe write");
            }
        },
    )
    .0
}

/// Streams `items` records core → host; returns (records per second, full events).
fn stream_ring(env: &Env, items: usize, batch: usize) -> (f64, u64) {
    let (mut core, mut host) = Boundary::new(env.capacity);
    let start = Barrier::new(2);
    let src: Vec<SealedRecord> = (0..items).map(|_| Arc::clone(&env.record)).collect();
    let record = Arc::clone(&env.record);
    let (began, (ended, sink)) = env.pair(
        || {
            start.wait();
            let began = Instant::now();
            for r in src {
                core.push_blocking(r, STALL).expect("host side stopped draining");
            }
            began
        },
        || {
            let mut sink = prefaulted_sink(items, &record);
            start.wait();
            while sink.len() < items {
                if host.pop_batch(&mut sink, batch) == 0 {
                    std::hint::spin_loop();
                }
            }
            (Instant::now(), sink)
        },
    );
    let secs = ended.duration_since(began).as_secs_f64();
    drop(sink);
    let full = core.stats().outbound.full_events;
    (items as f64 / secs.max(1e-9), full)
}

/// Streams `items` records through one `rtrb` ring; returns records per second.
fn stream_rtrb(env: &Env, items: usize, batch: usize) -> f64 {
    let (mut tx, mut rx) = rtrb::RingBuffer::<SealedRecord>::new(env.capacity);
    let start = Barrier::new(2);
    let src: Vec<SealedRecord> = (0..items).map(|_| Arc::clone(&env.record)).collect();
    let record = Arc::clone(&env.record);
    let (began, (ended, sink)) = env.pair(
        || {
            start.wait();
            let began = Instant::now();
            for r in src {
                let mut r = r;
                loop {
                    match tx.push(r) {
                        Ok(()) => break,
                        Err(rtrb::PushError::Full(back)) => {
                            r = back;
                            std::hint::spin_loop();
                        }
                    }
                }
            }
            began
        },
        || {
            let mut sink = prefaulted_sink(items, &record);
            start.wait();
            while sink.len() < items {
                let n = rx.slots().min(batch);
                if n == 0 {
                    std::hint::spin_loop();
                    continue;
                }
                let chunk = rx.read_chunk(n).expect("slots() said they are there");
                sink.extend(chunk);
            }
            (Instant::now(), sink)
        },
    );
    let secs = ended.duration_since(began).as_secs_f64();
    drop(sink);
    items as f64 / secs.max(1e-9)
}

/// An empty vector with room for `items` records whose pages are already mapped, so the
/// streaming consumer does not take page faults inside the timed section.
fn prefaulted_sink(items: usize, record: &SealedRecord) -> Vec<SealedRecord> {
    let mut sink = Vec::with_capacity(items);
    sink.resize(items, Arc::clone(record));
    sink.clear();
    sink
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_subtracts_overhead_and_halves() {
        let c = summarize("x", (1..=101).map(|v| v * 10).collect(), 10.0, Some(2.0));
        assert_eq!(c.samples, 101);
        assert_eq!(c.median, (510.0 - 10.0) / 2.0);
        assert_eq!(c.p10, (110.0 - 10.0) / 2.0);
        assert_eq!(c.p90, (910.0 - 10.0) / 2.0);
        let empty = summarize("y", Vec::new(), 10.0, None);
        assert_eq!((empty.samples, empty.median), (0, 0.0));
    }

    #[test]
    fn timer_moves_forward() {
        let a = ticks();
        std::thread::sleep(Duration::from_millis(1));
        assert!(ticks() > a);
    }
}
