//! `psl bench NAME [--json]`: benchmarks. Each prints one JSON object with `--json`, and runs
//! its baseline in the same run, so that its headline figure is a ratio that a noisy machine
//! reproduces.

mod capsule;
mod capsuledb;
mod launch;
mod memcached;
mod replication;
mod scl;
mod zipf;

use anyhow::{bail, Result};
use clap::Args;

#[derive(Args)]
pub struct BenchArgs {
    /// Which benchmark: `capsule`, `scl`, `replication`, `memcached`, `launch`, `capsuledb`.
    pub name: String,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Seconds to spend on each measured case.
    #[arg(long, default_value_t = 1.0)]
    pub seconds: f64,
    /// Keys in the data set (`capsuledb`).
    #[arg(long, default_value_t = 1_000_000)]
    pub keys: u64,
}

pub fn run(a: BenchArgs) -> Result<i32> {
    let out = match a.name.as_str() {
        "capsule" => capsule::run(a.seconds, !a.json)?,
        "scl" => scl::run(a.seconds * 2.0, !a.json)?,
        "memcached" => memcached::run(a.seconds, !a.json)?,
        "replication" => replication::run(a.seconds * 2.0, !a.json)?,
        "launch" => launch::run((a.seconds * 20.0) as usize, !a.json)?,
        "capsuledb" => capsuledb::run(a.seconds, a.keys, !a.json)?,
        other => {
            bail!("unknown benchmark {other:?}; available: capsule, scl, replication, memcached, launch, capsuledb")
        }
    };
    if a.json {
        println!("{out}");
    } else {
        println!("{}", serde_json::to_string_pretty(&out)?);
    }
    Ok(0)
}

/// A progress bar on stderr (hidden when stderr is not a terminal).
pub fn progress(len: u64, what: &str) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new(len);
    pb.set_style(
        indicatif::ProgressStyle::with_template("{msg:>24} [{bar:30}] {pos}/{len} {elapsed}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    pb.set_message(what.to_string());
    pb
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
