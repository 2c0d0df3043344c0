//! Corruption: damaged frames are reported by index and offset, their writer's later records
//! are orphaned, other writers are unaffected, reads never return changed bytes, and a corrupt
//! length in the middle of the log never truncates what follows it.

mod common;
use common::{frame_offsets, log_path, patch, xor_byte, Fixture};
use psl_capsule::{Record, Verified};
use psl_crypto::Hash256;
use psl_store::{DiskStore, FrameFault, OrphanCause, StoreError, FRAME_HEADER_LEN};
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// 13 records, interleaved: w1s0 w2s0 w3s0 w1s1 w2s1 w3s1 w1s2 w2s2 w3s2 SYNC w1s3 w2s3 w3s3.
/// Frame 3 is writer 1's seq 1; writer 1's seq 2 and 3 are frames 6 and 10.
const VICTIM: usize = 3;

struct Setup {
    fx: Fixture,
    recs: Vec<Verified<Record>>,
    offsets: Vec<u64>,
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    pristine: Vec<u8>,
}

fn setup(seed: u8) -> Setup {
    let fx = Fixture::new(seed);
    let recs = fx.history(3, 1);
    assert_eq!(recs.len(), 13);
    assert_eq!((recs[VICTIM].header().writer, recs[VICTIM].header().seq), (1, 1));
    let (tmp, s) = common::store_with(&fx, &recs, 4);
    let dir = s.dir().to_path_buf();
    drop(s);
    let pristine = std::fs::read(log_path(&dir)).unwrap();
    Setup { offsets: frame_offsets(&recs), fx, recs, _tmp: tmp, dir, pristine }
}

impl Setup {
    fn log(&self) -> PathBuf {
        log_path(&self.dir)
    }

    fn restore(&self) {
        std::fs::write(self.log(), &self.pristine).unwrap();
        for entry in std::fs::read_dir(&self.dir).unwrap() {
            let p = entry.unwrap().path();
            if p.file_name().unwrap().to_string_lossy().starts_with("records.log.damaged") {
                std::fs::remove_file(p).unwrap();
            }
        }
    }

    /// Records expected to load when the victim frame is damaged.
    fn survivors(&self) -> HashSet<Hash256> {
        self.recs.iter().filter(|r| !(r.header().writer == 1 && r.header().seq >= 1)).map(|r| r.hash()).collect()
    }

    fn loaded(&self, s: &DiskStore) -> HashSet<Hash256> {
        s.records_in_chain_order().unwrap().iter().map(|r| r.hash()).collect()
    }
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().len()
}

/// Rewrites the CRC of the frame at `offset` to match whatever its record bytes now are.
fn fix_crc(log: &Path, offset: u64) {
    let bytes = std::fs::read(log).unwrap();
    let o = offset as usize;
    let len = u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap()) as usize;
    let crc = crc32fast::hash(&bytes[o + 8..o + 8 + len]);
    patch(log, offset + 4, &crc.to_le_bytes());
}

