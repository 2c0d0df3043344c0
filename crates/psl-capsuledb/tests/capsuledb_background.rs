//! Background compaction: reads running during compactions (and freezes) always see the newest
//! applied version; a crash at any moment of a compaction restarts from the newest index, and
//! the writes above its frontier replayed give back the model.
mod common;

use common::*;
use psl_capsuledb::{BlockStore, CapsuleDb, Config, MemStore, RecordHash, Version};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const KEYS: u64 = 64;

fn key(k: u64) -> Vec<u8> {
    format!("key-{k:03}").into_bytes()
}

/// The write at Lamport time `l`: its key, and a value or (every 7th) a tombstone.
fn write(l: u64) -> (Vec<u8>, Option<Vec<u8>>) {
    let k = l.wrapping_mul(0x9E37_79B9_7F4A_7C15) % KEYS;
    (key(k), (!l.is_multiple_of(7)).then(|| format!("v{l}").into_bytes()))
}

fn config(drop_tombstones: bool) -> Config {
    Config {
        memtable_entries_max: 8,
        l0_blocks_max: 2,
        fanout: 2,
        block_entries_max: 4,
        cache_blocks_max: 4,
        drop_tombstones,
    }
}

/// A store whose writes take a little time, so that compactions last long enough to be
/// overlapped by reads and crash points.
struct SlowStore {
    inner: Arc<MemStore>,
    put_delay: Duration,
}

impl BlockStore for SlowStore {
    fn put(&self, hash: RecordHash, bytes: Vec<u8>) -> std::io::Result<()> {
        std::thread::sleep(self.put_delay);
        self.inner.put(hash, bytes)
    }
    fn get(&self, hash: &RecordHash) -> Option<Vec<u8>> {
        self.inner.get(hash)
    }
}

fn slow(inner: &Arc<MemStore>) -> Vec<Arc<dyn BlockStore>> {
    vec![Arc::new(SlowStore { inner: inner.clone(), put_delay: Duration::from_micros(300) }) as Arc<dyn BlockStore>]
}

#[test]
fn capsuledb_reads_during_background_compaction_match_model() {
    for drop_tombstones in [false, true] {
        let store = MemStore::new();
        let mut db = CapsuleDb::create(config(drop_tombstones), slow(&store), verifier(), author(1)).unwrap();
        db.start_compactor().unwrap();
        // Per key, the Lamport time of its last applied write (0: none yet), and of the write
        // being applied (set before `apply`, so a read may already see it).
        let last: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
        let started: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
        let done = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..2u64)
            .map(|t| {
                let (r, last, started, done) = (db.reader(), last.clone(), started.clone(), done.clone());
                std::thread::spawn(move || {
                    let mut reads = 0u64;
                    let mut k = t;
                    while !done.load(Ordering::Acquire) {
                        k = (k * 31 + 17) % KEYS;
                        let lo = last[k as usize].load(Ordering::Acquire);
                        let cell = r.get_cell(&key(k)).unwrap();
                        let hi = started[k as usize].load(Ordering::Acquire);
                        match cell {
                            // Nothing: no write yet, or (tombstones dropped) a delete.
                            None => assert!(
                                lo == 0 || (drop_tombstones && (write(lo).1.is_none() || hi > lo)),
                                "key {k}: nothing read, but version {lo} was applied"
                            ),
                            Some((v, val)) => {
                                assert!(
                                    v.lamport >= lo && v.lamport <= hi,
                                    "key {k}: read {} outside [{lo}, {hi}]",
                                    v.lamport
                                );
                                assert_eq!(val, write(v.lamport).1, "key {k}: value of version {}", v.lamport);
                            }
                        }
                        reads += 1;
                    }
                    reads
                })
            })
            .collect();
        let n = 1500u64;
        for l in 1..=n {
            let (k, v) = write(l);
            let ki = l.wrapping_mul(0x9E37_79B9_7F4A_7C15) % KEYS;
            started[ki as usize].store(l, Ordering::Release);
            db.apply(&k, Version::new(l, 1), v).unwrap();
            last[ki as usize].store(l, Ordering::Release);
        }
        db.flush().unwrap();
        db.wait_compactions().unwrap();
        done.store(true, Ordering::Release);
        let reads: u64 = readers.into_iter().map(|h| h.join().unwrap()).sum();
        assert!(reads > 0);
        let s = db.stats();
        assert!(s.compactions > 3, "compactions: {}", s.compactions);
        assert_eq!(s.rejected_copies, 0);
        // Settled: every level within its bound, and the final state from storage alone.
        let newest = db.newest_index();
        drop(db);
        let mut db = reopen(config(drop_tombstones), &[&store], newest, 3);
        for k in 0..KEYS {
            let l = last[k as usize].load(Ordering::Relaxed);
            let want = if l == 0 { None } else { write(l).1 };
            assert_eq!(db.get(&key(k)).unwrap(), want, "key {k} after restart");
        }
    }
}

