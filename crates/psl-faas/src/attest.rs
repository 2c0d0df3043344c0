//! Attestation: a party proves which code it runs (its *measurement*) and binds a channel key
//! to that proof; a verifier checks the proof against a policy before trusting the key.
//!
//! [`Attester`] (the attested party's side) and [`AttestVerifier`] (the checking side) are the
//! seams every backend plugs into:
//!
//! | kind | attester | evidence backend | verifier |
//! | --- | --- | --- | --- |
//! | SGX | Gramine's `/dev/attestation` ([`crate::attest_gramine`]) | `dcap` (a DCAP quote) | [`crate::attest_dcap`] |
//! | TDX | Linux configfs-tsm ([`crate::attest_tsm`]) | `dcap` (a DCAP quote) | [`crate::attest_dcap`] |
//! | SEV-SNP | Linux configfs-tsm ([`crate::attest_tsm`]) | `snp` (report + certificate table) | [`crate::attest_snp`] |
//! | sim | [`SimAttester`] | `sim-INSECURE` | [`SimVerifier`] |
//!
//! A deployment's leader verifies through one [`crate::attest_policy::PolicyVerifier`], built
//! from the policy file: it routes each evidence to its backend and refuses kinds the policy
//! does not allow.
//!
//! **THE SIM BACKEND IS INSECURE AND FOR DEVELOPMENT ONLY.** Its "platform key" is an ordinary
//! key held by the same process; anyone who has it can forge any report. It exercises the
//! protocol (measurement policy, nonce freshness, channel-key binding), not the hardware trust.
//! A policy accepts it only when it says `allow_insecure_sim = true`.
//!
//! Sim report (168 bytes): `"PSLSIMR1" ‖ measurement (32) ‖ report data (32) ‖ nonce (32) ‖
//! ECDSA secp256k1 signature (64)` over `SHA-256("psl/sim-report/v1" ‖ the first 104 bytes)`.
//!
//! Every verifier can explain itself: it appends each check it makes to a [`CheckLog`]
//! (`psl attest verify` prints it).

use psl_crypto::{sha256, Hash256, Signature, SigningKey, VerifyingKey};
use std::collections::BTreeSet;
use std::fmt;
use std::sync::{Arc, OnceLock};

/// A 32-byte digest standing for what the attested party runs: SHA-256 of the code and its
/// runtime configuration (sim), or a domain-separated digest of the hardware's measurement
/// registers ([`crate::attest_dcap::sgx_mrenclave`], [`crate::attest_dcap::tdx_measurement`],
/// [`crate::attest_snp::snp_measurement`], ...).
pub type Measurement = Hash256;

/// A report, as bytes, plus the backend that made it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Evidence {
    /// The backend that made the report (`SIM_BACKEND`, `DCAP_BACKEND`, `SNP_BACKEND`).
    pub backend: &'static str,
    /// The report (or quote) as the backend encodes it.
    pub bytes: Vec<u8>,
}

/// The time reports, certificates and collateral are checked at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VerifyTime {
    /// The system clock.
    Now,
    /// A fixed Unix time in seconds (tests, and replaying a verification: `psl attest verify --at`).
    At(u64),
}

