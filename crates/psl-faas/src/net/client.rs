//! The client side of a job on a running deployment (`psl run --cluster`), and the cluster file
//! `psl up` writes.
//!
//! Steps: a capsule for a fresh application key; the leader attested over TLS (its report must
//! bind the certificate key of the very connection) before it gets the owner key; the program
//! and input sealed under the application data key; the job submitted to the scheduler; the
//! leader told which workers the scheduler forwarded to; the workers' sealed results opened;
//! the job ended (the leader RESETs the workers). An untrusted observer on the router keeps
//! every record of the capsule for the `.capsule` file.

use super::unix_us;
use super::wire::{read_msg, unhex, write_msg, Msg, WorkerTimes};
use crate::attest::{bind_channel_key, AttestVerifier, VerifyTime};
use crate::attest_policy::{Policy, PolicyVerifier};
use crate::coordinator::CoordinatorStats;
use crate::deploy::{
    job_durable, JobReport, KeyRotationReport, LambdaReport, LaunchBreakdown, Recorder, WorkerResultBody, LAMBDAS_MAX,
};
use crate::error::FaasError;
use crate::program::{JobId, Payload, SealedProgram};
use crate::tls::{self, TlsIdentity};
use crate::worker::{DurableEnd, WorkerDebug, RESULT_BYTES_MAX};
use psl_capsule::{new_capsule_with, Limits, SignedMetadata, WriterKeys};
use psl_crypto::{DataKey, OwnerKey};
use psl_sandbox::SandboxLimits;
use serde::{Deserialize, Serialize};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// A worker of the deployment, as the cluster file lists it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkerInfo {
    /// The worker's id.
    pub id: u32,
    /// The worker's control address (its `DEBUG` line interface).
    pub control: SocketAddr,
}

/// The cluster file (`cluster.json`) of a running deployment.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ClusterInfo {
    /// The scheduler's address.
    pub scheduler: SocketAddr,
    /// The leader's address (TLS; clients attest it before sending it anything).
    pub leader: SocketAddr,
    /// The deployment's fabric (`router` in cluster files written before NATS).
    #[serde(alias = "router")]
    pub fabric: psl_fabric::FabricSpec,
    /// What the deployment's roles attest with (`sim-INSECURE`, `sgx`, `tdx`, `snp`): for
    /// operators; clients go by the policy.
    pub attestation_backend: String,
    /// The attestation policy file clients check the leader against (the leader's own).
    pub attest_policy: std::path::PathBuf,
    /// The workers started with the deployment.
    pub workers: Vec<WorkerInfo>,
    /// Capsule hosts: server id, address, store directory (one store per job capsule in it).
    #[serde(default)]
    pub capsule_hosts: Vec<(u32, SocketAddr, std::path::PathBuf)>,
    /// Coordinator hosts: id (the rank each job's coordinator has there) and address.
    #[serde(default)]
    pub coordinator_hosts: Vec<(u32, SocketAddr)>,
    /// Process ids of the roles, for operators.
    #[serde(default)]
    pub pids: Vec<(String, u32)>,
}

impl ClusterInfo {
    /// The verifier of the cluster's policy file.
    pub fn verifier(&self) -> Result<PolicyVerifier, FaasError> {
        let p = Policy::load(&self.attest_policy).map_err(|e| FaasError::Config(e.to_string()))?;
        PolicyVerifier::new(p, VerifyTime::Now).map_err(|e| FaasError::Config(e.to_string()))
    }
}

/// A job to run on a deployment over the network (`psl run --cluster`).
pub struct RemoteJob {
    /// The lambda program (JavaScript source); sealed before it leaves the client.
    pub program: String,
    /// How many lambdas to run.
    pub lambdas: u32,
    /// Input handed to every lambda, sealed like the program; `None`: no input.
    pub input: Option<String>,
    /// The owner key; a fresh one if `None`.
    pub owner: Option<OwnerKey>,
    /// Fewest attested workers the job may run on.
    pub min_workers: usize,
    /// Keep every record of the job (an observer on the router) for the `.capsule` file.
    pub record_capsule: bool,
    /// Ask the leader to rotate the job's application key this long after admission.
    pub rotate_after_ms: Option<u64>,
    /// Told each step of the job as it happens (the leader's jobs API streams these).
    pub progress: Option<Progress>,
}

