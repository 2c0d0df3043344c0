//! Every index is a snapshot: get_at reads through old indexes, also after a restart.
mod common;

use common::*;
use psl_capsuledb::{Error, MemStore, Version};

#[test]
fn capsuledb_get_at_reads_old_snapshots() {
    let store = MemStore::new();
    let mut db = create(tiny(), &[&store]);
    let v = |l| Version::new(l, 1);
    db.put(b"k", v(1), b"one".to_vec()).unwrap();
    db.flush().unwrap();
    let s1 = db.index_seq();
    db.put(b"k", v(2), b"two".to_vec()).unwrap();
    db.put(b"other", v(3), b"x".to_vec()).unwrap();
    db.flush().unwrap();
    let s2 = db.index_seq();
    db.delete(b"k", v(4)).unwrap();
    db.flush().unwrap();
    let s3 = db.index_seq();
    // Lots more writes so that compactions rewrite the levels.
    for i in 0..60u64 {
        db.put(format!("f{i}").as_bytes(), v(10 + i), vec![i as u8]).unwrap();
    }
    db.flush().unwrap();
    let check = |db: &mut psl_capsuledb::CapsuleDb| {
        assert_eq!(db.get_at(0, b"k").unwrap(), None);
        assert_eq!(db.get_at(s1, b"k").unwrap(), Some(b"one".to_vec()));
        assert_eq!(db.get_at(s2, b"k").unwrap(), Some(b"two".to_vec()));
        assert_eq!(db.get_at(s3, b"k").unwrap(), None);
        assert_eq!(db.get_at(s2, b"f1").unwrap(), None);
        assert_eq!(db.get(b"k").unwrap(), None);
        assert_eq!(db.get(b"f59").unwrap(), Some(vec![59]));
        let snaps = db.snapshots().unwrap();
        let newest = db.index_seq();
        assert_eq!(snaps, (0..=newest).rev().collect::<Vec<_>>());
        assert!(matches!(db.get_at(newest + 1, b"k"), Err(Error::UnknownSnapshot(_))));
    };
    check(&mut db);
    let newest = db.newest_index();
    let mut db = reopen(tiny(), &[&store], newest, 2);
    check(&mut db);
}