impl VerifyTime {
    /// The time as Unix seconds (the clock's for `Now`, 0 if it is before 1970).
    pub fn unix_secs(self) -> u64 {
        match self {
            VerifyTime::At(t) => t,
            VerifyTime::Now => {
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
            }
        }
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `2025-06-20T00:00:00Z` (UTC) for Unix seconds.
pub fn fmt_utc(t: u64) -> String {
    let days = (t / 86_400) as i64;
    let secs = t % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", secs / 3600, secs / 60 % 60, secs % 60)
}

/// Parses a time given as Unix seconds or as RFC 3339 in UTC (`2025-06-20`,
/// `2025-06-20T12:00:00Z`, fractional seconds ignored).
pub fn parse_time(s: &str) -> Option<u64> {
    let s = s.trim();
    if let Ok(n) = s.parse::<u64>() {
        return Some(n);
    }
    let b = s.as_bytes();
    if b.len() < 10 || b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<u32> {
        let t = s.get(r)?;
        if t.bytes().all(|c| c.is_ascii_digit()) {
            t.parse().ok()
        } else {
            None
        }
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) {
        return None;
    }
    let mut secs = 0u64;
    if b.len() > 10 {
        if !(b[10] == b'T' || b[10] == b' ') || b.len() < 20 || b[13] != b':' || b[16] != b':' {
            return None;
        }
        let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
        if h > 23 || mi > 59 || se > 60 {
            return None;
        }
        let mut rest = &s[19..];
        if let Some(r) = rest.strip_prefix('.') {
            rest = r.trim_start_matches(|c: char| c.is_ascii_digit());
        }
        if rest != "Z" && rest != "+00:00" {
            return None;
        }
        secs = h as u64 * 3600 + mi as u64 * 60 + se as u64;
    }
    let days = days_from_civil(y as i64, mo, d);
    let t = u64::try_from(days).ok()? * 86_400 + secs;
    // No 31st of February: the date must survive the round trip.
    (fmt_utc(t)[..10] == s[..10]).then_some(t)
}

/// The kinds of trusted execution environment PSL knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TeeKind {
    /// The INSECURE simulated platform.
    Sim,
    /// Intel SGX (an enclave; DCAP quote).
    Sgx,
    /// Intel TDX (a trust domain; DCAP quote).
    Tdx,
    /// AMD SEV-SNP (a confidential VM; attestation report signed by the chip's VCEK).
    Snp,
}

impl TeeKind {
    /// Every kind, in the order `psl attest` lists them.
    pub const ALL: [TeeKind; 4] = [TeeKind::Sim, TeeKind::Sgx, TeeKind::Tdx, TeeKind::Snp];

    /// The kind's name in policy files (`sim`, `sgx`, `tdx`, `snp`).
    pub fn as_str(self) -> &'static str {
        match self {
            TeeKind::Sim => "sim",
            TeeKind::Sgx => "sgx",
            TeeKind::Tdx => "tdx",
            TeeKind::Snp => "snp",
        }
    }

    /// The kind named `s` (as `as_str` spells it), if any.
    pub fn parse(s: &str) -> Option<TeeKind> {
        TeeKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

impl fmt::Display for TeeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The evidence backend named `name` on the wire, if PSL knows it.
pub fn backend_by_name(name: &str) -> Option<&'static str> {
    [SIM_BACKEND, DCAP_BACKEND, SNP_BACKEND].into_iter().find(|b| *b == name)
}

/// What a verifier establishes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifiedReport {
    /// The TEE kind that produced the report.
    pub kind: TeeKind,
    /// The allowed measurement digest the report matched.
    pub measurement: Measurement,
    /// The report data the report binds (the hash of the key the attested party offered).
    pub report_data: [u8; 32],
}

/// Why evidence was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttestError {
    /// The evidence does not parse (or has the wrong form).
    #[error("evidence is malformed: {0}")]
    Malformed(String),
    /// The evidence is from another backend than the verifier's.
    #[error("evidence is from backend '{got}', the verifier accepts '{want}'")]
    Backend {
        /// The evidence's backend.
        got: &'static str,
        /// The verifier's backend.
        want: &'static str,
    },
    /// The report's signature does not verify under its signing key.
    #[error("the report's signature does not verify under its signing key (the sim platform key, or the chip's VCEK)")]
    Signature,
    /// The report's measurement (hex) is not one the policy allows.
    #[error("measurement {0} is not in the policy")]
    Measurement(String),
    /// The report is not over the nonce the verifier issued.
    #[error("the report's nonce is not the one issued (stale or replayed report)")]
    Nonce,
    /// The report does not bind the key offered with it.
    #[error("the report does not bind the channel key offered with it")]
    ReportData,
    /// The quote's signature chain or its DCAP collateral was refused.
    #[error("quote signature chain or collateral refused: {0}")]
    Collateral(String),
    /// The DCAP platform TCB status is not one the policy accepts.
    #[error("platform TCB status {status} is not accepted by the policy (advisories: {advisories})")]
    TcbStatus {
        /// The platform's TCB status as Intel names it.
        status: String,
        /// The Intel security advisory ids listed for that TCB level, comma-separated.
        advisories: String,
    },
    /// A certificate chain (VCEK, ASK, ARK, or a CRL) was refused.
    #[error("certificate chain refused: {0}")]
    Chain(String),
    /// The report breaks a policy rule (debug, migration agent, SMT, VMPL, minimum TCB or SVN).
    #[error("the report breaks the policy: {0}")]
    Policy(String),
    /// The report's TEE kind is not in the policy's `allowed_kinds`.
    #[error("TEE kind '{0}' is not allowed by the policy (allowed_kinds)")]
    KindNotAllowed(String),
    /// A sim report, and the policy does not accept the INSECURE sim backend.
    #[error("evidence from the INSECURE sim backend, and the policy does not say allow_insecure_sim = true: refused")]
    InsecureSim,
    /// The platform's attestation interface (device, configfs, driver) failed.
    #[error("the platform's attestation interface failed: {0}")]
    Platform(String),
}

