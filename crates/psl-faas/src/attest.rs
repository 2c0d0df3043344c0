//! Attestation: a party proves which code it runs (its *measurement*) and binds a channel key
//! to that proof; a verifier checks the proof against a policy before trusting the key.
//!
//! [`Attester`] and [`AttestVerifier`] are the seams for hardware backends (SGX/TDX DCAP quotes,
//! SEV-SNP reports). Verifiers: `dcap` (real SGX/TDX quotes, [`crate::attest_dcap`]) and `sim`:
//!
//! **THE SIM BACKEND IS INSECURE AND FOR DEVELOPMENT ONLY.** Its "platform key" is an ordinary
//! key held by the same process; anyone who has it can forge any report. It exercises the
//! protocol (measurement policy, nonce freshness, channel-key binding), not the hardware trust.
//!
//! Sim report (168 bytes): `"PSLSIMR1" ‖ measurement (32) ‖ report data (32) ‖ nonce (32) ‖
//! ECDSA secp256k1 signature (64)` over `SHA-256("psl/sim-report/v1" ‖ the first 104 bytes)`.

use psl_crypto::{sha256, Hash256, Signature, SigningKey, VerifyingKey};
use std::collections::BTreeSet;
use std::sync::{Arc, OnceLock};

/// SHA-256 of the code and its runtime configuration.
pub type Measurement = Hash256;

/// A report, as bytes, plus the backend that made it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Evidence {
    pub backend: &'static str,
    pub bytes: Vec<u8>,
}

/// What a verifier establishes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifiedReport {
    pub measurement: Measurement,
    pub report_data: [u8; 32],
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttestError {
    #[error("evidence is malformed: {0}")]
    Malformed(String),
    #[error("evidence is from backend '{got}', the verifier accepts '{want}'")]
    Backend { got: &'static str, want: &'static str },
    #[error("the report's signature does not verify under the platform key")]
    Signature,
    #[error("measurement {0} is not in the policy")]
    Measurement(String),
    #[error("the report's nonce is not the one issued (stale or replayed report)")]
    Nonce,
    #[error("the report does not bind the channel key offered with it")]
    ReportData,
    #[error("quote signature chain or collateral refused: {0}")]
    Collateral(String),
    #[error("platform TCB status {status} is not accepted by the policy (advisories: {advisories})")]
    TcbStatus { status: String, advisories: String },
}

/// The party being attested.
pub trait Attester: Send + Sync {
    fn backend(&self) -> &'static str;
    fn measurement(&self) -> Measurement;
    /// A report over `nonce` (the verifier's freshness challenge) and `report_data` (the hash of
    /// the channel key the keys should go to).
    fn attest(&self, nonce: &[u8; 32], report_data: &[u8; 32]) -> Result<Evidence, AttestError>;
}

/// Which measurements a verifier accepts.
#[derive(Clone, Debug, Default)]
pub struct AttestPolicy {
    pub allowed: BTreeSet<Measurement>,
}

/// The verifying side.
pub trait AttestVerifier: Send + Sync {
    fn backend(&self) -> &'static str;
    /// Checks the evidence's signature, that its nonce is `nonce`, its report data is
    /// `report_data`, and its measurement is in `policy`.
    fn verify(
        &self,
        evidence: &Evidence,
        nonce: &[u8; 32],
        report_data: &[u8; 32],
        policy: &AttestPolicy,
    ) -> Result<VerifiedReport, AttestError>;
}

/// The report data that binds a channel public key.
pub fn bind_channel_key(channel_public: &[u8]) -> [u8; 32] {
    sha256(&[b"psl/report-data/v1", channel_public]).0
}

/// The report data of a worker's offer: its key-delivery channel key and, over the network, the
/// hash of its TLS certificate's public key (see [`crate::tls`]).
pub fn bind_offer(channel_public: &[u8; 32], tls_spki: Option<&[u8; 32]>) -> [u8; 32] {
    match tls_spki {
        None => bind_channel_key(channel_public),
        Some(t) => bind_channel_key(&[&channel_public[..], &t[..]].concat()),
    }
}

/// SHA-256 of the running binary (`std::env::current_exe`), read once per process.
pub fn binary_hash() -> Hash256 {
    static H: OnceLock<Hash256> = OnceLock::new();
    *H.get_or_init(|| match std::env::current_exe().and_then(std::fs::read) {
        Ok(bytes) => sha256(&[b"psl/binary/v1", &bytes]),
        Err(e) => {
            tracing::warn!("cannot read the running binary to measure it ({e}); measuring its absence");
            sha256(&[b"psl/binary/v1/unreadable"])
        }
    })
}

/// The measurement of this binary running with `runtime_config` (a canonical description of
/// every setting that changes what the code does: sandbox limits, versions).
pub fn measure(binary: &Hash256, runtime_config: &[u8]) -> Measurement {
    sha256(&[b"psl/measurement/v1", &binary.0, runtime_config])
}

const SIM_MAGIC: &[u8; 8] = b"PSLSIMR1";
const SIM_BODY: usize = 8 + 32 + 32 + 32;
const SIM_LEN: usize = SIM_BODY + 64;
pub const SIM_BACKEND: &str = "sim-INSECURE";

/// The simulated platform (INSECURE): a signing key standing in for the hardware's.
pub struct SimPlatform {
    key: SigningKey,
}

