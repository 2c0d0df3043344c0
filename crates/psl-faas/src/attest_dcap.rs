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
//!   [`DcapPolicy`]'s allowed set (SGX: the enclave's MRENCLAVE, or its MRSIGNER with its
//!   ISV product id and a minimum ISV SVN; TDX: MRTD with RTMR0..3); debug enclaves and TDs are
//!   refused.
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
//! - **Collateral freshness**: every part (TCB info, QE identity, PCK CRL) must be inside its
//!   window at the verification time, and no older than the policy's maximum age if it sets one.
//!
//! Evidence bytes are the raw quote. Collateral comes from a [`CollateralSource`]: a PCCS with a
//! local cache ([`crate::attest_pccs`]) or a fixed file. The quotes come from Gramine's
//! `/dev/attestation` (SGX, [`crate::attest_gramine`]) or configfs-tsm (TDX,
//! [`crate::attest_tsm`]).

use crate::attest::{
    check_report_data, AttestError, AttestPolicy, AttestVerifier, CheckLog, Evidence, Expected, Measurement, TeeKind,
    VerifiedReport,
};
use dcap_qvl::quote::{Quote, Report};
use dcap_qvl::verify::QuoteVerifier;
use dcap_qvl::TcbStatus;
use psl_crypto::sha256;
use std::collections::BTreeMap;
use std::sync::Arc;

pub use crate::attest::VerifyTime;
pub use crate::attest::DCAP_BACKEND;
pub use dcap_qvl::QuoteCollateralV3 as Collateral;

/// Intel SGX Root CA (DER; CN=Intel SGX Root CA, valid 2018-05-21 to 2049-12-31, SHA-256
/// fingerprint 44a0196b2b99f889b8e149e95b807a350e7424964399e885a7cbb8ccfab674d3), the trust
/// anchor of every SGX and TDX DCAP quote. Same bytes as the one `dcap-qvl` embeds.
pub const INTEL_SGX_ROOT_CA_DER: &[u8] = include_bytes!("intel_sgx_root_ca.der");
/// Largest quote accepted (a quote with its certification data is a few KiB).
pub const QUOTE_BYTES_MAX: usize = 64 * 1024;

/// Where the verifier gets the collateral of a quote.
pub trait CollateralSource: Send + Sync {
    /// The collateral for `quote`, fresh enough for a verification at `now` (Unix seconds) if
    /// the source can tell (a cache refreshes entries past their next update).
    fn collateral(&self, quote: &[u8], now: u64) -> Result<Collateral, AttestError>;
    /// What the source is (for the check log).
    fn describe(&self) -> String {
        "collateral".into()
    }
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
    fn collateral(&self, _quote: &[u8], _now: u64) -> Result<Collateral, AttestError> {
        Ok(self.0.clone())
    }
    fn describe(&self) -> String {
        "a fixed collateral file".into()
    }
}

/// No collateral: every quote is refused (a policy that allows SGX or TDX must say where its
/// collateral comes from).
pub struct NoCollateral;

impl CollateralSource for NoCollateral {
    fn collateral(&self, _quote: &[u8], _now: u64) -> Result<Collateral, AttestError> {
        Err(AttestError::Collateral(
            "no collateral source configured (set [collateral] pccs_url or file in the policy)".into(),
        ))
    }
}

/// The `dcap` backend's policy for one TEE kind.
#[derive(Clone, Debug)]
pub struct DcapPolicy {
    /// Allowed measurement digests ([`sgx_mrenclave`], [`sgx_mrsigner`], [`tdx_measurement`]).
    pub allowed: AttestPolicy,
    /// For a signer identity digest ([`sgx_mrsigner`]): the lowest ISV SVN accepted.
    pub min_isv_svn: BTreeMap<Measurement, u16>,
    /// Platform TCB statuses accepted.
    pub accepted: Vec<TcbStatus>,
    /// Accept debug enclaves / TDs (never in production).
    pub allow_debug: bool,
    /// Refuse collateral (TCB info, QE identity, PCK CRL) issued longer ago than this, in
    /// seconds, even inside its validity window.
    pub max_age_secs: Option<u64>,
    /// The time certificates, CRLs and collateral are checked at.
    pub time: VerifyTime,
}

