//! A closed-loop key-value load generator: YCSB's core workloads over many connections to any
//! memcached-protocol endpoint, or to Redis over RESP. `psl bench ycsb` drives it; other
//! benchmarks can too (build a [`Spec`], call [`load`] then [`run`], read the [`Outcome`]).
//!
//! Shape: `threads` client threads (one is usually enough on two cores), each owning
//! `connections / threads` non-blocking connections in one `mio` event loop, each connection
//! keeping `pipeline` operations in flight (closed loop: a completed operation starts the next
//! one on the same connection). Connections go round-robin to the targets. Latency is from
//! the moment an operation is generated (queued on its connection) to its last reply, so it
//! includes queueing behind the pipeline; it is recorded in HdrHistograms (nanoseconds, three
//! significant digits), per kind of operation and over all. Each client thread's CPU time is
//! measured with its own thread clock, so the generator's cost is known even when the server
//! runs in the same process.
//!
//! Operations (YCSB's names):
//! - *read*: memcached `get`, Redis `GET`;
//! - *update* and *insert*: memcached `set`, Redis `SET` of a whole `value_bytes` value;
//! - *read-modify-write* (workload F): memcached `gets`, then `cas` with the unique it returned,
//!   retried from the `gets` when another client changed the key in between (`EXISTS`); Redis:
//!   `WATCH k` + `GET k`, then `MULTI`, `SET k`, `EXEC`, retried when `EXEC` is aborted.
//!   Both are optimistic concurrency with two round trips per try, so they are the same
//!   operation in each protocol. A Redis connection runs one such sequence at a time (WATCH is
//!   per connection); other operations still pipeline around it.
//!
//! Module map: `keys` (YCSB's generators and key names), `proto` (request encoders and reply
//! parsers, no I/O).

pub mod keys;
pub mod proto;

use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use keys::{AckWindow, Latest, Rng, ScrambledZipfian};
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use proto::{ParseError, Reply};
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Wire protocol of the targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// memcached's text protocol (memcached, `psl memcached`, any compatible server).
    Memcached,
    /// Redis's RESP2.
    Redis,
}

impl std::str::FromStr for Protocol {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Protocol> {
        match s {
            "memcached" => Ok(Protocol::Memcached),
            "redis" | "resp" => Ok(Protocol::Redis),
            _ => bail!("unknown protocol {s:?}: memcached or redis"),
        }
    }
}

/// Which key an operation touches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Distribution {
    /// Every key equally likely.
    Uniform,
    /// YCSB's scrambled zipfian, theta 0.99.
    Zipfian,
    /// YCSB's `latest`: recently inserted keys are the most popular (workload D).
    Latest,
}

impl Distribution {
    pub fn name(self) -> &'static str {
        match self {
            Distribution::Uniform => "uniform",
            Distribution::Zipfian => "zipfian",
            Distribution::Latest => "latest",
        }
    }
}

impl std::str::FromStr for Distribution {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Distribution> {
        match s {
            "uniform" => Ok(Distribution::Uniform),
            "zipfian" | "zipf" => Ok(Distribution::Zipfian),
            "latest" => Ok(Distribution::Latest),
            _ => bail!("unknown distribution {s:?}: uniform, zipfian or latest"),
        }
    }
}

/// Proportions of each kind of operation (they need not sum to 1; they are normalized).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Mix {
    pub read: f64,
    pub update: f64,
    pub insert: f64,
    pub rmw: f64,
}

impl Mix {
    /// `read` reads and the rest updates (e.g. 0.9 for a 90/10 mix).
    pub fn read_update(read: f64) -> Mix {
        Mix { read, update: 1.0 - read, insert: 0.0, rmw: 0.0 }
    }
}

/// YCSB's core workloads that a key-value cache can run (E needs scans, which neither
/// memcached nor a plain Redis key space has).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// Update heavy: 50% reads, 50% updates.
    A,
    /// Read mostly: 95% reads, 5% updates.
    B,
    /// Read only.
    C,
    /// Read latest: 95% reads, 5% inserts, reads skewed to the newest keys.
    D,
    /// Read-modify-write: 50% reads, 50% read-modify-writes.
    F,
}

impl Workload {
    #[cfg(test)]
    pub const ALL: [Workload; 5] = [Workload::A, Workload::B, Workload::C, Workload::D, Workload::F];

    pub fn mix(self) -> Mix {
        match self {
            Workload::A => Mix::read_update(0.5),
            Workload::B => Mix::read_update(0.95),
            Workload::C => Mix::read_update(1.0),
            Workload::D => Mix { read: 0.95, update: 0.0, insert: 0.05, rmw: 0.0 },
            Workload::F => Mix { read: 0.5, update: 0.0, insert: 0.0, rmw: 0.5 },
        }
    }

