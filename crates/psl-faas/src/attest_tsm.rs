//! TDX and SEV-SNP attesters through Linux configfs-tsm (`/sys/kernel/config/tsm/report/`,
//! kernel 6.7 and later, with the `tdx_guest` or `sev_guest` driver).
//!
//! The interface (Documentation/ABI/testing/configfs-tsm): `mkdir report/$name` creates a
//! report entry; writing 64 bytes to its `inblob` sets the report data; reading `outblob`
//! returns the report made over it (a TDX quote, or an SNP attestation report); for SNP,
//! `auxblob` holds the host's certificate table (VCEK, ASK, ARK) if the host provides one;
//! `provider` names the driver (`tdx_guest`, `sev_guest`); `generation` counts writes to the
//! entry, so a reader detects another process writing the same entry between its write and
//! its read (the generation after must be the one before plus one).
//!
//! [`TsmAttester`] uses one entry per process (`psl-<pid>` unless named), created when opened
//! and removed when dropped, serialises its own reports, retries a report whose generation
//! moved (another writer) a few times and then fails, and checks that the outblob carries the
//! report data it wrote. The configfs root is a parameter: tests run it against a directory tree
//! that behaves like configfs (`attest_testkit::FakeTsm`), failure modes included.

use crate::attest::{hw_report_data, AttestError, Attester, Evidence, TeeKind};
use crate::attest_dcap::DCAP_BACKEND;
use crate::attest_snp::{encode_evidence, known_entries, parse_cert_table, SnpReport, SNP_BACKEND};
use parking_lot::Mutex;
use std::path::{Path, PathBuf};

/// A report's `outblob` and `auxblob`.
type Blobs = (Vec<u8>, Vec<u8>);

/// The configfs-tsm mount point on Linux.
pub const TSM_ROOT_DEFAULT: &str = "/sys/kernel/config/tsm";
/// Largest outblob or auxblob read (a TDX quote is a few KiB; an SNP table a few KiB).
pub const BLOB_BYTES_MAX: usize = 256 * 1024;
/// Reports retried when another writer moved the generation.
const GENERATION_RETRIES: usize = 3;

fn platform(e: impl Into<String>) -> AttestError {
    AttestError::Platform(e.into())
}

/// What `provider` says, as a TEE kind.
pub fn provider_kind(provider: &str) -> Option<TeeKind> {
    match provider.trim() {
        "tdx_guest" => Some(TeeKind::Tdx),
        "sev_guest" => Some(TeeKind::Snp),
        _ => None,
    }
}

/// Reads a whole attribute, bounded.
fn read_attr(p: &Path) -> Result<Vec<u8>, AttestError> {
    use std::io::Read;
    let f = std::fs::File::open(p).map_err(|e| platform(format!("opening {}: {e}", p.display())))?;
    let mut out = Vec::new();
    f.take(BLOB_BYTES_MAX as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| platform(format!("reading {}: {e}", p.display())))?;
    if out.len() > BLOB_BYTES_MAX {
        return Err(platform(format!("{} is over {BLOB_BYTES_MAX} bytes", p.display())));
    }
    Ok(out)
}

/// `generation`: a decimal number (trailing newline allowed).
pub fn parse_generation(b: &[u8]) -> Result<u64, AttestError> {
    std::str::from_utf8(b).ok().map(str::trim).and_then(|s| s.parse().ok()).ok_or_else(|| {
        platform(format!("generation is not a number: {:?}", String::from_utf8_lossy(&b[..b.len().min(32)])))
    })
}

/// A report entry of configfs-tsm.
pub struct TsmAttester {
    entry: PathBuf,
    kind: TeeKind,
    created: bool,
    lock: Mutex<()>,
}

