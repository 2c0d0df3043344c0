//! The FaaS roles as processes: `psl leader` (trusted), `psl scheduler` (untrusted),
//! `psl worker`, `psl coordinator-host` (a job's coordinator, trusted) and `psl capsule-host`. The protocol lives in `psl_faas::net`; this is flags,
//! keys and ready lines.
//!
//! Attestation: each attested role says how with `--attest sim|sgx|tdx|snp|auto` (see
//! `crate::attest::AttestArgs`; `sim` is INSECURE, for development, its platform key a file
//! shared by the processes of one deployment, which `psl up` writes). The leader, and the
//! workers checking the leader, verify under one policy file (`--attest-policy`), which accepts
//! the sim backend only if it says `allow_insecure_sim = true`.

use crate::attest::{load_policy, measurement, AttestArgs, INSECURE};
use anyhow::{Context, Result};
use clap::Args;
use psl_faas::attest::measure;
use psl_faas::net::{coordhost, host, leader, scheduler, worker};
use psl_sandbox::SandboxLimits;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

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
    /// How the leader proves what it runs to clients and workers.
    #[command(flatten)]
    pub attest: AttestArgs,
    /// The attestation policy (TOML): which workers and capsule hosts get keys. See
    /// docs/security/attestation.md; `psl attest measure` prints its entries.
    #[arg(long)]
    pub attest_policy: PathBuf,
    /// Milliseconds to wait for the offers of every worker the scheduler forwarded a job to.
    #[arg(long, default_value_t = 5000)]
    pub admit_wait_ms: u64,
    /// A capsule host (`psl capsule-host`); repeat for each, in server id order (0, 1, ...).
    /// Every job's capsule is opened on all of them.
    #[arg(long = "capsule-host")]
    pub capsule_hosts: Vec<SocketAddr>,
    /// A coordinator host (`psl coordinator-host`); repeat for each, in id order: host r runs
    /// each job's coordinator of rank r (0 the primary, 1 and 2 its shadows). At least one to
    /// run jobs (a leader only for a KV deployment, `--kv-owner`, needs none).
    #[arg(long = "coordinator-host", required_unless_present = "kv_owner")]
    pub coordinator_hosts: Vec<SocketAddr>,
    /// The KV capsule's owner key file: the leader keeps only the capsule's application key and
    /// hands it, sealed to the attested channel, to each KV front end, KV coordinator and
    /// CapsuleDB that attests under the policy (`--kv-leader` on those roles). This host holds
    /// the owner key; the KV hosts hold none.
    #[arg(long, value_name = "FILE", requires = "kv_capsule")]
    pub kv_owner: Option<PathBuf>,
    /// With --kv-owner: the KV capsule file.
    #[arg(long, value_name = "FILE", requires = "kv_owner")]
    pub kv_capsule: Option<PathBuf>,
    /// `ID=HASH`: the TLS key capsule host ID must present (64 hex digits: the hash `psl up
    /// --init` writes to `capsule-host<ID>.tls-pin`); repeat for each. The leader's handshake
    /// with that host fails on any other key, so nobody else at its address gets its key. A
    /// host with no pin must attest (`[hosts] require_attestation`), or the policy must say
    /// `[hosts] allow_insecure_unauthenticated = true` (INSECURE).
    #[arg(long = "capsule-host-pin", value_name = "ID=HASH", value_parser = parse_pin)]
    pub capsule_host_pins: Vec<(u32, [u8; 32])>,
    /// Prometheus metrics over HTTP (`--metrics ADDR`): this process's figures.
    #[command(flatten)]
    pub metrics: crate::roles::MetricsArgs,
    /// The attested HTTPS endpoint (`--http ADDR`); with `--clients-capsule` and
    /// `--cluster-file` it also serves the jobs API (docs/client.md).
    #[command(flatten)]
    pub https: crate::roles::HttpsArgs,
    /// The capsule whose owner's client credentials (`psl keys client --can run`) the jobs API
    /// accepts (its metadata only: the owner's public key). `psl up --kv`: the KV capsule.
    #[arg(long, value_name = "FILE", requires_all = ["http", "cluster_file"])]
    pub clients_capsule: Option<PathBuf>,
    /// The deployment's cluster file (`psl up` writes it after the leader starts; read at each
    /// job): the scheduler, the fabric and the policy a job runs under, as for `psl run
    /// --cluster`.
    #[arg(long, value_name = "FILE", requires = "clients_capsule")]
    pub cluster_file: Option<PathBuf>,
}

