//! One simulated node: the node's [`NodeEngine`] (the same one `psl-node`'s core thread runs)
//! with its data writers inline, in place of the writer actors' threads.

use psl_capsule::{Action, Author, Body, KeyStatement, Record, SignedMetadata};
use psl_crypto::AppKey;
use psl_scl::engine::asks::{Answer, Answered, Asks};
use psl_scl::engine::queue::{SealPolicy, SealStep, Taken, WriterQueue};
use psl_scl::engine::{writer, CoordinatorLog};
use psl_scl::memtable::key_shard;
use psl_scl::window::{FlowOptions, Window};
use psl_scl::{
    Command, CoordinatorConfig, CoordinatorSm, LamportClock, Memtable, Metrics, NodeConfig, NodeCore, NodeEngine,
    Output, Version,
};
use std::sync::{Arc, Mutex};

/// One simulated node (a worker node with data writers, or a coordinator with none): the real
/// engine, its memtable, clock and metrics, and its writers run inline.
pub struct SimNode {
    /// The node's id, which its data writers' indices are made from (in a [`crate::cluster`],
    /// worker nodes count from 1 and coordinators from 1000).
    pub id: u32,
    /// Which life of the node this is: 0 at start, one more at each restart (its writers'
    /// indices differ per incarnation, so a restarted node never reuses a chain).
    pub incarnation: u32,
    /// The product's node engine (protocol core, verifier, coordinator writer), as
    /// `psl-node`'s core thread runs it.
    pub engine: NodeEngine,
    /// The node's key-value view, which the checkers read.
    pub memtable: Arc<Memtable>,
    /// The node's Lamport clock, which stamps local writes.
    pub clock: Arc<LamportClock>,
    /// The node's counters (records written, rejections by reason), summed into the report.
    pub metrics: Arc<Metrics>,
    /// The data writers (the runtime's writer actors).
    pub authors: Vec<Author>,
    /// Per data writer (same index as `authors`), its queue of ops written locally and not yet
    /// sealed, with the seal policy the runtime's writer actors follow
    /// (`psl_scl::engine::queue`).
    pub queues: Vec<WriterQueue>,
    /// No puts before this time (a restarted node catching up first).
    pub quiet_until: u64,
    /// Whether the data writers have introduced themselves (a certified capsule: their own
    /// Cert records, as each writer actor does when it starts).
    introduced: bool,
    /// Reads waiting for CapsuleDB (the runtime's table); the simulator answers each at once.
    asks: Asks,
    /// The last request id this node gave a CapsuleDB read.
    next_ask: u64,
}

/// Something a node produced that the run loop must act on.
pub enum Effect {
    /// Bytes to publish on the network (an encoded `psl_scl::Msg`).
    Publish(Vec<u8>),
    /// A data op sealed into a record: (key, version, value).
    Sealed(Vec<u8>, Version, Option<Vec<u8>>),
    /// A record this node wrote: (writer, seq, hash, the data ops in it as (key, version)).
    Wrote(u32, u64, psl_crypto::Hash256, Vec<(Vec<u8>, Version)>),
    /// A report from the node's core (an equivocation, a withholding writer, ...); an
    /// equivocation report fails the run.
    Note(Output),
}

/// How to make a [`SimNode`].
pub struct NodeSpec<'a> {
    /// The node's id, from 1 to 2^15 - 2 for a node with data writers (it goes into their
    /// writer indices).
    pub id: u32,
    /// Its incarnation (below 2^12 with data writers): 0 at start, one more at each restart.
    pub incarnation: u32,
    /// The capsule's signed metadata (its policy, limits and writer key scheme).
    pub meta: &'a SignedMetadata,
    /// The application key from which the writers' keys (and certificates) come.
    pub app: &'a AppKey,
    /// Data writers (0 for a coordinator).
    pub writers: usize,
    /// The coordinator it runs: its rank and configuration.
    pub coordinator: Option<(u8, CoordinatorConfig)>,
    /// Seeds the record salts.
    pub seed: u64,
    /// Simulated time of creation in ms (starts the coordinator's state machine).
    pub now: u64,
    /// Most ops in one record: a writer with this many queued seals at once.
    pub batch_ops_max: usize,
    /// How long a writer's batch that is not full waits for more ops (ms).
    pub flush_ms: u64,
    /// The core's configuration (`servers`, the repair cache's bounds, `rejoin_ms`).
    pub config: NodeConfig,
    /// The coordinator's own-chain log (a coordinator that restarts with its writer index).
    pub log: Option<SimLog>,
}