impl TsmAttester {
    /// Opens (creating it if missing) the entry `report/<entry>` under `root`, reads its
    /// provider and checks it is `want` if given.
    pub fn open(root: &Path, entry: &str, want: Option<TeeKind>) -> Result<TsmAttester, AttestError> {
        if entry.is_empty() || entry.contains('/') || entry.starts_with('.') {
            return Err(platform(format!("bad configfs-tsm entry name {entry:?}")));
        }
        let reports = root.join("report");
        if !reports.is_dir() {
            return Err(platform(format!(
                "configfs-tsm not found: {} is not a directory (is configfs mounted, and is this a TDX or SEV-SNP \
                 guest with the tdx_guest / sev_guest driver, kernel 6.7 or later?)",
                reports.display()
            )));
        }
        let path = reports.join(entry);
        let created = match std::fs::create_dir(&path) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
            Err(e) => return Err(platform(format!("creating the report entry {}: {e}", path.display()))),
        };
        let a = TsmAttester { entry: path, kind: TeeKind::Sim, created, lock: Mutex::new(()) };
        let missing: Vec<&str> =
            ["inblob", "outblob", "provider", "generation"].into_iter().filter(|f| !a.entry.join(f).exists()).collect();
        if !missing.is_empty() {
            return Err(platform(format!(
                "the report entry {} lacks {}: not a configfs-tsm report entry",
                a.entry.display(),
                missing.join(", ")
            )));
        }
        let provider = String::from_utf8_lossy(&read_attr(&a.entry.join("provider"))?).trim().to_string();
        let kind = provider_kind(&provider)
            .ok_or_else(|| platform(format!("configfs-tsm provider {provider:?} is not tdx_guest or sev_guest")))?;
        if let Some(w) = want {
            if w != kind {
                return Err(platform(format!(
                    "provider mismatch: configfs-tsm's provider is {provider:?} ({kind}), but {w} was asked for"
                )));
            }
        }
        let mut a = a;
        a.kind = kind;
        Ok(a)
    }

    /// The report entry's directory (under `<root>/report/`).
    pub fn entry(&self) -> &Path {
        &self.entry
    }

    fn generation(&self) -> Result<u64, AttestError> {
        parse_generation(&read_attr(&self.entry.join("generation"))?)
    }

    /// One report: (outblob, auxblob) over `rd`, or `Ok(None)` when the generation moved.
    fn try_once(&self, rd: &[u8; 64]) -> Result<Option<Blobs>, AttestError> {
        let g0 = self.generation()?;
        let inblob = self.entry.join("inblob");
        std::fs::write(&inblob, rd).map_err(|e| platform(format!("writing {}: {e}", inblob.display())))?;
        let out = read_attr(&self.entry.join("outblob"))?;
        let aux = if self.kind == TeeKind::Snp && self.entry.join("auxblob").exists() {
            read_attr(&self.entry.join("auxblob"))?
        } else {
            Vec::new()
        };
        let g1 = self.generation()?;
        if g1 != g0.wrapping_add(1) {
            tracing::warn!(
                "configfs-tsm entry {}: generation moved from {g0} to {g1} during a report (another writer)",
                self.entry.display()
            );
            return Ok(None);
        }
        Ok(Some((out, aux)))
    }
}

impl Drop for TsmAttester {
    fn drop(&mut self) {
        if self.created {
            let _ = std::fs::remove_dir(&self.entry);
        }
    }
}

impl Attester for TsmAttester {
    fn backend(&self) -> &'static str {
        match self.kind {
            TeeKind::Snp => SNP_BACKEND,
            _ => DCAP_BACKEND,
        }
    }

    fn kind(&self) -> TeeKind {
        self.kind
    }

    fn describe(&self) -> String {
        format!(
            "{} through configfs-tsm ({})",
            if self.kind == TeeKind::Snp { "AMD SEV-SNP" } else { "Intel TDX" },
            self.entry.display()
        )
    }

    fn attest(&self, nonce: &[u8; 32], report_data: &[u8; 32]) -> Result<Evidence, AttestError> {
        let rd = hw_report_data(nonce, report_data);
        let _g = self.lock.lock();
        let mut got = None;
        for _ in 0..GENERATION_RETRIES {
            if let Some(x) = self.try_once(&rd)? {
                got = Some(x);
                break;
            }
        }
        let Some((out, aux)) = got else {
            return Err(platform(format!(
                "generation changed during each of {GENERATION_RETRIES} tries: another process keeps writing the \
                 report entry {}",
                self.entry.display()
            )));
        };
        match self.kind {
            TeeKind::Snp => {
                let report = SnpReport::parse(&out).map_err(|e| platform(format!("outblob: {e}")))?;
                if report.report_data != rd {
                    return Err(platform("the outblob's report data is not what was written to inblob (stale report)"));
                }
                let certs = if aux.is_empty() {
                    Vec::new()
                } else {
                    known_entries(parse_cert_table(&aux).map_err(|e| platform(format!("auxblob: {e}")))?)
                };
                Ok(Evidence { backend: SNP_BACKEND, bytes: encode_evidence(&out, &certs) })
            }
            _ => {
                let id = crate::attest_dcap::inspect(&out).map_err(|e| platform(format!("outblob: {e}")))?;
                if id.report_data != rd {
                    return Err(platform("the outblob's report data is not what was written to inblob (stale quote)"));
                }
                Ok(Evidence { backend: DCAP_BACKEND, bytes: out })
            }
        }
    }
}
