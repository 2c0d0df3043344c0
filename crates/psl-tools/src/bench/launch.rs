//! `psl bench launch`: launching a job of N lambdas on the embedded deployment (client →
//! scheduler → workers, attestation, key delivery, program load, until every lambda runs),
//! over many launches, for 1, 4 and 8 lambdas; the same over the multi-process deployment of
//! `psl up` (keys ending `_mp`: TLS, loopback TCP, one process per role); and cold starts:
//! `cold_start_ms` is `psl up` (spawn to every worker registered), `cold_start_embedded_ms`
//! the in-process deployment up to its first job's lambdas running.
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
        super::progress(6 * launches as u64 + 9, "bench launch")
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
        let r = d.run_job(JobRequest {
            program: PROGRAM.into(),
            lambdas: 8,
            input: None,
            owner: None,
            rotate_after_ms: None,
        })?;
        cold.push(started + r.launch.launch_ms);
        drop(d);
        pb.inc(1);
    }
    out.insert("cold_start_embedded_ms".into(), json!(cold[0]));
    out.insert("cold_start_warm_process_ms_p50".into(), json!(pct(&mut cold[1..].to_vec(), 0.5)));
    let d = Deployment::start(DeploymentConfig { workers: 8, ..DeploymentConfig::default() })?;
    for l in [1u32, 4, 8] {
        let (mut launch, mut att, mut keys, mut load, mut sched) = (vec![], vec![], vec![], vec![], vec![]);
        for _ in 0..launches {
            let r = d.run_job(JobRequest {
                program: PROGRAM.into(),
                lambdas: l,
                input: None,
                owner: None,
                rotate_after_ms: None,
            })?;
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
    drop(d);
    multi_process(&mut out, launches, &pb)?;
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

/// A running `psl up` child (stopped with SIGTERM on drop).
struct UpChild {
    child: std::process::Child,
    _dir: tempfile::TempDir,
    info: psl_faas::net::ClusterInfo,
}

impl Drop for UpChild {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own, not yet reaped, child.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let _ = self.child.wait();
    }
}

/// Starts `psl up --workers N`; returns it and the milliseconds until it reported ready.
fn start_up(workers: u32) -> Result<(UpChild, f64)> {
    use std::io::BufRead;
    let dir = tempfile::tempdir()?;
    let t = Instant::now();
    let mut child = std::process::Command::new(psl::util::sibling_exe("psl")?)
        .args(["up", "--workers", &workers.to_string(), "--dir"])
        .arg(dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let out = child.stdout.take().expect("piped");
    let mut ready = false;
    for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
        if line.starts_with("up ") {
            ready = true;
            break;
        }
    }
    let ms = t.elapsed().as_secs_f64() * 1e3;
    if !ready {
        let _ = child.kill();
        bail!("psl up did not report ready");
    }
    let info = serde_json::from_str(&std::fs::read_to_string(dir.path().join("cluster.json"))?)?;
    Ok((UpChild { child, _dir: dir, info }, ms))
}

fn multi_process(out: &mut Map<String, Value>, launches: usize, pb: &indicatif::ProgressBar) -> Result<()> {
    let mut cold = Vec::new();
    for _ in 0..3 {
        let (up, ms) = start_up(8)?;
        cold.push(ms);
        drop(up);
        pb.inc(1);
    }
    out.insert("cold_start_ms".into(), json!(cold[0]));
    out.insert("cold_start_ms_p50".into(), json!(pct(&mut cold, 0.5)));
    let (up, _) = start_up(8)?;
    let job = |l: u32| {
        psl_faas::net::run_remote(
            &up.info,
            psl_faas::net::RemoteJob {
                program: PROGRAM.into(),
                lambdas: l,
                input: None,
                owner: None,
                min_workers: 1,
                record_capsule: false,
                rotate_after_ms: None,
                progress: None,
            },
        )
    };
    // The first job pays for the workers' first connections; it is not counted.
    job(8)?;
    for l in [1u32, 4, 8] {
        let (mut launch, mut att, mut keys, mut sched, mut lead) = (vec![], vec![], vec![], vec![], vec![]);
        for _ in 0..launches {
            let r = job(l)?;
            if !r.ok {
                bail!("a multi-process benchmark job failed: {:?}", r.lambdas.iter().find_map(|x| x.error.clone()));
            }
            launch.push(r.launch.launch_ms);
            att.push(r.launch.attestation_ms);
            keys.push(r.launch.key_delivery_ms);
            sched.push(r.launch.client_to_scheduler_ms + r.launch.scheduler_to_workers_ms);
            lead.push(r.launch.leader_attest_ms);
            pb.inc(1);
        }
        out.insert(format!("launch_ms_p50_l{l}_mp"), json!(pct(&mut launch, 0.5)));
        out.insert(format!("launch_ms_p99_l{l}_mp"), json!(pct(&mut launch, 0.99)));
        out.insert(
            format!("breakdown_l{l}_mp"),
            json!({
                "leader_attest_and_owner_key_ms_p50": pct(&mut lead, 0.5),
                "scheduling_ms_p50": pct(&mut sched, 0.5),
                "attestation_ms_p50": pct(&mut att, 0.5),
                "key_delivery_ms_p50": pct(&mut keys, 0.5),
            }),
        );
    }
    Ok(())
}