#[test]
fn a_flipped_byte_in_a_middle_frame_is_named_and_orphans_only_its_writers_suffix() {
    let st = setup(31);
    let off = st.offsets[VICTIM];
    xor_byte(&st.log(), off + FRAME_HEADER_LEN + 150, 0x20);
    let before = file_len(&st.log());

    let (mut s, report) = DiskStore::open(&st.dir, st.fx.key()).unwrap();
    assert_eq!(file_len(&st.log()), before, "a damaged middle frame is never truncated");
    assert_eq!(report.damaged.len(), 1, "{report}");
    let d = &report.damaged[0];
    assert_eq!((d.index, d.offset), (VICTIM as u64, off));
    assert!(matches!(d.fault, FrameFault::Crc { .. }), "{}", d.fault);
    assert!(report.to_string().contains(&format!("frame #{VICTIM} at offset {off}")), "{report}");
    let orphans: Vec<(u64, u32, u64)> = report.orphaned.iter().map(|o| (o.index, o.writer, o.seq)).collect();
    assert_eq!(orphans, vec![(6, 1, 2), (10, 1, 3)]);
    assert!(report.orphaned.iter().all(|o| o.cause == OrphanCause::Gap { expected: 1 }));
    assert!(report.unreadable.is_empty() && report.torn_tail.is_none());
    assert_eq!(st.loaded(&s), st.survivors());
    assert_eq!(s.heads()[&1].seq, 0);
    assert_eq!(s.heads()[&2].seq, 3);
    assert_eq!(s.heads()[&3].seq, 3);

    // check() names the frame and sees the gap it leaves in writer 1's chain.
    let check = s.check().unwrap();
    assert_eq!(check.damaged_frames(), vec![VICTIM as u64]);
    assert_eq!(check.orphaned.len(), 2);
    assert!(check.chain_problems.iter().any(|p| p.check() == "gap" && p.writer() == 1), "{check}");
    assert!(check.problems().iter().any(|p| p.contains(&format!("frame #{VICTIM} at offset {off}"))), "{check}");
    assert!(check.lost.is_empty() && check.unindexed.is_empty());

    // The framing is intact, so appends go on: a good copy of the lost records heals the chain.
    let out = s.append(&st.recs).unwrap();
    assert_eq!((out.appended, out.duplicates), (3, 10));
    assert_eq!(s.heads(), common::expected_heads(&st.recs));
    drop(s);
    let (mut s, report) = DiskStore::open(&st.dir, st.fx.key()).unwrap();
    assert_eq!(s.len(), 13);
    assert_eq!(report.damaged.len(), 1, "damage stays visible until a repair: {report}");

    // Repair rewrites the log clean and keeps the old one.
    let rep = s.repair().unwrap();
    assert_eq!(rep.kept, 13);
    assert!(rep.backup.exists());
    assert_eq!(file_len(&rep.backup), rep.bytes_before);
    assert!(s.check().unwrap().is_clean());
    drop(s);
    let (s, report) = DiskStore::open(&st.dir, st.fx.key()).unwrap();
    assert!(report.is_clean(), "{report}");
    assert_eq!(s.heads(), common::expected_heads(&st.recs));
}

#[test]
fn every_flipped_byte_of_a_middle_frame_is_caught_and_nothing_else_is_lost() {
    let st = setup(32);
    let off = st.offsets[VICTIM];
    let end = st.offsets[VICTIM + 1];
    let survivors = st.survivors();
    let mut unreadable = 0;
    for pos in off..end {
        st.restore();
        xor_byte(&st.log(), pos, 0x01);
        let (mut s, report) = DiskStore::open(&st.dir, None).unwrap_or_else(|e| panic!("flip at {pos}: {e}"));
        assert_eq!(file_len(&st.log()), st.pristine.len() as u64, "flip at {pos}: nothing is truncated");
        assert!(report.is_damaged(), "flip at {pos} went unnoticed");
        assert_eq!(st.loaded(&s), survivors, "flip at {pos}: {report}");
        let named = report.damaged.iter().map(|d| d.offset).chain(report.unreadable.iter().map(|u| u.offset));
        assert_eq!(named.collect::<Vec<_>>(), vec![off], "flip at {pos}: {report}");
        if report.needs_repair() {
            // A corrupt length: appends wait for a repair, which loses nothing else.
            unreadable += 1;
            assert!(matches!(s.append(&st.recs), Err(StoreError::Damaged { .. })));
            let rep = s.repair().unwrap();
            assert_eq!(rep.kept, survivors.len());
        }
        s.append(&st.recs).unwrap();
        assert_eq!(s.len(), st.recs.len(), "flip at {pos}");
    }
    assert!(unreadable >= 4, "flips in the length field make the framing unreadable ({unreadable})");
}

#[test]
fn a_corrupt_length_in_the_middle_never_truncates_the_data_after_it() {
    let st = setup(33);
    let off = st.offsets[VICTIM];
    let to_eof = (st.pristine.len() as u64 - off - FRAME_HEADER_LEN) as u32;
    for (what, len) in
        [("huge", u32::MAX), ("exactly to EOF", to_eof), ("one past EOF", to_eof + 1), ("zero", 0), ("short", 300)]
    {
        st.restore();
        patch(&st.log(), off, &len.to_le_bytes());
        let (mut s, report) = DiskStore::open(&st.dir, None).unwrap();
        assert_eq!(file_len(&st.log()), st.pristine.len() as u64, "{what}: nothing may be truncated");
        assert_eq!(report.torn_tail, None, "{what}");
        assert_eq!(report.unreadable.len(), 1, "{what}: {report}");
        let u = &report.unreadable[0];
        assert_eq!((u.offset, u.end), (off, st.offsets[VICTIM + 1]), "{what}");
        assert_eq!(st.loaded(&s), st.survivors(), "{what}: later frames of other writers still load");
        assert_eq!(report.orphaned.len(), 2, "{what}");

        match s.append(&st.recs) {
            Err(e @ StoreError::Damaged { .. }) => {
                let msg = e.to_string();
                assert!(
                    msg.contains("records.log") && msg.contains(&off.to_string()) && msg.contains("repair"),
                    "{msg}"
                );
            }
            other => panic!("{what}: expected Damaged, got {other:?}"),
        }
        let rep = s.repair().unwrap();
        assert_eq!(rep.kept, st.survivors().len());
        assert_eq!(file_len(&rep.backup), st.pristine.len() as u64, "{what}: the damaged log is kept");
        let out = s.append(&st.recs).unwrap();
        assert_eq!(out.appended, 3);
        drop(s);
        let (s, report) = DiskStore::open(&st.dir, None).unwrap();
        assert!(report.is_clean(), "{what}: {report}");
        assert_eq!(s.len(), 13);
    }
}

