//! Tamper evidence: flipping any byte of any record of a stored replica is caught and the
//! audit names that record.

mod common;
use psl_capsule::{audit_file, file};

#[test]
fn every_flipped_byte_of_every_record_is_named() {
    let fx = common::Fixture::new(1);
    let recs = fx.small_history();
    let bytes = file::encode(&fx.meta, &recs);
    let clean = audit_file(&bytes, Some(fx.app.data_key()));
    assert!(clean.ok(), "{:?}", clean.problems);
    assert_eq!(clean.records_verified, recs.len());

    // Locate every record's frame: tag (1) + length (4) + record bytes.
    let frames = file::scan(&bytes).frames;
    assert_eq!(frames.len(), recs.len());
    let mut checked = 0;
    for (i, f) in frames.iter().enumerate() {
        let len = recs[i].bytes().len();
        for off in f.offset..f.offset + 5 + len {
            let mut b = bytes.clone();
            b[off] ^= 0x5a;
            let a = audit_file(&b, Some(fx.app.data_key()));
            assert!(!a.ok(), "flip at {off} (record #{i}) went unnoticed");
            assert!(
                a.problems.iter().any(|p| p.index == Some(i)),
                "flip at {off} in record #{i} not attributed to it: {:?}",
                a.problems
            );
            // Without the data key, everything but decryption is still checked.
            let p = audit_file(&b, None);
            assert!(!p.ok(), "flip at {off} (record #{i}) unnoticed without the data key");
            checked += 1;
        }
    }
    assert!(checked > 1000);
}

#[test]
fn every_flipped_byte_outside_records_is_caught() {
    let fx = common::Fixture::new(2);
    let recs = fx.small_history();
    let bytes = file::encode(&fx.meta, &recs);
    let frames = file::scan(&bytes).frames;
    let first = frames[0].offset;
    let trailer = frames.last().map(|f| f.offset + 5 + recs.last().unwrap().bytes().len()).unwrap();
    for off in (0..first).chain(trailer..bytes.len()) {
        let mut b = bytes.clone();
        b[off] ^= 0x01;
        assert!(!audit_file(&b, None).ok(), "flip at {off} outside records went unnoticed");
    }
}

#[test]
fn truncation_and_appended_garbage_are_caught() {
    let fx = common::Fixture::new(3);
    let bytes = file::encode(&fx.meta, &fx.small_history());
    for cut in [0, 5, 8, 100, bytes.len() / 2, bytes.len() - 33, bytes.len() - 1] {
        let a = audit_file(&bytes[..cut], None);
        assert!(!a.ok(), "cut at {cut}");
    }
    let mut longer = bytes.clone();
    longer.extend_from_slice(b"garbage");
    let a = audit_file(&longer, None);
    assert!(a.problems.iter().any(|p| p.check == "trailing-bytes"), "{:?}", a.problems);
}
