//! `psl bench cluster`: the process deployment against memcached, in one run.
//!
//! The deployment is `psl up --workers 1 --servers 0 --memcached 3` (the KV store as separate
//! processes: the fabric, a coordinator, three capsule servers, CapsuleDB and three SecureCached
//! front ends, each with `--kv-memory-mb`), once on the router tree and once on a local
//! nats-server (`--cases router,nats`; default both). The baseline is Debian's memcached with one
//! worker thread. One load generator ([`super::loadgen`]: 2 client threads, 96 connections spread
//! over the endpoints, or `--connections N` in the measured rounds; 100-byte values over 300,000
//! keys, loaded first) drives both in alternating rounds: for each mix (`a`: 50 % get / 50 %
//! set; `mix`: 90 % get / 10 % set) and each key distribution (uniform; YCSB's scrambled zipfian
//! 0.99), `--reps` rounds of the deployment, each followed by a round of memcached; medians
//! reported.
//!
//! Besides throughput and latency (p50, p99, and p99 of gets and of sets), per deployment round:
//! - `drain_ms`: from the end of the load until the deployment's processes are idle, i.e.
//!   until every node, server and CapsuleDB has stopped catching up; at most 60 s. Idle is
//!   measured against the deployment's own idle rate (an idle deployment still ticks: its
//!   processes' summed CPU time grows by `idle_cpu_ms_per_s`, measured before the load): the
//!   processes count as idle once their CPU time grows over 500 ms by at most 1.5 times that
//!   rate plus 10 ms;
//! - per role: peak resident memory (`VmHWM`) against the role's budget (its
//!   `--memory-budget-mb`, by default its kind's: `roles::RoleKind::budget_mb_default`), and
//!   CPU seconds per 1,000 operations (the load and its drain); `roles_over_budget_<fabric>`
//!   names every role whose peak passed its budget;
//! - what crossing the fabric cost, as the front ends' nodes count it (`stats`): repair
//!   requests sent and records sent in answer, and messages dropped on full queues (inbound:
//!   the fabric endpoint's receive queue or the node's ring; outbound: the endpoint's send
//!   queue), during the initial load and in steady state (the measured rounds):
//!   `records_dropped_<fabric>` and `repair_requests_<fabric>` are the steady-state totals of
//!   the front ends, the coordinator, CapsuleDB and the capsule servers (their `STATS`, apart
//!   in `detail` as `followers_*`; a server's outbound drops are not counted);
//! - how the front ends batched sets in steady state, `ops_per_record_<fabric>` (every record
//!   is verified once by each other role, so this divides most of the replication's CPU), and
//!   `flow_waits_<fabric>`: sets that waited for the capsule servers' acks (flow control,
//!   `psl_node::flow`).
//!
//! And what bounds the ratio on this machine: every process of both systems, the load
//! generator included, shares the same cores, so when both are CPU-bound the best ratio is the
//! CPU per operation of memcached's rounds (memcached and the load generator) over that of the
//! deployment's rounds (its roles and the load generator). `detail.<fabric>.cpu_us_per_op`
//! gives the four parts and `ratio_cpu_bound_<fabric>` that quotient (all mixes together).
//! Where the latency queues: `runq_wait_us_per_op_<fabric>` (the roles' threads and memcached's,
//! runnable but waiting for a core; per role in `detail.<fabric>.roles`).
//!
//! Headline: `ratio_a` and `ratio_mix` (uniform keys, router tree), the deployment over
//! memcached in the same run. Goals (issue 17): 0.7 and 0.8; `drain_ms` under 1,000; no role
//! above 256 MiB.
//!
//! `--shards LIST` (e.g. `1,2,4`; issue 36) runs a shard sweep instead ([`run_shards`]): for each
//! shard count N, `psl up --workers 1 --servers 0 --shards N --memcached 1 --kv-memory-mb 64
//! --fabric router` (per shard a capsule, its three capsule servers, CapsuleDB, coordinator and
//! one front end), loaded with the same keys, then `--reps` rounds of the `a` mix (50 % get /
//! 50 % set, uniform keys; `--seconds` × 5 s each) with the connections spread over every front
//! end of every shard, so that about (N − 1)/N of the commands are forwarded to another shard.
//! Per N: throughput and p50/p99 (medians of the rounds); CPU per operation of all the
//! deployment's roles and per kind of role (the rounds and their drains, over the measured
//! operations); the payload bytes each front end's node received from the fabric (its `stats`'
//! `psl_fabric_received_bytes`) per command the front ends ran (`cmd_get` + `cmd_set`, over the
//! same span), mean and max over the front ends, per command its own shard ran and per record
//! its writer sealed (with `ops_per_record`: the servers' acks and the epochs' messages come per
//! record and per second, so a front end that batches less receives more per op), and per
//! second of the rounds; the peak
//! resident memory (`VmHWM`) of each role, the max per kind; and the commands forwarded to
//! another shard (`shard_forwarded`). Each figure also as a ratio against the smallest N of the
//! run (`*_ratio_<N>_over_<min>`, e.g. `bytes_per_op_front_end_ratio_4_over_1` and
//! `memory_max_front_end_ratio_4_over_1`), which a noisy machine reproduces. Goal (issue 36):
//! the bytes each front end receives per operation and each role's memory do not grow with N
//! (`grew` names the figures of the goal whose ratio passed 1.1); on 2 shared cores more shards
//! are more processes on the same cores, so throughput cannot grow there.

use super::loadgen::{self, Distribution, Mix, Protocol, Spec};
use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::io::BufRead;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const KEYS: u64 = 300_000;
const VALUE_BYTES: usize = 100;
const CONNECTIONS: usize = 96;
const CLIENT_THREADS: usize = 2;
const FRONT_ENDS: u32 = 3;
/// Each front end's item memory (`--kv-memory-mb`; the process's budget is
/// `RoleKind::FrontEnd`'s), and the most any role may reach (issue 17).
const FRONT_END_MB: u64 = 64;
const ROLE_MB_MAX: u64 = 256;

/// One process of the deployment.
#[derive(Debug, Clone)]
pub(super) struct Role {
    pub(super) pid: u32,
    pub(super) name: String,
    /// The memory budget it runs under (`None`: not a psl role, e.g. nats-server).
    pub(super) budget_mb: Option<u64>,
}

