//! The embedded deployment: client, leader, scheduler, workers, coordinator hosts (the job's
//! primary coordinator and its shadows), capsule servers and a capsule recorder in one process
//! over an `InProcHub`.
//!
//! Every role runs in one process, so there is nothing hardware could attest between them: the
//! embedded deployment always uses the INSECURE sim backend, under a development policy that
//! says `allow_insecure_sim = true` ([`crate::attest_policy::dev_sim_policy_text`]), and logs
//! so. It exercises the protocol (measurements, nonces, channel-key binding), not the hardware.

use crate::attest::{
    binary_hash, bind_channel_key, measure, AttestVerifier, Measurement, SimAttester, SimPlatform, VerifyTime,
};
use crate::attest_policy::{dev_sim_policy_text, Policy, PolicyVerifier};
use crate::coordinator::{CoordinatorHost, CoordinatorStats, LocalCoordinator};
use crate::error::FaasError;
use crate::grant::{Grant, Offer};
use crate::leader::Leader;
use crate::program::{JobId, Payload, SealedProgram};
use crate::scheduler::{Scheduler, SealedJob};
use crate::worker::{DurableEnd, Worker, WorkerDebug, WorkerRun};
use parking_lot::Mutex;
use psl_capsule::{new_capsule_with, Limits, Record, SignedMetadata, WriterKeys};
use psl_crypto::{Hash256, OwnerKey};
use psl_fabric::{Fabric, FabricConfig, InProcHub};
use psl_sandbox::SandboxLimits;
use psl_scl::Msg;
use serde::Serialize;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How the embedded deployment is set up: how many workers, coordinators and capsule servers,
/// the sandbox limits, and test hooks.
#[derive(Debug, Clone)]
pub struct DeploymentConfig {
    /// Workers started (1 ..= 255).
    pub workers: usize,
    /// Resource limits of every lambda's sandbox (part of the workers' measured configuration).
    pub limits: SandboxLimits,
    /// Fewest attested workers a job may run on.
    pub min_workers: usize,
    /// Test hook: workers whose measurement is made from another configuration (a worker
    /// running code the policy does not allow).
    pub rogue_workers: Vec<u32>,
    /// Keep every record of the job for `capsule()`.
    pub record_capsule: bool,
    /// Capsule servers for each job (server ids `0 .. servers`; a write is durable once a
    /// majority acked it), run in this process on the deployment's fabric. 0: none, and
    /// nothing a job writes can be made durable.
    pub servers: u32,
    /// Where the servers keep their stores (`DIR/<capsule>/server-<id>`); `None`: a temporary
    /// directory, removed with the deployment.
    pub store_dir: Option<std::path::PathBuf>,
    /// Test hook: servers (ids) that are never started, as if down for the whole job.
    pub down_servers: Vec<u32>,
    /// The job's coordinators: a primary and `coordinators - 1` shadows, each on its own
    /// coordinator host (1 ..= 3, the ranks a job capsule allows).
    pub coordinators: u8,
    /// Test hook: stop the primary coordinator this long after the workers were admitted (its
    /// host killed mid-job); the shadow takes over.
    pub kill_primary_coordinator_after_ms: Option<u64>,
}

impl Default for DeploymentConfig {
    fn default() -> Self {
        DeploymentConfig {
            workers: 4,
            limits: SandboxLimits::default(),
            min_workers: 1,
            rogue_workers: Vec::new(),
            record_capsule: true,
            servers: 0,
            store_dir: None,
            down_servers: Vec::new(),
            coordinators: 2,
            kill_primary_coordinator_after_ms: None,
        }
    }
}

/// A job to run on the embedded deployment.
pub struct JobRequest {
    /// The lambda program (JavaScript source); sealed before it leaves the client.
    pub program: String,
    /// How many lambdas to run (1 ..= `LAMBDAS_MAX`).
    pub lambdas: u32,
    /// Input handed to every lambda, sealed like the program; `None`: no input.
    pub input: Option<String>,
    /// The owner key; a fresh one if `None`.
    pub owner: Option<OwnerKey>,
    /// Rotate the job's application key this long after the workers were admitted (while the
    /// lambdas run); `None`: no rotation.
    pub rotate_after_ms: Option<u64>,
}