#[test]
fn capsuledb_crash_mid_compaction_restarts_from_newest_index() {
    let store = MemStore::new();
    let cfg = config(false);
    let mut db = CapsuleDb::create(cfg, slow(&store), verifier(), author(1)).unwrap();
    db.start_compactor().unwrap();
    let mut model: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
    let mut log: Vec<(u64, Vec<u8>, Option<Vec<u8>>)> = Vec::new();
    let mut mid_compaction = 0;
    let mut crashes = 0u64;
    for l in 1..=1200u64 {
        let (k, v) = write(l);
        db.apply(&k, Version::new(l, 1), v.clone()).unwrap();
        model.insert(k.clone(), v.clone());
        log.push((l, k, v));
        if l % 97 != 0 {
            continue;
        }
        // A crash now: what the store holds, and the newest index recorded before it.
        if db.compacting() {
            mid_compaction += 1;
        }
        let newest = db.newest_index();
        let copy = store.snapshot();
        crashes += 1;
        let mut back = reopen(cfg, &[&copy], newest, 1000 + crashes);
        let f = back.frontier().get(&1).copied().unwrap_or(0);
        for (lw, k, v) in log.iter().filter(|(lw, _, _)| *lw > f) {
            back.apply(k, Version::new(*lw, 1), v.clone()).unwrap();
        }
        // The restarted database compacts what the crash left and serves the model.
        back.start_compactor().unwrap();
        back.flush().unwrap();
        back.wait_compactions().unwrap();
        for k in 0..KEYS {
            assert_eq!(back.get(&key(k)).unwrap(), model.get(&key(k)).cloned().flatten(), "key {k}, crash at {l}");
        }
    }
    assert!(mid_compaction > 0, "no crash point fell inside a compaction");
}

#[derive(Debug, Clone)]
enum Op {
    /// Key, Lamport time, writer: versions arrive in any order (SCL delivers writers
    /// independently); the version decides put or delete.
    Write(u8, u64, u32),
    Get(u8),
    Restart,
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        8 => (0u8..24, 1u64..400, 0u32..3).prop_map(|(k, l, w)| Op::Write(k, l, w)),
        3 => (0u8..24).prop_map(Op::Get),
        1 => Just(Op::Restart),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 32, ..Default::default() })]

    /// The model test with the background compactor running: every read matches a
    /// last-writer-wins model whatever compaction is under way; a restart reopens the newest
    /// index and replays every write so far (re-applying a write the index holds is harmless:
    /// the newest version wins).
    #[test]
    fn capsuledb_background_compaction_matches_model(
        m in 1usize..6, l0 in 1usize..4, b in 1usize..6,
        ops in proptest::collection::vec(op(), 1..200),
    ) {
        let cfg = Config { memtable_entries_max: m, l0_blocks_max: l0, fanout: 2, block_entries_max: b, cache_blocks_max: 2, drop_tombstones: false };
        let store = MemStore::new();
        let mut db = create(cfg, &[&store]);
        db.start_compactor().unwrap();
        let mut model: BTreeMap<Vec<u8>, (Version, Option<Vec<u8>>)> = BTreeMap::new();
        let mut log: Vec<(Vec<u8>, Version, Option<Vec<u8>>)> = Vec::new();
        let mut restarts = 0u64;
        for op in ops {
            match op {
                Op::Write(k, l, w) => {
                    let ver = Version::new(l, w);
                    let val = (!(l + w as u64).is_multiple_of(5)).then(|| format!("{k}:{l}:{w}").into_bytes());
                    let key = key(k as u64);
                    db.apply(&key, ver, val.clone()).unwrap();
                    if model.get(&key).is_none_or(|(v, _)| *v < ver) {
                        model.insert(key.clone(), (ver, val.clone()));
                    }
                    log.push((key, ver, val));
                }
                Op::Get(k) => {
                    let key = key(k as u64);
                    proptest::prop_assert_eq!(db.get_cell(&key).unwrap(), model.get(&key).cloned(), "get {}", k);
                }
                Op::Restart => {
                    restarts += 1;
                    let newest = db.newest_index();
                    drop(db);
                    db = reopen(cfg, &[&store], newest, 300 + restarts);
                    db.start_compactor().unwrap();
                    for (k, ver, val) in &log {
                        db.apply(k, *ver, val.clone()).unwrap();
                    }
                }
            }
        }
        db.flush().unwrap();
        db.wait_compactions().unwrap();
        for k in 0u64..24 {
            proptest::prop_assert_eq!(db.get_cell(&key(k)).unwrap(), model.get(&key(k)).cloned(), "settled {}", k);
        }
    }
}
