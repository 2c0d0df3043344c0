//! The leader (trusted): holds the owner key for a job, derives the application key and one
//! writer key per lambda slot, attests each worker before handing it exactly its own keys,
//! attests the job's coordinator hosts and hands each the keys of one coordinator rank (the
//! primary and its shadows run there, not in the leader: [`crate::coordinator`]), and forgets
//! everything at the end of the job.

use crate::attest::{bind_offer, AttestError, AttestVerifier, Attester, Evidence, VerifiedReport};
use crate::channel::seal_to;
use crate::coordinator::{grant_bundle, rotation_bundle, CoordinatorLink, CoordinatorStats, RotationStage};
use crate::error::FaasError;
use crate::grant::{grant_aad, rotation_aad, Grant, Offer, RotationGrant, JOB_SERVERS_MAX, SLOTS_PER_WORKER_MAX};
use crate::program::JobId;
use crate::rotation::{fresh_app_index, rotate, rotation_epoch, Rotation};
use parking_lot::Mutex;
use psl_capsule::certs::ANY_SEQ;
use psl_capsule::{RotationCert, SignedMetadata};
use psl_crypto::{AppKey, OwnerKey};
use psl_scl::CoordinatorConfig;
use std::collections::HashMap;
use zeroize::Zeroizing;

/// A granted worker, as the leader remembers it for key rotations.
struct Granted {
    worker: u32,
    node_id: u32,
    channel_public: [u8; 32],
    writers: Vec<u32>,
}

struct LeaderJob {
    job: JobId,
    owner: OwnerKey,
    app: AppKey,
    meta: SignedMetadata,
    /// The job's capsule servers `n` (ids `0 .. n`): every worker counts a write durable once
    /// `n / 2 + 1` of them acked it. Sealed into each grant, so no one on the way can lower it.
    servers: u32,
    /// The job's coordinators (primary first), each on its own attested host.
    coordinators: Vec<Attached>,
    granted: Vec<Granted>,
    /// Application indices this capsule has used (generation 0 first).
    app_indices: Vec<u32>,
    /// Certificates of generations 1.. in force or pending.
    certs: Vec<RotationCert>,
    /// A rotation prepared (certificate installed in the coordinator, bundles sealed) whose
    /// coordinator key is not yet handed over.
    pending: Option<Rotation>,
}

/// One of the job's coordinators, as the leader reaches it.
struct Attached {
    host: u32,
    rank: u8,
    channel_public: [u8; 32],
    link: Box<dyn CoordinatorLink>,
}

/// The trusted leader: attests workers, coordinator hosts and KV roles, derives and seals their
/// keys, places a job's coordinators, rotates its application key and RESETs its workers.
pub struct Leader {
    attester: Box<dyn Attester>,
    verifier: Box<dyn AttestVerifier>,
    nonces: Mutex<HashMap<u32, [u8; 32]>>,
    /// Nonces issued to coordinator hosts (by host id).
    coordinator_nonces: Mutex<HashMap<u32, [u8; 32]>>,
    job: Mutex<Option<LeaderJob>>,
    /// The KV capsule's application key (`psl leader --kv-owner`), handed to attested KV roles.
    kv: Mutex<Option<KvCapsule>>,
    /// Nonces issued to KV roles (by role and id).
    kv_nonces: Mutex<HashMap<(KvRole, u32), [u8; 32]>>,
    /// How the job's coordinators run (epochs, takeover of a shadow).
    pub coordinator: CoordinatorConfig,
}

/// The KV capsule the leader hands keys for: its metadata and application key (the owner key
/// is not kept; the application key never leaves the leader).
struct KvCapsule {
    meta: SignedMetadata,
    app: AppKey,
}

pub use crate::kvgrant::{kv_aad, open_kv_bundle, KvRole, KvRoleKeys};