    /// The request distribution: `base` (zipfian or uniform), except D's `latest`.
    pub fn distribution(self, base: Distribution) -> Distribution {
        if self == Workload::D {
            Distribution::Latest
        } else {
            base
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Workload::A => "a",
            Workload::B => "b",
            Workload::C => "c",
            Workload::D => "d",
            Workload::F => "f",
        }
    }
}

impl std::str::FromStr for Workload {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Workload> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "a" => Workload::A,
            "b" => Workload::B,
            "c" => Workload::C,
            "d" => Workload::D,
            "f" => Workload::F,
            "e" => bail!("workload E needs range scans, which the memcached protocol does not have"),
            _ => bail!("unknown workload {s:?}: a, b, c, d or f"),
        })
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct Spec {
    /// Endpoints; connections are spread over them round-robin.
    pub targets: Vec<SocketAddr>,
    pub protocol: Protocol,
    /// Client threads (each an event loop over its share of the connections).
    pub threads: usize,
    /// Connections in all.
    pub connections: usize,
    /// Operations in flight per connection.
    pub pipeline: usize,
    /// Records (key numbers `0..keys`), inserted by [`load`].
    pub keys: u64,
    pub value_bytes: usize,
    pub distribution: Distribution,
    pub mix: Mix,
    /// Measured time of [`run`].
    pub duration: Duration,
    /// Time before the measured part (operations run, are not counted).
    pub warmup: Duration,
    /// Read-modify-write tries before the operation counts as an error.
    pub rmw_tries_max: u32,
    pub seed: u64,
}

impl Default for Spec {
    fn default() -> Spec {
        Spec {
            targets: Vec::new(),
            protocol: Protocol::Memcached,
            threads: 1,
            connections: 50,
            pipeline: 1,
            keys: 100_000,
            value_bytes: 1000,
            distribution: Distribution::Zipfian,
            mix: Workload::A.mix(),
            duration: Duration::from_secs(10),
            warmup: Duration::from_millis(500),
            rmw_tries_max: 64,
            seed: 0x5eed,
        }
    }
}

impl Spec {
    /// This spec with `w`'s mix and distribution (`base` for all but D).
    pub fn workload(mut self, w: Workload, base: Distribution) -> Spec {
        self.mix = w.mix();
        self.distribution = w.distribution(base);
        self
    }

    fn check(&self) -> Result<()> {
        if self.targets.is_empty() {
            bail!("no target to load");
        }
        if self.threads == 0 || self.connections == 0 || self.pipeline == 0 {
            bail!("threads, connections and pipeline must be at least 1");
        }
        if self.connections > 10_000 || self.pipeline > 1024 || self.threads > 64 {
            bail!("at most 10,000 connections, 64 threads and 1,024 operations in flight per connection");
        }
        if self.value_bytes == 0 || self.value_bytes > 1 << 20 {
            bail!("value_bytes must be 1 ..= 1 MiB");
        }
        if self.keys == 0 {
            bail!("keys must be at least 1");
        }
        let m = self.mix;
        if [m.read, m.update, m.insert, m.rmw].iter().any(|p| *p < 0.0 || !p.is_finite())
            || m.read + m.update + m.insert + m.rmw <= 0.0
        {
            bail!("the mix needs non-negative proportions, not all zero");
        }
        Ok(())
    }
}

/// Kinds of operations, as indexes into [`Outcome::by_kind`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Read = 0,
    Update = 1,
    Insert = 2,
    Rmw = 3,
}

const KIND_NAMES: [&str; 4] = ["read", "update", "insert", "rmw"];

/// What a [`load`] or [`run`] measured.
pub struct Outcome {
    /// Operations completed without error in the measured window.
    pub ops: u64,
    pub seconds: f64,
    /// Completed operations per kind (`Kind as usize`).
    pub by_kind: [u64; 4],
    /// Reads (and read-modify-writes) of a key the server did not have.
    pub misses: u64,
    /// Read-modify-write tries lost to another client's write (then retried).
    pub rmw_conflicts: u64,
    /// Operations that failed (error replies, read-modify-writes out of tries).
    pub errors: u64,
    pub first_error: Option<String>,
    /// Reads whose value was not `value_bytes` long.
    pub wrong_length: u64,
    /// Latency of every measured operation, nanoseconds.
    pub latency: Histogram<u64>,
    /// Latency per kind, nanoseconds.
    pub latency_by_kind: [Histogram<u64>; 4],
    /// CPU time of the client threads (user + system).
    pub client_cpu_seconds: f64,
    /// Operations still in flight when the run stopped (not counted).
    pub unfinished: u64,
}

