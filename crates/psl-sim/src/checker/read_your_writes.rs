//! Read your writes: right after a local write returns, its node shows that write's version
//! for the key, and that version is newer than the version the node showed before (a write
//! supersedes what its node showed, a version learnt from CapsuleDB included). Checked at every
//! write.

use super::show;
use crate::Violation;
use psl_scl::Version;

/// `before`: what the node showed before the write; `written`: the version the write got;
/// `shown`: what the node shows right after.
pub fn check(
    seed: u64,
    now: u64,
    node: u32,
    key: &[u8],
    before: Option<Version>,
    written: Version,
    shown: Option<Version>,
) -> Result<(), Violation> {
    if shown == Some(written) && before.is_none_or(|b| written > b) {
        return Ok(());
    }
    Err(Violation::WriteNotShown { seed, at_ms: now, node, key: show(key), before, written, shown })
}
