//! `psl coordinator-host`: a job's coordinator as its own process (trusted, attested). The
//! leader connects over TLS when a job begins: `CoordHello{id, job, nonce}` → `CoordOffer` (a
//! fresh channel key and the host's report over the nonce, binding that key and the host's TLS
//! certificate key, and the rank it already runs for that job, if any) → `CoordOpen{rank,
//! sealed}` (the keys of that rank, sealed to the channel key) → `CoordOpened{adopted}`. Then, until `EndJob` → `CoordClosed{stats}`:
//! `CoordEpoch` → `CoordEpochIs`, `CoordRotate` and `CoordStatements` → `Ok`.
//!
//! A host whose leader connection breaks keeps its coordinator running (the job's lambdas keep
//! writing and need their SYNCs) for up to `orphan`: a restarted leader that opens the same job
//! and rank adopts it; otherwise it stops with every key dropped. The coordinator's own-chain
//! log (`DIR/job-<id>/rank-<r>/`, removed when the job ends) lets a restarted host rejoin its
//! chain without signing a seq twice.
//!
//! [`RemoteCoordinator`] is the leader's side of that connection.

use super::wire::{evidence, read_msg, unhex, unhex_n, write_msg, Msg};
use crate::attest::Attester;
use crate::coordinator::{CoordinatorHost, CoordinatorLink, CoordinatorStats, RotationStage};
use crate::error::FaasError;
use crate::program::JobId;
use crate::tls::{self, ClientStream, ServerStream, TlsIdentity};
use parking_lot::Mutex;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How a coordinator host process is run.
pub struct CoordHostConfig {
    /// The host's id (rank r of a job runs on host r).
    pub id: u32,
    /// Where it listens for the leader (TLS).
    pub listen: SocketAddr,
    /// The fabric each job's coordinator attaches to.
    pub fabric: psl_fabric::FabricSpec,
    /// Where each coordinator keeps its own-chain log (`None`: it learns its chain from peers).
    pub dir: Option<PathBuf>,
    /// How long a coordinator keeps running after its leader went away, for a new leader to
    /// take the job back.
    pub orphan: Duration,
}

struct Shared {
    cfg: CoordHostConfig,
    host: CoordinatorHost,
    spki: [u8; 32],
    /// Bumped by every open (and close): an orphan timer stops the coordinator only if no new
    /// leader took it since.
    opens: AtomicU64,
}

/// Binds, calls `ready` with the bound address, and serves until the process ends.
pub fn serve_coordinator_host(
    cfg: CoordHostConfig,
    attester: Box<dyn Attester>,
    ready: impl FnOnce(SocketAddr),
) -> Result<(), FaasError> {
    if let Some(d) = &cfg.dir {
        std::fs::create_dir_all(d)?;
    }
    let listener = TcpListener::bind(cfg.listen).map_err(|e| FaasError::Net(format!("binding {}: {e}", cfg.listen)))?;
    let addr = listener.local_addr()?;
    let me = TlsIdentity::generate("psl-coordinator-host")?;
    let tls = me.server_config(false)?;
    let sh = Arc::new(Shared {
        host: CoordinatorHost::new(cfg.id, attester),
        cfg,
        spki: me.spki_hash(),
        opens: AtomicU64::new(0),
    });
    ready(addr);
    for conn in listener.incoming() {
        let Ok(tcp) = conn else { continue };
        let (sh, tls) = (sh.clone(), tls.clone());
        std::thread::Builder::new().name("coordinator-host-conn".into()).spawn(move || {
            if let Err(e) = tls::accept(tcp, tls).and_then(|(s, _)| serve(&sh, s)) {
                tracing::warn!("coordinator host {}: {e}", sh.cfg.id);
            }
        })?;
    }
    Ok(())
}

