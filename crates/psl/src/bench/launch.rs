//! `psl bench launch`: launching a job of N lambdas on the embedded deployment (client →
//! scheduler → workers, attestation, key delivery, program load, until every lambda runs),
//! over many launches, for 1, 4 and 8 lambdas; and the cold start of the deployment.
//!
//! Baseline in the same run: starting the same lambdas straight in the sandbox, with no
//! launch path at all (no scheduler, no attestation, no keys, no replicated store), so the
//! ratio says what the secure launch costs on top of starting QuickJS threads.

use anyhow::{bail, Result};
use psl_faas::{Deployment, DeploymentConfig, JobRequest};
use psl_sandbox::{run_lambda, LambdaSpec, MapHost, SandboxLimits};
use serde_json::{json, Map, Value};
use std::sync::Arc;
use std::time::Instant;

const PROGRAM: &str = r#"put("k" + lambda.id, "v"); emit(get("k" + lambda.id));"#;

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

pub fn run(launches: usize, show_progress: bool) -> Result<Value> {
    let launches = launches.max(20);
    let pb = if show_progress {
        super::progress(3 * launches as u64 + 5, "bench launch")
    } else {
        indicatif::ProgressBar::hidden()
    };
    let mut out = Map::new();
    // Cold start: from nothing to every lambda of a first job running, in this fresh process
    // (it includes measuring the worker binary for attestation, done once per process). Then
    // the same with a warm process, five times.
    let mut cold = Vec::new();
    for _ in 0..6 {
        let t = Instant::now();
        let d = Deployment::start(DeploymentConfig { workers: 8, ..DeploymentConfig::default() })?;
        let started = t.elapsed().as_secs_f64() * 1e3;
        let r = d.run_job(JobRequest { program: PROGRAM.into(), lambdas: 8, input: None, owner: None })?;
        cold.push(started + r.launch.launch_ms);
        drop(d);
        pb.inc(1);
    }
    out.insert("cold_start_ms".into(), json!(cold[0]));
    out.insert("cold_start_warm_process_ms_p50".into(), json!(pct(&mut cold[1..].to_vec(), 0.5)));
    let d = Deployment::start(DeploymentConfig { workers: 8, ..DeploymentConfig::default() })?;
    for l in [1u32, 4, 8] {
        let (mut launch, mut att, mut keys, mut load, mut sched) = (vec![], vec![], vec![], vec![], vec![]);
        for _ in 0..launches {
            let r = d.run_job(JobRequest { program: PROGRAM.into(), lambdas: l, input: None, owner: None })?;
            if !r.ok {
                bail!("a benchmark job failed: {:?}", r.lambdas.iter().find_map(|x| x.error.clone()));
            }
            launch.push(r.launch.launch_ms);
            att.push(r.launch.attestation_ms);
            keys.push(r.launch.key_delivery_ms);
            load.push(r.launch.program_load_ms);
            sched.push(r.launch.client_to_scheduler_ms + r.launch.scheduler_to_workers_ms);
            pb.inc(1);
        }
        out.insert(format!("launch_ms_p50_l{l}"), json!(pct(&mut launch, 0.5)));
        out.insert(format!("launch_ms_p99_l{l}"), json!(pct(&mut launch, 0.99)));
        out.insert(
            format!("breakdown_l{l}"),
            json!({
                "scheduling_ms_p50": pct(&mut sched, 0.5),
                "attestation_ms_p50": pct(&mut att, 0.5),
                "key_delivery_ms_p50": pct(&mut keys, 0.5),
                "program_load_ms_p50": pct(&mut load, 0.5),
            }),
        );
    }
    // Baseline: 8 lambdas started straight in the sandbox.
    let mut bare = Vec::new();
    for _ in 0..launches {
        let host = Arc::new(MapHost::new());
        let t = Instant::now();
        let hs: Vec<_> = (0..8u32)
            .map(|i| {
                let spec = LambdaSpec { id: i, count: 8, program: PROGRAM.into(), input: None };
                let h = host.clone();
                std::thread::spawn(move || run_lambda(spec, h, SandboxLimits::default()))
            })
            .collect();
        for h in hs {
            let _ = h.join();
        }
        bare.push(t.elapsed().as_secs_f64() * 1e3);
    }
    pb.finish_and_clear();
    let base = pct(&mut bare, 0.5);
    out.insert("bare_sandbox_ms_p50_l8".into(), json!(base));
    let l8 = out["launch_ms_p50_l8"].as_f64().unwrap_or(0.0);
    out.insert("ratio_launch_vs_bare_l8".into(), json!(l8 / base.max(1e-9)));
    out.insert("launches_per_case".into(), json!(launches));
    out.insert("attestation_backend".into(), json!("sim-INSECURE"));
    out.insert("machine".into(), super::machine());
    Ok(Value::Object(out))
}
