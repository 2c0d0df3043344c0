//! `psl bench ycsb`: YCSB's core workloads A, B, C, D and F (see [`super::loadgen`]) against
//! memcached-protocol endpoints and Redis.
//!
//! With `--target ADDR[,ADDR…]` it loads the records into those endpoints and runs each
//! workload named by `--workload` against them, printing one JSON object per run (one line
//! each). Without `--target` it starts the systems named by `--systems` itself, each in turn
//! on this machine, and prints one JSON object with every run and the ratios of each system to
//! memcached's throughput (the baseline of the same run):
//!
//! - `psl`: `psl memcached` (the embedded default: one node, in-process coordinator; one
//!   server thread, as memcached's `-t 1`), a child process;
//! - `psl-up`: the two SecureCached front ends of `psl up --memcached 2` (the KV deployment:
//!   router, coordinator, three capsule servers, CapsuleDB; conditional commands, so workload
//!   F's `cas`, run at each key's home front end), connections split between them;
//! - `memcached`: Debian's memcached with one worker thread;
//! - `redis`: Redis with `appendonly yes`, `appendfsync always` (every write on disk before the
//!   reply: the durable anchor), over RESP; F as WATCH/GET then MULTI/SET/EXEC.
//!
//! Each system gets one load phase (`--records` records of `--value-bytes`), then the runs in
//! YCSB's recommended order (A, B, C, F, then D, whose inserts grow the key space), each
//! distribution in turn. `--calibrate` also measures the load generator's own CPU per
//! operation against memcaslap's on the same memcached and mix.

use super::cluster::ChildGuard;
use super::loadgen::{self, Distribution, Protocol, Spec, Workload};
use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::{json, Map, Value};
use std::io::BufRead;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `ycsb`'s connections unless `--connections` is given.
const CONNECTIONS_DEFAULT: usize = 50;
/// `ycsb`'s records unless `--records` is given.
const RECORDS_DEFAULT: u64 = 100_000;

#[derive(Args, Debug, Clone)]
pub struct YcsbArgs {
    /// `ycsb`: workloads to run, comma-separated (a, b, c, d, f).
    #[arg(long, value_delimiter = ',', default_value = "a,b,c,d,f")]
    pub workload: Vec<String>,
    /// `ycsb`: endpoints to load (comma-separated); without it the bench starts `--systems`.
    #[arg(long, value_delimiter = ',')]
    pub target: Vec<SocketAddr>,
    /// `ycsb`: protocol of `--target`: memcached or redis.
    #[arg(long, default_value = "memcached")]
    pub protocol: String,
    /// `ycsb` without --target: systems to start and load, in order (psl, psl-up, memcached, redis).
    #[arg(long, value_delimiter = ',', default_value = "psl,memcached")]
    pub systems: Vec<String>,
    /// `ycsb`: request distributions, comma-separated (zipfian, uniform); D always reads latest.
    #[arg(long, value_delimiter = ',', default_value = "zipfian")]
    pub distribution: Vec<String>,
    /// Records: `ycsb`: loaded before the runs (default 100,000); `replication --cases
    /// big-store`: in the big store (default 10,000,000; its baseline holds 100,000).
    #[arg(long)]
    pub records: Option<u64>,
    /// `ycsb`: bytes per value (YCSB's default record: 10 fields of 100 bytes).
    #[arg(long, default_value_t = 1000)]
    pub value_bytes: usize,
    /// Connections in all (`ycsb`: 50; `cluster`: 96, split over its 2 client threads).
    #[arg(long)]
    pub connections: Option<usize>,
    /// `ycsb`: client threads driving them.
    #[arg(long, default_value_t = 1)]
    pub client_threads: usize,
    /// `ycsb`: operations in flight per connection.
    #[arg(long, default_value_t = 1)]
    pub pipeline: usize,
    /// `ycsb`: also compare the load generator's CPU per operation with memcaslap's.
    #[arg(long)]
    pub calibrate: bool,
}

/// A system under test: where to send load, and what keeps it running.
pub struct System {
    pub targets: Vec<SocketAddr>,
    pub protocol: Protocol,
    pub describe: Value,
    /// What keeps it running (child processes, directories); dropped to stop it.
    _guard: Vec<Box<dyn std::any::Any>>,
}

