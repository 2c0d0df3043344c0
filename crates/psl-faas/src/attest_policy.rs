//! The attestation policy file (`--attest-policy policy.toml`) and the verifier built from it.
//!
//! One file says everything a verifier (the leader checking workers and capsule hosts; workers
//! and clients checking the leader) accepts: which TEE kinds at all, the allowed measurements
//! of each kind, the accepted TCB statuses, where DCAP collateral and SEV-SNP VCEKs come from and
//! how fresh collateral must be. The INSECURE sim backend is accepted only when the file says
//! `allow_insecure_sim = true`; a file that lists `sim` in `allowed_kinds` without it is
//! refused when loaded. `docs/security/attestation.md` documents every key; `psl attest
//! measure` prints the `[[...allow]]` entries for a build, a Gramine signature or a report.
//!
//! ```toml
//! allowed_kinds = ["tdx", "snp"]
//!
//! [collateral]                 # DCAP (SGX, TDX) collateral, and freshness for every kind
//! pccs_url = "https://pccs.example:8081"
//! cache_dir = "/var/cache/psl/dcap"
//! max_age_days = 7
//!
//! [tdx]
//! accepted_tcb_statuses = ["UpToDate"]
//! [[tdx.allow]]
//! mrtd = "…"                   # 48 bytes, hex
//! rtmr0 = "…"
//! rtmr1 = "…"
//! rtmr2 = "…"
//! rtmr3 = "…"
//!
//! [snp]
//! vcek_cache_dir = "/var/cache/psl/vcek"
//! min_tcb = { bootloader = 3, tee = 0, snp = 8, microcode = 115 }
//! [[snp.allow]]
//! measurement = "…"            # 48 bytes, hex
//! guest_policy = "0x30000"     # optional: pin the guest policy too
//! ```
//!
//! Relative paths are relative to the policy file's directory.

use crate::attest::{
    AttestError, AttestPolicy, AttestVerifier, CheckLog, Evidence, Expected, Measurement, SimVerifier, TeeKind,
    VerifiedReport, VerifyTime, SIM_BACKEND,
};
use crate::attest_dcap::{
    default_accepted, sgx_mrenclave, sgx_mrsigner, tcb_status_by_name, tdx_measurement, CollateralSource, DcapPolicy,
    DcapVerifier, NoCollateral, StaticCollateral, DCAP_BACKEND,
};
use crate::attest_snp::{
    snp_measurement, snp_measurement_any_policy, MinTcb, SnpCollateral, SnpPolicy, SnpTrustAnchors, SnpVerifier,
    SNP_BACKEND,
};
use psl_crypto::{Hash256, VerifyingKey};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Largest policy file read.
pub const POLICY_BYTES_MAX: usize = 1 << 20;
/// Most allowed entries per kind.
pub const ALLOW_ENTRIES_MAX: usize = 4096;

/// The policy file, as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyFile {
    /// TEE kinds accepted at all: `sgx`, `tdx`, `snp` (and `sim`, only with
    /// `allow_insecure_sim = true`).
    #[serde(default)]
    pub allowed_kinds: Vec<String>,
    /// Accept the INSECURE sim backend (development only).
    #[serde(default)]
    pub allow_insecure_sim: bool,
    /// `[collateral]`: where DCAP collateral comes from and how fresh any collateral must be.
    #[serde(default)]
    pub collateral: CollateralSection,
    /// `[sgx]`: what is accepted of SGX enclaves (required when `sgx` is allowed).
    #[serde(default)]
    pub sgx: Option<SgxSection>,
    /// `[tdx]`: what is accepted of TDX guests (required when `tdx` is allowed).
    #[serde(default)]
    pub tdx: Option<TdxSection>,
    /// `[snp]`: what is accepted of SEV-SNP guests (required when `snp` is allowed).
    #[serde(default)]
    pub snp: Option<SnpSection>,
    /// `[sim]`: the INSECURE sim backend's key and measurements (with `allow_insecure_sim`).
    #[serde(default)]
    pub sim: Option<SimSection>,
    /// `[hosts]`: whether capsule hosts must attest before they get their keys.
    #[serde(default)]
    pub hosts: HostsSection,
}

