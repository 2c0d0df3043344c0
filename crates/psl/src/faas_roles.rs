//! The FaaS roles as processes: `psl leader` (trusted), `psl scheduler` (untrusted) and
//! `psl worker`. The protocol lives in `psl_faas::net`; this is flags, keys and ready lines.
//!
//! Attestation uses the `sim` backend: INSECURE, for development only. Its platform key is a
//! file shared by the processes of one deployment (`psl up` writes it).

use anyhow::{Context, Result};
use clap::Args;
use psl_faas::attest::{binary_hash, measure, AttestPolicy, Measurement, SimPlatform};
use psl_faas::deploy::runtime_config;
use psl_faas::net::{host, leader, scheduler, worker};
use psl_sandbox::SandboxLimits;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

const INSECURE: &str = "WARNING: attestation uses the simulated backend 'sim', which is INSECURE: anyone holding the sim platform key file can forge reports. Never use it in production.";

#[derive(Args, Debug, Clone)]
pub struct SimArgs {
    /// The simulated platform's secret key file (64 hex characters). INSECURE backend.
    #[arg(long)]
    pub sim_platform_key: PathBuf,
    /// The binary hash the measurement is made from, as measured by the parent (`psl up`),
    /// so that every child does not re-read the binary; default: hash this binary. (The sim
    /// backend's measurement is self-declared anyway; hardware backends measure in hardware.)
    #[arg(long, hide = true)]
    pub sim_binary_hash: Option<String>,
}

pub fn read_platform(path: &Path) -> Result<Arc<SimPlatform>> {
    let text = zeroize::Zeroizing::new(
        std::fs::read_to_string(path).with_context(|| format!("reading the sim platform key {}", path.display()))?,
    );
    let mut secret = zeroize::Zeroizing::new([0u8; 32]);
    hex::decode_to_slice(text.trim(), &mut secret[..])
        .with_context(|| format!("{} is not 64 hex characters", path.display()))?;
    Ok(SimPlatform::from_secret(&secret)?)
}

/// This binary's measurement running the default sandbox configuration.
pub fn measurement(binary: Option<&str>) -> Result<Measurement> {
    let b = match binary {
        Some(h) => psl_crypto::Hash256(
            hex::decode(h).ok().and_then(|v| v.try_into().ok()).context("--sim-binary-hash is not 32 bytes of hex")?,
        ),
        None => binary_hash(),
    };
    Ok(measure(&b, &runtime_config(&SandboxLimits::default())))
}

fn parse_measurements(list: &[String], own: Measurement) -> Result<AttestPolicy> {
    let mut allowed = std::collections::BTreeSet::new();
    if list.is_empty() {
        allowed.insert(own);
    }
    for m in list {
        let b: [u8; 32] = hex::decode(m).ok().and_then(|v| v.try_into().ok()).context("a measurement is 64 hex")?;
        allowed.insert(psl_crypto::Hash256(b));
    }
    Ok(AttestPolicy { allowed })
}

fn ready_line(line: &str) -> Result<()> {
    println!("{line}");
    std::io::stdout().flush()?;
    Ok(())
}

#[derive(Args, Debug)]
#[command(after_help = INSECURE)]
pub struct LeaderArgs {
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// The fabric each job's coordinator attaches to (`--fabric URL`, alias `--router`).
    #[command(flatten)]
    pub fabric: psl_fabric::FabricArgs,
    #[command(flatten)]
    pub sim: SimArgs,
    /// Worker measurements (hex) granted keys; default: this binary's own.
    #[arg(long = "allow")]
    pub allow: Vec<String>,
    /// Milliseconds to wait for the offers of every worker the scheduler forwarded a job to.
    #[arg(long, default_value_t = 5000)]
    pub admit_wait_ms: u64,
    /// A capsule host (`psl capsule-host`); repeat for each, in server id order (0, 1, ...).
    /// Every job's capsule is opened on all of them.
    #[arg(long = "capsule-host")]
    pub capsule_hosts: Vec<SocketAddr>,
}

pub fn run_leader(a: LeaderArgs) -> Result<i32> {
    eprintln!("{INSECURE}");
    let platform = read_platform(&a.sim.sim_platform_key)?;
    let m = measurement(a.sim.sim_binary_hash.as_deref())?;
    let cfg = leader::LeaderConfig {
        listen: a.listen,
        fabric: a.fabric.spec("psl leader")?,
        platform,
        measurement: m,
        policy: parse_measurements(&a.allow, m)?,
        admit_wait: Duration::from_millis(a.admit_wait_ms),
        connections_max: 1024,
        capsule_hosts: a.capsule_hosts,
    };
    let mut res = Ok(());
    leader::serve_leader(cfg, |addr| res = ready_line(&format!("leader {addr}")))?;
    res.map(|()| 0)
}

