//! A revocation reaches everyone: at the end of a run that revoked a writer, every live node
//! and server has learnt it (through the lossy network). A run that revoked does not end at
//! memtable convergence alone: it goes on, within the settle time, until everyone has learnt
//! it ([`learnt_by_all`]), since a server restarted just before convergence learns it only
//! from the next announcement or repair.

use crate::cluster::Cluster;
use crate::Violation;

/// At the end of a run that revoked a writer: every live node and server has learnt the
/// revocation; `Violation::RevocationNotLearnt` names one that has not.
pub fn check_end(seed: u64, cluster: &Cluster, revoked: Option<(u32, u64)>) -> Result<(), Violation> {
    let Some((writer, _)) = revoked else { return Ok(()) };
    for ep in &cluster.eps {
        if ep.node.as_ref().is_some_and(|x| x.engine.verifier().revocations().is_empty()) {
            return Err(Violation::RevocationNotLearnt { seed, who: format!("node {}", ep.id), writer });
        }
    }
    for (i, slot) in cluster.slots.iter().enumerate() {
        if slot.server.as_ref().is_some_and(|x| x.verifier().revocations().is_empty()) {
            return Err(Violation::RevocationNotLearnt { seed, who: format!("server {i}"), writer });
        }
    }
    Ok(())
}

/// Whether every live node and server knows a revocation (true when the run revoked none).
pub fn learnt_by_all(cluster: &Cluster, revoked: Option<(u32, u64)>) -> bool {
    revoked.is_none()
        || (cluster.eps.iter().all(|ep| ep.node.as_ref().is_none_or(|x| !x.engine.verifier().revocations().is_empty()))
            && cluster.slots.iter().all(|s| s.server.as_ref().is_none_or(|x| !x.verifier().revocations().is_empty())))
}