/// The `[collateral]` section.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CollateralSection {
    /// A PCCS (or Intel's PCS) serving the v4 API, for DCAP collateral.
    pub pccs_url: Option<String>,
    /// CA certificate(s) (PEM) of the PCCS's TLS certificate; default: the system's roots.
    pub pccs_ca: Option<PathBuf>,
    /// Where fetched collateral is kept between runs.
    pub cache_dir: Option<PathBuf>,
    /// Refetch cached collateral after this many seconds even inside its validity window.
    pub cache_max_secs: Option<u64>,
    /// A fixed DCAP collateral file (JSON, as `dcap-qvl` writes it) instead of a PCCS.
    pub file: Option<PathBuf>,
    /// Refuse collateral (TCB info, QE identity, CRLs) issued longer ago than this.
    pub max_age_days: Option<u64>,
}

/// The `[sgx]` section.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SgxSection {
    /// TCB statuses accepted (names as Intel spells them); absent: `default_accepted()`.
    pub accepted_tcb_statuses: Option<Vec<String>>,
    /// Accept enclaves built in debug mode (never in production).
    #[serde(default)]
    pub allow_debug: bool,
    /// The enclave identities accepted (`[[sgx.allow]]`).
    #[serde(default)]
    pub allow: Vec<SgxAllow>,
}

/// An SGX enclave identity: its MRENCLAVE, or its signer (MRSIGNER, product id, minimum SVN).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SgxAllow {
    /// Accepted MRENCLAVE (32 bytes, hex); exclusive with `mrsigner`.
    pub mrenclave: Option<String>,
    /// Accepted MRSIGNER (32 bytes, hex); needs `isv_prod_id`.
    pub mrsigner: Option<String>,
    /// The enclave's ISV product id (with `mrsigner` only).
    pub isv_prod_id: Option<u16>,
    /// Lowest accepted ISV SVN (with `mrsigner` only; default 0).
    pub min_isv_svn: Option<u16>,
}

/// The `[tdx]` section.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TdxSection {
    /// TCB statuses accepted (names as Intel spells them); absent: `default_accepted()`.
    pub accepted_tcb_statuses: Option<Vec<String>>,
    /// Accept TDs with the debug attribute set (never in production).
    #[serde(default)]
    pub allow_debug: bool,
    /// The TD identities accepted (`[[tdx.allow]]`).
    #[serde(default)]
    pub allow: Vec<TdxAllow>,
}

/// An accepted TD identity: all five registers must match (each 48 bytes, hex).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TdxAllow {
    /// MRTD: the measurement of the TD's initial image.
    pub mrtd: String,
    /// RTMR0 (firmware configuration).
    pub rtmr0: String,
    /// RTMR1 (the OS loader and kernel).
    pub rtmr1: String,
    /// RTMR2 (the kernel command line and initrd).
    pub rtmr2: String,
    /// RTMR3 (runtime extensions).
    pub rtmr3: String,
}

/// The `[snp]` section.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnpSection {
    /// Accept guests whose policy allows debugging (never in production).
    #[serde(default)]
    pub allow_debug: bool,
    /// Accept guests that may be associated with a migration agent.
    #[serde(default)]
    pub allow_migration_agent: bool,
    /// Accept hosts with SMT enabled; absent: accepted.
    pub allow_smt: Option<bool>,
    /// Accepted VMPLs of the report's requester; absent: only VMPL 0.
    pub vmpls: Option<Vec<u32>>,
    /// Lowest accepted reported TCB, component by component.
    #[serde(default)]
    pub min_tcb: MinTcbSection,
    /// Lowest accepted guest SVN.
    #[serde(default)]
    pub min_guest_svn: u32,
    /// A directory of VCEKs (from AMD's KDS, and learnt from evidence) and CRLs (`*.crl`).
    pub vcek_cache_dir: Option<PathBuf>,
    /// Extra VCEK files (DER or PEM) to trust under the anchors.
    #[serde(default)]
    pub vcek_files: Vec<PathBuf>,
    /// CRL files (DER or PEM) from AMD's KDS.
    #[serde(default)]
    pub crl_files: Vec<PathBuf>,
    /// Refuse a report when no CRL for its product line is known.
    #[serde(default)]
    pub require_crl: bool,
    /// ARK certificates to trust instead of AMD's (tests, or pinning one product line).
    #[serde(default)]
    pub trust_anchors: Vec<PathBuf>,
    /// The guests accepted (`[[snp.allow]]`).
    #[serde(default)]
    pub allow: Vec<SnpAllow>,
}

/// The `[snp] min_tcb` table: minimum SPL of each component (default 0).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MinTcbSection {
    /// Minimum bootloader SPL.
    #[serde(default)]
    pub bootloader: u8,
    /// Minimum PSP OS (TEE) SPL.
    #[serde(default)]
    pub tee: u8,
    /// Minimum SNP firmware SPL.
    #[serde(default)]
    pub snp: u8,
    /// Minimum microcode SPL.
    #[serde(default)]
    pub microcode: u8,
    /// Minimum FMC SPL (Turin only).
    #[serde(default)]
    pub fmc: u8,
}

