//! `psl sim`: the seeded simulator over many seeds (`scl`, `durability`, `revocation`,
//! `read-through`, `coordinator-rejoin`), or the scale
//! scenario over growing node counts (`--scenario scale --nodes 10,100,1000`) or shard counts
//! (`--scenario scale --shards 1,10,100`, ten nodes per shard).

use anyhow::{bail, Context, Result};
use clap::Args;
use psl_sim::{run_scale, run_seed, ScaleConfig, ScaleReport, SimConfig};
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct SimArgs {
    /// How many seeds to run.
    #[arg(long, default_value_t = 200)]
    seeds: u64,
    /// First seed.
    #[arg(long, default_value_t = 0)]
    start: u64,
    /// Worker nodes; with `--scenario scale`, a comma-separated list of node counts, each run
    /// in its own process (so its memory is its own). Not with `--shards`.
    #[arg(long, value_delimiter = ',', default_values_t = [SimConfig::default().nodes])]
    nodes: Vec<usize>,
    /// Scale: a comma-separated list of shard counts, each run in its own process. A capsule is
    /// a shard of the KV key space (docs/protocol/sharding.md): a run with S shards has S
    /// capsules and S x `--nodes-per-shard` worker nodes. Not with `--nodes` or `--capsules`.
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["nodes", "capsules"])]
    shards: Vec<usize>,
    /// Scale, with `--shards`: worker nodes per shard (capsule); 10 if not given.
    #[arg(long)]
    nodes_per_shard: Option<usize>,
    /// Message loss rate during the faulty phase (default: the scenario's).
    #[arg(long)]
    loss: Option<f64>,
    /// Print each seed's (or each scale run's) report as a JSON line.
    #[arg(long)]
    json: bool,
    /// `scl` (nodes and coordinators), `durability` (plus three capsule servers whose disks
    /// lose unsynced writes on a crash; servers and nodes crash and restart), or `scale` (N
    /// nodes over several capsules with NATS-style subject fan-out: what each node receives
    /// and holds as N grows), or `revocation` (durability, and one writer revoked mid-run while
    /// an adversary with its key keeps writing), or `read-through` (a third of the ops first
    /// read their key through CapsuleDB: a write must supersede what its node showed), or
    /// `coordinator-rejoin` (the primary coordinator crashes and restarts with its writer index
    /// and its own-chain log, a small repair cache and data records arriving during its rejoin:
    /// no seq may be signed twice).
    #[arg(long, default_value = "scl")]
    scenario: Scenario,
    /// Scale: capsules the nodes are spread over; a capsule is a shard of the KV key space
    /// (default: one per ten nodes).
    #[arg(long)]
    capsules: Option<usize>,
    /// Scale: writes per node per simulated second.
    #[arg(long, default_value_t = 20.0)]
    puts_per_node_per_s: f64,
    /// Scale: simulated milliseconds of writes (then as long again, and half, to settle).
    #[arg(long, default_value_t = 1000)]
    work_ms: u64,
    /// Scale: draw the curve (per-node bytes received, subjects against the router tree's
    /// flood, and memory per node, against the number of nodes) into this PNG file.
    #[arg(long, value_name = "FILE.png")]
    plot: Option<PathBuf>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum Scenario {
    Scl,
    Durability,
    Revocation,
    ReadThrough,
    CoordinatorRejoin,
    Scale,
}

