//! What the leader and the parties it admits exchange: a party's attested bid ([`Offer`]), what
//! an admitted worker receives ([`Grant`], and [`RotationGrant`] when the job's application key
//! rotates), the associated data their sealed bundles are bound to, the bounds of one job, and
//! the capsule metadata every key bundle carries (`job_metadata`). The leader, the workers
//! and the coordinator hosts all use it, so it sits below them.

use crate::attest::{bind_offer, Attester, Evidence};
use crate::channel::ChannelKey;
use crate::error::FaasError;
use crate::program::JobId;
use psl_capsule::SignedMetadata;
use psl_crypto::DataKey;

/// A worker's bid for a job: its report, binding its channel key.
pub struct Offer {
    /// The worker's id.
    pub worker: u32,
    /// The worker's X25519 channel public key: the keys are sealed to it, the report binds it.
    pub channel_public: [u8; 32],
    /// The worker's report over the leader's nonce.
    pub evidence: Evidence,
    /// Over TLS: the hash of the public key of the certificate the worker presented on the
    /// connection the offer came in on (filled in by the leader from the session, never taken
    /// from the worker's message). The report must bind it.
    pub tls_spki: Option<[u8; 32]>,
}

impl Offer {
    /// A party's offer under the verifier's `nonce`: a fresh channel key, and `attester`'s report
    /// binding it (and, over TLS, `tls_spki`, the hash of the party's certificate key). `who`
    /// names the party in an error. Returns the channel key to keep with the offer.
    pub fn make(
        attester: &dyn Attester,
        id: u32,
        who: &str,
        nonce: &[u8; 32],
        tls_spki: Option<[u8; 32]>,
    ) -> Result<(ChannelKey, Offer), FaasError> {
        let channel = ChannelKey::generate()?;
        let evidence = attester
            .attest(nonce, &bind_offer(&channel.public(), tls_spki.as_ref()))
            .map_err(|e| FaasError::Attestation { who: who.to_string(), why: e.to_string() })?;
        let channel_public = channel.public();
        Ok((channel, Offer { worker: id, channel_public, evidence, tls_spki }))
    }
}

/// What the leader sends one admitted worker.
pub struct Grant {
    /// The worker's id.
    pub worker: u32,
    /// The worker's node id in the job (nonzero; its writers are derived from it).
    pub node_id: u32,
    /// The lambda slots (indices in the job) the worker runs.
    pub lambdas: Vec<u32>,
    /// The key bundle sealed to the worker's channel key.
    pub sealed_keys: Vec<u8>,
}

/// What the leader sends one granted worker when it rotates the job's application key.
pub struct RotationGrant {
    /// The worker's id.
    pub worker: u32,
    /// The key generation the bundle moves the worker to.
    pub key_gen: u32,
    /// The rotation bundle sealed to the worker's channel key.
    pub sealed_keys: Vec<u8>,
}

/// Most lambda slots one worker runs (one writer actor each; a node has at most 16).
pub const SLOTS_PER_WORKER_MAX: usize = 16;

/// Most capsule servers one job may have (a grant carries the count as a u16; acks need a
/// server writer index each).
pub const JOB_SERVERS_MAX: u32 = 255;

/// Associated data of a rotation bundle: the job, the worker and the key generation.
pub fn rotation_aad(job: JobId, worker: u32, key_gen: u32) -> Vec<u8> {
    let mut a = b"psl/rotate/v1".to_vec();
    a.extend_from_slice(&job.0);
    a.extend_from_slice(&worker.to_le_bytes());
    a.extend_from_slice(&key_gen.to_le_bytes());
    a
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

/// A key bundle's capsule metadata, at the start of `rest`: decoded, checked against the job's
/// data key, and returned with the bytes after it (the worker's and the coordinator's bundles
/// both carry it).
pub(crate) fn job_metadata<'a>(
    rest: &'a [u8],
    data_key: &DataKey,
    bad: impl Fn(&str) -> FaasError,
) -> Result<(SignedMetadata, &'a [u8]), FaasError> {
    let mlen = SignedMetadata::encoded_len(rest).map_err(|e| FaasError::Capsule(e.to_string()))?;
    if rest.len() < mlen {
        return Err(bad("metadata cut short"));
    }
    let meta = SignedMetadata::decode(&rest[..mlen]).map_err(|e| FaasError::Capsule(e.to_string()))?;
    if meta.meta.policy.data_key_fp != data_key.fingerprint() {
        return Err(bad("data key does not match the capsule"));
    }
    Ok((meta, &rest[mlen..]))
}
