//! A job's coordinator as its own role (trusted): a *coordinator host* attests to the leader
//! like a worker (a fresh X25519 channel key bound into its report), receives the keys of one
//! coordinator rank of the job's capsule sealed to that key, and runs a coordinator-only node
//! (RTS every epoch, SYNC over every writer's EOE) until the job ends. The leader places the
//! primary (rank 0) and at least one shadow (rank 1, ...) on different hosts; a shadow stays
//! passive until SYNCs stop for `takeover_after_epochs × (1 + rank)` epochs, then takes over
//! (`psl_scl::coordinator`).
//!
//! The leader reaches each coordinator through a [`CoordinatorLink`]: in process
//! ([`LocalCoordinator`], the embedded deployment) or over TLS (`net::coordhost`). Key
//! rotations travel sealed to the host's channel key, in two stages (prepare: the certificate
//! and the new data key, the coordinator holds below the rotation epoch; finish: its new key
//! and the new generation's certificates); revocations are public statements.
//!
//! A host whose leader goes away keeps its coordinator running (the job goes on); a new
//! leader that opens the same job and rank again adopts it ([`CoordinatorHost::open`] returns
//! `adopted`).

use crate::attest::Attester;
use crate::channel::{seal_to, ChannelKey};
use crate::error::FaasError;
use crate::grant::{job_metadata, Offer};
use crate::program::JobId;
use parking_lot::Mutex;
use psl_capsule::{KeyStatement, RotationCert, SignedMetadata, WriterCert, WriterKeys};
use psl_crypto::{DataKey, SigningKey};
use psl_fabric::Fabric;
use psl_node::{Node, NodeKeys, NodeOptions, NodeRotation};
use psl_scl::CoordinatorConfig;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zeroize::Zeroizing;

/// Node id of the coordinator node of rank `r` (`COORDINATOR_NODE_BASE + r`).
pub const COORDINATOR_NODE_BASE: u32 = 0x7000;

/// How long a host waits for its node to answer one request.
const NODE_WAIT: Duration = Duration::from_secs(5);

/// What one coordinator did in a job (the job report lists one per rank).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoordinatorStats {
    /// The coordinator host it ran on.
    pub host: u32,
    /// Its rank (0: the primary; above: shadows).
    pub rank: u8,
    /// Records its writer signed (its certificate, RTS and SYNC records, statements): a shadow
    /// that never took over wrote none.
    pub records_written: u64,
    /// SYNCs its node applied (its own and the other coordinators').
    pub syncs_applied: u64,
    /// The epoch it ended in (`term << 32 | counter`: a term above 0 means a shadow took over).
    pub epoch: u64,
    /// Whether it was still running when the job ended (false: killed, or its link was lost).
    pub alive: bool,
}

/// How the leader talks to one of the job's coordinators.
pub trait CoordinatorLink: Send + Sync {
    /// The coordinator's epoch (the newest SYNC its node applied).
    fn epoch(&self) -> Result<u64, FaasError>;
    /// A rotation stage sealed to the host's channel key ([`rotation_bundle`]).
    fn rotate(&self, key_gen: u32, stage: RotationStage, sealed: &[u8]) -> Result<(), FaasError>;
    /// Key statements (revocations) to install, announce and carry into the log
    /// ([`encode_statements`]).
    fn statements(&self, encoded: &[u8]) -> Result<(), FaasError>;
    /// Stops the coordinator at the job's end.
    fn close(&self) -> Result<CoordinatorStats, FaasError>;
}

/// The two stages of a key rotation at a coordinator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RotationStage {
    /// The certificate and the new data key: the coordinator opens no epoch at or after the
    /// rotation epoch until the finish. `refuse_if_begun`: install nothing if that epoch began.
    Prepare {
        /// Install nothing if the rotation epoch has already begun.
        refuse_if_begun: bool,
    },
    /// The coordinator writer's key under the new generation and the generation's certificates.
    Finish,
}

impl RotationStage {
    fn byte(self) -> u8 {
        match self {
            RotationStage::Prepare { refuse_if_begun: false } => 0,
            RotationStage::Prepare { refuse_if_begun: true } => 1,
            RotationStage::Finish => 2,
        }
    }
}

/// Most key statements one message to a coordinator carries (a rotation's certificates: one
/// per writer of the job).
pub const STATEMENTS_MAX: usize = 4096;

