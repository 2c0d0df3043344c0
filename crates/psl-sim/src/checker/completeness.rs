//! Nothing sealed is lost: at the end, no op sealed by a node that never crashed is missing
//! from any live memtable (with no crash in the run, the memtables equal the last-writer-wins
//! result of every op issued).

use super::{newest, show, History};
use crate::cluster::Cluster;
use crate::Violation;

/// At the end: every live memtable holds, for each key, at least the newest version sealed by
/// a node that never crashed; `Violation::Lost` otherwise.
pub fn check_end(seed: u64, cluster: &Cluster, h: &History) -> Result<(), Violation> {
    let sealed = cluster.eps.iter().enumerate().filter(|(_, ep)| !ep.ever_crashed).flat_map(|(i, _)| &h.sealed_by[i]);
    let model = newest(sealed);
    for ep in &cluster.eps {
        let Some(node) = &ep.node else { continue };
        for (k, v) in &model {
            let held = node.memtable.entry(k).map(|e| e.version);
            if held.is_none_or(|h| h < *v) {
                return Err(Violation::Lost { seed, node: ep.id, key: show(k), held, expected: *v });
            }
        }
    }
    Ok(())
}
