//! The `dcap` attestation verifier: Intel SGX and TDX quotes (DCAP, ECDSA attestation).
//!
//! The quote's signature chain (PCK certificate chain to Intel's root CA, QE report, attestation
//! key, quote signature) and its collateral (TCB info, QE identity, CRLs, each signed and each
//! with an issue date and a next-update date) are checked by the `dcap-qvl` crate at a given
//! verification time. On top of that this module applies PSL's policy:
//!
//! - **TCB status**: which platform TCB statuses are accepted is configurable
//!   ([`DcapPolicy::accepted`]); the default accepts `UpToDate`, `SWHardeningNeeded`,
//!   `ConfigurationNeeded` and `ConfigurationAndSWHardeningNeeded`, and refuses every
//!   out-of-date, revoked or relaunch-advised status.
//! - **Measurement**: the quote's measurement registers are reduced to a [`Measurement`] digest
//!   ([`sgx_mrenclave`], [`sgx_mrsigner`], [`tdx_measurement`]) that must be in the
//!   [`AttestPolicy`]'s allowed set (SGX: the enclave's MRENCLAVE, or its MRSIGNER with its
//!   ISV product id; TDX: MRTD with RTMR0..3).
//! - **Report data**: the 64-byte report data must be `report_data (32) ‖ nonce (32)`, where
//!   `report_data` commits to the channel key ([`crate::attest::bind_channel_key`]) and `nonce` is
//!   the verifier's freshness challenge.
//!
//! - **Canonical quote**: the quote must be exactly one encoding, followed by zero padding only; its PCK
//!   certificate chain must be canonical PEM (64-column lines, LF) ending in the trusted root
//!   CA itself. `dcap-qvl` checks each certificate's signature and chains to the trusted root it
//!   is given, but ignores the copy of the root inside the quote and trailing bytes; without
//!   this check those bytes could change without the quote being refused.
//!
//! Evidence bytes are the raw quote. Collateral comes from a [`CollateralSource`] (a PCCS
//! cache in a deployment; recorded collateral in tests). There is no `dcap` attester here: PSL's
//! machines have no TEE hardware; the verifier is tested against recorded quotes.

use crate::attest::{AttestError, AttestPolicy, AttestVerifier, Evidence, Measurement, VerifiedReport};
use dcap_qvl::quote::{Quote, Report};
use dcap_qvl::verify::QuoteVerifier;
use dcap_qvl::TcbStatus;
use psl_crypto::sha256;
use std::sync::Arc;

pub use dcap_qvl::QuoteCollateralV3 as Collateral;

pub const DCAP_BACKEND: &str = "dcap";
/// Intel SGX Root CA (DER; CN=Intel SGX Root CA, valid 2018-05-21 to 2049-12-31, SHA-256
/// fingerprint 44a0196b2b99f889b8e149e95b807a350e7424964399e885a7cbb8ccfab674d3), the trust
/// anchor of every SGX and TDX DCAP quote. Same bytes as the one `dcap-qvl` embeds.
pub const INTEL_SGX_ROOT_CA_DER: &[u8] = include_bytes!("intel_sgx_root_ca.der");
/// Largest quote accepted (a quote with its certification data is a few KiB).
pub const QUOTE_BYTES_MAX: usize = 64 * 1024;

/// Where the verifier gets the collateral of a quote.
pub trait CollateralSource: Send + Sync {
    fn collateral(&self, quote: &[u8]) -> Result<Collateral, AttestError>;
}

/// One fixed collateral set (recorded, or fetched once for one platform).
pub struct StaticCollateral(pub Collateral);

impl StaticCollateral {
    /// From the JSON form PCCS clients and `dcap-qvl` write.
    pub fn from_json(bytes: &[u8]) -> Result<StaticCollateral, AttestError> {
        serde_json::from_slice(bytes)
            .map(StaticCollateral)
            .map_err(|e| AttestError::Collateral(format!("collateral JSON: {e}")))
    }
}

impl CollateralSource for StaticCollateral {
    fn collateral(&self, _quote: &[u8]) -> Result<Collateral, AttestError> {
        Ok(self.0.clone())
    }
}

/// The time quotes and collateral are checked at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VerifyTime {
    /// The system clock.
    Now,
    /// A fixed Unix time in seconds (tests, and replaying a verification).
    At(u64),
}

impl VerifyTime {
    fn unix_secs(self) -> u64 {
        match self {
            VerifyTime::At(t) => t,
            VerifyTime::Now => {
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
            }
        }
    }
}

/// The `dcap` backend's own policy (the measurements are in the [`AttestPolicy`]).
#[derive(Clone, Debug)]
pub struct DcapPolicy {
    /// Platform TCB statuses accepted.
    pub accepted: Vec<TcbStatus>,
    /// Accept debug enclaves / TDs (never in production).
    pub allow_debug: bool,
    pub time: VerifyTime,
}