pub fn run(a: SimArgs) -> Result<i32> {
    if let Scenario::Scale = a.scenario {
        return run_scale_curve(&a);
    }
    if !a.shards.is_empty() || a.nodes_per_shard.is_some() {
        bail!("--shards and --nodes-per-shard are for --scenario scale");
    }
    let [nodes] = a.nodes[..] else { bail!("--nodes takes one count for the {:?} scenario", a.scenario) };
    let base = match a.scenario {
        Scenario::Durability => SimConfig::durability(),
        Scenario::Revocation => SimConfig::revocation(),
        Scenario::ReadThrough => SimConfig::read_through(),
        Scenario::CoordinatorRejoin => SimConfig::coordinator_rejoin(),
        _ => SimConfig::default(),
    };
    let loss = a.loss.unwrap_or(base.loss);
    let cfg = SimConfig { nodes, loss, ..base };
    let scenario = match a.scenario {
        Scenario::Durability => "durability",
        Scenario::Revocation => "revocation",
        Scenario::ReadThrough => "read-through",
        Scenario::CoordinatorRejoin => "coordinator-rejoin",
        _ => "scl",
    };
    let pb = crate::util::progress(a.seeds, "sim seeds");
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
                        "replay: psl sim --scenario {scenario} --seeds 1 --start {s} --nodes {nodes} --loss {loss}"
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

/// Resident memory of this process, bytes (Linux `/proc/self/statm`).
fn rss_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = s.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
    // SAFETY: sysconf(3) only reads a system constant.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * page.max(1) as u64
}

/// One run of the scale curve.
#[derive(Clone, Copy)]
enum Point {
    /// This many worker nodes (over `--capsules`, or one capsule per ten nodes).
    Nodes(usize),
    /// This many shards (capsules) of `--nodes-per-shard` nodes each.
    Shards(usize),
}

impl Point {
    /// The arguments that make a child process run this point alone.
    fn child_args(self, a: &SimArgs) -> Vec<String> {
        match self {
            Point::Nodes(n) => {
                let mut v = vec!["--nodes".to_string(), n.to_string()];
                if let Some(k) = a.capsules {
                    v.extend(["--capsules".to_string(), k.to_string()]);
                }
                v
            }
            Point::Shards(s) => {
                vec!["--shards".into(), s.to_string(), "--nodes-per-shard".into(), nodes_per_shard(a).to_string()]
            }
        }
    }
}

/// Worker nodes per shard with `--shards`.
fn nodes_per_shard(a: &SimArgs) -> usize {
    a.nodes_per_shard.unwrap_or(10)
}

fn scale_config(a: &SimArgs, p: Point) -> ScaleConfig {
    let mut c = match p {
        Point::Nodes(n) => {
            let mut c = ScaleConfig::new(n);
            if let Some(k) = a.capsules {
                c.capsules = k;
            }
            c
        }
        Point::Shards(s) => ScaleConfig::sharded(s, nodes_per_shard(a)),
    };
    c.seed = a.start.max(1);
    c.puts_per_node_per_s = a.puts_per_node_per_s;
    c.work_ms = a.work_ms;
    c.settle_ms = a.work_ms * 3 / 2;
    c
}

