//! The durability handler: which capsule server has acked how far of each own writer's chain
//! (acks come only after the server's fsync), the quorum that makes a record durable, and the
//! durability barriers of `sync_durable()` callers, answered with a [`QuorumDurable`] proof.
//! Signature and chain checks of acks stay with the [`NodeCore`](crate::NodeCore), which hands
//! only checked entries in ([`Durability::record`]).

use std::collections::BTreeMap;

/// A pending `sync_durable()`: see [`crate::NodeCore::begin_durable`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DurableTicket {
    pub(crate) id: u64,
}

/// How far a durability barrier got: for the own writer that is least acked, how many
/// distinct servers have acked everything it needs, and how many must.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurableStatus {
    /// Distinct servers that acked all the barrier needs of its least acked own writer (0 for a
    /// barrier no longer tracked).
    pub acked_by: usize,
    /// Servers that must ack: a majority of `servers`.
    pub quorum: usize,
    /// Capsule servers configured.
    pub servers: u32,
}

impl DurableStatus {
    /// Whether the barrier reached its quorum (`acked_by >= quorum`).
    pub fn done(&self) -> bool {
        self.acked_by >= self.quorum
    }
}

/// Proof that a quorum of capsule servers acked every own record a durability barrier waited
/// for (servers ack only after their fsync). Only the core's durability handler makes one ([`crate::NodeCore::durable_proof`]), and
/// only for a barrier it still tracks whose acks reached the quorum: the runtime's answer to a
/// durable sync carries it, so no code path can answer "durable" without the acks.
#[derive(Debug)]
pub struct QuorumDurable {
    acked_by: usize,
    quorum: usize,
}

impl QuorumDurable {
    /// How many servers acked (at least the quorum).
    pub fn acked_by(&self) -> usize {
        self.acked_by
    }

    /// How many servers had to ack (a majority of those configured).
    pub fn quorum(&self) -> usize {
        self.quorum
    }
}

/// Per server, per own writer, the acked next seq; and the open barriers.
#[derive(Debug)]
pub(crate) struct Durability {
    servers: u32,
    /// Per server id, per own writer: the server's durable next seq (everything below is acked).
    acked: BTreeMap<u32, BTreeMap<u32, u64>>,
    /// Durability barriers: own writers' next seqs that must be acked by a quorum.
    barriers: BTreeMap<u64, BTreeMap<u32, u64>>,
}

impl Durability {
    pub(crate) fn new(servers: u32) -> Durability {
        Durability { servers, acked: BTreeMap::new(), barriers: BTreeMap::new() }
    }

    /// Whether any durability barrier is open.
    pub(crate) fn waiting(&self) -> bool {
        !self.barriers.is_empty()
    }

    /// Majority of the configured servers.
    pub(crate) fn quorum(&self) -> usize {
        self.servers as usize / 2 + 1
    }

    /// What server `id` is known to hold, per own writer.
    pub(crate) fn acked(&self, id: u32) -> Option<&BTreeMap<u32, u64>> {
        self.acked.get(&id)
    }

    /// Server `id` holds own writer `writer`'s records below `next` (a checked ack entry).
    pub(crate) fn record(&mut self, id: u32, writer: u32, next: u64) {
        debug_assert!(id < self.servers, "acks only from configured servers");
        let n = self.acked.entry(id).or_default().entry(writer).or_insert(0);
        *n = (*n).max(next);
    }

    /// How many servers have acked own writer `writer` up to (excluding) `next`.
    fn acked_by(&self, writer: u32, next: u64) -> usize {
        self.acked.values().filter(|m| m.get(&writer).is_some_and(|s| *s >= next)).count()
    }

    /// Own writer `writer`'s durable next seq: every record below it is acked by a quorum.
    pub(crate) fn durable_next(&self, writer: u32) -> u64 {
        let mut v: Vec<u64> = self.acked.values().map(|m| m.get(&writer).copied().unwrap_or(0)).collect();
        v.sort_unstable_by(|a, b| b.cmp(a));
        v.get(self.quorum() - 1).copied().unwrap_or(0)
    }

    /// Opens barrier `id`: done once, for every own writer, the records below
    /// `next_seqs[writer]` are acked by a quorum.
    pub(crate) fn begin(&mut self, id: u64, next_seqs: BTreeMap<u32, u64>) -> DurableTicket {
        self.barriers.insert(id, next_seqs);
        DurableTicket { id }
    }

    /// The proof that a barrier is done, or where it stands.
    pub(crate) fn proof(&self, t: &DurableTicket) -> Result<QuorumDurable, DurableStatus> {
        let st = self.status(t);
        if st.done() && self.barriers.contains_key(&t.id) {
            debug_assert!(st.acked_by >= st.quorum);
            Ok(QuorumDurable { acked_by: st.acked_by, quorum: st.quorum })
        } else {
            Err(st)
        }
    }

    /// Where a barrier stands. One no longer tracked (a RESET forgot it) has no acks: a reset
    /// must never answer a waiting durable sync as done.
    pub(crate) fn status(&self, t: &DurableTicket) -> DurableStatus {
        let quorum = self.quorum();
        let servers = self.servers;
        let Some(need) = self.barriers.get(&t.id) else {
            return DurableStatus { acked_by: 0, quorum, servers };
        };
        let acked_by = need
            .iter()
            .filter(|(_, next)| **next > 0)
            .map(|(w, next)| self.acked_by(*w, *next))
            .min()
            .unwrap_or(servers as usize);
        DurableStatus { acked_by, quorum, servers }
    }

    /// Forgets a barrier (done, or its caller gave up).
    pub(crate) fn end(&mut self, t: &DurableTicket) {
        self.barriers.remove(&t.id);
    }

    /// A RESET: every open barrier is forgotten (its caller times out unanswered).
    pub(crate) fn forget_barriers(&mut self) {
        self.barriers.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_durable_once_a_majority_acked_it() {
        let mut d = Durability::new(3);
        assert_eq!(d.quorum(), 2);
        d.record(0, 7, 5);
        assert_eq!(d.durable_next(7), 0, "one server of three is not a quorum");
        d.record(2, 7, 3);
        assert_eq!(d.durable_next(7), 3, "two servers hold 0..3");
        d.record(2, 7, 2);
        assert_eq!(d.durable_next(7), 3, "acks never move back");
    }

    #[test]
    fn a_barrier_has_its_proof_only_at_the_quorum_and_never_once_forgotten() {
        let mut d = Durability::new(3);
        let t = d.begin(1, BTreeMap::from([(7, 4)]));
        d.record(0, 7, 4);
        assert_eq!(d.proof(&t).map(|p| p.acked_by()).map_err(|s| s.acked_by), Err(1));
        d.record(1, 7, 9);
        let p = d.proof(&t).expect("two of three acked");
        assert_eq!((p.acked_by(), p.quorum()), (2, 2));
        let t2 = d.begin(2, BTreeMap::from([(7, 20)]));
        d.forget_barriers();
        assert!(d.proof(&t2).is_err() && !d.status(&t2).done(), "a forgotten barrier is not done");
    }

    #[test]
    fn a_barrier_with_nothing_to_make_durable_is_done_at_once() {
        let mut d = Durability::new(3);
        let t = d.begin(1, BTreeMap::from([(7, 0)]));
        assert!(d.proof(&t).is_ok());
    }
}
