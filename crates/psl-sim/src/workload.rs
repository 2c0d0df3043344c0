//! The workload: each worker node that is up (and not catching up after a restart) issues a
//! put or a delete of one of a few keys at the run's rate; in the read-through scenario, some
//! ops first read their key through CapsuleDB. Each write is checked at once
//! ([`crate::checker::read_your_writes`]).

use crate::checker::read_your_writes;
use crate::cluster::{Cluster, Produced};
use crate::config::SimConfig;
use crate::{SimReport, Violation};
use psl_scl::Version;
use rand::rngs::StdRng;
use rand::Rng;
use std::sync::Arc;

/// The ops the worker nodes issue: puts and deletes over a small fixed key set.
pub struct Workload {
    /// The keys ops touch (few, so that they collide).
    pub keys: Vec<Vec<u8>>,
}

impl Workload {
    /// The workload of `cfg`: `cfg.keys` keys named `key000`, `key001`, ...
    pub fn new(cfg: &SimConfig) -> Workload {
        Workload { keys: (0..cfg.keys).map(|k| format!("key{k:03}").into_bytes()).collect() }
    }

    /// One millisecond of ops: each worker node that is up and not catching up issues one with
    /// probability `op_rate`, each checked at once for read your writes.
    pub fn issue(
        &self,
        seed: u64,
        rng: &mut StdRng,
        cluster: &mut Cluster,
        now: u64,
        out: &mut Produced,
        report: &mut SimReport,
    ) -> Result<(), Violation> {
        let cfg = cluster.cfg();
        let mut fx = Vec::new();
        for i in 0..cluster.eps.len() {
            let ep = &cluster.eps[i];
            let Some(node) = ep.node.as_ref() else { continue };
            if ep.writers == 0 || now < node.quiet_until || !rng.random_bool(cfg.op_rate) {
                continue;
            }
            let key = self.keys[rng.random_range(0..self.keys.len())].clone();
            let value = (!rng.random_bool(cfg.delete_share)).then(|| format!("{}@{now}", ep.id).into_bytes());
            if cfg.read_through > 0.0 && rng.random_bool(cfg.read_through) {
                read_through(cluster, i, &key);
                report.read_throughs += 1;
            }
            report.ops_issued += 1;
            let node = cluster.eps[i].node.as_mut().expect("up");
            let before = node.memtable.entry(&key).map(|e| e.version);
            if let Some(written) = node.put(key.clone(), value, now, &mut fx) {
                let shown = node.memtable.entry(&key).map(|e| e.version);
                read_your_writes::check(seed, now, node.id, &key, before, written, shown)?;
            }
            out.effects.extend(fx.drain(..).map(|e| (i, e)));
        }
        Ok(())
    }
}

/// Node `i` reads `key` through CapsuleDB: the answer is the newest version any other live
/// node shows (with its original version and value), asked and taken in as the runtime's reads
/// are (`SimNode::read_through`).
fn read_through(cluster: &mut Cluster, i: usize, key: &[u8]) {
    let found: Option<(Version, Option<Arc<[u8]>>)> = cluster
        .eps
        .iter()
        .enumerate()
        .filter(|(j, _)| *j != i)
        .filter_map(|(_, e)| e.node.as_ref()?.memtable.entry(key))
        .map(|e| (e.version, e.value.clone()))
        .max_by_key(|(v, _)| *v);
    if let Some(node) = cluster.eps[i].node.as_mut() {
        node.read_through(key, found);
    }
}
