//! Durable means durable (runs with capsule servers): every record a node ever counted durable
//! (`NodeCore::durable_next`) is in the synced part of at least f + 1 servers' disks after
//! every step, whatever crashed (servers lose their unsynced writes, or keep a torn prefix of
//! them); a node restarted empty and rebuilt from a majority of the servers holds every write
//! counted durable so far at once, before any peer could help; and at the end, every op of a
//! record counted durable is in every live memtable, even if its node crashed.

use super::{newest, show, History};
use crate::cluster::Cluster;
use crate::node::SimNode;
use crate::Violation;
use std::collections::BTreeMap;

/// The durability checker's state: the durable seq of every writer, as high as any node ever
/// counted it (a crash does not lower it).
#[derive(Default)]
pub struct Durability {
    /// Per writer: the highest next seq any node ever counted durable.
    pub reported: BTreeMap<u32, u64>,
}

impl Durability {
    /// After a step: what the nodes count durable now is on f + 1 synced disks.
    pub fn check(&mut self, seed: u64, now: u64, cluster: &Cluster, h: &History) -> Result<(), Violation> {
        if cluster.slots.is_empty() {
            return Ok(());
        }
        for node in cluster.live() {
            for a in &node.authors {
                let w = a.writer();
                let d = node.core().durable_next(w);
                let r = self.reported.entry(w).or_insert(0);
                *r = (*r).max(d);
            }
        }
        let quorum = cluster.quorum;
        for (w, next) in &self.reported {
            if *next == 0 {
                continue;
            }
            let seq = next - 1;
            let hash = h.honest.get(&(*w, seq)).map(|(h, _)| *h);
            let on = cluster.slots.iter().filter(|s| hash.is_some() && s.disk.synced_hash(*w, seq) == hash).count();
            if on < quorum {
                return Err(Violation::NotDurable { seed, at_ms: now, writer: *w, seq, on, need: quorum });
            }
        }
        Ok(())
    }

    /// A node just rebuilt from a majority of the servers holds every write counted durable.
    pub fn check_rebuilt(&self, seed: u64, now: u64, node: &SimNode, h: &History) -> Result<(), Violation> {
        for (w, next) in &self.reported {
            for (k, v) in h.ops_below(*w, *next) {
                let held = node.memtable.entry(k).map(|e| e.version);
                if held.is_none_or(|h| h < *v) {
                    let key = show(k);
                    return Err(Violation::NotRecovered { seed, at_ms: now, node: node.id, key, held, expected: *v });
                }
            }
        }
        Ok(())
    }

    /// At the end: every op of a record counted durable is in every live memtable. Returns how
    /// many records were counted durable.
    pub fn check_end(&self, seed: u64, cluster: &Cluster, h: &History) -> Result<u64, Violation> {
        let model = newest(self.reported.iter().flat_map(|(w, next)| h.ops_below(*w, *next)));
        for ep in &cluster.eps {
            let Some(node) = &ep.node else { continue };
            for (k, v) in &model {
                let held = node.memtable.entry(k).map(|e| e.version);
                if held.is_none_or(|h| h < *v) {
                    return Err(Violation::DurableLost { seed, node: ep.id, key: show(k), held, expected: *v });
                }
            }
        }
        Ok(self.reported.values().sum())
    }
}