fn wait_port(addr: SocketAddr, what: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(addr).is_err() {
        if Instant::now() > deadline {
            bail!("{what} did not start listening on {addr}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Starts `name` (psl, psl-up, memcached, redis) on loopback.
pub fn start_system(name: &str) -> Result<System> {
    let exe = psl::util::sibling_exe("psl")?;
    match name {
        "memcached" => {
            let (guard, port) = super::memcached::start_memcached(1)?;
            let addr: SocketAddr = ([127, 0, 0, 1], port).into();
            Ok(System {
                targets: vec![addr],
                protocol: Protocol::Memcached,
                describe: json!({"server": "Debian memcached", "threads": 1, "memory_mb": 1024}),
                _guard: vec![Box::new(guard)],
            })
        }
        "psl" => {
            let mut child = Command::new(exe)
                .args(["memcached", "--listen", "127.0.0.1:0", "--threads", "1", "--memory-mb", "2048"])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .context("starting psl memcached")?;
            let out = child.stdout.take().context("psl memcached's stdout")?;
            let guard = ChildGuard::new(child, None);
            let mut addr = None;
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if let Some(a) = line.strip_prefix("listening ") {
                    addr = Some(a.trim().parse::<SocketAddr>()?);
                    break;
                }
            }
            let addr = addr.context("psl memcached did not say where it listens")?;
            Ok(System {
                targets: vec![addr],
                protocol: Protocol::Memcached,
                describe: json!({"server": "psl memcached (embedded default: one node, in-process coordinator)", "threads": 1, "memory_mb": 2048}),
                _guard: vec![Box::new(guard)],
            })
        }
        "psl-up" => {
            let (guard, kv) = super::cluster::start_up_kv(2, 2048, "router")?;
            let front_ends = kv.front_ends;
            for a in &front_ends {
                wait_port(*a, "a psl up front end")?;
            }
            Ok(System {
                targets: front_ends.clone(),
                protocol: Protocol::Memcached,
                describe: json!({"server": "psl up --memcached 2 (router, coordinator, 3 capsule servers, CapsuleDB, 2 front ends as processes)", "front_ends": front_ends.len(), "memory_mb_per_front_end": 2048}),
                _guard: vec![Box::new(guard)],
            })
        }
        "redis" => {
            let dir = tempfile::Builder::new().prefix("psl-bench-ycsb-redis").tempdir()?;
            let port = super::memcached::free_port()?;
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes"])
                .args(["--appendfsync", "always", "--protected-mode", "no", "--daemonize", "no", "--dir"])
                .arg(dir.path())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("starting redis-server (scripts/install-report-test-deps.sh installs it)")?;
            let guard = ChildGuard::new(child, Some(dir));
            let addr: SocketAddr = ([127, 0, 0, 1], port).into();
            wait_port(addr, "redis-server")?;
            Ok(System {
                targets: vec![addr],
                protocol: Protocol::Redis,
                describe: json!({"server": "redis-server", "appendonly": true, "appendfsync": "always", "protocol": "RESP", "rmw": "WATCH+GET, MULTI+SET+EXEC, retried when EXEC aborts"}),
                _guard: vec![Box::new(guard)],
            })
        }
        other => bail!("unknown system {other:?}: psl, psl-up, memcached or redis"),
    }
}

fn workloads(a: &YcsbArgs) -> Result<Vec<Workload>> {
    let mut w: Vec<Workload> = a.workload.iter().map(|s| s.parse()).collect::<Result<_>>()?;
    // YCSB's order: D last, since its inserts grow the key space the others draw from.
    w.sort_by_key(|w| (*w == Workload::D, *w as u8));
    w.dedup();
    Ok(w)
}

fn distributions(a: &YcsbArgs) -> Result<Vec<Distribution>> {
    let d: Vec<Distribution> = a.distribution.iter().map(|s| s.parse()).collect::<Result<_>>()?;
    if d.contains(&Distribution::Latest) {
        bail!("--distribution takes zipfian or uniform (D reads latest by itself)");
    }
    Ok(d)
}

fn base_spec(a: &YcsbArgs, seconds: f64) -> Spec {
    Spec {
        connections: a.connections.unwrap_or(CONNECTIONS_DEFAULT),
        threads: a.client_threads,
        pipeline: a.pipeline,
        keys: a.records.unwrap_or(RECORDS_DEFAULT),
        value_bytes: a.value_bytes,
        duration: Duration::from_secs_f64(seconds.max(0.1)),
        warmup: Duration::from_secs_f64((seconds * 0.1).clamp(0.05, 1.0)),
        ..Spec::default()
    }
}

/// The (workload, distribution) runs in order: every non-D workload over each distribution,
/// then D once (it reads latest whatever the distribution).
fn plan(ws: &[Workload], ds: &[Distribution]) -> Vec<(Workload, Distribution)> {
    let mut p = Vec::new();
    for d in ds {
        for w in ws.iter().filter(|w| **w != Workload::D) {
            p.push((*w, *d));
        }
    }
    if ws.contains(&Workload::D) {
        p.push((Workload::D, Distribution::Latest));
    }
    p
}

fn run_json(system: &str, w: Workload, d: Distribution, o: &loadgen::Outcome, spec: &Spec) -> Value {
    let mut v = o.to_json();
    v["system"] = json!(system);
    v["workload"] = json!(w.name());
    v["distribution"] = json!(d.name());
    v["connections"] = json!(spec.connections);
    v["pipeline"] = json!(spec.pipeline);
    v["client_threads"] = json!(spec.threads);
    v["records"] = json!(spec.keys);
    v["value_bytes"] = json!(spec.value_bytes);
    v
}

pub fn run(a: &YcsbArgs, seconds: f64, json_lines: bool, show_progress: bool) -> Result<Value> {
    let ws = workloads(a)?;
    let ds = distributions(a)?;
    let runs = plan(&ws, &ds);
    let seconds = if seconds > 0.0 { seconds } else { 1.0 };
    if !a.target.is_empty() {
        let spec = Spec { targets: a.target.clone(), protocol: a.protocol.parse()?, ..base_spec(a, seconds) };
        let l = loadgen::load(&spec)?;
        if l.errors > 0 {
            bail!("the load phase saw {} errors: {:?}", l.errors, l.first_error);
        }
        let mut all = Vec::new();
        for (w, d) in runs {
            let s = spec.clone().workload(w, d);
            let o = loadgen::run(&s)?;
            let mut v = run_json("target", w, d, &o, &s);
            v["targets"] = json!(a.target.iter().map(|t| t.to_string()).collect::<Vec<_>>());
            v["load_ops_per_s"] = json!(l.ops_per_s());
            v["machine"] = super::machine();
            if json_lines {
                println!("{v}");
            }
            all.push(v);
        }
        return Ok(if json_lines { Value::Null } else { Value::Array(all) });
    }

    let names: Vec<&String> = a.systems.iter().filter(|s| !s.is_empty() && *s != "none").collect();
    let steps = (names.len() * (runs.len() + 1) + usize::from(a.calibrate)) as u64;
    let pb = if show_progress { super::progress(steps, "bench ycsb") } else { indicatif::ProgressBar::hidden() };
    let mut out = Map::new();
    let mut all_runs = Vec::new();
    let mut loads = Vec::new();
    let mut systems = Map::new();
    for name in names {
        let sys = start_system(name)?;
        let spec = Spec { targets: sys.targets.clone(), protocol: sys.protocol, ..base_spec(a, seconds) };
        let l = loadgen::load(&spec).with_context(|| format!("loading {name}"))?;
        if l.errors > 0 {
            bail!("{name}: the load phase saw {} errors: {:?}", l.errors, l.first_error);
        }
        let mut lj = l.to_json();
        lj["system"] = json!(name);
        loads.push(lj);
        pb.inc(1);
        for &(w, d) in &runs {
            let s = spec.clone().workload(w, d);
            let o = loadgen::run(&s).with_context(|| format!("{name}: workload {}", w.name()))?;
            all_runs.push(run_json(name, w, d, &o, &s));
            pb.inc(1);
        }
        systems.insert(name.clone(), sys.describe.clone());
        drop(sys);
    }
    // Headline: each system's throughput over memcached's, per run.
    let mut ratios = Map::new();
    let tput = |sys: &str, w: &str, d: &str| {
        all_runs
            .iter()
            .find(|r| r["system"] == sys && r["workload"] == w && r["distribution"] == d)
            .and_then(|r| r["ops_per_s"].as_f64())
    };
    for r in &all_runs {
        let (sys, w, d) = (
            r["system"].as_str().unwrap_or(""),
            r["workload"].as_str().unwrap_or(""),
            r["distribution"].as_str().unwrap_or(""),
        );
        if sys == "memcached" {
            continue;
        }
        if let (Some(x), Some(m)) = (tput(sys, w, d), tput("memcached", w, d)) {
            ratios.insert(format!("{sys}_over_memcached_{w}_{d}"), json!(x / m.max(1e-9)));
        }
    }
    if a.calibrate {
        out.insert("calibration".into(), calibrate(seconds)?);
        pb.inc(1);
    }
    pb.finish_and_clear();
    out.insert("bench".into(), json!("ycsb"));
    out.insert("runs".into(), Value::Array(all_runs));
    out.insert("loads".into(), Value::Array(loads));
    out.insert("ratios".into(), Value::Object(ratios));
    out.insert("systems".into(), Value::Object(systems));
    out.insert(
        "load_generator".into(),
        json!({"connections": a.connections.unwrap_or(CONNECTIONS_DEFAULT), "client_threads": a.client_threads, "pipeline": a.pipeline,
               "records": a.records.unwrap_or(RECORDS_DEFAULT), "value_bytes": a.value_bytes, "seconds_per_run": seconds,
               "zipfian": "YCSB scrambled zipfian, theta 0.99", "latency": "from queueing on the connection to the last reply"}),
    );
    out.insert("machine".into(), super::machine());
    Ok(Value::Object(out))
}

/// CPU time of this process's reaped children (user + system).
fn children_cpu_seconds() -> f64 {
    // SAFETY: an all-zero rusage is a valid value of this plain C struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes one rusage into the valid, exclusively borrowed `ru`.
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) } != 0 {
        return 0.0;
    }
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// The load generator's CPU per operation against memcaslap's: the same memcached (one
/// thread), 100-byte values, 90% get / 10% set, 16 connections from one client thread; and
/// the generator again with its own default of 50 connections.
pub fn calibrate(seconds: f64) -> Result<Value> {
    let secs = seconds.round().max(2.0) as u64;
    let bin = super::memcached::memcaslap_bin()?;
    let dir = tempfile::tempdir()?;
    let cfg = dir.path().join("mix.cfg");
    std::fs::write(&cfg, "key\n30 30 1\nvalue\n100 100 1\ncmd\n0 0.1\n1 0.9\n")?;
    let (mc, port) = super::memcached::start_memcached(1)?;
    let cpu0 = children_cpu_seconds();
    let l = super::memcached::run_load(bin, port, &cfg, secs)?;
    let mc_cpu = children_cpu_seconds() - cpu0;
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let spec = Spec {
        targets: vec![addr],
        connections: 16,
        keys: 10_000,
        value_bytes: 100,
        distribution: Distribution::Uniform,
        mix: loadgen::Mix::read_update(0.9),
        duration: Duration::from_secs(secs),
        warmup: Duration::from_millis(200),
        ..Spec::default()
    };
    loadgen::load(&spec)?;
    let ours = loadgen::run(&spec)?;
    let ours50 = loadgen::run(&Spec { connections: 50, ..spec.clone() })?;
    drop(mc);
    let memcaslap_us = mc_cpu * 1e6 / (l.ops.max(1) as f64);
    let ours_us = ours.client_cpu_seconds * 1e6 / (ours.ops.max(1) as f64);
    Ok(json!({
        "server": "memcached -t 1",
        "mix": "90% get / 10% set, 100-byte values, 16 connections, 1 client thread",
        "memcaslap_ops_per_s": l.ops as f64 / l.seconds,
        "memcaslap_cpu_us_per_op": memcaslap_us,
        "loadgen_ops_per_s": ours.ops_per_s(),
        "loadgen_cpu_us_per_op": ours_us,
        "loadgen_p99_us": ours.quantile_us(0.99),
        "loadgen_50conns_ops_per_s": ours50.ops_per_s(),
        "loadgen_50conns_cpu_us_per_op": ours50.client_cpu_seconds * 1e6 / (ours50.ops.max(1) as f64),
        "ratio_cpu_loadgen_over_memcaslap": ours_us / memcaslap_us.max(1e-9),
        "seconds": secs,
    }))
}
