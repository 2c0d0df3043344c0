//! The revocation scenario's actors: the leader, which revokes one writer of the first node
//! mid-run and RESETs that node, and the adversary holding the revoked key, which keeps
//! continuing the writer's chain with backdated forged records.

use crate::checker::History;
use crate::cluster::Cluster;
use crate::net::{Faults, Net};
use crate::node::Effect;
use crate::SimReport;
use psl_capsule::{Author, KeyStatement, Revocation, WriterCert};
use rand::rngs::StdRng;
use rand::Rng;

/// The revocation scenario's leader and, once it has revoked a writer, the adversary holding
/// that writer's key. Does nothing in runs without `revoke_at_ms`.
#[derive(Default)]
pub struct Revoker {
    /// The adversary holding the revoked writer's key, once it is revoked.
    adversary: Option<Author>,
}

impl Revoker {
    /// The leader revokes one writer of the first node from two epochs ahead, hands the
    /// revocation to the coordinators (they announce it and carry it into the log) and RESETs
    /// the node (it restarts under a new incarnation, with new writers); at the first
    /// millisecond from `revoke_at_ms` on at which that node is up. The coordinators' effects
    /// go to `carried`.
    pub fn revoke_if_due(
        &mut self,
        now: u64,
        cluster: &mut Cluster,
        h: &History,
        carried: &mut Vec<(usize, Effect)>,
        report: &mut SimReport,
    ) {
        let cfg = cluster.cfg();
        let due = cfg.revoke_at_ms.is_some_and(|t| now >= t) && report.revoked.is_none() && self.adversary.is_none();
        if !(cfg.certified && now <= cfg.work_ms && due && cluster.eps[0].node.is_some()) {
            return;
        }
        let Some(node) = cluster.take_down(0, now + cfg.restart_ms, report) else { return };
        // The epoch as the other endpoints see it.
        let epoch = cluster.live().map(|x| x.core().epoch()).max().unwrap_or(0);
        let Some(w) = node.authors.first().map(|a| a.writer()) else { return };
        let from_epoch = epoch + 2;
        // The seq bound: everything the worker sealed before its RESET stays valid (the leader
        // learns its writers' heads at the RESET); nothing after it does.
        let top = h.honest.keys().filter(|(hw, _)| *hw == w).map(|(_, s)| *s).max();
        let from_seq = top.map_or(0, |s| s + 1);
        let (meta, app) = (&cluster.meta, &cluster.app);
        let rev = Revocation::issue(app, meta.name(), 0, w, from_epoch, from_seq).expect("a writer index");
        let mut fx = Vec::new();
        for (i, e) in cluster.eps.iter_mut().enumerate() {
            if let Some(x) = e.node.as_mut().filter(|x| x.coordinator_writer().is_some()) {
                x.announce(KeyStatement::Revoke(rev.clone()), now, &mut fx);
                carried.extend(fx.drain(..).map(|e| (i, e)));
            }
        }
        let cert = WriterCert::issue(app, meta.name(), 0, w, 0).expect("a writer index");
        let key = app.writer_hardened(w).expect("a writer index");
        let mut a = Author::with_certified_keys(meta, key, cert, app.data_key()).expect("its own certificate");
        // The adversary backdates: its records claim the epoch before the revocation's, so
        // only the seq bound refuses them.
        if let Some(seq) = top {
            let hash = h.honest[&(w, seq)].0;
            let back = from_epoch - 1;
            a.resume(&psl_capsule::Head { writer: w, seq, hash, lamport: 1 << 40, epoch: back });
        }
        self.adversary = Some(a.with_salt_seed(cluster.seed() ^ 0xBAD));
        report.revoked = Some((w, from_epoch));
    }

    /// Every 20 ms, the adversary writes as the revoked writer to every endpoint that has learnt
    /// the revocation (a node or server that has not yet could not tell; see the threat model).
    #[allow(clippy::too_many_arguments)]
    pub fn forge(
        &mut self,
        rng: &mut StdRng,
        net: &mut Net,
        faults: &Faults,
        now: u64,
        cluster: &Cluster,
        keys: &[Vec<u8>],
        report: &mut SimReport,
    ) {
        let (Some(a), true) = (self.adversary.as_mut(), now.is_multiple_of(20)) else { return };
        let key = keys[rng.random_range(0..keys.len())].clone();
        let rec = a.write_ops([(key, Some(format!("forged@{now}").into_bytes()))]).expect("a small record");
        let bytes = psl_scl::Msg::Record { capsule: cluster.meta.name(), bytes: rec.shared_bytes() }.encode();
        let n = cluster.nodes();
        for to in 0..cluster.endpoints() {
            let knows = if to < n {
                cluster.eps[to].node.as_ref().is_some_and(|x| !x.engine.verifier().revocations().is_empty())
            } else {
                cluster.slots[to - n].server.as_ref().is_some_and(|x| !x.verifier().revocations().is_empty())
            };
            if knows {
                net.send_to(rng, faults, now, to, &bytes);
                report.forged_sent += 1;
            }
        }
    }
}
