//! Freshness: does a server's copy hold everything a SYNC the reader trusts says exists?
//!
//! A server can withhold recent records and serve an older, perfectly valid prefix (a rollback
//! or freshness attack; a server that was cut off looks the same). Signatures cannot catch it:
//! every record it serves is genuine. The reader's defence is the newest SYNC it has verified
//! (from its own memtable's epoch, or from any server: a SYNC is signed by a coordinator, so
//! its source does not matter): that SYNC links every writer's newest record of its epoch, so a
//! copy that lacks any of them, or holds another record at that slot, is stale. The reader
//! then reads elsewhere, or waits for the server to catch up.
//!
//! The rule is about the records a SYNC *covers*, not about which SYNC the server itself holds
//! last: a server whose newest SYNC is one epoch older but which holds every record the newer
//! SYNC links holds every write that SYNC vouches for, and is fresh. (With an epoch sealed
//! every 50 ms, two healthy servers are often one SYNC record apart; refusing the one that has
//! not stored the newest SYNC record yet made a restarting node give up for nothing, issue 15.)
//! What the missing SYNC records would add is the coordinator's own chain, which carries no
//! writes. The server proves that it covers the SYNC by serving the linked records, which the
//! reader verifies: a view's claims (heads) alone never make a server fresh, see
//! [`ServerView::hash_at`].

use psl_capsule::Link;
use psl_crypto::Hash256;
use std::collections::BTreeMap;

/// Why [`check_fresh`] found a server's copy stale.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Stale {
    /// The server's head for a writer is below a record the SYNC links (or it has none).
    #[error("the server holds writer {writer} up to seq {have:?}, but a SYNC links its seq {need}")]
    Behind {
        /// The writer.
        writer: u32,
        /// The server's newest seq of that writer (`None`: it holds none of its records).
        have: Option<u64>,
        /// The seq the SYNC links.
        need: u64,
    },
    /// The server holds another record than the one the SYNC links at that slot.
    #[error(
        "the server holds a different record at writer {writer} seq {seq} than the SYNC links ({held} vs {linked})"
    )]
    Conflict {
        /// The writer.
        writer: u32,
        /// The linked seq.
        seq: u64,
        /// Hash of the record the server holds there.
        held: Hash256,
        /// Hash the SYNC links.
        linked: Hash256,
    },
}

/// What a reader learned from one server: its heads (writer -> newest seq) and a way to look up
/// the hash it holds at a slot.
pub struct ServerView<'a> {
    /// The server's heads: writer -> (newest seq, its hash).
    pub heads: &'a BTreeMap<u32, (u64, Hash256)>,
    /// Hash held at (writer, seq), if the reader knows it. A reader that has read and verified
    /// the server's records (`read::fetch_quorum`) knows every slot up to each head, so a
    /// linked slot is checked against a record the server proved it holds. A reader that only
    /// has the heads (CapsuleDB's survey) knows the head's hash only; it must then check the
    /// linked hashes when it reads those records (`psl_capsuledb::servers::replay` does).
    pub hash_at: &'a dyn Fn(u32, u64) -> Option<Hash256>,
}

/// Checks a server's view against the newest SYNC the reader knows (`links`: every record it
/// covers): the server must hold each linked `(writer, seq)`, with the linked hash.
pub fn check_fresh(view: &ServerView<'_>, links: &[Link]) -> Result<(), Stale> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn h(b: u8) -> Hash256 {
        Hash256([b; 32])
    }

    #[test]
    fn a_copy_is_fresh_when_it_holds_every_linked_record() {
        // The server holds writer 1 up to seq 4 and writer 2 up to seq 9; the reader knows
        // every hash (it read and verified the records).
        let heads: BTreeMap<u32, (u64, Hash256)> = [(1, (4, h(14))), (2, (9, h(29)))].into();
        let hash_at = |w: u32, s: u64| (s <= heads.get(&w)?.0).then(|| h((u64::from(w) * 10 + s) as u8));
        let view = ServerView { heads: &heads, hash_at: &hash_at };
        let link = |writer, seq| Link { writer, seq, hash: h((writer * 10 + seq as u32) as u8) };
        // Links below or at the heads: fresh, whatever SYNC record the server stored last.
        assert_eq!(check_fresh(&view, &[link(1, 4), link(2, 3)]), Ok(()));
        assert_eq!(check_fresh(&view, &[]), Ok(()));
        // A link past a head, or of a writer it has nothing of: behind.
        assert_eq!(check_fresh(&view, &[link(2, 10)]), Err(Stale::Behind { writer: 2, have: Some(9), need: 10 }));
        assert_eq!(check_fresh(&view, &[link(3, 0)]), Err(Stale::Behind { writer: 3, have: None, need: 0 }));
        // Another record at a linked slot: conflict.
        let other = Link { writer: 1, seq: 2, hash: h(99) };
        assert_eq!(
            check_fresh(&view, &[other]),
            Err(Stale::Conflict { writer: 1, seq: 2, held: h(12), linked: h(99) })
        );
    }
}
