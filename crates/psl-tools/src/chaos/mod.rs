//! `psl chaos`: seeded fault schedules over real `psl` processes on loopback, and a checker
//! over the whole history, in the spirit of Jepsen's nemesis and TigerBeetle's VOPR.
//!
//! A seed decides everything but timing: the router's fault rates and the timeline of kills,
//! pauses, restarts (same state or empty), link cuts and disk faults ([`schedule`]), and every
//! request of every client ([`workload`]). The [`runner`] starts the deployment, runs the
//! clients and the nemesis concurrently, heals, and collects the finals; the [`checker`] turns
//! the [`history`] and the finals into violations. A failing seed prints itself, its schedule
//! and the command that replays it, and keeps its processes' logs.
//!
//! Module map:
//! - [`schedule`]: the fault schedule (pure; the seed's PRNG).
//! - [`workload`]: the clients' requests (pure).
//! - [`history`]: what clients saw and what the runner observed at the end (data).
//! - [`checker`]: the checks (pure).
//! - [`proxy`]: the cuttable TCP proxy between each process and the router.
//! - [`ctl`]: the signed client of the roles' control interfaces.
//! - [`runner`]: processes, clients, nemesis, finals (the thin I/O layer).
//! - [`byzantine`]: `--byzantine`: a leaked writer key attacking its revocation, and its check.
//! - [`rogue`]: `--byzantine`: a capsule server answering stale, forged and corrupted reads.

pub mod byzantine;
pub mod checker;
pub mod ctl;
pub mod history;
pub mod proxy;
pub mod rogue;
pub mod runner;
pub mod schedule;
pub mod workload;

use anyhow::{bail, Context, Result};
use clap::Args;
use schedule::{Schedule, Shape};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;
use workload::{Workload, WorkloadShape};

