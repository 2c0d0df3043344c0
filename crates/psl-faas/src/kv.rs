//! [`NodeKv`]: the sandbox's host API over a `psl_node::Node`.
//!
//! Values are stored in the layout of `psl_sandbox::value` (SecureCached's item, the kind in
//! the client flags). Reads go through the memtable and, on a node with CapsuleDB, through
//! CapsuleDB for what the memtable evicted; each comes with its record version. A durable
//! wait is `Node::sync_durable`: every write this worker's node accepted before the call (so
//! every earlier write of the lambda) acked by a quorum of the job's capsule servers.

use psl_node::{Node, NodeError};
use psl_sandbox::value::{decode, encode, unix_now, Decoded};
use psl_sandbox::{HostError, KvEntry, KvHost, KvValue};
use std::sync::Arc;
use std::time::Duration;

/// Most bytes (keys and payloads) one scan hands a lambda; a scan stops early past it, and
/// the lambda continues with `after` set to the last key it got.
pub const SCAN_BYTES_MAX: usize = 8 << 20;

/// The sandbox's KV host (`psl_sandbox::KvHost`) over a worker's node: reads and writes of
/// the lambdas go to the job's capsule through it.
pub struct NodeKv {
    /// The worker's node for the job.
    pub node: Arc<Node>,
    /// How long `sync()` may wait for a covering SYNC before failing.
    pub sync_timeout: Duration,
}

fn host_err(e: NodeError) -> HostError {
    match e {
        NodeError::DurableTimeout { acked_by, quorum, servers, .. } => {
            HostError::NotDurable { message: e.to_string(), acked_by, quorum, servers }
        }
        NodeError::NoServers => {
            HostError::Failed("this job has no capsule servers: nothing can be made durable".into())
        }
        e => HostError::failed(e),
    }
}

/// A stored entry as the lambda sees it; `None` for a tombstone or an expired item.
fn entry(key: &[u8], e: psl_scl::Entry, now_s: i64) -> Option<KvEntry> {
    let value = match decode(e.value.as_deref()?, now_s) {
        Decoded::Value(v) => v,
        Decoded::Expired => return None,
    };
    Some(KvEntry {
        key: String::from_utf8_lossy(key).into_owned(),
        value,
        lamport: e.version.lamport,
        writer: e.version.writer,
    })
}

impl KvHost for NodeKv {
    fn put(&self, key: &str, value: &KvValue) -> Result<(), HostError> {
        self.node.put(key.as_bytes(), &encode(value, unix_now().1)).map_err(host_err)
    }
    fn get(&self, key: &str) -> Result<Option<KvEntry>, HostError> {
        if key.is_empty() {
            return Err(HostError::Failed("key is empty".into()));
        }
        let e = self.node.try_entry(key.as_bytes()).map_err(host_err)?;
        Ok(e.and_then(|e| entry(key.as_bytes(), e, unix_now().0)))
    }
    fn del(&self, key: &str) -> Result<(), HostError> {
        self.node.delete(key.as_bytes()).map_err(host_err)
    }
    fn sync(&self) -> Result<(), HostError> {
        self.node.sync(self.sync_timeout).map_err(host_err)
    }
    fn sync_durable(&self, timeout: Duration) -> Result<(), HostError> {
        self.node.sync_durable(timeout).map_err(host_err)
    }
    fn batch(&self, ops: &[(String, Option<KvValue>)]) -> Result<(), HostError> {
        let now = unix_now().1;
        let encoded: Vec<(&[u8], Option<Vec<u8>>)> =
            ops.iter().map(|(k, v)| (k.as_bytes(), v.as_ref().map(|v| encode(v, now)))).collect();
        let writes: Vec<(&[u8], Option<&[u8]>)> = encoded.iter().map(|(k, v)| (*k, v.as_deref())).collect();
        self.node.write_batch(&writes, u64::MAX).map(|_| ()).map_err(host_err)
    }
    fn scan(&self, prefix: &str, after: Option<&str>, limit: usize) -> Result<Vec<KvEntry>, HostError> {
        let found = self.node.scan(prefix.as_bytes(), after.map(str::as_bytes), limit).map_err(host_err)?;
        let now = unix_now().0;
        let mut out = Vec::with_capacity(found.len());
        let mut bytes = 0;
        for (k, e) in found {
            let Some(e) = entry(&k, e, now) else { continue };
            bytes += e.key.len() + e.value.payload_len();
            if !out.is_empty() && bytes > SCAN_BYTES_MAX {
                break;
            }
            out.push(e);
        }
        Ok(out)
    }
}