/// Most lambdas in one job.
pub const LAMBDAS_MAX: u32 = 256;

/// What one lambda did in a job.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct LambdaReport {
    /// The lambda's index in the job.
    pub lambda: u32,
    /// The worker that ran it.
    pub worker: u32,
    /// What the lambda emitted, in order.
    pub emitted: Vec<String>,
    /// The lambda's log lines.
    pub logs: Vec<String>,
    /// Why the lambda failed; `None` if it succeeded.
    pub error: Option<String>,
    /// The failure's kind (a short machine-readable name), if it failed.
    pub error_kind: Option<String>,
    /// CPU time the lambda used, in milliseconds.
    pub cpu_ms: f64,
    /// Wall-clock time from its start to its end, in milliseconds.
    pub wall_ms: f64,
}

/// The launch path in milliseconds (each phase the slowest worker's).
#[derive(Debug, Clone, Default, Serialize)]
pub struct LaunchBreakdown {
    /// Over the network: the client attests the leader and hands it the owner key (TLS).
    pub leader_attest_ms: f64,
    /// Client submit to the scheduler receiving the sealed job.
    pub client_to_scheduler_ms: f64,
    /// Scheduler receiving the program to the worker receiving it.
    pub scheduler_to_workers_ms: f64,
    /// Forward to grant: the worker and the leader attesting each other.
    pub attestation_ms: f64,
    /// Grant to keys opened and the node started.
    pub key_delivery_ms: f64,
    /// Keys ready to the program opened and every lambda started.
    pub program_load_ms: f64,
    /// Last lambda started to the latest first host operation.
    pub first_op_ms: f64,
    /// Submit to every lambda running.
    pub launch_ms: f64,
    /// Submit to the report (the whole job, its lambdas' run included).
    pub total_ms: f64,
}

/// What `run_job` (or a cluster run) returns: each lambda's outcome, timings, the refused
/// workers, what was stored and whether the job ended durable.
#[derive(Debug, Clone, Serialize)]
pub struct JobReport {
    /// The job id (hex).
    pub job: String,
    /// The job capsule's name (hex).
    pub capsule: String,
    /// Each lambda's report.
    pub lambdas: Vec<LambdaReport>,
    /// Workers refused admission, with why.
    pub refused_workers: Vec<(u32, String)>,
    /// Where the launch time went.
    pub launch: LaunchBreakdown,
    /// Whether every lambda succeeded.
    pub ok: bool,
    /// The job's capsule file, when the deployment records it (not serialized).
    #[serde(skip)]
    pub capsule_file: Option<Vec<u8>>,
    /// How many records the capsule file holds.
    pub capsule_records: usize,
    /// What each worker held right after its RESET.
    pub resets: Vec<(u32, WorkerDebug)>,
    /// Over the network: records each capsule host (server id) stored for the job.
    pub stored_records: Vec<(u32, u64)>,
    /// Application key rotations done during the job.
    #[serde(default)]
    pub key_rotations: Vec<KeyRotationReport>,
    /// Whether the job ended durable: every granted worker reported that, after its lambdas
    /// ended, every write of its node was acked by f + 1 of the job's capsule servers. False
    /// for a job without capsule servers.
    #[serde(default)]
    pub durable: bool,
    /// Each worker's durable end, as it reported it (sealed with its results).
    #[serde(default)]
    pub durability: Vec<(u32, DurableEnd)>,
    /// What each of the job's coordinators (primary first) did: a shadow that took over wrote
    /// records, and the job ended in an epoch of a term above 0.
    #[serde(default)]
    pub coordinators: Vec<CoordinatorStats>,
}