/// An accepted SEV-SNP guest (`[[snp.allow]]`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnpAllow {
    /// The launch measurement (48 bytes, hex).
    pub measurement: String,
    /// The guest policy (`"0x30000"` or a number); absent: any guest policy that passes the
    /// bit checks.
    pub guest_policy: Option<toml::Value>,
}

/// The INSECURE sim backend's key and allowed measurements.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimSection {
    /// The simulated platform's public key (hex, 33 bytes compressed).
    pub platform_public: String,
    /// The measurements accepted (`[[sim.allow]]`).
    #[serde(default)]
    pub allow: Vec<SimAllow>,
}

/// An accepted sim measurement (`[[sim.allow]]`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimAllow {
    /// The measurement (32 bytes, hex).
    pub measurement: String,
}

/// The `[hosts]` section.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostsSection {
    /// Capsule hosts must attest (under this same policy) before the leader sends them the
    /// job's server key.
    #[serde(default)]
    pub require_attestation: bool,
    /// INSECURE: the leader sends a capsule host its key even when it can authenticate it
    /// neither by attestation nor by the TLS key pinned for it (`psl up --init` pins one per
    /// host). Without it such a host is refused. Development only; warned about.
    #[serde(default)]
    pub allow_insecure_unauthenticated: bool,
}

/// Why a policy file was refused.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The file could not be read (missing, unreadable, or over `POLICY_BYTES_MAX`).
    #[error("reading the policy {path}: {why}")]
    Read {
        /// The policy file's path.
        path: String,
        /// The I/O error.
        why: String,
    },
    /// The file was read but refused: bad TOML, an unknown key or kind, a missing section,
    /// a malformed value, or a combination that makes no sense.
    #[error("policy {path}: {why}")]
    Invalid {
        /// The policy's path or origin.
        path: String,
        /// What is wrong with it.
        why: String,
    },
}

fn hex_n<const N: usize>(what: &str, s: &str) -> Result<[u8; N], String> {
    let mut out = [0u8; N];
    hex::decode_to_slice(s.trim(), &mut out)
        .map_err(|_| format!("{what} must be {} hex digits, got {:?}", 2 * N, s))?;
    Ok(out)
}

fn parse_u64(what: &str, v: &toml::Value) -> Result<u64, String> {
    match v {
        toml::Value::Integer(i) if *i >= 0 => Ok(*i as u64),
        toml::Value::String(s) => {
            let t = s.trim();
            let r = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
                Some(h) => u64::from_str_radix(h, 16),
                None => t.parse(),
            };
            r.map_err(|_| format!("{what}: {s:?} is not a number"))
        }
        _ => Err(format!("{what}: expected a number or a string like \"0x30000\"")),
    }
}

/// A policy, parsed and checked; paths resolved.
#[derive(Clone, Debug)]
pub struct Policy {
    /// The file as parsed.
    pub file: PolicyFile,
    /// The directory relative paths resolve against.
    pub base: PathBuf,
    /// The TEE kinds accepted (`sim` added when `allow_insecure_sim` is set).
    pub allowed_kinds: Vec<TeeKind>,
    /// Where it came from (for logs).
    pub origin: String,
}

