//! `psl attest`: measurements for a policy, and offline verification of evidence with an
//! explanation of every check. Also the `--attest` flags the roles share ([`AttestArgs`]) and
//! the evidence `psl capsule-server` and `psl memcached` publish ([`PublishArgs`]).
//!
//! - `psl attest measure` prints the `[[<kind>.allow]]` policy entries of: this build under the
//!   sim backend (no arguments); a Gramine enclave (`--gramine-sig psl.sig`, the SIGSTRUCT
//!   `gramine-sgx-sign` wrote); a quote or report taken on the reference machine (`--evidence
//!   FILE`); or a report taken here and now (`--attest tdx|snp|sgx|auto`).
//! - `psl attest verify EVIDENCE --policy FILE [--at TIME]` verifies a quote (SGX, TDX), an
//!   SEV-SNP report (raw, hex, or PSL's envelope; `--vcek`, `--chain` add certificates), a sim
//!   report, or a file `psl capsule-server`/`psl memcached --attest` published, under the policy,
//!   at a time, and prints every check; exit 0 only if it verifies.

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use psl_faas::attest::{
    binary_hash, bind_channel_key, parse_time, AttestVerifier, Attester, CheckLog, Evidence, Expected, Measurement,
    SimAttester, TeeKind, VerifyTime, SIM_BACKEND,
};
use psl_faas::attest_dcap::{StaticCollateral, DCAP_BACKEND};
use psl_faas::attest_policy::{CollateralOverride, Policy, PolicyVerifier};
use psl_faas::attest_select::{open_hardware, AttestChoice, HwPaths};
use psl_faas::attest_snp::{
    encode_evidence, SnpReport, TableEntry, GUID_ARK, GUID_ASK, GUID_VCEK, SNP_BACKEND, SNP_REPORT_LEN,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub const INSECURE: &str = "WARNING: attestation uses the simulated backend 'sim', which is INSECURE: anyone holding the sim platform key file can forge reports. Never use it in production.";

/// Prints `line` on stderr if it is this process's first warning about the INSECURE sim backend,
/// else logs it at debug: one sim warning per process (`PSL_LOG=debug` shows the others).
pub fn warn_sim_once(line: &str) {
    if psl_faas::attest::claim_insecure_sim_warning() {
        eprintln!("{line}");
    } else {
        tracing::debug!("{line}");
    }
}

/// The sim platform's key from its file (hex): what signs and checks `--attest sim` reports.
pub fn read_platform(path: &Path) -> Result<Arc<psl_faas::attest::SimPlatform>> {
    let text = zeroize::Zeroizing::new(
        std::fs::read_to_string(path).with_context(|| format!("reading the sim platform key {}", path.display()))?,
    );
    let mut secret = zeroize::Zeroizing::new([0u8; 32]);
    hex::decode_to_slice(text.trim(), &mut secret[..])
        .with_context(|| format!("{} is not 64 hex characters", path.display()))?;
    Ok(psl_faas::attest::SimPlatform::from_secret(&secret)?)
}

/// This binary's measurement running the default sandbox configuration.
pub fn measurement(binary: Option<&str>) -> Result<psl_faas::attest::Measurement> {
    let b = match binary {
        Some(h) => psl_crypto::Hash256(
            hex::decode(h).ok().and_then(|v| v.try_into().ok()).context("--sim-binary-hash is not 32 bytes of hex")?,
        ),
        None => psl_faas::attest::binary_hash(),
    };
    Ok(psl_faas::attest::measure(&b, &psl_faas::deploy::runtime_config(&psl_sandbox::SandboxLimits::default())))
}

/// How a role proves what it runs (`--attest`), and where the hardware interfaces are.
#[derive(Args, Debug, Clone)]
pub struct AttestArgs {
    /// The attestation backend: `sim` (INSECURE, development only; needs --sim-platform-key),
    /// `sgx` (Gramine's /dev/attestation), `tdx` or `snp` (Linux configfs-tsm), or `auto`
    /// (whichever hardware is present; never sim).
    #[arg(long, value_name = "sim|sgx|tdx|snp|auto")]
    pub attest: Option<AttestChoice>,
    /// The configfs-tsm root (tdx, snp).
    #[arg(long, default_value = psl_faas::attest_tsm::TSM_ROOT_DEFAULT)]
    pub tsm_root: PathBuf,
    /// The configfs-tsm report entry to use (default: `psl-PID`, created and removed).
    #[arg(long)]
    pub tsm_entry: Option<String>,
    /// Gramine's attestation directory (sgx).
    #[arg(long, default_value = psl_faas::attest_gramine::GRAMINE_DIR_DEFAULT)]
    pub gramine_dir: PathBuf,
    /// The simulated platform's secret key file (64 hex characters); `--attest sim` only.
    #[arg(long)]
    pub sim_platform_key: Option<PathBuf>,
    /// The binary hash the sim measurement is made from, as measured by the parent (`psl up`),
    /// so that every child does not re-read the binary; default: hash this binary. (The sim
    /// backend's measurement is self-declared anyway; hardware backends measure in hardware.)
    #[arg(long, hide = true)]
    pub sim_binary_hash: Option<String>,
}

impl AttestArgs {
    pub fn paths(&self) -> HwPaths {
        HwPaths {
            tsm_root: self.tsm_root.clone(),
            tsm_entry: self.tsm_entry.clone(),
            gramine_dir: self.gramine_dir.clone(),
        }
    }

    /// The attester `--attest` names (`None` if not given). Says on stderr what it chose; the
    /// sim backend with its INSECURE warning. `sim_measurement` is what a sim report claims.
    pub fn open(
        &self,
        role: &str,
        sim_measurement: impl FnOnce() -> Result<Measurement>,
    ) -> Result<Option<Box<dyn Attester>>> {
        let Some(choice) = self.attest else { return Ok(None) };
        if choice == AttestChoice::Sim {
            warn_sim_once(INSECURE);
            let key = self
                .sim_platform_key
                .as_ref()
                .context("--attest sim needs --sim-platform-key (the deployment's simulated platform key file)")?;
            let platform = read_platform(key)?;
            let a = SimAttester::new(platform, sim_measurement()?);
            eprintln!("{role}: attestation: {}", a.describe());
            return Ok(Some(Box::new(a)));
        }
        if self.sim_platform_key.is_some() {
            bail!("--sim-platform-key goes with --attest sim only");
        }
        let (a, said) = open_hardware(choice, &self.paths()).map_err(|e| anyhow::anyhow!("{role}: {e}"))?;
        eprintln!("{role}: {said}");
        tracing::info!("{role}: {said}");
        Ok(Some(a))
    }

    /// [`AttestArgs::open`] for a role that must attest.
    pub fn open_required(
        &self,
        role: &str,
        sim_measurement: impl FnOnce() -> Result<Measurement>,
    ) -> Result<Box<dyn Attester>> {
        self.open(role, sim_measurement)?.with_context(|| {
            format!("psl {role} needs --attest sim|sgx|tdx|snp|auto (sim is INSECURE, for development)")
        })
    }
}

/// Loads the policy file and builds its verifier, saying so when it accepts the sim backend.
pub fn load_policy(path: &Path, role: &str) -> Result<PolicyVerifier> {
    let p = Policy::load(path)?;
    if p.allow_insecure_sim() {
        warn_sim_once(&format!(
            "WARNING: {role}: the attestation policy {} says allow_insecure_sim = true: reports of the INSECURE sim \
             backend are accepted (development only)",
            path.display()
        ));
    }
    if p.allow_unauthenticated_hosts() {
        eprintln!(
            "WARNING: {role}: the attestation policy {} says [hosts] allow_insecure_unauthenticated = true: capsule \
             hosts that are neither attested nor pinned get their keys, INSECURE (development only)",
            path.display()
        );
    }
    Ok(PolicyVerifier::new(p, VerifyTime::Now)?)
}

/// `--attest` for roles that publish their evidence instead of being checked by a leader.
#[derive(Args, Debug, Clone)]
pub struct PublishArgs {
    #[command(flatten)]
    pub attest: AttestArgs,
    /// With --attest: write the evidence (a report binding this role's public key) here, for
    /// `psl attest verify FILE --policy P`. Default: print it on stdout as an `attested` line.
    #[arg(long, requires = "attest")]
    pub attest_evidence_out: Option<PathBuf>,
}

/// What `psl capsule-server` / `psl memcached --attest` publish.
#[derive(serde::Serialize, serde::Deserialize, Debug)]
pub struct Published {
    pub role: String,
    pub backend: String,
    pub evidence: String,
    /// What the report data commits to, and its hash (the report data's first half).
    pub binds: String,
    pub report_data: String,
    /// `SHA-256("psl/published/v1" ‖ published_at as u64 LE)`: not a challenge (nobody asked),
    /// it dates the report.
    pub nonce: String,
    pub published_at: u64,
}

/// Takes a report binding `public` (described by `what`) and publishes it as `--attest-evidence-out`
/// says. Nothing in the KV deployment checks these: they are for operators and clients
/// (see docs/security/attestation.md).
pub fn publish(a: &PublishArgs, role: &str, what: &str, public: &[u8]) -> Result<()> {
    let Some(att) = a.attest.open(role, || measurement(a.attest.sim_binary_hash.as_deref()))? else {
        return Ok(());
    };
    let now = VerifyTime::Now.unix_secs();
    let nonce = psl_crypto::sha256(&[b"psl/published/v1", &now.to_le_bytes()]).0;
    let rd = bind_channel_key(public);
    let ev = att.attest(&nonce, &rd)?;
    let p = Published {
        role: role.into(),
        backend: ev.backend.into(),
        evidence: hex::encode(&ev.bytes),
        binds: format!("{what} {}", hex::encode(public)),
        report_data: hex::encode(rd),
        nonce: hex::encode(nonce),
        published_at: now,
    };
    let text = serde_json::to_string(&p)?;
    match &a.attest_evidence_out {
        Some(path) => {
            crate::util::write_atomic(path, text.as_bytes(), 0o644)?;
            eprintln!("{role}: evidence ({}) binding its {what} written to {}", att.kind(), path.display());
        }
        None => println!("attested {text}"),
    }
    Ok(())
}

#[derive(Subcommand, Debug)]
pub enum AttestCmd {
    /// Print the policy entries (`[[<kind>.allow]]`) of a build, a Gramine enclave or a report.
    Measure(MeasureArgs),
    /// Verify a quote or report offline under a policy, explaining every check.
    Verify(VerifyArgs),
}

#[derive(Args, Debug)]
pub struct MeasureArgs {
    /// A Gramine SIGSTRUCT (`psl.sig` from `gramine-sgx-sign`): the enclave's MRENCLAVE and signer.
    #[arg(long, conflicts_with_all = ["evidence", "attest"])]
    pub gramine_sig: Option<PathBuf>,
    /// A quote or report taken on the reference machine (same formats as `psl attest verify`).
    #[arg(long, conflicts_with = "attest")]
    pub evidence: Option<PathBuf>,
    #[command(flatten)]
    pub hw: AttestArgs,
}

#[derive(Args, Debug)]
pub struct VerifyArgs {
    /// The evidence: a DCAP quote (binary), an SEV-SNP report (binary, hex, or PSL's `snp`
    /// envelope), a sim report, or a file published by `--attest-evidence-out`.
    pub evidence: PathBuf,
    /// The policy file.
    #[arg(long)]
    pub policy: PathBuf,
    /// Verification time: RFC 3339 (`2025-06-20T00:00:00Z`, `2025-06-20`) or Unix seconds;
    /// default now.
    #[arg(long)]
    pub at: Option<String>,
    /// DCAP collateral (JSON) instead of the policy's source.
    #[arg(long)]
    pub collateral: Option<PathBuf>,
    /// SEV-SNP: the VCEK (DER or PEM) to add to a bare report.
    #[arg(long)]
    pub vcek: Option<PathBuf>,
    /// SEV-SNP: the ASK and ARK (PEM, AMD's `cert_chain`) to add to a bare report.
    #[arg(long)]
    pub chain: Option<PathBuf>,
    /// The 32 bytes (hex) the report data must commit to (the channel key's hash).
    #[arg(long)]
    pub report_data: Option<String>,
    /// The 32-byte nonce (hex) the report must carry.
    #[arg(long)]
    pub nonce: Option<String>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

pub fn run(c: AttestCmd) -> Result<i32> {
    match c {
        AttestCmd::Measure(a) => measure(a),
        AttestCmd::Verify(a) => verify(a),
    }
}

fn hex32(what: &str, s: &str) -> Result<[u8; 32]> {
    let mut b = [0u8; 32];
    hex::decode_to_slice(s.trim(), &mut b).with_context(|| format!("{what} must be 64 hex digits"))?;
    Ok(b)
}

/// Reads evidence in any of the accepted forms; SNP certificates from `vcek`/`chain` are added to
/// a bare report. Returns the evidence and, for a published file, what it says it binds.
fn read_evidence(path: &Path, vcek: Option<&Path>, chain: Option<&Path>) -> Result<(Evidence, Option<Published>)> {
    let raw = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    if raw.len() > 4 << 20 {
        bail!("{} is over 4 MiB", path.display());
    }
    if let Ok(p) = serde_json::from_slice::<Published>(&raw) {
        let backend = psl_faas::attest::backend_by_name(&p.backend)
            .with_context(|| format!("unknown evidence backend {:?}", p.backend))?;
        let bytes = hex::decode(&p.evidence).context("the published evidence is not hex")?;
        return Ok((Evidence { backend, bytes }, Some(p)));
    }
    // Hex text (as `report_milan.hex`), else the bytes themselves.
    let text = std::str::from_utf8(&raw).ok().map(|t| t.split_whitespace().collect::<String>());
    let bytes = match text.as_deref().map(hex::decode) {
        Some(Ok(b)) if !b.is_empty() => b,
        _ => raw,
    };
    let ev = if bytes.starts_with(psl_faas::attest_snp::ENVELOPE_MAGIC) {
        if vcek.is_some() || chain.is_some() {
            bail!("--vcek / --chain go with a bare SNP report; this evidence carries its certificates");
        }
        Evidence { backend: SNP_BACKEND, bytes }
    } else if bytes.len() == SNP_REPORT_LEN && SnpReport::parse(&bytes).is_ok() {
        let mut certs = Vec::new();
        if let Some(v) = vcek {
            let b = std::fs::read(v).with_context(|| format!("reading {}", v.display()))?;
            let c = psl_faas::attest_snp::Cert::from_der_or_pem(&b)?;
            certs.push(TableEntry { guid: GUID_VCEK, data: c.der });
        }
        if let Some(ch) = chain {
            let b = std::fs::read(ch).with_context(|| format!("reading {}", ch.display()))?;
            for p in pem::parse_many(&b).with_context(|| format!("{}: not PEM", ch.display()))? {
                let c = psl_faas::attest_snp::Cert::from_der(p.contents())?;
                let guid = if c.cn().starts_with("ARK-") { GUID_ARK } else { GUID_ASK };
                certs.push(TableEntry { guid, data: c.der });
            }
        }
        Evidence { backend: SNP_BACKEND, bytes: encode_evidence(&bytes, &certs) }
    } else if bytes.starts_with(b"PSLSIMR1") {
        Evidence { backend: SIM_BACKEND, bytes }
    } else {
        Evidence { backend: DCAP_BACKEND, bytes }
    };
    Ok((ev, None))
}

fn verify(a: VerifyArgs) -> Result<i32> {
    let t = match &a.at {
        Some(s) => {
            VerifyTime::At(parse_time(s).with_context(|| format!("--at {s:?}: give RFC 3339 (UTC) or Unix seconds"))?)
        }
        None => VerifyTime::Now,
    };
    let policy = Policy::load(&a.policy)?;
    let coll = match &a.collateral {
        Some(p) => {
            let b = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
            CollateralOverride::Source(Arc::new(StaticCollateral::from_json(&b)?))
        }
        None => CollateralOverride::None,
    };
    let v = PolicyVerifier::with_collateral(policy, t, coll)?;
    let (ev, published) = read_evidence(&a.evidence, a.vcek.as_deref(), a.chain.as_deref())?;
    let mut expect = Expected {
        nonce: a.nonce.as_deref().map(|n| hex32("--nonce", n)).transpose()?,
        report_data: a.report_data.as_deref().map(|r| hex32("--report-data", r)).transpose()?,
    };
    if let Some(p) = &published {
        // The file says what the report binds; check that the report does bind it.
        let public = p.binds.rsplit(' ').next().and_then(|h| hex::decode(h).ok()).context("bad binds field")?;
        let rd = bind_channel_key(&public);
        if hex::encode(rd) != p.report_data {
            bail!("the published file's report_data is not the hash of what it says it binds");
        }
        let nonce = psl_crypto::sha256(&[b"psl/published/v1", &p.published_at.to_le_bytes()]).0;
        expect.report_data.get_or_insert(rd);
        expect.nonce.get_or_insert(nonce);
    }
    let mut log = CheckLog::default();
    let r = v.verify_explained(&ev, &expect, &mut log);
    let when = match t {
        VerifyTime::At(s) => psl_faas::attest::fmt_utc(s),
        VerifyTime::Now => format!("now ({})", psl_faas::attest::fmt_utc(VerifyTime::Now.unix_secs())),
    };
    if a.json {
        let checks = checks_json(&log);
        let mut o = serde_json::json!({"evidence": a.evidence.display().to_string(), "backend": ev.backend, "policy": a.policy.display().to_string(), "at": when, "checks": checks, "verified": r.is_ok()});
        match &r {
            Ok(v) => {
                o["kind"] = v.kind.as_str().into();
                o["measurement"] = v.measurement.to_hex().into();
            }
            Err(e) => o["refused"] = e.to_string().into(),
        }
        if let Some(p) = &published {
            o["role"] = p.role.clone().into();
            o["binds"] = p.binds.clone().into();
        }
        println!("{o}");
    } else {
        println!(
            "evidence {} ({} bytes, backend {}), policy {}, at {when}",
            a.evidence.display(),
            ev.bytes.len(),
            ev.backend,
            a.policy.display()
        );
        if let Some(p) = &published {
            println!("published by {} at {}; binds {}", p.role, psl_faas::attest::fmt_utc(p.published_at), p.binds);
        }
        print!("{}", log.render());
        match &r {
            Ok(v) => println!("VERIFIED: {} measurement {}", v.kind, v.measurement),
            Err(e) => println!("REFUSED: {e}"),
        }
    }
    Ok(if r.is_ok() { 0 } else { 1 })
}

/// A verification's checks as JSON: `{"check", "status": "pass"|"fail"|"skipped", "detail"}`
/// each (`psl attest verify --json`, `psl verify --json`).
pub(crate) fn checks_json(log: &CheckLog) -> Vec<serde_json::Value> {
    log.checks
        .iter()
        .map(|c| serde_json::json!({"check": c.name, "status": format!("{:?}", c.status).to_lowercase(), "detail": c.detail}))
        .collect()
}

fn measure(a: MeasureArgs) -> Result<i32> {
    if let Some(sig) = &a.gramine_sig {
        let b = std::fs::read(sig).with_context(|| format!("reading {}", sig.display()))?;
        let s = psl_faas::attest_gramine::Sigstruct::parse(&b)?;
        if s.debug {
            eprintln!("WARNING: this enclave is signed as a DEBUG enclave: a policy refuses it unless [sgx] allow_debug = true");
        }
        println!("# Gramine enclave {} (MRENCLAVE: this exact build and manifest)", sig.display());
        println!("[[sgx.allow]]\nmrenclave = \"{}\"\n", hex::encode(s.mrenclave));
        println!("# or: any enclave of this signer and product, from this SVN on");
        println!(
            "[[sgx.allow]]\nmrsigner = \"{}\"\nisv_prod_id = {}\nmin_isv_svn = {}",
            hex::encode(s.mrsigner),
            s.isv_prod_id,
            s.isv_svn
        );
        return Ok(0);
    }
    let ev = if let Some(p) = &a.evidence {
        Some(read_evidence(p, None, None)?.0)
    } else if a.hw.attest.is_some() {
        let att = a.hw.open("attest measure", || measurement(None))?.expect("--attest given");
        Some(att.attest(&[0; 32], &[0; 32])?)
    } else {
        None
    };
    let Some(ev) = ev else {
        let bin = binary_hash();
        let m = measurement(None)?;
        eprintln!(
            "This build under the INSECURE sim backend (binary SHA-256 {}, default sandbox limits). On hardware the \
             measurement is the TEE's: use --gramine-sig, --evidence or --attest.",
            bin.to_hex()
        );
        println!("[[sim.allow]]\nmeasurement = \"{m}\"");
        return Ok(0);
    };
    print_policy_entries(&ev)?;
    Ok(0)
}

/// The `[[<kind>.allow]]` entries that admit `ev`'s measurement.
fn print_policy_entries(ev: &Evidence) -> Result<()> {
    match ev.backend {
        DCAP_BACKEND => {
            let id = psl_faas::attest_dcap::inspect(&ev.bytes)?;
            if id.debug {
                eprintln!("WARNING: a DEBUG {}: a policy refuses it unless allow_debug = true", id.kind);
            }
            let reg = |k: &str| id.registers.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone()).unwrap_or_default();
            match id.kind {
                TeeKind::Sgx => {
                    println!("[[sgx.allow]]\nmrenclave = \"{}\"\n", reg("mrenclave"));
                    println!("# or: any enclave of this signer and product, from this SVN on");
                    println!(
                        "[[sgx.allow]]\nmrsigner = \"{}\"\nisv_prod_id = {}\nmin_isv_svn = {}",
                        reg("mrsigner"),
                        reg("isv_prod_id"),
                        reg("isv_svn")
                    );
                }
                _ => println!(
                    "[[tdx.allow]]\nmrtd = \"{}\"\nrtmr0 = \"{}\"\nrtmr1 = \"{}\"\nrtmr2 = \"{}\"\nrtmr3 = \"{}\"",
                    reg("mrtd"),
                    reg("rtmr0"),
                    reg("rtmr1"),
                    reg("rtmr2"),
                    reg("rtmr3")
                ),
            }
        }
        SNP_BACKEND => {
            let (r, _) = psl_faas::attest_snp::decode_evidence(&ev.bytes)?;
            println!(
                "[[snp.allow]]\nmeasurement = \"{}\"\nguest_policy = \"{:#x}\"",
                hex::encode(r.measurement),
                r.policy
            );
            eprintln!(
                "(VMPL {}, reported TCB {:#018x}, guest SVN {}; drop guest_policy to accept any policy that passes the bit checks)",
                r.vmpl, r.reported_tcb, r.guest_svn
            );
        }
        SIM_BACKEND => {
            let m = hex::encode(&ev.bytes[8..40.min(ev.bytes.len())]);
            println!("[[sim.allow]]\nmeasurement = \"{m}\"");
        }
        other => bail!("unknown backend {other}"),
    }
    Ok(())
}
