//! No unverified byte applied, none stored: every memtable entry of every live node is an op
//! some honest writer issued, with that exact version and value; every record any server wrote
//! to its disk is one an honest writer sealed. Checked after every step.

use super::{show, History};
use crate::cluster::Cluster;
use crate::Violation;

/// Every key of every live node's memtable.
pub fn check_memtables(seed: u64, now: u64, cluster: &Cluster, keys: &[Vec<u8>], h: &History) -> Result<(), Violation> {
    for ep in &cluster.eps {
        let Some(node) = &ep.node else { continue };
        for k in keys {
            let Some(e) = node.memtable.entry(k) else { continue };
            let ok = h.issued.get(&(k.clone(), e.version)).is_some_and(|v| v.as_deref() == e.value.as_deref());
            if !ok {
                return Err(Violation::Unverified { seed, at_ms: now, node: ep.id, key: show(k), version: e.version });
            }
        }
    }
    Ok(())
}

/// Every record the servers wrote since the last check.
pub fn check_stored(seed: u64, now: u64, cluster: &mut Cluster, h: &History) -> Result<(), Violation> {
    for (i, slot) in cluster.slots.iter_mut().enumerate() {
        for hash in slot.disk.fresh.drain(..) {
            if !h.honest_hashes.contains(&hash) {
                return Err(Violation::UnverifiedStored { seed, at_ms: now, server: i as u32, hash });
            }
        }
    }
    Ok(())
}