/// The jobs API's routes: each job runs as `psl run --cluster FILE` runs it, from this process
/// (which attests itself to itself under the cluster's policy, as any client does).
fn jobs_api(a: &LeaderArgs) -> Result<Option<crate::roles::ApiMaker>> {
    let (Some(capsule), Some(cluster)) = (&a.clients_capsule, &a.cluster_file) else { return Ok(None) };
    let meta = crate::roles::read_metadata(capsule)?;
    let cluster = cluster.clone();
    let runner: crate::api::JobRunner = Arc::new(move |spec: crate::api::JobSpec, progress| {
        let run = || -> Result<serde_json::Value> {
            let info = crate::run::read_cluster(&cluster)?;
            let verifier = load_policy(&info.attest_policy, "leader jobs API")?;
            let req = psl_faas::net::RemoteJob {
                program: spec.program,
                lambdas: spec.lambdas,
                input: spec.input,
                owner: None,
                min_workers: 1,
                record_capsule: false,
                rotate_after_ms: None,
                progress: Some(progress),
            };
            Ok(serde_json::to_value(psl_faas::net::run_remote_with(&info, &verifier, req)?)?)
        };
        run().map_err(|e| format!("{e:#}"))
    });
    Ok(Some(Box::new(move |spki, signer| {
        let guard = crate::api::Guard::new(meta.name(), meta.meta.owner, spki, signer);
        crate::api::jobs(crate::api::Jobs::new(runner), Arc::new(guard))
    })))
}

/// `ID=HASH` of `--capsule-host-pin`.
fn parse_pin(s: &str) -> Result<(u32, [u8; 32]), String> {
    let (id, h) = s.split_once('=').ok_or("expected ID=HASH")?;
    let id = id.trim().parse().map_err(|_| format!("{id:?} is not a capsule host id"))?;
    let mut pin = [0u8; 32];
    hex::decode_to_slice(h.trim(), &mut pin).map_err(|_| "HASH must be 64 hex digits".to_string())?;
    Ok((id, pin))
}

pub fn run_leader(a: LeaderArgs) -> Result<i32> {
    // The role's own counters are not exported yet: what it serves is its process's.
    let _metrics = a.metrics.serve(String::new, true)?;
    let _https = a.https.serve("leader", &a.attest, String::new, jobs_api(&a)?)?;
    let attester = a.attest.open_required("leader", || measurement(a.attest.sim_binary_hash.as_deref()))?;
    let verifier = load_policy(&a.attest_policy, "leader")?;
    let mut pins = vec![None; a.capsule_hosts.len()];
    for (id, pin) in &a.capsule_host_pins {
        let slot = pins.get_mut(*id as usize).with_context(|| {
            format!("--capsule-host-pin {id}=...: there are {} --capsule-host (ids 0 ..)", a.capsule_hosts.len())
        })?;
        anyhow::ensure!(slot.is_none(), "--capsule-host-pin {id}=... given twice");
        *slot = Some(*pin);
    }
    let host_auth = leader::HostAuth {
        attest: verifier.policy().require_host_attestation(),
        pins,
        allow_unauthenticated: verifier.policy().allow_unauthenticated_hosts(),
    };
    let cfg = leader::LeaderConfig {
        listen: a.listen,
        fabric: a.fabric.spec("psl leader")?,
        host_auth,
        admit_wait: Duration::from_millis(a.admit_wait_ms),
        connections_max: 1024,
        capsule_hosts: a.capsule_hosts,
        coordinator_hosts: a.coordinator_hosts,
        kv: match (&a.kv_owner, &a.kv_capsule) {
            (Some(owner), Some(capsule)) => {
                let meta = crate::roles::read_metadata(capsule)?;
                Some((crate::util::read_owner_key(owner)?, meta))
            }
            _ => None,
        },
    };
    let mut res = Ok(());
    leader::serve_leader(cfg, attester, Box::new(verifier), |addr| res = ready_line(&format!("leader {addr}")))?;
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
    /// Prometheus metrics over HTTP (`--metrics ADDR`): this process's figures.
    #[command(flatten)]
    pub metrics: crate::roles::MetricsArgs,
}

pub fn run_scheduler(a: SchedulerArgs) -> Result<i32> {
    // The role's own counters are not exported yet: what it serves is its process's.
    let _metrics = a.metrics.serve(String::new, true)?;
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
    /// How the worker proves what it runs to the leader.
    #[command(flatten)]
    pub attest: AttestArgs,
    /// The attestation policy (TOML) the leader's reports are checked against (the
    /// deployment's policy).
    #[arg(long)]
    pub attest_policy: PathBuf,
    /// Control interface (line protocol: DEBUG).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub control: SocketAddr,
    /// The control address told to the scheduler and printed (default: the bound one; set it
    /// when --control binds 0.0.0.0).
    #[arg(long, value_name = "HOST:PORT")]
    pub advertise_control: Option<String>,
    #[arg(long, default_value_t = 200)]
    pub heartbeat_ms: u64,
    /// TEST ONLY (`--attest sim`): report a measurement of another configuration (code the
    /// policy does not allow).
    #[arg(long)]
    pub test_rogue_measurement: bool,
    /// TEST ONLY: stop heartbeating after this many milliseconds (a hung worker).
    #[arg(long)]
    pub test_stop_heartbeats_after_ms: Option<u64>,
    /// Prometheus metrics over HTTP (`--metrics ADDR`): this process's figures.
    #[command(flatten)]
    pub metrics: crate::roles::MetricsArgs,
}

