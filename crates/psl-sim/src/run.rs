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

/// What a run that broke no invariant did: its workload, faults, convergence and counters.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SimReport {
    /// The seed that replays this run exactly.
    pub seed: u64,
    /// Puts and deletes the workload issued.
    pub ops_issued: u64,
    /// Records the nodes' own writers wrote (data, control and Cert records; crashed nodes
    /// included).
    pub records_written: u64,
    /// Worker node crashes, the revocation scenario's RESET included.
    pub crashes: u64,
    /// Crashes of the primary coordinator.
    pub coordinator_crashes: u64,
    /// Partitions that split the endpoints in two.
    pub partitions: u64,
    /// Simulated ms from which the memtables stayed identical (and quiet) until the run ended.
    pub converged_at_ms: u64,
    /// The highest epoch counter a live node reached (the low 32 bits: without the term).
    pub epochs: u64,
    /// Withholding reports the nodes' cores made (a writer's records could not be obtained).
    pub withholding_reports: u64,
    /// Capsule server crashes.
    pub server_crashes: u64,
    /// Records written but not synced that server crashes lost.
    pub records_lost_on_crash: u64,
    /// Server crashes that left a torn prefix of the unsynced writes on the disk.
    pub torn_writes: u64,
    /// Records counted durable by their nodes (all writers).
    pub durable_records: u64,
    /// Nodes restarted empty and rebuilt from a majority of servers (each checked at once).
    pub recoveries: u64,
    /// Messages and records the nodes refused, by reject reason (only reasons seen).
    pub rejected: BTreeMap<&'static str, u64>,
    /// What the network did: sent, delivered, dropped, duplicated, corrupted, replayed.
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

