//! Node options: every queue has a bound, every wait a limit.

use psl_scl::{CoordinatorConfig, NodeConfig};
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// Node id (1 ..= 32767): with the incarnation, it names the node's writers.
    pub node_id: u32,
    /// Incarnation: a restarted node must use a new one (see `psl_scl::writer_index`).
    pub incarnation: u32,
    /// Writer actors (crypto threads that batch, seal and sign). 0 for a receive-only node.
    pub writers: usize,
    /// Verify actors.
    pub verifiers: usize,
    /// Most ops in one record.
    pub batch_ops_max: usize,
    /// How long a writer waits for a batch to fill before sealing what it has.
    pub flush_delay: Duration,
    /// Ops queued per writer before `put` blocks (backpressure).
    pub queue_ops_max: usize,
    /// How long `put` waits on a full queue before failing.
    pub put_timeout: Duration,
    /// Items in each boundary ring.
    pub ring_items: usize,
    /// How ring waiters spin, yield and sleep. The default spins ~20-40 µs before sleeping,
    /// right for a node with cores of its own; many nodes sharing a few cores (the embedded
    /// deployment, benchmarks) should use [`NodeOptions::shared_cores`].
    pub ring_backoff: psl_boundary::BackoffPolicy,
    /// Messages between the dispatcher, the core and the verify actors.
    pub channel_msgs_max: usize,
    /// The core's tick (repair timers, coordinator clock).
    pub tick: Duration,
    pub core: NodeConfig,
    /// Run a coordinator of this rank and configuration in this node.
    pub coordinator: Option<CoordinatorConfig>,
    /// Bound on the memtable's keys (`None`: unbounded). Only keys CapsuleDB holds are evicted
    /// (see `psl_scl::Memtable`), so a bound needs `capsuledb`.
    pub memtable_keys_max: Option<usize>,
    /// CapsuleDB's writer index: turns on the miss path (a get the memtable cannot answer asks
    /// CapsuleDB) and the eviction floor from CapsuleDB's signed frontiers.
    pub capsuledb: Option<u32>,
    /// How long a get waits for CapsuleDB before failing, and how often it re-sends its request.
    pub db_get_timeout: Duration,
    pub db_get_retry: Duration,
    /// CapsuleDB role only: journal every applied update (this many at most in flight) and hand
    /// read requests to [`crate::Node::db_requests`].
    pub capsuledb_role: Option<usize>,
}

impl NodeOptions {
    /// Options for a node that shares its cores with many others (several nodes in one
    /// process): ring waiters barely spin, so idle nodes leave the CPU to busy ones.
    pub fn shared_cores(mut self) -> NodeOptions {
        self.ring_backoff = psl_boundary::BackoffPolicy {
            spin_polls: 32,
            yield_polls: 8,
            min_sleep: Duration::from_micros(20),
            max_sleep: Duration::from_micros(500),
        };
        self
    }

    /// [`NodeOptions::shared_cores`] with longer sleeps (250 µs doubling to 2 ms) once a ring
    /// waiter has run out of spins and yields: an idle or lightly loaded node wakes its ring
    /// threads about 8 times less often, which leaves more of a few shared cores to the work
    /// that answers clients. The price is up to ~2 ms more before a record that arrives after
    /// a quiet spell moves between the host and the core. Right where no client waits on the
    /// rings: the SecureCached embedded deployment (get and set are answered from the local
    /// memtable; replication follows), not for launches or synchronous round trips.
    pub fn shared_cores_relaxed(self) -> NodeOptions {
        let mut o = self.shared_cores();
        o.ring_backoff.min_sleep = Duration::from_micros(250);
        o.ring_backoff.max_sleep = Duration::from_millis(2);
        o
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
            queue_ops_max: 65_536,
            put_timeout: Duration::from_secs(10),
            ring_items: 4096,
            ring_backoff: psl_boundary::BackoffPolicy::default(),
            channel_msgs_max: 4096,
            tick: Duration::from_millis(10),
            core: NodeConfig::default(),
            coordinator: None,
            memtable_keys_max: None,
            capsuledb: None,
            db_get_timeout: Duration::from_secs(5),
            db_get_retry: Duration::from_millis(300),
            capsuledb_role: None,
        }
    }
}
