//! The cluster of one run: the worker nodes, the coordinators and the capsule servers (with
//! their disks), and what happens to them: deliveries, flushes and ticks, crashes and restarts
//! (a node restarts empty under a new incarnation and, with servers, is rebuilt from a majority
//! of them; a server restarts from what its disk kept; a primary coordinator restarts, if the
//! run says so, with its writer index and its own-chain log).

use crate::config::SimConfig;
use crate::net::Net;
use crate::node::{Effect, NodeSpec, SimLog, SimNode};
use crate::server::{ServerEffect, SimDisk, SimServer};
use crate::SimReport;
use psl_capsule::{new_capsule_with, Limits, SignedMetadata, WriterKeys};
use psl_crypto::{AppKey, OwnerKey};
use psl_scl::{CoordinatorConfig, Metrics};
use rand::rngs::StdRng;
use rand::Rng;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Endpoint ids of coordinators start here (worker nodes count from 1).
const COORDINATOR_ID_BASE: u32 = 1000;

/// One capsule server: down between a crash and its restart; its disk survives.
pub struct ServerSlot {
    /// The running server (`None` while it is down).
    pub server: Option<SimServer>,
    /// Its disk, kept across crashes (minus what a crash loses).
    pub disk: SimDisk,
    /// When a crashed server restarts, in simulated ms.
    pub restart_at: Option<u64>,
}

/// A worker node or a coordinator: down (`node: None`) between a crash and its restart.
pub struct Endpoint {
    /// The running node (`None` while it is down, or for good after a coordinator crash).
    pub node: Option<SimNode>,
    /// Data writers per incarnation (0 for coordinators).
    pub writers: usize,
    /// Its node id, the same across incarnations (worker nodes from 1, coordinators from 1000).
    pub id: u32,
    /// A coordinator's rank.
    pub rank: Option<u8>,
    /// When a crashed node restarts, in simulated ms (`None`: it is up, or stays down).
    pub restart_at: Option<u64>,
    /// The current (or next, while down) incarnation: one more at each restart.
    pub incarnation: u32,
    /// Whether it ever crashed or was RESET: the completeness check counts only what nodes
    /// that never crashed sealed.
    pub ever_crashed: bool,
    /// A coordinator's own-chain log (runs whose primary coordinator restarts).
    pub log: Option<SimLog>,
}

/// What the endpoints produced during one step, for the run loop to act on.
#[derive(Default)]
pub struct Produced {
    /// By endpoint index (nodes and coordinators).
    pub effects: Vec<(usize, Effect)>,
    /// By endpoint index (servers come after the nodes).
    pub server: Vec<(usize, ServerEffect)>,
}

/// Everything that runs in one simulated run: the capsule, its worker nodes and coordinators,
/// and its capsule servers with their disks.
pub struct Cluster<'c> {
    cfg: &'c SimConfig,
    seed: u64,
    /// The capsule's signed metadata (owner key derived from the seed).
    pub meta: SignedMetadata,
    /// The capsule's application key: the writers' and servers' keys come from it (and the
    /// revocation scenario's leader signs with it).
    pub app: AppKey,
    /// Worker nodes, then coordinators.
    pub eps: Vec<Endpoint>,
    /// The capsule servers, by server id; network endpoint `nodes() + i` is slot `i`.
    pub slots: Vec<ServerSlot>,
    /// Servers whose synced copies a write needs to count as durable (f + 1).
    pub quorum: usize,
    /// Writers of crashed incarnations: records they sealed but nobody received are gone, so
    /// gaps in their chains may never close (and must be the same on every node).
    pub dead_writers: BTreeSet<u32>,
    /// Metrics of nodes that crashed (for the report).
    pub retired_metrics: Vec<Arc<Metrics>>,
    fx: Vec<Effect>,
    sfx: Vec<ServerEffect>,
}

