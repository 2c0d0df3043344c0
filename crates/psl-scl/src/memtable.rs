//! The memtable: a concurrent map from key to the newest value under the total order
//! `(lamport, writer)`. Applying is a last-writer-wins register per key, so the order in which
//! a node applies updates does not matter: every node that has applied the same set of updates
//! holds the same map (convergence), and every node sees one order per key (coherence).
//! Deletes leave tombstones so that an older put arriving later cannot resurrect a key.
//! A memtable may be bounded: it then evicts cold keys that CapsuleDB can serve back (see
//! [`Memtable`]); a lookup that finds nothing it can vouch for says [`Lookup::Unknown`].

use crate::inline_key::InlineKey;
use parking_lot::{Condvar, Mutex, RwLock};
use psl_crypto::{sha256, Hash256};
use rustc_hash::FxHashMap;
use std::collections::hash_map::Entry as MapEntry;
use std::collections::{BTreeMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The version of a value: compared by Lamport time, then by writer index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Version {
    /// The Lamport time of the write (compared first).
    pub lamport: u64,
    /// The index of the writer that wrote it (breaks ties between equal Lamport times).
    pub writer: u32,
}

/// What the memtable holds for a key: a value, or a tombstone (`None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The version of the newest write of the key.
    pub version: Version,
    /// The value written; `None`: a delete (a tombstone).
    pub value: Option<Arc<[u8]>>,
}

const SHARDS: usize = 64;

/// What a local lookup found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// The key's live value.
    Value(Arc<[u8]>),
    /// A tombstone: the key is deleted (a local answer, no need to ask CapsuleDB).
    Deleted,
    /// Nothing this node can vouch for: the key is absent, or present only at a version that
    /// may be older than one this node evicted (see [`Memtable::apply`]). A bounded node asks
    /// CapsuleDB.
    Unknown,
}

/// What [`Memtable::evict_key`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictKey {
    /// The entry is gone: CapsuleDB can serve it back.
    Evicted,
    /// The entry's version is above CapsuleDB's frontier for its writer: kept.
    Pinned,
    /// The key had no entry.
    Absent,
}

/// One entry of [`Memtable::scan`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanEntry {
    /// The key.
    pub key: Vec<u8>,
    /// What the memtable holds for it (a value or a tombstone).
    pub entry: Entry,
    /// The version may be older than one this node evicted (see [`Memtable`]).
    pub unsure: bool,
}

/// Orders scan entries by key alone (a max-heap keeps the `limit + 1` smallest).
struct ByKey(ScanEntry);

impl PartialEq for ByKey {
    fn eq(&self, o: &Self) -> bool {
        self.0.key == o.0.key
    }
}
impl Eq for ByKey {}
impl PartialOrd for ByKey {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for ByKey {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.key.cmp(&o.0.key)
    }
}

/// One applied update, as the journal hands it to CapsuleDB: the key, the version, the value
/// (`None`: deleted), and the record that wrote it when known ([`Memtable::apply_from`]).
pub type Update = (Box<[u8]>, Version, Option<Arc<[u8]>>, Option<Origin>);

/// One update of an atomic apply ([`Memtable::apply_atomic`]): key, version, value (`None`:
/// a delete).
pub type AtomicUpdate<'a> = (&'a [u8], Version, Option<Arc<[u8]>>);

/// One op of a local atomic write ([`Memtable::write_atomic`]): key, value (`None`: a delete).
pub type AtomicWrite<'a> = (&'a [u8], Option<Arc<[u8]>>);

/// The data record an update came from: its hash and its exact bytes (shared by every op of
/// the record). CapsuleDB keeps it to prove its answers (`docs/protocol/capsuledb.md` §5).
pub type Origin = (psl_crypto::Hash256, Arc<[u8]>);

struct Slot {
    entry: Entry,
    /// Read or overwritten since the eviction scan last passed (second chance).
    hot: AtomicBool,
    /// The caller's own read stamp ([`Memtable::entry_read`]), 0 = none: a cache front end
    /// keeps its read recency here, in the slot a read fetches anyway, instead of in a
    /// structure of its own that would cost every read another cache miss. It belongs to the
    /// entry's version: an update to a newer version clears it.
    read_stamp: AtomicU64,
    /// The version may be older than one evicted from this shard: not served until CapsuleDB
    /// confirms it ([`Memtable::learn`]).
    unsure: bool,
}

#[derive(Default)]
struct Shard {
    /// Keys inline in the table's slots (see [`InlineKey`]): a lookup's key comparison reads
    /// the slot it has just fetched instead of a separate heap block.
    map: FxHashMap<InlineKey, Slot>,
    /// The highest version ever evicted from this shard.
    evicted_max: Option<Version>,
    /// The floor's sequence number when this shard last evicted: an answer from CapsuleDB
    /// older than that may not know what was evicted.
    evict_seq: u64,
}