#[test]
fn a_valid_crc_over_a_bad_record_is_damage_not_a_torn_tail() {
    let st = setup(34);
    // Change the last byte of the last record's signature and make the CRC match again.
    let last = st.recs.len() - 1;
    let off = st.offsets[last];
    xor_byte(&st.log(), st.pristine.len() as u64 - 1, 0x01);
    fix_crc(&st.log(), off);
    let (s, report) = DiskStore::open(&st.dir, None).unwrap();
    assert_eq!(file_len(&st.log()), st.pristine.len() as u64, "not truncated");
    assert_eq!(report.damaged.len(), 1, "{report}");
    assert!(matches!(report.damaged[0].fault, FrameFault::Verify(_)), "{report}");
    assert_eq!(report.damaged[0].index, last as u64);
    assert_eq!(s.len(), st.recs.len() - 1);
}

#[test]
fn reads_of_bytes_changed_after_open_are_errors_never_data() {
    let st = setup(35);
    let (s, report) = DiskStore::open(&st.dir, st.fx.key()).unwrap();
    assert!(report.is_clean());
    let victim = &st.recs[VICTIM];
    let off = st.offsets[VICTIM];
    assert_eq!(s.get(&victim.hash()).unwrap().unwrap().bytes(), victim.bytes());

    // A flipped byte: the CRC catches it.
    xor_byte(&st.log(), off + FRAME_HEADER_LEN + 100, 0x04);
    match s.get(&victim.hash()) {
        Err(e @ StoreError::ReadBack { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("records.log") && msg.contains(&format!("offset {off}")) && msg.contains("crc32"),
                "{msg}"
            );
        }
        other => panic!("expected a read-back error, got {other:?}"),
    }
    assert!(s.range(1, 0, 10).is_err());
    assert!(s.export().is_err());
    let check = s.check().unwrap();
    assert!(check.lost.iter().any(|l| l.hash == victim.hash()), "{check}");
    assert_eq!(check.damaged_frames(), vec![VICTIM as u64]);

    // The same change with a matching CRC: the record no longer hashes or verifies.
    fix_crc(&st.log(), off);
    assert!(matches!(s.get(&victim.hash()), Err(StoreError::ReadBack { .. })));

    // A changed signature with a matching CRC: the verifier catches it.
    st.restore();
    let sig_byte = st.offsets[VICTIM + 1] - 1;
    xor_byte(&st.log(), sig_byte, 0x01);
    fix_crc(&st.log(), off);
    match s.get(&victim.hash()) {
        Err(StoreError::ReadBack { fault: FrameFault::Verify(_), .. }) => {}
        other => panic!("expected a verification failure, got {other:?}"),
    }

    // Another record swapped into the frame: the hash check catches it.
    st.restore();
    let other = &st.recs[VICTIM + 3]; // writer 1, seq 2
    let mut frame = Vec::new();
    frame.extend_from_slice(&(other.bytes().len() as u32).to_le_bytes());
    frame.extend_from_slice(&crc32fast::hash(other.bytes()).to_le_bytes());
    frame.extend_from_slice(other.bytes());
    assert_eq!(other.bytes().len(), victim.bytes().len());
    patch(&st.log(), off, &frame);
    assert!(matches!(s.get(&victim.hash()), Err(StoreError::ReadBack { fault: FrameFault::WrongRecord { .. }, .. })));

    // The log cut short behind the store's back.
    st.restore();
    std::fs::OpenOptions::new().write(true).open(st.log()).unwrap().set_len(off).unwrap();
    assert!(s.get(&victim.hash()).is_err());
    assert!(s.get(&st.recs[0].hash()).unwrap().is_some());
}
