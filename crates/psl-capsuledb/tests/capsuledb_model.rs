//! Model test: random put/delete/get/restart sequences against a BTreeMap, with tiny block and
//! level sizes so that freezes and compactions happen constantly.
mod common;

use common::*;
use proptest::prelude::*;
use psl_capsuledb::{Config, MemStore, Version};
use std::collections::BTreeMap;

#[derive(Debug, Clone)]
enum Op {
    Put(u8, u8),
    Delete(u8),
    Get(u8),
    /// Prefix choice, `after` key, limit.
    Scan(u8, Option<u8>, usize),
    Restart,
}

const PREFIXES: [&str; 4] = ["", "key-", "key-0", "key-01"];

/// A scan against the model: in key order, each live entry the model's; with a limit past
/// every key, exactly the model's range and no `more`.
fn check_scan(
    db: &psl_capsuledb::CapsuleDb,
    model: &BTreeMap<Vec<u8>, Vec<u8>>,
    p: u8,
    after: Option<u8>,
    limit: usize,
) -> Result<(), TestCaseError> {
    let prefix = PREFIXES[p as usize % 4].as_bytes();
    let after = after.map(key);
    let (got, more) = db.reader().scan(prefix, after.as_deref(), limit).unwrap();
    prop_assert!(got.len() <= limit);
    prop_assert!(got.windows(2).all(|w| w[0].0 < w[1].0), "scan keys in order");
    let want: Vec<(Vec<u8>, Vec<u8>)> = model
        .iter()
        .filter(|(k, _)| k.starts_with(prefix) && after.as_ref().is_none_or(|a| *k > a))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let live: Vec<(Vec<u8>, Vec<u8>)> = got.into_iter().filter_map(|(k, (_, v))| v.map(|v| (k, v))).collect();
    for (k, v) in &live {
        prop_assert_eq!(model.get(k), Some(v), "scanned {:?}", String::from_utf8_lossy(k));
    }
    if limit >= 64 {
        prop_assert!(!more);
        prop_assert_eq!(live, want);
    } else {
        // The live keys scanned are the model's first ones.
        prop_assert_eq!(&live[..], &want[..live.len()]);
    }
    Ok(())
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..48, any::<u8>()).prop_map(|(k, v)| Op::Put(k, v)),
        2 => (0u8..48).prop_map(Op::Delete),
        3 => (0u8..48).prop_map(Op::Get),
        2 => (0u8..4, proptest::option::of(0u8..48), prop_oneof![1usize..10, Just(64)]).prop_map(|(p, a, l)| Op::Scan(p, a, l)),
        1 => Just(Op::Restart),
    ]
}

fn key(k: u8) -> Vec<u8> {
    format!("key-{k:03}").into_bytes()
}

fn value(k: u8, v: u8, lamport: u64) -> Vec<u8> {
    let mut out = format!("v{k}:{v}:{lamport}:").into_bytes();
    out.resize(out.len() + (v as usize % 40), v);
    out
}