impl Leader {
    /// A leader that attests itself with `attester` and admits the parties `verifier` (which
    /// carries the policy) accepts.
    pub fn new(attester: Box<dyn Attester>, verifier: Box<dyn AttestVerifier>) -> Leader {
        Leader {
            attester,
            verifier,
            nonces: Mutex::new(HashMap::new()),
            coordinator_nonces: Mutex::new(HashMap::new()),
            job: Mutex::new(None),
            kv: Mutex::new(None),
            kv_nonces: Mutex::new(HashMap::new()),
            // A shadow of rank r takes over after `10 × (1 + r)` epochs without a SYNC (400 ms
            // for rank 1): long enough that a loaded two-core machine's stalls rarely cause a
            // takeover (which is safe, but moves the job to another term for nothing).
            coordinator: CoordinatorConfig {
                epoch_ms: 20,
                eoe_timeout_ms: 200,
                takeover_after_epochs: 10,
                ..CoordinatorConfig::default()
            },
        }
    }

    /// Takes the KV capsule's owner key (`psl leader --kv-owner`): keeps only the capsule's
    /// application key, from which it derives each attested KV role's own keys
    /// ([`Leader::grant_kv`]). The capsule must certify writers
    /// ([`crate::kvgrant::check_kv_capsule`]).
    pub fn set_kv(&self, owner: &OwnerKey, meta: &SignedMetadata) -> Result<(), FaasError> {
        crate::kvgrant::check_kv_capsule(meta)?;
        if owner.public() != meta.meta.owner {
            return Err(FaasError::Config("the KV owner key is not the owner of the KV capsule".into()));
        }
        let app = owner.app(meta.meta.app_index).map_err(|e| FaasError::Config(e.to_string()))?;
        if app.public() != meta.meta.app {
            return Err(FaasError::Config("the KV capsule was not made for this owner key's application".into()));
        }
        *self.kv.lock() = Some(KvCapsule { meta: meta.clone(), app });
        Ok(())
    }

    /// Whether the leader hands out KV keys.
    pub fn serves_kv(&self) -> bool {
        self.kv.lock().is_some()
    }

    /// Checks what KV role `role` `id` asks for against its role and id, before anything is
    /// attested ([`Leader::grant_kv`] checks again).
    pub fn check_kv_request(&self, role: KvRole, id: u32, writers: &[u32]) -> Result<(), FaasError> {
        let guard = self.kv.lock();
        let kv = guard.as_ref().ok_or_else(|| FaasError::Config("this leader holds no KV keys (--kv-owner)".into()))?;
        crate::kvgrant::check_kv_request(&kv.meta, role, id, writers)
    }

    /// A fresh nonce for KV role `role` `id`'s report.
    pub fn kv_challenge(&self, role: KvRole, id: u32) -> [u8; 32] {
        let n: [u8; 32] = rand::random();
        self.kv_nonces.lock().insert((role, id), n);
        n
    }

    /// Checks a KV role's offer under the policy (its report over the nonce of
    /// [`Leader::kv_challenge`], binding its channel key and, over TLS, its certificate key)
    /// and what it asks for against its role and id ([`crate::kvgrant::check_kv_request`]),
    /// then seals to its channel key the capsule's data key and, for exactly the `writers`
    /// asked for, each one's signing key and certificate; never the application key. The
    /// associated data names the role, its id, the capsule and the writers. A role that
    /// fails either check gets an error and nothing sealed.
    pub fn grant_kv(&self, offer: &Offer, role: KvRole, id: u32, writers: &[u32]) -> Result<Vec<u8>, FaasError> {
        let who = || format!("KV {} {id}", role.name());
        let nonce = self
            .kv_nonces
            .lock()
            .remove(&(role, id))
            .ok_or_else(|| FaasError::Attestation { who: who(), why: "no challenge was issued to this role".into() })?;
        let v = self
            .verifier
            .verify(&offer.evidence, &nonce, &bind_offer(&offer.channel_public, offer.tls_spki.as_ref()))
            .map_err(|e| FaasError::Attestation { who: who(), why: e.to_string() })?;
        tracing::info!("{} attested: {} measurement {}", who(), v.kind, v.measurement.short());
        let guard = self.kv.lock();
        let kv = guard.as_ref().ok_or_else(|| FaasError::Config("this leader holds no KV keys (--kv-owner)".into()))?;
        crate::kvgrant::check_kv_request(&kv.meta, role, id, writers)?;
        crate::kvgrant::seal_kv_bundle(&kv.meta, &kv.app, role, id, writers, &offer.channel_public)
    }