#[derive(Args, Debug)]
pub struct SchedulerArgs {
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// A worker whose heartbeats stop for this long is dropped from the registry.
    #[arg(long, default_value_t = 1000)]
    pub heartbeat_timeout_ms: u64,
    /// Most seconds a job may take.
    #[arg(long, default_value_t = 300)]
    pub job_timeout_s: u64,
    /// TEST ONLY: flip the byte at this index (modulo the length) of every sealed program it
    /// forwards, as a malicious scheduler would.
    #[arg(long)]
    pub test_flip_program_byte: Option<usize>,
}

pub fn run_scheduler(a: SchedulerArgs) -> Result<i32> {
    let cfg = scheduler::SchedulerConfig {
        listen: a.listen,
        heartbeat_timeout: Duration::from_millis(a.heartbeat_timeout_ms.max(10)),
        job_timeout: Duration::from_secs(a.job_timeout_s),
        workers_max: 4096,
        test_flip_program_byte: a.test_flip_program_byte,
    };
    let mut res = Ok(());
    scheduler::serve_scheduler(cfg, |addr| res = ready_line(&format!("scheduler {addr}")))?;
    res.map(|()| 0)
}

#[derive(Args, Debug)]
#[command(after_help = INSECURE)]
pub struct WorkerArgs {
    /// Worker id (1 ..= 32767).
    #[arg(long)]
    pub id: u32,
    #[arg(long)]
    pub scheduler: SocketAddr,
    #[arg(long)]
    pub leader: SocketAddr,
    /// The fabric each job's node attaches to (`--fabric URL`, alias `--router`).
    #[command(flatten)]
    pub fabric: psl_fabric::FabricArgs,
    #[command(flatten)]
    pub sim: SimArgs,
    /// Leader measurements (hex) this worker accepts; default: this binary's own.
    #[arg(long = "allow-leader")]
    pub allow_leader: Vec<String>,
    /// Control interface (line protocol: DEBUG).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub control: SocketAddr,
    /// The control address told to the scheduler and printed (default: the bound one; set it
    /// when --control binds 0.0.0.0).
    #[arg(long, value_name = "HOST:PORT")]
    pub advertise_control: Option<String>,
    #[arg(long, default_value_t = 200)]
    pub heartbeat_ms: u64,
    /// TEST ONLY: report a measurement of another configuration (code the policy does not allow).
    #[arg(long)]
    pub test_rogue_measurement: bool,
    /// TEST ONLY: stop heartbeating after this many milliseconds (a hung worker).
    #[arg(long)]
    pub test_stop_heartbeats_after_ms: Option<u64>,
}

pub fn run_worker(a: WorkerArgs) -> Result<i32> {
    eprintln!("{INSECURE}");
    if a.id == 0 || a.id > 32767 {
        anyhow::bail!("--id must be 1 ..= 32767");
    }
    let platform = read_platform(&a.sim.sim_platform_key)?;
    let own = measurement(a.sim.sim_binary_hash.as_deref())?;
    let m = if a.test_rogue_measurement {
        tracing::warn!("worker {}: TEST FAULT: claiming a measurement the policy does not allow", a.id);
        measure(&own, b"a configuration the policy does not allow")
    } else {
        own
    };
    let cfg = worker::WorkerConfig {
        id: a.id,
        scheduler: a.scheduler,
        leader: a.leader,
        fabric: a.fabric.spec("psl worker")?,
        platform,
        measurement: m,
        leader_policy: parse_measurements(&a.allow_leader, own)?,
        limits: SandboxLimits::default(),
        heartbeat: Duration::from_millis(a.heartbeat_ms.max(1)),
        control: a.control,
        advertise_control: a.advertise_control.clone(),
        test_stop_heartbeats_after: a.test_stop_heartbeats_after_ms.map(Duration::from_millis),
    };
    let id = a.id;
    let advertised = a.advertise_control;
    let mut res = Ok(());
    worker::serve_worker(cfg, |r| {
        let control = advertised.unwrap_or_else(|| r.control.to_string());
        res = ready_line(&format!("worker {id} control {control}"))
    })?;
    res.map(|()| 0)
}

#[derive(Args, Debug)]
pub struct CapsuleHostArgs {
    /// Server id (0 ..= 32767); the leader sends this server's key for each job.
    #[arg(long)]
    pub id: u32,
    /// Directory for the stores (one per job capsule).
    #[arg(long)]
    pub dir: PathBuf,
    /// The fabric each job's capsule server attaches to (`--fabric URL`, alias `--router`).
    #[command(flatten)]
    pub fabric: psl_fabric::FabricArgs,
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
}

pub fn run_capsule_host(a: CapsuleHostArgs) -> Result<i32> {
    let cfg = host::HostConfig { id: a.id, dir: a.dir, listen: a.listen, fabric: a.fabric.spec("psl capsule-host")? };
    let id = a.id;
    let mut res = Ok(());
    host::serve_host(cfg, |addr| res = ready_line(&format!("capsule-host {id} {addr}")))?;
    res.map(|()| 0)
}
