//! Memory accounting with LRU eviction of this front end's local copies.
//!
//! Sharded by key hash: each shard keeps its keys in recency order with their sizes and owns
//! `limit / SHARDS` bytes. Going over returns the least recently used keys of that shard as
//! victims; the front end then drops its local copy of each (see `FrontEnd::evict`).

use lru::LruCache;
use parking_lot::Mutex;
use std::hash::{Hash, Hasher};

const SHARDS: usize = 32;

/// Bytes accounted per item besides key and value (the memtable entry, the LRU node).
pub const ITEM_OVERHEAD: u64 = 64;

pub struct Lru {
    shards: Vec<Mutex<Shard>>,
    shard_limit: u64,
}

struct Shard {
    map: LruCache<Box<[u8]>, u64>,
    bytes: u64,
}

pub fn key_hash(key: &[u8]) -> u64 {
    let mut h = rustc_hash::FxHasher::default();
    key.hash(&mut h);
    h.finish()
}

impl Lru {
    pub fn new(limit: u64) -> Lru {
        Lru {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard { map: LruCache::unbounded(), bytes: 0 })).collect(),
            shard_limit: (limit / SHARDS as u64).max(1),
        }
    }

    fn shard(&self, key: &[u8]) -> &Mutex<Shard> {
        &self.shards[(key_hash(key) >> 7) as usize % SHARDS]
    }

    /// Records that `key` now holds an item of `size` bytes and is the most recently used.
    /// Returns the keys evicted to stay under the limit (never `key` itself unless it alone is
    /// over the shard's share).
    pub fn put(&self, key: &[u8], size: u64) -> Vec<Box<[u8]>> {
        let size = size + ITEM_OVERHEAD + key.len() as u64;
        let mut s = self.shard(key).lock();
        match s.map.get_mut(key) {
            Some(old) => {
                let prev = std::mem::replace(old, size);
                s.bytes = s.bytes - prev + size;
            }
            None => {
                s.map.put(key.into(), size);
                s.bytes += size;
            }
        }
        let mut victims = Vec::new();
        while s.bytes > self.shard_limit && s.map.len() > 1 {
            match s.map.pop_lru() {
                Some((k, sz)) => {
                    s.bytes -= sz;
                    victims.push(k);
                }
                None => break,
            }
        }
        victims
    }

    /// A read hit: marks `key` most recently used, or starts accounting for it (an item
    /// written through another front end and received by replication).
    pub fn touch(&self, key: &[u8], size: u64) -> Vec<Box<[u8]>> {
        {
            let mut s = self.shard(key).lock();
            if s.map.promote(key) {
                return Vec::new();
            }
        }
        self.put(key, size)
    }

    pub fn remove(&self, key: &[u8]) {
        let mut s = self.shard(key).lock();
        if let Some(sz) = s.map.pop(key) {
            s.bytes -= sz;
        }
    }

    /// (items, bytes) accounted now.
    pub fn totals(&self) -> (u64, u64) {
        self.shards.iter().fold((0, 0), |(i, b), s| {
            let s = s.lock();
            (i + s.map.len() as u64, b + s.bytes)
        })
    }

    pub fn clear(&self) {
        for s in &self.shards {
            let mut s = s.lock();
            s.map.clear();
            s.bytes = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_least_recently_used() {
        let lru = Lru::new(SHARDS as u64 * 1000);
        // Find keys in one shard.
        let keys: Vec<Vec<u8>> = (0..10_000u32)
            .map(|i| format!("k{i}").into_bytes())
            .filter(|k| ((key_hash(k) >> 7) as usize).is_multiple_of(SHARDS))
            .take(4)
            .collect();
        assert!(lru.put(&keys[0], 300).is_empty());
        assert!(lru.put(&keys[1], 300).is_empty());
        assert!(lru.touch(&keys[0], 300).is_empty());
        let v = lru.put(&keys[2], 300);
        assert_eq!(v, vec![keys[1].clone().into_boxed_slice()]);
        assert_eq!(lru.totals().0, 2);
        lru.remove(&keys[0]);
        assert_eq!(lru.totals().0, 1);
    }
}
