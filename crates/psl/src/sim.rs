//! `psl sim`: the seeded simulator over many seeds.

use anyhow::Result;
use clap::Args;
use psl_sim::{run_seed, SimConfig};

#[derive(Args)]
pub struct SimArgs {
    /// How many seeds to run.
    #[arg(long, default_value_t = 200)]
    seeds: u64,
    /// First seed.
    #[arg(long, default_value_t = 0)]
    start: u64,
    /// Worker nodes.
    #[arg(long, default_value_t = SimConfig::default().nodes)]
    nodes: usize,
    /// Message loss rate during the faulty phase (default: the scenario's).
    #[arg(long)]
    loss: Option<f64>,
    /// Print each seed's report as a JSON line.
    #[arg(long)]
    json: bool,
    /// `scl` (nodes and coordinators) or `durability` (plus three capsule servers whose disks
    /// lose unsynced writes on a crash; servers and nodes crash and restart).
    #[arg(long, default_value = "scl")]
    scenario: Scenario,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum Scenario {
    Scl,
    Durability,
}

pub fn run(a: SimArgs) -> Result<i32> {
    let base = match a.scenario {
        Scenario::Scl => SimConfig::default(),
        Scenario::Durability => SimConfig::durability(),
    };
    let loss = a.loss.unwrap_or(base.loss);
    let cfg = SimConfig { nodes: a.nodes, loss, ..base };
    let scenario = match a.scenario {
        Scenario::Scl => "scl",
        Scenario::Durability => "durability",
    };
    let pb = crate::bench::progress(a.seeds, "sim seeds");
    let mut failed = 0u64;
    for s in a.start..a.start + a.seeds {
        match run_seed(s, &cfg) {
            Ok(r) => {
                if a.json {
                    pb.suspend(|| println!("{}", serde_json::to_string(&r).unwrap_or_default()));
                }
            }
            Err(v) => {
                failed += 1;
                pb.suspend(|| {
                    println!("FAILED {v}");
                    println!(
                        "replay: psl sim --scenario {scenario} --seeds 1 --start {s} --nodes {} --loss {loss}",
                        a.nodes
                    );
                });
            }
        }
        pb.inc(1);
    }
    pb.finish_and_clear();
    println!("{} seeds from {}: {} held every invariant, {failed} failed", a.seeds, a.start, a.seeds - failed);
    Ok(if failed == 0 { 0 } else { 1 })
}