    /// The leader's own report, for the client to check before it hands over the owner key.
    pub fn attest(&self, nonce: &[u8; 32], report_data: &[u8; 32]) -> Result<Evidence, FaasError> {
        self.attester
            .attest(nonce, report_data)
            .map_err(|e| FaasError::Attestation { who: "leader".into(), why: e.to_string() })
    }

    /// Takes the owner key for one job (in process, the move stands for the attested channel)
    /// and derives the application key. The job's coordinators are placed next
    /// ([`Leader::coordinator_challenge`], [`Leader::grant_coordinator`],
    /// [`Leader::attach_coordinator`]). `servers`: the job's capsule servers (ids
    /// `0 .. servers`; 0: none, and nothing the job writes can be made durable).
    pub fn begin_job(&self, job: JobId, owner: OwnerKey, meta: SignedMetadata, servers: u32) -> Result<(), FaasError> {
        if servers > JOB_SERVERS_MAX {
            return Err(FaasError::Config(format!("{servers} capsule servers: at most {JOB_SERVERS_MAX} per job")));
        }
        let app = owner.app(meta.meta.app_index).map_err(|e| FaasError::Config(e.to_string()))?;
        if app.public() != meta.meta.app {
            return Err(FaasError::Config("the capsule was not made for this owner key's application".into()));
        }
        let mut guard = self.job.lock();
        if guard.is_some() {
            return Err(FaasError::Config("the leader is already running a job".into()));
        }
        let app_indices = vec![meta.meta.app_index];
        *guard = Some(LeaderJob {
            job,
            owner,
            app,
            meta,
            servers,
            coordinators: Vec::new(),
            granted: Vec::new(),
            app_indices,
            certs: Vec::new(),
            pending: None,
        });
        Ok(())
    }

    /// A fresh nonce for coordinator host `host`'s report.
    pub fn coordinator_challenge(&self, host: u32) -> [u8; 32] {
        let n: [u8; 32] = rand::random();
        self.coordinator_nonces.lock().insert(host, n);
        n
    }

    /// Checks a coordinator host's offer (its report over the nonce of
    /// [`Leader::coordinator_challenge`], binding its channel key and, over TLS, its
    /// certificate key) and seals to its channel key the keys of coordinator rank `rank`:
    /// the data key, that rank's writer key and certificate, and the epoch configuration.
    pub fn grant_coordinator(&self, offer: &Offer, rank: u8) -> Result<Vec<u8>, FaasError> {
        let who = || format!("coordinator host {}", offer.worker);
        let nonce = self
            .coordinator_nonces
            .lock()
            .remove(&offer.worker)
            .ok_or_else(|| FaasError::Attestation { who: who(), why: "no challenge was issued to this host".into() })?;
        let v = self
            .verifier
            .verify(&offer.evidence, &nonce, &bind_offer(&offer.channel_public, offer.tls_spki.as_ref()))
            .map_err(|e| FaasError::Attestation { who: who(), why: e.to_string() })?;
        tracing::info!("{} attested: {} measurement {}", who(), v.kind, v.measurement.short());
        let guard = self.job.lock();
        let job = guard.as_ref().ok_or_else(|| FaasError::Config("no job in progress".into()))?;
        if !job.certs.is_empty() {
            return Err(FaasError::Config("coordinators are placed before any key rotation".into()));
        }
        let w = job
            .meta
            .meta
            .policy
            .coordinator_at(rank)
            .ok_or_else(|| FaasError::Config(format!("the capsule allows no coordinator of rank {rank}")))?;
        let (key, cert) =
            psl_capsule::writer_credentials(&job.meta, &job.app, w).map_err(|e| FaasError::Config(e.to_string()))?;
        let cfg = CoordinatorConfig { rank, ranks: job.meta.meta.policy.coordinators, ..self.coordinator };
        grant_bundle(
            job.job,
            offer.worker,
            &cfg,
            &job.app.data_key(),
            w,
            &key,
            &job.meta,
            cert.as_ref(),
            &offer.channel_public,
        )
    }

