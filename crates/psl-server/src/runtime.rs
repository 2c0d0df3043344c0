//! The thin threaded runtime around [`ServerCore`]: fabric in, verify pool, one core thread
//! that owns the protocol state and does the group commits, fabric out.
//!
//! ```text
//! fabric ─▶ host-in (decode) ─▶ in channel ─▶ core: precheck ─▶ verify pool (public keys)
//!                                              ▲                    │
//!                                              └──── verified ◀─────┘
//! core: order ─▶ ready ─▶ DiskStore::append (one write, one fsync) ─▶ ack ─▶ fabric.publish
//! ```
//!
//! While the core thread waits on an fsync, the verify pool keeps verifying and the in channel
//! keeps filling (both bounded), so the next commit takes everything that arrived meanwhile:
//! that is the group commit.

use crate::core::{Output, ServerConfig, ServerCore, ServerStats};
use crate::disk::{self, FsyncPolicy};
use crossbeam_channel::{bounded, Receiver, Select, Sender, TrySendError};
use psl_capsule::{Record, SignedMetadata, Verified, Verifier};
use psl_crypto::{Hash256, SigningKey};
use psl_fabric::Fabric;
use psl_scl::Msg;
use psl_store::{CheckReport, DiskStore, StoreError};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Why a capsule server could not start (or install a rotation).
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Opening, creating, repairing or writing the store failed.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// The store directory belongs to another capsule.
    #[error("the store in {dir} holds capsule {found}, not {expected}")]
    WrongCapsule {
        /// The store directory.
        dir: PathBuf,
        /// Name (hex) of the capsule the store holds.
        found: String,
        /// Name (hex) of the capsule the server was started for.
        expected: String,
    },
    /// [`ServerOptions::id`] is above 32767.
    #[error("server id {0} is out of range (0 to 32767)")]
    Id(u32),
    /// The server id maps to a writer index the capsule's policy gives a coordinator.
    #[error("server writer index {0} is one of the capsule's coordinator indices: pick another server id")]
    CoordinatorClash(u32),
    /// A server thread (core, verifier, fabric, read) could not be started.
    #[error("starting a thread: {0}")]
    Spawn(#[from] std::io::Error),
    /// The capsule certifies writers but [`ServerOptions::cert`] is `None`; carries the
    /// capsule name (hex).
    #[error(
        "capsule {0} certifies writers: the server needs the certificate of its key (ServerOptions::cert, or --owner)"
    )]
    NoCert(String),
    /// [`ServerOptions::cert`] certifies another writer or key, or the verifier refused it.
    #[error("the server's certificate does not match: {0}")]
    BadCert(String),
    /// A chain of the opened store could not be read back to adopt it.
    #[error("adopting the store's chains: {0}")]
    Adopt(String),
}

/// How a [`Server`] runs: its id, threads, channel bounds, tick, core configuration, fsync
/// policy, read address and certificate.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Server id (0 .. 32767); its key is the application key's child `SERVER_WRITER_BASE + id`.
    pub id: u32,
    /// Verifier threads (at least one is started even if 0).
    pub verifiers: usize,
    /// Bound of each channel (in, verify, verified).
    pub channel_msgs_max: usize,
    /// The core thread's tick (repair and heads timers, re-acks).
    pub tick: Duration,
    /// The protocol core's configuration.
    pub core: ServerConfig,
    /// When batches are fsync'd (acks always follow the fsync).
    pub fsync: FsyncPolicy,
    /// Where to serve reads for other processes (`crate::read`); none if `None`.
    pub read_listen: Option<std::net::SocketAddr>,
    /// The certificate of the server's key, in a capsule that certifies writers (required
    /// there; see [`crate::server_credentials`]).
    pub cert: Option<psl_capsule::WriterCert>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            id: 0,
            verifiers: 2,
            channel_msgs_max: 4096,
            tick: Duration::from_millis(10),
            core: ServerConfig::default(),
            fsync: FsyncPolicy::Group,
            read_listen: None,
            cert: None,
        }
    }
}