/// Encodes any number of key statements (up to [`STATEMENTS_MAX`]) as lists of at most
/// `psl_capsule::certs::STATEMENTS_PER_RECORD_MAX`: `count u16 ‖ per list: length u32 ‖ list`.
pub fn encode_statements(list: &[KeyStatement]) -> Result<Vec<u8>, FaasError> {
    if list.len() > STATEMENTS_MAX {
        return Err(FaasError::Config(format!("{} key statements: at most {STATEMENTS_MAX}", list.len())));
    }
    let chunks: Vec<&[KeyStatement]> = list.chunks(psl_capsule::certs::STATEMENTS_PER_RECORD_MAX).collect();
    let mut b = Vec::new();
    b.extend_from_slice(&(chunks.len() as u16).to_le_bytes());
    for c in chunks {
        let e = KeyStatement::encode_list(c);
        b.extend_from_slice(&(e.len() as u32).to_le_bytes());
        b.extend_from_slice(&e);
    }
    Ok(b)
}

/// Decodes what [`encode_statements`] encoded, filling `b` exactly. Never panics.
pub fn decode_statements(b: &[u8]) -> Result<Vec<KeyStatement>, FaasError> {
    let bad = |why: String| FaasError::Malformed { what: "key statements", why };
    if b.len() < 2 {
        return Err(bad("no count".into()));
    }
    let n = u16::from_le_bytes([b[0], b[1]]) as usize;
    if n > STATEMENTS_MAX.div_ceil(psl_capsule::certs::STATEMENTS_PER_RECORD_MAX) {
        return Err(bad(format!("{n} lists")));
    }
    let (mut o, mut out) = (2, Vec::new());
    for i in 0..n {
        let len = b.get(o..o + 4).map(|x| u32::from_le_bytes(x.try_into().expect("4 bytes")) as usize);
        let list = len.and_then(|l| b.get(o + 4..(o + 4).checked_add(l)?));
        let list = list.ok_or_else(|| bad(format!("list {i} cut short")))?;
        out.extend(KeyStatement::decode_list(list).map_err(|e| bad(format!("list {i}: {e}")))?);
        o += 4 + list.len();
    }
    if o != b.len() {
        return Err(bad(format!("{} bytes after the lists", b.len() - o)));
    }
    Ok(out)
}

/// Associated data of a coordinator's key bundle: the job, the host and the rank.
pub fn coordinator_grant_aad(job: JobId, host: u32, rank: u8) -> Vec<u8> {
    let mut a = b"psl/coord-grant/v1".to_vec();
    a.extend_from_slice(&job.0);
    a.extend_from_slice(&host.to_le_bytes());
    a.push(rank);
    a
}

/// Associated data of a coordinator's rotation bundle.
pub fn coordinator_rotation_aad(job: JobId, host: u32, key_gen: u32, stage: RotationStage) -> Vec<u8> {
    let mut a = b"psl/coord-rotate/v1".to_vec();
    a.extend_from_slice(&job.0);
    a.extend_from_slice(&host.to_le_bytes());
    a.extend_from_slice(&key_gen.to_le_bytes());
    a.push(stage.byte());
    a
}

/// The key bundle of coordinator rank `rank` on host `host`, sealed to `channel_public`:
/// `job ‖ host u32 ‖ rank u8 ‖ epoch_ms u64 ‖ eoe_timeout_ms u64 ‖ takeover_after_epochs u64 ‖
/// missed_eoe_max u32 ‖ data key ‖ writer u32 ‖ signing key ‖ metadata ‖ [writer certificate]`.
#[allow(clippy::too_many_arguments)]
pub fn grant_bundle(
    job: JobId,
    host: u32,
    cfg: &CoordinatorConfig,
    data_key: &DataKey,
    writer: u32,
    key: &SigningKey,
    meta: &SignedMetadata,
    cert: Option<&WriterCert>,
    channel_public: &[u8; 32],
) -> Result<Vec<u8>, FaasError> {
    let meta_bytes = meta.encode();
    let mut b = Zeroizing::new(Vec::with_capacity(128 + meta_bytes.len()));
    b.extend_from_slice(&job.0);
    b.extend_from_slice(&host.to_le_bytes());
    b.push(cfg.rank);
    b.extend_from_slice(&cfg.epoch_ms.to_le_bytes());
    b.extend_from_slice(&cfg.eoe_timeout_ms.to_le_bytes());
    b.extend_from_slice(&cfg.takeover_after_epochs.to_le_bytes());
    b.extend_from_slice(&cfg.missed_eoe_max.to_le_bytes());
    b.extend_from_slice(data_key.expose_bytes());
    b.extend_from_slice(&writer.to_le_bytes());
    b.extend_from_slice(&key.expose_secret_bytes()[..]);
    b.extend_from_slice(&meta_bytes);
    if let Some(c) = cert {
        b.extend_from_slice(&c.encode());
    }
    seal_to(channel_public, &coordinator_grant_aad(job, host, cfg.rank), &b)
}