    /// Adds a coordinator that opened its grant: the leader reaches it through `link` for key
    /// rotations, revocations and the job's end.
    pub fn attach_coordinator(
        &self,
        host: u32,
        rank: u8,
        channel_public: [u8; 32],
        link: Box<dyn CoordinatorLink>,
    ) -> Result<(), FaasError> {
        let mut guard = self.job.lock();
        let job = guard.as_mut().ok_or_else(|| FaasError::Config("no job in progress".into()))?;
        if job.coordinators.iter().any(|c| c.rank == rank) {
            return Err(FaasError::Config(format!("the job already has a coordinator of rank {rank}")));
        }
        job.coordinators.push(Attached { host, rank, channel_public, link });
        job.coordinators.sort_by_key(|c| c.rank);
        Ok(())
    }

    /// A restarted leader taking back a running job (to end it): the workers its predecessor
    /// granted, each `(worker, node id, lambda slots)` as the client was told, so that the
    /// job's end revokes their writers. They hold no channel to this leader: key rotations
    /// cannot reach them.
    pub fn resume_granted(&self, granted: &[(u32, u32, u32)]) -> Result<(), FaasError> {
        let mut guard = self.job.lock();
        let job = guard.as_mut().ok_or_else(|| FaasError::Config("no job in progress".into()))?;
        for &(worker, node_id, slots) in granted {
            if slots as usize > SLOTS_PER_WORKER_MAX || node_id == 0 {
                return Err(FaasError::Config(format!("worker {worker}: node {node_id} with {slots} slots")));
            }
            let writers = (0..slots).filter_map(|a| psl_scl::writer_index(node_id, 0, a)).collect();
            job.granted.push(Granted { worker, node_id, channel_public: [0; 32], writers });
        }
        Ok(())
    }

    /// How many coordinators the job has attached.
    pub fn coordinators(&self) -> usize {
        self.job.lock().as_ref().map(|j| j.coordinators.len()).unwrap_or(0)
    }

    /// Checks another party's evidence (a capsule host's) under the leader's policy.
    pub fn verify_evidence(
        &self,
        evidence: &Evidence,
        nonce: &[u8; 32],
        report_data: &[u8; 32],
    ) -> Result<VerifiedReport, AttestError> {
        self.verifier.verify(evidence, nonce, report_data)
    }

    /// A fresh nonce for `worker`'s next report.
    pub fn challenge(&self, worker: u32) -> [u8; 32] {
        let n: [u8; 32] = rand::random();
        self.nonces.lock().insert(worker, n);
        n
    }