/// A callback told each step of a running job ([`RemoteJob::progress`]).
pub type Progress = std::sync::Arc<dyn Fn(JobProgress) + Send + Sync>;

/// A step of a running job, in the order they happen.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum JobProgress {
    /// The program and input are sealed; the leader is attested and the job begun.
    Begun,
    /// The scheduler forwarded the job to these many workers.
    Dispatched {
        /// Workers the scheduler forwarded to.
        workers: usize,
    },
    /// The leader attested the workers and granted them lambdas.
    Admitted {
        /// Workers granted lambdas.
        workers: usize,
        /// Lambdas granted, over all of them.
        lambdas: usize,
        /// Workers the leader refused.
        refused: usize,
    },
    /// A worker's sealed outcome came back.
    WorkerDone {
        /// The worker.
        worker: u32,
        /// Outcomes back so far.
        done: usize,
        /// Outcomes expected.
        of: usize,
    },
    /// Every outcome is back: the leader is ending the job (RESET, durability report).
    Ending,
}

fn ms_us(a: u64, b: u64) -> f64 {
    b.saturating_sub(a) as f64 / 1e3
}

fn expect_ok(m: Msg, what: &str) -> Result<Msg, FaasError> {
    match m {
        Msg::Error { why } => Err(FaasError::Net(format!("{what}: {why}"))),
        m => Ok(m),
    }
}

/// Runs one job on the deployment `c` from submit to RESET, checking the leader under the
/// cluster file's policy.
pub fn run_remote(c: &ClusterInfo, req: RemoteJob) -> Result<JobReport, FaasError> {
    run_remote_with(c, &c.verifier()?, req)
}

/// [`run_remote`], checking the leader with `leader_verifier`.
pub fn run_remote_with(
    c: &ClusterInfo,
    leader_verifier: &dyn AttestVerifier,
    mut req: RemoteJob,
) -> Result<JobReport, FaasError> {
    if req.lambdas == 0 || req.lambdas > LAMBDAS_MAX {
        return Err(FaasError::Config(format!("lambdas must be 1 ..= {LAMBDAS_MAX}, got {}", req.lambdas)));
    }
    let progress = req.progress.take();
    let tell = |p: JobProgress| {
        if let Some(f) = &progress {
            f(p)
        }
    };
    let (prep, session) = PreparedJob::prepare(c, leader_verifier, &mut req)?;
    tracing::debug!("client: capsule and sealing {:.1} ms", ms_us(prep.t0, unix_us()));
    let mut lead = session.begin(None)?;
    tell(JobProgress::Begun);
    tracing::debug!("client: leader attested, job begun {:.1} ms", ms_us(prep.t0, unix_us()));
    let t_leader = unix_us();
    // 2. Submit to the scheduler.
    let (mut sched, t_submit) = prep.submit(c, req.lambdas)?;
    let mut admitted = Vec::<(u32, u32, u32)>::new();
    let result = run_job(&mut sched, &mut lead, req.rotate_after_ms, &mut admitted, &tell);
    tell(JobProgress::Ending);
    let end = end_job(&mut lead, &session, &admitted)?;
    let run = result?;
    let b = LaunchBreakdown {
        leader_attest_ms: ms_us(prep.t0, t_leader),
        client_to_scheduler_ms: ms_us(t_submit, run.received_us),
        ..Default::default()
    };
    prep.into_report(req.lambdas, run, end, b)
}