/// What a worker seals for the client at the end of a job (over the network).
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct WorkerResultBody {
    /// Each lambda this worker ran.
    pub lambdas: Vec<LambdaReport>,
    /// Whether every write of the worker's node was acked by the job's capsule servers.
    pub durable: DurableEnd,
}

/// Whether a job ended durable, from what its granted workers reported: all of them did
/// (`reported` lists one entry per worker that reported; `granted` how many were granted).
pub fn job_durable(reported: &[(u32, DurableEnd)], granted: usize) -> bool {
    granted > 0 && reported.len() == granted && reported.iter().all(|(_, d)| d.is_durable())
}

/// One application key rotation of a job.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct KeyRotationReport {
    /// The key generation the rotation produced.
    pub key_gen: u32,
    /// The first epoch in which the new key is used.
    pub from_epoch: u64,
    /// The owner-signed certificate (hex; public): the capsule's auditors need it, and with the
    /// owner key it gives the new data key (its application index).
    pub cert: String,
    /// Each granted worker and the error if it did not install its keys.
    pub workers: Vec<(u32, Option<String>)>,
    /// Capsule hosts (over the network) and the error if one did not take the certificate.
    #[serde(default)]
    pub hosts: Vec<(u32, Option<String>)>,
}

impl KeyRotationReport {
    /// The decoded rotation certificate; `FaasError::Malformed` if `cert` is not hex or does not decode.
    pub fn certificate(&self) -> Result<psl_capsule::RotationCert, FaasError> {
        let b = hex::decode(&self.cert)
            .map_err(|e| FaasError::Malformed { what: "rotation certificate", why: e.to_string() })?;
        psl_capsule::RotationCert::decode(&b)
            .map_err(|e| FaasError::Malformed { what: "rotation certificate", why: e.to_string() })
    }
}

/// Every role in one process over an `InProcHub`: a leader, a scheduler, workers, coordinator
/// hosts and, per job, capsule servers. Attestation is the INSECURE sim backend.
pub struct Deployment {
    /// The in-process fabric every role's endpoint is on.
    pub hub: InProcHub,
    /// The trusted leader.
    pub leader: Leader,
    /// The untrusted scheduler.
    pub scheduler: Scheduler,
    /// The workers (ids 0 ..).
    pub workers: Vec<Arc<Worker>>,
    /// Coordinator hosts (ids 0 ..): rank r of each job runs on host r.
    pub coordinator_hosts: Vec<Arc<CoordinatorHost>>,
    /// The configuration it was started with.
    pub config: DeploymentConfig,
    /// The measurement the workers (and the leader) attest to.
    pub measurement: Measurement,
    /// The client's check of the leader (the development sim policy).
    verifier: PolicyVerifier,
    /// The servers' stores: `config.store_dir`, or a temporary directory held here.
    stores: Stores,
}

enum Stores {
    Dir(std::path::PathBuf),
    Temp(tempfile::TempDir),
}

impl Stores {
    fn path(&self) -> &std::path::Path {
        match self {
            Stores::Dir(p) => p,
            Stores::Temp(t) => t.path(),
        }
    }
}