impl Default for DcapPolicy {
    fn default() -> Self {
        DcapPolicy {
            allowed: AttestPolicy::default(),
            min_isv_svn: BTreeMap::new(),
            accepted: default_accepted(),
            allow_debug: false,
            max_age_secs: None,
            time: VerifyTime::Now,
        }
    }
}

/// `UpToDate`, `SWHardeningNeeded`, `ConfigurationNeeded`, `ConfigurationAndSWHardeningNeeded`.
pub fn default_accepted() -> Vec<TcbStatus> {
    vec![
        TcbStatus::UpToDate,
        TcbStatus::SWHardeningNeeded,
        TcbStatus::ConfigurationNeeded,
        TcbStatus::ConfigurationAndSWHardeningNeeded,
    ]
}

/// Every TCB status, by the name Intel's collateral uses.
pub fn tcb_status_by_name(name: &str) -> Option<TcbStatus> {
    use TcbStatus::*;
    [
        UpToDate,
        OutOfDateConfigurationNeeded,
        OutOfDate,
        ConfigurationAndSWHardeningNeeded,
        ConfigurationNeeded,
        SWHardeningNeeded,
        Revoked,
        TDRelaunchAdvised,
        TDRelaunchAdvisedConfigurationNeeded,
    ]
    .into_iter()
    .find(|s| s.to_string() == name)
}

impl DcapPolicy {
    /// Only `UpToDate` platforms.
    pub fn strict(time: VerifyTime) -> DcapPolicy {
        DcapPolicy { accepted: vec![TcbStatus::UpToDate], time, ..DcapPolicy::default() }
    }

    /// This policy with `allowed` as the allowed measurements.
    pub fn allowing(mut self, allowed: AttestPolicy) -> DcapPolicy {
        self.allowed = allowed;
        self
    }
}

/// What a DCAP verification established, beyond the trait's [`VerifiedReport`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DcapReport {
    /// The TEE kind's name (`sgx` or `tdx`).
    pub tee: &'static str,
    /// The platform's TCB status as the collateral rates it (for example `UpToDate`).
    pub tcb_status: String,
    /// Intel security advisories (INTEL-SA ids) that apply at that TCB level.
    pub advisory_ids: Vec<String>,
    /// The allowed measurement digest the quote matched.
    pub measurement: Measurement,
    /// The quote's 64-byte report data.
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

/// What a quote claims, read without verifying it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuoteIdentity {
    /// SGX or TDX.
    pub kind: TeeKind,
    /// Measurement digests, the most specific first (SGX: MRENCLAVE, then MRSIGNER + product).
    pub digests: Vec<Measurement>,
    /// The quote's 64-byte report data.
    pub report_data: [u8; 64],
    /// SGX: the enclave's ISV SVN.
    pub isv_svn: Option<u16>,
    /// Whether the enclave or TD has the debug attribute set.
    pub debug: bool,
    /// The registers, named, in hex (for `psl attest measure`).
    pub registers: Vec<(&'static str, String)>,
}