/// The deployment's processes: every descendant of `psl up`, named by their command line (a
/// `psl` role by its subcommand, whatever the binary is called: `psl up` runs its own binary).
pub(super) fn roles(root: u32) -> Vec<Role> {
    let me = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "psl".into());
    let mut out = Vec::new();
    let mut todo = vec![root];
    while let Some(p) = todo.pop() {
        let kids = std::fs::read_to_string(format!("/proc/{p}/task/{p}/children")).unwrap_or_default();
        for k in kids.split_whitespace().filter_map(|k| k.parse::<u32>().ok()) {
            todo.push(k);
            let cmd = std::fs::read(format!("/proc/{k}/cmdline")).unwrap_or_default();
            let args: Vec<String> =
                cmd.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into()).collect();
            let exe = args.first().map(|a| a.rsplit('/').next().unwrap_or(a).to_string()).unwrap_or_default();
            let role = if exe == "psl" || exe == me { args.get(1).cloned().unwrap_or_default() } else { exe };
            let id = ["--id", "--rank"]
                .iter()
                .find_map(|f| args.iter().position(|a| a == f).and_then(|i| args.get(i + 1)))
                .map(|i| format!(" {i}"))
                .unwrap_or_default();
            // The role's memory budget: its --memory-budget-mb, or its kind's default.
            let budget_mb = args
                .iter()
                .position(|a| a == "--memory-budget-mb")
                .and_then(|i| args.get(i + 1)?.parse().ok())
                .or_else(|| psl::roles::RoleKind::of_subcommand(&role).map(|k| k.budget_mb_default()));
            out.push(Role { pid: k, name: format!("{role}{id}"), budget_mb });
        }
    }
    out
}

fn cpu_total(rs: &[Role]) -> f64 {
    rs.iter().map(|r| super::pid_cpu_seconds(r.pid)).sum()
}

/// Peak resident memory of a process, MiB.
fn hwm_mb(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    psl_node::memory::kib_field(&s, "VmHWM:").map_or(0.0, |kib| kib as f64 / 1024.0)
}

/// The processes' summed CPU rate while nothing drives them, ms per s: the median of five
/// 400 ms samples.
fn idle_cpu_ms_per_s(rs: &[Role]) -> f64 {
    let samples = (0..5)
        .map(|_| {
            let (t, c) = (Instant::now(), cpu_total(rs));
            std::thread::sleep(Duration::from_millis(400));
            (cpu_total(rs) - c) * 1000.0 / t.elapsed().as_secs_f64()
        })
        .collect();
    median(samples)
}