impl NodeSpec<'_> {
    /// The core's default configuration with `servers` capsule servers.
    pub fn config(servers: u32) -> NodeConfig {
        NodeConfig { servers, ..NodeConfig::default() }
    }
}

/// A coordinator's own-chain log in memory: clones share the records, so what was logged
/// survives the simulated crash of the node that logged it (the runtime's fsync'd chain log).
#[derive(Clone, Default)]
pub struct SimLog {
    records: Arc<Mutex<Vec<Record>>>,
}

impl SimLog {
    /// Every record logged, in order.
    pub fn records(&self) -> Vec<Record> {
        self.records.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

impl CoordinatorLog for SimLog {
    fn append(&mut self, rec: &Record) -> Result<(), String> {
        self.records.lock().map_err(|_| "poisoned".to_string())?.push(rec.clone());
        Ok(())
    }
}

impl SimNode {
    /// A fresh node as `spec` describes it: empty memtable, clock at 0, its writers' (and
    /// coordinator's) chains starting at seq 0.
    pub fn new(spec: NodeSpec<'_>) -> SimNode {
        let NodeSpec {
            id,
            incarnation,
            meta,
            app,
            writers,
            coordinator,
            seed,
            now,
            batch_ops_max,
            flush_ms,
            config,
            log,
        } = spec;
        let verifier = Arc::new(psl_capsule::Verifier::new(meta.clone(), Some(app.data_key())));
        let memtable = Arc::new(Memtable::new());
        let clock = Arc::new(LamportClock::new(0));
        let metrics = Arc::new(Metrics::default());
        let authors: Vec<Author> = (0..writers as u32)
            .map(|a| {
                let w = psl_scl::writer_index(id, incarnation, a).expect("simulated ids are small");
                Author::new(meta, app, w).expect("valid writer").with_salt_seed(seed ^ ((w as u64) << 20))
            })
            .collect();
        let coord = coordinator.map(|(rank, cfg)| {
            let w = meta.meta.policy.coordinator_at(rank).expect("rank within the policy");
            let author = Author::new(meta, app, w).expect("valid writer").with_salt_seed(seed ^ 0xC0DE ^ w as u64);
            (w, author, CoordinatorSm::new(cfg, now))
        });
        let (core_coord, coord_author) = match coord {
            Some((w, a, sm)) => (Some((w, sm)), Some(a)),
            None => (None, None),
        };
        let own_certs: Vec<KeyStatement> = authors
            .iter()
            .chain(coord_author.iter())
            .filter_map(|a| a.cert().cloned().map(KeyStatement::Cert))
            .collect();
        let mut core = NodeCore::new(
            verifier,
            memtable.clone(),
            clock.clone(),
            metrics.clone(),
            authors.iter().map(|a| a.writer()),
            core_coord,
            config,
        );
        core.set_announcements(own_certs);
        let log = log.map(|l| Box::new(l) as Box<dyn CoordinatorLog>);
        SimNode {
            id,
            incarnation,
            engine: NodeEngine::new(core, coord_author.map(|a| (a, log)), false),
            memtable,
            clock,
            metrics,
            queues: authors.iter().map(|a| sim_queue(a.writer(), meta, batch_ops_max, flush_ms)).collect(),
            authors,
            quiet_until: 0,
            introduced: false,
            asks: Asks::new(),
            next_ask: 0,
        }
    }

    /// A restarted coordinator takes its own chain back from its log, as the runtime does at
    /// start (`restore_own_chain` in `psl-node`): each record applied as if received, then the
    /// rejoin period lasts until its chain is back through the newest seq it signed.
    pub fn restore_own_chain(&mut self, records: Vec<Record>, now: u64, fx: &mut Vec<Effect>) {
        let mut newest = None;
        for rec in records {
            newest = Some(rec.header().seq);
            // A record that waits for a certificate or does not verify here still counts.
            let _ = self.engine.restore_own(rec);
        }
        if let Some(seq) = newest {
            self.engine.core_mut().hold_rejoin_until(seq);
        }
        self.commands(now, fx);
    }

    /// A read of `key` that went to CapsuleDB, and CapsuleDB's answer `found` (its newest
    /// version and value: another node's, with its original version): asked and taken in
    /// through the engine's table as the runtime's reads are ([`Asks`]: the clock passes the
    /// answer's version before the memtable shows it). Returns what the reader is answered.
    pub fn read_through(&mut self, key: &[u8], found: Answered) -> Option<Answered> {
        self.next_ask += 1;
        let req = self.next_ask;
        self.asks.ask(req, key).ok()?;
        let taken = match self.asks.answer(&[req], key, found, 0, &self.memtable, &self.clock) {
            Answer::Settled(_) => self.asks.take(req),
            Answer::NotAsked | Answer::Stale => None,
        };
        self.asks.forget(req);
        taken
    }

    /// The protocol core inside the engine (epochs, the orderer, durability).
    pub fn core(&self) -> &NodeCore {
        self.engine.core()
    }

    /// The coordinator writer's index, while it runs here.
    pub fn coordinator_writer(&self) -> Option<u32> {
        self.engine.coordinator_writer()
    }

    /// A statement from the leader (a revocation): installed and announced, and, on a
    /// coordinator, carried into the log in a Cert record, as the runtime's core does.
    pub fn announce(&mut self, s: KeyStatement, now: u64, fx: &mut Vec<Effect>) {
        if let Err(e) = self.engine.statements(vec![s], now) {
            panic!("node {}: the leader's statement was refused: {e}", self.id);
        }
        self.commands(now, fx);
    }

    /// Each fresh writer's first record is its own certificate (a certified capsule).
    fn introduce(&mut self, now: u64, fx: &mut Vec<Effect>) {
        if self.introduced {
            return;
        }
        self.introduced = true;
        for i in 0..self.authors.len() {
            if let Some(sealed) = writer::introduction(&mut self.authors[i], &self.clock) {
                let (rec, body) = sealed.expect("a Cert record fits");
                self.local_record(rec, Some(body), 0, now, fx);
            }
        }
    }

    /// A local put (`Some`) or delete (`None`): visible locally at once, sealed later. Returns
    /// the version it was given (`None`: this node has no data writers).
    pub fn put(&mut self, key: Vec<u8>, value: Option<Vec<u8>>, now: u64, fx: &mut Vec<Effect>) -> Option<Version> {
        if self.authors.is_empty() {
            return None;
        }
        let shard = key_shard(&key, self.authors.len());
        // The runtime's client write: stamped (it supersedes every version of the key this node
        // shows; single-threaded, the second tick always passes what the first missed),
        // applied and queued by the writer's queue.
        let (version, _wake) = self.queues[shard]
            .write(&self.memtable, &self.clock, &key, value.as_deref(), u64::MAX)
            .expect("a simulated write supersedes what its node shows");
        // A full batch seals at once, as it wakes the runtime's writer.
        self.seal_due_one(shard, now, fx);
        Some(version)
    }

    /// Each writer seals what its queue's seal policy says is due at `now` (a full batch, or
    /// one whose flush delay has passed); a fresh certified writer first introduces itself
    /// with its Cert record. The run loop calls this every simulated millisecond.
    pub fn seal_due(&mut self, now: u64, fx: &mut Vec<Effect>) {
        self.introduce(now, fx);
        for i in 0..self.authors.len() {
            self.seal_due_one(i, now, fx);
        }
    }

    fn seal_due_one(&mut self, i: usize, now: u64, fx: &mut Vec<Effect>) {
        while let SealStep::Seal { ops } = self.queues[i].seal_step(now * 1_000, false) {
            let taken = self.queues[i].take(ops);
            self.seal(i, taken, now, fx);
        }
    }

    /// Every writer seals everything queued (before an EOE), whatever its policy says.
    pub fn flush(&mut self, now: u64, fx: &mut Vec<Effect>) {
        self.introduce(now, fx);
        for i in 0..self.authors.len() {
            while let Some(taken) = self.queues[i].take_batch_now(now * 1_000) {
                self.seal(i, taken, now, fx);
            }
        }
    }

    fn seal(&mut self, i: usize, taken: Taken, now: u64, fx: &mut Vec<Effect>) {
        let writer = self.authors[i].writer();
        let mut applied = Vec::with_capacity(taken.ops.len());
        for op in &taken.ops {
            applied.push((op.key.clone(), Version { lamport: op.lamport, writer }));
            let v = match &op.action {
                Action::Put(x) => Some(x.clone()),
                Action::Delete => None,
            };
            fx.push(Effect::Sealed(op.key.clone(), Version { lamport: op.lamport, writer }, v));
        }
        let n = taken.ops.len();
        let rec = writer::seal_batch(&mut self.authors[i], self.queues[i].window(), taken)
            .expect("simulated ops fit the limits");
        fx.push(Effect::Wrote(writer, rec.header().seq, rec.hash(), applied));
        self.local_record(rec, None, n, now, fx);
    }

    /// An own record of a data writer into the engine (`body` for non-data records).
    fn local_record(
        &mut self,
        rec: psl_capsule::Record,
        body: Option<Body>,
        ops: usize,
        now: u64,
        fx: &mut Vec<Effect>,
    ) {
        if body.is_some() {
            fx.push(Effect::Wrote(rec.header().writer, rec.header().seq, rec.hash(), Vec::new()));
        }
        self.engine.on_local(rec, body.as_ref(), ops, now);
        self.commands(now, fx);
    }

    /// Carries out the engine's commands: the data writers' duties inline, the rest as effects
    /// for the run loop.
    fn commands(&mut self, now: u64, fx: &mut Vec<Effect>) {
        while let Some(c) = self.engine.next_command() {
            match c {
                Command::Publish(b) => fx.push(Effect::Publish(b)),
                Command::Verify(rec) => self.engine.verify_now(rec, now),
                Command::EnterEpoch { sync, epoch } => {
                    for a in self.authors.iter_mut() {
                        a.enter_epoch(sync, epoch);
                    }
                }
                Command::WriteEoe { epoch, heads } => {
                    self.flush(now, fx);
                    for i in 0..self.authors.len() {
                        // The first writer carries the node's view of every other writer's head.
                        let links = if i == 0 { heads.clone() } else { Vec::new() };
                        let (rec, body) =
                            writer::end_of_epoch(&mut self.authors[i], &self.clock, self.clock.tick(), epoch, links)
                                .expect("control record fits");
                        self.local_record(rec, Some(body), 0, now, fx);
                    }
                }
                Command::Signed { writer, seq, hash } => fx.push(Effect::Wrote(writer, seq, hash, Vec::new())),
                Command::Report(o) => fx.push(Effect::Note(o)),
                // The simulator waits on no barrier and paces no window (its writers seal at
                // once): the engine has nothing to answer or wake here.
                Command::SyncAnswer { .. } | Command::DurableAnswer { .. } | Command::WakeWriter { .. } => {}
            }
        }
    }

    /// A message from the network.
    pub fn receive(&mut self, bytes: &[u8], now: u64, fx: &mut Vec<Effect>) {
        self.engine.on_bytes(bytes, now);
        self.commands(now, fx);
    }

    /// The periodic tick: the engine's timers (epochs, repair, announcements, durability).
    pub fn tick(&mut self, now: u64, fx: &mut Vec<Effect>) {
        self.engine.on_tick(now);
        self.commands(now, fx);
    }
}

/// A simulated writer's queue: the runtime's seal policy with the capsule's record limit, and a
/// flow window that is off (the simulator paces no writer: its servers' acks only count toward
/// durability).
fn sim_queue(writer: u32, meta: &SignedMetadata, batch_ops_max: usize, flush_ms: u64) -> WriterQueue {
    let limits = meta.meta.policy.limits;
    let policy = SealPolicy {
        batch_ops_max: batch_ops_max.clamp(1, limits.ops_per_record_max as usize),
        batch_bytes_max: (limits.record_bytes_max as usize).saturating_sub(64 * 1024).max(1),
        flush_delay_us: flush_ms * 1_000,
        seal_interval_us: 0,
    };
    let off = FlowOptions { window_ops: 0, ..FlowOptions::default() };
    WriterQueue::new(writer, usize::MAX, policy, Arc::new(Window::new(off)))
}