/// A rotation stage for one coordinator, sealed to its channel key: `job ‖ host u32 ‖ stage u8 ‖
/// rotation certificate ‖ data key ‖ [finish: signing key ‖ statement list]`.
#[allow(clippy::too_many_arguments)]
pub fn rotation_bundle(
    job: JobId,
    host: u32,
    stage: RotationStage,
    cert: &RotationCert,
    data_key: &DataKey,
    key: Option<&SigningKey>,
    certs: &[KeyStatement],
    channel_public: &[u8; 32],
) -> Result<Vec<u8>, FaasError> {
    let mut b = Zeroizing::new(Vec::with_capacity(512));
    b.extend_from_slice(&job.0);
    b.extend_from_slice(&host.to_le_bytes());
    b.push(stage.byte());
    b.extend_from_slice(&cert.encode());
    b.extend_from_slice(data_key.expose_bytes());
    if stage == RotationStage::Finish {
        let key = key.ok_or_else(|| FaasError::Config("a rotation's finish carries the coordinator's key".into()))?;
        b.extend_from_slice(&key.expose_secret_bytes()[..]);
        b.extend_from_slice(&encode_statements(certs)?);
    }
    seal_to(channel_public, &coordinator_rotation_aad(job, host, cert.key_gen, stage), &b)
}

/// Decodes and checks an opened coordinator key bundle ([`grant_bundle`]) for `job`, host
/// `host` and rank `rank`: the epoch timing in range, the data key the capsule's, the writer
/// the capsule's coordinator of that rank, its key the application's (derived) or certified by
/// it. Never panics.
pub fn parse_grant_bundle(
    b: &[u8],
    job: JobId,
    host: u32,
    rank: u8,
) -> Result<(CoordinatorConfig, NodeKeys), FaasError> {
    let bad = |why: &str| FaasError::Malformed { what: "coordinator key bundle", why: why.into() };
    const HEAD: usize = 16 + 4 + 1 + 8 + 8 + 8 + 4 + 32 + 4 + 32;
    if b.len() < HEAD || b[..16] != job.0 {
        return Err(bad("wrong job or too short"));
    }
    if u32_at(b, 16) != host || b[20] != rank {
        return Err(bad("host or rank does not match"));
    }
    let epoch_ms = u64_at(b, 21);
    let eoe_timeout_ms = u64_at(b, 29);
    let takeover_after_epochs = u64_at(b, 37);
    let missed_eoe_max = u32_at(b, 45);
    if !(1..=60_000).contains(&epoch_ms) || eoe_timeout_ms > 600_000 || !(1..=10_000).contains(&takeover_after_epochs) {
        return Err(bad("epoch timing out of range"));
    }
    let data_key = DataKey::from_bytes(b[49..81].try_into().expect("32 bytes"));
    let writer = u32_at(b, 81);
    let mut sk = Zeroizing::new([0u8; 32]);
    sk.copy_from_slice(&b[85..117]);
    let key = SigningKey::from_bytes(&sk).map_err(|_| bad("signing key"))?;
    let (meta, tail) = job_metadata(&b[HEAD..], &data_key, bad)?;
    if meta.meta.policy.coordinator_at(rank) != Some(writer) {
        return Err(bad("the writer is not the capsule's coordinator of this rank"));
    }
    let mut certs = Vec::new();
    match meta.meta.policy.writer_keys {
        WriterKeys::Derived => {
            if !tail.is_empty() {
                return Err(bad("bytes after the metadata"));
            }
            if meta.meta.app.writer(writer).ok() != Some(key.verifying_key()) {
                return Err(bad("coordinator key is not the application's"));
            }
        }
        WriterKeys::Certified => {
            let c = WriterCert::decode(tail).map_err(|e| bad(&format!("certificate: {e}")))?;
            if c.writer != writer || c.key_gen != 0 || c.key != key.verifying_key() {
                return Err(bad("the certificate is not this coordinator's"));
            }
            c.check(meta.name(), &meta.meta.app.point())
                .map_err(|e| bad(&format!("certificate does not verify: {e}")))?;
            certs.push(KeyStatement::Cert(c));
        }
    }
    let cfg = CoordinatorConfig {
        epoch_ms,
        // Not in the grant: a job's coordinator idles at the engine's pace.
        epoch_idle_ms: psl_scl::coordinator::EPOCH_IDLE_MS_DEFAULT,
        eoe_timeout_ms,
        takeover_after_epochs,
        rank,
        ranks: meta.meta.policy.coordinators,
        missed_eoe_max,
    };
    Ok((cfg, NodeKeys { meta, data_key, writers: Vec::new(), coordinator: Some((writer, key)), certs }))
}

