//! Round trip: batches from several writers and a SYNC survive a reopen byte for byte, and an
//! export imports into a fresh directory as an identical replica.

mod common;
use common::{chains, expected_heads, Fixture};
use psl_capsule::{CapsuleFile, Kind};
use psl_store::{import_into, DiskStore, StoreError};

#[test]
fn batches_reopen_read_back_export_and_import() {
    let fx = Fixture::new(1);
    let recs = fx.history(3, 2); // 9 + 1 SYNC + 6 = 16 records
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("a");
    let mut s = DiskStore::create(&dir, fx.meta.clone(), fx.key()).unwrap();
    assert!(s.is_empty());
    let mut appended = 0;
    for batch in [&recs[0..1], &recs[1..5], &recs[5..10], &recs[10..16]] {
        let out = s.append(batch).unwrap();
        assert_eq!(out.duplicates, 0);
        appended += out.appended;
    }
    assert_eq!(appended, recs.len());
    assert_eq!(s.heads(), expected_heads(&recs));
    let heads = s.heads();
    drop(s);

    let (s, report) = DiskStore::open(&dir, fx.key()).unwrap();
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.records, recs.len());
    assert_eq!(report.torn_tail_bytes, 0);
    assert_eq!(s.len(), recs.len());
    assert_eq!(s.heads(), heads);
    assert_eq!(s.name(), fx.meta.name());
    assert_eq!(s.metadata(), &fx.meta);
    for r in &recs {
        let back = s.get(&r.hash()).unwrap().expect("stored");
        assert_eq!(back.bytes(), r.bytes());
    }
    assert!(s.get(&psl_crypto::Hash256([7; 32])).unwrap().is_none());

    // Chain order, ranges, the latest SYNC.
    let ordered = s.records_in_chain_order().unwrap();
    let got: Vec<(u32, u64)> = ordered.iter().map(|r| (r.header().writer, r.header().seq)).collect();
    let mut want = got.clone();
    want.sort();
    assert_eq!(got, want);
    assert_eq!(ordered.len(), recs.len());
    let c = chains(&recs);
    let w2: Vec<_> = s.range(2, 1, 4).unwrap().iter().map(|r| r.hash()).collect();
    assert_eq!(w2, c[&2][1..4].to_vec());
    assert!(s.range(2, 4, 99).unwrap().len() == 1);
    assert!(s.range(2, 3, 3).unwrap().is_empty());
    assert!(s.range(42, 0, 10).unwrap().is_empty());
    let sync = s.latest_sync().unwrap().expect("a SYNC is stored");
    assert_eq!(sync.header().kind, Kind::Sync);
    assert_eq!(s.next_seq(1), 5);
    assert!(s.check().unwrap().is_clean());

    // Export, parse, import into a fresh directory: identical replica.
    let bytes = s.export().unwrap();
    let file = CapsuleFile::parse(&bytes).unwrap();
    assert_eq!(file.records.len(), recs.len());
    let dir_b = tmp.path().join("b");
    let (b, out) = import_into(&dir_b, &bytes, fx.key()).unwrap();
    assert_eq!((out.appended, out.duplicates), (recs.len(), 0));
    assert_eq!(b.to_replica().unwrap(), s.to_replica().unwrap());
    assert_eq!(b.heads(), s.heads());
    assert_eq!(b.export().unwrap(), bytes, "chain-order export is canonical");
    drop(b);

    // Importing again into the existing store finds only duplicates.
    let (b, out) = import_into(&dir_b, &bytes, None).unwrap();
    assert_eq!((out.appended, out.duplicates), (0, recs.len()));
    assert_eq!(b.len(), recs.len());

    // `import` on an open store, starting from a partial replica.
    let (mut c, _) = {
        let d = tmp.path().join("c");
        let mut c = DiskStore::create(&d, fx.meta.clone(), None).unwrap();
        c.append(&recs[..4]).unwrap();
        (c, ())
    };
    let out = c.import(&file).unwrap();
    assert_eq!((out.appended, out.duplicates), (recs.len() - 4, 4));
    assert_eq!(c.heads(), heads);
}

