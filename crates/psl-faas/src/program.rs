//! Sealed programs: what the client hands the untrusted scheduler.
//!
//! `bytes = "PSLPROG1" ‖ job id (16) ‖ kind (1) ‖ salt (16) ‖ u32 LE ciphertext length ‖ ciphertext`.
//! The ciphertext is AES-256-GCM under a key derived (HKDF, in `DataKey::seal`) from the
//! application data key with context `"psl/program/v1" ‖ job id ‖ kind`, and the whole header
//! as associated data. Changing any byte, or handing the program to another job, fails `open`.

use crate::error::FaasError;
use psl_crypto::{DataKey, SALT_LEN};
use std::fmt;
use zeroize::Zeroizing;

const MAGIC: &[u8; 8] = b"PSLPROG1";
const HEADER_LEN: usize = 8 + 16 + 1 + SALT_LEN + 4;

/// 128-bit job identifier (random per job).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct JobId(pub [u8; 16]);

impl JobId {
    /// A fresh random job id.
    pub fn random() -> JobId {
        JobId(rand::random())
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(&self.0[..8]))
    }
}

impl fmt::Debug for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JobId({self})")
    }
}

/// What a sealed blob holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Payload {
    /// The job's program.
    Program = 1,
    /// The job's input.
    Input = 2,
    /// A worker's results, sealed for the client.
    Result = 3,
}

impl Payload {
    fn name(self) -> &'static str {
        match self {
            Payload::Program => "program",
            Payload::Input => "input",
            Payload::Result => "result",
        }
    }
}

/// A sealed program or input. Opaque to everyone without the application data key.
#[derive(Clone, PartialEq, Eq)]
pub struct SealedProgram {
    /// The sealed blob: `magic ‖ job id ‖ kind ‖ salt ‖ ciphertext length` (the AES-256-GCM
    /// associated data), then the ciphertext and its tag.
    pub bytes: Vec<u8>,
}

impl fmt::Debug for SealedProgram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SealedProgram({} bytes)", self.bytes.len())
    }
}

fn context(job: JobId, kind: Payload) -> Vec<u8> {
    let mut c = b"psl/program/v1".to_vec();
    c.extend_from_slice(&job.0);
    c.push(kind as u8);
    c
}

impl SealedProgram {
    /// Seals `plaintext` (at most `max` bytes) for `job`.
    pub fn seal(
        key: &DataKey,
        job: JobId,
        kind: Payload,
        plaintext: &[u8],
        max: usize,
    ) -> Result<SealedProgram, FaasError> {
        if plaintext.len() > max {
            return Err(FaasError::Config(format!(
                "{} is {} bytes, over the limit of {max}",
                kind.name(),
                plaintext.len()
            )));
        }
        let salt: [u8; SALT_LEN] = rand::random();
        let mut header = Vec::with_capacity(HEADER_LEN);
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&job.0);
        header.push(kind as u8);
        header.extend_from_slice(&salt);
        let ct_len = plaintext.len() + psl_crypto::TAG_LEN;
        header.extend_from_slice(&(ct_len as u32).to_le_bytes());
        let ct = key.seal(&salt, &context(job, kind), &header, plaintext);
        let mut bytes = header;
        bytes.extend_from_slice(&ct);
        Ok(SealedProgram { bytes })
    }

    /// The job id the blob claims (unauthenticated until `open` succeeds).
    pub fn job(&self) -> Option<JobId> {
        self.bytes.get(8..24).map(|b| JobId(b.try_into().expect("16 bytes")))
    }

    /// Opens the blob for `job`. Never panics on any input; at most `max` plaintext bytes.
    pub fn open(&self, key: &DataKey, job: JobId, kind: Payload, max: usize) -> Result<Zeroizing<Vec<u8>>, FaasError> {
        let malformed = |why: String| FaasError::Malformed { what: kind.name(), why };
        let b = &self.bytes;
        if b.len() < HEADER_LEN + psl_crypto::TAG_LEN {
            return Err(malformed(format!("{} bytes is shorter than a header and a tag", b.len())));
        }
        let integrity = || FaasError::Integrity { job: job.to_string(), what: kind.name() };
        if &b[..8] != MAGIC {
            return Err(integrity());
        }
        if b[8..24] != job.0 || b[24] != kind as u8 {
            return Err(integrity());
        }
        let ct_len = u32::from_le_bytes(b[HEADER_LEN - 4..HEADER_LEN].try_into().expect("4 bytes")) as usize;
        if ct_len != b.len() - HEADER_LEN {
            return Err(integrity());
        }
        if ct_len - psl_crypto::TAG_LEN > max {
            return Err(malformed(format!("{} bytes, over the limit of {max}", ct_len - psl_crypto::TAG_LEN)));
        }
        let salt: [u8; SALT_LEN] = b[25..25 + SALT_LEN].try_into().expect("salt");
        key.open(&salt, &context(job, kind), &b[..HEADER_LEN], &b[HEADER_LEN..]).map_err(|_| integrity())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flipped_byte_is_caught() {
        let k = DataKey::from_bytes(&[7; 32]);
        let job = JobId([1; 16]);
        let s = SealedProgram::seal(&k, job, Payload::Program, b"emit(1)", 1024).unwrap();
        assert_eq!(&s.open(&k, job, Payload::Program, 1024).unwrap()[..], b"emit(1)");
        for i in 0..s.bytes.len() {
            let mut t = s.clone();
            t.bytes[i] ^= 0x01;
            assert!(t.open(&k, job, Payload::Program, 1024).is_err(), "byte {i}");
        }
        assert!(s.open(&k, JobId([2; 16]), Payload::Program, 1024).is_err());
        assert!(s.open(&k, job, Payload::Input, 1024).is_err());
        assert!(s.open(&DataKey::from_bytes(&[8; 32]), job, Payload::Program, 1024).is_err());
        for n in 0..s.bytes.len() {
            let t = SealedProgram { bytes: s.bytes[..n].to_vec() };
            assert!(t.open(&k, job, Payload::Program, 1024).is_err());
        }
    }
}