impl Policy {
    /// Parses policy text; `base` resolves relative paths, `origin` names it in errors.
    pub fn parse(text: &str, base: &Path, origin: &str) -> Result<Policy, PolicyError> {
        let invalid = |why: String| PolicyError::Invalid { path: origin.into(), why };
        if text.len() > POLICY_BYTES_MAX {
            return Err(invalid(format!("{} bytes, over {POLICY_BYTES_MAX}", text.len())));
        }
        let file: PolicyFile = toml::from_str(text).map_err(|e| invalid(e.to_string().trim().to_string()))?;
        let mut allowed_kinds = Vec::new();
        for k in &file.allowed_kinds {
            let kind = TeeKind::parse(k)
                .ok_or_else(|| invalid(format!("allowed_kinds: unknown kind {k:?} (sgx, tdx, snp, sim)")))?;
            if !allowed_kinds.contains(&kind) {
                allowed_kinds.push(kind);
            }
        }
        if allowed_kinds.contains(&TeeKind::Sim) && !file.allow_insecure_sim {
            return Err(invalid(
                "allowed_kinds lists \"sim\", but the sim backend is INSECURE and is accepted only with \
                 allow_insecure_sim = true"
                    .into(),
            ));
        }
        if file.allow_insecure_sim && !allowed_kinds.contains(&TeeKind::Sim) {
            allowed_kinds.push(TeeKind::Sim);
        }
        if allowed_kinds.is_empty() {
            return Err(invalid("allowed_kinds is empty: the policy would accept nothing".into()));
        }
        let p = Policy { file, base: base.to_path_buf(), allowed_kinds, origin: origin.into() };
        // Every section of an allowed kind must be present and well-formed.
        for k in p.allowed_kinds.clone() {
            p.measurements(k).map_err(invalid)?;
        }
        if p.file.hosts.allow_insecure_unauthenticated {
            if p.file.hosts.require_attestation {
                return Err(invalid(
                    "[hosts] says both require_attestation = true and allow_insecure_unauthenticated = true".into(),
                ));
            }
            tracing::warn!(
                "attestation policy {origin}: [hosts] allow_insecure_unauthenticated = true: capsule hosts that are \
                 neither attested nor pinned get their keys (anyone answering at a host's address can take them); \
                 development only"
            );
        }
        if p.allowed_kinds.contains(&TeeKind::Sim) {
            crate::attest::warn_insecure_sim(&format!(
                "attestation policy {origin}: allow_insecure_sim = true: reports of the INSECURE sim backend are \
                 accepted (anyone holding the sim platform key can forge them); development only"
            ));
        }
        Ok(p)
    }

    /// Reads and parses a policy file (at most `POLICY_BYTES_MAX` bytes); relative paths resolve
    /// against its directory. `PolicyError::Read` if it cannot be read, `Invalid` if it is refused.
    pub fn load(path: &Path) -> Result<Policy, PolicyError> {
        let read = |why: String| PolicyError::Read { path: path.display().to_string(), why };
        let meta = std::fs::metadata(path).map_err(|e| read(e.to_string()))?;
        if meta.len() > POLICY_BYTES_MAX as u64 {
            return Err(read(format!("{} bytes, over {POLICY_BYTES_MAX}", meta.len())));
        }
        let text = std::fs::read_to_string(path).map_err(|e| read(e.to_string()))?;
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Policy::parse(&text, &base, &path.display().to_string())
    }

