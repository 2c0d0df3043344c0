//! `psl bench idle`: what an idle deployment costs, all roles together (issue 35's goal: at
//! most 20 ms of CPU per second).
//!
//! The deployment is `psl up --workers 1 --kv --memcached 3` (the job side: router, capsule
//! hosts, coordinator hosts, scheduler, leader, a worker; the KV side: coordinator, three
//! capsule servers, CapsuleDB, three SecureCached front ends), left alone: no client, no job.
//! After `--settle-s` (default 20 s: start-up traffic ends, and every back-off of the idle
//! paths, epochs, heads hints, certificate announcements, re-acks, reaches its longest wait),
//! the benchmark sums the CPU time of every thread of every process of the deployment
//! (`/proc/PID/task/TID/schedstat`, in nanoseconds: the 10 ms ticks of `stat` are too coarse
//! for a few ms per second) and their context switches over the measured span
//! (`--seconds` × 10, default 10 s), in `--reps` rounds.
//!
//! The baseline, in the same rounds: Debian's memcached (one worker thread), idle too. It is
//! what a store that does nothing while nobody asks costs on this machine; its figure says how
//! much of the measurement is the machine's own noise.
//!
//! Headline: `idle_ms_per_s` (the median round), `goal_ms_per_s` (20) and `met`. Per role:
//! CPU and switches per second; and the busiest threads, which say where what is left goes.

use super::cluster::{roles, spawn_up, Role};
use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The goal: an idle deployment's CPU, all roles together.
const GOAL_MS_PER_S: f64 = 20.0;
/// The busiest threads reported.
const TOP_THREADS: usize = 12;

/// One thread's CPU (ns) and context switches (voluntary and not) so far.
#[derive(Debug, Clone, Copy, Default)]
struct Usage {
    cpu_ns: u64,
    switches: u64,
}

/// Every thread of `pid`: `(name, usage)` by thread id.
fn threads(pid: u32) -> BTreeMap<u32, (String, Usage)> {
    let mut out = BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return out };
    for t in tasks.filter_map(|t| t.ok()) {
        let Some(tid) = t.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let dir = t.path();
        let cpu_ns = std::fs::read_to_string(dir.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        let status = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
        let field = |k: &str| -> u64 {
            status.lines().find_map(|l| l.strip_prefix(k)).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
        };
        let switches = field("voluntary_ctxt_switches:") + field("nonvoluntary_ctxt_switches:");
        let name = std::fs::read_to_string(dir.join("comm")).unwrap_or_default().trim().to_string();
        out.insert(tid, (name, Usage { cpu_ns, switches }));
    }
    out
}

/// A snapshot of every thread of the processes: by (pid, tid).
fn snapshot(procs: &[Role]) -> BTreeMap<(u32, u32), (String, Usage)> {
    procs.iter().flat_map(|p| threads(p.pid).into_iter().map(move |(tid, v)| ((p.pid, tid), v))).collect()
}

/// What one measured span found: per role and per thread, CPU ms and switches per second.
struct Span {
    roles: BTreeMap<String, (f64, f64)>,
    threads: Vec<(String, String, f64, f64)>,
    total_ms_per_s: f64,
    switches_per_s: f64,
}