    /// Verifies every offer; spreads `lambdas` slots over the workers that pass, and seals each
    /// its keys. Workers that fail get nothing and are listed with the reason.
    #[allow(clippy::type_complexity)]
    pub fn admit(
        &self,
        offers: Vec<Offer>,
        lambdas: u32,
        min_workers: usize,
    ) -> Result<(Vec<Grant>, Vec<(u32, String)>), FaasError> {
        let mut guard = self.job.lock();
        let job = guard.as_mut().ok_or_else(|| FaasError::Config("no job in progress".into()))?;
        let mut passed = Vec::new();
        let mut refused = Vec::new();
        for o in offers {
            let nonce = self.nonces.lock().remove(&o.worker);
            let Some(nonce) = nonce else {
                refused.push((o.worker, "no challenge was issued to this worker".to_string()));
                continue;
            };
            match self.verifier.verify(&o.evidence, &nonce, &bind_offer(&o.channel_public, o.tls_spki.as_ref())) {
                Ok(v) => {
                    tracing::info!("worker {} attested: {} measurement {}", o.worker, v.kind, v.measurement.short());
                    passed.push(o)
                }
                Err(e) => {
                    tracing::warn!("worker {} refused: {e}", o.worker);
                    refused.push((o.worker, e.to_string()));
                }
            }
        }
        let needed = min_workers.max(1).max((lambdas as usize).div_ceil(SLOTS_PER_WORKER_MAX));
        if passed.len() < needed {
            let why = refused.iter().map(|(w, e)| format!("worker {w}: {e}")).collect::<Vec<_>>().join("; ");
            return Err(FaasError::TooFewWorkers {
                needed,
                attested: passed.len(),
                refused: if why.is_empty() { "none refused".into() } else { why },
            });
        }
        let mut slots: Vec<Vec<u32>> = vec![Vec::new(); passed.len()];
        for l in 0..lambdas {
            slots[l as usize % passed.len()].push(l);
        }
        let data_key = job.app.data_key();
        let meta_bytes = job.meta.encode();
        let mut grants = Vec::new();
        for (i, (o, lambdas)) in passed.into_iter().zip(slots).enumerate() {
            if lambdas.is_empty() {
                continue;
            }
            let node_id = i as u32 + 1;
            let mut bundle = Zeroizing::new(Vec::with_capacity(64 + meta_bytes.len() + 36 * lambdas.len()));
            bundle.extend_from_slice(&job.job.0);
            bundle.extend_from_slice(&node_id.to_le_bytes());
            bundle.extend_from_slice(data_key.expose_bytes());
            bundle.extend_from_slice(&(job.servers as u16).to_le_bytes());
            bundle.extend_from_slice(&(lambdas.len() as u16).to_le_bytes());
            let mut certs = Vec::new();
            for a in 0..lambdas.len() as u32 {
                let w = psl_scl::writer_index(node_id, 0, a)
                    .ok_or_else(|| FaasError::Config(format!("writer index for node {node_id} actor {a}")))?;
                let (key, cert) = psl_capsule::writer_credentials(&job.meta, &job.app, w)
                    .map_err(|e| FaasError::Config(e.to_string()))?;
                bundle.extend_from_slice(&w.to_le_bytes());
                bundle.extend_from_slice(&key.expose_secret_bytes()[..]);
                certs.extend(cert);
            }
            bundle.extend_from_slice(&meta_bytes);
            // A certified capsule: each writer's certificate, in the writers' order.
            for c in &certs {
                bundle.extend_from_slice(&c.encode());
            }
            let aad = grant_aad(job.job, o.worker, &lambdas);
            let sealed_keys = seal_to(&o.channel_public, &aad, &bundle)?;
            let writers = (0..lambdas.len() as u32).filter_map(|a| psl_scl::writer_index(node_id, 0, a)).collect();
            job.granted.push(Granted { worker: o.worker, node_id, channel_public: o.channel_public, writers });
            grants.push(Grant { worker: o.worker, node_id, lambdas, sealed_keys });
        }
        Ok((grants, refused))
    }