fn quote_identity(report: &Report) -> QuoteIdentity {
    let td = |mr_td: &[u8; 48], r: [&[u8; 48]; 4], attrs: &[u8; 8], rd: &[u8; 64]| QuoteIdentity {
        kind: TeeKind::Tdx,
        digests: vec![tdx_measurement(mr_td, r)],
        report_data: *rd,
        isv_svn: None,
        // TDATTRIBUTES bit 0: DEBUG.
        debug: attrs[0] & 1 != 0,
        registers: vec![
            ("mrtd", hex::encode(mr_td)),
            ("rtmr0", hex::encode(r[0])),
            ("rtmr1", hex::encode(r[1])),
            ("rtmr2", hex::encode(r[2])),
            ("rtmr3", hex::encode(r[3])),
        ],
    };
    match report {
        Report::SgxEnclave(r) => QuoteIdentity {
            kind: TeeKind::Sgx,
            digests: vec![sgx_mrenclave(&r.mr_enclave), sgx_mrsigner(&r.mr_signer, r.isv_prod_id)],
            report_data: r.report_data,
            isv_svn: Some(r.isv_svn),
            // ATTRIBUTES.FLAGS bit 1: DEBUG.
            debug: r.attributes[0] & 2 != 0,
            registers: vec![
                ("mrenclave", hex::encode(r.mr_enclave)),
                ("mrsigner", hex::encode(r.mr_signer)),
                ("isv_prod_id", r.isv_prod_id.to_string()),
                ("isv_svn", r.isv_svn.to_string()),
            ],
        },
        Report::TD10(r) => td(&r.mr_td, [&r.rt_mr0, &r.rt_mr1, &r.rt_mr2, &r.rt_mr3], &r.td_attributes, &r.report_data),
        Report::TD15(r) => {
            let b = &r.base;
            td(&b.mr_td, [&b.rt_mr0, &b.rt_mr1, &b.rt_mr2, &b.rt_mr3], &b.td_attributes, &b.report_data)
        }
        Report::TD15Ex(r) => {
            let b = &r.base.base;
            td(&b.mr_td, [&b.rt_mr0, &b.rt_mr1, &b.rt_mr2, &b.rt_mr3], &b.td_attributes, &b.report_data)
        }
    }
}

/// Parses a quote without verifying it (to read its measurements, e.g. to write a policy).
pub fn inspect(quote: &[u8]) -> Result<QuoteIdentity, AttestError> {
    if quote.len() > QUOTE_BYTES_MAX {
        return Err(AttestError::Malformed(format!("quote of {} bytes, over {QUOTE_BYTES_MAX}", quote.len())));
    }
    let q = Quote::parse(quote).map_err(|e| AttestError::Malformed(format!("quote: {e}")))?;
    Ok(quote_identity(&q.report))
}

/// The `issueDate` and `nextUpdate` of a TCB info or QE identity JSON body, as Unix seconds.
fn json_window(json: &str, what: &str) -> Result<(u64, u64), AttestError> {
    let v: serde_json::Value =
        serde_json::from_str(json).map_err(|e| AttestError::Collateral(format!("{what}: not JSON: {e}")))?;
    let get = |k: &str| {
        v.get(k)
            .and_then(|x| x.as_str())
            .and_then(crate::attest::parse_time)
            .ok_or_else(|| AttestError::Collateral(format!("{what}: no valid {k}")))
    };
    Ok((get("issueDate")?, get("nextUpdate")?))
}

/// The `thisUpdate` and `nextUpdate` of a DER CRL.
fn crl_window(der: &[u8], what: &str) -> Result<(u64, u64), AttestError> {
    use x509_cert::der::Decode;
    let crl = x509_cert::crl::CertificateList::<x509_cert::certificate::Rfc5280>::from_der(der)
        .map_err(|e| AttestError::Collateral(format!("{what}: not a DER CRL: {e}")))?;
    let this = crl.tbs_cert_list.this_update.to_unix_duration().as_secs();
    let next = crl
        .tbs_cert_list
        .next_update
        .map(|t| t.to_unix_duration().as_secs())
        .ok_or_else(|| AttestError::Collateral(format!("{what}: no next update")))?;
    Ok((this, next))
}

/// The earliest next update of a collateral set (when a cache must refresh it).
pub fn collateral_expiry(c: &Collateral) -> Result<u64, AttestError> {
    let (_, a) = json_window(&c.tcb_info, "TCB info")?;
    let (_, b) = json_window(&c.qe_identity, "QE identity")?;
    let (_, d) = crl_window(&c.pck_crl, "PCK CRL")?;
    Ok(a.min(b).min(d))
}

