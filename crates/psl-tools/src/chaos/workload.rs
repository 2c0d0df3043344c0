//! The workload a seed decides: what each client sends, in which order, with which values.
//! Pure, generated from the seed (a stream of its own, so that changing the fault schedule's
//! generator does not change the workload and vice versa). Only the timing of execution
//! differs between runs of a seed; the requests do not.
//!
//! Node clients (one per node) send rounds of pipelined `PUT`s and `DEL`s, each round closed
//! by `SYNC_DURABLE`, `SYNC` or nothing, then `GET`s on their own node and on the others.
//! Every value is unique (`c<client>.<round>.<i>`), so the checker can tell which write a
//! value came from. Keys are *owned* (`o<client>-<k>`: only that client writes them, so its
//! program order is the version order and durability can be checked exactly) or *shared*
//! (`s-<k>`: every client writes them; last-writer-wins picks one, which every node must
//! agree on). Front-end clients run `gets`/`cas` loops appending a token to counters
//! (`ctr-<k>`), two per front end.

use super::schedule::Rng;
use serde::Serialize;

/// A write in a round.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum KvOp {
    Put { key: String, value: String },
    Del { key: String },
}

impl KvOp {
    pub fn key(&self) -> &str {
        match self {
            KvOp::Put { key, .. } | KvOp::Del { key } => key,
        }
    }

    /// The value it leaves (`None`: deleted).
    pub fn value(&self) -> Option<&str> {
        match self {
            KvOp::Put { value, .. } => Some(value),
            KvOp::Del { .. } => None,
        }
    }

    /// The control-interface line.
    pub fn line(&self) -> String {
        match self {
            KvOp::Put { key, value } => format!("PUT {key} {value}"),
            KvOp::Del { key } => format!("DEL {key}"),
        }
    }
}

