//! `psl bench rrt`: the paper's motion-planning case study (its Table II) on this runtime:
//! `examples/rrt.js`, an RRT*-style planner whose lambdas grow trees from their own seeds and
//! share the best path cost through the store, run with 1, 2, 4 and 8 lambdas until some
//! lambda's path costs at most the target (or the time budget runs out).
//!
//! Measured: the job's wall time from submission on the embedded FaaS deployment (launch with
//! simulated attestation, key delivery, lambdas in QuickJS sharing the SCL store, results back)
//! against the baseline of the same run: the same lambdas started straight in the sandbox
//! over a plain shared map (no scheduler, attestation, encryption or replication), as the
//! paper's planners without SCL. Each count runs `reps` times with different seeds (the input's
//! `seed`); medians reported. The headline, `ratio_lN`, is SCL's median time over the
//! baseline's. The machine's two cores bound what more lambdas can add: past two, extra
//! lambdas add seeds (a better chance of an early good path), not CPU.

use anyhow::{bail, Result};
use psl_faas::{Deployment, DeploymentConfig, JobRequest};
use psl_sandbox::{run_lambda, LambdaSpec, MapHost, SandboxLimits};
use serde_json::{json, Map, Value};
use std::sync::Arc;
use std::time::Instant;

const PROGRAM: &str = include_str!("../../../../examples/rrt.js");
const LAMBDAS: [u32; 4] = [1, 2, 4, 8];
/// The target path cost: a path through the three gaps of the default world within about 10%
/// of the best this planner finds with a few seconds of search.
pub const TARGET_COST: f64 = 200.0;
/// Each lambda's time budget (ms): a run that does not reach the target stops here.
const BUDGET_MS: u64 = 8000;

fn input(seed: u64) -> String {
    json!({"target": TARGET_COST, "iterations": 1_000_000, "ms": BUDGET_MS, "seed": seed}).to_string()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        0.0
    } else {
        v[v.len() / 2]
    }
}

/// The least cost any lambda emitted (rrt.js emits `{cost, …}` per lambda).
fn best_cost(emitted: &[Vec<String>]) -> Option<f64> {
    emitted
        .iter()
        .filter_map(|e| e.first())
        .filter_map(|s| serde_json::from_str::<Value>(s).ok())
        .filter_map(|v| v["cost"].as_f64())
        .min_by(|a, b| a.total_cmp(b))
}

fn bare(lambdas: u32, seed: u64) -> Result<(f64, Option<f64>)> {
    let host = Arc::new(MapHost::new());
    let program: Arc<str> = PROGRAM.into();
    let inp: Arc<str> = input(seed).into();
    let t = Instant::now();
    let hs: Vec<_> = (0..lambdas)
        .map(|i| {
            let spec = LambdaSpec { id: i, count: lambdas, program: program.clone(), input: Some(inp.clone()) };
            let h = host.clone();
            std::thread::spawn(move || run_lambda(spec, h, SandboxLimits::default()))
        })
        .collect();
    let mut emitted = Vec::new();
    for h in hs {
        let o = h.join().map_err(|_| anyhow::anyhow!("a baseline lambda panicked"))?;
        if let Err(e) = &o.result {
            bail!("a baseline lambda failed: {e}");
        }
        emitted.push(o.emitted);
    }
    Ok((t.elapsed().as_secs_f64() * 1e3, best_cost(&emitted)))
}

pub fn run(reps: usize, lambdas: &[u32], show_progress: bool) -> Result<Value> {
    let reps = reps.max(1);
    let counts: Vec<u32> = if lambdas.is_empty() { LAMBDAS.to_vec() } else { lambdas.to_vec() };
    let pb = if show_progress {
        super::progress((counts.len() * reps * 2) as u64, "bench rrt")
    } else {
        indicatif::ProgressBar::hidden()
    };
    let workers = counts.iter().copied().max().unwrap_or(1).max(1);
    let d = Deployment::start(DeploymentConfig { workers: workers as usize, ..DeploymentConfig::default() })?;
    // One job first: the first launch pays for measuring the worker binary.
    let _ = d.run_job(JobRequest {
        program: r#"emit("warm");"#.into(),
        lambdas: 1,
        input: None,
        owner: None,
        rotate_after_ms: None,
    })?;
    let mut out = Map::new();
    for &n in &counts {
        let (mut scl, mut base, mut scl_cost, mut base_cost, mut launch) = (vec![], vec![], vec![], vec![], vec![]);
        let (mut scl_hit, mut base_hit) = (0, 0);
        for r in 0..reps {
            let seed = r as u64 + 1;
            let t = Instant::now();
            let job = d.run_job(JobRequest {
                program: PROGRAM.into(),
                lambdas: n,
                input: Some(input(seed)),
                owner: None,
                rotate_after_ms: None,
            })?;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            if !job.ok {
                bail!("an rrt job failed: {:?}", job.lambdas.iter().find_map(|l| l.error.clone()));
            }
            let emitted: Vec<Vec<String>> = job.lambdas.iter().map(|l| l.emitted.clone()).collect();
            let c = best_cost(&emitted);
            scl_hit += usize::from(c.is_some_and(|c| c <= TARGET_COST));
            scl.push(ms);
            scl_cost.push(c.unwrap_or(f64::NAN));
            launch.push(job.launch.launch_ms);
            pb.inc(1);
            let (bms, bc) = bare(n, seed)?;
            base_hit += usize::from(bc.is_some_and(|c| c <= TARGET_COST));
            base.push(bms);
            base_cost.push(bc.unwrap_or(f64::NAN));
            pb.inc(1);
        }
        let (s, b) = (median(&mut scl.clone()), median(&mut base.clone()));
        out.insert(format!("scl_ms_p50_l{n}"), json!(s));
        out.insert(format!("baseline_ms_p50_l{n}"), json!(b));
        out.insert(format!("ratio_l{n}"), json!(s / b.max(1e-9)));
        out.insert(
            format!("detail_l{n}"),
            json!({"scl_ms": scl, "baseline_ms": base, "scl_best_cost": scl_cost, "baseline_best_cost": base_cost,
                   "scl_reached_target": scl_hit, "baseline_reached_target": base_hit,
                   "launch_ms_p50": median(&mut launch)}),
        );
    }
    pb.finish_and_clear();
    out.insert("target_cost".into(), json!(TARGET_COST));
    out.insert("budget_ms".into(), json!(BUDGET_MS));
    out.insert("reps".into(), json!(reps));
    out.insert("lambdas".into(), json!(counts));
    out.insert("attestation_backend".into(), json!("sim-INSECURE"));
    out.insert("machine".into(), super::machine());
    Ok(Value::Object(out))
}