    /// First half of a key rotation of the running job: derives the next generation (a new
    /// hardened application key, its data key, every writer's key) with a rotation epoch
    /// `margin_epochs` past the coordinator's current epoch, installs the certificate in the
    /// job's coordinator node (which from then on holds the epoch clock below the rotation
    /// epoch: it has no new key yet), and seals for each granted worker the certificate, the
    /// new data key and only its own writer keys, to the channel key its grant was sealed to.
    /// Deliver them, then call [`Leader::finish_rotation`].
    pub fn prepare_rotation(&self, margin_epochs: u64) -> Result<(RotationCert, Vec<RotationGrant>), FaasError> {
        let mut guard = self.job.lock();
        let job = guard.as_mut().ok_or_else(|| FaasError::Config("no job in progress".into()))?;
        if job.pending.is_some() {
            return Err(FaasError::Config("a key rotation is already in progress".into()));
        }
        if job.coordinators.is_empty() {
            return Err(FaasError::Config("the job has no coordinator".into()));
        }
        let key_gen = job.certs.len() as u32 + 1;
        let mut writers: Vec<u32> = job.granted.iter().flat_map(|g| g.writers.iter().copied()).collect();
        for c in &job.coordinators {
            writers.extend(job.meta.meta.policy.coordinator_at(c.rank));
        }
        let app_index = fresh_app_index(&job.app_indices);
        // One generation pending at a time: writers hold the next keys only until they switch.
        if let Some(last) = job.certs.last() {
            let (_, epoch) = lead_epoch(job)?;
            if epoch < last.from_epoch {
                return Err(FaasError::Config(format!(
                    "the previous key rotation takes effect at epoch {}, the job is at epoch {epoch}: try again then",
                    last.from_epoch
                )));
            }
        }
        // The leading coordinator (the lowest rank that answers) may open an epoch between
        // reading it and installing: it refuses then, and a later epoch is chosen.
        let mut tries = 0;
        let (lead, rot) = loop {
            let (lead, epoch) = lead_epoch(job)?;
            // At least 2: the RTS of the next epoch may already be out, under the old key.
            let from_epoch = rotation_epoch(epoch, margin_epochs.max(2));
            let rot = rotate(&job.owner, &job.meta, key_gen, app_index, from_epoch, &writers)?;
            let c = &job.coordinators[lead];
            let stage = RotationStage::Prepare { refuse_if_begun: true };
            let sealed =
                rotation_bundle(job.job, c.host, stage, &rot.cert, &rot.data_key(), None, &[], &c.channel_public)?;
            match c.link.rotate(key_gen, stage, &sealed) {
                Ok(()) => break (lead, rot),
                Err(e) if tries < 3 => {
                    tries += 1;
                    tracing::warn!("key rotation: {e}; choosing a later epoch");
                }
                Err(e) => return Err(e),
            }
        };
        // The other coordinators (passive shadows, or lost) learn it too, so that a shadow that
        // takes over holds below the rotation epoch until it has its key.
        for (i, c) in job.coordinators.iter().enumerate().filter(|(i, _)| *i != lead) {
            let stage = RotationStage::Prepare { refuse_if_begun: false };
            let r = rotation_bundle(job.job, c.host, stage, &rot.cert, &rot.data_key(), None, &[], &c.channel_public)
                .and_then(|sealed| c.link.rotate(key_gen, stage, &sealed));
            if let Err(e) = r {
                tracing::warn!(coordinator = i, rank = c.rank, "key rotation: the coordinator did not take it: {e}");
            }
        }
        let data_key = rot.data_key();
        let cert_bytes = rot.cert.encode();
        let mut out = Vec::new();
        for g in &job.granted {
            let mut bundle = Zeroizing::new(Vec::with_capacity(16 + 4 + cert_bytes.len() + 34 + 36 * g.writers.len()));
            bundle.extend_from_slice(&job.job.0);
            bundle.extend_from_slice(&g.node_id.to_le_bytes());
            bundle.extend_from_slice(&cert_bytes);
            bundle.extend_from_slice(data_key.expose_bytes());
            bundle.extend_from_slice(&(g.writers.len() as u16).to_le_bytes());
            for w in &g.writers {
                let key = rot.writer_key(*w).ok_or_else(|| FaasError::Config(format!("no key for writer {w}")))?;
                bundle.extend_from_slice(&w.to_le_bytes());
                bundle.extend_from_slice(&key.expose_secret_bytes()[..]);
            }
            // A certified capsule: each writer's new-generation certificate, in the same order.
            for w in &g.writers {
                if let Some(c) = rot.writer_cert(*w) {
                    bundle.extend_from_slice(&c.encode());
                }
            }
            let sealed_keys = seal_to(&g.channel_public, &rotation_aad(job.job, g.worker, key_gen), &bundle)?;
            out.push(RotationGrant { worker: g.worker, key_gen, sealed_keys });
        }
        let cert = rot.cert.clone();
        job.app_indices.push(app_index);
        job.pending = Some(rot);
        Ok((cert, out))
    }