    /// A path from the file, resolved against its directory when relative.
    pub fn path(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.base.join(p)
        }
    }

    /// Whether reports of this TEE kind are accepted at all.
    pub fn allows(&self, kind: TeeKind) -> bool {
        self.allowed_kinds.contains(&kind)
    }

    /// Whether the INSECURE sim backend is accepted.
    pub fn allow_insecure_sim(&self) -> bool {
        self.file.allow_insecure_sim
    }

    /// Whether capsule hosts must attest before the leader sends them their key.
    pub fn require_host_attestation(&self) -> bool {
        self.file.hosts.require_attestation
    }

    /// `[hosts] allow_insecure_unauthenticated`: capsule hosts neither attested nor pinned get
    /// their keys (INSECURE).
    pub fn allow_unauthenticated_hosts(&self) -> bool {
        self.file.hosts.allow_insecure_unauthenticated
    }

    fn max_age_secs(&self) -> Option<u64> {
        self.file.collateral.max_age_days.map(|d| d.saturating_mul(86_400))
    }

    /// The allowed measurement digests of `kind`, and (SGX) each signer digest's minimum SVN.
    pub fn measurements(&self, kind: TeeKind) -> Result<(AttestPolicy, BTreeMap<Measurement, u16>), String> {
        let mut allowed = std::collections::BTreeSet::new();
        let mut min_svn = BTreeMap::new();
        let section_missing = |k: &str| format!("allowed_kinds lists {k:?} but there is no [{k}] section");
        let too_many = |n: usize, k: &str| {
            if n > ALLOW_ENTRIES_MAX {
                Err(format!("[[{k}.allow]]: {n} entries, over {ALLOW_ENTRIES_MAX}"))
            } else {
                Ok(())
            }
        };
        match kind {
            TeeKind::Sim => {
                let s = self.file.sim.as_ref().ok_or_else(|| section_missing("sim"))?;
                VerifyingKey::from_bytes(&hex::decode(s.platform_public.trim()).unwrap_or_default())
                    .map_err(|_| "[sim] platform_public is not a public key in hex".to_string())?;
                too_many(s.allow.len(), "sim")?;
                for a in &s.allow {
                    allowed.insert(Hash256(hex_n::<32>("[[sim.allow]] measurement", &a.measurement)?));
                }
            }
            TeeKind::Sgx => {
                let s = self.file.sgx.as_ref().ok_or_else(|| section_missing("sgx"))?;
                too_many(s.allow.len(), "sgx")?;
                for (i, a) in s.allow.iter().enumerate() {
                    match (&a.mrenclave, &a.mrsigner) {
                        (Some(e), None) => {
                            if a.isv_prod_id.is_some() || a.min_isv_svn.is_some() {
                                return Err(format!(
                                    "[[sgx.allow]] entry {i}: isv_prod_id and min_isv_svn go with mrsigner"
                                ));
                            }
                            allowed.insert(sgx_mrenclave(&hex_n::<32>("mrenclave", e)?));
                        }
                        (None, Some(s)) => {
                            let prod = a
                                .isv_prod_id
                                .ok_or_else(|| format!("[[sgx.allow]] entry {i}: mrsigner needs isv_prod_id"))?;
                            let d = sgx_mrsigner(&hex_n::<32>("mrsigner", s)?, prod);
                            allowed.insert(d);
                            min_svn.insert(d, a.min_isv_svn.unwrap_or(0));
                        }
                        _ => return Err(format!("[[sgx.allow]] entry {i}: give exactly one of mrenclave, mrsigner")),
                    }
                }
                if let Some(st) = &s.accepted_tcb_statuses {
                    tcb_statuses(st, "sgx")?;
                }
            }
            TeeKind::Tdx => {
                let s = self.file.tdx.as_ref().ok_or_else(|| section_missing("tdx"))?;
                too_many(s.allow.len(), "tdx")?;
                for a in &s.allow {
                    let r = |n: &str, v: &str| hex_n::<48>(n, v);
                    let (m, r0, r1, r2, r3) = (
                        r("mrtd", &a.mrtd)?,
                        r("rtmr0", &a.rtmr0)?,
                        r("rtmr1", &a.rtmr1)?,
                        r("rtmr2", &a.rtmr2)?,
                        r("rtmr3", &a.rtmr3)?,
                    );
                    allowed.insert(tdx_measurement(&m, [&r0, &r1, &r2, &r3]));
                }
                if let Some(st) = &s.accepted_tcb_statuses {
                    tcb_statuses(st, "tdx")?;
                }
            }
            TeeKind::Snp => {
                let s = self.file.snp.as_ref().ok_or_else(|| section_missing("snp"))?;
                too_many(s.allow.len(), "snp")?;
                for a in &s.allow {
                    let m = hex_n::<48>("[[snp.allow]] measurement", &a.measurement)?;
                    match &a.guest_policy {
                        Some(v) => allowed.insert(snp_measurement(&m, parse_u64("guest_policy", v)?)),
                        None => allowed.insert(snp_measurement_any_policy(&m)),
                    };
                }
            }
        }
        Ok((AttestPolicy { allowed }, min_svn))
    }
}

fn tcb_statuses(names: &[String], kind: &str) -> Result<Vec<dcap_qvl::TcbStatus>, String> {
    names
        .iter()
        .map(|n| tcb_status_by_name(n).ok_or_else(|| format!("[{kind}] accepted_tcb_statuses: unknown status {n:?}")))
        .collect()
}

/// Verifies any evidence the policy allows: routes it to its backend's verifier, after
/// checking that its kind is allowed at all.
pub struct PolicyVerifier {
    policy: Policy,
    sim: Option<SimVerifier>,
    sgx: Option<DcapVerifier>,
    tdx: Option<DcapVerifier>,
    snp: Option<SnpVerifier>,
}

/// How a [`PolicyVerifier`] gets DCAP collateral, if not as the policy says (tests, `psl attest
/// verify --collateral FILE`).
pub enum CollateralOverride {
    /// Collateral as the policy's `[collateral]` section says.
    None,
    /// This collateral source instead.
    Source(Arc<dyn CollateralSource>),
}

impl PolicyVerifier {
    /// The verifier of `policy` at `time`.
    pub fn new(policy: Policy, time: VerifyTime) -> Result<PolicyVerifier, PolicyError> {
        PolicyVerifier::with_collateral(policy, time, CollateralOverride::None)
    }