/// A job's capsule, keys and sealed program and input, made before anything is sent.
struct PreparedJob {
    t0: u64,
    job: JobId,
    meta: SignedMetadata,
    data_key: DataKey,
    program: SealedProgram,
    input: Option<SealedProgram>,
    recorder: Option<Recorder>,
}

/// What the scheduler and the leader answered while the job ran (steps 2 to 4).
struct JobRun {
    received_us: u64,
    granted: Vec<(u32, Vec<u32>)>,
    refused: Vec<(u32, String)>,
    outcomes: Vec<Msg>,
    rotations: Vec<KeyRotationReport>,
}

/// What the leader reported when it ended the job (step 5).
struct JobEnd {
    resets: Vec<(u32, WorkerDebug)>,
    stored: Vec<(u32, u64)>,
    coordinators: Vec<CoordinatorStats>,
}

/// The workers' opened results, gathered from their outcomes.
#[derive(Default)]
struct WorkerResults {
    lambdas: Vec<LambdaReport>,
    errors: Vec<String>,
    durability: Vec<(u32, DurableEnd)>,
    last_start: u64,
    last_first_op: u64,
}

impl PreparedJob {
    /// Makes the job's capsule and keys, seals its program and input, starts the recorder (if
    /// asked for) and readies the leader session holding the owner key.
    fn prepare<'a>(
        c: &ClusterInfo,
        leader_verifier: &'a dyn AttestVerifier,
        req: &mut RemoteJob,
    ) -> Result<(PreparedJob, LeaderSession<'a>), FaasError> {
        let t0 = unix_us();
        let limits = SandboxLimits::default();
        let job = JobId::random();
        let owner = req.owner.take().unwrap_or_else(OwnerKey::generate);
        let app_index = rand::random::<u32>() >> 1;
        let meta = new_capsule_with(
            &owner,
            app_index,
            &format!("job-{job}"),
            t0 / 1000,
            Limits::default(),
            WriterKeys::Certified,
        )
        .map_err(|e| FaasError::Capsule(e.to_string()))?;
        let app = owner.app(app_index).map_err(|e| FaasError::Config(e.to_string()))?;
        let data_key = app.data_key();
        drop(app);
        let program =
            SealedProgram::seal(&data_key, job, Payload::Program, req.program.as_bytes(), limits.program_bytes_max)?;
        let input = match &req.input {
            Some(i) => Some(SealedProgram::seal(&data_key, job, Payload::Input, i.as_bytes(), limits.input_bytes_max)?),
            None => None,
        };
        let recorder = if req.record_capsule {
            let ep = c
                .fabric
                .connect("capsule-recorder", &psl_fabric::Interest::observer(meta.name().0 .0))
                .map_err(|e| FaasError::Net(format!("attaching to the fabric {}: {e}", c.fabric)))?;
            Some(Recorder::start(ep, meta.clone(), Duration::from_millis(100))?)
        } else {
            None
        };
        // 1. Attest the leader on this very TLS connection, then hand it the owner key (kept, wiped
        // on drop, until the job ends: a restarted leader needs it to take the job back).
        let owner_file = zeroize::Zeroizing::new(owner.to_file_string().to_string());
        drop(owner);
        let session = LeaderSession {
            addr: c.leader,
            verifier: leader_verifier,
            job,
            owner: owner_file,
            meta: hex::encode(meta.encode()),
            lambdas: req.lambdas,
            min_workers: req.min_workers,
        };
        Ok((PreparedJob { t0, job, meta, data_key, program, input, recorder }, session))
    }

    /// Step 2: connects to the scheduler and submits the job; returns the connection and when.
    fn submit(&self, c: &ClusterInfo, lambdas: u32) -> Result<(TcpStream, u64), FaasError> {
        let mut sched = TcpStream::connect_timeout(&c.scheduler, Duration::from_secs(5))
            .map_err(|e| FaasError::Net(format!("connecting to the scheduler {}: {e}", c.scheduler)))?;
        sched.set_nodelay(true).ok();
        sched.set_read_timeout(Some(Duration::from_secs(600)))?;
        let t_submit = unix_us();
        write_msg(
            &mut sched,
            &Msg::Submit {
                job: hex::encode(self.job.0),
                program: hex::encode(&self.program.bytes),
                input: self.input.as_ref().map(|i| hex::encode(&i.bytes)),
                lambdas,
            },
        )?;
        Ok((sched, t_submit))
    }

    /// Opens the workers' sealed results, noting their times in `b` (`granted`: the admitted).
    fn open_results(
        &self,
        outcomes: Vec<Msg>,
        granted: &[(u32, Vec<u32>)],
        received_us: u64,
        b: &mut LaunchBreakdown,
    ) -> Result<WorkerResults, FaasError> {
        let mut r = WorkerResults::default();
        for o in outcomes {
            let Msg::WorkerDone { worker, sealed_result, error, times, .. } = o else { continue };
            let was_granted = granted.iter().any(|(w, _)| *w == worker);
            if let Some(e) = error {
                if was_granted {
                    r.errors.push(format!("worker {worker}: {e}"));
                }
                continue;
            }
            let Some(sealed) = sealed_result else { continue };
            let body = SealedProgram { bytes: unhex("sealed_result", &sealed)? }.open(
                &self.data_key,
                self.job,
                Payload::Result,
                RESULT_BYTES_MAX,
            )?;
            let WorkerResultBody { lambdas: mut mine, durable } = serde_json::from_slice(&body)
                .map_err(|e| FaasError::Malformed { what: "result", why: e.to_string() })?;
            r.durability.push((worker, durable));
            let WorkerTimes { forwarded_us, granted_us, keys_ready_us, started_us, first_op_us } = times;
            b.scheduler_to_workers_ms = b.scheduler_to_workers_ms.max(ms_us(received_us, forwarded_us));
            b.attestation_ms = b.attestation_ms.max(ms_us(forwarded_us, granted_us));
            b.key_delivery_ms = b.key_delivery_ms.max(ms_us(granted_us, keys_ready_us));
            b.program_load_ms = b.program_load_ms.max(ms_us(keys_ready_us, started_us));
            r.last_start = r.last_start.max(started_us);
            r.last_first_op = r.last_first_op.max(first_op_us);
            for l in &mut mine {
                l.worker = worker;
            }
            r.lambdas.extend(mine);
        }
        Ok(r)
    }

    /// Opens the results and makes the job's report (`lambdas_asked`: how many were asked for).
    fn into_report(
        self,
        lambdas_asked: u32,
        run: JobRun,
        end: JobEnd,
        mut b: LaunchBreakdown,
    ) -> Result<JobReport, FaasError> {
        let JobRun { received_us, granted, refused, outcomes, rotations: key_rotations } = run;
        let WorkerResults { mut lambdas, errors, durability, last_start, last_first_op } =
            self.open_results(outcomes, &granted, received_us, &mut b)?;
        let job = self.job;
        if !errors.is_empty() && lambdas.is_empty() {
            return Err(FaasError::Net(format!("job {job} failed: {}", errors.join("; "))));
        }
        lambdas.sort_by_key(|l| l.lambda);
        let ok =
            errors.is_empty() && lambdas.len() == lambdas_asked as usize && lambdas.iter().all(|l| l.error.is_none());
        for e in &errors {
            tracing::warn!("{e}");
        }
        b.launch_ms = ms_us(self.t0, last_start);
        b.first_op_ms = ms_us(last_start, last_first_op);
        b.total_ms = ms_us(self.t0, unix_us());
        let capsule_file = self.recorder.map(|r| r.finish(&self.meta));
        Ok(JobReport {
            job: job.to_string(),
            capsule: self.meta.name().to_string(),
            lambdas,
            refused_workers: refused,
            launch: b,
            ok,
            capsule_records: capsule_file.as_ref().map(|(_, n)| *n).unwrap_or(0),
            capsule_file: capsule_file.map(|(f, _)| f),
            resets: end.resets,
            stored_records: end.stored,
            key_rotations,
            durable: job_durable(&durability, granted.len()),
            durability,
            coordinators: end.coordinators,
        })
    }
}