pub fn run_worker(a: WorkerArgs) -> Result<i32> {
    // The role's own counters are not exported yet: what it serves is its process's.
    let _metrics = a.metrics.serve(String::new, true)?;
    if a.id == 0 || a.id > 32767 {
        anyhow::bail!("--id must be 1 ..= 32767");
    }
    if a.test_rogue_measurement && a.attest.attest != Some(psl_faas::attest_select::AttestChoice::Sim) {
        anyhow::bail!("--test-rogue-measurement goes with --attest sim (hardware measures itself)");
    }
    let role = format!("worker {}", a.id);
    let attester = a.attest.open_required(&role, || {
        let own = measurement(a.attest.sim_binary_hash.as_deref())?;
        Ok(if a.test_rogue_measurement {
            tracing::warn!("worker {}: TEST FAULT: claiming a measurement the policy does not allow", a.id);
            measure(&own, b"a configuration the policy does not allow")
        } else {
            own
        })
    })?;
    let leader_verifier = load_policy(&a.attest_policy, &role)?;
    let cfg = worker::WorkerConfig {
        id: a.id,
        scheduler: a.scheduler,
        leader: a.leader,
        fabric: a.fabric.spec("psl worker")?,
        leader_verifier: Box::new(leader_verifier),
        limits: SandboxLimits::default(),
        heartbeat: Duration::from_millis(a.heartbeat_ms.max(1)),
        control: a.control,
        advertise_control: a.advertise_control.clone(),
        test_stop_heartbeats_after: a.test_stop_heartbeats_after_ms.map(Duration::from_millis),
    };
    let id = a.id;
    let advertised = a.advertise_control;
    let mut res = Ok(());
    worker::serve_worker(cfg, attester, |r| {
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
    /// How the host proves what it runs, when the leader's policy requires attested hosts
    /// (absent: the host cannot be attested).
    #[command(flatten)]
    pub attest: AttestArgs,
    /// The host's TLS private key (PEM, what `psl up --init` writes to
    /// `capsule-host<ID>.tls-key` in this host's directory), whose hash the leader pins
    /// (`--capsule-host-pin`). Absent: a fresh key per process, which a leader accepts only
    /// from an attested host (or, INSECURE, when its policy allows unauthenticated hosts).
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// Prometheus metrics over HTTP (`--metrics ADDR`): this process's figures.
    #[command(flatten)]
    pub metrics: crate::roles::MetricsArgs,
}

pub fn run_capsule_host(a: CapsuleHostArgs) -> Result<i32> {
    // The role's own counters are not exported yet: what it serves is its process's.
    let _metrics = a.metrics.serve(String::new, true)?;
    let attester =
        a.attest.open(&format!("capsule host {}", a.id), || measurement(a.attest.sim_binary_hash.as_deref()))?;
    let cfg = host::HostConfig {
        id: a.id,
        dir: a.dir,
        listen: a.listen,
        fabric: a.fabric.spec("psl capsule-host")?,
        attester,
        tls: match &a.tls_key {
            Some(p) => Some(psl_faas::tls::TlsIdentity::load(p, "psl-capsule-host")?),
            None => None,
        },
    };
    let id = a.id;
    let mut res = Ok(());
    host::serve_host(cfg, |addr| res = ready_line(&format!("capsule-host {id} {addr}")))?;
    res.map(|()| 0)
}

#[derive(Args, Debug)]
#[command(after_help = INSECURE)]
pub struct CoordinatorHostArgs {
    /// Coordinator host id: the leader runs each job's coordinator of rank `id` here (0 the
    /// primary, 1 and 2 its shadows).
    #[arg(long)]
    pub id: u32,
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// The fabric each job's coordinator attaches to (`--fabric URL`, alias `--router`).
    #[command(flatten)]
    pub fabric: psl_fabric::FabricArgs,
    /// How the host proves what it runs to the leader (it gets keys: always attested).
    #[command(flatten)]
    pub attest: AttestArgs,
    /// Directory for each coordinator's own-chain log (so that a restarted host never signs a
    /// seq twice); absent: it learns its chain from its peers only.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Seconds a coordinator keeps running after its leader went away, for a restarted leader
    /// to take the job back.
    #[arg(long, default_value_t = 120)]
    pub orphan_s: u64,
    /// Prometheus metrics over HTTP (`--metrics ADDR`): this process's figures.
    #[command(flatten)]
    pub metrics: crate::roles::MetricsArgs,
}

pub fn run_coordinator_host(a: CoordinatorHostArgs) -> Result<i32> {
    // The role's own counters are not exported yet: what it serves is its process's.
    let _metrics = a.metrics.serve(String::new, true)?;
    let id = a.id;
    if id > 2 {
        anyhow::bail!("--id must be 0 ..= 2 (a job capsule allows three coordinator ranks)");
    }
    let attester = a
        .attest
        .open_required(&format!("coordinator host {id}"), || measurement(a.attest.sim_binary_hash.as_deref()))?;
    let cfg = coordhost::CoordHostConfig {
        id,
        listen: a.listen,
        fabric: a.fabric.spec("psl coordinator-host")?,
        dir: a.dir,
        orphan: Duration::from_secs(a.orphan_s),
    };
    let mut res = Ok(());
    coordhost::serve_coordinator_host(cfg, attester, |addr| {
        res = ready_line(&format!("coordinator-host {id} {addr}"))
    })?;
    res.map(|()| 0)
}
