//! `psl bench NAME [--json]`: benchmarks. Each prints one JSON object with `--json`, and runs
//! its baseline in the same run, so that its headline figure is a ratio that a noisy machine
//! reproduces. `psl report` runs them all (each as a child `psl-tools bench NAME --json`) and turns
//! the objects into plots and tables (`crate::report`).
//!
//! | name | what | baseline in the same run | report section |
//! | --- | --- | --- | --- |
//! | `capsule` | seal+sign / verify+open per op by batch size | bare sign and verify | `capsule` |
//! | `scl` | SCL puts by writer nodes (`u1..u8`: unbatched), gets, ring crossing | one op per record | `scl`, `ring` |
//! | `replication` | puts by writer nodes, with and without 3 capsule servers | non-durable | `replication` |
//! | `replication --cases big-store` | a capsule server process on a store of `--records` (10M): its memory, reads/s from a cold index | a store of 100,000 records | — |
//! | `launch` | launch time and its phases, embedded and `psl up` | bare sandbox start | `launch` |
//! | `capsuledb` | cached / uncached gets by lambdas; the LSM alone | fjall | `capsuledb` |
//! | `memcached` | `psl memcached` under memcaslap | memcached | `memcached` |
//! | `http` | the HTTPS KV API (signed requests and answers), gets and puts; connect + verify | the memcached protocol on the same front end | — |
//! | `rrt` | `examples/rrt.js` time to a target path cost by lambdas | bare sandbox, plain map | `rrt` |
//! | `ycsb` | YCSB A, B, C, D, F against memcached-protocol endpoints and Redis | memcached | `ycsb` |
//! | `fabric` | messages (256 B, 64 KiB; 3 receivers) and SCL puts over NATS | the router tree | — |
//! | `cluster` | `psl up --memcached 3` (processes; router and NATS) under 50/50 and 90/10 loads | memcached | — |
//! | `cluster --shards 1,2,4` | `psl up --shards N --memcached 1` per N: CPU per op, bytes each front end receives per op, memory per role kind | the smallest N | — |
//! | `idle` | `psl up --workers 1 --kv --memcached 3` left alone: CPU per second, all roles | idle memcached | — |
//!
//! Module map: one module per benchmark; `loadgen`, the reusable closed-loop YCSB load
//! generator (memcached text protocol and RESP, many connections per thread, HdrHistogram
//! latencies) that `ycsb` drives and other benchmarks can build on; `zipf`, the zipfian
//! generator of the in-process benchmarks; `bigstore`, the `big-store` case of `replication`.

mod bigstore;
mod capsule;
mod capsuledb;
mod cluster;
mod fabric;
mod http;
mod idle;
mod launch;
pub mod loadgen;
mod memcached;
mod replication;
mod rrt;
mod scl;
pub mod ycsb;
mod zipf;

use anyhow::{bail, Result};
use clap::Args;
pub use psl::util::progress;

