//! [`Node`]: starts the threads, offers the KV API.

use crate::actor::{Actor, ActorCtl, ActorQueue};
use crate::core::{Core, CoreMsg, RotationState};
use crate::host::HostStats;
use crate::mono::{at_mono_ms, mono_ms};
use crate::options::NodeOptions;
use crossbeam_channel::{bounded, Sender};
use psl_capsule::{
    writer_credentials, Author, KeyStatement, Limits, Op, Record, RotationCert, SignedMetadata, Verifier, WriterKeys,
};
use psl_crypto::{AppKey, DataKey, Hash256, SigningKey};
use psl_fabric::Fabric;
use psl_scl::engine::asks::{ask_step, AskStep};
use psl_scl::engine::queue::SealPolicy;
use psl_scl::engine::write::{Admission, StampError};
use psl_scl::memtable::key_shard;
use psl_scl::{CoordinatorSm, LamportClock, Memtable, Metrics, Msg, NodeCore, NodeEngine, RejectReason, Version};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Why a [`Node`] call (or starting a node) failed.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// A write's key is longer than the capsule's key limit.
    #[error("key is {len} bytes, over the limit of {max}")]
    KeyTooLong {
        /// The key's length, in bytes.
        len: usize,
        /// The capsule's limit ([`Limits::key_bytes_max`]), in bytes.
        max: u32,
    },
    /// A write's key is empty.
    #[error("key is empty")]
    EmptyKey,
    /// A put's value is larger than the capsule's value limit.
    #[error("value is {len} bytes, over the limit of {max}")]
    ValueTooLarge {
        /// The value's length, in bytes.
        len: usize,
        /// The capsule's limit ([`Limits::value_bytes_max`]), in bytes.
        max: u32,
    },
    /// The writer's op queue stayed full for the whole `put_timeout` (carried here).
    #[error("writer queue stayed full for {0:?} (the network or the writers are too slow)")]
    Backpressure(Duration),
    /// A write on a node with no writer actors.
    #[error("this node has no writers (it is receive-only)")]
    ReadOnly,
    /// `sync` found no applied SYNC covering this node's writes within the timeout (carried).
    #[error("sync() did not complete within {0:?}: no SYNC covering this node's writes was applied (is a coordinator running and reachable?)")]
    SyncTimeout(Duration),
    /// A durability wait on a node configured with no capsule servers.
    #[error("no capsule servers are configured (NodeConfig::servers is 0): nothing can be made durable")]
    NoServers,
    /// A durability wait ended before a quorum of capsule servers acked every earlier write.
    #[error("sync_durable() did not complete within {timeout:?}: only {acked_by} of the {servers} capsule servers acked every earlier write of this node; {quorum} must (are the servers running and reachable?)")]
    DurableTimeout {
        /// How long the call waited.
        timeout: Duration,
        /// How many servers had acked every earlier write when it gave up.
        acked_by: usize,
        /// How many must (f + 1).
        quorum: usize,
        /// How many capsule servers there are (2f + 1).
        servers: u32,
    },
    /// The node is shutting down (or its core thread is gone): the call could not be served.
    #[error("the node is shutting down")]
    Stopped,
    /// A read on a coordinator-only node, which keeps record hashes but no values.
    #[error(
        "this node keeps no values (a coordinator: it orders records and keeps their hashes only); read from a node"
    )]
    NoValues,
    /// A get or scan the memtable could not answer got no verified CapsuleDB answer within
    /// `db_get_timeout` (carried).
    #[error("CapsuleDB did not answer a read within {0:?} (is `psl capsuledb` running on this fabric?)")]
    CapsuleDbTimeout(Duration),
    /// A read the memtable could not answer found the most reads already waiting for
    /// CapsuleDB (`psl_scl::engine::asks::ASKS_MAX`): refused at once, nothing was sent.
    #[error("CapsuleDB read: {0}")]
    CapsuleDbBusy(#[from] psl_scl::engine::asks::AsksFull),
    /// The node's keys or certificates are missing or do not fit the capsule, or a statement
    /// was refused; the string says which.
    #[error("keys: {0}")]
    Keys(String),
    /// Installing an application key rotation failed; the string says why.
    #[error("key rotation: {0}")]
    Rotation(String),
    /// A node thread could not be started.
    #[error("starting a thread: {0}")]
    Spawn(#[from] std::io::Error),
    /// The coordinator's own-chain log could not be opened or written.
    #[error("coordinator state: {0}")]
    State(#[from] crate::chainlog::ChainLogError),
    /// A record in the coordinator's own-chain log is unusable at restart.
    #[error("coordinator state: record {index} of the {count} in its own-chain log: {what} (refusing to guess the newest seq it signed)")]
    StateRecord {
        /// The record's position in the log (0-based).
        index: usize,
        /// How many records the log holds.
        count: usize,
        /// What is wrong with it.
        what: String,
    },
    /// A fenced write ([`Node::write_below`]) would have got a Lamport time at or above the fence.
    #[error("the write would get Lamport time {lamport}, not below the caller's fence {below}: nothing was written")]
    Fenced {
        /// The Lamport time the write took.
        lamport: u64,
        /// The caller's fence.
        below: u64,
    },
    /// An atomic batch that does not fit one record (too many ops, or too many bytes).
    #[error("an atomic batch of {ops} ops and {bytes} bytes does not fit one record (at most {ops_max} ops and {bytes_max} bytes)")]
    BatchTooLarge {
        /// The batch's op count.
        ops: usize,
        /// The batch's encoded size, in bytes.
        bytes: usize,
        /// The most ops one record carries here.
        ops_max: usize,
        /// The most encoded op bytes one record carries here.
        bytes_max: usize,
    },
    /// A fenced write kept being overtaken by newer writes of the same key from other writers.
    #[error("other writers kept writing this key newer than each of {tries} Lamport times this write took: nothing was written; retry")]
    Superseded {
        /// How many Lamport times the write took before giving up.
        tries: u32,
    },
}

fn stamp_error(e: StampError) -> NodeError {
    match e {
        StampError::Fenced { lamport, below } => NodeError::Fenced { lamport, below },
        StampError::Superseded { tries } => NodeError::Superseded { tries },
    }
}

/// Where a role's keys come from: the capsule's data key and, for each writer the role runs,
/// its signing key and (certified capsule) certificate. The application key is one source
/// (it derives any writer: the development path, `--owner`); a set of keys handed to the role
/// (the leader's grant to an attested KV role, which holds only its own writers) is another.
/// What runs after loading works from either.
pub trait KeySource {
    /// The capsule's data key.
    fn data_key(&self) -> DataKey;
    /// Writer `w`'s signing key and, in a certified capsule, its certificate; an error if
    /// this source holds no key for `w`.
    fn writer_credentials(
        &self,
        meta: &SignedMetadata,
        w: u32,
    ) -> Result<(SigningKey, Option<psl_capsule::WriterCert>), NodeError>;

    /// Writer `w` at the start of its chain (with its certificate in a certified capsule).
    fn author(&self, meta: &SignedMetadata, w: u32) -> Result<Author, NodeError> {
        let (key, cert) = self.writer_credentials(meta, w)?;
        let certs: Vec<KeyStatement> = cert.into_iter().map(KeyStatement::Cert).collect();
        make_author(meta, &self.data_key(), &certs, key, w)
    }
}

impl KeySource for AppKey {
    fn data_key(&self) -> DataKey {
        AppKey::data_key(self)
    }

    fn writer_credentials(
        &self,
        meta: &SignedMetadata,
        w: u32,
    ) -> Result<(SigningKey, Option<psl_capsule::WriterCert>), NodeError> {
        writer_credentials(meta, self, w).map_err(|e| NodeError::Keys(format!("writer {w}: {e}")))
    }
}

/// The keys a node works with: the capsule's public metadata, the data key, one signing key
/// per writer actor, and the coordinator's key if it runs one: derived from the application
/// key ([`NodeKeys::derive`]), or taken from the keys a role was handed
/// ([`NodeKeys::from_source`]).
pub struct NodeKeys {
    /// The capsule's signed metadata (its name, policy and owner key).
    pub meta: SignedMetadata,
    /// The capsule's data key, which seals and opens record payloads.
    pub data_key: DataKey,
    /// `(writer index, signing key)` of each writer actor, in actor order.
    pub writers: Vec<(u32, SigningKey)>,
    /// `(writer index, signing key)` of the coordinator this node runs, if any.
    pub coordinator: Option<(u32, SigningKey)>,
    /// In a capsule that certifies writers: the certificates of `writers` and `coordinator`
    /// (the node announces them and carries each into its writer's chain), and any other
    /// statements it should know from the start. Empty for a capsule that derives writer keys.
    pub certs: Vec<KeyStatement>,
}

impl NodeKeys {
    /// Derives the keys `opts` calls for from the application key.
    pub fn derive(meta: &SignedMetadata, app: &AppKey, opts: &NodeOptions) -> Result<NodeKeys, NodeError> {
        Self::from_source(meta, app, opts)
    }

    /// The writer indices a node run with `opts` signs with: its writer actors'
    /// (`writer_index(node_id, incarnation, a)` for each actor `a`), then its coordinator
    /// rank's, if it runs one. What a role asks the leader for.
    pub fn writers_for(meta: &SignedMetadata, opts: &NodeOptions) -> Result<Vec<u32>, NodeError> {
        let mut out = Vec::with_capacity(opts.writers + 1);
        for a in 0..opts.writers as u32 {
            let w = psl_scl::writer_index(opts.node_id, opts.incarnation, a).ok_or_else(|| {
                NodeError::Keys(format!(
                    "node id {} / incarnation {} / writer {a} out of range",
                    opts.node_id, opts.incarnation
                ))
            })?;
            out.push(w);
        }
        if let Some(c) = &opts.coordinator {
            let w = meta
                .meta
                .policy
                .coordinator_at(c.rank)
                .ok_or_else(|| NodeError::Keys(format!("the capsule allows no coordinator of rank {}", c.rank)))?;
            out.push(w);
        }
        Ok(out)
    }

    /// The keys `opts` calls for, from `src`.
    pub fn from_source(meta: &SignedMetadata, src: &dyn KeySource, opts: &NodeOptions) -> Result<NodeKeys, NodeError> {
        let wanted = Self::writers_for(meta, opts)?;
        let mut writers = Vec::new();
        let mut coordinator = None;
        let mut certs = Vec::new();
        for (i, w) in wanted.into_iter().enumerate() {
            let (key, cert) = src.writer_credentials(meta, w)?;
            certs.extend(cert.map(KeyStatement::Cert));
            if i < opts.writers {
                writers.push((w, key));
            } else {
                coordinator = Some((w, key));
            }
        }
        Ok(NodeKeys { meta: meta.clone(), data_key: src.data_key(), writers, coordinator, certs })
    }
}

/// A writer's chain state from its key: with its certificate in a certified capsule.
fn make_author(
    meta: &SignedMetadata,
    data_key: &DataKey,
    certs: &[KeyStatement],
    key: SigningKey,
    w: u32,
) -> Result<Author, NodeError> {
    let r = match meta.meta.policy.writer_keys {
        WriterKeys::Derived => Author::with_keys(meta, key, data_key.clone(), w),
        WriterKeys::Certified => {
            let cert = certs
                .iter()
                .find_map(|s| match s {
                    KeyStatement::Cert(c) if c.writer == w && c.key_gen == 0 => Some(c.clone()),
                    _ => None,
                })
                .ok_or_else(|| NodeError::Keys(format!("writer {w} has no certificate")))?;
            Author::with_certified_keys(meta, key, cert, data_key.clone())
        }
    };
    r.map_err(|e| NodeError::Keys(format!("writer {w}: {e}")))
}

/// An application key rotation for a running node: what the leader hands it, on the attested
/// channel (see `docs/protocol/scl.md` §7a and `docs/protocol/faas.md`).
pub struct NodeRotation {
    /// The owner-signed certificate of the new generation.
    pub cert: RotationCert,
    /// The new generation's data key (`None`: the node learns only the public part).
    pub data_key: Option<DataKey>,
    /// Each writer actor's key under the new generation. Empty, or one for every writer of
    /// the node (a writer left without its key would sign records every peer refuses from
    /// the rotation epoch on).
    pub writers: Vec<(u32, SigningKey)>,
    /// The coordinator writer's key under the new generation (a node running a coordinator).
    /// Until it has it, the coordinator opens no epoch at or after the rotation epoch.
    pub coordinator: Option<SigningKey>,
    /// Install nothing if the rotation epoch has already begun on this node (the leader's
    /// coordinator node: it must learn a rotation before its epoch).
    pub refuse_if_begun: bool,
    /// In a capsule that certifies writers: the new generation's certificates of this node's
    /// writers (installed after the rotation certificate, then announced; a coordinator node
    /// also carries them into the log).
    pub certs: Vec<KeyStatement>,
}

/// A running PSL node: its writer actors, core thread, host thread and fabric endpoint, and
/// the API to write, read, sync and stop it.
pub struct Node {
    verifier: Arc<Verifier>,
    memtable: Arc<Memtable>,
    clock: Arc<LamportClock>,
    metrics: Arc<Metrics>,
    host_stats: Arc<HostStats>,
    /// The node's fabric endpoint, for its counters (messages dropped on full queues).
    fabric: Arc<dyn Fabric>,
    limits: Limits,
    actors: Vec<WriterHandle>,
    api: Sender<CoreMsg>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    put_timeout: Duration,
    servers: u32,
    /// `NodeConfig::keep_values`: off for a coordinator, whose memtable stays empty.
    keep_values: bool,
    db: Option<Arc<crate::dbclient::DbClient>>,
    db_get_timeout: Duration,
    db_get_retry: Duration,
    db_requests: Option<crossbeam_channel::Receiver<psl_scl::dbwire::DbRequest>>,
    /// The CapsuleDB role's applied heads (see [`Node::applied_heads`]).
    applied: Option<Arc<parking_lot::Mutex<Vec<psl_capsule::Link>>>>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Node(writers={:?})", self.writers())
    }
}

impl Node {
    /// Starts a node on `fabric`.
    // Over 100 lines: the wiring of the node's threads (their channels, rings and shared
    // state) in one place; each thread's own setup is a function below.
    pub fn start(mut keys: NodeKeys, fabric: Arc<dyn Fabric>, opts: NodeOptions) -> Result<Node, NodeError> {
        let verifier = Arc::new(Verifier::new(keys.meta.clone(), Some(keys.data_key.clone())));
        // The core's clock: also the time base of records held back for a certificate.
        let start = Instant::now();
        let memtable = Arc::new(Memtable::with_options(opts.memtable_keys_max, opts.capsuledb_role));
        let clock = Arc::new(LamportClock::new(0));
        let metrics = Arc::new(Metrics::default());
        let host_stats = Arc::new(HostStats::default());
        let stop = Arc::new(AtomicBool::new(false));
        let limits = keys.meta.meta.policy.limits;
        let cap = opts.channel_msgs_max.max(16);
        let (local_tx, local_rx) = bounded(cap);
        let (results_tx, results_rx) = bounded::<CoreMsg>(cap);
        let (api_tx, api_rx) = bounded(64);
        let (incoming_tx, incoming_rx) = bounded::<CoreMsg>(cap);
        let (verify_tx, verify_rx) = bounded::<Record>(cap);
        let mut threads = Vec::new();

        // Writer actors.
        let writers = std::mem::take(&mut keys.writers);
        let actors = spawn_writers(&keys, writers, &opts, &local_tx, &clock, &mut threads)?;

        // Verify actors (none: the core thread verifies).
        spawn_verifiers(opts.verifiers, &verifier, &verify_rx, &results_tx, start, &mut threads)?;
        let verify_tx = (opts.verifiers > 0).then_some(verify_tx);
        drop(results_tx);

        // Boundary and host.
        let (core_ring, inbound, host_out, host_in) = crate::ring::split(opts.ring_items, opts.ring_backoff);
        threads.extend(crate::host::spawn(fabric.clone(), host_out, host_in, stop.clone(), host_stats.clone())?);

        // CapsuleDB's miss path (and, for the role, its request queue).
        let db = match opts.capsuledb {
            Some(w) => Some(db_client(w, &verifier, &keys.data_key, &memtable, &clock)?),
            None => None,
        };
        let (db_req_tx, db_requests) = match opts.capsuledb_role {
            Some(_) => {
                let (t, r) = bounded(cap);
                (Some(t), Some(r))
            }
            None => (None, None),
        };

        // Dispatcher: inbound ring -> decoded messages for the core.
        let dispatcher = Dispatcher {
            stop: stop.clone(),
            name: verifier.name(),
            limits,
            incoming: incoming_tx,
            results: local_tx.clone(),
            db: db.clone(),
            db_requests: db_req_tx,
            metrics: metrics.clone(),
        };
        threads.push(std::thread::Builder::new().name("dispatch".into()).spawn(move || dispatcher.run(inbound))?);

        // Core.
        let shared = Shared {
            verifier: verifier.clone(),
            memtable: memtable.clone(),
            clock: clock.clone(),
            metrics: metrics.clone(),
        };
        let engine = start_engine(keys, &opts, shared, actors.iter().map(|(q, _)| q.writer), verify_tx.is_some())?;
        let applied = opts.capsuledb_role.map(|_| Arc::new(parking_lot::Mutex::new(Vec::new())));
        let mut core = Core {
            engine,
            actors: actors.clone(),
            local_rx,
            results_rx,
            api_rx,
            incoming_rx,
            verify_tx,
            ring: core_ring,
            metrics: metrics.clone(),
            tick: opts.tick,
            start,
            applied: applied.clone(),
            replies: Default::default(),
        };
        // What the engine said while the own-chain log was restored (before the thread started).
        core.commands(0);
        threads.push(std::thread::Builder::new().name("core".into()).spawn(move || core.run())?);
        drop(local_tx);

        Ok(Node {
            verifier,
            memtable,
            clock,
            metrics,
            host_stats,
            fabric,
            limits,
            actors,
            api: api_tx,
            stop,
            threads,
            put_timeout: opts.put_timeout,
            servers: opts.core.servers,
            keep_values: opts.core.keep_values,
            db,
            db_get_timeout: opts.db_get_timeout,
            db_get_retry: opts.db_get_retry,
            db_requests,
            applied,
        })
    }

    /// CapsuleDB role: the read requests that reached this node (see
    /// `NodeOptions::capsuledb_role`).
    pub fn db_requests(&self) -> Option<&crossbeam_channel::Receiver<psl_scl::dbwire::DbRequest>> {
        self.db_requests.as_ref()
    }

    /// Multicasts `bytes` as they are (the CapsuleDB role's answers and frontiers).
    pub fn publish(&self, bytes: Vec<u8>) -> Result<(), NodeError> {
        self.api.send_timeout(CoreMsg::Publish(bytes), Duration::from_secs(5)).map_err(|_| NodeError::Stopped)
    }

    /// Publishes an own record sealed outside the writer actors (CapsuleDB's db-block and
    /// db-index records): its writer becomes one of this node's own, so the servers' acks for
    /// it are counted and [`Node::wait_durable`] can wait for them. Records of one writer must
    /// be handed over in chain order; one that does not extend the chain is logged and dropped.
    pub fn publish_own(&self, rec: Record) -> Result<(), NodeError> {
        self.api.send_timeout(CoreMsg::Own(rec), Duration::from_secs(5)).map_err(|_| NodeError::Stopped)
    }

    /// Counters of the CapsuleDB miss path (none without `NodeOptions::capsuledb`).
    pub fn db_stats(&self) -> Option<&crate::DbClientStats> {
        self.db.as_ref().map(|d| &d.stats)
    }

    /// The writer indices of this node's writer actors, in actor order.
    pub fn writers(&self) -> Vec<u32> {
        self.actors.iter().map(|(q, _)| q.writer).collect()
    }

    /// The name of the capsule this node serves.
    pub fn capsule(&self) -> psl_capsule::CapsuleName {
        self.verifier.name()
    }

    /// The capsule's signed metadata (its policy and owner key), as the node verified it.
    pub fn metadata(&self) -> &psl_capsule::SignedMetadata {
        self.verifier.metadata()
    }

    /// The capsule's size limits (keys, values, records) from its policy.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Puts `value` under `key`: visible to local `get` at once, sealed, signed and multicast
    /// within `flush_delay` (or when a batch fills). Blocks while the writer queue is full.
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<(), NodeError> {
        self.write(key, Some(value))
    }

    /// Deletes `key` (writes a tombstone), like [`Node::put`] in every other respect.
    pub fn delete(&self, key: &[u8]) -> Result<(), NodeError> {
        self.write(key, None)
    }

    /// A fenced write: like [`Node::put`] (`Some`) or [`Node::delete`] (`None`), but only if
    /// the op's Lamport time is below `below`; returns the op's version. The check sits
    /// between the clock tick and the memtable apply, under the writer queue's lock, so no op
    /// at or above the fence is ever applied or sealed, however long the caller was paused
    /// before the call (a fence above every time a lease holder may use makes the writes of a
    /// later holder, whose clock was moved past it with [`Node::advance_clock`], newer than
    /// any write of the earlier one: SecureCached's home failover, docs/protocol/memcached.md).
    /// At or above the fence it fails with [`NodeError::Fenced`] and writes nothing (the
    /// clock has ticked).
    pub fn write_below(&self, key: &[u8], value: Option<&[u8]>, below: u64) -> Result<Version, NodeError> {
        self.write_fenced(key, value, below)
    }

    /// Moves this node's Lamport clock up to `to` (never down): every later op of the node
    /// gets a later time, so its versions are newer than any version below `to`.
    pub fn advance_clock(&self, to: u64) {
        self.clock.observe(to);
    }

    fn write(&self, key: &[u8], value: Option<&[u8]>) -> Result<(), NodeError> {
        self.write_fenced(key, value, u64::MAX).map(|_| ())
    }

    /// Writes `ops` (key and value; `None`: a delete) as one atomic batch: applied here as
    /// one, sealed into one record ([`psl_capsule::Body::Atomic`]) that every node applies as
    /// one, so no reader on any node sees some of the ops and not the others. Each op is
    /// still last-writer-wins on its own key, with a Lamport time newer than every version of
    /// it this node shows, in the order given (a key written twice keeps its last op).
    /// `below` fences every op as [`Node::write_below`] does (`u64::MAX`: none). Returns the
    /// ops' versions. The batch must fit one record ([`NodeError::BatchTooLarge`]); on any
    /// error nothing was written.
    pub fn write_batch(&self, ops: &[(&[u8], Option<&[u8]>)], below: u64) -> Result<Vec<Version>, NodeError> {
        for (key, value) in ops {
            self.check_write(key, *value)?;
        }
        let Some((first, _)) = ops.first() else { return Ok(Vec::new()) };
        let (q, _) = &self.actors[key_shard(first, self.actors.len())];
        // Refused before it waits for room: no wait makes it fit.
        let (fits, p) = {
            let st = q.state.lock();
            (st.fits_one_record(ops), st.policy())
        };
        if !fits {
            let bytes = ops.iter().map(|(k, v)| Op::encoded_len_of(k, *v)).sum();
            return Err(NodeError::BatchTooLarge {
                ops: ops.len(),
                bytes,
                ops_max: p.batch_ops_max,
                bytes_max: p.batch_bytes_max,
            });
        }
        let mut st = self.admitted(q)?;
        let versions = st.write_atomic(&self.memtable, &self.clock, ops, below).map_err(stamp_error)?;
        drop(st);
        q.work.notify_one();
        Ok(versions)
    }

    fn check_write(&self, key: &[u8], value: Option<&[u8]>) -> Result<(), NodeError> {
        if key.is_empty() {
            return Err(NodeError::EmptyKey);
        }
        if key.len() > self.limits.key_bytes_max as usize {
            return Err(NodeError::KeyTooLong { len: key.len(), max: self.limits.key_bytes_max });
        }
        if let Some(v) = value {
            if v.len() > self.limits.value_bytes_max as usize {
                return Err(NodeError::ValueTooLarge { len: v.len(), max: self.limits.value_bytes_max });
            }
        }
        if self.actors.is_empty() {
            return Err(NodeError::ReadOnly);
        }
        if self.stop.load(Ordering::Acquire) {
            return Err(NodeError::Stopped);
        }
        Ok(())
    }

    /// [`Node::write_below`] without waiting: `Ok(None)`, and nothing written, when the write
    /// would have to wait for room in its writer's queue or flow window (call `write_below`,
    /// which waits). For callers on a thread that must not block (the HTTPS API's worker).
    pub fn try_write_below(&self, key: &[u8], value: Option<&[u8]>, below: u64) -> Result<Option<Version>, NodeError> {
        self.check_write(key, value)?;
        let (q, _) = &self.actors[key_shard(key, self.actors.len())];
        let mut st = q.state.lock();
        if !st.has_room() {
            return Ok(None);
        }
        let (version, wake) = st.write(&self.memtable, &self.clock, key, value, below).map_err(stamp_error)?;
        drop(st);
        if wake {
            q.work.notify_one();
        }
        Ok(Some(version))
    }

    fn write_fenced(&self, key: &[u8], value: Option<&[u8]>, below: u64) -> Result<Version, NodeError> {
        self.check_write(key, value)?;
        let (q, _) = &self.actors[key_shard(key, self.actors.len())];
        let mut st = self.admitted(q)?;
        let (version, wake) = st.write(&self.memtable, &self.clock, key, value, below).map_err(stamp_error)?;
        drop(st);
        if wake {
            q.work.notify_one();
        }
        Ok(version)
    }

    /// The writer queue `q`'s lock, once a write may go: a client write is an event into its
    /// writer's queue (`psl_scl::engine::queue`), which decides whether it goes, stamps it and
    /// says whether it wakes the writer; this thread only waits and wakes as it says.
    fn admitted<'q>(
        &self,
        q: &'q ActorQueue,
    ) -> Result<parking_lot::MutexGuard<'q, psl_scl::engine::queue::WriterQueue>, NodeError> {
        let mut st = q.state.lock();
        if !st.has_room() {
            let deadline = Instant::now() + self.put_timeout;
            let deadline_ms = mono_ms(deadline);
            let mut waited_for_acks = false;
            loop {
                let now = Instant::now();
                match st.admit(mono_ms(now), deadline_ms) {
                    Admission::Go { opened } => {
                        if opened {
                            Metrics::add(&self.metrics.flow_opened, 1);
                            tracing::warn!(
                                writer = q.writer,
                                stall_ms = q.flow.stall.as_millis() as u64,
                                "no quorum of capsule servers acked this writer's records while it waited: \
                                 writes go on without flow control until their acks move again"
                            );
                        }
                        break;
                    }
                    Admission::WaitForSpace => {
                        q.space.wait_until(&mut st, deadline);
                    }
                    Admission::WaitForAcks { until_ms } => {
                        if !waited_for_acks {
                            waited_for_acks = true;
                            Metrics::add(&self.metrics.flow_waits, 1);
                        }
                        let wait = Duration::from_millis(until_ms.saturating_sub(mono_ms(now)).max(1));
                        q.space.wait_until(&mut st, (now + wait).min(deadline));
                    }
                    Admission::Backpressure => return Err(NodeError::Backpressure(self.put_timeout)),
                }
            }
        }
        Ok(st)
    }

    /// Reads `key`: from the memtable, or, when it cannot answer and CapsuleDB is configured
    /// (`NodeOptions::capsuledb`), from CapsuleDB over the fabric (see [`Node::try_get`]). A
    /// CapsuleDB read that fails is logged and reads as absent; use `try_get` to see the error.
    pub fn get(&self, key: &[u8]) -> Option<Arc<[u8]>> {
        match self.try_get(key) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!("get: {e}");
                None
            }
        }
    }

    /// Reads `key`. The memtable answers if it can; otherwise (key evicted or never seen here,
    /// and CapsuleDB configured) a sealed request goes to CapsuleDB, re-sent every
    /// `db_get_retry`, and the call blocks until the signed answer arrives (the memtable
    /// learns it, with its original version) or `db_get_timeout` passes.
    pub fn try_get(&self, key: &[u8]) -> Result<Option<Arc<[u8]>>, NodeError> {
        if let psl_scl::Lookup::Value(v) = self.memtable.lookup(key) {
            return Ok(Some(v));
        }
        Ok(self.try_entry(key)?.and_then(|e| e.value))
    }

    /// Like [`Node::try_get`], but returns the entry with its version `(lamport, writer)`
    /// (a tombstone has no value): the version CapsuleDB answered with is the original one, so
    /// anything derived from it (SecureCached's CAS uniques) is the same before and after an
    /// eviction. `None`: never written (as far as this node and CapsuleDB know).
    pub fn try_entry(&self, key: &[u8]) -> Result<Option<psl_scl::Entry>, NodeError> {
        if !self.keep_values {
            return Err(NodeError::NoValues);
        }
        let db = match (self.memtable.lookup_entry(key), &self.db) {
            (Some(e), _) => return Ok(Some(e)),
            (None, None) => return Ok(None),
            (None, Some(db)) => db.clone(),
        };
        if key.is_empty() || key.len() > self.limits.key_bytes_max as usize {
            return Ok(None);
        }
        // The engine's policy decides when to wait, ask again or give up (`ask_step`); this
        // thread only waits.
        let deadline_ms = mono_ms(Instant::now() + self.db_get_timeout);
        let retry_ms = self.db_get_retry.as_millis() as u64;
        loop {
            let (req, bytes) = db.request(key)?;
            self.publish(bytes)?;
            let sent_ms = mono_ms(Instant::now());
            loop {
                let seen = db.settled();
                if let Some(a) = db.take_answer(req) {
                    // The memtable has learned the answer (or something newer): prefer it.
                    return Ok(self
                        .memtable
                        .lookup_entry(key)
                        .or_else(|| a.map(|(version, value)| psl_scl::Entry { version, value })));
                }
                if !db.is_pending(req) {
                    // Answered under another request id of ours, or refused as stale: look again.
                    break;
                }
                match ask_step(mono_ms(Instant::now()), sent_ms, retry_ms, deadline_ms) {
                    AskStep::WaitUntil(t) => {
                        db.wait(seen, at_mono_ms(t));
                    }
                    AskStep::AskAgain | AskStep::GiveUp => break,
                }
                if self.stop.load(Ordering::Acquire) {
                    db.forget(req);
                    return Err(NodeError::Stopped);
                }
            }
            db.forget(req);
            if let Some(e) = self.memtable.lookup_entry(key) {
                return Ok(Some(e));
            }
            if ask_step(mono_ms(Instant::now()), sent_ms, retry_ms, deadline_ms) == AskStep::GiveUp {
                db.stats.timeouts.fetch_add(1, Ordering::Relaxed);
                return Err(NodeError::CapsuleDbTimeout(self.db_get_timeout));
            }
        }
    }

    /// The node's view of the keys starting with `prefix` and above `after`: the first `limit`
    /// live entries (at most [`psl_scl::dbwire::SCAN_LIMIT_MAX`]) in key order, with their
    /// versions. Without CapsuleDB the memtable is the whole view. With it (a bounded memtable
    /// may have evicted keys), CapsuleDB is asked for the same range, sealed and signed as a
    /// get is, and each key's newest version wins; an answer older than what this node
    /// evicted under is asked again. Tombstones on either side hide older values; a range
    /// whose first keys are all deleted is walked on, bounded by `db_get_timeout`.
    pub fn scan(
        &self,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, psl_scl::Entry)>, NodeError> {
        let limit = limit.min(psl_scl::dbwire::SCAN_LIMIT_MAX);
        let mut out = Vec::new();
        if limit == 0 || prefix.len() > self.limits.key_bytes_max as usize {
            return Ok(out);
        }
        let deadline = Instant::now() + self.db_get_timeout;
        let mut after: Option<Vec<u8>> = after.map(<[u8]>::to_vec);
        loop {
            let want = limit - out.len();
            let (mem, mem_more) = self.memtable.scan(prefix, after.as_deref(), want);
            let Some(db) = self.db.clone() else {
                // Nothing was evicted, so nothing is unsure: the memtable is the view.
                out.extend(mem.into_iter().filter(|e| e.entry.value.is_some()).map(|e| (e.key, e.entry)));
                return Ok(out);
            };
            let q = psl_scl::dbwire::ScanQuery { prefix: prefix.to_vec(), after: after.clone(), limit: want as u16 };
            let body = self.db_scan(&db, &q, deadline)?;
            // Keys up to the smaller of the two sides' last keys (where a side stopped early)
            // are complete on both.
            let mut bound: Option<Vec<u8>> = None;
            let mut lower = |k: &[u8]| {
                if bound.as_deref().is_none_or(|b| k < b) {
                    bound = Some(k.to_vec());
                }
            };
            if mem_more {
                if let Some(e) = mem.last() {
                    lower(&e.key);
                }
            }
            if body.more {
                if let Some(e) = body.entries.last() {
                    lower(&e.0);
                }
            }
            let mut merged: std::collections::BTreeMap<Vec<u8>, psl_scl::Entry> =
                mem.into_iter().map(|e| (e.key, e.entry)).collect();
            for (k, version, value) in body.entries {
                let newer = merged.get(&k).is_none_or(|e| version > e.version);
                if newer {
                    merged.insert(k, psl_scl::Entry { version, value: value.map(Arc::from) });
                }
            }
            for (k, e) in merged {
                if bound.as_ref().is_some_and(|b| k > *b) {
                    break;
                }
                if e.value.is_some() {
                    out.push((k, e));
                    if out.len() == limit {
                        return Ok(out);
                    }
                }
            }
            match bound {
                None => return Ok(out),
                Some(b) => after = Some(b),
            }
            if Instant::now() >= deadline {
                return Err(NodeError::CapsuleDbTimeout(self.db_get_timeout));
            }
        }
    }

    /// Sends a scan to CapsuleDB (re-sent every `db_get_retry`) and waits for a verified
    /// answer at least as new as the index this node last evicted under.
    fn db_scan(
        &self,
        db: &crate::dbclient::DbClient,
        q: &psl_scl::dbwire::ScanQuery,
        deadline: Instant,
    ) -> Result<psl_scl::dbwire::Scanned, NodeError> {
        let deadline_ms = mono_ms(deadline);
        let retry_ms = self.db_get_retry.as_millis() as u64;
        loop {
            let (req, bytes) = db.request_scan(q)?;
            self.publish(bytes)?;
            let sent_ms = mono_ms(Instant::now());
            loop {
                let seen = db.settled();
                if let Some((seq, body)) = db.take_scan(req) {
                    if seq >= self.memtable.evict_seq_max() {
                        db.forget_scan(req);
                        return Ok(body);
                    }
                    db.stats.rejected.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                match ask_step(mono_ms(Instant::now()), sent_ms, retry_ms, deadline_ms) {
                    AskStep::WaitUntil(t) => {
                        db.wait(seen, at_mono_ms(t));
                    }
                    AskStep::AskAgain | AskStep::GiveUp => break,
                }
                if self.stop.load(Ordering::Acquire) {
                    db.forget_scan(req);
                    return Err(NodeError::Stopped);
                }
            }
            db.forget_scan(req);
            if ask_step(mono_ms(Instant::now()), sent_ms, retry_ms, deadline_ms) == AskStep::GiveUp {
                db.stats.timeouts.fetch_add(1, Ordering::Relaxed);
                return Err(NodeError::CapsuleDbTimeout(self.db_get_timeout));
            }
        }
    }

    /// The key's entry with its version `(lamport, writer)`; tombstones included.
    pub fn entry(&self, key: &[u8]) -> Option<psl_scl::Entry> {
        self.memtable.entry(key)
    }

    /// Barrier: returns once this node has applied a SYNC that covers every write any live node
    /// had accepted before the call (see `psl_scl::NodeCore::begin_sync`).
    pub fn sync(&self, timeout: Duration) -> Result<(), NodeError> {
        let deadline = Instant::now() + timeout;
        let next_seqs = self.flush_writers(deadline, timeout)?;
        let (rtx, rrx) = bounded(1);
        self.api
            .send_deadline(CoreMsg::Sync { next_seqs, reply: rtx, deadline }, deadline)
            .map_err(|_| NodeError::SyncTimeout(timeout))?;
        rrx.recv_deadline(deadline).map_err(|_| NodeError::SyncTimeout(timeout))
    }

    /// Seals every op queued so far; returns each writer's next seq.
    fn flush_writers(
        &self,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<std::collections::BTreeMap<u32, u64>, NodeError> {
        let mut next_seqs = std::collections::BTreeMap::new();
        for (q, tx) in &self.actors {
            let (rtx, rrx) = bounded(1);
            tx.send_deadline(ActorCtl::Flush(rtx), deadline).map_err(|_| NodeError::SyncTimeout(timeout))?;
            q.poke();
            let next = rrx.recv_deadline(deadline).map_err(|_| NodeError::SyncTimeout(timeout))?;
            next_seqs.insert(q.writer, next);
        }
        Ok(next_seqs)
    }

    /// Durability barrier: returns once every write this node accepted before the call is
    /// stored, fsync'd, by a majority of the capsule servers (f + 1 of 2f + 1), as their signed
    /// acks say. On timeout the error says how many servers acked. Writes stay asynchronous;
    /// call this when durability matters (see `docs/protocol/durability.md`).
    pub fn sync_durable(&self, timeout: Duration) -> Result<(), NodeError> {
        if self.servers == 0 {
            return Err(NodeError::NoServers);
        }
        let deadline = Instant::now() + timeout;
        let next_seqs = self.flush_writers(deadline, timeout)?;
        self.durable_barrier(next_seqs, deadline, timeout)
    }

    /// Returns once, for every writer in `next_seqs` (own writers: actors', or those of records
    /// handed to [`Node::publish_own`]), a majority of the capsule servers acked every record
    /// below its next seq; fails like [`Node::sync_durable`] otherwise.
    pub fn wait_durable(
        &self,
        next_seqs: std::collections::BTreeMap<u32, u64>,
        timeout: Duration,
    ) -> Result<(), NodeError> {
        if self.servers == 0 {
            return Err(NodeError::NoServers);
        }
        self.durable_barrier(next_seqs, Instant::now() + timeout, timeout)
    }

    fn durable_barrier(
        &self,
        next_seqs: std::collections::BTreeMap<u32, u64>,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<(), NodeError> {
        let (rtx, rrx) = bounded(1);
        self.api
            .send_deadline(CoreMsg::SyncDurable { next_seqs, reply: rtx, deadline }, deadline)
            .map_err(|_| NodeError::SyncTimeout(timeout))?;
        // The core answers at the deadline at the latest (with what it knows); allow it a moment.
        match rrx.recv_deadline(deadline + Duration::from_secs(2)) {
            // Only the core's proof that a quorum acked answers "durable".
            Ok(Ok(proof)) => {
                tracing::trace!(acked_by = proof.acked_by(), quorum = proof.quorum(), "durable");
                Ok(())
            }
            Ok(Err(st)) => Err(NodeError::DurableTimeout {
                timeout,
                acked_by: st.acked_by,
                quorum: st.quorum,
                servers: st.servers,
            }),
            Err(_) => Err(NodeError::Stopped),
        }
    }

    /// `put`, then [`Node::sync_durable`]: returns once this write (and every earlier one of
    /// the node) is on a majority of the servers' disks.
    pub fn put_durable(&self, key: &[u8], value: &[u8], timeout: Duration) -> Result<(), NodeError> {
        self.put(key, value)?;
        self.sync_durable(timeout)
    }

    /// Installs an application key rotation, through the node's own channels (no I/O in the
    /// core): the certificate and data key into the core thread's verifier (and, on a node
    /// running a coordinator, the coordinator writer's new key, after which it writes the
    /// certificate into the log as a `Rotate` record), then each writer actor's new key. Each
    /// hop waits at most until `timeout`. Returns the node's rotation state afterwards.
    pub fn install_rotation(&self, r: NodeRotation, timeout: Duration) -> Result<RotationState, NodeError> {
        let deadline = Instant::now() + timeout;
        let gone = || NodeError::Rotation(format!("the node did not answer within {timeout:?}"));
        let NodeRotation { cert, data_key, writers, coordinator, refuse_if_begun, certs } = r;
        if let Some(dk) = &data_key {
            if dk.fingerprint() != cert.data_key_fp {
                return Err(NodeError::Rotation("the data key is not the certificate's".into()));
            }
        }
        let mine = self.writers();
        if !writers.is_empty() {
            if let Some((w, _)) = writers.iter().find(|(w, _)| !mine.contains(w)) {
                return Err(NodeError::Rotation(format!("writer {w} is not one of this node's")));
            }
            if let Some(w) = mine.iter().find(|w| !writers.iter().any(|(x, _)| x == *w)) {
                return Err(NodeError::Rotation(format!("no key for this node's writer {w}")));
            }
            if data_key.is_none() {
                return Err(NodeError::Rotation("writer keys need the new data key".into()));
            }
        }
        if self.stop.load(Ordering::Acquire) {
            return Err(NodeError::Stopped);
        }
        let (rtx, rrx) = bounded(1);
        let msg =
            psl_scl::engine::Rotation { cert: cert.clone(), data_key: data_key.clone(), coordinator, refuse_if_begun };
        self.api.send_deadline(CoreMsg::Rotate(Box::new(msg), rtx), deadline).map_err(|_| gone())?;
        rrx.recv_deadline(deadline).map_err(|_| gone())?.map_err(NodeError::Rotation)?;
        for (w, key) in writers {
            let Some((q, tx)) = self.actors.iter().find(|(q, _)| q.writer == w) else { continue };
            let dk = data_key.clone().expect("checked above");
            let (rtx, rrx) = bounded(1);
            let m = crate::actor::ActorCtl::Rotate { cert: Box::new(cert.clone()), key, data_key: dk, reply: rtx };
            tx.send_deadline(m, deadline).map_err(|_| gone())?;
            q.poke();
            rrx.recv_deadline(deadline).map_err(|_| gone())?.map_err(NodeError::Rotation)?;
        }
        if !certs.is_empty() {
            self.add_statements(certs, deadline.saturating_duration_since(Instant::now()))?;
        }
        self.rotation_state(deadline)
    }

    /// The node's epoch and application key generations (the control interface's `KEYGEN`).
    pub fn rotation_state(&self, deadline: Instant) -> Result<RotationState, NodeError> {
        let (rtx, rrx) = bounded(1);
        self.api.send_deadline(CoreMsg::RotationState(rtx), deadline).map_err(|_| NodeError::Stopped)?;
        rrx.recv_deadline(deadline).map_err(|_| NodeError::Stopped)
    }

    /// Installs and announces a key statement (the leader's revocation of a writer); a node
    /// running a coordinator also carries it into the log. Returns the node's epoch.
    pub fn add_statement(&self, s: KeyStatement, timeout: Duration) -> Result<u64, NodeError> {
        self.add_statements(vec![s], timeout)
    }

    /// Checks a certificate or revocation against this node's capsule (its name and the
    /// signature of its generation's application key) without installing it.
    pub fn check_statement(&self, s: &KeyStatement) -> Result<(), psl_capsule::CertError> {
        self.verifier.check_statement(s)
    }

    /// Like [`Node::add_statement`] for several (one Cert record per 64).
    pub fn add_statements(&self, s: Vec<KeyStatement>, timeout: Duration) -> Result<u64, NodeError> {
        let deadline = Instant::now() + timeout;
        let (rtx, rrx) = bounded(1);
        self.api.send_deadline(CoreMsg::Statement(s, rtx), deadline).map_err(|_| NodeError::Stopped)?;
        rrx.recv_deadline(deadline).map_err(|_| NodeError::Stopped)?.map_err(NodeError::Keys)
    }

    /// The next seq this node expects of writer `w`: every earlier record of its chain is
    /// applied here (a revocation's `from_seq` on the leader's coordinator).
    pub fn next_seq_of(&self, w: u32) -> Result<u64, NodeError> {
        let deadline = Instant::now() + Duration::from_secs(5);
        let (rtx, rrx) = bounded(1);
        self.api.send_deadline(CoreMsg::NextSeq(w, rtx), deadline).map_err(|_| NodeError::Stopped)?;
        rrx.recv_deadline(deadline).map_err(|_| NodeError::Stopped)
    }

    /// CapsuleDB role only (`NodeOptions::capsuledb_role`): the newest record this node has
    /// applied of every writer, as of the core's last tick (what CapsuleDB's acks name). Never
    /// waits for the core. Empty on other nodes.
    pub fn applied_heads(&self) -> Vec<psl_capsule::Link> {
        self.applied.as_ref().map(|a| a.lock().clone()).unwrap_or_default()
    }

    /// The node's epoch (the newest SYNC applied).
    pub fn epoch(&self) -> Result<u64, NodeError> {
        Ok(self.rotation_state(Instant::now() + Duration::from_secs(5))?.epoch)
    }

    /// How many capsule servers the node counts acks from (0: durability off).
    /// How many capsule servers the capsule has (`NodeConfig::servers`; 0: none configured).
    pub fn servers(&self) -> u32 {
        self.servers
    }

    /// RESET: wipes the memtable and the replicated state (the keys go with the node).
    pub fn reset(&self) -> Result<(), NodeError> {
        let (rtx, rrx) = bounded(1);
        self.api.send(CoreMsg::Reset(rtx)).map_err(|_| NodeError::Stopped)?;
        rrx.recv().map_err(|_| NodeError::Stopped)
    }

    /// The node's protocol counters (records and ops written and applied, rejections, ...).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The fabric endpoint's counters: what it sent and received, and what it dropped because
    /// a queue was full or the link was down.
    pub fn fabric_stats(&self) -> psl_fabric::FabricStats {
        self.fabric.stats()
    }

    /// Messages this node lost on the way in: dropped by its fabric endpoint (receive queue
    /// full) or by its host thread (inbound ring full). Each is a record, ack or hint that a
    /// repair or the next heads hint must make up for.
    pub fn inbound_dropped(&self) -> u64 {
        self.fabric.stats().dropped_full + self.host_stats.inbound_dropped.load(Ordering::Relaxed)
    }

    /// The host thread's counters: messages published and received, publish errors, and
    /// inbound messages dropped on a full ring.
    pub fn host_stats(&self) -> &Arc<HostStats> {
        &self.host_stats
    }

    /// The node's memtable: the newest value of every key it holds.
    pub fn memtable(&self) -> &Arc<Memtable> {
        &self.memtable
    }

    /// A digest of the memtable's live entries (key, value, version): equal on two nodes exactly
    /// when they hold the same live entries.
    pub fn digest(&self) -> Hash256 {
        self.memtable.digest()
    }

    /// The node's Lamport clock now.
    pub fn lamport(&self) -> u64 {
        self.clock.now()
    }

    /// Ops sealed by this node's writers and not yet durable at a quorum of capsule servers
    /// and taken in by CapsuleDB and the pacing peers (0 with flow control off; see
    /// [`crate::flow`]).
    pub fn flow_unacked_ops(&self) -> usize {
        self.actors.iter().map(|(q, _)| q.flow.unacked_ops()).sum()
    }

    /// Records sealed by this node's writers and not yet acked (see [`crate::flow`]).
    pub fn flow_unacked_records(&self) -> usize {
        self.actors.iter().map(|(q, _)| q.flow.unacked_records()).sum()
    }

    /// The flow control its writers run with (`None`: a receive-only node).
    pub fn flow_options(&self) -> Option<crate::flow::FlowOptions> {
        self.actors.first().map(|(q, _)| q.flow.options())
    }

    /// Prometheus text of the node's counters.
    pub fn render_metrics(&self) -> String {
        let mut s = self.metrics.render("psl_node");
        s.push_str(&format!(
            "# TYPE psl_node_flow_unacked_ops gauge\npsl_node_flow_unacked_ops {}\n",
            self.flow_unacked_ops()
        ));
        s.push_str(&crate::memory::render_metrics());
        for (name, v) in [
            ("host_published_total", &self.host_stats.published),
            ("host_received_total", &self.host_stats.received),
            ("host_inbound_dropped_total", &self.host_stats.inbound_dropped),
            ("host_publish_errors_total", &self.host_stats.publish_errors),
        ] {
            s.push_str(&format!("# TYPE psl_node_{name} counter\npsl_node_{name} {}\n", v.load(Ordering::Relaxed)));
        }
        let f = self.fabric.stats();
        for (name, v) in [
            ("fabric_dropped_full_total", f.dropped_full),
            ("fabric_dropped_send_full_total", f.dropped_send_full),
            ("fabric_dropped_disconnected_total", f.dropped_disconnected),
        ] {
            s.push_str(&format!("# TYPE psl_node_{name} counter\npsl_node_{name} {v}\n"));
        }
        if let Some(db) = &self.db {
            let st = &db.stats;
            for (name, v) in [
                ("capsuledb_requests_total", &st.requests),
                ("capsuledb_answers_total", &st.answers),
                ("capsuledb_rejected_total", &st.rejected),
                ("capsuledb_timeouts_total", &st.timeouts),
                ("capsuledb_heads_total", &st.heads),
            ] {
                s.push_str(&format!("# TYPE psl_node_{name} counter\npsl_node_{name} {}\n", v.load(Ordering::Relaxed)));
            }
            s.push_str(&format!(
                "# TYPE psl_node_memtable_evicted_total counter\npsl_node_memtable_evicted_total {}\n",
                self.memtable.evicted()
            ));
        }
        s
    }

    /// Stops every thread (pending ops not yet sealed are lost, as in a crash).
    pub fn shutdown(mut self) {
        self.stop_threads();
    }

    fn stop_threads(&mut self) {
        self.stop.store(true, Ordering::Release);
        for (q, tx) in &self.actors {
            let _ = tx.send(ActorCtl::Stop);
            q.poke();
        }
        let _ = self.api.send(CoreMsg::Stop);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            self.stop_threads();
        }
    }
}

/// The miss path to CapsuleDB (writer `w` signs its answers).
fn db_client(
    w: u32,
    verifier: &Arc<Verifier>,
    data_key: &DataKey,
    memtable: &Arc<Memtable>,
    clock: &Arc<LamportClock>,
) -> Result<Arc<crate::dbclient::DbClient>, NodeError> {
    if verifier.writer_keys() == WriterKeys::Derived {
        verifier.writer_key(w).map_err(|e| NodeError::Keys(format!("CapsuleDB writer {w}: {e:?}")))?;
    }
    Ok(Arc::new(crate::dbclient::DbClient::new(
        verifier.name(),
        w,
        verifier.clone(),
        data_key.clone(),
        memtable.clone(),
        clock.clone(),
    )))
}

/// What the node's threads share with the engine's core.
struct Shared {
    verifier: Arc<Verifier>,
    memtable: Arc<Memtable>,
    clock: Arc<LamportClock>,
    metrics: Arc<Metrics>,
}

/// The node's engine: its core (with the coordinator's state machine, if it runs one), the
/// coordinator's writer and own-chain log, and that chain restored from the log.
fn start_engine(
    keys: NodeKeys,
    opts: &NodeOptions,
    shared: Shared,
    local_writers: impl IntoIterator<Item = u32>,
    verify_elsewhere: bool,
) -> Result<NodeEngine, NodeError> {
    let coordinator = match (&opts.coordinator, keys.coordinator) {
        (Some(cfg), Some((w, key))) => Some((w, *cfg, make_author(&keys.meta, &keys.data_key, &keys.certs, key, w)?)),
        _ => None,
    };
    let mut core = NodeCore::new(
        shared.verifier,
        shared.memtable,
        shared.clock,
        shared.metrics,
        local_writers,
        coordinator.as_ref().map(|(w, cfg, _)| (*w, CoordinatorSm::new(*cfg, 0))),
        // The CapsuleDB this node reads from also paces its writers (its acks), and so do its
        // peers (tagged heads hints; the id is random, so restarts get a new one).
        psl_scl::NodeConfig {
            capsuledb: opts.core.capsuledb.or(opts.capsuledb),
            peer_id: match opts.core.peer_id {
                0 => rand::random::<u64>() | 1,
                id => id,
            },
            ..opts.core
        },
    );
    core.set_announcements(keys.certs.clone());
    let (chain_log, restored) = match (&coordinator, &opts.coordinator_state) {
        (Some(_), Some(dir)) => {
            let (log, records) = crate::chainlog::ChainLog::open(dir).map_err(NodeError::State)?;
            (Some(Box::new(log) as Box<dyn psl_scl::engine::CoordinatorLog>), records)
        }
        _ => (None, Vec::new()),
    };
    let coordinator_w = coordinator.as_ref().map(|(w, _, _)| *w);
    let mut engine = NodeEngine::new(core, coordinator.map(|(_, _, a)| (a, chain_log)), verify_elsewhere);
    if let Some(w) = coordinator_w {
        restore_own_chain(w, restored, &mut engine)?;
    }
    Ok(engine)
}

/// The node's threads, joined at shutdown.
type Threads = Vec<JoinHandle<()>>;
/// A writer actor's queue (`put`'s side) and control channel (the core's side).
pub(crate) type WriterHandle = (Arc<ActorQueue>, Sender<ActorCtl>);

/// One writer actor per writer key: each owns its writer's chain and seals batches of its
/// queue's ops. Returns their queues and control channels (the core's and `put`'s side).
fn spawn_writers(
    keys: &NodeKeys,
    writers: Vec<(u32, SigningKey)>,
    opts: &NodeOptions,
    core: &Sender<CoreMsg>,
    clock: &Arc<LamportClock>,
    threads: &mut Threads,
) -> Result<Vec<WriterHandle>, NodeError> {
    let limits = keys.meta.meta.policy.limits;
    let mut actors = Vec::new();
    for (w, key) in writers {
        let policy = SealPolicy {
            batch_ops_max: opts.batch_ops_max.clamp(1, limits.ops_per_record_max as usize),
            batch_bytes_max: (limits.record_bytes_max as usize).saturating_sub(64 * 1024).max(1),
            flush_delay_us: opts.flush_delay.as_micros() as u64,
            seal_interval_us: opts.seal_interval.as_micros() as u64,
        };
        // Servers, CapsuleDB and peers pace the writer (without any of them the window is
        // released as fast as the core applies the own records).
        let q = Arc::new(ActorQueue::new(w, opts.queue_ops_max.max(opts.batch_ops_max), policy, opts.flow));
        let (ctl_tx, ctl_rx) = bounded(1024);
        let author = make_author(&keys.meta, &keys.data_key, &keys.certs, key, w)?;
        let actor = Actor { queue: q.clone(), author, ctl: ctl_rx, core: core.clone(), clock: clock.clone() };
        threads.push(std::thread::Builder::new().name(format!("writer-{w}")).spawn(move || actor.run())?);
        actors.push((q, ctl_tx));
    }
    Ok(actors)
}

/// `n` verify actors: each verifies and opens records from `records` and sends the outcome to
/// the core (none: the core verifies).
fn spawn_verifiers(
    n: usize,
    verifier: &Arc<Verifier>,
    records: &crossbeam_channel::Receiver<Record>,
    results: &Sender<CoreMsg>,
    start: Instant,
    threads: &mut Threads,
) -> Result<(), NodeError> {
    for i in 0..n {
        let rx = records.clone();
        let tx = results.clone();
        let v = verifier.clone();
        threads.push(std::thread::Builder::new().name(format!("verify-{i}")).spawn(move || {
            while let Ok(rec) = rx.recv() {
                let now = start.elapsed().as_millis() as u64;
                let m = match psl_scl::engine::verify(&v, rec, now) {
                    Ok(Some(o)) => CoreMsg::Verified(o),
                    Ok(None) => continue,
                    Err(r) => CoreMsg::Rejected(r),
                };
                if tx.send(m).is_err() {
                    return;
                }
            }
        })?);
    }
    Ok(())
}

/// The dispatcher thread: inbound ring -> decoded messages for the core (records and SCL
/// messages), CapsuleDB's answers to the miss path, and read requests to the CapsuleDB role.
struct Dispatcher {
    stop: Arc<AtomicBool>,
    name: psl_capsule::CapsuleName,
    limits: Limits,
    incoming: Sender<CoreMsg>,
    /// Rejections go with the writers' records (the core always listens there).
    results: Sender<CoreMsg>,
    db: Option<Arc<crate::dbclient::DbClient>>,
    db_requests: Option<Sender<psl_scl::dbwire::DbRequest>>,
    metrics: Arc<Metrics>,
}

impl Dispatcher {
    fn run(self, mut inbound: crate::ring::InboundRing) {
        while !self.stop.load(Ordering::Acquire) {
            // The host's inbound thread ending (at shutdown) wakes this wait.
            let Some(bytes) = inbound.wait_pop(crate::host::RING_WAIT) else { continue };
            if psl_scl::dbwire::is_db_msg(&bytes) {
                self.db_message(&bytes);
                continue;
            }
            let m = match Msg::decode(&bytes) {
                Err(_) => CoreMsg::Rejected(RejectReason::BadMessage),
                Ok(Msg::Record { capsule, .. }) if capsule != self.name => CoreMsg::Rejected(RejectReason::Capsule),
                Ok(Msg::Record { bytes, .. }) => match Record::decode_shared(bytes, &self.limits) {
                    Ok(r) => CoreMsg::Incoming(r),
                    Err(_) => CoreMsg::Rejected(RejectReason::Encoding),
                },
                Ok(other) => CoreMsg::Message(other),
            };
            let sent = match m {
                CoreMsg::Rejected(_) => self.results.send(m),
                m => self.incoming.send(m),
            };
            if sent.is_err() {
                return;
            }
        }
    }

    fn db_message(&self, bytes: &[u8]) {
        use psl_scl::dbwire::{DbMsg, DbRequest};
        match DbMsg::decode(bytes) {
            Ok(m) if m.capsule() != self.name => self.metrics.reject(RejectReason::Capsule),
            // Full: dropped (the requester re-sends).
            Ok(DbMsg::Get(g)) => {
                if let Some(t) = &self.db_requests {
                    let _ = t.try_send(DbRequest::Get(g));
                }
            }
            Ok(DbMsg::Scan(q)) => {
                if let Some(t) = &self.db_requests {
                    let _ = t.try_send(DbRequest::Scan(q));
                }
            }
            Ok(m) => {
                if let Some(db) = &self.db {
                    db.on_message(m);
                }
            }
            Err(_) => self.metrics.reject(RejectReason::BadMessage),
        }
    }
}

/// A restarted coordinator's own-chain log: every record must decode, be this coordinator
/// writer's and follow the one before it (else the start is refused). Each that verifies is
/// handed to the core as if received (peers that lost it can ask for it again); one that does
/// not (signed under a key generation this fresh verifier has not been given yet, after a
/// rotation) is only counted. Either way the rejoin period is held until the own chain is
/// applied through the newest logged seq: a wrong floor can only make the coordinator wait
/// longer (a shadow takes over meanwhile), never sign a seq twice. Returns what the core said.
fn restore_own_chain(writer: u32, records: Vec<Vec<u8>>, engine: &mut NodeEngine) -> Result<(), NodeError> {
    let limits = engine.verifier().metadata().meta.policy.limits;
    let mut prev: Option<(u64, psl_crypto::Hash256)> = None;
    let n = records.len();
    for (i, bytes) in records.into_iter().enumerate() {
        let damaged = |what: String| NodeError::StateRecord { index: i, count: n, what };
        let rec = Record::decode_shared(bytes.into(), &limits).map_err(|e| damaged(format!("does not decode: {e}")))?;
        let h = rec.header().clone();
        if h.writer != writer {
            return Err(damaged(format!("writer {} is not this coordinator's writer {writer}", h.writer)));
        }
        if let Some((seq, hash)) = prev {
            if h.seq != seq + 1 || h.prev != hash {
                return Err(damaged(format!("seq {} does not follow seq {seq} of the chain", h.seq)));
            }
        }
        prev = Some((h.seq, rec.hash()));
        match engine.restore_own(rec) {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(writer, seq = h.seq, "coordinator state: a logged record waits for a certificate")
            }
            Err(r) => tracing::warn!(
                writer,
                seq = h.seq,
                "coordinator state: a logged record does not verify here ({r:?}); its seq still counts"
            ),
        }
    }
    if let Some((seq, _)) = prev {
        tracing::info!(writer, seq, records = n, "coordinator state: resuming after the newest seq it signed");
        engine.core_mut().hold_rejoin_until(seq);
    }
    Ok(())
}