impl Default for DcapPolicy {
    fn default() -> Self {
        DcapPolicy {
            accepted: vec![
                TcbStatus::UpToDate,
                TcbStatus::SWHardeningNeeded,
                TcbStatus::ConfigurationNeeded,
                TcbStatus::ConfigurationAndSWHardeningNeeded,
            ],
            allow_debug: false,
            time: VerifyTime::Now,
        }
    }
}

impl DcapPolicy {
    /// Only `UpToDate` platforms.
    pub fn strict(time: VerifyTime) -> DcapPolicy {
        DcapPolicy { accepted: vec![TcbStatus::UpToDate], allow_debug: false, time }
    }
}

/// What a DCAP verification established, beyond the trait's [`VerifiedReport`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DcapReport {
    pub tee: &'static str,
    pub tcb_status: String,
    pub advisory_ids: Vec<String>,
    pub measurement: Measurement,
    pub report_data: [u8; 64],
}

/// Verifies SGX and TDX DCAP quotes against Intel's production root CA.
pub struct DcapVerifier {
    policy: DcapPolicy,
    collateral: Arc<dyn CollateralSource>,
    root_ca_der: Vec<u8>,
}

/// SGX measurement digest of an enclave identity (MRENCLAVE).
pub fn sgx_mrenclave(mr_enclave: &[u8; 32]) -> Measurement {
    sha256(&[b"psl/dcap/sgx-mrenclave/v1", mr_enclave])
}

/// SGX measurement digest of a signer identity (MRSIGNER and the ISV product id).
pub fn sgx_mrsigner(mr_signer: &[u8; 32], isv_prod_id: u16) -> Measurement {
    sha256(&[b"psl/dcap/sgx-mrsigner/v1", mr_signer, &isv_prod_id.to_le_bytes()])
}

/// TDX measurement digest: MRTD (the TD's initial contents) and the run-time registers
/// RTMR0..3 (firmware, kernel, command line, application).
pub fn tdx_measurement(mr_td: &[u8; 48], rtmr: [&[u8; 48]; 4]) -> Measurement {
    sha256(&[b"psl/dcap/tdx/v1", mr_td, rtmr[0], rtmr[1], rtmr[2], rtmr[3]])
}

/// The measurement digests a report offers (the first is the most specific) and its report data.
fn report_identity(report: &Report) -> (&'static str, Vec<Measurement>, [u8; 64]) {
    match report {
        Report::SgxEnclave(r) => {
            ("sgx", vec![sgx_mrenclave(&r.mr_enclave), sgx_mrsigner(&r.mr_signer, r.isv_prod_id)], r.report_data)
        }
        Report::TD10(r) => {
            ("tdx", vec![tdx_measurement(&r.mr_td, [&r.rt_mr0, &r.rt_mr1, &r.rt_mr2, &r.rt_mr3])], r.report_data)
        }
        Report::TD15(r) => {
            let b = &r.base;
            ("tdx", vec![tdx_measurement(&b.mr_td, [&b.rt_mr0, &b.rt_mr1, &b.rt_mr2, &b.rt_mr3])], b.report_data)
        }
        Report::TD15Ex(r) => {
            let b = &r.base.base;
            ("tdx", vec![tdx_measurement(&b.mr_td, [&b.rt_mr0, &b.rt_mr1, &b.rt_mr2, &b.rt_mr3])], b.report_data)
        }
    }
}

/// Parses a quote without verifying it (to read its measurements, e.g. to write a policy).
pub fn inspect(quote: &[u8]) -> Result<(&'static str, Vec<Measurement>, [u8; 64]), AttestError> {
    if quote.len() > QUOTE_BYTES_MAX {
        return Err(AttestError::Malformed(format!("quote of {} bytes, over {QUOTE_BYTES_MAX}", quote.len())));
    }
    let q = Quote::parse(quote).map_err(|e| AttestError::Malformed(format!("quote: {e}")))?;
    Ok(report_identity(&q.report))
}

impl DcapVerifier {
    pub fn new(policy: DcapPolicy, collateral: Arc<dyn CollateralSource>) -> DcapVerifier {
        DcapVerifier { policy, collateral, root_ca_der: INTEL_SGX_ROOT_CA_DER.to_vec() }
    }

    /// Trusts another root CA than Intel's production one (tests with a private PKI).
    pub fn with_root_ca(mut self, der: Vec<u8>) -> DcapVerifier {
        self.root_ca_der = der;
        self
    }

    pub fn policy(&self) -> &DcapPolicy {
        &self.policy
    }

