//! `psl leader` (trusted): one TLS listener for clients and workers. Its certificate key is
//! fresh per process and bound into every report it gives (report data =
//! `bind_channel_key(SHA-256 of the certificate's public key)`).
//!
//! Client connection: `ClientHello{nonce}` → `LeaderReport`; `BeginJob` (owner key) → `Ok`
//! (the job's coordinators placed on the coordinator hosts and its capsule opened on the
//! capsule hosts by then; a `BeginJob` with `resume` takes back a running job whose leader
//! went away, to end it);
//! `Expect{workers}` (the workers the scheduler says it forwarded to) → `Admitted`; `EndJob` →
//! `Ended{resets}`. Worker connection: `WorkerHello{nonce}` → `LeaderChallenge` (the leader's
//! report over the worker's nonce, and a nonce for the worker); `Offer` → `Grant` or `Refused`;
//! later `Reset` → `ResetDone`.

use super::wire::{evidence, read_msg, unhex, unhex_n, write_msg, Msg};
use crate::attest::{bind_channel_key, AttestVerifier, Attester};
use crate::error::FaasError;
use crate::grant::Offer;
use crate::leader::Leader;
use crate::program::JobId;
use crate::tls::{self, ServerStream, TlsIdentity};
use crate::worker::WorkerDebug;
use crossbeam_channel::{bounded, Receiver, Sender};
use parking_lot::{Condvar, Mutex};
use psl_capsule::SignedMetadata;
use psl_crypto::OwnerKey;
use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zeroize::Zeroizing;

/// How the leader process is run.
pub struct LeaderConfig {
    /// Where it listens for clients, workers, and KV roles (TLS).
    pub listen: SocketAddr,
    /// The fabric each job's coordinator attaches to.
    pub fabric: psl_fabric::FabricSpec,
    /// How the capsule hosts prove who they are before they get their key.
    pub host_auth: HostAuth,
    /// How long the leader waits for every expected worker's offer before admitting those in.
    pub admit_wait: Duration,
    /// Most connections served at once.
    pub connections_max: usize,
    /// Capsule hosts (`psl capsule-host`), server ids 0, 1, ...: each job's capsule is opened
    /// on every one of them.
    pub capsule_hosts: Vec<SocketAddr>,
    /// Coordinator hosts (`psl coordinator-host`), ids 0, 1, ...: host r runs each job's
    /// coordinator of rank r (0 the primary, the others its shadows).
    pub coordinator_hosts: Vec<SocketAddr>,
    /// The KV capsule's owner key and metadata (`psl leader --kv-owner`, `--kv-capsule`): the
    /// leader keeps its application key and hands each attested KV role (`KvHello`) the data key
    /// and its own writers' keys (`kvgrant`).
    pub kv: Option<(OwnerKey, SignedMetadata)>,
}

/// How the leader authenticates a capsule host before it sends the host its ack-signing key:
/// by attestation (the report binds the key of this very TLS connection), by the TLS key
/// pinned for the host (`psl up --init` makes each capsule host's key and records its hash),
/// or both. A host that is neither attested nor pinned is refused unless the policy says
/// `[hosts] allow_insecure_unauthenticated = true` (INSECURE: whoever answers at the host's
/// address gets the key; warned once per process).
#[derive(Clone, Debug, Default)]
pub struct HostAuth {
    /// Capsule hosts must attest under the leader's policy (`[hosts] require_attestation`).
    pub attest: bool,
    /// The TLS key hash ([`TlsIdentity::spki_hash`]) pinned for each capsule host, by server
    /// id (the position in [`LeaderConfig::capsule_hosts`]); `None`: none pinned.
    pub pins: Vec<Option<[u8; 32]>>,
    /// Accept a host that is neither attested nor pinned (INSECURE).
    pub allow_unauthenticated: bool,
}

impl HostAuth {
    fn pin(&self, id: u32) -> Option<[u8; 32]> {
        self.pins.get(id as usize).copied().flatten()
    }
}

static UNAUTHENTICATED_WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Says, once per process, that a capsule host got its key without being authenticated.
fn warn_unauthenticated_host(id: u32, addr: SocketAddr) {
    if !UNAUTHENTICATED_WARNED.swap(true, std::sync::atomic::Ordering::SeqCst) {
        tracing::warn!(
            "capsule host {id} ({addr}) gets its ack-signing key without being authenticated (neither attested \
             nor pinned): INSECURE, whoever answers at a capsule host's address can take its key and sign acks; \
             the policy says [hosts] allow_insecure_unauthenticated = true; never use in production"
        );
    }
}

/// Whether this process has warned that it sent a key to an unauthenticated capsule host.
pub fn warned_unauthenticated_host() -> bool {
    UNAUTHENTICATED_WARNED.load(std::sync::atomic::Ordering::SeqCst)
}

/// How long a job waits for the one before it to end.
const JOB_QUEUE_WAIT: Duration = Duration::from_secs(120);

/// Each RESET worker and what it held after the RESET.
type Resets = Vec<(u32, WorkerDebug)>;

