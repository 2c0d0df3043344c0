//! What the core thread is sent (`CoreMsg`: by the writer actors, the verify actors, the
//! dispatcher and the API) and the rotation state it answers with: shared by `core`, `actor`
//! and `node` without tying them in a circle.

use crossbeam_channel::Sender;
use psl_capsule::{Body, Opened, Record, Verified};
use psl_scl::{DurableStatus, Msg, QuorumDurable, RejectReason};
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
        reply: Sender<Result<QuorumDurable, DurableStatus>>,
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
    Rotate(Box<Rotation>, Sender<Result<RotationState, String>>),
    /// The rotation state (epoch, key generations), for debug lines and the leader.
    RotationState(Sender<RotationState>),
    /// A key statement from the leader (a revocation): installed, announced, and carried into
    /// the log by this node's coordinator, if it runs one.
    Statement(Vec<psl_capsule::KeyStatement>, Sender<Result<u64, String>>),
    /// The next seq this node expects of a writer (how far it has applied that writer's chain).
    NextSeq(u32, Sender<u64>),
    Stop,
}

pub use psl_scl::engine::{Rotation, RotationState};

/// A rotation state as one line of JSON (the control interface's `KEYGEN`).
pub(crate) fn rotation_json(st: &RotationState) -> serde_json::Value {
    serde_json::json!({
        "epoch": st.epoch,
        "key_gen_newest": st.key_gen_newest,
        "key_gen_in_force": st.key_gen_in_force,
        "from_epoch": st.from_epoch,
        "coordinator_key_gen": st.coordinator_key_gen,
    })
}