fn new_hist() -> Histogram<u64> {
    // 1 µs to 100 s, three significant digits.
    Histogram::new_with_bounds(1_000, 100_000_000_000, 3).expect("valid histogram bounds")
}

impl Outcome {
    fn empty() -> Outcome {
        Outcome {
            ops: 0,
            seconds: 0.0,
            by_kind: [0; 4],
            misses: 0,
            rmw_conflicts: 0,
            errors: 0,
            first_error: None,
            wrong_length: 0,
            latency: new_hist(),
            latency_by_kind: [new_hist(), new_hist(), new_hist(), new_hist()],
            client_cpu_seconds: 0.0,
            unfinished: 0,
        }
    }

    fn merge(&mut self, o: Outcome) {
        self.ops += o.ops;
        for i in 0..4 {
            self.by_kind[i] += o.by_kind[i];
            let _ = self.latency_by_kind[i].add(&o.latency_by_kind[i]);
        }
        let _ = self.latency.add(&o.latency);
        self.misses += o.misses;
        self.rmw_conflicts += o.rmw_conflicts;
        self.errors += o.errors;
        self.first_error = self.first_error.take().or(o.first_error);
        self.wrong_length += o.wrong_length;
        self.client_cpu_seconds += o.client_cpu_seconds;
        self.unfinished += o.unfinished;
    }

    pub fn ops_per_s(&self) -> f64 {
        self.ops as f64 / self.seconds.max(1e-9)
    }

    /// Microseconds at quantile `q` of all operations.
    pub fn quantile_us(&self, q: f64) -> f64 {
        self.latency.value_at_quantile(q) as f64 / 1e3
    }

    /// Microseconds at quantile `q` of the reads (`update: false`) or the updates.
    pub fn quantile_us_of(&self, update: bool, q: f64) -> f64 {
        self.latency_by_kind[usize::from(update)].value_at_quantile(q) as f64 / 1e3
    }

    /// Throughput, latency percentiles (µs) over all operations and per kind, counts, and the
    /// client threads' CPU per operation.
    pub fn to_json(&self) -> Value {
        let pct = |h: &Histogram<u64>| {
            json!({
                "p50_us": h.value_at_quantile(0.50) as f64 / 1e3,
                "p95_us": h.value_at_quantile(0.95) as f64 / 1e3,
                "p99_us": h.value_at_quantile(0.99) as f64 / 1e3,
                "p999_us": h.value_at_quantile(0.999) as f64 / 1e3,
                "max_us": h.max() as f64 / 1e3,
                "mean_us": h.mean() / 1e3,
            })
        };
        let mut kinds = serde_json::Map::new();
        for (i, name) in KIND_NAMES.iter().enumerate() {
            if self.by_kind[i] > 0 {
                let mut v = pct(&self.latency_by_kind[i]);
                v["ops"] = json!(self.by_kind[i]);
                kinds.insert((*name).into(), v);
            }
        }
        let all = pct(&self.latency);
        json!({
            "ops": self.ops,
            "seconds": self.seconds,
            "ops_per_s": self.ops_per_s(),
            "p50_us": all["p50_us"], "p95_us": all["p95_us"], "p99_us": all["p99_us"],
            "p999_us": all["p999_us"], "max_us": all["max_us"], "mean_us": all["mean_us"],
            "by_kind": kinds,
            "misses": self.misses,
            "rmw_conflicts": self.rmw_conflicts,
            "errors": self.errors,
            "first_error": self.first_error,
            "wrong_length": self.wrong_length,
            "unfinished": self.unfinished,
            "client_cpu_seconds": self.client_cpu_seconds,
            "client_cpu_us_per_op": self.client_cpu_seconds * 1e6 / (self.ops.max(1) as f64),
        })
    }
}

/// Inserts records `0..spec.keys` (YCSB's load phase: one `set` each, as fast as the
/// connections allow). The outcome's window is the whole phase.
pub fn load(spec: &Spec) -> Result<Outcome> {
    spec.check()?;
    drive(spec, Phase::Load, Arc::new(AckWindow::new(spec.keys)))
}

/// Runs `spec`'s mix for `warmup + duration` over records `0..spec.keys` (which [`load`] put
/// there); counts what completes in the last `duration`.
pub fn run(spec: &Spec) -> Result<Outcome> {
    spec.check()?;
    drive(spec, Phase::Run, Arc::new(AckWindow::new(spec.keys)))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Load,
    Run,
}

