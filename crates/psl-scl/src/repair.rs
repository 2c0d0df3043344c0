//! [`Repair`]: the node's side of gap repair that is not the orderer's (a handler of the
//! [`NodeCore`](crate::NodeCore)): the cache of applied and own records that answers peers'
//! repair requests, the queue of answers owed, and the peers' unauthenticated heads hints
//! not yet turned into requests. Each is bounded: the cache by records and bytes (oldest
//! evicted first; the capsule servers answer for what it dropped), the answer queue by
//! [`ANSWERS_QUEUED_MAX`] requests (oldest dropped first), the hints by
//! [`HEADS_MAX`](crate::wire::HEADS_MAX) writers (highest indices dropped first).

use crate::wire::Msg;
use psl_capsule::{CapsuleName, Record};
use std::collections::{BTreeMap, VecDeque};

/// Most repair requests queued for an answer; beyond it the oldest are dropped (the asker
/// asks again, or a server answers).
pub const ANSWERS_QUEUED_MAX: usize = 1024;

/// Records kept for repair answers, by (writer, seq), within a count and a byte bound.
#[derive(Debug, Default)]
struct Cache {
    by_slot: BTreeMap<(u32, u64), Record>,
    order: VecDeque<(u32, u64)>,
    max: usize,
    bytes_max: usize,
    /// Bytes of the records in `by_slot`.
    bytes: usize,
}

impl Cache {
    fn new(max: usize, bytes_max: usize) -> Cache {
        Cache { max, bytes_max, ..Default::default() }
    }

    fn insert(&mut self, r: &Record) {
        let k = (r.header().writer, r.header().seq);
        let len = r.bytes().len();
        match self.by_slot.insert(k, r.clone()) {
            None => self.order.push_back(k),
            Some(old) => self.bytes -= old.bytes().len(),
        }
        self.bytes += len;
        while self.order.len() > self.max || (self.bytes > self.bytes_max && self.order.len() > 1) {
            if let Some(old) = self.order.pop_front() {
                if let Some(gone) = self.by_slot.remove(&old) {
                    self.bytes -= gone.bytes().len();
                }
            }
        }
        debug_assert_eq!(self.order.len(), self.by_slot.len(), "every cached record has one place in the order");
    }
}

/// The repair cache, the answers owed and the hints pending (see the module docs).
#[derive(Debug)]
pub(crate) struct Repair {
    cache: Cache,
    /// Outstanding repair answers: (writer, next seq to send, last seq).
    answering: VecDeque<(u32, u64, u64)>,
    /// Hinted heads not yet acted on: writer -> seq.
    hinted: BTreeMap<u32, u64>,
}

impl Repair {
    /// An empty handler whose cache holds at most `records_max` records and `bytes_max` bytes.
    pub(crate) fn new(records_max: usize, bytes_max: usize) -> Repair {
        Repair { cache: Cache::new(records_max, bytes_max), answering: VecDeque::new(), hinted: BTreeMap::new() }
    }

    /// Whether repair answers are owed (sent at the next ticks).
    pub(crate) fn owes_answers(&self) -> bool {
        !self.answering.is_empty()
    }

    /// Whether hinted heads wait to be asked for.
    pub(crate) fn has_hints(&self) -> bool {
        !self.hinted.is_empty()
    }

    /// Keeps `r` to answer repairs; returns the cache's size in bytes after it.
    pub(crate) fn cache(&mut self, r: &Record) -> usize {
        self.cache.insert(r);
        self.cache.bytes
    }

    /// A repair request for `writer`'s `from_seq ..= to_seq`, answered at most `chunk` records
    /// at a time: queued once (a repeat of a queued request is not queued again).
    pub(crate) fn on_request(&mut self, writer: u32, from_seq: u64, to_seq: u64, chunk: u64) {
        let to = to_seq.min(from_seq.saturating_add(chunk.max(1) - 1));
        if !self.answering.iter().any(|a| *a == (writer, from_seq, to)) {
            self.answering.push_back((writer, from_seq, to));
        }
        while self.answering.len() > ANSWERS_QUEUED_MAX {
            self.answering.pop_front();
        }
    }

    /// A hint that `writer` has records up to `seq`: kept (the highest per writer) until the
    /// orderer asks for them.
    pub(crate) fn on_hint(&mut self, writer: u32, seq: u64) {
        let e = self.hinted.entry(writer).or_insert(seq);
        *e = (*e).max(seq);
        while self.hinted.len() > crate::wire::HEADS_MAX {
            self.hinted.pop_last();
        }
    }

