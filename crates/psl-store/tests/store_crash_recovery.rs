//! Crash at any write point: every truncation of the log (and junk after a torn tail) reopens
//! as a valid, older replica, and the lost records can be appended again afterwards.

mod common;
use common::{chains, expected_heads, frame_offsets, log_path, meta_path, Fixture};
use proptest::prelude::*;
use psl_capsule::{Record, Verified};
use psl_store::DiskStore;
use std::collections::{BTreeMap, HashSet};
use std::path::Path;

struct Original {
    fx: Fixture,
    recs: Vec<Verified<Record>>,
    meta: Vec<u8>,
    log: Vec<u8>,
    chains: BTreeMap<u32, Vec<psl_crypto::Hash256>>,
    boundaries: Vec<u64>,
}

/// A log of 8 records (3 writers, then a SYNC, then one more from writer 1), written in batches.
fn original() -> Original {
    let fx = Fixture::new(21);
    let mut recs = fx.history(2, 1);
    recs.truncate(8);
    let (tmp, s) = common::store_with(&fx, &recs, 3);
    let dir = s.dir().to_path_buf();
    drop(s);
    let meta = std::fs::read(meta_path(&dir)).unwrap();
    let log = std::fs::read(log_path(&dir)).unwrap();
    drop(tmp);
    let mut boundaries = frame_offsets(&recs);
    boundaries.push(log.len() as u64);
    Original { chains: chains(&recs), fx, recs, meta, log, boundaries }
}

fn write_store(dir: &Path, o: &Original, log: &[u8]) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(meta_path(dir), &o.meta).unwrap();
    std::fs::write(log_path(dir), log).unwrap();
}

/// Opens the damaged copy and checks everything the chain-order rule promises, then appends
/// every original record and checks that the store ends up complete.
fn reopen_and_check(dir: &Path, o: &Original, valid_prefix: u64, what: &str) {
    let (mut s, report) = DiskStore::open(dir, o.fx.key()).unwrap_or_else(|e| panic!("{what}: open failed: {e}"));
    assert!(!report.is_damaged(), "{what}: {report}");
    let file_len = std::fs::metadata(log_path(dir)).unwrap().len();
    assert_eq!(file_len, valid_prefix, "{what}: the log is cut back to the last whole frame");
    assert_eq!(s.log_bytes(), valid_prefix, "{what}");

    // Every loaded chain is a prefix of the original chain; nothing foreign is loaded.
    let originals: HashSet<_> = o.recs.iter().map(|r| r.hash()).collect();
    let whole_frames = o.boundaries.iter().filter(|&&b| b > 0 && b <= valid_prefix).count();
    assert_eq!(s.len(), whole_frames, "{what}");
    for (w, head) in s.heads() {
        let chain = &o.chains[&w];
        let loaded: Vec<_> = s.range(w, 0, u64::MAX).unwrap().iter().map(|r| r.hash()).collect();
        assert_eq!(loaded.len() as u64, head.seq + 1);
        assert_eq!(&loaded[..], &chain[..loaded.len()], "{what}: writer {w} is not a prefix");
        assert!(loaded.iter().all(|h| originals.contains(h)));
    }

    // Appending the rest works (what survived is skipped as duplicates).
    let out = s.append(&o.recs).unwrap_or_else(|e| panic!("{what}: append after recovery failed: {e}"));
    assert_eq!(out.appended + out.duplicates, o.recs.len());
    assert_eq!(out.duplicates, whole_frames);
    assert_eq!(s.heads(), expected_heads(&o.recs));
    assert_eq!(s.log_bytes(), o.log.len() as u64, "{what}: the repaired log is as long as the original");
}

#[test]
fn every_truncation_point_reopens_as_a_prefix_and_can_catch_up() {
    let o = original();
    assert_eq!(o.recs.len(), 8);
    let tmp = common::scratch();
    let dir = tmp.path().join("s");
    for cut in 0..=o.log.len() {
        write_store(&dir, &o, &o.log[..cut]);
        let valid = *o.boundaries.iter().filter(|&&b| b <= cut as u64).max().unwrap();
        let what = format!("cut at {cut}");
        {
            let (_, report) = DiskStore::open_readonly(&dir, o.fx.key()).unwrap();
            assert_eq!(report.torn_tail_bytes, cut as u64 - valid, "{what}");
        }
        reopen_and_check(&dir, &o, valid, &what);
        // After catching up, the store reopens clean and complete.
        let (s, report) = DiskStore::open(&dir, None).unwrap();
        assert!(report.is_clean(), "{what}: {report}");
        assert_eq!(s.len(), o.recs.len());
    }
}

