//! The flow handler: what paces this node's own writers beside the servers' durability quorum
//! (see [`NodeCore::flow_next`](crate::NodeCore::flow_next)). CapsuleDB's acks (how far it has
//! taken in each own writer, and when that last moved) and peers' tagged heads hints (how far
//! each has applied them, and when that last moved); and, toward the peers, which own heads
//! this node last hinted and when, so that between full heads hints it hints only those that
//! moved. Ack signatures and chain checks stay with the [`NodeCore`](crate::NodeCore), which
//! hands in only checked entries ([`Flow::db_record`]).

use psl_capsule::Link;
use std::collections::BTreeMap;

/// Most peers whose hints pace this node's writers; beyond it the one silent longest is
/// forgotten.
pub const PEERS_MAX: usize = 64;

/// What one peer said of this node's writers (flow control toward peers).
#[derive(Debug, Default)]
struct PeerFlow {
    /// Per own writer: the peer's applied next seq, and when (ms) it last moved.
    writers: BTreeMap<u32, (u64, u64)>,
    last_seen: u64,
}

/// CapsuleDB's and the peers' progress on the own writers, and the own heads hinted.
#[derive(Debug, Default)]
pub(crate) struct Flow {
    /// Per own writer: CapsuleDB's taken-in next seq (its acks, see
    /// [`NodeConfig::capsuledb`](crate::NodeConfig::capsuledb)).
    db_acked: BTreeMap<u32, u64>,
    /// When (the core's clock, ms) CapsuleDB's acks last moved for an own writer; 0 before
    /// the first (so a node counts on its CapsuleDB from the start, and waits at most one
    /// stall if it is absent).
    db_moved_at: u64,
    /// Per peer id (tagged heads hints): per own writer, the peer's applied next seq and when
    /// it last moved; and when the peer last hinted. At most [`PEERS_MAX`] peers.
    peers: BTreeMap<u64, PeerFlow>,
    /// Own heads as last hinted for flow control, and when.
    hinted: BTreeMap<u32, u64>,
    last_hint_at: u64,
}

impl Flow {
    pub(crate) fn new() -> Flow {
        Flow::default()
    }

    /// CapsuleDB's taken-in next seq per own writer.
    pub(crate) fn db_acked(&self) -> &BTreeMap<u32, u64> {
        &self.db_acked
    }

    /// CapsuleDB took in own writer `writer`'s records below `next` (a checked ack entry) as
    /// of `now`.
    pub(crate) fn db_record(&mut self, writer: u32, next: u64, now: u64) {
        let n = self.db_acked.entry(writer).or_insert(0);
        if next > *n {
            *n = next;
            self.db_moved_at = now;
        }
    }

    /// A tagged heads hint from peer `id` at `now`: how far it has applied the writers for
    /// which `own` holds. Unauthenticated, like every hint: it can only make the writers wait
    /// (at most one stall per pause, like dropping messages would) or not wait.
    pub(crate) fn on_peer_heads(&mut self, id: u64, heads: &[(u32, u64)], now: u64, own: impl Fn(u32) -> bool) {
        if !self.peers.contains_key(&id) && self.peers.len() >= PEERS_MAX {
            if let Some(old) = self.peers.iter().min_by_key(|(_, p)| p.last_seen).map(|(k, _)| *k) {
                self.peers.remove(&old);
            }
        }
        let p = self.peers.entry(id).or_default();
        p.last_seen = now;
        for (w, seq) in heads.iter().filter(|(w, _)| own(*w)) {
            // A forged hint may name seq u64::MAX: never overflow on it.
            let next = seq.saturating_add(1);
            let e = p.writers.entry(*w).or_insert((0, now));
            if next > e.0 {
                *e = (next, now);
            }
        }
    }

    /// Peers tracked (at most [`PEERS_MAX`]).
    pub(crate) fn peers(&self) -> usize {
        self.peers.len()
    }

