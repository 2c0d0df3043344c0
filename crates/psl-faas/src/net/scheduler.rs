//! `psl scheduler` (untrusted): plain TCP, since everything it handles is sealed.
//!
//! A worker connects, sends `Register`, then `Heartbeat`s; the scheduler drops a worker whose
//! heartbeats stop for `heartbeat_timeout` (or whose connection closes) from the registry. A
//! client sends `Submit` (sealed program and input, public configuration); the scheduler picks
//! idle workers (at most one per lambda), sends each a `Forward`, answers `Dispatched`, and
//! relays each worker's `WorkerDone` (sealed results or an error) as `WorkerResult`.

use super::unix_us;
use super::wire::{read_msg, write_msg, Msg, WorkerStatus, WorkerTimes};
use crate::error::FaasError;
use crossbeam_channel::{unbounded, Sender};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How the scheduler process (`psl scheduler`) is run.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Where it listens for workers and clients (plain TCP: it only sees sealed bytes).
    pub listen: SocketAddr,
    /// A worker silent for this long is dropped from the registry.
    pub heartbeat_timeout: Duration,
    /// How long a client waits for a worker's outcome.
    pub job_timeout: Duration,
    /// Most workers in the registry.
    pub workers_max: usize,
    /// TEST ONLY: flip one byte (this index, modulo the length) of every sealed program
    /// forwarded: a malicious scheduler.
    pub test_flip_program_byte: Option<usize>,
}

/// How long a submitted job waits for a first idle worker.
const IDLE_WAIT: Duration = Duration::from_secs(2);

struct Entry {
    tx: Arc<Mutex<TcpStream>>,
    conn: u64,
    last: Instant,
    idle: bool,
    job: Option<String>,
}

#[derive(Default)]
struct State {
    workers: BTreeMap<u32, Entry>,
    jobs: HashMap<String, Sender<Msg>>,
}

struct Shared {
    cfg: SchedulerConfig,
    st: Mutex<State>,
    next_conn: AtomicU64,
}

/// Runs the scheduler until the process ends: binds `cfg.listen`, calls `ready` with the bound
/// address, then serves workers and clients. Fails only on bind or setup errors.
pub fn serve_scheduler(cfg: SchedulerConfig, ready: impl FnOnce(SocketAddr)) -> Result<(), FaasError> {
    let listener = TcpListener::bind(cfg.listen).map_err(|e| FaasError::Net(format!("binding {}: {e}", cfg.listen)))?;
    let addr = listener.local_addr()?;
    if cfg.test_flip_program_byte.is_some() {
        tracing::warn!("scheduler: TEST FAULT on: every forwarded program has a byte flipped");
    }
    let sh = Arc::new(Shared { cfg, st: Mutex::new(State::default()), next_conn: AtomicU64::new(1) });
    let reaper = sh.clone();
    std::thread::Builder::new().name("scheduler-reaper".into()).spawn(move || loop {
        std::thread::sleep(reaper.cfg.heartbeat_timeout / 4);
        let mut st = reaper.st.lock();
        let dead: Vec<u32> = st
            .workers
            .iter()
            .filter(|(_, e)| e.last.elapsed() > reaper.cfg.heartbeat_timeout)
            .map(|(w, _)| *w)
            .collect();
        for w in dead {
            tracing::warn!("scheduler: worker {w} missed its heartbeats; dropped from the registry");
            drop_worker(&mut st, w, None);
        }
    })?;
    ready(addr);
    for conn in listener.incoming() {
        let Ok(tcp) = conn else { continue };
        let sh = sh.clone();
        std::thread::Builder::new().name("scheduler-conn".into()).spawn(move || {
            if let Err(e) = handle(&sh, tcp) {
                tracing::info!("scheduler: connection ended: {e}");
            }
        })?;
    }
    Ok(())
}

fn done_error(worker: u32, job: &str, why: String) -> Msg {
    Msg::WorkerDone { worker, job: job.into(), sealed_result: None, error: Some(why), times: WorkerTimes::default() }
}

/// Removes `w` (only the registration from connection `conn`, when given); a job it was on
/// hears that it is gone.
fn drop_worker(st: &mut State, w: u32, conn: Option<u64>) {
    if conn.is_some_and(|c| st.workers.get(&w).map(|e| e.conn) != Some(c)) {
        return;
    }
    if let Some(e) = st.workers.remove(&w) {
        let _ = e.tx.lock().shutdown(std::net::Shutdown::Both);
        if let Some(job) = e.job {
            if let Some(tx) = st.jobs.get(&job) {
                let _ = tx.send(done_error(w, &job, format!("worker {w} left the registry during the job")));
            }
        }
    }
}

