//! Memory accounting with LRU eviction of this front end's local copies.
//!
//! Sharded by key hash: each shard keeps its keys in recency order with their sizes and owns
//! `limit / SHARDS` bytes. Going over returns the least recently used keys of that shard as
//! victims; the front end then drops its local copy of each (see `FrontEnd::evict`).
//!
//! Reads do not take a shard lock on every hit. Like memcached (which bumps a fetched item at
//! most once per interval and marks it active otherwise), a read moves its key to the front
//! only if the key had not been read for a second; otherwise the read only leaves a stamp.
//! The stamp lives in the key's memtable slot (`Memtable::entry_read`), which the read fetches
//! anyway, so a hit costs no memory access beyond the lookup. It belongs to the entry's
//! version (a newer version starts at 0), so the first read of every version takes the shard
//! lock: it finds the key accounted (written here: moved to the front) or accounts for it
//! (written elsewhere and received, or back after an eviction). Eviction gives a victim read
//! since it was last moved a second chance (it goes back to the front). The caller passes the
//! clock (microseconds since the epoch, never 0) and, on eviction, each key's read stamp.

use lru::LruCache;
use parking_lot::Mutex;
use psl_scl::memtable::spread;
use psl_scl::InlineKey;
use std::hash::{Hash, Hasher};

const SHARDS: usize = 32;

/// Bytes accounted per item besides key and value (the memtable entry, the LRU node).
pub const ITEM_OVERHEAD: u64 = 64;

/// A read moves its key to the front only if the key was not read for this long.
pub const BUMP_US: u64 = 1_000_000;

pub struct Lru {
    shards: Vec<Mutex<Shard>>,
    shard_limit: u64,
}

/// An accounted key: its bytes, and when it was last moved to the front (µs).
#[derive(Clone, Copy)]
struct Slot {
    size: u64,
    moved_us: u64,
}