/// What happened when the store was opened.
#[derive(Debug, Clone, Default)]
pub struct StartReport {
    /// Whether the store was created (there was none in the directory).
    pub created: bool,
    /// Records the store holds after opening (and any repair).
    pub records: usize,
    /// Problems the open found (damaged frames, unreadable regions, orphans, torn tail).
    pub problems: Vec<String>,
    /// Whether the log was rewritten by `DiskStore::repair` (what was lost is fetched again
    /// from peers by anti-entropy).
    pub repaired: bool,
}

#[derive(Debug, Default)]
struct Counters {
    received: AtomicU64,
    bad_messages: AtomicU64,
    in_dropped: AtomicU64,
    published: AtomicU64,
    serve_errors: AtomicU64,
}

/// What `Server::stats_json` (and the read interface's `STATS`) reads.
struct StatsParts {
    writer: u32,
    store: Arc<Mutex<DiskStore>>,
    verifier: Arc<Verifier>,
    stats: Arc<Mutex<ServerStats>>,
    counters: Arc<Counters>,
    failed: Arc<Mutex<Option<String>>>,
}

impl StatsParts {
    fn json(&self) -> serde_json::Value {
        let s = *self.stats.lock().unwrap_or_else(|p| p.into_inner());
        let c = &self.counters;
        let records = self.store.lock().unwrap_or_else(|p| p.into_inner()).len();
        serde_json::json!({
            "writer": self.writer,
            "capsule": self.verifier.name().0.to_hex(),
            "records": records,
            "records_verified": s.records_verified,
            "records_rejected": s.records_rejected,
            "duplicates": s.duplicates,
            "records_held": s.records_held,
            "records_persisted": s.records_persisted,
            "commits": s.commits,
            "acks_sent": s.acks_sent,
            "repair_requests_sent": s.repair_requests_sent,
            "records_served": s.records_served,
            "server_range_refused": s.server_range_refused,
            "withholding_reports": s.withholding_reports,
            "equivocations": s.equivocations,
            "uncertified": s.uncertified,
            "statements_refused": s.statements_refused,
            "received": c.received.load(Ordering::Relaxed),
            "bad_messages": c.bad_messages.load(Ordering::Relaxed),
            "in_dropped": c.in_dropped.load(Ordering::Relaxed),
            "published": c.published.load(Ordering::Relaxed),
            "serve_errors": c.serve_errors.load(Ordering::Relaxed),
            "failed": self.failed.lock().unwrap_or_else(|p| p.into_inner()).clone(),
        })
    }
}

enum In {
    Record(Record),
    Msg(Msg),
}

/// A running capsule server: its fabric threads, verify pool, core thread, and optional read
/// interface, over one capsule's store.
pub struct Server {
    store: Arc<Mutex<DiskStore>>,
    verifier: Arc<Verifier>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    stats: Arc<Mutex<ServerStats>>,
    counters: Arc<Counters>,
    failed: Arc<Mutex<Option<String>>>,
    writer: u32,
    start: StartReport,
    read_addr: Option<std::net::SocketAddr>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Server(writer={})", self.writer)
    }
}

