//! [`NodeKv`]: the sandbox's host API over a `psl_node::Node`.

use psl_node::Node;
use psl_sandbox::{HostError, KvHost};
use std::sync::Arc;
use std::time::Duration;

pub struct NodeKv {
    pub node: Arc<Node>,
    /// How long `sync()` may wait for a covering SYNC before failing.
    pub sync_timeout: Duration,
}

impl KvHost for NodeKv {
    fn put(&self, key: &str, value: &str) -> Result<(), HostError> {
        self.node.put(key.as_bytes(), value.as_bytes()).map_err(|e| HostError(e.to_string()))
    }
    fn get(&self, key: &str) -> Result<Option<String>, HostError> {
        if key.is_empty() {
            return Err(HostError("key is empty".into()));
        }
        Ok(self.node.get(key.as_bytes()).map(|v| String::from_utf8_lossy(&v).into_owned()))
    }
    fn del(&self, key: &str) -> Result<(), HostError> {
        self.node.delete(key.as_bytes()).map_err(|e| HostError(e.to_string()))
    }
    fn sync(&self) -> Result<(), HostError> {
        self.node.sync(self.sync_timeout).map_err(|e| HostError(e.to_string()))
    }
}