    /// A verifier for the policy, with DCAP collateral from `collateral` instead of the policy's
    /// own source if given; `PolicyError::Invalid` if a section cannot be turned into a verifier.
    pub fn with_collateral(
        policy: Policy,
        time: VerifyTime,
        collateral: CollateralOverride,
    ) -> Result<PolicyVerifier, PolicyError> {
        let invalid = |why: String| PolicyError::Invalid { path: policy.origin.clone(), why };
        let sim = if policy.allows(TeeKind::Sim) {
            let s = policy.file.sim.as_ref().expect("checked when parsed");
            let pk = VerifyingKey::from_bytes(&hex::decode(s.platform_public.trim()).unwrap_or_default())
                .map_err(|_| invalid("[sim] platform_public".into()))?;
            Some(SimVerifier::new(pk, policy.measurements(TeeKind::Sim).map_err(invalid)?.0))
        } else {
            None
        };
        let dcap_source: Option<Arc<dyn CollateralSource>> =
            if policy.allows(TeeKind::Sgx) || policy.allows(TeeKind::Tdx) {
                Some(match collateral {
                    CollateralOverride::Source(s) => s,
                    CollateralOverride::None => dcap_collateral(&policy).map_err(invalid)?,
                })
            } else {
                None
            };
        let dcap = |kind: TeeKind,
                    statuses: &Option<Vec<String>>,
                    allow_debug: bool|
         -> Result<DcapVerifier, PolicyError> {
            let (allowed, min_isv_svn) = policy.measurements(kind).map_err(invalid)?;
            let accepted = match statuses {
                Some(s) => tcb_statuses(s, kind.as_str()).map_err(invalid)?,
                None => default_accepted(),
            };
            let p =
                DcapPolicy { allowed, min_isv_svn, accepted, allow_debug, max_age_secs: policy.max_age_secs(), time };
            Ok(DcapVerifier::new(p, dcap_source.clone().expect("set when SGX or TDX is allowed")))
        };
        let sgx = match (&policy.file.sgx, policy.allows(TeeKind::Sgx)) {
            (Some(s), true) => Some(dcap(TeeKind::Sgx, &s.accepted_tcb_statuses, s.allow_debug)?),
            _ => None,
        };
        let tdx = match (&policy.file.tdx, policy.allows(TeeKind::Tdx)) {
            (Some(s), true) => Some(dcap(TeeKind::Tdx, &s.accepted_tcb_statuses, s.allow_debug)?),
            _ => None,
        };
        let snp = match (&policy.file.snp, policy.allows(TeeKind::Snp)) {
            (Some(s), true) => {
                let anchors = if s.trust_anchors.is_empty() {
                    SnpTrustAnchors::amd()
                } else {
                    let mut ders = Vec::new();
                    for p in &s.trust_anchors {
                        let p = policy.path(p);
                        ders.push(
                            std::fs::read(&p).map_err(|e| invalid(format!("trust anchor {}: {e}", p.display())))?,
                        );
                    }
                    SnpTrustAnchors::from_ders(&ders).map_err(|e| invalid(e.to_string()))?
                };
                let mut coll = match &s.vcek_cache_dir {
                    Some(d) => SnpCollateral::with_dir(&policy.path(d)).map_err(|e| invalid(e.to_string()))?,
                    None => SnpCollateral::new(),
                };
                for f in &s.vcek_files {
                    coll.add_vcek_file(&policy.path(f)).map_err(|e| invalid(e.to_string()))?;
                }
                for f in &s.crl_files {
                    coll.add_crl_file(&policy.path(f)).map_err(|e| invalid(e.to_string()))?;
                }
                let m = &s.min_tcb;
                let sp = SnpPolicy {
                    allowed: policy.measurements(TeeKind::Snp).map_err(invalid)?.0,
                    allow_debug: s.allow_debug,
                    allow_migration_agent: s.allow_migration_agent,
                    allow_smt: s.allow_smt.unwrap_or(true),
                    vmpls: s.vmpls.clone().unwrap_or_else(|| vec![0]),
                    min_tcb: MinTcb {
                        bootloader: m.bootloader,
                        tee: m.tee,
                        snp: m.snp,
                        microcode: m.microcode,
                        fmc: m.fmc,
                    },
                    min_guest_svn: s.min_guest_svn,
                    require_crl: s.require_crl,
                    crl_max_age_secs: policy.max_age_secs(),
                    time,
                };
                Some(SnpVerifier::new(sp, anchors, Arc::new(coll)))
            }
            _ => None,
        };
        Ok(PolicyVerifier { policy, sim, sgx, tdx, snp })
    }

    /// The policy it enforces.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }
}