    /// Verifies a quote: signature chain and collateral at the policy's time, TCB status,
    /// debug mode, and that one of its measurement digests is in `allowed`. Does not check the
    /// report data (see [`AttestVerifier::verify`]).
    pub fn verify_quote(&self, quote: &[u8], allowed: &AttestPolicy) -> Result<DcapReport, AttestError> {
        if quote.len() > QUOTE_BYTES_MAX {
            return Err(AttestError::Malformed(format!("quote of {} bytes, over {QUOTE_BYTES_MAX}", quote.len())));
        }
        check_canonical(quote, &self.root_ca_der)?;
        let collateral = self.collateral.collateral(quote)?;
        let now = self.policy.time.unix_secs();
        let verifier = QuoteVerifier::new(self.root_ca_der.clone()).allow_debug(self.policy.allow_debug);
        let v = verifier
            .verify(quote, &collateral, now)
            .map_err(|e| AttestError::Collateral(format!("quote or collateral refused at unix time {now}: {e:#}")))?;
        if !self.policy.accepted.iter().any(|s| s.to_string() == v.status) {
            return Err(AttestError::TcbStatus { status: v.status, advisories: v.advisory_ids.join(",") });
        }
        let (tee, digests, report_data) = report_identity(&v.report);
        let Some(measurement) = digests.iter().find(|d| allowed.allowed.contains(d)).copied() else {
            return Err(AttestError::Measurement(digests[0].short()));
        };
        Ok(DcapReport { tee, tcb_status: v.status, advisory_ids: v.advisory_ids, measurement, report_data })
    }
}

impl AttestVerifier for DcapVerifier {
    fn backend(&self) -> &'static str {
        DCAP_BACKEND
    }

    fn verify(
        &self,
        evidence: &Evidence,
        nonce: &[u8; 32],
        report_data: &[u8; 32],
        policy: &AttestPolicy,
    ) -> Result<VerifiedReport, AttestError> {
        if evidence.backend != DCAP_BACKEND {
            return Err(AttestError::Backend { got: evidence.backend, want: DCAP_BACKEND });
        }
        let r = self.verify_quote(&evidence.bytes, policy)?;
        if r.report_data[..32] != report_data[..] {
            return Err(AttestError::ReportData);
        }
        if r.report_data[32..] != nonce[..] {
            return Err(AttestError::Nonce);
        }
        tracing::debug!(tee = r.tee, tcb = %r.tcb_status, measurement = %r.measurement.short(), "dcap quote verified");
        Ok(VerifiedReport { measurement: r.measurement, report_data: *report_data })
    }
}

/// The quote is its own re-encoding followed by zero bytes only, with a canonical PEM certificate chain (cert
/// type 5) of at least two certificates whose last is `root_der`, NUL padding only at its end.
fn check_canonical(quote: &[u8], root_der: &[u8]) -> Result<(), AttestError> {
    use scale::{Decode, Encode};
    let mut rest = quote;
    let q = Quote::decode(&mut rest).map_err(|e| AttestError::Malformed(format!("quote: {e}")))?;
    // Every length field (the signature data's, the certification data's, nested inside it)
    // must be exact: the quote is its own re-encoding, followed by zero padding only (quote
    // buffers from some TDX stacks are zero-padded). Otherwise a length could grow into the
    // padding and the bytes would change without the quote being refused.
    let canonical = q.encode();
    if !quote.starts_with(&canonical) || quote[canonical.len()..].iter().any(|b| *b != 0) {
        return Err(AttestError::Malformed(
            "quote is not in canonical form (lengths, or non-zero trailing bytes)".into(),
        ));
    }
    // Version 4/5 signature data wraps the QE report certification data (type 6), which holds
    // the PCK chain (type 5, checked by `raw_cert_chain`); dcap-qvl does not look at the outer type.
    if let dcap_qvl::quote::AuthData::V4(d) = &q.auth_data {
        if d.certification_data.cert_type != 6 {
            return Err(AttestError::Malformed(format!(
                "certification data type {}, expected 6 (QE report certification data)",
                d.certification_data.cert_type
            )));
        }
    }
    let raw = q.raw_cert_chain().map_err(|e| AttestError::Malformed(format!("quote certification data: {e}")))?;
    let end = raw.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1);
    let raw = &raw[..end];
    let pems = pem::parse_many(raw).map_err(|e| AttestError::Malformed(format!("PCK certificate chain: {e}")))?;
    if pems.len() < 2 || pems.iter().any(|p| p.tag() != "CERTIFICATE") {
        return Err(AttestError::Malformed("PCK certificate chain: expected at least two certificates".into()));
    }
    let cfg = pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF);
    let canonical: String = pems.iter().map(|p| pem::encode_config(p, cfg)).collect();
    if canonical.as_bytes() != raw {
        return Err(AttestError::Malformed("PCK certificate chain is not in canonical PEM form".into()));
    }
    if pems.last().map(|p| p.contents()) != Some(root_der) {
        return Err(AttestError::Collateral(
            "the quote's certificate chain does not end in the trusted root CA".into(),
        ));
    }
    Ok(())
}

/// The two halves of a DCAP report data field: channel-key commitment, then nonce.
pub fn split_report_data(rd: &[u8; 64]) -> ([u8; 32], [u8; 32]) {
    let mut a = [0u8; 32];
    let mut b = [0u8; 32];
    a.copy_from_slice(&rd[..32]);
    b.copy_from_slice(&rd[32..]);
    (a, b)
}
