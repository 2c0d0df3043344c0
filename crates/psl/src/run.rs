//! `psl run JOB.js --lambdas N`: runs the job on a running deployment (`--cluster`, see
//! `psl up`), or on the embedded deployment (leader, scheduler, workers, coordinator,
//! in-process fabric) started on the fly; prints each lambda's results and the launch
//! breakdown, and can export the job's capsule.
//!
//! Attestation: with `--cluster`, the client checks the leader under the cluster file's policy
//! (or `--attest-policy`), which accepts the INSECURE sim backend only if it says
//! `allow_insecure_sim = true`. The embedded deployment runs every role in one process, so it
//! always uses the sim backend under a built-in development policy that says so; it prints that.

use anyhow::{bail, Context, Result};
use clap::Args;
use psl_faas::{Deployment, DeploymentConfig, JobReport, JobRequest};
use psl_sandbox::SandboxLimits;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args, Debug)]
#[command(
    after_help = "WARNING: the embedded deployment (no --cluster) attests with the simulated backend 'sim', which is INSECURE (anyone can forge its reports); never use it in production."
)]
pub struct RunArgs {
    /// The JavaScript program every lambda runs.
    pub program: PathBuf,
    /// How many lambdas run it (1 ..= 256).
    #[arg(long, default_value_t = 1)]
    pub lambdas: u32,
    /// A file whose text every lambda sees as `lambda.input`.
    #[arg(long)]
    pub input: Option<PathBuf>,
    /// Workers in the embedded deployment (default: one per lambda, at most 64).
    #[arg(long)]
    pub workers: Option<usize>,
    /// Owner key file (a fresh key is made for the job if absent).
    #[arg(long)]
    pub owner: Option<PathBuf>,
    /// Write the job's DataCapsule (every record it wrote) to this file.
    #[arg(long)]
    pub capsule_out: Option<PathBuf>,
    /// Per-lambda memory limit in MiB.
    #[arg(long, default_value_t = 64)]
    pub memory_mib: usize,
    /// Per-lambda CPU-time limit in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    pub cpu_ms: u64,
    /// Per-lambda wall-clock limit in milliseconds.
    #[arg(long, default_value_t = 60_000)]
    pub wall_ms: u64,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Rotate the job's application key this many milliseconds after the workers are admitted
    /// (a new hardened key; records under the retired one are refused after the rotation epoch).
    #[arg(long)]
    pub rotate_after_ms: Option<u64>,
    /// Run on a running deployment: its cluster file (`psl up` writes DIR/cluster.json), or
    /// the directory holding it. Without it an embedded deployment is started on the fly.
    #[arg(long)]
    pub cluster: Option<PathBuf>,
    /// With --cluster: check the leader under this attestation policy instead of the cluster
    /// file's.
    #[arg(long, requires = "cluster")]
    pub attest_policy: Option<PathBuf>,
    /// Embedded deployment: capsule servers for the job (f = (N - 1) / 2), run in this process;
    /// lambdas' durable puts and syncs wait for a majority of them. 0: none (nothing can be
    /// made durable). With --cluster the deployment's capsule hosts serve the job.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(0..=255))]
    pub servers: u32,
    /// Embedded deployment: where the capsule servers keep the job's stores
    /// (`DIR/<capsule>/server-<id>`, checked by `psl capsule-server check`). Default: a temporary
    /// directory removed when the run ends.
    #[arg(long)]
    pub store_dir: Option<PathBuf>,
}

