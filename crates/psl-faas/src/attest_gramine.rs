//! The SGX attester inside a Gramine enclave, through Gramine's pseudo-files in
//! `/dev/attestation/`: `attestation_type` (`dcap` when the manifest says
//! `sgx.remote_attestation = "dcap"`), `user_report_data` (write the 64 bytes the quote's report
//! data will carry) and `quote` (read the DCAP quote made over them). The directory is a
//! parameter: tests use a fake one (`attest_testkit::FakeGramine`).
//!
//! Also here: [`Sigstruct`], the enclave signature file `gramine-sgx-sign` writes
//! (`psl.sig`), from which `psl attest measure --gramine-sig` reads the MRENCLAVE, MRSIGNER,
//! product id and SVN the enclave will have, for the policy. The manifest template is
//! `deploy/gramine/psl.manifest.template`.

use crate::attest::{hw_report_data, AttestError, Attester, Evidence, TeeKind};
use crate::attest_dcap::DCAP_BACKEND;
use parking_lot::Mutex;
use std::path::{Path, PathBuf};

/// Gramine's attestation pseudo-filesystem.
pub const GRAMINE_DIR_DEFAULT: &str = "/dev/attestation";
/// Largest quote read.
const QUOTE_BYTES_MAX: usize = crate::attest_dcap::QUOTE_BYTES_MAX;

fn platform(e: impl Into<String>) -> AttestError {
    AttestError::Platform(e.into())
}

/// An SGX enclave under Gramine with DCAP remote attestation.
pub struct GramineAttester {
    dir: PathBuf,
    lock: Mutex<()>,
}

impl GramineAttester {
    /// Checks that `dir` is Gramine's attestation interface with DCAP attestation.
    pub fn open(dir: &Path) -> Result<GramineAttester, AttestError> {
        let t = dir.join("attestation_type");
        let kind = std::fs::read_to_string(&t).map_err(|e| {
            platform(format!(
                "{}: {e} (not inside a Gramine SGX enclave with remote attestation enabled?)",
                t.display()
            ))
        })?;
        match kind.trim() {
            "dcap" => {}
            "none" => {
                return Err(platform(
                    "Gramine runs without remote attestation: set sgx.remote_attestation = \"dcap\" in the manifest",
                ))
            }
            other => return Err(platform(format!("Gramine attestation type {other:?}: PSL needs \"dcap\""))),
        }
        for f in ["user_report_data", "quote"] {
            if !dir.join(f).exists() {
                return Err(platform(format!("{} is missing", dir.join(f).display())));
            }
        }
        Ok(GramineAttester { dir: dir.to_path_buf(), lock: Mutex::new(()) })
    }
}

impl Attester for GramineAttester {
    fn backend(&self) -> &'static str {
        DCAP_BACKEND
    }

    fn kind(&self) -> TeeKind {
        TeeKind::Sgx
    }

    fn describe(&self) -> String {
        format!("Intel SGX in Gramine ({})", self.dir.display())
    }

    fn attest(&self, nonce: &[u8; 32], report_data: &[u8; 32]) -> Result<Evidence, AttestError> {
        use std::io::Read;
        let rd = hw_report_data(nonce, report_data);
        let _g = self.lock.lock();
        let urd = self.dir.join("user_report_data");
        std::fs::write(&urd, rd).map_err(|e| platform(format!("writing {}: {e}", urd.display())))?;
        let qp = self.dir.join("quote");
        let f = std::fs::File::open(&qp).map_err(|e| platform(format!("opening {}: {e}", qp.display())))?;
        let mut quote = Vec::new();
        f.take(QUOTE_BYTES_MAX as u64 + 1)
            .read_to_end(&mut quote)
            .map_err(|e| platform(format!("reading {}: {e}", qp.display())))?;
        let id = crate::attest_dcap::inspect(&quote).map_err(|e| platform(format!("{}: {e}", qp.display())))?;
        if id.kind != TeeKind::Sgx || id.report_data != rd {
            return Err(platform("the quote is not an SGX quote over the report data just written (stale?)"));
        }
        Ok(Evidence { backend: DCAP_BACKEND, bytes: quote })
    }
}

/// Length of an SGX SIGSTRUCT.
pub const SIGSTRUCT_LEN: usize = 1808;
const SIGSTRUCT_HEADER: [u8; 16] = [6, 0, 0, 0, 0xe1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0];
const SIGSTRUCT_HEADER2: [u8; 16] = [1, 1, 0, 0, 0x60, 0, 0, 0, 0x60, 0, 0, 0, 1, 0, 0, 0];

/// What an enclave's SIGSTRUCT (`.sig` file) fixes about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sigstruct {
    /// MRENCLAVE: the enclave's measurement the SIGSTRUCT commits to.
    pub mrenclave: [u8; 32],
    /// SHA-256 of the signer's RSA modulus (little-endian, as stored).
    pub mrsigner: [u8; 32],
    /// The enclave's ISV product id.
    pub isv_prod_id: u16,
    /// The enclave's ISV security version number.
    pub isv_svn: u16,
    /// ATTRIBUTES.FLAGS bit 1: a debug enclave.
    pub debug: bool,
}

impl Sigstruct {
    /// Parses a SIGSTRUCT (Intel SDM vol. 3D, "Enclave Signature Structure"): fixed headers,
    /// then the fields at their offsets. Does not check the signature (the CPU does, at launch).
    pub fn parse(b: &[u8]) -> Result<Sigstruct, AttestError> {
        if b.len() != SIGSTRUCT_LEN {
            return Err(AttestError::Malformed(format!("{} bytes, a SIGSTRUCT is {SIGSTRUCT_LEN}", b.len())));
        }
        if b[..16] != SIGSTRUCT_HEADER || b[24..40] != SIGSTRUCT_HEADER2 {
            return Err(AttestError::Malformed("not a SIGSTRUCT (header)".into()));
        }
        let modulus = &b[128..512];
        let mut mrenclave = [0u8; 32];
        mrenclave.copy_from_slice(&b[960..992]);
        Ok(Sigstruct {
            mrenclave,
            mrsigner: psl_crypto::sha256(&[modulus]).0,
            isv_prod_id: u16::from_le_bytes([b[1024], b[1025]]),
            isv_svn: u16::from_le_bytes([b[1026], b[1027]]),
            debug: b[928] & 2 != 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sigstruct_fields() {
        let mut b = vec![0u8; SIGSTRUCT_LEN];
        b[..16].copy_from_slice(&SIGSTRUCT_HEADER);
        b[24..40].copy_from_slice(&SIGSTRUCT_HEADER2);
        b[960..992].copy_from_slice(&[7; 32]);
        b[128..512].copy_from_slice(&[1; 384]);
        b[1024] = 5;
        b[1026] = 2;
        let s = Sigstruct::parse(&b).unwrap();
        assert_eq!((s.mrenclave, s.isv_prod_id, s.isv_svn, s.debug), ([7; 32], 5, 2, false));
        assert_eq!(s.mrsigner, psl_crypto::sha256(&[&[1u8; 384][..]]).0);
        b[0] = 7;
        assert!(Sigstruct::parse(&b).is_err());
        assert!(Sigstruct::parse(&b[..100]).is_err());
    }
}
