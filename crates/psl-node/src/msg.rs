//! What the core thread is sent (`CoreMsg`: by the writer actors, the verify actors, the
//! dispatcher and the API) and the rotation state it answers with: shared by `core`, `actor`
//! and `node` without tying them in a circle.

use crossbeam_channel::Sender;
use psl_capsule::{Body, Opened, Record, RotationCert, Verified};
use psl_crypto::{DataKey, SigningKey};
use psl_scl::{DurableStatus, Msg, RejectReason};
use std::collections::BTreeMap;
use std::time::Instant;

/// A message to the core thread.
pub(crate) enum CoreMsg {
    /// An own record from a writer actor (`body` for non-data records).
    Local {
        rec: Record,
        body: Option<Body>,
        ops: usize,
    },
    /// A decoded record from the network, not yet verified.
    Incoming(Record),
    /// A non-record message from the network.
    Message(Msg),
    Verified(Box<Verified<Opened>>),
    Rejected(RejectReason),
    /// A `sync()` barrier; abandoned at `deadline` (the caller has given up by then).
    Sync {
        next_seqs: BTreeMap<u32, u64>,
        reply: Sender<()>,
        deadline: Instant,
    },
    /// A `sync_durable()` barrier: answered `Ok` once a quorum of servers acked every own
    /// record below `next_seqs`, or `Err(status)` at `deadline`.
    SyncDurable {
        next_seqs: BTreeMap<u32, u64>,
        reply: Sender<Result<(), DurableStatus>>,
        deadline: Instant,
    },
    /// A RESET: forget all replicated state.
    Reset(Sender<()>),
    /// Bytes to multicast as they are (CapsuleDB requests, answers and frontiers).
    Publish(Vec<u8>),
    /// An own record sealed outside the writer actors (CapsuleDB's blocks and indexes).
    Own(Record),
    /// An application key rotation for the core: the certificate (and the new data key) into
    /// the verifier, and, on a node running a coordinator, that writer's new key.
    Rotate(Box<CoreRotation>, Sender<Result<RotationState, String>>),
    /// The rotation state (epoch, key generations), for debug lines and the leader.
    RotationState(Sender<RotationState>),
    /// A key statement from the leader (a revocation): installed, announced, and carried into
    /// the log by this node's coordinator, if it runs one.
    Statement(Vec<psl_capsule::KeyStatement>, Sender<Result<u64, String>>),
    /// The next seq this node expects of a writer (how far it has applied that writer's chain).
    NextSeq(u32, Sender<u64>),
    Stop,
}

/// What the core thread is asked to install for a rotation.
pub(crate) struct CoreRotation {
    pub cert: RotationCert,
    pub data_key: Option<DataKey>,
    /// The coordinator writer's key under the new generation (a node running a coordinator).
    pub coordinator: Option<SigningKey>,
    /// Refuse (install nothing) if the rotation epoch has already begun here: the leader's
    /// coordinator must learn a rotation before its epoch, or some record of that epoch could
    /// already be under the old key.
    pub refuse_if_begun: bool,
}

/// A node's view of application key rotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RotationState {
    /// The epoch this node is in.
    pub epoch: u64,
    /// Newest application key generation the node's verifier knows (0: never rotated).
    pub key_gen_newest: u32,
    /// The generation in force at `epoch`.
    pub key_gen_in_force: u32,
    /// The epoch the newest generation takes effect at (0 for generation 0).
    pub from_epoch: u64,
    /// The generation the node's coordinator writer holds keys for (none: no coordinator).
    pub coordinator_key_gen: Option<u32>,
}

impl RotationState {
    /// One line of JSON (the control interface's `KEYGEN`).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "epoch": self.epoch,
            "key_gen_newest": self.key_gen_newest,
            "key_gen_in_force": self.key_gen_in_force,
            "from_epoch": self.from_epoch,
            "coordinator_key_gen": self.coordinator_key_gen,
        })
    }
}