/// The shards an atomic apply holds ([`Memtable::apply_atomic`]).
struct Locked<'a> {
    _gate: parking_lot::RwLockWriteGuard<'a, ()>,
    guards: Vec<(usize, parking_lot::RwLockWriteGuard<'a, Shard>)>,
}

impl Locked<'_> {
    fn shard(&mut self, key: &[u8]) -> &mut Shard {
        let i = key_shard(key, SHARDS);
        let at = self
            .guards
            .binary_search_by_key(&i, |g| g.0)
            .unwrap_or_else(|_| unreachable!("every key's shard is locked"));
        &mut self.guards[at].1
    }
}

struct Journal {
    q: Mutex<VecDeque<Update>>,
    space: Condvar,
    cap: usize,
    closed: AtomicBool,
}

/// A sharded, concurrent LWW map, optionally bounded.
///
/// **Bound and eviction.** With `keys_max` set, a shard holding more than its share of keys
/// evicts cold entries (a second-chance scan: an entry read or written since the last scan
/// survives once). Only entries that CapsuleDB can serve back are evictable: the version
/// `(lamport, writer)` must be at or below CapsuleDB's published frontier for that writer
/// ([`Memtable::raise_floor`]), i.e. CapsuleDB holds that write, or a newer one of the key, in
/// a stored block. Entries above the frontier are pinned, so the bound is soft: it is reached
/// once CapsuleDB catches up. Each shard remembers the highest version it evicted; an update
/// for an absent key at or below that version may be older than what was evicted, so it is
/// kept but marked unsure and not served until CapsuleDB's answer confirms or replaces it.
/// This keeps coherence: a node never shows an older version of a key after a newer one.
pub struct Memtable {
    shards: Vec<RwLock<Shard>>,
    /// Held for reading by a scan across all shards, for writing by an atomic apply: a scan
    /// sees an atomic batch whole or not at all (a single-key read needs only its shard).
    scan_gate: RwLock<()>,
    shard_keys_max: usize,
    floor: RwLock<Arc<FxHashMap<u32, u64>>>,
    floor_seq: AtomicU64,
    journal: Option<Journal>,
    evicted: AtomicU64,
}

impl Default for Memtable {
    fn default() -> Self {
        Memtable::with_options(None, None)
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
    spread(h.finish(), n)
}

/// Maps the hash `h` of a key to `0..n` with bits that a hash table keyed by the same hash
/// does not use. A shard's table indexes its buckets by the hash's low bits and tags them
/// with its top seven; a shard chosen by `h % n` would leave every key of a shard with the
/// same low bits, so its table would crowd them into a fraction of its buckets. This remixes
/// `h` (a multiply by an odd constant) and takes the top 32 bits' share of `n`.
pub fn spread(h: u64, n: usize) -> usize {
    let mixed = h.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
    ((mixed * n.max(1) as u64) >> 32) as usize
}

impl Memtable {
    /// An empty, unbounded memtable without a journal.
    pub fn new() -> Memtable {
        Memtable::default()
    }

    /// A memtable holding at most about `keys_max` evictable keys (`None`: unbounded), and,
    /// with `journal_updates_max`, a journal of every update applied (CapsuleDB's feed; applying
    /// blocks while the journal is full).
    pub fn with_options(keys_max: Option<usize>, journal_updates_max: Option<usize>) -> Memtable {
        Memtable {
            shards: (0..SHARDS).map(|_| RwLock::new(Shard::default())).collect(),
            scan_gate: RwLock::new(()),
            shard_keys_max: keys_max.map_or(usize::MAX, |k| k.div_ceil(SHARDS).max(1)),
            floor: RwLock::new(Arc::new(FxHashMap::default())),
            floor_seq: AtomicU64::new(0),
            journal: journal_updates_max.map(|cap| Journal {
                q: Mutex::new(VecDeque::new()),
                space: Condvar::new(),
                cap: cap.max(1),
                closed: AtomicBool::new(false),
            }),
            evicted: AtomicU64::new(0),
        }
    }

    /// Whether the memtable has a bound (and so may have evicted keys).
    pub fn is_bounded(&self) -> bool {
        self.shard_keys_max != usize::MAX
    }

    fn shard(&self, key: &[u8]) -> &RwLock<Shard> {
        &self.shards[key_shard(key, SHARDS)]
    }

    /// The live value of `key` (none if absent, deleted, or unsure).
    pub fn get(&self, key: &[u8]) -> Option<Arc<[u8]>> {
        match self.lookup(key) {
            Lookup::Value(v) => Some(v),
            _ => None,
        }
    }

    /// What this node can say about `key` on its own; marks the entry recently used.
    pub fn lookup(&self, key: &[u8]) -> Lookup {
        let s = self.shard(key).read();
        match s.map.get(key) {
            Some(slot) if !slot.unsure => {
                if !slot.hot.load(Ordering::Relaxed) {
                    slot.hot.store(true, Ordering::Relaxed);
                }
                match &slot.entry.value {
                    Some(v) => Lookup::Value(v.clone()),
                    None => Lookup::Deleted,
                }
            }
            _ => Lookup::Unknown,
        }
    }

