//! The spilled index (`psl_store::index`): a store whose index lives in files beside the log
//! answers exactly as one whose index is all in memory, through runs, merges, checkpoints,
//! crashes between checkpoints and damaged index files.

mod common;

use common::Fixture;
use psl_capsule::{Record, Verified};
use psl_crypto::Hash256;
use psl_store::{DiskStore, IndexConfig, OpenVerify, StoreOptions, INDEX_DIR, LOG_FILE};
use std::collections::BTreeMap;
use std::path::Path;

/// Tiny bounds, so that a few hundred records go through chain files, many runs, merges and
/// checkpoints.
fn tiny(verify: OpenVerify) -> StoreOptions {
    StoreOptions { index: IndexConfig { chain_window: 4, recent_max: 16, checkpoint_records: 40 }, verify }
}

fn history(fx: &Fixture, per_writer: usize) -> Vec<Verified<Record>> {
    fx.history(per_writer / 2, per_writer - per_writer / 2)
}

fn fill(dir: &Path, fx: &Fixture, recs: &[Verified<Record>]) -> DiskStore {
    let mut s = DiskStore::create_with(dir, fx.meta.clone(), fx.key(), tiny(OpenVerify::Full)).unwrap();
    // Batches of uneven sizes.
    let mut i = 0;
    let mut n = 1;
    while i < recs.len() {
        let j = (i + n).min(recs.len());
        s.append(&recs[i..j]).unwrap();
        i = j;
        n = n % 13 + 1;
    }
    s
}

/// Everything a reader can ask, as plain data.
fn answers(s: &DiskStore, recs: &[Verified<Record>]) -> (usize, BTreeMap<u32, Vec<Hash256>>, Vec<bool>) {
    let mut chains = BTreeMap::new();
    for w in s.heads().keys() {
        chains.insert(*w, s.chain_hashes(*w).unwrap());
    }
    let found = recs.iter().map(|r| s.get(&r.hash()).unwrap().map(|g| g.hash()) == Some(r.hash())).collect();
    (s.len(), chains, found)
}

fn run_files(dir: &Path) -> usize {
    std::fs::read_dir(dir.join(INDEX_DIR))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with("run-"))
        .count()
}

#[test]
fn a_spilled_index_answers_like_the_log_through_runs_merges_and_reopens() {
    let fx = Fixture::new(61);
    let recs = history(&fx, 150);
    let dir = tempfile::tempdir().unwrap();
    let s = fill(dir.path(), &fx, &recs);
    let (len, chains, found) = answers(&s, &recs);
    assert_eq!(len, recs.len());
    assert!(found.iter().all(|f| *f), "every record is found by its hash");
    assert!(!s.contains(&Hash256([7; 32])).unwrap());
    for (w, hashes) in &chains {
        // Ranges cross the in-memory window and the chain file.
        let got: Vec<Hash256> = s.range(*w, 0, u64::MAX).unwrap().iter().map(|r| r.hash()).collect();
        assert_eq!(&got, hashes);
        // A range wholly in the chain file, one across the boundary, one in memory.
        let n = hashes.len() as u64;
        for (from, to) in [(0u64, 3u64), (1, n.saturating_sub(1)), (n.saturating_sub(2), u64::MAX)] {
            let got: Vec<Hash256> = s.range(*w, from, to).unwrap().iter().map(|r| r.hash()).collect();
            let to = (to as usize).min(hashes.len());
            assert_eq!(got, hashes[(from as usize).min(to)..to], "{from}..{to}");
        }
        let (next, tail) = s.chain_tail(*w, 10).unwrap();
        assert_eq!(next, hashes.len() as u64);
        assert_eq!(tail, hashes[hashes.len().saturating_sub(10)..]);
    }
    // 450 hashes in runs of 16, merged while the newer is at least half the older.
    let runs = run_files(dir.path());
    assert!((1..=8).contains(&runs), "{runs} run files");
    let in_order: Vec<Hash256> = s.iter_chain_order().map(|r| r.unwrap().hash()).collect();
    assert_eq!(in_order.len(), recs.len());
    drop(s);

    for verify in [OpenVerify::FromCheckpoint, OpenVerify::Full] {
        let (s, report) = DiskStore::open_with_options(dir.path(), fx.key(), tiny(verify)).unwrap();
        assert!(report.is_clean(), "{report}");
        assert_eq!(report.records, recs.len());
        match verify {
            // Closed cleanly: the checkpoint covers the whole log.
            OpenVerify::FromCheckpoint => assert_eq!(report.from_checkpoint_bytes, s.log_bytes(), "{report}"),
            OpenVerify::Full => assert_eq!(report.from_checkpoint_bytes, 0),
        }
        assert_eq!(answers(&s, &recs), (len, chains.clone(), found.clone()), "{verify:?}");
        assert!(s.check().unwrap().is_clean());
    }
}