/// Waits until the processes are idle (CPU time over 500 ms at most 1.5 times the idle rate
/// `idle_ms_per_s` plus 10 ms); returns how long that took (ms), capped at 60 s.
fn drain_ms(rs: &[Role], idle_ms_per_s: f64) -> f64 {
    let idle_s = (idle_ms_per_s * 1.5 * 0.5 + 10.0) / 1000.0;
    let t0 = Instant::now();
    let mut window: std::collections::VecDeque<(Instant, f64)> = std::collections::VecDeque::new();
    loop {
        let now = Instant::now();
        window.push_back((now, cpu_total(rs)));
        while window.front().is_some_and(|(t, _)| now.duration_since(*t) > Duration::from_millis(500)) {
            window.pop_front();
        }
        if let (Some(a), Some(b)) = (window.front(), window.back()) {
            if b.0.duration_since(a.0) >= Duration::from_millis(450) && b.1 - a.1 <= idle_s {
                // Idle since the window's start.
                return a.0.duration_since(t0).as_secs_f64() * 1000.0;
            }
        }
        if t0.elapsed() > Duration::from_secs(60) {
            return 60_000.0;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A running `psl up` deployment.
struct Deployment {
    guard: ChildGuard,
    targets: Vec<SocketAddr>,
    /// The control interfaces of its coordinator and CapsuleDB: (role, address).
    controls: Vec<(&'static str, SocketAddr)>,
    /// The capsule servers' read interfaces (their `STATS`), by id.
    server_reads: Vec<SocketAddr>,
}

fn start_deployment(fabric: &str) -> Result<Deployment> {
    let (guard, kv) = start_up_kv(FRONT_ENDS, FRONT_END_MB, fabric)?;
    let controls = [("coordinator", kv.coordinator_control), ("capsuledb", kv.capsuledb_control)]
        .into_iter()
        .filter_map(|(r, a)| Some((r, a?)))
        .collect();
    Ok(Deployment { guard, targets: kv.front_ends, controls, server_reads: kv.server_reads })
}

/// The fabric counters of the coordinator's and CapsuleDB's nodes (`STATS` on their control
/// interfaces) and of the capsule servers (`STATS` on their read interfaces), named as the
/// front ends' are: `{role: {counter: value}}`. A server counts records it dropped on a full
/// inbound queue, repair requests it sent and records it served to others' repairs; it keeps
/// no count of outbound drops.
fn follower_counters(
    controls: &[(&'static str, SocketAddr)],
    server_reads: &[SocketAddr],
) -> Result<BTreeMap<String, BTreeMap<String, u64>>> {
    let mut out = BTreeMap::new();
    for (id, addr) in server_reads.iter().enumerate() {
        let role = format!("capsule server {id}");
        let v = psl_server::read::ReadClient::connect(*addr)
            .and_then(|mut c| c.stats())
            .with_context(|| format!("STATS of {role} ({addr})"))?;
        let get = |k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
        let m: BTreeMap<String, u64> = [
            ("repair_requests_sent", get("repair_requests_sent")),
            ("repair_records_sent", get("records_served")),
            ("inbound_dropped", get("in_dropped")),
            ("outbound_dropped", 0),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        out.insert(role, m);
    }
    for (role, addr) in controls {
        let mut c = psl_node::control::ControlClient::connect(*addr, Duration::from_secs(5))
            .with_context(|| format!("connecting to the {role}'s control interface {addr}"))?;
        let line = c.call("STATS").with_context(|| format!("STATS of the {role}"))?;
        let v: Value = serde_json::from_str(&line).with_context(|| format!("the {role}'s STATS: {line}"))?;
        let get = |k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
        let m: BTreeMap<String, u64> = [
            ("repair_requests_sent", get("repair_requests_sent")),
            ("repair_records_sent", get("repair_records_sent")),
            ("inbound_dropped", get("inbound_dropped")),
            ("outbound_dropped", get("fabric_dropped_send_full")),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        out.insert((*role).to_string(), m);
    }
    Ok(out)
}

/// What each follower counted between two snapshots.
fn follower_delta(
    before: &BTreeMap<String, BTreeMap<String, u64>>,
    after: &BTreeMap<String, BTreeMap<String, u64>>,
) -> BTreeMap<String, BTreeMap<String, u64>> {
    after
        .iter()
        .map(|(role, a)| {
            let b = before.get(role);
            let d = a
                .iter()
                .map(|(k, v)| (k.clone(), v.saturating_sub(b.and_then(|b| b.get(k)).copied().unwrap_or(0))))
                .collect();
            (role.clone(), d)
        })
        .collect()
}

/// Starts `psl up --workers 1 --servers 0 --memcached N` (the KV store as processes) on
/// `fabric` in a temporary directory; returns what stops it and its `kv` record (the front
/// ends' addresses, the coordinator's and CapsuleDB's control interfaces).
pub(super) fn start_up_kv(
    front_ends: u32,
    memory_mb: u64,
    fabric: &str,
) -> Result<(ChildGuard, psl::memcached::KvInfo)> {
    let (fe, mb) = (front_ends.to_string(), memory_mb.to_string());
    let args = ["--workers", "1", "--servers", "0", "--memcached", &fe, "--kv-memory-mb", &mb, "--fabric", fabric];
    let (guard, dir) = spawn_up(&args)?;
    let kv = psl::memcached::read_kv(&dir.join("cluster.json"))?;
    Ok((guard, kv))
}

/// Starts `psl up ARGS --dir TMP` (a fresh temporary directory) and waits for its ready line;
/// returns the guard that stops it and removes TMP, and TMP.
pub(super) fn spawn_up(args: &[&str]) -> Result<(ChildGuard, std::path::PathBuf)> {
    spawn_up_within(args, None)
}

/// As [`spawn_up`], but gives up (and stops `psl up`) if it has not reported ready within
/// `limit`.
pub(super) fn spawn_up_within(args: &[&str], limit: Option<Duration>) -> Result<(ChildGuard, std::path::PathBuf)> {
    let exe = psl::util::sibling_exe("psl")?;
    let dir = tempfile::Builder::new().prefix("psl-bench-up").tempdir()?;
    let path = dir.path().to_path_buf();
    let mut child = Command::new(exe)
        .arg("up")
        .args(args)
        .arg("--dir")
        .arg(&path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting psl up")?;
    let out = child.stdout.take().context("psl up's stdout")?;
    let guard = ChildGuard::new(child, Some(dir));
    // Read on a thread, so that a `psl up` that neither reports nor exits cannot hang the bench
    // (the thread ends when the guard stops it and its output closes).
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(std::io::BufReader::new(out).lines().map_while(Result::ok).any(|l| l.starts_with("up ")));
    });
    let up = match limit {
        Some(limit) => rx.recv_timeout(limit).unwrap_or(false),
        None => rx.recv().unwrap_or(false),
    };
    if !up {
        bail!(
            "psl up {} did not report ready{}",
            args.join(" "),
            limit.map(|l| format!(" within {l:?}")).unwrap_or_default()
        );
    }
    Ok((guard, path))
}

/// The fabric counters every front end reports in `stats` (the counters of its node).
const FRONT_END_COUNTERS: [&str; 8] = [
    "psl_repair_requests_sent",
    "psl_repair_records_sent",
    "psl_inbound_dropped",
    "psl_outbound_dropped",
    "psl_records_written",
    "psl_ops_written",
    "psl_flow_waits",
    "psl_flow_opened",
];

/// Each front end's [`FRONT_END_COUNTERS`], read with a memcached `stats` command.
fn front_end_counters(targets: &[SocketAddr]) -> Result<Vec<BTreeMap<String, u64>>> {
    targets
        .iter()
        .map(|t| {
            let (stats, complete) = psl::status::memcached_stats_named(*t, Duration::from_secs(5), &FRONT_END_COUNTERS)
                .with_context(|| format!("reading front end {t}'s stats"))?;
            if !complete {
                bail!("front end {t} closed its stats reply before END");
            }
            Ok(stats.into_iter().map(|(k, v)| (k, v.parse().unwrap_or(0))).collect())
        })
        .collect()
}

/// What the front ends counted between two snapshots, summed: `{counter: delta}`.
fn counters_delta(before: &[BTreeMap<String, u64>], after: &[BTreeMap<String, u64>]) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for (b, a) in before.iter().zip(after) {
        for k in FRONT_END_COUNTERS {
            let d = a.get(k).copied().unwrap_or(0).saturating_sub(b.get(k).copied().unwrap_or(0));
            *out.entry(k.trim_start_matches("psl_").to_string()).or_default() += d;
        }
    }
    out
}

fn spec(targets: &[SocketAddr], mix: Mix, d: Distribution, secs: f64, connections: usize) -> Spec {
    Spec {
        targets: targets.to_vec(),
        protocol: Protocol::Memcached,
        threads: CLIENT_THREADS,
        connections,
        keys: KEYS,
        value_bytes: VALUE_BYTES,
        distribution: d,
        mix,
        duration: Duration::from_secs_f64(secs),
        warmup: Duration::from_millis(300),
        ..Spec::default()
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        f64::NAN
    } else {
        v[v.len() / 2]
    }
}

pub fn run(secs: f64, cases: &[String], reps: usize, connections: Option<usize>, show_progress: bool) -> Result<Value> {
    let connections = connections.unwrap_or(CONNECTIONS).max(CLIENT_THREADS);
    let secs = secs.max(0.5);
    let fabrics: Vec<&str> =
        ["router", "nats"].into_iter().filter(|f| cases.is_empty() || cases.iter().any(|c| c == f)).collect();
    if fabrics.is_empty() {
        bail!("bench cluster cases are router, nats");
    }
    let mixes = [("a", Mix::read_update(0.5)), ("mix", Mix::read_update(0.9))];
    let dists = [Distribution::Uniform, Distribution::Zipfian];
    let steps = (fabrics.len() * (1 + mixes.len() * dists.len() * reps)) as u64;
    let pb = if show_progress { super::progress(steps, "bench cluster") } else { indicatif::ProgressBar::hidden() };

    let (mc_guard, mc_port) = super::memcached::start_memcached(1)?;
    let me = std::process::id();
    let mc: SocketAddr = ([127, 0, 0, 1], mc_port).into();
    let l = loadgen::load(&spec(&[mc], Mix::read_update(0.0), Distribution::Uniform, secs, CONNECTIONS))?;
    if l.errors > 0 {
        bail!("loading memcached: {} errors: {:?}", l.errors, l.first_error);
    }
    let mut out = Map::new();
    let mut detail = Map::new();
    for fabric in &fabrics {
        let dep = start_deployment(fabric)?;
        let rs = roles(dep.guard.pid());
        let idle = idle_cpu_ms_per_s(&rs);
        let l = loadgen::load(&spec(&dep.targets, Mix::read_update(0.0), Distribution::Uniform, secs, CONNECTIONS))
            .with_context(|| format!("loading the deployment on {fabric}"))?;
        if l.errors > 0 {
            bail!("loading the deployment on {fabric}: {} errors: {:?}", l.errors, l.first_error);
        }
        let load_drain = drain_ms(&rs, idle);
        let zero = vec![BTreeMap::new(); dep.targets.len()];
        let after_load = front_end_counters(&dep.targets)?;
        let followers_after_load = follower_counters(&dep.controls, &dep.server_reads)?;
        pb.inc(1);
        let mut runs = Vec::new();
        let mut cpu_by_role: BTreeMap<String, f64> = BTreeMap::new();
        let mut ops_all = 0u64;
        // CPU seconds of the load generator (this process) in the deployment's and memcached's
        // rounds, memcached's own, and memcached's operations.
        let (mut gen_psl, mut gen_mc, mut mc_cpu, mut mc_ops) = (0.0, 0.0, 0.0, 0u64);
        // Seconds runnable but waiting for a CPU, per role and memcached's (where latency
        // queues). The load generator's threads exit with each round, taking theirs along.
        let mut wait_by_role: BTreeMap<String, f64> = BTreeMap::new();
        let mut wait_mc = 0.0;
        for (mname, mix) in mixes {
            for d in dists {
                let (mut p, mut m, mut drains, mut p50, mut p99, mut mp50, mut mp99) =
                    (vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
                // p99 of reads and of updates, PSL then memcached: where the tail is.
                let mut tails: [Vec<f64>; 4] = Default::default();
                for _ in 0..reps {
                    let before: Vec<f64> = rs.iter().map(|r| super::pid_cpu_seconds(r.pid)).collect();
                    let g0 = super::pid_cpu_seconds(me);
                    let w0: Vec<f64> = rs.iter().map(|r| super::pid_runq_wait_seconds(r.pid)).collect();
                    let o = loadgen::run(&spec(&dep.targets, mix, d, secs, connections))?;
                    gen_psl += super::pid_cpu_seconds(me) - g0;
                    for (r, w) in rs.iter().zip(w0) {
                        *wait_by_role.entry(r.name.clone()).or_default() += super::pid_runq_wait_seconds(r.pid) - w;
                    }
                    if o.errors > 0 {
                        bail!("{fabric}, {mname}, {}: {} errors: {:?}", d.name(), o.errors, o.first_error);
                    }
                    drains.push(drain_ms(&rs, idle));
                    for (r, b) in rs.iter().zip(before) {
                        *cpu_by_role.entry(r.name.clone()).or_default() += super::pid_cpu_seconds(r.pid) - b;
                    }
                    ops_all += o.ops;
                    p.push(o.ops_per_s());
                    p50.push(o.quantile_us(0.5));
                    p99.push(o.quantile_us(0.99));
                    tails[0].push(o.quantile_us_of(false, 0.99));
                    tails[1].push(o.quantile_us_of(true, 0.99));
                    let (g0, m0) = (super::pid_cpu_seconds(me), super::pid_cpu_seconds(mc_guard.pid()));
                    let wm0 = super::pid_runq_wait_seconds(mc_guard.pid());
                    let om = loadgen::run(&spec(&[mc], mix, d, secs, connections))?;
                    gen_mc += super::pid_cpu_seconds(me) - g0;
                    mc_cpu += super::pid_cpu_seconds(mc_guard.pid()) - m0;
                    wait_mc += super::pid_runq_wait_seconds(mc_guard.pid()) - wm0;
                    mc_ops += om.ops;
                    m.push(om.ops_per_s());
                    mp50.push(om.quantile_us(0.5));
                    mp99.push(om.quantile_us(0.99));
                    tails[2].push(om.quantile_us_of(false, 0.99));
                    tails[3].push(om.quantile_us_of(true, 0.99));
                    pb.inc(1);
                }
                let (pm, mm) = (median(p.clone()), median(m.clone()));
                let key = format!("{fabric}_{mname}_{}", d.name());
                out.insert(format!("ops_per_s_{key}"), json!(pm));
                out.insert(format!("memcached_ops_per_s_{key}"), json!(mm));
                out.insert(format!("ratio_{key}"), json!(pm / mm.max(1e-9)));
                out.insert(format!("drain_ms_{key}"), json!(median(drains.clone())));
                runs.push(json!({
                    "mix": mname, "distribution": d.name(), "psl_ops_per_s": p, "memcached_ops_per_s": m,
                    "psl_p50_us": median(p50), "psl_p99_us": median(p99),
                    "memcached_p50_us": median(mp50), "memcached_p99_us": median(mp99), "drain_ms": drains,
                    "psl_p99_get_us": median(tails[0].clone()), "psl_p99_set_us": median(tails[1].clone()),
                    "memcached_p99_get_us": median(tails[2].clone()), "memcached_p99_set_us": median(tails[3].clone()),
                }));
            }
        }
        let roles_json: Vec<Value> = rs
            .iter()
            .map(|r| {
                let cpu = cpu_by_role.get(&r.name).copied().unwrap_or(0.0);
                let wait = wait_by_role.get(&r.name).copied().unwrap_or(0.0);
                let rss = hwm_mb(r.pid);
                json!({"role": r.name, "rss_mb_max": rss, "budget_mb": r.budget_mb,
                       "within_budget": r.budget_mb.map(|b| rss <= b as f64),
                       "cpu_s_per_1000_ops": cpu * 1000.0 / ops_all.max(1) as f64,
                       "runq_wait_s_per_1000_ops": wait * 1000.0 / ops_all.max(1) as f64})
            })
            .collect();
        let us_per_op = |cpu_s: f64, ops: u64| cpu_s * 1e6 / ops.max(1) as f64;
        let psl_roles_cpu: f64 = cpu_by_role.values().sum();
        let cpu_us = json!({
            "psl_roles": us_per_op(psl_roles_cpu, ops_all),
            "load_generator_with_psl": us_per_op(gen_psl, ops_all),
            "memcached": us_per_op(mc_cpu, mc_ops),
            "load_generator_with_memcached": us_per_op(gen_mc, mc_ops),
        });
        // Run-queue waits per op: a closed loop's latency tail on a saturated machine.
        out.insert(
            format!("runq_wait_us_per_op_{fabric}"),
            json!({
                "psl_roles": us_per_op(wait_by_role.values().sum(), ops_all),
                "memcached": us_per_op(wait_mc, mc_ops),
            }),
        );
        let bound = (us_per_op(mc_cpu, mc_ops) + us_per_op(gen_mc, mc_ops))
            / (us_per_op(psl_roles_cpu, ops_all) + us_per_op(gen_psl, ops_all)).max(1e-9);
        out.insert(format!("ratio_cpu_bound_{fabric}"), json!(bound));
        let rss_max = rs.iter().map(|r| hwm_mb(r.pid)).fold(0.0, f64::max);
        out.insert(format!("rss_mb_max_{fabric}"), json!(rss_max));
        // Every psl role's peak against its own budget (nats-server has none of ours).
        let over: Vec<&str> = rs
            .iter()
            .filter(|r| r.budget_mb.is_some_and(|b| hwm_mb(r.pid) > b as f64))
            .map(|r| r.name.as_str())
            .collect();
        out.insert(format!("roles_over_budget_{fabric}"), json!(over));
        // Steady state: the measured rounds, after the initial load (reported apart).
        let at_end = front_end_counters(&dep.targets)?;
        let steady = counters_delta(&after_load, &at_end);
        let followers_steady =
            follower_delta(&followers_after_load, &follower_counters(&dep.controls, &dep.server_reads)?);
        // Front ends, coordinator, CapsuleDB and capsule servers together.
        let sum = |k: &str| {
            steady.get(k).copied().unwrap_or(0)
                + followers_steady.values().map(|m| m.get(k).copied().unwrap_or(0)).sum::<u64>()
        };
        out.insert(format!("records_dropped_{fabric}"), json!(sum("inbound_dropped") + sum("outbound_dropped")));
        out.insert(format!("repair_requests_{fabric}"), json!(sum("repair_requests_sent")));
        // How well the front ends batched sets in steady state, and how often the servers'
        // acks held a set back (flow control).
        let (records, ops) =
            (steady.get("records_written").copied().unwrap_or(0), steady.get("ops_written").copied().unwrap_or(0));
        out.insert(format!("ops_per_record_{fabric}"), json!(ops as f64 / records.max(1) as f64));
        out.insert(format!("flow_waits_{fabric}"), json!(steady.get("flow_waits").copied().unwrap_or(0)));
        detail.insert(
            (*fabric).into(),
            json!({"roles": roles_json, "runs": runs, "load_ops_per_s": l.ops_per_s(), "load_drain_ms": load_drain,
                   "idle_cpu_ms_per_s": idle, "front_ends_steady": steady, "cpu_us_per_op": cpu_us,
                   "front_ends_during_load": counters_delta(&zero, &after_load),
                   "followers_steady": followers_steady, "followers_during_load": followers_after_load}),
        );
        drop(dep);
    }
    pb.finish_and_clear();
    let headline = fabrics.first().copied().unwrap_or("router");
    for name in ["a", "mix"] {
        for what in ["ops_per_s", "ratio", "drain_ms"] {
            let v = out.get(&format!("{what}_{headline}_{name}_uniform")).cloned().unwrap_or(Value::Null);
            out.insert(format!("{what}_{name}"), v);
        }
    }
    out.insert("headline_fabric".into(), json!(headline));
    out.insert("goals".into(), json!({"ratio_a": 0.7, "ratio_mix": 0.8, "drain_ms": 1000, "rss_mb_max": ROLE_MB_MAX}));
    out.insert(
        "load".into(),
        json!({"keys": KEYS, "value_bytes": VALUE_BYTES, "connections": connections, "client_threads": CLIENT_THREADS,
               "seconds_per_round": secs, "rounds": reps, "front_ends": FRONT_ENDS, "front_end_memory_mb": FRONT_END_MB}),
    );
    out.insert("detail".into(), Value::Object(detail));
    out.insert("machine".into(), super::machine());
    Ok(Value::Object(out))
}

/// How long the shard sweep waits for `psl up` to report ready.
const UP_TIME_MAX: Duration = Duration::from_secs(180);
/// Most shards `psl up --shards` starts.
const SHARDS_MAX: u16 = 16;
/// The kinds of role whose memory the shard sweep's goal bounds (the others are the FaaS roles
/// that `psl up` runs beside the KV store).
const KV_KINDS: [&str; 5] = ["front_end", "capsule_server", "capsuledb", "coordinator", "router"];
/// A ratio against the smallest shard count above this counts as growth (`grew`).
const GROWTH_TOLERANCE: f64 = 1.1;

/// What the shard sweep reads from each front end's `stats`: the payload bytes its node received
/// from the fabric, the commands it ran (a command forwarded to another shard is run, and
/// counted, there), what it forwarded and served for other shards, and how its writer batched
/// sets (ops per record: the acks and control messages it receives come per record and per
/// epoch, not per op).
const SHARD_STATS: [&str; 8] = [
    "psl_fabric_received_bytes",
    "cmd_get",
    "cmd_set",
    "shard_forwarded",
    "shard_served",
    "shard_forward_failures",
    "psl_records_written",
    "psl_ops_written",
];

/// Each front end's `names` from its `stats`, as numbers; an error if one is missing.
fn front_end_stats(targets: &[SocketAddr], names: &[&str]) -> Result<Vec<BTreeMap<String, u64>>> {
    targets
        .iter()
        .map(|t| {
            let (stats, complete) = psl::status::memcached_stats_named(*t, Duration::from_secs(5), names)
                .with_context(|| format!("reading front end {t}'s stats"))?;
            if !complete {
                bail!("front end {t} closed its stats reply before END");
            }
            if let Some(k) = names.iter().find(|k| !stats.contains_key(**k)) {
                bail!("front end {t}'s stats have no {k} (a psl binary older than this bench?)");
            }
            Ok(stats.into_iter().map(|(k, v)| (k, v.parse().unwrap_or(0))).collect())
        })
        .collect()
}

/// The kind of a role, by its subcommand (the first word of [`Role::name`]): the KV store's as
/// [`KV_KINDS`] names them, the others by their subcommand.
fn role_kind(r: &Role) -> String {
    match r.name.split(' ').next().unwrap_or("") {
        "memcached" => "front_end".into(),
        "capsule-server" => "capsule_server".into(),
        "capsuledb" => "capsuledb".into(),
        "coordinator" => "coordinator".into(),
        "router" => "router".into(),
        other => other.replace('-', "_"),
    }
}

/// The names `psl up` gave its processes (`pids` of its cluster file: `kv shard 1 capsule
/// server 0`, `shard 1 memcached 1`, …), by pid.
fn process_names(dir: &std::path::Path) -> BTreeMap<u32, String> {
    let v: Value = std::fs::read_to_string(dir.join("cluster.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    let pids = v.get("pids").and_then(Value::as_array).cloned().unwrap_or_default();
    pids.iter()
        .filter_map(|p| Some((u32::try_from(p.get(1)?.as_u64()?).ok()?, p.get(0)?.as_str()?.to_string())))
        .collect()
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        f64::NAN
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

fn max_of(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NAN, f64::max)
}

/// One point of the shard sweep: `psl up --shards n --memcached 1` loaded, then `reps` rounds
/// of the `a` mix over every front end; its figures (see [`run_shards`]).
fn shard_point(n: u16, secs: f64, reps: usize, connections: usize, pb: &indicatif::ProgressBar) -> Result<Value> {
    let (shards, mb) = (n.to_string(), FRONT_END_MB.to_string());
    let args = [
        "--workers",
        "1",
        "--servers",
        "0",
        "--shards",
        &shards,
        "--memcached",
        "1",
        "--kv-memory-mb",
        &mb,
        "--fabric",
        "router",
    ];
    let (guard, dir) = spawn_up_within(&args, Some(UP_TIME_MAX))?;
    let kv = psl::memcached::read_kv(&dir.join("cluster.json"))?;
    let by_shard: Vec<Vec<SocketAddr>> =
        if kv.shard_front_ends.is_empty() { vec![kv.front_ends.clone()] } else { kv.shard_front_ends.clone() };
    if by_shard.len() != usize::from(n) || by_shard.iter().any(Vec::is_empty) {
        bail!("psl up --shards {n} listed the front ends of {} shards: {by_shard:?}", by_shard.len());
    }
    let targets: Vec<SocketAddr> = by_shard.concat();
    let shard_of: Vec<usize> = by_shard.iter().enumerate().flat_map(|(s, f)| std::iter::repeat_n(s, f.len())).collect();
    let names = process_names(&dir);
    let rs = roles(guard.pid());
    let kinds: Vec<String> = rs.iter().map(role_kind).collect();
    let idle = idle_cpu_ms_per_s(&rs);
    let l = loadgen::load(&spec(&targets, Mix::read_update(0.0), Distribution::Uniform, secs, CONNECTIONS))
        .with_context(|| format!("loading {n} shards"))?;
    if l.errors > 0 {
        bail!("loading {n} shards: {} errors: {:?}", l.errors, l.first_error);
    }
    let load_drain = drain_ms(&rs, idle);
    pb.inc(1);

    // The rounds and their drains: the roles' CPU and the front ends' counters around them all.
    let me = std::process::id();
    let stats0 = front_end_stats(&targets, &SHARD_STATS)?;
    let cpu0: Vec<f64> = rs.iter().map(|r| super::pid_cpu_seconds(r.pid)).collect();
    let (mut ops, mut gen_cpu, mut wall) = (0u64, 0.0, 0.0);
    let (mut tput, mut p50, mut p99, mut drains) = (vec![], vec![], vec![], vec![]);
    for _ in 0..reps {
        let t0 = Instant::now();
        let g0 = super::pid_cpu_seconds(me);
        let o = loadgen::run(&spec(&targets, Mix::read_update(0.5), Distribution::Uniform, secs, connections))?;
        gen_cpu += super::pid_cpu_seconds(me) - g0;
        if o.errors > 0 {
            bail!("{n} shards, a, uniform: {} errors: {:?}", o.errors, o.first_error);
        }
        drains.push(drain_ms(&rs, idle));
        wall += t0.elapsed().as_secs_f64();
        ops += o.ops;
        tput.push(o.ops_per_s());
        p50.push(o.quantile_us(0.5));
        p99.push(o.quantile_us(0.99));
        pb.inc(1);
    }
    let cpu: Vec<f64> = rs.iter().zip(&cpu0).map(|(r, c)| super::pid_cpu_seconds(r.pid) - c).collect();
    let stats1 = front_end_stats(&targets, &SHARD_STATS)?;
    let rss: Vec<f64> = rs.iter().map(|r| hwm_mb(r.pid)).collect();
    drop(guard);

    let delta = |i: usize, k: &str| {
        stats1[i].get(k).copied().unwrap_or(0).saturating_sub(stats0[i].get(k).copied().unwrap_or(0))
    };
    let ran: Vec<u64> = (0..targets.len()).map(|i| delta(i, "cmd_get") + delta(i, "cmd_set")).collect();
    let commands: u64 = ran.iter().sum();
    let received: Vec<u64> = (0..targets.len()).map(|i| delta(i, "psl_fabric_received_bytes")).collect();
    let per_op: Vec<f64> = received.iter().map(|b| *b as f64 / commands.max(1) as f64).collect();
    let per_own_op: Vec<f64> = received.iter().zip(&ran).map(|(b, c)| *b as f64 / (*c).max(1) as f64).collect();
    // Per record its writer sealed: the servers' acks and the epochs' messages come per record
    // (and per unit of time), so fewer ops per record means more bytes per op.
    let per_record: Vec<f64> =
        (0..targets.len()).map(|i| received[i] as f64 / delta(i, "psl_records_written").max(1) as f64).collect();
    // And per second of the rounds and their drains: a writer seals at its seal interval,
    // whatever share of the ops it has.
    let per_s: Vec<f64> = received.iter().map(|b| *b as f64 / wall.max(1e-9)).collect();
    let sum = |k: &str| (0..targets.len()).map(|i| delta(i, k)).sum::<u64>();
    let by_front_end: Vec<Value> = (0..targets.len())
        .map(|i| {
            json!({"shard": shard_of[i], "addr": targets[i].to_string(), "received_bytes": received[i],
                   "commands_run": ran[i], "bytes_per_op": per_op[i], "bytes_per_own_op": per_own_op[i],
                   "bytes_per_record": per_record[i], "bytes_per_s": per_s[i], "records_written": delta(i, "psl_records_written"),
                   "shard_forwarded": delta(i, "shard_forwarded"), "shard_served": delta(i, "shard_served")})
        })
        .collect();

    let us_per_op = |cpu_s: f64| cpu_s * 1e6 / ops.max(1) as f64;
    let mut cpu_by_kind: BTreeMap<String, f64> = BTreeMap::new();
    let mut rss_by_kind: BTreeMap<String, f64> = BTreeMap::new();
    let mut count_by_kind: BTreeMap<String, u64> = BTreeMap::new();
    for ((k, c), m) in kinds.iter().zip(&cpu).zip(&rss) {
        *cpu_by_kind.entry(k.clone()).or_default() += us_per_op(*c);
        let e = rss_by_kind.entry(k.clone()).or_default();
        *e = e.max(*m);
        *count_by_kind.entry(k.clone()).or_default() += 1;
    }
    let roles_json: Vec<Value> = rs
        .iter()
        .enumerate()
        .map(|(i, r)| {
            json!({"role": names.get(&r.pid).cloned().unwrap_or_else(|| r.name.clone()), "kind": kinds[i],
                   "rss_mb_max": rss[i], "budget_mb": r.budget_mb, "cpu_us_per_op": us_per_op(cpu[i])})
        })
        .collect();
    Ok(json!({
        "shards": n, "front_ends": targets.len(), "processes": rs.len(), "processes_by_kind": count_by_kind,
        "ops_per_s": median(tput.clone()), "ops_per_s_rounds": tput, "p50_us": median(p50), "p99_us": median(p99),
        "ops_measured": ops, "commands_run": commands,
        "cpu_us_per_op": us_per_op(cpu.iter().sum()), "cpu_us_per_op_by_kind": cpu_by_kind,
        "load_generator_cpu_us_per_op": us_per_op(gen_cpu),
        "idle_cpu_ms_per_s": idle, "idle_cpu_us_per_op": us_per_op(idle / 1000.0 * wall),
        "bytes_per_op_front_end_mean": mean(&per_op), "bytes_per_op_front_end_max": max_of(&per_op),
        "bytes_per_own_op_front_end_mean": mean(&per_own_op), "bytes_per_own_op_front_end_max": max_of(&per_own_op),
        "bytes_per_record_front_end_mean": mean(&per_record), "bytes_per_record_front_end_max": max_of(&per_record),
        "bytes_per_s_front_end_mean": mean(&per_s), "bytes_per_s_front_end_max": max_of(&per_s),
        "memory_max_mb_by_kind": rss_by_kind,
        "shard_forwarded": sum("shard_forwarded"), "shard_served": sum("shard_served"),
        "shard_forward_failures": sum("shard_forward_failures"),
        "ops_per_record": sum("psl_ops_written") as f64 / sum("psl_records_written").max(1) as f64,
        "drain_ms": drains, "load_ops_per_s": l.ops_per_s(), "load_drain_ms": load_drain,
        "by_front_end": by_front_end, "roles": roles_json,
    }))
}

/// `psl bench cluster --shards LIST`: the shard sweep (see the module docs). Each round is
/// `secs` long; `reps` rounds per shard count.
pub fn run_shards(
    secs: f64,
    shard_counts: &[u16],
    reps: usize,
    connections: Option<usize>,
    show_progress: bool,
) -> Result<Value> {
    let connections = connections.unwrap_or(CONNECTIONS).max(CLIENT_THREADS);
    let (secs, reps) = (secs.max(0.5), reps.max(1));
    let mut counts = shard_counts.to_vec();
    counts.sort_unstable();
    counts.dedup();
    if counts.is_empty() || counts.iter().any(|n| !(1..=SHARDS_MAX).contains(n)) {
        bail!("--shards takes shard counts from 1 to {SHARDS_MAX}, e.g. 1,2,4");
    }
    let base = counts[0];
    let pb = if show_progress {
        super::progress((counts.len() * (1 + reps)) as u64, "bench cluster --shards")
    } else {
        indicatif::ProgressBar::hidden()
    };
    let mut points = Map::new();
    for &n in &counts {
        pb.set_message(format!("{n} shards"));
        points.insert(n.to_string(), shard_point(n, secs, reps, connections, &pb)?);
    }
    pb.finish_and_clear();

    let mut out = Map::new();
    let fig = |n: u16, path: &[&str]| -> f64 {
        let mut v = &points[&n.to_string()];
        for p in path {
            v = &v[*p];
        }
        v.as_f64().unwrap_or(f64::NAN)
    };
    // Headline figures per shard count, then each as a ratio against the smallest count.
    let mut figures: Vec<(String, Vec<&str>)> = [
        "ops_per_s",
        "p50_us",
        "p99_us",
        "cpu_us_per_op",
        "bytes_per_op_front_end_mean",
        "bytes_per_op_front_end_max",
        "bytes_per_own_op_front_end_max",
        "bytes_per_record_front_end_max",
        "bytes_per_s_front_end_max",
        "ops_per_record",
        "shard_forwarded",
    ]
    .into_iter()
    .map(|f| (f.to_string(), vec![f]))
    .collect();
    for k in KV_KINDS {
        figures.push((format!("memory_max_{k}"), vec!["memory_max_mb_by_kind", k]));
    }
    let mut grew = Vec::new();
    for &n in &counts {
        for (name, path) in &figures {
            out.insert(format!("{name}_{n}"), json!(fig(n, path)));
        }
        if n == base {
            continue;
        }
        for (name, path) in &figures {
            if name == "shard_forwarded" {
                continue;
            }
            // `bytes_per_op_front_end_ratio_*`, `bytes_per_own_op_front_end_ratio_*` and
            // `bytes_per_record_front_end_ratio_*`, `bytes_per_s_front_end_ratio_*`: of the max
            // over the front ends.
            let short = name.strip_suffix("_max").filter(|s| s.starts_with("bytes_")).unwrap_or(name);
            let key = format!("{short}_ratio_{n}_over_{base}");
            let r = fig(n, path) / fig(base, path);
            let goal = short == "bytes_per_op_front_end" || short.starts_with("memory_max_");
            if goal && r > GROWTH_TOLERANCE {
                grew.push(key.clone());
            }
            out.insert(key, json!(r));
        }
    }
    out.insert("shard_counts".into(), json!(counts));
    out.insert("grew".into(), json!(grew));
    out.insert(
        "goals".into(),
        json!({"bytes_per_op_front_end_ratio_max": 1.0, "memory_max_ratio_max": 1.0,
               "tolerance": GROWTH_TOLERANCE,
               "note": "bytes each front end receives per operation and each role's memory do not grow with the shard count; on 2 cores throughput cannot grow"}),
    );
    out.insert(
        "load".into(),
        json!({"mix": "a", "distribution": "uniform", "keys": KEYS, "value_bytes": VALUE_BYTES,
               "connections": connections, "client_threads": CLIENT_THREADS, "seconds_per_round": secs, "rounds": reps,
               "front_ends_per_shard": 1, "front_end_memory_mb": FRONT_END_MB, "fabric": "router"}),
    );
    out.insert("by_shards".into(), Value::Object(points));
    out.insert("machine".into(), super::machine());
    Ok(Value::Object(out))
}

/// The shard sweep's result ([`run_shards`]) as a table.
pub fn shards_table(v: &Value) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let f = |x: &Value| x.as_f64().unwrap_or(f64::NAN);
    let _ = writeln!(
        s,
        "{:>6} {:>5} {:>9} {:>7} {:>7} {:>8} {:>9} {:>9} {:>9} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>7} {:>9}",
        "shards",
        "procs",
        "ops/s",
        "p50 µs",
        "p99 µs",
        "µs/op",
        "B/op mean",
        "B/op max",
        "B/own op",
        "B/rec",
        "KiB/s",
        "FE MiB",
        "CS MiB",
        "DB MiB",
        "Co MiB",
        "Ro MiB",
        "ops/rec",
        "forwarded"
    );
    let empty = Map::new();
    // In the order of the shard counts (the object's keys sort as strings).
    let points: Vec<&Value> = v["shard_counts"]
        .as_array()
        .map(|a| a.iter().filter_map(|n| v["by_shards"].get(n.to_string())).collect())
        .unwrap_or_default();
    for p in &points {
        let m = &p["memory_max_mb_by_kind"];
        let _ = writeln!(
            s,
            "{:>6} {:>5} {:>9.0} {:>7.0} {:>7.0} {:>8.1} {:>9.1} {:>9.1} {:>9.1} {:>6.0} {:>6.0} {:>6.0} {:>6.0} {:>6.0} {:>6.0} {:>6.0} {:>7.1} {:>9}",
            p["shards"].as_u64().unwrap_or(0),
            p["processes"].as_u64().unwrap_or(0),
            f(&p["ops_per_s"]),
            f(&p["p50_us"]),
            f(&p["p99_us"]),
            f(&p["cpu_us_per_op"]),
            f(&p["bytes_per_op_front_end_mean"]),
            f(&p["bytes_per_op_front_end_max"]),
            f(&p["bytes_per_own_op_front_end_max"]),
            f(&p["bytes_per_record_front_end_max"]),
            f(&p["bytes_per_s_front_end_max"]) / 1024.0,
            f(&m["front_end"]),
            f(&m["capsule_server"]),
            f(&m["capsuledb"]),
            f(&m["coordinator"]),
            f(&m["router"]),
            f(&p["ops_per_record"]),
            p["shard_forwarded"].as_u64().unwrap_or(0)
        );
    }
    let _ = writeln!(s, "\nCPU µs per op by kind of role:");
    for p in &points {
        let by: Vec<String> = p["cpu_us_per_op_by_kind"]
            .as_object()
            .unwrap_or(&empty)
            .iter()
            .map(|(k, x)| format!("{k} {:.1}", f(x)))
            .collect();
        let _ = writeln!(s, "  {} shards: {}", p["shards"], by.join(", "));
    }
    let _ = writeln!(s, "\nratios against the smallest shard count:");
    if let Some(o) = v.as_object() {
        for (k, x) in o.iter().filter(|(k, _)| k.contains("_ratio_")) {
            let _ = writeln!(s, "  {k} {:.2}", f(x));
        }
    }
    let _ = writeln!(s, "grew (goal figures above {GROWTH_TOLERANCE}): {}", v["grew"]);
    s
}

/// A child process stopped on drop (SIGTERM, then SIGKILL after 5 s), with a directory that
/// goes with it.
pub(super) struct ChildGuard {
    child: Child,
    _dir: Option<tempfile::TempDir>,
}

impl ChildGuard {
    pub(super) fn new(child: Child, dir: Option<tempfile::TempDir>) -> ChildGuard {
        ChildGuard { child, _dir: dir }
    }

    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child, not yet reaped (its pid cannot have been reused).
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_group_by_kind() {
        let r = |name: &str| Role { pid: 1, name: name.into(), budget_mb: None };
        assert_eq!(role_kind(&r("memcached")), "front_end");
        assert_eq!(role_kind(&r("capsule-server 2")), "capsule_server");
        assert_eq!(role_kind(&r("capsuledb")), "capsuledb");
        assert_eq!(role_kind(&r("coordinator")), "coordinator");
        assert_eq!(role_kind(&r("router")), "router");
        assert_eq!(role_kind(&r("coordinator-host 1")), "coordinator_host");
    }

    #[test]
    fn shard_table_follows_the_counts() {
        let point = |n: u64| {
            json!({"shards": n, "processes": 7 * n, "ops_per_s": 1000.0, "p50_us": 1.0, "p99_us": 2.0,
                   "cpu_us_per_op": 100.0, "bytes_per_op_front_end_mean": 10.0, "bytes_per_op_front_end_max": 11.0,
                   "bytes_per_own_op_front_end_max": 12.0, "memory_max_mb_by_kind": {"front_end": 50.0},
                   "shard_forwarded": 0, "cpu_us_per_op_by_kind": {"front_end": 40.0}})
        };
        let v = json!({"shard_counts": [2, 16], "by_shards": {"16": point(16), "2": point(2)}, "grew": [],
                       "ops_per_s_ratio_16_over_2": 1.0});
        let t = shards_table(&v);
        let (two, sixteen) = (t.find("  2 shards").unwrap(), t.find("  16 shards").unwrap());
        assert!(two < sixteen, "{t}");
        assert!(t.contains("ops_per_s_ratio_16_over_2 1.00"), "{t}");
    }
}
