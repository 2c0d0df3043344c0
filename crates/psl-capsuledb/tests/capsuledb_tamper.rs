//! A block or index record altered in storage is detected at read time, and read again from
//! the next store holding a good copy.
mod common;

use common::*;
use psl_capsuledb::{Config, Error, MemStore, Version};

fn config() -> Config {
    Config {
        memtable_entries_max: 4,
        l0_blocks_max: 2,
        fanout: 2,
        block_entries_max: 4,
        cache_blocks_max: 8,
        drop_tombstones: true,
    }
}

fn filled(a: &std::sync::Arc<MemStore>, b: &std::sync::Arc<MemStore>) -> [u8; 32] {
    let mut db = create(config(), &[a, b]);
    for i in 0..40u64 {
        db.put(format!("k{i:02}").as_bytes(), Version::new(i + 1, 1), format!("v{i}").into_bytes()).unwrap();
    }
    db.flush().unwrap();
    db.newest_index()
}

#[test]
fn capsuledb_tampered_block_detected_and_refetched() {
    // Positions: early header, middle (body ciphertext), last byte (signature, see below).
    for pos in [3usize, 120, usize::MAX] {
        let (a, b) = (MemStore::new(), MemStore::new());
        let newest = filled(&a, &b);
        let db = reopen(config(), &[&a], newest, 7);
        let blocks: Vec<[u8; 32]> = db.index().levels.iter().flatten().map(|r| r.hash).collect();
        assert!(blocks.len() > 2);
        for h in &blocks {
            let len = a.get_len(h);
            assert!(a.tamper(h, if pos == usize::MAX { len - 1 } else { pos }));
        }
        drop(db);
        if pos == usize::MAX {
            // The signature is not covered by the record hash. A block is read through the
            // verified index's hash pointer, which authenticates its header and body, so its
            // signature is not checked again: the content is intact and reads are right. The
            // altered copy still fails full verification (what any reader without the pointer
            // runs).
            let mut only_a = reopen(config(), &[&a], newest, 8);
            for i in 0..40u64 {
                assert_eq!(only_a.get(format!("k{i:02}").as_bytes()).unwrap(), Some(format!("v{i}").into_bytes()));
            }
            assert_eq!(only_a.stats().rejected_copies, 0);
            for h in &blocks {
                assert!(
                    verifier().verify_bytes(&a.raw(h).unwrap()).is_err(),
                    "signature damage is visible to a full check"
                );
            }
            continue;
        }
        // Only the tampered store: every read of a stored key is refused, never wrong.
        let mut only_a = reopen(config(), &[&a], newest, 8);
        let err = only_a.get(b"k05").unwrap_err();
        assert!(matches!(err, Error::Unavailable { .. }), "{err}");
        assert!(only_a.stats().rejected_copies >= 1);
        // With a second, good store: reads succeed, the bad copies are counted.
        let mut both = reopen(config(), &[&a, &b], newest, 9);
        for i in 0..40u64 {
            assert_eq!(both.get(format!("k{i:02}").as_bytes()).unwrap(), Some(format!("v{i}").into_bytes()));
        }
        assert!(both.stats().rejected_copies >= 1);
    }
}

#[test]
fn capsuledb_tampered_index_detected_and_refetched() {
    let (a, b) = (MemStore::new(), MemStore::new());
    let newest = filled(&a, &b);
    assert!(a.tamper(&newest, 200));
    let r = psl_capsuledb::CapsuleDb::open(config(), stores(&[&a]), verifier(), author(3), newest);
    assert!(matches!(r, Err(Error::Unavailable { .. })));
    let mut db = reopen(config(), &[&a, &b], newest, 4);
    assert_eq!(db.stats().rejected_copies, 1);
    assert_eq!(db.get(b"k39").unwrap(), Some(b"v39".to_vec()));
}

#[test]
fn capsuledb_swapped_record_fails_hash_check() {
    // A store answering with another valid record (a different block) is caught by the hash check.
    let (a, b) = (MemStore::new(), MemStore::new());
    let newest = filled(&a, &b);
    let db = reopen(config(), &[&a], newest, 5);
    let blocks: Vec<[u8; 32]> = db.index().levels.iter().flatten().map(|r| r.hash).collect();
    drop(db);
    let other = a.raw(&blocks[1]).unwrap();
    a.put_raw(blocks[0], other);
    let mut db = reopen(config(), &[&a, &b], newest, 6);
    for i in 0..40u64 {
        assert_eq!(db.get(format!("k{i:02}").as_bytes()).unwrap(), Some(format!("v{i}").into_bytes()));
    }
    assert!(db.stats().rejected_copies >= 1);
}