/// Copies a store's directory as it is now: what a crash (of the machine, with every write so
/// far on disk) would leave.
fn crash_copy(from: &Path, to: &Path) {
    std::fs::create_dir_all(to.join(INDEX_DIR)).unwrap();
    for sub in ["", INDEX_DIR] {
        for e in std::fs::read_dir(from.join(sub)).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_file() && e.file_name() != "LOCK" {
                std::fs::copy(e.path(), to.join(sub).join(e.file_name())).unwrap();
            }
        }
    }
}

#[test]
fn a_crash_between_checkpoints_loses_nothing_and_the_rest_is_reverified() {
    let fx = Fixture::new(62);
    let recs = history(&fx, 100);
    let dir = tempfile::tempdir().unwrap();
    let s = fill(dir.path(), &fx, &recs);
    let crashed = tempfile::tempdir().unwrap();
    crash_copy(dir.path(), crashed.path());
    drop(s);
    let (s, report) = DiskStore::open_with_options(crashed.path(), fx.key(), tiny(OpenVerify::FromCheckpoint)).unwrap();
    assert!(report.is_clean(), "{report}");
    assert_eq!(s.len(), recs.len());
    let from = report.from_checkpoint_bytes;
    assert!(from > 0 && from < s.log_bytes(), "a checkpoint mid-log: {report}");
    assert!(recs.iter().all(|r| s.get(&r.hash()).unwrap().is_some()));
    // And appends go on after it.
    let more = {
        let mut a = fx.author(9);
        fx.verify(vec![a.write_ops([("x", Some("1"))]).unwrap()])
    };
    let mut s = s;
    s.append(&more).unwrap();
    assert!(s.get(&more[0].hash()).unwrap().is_some());
}

fn flip(path: &Path, offset: u64) {
    let mut b = std::fs::read(path).unwrap();
    b[offset as usize] ^= 0x40;
    std::fs::write(path, b).unwrap();
}

#[test]
fn damage_in_a_checkpointed_prefix_falls_back_to_full_verification() {
    let fx = Fixture::new(63);
    let recs = history(&fx, 60);
    let dir = tempfile::tempdir().unwrap();
    drop(fill(dir.path(), &fx, &recs));
    // A byte of a record in the middle of the log: its CRC no longer matches.
    flip(&dir.path().join(LOG_FILE), 3_000);
    let (s, report) = DiskStore::open_with_options(dir.path(), fx.key(), tiny(OpenVerify::FromCheckpoint)).unwrap();
    assert_eq!(report.from_checkpoint_bytes, 0, "the checkpoint must not be used: {report}");
    assert!(report.is_damaged(), "{report}");
    drop(s);
    // Damage is reported on every open until a repair: no checkpoint hides it.
    let (_s, report) = DiskStore::open_with_options(dir.path(), fx.key(), tiny(OpenVerify::FromCheckpoint)).unwrap();
    assert!(report.is_damaged() && report.from_checkpoint_bytes == 0, "{report}");
}

#[test]
fn a_damaged_or_stale_index_is_an_error_or_a_rebuild_never_a_wrong_answer() {
    let fx = Fixture::new(64);
    let recs = history(&fx, 60);
    let dir = tempfile::tempdir().unwrap();
    drop(fill(dir.path(), &fx, &recs));
    // An old entry of writer 1's chain file (outside the in-memory window).
    flip(&dir.path().join(INDEX_DIR).join("chain-1"), 5);
    let (s, report) = DiskStore::open_with_options(dir.path(), fx.key(), tiny(OpenVerify::FromCheckpoint)).unwrap();
    assert!(report.from_checkpoint_bytes > 0);
    let victim = recs.iter().find(|r| r.header().writer == 1 && r.header().seq == 0).unwrap();
    let e = s.get(&victim.hash()).unwrap_err();
    assert!(e.to_string().contains("CRC") && e.to_string().contains(INDEX_DIR), "{e}");
    drop(s);
    // An entry rewritten with a valid CRC to claim a 4 GiB record: refused before any read.
    let chain1 = dir.path().join(INDEX_DIR).join("chain-1");
    let mut b = std::fs::read(&chain1).unwrap();
    b[5] ^= 0x40; // the flip above, undone
    b[40..44].copy_from_slice(&u32::MAX.to_le_bytes());
    let crc = crc32fast::hash(&b[..44]);
    b[44..48].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&chain1, b).unwrap();
    let (s, _) = DiskStore::open_with_options(dir.path(), fx.key(), tiny(OpenVerify::FromCheckpoint)).unwrap();
    let e = s.get(&victim.hash()).unwrap_err();
    assert!(e.to_string().contains(&u32::MAX.to_string()), "{e}");
    drop(s);
    // A full open rebuilds the index from the log.
    let (s, report) = DiskStore::open_with_options(dir.path(), fx.key(), tiny(OpenVerify::Full)).unwrap();
    assert!(report.is_clean(), "{report}");
    assert_eq!(s.get(&victim.hash()).unwrap().unwrap().hash(), victim.hash());
    drop(s);
    // A checkpoint that describes more log than there is: not used.
    let log = dir.path().join(LOG_FILE);
    let len = std::fs::metadata(&log).unwrap().len();
    let recs_left = {
        let (s, _) = DiskStore::open_readonly(dir.path(), fx.key()).unwrap();
        s.len()
    };
    std::fs::OpenOptions::new().write(true).open(&log).unwrap().set_len(len - 10).unwrap();
    let (s, report) = DiskStore::open_with_options(dir.path(), fx.key(), tiny(OpenVerify::FromCheckpoint)).unwrap();
    assert_eq!(report.from_checkpoint_bytes, 0, "{report}");
    assert!(report.torn_tail.is_some(), "{report}");
    assert_eq!(s.len(), recs_left - 1);
}