/// Decodes and checks an opened rotation bundle ([`rotation_bundle`]) for `job`, host `host`,
/// generation `key_gen` and `stage` into what the coordinator's node installs. Never panics
/// (the owner's signature on the certificate is the node's verifier's to check).
pub fn parse_rotation_bundle(
    b: &[u8],
    job: JobId,
    host: u32,
    key_gen: u32,
    stage: RotationStage,
) -> Result<NodeRotation, FaasError> {
    let bad = |why: &str| FaasError::Malformed { what: "coordinator rotation bundle", why: why.into() };
    const CERT: usize = psl_capsule::ROTATION_CERT_LEN;
    let head = 16 + 4 + 1 + CERT + 32;
    if b.len() < head || b[..16] != job.0 || u32_at(b, 16) != host || b[20] != stage.byte() {
        return Err(bad("wrong job, host or stage, or too short"));
    }
    let cert = RotationCert::decode(&b[21..21 + CERT]).map_err(|e| bad(&format!("certificate: {e}")))?;
    if cert.key_gen != key_gen {
        return Err(bad("key generation does not match the message"));
    }
    let data_key = DataKey::from_bytes(b[21 + CERT..head].try_into().expect("32 bytes"));
    if data_key.fingerprint() != cert.data_key_fp {
        return Err(bad("data key does not match the certificate"));
    }
    Ok(match stage {
        RotationStage::Prepare { refuse_if_begun } => {
            if b.len() != head {
                return Err(bad("bytes after the data key"));
            }
            NodeRotation {
                cert,
                data_key: Some(data_key),
                writers: Vec::new(),
                coordinator: None,
                refuse_if_begun,
                certs: Vec::new(),
            }
        }
        RotationStage::Finish => {
            if b.len() < head + 32 {
                return Err(bad("no coordinator key"));
            }
            let mut sk = Zeroizing::new([0u8; 32]);
            sk.copy_from_slice(&b[head..head + 32]);
            let key = SigningKey::from_bytes(&sk).map_err(|_| bad("signing key"))?;
            let certs = decode_statements(&b[head + 32..])?;
            NodeRotation {
                cert,
                data_key: Some(data_key),
                writers: Vec::new(),
                coordinator: Some(key),
                refuse_if_begun: false,
                certs,
            }
        }
    })
}

struct Running {
    job: JobId,
    rank: u8,
    node: Node,
}

struct HostInner {
    channel: Option<ChannelKey>,
    running: Option<Running>,
    /// The stats of the last coordinator stopped (for a close after a kill).
    last: Option<CoordinatorStats>,
}

/// One coordinator host: at most one job's coordinator at a time.
pub struct CoordinatorHost {
    /// The host's id (rank r of a job runs on host r).
    pub id: u32,
    attester: Box<dyn Attester>,
    inner: Mutex<HostInner>,
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}

impl CoordinatorHost {
    /// A host with no coordinator running, attesting with `attester`.
    pub fn new(id: u32, attester: Box<dyn Attester>) -> CoordinatorHost {
        CoordinatorHost { id, attester, inner: Mutex::new(HostInner { channel: None, running: None, last: None }) }
    }

    /// An offer under the leader's `nonce`: a fresh channel key bound into this host's report
    /// (over TLS, with the hash of its certificate key too).
    pub fn offer_for(&self, nonce: &[u8; 32], tls_spki: Option<[u8; 32]>) -> Result<Offer, FaasError> {
        let who = format!("coordinator host {}", self.id);
        let (channel, offer) = Offer::make(&*self.attester, self.id, &who, nonce, tls_spki)?;
        self.inner.lock().channel = Some(channel);
        Ok(offer)
    }