#[test]
fn a_crash_inside_a_batch_leaves_no_partial_record() {
    // One batch of all 8 records; every cut inside it loses exactly the torn frame and after.
    let o = original();
    let tmp = common::scratch();
    let dir = tmp.path().join("s");
    for (i, &b) in o.boundaries.iter().enumerate().take(o.recs.len()) {
        let cut = b as usize + 9; // the header and one byte of the record
        write_store(&dir, &o, &o.log[..cut]);
        let (s, report) = DiskStore::open(&dir, None).unwrap();
        assert_eq!(s.len(), i);
        assert_eq!(report.torn_tail.as_ref().unwrap().offset, b);
        assert_eq!(report.torn_tail_bytes, 9);
    }
}

#[test]
fn zeros_after_the_log_are_a_torn_tail() {
    // A crash after the file grew but before the data reached the disk leaves zeros.
    let o = original();
    let tmp = common::scratch();
    let dir = tmp.path().join("s");
    for zeros in [1usize, 8, 100, 4096] {
        let mut log = o.log.clone();
        log.resize(log.len() + zeros, 0);
        write_store(&dir, &o, &log);
        reopen_and_check(&dir, &o, o.log.len() as u64, &format!("{zeros} zeros"));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// A torn tail followed by random junk (as a partial write may leave) is cut off, and
    /// nothing before it is lost.
    #[test]
    fn junk_after_a_torn_tail_is_cut_off(cut_frac in 0.0f64..=1.0, junk in proptest::collection::vec(any::<u8>(), 1..600)) {
        let o = original_cached();
        let cut = (o.log.len() as f64 * cut_frac) as usize;
        let mut log = o.log[..cut].to_vec();
        log.extend_from_slice(&junk);
        // The junk may begin with the very bytes that were cut off (one byte in 256 when the
        // cut falls one byte short of a frame's end): the frame is then whole again, and rightly
        // loaded. What must survive is every whole frame of the original within the bytes the
        // damaged log still shares with it.
        let shared = log.iter().zip(&o.log).take_while(|(a, b)| a == b).count() as u64;
        let valid = *o.boundaries.iter().filter(|&&b| b <= shared).max().unwrap();
        let tmp = common::scratch();
        let dir = tmp.path().join("s");
        write_store(&dir, o, &log);
        let (_, report) = DiskStore::open_readonly(&dir, None).unwrap();
        prop_assert_eq!(report.torn_tail_bytes, log.len() as u64 - valid, "{}", report);
        reopen_and_check(&dir, o, valid, &format!("cut at {cut} + {} junk bytes", junk.len()));
    }
}

#[test]
fn junk_that_restores_the_cut_bytes_makes_the_frame_whole_again() {
    // The proptest above once drew this (cut one byte short of frame 3's end, junk = that very
    // byte) and expected frame 3 to be torn: the store is right to load it, it is whole.
    let o = original_cached();
    let end = o.boundaries[3] as usize;
    let mut log = o.log[..end - 1].to_vec();
    log.push(o.log[end - 1]);
    let tmp = common::scratch();
    let dir = tmp.path().join("s");
    write_store(&dir, o, &log);
    let (s, report) = DiskStore::open_readonly(&dir, None).unwrap();
    assert_eq!((s.len(), report.torn_tail_bytes), (3, 0), "{report}");
    drop(s);
    reopen_and_check(&dir, o, end as u64, "frame 3 restored by its own last byte");
}

fn original_cached() -> &'static Original {
    static O: std::sync::OnceLock<Original> = std::sync::OnceLock::new();
    O.get_or_init(original)
}

#[test]
fn a_hole_inside_an_unacknowledged_batch_loses_nothing_after_it() {
    // Writeback may persist a batch's later pages before an earlier one: the log then has a
    // zero-filled hole in the middle. The frames after it are found, nothing is truncated,
    // appends wait for a repair, and the repair keeps every record that still verifies.
    let o = original();
    let tmp = common::scratch();
    let dir = tmp.path().join("s");
    let hole = o.boundaries[5] as usize..o.boundaries[6] as usize; // frame 5 never reached the disk
    let mut log = o.log.clone();
    log[hole.clone()].fill(0);
    write_store(&dir, &o, &log);
    let (mut s, report) = DiskStore::open(&dir, None).unwrap();
    assert_eq!(report.unreadable.len(), 1, "{report}");
    assert_eq!((report.unreadable[0].offset, report.unreadable[0].end), (hole.start as u64, hole.end as u64));
    assert_eq!(std::fs::metadata(log_path(&dir)).unwrap().len(), o.log.len() as u64);
    assert!(s.contains(&o.recs[6].hash()).unwrap() || report.orphaned.iter().any(|x| x.hash == o.recs[6].hash()));
    assert!(matches!(s.append(&o.recs), Err(psl_store::StoreError::Damaged { .. })));
    let rep = s.repair().unwrap();
    assert!(rep.kept >= 5);
    s.append(&o.recs).unwrap();
    assert_eq!(s.heads(), expected_heads(&o.recs));
}