/// Steps 3 and 4: has the leader admit the dispatched workers (noting them in `admitted`),
/// rotates the key if asked for, and reads every forwarded worker's outcome.
fn run_job(
    sched: &mut TcpStream,
    lead: &mut tls::ClientStream,
    rotate_after_ms: Option<u64>,
    admitted: &mut Vec<(u32, u32, u32)>,
    tell: &dyn Fn(JobProgress),
) -> Result<JobRun, FaasError> {
    let Msg::Dispatched { workers, received_us } = expect_ok(read_msg(sched)?, "scheduler")? else {
        return Err(FaasError::Net("expected Dispatched from the scheduler".into()));
    };
    tell(JobProgress::Dispatched { workers: workers.len() });
    // 3. The leader admits (attests) the workers the scheduler forwarded to.
    write_msg(lead, &Msg::Expect { workers: workers.clone() })?;
    let Msg::Admitted { granted, refused, nodes } = expect_ok(read_msg(lead)?, "leader: admission")? else {
        return Err(FaasError::Net("expected Admitted from the leader".into()));
    };
    *admitted = granted
        .iter()
        .filter_map(|(w, l)| nodes.iter().find(|(x, _)| x == w).map(|(_, n)| (*w, *n, l.len() as u32)))
        .collect();
    tell(JobProgress::Admitted {
        workers: granted.len(),
        lambdas: granted.iter().map(|(_, l)| l.len()).sum(),
        refused: refused.len(),
    });
    // 3b. A key rotation while the lambdas run, if asked for (outcomes queue meanwhile).
    let mut rotations = Vec::new();
    if let Some(ms) = rotate_after_ms {
        rotations.extend(rotate_key_after(lead, ms)?);
    }
    // 4. Every forwarded worker's outcome, relayed (sealed) by the scheduler.
    let mut outcomes = Vec::new();
    for _ in 0..workers.len() {
        match read_msg(sched)? {
            Msg::WorkerResult { done } => {
                let worker = match &*done {
                    Msg::WorkerDone { worker, .. } => *worker,
                    _ => u32::MAX,
                };
                outcomes.push(*done);
                tell(JobProgress::WorkerDone { worker, done: outcomes.len(), of: workers.len() });
            }
            m => return Err(FaasError::Net(format!("scheduler: unexpected {}", m.name()))),
        }
    }
    Ok(JobRun { received_us, granted, refused, outcomes, rotations })
}