fn drive(spec: &Spec, phase: Phase, window: Arc<AckWindow>) -> Result<Outcome> {
    let start = Instant::now();
    let (from, until) = match phase {
        Phase::Load => (start, None),
        Phase::Run => (start + spec.warmup, Some(start + spec.warmup + spec.duration)),
    };
    let threads: Vec<_> = (0..spec.threads)
        .map(|t| {
            let spec = spec.clone();
            let window = window.clone();
            std::thread::Builder::new()
                .name(format!("loadgen-{t}"))
                .spawn(move || -> Result<Outcome> {
                    let conns: Vec<usize> = (0..spec.connections).filter(|c| c % spec.threads == t).collect();
                    let keys = match phase {
                        Phase::Load => {
                            let lo = spec.keys * t as u64 / spec.threads as u64;
                            let hi = spec.keys * (t as u64 + 1) / spec.threads as u64;
                            lo..hi
                        }
                        Phase::Run => 0..0,
                    };
                    let cpu0 = thread_cpu_seconds();
                    let mut w = Worker::new(&spec, t, phase, keys, window, from, until)?;
                    w.connect(&conns)?;
                    w.event_loop()?;
                    let mut o = w.out;
                    o.client_cpu_seconds = thread_cpu_seconds() - cpu0;
                    Ok(o)
                })
                .context("spawning a load thread")
        })
        .collect::<Result<_>>()?;
    let mut out = Outcome::empty();
    let mut first_err = None;
    for h in threads {
        match h.join().map_err(|_| anyhow::anyhow!("a load thread panicked"))? {
            Ok(o) => out.merge(o),
            Err(e) => first_err = first_err.or(Some(e)),
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    out.seconds = match (phase, until) {
        (Phase::Run, Some(u)) => u.duration_since(from).as_secs_f64(),
        _ => start.elapsed().as_secs_f64(),
    };
    Ok(out)
}

/// CPU time of the calling thread.
pub fn thread_cpu_seconds() -> f64 {
    cpu_seconds(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// CPU time of this process, all its threads.
pub fn process_cpu_seconds() -> f64 {
    cpu_seconds(libc::CLOCK_PROCESS_CPUTIME_ID)
}

fn cpu_seconds(clock: libc::clockid_t) -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into the valid, exclusively borrowed `ts`.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    if rc != 0 {
        return 0.0;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

#[derive(Clone, Copy)]
struct Op {
    kind: Kind,
    key: u64,
    start: Instant,
    tries: u32,
}

/// What the next reply on a connection answers.
enum Expect {
    /// The reply completes `Op` (read, update, insert).
    Done(Op),
    /// memcached `gets` of a read-modify-write.
    McGets(Op),
    /// memcached `cas` of a read-modify-write.
    McCas(Op),
    /// Redis `+OK` to WATCH or MULTI (nothing to do).
    ROk,
    /// Redis GET after WATCH.
    RGet(Op),
    /// Redis `+QUEUED` to the SET inside MULTI.
    RQueued,
    /// Redis EXEC: an array if it ran, null if a watched key changed.
    RExec(Op),
}

struct Conn {
    stream: TcpStream,
    addr: SocketAddr,
    out: Vec<u8>,
    out_at: usize,
    inb: Vec<u8>,
    in_at: usize,
    expect: VecDeque<Expect>,
    /// Operations started on this connection and not completed (a deferred one included).
    in_flight: usize,
    /// Redis: a WATCH … EXEC sequence is under way.
    rmw_busy: bool,
    /// Redis: read-modify-writes waiting for `rmw_busy` to clear.
    deferred: VecDeque<Op>,
}

enum Chooser {
    Uniform(u64),
    Zipfian(ScrambledZipfian),
    Latest(Latest),
}

struct Worker {
    spec: Spec,
    phase: Phase,
    rng: Rng,
    chooser: Chooser,
    window: Arc<AckWindow>,
    values: Vec<u8>,
    /// Load phase: the key numbers this thread still has to insert.
    load_keys: std::ops::Range<u64>,
    from: Instant,
    until: Option<Instant>,
    stopping: bool,
    cumulative: [f64; 4],
    conns: Vec<Conn>,
    out: Outcome,
}

const READ_CHUNK: usize = 64 * 1024;
/// How long in-flight operations may take to finish after the run's end.
const DRAIN: Duration = Duration::from_secs(5);
/// Longest a load phase may take.
const LOAD_TIME_MAX: Duration = Duration::from_secs(1800);

impl Worker {
    fn new(
        spec: &Spec,
        t: usize,
        phase: Phase,
        load_keys: std::ops::Range<u64>,
        window: Arc<AckWindow>,
        from: Instant,
        until: Option<Instant>,
    ) -> Result<Worker> {
        let mut rng = Rng::new(spec.seed ^ (t as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let chooser = match spec.distribution {
            Distribution::Uniform => Chooser::Uniform(spec.keys),
            Distribution::Zipfian => Chooser::Zipfian(ScrambledZipfian::new(spec.keys)),
            Distribution::Latest => Chooser::Latest(Latest::new(spec.keys)),
        };
        // Printable random bytes; each write takes a slice at a random offset.
        let values: Vec<u8> = (0..spec.value_bytes + 1024).map(|_| b'!' + rng.below(94) as u8).collect();
        let m = spec.mix;
        let sum = m.read + m.update + m.insert + m.rmw;
        let cumulative = [m.read / sum, (m.read + m.update) / sum, (m.read + m.update + m.insert) / sum, 1.0];
        Ok(Worker {
            spec: spec.clone(),
            phase,
            rng,
            chooser,
            window,
            values,
            load_keys,
            from,
            until,
            stopping: false,
            cumulative,
            conns: Vec::new(),
            out: Outcome::empty(),
        })
    }

    fn connect(&mut self, ids: &[usize]) -> Result<()> {
        for &c in ids {
            let addr = self.spec.targets[c % self.spec.targets.len()];
            let s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))
                .with_context(|| format!("connecting to {addr}"))?;
            s.set_nodelay(true)?;
            s.set_nonblocking(true)?;
            self.conns.push(Conn {
                stream: TcpStream::from_std(s),
                addr,
                out: Vec::with_capacity(4096),
                out_at: 0,
                inb: Vec::with_capacity(READ_CHUNK),
                in_at: 0,
                expect: VecDeque::new(),
                in_flight: 0,
                rmw_busy: false,
                deferred: VecDeque::new(),
            });
        }
        Ok(())
    }

    fn value(&mut self) -> (usize, usize) {
        let off = self.rng.below(1024) as usize;
        (off, off + self.spec.value_bytes)
    }

    /// The next operation of this thread, or None when there is none to start.
    fn next_op(&mut self, now: Instant) -> Option<Op> {
        if self.stopping {
            return None;
        }
        if self.phase == Phase::Load {
            let k = self.load_keys.next()?;
            return Some(Op { kind: Kind::Insert, key: k, start: now, tries: 0 });
        }
        let u = self.rng.next_f64();
        let kind = if u < self.cumulative[0] {
            Kind::Read
        } else if u < self.cumulative[1] {
            Kind::Update
        } else if u < self.cumulative[2] {
            Kind::Insert
        } else {
            Kind::Rmw
        };
        let key = if kind == Kind::Insert {
            self.window.allocate()
        } else {
            match &mut self.chooser {
                Chooser::Uniform(n) => self.rng.below(*n),
                Chooser::Zipfian(z) => z.next(&mut self.rng),
                Chooser::Latest(l) => l.next(&mut self.rng, &self.window),
            }
        };
        Some(Op { kind, key, start: now, tries: 0 })
    }

    /// Writes `op`'s first request to connection `c`.
    fn send(&mut self, c: usize, op: Op) {
        let redis = self.spec.protocol == Protocol::Redis;
        if redis && op.kind == Kind::Rmw && self.conns[c].rmw_busy {
            self.conns[c].deferred.push_back(op);
            return;
        }
        let (a, b) = if matches!(op.kind, Kind::Update | Kind::Insert) { self.value() } else { (0, 0) };
        let conn = &mut self.conns[c];
        match (op.kind, redis) {
            (Kind::Read, false) => {
                proto::mc_get(&mut conn.out, op.key, false);
                conn.expect.push_back(Expect::Done(op));
            }
            (Kind::Read, true) => {
                proto::resp_get(&mut conn.out, op.key);
                conn.expect.push_back(Expect::Done(op));
            }
            (Kind::Update | Kind::Insert, false) => {
                proto::mc_store(&mut conn.out, op.key, &self.values[a..b], None);
                conn.expect.push_back(Expect::Done(op));
            }
            (Kind::Update | Kind::Insert, true) => {
                proto::resp_set(&mut conn.out, op.key, &self.values[a..b]);
                conn.expect.push_back(Expect::Done(op));
            }
            (Kind::Rmw, false) => {
                proto::mc_get(&mut conn.out, op.key, true);
                conn.expect.push_back(Expect::McGets(op));
            }
            (Kind::Rmw, true) => {
                conn.rmw_busy = true;
                proto::resp_watch_get(&mut conn.out, op.key);
                conn.expect.push_back(Expect::ROk);
                conn.expect.push_back(Expect::RGet(op));
            }
        }
    }

    /// Starts operations on connection `c` until its pipeline is full.
    fn fill(&mut self, c: usize, now: Instant) {
        while self.conns[c].in_flight < self.spec.pipeline {
            let Some(op) = self.next_op(now) else { break };
            self.conns[c].in_flight += 1;
            self.send(c, op);
        }
    }

    fn fail(&mut self, msg: String) {
        self.out.errors += 1;
        if self.out.first_error.is_none() {
            self.out.first_error = Some(msg);
        }
    }

    fn complete(&mut self, c: usize, op: Op, ok: bool, now: Instant) {
        self.conns[c].in_flight -= 1;
        if op.kind == Kind::Insert && ok {
            self.window.acknowledge(op.key);
        }
        let counted = now >= self.from && self.until.is_none_or(|u| now < u);
        if counted && ok {
            let ns = now.duration_since(op.start).as_nanos().min(u64::MAX as u128) as u64;
            let ns = ns.clamp(1_000, 100_000_000_000);
            let _ = self.out.latency.record(ns);
            let _ = self.out.latency_by_kind[op.kind as usize].record(ns);
            self.out.ops += 1;
            self.out.by_kind[op.kind as usize] += 1;
        }
    }

    fn on_reply(&mut self, c: usize, r: Reply, now: Instant) -> Result<()> {
        let Some(e) = self.conns[c].expect.pop_front() else {
            bail!("{}: a reply nobody asked for: {r:?}", self.conns[c].addr);
        };
        if let Reply::Error(msg) = &r {
            // An error ends the operation (whatever step it was at).
            let msg = format!("{}: {msg}", self.conns[c].addr);
            match e {
                Expect::Done(op) | Expect::McGets(op) | Expect::McCas(op) | Expect::RGet(op) | Expect::RExec(op) => {
                    self.fail(msg);
                    self.finish_rmw_if(c, op.kind);
                    self.complete(c, op, false, now);
                }
                // Redis: the rest of the sequence's replies still come (an aborted EXEC ends it).
                Expect::ROk | Expect::RQueued => self.fail(msg),
            }
            return Ok(());
        }
        let redis = self.spec.protocol == Protocol::Redis;
        match (e, r) {
            (Expect::Done(op), Reply::Value { len, .. }) if op.kind == Kind::Read => {
                if len != self.spec.value_bytes {
                    self.out.wrong_length += 1;
                }
                self.complete(c, op, true, now);
            }
            (Expect::Done(op), Reply::Miss) if op.kind == Kind::Read => {
                self.out.misses += 1;
                self.complete(c, op, true, now);
            }
            (Expect::Done(op), Reply::Stored) if op.kind != Kind::Read => self.complete(c, op, true, now),
            (Expect::McGets(op), Reply::Value { cas: Some(unique), .. }) => {
                let (a, b) = self.value();
                let conn = &mut self.conns[c];
                proto::mc_store(&mut conn.out, op.key, &self.values[a..b], Some(unique));
                conn.expect.push_back(Expect::McCas(op));
            }
            (Expect::McGets(op), Reply::Miss) | (Expect::McCas(op), Reply::NotFound) => {
                self.out.misses += 1;
                self.complete(c, op, true, now);
            }
            (Expect::McCas(op), Reply::Stored) => self.complete(c, op, true, now),
            (Expect::McCas(mut op), Reply::Exists) => {
                self.out.rmw_conflicts += 1;
                op.tries += 1;
                if op.tries >= self.spec.rmw_tries_max {
                    self.fail(format!("read-modify-write of key {} lost {} races", op.key, op.tries));
                    self.complete(c, op, false, now);
                } else {
                    let conn = &mut self.conns[c];
                    proto::mc_get(&mut conn.out, op.key, true);
                    conn.expect.push_back(Expect::McGets(op));
                }
            }
            (Expect::ROk, Reply::Stored) | (Expect::RQueued, Reply::Queued) => {}
            (Expect::RGet(op), Reply::Value { .. } | Reply::Miss) => {
                let (a, b) = self.value();
                let conn = &mut self.conns[c];
                proto::resp_multi_set_exec(&mut conn.out, op.key, &self.values[a..b]);
                conn.expect.push_back(Expect::ROk);
                conn.expect.push_back(Expect::RQueued);
                conn.expect.push_back(Expect::RExec(op));
            }
            (Expect::RExec(op), Reply::Array(_)) => {
                self.finish_rmw_if(c, op.kind);
                self.complete(c, op, true, now);
            }
            (Expect::RExec(mut op), Reply::NullArray) => {
                self.out.rmw_conflicts += 1;
                op.tries += 1;
                if op.tries >= self.spec.rmw_tries_max {
                    self.fail(format!("read-modify-write of key {} lost {} races", op.key, op.tries));
                    self.finish_rmw_if(c, op.kind);
                    self.complete(c, op, false, now);
                } else {
                    let conn = &mut self.conns[c];
                    proto::resp_watch_get(&mut conn.out, op.key);
                    conn.expect.push_back(Expect::ROk);
                    conn.expect.push_back(Expect::RGet(op));
                }
            }
            (_, r) => {
                bail!("{}: unexpected {} reply {r:?}", self.conns[c].addr, if redis { "Redis" } else { "memcached" })
            }
        }
        Ok(())
    }

    /// Redis: a read-modify-write ended; start the one that waited for it.
    fn finish_rmw_if(&mut self, c: usize, kind: Kind) {
        if kind != Kind::Rmw || self.spec.protocol != Protocol::Redis {
            return;
        }
        self.conns[c].rmw_busy = false;
        if let Some(op) = self.conns[c].deferred.pop_front() {
            self.send(c, op);
        }
    }

    /// Reads what connection `c` has, handles every whole reply, refills its pipeline.
    fn on_readable(&mut self, c: usize) -> Result<()> {
        loop {
            let conn = &mut self.conns[c];
            let len = conn.inb.len();
            conn.inb.resize(len + READ_CHUNK, 0);
            match conn.stream.read(&mut conn.inb[len..]) {
                Ok(0) => {
                    conn.inb.truncate(len);
                    bail!("{} closed the connection", conn.addr);
                }
                Ok(n) => conn.inb.truncate(len + n),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    conn.inb.truncate(len);
                    break;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => conn.inb.truncate(len),
                Err(e) => {
                    conn.inb.truncate(len);
                    return Err(e).with_context(|| format!("reading from {}", conn.addr));
                }
            }
        }
        let now = Instant::now();
        loop {
            let conn = &self.conns[c];
            let parsed = match self.spec.protocol {
                Protocol::Memcached => proto::parse_memcached(&conn.inb[conn.in_at..]),
                Protocol::Redis => proto::parse_resp(&conn.inb[conn.in_at..]),
            };
            match parsed {
                Ok(Some((r, n))) => {
                    self.conns[c].in_at += n;
                    self.on_reply(c, r, now)?;
                }
                Ok(None) => break,
                Err(e @ (ParseError::LineTooLong | ParseError::Malformed(_) | ParseError::TooLarge)) => {
                    bail!("{}: {e}", conn.addr)
                }
            }
        }
        let conn = &mut self.conns[c];
        if conn.in_at == conn.inb.len() {
            conn.inb.clear();
            conn.in_at = 0;
        } else if conn.in_at > READ_CHUNK {
            conn.inb.drain(..conn.in_at);
            conn.in_at = 0;
        }
        self.fill(c, now);
        Ok(())
    }

    fn flush(&mut self, c: usize) -> Result<()> {
        let conn = &mut self.conns[c];
        while conn.out_at < conn.out.len() {
            match conn.stream.write(&conn.out[conn.out_at..]) {
                Ok(0) => bail!("{}: the connection accepts no more bytes", conn.addr),
                Ok(n) => conn.out_at += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e).with_context(|| format!("writing to {}", conn.addr)),
            }
        }
        conn.out.clear();
        conn.out_at = 0;
        Ok(())
    }

    fn event_loop(&mut self) -> Result<()> {
        let mut poll = Poll::new()?;
        let mut events = Events::with_capacity(1024);
        for (i, conn) in self.conns.iter_mut().enumerate() {
            poll.registry().register(&mut conn.stream, Token(i), Interest::READABLE | Interest::WRITABLE)?;
        }
        let now = Instant::now();
        for c in 0..self.conns.len() {
            self.fill(c, now);
            self.flush(c)?;
        }
        let load_deadline = now + LOAD_TIME_MAX;
        loop {
            let now = Instant::now();
            match self.until {
                Some(u) if now >= u => {
                    self.stopping = true;
                    if self.conns.iter().all(|c| c.in_flight == 0) || now >= u + DRAIN {
                        break;
                    }
                }
                None if self.conns.iter().all(|c| c.in_flight == 0) => break,
                None if now >= load_deadline => bail!("the load phase took longer than {LOAD_TIME_MAX:?}"),
                _ => {}
            }
            poll.poll(&mut events, Some(Duration::from_millis(5)))?;
            for ev in events.iter() {
                let c = ev.token().0;
                if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                    self.on_readable(c)?;
                }
                self.flush(c)?;
            }
        }
        self.out.unfinished = self.conns.iter().map(|c| c.in_flight as u64).sum();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny in-process memcached-protocol server: get/gets/set/cas over a map, one thread per
    /// connection. Enough to check the generator's bookkeeping without an outside server.
    fn toy_server() -> SocketAddr {
        static NEXT_CAS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        use std::collections::HashMap;
        use std::io::{BufRead, BufReader};
        use std::sync::Mutex;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        // key → (value, cas)
        type Map = HashMap<Vec<u8>, (Vec<u8>, u64)>;
        let map: Arc<Mutex<Map>> = Arc::default();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(s) = s else { return };
                let map = map.clone();
                std::thread::spawn(move || {
                    let mut w = s.try_clone().unwrap();
                    let mut r = BufReader::new(s);
                    let mut line = String::new();
                    while r.read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
                        let f: Vec<String> = line.split_whitespace().map(String::from).collect();
                        line.clear();
                        let reply = match f[0].as_str() {
                            "get" | "gets" => match map.lock().unwrap().get(f[1].as_bytes()) {
                                Some((v, c)) => {
                                    let mut o = if f[0] == "gets" {
                                        format!("VALUE {} 0 {} {c}\r\n", f[1], v.len()).into_bytes()
                                    } else {
                                        format!("VALUE {} 0 {}\r\n", f[1], v.len()).into_bytes()
                                    };
                                    o.extend_from_slice(v);
                                    o.extend_from_slice(b"\r\nEND\r\n");
                                    o
                                }
                                None => b"END\r\n".to_vec(),
                            },
                            "set" | "cas" => {
                                let n: usize = f[4].parse().unwrap();
                                let mut v = vec![0u8; n + 2];
                                std::io::Read::read_exact(&mut r, &mut v).unwrap();
                                v.truncate(n);
                                let mut m = map.lock().unwrap();
                                let unique = NEXT_CAS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                if f[0] == "cas" {
                                    let want: u64 = f[5].parse().unwrap();
                                    match m.get(f[1].as_bytes()) {
                                        Some((_, c)) if *c == want => {
                                            m.insert(f[1].clone().into_bytes(), (v, unique));
                                            b"STORED\r\n".to_vec()
                                        }
                                        Some(_) => b"EXISTS\r\n".to_vec(),
                                        None => b"NOT_FOUND\r\n".to_vec(),
                                    }
                                } else {
                                    m.insert(f[1].clone().into_bytes(), (v, unique));
                                    b"STORED\r\n".to_vec()
                                }
                            }
                            _ => b"ERROR\r\n".to_vec(),
                        };
                        if w.write_all(&reply).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    #[test]
    fn loads_then_runs_every_workload_against_a_memcached_server() {
        let addr = toy_server();
        let spec = Spec {
            targets: vec![addr],
            threads: 2,
            connections: 6,
            pipeline: 3,
            keys: 500,
            value_bytes: 40,
            duration: Duration::from_millis(300),
            warmup: Duration::from_millis(50),
            ..Spec::default()
        };
        let l = load(&spec).unwrap();
        assert_eq!(l.ops, 500, "every record inserted once");
        assert_eq!(l.by_kind[Kind::Insert as usize], 500);
        assert_eq!(l.errors, 0);
        for w in Workload::ALL {
            let o = run(&spec.clone().workload(w, Distribution::Zipfian)).unwrap();
            assert!(o.ops > 0, "{w:?}");
            assert_eq!(o.errors, 0, "{w:?}: {:?}", o.first_error);
            assert_eq!(o.wrong_length, 0, "{w:?}");
            assert_eq!(o.latency.len(), o.ops);
            let j = o.to_json();
            assert!(j["p50_us"].as_f64().unwrap() <= j["p99_us"].as_f64().unwrap());
            match w {
                Workload::C => assert_eq!(o.by_kind[Kind::Read as usize], o.ops),
                Workload::F => assert!(o.by_kind[Kind::Rmw as usize] > 0 && o.by_kind[Kind::Update as usize] == 0),
                Workload::D => assert!(o.by_kind[Kind::Insert as usize] > 0),
                _ => assert!(o.by_kind[Kind::Update as usize] > 0),
            }
            if w != Workload::D {
                assert_eq!(o.misses, 0, "{w:?}: every key was loaded");
            }
        }
    }

    #[test]
    fn a_dead_target_is_an_error_not_a_hang() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        drop(l);
        let spec = Spec { targets: vec![addr], connections: 2, keys: 10, ..Spec::default() };
        assert!(load(&spec).is_err());
        assert!(Spec { targets: vec![], ..Spec::default() }.check().is_err());
        assert!("e".parse::<Workload>().is_err());
    }
}