    /// Opens the sealed key bundle of `rank` for `job` and starts the coordinator node on `ep`
    /// (its own-chain log in `state_dir`, if given). Returns `true` if this host already ran
    /// that job's coordinator of that rank (its leader went away and a new one took the job
    /// back): the running node is kept and the new bundle only checked.
    pub fn open(
        &self,
        job: JobId,
        rank: u8,
        sealed: &[u8],
        ep: impl FnOnce(&SignedMetadata) -> Result<Arc<dyn Fabric>, FaasError>,
        state_dir: Option<std::path::PathBuf>,
    ) -> Result<bool, FaasError> {
        let mut g = self.inner.lock();
        let channel = g.channel.as_ref().ok_or_else(|| FaasError::Config("no channel key: not attested".into()))?;
        let b = channel.open(sealed, &coordinator_grant_aad(job, self.id, rank))?;
        let (cfg, keys) = parse_grant_bundle(&b, job, self.id, rank)?;
        drop(b);
        if let Some(r) = &g.running {
            if r.job == job && r.rank == rank && r.node.capsule() == keys.meta.name() {
                tracing::info!(host = self.id, rank, "coordinator host: a new leader took the running job back");
                return Ok(true);
            }
            return Err(FaasError::Config(format!(
                "coordinator host {} already runs job {} (rank {})",
                self.id, r.job, r.rank
            )));
        }
        let ep = ep(&keys.meta)?;
        let opts = NodeOptions {
            node_id: COORDINATOR_NODE_BASE + rank as u32,
            writers: 0,
            verifiers: 1,
            coordinator: Some(cfg),
            coordinator_state: state_dir,
            ..NodeOptions::default()
        };
        let node = Node::start(keys, ep, opts)?;
        tracing::info!(host = self.id, rank, %job, "coordinator host: coordinator started");
        g.running = Some(Running { job, rank, node });
        Ok(false)
    }

    fn with_node<T>(&self, f: impl FnOnce(&Running) -> Result<T, FaasError>) -> Result<T, FaasError> {
        let g = self.inner.lock();
        let r = g
            .running
            .as_ref()
            .ok_or_else(|| FaasError::Config(format!("coordinator host {} runs no coordinator", self.id)))?;
        f(r)
    }

    /// The epoch its coordinator's node is in; `FaasError::Config` if it runs no coordinator.
    pub fn epoch(&self) -> Result<u64, FaasError> {
        self.with_node(|r| Ok(r.node.rotation_state(Instant::now() + NODE_WAIT)?.epoch))
    }

    /// Opens and installs one rotation stage.
    pub fn rotate(&self, key_gen: u32, stage: RotationStage, sealed: &[u8]) -> Result<(), FaasError> {
        let g = self.inner.lock();
        let r = g.running.as_ref().ok_or_else(|| FaasError::Config("no coordinator running".into()))?;
        let channel = g.channel.as_ref().ok_or_else(|| FaasError::Config("no channel key".into()))?;
        let b = channel.open(sealed, &coordinator_rotation_aad(r.job, self.id, key_gen, stage))?;
        let install = parse_rotation_bundle(&b, r.job, self.id, key_gen, stage)?;
        drop(b);
        r.node.install_rotation(install, NODE_WAIT)?;
        Ok(())
    }

    /// Installs key statements (checked by the node's verifier against the capsule).
    pub fn statements(&self, encoded: &[u8]) -> Result<(), FaasError> {
        let list = decode_statements(encoded)?;
        if list.is_empty() {
            return Ok(());
        }
        self.with_node(|r| {
            r.node.add_statements(list, NODE_WAIT)?;
            Ok(())
        })
    }

    /// What the running coordinator has done so far.
    pub fn stats(&self) -> Option<CoordinatorStats> {
        let g = self.inner.lock();
        g.running.as_ref().map(|r| self.stats_of(r, true)).or_else(|| g.last.clone())
    }

    fn stats_of(&self, r: &Running, alive: bool) -> CoordinatorStats {
        use std::sync::atomic::Ordering::Relaxed;
        let m = r.node.metrics();
        CoordinatorStats {
            host: self.id,
            rank: r.rank,
            records_written: m.records_written.load(Relaxed),
            syncs_applied: m.syncs_applied.load(Relaxed),
            epoch: m.epoch.load(Relaxed),
            alive,
        }
    }