enum WorkerCmd {
    Grant(crate::grant::Grant),
    Refused(String),
    /// A key rotation bundle; answered with the worker's error, if any.
    Rotate(crate::grant::RotationGrant, Sender<(u32, Option<String>)>),
    Reset(Sender<(u32, WorkerDebug)>),
}

#[derive(Default)]
struct JobState {
    job: Option<JobId>,
    lambdas: u32,
    min_workers: usize,
    offers: Vec<Offer>,
    waiting: HashMap<u32, Sender<WorkerCmd>>,
    granted: Vec<(u32, Sender<WorkerCmd>)>,
    hosts: Vec<(u32, tls::ClientStream)>,
}

struct Shared {
    cfg: LeaderConfig,
    leader: Leader,
    identity: TlsIdentity,
    tls: Arc<tokio_rustls::rustls::ServerConfig>,
    st: Mutex<JobState>,
    cv: Condvar,
    conns: std::sync::atomic::AtomicUsize,
}

/// Binds, calls `ready` with the bound address, and serves until the process ends. The leader
/// attests itself with `attester` and admits the workers (and capsule hosts) `verifier`'s policy
/// accepts.
pub fn serve_leader(
    cfg: LeaderConfig,
    attester: Box<dyn Attester>,
    verifier: Box<dyn AttestVerifier>,
    ready: impl FnOnce(SocketAddr),
) -> Result<(), FaasError> {
    let listener = TcpListener::bind(cfg.listen).map_err(|e| FaasError::Net(format!("binding {}: {e}", cfg.listen)))?;
    let addr = listener.local_addr()?;
    let identity = TlsIdentity::generate("psl-leader")?;
    let tls = identity.server_config(true)?;
    let leader = Leader::new(attester, verifier);
    let mut cfg = cfg;
    if let Some((owner, meta)) = cfg.kv.take() {
        leader.set_kv(&owner, &meta)?;
        tracing::info!(capsule = %meta.name(), "leader: hands the KV capsule's keys to attested KV roles");
    }
    let sh = Arc::new(Shared {
        cfg,
        leader,
        identity,
        tls,
        st: Mutex::new(JobState::default()),
        cv: Condvar::new(),
        conns: Default::default(),
    });
    ready(addr);
    for conn in listener.incoming() {
        let Ok(tcp) = conn else { continue };
        use std::sync::atomic::Ordering::SeqCst;
        if sh.conns.fetch_add(1, SeqCst) >= sh.cfg.connections_max {
            sh.conns.fetch_sub(1, SeqCst);
            tracing::warn!("leader: too many connections; refusing one");
            continue;
        }
        let sh = sh.clone();
        std::thread::Builder::new().name("leader-conn".into()).spawn(move || {
            let r = tls::accept(tcp, sh.tls.clone()).and_then(|(s, peer)| handle(&sh, s, peer));
            if let Err(e) = r {
                tracing::info!("leader: connection ended: {e}");
            }
            sh.conns.fetch_sub(1, SeqCst);
        })?;
    }
    Ok(())
}

fn handle(sh: &Arc<Shared>, mut s: ServerStream, peer: Option<[u8; 32]>) -> Result<(), FaasError> {
    s.sock.set_read_timeout(Some(Duration::from_secs(30)))?;
    match read_msg(&mut s)? {
        Msg::ClientHello { nonce } => {
            let nonce = unhex_n::<32>("nonce", &nonce)?;
            let ev = sh.leader.attest(&nonce, &bind_channel_key(&sh.identity.spki_hash()))?;
            write_msg(&mut s, &Msg::LeaderReport { backend: ev.backend.into(), evidence: hex::encode(&ev.bytes) })?;
            client(sh, s)
        }
        Msg::WorkerHello { worker, job, nonce } => {
            let peer = peer.ok_or_else(|| FaasError::Net("a worker must present its certificate".into()))?;
            worker_conn(sh, s, peer, worker, &job, &nonce)
        }
        Msg::KvHello { role, id, nonce, writers } => {
            let peer = peer.ok_or_else(|| FaasError::Net("a KV role must present its certificate".into()))?;
            kv_conn(sh, s, peer, &role, id, &nonce, &writers)
        }
        m => Err(FaasError::Net(format!("leader: unexpected first message {}", m.name()))),
    }
}

