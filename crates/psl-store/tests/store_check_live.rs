//! A read-only check of a store that a running writer holds (issue 15, finding 2): it reads the
//! log as it was at open, so records the writer appends meanwhile, and a frame it is in the
//! middle of writing, are never reported as damage; a reader of an idle store keeps writers
//! out while it reads; real damage is still found.

mod common;
use common::Fixture;
use psl_store::{DiskStore, StoreError};

#[test]
fn a_check_of_a_live_store_covers_its_view_and_never_reports_the_writers_tail() {
    let fx = Fixture::new(21);
    let recs = fx.history(4, 3);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("live");
    let mut w = DiskStore::create(&dir, fx.meta.clone(), None).unwrap();
    w.append(&recs[..6]).unwrap();
    // A reader while the writer holds the store: it says so.
    let (r, open) = DiskStore::open_readonly(&dir, None).unwrap();
    assert!(r.held_by_writer());
    assert!(open.is_clean(), "{open}");
    assert_eq!(r.len(), 6);
    // The writer goes on; the reader's check covers what it opened, and reports the rest as
    // appended, not as records "the index does not know".
    w.append(&recs[6..12]).unwrap();
    let rep = r.check().unwrap();
    assert!(rep.is_clean(), "{rep}");
    assert!(rep.unindexed.is_empty());
    assert!(rep.appended_bytes > 0 && rep.checked_bytes == r.log_bytes(), "{rep:?}");
    assert!(rep.live_writer);
    // A frame in the middle of being written (its first bytes only) when a reader opens: a
    // torn tail, which is not damage.
    let log = common::log_path(&dir);
    let before = std::fs::metadata(&log).unwrap().len();
    let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    std::io::Write::write_all(&mut f, &recs[12].bytes()[..3]).unwrap();
    let (r2, _) = DiskStore::open_readonly(&dir, None).unwrap();
    let rep = r2.check().unwrap();
    assert!(rep.torn_tail.is_some(), "{rep}");
    assert!(rep.damage().is_empty(), "{rep}");
    assert!(!rep.is_clean(), "problems() still names the torn tail");
    drop((r, r2, w));
    // (the writer would have completed the frame; cut it back as its rollback would)
    f.set_len(before).unwrap();

    // Real damage in the part a live reader covers is still found.
    let mut w = DiskStore::open(&dir, None).unwrap().0;
    let (r, _) = DiskStore::open_readonly(&dir, None).unwrap();
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().read(true).write(true).open(&log).unwrap();
        let mut b = [0u8; 1];
        f.read_exact_at(&mut b, before / 2).unwrap();
        f.write_all_at(&[b[0] ^ 0x40], before / 2).unwrap();
    }
    let _ = w.append(&recs[12..]);
    let rep = r.check().unwrap();
    assert!(!rep.damage().is_empty(), "a flipped byte inside the view must be reported: {rep}");
    drop(w);
}

#[test]
fn a_reader_of_an_idle_store_keeps_writers_out_and_sees_a_shrunk_log() {
    let fx = Fixture::new(22);
    let recs = fx.history(2, 2);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("idle");
    let mut w = DiskStore::create(&dir, fx.meta.clone(), None).unwrap();
    w.append(&recs).unwrap();
    drop(w);
    let (r, _) = DiskStore::open_readonly(&dir, None).unwrap();
    assert!(!r.held_by_writer());
    // While it reads, no writer opens the store (its view stays the log's state).
    let err = DiskStore::open(&dir, None).unwrap_err();
    assert!(matches!(err, StoreError::Locked { .. }), "{err}");
    // Other readers are welcome.
    let (r2, _) = DiskStore::open_readonly(&dir, None).unwrap();
    drop(r2);
    // A log cut below what the view describes (by hand: no writer does this) is damage.
    let log = common::log_path(&dir);
    let len = std::fs::metadata(&log).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&log).unwrap().set_len(len - 10).unwrap();
    let rep = r.check().unwrap();
    assert_eq!(rep.shrunk, Some((len, len - 10)));
    assert!(rep.damage().iter().any(|p| p.contains("shorter")), "{rep}");
    drop(r);
    assert!(DiskStore::open(&dir, None).is_ok(), "the writer opens once the reader is gone");
}
