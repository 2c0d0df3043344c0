//! Memory accounting with LRU eviction of this front end's local copies.
//!
//! Sharded by key hash: each shard keeps its keys in recency order with their sizes and owns
//! `limit / SHARDS` bytes. Going over returns the least recently used keys of that shard as
//! victims; the front end then drops its local copy of each (see `FrontEnd::evict`).
//!
//! Reads do not take a shard lock on every hit. Like memcached (which bumps a fetched item at
//! most once per interval and marks it active otherwise), a read moves its key to the front at
//! most once a second; in between it only stamps the key's slot in a lock-free array of read
//! times (by key hash). Eviction gives a victim read since it was last moved a second chance
//! (it goes back to the front). A key sharing a slot with a read key may get an undeserved
//! second chance: recency is approximate, as in memcached.

use lru::LruCache;
use parking_lot::Mutex;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

const SHARDS: usize = 32;

/// Bytes accounted per item besides key and value (the memtable entry, the LRU node).
pub const ITEM_OVERHEAD: u64 = 64;

/// Slots of the read-time array (a power of two).
const READ_SLOTS: usize = 1 << 16;
/// A read moves its key to the front at most this often.
const BUMP_US: u64 = 1_000_000;

pub struct Lru {
    shards: Vec<Mutex<Shard>>,
    shard_limit: u64,
    /// Last read of a key of each slot, in µs since `start`, 0 = never.
    read_us: Box<[AtomicU64]>,
    start: Instant,
}

/// An accounted key: its bytes, and when it was last moved to the front (µs since start).
#[derive(Clone, Copy)]
struct Slot {
    size: u64,
    moved_us: u64,
}

struct Shard {
    map: LruCache<Box<[u8]>, Slot>,
    bytes: u64,
}

/// A key evicted from the accounting, with the bytes it was accounted for.
pub type Victim = (Box<[u8]>, u64);

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
            read_us: (0..READ_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            start: Instant::now(),
        }
    }

    /// Microseconds since start, never 0.
    fn now_us(&self) -> u64 {
        self.start.elapsed().as_micros() as u64 + 1
    }

    fn read_slot(&self, key: &[u8]) -> &AtomicU64 {
        &self.read_us[key_hash(key) as usize & (READ_SLOTS - 1)]
    }

    fn shard(&self, key: &[u8]) -> &Mutex<Shard> {
        &self.shards[(key_hash(key) >> 7) as usize % SHARDS]
    }

    /// Records that `key` now holds an item of `size` bytes and is the most recently used.
    /// Returns the keys evicted to stay under the limit (never `key` itself unless it alone is
    /// over the shard's share).
    pub fn put(&self, key: &[u8], size: u64) -> Vec<Victim> {
        self.put_at(key, size, self.now_us())
    }

    fn put_at(&self, key: &[u8], size: u64, now: u64) -> Vec<Victim> {
        let size = size + ITEM_OVERHEAD + key.len() as u64;
        let mut s = self.shard(key).lock();
        match s.map.get_mut(key) {
            Some(old) => {
                let prev = std::mem::replace(old, Slot { size, moved_us: now });
                s.bytes = s.bytes - prev.size + size;
            }
            None => {
                s.map.put(key.into(), Slot { size, moved_us: now });
                s.bytes += size;
            }
        }
        let mut victims = Vec::new();
        // Each key gets at most one second chance per pass (its `moved_us` becomes its last
        // read), so the loop ends; the bound is a second guard.
        let mut budget = 2 * s.map.len() + 1;
        while s.bytes > self.shard_limit && s.map.len() > 1 && budget > 0 {
            budget -= 1;
            let Some((k, slot)) = s.map.pop_lru() else { break };
            let read = self.read_slot(&k).load(Ordering::Relaxed);
            if read > slot.moved_us && k[..] != *key {
                s.map.put(k, Slot { size: slot.size, moved_us: read });
                continue;
            }
            s.bytes -= slot.size;
            victims.push((k, slot.size));
        }
        victims
    }

    /// A read hit: marks `key` recently used (moving it to the front at most once a second),
    /// or starts accounting for it (an item written through another front end and received
    /// by replication).
    pub fn touch(&self, key: &[u8], size: u64) -> Vec<Victim> {
        let now = self.now_us();
        let slot = self.read_slot(key);
        let last = slot.load(Ordering::Relaxed);
        slot.store(now, Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < BUMP_US {
            return Vec::new();
        }
        {
            let mut s = self.shard(key).lock();
            if let Some(v) = s.map.get_mut(key) {
                v.moved_us = now;
                s.map.promote(key);
                return Vec::new();
            }
        }
        self.put_at(key, size, now)
    }

    /// Whether `key` is accounted (not evicted since it was last written or read).
    pub fn contains(&self, key: &[u8]) -> bool {
        self.shard(key).lock().map.contains(key)
    }

    pub fn remove(&self, key: &[u8]) {
        let mut s = self.shard(key).lock();
        if let Some(v) = s.map.pop(key) {
            s.bytes -= v.size;
        }
    }

    /// (items, bytes) accounted now.
    pub fn totals(&self) -> (u64, u64) {
        self.shards.iter().fold((0, 0), |(i, b), s| {
            let s = s.lock();
            (i + s.map.len() as u64, b + s.bytes)
        })
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
        let size = 300 + ITEM_OVERHEAD + keys[1].len() as u64;
        assert_eq!(v, vec![(keys[1].clone().into_boxed_slice(), size)]);
        assert!(!lru.contains(&keys[1]) && lru.contains(&keys[2]));
        assert_eq!(lru.totals().0, 2);
        lru.remove(&keys[0]);
        assert_eq!(lru.totals().0, 1);
    }

    #[test]
    fn a_key_read_since_it_was_last_moved_gets_a_second_chance() {
        let lru = Lru::new(SHARDS as u64 * 1000);
        let keys: Vec<Vec<u8>> = (0..10_000u32)
            .map(|i| format!("k{i}").into_bytes())
            .filter(|k| ((key_hash(k) >> 7) as usize).is_multiple_of(SHARDS))
            .take(6)
            .collect();
        let victim = |i: usize| vec![(keys[i].clone().into_boxed_slice(), 300 + ITEM_OVERHEAD + keys[i].len() as u64)];
        lru.put(&keys[0], 300);
        lru.put(&keys[1], 300);
        assert!(lru.touch(&keys[0], 300).is_empty()); // moved to the front
        assert_eq!(lru.put(&keys[2], 300), victim(1));
        std::thread::sleep(std::time::Duration::from_millis(3));
        assert!(lru.touch(&keys[0], 300).is_empty()); // within a second: only stamped
                                                      // keys[0] is at the back but was read since it was moved: keys[2] goes instead.
        assert_eq!(lru.put(&keys[3], 300), victim(2));
        assert_eq!(lru.put(&keys[4], 300), victim(3));
        // Unread since its second chance, keys[0] goes next.
        assert_eq!(lru.put(&keys[5], 300), victim(0));
    }
}
