//! No equivocation among honest writers: no node or server reports one, and no (writer, seq)
//! is signed twice with different hashes (a restarted node writes under a new incarnation; a
//! restarted coordinator must resume after the newest seq it signed). Checked as records are
//! signed and reports come in.

use super::History;
use crate::Violation;
use psl_crypto::Hash256;

/// An equivocation a node or a server reported.
pub fn reported(seed: u64, now: u64, writer: u32, seq: u64) -> Violation {
    Violation::Equivocation { seed, at_ms: now, writer, seq }
}

/// A record an honest writer signed, taken into the history.
pub fn signed(
    seed: u64,
    now: u64,
    h: &mut History,
    writer: u32,
    seq: u64,
    hash: Hash256,
    ops: super::KeyVersions,
) -> Result<(), Violation> {
    match h.wrote(writer, seq, hash, ops) {
        Some(first) => Err(Violation::SignedTwice { seed, at_ms: now, writer, seq, first, second: hash }),
        None => Ok(()),
    }
}
