//! A worker (trusted): attests to the leader with a fresh channel key, opens the keys sealed to
//! that key, starts a node, opens the sealed program (integrity check), runs its lambda slots
//! in the sandbox, and on RESET wipes its memtable and drops every key.

use crate::attest::Attester;
use crate::channel::ChannelKey;
use crate::error::FaasError;
use crate::grant::{
    grant_aad, job_metadata, rotation_aad, Grant, Offer, RotationGrant, JOB_SERVERS_MAX, SLOTS_PER_WORKER_MAX,
};
use crate::kv::NodeKv;
use crate::leader::Leader;
use crate::program::{JobId, Payload, SealedProgram};
use crate::scheduler::SealedJob;
use parking_lot::Mutex;
use psl_capsule::{KeyStatement, RotationCert, SignedMetadata, WriterCert, WriterKeys};
use psl_crypto::{DataKey, SigningKey};
use psl_fabric::Fabric;
use psl_node::{Node, NodeKeys, NodeOptions, NodeRotation};
use psl_sandbox::{spawn_lambda, LambdaOutcome, LambdaSpec, SandboxLimits};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Largest sealed result one worker reports.
pub const RESULT_BYTES_MAX: usize = 8 << 20;

struct Inner {
    channel: Option<ChannelKey>,
    /// The job and the node id of the grant (for key rotations).
    granted: Option<(JobId, u32)>,
    node: Option<Arc<Node>>,
    data_key: Option<DataKey>,
    attested: bool,
}

/// A worker: attests to the leader, opens its sealed keys, and runs its lambda slots on a
/// `psl_node::Node` in the job's capsule.
pub struct Worker {
    /// The worker's id (as registered with the scheduler).
    pub id: u32,
    attester: Box<dyn Attester>,
    /// Resource limits of each lambda's sandbox (part of the measured configuration).
    pub limits: SandboxLimits,
    /// How long the worker waits for a SYNC of its node to be acknowledged (default 10 s).
    pub sync_timeout: Duration,
    inner: Mutex<Inner>,
}

/// What a worker did with its slots.
pub struct WorkerRun {
    /// The worker's id.
    pub worker: u32,
    /// When its keys were opened and its node started.
    pub keys_ready: Instant,
    /// When its program was opened and every slot's lambda started.
    pub lambdas_started: Instant,
    /// Each lambda's outcome, in slot order.
    pub outcomes: Vec<LambdaOutcome>,
    /// The final SYNC of the worker's node after its lambdas ended (its error as text).
    pub final_sync: Result<(), String>,
    /// Whether every write of the worker's node ended acked by f + 1 of the job's capsule
    /// servers.
    pub durable: DurableEnd,
}

/// How a worker's writes ended: once its lambdas are done (and their writes covered by a SYNC),
/// a worker whose job has capsule servers waits, bounded by the sandbox's `durable_timeout`,
/// until every write its node accepted is acked by a majority (f + 1) of them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DurableEnd {
    /// The job's capsule servers (0: none, and nothing was made durable).
    pub servers: u32,
    /// Why the writes did not end durable (the wait's error, with the acks that arrived).
    pub error: Option<String>,
}

impl DurableEnd {
    /// Whether the writes ended durable: the job has capsule servers and the wait succeeded.
    pub fn is_durable(&self) -> bool {
        self.servers > 0 && self.error.is_none()
    }
}

/// What a worker holds, for tests and debug dumps (no secret is shown, only its presence).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WorkerDebug {
    /// Whether it holds any key material (channel key, data key, or a node with keys).
    pub holds_keys: bool,
    /// Whether its node is running.
    pub node_running: bool,
    /// Entries in its node's memtable.
    pub memtable_entries: usize,
    /// Whether it was granted and opened keys for a job (cleared by RESET).
    pub attested: bool,
}

impl Worker {
    /// A worker with no keys, attesting with `attester`; its SYNC timeout is 10 s.
    pub fn new(id: u32, attester: Box<dyn Attester>, limits: SandboxLimits) -> Worker {
        Worker {
            id,
            attester,
            limits,
            sync_timeout: Duration::from_secs(10),
            inner: Mutex::new(Inner { channel: None, granted: None, node: None, data_key: None, attested: false }),
        }
    }