struct Shard {
    map: LruCache<InlineKey, Slot, rustc_hash::FxBuildHasher>,
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
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard { map: LruCache::unbounded_with_hasher(rustc_hash::FxBuildHasher), bytes: 0 })
                })
                .collect(),
            shard_limit: (limit / SHARDS as u64).max(1),
        }
    }

    fn shard(&self, key: &[u8]) -> &Mutex<Shard> {
        &self.shards[spread(key_hash(key), SHARDS)]
    }

    /// Records that `key` now holds an item of `size` bytes and is the most recently used
    /// (at `now_us`). Returns the keys evicted to stay under the limit (never `key` itself
    /// unless it alone is over the shard's share); `read_us` gives a key's last read stamp.
    pub fn put(&self, key: &[u8], size: u64, now_us: u64, read_us: &dyn Fn(&[u8]) -> u64) -> Vec<Victim> {
        let size = size + ITEM_OVERHEAD + key.len() as u64;
        let mut s = self.shard(key).lock();
        // One probe: `put` replaces (and moves to the front) or inserts.
        if let Some(prev) = s.map.put(key.into(), Slot { size, moved_us: now_us }) {
            s.bytes -= prev.size;
        }
        s.bytes += size;
        let mut victims = Vec::new();
        // Each key gets at most one second chance per pass (its `moved_us` becomes its last
        // read), so the loop ends; the bound is a second guard.
        let mut budget = 2 * s.map.len() + 1;
        while s.bytes > self.shard_limit && s.map.len() > 1 && budget > 0 {
            budget -= 1;
            let Some((k, slot)) = s.map.pop_lru() else { break };
            let read = read_us(&k);
            if read > slot.moved_us && *k != *key {
                s.map.put(k, Slot { size: slot.size, moved_us: read });
                continue;
            }
            s.bytes -= slot.size;
            victims.push((Box::from(&*k), slot.size));
        }
        victims
    }

    /// A read hit at `now_us` of a key last read at `prev_read_us` (0: never): moves it to
    /// the front if that was more than [`BUMP_US`] ago, or starts accounting for it (an item
    /// written through another front end and received by replication).
    pub fn touch(
        &self,
        key: &[u8],
        size: u64,
        prev_read_us: u64,
        now_us: u64,
        read_us: &dyn Fn(&[u8]) -> u64,
    ) -> Vec<Victim> {
        if prev_read_us != 0 && now_us.saturating_sub(prev_read_us) < BUMP_US {
            return Vec::new();
        }
        {
            let mut s = self.shard(key).lock();
            if let Some(v) = s.map.get_mut(key) {
                v.moved_us = now_us;
                s.map.promote(key);
                return Vec::new();
            }
        }
        self.put(key, size, now_us, read_us)
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
    use std::cell::RefCell;
    use std::collections::HashMap;

    /// Keys of one shard.
    fn keys(n: usize) -> Vec<Vec<u8>> {
        (0..10_000u32)
            .map(|i| format!("k{i}").into_bytes())
            .filter(|k| spread(key_hash(k), SHARDS) == 0)
            .take(n)
            .collect()
    }

    /// Read stamps as a memtable would keep them.
    #[derive(Default)]
    struct Reads(RefCell<HashMap<Vec<u8>, u64>>);

    impl Reads {
        /// Stamps `k` at `now`, returning the previous stamp.
        fn read(&self, k: &[u8], now: u64) -> u64 {
            self.0.borrow_mut().insert(k.to_vec(), now).unwrap_or(0)
        }
        fn of(&self, k: &[u8]) -> u64 {
            self.0.borrow().get(k).copied().unwrap_or(0)
        }
    }

    #[test]
    fn evicts_least_recently_used() {
        let lru = Lru::new(SHARDS as u64 * 1000);
        let keys = keys(4);
        let r = Reads::default();
        let f = |k: &[u8]| r.of(k);
        assert!(lru.put(&keys[0], 300, 1, &f).is_empty());
        assert!(lru.put(&keys[1], 300, 2, &f).is_empty());
        // A first read moves the key to the front.
        let prev = r.read(&keys[0], 3);
        assert!(lru.touch(&keys[0], 300, prev, 3, &f).is_empty());
        let v = lru.put(&keys[2], 300, 4, &f);
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
        let keys = keys(6);
        let r = Reads::default();
        let f = |k: &[u8]| r.of(k);
        let victim = |i: usize| vec![(keys[i].clone().into_boxed_slice(), 300 + ITEM_OVERHEAD + keys[i].len() as u64)];
        lru.put(&keys[0], 300, 10, &f);
        lru.put(&keys[1], 300, 20, &f);
        let prev = r.read(&keys[0], 30);
        assert!(lru.touch(&keys[0], 300, prev, 30, &f).is_empty()); // moved to the front
        assert_eq!(lru.put(&keys[2], 300, 40, &f), victim(1));
        // Read again within BUMP_US: only stamped, not moved.
        let prev = r.read(&keys[0], 50);
        assert!(lru.touch(&keys[0], 300, prev, 50, &f).is_empty());
        // keys[0] is at the back but was read since it was moved: keys[2] goes instead.
        assert_eq!(lru.put(&keys[3], 300, 60, &f), victim(2));
        assert_eq!(lru.put(&keys[4], 300, 70, &f), victim(3));
        // Unread since its second chance, keys[0] goes next.
        assert_eq!(lru.put(&keys[5], 300, 80, &f), victim(0));
    }

    #[test]
    fn a_read_after_a_quiet_second_moves_the_key() {
        let lru = Lru::new(SHARDS as u64 * 1000);
        let keys = keys(3);
        let f = |_: &[u8]| 0;
        lru.put(&keys[0], 300, 1, &f);
        lru.put(&keys[1], 300, 2, &f);
        // Last read more than BUMP_US ago: moved (the eviction below needs no second chance).
        assert!(lru.touch(&keys[0], 300, 3, 3 + BUMP_US, &f).is_empty());
        let size = 300 + ITEM_OVERHEAD + keys[1].len() as u64;
        assert_eq!(lru.put(&keys[2], 300, 4 + BUMP_US, &f), vec![(keys[1].clone().into_boxed_slice(), size)]);
    }
}