fn handle(sh: &Arc<Shared>, mut tcp: TcpStream) -> Result<(), FaasError> {
    tcp.set_nodelay(true).ok();
    tcp.set_read_timeout(Some(Duration::from_secs(30)))?;
    match read_msg(&mut tcp)? {
        Msg::Register { worker, control: _, busy } => {
            let conn = sh.next_conn.fetch_add(1, Ordering::Relaxed);
            let tx = Arc::new(Mutex::new(tcp.try_clone()?));
            {
                let mut st = sh.st.lock();
                if st.workers.len() >= sh.cfg.workers_max && !st.workers.contains_key(&worker) {
                    drop(st);
                    return write_msg(&mut tcp, &Msg::Error { why: "the registry is full".into() });
                }
                drop_worker(&mut st, worker, None);
                st.workers.insert(worker, Entry { tx: tx.clone(), conn, last: Instant::now(), idle: !busy, job: None });
            }
            write_msg(&mut *tx.lock(), &Msg::Registered)?;
            tracing::info!("scheduler: worker {worker} registered");
            tcp.set_read_timeout(Some(sh.cfg.heartbeat_timeout * 2))?;
            let r = worker_loop(sh, &mut tcp, worker, conn);
            drop_worker(&mut sh.st.lock(), worker, Some(conn));
            r
        }
        Msg::Submit { job, program, input, lambdas } => submit(sh, tcp, job, program, input, lambdas),
        Msg::Status => {
            let st = sh.st.lock();
            let workers = st
                .workers
                .iter()
                .map(|(w, e)| WorkerStatus {
                    worker: *w,
                    idle: e.idle,
                    since_heartbeat_ms: e.last.elapsed().as_millis() as u64,
                })
                .collect();
            drop(st);
            write_msg(&mut tcp, &Msg::StatusReply { workers })
        }
        m => write_msg(&mut tcp, &Msg::Error { why: format!("scheduler: unexpected {}", m.name()) }),
    }
}

fn worker_loop(sh: &Arc<Shared>, tcp: &mut TcpStream, worker: u32, conn: u64) -> Result<(), FaasError> {
    loop {
        let m = read_msg(tcp)?;
        let mut st = sh.st.lock();
        let Some(e) = st.workers.get_mut(&worker).filter(|e| e.conn == conn) else {
            return Err(FaasError::Net(format!("worker {worker} is no longer registered")));
        };
        e.last = Instant::now();
        match m {
            Msg::Heartbeat { .. } => {}
            Msg::Idle { .. } => {
                e.idle = true;
                e.job = None;
            }
            Msg::WorkerDone { ref job, .. } => {
                if e.job.as_deref() == Some(job.as_str()) {
                    e.job = None;
                }
                if let Some(tx) = st.jobs.get(job) {
                    let _ = tx.send(m);
                }
            }
            other => tracing::warn!("scheduler: worker {worker} sent {}", other.name()),
        }
    }
}

fn submit(
    sh: &Arc<Shared>,
    mut tcp: TcpStream,
    job: String,
    program: String,
    input: Option<String>,
    lambdas: u32,
) -> Result<(), FaasError> {
    let received_us = unix_us();
    let (tx, rx) = unbounded();
    // Workers of the job before may still be finishing their RESET: wait (bounded) for one.
    let idle_deadline = Instant::now() + IDLE_WAIT;
    loop {
        let any = sh.st.lock().workers.values().any(|e| e.idle);
        if any || Instant::now() >= idle_deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let picked: Vec<(u32, Arc<Mutex<TcpStream>>)> = {
        let mut st = sh.st.lock();
        if st.jobs.contains_key(&job) {
            drop(st);
            return write_msg(&mut tcp, &Msg::Error { why: format!("job {job} was already submitted") });
        }
        let picked: Vec<u32> =
            st.workers.iter().filter(|(_, e)| e.idle).map(|(w, _)| *w).take(lambdas.max(1) as usize).collect();
        let mut out = Vec::new();
        for w in picked {
            let e = st.workers.get_mut(&w).expect("picked from the map");
            e.idle = false;
            e.job = Some(job.clone());
            out.push((w, e.tx.clone()));
        }
        if !out.is_empty() {
            st.jobs.insert(job.clone(), tx);
        }
        out
    };
    if picked.is_empty() {
        return write_msg(&mut tcp, &Msg::Error { why: "no idle worker is registered with the scheduler".into() });
    }
    let mut program = program;
    if let Some(i) = sh.cfg.test_flip_program_byte {
        if let Ok(mut b) = hex::decode(&program) {
            if !b.is_empty() {
                let n = b.len();
                b[i % n] ^= 0x01;
                program = hex::encode(b);
            }
        }
    }
    let fwd = Msg::Forward { job: job.clone(), program, input, lambdas };
    let mut sent = Vec::new();
    for (w, wtx) in &picked {
        match write_msg(&mut *wtx.lock(), &fwd) {
            Ok(()) => sent.push(*w),
            Err(e) => {
                tracing::warn!("scheduler: forwarding to worker {w}: {e}");
                drop_worker(&mut sh.st.lock(), *w, None);
            }
        }
    }
    let r = (|| {
        write_msg(&mut tcp, &Msg::Dispatched { workers: sent.clone(), received_us })?;
        let deadline = Instant::now() + sh.cfg.job_timeout;
        let mut left: Vec<u32> = sent.clone();
        while !left.is_empty() {
            let m = match rx.recv_deadline(deadline) {
                Ok(m) => m,
                Err(_) => {
                    for w in &left {
                        write_msg(
                            &mut tcp,
                            &Msg::WorkerResult { done: Box::new(done_error(*w, &job, "no outcome in time".into())) },
                        )?;
                    }
                    break;
                }
            };
            if let Msg::WorkerDone { worker, .. } = &m {
                left.retain(|w| w != worker);
            }
            write_msg(&mut tcp, &Msg::WorkerResult { done: Box::new(m) })?;
        }
        Ok(())
    })();
    sh.st.lock().jobs.remove(&job);
    r
}
