//! Whole-replica audit of a capsule file: every framing, record and chain check, with each
//! problem named by record position, hash, writer, seq and the check that failed.

use crate::file::{scan, FileProblem};
use crate::replica::Replica;
use crate::verify::Verifier;
use crate::{MetadataError, SignedMetadata};
use psl_crypto::{DataKey, Hash256};
use serde::Serialize;
use std::fmt;

/// One problem found by an audit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// Position of the record in the file, when the problem concerns one record.
    pub index: Option<usize>,
    /// The record hash, as 64 lowercase hex digits, when the record decoded.
    pub hash: Option<String>,
    /// The record's writer index, when known.
    pub writer: Option<u32>,
    /// The record's seq, when known.
    pub seq: Option<u64>,
    /// Stable name of the failed check (`encoding`, `signature`, `decryption`, `prev`, ...).
    pub check: &'static str,
    /// Human-readable description of the failure (the error's message).
    pub detail: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.index {
            Some(i) => write!(f, "record #{i}")?,
            None => write!(f, "capsule")?,
        }
        if let Some(h) = &self.hash {
            write!(f, " {h}")?;
        }
        match (self.writer, self.seq) {
            (Some(w), Some(s)) => write!(f, " (writer {w}, seq {s})")?,
            (Some(w), None) => write!(f, " (writer {w})")?,
            _ => {}
        }
        write!(f, ": {} check failed: {}", self.check, self.detail)
    }
}

/// The outcome of auditing a capsule file.
#[derive(Debug)]
pub struct Audit {
    /// The file's signed metadata; `None` if it does not decode or its owner signature fails.
    pub metadata: Option<SignedMetadata>,
    /// Every record that passed the record checks (chain problems are listed separately).
    pub replica: Option<Replica>,
    /// Record frames in the file, damaged ones included.
    pub records_total: usize,
    /// Records that passed every verifier check.
    pub records_verified: usize,
    /// Whether bodies were decrypted and checked: a data key was given and matches the metadata.
    pub opened: bool,
    /// Every problem found, file-level and per record; empty for a clean file.
    pub problems: Vec<Problem>,
    /// Links to a record the file does not hold that a revocation the file carries refuses
    /// (the target's seq is at or past the revocation's seq bound): an honest writer applied it
    /// before it learnt the revocation, and every store drops it since. Not a problem: were
    /// the target there, the verifier would refuse it.
    pub links_to_revoked: usize,
}