/// What closes a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Barrier {
    None,
    Sync,
    SyncDurable,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Round {
    pub writes: Vec<KvOp>,
    pub barrier: Barrier,
    /// Keys read back on the client's own node after the barrier.
    pub own_reads: Vec<String>,
    /// (node, key) read on other nodes.
    pub cross_reads: Vec<(u8, String)>,
    /// Pause before the round.
    pub pause_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeClient {
    pub id: u8,
    pub node: u8,
    pub rounds: Vec<Round>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CasClient {
    pub id: u8,
    /// The front end it talks to.
    pub front: u8,
    /// Counter index of each increment it wants, in order.
    pub increments: Vec<u8>,
    pub pause_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Workload {
    pub node_clients: Vec<NodeClient>,
    pub cas_clients: Vec<CasClient>,
    pub owned_keys: u32,
    pub shared_keys: u32,
    pub counters: u8,
}

/// Sizes of a workload.
#[derive(Debug, Clone, Copy)]
pub struct WorkloadShape {
    pub nodes: u8,
    pub fronts: u8,
    pub rounds: u32,
    pub owned_keys: u32,
    pub shared_keys: u32,
    pub counters: u8,
    pub increments: u32,
    /// Nominal time the rounds are spread over.
    pub span_ms: u64,
}

impl Default for WorkloadShape {
    fn default() -> WorkloadShape {
        WorkloadShape {
            nodes: 3,
            fronts: 2,
            rounds: 30,
            owned_keys: 60,
            shared_keys: 20,
            counters: 3,
            increments: 25,
            span_ms: 12_000,
        }
    }
}

pub fn owned_key(client: u8, k: u32) -> String {
    format!("o{client}-{k}")
}

pub fn shared_key(k: u32) -> String {
    format!("s-{k}")
}

pub fn counter_key(k: u8) -> String {
    format!("ctr-{k}")
}

/// The client that owns `key`, if it is an owned key.
pub fn owner_of(key: &str) -> Option<u8> {
    key.strip_prefix('o')?.split('-').next()?.parse().ok()
}

/// The client a value was written by (`c<client>.<round>.<i>`).
pub fn author_of(value: &str) -> Option<u8> {
    value.strip_prefix('c')?.split('.').next()?.parse().ok()
}

impl Workload {
    pub fn generate(seed: u64, shape: WorkloadShape) -> Workload {
        let mut rng = Rng::new(seed.rotate_left(17) ^ 0xc1a0_5c1a_0000_0001);
        let pause_mean = shape.span_ms / u64::from(shape.rounds.max(1));
        let node_clients = (0..shape.nodes)
            .map(|c| {
                let rounds = (0..shape.rounds)
                    .map(|r| {
                        let n = rng.range(1, 24) as usize;
                        let writes = (0..n)
                            .map(|i| {
                                let key = if rng.chance(0.75) {
                                    owned_key(c, rng.below(u64::from(shape.owned_keys)) as u32)
                                } else {
                                    shared_key(rng.below(u64::from(shape.shared_keys)) as u32)
                                };
                                if rng.chance(0.1) {
                                    KvOp::Del { key }
                                } else {
                                    KvOp::Put { key, value: format!("c{c}.{r}.{i}") }
                                }
                            })
                            .collect();
                        let barrier = [Barrier::SyncDurable, Barrier::SyncDurable, Barrier::Sync, Barrier::None]
                            [rng.below(4) as usize];
                        let own_reads =
                            (0..3).map(|_| owned_key(c, rng.below(u64::from(shape.owned_keys)) as u32)).collect();
                        let cross_reads = (0..2)
                            .map(|_| {
                                let other = rng.below(u64::from(shape.nodes)) as u8;
                                let key = if rng.chance(0.5) {
                                    shared_key(rng.below(u64::from(shape.shared_keys)) as u32)
                                } else {
                                    owned_key(
                                        rng.below(u64::from(shape.nodes)) as u8,
                                        rng.below(u64::from(shape.owned_keys)) as u32,
                                    )
                                };
                                (other, key)
                            })
                            .collect();
                        Round {
                            writes,
                            barrier,
                            own_reads,
                            cross_reads,
                            pause_ms: rng.range(pause_mean / 2, pause_mean * 3 / 2),
                        }
                    })
                    .collect();
                NodeClient { id: c, node: c, rounds }
            })
            .collect();
        let cas_clients = (0..shape.fronts * 2)
            .map(|i| CasClient {
                id: i,
                front: i % shape.fronts.max(1),
                increments: (0..shape.increments).map(|_| rng.below(u64::from(shape.counters)) as u8).collect(),
                pause_ms: shape.span_ms / u64::from(shape.increments.max(1)),
            })
            .collect();
        Workload {
            node_clients,
            cas_clients,
            owned_keys: shape.owned_keys,
            shared_keys: shape.shared_keys,
            counters: shape.counters,
        }
    }

    /// Every key a node client may write.
    pub fn kv_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self
            .node_clients
            .iter()
            .flat_map(|c| (0..self.owned_keys).map(move |k| owned_key(c.id, k)))
            .chain((0..self.shared_keys).map(shared_key))
            .collect();
        keys.sort();
        keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_decides_the_workload_exactly() {
        let a = Workload::generate(9, WorkloadShape::default());
        assert_eq!(a, Workload::generate(9, WorkloadShape::default()));
        assert_ne!(a, Workload::generate(10, WorkloadShape::default()));
    }

    #[test]
    fn values_are_unique_and_name_their_author_and_owned_keys_their_owner() {
        let w = Workload::generate(3, WorkloadShape::default());
        let mut seen = std::collections::HashSet::new();
        for c in &w.node_clients {
            for r in &c.rounds {
                for op in &r.writes {
                    if let Some(v) = op.value() {
                        assert!(seen.insert(v.to_string()), "value {v} twice");
                        assert_eq!(author_of(v), Some(c.id));
                    }
                    if let Some(o) = owner_of(op.key()) {
                        assert_eq!(o, c.id, "client {} writes another's key {}", c.id, op.key());
                    }
                }
            }
        }
        assert_eq!(owner_of("s-3"), None);
        assert_eq!(owner_of("o12-5"), Some(12));
        assert_eq!(author_of("c2.10.3"), Some(2));
        let keys = w.kv_keys();
        assert_eq!(keys.len(), 3 * 60 + 20);
    }
}
