//! What `open`, `append`, `check` and `repair` report.

use crate::frame::{DamagedFrame, TornTail, Unreadable};
use crate::index::Orphan;
use psl_capsule::ChainProblem;
use psl_crypto::Hash256;
use std::fmt;
use std::path::PathBuf;

/// What [`crate::DiskStore::open`] found while re-verifying the log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenReport {
    /// Frame positions seen (good, damaged and unreadable regions alike).
    pub frames: u64,
    /// Records loaded: verified and extending their writer's chain.
    pub records: usize,
    /// An incomplete or invalid end of the log, cut off (unless opened read-only).
    pub torn_tail: Option<TornTail>,
    /// Bytes of `torn_tail` (0 if none).
    pub torn_tail_bytes: u64,
    /// Frames skipped because their record is bad.
    pub damaged: Vec<DamagedFrame>,
    /// Regions without trustworthy framing. Any of these makes the store refuse appends until
    /// [`crate::DiskStore::repair`].
    pub unreadable: Vec<Unreadable>,
    /// Verified records not loaded because they cannot extend their writer's chain (usually:
    /// a predecessor is damaged).
    pub orphaned: Vec<Orphan>,
    /// Frames holding a record already loaded from an earlier frame.
    pub duplicate_frames: u64,
    /// Verified records not loaded because a revocation found in the log refuses them (stored
    /// before it was known), with the rest of their writer's chain: the first of each writer with
    /// `OrphanCause::Revoked`, the others with `OrphanCause::Gap`. Not damage.
    pub revoked: Vec<Orphan>,
    /// Bytes at the start of the log that the index's checkpoint described, opened with
    /// [`crate::OpenVerify::FromCheckpoint`]: walked frame by frame and CRC-checked, its
    /// certificate records re-verified, the rest not (reads re-verify every record, and
    /// [`crate::DiskStore::check`] re-verifies everything). 0: every frame was re-verified.
    pub from_checkpoint_bytes: u64,
}

impl OpenReport {
    /// Nothing unusual: no torn tail, no damage, no orphans.
    pub fn is_clean(&self) -> bool {
        self.torn_tail.is_none() && !self.is_damaged() && self.duplicate_frames == 0
    }

    /// Some verified data could not be loaded or some bytes are corrupt (a torn tail alone is
    /// the normal trace of a crash and is not damage).
    pub fn is_damaged(&self) -> bool {
        !self.damaged.is_empty() || !self.unreadable.is_empty() || !self.orphaned.is_empty()
    }

    /// Whether the store refuses appends until it is repaired.
    pub fn needs_repair(&self) -> bool {
        !self.unreadable.is_empty()
    }

    /// One line per finding.
    pub fn problems(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        out.extend(self.torn_tail.iter().map(|t| t.to_string()));
        out.extend(self.damaged.iter().map(|d| d.to_string()));
        out.extend(self.unreadable.iter().map(|u| u.to_string()));
        out.extend(self.orphaned.iter().map(|o| o.to_string()));
        if self.duplicate_frames > 0 {
            out.push(format!("records.log holds {} duplicate frames", self.duplicate_frames));
        }
        out
    }
}

impl fmt::Display for OpenReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} records loaded from {} frames", self.records, self.frames)?;
        let p = self.problems();
        if p.is_empty() {
            write!(f, ", clean")?;
        } else {
            write!(f, "; {}", p.join("; "))?;
        }
        if !self.revoked.is_empty() {
            write!(f, "; {} records a revocation in the log refuses were not loaded", self.revoked.len())?;
        }
        if self.from_checkpoint_bytes > 0 {
            write!(f, "; the first {} bytes as the index checkpoint described them", self.from_checkpoint_bytes)?;
        }
        Ok(())
    }
}

/// What one [`crate::DiskStore::append`] (or import) did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AppendOutcome {
    /// Records written.
    pub appended: usize,
    /// Records skipped because the store (or an earlier record of the batch) already holds them.
    pub duplicates: usize,
    /// Bytes added to `records.log`.
    pub bytes: u64,
}

/// An indexed record that a check did not find intact at its offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostRecord {
    /// Hash of the record the index holds.
    pub hash: Hash256,
    /// Byte offset in `records.log` where the index says its frame is.
    pub offset: u64,
}

impl fmt::Display for LostRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "records.log offset {}: indexed record {} is no longer there intact", self.offset, self.hash)
    }
}

