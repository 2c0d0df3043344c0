//! Convergence: once faults have stopped, every live node's memtable becomes identical (and
//! stays so for three epochs, with no gap left but in dead writers' chains, nothing pending
//! and nobody restarting) within `settle_ms`.

use super::show;
use crate::cluster::Cluster;
use crate::node::SimNode;
use crate::Violation;
use psl_scl::RejectReason;

/// The convergence checker's state: since when the live nodes have been identical and quiet.
#[derive(Default)]
pub struct Convergence {
    stable_since: Option<u64>,
}

impl Convergence {
    /// After a step of the settling phase: `Some(since)` once the run has converged.
    pub fn check(&mut self, now: u64, cluster: &Cluster, epoch_ms: u64) -> Option<u64> {
        let alive: Vec<&SimNode> = cluster.live().collect();
        let same = alive.windows(2).all(|w| w[0].memtable.digest() == w[1].memtable.digest());
        let quiet = alive.iter().all(|x| {
            x.core().orderer().gaps().iter().all(|(w, _, _)| cluster.dead_writers.contains(w))
                && x.queues.iter().all(|q| q.is_empty())
        }) && cluster.eps.iter().all(|e| e.restart_at.is_none());
        if same && quiet {
            let since = *self.stable_since.get_or_insert(now);
            if now - since >= 3 * epoch_ms {
                return Some(since);
            }
        } else {
            self.stable_since = None;
        }
        None
    }

    /// The run ended without converging: what differs (printed to stderr) and the violation.
    pub fn failed(seed: u64, settle_ms: u64, cluster: &Cluster, keys: &[Vec<u8>]) -> Violation {
        let live = || cluster.eps.iter().filter_map(|e| e.node.as_ref().map(|x| (e.id, x)));
        let mut diffs = Vec::new();
        for k in keys {
            let vs: Vec<String> = live()
                .map(|(id, x)| (id, x.memtable.entry(k)))
                .map(|(id, e)| {
                    format!("{id}:{:?}", e.map(|e| (e.version.lamport, e.version.writer, e.value.is_some())))
                })
                .collect();
            let first = cluster.live().next().map(|x| x.memtable.entry(k));
            if cluster.live().any(|x| Some(x.memtable.entry(k)) != first) {
                diffs.push(format!("{}: {}", show(k), vs.join(" ")));
            }
        }
        let rejected: Vec<String> = live()
            .map(|(id, x)| {
                let r: Vec<String> = RejectReason::ALL
                    .iter()
                    .filter(|r| x.metrics.rejected(**r) > 0)
                    .map(|r| format!("{}={}", r.name(), x.metrics.rejected(*r)))
                    .collect();
                format!("{id}[{}] epoch {:#x}", r.join(","), x.core().epoch())
            })
            .collect();
        eprintln!(
            "differing keys: {}\nrejections: {}\ndead writers: {:?}",
            diffs.join("\n  "),
            rejected.join(" "),
            cluster.dead_writers
        );
        let detail = live()
            .map(|(id, x)| {
                format!(
                    "node {id}: {} keys, digest {}, gaps {:?}",
                    x.memtable.len(),
                    x.memtable.digest().short(),
                    x.core().orderer().gaps()
                )
            })
            .collect::<Vec<_>>()
            .join("; ");
        Violation::NoConvergence { seed, settle_ms, detail }
    }
}
