//! The capability a lambda gets: a key-value store behind [`KvHost`].

use parking_lot::Mutex;
use std::collections::BTreeMap;

/// A failed host call. The message is shown to the lambda (as a thrown `Error`), so it must
/// never carry a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct HostError(pub String);

/// The store a lambda reads and writes. Implementations must be safe to call from the
/// lambda's thread and must bound their own waits (`sync` in particular).
pub trait KvHost: Send + Sync {
    fn put(&self, key: &str, value: &str) -> Result<(), HostError>;
    fn get(&self, key: &str) -> Result<Option<String>, HostError>;
    fn del(&self, key: &str) -> Result<(), HostError>;
    /// Barrier: returns once the writes of every lambda made before the call are visible here.
    fn sync(&self) -> Result<(), HostError>;
}

/// A [`KvHost`] over an in-memory map shared by every lambda that holds it (tests, examples
/// without a cluster). `sync` is a no-op: the map is already coherent.
#[derive(Debug, Default)]
pub struct MapHost {
    map: Mutex<BTreeMap<String, String>>,
}

impl MapHost {
    pub fn new() -> MapHost {
        MapHost::default()
    }

    pub fn snapshot(&self) -> BTreeMap<String, String> {
        self.map.lock().clone()
    }
}

impl KvHost for MapHost {
    fn put(&self, key: &str, value: &str) -> Result<(), HostError> {
        if key.is_empty() {
            return Err(HostError("key is empty".into()));
        }
        self.map.lock().insert(key.to_string(), value.to_string());
        Ok(())
    }
    fn get(&self, key: &str) -> Result<Option<String>, HostError> {
        Ok(self.map.lock().get(key).cloned())
    }
    fn del(&self, key: &str) -> Result<(), HostError> {
        self.map.lock().remove(key);
        Ok(())
    }
    fn sync(&self) -> Result<(), HostError> {
        Ok(())
    }
}
