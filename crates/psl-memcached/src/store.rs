//! [`FrontEnd`]: memcached semantics on a [`psl_node::Node`].
//!
//! Reads go to the node's memtable (`Node::entry`); writes are `Node::put`/`Node::delete`, so
//! every write becomes an op in a sealed, signed, encrypted record that the other nodes verify
//! and apply. Read-modify-write commands run under a striped per-key lock of the key's *home*
//! front end (see the crate docs), so they are atomic among all front ends of a group.

use crate::failover::{Failover, FailoverConfig, FailoverHost};
use crate::home::{Ctl, CtlReply, Held, Lease};
use crate::item::{self, absolute_expiry, cas_of};
use crate::lru::{key_hash, Lru, Victim};
pub use crate::op::{Outcome, Rmw};
use crate::peer::{PeerClient, PeerConfig, PeerKey, PeerService, Routed};
use crate::proto::{parse_counter, Limits, StoreMode};
use crate::shards::Shards;
use crate::stats::Stats;
use parking_lot::{Mutex, RwLock};
use psl_node::{Node, NodeError};
use psl_scl::{Entry, EvictKey, Version};
use std::cell::Cell;
use std::collections::VecDeque;
use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// The KV key that holds the flush_all state, replicated like any item. It starts with a space,
/// which no memcached key can contain.
pub const FLUSH_KEY: &[u8] = b" psl-memcached flush_all";

const LOCK_STRIPES: usize = 1024;

/// How long a front end trusts its cached copy of the flush_all state.
const FLUSH_CACHE_US: u64 = 1000;

/// With CapsuleDB: pinned victims re-checked per write (see [`FrontEnd::drain_pinned`]).
const PINNED_CHECK_MAX: usize = 64;
/// With CapsuleDB: how long a write waits for pinned copies to become evictable when they
/// take more than the memory limit, before failing with `SERVER_ERROR out of memory`.
const PINNED_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Front end settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// Parser bounds (line, key and item sizes); `item_size_max` also caps stored items.
    pub limits: Limits,
    /// Bytes of items this front end keeps before evicting (memcached `-m`), default 64 MiB.
    pub memory_limit: u64,
    /// Reported as `threads` in `stats`.
    pub threads: usize,
    /// Reported as `max_connections`.
    pub max_connections: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config { limits: Limits::default(), memory_limit: 64 << 20, threads: 2, max_connections: 4096 }
    }
}

/// A read's result.
#[derive(Debug, Clone)]
pub enum Lookup {
    /// A live item (not expired, not flushed).
    Hit {
        /// The encoded item (see [`crate::item`]).
        value: Arc<[u8]>,
        /// Its CAS unique.
        cas: u64,
    },
    /// No live item: never written, deleted, expired, flushed or evicted here (without CapsuleDB).
    Miss,
    /// Evicted here and CapsuleDB did not answer in time (never a silent miss).
    Unreadable(String),
}

/// The flush_all state: items stored before `floor` are gone; items stored before `pending`
/// are gone once the clock passes `pending`. Microseconds since the epoch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Flush {
    floor: u64,
    pending: u64,
}

impl Flush {
    fn decode(v: &[u8]) -> Flush {
        if v.len() != 16 {
            return Flush::default();
        }
        let mut a = [0u8; 8];
        a.copy_from_slice(&v[..8]);
        let mut b = [0u8; 8];
        b.copy_from_slice(&v[8..]);
        Flush { floor: u64::from_le_bytes(a), pending: u64::from_le_bytes(b) }
    }

    fn encode(&self) -> [u8; 16] {
        let mut o = [0u8; 16];
        o[..8].copy_from_slice(&self.floor.to_le_bytes());
        o[8..].copy_from_slice(&self.pending.to_le_bytes());
        o
    }

    fn hides(&self, stored_us: u64, now_us: u64) -> bool {
        stored_us < self.floor || (self.pending != 0 && self.pending <= now_us && stored_us < self.pending)
    }
}

/// One memcached front end on one node.
pub struct FrontEnd {
    node: Arc<Node>,
    cfg: Config,
    /// Largest encoded item: the smaller of the item size limit (plus the header) and the
    /// node's value limit.
    value_max: usize,
    locks: Box<[Mutex<()>]>,
    lru: Lru,
    /// This front end's `stats` counters.
    pub stats: Stats,
    started: Instant,
    last_stamp: AtomicU64,
    group: RwLock<Group>,
    /// Cached flush_all state: floor, pending, and when it was read (µs since the epoch; 0 = never).
    flush_cache: [AtomicU64; 3],
    /// The node reads through CapsuleDB (`NodeOptions::capsuledb`): evictions must not lose data.
    backed: bool,
    /// With CapsuleDB: LRU victims whose version CapsuleDB does not hold yet (above its
    /// frontier), oldest first, with their accounted bytes; evicted once it does.
    pinned: Mutex<VecDeque<Victim>>,
    pinned_bytes: AtomicU64,
    pinned_len: AtomicU64,
    /// The shard map this front end routes by, when the key space has several shards.
    shards: RwLock<Option<Arc<Shards>>>,
}

#[derive(Default)]
struct Group {
    members: Vec<Member>,
    me: usize,
    /// Home failover (a group of three or more processes): where each slot's home is now.
    failover: Option<Arc<Failover>>,
    /// A forwarding-only member of a group that fails homes over.
    client_failover: bool,
}

/// A home's fenced write: at a Lamport time below `below`; the write made is kept for the
/// acceptors.
struct Fence {
    below: u64,
    wrote: Cell<Option<Held>>,
}

/// A member of a front-end group: in this process, or behind a peer address.
enum Member {
    Local(Weak<FrontEnd>),
    Remote(Arc<PeerClient>),
}

/// Where a read-modify-write command runs.
enum Home {
    Here,
    Local(Arc<FrontEnd>),
    Remote(Arc<PeerClient>),
}

/// The wall clock in Unix seconds (0 if it reads before the epoch).
pub fn unix_now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

fn unix_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0)
}

/// One reading of the wall clock, shared by everything a command does with the time (expiry,
/// flush_all, stamps, LRU recency): a command reads the clock once.
#[derive(Debug, Clone, Copy)]
struct Now {
    /// Microseconds since the epoch, at least 1.
    us: u64,
    secs: i64,
}

impl Now {
    fn read() -> Now {
        let us = unix_us().max(1);
        Now { us, secs: (us / 1_000_000) as i64 }
    }
}