/// A KV role's connection: the leader's report over the role's nonce and a nonce for the role
/// (`LeaderChallenge`); the role's `Offer` (its report binding its channel key and its TLS
/// certificate key); then `KvKeys` sealed to that channel key, or `Refused` with nothing
/// sealed.
fn kv_conn(
    sh: &Arc<Shared>,
    mut s: ServerStream,
    peer: [u8; 32],
    role: &str,
    id: u32,
    nonce: &str,
    writers: &[u32],
) -> Result<(), FaasError> {
    let role = match crate::leader::KvRole::parse(role) {
        Ok(r) => r,
        Err(e) => return write_msg(&mut s, &Msg::Refused { why: e.to_string() }),
    };
    if !sh.leader.serves_kv() {
        return write_msg(&mut s, &Msg::Refused { why: "this leader holds no KV keys (psl leader --kv-owner)".into() });
    }
    if let Err(e) = sh.leader.check_kv_request(role, id, writers) {
        tracing::warn!(role = role.name(), id, ?writers, "leader: KV role refused: {e}");
        return write_msg(&mut s, &Msg::Refused { why: e.to_string() });
    }
    let role_nonce = unhex_n::<32>("nonce", nonce)?;
    let ev = sh.leader.attest(&role_nonce, &bind_channel_key(&sh.identity.spki_hash()))?;
    let challenge = sh.leader.kv_challenge(role, id);
    write_msg(&mut s, &Msg::leader_challenge(&ev, &challenge))?;
    let Msg::Offer { channel_public, backend, evidence: ev } = read_msg(&mut s)? else {
        return write_msg(&mut s, &Msg::Refused { why: "expected an Offer".into() });
    };
    let offer = match (|| -> Result<Offer, FaasError> {
        Ok(Offer {
            worker: id,
            channel_public: unhex_n::<32>("channel_public", &channel_public)?,
            evidence: evidence(&backend, &ev)?,
            tls_spki: Some(peer),
        })
    })() {
        Ok(o) => o,
        Err(e) => return write_msg(&mut s, &Msg::Refused { why: e.to_string() }),
    };
    match sh.leader.grant_kv(&offer, role, id, writers) {
        Ok(sealed) => {
            tracing::info!(role = role.name(), id, ?writers, "leader: KV keys handed over (data key, these writers)");
            write_msg(&mut s, &Msg::KvKeys { sealed: hex::encode(sealed) })
        }
        Err(e) => {
            tracing::warn!(role = role.name(), id, "leader: KV role refused: {e}");
            write_msg(&mut s, &Msg::Refused { why: e.to_string() })
        }
    }
}

fn reply_err(s: &mut ServerStream, e: &FaasError) -> Result<(), FaasError> {
    write_msg(s, &Msg::Error { why: e.to_string() })
}

/// A client's connection: at most one job at a time in the leader. A client that goes away
/// mid-job ends its job (keys erased, workers RESET).
fn client(sh: &Arc<Shared>, mut s: ServerStream) -> Result<(), FaasError> {
    s.sock.set_read_timeout(Some(Duration::from_secs(600)))?;
    let mut mine: Option<JobId> = None;
    let r = (|| -> Result<(), FaasError> {
        loop {
            match read_msg(&mut s)? {
                Msg::BeginJob { job, owner, meta, lambdas, min_workers, resume } => {
                    match begin(sh, &job, &owner, &meta, lambdas, min_workers, resume) {
                        Ok(j) => {
                            mine = Some(j);
                            write_msg(&mut s, &Msg::Ok)?
                        }
                        Err(e) => reply_err(&mut s, &e)?,
                    }
                }
                Msg::Expect { workers } if mine.is_some() => match admit(sh, &workers) {
                    Ok(m) => write_msg(&mut s, &m)?,
                    Err(e) => reply_err(&mut s, &e)?,
                },
                Msg::RotateKey { margin_epochs } if mine.is_some() => match rotate(sh, margin_epochs) {
                    Ok(report) => write_msg(&mut s, &Msg::Rotated { report })?,
                    Err(e) => reply_err(&mut s, &e)?,
                },
                Msg::EndJob if mine.is_some() => {
                    let (resets, stored, coordinators) = end(sh);
                    mine = None;
                    write_msg(&mut s, &Msg::Ended { resets, stored, coordinators })?
                }
                m => reply_err(&mut s, &FaasError::Net(format!("leader: unexpected {} from a client", m.name())))?,
            }
        }
    })();
    if mine.is_some() {
        end(sh);
    }
    r
}

fn begin(
    sh: &Arc<Shared>,
    job: &str,
    owner: &str,
    meta: &str,
    lambdas: u32,
    min_workers: usize,
    resume: Option<Vec<(u32, u32, u32)>>,
) -> Result<JobId, FaasError> {
    let t = Instant::now();
    let job = JobId(unhex_n::<16>("job", job)?);
    let owner = OwnerKey::from_file_string(owner).map_err(|e| FaasError::Config(format!("owner key: {e}")))?;
    let meta = SignedMetadata::decode(&unhex("meta", meta)?).map_err(|e| FaasError::Capsule(e.to_string()))?;
    let mut st = sh.st.lock();
    // One job at a time: a second client waits (bounded) for the running job to end.
    let deadline = Instant::now() + JOB_QUEUE_WAIT;
    while st.job.is_some() {
        if sh.cv.wait_until(&mut st, deadline).timed_out() {
            return Err(FaasError::Config(format!(
                "the leader has been running another job for over {} s; try again later",
                JOB_QUEUE_WAIT.as_secs()
            )));
        }
    }
    if sh.cfg.coordinator_hosts.is_empty() {
        return Err(FaasError::Config(
            "the leader has no coordinator hosts (--coordinator-host): a job needs its coordinator".into(),
        ));
    }
    // Server ids are the hosts' positions; every worker counts a write durable once a majority
    // of them acked it, whichever hosts are up.
    sh.leader.begin_job(job, owner, meta.clone(), sh.cfg.capsule_hosts.len() as u32)?;
    if let Err(e) = open_coordinators(sh, job, resume.is_some()) {
        sh.leader.end_job();
        return Err(e);
    }
    if let Some(granted) = &resume {
        sh.leader.resume_granted(granted)?;
    }
    tracing::debug!("leader: coordinators placed in {:?}", t.elapsed());
    let hosts = open_hosts(sh, &meta);
    tracing::debug!("leader: capsule hosts opened in {:?}", t.elapsed());
    *st = JobState { job: Some(job), lambdas, min_workers, hosts, ..JobState::default() };
    tracing::info!(%job, lambdas, resumed = resume.is_some(), "leader: job begun");
    Ok(job)
}

