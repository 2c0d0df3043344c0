//! The capability a lambda gets: a key-value store behind [`KvHost`].

use crate::value::KvValue;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::time::Duration;

/// A failed host call. The message is shown to the lambda (as a thrown `Error`), so it must
/// never carry a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// The host call failed for any other reason; the string is the message the lambda sees.
    #[error("{0}")]
    Failed(String),
    /// A durability wait ended before a quorum of capsule servers acked every earlier write:
    /// the lambda sees a `DurabilityError` with these numbers.
    #[error("{message}")]
    NotDurable {
        /// The full explanation, shown as the error's message.
        message: String,
        /// How many capsule servers acked every earlier write before the wait ended.
        acked_by: usize,
        /// How many servers must ack (f + 1 of the `servers`).
        quorum: usize,
        /// How many capsule servers the job has (2f + 1).
        servers: u32,
    },
}

impl HostError {
    /// A [`HostError::Failed`] carrying `e`'s display text.
    pub fn failed(e: impl std::fmt::Display) -> HostError {
        HostError::Failed(e.to_string())
    }
}

/// One key's value as read, with its version: the record version `(lamport, writer)` that
/// wrote it, by which the store resolves concurrent writes (the highest wins).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvEntry {
    /// The key, as the lambda wrote it.
    pub key: String,
    /// The live value.
    pub value: KvValue,
    /// Lamport time of the record that wrote the value (first part of the version).
    pub lamport: u64,
    /// Writer id of the record that wrote the value (breaks Lamport ties).
    pub writer: u32,
}

/// The store a lambda reads and writes. Implementations must be safe to call from the
/// lambda's thread and must bound their own waits (`sync` and `sync_durable` in particular).
pub trait KvHost: Send + Sync {
    /// Writes `value` under `key`; a later `get` here sees it. Not durable until `sync_durable`.
    fn put(&self, key: &str, value: &KvValue) -> Result<(), HostError>;
    /// The key's live value with its version; `None` if absent or deleted.
    fn get(&self, key: &str) -> Result<Option<KvEntry>, HostError>;
    /// Deletes `key`; deleting an absent key is not an error.
    fn del(&self, key: &str) -> Result<(), HostError>;
    /// Barrier: returns once the writes of every lambda made before the call are visible here.
    fn sync(&self) -> Result<(), HostError>;
    /// Durability barrier: returns once every write this lambda made before the call is stored
    /// by a quorum (f + 1 of 2f + 1) of capsule servers; fails with
    /// [`HostError::NotDurable`] after `timeout`.
    fn sync_durable(&self, timeout: Duration) -> Result<(), HostError>;
    /// Live entries whose key starts with `prefix` and is above `after`, in key order, at most
    /// `limit` (the implementation may return fewer to keep an answer's bytes bounded; asking
    /// again after the last key returned continues).
    fn scan(&self, prefix: &str, after: Option<&str>, limit: usize) -> Result<Vec<KvEntry>, HostError>;
    /// Writes `ops` (key and value; `None`: a delete) atomically: every reader, here and on
    /// every other node, sees all of them or none. On an error none was written. At most
    /// [`BATCH_OPS_MAX`] ops (the caller checks).
    fn batch(&self, ops: &[(String, Option<KvValue>)]) -> Result<(), HostError>;
}

/// Most ops in one atomic `batch`.
pub const BATCH_OPS_MAX: usize = 256;

/// A [`KvHost`] over an in-memory map shared by every lambda that holds it (tests, examples
/// without a cluster). `sync` is a no-op: the map is already coherent. Nothing is durable:
/// `sync_durable` fails. Versions count the map's writes (writer 0).
#[derive(Debug, Default)]
pub struct MapHost {
    map: Mutex<(u64, BTreeMap<String, KvEntry>)>,
}

impl MapHost {
    /// An empty map.
    pub fn new() -> MapHost {
        MapHost::default()
    }

    /// Every live value, by key.
    pub fn snapshot(&self) -> BTreeMap<String, KvValue> {
        self.map.lock().1.iter().map(|(k, e)| (k.clone(), e.value.clone())).collect()
    }
}

impl KvHost for MapHost {
    fn put(&self, key: &str, value: &KvValue) -> Result<(), HostError> {
        if key.is_empty() {
            return Err(HostError::Failed("key is empty".into()));
        }
        let mut g = self.map.lock();
        g.0 += 1;
        let lamport = g.0;
        g.1.insert(key.to_string(), KvEntry { key: key.to_string(), value: value.clone(), lamport, writer: 0 });
        Ok(())
    }
    fn get(&self, key: &str) -> Result<Option<KvEntry>, HostError> {
        Ok(self.map.lock().1.get(key).cloned())
    }
    fn del(&self, key: &str) -> Result<(), HostError> {
        self.map.lock().1.remove(key);
        Ok(())
    }
    fn sync(&self) -> Result<(), HostError> {
        Ok(())
    }
    fn sync_durable(&self, _timeout: Duration) -> Result<(), HostError> {
        Err(HostError::Failed("this store keeps values in memory only: nothing can be made durable".into()))
    }
    fn batch(&self, ops: &[(String, Option<KvValue>)]) -> Result<(), HostError> {
        if ops.iter().any(|(k, _)| k.is_empty()) {
            return Err(HostError::Failed("key is empty".into()));
        }
        // One lock for the whole batch: no reader sees part of it.
        let mut g = self.map.lock();
        for (key, value) in ops {
            match value {
                Some(v) => {
                    g.0 += 1;
                    let lamport = g.0;
                    g.1.insert(key.clone(), KvEntry { key: key.clone(), value: v.clone(), lamport, writer: 0 });
                }
                None => {
                    g.1.remove(key);
                }
            }
        }
        Ok(())
    }
    fn scan(&self, prefix: &str, after: Option<&str>, limit: usize) -> Result<Vec<KvEntry>, HostError> {
        let g = self.map.lock();
        Ok(g.1
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .filter(|(k, _)| after.is_none_or(|a| k.as_str() > a))
            .take(limit)
            .map(|(_, e)| e.clone())
            .collect())
    }
}
