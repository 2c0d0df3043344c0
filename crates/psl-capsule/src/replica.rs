//! An in-memory replica: a set of verified records of one capsule, and the checks that only a
//! whole replica can make (chains, links, equivocation).
//!
//! A replica is a grow-only set, so [`Replica::merge`] (set union) is commutative, associative
//! and idempotent: replicas that have seen the same records are equal, whatever the order.
//! Conflicts (equivocation) are kept as evidence and reported by [`Replica::check`], never
//! resolved silently.

use crate::meta::CapsuleName;
use crate::record::{Kind, Record};
use crate::verify::Verified;
use psl_crypto::Hash256;
use std::collections::BTreeMap;
use std::fmt;

/// A grow-only set of verified records of one capsule, keyed by record hash, with an index by
/// (writer, seq) that keeps every record claiming a slot.
#[derive(Clone, PartialEq, Eq)]
pub struct Replica {
    capsule: CapsuleName,
    records: BTreeMap<Hash256, Verified<Record>>,
    /// (writer, seq) → hashes claiming that slot (more than one is equivocation).
    slots: BTreeMap<(u32, u64), Vec<Hash256>>,
}

impl fmt::Debug for Replica {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Replica({} records of {:?})", self.records.len(), self.capsule)
    }
}

/// A record or replica of another capsule was offered to a replica; nothing was added.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("record of capsule {found} cannot join a replica of capsule {expected}")]
pub struct WrongCapsule {
    /// The replica's capsule.
    pub expected: CapsuleName,
    /// The capsule of the record or replica offered.
    pub found: CapsuleName,
}

/// A problem that concerns the relation between records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChainProblem {
    /// Two or more different records claim one (writer, seq).
    Equivocation {
        /// The writer of the slot.
        writer: u32,
        /// The seq claimed more than once.
        seq: u64,
        /// The hashes of every record claiming the slot, sorted.
        hashes: Vec<Hash256>,
    },
    /// Seqs `from ..= to` of a writer are missing below a record that exists.
    Gap {
        /// The writer whose chain has the gap.
        writer: u32,
        /// First missing seq.
        from: u64,
        /// Last missing seq (inclusive).
        to: u64,
    },
    /// A record's `prev` is not the hash of the writer's record `seq - 1`.
    BrokenPrev {
        /// The writer whose chain holds the record.
        writer: u32,
        /// The record's seq.
        seq: u64,
        /// The record's hash.
        hash: Hash256,
        /// The `prev` the record names.
        prev: Hash256,
        /// The hash of the one record the replica holds at `seq - 1`.
        actual: Hash256,
    },
    /// A link names a (writer, seq) whose record in this replica is another one, or points at
    /// a record the replica holds under another (writer, seq).
    DanglingLink {
        /// The writer whose chain holds the linking record.
        writer: u32,
        /// The linking record's seq.
        seq: u64,
        /// The linking record's hash.
        hash: Hash256,
        /// The hash the link names.
        target: Hash256,
    },
    /// A link points at a record this replica does not hold at all (neither the hash nor
    /// anything at the named slot). In a file that claims to be the whole capsule this is a
    /// problem like any other; in a live replica it is lag (the record was lost on the fabric or
    /// its writer crashed after sending it to some peers), which anti-entropy fills: see
    /// [`ChainProblem::is_incompleteness`].
    MissingLinkTarget {
        /// The writer whose chain holds the linking record.
        writer: u32,
        /// The linking record's seq.
        seq: u64,
        /// The linking record's hash.
        hash: Hash256,
        /// The hash the link names.
        target: Hash256,
        /// The writer the link names.
        target_writer: u32,
        /// The seq the link names.
        target_seq: u64,
    },
    /// A data record links to something that is not a SYNC of the record's epoch.
    LinkEpoch {
        /// The writer whose chain holds the data record.
        writer: u32,
        /// The data record's seq.
        seq: u64,
        /// The data record's hash.
        hash: Hash256,
        /// The hash of the linked record, which is not a SYNC of that epoch.
        target: Hash256,
    },
    /// Lamport time or epoch goes backwards along a writer's chain.
    Regression {
        /// The writer whose chain holds the record.
        writer: u32,
        /// The record's seq.
        seq: u64,
        /// The record's hash.
        hash: Hash256,
        /// What goes backwards from `seq - 1`: `lamport time` or `epoch`.
        what: &'static str,
    },
}