fn measure(procs: &[Role], span: Duration) -> Span {
    let name_of: BTreeMap<u32, &str> = procs.iter().map(|p| (p.pid, p.name.as_str())).collect();
    let (a, t0) = (snapshot(procs), Instant::now());
    std::thread::sleep(span);
    let (b, secs) = (snapshot(procs), t0.elapsed().as_secs_f64());
    let mut roles: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    let mut threads = Vec::new();
    for ((pid, tid), (name, u)) in &b {
        // A thread born during the span counts from zero; one that died is not seen (its
        // process's CPU is in `stat`, but the idle roles do not start threads when idle).
        let before = a.get(&(*pid, *tid)).map(|x| x.1).unwrap_or_default();
        let ms = u.cpu_ns.saturating_sub(before.cpu_ns) as f64 / 1e6 / secs;
        let sw = u.switches.saturating_sub(before.switches) as f64 / secs;
        let role = name_of.get(pid).copied().unwrap_or("?").to_string();
        let e = roles.entry(role.clone()).or_default();
        e.0 += ms;
        e.1 += sw;
        threads.push((role, name.clone(), ms, sw));
    }
    threads.sort_by(|x, y| y.2.total_cmp(&x.2));
    let total_ms_per_s = roles.values().map(|v| v.0).sum();
    let switches_per_s = roles.values().map(|v| v.1).sum();
    Span { roles, threads, total_ms_per_s, switches_per_s }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

pub fn run(span_s: f64, settle_s: f64, reps: usize, show_progress: bool) -> Result<Value> {
    let reps = reps.max(1);
    let span = Duration::from_secs_f64(span_s.max(1.0));
    let pb =
        if show_progress { super::progress(1 + reps as u64, "bench idle") } else { indicatif::ProgressBar::hidden() };
    let (mc, _) = super::memcached::start_memcached(1)?;
    let (up, _dir) = spawn_up(&["--workers", "1", "--kv", "--memcached", "3"])?;
    pb.set_message(format!("settling {settle_s} s"));
    std::thread::sleep(Duration::from_secs_f64(settle_s.max(0.0)));
    pb.inc(1);
    let mut procs = roles(up.pid());
    if procs.is_empty() {
        bail!("psl up has no child processes");
    }
    // `psl up` itself supervises the others.
    procs.push(Role { pid: up.pid(), name: "up".into(), budget_mb: None });
    let memcached = [Role { pid: mc.pid(), name: "memcached".into(), budget_mb: None }];
    let mut rounds = Vec::new();
    let mut baselines = Vec::new();
    for r in 0..reps {
        pb.set_message(format!("round {} of {reps}", r + 1));
        // The two are measured over the same span, in one pass each.
        let base = std::thread::scope(|s| {
            let h = s.spawn(|| measure(&memcached, span));
            let m = measure(&procs, span);
            (m, h.join())
        });
        let (m, b) = base;
        let b = b.map_err(|_| anyhow::anyhow!("the baseline's measuring thread panicked"))?;
        baselines.push(b.total_ms_per_s);
        rounds.push(m);
        pb.inc(1);
    }
    pb.finish_and_clear();
    let totals: Vec<f64> = rounds.iter().map(|m| m.total_ms_per_s).collect();
    let idle = median(totals.clone());
    // The round nearest the median gives the per-role and per-thread figures.
    let mid = rounds
        .iter()
        .min_by(|a, b| (a.total_ms_per_s - idle).abs().total_cmp(&(b.total_ms_per_s - idle).abs()))
        .context("no round")?;
    let mut role_map = Map::new();
    for (name, (ms, sw)) in &mid.roles {
        role_map.insert(name.clone(), json!({"cpu_ms_per_s": round2(*ms), "switches_per_s": round2(*sw)}));
    }
    let top: Vec<Value> = mid
        .threads
        .iter()
        .take(TOP_THREADS)
        .map(|(r, t, ms, sw)| json!({"role": r, "thread": t, "cpu_ms_per_s": round2(*ms), "switches_per_s": round2(*sw)}))
        .collect();
    Ok(json!({
        "bench": "idle",
        "deployment": "psl up --workers 1 --kv --memcached 3",
        "processes": procs.len(),
        "settle_s": settle_s,
        "span_s": span.as_secs_f64(),
        "reps": reps,
        "idle_ms_per_s": round2(idle),
        "idle_ms_per_s_rounds": totals.iter().map(|x| round2(*x)).collect::<Vec<_>>(),
        "switches_per_s": round2(mid.switches_per_s),
        "goal_ms_per_s": GOAL_MS_PER_S,
        "met": idle <= GOAL_MS_PER_S,
        "memcached_idle_ms_per_s": round2(median(baselines)),
        "roles": role_map,
        "top_threads": top,
    }))
}