/// The DCAP collateral source the policy names: a PCCS (with its cache) or a fixed file.
fn dcap_collateral(policy: &Policy) -> Result<Arc<dyn CollateralSource>, String> {
    let c = &policy.file.collateral;
    match (&c.pccs_url, &c.file) {
        (Some(_), Some(_)) => Err("[collateral]: give pccs_url or file, not both".into()),
        (None, Some(f)) => {
            let p = policy.path(f);
            let b = std::fs::read(&p).map_err(|e| format!("[collateral] file {}: {e}", p.display()))?;
            Ok(Arc::new(StaticCollateral::from_json(&b).map_err(|e| format!("{}: {e}", p.display()))?))
        }
        (Some(url), None) => {
            let mut client = crate::attest_pccs::PccsClient::new(url).map_err(|e| e.to_string())?;
            if let Some(ca) = &c.pccs_ca {
                client = client.with_ca_file(&policy.path(ca)).map_err(|e| e.to_string())?;
            }
            let cache = crate::attest_pccs::PccsCollateral::new(
                client,
                c.cache_dir.as_ref().map(|d| policy.path(d)),
                c.cache_max_secs.unwrap_or(crate::attest_pccs::CACHE_MAX_SECS_DEFAULT),
            );
            Ok(Arc::new(cache))
        }
        (None, None) => Ok(Arc::new(NoCollateral)),
    }
}

impl AttestVerifier for PolicyVerifier {
    fn verify_explained(
        &self,
        evidence: &Evidence,
        expect: &Expected,
        log: &mut CheckLog,
    ) -> Result<VerifiedReport, AttestError> {
        let kind = match evidence.backend {
            SIM_BACKEND => TeeKind::Sim,
            SNP_BACKEND => TeeKind::Snp,
            DCAP_BACKEND => {
                let id = crate::attest_dcap::inspect(&evidence.bytes).map_err(|e| log.fail("format", e))?;
                id.kind
            }
            other => {
                return Err(log.fail("backend", AttestError::Malformed(format!("unknown evidence backend {other:?}"))))
            }
        };
        if kind == TeeKind::Sim && !self.policy.allow_insecure_sim() {
            return Err(log.fail("kind allowed", AttestError::InsecureSim));
        }
        if !self.policy.allows(kind) {
            return Err(log.fail("kind allowed", AttestError::KindNotAllowed(kind.as_str().into())));
        }
        log.pass(
            "kind allowed",
            if kind == TeeKind::Sim {
                "sim: INSECURE, accepted only because the policy says allow_insecure_sim = true".to_string()
            } else {
                format!("{kind} is in allowed_kinds of {}", self.policy.origin)
            },
        );
        let v: &dyn AttestVerifier = match kind {
            TeeKind::Sim => self.sim.as_ref().map(|v| v as &dyn AttestVerifier),
            TeeKind::Sgx => self.sgx.as_ref().map(|v| v as &dyn AttestVerifier),
            TeeKind::Tdx => self.tdx.as_ref().map(|v| v as &dyn AttestVerifier),
            TeeKind::Snp => self.snp.as_ref().map(|v| v as &dyn AttestVerifier),
        }
        .ok_or_else(|| {
            log.fail("kind allowed", AttestError::KindNotAllowed(format!("{kind} (no [{kind}] section)")))
        })?;
        let r = v.verify_explained(evidence, expect, log)?;
        if kind == TeeKind::Sim {
            crate::attest::warn_insecure_sim("accepted a report of the INSECURE sim backend (the policy allows it)");
        }
        Ok(r)
    }
}

