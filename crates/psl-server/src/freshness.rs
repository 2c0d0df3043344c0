//! Freshness: does a server's copy hold everything a SYNC the reader trusts says exists?
//!
//! A server can withhold recent records and serve an older, perfectly valid prefix (a rollback
//! or freshness attack; a server that was cut off looks the same). Signatures cannot catch it:
//! every record it serves is genuine. The reader's defence is the newest SYNC it has verified
//! (from its own memtable's epoch, or from any other source): that SYNC links every writer's
//! newest record of its epoch, so a copy that lacks any of them, or holds another record at
//! that slot, or whose own newest SYNC is older, is stale. The reader then reads elsewhere.

use psl_capsule::Link;
use psl_crypto::Hash256;
use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Stale {
    #[error("the server's newest SYNC is of epoch {have:?}, the reader knows epoch {known}")]
    OlderSync { have: Option<u64>, known: u64 },
    #[error("the server holds writer {writer} up to seq {have:?}, but a SYNC links its seq {need}")]
    Behind { writer: u32, have: Option<u64>, need: u64 },
    #[error(
        "the server holds a different record at writer {writer} seq {seq} than the SYNC links ({held} vs {linked})"
    )]
    Conflict { writer: u32, seq: u64, held: Hash256, linked: Hash256 },
}

/// What a reader learned from one server: its heads (writer -> newest seq) and a way to look up
/// the hash it holds at a slot, and its newest SYNC's epoch.
pub struct ServerView<'a> {
    pub heads: &'a BTreeMap<u32, (u64, Hash256)>,
    pub latest_sync_epoch: Option<u64>,
    /// Hash held at (writer, seq), if any.
    pub hash_at: &'a dyn Fn(u32, u64) -> Option<Hash256>,
}

/// Checks a server's view against the newest SYNC the reader knows (`epoch`, `links`).
pub fn check_fresh(view: &ServerView<'_>, epoch: u64, links: &[Link]) -> Result<(), Stale> {
    if view.latest_sync_epoch.is_none_or(|e| e < epoch) {
        return Err(Stale::OlderSync { have: view.latest_sync_epoch, known: epoch });
    }
    for l in links {
        let have = view.heads.get(&l.writer).map(|(s, _)| *s);
        if have.is_none_or(|s| s < l.seq) {
            return Err(Stale::Behind { writer: l.writer, have, need: l.seq });
        }
        if let Some(h) = (view.hash_at)(l.writer, l.seq) {
            if h != l.hash {
                return Err(Stale::Conflict { writer: l.writer, seq: l.seq, held: h, linked: l.hash });
            }
        }
    }
    Ok(())
}