    /// The job this host's coordinator runs for, if any.
    pub fn running_job(&self) -> Option<(JobId, u8)> {
        self.inner.lock().running.as_ref().map(|r| (r.job, r.rank))
    }

    /// Stops the coordinator and drops every key; returns what it did.
    pub fn close(&self) -> Option<CoordinatorStats> {
        let mut g = self.inner.lock();
        g.channel = None;
        let r = g.running.take()?;
        let s = self.stats_of(&r, true);
        r.node.shutdown();
        g.last = Some(CoordinatorStats { alive: false, ..s.clone() });
        tracing::info!(
            host = self.id,
            rank = s.rank,
            records = s.records_written,
            "coordinator host: coordinator stopped"
        );
        Some(s)
    }
}

/// The in-process link (the embedded deployment).
pub struct LocalCoordinator(pub Arc<CoordinatorHost>);

impl CoordinatorLink for LocalCoordinator {
    fn epoch(&self) -> Result<u64, FaasError> {
        self.0.epoch()
    }

    fn rotate(&self, key_gen: u32, stage: RotationStage, sealed: &[u8]) -> Result<(), FaasError> {
        self.0.rotate(key_gen, stage, sealed)
    }

    fn statements(&self, encoded: &[u8]) -> Result<(), FaasError> {
        self.0.statements(encoded)
    }