/// Opens the store in `dir` (creating it for `meta` if there is none), repairing it if the open
/// found damage. Verification needs no data key.
pub fn open_store(dir: &Path, meta: &SignedMetadata) -> Result<(DiskStore, StartReport), ServerError> {
    let mut rep = StartReport::default();
    let mut store = if dir.join(psl_store::METADATA_FILE).exists() {
        // An intact index checkpoint spares re-verifying the prefix it describes (CRCs and
        // certificate records are still checked; reads re-verify every record): a server with
        // millions of records restarts in seconds. Anything amiss falls back to a full pass.
        let opts = psl_store::StoreOptions { verify: psl_store::OpenVerify::FromCheckpoint, ..Default::default() };
        let (s, open) = DiskStore::open_with_options(dir, None, opts)?;
        tracing::info!(dir = %dir.display(), "opened the store: {open}");
        rep.problems = open.problems();
        if s.name() != meta.name() {
            return Err(ServerError::WrongCapsule {
                dir: dir.to_path_buf(),
                found: s.name().0.to_hex(),
                expected: meta.name().0.to_hex(),
            });
        }
        if !rep.problems.is_empty() {
            tracing::warn!(dir = %dir.display(), problems = ?rep.problems, "the store needs repair");
        }
        s
    } else {
        rep.created = true;
        DiskStore::create(dir, meta.clone(), None)?
    };
    if !rep.problems.is_empty() {
        let r = store.repair()?;
        tracing::warn!(kept = r.kept, dropped = r.dropped, backup = %r.backup.display(), "repaired the store; missing records will be fetched from peers");
        rep.repaired = true;
    }
    rep.records = store.len();
    Ok((store, rep))
}

/// The key statements a server announces: its certificate where the capsule's writers are
/// certified (checked against this server's writer and key), else none.
fn announcements(
    cert: Option<&psl_capsule::WriterCert>,
    certified: bool,
    writer: u32,
    key: &SigningKey,
    meta: &SignedMetadata,
) -> Result<Vec<psl_capsule::KeyStatement>, ServerError> {
    Ok(match (cert, certified) {
        (None, true) => return Err(ServerError::NoCert(meta.name().0.to_hex())),
        (Some(c), true) => {
            if c.writer != writer || c.key != key.verifying_key() {
                return Err(ServerError::BadCert(format!("it certifies writer {}, not this server's key", c.writer)));
            }
            vec![psl_capsule::KeyStatement::Cert(c.clone())]
        }
        (_, false) => Vec::new(),
    })
}

/// Starts `n` verifier threads: each verifies records from `verify_rx` and sends the
/// results to `res_tx` (dropped here once every thread holds its own clone).
fn spawn_verifiers(
    n: usize,
    verifier: &Arc<Verifier>,
    verify_rx: &Receiver<Record>,
    res_tx: Sender<Option<Verified<Record>>>,
    t0: Instant,
) -> std::io::Result<Vec<JoinHandle<()>>> {
    let mut threads = Vec::new();
    for i in 0..n {
        let (rx, tx, v) = (verify_rx.clone(), res_tx.clone(), verifier.clone());
        threads.push(std::thread::Builder::new().name(format!("srv-verify-{i}")).spawn(move || {
            while let Ok(rec) = rx.recv() {
                let r = match verify_or_hold(&v, rec, t0) {
                    Some(r) => r,
                    None => continue,
                };
                if tx.send(r).is_err() {
                    return;
                }
            }
        })?);
    }
    drop(res_tx);
    Ok(threads)
}

