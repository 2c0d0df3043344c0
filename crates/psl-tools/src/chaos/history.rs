//! What the clients saw (the history) and what the runner observed at the end (the finals):
//! the checker's input. Plain data, recorded by the runner, serialisable for a failure report.

use serde::Serialize;
use std::collections::BTreeMap;

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Outcome {
    /// Acknowledged (`OK`).
    Ok,
    /// No answer (the connection broke or timed out): it may or may not have taken effect.
    Unknown,
    /// Refused (`ERROR ...`): it did not take effect.
    Failed,
}

/// A `PUT` or `DEL` by a node client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WriteEvent {
    pub client: u8,
    /// One connection to the client's node; a broken connection (the node was killed or the
    /// client gave up waiting) starts a new session.
    pub session: u32,
    /// Position in the client's program order (over all its sessions).
    pub index: usize,
    pub key: String,
    /// `None`: a delete.
    pub value: Option<String>,
    pub outcome: Outcome,
    /// When it was sent, in ms since the run began.
    pub at_ms: u64,
}

/// A `SYNC_DURABLE` acknowledged: every write of `session` with index below `upto` that was
/// acknowledged is on f + 1 servers' disks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DurableEvent {
    pub client: u8,
    pub session: u32,
    pub upto: usize,
    pub at_ms: u64,
}

/// A version the client's own node showed (`DUMP`) for a key right after a `SYNC_DURABLE`, when
/// the value was the client's own durable write: that write's version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VersionSeen {
    pub key: String,
    pub value: String,
    pub lamport: u64,
    pub writer: u32,
}

/// A `GET`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReadEvent {
    pub client: u8,
    pub session: u32,
    pub node: u8,
    /// On the client's own node, in its session (read-your-writes applies).
    pub own: bool,
    pub key: String,
    /// `Ok(None)`: not found; `Err`: refused or no answer.
    pub got: Result<Option<String>, String>,
    /// Writes the client had issued before the read (program position).
    pub after_index: usize,
    /// When the answer arrived, in ms since the run began.
    pub at_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum CasOutcome {
    Stored,
    Exists,
    NotFound,
    /// SERVER_ERROR, a broken connection, a timeout: it may or may not have been applied.
    Unknown,
}

/// One `gets` + `cas` attempt of a counter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CasEvent {
    pub client: u8,
    pub front: u8,
    pub key: String,
    /// What `gets` returned: (value, unique).
    pub read_value: String,
    pub read_unique: u64,
    /// The token this attempt appends (`<value>,<token>` is written).
    pub token: String,
    pub outcome: CasOutcome,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct History {
    pub writes: Vec<WriteEvent>,
    pub durables: Vec<DurableEvent>,
    pub versions: Vec<VersionSeen>,
    pub reads: Vec<ReadEvent>,
    pub cas: Vec<CasEvent>,
}

impl History {
    pub fn merge(&mut self, o: History) {
        self.writes.extend(o.writes);
        self.durables.extend(o.durables);
        self.versions.extend(o.versions);
        self.reads.extend(o.reads);
        self.cas.extend(o.cas);
    }
}

/// A node's logical state at the end: every key's value (`None`: absent), read with `GET`
/// (so that keys a bounded memtable evicted are read back through CapsuleDB).
pub type KvState = BTreeMap<String, Option<String>>;

/// A node's DUMP: key -> (value, lamport, writer).
pub type Versions = BTreeMap<String, (String, u64, u32)>;

/// Every `(key, value)` put a server's stored records carry, or why it could not be read.
pub type ServerPuts = Result<std::collections::HashSet<(String, String)>, String>;

/// A counter as one front end read it: (front, value or error).
pub type CounterRead = (String, Result<Option<String>, String>);

/// What the runner observed after the faults were healed.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Finals {
    /// Each live node's state: (label, state, or why it could not be read).
    pub nodes: Vec<(String, Result<KvState, String>)>,
    /// DUMP of the unbounded node: key -> (value, lamport, writer).
    pub versions: Versions,
    /// Fresh nodes recovered from f + 1 servers each: (which servers, state or error, DUMP
    /// versions).
    pub recovered: Vec<(String, Result<KvState, String>, Versions)>,
    /// Per server, every `(key, value)` put its stored records carry (decrypted), or why the
    /// server could not be read.
    pub server_puts: Vec<(String, ServerPuts)>,
    /// Counters read at the end on every front end: key -> [(front, value or error)].
    pub counters: BTreeMap<String, Vec<CounterRead>>,
    /// Memory: (process, what, value, bound).
    pub memory: Vec<(String, String, u64, u64)>,
    /// Store checks: (what, clean, detail).
    pub stores: Vec<(String, bool, String)>,
    /// Processes that exited although the schedule did not kill them.
    pub unexpected_exits: Vec<String>,
    /// A `SYNC_DURABLE` on each node after the heal: (node, error) for those that failed.
    pub stuck: Vec<(String, String)>,
    /// What the nemesis could not do as scheduled (a failed restart, ...): (step, why).
    pub nemesis_errors: Vec<(String, String)>,
    /// `--byzantine`: the attack and what the deployment holds of it.
    pub byzantine: Option<super::byzantine::ByzFinals>,
}
