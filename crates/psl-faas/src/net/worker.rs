//! `psl worker`: registers with the scheduler and heartbeats; for each forwarded job it makes a
//! fresh TLS identity, attests the leader (the leader's report must bind the leader's TLS
//! certificate key and be in the policy), attests itself (its report binds its key-delivery
//! channel key and its TLS certificate key), receives its grant, runs its slots on a node
//! attached to the router, seals its results for the client, and on RESET wipes everything.
//!
//! Control interface (line protocol on `--control`): `DEBUG` answers one JSON line with what
//! the worker holds (`holds_keys`, `node_running`, `memtable_entries`, `attested`) and
//! `busy`, `jobs`. It answers nothing secret and changes nothing; still, as every control
//! interface, it is bounded: at most [`CONTROL_CONNECTIONS_MAX`] connections, lines of at most
//! [`CONTROL_LINE_BYTES_MAX`] bytes, and a connection idle (or not reading) for
//! [`CONTROL_IDLE_MS`] is closed.

use super::wire::{evidence, read_msg, unhex, unhex_n, write_msg, Msg, WorkerTimes};
use super::{instant_us, unix_us};
use crate::attest::{bind_channel_key, AttestVerifier, Attester};
use crate::deploy::lambda_reports;
use crate::error::FaasError;
use crate::grant::{Grant, RotationGrant};
use crate::program::{JobId, SealedProgram};
use crate::scheduler::SealedJob;
use crate::tls::{self, ClientStream, TlsIdentity};
use crate::worker::Worker;
use parking_lot::Mutex;
use psl_sandbox::SandboxLimits;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Most concurrent connections to a worker's control interface.
pub const CONTROL_CONNECTIONS_MAX: usize = 16;
/// Longest control request line.
pub const CONTROL_LINE_BYTES_MAX: usize = 256;
/// A control connection that sends (or reads) nothing for this long is closed.
pub const CONTROL_IDLE_MS: u64 = 30_000;

/// How a `psl worker` process is run.
pub struct WorkerConfig {
    /// The worker's id.
    pub id: u32,
    /// The scheduler's address.
    pub scheduler: SocketAddr,
    /// The leader's address (TLS).
    pub leader: SocketAddr,
    /// The fabric each job's node attaches to.
    pub fabric: psl_fabric::FabricSpec,
    /// Checks the leader's reports (the worker's copy of the deployment's policy).
    pub leader_verifier: Box<dyn AttestVerifier>,
    /// Resource limits of each lambda's sandbox (part of the measured configuration).
    pub limits: SandboxLimits,
    /// How often the worker heartbeats to the scheduler.
    pub heartbeat: Duration,
    /// Where the control listener binds: a bounded line protocol (`DEBUG`) for operators and tests.
    pub control: SocketAddr,
    /// The control address others reach (told to the scheduler); default: the bound one.
    pub advertise_control: Option<String>,
    /// TEST ONLY: stop heartbeating after this long (a hung worker).
    pub test_stop_heartbeats_after: Option<Duration>,
}

/// Addresses the worker bound, for whoever started it.
pub struct WorkerReady {
    /// The control address the listener bound (the actual port when 0 was asked for).
    pub control: SocketAddr,
}

struct Agent {
    cfg: WorkerConfig,
    worker: Worker,
    to_scheduler: Mutex<TcpStream>,
    busy: AtomicBool,
    jobs: AtomicU64,
}