/// The result of [`crate::DiskStore::check`]: every frame re-read and re-verified, the chains
/// checked, and the in-memory index compared with what is on disk.
#[derive(Debug, Clone, Default)]
pub struct CheckReport {
    /// Frame positions seen (good, damaged and unreadable regions alike).
    pub frames: u64,
    /// Frames whose record verified.
    pub verified: usize,
    /// Frames skipped because their record is bad.
    pub damaged: Vec<DamagedFrame>,
    /// Regions without trustworthy framing.
    pub unreadable: Vec<Unreadable>,
    /// Bytes past the last valid frame (never truncated by a check).
    pub torn_tail: Option<TornTail>,
    /// Verified records that cannot extend their writer's chain.
    pub orphaned: Vec<Orphan>,
    /// Frames holding a record already seen in an earlier frame.
    pub duplicate_frames: u64,
    /// `Replica::check` over every verified record (orphans included, so a damaged frame
    /// shows up as a gap in its writer's chain). Those that only show the replica lagging its
    /// peers ([`ChainProblem::is_incompleteness`]: a link to a record it has not received) are
    /// [`CheckReport::lagging`], not problems.
    pub chain_problems: Vec<ChainProblem>,
    /// Records the index holds that are no longer intact at their offset.
    pub lost: Vec<LostRecord>,
    /// Records the part of the log the index describes holds that the index does not
    /// (written behind the store's back).
    pub unindexed: Vec<Hash256>,
    /// Bytes of the log checked: those the store's index describes.
    pub checked_bytes: u64,
    /// Bytes appended past them since the store's view was taken (by its running writer):
    /// not checked, not a problem (a later check covers them).
    pub appended_bytes: u64,
    /// The log is shorter than the index describes: (bytes described, bytes now).
    pub shrunk: Option<(u64, u64)>,
    /// A running writer held the store when it was opened read-only: the torn tail, if any,
    /// may be the frame it was writing ([`CheckReport::damage`] leaves it out).
    pub live_writer: bool,
}

impl CheckReport {
    /// Whether the check found no problem at all ([`CheckReport::problems`] is empty; lagging
    /// chains and appended bytes are not problems).
    pub fn is_clean(&self) -> bool {
        self.problems().is_empty()
    }

    /// Damaged frame indexes, for quick assertions.
    pub fn damaged_frames(&self) -> Vec<u64> {
        self.damaged.iter().map(|d| d.index).collect()
    }

    /// One line per problem, except a torn tail: bytes past the last whole frame are what a
    /// crash during an append leaves, or, in a live store, the frame being written; nothing in
    /// them was ever acknowledged (acks follow the fsync). Damage is everything else.
    pub fn damage(&self) -> Vec<String> {
        let torn = self.torn_tail.as_ref().map(|t| t.to_string());
        self.problems().into_iter().filter(|p| Some(p) != torn.as_ref()).collect()
    }

    /// One line per record that links a record this replica does not hold yet: lag behind the
    /// peers (a record lost on the fabric, or sent by a writer that crashed before every server
    /// had it), which anti-entropy fills; not damage (nothing held contradicts anything).
    pub fn lagging(&self) -> Vec<String> {
        self.chain_problems.iter().filter(|c| c.is_incompleteness()).map(|c| c.to_string()).collect()
    }

    /// One line per problem.
    pub fn problems(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        if let Some((described, now)) = self.shrunk {
            out.push(format!("records.log is {now} bytes, shorter than the {described} bytes the index describes"));
        }
        out.extend(self.damaged.iter().map(|d| d.to_string()));
        out.extend(self.unreadable.iter().map(|u| u.to_string()));
        out.extend(self.torn_tail.iter().map(|t| t.to_string()));
        out.extend(self.orphaned.iter().map(|o| o.to_string()));
        if self.duplicate_frames > 0 {
            out.push(format!("records.log holds {} duplicate frames", self.duplicate_frames));
        }
        out.extend(self.chain_problems.iter().filter(|c| !c.is_incompleteness()).map(|c| c.to_string()));
        out.extend(self.lost.iter().map(|l| l.to_string()));
        out.extend(self.unindexed.iter().map(|h| format!("records.log holds record {h} that the index does not know")));
        out
    }
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} frames, {} verified", self.frames, self.verified)?;
        let p = self.problems();
        if p.is_empty() {
            write!(f, ", clean")
        } else {
            write!(f, "; {}", p.join("; "))
        }
    }
}

/// What [`crate::DiskStore::repair`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairReport {
    /// A hard link to the log as it was before the repair, kept for forensics.
    pub backup: PathBuf,
    /// Records in the rewritten log.
    pub kept: usize,
    /// Frames (or unreadable regions) of the old log that the new one does not carry.
    pub dropped: u64,
    /// Size of the old log, in bytes.
    pub bytes_before: u64,
    /// Size of the rewritten log, in bytes.
    pub bytes_after: u64,
}
