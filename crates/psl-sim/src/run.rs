//! The simulation loop, the fault schedule and the invariants.
//!
//! Invariants, checked after every simulated millisecond:
//! - **no unverified byte applied**: every memtable entry of every node is an op some honest
//!   writer issued, with that exact version and value (corrupted, replayed or forged messages
//!   never show up as data);
//! - **coherence**: on every node, the version of each key only moves forward;
//! - **no equivocation** among honest writers (a restarted node writes under a new incarnation).
//! - with capsule servers: **no unverified record stored** (every record any server wrote to its
//!   disk is one an honest writer sealed), and **durable means on f + 1 disks**: every record a
//!   node ever counted durable (`NodeCore::durable_next`) is in the synced part of at least
//!   f + 1 servers' disks, whatever crashed (servers lose their unsynced writes, or keep a torn
//!   prefix of them).
//!
//! And at the end: once faults stop, every live node's memtable becomes identical within
//! `settle_ms`; with no crash in the run, identical to the last-writer-wins result of every op
//! issued; with crashes, no op sealed by a node that never crashed is missing; and no op of a
//! record counted durable is missing, even if its node crashed (it is rebuilt from the servers).

use crate::config::SimConfig;
use crate::net::{Faults, Net, NetStats};
use crate::node::{Effect, SimNode};
use crate::server::{ServerEffect, SimDisk, SimServer};
use psl_capsule::{new_capsule_with, Author, KeyStatement, Limits, Revocation, WriterCert, WriterKeys};
use psl_crypto::Hash256;
use psl_crypto::OwnerKey;
use psl_scl::{CoordinatorConfig, Output, RejectReason, Version};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashMap};

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
    #[error("seed {seed}: {who} never learnt the revocation of writer {writer}")]
    RevocationNotLearnt { seed: u64, who: String, writer: u32 },
}

/// The data ops of one record: (key, version).
type KeyVersions = Vec<(Vec<u8>, Version)>;

struct ServerSlot {
    server: Option<SimServer>,
    disk: SimDisk,
    restart_at: Option<u64>,
}

struct Endpoint {
    node: Option<SimNode>,
    /// Data writers per incarnation (0 for coordinators).
    writers: usize,
    id: u32,
    rank: Option<u8>,
    restart_at: Option<u64>,
    incarnation: u32,
    ever_crashed: bool,
    last: HashMap<Vec<u8>, Version>,
}