    /// The hints pending, for the orderer to turn into requests (it removes what it asked for).
    pub(crate) fn hints_mut(&mut self) -> &mut BTreeMap<u32, u64> {
        &mut self.hinted
    }

    /// The cached records owed to askers, at most `budget` of them, as `Msg::Record`s of
    /// capsule `name`, oldest request first; what the budget leaves is owed at the next call.
    pub(crate) fn answers(&mut self, name: CapsuleName, mut budget: usize) -> Vec<Msg> {
        let mut out = Vec::new();
        while budget > 0 {
            let Some((w, from, to)) = self.answering.pop_front() else { break };
            let mut s = from;
            while s <= to && budget > 0 {
                if let Some(r) = self.cache.by_slot.get(&(w, s)) {
                    out.push(Msg::Record { capsule: name, bytes: r.shared_bytes() });
                    budget -= 1;
                }
                s += 1;
            }
            if s <= to {
                self.answering.push_front((w, s, to));
            }
        }
        out
    }

    /// Forgets everything (RESET): the cache keeps its bounds.
    pub(crate) fn clear(&mut self) {
        self.cache = Cache::new(self.cache.max, self.cache.bytes_max);
        self.answering.clear();
        self.hinted.clear();
    }

    /// Records in the cache.
    #[cfg(test)]
    fn cached(&self) -> usize {
        self.cache.by_slot.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use psl_capsule::{new_capsule, Author, Limits};
    use psl_crypto::OwnerKey;

    /// A handler whose cache holds at most `records_max` records, given `n` records of
    /// writer 5 (seqs 0 ..n) to cache.
    fn filled(n: usize, records_max: usize) -> (CapsuleName, Repair) {
        let owner = OwnerKey::from_seed(&[31; 32]).unwrap();
        let meta = new_capsule(&owner, 1, "repair", 1, Limits::default()).unwrap();
        let mut a = Author::new(&meta, &owner.app(1).unwrap(), 5).unwrap();
        let mut r = Repair::new(records_max, usize::MAX);
        for i in 0..n {
            r.cache(&a.write_ops([(format!("k{i}"), Some("v"))]).unwrap());
        }
        (meta.name(), r)
    }

    fn seqs(msgs: &[Msg]) -> Vec<u64> {
        msgs.iter()
            .map(|m| match m {
                Msg::Record { bytes, .. } => Record::decode(bytes, &Limits::default()).unwrap().header().seq,
                _ => panic!("not a record"),
            })
            .collect()
    }

    #[test]
    fn answers_keep_to_the_budget_and_carry_the_rest_over() {
        let (name, mut r) = filled(6, 100);
        r.on_request(5, 1, 4, 64);
        r.on_request(5, 1, 4, 64);
        assert_eq!(seqs(&r.answers(name, 3)), [1, 2, 3], "one request queued once, three records this tick");
        assert_eq!(seqs(&r.answers(name, 3)), [4]);
        assert!(r.answers(name, 3).is_empty());
        // A request longer than the chunk is cut to it.
        r.on_request(5, 0, 5, 2);
        assert_eq!(seqs(&r.answers(name, 10)), [0, 1]);
    }

    #[test]
    fn the_cache_keeps_to_its_record_bound_and_answers_only_what_it_holds() {
        let (name, mut r) = filled(5, 2);
        assert_eq!(r.cached(), 2);
        r.on_request(5, 0, 4, 64);
        assert_eq!(seqs(&r.answers(name, 10)), [3, 4], "the oldest were evicted");
    }

    #[test]
    fn queued_answers_and_hints_are_bounded() {
        let mut r = Repair::new(1, usize::MAX);
        for s in 0..(ANSWERS_QUEUED_MAX as u64 + 10) {
            r.on_request(1, s, s, 1);
        }
        assert_eq!(r.answering.len(), ANSWERS_QUEUED_MAX);
        assert_eq!(r.answering.front(), Some(&(1, 10, 10)), "the oldest requests were dropped");
        for w in 0..(crate::wire::HEADS_MAX as u32 + 5) {
            r.on_hint(w, 7);
        }
        r.on_hint(0, 3);
        r.on_hint(0, 9);
        assert_eq!(r.hinted.len(), crate::wire::HEADS_MAX);
        assert_eq!(r.hinted[&0], 9, "the highest hint per writer is kept");
        r.clear();
        assert!(r.answering.is_empty() && r.hinted.is_empty() && r.cached() == 0);
    }
}