impl SimPlatform {
    pub fn new() -> Arc<SimPlatform> {
        tracing::warn!("attestation backend 'sim' in use: INSECURE, reports can be forged by anyone holding the simulated platform key; never use in production");
        loop {
            let seed: [u8; 32] = rand::random();
            if let Ok(key) = SigningKey::from_bytes(&seed) {
                return Arc::new(SimPlatform { key });
            }
        }
    }

    /// The simulated platform from a 32-byte secret shared by the processes of one deployment
    /// (`psl up` writes it to a file only they read). INSECURE like everything in this backend.
    pub fn from_secret(secret: &[u8; 32]) -> Result<Arc<SimPlatform>, AttestError> {
        tracing::warn!("attestation backend 'sim' in use: INSECURE, reports can be forged by anyone holding the simulated platform key; never use in production");
        let key = SigningKey::from_bytes(secret)
            .map_err(|_| AttestError::Malformed("the sim platform secret is not a valid key".into()))?;
        Ok(Arc::new(SimPlatform { key }))
    }

    pub fn public(&self) -> VerifyingKey {
        self.key.verifying_key()
    }
}

/// A party on the simulated platform with a given measurement.
pub struct SimAttester {
    platform: Arc<SimPlatform>,
    measurement: Measurement,
}

impl SimAttester {
    pub fn new(platform: Arc<SimPlatform>, measurement: Measurement) -> SimAttester {
        SimAttester { platform, measurement }
    }
}

impl Attester for SimAttester {
    fn backend(&self) -> &'static str {
        SIM_BACKEND
    }
    fn measurement(&self) -> Measurement {
        self.measurement
    }
    fn attest(&self, nonce: &[u8; 32], report_data: &[u8; 32]) -> Result<Evidence, AttestError> {
        let mut b = Vec::with_capacity(SIM_LEN);
        b.extend_from_slice(SIM_MAGIC);
        b.extend_from_slice(&self.measurement.0);
        b.extend_from_slice(report_data);
        b.extend_from_slice(nonce);
        let sig = self.platform.key.sign(&sha256(&[b"psl/sim-report/v1", &b]));
        b.extend_from_slice(&sig.0);
        Ok(Evidence { backend: SIM_BACKEND, bytes: b })
    }
}

/// Verifies sim reports against the simulated platform's public key (INSECURE backend).
pub struct SimVerifier {
    platform: VerifyingKey,
}

impl SimVerifier {
    pub fn new(platform: VerifyingKey) -> SimVerifier {
        SimVerifier { platform }
    }
}

impl AttestVerifier for SimVerifier {
    fn backend(&self) -> &'static str {
        SIM_BACKEND
    }
    fn verify(
        &self,
        evidence: &Evidence,
        nonce: &[u8; 32],
        report_data: &[u8; 32],
        policy: &AttestPolicy,
    ) -> Result<VerifiedReport, AttestError> {
        if evidence.backend != SIM_BACKEND {
            return Err(AttestError::Backend { got: evidence.backend, want: SIM_BACKEND });
        }
        let b = &evidence.bytes;
        if b.len() != SIM_LEN {
            return Err(AttestError::Malformed(format!("{} bytes, a sim report is {SIM_LEN}", b.len())));
        }
        if &b[..8] != SIM_MAGIC {
            return Err(AttestError::Malformed("bad magic".into()));
        }
        let sig = Signature(b[SIM_BODY..].try_into().expect("64 bytes"));
        self.platform
            .verify(&sha256(&[b"psl/sim-report/v1", &b[..SIM_BODY]]), &sig)
            .map_err(|_| AttestError::Signature)?;
        let measurement = Hash256(b[8..40].try_into().expect("32"));
        let data: [u8; 32] = b[40..72].try_into().expect("32");
        if &b[72..104] != nonce {
            return Err(AttestError::Nonce);
        }
        if &data != report_data {
            return Err(AttestError::ReportData);
        }
        if !policy.allowed.contains(&measurement) {
            return Err(AttestError::Measurement(measurement.short()));
        }
        Ok(VerifiedReport { measurement, report_data: data })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sim_report_checks() {
        let p = SimPlatform::new();
        let m = measure(&binary_hash(), b"cfg");
        let a = SimAttester::new(p.clone(), m);
        let v = SimVerifier::new(p.public());
        let policy = AttestPolicy { allowed: [m].into() };
        let (n, d) = ([1u8; 32], [2u8; 32]);
        let ev = a.attest(&n, &d).unwrap();
        assert!(v.verify(&ev, &n, &d, &policy).is_ok());
        assert_eq!(v.verify(&ev, &[9; 32], &d, &policy), Err(AttestError::Nonce));
        assert_eq!(v.verify(&ev, &n, &[9; 32], &policy), Err(AttestError::ReportData));
        assert!(matches!(v.verify(&ev, &n, &d, &AttestPolicy::default()), Err(AttestError::Measurement(_))));
        for i in 0..ev.bytes.len() {
            let mut t = ev.clone();
            t.bytes[i] ^= 1;
            assert!(v.verify(&t, &n, &d, &policy).is_err(), "byte {i}");
        }
        let other = SimVerifier::new(SimPlatform::new().public());
        assert_eq!(other.verify(&ev, &n, &d, &policy), Err(AttestError::Signature));
    }
}