/// Checks the windows of the collateral's parts at `t`, and their age against `max_age`.
fn check_freshness(c: &Collateral, t: u64, max_age: Option<u64>) -> Result<String, AttestError> {
    use crate::attest::fmt_utc;
    let parts = [
        ("TCB info", json_window(&c.tcb_info, "TCB info")?),
        ("QE identity", json_window(&c.qe_identity, "QE identity")?),
        ("PCK CRL", crl_window(&c.pck_crl, "PCK CRL")?),
    ];
    for (what, (issued, next)) in parts {
        if t < issued || t > next {
            return Err(AttestError::Collateral(format!(
                "{what} is valid from {} to {}, not at {}",
                fmt_utc(issued),
                fmt_utc(next),
                fmt_utc(t)
            )));
        }
        if let Some(max) = max_age {
            if t - issued > max {
                return Err(AttestError::Collateral(format!(
                    "{what} was issued {} ({} s before the verification time), over the policy's maximum age of {max} s",
                    fmt_utc(issued),
                    t - issued
                )));
            }
        }
    }
    Ok(format!(
        "TCB info, QE identity and PCK CRL valid at {} (oldest issued {}){}",
        fmt_utc(t),
        fmt_utc(parts.iter().map(|(_, (i, _))| *i).min().unwrap_or(0)),
        max_age.map(|m| format!(", within the maximum age of {m} s")).unwrap_or_default()
    ))
}

impl DcapVerifier {
    /// A verifier for this policy, getting collateral from `collateral` and trusting Intel's
    /// production SGX root CA.
    pub fn new(policy: DcapPolicy, collateral: Arc<dyn CollateralSource>) -> DcapVerifier {
        DcapVerifier { policy, collateral, root_ca_der: INTEL_SGX_ROOT_CA_DER.to_vec() }
    }

    /// Trusts another root CA than Intel's production one (tests with a private PKI).
    pub fn with_root_ca(mut self, der: Vec<u8>) -> DcapVerifier {
        self.root_ca_der = der;
        self
    }

    /// The policy it checks quotes against.
    pub fn policy(&self) -> &DcapPolicy {
        &self.policy
    }

    /// Verifies a quote: signature chain and collateral at the policy's time, TCB status,
    /// debug mode, and that one of its measurement digests is allowed. Does not check the
    /// report data (see [`AttestVerifier::verify`]).
    pub fn verify_quote(&self, quote: &[u8]) -> Result<DcapReport, AttestError> {
        self.verify_quote_explained(quote, &mut CheckLog::default())
    }

    /// [`DcapVerifier::verify_quote`], recording each check.
    pub fn verify_quote_explained(&self, quote: &[u8], log: &mut CheckLog) -> Result<DcapReport, AttestError> {
        if quote.len() > QUOTE_BYTES_MAX {
            let e = AttestError::Malformed(format!("quote of {} bytes, over {QUOTE_BYTES_MAX}", quote.len()));
            return Err(log.fail("format", e));
        }
        let id = inspect(quote).map_err(|e| log.fail("format", e))?;
        log.pass("format", format!("DCAP quote of {} bytes, TEE {}", quote.len(), id.kind));
        log.record("canonical encoding", check_canonical(quote, &self.root_ca_der), |_| {
            "exact lengths, zero padding only, canonical PEM chain ending in the trusted root CA".into()
        })?;
        let now = self.policy.time.unix_secs();
        let collateral =
            log.record("collateral", self.collateral.collateral(quote, now), |_| self.collateral.describe())?;
        log.record("collateral freshness", check_freshness(&collateral, now, self.policy.max_age_secs), |d| d.clone())?;
        let chains = [
            ("PCK CRL issuer chain", &collateral.pck_crl_issuer_chain),
            ("TCB info issuer chain", &collateral.tcb_info_issuer_chain),
            ("QE identity issuer chain", &collateral.qe_identity_issuer_chain),
        ];
        let r = chains.iter().try_for_each(|(what, c)| check_issuer_chain(what, c, &self.root_ca_der));
        log.record("collateral issuer chains", r, |_| {
            "canonical PEM, each certificate signed by the next, ending in the trusted root CA".into()
        })?;
        let verifier = QuoteVerifier::new(self.root_ca_der.clone()).allow_debug(self.policy.allow_debug);
        let v = verifier.verify(quote, &collateral, now).map_err(|e| {
            let e = AttestError::Collateral(format!(
                "quote or collateral refused at {}: {e:#}",
                crate::attest::fmt_utc(now)
            ));
            log.fail("signature chain and collateral (dcap-qvl)", e)
        })?;
        log.pass(
            "signature chain and collateral (dcap-qvl)",
            "PCK certificate chain to the Intel SGX Root CA, CRLs, QE report and identity, attestation key, quote \
             signature, TCB info signature and level",
        );
        if !self.policy.accepted.iter().any(|s| s.to_string() == v.status) {
            let e = AttestError::TcbStatus { status: v.status.clone(), advisories: v.advisory_ids.join(",") };
            return Err(log.fail("TCB status", e));
        }
        log.pass("TCB status", format!("{} (advisories: {})", v.status, v.advisory_ids.join(",")));
        let id = quote_identity(&v.report);
        if id.debug && !self.policy.allow_debug {
            return Err(log.fail("debug", AttestError::Policy(format!("a debug {}", id.kind))));
        }
        log.pass("debug", if id.debug { "debug, allowed by the policy" } else { "not a debug enclave or TD" });
        let Some(measurement) = id.digests.iter().find(|d| self.policy.allowed.allowed.contains(d)).copied() else {
            let regs: Vec<String> = id.registers.iter().map(|(k, v)| format!("{k} {v}")).collect();
            let e = AttestError::Measurement(format!("{} ({})", id.digests[0].short(), regs.join(", ")));
            return Err(log.fail("measurement", e));
        };
        log.pass("measurement", format!("{} {measurement} is allowed", id.kind));
        if let (Some(min), Some(svn)) = (self.policy.min_isv_svn.get(&measurement), id.isv_svn) {
            if svn < *min {
                return Err(log.fail("ISV SVN", AttestError::Policy(format!("ISV SVN {svn} < the minimum {min}"))));
            }
            log.pass("ISV SVN", format!("{svn} (minimum {min})"));
        }
        Ok(DcapReport {
            tee: id.kind.as_str(),
            tcb_status: v.status,
            advisory_ids: v.advisory_ids,
            measurement,
            report_data: id.report_data,
        })
    }
}