/// Places the job's coordinators. Every coordinator host attests (in parallel); then, for a new
/// job, the hosts that did get ranks 0, 1, ... in id order (a host that is down or refused is
/// left out, logged, and the next one is primary). A resumed job (`resume`) keeps exactly the
/// coordinators still running it, each at its rank: a rank whose host is gone is never started
/// again elsewhere, since that host would have to sign the rank's chain without knowing it.
/// Then each gets its rank's keys (in parallel). No coordinator at all is an error.
fn open_coordinators(sh: &Arc<Shared>, job: JobId, resume: bool) -> Result<(), FaasError> {
    use super::coordhost::PendingCoordinator;
    let mut why = Vec::new();
    let attested: Vec<Result<PendingCoordinator, FaasError>> = std::thread::scope(|sc| {
        let hs: Vec<_> = sh
            .cfg
            .coordinator_hosts
            .iter()
            .enumerate()
            .map(|(i, addr)| {
                sc.spawn(move || PendingCoordinator::connect(&sh.leader, &sh.identity, i as u32, *addr, job))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(FaasError::Net("coordinator host thread panicked".into()))))
            .collect()
    });
    let mut placed = Vec::new();
    for (i, r) in attested.into_iter().enumerate() {
        match r {
            Err(e) => {
                tracing::warn!("leader: coordinator host {i} is left out of the job: {e}");
                why.push(format!("host {i}: {e}"));
            }
            Ok(p) if resume => match p.running {
                Some(rank) => placed.push((rank, p)),
                None => p.refuse("the job is resumed and this host was not running its coordinator"),
            },
            Ok(p) => {
                let rank = placed.len() as u8;
                placed.push((rank, p));
            }
        }
    }
    let opened: Vec<Result<(), FaasError>> = std::thread::scope(|sc| {
        let hs: Vec<_> = placed
            .into_iter()
            .map(|(rank, p)| {
                sc.spawn(move || {
                    let id = p.id;
                    let (link, channel, adopted) = p.open(&sh.leader, rank)?;
                    if adopted {
                        tracing::info!(rank, "leader: coordinator host {id} kept the job's running coordinator");
                    } else {
                        tracing::info!(rank, "leader: coordinator host {id} runs the job's coordinator");
                    }
                    sh.leader.attach_coordinator(id, rank, channel, Box::new(link))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(FaasError::Net("coordinator host thread panicked".into()))))
            .collect()
    });
    for e in opened.into_iter().filter_map(Result::err) {
        tracing::warn!("leader: a coordinator host did not take the job: {e}");
        why.push(e.to_string());
    }
    if sh.leader.coordinators() == 0 {
        return Err(FaasError::Net(format!("no coordinator host took the job ({})", why.join("; "))));
    }
    Ok(())
}

/// Opens the job's capsule on every capsule host (server id = its position). A host that is
/// down, cannot be authenticated ([`HostAuth`]) or refuses is left out of the job (and logged):
/// the others serve it, and the job's writes are durable while a majority of all the hosts
/// acks them.
fn open_hosts(sh: &Arc<Shared>, meta: &SignedMetadata) -> Vec<(u32, tls::ClientStream)> {
    let meta_hex = hex::encode(meta.encode());
    let open = |id: u32, addr: SocketAddr| -> Result<(u32, tls::ClientStream), FaasError> {
        open_host(&sh.leader, &sh.identity, &sh.cfg.host_auth, &meta_hex, id, addr).map(|s| (id, s))
    };
    // In parallel: each host opens (and fsyncs) a new store.
    std::thread::scope(|sc| {
        let hs: Vec<_> = sh
            .cfg
            .capsule_hosts
            .iter()
            .enumerate()
            .map(|(i, addr)| {
                let open = &open;
                sc.spawn(move || open(i as u32, *addr))
            })
            .collect();
        let opened: Vec<_> = hs
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(FaasError::Net("capsule host thread panicked".into()))))
            .filter_map(|r| r.map_err(|e| tracing::warn!("leader: the job runs without a capsule host: {e}")).ok())
            .collect();
        let n = sh.cfg.capsule_hosts.len();
        if opened.len() <= n / 2 && n > 0 {
            // The job still runs (writing does not wait for servers), but nothing it writes
            // can be made durable: durable syncs in lambdas fail after their bound, and the
            // job's report says it did not end durable.
            tracing::warn!(
                "leader: only {} of the {n} capsule hosts opened the job's capsule; {} are needed for durability",
                opened.len(),
                n / 2 + 1
            );
        }
        opened
    })
}

