//! `psl bench memcached`: SecureCached against plain memcached under one load generator.
//!
//! Debian's memcached 1.6 (1 and 2 server threads) and `psl memcached` run, one after the
//! other (memcached with 1 thread and psl alternating for 9 rounds per case, medians
//! reported, since other work on a shared machine moves the figures), under the same
//! `memcaslap` load: 16 connections from one client thread, 30-byte
//! keys, 100-byte values, a 90% get / 10% set mix and a set-only run. `psl memcached` runs as a
//! deployment of two nodes on the in-process fabric (the embedded deployment's defaults): the
//! front end's node (one writer actor, sealing a record every 5 ms or 512 sets: every set is
//! signed, encrypted and replicated) and one receive-only node that
//! verifies, decrypts and applies every record, plus the coordinator. Its throughput counts the
//! time until that second node has applied every write: ops / (load time + catch-up time).
//! Headline: `ratio_mix` and `ratio_set`, psl over memcached with 1 thread.

use anyhow::{bail, Context, Result};
use psl_memcached::deploy::{Embedded, EmbeddedOptions};
use psl_memcached::{Server, ServerConfig};
use psl_scl::Metrics;
use serde_json::{json, Map, Value};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const CONNECTIONS: u32 = 16;
/// psl's server threads: one, as the baseline memcached's (`-t 1`). The front end's node and the
/// replica have threads of their own besides (writers, verifier, core, host).
const SERVER_THREADS: usize = 1;

pub(super) struct Load {
    pub(super) ops: u64,
    gets: u64,
    sets: u64,
    pub(super) seconds: f64,
}

pub(super) fn memcaslap_bin() -> Result<&'static str> {
    ["memcaslap", "memaslap", "memcslap"]
        .into_iter()
        .find(|b| Command::new(b).arg("--version").output().is_ok())
        .context("memcaslap is not installed (scripts/install-memcached-test-deps.sh installs it)")
}

pub(super) fn run_load(bin: &str, port: u16, cfg: &Path, secs: u64) -> Result<Load> {
    let out = Command::new(bin)
        .args(["-s", &format!("127.0.0.1:{port}"), "-T", "1", "-c", &CONNECTIONS.to_string(), "-w", "1k"])
        .args(["-t", &format!("{secs}s")])
        .arg("-F")
        .arg(cfg)
        .output()
        .with_context(|| format!("running {bin}"))?;
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    if !out.status.success() || text.contains("ERROR") {
        bail!("{bin} failed or saw error replies:\n{}", text.lines().take(40).collect::<Vec<_>>().join("\n"));
    }
    let last = |prefix: &str| -> Option<f64> {
        text.lines()
            .filter_map(|l| l.trim().strip_prefix(prefix))
            .filter_map(|r| r.split_whitespace().next()?.trim_end_matches('s').parse().ok())
            .next_back()
    };
    let ops = text
        .lines()
        .find_map(|l| l.split("Ops: ").nth(1))
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .with_context(|| format!("no Ops in {bin} output:\n{text}"))?;
    let seconds = text
        .lines()
        .find_map(|l| l.strip_prefix("Run time: "))
        .and_then(|r| r.split_whitespace().next()?.trim_end_matches('s').parse().ok())
        .unwrap_or(secs as f64);
    Ok(Load {
        ops,
        gets: last("cmd_get:").unwrap_or(0.0) as u64,
        sets: last("cmd_set:").unwrap_or(0.0) as u64,
        seconds,
    })
}

pub(super) fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

pub(super) struct Killed(Child);