/// How one check ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckStatus {
    /// The check passed.
    Pass,
    /// The check failed (verification stopped there).
    Fail,
    /// Not made (for example the expected report data was not given to `psl attest verify`).
    Skipped,
}

/// One check a verifier made, with what it found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// How the check ended.
    pub status: CheckStatus,
    /// What was found (or why it failed or was skipped).
    pub detail: String,
}

/// The checks of one verification, in the order they were made.
#[derive(Clone, Debug, Default)]
pub struct CheckLog {
    /// The checks in order.
    pub checks: Vec<Check>,
}

impl CheckLog {
    /// Records a passed check.
    pub fn pass(&mut self, name: &str, detail: impl Into<String>) {
        self.checks.push(Check { name: name.into(), status: CheckStatus::Pass, detail: detail.into() });
    }

    /// Records a failed check; returns the error for `?`.
    pub fn fail(&mut self, name: &str, e: AttestError) -> AttestError {
        self.checks.push(Check { name: name.into(), status: CheckStatus::Fail, detail: e.to_string() });
        e
    }

    /// Records a check that was not made, and why.
    pub fn skip(&mut self, name: &str, why: impl Into<String>) {
        self.checks.push(Check { name: name.into(), status: CheckStatus::Skipped, detail: why.into() });
    }

    /// `Ok(v)` is recorded as passed with `detail(&v)`, `Err(e)` as failed.
    pub fn record<T>(
        &mut self,
        name: &str,
        r: Result<T, AttestError>,
        detail: impl FnOnce(&T) -> String,
    ) -> Result<T, AttestError> {
        match r {
            Ok(v) => {
                let d = detail(&v);
                self.pass(name, d);
                Ok(v)
            }
            Err(e) => Err(self.fail(name, e)),
        }
    }

    /// One line per check: `PASS name: detail`.
    pub fn render(&self) -> String {
        let mut s = String::new();
        for c in &self.checks {
            let tag = match c.status {
                CheckStatus::Pass => "PASS",
                CheckStatus::Fail => "FAIL",
                CheckStatus::Skipped => "SKIP",
            };
            s.push_str(&format!("{tag} {}: {}\n", c.name, c.detail));
        }
        s
    }
}

/// The party being attested.
pub trait Attester: Send + Sync {
    /// The evidence backend its reports are for ([`SIM_BACKEND`], `dcap`, `snp`).
    fn backend(&self) -> &'static str;
    /// The TEE kind its reports are of.
    fn kind(&self) -> TeeKind;
    /// What it is and where it gets its reports (for logs: `auto` says what it chose).
    fn describe(&self) -> String;
    /// A report over `nonce` (the verifier's freshness challenge) and `report_data` (the hash of
    /// the channel key the keys should go to). Hardware backends put `report_data ‖ nonce` in
    /// the 64-byte report data field.
    fn attest(&self, nonce: &[u8; 32], report_data: &[u8; 32]) -> Result<Evidence, AttestError>;
}