fn config() -> impl Strategy<Value = Config> {
    (1usize..6, 1usize..4, 2usize..4, 1usize..6, 1usize..6, any::<bool>()).prop_map(|(m, l0, f, b, c, d)| Config {
        memtable_entries_max: m,
        l0_blocks_max: l0,
        fanout: f,
        block_entries_max: b,
        cache_blocks_max: c,
        drop_tombstones: d,
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn capsuledb_matches_btreemap_model(config in config(), ops in proptest::collection::vec(op(), 1..260)) {
        let store = MemStore::new();
        let mut db = create(config, &[&store]);
        let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        // Writes since the newest index: what a restart must replay.
        let mut log: Vec<(Vec<u8>, Version, Option<Vec<u8>>)> = Vec::new();
        let mut lamport = 0u64;
        let mut restarts = 0u64;
        for op in ops {
            match op {
                Op::Put(k, _) | Op::Delete(k) => {
                    lamport += 1;
                    let ver = Version::new(lamport, 1);
                    let val = match op { Op::Put(_, v) => Some(value(k, v, lamport)), _ => None };
                    let before = db.index_seq();
                    db.apply(&key(k), ver, val.clone()).unwrap();
                    match &val { Some(x) => { model.insert(key(k), x.clone()); } None => { model.remove(&key(k)); } }
                    if db.index_seq() != before { log.clear(); } else { log.push((key(k), ver, val)); }
                }
                Op::Get(k) => {
                    prop_assert_eq!(db.get(&key(k)).unwrap(), model.get(&key(k)).cloned(), "get {}", k);
                }
                Op::Scan(p, a, l) => check_scan(&db, &model, p, a, l)?,
                Op::Restart => {
                    restarts += 1;
                    let newest = db.newest_index();
                    drop(db);
                    db = reopen(config, &[&store], newest, 100 + restarts);
                    for (k, ver, val) in &log {
                        let before = db.index_seq();
                        db.apply(k, *ver, val.clone()).unwrap();
                        prop_assert_eq!(db.index_seq(), before, "replay must not cross a freeze");
                    }
                }
            }
        }
        for k in 0u8..48 {
            prop_assert_eq!(db.get(&key(k)).unwrap(), model.get(&key(k)).cloned(), "final get {}", k);
        }
        // And once more from storage alone, after a flush and restart.
        db.flush().unwrap();
        let newest = db.newest_index();
        let mut db = reopen(config, &[&store], newest, 99_999);
        for k in 0u8..48 {
            prop_assert_eq!(db.get(&key(k)).unwrap(), model.get(&key(k)).cloned(), "after restart {}", k);
        }
        for p in 0..4 {
            check_scan(&db, &model, p, None, 64)?;
        }
        let s = db.stats();
        prop_assert_eq!(s.rejected_copies, 0);
    }
}

/// Deterministic: many overlapping L0 runs (the prototype's bug was overlapping L0 blocks),
/// each of several blocks, with updates to the same keys.
#[test]
fn capsuledb_overlapping_l0_blocks_all_checked() {
    let config = Config {
        memtable_entries_max: 2,
        // Runs and entries both under the bound at the end (6 runs of 3 entries): nothing is
        // compacted out of level 0.
        l0_blocks_max: 16,
        fanout: 2,
        block_entries_max: 2,
        cache_blocks_max: 2,
        drop_tombstones: true,
    };
    let store = MemStore::new();
    let mut db = create(config, &[&store]);
    let mut lamport = 0;
    let mut model = BTreeMap::new();
    for round in 0..6u8 {
        for k in [b'a', b'm', b'z'] {
            lamport += 1;
            let key = vec![k, round % 2];
            let v = vec![round, k];
            db.put(&key, Version::new(lamport, 1), v.clone()).unwrap();
            model.insert(key, v);
        }
    }
    let index = db.index();
    let runs: Vec<_> = psl_capsuledb::lsm::l0_runs(&index.levels[0]).collect();
    assert!(runs.len() > 1, "L0 holds several overlapping runs");
    assert!(runs.iter().all(|r| r.len() == 2), "each freeze of 3 entries is a run of 2 blocks");
    db.clear_cache();
    for (k, v) in &model {
        assert_eq!(db.get(k).unwrap().as_ref(), Some(v));
    }
}

/// Deterministic: enough writes for several levels; reads from storage alone after a restart.
#[test]
fn capsuledb_many_levels_after_restart() {
    let config = Config {
        memtable_entries_max: 8,
        l0_blocks_max: 2,
        fanout: 2,
        block_entries_max: 8,
        cache_blocks_max: 4,
        drop_tombstones: true,
    };
    let store = MemStore::new();
    let mut db = create(config, &[&store]);
    let mut model = BTreeMap::new();
    for i in 0..3000u64 {
        let k = format!("k{:05}", (i * 7919) % 1500).into_bytes();
        let ver = Version::new(i + 1, 1);
        if i % 5 == 4 {
            db.delete(&k, ver).unwrap();
            model.remove(&k);
        } else {
            db.put(&k, ver, i.to_le_bytes().to_vec()).unwrap();
            model.insert(k, i.to_le_bytes().to_vec());
        }
    }
    db.flush().unwrap();
    assert!(db.index().levels.len() >= 4, "levels: {}", db.index().levels.len());
    for w in db.index().levels[1..].iter() {
        assert!(w.windows(2).all(|p| p[0].max < p[1].min), "sorted, non-overlapping");
    }
    let newest = db.newest_index();
    let mut db = reopen(config, &[&store], newest, 5);
    for i in 0..1500u64 {
        let k = format!("k{i:05}").into_bytes();
        assert_eq!(db.get(&k).unwrap(), model.get(&k).cloned());
    }
    let s = db.stats();
    assert!(s.block_fetches > 0 && s.rejected_copies == 0);
}

#[derive(Debug, Clone)]
enum VOp {
    /// Key, Lamport time, writer (the version decides put or delete, and the value).
    Write(u8, u64, u32),
    Get(u8),
    /// Prefix choice, `after` key, limit.
    Scan(u8, Option<u8>, usize),
    Restart,
}

fn vop() -> impl Strategy<Value = VOp> {
    prop_oneof![
        8 => (0u8..24, 1u64..400, 0u32..3).prop_map(|(k, l, w)| VOp::Write(k, l, w)),
        3 => (0u8..24).prop_map(VOp::Get),
        2 => (0u8..4, proptest::option::of(0u8..24), prop_oneof![1usize..10, Just(64)]).prop_map(|(p, a, l)| VOp::Scan(p, a, l)),
        1 => Just(VOp::Restart),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Writes of a key arrive in ANY version order (SCL delivers writers independently, so a
    /// write with a lower (lamport, writer) can reach CapsuleDB after a higher one was frozen
    /// into a block). The model is a last-writer-wins register per key; every read must return
    /// the highest version wherever it sits. A reader that stops at the first hit (memtable,
    /// then L0 newest first, then levels) fails this test.
    #[test]
    fn capsuledb_out_of_order_versions_newest_wins(config in config().prop_map(|c| Config { drop_tombstones: false, ..c }), ops in proptest::collection::vec(vop(), 1..260)) {
        let store = MemStore::new();
        let mut db = create(config, &[&store]);
        let mut model: BTreeMap<Vec<u8>, (Version, Option<Vec<u8>>)> = BTreeMap::new();
        let mut log: Vec<(Vec<u8>, Version, Option<Vec<u8>>)> = Vec::new();
        let mut restarts = 0u64;
        let expect = |model: &BTreeMap<Vec<u8>, (Version, Option<Vec<u8>>)>, k: u8| {
            model.get(&key(k)).and_then(|(_, v)| v.clone())
        };
        for op in ops {
            match op {
                VOp::Write(k, l, w) => {
                    let ver = Version::new(l, w);
                    // A version always carries the same write (as in SCL): put or delete and
                    // the value follow from it.
                    let val = (!(l + w as u64).is_multiple_of(5)).then(|| format!("{k}:{l}:{w}").into_bytes());
                    let before = db.index_seq();
                    db.apply(&key(k), ver, val.clone()).unwrap();
                    match model.get(&key(k)) {
                        Some((v, _)) if *v >= ver => {}
                        _ => { model.insert(key(k), (ver, val.clone())); }
                    }
                    if db.index_seq() != before { log.clear(); } else { log.push((key(k), ver, val)); }
                }
                VOp::Scan(p, a, l) => {
                    let live = model.iter().filter_map(|(k, (_, v))| v.clone().map(|v| (k.clone(), v))).collect();
                    check_scan(&db, &live, p, a, l)?;
                }
                VOp::Get(k) => {
                    prop_assert_eq!(db.get(&key(k)).unwrap(), expect(&model, k), "get {}", k);
                    if let Some((v, _)) = model.get(&key(k)) {
                        prop_assert_eq!(db.get_cell(&key(k)).unwrap().map(|c| c.0), Some(*v), "version of {}", k);
                    }
                }
                VOp::Restart => {
                    restarts += 1;
                    let newest = db.newest_index();
                    drop(db);
                    db = reopen(config, &[&store], newest, 200 + restarts);
                    for (k, ver, val) in &log {
                        db.apply(k, *ver, val.clone()).unwrap();
                    }
                }
            }
        }
        db.flush().unwrap();
        let newest = db.newest_index();
        let mut db = reopen(config, &[&store], newest, 77_777);
        for k in 0u8..24 {
            prop_assert_eq!(db.get(&key(k)).unwrap(), expect(&model, k), "after restart {}", k);
        }
    }
}

/// Deterministic: a late write of a lower version lands in a newer block than the higher one.
#[test]
fn capsuledb_late_lower_version_does_not_win() {
    let config = Config {
        memtable_entries_max: 1,
        l0_blocks_max: 4,
        fanout: 2,
        block_entries_max: 2,
        cache_blocks_max: 2,
        drop_tombstones: false,
    };
    let store = MemStore::new();
    let mut db = create(config, &[&store]);
    db.put(b"k", Version::new(10, 1), b"new".to_vec()).unwrap();
    db.put(b"x", Version::new(11, 1), b"x".to_vec()).unwrap();
    // The late one: lower Lamport time, frozen into a NEWER L0 block than "new".
    db.put(b"k", Version::new(3, 2), b"old".to_vec()).unwrap();
    db.put(b"y", Version::new(12, 1), b"y".to_vec()).unwrap();
    db.flush().unwrap();
    assert_eq!(db.get(b"k").unwrap(), Some(b"new".to_vec()));
    // And the same after compactions push everything down.
    for i in 0..40u64 {
        db.put(format!("f{i:02}").as_bytes(), Version::new(100 + i, 1), vec![1]).unwrap();
    }
    db.flush().unwrap();
    assert_eq!(db.get(b"k").unwrap(), Some(b"new".to_vec()));
}