    /// How far own writer `writer`, applied below `own`, may count its records as taken in at
    /// `now`, given `durable` (the servers' quorum's durable next seq, if there are servers) and
    /// whether this node uses CapsuleDB: see [`NodeCore::flow_next`](crate::NodeCore::flow_next)
    /// for the rules and the parameters.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn next(
        &self,
        writer: u32,
        own: u64,
        durable: Option<u64>,
        uses_db: bool,
        now: u64,
        stall_ms: u64,
        peer_slack: u64,
        peer_lag_max: u64,
    ) -> u64 {
        let mut next = own;
        if let Some(s) = durable {
            next = next.min(s);
        }
        if uses_db {
            let d = self.db_acked.get(&writer).copied().unwrap_or(0);
            let live = now.saturating_sub(self.db_moved_at) < stall_ms || durable.is_some_and(|s| d >= s);
            if live {
                next = next.min(d);
            }
        }
        for p in self.peers.values() {
            let Some((n, at)) = p.writers.get(&writer).copied() else { continue };
            if n < own && own - n <= peer_lag_max && now.saturating_sub(at) < stall_ms {
                next = next.min(n.saturating_add(peer_slack));
            }
        }
        next
    }

    /// A full heads hint goes out at `now` with `heads`: they count as hinted.
    pub(crate) fn hinted_all(&mut self, now: u64, heads: &[(u32, u64)]) {
        self.last_hint_at = now;
        self.hinted.extend(heads.iter().copied());
    }

    /// Between full hints: if `interval_ms` passed since the last hint, the heads among
    /// `heads()` that moved since they were hinted (at most `max`), which count as hinted now.
    pub(crate) fn moved<I: IntoIterator<Item = Link>>(
        &mut self,
        now: u64,
        interval_ms: u64,
        heads: impl FnOnce() -> I,
        max: usize,
    ) -> Option<Vec<(u32, u64)>> {
        if now.saturating_sub(self.last_hint_at) < interval_ms {
            return None;
        }
        self.last_hint_at = now;
        let moved: Vec<(u32, u64)> = heads()
            .into_iter()
            .filter(|l| self.hinted.get(&l.writer).is_none_or(|s| *s < l.seq))
            .map(|l| (l.writer, l.seq))
            .take(max)
            .collect();
        self.hinted.extend(moved.iter().copied());
        Some(moved)
    }

    /// A RESET: the peers' progress and the hinted heads are forgotten (CapsuleDB's acks stay).
    pub(crate) fn reset(&mut self) {
        self.peers.clear();
        self.hinted.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use psl_crypto::Hash256;

    const W: u32 = 0x10000;

    fn link(writer: u32, seq: u64) -> Link {
        Link { writer, seq, hash: Hash256([0; 32]) }
    }

    #[test]
    fn capsuledb_paces_while_its_acks_move_or_it_keeps_up_with_the_servers() {
        let mut f = Flow::new();
        assert_eq!(f.next(W, 10, None, true, 0, 1000, 0, 64), 0, "counted on from the start");
        assert_eq!(f.next(W, 10, None, true, 1000, 1000, 0, 64), 10, "no ack for a stall: not pacing");
        f.db_record(W, 4, 1500);
        f.db_record(W, 3, 1600);
        assert_eq!(f.db_acked().get(&W), Some(&4), "acks never move back");
        assert_eq!(f.next(W, 10, None, true, 2499, 1000, 0, 64), 4, "moved at 1500, not at 1600");
        assert_eq!(f.next(W, 10, None, true, 2500, 1000, 0, 64), 10);
        assert_eq!(f.next(W, 10, Some(4), true, 9000, 1000, 0, 64), 4, "not behind the servers: still counts");
        assert_eq!(f.next(W, 10, Some(6), false, 0, 1000, 0, 64), 6, "without CapsuleDB, the servers only");
    }

    #[test]
    fn peers_pace_while_near_and_moving_and_the_longest_silent_is_forgotten() {
        let mut f = Flow::new();
        let own = |w| w == W;
        f.on_peer_heads(7, &[(W, 4), (0x20000, 9)], 100, own);
        assert_eq!(f.next(W, 10, None, false, 100, 1000, 0, 64), 5);
        assert_eq!(f.next(0x20000, 10, None, false, 100, 1000, 0, 64), 10, "not an own writer: not noted");
        assert_eq!(f.next(W, 10, None, false, 1100, 1000, 0, 64), 10, "silent for a stall");
        f.on_peer_heads(7, &[(W, u64::MAX)], 1200, own);
        assert_eq!(f.next(W, 10, None, false, 1200, 1000, 0, 64), 10, "ahead, and no overflow");
        for id in 0..PEERS_MAX as u64 {
            f.on_peer_heads(100 + id, &[], 2000 + id, own);
        }
        assert_eq!(f.peers(), PEERS_MAX, "peer 7 was silent longest");
        f.reset();
        assert_eq!(f.peers(), 0);
    }

    #[test]
    fn between_full_hints_only_the_heads_that_moved_are_hinted() {
        let mut f = Flow::new();
        f.hinted_all(100, &[(W, 3), (0x20000, 5)]);
        assert_eq!(f.moved(149, 50, || [link(W, 4)], 64), None, "not due yet");
        assert_eq!(
            f.moved(150, 50, || [link(W, 4), link(0x20000, 5), link(0x30000, 0)], 64),
            Some(vec![(W, 4), (0x30000, 0)])
        );
        assert_eq!(f.moved(200, 50, || [link(W, 4), link(0x20000, 5)], 64), Some(vec![]), "nothing moved since");
        assert_eq!(f.moved(250, 50, || [link(W, 5), link(0x20000, 6)], 1), Some(vec![(W, 5)]), "at most max");
        f.reset();
        assert_eq!(f.moved(300, 50, || [link(W, 5)], 64), Some(vec![(W, 5)]), "a reset forgets what was hinted");
    }
}