/// What the verifier expects the report to carry. `None` only offline (`psl attest verify`
/// without `--nonce` / `--report-data`): those checks are then reported as skipped.
#[derive(Clone, Copy, Debug, Default)]
pub struct Expected {
    /// The nonce the report must carry; `None`: the check is skipped.
    pub nonce: Option<[u8; 32]>,
    /// The report data the report must bind; `None`: the check is skipped.
    pub report_data: Option<[u8; 32]>,
}

/// A set of allowed measurement digests.
#[derive(Clone, Debug, Default)]
pub struct AttestPolicy {
    /// The measurement digests accepted.
    pub allowed: BTreeSet<Measurement>,
}

/// The verifying side. A verifier carries its own policy (allowed measurements and the rest).
pub trait AttestVerifier: Send + Sync {
    /// Checks the evidence, appending every check to `log`; stops at the first failure.
    fn verify_explained(
        &self,
        evidence: &Evidence,
        expect: &Expected,
        log: &mut CheckLog,
    ) -> Result<VerifiedReport, AttestError>;

    /// Checks the evidence's signature chain, that its nonce is `nonce`, its report data is
    /// `report_data`, and its measurement is allowed.
    fn verify(
        &self,
        evidence: &Evidence,
        nonce: &[u8; 32],
        report_data: &[u8; 32],
    ) -> Result<VerifiedReport, AttestError> {
        let expect = Expected { nonce: Some(*nonce), report_data: Some(*report_data) };
        self.verify_explained(evidence, &expect, &mut CheckLog::default())
    }
}

/// Checks the two halves of a hardware report's 64-byte report data field against `expect`:
/// `report_data (32) ‖ nonce (32)`.
pub fn check_report_data(rd: &[u8; 64], expect: &Expected, log: &mut CheckLog) -> Result<[u8; 32], AttestError> {
    let mut bind = [0u8; 32];
    bind.copy_from_slice(&rd[..32]);
    match expect.report_data {
        Some(want) if want == bind => log.pass("report data binds the channel key", hex::encode(bind)),
        Some(_) => return Err(log.fail("report data binds the channel key", AttestError::ReportData)),
        None => log.skip(
            "report data binds the channel key",
            format!("no channel key given; report data {}", hex::encode(bind)),
        ),
    }
    match expect.nonce {
        Some(n) if n[..] == rd[32..] => log.pass("nonce", "the report carries the issued nonce"),
        Some(_) => return Err(log.fail("nonce", AttestError::Nonce)),
        None => log.skip("nonce", format!("no nonce given; the report carries {}", hex::encode(&rd[32..]))),
    }
    Ok(bind)
}

/// The 64-byte report data field of a hardware report: `report_data ‖ nonce`.
pub fn hw_report_data(nonce: &[u8; 32], report_data: &[u8; 32]) -> [u8; 64] {
    let mut rd = [0u8; 64];
    rd[..32].copy_from_slice(report_data);
    rd[32..].copy_from_slice(nonce);
    rd
}

/// The report data that binds a channel public key.
pub fn bind_channel_key(channel_public: &[u8]) -> [u8; 32] {
    sha256(&[b"psl/report-data/v1", channel_public]).0
}