    /// The entry of `key` (a tombstone has no value) if this node can vouch for it, i.e. it
    /// is present and not unsure; marks it recently used. `None` is [`Lookup::Unknown`].
    pub fn lookup_entry(&self, key: &[u8]) -> Option<Entry> {
        let s = self.shard(key).read();
        match s.map.get(key) {
            Some(slot) if !slot.unsure => {
                if !slot.hot.load(Ordering::Relaxed) {
                    slot.hot.store(true, Ordering::Relaxed);
                }
                Some(slot.entry.clone())
            }
            _ => None,
        }
    }

    /// The entry of `key`, tombstones (and unsure entries) included.
    pub fn entry(&self, key: &[u8]) -> Option<Entry> {
        self.shard(key).read().map.get(key).map(|s| s.entry.clone())
    }

    /// A read that also stamps the key's slot with the caller's `stamp` (any nonzero clock
    /// of the caller's, e.g. microseconds) and returns the stamp it replaced (0: none). With
    /// `vouched`, as [`Memtable::lookup_entry`] (unsure entries are `None`; marks the entry
    /// recently used); without, as [`Memtable::entry`]. The memtable only keeps the stamp: an
    /// update of the key to a newer version clears it (the first read of every version sees
    /// 0), and it goes with the slot.
    pub fn entry_read(&self, key: &[u8], vouched: bool, stamp: u64) -> Option<(Entry, u64)> {
        let s = self.shard(key).read();
        let slot = s.map.get(key)?;
        if vouched {
            if slot.unsure {
                return None;
            }
            if !slot.hot.load(Ordering::Relaxed) {
                slot.hot.store(true, Ordering::Relaxed);
            }
        }
        let prev = slot.read_stamp.swap(stamp, Ordering::Relaxed);
        Some((slot.entry.clone(), prev))
    }

    /// The read stamp of `key`'s slot ([`Memtable::entry_read`]); 0 if none or absent.
    pub fn read_stamp(&self, key: &[u8]) -> u64 {
        self.shard(key).read().map.get(key).map_or(0, |s| s.read_stamp.load(Ordering::Relaxed))
    }

    /// Applies an update if `version` is newer than what the key holds. Returns whether it did.
    /// With a journal, every update is journaled first (applied or not: CapsuleDB orders
    /// versions itself).
    pub fn apply(&self, key: &[u8], version: Version, value: Option<Arc<[u8]>>) -> bool {
        self.apply_from(key, version, value, None)
    }

    /// Like [`Memtable::apply`], journaling the record the update came from (the node's
    /// receive path: CapsuleDB proves its answers with these records).
    pub fn apply_from(&self, key: &[u8], version: Version, value: Option<Arc<[u8]>>, origin: Option<&Origin>) -> bool {
        if let Some(j) = &self.journal {
            j.push((key.into(), version, value.clone(), origin.cloned()));
        }
        let mut guard = self.shard(key).write();
        self.apply_in(&mut guard, key, version, value)
    }

    /// Applies `updates` (key, version, value) as one: every shard they touch is locked (in
    /// shard order) before the first is applied and released after the last, and scans wait
    /// for the whole, so a reader sees all of them or none ([`psl_capsule::Body::Atomic`]).
    /// Each update is still last-writer-wins on its own key. Returns how many applied.
    pub fn apply_atomic(&self, updates: &[AtomicUpdate<'_>], origin: Option<&Origin>) -> usize {
        if let Some(j) = &self.journal {
            for (key, version, value) in updates {
                j.push(((*key).into(), *version, value.clone(), origin.cloned()));
            }
        }
        let mut locked = self.lock_for(updates.iter().map(|u| u.0));
        updates
            .iter()
            .filter(|(key, version, value)| {
                let s = locked.shard(key);
                self.apply_in(s, key, *version, value.clone())
            })
            .count()
    }

    /// A local atomic write: locks every shard `ops` (key, value; `None`: a delete) touch, as
    /// [`Memtable::apply_atomic`] does, asks `next` for each op's version in order (it is
    /// given the version the key holds, and must return a newer one, or fail), and applies
    /// them all only if every op got one. Under the locks no other update of these keys can
    /// come between a version and its apply, so a `next` that ticks a clock which has passed
    /// every version applied wins every key. On an error nothing was applied.
    pub fn write_atomic<E>(
        &self,
        ops: &[AtomicWrite<'_>],
        mut next: impl FnMut(Option<Version>) -> Result<Version, E>,
    ) -> Result<Vec<Version>, E> {
        let mut versions = Vec::with_capacity(ops.len());
        {
            let mut locked = self.lock_for(ops.iter().map(|o| o.0));
            for (key, _) in ops {
                let held = locked.shard(key).map.get(*key).map(|slot| slot.entry.version);
                // An earlier op of this batch on the same key counts as held.
                let mine = ops.iter().zip(&versions).filter(|((k, _), _)| k == key).map(|(_, v)| *v).max();
                versions.push(next(held.max(mine))?);
            }
            for ((key, value), version) in ops.iter().zip(&versions) {
                let s = locked.shard(key);
                self.apply_in(s, key, *version, value.clone());
            }
        }
        if let Some(j) = &self.journal {
            for ((key, value), version) in ops.iter().zip(&versions) {
                j.push(((*key).into(), *version, value.clone(), None));
            }
        }
        Ok(versions)
    }

    /// The scan gate (for writing) and the write locks of every shard `keys` touch, taken in
    /// shard order (so two atomic applies cannot deadlock).
    fn lock_for<'a>(&self, keys: impl Iterator<Item = &'a [u8]>) -> Locked<'_> {
        let gate = self.scan_gate.write();
        let mut idx: Vec<usize> = keys.map(|k| key_shard(k, SHARDS)).collect();
        idx.sort_unstable();
        idx.dedup();
        let guards = idx.iter().map(|&i| (i, self.shards[i].write())).collect();
        Locked { _gate: gate, guards }
    }