/// The fabric-receiving thread's loop: decodes this capsule's messages and records and
/// queues them for the core, until `stop` (or the core is gone).
fn host_in(
    fabric: &dyn Fabric,
    stop: &AtomicBool,
    counters: &Counters,
    name: psl_capsule::CapsuleName,
    limits: psl_capsule::Limits,
    in_tx: Sender<In>,
) {
    while !stop.load(Ordering::Acquire) {
        let m = match fabric.recv_timeout(RECV_WAIT) {
            Ok(Some(m)) => m,
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!("fabric receive failed: {e}");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        counters.received.fetch_add(1, Ordering::Relaxed);
        let item = match Msg::decode(&m) {
            Ok(Msg::Record { capsule, bytes }) if capsule == name => match Record::decode(&bytes, &limits) {
                Ok(r) => In::Record(r),
                Err(_) => {
                    counters.bad_messages.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            },
            Ok(Msg::Ack(_)) => continue,
            Ok(m) if m.capsule() == name => In::Msg(m),
            _ => {
                counters.bad_messages.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        };
        // Bounded wait, then drop (repair and anti-entropy fetch it again).
        match in_tx.send_timeout(item, Duration::from_millis(500)) {
            Ok(()) => {}
            Err(crossbeam_channel::SendTimeoutError::Timeout(_)) => {
                counters.in_dropped.fetch_add(1, Ordering::Relaxed);
            }
            Err(crossbeam_channel::SendTimeoutError::Disconnected(_)) => return,
        }
    }
}

impl Server {
    /// Starts a capsule server on `fabric` with its store in `dir`. `key` must be the
    /// application key's child at `psl_scl::server_writer(opts.id)`.
    pub fn start(
        dir: &Path,
        meta: SignedMetadata,
        key: SigningKey,
        fabric: Arc<dyn Fabric>,
        opts: ServerOptions,
    ) -> Result<Server, ServerError> {
        let writer = psl_scl::server_writer(opts.id).ok_or(ServerError::Id(opts.id))?;
        if meta.meta.policy.is_coordinator(writer) {
            return Err(ServerError::CoordinatorClash(writer));
        }
        let certified = meta.meta.policy.writer_keys == psl_capsule::WriterKeys::Certified;
        let announce = announcements(opts.cert.as_ref(), certified, writer, &key, &meta)?;
        let (store, start_report) = open_store(dir, &meta)?;
        // The store's own verifier: certificates learnt from records or the fabric, and
        // rotations, are then known to reads from the store too.
        let verifier = store.shared_verifier();
        if let Some(s) = announce.first() {
            verifier.install_statement(s).map_err(|e| ServerError::BadCert(e.to_string()))?;
        }
        let mut core_cfg = opts.core;
        if opts.fsync == FsyncPolicy::Always {
            core_cfg.batch_records_max = 1;
        }
        let mut core = ServerCore::new(verifier.clone(), key, writer, core_cfg);
        core.set_announcements(announce);
        let t0 = Instant::now();
        disk::adopt(&mut core, &store, 0).map_err(ServerError::Adopt)?;
        let store = Arc::new(Mutex::new(store));
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(Mutex::new(ServerStats::default()));
        let counters = Arc::new(Counters::default());
        let failed = Arc::new(Mutex::new(None));
        let cap = opts.channel_msgs_max.max(16);
        let (in_tx, in_rx) = bounded::<In>(cap);
        let (verify_tx, verify_rx) = bounded::<Record>(cap);
        let (res_tx, res_rx) = bounded::<Option<Verified<Record>>>(cap);
        let mut threads = Vec::new();

        threads.extend(spawn_verifiers(opts.verifiers.max(1), &verifier, &verify_rx, res_tx, t0)?);

        {
            let (fabric, stop, counters, name) = (fabric.clone(), stop.clone(), counters.clone(), verifier.name());
            let limits = verifier.metadata().meta.policy.limits;
            threads.push(
                std::thread::Builder::new()
                    .name("srv-host-in".into())
                    .spawn(move || host_in(&*fabric, &stop, &counters, name, limits, in_tx))?,
            );
        }

        {
            let run = CoreLoop {
                core,
                store: store.clone(),
                fabric,
                in_rx,
                verify_tx,
                res_rx,
                stop: stop.clone(),
                stats: stats.clone(),
                counters: counters.clone(),
                failed: failed.clone(),
                tick: opts.tick,
                fsync: opts.fsync,
                last_commit: Instant::now(),
                t0,
                name: verifier.name(),
            };
            threads.push(std::thread::Builder::new().name("srv-core".into()).spawn(move || run.run())?);
        }
        let mut read_addr = None;
        if let Some(a) = opts.read_listen {
            let listener = std::net::TcpListener::bind(a)?;
            read_addr = Some(listener.local_addr()?);
            let (store, stop) = (store.clone(), stop.clone());
            let parts = StatsParts {
                writer,
                store: store.clone(),
                verifier: verifier.clone(),
                stats: stats.clone(),
                counters: counters.clone(),
                failed: failed.clone(),
            };
            let stats_fn: crate::read::StatsFn = Arc::new(move || parts.json());
            threads.push(std::thread::Builder::new().name("srv-read-accept".into()).spawn(move || {
                if let Err(e) = crate::read::serve(listener, store, stop, stats_fn) {
                    tracing::error!("the read interface stopped: {e}");
                }
            })?);
        }
        tracing::info!(writer, records = start_report.records, ?read_addr, "capsule server started");
        Ok(Server { store, verifier, stop, threads, stats, counters, failed, writer, start: start_report, read_addr })
    }

    /// This server's writer index (`psl_scl::server_writer(id)`), which its acks are signed under.
    pub fn writer(&self) -> u32 {
        self.writer
    }

    /// The address reads are served on (`ServerOptions::read_listen`, port resolved).
    pub fn read_addr(&self) -> Option<std::net::SocketAddr> {
        self.read_addr
    }

    /// What happened when the store was opened at start.
    pub fn start_report(&self) -> &StartReport {
        &self.start
    }

    fn store(&self) -> MutexGuard<'_, DiskStore> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Each writer's newest durable record: writer -> (seq, hash).
    pub fn heads(&self) -> std::collections::BTreeMap<u32, (u64, Hash256)> {
        self.store().heads().into_iter().map(|(w, h)| (w, (h.seq, h.hash))).collect()
    }

    /// A record by hash (read back from disk and re-verified).
    pub fn get(&self, hash: &Hash256) -> Result<Option<Verified<Record>>, StoreError> {
        self.store().get(hash)
    }

    /// Writer `writer`'s records `from_seq ..= to_seq` that the server holds.
    pub fn range(&self, writer: u32, from_seq: u64, to_seq: u64) -> Result<Vec<Verified<Record>>, StoreError> {
        self.store().range(writer, from_seq, to_seq.saturating_add(1))
    }

    /// The SYNC with the highest epoch on disk.
    pub fn latest_sync(&self) -> Result<Option<Verified<Record>>, StoreError> {
        self.store().latest_sync()
    }

    /// Re-reads and re-verifies the whole log (a view taken under the store lock, checked
    /// without it: appends go on meanwhile).
    pub fn check(&self) -> Result<CheckReport, StoreError> {
        let view = self.store().check_view();
        view.check()
    }

    /// Records the store holds.
    pub fn len(&self) -> usize {
        self.store().len()
    }

    /// Whether the store holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A copy of the core's counters.
    pub fn stats(&self) -> ServerStats {
        *self.stats.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An application key rotation, from the leader (capsule servers verify with public keys and
    /// cannot open the `Rotate` record that carries the certificate in the log): the
    /// owner-signed certificate goes into the store (durable in `rotations.bin` before this
    /// returns, so records of the new generation verify after a restart too), then into the
    /// verifier the server checks incoming records with. From its epoch on, records under the
    /// retired key are refused. `Ok(false)`: already installed.
    pub fn install_rotation(&self, cert: &psl_capsule::RotationCert) -> Result<bool, ServerError> {
        let fresh = self.store().install_rotation(cert)?;
        let v = self.verifier.install_rotation(cert, None).map_err(|e| {
            ServerError::Store(StoreError::Rotation { path: self.store().dir().to_path_buf(), why: e.to_string() })
        })?;
        tracing::info!(key_gen = cert.key_gen, from_epoch = cert.from_epoch, "capsule server: key rotation installed");
        Ok(fresh || v)
    }

    /// Set when a group commit failed (the server no longer acks; restart it).
    pub fn failed(&self) -> Option<String> {
        self.failed.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Every counter as JSON (what the read interface's `STATS` answers): the core's, the
    /// runtime's (received, dropped, published, serve errors), records stored, and `failed`.
    pub fn stats_json(&self) -> serde_json::Value {
        StatsParts {
            writer: self.writer,
            store: self.store.clone(),
            verifier: self.verifier.clone(),
            stats: self.stats.clone(),
            counters: self.counters.clone(),
            failed: self.failed.clone(),
        }
        .json()
    }

    /// Stops every thread. Records not yet persisted are lost (and were never acked).
    pub fn shutdown(mut self) {
        self.stop_threads();
    }

    fn stop_threads(&mut self) {
        self.stop.store(true, Ordering::Release);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            self.stop_threads();
        }
    }
}

/// Verifies one record; `None`: held back for its writer's certificate (`Verifier::hold`), on
/// the core's clock started at `t0`. A record the hold cannot take is refused (`Some(None)`).
fn verify_or_hold(v: &Verifier, rec: Record, t0: Instant) -> Option<Option<Verified<Record>>> {
    match v.verify_or_hold(rec, t0.elapsed().as_millis() as u64) {
        Ok(r) => r.map(Some),
        Err(rej) => {
            tracing::debug!("rejected: {rej}");
            Some(None)
        }
    }
}

struct CoreLoop {
    core: ServerCore,
    store: Arc<Mutex<DiskStore>>,
    fabric: Arc<dyn Fabric>,
    in_rx: Receiver<In>,
    verify_tx: Sender<Record>,
    res_rx: Receiver<Option<Verified<Record>>>,
    stop: Arc<AtomicBool>,
    stats: Arc<Mutex<ServerStats>>,
    counters: Arc<Counters>,
    failed: Arc<Mutex<Option<String>>>,
    tick: Duration,
    fsync: FsyncPolicy,
    last_commit: Instant,
    t0: Instant,
    name: psl_capsule::CapsuleName,
}

/// How long the fabric-receiving thread waits for a message before it checks the stop flag.
const RECV_WAIT: Duration = Duration::from_millis(250);

/// The longest a quiet core sleeps between ticks when no input comes (it wakes for input at
/// once); the stop flag is checked at least this often.
const QUIET_TICK_MAX: Duration = Duration::from_millis(500);

/// Most inputs taken between two group commits.
const DRAIN_MAX: usize = 8192;

impl CoreLoop {
    fn now(&self) -> u64 {
        self.t0.elapsed().as_millis() as u64
    }

    fn run(mut self) {
        let mut next_tick = Instant::now();
        while !self.stop.load(Ordering::Acquire) {
            // Wait for input (until the next tick), then take what is there, up to DRAIN_MAX.
            let mut timeout = next_tick.saturating_duration_since(Instant::now());
            if let FsyncPolicy::IntervalMs(ms) = self.fsync {
                let next_commit = self.last_commit + Duration::from_millis(ms);
                timeout = timeout.min(next_commit.saturating_duration_since(Instant::now()));
            }
            self.wait_input(timeout);
            let mut took = 0;
            while took < DRAIN_MAX && self.step() {
                took += 1;
            }
            if took > 0 {
                // Input: back to the regular pace (what came may need repairs, acks, hints).
                next_tick = next_tick.min(Instant::now() + self.tick);
            }
            // Group commit: one write, one fsync; the acks only after it returned.
            let due = match self.fsync {
                FsyncPolicy::IntervalMs(ms) => {
                    self.last_commit.elapsed() >= Duration::from_millis(ms) || self.core.congested()
                }
                FsyncPolicy::Always | FsyncPolicy::Group => true,
            };
            if due {
                self.commit();
            }
            if Instant::now() >= next_tick {
                let now = self.now();
                let out = self.core.on_tick(now);
                self.outputs(out);
                *self.stats.lock().unwrap_or_else(|p| p.into_inner()) = self.core.stats;
                // Quiet: sleep until the core's next timed duty (bounded), or the next input.
                next_tick = Instant::now()
                    + match self.core.quiet_until() {
                        None => self.tick,
                        Some(at) => Duration::from_millis(at.saturating_sub(now)).clamp(self.tick, QUIET_TICK_MAX),
                    };
            }
        }
        // Persist what is ready before leaving (acks go out too; a crash instead loses it unacked).
        self.commit();
    }

    fn wait_input(&self, timeout: Duration) {
        let room = !self.verify_tx.is_full() && !self.core.congested();
        let mut sel = Select::new();
        sel.recv(&self.res_rx);
        if room {
            sel.recv(&self.in_rx);
        }
        let _ = sel.ready_timeout(timeout);
    }

    /// Handles one input if there is one.
    fn step(&mut self) -> bool {
        if let Ok(r) = self.res_rx.try_recv() {
            let now = self.now();
            match r {
                Some(v) => {
                    let certs = v.header().kind == psl_capsule::Kind::Cert;
                    let out = self.core.on_verified(v, now);
                    self.outputs(out);
                    if certs {
                        self.release_held();
                    }
                }
                None => self.core.on_rejected(),
            }
            return true;
        }
        if self.verify_tx.is_full() || self.core.congested() {
            return false;
        }
        match self.in_rx.try_recv() {
            Ok(In::Record(r)) => {
                if !self.core.precheck(&r) {
                    match self.verify_tx.try_send(r) {
                        Ok(()) => {}
                        Err(TrySendError::Full(_)) => {
                            self.counters.in_dropped.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(TrySendError::Disconnected(_)) => return false,
                    }
                }
                true
            }
            Ok(In::Msg(m)) => {
                let certs = matches!(m, Msg::Certs { .. });
                self.core.on_message(m);
                if certs {
                    self.release_held();
                }
                true
            }
            Err(_) => false,
        }
    }

    /// New certificates: records held back for them go through verification again (here, when
    /// the verify pool's queue is full).
    fn release_held(&mut self) {
        let v = self.core.verifier().clone();
        for rec in v.release_held() {
            if self.core.precheck(&rec) {
                continue;
            }
            if let Err(TrySendError::Full(rec)) = self.verify_tx.try_send(rec) {
                match verify_or_hold(&v, rec, self.t0) {
                    Some(Some(r)) => {
                        let now = self.now();
                        let out = self.core.on_verified(r, now);
                        self.outputs(out);
                    }
                    Some(None) => self.core.on_rejected(),
                    None => {}
                }
            }
        }
    }

    fn commit(&mut self) {
        self.last_commit = Instant::now();
        let now = self.now();
        loop {
            // One batch per lock, so that readers get in between batches.
            let out = {
                let mut st = self.store.lock().unwrap_or_else(|p| p.into_inner());
                match disk::commit_write(&mut self.core, &mut *st, now) {
                    None => break,
                    Some(Ok(n)) => disk::commit_synced(&mut self.core, &mut *st, n, now),
                    Some(Err(out)) => out,
                }
            };
            self.outputs(out);
        }
    }

    fn publish(&self, bytes: Vec<u8>) {
        match self.fabric.publish(bytes.into()) {
            Ok(()) => {
                self.counters.published.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => tracing::debug!("publish failed: {e}"),
        }
    }

    fn outputs(&mut self, out: Vec<Output>) {
        for o in out {
            match o {
                Output::Publish(b) => self.publish(b),
                Output::Serve { writer, from_seq, to_seq } => {
                    let recs = {
                        let st = self.store.lock().unwrap_or_else(|p| p.into_inner());
                        st.range(writer, from_seq, to_seq.saturating_add(1))
                    };
                    match recs {
                        Ok(recs) => {
                            let name = self.name;
                            for r in recs {
                                self.publish(Msg::Record { capsule: name, bytes: r.shared_bytes() }.encode());
                            }
                        }
                        Err(e) => {
                            self.counters.serve_errors.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(writer, from_seq, to_seq, "cannot serve records from the store: {e}");
                        }
                    }
                }
                Output::Withholding { .. } | Output::Equivocation { .. } => {}
                Output::Fatal(e) => {
                    *self.failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                }
            }
        }
    }
}