    /// Second half of a key rotation: hands the coordinator its key under the new generation
    /// (it then writes the certificate into the log as a `Rotate` record and lets the epoch
    /// clock reach the rotation epoch), and replaces the retired application key with the new
    /// one (the retired one is erased). Call it once the workers have their keys, or have
    /// failed to take them in time (their records from the rotation epoch on are refused).
    pub fn finish_rotation(&self) -> Result<RotationCert, FaasError> {
        let mut guard = self.job.lock();
        let job = guard.as_mut().ok_or_else(|| FaasError::Config("no job in progress".into()))?;
        let rot = job.pending.take().ok_or_else(|| FaasError::Config("no key rotation in progress".into()))?;
        // Each coordinator gets its rank's key under the new generation. In a certified capsule
        // its own new certificate and every worker's go into the log (and its announcements)
        // before the rotation epoch, which it holds until now.
        let mut handed = 0;
        for c in &job.coordinators {
            let r = (|| -> Result<(), FaasError> {
                let w = job.meta.meta.policy.coordinator_at(c.rank).ok_or_else(|| {
                    FaasError::Config(format!("the capsule allows no coordinator of rank {}", c.rank))
                })?;
                let key = job
                    .meta
                    .meta
                    .policy
                    .writer_keys
                    .signing_key(rot.app(), w)
                    .map_err(|e| FaasError::Config(e.to_string()))?;
                let mut certs = rot.writer_certs();
                if job.meta.meta.policy.writer_keys == psl_capsule::WriterKeys::Certified {
                    let own = psl_capsule::WriterCert::sign(
                        rot.app(),
                        job.meta.name(),
                        rot.cert.key_gen,
                        w,
                        key.verifying_key(),
                        rot.cert.from_epoch,
                        psl_capsule::certs::OPEN_ENDED,
                    );
                    certs.push(psl_capsule::KeyStatement::Cert(own));
                }
                let sealed = rotation_bundle(
                    job.job,
                    c.host,
                    RotationStage::Finish,
                    &rot.cert,
                    &rot.data_key(),
                    Some(&key),
                    &certs,
                    &c.channel_public,
                )?;
                c.link.rotate(rot.cert.key_gen, RotationStage::Finish, &sealed)
            })();
            match r {
                Ok(()) => handed += 1,
                Err(e) => tracing::warn!(rank = c.rank, "key rotation: the coordinator did not take its key: {e}"),
            }
        }
        if handed == 0 {
            job.pending = Some(rot);
            return Err(FaasError::Config("key rotation: no coordinator took its new key".into()));
        }
        let cert = rot.cert.clone();
        job.certs.push(cert.clone());
        job.app = rot.into_app();
        tracing::info!(key_gen = cert.key_gen, from_epoch = cert.from_epoch, "leader: key rotation handed over");
        Ok(cert)
    }

    /// The rotation certificates of the running job (generations 1..).
    pub fn rotation_certs(&self) -> Vec<RotationCert> {
        self.job.lock().as_ref().map(|j| j.certs.clone()).unwrap_or_default()
    }

    /// Capsule server `id`'s ack-signing key for the current job (the application key's child
    /// `server_writer(id)`), for the host that stores the job's capsule.
    pub fn server_key(&self, id: u32) -> Result<psl_crypto::SigningKey, FaasError> {
        Ok(self.server_credentials(id)?.0)
    }

    /// Capsule server `id`'s key and, in a certified capsule, its certificate
    /// (`psl_server::ServerOptions::cert`).
    pub fn server_credentials(
        &self,
        id: u32,
    ) -> Result<(psl_crypto::SigningKey, Option<psl_capsule::WriterCert>), FaasError> {
        let guard = self.job.lock();
        let job = guard.as_ref().ok_or_else(|| FaasError::Config("no job in progress".into()))?;
        if !job.certs.is_empty() {
            // Server keys stay generation 0 (acks carry no generation); the job's application
            // key is a newer generation now.
            return Err(FaasError::Config("capsule servers are opened before any key rotation".into()));
        }
        psl_server::server_credentials(&job.meta, &job.app, id)
            .ok_or_else(|| FaasError::Config(format!("server id {id} out of range")))
    }

    /// Revokes every granted worker's writers ([`Leader::revoke_worker`]): what the end of a
    /// job does before it RESETs them. Errors are logged (the job ends anyway).
    pub fn revoke_all(&self) {
        let workers: Vec<u32> =
            self.job.lock().as_ref().map(|j| j.granted.iter().map(|g| g.worker).collect()).unwrap_or_default();
        for w in workers {
            if let Err(e) = self.revoke_worker(w) {
                tracing::warn!(worker = w, "revoking the worker's writers at its RESET: {e}");
            }
        }
    }