    fn close(&self) -> Result<CoordinatorStats, FaasError> {
        // A coordinator killed earlier (a test's fault) reports what it had done, not alive.
        match self.0.close() {
            Some(s) => Ok(s),
            None => self.0.stats().ok_or_else(|| FaasError::Config("the coordinator never ran".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attest::{measure, AttestPolicy, Measurement, SimAttester, SimPlatform, SimVerifier};
    use crate::leader::Leader;
    use psl_capsule::{new_capsule_with, Limits};
    use psl_crypto::OwnerKey;
    use psl_fabric::{FabricConfig, InProcHub};

    struct Setup {
        leader: Leader,
        hosts: Vec<Arc<CoordinatorHost>>,
        rogue: CoordinatorHost,
        hub: InProcHub,
        job: JobId,
    }

    fn setup() -> Setup {
        let p = SimPlatform::new();
        let m: Measurement = measure(&psl_crypto::sha256(&[b"coordinator test"]), b"config");
        let verifier = SimVerifier::new(p.public(), AttestPolicy { allowed: [m].into() });
        let leader = Leader::new(Box::new(SimAttester::new(p.clone(), m)), Box::new(verifier));
        let owner = OwnerKey::generate();
        let meta =
            new_capsule_with(&owner, 7, "coordinator test", 1, Limits::default(), WriterKeys::Certified).unwrap();
        let job = JobId::random();
        leader.begin_job(job, owner, meta, 0).unwrap();
        let host = |id| Arc::new(CoordinatorHost::new(id, Box::new(SimAttester::new(p.clone(), m))));
        let rogue_m = measure(&psl_crypto::sha256(&[b"other code"]), b"config");
        let rogue = CoordinatorHost::new(9, Box::new(SimAttester::new(p.clone(), rogue_m)));
        Setup {
            leader,
            hosts: vec![host(0), host(1)],
            rogue,
            hub: InProcHub::new(FabricConfig::default()).unwrap(),
            job,
        }
    }

    fn open(s: &Setup, host: &CoordinatorHost, rank: u8, sealed: &[u8]) -> Result<bool, FaasError> {
        let ep = |_: &SignedMetadata| -> Result<Arc<dyn Fabric>, FaasError> {
            Ok(Arc::new(s.hub.endpoint(format!("coordinator-{}", host.id))))
        };
        host.open(s.job, rank, sealed, ep, None)
    }

    #[test]
    fn a_coordinator_host_gets_only_its_rank_after_attestation_and_a_new_leader_adopts_it() {
        let s = setup();
        let h0 = &s.hosts[0];
        let offer = h0.offer_for(&s.leader.coordinator_challenge(0), None).unwrap();
        let sealed = s.leader.grant_coordinator(&offer, 0).unwrap();
        // Sealed to this host's channel key, for this host and rank only.
        assert!(open(&s, h0, 1, &sealed).is_err(), "opened as another rank");
        assert!(open(&s, &s.hosts[1], 0, &sealed).is_err(), "opened by another host");
        let mut flipped = sealed.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert!(open(&s, h0, 0, &flipped).is_err(), "an altered bundle opened");
        assert!(!open(&s, h0, 0, &sealed).unwrap(), "a fresh start");
        assert_eq!(h0.running_job(), Some((s.job, 0)));
        // Opened again (a restarted leader with the same job): the running node is kept.
        let offer = h0.offer_for(&s.leader.coordinator_challenge(0), None).unwrap();
        let again = s.leader.grant_coordinator(&offer, 0).unwrap();
        assert!(open(&s, h0, 0, &again).unwrap(), "adopted");
        // A host outside the policy gets nothing; a reused nonce is refused.
        let bad = s.rogue.offer_for(&s.leader.coordinator_challenge(9), None).unwrap();
        let e = s.leader.grant_coordinator(&bad, 1).unwrap_err();
        assert!(e.to_string().contains("coordinator host 9"), "{e}");
        assert!(s.leader.grant_coordinator(&offer, 0).is_err(), "a nonce is good for one grant");
        // A rank the capsule does not allow.
        let offer = s.hosts[1].offer_for(&s.leader.coordinator_challenge(1), None).unwrap();
        assert!(s.leader.grant_coordinator(&offer, 3).is_err());
        let stats = h0.close().unwrap();
        assert_eq!((stats.host, stats.rank, stats.alive), (0, 0, true));
        assert_eq!(h0.running_job(), None);
        assert!(h0.epoch().is_err(), "the keys went with the node");
    }

    #[test]
    fn statement_lists_of_any_length_round_trip_and_junk_is_refused() {
        let app = OwnerKey::generate().app(3).unwrap();
        let meta =
            new_capsule_with(&OwnerKey::generate(), 3, "s", 1, Limits::default(), WriterKeys::Certified).unwrap();
        let r = |w| KeyStatement::Revoke(psl_capsule::Revocation::issue(&app, meta.name(), 0, w, 5, u64::MAX).unwrap());
        for n in [0usize, 1, 64, 65, 200] {
            let list: Vec<KeyStatement> = (0..n as u32).map(r).collect();
            let e = encode_statements(&list).unwrap();
            assert_eq!(decode_statements(&e).unwrap().len(), n);
            for cut in [1, e.len() / 2, e.len().saturating_sub(1)] {
                if cut < e.len() {
                    assert!(decode_statements(&e[..cut]).is_err(), "n {n} cut {cut}");
                }
            }
            let mut long = e.clone();
            long.push(0);
            assert!(decode_statements(&long).is_err());
        }
        assert!(decode_statements(&[0xff, 0xff]).is_err());
    }

    #[test]
    fn rotation_bundles_open_only_at_their_stage() {
        let s = setup();
        let h0 = &s.hosts[0];
        let offer = h0.offer_for(&s.leader.coordinator_challenge(0), None).unwrap();
        open(&s, h0, 0, &s.leader.grant_coordinator(&offer, 0).unwrap()).unwrap();
        s.leader.attach_coordinator(0, 0, offer.channel_public, Box::new(LocalCoordinator(h0.clone()))).unwrap();
        // A prepare bundle presented as a finish is refused (the stage is in the associated data).
        let (cert, _) = s.leader.prepare_rotation(2).unwrap();
        let key = SigningKey::from_bytes(&[5; 32]).unwrap();
        let dk = DataKey::from_bytes(&[7; 32]);
        let prep = RotationStage::Prepare { refuse_if_begun: false };
        let sealed = rotation_bundle(s.job, 0, prep, &cert, &dk, None, &[], &offer.channel_public).unwrap();
        assert!(h0.rotate(cert.key_gen, RotationStage::Finish, &sealed).is_err());
        // A data key that is not the certificate's is refused.
        let e = h0.rotate(cert.key_gen, prep, &sealed).unwrap_err();
        assert!(e.to_string().contains("data key"), "{e}");
        let fin = rotation_bundle(s.job, 0, RotationStage::Finish, &cert, &dk, Some(&key), &[], &offer.channel_public);
        assert!(h0.rotate(cert.key_gen, RotationStage::Finish, &fin.unwrap()).is_err());
        // The leader's own finish goes through.
        let done = s.leader.finish_rotation().unwrap();
        assert_eq!(done.key_gen, 1);
        let stats = s.leader.end_job();
        assert_eq!(stats.len(), 1);
        assert!(stats[0].alive);
    }
}
