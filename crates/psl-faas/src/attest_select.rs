//! Choosing the attester: `--attest sim|sgx|tdx|snp|auto`.
//!
//! `sgx` opens Gramine's `/dev/attestation`, `tdx` and `snp` open a configfs-tsm report entry
//! (and check its provider); `auto` looks for each and takes what it finds (Gramine first: inside
//! an enclave configfs is the untrusted host's), says what it chose and why, and fails (listing
//! what it looked for) when it finds nothing. `auto` never falls back to the sim backend: that
//! one is only ever chosen by name, and the callers (`psl worker`, ...) need its platform key.

use crate::attest::{AttestError, Attester, TeeKind};
use crate::attest_gramine::{GramineAttester, GRAMINE_DIR_DEFAULT};
use crate::attest_tsm::{TsmAttester, TSM_ROOT_DEFAULT};
use std::path::PathBuf;

/// What `--attest` asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttestChoice {
    /// The INSECURE simulated platform.
    Sim,
    /// Intel SGX through Gramine's `/dev/attestation` (DCAP).
    Sgx,
    /// Intel TDX through a configfs-tsm report entry.
    Tdx,
    /// AMD SEV-SNP through a configfs-tsm report entry.
    Snp,
    /// Whichever hardware is present; never sim.
    Auto,
}

impl AttestChoice {
    /// The choice named `s` (`sim`, `sgx`, `tdx`, `snp`, `auto`), if any.
    pub fn parse(s: &str) -> Option<AttestChoice> {
        Some(match s {
            "sim" => AttestChoice::Sim,
            "sgx" => AttestChoice::Sgx,
            "tdx" => AttestChoice::Tdx,
            "snp" => AttestChoice::Snp,
            "auto" => AttestChoice::Auto,
            _ => return None,
        })
    }
}

impl std::str::FromStr for AttestChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        AttestChoice::parse(s).ok_or_else(|| format!("{s:?}: expected sim, sgx, tdx, snp or auto"))
    }
}

/// Where the hardware interfaces are (parameters so tests can use fake trees).
#[derive(Clone, Debug)]
pub struct HwPaths {
    /// The configfs-tsm root (`/sys/kernel/config/tsm`).
    pub tsm_root: PathBuf,
    /// The report entry's name (default `psl-<pid>`).
    pub tsm_entry: Option<String>,
    /// Gramine's attestation directory (`/dev/attestation`).
    pub gramine_dir: PathBuf,
}

impl Default for HwPaths {
    fn default() -> Self {
        HwPaths { tsm_root: TSM_ROOT_DEFAULT.into(), tsm_entry: None, gramine_dir: GRAMINE_DIR_DEFAULT.into() }
    }
}

impl HwPaths {
    fn entry(&self) -> String {
        self.tsm_entry.clone().unwrap_or_else(|| format!("psl-{}", std::process::id()))
    }
}

/// Opens the hardware attester `choice` names (`Sim` is refused here: its caller builds it).
/// Returns the attester and a sentence saying what was chosen (and, for `auto`, why).
pub fn open_hardware(choice: AttestChoice, paths: &HwPaths) -> Result<(Box<dyn Attester>, String), AttestError> {
    match choice {
        AttestChoice::Sim => Err(AttestError::Platform("the sim backend is not hardware".into())),
        AttestChoice::Sgx => {
            let a = GramineAttester::open(&paths.gramine_dir)?;
            let d = a.describe();
            Ok((Box::new(a), format!("attestation: {d} (--attest sgx)")))
        }
        AttestChoice::Tdx | AttestChoice::Snp => {
            let want = if choice == AttestChoice::Tdx { TeeKind::Tdx } else { TeeKind::Snp };
            let a = TsmAttester::open(&paths.tsm_root, &paths.entry(), Some(want))?;
            let d = a.describe();
            Ok((Box::new(a), format!("attestation: {d} (--attest {want})")))
        }
        AttestChoice::Auto => {
            let mut tried = Vec::new();
            if paths.gramine_dir.join("attestation_type").exists() {
                match GramineAttester::open(&paths.gramine_dir) {
                    Ok(a) => {
                        let d = a.describe();
                        return Ok((
                            Box::new(a),
                            format!(
                                "attestation: {d} (--attest auto: found Gramine's {} with DCAP)",
                                paths.gramine_dir.display()
                            ),
                        ));
                    }
                    Err(e) => tried.push(format!("Gramine at {}: {e}", paths.gramine_dir.display())),
                }
            } else {
                tried.push(format!("Gramine: no {}", paths.gramine_dir.join("attestation_type").display()));
            }
            match TsmAttester::open(&paths.tsm_root, &paths.entry(), None) {
                Ok(a) => {
                    let d = a.describe();
                    let k = a.kind();
                    Ok((
                        Box::new(a),
                        format!(
                            "attestation: {d} (--attest auto: configfs-tsm at {} has provider {})",
                            paths.tsm_root.display(),
                            if k == TeeKind::Snp { "sev_guest" } else { "tdx_guest" }
                        ),
                    ))
                }
                Err(e) => {
                    tried.push(format!("configfs-tsm at {}: {e}", paths.tsm_root.display()));
                    Err(AttestError::Platform(format!(
                        "--attest auto found no TEE ({}); it never falls back to the INSECURE sim backend: give \
                         --attest sim explicitly for development",
                        tried.join("; ")
                    )))
                }
            }
        }
    }
}