impl ChainProblem {
    /// The check's stable name.
    pub fn check(&self) -> &'static str {
        match self {
            ChainProblem::Equivocation { .. } => "equivocation",
            ChainProblem::Gap { .. } => "gap",
            ChainProblem::BrokenPrev { .. } => "prev",
            ChainProblem::DanglingLink { .. } => "link",
            ChainProblem::MissingLinkTarget { .. } => "link-missing",
            ChainProblem::LinkEpoch { .. } => "link-epoch",
            ChainProblem::Regression { .. } => "monotonic",
        }
    }

    /// The writer whose chain (or whose record) has the problem.
    pub fn writer(&self) -> u32 {
        match self {
            ChainProblem::Equivocation { writer, .. }
            | ChainProblem::Gap { writer, .. }
            | ChainProblem::BrokenPrev { writer, .. }
            | ChainProblem::DanglingLink { writer, .. }
            | ChainProblem::MissingLinkTarget { writer, .. }
            | ChainProblem::LinkEpoch { writer, .. }
            | ChainProblem::Regression { writer, .. } => *writer,
        }
    }

    /// True for what a replica that is merely behind its peers shows (a link to a record it
    /// has not received yet), as opposed to records that contradict each other. A store's check
    /// reports these as notes, not damage: nothing in the store is wrong, it is incomplete.
    pub fn is_incompleteness(&self) -> bool {
        matches!(self, ChainProblem::MissingLinkTarget { .. })
    }
}

impl ChainProblem {
    /// What is wrong, without naming the record (callers name it their own way).
    pub fn detail(&self) -> String {
        match self {
            ChainProblem::Equivocation { hashes, .. } => {
                let hs: Vec<String> = hashes.iter().map(|h| h.to_hex()).collect();
                format!("{} different records claim this slot: {}", hashes.len(), hs.join(", "))
            }
            ChainProblem::Gap { from, to, .. } => format!("seqs {from}..={to} are missing below a later record"),
            ChainProblem::BrokenPrev { seq, prev, actual, .. } => {
                format!("prev points at {prev}, but seq {} is {actual}", seq - 1)
            }
            ChainProblem::DanglingLink { target, .. } => format!("link target {target} is not in the replica as named"),
            ChainProblem::MissingLinkTarget { target, target_writer, target_seq, .. } => {
                format!("link target {target} (writer {target_writer}, seq {target_seq}) is not in the replica")
            }
            ChainProblem::LinkEpoch { target, .. } => format!("{target} is not the SYNC of this record's epoch"),
            ChainProblem::Regression { what, .. } => format!("{what} goes backwards along the chain"),
        }
    }
}

impl fmt::Display for ChainProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChainProblem::Equivocation { writer, seq, .. } => write!(f, "writer {writer}, seq {seq}")?,
            ChainProblem::Gap { writer, .. } => write!(f, "writer {writer}")?,
            ChainProblem::BrokenPrev { writer, seq, hash, .. }
            | ChainProblem::DanglingLink { writer, seq, hash, .. }
            | ChainProblem::MissingLinkTarget { writer, seq, hash, .. }
            | ChainProblem::LinkEpoch { writer, seq, hash, .. }
            | ChainProblem::Regression { writer, seq, hash, .. } => {
                write!(f, "record {hash} (writer {writer}, seq {seq})")?
            }
        }
        write!(f, ": {} check failed: {}", self.check(), self.detail())
    }
}

/// The newest record of a writer's unbroken chain from seq 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    /// The writer.
    pub writer: u32,
    /// Seq of the head record; the writer's next record takes `seq + 1`.
    pub seq: u64,
    /// Hash of the head record; the writer's next record names it as `prev`.
    pub hash: Hash256,
    /// The head record's Lamport time.
    pub lamport: u64,
    /// The head record's epoch.
    pub epoch: u64,
}

impl Replica {
    /// An empty replica of `capsule`.
    pub fn new(capsule: CapsuleName) -> Replica {
        Replica { capsule, records: BTreeMap::new(), slots: BTreeMap::new() }
    }

    /// The capsule whose records this replica holds.
    pub fn capsule(&self) -> CapsuleName {
        self.capsule
    }

    /// Number of distinct records (by hash) held.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether the replica holds no record.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Adds a record. Returns whether it was new.
    pub fn insert(&mut self, rec: Verified<Record>) -> Result<bool, WrongCapsule> {
        let h = rec.header();
        if h.capsule != self.capsule {
            return Err(WrongCapsule { expected: self.capsule, found: h.capsule });
        }
        let hash = rec.hash();
        if let Some(have) = self.records.get_mut(&hash) {
            // Same record (the hash is its identity). Only the key holder can sign one hash twice;
            // keep the smaller signature so that the set does not depend on arrival order.
            if rec.signature().0 < have.signature().0 {
                *have = rec;
            }
            return Ok(false);
        }
        let slot = self.slots.entry((h.writer, h.seq)).or_default();
        slot.push(hash);
        slot.sort();
        self.records.insert(hash, rec);
        Ok(true)
    }

    /// Set union with `other`. Returns how many records were new.
    pub fn merge(&mut self, other: &Replica) -> Result<usize, WrongCapsule> {
        if other.capsule != self.capsule {
            return Err(WrongCapsule { expected: self.capsule, found: other.capsule });
        }
        let mut n = 0;
        for r in other.records.values() {
            n += self.insert(r.clone())? as usize;
        }
        Ok(n)
    }