#[derive(Args)]
pub struct BenchArgs {
    /// Which benchmark: `capsule`, `scl`, `replication`, `memcached`, `http`, `launch`, `capsuledb`,
    /// `rrt`, `ycsb`, `fabric`, `cluster`, `idle`.
    pub name: String,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Seconds to spend on each measured case (`replication --cases big-store`: × 10, each
    /// store's read phase).
    #[arg(long, default_value_t = 1.0)]
    pub seconds: f64,
    /// Run only these cases (comma-separated; `scl`: w1,w2,w4,w8,ablation,keys,gets,ring, and the
    /// unbatched u1,u2,u4,u8 only when named; `rrt`: l1,l2,l4,l8; `fabric`: router,nats and
    /// messages,scl; `cluster`: router,nats; `replication`: big-store, only when named, alone).
    /// Default: all.
    #[arg(long, value_delimiter = ',')]
    pub cases: Vec<String>,
    /// Keys in the data set (`capsuledb`).
    #[arg(long, default_value_t = 1_000_000)]
    pub keys: u64,
    /// `replication --cases big-store`: empty the OS page cache before each read phase (`sync`,
    /// then `echo 1 > /proc/sys/vm/drop_caches`; root only).
    #[arg(long)]
    pub drop_caches: bool,
    /// Repetitions of each case (`rrt`, `cluster`: rounds of each system; `cluster --shards`:
    /// rounds per shard count; `idle`: measured spans; default: 3).
    #[arg(long)]
    pub reps: Option<usize>,
    /// `idle`: seconds to leave the deployment alone before measuring.
    #[arg(long, default_value_t = 20.0)]
    pub settle_s: f64,
    /// `cluster`: run the shard sweep instead of the usual rounds, once per shard count
    /// (comma-separated, 1 to 16, e.g. 1,2,4): `psl up --shards N --memcached 1` on the router
    /// tree under the `a` mix (uniform keys) over every shard's front end.
    #[arg(long, value_delimiter = ',')]
    pub shards: Vec<u16>,
    /// Boxed: `psl-tools`' command enum holds these arguments inline, and clippy bounds how
    /// much larger than the other commands' they may be.
    #[command(flatten)]
    pub ycsb: Box<ycsb::YcsbArgs>,
}

/// Every benchmark of this tree (`psl report` asks for others by name and notes them as not
/// available when the binary says it has no such benchmark).
pub const NAMES: [&str; 12] = [
    "capsule",
    "scl",
    "replication",
    "memcached",
    "http",
    "launch",
    "capsuledb",
    "rrt",
    "ycsb",
    "fabric",
    "cluster",
    "idle",
];

pub fn run(a: BenchArgs) -> Result<i32> {
    let out = match a.name.as_str() {
        "capsule" => capsule::run(a.seconds, !a.json)?,
        "scl" => scl::run(a.seconds * 2.0, &a.cases, !a.json)?,
        "memcached" => memcached::run(a.seconds, !a.json)?,
        "http" => http::run(a.seconds * 2.0, !a.json)?,
        "fabric" => fabric::run(a.seconds, &a.cases, !a.json)?,
        "cluster" if !a.shards.is_empty() => {
            if a.cases.iter().any(|c| c != "router") {
                bail!("bench cluster --shards runs on the router tree only (--cases router or none)");
            }
            let out =
                cluster::run_shards(a.seconds * 5.0, &a.shards, a.reps.unwrap_or(3), a.ycsb.connections, !a.json)?;
            if !a.json {
                print!("{}", cluster::shards_table(&out));
                return Ok(0);
            }
            out
        }
        "cluster" => cluster::run(a.seconds * 5.0, &a.cases, a.reps.unwrap_or(3), a.ycsb.connections, !a.json)?,
        "replication" => match a.cases.as_slice() {
            [] => replication::run(a.seconds * 2.0, !a.json)?,
            [c] if c == "big-store" => bigstore::run(
                a.ycsb.records.unwrap_or(bigstore::RECORDS_DEFAULT),
                a.seconds * 10.0,
                a.drop_caches,
                !a.json,
            )?,
            _ => bail!("replication's cases: big-store, alone (without --cases: the throughput cases)"),
        },
        "idle" => idle::run(a.seconds * 10.0, a.settle_s, a.reps.unwrap_or(3), !a.json)?,
        "launch" => launch::run((a.seconds * 20.0) as usize, !a.json)?,
        "capsuledb" => capsuledb::run(a.seconds, a.keys, !a.json)?,
        "rrt" => {
            let lambdas: Vec<u32> = a
                .cases
                .iter()
                .map(|c| c.strip_prefix('l').and_then(|n| n.parse().ok()))
                .collect::<Option<_>>()
                .ok_or_else(|| anyhow::anyhow!("rrt cases are l1, l2, l4, l8 (lambdas)"))?;
            rrt::run(a.reps.unwrap_or(3), &lambdas, !a.json)?
        }
        // With --target and --json: one JSON object per run, printed as each run ends.
        "ycsb" => ycsb::run(&a.ycsb, a.seconds, a.json && !a.ycsb.target.is_empty(), !a.json)?,
        other => {
            bail!("unknown benchmark {other:?}; available: {}", NAMES.join(", "))
        }
    };
    if out.is_null() {
        return Ok(0);
    }
    if a.json {
        println!("{out}");
    } else {
        println!("{}", serde_json::to_string_pretty(&out)?);
    }
    Ok(0)
}

/// CPU time (user + system) this process has used so far, from `/proc/self/stat`; zero where
/// that file is missing. Benchmarks report CPU per op beside throughput, so that a figure
/// taken on a busy machine can still be compared.
pub fn process_cpu_seconds() -> f64 {
    cpu_seconds_of("/proc/self/stat")
}

/// CPU time (user + system) another process has used so far (a broker the benchmark started);
/// zero if it is gone or `/proc` is missing.
pub fn pid_cpu_seconds(pid: u32) -> f64 {
    cpu_seconds_of(&format!("/proc/{pid}/stat"))
}

/// Seconds the threads of process `pid` have waited on a CPU's run queue, runnable but not
/// running (the second field of each thread's `schedstat`; threads that exited are not counted).
pub fn pid_runq_wait_seconds(pid: u32) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0.0 };
    let ns: f64 = tasks
        .filter_map(|t| t.ok())
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().nth(1).and_then(|x| x.parse::<f64>().ok()))
        .sum();
    ns / 1e9
}

fn cpu_seconds_of(path: &str) -> f64 {
    let Ok(stat) = std::fs::read_to_string(path) else { return 0.0 };
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else { return 0.0 };
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat(5); `rest` starts at field 3.
    let ticks = |i: usize| f.get(i - 3).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    // Linux reports these in USER_HZ, which is 100 on every platform it supports.
    (ticks(14) + ticks(15)) / 100.0
}

/// Machine facts recorded with every result.
pub fn machine() -> serde_json::Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    serde_json::json!({
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "cpu_model": cpu,
        "profile": if cfg!(debug_assertions) { "debug" } else { "release" },
    })
}
