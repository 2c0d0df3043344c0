//! The simulation loop: one step per simulated millisecond. Each step delivers what the
//! network has due ([`crate::net`]), issues the workload ([`crate::workload`]), flushes and
//! ticks every node and server ([`crate::cluster`]), carries out what they produced (publishes
//! through the fault model, records signed, reports), injects the fault schedule (crashes,
//! partitions, the revocation scenario's leader and adversary: [`crate::revocation`]), restarts
//! what is due, then runs the checkers ([`crate::checker`], one per invariant). Once faults
//! have stopped, the run ends when the nodes have converged, and the end-state checkers run.

use crate::checker::coherence::Coherence;
use crate::checker::convergence::Convergence;
use crate::checker::durability::Durability;
use crate::checker::{completeness, equivocation, revocation, unverified, History};
use crate::cluster::{Cluster, Produced};
use crate::config::SimConfig;
use crate::net::{Faults, Net, NetStats};
use crate::node::Effect;
use crate::revocation::Revoker;
use crate::server::ServerEffect;
use crate::workload::Workload;
use psl_crypto::Hash256;
use psl_scl::{Output, RejectReason, Version};
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::collections::BTreeMap;

#[derive(Debug, Clone, serde::Serialize)]
pub struct SimReport {
    pub seed: u64,
    pub ops_issued: u64,
    pub records_written: u64,
    pub crashes: u64,
    pub coordinator_crashes: u64,
    pub partitions: u64,
    pub converged_at_ms: u64,
    pub epochs: u64,
    pub withholding_reports: u64,
    pub server_crashes: u64,
    /// Records written but not synced that server crashes lost.
    pub records_lost_on_crash: u64,
    pub torn_writes: u64,
    /// Records counted durable by their nodes (all writers).
    pub durable_records: u64,
    /// Nodes restarted empty and rebuilt from a majority of servers (each checked at once).
    pub recoveries: u64,
    pub rejected: BTreeMap<&'static str, u64>,
    pub net: NetStats,
    /// The revoked writer and the epoch its revocation takes effect (`revoke_at_ms` runs).
    pub revoked: Option<(u32, u64)>,
    /// Forged records the adversary sent with the revoked writer's key (none may be applied
    /// or stored: the invariants above catch one that is).
    pub forged_sent: u64,
    /// Ops that first read their key through CapsuleDB (the read-through scenario).
    #[serde(skip_serializing_if = "is_zero")]
    pub read_throughs: u64,
    /// Restarts of a coordinator with its writer index and its own-chain log (the
    /// coordinator-rejoin scenario).
    #[serde(skip_serializing_if = "is_zero")]
    pub coordinator_restarts: u64,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum Violation {
    #[error("seed {seed} at {at_ms} ms: node {node} holds key {key:?} at {version:?}, which no honest writer issued with that value")]
    Unverified { seed: u64, at_ms: u64, node: u32, key: String, version: Version },
    #[error("seed {seed} at {at_ms} ms: node {node}, key {key:?}: version went back from {from:?} to {to:?}")]
    Coherence { seed: u64, at_ms: u64, node: u32, key: String, from: Version, to: Version },
    #[error("seed {seed} at {at_ms} ms: equivocation by honest writer {writer} at seq {seq}")]
    Equivocation { seed: u64, at_ms: u64, writer: u32, seq: u64 },
    #[error("seed {seed}: memtables still differ {settle_ms} ms after faults stopped: {detail}")]
    NoConvergence { seed: u64, settle_ms: u64, detail: String },
    #[error("seed {seed}: node {node}, key {key:?}: holds {held:?}, but {expected:?} was issued and sealed by a node that never crashed")]
    Lost { seed: u64, node: u32, key: String, held: Option<Version>, expected: Version },
    #[error("seed {seed} at {at_ms} ms: writer {writer} seq {seq} was counted durable but is synced on only {on} servers ({need} needed)")]
    NotDurable { seed: u64, at_ms: u64, writer: u32, seq: u64, on: usize, need: usize },
    #[error("seed {seed} at {at_ms} ms: server {server} wrote record {hash}, which no honest writer sealed")]
    UnverifiedStored { seed: u64, at_ms: u64, server: u32, hash: Hash256 },
    #[error("seed {seed} at {at_ms} ms: node {node} rebuilt from a majority of servers lacks key {key:?} at {expected:?} (holds {held:?}), which is in a record counted durable")]
    NotRecovered { seed: u64, at_ms: u64, node: u32, key: String, held: Option<Version>, expected: Version },
    #[error("seed {seed}: node {node}, key {key:?}: holds {held:?}, but {expected:?} is in a record counted durable")]
    DurableLost { seed: u64, node: u32, key: String, held: Option<Version>, expected: Version },
    #[error("seed {seed} at {at_ms} ms: honest writer {writer} signed seq {seq} twice, as {first} and as {second}")]
    SignedTwice { seed: u64, at_ms: u64, writer: u32, seq: u64, first: Hash256, second: Hash256 },
    #[error("seed {seed} at {at_ms} ms: node {node} wrote key {key:?} at {written:?} but then showed {shown:?} (before the write: {before:?}): the write does not supersede what its node showed")]
    WriteNotShown {
        seed: u64,
        at_ms: u64,
        node: u32,
        key: String,
        before: Option<Version>,
        written: Version,
        shown: Option<Version>,
    },
    #[error("seed {seed}: {who} never learnt the revocation of writer {writer}")]
    RevocationNotLearnt { seed: u64, who: String, writer: u32 },
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl SimReport {
    fn new(seed: u64) -> SimReport {
        SimReport {
            seed,
            ops_issued: 0,
            records_written: 0,
            crashes: 0,
            coordinator_crashes: 0,
            partitions: 0,
            converged_at_ms: 0,
            epochs: 0,
            withholding_reports: 0,
            server_crashes: 0,
            records_lost_on_crash: 0,
            torn_writes: 0,
            durable_records: 0,
            recoveries: 0,
            rejected: BTreeMap::new(),
            net: NetStats::default(),
            revoked: None,
            forged_sent: 0,
            read_throughs: 0,
            coordinator_restarts: 0,
        }
    }
}

/// Runs one seed of `cfg`: its report, or the first invariant it broke.
pub fn run_seed(seed: u64, cfg: &SimConfig) -> Result<SimReport, Violation> {
    let mut sim = Sim::new(seed, cfg);
    let mut converged = false;
    for now in 1..=cfg.work_ms + cfg.settle_ms {
        sim.step(now)?;
        if now > cfg.work_ms && now.is_multiple_of(cfg.tick_ms) {
            if let Some(since) = sim.convergence.check(now, &sim.cluster, cfg.epoch_ms) {
                if !converged {
                    sim.report.converged_at_ms = since;
                    converged = true;
                }
                // A revocation must have reached everyone too (its check, at the end).
                if revocation::learnt_by_all(&sim.cluster, sim.report.revoked) {
                    return sim.finish();
                }
            }
        }
    }
    if converged {
        // Settled but a revocation never reached someone: the end checks say who.
        return sim.finish();
    }
    Err(Convergence::failed(seed, cfg.settle_ms, &sim.cluster, &sim.workload.keys))
}

/// One run's state: the cluster, the network, the workload, the fault schedule's actors, the
/// history and the checkers' state.
struct Sim<'c> {
    seed: u64,
    cfg: &'c SimConfig,
    /// Everything random in the run comes from here, in a fixed order.
    rng: StdRng,
    cluster: Cluster<'c>,
    net: Net,
    faults_on: Faults,
    faults_off: Faults,
    workload: Workload,
    revoker: Revoker,
    history: History,
    coherence: Coherence,
    durability: Durability,
    convergence: Convergence,
    report: SimReport,
    /// Effects produced outside a step's own work (a restarted node's recovery, the
    /// coordinators' announcements), handled with the next step's.
    carried: Vec<(usize, Effect)>,
}

impl<'c> Sim<'c> {
    fn new(seed: u64, cfg: &'c SimConfig) -> Sim<'c> {
        let cluster = Cluster::new(seed, cfg);
        Sim {
            seed,
            cfg,
            rng: StdRng::seed_from_u64(seed),
            net: Net::new(cluster.endpoints()),
            history: History::new(cluster.nodes()),
            cluster,
            faults_on: Faults::of(cfg),
            faults_off: Faults::calm(),
            workload: Workload::new(cfg),
            revoker: Revoker::default(),
            coherence: Coherence::default(),
            durability: Durability::default(),
            convergence: Convergence::default(),
            report: SimReport::new(seed),
            carried: Vec::new(),
        }
    }

    /// One simulated millisecond.
    fn step(&mut self, now: u64) -> Result<(), Violation> {
        let active = now <= self.cfg.work_ms;
        let mut out = Produced::default();
        self.cluster.deliver(&mut self.net, now, &mut out);
        if active {
            self.workload.issue(self.seed, &mut self.rng, &mut self.cluster, now, &mut out, &mut self.report)?;
        }
        self.cluster.flush_and_tick(now, &mut out);
        self.act(now, active, out)?;
        if active {
            self.cluster.crash_nodes(&mut self.rng, now, &mut self.report);
            self.cluster.crash_coordinator(&mut self.rng, now, &mut self.report);
            self.cluster.crash_servers(&mut self.rng, now, &mut self.report);
            if self.net.maybe_partition(&mut self.rng, self.cfg.partition, now + self.cfg.heal_ms) {
                self.report.partitions += 1;
            }
        }
        self.revoker.revoke_if_due(now, &mut self.cluster, &self.history, &mut self.carried, &mut self.report);
        let faults = if active { &self.faults_on } else { &self.faults_off };
        let keys = &self.workload.keys;
        self.revoker.forge(&mut self.rng, &mut self.net, faults, now, &self.cluster, keys, &mut self.report);
        self.net.heal(now, !active);
        for i in self.cluster.restart_due(&mut self.rng, now, &mut self.carried, &mut self.report) {
            let node = self.cluster.eps[i].node.as_ref().expect("just restarted");
            self.durability.check_rebuilt(self.seed, now, node, &self.history)?;
            self.report.recoveries += 1;
        }
        self.check(now)
    }

    /// Carries out what the endpoints produced: the servers' first, then the nodes' (the
    /// effects carried from the last step first). Ops issued locally are recorded at put time
    /// (they are in the memtable at once).
    fn act(&mut self, now: u64, active: bool, out: Produced) -> Result<(), Violation> {
        let seed = self.seed;
        let f = if active { &self.faults_on } else { &self.faults_off };
        let total = self.cluster.endpoints();
        for (i, e) in out.server {
            match e {
                ServerEffect::Publish(b) => self.net.publish(&mut self.rng, f, now, i, &b, total),
                ServerEffect::Equivocation { writer, seq } => {
                    return Err(equivocation::reported(seed, now, writer, seq))
                }
            }
        }
        let effects: Vec<(usize, Effect)> = self.carried.drain(..).chain(out.effects).collect();
        for (i, e) in effects {
            match e {
                Effect::Publish(b) => self.net.publish(&mut self.rng, f, now, i, &b, total),
                Effect::Wrote(w, seq, hash, ops) => {
                    equivocation::signed(seed, now, &mut self.history, w, seq, hash, ops)?;
                }
                Effect::Sealed(k, v, val) => self.history.sealed(i, k, v, val),
                Effect::Note(Output::Equivocation { writer, seq, .. }) => {
                    return Err(equivocation::reported(seed, now, writer, seq));
                }
                Effect::Note(Output::Withholding { .. }) => self.report.withholding_reports += 1,
                Effect::Note(_) => {}
            }
        }
        for node in self.cluster.live() {
            self.history.pending(node);
        }
        Ok(())
    }

    /// The invariants checked after every step.
    fn check(&mut self, now: u64) -> Result<(), Violation> {
        let (seed, keys) = (self.seed, &self.workload.keys);
        unverified::check_stored(seed, now, &mut self.cluster, &self.history)?;
        self.durability.check(seed, now, &self.cluster, &self.history)?;
        unverified::check_memtables(seed, now, &self.cluster, keys, &self.history)?;
        self.coherence.check(seed, now, &self.cluster, keys)
    }

    /// The run converged: the end-state checkers, then the report.
    fn finish(mut self) -> Result<SimReport, Violation> {
        let (seed, c) = (self.seed, &self.cluster);
        self.report.durable_records = self.durability.check_end(seed, c, &self.history)?;
        self.report.records_lost_on_crash = c.slots.iter().map(|s| s.disk.lost_on_crash).sum();
        self.report.torn_writes = c.slots.iter().map(|s| s.disk.torn_writes).sum();
        completeness::check_end(seed, c, &self.history)?;
        revocation::check_end(seed, c, self.report.revoked)?;
        let mut all_metrics = c.retired_metrics.clone();
        all_metrics.extend(c.live().map(|n| n.metrics.clone()));
        for r in RejectReason::ALL {
            let count: u64 = all_metrics.iter().map(|m| m.rejected(r)).sum();
            if count > 0 {
                self.report.rejected.insert(r.name(), count);
            }
        }
        self.report.records_written = all_metrics.iter().map(|m| psl_scl::Metrics::get(&m.records_written)).sum();
        self.report.epochs = c.live().map(|x| x.core().epoch() & 0xffff_ffff).max().unwrap_or(0);
        self.report.net = self.net.stats;
        Ok(self.report)
    }
}