fn serve(sh: &Arc<Shared>, mut s: ServerStream) -> Result<(), FaasError> {
    s.sock.set_read_timeout(Some(Duration::from_secs(30)))?;
    let Msg::CoordHello { id, job, nonce } = read_msg(&mut s)? else {
        return Err(FaasError::Net("expected CoordHello".into()));
    };
    if id != sh.cfg.id {
        return write_msg(&mut s, &Msg::Error { why: format!("this is coordinator host {}, not {id}", sh.cfg.id) });
    }
    let job = JobId(unhex_n::<16>("job", &job)?);
    let offer = match sh.host.offer_for(&unhex_n::<32>("nonce", &nonce)?, Some(sh.spki)) {
        Ok(o) => o,
        Err(e) => return write_msg(&mut s, &Msg::Error { why: e.to_string() }),
    };
    write_msg(
        &mut s,
        &Msg::CoordOffer {
            channel_public: hex::encode(offer.channel_public),
            backend: offer.evidence.backend.into(),
            evidence: hex::encode(&offer.evidence.bytes),
            running: sh.host.running_job().filter(|(j, _)| *j == job).map(|(_, r)| r),
        },
    )?;
    let (rank, sealed) = match read_msg(&mut s)? {
        Msg::CoordOpen { rank, sealed } => (rank, unhex("sealed", &sealed)?),
        Msg::Refused { why } | Msg::Error { why } => {
            return Err(FaasError::Attestation { who: format!("coordinator host {id}"), why });
        }
        m => return Err(FaasError::Net(format!("expected CoordOpen, got {}", m.name()))),
    };
    let fabric = &sh.cfg.fabric;
    let ep = |meta: &psl_capsule::SignedMetadata| -> Result<Arc<dyn psl_fabric::Fabric>, FaasError> {
        fabric
            .connect(&format!("coordinator-host-{id}"), &psl_fabric::Interest::coordinator(meta.name().0 .0))
            .map_err(|e| FaasError::Net(format!("attaching to the fabric {fabric}: {e}")))
    };
    let job_dir = sh.cfg.dir.as_ref().map(|d| d.join(format!("job-{job}")));
    let state = job_dir.as_ref().map(|d| d.join(format!("rank-{rank}")));
    let adopted = match sh.host.open(job, rank, &sealed, ep, state) {
        Ok(a) => a,
        Err(e) => return write_msg(&mut s, &Msg::Error { why: format!("coordinator host {id}: {e}") }),
    };
    drop(sealed);
    let mine = sh.opens.fetch_add(1, Ordering::AcqRel) + 1;
    write_msg(&mut s, &Msg::CoordOpened { adopted })?;
    s.sock.set_read_timeout(Some(Duration::from_secs(24 * 3600)))?;
    loop {
        let m = match read_msg(&mut s) {
            Ok(m) => m,
            Err(e) => {
                orphaned(sh, job, rank, mine, &e);
                return Ok(());
            }
        };
        let reply = match m {
            Msg::CoordEpoch => match sh.host.epoch() {
                Ok(epoch) => Msg::CoordEpochIs { epoch },
                Err(e) => Msg::Error { why: e.to_string() },
            },
            Msg::CoordRotate { key_gen, stage, sealed } => {
                match unhex("sealed", &sealed).and_then(|b| sh.host.rotate(key_gen, stage, &b)) {
                    Ok(()) => Msg::Ok,
                    Err(e) => Msg::Error { why: format!("coordinator host {id}: key rotation: {e}") },
                }
            }
            Msg::CoordStatements { list } => match unhex("list", &list).and_then(|b| sh.host.statements(&b)) {
                Ok(()) => Msg::Ok,
                Err(e) => Msg::Error { why: format!("coordinator host {id}: key statements: {e}") },
            },
            Msg::EndJob => {
                sh.opens.fetch_add(1, Ordering::AcqRel);
                let stats = sh.host.close().or_else(|| sh.host.stats()).unwrap_or_default();
                // The job is over: its coordinator's own-chain log is no longer needed.
                if let Some(d) = &job_dir {
                    if let Err(e) = std::fs::remove_dir_all(d) {
                        tracing::warn!("coordinator host {id}: removing {}: {e}", d.display());
                    }
                }
                return write_msg(&mut s, &Msg::CoordClosed { stats });
            }
            m => Msg::Error { why: format!("coordinator host {id}: unexpected {}", m.name()) },
        };
        if let Err(e) = write_msg(&mut s, &reply) {
            orphaned(sh, job, rank, mine, &e);
            return Ok(());
        }
    }
}

/// The leader's connection broke: the coordinator keeps running for `orphan`, then stops
/// unless a new leader opened the job again meanwhile.
fn orphaned(sh: &Arc<Shared>, job: JobId, rank: u8, mine: u64, e: &FaasError) {
    tracing::warn!(
        host = sh.cfg.id,
        rank,
        %job,
        "coordinator host: the leader went away ({e}); the coordinator keeps running for up to {} s",
        sh.cfg.orphan.as_secs()
    );
    let sh = sh.clone();
    let _ = std::thread::Builder::new().name("coordinator-orphan".into()).spawn(move || {
        std::thread::sleep(sh.cfg.orphan);
        if sh.opens.load(Ordering::Acquire) == mine && sh.host.running_job() == Some((job, rank)) {
            tracing::warn!(host = sh.cfg.id, rank, %job, "coordinator host: no leader took the job back; stopping");
            sh.host.close();
        }
    });
}

/// The leader's side of a coordinator host's connection.
pub struct RemoteCoordinator {
    id: u32,
    stream: Mutex<Option<ClientStream>>,
}

/// How long the leader waits for a coordinator host's answer.
const ANSWER_WAIT: Duration = Duration::from_secs(10);

/// A coordinator host that attested for a job and waits for its rank.
pub struct PendingCoordinator {
    /// The host's id.
    pub id: u32,
    stream: ClientStream,
    offer: crate::grant::Offer,
    /// The rank it already runs for this job (its leader went away), if any.
    pub running: Option<u8>,
}