/// The runtime configuration a worker's measurement covers (with the binary's hash).
pub fn runtime_config(limits: &SandboxLimits) -> Vec<u8> {
    format!("psl-faas {} sandbox {:?}", env!("CARGO_PKG_VERSION"), limits).into_bytes()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl Deployment {
    /// Starts the embedded deployment with the sim attestation backend (INSECURE).
    pub fn start(config: DeploymentConfig) -> Result<Deployment, FaasError> {
        if config.workers == 0 || config.workers > 255 {
            return Err(FaasError::Config(format!("workers must be 1 ..= 255, got {}", config.workers)));
        }
        if config.servers > crate::grant::JOB_SERVERS_MAX {
            return Err(FaasError::Config(format!(
                "servers must be 0 ..= {}, got {}",
                crate::grant::JOB_SERVERS_MAX,
                config.servers
            )));
        }
        let stores = match &config.store_dir {
            Some(d) => Stores::Dir(d.clone()),
            None => Stores::Temp(tempfile::Builder::new().prefix("psl-embedded-").tempdir().map_err(|e| {
                FaasError::Config(format!("a temporary directory for the capsule servers' stores: {e}"))
            })?),
        };
        if !(1..=psl_capsule::DEFAULT_COORDINATORS).contains(&config.coordinators) {
            return Err(FaasError::Config(format!(
                "coordinators must be 1 ..= {}, got {}",
                psl_capsule::DEFAULT_COORDINATORS,
                config.coordinators
            )));
        }
        let hub = InProcHub::new(FabricConfig::default()).map_err(|e| FaasError::Config(e.to_string()))?;
        let platform = SimPlatform::new();
        let measurement = measure(&binary_hash(), &runtime_config(&config.limits));
        let policy_text = dev_sim_policy_text(&hex::encode(platform.public().to_bytes()), &[measurement], false);
        let verifier = || -> Result<PolicyVerifier, FaasError> {
            let p =
                Policy::parse(&policy_text, std::path::Path::new("."), "the embedded deployment's development policy")
                    .map_err(|e| FaasError::Config(e.to_string()))?;
            PolicyVerifier::new(p, VerifyTime::Now).map_err(|e| FaasError::Config(e.to_string()))
        };
        let leader = Leader::new(Box::new(SimAttester::new(platform.clone(), measurement)), Box::new(verifier()?));
        let scheduler = Scheduler::new();
        let mut workers = Vec::new();
        for i in 1..=config.workers as u32 {
            let m = if config.rogue_workers.contains(&i) {
                measure(&binary_hash(), b"a configuration the policy does not allow")
            } else {
                measurement
            };
            workers.push(Arc::new(Worker::new(i, Box::new(SimAttester::new(platform.clone(), m)), config.limits)));
            scheduler.register(i);
        }
        let coordinator_hosts = (0..config.coordinators as u32)
            .map(|i| Arc::new(CoordinatorHost::new(i, Box::new(SimAttester::new(platform.clone(), measurement)))))
            .collect();
        Ok(Deployment {
            hub,
            leader,
            scheduler,
            workers,
            coordinator_hosts,
            measurement,
            verifier: verifier()?,
            config,
            stores,
        })
    }

    fn worker(&self, id: u32) -> Option<&Arc<Worker>> {
        self.workers.iter().find(|w| w.id == id)
    }

    /// Runs a job from submit to RESET and returns the report.
    /// After a job: shuts its capsule servers down (their record counts) and RESETs every
    /// worker still holding anything (what each held), releasing all to the scheduler.
    fn wind_down(&self, servers: Vec<(u32, psl_server::Server)>) -> WoundDown {
        let stored_records: Vec<(u32, u64)> = servers
            .into_iter()
            .map(|(id, s)| {
                let n = s.len() as u64;
                if let Some(e) = s.failed() {
                    tracing::warn!("capsule server {id}: {e}");
                }
                s.shutdown();
                (id, n)
            })
            .collect();
        let mut resets = Vec::new();
        for w in &self.workers {
            if w.debug()
                != (WorkerDebug { holds_keys: false, node_running: false, memtable_entries: 0, attested: false })
            {
                resets.push((w.id, w.reset()));
            }
            self.scheduler.release(w.id);
        }
        (stored_records, resets)
    }

    /// Runs one job end to end: seals the program, dispatches it, admits workers, runs the
    /// lambdas, optionally rotates the key, ends the job and RESETs the workers.
    /// `FaasError::Config` for a lambda count outside 1 ..= `LAMBDAS_MAX`.
    pub fn run_job(&self, req: JobRequest) -> Result<JobReport, FaasError> {
        if req.lambdas == 0 || req.lambdas > LAMBDAS_MAX {
            return Err(FaasError::Config(format!("lambdas must be 1 ..= {LAMBDAS_MAX}, got {}", req.lambdas)));
        }
        let t0 = Instant::now();
        let job = JobId::random();
        // Client: a capsule for a fresh application key, the leader attested, the program sealed.
        let owner = req.owner.unwrap_or_else(OwnerKey::generate);
        let app_index = rand::random::<u32>() >> 1;
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let meta = new_capsule_with(
            &owner,
            app_index,
            &format!("job-{job}"),
            now_ms,
            Limits::default(),
            WriterKeys::Certified,
        )
        .map_err(|e| FaasError::Capsule(e.to_string()))?;
        let app = owner.app(app_index).map_err(|e| FaasError::Config(e.to_string()))?;
        let nonce: [u8; 32] = rand::random();
        let ev = self.leader.attest(&nonce, &bind_channel_key(b"client-leader-inproc"))?;
        self.verifier
            .verify(&ev, &nonce, &bind_channel_key(b"client-leader-inproc"))
            .map_err(|e| FaasError::Attestation { who: "leader".into(), why: e.to_string() })?;
        let data_key = app.data_key();
        let program = SealedProgram::seal(
            &data_key,
            job,
            Payload::Program,
            req.program.as_bytes(),
            self.config.limits.program_bytes_max,
        )?;
        let input = match &req.input {
            Some(i) => Some(SealedProgram::seal(
                &data_key,
                job,
                Payload::Input,
                i.as_bytes(),
                self.config.limits.input_bytes_max,
            )?),
            None => None,
        };
        drop(data_key);
        drop(app);
        let recorder = if self.config.record_capsule {
            Some(Recorder::start(Arc::new(self.hub.endpoint("capsule-recorder")), meta.clone(), Duration::ZERO)?)
        } else {
            None
        };
        self.leader.begin_job(job, owner, meta.clone(), self.config.servers)?;
        let servers = match self.start_coordinators(job).and_then(|()| self.start_servers(&meta)) {
            Ok(s) => s,
            Err(e) => {
                self.leader.end_job();
                return Err(e);
            }
        };
        let sealed = SealedJob { job, program, input, lambdas: req.lambdas };
        let t_sched = Instant::now();
        let result = self.launch(&sealed, t0, t_sched, req.rotate_after_ms.map(Duration::from_millis));
        // RESET every worker that took part, whatever happened (their writers revoked first, in
        // a certified capsule); the leader forgets the job.
        self.leader.revoke_all();
        let coordinators = self.leader.end_job();
        let (stored_records, resets) = self.wind_down(servers);
        let (runs, refused, t_sent, t_admitted, key_rotations) = result?;
        let capsule_file = recorder.map(|r| r.finish(&meta));
        let (b, lambdas, ok) = launch_breakdown(&runs, t0, t_sched, t_sent, t_admitted);
        let durability: Vec<(u32, DurableEnd)> = runs.iter().map(|r| (r.worker, r.durable.clone())).collect();
        let capsule_records = capsule_file.as_ref().map(|(_, n)| *n).unwrap_or(0);
        Ok(JobReport {
            job: job.to_string(),
            capsule: meta.name().to_string(),
            lambdas,
            refused_workers: refused,
            launch: b,
            ok,
            capsule_file: capsule_file.map(|(f, _)| f),
            capsule_records,
            resets,
            stored_records,
            key_rotations,
            durable: job_durable(&durability, runs.len()),
            durability,
            coordinators,
        })
    }

    /// Places the job's coordinators: each coordinator host attests to the leader, opens the
    /// keys of its rank sealed to its channel key, and starts its coordinator node.
    fn start_coordinators(&self, job: JobId) -> Result<(), FaasError> {
        for (rank, host) in self.coordinator_hosts.iter().enumerate() {
            let rank = rank as u8;
            let offer = host.offer_for(&self.leader.coordinator_challenge(host.id), None)?;
            let sealed = self.leader.grant_coordinator(&offer, rank)?;
            let ep = |_: &SignedMetadata| -> Result<Arc<dyn Fabric>, FaasError> {
                Ok(Arc::new(self.hub.endpoint(format!("coordinator-{job}-{rank}"))))
            };
            host.open(job, rank, &sealed, ep, None)?;
            self.leader.attach_coordinator(
                host.id,
                rank,
                offer.channel_public,
                Box::new(LocalCoordinator(host.clone())),
            )?;
        }
        Ok(())
    }

    /// Starts the job's capsule servers (those not marked down), each on its own fabric
    /// endpoint with its key from the leader and a new store.
    fn start_servers(&self, meta: &SignedMetadata) -> Result<Vec<(u32, psl_server::Server)>, FaasError> {
        let mut out = Vec::new();
        for id in (0..self.config.servers).filter(|id| !self.config.down_servers.contains(id)) {
            let dir = self.stores.path().join(meta.name().to_string()).join(format!("server-{id}"));
            let ep = Arc::new(self.hub.endpoint(format!("capsule-server-{id}")));
            let (key, cert) = self.leader.server_credentials(id)?;
            let opts = psl_server::ServerOptions { id, cert, ..psl_server::ServerOptions::default() };
            let s = psl_server::Server::start(&dir, meta.clone(), key, ep, opts)
                .map_err(|e| FaasError::Config(format!("capsule server {id} in {}: {e}", dir.display())))?;
            out.push((id, s));
        }
        Ok(out)
    }

    #[allow(clippy::type_complexity)]
    fn launch(
        &self,
        sealed: &SealedJob,
        _t0: Instant,
        _t_sched: Instant,
        rotate_after: Option<Duration>,
    ) -> Result<(Vec<WorkerRun>, Vec<(u32, String)>, Instant, Instant, Vec<KeyRotationReport>), FaasError> {
        // Scheduler: forwards the sealed job to idle workers (one lambda each, at most).
        let forwarded = self.scheduler.dispatch(sealed, sealed.lambdas as usize);
        if forwarded.is_empty() {
            return Err(FaasError::NoIdleWorkers);
        }
        let t_sent = Instant::now();
        // Workers attest to the leader (in parallel).
        let offers: Vec<Result<Offer, FaasError>> = std::thread::scope(|s| {
            let hs: Vec<_> = forwarded
                .iter()
                .map(|(w, _)| {
                    let worker = self.worker(*w).cloned();
                    s.spawn(move || match worker {
                        Some(wk) => wk.offer(&self.leader),
                        None => Err(FaasError::Worker { worker: *w, why: "unknown worker".into() }),
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(FaasError::Config("offer thread panicked".into()))))
                .collect()
        });
        let mut good = Vec::new();
        let mut refused = Vec::new();
        for (o, (w, _)) in offers.into_iter().zip(&forwarded) {
            match o {
                Ok(o) => good.push(o),
                Err(e) => refused.push((*w, e.to_string())),
            }
        }
        let (grants, mut refused2) = self.leader.admit(good, sealed.lambdas, self.config.min_workers)?;
        refused.append(&mut refused2);
        let t_admitted = Instant::now();
        // Admitted workers open their keys and the program, and run their slots (in parallel);
        // the leader rotates the application key meanwhile if asked to.
        let mut rotations = Vec::new();
        let runs: Vec<Result<WorkerRun, FaasError>> = std::thread::scope(|s| {
            if let (Some(ms), Some(primary)) =
                (self.config.kill_primary_coordinator_after_ms, self.coordinator_hosts.first())
            {
                s.spawn(move || {
                    std::thread::sleep(Duration::from_millis(ms));
                    tracing::warn!("TEST FAULT: the primary coordinator's host is killed");
                    primary.close();
                });
            }
            let rot = rotate_after.map(|d| {
                s.spawn(move || {
                    std::thread::sleep(d);
                    self.rotate_keys()
                })
            });
            let hs: Vec<_> = grants
                .iter()
                .map(|g: &Grant| {
                    let job = forwarded.iter().find(|(w, _)| *w == g.worker).map(|(_, j)| j);
                    let worker = self.worker(g.worker).cloned();
                    let hub = &self.hub;
                    s.spawn(move || match (worker, job) {
                        (Some(wk), Some(job)) => wk.run(job, g, Arc::new(hub.endpoint(format!("worker-{}", g.worker)))),
                        _ => Err(FaasError::Worker { worker: g.worker, why: "not forwarded".into() }),
                    })
                })
                .collect();
            let runs = hs
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(FaasError::Config("worker thread panicked".into()))))
                .collect();
            if let Some(r) = rot {
                match r.join() {
                    Ok(Ok(rep)) => rotations.push(rep),
                    Ok(Err(e)) => tracing::error!("key rotation failed: {e}"),
                    Err(_) => tracing::error!("key rotation thread panicked"),
                }
            }
            runs
        });
        let runs = runs.into_iter().collect::<Result<Vec<_>, _>>()?;
        Ok((runs, refused, t_sent, t_admitted, rotations))
    }

    /// Rotates the running job's application key (docs/protocol/faas.md, "Key rotation"): the
    /// leader prepares the new generation (its coordinator holds below the rotation epoch),
    /// every granted worker installs its sealed bundle, then the coordinator gets its key.
    pub fn rotate_keys(&self) -> Result<KeyRotationReport, FaasError> {
        let (cert, grants) = self.leader.prepare_rotation(crate::rotation::ROTATION_MARGIN_EPOCHS)?;
        let workers: Vec<(u32, Option<String>)> = std::thread::scope(|s| {
            let hs: Vec<_> = grants
                .iter()
                .map(|g| {
                    let w = self.worker(g.worker).cloned();
                    s.spawn(move || match w {
                        Some(w) => w.rotate(g).err().map(|e| e.to_string()),
                        None => Some("unknown worker".to_string()),
                    })
                })
                .collect();
            grants
                .iter()
                .zip(hs)
                .map(|(g, h)| (g.worker, h.join().unwrap_or_else(|_| Some("rotation thread panicked".into()))))
                .collect()
        });
        for (w, e) in &workers {
            if let Some(e) = e {
                tracing::warn!("worker {w}: {e}");
            }
        }
        let cert2 = self.leader.finish_rotation()?;
        debug_assert_eq!(cert, cert2);
        Ok(KeyRotationReport {
            key_gen: cert.key_gen,
            from_epoch: cert.from_epoch,
            cert: hex::encode(cert.encode()),
            workers,
            hosts: Vec::new(),
        })
    }
}

impl Drop for Recorder {
    /// A recorder dropped without `finish` (a failed job) stops its thread too.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// Each capsule server's record count, and each RESET worker's state before its RESET.
type WoundDown = (Vec<(u32, u64)>, Vec<(u32, WorkerDebug)>);

/// Times the job's launch phases from the workers' runs, and gathers each lambda's report
/// (in lambda order) and whether all of them succeeded.
fn launch_breakdown(
    runs: &[WorkerRun],
    t0: Instant,
    t_sched: Instant,
    t_sent: Instant,
    t_admitted: Instant,
) -> (LaunchBreakdown, Vec<LambdaReport>, bool) {
    let mut lambdas = Vec::new();
    let mut b = LaunchBreakdown { client_to_scheduler_ms: ms(t_sched - t0), ..Default::default() };
    b.scheduler_to_workers_ms = ms(t_sent.saturating_duration_since(t_sched));
    b.attestation_ms = ms(t_admitted.saturating_duration_since(t_sent));
    let mut ok = true;
    let mut last_start = t_admitted;
    let mut last_first_op = t_admitted;
    for r in runs {
        b.key_delivery_ms = b.key_delivery_ms.max(ms(r.keys_ready.saturating_duration_since(t_admitted)));
        b.program_load_ms = b.program_load_ms.max(ms(r.lambdas_started.saturating_duration_since(r.keys_ready)));
        last_start = last_start.max(r.lambdas_started);
        if let Err(e) = &r.final_sync {
            tracing::warn!("worker {}: final sync: {e}", r.worker);
        }
        for o in &r.outcomes {
            if let Some(f) = o.first_op_at {
                last_first_op = last_first_op.max(f);
            }
            ok &= o.result.is_ok();
        }
        lambdas.extend(lambda_reports(r));
    }
    lambdas.sort_by_key(|l| l.lambda);
    b.launch_ms = ms(last_start - t0);
    b.first_op_ms = ms(last_first_op.saturating_duration_since(last_start));
    b.total_ms = ms(t0.elapsed());
    (b, lambdas, ok)
}

/// The per-lambda reports of one worker's run.
pub fn lambda_reports(r: &WorkerRun) -> Vec<LambdaReport> {
    r.outcomes
        .iter()
        .map(|o| LambdaReport {
            lambda: o.id,
            worker: r.worker,
            emitted: o.emitted.clone(),
            logs: o.logs.clone(),
            error: o.result.as_ref().err().map(|e| e.to_string()),
            error_kind: o.result.as_ref().err().map(|e| e.reason.kind().to_string()),
            cpu_ms: ms(o.cpu),
            wall_ms: ms(o.finished_at - o.started_at),
        })
        .collect()
}

/// An untrusted observer on the fabric keeping every record of the job (for the `.capsule`).
pub struct Recorder {
    stop: Arc<AtomicBool>,
    records: Arc<Mutex<(Vec<Record>, HashSet<Hash256>)>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Recorder {
    /// Starts keeping every record of `meta`'s capsule seen on `ep`; at `finish` it keeps
    /// reading until `drain` passes with nothing new (records still in flight over TCP).
    pub fn start(ep: Arc<dyn Fabric>, meta: SignedMetadata, drain: Duration) -> Result<Recorder, FaasError> {
        let stop = Arc::new(AtomicBool::new(false));
        let records = Arc::new(Mutex::new((Vec::new(), HashSet::new())));
        let (st, rec) = (stop.clone(), records.clone());
        let name = meta.name();
        let limits = meta.meta.policy.limits;
        let thread = std::thread::Builder::new().name("capsule-recorder".into()).spawn(move || {
            let take = |m: bytes::Bytes| {
                if let Ok(Msg::Record { capsule, bytes }) = Msg::decode(&m) {
                    if capsule == name {
                        if let Ok(r) = Record::decode(&bytes, &limits) {
                            let mut g = rec.lock();
                            if g.1.insert(r.hash()) {
                                g.0.push(r);
                            }
                        }
                    }
                }
            };
            while !st.load(Ordering::Acquire) {
                if let Ok(Some(m)) = ep.recv_timeout(Duration::from_millis(20)) {
                    take(m);
                }
            }
            while let Ok(Some(m)) = ep.try_recv() {
                take(m);
            }
            if !drain.is_zero() {
                while let Ok(Some(m)) = ep.recv_timeout(drain) {
                    take(m);
                }
            }
        })?;
        Ok(Recorder { stop, records, thread: Some(thread) })
    }

    /// Stops and returns the `.capsule` file of everything kept, and the record count. Records
    /// that a revocation carried in the capsule itself refuses are left out (a RESET worker's
    /// records published after its revocation epoch: every node and server refuses them, so
    /// they are not part of the job's capsule).
    pub fn finish(mut self, meta: &SignedMetadata) -> (Vec<u8>, usize) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let g = self.records.lock();
        let public = psl_capsule::Verifier::new(meta.clone(), None);
        public.learn_statements(&g.0);
        let kept: Vec<Record> = g.0.iter().filter(|r| public.revoked(r.header()).is_none()).cloned().collect();
        if kept.len() < g.0.len() {
            tracing::info!(refused = g.0.len() - kept.len(), "capsule recorder: records a revocation refuses left out");
        }
        (psl_capsule::file::encode(meta, &kept), kept.len())
    }
}