/// Reads a cluster file (or `DIR/cluster.json`).
pub fn read_cluster(p: &std::path::Path) -> Result<psl_faas::net::ClusterInfo> {
    if !p.exists() && p.to_str().is_some_and(|s| s.parse::<std::net::SocketAddr>().is_ok()) {
        bail!(
            "--cluster {}: give the cluster file that `psl up` wrote (DIR or DIR/cluster.json); it holds the leader's \
             address and the attestation policy, which an address alone cannot vouch for",
            p.display()
        );
    }
    let file = if p.is_dir() { p.join("cluster.json") } else { p.to_path_buf() };
    let text = std::fs::read_to_string(&file)
        .with_context(|| format!("reading the cluster file {} (is `psl up` running?)", file.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not a cluster file", file.display()))
}

pub fn run(a: RunArgs) -> Result<i32> {
    let job = read_job(&a)?;
    if a.lambdas == 0 || a.lambdas > psl_faas::deploy::LAMBDAS_MAX {
        bail!("--lambdas must be 1 ..= {}", psl_faas::deploy::LAMBDAS_MAX);
    }
    let limits = SandboxLimits {
        memory_bytes: a.memory_mib.clamp(1, 4096) << 20,
        cpu_time: Duration::from_millis(a.cpu_ms),
        wall_time: Duration::from_millis(a.wall_ms),
        ..SandboxLimits::default()
    };
    let done = match &a.cluster {
        Some(c) => run_on_cluster(&a, c, job)?,
        None => run_embedded(&a, limits, job)?,
    };
    let r = &done.report;
    if let (Some(path), Some(bytes)) = (&a.capsule_out, &r.capsule_file) {
        crate::util::write_atomic(path, bytes, 0o644)?;
    }
    if a.json {
        print_json(&a, &done)?;
    } else {
        print_text(&a, &done);
    }
    Ok(if r.ok { 0 } else { 1 })
}

/// What the job's lambdas get: the program, the input, and the owner key (if given).
struct JobInputs {
    program: String,
    input: Option<String>,
    owner: Option<psl_crypto::OwnerKey>,
}

/// A finished job: its report, how many workers it had, how long the embedded deployment
/// took to start, and the attestation backend and policy it ran under.
struct JobDone {
    report: JobReport,
    workers: usize,
    cold_ms: Option<f64>,
    attestation: (String, String),
}

/// Reads the program, the `--input` file and the `--owner` key.
fn read_job(a: &RunArgs) -> Result<JobInputs> {
    let program = std::fs::read_to_string(&a.program).with_context(|| format!("reading {}", a.program.display()))?;
    let input = match &a.input {
        Some(p) => Some(std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?),
        None => None,
    };
    let owner = match &a.owner {
        Some(p) => Some(crate::util::read_owner_key(p)?),
        None => None,
    };
    Ok(JobInputs { program, input, owner })
}

/// Runs the job on the running deployment that cluster file `c` describes.
fn run_on_cluster(a: &RunArgs, c: &std::path::Path, job: JobInputs) -> Result<JobDone> {
    if a.workers.is_some() || a.memory_mib != 64 || a.cpu_ms != 10_000 || a.wall_ms != 60_000 {
        bail!("--workers and the limits are the deployment's with --cluster (set them on `psl up`)");
    }
    if a.servers != 3 || a.store_dir.is_some() {
        bail!(
            "--servers and --store-dir are for the embedded deployment; with --cluster its capsule hosts serve the job"
        );
    }
    let info = read_cluster(c)?;
    let policy = a.attest_policy.clone().unwrap_or_else(|| info.attest_policy.clone());
    let verifier = crate::attest::load_policy(&policy, "client")?;
    let attestation = (info.attestation_backend.clone(), policy.display().to_string());
    let req = psl_faas::net::RemoteJob {
        program: job.program,
        lambdas: a.lambdas,
        input: job.input,
        owner: job.owner,
        min_workers: 1,
        record_capsule: a.capsule_out.is_some(),
        rotate_after_ms: a.rotate_after_ms,
        progress: None,
    };
    let report = psl_faas::net::run_remote_with(&info, &verifier, req)?;
    Ok(JobDone { report, workers: info.workers.len(), cold_ms: None, attestation })
}

/// Starts the embedded deployment (sim attestation), runs the job on it and stops it.
fn run_embedded(a: &RunArgs, limits: SandboxLimits, job: JobInputs) -> Result<JobDone> {
    let workers = a.workers.unwrap_or((a.lambdas as usize).min(64));
    crate::attest::warn_sim_once(
        "WARNING: embedded deployment: every role in this process, attested with the INSECURE sim backend under \
         the built-in development policy (allow_insecure_sim = true); development only",
    );
    let attestation =
        (psl_faas::attest::SIM_BACKEND.to_string(), "embedded development policy (allow_insecure_sim = true)".into());
    let t0 = std::time::Instant::now();
    let d = Deployment::start(DeploymentConfig {
        workers,
        limits,
        record_capsule: a.capsule_out.is_some(),
        servers: a.servers,
        store_dir: a.store_dir.clone(),
        ..DeploymentConfig::default()
    })?;
    let cold_ms = t0.elapsed().as_secs_f64() * 1e3;
    let JobInputs { program, input, owner } = job;
    let report =
        d.run_job(JobRequest { program, lambdas: a.lambdas, input, owner, rotate_after_ms: a.rotate_after_ms })?;
    Ok(JobDone { report, workers, cold_ms: Some(cold_ms), attestation })
}

/// `--json`: the report as one JSON object, with the deployment and its attestation.
fn print_json(a: &RunArgs, done: &JobDone) -> Result<()> {
    let mut v = serde_json::to_value(&done.report)?;
    if let Some(c) = done.cold_ms {
        v["deployment_start_ms"] = serde_json::json!(c);
    }
    v["deployment"] = serde_json::json!(if a.cluster.is_some() { "cluster" } else { "embedded" });
    v["attestation_backend"] = serde_json::json!(done.attestation.0);
    v["attestation_policy"] = serde_json::json!(done.attestation.1);
    println!("{}", serde_json::to_string(&v)?);
    Ok(())
}

/// The report for people: lambdas, launch breakdown, servers, coordinators, durability, keys.
fn print_text(a: &RunArgs, done: &JobDone) {
    let r = &done.report;
    println!("job {} on capsule {} ({} lambdas, {} workers)", r.job, r.capsule, r.lambdas.len(), done.workers);
    for (w, why) in &r.refused_workers {
        println!("  worker {w} refused: {why}");
    }
    for l in &r.lambdas {
        match &l.error {
            None => println!("lambda {} (worker {}, {:.1} ms CPU):", l.lambda, l.worker, l.cpu_ms),
            Some(e) => println!("lambda {} (worker {}) FAILED: {e}", l.lambda, l.worker),
        }
        for e in &l.emitted {
            println!("  {e}");
        }
        for log in &l.logs {
            println!("  log: {log}");
        }
    }
    print_launch(&r.launch);
    for (id, n) in &r.stored_records {
        println!("capsule server {id}: {n} records stored");
    }
    for c in &r.coordinators {
        let role = if c.rank == 0 { "primary".to_string() } else { format!("shadow {}", c.rank) };
        println!(
            "coordinator {role} on host {}: {} records written, ended in term {}{}",
            c.host,
            c.records_written,
            c.epoch >> 32,
            if c.alive { "" } else { " (lost during the job)" }
        );
    }
    print_durability(r);
    for k in &r.key_rotations {
        let failed = k.workers.iter().chain(&k.hosts).filter(|(_, e)| e.is_some()).count();
        println!(
            "application key rotated: generation {} from epoch {} ({} workers, {} hosts, {failed} failed)",
            k.key_gen,
            k.from_epoch,
            k.workers.len(),
            k.hosts.len()
        );
    }
    if let Some(p) = &a.capsule_out {
        println!(
            "capsule: {} records -> {} (check: psl capsule verify {})",
            r.capsule_records,
            p.display(),
            p.display()
        );
    }
}

/// The launch breakdown, one bar per phase.
fn print_launch(b: &psl_faas::LaunchBreakdown) {
    println!("launch breakdown (ms):");
    let total = b.launch_ms.max(1e-9);
    for (name, v) in [
        ("attest leader, key", b.leader_attest_ms),
        ("client -> scheduler", b.client_to_scheduler_ms),
        ("scheduler -> workers", b.scheduler_to_workers_ms),
        ("attestation", b.attestation_ms),
        ("key delivery", b.key_delivery_ms),
        ("program load", b.program_load_ms),
    ] {
        let bar = "#".repeat(((v / total) * 40.0).round().clamp(0.0, 40.0) as usize);
        println!("  {name:<22} {v:>8.2}  {bar}");
    }
    println!("  {:<22} {:>8.2}", "all lambdas running", b.launch_ms);
    println!("  {:<22} {:>8.2}  (after the last lambda started)", "first op", b.first_op_ms);
    println!("  {:<22} {:>8.2}", "job total", b.total_ms);
}

/// Whether every write was made durable, and if not, which workers say why.
fn print_durability(r: &JobReport) {
    if r.durable {
        println!("durable: every write acked by a majority of the job's capsule servers");
    } else if !r.durability.is_empty() && r.durability.iter().all(|(_, d)| d.servers == 0) {
        println!("not durable: the job had no capsule servers");
    } else {
        println!("NOT durable:");
        for (w, d) in r.durability.iter().filter(|(_, d)| !d.is_durable()) {
            println!("  worker {w}: {}", d.error.as_deref().unwrap_or("no error reported"));
        }
        if r.durability.iter().all(|(_, d)| d.is_durable()) {
            println!("  not every granted worker reported its writes");
        }
    }
}