    /// The body of [`Memtable::apply_from`] on a shard its caller has locked.
    fn apply_in(&self, s: &mut Shard, key: &[u8], version: Version, value: Option<Arc<[u8]>>) -> bool {
        let unsure = s.evicted_max.is_some_and(|m| version <= m);
        // One probe for both cases (an inline key costs no allocation to build).
        match s.map.entry(InlineKey::from(key)) {
            MapEntry::Occupied(o) if o.get().entry.version >= version => false,
            MapEntry::Occupied(mut o) => {
                let slot = o.get_mut();
                slot.entry = Entry { version, value };
                slot.unsure = slot.unsure && unsure;
                slot.hot.store(true, Ordering::Relaxed);
                slot.read_stamp.store(0, Ordering::Relaxed);
                true
            }
            MapEntry::Vacant(v) => {
                // Not hot: second chances are for keys read (or rewritten) since the last scan.
                v.insert(Slot {
                    entry: Entry { version, value },
                    hot: AtomicBool::new(false),
                    read_stamp: AtomicU64::new(0),
                    unsure,
                });
                if s.map.len() > self.shard_keys_max {
                    self.evict(s, Some(key));
                }
                true
            }
        }
    }

    /// What CapsuleDB answered for `key` (its newest version with the value, or `None` for
    /// "never written") as of its index `seq`, in answer to this node's own request. If `seq`
    /// is at least the floor sequence under which this shard last evicted, CapsuleDB's answer
    /// covers anything this node evicted for the key, so it settles an unsure entry and is
    /// applied like any update otherwise (only if newer): returns `Some(changed)`. An older
    /// answer (delayed, produced before CapsuleDB stored what was evicted) returns `None` and
    /// changes nothing: ask again.
    pub fn learn(&self, key: &[u8], answer: Option<(Version, Option<Arc<[u8]>>)>, seq: u64) -> Option<bool> {
        let mut guard = self.shard(key).write();
        let s = &mut *guard;
        if seq < s.evict_seq {
            return None;
        }
        Some(match (s.map.get_mut(key), answer) {
            (Some(slot), Some((version, value))) if version > slot.entry.version => {
                slot.entry = Entry { version, value };
                slot.unsure = false;
                slot.read_stamp.store(0, Ordering::Relaxed);
                true
            }
            (Some(slot), _) => std::mem::replace(&mut slot.unsure, false),
            (None, Some((version, value))) => {
                s.map.insert(
                    key.into(),
                    Slot {
                        entry: Entry { version, value },
                        hot: AtomicBool::new(true),
                        read_stamp: AtomicU64::new(0),
                        unsure: false,
                    },
                );
                if s.map.len() > self.shard_keys_max {
                    self.evict(s, Some(key));
                }
                true
            }
            (None, None) => false,
        })
    }

    /// Raises the eviction floor: CapsuleDB holds every write of `writer` up to `lamport` in a
    /// stored block, as of its index `seq`. Floors only go up. Then evicts what the bound
    /// calls for.
    pub fn raise_floor(&self, frontier: &[(u32, u64)], seq: u64) {
        {
            let mut f = self.floor.write();
            let mut next = (**f).clone();
            let mut changed = false;
            for &(w, l) in frontier {
                let e = next.entry(w).or_insert(0);
                if l > *e {
                    *e = l;
                    changed = true;
                }
            }
            if !changed {
                return;
            }
            // Under the floor's lock, so that no eviction under the new floor records an older seq.
            self.floor_seq.fetch_max(seq, Ordering::AcqRel);
            *f = Arc::new(next);
        }
        if self.is_bounded() {
            for sh in &self.shards {
                let mut s = sh.write();
                if s.map.len() > self.shard_keys_max {
                    self.evict(&mut s, None);
                }
            }
        }
    }

