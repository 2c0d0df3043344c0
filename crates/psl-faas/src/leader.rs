//! The leader (trusted): holds the owner key for a job, derives the application key and one
//! writer key per lambda slot, attests each worker before handing it exactly its own keys, runs
//! the job's coordinator, and forgets everything at the end of the job.

use crate::attest::{bind_offer, AttestPolicy, AttestVerifier, Attester, Evidence};
use crate::channel::seal_to;
use crate::error::FaasError;
use crate::program::JobId;
use parking_lot::Mutex;
use psl_capsule::SignedMetadata;
use psl_crypto::{AppKey, OwnerKey};
use psl_fabric::Fabric;
use psl_node::{Node, NodeKeys, NodeOptions};
use psl_scl::CoordinatorConfig;
use std::collections::HashMap;
use std::sync::Arc;
use zeroize::Zeroizing;

/// A worker's bid for a job: its report, binding its channel key.
pub struct Offer {
    pub worker: u32,
    pub channel_public: [u8; 32],
    pub evidence: Evidence,
    /// Over TLS: the hash of the public key of the certificate the worker presented on the
    /// connection the offer came in on (filled in by the leader from the session, never taken
    /// from the worker's message). The report must bind it.
    pub tls_spki: Option<[u8; 32]>,
}

/// What the leader sends one admitted worker.
pub struct Grant {
    pub worker: u32,
    pub node_id: u32,
    pub lambdas: Vec<u32>,
    /// The key bundle sealed to the worker's channel key.
    pub sealed_keys: Vec<u8>,
}

struct LeaderJob {
    job: JobId,
    _owner: OwnerKey,
    app: AppKey,
    meta: SignedMetadata,
    coordinator: Option<Node>,
}

pub struct Leader {
    attester: Box<dyn Attester>,
    verifier: Box<dyn AttestVerifier>,
    policy: AttestPolicy,
    nonces: Mutex<HashMap<u32, [u8; 32]>>,
    job: Mutex<Option<LeaderJob>>,
    pub coordinator: CoordinatorConfig,
}

/// Most lambda slots one worker runs (one writer actor each; a node has at most 16).
pub const SLOTS_PER_WORKER_MAX: usize = 16;

impl Leader {
    pub fn new(attester: Box<dyn Attester>, verifier: Box<dyn AttestVerifier>, policy: AttestPolicy) -> Leader {
        Leader {
            attester,
            verifier,
            policy,
            nonces: Mutex::new(HashMap::new()),
            job: Mutex::new(None),
            coordinator: CoordinatorConfig { epoch_ms: 20, eoe_timeout_ms: 200, ..CoordinatorConfig::default() },
        }
    }

    /// The leader's own report, for the client to check before it hands over the owner key.
    pub fn attest(&self, nonce: &[u8; 32], report_data: &[u8; 32]) -> Result<Evidence, FaasError> {
        self.attester
            .attest(nonce, report_data)
            .map_err(|e| FaasError::Attestation { who: "leader".into(), why: e.to_string() })
    }

    /// Takes the owner key for one job (in process, the move stands for the attested channel),
    /// derives the application key, and starts the job's coordinator on the fabric endpoint `ep`.
    pub fn begin_job(
        &self,
        job: JobId,
        owner: OwnerKey,
        meta: SignedMetadata,
        ep: Arc<dyn Fabric>,
    ) -> Result<(), FaasError> {
        let app = owner.app(meta.meta.app_index).map_err(|e| FaasError::Config(e.to_string()))?;
        if app.public() != meta.meta.app {
            return Err(FaasError::Config("the capsule was not made for this owner key's application".into()));
        }
        let opts = NodeOptions {
            node_id: 0x7000,
            writers: 0,
            verifiers: 1,
            coordinator: Some(self.coordinator),
            ..NodeOptions::default()
        };
        if self.job.lock().is_some() {
            return Err(FaasError::Config("the leader is already running a job".into()));
        }
        let keys = NodeKeys::derive(&meta, &app, &opts)?;
        let coordinator = Node::start(keys, ep, opts)?;
        *self.job.lock() = Some(LeaderJob { job, _owner: owner, app, meta, coordinator: Some(coordinator) });
        Ok(())
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
        let guard = self.job.lock();
        let job = guard.as_ref().ok_or_else(|| FaasError::Config("no job in progress".into()))?;
        let mut passed = Vec::new();
        let mut refused = Vec::new();
        for o in offers {
            let nonce = self.nonces.lock().remove(&o.worker);
            let Some(nonce) = nonce else {
                refused.push((o.worker, "no challenge was issued to this worker".to_string()));
                continue;
            };
            match self.verifier.verify(
                &o.evidence,
                &nonce,
                &bind_offer(&o.channel_public, o.tls_spki.as_ref()),
                &self.policy,
            ) {
                Ok(_) => passed.push(o),
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
            bundle.extend_from_slice(&(lambdas.len() as u16).to_le_bytes());
            for a in 0..lambdas.len() as u32 {
                let w = psl_scl::writer_index(node_id, 0, a)
                    .ok_or_else(|| FaasError::Config(format!("writer index for node {node_id} actor {a}")))?;
                let key = job.app.writer(w).map_err(|e| FaasError::Config(e.to_string()))?;
                bundle.extend_from_slice(&w.to_le_bytes());
                bundle.extend_from_slice(&key.expose_secret_bytes()[..]);
            }
            bundle.extend_from_slice(&meta_bytes);
            let aad = grant_aad(job.job, o.worker, &lambdas);
            let sealed_keys = seal_to(&o.channel_public, &aad, &bundle)?;
            grants.push(Grant { worker: o.worker, node_id, lambdas, sealed_keys });
        }
        Ok((grants, refused))
    }

    /// Capsule server `id`'s ack-signing key for the current job (the application key's child
    /// `server_writer(id)`), for the host that stores the job's capsule.
    pub fn server_key(&self, id: u32) -> Result<psl_crypto::SigningKey, FaasError> {
        let guard = self.job.lock();
        let job = guard.as_ref().ok_or_else(|| FaasError::Config("no job in progress".into()))?;
        let w = psl_scl::server_writer(id).ok_or_else(|| FaasError::Config(format!("server id {id} out of range")))?;
        job.app.writer(w).map_err(|e| FaasError::Config(e.to_string()))
    }

    pub fn meta(&self) -> Option<SignedMetadata> {
        self.job.lock().as_ref().map(|j| j.meta.clone())
    }

    /// Ends the job: stops the coordinator and erases the owner and application keys.
    pub fn end_job(&self) {
        let job = self.job.lock().take();
        if let Some(mut j) = job {
            if let Some(c) = j.coordinator.take() {
                c.shutdown();
            }
        }
        self.nonces.lock().clear();
    }

    pub fn holds_keys(&self) -> bool {
        self.job.lock().is_some()
    }
}

/// Associated data of a key bundle: the job, the worker and its lambda slots.
pub fn grant_aad(job: JobId, worker: u32, lambdas: &[u32]) -> Vec<u8> {
    let mut a = b"psl/grant/v1".to_vec();
    a.extend_from_slice(&job.0);
    a.extend_from_slice(&worker.to_le_bytes());
    for l in lambdas {
        a.extend_from_slice(&l.to_le_bytes());
    }
    a
}