/// The text of a development policy that accepts the INSECURE sim backend for the given
/// platform key and measurements (what `psl up` writes when it runs with `--attest sim`).
pub fn dev_sim_policy_text(
    platform_public_hex: &str,
    measurements: &[Measurement],
    require_host_attestation: bool,
) -> String {
    let mut s = String::from(
        "# GENERATED DEVELOPMENT POLICY - INSECURE.\n\
         # It accepts reports of the simulated attestation backend 'sim', which anyone holding the\n\
         # sim platform key can forge. Never use it where the keys matter: on real hardware write a\n\
         # policy with `psl attest measure` (see docs/security/attestation.md).\n\
         allowed_kinds = [\"sim\"]\n\
         allow_insecure_sim = true\n\n",
    );
    s.push_str(&format!(
        "[hosts]\n# Capsule hosts that do not attest must present the TLS key pinned for them (psl up pins the\n\
         # keys it makes); allow_insecure_unauthenticated = true would accept any (INSECURE).\n\
         require_attestation = {require_host_attestation}\n\n"
    ));
    s.push_str(&format!("[sim]\nplatform_public = \"{platform_public_hex}\"\n"));
    for m in measurements {
        s.push_str(&format!("\n[[sim.allow]]\nmeasurement = \"{m}\"\n"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(t: &str) -> Result<Policy, PolicyError> {
        Policy::parse(t, Path::new("/"), "test")
    }

    #[test]
    fn sim_needs_the_words_that_cannot_be_mistaken() {
        let pk = psl_crypto::SigningKey::from_bytes(&[7; 32]).unwrap().verifying_key();
        let pk = hex::encode(pk.to_bytes());
        let with = dev_sim_policy_text(&pk, &[Hash256([1; 32])], false);
        let p = parse(&with).unwrap();
        assert!(p.allows(TeeKind::Sim));
        let without = with.replace("allow_insecure_sim = true", "allow_insecure_sim = false");
        let e = parse(&without).unwrap_err().to_string();
        assert!(e.contains("allow_insecure_sim = true"), "{e}");
        // Without allowed_kinds listing sim, allow_insecure_sim alone still says it in words.
        let only_flag = with.replace("allowed_kinds = [\"sim\"]\n", "");
        assert!(parse(&only_flag).unwrap().allows(TeeKind::Sim));
        // A policy of hardware kinds never accepts sim evidence.
        let hw = format!(
            "allowed_kinds = [\"snp\"]\n[snp]\n[[snp.allow]]\nmeasurement = \"{}\"\n[sim]\nplatform_public = \"{pk}\"\n",
            "ab".repeat(48)
        );
        let v = PolicyVerifier::new(parse(&hw).unwrap(), VerifyTime::Now).unwrap();
        let platform = crate::attest::SimPlatform::from_secret(&[7; 32]).unwrap();
        let ev = crate::attest::SimAttester::new(platform, Hash256([1; 32]));
        let ev = crate::attest::Attester::attest(&ev, &[0; 32], &[0; 32]).unwrap();
        assert_eq!(v.verify(&ev, &[0; 32], &[0; 32]), Err(AttestError::InsecureSim));
    }

    #[test]
    fn unauthenticated_capsule_hosts_are_allowed_only_in_words() {
        let pk = psl_crypto::SigningKey::from_bytes(&[7; 32]).unwrap().verifying_key();
        let text = dev_sim_policy_text(&hex::encode(pk.to_bytes()), &[Hash256([1; 32])], false);
        let p = parse(&text).unwrap();
        assert!(!p.require_host_attestation() && !p.allow_unauthenticated_hosts(), "the default refuses them");
        let insecure = text.replace("[hosts]\n", "[hosts]\nallow_insecure_unauthenticated = true\n");
        assert!(parse(&insecure).unwrap().allow_unauthenticated_hosts());
        let both = insecure.replace("require_attestation = false", "require_attestation = true");
        let e = parse(&both).unwrap_err().to_string();
        assert!(e.contains("both"), "{e}");
    }

    #[test]
    fn malformed_policies_are_refused_with_a_reason() {
        for (text, why) in [
            ("allowed_kinds = []", "accept nothing"),
            ("allowed_kinds = [\"tpm\"]", "unknown kind"),
            ("allowed_kinds = [\"tdx\"]", "no [tdx] section"),
            ("allowed_kinds = [\"tdx\"]\n[tdx]\n[[tdx.allow]]\nmrtd = \"00\"\nrtmr0 = \"\"\nrtmr1 = \"\"\nrtmr2 = \"\"\nrtmr3 = \"\"", "mrtd must be 96 hex"),
            ("allowed_kinds = [\"sgx\"]\n[sgx]\nbogus = 1", "unknown field"),
            ("allowed_kinds = [\"sgx\"]\n[sgx]\naccepted_tcb_statuses = [\"Fine\"]", "unknown status"),
            ("allowed_kinds = [\"snp\"]\n[snp]\n[[snp.allow]]\nmeasurement = \"zz\"", "96 hex"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(why), "{text:?}: {e}");
        }
        let sgx = format!("allowed_kinds = [\"sgx\"]\n[sgx]\n[[sgx.allow]]\nmrsigner = \"{}\"\n", "aa".repeat(32));
        assert!(parse(&sgx).unwrap_err().to_string().contains("isv_prod_id"));
    }

    #[test]
    fn snp_guest_policy_numbers() {
        let m = "cd".repeat(48);
        let t = format!(
            "allowed_kinds = [\"snp\"]\n[snp]\n[[snp.allow]]\nmeasurement = \"{m}\"\nguest_policy = \"0x30000\"\n[[snp.allow]]\nmeasurement = \"{m}\"\nguest_policy = 196608\n"
        );
        let (a, _) = parse(&t).unwrap().measurements(TeeKind::Snp).unwrap();
        assert_eq!(a.allowed.len(), 1, "both spell the same policy");
        assert!(a.allowed.contains(&snp_measurement(&[0xcd; 48], 0x30000)));
    }
}