impl<'c> Cluster<'c> {
    /// The capsule (its owner key from the seed), the nodes, coordinators and servers at time 0.
    pub fn new(seed: u64, cfg: &'c SimConfig) -> Cluster<'c> {
        let mut seed_bytes = [0u8; 32];
        seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
        seed_bytes[8] = 0x51;
        let owner = OwnerKey::from_seed(&seed_bytes).expect("32-byte seed");
        let app = owner.app(1).expect("index below 2^31");
        let scheme = if cfg.certified { WriterKeys::Certified } else { WriterKeys::Derived };
        let meta = new_capsule_with(&owner, 1, "sim", 0, Limits::default(), scheme).expect("valid metadata");
        let mut c = Cluster {
            cfg,
            seed,
            meta,
            app,
            eps: Vec::new(),
            slots: Vec::new(),
            quorum: cfg.servers / 2 + 1,
            dead_writers: BTreeSet::new(),
            retired_metrics: Vec::new(),
            fx: Vec::new(),
            sfx: Vec::new(),
        };
        for i in 0..cfg.nodes {
            let id = i as u32 + 1;
            let node = c.make_node(id, 0, None, seed, 0, None);
            c.eps.push(Endpoint::new(Some(node), cfg.writers_per_node, id, None, None));
        }
        for r in 0..cfg.coordinators.min(c.meta.meta.policy.coordinators as usize) {
            let rank = r as u8;
            let id = COORDINATOR_ID_BASE + r as u32;
            let log = cfg.coordinator_restart_ms.map(|_| SimLog::default());
            let node = c.make_node(id, 0, Some(rank), seed, 0, log.clone());
            c.eps.push(Endpoint::new(Some(node), 0, id, Some(rank), log));
        }
        c.slots = (0..cfg.servers)
            .map(|i| {
                let disk = SimDisk::default();
                let server = SimServer::new(i as u32, &c.meta, &c.app, &disk, 0, cfg.bug_ack_before_sync);
                ServerSlot { server: Some(server), disk, restart_at: None }
            })
            .collect();
        c
    }

    fn coordinator_config(&self, rank: u8) -> CoordinatorConfig {
        CoordinatorConfig {
            epoch_ms: self.cfg.epoch_ms,
            epoch_idle_ms: psl_scl::coordinator::EPOCH_IDLE_MS_DEFAULT,
            eoe_timeout_ms: self.cfg.epoch_ms * 3,
            takeover_after_epochs: 5,
            rank,
            ranks: self.meta.meta.policy.coordinators,
            missed_eoe_max: 3,
        }
    }

    /// A node (`rank: None`, with the run's data writers) or a coordinator of `rank`.
    fn make_node(
        &self,
        id: u32,
        incarnation: u32,
        rank: Option<u8>,
        seed: u64,
        now: u64,
        log: Option<SimLog>,
    ) -> SimNode {
        let mut config = NodeSpec::config(self.cfg.servers as u32);
        if rank.is_some() {
            config.rejoin_ms = self.cfg.coordinator_rejoin_ms;
            if let Some(max) = self.cfg.coordinator_cache_records_max.filter(|_| rank == Some(0)) {
                config.cache_records_max = max;
            }
        }
        SimNode::new(NodeSpec {
            id,
            incarnation,
            meta: &self.meta,
            app: &self.app,
            writers: if rank.is_some() { 0 } else { self.cfg.writers_per_node },
            coordinator: rank.map(|r| (r, self.coordinator_config(r))),
            seed,
            now,
            batch_ops_max: self.cfg.batch_ops_max,
            flush_ms: self.cfg.flush_ms,
            config,
            log,
        })
    }

    /// The run's configuration.
    pub fn cfg(&self) -> &'c SimConfig {
        self.cfg
    }

    /// The run's seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Nodes and coordinators.
    pub fn nodes(&self) -> usize {
        self.eps.len()
    }

    /// Every endpoint of the network: nodes, coordinators, then servers.
    pub fn endpoints(&self) -> usize {
        self.eps.len() + self.slots.len()
    }