    /// Answers a forwarded job: a fresh channel key, a report binding it, under the leader's nonce.
    pub fn offer(&self, leader: &Leader) -> Result<Offer, FaasError> {
        self.offer_for(&leader.challenge(self.id), None)
    }

    /// An offer under `nonce`; over TLS, `tls_spki` is the hash of this worker's certificate
    /// key, bound into the report too.
    pub fn offer_for(&self, nonce: &[u8; 32], tls_spki: Option<[u8; 32]>) -> Result<Offer, FaasError> {
        let who = format!("worker {}", self.id);
        let (channel, offer) = Offer::make(&*self.attester, self.id, &who, nonce, tls_spki)?;
        self.inner.lock().channel = Some(channel);
        Ok(offer)
    }

    /// Opens the grant, starts the node, opens the program, runs the slots, waits for them.
    /// `ep` is this worker's endpoint on the deployment's fabric.
    pub fn run(&self, job: &SealedJob, grant: &Grant, ep: Arc<dyn Fabric>) -> Result<WorkerRun, FaasError> {
        // The channel key stays for key rotations during the job (RESET drops it).
        let bundle = {
            let g = self.inner.lock();
            let channel = g.channel.as_ref().ok_or_else(|| FaasError::Worker {
                worker: self.id,
                why: "no channel key: not attested for this job".into(),
            })?;
            channel.open(&grant.sealed_keys, &grant_aad(job.job, self.id, &grant.lambdas))?
        };
        let t = Instant::now();
        let (meta, data_key, writers, servers, certs) = parse_bundle(&bundle, job.job, grant)?;
        drop(bundle);
        tracing::debug!("worker {}: key bundle checked in {:?}", self.id, t.elapsed());
        {
            let mut g = self.inner.lock();
            g.attested = true;
            g.granted = Some((job.job, grant.node_id));
        }
        // Integrity first: nothing runs unless the program (and input) open under the job's key.
        let program = job.program.open(&data_key, job.job, Payload::Program, self.limits.program_bytes_max)?;
        let program: Arc<str> = Arc::from(
            std::str::from_utf8(&program)
                .map_err(|_| FaasError::Malformed { what: "program", why: "not UTF-8".into() })?,
        );
        let input: Option<Arc<str>> = match &job.input {
            Some(s) => {
                let i = s.open(&data_key, job.job, Payload::Input, self.limits.input_bytes_max)?;
                Some(Arc::from(String::from_utf8_lossy(&i).as_ref()))
            }
            None => None,
        };
        let opts = NodeOptions {
            node_id: grant.node_id,
            incarnation: 0,
            writers: writers.len(),
            verifiers: 1,
            ..NodeOptions::default()
        };
        let opts = NodeOptions { core: psl_scl::NodeConfig { servers, ..opts.core }, ..opts };
        let keys = NodeKeys { meta, data_key: data_key.clone(), writers, coordinator: None, certs };
        let t = Instant::now();
        let node = Arc::new(Node::start(keys, ep, opts)?);
        tracing::debug!("worker {}: node started in {:?}", self.id, t.elapsed());
        {
            let mut g = self.inner.lock();
            g.node = Some(node.clone());
            g.data_key = Some(data_key);
        }
        let keys_ready = Instant::now();
        let mut handles = Vec::new();
        for &l in &grant.lambdas {
            let host = Arc::new(NodeKv { node: node.clone(), sync_timeout: self.sync_timeout });
            let spec = LambdaSpec { id: l, count: job.lambdas, program: program.clone(), input: input.clone() };
            handles.push(spawn_lambda(spec, host, self.limits)?);
        }
        let lambdas_started = Instant::now();
        let outcomes: Vec<LambdaOutcome> = handles.into_iter().map(|h| h.join()).collect();
        // Seal and publish every write, covered by a SYNC, before reporting.
        let final_sync = node.sync(self.sync_timeout).map_err(|e| e.to_string());
        let error = if servers == 0 {
            Some("the job has no capsule servers".to_string())
        } else {
            let e = node.sync_durable(self.limits.durable_timeout).err().map(|e| e.to_string());
            if let Some(e) = &e {
                tracing::warn!("worker {}: the job's writes did not end durable: {e}", self.id);
            }
            e
        };
        let durable = DurableEnd { servers, error };
        Ok(WorkerRun { worker: self.id, keys_ready, lambdas_started, outcomes, final_sync, durable })
    }