/// An invariant a run broke: the first one its checkers caught, with the seed that replays it.
/// Every variant's `seed` is that seed, and `at_ms` (where present) the simulated ms of the step
/// that broke it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Violation {
    /// No unverified byte applied: a live node's memtable holds a (version, value) for a key that
    /// no honest writer issued (a corrupted, replayed or forged message was applied).
    #[error("seed {seed} at {at_ms} ms: node {node} holds key {key:?} at {version:?}, which no honest writer issued with that value")]
    Unverified {
        /// The seed that replays the run.
        seed: u64,
        /// Simulated ms of the step that caught it.
        at_ms: u64,
        /// The node's id (stable across its incarnations).
        node: u32,
        /// The key (lossy UTF-8).
        key: String,
        /// The version the node holds for the key.
        version: Version,
    },
    /// Coherence: within one incarnation, a node's version of a key went backwards.
    #[error("seed {seed} at {at_ms} ms: node {node}, key {key:?}: version went back from {from:?} to {to:?}")]
    Coherence {
        /// The seed that replays the run.
        seed: u64,
        /// Simulated ms of the step that caught it.
        at_ms: u64,
        /// The node's id (stable across its incarnations).
        node: u32,
        /// The key (lossy UTF-8).
        key: String,
        /// The version the node showed before.
        from: Version,
        /// The older version it showed next.
        to: Version,
    },
    /// No equivocation: a node or a server reported two signed records for one (writer, seq).
    #[error("seed {seed} at {at_ms} ms: equivocation by honest writer {writer} at seq {seq}")]
    Equivocation {
        /// The seed that replays the run.
        seed: u64,
        /// Simulated ms of the step that caught it.
        at_ms: u64,
        /// The honest writer's index.
        writer: u32,
        /// The seq with two records.
        seq: u64,
    },
    /// Convergence: the live nodes' memtables still differed (or were not quiet) `settle_ms`
    /// after faults stopped.
    #[error("seed {seed}: memtables still differ {settle_ms} ms after faults stopped: {detail}")]
    NoConvergence {
        /// The seed that replays the run.
        seed: u64,
        /// How long the run settled, in ms.
        settle_ms: u64,
        /// Each live node's key count, memtable digest and gaps.
        detail: String,
    },
    /// Completeness: at the end, a live node lacks (or holds an older version than) an op that a
    /// node that never crashed sealed into a record.
    #[error("seed {seed}: node {node}, key {key:?}: holds {held:?}, but {expected:?} was issued and sealed by a node that never crashed")]
    Lost {
        /// The seed that replays the run.
        seed: u64,
        /// The node's id (stable across its incarnations).
        node: u32,
        /// The key (lossy UTF-8).
        key: String,
        /// The version the node holds (`None`: no entry).
        held: Option<Version>,
        /// The version sealed by a node that never crashed.
        expected: Version,
    },
    /// Durability: a record a node counted durable is not in the synced part of f + 1 servers'
    /// disks.
    #[error("seed {seed} at {at_ms} ms: writer {writer} seq {seq} was counted durable but is synced on only {on} servers ({need} needed)")]
    NotDurable {
        /// The seed that replays the run.
        seed: u64,
        /// Simulated ms of the step that caught it.
        at_ms: u64,
        /// The honest writer's index.
        writer: u32,
        /// The newest seq counted durable.
        seq: u64,
        /// Servers whose synced disk holds the record.
        on: usize,
        /// Servers it needs to be on (f + 1).
        need: usize,
    },
    /// No unverified record stored: a server wrote to its disk a record no honest writer sealed.
    #[error("seed {seed} at {at_ms} ms: server {server} wrote record {hash}, which no honest writer sealed")]
    UnverifiedStored {
        /// The seed that replays the run.
        seed: u64,
        /// Simulated ms of the step that caught it.
        at_ms: u64,
        /// The server's id (its slot index).
        server: u32,
        /// The stored record's hash.
        hash: Hash256,
    },
    /// Durability: a node just rebuilt from a majority of the servers lacks a write in a record
    /// counted durable.
    #[error("seed {seed} at {at_ms} ms: node {node} rebuilt from a majority of servers lacks key {key:?} at {expected:?} (holds {held:?}), which is in a record counted durable")]
    NotRecovered {
        /// The seed that replays the run.
        seed: u64,
        /// Simulated ms of the step that caught it.
        at_ms: u64,
        /// The node's id (stable across its incarnations).
        node: u32,
        /// The key (lossy UTF-8).
        key: String,
        /// The version the node holds (`None`: no entry).
        held: Option<Version>,
        /// The version in the durable record.
        expected: Version,
    },
    /// Durability: at the end, a live node lacks an op of a record counted durable.
    #[error("seed {seed}: node {node}, key {key:?}: holds {held:?}, but {expected:?} is in a record counted durable")]
    DurableLost {
        /// The seed that replays the run.
        seed: u64,
        /// The node's id (stable across its incarnations).
        node: u32,
        /// The key (lossy UTF-8).
        key: String,
        /// The version the node holds (`None`: no entry).
        held: Option<Version>,
        /// The version in the durable record.
        expected: Version,
    },
    /// No equivocation: an honest writer signed two different records at one seq (a restarted
    /// coordinator resumed before the newest seq it had signed, say).
    #[error("seed {seed} at {at_ms} ms: honest writer {writer} signed seq {seq} twice, as {first} and as {second}")]
    SignedTwice {
        /// The seed that replays the run.
        seed: u64,
        /// Simulated ms of the step that caught it.
        at_ms: u64,
        /// The honest writer's index.
        writer: u32,
        /// The seq in the writer's chain.
        seq: u64,
        /// The hash signed first.
        first: Hash256,
        /// The hash signed next.
        second: Hash256,
    },
    /// Read your writes: right after a local write, its node does not show the write's version,
    /// or that version does not supersede what the node showed before.
    #[error("seed {seed} at {at_ms} ms: node {node} wrote key {key:?} at {written:?} but then showed {shown:?} (before the write: {before:?}): the write does not supersede what its node showed")]
    WriteNotShown {
        /// The seed that replays the run.
        seed: u64,
        /// Simulated ms of the step that caught it.
        at_ms: u64,
        /// The node's id (stable across its incarnations).
        node: u32,
        /// The key (lossy UTF-8).
        key: String,
        /// What the node showed for the key before the write.
        before: Option<Version>,
        /// The version the write was given.
        written: Version,
        /// What the node showed right after the write.
        shown: Option<Version>,
    },
    /// Revocation learnt: at the end, a live node or server has not learnt the revocation.
    #[error("seed {seed}: {who} never learnt the revocation of writer {writer}")]
    RevocationNotLearnt {
        /// The seed that replays the run.
        seed: u64,
        /// Which endpoint: `node N` or `server N`.
        who: String,
        /// The revoked writer.
        writer: u32,
    },
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