    /// The nodes and coordinators that are up.
    pub fn live(&self) -> impl Iterator<Item = &SimNode> + '_ {
        self.eps.iter().filter_map(|e| e.node.as_ref())
    }

    /// The messages due now, each to its endpoint if it is up.
    pub fn deliver(&mut self, net: &mut Net, now: u64, out: &mut Produced) {
        let n = self.eps.len();
        for (to, bytes) in net.due(now) {
            if to >= n {
                let slot = &mut self.slots[to - n];
                if let Some(srv) = slot.server.as_mut() {
                    srv.receive(&bytes, now, &slot.disk, &mut self.sfx);
                    out.server.extend(self.sfx.drain(..).map(|e| (to, e)));
                }
                continue;
            }
            if let Some(node) = self.eps[to].node.as_mut() {
                node.receive(&bytes, now, &mut self.fx);
                out.effects.extend(self.fx.drain(..).map(|e| (to, e)));
            }
        }
    }

    /// Nodes' writers seal the batches their seal policy says are due, nodes tick on their period; servers group-commit
    /// (write, then the fsync completes `fsync_ms` later) and tick.
    pub fn flush_and_tick(&mut self, now: u64, out: &mut Produced) {
        for (i, ep) in self.eps.iter_mut().enumerate() {
            let Some(node) = ep.node.as_mut() else { continue };
            node.seal_due(now, &mut self.fx);
            if now.is_multiple_of(self.cfg.tick_ms) {
                node.tick(now, &mut self.fx);
            }
            out.effects.extend(self.fx.drain(..).map(|e| (i, e)));
        }
        let n = self.eps.len();
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if let Some(srv) = slot.server.as_mut() {
                srv.step(now, now.is_multiple_of(self.cfg.tick_ms), self.cfg.fsync_ms, &mut slot.disk, &mut self.sfx);
            }
            out.server.extend(self.sfx.drain(..).map(|e| (n + i, e)));
        }
    }

    /// Worker nodes crash at the run's rate; they restart `restart_ms` later.
    pub fn crash_nodes(&mut self, rng: &mut StdRng, now: u64, report: &mut SimReport) {
        for i in 0..self.eps.len() {
            let ep = &self.eps[i];
            if ep.writers > 0 && ep.node.is_some() && rng.random_bool(self.cfg.crash) {
                self.take_down(i, now + self.cfg.restart_ms, report);
            }
        }
    }

    /// A node crashes (or is RESET): its writers die with it, and it restarts empty at
    /// `restart_at` under a new incarnation. Returns the node it was.
    pub fn take_down(&mut self, i: usize, restart_at: u64, report: &mut SimReport) -> Option<SimNode> {
        let ep = &mut self.eps[i];
        let node = ep.node.take()?;
        self.dead_writers.extend(node.authors.iter().map(|a| a.writer()));
        self.retired_metrics.push(node.metrics.clone());
        ep.restart_at = Some(restart_at);
        ep.ever_crashed = true;
        report.crashes += 1;
        Some(node)
    }

    /// The primary coordinator crashes at the run's rate while a shadow is up; for good, or
    /// until `coordinator_restart_ms` later.
    pub fn crash_coordinator(&mut self, rng: &mut StdRng, now: u64, report: &mut SimReport) {
        let primary_alive = self.eps.iter().any(|e| e.rank == Some(0) && e.node.is_some());
        let shadow_alive = self.eps.iter().any(|e| e.rank.is_some_and(|r| r > 0) && e.node.is_some());
        if primary_alive && shadow_alive && rng.random_bool(self.cfg.coordinator_crash) {
            let ep = self.eps.iter_mut().find(|e| e.rank == Some(0)).expect("primary exists");
            if let Some(node) = ep.node.take() {
                self.dead_writers.extend(node.coordinator_writer());
                self.retired_metrics.push(node.metrics.clone());
            }
            ep.restart_at = self.cfg.coordinator_restart_ms.map(|d| now + d);
            report.coordinator_crashes += 1;
        }
    }

    /// A server crashes at the run's rate while fewer than f are down: its disk loses what was
    /// not synced (or keeps a torn prefix of it).
    pub fn crash_servers(&mut self, rng: &mut StdRng, now: u64, report: &mut SimReport) {
        let down = self.slots.iter().filter(|s| s.server.is_none()).count();
        if self.cfg.server_crash > 0.0 && down < self.cfg.servers - self.quorum {
            if let Some(i) = (0..self.slots.len()).find(|_| rng.random_bool(self.cfg.server_crash)) {
                let slot = &mut self.slots[i];
                if slot.server.take().is_some() {
                    slot.disk.crash(rng, self.cfg.torn_write);
                    slot.restart_at = Some(now + self.cfg.server_restart_ms);
                    report.server_crashes += 1;
                }
            }
        }
    }

    /// Restarts the endpoints due now; their first effects go to `carried`. Returns the nodes
    /// rebuilt from a majority of the servers (each must hold every durable write at once).
    pub fn restart_due(
        &mut self,
        rng: &mut StdRng,
        now: u64,
        carried: &mut Vec<(usize, Effect)>,
        report: &mut SimReport,
    ) -> Vec<usize> {
        let mut rebuilt = Vec::new();
        for i in 0..self.eps.len() {
            if self.eps[i].restart_at.is_none_or(|t| now < t) {
                continue;
            }
            let ep = &mut self.eps[i];
            ep.restart_at = None;
            ep.incarnation += 1;
            let (id, inc, rank, log) = (ep.id, ep.incarnation, ep.rank, ep.log.clone());
            let mut node = self.make_node(id, inc, rank, self.seed ^ ((inc as u64) << 40), now, log.clone());
            if let Some(log) = log.filter(|_| rank.is_some()) {
                self.restore_coordinator(&mut node, log, now, i, carried);
                report.coordinator_restarts += 1;
            } else {
                node.quiet_until = now + 3 * self.cfg.epoch_ms;
                if self.recover(&mut node, rng, now, i, carried) {
                    rebuilt.push(i);
                }
            }
            self.eps[i].node = Some(node);
        }
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if slot.restart_at.is_some_and(|t| now >= t) {
                slot.restart_at = None;
                slot.server = Some(SimServer::new(
                    i as u32,
                    &self.meta,
                    &self.app,
                    &slot.disk,
                    now,
                    self.cfg.bug_ack_before_sync,
                ));
            }
        }
        rebuilt
    }

    /// A restarted coordinator takes its own chain back from its log.
    fn restore_coordinator(
        &mut self,
        node: &mut SimNode,
        log: SimLog,
        now: u64,
        i: usize,
        carried: &mut Vec<(usize, Effect)>,
    ) {
        node.restore_own_chain(log.records(), now, &mut self.fx);
        carried.extend(self.fx.drain(..).map(|e| (i, e)));
    }

    /// Restarted empty: rebuilt from the union of a majority of the servers' synced copies
    /// (what `psl node --recover-from` does over TCP). Returns whether it was.
    fn recover(
        &mut self,
        node: &mut SimNode,
        rng: &mut StdRng,
        now: u64,
        i: usize,
        carried: &mut Vec<(usize, Effect)>,
    ) -> bool {
        if self.cfg.servers == 0 {
            return false;
        }
        let live: Vec<&ServerSlot> = self.slots.iter().filter(|s| s.server.is_some()).collect();
        if live.len() < self.quorum {
            return false;
        }
        let mut chains: BTreeMap<u32, &[psl_capsule::Verified<psl_capsule::Record>]> = BTreeMap::new();
        let skip = rng.random_range(0..=live.len() - self.quorum);
        for slot in live.iter().skip(skip).take(self.quorum) {
            for (w, c) in slot.disk.synced_chains() {
                let e = chains.entry(w).or_insert(c);
                if c.len() > e.len() {
                    *e = c;
                }
            }
        }
        let capsule = self.meta.name();
        for r in chains.values().flat_map(|c| c.iter()) {
            let bytes = psl_scl::Msg::Record { capsule, bytes: r.shared_bytes() }.encode();
            node.receive(&bytes, now, &mut self.fx);
        }
        carried.extend(self.fx.drain(..).map(|e| (i, e)));
        true
    }
}

impl Endpoint {
    fn new(node: Option<SimNode>, writers: usize, id: u32, rank: Option<u8>, log: Option<SimLog>) -> Endpoint {
        Endpoint { node, writers, id, rank, restart_at: None, incarnation: 0, ever_crashed: false, log }
    }
}
