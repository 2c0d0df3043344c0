//! A job whose application key the leader rotates while its lambdas keep writing (embedded
//! deployment): every write before and after the rotation is read back, every worker installs
//! its new keys, and the job's capsule verifies with both key generations (the certificate and
//! the new data key, which the owner derives from the certificate's application index).

mod common;

use psl_capsule::{audit_file, audit_file_rotated, Kind};
use psl_crypto::OwnerKey;
use psl_faas::JobRequest;

/// Writes across the rotation, then lambda 0 reads every key back (shared with the multi-process test).
const PROGRAM: &str = include_str!("data/write_across_rotation.js");

#[test]
fn a_rotation_mid_job_keeps_every_write_and_the_capsule_verifies_with_both_generations() {
    let d = common::deployment(3, Vec::new());
    let owner = OwnerKey::from_seed(&[21; 32]).unwrap();
    let r = d
        .run_job(JobRequest {
            program: PROGRAM.into(),
            lambdas: 3,
            input: None,
            owner: Some(OwnerKey::from_seed(&[21; 32]).unwrap()),
            rotate_after_ms: Some(250),
        })
        .unwrap();
    assert!(r.ok, "{:?}", r.lambdas);
    let out: serde_json::Value = serde_json::from_str(r.lambdas[0].emitted.last().unwrap()).unwrap();
    assert_eq!(out["bad"], 0, "every write read back: {out}");
    assert!(out["total"].as_u64().unwrap() >= 600, "{out}");

    assert_eq!(r.key_rotations.len(), 1, "one rotation");
    let k = &r.key_rotations[0];
    assert_eq!(k.key_gen, 1);
    assert_eq!(k.workers.len(), 3);
    assert!(k.workers.iter().all(|(_, e)| e.is_none()), "{:?}", k.workers);
    let cert = k.certificate().unwrap();
    assert_eq!(cert.from_epoch, k.from_epoch);

    // The capsule: both generations' data records, all verified with the certificate.
    let bytes = r.capsule_file.as_ref().unwrap();
    let meta_app = audit_file(bytes, None).metadata.unwrap().meta.app_index;
    let dk0 = owner.app(meta_app).unwrap().data_key();
    let dk1 = owner.app(cert.app_index).unwrap().data_key();
    let audit = audit_file_rotated(bytes, Some(dk0.clone()), vec![(cert.clone(), Some(dk1))]);
    assert!(audit.ok(), "{:?}", audit.problems.iter().take(5).collect::<Vec<_>>());
    let replica = audit.replica.as_ref().unwrap();
    let mut data = [0usize; 2];
    for rec in replica.iter() {
        let h = rec.header();
        if h.kind == Kind::Data {
            data[h.key_gen as usize] += 1;
            assert_eq!(h.key_gen == 1, h.epoch >= cert.from_epoch, "generation by epoch");
        }
    }
    assert!(data[0] > 0 && data[1] > 0, "data records of each generation: {data:?}");
    assert_eq!(audit.records_verified, audit.records_total);
    // Without the certificate (and without the data key to find it in the log), the records of
    // the new generation do not verify: the rotation is real.
    let blind = audit_file(bytes, None);
    assert!(blind.problems.iter().any(|p| p.check == "key-generation"), "{:?}", blind.problems.first());
    // Every worker wiped at the end.
    assert_eq!(r.resets.len(), 3);
    assert!(r.resets.iter().all(|(_, d)| !d.holds_keys && d.memtable_entries == 0), "{:?}", r.resets);
}