#[test]
fn a_revocation_cuts_a_spilled_chain_and_the_checkpoint_goes_with_it() {
    use psl_capsule::{new_capsule_with, Author, KeyStatement, Limits, Revocation, WriterKeys};
    let owner = psl_crypto::OwnerKey::from_seed(&[65; 32]).unwrap();
    let app = owner.app(3).unwrap();
    let meta = new_capsule_with(&owner, 3, "spill-revocation", 0, Limits::default(), WriterKeys::Certified).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut store = DiskStore::create_with(dir.path(), meta.clone(), None, tiny(OpenVerify::Full)).unwrap();
    let v = psl_capsule::Verifier::new(meta.clone(), None);
    let leaked = 0x10011;
    let mut thief = Author::new(&meta, &app, leaked).unwrap();
    let mut honest = Author::new(&meta, &app, 0x10012).unwrap();
    let mut recs = vec![v.verify(thief.write_own_cert().unwrap().unwrap()).unwrap()];
    for i in 0..40 {
        recs.push(v.verify(thief.write_ops([(format!("k{i}"), Some("v"))]).unwrap()).unwrap());
    }
    for chunk in recs.chunks(7) {
        store.append(chunk).unwrap();
    }
    let rev = Revocation::issue(&app, meta.name(), 0, leaked, u64::MAX, 30).unwrap();
    let honest_cert = v.verify(honest.write_own_cert().unwrap().unwrap()).unwrap();
    let carrier = v.verify(honest.write_certs(vec![KeyStatement::Revoke(rev)]).unwrap()).unwrap();
    store.append(&[honest_cert, carrier]).unwrap();
    drop(store);
    for round in 0..2 {
        // First from the checkpoint written at close (its certificate records bring the
        // revocation back), then from a full pass (the cut removed that checkpoint).
        let (store, report) = DiskStore::open_with_options(dir.path(), None, tiny(OpenVerify::FromCheckpoint)).unwrap();
        assert_eq!(report.from_checkpoint_bytes > 0, round == 0, "round {round}: {report}");
        assert_eq!(store.heads()[&leaked].seq, 29, "round {round}");
        assert_eq!(report.revoked.iter().filter(|o| o.writer == leaked).count(), 11, "round {round}: {report}");
        assert!(store.get(&recs[31].hash()).unwrap().is_none());
        assert!(store.get(&recs[2].hash()).unwrap().is_some(), "an entry from the chain file");
        assert_eq!(store.range(leaked, 0, u64::MAX).unwrap().len(), 30);
        assert!(store.check().unwrap().is_clean());
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 12, ..Default::default() })]
    /// Any bounds, any batch sizes: the spilled index answers as the log says, before and after
    /// a reopen from its checkpoint.
    #[test]
    fn any_bounds_answer_as_the_log_says(window in 1usize..6, recent in 1usize..20, every in 1u64..50, batch in 1usize..9) {
        let fx = Fixture::new(66);
        let recs = history(&fx, 30);
        let dir = tempfile::tempdir().unwrap();
        let opts = |verify| StoreOptions { index: IndexConfig { chain_window: window, recent_max: recent, checkpoint_records: every }, verify };
        let mut s = DiskStore::create_with(dir.path(), fx.meta.clone(), fx.key(), opts(OpenVerify::Full)).unwrap();
        for c in recs.chunks(batch) {
            s.append(c).unwrap();
        }
        let before = answers(&s, &recs);
        proptest::prop_assert!(before.2.iter().all(|f| *f));
        drop(s);
        let (s, report) = DiskStore::open_with_options(dir.path(), fx.key(), opts(OpenVerify::FromCheckpoint)).unwrap();
        proptest::prop_assert!(report.is_clean() && report.from_checkpoint_bytes == s.log_bytes(), "{}", report);
        proptest::prop_assert_eq!(answers(&s, &recs), before);
    }
}