/// Runs the worker until the process ends; `attester` makes its reports.
pub fn serve_worker(
    cfg: WorkerConfig,
    attester: Box<dyn Attester>,
    ready: impl FnOnce(WorkerReady),
) -> Result<(), FaasError> {
    let control =
        TcpListener::bind(cfg.control).map_err(|e| FaasError::Net(format!("binding {}: {e}", cfg.control)))?;
    let control_addr = control.local_addr()?;
    let mut sched = register(&cfg, control_addr, false)?;
    let worker = Worker::new(cfg.id, attester, cfg.limits);
    let agent = Arc::new(Agent {
        to_scheduler: Mutex::new(sched.try_clone()?),
        worker,
        cfg,
        busy: AtomicBool::new(false),
        jobs: AtomicU64::new(0),
    });
    let a = agent.clone();
    std::thread::Builder::new().name("worker-control".into()).spawn(move || {
        serve_control_lines(control, Duration::from_millis(CONTROL_IDLE_MS), move |line| control_reply(&a, line))
    })?;
    let a = agent.clone();
    std::thread::Builder::new().name("worker-heartbeat".into()).spawn(move || {
        let t0 = std::time::Instant::now();
        loop {
            std::thread::sleep(a.cfg.heartbeat);
            if a.cfg.test_stop_heartbeats_after.is_some_and(|d| t0.elapsed() > d) {
                tracing::warn!("worker {}: TEST FAULT: heartbeats stopped", a.cfg.id);
                return;
            }
            // A failed write means the scheduler link is down; the main loop registers again.
            let _ = write_msg(&mut *a.to_scheduler.lock(), &Msg::Heartbeat { worker: a.cfg.id });
        }
    })?;
    ready(WorkerReady { control: control_addr });
    loop {
        let m = match read_msg(&mut sched) {
            Ok(m) => m,
            Err(e) => {
                if agent.cfg.test_stop_heartbeats_after.is_some() {
                    return Err(e); // TEST FAULT: a hung worker stays gone
                }
                // Dropped by the scheduler (say, heartbeats late on a loaded machine) or the
                // link broke: register again, saying whether a job is still running here.
                tracing::warn!("worker {}: lost the scheduler ({e}); registering again", agent.cfg.id);
                let deadline = std::time::Instant::now() + Duration::from_secs(30);
                sched = loop {
                    std::thread::sleep(Duration::from_millis(100));
                    match register(&agent.cfg, control_addr, agent.busy.load(Ordering::Acquire)) {
                        Ok(s) => break s,
                        Err(e) if std::time::Instant::now() < deadline => {
                            tracing::warn!("worker {}: registering again: {e}", agent.cfg.id)
                        }
                        Err(e) => return Err(e),
                    }
                };
                *agent.to_scheduler.lock() = sched.try_clone()?;
                continue;
            }
        };
        match m {
            Msg::Forward { job, program, input, lambdas } => {
                if agent.busy.swap(true, Ordering::AcqRel) {
                    let d = Msg::WorkerDone {
                        worker: agent.cfg.id,
                        job,
                        sealed_result: None,
                        error: Some("busy with another job".into()),
                        times: WorkerTimes::default(),
                    };
                    write_msg(&mut *agent.to_scheduler.lock(), &d)?;
                    continue;
                }
                let a = agent.clone();
                std::thread::Builder::new().name("worker-job".into()).spawn(move || {
                    a.job(&job, &program, input.as_deref(), lambdas);
                    a.jobs.fetch_add(1, Ordering::Relaxed);
                    a.busy.store(false, Ordering::Release);
                    let _ = write_msg(&mut *a.to_scheduler.lock(), &Msg::Idle { worker: a.cfg.id });
                })?;
            }
            m => tracing::warn!("worker: unexpected {} from the scheduler", m.name()),
        }
    }
}

/// Connects to the scheduler and registers (`busy`: a job is still running here).
fn register(cfg: &WorkerConfig, control: SocketAddr, busy: bool) -> Result<TcpStream, FaasError> {
    let mut sched = TcpStream::connect_timeout(&cfg.scheduler, Duration::from_secs(5))
        .map_err(|e| FaasError::Net(format!("connecting to the scheduler {}: {e}", cfg.scheduler)))?;
    sched.set_nodelay(true).ok();
    let control = cfg.advertise_control.clone().unwrap_or_else(|| control.to_string());
    write_msg(&mut sched, &Msg::Register { worker: cfg.id, control, busy })?;
    sched.set_read_timeout(Some(Duration::from_secs(10)))?;
    match read_msg(&mut sched)? {
        Msg::Registered => {}
        Msg::Error { why } => return Err(FaasError::Net(format!("the scheduler refused registration: {why}"))),
        m => return Err(FaasError::Net(format!("registration: unexpected {}", m.name()))),
    }
    sched.set_read_timeout(None)?;
    Ok(sched)
}

