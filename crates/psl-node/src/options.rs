//! Node options: every queue has a bound, every wait a limit.

use psl_scl::{CoordinatorConfig, NodeConfig};
use std::time::Duration;

/// Everything a [`crate::Node`] is started with: identity, thread counts, queue bounds and
/// waits, the protocol configuration, and the optional coordinator and CapsuleDB roles.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// Node id (1 ..= 32767): with the incarnation, it names the node's writers.
    pub node_id: u32,
    /// Incarnation: a restarted node must use a new one (see `psl_scl::writer_index`).
    pub incarnation: u32,
    /// Writer actors (crypto threads that batch, seal and sign). 0 for a receive-only node.
    pub writers: usize,
    /// Verify actors. 0: the core thread verifies each record itself (no hand-off to another
    /// thread and back: cheaper where a node shares a few cores, but no parallel verification).
    pub verifiers: usize,
    /// Most ops in one record.
    pub batch_ops_max: usize,
    /// How long a writer waits for a batch to fill before sealing what it has.
    pub flush_delay: Duration,
    /// The shortest time between two seals of a batch that is not full (zero: none; see
    /// `psl_scl::engine::queue::SealPolicy::seal_interval_us`).
    pub seal_interval: Duration,
    /// Ops queued per writer before `put` blocks (backpressure).
    pub queue_ops_max: usize,
    /// How long `put` waits on a full queue before failing.
    pub put_timeout: Duration,
    /// Items in each boundary ring.
    pub ring_items: usize,
    /// How ring waiters spin, yield and park. The default spins ~20-40 µs and yields before it
    /// parks (the peer's next push or pop rings it awake: `BackoffPolicy::parking`), right for
    /// a node with cores of its own; many nodes sharing a few cores (the embedded deployment,
    /// the process roles unless `--dedicated-cores`, benchmarks) should use
    /// [`NodeOptions::shared_cores`] (docs/protocol/scale.md §9).
    pub ring_backoff: psl_boundary::BackoffPolicy,
    /// Messages between the dispatcher, the core and the verify actors.
    pub channel_msgs_max: usize,
    /// The core's tick (repair timers, coordinator clock).
    pub tick: Duration,
    /// The SCL protocol engine's configuration (capsule servers, repair and rejoin timers, ...).
    pub core: NodeConfig,
    /// Run a coordinator of this rank and configuration in this node.
    pub coordinator: Option<CoordinatorConfig>,
    /// The coordinator's state directory: every record its writer signs is fsync'd to the
    /// own-chain log there before it is published, and a restart on the same directory waits to
    /// learn its chain back through the newest of them (see [`crate::chainlog`]). `None`: the
    /// coordinator learns its chain from peers only, for `core.rejoin_ms`, and can re-sign a
    /// seq if none of them answers in time.
    pub coordinator_state: Option<std::path::PathBuf>,
    /// Bound on the memtable's keys (`None`: unbounded). Only keys CapsuleDB holds are evicted
    /// (see `psl_scl::Memtable`), so a bound needs `capsuledb`.
    pub memtable_keys_max: Option<usize>,
    /// CapsuleDB's writer index: turns on the miss path (a get the memtable cannot answer asks
    /// CapsuleDB), the eviction floor from CapsuleDB's signed frontiers, and flow control from
    /// its acks.
    pub capsuledb: Option<u32>,
    /// How long a get (or scan) waits for CapsuleDB before failing with
    /// [`crate::NodeError::CapsuleDbTimeout`].
    pub db_get_timeout: Duration,
    /// How often a waiting get (or scan) re-sends its request to CapsuleDB.
    pub db_get_retry: Duration,
    /// CapsuleDB role only: journal every applied update (this many at most in flight) and hand
    /// read requests to [`crate::Node::db_requests`].
    pub capsuledb_role: Option<usize>,
    /// Flow control back to the writers from the capsule servers' acks, CapsuleDB's acks and
    /// the peers' tagged hints: see [`crate::flow`].
    pub flow: crate::flow::FlowOptions,
}

impl NodeOptions {
    /// Options for a node that shares its cores with many others (several nodes in one
    /// process): ring waiters spin 32 times and do not yield before they park, so idle nodes
    /// leave the CPU to busy ones, and the doorbell wakes them when a record comes.
    pub fn shared_cores(mut self) -> NodeOptions {
        self.ring_backoff =
            psl_boundary::BackoffPolicy { spin_polls: 32, yield_polls: 0, ..psl_boundary::BackoffPolicy::parking() };
        self
    }
}

impl Default for NodeOptions {
    fn default() -> Self {
        NodeOptions {
            node_id: 1,
            incarnation: 0,
            writers: 2,
            verifiers: 2,
            batch_ops_max: 512,
            flush_delay: Duration::from_micros(500),
            seal_interval: Duration::ZERO,
            queue_ops_max: 65_536,
            put_timeout: Duration::from_secs(10),
            ring_items: 4096,
            ring_backoff: psl_boundary::BackoffPolicy::parking(),
            channel_msgs_max: 4096,
            tick: Duration::from_millis(10),
            core: NodeConfig::default(),
            coordinator: None,
            coordinator_state: None,
            memtable_keys_max: None,
            capsuledb: None,
            db_get_timeout: Duration::from_secs(5),
            db_get_retry: Duration::from_millis(300),
            capsuledb_role: None,
            flow: crate::flow::FlowOptions::default(),
        }
    }
}