    /// The record with record hash `hash`, if held.
    pub fn get(&self, hash: &Hash256) -> Option<&Verified<Record>> {
        self.records.get(hash)
    }

    /// Records that claim (writer, seq): one normally, several under equivocation.
    pub fn at(&self, writer: u32, seq: u64) -> impl Iterator<Item = &Verified<Record>> {
        self.slots.get(&(writer, seq)).into_iter().flatten().filter_map(|h| self.records.get(h))
    }

    /// Every record, ordered by hash.
    pub fn iter(&self) -> impl Iterator<Item = &Verified<Record>> {
        self.records.values()
    }

    /// Every record in chain order: by writer, then seq (then hash, under equivocation).
    /// Appending in this order to a chain-checking store always succeeds for a sound replica.
    pub fn in_chain_order(&self) -> impl Iterator<Item = &Verified<Record>> {
        self.slots.values().flatten().filter_map(|h| self.records.get(h))
    }

    /// Every writer with at least one record here, ascending.
    pub fn writers(&self) -> Vec<u32> {
        let mut w: Vec<u32> = self.slots.keys().map(|(w, _)| *w).collect();
        w.dedup();
        w
    }

    /// Each writer's newest record reachable from seq 0 without a gap or a conflict.
    pub fn heads(&self) -> BTreeMap<u32, Head> {
        let mut heads = BTreeMap::new();
        for w in self.writers() {
            let mut prev = Hash256::ZERO;
            let mut seq = 0u64;
            while let Some(hs) = self.slots.get(&(w, seq)) {
                if hs.len() != 1 {
                    break;
                }
                let r = &self.records[&hs[0]];
                if r.header().prev != prev {
                    break;
                }
                let h = r.header();
                heads.insert(w, Head { writer: w, seq, hash: hs[0], lamport: h.lamport, epoch: h.epoch });
                prev = hs[0];
                seq += 1;
            }
        }
        heads
    }

    /// The SYNC record with the highest epoch, if any.
    pub fn latest_sync(&self) -> Option<&Verified<Record>> {
        self.records
            .values()
            .filter(|r| r.header().kind == Kind::Sync)
            .max_by_key(|r| (r.header().epoch, r.header().seq))
    }

    /// Largest Lamport time in the replica.
    pub fn max_lamport(&self) -> u64 {
        self.records.values().map(|r| r.header().lamport).max().unwrap_or(0)
    }

    /// Every relational problem, in a stable order. Empty means: each writer's chain is dense
    /// from seq 0 and linked by `prev`, no slot is claimed twice, every link resolves, and
    /// neither Lamport time nor epoch goes backwards along a chain.
    pub fn check(&self) -> Vec<ChainProblem> {
        let mut out = Vec::new();
        let mut expected_seq: BTreeMap<u32, u64> = BTreeMap::new();
        for (&(writer, seq), hashes) in &self.slots {
            let next = expected_seq.entry(writer).or_insert(0);
            if seq > *next {
                out.push(ChainProblem::Gap { writer, from: *next, to: seq - 1 });
            }
            *next = seq + 1;
            if hashes.len() > 1 {
                out.push(ChainProblem::Equivocation { writer, seq, hashes: hashes.clone() });
            }
            for hash in hashes {
                let rec = &self.records[hash];
                let h = rec.header();
                if seq > 0 {
                    if let Some(prevs) = self.slots.get(&(writer, seq - 1)) {
                        if prevs.len() == 1 && prevs[0] != h.prev {
                            out.push(ChainProblem::BrokenPrev {
                                writer,
                                seq,
                                hash: *hash,
                                prev: h.prev,
                                actual: prevs[0],
                            });
                        }
                        if prevs.len() == 1 {
                            let p = self.records[&prevs[0]].header();
                            if p.lamport > h.lamport {
                                out.push(ChainProblem::Regression { writer, seq, hash: *hash, what: "lamport time" });
                            } else if p.epoch > h.epoch {
                                out.push(ChainProblem::Regression { writer, seq, hash: *hash, what: "epoch" });
                            }
                        }
                    }
                }
                for l in &h.links {
                    match self.records.get(&l.hash) {
                        Some(t) if t.header().writer == l.writer && t.header().seq == l.seq => {
                            let th = t.header();
                            if h.kind == Kind::Data && (th.kind != Kind::Sync || th.epoch != h.epoch) {
                                out.push(ChainProblem::LinkEpoch { writer, seq, hash: *hash, target: l.hash });
                            }
                        }
                        None if !self.slots.contains_key(&(l.writer, l.seq)) => {
                            out.push(ChainProblem::MissingLinkTarget {
                                writer,
                                seq,
                                hash: *hash,
                                target: l.hash,
                                target_writer: l.writer,
                                target_seq: l.seq,
                            })
                        }
                        _ => out.push(ChainProblem::DanglingLink { writer, seq, hash: *hash, target: l.hash }),
                    }
                }
            }
        }
        out
    }
}