impl AttestVerifier for DcapVerifier {
    fn verify_explained(
        &self,
        evidence: &Evidence,
        expect: &Expected,
        log: &mut CheckLog,
    ) -> Result<VerifiedReport, AttestError> {
        if evidence.backend != DCAP_BACKEND {
            return Err(log.fail("backend", AttestError::Backend { got: evidence.backend, want: DCAP_BACKEND }));
        }
        let r = self.verify_quote_explained(&evidence.bytes, log)?;
        let data = check_report_data(&r.report_data, expect, log)?;
        tracing::debug!(tee = r.tee, tcb = %r.tcb_status, measurement = %r.measurement.short(), "dcap quote verified");
        let kind = if r.tee == "sgx" { TeeKind::Sgx } else { TeeKind::Tdx };
        Ok(VerifiedReport { kind, measurement: r.measurement, report_data: data })
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

/// A collateral issuer chain (PEM): canonical (64-column lines, LF), at least two
/// certificates, each signed by the next (ECDSA P-256/SHA-256), the last the trusted root.
/// `dcap-qvl` checks the collateral's signatures with the chain's first certificate; this makes
/// every byte of the chain count too.
fn check_issuer_chain(what: &str, text: &str, root_der: &[u8]) -> Result<(), AttestError> {
    use crate::attest_snp::Cert;
    let pems = pem::parse_many(text.as_bytes()).map_err(|e| AttestError::Collateral(format!("{what}: {e}")))?;
    if pems.len() < 2 || pems.iter().any(|p| p.tag() != "CERTIFICATE") {
        return Err(AttestError::Collateral(format!("{what}: expected at least two certificates")));
    }
    let cfg = pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF);
    let canonical: String = pems.iter().map(|p| pem::encode_config(p, cfg)).collect();
    if canonical != text {
        return Err(AttestError::Collateral(format!("{what} is not in canonical PEM form")));
    }
    if pems.last().map(|p| p.contents()) != Some(root_der) {
        return Err(AttestError::Collateral(format!("{what} does not end in the trusted root CA")));
    }
    let certs = pems.iter().map(|p| Cert::from_der(p.contents())).collect::<Result<Vec<_>, _>>()?;
    for w in certs.windows(2) {
        w[0].check_ecdsa_p256_signed_by(&w[1], what)?;
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
