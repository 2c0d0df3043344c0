//! The in-memory index: where each record's frame is, and each writer's chain by seq.
//! It holds hashes and offsets only, never record bytes.

use psl_capsule::{Head, Kind, Record};
use psl_crypto::Hash256;
use std::collections::{BTreeMap, HashMap};
use std::fmt;

/// Where a record's frame is in `records.log`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Loc {
    /// Offset of the frame header.
    pub offset: u64,
    /// Record bytes (the frame is 8 bytes longer).
    pub len: u32,
}

/// One writer's chain: hashes by seq, and what a [`Head`] needs about the newest record.
#[derive(Debug, Clone, Default)]
pub(crate) struct Chain {
    pub hashes: Vec<Hash256>,
    pub lamport: u64,
    pub epoch: u64,
}

impl Chain {
    pub fn next_seq(&self) -> u64 {
        self.hashes.len() as u64
    }

    pub fn head_hash(&self) -> Hash256 {
        self.hashes.last().copied().unwrap_or(Hash256::ZERO)
    }
}

/// Why a verified record found in the log could not join its writer's chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OrphanCause {
    /// Its seq is past the writer's next seq: an earlier record is missing (damaged).
    Gap {
        /// The writer's next seq: the seq its chain ends before.
        expected: u64,
    },
    /// Its seq is the next one but its `prev` is not the writer's head.
    Prev {
        /// Hash of the writer's head, which `prev` should have named.
        expected: Hash256,
    },
    /// Another record already holds its (writer, seq) slot.
    SlotTaken {
        /// Hash of the record loaded in that slot.
        stored: Hash256,
    },
    /// A revocation found in the log refuses it (its writer, from that epoch or seq on): it was
    /// stored before the revocation was known. It and its writer's later records are not loaded.
    Revoked {
        /// The revocation's epoch bound: the writer's records of this epoch or later are refused.
        from_epoch: u64,
        /// The revocation's seq bound: the writer's records from this seq on are refused
        /// (`u64::MAX`: no seq bound).
        from_seq: u64,
    },
}

/// [`Orphan::index`] of a record cut by a revocation found later in the log: the open keeps
/// no frame numbers once a record is loaded, so only its offset is named.
pub const FRAME_INDEX_UNKNOWN: u64 = u64::MAX;

/// A record that verified but was not loaded, because it cannot extend its writer's chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Orphan {
    /// Position of the frame in the log, from 0 ([`FRAME_INDEX_UNKNOWN`] if not known).
    pub index: u64,
    /// Byte offset of the frame header in `records.log`.
    pub offset: u64,
    /// The record's writer.
    pub writer: u32,
    /// The record's seq in its writer's chain.
    pub seq: u64,
    /// The record's hash.
    pub hash: Hash256,
    /// Why it could not join its writer's chain.
    pub cause: OrphanCause,
}

impl fmt::Display for Orphan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.index == FRAME_INDEX_UNKNOWN {
            write!(f, "records.log frame at offset {}: ", self.offset)?;
        } else {
            write!(f, "records.log frame #{} at offset {}: ", self.index, self.offset)?;
        }
        write!(f, "record {} (writer {}, seq {}) is orphaned: ", self.hash, self.writer, self.seq)?;
        match &self.cause {
            OrphanCause::Gap { expected } => {
                write!(f, "the writer's chain ends before seq {expected}")
            }
            OrphanCause::Prev { expected } => {
                write!(f, "its prev does not point at the writer's head {expected}")
            }
            OrphanCause::SlotTaken { stored } => {
                write!(f, "the slot is already held by record {stored}")
            }
            OrphanCause::Revoked { from_epoch, from_seq } => {
                write!(f, "its writer is revoked from epoch {from_epoch} or seq {from_seq} on")
            }
        }
    }
}

pub(crate) enum Placement {
    Extends,
    Duplicate,
    Orphan(OrphanCause),
}

#[derive(Debug, Default, Clone)]
pub(crate) struct Index {
    pub locs: HashMap<Hash256, Loc>,
    pub chains: BTreeMap<u32, Chain>,
    /// (epoch, seq, hash) of the newest SYNC.
    pub latest_sync: Option<(u64, u64, Hash256)>,
}

impl Index {
    pub fn chain(&self, writer: u32) -> Option<&Chain> {
        self.chains.get(&writer)
    }

    /// Where `rec` would go if appended now.
    pub fn place(&self, rec: &Record) -> Placement {
        if self.locs.contains_key(&rec.hash()) {
            return Placement::Duplicate;
        }
        let h = rec.header();
        let (next, head) = self.chain(h.writer).map(|c| (c.next_seq(), c.head_hash())).unwrap_or((0, Hash256::ZERO));
        if h.seq < next {
            let stored = self.chains[&h.writer].hashes[h.seq as usize];
            Placement::Orphan(OrphanCause::SlotTaken { stored })
        } else if h.seq > next {
            Placement::Orphan(OrphanCause::Gap { expected: next })
        } else if h.prev != head {
            Placement::Orphan(OrphanCause::Prev { expected: head })
        } else {
            Placement::Extends
        }
    }

    /// Adds a record that extends its writer's chain.
    pub fn push(&mut self, rec: &Record, loc: Loc) {
        let h = rec.header();
        let chain = self.chains.entry(h.writer).or_default();
        assert_eq!(chain.next_seq(), h.seq, "index push out of chain order");
        assert_eq!(chain.head_hash(), h.prev, "index push does not extend the chain");
        chain.hashes.push(rec.hash());
        chain.lamport = h.lamport;
        chain.epoch = h.epoch;
        let fresh = self.locs.insert(rec.hash(), loc).is_none();
        assert!(fresh, "index push of a record already indexed");
        if h.kind == Kind::Sync && self.latest_sync.is_none_or(|(e, s, _)| (h.epoch, h.seq) > (e, s)) {
            self.latest_sync = Some((h.epoch, h.seq, rec.hash()));
        }
    }

    /// Cuts `writer`'s chain to its first `seq` records, returning the hashes removed, newest
    /// last. The caller sets the chain's head fields (`lamport`, `epoch`) and the newest SYNC
    /// from the records kept.
    pub fn truncate(&mut self, writer: u32, seq: u64) -> Vec<Hash256> {
        let Some(chain) = self.chains.get_mut(&writer) else { return Vec::new() };
        let cut: Vec<Hash256> = chain.hashes.split_off((seq as usize).min(chain.hashes.len()));
        for h in &cut {
            self.locs.remove(h);
        }
        if chain.hashes.is_empty() {
            self.chains.remove(&writer);
        }
        if self.latest_sync.is_some_and(|(_, _, h)| cut.contains(&h)) {
            self.latest_sync = None;
        }
        cut
    }

    pub fn heads(&self) -> BTreeMap<u32, Head> {
        self.chains
            .iter()
            .filter_map(|(&writer, c)| {
                let hash = *c.hashes.last()?;
                Some((writer, Head { writer, seq: c.next_seq() - 1, hash, lamport: c.lamport, epoch: c.epoch }))
            })
            .collect()
    }

    /// Cheap self-consistency: every chain hash is indexed and the counts agree.
    pub fn consistent(&self) -> bool {
        let total: usize = self.chains.values().map(|c| c.hashes.len()).sum();
        total == self.locs.len() && self.chains.values().all(|c| c.hashes.iter().all(|h| self.locs.contains_key(h)))
    }
}