/// Connects to capsule host `id` at `addr`, authenticates it ([`HostAuth`]) and only then sends
/// it `HostOpen` with its ack-signing key; returns the link once the host opened the capsule.
fn open_host(
    leader: &Leader,
    identity: &TlsIdentity,
    auth: &HostAuth,
    meta_hex: &str,
    id: u32,
    addr: SocketAddr,
) -> Result<tls::ClientStream, FaasError> {
    let pin = auth.pin(id);
    if pin.is_none() && !auth.attest && !auth.allow_unauthenticated {
        // Nothing would tell this host from whoever answers at its address: not even a
        // handshake.
        return Err(FaasError::Unauthenticated {
            who: format!("capsule host {id} ({addr})"),
            why: "no TLS key is pinned for it (`psl up --init` makes and pins one; `psl leader \
                  --capsule-host-pin`) and the policy does not require attested hosts ([hosts] \
                  require_attestation); [hosts] allow_insecure_unauthenticated = true would accept it, INSECURE"
                .into(),
        });
    }
    // With a pin, the handshake fails unless the host holds the pinned key.
    let (mut s, host_spki) = tls::connect_pinned(addr, identity, pin)?;
    s.sock.set_read_timeout(Some(Duration::from_secs(10)))?;
    if pin.is_none() && !auth.attest {
        warn_unauthenticated_host(id, addr);
    }
    if auth.attest {
        // The host's report over our nonce must bind the certificate key of this very
        // connection before the key goes to it.
        let nonce: [u8; 32] = rand::random();
        write_msg(&mut s, &Msg::HostHello { nonce: hex::encode(nonce) })?;
        let (backend, ev) = match read_msg(&mut s)? {
            Msg::HostReport { backend, evidence } => (backend, evidence),
            Msg::Error { why } => return Err(FaasError::Attestation { who: format!("capsule host {id}"), why }),
            m => return Err(FaasError::Net(format!("capsule host {id}: expected HostReport, got {}", m.name()))),
        };
        let v = leader
            .verify_evidence(&evidence(&backend, &ev)?, &nonce, &bind_channel_key(&host_spki))
            .map_err(|e| FaasError::Attestation { who: format!("capsule host {id} ({addr})"), why: e.to_string() })?;
        tracing::info!("capsule host {id} attested: {} measurement {}", v.kind, v.measurement.short());
    }
    let (key, cert) = leader.server_credentials(id)?;
    let cert = cert.map(|c| hex::encode(c.encode()));
    let mut m = Msg::HostOpen {
        id,
        meta: meta_hex.to_string(),
        key: Zeroizing::new(hex::encode(&key.expose_secret_bytes()[..])),
        cert,
    };
    let sent = write_msg(&mut s, &m);
    if let Msg::HostOpen { key, .. } = &mut m {
        zeroize::Zeroize::zeroize(key);
    }
    sent?;
    match read_msg(&mut s)? {
        Msg::Ok => Ok(s),
        Msg::Error { why } => Err(FaasError::Net(format!("capsule host {id} ({addr}): {why}"))),
        m => Err(FaasError::Net(format!("capsule host {id}: unexpected {}", m.name()))),
    }
}

/// Closes the job's capsule on every host; returns the records each stored.
fn close_hosts(hosts: Vec<(u32, tls::ClientStream)>) -> Vec<(u32, u64)> {
    // In parallel: each host waits for records still in flight before it closes.
    std::thread::scope(|sc| {
        let hs: Vec<_> = hosts
            .into_iter()
            .map(|(id, mut s)| {
                sc.spawn(move || match write_msg(&mut s, &Msg::EndJob).and_then(|()| read_msg(&mut s)) {
                    Ok(Msg::HostClosed { records }) => Some((id, records)),
                    Ok(m) => {
                        tracing::warn!("capsule host {id}: closing: unexpected {}", m.name());
                        None
                    }
                    Err(e) => {
                        tracing::warn!("capsule host {id}: closing: {e}");
                        None
                    }
                })
            })
            .collect();
        hs.into_iter().filter_map(|h| h.join().ok().flatten()).collect()
    })
}

