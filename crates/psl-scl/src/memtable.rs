//! The memtable: a concurrent map from key to the newest value under the total order
//! `(lamport, writer)`. Applying is a last-writer-wins register per key, so the order in which
//! a node applies updates does not matter: every node that has applied the same set of updates
//! holds the same map (convergence), and every node sees one order per key (coherence).
//! Deletes leave tombstones so that an older put arriving later cannot resurrect a key.

use parking_lot::RwLock;
use psl_crypto::{sha256, Hash256};
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// The version of a value: compared by Lamport time, then by writer index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Version {
    pub lamport: u64,
    pub writer: u32,
}

/// What the memtable holds for a key: a value, or a tombstone (`None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub version: Version,
    pub value: Option<Arc<[u8]>>,
}

const SHARDS: usize = 64;

/// A sharded, concurrent LWW map.
pub struct Memtable {
    shards: Vec<RwLock<FxHashMap<Box<[u8]>, Entry>>>,
}

impl Default for Memtable {
    fn default() -> Self {
        Memtable { shards: (0..SHARDS).map(|_| RwLock::new(FxHashMap::default())).collect() }
    }
}

impl std::fmt::Debug for Memtable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Memtable({} keys)", self.len())
    }
}

/// Which shard (and, elsewhere, which writer actor) a key belongs to.
pub fn key_shard(key: &[u8], n: usize) -> usize {
    let mut h = rustc_hash::FxHasher::default();
    key.hash(&mut h);
    (h.finish() as usize) % n.max(1)
}

impl Memtable {
    pub fn new() -> Memtable {
        Memtable::default()
    }

    fn shard(&self, key: &[u8]) -> &RwLock<FxHashMap<Box<[u8]>, Entry>> {
        &self.shards[key_shard(key, SHARDS)]
    }

    /// The live value of `key` (none if absent or deleted).
    pub fn get(&self, key: &[u8]) -> Option<Arc<[u8]>> {
        self.shard(key).read().get(key).and_then(|e| e.value.clone())
    }

    /// The entry of `key`, tombstones included.
    pub fn entry(&self, key: &[u8]) -> Option<Entry> {
        self.shard(key).read().get(key).cloned()
    }

    /// Applies an update if `version` is newer than what the key holds. Returns whether it did.
    pub fn apply(&self, key: &[u8], version: Version, value: Option<Arc<[u8]>>) -> bool {
        let mut s = self.shard(key).write();
        match s.get_mut(key) {
            Some(e) if e.version >= version => false,
            Some(e) => {
                *e = Entry { version, value };
                true
            }
            None => {
                s.insert(key.into(), Entry { version, value });
                true
            }
        }
    }

    /// Keys with a live value.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read().values().filter(|e| e.value.is_some()).count()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every entry (tombstones included), ordered by key.
    pub fn snapshot(&self) -> BTreeMap<Vec<u8>, Entry> {
        let mut out = BTreeMap::new();
        for s in &self.shards {
            for (k, e) in s.read().iter() {
                out.insert(k.to_vec(), e.clone());
            }
        }
        out
    }

    /// A digest of the live contents (key, value, version), equal on two memtables exactly when
    /// they hold the same live entries.
    pub fn digest(&self) -> Hash256 {
        let snap = self.snapshot();
        let mut acc = Vec::with_capacity(snap.len() * 64);
        for (k, e) in &snap {
            if let Some(v) = &e.value {
                acc.extend_from_slice(&(k.len() as u32).to_le_bytes());
                acc.extend_from_slice(k);
                acc.extend_from_slice(&(v.len() as u32).to_le_bytes());
                acc.extend_from_slice(v);
                acc.extend_from_slice(&e.version.lamport.to_le_bytes());
                acc.extend_from_slice(&e.version.writer.to_le_bytes());
            }
        }
        sha256(&[&acc])
    }

    /// Forgets everything (RESET). The maps are dropped, not merely emptied.
    pub fn clear(&self) {
        for s in &self.shards {
            *s.write() = FxHashMap::default();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn v(l: u64, w: u32) -> Version {
        Version { lamport: l, writer: w }
    }

    #[test]
    fn newer_wins_and_tombstones_stick() {
        let m = Memtable::new();
        assert!(m.apply(b"k", v(2, 1), Some(b"a"[..].into())));
        assert!(!m.apply(b"k", v(1, 9), Some(b"old"[..].into())));
        assert!(m.apply(b"k", v(2, 2), Some(b"b"[..].into())));
        assert_eq!(m.get(b"k").as_deref(), Some(&b"b"[..]));
        assert!(m.apply(b"k", v(3, 0), None));
        assert_eq!(m.get(b"k"), None);
        assert!(!m.apply(b"k", v(2, 5), Some(b"zombie"[..].into())));
        assert_eq!(m.get(b"k"), None);
        assert_eq!(m.len(), 0);
    }

    proptest! {
        /// Applying the same updates in any order gives the same memtable.
        #[test]
        fn order_does_not_matter(ops in proptest::collection::vec((0u8..8, 0u64..20, 0u32..4, proptest::option::of(0u8..255)), 0..60), seed in any::<u64>()) {
            let a = Memtable::new();
            let b = Memtable::new();
            for (k, l, w, val) in &ops {
                a.apply(&[*k], v(*l, *w), val.map(|x| Arc::from(vec![x])));
            }
            let mut shuffled = ops.clone();
            let mut s = seed;
            for i in (1..shuffled.len()).rev() {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                shuffled.swap(i, (s >> 33) as usize % (i + 1));
            }
            for (k, l, w, val) in &shuffled {
                b.apply(&[*k], v(*l, *w), val.map(|x| Arc::from(vec![x])));
            }
            // Equal versions with different values cannot come from honest writers; compare
            // only when versions are unique.
            let mut seen = std::collections::HashSet::new();
            if ops.iter().all(|(k, l, w, _)| seen.insert((*k, *l, *w))) {
                prop_assert_eq!(a.snapshot(), b.snapshot());
                prop_assert_eq!(a.digest(), b.digest());
            }
        }
    }
}