/// Step 3b: waits `ms`, then has the leader rotate the job's key; a failed exchange is logged.
fn rotate_key_after(lead: &mut tls::ClientStream, ms: u64) -> Result<Option<KeyRotationReport>, FaasError> {
    std::thread::sleep(Duration::from_millis(ms));
    let asked = write_msg(lead, &Msg::RotateKey { margin_epochs: crate::rotation::ROTATION_MARGIN_EPOCHS });
    match asked.and_then(|()| read_msg(lead)).and_then(|m| expect_ok(m, "leader: key rotation")) {
        Ok(Msg::Rotated { report }) => Ok(Some(report)),
        Ok(m) => Err(FaasError::Net(format!("leader: expected Rotated, got {}", m.name()))),
        Err(e) => {
            tracing::error!("{e}");
            Ok(None)
        }
    }
}

/// Step 5: ends the job whatever happened, through a returned leader if this one went away.
fn end_job(
    lead: &mut tls::ClientStream,
    session: &LeaderSession,
    admitted: &[(u32, u32, u32)],
) -> Result<JobEnd, FaasError> {
    // The leader erases its keys and RESETs the workers. If the leader went away meanwhile (the
    // job ran on: its coordinators, capsule hosts and workers do not need it), a restarted one
    // is attested and takes the job back to end it.
    let ended = match write_msg(lead, &Msg::EndJob).and_then(|()| read_msg(lead)) {
        Ok(m) => Ok(m),
        Err(e) => {
            tracing::warn!("client: the leader went away during the job ({e}); waiting for it to come back");
            session.end_with_returned_leader(admitted)
        }
    };
    match ended? {
        Msg::Ended { resets, stored, coordinators } => Ok(JobEnd { resets, stored, coordinators }),
        Msg::Error { why } => Err(FaasError::Net(format!("leader: ending the job: {why}"))),
        m => Err(FaasError::Net(format!("leader: expected Ended, got {}", m.name()))),
    }
}