#[derive(Args, Debug)]
pub struct ChaosArgs {
    /// How many seeds to run.
    #[arg(long, default_value_t = 5)]
    pub seeds: u64,
    /// First seed.
    #[arg(long, default_value_t = 0)]
    pub start: u64,
    /// Start no new seed after this many minutes (the one under way finishes).
    #[arg(long)]
    pub minutes: Option<f64>,
    /// One JSON object per seed, then a summary object, one per line.
    #[arg(long)]
    pub json: bool,
    /// Where seeds run (DIR/seed-N: logs, stores, state). Removed for a passing seed unless
    /// --keep; kept for a failing one.
    #[arg(long, default_value = "psl-chaos")]
    pub dir: PathBuf,
    #[arg(long)]
    pub keep: bool,
    /// Nominal length of each seed's fault phase, ms (part of what a seed replays).
    #[arg(long, default_value_t = 12_000)]
    pub fault_ms: u64,
    /// SecureCached front ends of the deployment (one peer group): with three or more, their
    /// homes fail over (`psl memcached --home-lease-ms`), and the schedule's kills, pauses and
    /// cuts of front ends exercise it (part of what a seed replays).
    #[arg(long, default_value_t = Shape::default().memcached)]
    pub front_ends: u8,
    /// Print each seed's schedule and workload as JSON and run nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Disk faults (full and read-only store file systems, on tmpfs mounts): `auto` uses them
    /// if this process may mount a tmpfs, `off` never does.
    #[arg(long, default_value = "auto")]
    pub disk_faults: DiskFaults,
    /// Byzantine mode: the runner also plays an attacker holding a leaked certified writer key,
    /// which the coordinators revoke mid-run and which goes on forging, replaying, equivocating
    /// and publishing records it withheld, and a capsule server that answers reads with a stale
    /// copy, the attacker's records (its revocation withheld) and corrupted records, listed
    /// first wherever roles read from servers; the `byzantine` check asks that nothing the
    /// revocation covers is applied or stored anywhere (part of what a seed replays).
    #[arg(long)]
    pub byzantine: bool,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskFaults {
    Auto,
    Off,
}

/// What one seed did.
#[derive(serde::Serialize)]
struct SeedReport {
    seed: u64,
    ok: bool,
    violations: Vec<checker::Violation>,
    mix: BTreeMap<&'static str, u64>,
    router: schedule::RouterFaults,
    steps: usize,
    writes: usize,
    durable_syncs: usize,
    reads: usize,
    cas_attempts: usize,
    cas_stored: usize,
    skipped: Vec<String>,
    seconds: f64,
    replay: String,
    dir: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    byzantine: Option<serde_json::Value>,
}

fn replay_cmd(a: &ChaosArgs, seed: u64) -> String {
    let mut c = format!("psl chaos --seeds 1 --start {seed}");
    if a.fault_ms != 12_000 {
        c.push_str(&format!(" --fault-ms {}", a.fault_ms));
    }
    if a.disk_faults == DiskFaults::Off {
        c.push_str(" --disk-faults off");
    }
    if a.front_ends != Shape::default().memcached {
        c.push_str(&format!(" --front-ends {}", a.front_ends));
    }
    if a.byzantine {
        c.push_str(" --byzantine");
    }
    c
}

fn shapes(a: &ChaosArgs) -> (Shape, WorkloadShape) {
    let shape = Shape { fault_ms: a.fault_ms, memcached: a.front_ends.max(1), ..Shape::default() };
    let wshape = WorkloadShape { span_ms: a.fault_ms, fronts: shape.memcached, ..WorkloadShape::default() };
    (shape, wshape)
}

pub fn run(a: ChaosArgs) -> Result<i32> {
    let (shape, wshape) = shapes(&a);
    if a.dry_run {
        for seed in a.start..a.start.saturating_add(a.seeds) {
            let s = Schedule::generate(seed, shape);
            let w = Workload::generate(seed, wshape);
            let mut j = serde_json::json!({"seed": seed, "schedule": s, "workload": w});
            if a.byzantine {
                j["byzantine"] = serde_json::json!(byzantine::Plan::generate(seed, shape.fault_ms));
                j["rogue"] = serde_json::json!(rogue::Plan::generate(seed, shape.fault_ms, shape.servers));
            }
            println!("{j}");
        }
        return Ok(0);
    }
    std::fs::create_dir_all(&a.dir).with_context(|| format!("creating {}", a.dir.display()))?;
    let dir = std::fs::canonicalize(&a.dir)?;
    let exe = psl::util::sibling_exe("psl")?;
    let tmpfs = a.disk_faults == DiskFaults::Auto && runner::probe_tmpfs(&dir);
    if !tmpfs && !a.json {
        eprintln!("note: disk faults off (no tmpfs mount allowed here, or --disk-faults off): they are skipped");
    }
    let t0 = Instant::now();
    let pb = psl::util::progress(a.seeds, "chaos seeds");
    if a.json {
        pb.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let (mut ran, mut failed) = (0u64, 0u64);
    let mut mix: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut by_check: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut skipped_total = 0usize;
    for seed in a.start..a.start.saturating_add(a.seeds) {
        if a.minutes.is_some_and(|m| t0.elapsed().as_secs_f64() > m * 60.0) {
            pb.suspend(|| eprintln!("--minutes reached: stopping after {ran} seeds"));
            break;
        }
        let sched = Schedule::generate(seed, shape);
        let wl = Workload::generate(seed, wshape);
        let sdir = dir.join(format!("seed-{seed}"));
        if sdir.exists() {
            std::fs::remove_dir_all(&sdir).with_context(|| format!("removing an old {}", sdir.display()))?;
        }
        let started = Instant::now();
        pb.set_message(format!("seed {seed}"));
        let o = runner::RunOpts { exe: exe.clone(), dir: sdir.clone(), tmpfs, byzantine: a.byzantine };
        let run = runner::run(&sched, &wl, &o);
        let (violations, run_info) = match run {
            Ok(r) => (checker::check(&r.history, &r.finals, usize::from(shape.f)), Some(r)),
            Err(e) => {
                (vec![checker::Violation { check: "setup", detail: format!("the run itself failed: {e:#}") }], None)
            }
        };
        let ok = violations.is_empty();
        // Stores on tmpfs go with the mounts: a failing seed keeps a copy.
        if let Some(r) = &run_info {
            for m in &r.mounts {
                if !ok || a.keep {
                    let kept = m.with_extension("kept");
                    let _ = std::process::Command::new("cp").arg("-a").arg(m).arg(&kept).status();
                }
                if let Err(e) = runner::umount(m) {
                    pb.suspend(|| eprintln!("warning: {e:#}"));
                }
            }
        }
        for (k, n) in sched.mix() {
            *mix.entry(k).or_default() += n;
        }
        for v in &violations {
            *by_check.entry(v.check).or_default() += 1;
        }
        let h = run_info.as_ref().map(|r| &r.history);
        let report = SeedReport {
            seed,
            ok,
            violations: violations.clone(),
            mix: sched.mix(),
            router: sched.router,
            steps: sched.steps.len(),
            writes: h.map_or(0, |h| h.writes.len()),
            durable_syncs: h.map_or(0, |h| h.durables.len()),
            reads: h.map_or(0, |h| h.reads.len()),
            cas_attempts: h.map_or(0, |h| h.cas.len()),
            cas_stored: h.map_or(0, |h| h.cas.iter().filter(|c| c.outcome == history::CasOutcome::Stored).count()),
            skipped: run_info.as_ref().map(|r| r.skipped.clone()).unwrap_or_default(),
            seconds: started.elapsed().as_secs_f64(),
            replay: replay_cmd(&a, seed),
            dir: (!ok || a.keep).then(|| sdir.display().to_string()),
            byzantine: run_info.as_ref().and_then(|r| r.finals.byzantine.as_ref()).map(|b| b.summary()),
        };
        skipped_total += report.skipped.len();
        if !ok {
            failed += 1;
            if let Some(r) = &run_info {
                let _ = std::fs::write(
                    sdir.join("history.json"),
                    serde_json::to_vec_pretty(&serde_json::json!({"history": r.history, "finals": r.finals}))?,
                );
            }
            let _ = std::fs::write(sdir.join("schedule.txt"), sched.to_string());
        } else if !a.keep {
            let _ = std::fs::remove_dir_all(&sdir);
        }
        pb.suspend(|| {
            if a.json {
                println!("{}", serde_json::to_string(&report).unwrap_or_default());
            } else if !ok {
                println!("FAILED seed {seed}: {} violation(s)", violations.len());
                for v in &violations {
                    println!("  [{}] {}", v.check, v.detail);
                }
                print!("{sched}");
                println!("replay: {}", report.replay);
                println!("logs and stores kept in {}", sdir.display());
            }
        });
        ran += 1;
        pb.inc(1);
    }
    pb.finish_and_clear();
    let secs = t0.elapsed().as_secs_f64();
    if a.json {
        println!(
            "{}",
            serde_json::json!({"summary": true, "seeds": ran, "start": a.start, "failed": failed, "mix": mix,
                "violations": by_check, "disk_faults": tmpfs, "skipped_steps": skipped_total, "seconds": secs})
        );
    } else {
        let m: Vec<String> = mix.iter().map(|(k, n)| format!("{k} {n}")).collect();
        println!(
            "{ran} seeds from {} in {secs:.0} s: {} held every check, {failed} failed; episodes: {}",
            a.start,
            ran - failed,
            m.join(", ")
        );
    }
    if ran == 0 {
        bail!("no seed ran");
    }
    Ok(if failed == 0 { 0 } else { 1 })
}