    /// A key rotation from the leader: opens the bundle with this job's channel key, checks it
    /// (job, node id, the data key and every writer key against the certificate, one key for
    /// each of this node's writers), and installs it in the running node, which checks the
    /// owner's signature on the certificate. Waits (up to 10 s) for the node if the rotation
    /// arrives before it started. Returns the node's newest key generation.
    pub fn rotate(&self, g: &RotationGrant) -> Result<u32, FaasError> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let fail = |why: String| FaasError::Worker { worker: self.id, why: format!("key rotation: {why}") };
        let (job, node_id, node, bundle) = loop {
            {
                let inner = self.inner.lock();
                let channel = inner.channel.as_ref().ok_or_else(|| fail("no channel key (not granted)".into()))?;
                if let (Some((job, node_id)), Some(node)) = (inner.granted, inner.node.clone()) {
                    let bundle = channel.open(&g.sealed_keys, &rotation_aad(job, self.id, g.key_gen))?;
                    break (job, node_id, node, bundle);
                }
            }
            if Instant::now() >= deadline {
                return Err(fail("the node did not start within 10 s".into()));
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let rot = parse_rotation(&bundle, job, node_id)?;
        drop(bundle);
        if rot.cert.key_gen != g.key_gen {
            return Err(fail("key generation does not match the message".into()));
        }
        let st = node.install_rotation(rot, Duration::from_secs(10))?;
        tracing::info!(
            worker = self.id,
            key_gen = st.key_gen_newest,
            from_epoch = st.from_epoch,
            "worker: key rotation installed"
        );
        Ok(st.key_gen_newest)
    }

    /// Seals `plaintext` (this worker's results) for the client under the job's data key, so
    /// that the untrusted scheduler can relay it without reading it.
    pub fn seal_result(&self, job: JobId, plaintext: &[u8]) -> Result<SealedProgram, FaasError> {
        let g = self.inner.lock();
        let key = g
            .data_key
            .as_ref()
            .ok_or_else(|| FaasError::Worker { worker: self.id, why: "no data key to seal results with".into() })?;
        SealedProgram::seal(key, job, Payload::Result, plaintext, RESULT_BYTES_MAX)
    }

    /// RESET: wipes the memtable, stops the node (its writer keys go with it), drops the data
    /// and channel keys. The next job needs a new attestation. Returns the state left behind.
    pub fn reset(&self) -> WorkerDebug {
        let (node, data_key, channel) = {
            let mut g = self.inner.lock();
            g.attested = false;
            g.granted = None;
            (g.node.take(), g.data_key.take(), g.channel.take())
        };
        drop(data_key);
        drop(channel);
        let mut entries = 0;
        if let Some(node) = node {
            if let Err(e) = node.reset() {
                tracing::warn!("worker {}: reset: {e}", self.id);
            }
            entries = node.memtable().len();
            match Arc::try_unwrap(node) {
                Ok(n) => n.shutdown(),
                Err(n) => {
                    tracing::warn!("worker {}: node still referenced at RESET; dropping our handle", self.id);
                    drop(n);
                }
            }
        }
        let mut d = self.debug();
        d.memtable_entries = entries;
        d
    }

    /// What the worker holds now.
    pub fn debug(&self) -> WorkerDebug {
        let g = self.inner.lock();
        WorkerDebug {
            holds_keys: g.data_key.is_some() || g.node.is_some() || g.channel.is_some(),
            node_running: g.node.is_some(),
            memtable_entries: g.node.as_ref().map(|n| n.memtable().len()).unwrap_or(0),
            attested: g.attested,
        }
    }
}

#[allow(clippy::type_complexity)]
fn parse_bundle(
    b: &[u8],
    job: JobId,
    grant: &Grant,
) -> Result<(SignedMetadata, DataKey, Vec<(u32, SigningKey)>, u32, Vec<KeyStatement>), FaasError> {
    let bad = |why: &str| FaasError::Malformed { what: "key bundle", why: why.into() };
    if b.len() < 16 + 4 + 32 + 2 + 2 || b[..16] != job.0 {
        return Err(bad("wrong job or too short"));
    }
    let node_id = u32::from_le_bytes(b[16..20].try_into().expect("4"));
    if node_id != grant.node_id {
        return Err(bad("node id does not match the grant"));
    }
    let data_key = DataKey::from_bytes(b[20..52].try_into().expect("32"));
    let servers = u16::from_le_bytes(b[52..54].try_into().expect("2")) as u32;
    if servers > JOB_SERVERS_MAX {
        return Err(bad("capsule server count"));
    }
    let n = u16::from_le_bytes(b[54..56].try_into().expect("2")) as usize;
    if n != grant.lambdas.len() || n > SLOTS_PER_WORKER_MAX || b.len() < 56 + 36 * n {
        return Err(bad("writer count"));
    }
    let mut writers = Vec::with_capacity(n);
    for i in 0..n {
        let o = 56 + 36 * i;
        let w = u32::from_le_bytes(b[o..o + 4].try_into().expect("4"));
        let mut sk = zeroize::Zeroizing::new([0u8; 32]);
        sk.copy_from_slice(&b[o + 4..o + 36]);
        writers.push((w, SigningKey::from_bytes(&sk).map_err(|_| bad("writer key"))?));
    }
    let (meta, tail) = job_metadata(&b[56 + 36 * n..], &data_key, bad)?;
    let mut certs = Vec::new();
    match meta.meta.policy.writer_keys {
        WriterKeys::Derived => {
            if !tail.is_empty() {
                return Err(bad("bytes after the metadata"));
            }
            for (w, k) in &writers {
                if meta.meta.app.writer(*w).ok() != Some(k.verifying_key()) {
                    return Err(bad("writer key is not the application's"));
                }
            }
        }
        WriterKeys::Certified => {
            const CERT: usize = psl_capsule::certs::WRITER_CERT_LEN;
            if tail.len() != CERT * n {
                return Err(bad("one certificate per writer"));
            }
            for ((w, k), c) in writers.iter().zip(tail.chunks(CERT)) {
                let c = WriterCert::decode(c).map_err(|e| bad(&format!("certificate: {e}")))?;
                if c.writer != *w || c.key_gen != 0 || c.key != k.verifying_key() {
                    return Err(bad("a certificate does not match its writer's key"));
                }
                c.check(meta.name(), &meta.meta.app.point()).map_err(|e| bad(&format!("certificate: {e}")))?;
                certs.push(KeyStatement::Cert(c));
            }
        }
    }
    Ok((meta, data_key, writers, servers, certs))
}

/// A rotation bundle: `job id (16) ‖ node id u32 ‖ certificate (214) ‖ data key (32) ‖ n u16 ‖
/// n × (writer u32 ‖ writer secret 32)`. Checks everything but the owner's signature (the
/// node's verifier checks that when it installs the certificate).
fn parse_rotation(b: &[u8], job: JobId, node_id: u32) -> Result<NodeRotation, FaasError> {
    let bad = |why: &str| FaasError::Malformed { what: "rotation bundle", why: why.into() };
    const CERT: usize = psl_capsule::ROTATION_CERT_LEN;
    let head = 16 + 4 + CERT + 32 + 2;
    if b.len() < head || b[..16] != job.0 {
        return Err(bad("wrong job or too short"));
    }
    if u32::from_le_bytes(b[16..20].try_into().expect("4")) != node_id {
        return Err(bad("node id does not match the grant"));
    }
    let cert = RotationCert::decode(&b[20..20 + CERT]).map_err(|e| bad(&format!("certificate: {e}")))?;
    let o = 20 + CERT;
    let data_key = DataKey::from_bytes(b[o..o + 32].try_into().expect("32"));
    if data_key.fingerprint() != cert.data_key_fp {
        return Err(bad("data key does not match the certificate"));
    }
    let n = u16::from_le_bytes(b[o + 32..o + 34].try_into().expect("2")) as usize;
    // A certified capsule's bundle ends with one certificate per writer.
    const WCERT: usize = psl_capsule::certs::WRITER_CERT_LEN;
    let certified = b.len() == head + (36 + WCERT) * n && n > 0;
    if n > SLOTS_PER_WORKER_MAX || !(b.len() == head + 36 * n || certified) {
        return Err(bad("writer count or length"));
    }
    let mut writers = Vec::with_capacity(n);
    for i in 0..n {
        let p = head + 36 * i;
        let w = u32::from_le_bytes(b[p..p + 4].try_into().expect("4"));
        let mut sk = zeroize::Zeroizing::new([0u8; 32]);
        sk.copy_from_slice(&b[p + 4..p + 36]);
        let k = SigningKey::from_bytes(&sk).map_err(|_| bad("writer key"))?;
        if !certified && cert.app.writer(w).ok() != Some(k.verifying_key()) {
            return Err(bad("writer key is not the new application key's"));
        }
        writers.push((w, k));
    }
    let mut certs = Vec::new();
    if certified {
        for (i, (w, k)) in writers.iter().enumerate() {
            let p = head + 36 * n + WCERT * i;
            let c = WriterCert::decode(&b[p..p + WCERT]).map_err(|e| bad(&format!("certificate: {e}")))?;
            if c.writer != *w || c.key_gen != cert.key_gen || c.key != k.verifying_key() {
                return Err(bad("a certificate does not match its writer's new key"));
            }
            c.check(cert.capsule, &cert.app.point()).map_err(|e| bad(&format!("certificate: {e}")))?;
            certs.push(KeyStatement::Cert(c));
        }
    }
    Ok(NodeRotation { cert, data_key: Some(data_key), writers, coordinator: None, refuse_if_begun: false, certs })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::{seal_to, ChannelKey};
    use psl_capsule::{new_capsule, Limits};
    use psl_crypto::OwnerKey;

    fn bundle(job: JobId, node_id: u32, cert: &RotationCert, dk: &DataKey, keys: &[(u32, SigningKey)]) -> Vec<u8> {
        let mut b = job.0.to_vec();
        b.extend_from_slice(&node_id.to_le_bytes());
        b.extend_from_slice(&cert.encode());
        b.extend_from_slice(dk.expose_bytes());
        b.extend_from_slice(&(keys.len() as u16).to_le_bytes());
        for (w, k) in keys {
            b.extend_from_slice(&w.to_le_bytes());
            b.extend_from_slice(&k.expose_secret_bytes()[..]);
        }
        b
    }

    fn dup(k: &SigningKey) -> SigningKey {
        SigningKey::from_bytes(&k.expose_secret_bytes()).unwrap()
    }

    /// A grant bundle of a certified capsule: `... ‖ metadata ‖ one certificate per writer`.
    fn certified_grant(
        job: JobId,
        node_id: u32,
        app: &psl_crypto::AppKey,
        meta: &SignedMetadata,
        writers: &[(u32, SigningKey, WriterCert)],
    ) -> Vec<u8> {
        let mut b = job.0.to_vec();
        b.extend_from_slice(&node_id.to_le_bytes());
        b.extend_from_slice(app.data_key().expose_bytes());
        b.extend_from_slice(&3u16.to_le_bytes());
        b.extend_from_slice(&(writers.len() as u16).to_le_bytes());
        for (w, k, _) in writers {
            b.extend_from_slice(&w.to_le_bytes());
            b.extend_from_slice(&k.expose_secret_bytes()[..]);
        }
        b.extend_from_slice(&meta.encode());
        for (_, _, c) in writers {
            b.extend_from_slice(&c.encode());
        }
        b
    }

    #[test]
    fn certified_grant_bundles_carry_a_checked_certificate_per_writer() {
        let owner = OwnerKey::from_seed(&[4; 32]).unwrap();
        let app = owner.app(1).unwrap();
        let meta =
            psl_capsule::new_capsule_with(&owner, 1, "job", 0, Limits::default(), WriterKeys::Certified).unwrap();
        let job = JobId([9; 16]);
        let grant = Grant { worker: 1, node_id: 1, lambdas: vec![0, 1], sealed_keys: Vec::new() };
        let ws: Vec<(u32, SigningKey, WriterCert)> = (0..2)
            .map(|a| {
                let w = psl_scl::writer_index(1, 0, a).unwrap();
                let (k, c) = psl_capsule::writer_credentials(&meta, &app, w).unwrap();
                (w, k, c.unwrap())
            })
            .collect();
        let good = certified_grant(job, 1, &app, &meta, &ws);
        let (_, _, writers, servers, certs) = parse_bundle(&good, job, &grant).unwrap();
        assert_eq!((writers.len(), servers, certs.len()), (2, 3, 2));
        // Without the certificates, with one cut, swapped, or signed by another application key.
        assert!(parse_bundle(&good[..good.len() - 2 * psl_capsule::certs::WRITER_CERT_LEN], job, &grant).is_err());
        assert!(parse_bundle(&good[..good.len() - 1], job, &grant).is_err());
        let swapped = vec![(ws[0].0, dup(&ws[0].1), ws[1].2.clone()), (ws[1].0, dup(&ws[1].1), ws[0].2.clone())];
        assert!(parse_bundle(&certified_grant(job, 1, &app, &meta, &swapped), job, &grant).is_err());
        let thief = owner.app(2).unwrap();
        let forged: Vec<_> = ws
            .iter()
            .map(|(w, k, _)| {
                let c =
                    WriterCert::sign(&thief, meta.name(), 0, *w, k.verifying_key(), 0, psl_capsule::certs::OPEN_ENDED);
                (*w, dup(k), c)
            })
            .collect();
        assert!(parse_bundle(&certified_grant(job, 1, &app, &meta, &forged), job, &grant).is_err());
    }

    #[test]
    fn rotation_bundles_are_checked_and_open_only_for_their_worker() {
        let owner = OwnerKey::from_seed(&[3; 32]).unwrap();
        let meta = new_capsule(&owner, 1, "rot", 0, Limits::default()).unwrap();
        let cert = RotationCert::issue(&owner, &meta, 1, 2, 9).unwrap();
        let app = owner.app(2).unwrap();
        let (job, w1, w2) =
            (JobId([7; 16]), psl_scl::writer_index(1, 0, 0).unwrap(), psl_scl::writer_index(2, 0, 0).unwrap());
        let good = bundle(job, 1, &cert, &app.data_key(), &[(w1, app.writer(w1).unwrap())]);
        let r = parse_rotation(&good, job, 1).unwrap();
        assert_eq!(r.writers.len(), 1);
        assert_eq!(r.writers[0].0, w1);
        // Another job, another node, a truncated bundle, a data key or writer key not the
        // certificate's: all refused.
        assert!(parse_rotation(&good, JobId([8; 16]), 1).is_err());
        assert!(parse_rotation(&good, job, 2).is_err());
        assert!(parse_rotation(&good[..good.len() - 1], job, 1).is_err());
        let old = owner.app(1).unwrap();
        assert!(
            parse_rotation(&bundle(job, 1, &cert, &old.data_key(), &[(w1, app.writer(w1).unwrap())]), job, 1).is_err()
        );
        assert!(
            parse_rotation(&bundle(job, 1, &cert, &app.data_key(), &[(w1, old.writer(w1).unwrap())]), job, 1).is_err()
        );
        assert!(
            parse_rotation(&bundle(job, 1, &cert, &app.data_key(), &[(w1, app.writer(w2).unwrap())]), job, 1).is_err()
        );
        // Sealed to worker 1's channel key under its associated data: worker 2 cannot open it,
        // nor can it be replayed as another worker's or another generation's.
        let (k1, k2) = (ChannelKey::generate().unwrap(), ChannelKey::generate().unwrap());
        let sealed = seal_to(&k1.public(), &rotation_aad(job, 1, 1), &good).unwrap();
        assert!(k1.open(&sealed, &rotation_aad(job, 1, 1)).is_ok());
        assert!(k1.open(&sealed, &rotation_aad(job, 1, 1)).is_ok(), "the channel key serves the whole job");
        assert!(k2.open(&sealed, &rotation_aad(job, 1, 1)).is_err());
        assert!(k1.open(&sealed, &rotation_aad(job, 2, 1)).is_err());
        assert!(k1.open(&sealed, &rotation_aad(job, 1, 2)).is_err());
    }
}