pub fn run_seed(seed: u64, cfg: &SimConfig) -> Result<SimReport, Violation> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut seed_bytes = [0u8; 32];
    seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
    seed_bytes[8] = 0x51;
    let owner = OwnerKey::from_seed(&seed_bytes).expect("32-byte seed");
    let app = owner.app(1).expect("index below 2^31");
    let scheme = if cfg.certified { WriterKeys::Certified } else { WriterKeys::Derived };
    let meta = new_capsule_with(&owner, 1, "sim", 0, Limits::default(), scheme).expect("valid metadata");
    let ccfg = |rank: u8| CoordinatorConfig {
        epoch_ms: cfg.epoch_ms,
        eoe_timeout_ms: cfg.epoch_ms * 3,
        takeover_after_epochs: 5,
        rank,
        ranks: meta.meta.policy.coordinators,
        missed_eoe_max: 3,
    };
    let servers = cfg.servers as u32;
    let mut eps: Vec<Endpoint> = Vec::new();
    for i in 0..cfg.nodes {
        let id = i as u32 + 1;
        let node = SimNode::new(id, 0, &meta, &app, cfg.writers_per_node, None, seed, 0, cfg.batch_ops_max, servers);
        eps.push(Endpoint {
            node: Some(node),
            writers: cfg.writers_per_node,
            id,
            rank: None,
            restart_at: None,
            incarnation: 0,
            ever_crashed: false,
            last: HashMap::new(),
        });
    }
    for r in 0..cfg.coordinators.min(meta.meta.policy.coordinators as usize) {
        let rank = r as u8;
        let id = 1000 + r as u32;
        let node = SimNode::new(id, 0, &meta, &app, 0, Some((rank, ccfg(rank))), seed, 0, cfg.batch_ops_max, servers);
        eps.push(Endpoint {
            node: Some(node),
            writers: 0,
            id,
            rank: Some(rank),
            restart_at: None,
            incarnation: 0,
            ever_crashed: false,
            last: HashMap::new(),
        });
    }
    let n = eps.len();
    let mut slots: Vec<ServerSlot> = (0..cfg.servers)
        .map(|i| {
            let disk = SimDisk::default();
            let server = SimServer::new(i as u32, &meta, &app, &disk, 0, cfg.bug_ack_before_sync);
            ServerSlot { server: Some(server), disk, restart_at: None }
        })
        .collect();
    let total = n + slots.len();
    let quorum = cfg.servers / 2 + 1;
    let mut net = Net::new(total);
    // Every record an honest writer sealed: (writer, seq) -> (hash, data ops in it).
    let mut honest: HashMap<(u32, u64), (Hash256, KeyVersions)> = HashMap::new();
    let mut honest_hashes: std::collections::HashSet<Hash256> = std::collections::HashSet::new();
    // Per writer: the highest next seq any node ever counted durable.
    let mut reported: BTreeMap<u32, u64> = BTreeMap::new();
    let mut sfx: Vec<ServerEffect> = Vec::new();
    // Effects of a restarted node's recovery, handled with the next step's.
    let mut carried: Vec<(usize, Effect)> = Vec::new();
    let keys: Vec<Vec<u8>> = (0..cfg.keys).map(|k| format!("key{k:03}").into_bytes()).collect();
    // Every op any honest writer issued: (key, version) -> value.
    let mut issued: HashMap<(Vec<u8>, Version), Option<Vec<u8>>> = HashMap::new();
    // Ops sealed into records by each endpoint, for the end check.
    let mut sealed_by: Vec<Vec<(Vec<u8>, Version)>> = vec![Vec::new(); n];
    let mut report = SimReport {
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
    };
    // The adversary holding the revoked writer's key, once it is revoked.
    let mut adversary: Option<Author> = None;
    let faults_on = Faults {
        loss: cfg.loss,
        duplicate: cfg.duplicate,
        delay_ms_max: cfg.delay_ms_max,
        corrupt: cfg.corrupt,
        replay: cfg.replay,
    };
    let faults_off = Faults { loss: 0.0, duplicate: 0.0, delay_ms_max: 2, corrupt: 0.0, replay: 0.0 };
    let mut heal_at: Option<u64> = None;
    let end = cfg.work_ms + cfg.settle_ms;
    let mut stable_since: Option<u64> = None;
    let mut converged = false;
    let mut retired_metrics: Vec<std::sync::Arc<psl_scl::Metrics>> = Vec::new();
    // Writers of crashed incarnations: records they sealed but nobody received are gone, so
    // gaps in their chains may never close (and must be the same on every node).
    let mut dead_writers: std::collections::BTreeSet<u32> = std::collections::BTreeSet::new();

    for now in 1..=end {
        let active = now <= cfg.work_ms;
        let mut effects: Vec<(usize, Effect)> = Vec::new();
        let mut server_fx: Vec<(usize, ServerEffect)> = Vec::new();
        let mut fx = Vec::new();
        // Deliveries.
        for (to, bytes) in net.due(now) {
            if to >= n {
                let slot = &mut slots[to - n];
                if let Some(srv) = slot.server.as_mut() {
                    srv.receive(&bytes, now, &slot.disk, &mut sfx);
                    server_fx.extend(sfx.drain(..).map(|e| (to, e)));
                }
                continue;
            }
            if let Some(node) = eps[to].node.as_mut() {
                node.receive(&bytes, now, &mut fx);
                effects.extend(fx.drain(..).map(|e| (to, e)));
            }
        }
        // Workload.
        if active {
            for (i, ep) in eps.iter_mut().enumerate() {
                let Some(node) = ep.node.as_mut() else { continue };
                if ep.writers == 0 || now < node.quiet_until || !rng.random_bool(cfg.op_rate) {
                    continue;
                }
                let key = keys[rng.random_range(0..keys.len())].clone();
                let value = (!rng.random_bool(cfg.delete_share)).then(|| format!("{}@{now}", ep.id).into_bytes());
                report.ops_issued += 1;
                node.put(key, value, now, &mut fx);
                effects.extend(fx.drain(..).map(|e| (i, e)));
            }
        }
        // Flushes and ticks.
        for (i, ep) in eps.iter_mut().enumerate() {
            let Some(node) = ep.node.as_mut() else { continue };
            if now % cfg.flush_ms == 0 {
                node.flush(now, &mut fx);
            }
            if now % cfg.tick_ms == 0 {
                node.tick(now, &mut fx);
            }
            effects.extend(fx.drain(..).map(|e| (i, e)));
        }
        // Servers: group commits (write, then the fsync completes fsync_ms later), ticks.
        for (i, slot) in slots.iter_mut().enumerate() {
            if let Some(srv) = slot.server.as_mut() {
                srv.step(now, now % cfg.tick_ms == 0, cfg.fsync_ms, &mut slot.disk, &mut sfx);
            }
            server_fx.extend(sfx.drain(..).map(|e| (n + i, e)));
        }
        for (i, e) in server_fx {
            match e {
                ServerEffect::Publish(b) => {
                    net.publish(&mut rng, if active { &faults_on } else { &faults_off }, now, i, &b, total)
                }
                ServerEffect::Equivocation { writer, seq } => {
                    return Err(Violation::Equivocation { seed, at_ms: now, writer, seq });
                }
            }
        }
        // Effects: ops issued locally are recorded at put time (they are in the memtable at once).
        let mut effects: Vec<(usize, Effect)> = carried.drain(..).chain(effects.drain(..)).collect();
        for (i, e) in effects.drain(..) {
            match e {
                Effect::Publish(b) => {
                    net.publish(&mut rng, if active { &faults_on } else { &faults_off }, now, i, &b, total)
                }
                Effect::Wrote(w, seq, hash, ops) => {
                    honest_hashes.insert(hash);
                    honest.insert((w, seq), (hash, ops));
                }
                Effect::Sealed(k, v, val) => {
                    sealed_by[i].push((k.clone(), v));
                    issued.insert((k, v), val);
                }
                Effect::Note(Output::Equivocation { writer, seq, .. }) => {
                    return Err(Violation::Equivocation { seed, at_ms: now, writer, seq });
                }
                Effect::Note(Output::Withholding { .. }) => report.withholding_reports += 1,
                Effect::Note(_) => {}
            }
        }
        // Ops still pending in a node's queue are issued too (visible in its memtable).
        for ep in eps.iter() {
            if let Some(node) = &ep.node {
                for (ai, pend) in node.pending.iter().enumerate() {
                    let w = node.authors[ai].writer();
                    for op in pend {
                        let v = Version { lamport: op.lamport, writer: w };
                        let val = match &op.action {
                            psl_capsule::Action::Put(x) => Some(x.clone()),
                            psl_capsule::Action::Delete => None,
                        };
                        issued.entry((op.key.clone(), v)).or_insert(val);
                    }
                }
            }
        }
        // Faults.
        if active {
            for ep in eps.iter_mut() {
                if ep.writers > 0 && ep.node.is_some() && rng.random_bool(cfg.crash) {
                    let node = ep.node.take().expect("checked");
                    let restart_at = now + cfg.restart_ms;
                    take_down(ep, &node, restart_at, &mut dead_writers, &mut retired_metrics, &mut report);
                }
            }
            let primary_alive = eps.iter().any(|e| e.rank == Some(0) && e.node.is_some());
            let shadow_alive = eps.iter().any(|e| e.rank.is_some_and(|r| r > 0) && e.node.is_some());
            if primary_alive && shadow_alive && rng.random_bool(cfg.coordinator_crash) {
                let ep = eps.iter_mut().find(|e| e.rank == Some(0)).expect("primary exists");
                if let Some(node) = ep.node.take() {
                    dead_writers.extend(node.coordinator_writer());
                    retired_metrics.push(node.metrics.clone());
                }
                report.coordinator_crashes += 1;
            }
            let down = slots.iter().filter(|s| s.server.is_none()).count();
            if cfg.server_crash > 0.0 && down < cfg.servers - quorum {
                if let Some(i) = (0..slots.len()).find(|_| rng.random_bool(cfg.server_crash)) {
                    let slot = &mut slots[i];
                    if slot.server.take().is_some() {
                        slot.disk.crash(&mut rng, cfg.torn_write);
                        slot.restart_at = Some(now + cfg.server_restart_ms);
                        report.server_crashes += 1;
                    }
                }
            }
            if heal_at.is_none() && rng.random_bool(cfg.partition) {
                for s in net.side.iter_mut() {
                    *s = rng.random_range(0..2);
                }
                heal_at = Some(now + cfg.heal_ms);
                report.partitions += 1;
            }
        }
        // Revocation: the leader revokes one writer of the first node from two epochs ahead,
        // hands the revocation to the coordinators (they announce it and carry it into the log)
        // and RESETs the node (it restarts under a new incarnation, with new writers).
        // (At the first millisecond from `revoke_at_ms` on at which that node is up.)
        let due = cfg.revoke_at_ms.is_some_and(|t| now >= t) && report.revoked.is_none() && adversary.is_none();
        if cfg.certified && active && due && eps[0].node.is_some() {
            let ep = &mut eps[0];
            if let Some(node) = ep.node.take() {
                let w = node.authors.first().map(|a| a.writer());
                let epoch = eps.iter().filter_map(|e| e.node.as_ref()).map(|x| x.core().epoch()).max().unwrap_or(0);
                let restart_at = now + cfg.restart_ms;
                take_down(&mut eps[0], &node, restart_at, &mut dead_writers, &mut retired_metrics, &mut report);
                if let Some(w) = w {
                    let from_epoch = epoch + 2;
                    // The seq bound: everything the worker sealed before its RESET stays valid
                    // (the leader learns its writers' heads at the RESET); nothing after it does.
                    let top = honest.keys().filter(|(hw, _)| *hw == w).map(|(_, s)| *s).max();
                    let from_seq = top.map_or(0, |s| s + 1);
                    let rev = Revocation::issue(&app, meta.name(), 0, w, from_epoch, from_seq).expect("a writer index");
                    for (i, e) in eps.iter_mut().enumerate() {
                        if let Some(x) = e.node.as_mut().filter(|x| x.coordinator_writer().is_some()) {
                            x.announce(KeyStatement::Revoke(rev.clone()), now, &mut fx);
                            carried.extend(fx.drain(..).map(|e| (i, e)));
                        }
                    }
                    let cert = WriterCert::issue(&app, meta.name(), 0, w, 0).expect("a writer index");
                    let key = app.writer_hardened(w).expect("a writer index");
                    let mut a =
                        Author::with_certified_keys(&meta, key, cert, app.data_key()).expect("its own certificate");
                    // The adversary backdates: its records claim the epoch before the revocation's,
                    // so only the seq bound refuses them.
                    if let Some(seq) = top {
                        let hash = honest[&(w, seq)].0;
                        let back = from_epoch - 1;
                        a.resume(&psl_capsule::Head { writer: w, seq, hash, lamport: 1 << 40, epoch: back });
                    }
                    adversary = Some(a.with_salt_seed(seed ^ 0xBAD));
                    report.revoked = Some((w, from_epoch));
                }
            }
        }
        // The adversary writes as the revoked writer to every endpoint that has learnt the
        // revocation (a node or server that has not yet could not tell; see the threat model).
        if let (Some(a), true) = (adversary.as_mut(), now % 20 == 0) {
            let key = keys[rng.random_range(0..keys.len())].clone();
            let rec = a.write_ops([(key, Some(format!("forged@{now}").into_bytes()))]).expect("a small record");
            let bytes = psl_scl::Msg::Record { capsule: meta.name(), bytes: rec.shared_bytes() }.encode();
            let f = if active { &faults_on } else { &faults_off };
            for to in 0..total {
                let knows = if to < n {
                    eps[to].node.as_ref().is_some_and(|x| !x.engine.verifier().revocations().is_empty())
                } else {
                    slots[to - n].server.as_ref().is_some_and(|x| !x.verifier().revocations().is_empty())
                };
                if knows {
                    net.send_to(&mut rng, f, now, to, &bytes);
                    report.forged_sent += 1;
                }
            }
        }
        if heal_at.is_some_and(|t| now >= t || !active) {
            net.side.iter_mut().for_each(|s| *s = 0);
            heal_at = None;
        }
        for (i, ep) in eps.iter_mut().enumerate() {
            if ep.restart_at.is_some_and(|t| now >= t) {
                ep.restart_at = None;
                ep.incarnation += 1;
                let inc = ep.incarnation;
                let mut node = SimNode::new(
                    ep.id,
                    inc,
                    &meta,
                    &app,
                    ep.writers,
                    None,
                    seed ^ ((inc as u64) << 40),
                    now,
                    cfg.batch_ops_max,
                    servers,
                );
                node.quiet_until = now + 3 * cfg.epoch_ms;
                if servers > 0 {
                    // Restarted empty: rebuild from the union of a majority of the servers'
                    // synced copies (what `psl node --recover-from` does over TCP), then it must
                    // hold every write counted durable so far, before any peer could help.
                    let live: Vec<&ServerSlot> = slots.iter().filter(|s| s.server.is_some()).collect();
                    if live.len() >= quorum {
                        let mut chains: BTreeMap<u32, &[psl_capsule::Verified<psl_capsule::Record>]> = BTreeMap::new();
                        let skip = rng.random_range(0..=live.len() - quorum);
                        for slot in live.iter().skip(skip).take(quorum) {
                            for (w, c) in slot.disk.synced_chains() {
                                let e = chains.entry(w).or_insert(c);
                                if c.len() > e.len() {
                                    *e = c;
                                }
                            }
                        }
                        let capsule = meta.name();
                        for r in chains.values().flat_map(|c| c.iter()) {
                            let bytes = psl_scl::Msg::Record { capsule, bytes: r.shared_bytes() }.encode();
                            node.receive(&bytes, now, &mut fx);
                        }
                        carried.extend(fx.drain(..).map(|e| (i, e)));
                        for (w, next) in &reported {
                            for seq in 0..*next {
                                for (k, v) in honest.get(&(*w, seq)).map(|(_, ops)| &ops[..]).unwrap_or(&[]) {
                                    let held = node.memtable.entry(k).map(|e| e.version);
                                    if held.is_none_or(|h| h < *v) {
                                        return Err(Violation::NotRecovered {
                                            seed,
                                            at_ms: now,
                                            node: ep.id,
                                            key: show(k),
                                            held,
                                            expected: *v,
                                        });
                                    }
                                }
                            }
                        }
                        report.recoveries += 1;
                    }
                }
                ep.node = Some(node);
            }
        }
        for (i, slot) in slots.iter_mut().enumerate() {
            if slot.restart_at.is_some_and(|t| now >= t) {
                slot.restart_at = None;
                slot.server = Some(SimServer::new(i as u32, &meta, &app, &slot.disk, now, cfg.bug_ack_before_sync));
            }
        }
        // Invariants.
        // Servers store only records honest writers sealed (forged, corrupted ones never).
        for (i, slot) in slots.iter_mut().enumerate() {
            for h in slot.disk.fresh.drain(..) {
                if !honest_hashes.contains(&h) {
                    return Err(Violation::UnverifiedStored { seed, at_ms: now, server: i as u32, hash: h });
                }
            }
        }
        // Whatever a node counted durable is synced on f + 1 disks, now and forever after.
        if servers > 0 {
            for ep in eps.iter() {
                let Some(node) = &ep.node else { continue };
                for a in &node.authors {
                    let w = a.writer();
                    let d = node.core().durable_next(w);
                    let r = reported.entry(w).or_insert(0);
                    *r = (*r).max(d);
                }
            }
            for (w, next) in &reported {
                if *next == 0 {
                    continue;
                }
                let seq = next - 1;
                let hash = honest.get(&(*w, seq)).map(|(h, _)| *h);
                let on = slots.iter().filter(|s| hash.is_some() && s.disk.synced_hash(*w, seq) == hash).count();
                if on < quorum {
                    return Err(Violation::NotDurable { seed, at_ms: now, writer: *w, seq, on, need: quorum });
                }
            }
        }
        for ep in eps.iter_mut() {
            let Some(node) = &ep.node else { continue };
            for k in &keys {
                let Some(e) = node.memtable.entry(k) else { continue };
                let ok = issued.get(&(k.clone(), e.version)).is_some_and(|v| v.as_deref() == e.value.as_deref());
                if !ok {
                    return Err(Violation::Unverified {
                        seed,
                        at_ms: now,
                        node: ep.id,
                        key: show(k),
                        version: e.version,
                    });
                }
                if let Some(prev) = ep.last.insert(k.clone(), e.version) {
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
        // Convergence, once faults have stopped.
        if !active && now % cfg.tick_ms == 0 {
            let alive: Vec<&SimNode> = eps.iter().filter_map(|e| e.node.as_ref()).collect();
            let same = alive.windows(2).all(|w| w[0].memtable.digest() == w[1].memtable.digest());
            let quiet = alive.iter().all(|x| {
                x.core().orderer().gaps().iter().all(|(w, _, _)| dead_writers.contains(w))
                    && x.pending.iter().all(Vec::is_empty)
            }) && eps.iter().all(|e| e.restart_at.is_none());
            if same && quiet {
                let since = *stable_since.get_or_insert(now);
                if now - since >= 3 * cfg.epoch_ms {
                    converged = true;
                    report.converged_at_ms = since;
                    break;
                }
            } else {
                stable_since = None;
            }
        }
    }
    if !converged {
        let mut diffs = Vec::new();
        for k in &keys {
            let vs: Vec<String> = eps
                .iter()
                .filter_map(|e| e.node.as_ref().map(|x| (e.id, x.memtable.entry(k))))
                .map(|(id, e)| {
                    format!("{id}:{:?}", e.map(|e| (e.version.lamport, e.version.writer, e.value.is_some())))
                })
                .collect();
            let first = eps.iter().find_map(|e| e.node.as_ref()).map(|x| x.memtable.entry(k));
            if eps.iter().filter_map(|e| e.node.as_ref()).any(|x| Some(x.memtable.entry(k)) != first) {
                diffs.push(format!("{}: {}", show(k), vs.join(" ")));
            }
        }
        let rejected: Vec<String> = eps
            .iter()
            .filter_map(|e| e.node.as_ref().map(|x| (e.id, x)))
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
            "differing keys: {}
rejections: {}
dead writers: {:?}",
            diffs.join("\n  "),
            rejected.join(" "),
            dead_writers
        );
        let detail = eps
            .iter()
            .filter_map(|e| {
                e.node.as_ref().map(|x| {
                    format!(
                        "node {}: {} keys, digest {}, gaps {:?}",
                        e.id,
                        x.memtable.len(),
                        x.memtable.digest().short(),
                        x.core().orderer().gaps()
                    )
                })
            })
            .collect::<Vec<_>>()
            .join("; ");
        return Err(Violation::NoConvergence { seed, settle_ms: cfg.settle_ms, detail });
    }
    // Nothing sealed by a node that never crashed may be missing (and with no crash at all,
    // the memtables equal the last-writer-wins result of every op issued).
    let mut model: HashMap<Vec<u8>, Version> = HashMap::new();
    for (i, ep) in eps.iter().enumerate() {
        if ep.ever_crashed {
            continue;
        }
        for (k, v) in &sealed_by[i] {
            let m = model.entry(k.clone()).or_insert(*v);
            if *v > *m {
                *m = *v;
            }
        }
    }
    // Every op in a record counted durable is in every memtable, whoever crashed.
    let mut durable_model: HashMap<Vec<u8>, Version> = HashMap::new();
    for (w, next) in &reported {
        report.durable_records += next;
        for seq in 0..*next {
            for (k, v) in honest.get(&(*w, seq)).map(|(_, ops)| &ops[..]).unwrap_or(&[]) {
                let m = durable_model.entry(k.clone()).or_insert(*v);
                if *v > *m {
                    *m = *v;
                }
            }
        }
    }
    for ep in eps.iter() {
        let Some(node) = &ep.node else { continue };
        for (k, v) in &durable_model {
            let held = node.memtable.entry(k).map(|e| e.version);
            if held.is_none_or(|h| h < *v) {
                return Err(Violation::DurableLost { seed, node: ep.id, key: show(k), held, expected: *v });
            }
        }
    }
    report.records_lost_on_crash = slots.iter().map(|s| s.disk.lost_on_crash).sum();
    report.torn_writes = slots.iter().map(|s| s.disk.torn_writes).sum();
    for ep in eps.iter() {
        let Some(node) = &ep.node else { continue };
        for (k, v) in &model {
            let held = node.memtable.entry(k).map(|e| e.version);
            if held.is_none_or(|h| h < *v) {
                return Err(Violation::Lost { seed, node: ep.id, key: show(k), held, expected: *v });
            }
        }
    }
    if let Some((w, _)) = report.revoked {
        for ep in eps.iter() {
            if ep.node.as_ref().is_some_and(|x| x.engine.verifier().revocations().is_empty()) {
                return Err(Violation::RevocationNotLearnt { seed, who: format!("node {}", ep.id), writer: w });
            }
        }
        for (i, slot) in slots.iter().enumerate() {
            if slot.server.as_ref().is_some_and(|x| x.verifier().revocations().is_empty()) {
                return Err(Violation::RevocationNotLearnt { seed, who: format!("server {i}"), writer: w });
            }
        }
    }
    let mut all_metrics = retired_metrics;
    all_metrics.extend(eps.iter().filter_map(|e| e.node.as_ref().map(|n| n.metrics.clone())));
    for r in RejectReason::ALL {
        let c: u64 = all_metrics.iter().map(|m| m.rejected(r)).sum();
        if c > 0 {
            report.rejected.insert(r.name(), c);
        }
    }
    report.records_written = all_metrics.iter().map(|m| psl_scl::Metrics::get(&m.records_written)).sum();
    report.epochs =
        eps.iter().filter_map(|e| e.node.as_ref()).map(|x| x.core().epoch() & 0xffff_ffff).max().unwrap_or(0);
    report.net = net.stats;
    Ok(report)
}

/// A node crashes (or is RESET): its writers die with it, and it restarts empty at `restart_at`
/// under a new incarnation.
fn take_down(
    ep: &mut Endpoint,
    node: &SimNode,
    restart_at: u64,
    dead_writers: &mut std::collections::BTreeSet<u32>,
    retired_metrics: &mut Vec<std::sync::Arc<psl_scl::Metrics>>,
    report: &mut SimReport,
) {
    dead_writers.extend(node.authors.iter().map(|a| a.writer()));
    retired_metrics.push(node.metrics.clone());
    ep.restart_at = Some(restart_at);
    ep.ever_crashed = true;
    ep.last.clear();
    report.crashes += 1;
}

fn show(k: &[u8]) -> String {
    String::from_utf8_lossy(k).into_owned()
}