#[test]
fn duplicates_are_skipped_within_and_across_batches() {
    let fx = Fixture::new(2);
    let recs = fx.history(2, 0);
    let tmp = tempfile::tempdir().unwrap();
    let mut s = DiskStore::create(tmp.path(), fx.meta.clone(), fx.key()).unwrap();
    let out = s.append(&[recs[0].clone(), recs[0].clone(), recs[1].clone()]).unwrap();
    assert_eq!((out.appended, out.duplicates), (2, 1));
    let before = s.log_bytes();
    let out = s.append(&recs[..2]).unwrap();
    assert_eq!((out.appended, out.duplicates, out.bytes), (0, 2, 0));
    assert_eq!(s.log_bytes(), before);
    let out = s.append(&recs).unwrap();
    assert_eq!((out.appended, out.duplicates), (recs.len() - 2, 2));
    assert_eq!(std::fs::metadata(common::log_path(tmp.path())).unwrap().len(), s.log_bytes());
}

#[test]
fn create_refuses_an_existing_store_and_open_needs_one() {
    let fx = Fixture::new(3);
    let tmp = tempfile::tempdir().unwrap();
    match DiskStore::open(tmp.path(), None) {
        Err(StoreError::NotAStore { .. }) => {}
        other => panic!("expected NotAStore, got {other:?}"),
    }
    let s = DiskStore::create(tmp.path(), fx.meta.clone(), None).unwrap();
    drop(s);
    match DiskStore::create(tmp.path(), fx.meta.clone(), None) {
        Err(e @ StoreError::AlreadyExists { .. }) => {
            assert!(e.to_string().contains("metadata.bin"), "{e}")
        }
        other => panic!("expected AlreadyExists, got {other:?}"),
    }
    assert_eq!(psl_store::read_metadata(tmp.path()).unwrap(), fx.meta);
}

#[test]
fn a_wrong_data_key_is_refused() {
    let fx = Fixture::new(4);
    let other = Fixture::new(5);
    let tmp = tempfile::tempdir().unwrap();
    assert!(matches!(
        DiskStore::create(tmp.path(), fx.meta.clone(), other.key()),
        Err(StoreError::WrongDataKey { .. })
    ));
    drop(DiskStore::create(tmp.path(), fx.meta.clone(), fx.key()).unwrap());
    assert!(matches!(DiskStore::open(tmp.path(), other.key()), Err(StoreError::WrongDataKey { .. })));
}

#[test]
fn tampered_metadata_is_refused_naming_the_file() {
    let fx = Fixture::new(6);
    let tmp = tempfile::tempdir().unwrap();
    drop(DiskStore::create(tmp.path(), fx.meta.clone(), None).unwrap());
    common::xor_byte(&common::meta_path(tmp.path()), 40, 0x01);
    match DiskStore::open(tmp.path(), None) {
        Err(e @ StoreError::Metadata { .. }) => {
            assert!(e.to_string().contains("metadata.bin"), "{e}")
        }
        other => panic!("expected a metadata error, got {other:?}"),
    }
}

#[test]
fn a_read_only_open_changes_nothing_and_refuses_appends() {
    let fx = Fixture::new(7);
    let recs = fx.history(1, 0);
    let (tmp, s) = common::store_with(&fx, &recs, 2);
    let dir = s.dir().to_path_buf();
    drop(s);
    let log = common::log_path(&dir);
    let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    std::io::Write::write_all(&mut f, &[1, 2, 3]).unwrap();
    let len = std::fs::metadata(&log).unwrap().len();
    let (mut s, report) = DiskStore::open_readonly(&dir, None).unwrap();
    assert_eq!(report.torn_tail_bytes, 3);
    assert!(!report.torn_tail.as_ref().unwrap().truncated);
    assert_eq!(std::fs::metadata(&log).unwrap().len(), len);
    assert_eq!(s.len(), recs.len());
    assert!(matches!(s.append(&recs), Err(StoreError::ReadOnly { .. })));
    drop(tmp);
}

#[test]
fn a_second_writer_is_locked_out() {
    let fx = common::Fixture::new(90);
    let dir = tempfile::tempdir().unwrap();
    let store = psl_store::DiskStore::create(dir.path(), fx.meta.clone(), None).unwrap();
    let err = psl_store::DiskStore::open(dir.path(), None).unwrap_err();
    assert!(matches!(err, psl_store::StoreError::Locked { .. }), "{err}");
    // Readers are not locked out.
    assert!(psl_store::DiskStore::open_readonly(dir.path(), None).is_ok());
    drop(store);
    assert!(psl_store::DiskStore::open(dir.path(), None).is_ok());
}