    /// The floor of `writer` (0 if none).
    pub fn floor(&self, writer: u32) -> u64 {
        self.floor.read().get(&writer).copied().unwrap_or(0)
    }

    /// Evicts cold, evictable entries until the shard is an eighth under its share (never
    /// `keep`, the key just inserted).
    fn evict(&self, s: &mut Shard, keep: Option<&[u8]>) {
        let (floor, seq) = {
            let f = self.floor.read();
            (f.clone(), self.floor_seq.load(Ordering::Acquire))
        };
        if floor.is_empty() {
            return;
        }
        let target = self.shard_keys_max - self.shard_keys_max / 8;
        let mut excess = s.map.len().saturating_sub(target);
        let mut max = s.evicted_max;
        let before = s.map.len();
        // One pass: entries used since the last pass lose their second chance and stay; the
        // bound is soft (the next insert into the shard scans again).
        {
            s.map.retain(|k, slot| {
                if excess == 0 || keep == Some(&**k) {
                    return true;
                }
                let v = slot.entry.version;
                if floor.get(&v.writer).is_none_or(|l| v.lamport > *l) {
                    return true;
                }
                if slot.hot.swap(false, Ordering::Relaxed) {
                    return true;
                }
                excess -= 1;
                max = max.max(Some(v));
                false
            });
        }
        if s.map.len() < before {
            s.evict_seq = s.evict_seq.max(seq);
        }
        s.evicted_max = max;
        self.evicted.fetch_add((before - s.map.len()) as u64, Ordering::Relaxed);
    }

    /// Evicts `key` now if CapsuleDB can serve it back (its version at or below CapsuleDB's
    /// frontier for its writer, as the bound's own scan requires), whether or not the memtable
    /// is bounded: a front end with its own memory limit (SecureCached) drops its coldest items
    /// this way. The eviction is recorded like the scan's (the shard's highest evicted version
    /// and floor sequence), so an older update arriving later is unsure and a CapsuleDB answer
    /// from before the eviction is refused: a later read of the key asks CapsuleDB and gets
    /// the evicted version (or a newer one) back, with its original `(lamport, writer)`.
    pub fn evict_key(&self, key: &[u8]) -> EvictKey {
        let (floor, seq) = {
            let f = self.floor.read();
            (f.clone(), self.floor_seq.load(Ordering::Acquire))
        };
        let mut guard = self.shard(key).write();
        let s = &mut *guard;
        let Some(slot) = s.map.get(key) else { return EvictKey::Absent };
        let v = slot.entry.version;
        if floor.get(&v.writer).is_none_or(|l| v.lamport > *l) {
            return EvictKey::Pinned;
        }
        s.map.remove(key);
        s.evicted_max = s.evicted_max.max(Some(v));
        s.evict_seq = s.evict_seq.max(seq);
        self.evicted.fetch_add(1, Ordering::Relaxed);
        EvictKey::Evicted
    }

    /// Keys evicted so far.
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    /// Entries held (tombstones and unsure entries included): what the bound limits.
    pub fn held(&self) -> usize {
        self.shards.iter().map(|s| s.read().map.len()).sum()
    }

    /// Takes up to `max` journaled updates, waiting up to `timeout` for the first.
    pub fn drain_journal(&self, max: usize, timeout: Duration) -> Vec<Update> {
        let Some(j) = &self.journal else { return Vec::new() };
        let mut q = j.q.lock();
        if q.is_empty() {
            j.space.wait_for(&mut q, timeout);
        }
        let n = q.len().min(max);
        let out: Vec<Update> = q.drain(..n).collect();
        drop(q);
        j.space.notify_all();
        out
    }

    /// Updates journaled and not yet drained (0 without a journal).
    pub fn journal_len(&self) -> usize {
        self.journal.as_ref().map_or(0, |j| j.q.lock().len())
    }

    /// Stops journaling (the consumer is gone): appliers never block on it again.
    pub fn close_journal(&self) {
        if let Some(j) = &self.journal {
            j.closed.store(true, Ordering::Release);
            j.space.notify_all();
        }
    }

    /// Keys with a live value.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read().map.values().filter(|e| e.entry.value.is_some() && !e.unsure).count()).sum()
    }

    /// Whether no key has a live value ([`Memtable::len`] is 0).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The first `limit` entries (tombstones and unsure entries included, each with its unsure
    /// flag) whose key starts with `prefix` and is above `after`, in key order, and whether
    /// more such entries exist. A scan visits every shard under its read lock (the map has no
    /// order): its cost grows with the keys held, its memory with `limit` only.
    pub fn scan(&self, prefix: &[u8], after: Option<&[u8]>, limit: usize) -> (Vec<ScanEntry>, bool) {
        let mut heap: std::collections::BinaryHeap<ByKey> = std::collections::BinaryHeap::with_capacity(limit + 1);
        let _gate = self.scan_gate.read();
        for sh in &self.shards {
            let s = sh.read();
            for (k, slot) in s.map.iter() {
                let k: &[u8] = k;
                if !k.starts_with(prefix) || after.is_some_and(|a| k <= a) {
                    continue;
                }
                if heap.len() > limit && heap.peek().is_some_and(|top| top.0.key.as_slice() <= k) {
                    continue;
                }
                heap.push(ByKey(ScanEntry { key: k.to_vec(), entry: slot.entry.clone(), unsure: slot.unsure }));
                if heap.len() > limit + 1 {
                    heap.pop();
                }
            }
        }
        let mut out: Vec<ScanEntry> = heap.into_sorted_vec().into_iter().map(|b| b.0).collect();
        let more = out.len() > limit;
        out.truncate(limit);
        (out, more)
    }