fn run_scale_curve(a: &SimArgs) -> Result<i32> {
    let points: Vec<Point> = if a.shards.is_empty() {
        if a.nodes_per_shard.is_some() {
            bail!("--nodes-per-shard goes with --shards");
        }
        if a.nodes.iter().any(|n| *n == 0 || *n > 100_000) {
            bail!("--nodes counts are 1 ..= 100000");
        }
        a.nodes.iter().map(|&n| Point::Nodes(n)).collect()
    } else {
        let k = nodes_per_shard(a);
        let too_many = |s: usize| s.checked_mul(k).is_none_or(|n| n > 100_000);
        if k == 0 || a.shards.iter().any(|&s| s == 0 || too_many(s)) {
            bail!("--shards counts are 1 or more, --nodes-per-shard 1 or more, and shards x nodes per shard at most 100000");
        }
        a.shards.iter().map(|&s| Point::Shards(s)).collect()
    };
    let reports: Vec<ScaleReport> = if let [p] = points[..] {
        let t = std::time::Instant::now();
        let cfg = scale_config(a, p);
        let r = run_scale(&cfg, &rss_bytes).map_err(anyhow::Error::msg)?;
        tracing::info!(
            nodes = cfg.nodes,
            capsules = cfg.capsules,
            wall_s = t.elapsed().as_secs_f64(),
            "scale run done"
        );
        vec![r]
    } else {
        // One process per run: each one's memory is its own.
        let exe = std::env::current_exe().context("finding the psl binary")?;
        let mut out = Vec::new();
        for p in &points {
            let args = p.child_args(a);
            eprintln!("scale: {} ...", args.join(" "));
            let mut cmd = std::process::Command::new(&exe);
            cmd.args(["sim", "--scenario", "scale", "--json"]).args(&args);
            cmd.args(["--start", &a.start.to_string(), "--work-ms", &a.work_ms.to_string()]);
            cmd.args(["--puts-per-node-per-s", &a.puts_per_node_per_s.to_string()]);
            let o = cmd.output().context("running a scale child")?;
            if !o.status.success() {
                bail!("psl sim --scenario scale {}: {}", args.join(" "), String::from_utf8_lossy(&o.stderr).trim());
            }
            let line = String::from_utf8_lossy(&o.stdout);
            let v: serde_json::Value = serde_json::from_str(line.trim()).context("a scale child's JSON")?;
            out.push(v);
        }
        if a.json {
            for v in &out {
                println!("{v}");
            }
        } else {
            print_table(&out);
        }
        if let Some(p) = &a.plot {
            plot(&out, p)?;
            println!("plot {}", p.display());
        }
        let ok = out.iter().all(|v| v["converged"] == true);
        return Ok(if ok { 0 } else { 1 });
    };
    let vals: Vec<serde_json::Value> = reports.iter().map(serde_json::to_value).collect::<Result<_, _>>()?;
    if a.json {
        for v in &vals {
            println!("{v}");
        }
    } else {
        print_table(&vals);
    }
    if let Some(p) = &a.plot {
        plot(&vals, p)?;
        println!("plot {}", p.display());
    }
    Ok(if reports.iter().all(|r| r.converged) { 0 } else { 1 })
}

fn f(v: &serde_json::Value) -> f64 {
    v.as_f64().unwrap_or(0.0)
}

/// The table: per node (mean over nodes) what it received under subjects and would have under
/// the flood, its memory; over the deployment, the ops applied by every node of their shard per
/// simulated second of the write phase and the records verified and applied per simulated
/// second of the run.
fn print_table(rows: &[serde_json::Value]) {
    println!(
        "{:>6} {:>8} {:>10} {:>12} {:>12} {:>14} {:>14} {:>10} {:>12} {:>12} {:>9}",
        "nodes",
        "capsules",
        "nodes/cap",
        "rec/s/node",
        "flood rec/s",
        "KiB/s/node",
        "flood KiB/s",
        "KiB/node",
        "all ops/s",
        "all rec/s",
        "converged"
    );
    for r in rows {
        println!(
            "{:>6} {:>8} {:>10.1} {:>12.0} {:>12.0} {:>14.1} {:>14.1} {:>10.0} {:>12.0} {:>12.0} {:>9}",
            f(&r["config"]["nodes"]),
            f(&r["config"]["capsules"]),
            f(&r["nodes_per_capsule"]),
            f(&r["records_received_per_s"]["mean"]),
            f(&r["flood_records_received_per_s"]["mean"]),
            f(&r["bytes_received_per_s"]["mean"]) / 1024.0,
            f(&r["flood_bytes_received_per_s"]["mean"]) / 1024.0,
            f(&r["rss_per_node_bytes"]) / 1024.0,
            f(&r["ops_applied_per_s"]),
            f(&r["records_applied_per_s"]),
            r["converged"].as_bool().unwrap_or(false),
        );
    }
}

/// The curve: per-node KiB/s received (subjects, flood) and KiB of memory per node, against N,
/// on log-log axes, drawn by `psl-tools` (so that `psl` links no plotting library).
pub(crate) fn plot(rows: &[serde_json::Value], path: &Path) -> Result<()> {
    crate::tools::plot_scale(rows, path)
}