impl FrontEnd {
    /// A front end storing its items in `node`, alone (no group) until a `join_*` call.
    pub fn new(node: Arc<Node>, cfg: Config) -> Arc<FrontEnd> {
        let node_max = node.limits().value_bytes_max as usize;
        let value_max = (cfg.limits.item_size_max.saturating_add(item::HEADER)).min(node_max);
        Arc::new(FrontEnd {
            lru: Lru::new(cfg.memory_limit),
            cfg,
            value_max,
            locks: (0..LOCK_STRIPES).map(|_| Mutex::new(())).collect(),
            stats: Stats::default(),
            started: Instant::now(),
            last_stamp: AtomicU64::new(0),
            group: RwLock::new(Group::default()),
            flush_cache: Default::default(),
            backed: node.db_stats().is_some(),
            pinned: Mutex::new(VecDeque::new()),
            pinned_bytes: AtomicU64::new(0),
            pinned_len: AtomicU64::new(0),
            shards: RwLock::new(None),
            node,
        })
    }

    /// Serves one shard of a key space of several ([`crate::shards`]): commands on other
    /// shards' keys go to their front ends.
    pub fn serve_shard(&self, shards: Shards) {
        *self.shards.write() = Some(Arc::new(shards));
    }

    /// The shard map routed by, if any.
    pub fn shards(&self) -> Option<Arc<Shards>> {
        self.shards.read().clone()
    }

    /// Whether evictions are backed by CapsuleDB (an evicted item is read back from it).
    pub fn is_backed(&self) -> bool {
        self.backed
    }

    /// The node whose memtable and writers hold this front end's items.
    pub fn node(&self) -> &Arc<Node> {
        &self.node
    }

    /// The settings this front end was made with.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Whole seconds since the front end was made (`uptime` in `stats`).
    pub fn uptime(&self) -> u64 {
        self.started.elapsed().as_secs()
    }

    /// Makes `members` one group: each key's read-modify-write commands run at
    /// `members[hash(key) % members.len()]`, whichever member receives them.
    pub fn join_group(members: &[Arc<FrontEnd>]) {
        for (i, m) in members.iter().enumerate() {
            let mut g = m.group.write();
            g.members = members.iter().map(|m| Member::Local(Arc::downgrade(m))).collect();
            g.me = i;
        }
    }

    /// Makes this front end member `me` of a group of front ends in several processes, named
    /// by their peer addresses (`peers[me]` is this one's, served by a
    /// [`crate::peer::PeerServer`]). The list must be the same, in the same order, on every
    /// member: each key's read-modify-write commands run at `peers[hash(key) % peers.len()]`.
    pub fn join_remote_group(self: &Arc<Self>, peers: &[SocketAddr], me: usize, key: PeerKey, cfg: PeerConfig) {
        let mut g = self.group.write();
        g.members = peers
            .iter()
            .enumerate()
            .map(|(i, a)| {
                if i == me {
                    Member::Local(Arc::downgrade(self))
                } else {
                    Member::Remote(Arc::new(PeerClient::new(*a, key.clone(), cfg)))
                }
            })
            .collect();
        g.me = me;
    }

    /// As [`FrontEnd::join_remote_group`], with home failover (`peers` of three or more): a
    /// slot's home is whichever member holds its lease ([`crate::failover`]), so conditional
    /// commands keep working when a front end is down. Fails (with the reason) if the
    /// settings do not validate (fewer than three peers, `me` out of range, a lease outside
    /// 100 ms ..= 600 s) or a failover thread cannot be spawned.
    pub fn join_remote_group_with_failover(
        self: &Arc<Self>,
        peers: &[SocketAddr],
        me: usize,
        key: PeerKey,
        cfg: PeerConfig,
        fcfg: FailoverConfig,
    ) -> Result<Arc<Failover>, String> {
        self.join_remote_group(peers, me, key.clone(), cfg);
        let f = Failover::start(self, peers, me, key, cfg, fcfg)?;
        self.group.write().failover = Some(f.clone());
        Ok(f)
    }

    /// Home failover of this front end's group, if on.
    pub fn failover(&self) -> Option<Arc<Failover>> {
        self.group.read().failover.clone()
    }

    /// Makes this front end a forwarding-only client of a group of front ends in other
    /// processes (`peers`, the group's list): every read-modify-write command runs at its
    /// key's home `peers[hash(key) % peers.len()]`, never here, so a front end that joins a
    /// running deployment keeps the group's atomicity without changing its membership.
    /// With `failover` (the group fails homes over), a command whose home cannot be reached
    /// is asked of the next members, which run it if they are home now or name who is.
    pub fn join_remote_group_as_client(
        self: &Arc<Self>,
        peers: &[SocketAddr],
        key: PeerKey,
        cfg: PeerConfig,
        failover: bool,
    ) {
        let mut g = self.group.write();
        g.members = peers.iter().map(|a| Member::Remote(Arc::new(PeerClient::new(*a, key.clone(), cfg)))).collect();
        g.me = usize::MAX;
        g.client_failover = failover;
    }

    /// Where `key`'s read-modify-write commands run.
    fn home(&self, key: &[u8]) -> Home {
        let g = self.group.read();
        let n = g.members.len();
        if n == 0 || (n == 1 && g.me == 0) {
            return Home::Here;
        }
        let h = (key_hash(key) % n as u64) as usize;
        if h == g.me {
            return Home::Here;
        }
        match &g.members[h] {
            Member::Local(w) => w.upgrade().map_or(Home::Here, Home::Local),
            Member::Remote(c) => Home::Remote(c.clone()),
        }
    }

    /// A strictly increasing microsecond stamp for items and flushes.
    fn stamp(&self) -> u64 {
        self.stamp_at(unix_us())
    }

