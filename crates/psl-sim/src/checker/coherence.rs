//! Coherence: on every node, the version of each key only moves forward (within one
//! incarnation: a node restarted empty starts over). Checked after every step.

use super::show;
use crate::cluster::Cluster;
use crate::Violation;
use psl_scl::Version;
use std::collections::HashMap;

/// The coherence checker's state: what each node showed at the last check.
#[derive(Default)]
pub struct Coherence {
    /// Per endpoint: the incarnation seen and each key's version then.
    last: HashMap<usize, (u32, HashMap<Vec<u8>, Version>)>,
}

impl Coherence {
    /// After a step: no live node shows an older version of any workload key than it did at
    /// the last check in the same incarnation; `Violation::Coherence` otherwise.
    pub fn check(&mut self, seed: u64, now: u64, cluster: &Cluster, keys: &[Vec<u8>]) -> Result<(), Violation> {
        for (i, ep) in cluster.eps.iter().enumerate() {
            let Some(node) = &ep.node else { continue };
            let (inc, last) = self.last.entry(i).or_insert_with(|| (ep.incarnation, HashMap::new()));
            if *inc != ep.incarnation {
                *inc = ep.incarnation;
                last.clear();
            }
            for k in keys {
                let Some(e) = node.memtable.entry(k) else { continue };
                if let Some(prev) = last.insert(k.clone(), e.version) {
                    if prev > e.version {
                        return Err(Violation::Coherence {
                            seed,
                            at_ms: now,
                            node: ep.id,
                            key: show(k),
                            from: prev,
                            to: e.version,
                        });
                    }
                }
            }
        }
        Ok(())
    }
}