    /// The highest floor sequence any shard evicted under: an answer from CapsuleDB at least
    /// this new knows everything this node evicted (see [`Memtable::learn`]).
    pub fn evict_seq_max(&self) -> u64 {
        self.shards.iter().map(|s| s.read().evict_seq).max().unwrap_or(0)
    }

    /// Every entry (tombstones included), ordered by key.
    pub fn snapshot(&self) -> BTreeMap<Vec<u8>, Entry> {
        let mut out = BTreeMap::new();
        let _gate = self.scan_gate.read();
        for s in &self.shards {
            for (k, e) in s.read().map.iter() {
                out.insert(k.to_vec(), e.entry.clone());
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
            *s.write() = Shard::default();
        }
        *self.floor.write() = Arc::new(FxHashMap::default());
        self.floor_seq.store(0, Ordering::Release);
    }
}

impl Journal {
    fn push(&self, u: Update) {
        let mut q = self.q.lock();
        while q.len() >= self.cap && !self.closed.load(Ordering::Acquire) {
            self.space.wait_for(&mut q, Duration::from_millis(100));
        }
        if self.closed.load(Ordering::Acquire) {
            return;
        }
        q.push_back(u);
        drop(q);
        self.space.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    type Cell = (Version, Option<Arc<[u8]>>);

    fn v(l: u64, w: u32) -> Version {
        Version { lamport: l, writer: w }
    }

    fn val(b: &[u8]) -> Arc<[u8]> {
        b.into()
    }

    #[test]
    fn an_atomic_apply_is_seen_whole_by_gets_and_scans() {
        let m = Arc::new(Memtable::new());
        let keys: Vec<Vec<u8>> = (0..16).map(|i| format!("k{i:02}").into_bytes()).collect();
        let done = Arc::new(AtomicBool::new(false));
        let reader = {
            let (m, keys, done) = (m.clone(), keys.clone(), done.clone());
            std::thread::spawn(move || {
                let lamport = |e: Option<Entry>| e.map_or(0, |e| e.version.lamport / 100);
                while !done.load(Ordering::Acquire) {
                    let mut last = 0;
                    for k in &keys {
                        let g = lamport(m.entry(k));
                        assert!(g >= last, "a later key older than an earlier one");
                        last = g;
                    }
                    let (all, _) = m.scan(b"k", None, 100);
                    let gens: Vec<u64> = all.iter().map(|e| e.entry.version.lamport / 100).collect();
                    assert!(gens.windows(2).all(|w| w[0] == w[1]), "a scan saw {gens:?}");
                }
            })
        };
        for g in 1..=2_000u64 {
            let updates: Vec<AtomicUpdate<'_>> = keys
                .iter()
                .enumerate()
                .map(|(i, k)| (k.as_slice(), Version { lamport: g * 100 + i as u64, writer: 1 }, None))
                .collect();
            assert_eq!(m.apply_atomic(&updates, None), keys.len());
        }
        done.store(true, Ordering::Release);
        reader.join().expect("no reader saw a batch half applied");
        // Last writer wins per key all the same: an older atomic update changes nothing.
        let old = [(&b"k00"[..], Version { lamport: 5, writer: 1 }, Some(Arc::from(&b"old"[..])))];
        assert_eq!(m.apply_atomic(&old, None), 0);
        // A local atomic write gets a version above what each key holds, or nothing.
        let ops = [(&b"k00"[..], Some(Arc::from(&b"a"[..]))), (b"k01", Some(Arc::from(&b"b"[..])))];
        let mut next = 1_000_000u64;
        let vs = m
            .write_atomic(&ops, |held| {
                next += 1;
                assert!(held.is_some_and(|h| h.lamport < next));
                Ok::<_, ()>(Version { lamport: next, writer: 2 })
            })
            .unwrap();
        assert_eq!(vs.len(), 2);
        assert_eq!(m.get(b"k01").as_deref(), Some(&b"b"[..]));
        // The second op fails: the first is not applied either.
        let mut calls = 0;
        let refused = m.write_atomic(&[(&b"k02"[..], Some(Arc::from(&b"x"[..]))), (b"k03", None)], |_| {
            calls += 1;
            if calls == 2 {
                Err("fenced")
            } else {
                Ok(Version { lamport: 9_000_000, writer: 2 })
            }
        });
        assert_eq!(refused, Err("fenced"));
        assert!(m.entry(b"k02").is_some_and(|e| e.value.is_none() && e.version.lamport / 100 == 2_000));
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
        /// A scan is the model's ordered range: prefix, `after`, `limit` and the `more` flag.
        #[test]
        fn scan_matches_an_ordered_model(
            keys in proptest::collection::vec(proptest::collection::vec(0u8..4, 1..4), 0..60),
            prefix in proptest::collection::vec(0u8..4, 0..2),
            after in proptest::option::of(proptest::collection::vec(0u8..4, 1..3)),
            limit in 0usize..10,
        ) {
            let m = Memtable::new();
            let mut model = BTreeMap::new();
            for (i, k) in keys.iter().enumerate() {
                let value = if i % 5 == 4 { None } else { Some(val(&[i as u8])) };
                m.apply(k, v(i as u64 + 1, 1), value.clone());
                model.insert(k.clone(), Entry { version: v(i as u64 + 1, 1), value });
            }
            let want: Vec<(Vec<u8>, Entry)> = model
                .into_iter()
                .filter(|(k, _)| k.starts_with(&prefix) && after.as_ref().is_none_or(|a| k > a))
                .collect();
            let (got, more) = m.scan(&prefix, after.as_deref(), limit);
            prop_assert_eq!(more, want.len() > limit);
            let got: Vec<(Vec<u8>, Entry)> = got.into_iter().map(|e| (e.key, e.entry)).collect();
            prop_assert_eq!(got, want.into_iter().take(limit).collect::<Vec<_>>());
        }
    }

    #[test]
    fn read_stamps_belong_to_a_version() {
        let m = Memtable::new();
        assert_eq!(m.entry_read(b"k", false, 5), None);
        m.apply(b"k", v(1, 1), Some(val(b"a")));
        let (e, prev) = m.entry_read(b"k", false, 5).unwrap();
        assert_eq!((e.version, prev), (v(1, 1), 0));
        assert_eq!(m.entry_read(b"k", false, 9).unwrap().1, 5);
        assert_eq!(m.read_stamp(b"k"), 9);
        // An older update changes nothing; a newer one clears the stamp.
        m.apply(b"k", v(0, 1), Some(val(b"old")));
        assert_eq!(m.read_stamp(b"k"), 9);
        m.apply(b"k", v(2, 1), None);
        assert_eq!(m.read_stamp(b"k"), 0);
        // Tombstones are read (and stamped) too without `vouched`.
        assert_eq!(m.entry_read(b"k", false, 11).map(|(e, p)| (e.value, p)), Some((None, 0)));
        // With `vouched`, an unsure entry is not read and not stamped.
        m.raise_floor(&[(1, 2)], 1);
        assert_eq!(m.evict_key(b"k"), EvictKey::Evicted);
        m.apply(b"k", v(1, 1), Some(val(b"a")));
        assert_eq!(m.entry_read(b"k", true, 13), None);
        assert_eq!(m.read_stamp(b"k"), 0);
        assert_eq!(m.read_stamp(b"absent"), 0);
    }

    #[test]
    fn evict_key_drops_only_what_capsuledb_holds_and_older_updates_stay_unsure() {
        let m = Memtable::new();
        m.apply(b"a", Version { lamport: 10, writer: 7 }, Some(val(b"1")));
        m.apply(b"b", Version { lamport: 20, writer: 7 }, Some(val(b"2")));
        assert_eq!(m.evict_key(b"a"), EvictKey::Pinned, "no floor yet: CapsuleDB holds nothing");
        m.raise_floor(&[(7, 15)], 3);
        assert_eq!(m.evict_key(b"b"), EvictKey::Pinned, "above the floor");
        assert_eq!(m.evict_key(b"a"), EvictKey::Evicted);
        assert_eq!(m.evict_key(b"a"), EvictKey::Absent);
        assert_eq!(m.lookup(b"a"), Lookup::Unknown);
        assert_eq!(m.lookup_entry(b"b").map(|e| e.version.lamport), Some(20));
        // An update of the same key at or below the evicted version may be older: unsure.
        m.apply(b"a", Version { lamport: 9, writer: 8 }, Some(val(b"old")));
        assert_eq!(m.lookup(b"a"), Lookup::Unknown);
        assert_eq!(m.lookup_entry(b"a"), None);
        // An answer from before the eviction's floor is refused; a fresh one settles the key.
        assert_eq!(m.learn(b"a", Some((Version { lamport: 10, writer: 7 }, Some(val(b"1")))), 2), None);
        assert_eq!(m.learn(b"a", Some((Version { lamport: 10, writer: 7 }, Some(val(b"1")))), 3), Some(true));
        let e = m.lookup_entry(b"a").expect("settled");
        assert_eq!((e.version, e.value), (Version { lamport: 10, writer: 7 }, Some(val(b"1"))));
    }

    #[test]
    fn bounded_evicts_only_below_the_floor_and_older_updates_stay_unsure() {
        let m = Memtable::with_options(Some(64), None);
        for i in 0..1000u64 {
            m.apply(format!("k{i}").as_bytes(), v(i + 1, 7), Some(Arc::from(vec![1u8])));
        }
        assert_eq!(m.evicted(), 0, "nothing is evictable before CapsuleDB's floor covers it");
        m.raise_floor(&[(7, 500)], 1);
        assert!(m.evicted() > 0);
        for i in 500..1000u64 {
            assert!(m.entry(format!("k{i}").as_bytes()).is_some(), "k{i} is above the floor: pinned");
        }
        let gone = (0..500u64).find(|i| m.entry(format!("k{i}").as_bytes()).is_none()).expect("one evicted");
        let key = format!("k{gone}");
        assert_eq!(m.lookup(key.as_bytes()), Lookup::Unknown);
        // An older update arrives late: kept, but not served (it may be older than the evicted one).
        assert!(m.apply(key.as_bytes(), v(0, 1), Some(Arc::from(&b"stale"[..]))));
        assert_eq!(m.lookup(key.as_bytes()), Lookup::Unknown);
        assert_eq!(m.get(key.as_bytes()), None);
        // An answer from before the floor that allowed the eviction is refused.
        assert_eq!(m.learn(key.as_bytes(), None, 0), None);
        assert_eq!(m.lookup(key.as_bytes()), Lookup::Unknown);
        // CapsuleDB's answer (the evicted version) replaces it.
        assert_eq!(m.learn(key.as_bytes(), Some((v(gone + 1, 7), Some(Arc::from(vec![1u8])))), 1), Some(true));
        assert_eq!(m.lookup(key.as_bytes()), Lookup::Value(Arc::from(vec![1u8])));
        // A newer update than anything evicted is served at once.
        assert!(m.apply(b"fresh", v(5000, 1), None));
        assert_eq!(m.lookup(b"fresh"), Lookup::Deleted);
    }

    #[test]
    fn journal_sees_every_update_and_blocks_when_full() {
        let m = Arc::new(Memtable::with_options(None, Some(4)));
        for i in 0..4u64 {
            m.apply(b"k", v(10 - i, 1), None);
        }
        let m2 = m.clone();
        let t = std::thread::spawn(move || m2.apply(b"k", v(1, 2), None));
        std::thread::sleep(Duration::from_millis(50));
        assert!(!t.is_finished(), "the fifth update waits for room");
        let got = m.drain_journal(10, Duration::from_millis(10));
        assert_eq!(got.len(), 4, "older (not applied) updates are journaled too");
        t.join().unwrap();
        assert_eq!(m.drain_journal(10, Duration::from_millis(10)).len(), 1);
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

        /// A bounded memtable fed by updates in any order, with CapsuleDB (a full LWW map of
        /// every update) answering its unknowns: every resolved read is CapsuleDB's newest
        /// version, so no read ever goes back in time after an eviction.
        #[test]
        fn bounded_reads_never_go_back(ops in proptest::collection::vec((0u8..40, 1u64..200, 0u32..3, 0u8..4), 1..400)) {
            let m = Memtable::with_options(Some(64), None);
            let mut db: std::collections::HashMap<Vec<u8>, Cell> = Default::default();
            let mut frontier: std::collections::HashMap<u32, u64> = Default::default();
            for (k, l, w, what) in ops {
                let key = vec![k];
                match what {
                    0 | 1 => {
                        let ver = v(l, w);
                        // The same version always carries the same write.
                        let val = (!(l + w as u64).is_multiple_of(3)).then(|| Arc::from(vec![k, l as u8, w as u8]));
                        m.apply(&key, ver, val.clone());
                        let e = db.entry(key.clone()).or_insert((ver, val.clone()));
                        if ver > e.0 { *e = (ver, val); }
                        let f = frontier.entry(w).or_insert(0);
                        *f = (*f).max(l);
                    }
                    2 => {
                        // CapsuleDB stored everything it saw (per writer, in any order here, so
                        // the floor may only cover what every writer's updates reached).
                        let fl: Vec<(u32, u64)> = frontier.iter().map(|(w, l)| (*w, *l)).collect();
                        m.raise_floor(&fl, 1);
                    }
                    _ => {
                        let want = db.get(&key).cloned();
                        let got = match m.lookup(&key) {
                            Lookup::Unknown => {
                                m.learn(&key, want.clone(), 1);
                                m.lookup(&key)
                            }
                            x => x,
                        };
                        let expect = match want.and_then(|(_, v)| v) {
                            Some(v) => Lookup::Value(v),
                            None if db.contains_key(&key) => Lookup::Deleted,
                            None => Lookup::Unknown,
                        };
                        prop_assert_eq!(got, expect, "key {}", k);
                    }
                }
            }
        }
    }
}