    /// [`FrontEnd::stamp`] for a command that has read the clock (`now` µs).
    fn stamp_at(&self, now: u64) -> u64 {
        let mut cur = self.last_stamp.load(Ordering::Relaxed);
        loop {
            let next = now.max(cur + 1);
            match self.last_stamp.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return next,
                Err(c) => cur = c,
            }
        }
    }

    /// The replicated flush_all state as this node holds it now. Read from the memtable only
    /// (never from CapsuleDB): the front end never evicts it, and its memtable is unbounded.
    /// An entry marked unsure is still the newest this node has (nothing evicted it).
    fn flush_state_exact(&self) -> Flush {
        self.node.entry(FLUSH_KEY).and_then(|e| e.value).map(|v| Flush::decode(&v)).unwrap_or_default()
    }

    /// The flush_all state, re-read from the memtable at most every [`FLUSH_CACHE_US`]: every
    /// command needs it, and a memtable lookup per command is measurable. A local flush_all
    /// updates the cache at once; one that arrives by replication (already seconds-scale
    /// asynchronous) is seen up to a millisecond later.
    fn flush_state(&self, now_us: u64) -> Flush {
        let at = self.flush_cache[2].load(Ordering::Acquire);
        // `abs_diff`: a wall clock stepped back re-reads too.
        if at != 0 && now_us.abs_diff(at) < FLUSH_CACHE_US {
            return Flush {
                floor: self.flush_cache[0].load(Ordering::Relaxed),
                pending: self.flush_cache[1].load(Ordering::Relaxed),
            };
        }
        let f = self.flush_state_exact();
        self.cache_flush(f, now_us);
        f
    }

    fn cache_flush(&self, f: Flush, now: u64) {
        self.flush_cache[0].store(f.floor, Ordering::Relaxed);
        self.flush_cache[1].store(f.pending, Ordering::Relaxed);
        self.flush_cache[2].store(now, Ordering::Release);
    }

    fn lock(&self, key: &[u8]) -> parking_lot::MutexGuard<'_, ()> {
        self.locks[stripe(key)].lock()
    }

    /// A key's last read stamp (µs), kept in its memtable slot: the LRU's second chance.
    fn read_stamp(&self, key: &[u8]) -> u64 {
        self.node.memtable().read_stamp(key)
    }

    /// The key's entry: from the memtable, or, with CapsuleDB, read back through it when
    /// this node cannot vouch for one (evicted, or never seen here). With `read`, a client's
    /// read: stamps the key's slot with `t` and returns the stamp it had (0: none).
    fn current(&self, key: &[u8], t: Now, read: bool) -> Result<Option<(Entry, u64)>, String> {
        let m = self.node.memtable();
        if !self.backed {
            return Ok(if read { m.entry_read(key, false, t.us) } else { m.entry(key).map(|e| (e, 0)) });
        }
        let found = if read { m.entry_read(key, true, t.us) } else { m.lookup_entry(key).map(|e| (e, 0)) };
        if found.is_some() {
            return Ok(found);
        }
        let e = self.node.try_entry(key).map_err(|e| e.to_string())?;
        if let Some(v) = e.as_ref().and_then(|e| e.value.as_ref()) {
            // Back in the memtable (learned from CapsuleDB): account for it again at once (a
            // read hit only re-stamps a key read within the last second, see `lru`).
            let victims = self.lru.put(key, v.len() as u64, t.us, &|k| self.read_stamp(k));
            self.evict(victims);
        }
        Ok(e.map(|e| (e, 0)))
    }

    /// The live item of `key` (not expired, not flushed), with its CAS.
    fn live(&self, key: &[u8], t: Now, flush: Flush, count: bool) -> Result<Option<LiveItem>, String> {
        Ok(self.current(key, t, false)?.and_then(|(e, _)| self.live_of(e, t, flush, count)))
    }

    /// The live item of entry `e`. An expired or flushed item stays accounted in the LRU until
    /// it is evicted (memcached reclaims them lazily too): its value is still in the memtable,
    /// and dropping only the accounting would let such entries pile up beyond the limit.
    fn live_of(&self, e: Entry, t: Now, flush: Flush, count: bool) -> Option<LiveItem> {
        let v = e.value?;
        let it = item::decode(&v)?;
        if it.expired(t.secs) {
            if count {
                Stats::inc(&self.stats.get_expired);
            }
            return None;
        }
        if flush.hides(it.stored_us, t.us) {
            if count {
                Stats::inc(&self.stats.get_flushed);
            }
            return None;
        }
        let cas = it.cas(e.version.lamport, e.version.writer);
        Some((v, cas))
    }

    /// A read of one key that names its version (the HTTPS API's get): the live item, its
    /// record version and CAS unique, or `None` (never written, deleted, expired, flushed).
    /// `Err` when the key was evicted here and CapsuleDB did not answer. Counts as a get.
    pub fn read_versioned(&self, key: &[u8]) -> Result<Option<Versioned>, String> {
        self.read_versioned_inner(key, false).unwrap_or_else(|| Err("no answer".into()))
    }

    /// Like [`FrontEnd::read_versioned`] when this front end's memtable can answer, without
    /// waiting; `None` when only CapsuleDB can (the key was evicted, or never seen here): then
    /// call `read_versioned`, which waits for it.
    pub fn read_versioned_local(&self, key: &[u8]) -> Option<Result<Option<Versioned>, String>> {
        self.read_versioned_inner(key, true)
    }

    fn read_versioned_inner(&self, key: &[u8], local_only: bool) -> Option<Result<Option<Versioned>, String>> {
        let t = Now::read();
        let current = if local_only && self.backed {
            Ok(Some(self.node.memtable().entry_read(key, true, t.us)?))
        } else {
            self.current(key, t, true)
        };
        Stats::inc(&self.stats.cmd_get);
        let current = match current {
            Ok(c) => c,
            Err(e) => return Some(Err(e)),
        };
        let flush = self.flush_state(t.us);
        let found = current.and_then(|(e, _)| {
            let version = e.version;
            self.live_of(e, t, flush, true).map(|(item, cas)| Versioned { item, version, cas })
        });
        Stats::inc(if found.is_some() { &self.stats.get_hits } else { &self.stats.get_misses });
        Some(Ok(found))
    }

    /// The live items whose keys start with `prefix`, in key order, after `after`: at most
    /// `limit`, and whether more follow. Keys a memcached client could not name (the front
    /// end's own, which hold a space) are left out.
    pub fn scan_live(&self, prefix: &[u8], after: Option<&[u8]>, limit: usize) -> Result<ScanPage, String> {
        let t = Now::read();
        let flush = self.flush_state(t.us);
        let mut out = Vec::new();
        let mut after = after.map(<[u8]>::to_vec);
        // Expired and foreign entries are skipped, so a page may need more than one scan.
        loop {
            let want = limit.saturating_sub(out.len()) + 1;
            let page = self.node.scan(prefix, after.as_deref(), want).map_err(|e| e.to_string())?;
            let full = page.len() >= want;
            for (k, e) in page {
                after = Some(k.clone());
                if k.iter().any(|b| *b <= b' ' || *b == 0x7f) {
                    continue;
                }
                let version = e.version;
                if let Some((item, cas)) = self.live_of(e, t, flush, false) {
                    if out.len() == limit {
                        return Ok((out, true));
                    }
                    out.push((k, Versioned { item, version, cas }));
                }
            }
            if !full {
                return Ok((out, false));
            }
        }
    }

    /// Like [`FrontEnd::scan_live`] over every shard of the map this front end routes by
    /// ([`FrontEnd::serve_shard`]): each shard's page (this one's read here, the others' from
    /// one of their front ends), merged in key order ([`crate::shards::merge_pages`]). Fails,
    /// naming the shard, when a shard's front ends cannot be reached.
    pub fn scan_shards(&self, prefix: &[u8], after: Option<&[u8]>, limit: usize) -> Result<ScanPage, String> {
        let Some(sh) = self.shards() else { return self.scan_live(prefix, after, limit) };
        let limit = limit.clamp(1, crate::peer::SCAN_LIMIT_MAX as usize);
        let mut pages = vec![self.scan_live(prefix, after, limit)?];
        let req = crate::peer::ScanRequest { prefix, after, limit: limit as u32 };
        for other in (0..sh.map().shards.len() as u16).filter(|s| *s != sh.me()) {
            let (items, more) = sh.scan(other, &req)?;
            let items = items
                .into_iter()
                .map(|it| {
                    let version = Version { lamport: it.lamport, writer: it.writer };
                    (it.key, Versioned { item: Arc::from(it.item), version, cas: it.cas })
                })
                .collect();
            pages.push((items, more));
        }
        Ok(crate::shards::merge_pages(pages, limit))
    }

    /// A read of one key (get, gets, mg without T/N). Counts hits and misses.
    pub fn lookup(&self, key: &[u8]) -> Lookup {
        Stats::inc(&self.stats.cmd_get);
        let t = Now::read();
        let flush = self.flush_state(t.us);
        let found =
            self.current(key, t, true).map(|e| e.and_then(|(e, prev)| Some((self.live_of(e, t, flush, true)?, prev))));
        match found {
            Ok(Some(((value, cas), prev_read))) => {
                Stats::inc(&self.stats.get_hits);
                let victims = self.lru.touch(key, value.len() as u64, prev_read, t.us, &|k| self.read_stamp(k));
                self.evict(victims);
                Lookup::Hit { value, cas }
            }
            Ok(None) => {
                Stats::inc(&self.stats.get_misses);
                Lookup::Miss
            }
            Err(e) => {
                Stats::inc(&self.stats.get_misses);
                Lookup::Unreadable(e)
            }
        }
    }

    /// A read whose CAS unique the client will compare against (`gets`, `mg` with `c`): it
    /// runs at the key's home, where the `cas` will run, so that the unique is the home's
    /// newest and a `cas` loses only to a real concurrent write. Read where it arrives, a key
    /// written at its home within the last replication delay (up to the writer's flush time,
    /// 2 ms in a cluster) would answer an older unique, and while the key stays hot the `cas`
    /// would fail with `EXISTS` however often it was retried (`docs/protocol/memcached.md` §4).
    /// The request carries the version of this front end's own copy: if the home has not
    /// applied it yet (this front end's own write on its way there), the answer comes from
    /// that copy, so a client still reads its own writes. A home that cannot be reached also
    /// falls back to this front end's copy (a `cas` would then fail as unavailable anyway).
    /// Counts hits and misses.
    pub fn lookup_for_cas(&self, key: &[u8]) -> Lookup {
        if self.failover().is_none() && matches!(self.home(key), Home::Here) {
            return self.lookup(key);
        }
        let have = self.node.memtable().lookup_entry(key).map(|e| e.version);
        let count = |hit: bool| {
            Stats::inc(&self.stats.cmd_get);
            Stats::inc(if hit { &self.stats.get_hits } else { &self.stats.get_misses });
        };
        match self.rmw(key, Rmw::Read { have }) {
            Outcome::Item { value, cas, .. } => {
                count(true);
                Lookup::Hit { value, cas }
            }
            Outcome::NotFound => {
                count(false);
                Lookup::Miss
            }
            Outcome::Unreadable(e) => {
                count(false);
                Lookup::Unreadable(e)
            }
            Outcome::Behind => self.lookup(key),
            other => {
                tracing::debug!(?other, "gets at the key's home failed; answering from this front end's copy");
                self.lookup(key)
            }
        }
    }

    /// `set` (no condition): LWW, runs here under the local stripe lock.
    pub fn set(&self, key: &[u8], flags: u32, exptime: i64, data: &[u8], want_cas: bool) -> Outcome {
        let _g = self.lock(key);
        let t = Now::read();
        let v = item::encode(flags, absolute_expiry(exptime, t.secs), self.stamp_at(t.us), &[data]);
        self.write(key, v, want_cas, t, None)
    }

    /// [`FrontEnd::set`] without waiting: `None`, and nothing written, when it would wait (its
    /// key's stripe is busy, its writer queue or flow window is full, or local copies not yet
    /// in CapsuleDB fill the memory limit); then call `set`, which waits. For a caller that
    /// must not block (the HTTPS API's worker thread).
    pub fn try_set(&self, key: &[u8], flags: u32, exptime: i64, data: &[u8], want_cas: bool) -> Option<Outcome> {
        let _g = self.locks[stripe(key)].try_lock()?;
        let t = Now::read();
        let v = item::encode(flags, absolute_expiry(exptime, t.secs), self.stamp_at(t.us), &[data]);
        self.write_with(key, v, want_cas, t, None, false)
    }

    /// `delete` (no condition): runs here.
    pub fn delete(&self, key: &[u8]) -> Outcome {
        let _g = self.lock(key);
        let t = Now::read();
        self.delete_locked(key, None, t, self.flush_state(t.us), None)
    }

    /// An atomic batch of unconditional writes: each `(key, Some(data))` a `set` with flags 0
    /// and no expiry, each `(key, None)` a delete (a tombstone whether or not the key was
    /// live). They are written as one record that every node applies as one
    /// (`psl_node::Node::write_batch`), so no client of any front end sees some and not the
    /// others. Like `set`, each runs here, last writer wins on each key. Returns each op's
    /// version and, for a put, its CAS unique (0 for a delete); on an error nothing was
    /// written: [`Outcome::TooLarge`] for an item over the limit or a batch over one record,
    /// [`Outcome::Failed`] for a node that refused.
    pub fn batch(&self, ops: &[(&[u8], Option<&[u8]>)]) -> Result<Vec<(Version, u64)>, Outcome> {
        // Every key's stripe, in stripe order (so two batches cannot deadlock).
        let mut stripes: Vec<usize> = ops.iter().map(|(k, _)| stripe(k)).collect();
        stripes.sort_unstable();
        stripes.dedup();
        let _held: Vec<_> = stripes.iter().map(|&i| self.locks[i].lock()).collect();
        let t = Now::read();
        let items: Vec<Option<Vec<u8>>> =
            ops.iter().map(|(_, d)| d.map(|d| item::encode(0, 0, self.stamp_at(t.us), &[d]))).collect();
        if items.iter().flatten().any(|v| v.len() > self.value_max) {
            Stats::inc(&self.stats.store_too_large);
            return Err(Outcome::TooLarge);
        }
        if self.backed && items.iter().any(Option::is_some) && !self.room_for_pinned() {
            Stats::inc(&self.stats.store_no_memory);
            return Err(Outcome::Failed("local copies not yet held by CapsuleDB fill the memory limit".into()));
        }
        let writes: Vec<(&[u8], Option<&[u8]>)> =
            ops.iter().zip(&items).map(|((k, _), v)| (*k, v.as_deref())).collect();
        let versions = match self.node.write_batch(&writes, u64::MAX) {
            Ok(v) => v,
            Err(NodeError::ValueTooLarge { .. } | NodeError::BatchTooLarge { .. }) => return Err(Outcome::TooLarge),
            Err(e) => return Err(Outcome::Failed(e.to_string())),
        };
        let mut out = Vec::with_capacity(ops.len());
        for (((key, _), value), version) in ops.iter().zip(&items).zip(versions) {
            match value {
                Some(v) => {
                    Stats::inc(&self.stats.total_items);
                    let victims = self.lru.put(key, v.len() as u64, t.us, &|k| self.read_stamp(k));
                    self.evict(victims);
                    let cas = item::decode(v)
                        .map_or(cas_of(version.lamport, version.writer), |it| it.cas(version.lamport, version.writer));
                    out.push((version, cas));
                }
                None => {
                    self.lru.remove(key);
                    out.push((version, 0));
                }
            }
        }
        Ok(out)
    }

    /// Runs `op` at the key's home front end.
    pub fn rmw(&self, key: &[u8], op: Rmw<'_>) -> Outcome {
        if let Some(f) = self.failover() {
            return f.route(self, key, op);
        }
        match self.home(key) {
            Home::Local(home) => {
                Stats::inc(&self.stats.forwarded);
                home.rmw_local(key, op)
            }
            Home::Remote(peer) => {
                Stats::inc(&self.stats.forwarded);
                let o = self.call_following_hints(peer, key, &op);
                if matches!(o, Outcome::Unavailable(_)) {
                    Stats::inc(&self.stats.forward_failures);
                }
                o
            }
            Home::Here => self.rmw_local(key, op),
        }
    }

    /// Forwards `op` to `peer`; if the group fails homes over and `peer` is not the key's
    /// home now, follows the member it names (at most one hop per member, within a few
    /// seconds), as a forwarding-only front end must.
    fn call_following_hints(&self, first: Arc<PeerClient>, key: &[u8], op: &Rmw<'_>) -> Outcome {
        // The common case: the home answers (static homes, or the lease where it belongs).
        let mut answer = first.call_routed(key, op);
        match answer {
            Routed::Done(o) if !matches!(o, Outcome::Unavailable(_)) => return o,
            _ => {}
        }
        let deadline = Instant::now() + std::time::Duration::from_secs(5);
        let (members, failover): (Vec<Arc<PeerClient>>, bool) = {
            let g = self.group.read();
            let m = g
                .members
                .iter()
                .filter_map(|m| match m {
                    Member::Remote(c) => Some(c.clone()),
                    Member::Local(_) => None,
                })
                .collect();
            (m, g.client_failover)
        };
        let after = |c: &Arc<PeerClient>| {
            let at = members.iter().position(|m| Arc::ptr_eq(m, c)).unwrap_or(0);
            members[(at + 1) % members.len()].clone()
        };
        let mut peer = first;
        loop {
            let next = match answer {
                Routed::Done(Outcome::Unavailable(e)) if failover && members.len() >= 3 => {
                    // Down: the next member runs it if it is home now, or names who is.
                    tracing::debug!("forwarding: {e}; asking the next member");
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    after(&peer)
                }
                Routed::Done(o) => return o,
                Routed::NotHome(hint) => match hint.and_then(|h| members.get(h as usize)) {
                    Some(c) => c.clone(),
                    None => {
                        std::thread::sleep(std::time::Duration::from_millis(10));
                        after(&peer)
                    }
                },
            };
            if Instant::now() >= deadline {
                return Outcome::Unavailable(format!(
                    "home front end of this key unavailable: no member of the group served it within 5 s (last asked {})",
                    peer.addr()
                ));
            }
            peer = next;
            answer = peer.call_routed(key, op);
        }
    }

    /// Runs `op` here, under the key's stripe lock.
    pub fn rmw_local(&self, key: &[u8], op: Rmw<'_>) -> Outcome {
        let _g = self.lock(key);
        self.rmw_locked(key, op, None)
    }

    /// Runs `op` (the caller holds the key's stripe lock); with `fence`, its write is fenced.
    fn rmw_locked(&self, key: &[u8], op: Rmw<'_>, fence: Option<&Fence>) -> Outcome {
        let t = Now::read();
        let now = t.secs;
        let flush = self.flush_state(t.us);
        let st = &self.stats;
        match op {
            Rmw::Store { mode, flags, exptime, cas, data } => {
                let cur = match self.live(key, t, flush, false) {
                    Ok(c) => c,
                    Err(e) => return Outcome::Unreadable(e),
                };
                if let Some(c) = cas {
                    match &cur {
                        None => {
                            Stats::inc(&st.cas_misses);
                            return Outcome::NotFound;
                        }
                        Some((_, have)) if *have != c => {
                            Stats::inc(&st.cas_badval);
                            return Outcome::Exists;
                        }
                        Some(_) => Stats::inc(&st.cas_hits),
                    }
                }
                let value = match (mode, &cur) {
                    (StoreMode::Add, Some(_)) => return Outcome::NotStored,
                    (StoreMode::Replace | StoreMode::Append | StoreMode::Prepend, None) => return Outcome::NotStored,
                    (StoreMode::Append | StoreMode::Prepend, Some((old, _))) => {
                        let Some(o) = item::decode(old) else { return Outcome::NotStored };
                        if o.data.len() + data.len() + item::HEADER > self.value_max {
                            return Outcome::TooLarge;
                        }
                        let parts: [&[u8]; 2] = if mode == StoreMode::Append { [o.data, data] } else { [data, o.data] };
                        item::encode(o.flags, o.expiry, self.stamp_at(t.us), &parts)
                    }
                    _ => item::encode(flags, absolute_expiry(exptime, now), self.stamp_at(t.us), &[data]),
                };
                self.write(key, value, true, t, fence)
            }
            Rmw::Delete { cas } => self.delete_locked(key, cas, t, flush, fence),
            Rmw::Arith { incr, delta, create, ttl, cas } => {
                let (hits, misses) =
                    if incr { (&st.incr_hits, &st.incr_misses) } else { (&st.decr_hits, &st.decr_misses) };
                let cur = match self.live(key, t, flush, false) {
                    Ok(c) => c,
                    Err(e) => return Outcome::Unreadable(e),
                };
                let Some((old, have)) = cur else {
                    if let Some((initial, exptime)) = create {
                        Stats::inc(misses);
                        let expiry = absolute_expiry(exptime, now);
                        let v = item::encode(0, expiry, self.stamp_at(t.us), &[initial.to_string().as_bytes()]);
                        return match self.write(key, v, true, t, fence) {
                            Outcome::Stored { cas } => {
                                Outcome::Number { value: initial, cas, ttl: ttl_of(expiry, now) }
                            }
                            other => other,
                        };
                    }
                    Stats::inc(misses);
                    return Outcome::NotFound;
                };
                if cas.is_some_and(|c| c != have) {
                    return Outcome::Exists;
                }
                let Some(o) = item::decode(&old) else { return Outcome::NonNumeric };
                let Some(n) = parse_counter(o.data) else { return Outcome::NonNumeric };
                let value = if incr { n.wrapping_add(delta) } else { n.saturating_sub(delta) };
                let expiry = ttl.map_or(o.expiry, |t| absolute_expiry(t, now));
                let v = item::encode(o.flags, expiry, self.stamp_at(t.us), &[value.to_string().as_bytes()]);
                Stats::inc(hits);
                match self.write(key, v, true, t, fence) {
                    Outcome::Stored { cas } => Outcome::Number { value, cas, ttl: ttl_of(expiry, now) },
                    other => other,
                }
            }
            Rmw::Touch { exptime, vivify } => self.touch_locked(key, (exptime, vivify), t, flush, fence),
            Rmw::Read { have } => {
                let cur = match self.current(key, t, false) {
                    Ok(c) => c,
                    Err(e) => return Outcome::Unreadable(e),
                };
                // The forwarder's copy is newer than anything applied here: its own write is
                // on its way; it answers from that copy.
                if have.is_some_and(|h| cur.as_ref().is_none_or(|(e, _)| e.version < h)) {
                    return Outcome::Behind;
                }
                match cur.and_then(|(e, _)| self.live_of(e, t, flush, false)) {
                    Some((value, cas)) => Outcome::Item { value, cas, won: false },
                    None => Outcome::NotFound,
                }
            }
        }
    }

    /// Runs a touch (the caller holds the key's stripe lock): re-times the item, or vivifies a miss.
    fn touch_locked(
        &self,
        key: &[u8],
        (exptime, vivify): (Option<i64>, Option<i64>),
        t: Now,
        flush: Flush,
        fence: Option<&Fence>,
    ) -> Outcome {
        let now = t.secs;
        let cur = match self.live(key, t, flush, false) {
            Ok(c) => c,
            Err(e) => return Outcome::Unreadable(e),
        };
        let Some((old, have)) = cur else {
            if let Some(ttl) = vivify {
                let v = item::encode(0, absolute_expiry(ttl, now), self.stamp_at(t.us), &[]);
                return match self.write(key, v.clone(), true, t, fence) {
                    Outcome::Stored { cas } => Outcome::Item { value: v.into(), cas, won: true },
                    other => other,
                };
            }
            if exptime.is_some() {
                Stats::inc(&self.stats.touch_misses);
            }
            return Outcome::NotFound;
        };
        let Some(ttl) = exptime else { return Outcome::Item { value: old, cas: have, won: false } };
        Stats::inc(&self.stats.touch_hits);
        let Some(o) = item::decode(&old) else { return Outcome::NotFound };
        // memcached keeps the unique through a touch: the new version carries it.
        let v = item::encode_keeping(o.flags, absolute_expiry(ttl, now), self.stamp_at(t.us), have, &[o.data]);
        match self.write(key, v.clone(), true, t, fence) {
            Outcome::Stored { cas } => Outcome::Item { value: v.into(), cas, won: false },
            other => other,
        }
    }

    fn delete_locked(&self, key: &[u8], cas: Option<u64>, t: Now, flush: Flush, fence: Option<&Fence>) -> Outcome {
        let cur = match self.live(key, t, flush, false) {
            Ok(c) => c,
            Err(e) => return Outcome::Unreadable(e),
        };
        let Some((_, have)) = cur else {
            Stats::inc(&self.stats.delete_misses);
            return Outcome::NotFound;
        };
        if cas.is_some_and(|c| c != have) {
            return Outcome::Exists;
        }
        let done = match fence {
            None => self.node.delete(key),
            Some(f) => self.node.write_below(key, None, f.below).map(|version| {
                f.wrote.set(Some(Held { key: key.to_vec(), version, value: None }));
            }),
        };
        match done {
            Ok(()) => {
                Stats::inc(&self.stats.delete_hits);
                self.lru.remove(key);
                Outcome::Deleted
            }
            Err(e) => Outcome::Failed(e.to_string()),
        }
    }

    /// Stores an encoded item (caller holds the key's stripe lock).
    fn write(&self, key: &[u8], value: Vec<u8>, want_cas: bool, t: Now, fence: Option<&Fence>) -> Outcome {
        self.write_with(key, value, want_cas, t, fence, true)
            .unwrap_or_else(|| Outcome::Failed("a write that may wait did not".into()))
    }

    /// [`FrontEnd::write`]; without `wait`, `None` (nothing written) where it would wait.
    fn write_with(
        &self,
        key: &[u8],
        value: Vec<u8>,
        want_cas: bool,
        t: Now,
        fence: Option<&Fence>,
        wait: bool,
    ) -> Option<Outcome> {
        if value.len() > self.value_max {
            Stats::inc(&self.stats.store_too_large);
            return Some(Outcome::TooLarge);
        }
        let size = value.len() as u64;
        if self.backed {
            let room = if wait {
                self.room_for_pinned()
            } else {
                self.drain_pinned();
                if self.pinned_bytes.load(Ordering::Relaxed) > self.cfg.memory_limit {
                    return None;
                }
                true
            };
            if !room {
                Stats::inc(&self.stats.store_no_memory);
                return Some(Outcome::Failed("local copies not yet held by CapsuleDB fill the memory limit".into()));
            }
        }
        // Unfenced writes take any Lamport time (u64::MAX is never reached).
        let below = fence.map_or(u64::MAX, |f| f.below);
        let written = if wait {
            self.node.write_below(key, Some(&value), below).map(Some)
        } else {
            self.node.try_write_below(key, Some(&value), below)
        };
        let version = match written {
            Ok(Some(version)) => version,
            Ok(None) => return None,
            Err(NodeError::ValueTooLarge { .. }) => return Some(Outcome::TooLarge),
            Err(e @ NodeError::Fenced { .. }) => {
                return Some(Outcome::Unavailable(format!("home front end at its lease's ceiling ({e}); retry")))
            }
            Err(e @ NodeError::Superseded { .. }) => return Some(Outcome::Failed(e.to_string())),
            Err(e) => {
                Stats::inc(&self.stats.store_no_memory);
                return Some(Outcome::Failed(e.to_string()));
            }
        };
        Stats::inc(&self.stats.total_items);
        let victims = self.lru.put(key, size, t.us, &|k| self.read_stamp(k));
        self.evict(victims);
        // The unique of the version this write made (not of whatever the memtable shows by
        // now: a newer write from elsewhere may already have replaced it).
        let cas = if want_cas {
            match item::decode(&value) {
                Some(it) => it.cas(version.lamport, version.writer),
                None => cas_of(version.lamport, version.writer),
            }
        } else {
            0
        };
        if let Some(f) = fence {
            f.wrote.set(Some(Held { key: key.to_vec(), version, value: Some(Arc::from(value)) }));
        }
        Some(Outcome::Stored { cas })
    }

    /// Drops this front end's local copy of each victim.
    ///
    /// Without CapsuleDB: a local tombstone just above the entry's version, applied to this
    /// node's memtable only (never sealed or sent). Any newer write of the key, from any node,
    /// still replaces it; until one comes the key reads as missing here, while other nodes
    /// keep their copies.
    ///
    /// With CapsuleDB: the entry leaves the memtable only if CapsuleDB holds its version
    /// (`Memtable::evict_key`), so a later read asks CapsuleDB and gets the same version, hence
    /// the same value, flags and CAS unique. A victim CapsuleDB does not hold yet (written
    /// since its last frontier) is *pinned*: queued, still counted as memory, and evicted by
    /// a later write once CapsuleDB's frontier covers it ([`FrontEnd::drain_pinned`]).
    fn evict(&self, victims: Vec<Victim>) {
        if self.backed {
            self.drain_pinned();
            for (k, size) in victims {
                match self.node.memtable().evict_key(&k) {
                    EvictKey::Evicted => Stats::inc(&self.stats.evictions),
                    EvictKey::Absent => {}
                    EvictKey::Pinned => {
                        self.pinned.lock().push_back((k, size));
                        self.pinned_bytes.fetch_add(size, Ordering::Relaxed);
                        self.pinned_len.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            return;
        }
        for (k, _) in victims {
            let Some(e) = self.node.entry(&k) else { continue };
            if e.value.is_none() {
                continue;
            }
            let v = e.version;
            let above = match v.writer.checked_add(1) {
                Some(w) => Version { lamport: v.lamport, writer: w },
                None => Version { lamport: v.lamport.saturating_add(1), writer: 0 },
            };
            if self.node.memtable().apply(&k, above, None) {
                Stats::inc(&self.stats.evictions);
            }
        }
    }

    /// With CapsuleDB: evicts pinned victims from the oldest on, up to [`PINNED_CHECK_MAX`],
    /// stopping at the first one CapsuleDB still does not hold. A victim accounted again since
    /// (written or read: the LRU owns it) or gone (deleted) just leaves the queue.
    fn drain_pinned(&self) {
        if self.pinned_len.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut q = self.pinned.lock();
        for _ in 0..PINNED_CHECK_MAX {
            let Some((k, size)) = q.front() else { break };
            let size = *size;
            if !self.lru.contains(k) {
                match self.node.memtable().evict_key(k) {
                    EvictKey::Pinned => break,
                    EvictKey::Evicted => Stats::inc(&self.stats.evictions),
                    EvictKey::Absent => {}
                }
            }
            q.pop_front();
            self.pinned_bytes.fetch_sub(size, Ordering::Relaxed);
            self.pinned_len.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// With CapsuleDB: whether a write may go ahead. Pinned copies may take up to the memory
    /// limit on top of it (so at most twice the limit in all); past that the write waits,
    /// bounded by [`PINNED_WAIT`], for CapsuleDB's frontier to catch up.
    fn room_for_pinned(&self) -> bool {
        let deadline = Instant::now() + PINNED_WAIT;
        loop {
            self.drain_pinned();
            if self.pinned_bytes.load(Ordering::Relaxed) <= self.cfg.memory_limit {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }

    /// flush_all: items stored before now (delay ≤ 0) or before the delay's time read as
    /// missing from then on, on every front end of the capsule (the state is a replicated key).
    pub fn flush_all(&self, delay: i64) -> Outcome {
        Stats::inc(&self.stats.cmd_flush);
        let _g = self.lock(FLUSH_KEY);
        let now_us = self.stamp();
        let mut f = self.flush_state_exact();
        if f.pending != 0 && f.pending <= now_us {
            f.floor = f.floor.max(f.pending);
        }
        if delay <= 0 {
            f.floor = f.floor.max(now_us);
            f.pending = 0;
            // The flushed items stay accounted until the LRU evicts them (see `live_of`).
        } else {
            let at = absolute_expiry(delay, unix_now());
            f.pending = (at.max(0) as u64).saturating_mul(1_000_000);
        }
        match self.node.put(FLUSH_KEY, &f.encode()) {
            Ok(()) => {
                self.cache_flush(f, unix_us());
                Outcome::Stored { cas: 0 }
            }
            Err(e) => Outcome::Failed(e.to_string()),
        }
    }

    /// (items, bytes) this front end accounts for (`curr_items`, `bytes`): the LRU's, plus
    /// pinned copies waiting for CapsuleDB.
    pub fn totals(&self) -> (u64, u64) {
        let (i, b) = self.lru.totals();
        (i + self.pinned_len.load(Ordering::Relaxed), b + self.pinned_bytes.load(Ordering::Relaxed))
    }
}

/// The home side of the peer channel ([`crate::peer::PeerServer`]).
impl PeerService for FrontEnd {
    /// Run here (static homes), or, with failover, only if this front end is the key's home now.
    fn serve_forwarded(&self, key: &[u8], op: Rmw<'_>) -> Routed {
        match self.failover() {
            Some(f) => f.serve_forwarded(self, key, op),
            None => Routed::Done(self.rmw_local(key, op)),
        }
    }

    fn handle_ctl(&self, req: &Ctl) -> Option<CtlReply> {
        self.failover().map(|f| f.handle(req))
    }

    /// A page of this front end's own shard, bounded in bytes so that the reply fits a frame
    /// (it then says `more`; the first item is always sent).
    fn serve_scan(&self, req: &crate::peer::ScanRequest<'_>) -> crate::peer::ScanReply {
        Stats::inc(&self.stats.shard_served);
        let (page, mut more) = self.scan_live(req.prefix, req.after, req.limit as usize)?;
        let mut bytes = 0usize;
        let mut items = Vec::with_capacity(page.len());
        for (key, v) in page {
            bytes += key.len() + v.item.len() + 26;
            if bytes > crate::peer::SCAN_REPLY_BYTES_MAX && !items.is_empty() {
                more = true;
                break;
            }
            items.push(crate::peer::ScanItem {
                key,
                item: v.item.to_vec(),
                lamport: v.version.lamport,
                writer: v.version.writer,
                cas: v.cas,
            });
        }
        Ok((items, more))
    }

    /// Runs the command here if its key is this shard's under this front end's map, and
    /// refuses it otherwise (never forwards it again).
    fn serve_command(&self, raw: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let limits = self.config().limits;
        match crate::proto::parse(raw, &limits) {
            crate::proto::Parsed::Cmd { cmd, used } if used == raw.len() => {
                let Some(sh) = self.shards() else {
                    out.extend_from_slice(b"SERVER_ERROR a command forwarded from another shard to a front end that serves no shard map\r\n");
                    return out;
                };
                let keys: Vec<&[u8]> = match &cmd {
                    crate::proto::Command::Get { keys, .. } => keys.iter().collect(),
                    c => c.key().into_iter().collect(),
                };
                for key in keys {
                    if let Some(other) = sh.elsewhere(key) {
                        Stats::inc(&self.stats.shard_misrouted);
                        let _ = write!(
                            out,
                            "SERVER_ERROR key of shard {other}, not this front end's shard {} (map version {})\r\n",
                            sh.me(),
                            sh.map().map_version
                        );
                        return out;
                    }
                }
                Stats::inc(&self.stats.shard_served);
                let _ = self.execute(&cmd, &mut out);
            }
            _ => out.extend_from_slice(b"CLIENT_ERROR a forwarded command must be exactly one complete request\r\n"),
        }
        out
    }
}

/// What home failover ([`crate::failover`]) does through this front end.
impl FailoverHost for FrontEnd {
    fn node(&self) -> &Arc<Node> {
        &self.node
    }

    fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The stripe lock is held throughout, so the next command on the key decides on a write
    /// the acceptors hold.
    fn rmw_home(&self, f: &Failover, key: &[u8], op: Rmw<'_>, slot: usize, lease: Lease) -> Outcome {
        let _g = self.lock(key);
        let fence = Fence { below: lease.ceiling, wrote: Cell::new(None) };
        let o = self.rmw_locked(key, op, Some(&fence));
        if let Some(h) = fence.wrote.take() {
            f.mark_dirty(slot);
            if !f.replicate(slot, lease.ballot, vec![h]) {
                return Outcome::Unavailable(
                    "home front end could not store this write on a majority of its group; it may still be applied"
                        .into(),
                );
            }
        }
        if !f.still_home(slot, lease.ballot) {
            return Outcome::Unavailable("home front end's lease of this key ended; retry".into());
        }
        o
    }

    /// "Newer" counts what this node holds after the hand-over's `sync()`, or in CapsuleDB.
    fn rewrite_held(&self, h: &Held, below: u64) -> Result<Option<Held>, String> {
        let _g = self.lock(&h.key);
        let t = Now::read();
        let cur = self.current(&h.key, t, false)?;
        if cur.as_ref().is_some_and(|(e, _)| e.version >= h.version) {
            return Ok(None);
        }
        let value: Option<Vec<u8>> = h.value.as_ref().map(|v| match item::decode(v) {
            Some(it) => {
                let unique = it.cas(h.version.lamport, h.version.writer);
                item::encode_keeping(it.flags, it.expiry, it.stored_us, unique, &[it.data])
            }
            None => v.to_vec(),
        });
        let version = self
            .node
            .write_below(&h.key, value.as_deref(), below)
            .map_err(|e| format!("rewriting a held write: {e}"))?;
        match &value {
            Some(v) => {
                let victims = self.lru.put(&h.key, v.len() as u64, t.us, &|k| self.read_stamp(k));
                self.evict(victims);
            }
            None => self.lru.remove(&h.key),
        }
        Ok(Some(Held { key: h.key.clone(), version, value: value.map(Arc::from) }))
    }
}

/// A live item (encoded) and its CAS unique.
type LiveItem = (Arc<[u8]>, u64);

/// A page of [`FrontEnd::scan_live`]: the items in key order, and whether more follow.
pub type ScanPage = (Vec<(Vec<u8>, Versioned)>, bool);

/// A live item with the record version that holds it ([`FrontEnd::read_versioned`]).
#[derive(Debug, Clone)]
pub struct Versioned {
    /// The encoded item (header and payload, see [`crate::item::decode`]).
    pub item: Arc<[u8]>,
    /// The record version `(lamport, writer)` of the write that made it.
    pub version: Version,
    /// Its CAS unique.
    pub cas: u64,
}

/// The lock stripe of `key`.
fn stripe(key: &[u8]) -> usize {
    (key_hash(key) % LOCK_STRIPES as u64) as usize
}

fn ttl_of(expiry: i64, now: i64) -> i64 {
    if expiry == 0 {
        -1
    } else {
        (expiry - now).max(0)
    }
}