/// Waits (bounded) for an offer from each of `workers`, then admits those in.
fn admit(sh: &Arc<Shared>, workers: &[u32]) -> Result<Msg, FaasError> {
    let deadline = Instant::now() + sh.cfg.admit_wait;
    let mut st = sh.st.lock();
    while !workers.iter().all(|w| st.offers.iter().any(|o| o.worker == *w)) {
        if sh.cv.wait_until(&mut st, deadline).timed_out() {
            break;
        }
    }
    let offers = std::mem::take(&mut st.offers);
    let mut waiting = std::mem::take(&mut st.waiting);
    let mut missing: Vec<(u32, String)> = workers
        .iter()
        .filter(|w| !offers.iter().any(|o| o.worker == **w))
        .map(|w| (*w, format!("no offer within {} ms", sh.cfg.admit_wait.as_millis())))
        .collect();
    match sh.leader.admit(offers, st.lambdas, st.min_workers) {
        Ok((grants, mut refused)) => {
            let mut granted = Vec::new();
            let mut nodes = Vec::new();
            for g in grants {
                if let Some(tx) = waiting.remove(&g.worker) {
                    granted.push((g.worker, g.lambdas.clone()));
                    nodes.push((g.worker, g.node_id));
                    let _ = tx.send(WorkerCmd::Grant(g));
                    st.granted.push((granted.last().expect("pushed").0, tx));
                }
            }
            for (w, why) in &refused {
                if let Some(tx) = waiting.remove(w) {
                    let _ = tx.send(WorkerCmd::Refused(why.clone()));
                }
            }
            for (w, tx) in waiting {
                let _ = tx.send(WorkerCmd::Refused("not needed for this job".into()));
                refused.push((w, "not needed for this job".into()));
            }
            refused.append(&mut missing);
            Ok(Msg::Admitted { granted, refused, nodes })
        }
        Err(e) => {
            for (_, tx) in waiting {
                let _ = tx.send(WorkerCmd::Refused(e.to_string()));
            }
            Err(e)
        }
    }
}

/// How long the leader waits for each worker and host to take a key rotation.
const ROTATE_WAIT: Duration = Duration::from_secs(10);

/// Rotates the running job's application key: the leader prepares the new generation (its
/// coordinator then holds the epoch clock below the rotation epoch), sends each granted worker
/// its sealed bundle on its attested TLS connection and each capsule host the certificate, and
/// waits (bounded) for their answers; then the coordinator gets its key and the epoch clock
/// runs on into the new generation. Workers or hosts that failed are listed in the report.
fn rotate(sh: &Arc<Shared>, margin_epochs: u64) -> Result<crate::deploy::KeyRotationReport, FaasError> {
    let margin = margin_epochs.clamp(2, 1000);
    let (cert, grants) = sh.leader.prepare_rotation(margin)?;
    let (senders, mut hosts) = {
        let mut st = sh.st.lock();
        (st.granted.clone(), std::mem::take(&mut st.hosts))
    };
    let (tx, rx) = bounded(grants.len().max(1));
    let mut workers = Vec::new();
    let mut asked = 0;
    for g in grants {
        let w = g.worker;
        match senders.iter().find(|(x, _)| *x == w) {
            Some((_, cmd)) if cmd.send(WorkerCmd::Rotate(g, tx.clone())).is_ok() => asked += 1,
            _ => workers.push((w, Some("the worker's connection is gone".to_string()))),
        }
    }
    // The hosts meanwhile (they only need the public certificate).
    let cert_hex = hex::encode(cert.encode());
    let host_results: Vec<(u32, Option<String>)> = hosts
        .iter_mut()
        .map(|(id, s)| {
            let r = write_msg(s, &Msg::HostRotate { cert: cert_hex.clone() }).and_then(|()| {
                s.sock.set_read_timeout(Some(ROTATE_WAIT))?;
                read_msg(s)
            });
            let e = match r {
                Ok(Msg::Ok) => None,
                Ok(Msg::Error { why }) => Some(why),
                Ok(m) => Some(format!("unexpected {}", m.name())),
                Err(e) => Some(e.to_string()),
            };
            if let Some(e) = &e {
                tracing::warn!("capsule host {id}: key rotation: {e}");
            }
            (*id, e)
        })
        .collect();
    {
        let mut st = sh.st.lock();
        if st.job.is_some() {
            st.hosts = hosts;
        }
    }
    let deadline = Instant::now() + ROTATE_WAIT;
    let mut answered = 0;
    while answered < asked {
        match rx.recv_deadline(deadline) {
            Ok(r) => {
                workers.push(r);
                answered += 1;
            }
            Err(_) => break,
        }
    }
    for (w, _) in &senders {
        if !workers.iter().any(|(x, _)| x == w) {
            workers.push((*w, Some(format!("no answer within {} s", ROTATE_WAIT.as_secs()))));
        }
    }
    workers.sort_by_key(|(w, _)| *w);
    let cert = sh.leader.finish_rotation()?;
    Ok(crate::deploy::KeyRotationReport {
        key_gen: cert.key_gen,
        from_epoch: cert.from_epoch,
        cert: cert_hex,
        workers,
        hosts: host_results,
    })
}