/// The report data of a role's HTTPS endpoint (`psl verify`): the hash of its TLS
/// certificate's public key ([`crate::tls::TlsIdentity::spki_hash`], as a client computes it
/// from the certificate it was shown), under a label of its own so that it can never be taken
/// for another binding.
pub fn bind_https_tls(spki_hash: &[u8; 32]) -> [u8; 32] {
    bind_channel_key(&[&b"psl/https-tls/v1"[..], &spki_hash[..]].concat())
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
/// The INSECURE sim backend: reports signed by a simulated platform key (`SimPlatform`).
pub const SIM_BACKEND: &str = "sim-INSECURE";
/// Intel SGX and TDX quotes (`attest_dcap`).
pub const DCAP_BACKEND: &str = "dcap";
/// AMD SEV-SNP reports (`attest_snp`).
pub const SNP_BACKEND: &str = "snp";

const SIM_IN_USE: &str = "attestation backend 'sim' in use: INSECURE, reports can be forged by anyone \
                          holding the simulated platform key; never use in production";

/// Whether this process has already said that the sim backend is in use.
static SIM_WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Claims the one warning per process about the INSECURE sim backend: true for the first
/// caller only, who then says it (as a log line or on stderr); later callers log at debug.
pub fn claim_insecure_sim_warning() -> bool {
    !SIM_WARNED.swap(true, std::sync::atomic::Ordering::Relaxed)
}

/// Says `detail` at WARN if it is the process's first word about the INSECURE sim backend,
/// else at DEBUG: one warning line per process, not one per report (`PSL_LOG=debug` shows
/// every one of them).
pub fn warn_insecure_sim(detail: &str) {
    if claim_insecure_sim_warning() {
        tracing::warn!("{detail}");
    } else {
        tracing::debug!("{detail}");
    }
}

/// The simulated platform (INSECURE): a signing key standing in for the hardware's.
pub struct SimPlatform {
    key: SigningKey,
}

impl SimPlatform {
    /// A fresh simulated platform with a random key (warns once per process: INSECURE).
    pub fn new() -> Arc<SimPlatform> {
        warn_insecure_sim(SIM_IN_USE);
        Arc::new(SimPlatform { key: SigningKey::generate() })
    }

    /// The simulated platform from a 32-byte secret shared by the processes of one deployment
    /// (`psl up` writes it to a file only they read). INSECURE like everything in this backend.
    pub fn from_secret(secret: &[u8; 32]) -> Result<Arc<SimPlatform>, AttestError> {
        warn_insecure_sim(SIM_IN_USE);
        let key = SigningKey::from_bytes(secret)
            .map_err(|_| AttestError::Malformed("the sim platform secret is not a valid key".into()))?;
        Ok(Arc::new(SimPlatform { key }))
    }

    /// The platform's public key, which verifiers of its reports must be given.
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
    /// An attester that signs reports of `measurement` with the platform's key.
    pub fn new(platform: Arc<SimPlatform>, measurement: Measurement) -> SimAttester {
        SimAttester { platform, measurement }
    }
}

impl Attester for SimAttester {
    fn backend(&self) -> &'static str {
        SIM_BACKEND
    }
    fn kind(&self) -> TeeKind {
        TeeKind::Sim
    }
    fn describe(&self) -> String {
        format!("sim (INSECURE simulated platform), measurement {}", self.measurement)
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
    policy: AttestPolicy,
}

impl SimVerifier {
    /// A verifier of reports signed by `platform`, accepting the measurements in `policy`.
    pub fn new(platform: VerifyingKey, policy: AttestPolicy) -> SimVerifier {
        SimVerifier { platform, policy }
    }
}

impl AttestVerifier for SimVerifier {
    fn verify_explained(
        &self,
        evidence: &Evidence,
        expect: &Expected,
        log: &mut CheckLog,
    ) -> Result<VerifiedReport, AttestError> {
        if evidence.backend != SIM_BACKEND {
            return Err(log.fail("backend", AttestError::Backend { got: evidence.backend, want: SIM_BACKEND }));
        }
        let b = &evidence.bytes;
        if b.len() != SIM_LEN || &b[..8] != SIM_MAGIC {
            let e = AttestError::Malformed(format!("{} bytes, a sim report is {SIM_LEN} starting PSLSIMR1", b.len()));
            return Err(log.fail("format", e));
        }
        log.pass("format", "sim report (INSECURE backend)");
        let sig = Signature(b[SIM_BODY..].try_into().expect("64 bytes"));
        let ok = self.platform.verify(&sha256(&[b"psl/sim-report/v1", &b[..SIM_BODY]]), &sig);
        log.record("signature", ok.map_err(|_| AttestError::Signature), |_| {
            "signed by the simulated platform key (which anyone holding it can use)".into()
        })?;
        let measurement = Hash256(b[8..40].try_into().expect("32"));
        let mut rd = [0u8; 64];
        rd.copy_from_slice(&b[40..104]);
        if !self.policy.allowed.contains(&measurement) {
            return Err(log.fail("measurement", AttestError::Measurement(measurement.to_hex())));
        }
        log.pass("measurement", format!("{measurement} is allowed"));
        let data = check_report_data(&rd, expect, log)?;
        Ok(VerifiedReport { kind: TeeKind::Sim, measurement, report_data: data })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sim_warning_is_claimed_once_per_process() {
        SimPlatform::new();
        // Whoever came first (this test's platform, or another test's), nobody after it warns.
        assert!(!claim_insecure_sim_warning());
        warn_insecure_sim("a later word about the sim backend: debug only");
        assert!(!claim_insecure_sim_warning());
    }

    #[test]
    fn sim_report_checks() {
        let p = SimPlatform::new();
        let m = measure(&binary_hash(), b"cfg");
        let a = SimAttester::new(p.clone(), m);
        let v = SimVerifier::new(p.public(), AttestPolicy { allowed: [m].into() });
        let (n, d) = ([1u8; 32], [2u8; 32]);
        let ev = a.attest(&n, &d).unwrap();
        assert!(v.verify(&ev, &n, &d).is_ok());
        assert_eq!(v.verify(&ev, &[9; 32], &d), Err(AttestError::Nonce));
        assert_eq!(v.verify(&ev, &n, &[9; 32]), Err(AttestError::ReportData));
        let empty = SimVerifier::new(p.public(), AttestPolicy::default());
        assert!(matches!(empty.verify(&ev, &n, &d), Err(AttestError::Measurement(_))));
        for i in 0..ev.bytes.len() {
            let mut t = ev.clone();
            t.bytes[i] ^= 1;
            assert!(v.verify(&t, &n, &d).is_err(), "byte {i}");
        }
        let other = SimVerifier::new(SimPlatform::new().public(), AttestPolicy { allowed: [m].into() });
        assert_eq!(other.verify(&ev, &n, &d), Err(AttestError::Signature));
    }

    #[test]
    fn times_round_trip() {
        assert_eq!(parse_time("2025-06-20"), Some(1_750_377_600));
        assert_eq!(parse_time("2025-06-20T00:00:00Z"), Some(1_750_377_600));
        assert_eq!(parse_time("2026-02-25T00:00:00.5Z"), Some(1_771_977_600));
        assert_eq!(parse_time("1750377600"), Some(1_750_377_600));
        assert_eq!(fmt_utc(1_750_377_600), "2025-06-20T00:00:00Z");
        assert_eq!(fmt_utc(951_782_400), "2000-02-29T00:00:00Z");
        for bad in ["", "2025-13-01", "2025-02-31", "2025-06-20T25:00:00Z", "2025-06-20T00:00:00+02:00", "x025-06-20"] {
            assert_eq!(parse_time(bad), None, "{bad}");
        }
        for t in [0u64, 86_399, 1_700_000_000, 4_102_444_800] {
            assert_eq!(parse_time(&fmt_utc(t)), Some(t));
        }
    }

    #[test]
    fn the_log_explains_each_check() {
        let p = SimPlatform::new();
        let m = measure(&binary_hash(), b"cfg");
        let ev = SimAttester::new(p.clone(), m).attest(&[1; 32], &[2; 32]).unwrap();
        let v = SimVerifier::new(p.public(), AttestPolicy { allowed: [m].into() });
        let mut log = CheckLog::default();
        v.verify_explained(&ev, &Expected::default(), &mut log).unwrap();
        let text = log.render();
        assert!(text.contains("PASS signature"), "{text}");
        assert!(text.contains("SKIP nonce"), "{text}");
        let mut log = CheckLog::default();
        let e = v.verify_explained(&ev, &Expected { nonce: Some([3; 32]), report_data: Some([2; 32]) }, &mut log);
        assert_eq!(e, Err(AttestError::Nonce));
        assert_eq!(log.checks.last().unwrap().status, CheckStatus::Fail);
    }
}
