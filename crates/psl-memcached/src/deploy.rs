//! Deployments inside one process: the embedded default of `psl memcached` (one node that
//! also runs the coordinator, so that `sync` works, on an in-process hub), and groups of
//! several front ends on several nodes for tests and benchmarks.

use crate::store::{Config, FrontEnd};
use psl_capsule::{new_capsule_with, Limits, SignedMetadata, WriterKeys};
use psl_crypto::{AppKey, OwnerKey};
use psl_fabric::{Fabric, FabricConfig, InProcHub};
use psl_node::{Node, NodeError, NodeKeys, NodeOptions};
use psl_scl::CoordinatorConfig;
use std::sync::Arc;

/// Settings of an in-process deployment.
#[derive(Debug, Clone)]
pub struct EmbeddedOptions {
    /// Front ends, each on its own node (1 for the embedded default).
    pub front_ends: usize,
    /// Extra receive-only nodes that verify and apply every write (the benchmark's replica).
    pub replicas: usize,
    /// Writer actors per front-end node.
    pub writers: usize,
    /// Verify actors per node; 0 (the default): each node's core thread verifies, which on a
    /// few shared cores saves two thread hand-offs per record (docs/protocol/memcached.md §8).
    pub verifiers: usize,
    /// The coordinator's epoch length in milliseconds (`CoordinatorConfig::epoch_ms`); it
    /// waits three epochs for the nodes' end-of-epoch messages (`eoe_timeout_ms`).
    pub epoch_ms: u64,
    /// How long a writer actor waits for a batch to fill. Longer batches mean fewer
    /// signatures (sealing and verifying) per op, at the cost of replication delay.
    pub flush_delay: std::time::Duration,
    /// The shortest time between two seals of a writer's batch that is not full (zero: none;
    /// `NodeOptions::seal_interval`).
    pub seal_interval: std::time::Duration,
    /// Settings of every front end (limits, memory limit, reported `stats` values).
    pub config: Config,
    /// CapsuleDB's writer index: front-end nodes read what they evicted back from it
    /// (`NodeOptions::capsuledb`). The caller runs the CapsuleDB role on [`Embedded::hub`].
    pub capsuledb: Option<u32>,
}

impl Default for EmbeddedOptions {
    fn default() -> Self {
        EmbeddedOptions {
            front_ends: 1,
            replicas: 0,
            // One writer sealing a record every 5 ms at most (or every `batch_ops_max` ops):
            // on a few shared cores, fewer and fuller records mean fewer signatures to verify
            // and fewer thread wake-ups on every node, which the server thread feels more than
            // the replication delay (see docs/protocol/memcached.md §8).
            writers: 1,
            verifiers: 0,
            epoch_ms: 100,
            flush_delay: std::time::Duration::from_millis(5),
            seal_interval: std::time::Duration::ZERO,
            config: Config::default(),
            capsuledb: None,
        }
    }
}

/// Why an in-process deployment could not start.
#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    /// A node's keys could not be derived or the node did not start.
    #[error("node: {0}")]
    Node(#[from] NodeError),
    /// Making the application key, the capsule or the in-process hub failed (the reason).
    #[error("{0}")]
    Other(String),
}

/// Everything of an in-process deployment; dropping it stops the nodes.
pub struct Embedded {
    /// The in-process fabric every node is on; more roles (CapsuleDB) can join it.
    pub hub: InProcHub,
    /// The signed metadata of the deployment's fresh capsule.
    pub meta: SignedMetadata,
    /// The front ends, one per node, joined in one group (the first node runs the coordinator).
    pub front_ends: Vec<Arc<FrontEnd>>,
    /// The receive-only nodes, which verify and apply every write.
    pub replicas: Vec<Arc<Node>>,
    _app: AppKey,
}

impl Embedded {
    /// Starts `front_ends` nodes with a front end each (the first also runs the coordinator;
    /// joined in one group so that read-modify-write commands are arbitrated by each key's
    /// home), and `replicas` receive-only nodes, all on one in-process hub, under a fresh owner
    /// key and capsule.
    pub fn start(o: &EmbeddedOptions) -> Result<Embedded, DeployError> {
        let owner = OwnerKey::generate();
        let app = owner.app(1).map_err(|e| DeployError::Other(e.to_string()))?;
        let meta = new_capsule_with(&owner, 1, "securecached", 0, Limits::default(), WriterKeys::Certified)
            .map_err(|e| DeployError::Other(e.to_string()))?;
        let hub = InProcHub::new(FabricConfig { queue_msgs_max: 1 << 16, ..FabricConfig::default() })
            .map_err(|e| DeployError::Other(e.to_string()))?;
        let ep = |name: &str| -> Arc<dyn Fabric> { Arc::new(hub.endpoint(name)) };
        // The coordinator runs inside the first front end's node (a node may host one): a
        // separate coordinator node would verify and apply every write a second time.
        let coordinator =
            CoordinatorConfig { epoch_ms: o.epoch_ms, eoe_timeout_ms: 3 * o.epoch_ms, ..CoordinatorConfig::default() };
        let mut front_ends = Vec::new();
        for i in 0..o.front_ends.max(1) {
            let opts = NodeOptions {
                node_id: 1 + i as u32,
                writers: o.writers.max(1),
                verifiers: o.verifiers,
                flush_delay: o.flush_delay,
                seal_interval: o.seal_interval,
                coordinator: (i == 0).then_some(coordinator),
                capsuledb: o.capsuledb,
                ..NodeOptions::default()
            }
            .shared_cores();
            let node = Node::start(NodeKeys::derive(&meta, &app, &opts)?, ep(&format!("memcached-{i}")), opts)?;
            front_ends.push(FrontEnd::new(Arc::new(node), o.config.clone()));
        }
        FrontEnd::join_group(&front_ends);
        let mut replicas = Vec::new();
        for i in 0..o.replicas {
            let opts =
                NodeOptions { node_id: 100 + i as u32, writers: 0, verifiers: o.verifiers, ..NodeOptions::default() }
                    .shared_cores();
            replicas.push(Arc::new(Node::start(
                NodeKeys::derive(&meta, &app, &opts)?,
                ep(&format!("replica-{i}")),
                opts,
            )?));
        }
        Ok(Embedded { hub, meta, front_ends, replicas, _app: app })
    }

    /// The deployment's application key (to start more roles, e.g. CapsuleDB, on its hub).
    pub fn app(&self) -> &AppKey {
        &self._app
    }
}
