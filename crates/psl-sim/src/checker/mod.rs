//! The invariants, one checker per invariant (each in its own file), over the [`History`] of
//! what honest writers did.
//!
//! - [`unverified`]: **no unverified byte applied** (every memtable entry of every node is an
//!   op some honest writer issued, with that exact version and value) and **no unverified
//!   record stored** (every record any server wrote to its disk is one an honest writer
//!   sealed); corrupted, replayed or forged messages never show up as data.
//! - [`coherence`]: on every node, the version of each key only moves forward.
//! - [`equivocation`]: **no equivocation** among honest writers: none reported by a node or a
//!   server, and no (writer, seq) signed twice with different hashes (a restarted node writes
//!   under a new incarnation; a restarted coordinator resumes after the newest seq it signed).
//! - [`read_your_writes`]: right after a local write returns, its node shows that write's
//!   version for the key, newer than the version it showed before.
//! - [`durability`]: with capsule servers, **durable means on f + 1 disks** (every record a node
//!   ever counted durable is in the synced part of at least f + 1 servers' disks, whatever
//!   crashed), a node rebuilt from a majority of the servers holds every durable write at once,
//!   and in the end every memtable holds every op of a durable record.
//! - [`convergence`]: once faults stop, every live node's memtable becomes identical within
//!   `settle_ms`.
//! - [`completeness`]: in the end, no op sealed by a node that never crashed is missing (with
//!   no crash, the memtables equal the last-writer-wins result of every op issued).
//! - [`revocation`]: in the end, every live node and server has learnt a revocation.

pub mod coherence;
pub mod completeness;
pub mod convergence;
pub mod durability;
pub mod equivocation;
pub mod read_your_writes;
pub mod revocation;
pub mod unverified;

use crate::node::SimNode;
use psl_crypto::Hash256;
use psl_scl::Version;
use std::collections::{HashMap, HashSet};

/// The data ops of one record: (key, version).
pub type KeyVersions = Vec<(Vec<u8>, Version)>;

/// What honest writers did, as the run loop saw it.
pub struct History {
    /// Every record an honest writer sealed: (writer, seq) -> (hash, data ops in it).
    pub honest: HashMap<(u32, u64), (Hash256, KeyVersions)>,
    /// The hashes of every record in `honest`: what a server may store.
    pub honest_hashes: HashSet<Hash256>,
    /// Every op any honest writer issued: (key, version) -> value.
    pub issued: HashMap<(Vec<u8>, Version), Option<Vec<u8>>>,
    /// Ops sealed into records by each endpoint, for the end check.
    pub sealed_by: Vec<KeyVersions>,
}

impl History {
    /// An empty history for `endpoints` nodes and coordinators.
    pub fn new(endpoints: usize) -> History {
        History {
            honest: HashMap::new(),
            honest_hashes: HashSet::new(),
            issued: HashMap::new(),
            sealed_by: vec![Vec::new(); endpoints],
        }
    }

    /// A record an honest writer signed. Returns the hash signed before at that (writer, seq),
    /// if it differs.
    pub fn wrote(&mut self, writer: u32, seq: u64, hash: Hash256, ops: KeyVersions) -> Option<Hash256> {
        self.honest_hashes.insert(hash);
        let before = self.honest.insert((writer, seq), (hash, ops)).map(|(h, _)| h);
        before.filter(|h| *h != hash)
    }

    /// A data op endpoint `i` sealed into a record.
    pub fn sealed(&mut self, i: usize, key: Vec<u8>, version: Version, value: Option<Vec<u8>>) {
        self.sealed_by[i].push((key.clone(), version));
        self.issued.insert((key, version), value);
    }

    /// Ops still pending in a node's queues are issued too (visible in its memtable).
    pub fn pending(&mut self, node: &SimNode) {
        for (ai, pend) in node.queues.iter().enumerate() {
            let w = node.authors[ai].writer();
            for op in pend.queued() {
                let v = Version { lamport: op.lamport, writer: w };
                let val = match &op.action {
                    psl_capsule::Action::Put(x) => Some(x.clone()),
                    psl_capsule::Action::Delete => None,
                };
                self.issued.entry((op.key.clone(), v)).or_insert(val);
            }
        }
    }

    /// The ops of writer `w`'s records below seq `next`.
    pub fn ops_below<'h>(&'h self, w: u32, next: u64) -> impl Iterator<Item = &'h (Vec<u8>, Version)> + 'h {
        (0..next).flat_map(move |seq| self.honest.get(&(w, seq)).map(|(_, ops)| &ops[..]).unwrap_or(&[]))
    }
}

/// The newest version of each key in `ops`.
pub(crate) fn newest<'a>(ops: impl Iterator<Item = &'a (Vec<u8>, Version)>) -> HashMap<Vec<u8>, Version> {
    let mut model: HashMap<Vec<u8>, Version> = HashMap::new();
    for (k, v) in ops {
        let m = model.entry(k.clone()).or_insert(*v);
        if *v > *m {
            *m = *v;
        }
    }
    model
}

/// A key as text.
pub(crate) fn show(k: &[u8]) -> String {
    String::from_utf8_lossy(k).into_owned()
}