impl PendingCoordinator {
    /// Connects to coordinator host `id` at `addr` and has it attest for `job`.
    pub fn connect(
        leader: &crate::leader::Leader,
        identity: &TlsIdentity,
        id: u32,
        addr: SocketAddr,
        job: JobId,
    ) -> Result<PendingCoordinator, FaasError> {
        let (mut s, host_spki) = tls::connect(addr, identity)?;
        s.sock.set_read_timeout(Some(ANSWER_WAIT))?;
        let nonce = leader.coordinator_challenge(id);
        write_msg(&mut s, &Msg::CoordHello { id, job: hex::encode(job.0), nonce: hex::encode(nonce) })?;
        let (channel_public, backend, ev, running) = match read_msg(&mut s)? {
            Msg::CoordOffer { channel_public, backend, evidence, running } => {
                (channel_public, backend, evidence, running)
            }
            Msg::Error { why } => return Err(FaasError::Net(format!("coordinator host {id} ({addr}): {why}"))),
            m => return Err(FaasError::Net(format!("coordinator host {id}: expected CoordOffer, got {}", m.name()))),
        };
        let offer = crate::grant::Offer {
            worker: id,
            channel_public: unhex_n::<32>("channel_public", &channel_public)?,
            evidence: evidence(&backend, &ev)?,
            // Taken from this very connection, never from the host's message.
            tls_spki: Some(host_spki),
        };
        Ok(PendingCoordinator { id, stream: s, offer, running })
    }

    /// Checks the host's report and opens rank `rank` of the leader's job on it. Returns the
    /// link, the host's channel key and whether the host kept a coordinator it was running.
    pub fn open(
        mut self,
        leader: &crate::leader::Leader,
        rank: u8,
    ) -> Result<(RemoteCoordinator, [u8; 32], bool), FaasError> {
        let (id, s) = (self.id, &mut self.stream);
        let sealed = match leader.grant_coordinator(&self.offer, rank) {
            Ok(b) => b,
            Err(e) => {
                let _ = write_msg(s, &Msg::Refused { why: e.to_string() });
                return Err(e);
            }
        };
        write_msg(s, &Msg::CoordOpen { rank, sealed: hex::encode(&sealed) })?;
        match read_msg(s)? {
            Msg::CoordOpened { adopted } => Ok((
                RemoteCoordinator { id, stream: Mutex::new(Some(self.stream)) },
                self.offer.channel_public,
                adopted,
            )),
            Msg::Error { why } => Err(FaasError::Net(format!("coordinator host {id}: {why}"))),
            m => Err(FaasError::Net(format!("coordinator host {id}: unexpected {}", m.name()))),
        }
    }

    /// Turns the host away (it attested, but the job does not use it).
    pub fn refuse(mut self, why: &str) {
        let _ = write_msg(&mut self.stream, &Msg::Refused { why: why.into() });
    }
}

impl RemoteCoordinator {
    /// One request and its answer; a broken connection leaves the link dead.
    fn call(&self, m: &Msg) -> Result<Msg, FaasError> {
        let mut g = self.stream.lock();
        let s = g.as_mut().ok_or_else(|| FaasError::Net(format!("coordinator host {}: connection lost", self.id)))?;
        let r = write_msg(s, m).and_then(|()| read_msg(s));
        match r {
            Ok(Msg::Error { why }) => Err(FaasError::Net(why)),
            Ok(a) => Ok(a),
            Err(e) => {
                *g = None;
                Err(FaasError::Net(format!("coordinator host {}: {e}", self.id)))
            }
        }
    }

    fn expect_ok(&self, m: &Msg) -> Result<(), FaasError> {
        match self.call(m)? {
            Msg::Ok => Ok(()),
            a => Err(FaasError::Net(format!("coordinator host {}: unexpected {}", self.id, a.name()))),
        }
    }
}

impl CoordinatorLink for RemoteCoordinator {
    fn epoch(&self) -> Result<u64, FaasError> {
        match self.call(&Msg::CoordEpoch)? {
            Msg::CoordEpochIs { epoch } => Ok(epoch),
            a => Err(FaasError::Net(format!("coordinator host {}: unexpected {}", self.id, a.name()))),
        }
    }

    fn rotate(&self, key_gen: u32, stage: RotationStage, sealed: &[u8]) -> Result<(), FaasError> {
        self.expect_ok(&Msg::CoordRotate { key_gen, stage, sealed: hex::encode(sealed) })
    }

    fn statements(&self, encoded: &[u8]) -> Result<(), FaasError> {
        self.expect_ok(&Msg::CoordStatements { list: hex::encode(encoded) })
    }

    fn close(&self) -> Result<CoordinatorStats, FaasError> {
        match self.call(&Msg::EndJob)? {
            Msg::CoordClosed { stats } => Ok(stats),
            a => Err(FaasError::Net(format!("coordinator host {}: unexpected {}", self.id, a.name()))),
        }
    }
}