impl Audit {
    /// Whether the audit found no problem at all.
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Audits the bytes of a `.capsule` file. With `data_key`, also decrypts every body.
pub fn audit_file(bytes: &[u8], data_key: Option<DataKey>) -> Audit {
    audit_file_rotated(bytes, data_key, Vec::new())
}

/// Like [`audit_file`] for a capsule whose application key was rotated: `rotations` are the
/// owner-signed certificates of generations 1.. (each with its data key, if the auditor has it).
/// With the generation-0 data key, certificates found in `ROTATE` records the auditor can open
/// are installed too. A certificate that does not verify is listed as a `rotation` problem.
pub fn audit_file_rotated(
    bytes: &[u8],
    data_key: Option<DataKey>,
    rotations: Vec<(crate::RotationCert, Option<DataKey>)>,
) -> Audit {
    let s = scan(bytes);
    let mut problems = Vec::new();
    let metadata = match s.metadata {
        Ok(m) => Some(m),
        Err(e) => {
            let check = if matches!(e, MetadataError::Signature) { "metadata-signature" } else { "metadata" };
            problems.push(capsule_problem(check, e.to_string()));
            None
        }
    };
    let mut audit = Audit {
        metadata: metadata.clone(),
        replica: None,
        records_total: s.frames.len(),
        records_verified: 0,
        opened: false,
        problems: Vec::new(),
        links_to_revoked: 0,
    };
    let verifier = metadata.map(|m| {
        let key = data_key.filter(|k| {
            let ok = k.fingerprint() == m.meta.policy.data_key_fp;
            if !ok {
                problems.push(capsule_problem("data-key", "the key given is not this capsule's data key".into()));
            }
            ok
        });
        Verifier::new(m, key)
    });
    if let Some(v) = &verifier {
        learn_keys(v, &s.frames, rotations, &mut problems);
    }
    audit.opened = verifier.as_ref().is_some_and(|v| v.can_open());
    let mut replica = verifier.as_ref().map(|v| Replica::new(v.name()));
    let mut index_of = std::collections::HashMap::<Hash256, usize>::new();
    for f in s.frames {
        let rec = match f.record {
            Ok(r) => r,
            Err(e) => {
                problems.push(Problem {
                    index: Some(f.index),
                    hash: None,
                    writer: None,
                    seq: None,
                    check: "encoding",
                    detail: e.to_string(),
                });
                continue;
            }
        };
        let Some(v) = &verifier else { continue };
        let (hash, writer, seq) = (rec.hash(), rec.header().writer, rec.header().seq);
        match v.verify(rec) {
            Ok(ok) => {
                audit.records_verified += 1;
                index_of.entry(ok.hash()).or_insert(f.index);
                if let Some(r) = replica.as_mut() {
                    let _ = r.insert(ok);
                }
            }
            Err(rej) => problems.push(Problem {
                index: Some(f.index),
                hash: Some(hash.to_hex()),
                writer: Some(writer),
                seq: Some(seq),
                check: rej.reason.name(),
                detail: rej.reason.to_string(),
            }),
        }
    }
    problems.extend(s.fatal.as_ref().map(fatal_problem));
    if let (Some(r), Some(v)) = (&replica, &verifier) {
        let (chain, links_to_revoked) = chain_problems(r, v, &index_of);
        problems.extend(chain);
        audit.links_to_revoked = links_to_revoked;
    }
    audit.replica = replica;
    audit.problems = problems;
    audit
}

/// Installs in `v` what the auditor was given (rotation certificates) and what the file
/// carries (writer certificates and revocations in Cert records, rotation certificates in
/// ROTATE records it can open); what does not verify is a problem.
fn learn_keys(
    v: &Verifier,
    frames: &[crate::file::Frame],
    rotations: Vec<(crate::RotationCert, Option<DataKey>)>,
    problems: &mut Vec<Problem>,
) {
    for (cert, key) in rotations {
        if let Err(e) = v.install_rotation(&cert, key) {
            problems.push(capsule_problem("rotation", format!("key generation {}: {e}", cert.key_gen)));
        }
    }
    // Writer certificates and revocations from every Cert record, before any record is
    // checked: a statement is signed by the application key itself, so where it sits in the
    // file does not matter, and a record may come before its writer's certificate.
    // Twice: a later generation's statements verify only once its rotation certificate
    // (in a ROTATE record, below) is known; only the second pass's refusals are problems.
    let records = frames.iter().filter_map(|f| f.record.as_ref().ok());
    let first = v.learn_statements(records);
    if v.can_open() {
        // Certificates the log carries itself, in ROTATE records this auditor can open.
        for f in frames {
            let Ok(rec) = &f.record else { continue };
            if rec.header().kind != crate::Kind::Control {
                continue;
            }
            if let Ok(o) = v.verify_open(rec.clone()) {
                if let crate::Body::Control { code: crate::ControlCode::Rotate, payload } = &o.body {
                    if let Ok(cert) = crate::RotationCert::decode(payload) {
                        let _ = v.install_rotation(&cert, None);
                    }
                }
            }
        }
    }
    if !first.is_empty() {
        let records = frames.iter().filter_map(|f| f.record.as_ref().ok());
        for (hash, e) in v.learn_statements(records) {
            problems.push(capsule_problem("certificate", format!("a statement in record {hash}: {e}")));
        }
    }
}

/// A problem of the capsule as a whole (its metadata, the keys given), not of one record.
fn capsule_problem(check: &'static str, detail: String) -> Problem {
    Problem { index: None, hash: None, writer: None, seq: None, check, detail }
}

/// The file-level problem that stopped the scan.
fn fatal_problem(fatal: &FileProblem) -> Problem {
    let (index, check) = match fatal {
        FileProblem::Frame { index, .. } => (Some(*index), "framing"),
        FileProblem::NoTrailer { .. } => (None, "truncation"),
        FileProblem::Digest | FileProblem::Count { .. } => (None, "file-digest"),
        FileProblem::Trailing(_) => (None, "trailing-bytes"),
        FileProblem::Magic | FileProblem::Metadata(_) => (None, "metadata"),
    };
    Problem { index, hash: None, writer: None, seq: None, check, detail: fatal.to_string() }
}

/// The chains' problems (broken links, gaps, equivocations), at the file index of the record
/// they name.
/// The replica's chain problems, and how many links it found to an absent record that a
/// revocation `v` knows refuses ([`Audit::links_to_revoked`], left out of the problems).
fn chain_problems(
    r: &Replica,
    v: &Verifier,
    index_of: &std::collections::HashMap<Hash256, usize>,
) -> (Vec<Problem>, usize) {
    let revocations = v.revocations();
    // The target is absent, so its key generation and epoch are unknown: only the seq bound
    // decides, for a revocation of the linking record's own key generation.
    let refused = |p: &crate::ChainProblem| match p {
        crate::ChainProblem::MissingLinkTarget { hash, target_writer, target_seq, .. } => {
            let gen = r.get(hash).map(|rec| rec.header().key_gen);
            revocations
                .iter()
                .any(|x| x.writer == *target_writer && Some(x.key_gen) == gen && *target_seq >= x.from_seq)
        }
        _ => false,
    };
    let (revoked, kept): (Vec<_>, Vec<_>) = r.check().into_iter().partition(|p| refused(p));
    let problems = kept
        .into_iter()
        .map(|p| {
            let (hash, seq) = match &p {
                crate::ChainProblem::BrokenPrev { hash, seq, .. }
                | crate::ChainProblem::DanglingLink { hash, seq, .. }
                | crate::ChainProblem::MissingLinkTarget { hash, seq, .. }
                | crate::ChainProblem::LinkEpoch { hash, seq, .. }
                | crate::ChainProblem::Regression { hash, seq, .. } => (Some(*hash), Some(*seq)),
                crate::ChainProblem::Equivocation { seq, .. } => (None, Some(*seq)),
                crate::ChainProblem::Gap { from, .. } => (None, Some(*from)),
            };
            Problem {
                index: hash.and_then(|h| index_of.get(&h).copied()),
                hash: hash.map(|h| h.to_hex()),
                writer: Some(p.writer()),
                seq,
                check: p.check(),
                detail: p.detail(),
            }
        })
        .collect();
    (problems, revoked.len())
}