/// Ends the job: keys erased, coordinators stopped, every granted worker RESET, the capsule
/// closed on every host.
fn end(sh: &Arc<Shared>) -> (Resets, Vec<(u32, u64)>, Vec<crate::coordinator::CoordinatorStats>) {
    let (granted, hosts, coordinators) = {
        let mut st = sh.st.lock();
        for (_, tx) in st.waiting.drain() {
            let _ = tx.send(WorkerCmd::Refused("the job ended".into()));
        }
        let g = std::mem::take(&mut st.granted);
        let h = std::mem::take(&mut st.hosts);
        // RESET revokes the workers' writers (a certified capsule), then keys are dropped and
        // the coordinator stopped before the next job may begin.
        sh.leader.revoke_all();
        let c = sh.leader.end_job();
        *st = JobState::default();
        sh.cv.notify_all();
        (g, h, c)
    };
    let (tx, rx) = bounded(granted.len().max(1));
    let n = granted.len();
    for (_, w) in granted {
        let _ = w.send(WorkerCmd::Reset(tx.clone()));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut out = Vec::new();
    while out.len() < n {
        match rx.recv_deadline(deadline) {
            Ok(d) => out.push(d),
            Err(_) => break,
        }
    }
    out.sort_by_key(|(w, _)| *w);
    (out, close_hosts(hosts), coordinators)
}

fn worker_conn(
    sh: &Arc<Shared>,
    mut s: ServerStream,
    peer: [u8; 32],
    worker: u32,
    job: &str,
    nonce: &str,
) -> Result<(), FaasError> {
    // The worker checks the leader first: the leader's report over the worker's nonce.
    let worker_nonce = unhex_n::<32>("nonce", nonce)?;
    let ev = sh.leader.attest(&worker_nonce, &bind_channel_key(&sh.identity.spki_hash()))?;
    let challenge = sh.leader.challenge(worker);
    write_msg(&mut s, &Msg::leader_challenge(&ev, &challenge))?;
    let Msg::Offer { channel_public, backend, evidence: ev } = read_msg(&mut s)? else {
        return Err(FaasError::Net(format!("worker {worker}: expected an Offer")));
    };
    let offer = Offer {
        worker,
        channel_public: unhex_n::<32>("channel_public", &channel_public)?,
        evidence: evidence(&backend, &ev)?,
        tls_spki: Some(peer),
    };
    let job = JobId(unhex_n::<16>("job", job)?);
    let (tx, rx): (Sender<WorkerCmd>, Receiver<WorkerCmd>) = bounded(4);
    {
        let mut st = sh.st.lock();
        if st.job != Some(job) {
            drop(st);
            return write_msg(&mut s, &Msg::Refused { why: format!("the leader is not running job {job}") });
        }
        st.offers.retain(|o| o.worker != worker);
        st.offers.push(offer);
        st.waiting.insert(worker, tx);
        sh.cv.notify_all();
    }
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(WorkerCmd::Grant(g)) => write_msg(
            &mut s,
            &Msg::Grant {
                node_id: g.node_id,
                lambdas: g.lambdas,
                sealed_keys: hex::encode(&g.sealed_keys),
                capsule: sh.leader.meta().map(|m| m.name().to_string()),
            },
        )?,
        Ok(WorkerCmd::Refused(why)) => return write_msg(&mut s, &Msg::Refused { why }),
        Ok(WorkerCmd::Reset(_)) | Ok(WorkerCmd::Rotate(..)) | Err(_) => {
            return write_msg(&mut s, &Msg::Refused { why: "no admission decision".into() });
        }
    }
    // Granted: the connection stays open until the job ends with a RESET; key rotations travel
    // on it meanwhile.
    loop {
        match rx.recv() {
            Ok(WorkerCmd::Rotate(g, done)) => {
                write_msg(&mut s, &Msg::Rotate { key_gen: g.key_gen, sealed_keys: hex::encode(&g.sealed_keys) })?;
                s.sock.set_read_timeout(Some(ROTATE_WAIT))?;
                let e = match read_msg(&mut s)? {
                    Msg::RotateDone { key_gen } if key_gen == g.key_gen => None,
                    Msg::Error { why } => Some(why),
                    m => Some(format!("unexpected {}", m.name())),
                };
                let _ = done.send((worker, e));
            }
            Ok(WorkerCmd::Reset(done)) => {
                write_msg(&mut s, &Msg::Reset)?;
                s.sock.set_read_timeout(Some(Duration::from_secs(10)))?;
                let Msg::ResetDone { debug } = read_msg(&mut s)? else {
                    return Err(FaasError::Net(format!("worker {worker}: expected ResetDone")));
                };
                let _ = done.send((worker, debug));
                return Ok(());
            }
            Ok(_) => continue,
            Err(_) => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attest::{measure, AttestPolicy, Measurement, SimAttester, SimPlatform, SimVerifier};
    use psl_capsule::{new_capsule_with, Limits, WriterKeys};

    /// A leader with a job begun over three capsule servers, and the job's metadata (hex).
    fn leader_with_job() -> (Leader, String) {
        let p = SimPlatform::new();
        let m: Measurement = measure(&psl_crypto::sha256(&[b"host auth test"]), b"config");
        let verifier = SimVerifier::new(p.public(), AttestPolicy { allowed: [m].into() });
        let leader = Leader::new(Box::new(SimAttester::new(p, m)), Box::new(verifier));
        let owner = OwnerKey::generate();
        let meta = new_capsule_with(&owner, 7, "host auth test", 1, Limits::default(), WriterKeys::Certified).unwrap();
        let meta_hex = hex::encode(meta.encode());
        leader.begin_job(JobId::random(), owner, meta, 3).unwrap();
        (leader, meta_hex)
    }

    /// What a listener at a capsule host's address saw of one connection.
    #[derive(Debug, Default)]
    struct Seen {
        connected: bool,
        handshake: bool,
        msgs: Vec<Msg>,
    }

    /// Serves one connection at a capsule host's address with `id`'s TLS key: records every
    /// message and answers `HostOpen` with `Ok` (as a host, or an impostor that wants the key).
    fn listener(id: TlsIdentity) -> (SocketAddr, std::thread::JoinHandle<Seen>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let mut seen = Seen::default();
            // Waits 3 s at most for the leader to connect at all.
            l.set_nonblocking(true).unwrap();
            let deadline = Instant::now() + Duration::from_secs(3);
            let tcp = loop {
                match l.accept() {
                    Ok((tcp, _)) => break tcp,
                    Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
                    Err(_) => return seen,
                }
            };
            seen.connected = true;
            tcp.set_nonblocking(false).unwrap();
            tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let Ok((mut s, _)) = tls::accept(tcp, id.server_config(false).unwrap()) else { return seen };
            seen.handshake = true;
            while let Ok(m) = read_msg(&mut s) {
                let open = matches!(m, Msg::HostOpen { .. });
                seen.msgs.push(m);
                if open && write_msg(&mut s, &Msg::Ok).is_err() {
                    break;
                }
            }
            seen
        });
        (addr, t)
    }

    fn key_hex(leader: &Leader, id: u32) -> String {
        hex::encode(&leader.server_credentials(id).unwrap().0.expose_secret_bytes()[..])
    }

    fn got_key(seen: &Seen, key: &str) -> bool {
        seen.msgs.iter().any(|m| matches!(m, Msg::HostOpen { key: k, .. } if k.as_str() == key))
    }

    #[test]
    fn an_impostor_at_a_pinned_capsule_host_address_gets_no_key() {
        let (leader, meta) = leader_with_job();
        let me = TlsIdentity::generate("psl-leader").unwrap();
        let real = TlsIdentity::generate("psl-capsule-host").unwrap();
        let (addr, impostor) = listener(TlsIdentity::generate("psl-capsule-host").unwrap());
        let auth = HostAuth { pins: vec![Some(real.spki_hash())], ..HostAuth::default() };
        let r = open_host(&leader, &me, &auth, &meta, 0, addr);
        let seen = impostor.join().unwrap();
        let e = r.expect_err("the leader refuses an impostor");
        assert!(matches!(e, FaasError::NotPinned { .. }), "{e}");
        assert!(seen.connected && !seen.handshake, "the handshake itself fails: {seen:?}");
        assert!(seen.msgs.is_empty() && !got_key(&seen, &key_hex(&leader, 0)), "{seen:?}");
    }

    #[test]
    fn a_capsule_host_presenting_its_pinned_key_gets_its_key() {
        let (leader, meta) = leader_with_job();
        let me = TlsIdentity::generate("psl-leader").unwrap();
        let real = TlsIdentity::generate("psl-capsule-host").unwrap();
        let pin = real.spki_hash();
        // Reloaded from its key file: the same pinned key.
        let real = TlsIdentity::from_key_pem(&real.key_pem(), "psl-capsule-host").unwrap();
        let (addr, host) = listener(real);
        let auth = HostAuth { pins: vec![None, Some(pin)], ..HostAuth::default() };
        open_host(&leader, &me, &auth, &meta, 1, addr).expect("the pinned host is opened");
        let seen = host.join().unwrap();
        assert!(got_key(&seen, &key_hex(&leader, 1)), "{seen:?}");
    }

    #[test]
    fn an_unpinned_unattested_capsule_host_is_refused_by_default() {
        let (leader, meta) = leader_with_job();
        let me = TlsIdentity::generate("psl-leader").unwrap();
        let (addr, impostor) = listener(TlsIdentity::generate("psl-capsule-host").unwrap());
        let r = open_host(&leader, &me, &HostAuth::default(), &meta, 2, addr);
        let seen = impostor.join().unwrap();
        let e = r.expect_err("a host nobody can authenticate is refused");
        assert!(matches!(e, FaasError::Unauthenticated { .. }), "{e}");
        assert!(e.to_string().contains("allow_insecure_unauthenticated"), "{e}");
        assert!(!seen.connected && !got_key(&seen, &key_hex(&leader, 2)), "not even a connection: {seen:?}");
    }

    #[test]
    fn allowing_unauthenticated_capsule_hosts_connects_and_warns() {
        let (leader, meta) = leader_with_job();
        let me = TlsIdentity::generate("psl-leader").unwrap();
        let (addr, host) = listener(TlsIdentity::generate("psl-capsule-host").unwrap());
        let auth = HostAuth { allow_unauthenticated: true, ..HostAuth::default() };
        open_host(&leader, &me, &auth, &meta, 0, addr).expect("allowed, INSECURE");
        assert!(warned_unauthenticated_host(), "the INSECURE warning was given");
        assert!(got_key(&host.join().unwrap(), &key_hex(&leader, 0)));
    }
}