/// How long a client waits for a leader that went away during its job to come back.
const LEADER_RETURN_WAIT: Duration = Duration::from_secs(60);

/// What the client needs to (re)attest the leader and hand it the job.
struct LeaderSession<'a> {
    addr: SocketAddr,
    verifier: &'a dyn AttestVerifier,
    job: JobId,
    owner: zeroize::Zeroizing<String>,
    meta: String,
    lambdas: u32,
    min_workers: usize,
}

impl LeaderSession<'_> {
    /// Attests the leader on a new TLS connection (its report must bind the certificate key of
    /// that very connection), then hands it the owner key: a new job, or (`resume`) the running
    /// one taken back.
    fn begin(&self, resume: Option<Vec<(u32, u32, u32)>>) -> Result<tls::ClientStream, FaasError> {
        let me = TlsIdentity::generate("psl-client")?;
        let (mut lead, leader_spki) = tls::connect(self.addr, &me)?;
        lead.sock.set_read_timeout(Some(Duration::from_secs(120)))?;
        let nonce: [u8; 32] = rand::random();
        write_msg(&mut lead, &Msg::ClientHello { nonce: hex::encode(nonce) })?;
        let Msg::LeaderReport { backend, evidence } = expect_ok(read_msg(&mut lead)?, "leader")? else {
            return Err(FaasError::Net("expected the leader's report".into()));
        };
        self.verifier
            .verify(&super::wire::evidence(&backend, &evidence)?, &nonce, &bind_channel_key(&leader_spki))
            .map_err(|e| FaasError::Attestation { who: "leader".into(), why: e.to_string() })?;
        let mut begin = Msg::BeginJob {
            job: hex::encode(self.job.0),
            owner: self.owner.clone(),
            meta: self.meta.clone(),
            lambdas: self.lambdas,
            min_workers: self.min_workers,
            resume,
        };
        let sent = write_msg(&mut lead, &begin);
        if let Msg::BeginJob { owner, .. } = &mut begin {
            zeroize::Zeroize::zeroize(owner);
        }
        sent?;
        expect_ok(read_msg(&mut lead)?, "leader: begin job")?;
        Ok(lead)
    }

    /// The leader's connection broke during the job: waits (bounded) for a leader at the same
    /// address, has it take the job back (`admitted`: each granted worker, its node and its
    /// slots, for the revocations at the job's end) and end it.
    fn end_with_returned_leader(&self, admitted: &[(u32, u32, u32)]) -> Result<Msg, FaasError> {
        let deadline = std::time::Instant::now() + LEADER_RETURN_WAIT;
        loop {
            let r = self.begin(Some(admitted.to_vec())).and_then(|mut lead| {
                write_msg(&mut lead, &Msg::EndJob)?;
                read_msg(&mut lead)
            });
            match r {
                Ok(m) => {
                    tracing::info!("client: a restarted leader took the job back and ended it");
                    return Ok(m);
                }
                Err(e) if std::time::Instant::now() < deadline => {
                    tracing::debug!("client: the leader is not back yet: {e}");
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => {
                    return Err(FaasError::Net(format!(
                        "the leader went away during job {} and did not come back within {} s: {e}",
                        self.job,
                        LEADER_RETURN_WAIT.as_secs()
                    )))
                }
            }
        }
    }
}