impl Killed {
    pub(super) fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(super) fn start_memcached(threads: u32) -> Result<(Killed, u16)> {
    let port = free_port()?;
    let mut cmd = Command::new("memcached");
    cmd.args(["-p", &port.to_string(), "-U", "0", "-l", "127.0.0.1", "-t", &threads.to_string(), "-m", "1024"]);
    let root = Command::new("id").arg("-u").output().map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if root.unwrap_or(false) {
        cmd.args(["-u", "root"]);
    }
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting memcached (is Debian's memcached installed?)")?;
    let guard = Killed(child);
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            bail!("memcached did not start on port {port}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok((guard, port))
}

/// Rounds of each (system, case): memcached and psl alternate, so that load from other work on
/// the machine hits both alike; the headline is the ratio of the medians. Single rounds of
/// either server fall into a slow mode now and then (10 to 25% below the usual figure, more
/// often for psl's many threads than for memcached's one: docs/protocol/memcached.md §8), so
/// the more rounds, the less one run's headline depends on how many of them did; 9 rounds of
/// 2 s per system and case take about two minutes in all.
const ROUNDS: usize = 9;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        0.0
    } else {
        v[v.len() / 2]
    }
}

/// One psl run of `cfg`: a fresh two-node deployment (front end's node + receive-only replica),
/// the load, then the wait until the replica has applied every write.
fn psl_round(bin: &str, cfg: &Path, secs: u64) -> Result<(f64, Value)> {
    // The same item memory as memcached's `-m 1024`, so that neither evicts.
    let config = psl_memcached::Config { memory_limit: 1024 << 20, ..psl_memcached::Config::default() };
    let d = Embedded::start(&EmbeddedOptions { replicas: 1, epoch_ms: 100, config, ..EmbeddedOptions::default() })?;
    let fe = d.front_ends[0].clone();
    let replica = d.replicas[0].clone();
    let server = Server::start(
        fe.clone(),
        "127.0.0.1:0".parse()?,
        ServerConfig { threads: SERVER_THREADS, ..ServerConfig::default() },
    )?;
    let port = server.addr().port();
    let start = Instant::now();
    let l = run_load(bin, port, cfg, secs)?;
    let load_done = start.elapsed().as_secs_f64();
    // Wait until the replica has applied every write the front end acknowledged (every `set`
    // of this load stores: the memory limit is not reached). No `sync`: that would add the
    // coordinator's epoch round trips to the figure, and what counts is the replica holding
    // every write.
    let deadline = Instant::now() + Duration::from_secs(120);
    let target = psl_memcached::Stats::get(&fe.stats.cmd_set);
    while Metrics::get(&replica.metrics().ops_applied) < target {
        if Instant::now() > deadline {
            bail!(
                "the replica applied {} of {target} writes within 120 s",
                Metrics::get(&replica.metrics().ops_applied)
            );
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let catch_up = start.elapsed().as_secs_f64() - load_done;
    let tput = l.ops as f64 / (l.seconds + catch_up.max(0.0));
    let detail = json!({"ops": l.ops, "gets": l.gets, "sets": l.sets, "seconds": l.seconds,
           "ops_per_s": tput,
           "replica_catch_up_seconds": catch_up,
           "ops_written_by_front_end_node": target,
           "replica_ops_applied": Metrics::get(&replica.metrics().ops_applied),
           "replica_records_applied": Metrics::get(&replica.metrics().records_applied),
           "ops_per_s_without_catch_up": l.ops as f64 / l.seconds});
    drop(server);
    Ok((tput, detail))
}

pub fn run(seconds: f64, show_progress: bool) -> Result<Value> {
    let secs = (seconds * 2.0).round().max(2.0) as u64;
    let bin = memcaslap_bin()?;
    let dir = std::env::temp_dir().join(format!("psl-bench-memcached-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mix = dir.join("mix.cfg");
    let set = dir.join("set.cfg");
    std::fs::write(&mix, "key\n30 30 1\nvalue\n100 100 1\ncmd\n0 0.1\n1 0.9\n")?;
    std::fs::write(&set, "key\n30 30 1\nvalue\n100 100 1\ncmd\n0 1\n1 0\n")?;
    let cases = [("mix", &mix), ("set", &set)];
    let steps = (ROUNDS * 2 * cases.len() + cases.len()) as u64;
    let pb = if show_progress { super::progress(steps, "bench memcached") } else { indicatif::ProgressBar::hidden() };
    let mut out = Map::new();
    let mut detail = Map::new();

    for (name, cfg) in cases {
        let (mut mc, mut psl, mut rounds, mut ratios) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            let m = {
                let (_mc, port) = start_memcached(1)?;
                let l = run_load(bin, port, cfg, secs)?;
                l.ops as f64 / l.seconds
            };
            pb.inc(1);
            let (p, d) = psl_round(bin, cfg, secs)?;
            pb.inc(1);
            mc.push(m);
            psl.push(p);
            ratios.push(p / m.max(1e-9));
            rounds.push(json!({"memcached_ops_per_s": m, "psl": d, "ratio": p / m.max(1e-9)}));
        }
        out.insert(format!("memcached_ops_per_s_{name}"), json!(median(&mut mc)));
        out.insert(format!("psl_ops_per_s_{name}"), json!(median(&mut psl)));
        // A second view of the same rounds: the median of each round's psl / memcached (the
        // two ran back to back). Not the headline, which is the ratio of the medians.
        out.insert(format!("ratio_{name}_median_of_rounds"), json!(median(&mut ratios)));
        detail.insert(format!("rounds_{name}"), Value::Array(rounds));
        let (_mc2, port) = start_memcached(2)?;
        let l = run_load(bin, port, cfg, secs)?;
        out.insert(format!("memcached_t2_ops_per_s_{name}"), json!(l.ops as f64 / l.seconds));
        pb.inc(1);
    }
    pb.finish_and_clear();
    let _ = std::fs::remove_dir_all(&dir);

    let g = |k: &str| out.get(k).and_then(Value::as_f64).unwrap_or(0.0);
    let ratio_mix = g("psl_ops_per_s_mix") / g("memcached_ops_per_s_mix").max(1e-9);
    let ratio_set = g("psl_ops_per_s_set") / g("memcached_ops_per_s_set").max(1e-9);
    let ratio_mix_t2 = g("psl_ops_per_s_mix") / g("memcached_t2_ops_per_s_mix").max(1e-9);
    let ratio_set_t2 = g("psl_ops_per_s_set") / g("memcached_t2_ops_per_s_set").max(1e-9);
    out.insert("ratio_mix".into(), json!(ratio_mix));
    out.insert("ratio_set".into(), json!(ratio_set));
    out.insert("ratio_mix_vs_t2".into(), json!(ratio_mix_t2));
    out.insert("ratio_set_vs_t2".into(), json!(ratio_set_t2));
    out.insert("goal_mix".into(), json!(0.9));
    out.insert("goal_set".into(), json!(0.7));
    out.insert(
        "load".into(),
        json!({"generator": bin, "connections": CONNECTIONS, "client_threads": 1, "seconds_per_run": secs,
               "rounds": ROUNDS, "headline": "median of the rounds; memcached (1 thread) and psl alternate",
               "key_bytes": 30, "value_bytes": 100, "mix": "90% get / 10% set", "window": "1k"}),
    );
    out.insert("psl_deployment".into(), json!({"nodes": 2, "front_end_writers": EmbeddedOptions::default().writers, "flush_delay_ms": EmbeddedOptions::default().flush_delay.as_secs_f64() * 1e3, "replica": "receive-only, verifies and applies every record", "server_threads": SERVER_THREADS, "memory_limit_mb": 1024}));
    out.insert("detail".into(), Value::Object(detail));
    out.insert("machine".into(), super::machine());
    Ok(Value::Object(out))
}