    /// RESET of a worker revokes its writers (a certified capsule): the application key signs a
    /// revocation of each under the generation in force (the newest the leader holds; older ones
    /// retire with their rotation), from two epochs past the coordinator's, with no seq bound
    /// (below); the coordinator announces them and carries them into the log. A worker lost to
    /// a side channel then writes nothing valid from that epoch on, and the others go on.
    /// Returns the revocation epoch (`None`: a derived capsule, or the worker held no grant).
    pub fn revoke_worker(&self, worker: u32) -> Result<Option<u64>, FaasError> {
        let guard = self.job.lock();
        let Some(job) = guard.as_ref() else { return Ok(None) };
        if job.meta.meta.policy.writer_keys != psl_capsule::WriterKeys::Certified {
            return Ok(None);
        }
        let Some(g) = job.granted.iter().find(|g| g.worker == worker) else { return Ok(None) };
        let from = lead_epoch(job)?.1 + 2;
        // The writers' keys of the generation in force (the leader keeps only the newest
        // application key; older generations are retired by the rotation itself).
        let newest = job.certs.len() as u32;
        let mut list = Vec::new();
        for w in &g.writers {
            // From the epoch only (no seq bound): until its RESET a worker still answers the
            // coordinator's RTS with EOE records after its last SYNC, and one of those may not
            // have reached the coordinator yet, so a seq bound taken from the coordinator's view
            // could refuse an honest record of the job (docs/security/threat-model.md §5 on what
            // an epoch-only revocation leaves open).
            let r = psl_capsule::Revocation::issue(&job.app, job.meta.name(), newest, *w, from, ANY_SEQ)
                .map_err(|e| FaasError::Config(e.to_string()))?;
            list.push(psl_capsule::KeyStatement::Revoke(r));
        }
        let encoded = crate::coordinator::encode_statements(&list)?;
        let mut told = 0;
        for c in &job.coordinators {
            match c.link.statements(&encoded) {
                Ok(()) => told += 1,
                Err(e) => tracing::warn!(rank = c.rank, "revocation: the coordinator did not take it: {e}"),
            }
        }
        if told == 0 {
            return Err(FaasError::Config("revocation: no coordinator took it".into()));
        }
        tracing::info!(worker, from_epoch = from, writers = g.writers.len(), "leader: worker's writers revoked");
        Ok(Some(from))
    }

    /// The running job's capsule metadata, if a job is running.
    pub fn meta(&self) -> Option<SignedMetadata> {
        self.job.lock().as_ref().map(|j| j.meta.clone())
    }

    /// Ends the job: stops every coordinator (returning what each did) and erases the owner
    /// and application keys.
    pub fn end_job(&self) -> Vec<CoordinatorStats> {
        let job = self.job.lock().take();
        let mut out = Vec::new();
        if let Some(j) = job {
            for c in &j.coordinators {
                match c.link.close() {
                    Ok(s) => out.push(s),
                    Err(e) => {
                        tracing::warn!(rank = c.rank, host = c.host, "closing the coordinator: {e}");
                        out.push(CoordinatorStats { host: c.host, rank: c.rank, ..CoordinatorStats::default() });
                    }
                }
            }
        }
        self.nonces.lock().clear();
        self.coordinator_nonces.lock().clear();
        out
    }

    /// Whether the leader holds a job's keys (a job is running).
    pub fn holds_keys(&self) -> bool {
        self.job.lock().is_some()
    }
}

/// The leading coordinator (the lowest rank whose link answers) and its epoch.
fn lead_epoch(job: &LeaderJob) -> Result<(usize, u64), FaasError> {
    let mut why = Vec::new();
    for (i, c) in job.coordinators.iter().enumerate() {
        match c.link.epoch() {
            Ok(e) => return Ok((i, e)),
            Err(e) => why.push(format!("rank {}: {e}", c.rank)),
        }
    }
    Err(FaasError::Config(format!("no coordinator of the job answers ({})", why.join("; "))))
}
