//! [`Barriers`]: the node's pending `sync()` calls (a handler of the
//! [`NodeCore`](crate::NodeCore)). A barrier completes after two SYNCs: the first links a
//! record each own writer wrote after the call; the second closes the next epoch, once the
//! node has applied everything it links (see [`NodeCore::begin_sync`](crate::NodeCore::begin_sync)).

use psl_capsule::Link;
use std::collections::BTreeMap;

/// A pending `sync()`: see [`NodeCore::begin_sync`](crate::NodeCore::begin_sync).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncTicket {
    id: u64,
}

#[derive(Debug)]
struct SyncWait {
    /// Own writers' next seqs when the call began: the first SYNC must link a later record.
    need: BTreeMap<u32, u64>,
    /// Epoch of that first SYNC, once seen.
    first: Option<u64>,
    done: bool,
}

/// The pending barriers, by ticket.
#[derive(Debug, Default)]
pub(crate) struct Barriers {
    waits: BTreeMap<u64, SyncWait>,
    next_id: u64,
}

impl Barriers {
    /// Starts a barrier that needs, for each own writer, a SYNC linking its record at or past
    /// `need[writer]`.
    pub(crate) fn begin(&mut self, need: BTreeMap<u32, u64>) -> SyncTicket {
        let id = self.next_id;
        self.next_id += 1;
        self.waits.insert(id, SyncWait { need, first: None, done: false });
        SyncTicket { id }
    }

    /// Whether the barrier has completed (and forgets it if so). A forgotten one (a RESET
    /// cleared it) counts as done: its caller must not wait forever.
    pub(crate) fn done(&mut self, t: &SyncTicket) -> bool {
        match self.waits.get(&t.id) {
            Some(w) if w.done => {
                self.waits.remove(&t.id);
                true
            }
            Some(_) => false,
            None => true,
        }
    }

    /// Abandons a barrier (a caller that timed out).
    pub(crate) fn cancel(&mut self, t: &SyncTicket) {
        self.waits.remove(&t.id);
    }

    /// A SYNC of `epoch` linking `links` was applied: it is the first SYNC of each barrier it
    /// covers that had none yet.
    pub(crate) fn on_sync(&mut self, epoch: u64, links: &[Link]) {
        for w in self.waits.values_mut().filter(|w| !w.done && w.first.is_none()) {
            if w.need.iter().all(|(writer, next)| links.iter().any(|l| l.writer == *writer && l.seq >= *next)) {
                w.first = Some(epoch);
            }
        }
    }

    /// The newest SYNC applied is of `epoch`, and `covered` says whether the node holds
    /// everything it links: every barrier whose first SYNC came before it is done.
    pub(crate) fn check(&mut self, epoch: u64, covered: bool) {
        if !covered {
            return;
        }
        for w in self.waits.values_mut() {
            if w.first.is_some_and(|e| epoch > e) {
                w.done = true;
            }
        }
    }

    /// Whether any barrier waits (one completed but not yet asked about does not).
    pub(crate) fn pending(&self) -> bool {
        self.waits.values().any(|w| !w.done)
    }

    /// Forgets every barrier (RESET).
    pub(crate) fn clear(&mut self) {
        self.waits.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use psl_crypto::Hash256;

    fn link(writer: u32, seq: u64) -> Link {
        Link { writer, seq, hash: Hash256::ZERO }
    }

    #[test]
    fn a_barrier_needs_a_sync_past_its_writes_then_the_next_one_applied_in_full() {
        let mut b = Barriers::default();
        let t = b.begin(BTreeMap::from([(1, 5), (2, 0)]));
        // A SYNC that links writer 1 below what it had when the call began: not the first.
        b.on_sync(3, &[link(1, 4), link(2, 0)]);
        b.check(3, true);
        assert!(!b.done(&t));
        b.on_sync(4, &[link(1, 5), link(2, 0)]);
        b.check(4, true);
        assert!(!b.done(&t), "the first SYNC alone does not complete it");
        // The next SYNC, but its links are not all applied yet.
        b.check(5, false);
        assert!(!b.done(&t));
        b.check(5, true);
        assert!(b.done(&t));
        assert!(b.waits.is_empty(), "a completed barrier is forgotten once asked");
    }

    #[test]
    fn a_cancelled_or_cleared_barrier_is_never_waited_for() {
        let mut b = Barriers::default();
        let (t1, t2) = (b.begin(BTreeMap::new()), b.begin(BTreeMap::new()));
        assert_ne!(t1, t2);
        b.cancel(&t1);
        assert!(b.done(&t1));
        b.clear();
        assert!(b.done(&t2));
    }

    #[test]
    fn a_node_without_writers_takes_any_sync_as_the_first() {
        let mut b = Barriers::default();
        let t = b.begin(BTreeMap::new());
        b.on_sync(7, &[]);
        b.check(7, true);
        assert!(!b.done(&t));
        b.on_sync(8, &[]);
        b.check(8, true);
        assert!(b.done(&t));
    }
}