fn control_reply(a: &Agent, line: &str) -> String {
    match line.trim() {
        "DEBUG" => {
            let mut v = serde_json::to_value(a.worker.debug()).unwrap_or_default();
            v["busy"] = a.busy.load(Ordering::Acquire).into();
            v["jobs"] = a.jobs.load(Ordering::Relaxed).into();
            v["worker"] = a.cfg.id.into();
            v.to_string()
        }
        other => format!("ERR unknown command {other:?} (DEBUG)"),
    }
}

/// Serves a one-line-request, one-line-answer control protocol on `listener`, each connection
/// on its own thread: at most [`CONTROL_CONNECTIONS_MAX`] at once (more are answered an error
/// and closed), lines of at most [`CONTROL_LINE_BYTES_MAX`] bytes (a longer one is answered an
/// error and the connection closed), and `idle` as the read and write timeout.
fn serve_control_lines(listener: TcpListener, idle: Duration, reply: impl Fn(&str) -> String + Send + Sync + 'static) {
    let reply = Arc::new(reply);
    let live = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for c in listener.incoming().flatten() {
        if live.load(Ordering::Acquire) >= CONTROL_CONNECTIONS_MAX {
            let mut c = c;
            let _ = c.write_all(b"ERR too many connections\n");
            continue;
        }
        live.fetch_add(1, Ordering::AcqRel);
        let (reply, live) = (reply.clone(), live.clone());
        let spawned = std::thread::Builder::new().name("worker-control-conn".into()).spawn({
            let live = live.clone();
            move || {
                control_conn(c, idle, &*reply);
                live.fetch_sub(1, Ordering::AcqRel);
            }
        });
        if spawned.is_err() {
            live.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

fn control_conn(c: TcpStream, idle: Duration, reply: &dyn Fn(&str) -> String) {
    if c.set_read_timeout(Some(idle)).is_err() || c.set_write_timeout(Some(idle)).is_err() {
        return;
    }
    let Ok(mut w) = c.try_clone() else { return };
    let mut r = BufReader::new(c);
    let mut line = Vec::new();
    loop {
        line.clear();
        // An error here is the idle timeout, a reset or a closed connection: done.
        let Ok(n) = r.by_ref().take(CONTROL_LINE_BYTES_MAX as u64 + 1).read_until(b'\n', &mut line) else { return };
        if n == 0 {
            return;
        }
        if line.len() > CONTROL_LINE_BYTES_MAX {
            let _ = w.write_all(b"ERR line too long\n");
            return;
        }
        let text = String::from_utf8_lossy(&line);
        if writeln!(w, "{}", reply(&text)).is_err() {
            return;
        }
    }
}

impl Agent {
    fn report(&self, job: &str, sealed: Option<SealedProgram>, error: Option<String>, times: WorkerTimes) {
        let d = Msg::WorkerDone {
            worker: self.cfg.id,
            job: job.into(),
            sealed_result: sealed.map(|s| hex::encode(s.bytes)),
            error,
            times,
        };
        if let Err(e) = write_msg(&mut *self.to_scheduler.lock(), &d) {
            tracing::warn!("worker {}: reporting to the scheduler: {e}", self.cfg.id);
        }
    }

    /// Attests both ways; returns the open channel, the grant and the capsule name it names.
    fn attest(&self, job: &str) -> Result<(ClientStream, Grant, Option<[u8; 32]>), FaasError> {
        let me = TlsIdentity::generate("psl-worker")?;
        let (mut s, leader_spki) = tls::connect(self.cfg.leader, &me)?;
        s.sock.set_read_timeout(Some(Duration::from_secs(60)))?;
        let my_nonce: [u8; 32] = rand::random();
        write_msg(&mut s, &Msg::WorkerHello { worker: self.cfg.id, job: job.into(), nonce: hex::encode(my_nonce) })?;
        let Msg::LeaderChallenge { backend, evidence: ev, nonce } = read_msg(&mut s)? else {
            return Err(FaasError::Net("expected the leader's challenge".into()));
        };
        self.cfg
            .leader_verifier
            .verify(&evidence(&backend, &ev)?, &my_nonce, &bind_channel_key(&leader_spki))
            .map_err(|e| FaasError::Attestation { who: "leader".into(), why: e.to_string() })?;
        let offer = self.worker.offer_for(&unhex_n::<32>("nonce", &nonce)?, Some(me.spki_hash()))?;
        write_msg(&mut s, &Msg::offer(&offer))?;
        match read_msg(&mut s)? {
            Msg::Grant { node_id, lambdas, sealed_keys, capsule } => {
                let grant =
                    Grant { worker: self.cfg.id, node_id, lambdas, sealed_keys: unhex("sealed_keys", &sealed_keys)? };
                let capsule = capsule.map(|c| unhex_n::<32>("capsule", &c)).transpose()?;
                Ok((s, grant, capsule))
            }
            Msg::Refused { why } => Err(FaasError::Attestation { who: format!("worker {}", self.cfg.id), why }),
            m => Err(FaasError::Net(format!("expected a grant, got {}", m.name()))),
        }
    }

    /// Runs a granted job's lambdas on the fabric and seals the result (noting the times in `times`).
    fn run_sealed(
        &self,
        sealed: &SealedJob,
        grant: &Grant,
        capsule: Option<[u8; 32]>,
        times: &mut WorkerTimes,
    ) -> Result<SealedProgram, FaasError> {
        let interest = match capsule {
            Some(c) => psl_fabric::Interest::node(c, grant.node_id, false),
            None => psl_fabric::Interest::everything(Vec::new()),
        };
        let ep = self
            .cfg
            .fabric
            .connect(&format!("worker-{}", self.cfg.id), &interest)
            .map_err(|e| FaasError::Net(format!("attaching to the fabric {}: {e}", self.cfg.fabric)))?;
        tracing::debug!(
            "worker {}: fabric attached {:.1} ms after the grant",
            self.cfg.id,
            (unix_us() - times.granted_us) as f64 / 1e3
        );
        let run = self.worker.run(sealed, grant, ep)?;
        times.keys_ready_us = instant_us(run.keys_ready);
        times.started_us = instant_us(run.lambdas_started);
        times.first_op_us = run.outcomes.iter().filter_map(|o| o.first_op_at).map(instant_us).max().unwrap_or(0);
        if let Err(e) = &run.final_sync {
            tracing::warn!("worker {}: final sync: {e}", self.cfg.id);
        }
        let body = crate::deploy::WorkerResultBody { lambdas: lambda_reports(&run), durable: run.durable.clone() };
        let body = serde_json::to_vec(&body).map_err(|e| FaasError::Net(e.to_string()))?;
        self.worker.seal_result(sealed.job, &body)
    }

    fn job(&self, job_hex: &str, program: &str, input: Option<&str>, lambdas: u32) {
        let mut times = WorkerTimes { forwarded_us: unix_us(), ..WorkerTimes::default() };
        let job = match unhex_n::<16>("job", job_hex) {
            Ok(j) => JobId(j),
            Err(e) => return self.report(job_hex, None, Some(e.to_string()), times),
        };
        let (mut chan, grant, capsule) = match self.attest(job_hex) {
            Ok(x) => x,
            Err(e) => {
                self.worker.reset();
                return self.report(job_hex, None, Some(e.to_string()), times);
            }
        };
        times.granted_us = unix_us();
        // The attested channel to the leader stays open for the whole job: key rotations
        // arrive on it (answered at once, while the lambdas run), then the RESET.
        enum FromLeader {
            Reset,
            Ended(String),
        }
        let (ev_tx, ev_rx) = crossbeam_channel::bounded::<FromLeader>(1);
        let (left_tx, left_rx) = crossbeam_channel::bounded::<crate::worker::WorkerDebug>(1);
        std::thread::scope(|sc| {
            sc.spawn(move || {
                let _ = chan.sock.set_read_timeout(Some(Duration::from_secs(600)));
                loop {
                    match read_msg(&mut chan) {
                        Ok(Msg::Rotate { key_gen, sealed_keys }) => {
                            let r = unhex("sealed_keys", &sealed_keys).and_then(|b| {
                                self.worker.rotate(&RotationGrant { worker: self.cfg.id, key_gen, sealed_keys: b })
                            });
                            let reply = match r {
                                Ok(_) => Msg::RotateDone { key_gen },
                                Err(e) => {
                                    tracing::warn!("worker {}: key rotation refused: {e}", self.cfg.id);
                                    Msg::Error { why: e.to_string() }
                                }
                            };
                            if let Err(e) = write_msg(&mut chan, &reply) {
                                let _ = ev_tx.send(FromLeader::Ended(e.to_string()));
                                return;
                            }
                        }
                        Ok(Msg::Reset) => {
                            let _ = ev_tx.send(FromLeader::Reset);
                            if let Ok(left) = left_rx.recv() {
                                let _ = write_msg(&mut chan, &Msg::ResetDone { debug: left });
                            }
                            return;
                        }
                        Ok(m) => {
                            let _ = ev_tx.send(FromLeader::Ended(format!("unexpected {}", m.name())));
                            return;
                        }
                        Err(e) => {
                            let _ = ev_tx.send(FromLeader::Ended(e.to_string()));
                            return;
                        }
                    }
                }
            });
            let outcome = sealed_job(job, program, input, lambdas)
                .and_then(|sealed| self.run_sealed(&sealed, &grant, capsule, &mut times));
            match outcome {
                Ok(s) => self.report(job_hex, Some(s), None, times.clone()),
                Err(e) => self.report(job_hex, None, Some(e.to_string()), times.clone()),
            }
            // Granted: wait for the leader's RESET on the attested channel.
            match ev_rx.recv() {
                Ok(FromLeader::Reset) => {
                    let left = self.worker.reset();
                    tracing::info!("worker {}: RESET done: {left:?}", self.cfg.id);
                    let _ = left_tx.send(left);
                }
                other => {
                    let why = match other {
                        Ok(FromLeader::Ended(e)) => e,
                        _ => "gone".into(),
                    };
                    tracing::warn!(
                        "worker {}: the leader's channel ended without RESET ({why}); wiping anyway",
                        self.cfg.id
                    );
                    self.worker.reset();
                }
            }
        });
    }
}

/// Decodes a job's sealed program and input into the job the worker runs.
fn sealed_job(job: JobId, program: &str, input: Option<&str>, lambdas: u32) -> Result<SealedJob, FaasError> {
    Ok(SealedJob {
        job,
        program: SealedProgram { bytes: unhex("program", program)? },
        input: match input {
            Some(i) => Some(SealedProgram { bytes: unhex("input", i)? }),
            None => None,
        },
        lambdas,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn control_server(idle: Duration) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || serve_control_lines(l, idle, |line| format!("echo {}", line.trim())));
        addr
    }

    fn answer(s: &mut TcpStream) -> String {
        let mut b = Vec::new();
        let _ = BufReader::new(s).read_until(b'\n', &mut b);
        String::from_utf8_lossy(&b).into_owned()
    }

    /// The attacker sends an endless line, or opens connections and sends nothing: the first
    /// is cut at the line bound, the others at the idle limit and the connection bound, and a
    /// well-behaved caller is still answered.
    #[test]
    fn adversary_endless_lines_and_idle_connections_are_bounded() {
        let addr = control_server(Duration::from_millis(300));
        let mut flood = TcpStream::connect(addr).unwrap();
        let _ = flood.write_all(&vec![b'x'; 64 * 1024]);
        assert_eq!(answer(&mut flood), "ERR line too long\n");
        let idle: Vec<TcpStream> = (0..CONTROL_CONNECTIONS_MAX).map(|_| TcpStream::connect(addr).unwrap()).collect();
        std::thread::sleep(Duration::from_millis(100));
        let mut refused = TcpStream::connect(addr).unwrap();
        assert_eq!(answer(&mut refused), "ERR too many connections\n");
        // The idle connections are closed after the limit, and the slots come back.
        for mut c in idle {
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut b = [0u8; 1];
            assert_eq!(c.read(&mut b).unwrap_or(0), 0, "an idle connection was kept open");
        }
        std::thread::sleep(Duration::from_millis(50));
        let mut ok = TcpStream::connect(addr).unwrap();
        ok.write_all(b"DEBUG\n").unwrap();
        assert_eq!(answer(&mut ok), "echo DEBUG\n");
    }
}
